/* The request registry (router_internal.h): every request the router holds, live or finished, by
 * the id the scheduler knows it by (and by the client's, per tenant); what each holds, in
 * router.registry_bytes; its life from the Submit (validated, deduplicated against a resent one,
 * bounded per tenant and in all) or the scheduler's announcement, to its end and, once its
 * client has had time to fetch it, its drop (per tenant first, so that no tenant's traffic
 * expires another's results); and the client calls on requests: Submit, Poll, Cancel. */
#include "router/router_internal.h"

#include "common/error.h"
#include "common/list.h"
#include "common/log.h"
#include "wire/sampling_wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* A call for an unknown id before the schedulers' announcement has arrived (a restarted router
 * does not know its requests yet) waits for it, at most this long at a time (park_unknown) ... */
#define ANNOUNCE_GRACE_MS 2000
/* ... and within this long of the router's start, a call whose wait runs out before the
 * announcement is answered PAGODA_EBUSY (retry); after it, an id still unknown is unknown
 * (PAGODA_ENOENT). Longer than the supervisor's liveness limit (15 s): a scheduler hung across
 * the restart is replaced, and its successor announces what it holds. */
#define ANNOUNCE_WAIT_MS 20000

/* The most polls parked that way at once; more are answered at once. */
#define MAX_UNKNOWN_PARKED 1024
/* ... and of one tenant (with a tenants file): one tenant's calls for made-up ids cannot take the
 * places of another's for its own requests. */
#define MAX_TENANT_UNKNOWN_PARKED 128

PAGODA_LIST_DEFINE(list, struct req_list, struct request)

/* ---- the registry ---------------------------------------------------------------------------- */

/* Ids come from clients, so the bucket index is a keyed hash (the key drawn at start): a client
 * cannot choose ids that pile into one bucket on purpose. */
static size_t bucket_of(const struct router *r, const uint8_t *id)
{
    return (size_t)XXH3_64bits_withSeed(id, ID_BYTES, r->hash_seed) & (r->num_buckets - 1);
}

/* The request the scheduler knows by sched_id. */
struct request *registry_find(const struct router *r, const uint8_t *sched_id)
{
    for (struct request *q = r->buckets[bucket_of(r, sched_id)]; q != NULL; q = q->hash_next)
        if (memcmp(q->sched_id, sched_id, ID_BYTES) == 0)
            return q;
    return NULL;
}

/* The id the scheduler knows a tenant's request by. Two tenants may use the same client id, so
 * with a tenants file it is a keyed 128-bit hash of (tenant, id) (the key drawn at start);
 * with the one default tenant it is the client's id itself. */
static void sched_id_of(const struct router *r, uint32_t tenant, const uint8_t *id,
                        uint8_t out[ID_BYTES])
{
    if (r->tenants_file == NULL) {
        memcpy(out, id, ID_BYTES);
        return;
    }
    uint8_t buf[ROUTER_TENANT_NAME_MAX + 1 + ID_BYTES];
    size_t n = strlen(r->slots[tenant].name);
    memcpy(buf, r->slots[tenant].name, n);
    buf[n] = 0;
    memcpy(buf + n + 1, id, ID_BYTES);
    XXH128_hash_t h = XXH3_128bits_withSeed(buf, n + 1 + ID_BYTES, r->id_seed);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out, c.digest, ID_BYTES);
}

/* The caller's request with this id: another tenant's is not found, exactly like an id never
 * submitted, so that ids do not leak between tenants. */
static struct request *registry_find_client(const struct router *r, uint32_t tenant,
                                            const uint8_t *id)
{
    uint8_t sched_id[ID_BYTES];
    sched_id_of(r, tenant, id, sched_id);
    struct request *q = registry_find(r, sched_id);
    if (q != NULL && (q->tenant != tenant || memcmp(q->id, id, ID_BYTES) != 0))
        q = NULL;
    if (q == NULL) {
        for (q = r->alias_buckets[bucket_of(r, sched_id)]; q != NULL; q = q->alias_next)
            if (q->tenant == tenant && memcmp(q->id, id, ID_BYTES) == 0)
                break;
    }
    return q;
}

void registry_request_free(struct router *r, struct request *q)
{
    if (q == NULL)
        return;
    router_text_request_free(r, q);
    free(q->prompt);
    free(q->stop_ids);
    free(q->bias_ids);
    free(q->bias_values);
    free(q->tokens);
    free(q->logprobs);
    free(q->error_message);
    free(q);
}

/* A tenant's finished results, oldest first (a second list through tprev/tnext: the router's
 * finished list stays in finishing order for the TTL and the drain). */
static void slot_finished_push(struct tenant_slot *s, struct request *q)
{
    q->tnext = NULL;
    q->tprev = s->fin_tail;
    if (s->fin_tail)
        s->fin_tail->tnext = q;
    else
        s->fin_head = q;
    s->fin_tail = q;
    s->num_finished++;
}

