/* Tests of worker/step_loop.c: the worker's answers in order around its executor. A Resync that
 * arrives while a step runs waits for it without blocking the loop (the running step is
 * answered first, the queued one is discarded and never answered), and the messages behind the
 * Resync are handled after it, in order. A sequence the worker failed (a NaN row) and the step
 * sent behind still continues fails alone there, the rest of that step runs. A fake backend
 * holds a pass on a gate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "worker/step_loop.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB 100
#define WAIT_ITERATIONS 5000 /* x 1 ms */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER;
static int g_gate_open = 1, g_entered;
static int g_lose;                  /* fake_forward_sample fails, and lost_health says so */
static int g_lost_calls, g_lost_rc; /* step_loop_options.lost */
static char g_lost_why[256];

static int fake_forward(struct backend *b, const struct fwd_batch *batch, float *logits)
{
    (void)b;
    (void)batch;
    (void)logits;
    return pagoda_error_set(PAGODA_EINTERNAL, "fake: not used");
}

static int fake_forward_sample(struct backend *b, const struct fwd_batch *batch,
                               const struct sample_row *rows, int32_t *tokens, float *logprobs)
{
    (void)b;
    (void)rows;
    pthread_mutex_lock(&g_mu);
    g_entered++;
    pthread_cond_broadcast(&g_cv);
    while (!g_gate_open)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    if (g_lose)
        return pagoda_error_set(PAGODA_ECUDA, "fake: an illegal address");
    for (int32_t r = 0; r < batch->num_logits; r++) {
        tokens[r] = 7;
        logprobs[r] = 0.0f;
    }
    return 0;
}

