/* Tests of worker/executor.c with the mirror, as the worker's step loop drives them: steps run
 * in order, a step prepared while the previous one is in flight decodes the token that one
 * sampled, the queue is bounded, a resync's discard drops the queued steps and lets the running
 * one finish, a sequence whose row fails in step n fails in the queued step n+1 (and in a later
 * step the scheduler formed before it knew), a whole-step failure fails the steps prepared from
 * it, and closing with steps queued neither waits out their delay nor leaks (ASan build). A
 * fake backend holds a step on a gate, and fails a row or the whole pass at chosen positions.
 *
 * The same with a fake backend that has asynchronous steps (backend_submit): step n + 1 is
 * submitted before step n is completed, its pending input read from step n's slot on the fake
 * "device"; a failed row of step n fails the sequence in step n + 1 (known only on completion);
 * a pass that fails on the device fails the step submitted behind it; a penalised history with a
 * pending token waits for that step; a refused submission runs the step synchronously. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "worker/executor.h"
#include "worker/mirror.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BS 8
#define VOCAB 100
#define WAIT_ITERATIONS 5000 /* x 1 ms: how long a test waits for the executor */

/* ---- the fake backend -------------------------------------------------------------------- */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_gate_open = 1;        /* forward_sample waits while 0 */
static int g_entered;              /* forward passes started */
static int g_fail_pos = -1;        /* a row sampled at this position fails (NaN logits) */
static int g_break_pos = -1;       /* a step sampling at this position fails as a whole */
static int g_pending_seen;         /* pending tokens that reached a forward pass */
static int32_t g_sync_history[64]; /* the last penalised row's output history, synchronous path */
static size_t g_sync_history_n;
/* Row 0's output history as each pass read it (the "device"'s, gathers applied), in order. */
static int32_t g_step_hist[128][64];
static size_t g_step_hist_n[128];
static int g_nsub;

static int32_t next_token(int32_t token, int32_t pos)
{
    return (int32_t)(((int64_t)token * 31 + pos) % VOCAB);
}

static int fake_forward(struct backend *b, const struct fwd_batch *batch, float *logits)
{
    (void)b;
    for (int32_t r = 0; r < batch->num_logits; r++) {
        int32_t t = batch->logits_indices[r], pos = batch->positions[t];
        if (pos == g_break_pos)
            return pagoda_error_set(PAGODA_EIO, "fake: the pass at position %d fails", pos);
        float *row = logits + (size_t)r * VOCAB;
        for (int v = 0; v < VOCAB; v++)
            row[v] = 0.0f;
        row[next_token(batch->token_ids[t], pos)] = 1.0f;
        if (pos == g_fail_pos)
            row[0] = NAN;
    }
    return 0;
}

static int fake_forward_sample(struct backend *b, const struct fwd_batch *batch,
                               const struct sample_row *rows, int32_t *tokens, float *logprobs)
{
    (void)b;
    for (int32_t r = 0; r < batch->num_logits; r++)
        if (rows[r].n_output > 0 && rows[r].n_output <= 64) {
            memcpy(g_sync_history, rows[r].output_tokens, rows[r].n_output * sizeof(int32_t));
            g_sync_history_n = rows[r].n_output;
            if (r == 0 && g_nsub < 128) {
                memcpy(g_step_hist[g_nsub], rows[r].output_tokens,
                       rows[r].n_output * sizeof(int32_t));
                g_step_hist_n[g_nsub++] = rows[r].n_output;
            }
        }
    pthread_mutex_lock(&g_mu);
    g_entered++;
    pthread_cond_broadcast(&g_cv);
    while (!g_gate_open)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    for (int32_t i = 0; i < batch->num_tokens; i++)
        if (mirror_token_pending(batch->token_ids[i]))
            g_pending_seen++; /* checked by teardown: resolved before the pass */
    for (int32_t r = 0; r < batch->num_logits; r++) {
        int32_t t = batch->logits_indices[r], pos = batch->positions[t];
        if (pos == g_fail_pos || pos == g_break_pos)
            return PAGODA_EINVAL; /* which row? the host path finds out */
        tokens[r] = next_token(batch->token_ids[t], pos);
        logprobs[r] = 0.0f;
    }
    return 0;
}

static void fake_close(struct backend *b)
{
    free(b);
}

static const struct backend_ops fake_ops = {
    .name = "fake",
    .forward = fake_forward,
    .forward_sample = fake_forward_sample,
    .close = fake_close,
};

/* ---- the fake asynchronous backend: a "device" that ends a step once the gate is open ------- */

#define ASYNC_ROWS 8
static int32_t g_dev_tokens[BACKEND_STEP_SLOTS][ASYNC_ROWS]; /* the device's sampled tokens */
static int32_t g_held[BACKEND_STEP_SLOTS];                   /* rows of the step; -1: none */
static int32_t g_res_tokens[BACKEND_STEP_SLOTS][ASYNC_ROWS];
static int32_t g_res_codes[BACKEND_STEP_SLOTS][ASYNC_ROWS];
static int g_res_broken[BACKEND_STEP_SLOTS]; /* the pass failed on the device */
static int g_submits, g_completes;           /* calls that succeeded */
static int g_submits_behind;                 /* submits while another step was held */
static int g_refuse_pos = -1;                /* submit refuses a step sampling here */
static int g_lost;                           /* health says the device context is lost */
static int g_history_pending_seen;           /* a pending token in a history at submit */
static int g_history_gathers;                /* history tokens read on the "device" */
static int32_t g_row_history[ASYNC_ROWS]
                            [64]; /* each row's output history as the "device" read it */
