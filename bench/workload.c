#include "bench/workload.h"

#include "common/error.h"
#include "common/json_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* splitmix64: a small, well-mixed generator whose whole state is one integer, so a stream is
 * named by its seed alone. */
struct rng {
    uint64_t state;
};

static uint64_t rng_next(struct rng *r)
{
    uint64_t z = (r->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi]. The modulo's bias is below 2^-32 for spans under 2^32. */
static uint32_t rng_range(struct rng *r, uint32_t lo, uint32_t hi)
{
    return lo + (uint32_t)(rng_next(r) % ((uint64_t)hi - lo + 1));
}

/* Uniform in [0, 1). */
static double rng_unit(struct rng *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

/* Streams of one seed: prompts and arrivals are drawn from different ones, so that changing
 * the rate leaves the prompts as they were. */
#define STREAM_PROMPTS 0x70726f6d70747331ull
#define STREAM_ARRIVALS 0x6172726976616c73ull

static void fill_tokens(struct rng *r, int32_t *out, uint32_t n, int32_t vocab)
{
    for (uint32_t i = 0; i < n; i++)
        out[i] = (int32_t)rng_range(r, 0, (uint32_t)vocab - 1);
}

const char *workload_kind_name(enum workload_kind kind)
{
    switch (kind) {
    case WORKLOAD_RANDOM:
        return "random";
    case WORKLOAD_SHARED_PREFIX:
        return "shared-prefix";
    case WORKLOAD_MULTI_TENANT:
        return "multi-tenant";
    case WORKLOAD_REALISTIC:
        return "realistic";
    }
    return "unknown";
}

int workload_kind_parse(const char *name, enum workload_kind *out)
{
    for (int k = WORKLOAD_RANDOM; k <= WORKLOAD_REALISTIC; k++) {
        if (strcmp(name, workload_kind_name((enum workload_kind)k)) == 0) {
            *out = (enum workload_kind)k;
            return 0;
        }
    }
    return pagoda_error_set(
        PAGODA_EINVAL, "--workload: \"%s\" is not random, shared-prefix, multi-tenant or realistic",
        name);
}

void workload_tenants_fini(struct workload_tenants *t)
{
    if (t == NULL)
        return;
    for (uint32_t i = 0; i < t->num_tenants; i++)
        free(t->tenants[i].api_key);
    for (uint32_t i = 0; i < t->num_pins; i++)
        free(t->pins[i].token_ids);
    free(t->tenants);
    free(t->groups);
    free(t->pins);
    free(t->admin_key);
    memset(t, 0, sizeof(*t));
}

void workload_fini(struct workload *w)
{
    if (w == NULL)
        return;
    for (size_t i = 0; i < w->num_requests; i++)
        free(w->requests[i].prompt);
    free(w->requests);
    workload_tenants_fini(&w->tenants);
    memset(w, 0, sizeof(*w));
}

static int copy_key(const char *key, const char *what, char **out)
{
    if (strlen(key) > WORKLOAD_API_KEY_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "%s: an API key longer than %u bytes", what,
                                WORKLOAD_API_KEY_MAX);
    if ((*out = strdup(key)) == NULL)
        return PAGODA_ENOMEM;
    return 0;
}

int workload_tenants_single(const char *api_key, struct workload_tenants *out)
{
    memset(out, 0, sizeof(*out));
    out->tenants = calloc(1, sizeof(*out->tenants));
    if (out->tenants == NULL)
        return PAGODA_ENOMEM;
    out->num_tenants = 1;
    snprintf(out->tenants[0].name, sizeof(out->tenants[0].name), "default");
    out->tenants[0].group = -1;
    out->tenants[0].pin = -1;
    int rc = api_key ? copy_key(api_key, "--api-key", &out->tenants[0].api_key) : 0;
    if (rc != 0)
        workload_tenants_fini(out);
    return rc;
}

int workload_tenants_from_keys(const char *csv, struct workload_tenants *out)
{
    memset(out, 0, sizeof(*out));
    size_t n = 1;
    for (const char *p = csv; *p; p++)
        n += *p == ',';
    if (n > WORKLOAD_MAX_TENANTS)
        return pagoda_error_set(PAGODA_ERANGE, "--api-keys: %zu keys, more than %u", n,
                                WORKLOAD_MAX_TENANTS);
    out->tenants = calloc(n, sizeof(*out->tenants));
    if (out->tenants == NULL)
        return PAGODA_ENOMEM;
    int rc = 0;
    const char *p = csv;
    for (size_t i = 0; i < n; i++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        struct workload_tenant *t = &out->tenants[i];
        out->num_tenants = (uint32_t)i + 1;
        t->group = t->pin = -1;
        snprintf(t->name, sizeof(t->name), "tenant%zu", i);
        if (len == 0) {
            rc = pagoda_error_set(PAGODA_EINVAL, "--api-keys: key %zu is empty", i + 1);
            break;
        }
        if (len > WORKLOAD_API_KEY_MAX) {
            rc = pagoda_error_set(PAGODA_ERANGE, "--api-keys: key %zu is longer than %u bytes",
                                  i + 1, WORKLOAD_API_KEY_MAX);
            break;
        }
        if ((t->api_key = strndup(p, len)) == NULL) {
            rc = PAGODA_ENOMEM;
            break;
        }
        p = end ? end + 1 : p + len;
    }
    if (rc != 0)
        workload_tenants_fini(out);
    return rc;
}

/* A name of 1 to WORKLOAD_NAME_MAX bytes from obj[key], copied into out. */
static int read_name(const json_t *obj, const char *origin, const char *where, char *out)
{
    const char *s;
    int rc = json_util_get_string(obj, "name", &s);
    if (rc != 0 || s[0] == '\0' || strlen(s) > WORKLOAD_NAME_MAX)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: %s.name must be a string of 1 to %u bytes",
                                origin, where, WORKLOAD_NAME_MAX);
    snprintf(out, WORKLOAD_NAME_MAX + 1, "%s", s);
    return 0;
}

/* The array at root[key], which may be absent (then *n is 0). */
static int read_array(const json_t *root, const char *origin, const char *key, uint32_t max,
                      int required, const json_t **arr, uint32_t *n)
{
    *arr = json_object_get(root, key);
    *n = 0;
    if (*arr == NULL) {
        if (required)
            return pagoda_error_set(PAGODA_EFORMAT, "%s: \"%s\" is missing", origin, key);
        return 0;
    }
    if (!json_is_array(*arr))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: \"%s\" must be an array", origin, key);
    size_t len = json_array_size(*arr);
    if (len > max || (required && len == 0))
        return pagoda_error_set(PAGODA_ERANGE, "%s: \"%s\" has %zu entries, outside [%d, %u]",
                                origin, key, len, required ? 1 : 0, max);
    *n = (uint32_t)len;
    return 0;
}

