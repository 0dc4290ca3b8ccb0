/* tp_group.h: a step travels as a fixed header (op and counts) and then, for a forward pass,
 * one payload with the batch's arrays back to back. Both sides size the payload from the
 * header, bounded by the limits they were opened with. */
#include "worker/tp_group.h"
#include "common/error.h"

#include <stdlib.h>
#include <string.h>

enum step_op { STEP_FORWARD = 1, STEP_STOP = 2 };

struct step_header {
    int32_t op;
    int32_t num_tokens;
    int32_t num_seqs;
    int32_t max_blocks_per_seq;
    int32_t num_logits;
    int32_t pad;
};

/* Bytes of the payload of a step of these counts. */
static size_t payload_bytes(const struct step_header *h)
{
    size_t t = (size_t)h->num_tokens, s = (size_t)h->num_seqs;
    return t * (4 + 4 + 8) + (s + 1) * 4 + s * 4 + s * (size_t)h->max_blocks_per_seq * 4 +
           (size_t)h->num_logits * 4;
}

static int header_within(const struct step_header *h, const struct backend_limits *l)
{
    return h->num_tokens >= 1 && h->num_tokens <= l->max_num_tokens && h->num_seqs >= 1 &&
           h->num_seqs <= l->max_num_seqs && h->max_blocks_per_seq >= 0 &&
           h->max_blocks_per_seq <= l->max_blocks_per_seq && h->num_logits >= 0 &&
           h->num_logits <= l->max_num_seqs;
}

static size_t max_payload(const struct backend_limits *l)
{
    struct step_header h = {.num_tokens = l->max_num_tokens,
                            .num_seqs = l->max_num_seqs,
                            .max_blocks_per_seq = l->max_blocks_per_seq,
                            .num_logits = l->max_num_seqs};
    return payload_bytes(&h);
}

/* The batch's arrays in one buffer, or the batch's pointers into one (unpack). */
static void *put(char **p, const void *src, size_t bytes)
{
    void *at = *p;
    memcpy(*p, src, bytes);
    *p += bytes;
    return at;
}

static const void *take(char **p, size_t bytes)
{
    const void *at = *p;
    *p += bytes;
    return at;
}

static void pack(const struct fwd_batch *b, char *buf)
{
    size_t t = (size_t)b->num_tokens, s = (size_t)b->num_seqs;
    put(&buf, b->token_ids, t * 4);
    put(&buf, b->positions, t * 4);
    put(&buf, b->slot_mapping, t * 8);
    put(&buf, b->query_start, (s + 1) * 4);
    put(&buf, b->context_lens, s * 4);
    put(&buf, b->block_tables, s * (size_t)b->max_blocks_per_seq * 4);
    put(&buf, b->logits_indices, (size_t)b->num_logits * 4);
}

static void unpack(const struct step_header *h, char *buf, struct fwd_batch *b)
{
    size_t t = (size_t)h->num_tokens, s = (size_t)h->num_seqs;
    b->num_tokens = h->num_tokens;
    b->num_seqs = h->num_seqs;
    b->max_blocks_per_seq = h->max_blocks_per_seq;
    b->num_logits = h->num_logits;
    b->token_ids = take(&buf, t * 4);
    b->positions = take(&buf, t * 4);
    b->slot_mapping = take(&buf, t * 8);
    b->query_start = take(&buf, (s + 1) * 4);
    b->context_lens = take(&buf, s * 4);
    b->block_tables = take(&buf, s * (size_t)h->max_blocks_per_seq * 4);
    b->logits_indices = take(&buf, (size_t)h->num_logits * 4);
    /* rank 0 alone samples: the logit bias entries stay there */
    b->logit_entries = NULL;
    b->num_logit_entries = 0;
}

/* Errors of the group itself (a rank did not arrive in time, aborted, or called another
 * collective), after which the group can run no other step. */
static int is_group_error(int rc)
{
    return rc == PAGODA_ETIMEDOUT || rc == PAGODA_ECLOSED || rc == PAGODA_EPROTO;
}

/* ---- rank 0 ---------------------------------------------------------------------------- */

struct leader {
    struct backend base;
    struct backend *inner;
    struct comm *steps;
    struct backend_limits limits;
    char *payload;                        /* max_payload(limits) bytes */
    void (*on_broken)(int rc, void *ctx); /* tp_leader_on_broken; may be NULL */
    void *on_broken_ctx;
};

static int leader_step(struct leader *l, const struct fwd_batch *batch, float *logits);

static int leader_forward(struct backend *base, const struct fwd_batch *batch, float *logits)
{
    struct leader *l = (struct leader *)base;
    int rc = leader_step(l, batch, logits);
    if (l->on_broken != NULL && is_group_error(rc))
        l->on_broken(rc, l->on_broken_ctx);
    return rc;
}