static size_t g_row_history_n[ASYNC_ROWS];
static int32_t g_last_history[64]; /* the last penalised row's output history */
static size_t g_last_history_n;

static int fake_submit(struct backend *b, int slot, const struct fwd_batch *batch,
                       const struct sample_row *rows, const struct backend_gather *gathers,
                       int32_t num_gathers, const struct backend_history_gather *hgathers,
                       int32_t num_hgathers)
{
    (void)b;
    if (g_held[slot] >= 0)
        return pagoda_error_set(PAGODA_EINVAL, "fake: slot %d is held", slot);
    int32_t tokens[32];
    for (int32_t i = 0; i < batch->num_tokens; i++) {
        if (mirror_token_pending(batch->token_ids[i]))
            g_pending_seen++;
        tokens[i] = batch->token_ids[i];
    }
    for (int32_t i = 0; i < num_gathers; i++) {
        assert_int_equal(batch->token_ids[gathers[i].token], 0); /* the placeholder */
        tokens[gathers[i].token] = g_dev_tokens[gathers[i].slot][gathers[i].row];
    }
    for (int32_t r = 0; r < batch->num_logits; r++) {
        int32_t pos = batch->positions[batch->logits_indices[r]];
        if (pos == g_refuse_pos)
            return pagoda_error_set(PAGODA_EINVAL, "fake: refused at position %d", pos);
        for (size_t k = 0; k < rows[r].n_output; k++)
            if (mirror_token_pending(rows[r].output_tokens[k]))
                g_history_pending_seen++;
        if (rows[r].n_output > 0 && rows[r].n_output <= 64) {
            memcpy(g_last_history, rows[r].output_tokens, rows[r].n_output * sizeof(int32_t));
            g_last_history_n = rows[r].n_output;
            /* The "device" reads the history's gathered tokens where the step before sampled. */
            for (int32_t i = 0; i < num_hgathers; i++)
                if (hgathers[i].row == r) {
                    assert_int_equal(g_last_history[hgathers[i].index], 0); /* the placeholder */
                    g_last_history[hgathers[i].index] =
                        g_dev_tokens[hgathers[i].slot][hgathers[i].src_row];
                    g_history_gathers++;
                }
            if (r == 0 && g_nsub < 128) {
                memcpy(g_step_hist[g_nsub], g_last_history, rows[r].n_output * sizeof(int32_t));
                g_step_hist_n[g_nsub++] = rows[r].n_output;
            }
            if (r < ASYNC_ROWS) {
                memcpy(g_row_history[r], g_last_history, rows[r].n_output * sizeof(int32_t));
                g_row_history_n[r] = rows[r].n_output;
            }
        }
    }
    pthread_mutex_lock(&g_mu);
    for (int i = 0; i < BACKEND_STEP_SLOTS; i++)
        if (g_held[i] >= 0) {
            g_submits_behind++;
            break;
        }
    g_entered++;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
    /* The "device" computes now; the host learns it at completion. */
    g_res_broken[slot] = 0;
    for (int32_t r = 0; r < batch->num_logits; r++) {
        int32_t t = batch->logits_indices[r], pos = batch->positions[t];
        g_res_broken[slot] |= pos == g_break_pos;
        int fail = pos == g_fail_pos;
        g_res_codes[slot][r] = fail ? PAGODA_EINVAL : 0;
        g_res_tokens[slot][r] = fail ? -1 : next_token(tokens[t], pos);
        g_dev_tokens[slot][r] = fail ? 0 : g_res_tokens[slot][r];
    }
    g_held[slot] = batch->num_logits;
    g_submits++;
    return 0;
}

static int fake_complete(struct backend *b, int slot, int wait, int32_t *tokens, float *logprobs,
                         struct backend_row_error *row_errors, double *device_us)
{
    (void)b;
    if (g_held[slot] < 0)
        return pagoda_error_set(PAGODA_EINVAL, "fake: slot %d holds nothing", slot);
    pthread_mutex_lock(&g_mu);
    if (!g_gate_open && !wait) {
        pthread_mutex_unlock(&g_mu);
        return PAGODA_EBUSY;
    }
    while (!g_gate_open)
        pthread_cond_wait(&g_cv, &g_mu);
    g_completes++;
    pthread_mutex_unlock(&g_mu);
    int32_t n = g_held[slot];
    g_held[slot] = -1;
    if (g_res_broken[slot])
        return pagoda_error_set(PAGODA_ECUDA, "fake: the pass failed on the device");
    for (int32_t r = 0; r < n; r++) {
        tokens[r] = g_res_tokens[slot][r];
        logprobs[r] = 0.0f;
        row_errors[r].code = g_res_codes[slot][r];
        snprintf(row_errors[r].message, sizeof(row_errors[r].message), "%s",
                 g_res_codes[slot][r] ? "fake: NaN" : "");
    }
    *device_us = 1.0;
    return 0;
}

