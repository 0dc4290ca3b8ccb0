#include "worker/mirror.h"
#include "common/error.h"
#include "wire/sampling_wire.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* One sequence. tokens and blocks have room for growth (their *_cap); entries past num_tokens
 * and num_blocks are not part of the mirror's state, which lets a prepared step stage appended
 * block ids there without changing the sequence. */
struct mseq {
    uint64_t seq_id;
    /* Names this copy's history for the backend (struct sample_row history_key): a new one for
     * each mseq made, never reused in the process, so that a sequence rebuilt by a resync, or a
     * seq_id of another epoch, never matches a history kept for an older one. */
    uint64_t history_key;
    int32_t *tokens;
    int32_t num_tokens, tokens_cap;
    int32_t num_prompt, num_computed;
    int32_t *blocks;
    int32_t num_blocks, blocks_cap;
    struct sampling_params sampling;
    /* The request's logit bias, and the stop ids min_tokens suppresses (kernels/cpu/logit_bias.h):
     * the sampled rows' struct logit_entry list; bias_rest, the bias without them (while they are
     * suppressed). */
    struct logit_bias bias, bias_rest;
    int32_t *suppress;
    int32_t n_suppress;
    /* The prepare generation that drops, continues or fails this sequence: scratch marks, not
     * state. A failed sequence is dropped at commit. */
    uint64_t drop_mark, cont_mark, fail_mark;
};

/* What a prepared step does to one sequence at commit. */
struct pend {
    struct mseq *seq;
    int32_t chunk;    /* tokens computed */
    int32_t n_append; /* block ids staged past seq->num_blocks */
    int32_t row;      /* its logits row, or -1 */
};

/* A step committed pending: where each row's pending token sits. */
struct inflight {
    uint64_t step_id;
    int32_t num_rows;
    uint64_t *seq_ids; /* [max_seqs] */
    int32_t *pos;      /* [max_seqs]: index of the pending token in the sequence's tokens */
};

/* A sequence dropped because one of its steps failed it, remembered for the steps the scheduler
 * may have formed before it learned. */
struct recent_failure {
    uint64_t seq_id, step_id;
    int32_t code;
    char message[MIRROR_ERROR_MESSAGE_MAX];
};

struct mirror {
    struct mirror_limits lim;
    int32_t max_blocks_per_seq;
    int synced;
    uint64_t epoch, next_step_id;

    struct mseq **seqs; /* [max_seqs] */
    int32_t num_seqs;
    struct mseq **spare; /* [max_seqs]: the table a resync builds before it swaps */
    /* seq_id -> index in seqs: open addressing, linear probing, -1 for empty. Rebuilt whenever
     * the table changes (commit, resync), which costs O(index_cap) once per step. */
    int32_t *index;
    uint32_t index_cap;    /* a power of two, at least 2 * max_seqs */
    uint64_t *scratch_ids; /* [max_seqs]: for duplicate checks */

    /* The prepared step. */
    int prepared;
    uint64_t gen;      /* increases with every prepare; marks in mseq refer to it */
    struct pend *pend; /* [2 * max_seqs] */
    int32_t num_pend;
    struct mseq **staged;  /* [max_seqs]: new sequences, not yet in seqs */
    int32_t *staged_chunk; /* [max_seqs]: the tokens each staged sequence computes */
    int32_t num_staged;
    struct mirror_seq_error *failed; /* [2 * max_seqs]: sequences the prepared step fails */
    int32_t num_failed;

    /* The batch. */
    int32_t *token_ids, *positions;         /* [max_batched_tokens] */
    int64_t *slots;                         /* [max_batched_tokens] */
    int32_t *query_start;                   /* [max_seqs + 1] */
    int32_t *context_lens, *logits_indices; /* [max_seqs] */
    struct logit_entry *entries;            /* [max_seqs * LOGIT_ENTRIES_PER_ROW]: the batch's */
    int32_t num_entries;
    struct sample_row *rows; /* [max_seqs] */
    uint64_t *row_seq_ids;   /* [max_seqs] */
    int32_t *block_tables;
    size_t block_tables_cap; /* entries */

    /* Steps in flight: slot step_id % MIRROR_MAX_STEPS_IN_FLIGHT, oldest first. */
    struct inflight inflight[MIRROR_MAX_STEPS_IN_FLIGHT];
    int32_t num_inflight;
    uint64_t oldest_inflight;
    uint64_t broken_step;          /* 0, or the step whose failure left the mirror wrong */
    struct recent_failure *recent; /* ring of [2 * max_seqs] */
    int32_t recent_head, num_recent;
};

/* ---- sequences --------------------------------------------------------------------------- */

static void mseq_free(struct mseq *s)
{
    if (s == NULL)
        return;
    free(s->tokens);
    free(s->blocks);
    logit_bias_fini(&s->bias);
    logit_bias_fini(&s->bias_rest);
    free(s->suppress);
    free(s);
}

/* Grows an int32 array to hold need entries (doubling, capped at max; need above max is a
 * broken invariant: callers check their limits first). */
static int reserve_i32(int32_t **arr, int32_t *cap, int32_t need, int32_t max)
{
    if (need <= *cap)
        return 0;
    if (need > max)
        return pagoda_error_set(PAGODA_EINTERNAL, "mirror: %d entries above the limit %d", need,
                                max);
    int64_t grown = *cap > 0 ? (int64_t)*cap * 2 : 16;
    if (grown < need)
        grown = need;
    if (grown > max)
        grown = max;
    int32_t *p = realloc(*arr, (size_t)grown * sizeof(int32_t));
    if (p == NULL)
        return PAGODA_ENOMEM;
    *arr = p;
    *cap = (int32_t)grown;
    return 0;
}

static int32_t blocks_for(int32_t tokens, int32_t block_size)
{
    return (int32_t)(((int64_t)tokens + block_size - 1) / block_size);
}