static int find_tenant(const struct workload_tenants *t, const char *name)
{
    for (uint32_t i = 0; i < t->num_tenants; i++)
        if (strcmp(t->tenants[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int parse_groups(const json_t *root, const char *origin, struct workload_tenants *t)
{
    const json_t *arr;
    uint32_t n;
    int rc = read_array(root, origin, "groups", WORKLOAD_MAX_GROUPS, 0, &arr, &n);
    if (rc != 0 || n == 0)
        return rc;
    if ((t->groups = calloc(n, sizeof(*t->groups))) == NULL)
        return PAGODA_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        char where[32];
        snprintf(where, sizeof(where), "groups[%u]", i);
        const json_t *g = json_array_get(arr, i);
        if (!json_is_object(g))
            return pagoda_error_set(PAGODA_EFORMAT, "%s: %s must be an object", origin, where);
        if ((rc = read_name(g, origin, where, t->groups[i].name)) != 0)
            return rc;
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(t->groups[j].name, t->groups[i].name) == 0)
                return pagoda_error_set(PAGODA_EFORMAT, "%s: group \"%s\" is named twice", origin,
                                        t->groups[i].name);
        t->num_groups = i + 1;
    }
    return 0;
}

static int parse_tenant(const json_t *obj, const char *origin, uint32_t i,
                        struct workload_tenants *t)
{
    char where[32];
    snprintf(where, sizeof(where), "tenants[%u]", i);
    struct workload_tenant *tn = &t->tenants[i];
    tn->group = tn->pin = -1;
    if (!json_is_object(obj))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: %s must be an object", origin, where);
    int rc = read_name(obj, origin, where, tn->name);
    if (rc != 0)
        return rc;
    if (find_tenant(t, tn->name) >= 0)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: tenant \"%s\" is named twice", origin,
                                tn->name);
    const json_t *keys = json_object_get(obj, "api_keys");
    const json_t *k0 = json_is_array(keys) ? json_array_get(keys, 0) : NULL;
    if (!json_is_string(k0) || json_string_length(k0) == 0)
        return pagoda_error_set(
            PAGODA_EFORMAT, "%s: %s.api_keys must be an array of non-empty strings", origin, where);
    if ((rc = copy_key(json_string_value(k0), origin, &tn->api_key)) != 0)
        return rc;
    const char *group;
    rc = json_util_get_string(obj, "group", &group);
    if (rc == PAGODA_ENOENT)
        return 0;
    if (rc != 0)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: %s.group must be a string", origin, where);
    for (uint32_t g = 0; g < t->num_groups; g++)
        if (strcmp(t->groups[g].name, group) == 0)
            tn->group = (int)g;
    if (tn->group < 0)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: %s.group \"%.64s\" names no entry of "
                                "\"groups\"",
                                origin, where, group);
    return 0;
}

