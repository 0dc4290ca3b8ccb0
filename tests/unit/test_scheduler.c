/* Tests of scheduler/scheduler.c: the state machine driven by a fake worker.
 *
 * The fake worker keeps a mirror as docs/protocol.md says a worker must (resyncs replace it,
 * steps of other epochs are ignored, an unexpected step id is refused with an error result,
 * num_computed_tokens is checked) and owns a fake KV pool that outlives it: computing a
 * position writes the token id into the slot the block table names. The token it samples is a
 * hash of what the pool holds at the sequence's positions, read back through the block table,
 * so an output equals the reference (the same hash over the token list) only if every block
 * held the right data when it was read: a block freed or reused too early, a wrong block
 * table, or a resync that claims uncomputed positions shows up as a different token. It also
 * checks on every step that no two live sequences share a block and block 0 is never used.
 *
 * Messages travel as bytes: the scheduler's output is packed, and what the scheduler receives
 * is unpacked with wire_unpack from an nng_msg, as in pagoda-scheduler. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/log.h"
#include "scheduler/scheduler.h"
#include "wire/wire.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 1000
#define EPOCH 4242
#define MAX_REQS 32
#define MAX_OUT 512
#define MAX_FSEQ 64
#define MAX_FTOK 1024
#define MAX_FBLK 128
#define MAX_PUMP 100000

/* ---- byte queues ---------------------------------------------------------------------------- */

struct bytes {
    uint8_t *data;
    size_t len;
};

struct queue {
    struct bytes *items;
    size_t head, count, cap;
};

static void queue_push(struct queue *q, const ProtobufCMessage *m)
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

static bool queue_pop(struct queue *q, struct bytes *out)
{
    if (q->count == 0)
        return false;
    *out = q->items[q->head++];
    q->count--;
    if (q->count == 0)
        q->head = 0;
    return true;
}

static void queue_clear(struct queue *q)
{
    struct bytes b = {0};
    while (queue_pop(q, &b))
        free(b.data);
}

static void queue_fini(struct queue *q)
{
    queue_clear(q);
    free(q->items);
    memset(q, 0, sizeof(*q));
}

/* ---- the reference model -------------------------------------------------------------------- */

static uint32_t fnv_step(uint32_t h, int32_t v)
{
    uint32_t x = (uint32_t)v;
    for (int i = 0; i < 4; i++) {
        h ^= (x >> (8 * i)) & 0xffu;
        h *= 16777619u;
    }
    return h;
}

/* The next token after tokens[0..n). */
static int32_t ref_next(const int32_t *tokens, int n)
{
    uint32_t h = 2166136261u;
    for (int i = 0; i < n; i++)
        h = fnv_step(h, tokens[i]);
    h = fnv_step(h, n);
    return (int32_t)(h % VOCAB);
}

/* The first count outputs after prompt. */
static void ref_generate(const int32_t *prompt, int n_prompt, int count, int32_t *out)
{
    int32_t all[MAX_FTOK];
    memcpy(all, prompt, (size_t)n_prompt * sizeof(int32_t));
    for (int i = 0; i < count; i++) {
        out[i] = ref_next(all, n_prompt + i);
        all[n_prompt + i] = out[i];
    }
}

static void make_prompt(int seed, int n, int32_t *out)
{
    for (int i = 0; i < n; i++)
        out[i] = (seed * 131 + i * 17 + 3) % VOCAB;
}

/* ---- the fake worker ------------------------------------------------------------------------ */

struct fseq {
    bool live;
    uint64_t seq_id;
    int32_t tokens[MAX_FTOK];
    int n_tokens, n_prompt, computed;
    int32_t blocks[MAX_FBLK];
    int n_blocks;
};

struct fake_worker {
    int32_t pid;
    bool introduced; /* has sent a Hello since it started */
    bool has_epoch;
    uint64_t epoch;
    uint64_t expected_step;
    struct fseq seqs[MAX_FSEQ];
    int32_t *pool; /* token id per slot, -1 never written */
    int32_t num_blocks, block_size;
    uint64_t computed_tokens;
    /* Behaviour knobs. */
    bool silent;        /* consume everything, answer nothing (hung) */
    int drop_steps;     /* lose this many steps */
    bool strip_results; /* answer the next step without its tokens (a broken result) */
    /* What it saw. */
    int steps_run, refused, ignored_steps, resyncs_done, hellos_sent;
    int max_step_tokens;
    int preempted_seen, finished_seen;
};

static struct fseq *fw_find(struct fake_worker *fw, uint64_t seq_id)
{
    for (int i = 0; i < MAX_FSEQ; i++)
        if (fw->seqs[i].live && fw->seqs[i].seq_id == seq_id)
            return &fw->seqs[i];
    return NULL;
}

static struct fseq *fw_add(struct fake_worker *fw, uint64_t seq_id)
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

static int32_t *fw_slot(struct fake_worker *fw, const struct fseq *f, int pos)
{
    int bi = pos / fw->block_size;
    assert_true(bi < f->n_blocks);
    int32_t b = f->blocks[bi];
    assert_true(b >= 1 && b < fw->num_blocks);
    return &fw->pool[(size_t)b * (size_t)fw->block_size + (size_t)(pos % fw->block_size)];
}

/* No block 0, no block outside the pool, no block held by two live sequences. */
static void fw_check_ownership(struct fake_worker *fw)
{
    uint8_t *owner = calloc((size_t)fw->num_blocks, 1);
    assert_non_null(owner);
    for (int i = 0; i < MAX_FSEQ; i++) {
        struct fseq *f = &fw->seqs[i];
        if (!f->live)
            continue;
        for (int j = 0; j < f->n_blocks; j++) {
            int32_t b = f->blocks[j];
            if (b < 1 || b >= fw->num_blocks)
                fail_msg("worker: seq %llu has block %d", (unsigned long long)f->seq_id, b);
            if (owner[b])
                fail_msg("worker: block %d held twice", b);
            owner[b] = 1;
        }
    }
    free(owner);
}

static void fw_set_blocks(struct fseq *f, const int32_t *ids, size_t n)
{
    assert_true(n >= 1 && n <= MAX_FBLK);
    memcpy(f->blocks, ids, n * sizeof(int32_t));
    f->n_blocks = (int)n;
}

static void fw_set_tokens(struct fseq *f, const int32_t *ids, size_t n, int n_prompt)
{
    assert_true(n >= 1 && n < MAX_FTOK);
    memcpy(f->tokens, ids, n * sizeof(int32_t));
    f->n_tokens = (int)n;
    f->n_prompt = n_prompt;
}