static void slot_finished_remove(struct tenant_slot *s, struct request *q)
{
    if (q->tprev)
        q->tprev->tnext = q->tnext;
    else
        s->fin_head = q->tnext;
    if (q->tnext)
        q->tnext->tprev = q->tprev;
    else
        s->fin_tail = q->tprev;
    q->tprev = q->tnext = NULL;
    s->num_finished--;
}

/* Counts what q holds now in router.registry_bytes (Stats.registry_bytes). */
void registry_account(struct router *r, struct request *q)
{
    size_t bytes = sizeof(*q) + (size_t)q->cap_tokens * (sizeof(int32_t) + sizeof(float));
    if (q->prompt != NULL)
        bytes += (size_t)q->p.num_prompt * sizeof(int32_t);
    if (q->stop_ids != NULL)
        bytes += (size_t)(q->p.num_stop ? q->p.num_stop : 1) * sizeof(int32_t);
    if (q->bias_ids != NULL)
        bytes += (size_t)q->p.num_bias * (sizeof(int32_t) + sizeof(float));
    if (q->error_message != NULL)
        bytes += strlen(q->error_message) + 1;
    bytes += router_text_bytes(q);
    r->registry_bytes = r->registry_bytes - q->bytes + bytes;
    q->bytes = bytes;
}

/* A keyed hash of a Submit's prompt, stop ids and logit bias: a finished request keeps it instead
 * of them, so that a resent Submit is still recognised. */
static void prompt_hash(const struct router *r, const struct submit_params *p, uint64_t out[2])
{
    XXH3_state_t st;
    memset(&st, 0, sizeof(st));
    XXH3_128bits_reset_withSeed(&st, r->hash_seed);
    uint32_t lens[2] = {p->num_prompt, p->num_stop};
    XXH3_128bits_update(&st, lens, sizeof(lens));
    XXH3_128bits_update(&st, p->prompt, (size_t)p->num_prompt * sizeof(int32_t));
    if (p->num_stop)
        XXH3_128bits_update(&st, p->stop_ids, (size_t)p->num_stop * sizeof(int32_t));
    XXH3_128bits_update(&st, p->text_hash, sizeof(p->text_hash));
    XXH3_128bits_update(&st, &p->num_bias, sizeof(p->num_bias));
    if (p->num_bias) {
        XXH3_128bits_update(&st, p->bias_ids, (size_t)p->num_bias * sizeof(int32_t));
        XXH3_128bits_update(&st, p->bias_values, (size_t)p->num_bias * sizeof(float));
    }
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    out[0] = h.low64;
    out[1] = h.high64;
}

/* A finished request keeps only what its client can still fetch: the prompt and stop ids go
 * (a scheduler restart never resubmits a finished request). */
static void request_forget_prompt(struct router *r, struct request *q)
{
    free(q->prompt);
    free(q->stop_ids);
    free(q->bias_ids);
    free(q->bias_values);
    q->prompt = q->stop_ids = q->bias_ids = NULL;
    q->bias_values = NULL;
    q->p.prompt = q->p.stop_ids = q->p.bias_ids = NULL;
    q->p.bias_values = NULL;
    registry_account(r, q);
}

/* Forgets a finished request: its id becomes unknown (PAGODA_ENOENT). */
void registry_drop(struct router *r, struct request *q)
{
    r->registry_bytes -= q->bytes;
    struct request **pp = &r->buckets[bucket_of(r, q->sched_id)];
    while (*pp != q)
        pp = &(*pp)->hash_next;
    *pp = q->hash_next;
    if (q->aliased) {
        uint8_t key[ID_BYTES];
        sched_id_of(r, q->tenant, q->id, key);
        pp = &r->alias_buckets[bucket_of(r, key)];
        while (*pp != q)
            pp = &(*pp)->alias_next;
        *pp = q->alias_next;
    }
    if (q->finish == PAGODA__FINISH_REASON__FINISH_NONE) {
        r->slots[q->tenant].live--;
        link_request_done(r, q);
    } else
        slot_finished_remove(&r->slots[q->tenant], q);
    list_remove(q->finish == PAGODA__FINISH_REASON__FINISH_NONE ? &r->live : &r->finished, q);
    if (q->need_submit || q->need_cancel)
        r->num_pending--;
    tenancy_unref(r, q->tenant);
    registry_request_free(r, q);
}

/* The tenant that holds the most finished results (the one whose oldest is older on a tie). */
static struct tenant_slot *largest_holder(struct router *r)
{
    struct tenant_slot *best = NULL;
    for (uint32_t i = 0; i < r->num_slots; i++) {
        struct tenant_slot *s = &r->slots[i];
        if (s->num_finished == 0)
            continue;
        if (best == NULL || s->num_finished > best->num_finished ||
            (s->num_finished == best->num_finished &&
             s->fin_head->finished_at_ms < best->fin_head->finished_at_ms))
            best = s;
    }
    return best;
}