static int fake_health(struct backend *b)
{
    (void)b;
    return g_lost ? pagoda_error_set(PAGODA_ECUDA, "fake: the device context is lost") : 0;
}

static const struct backend_ops fake_async_ops = {
    .name = "fake-async",
    .forward = fake_forward,
    .forward_sample = fake_forward_sample,
    .close = fake_close,
    .submit = fake_submit,
    .complete = fake_complete,
    .health = fake_health,
};

static void gate(int open)
{
    pthread_mutex_lock(&g_mu);
    g_gate_open = open;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

/* ---- the harness: a loop, a mirror, an executor ------------------------------------------- */

#define MAX_RESULTS 128

struct got {
    uint64_t step_id;
    int rc, lost;
    char error[EXECUTOR_ERROR_MAX];
    int32_t num_rows;
    uint64_t seq_ids[8];
    int32_t tokens[8];
    int32_t codes[8];
    int32_t num_failed;
    uint64_t failed_ids[8];
};

struct h {
    uv_loop_t loop;
    struct backend *b;
    struct mirror *m;
    struct executor *e;
    struct got got[MAX_RESULTS];
    int n_got, idle_calls;
};

static void on_done(void *ctx, const struct executor_result *x)
{
    struct h *h = ctx;
    if (x == NULL) {
        h->idle_calls++;
        return;
    }
    assert_true(h->n_got < MAX_RESULTS);
    struct got *g = &h->got[h->n_got++];
    g->step_id = x->step_id;
    g->rc = x->rc;
    g->lost = x->lost;
    snprintf(g->error, sizeof(g->error), "%s", x->error);
    g->num_rows = x->num_rows;
    for (int32_t r = 0; r < x->num_rows; r++) {
        g->seq_ids[r] = x->seq_ids[r];
        g->tokens[r] = x->tokens[r];
        g->codes[r] = x->row_errors[r].code;
    }
    g->num_failed = x->num_failed;
    for (int32_t i = 0; i < x->num_failed; i++)
        g->failed_ids[i] = x->failed[i].seq_id;
    /* What the step loop does with a result. */
    if (x->rc != 0)
        mirror_step_break(h->m, x->step_id);
    else
        mirror_step_resolve(h->m, x->step_id, x->tokens, x->row_errors);
}

static int g_many_blocks; /* resync gives sequence 0 eight blocks (room for 60 steps) */
static int g_penalised;   /* resync's sequences carry a repetition penalty */

static int setup_with(void **state, const struct backend_ops *ops)
{
    struct h *h = calloc(1, sizeof(*h));
    assert_non_null(h);
    assert_int_equal(uv_loop_init(&h->loop), 0);
    h->b = calloc(1, sizeof(*h->b));
    h->b->ops = ops;
    for (int i = 0; i < BACKEND_STEP_SLOTS; i++)
        g_held[i] = -1;
    memset(g_dev_tokens, 0, sizeof(g_dev_tokens));
    g_submits = g_completes = g_submits_behind = 0;
    g_refuse_pos = -1;
    g_lost = 0;
    g_history_pending_seen = g_history_gathers = 0;
    g_sync_history_n = 0;
    memset(g_row_history_n, 0, sizeof(g_row_history_n));
    g_last_history_n = 0;
    g_penalised = 0;
    h->b->config.vocab_size = VOCAB;
    struct mirror_limits ml = {
        .max_seqs = 8,
        .max_tokens_per_seq = 64,
        .max_batched_tokens = 32,
        .num_blocks = 16,
        .block_size = BS,
        .vocab_size = VOCAB,
    };
    assert_int_equal(mirror_new(&ml, &h->m), 0);
    struct executor_limits el = {.max_num_tokens = 32, .max_num_seqs = 8};
    assert_int_equal(executor_open(&h->loop, h->b, &el, on_done, h, &h->e), 0);
    g_gate_open = 1;
    g_entered = 0;
    g_fail_pos = g_break_pos = -1;
    g_pending_seen = 0;
    *state = h;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, &fake_ops);
}

static int setup_async(void **state)
{
    return setup_with(state, &fake_async_ops);
}

static int teardown(void **state)
{
    struct h *h = *state;
    gate(1);
    executor_close(h->e);
    uv_run(&h->loop, UV_RUN_DEFAULT); /* the handle's close frees the executor */
    assert_int_equal(uv_loop_close(&h->loop), 0);
    mirror_free(h->m);
    backend_close(h->b);
    free(h);
    assert_int_equal(g_pending_seen, 0);
    assert_int_equal(g_history_pending_seen, 0);
    return 0;
}

/* Runs the loop until n results have come (bounded). */
static void wait_results(struct h *h, int n)
{
    for (int i = 0; i < WAIT_ITERATIONS && h->n_got < n; i++) {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        if (h->n_got < n)
            usleep(1000);
    }
    assert_int_equal(h->n_got, n);
}

static void wait_entered(int n)
{
    pthread_mutex_lock(&g_mu);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    while (g_entered < n && pthread_cond_timedwait(&g_cv, &g_mu, &until) == 0) {
    }
    int entered = g_entered;
    pthread_mutex_unlock(&g_mu);
    assert_true(entered >= n);
}