/* The fields a NewSequence and a SequenceSnapshot share, checked against the limits. */
struct seq_fields {
    uint64_t seq_id;
    const int32_t *token_ids;
    size_t n_tokens;
    int32_t num_prompt;
    int32_t num_computed;
    const int32_t *block_ids;
    size_t n_blocks;
    const Pagoda__Internal__SamplingParams *sampling;
};

static int check_block_ids(const struct mirror *m, uint64_t seq_id, const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 1 || ids[i] >= m->lim.num_blocks)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "sequence %" PRIu64 ": block id %d is outside the pool "
                                    "(blocks 1..%d)",
                                    seq_id, ids[i], m->lim.num_blocks - 1);
    return 0;
}

static int check_seq_fields(const struct mirror *m, const struct seq_fields *f,
                            struct sampling_params *sp)
{
    uint64_t id = f->seq_id;
    if (f->n_tokens > (size_t)m->lim.max_tokens_per_seq)
        return pagoda_error_set(PAGODA_ERANGE, "sequence %" PRIu64 ": %zu tokens (the limit is %d)",
                                id, f->n_tokens, m->lim.max_tokens_per_seq);
    int32_t n = (int32_t)f->n_tokens;
    for (int32_t i = 0; i < n; i++)
        if (f->token_ids[i] < 0 || f->token_ids[i] >= m->lim.vocab_size)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "sequence %" PRIu64 ": token id %d is outside the "
                                    "vocabulary (size %" PRId64 ")",
                                    id, f->token_ids[i], m->lim.vocab_size);
    if (f->num_prompt < 1 || f->num_prompt > n)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": num_prompt_tokens %d with %d tokens", id,
                                f->num_prompt, n);
    if (f->num_computed < 0 || f->num_computed > n)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": num_computed_tokens %d with %d tokens", id,
                                f->num_computed, n);
    if (f->n_blocks > (size_t)m->max_blocks_per_seq)
        return pagoda_error_set(PAGODA_ERANGE, "sequence %" PRIu64 ": %zu blocks (the limit is %d)",
                                id, f->n_blocks, m->max_blocks_per_seq);
    int rc = check_block_ids(m, id, f->block_ids, f->n_blocks);
    if (rc != 0)
        return rc;
    if (blocks_for(f->num_computed, m->lim.block_size) > (int32_t)f->n_blocks)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": %zu blocks cannot hold its %d computed "
                                "tokens",
                                id, f->n_blocks, f->num_computed);
    const Pagoda__Internal__SamplingParams *smp = f->sampling;
    if ((rc = sampling_from_internal(smp, sp)) != 0 ||
        (smp != NULL &&
         (rc = logit_bias_validate(smp->logit_bias_token_ids, smp->n_logit_bias_token_ids,
                                   smp->logit_bias_values, smp->n_logit_bias_values,
                                   m->lim.vocab_size)) != 0) ||
        (smp != NULL &&
         (rc = logit_suppress_validate(smp->min_tokens_stop_ids, smp->n_min_tokens_stop_ids,
                                       m->lim.vocab_size)) != 0)) {
        char why[512];
        snprintf(why, sizeof(why), "%s", pagoda_error_detail());
        return pagoda_error_set(rc, "sequence %" PRIu64 ": %s", id, why);
    }
    return 0;
}

/* The last history key given: process-wide, so that no two mirrors over one backend share one. */
static _Atomic uint64_t history_keys;

/* A new mseq holding a copy of f, with room for extra more tokens, and a history key of its
 * own. */
static int mseq_from_fields(const struct mirror *m, const struct seq_fields *f,
                            const struct sampling_params *sp, int32_t extra, struct mseq **out)
{
    struct mseq *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return PAGODA_ENOMEM;
    s->seq_id = f->seq_id;
    s->history_key = atomic_fetch_add(&history_keys, 1) + 1;
    s->num_tokens = (int32_t)f->n_tokens;
    s->num_prompt = f->num_prompt;
    s->num_computed = f->num_computed;
    s->num_blocks = (int32_t)f->n_blocks;
    s->sampling = *sp;
    const Pagoda__Internal__SamplingParams *smp = f->sampling;
    if (smp != NULL && smp->n_min_tokens_stop_ids > 0) {
        s->suppress = malloc(smp->n_min_tokens_stop_ids * sizeof(int32_t));
        if (s->suppress == NULL) {
            mseq_free(s);
            return PAGODA_ENOMEM;
        }
        memcpy(s->suppress, smp->min_tokens_stop_ids, smp->n_min_tokens_stop_ids * sizeof(int32_t));
        s->n_suppress = (int32_t)smp->n_min_tokens_stop_ids;
    }
    if (smp != NULL &&
        (logit_bias_copy(&s->bias, smp->logit_bias_token_ids, smp->logit_bias_values,
                         smp->n_logit_bias_token_ids) != 0 ||
         (s->n_suppress > 0 &&
          logit_bias_without(&s->bias, s->suppress, s->n_suppress, &s->bias_rest) != 0))) {
        mseq_free(s);
        return PAGODA_ENOMEM;
    }
    int32_t room = s->num_tokens + extra;
    if (room > m->lim.max_tokens_per_seq)
        room = m->lim.max_tokens_per_seq;
    int rc;
    if ((rc = reserve_i32(&s->tokens, &s->tokens_cap, room, m->lim.max_tokens_per_seq)) != 0 ||
        (rc = reserve_i32(&s->blocks, &s->blocks_cap, s->num_blocks > 0 ? s->num_blocks : 1,
                          m->max_blocks_per_seq)) != 0) {
        mseq_free(s);
        return rc;
    }
    memcpy(s->tokens, f->token_ids, f->n_tokens * sizeof(int32_t));
    if (f->n_blocks > 0)
        memcpy(s->blocks, f->block_ids, f->n_blocks * sizeof(int32_t));
    *out = s;
    return 0;
}

/* ---- the index ----------------------------------------------------------------------------- */

static uint32_t hash_id(uint64_t x)
{
    return (uint32_t)XXH3_64bits(&x, sizeof(x));
}