/* The token after f's tokens, computed from what the pool holds. */
static int32_t fw_sample(struct fake_worker *fw, const struct fseq *f)
{
    uint32_t h = 2166136261u;
    for (int p = 0; p < f->n_tokens; p++)
        h = fnv_step(h, *fw_slot(fw, f, p));
    h = fnv_step(h, f->n_tokens);
    return (int32_t)(h % VOCAB);
}

static void reply_result(struct queue *out, uint64_t epoch, uint64_t step_id, int err,
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
    }
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESULT;
    m.result = &r;
    queue_push(out, &m.base);
}

struct hello_opts {
    int64_t max_positions;
    int32_t eos[4];
    size_t n_eos;
};

static void fw_hello(struct fake_worker *fw, const struct hello_opts *ho, struct queue *out)
{
    Pagoda__Internal__PoolGeometry g = PAGODA__INTERNAL__POOL_GEOMETRY__INIT;
    g.has_num_blocks = g.has_block_size = 1;
    g.num_blocks = fw->num_blocks;
    g.block_size = fw->block_size;
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
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_HELLO;
    m.hello = &h;
    queue_push(out, &m.base);
    fw->hellos_sent++;
    fw->introduced = true;
}

static void fw_resync(struct fake_worker *fw, const Pagoda__Internal__Resync *r,
                      const struct hello_opts *ho, struct queue *out)
{
    /* A worker introduces itself when it starts, and again when a resync of another epoch
     * than the previous one shows that a new scheduler took over. */
    if (!fw->introduced || (fw->has_epoch && fw->epoch != r->epoch))
        fw_hello(fw, ho, out);
    fw->has_epoch = true;
    fw->epoch = r->epoch;
    fw->expected_step = r->next_step_id;
    for (int i = 0; i < MAX_FSEQ; i++)
        fw->seqs[i].live = false;
    for (size_t i = 0; i < r->n_seqs; i++) {
        const Pagoda__Internal__SequenceSnapshot *sn = r->seqs[i];
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
    Pagoda__Internal__ResyncDone d = PAGODA__INTERNAL__RESYNC_DONE__INIT;
    d.has_epoch = d.has_resync_id = 1;
    d.epoch = r->epoch;
    d.resync_id = r->resync_id;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESYNC_DONE;
    m.resync_done = &d;
    queue_push(out, &m.base);
}

/* Runs one sequence's part of a step; returns true when it sampled (token in *token). */
static bool fw_compute(struct fake_worker *fw, struct fseq *f, int num_new, int32_t *token)
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

static void fw_step(struct fake_worker *fw, const Pagoda__Internal__Step *st, struct queue *out)
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
    for (size_t i = 0; i < st->n_finished_seq_ids; i++) {
        struct fseq *f = fw_find(fw, st->finished_seq_ids[i]);
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
        for (int j = 0; j < MAX_FSEQ; j++)
            if (fw->seqs[j].live && fw->seqs[j].seq_id > f->seq_id)
                fail_msg("worker: seq %llu preempted before the newer %llu",
                         (unsigned long long)f->seq_id, (unsigned long long)fw->seqs[j].seq_id);
    }
    /* Check every continuing sequence before touching anything. */
    for (size_t i = 0; i < st->n_cont_seqs; i++) {
        struct fseq *f = fw_find(fw, st->cont_seqs[i]->seq_id);
        if (f == NULL)
            fail_msg("worker: continuing seq %llu unknown",
                     (unsigned long long)st->cont_seqs[i]->seq_id);
        if (f->computed != st->cont_seqs[i]->num_computed_tokens)
            fail_msg("worker: seq %llu computed %d, step says %d", (unsigned long long)f->seq_id,
                     f->computed, st->cont_seqs[i]->num_computed_tokens);
    }
    size_t n = st->n_new_seqs + st->n_cont_seqs;
    Pagoda__Internal__SeqResult *res = calloc(n + 1, sizeof(*res));
    Pagoda__Internal__SeqResult **ptrs = calloc(n + 1, sizeof(*ptrs));
    assert_true(res && ptrs);
    size_t nres = 0;
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
        touched[nt] = f;
        nums[nt++] = ns->num_new_tokens;
    }
    for (size_t i = 0; i < st->n_cont_seqs; i++) {
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
        if (fw_compute(fw, touched[i], nums[i], &token)) {
            pagoda__internal__seq_result__init(&res[nres]);
            res[nres].has_seq_id = res[nres].has_token_id = res[nres].has_logprob = 1;
            res[nres].seq_id = touched[i]->seq_id;
            res[nres].token_id = token;
            res[nres].logprob = -0.5f;
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
}

/* The process dies and a new one starts: the mirror is gone, the pool is not. */
static void fw_restart(struct fake_worker *fw, int32_t pid)
{
    memset(fw->seqs, 0, sizeof(fw->seqs));
    fw->has_epoch = false;
    fw->introduced = false;
    fw->silent = false;
    fw->pid = pid;
}

/* ---- the harness ---------------------------------------------------------------------------- */

struct req_rec {
    uint8_t id[SCHEDULER_REQUEST_ID_BYTES];
    int32_t out[MAX_OUT];
    int n_out;
    int finish; /* -1 while running */
    int error_code;
    int ends;
};

/* One TokenEvent{announce} received. */
struct ann_rec {
    uint8_t id[SCHEDULER_REQUEST_ID_BYTES];
    uint8_t client_id[SCHEDULER_REQUEST_ID_BYTES];
    bool has_client_id;
    int32_t out[MAX_OUT];
    int n_out;
    int finish;
    int32_t max_tokens;
    bool ignore_eos;
    bool tenant_ok;
    uint32_t prompt_tokens;
};

struct harness {
    struct scheduler *s;
    struct ann_rec ann[MAX_REQS];
    int n_ann, ann_done;
    struct scheduler_config cfg;
    struct hello_opts hello;
    int64_t now;
    struct queue to_worker;   /* scheduler -> fake worker */
    struct queue from_worker; /* fake worker -> scheduler */
    struct fake_worker fw;
    struct req_rec reqs[MAX_REQS];
    int n_reqs;
    int bad_id_errors;
    int ready_reports, hung_reports;
    int32_t hung_pid;
    uint64_t stats_cookie;
    uint32_t stats_running;
    uint64_t stats_steps;
    double stats_cpu_us;
    int stats_replies;
};

static struct req_rec *rec_find(struct harness *h, const uint8_t *id)
{
    for (int i = 0; i < h->n_reqs; i++)
        if (memcmp(h->reqs[i].id, id, SCHEDULER_REQUEST_ID_BYTES) == 0)
            return &h->reqs[i];
    return NULL;
}

static void io_to_worker(void *ctx, uint32_t worker_id, const Pagoda__Internal__ToWorker *m)
{
    struct harness *h = ctx;
    assert_int_equal(worker_id, 0);
    assert_true(m->has_protocol_version);
    queue_push(&h->to_worker, &m->base);
}

static void io_to_router(void *ctx, const Pagoda__Internal__ToRouter *msg)
{
    struct harness *h = ctx;
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
                for (size_t t = 0; t < ev->n_token_ids; t++)
                    a->out[t] = ev->token_ids[t];
                a->finish = ev->has_finish_reason ? (int)ev->finish_reason : 0;
                a->max_tokens = ev->max_tokens;
                a->ignore_eos = ev->ignore_eos;
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
            assert_int_equal(r->ends, 0); /* nothing after the end */
            assert_int_equal(ev->offset, (uint32_t)r->n_out);
            assert_int_equal(ev->n_logprobs, ev->n_token_ids);
            for (size_t t = 0; t < ev->n_token_ids; t++) {
                assert_true(r->n_out < MAX_OUT);
                r->out[r->n_out++] = ev->token_ids[t];
            }
            if (ev->has_finish_reason &&
                ev->finish_reason != PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE) {
                r->finish = ev->finish_reason;
                r->error_code = ev->error_code;
                r->ends++;
            }
        }
    }
    protobuf_c_message_free_unpacked(&m->base, NULL);
}