/* lost_ops: after a failed pass, health says the device context is lost while g_lose is set. */
static int lost_health(struct backend *b)
{
    (void)b;
    return g_lose ? pagoda_error_set(PAGODA_ECUDA, "fake: the device context is lost") : 0;
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

/* A token whose logits row is NaN (a broken model's row): the host sampler cannot sample it. */
#define POISON 66

/* Logits on the host (the CPU sampler draws): token 7 wins each row, except a row whose input
 * token is POISON, which is NaN. Held on the gate like fake_forward_sample. */
static int nan_forward(struct backend *b, const struct fwd_batch *batch, float *logits)
{
    (void)b;
    pthread_mutex_lock(&g_mu);
    g_entered++;
    pthread_cond_broadcast(&g_cv);
    while (!g_gate_open)
        pthread_cond_wait(&g_cv, &g_mu);
    pthread_mutex_unlock(&g_mu);
    for (int32_t r = 0; r < batch->num_logits; r++) {
        float *row = logits + (size_t)r * VOCAB;
        int poisoned = batch->token_ids[batch->logits_indices[r]] == POISON;
        for (int32_t t = 0; t < VOCAB; t++)
            row[t] = poisoned ? NAN : (t == 7 ? 10.0f : 0.0f);
    }
    return 0;
}

static const struct backend_ops lost_ops = {
    .name = "fake-lost",
    .forward = fake_forward,
    .forward_sample = fake_forward_sample,
    .close = fake_close,
    .health = lost_health,
};

static const struct backend_ops nan_ops = {
    .name = "fake-nan",
    .forward = nan_forward,
    .close = fake_close,
};

static void gate(int open)
{
    pthread_mutex_lock(&g_mu);
    g_gate_open = open;
    pthread_cond_broadcast(&g_cv);
    pthread_mutex_unlock(&g_mu);
}

static void wait_entered(int n)
{
    for (int i = 0; i < WAIT_ITERATIONS; i++) {
        pthread_mutex_lock(&g_mu);
        int e = g_entered;
        pthread_mutex_unlock(&g_mu);
        if (e >= n)
            return;
        usleep(1000);
    }
    fail_msg("the backend never ran %d passes", n);
}

/* What the step loop sent, in order. */
#define MAX_KEPT_RESULTS 4
struct kept_result {
    uint64_t seq_id;
    int32_t error_code; /* 0: token */
    int32_t token;
    char message[128];
};

struct sent {
    int kind; /* 'S': StepResult, 'R': ResyncDone, 'H': Hello */
    uint64_t id;
    int32_t error_code;
    size_t n_results;
    struct kept_result results[MAX_KEPT_RESULTS]; /* the first ones */
    uint64_t steps_run;
    double wall_us_total, step_wall_us, step_device_us;
};

struct h {
    uv_loop_t loop;
    struct backend *b;
    struct step_loop *sl;
    struct sent sent[32];
    int n_sent;
};

static void on_send(void *ctx, Pagoda__Internal__ToScheduler *msg, const char *what)
{
    (void)what;
    struct h *h = ctx;
    assert_true(h->n_sent < 32);
    struct sent *s = &h->sent[h->n_sent++];
    if (msg->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESULT) {
        s->kind = 'S';
        s->id = msg->result->step_id;
        s->error_code = msg->result->has_error_code ? msg->result->error_code : 0;
        s->n_results = msg->result->n_results;
        for (size_t i = 0; i < s->n_results && i < MAX_KEPT_RESULTS; i++) {
            const Pagoda__Internal__SeqResult *r = msg->result->results[i];
            struct kept_result *k = &s->results[i];
            k->seq_id = r->seq_id;
            k->error_code = r->has_error_code ? r->error_code : 0;
            k->token = r->has_token_id ? r->token_id : -1;
            snprintf(k->message, sizeof(k->message), "%s",
                     r->error_message != NULL ? r->error_message : "");
        }
        s->steps_run = msg->result->has_steps_run ? msg->result->steps_run : 0;
        s->wall_us_total = msg->result->wall_us_total;
        s->step_wall_us = msg->result->has_step_wall_us ? msg->result->step_wall_us : -1;
        s->step_device_us = msg->result->has_step_device_us ? msg->result->step_device_us : -1;
    } else {
        assert_int_equal(msg->msg_case, PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESYNC_DONE);
        s->kind = 'R';
        s->id = msg->resync_done->resync_id;
        s->error_code = msg->resync_done->has_error_code ? msg->resync_done->error_code : 0;
    }
}

static void on_hello(void *ctx)
{
    struct h *h = ctx;
    h->sent[h->n_sent++].kind = 'H';
}

static void on_lost(void *ctx, int rc, const char *why)
{
    (void)ctx;
    g_lost_calls++;
    g_lost_rc = rc;
    snprintf(g_lost_why, sizeof(g_lost_why), "%s", why);
}

static int setup_with(void **state, const struct backend_ops *ops)
{
    struct h *h = calloc(1, sizeof(*h));
    assert_int_equal(uv_loop_init(&h->loop), 0);
    h->b = calloc(1, sizeof(*h->b));
    h->b->ops = ops;
    h->b->config.vocab_size = VOCAB;
    struct step_loop_options o = {
        .mirror = {.max_seqs = 4,
                   .max_tokens_per_seq = 32,
                   .max_batched_tokens = 16,
                   .num_blocks = 8,
                   .block_size = 8,
                   .vocab_size = VOCAB},
        .pool_id = 77,
        .send = on_send,
        .send_hello = on_hello,
        .lost = ops == &lost_ops ? on_lost : NULL,
        .ctx = h,
    };
    assert_int_equal(step_loop_open(&h->loop, h->b, &o, &h->sl), 0);
    g_gate_open = 1;
    g_entered = 0;
    g_lose = g_lost_calls = g_lost_rc = 0;
    *state = h;
    return 0;
}

static int setup(void **state)
{
    return setup_with(state, &fake_ops);
}

static int setup_nan(void **state)
{
    return setup_with(state, &nan_ops);
}

static int setup_lost(void **state)
{
    return setup_with(state, &lost_ops);
}

static int teardown(void **state)
{
    struct h *h = *state;
    gate(1);
    step_loop_close(h->sl);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&h->loop), 0);
    backend_close(h->b);
    free(h);
    return 0;
}

/* A ToWorker as wire_unpack would give it: the step loop takes and frees it. */
static Pagoda__Internal__ToWorker *resync_msg(uint64_t resync_id, uint64_t next_step)
{
    static int32_t tokens[] = {1, 2, 3}, blocks[] = {1};
    Pagoda__Internal__SequenceSnapshot sn = PAGODA__INTERNAL__SEQUENCE_SNAPSHOT__INIT, *ptr = &sn;
    sn.has_seq_id = sn.has_num_prompt_tokens = sn.has_num_computed_tokens = 1;
    sn.seq_id = 1;
    sn.token_ids = tokens;
    sn.n_token_ids = 3;
    sn.num_prompt_tokens = 3;
    sn.block_ids = blocks;
    sn.n_block_ids = 1;
    Pagoda__Internal__Resync r = PAGODA__INTERNAL__RESYNC__INIT;
    r.has_epoch = r.has_next_step_id = r.has_resync_id = r.has_pool_id = 1;
    r.epoch = 1;
    r.resync_id = resync_id;
    r.next_step_id = next_step;
    r.pool_id = 77;
    r.seqs = &ptr;
    r.n_seqs = 1;
    Pagoda__Internal__ToWorker m = PAGODA__INTERNAL__TO_WORKER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC;
    m.resync = &r;
    uint8_t buf[512];
    size_t n = pagoda__internal__to_worker__pack(&m, buf);
    return pagoda__internal__to_worker__unpack(NULL, n, buf);
}