static void index_rebuild(struct mirror *m)
{
    uint32_t mask = m->index_cap - 1;
    for (uint32_t i = 0; i < m->index_cap; i++)
        m->index[i] = -1;
    for (int32_t k = 0; k < m->num_seqs; k++) {
        uint32_t h = hash_id(m->seqs[k]->seq_id) & mask;
        while (m->index[h] >= 0)
            h = (h + 1) & mask;
        m->index[h] = k;
    }
}

static struct mseq *lookup(const struct mirror *m, uint64_t seq_id)
{
    uint32_t mask = m->index_cap - 1;
    for (uint32_t h = hash_id(seq_id) & mask; m->index[h] >= 0; h = (h + 1) & mask) {
        struct mseq *s = m->seqs[m->index[h]];
        if (s->seq_id == seq_id)
            return s;
    }
    return NULL;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Sorts the first n scratch ids and returns the first one that appears twice, if any. */
static int find_duplicate(uint64_t *ids, size_t n, uint64_t *dup)
{
    qsort(ids, n, sizeof(*ids), cmp_u64);
    for (size_t i = 1; i < n; i++)
        if (ids[i] == ids[i - 1]) {
            *dup = ids[i];
            return 1;
        }
    return 0;
}

/* ---- life cycle ---------------------------------------------------------------------------- */

int32_t mirror_limits_max_blocks_per_seq(const struct mirror_limits *l)
{
    int32_t b = blocks_for(l->max_tokens_per_seq, l->block_size);
    return b < l->num_blocks - 1 ? b : l->num_blocks - 1;
}

int mirror_new(const struct mirror_limits *limits, struct mirror **out)
{
    if (limits == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "mirror_new: NULL argument");
    const struct mirror_limits *l = limits;
    if (l->max_seqs < 1 || l->max_seqs > MIRROR_PENDING_ROWS || l->max_tokens_per_seq < 1 ||
        l->max_batched_tokens < 1 || l->num_blocks < 2 || l->block_size < KV_BLOCK_SIZE_MIN ||
        l->block_size > KV_BLOCK_SIZE_MAX || l->vocab_size < 1 || l->vocab_size > SAMPLER_VOCAB_MAX)
        return pagoda_error_set(PAGODA_ERANGE,
                                "mirror limits: max_seqs %d, max_tokens_per_seq %d, "
                                "max_batched_tokens %d, num_blocks %d, block_size %d, vocab "
                                "%" PRId64,
                                l->max_seqs, l->max_tokens_per_seq, l->max_batched_tokens,
                                l->num_blocks, l->block_size, l->vocab_size);
    struct mirror *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return PAGODA_ENOMEM;
    m->lim = *l;
    m->max_blocks_per_seq = mirror_limits_max_blocks_per_seq(l);
    size_t ns = (size_t)l->max_seqs, nt = (size_t)l->max_batched_tokens;
    m->index_cap = 16;
    while (m->index_cap < 2 * ns)
        m->index_cap *= 2;
    m->seqs = calloc(ns, sizeof(*m->seqs));
    m->spare = calloc(ns, sizeof(*m->spare));
    m->index = malloc(m->index_cap * sizeof(*m->index));
    m->scratch_ids = malloc(ns * sizeof(*m->scratch_ids));
    m->pend = malloc(2 * ns * sizeof(*m->pend));
    m->staged = calloc(ns, sizeof(*m->staged));
    m->staged_chunk = calloc(ns, sizeof(*m->staged_chunk));
    m->failed = calloc(2 * ns, sizeof(*m->failed));
    m->token_ids = malloc(nt * sizeof(int32_t));
    m->positions = malloc(nt * sizeof(int32_t));
    m->slots = malloc(nt * sizeof(int64_t));
    m->query_start = malloc((ns + 1) * sizeof(int32_t));
    m->context_lens = malloc(ns * sizeof(int32_t));
    m->logits_indices = malloc(ns * sizeof(int32_t));
    m->rows = malloc(ns * sizeof(*m->rows));
    m->entries = malloc(ns * LOGIT_ENTRIES_PER_ROW * sizeof(*m->entries));
    m->row_seq_ids = malloc(ns * sizeof(*m->row_seq_ids));
    m->recent = calloc(2 * ns, sizeof(*m->recent));
    int inflight_ok = 1;
    for (int i = 0; i < MIRROR_MAX_STEPS_IN_FLIGHT; i++) {
        m->inflight[i].seq_ids = malloc(ns * sizeof(uint64_t));
        m->inflight[i].pos = malloc(ns * sizeof(int32_t));
        inflight_ok = inflight_ok && m->inflight[i].seq_ids && m->inflight[i].pos;
    }
    if (!inflight_ok || !m->recent || !m->seqs || !m->spare || !m->index || !m->scratch_ids ||
        !m->pend || !m->staged || !m->staged_chunk || !m->failed || !m->token_ids ||
        !m->positions || !m->slots || !m->query_start || !m->context_lens || !m->logits_indices ||
        !m->rows || !m->entries || !m->row_seq_ids) {
        mirror_free(m);
        return PAGODA_ENOMEM;
    }
    index_rebuild(m);
    *out = m;
    return 0;
}

static void free_staged(struct mirror *m)
{
    for (int32_t i = 0; i < m->num_staged; i++)
        mseq_free(m->staged[i]);
    m->num_staged = 0;
}

void mirror_free(struct mirror *m)
{
    if (m == NULL)
        return;
    if (m->staged != NULL)
        free_staged(m);
    for (int32_t i = 0; i < m->num_seqs; i++)
        mseq_free(m->seqs[i]);
    free(m->seqs);
    free(m->spare);
    free(m->index);
    free(m->scratch_ids);
    free(m->pend);
    free(m->staged);
    free(m->staged_chunk);
    free(m->failed);
    free(m->token_ids);
    free(m->positions);
    free(m->slots);
    free(m->query_start);
    free(m->context_lens);
    free(m->logits_indices);
    free(m->rows);
    free(m->entries);
    free(m->row_seq_ids);
    free(m->block_tables);
    free(m->recent);
    for (int i = 0; i < MIRROR_MAX_STEPS_IN_FLIGHT; i++) {
        free(m->inflight[i].seq_ids);
        free(m->inflight[i].pos);
    }
    free(m);
}

static int seq_fails(struct mirror *m, uint64_t id, int rc);

/* ---- resync -------------------------------------------------------------------------------- */

int mirror_resync(struct mirror *m, const Pagoda__Internal__Resync *r)
{
    if (m == NULL || r == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "mirror_resync: NULL argument");
    mirror_step_abort(m);
    if (!r->has_epoch || !r->has_next_step_id)
        return pagoda_error_set(PAGODA_EINVAL, "resync without %s",
                                r->has_epoch ? "next_step_id" : "epoch");
    if (r->n_seqs > (size_t)m->lim.max_seqs)
        return pagoda_error_set(PAGODA_ERANGE, "resync of %zu sequences (the limit is %d)",
                                r->n_seqs, m->lim.max_seqs);
    int32_t n = (int32_t)r->n_seqs;
    for (int32_t i = 0; i < n; i++) {
        const Pagoda__Internal__SequenceSnapshot *sn = r->seqs[i];
        if (!sn->has_seq_id || !sn->has_num_prompt_tokens)
            return pagoda_error_set(PAGODA_EINVAL, "resync: snapshot %d without %s", i,
                                    sn->has_seq_id ? "num_prompt_tokens" : "seq_id");
        m->scratch_ids[i] = sn->seq_id;
    }
    uint64_t dup;
    if (find_duplicate(m->scratch_ids, (size_t)n, &dup))
        return pagoda_error_set(PAGODA_EINVAL, "resync: sequence %" PRIu64 " listed twice", dup);

    int32_t built = 0;
    int rc = 0;
    m->num_failed = 0;
    for (int32_t i = 0; i < n; i++) {
        const Pagoda__Internal__SequenceSnapshot *sn = r->seqs[i];
        struct seq_fields f = {
            .seq_id = sn->seq_id,
            .token_ids = sn->token_ids,
            .n_tokens = sn->n_token_ids,
            .num_prompt = sn->num_prompt_tokens,
            .num_computed = sn->has_num_computed_tokens ? sn->num_computed_tokens : 0,
            .block_ids = sn->block_ids,
            .n_blocks = sn->n_block_ids,
            .sampling = sn->sampling,
        };
        struct sampling_params sp;
        if ((rc = check_seq_fields(m, &f, &sp)) != 0) {
            seq_fails(m, sn->seq_id, rc); /* its own content: left out, not the resync */
            rc = 0;
            continue;
        }
        if ((rc = mseq_from_fields(m, &f, &sp, 1, &m->spare[built])) != 0)
            goto fail;
        built++;
    }
    for (int32_t i = 0; i < m->num_seqs; i++)
        mseq_free(m->seqs[i]);
    struct mseq **old = m->seqs;
    m->seqs = m->spare;
    m->spare = old;
    m->num_seqs = built;
    m->epoch = r->epoch;
    m->next_step_id = r->next_step_id;
    m->synced = 1;
    m->num_inflight = 0;
    m->broken_step = 0;
    m->num_recent = 0;
    index_rebuild(m);
    return 0;
fail:
    for (int32_t i = 0; i < built; i++)
        mseq_free(m->spare[i]);
    m->num_failed = 0;
    return rc;
}

/* ---- steps ----------------------------------------------------------------------------------- */

/* Remembers that step_id failed sequence e->seq_id, for the steps formed before the scheduler
 * knew (MIRROR_MAX_STEPS_IN_FLIGHT of them); the ring forgets the oldest first. */
static void remember_failure(struct mirror *m, const struct mirror_seq_error *e, uint64_t step_id)
{
    int32_t cap = 2 * m->lim.max_seqs;
    struct recent_failure *f = &m->recent[(m->recent_head + m->num_recent) % cap];
    if (m->num_recent == cap)
        m->recent_head = (m->recent_head + 1) % cap;
    else
        m->num_recent++;
    f->seq_id = e->seq_id;
    f->step_id = step_id;
    f->code = e->code;
    snprintf(f->message, sizeof(f->message), "%s", e->message);
}

/* The failure of seq_id in one of the last MIRROR_MAX_STEPS_IN_FLIGHT steps, or NULL. */
static const struct recent_failure *find_recent_failure(const struct mirror *m, uint64_t seq_id)
{
    int32_t cap = 2 * m->lim.max_seqs;
    for (int32_t i = m->num_recent - 1; i >= 0; i--) {
        const struct recent_failure *f = &m->recent[(m->recent_head + i) % cap];
        if (f->seq_id == seq_id && f->step_id + MIRROR_MAX_STEPS_IN_FLIGHT >= m->next_step_id)
            return f;
    }
    return NULL;
}

/* The logits rows of the prepared step. */
static int32_t count_rows(const struct mirror *m)
{
    int32_t n = 0;
    for (int32_t i = 0; i < m->num_pend; i++)
        n += m->pend[i].row >= 0;
    return n;
}

/* Records that the step being prepared fails sequence id with rc (the detail is the current
 * error detail): the sequence's own content is at fault, not the step, so the rest of the step
 * runs. Returns 0. */
static int seq_fails(struct mirror *m, uint64_t id, int rc)
{
    struct mirror_seq_error *e = &m->failed[m->num_failed++];
    e->seq_id = id;
    e->code = rc;
    snprintf(e->message, sizeof(e->message), "%s", pagoda_error_detail());
    return 0;
}

/* The checks of one new sequence that concern only its own content. */
static int check_new_seq(struct mirror *m, const Pagoda__Internal__NewSequence *ns,
                         const struct seq_fields *f, struct sampling_params *sp)
{
    uint64_t id = f->seq_id;
    int rc = check_seq_fields(m, f, sp);
    if (rc != 0)
        return rc;
    int32_t chunk = ns->num_new_tokens, known = (int32_t)f->n_tokens;
    if (chunk < 0 || chunk > known - f->num_computed)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": %d new tokens after %d computed, of "
                                "%d known",
                                id, chunk, f->num_computed, known);
    int32_t context = f->num_computed + chunk;
    if (blocks_for(context, m->lim.block_size) > (int32_t)f->n_blocks)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": %zu blocks cannot hold %d tokens", id,
                                f->n_blocks, context);
    int samples = chunk > 0 && context == known;
    if (samples && known >= m->lim.max_tokens_per_seq)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": sampling would exceed %d tokens", id,
                                m->lim.max_tokens_per_seq);
    return 0;
}

