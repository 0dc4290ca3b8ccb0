/* Tests of the scheduler (scheduler/scheduler.c, scheduler_step.c, scheduler_router.c,
 * scheduler_cache.c): the state machine driven by a fake worker.
 *
 * The fake worker keeps a mirror as docs/protocol.md says a worker must (resyncs replace it,
 * steps of other epochs are ignored, an unexpected step id is refused with an error result,
 * num_computed_tokens is checked) and owns a fake KV pool that outlives it: computing a
 * position writes the token id into the slot the block table names. The token it samples is a
 * hash of what the pool holds at the sequence's positions, read back through the block table,
 * so an output equals the reference (the same hash over the token list) only if every block
 * held the right data when it was read: a block freed or reused too early, a wrong block
 * table, or a resync that claims uncomputed positions shows up as a different token. It also
 * checks on every step that no block a live sequence still writes is shared and block 0 is
 * never used.
 *
 * Messages travel as bytes: the scheduler's output is packed, and what the scheduler receives
 * is unpacked with wire_unpack from an nng_msg, as in pagoda-scheduler. */
#include "scheduler_harness.h"

void queue_push(struct queue *q, const ProtobufCMessage *m)
{
    if (q->head + q->count == q->cap) {
        q->cap = q->cap ? q->cap * 2 : 16;
        q->items = realloc(q->items, q->cap * sizeof(*q->items));
        assert_non_null(q->items);
    }
    struct bytes b = {0};
    b.len = protobuf_c_message_get_packed_size(m);
    b.data = malloc(b.len ? b.len : 1);
    assert_non_null(b.data);
    protobuf_c_message_pack(m, b.data);
    q->items[q->head + q->count++] = b;
}

bool queue_pop(struct queue *q, struct bytes *out)
{
    if (q->count == 0)
        return false;
    *out = q->items[q->head++];
    q->count--;
    if (q->count == 0)
        q->head = 0;
    return true;
}

void queue_clear(struct queue *q)
{
    struct bytes b = {0};
    while (queue_pop(q, &b))
        free(b.data);
}

void queue_fini(struct queue *q)
{
    queue_clear(q);
    free(q->items);
    memset(q, 0, sizeof(*q));
}

/* ---- the reference model -------------------------------------------------------------------- */
uint32_t fnv_step(uint32_t h, int32_t v)
{
    uint32_t x = (uint32_t)v;
    for (int i = 0; i < 4; i++) {
        h ^= (x >> (8 * i)) & 0xffu;
        h *= 16777619u;
    }
    return h;
}

/* The next token after tokens[0..n). */
int32_t ref_next(const int32_t *tokens, int n)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++)
        h = fnv_step(h, tokens[i]);
    h = fnv_step(h, n);
    return (int32_t)(h % VOCAB);
}

/* The first count outputs after prompt. */
void ref_generate(const int32_t *prompt, int n_prompt, int count, int32_t *out)
{
    int32_t all[MAX_FTOK];
    memcpy(all, prompt, (size_t)n_prompt * sizeof(int32_t));
    for (int i = 0; i < count; i++) {
        out[i] = ref_next(all, n_prompt + i);
        all[n_prompt + i] = out[i];
    }
}

void make_prompt(int seed, int n, int32_t *out)
{
    for (int i = 0; i < n; i++)
        out[i] = (seed * 131 + i * 17 + 3) % VOCAB;
}

struct fseq *fw_find(struct fake_worker *fw, uint64_t seq_id)
{
    for (int i = 0; i < MAX_FSEQ; i++)
        if (fw->seqs[i].live && fw->seqs[i].seq_id == seq_id)
            return &fw->seqs[i];
    return NULL;
}

struct fseq *fw_add(struct fake_worker *fw, uint64_t seq_id)
{
    if (fw_find(fw, seq_id) != NULL)
        fail_msg("worker: seq %llu added twice", (unsigned long long)seq_id);
    for (int i = 0; i < MAX_FSEQ; i++) {
        if (!fw->seqs[i].live) {
            memset(&fw->seqs[i], 0, sizeof(fw->seqs[i]));
            fw->seqs[i].live = true;
            fw->seqs[i].seq_id = seq_id;
            return &fw->seqs[i];
        }
    }
    fail_msg("worker: mirror full");
    return NULL;
}

int32_t *fw_slot(struct fake_worker *fw, const struct fseq *f, int pos)
{
    int bi = pos / fw->block_size;
    assert_true(bi < f->n_blocks);
    int32_t b = f->blocks[bi];
    assert_true(b >= 1 && b < fw->num_blocks);
    return &fw->pool[(size_t)b * (size_t)fw->block_size + (size_t)(pos % fw->block_size)];
}

/* No block 0, no block outside the pool, and no block that a live sequence will still write
 * (at or after its computed tokens) held by another live sequence: only full, computed blocks
 * are shared (prefix-cache hits). */
void fw_check_ownership(struct fake_worker *fw)
{
    uint8_t *holders = calloc((size_t)fw->num_blocks, 1);
    uint8_t *writable = calloc((size_t)fw->num_blocks, 1);
    assert_true(holders && writable);
    for (int i = 0; i < MAX_FSEQ; i++) {
        struct fseq *f = &fw->seqs[i];
        if (!f->live)
            continue;
        for (int j = 0; j < f->n_blocks; j++) {
            int32_t b = f->blocks[j];
            if (b < 1 || b >= fw->num_blocks)
                fail_msg("worker: seq %llu has block %d", (unsigned long long)f->seq_id, b);
            holders[b]++;
            if (j >= f->computed / fw->block_size)
                writable[b] = 1;
            if (holders[b] > 1 && writable[b])
                fail_msg("worker: block %d shared while a sequence still writes it", b);
        }
    }
    free(holders);
    free(writable);
}