/* A result of tenant slot finished: drops the tenant's oldest results while it holds more than
 * its max_finished, so that no tenant's traffic expires another's results; then, while the
 * router holds more than max_finished_requests in all, the oldest of the tenant holding the most
 * (a tenant holding no more than its share never loses one to another's flood). A finished
 * request has no parked polls. */
void registry_trim(struct router *r, uint32_t slot)
{
    struct tenant_slot *s = &r->slots[slot];
    while (s->num_finished > s->max_finished)
        registry_drop(r, s->fin_head);
    while (r->finished.count > r->cfg.max_finished_requests)
        registry_drop(r, largest_holder(r)->fin_head);
}

/* ---- a request's life ------------------------------------------------------------------------ */

void registry_set_pending(struct router *r, struct request *q, int *flag, int value)
{
    int before = q->need_submit || q->need_cancel;
    *flag = value;
    int after = q->need_submit || q->need_cancel;
    if (!before && after)
        r->num_pending++;
    else if (before && !after)
        r->num_pending--;
}

void registry_finish(struct router *r, struct request *q, Pagoda__FinishReason reason,
                     int32_t error_code, const char *error_message)
{
    if (q->finish != PAGODA__FINISH_REASON__FINISH_NONE)
        return;
    list_remove(&r->live, q);
    r->slots[q->tenant].live--;
    link_request_done(r, q);
    q->finish = reason;
    q->finished_at_ms = uv_now(r->loop);
    q->error_code = error_code;
    if (error_message != NULL)
        q->error_message = strdup(error_message);
    /* The text held back is released; should it complete a stop string, that is the end. */
    if (router_text_on_finish(r, q) && (reason == PAGODA__FINISH_REASON__FINISH_LENGTH ||
                                        reason == PAGODA__FINISH_REASON__FINISH_STOP))
        q->finish = PAGODA__FINISH_REASON__FINISH_STOP;
    request_forget_prompt(r, q);
    registry_set_pending(r, q, &q->need_submit, 0);
    list_push_back(&r->finished, q);
    slot_finished_push(&r->slots[q->tenant], q);
    router_wake_waiters(q);
}

/* q's own copies of its prompt (n ids; none yet for a text or chat prompt) and stop ids (m),
 * which q->p then points at. Returns 0 or PAGODA_ENOMEM (the caller frees q). */
static int request_own_ids(struct request *q, const int32_t *prompt, uint32_t n,
                           const int32_t *stop_ids, uint32_t m, const int32_t *bias_ids,
                           const float *bias_values, uint32_t nb)
{
    q->prompt = malloc((n ? n : 1) * sizeof(int32_t));
    q->stop_ids = malloc((m ? m : 1) * sizeof(int32_t));
    if (q->prompt == NULL || q->stop_ids == NULL)
        return PAGODA_ENOMEM;
    if (nb > 0) {
        q->bias_ids = malloc(nb * sizeof(int32_t));
        q->bias_values = malloc(nb * sizeof(float));
        if (q->bias_ids == NULL || q->bias_values == NULL)
            return PAGODA_ENOMEM;
        memcpy(q->bias_ids, bias_ids, nb * sizeof(int32_t));
        memcpy(q->bias_values, bias_values, nb * sizeof(float));
    }
    if (n)
        memcpy(q->prompt, prompt, n * sizeof(int32_t));
    if (m)
        memcpy(q->stop_ids, stop_ids, m * sizeof(int32_t));
    q->p.prompt = q->prompt;
    q->p.num_prompt = n;
    q->p.stop_ids = q->stop_ids;
    q->p.num_stop = m;
    q->p.bias_ids = q->bias_ids;
    q->p.bias_values = q->bias_values;
    q->p.num_bias = nb;
    return 0;
}

/* An adopted request's SubmitSeq, from its announcement (a request not ended carries its prompt,
 * sampling parameters and stop ids): what submitting it again takes, should the scheduler
 * restart too, or its engine go down. Without them (an older scheduler's announcement, or one
 * that does not read) q->no_prompt: its resubmission would be refused, and it stays where it is.
 * Returns 0, or PAGODA_ENOMEM. */
static int adopt_submit_params(struct request *q, const Pagoda__Internal__TokenEvent *ev)
{
    q->no_prompt = 1;
    if (ev->n_prompt_token_ids == 0 || ev->n_prompt_token_ids > UINT32_MAX ||
        ev->n_stop_token_ids > UINT32_MAX)
        return 0;
    struct sampling_params sp;
    struct logit_bias bias = {0};
    if (sampling_from_internal(ev->sampling, &sp) != 0 ||
        logit_bias_from_internal(ev->sampling, 0, &bias) != 0) {
        char hex[2 * ID_BYTES + 1];
        router_id_hex(ev->request_id.data, hex);
        log_warn("announced request %s: its sampling parameters: %s: it cannot be submitted "
                 "again",
                 hex, pagoda_error_detail());
        return 0;
    }
    int rc = request_own_ids(q, ev->prompt_token_ids, (uint32_t)ev->n_prompt_token_ids,
                             ev->stop_token_ids, (uint32_t)ev->n_stop_token_ids, bias.ids,
                             bias.values, (uint32_t)bias.n);
    logit_bias_fini(&bias);
    if (rc != 0)
        return PAGODA_ENOMEM;
    q->p.sampling = sp;
    q->p.has_seed = 1; /* the seed its first router drew, or its client's */
    q->p.strict_max_tokens = ev->has_strict_max_tokens && ev->strict_max_tokens;
    q->no_prompt = 0;
    return 0;
}

