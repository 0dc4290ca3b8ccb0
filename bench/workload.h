/* The requests pagoda-bench sends: prompts, output lengths, tenants and arrival times, all drawn
 * from one seed, so that the same flags give the same workload on any machine (and the Hugging
 * Face baseline can run the very same prompts from --dump-workload).
 *
 * Four workloads:
 * - random: prompt and output lengths drawn uniformly from ranges, token ids uniform in
 *   [0, vocab).
 * - realistic: long-tailed lengths, as chat traffic has them: prompt and output lengths each
 *   log-normal (a median and a sigma of the log), rounded, truncated to [1, a cap] and to the
 *   model's context (the output to what the prompt leaves) by drawing again (a length still
 *   outside after WORKLOAD_REDRAWS draws is clamped, and counted in workload.clamped); token ids
 *   as random.
 * - shared-prefix: groups x prompts per group; each group has its own system prompt, each
 *   prompt is the group's system prompt followed by its own question (as the common
 *   generated-shared-prefix benchmark), sent in a seeded random order.
 * - multi-tenant: requests spread round-robin over tenants; a prompt is the pinned prompt of
 *   the tenant's pin (when it reads one), then the system prompt of its namespace (its sharing
 *   group's when it is in one, else its own), then a question of its own.
 *
 * Arrival times are set separately (workload_poisson_arrivals) and drawn from their own stream
 * of the seed, so that the prompts do not depend on the rate. */
#ifndef PAGODA_BENCH_WORKLOAD_H
#define PAGODA_BENCH_WORKLOAD_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/* Bounds on what a workload may ask for (flags and tenants files are checked against them). */
#define WORKLOAD_MAX_REQUESTS (1u << 20)
#define WORKLOAD_MAX_PROMPT_TOKENS (1u << 20)
#define WORKLOAD_MAX_OUTPUT_TOKENS (1u << 20)
#define WORKLOAD_MAX_TENANTS 256u
#define WORKLOAD_MAX_GROUPS 64u
#define WORKLOAD_MAX_PINS 64u
#define WORKLOAD_NAME_MAX 64u
#define WORKLOAD_API_KEY_MAX 256u
/* A tenants file larger than this is refused. */
#define WORKLOAD_TENANTS_FILE_MAX_BYTES (4u << 20)
/* realistic: draws of a length outside its bounds before it is clamped to them. */
#define WORKLOAD_REDRAWS 16

enum workload_kind {
    WORKLOAD_RANDOM = 0,
    WORKLOAD_SHARED_PREFIX = 1,
    WORKLOAD_MULTI_TENANT = 2,
    WORKLOAD_REALISTIC = 3,
};

struct workload_request {
    int32_t *prompt; /* owned by the workload */
    uint32_t prompt_len;
    uint32_t max_tokens;
    uint32_t tenant;     /* index into the workload's tenants */
    uint32_t prefix_len; /* leading tokens this request shares with others by design */
    double arrival_s;    /* when to submit, seconds after the run starts */
};

struct workload_tenant {
    char name[WORKLOAD_NAME_MAX + 1];
    char *api_key; /* NULL: the client sends none */
    int group;     /* index into groups, or -1 */
    int pin;       /* index into pins (the first pin naming this tenant), or -1 */
};

struct workload_group {
    char name[WORKLOAD_NAME_MAX + 1];
};

struct workload_pin {
    char name[WORKLOAD_NAME_MAX + 1];
    int32_t *token_ids;
    uint32_t len;
};

/* Who sends: at least one tenant. */
struct workload_tenants {
    struct workload_tenant *tenants;
    uint32_t num_tenants;
    struct workload_group *groups;
    uint32_t num_groups;
    struct workload_pin *pins;
    uint32_t num_pins;
    char *admin_key; /* the first of the file's "admin_keys", or NULL */
};

struct workload {
    enum workload_kind kind;
    uint64_t seed;
    int32_t vocab;
    struct workload_request *requests;
    size_t num_requests;
    struct workload_tenants tenants;
    size_t clamped; /* realistic: lengths clamped after WORKLOAD_REDRAWS draws */
};

struct workload_random_params {
    size_t num_requests;
    uint32_t input_min, input_max;   /* prompt lengths, inclusive */
    uint32_t output_min, output_max; /* max_tokens, inclusive */
};