/* Checks the new sequences and stages a copy of each (nothing enters the table). A sequence
 * whose own content is wrong is not staged but failed. */
static int stage_new(struct mirror *m, const Pagoda__Internal__Step *s, int64_t *tokens)
{
    size_t n = s->n_new_seqs;
    for (size_t i = 0; i < n; i++) {
        const Pagoda__Internal__NewSequence *ns = s->new_seqs[i];
        if (!ns->has_seq_id || !ns->has_num_prompt_tokens || !ns->has_num_new_tokens)
            return pagoda_error_set(PAGODA_EINVAL, "step: new sequence %zu without %s", i,
                                    !ns->has_seq_id              ? "seq_id"
                                    : !ns->has_num_prompt_tokens ? "num_prompt_tokens"
                                                                 : "num_new_tokens");
        m->scratch_ids[i] = ns->seq_id;
    }
    uint64_t dup;
    if (find_duplicate(m->scratch_ids, n, &dup))
        return pagoda_error_set(PAGODA_EEXIST, "step: new sequence %" PRIu64 " listed twice", dup);
    for (size_t i = 0; i < n; i++) {
        const Pagoda__Internal__NewSequence *ns = s->new_seqs[i];
        uint64_t id = ns->seq_id;
        const struct mseq *held = lookup(m, id);
        if (held != NULL && held->drop_mark != m->gen)
            return pagoda_error_set(PAGODA_EEXIST, "step: new sequence %" PRIu64 " is already held",
                                    id);
        struct seq_fields f = {
            .seq_id = id,
            .token_ids = ns->token_ids,
            .n_tokens = ns->n_token_ids,
            .num_prompt = ns->num_prompt_tokens,
            .num_computed = ns->has_num_computed_tokens ? ns->num_computed_tokens : 0,
            .block_ids = ns->block_ids,
            .n_blocks = ns->n_block_ids,
            .sampling = ns->sampling,
        };
        struct sampling_params sp;
        int rc = check_new_seq(m, ns, &f, &sp);
        if (rc == PAGODA_ENOMEM)
            return rc;
        if (rc != 0) {
            seq_fails(m, id, rc);
            continue;
        }
        int32_t chunk = ns->num_new_tokens;
        *tokens += chunk;
        struct mseq *copy;
        if ((rc = mseq_from_fields(m, &f, &sp, 1, &copy)) != 0)
            return rc;
        m->staged_chunk[m->num_staged] = chunk;
        m->staged[m->num_staged++] = copy;
    }
    return 0;
}