static int parse_pin(const json_t *obj, const char *origin, uint32_t i, int32_t vocab,
                     struct workload_tenants *t)
{
    char where[32];
    snprintf(where, sizeof(where), "pins[%u]", i);
    struct workload_pin *pin = &t->pins[i];
    if (!json_is_object(obj))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: %s must be an object", origin, where);
    int rc = read_name(obj, origin, where, pin->name);
    if (rc != 0)
        return rc;
    const json_t *ids = json_object_get(obj, "token_ids");
    size_t n = json_is_array(ids) ? json_array_size(ids) : 0;
    if (n == 0 || n > WORKLOAD_MAX_PROMPT_TOKENS)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: %s.token_ids must be an array of 1 to %u "
                                "token ids",
                                origin, where, WORKLOAD_MAX_PROMPT_TOKENS);
    if ((pin->token_ids = malloc(n * sizeof(*pin->token_ids))) == NULL)
        return PAGODA_ENOMEM;
    pin->len = (uint32_t)n;
    for (size_t k = 0; k < n; k++) {
        const json_t *v = json_array_get(ids, k);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= vocab)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "%s: %s.token_ids[%zu] must be an integer in "
                                    "[0, %d) (the model's vocabulary)",
                                    origin, where, k, vocab);
        pin->token_ids[k] = (int32_t)json_integer_value(v);
    }
    const json_t *readers = json_object_get(obj, "tenants");
    if (!json_is_array(readers))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: %s.tenants must be an array of tenant names",
                                origin, where);
    for (size_t k = 0; k < json_array_size(readers); k++) {
        const json_t *v = json_array_get(readers, k);
        int tn = json_is_string(v) ? find_tenant(t, json_string_value(v)) : -1;
        if (tn < 0)
            return pagoda_error_set(PAGODA_EFORMAT, "%s: %s.tenants[%zu] names no tenant", origin,
                                    where, k);
        if (t->tenants[tn].pin < 0) /* a tenant reads the first pin that names it */
            t->tenants[tn].pin = (int)i;
    }
    return 0;
}

int workload_tenants_parse(const json_t *root, const char *origin, int32_t vocab,
                           struct workload_tenants *out)
{
    memset(out, 0, sizeof(*out));
    if (!json_is_object(root))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: must be an object {\"tenants\": [...]}",
                                origin);
    const json_t *arr;
    uint32_t n;
    int rc = parse_groups(root, origin, out);
    if (rc == 0)
        rc = read_array(root, origin, "tenants", WORKLOAD_MAX_TENANTS, 1, &arr, &n);
    if (rc == 0 && (out->tenants = calloc(n, sizeof(*out->tenants))) == NULL)
        rc = PAGODA_ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        rc = parse_tenant(json_array_get(arr, i), origin, i, out);
        out->num_tenants = i + 1; /* so that fini frees this entry's key */
    }
    if (rc == 0)
        rc = read_array(root, origin, "pins", WORKLOAD_MAX_PINS, 0, &arr, &n);
    if (rc == 0 && n > 0 && (out->pins = calloc(n, sizeof(*out->pins))) == NULL)
        rc = PAGODA_ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        out->num_pins = i + 1;
        rc = parse_pin(json_array_get(arr, i), origin, i, vocab, out);
    }
    if (rc == 0) {
        const json_t *admins = json_object_get(root, "admin_keys");
        const json_t *a0 = json_is_array(admins) ? json_array_get(admins, 0) : NULL;
        if (json_is_string(a0) && json_string_length(a0) > 0)
            rc = copy_key(json_string_value(a0), origin, &out->admin_key);
    }
    if (rc != 0)
        workload_tenants_fini(out);
    return rc;
}