void fw_set_blocks(struct fseq *f, const int32_t *ids, size_t n)
{
    assert_true(n >= 1 && n <= MAX_FBLK);
    memcpy(f->blocks, ids, n * sizeof(int32_t));
    f->n_blocks = (int)n;
}

void fw_set_tokens(struct fseq *f, const int32_t *ids, size_t n, int n_prompt)
{
    assert_true(n >= 1 && n < MAX_FTOK);
    memcpy(f->tokens, ids, n * sizeof(int32_t));
    f->n_tokens = (int)n;
    f->n_prompt = n_prompt;
}

/* The token after f's tokens, computed from what the pool holds. */
int32_t fw_sample(struct fake_worker *fw, const struct fseq *f)
{
    uint32_t h = 2166136261u;
    for (int p = 0; p < f->n_tokens; p++)
        h = fnv_step(h, *fw_slot(fw, f, p));
    h = fnv_step(h, f->n_tokens);
    return (int32_t)(h % VOCAB);
}

double fw_step_wall_us = FW_STEP_WALL_US, fw_step_device_us = FW_STEP_DEVICE_US;

void reply_result(struct queue *out, uint64_t epoch, uint64_t step_id, int err,
                  Pagoda__Internal__SeqResult **results, size_t n, uint64_t computed)
{
    Pagoda__Internal__StepResult r = PAGODA__INTERNAL__STEP_RESULT__INIT;
    r.has_epoch = r.has_step_id = r.has_computed_tokens = 1;
    r.epoch = epoch;
    r.step_id = step_id;
    r.computed_tokens = computed;
    r.n_results = n;
    r.results = results;
    if (err != 0) {
        r.has_error_code = 1;
        r.error_code = err;
        r.error_message = "refused";
    } else { /* a step that ran: its times, as a worker's step loop reports them */
        r.has_step_wall_us = r.has_step_device_us = 1;
        r.step_wall_us = fw_step_wall_us;
        r.step_device_us = fw_step_device_us;
    }
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESULT;
    m.result = &r;
    queue_push(out, &m.base);
}

void fw_hello(struct fake_worker *fw, const struct hello_opts *ho, struct queue *out)
{
    Pagoda__Internal__PoolGeometry g = PAGODA__INTERNAL__POOL_GEOMETRY__INIT;
    g.has_pool_id = g.has_num_blocks = g.has_block_size = 1;
    g.pool_id = fw->pool_id;
    g.num_blocks = fw->num_blocks;
    g.block_size = fw->block_size;
    if (fw->dtype >= 0) {
        g.has_dtype = 1;
        g.dtype = (Pagoda__Internal__DType)fw->dtype;
    }
    Pagoda__Internal__Hello h = PAGODA__INTERNAL__HELLO__INIT;
    h.has_worker_id = h.has_pid = h.has_vocab_size = h.has_max_position_embeddings = 1;
    h.worker_id = 0;
    h.pid = fw->pid;
    h.vocab_size = VOCAB;
    h.max_position_embeddings = ho->max_positions;
    h.n_eos_token_ids = ho->n_eos;
    h.eos_token_ids = (int32_t *)ho->eos;
    h.geometry = &g;
    h.backend = "fake";
    if (ho->fingerprint != NULL) {
        h.has_model_fingerprint = 1;
        h.model_fingerprint.data = (uint8_t *)ho->fingerprint;
        h.model_fingerprint.len = strlen(ho->fingerprint);
    }
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_HELLO;
    m.hello = &h;
    queue_push(out, &m.base);
    fw->hellos_sent++;
    fw->introduced = true;
}