/* Registers a request the scheduler announced and this router does not hold (it restarted):
 * under the tenant and client id the event echoes (without a tenants file the scheduler's id is
 * the client's), with what Poll and Cancel need, and what submitting it again needs
 * (adopt_submit_params). The caller appends the event's tokens. Returns NULL when it cannot be
 * registered. */
struct request *registry_adopt(struct router *r, const Pagoda__Internal__TokenEvent *ev,
                               uint32_t engine)
{
    char hex[2 * ID_BYTES + 1];
    router_id_hex(ev->request_id.data, hex);
    uint32_t tenant = 0;
    if (r->tenants_file != NULL) {
        tenant = tenancy_find_slot(r, ev->tenant);
        if (tenant == UINT32_MAX) {
            log_warn("announced request %s of unknown tenant '%s': ignored", hex,
                     ev->tenant ? ev->tenant : "");
            return NULL;
        }
    }
    const uint8_t *id = ev->request_id.data;
    if (ev->has_client_request_id && ev->client_request_id.len == ID_BYTES)
        id = ev->client_request_id.data;
    else if (r->tenants_file != NULL) {
        log_warn("announced request %s without the client's id: ignored", hex);
        return NULL;
    }
    if (registry_find_client(r, tenant, id) != NULL) {
        log_warn("announced request %s collides with a request held: ignored", hex);
        return NULL;
    }
    struct request *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    memcpy(q->id, id, ID_BYTES);
    memcpy(q->sched_id, ev->request_id.data, ID_BYTES);
    q->tenant = tenant;
    q->seen_ms = uv_now(r->loop); /* its client's polls come back to a restarted router */
    q->adopted = 1;
    q->engine = engine;
    q->p.max_tokens =
        ev->has_max_tokens && ev->max_tokens > 0 ? ev->max_tokens : (int32_t)r->cfg.max_new_tokens;
    q->p.ignore_eos = ev->has_ignore_eos && ev->ignore_eos;
    /* its client's polls answer the log-probabilities (and each token's text end) it asked for;
     * without this they came back 0.0, or none, and a whole answer's names as token ids */
    q->p.logprobs = ev->has_logprobs_asked && ev->logprobs_asked;
    q->prompt_tokens = ev->has_prompt_tokens ? ev->prompt_tokens : 0;
    if (!ev->has_finish_reason && adopt_submit_params(q, ev) != 0) {
        registry_request_free(r, q);
        return NULL;
    }
    size_t b = bucket_of(r, q->sched_id);
    q->hash_next = r->buckets[b];
    r->buckets[b] = q;
    uint8_t key[ID_BYTES];
    sched_id_of(r, tenant, id, key);
    if (memcmp(key, q->sched_id, ID_BYTES) != 0) {
        /* With a tenants file the hash key of this router differs from its predecessor's. */
        b = bucket_of(r, key);
        q->alias_next = r->alias_buckets[b];
        r->alias_buckets[b] = q;
        q->aliased = 1;
    }
    if (router_text_attach_announced(r, q, ev) != 0)
        log_warn("request %s: %s: it gets token ids only", hex, pagoda_error_detail());
    list_push_back(&r->live, q);
    r->slots[tenant].live++;
    tenancy_ref(r, tenant);
    registry_account(r, q);
    log_debug("request %s registered from the scheduler's announcement", hex);
    return q;
}

/* ---- client calls ---------------------------------------------------------------------------- */

/* With strict_max_tokens, a prompt of n tokens and max_tokens must fit the model's context (once
 * known), as OpenAI's API and vLLM's refuse an explicit max_tokens; otherwise the request ends by
 * length when the context is full. The scheduler checks again against the context it serves,
 * which its KV pool may make smaller (SubmitSeq.strict_max_tokens). Returns 0, or PAGODA_ERANGE
 * with its reason in why. */
static int fits_context(const struct router *r, const struct submit_params *p, uint32_t n,
                        char *why, size_t why_len)
{
    uint64_t want = (uint64_t)n + (uint64_t)p->max_tokens;
    if (!p->strict_max_tokens || r->model_positions == 0 || want <= r->model_positions)
        return 0;
    snprintf(why, why_len,
             "the model's context is %u tokens, and this request asks for %llu (%u of prompt, "
             "%d of max_tokens): shorten the prompt or lower max_tokens",
             r->model_positions, (unsigned long long)want, n, (int)p->max_tokens);
    return PAGODA_ERANGE;
}