/* A resync holding sequences 1 and 2: 3 prompt tokens each, none computed, blocks 1 and 2. */
static void resync(struct h *h, uint64_t next_step)
{
    static int32_t tokens[2][3] = {{1, 2, 3}, {4, 5, 6}};
    static int32_t blocks[2][1] = {{1}, {2}};
    Pagoda__Internal__SequenceSnapshot sn[2], *ptrs[2];
    Pagoda__Internal__SamplingParams sp = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    sp.has_repetition_penalty = 1;
    sp.repetition_penalty = 1.5f;
    for (int i = 0; i < 2; i++) {
        pagoda__internal__sequence_snapshot__init(&sn[i]);
        if (g_penalised)
            sn[i].sampling = &sp;
        sn[i].has_seq_id = sn[i].has_num_prompt_tokens = sn[i].has_num_computed_tokens = 1;
        sn[i].seq_id = (uint64_t)i + 1;
        sn[i].token_ids = tokens[i];
        sn[i].n_token_ids = 3;
        sn[i].num_prompt_tokens = 3;
        sn[i].block_ids = blocks[i];
        sn[i].n_block_ids = 1;
        static int32_t many[8] = {1, 3, 4, 5, 6, 7, 8, 9};
        if (g_many_blocks && i == 0) {
            sn[i].block_ids = many;
            sn[i].n_block_ids = 8;
        }
        ptrs[i] = &sn[i];
    }
    Pagoda__Internal__Resync r = PAGODA__INTERNAL__RESYNC__INIT;
    r.has_epoch = r.has_next_step_id = r.has_resync_id = 1;
    r.epoch = 1;
    r.next_step_id = next_step;
    r.seqs = ptrs;
    r.n_seqs = 2;
    executor_discard(h->e); /* as the step loop does before it applies a resync */
    assert_int_equal(mirror_resync(h->m, &r), 0);
}

/* Step step_id continuing n sequences (ids), each from `computed` tokens by `chunk`; as the step
 * loop does: prepare, submit, commit pending. Returns prepare's or submit's error. */
static int step(struct h *h, uint64_t step_id, const uint64_t *ids, int n, int32_t computed,
                int32_t chunk, uint32_t delay_ms)
{
    Pagoda__Internal__ContinuingSequence cs[4], *ptrs[4];
    for (int i = 0; i < n; i++) {
        pagoda__internal__continuing_sequence__init(&cs[i]);
        cs[i].has_seq_id = cs[i].has_num_computed_tokens = cs[i].has_num_new_tokens = 1;
        cs[i].seq_id = ids[i];
        cs[i].num_computed_tokens = computed;
        cs[i].num_new_tokens = chunk;
        ptrs[i] = &cs[i];
    }
    Pagoda__Internal__Step s = PAGODA__INTERNAL__STEP__INIT;
    s.has_epoch = s.has_step_id = 1;
    s.epoch = 1;
    s.step_id = step_id;
    s.cont_seqs = ptrs;
    s.n_cont_seqs = (size_t)n;
    struct mirror_step ms;
    int rc = mirror_step_prepare(h->m, &s, &ms);
    if (rc != 0)
        return rc;
    if ((rc = executor_submit(h->e, 1, step_id, &ms, delay_ms)) != 0) {
        mirror_step_abort(h->m);
        return rc;
    }
    mirror_step_commit_pending(h->m);
    return 0;
}

static const uint64_t ONE[] = {1}, BOTH[] = {1, 2};

/* Three steps in flight at once: each decodes the token the one before sampled. */
static void test_order_and_pending_tokens(void **state)
{
    struct h *h = *state;
    resync(h, 10);
    gate(0);
    assert_int_equal(step(h, 10, ONE, 1, 0, 3, 0), 0); /* the prompt: samples at position 2 */
    wait_entered(1);
    assert_int_equal(step(h, 11, ONE, 1, 3, 1, 0), 0); /* decodes step 10's token */
    assert_int_equal(step(h, 12, ONE, 1, 4, 1, 0), 0); /* decodes step 11's */
    assert_int_equal(mirror_steps_in_flight(h->m), 3);
    struct mirror_seq_view v;
    assert_int_equal(mirror_find(h->m, 1, &v), 0);
    assert_int_equal(v.num_tokens, 6);
    assert_true(mirror_token_pending(v.token_ids[3]));
    gate(1);
    wait_results(h, 3);
    int32_t t = 3;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(h->got[i].step_id, 10 + i);
        assert_int_equal(h->got[i].rc, 0);
        assert_int_equal(h->got[i].num_rows, 1);
        t = next_token(t, 2 + i);
        assert_int_equal(h->got[i].tokens[0], t);
    }
    assert_int_equal(mirror_steps_in_flight(h->m), 0);
    assert_int_equal(mirror_find(h->m, 1, &v), 0);
    assert_int_equal(v.num_tokens, 6);
    assert_int_equal(v.token_ids[3], h->got[0].tokens[0]);
    assert_int_equal(v.token_ids[4], h->got[1].tokens[0]);
    assert_int_equal(v.token_ids[5], h->got[2].tokens[0]);
    assert_true(executor_idle(h->e));
    assert_true(h->idle_calls >= 1);
}