struct workload_realistic_params {
    size_t num_requests;
    uint32_t input_median, input_cap;   /* prompt lengths: median, largest */
    uint32_t output_median, output_cap; /* max_tokens: median, largest */
    double input_sigma, output_sigma;   /* of the natural log of the length, >= 0 */
    int64_t max_context;                /* prompt + output never exceed it (>= 2) */
};

struct workload_shared_prefix_params {
    uint32_t groups, prompts_per_group;
    uint32_t system_len, question_len, output_len;
};

struct workload_multi_tenant_params {
    size_t num_requests;
    uint32_t system_len, question_len, output_len;
};

/* "random", "shared-prefix", "multi-tenant", "realistic". */
const char *workload_kind_name(enum workload_kind kind);

/* Parses a workload name. Errors: PAGODA_EINVAL (with a detail listing the names). */
int workload_kind_parse(const char *name, enum workload_kind *out);

/* Builds a workload into *out (which the caller releases with workload_fini). tenants is taken
 * over in every case (moved into out->tenants, or released on failure); pass a set of one
 * tenant for the single-tenant workloads. Errors: PAGODA_EINVAL or PAGODA_ERANGE (a count or
 * length out of bounds, an empty range, vocab < 1), PAGODA_ENOMEM; each with a detail. */
int workload_random(const struct workload_random_params *p, int32_t vocab, uint64_t seed,
                    struct workload_tenants *tenants, struct workload *out);
int workload_realistic(const struct workload_realistic_params *p, int32_t vocab, uint64_t seed,
                       struct workload_tenants *tenants, struct workload *out);
int workload_shared_prefix(const struct workload_shared_prefix_params *p, int32_t vocab,
                           uint64_t seed, struct workload_tenants *tenants, struct workload *out);
int workload_multi_tenant(const struct workload_multi_tenant_params *p, int32_t vocab,
                          uint64_t seed, struct workload_tenants *tenants, struct workload *out);

/* Refuses a workload whose prompt plus output does not fit max_context positions (the model's
 * max_position_embeddings): PAGODA_ERANGE with a detail naming the first such request, its
 * lengths and the flags that set them. */
int workload_check_context(const struct workload *w, int64_t max_context);

/* Sets arrival times: a Poisson process of rate requests per second (exponential gaps drawn
 * from the workload's seed), the first arrival one gap after the start; rate = INFINITY (or
 * 0) puts every arrival at 0. */
void workload_poisson_arrivals(struct workload *w, double rate);

/* The workload as JSON: {"workload", "seed", "vocab", "tenants": [names], "requests":
 * [{"prompt": [...], "max_tokens", "tenant", "prefix_len", "arrival_s"}]}. On success *out is
 * a new reference. Errors: PAGODA_ENOMEM. */
int workload_to_json(const struct workload *w, json_t **out);

/* Releases what the workload holds and zeroes it. Accepts NULL and a zeroed workload. */
void workload_fini(struct workload *w);

/* One tenant named "default" sending api_key (NULL: none). Errors: PAGODA_ERANGE (a key
 * longer than WORKLOAD_API_KEY_MAX), PAGODA_ENOMEM. */
int workload_tenants_single(const char *api_key, struct workload_tenants *out);

/* Tenants from a comma-separated list of API keys ("k1,k2"), named by their position
 * ("tenant0", ...), none in a group, none reading a pin. Errors: PAGODA_EINVAL (an empty key),
 * PAGODA_ERANGE (too many or too long), PAGODA_ENOMEM. */
int workload_tenants_from_keys(const char *csv, struct workload_tenants *out);

/* Reads a tenants file in the router's format {"admin_keys": [...], "groups": [{"name"}],
 * "tenants": [{"name", "api_keys": [...], "group"}], "pins": [{"name", "token_ids": [...],
 * "tenants": [names]}]}; each tenant sends its first key. Keys pagoda-bench does not use
 * (quotas, limits) are ignored; "groups", "pins" and "admin_keys" may be absent. Pin token ids
 * must be below vocab. Errors: PAGODA_ENOENT or PAGODA_EIO (the file), PAGODA_EFORMAT (not
 * this format: the detail names the entry), PAGODA_ERANGE, PAGODA_ENOMEM. */
int workload_tenants_load(const char *path, int32_t vocab, struct workload_tenants *out);

/* Parses the same format from a JSON document (origin names it in messages). */
int workload_tenants_parse(const json_t *root, const char *origin, int32_t vocab,
                           struct workload_tenants *out);

/* Releases a tenant set and zeroes it. Accepts NULL. */
void workload_tenants_fini(struct workload_tenants *t);

#endif