static void io_to_supervisor(void *ctx, const Pagoda__Internal__Control *m)
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

static Pagoda__Internal__ToScheduler *unpack_nng(const uint8_t *data, size_t len)
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

static void deliver_worker_bytes(struct harness *h, const uint8_t *data, size_t len)
{
    Pagoda__Internal__ToScheduler *msg = unpack_nng(data, len);
    scheduler_on_worker(h->s, 0, msg, h->now);
    if (msg)
        protobuf_c_message_free_unpacked(&msg->base, NULL);
}

static void deliver_router_bytes(struct harness *h, const uint8_t *data, size_t len)
{
    Pagoda__Internal__ToScheduler *msg = unpack_nng(data, len);
    scheduler_on_router(h->s, msg, h->now);
    if (msg)
        protobuf_c_message_free_unpacked(&msg->base, NULL);
}

static void deliver_router(struct harness *h, const Pagoda__Internal__ToScheduler *m)
{
    size_t len = protobuf_c_message_get_packed_size(&m->base);
    uint8_t *buf = malloc(len + 1);
    protobuf_c_message_pack(&m->base, buf);
    deliver_router_bytes(h, buf, len);
    free(buf);
}

/* The fake worker handles one message from the scheduler; its answers wait in from_worker. */
static bool worker_handle_one(struct harness *h)
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
static void deliver_answers(struct harness *h)
{
    struct bytes b = {0};
    while (queue_pop(&h->from_worker, &b)) {
        deliver_worker_bytes(h, b.data, b.len);
        free(b.data);
    }
}

/* Runs the exchange until nobody has anything to say. */
static void pump(struct harness *h)
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
static void exchange(struct harness *h)
{
    while (worker_handle_one(h))
        ;
    deliver_answers(h);
}

/* The next message to the worker, unpacked (caller frees), or NULL. */
static Pagoda__Internal__ToWorker *peek_worker(struct harness *h)
{
    if (h->to_worker.count == 0)
        return NULL;
    struct bytes *b = &h->to_worker.items[h->to_worker.head];
    return pagoda__internal__to_worker__unpack(NULL, b->len, b->data);
}

static void tick(struct harness *h, int64_t now)
{
    h->now = now;
    scheduler_tick(h->s, now);
}

struct setup {
    int32_t num_blocks, block_size;
    int32_t max_batched_tokens, max_seqs, max_queued;
    uint64_t fault_dup_step;
    int64_t max_positions;
    int32_t eos;
    bool no_start;
};