static Pagoda__Internal__ToWorker *step_msg(uint64_t step_id, int32_t computed, int32_t chunk)
{
    Pagoda__Internal__ContinuingSequence c = PAGODA__INTERNAL__CONTINUING_SEQUENCE__INIT, *ptr = &c;
    c.has_seq_id = c.has_num_computed_tokens = c.has_num_new_tokens = 1;
    c.seq_id = 1;
    c.num_computed_tokens = computed;
    c.num_new_tokens = chunk;
    Pagoda__Internal__Step s = PAGODA__INTERNAL__STEP__INIT;
    s.has_epoch = s.has_step_id = 1;
    s.epoch = 1;
    s.step_id = step_id;
    s.cont_seqs = &ptr;
    s.n_cont_seqs = 1;
    Pagoda__Internal__ToWorker m = PAGODA__INTERNAL__TO_WORKER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_WORKER__MSG_STEP;
    m.step = &s;
    uint8_t buf[512];
    size_t n = pagoda__internal__to_worker__pack(&m, buf);
    return pagoda__internal__to_worker__unpack(NULL, n, buf);
}

/* A resync to sequences 1 (tokens 1 2 3) and 2 (tokens 4 5 POISON), nothing computed. */
static Pagoda__Internal__ToWorker *resync_two_msg(uint64_t resync_id, uint64_t next_step)
{
    static int32_t t1[] = {1, 2, 3}, t2[] = {4, 5, POISON}, b1[] = {1}, b2[] = {2};
    Pagoda__Internal__SequenceSnapshot sn[2], *ptrs[2];
    for (int i = 0; i < 2; i++) {
        pagoda__internal__sequence_snapshot__init(&sn[i]);
        sn[i].has_seq_id = sn[i].has_num_prompt_tokens = sn[i].has_num_computed_tokens = 1;
        sn[i].seq_id = (uint64_t)i + 1;
        sn[i].token_ids = i == 0 ? t1 : t2;
        sn[i].n_token_ids = 3;
        sn[i].num_prompt_tokens = 3;
        sn[i].block_ids = i == 0 ? b1 : b2;
        sn[i].n_block_ids = 1;
        ptrs[i] = &sn[i];
    }
    Pagoda__Internal__Resync r = PAGODA__INTERNAL__RESYNC__INIT;
    r.has_epoch = r.has_next_step_id = r.has_resync_id = r.has_pool_id = 1;
    r.epoch = 1;
    r.resync_id = resync_id;
    r.next_step_id = next_step;
    r.pool_id = 77;
    r.seqs = ptrs;
    r.n_seqs = 2;
    Pagoda__Internal__ToWorker m = PAGODA__INTERNAL__TO_WORKER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC;
    m.resync = &r;
    uint8_t buf[512];
    size_t n = pagoda__internal__to_worker__pack(&m, buf);
    return pagoda__internal__to_worker__unpack(NULL, n, buf);
}

/* A step continuing sequences 1 and 2 (n of them, from 1) with computed and chunk each. */
static Pagoda__Internal__ToWorker *step_two_msg(uint64_t step_id, int n, int32_t computed,
                                                int32_t chunk)
{
    Pagoda__Internal__ContinuingSequence c[2], *ptrs[2];
    for (int i = 0; i < n; i++) {
        pagoda__internal__continuing_sequence__init(&c[i]);
        c[i].has_seq_id = c[i].has_num_computed_tokens = c[i].has_num_new_tokens = 1;
        c[i].seq_id = (uint64_t)i + 1;
        c[i].num_computed_tokens = computed;
        c[i].num_new_tokens = chunk;
        ptrs[i] = &c[i];
    }
    Pagoda__Internal__Step s = PAGODA__INTERNAL__STEP__INIT;
    s.has_epoch = s.has_step_id = 1;
    s.epoch = 1;
    s.step_id = step_id;
    s.cont_seqs = ptrs;
    s.n_cont_seqs = (size_t)n;
    Pagoda__Internal__ToWorker m = PAGODA__INTERNAL__TO_WORKER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_WORKER__MSG_STEP;
    m.step = &s;
    uint8_t buf[512];
    size_t n_packed = pagoda__internal__to_worker__pack(&m, buf);
    return pagoda__internal__to_worker__unpack(NULL, n_packed, buf);
}

