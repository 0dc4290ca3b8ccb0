/* Tests of the scheduler (scheduler/scheduler.c, scheduler_step.c, scheduler_router.c,
 * scheduler_cache.c): the state machine driven by the fake worker of scheduler_harness.c. */
#include "scheduler_harness.h"

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
    /* The router learns the model's context from the worker's Hello. */
    assert_int_equal(h->model_infos, 1);
    assert_int_equal(h->model_positions, h->hello.max_positions);
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
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
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
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
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

/* min_tokens: the worker is sent the ids to suppress (the EOS ids, also with ignore_eos, then the
 * stop ids, each once) and the logit bias; and no EOS or stop id ends a request within its first
 * min_tokens tokens (the fake worker does not suppress them, so the scheduler's check is what
 * is tested). */
static void test_min_tokens_defers_stops(void **state)
{
    (void)state;
    int32_t p1[6], r1[8];
    prompt_with_distinct_outputs(10, p1, 6, r1);
    struct setup su = DEFAULT_SETUP;
    su.eos = r1[2];
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
    int32_t bias_ids[] = {3, 4};
    float bias_values[] = {1.0f, -2.0f};
    h->min_tokens = 4;
    h->bias_ids = bias_ids;
    h->bias_values = bias_values;
    h->n_bias = 2;
    int32_t stop_a[2] = {r1[5], su.eos}; /* the EOS id again: sent once */
    struct req_rec *a = submit_full(h, 1, p1, 6, 7, stop_a, 2, false);
    Pagoda__Internal__ToWorker *m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_STEP);
    assert_int_equal(m->step->n_new_seqs, 1);
    const Pagoda__Internal__SamplingParams *sp = m->step->new_seqs[0]->sampling;
    assert_true(sp->has_min_tokens && sp->min_tokens == 4);
    assert_int_equal(sp->n_min_tokens_stop_ids, 2);
    assert_int_equal(sp->min_tokens_stop_ids[0], su.eos);
    assert_int_equal(sp->min_tokens_stop_ids[1], r1[5]);
    assert_int_equal(sp->n_logit_bias_token_ids, 2);
    assert_true(sp->logit_bias_token_ids[1] == 4 && sp->logit_bias_values[1] == -2.0f);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    pump(h);
    /* A: EOS at index 2 is within min_tokens 4, r1[5] (a stop id) at index 5 ends it */
    expect_output(a, p1, 6, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP);
    harness_close(h);

    /* ignore_eos: the EOS ids are suppressed all the same (vLLM's _all_stop_token_ids hold the
     * EOS whatever ignore_eos says: a benchmark's ignore_eos with min_tokens = max_tokens must
     * not see an EOS among its tokens), then the stop ids */
    h = harness_open(&su);
    h->min_tokens = 2;
    int32_t stop_b[1] = {r1[1]};
    struct req_rec *b = submit_full(h, 2, p1, 6, 0, stop_b, 1, true);
    m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_STEP);
    sp = m->step->new_seqs[0]->sampling;
    assert_int_equal(sp->n_min_tokens_stop_ids, 2);
    assert_int_equal(sp->min_tokens_stop_ids[0], su.eos);
    assert_int_equal(sp->min_tokens_stop_ids[1], r1[1]);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    pump(h);
    /* B (ignore_eos): its stop id at index 1 is within min_tokens 2; the EOS does not stop it;
     * nothing else does before the context: it ends by length */
    assert_true(b->n_out > 2);
    for (int i = 0; i < b->n_out && i < 8; i++)
        assert_int_equal(b->out[i], r1[i]);
    harness_close(h);

    /* and without min_tokens the same stop id ends B at once */
    h = harness_open(&su);
    struct req_rec *c = submit_full(h, 3, p1, 6, 0, stop_b, 1, true);
    pump(h);
    expect_output(c, p1, 6, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP);
    harness_close(h);
}

/* A request cancelled while a step that writes its blocks is in flight keeps them out of the
 * free list until that step's result arrives; the next step tells the worker. */