static struct harness *harness_open(const struct setup *su)
{
    struct harness *h = calloc(1, sizeof(*h));
    assert_non_null(h);
    scheduler_config_default(&h->cfg);
    h->cfg.epoch = EPOCH;
    h->cfg.max_batched_tokens = su->max_batched_tokens ? su->max_batched_tokens : 2048;
    h->cfg.max_seqs = su->max_seqs ? su->max_seqs : 16;
    h->cfg.max_queued = su->max_queued ? su->max_queued : 64;
    h->cfg.fault_dup_step = su->fault_dup_step;
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
    h->fw.num_blocks = h->cfg.geometry.num_blocks;
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

static void harness_close(struct harness *h)
{
    scheduler_close(h->s);
    queue_fini(&h->to_worker);
    queue_fini(&h->from_worker);
    free(h->fw.pool);
    free(h);
}

static struct scheduler_stats stats(struct harness *h)
{
    struct scheduler_stats st;
    scheduler_get_stats(h->s, &st);
    return st;
}

/* Submits request number idn with a prompt (and optionally resubmitted output). */
static struct req_rec *submit_full(struct harness *h, int idn, const int32_t *prompt, int n,
                                   int max_tokens, const int32_t *stop, int n_stop, bool ignore_eos)
{
    assert_true(h->n_reqs < MAX_REQS);
    struct req_rec *r = &h->reqs[h->n_reqs++];
    memset(r, 0, sizeof(*r));
    for (int i = 0; i < SCHEDULER_REQUEST_ID_BYTES; i++)
        r->id[i] = (uint8_t)(idn * 7 + i);
    r->finish = -1;
    Pagoda__Internal__SamplingParams sp = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    sp.has_temperature = sp.has_seed = 1;
    sp.temperature = 0.7f;
    sp.seed = (uint64_t)idn;
    Pagoda__Internal__SubmitSeq sub = PAGODA__INTERNAL__SUBMIT_SEQ__INIT;
    sub.has_request_id = 1;
    sub.request_id.data = r->id;
    sub.request_id.len = SCHEDULER_REQUEST_ID_BYTES;
    sub.tenant = "t";
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

static struct req_rec *submit(struct harness *h, int idn, const int32_t *prompt, int n,
                              int max_tokens)
{
    return submit_full(h, idn, prompt, n, max_tokens, NULL, 0, false);
}

static void cancel(struct harness *h, const struct req_rec *r)
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
static void expect_output(const struct req_rec *r, const int32_t *prompt, int n_prompt, int n,
                          int reason)
{
    int32_t ref[MAX_OUT];
    ref_generate(prompt, n_prompt, n, ref);
    assert_int_equal(r->ends, 1);
    assert_int_equal(r->finish, reason);
    assert_int_equal(r->n_out, n);
    assert_memory_equal(r->out, ref, (size_t)n * sizeof(int32_t));
}

static const struct setup DEFAULT_SETUP = {.eos = -1};

/* Every request's blocks are back once everything finished and the last step was answered. */
static void expect_idle_pool(struct harness *h)
{
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, 0);
    assert_int_equal(st.free_blocks, st.num_blocks);
    assert_int_equal(st.deferred_blocks, 0);
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* Before any Hello the scheduler announces its epoch with empty resyncs every
 * SCHEDULER_ANNOUNCE_MS; the worker's Hello gets a resync, its ResyncDone makes the scheduler
 * ready (reported once). A ResyncDone without a Hello is ignored. */
static void test_start_announce_hello_ready(void **state)
{
    struct setup su = DEFAULT_SETUP;
    su.no_start = true;
    struct harness *h = harness_open(&su);
    tick(h, 0);
    Pagoda__Internal__ToWorker *m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC);
    assert_int_equal(m->resync->epoch, EPOCH);
    assert_int_equal(m->resync->n_seqs, 0);
    assert_int_equal(m->resync->next_step_id, 1);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    queue_clear(&h->to_worker);
    tick(h, SCHEDULER_ANNOUNCE_MS - 1);
    assert_int_equal(h->to_worker.count, 0);
    tick(h, SCHEDULER_ANNOUNCE_MS);
    assert_int_equal(h->to_worker.count, 1);
    assert_int_equal(stats(h).resyncs, 0);
    /* The worker answers the announcement: a Hello (new epoch to it), then ResyncDone. */
    pump(h);
    assert_int_equal(h->fw.hellos_sent, 1);
    assert_int_equal(h->ready_reports, 1);
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.resyncs, 1);
    assert_true(st.ready);
    assert_int_equal(st.worker_restarts, 0);
    /* A repeated Hello of the same pid while its resync travels changes nothing. */
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    deliver_answers(h);
    assert_int_equal(h->to_worker.count, 1); /* one resync for the first, none for the repeat */
    pump(h);
    assert_int_equal(stats(h).resyncs, 2);
    assert_int_equal(stats(h).worker_restarts, 0);
    assert_int_equal(h->ready_reports, 1);
    harness_close(h);
}

/* A request submitted while a step is in flight joins at the next step boundary, which carries
 * the running request's decode and the new request's prefill together. */
static void test_continuous_batching(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[5], pb[9];
    make_prompt(1, 5, pa);
    make_prompt(2, 9, pb);
    struct req_rec *a = submit(h, 1, pa, 5, 6);
    /* Step 1: A's prefill, in flight. */
    Pagoda__Internal__ToWorker *m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_STEP);
    assert_int_equal(m->step->n_new_seqs, 1);
    assert_int_equal(m->step->new_seqs[0]->num_new_tokens, 5);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    worker_handle_one(h); /* the worker runs it; its answer waits */
    struct req_rec *b = submit(h, 2, pb, 9, 4);
    assert_int_equal(h->to_worker.count, 0); /* one step in flight: B waits */
    deliver_answers(h);
    /* Step 2: A's decode and B's prefill. */
    m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_STEP);
    assert_int_equal(m->step->step_id, 2);
    assert_int_equal(m->step->n_cont_seqs, 1);
    assert_int_equal(m->step->cont_seqs[0]->num_computed_tokens, 5);
    assert_int_equal(m->step->cont_seqs[0]->num_new_tokens, 1);
    assert_int_equal(m->step->n_new_seqs, 1);
    assert_int_equal(m->step->new_seqs[0]->n_token_ids, 9);
    assert_int_equal(m->step->new_seqs[0]->num_new_tokens, 9);
    assert_int_equal(m->step->new_seqs[0]->num_computed_tokens, 0);
    assert_int_equal(m->step->new_seqs[0]->num_prompt_tokens, 9);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    assert_int_equal(a->n_out, 1);
    pump(h);
    expect_output(a, pa, 5, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(b, pb, 9, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).peak_running, 2);
    expect_idle_pool(h);
    harness_close(h);
}

/* A prompt longer than the token budget is prefilled in chunks over several steps and samples
 * only at the last; decodes come first and shrink the budget left for chunks. */