/* At most EXECUTOR_MAX_STEPS steps are held; the next is refused and changes nothing. */
static void test_queue_bound(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    gate(0);
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 0), 0);
    for (int i = 1; i < EXECUTOR_MAX_STEPS; i++)
        assert_int_equal(step(h, 1 + (uint64_t)i, ONE, 1, 3 + i - 1, 1, 0), 0);
    assert_int_equal(executor_held(h->e), EXECUTOR_MAX_STEPS);
    uint64_t next = 1 + EXECUTOR_MAX_STEPS;
    assert_int_equal(step(h, next, ONE, 1, 3 + EXECUTOR_MAX_STEPS - 1, 1, 0), PAGODA_EBUSY);
    assert_int_equal(mirror_next_step_id(h->m), next);
    gate(1);
    wait_results(h, EXECUTOR_MAX_STEPS);
    /* Room again. */
    assert_int_equal(step(h, next, ONE, 1, 3 + EXECUTOR_MAX_STEPS - 1, 1, 0), 0);
    wait_results(h, EXECUTOR_MAX_STEPS + 1);
    assert_int_equal(h->got[EXECUTOR_MAX_STEPS].rc, 0);
}

/* A resync's discard: the queued steps never run nor answer; the running one finishes. */
static void test_discard_on_resync(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    gate(0);
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 0), 0);
    wait_entered(1);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0);
    assert_int_equal(step(h, 3, ONE, 1, 4, 1, 0), 0);
    assert_int_equal(executor_discard(h->e), 2);
    assert_false(executor_idle(h->e)); /* step 1 still runs */
    gate(1);
    wait_results(h, 1);
    assert_int_equal(h->got[0].step_id, 1);
    for (int i = 0; i < 50; i++) {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(h->n_got, 1);
    assert_true(executor_idle(h->e));
    assert_int_equal(g_entered, 1);
    /* The resync replaces the mirror; steps run again from its next step. */
    resync(h, 7);
    assert_int_equal(step(h, 7, ONE, 1, 0, 3, 0), 0);
    wait_results(h, 2);
    assert_int_equal(h->got[1].step_id, 7);
    assert_int_equal(h->got[1].rc, 0);
}

/* A step waiting out its delay counts as not started: discard drops it at once. */
static void test_discard_interrupts_delay(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 60000), 0);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0);
    assert_int_equal(executor_discard(h->e), 2);
    for (int i = 0; i < WAIT_ITERATIONS && !executor_idle(h->e); i++) {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_true(executor_idle(h->e));
    assert_int_equal(h->n_got, 0);
    assert_int_equal(g_entered, 0);
}

/* Sequence 1's row fails in step 1: it fails in the queued step 2 too (whose input is that
 * token), and in step 3, formed by a scheduler that did not know yet; sequence 2 goes on. */
static void test_row_error_fails_queued_step(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    gate(0);
    g_fail_pos = 2; /* both prompts sample at position 2 ... */
    /* ... so give sequence 2 a head start: its prompt is computed in a step of its own. */
    assert_int_equal(step(h, 1, BOTH + 1, 1, 0, 3, 0), 0);
    gate(1);
    wait_results(h, 1);
    assert_int_equal(h->got[0].codes[0], PAGODA_EINVAL); /* sequence 2 at position 2 */
    /* Sequence 2 is gone; now sequence 1 samples at position 2 and fails, while step 2 waits. */
    g_fail_pos = 2;
    gate(0);
    assert_int_equal(step(h, 2, ONE, 1, 0, 3, 0), 0);
    wait_entered(2);
    assert_int_equal(step(h, 3, ONE, 1, 3, 1, 0), 0);
    gate(1);
    wait_results(h, 3);
    assert_int_equal(h->got[1].step_id, 2);
    assert_int_equal(h->got[1].codes[0], PAGODA_EINVAL);
    assert_int_equal(h->got[2].step_id, 3);
    assert_int_equal(h->got[2].seq_ids[0], 1);
    assert_int_equal(h->got[2].codes[0], PAGODA_EINVAL); /* failed through its input */
    assert_int_equal(h->got[2].tokens[0], -1);
    struct mirror_seq_view v;
    assert_int_equal(mirror_find(h->m, 1, &v), PAGODA_ENOENT);
    /* Step 4 still continues sequence 1: it fails there alone, the step is not refused. */
    assert_int_equal(step(h, 4, ONE, 1, 4, 1, 0), 0);
    wait_results(h, 4);
    assert_int_equal(h->got[3].rc, 0);
    assert_int_equal(h->got[3].num_rows, 0);
    assert_int_equal(h->got[3].num_failed, 1);
    assert_int_equal(h->got[3].failed_ids[0], 1);
}

/* A failing row drops its sequence only: the other one, held beside it, runs on. */
static void test_row_error_spares_others(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    assert_int_equal(step(h, 1, ONE, 1, 0, 2, 0), 0); /* sequence 1: 2 of 3 tokens, no row */
    wait_results(h, 1);
    g_fail_pos = 2;
    gate(0);
    assert_int_equal(step(h, 2, ONE, 1, 2, 1, 0), 0); /* samples at position 2: fails */
    wait_entered(2);
    assert_int_equal(step(h, 3, ONE, 1, 3, 1, 0), 0);
    gate(1);
    wait_results(h, 3);
    assert_int_equal(h->got[1].codes[0], PAGODA_EINVAL);
    assert_int_equal(h->got[2].codes[0], PAGODA_EINVAL);
    /* Sequence 2 is untouched and runs. */
    g_fail_pos = -1;
    uint64_t two[] = {2};
    assert_int_equal(step(h, 4, two, 1, 0, 3, 0), 0);
    wait_results(h, 4);
    assert_int_equal(h->got[3].codes[0], 0);
    assert_int_equal(h->got[3].tokens[0], next_token(6, 2));
}