void fw_resync(struct fake_worker *fw, const Pagoda__Internal__Resync *r,
               const struct hello_opts *ho, struct queue *out)
{
    /* A worker introduces itself when it starts, and again when a resync of another epoch
     * than the previous one shows that a new scheduler took over. */
    if (!fw->introduced || (fw->has_epoch && fw->epoch != r->epoch))
        fw_hello(fw, ho, out);
    Pagoda__Internal__ResyncDone d = PAGODA__INTERNAL__RESYNC_DONE__INIT;
    d.has_epoch = d.has_resync_id = d.has_pool_id = 1;
    d.epoch = r->epoch;
    d.resync_id = r->resync_id;
    d.pool_id = fw->pool_id;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESYNC_DONE;
    m.resync_done = &d;
    if (r->has_pool_id && r->pool_id != fw->pool_id) {
        /* As pagoda-worker: refused, and a Hello says which pool this is. */
        fw->resyncs_refused++;
        fw_hello(fw, ho, out);
        d.has_error_code = 1;
        d.error_code = PAGODA_EMISMATCH;
        queue_push(out, &m.base);
        return;
    }
    fw->has_epoch = true;
    fw->epoch = r->epoch;
    fw->expected_step = r->next_step_id;
    for (int i = 0; i < MAX_FSEQ; i++)
        fw->seqs[i].live = false;
    Pagoda__Internal__SeqResult failed[MAX_FSEQ];
    Pagoda__Internal__SeqResult *failed_ptrs[MAX_FSEQ];
    size_t n_failed = 0;
    for (size_t i = 0; i < r->n_seqs; i++) {
        const Pagoda__Internal__SequenceSnapshot *sn = r->seqs[i];
        bool bad = false;
        for (size_t t = 0; fw->resync_fail && t < sn->n_token_ids; t++)
            bad |= sn->token_ids[t] == fw->resync_fail_token;
        if (bad && n_failed < MAX_FSEQ) {
            pagoda__internal__seq_result__init(&failed[n_failed]);
            failed[n_failed].has_seq_id = failed[n_failed].has_error_code = 1;
            failed[n_failed].seq_id = sn->seq_id;
            failed[n_failed].error_code = PAGODA_ERANGE;
            failed[n_failed].error_message = "token id outside the vocabulary";
            failed_ptrs[n_failed] = &failed[n_failed];
            n_failed++;
            continue;
        }
        struct fseq *f = fw_add(fw, sn->seq_id);
        fw_set_tokens(f, sn->token_ids, sn->n_token_ids, sn->num_prompt_tokens);
        fw_set_blocks(f, sn->block_ids, sn->n_block_ids);
        f->computed = sn->num_computed_tokens;
        assert_true(f->computed < f->n_tokens);
        assert_non_null(sn->sampling);
        /* What the snapshot calls computed must be in the pool. */
        for (int p = 0; p < f->computed; p++)
            if (*fw_slot(fw, f, p) != f->tokens[p])
                fail_msg("resync: seq %llu position %d claimed computed but not in the pool",
                         (unsigned long long)f->seq_id, p);
    }
    fw_check_ownership(fw);
    fw->resyncs_done++;
    d.n_failed = n_failed;
    d.failed = failed_ptrs;
    queue_push(out, &m.base);
}

/* Whether f's tokens hold token. */
bool fw_holds(const struct fseq *f, int32_t token)
{
    for (int i = 0; i < f->n_tokens; i++)
        if (f->tokens[i] == token)
            return true;
    return false;
}

/* Whether a sequence of step st (new, or continuing and held) holds token. */
bool fw_step_holds(struct fake_worker *fw, const Pagoda__Internal__Step *st, int32_t token)
{
    for (size_t i = 0; i < st->n_new_seqs; i++)
        for (size_t t = 0; t < st->new_seqs[i]->n_token_ids; t++)
            if (st->new_seqs[i]->token_ids[t] == token)
                return true;
    for (size_t i = 0; i < st->n_cont_seqs; i++) {
        const struct fseq *f = fw_find(fw, st->cont_seqs[i]->seq_id);
        if (f != NULL && fw_holds(f, token))
            return true;
    }
    return false;
}

/* Runs one sequence's part of a step; returns true when it sampled (token in *token). */
bool fw_compute(struct fake_worker *fw, struct fseq *f, int num_new, int32_t *token)
{
    assert_true(num_new >= 1);
    if (f->computed + num_new > f->n_tokens)
        fail_msg("worker: seq %llu computes %d+%d of %d tokens", (unsigned long long)f->seq_id,
                 f->computed, num_new, f->n_tokens);
    if ((f->computed + num_new + fw->block_size - 1) / fw->block_size > f->n_blocks)
        fail_msg("worker: seq %llu has %d blocks for %d tokens", (unsigned long long)f->seq_id,
                 f->n_blocks, f->computed + num_new);
    for (int p = f->computed; p < f->computed + num_new; p++)
        *fw_slot(fw, f, p) = f->tokens[p];
    f->computed += num_new;
    fw->computed_tokens += (uint64_t)num_new;
    if (f->computed < f->n_tokens)
        return false;
    *token = fw_sample(fw, f);
    assert_true(f->n_tokens + 1 < MAX_FTOK);
    f->tokens[f->n_tokens++] = *token;
    return true;
}

/* Whether the worker failed seq_id (poison) among its last FW_FAILED_CAP failures. */
static bool fw_failed_before(const struct fake_worker *fw, uint64_t seq_id)
{
    int n = fw->n_failed_ids < FW_FAILED_CAP ? fw->n_failed_ids : FW_FAILED_CAP;
    for (int i = 0; i < n; i++)
        if (fw->failed_ids[i] == seq_id)
            return true;
    return false;
}