/* The checks of one continuing sequence that concern only its own content (the step agrees
 * with the mirror about it). */
static int check_cont_seq(const struct mirror *m, const Pagoda__Internal__ContinuingSequence *cs,
                          const struct mseq *q)
{
    uint64_t id = cs->seq_id;
    int32_t chunk = cs->num_new_tokens;
    if (chunk < 0 || chunk > q->num_tokens - q->num_computed)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": %d new tokens after %d computed, of "
                                "%d known",
                                id, chunk, q->num_computed, q->num_tokens);
    if (cs->n_appended_block_ids > (size_t)(m->max_blocks_per_seq - q->num_blocks))
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": %d + %zu blocks (the limit is %d)", id,
                                q->num_blocks, cs->n_appended_block_ids, m->max_blocks_per_seq);
    int rc = check_block_ids(m, id, cs->appended_block_ids, cs->n_appended_block_ids);
    if (rc != 0)
        return rc;
    int32_t nb = q->num_blocks + (int32_t)cs->n_appended_block_ids;
    int32_t context = q->num_computed + chunk;
    if (blocks_for(context, m->lim.block_size) > nb)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": %d blocks cannot hold %d tokens", id, nb,
                                context);
    int samples = chunk > 0 && context == q->num_tokens;
    if (samples && q->num_tokens >= m->lim.max_tokens_per_seq)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sequence %" PRIu64 ": sampling would exceed %d tokens", id,
                                m->lim.max_tokens_per_seq);
    return 0;
}

/* Checks the continuing sequences and makes room for what the step appends to them. A sequence
 * whose own content is wrong is marked failed (fail_mark) instead. */