/* Applies defaults to a Submit and checks every value; on success *p points into s. */
static int submit_params_read(const struct router *r, const Pagoda__SubmitRequest *s,
                              struct submit_params *p)
{
    const struct router_config *cfg = &r->cfg;
    memset(p, 0, sizeof(*p));
    int rc = router_text_read(r, s, &p->has_text, p->text_hash);
    if (rc != 0)
        return rc;
    if (s->n_prompt_token_ids == 0 && !p->has_text)
        return pagoda_error_set(PAGODA_EINVAL, "the prompt is empty");
    if (s->n_prompt_token_ids > cfg->max_prompt_tokens)
        return pagoda_error_set(PAGODA_ERANGE,
                                "the prompt has %zu tokens, more than the limit of %u",
                                s->n_prompt_token_ids, cfg->max_prompt_tokens);
    for (size_t i = 0; i < s->n_prompt_token_ids; i++)
        if (s->prompt_token_ids[i] < 0)
            return pagoda_error_set(PAGODA_ERANGE, "prompt token %zu is negative (%d)", i,
                                    (int)s->prompt_token_ids[i]);
    if (s->n_stop_token_ids > ROUTER_MAX_STOP_TOKEN_IDS)
        return pagoda_error_set(PAGODA_ERANGE, "%zu stop token ids, more than the limit of %u",
                                s->n_stop_token_ids, ROUTER_MAX_STOP_TOKEN_IDS);
    for (size_t i = 0; i < s->n_stop_token_ids; i++)
        if (s->stop_token_ids[i] < 0)
            return pagoda_error_set(PAGODA_ERANGE, "stop token id %d is negative",
                                    (int)s->stop_token_ids[i]);
    p->prompt = s->prompt_token_ids;
    p->num_prompt = (uint32_t)s->n_prompt_token_ids;
    p->stop_ids = s->stop_token_ids;
    p->num_stop = (uint32_t)s->n_stop_token_ids;
    p->max_tokens = s->has_max_tokens ? s->max_tokens : ROUTER_DEFAULT_MAX_TOKENS;
    if (p->max_tokens < 1 || (uint32_t)p->max_tokens > cfg->max_new_tokens)
        return pagoda_error_set(PAGODA_ERANGE, "max_tokens %d is outside [1, %u]",
                                (int)p->max_tokens, cfg->max_new_tokens);
    p->strict_max_tokens = s->has_strict_max_tokens && s->strict_max_tokens;
    p->ignore_eos = s->has_ignore_eos && s->ignore_eos;

    /* Sampling: the one definition of defaults and ranges (wire/sampling_wire.h). */
    const Pagoda__SamplingParams *sp = s->sampling;
    p->has_seed = sp && sp->has_seed;
    p->logprobs = sp && sp->has_logprobs && sp->logprobs;
    if (sampling_from_client_over(sp, &cfg->sampling_defaults, &p->sampling) != 0) {
        char why[512];
        snprintf(why, sizeof(why), "%s", pagoda_error_detail());
        /* A NaN is out of range too, for a client: one code for every bad value. */
        return pagoda_error_set(PAGODA_ERANGE, "%s", why);
    }
    if (p->sampling.min_tokens > p->max_tokens)
        return pagoda_error_set(PAGODA_ERANGE, "min_tokens %d is more than max_tokens %d",
                                (int)p->sampling.min_tokens, (int)p->max_tokens);
    /* The logit bias: ids in the vocabulary are the scheduler's to check (it knows it). */
    if (sp != NULL &&
        (rc = logit_bias_validate(sp->logit_bias_token_ids, sp->n_logit_bias_token_ids,
                                  sp->logit_bias_values, sp->n_logit_bias_values, 0)) != 0)
        return rc;
    if (sp != NULL) {
        p->bias_ids = sp->logit_bias_token_ids;
        p->bias_values = sp->logit_bias_values;
        p->num_bias = (uint32_t)sp->n_logit_bias_token_ids;
    }
    return 0;
}

/* Whether a repeated Submit asks for the same thing. Prompts and stop ids are compared by their
 * keyed 128-bit hashes (a finished request keeps only those). A seed the router drew is not the
 * client's choice, so only seeds the clients chose are compared. */
static int submit_params_equal(const struct submit_params *a, const uint64_t a_hash[2],
                               const struct submit_params *b, const uint64_t b_hash[2])
{
    /* A text prompt's token count is known only once tokenized: its text is in the hash. */
    int same_prompt =
        a->has_text || b->has_text ? a->has_text == b->has_text : a->num_prompt == b->num_prompt;
    return same_prompt && a->num_stop == b->num_stop && a_hash[0] == b_hash[0] &&
           a_hash[1] == b_hash[1] && a->sampling.temperature == b->sampling.temperature &&
           a->sampling.top_p == b->sampling.top_p && a->sampling.top_k == b->sampling.top_k &&
           a->sampling.min_p == b->sampling.min_p &&
           a->sampling.repetition_penalty == b->sampling.repetition_penalty &&
           a->sampling.presence_penalty == b->sampling.presence_penalty &&
           a->sampling.frequency_penalty == b->sampling.frequency_penalty &&
           a->sampling.min_tokens == b->sampling.min_tokens && a->num_bias == b->num_bias &&
           a->has_seed == b->has_seed && (!a->has_seed || a->sampling.seed == b->sampling.seed) &&
           a->max_tokens == b->max_tokens && a->strict_max_tokens == b->strict_max_tokens &&
           a->ignore_eos == b->ignore_eos && a->logprobs == b->logprobs;
}