void fw_step(struct fake_worker *fw, const Pagoda__Internal__Step *st, struct queue *out)
{
    if (!fw->has_epoch || st->epoch != fw->epoch) {
        fw->ignored_steps++;
        return;
    }
    if (st->step_id != fw->expected_step) {
        fw->refused++;
        reply_result(out, st->epoch, st->step_id, PAGODA_EPROTO, NULL, 0, fw->computed_tokens);
        return;
    }
    if (fw->refuse && fw_step_holds(fw, st, fw->refuse_token)) {
        fw->refused++;
        reply_result(out, st->epoch, st->step_id, PAGODA_ERANGE, NULL, 0, fw->computed_tokens);
        return;
    }
    /* A sequence it failed and dropped may still be continued by a step the scheduler sent
     * before it saw the failure (two steps in flight): as pagoda-worker, that sequence fails
     * alone (a SeqResult error naming the first failure) and the step runs for the others. A
     * continuing sequence it never held, or did not fail, refuses the step (PAGODA_ENOENT) and
     * the mirror is unchanged; the scheduler resyncs. */
    size_t n = st->n_new_seqs + st->n_cont_seqs;
    Pagoda__Internal__SeqResult *res = calloc(n + 1, sizeof(*res));
    Pagoda__Internal__SeqResult **ptrs = calloc(n + 1, sizeof(*ptrs));
    assert_true(res && ptrs);
    size_t nres = 0;
    bool *skip = calloc(st->n_cont_seqs + 1, sizeof(*skip));
    assert_non_null(skip);
    for (size_t i = 0; (fw->poison || fw->resync_fail) && i < st->n_cont_seqs; i++) {
        uint64_t id = st->cont_seqs[i]->seq_id;
        if (fw_find(fw, id) != NULL)
            continue;
        if (!fw_failed_before(fw, id)) {
            fw->refused++;
            fw->refused_unknown++;
            reply_result(out, st->epoch, st->step_id, PAGODA_ENOENT, NULL, 0, fw->computed_tokens);
            free(res);
            free(ptrs);
            free(skip);
            return;
        }
        skip[i] = true;
        fw->failed_behind++;
        pagoda__internal__seq_result__init(&res[nres]);
        res[nres].has_seq_id = res[nres].has_error_code = 1;
        res[nres].seq_id = id;
        res[nres].error_code = PAGODA_EINVAL;
        res[nres].error_message = "failed in an earlier step: sampler: logit 3 is nan";
        ptrs[nres] = &res[nres];
        nres++;
    }
    for (size_t i = 0; i < st->n_finished_seq_ids; i++) {
        struct fseq *f = fw_find(fw, st->finished_seq_ids[i]);
        if (f == NULL && (fw->poison || fw->resync_fail))
            continue; /* one the worker failed and dropped */
        if (f == NULL)
            fail_msg("worker: finished seq %llu unknown",
                     (unsigned long long)st->finished_seq_ids[i]);
        f->live = false;
        fw->finished_seen++;
    }
    for (size_t i = 0; i < st->n_preempted_seq_ids; i++) {
        struct fseq *f = fw_find(fw, st->preempted_seq_ids[i]);
        if (f == NULL)
            fail_msg("worker: preempted seq %llu unknown",
                     (unsigned long long)st->preempted_seq_ids[i]);
        f->live = false;
        fw->preempted_seen++;
        /* The most recently admitted goes first: seq ids grow with each admission. */
        for (int j = 0; j < MAX_FSEQ && !fw->any_preemption; j++)
            if (fw->seqs[j].live && fw->seqs[j].seq_id > f->seq_id)
                fail_msg("worker: seq %llu preempted before the newer %llu",
                         (unsigned long long)f->seq_id, (unsigned long long)fw->seqs[j].seq_id);
    }
    /* Check every continuing sequence before touching anything. */
    for (size_t i = 0; i < st->n_cont_seqs; i++) {
        if (skip[i])
            continue;
        struct fseq *f = fw_find(fw, st->cont_seqs[i]->seq_id);
        if (f == NULL)
            fail_msg("worker: continuing seq %llu unknown",
                     (unsigned long long)st->cont_seqs[i]->seq_id);
        if (f->computed != st->cont_seqs[i]->num_computed_tokens)
            fail_msg("worker: seq %llu computed %d, step says %d", (unsigned long long)f->seq_id,
                     f->computed, st->cont_seqs[i]->num_computed_tokens);
    }
    int tokens = 0;
    struct fseq *touched[MAX_FSEQ];
    int nums[MAX_FSEQ];
    size_t nt = 0;
    for (size_t i = 0; i < st->n_new_seqs; i++) {
        const Pagoda__Internal__NewSequence *ns = st->new_seqs[i];
        struct fseq *f = fw_add(fw, ns->seq_id);
        fw_set_tokens(f, ns->token_ids, ns->n_token_ids, ns->num_prompt_tokens);
        fw_set_blocks(f, ns->block_ids, ns->n_block_ids);
        f->computed = ns->num_computed_tokens;
        assert_non_null(ns->sampling);
        /* A prefix-cache hit: what the step calls computed must be in the pool already. */
        for (int p = 0; p < f->computed; p++)
            if (*fw_slot(fw, f, p) != f->tokens[p])
                fail_msg("step: new seq %llu position %d claimed computed but not in the pool",
                         (unsigned long long)f->seq_id, p);
        touched[nt] = f;
        nums[nt++] = ns->num_new_tokens;
    }
    for (size_t i = 0; i < st->n_cont_seqs; i++) {
        if (skip[i])
            continue;
        const Pagoda__Internal__ContinuingSequence *cs = st->cont_seqs[i];
        struct fseq *f = fw_find(fw, cs->seq_id);
        assert_true(f->n_blocks + (int)cs->n_appended_block_ids <= MAX_FBLK);
        if (cs->n_appended_block_ids > 0)
            memcpy(f->blocks + f->n_blocks, cs->appended_block_ids,
                   cs->n_appended_block_ids * sizeof(int32_t));
        f->n_blocks += (int)cs->n_appended_block_ids;
        touched[nt] = f;
        nums[nt++] = cs->num_new_tokens;
    }
    fw_check_ownership(fw);
    for (size_t i = 0; i < nt; i++) {
        int32_t token;
        tokens += nums[i];
        bool sampled = fw_compute(fw, touched[i], nums[i], &token);
        if (sampled && fw->poison && fw_holds(touched[i], fw->poison_token)) {
            pagoda__internal__seq_result__init(&res[nres]);
            res[nres].has_seq_id = res[nres].has_error_code = 1;
            res[nres].seq_id = touched[i]->seq_id;
            res[nres].error_code = PAGODA_EINVAL;
            res[nres].error_message = "sampler: logit 3 is nan";
            ptrs[nres] = &res[nres];
            nres++;
            touched[i]->live = false;
            fw->failed_ids[fw->n_failed_ids++ % FW_FAILED_CAP] = touched[i]->seq_id;
        } else if (sampled) {
            pagoda__internal__seq_result__init(&res[nres]);
            res[nres].has_seq_id = res[nres].has_token_id = res[nres].has_logprob = 1;
            res[nres].seq_id = touched[i]->seq_id;
            res[nres].token_id = token;
            res[nres].logprob = -0.5f - 0.125f * (float)(token & 7); /* a token's own */
            ptrs[nres] = &res[nres];
            nres++;
        }
    }
    if (tokens > fw->max_step_tokens)
        fw->max_step_tokens = tokens;
    fw->steps_run++;
    fw->expected_step++;
    if (fw->strip_results) {
        fw->strip_results = false;
        nres = 0;
    }
    reply_result(out, st->epoch, st->step_id, 0, ptrs, nres, fw->computed_tokens);
    free(res);
    free(ptrs);
    free(skip);
}