int workload_tenants_load(const char *path, int32_t vocab, struct workload_tenants *out)
{
    json_t *root = NULL;
    memset(out, 0, sizeof(*out));
    int rc = json_util_load_file(path, WORKLOAD_TENANTS_FILE_MAX_BYTES, &root);
    if (rc != 0)
        return rc;
    rc = workload_tenants_parse(root, path, vocab, out);
    json_decref(root);
    return rc;
}

/* Allocates n requests and takes the tenants over. */
static int workload_begin(struct workload *w, enum workload_kind kind, size_t n, int32_t vocab,
                          uint64_t seed, struct workload_tenants *tenants)
{
    memset(w, 0, sizeof(*w));
    w->tenants = *tenants;
    memset(tenants, 0, sizeof(*tenants));
    w->kind = kind;
    w->seed = seed;
    w->vocab = vocab;
    if (vocab < 1)
        return pagoda_error_set(PAGODA_ERANGE, "the vocabulary size must be at least 1");
    if (w->tenants.num_tenants < 1)
        return pagoda_error_set(PAGODA_EINVAL, "a workload needs at least one tenant");
    if (n < 1 || n > WORKLOAD_MAX_REQUESTS)
        return pagoda_error_set(PAGODA_ERANGE, "%s: %zu requests, outside [1, %u]",
                                workload_kind_name(kind), n, WORKLOAD_MAX_REQUESTS);
    if ((w->requests = calloc(n, sizeof(*w->requests))) == NULL)
        return PAGODA_ENOMEM;
    w->num_requests = n;
    return 0;
}

static int check_len(const char *flag, uint32_t v, uint32_t min, uint32_t max)
{
    if (v < min || v > max)
        return pagoda_error_set(PAGODA_ERANGE, "%s: %u is outside [%u, %u]", flag, v, min, max);
    return 0;
}

/* Sets request r's prompt to the concatenation of up to three parts. */
static int set_prompt(struct workload_request *r, const int32_t *a, uint32_t na, const int32_t *b,
                      uint32_t nb, const int32_t *c, uint32_t nc)
{
    uint64_t n = (uint64_t)na + nb + nc;
    if (n > WORKLOAD_MAX_PROMPT_TOKENS)
        return pagoda_error_set(PAGODA_ERANGE, "a prompt of %llu tokens, more than %u",
                                (unsigned long long)n, WORKLOAD_MAX_PROMPT_TOKENS);
    if ((r->prompt = malloc((size_t)n * sizeof(int32_t))) == NULL)
        return PAGODA_ENOMEM;
    if (na)
        memcpy(r->prompt, a, na * sizeof(int32_t));
    if (nb)
        memcpy(r->prompt + na, b, nb * sizeof(int32_t));
    if (nc)
        memcpy(r->prompt + na + nb, c, nc * sizeof(int32_t));
    r->prompt_len = (uint32_t)n;
    return 0;
}

int workload_random(const struct workload_random_params *p, int32_t vocab, uint64_t seed,
                    struct workload_tenants *tenants, struct workload *out)
{
    int rc = workload_begin(out, WORKLOAD_RANDOM, p->num_requests, vocab, seed, tenants);
    if (rc == 0)
        rc = check_len("--input-len", p->input_min, 1, WORKLOAD_MAX_PROMPT_TOKENS);
    if (rc == 0)
        rc = check_len("--input-len (its upper end)", p->input_max, p->input_min,
                       WORKLOAD_MAX_PROMPT_TOKENS);
    if (rc == 0)
        rc = check_len("--output-len", p->output_min, 1, WORKLOAD_MAX_OUTPUT_TOKENS);
    if (rc == 0)
        rc = check_len("--output-len (its upper end)", p->output_max, p->output_min,
                       WORKLOAD_MAX_OUTPUT_TOKENS);
    struct rng r = {seed ^ STREAM_PROMPTS};
    for (size_t i = 0; rc == 0 && i < out->num_requests; i++) {
        struct workload_request *q = &out->requests[i];
        q->prompt_len = rng_range(&r, p->input_min, p->input_max);
        q->max_tokens = rng_range(&r, p->output_min, p->output_max);
        q->tenant = (uint32_t)(i % out->tenants.num_tenants);
        if ((q->prompt = malloc(q->prompt_len * sizeof(int32_t))) == NULL)
            rc = PAGODA_ENOMEM;
        else
            fill_tokens(&r, q->prompt, q->prompt_len, vocab);
    }
    if (rc != 0)
        workload_fini(out);
    return rc;
}