/* The step to the other ranks, then rank 0's shard. */
static int leader_step(struct leader *l, const struct fwd_batch *batch, float *logits)
{
    /* Refused here, a bad step never reaches the other ranks. */
    int rc = backend_check_batch(&l->base.config, &l->limits, batch);
    if (rc != 0)
        return rc;
    struct step_header h = {.op = STEP_FORWARD,
                            .num_tokens = batch->num_tokens,
                            .num_seqs = batch->num_seqs,
                            .max_blocks_per_seq = batch->max_blocks_per_seq,
                            .num_logits = batch->num_logits};
    if (!header_within(&h, &l->limits))
        return pagoda_error_set(PAGODA_ERANGE,
                                "step of %d sequences, %d blocks each, is above the limits",
                                h.num_seqs, h.max_blocks_per_seq);
    pack(batch, l->payload);
    if ((rc = comm_broadcast(l->steps, &h, sizeof(h), 0)) != 0 ||
        (rc = comm_broadcast(l->steps, l->payload, payload_bytes(&h), 0)) != 0)
        return rc;
    return backend_forward(l->inner, batch, logits);
}

static int leader_device_time_us(struct backend *base, double *us)
{
    return backend_device_time_us(((struct leader *)base)->inner, us);
}

static void leader_close(struct backend *base)
{
    struct leader *l = (struct leader *)base;
    struct step_header h = {.op = STEP_STOP};
    comm_broadcast(l->steps, &h, sizeof(h), 0); /* a follower already gone: bounded anyway */
    backend_close(l->inner);
    free(l->payload);
    free(l);
}

/* Rank 0's own device: a follower's loss breaks the group instead (group_broke). */
static int leader_health(struct backend *base)
{
    return backend_health(((struct leader *)base)->inner);
}

static const struct backend_ops leader_ops = {
    .name = "tp-leader",
    .forward = leader_forward,
    .close = leader_close,
    .device_time_us = leader_device_time_us,
    .health = leader_health,
};

int tp_leader_open(struct backend *inner, struct comm *steps, const struct backend_limits *limits,
                   struct backend **out)
{
    if (inner == NULL || steps == NULL || limits == NULL || comm_rank(steps) != 0 ||
        comm_size(steps) < 2) {
        backend_close(inner);
        return pagoda_error_set(PAGODA_EINVAL, "a tensor-parallel leader is rank 0 of 2 or more");
    }
    struct leader *l = calloc(1, sizeof(*l));
    char *payload = malloc(max_payload(limits));
    if (l == NULL || payload == NULL) {
        free(l);
        free(payload);
        backend_close(inner);
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    }
    l->base.ops = &leader_ops;
    l->base.config = *backend_config(inner);
    l->inner = inner;
    l->steps = steps;
    l->limits = *limits;
    l->payload = payload;
    *out = &l->base;
    return 0;
}

void tp_leader_on_broken(struct backend *leader, void (*fn)(int rc, void *ctx), void *ctx)
{
    struct leader *l = (struct leader *)leader;
    l->on_broken = fn;
    l->on_broken_ctx = ctx;
}

/* ---- the other ranks ------------------------------------------------------------------- */

int tp_follower_run(struct backend *inner, struct comm *steps, const struct backend_limits *limits,
                    int (*keep_waiting)(void *ctx), void *ctx, uint64_t *steps_run)
{
    if (steps_run != NULL)
        *steps_run = 0;
    const struct model_config *c = backend_config(inner);
    char *payload = malloc(max_payload(limits));
    float *logits = malloc((size_t)limits->max_num_seqs * (size_t)c->vocab_size * sizeof(float));
    int rc = 0;
    if (payload == NULL || logits == NULL) {
        rc = pagoda_error_set(PAGODA_ENOMEM, "out of memory");
        comm_abort(steps);
        goto done;
    }
    for (;;) {
        struct step_header h;
        if ((rc = comm_wait_broadcast(steps, &h, sizeof(h), 0, keep_waiting, ctx)) != 0)
            break;
        if (h.op == STEP_STOP)
            break;
        if (h.op != STEP_FORWARD || !header_within(&h, limits)) {
            rc = pagoda_error_set(PAGODA_EPROTO,
                                  "rank %d: step op %d of %d tokens, %d sequences is not one "
                                  "this rank can run",
                                  comm_rank(steps), h.op, h.num_tokens, h.num_seqs);
            comm_abort(steps);
            break;
        }
        if ((rc = comm_broadcast(steps, payload, payload_bytes(&h), 0)) != 0)
            break;
        struct fwd_batch b;
        unpack(&h, payload, &b);
        /* A step that fails here for a reason of its own (a slot outside the pool) fails at the
         * same point on rank 0, which checks the same batch the same way: the group goes on.
         * Only the group's own errors end the loop. */
        rc = backend_forward(inner, &b, logits);
        if (is_group_error(rc))
            break;
        rc = 0;
        if (steps_run != NULL)
            (*steps_run)++;
    }
done:
    free(payload);
    free(logits);
    return rc;
}