/* A step that fails as a whole fails the queued step prepared from it; the mirror then refuses
 * steps until a resync. */
static void test_step_failure_fails_queued(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    gate(0);
    g_break_pos = 2;
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 0), 0);
    wait_entered(1);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0);
    gate(1);
    wait_results(h, 2);
    assert_int_not_equal(h->got[0].rc, 0);
    assert_int_equal(h->got[1].rc, PAGODA_EPROTO);
    assert_int_equal(g_entered, 1); /* step 2 never ran */
    assert_int_equal(step(h, 3, ONE, 1, 4, 1, 0), PAGODA_EPROTO);
    g_break_pos = -1;
    resync(h, 5);
    assert_int_equal(step(h, 5, ONE, 1, 0, 3, 0), 0);
    wait_results(h, 3);
    assert_int_equal(h->got[2].rc, 0);
}

/* Closing with a step in its delay and others queued returns at once and delivers nothing. */
static void test_close_with_steps_queued(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 60000), 0);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0);
    assert_int_equal(step(h, 3, ONE, 1, 4, 1, 0), 0);
    executor_close(h->e);
    h->e = NULL;
    uv_run(&h->loop, UV_RUN_DEFAULT);
    assert_int_equal(h->n_got, 0);
    assert_int_equal(g_entered, 0);
}

/* ---- asynchronous steps ---------------------------------------------------------------------- */

/* Step n + 1 is submitted while step n is held on the device; each decodes the token the one
 * before sampled (read on the device), and the results come in order. */
static void test_async_submits_behind(void **state)
{
    struct h *h = *state;
    resync(h, 10);
    gate(0);
    assert_int_equal(step(h, 10, ONE, 1, 0, 3, 0), 0);
    assert_int_equal(step(h, 11, ONE, 1, 3, 1, 0), 0);
    assert_int_equal(step(h, 12, ONE, 1, 4, 1, 0), 0);
    wait_entered(2); /* step 11 reached the device while step 10 had not ended */
    assert_int_equal(g_completes, 0);
    assert_true(g_submits_behind >= 1);
    gate(1);
    wait_results(h, 3);
    int32_t t = 3;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(h->got[i].step_id, 10 + i);
        assert_int_equal(h->got[i].rc, 0);
        t = next_token(t, 2 + i);
        assert_int_equal(h->got[i].tokens[0], t);
    }
    assert_int_equal(g_submits, 3);
    assert_int_equal(g_completes, 3);
    struct mirror_seq_view v;
    assert_int_equal(mirror_find(h->m, 1, &v), 0);
    assert_int_equal(v.num_tokens, 6);
    assert_int_equal(v.token_ids[5], h->got[2].tokens[0]);
    for (int i = 0; i < WAIT_ITERATIONS && !executor_idle(h->e); i++) {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_true(executor_idle(h->e));
}

/* A resync's discard with step 1 on the device and step 2 submitted behind it: both count as
 * running and are delivered; the queued step 3 is dropped. */
static void test_async_discard(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    gate(0);
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 0), 0);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0);
    wait_entered(2); /* the thread now waits for step 1's end: step 3 stays queued */
    assert_int_equal(step(h, 3, ONE, 1, 4, 1, 0), 0);
    assert_int_equal(executor_discard(h->e), 1);
    gate(1);
    wait_results(h, 2);
    assert_int_equal(h->got[0].step_id, 1);
    assert_int_equal(h->got[1].step_id, 2);
    for (int i = 0; i < 50; i++) {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(h->n_got, 2);
    assert_true(executor_idle(h->e));
    assert_int_equal(g_submits, 2);
}

/* Sequence 1's row fails in step 1 on the device: step 2, submitted behind it with that token
 * as its input, learns it on completion and fails sequence 1's row; sequence 2 goes on. */
static void test_async_row_error_fails_next(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    assert_int_equal(step(h, 1, BOTH + 1, 1, 0, 3, 0), 0); /* sequence 2's prompt alone */
    wait_results(h, 1);
    assert_int_equal(h->got[0].codes[0], 0);
    g_fail_pos = 2; /* sequence 1 samples at position 2 in step 2 */
    gate(0);
    assert_int_equal(step(h, 2, ONE, 1, 0, 3, 0), 0);
    assert_int_equal(step(h, 3, BOTH, 2, 3, 1, 0), 0); /* sequence 2 decodes from position 3 */
    wait_entered(3);
    gate(1);
    wait_results(h, 3);
    assert_int_equal(h->got[1].codes[0], PAGODA_EINVAL);
    assert_int_equal(h->got[2].step_id, 3);
    assert_int_equal(h->got[2].rc, 0);
    assert_int_equal(h->got[2].num_rows, 2);
    assert_int_equal(h->got[2].seq_ids[0], 1);
    assert_int_equal(h->got[2].codes[0], PAGODA_EINVAL); /* failed through its input */
    assert_int_equal(h->got[2].tokens[0], -1);
    assert_int_equal(h->got[2].codes[1], 0);
    assert_int_equal(h->got[2].tokens[1], next_token(h->got[0].tokens[0], 3));
    struct mirror_seq_view v;
    assert_int_equal(mirror_find(h->m, 1, &v), PAGODA_ENOENT);
}