/* A log-normal length truncated to [1, cap]: median exp(sigma z), z standard normal
 * (Box-Muller), rounded; a draw outside is drawn again, up to WORKLOAD_REDRAWS times, then
 * clamped (counted in *clamped). */
static uint32_t lognormal_len(struct rng *r, uint32_t median, double sigma, uint32_t cap,
                              size_t *clamped)
{
    double v = 0;
    for (int k = 0; k < WORKLOAD_REDRAWS; k++) {
        double u1 = rng_unit(r), u2 = rng_unit(r);
        double z = sqrt(-2.0 * log1p(-u1)) * cos(2.0 * M_PI * u2);
        v = round((double)median * exp(sigma * z));
        if (v >= 1.0 && v <= (double)cap)
            return (uint32_t)v;
    }
    (*clamped)++;
    return v >= 1.0 ? cap : 1;
}

int workload_realistic(const struct workload_realistic_params *p, int32_t vocab, uint64_t seed,
                       struct workload_tenants *tenants, struct workload *out)
{
    int rc = workload_begin(out, WORKLOAD_REALISTIC, p->num_requests, vocab, seed, tenants);
    if (rc == 0)
        rc = check_len("--input-len (the median)", p->input_median, 1, WORKLOAD_MAX_PROMPT_TOKENS);
    if (rc == 0)
        rc = check_len("--input-len (the cap)", p->input_cap, p->input_median,
                       WORKLOAD_MAX_PROMPT_TOKENS);
    if (rc == 0)
        rc =
            check_len("--output-len (the median)", p->output_median, 1, WORKLOAD_MAX_OUTPUT_TOKENS);
    if (rc == 0)
        rc = check_len("--output-len (the cap)", p->output_cap, p->output_median,
                       WORKLOAD_MAX_OUTPUT_TOKENS);
    if (rc == 0 && (!(p->input_sigma >= 0 && p->input_sigma <= 10) ||
                    !(p->output_sigma >= 0 && p->output_sigma <= 10)))
        rc = pagoda_error_set(PAGODA_ERANGE, "--length-sigma: each sigma must be in [0, 10]");
    if (rc == 0 && p->max_context < 2)
        rc = pagoda_error_set(PAGODA_ERANGE, "realistic: a context of %lld positions is too small",
                              (long long)p->max_context);
    struct rng r = {seed ^ STREAM_PROMPTS};
    for (size_t i = 0; rc == 0 && i < out->num_requests; i++) {
        struct workload_request *q = &out->requests[i];
        uint32_t in_cap = p->input_cap;
        if ((int64_t)in_cap > p->max_context - 1)
            in_cap = (uint32_t)(p->max_context - 1);
        q->prompt_len = lognormal_len(&r, p->input_median, p->input_sigma, in_cap, &out->clamped);
        uint32_t out_cap = p->output_cap;
        if ((int64_t)out_cap > p->max_context - q->prompt_len)
            out_cap = (uint32_t)(p->max_context - q->prompt_len);
        q->max_tokens =
            lognormal_len(&r, p->output_median, p->output_sigma, out_cap, &out->clamped);
        q->tenant = (uint32_t)(i % out->tenants.num_tenants);
        if ((q->prompt = malloc(q->prompt_len * sizeof(int32_t))) == NULL)
            rc = PAGODA_ENOMEM;
        else
            fill_tokens(&r, q->prompt, q->prompt_len, vocab);
    }
    if (rc != 0)
        workload_fini(out);
    return rc;
}