static void test_blocks_freed_after_ack(void **state)
{
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
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
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
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
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    su.step_timeout_per_token_us = -1; /* the fixed timeout alone */
    struct harness *h = harness_open(&su);
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
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    su.step_timeout_per_token_us = -1; /* the fixed timeout alone */
    struct harness *h = harness_open(&su);
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
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
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
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
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
    su.max_steps_in_flight = 1; /* lock-step: step 4 is the one the resync overtakes */
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

/* strict_max_tokens against the context the scheduler serves: with a pool of 32 tokens under a
 * model of 64 positions, a prompt of 10 with max_tokens 23 (33) is refused with the figures at its
 * Submit, while another request holds the one running place (the admission checks again); with 22
 * (32) it is served all 22; without the flag, 23 ends by length at the context (22 tokens). */
static void test_strict_max_tokens_against_the_pool(void **state)
{
    struct setup su = DEFAULT_SETUP;
    su.num_blocks = 1 + 4; /* 32 tokens */
    su.max_positions = 64;
    su.max_seqs = 1;
    struct harness *h = harness_open(&su);
    int32_t p[10];
    make_prompt(81, 10, p);
    h->strict_max_tokens = true;
    struct req_rec *fits = submit(h, 2, p, 10, 22); /* takes the one running place */
    struct req_rec *over = submit(h, 1, p, 10, 23);
    /* refused at its Submit, not after its wait for the running place */
    assert_int_equal(over->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(over->error_code, PAGODA_ERANGE);
    assert_int_equal(over->n_out, 0);
    assert_int_equal(fits->ends, 0);
    pump(h);
    expect_output(fits, p, 10, 22, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(over->n_out, 0);
    h->strict_max_tokens = false;
    struct req_rec *loose = submit(h, 3, p, 10, 23);
    pump(h);
    expect_output(loose, p, 10, 22, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
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
    rec_index_add(h, h->n_reqs - 1);
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

/* Whether token occurs in tokens[0..n). */
static bool holds(const int32_t *tokens, int n, int32_t token)
{
    for (int i = 0; i < n; i++)
        if (tokens[i] == token)
            return true;
    return false;
}

/* A token of bad[0..n_bad) that neither good prompt nor its first n_out reference outputs hold:
 * a worker that fails every sequence holding it fails only the bad request. */
static int32_t token_only_in(const int32_t *bad, int n_bad, const int32_t *g1, const int32_t *g2,
                             int n_good, int n_out)
{
    int32_t all1[MAX_FTOK], all2[MAX_FTOK];
    memcpy(all1, g1, (size_t)n_good * sizeof(int32_t));
    memcpy(all2, g2, (size_t)n_good * sizeof(int32_t));
    ref_generate(g1, n_good, n_out, all1 + n_good);
    ref_generate(g2, n_good, n_out, all2 + n_good);
    for (int i = 0; i < n_bad; i++)
        if (!holds(all1, n_good + n_out, bad[i]) && !holds(all2, n_good + n_out, bad[i]))
            return bad[i];
    fail_msg("no token only in the bad prompt");
    return -1;
}

/* An error of one sequence in a step (the worker says so in its result: NaN logits, say) ends
 * that request with FINISH_ERROR and the worker's message; the step is not refused, nothing is
 * resynced, and the other sequences of the same steps get every token. */
static void test_one_sequence_error_ends_it_alone(void **state)
{
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
    int32_t pa[12], pb[12], pc[12];
    make_prompt(40, 12, pa);
    make_prompt(41, 12, pb);
    make_prompt(42, 12, pc);
    h->fw.poison = true;
    h->fw.poison_token = token_only_in(pb, 12, pa, pc, 12, 6);
    uint64_t resyncs = stats(h).resyncs;
    struct req_rec *a = submit(h, 1, pa, 12, 6);
    struct req_rec *b = submit(h, 2, pb, 12, 6);
    struct req_rec *c = submit(h, 3, pc, 12, 6);
    pump(h);
    assert_int_equal(b->ends, 1);
    assert_int_equal(b->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(b->error_code, PAGODA_EINVAL);
    assert_int_equal(b->n_out, 0);
    expect_output(a, pa, 12, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(c, pc, 12, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.failed_seqs, 1);
    assert_int_equal(st.refused_steps, 0);
    assert_int_equal(st.resyncs, resyncs);
    /* The failure is remembered for a router that restarts. */
    Pagoda__Internal__RouterHello rh = PAGODA__INTERNAL__ROUTER_HELLO__INIT;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_ROUTER_HELLO;
    m.router_hello = &rh;
    deliver_router(h, &m);
    bool announced = false;
    for (int i = 0; i < h->n_ann; i++)
        if (memcmp(h->ann[i].id, b->id, SCHEDULER_REQUEST_ID_BYTES) == 0)
            announced = h->ann[i].finish == PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR;
    assert_true(announced);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("invariants: %s", why);
    /* The failed request's blocks are back once the next step is answered. */
    struct req_rec *d = submit(h, 4, pa, 12, 1);
    pump(h);
    expect_output(d, pa, 12, 1, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    harness_close(h);
}

/* A worker that refuses every step holding one bad sequence (it cannot tell which): the step is
 * resent after the resync once at most, then the scheduler isolates the culprit by probing
 * halves, fails it with the worker's error, and every other request completes. */
static void test_refused_step_isolates_the_culprit(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    enum { N = 6 };
    int32_t p[N][10];
    for (int i = 0; i < N; i++)
        make_prompt(60 + i, 10, p[i]);
    const int bad = 4;
    h->fw.refuse = true;
    h->fw.refuse_token = -1;
    for (int t = 0; t < 10 && h->fw.refuse_token < 0; t++) {
        bool elsewhere = false;
        for (int i = 0; i < N; i++) {
            int32_t all[20];
            memcpy(all, p[i], sizeof(p[i]));
            ref_generate(p[i], 10, 5, all + 10);
            if (i != bad && holds(all, 15, p[bad][t]))
                elsewhere = true;
        }
        if (!elsewhere)
            h->fw.refuse_token = p[bad][t];
    }
    assert_true(h->fw.refuse_token >= 0);
    struct req_rec *r[N];
    for (int i = 0; i < N; i++)
        r[i] = submit(h, 20 + i, p[i], 10, 5);
    pump(h);
    for (int i = 0; i < N; i++) {
        if (i == bad)
            continue;
        expect_output(r[i], p[i], 10, 5, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    }
    assert_int_equal(r[bad]->ends, 1);
    assert_int_equal(r[bad]->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(r[bad]->error_code, PAGODA_ERANGE);
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.isolated_seqs, 1);
    /* One refusal, then at most two per halving (a probe is retried after its resync once). */
    assert_true(st.refused_steps >= 2);
    assert_true(st.refused_steps <= 1 + 2 * 3);
    expect_idle_pool(h);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("invariants: %s", why);

    /* A single refusal (a divergence, repaired by the resync) fails nobody. */
    h->fw.refuse = false;
    struct req_rec *ok = submit(h, 40, p[0], 10, 3);
    h->fw.expected_step += 1000; /* the worker's mirror disagrees once: it refuses */
    pump(h);
    expect_output(ok, p[0], 10, 3, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).isolated_seqs, 1);
    assert_int_equal(stats(h).refused_steps, st.refused_steps + 1);
    harness_close(h);
}

/* A worker that leaves one sequence out of a resync (its content is wrong for it) lists it in
 * ResyncDone: that request fails, the others continue, and the resync is not refused and
 * resent forever. */
static void test_sequence_left_out_of_a_resync_fails(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[12], pb[12], pc[12];
    make_prompt(50, 12, pa);
    make_prompt(51, 12, pb);
    make_prompt(52, 12, pc);
    int32_t bad = token_only_in(pb, 12, pa, pc, 12, 6);
    struct req_rec *a = submit(h, 1, pa, 12, 6);
    struct req_rec *b = submit(h, 2, pb, 12, 6);
    struct req_rec *c = submit(h, 3, pc, 12, 6);
    /* Two steps run; the third is lost, so a resync follows its timeout. */
    exchange(h);
    exchange(h);
    h->fw.drop_steps = 1;
    exchange(h);
    h->fw.resync_fail = true;
    h->fw.resync_fail_token = bad;
    tick(h, h->now + SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS);
    pump(h);
    assert_int_equal(b->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(b->error_code, PAGODA_ERANGE);
    expect_output(a, pa, 12, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(c, pc, 12, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).failed_seqs, 1);
    expect_idle_pool(h);
    harness_close(h);
}

/* A StatsRequest is answered with the counters and its cookie. */
static void test_stats_reply(void **state)
{
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
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
 * parameters a router needs (ignore_eos, whether logprobs were asked for, its text parameters'
 * bytes) and the client's id; a
 * recently ended one with its finish reason; announce_done closes the announcement, and events
 * continue from where they were. */
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
    h->logprobs = true;
    h->router_text = "the router's own bytes";
    struct req_rec *b = submit_full(h, 2, pb, 6, 30, NULL, 0, true);
    h->logprobs = false;
    h->router_text = NULL;
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
    assert_memory_equal(ab->lp, b->lp, (size_t)b->n_out * sizeof(float)); /* as first sent */
    assert_int_equal(ab->finish, 0);
    assert_int_equal(ab->max_tokens, 30);
    assert_true(ab->ignore_eos && ab->logprobs_asked && ab->tenant_ok && ab->has_client_id);
    assert_string_equal(ab->router_text, "the router's own bytes");
    assert_int_equal(ab->client_id[0], b->id[0] ^ 0xa5);
    assert_int_equal(ab->prompt_tokens, 6);
    assert_memory_equal(aa->id, a->id, SCHEDULER_REQUEST_ID_BYTES);
    assert_int_equal(aa->n_out, 2);
    assert_memory_equal(aa->out, a->out, 2 * sizeof(int32_t));
    assert_memory_equal(aa->lp, a->lp, 2 * sizeof(float));
    assert_int_equal(aa->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_false(aa->ignore_eos || aa->logprobs_asked);
    assert_string_equal(aa->router_text, "");
    pump(h);
    assert_int_equal(b->ends, 1);
    assert_int_equal(b->n_out, 30);
    expect_idle_pool(h);
    harness_close(h);
}

/* Each token's logprob is the fake worker's for it (scheduler_harness.c): -0.5 - 0.125 (t & 7). */
static void expect_logprobs(const struct req_rec *r)
{
    for (int i = 0; i < r->n_out; i++)
        assert_true(r->lp[i] == -0.5f - 0.125f * (float)(r->out[i] & 7));
}

/* Messages to the router that io.to_router reports lost: the events of a request that ends
 * meanwhile (its end among them) and of one that goes on. Its next events come from beyond
 * what the router holds (ignored, as the router does); a tick at least
 * SCHEDULER_ROUTER_RESEND_MS after the last resend sends everything held again from offset 0,
 * with the logprobs first sent, and a resend that is itself lost is sent again after twice the
 * wait. A lost announcement is sent again as one. */
static void test_lost_router_messages_are_resent(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    h->router_lenient = true;
    int32_t pa[6], pb[6];
    make_prompt(50, 6, pa);
    make_prompt(51, 6, pb);
    struct req_rec *a = submit(h, 1, pa, 6, 8);
    struct req_rec *b = submit(h, 2, pb, 6, 40);
    exchange(h);
    exchange(h);
    const int a_before = a->n_out, b_before = b->n_out;
    assert_true(a_before >= 1 && a_before < 8 && b_before >= 1);
    h->drop_router = true;
    for (int i = 0; i < 10; i++)
        exchange(h);
    assert_true(h->router_dropped >= 8);
    assert_int_equal(a->n_out, a_before); /* nothing arrived, the end neither */
    assert_int_equal(a->ends, 0);
    assert_int_equal(stats(h).router_drops, (uint64_t)h->router_dropped);
    assert_int_equal(stats(h).running, 1); /* a ended in the scheduler */
    h->drop_router = false;
    exchange(h); /* b's next event: from beyond what is held, ignored */
    assert_true(h->router_gaps >= 1);
    assert_int_equal(b->n_out, b_before);

    /* The first resend is lost too, which doubles the wait; a tick before it is up sends
     * nothing. */
    const int64_t t0 = h->now + SCHEDULER_ROUTER_RESEND_MS;
    h->drop_router = true;
    int dropped = h->router_dropped;
    tick(h, t0);
    assert_true(h->router_dropped > dropped);
    assert_int_equal(stats(h).router_resends, 1);
    h->drop_router = false;
    tick(h, t0 + 2 * SCHEDULER_ROUTER_RESEND_MS - 1);
    assert_int_equal(stats(h).router_resends, 1);
    assert_int_equal(a->ends, 0);
    tick(h, t0 + 2 * SCHEDULER_ROUTER_RESEND_MS);
    assert_int_equal(stats(h).router_resends, 2);
    expect_output(a, pa, 6, 8, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_logprobs(a);
    assert_true(b->n_out > b_before + 8);
    pump(h);
    expect_output(b, pb, 6, 40, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_logprobs(b);
    /* Delivered whole: no more resends. */
    tick(h, t0 + 4 * SCHEDULER_ROUTER_RESEND_MS);
    assert_int_equal(stats(h).router_resends, 2);
    /* The router is told both counts. */
    Pagoda__Internal__StatsRequest sr = PAGODA__INTERNAL__STATS_REQUEST__INIT;
    Pagoda__Internal__ToScheduler sm = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    sm.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS;
    sm.stats = &sr;
    const int replies = h->stats_replies;
    deliver_router(h, &sm);
    assert_int_equal(h->stats_replies, replies + 1);
    assert_int_equal(h->stats_router_drops, (uint64_t)h->router_dropped);
    assert_int_equal(h->stats_router_resends, 2);
    expect_idle_pool(h);

    /* A lost announcement is sent again as an announcement, a period later. */
    int32_t pc[6];
    make_prompt(52, 6, pc);
    struct req_rec *c = submit(h, 3, pc, 6, 40);
    exchange(h);
    exchange(h);
    h->drop_router = true;
    router_hello(h);
    h->drop_router = false;
    const int done = h->ann_done, announced = h->n_ann;
    const int64_t t1 = t0 + 5 * SCHEDULER_ROUTER_RESEND_MS;
    tick(h, t1);
    assert_int_equal(stats(h).router_resends, 3);
    assert_int_equal(h->ann_done, done + 1);
    bool found = false;
    for (int i = announced; i < h->n_ann; i++)
        found |= memcmp(h->ann[i].id, c->id, SCHEDULER_REQUEST_ID_BYTES) == 0 &&
                 h->ann[i].n_out == c->n_out && h->ann[i].finish == 0;
    assert_true(found);
    pump(h);
    expect_output(c, pc, 6, 40, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    harness_close(h);
}

/* Two losses the resend must make good without telling a lie: a submission refused while the
 * link drops (no sequence was made of it; its error end is kept), and a request id the router
 * submits again after the first request of that id ended (both ends are in the recent list;
 * only the newest request's output and end may be sent, or the router, holding the new one,
 * would take the old one's tokens). */
static void test_lost_refusals_and_reused_ids_are_resent(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    h->router_lenient = true;
    int32_t pa[6], pb[6], bad[3] = {5, -1, 7};
    make_prompt(60, 6, pa);
    make_prompt(61, 6, pb);
    struct req_rec *a = submit(h, 1, pa, 6, 4);
    pump(h);
    expect_output(a, pa, 6, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    /* The router forgot a (its client took the result) and takes id 1 again for a new prompt:
     * the record stands for the router's new request of that id. */
    memset(a->out, 0, sizeof(a->out));
    a->n_out = a->ends = 0;
    a->finish = -1;

    h->drop_router = true;
    struct req_rec *r = submit(h, 2, bad, 3, 4); /* refused: token -1 */
    (void)submit(h, 1, pb, 6, 5);                /* events go to a's record, the first of id 1 */
    for (int i = 0; i < 12; i++)
        exchange(h);
    assert_true(h->router_dropped >= 3);
    assert_int_equal(r->ends, 0);
    assert_int_equal(a->ends, 0);
    assert_int_equal(stats(h).running, 0);
    h->drop_router = false;
    tick(h, h->now + SCHEDULER_ROUTER_RESEND_MS);
    assert_int_equal(stats(h).router_resends, 1);
    assert_int_equal(r->ends, 1);
    assert_int_equal(r->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(r->error_code, PAGODA_EINVAL);
    assert_int_equal(r->n_out, 0);
    expect_output(a, pb, 6, 5, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);

    /* A restarted router learns both from the announcement, the refusal with its error. */
    const int announced = h->n_ann;
    router_hello(h);
    int refusals = 0, ones = 0;
    for (int i = announced; i < h->n_ann; i++) {
        if (memcmp(h->ann[i].id, r->id, SCHEDULER_REQUEST_ID_BYTES) == 0)
            refusals += h->ann[i].finish == PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR &&
                        h->ann[i].n_out == 0 && h->ann[i].tenant_ok;
        if (memcmp(h->ann[i].id, a->id, SCHEDULER_REQUEST_ID_BYTES) == 0) {
            ones++;
            assert_int_equal(h->ann[i].n_out, 5);
        }
    }
    assert_int_equal(refusals, 1);
    assert_int_equal(ones, 1);
    expect_idle_pool(h);
    harness_close(h);
    (void)state;
}

/* ---- the pool's identity -------------------------------------------------------------------- */

static void expect_invariants(struct harness *h)
{
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("invariants: %s", why);
}

/* A worker whose first Hello names another pool than the one the scheduler was opened with
 * (a tensor-parallel group names its ranks' pools together): the pool is taken without
 * counting a change of pool, and the group serves; a later change is counted as usual. */
static void test_first_hello_other_pool(void **state)
{
    struct setup su = DEFAULT_SETUP;
    su.cache = true;
    su.no_start = true;
    struct harness *h = harness_open(&su);
    tick(h, 0);
    fw_new_pool(&h->fw, 55);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    pump(h);
    assert_int_equal(h->ready_reports, 1);
    assert_int_equal(stats(h).pool_changes, 0);
    assert_int_equal(stats(h).pool_id, 55);
    int32_t p[20];
    make_prompt(93, 20, p);
    struct req_rec *a = submit(h, 1, p, 20, 3);
    pump(h);
    expect_output(a, p, 20, 3, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    worker_handle_one(h);
    queue_clear(&h->from_worker);
    fw_restart(&h->fw, 101);
    fw_new_pool(&h->fw, 56);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    deliver_answers(h);
    assert_int_equal(stats(h).pool_changes, 1);
    assert_int_equal(stats(h).pool_id, 56);
    harness_close(h);
    (void)state;
}

/* kvpool restarted with a new, empty pool and the worker restarted on it: the Hello names
 * another pool of the same geometry. The prefix cache is dropped (a later request of the same
 * prefix hits nothing), the running request is recomputed from its prompt and output so far
 * (the fake worker fails any step or resync that claims KV its pool does not hold) and its
 * output is unchanged; then the new pool is the table's, and caches again. A worker restarted
 * on the same pool recomputes nothing. */
static void test_pool_change_recomputes(void **state)
{
    struct setup su = DEFAULT_SETUP;
    su.cache = true;
    struct harness *h = harness_open(&su);
    int32_t pa[20], pb[24];
    make_prompt(90, 20, pa);
    memcpy(pb, pa, 16 * sizeof(int32_t)); /* two full blocks of 8 in common */
    make_prompt(91, 8, pb + 16);
    struct req_rec *a = submit(h, 1, pa, 20, 3);
    pump(h);
    expect_output(a, pa, 20, 3, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    struct req_rec *b = submit_full(h, 2, pb, 24, 40, NULL, 0, true);
    for (int i = 0; i < 6; i++)
        exchange(h);
    assert_int_equal(b->cached_tokens, 16);
    assert_true(b->n_out >= 4 && b->ends == 0);
    /* A restart on the same pool: the KV is still there, nothing is recomputed. */
    uint64_t preemptions = stats(h).preemptions;
    worker_handle_one(h);
    queue_clear(&h->from_worker); /* the step's result is lost with the process */
    fw_restart(&h->fw, 101);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    exchange(h);
    exchange(h);
    assert_int_equal(stats(h).preemptions, preemptions);
    assert_int_equal(stats(h).pool_changes, 0);
    /* Now a new pool. */
    worker_handle_one(h);
    queue_clear(&h->from_worker);
    fw_restart(&h->fw, 102);
    fw_new_pool(&h->fw, 77);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    deliver_answers(h);
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.pool_changes, 1);
    assert_int_equal(st.pool_id, 77);
    assert_int_equal(st.refused_hellos, 0);
    assert_int_equal(st.cached_blocks, 0);
    assert_int_equal(st.preemptions, preemptions + 1);
    expect_invariants(h);
    Pagoda__Internal__ToWorker *m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC);
    assert_int_equal(m->resync->n_seqs, 0); /* b waits to be recomputed */
    assert_true(m->resync->has_pool_id);
    assert_int_equal(m->resync->pool_id, 77);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    pump(h);
    expect_output(b, pb, 24, 40, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(b->cached_tokens, 16); /* as first reported: it is the request's figure */
    /* The old pool's entries are gone: b's blocks in the new pool were published instead. */
    int32_t pc[20];
    make_prompt(90, 20, pc);
    struct req_rec *c = submit(h, 3, pc, 20, 3);
    pump(h);
    expect_output(c, pc, 20, 3, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(c->cached_tokens, 16);
    assert_int_equal(stats(h).pool_changes, 1);
    expect_invariants(h);
    harness_close(h);
}

/* Only cache entries made in the new pool hit: with a prefix that only the old pool held, the
 * first request after the change hits nothing. */
static void test_pool_change_drops_cache(void **state)
{
    struct setup su = DEFAULT_SETUP;
    su.cache = true;
    struct harness *h = harness_open(&su);
    int32_t pa[20];
    make_prompt(92, 20, pa);
    struct req_rec *a = submit(h, 1, pa, 20, 3);
    pump(h);
    assert_int_equal(a->cached_tokens, 0);
    assert_true(stats(h).cached_blocks >= 2);
    fw_restart(&h->fw, 101);
    fw_new_pool(&h->fw, 78);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    pump(h);
    assert_int_equal(stats(h).cached_blocks, 0);
    struct req_rec *b = submit(h, 2, pa, 20, 3);
    pump(h);
    expect_output(b, pa, 20, 3, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(b->cached_tokens, 0);
    struct req_rec *c = submit(h, 3, pa, 20, 3);
    pump(h);
    assert_int_equal(c->cached_tokens, 16);
    expect_invariants(h);
    harness_close(h);
}

/* A Hello refused (its pool's geometry is not the table's, or it names no pool) detaches the
 * link: the step in flight is forgotten and nothing goes to the worker, not a resync after the
 * result timeout, not an announcement, and a ResyncDone from it is ignored. A worker whose
 * Hello is accepted then finishes the request with its output unchanged. */
static void test_refused_hello_gets_no_resync(void **state)
{
    /* Lock-step (one step in flight): the test follows the steps one by one. */
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
    int32_t pa[9];
    make_prompt(93, 9, pa);
    struct req_rec *a = submit(h, 1, pa, 9, 12);
    exchange(h);
    exchange(h);
    assert_int_equal(a->n_out, 2);
    uint64_t resyncs = stats(h).resyncs;
    /* The worker dies amid step 3; its successor maps a pool of another size. */
    worker_handle_one(h);
    queue_clear(&h->from_worker);
    fw_restart(&h->fw, 101);
    int32_t blocks = h->fw.num_blocks;
    h->fw.num_blocks = blocks - 1;
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    h->fw.num_blocks = blocks;
    deliver_answers(h);
    assert_int_equal(stats(h).refused_hellos, 1);
    /* A successor that names no pool is refused too. */
    fw_restart(&h->fw, 102);
    h->fw.pool_id = 0;
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    h->fw.pool_id = 9;
    deliver_answers(h);
    assert_int_equal(stats(h).refused_hellos, 2);
    /* A successor whose pool keeps K/V in another dtype (a kvpool restarted by hand with another
     * --kv-cache-dtype) is refused too. */
    fw_restart(&h->fw, 103);
    h->fw.dtype = DTYPE_BF16;
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    h->fw.dtype = DTYPE_F32;
    deliver_answers(h);
    assert_int_equal(stats(h).refused_hellos, 3);
    for (int64_t t = 0; t <= 4 * SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS; t += 100)
        tick(h, t);
    assert_int_equal(h->to_worker.count, 0);
    assert_int_equal(stats(h).resyncs, resyncs);
    /* A ResyncDone for the last resync, from the refused worker, is ignored. */
    Pagoda__Internal__ResyncDone d = PAGODA__INTERNAL__RESYNC_DONE__INIT;
    d.has_epoch = d.has_resync_id = 1;
    d.epoch = EPOCH;
    d.resync_id = resyncs + 1; /* the announcement took one id */
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESYNC_DONE;
    m.resync_done = &d;
    for (uint64_t id = 1; id <= resyncs + 1; id++) {
        d.resync_id = id;
        queue_push(&h->from_worker, &m.base);
    }
    deliver_answers(h);
    tick(h, 5 * SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS);
    assert_int_equal(h->to_worker.count, 0);
    assert_int_equal(stats(h).steps, 2 + 1);
    /* The right worker comes. */
    fw_restart(&h->fw, 103);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    pump(h);
    expect_output(a, pa, 9, 12, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).pool_changes, 0);
    assert_int_equal(stats(h).worker_restarts, 1);
    expect_idle_pool(h);
    harness_close(h);
}

/* Every resync names the pool its block ids refer to. A worker that maps another pool (here
 * without a new Hello, which pagoda-worker never does) refuses it and says Hello; the
 * scheduler adopts that pool, recomputes, and the output is unchanged. A ResyncDone naming
 * another pool is not taken for an answer. */
static void test_resync_names_pool(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[11];
    make_prompt(94, 11, pa);
    struct req_rec *a = submit(h, 1, pa, 11, 10);
    exchange(h);
    exchange(h);
    fw_new_pool(&h->fw, 79);
    deliver_worker_bytes(h, (const uint8_t *)"\xff", 1); /* malformed: resync */
    pump(h);
    assert_int_equal(h->fw.resyncs_refused, 1);
    assert_int_equal(stats(h).pool_changes, 1);
    assert_int_equal(stats(h).pool_id, 79);
    expect_output(a, pa, 11, 10, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    /* A ResyncDone naming pool 9 for the outstanding resync changes nothing. */
    struct req_rec *b = submit(h, 2, pa, 11, 4);
    deliver_worker_bytes(h, (const uint8_t *)"\xff", 1);
    Pagoda__Internal__ToWorker *r = peek_worker(h);
    while (r != NULL && r->msg_case != PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC) {
        protobuf_c_message_free_unpacked(&r->base, NULL);
        struct bytes skip = {0};
        queue_pop(&h->to_worker, &skip);
        free(skip.data);
        r = peek_worker(h);
    }
    assert_non_null(r);
    Pagoda__Internal__ResyncDone d = PAGODA__INTERNAL__RESYNC_DONE__INIT;
    d.has_epoch = d.has_resync_id = d.has_pool_id = 1;
    d.epoch = EPOCH;
    d.resync_id = r->resync->resync_id;
    d.pool_id = 9;
    protobuf_c_message_free_unpacked(&r->base, NULL);
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESYNC_DONE;
    m.resync_done = &d;
    uint64_t ignored = stats(h).ignored_messages;
    queue_push(&h->from_worker, &m.base);
    deliver_answers(h);
    assert_int_equal(stats(h).ignored_messages, ignored + 1);
    assert_int_equal(h->ready_reports, 1);
    pump(h);
    expect_output(b, pa, 11, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
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
        cmocka_unit_test(test_min_tokens_defers_stops),
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
        cmocka_unit_test(test_strict_max_tokens_against_the_pool),
        cmocka_unit_test(test_one_sequence_error_ends_it_alone),
        cmocka_unit_test(test_refused_step_isolates_the_culprit),
        cmocka_unit_test(test_sequence_left_out_of_a_resync_fails),
        cmocka_unit_test(test_stats_reply),
        cmocka_unit_test(test_router_hello_announces),
        cmocka_unit_test(test_lost_router_messages_are_resent),
        cmocka_unit_test(test_lost_refusals_and_reused_ids_are_resent),
        cmocka_unit_test(test_pool_change_recomputes),
        cmocka_unit_test(test_first_hello_other_pool),
        cmocka_unit_test(test_pool_change_drops_cache),
        cmocka_unit_test(test_refused_hello_gets_no_resync),
        cmocka_unit_test(test_resync_names_pool),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    nng_fini();
    return rc;
}