/* The process dies and a new one starts: the mirror is gone, the pool is not. */
void fw_restart(struct fake_worker *fw, int32_t pid)
{
    memset(fw->seqs, 0, sizeof(fw->seqs));
    fw->has_epoch = false;
    fw->introduced = false;
    fw->silent = false;
    fw->pid = pid;
}

void fw_new_pool(struct fake_worker *fw, uint64_t pool_id)
{
    for (size_t i = 0; i < (size_t)fw->num_blocks * (size_t)fw->block_size; i++)
        fw->pool[i] = -1;
    fw->pool_id = pool_id;
}

static uint32_t rec_slot(const uint8_t *id)
{
    uint32_t k;
    memcpy(&k, id, sizeof(k));
    return (k * 2654435761u) & (REC_INDEX - 1);
}

struct req_rec *rec_find(struct harness *h, const uint8_t *id)
{
    for (uint32_t i = rec_slot(id); h->rec_index[i] != 0; i = (i + 1) & (REC_INDEX - 1)) {
        struct req_rec *r = &h->reqs[h->rec_index[i] - 1];
        if (memcmp(r->id, id, SCHEDULER_REQUEST_ID_BYTES) == 0)
            return r;
    }
    return NULL;
}

/* Indexes reqs[n] by its id unless an earlier record has the same id. */
void rec_index_add(struct harness *h, int n)
{
    uint32_t i = rec_slot(h->reqs[n].id);
    for (; h->rec_index[i] != 0; i = (i + 1) & (REC_INDEX - 1))
        if (memcmp(h->reqs[h->rec_index[i] - 1].id, h->reqs[n].id, SCHEDULER_REQUEST_ID_BYTES) == 0)
            return;
    h->rec_index[i] = n + 1;
}

void io_to_worker(void *ctx, uint32_t worker_id, const Pagoda__Internal__ToWorker *m)
{
    struct harness *h = ctx;
    assert_int_equal(worker_id, 0);
    assert_true(m->has_protocol_version);
    queue_push(&h->to_worker, &m->base);
}

/* One token event as the router applies it (router/router_link.c apply_event), for
 * router_lenient: tokens beyond those held appended, the others checked equal. */
static void lenient_event(struct harness *h, struct req_rec *r,
                          const Pagoda__Internal__TokenEvent *ev)
{
    if (ev->offset > (uint32_t)r->n_out) {
        h->router_gaps++;
        return;
    }
    for (size_t t = 0; t < ev->n_token_ids; t++) {
        size_t at = ev->offset + t;
        float lp = t < ev->n_logprobs ? ev->logprobs[t] : 0.0f;
        if (at < (size_t)r->n_out) {
            assert_int_equal(r->out[at], ev->token_ids[t]);
            assert_true(r->lp[at] == lp);
        } else {
            assert_true(r->n_out < MAX_OUT);
            r->out[r->n_out] = ev->token_ids[t];
            r->lp[r->n_out++] = lp;
        }
    }
    if (ev->has_finish_reason &&
        ev->finish_reason != PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE) {
        if (r->ends > 0) {
            assert_int_equal(r->finish, ev->finish_reason);
            return;
        }
        r->finish = ev->finish_reason;
        r->error_code = ev->error_code;
        r->ends++;
    }
}