static struct request *request_new(struct router *r, uint32_t tenant, const uint8_t *id,
                                   const struct submit_params *p)
{
    struct request *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    memcpy(q->id, id, ID_BYTES);
    q->tenant = tenant;
    q->seen_ms = uv_now(r->loop);
    q->engine = ROUTE_NONE;
    sched_id_of(r, tenant, id, q->sched_id);
    q->p = *p;
    if (request_own_ids(q, p->prompt, p->num_prompt, p->stop_ids, p->num_stop, p->bias_ids,
                        p->bias_values, p->num_bias) != 0) {
        registry_request_free(r, q);
        return NULL;
    }
    prompt_hash(r, p, q->prompt_hash);
    if (!q->p.has_seed) /* the router draws a seed for requests without one */
        q->p.sampling.seed = router_random_u64();
    q->prompt_tokens = p->num_prompt;
    return q;
}

/* Whether another request already holds the scheduler id that (tenant, id) maps to: a 128-bit
 * hash collision, which is never expected, but must not merge two requests. */
static int sched_id_taken(const struct router *r, uint32_t tenant, const uint8_t *id)
{
    uint8_t sched_id[ID_BYTES];
    sched_id_of(r, tenant, id, sched_id);
    return registry_find(r, sched_id) != NULL;
}

static int read_id(const ProtobufCBinaryData *id, int has)
{
    if (!has || id->len != ID_BYTES)
        return pagoda_error_set(PAGODA_EINVAL, "request_id must be %d bytes (got %zu)", ID_BYTES,
                                has ? id->len : (size_t)0);
    return 0;
}

void registry_handle_submit(struct router *r, struct rctx *c, uint32_t tenant,
                            const Pagoda__SubmitRequest *s)
{
    struct submit_params p;
    int rc = read_id(&s->request_id, s->has_request_id);
    if (rc == 0)
        rc = submit_params_read(r, s, &p);
    if (rc != 0) {
        router_reply_error(c, rc, "submit: %s", pagoda_error_detail());
        return;
    }
    struct request *q = registry_find_client(r, tenant, s->request_id.data);
    if (q != NULL) {
        /* A resent Submit (NNG's REQ resends on a timeout or a lost connection): the same
         * request. The same id for something else is the client's mistake. */
        uint64_t hash[2];
        prompt_hash(r, &p, hash);
        if (!q->adopted && !submit_params_equal(&q->p, q->prompt_hash, &p, hash)) {
            router_reply_error(c, PAGODA_EEXIST,
                               "submit: request id already used with different parameters");
            return;
        }
        r->duplicate_submits++;
        r->slots[tenant].duplicate_submits++;
        q->seen_ms = uv_now(r->loop);
        router_reply_submitted(c, q);
        return;
    }
    /* (after the duplicate's lookup: a resend of a request admitted before the model's context
     * was known is the same request, not a new one to check) */
    char fit[256];
    if (!p.has_text && fits_context(r, &p, p.num_prompt, fit, sizeof(fit)) != 0) {
        router_reply_error(c, PAGODA_ERANGE, "submit: %s", fit); /* text: once tokenized */
        return;
    }
    if (r->draining) {
        router_reply_error(c, PAGODA_ECLOSED,
                           "submit: the router is draining (shutting down) and "
                           "admits no new requests");
        return;
    }
    if (r->live.count >= r->cfg.max_live_requests) {
        router_reply_error(
            c, PAGODA_EEXHAUSTED,
            "submit: the router holds %u unfinished requests, its limit: retry later",
            r->live.count);
        return;
    }
    if (r->slots[tenant].live >= r->slots[tenant].limit) {
        router_reply_error(
            c, PAGODA_EEXHAUSTED,
            "submit: this tenant has %u unfinished requests, its limit (max_running + "
            "max_waiting): retry later",
            r->slots[tenant].live);
        return;
    }
    if (sched_id_taken(r, tenant, s->request_id.data)) {
        router_reply_error(c, PAGODA_EEXIST, "submit: request id collides, choose another");
        return;
    }
    if ((q = request_new(r, tenant, s->request_id.data, &p)) == NULL) {
        router_reply_error(c, PAGODA_ENOMEM, "submit: out of memory");
        return;
    }
    if ((rc = router_text_attach(r, q, s)) != 0) {
        registry_request_free(r, q);
        router_reply_error(c, rc, "submit: %s", pagoda_error_detail());
        return;
    }
    size_t b = bucket_of(r, q->sched_id);
    q->hash_next = r->buckets[b];
    r->buckets[b] = q;
    list_push_back(&r->live, q);
    r->slots[tenant].live++;
    tenancy_ref(r, tenant);
    registry_account(r, q);
    if (q->job == NULL) { /* a text prompt goes once its job has tokenized it */
        registry_set_pending(r, q, &q->need_submit, 1);
        router_flush_pending(r);
    }
    router_reply_submitted(c, q);
}