static int check_cont(struct mirror *m, const Pagoda__Internal__Step *s, int64_t *tokens)
{
    for (size_t i = 0; i < s->n_cont_seqs; i++) {
        const Pagoda__Internal__ContinuingSequence *cs = s->cont_seqs[i];
        if (!cs->has_seq_id || !cs->has_num_computed_tokens || !cs->has_num_new_tokens)
            return pagoda_error_set(PAGODA_EINVAL, "step: continuing sequence %zu without %s", i,
                                    !cs->has_seq_id                ? "seq_id"
                                    : !cs->has_num_computed_tokens ? "num_computed_tokens"
                                                                   : "num_new_tokens");
        uint64_t id = cs->seq_id;
        struct mseq *q = lookup(m, id);
        if (q == NULL) {
            const struct recent_failure *f = find_recent_failure(m, id);
            if (f == NULL)
                return pagoda_error_set(PAGODA_ENOENT,
                                        "step: continuing sequence %" PRIu64 " is not held", id);
            pagoda_error_set(f->code, "sequence %" PRIu64 " failed in step %" PRIu64 ": %s", id,
                             f->step_id, f->message);
            seq_fails(m, id, f->code);
            continue;
        }
        if (q->drop_mark == m->gen)
            return pagoda_error_set(
                PAGODA_ENOENT, "step: continuing sequence %" PRIu64 " is dropped by the same step",
                id);
        if (q->cont_mark == m->gen)
            return pagoda_error_set(PAGODA_EINVAL, "step: sequence %" PRIu64 " is continued twice",
                                    id);
        q->cont_mark = m->gen;
        if (cs->num_computed_tokens != q->num_computed)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    "sequence %" PRIu64 ": the step says %d computed tokens, "
                                    "the worker's mirror %d",
                                    id, cs->num_computed_tokens, q->num_computed);
        int rc = check_cont_seq(m, cs, q);
        if (rc != 0) {
            q->fail_mark = m->gen;
            seq_fails(m, id, rc);
            continue;
        }
        int32_t chunk = cs->num_new_tokens;
        int32_t nb = q->num_blocks + (int32_t)cs->n_appended_block_ids;
        int samples = chunk > 0 && q->num_computed + chunk == q->num_tokens;
        *tokens += chunk;
        /* Room only: capacity is not state. */
        if ((rc = reserve_i32(&q->tokens, &q->tokens_cap, q->num_tokens + samples,
                              m->lim.max_tokens_per_seq)) != 0 ||
            (rc = reserve_i32(&q->blocks, &q->blocks_cap, nb > 0 ? nb : 1,
                              m->max_blocks_per_seq)) != 0)
            return rc;
    }
    return 0;
}

/* Adds one sequence's chunk to the batch being built; n is the batch's token count so far. */
static void add_chunk(struct mirror *m, struct mseq *q, int32_t chunk, int32_t n_append, int32_t *n,
                      int32_t *ns, int32_t *nl, int32_t row_width)
{
    struct pend *p = &m->pend[m->num_pend++];
    p->seq = q;
    p->chunk = chunk;
    p->n_append = n_append;
    p->row = -1;
    if (chunk == 0)
        return;
    const int32_t bs = m->lim.block_size;
    const int32_t *table = q->blocks; /* appended ids are staged past num_blocks */
    for (int32_t j = 0; j < chunk; j++) {
        int32_t pos = q->num_computed + j;
        m->token_ids[*n + j] = q->tokens[pos];
        m->positions[*n + j] = pos;
        m->slots[*n + j] = (int64_t)table[pos / bs] * bs + pos % bs;
    }
    int32_t *row = m->block_tables + (size_t)*ns * (size_t)row_width;
    int32_t nb = q->num_blocks + n_append;
    memcpy(row, table, (size_t)nb * sizeof(int32_t));
    memset(row + nb, 0, (size_t)(row_width - nb) * sizeof(int32_t));
    m->query_start[*ns] = *n;
    m->context_lens[*ns] = q->num_computed + chunk;
    *n += chunk;
    (*ns)++;
    if (q->num_computed + chunk == q->num_tokens) {
        int32_t out_len = q->num_tokens - q->num_prompt;
        m->rows[*nl] = (struct sample_row){
            .params = q->sampling,
            .output_index = (uint64_t)out_len,
            .prompt_tokens = q->tokens,
            .n_prompt = (size_t)q->num_prompt,
            .output_tokens = out_len > 0 ? q->tokens + q->num_prompt : NULL,
            .n_output = (size_t)out_len,
            .history_key = q->history_key,
        };
        m->logits_indices[*nl] = *n - 1;
        m->row_seq_ids[*nl] = q->seq_id;
        const int suppress = out_len < q->sampling.min_tokens && q->n_suppress > 0;
        m->num_entries +=
            logit_entries_build(*nl, suppress ? &q->bias_rest : &q->bias, q->suppress,
                                suppress ? q->n_suppress : 0, m->entries + m->num_entries);
        p->row = *nl;
        (*nl)++;
    }
}