int io_to_router(void *ctx, const Pagoda__Internal__ToRouter *msg)
{
    struct harness *h = ctx;
    if (h->drop_router) {
        h->router_dropped++;
        return -1;
    }
    size_t len = protobuf_c_message_get_packed_size(&msg->base);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(&msg->base, buf);
    Pagoda__Internal__ToRouter *m = pagoda__internal__to_router__unpack(NULL, len, buf);
    free(buf);
    assert_non_null(m);
    assert_int_equal(m->epoch, h->cfg.epoch);
    if (m->msg_case == PAGODA__INTERNAL__TO_ROUTER__MSG_STATS) {
        h->stats_replies++;
        h->stats_cookie = m->stats->cookie;
        h->stats_running = m->stats->running;
        h->stats_steps = m->stats->steps;
        h->stats_cpu_us = m->stats->step_cpu_us;
        h->stats_peak_in_flight = m->stats->peak_steps_in_flight;
        h->stats_discarded = m->stats->discarded_tokens;
        h->stats_prefix_waits = m->stats->has_prefix_waits ? m->stats->prefix_waits : UINT64_MAX;
        h->stats_router_drops = m->stats->has_router_drops ? m->stats->router_drops : UINT64_MAX;
        h->stats_router_resends =
            m->stats->has_router_resends ? m->stats->router_resends : UINT64_MAX;
    } else if (m->msg_case == PAGODA__INTERNAL__TO_ROUTER__MSG_POLICY_APPLIED) {
        h->applied_count++;
        if (h->applied)
            protobuf_c_message_free_unpacked(&h->applied->base, NULL);
        h->applied = m->policy_applied;
        m->policy_applied = NULL;
        m->msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG__NOT_SET;
    } else if (m->msg_case == PAGODA__INTERNAL__TO_ROUTER__MSG_ADMIN) {
        h->admin_count++;
        if (h->admin)
            protobuf_c_message_free_unpacked(&h->admin->base, NULL);
        h->admin = m->admin;
        m->admin = NULL;
        m->msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG__NOT_SET;
    } else if (m->msg_case == PAGODA__INTERNAL__TO_ROUTER__MSG_MODEL) {
        h->model_infos++;
        h->model_positions = m->model->max_position_embeddings;
    } else {
        assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS);
        if (m->events->has_announce_done && m->events->announce_done)
            h->ann_done++;
        for (size_t i = 0; i < m->events->n_events; i++) {
            const Pagoda__Internal__TokenEvent *ev = m->events->events[i];
            if (ev->has_announce && ev->announce) {
                assert_true(h->n_ann < MAX_REQS);
                struct ann_rec *a = &h->ann[h->n_ann++];
                assert_int_equal(ev->request_id.len, SCHEDULER_REQUEST_ID_BYTES);
                memcpy(a->id, ev->request_id.data, SCHEDULER_REQUEST_ID_BYTES);
                a->has_client_id = ev->has_client_request_id &&
                                   ev->client_request_id.len == SCHEDULER_REQUEST_ID_BYTES;
                if (a->has_client_id)
                    memcpy(a->client_id, ev->client_request_id.data, SCHEDULER_REQUEST_ID_BYTES);
                assert_int_equal(ev->offset, 0);
                assert_true(ev->n_token_ids <= MAX_OUT);
                a->n_out = (int)ev->n_token_ids;
                assert_int_equal(ev->n_logprobs, ev->n_token_ids);
                for (size_t t = 0; t < ev->n_token_ids; t++) {
                    a->out[t] = ev->token_ids[t];
                    a->lp[t] = ev->logprobs[t];
                }
                a->finish = ev->has_finish_reason ? (int)ev->finish_reason : 0;
                a->max_tokens = ev->max_tokens;
                a->ignore_eos = ev->ignore_eos;
                a->logprobs_asked = ev->has_logprobs_asked && ev->logprobs_asked;
                snprintf(a->router_text, sizeof(a->router_text), "%.*s",
                         ev->has_router_text ? (int)ev->router_text.len : 0,
                         ev->has_router_text ? (const char *)ev->router_text.data : "");
                a->tenant_ok = ev->tenant != NULL && strcmp(ev->tenant, "t") == 0;
                a->prompt_tokens = ev->prompt_tokens;
                continue;
            }
            if (ev->request_id.len != SCHEDULER_REQUEST_ID_BYTES) {
                assert_int_not_equal(ev->error_code, 0);
                assert_int_equal(ev->finish_reason, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
                h->bad_id_errors++;
                continue;
            }
            struct req_rec *r = rec_find(h, ev->request_id.data);
            assert_non_null(r);
            if (h->router_lenient) {
                lenient_event(h, r, ev);
                continue;
            }
            assert_int_equal(r->ends, 0); /* nothing after the end */
            assert_int_equal(ev->offset, (uint32_t)r->n_out);
            assert_int_equal(ev->n_logprobs, ev->n_token_ids);
            for (size_t t = 0; t < ev->n_token_ids; t++) {
                assert_true(r->n_out < MAX_OUT);
                r->lp[r->n_out] = ev->logprobs[t];
                r->out[r->n_out++] = ev->token_ids[t];
            }
            if (ev->has_cached_tokens)
                r->cached_tokens = (int)ev->cached_tokens;
            if (ev->has_finish_reason &&
                ev->finish_reason != PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE) {
                r->finish = ev->finish_reason;
                r->error_code = ev->error_code;
                r->ends++;
            }
        }
    }
    protobuf_c_message_free_unpacked(&m->base, NULL);
    return 0;
}

void io_to_supervisor(void *ctx, const Pagoda__Internal__Control *m)
{
    struct harness *h = ctx;
    if (m->has_ready && m->ready) {
        assert_string_equal(m->sender, "scheduler");
        h->ready_reports++;
    }
    if (m->has_hung_worker_id) {
        assert_int_equal(m->hung_worker_id, 0);
        h->hung_reports++;
        h->hung_pid = m->hung_worker_pid;
    }
}

Pagoda__Internal__ToScheduler *unpack_nng(const uint8_t *data, size_t len)
{
    nng_msg *m;
    assert_int_equal(nng_msg_alloc(&m, len), 0);
    if (len)
        memcpy(nng_msg_body(m), data, len);
    Pagoda__Internal__ToScheduler *msg = (Pagoda__Internal__ToScheduler *)wire_unpack(
        &pagoda__internal__to_scheduler__descriptor, m);
    nng_msg_free(m);
    return msg;
}