void router_prompt_ready(struct router *r, struct request *q, int rc, const char *detail,
                         int32_t *ids, size_t n)
{
    if (q->finish != PAGODA__FINISH_REASON__FINISH_NONE) {
        free(ids); /* cancelled while it was tokenized */
        return;
    }
    char why[256];
    if (rc == 0 && (rc = fits_context(r, &q->p, (uint32_t)n, why, sizeof(why))) != 0)
        detail = why;
    if (rc != 0) {
        free(ids);
        char hex[2 * ID_BYTES + 1];
        router_id_hex(q->id, hex);
        log_debug("request %s: its prompt was refused: %s", hex, detail);
        registry_finish(r, q, PAGODA__FINISH_REASON__FINISH_ERROR, rc, detail);
        registry_trim(r, q->tenant);
        return;
    }
    free(q->prompt);
    q->prompt = ids;
    q->p.prompt = ids;
    q->p.num_prompt = (uint32_t)n;
    q->prompt_tokens = (uint32_t)n;
    registry_account(r, q);
    registry_set_pending(r, q, &q->need_submit, 1);
    router_flush_pending(r);
}

static void cancel_answer(struct router *r, struct rctx *c, uint32_t tenant, const uint8_t *id);

/* A call naming an id this router does not hold, which a restarted router's scheduler may still
 * announce (before its announcement, within ANNOUNCE_WAIT_MS of the start): parked until then,
 * ANNOUNCE_GRACE_MS at most (registry_unpark_unknown answers it again, or PAGODA_EBUSY where its
 * wait ran out first: before, a scheduler that announced more than 2 s after the router's start,
 * held up or slow, made every client in flight fail with "no request with this id", and the
 * requests then ran on unread). Where the places for such calls are taken (all, or
 * the tenant's share), PAGODA_EBUSY: retry. Before, a full set of places answered ENOENT, so one
 * tenant's flood of cancels of made-up ids made another tenant's clients give up their live
 * requests (a probe: 3 of 6). Returns 1 when c was parked or answered (busy), 0 when the id is to
 * be taken for unknown. */
static uint64_t announcement_wait_left(const struct router *r);

static int park_unknown(struct router *r, struct rctx *c, uint32_t tenant, const uint8_t *id,
                        const char *what)
{
    uint64_t left = announcement_wait_left(r);
    if (left == 0)
        return 0;
    if (!router_may_park(r, c) || r->num_unknown_parked >= MAX_UNKNOWN_PARKED ||
        (r->tenants != NULL && r->slots[tenant].unknown_parked >= MAX_TENANT_UNKNOWN_PARKED)) {
        r->parked_refused++;
        router_reply_error(c, PAGODA_EBUSY,
                           "%s: the router is starting and %u calls wait (this tenant's %u): %s "
                           "again",
                           what, r->num_parked, r->slots[tenant].parked, what);
        return 1;
    }
    c->park = PARK_UNKNOWN;
    memcpy(c->id, id, ID_BYTES);
    c->tenant = tenant;
    r->num_unknown_parked++;
    r->slots[tenant].unknown_parked++;
    router_park(&r->unknown_waiters, c,
                (uint32_t)(left < ANNOUNCE_GRACE_MS ? left : ANNOUNCE_GRACE_MS));
    return 1;
}

static void poll_answer(struct router *r, struct rctx *c, uint32_t tenant, const uint8_t *id,
                        int has_offset, uint32_t offset, uint32_t wait_ms)
{
    struct request *q = registry_find_client(r, tenant, id);
    if (q == NULL) {
        c->is_cancel = 0;
        c->has_offset = has_offset;
        c->offset = offset;
        c->wait_ms = wait_ms;
        if (park_unknown(r, c, tenant, id, "poll"))
            return; /* a restarted router: the scheduler may still announce this request */
    }
    if (q == NULL) {
        router_reply_error(
            c, PAGODA_ENOENT,
            "poll: no request with this id (never submitted, or its result expired)");
        return;
    }
    q->seen_ms = uv_now(r->loop);
    if (!has_offset)
        offset = 0;
    if (wait_ms > r->cfg.max_wait_ms)
        wait_ms = r->cfg.max_wait_ms;
    int finished = q->finish != PAGODA__FINISH_REASON__FINISH_NONE;
    if (offset > (uint32_t)q->p.max_tokens || (finished && offset > q->num_tokens)) {
        router_reply_error(c, PAGODA_ERANGE,
                           "poll: offset %u is beyond the request's output (%u tokens%s)", offset,
                           q->num_tokens, finished ? ", finished" : " so far");
        return;
    }
    if (offset < q->num_tokens || finished || wait_ms == 0) {
        router_reply_update(c, q, offset);
        return;
    }
    if (!router_may_park(r, c)) {
        /* As many calls wait as the router holds, or as the tenant's share: this one gets what
         * there is (nothing new) now, and its client polls again. */
        r->parked_refused++;
        router_reply_update(c, q, offset);
        return;
    }
    c->park = PARK_POLL;
    c->req = q;
    c->offset = offset;
    router_park(&q->waiters, c, wait_ms);
}