int mirror_step_prepare(struct mirror *m, const Pagoda__Internal__Step *s, struct mirror_step *out)
{
    if (m == NULL || s == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "mirror_step_prepare: NULL argument");
    mirror_step_abort(m);
    if (!m->synced)
        return pagoda_error_set(MIRROR_EOTHER_EPOCH, "step before the first resync");
    if (!s->has_epoch)
        return pagoda_error_set(PAGODA_EINVAL, "step without an epoch");
    if (s->epoch != m->epoch)
        return pagoda_error_set(MIRROR_EOTHER_EPOCH,
                                "step of epoch %" PRIu64 ", the worker is in epoch %" PRIu64,
                                s->epoch, m->epoch);
    if (!s->has_step_id)
        return pagoda_error_set(PAGODA_EINVAL, "step without a step_id");
    if (m->broken_step != 0)
        return pagoda_error_set(PAGODA_EPROTO,
                                "step %" PRIu64 ": step %" PRIu64 " failed after later steps were "
                                "prepared from it; the worker waits for a resync",
                                s->step_id, m->broken_step);
    if (s->step_id != m->next_step_id)
        return pagoda_error_set(PAGODA_EPROTO, "step %" PRIu64 ", the worker expects step %" PRIu64,
                                s->step_id, m->next_step_id);
    if (m->num_inflight >= MIRROR_MAX_STEPS_IN_FLIGHT)
        return pagoda_error_set(PAGODA_EBUSY,
                                "step %" PRIu64 ": %d steps are in flight already (the limit)",
                                s->step_id, m->num_inflight);
    const size_t max_seqs = (size_t)m->lim.max_seqs;
    if (s->n_new_seqs > max_seqs || s->n_cont_seqs > max_seqs)
        return pagoda_error_set(PAGODA_ERANGE,
                                "step with %zu new and %zu continuing sequences (the limit is "
                                "%zu)",
                                s->n_new_seqs, s->n_cont_seqs, max_seqs);
    if (s->n_finished_seq_ids > MIRROR_MAX_DROPS_PER_SEQ * max_seqs ||
        s->n_preempted_seq_ids > MIRROR_MAX_DROPS_PER_SEQ * max_seqs - s->n_finished_seq_ids)
        return pagoda_error_set(PAGODA_ERANGE, "step drops %zu + %zu sequences (the limit is %zu)",
                                s->n_finished_seq_ids, s->n_preempted_seq_ids,
                                MIRROR_MAX_DROPS_PER_SEQ * max_seqs);

    /* Marks: which held sequences the step drops. */
    m->gen++;
    m->num_failed = 0;
    int32_t drops = 0;
    for (int list = 0; list < 2; list++) {
        const uint64_t *ids = list == 0 ? s->finished_seq_ids : s->preempted_seq_ids;
        size_t n = list == 0 ? s->n_finished_seq_ids : s->n_preempted_seq_ids;
        for (size_t i = 0; i < n; i++) {
            struct mseq *q = lookup(m, ids[i]);
            if (q != NULL && q->drop_mark != m->gen) {
                q->drop_mark = m->gen;
                drops++;
            }
        }
    }
    if ((int64_t)m->num_seqs - drops + (int64_t)s->n_new_seqs > m->lim.max_seqs)
        return pagoda_error_set(PAGODA_ERANGE,
                                "step: %d held - %d dropped + %zu new sequences exceeds %d",
                                m->num_seqs, drops, s->n_new_seqs, m->lim.max_seqs);

    int64_t tokens = 0;
    int rc = check_cont(m, s, &tokens);
    if (rc == 0)
        rc = stage_new(m, s, &tokens);
    if (rc == 0 && tokens > m->lim.max_batched_tokens)
        rc = pagoda_error_set(PAGODA_ERANGE, "step of %" PRId64 " tokens (the limit is %d)", tokens,
                              m->lim.max_batched_tokens);
    /* The widest block table of the batch, and room for the batch's tables. */
    int32_t width = 1, in_batch = 0;
    for (size_t i = 0; rc == 0 && i < s->n_cont_seqs; i++) {
        const Pagoda__Internal__ContinuingSequence *cs = s->cont_seqs[i];
        const struct mseq *q = lookup(m, cs->seq_id);
        if (q == NULL || q->fail_mark == m->gen)
            continue;
        int32_t nb = q->num_blocks + (int32_t)cs->n_appended_block_ids;
        in_batch += cs->num_new_tokens > 0;
        if (cs->num_new_tokens > 0 && nb > width)
            width = nb;
    }
    for (int32_t i = 0; rc == 0 && i < m->num_staged; i++) {
        in_batch += m->staged_chunk[i] > 0;
        if (m->staged_chunk[i] > 0 && m->staged[i]->num_blocks > width)
            width = m->staged[i]->num_blocks;
    }
    size_t need = (size_t)(in_batch > 0 ? in_batch : 1) * (size_t)width;
    if (rc == 0 && need > m->block_tables_cap) {
        int32_t *grown = realloc(m->block_tables, need * sizeof(int32_t));
        if (grown == NULL)
            rc = PAGODA_ENOMEM;
        else {
            m->block_tables = grown;
            m->block_tables_cap = need;
        }
    }
    if (rc != 0) {
        free_staged(m);
        m->num_failed = 0;
        return rc;
    }

    /* Everything is checked: build the batch. Appended block ids go past num_blocks. */
    int32_t n = 0, ns = 0, nl = 0;
    m->num_pend = 0;
    m->num_entries = 0;
    for (size_t i = 0; i < s->n_cont_seqs; i++) {
        const Pagoda__Internal__ContinuingSequence *cs = s->cont_seqs[i];
        struct mseq *q = lookup(m, cs->seq_id);
        if (q == NULL || q->fail_mark == m->gen)
            continue;
        if (cs->n_appended_block_ids > 0)
            memcpy(q->blocks + q->num_blocks, cs->appended_block_ids,
                   cs->n_appended_block_ids * sizeof(int32_t));
        add_chunk(m, q, cs->num_new_tokens, (int32_t)cs->n_appended_block_ids, &n, &ns, &nl, width);
    }
    for (int32_t i = 0; i < m->num_staged; i++)
        add_chunk(m, m->staged[i], m->staged_chunk[i], 0, &n, &ns, &nl, width);
    m->query_start[ns] = n;

    out->batch = (struct fwd_batch){
        .num_tokens = n,
        .token_ids = m->token_ids,
        .positions = m->positions,
        .slot_mapping = m->slots,
        .num_seqs = ns,
        .query_start = m->query_start,
        .context_lens = m->context_lens,
        .block_tables = m->block_tables,
        .max_blocks_per_seq = width,
        .num_logits = nl,
        .logits_indices = m->logits_indices,
        .logit_entries = m->num_entries > 0 ? m->entries : NULL,
        .num_logit_entries = m->num_entries,
    };
    out->rows = m->rows;
    out->seq_ids = m->row_seq_ids;
    out->failed = m->failed;
    out->num_failed = m->num_failed;
    m->prepared = 1;
    return 0;
}

void mirror_step_commit(struct mirror *m, const int32_t *tokens)
{
    mirror_step_commit_rows(m, tokens, NULL);
}