void deliver_worker_bytes(struct harness *h, const uint8_t *data, size_t len)
{
    Pagoda__Internal__ToScheduler *msg = unpack_nng(data, len);
    scheduler_on_worker(h->s, 0, msg, h->now);
    if (msg)
        protobuf_c_message_free_unpacked(&msg->base, NULL);
}

void deliver_router_bytes(struct harness *h, const uint8_t *data, size_t len)
{
    Pagoda__Internal__ToScheduler *msg = unpack_nng(data, len);
    scheduler_on_router(h->s, msg, h->now);
    if (msg)
        protobuf_c_message_free_unpacked(&msg->base, NULL);
}

void deliver_router(struct harness *h, const Pagoda__Internal__ToScheduler *m)
{
    size_t len = protobuf_c_message_get_packed_size(&m->base);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(&m->base, buf);
    deliver_router_bytes(h, buf, len);
    free(buf);
}

/* The fake worker handles one message from the scheduler; its answers wait in from_worker. */
bool worker_handle_one(struct harness *h)
{
    struct bytes b = {0};
    if (!queue_pop(&h->to_worker, &b))
        return false;
    Pagoda__Internal__ToWorker *m = pagoda__internal__to_worker__unpack(NULL, b.len, b.data);
    free(b.data);
    assert_non_null(m);
    struct fake_worker *fw = &h->fw;
    if (!fw->silent) {
        if (m->msg_case == PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC) {
            fw_resync(fw, m->resync, &h->hello, &h->from_worker);
        } else if (m->msg_case == PAGODA__INTERNAL__TO_WORKER__MSG_STEP) {
            if (fw->drop_steps > 0)
                fw->drop_steps--;
            else
                fw_step(fw, m->step, &h->from_worker);
        }
    }
    protobuf_c_message_free_unpacked(&m->base, NULL);
    return true;
}

/* Delivers the fake worker's answers to the scheduler. */
void deliver_answers(struct harness *h)
{
    struct bytes b = {0};
    while (queue_pop(&h->from_worker, &b)) {
        deliver_worker_bytes(h, b.data, b.len);
        free(b.data);
    }
}

/* Runs the exchange until nobody has anything to say. */
void pump(struct harness *h)
{
    for (int i = 0; i < MAX_PUMP; i++) {
        bool any = false;
        while (worker_handle_one(h))
            any = true;
        if (h->from_worker.count > 0) {
            any = true;
            deliver_answers(h);
        }
        if (!any)
            return;
    }
    fail_msg("pump: no quiescence");
}

/* One exchange: the worker handles what is queued, the scheduler gets its answers. */
void exchange(struct harness *h)
{
    while (worker_handle_one(h))
        ;
    deliver_answers(h);
}

/* The next message to the worker, unpacked (caller frees), or NULL. */
Pagoda__Internal__ToWorker *peek_worker(struct harness *h)
{
    if (h->to_worker.count == 0)
        return NULL;
    struct bytes *b = &h->to_worker.items[h->to_worker.head];
    return pagoda__internal__to_worker__unpack(NULL, b->len, b->data);
}

void tick(struct harness *h, int64_t now)
{
    h->now = now;
    scheduler_tick(h->s, now);
}

struct harness *harness_open(const struct setup *su)
{
    struct harness *h = calloc(1, sizeof(*h));
    assert_non_null(h);
    scheduler_config_default(&h->cfg);
    h->cfg.epoch = EPOCH;
    h->cfg.max_batched_tokens = su->max_batched_tokens ? su->max_batched_tokens : 2048;
    h->cfg.max_seqs = su->max_seqs ? su->max_seqs : 16;
    h->cfg.max_queued = su->max_queued ? su->max_queued : 64;
    h->cfg.fault_dup_step = su->fault_dup_step;
    h->cfg.prefix_cache = su->cache;
    if (su->max_steps_in_flight != 0)
        h->cfg.max_steps_in_flight = su->max_steps_in_flight;
    if (su->step_timeout_per_token_us != 0)
        h->cfg.step_timeout_per_token_us =
            su->step_timeout_per_token_us < 0 ? 0 : su->step_timeout_per_token_us;
    h->cfg.geometry = (struct kv_geometry){.pool_id = 9,
                                           .num_layers = 2,
                                           .num_blocks = su->num_blocks ? su->num_blocks : 257,
                                           .block_size = su->block_size ? su->block_size : 8,
                                           .num_kv_heads = 2,
                                           .head_dim = 16,
                                           .dtype = DTYPE_F32};
    h->hello.max_positions = su->max_positions ? su->max_positions : 4096;
    if (su->eos >= 0) {
        h->hello.eos[0] = su->eos;
        h->hello.n_eos = 1;
    }
    struct scheduler_io io = {.ctx = h,
                              .to_worker = io_to_worker,
                              .to_router = io_to_router,
                              .to_supervisor = io_to_supervisor};
    assert_int_equal(scheduler_open(&h->cfg, &io, &h->s), 0);
    h->fw.pid = 100;
    h->fw.pool_id = h->cfg.geometry.pool_id;
    h->fw.num_blocks = h->cfg.geometry.num_blocks;
    h->fw.dtype = (int32_t)h->cfg.geometry.dtype;
    h->fw.block_size = h->cfg.geometry.block_size;
    size_t slots = (size_t)h->fw.num_blocks * (size_t)h->fw.block_size;
    h->fw.pool = malloc(slots * sizeof(int32_t));
    assert_non_null(h->fw.pool);
    for (size_t i = 0; i < slots; i++)
        h->fw.pool[i] = -1;
    if (!su->no_start) {
        /* The epoch announcement, then the worker connects and says Hello. */
        tick(h, 0);
        fw_hello(&h->fw, &h->hello, &h->from_worker);
        pump(h);
        assert_int_equal(h->ready_reports, 1);
    }
    return h;
}