static void test_chunked_prefill_under_budget(void **state)
{
    struct setup su = DEFAULT_SETUP;
    su.max_batched_tokens = 8;
    su.max_seqs = 4;
    struct harness *h = harness_open(&su);
    int32_t pa[20], pb[10];
    make_prompt(3, 20, pa);
    make_prompt(4, 10, pb);
    struct req_rec *a = submit(h, 1, pa, 20, 3);
    int expect_computed[3] = {0, 8, 16}, expect_new[3] = {8, 8, 4};
    for (int i = 0; i < 3; i++) {
        Pagoda__Internal__ToWorker *m = peek_worker(h);
        assert_non_null(m);
        const Pagoda__Internal__Step *st = m->step;
        assert_int_equal(st->n_new_seqs + st->n_cont_seqs, 1);
        int computed =
            i == 0 ? st->new_seqs[0]->num_computed_tokens : st->cont_seqs[0]->num_computed_tokens;
        int num_new = i == 0 ? st->new_seqs[0]->num_new_tokens : st->cont_seqs[0]->num_new_tokens;
        assert_int_equal(computed, expect_computed[i]);
        assert_int_equal(num_new, expect_new[i]);
        protobuf_c_message_free_unpacked(&m->base, NULL);
        exchange(h);
        assert_int_equal(a->n_out, i == 2 ? 1 : 0); /* samples only at the end of the prompt */
    }
    /* A decodes; B, submitted meanwhile, joins with what is left of the budget: 7 tokens. */
    worker_handle_one(h);
    struct req_rec *b = submit(h, 2, pb, 10, 2);
    deliver_answers(h);
    Pagoda__Internal__ToWorker *m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->step->n_cont_seqs, 1);
    assert_int_equal(m->step->cont_seqs[0]->num_new_tokens, 1);
    assert_int_equal(m->step->n_new_seqs, 1);
    assert_int_equal(m->step->new_seqs[0]->num_new_tokens, 7);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    pump(h);
    assert_true(h->fw.max_step_tokens <= 8);
    expect_output(a, pa, 20, 3, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(b, pb, 10, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    harness_close(h);
}

/* Picks a prompt whose first three reference tokens differ, so that the third can be an EOS. */
static void prompt_with_distinct_outputs(int seed, int32_t *prompt, int n, int32_t *ref)
{
    for (int s = seed; s < seed + 100; s++) {
        make_prompt(s, n, prompt);
        ref_generate(prompt, n, 8, ref);
        bool ok = true;
        for (int i = 0; i < 8 && ok; i++)
            for (int j = 0; j < i && ok; j++)
                ok = ref[i] != ref[j];
        if (ok)
            return;
    }
    fail_msg("no prompt with distinct outputs");
}

/* EOS from the worker's Hello (unless ignore_eos), a stop id, max_tokens and a full context
 * each end a request, and the stopping token is part of the output. */
static void test_stop_conditions(void **state)
{
    int32_t p1[6], r1[8];
    prompt_with_distinct_outputs(10, p1, 6, r1);
    struct setup su = DEFAULT_SETUP;
    su.eos = r1[2];
    su.max_positions = 12;
    struct harness *h = harness_open(&su);
    struct req_rec *eos = submit(h, 1, p1, 6, 0);
    struct req_rec *ign = submit_full(h, 2, p1, 6, 5, NULL, 0, true);
    int32_t stop[2] = {r1[1], 999999};
    struct req_rec *st = submit_full(h, 3, p1, 6, 0, stop, 2, true);
    int32_t p2[8];
    make_prompt(11, 8, p2);
    struct req_rec *ctx = submit_full(h, 4, p2, 8, 0, NULL, 0, true);
    struct req_rec *len = submit_full(h, 5, p2, 8, 2, NULL, 0, true);
    int32_t p3[11];
    make_prompt(12, 11, p3);
    struct req_rec *last = submit_full(h, 6, p3, 11, 0, NULL, 0, true);
    pump(h);
    expect_output(eos, p1, 6, 3, PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP);
    expect_output(ign, p1, 6, 5, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(st, p1, 6, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP);
    expect_output(ctx, p2, 8, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH); /* 8+4 = 12 */
    expect_output(len, p2, 8, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(last, p3, 11, 1, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).finished_requests, 6);
    expect_idle_pool(h);
    harness_close(h);
}

/* A request cancelled while a step that writes its blocks is in flight keeps them out of the
 * free list until that step's result arrives; the next step tells the worker. */
static void test_blocks_freed_after_ack(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[20], pb[4];
    make_prompt(5, 20, pa);
    make_prompt(6, 4, pb);
    struct req_rec *a = submit(h, 1, pa, 20, 0);
    exchange(h); /* prefill answered; A's first decode is in flight */
    assert_int_equal(a->n_out, 1);
    struct scheduler_stats st = stats(h);
    int32_t held = st.num_blocks - st.free_blocks;
    assert_int_equal(held, 3); /* 21 tokens in blocks of 8 */
    Pagoda__Internal__ToWorker *m = peek_worker(h);
    uint64_t a_seq = m->step->cont_seqs[0]->seq_id;
    protobuf_c_message_free_unpacked(&m->base, NULL);
    worker_handle_one(h); /* the worker runs the decode, writing A's blocks */
    cancel(h, a);
    assert_int_equal(a->ends, 1);
    assert_int_equal(a->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_CANCELLED);
    st = stats(h);
    assert_int_equal(st.free_blocks, st.num_blocks - held); /* still fenced */
    assert_int_equal(st.deferred_blocks, held);
    deliver_answers(h); /* the step is acknowledged: now they are free */
    st = stats(h);
    assert_int_equal(st.free_blocks, st.num_blocks);
    assert_int_equal(a->n_out, 1); /* the cancelled request's late token is not reported */
    /* The next step names A as finished (and B may reuse its blocks). */
    struct req_rec *b = submit(h, 2, pb, 4, 3);
    m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->step->n_finished_seq_ids, 1);
    assert_int_equal(m->step->finished_seq_ids[0], a_seq);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    pump(h);
    expect_output(b, pb, 4, 3, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(h->fw.finished_seen, 1);
    expect_idle_pool(h);
    harness_close(h);
}

static void run_many(struct harness *h, int n, int32_t prompts[][16], int n_prompt, int max_tok,
                     struct req_rec **recs)
{
    for (int i = 0; i < n; i++) {
        make_prompt(20 + i, n_prompt, prompts[i]);
        recs[i] = submit(h, i + 1, prompts[i], n_prompt, max_tok);
    }
    pump(h);
}

/* With too few blocks the most recently admitted sequence is preempted and recomputed later;
 * the outputs equal those of a run with plenty of blocks. */
static void test_preemption_keeps_outputs(void **state)
{
    int32_t prompts[4][16];
    struct req_rec *plenty[4], *tight[4];
    struct harness *h = harness_open(&DEFAULT_SETUP);
    run_many(h, 4, prompts, 10, 22, plenty);
    assert_int_equal(stats(h).preemptions, 0);
    struct harness *t;
    struct setup su = DEFAULT_SETUP;
    su.num_blocks = 1 + 8; /* 64 token slots; the four need 4 x 32 */
    t = harness_open(&su);
    run_many(t, 4, prompts, 10, 22, tight);
    struct scheduler_stats st = stats(t);
    assert_true(st.preemptions > 0);
    assert_true(t->fw.preempted_seen > 0);
    for (int i = 0; i < 4; i++) {
        expect_output(tight[i], prompts[i], 10, 22, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
        assert_memory_equal(tight[i]->out, plenty[i]->out, 22 * sizeof(int32_t));
    }
    expect_idle_pool(t);
    harness_close(t);
    harness_close(h);
}

/* A worker restart (Hello with a new pid) while a step is in flight: the resync's snapshot is
 * as of the last acknowledged step, the in-flight step's late result is ignored, and the work
 * is recomputed with unchanged outputs. */
static void test_resync_after_hello(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[7], pb[12];
    make_prompt(30, 7, pa);
    make_prompt(31, 12, pb);
    struct req_rec *a = submit(h, 1, pa, 7, 8);
    struct req_rec *b = submit(h, 2, pb, 12, 8);
    exchange(h);
    exchange(h);
    exchange(h); /* three steps acknowledged: B joined at the second */
    assert_int_equal(a->n_out, 3);
    assert_int_equal(b->n_out, 2);
    /* The worker runs step 4 and dies before its answer arrives. */
    worker_handle_one(h);
    struct bytes stale = {0};
    assert_true(queue_pop(&h->from_worker, &stale));
    fw_restart(&h->fw, 101);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    deliver_answers(h);
    Pagoda__Internal__ToWorker *m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC);
    assert_int_equal(m->resync->next_step_id, 5);
    assert_int_equal(m->resync->n_seqs, 2);
    for (size_t i = 0; i < 2; i++) {
        const Pagoda__Internal__SequenceSnapshot *sn = m->resync->seqs[i];
        int n_prompt = sn->num_prompt_tokens;
        assert_true(n_prompt == 7 || n_prompt == 12);
        int n_out = n_prompt == 7 ? a->n_out : b->n_out;
        assert_int_equal(sn->n_token_ids, (size_t)(n_prompt + n_out));
        /* The newest output is not computed: step 4 was doing it. */
        assert_int_equal(sn->num_computed_tokens, n_prompt + n_out - 1);
        assert_memory_equal(sn->token_ids + n_prompt, n_prompt == 7 ? a->out : b->out,
                            (size_t)n_out * sizeof(int32_t));
        assert_int_equal(sn->n_block_ids, (size_t)((n_prompt + n_out + 7) / 8));
    }
    protobuf_c_message_free_unpacked(&m->base, NULL);
    struct scheduler_stats before = stats(h);
    assert_int_equal(before.worker_restarts, 1);
    deliver_worker_bytes(h, stale.data, stale.len); /* step 4's answer, too late */
    free(stale.data);
    assert_int_equal(stats(h).ignored_messages, before.ignored_messages + 1);
    assert_int_equal(a->n_out, 3);
    pump(h);
    expect_output(a, pa, 7, 8, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(b, pb, 12, 8, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    harness_close(h);
}

/* A lost step is resynced after result_timeout_ms and the outputs are unchanged. */
static void test_result_timeout_resyncs(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[9];
    make_prompt(40, 9, pa);
    struct req_rec *a = submit(h, 1, pa, 9, 5);
    exchange(h);
    h->fw.drop_steps = 1;
    exchange(h); /* step 2 is lost */
    assert_int_equal(a->n_out, 1);
    uint64_t resyncs = stats(h).resyncs;
    tick(h, SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS - 1);
    assert_int_equal(h->to_worker.count, 0);
    tick(h, SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS);
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.resyncs, resyncs + 1);
    assert_int_equal(st.result_timeouts, 1);
    assert_int_equal(st.hung_reports, 0);
    pump(h);
    expect_output(a, pa, 9, 5, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    harness_close(h);
}

/* A step that is slow, not lost: its result arrives after the timeout's resync. The result is
 * ignored (its work is redone), and the timeout doubles so the next long step gets through. */
static void test_slow_worker_backs_off(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[9];
    make_prompt(41, 9, pa);
    struct req_rec *a = submit(h, 1, pa, 9, 5);
    exchange(h);
    worker_handle_one(h); /* step 2 runs, its answer is late */
    const int64_t base = SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS;
    tick(h, base);
    assert_int_equal(stats(h).result_timeouts, 1);
    h->now = base + 500;
    deliver_answers(h); /* step 2's result */
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.result_timeout_ms, 2 * base);
    assert_int_equal(a->n_out, 1);
    exchange(h); /* the resync is answered; step 3 (redoing step 2) goes out at base + 500 */
    worker_handle_one(h);
    tick(h, base + 500 + 2 * base - 1);
    assert_int_equal(stats(h).result_timeouts, 1);
    deliver_answers(h);
    assert_int_equal(a->n_out, 2);
    pump(h);
    expect_output(a, pa, 9, 5, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).resyncs, st.resyncs);
    /* A new worker process starts from the configured timeout again. */
    fw_restart(&h->fw, 104);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    pump(h);
    assert_int_equal(stats(h).result_timeout_ms, base);
    harness_close(h);
}

static void inject_result(struct harness *h, uint64_t epoch, uint64_t step_id, int err)
{
    struct queue q = {0};
    reply_result(&q, epoch, step_id, err, NULL, 0, 0);
    struct bytes b = {0};
    assert_true(queue_pop(&q, &b));
    deliver_worker_bytes(h, b.data, b.len);
    free(b.data);
    queue_fini(&q);
}

/* Results of another epoch, of a step never sent, of an older step are ignored and counted;
 * the step in flight is unaffected. */
static void test_stale_results_ignored(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[6];
    make_prompt(50, 6, pa);
    struct req_rec *a = submit(h, 1, pa, 6, 4);
    exchange(h);
    exchange(h); /* step 3 in flight */
    struct scheduler_stats before = stats(h);
    inject_result(h, EPOCH + 1, 3, 0);
    inject_result(h, EPOCH + 1, 3, PAGODA_EPROTO); /* another epoch's refusal too */
    inject_result(h, EPOCH, 9, 0);
    inject_result(h, EPOCH, 2, 0);
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.ignored_messages, before.ignored_messages + 4);
    assert_int_equal(st.resyncs, before.resyncs);
    assert_int_equal(st.malformed_messages, 0);
    assert_int_equal(a->n_out, 2);
    pump(h);
    expect_output(a, pa, 6, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).resyncs, before.resyncs);
    harness_close(h);
}