static void commit(struct mirror *m, const int32_t *tokens, const int32_t *row_errors, int pending)
{
    uint64_t step_id = m->next_step_id;
    struct inflight *fl = &m->inflight[step_id % MIRROR_MAX_STEPS_IN_FLIGHT];
    int32_t slot = (int32_t)(step_id % MIRROR_MAX_STEPS_IN_FLIGHT);
    for (int32_t i = 0; i < m->num_failed; i++)
        remember_failure(m, &m->failed[i], step_id);
    for (int32_t i = m->num_seqs - 1; i >= 0; i--)
        if (m->seqs[i]->drop_mark == m->gen) {
            mseq_free(m->seqs[i]);
            m->seqs[i] = m->seqs[--m->num_seqs];
        }
    for (int32_t i = 0; i < m->num_staged; i++)
        m->seqs[m->num_seqs++] = m->staged[i];
    m->num_staged = 0;
    for (int32_t i = 0; i < m->num_pend; i++) {
        struct pend *p = &m->pend[i];
        p->seq->num_blocks += p->n_append;
        p->seq->num_computed += p->chunk;
        if (p->row < 0)
            continue;
        if (pending) {
            fl->seq_ids[p->row] = p->seq->seq_id;
            fl->pos[p->row] = p->seq->num_tokens;
            p->seq->tokens[p->seq->num_tokens++] = MIRROR_PENDING_TOKEN(slot, p->row);
        } else if (row_errors != NULL && row_errors[p->row] != 0) {
            /* Remembered as a failed pending row is (mirror_step_resolve): a step the scheduler
             * sent before it knew fails the sequence alone instead of being refused. */
            struct mirror_seq_error e = {.seq_id = p->seq->seq_id, .code = row_errors[p->row]};
            snprintf(e.message, sizeof(e.message), "its token could not be sampled");
            remember_failure(m, &e, step_id);
            p->seq->fail_mark = m->gen;
        } else {
            p->seq->tokens[p->seq->num_tokens++] = tokens[p->row];
        }
    }
    if (pending) {
        fl->step_id = step_id;
        fl->num_rows = m->num_pend > 0 ? count_rows(m) : 0;
        if (m->num_inflight++ == 0)
            m->oldest_inflight = step_id;
    }
    /* Failed sequences end here: the scheduler ends their requests; a step it sent before it
     * knew finds them among the recent failures. */
    for (int32_t i = m->num_seqs - 1; i >= 0; i--)
        if (m->seqs[i]->fail_mark == m->gen) {
            mseq_free(m->seqs[i]);
            m->seqs[i] = m->seqs[--m->num_seqs];
        }
    m->num_pend = 0;
    m->num_failed = 0;
    m->next_step_id++;
    m->prepared = 0;
    index_rebuild(m);
}

void mirror_step_commit_rows(struct mirror *m, const int32_t *tokens, const int32_t *row_errors)
{
    if (m == NULL || !m->prepared)
        return;
    commit(m, tokens, row_errors, 0);
}

void mirror_step_commit_pending(struct mirror *m)
{
    if (m == NULL || !m->prepared)
        return;
    commit(m, NULL, NULL, 1);
}

void mirror_step_resolve(struct mirror *m, uint64_t step_id, const int32_t *tokens,
                         const struct backend_row_error *row_errors)
{
    if (m == NULL || m->num_inflight == 0 || step_id != m->oldest_inflight)
        return;
    int32_t slot = (int32_t)(step_id % MIRROR_MAX_STEPS_IN_FLIGHT);
    const struct inflight *fl = &m->inflight[slot];
    int dropped = 0;
    for (int32_t r = 0; r < fl->num_rows; r++) {
        struct mseq *q = lookup(m, fl->seq_ids[r]);
        /* Dropped since (finished, preempted, failed), or a sequence of the same id added anew. */
        if (q == NULL || fl->pos[r] >= q->num_tokens ||
            q->tokens[fl->pos[r]] != MIRROR_PENDING_TOKEN(slot, r))
            continue;
        if (row_errors == NULL || row_errors[r].code == 0) {
            q->tokens[fl->pos[r]] = tokens[r];
            continue;
        }
        struct mirror_seq_error e = {.seq_id = q->seq_id, .code = row_errors[r].code};
        snprintf(e.message, sizeof(e.message), "%s", row_errors[r].message);
        remember_failure(m, &e, step_id);
        q->drop_mark = ~(uint64_t)0; /* a mark no prepare uses */
        dropped = 1;
    }
    if (dropped) {
        for (int32_t i = m->num_seqs - 1; i >= 0; i--)
            if (m->seqs[i]->drop_mark == ~(uint64_t)0) {
                mseq_free(m->seqs[i]);
                m->seqs[i] = m->seqs[--m->num_seqs];
            }
        index_rebuild(m);
    }
    m->num_inflight--;
    m->oldest_inflight++;
}

void mirror_step_break(struct mirror *m, uint64_t step_id)
{
    if (m != NULL && m->broken_step == 0)
        m->broken_step = step_id ? step_id : 1;
}

int32_t mirror_steps_in_flight(const struct mirror *m)
{
    return m->num_inflight;
}

void mirror_step_abort(struct mirror *m)
{
    if (m == NULL || !m->prepared)
        return;
    free_staged(m);
    m->num_pend = 0;
    m->num_failed = 0;
    m->prepared = 0;
}

/* ---- queries ------------------------------------------------------------------------------- */

int32_t mirror_resync_failures(const struct mirror *m, const struct mirror_seq_error **out)
{
    *out = m->failed;
    return m->prepared ? 0 : m->num_failed;
}

int mirror_synced(const struct mirror *m)
{
    return m->synced;
}

uint64_t mirror_epoch(const struct mirror *m)
{
    return m->epoch;
}

uint64_t mirror_next_step_id(const struct mirror *m)
{
    return m->next_step_id;
}

int32_t mirror_num_seqs(const struct mirror *m)
{
    return m->num_seqs;
}

int mirror_find(const struct mirror *m, uint64_t seq_id, struct mirror_seq_view *out)
{
    const struct mseq *q = lookup(m, seq_id);
    if (q == NULL)
        return PAGODA_ENOENT;
    *out = (struct mirror_seq_view){
        .seq_id = q->seq_id,
        .token_ids = q->tokens,
        .num_tokens = q->num_tokens,
        .num_prompt_tokens = q->num_prompt,
        .num_computed_tokens = q->num_computed,
        .block_table = q->blocks,
        .num_blocks = q->num_blocks,
        .sampling = q->sampling,
    };
    return 0;
}