/* How much longer a call for an unknown id may wait for the schedulers' announcement: 0 once it
 * arrived, or ANNOUNCE_WAIT_MS after the router's start. */
static uint64_t announcement_wait_left(const struct router *r)
{
    uint64_t age = uv_now(r->loop) - r->started_ms;
    return r->announced || age >= ANNOUNCE_WAIT_MS ? 0 : ANNOUNCE_WAIT_MS - age;
}

void registry_unpark_unknown(struct rctx *c, int timed_out)
{
    struct router *r = c->r;
    uint8_t id[ID_BYTES];
    memcpy(id, c->id, ID_BYTES);
    uint32_t tenant = c->tenant, offset = c->offset, wait_ms = c->wait_ms;
    int has_offset = c->has_offset, is_cancel = c->is_cancel;
    router_unpark(c);
    if (timed_out && announcement_wait_left(r) > 0) {
        router_reply_error(c, PAGODA_EBUSY,
                           "%s: the router started %u ms ago and the scheduler has not yet said "
                           "which requests it holds: %s again",
                           is_cancel ? "cancel" : "poll",
                           (unsigned)(uv_now(r->loop) - r->started_ms),
                           is_cancel ? "cancel" : "poll");
        return;
    }
    if (is_cancel)
        cancel_answer(c->r, c, tenant, id);
    else
        poll_answer(c->r, c, tenant, id, has_offset, offset, wait_ms);
}

void registry_handle_poll(struct router *r, struct rctx *c, uint32_t tenant,
                          const Pagoda__PollRequest *poll)
{
    if (read_id(&poll->request_id, poll->has_request_id) != 0) {
        router_reply_error(c, PAGODA_EINVAL, "poll: %s", pagoda_error_detail());
        return;
    }
    poll_answer(r, c, tenant, poll->request_id.data, poll->has_offset, poll->offset,
                poll->has_wait_ms ? poll->wait_ms : 0);
}

/* Ends live q as cancelled and tells its scheduler, before the caller trims the tenant's
 * finished results (a trim may drop q, and a pending cancel with it). */
static void cancel_live(struct router *r, struct request *q)
{
    registry_finish(r, q, PAGODA__FINISH_REASON__FINISH_CANCELLED, 0, NULL);
    registry_set_pending(r, q, &q->need_cancel, 1);
    router_flush_pending(r);
}

void registry_cancel_abandoned(struct router *r, uint64_t now_ms)
{
    for (struct request *q = r->live.head, *next; q != NULL; q = next) {
        next = q->next;
        if (q->waiters != NULL || now_ms - q->seen_ms < r->cfg.abandon_ms)
            continue;
        char hex[2 * ID_BYTES + 1];
        router_id_hex(q->id, hex);
        log_info("request %s of tenant %s: no call for %u ms, its client gone: cancelled", hex,
                 r->slots[q->tenant].name, r->cfg.abandon_ms);
        cancel_live(r, q);
        registry_trim(r, q->tenant);
    }
}

/* A Cancel of id: the request ends (FINISH_CANCELLED) unless it has ended. An id a restarted
 * router may still learn from the announcement waits for it, as a poll does: answered ENOENT at
 * once, its client (which takes that for "ended meanwhile") polled on, and a Ctrl-C during a
 * router restart let the request run to its end (a kill-sequence probe: 1000 tokens). */
static void cancel_answer(struct router *r, struct rctx *c, uint32_t tenant, const uint8_t *id)
{
    struct request *q = registry_find_client(r, tenant, id);
    if (q == NULL) {
        c->is_cancel = 1;
        if (park_unknown(r, c, tenant, id, "cancel"))
            return;
        router_reply_error(
            c, PAGODA_ENOENT,
            "cancel: no request with this id (never submitted, or its result expired)");
        return;
    }
    if (q->finish == PAGODA__FINISH_REASON__FINISH_NONE)
        cancel_live(r, q);
    router_reply_update(c, q, q->num_tokens);
    registry_trim(r, tenant);
}

void registry_handle_cancel(struct router *r, struct rctx *c, uint32_t tenant,
                            const Pagoda__CancelRequest *cancel)
{
    if (read_id(&cancel->request_id, cancel->has_request_id) != 0) {
        router_reply_error(c, PAGODA_EINVAL, "cancel: %s", pagoda_error_detail());
        return;
    }
    cancel_answer(r, c, tenant, cancel->request_id.data);
}