/* Bytes that do not unpack are counted; on the worker link they cause a resync, on the router
 * link nothing else. A result that breaks the protocol (no token for a sequence that sampled)
 * counts as malformed too. The outputs are unchanged. */
static void test_malformed_counted(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    static const uint8_t garbage[] = {0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01};
    Pagoda__Internal__ToScheduler *probe = unpack_nng(garbage, sizeof(garbage));
    assert_null(probe);
    int32_t pa[6];
    make_prompt(60, 6, pa);
    struct req_rec *a = submit(h, 1, pa, 6, 6);
    exchange(h);
    uint64_t resyncs = stats(h).resyncs;
    deliver_router_bytes(h, garbage, sizeof(garbage));
    assert_int_equal(stats(h).malformed_messages, 1);
    assert_int_equal(stats(h).resyncs, resyncs);
    /* A Hello on the router link is no router message. */
    struct queue q = {0};
    fw_hello(&h->fw, &h->hello, &q);
    struct bytes b = {0};
    assert_true(queue_pop(&q, &b));
    deliver_router_bytes(h, b.data, b.len);
    free(b.data);
    queue_fini(&q);
    assert_int_equal(stats(h).malformed_messages, 2);
    deliver_worker_bytes(h, garbage, sizeof(garbage));
    assert_int_equal(stats(h).malformed_messages, 3);
    assert_int_equal(stats(h).resyncs, resyncs + 1);
    exchange(h); /* step 2's result is ignored, the resync answered, step 3 redoes it */
    assert_int_equal(a->n_out, 1);
    h->fw.strip_results = true;
    exchange(h);
    assert_int_equal(stats(h).malformed_messages, 4);
    assert_int_equal(stats(h).resyncs, resyncs + 2);
    pump(h);
    expect_output(a, pa, 6, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    harness_close(h);
}

/* A worker that owes an answer and says nothing for watchdog_ms is reported once, with its
 * pid; its replacement's Hello resyncs and the request completes. */
static void test_watchdog_reports_once(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[6];
    make_prompt(70, 6, pa);
    struct req_rec *a = submit(h, 1, pa, 6, 5);
    int64_t t0 = 1000;
    h->now = t0;
    exchange(h); /* step 1's answer at t0: step 2 is sent then */
    h->fw.silent = true;
    exchange(h); /* and swallowed */
    for (int64_t t = t0; t < t0 + SCHEDULER_DEFAULT_WATCHDOG_MS; t += 20) {
        tick(h, t);
        exchange(h); /* resyncs after each result timeout, swallowed too */
    }
    assert_int_equal(h->hung_reports, 0);
    assert_true(stats(h).result_timeouts >= 4);
    tick(h, t0 + SCHEDULER_DEFAULT_WATCHDOG_MS);
    assert_int_equal(h->hung_reports, 1);
    assert_int_equal(h->hung_pid, 100);
    for (int64_t t = t0 + SCHEDULER_DEFAULT_WATCHDOG_MS; t < t0 + 3 * SCHEDULER_DEFAULT_WATCHDOG_MS;
         t += 20) {
        tick(h, t);
        exchange(h);
    }
    assert_int_equal(h->hung_reports, 1); /* once per incident */
    assert_int_equal(stats(h).hung_reports, 1);
    /* The supervisor restarts it. */
    fw_restart(&h->fw, 102);
    queue_clear(&h->to_worker);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    pump(h);
    expect_output(a, pa, 6, 5, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).worker_restarts, 1);
    expect_idle_pool(h);
    /* Any message ended the incident: the new worker hanging is a new one, reported again. */
    int64_t t1 = h->now + 50;
    h->now = t1;
    h->fw.silent = true;
    submit(h, 2, pa, 6, 5);
    exchange(h);
    for (int64_t t = t1; t < t1 + SCHEDULER_DEFAULT_WATCHDOG_MS; t += 100)
        tick(h, t);
    assert_int_equal(h->hung_reports, 1);
    tick(h, t1 + SCHEDULER_DEFAULT_WATCHDOG_MS);
    assert_int_equal(h->hung_reports, 2);
    assert_int_equal(h->hung_pid, 102);
    harness_close(h);
}