int workload_shared_prefix(const struct workload_shared_prefix_params *p, int32_t vocab,
                           uint64_t seed, struct workload_tenants *tenants, struct workload *out)
{
    uint64_t n = (uint64_t)p->groups * p->prompts_per_group;
    int32_t *system = NULL, *question = NULL;
    size_t count = n > WORKLOAD_MAX_REQUESTS ? WORKLOAD_MAX_REQUESTS + 1u : (size_t)n;
    int rc = workload_begin(out, WORKLOAD_SHARED_PREFIX, count, vocab, seed, tenants);
    if (rc == 0)
        rc = check_len("--system-prompt-len", p->system_len, 0, WORKLOAD_MAX_PROMPT_TOKENS);
    if (rc == 0)
        rc = check_len("--question-len", p->question_len, p->system_len ? 0 : 1,
                       WORKLOAD_MAX_PROMPT_TOKENS);
    if (rc == 0)
        rc = check_len("--output-len", p->output_len, 1, WORKLOAD_MAX_OUTPUT_TOKENS);
    if (rc == 0 && ((system = malloc((p->system_len + 1) * sizeof(int32_t))) == NULL ||
                    (question = malloc((p->question_len + 1) * sizeof(int32_t))) == NULL))
        rc = PAGODA_ENOMEM;
    struct rng r = {seed ^ STREAM_PROMPTS};
    size_t k = 0;
    for (uint32_t g = 0; rc == 0 && g < p->groups; g++) {
        fill_tokens(&r, system, p->system_len, vocab);
        for (uint32_t j = 0; rc == 0 && j < p->prompts_per_group; j++, k++) {
            struct workload_request *q = &out->requests[k];
            fill_tokens(&r, question, p->question_len, vocab);
            rc = set_prompt(q, system, p->system_len, question, p->question_len, NULL, 0);
            q->max_tokens = p->output_len;
            q->prefix_len = p->system_len;
            q->tenant = (uint32_t)(k % out->tenants.num_tenants);
        }
    }
    /* A seeded shuffle (Fisher-Yates), so that the groups interleave as they would when many
     * users share a few system prompts. */
    for (size_t i = out->num_requests; rc == 0 && i > 1; i--) {
        size_t j = (size_t)(rng_next(&r) % i);
        struct workload_request tmp = out->requests[i - 1];
        out->requests[i - 1] = out->requests[j];
        out->requests[j] = tmp;
    }
    free(system);
    free(question);
    if (rc != 0)
        workload_fini(out);
    return rc;
}

int workload_multi_tenant(const struct workload_multi_tenant_params *p, int32_t vocab,
                          uint64_t seed, struct workload_tenants *tenants, struct workload *out)
{
    int32_t *group_prompts = NULL, *own_prompts = NULL, *question = NULL;
    int rc = workload_begin(out, WORKLOAD_MULTI_TENANT, p->num_requests, vocab, seed, tenants);
    if (rc == 0)
        rc = check_len("--system-prompt-len", p->system_len, 0, WORKLOAD_MAX_PROMPT_TOKENS);
    if (rc == 0)
        rc = check_len("--question-len", p->question_len, 1, WORKLOAD_MAX_PROMPT_TOKENS);
    if (rc == 0)
        rc = check_len("--output-len", p->output_len, 1, WORKLOAD_MAX_OUTPUT_TOKENS);
    const struct workload_tenants *t = &out->tenants;
    size_t sys = p->system_len;
    if (rc == 0 && ((group_prompts = malloc((t->num_groups * sys + 1) * sizeof(int32_t))) == NULL ||
                    (own_prompts = malloc((t->num_tenants * sys + 1) * sizeof(int32_t))) == NULL ||
                    (question = malloc(p->question_len * sizeof(int32_t))) == NULL))
        rc = PAGODA_ENOMEM;
    struct rng r = {seed ^ STREAM_PROMPTS};
    if (rc == 0) {
        fill_tokens(&r, group_prompts, (uint32_t)(t->num_groups * sys), vocab);
        fill_tokens(&r, own_prompts, (uint32_t)(t->num_tenants * sys), vocab);
    }
    for (size_t i = 0; rc == 0 && i < out->num_requests; i++) {
        struct workload_request *q = &out->requests[i];
        q->tenant = (uint32_t)(i % t->num_tenants);
        const struct workload_tenant *tn = &t->tenants[q->tenant];
        const struct workload_pin *pin = tn->pin >= 0 ? &t->pins[tn->pin] : NULL;
        const int32_t *ns = tn->group >= 0 ? group_prompts + (size_t)tn->group * sys
                                           : own_prompts + (size_t)q->tenant * sys;
        fill_tokens(&r, question, p->question_len, vocab);
        rc = set_prompt(q, pin ? pin->token_ids : NULL, pin ? pin->len : 0, ns, p->system_len,
                        question, p->question_len);
        q->max_tokens = p->output_len;
        q->prefix_len = (pin ? pin->len : 0) + p->system_len;
    }
    free(group_prompts);
    free(own_prompts);
    free(question);
    if (rc != 0)
        workload_fini(out);
    return rc;
}