static void run_until_sent(struct h *h, int n)
{
    for (int i = 0; i < WAIT_ITERATIONS && h->n_sent < n; i++) {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        if (h->n_sent < n)
            usleep(1000);
    }
    assert_int_equal(h->n_sent, n);
}

/* Steps are answered in order, two in flight at once. */
static void test_two_steps_in_flight(void **state)
{
    struct h *h = *state;
    step_loop_handle(h->sl, resync_msg(1, 5));
    assert_int_equal(h->n_sent, 2); /* Hello (a new epoch), ResyncDone */
    gate(0);
    step_loop_handle(h->sl, step_msg(5, 0, 3));
    wait_entered(1);
    step_loop_handle(h->sl, step_msg(6, 3, 1)); /* prepared while step 5 runs */
    assert_int_equal(h->n_sent, 2);             /* the loop answered nothing yet, never waited */
    gate(1);
    run_until_sent(h, 4);
    assert_int_equal(h->sent[2].kind, 'S');
    assert_int_equal(h->sent[2].id, 5);
    assert_int_equal(h->sent[2].error_code, 0);
    assert_int_equal(h->sent[3].id, 6);
    assert_int_equal(h->sent[3].error_code, 0);
    assert_int_equal(h->sent[3].n_results, 1);
    /* The worker's step timing travels with each result: cumulative, then the step's own (the
     * fake backend has no device: its device time is the executor thread's CPU time). */
    assert_int_equal(h->sent[2].steps_run, 1);
    assert_int_equal(h->sent[3].steps_run, 2);
    assert_true(h->sent[2].step_wall_us > 0 && h->sent[2].step_device_us >= 0);
    assert_true(h->sent[3].wall_us_total >= h->sent[2].step_wall_us + h->sent[3].step_wall_us - 1);
    struct step_loop_stats st;
    step_loop_stats(h->sl, &st);
    assert_int_equal(st.steps_run, 2);
    assert_int_equal(st.computed_tokens, 4);
}

/* Step 5 running (held on the gate), step 6 waiting behind it, then a Resync (held: step 5
 * runs) and step 9 held behind it. */
static void resync_behind_two_steps(struct h *h)
{
    step_loop_handle(h->sl, resync_msg(1, 5));
    gate(0);
    step_loop_handle(h->sl, step_msg(5, 0, 3));
    wait_entered(1);
    step_loop_handle(h->sl, step_msg(6, 3, 1));
    step_loop_handle(h->sl, resync_msg(2, 9));
    step_loop_handle(h->sl, step_msg(9, 0, 3));
}

/* A Resync while step 5 runs and step 6 waits: step 5 is answered, step 6 never, then the
 * ResyncDone; a Step behind the Resync is handled after it, from the new snapshot. */