/* Blocks fenced on a step that a resync discarded return at the ResyncDone, which
 * acknowledges every step sent before it, without waiting for a later step. */
static void test_resync_done_releases_fenced_blocks(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[30];
    make_prompt(75, 30, pa);
    struct req_rec *a = submit(h, 1, pa, 30, 0);
    exchange(h);
    worker_handle_one(h); /* A's decode runs; the worker dies before answering */
    queue_clear(&h->from_worker);
    cancel(h, a);
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.deferred_blocks, 4);
    fw_restart(&h->fw, 103);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    deliver_answers(h);
    assert_int_equal(stats(h).deferred_blocks, 4); /* the resync is not answered yet */
    pump(h);
    st = stats(h);
    assert_int_equal(st.deferred_blocks, 0);
    assert_int_equal(st.free_blocks, st.num_blocks);
    assert_int_equal(st.steps, 2); /* no step acknowledged them */
    harness_close(h);
}

/* --fault dup-step=N: the worker refuses the duplicate, the scheduler resyncs, the outputs
 * are unchanged. */
static void test_dup_step_fault(void **state)
{
    int32_t prompts[3][16];
    struct req_rec *clean[3], *dup[3];
    struct harness *h = harness_open(&DEFAULT_SETUP);
    run_many(h, 3, prompts, 9, 7, clean);
    struct setup su = DEFAULT_SETUP;
    su.fault_dup_step = 3;
    struct harness *f = harness_open(&su);
    uint64_t resyncs = stats(f).resyncs, ignored = stats(f).ignored_messages;
    run_many(f, 3, prompts, 9, 7, dup);
    assert_int_equal(f->fw.refused, 1);
    struct scheduler_stats st = stats(f);
    assert_int_equal(st.refused_steps, 1);
    assert_int_equal(st.resyncs, resyncs + 1);
    assert_int_equal(st.ignored_messages, ignored + 1); /* step 4's, overtaken by the resync */
    for (int i = 0; i < 3; i++) {
        expect_output(dup[i], prompts[i], 9, 7, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
        assert_memory_equal(dup[i]->out, clean[i]->out, 7 * sizeof(int32_t));
    }
    expect_idle_pool(f);
    harness_close(f);
    harness_close(h);
}

/* Requests that cannot be served are refused with an error event: a prompt + 1 above the
 * context (or the pool, before any Hello), a bad request id, a token outside the vocabulary,
 * bad sampling parameters, a full queue. */
static void test_refusals(void **state)
{
    struct setup su = DEFAULT_SETUP;
    su.no_start = true;
    su.num_blocks = 1 + 4; /* 32 tokens */
    su.max_positions = 16;
    su.max_seqs = 2;
    su.max_queued = 3;
    struct harness *h = harness_open(&su);
    int32_t p[40];
    make_prompt(80, 40, p);
    /* Before any Hello only the pool bounds the prompt. */
    struct req_rec *pool = submit(h, 1, p, 32, 1);
    assert_int_equal(pool->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(pool->error_code, PAGODA_ERANGE);
    struct req_rec *early = submit(h, 2, p, 20, 1); /* fits the pool; the model says no later */
    assert_int_equal(early->ends, 0);
    tick(h, 0);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    pump(h);
    assert_int_equal(early->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(early->error_code, PAGODA_ERANGE);
    assert_int_equal(early->n_out, 0);
    struct req_rec *over = submit(h, 3, p, 16, 1);
    assert_int_equal(over->error_code, PAGODA_ERANGE);
    struct req_rec *fits = submit(h, 4, p, 15, 0); /* 15 + 1 = 16: one token */
    /* A 15-byte request id. */
    Pagoda__Internal__SubmitSeq sub = PAGODA__INTERNAL__SUBMIT_SEQ__INIT;
    uint8_t short_id[15] = {1};
    sub.has_request_id = 1;
    sub.request_id.data = short_id;
    sub.request_id.len = sizeof(short_id);
    sub.n_prompt_token_ids = 3;
    sub.prompt_token_ids = p;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_SUBMIT;
    m.submit = &sub;
    deliver_router(h, &m);
    assert_int_equal(h->bad_id_errors, 1);
    int32_t bad_tok[2] = {5, VOCAB};
    struct req_rec *tok = submit(h, 5, bad_tok, 2, 1);
    assert_int_equal(tok->error_code, PAGODA_EINVAL);
    int32_t neg_tok[2] = {5, -1};
    struct req_rec *neg = submit(h, 6, neg_tok, 2, 1);
    assert_int_equal(neg->error_code, PAGODA_EINVAL);
    pump(h);
    expect_output(fits, p, 15, 1, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    /* Bad sampling parameters. */
    Pagoda__Internal__SamplingParams sp = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    sp.has_top_p = 1;
    sp.top_p = 1.5f;
    uint8_t id7[SCHEDULER_REQUEST_ID_BYTES];
    assert_true(h->n_reqs < MAX_REQS);
    struct req_rec *samp = &h->reqs[h->n_reqs++];
    memset(samp, 0, sizeof(*samp));
    memset(id7, 0x77, sizeof(id7));
    memcpy(samp->id, id7, sizeof(id7));
    sub.request_id.data = id7;
    sub.request_id.len = sizeof(id7);
    sub.sampling = &sp;
    deliver_router(h, &m);
    assert_int_equal(samp->error_code, PAGODA_ERANGE);
    /* A full queue: three waiting while the worker is busy, the fourth refused. */
    h->fw.silent = true;
    struct req_rec *q[4];
    for (int i = 0; i < 4; i++)
        q[i] = submit(h, 10 + i, p, 4, 2);
    for (int i = 0; i < 3; i++)
        assert_int_equal(q[i]->ends, 0);
    assert_int_equal(q[3]->error_code, PAGODA_EEXHAUSTED);
    assert_int_equal(q[3]->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(stats(h).rejected_requests, 8);
    harness_close(h);
}

/* A StatsRequest is answered with the counters and its cookie. */
static void test_stats_reply(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[6];
    make_prompt(90, 6, pa);
    submit(h, 1, pa, 6, 30);
    for (int i = 0; i < 10; i++)
        exchange(h);
    Pagoda__Internal__StatsRequest sr = PAGODA__INTERNAL__STATS_REQUEST__INIT;
    sr.has_cookie = 1;
    sr.cookie = 77;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS;
    m.stats = &sr;
    deliver_router(h, &m);
    assert_int_equal(h->stats_replies, 1);
    assert_int_equal(h->stats_cookie, 77);
    assert_int_equal(h->stats_running, 1);
    assert_int_equal(h->stats_steps, 11);
    assert_true(h->stats_cpu_us > 0.0);
    struct scheduler_stats st = stats(h);
    assert_true(st.kv_usage > 0.0 && st.kv_usage < 1.0);
    assert_int_equal(st.computed_tokens, 6 + 9); /* prefill + nine decodes, by the worker */
    pump(h);
    harness_close(h);
}

static void router_hello(struct harness *h)
{
    Pagoda__Internal__RouterHello hello = PAGODA__INTERNAL__ROUTER_HELLO__INIT;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_ROUTER_HELLO;
    m.router_hello = &hello;
    deliver_router(h, &m);
}

/* RouterHello: every request held is announced from offset 0 with its output so far, the
 * parameters a router needs and the client's id; a recently ended one with its finish reason;
 * announce_done closes the announcement, and events continue from where they were. */
static void test_router_hello_announces(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    router_hello(h);
    assert_int_equal(h->n_ann, 0);
    assert_int_equal(h->ann_done, 1);
    int32_t pa[6], pb[6];
    make_prompt(40, 6, pa);
    make_prompt(41, 6, pb);
    struct req_rec *a = submit(h, 1, pa, 6, 2);
    struct req_rec *b = submit_full(h, 2, pb, 6, 30, NULL, 0, true);
    for (int i = 0; i < 5; i++)
        exchange(h);
    assert_int_equal(a->ends, 1);
    assert_int_equal(b->ends, 0);
    assert_true(b->n_out >= 3);
    router_hello(h);
    assert_int_equal(h->ann_done, 2);
    assert_int_equal(h->n_ann, 2);
    const struct ann_rec *ab = &h->ann[0], *aa = &h->ann[1]; /* running first, then ended */
    assert_memory_equal(ab->id, b->id, SCHEDULER_REQUEST_ID_BYTES);
    assert_int_equal(ab->n_out, b->n_out);
    assert_memory_equal(ab->out, b->out, (size_t)b->n_out * sizeof(int32_t));
    assert_int_equal(ab->finish, 0);
    assert_int_equal(ab->max_tokens, 30);
    assert_true(ab->ignore_eos && ab->tenant_ok && ab->has_client_id);
    assert_int_equal(ab->client_id[0], b->id[0] ^ 0xa5);
    assert_int_equal(ab->prompt_tokens, 6);
    assert_memory_equal(aa->id, a->id, SCHEDULER_REQUEST_ID_BYTES);
    assert_int_equal(aa->n_out, 2);
    assert_memory_equal(aa->out, a->out, 2 * sizeof(int32_t));
    assert_int_equal(aa->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_false(aa->ignore_eos);
    pump(h);
    assert_int_equal(b->ends, 1);
    assert_int_equal(b->n_out, 30);
    expect_idle_pool(h);
    harness_close(h);
}

int main(void)
{
    log_set_level(LOG_OFF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_announce_hello_ready),
        cmocka_unit_test(test_continuous_batching),
        cmocka_unit_test(test_chunked_prefill_under_budget),
        cmocka_unit_test(test_stop_conditions),
        cmocka_unit_test(test_blocks_freed_after_ack),
        cmocka_unit_test(test_preemption_keeps_outputs),
        cmocka_unit_test(test_resync_after_hello),
        cmocka_unit_test(test_result_timeout_resyncs),
        cmocka_unit_test(test_slow_worker_backs_off),
        cmocka_unit_test(test_stale_results_ignored),
        cmocka_unit_test(test_malformed_counted),
        cmocka_unit_test(test_watchdog_reports_once),
        cmocka_unit_test(test_resync_done_releases_fenced_blocks),
        cmocka_unit_test(test_dup_step_fault),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_stats_reply),
        cmocka_unit_test(test_router_hello_announces),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    nng_fini();
    return rc;
}