int workload_check_context(const struct workload *w, int64_t max_context)
{
    for (size_t i = 0; i < w->num_requests; i++) {
        const struct workload_request *q = &w->requests[i];
        int64_t need = (int64_t)q->prompt_len + q->max_tokens;
        if (need <= max_context)
            continue;
        const char *flags = w->kind == WORKLOAD_RANDOM ? "--input-len and --output-len"
                            : w->kind == WORKLOAD_SHARED_PREFIX
                                ? "--system-prompt-len, --question-len and --output-len"
                                : "the pinned prompt, --system-prompt-len, --question-len and "
                                  "--output-len";
        return pagoda_error_set(PAGODA_ERANGE,
                                "request %zu needs %u prompt + %u output = %lld positions, more "
                                "than the model's %lld (max_position_embeddings): lower %s",
                                i, q->prompt_len, q->max_tokens, (long long)need,
                                (long long)max_context, flags);
    }
    return 0;
}

void workload_poisson_arrivals(struct workload *w, double rate)
{
    struct rng r = {w->seed ^ STREAM_ARRIVALS};
    double t = 0;
    for (size_t i = 0; i < w->num_requests; i++) {
        if (rate > 0 && isfinite(rate))
            t += -log1p(-rng_unit(&r)) / rate; /* exponential gap of mean 1/rate */
        w->requests[i].arrival_s = t;
    }
}

/* jansson's *_new setters take the value over even when they fail, so each value is attached to
 * its parent as soon as it exists and only the root is released on failure. */
int workload_to_json(const struct workload *w, json_t **out)
{
    json_t *root = json_object(), *reqs = json_array(), *names = json_array();
    int ok = root != NULL;
    ok = ok && json_object_set_new(root, "workload", json_string(workload_kind_name(w->kind))) == 0;
    ok = ok && json_object_set_new(root, "seed", json_integer((json_int_t)w->seed)) == 0;
    ok = ok && json_object_set_new(root, "vocab", json_integer(w->vocab)) == 0;
    if (ok) { /* set_new takes names and reqs over, failing or not */
        ok = json_object_set_new(root, "tenants", names) == 0;
        ok = json_object_set_new(root, "requests", reqs) == 0 && ok;
        names = reqs = NULL;
    }
    json_t *tenant_names = ok ? json_object_get(root, "tenants") : NULL;
    json_t *requests = ok ? json_object_get(root, "requests") : NULL;
    for (uint32_t i = 0; ok && i < w->tenants.num_tenants; i++)
        ok = json_array_append_new(tenant_names, json_string(w->tenants.tenants[i].name)) == 0;
    for (size_t i = 0; ok && i < w->num_requests; i++) {
        const struct workload_request *q = &w->requests[i];
        json_t *r = json_object();
        ok = json_array_append_new(requests, r) == 0;
        json_t *prompt = json_array();
        ok = ok && json_object_set_new(r, "prompt", prompt) == 0;
        for (uint32_t k = 0; ok && k < q->prompt_len; k++)
            ok = json_array_append_new(prompt, json_integer(q->prompt[k])) == 0;
        ok = ok && json_object_set_new(r, "max_tokens", json_integer(q->max_tokens)) == 0;
        ok = ok && json_object_set_new(r, "tenant", json_integer(q->tenant)) == 0;
        ok = ok && json_object_set_new(r, "prefix_len", json_integer(q->prefix_len)) == 0;
        ok = ok && json_object_set_new(r, "arrival_s", json_real(q->arrival_s)) == 0;
    }
    json_decref(names); /* NULL unless root could not be made */
    json_decref(reqs);
    if (!ok) {
        json_decref(root);
        return PAGODA_ENOMEM;
    }
    *out = root;
    return 0;
}