static void test_resync_waits_for_the_running_step(void **state)
{
    struct h *h = *state;
    resync_behind_two_steps(h);
    assert_int_equal(h->n_sent, 2);
    gate(1);
    run_until_sent(h, 5);
    assert_int_equal(h->sent[2].kind, 'S');
    assert_int_equal(h->sent[2].id, 5);
    assert_int_equal(h->sent[3].kind, 'R');
    assert_int_equal(h->sent[3].id, 2);
    assert_int_equal(h->sent[3].error_code, 0);
    assert_int_equal(h->sent[4].kind, 'S');
    assert_int_equal(h->sent[4].id, 9);
    assert_int_equal(h->sent[4].error_code, 0);
    for (int i = 0; i < 50; i++) {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(h->n_sent, 5); /* step 6 is never answered */
    assert_int_equal(g_entered, 2); /* steps 5 and 9 ran, 6 did not */
}

/* The result of sequence seq_id in sent message k. */
static const struct kept_result *result_of(const struct h *h, int k, uint64_t seq_id)
{
    const struct sent *s = &h->sent[k];
    for (size_t i = 0; i < s->n_results && i < MAX_KEPT_RESULTS; i++)
        if (s->results[i].seq_id == seq_id)
            return &s->results[i];
    fail_msg("message %d has no result for sequence %llu", k, (unsigned long long)seq_id);
    return NULL;
}

/* Step 5 fails sequence 2 alone (its row is NaN). Step 6, which continues both (the scheduler
 * sent it before it saw the failure), is not refused: sequence 2 fails alone there too, with a
 * message naming the earlier failure, and sequence 1 gets its token; step 7 continues sequence 1
 * alone. Step 6 arrives while step 5 runs (its input for sequence 2 is step 5's failed row) or,
 * with `late`, after step 5's result (the mirror has dropped sequence 2 and remembers why). */
static void expect_failed_sequence_fails_alone(struct h *h, int late)
{
    step_loop_handle(h->sl, resync_two_msg(1, 5));
    assert_int_equal(h->n_sent, 2); /* Hello, ResyncDone */
    assert_int_equal(h->sent[1].error_code, 0);
    gate(0);
    step_loop_handle(h->sl, step_two_msg(5, 2, 0, 3));
    wait_entered(1);
    if (!late)
        step_loop_handle(h->sl, step_two_msg(6, 2, 3, 1));
    gate(1);
    if (late) {
        run_until_sent(h, 3);
        step_loop_handle(h->sl, step_two_msg(6, 2, 3, 1));
    }
    run_until_sent(h, 4);
    /* Step 5: sequence 1's token, sequence 2's error. */
    assert_int_equal(h->sent[2].id, 5);
    assert_int_equal(h->sent[2].error_code, 0);
    assert_int_equal(h->sent[2].n_results, 2);
    assert_int_equal(result_of(h, 2, 1)->token, 7);
    const struct kept_result *r = result_of(h, 2, 2);
    assert_int_not_equal(r->error_code, 0);
    int32_t code = r->error_code;
    /* Step 6: run, not refused; sequence 2 fails alone, naming step 5's failure. */
    assert_int_equal(h->sent[3].kind, 'S');
    assert_int_equal(h->sent[3].id, 6);
    assert_int_equal(h->sent[3].error_code, 0);
    assert_int_equal(h->sent[3].n_results, 2);
    assert_int_equal(result_of(h, 3, 1)->error_code, 0);
    assert_int_equal(result_of(h, 3, 1)->token, 7);
    r = result_of(h, 3, 2);
    assert_int_equal(r->error_code, code);
    if (strstr(r->message, "step 5") == NULL)
        fail_msg("sequence 2's error in step 6 does not name step 5: \"%s\"", r->message);
    /* Step 7 continues sequence 1 alone (the scheduler has ended sequence 2). */
    step_loop_handle(h->sl, step_two_msg(7, 1, 4, 1));
    run_until_sent(h, 5);
    assert_int_equal(h->sent[4].id, 7);
    assert_int_equal(h->sent[4].error_code, 0);
    assert_int_equal(h->sent[4].n_results, 1);
    assert_int_equal(result_of(h, 4, 1)->token, 7);
    struct step_loop_stats st;
    step_loop_stats(h->sl, &st);
    assert_int_equal(st.steps_refused, 0);
    assert_int_equal(st.steps_run, 3);
}

static void test_failed_sequence_fails_alone_behind_its_step(void **state)
{
    expect_failed_sequence_fails_alone(*state, 0);
}

static void test_failed_sequence_fails_alone_after_its_result(void **state)
{
    expect_failed_sequence_fails_alone(*state, 1);
}

/* Closing with a step running and others queued and held frees everything (ASan build). */
static void test_close_with_work_in_flight(void **state)
{
    struct h *h = *state;
    step_loop_handle(h->sl, resync_msg(1, 5));
    step_loop_handle(h->sl, step_msg(5, 0, 3));
    step_loop_handle(h->sl, step_msg(6, 3, 1));
    step_loop_handle(h->sl, resync_msg(2, 9));
    step_loop_handle(h->sl, step_msg(9, 0, 3));
}

/* Step 5 fails and the backend says its device is lost while step 6 waits behind it and a
 * Resync and step 9 are held: options.lost is told once, with both errors, and nothing more is
 * answered: no StepResult (an error result would send the scheduler looking for a culprit), no
 * ResyncDone, nothing for a message that comes later. */
static void test_lost_device_answers_nothing(void **state)
{
    struct h *h = *state;
    resync_behind_two_steps(h);
    g_lose = 1;
    gate(1);
    for (int i = 0; i < WAIT_ITERATIONS && g_lost_calls == 0; i++) {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    step_loop_handle(h->sl, resync_msg(3, 11));
    for (int i = 0; i < 50; i++) {
        uv_run(&h->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(g_lost_calls, 1);
    assert_true(g_lost_rc != 0);
    assert_non_null(strstr(g_lost_why, "the device context is lost"));
    assert_int_equal(h->n_sent, 2); /* the first Hello and ResyncDone only */
    assert_int_equal(g_entered, 1); /* step 6 did not run; the held Resync was not applied */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_steps_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_resync_waits_for_the_running_step, setup, teardown),
        cmocka_unit_test_setup_teardown(test_close_with_work_in_flight, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lost_device_answers_nothing, setup_lost, teardown),
        cmocka_unit_test_setup_teardown(test_failed_sequence_fails_alone_behind_its_step, setup_nan,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_failed_sequence_fails_alone_after_its_result,
                                        setup_nan, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