void harness_close(struct harness *h)
{
    scheduler_close(h->s);
    if (h->applied)
        protobuf_c_message_free_unpacked(&h->applied->base, NULL);
    if (h->admin)
        protobuf_c_message_free_unpacked(&h->admin->base, NULL);
    queue_fini(&h->to_worker);
    queue_fini(&h->from_worker);
    free(h->fw.pool);
    free(h);
}

struct scheduler_stats stats(struct harness *h)
{
    struct scheduler_stats st;
    scheduler_get_stats(h->s, &st);
    return st;
}

/* Submits request number idn with a prompt (and optionally resubmitted output). */
struct req_rec *submit_full(struct harness *h, int idn, const int32_t *prompt, int n,
                            int max_tokens, const int32_t *stop, int n_stop, bool ignore_eos)
{
    assert_true(h->n_reqs < MAX_REQS);
    struct req_rec *r = &h->reqs[h->n_reqs++];
    memset(r, 0, sizeof(*r));
    for (int i = 0; i < SCHEDULER_REQUEST_ID_BYTES; i++)
        r->id[i] = (uint8_t)(idn * 7 + i);
    uint32_t k = (uint32_t)idn;
    memcpy(r->id, &k, sizeof(k));
    rec_index_add(h, h->n_reqs - 1);
    r->finish = -1;
    Pagoda__Internal__SamplingParams sp = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    sp.has_temperature = sp.has_seed = 1;
    sp.temperature = 0.7f;
    sp.seed = (uint64_t)idn;
    sp.has_min_tokens = h->min_tokens != 0;
    sp.min_tokens = h->min_tokens;
    sp.n_logit_bias_token_ids = sp.n_logit_bias_values = h->n_bias;
    sp.logit_bias_token_ids = (int32_t *)h->bias_ids;
    sp.logit_bias_values = (float *)h->bias_values;
    Pagoda__Internal__SubmitSeq sub = PAGODA__INTERNAL__SUBMIT_SEQ__INIT;
    sub.has_request_id = 1;
    sub.request_id.data = r->id;
    sub.request_id.len = SCHEDULER_REQUEST_ID_BYTES;
    sub.tenant = h->tenant ? (char *)h->tenant : "t";
    sub.n_prompt_token_ids = (size_t)n;
    sub.prompt_token_ids = (int32_t *)prompt;
    sub.sampling = &sp;
    if (max_tokens > 0) {
        sub.has_max_tokens = 1;
        sub.max_tokens = max_tokens;
    }
    sub.n_stop_token_ids = (size_t)n_stop;
    sub.stop_token_ids = (int32_t *)stop;
    sub.has_ignore_eos = 1;
    sub.ignore_eos = ignore_eos;
    sub.has_strict_max_tokens = h->strict_max_tokens;
    sub.strict_max_tokens = h->strict_max_tokens;
    sub.has_logprobs = h->logprobs;
    sub.logprobs = h->logprobs;
    sub.has_router_text = h->router_text != NULL;
    sub.router_text.data = (uint8_t *)h->router_text;
    sub.router_text.len = h->router_text ? strlen(h->router_text) : 0;
    uint8_t client_id[SCHEDULER_REQUEST_ID_BYTES];
    for (int i = 0; i < SCHEDULER_REQUEST_ID_BYTES; i++)
        client_id[i] = (uint8_t)(r->id[i] ^ 0xa5);
    sub.has_client_request_id = 1;
    sub.client_request_id.data = client_id;
    sub.client_request_id.len = SCHEDULER_REQUEST_ID_BYTES;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_SUBMIT;
    m.submit = &sub;
    deliver_router(h, &m);
    return r;
}

struct req_rec *submit(struct harness *h, int idn, const int32_t *prompt, int n, int max_tokens)
{
    return submit_full(h, idn, prompt, n, max_tokens, NULL, 0, false);
}

void cancel(struct harness *h, const struct req_rec *r)
{
    Pagoda__Internal__CancelSeq c = PAGODA__INTERNAL__CANCEL_SEQ__INIT;
    c.has_request_id = 1;
    c.request_id.data = (uint8_t *)r->id;
    c.request_id.len = SCHEDULER_REQUEST_ID_BYTES;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_CANCEL;
    m.cancel = &c;
    deliver_router(h, &m);
}

/* r finished with reason after exactly the reference's first n tokens for prompt. */
void expect_output(const struct req_rec *r, const int32_t *prompt, int n_prompt, int n, int reason)
{
    int32_t ref[MAX_OUT];
    ref_generate(prompt, n_prompt, n, ref);
    assert_int_equal(r->ends, 1);
    assert_int_equal(r->finish, reason);
    assert_int_equal(r->n_out, n);
    assert_memory_equal(r->out, ref, (size_t)n * sizeof(int32_t));
}

/* Every request's blocks are back once everything finished and the last step was answered. */
void expect_idle_pool(struct harness *h)
{
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.free_blocks, st.num_blocks);
    assert_int_equal(st.deferred_blocks, 0);
}