/* Step 1, whose pass fails on the device (found on completion), and step 2 submitted behind it;
 * both results in. */
static void break_on_device(struct h *h)
{
    resync(h, 1);
    gate(0);
    g_break_pos = 2;
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 0), 0);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0);
    wait_entered(2);
    gate(1);
    wait_results(h, 2);
}

/* The pass of step 1 fails on the device, found on completion: step 2, already submitted behind
 * it, is reported not run; the mirror refuses steps until a resync. */
static void test_async_device_failure_fails_next(void **state)
{
    struct h *h = *state;
    break_on_device(h);
    assert_int_equal(h->got[0].rc, PAGODA_ECUDA);
    assert_int_equal(h->got[0].lost, 0);
    assert_int_equal(h->got[1].rc, PAGODA_EPROTO);
    assert_int_equal(h->got[1].lost, 0);
    assert_int_equal(step(h, 3, ONE, 1, 4, 1, 0), PAGODA_EPROTO);
    g_break_pos = -1;
    resync(h, 5);
    assert_int_equal(step(h, 5, ONE, 1, 0, 3, 0), 0);
    wait_results(h, 3);
    assert_int_equal(h->got[2].rc, 0);
}

/* The same failure after which the backend's health says its device is lost: the step says so
 * (lost, and why, after the pass's own error), and so does the step behind it, which was not run;
 * a failure the backend survives (the test above, health fine) is not lost. */
static void test_async_device_lost(void **state)
{
    struct h *h = *state;
    g_lost = 1;
    break_on_device(h);
    assert_int_equal(h->got[0].rc, PAGODA_ECUDA);
    assert_int_equal(h->got[0].lost, 1);
    assert_non_null(strstr(h->got[0].error, "the pass failed on the device"));
    assert_non_null(strstr(h->got[0].error, "the device context is lost"));
    assert_int_equal(h->got[1].lost, 1);
    g_break_pos = -1;
}

/* A penalised row whose history holds the token of the step still on the device: the step is
 * submitted behind it all the same, its history's token read on the device (a history gather,
 * 0 in its place on the host), and the sampler sees step 1's token there. */
static void test_async_penalised_history_gathered(void **state)
{
    struct h *h = *state;
    g_penalised = 1;
    resync(h, 1);
    gate(0);
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 0), 0);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0); /* its history holds step 1's token */
    wait_entered(2);                                  /* submitted while step 1 is held */
    gate(1);
    wait_results(h, 2);
    assert_int_equal(h->got[1].rc, 0);
    assert_int_equal(g_submits_behind, 1);
    assert_int_equal(g_history_pending_seen, 0);
    assert_int_equal(g_history_gathers, 1);
    assert_int_equal(g_last_history_n, 1);
    assert_int_equal(g_last_history[0], h->got[0].tokens[0]);
    assert_int_equal(h->got[1].tokens[0], next_token(h->got[0].tokens[0], 3));
}

/* Two penalised sequences whose rows swap between the steps: each row's history reads the token
 * its own sequence sampled in the step still on the device (row 0 of step 2 is row 1 of step
 * 1), not the token of the row with its number. */
static void test_async_penalised_histories_follow_rows(void **state)
{
    static const uint64_t swapped[2] = {2, 1};
    struct h *h = *state;
    g_penalised = 1;
    resync(h, 1);
    gate(0);
    assert_int_equal(step(h, 1, BOTH, 2, 0, 3, 0), 0);
    assert_int_equal(step(h, 2, swapped, 2, 3, 1, 0), 0);
    wait_entered(2);
    gate(1);
    wait_results(h, 2);
    assert_int_equal(h->got[1].rc, 0);
    assert_int_equal(g_submits_behind, 1);
    assert_int_equal(g_history_gathers, 2);
    assert_int_equal(h->got[0].seq_ids[0], 1);
    assert_int_equal(h->got[1].seq_ids[0], 2);
    assert_true(h->got[0].tokens[0] != h->got[0].tokens[1]); /* the test tells them apart */
    assert_int_equal(g_row_history_n[0], 1);
    assert_int_equal(g_row_history[0][0], h->got[0].tokens[1]); /* sequence 2's */
    assert_int_equal(g_row_history_n[1], 1);
    assert_int_equal(g_row_history[1][0], h->got[0].tokens[0]); /* sequence 1's */
    assert_int_equal(h->got[1].tokens[0], next_token(h->got[0].tokens[1], 3));
    assert_int_equal(h->got[1].tokens[1], next_token(h->got[0].tokens[0], 3));
}

/* The same history when the step behind is refused and runs synchronously: the history's
 * pending token is resolved on the host after all (the placeholder the gather left is undone). */
static void test_async_penalised_history_refused(void **state)
{
    struct h *h = *state;
    g_penalised = 1;
    resync(h, 1);
    g_refuse_pos = 3;
    gate(0);
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 0), 0);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0); /* refused: runs after step 1 */
    gate(1);
    wait_results(h, 2);
    assert_int_equal(h->got[1].rc, 0);
    assert_int_equal(h->got[1].tokens[0], next_token(h->got[0].tokens[0], 3));
    assert_int_equal(g_sync_history_n, 1);
    assert_int_equal(g_sync_history[0], h->got[0].tokens[0]);
}

/* A submission the backend refuses (as the sampler's host checks do) runs the step the
 * synchronous way, after the step before it, with its pending input resolved on the host; the
 * step behind it reads the token that synchronous step sampled (on the host: it left nothing
 * on the device). */
static void test_async_refused_runs_sync(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    g_refuse_pos = 3;
    gate(0);
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 0), 0);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0); /* samples at position 3: refused */
    assert_int_equal(step(h, 3, ONE, 1, 4, 1, 0), 0); /* decodes step 2's token */
    gate(1);
    wait_results(h, 3);
    assert_int_equal(g_submits, 2);
    assert_int_equal(h->got[1].rc, 0);
    assert_int_equal(h->got[1].tokens[0], next_token(h->got[0].tokens[0], 3));
    assert_int_equal(h->got[2].rc, 0);
    assert_int_equal(h->got[2].tokens[0], next_token(h->got[1].tokens[0], 4));
}

/* A row that fails on the device in step 1, with steps 2 and 3 submitted behind it before its
 * failure is known: the sequence fails in both, each from the step before. */
static void test_async_failure_chain_of_three(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    gate(0);
    g_fail_pos = 2;
    assert_int_equal(step(h, 1, ONE, 1, 0, 3, 0), 0);
    assert_int_equal(step(h, 2, ONE, 1, 3, 1, 0), 0);
    assert_int_equal(step(h, 3, ONE, 1, 4, 1, 0), 0);
    wait_entered(2);
    gate(1);
    wait_results(h, 3);
    assert_int_equal(h->got[1].codes[0], PAGODA_EINVAL);
    assert_int_equal(h->got[2].codes[0], PAGODA_EINVAL);
}

/* Two rows of one step read on the device by the next: each gets its own row's token. */
static void test_async_gathers_two_rows(void **state)
{
    struct h *h = *state;
    resync(h, 1);
    gate(0);
    assert_int_equal(step(h, 1, BOTH, 2, 0, 3, 0), 0);
    assert_int_equal(step(h, 2, BOTH, 2, 3, 1, 0), 0);
    wait_entered(2);
    gate(1);
    wait_results(h, 2);
    for (int r = 0; r < 2; r++)
        assert_int_equal(h->got[1].tokens[r], next_token(h->got[0].tokens[r], 3));
    assert_true(g_submits_behind >= 1);
}

/* Sixty decode steps of a penalised sequence, 4 in flight, each step slot used 15 times (the
 * executor's history cache, worker/history_cache.h, copies only a history's tail after the
 * first): each history a pass reads equals the tokens sampled before it. A cache that did not
 * copy the tail again would leave the 0 of an earlier device gather in place. (By a review of
 * the twenty-second session.) */
static void test_long_penalised(void **state)
{
    struct h *h = *state;
    g_penalised = 1;
    g_many_blocks = 1;
    resync(h, 1);
    g_many_blocks = 0;
    g_nsub = 0;
    int32_t computed = 0;
    uint64_t id = 1;
    for (int batch = 0; batch < 15; batch++) {
        for (int k = 0; k < 4; k++) {
            int32_t chunk = computed == 0 ? 3 : 1;
            assert_int_equal(step(h, id++, ONE, 1, computed, chunk, 0), 0);
            computed += chunk;
        }
        wait_results(h, (int)id - 1);
    }
    int checked = 0;
    for (int i = 0; i < h->n_got; i++) {
        assert_int_equal(h->got[i].rc, 0);
        assert_int_equal(h->got[i].codes[0], 0);
    }
    for (int i = 0; i < g_nsub; i++) {
        size_t n = g_step_hist_n[i];
        for (size_t k = 0; k < n; k++)
            assert_int_equal(g_step_hist[i][k], h->got[k].tokens[0]);
        checked++;
    }
    print_message("checked %d histories, submits %d, gathers %d\n", checked, g_submits,
                  g_history_gathers);
    assert_true(checked > 30);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_order_and_pending_tokens, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_bound, setup, teardown),
        cmocka_unit_test_setup_teardown(test_discard_on_resync, setup, teardown),
        cmocka_unit_test_setup_teardown(test_discard_interrupts_delay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_row_error_fails_queued_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_row_error_spares_others, setup, teardown),
        cmocka_unit_test_setup_teardown(test_step_failure_fails_queued, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_with_steps_queued, setup, teardown),
        cmocka_unit_test_setup_teardown(test_order_and_pending_tokens, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_async_failure_chain_of_three, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_async_gathers_two_rows, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_async_discard, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_close_with_steps_queued, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_async_submits_behind, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_async_row_error_fails_next, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_async_device_failure_fails_next, setup_async,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_async_device_lost, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_async_penalised_history_gathered, setup_async,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_async_penalised_history_refused, setup_async,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_async_penalised_histories_follow_rows, setup_async,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_async_refused_runs_sync, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_long_penalised, setup_async, teardown),
        cmocka_unit_test_setup_teardown(test_long_penalised, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
