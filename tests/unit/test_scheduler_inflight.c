/* Tests of the scheduler (scheduler/scheduler*.c) with two steps in flight (max_steps_in_flight 2,
 * the default): step n+1 formed from what step n will have written, stops found one step late,
 * cancel, preemption, a worker's error, lost results and resyncs with two steps outstanding, and
 * the step timeout that counts from when a step could start and grows with its tokens. The fake
 * worker of scheduler_harness.c computes every output from what its pool holds, so a block
 * freed or reused while a step could still write it shows up as a wrong token. */
#include "scheduler_harness.h"

/* ---- helpers -------------------------------------------------------------------------------- */

/* Delivers the oldest answer waiting from the worker; false when there is none. */
static bool deliver_one(struct harness *h)
{
    struct bytes b = {0};
    if (!queue_pop(&h->from_worker, &b))
        return false;
    deliver_worker_bytes(h, b.data, b.len);
    free(b.data);
    return true;
}

/* The message k places behind the next one to the worker, unpacked (caller frees). */
static Pagoda__Internal__ToWorker *queued(struct harness *h, size_t k)
{
    assert_true(k < h->to_worker.count);
    struct bytes *b = &h->to_worker.items[h->to_worker.head + k];
    Pagoda__Internal__ToWorker *m = pagoda__internal__to_worker__unpack(NULL, b->len, b->data);
    assert_non_null(m);
    return m;
}

/* The queued step k places back: its only continuing sequence's (computed, new). */
static void expect_cont(struct harness *h, size_t k, uint64_t step_id, int computed, int num_new)
{
    Pagoda__Internal__ToWorker *m = queued(h, k);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_STEP);
    assert_int_equal(m->step->step_id, step_id);
    assert_true(m->step->n_cont_seqs >= 1);
    assert_int_equal(m->step->cont_seqs[0]->num_computed_tokens, computed);
    assert_int_equal(m->step->cont_seqs[0]->num_new_tokens, num_new);
    protobuf_c_message_free_unpacked(&m->base, NULL);
}

static void expect_invariants(struct harness *h)
{
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("invariants: %s", why);
}

static bool holds(const int32_t *v, int n, int32_t t)
{
    for (int i = 0; i < n; i++)
        if (v[i] == t)
            return true;
    return false;
}

/* ---- tests ---------------------------------------------------------------------------------- */

/* Right after the start's resync one step goes alone; once it is accepted, step n+1 follows
 * step n at once and decodes the position of the token step n samples. A request submitted
 * while two steps are out joins the next one. A stop by max_tokens is foreseen: no token is
 * computed past it. */
static void test_decode_one_step_ahead(void **state)
{
    (void)state;
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[5], pb[9];
    make_prompt(1, 5, pa);
    make_prompt(2, 9, pb);
    struct req_rec *a = submit(h, 1, pa, 5, 6);
    assert_int_equal(h->to_worker.count, 1); /* the first step after a resync goes alone */
    assert_int_equal(stats(h).steps_in_flight, 1);
    exchange(h);
    assert_int_equal(a->n_out, 1);
    /* Steps 2 and 3 are out: 3 decodes the token 2 samples. */
    assert_int_equal(h->to_worker.count, 2);
    expect_cont(h, 0, 2, 5, 1);
    expect_cont(h, 1, 3, 6, 1);
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.steps_in_flight, 2);
    assert_int_equal(st.peak_steps_in_flight, 2);
    struct req_rec *b = submit(h, 2, pb, 9, 4);
    assert_int_equal(h->to_worker.count, 2); /* two steps are out: B waits */
    worker_handle_one(h);
    worker_handle_one(h);
    assert_true(deliver_one(h)); /* step 2's result: step 4 goes out behind step 3 */
    assert_int_equal(a->n_out, 2);
    assert_int_equal(h->to_worker.count, 1);
    Pagoda__Internal__ToWorker *m = queued(h, 0);
    assert_int_equal(m->step->step_id, 4);
    assert_int_equal(m->step->n_cont_seqs, 1);
    assert_int_equal(m->step->cont_seqs[0]->num_computed_tokens, 7);
    assert_int_equal(m->step->n_new_seqs, 1);
    assert_int_equal(m->step->new_seqs[0]->num_new_tokens, 9);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    pump(h);
    expect_output(a, pa, 5, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(b, pb, 9, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    st = stats(h);
    assert_int_equal(st.discarded_tokens, 0);
    assert_int_equal(st.steps_in_flight, 0);
    /* A: 5 prompt tokens and 5 decodes; B: 9 and 3. Nothing beyond max_tokens. */
    assert_int_equal(h->fw.computed_tokens, (5 + 5) + (9 + 3));
    expect_idle_pool(h);
    harness_close(h);
}

/* A prompt longer than the budget: its next chunk goes out behind the chunk in flight, the step
 * behind its last chunk decodes the token that chunk samples, and nothing is computed past
 * max_tokens. */
static void test_prefill_continues_behind_chunk(void **state)
{
    (void)state;
    struct setup su = DEFAULT_SETUP;
    su.max_batched_tokens = 8;
    su.max_seqs = 4;
    struct harness *h = harness_open(&su);
    int32_t pa[20];
    make_prompt(3, 20, pa);
    struct req_rec *a = submit(h, 1, pa, 20, 3);
    int computed[8], num_new[8], n = 0;
    uint64_t last = 0;
    for (int guard = 0; guard < 20 && a->ends == 0; guard++) {
        for (size_t k = 0; k < h->to_worker.count; k++) {
            Pagoda__Internal__ToWorker *m = queued(h, k);
            assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_STEP);
            if (m->step->step_id > last) {
                last = m->step->step_id;
                assert_true(n < 8);
                const Pagoda__Internal__Step *st = m->step;
                assert_int_equal(st->n_new_seqs + st->n_cont_seqs, 1);
                computed[n] = st->n_new_seqs ? st->new_seqs[0]->num_computed_tokens
                                             : st->cont_seqs[0]->num_computed_tokens;
                num_new[n] = st->n_new_seqs ? st->new_seqs[0]->num_new_tokens
                                            : st->cont_seqs[0]->num_new_tokens;
                n++;
            }
            protobuf_c_message_free_unpacked(&m->base, NULL);
        }
        exchange(h);
    }
    const int want_computed[5] = {0, 8, 16, 20, 21}, want_new[5] = {8, 8, 4, 1, 1};
    assert_int_equal(n, 5);
    assert_memory_equal(computed, want_computed, sizeof(want_computed));
    assert_memory_equal(num_new, want_new, sizeof(want_new));
    expect_output(a, pa, 20, 3, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).peak_steps_in_flight, 2);
    expect_idle_pool(h);
    harness_close(h);
}

/* A request ended by EOS: the step sent behind the one that sampled it computes one more token,
 * which is discarded (counted, never sent to the router); lock-step computes none. */
static void test_stop_found_late_discards_one_token(void **state)
{
    (void)state;
    int32_t p[6], ref[16];
    make_prompt(7, 6, p);
    ref_generate(p, 6, 16, ref);
    int k = 2;
    while (k < 16 && holds(ref, k, ref[k]))
        k++;
    assert_true(k < 16);
    for (int steps = 2; steps >= 1; steps--) {
        struct setup su = DEFAULT_SETUP;
        su.eos = ref[k];
        su.max_steps_in_flight = steps;
        struct harness *h = harness_open(&su);
        struct req_rec *a = submit(h, 1, p, 6, 0);
        pump(h);
        expect_output(a, p, 6, k + 1, PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP);
        struct scheduler_stats st = stats(h);
        /* Prefill, k decodes up to EOS, and with two in flight the decode of EOS itself. */
        assert_int_equal(st.discarded_tokens, steps == 2 ? 1 : 0);
        /* The router's stats carry them. */
        Pagoda__Internal__StatsRequest sr = PAGODA__INTERNAL__STATS_REQUEST__INIT;
        Pagoda__Internal__ToScheduler sm = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
        sm.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS;
        sm.stats = &sr;
        deliver_router(h, &sm);
        assert_int_equal(h->stats_replies, 1);
        assert_int_equal(h->stats_discarded, steps == 2 ? 1 : 0);
        assert_int_equal(h->stats_peak_in_flight, steps);
        assert_int_equal(h->fw.computed_tokens, (uint64_t)(6 + k + (steps == 2 ? 1 : 0)));
        /* The next step tells the worker; the pool is whole again. */
        struct req_rec *b = submit(h, 2, p, 6, 2);
        pump(h);
        expect_output(b, p, 6, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
        assert_int_equal(h->fw.finished_seen, 1);
        expect_idle_pool(h);
        harness_close(h);
    }
}

/* A cancel with two steps in flight: the request ends once, at once; its blocks are fenced on
 * the later step (neither free nor reused while either step can write them), its tokens from
 * both steps are discarded, and the next step names it finished. */
static void test_cancel_with_two_in_flight(void **state)
{
    (void)state;
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[20], pb[7];
    make_prompt(5, 20, pa);
    make_prompt(6, 7, pb);
    struct req_rec *a = submit(h, 1, pa, 20, 0);
    struct req_rec *b = submit(h, 2, pb, 7, 6);
    exchange(h); /* step 1 (alone); steps 2 and 3 are out */
    assert_int_equal(h->to_worker.count, 2);
    Pagoda__Internal__ToWorker *m = queued(h, 0);
    uint64_t a_seq = m->step->cont_seqs[0]->seq_id;
    protobuf_c_message_free_unpacked(&m->base, NULL);
    worker_handle_one(h); /* step 2 runs, writing A's blocks; its answer waits */
    cancel(h, a);
    assert_int_equal(a->ends, 1);
    assert_int_equal(a->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_CANCELLED);
    const int32_t a_blocks = 3; /* 20 + 2 positions (step 3 decodes position 21) */
    assert_int_equal(stats(h).deferred_blocks, a_blocks);
    assert_true(deliver_one(h)); /* step 2's result: step 3 can still write A's blocks */
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.deferred_blocks, a_blocks);
    assert_int_equal(st.discarded_tokens, 1);
    expect_invariants(h);
    /* Step 4, out behind step 3, names A finished. */
    m = queued(h, 1);
    assert_int_equal(m->step->step_id, 4);
    assert_int_equal(m->step->n_finished_seq_ids, 1);
    assert_int_equal(m->step->finished_seq_ids[0], a_seq);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    worker_handle_one(h); /* step 3 runs: A's blocks are still A's */
    assert_true(deliver_one(h));
    st = stats(h);
    assert_int_equal(st.deferred_blocks, 0);
    assert_int_equal(st.discarded_tokens, 2);
    assert_int_equal(a->n_out, 1); /* nothing after the end */
    pump(h);
    expect_output(b, pb, 7, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(h->fw.finished_seen, 1);
    expect_idle_pool(h);
    expect_invariants(h);
    harness_close(h);
}

/* Preemption while steps are in flight: the victim's blocks stay fenced on the last step sent,
 * it is recomputed later, and every output equals a run with plenty of blocks (the fake worker
 * would sample another token from a block reused too early). */
static void test_preemption_with_two_in_flight(void **state)
{
    (void)state;
    int32_t prompts[4][16];
    struct req_rec *plenty[4], *tight[4];
    struct harness *h = harness_open(&DEFAULT_SETUP);
    struct setup su = DEFAULT_SETUP;
    su.num_blocks = 1 + 8; /* 64 slots; the four need 4 x 32 */
    struct harness *t = harness_open(&su);
    for (int i = 0; i < 4; i++) {
        make_prompt(20 + i, 10, prompts[i]);
        plenty[i] = submit(h, i + 1, prompts[i], 10, 22);
        tight[i] = submit(t, i + 1, prompts[i], 10, 22);
    }
    for (int guard = 0; guard < 1000 && (t->to_worker.count > 0 || t->from_worker.count > 0);
         guard++) {
        exchange(t);
        expect_invariants(t);
    }
    pump(h);
    struct scheduler_stats st = stats(t);
    assert_true(st.preemptions > 0);
    assert_true(t->fw.preempted_seen > 0);
    assert_int_equal(st.peak_steps_in_flight, 2);
    for (int i = 0; i < 4; i++) {
        expect_output(tight[i], prompts[i], 10, 22, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
        assert_memory_equal(tight[i]->out, plenty[i]->out, 22 * sizeof(int32_t));
    }
    expect_idle_pool(t);
    harness_close(t);
    harness_close(h);
}

/* A token of bad's first n_bad outputs (from the k-th on; k = 0: of its prompt) that neither
 * good prompt nor its first n_out outputs hold, nor bad's tokens before it. */
static int32_t poison_for(const int32_t *bad, int k, const int32_t *g1, const int32_t *g2,
                          int n_out, int *at)
{
    int32_t all_bad[64], all1[64], all2[64];
    memcpy(all_bad, bad, 12 * sizeof(int32_t));
    memcpy(all1, g1, 12 * sizeof(int32_t));
    memcpy(all2, g2, 12 * sizeof(int32_t));
    ref_generate(bad, 12, n_out, all_bad + 12);
    ref_generate(g1, 12, n_out, all1 + 12);
    ref_generate(g2, 12, n_out, all2 + 12);
    int from = k == 0 ? 0 : 12 + k;
    for (int i = from; i < 12 + n_out; i++) {
        int32_t t = all_bad[i];
        if (!holds(all1, 12 + n_out, t) && !holds(all2, 12 + n_out, t) && !holds(all_bad, i, t) &&
            (k == 0 || !holds(all_bad, 12, t))) {
            *at = i - 12;
            return t;
        }
    }
    fail_msg("no poison token");
    return -1;
}

/* The worker fails one sequence (NaN logits), at its first sample (a poisoned prompt) or later
 * in its decode (it samples the poisoned token). Either way step n+1 already continues it, and
 * the worker fails it alone there too (as pagoda-worker does): no step is refused, nothing is
 * resynced, the request ends once with the worker's error and its tokens before it, and every
 * other request completes unchanged. */
static void test_worker_error_with_two_in_flight(void **state)
{
    (void)state;
    for (int mid = 0; mid <= 1; mid++) {
        struct harness *h = harness_open(&DEFAULT_SETUP);
        int32_t pa[12], pb[12], pc[12];
        make_prompt(40, 12, pa);
        make_prompt(41 + 10 * mid, 12, pb);
        make_prompt(42, 12, pc);
        int at = 0;
        h->fw.poison = true;
        h->fw.poison_token = poison_for(pb, mid ? 3 : 0, pa, pc, 10, &at);
        int b_out = mid ? at : 0;
        assert_true(!mid || b_out >= 3);
        struct req_rec *a = submit(h, 1, pa, 12, 10);
        struct req_rec *c = submit(h, 3, pc, 12, 10);
        exchange(h);                                  /* step 1 alone; 2 and 3 out */
        struct req_rec *b = submit(h, 2, pb, 12, 10); /* joins at step 4 */
        uint64_t resyncs = stats(h).resyncs;
        pump(h);
        assert_int_equal(b->ends, 1);
        assert_int_equal(b->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
        assert_int_equal(b->error_code, PAGODA_EINVAL);
        assert_int_equal(b->n_out, b_out);
        int32_t ref[16];
        ref_generate(pb, 12, 16, ref);
        assert_memory_equal(b->out, ref, (size_t)b_out * sizeof(int32_t));
        expect_output(a, pa, 12, 10, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
        expect_output(c, pc, 12, 10, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
        struct scheduler_stats st = stats(h);
        assert_int_equal(st.failed_seqs, 1);
        assert_int_equal(h->fw.refused_unknown, 0);
        /* The step behind the failure continued it, unless its failing token ended it by
         * max_tokens anyway (nothing is computed past that). */
        assert_int_equal(h->fw.failed_behind, b_out + 1 < 10 ? 1 : 0);
        assert_int_equal(st.refused_steps, 0);
        assert_int_equal(st.resyncs, resyncs);
        assert_int_equal(st.isolated_seqs, 0);
        expect_idle_pool(h);
        expect_invariants(h);
        harness_close(h);
    }
}

/* Whether step k (step_id) continues seq_id; then *computed and *num_new are its counts. */
static bool step_continues(struct harness *h, size_t k, uint64_t step_id, uint64_t seq_id,
                           int *computed, int *num_new)
{
    Pagoda__Internal__ToWorker *m = queued(h, k);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_STEP);
    assert_int_equal(m->step->step_id, step_id);
    bool found = false;
    for (size_t i = 0; i < m->step->n_cont_seqs; i++)
        if (m->step->cont_seqs[i]->seq_id == seq_id) {
            found = true;
            *computed = m->step->cont_seqs[i]->num_computed_tokens;
            *num_new = m->step->cont_seqs[i]->num_new_tokens;
        }
    protobuf_c_message_free_unpacked(&m->base, NULL);
    return found;
}

/* The seq id of the new sequence of step k (its only one). */
static uint64_t new_seq_id(struct harness *h, size_t k, uint64_t step_id)
{
    Pagoda__Internal__ToWorker *m = queued(h, k);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_STEP);
    assert_int_equal(m->step->step_id, step_id);
    assert_int_equal(m->step->n_new_seqs, 1);
    uint64_t id = m->step->new_seqs[0]->seq_id;
    protobuf_c_message_free_unpacked(&m->base, NULL);
    return id;
}

/* A sequence's first sample since its admission is decoded ahead like any other: the step sent
 * behind the one that completes its prompt decodes the position of the token that one samples. */
static void test_first_sample_decoded_ahead(void **state)
{
    (void)state;
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[5], pb[9];
    make_prompt(1, 5, pa);
    make_prompt(2, 9, pb);
    struct req_rec *a = submit(h, 1, pa, 5, 8);
    exchange(h); /* step 1 alone; 2 and 3 out */
    struct req_rec *b = submit(h, 2, pb, 9, 4);
    worker_handle_one(h);
    worker_handle_one(h);
    assert_true(deliver_one(h)); /* step 2's result: step 4 admits B */
    uint64_t b_seq = new_seq_id(h, 0, 4);
    assert_true(deliver_one(h)); /* step 3's result: step 5 goes out behind step 4 */
    assert_int_equal(h->to_worker.count, 2);
    int computed = -1, num_new = -1;
    assert_true(step_continues(h, 1, 5, b_seq, &computed, &num_new));
    assert_int_equal(computed, 9);
    assert_int_equal(num_new, 1);
    pump(h);
    expect_output(a, pa, 5, 8, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(b, pb, 9, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).discarded_tokens, 0);
    expect_idle_pool(h);
    expect_invariants(h);
    harness_close(h);
}

/* The worker fails a sequence at its first sample (step n, NaN logits) while step n+1, which
 * decodes it ahead, is already out: step n's result ends the request once with the error and
 * nothing else, its blocks stay fenced on step n+1 (which may still write them) and step n+2
 * names it finished; step n+1's result, where the worker fails it alone again, is ignored (no
 * second end, no resync), and then its blocks are free. */
static void test_failure_with_the_next_step_out(void **state)
{
    (void)state;
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[12], pb[12], pc[12];
    make_prompt(40, 12, pa);
    make_prompt(41, 12, pb);
    make_prompt(42, 12, pc);
    int at = 0;
    h->fw.poison = true;
    h->fw.poison_token = poison_for(pb, 0, pa, pc, 10, &at);
    struct req_rec *a = submit(h, 1, pa, 12, 10);
    exchange(h); /* step 1 alone; 2 and 3 out */
    struct req_rec *b = submit(h, 2, pb, 12, 10);
    uint64_t resyncs = stats(h).resyncs;
    worker_handle_one(h);
    worker_handle_one(h);
    assert_true(deliver_one(h)); /* step 2's result: step 4 admits B */
    uint64_t b_seq = new_seq_id(h, 0, 4);
    assert_true(deliver_one(h)); /* step 3's result: step 5 decodes B ahead */
    int computed = -1, num_new = -1;
    assert_true(step_continues(h, 1, 5, b_seq, &computed, &num_new));
    assert_int_equal(computed, 12);
    struct scheduler_stats st = stats(h);
    int32_t free_before = st.free_blocks;
    worker_handle_one(h); /* step 4: B's row fails */
    worker_handle_one(h); /* step 5: B fails alone again */
    assert_int_equal(h->fw.failed_behind, 1);
    assert_true(deliver_one(h)); /* step 4's result */
    assert_int_equal(b->ends, 1);
    assert_int_equal(b->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(b->error_code, PAGODA_EINVAL);
    assert_int_equal(b->n_out, 0);
    st = stats(h);
    assert_int_equal(st.failed_seqs, 1);
    const int32_t b_blocks = 2; /* 12 prompt positions and the one step 5 decodes, 8 a block */
    assert_int_equal(st.deferred_blocks, b_blocks);
    expect_invariants(h);
    /* Step 6, out behind step 5, names B finished. */
    Pagoda__Internal__ToWorker *m = queued(h, 0);
    assert_int_equal(m->step->step_id, 6);
    assert_int_equal(m->step->n_finished_seq_ids, 1);
    assert_int_equal(m->step->finished_seq_ids[0], b_seq);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    assert_true(deliver_one(h)); /* step 5's result, with B's error again */
    st = stats(h);
    assert_int_equal(b->ends, 1);
    assert_int_equal(b->n_out, 0);
    assert_int_equal(st.failed_seqs, 1);
    assert_int_equal(st.deferred_blocks, 0);
    assert_true(st.free_blocks >= free_before);
    assert_int_equal(st.refused_steps, 0);
    assert_int_equal(st.malformed_messages, 0);
    assert_int_equal(st.resyncs, resyncs);
    pump(h);
    expect_output(a, pa, 12, 10, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(b->ends, 1);
    assert_int_equal(h->fw.refused_unknown, 0);
    expect_idle_pool(h);
    expect_invariants(h);
    harness_close(h);
}

/* The worker dies with two steps outstanding (both ran, neither answer arrives): the resync's
 * snapshot is the acknowledged state (both steps' work discarded), next_step_id follows the last
 * step sent, the dead worker's late answers are ignored, and the outputs are unchanged. */
static void test_resync_with_two_outstanding(void **state)
{
    (void)state;
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[7], pb[12];
    make_prompt(30, 7, pa);
    make_prompt(31, 12, pb);
    struct req_rec *a = submit(h, 1, pa, 7, 12);
    struct req_rec *b = submit(h, 2, pb, 12, 12);
    exchange(h);
    exchange(h);
    assert_int_equal(h->to_worker.count, 2);
    assert_int_equal(stats(h).steps_in_flight, 2);
    int a_out = a->n_out, b_out = b->n_out;
    worker_handle_one(h);
    worker_handle_one(h);
    struct bytes stale[2];
    assert_true(queue_pop(&h->from_worker, &stale[0]));
    assert_true(queue_pop(&h->from_worker, &stale[1]));
    fw_restart(&h->fw, 101);
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    deliver_answers(h);
    Pagoda__Internal__ToWorker *m = peek_worker(h);
    assert_non_null(m);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC);
    assert_int_equal(m->resync->next_step_id, stats(h).steps + 1);
    assert_int_equal(m->resync->n_seqs, 2);
    for (size_t i = 0; i < 2; i++) {
        const Pagoda__Internal__SequenceSnapshot *sn = m->resync->seqs[i];
        int n_prompt = sn->num_prompt_tokens;
        int n_out = n_prompt == 7 ? a_out : b_out;
        assert_int_equal(sn->n_token_ids, (size_t)(n_prompt + n_out));
        assert_int_equal(sn->num_computed_tokens, n_prompt + n_out - 1);
    }
    protobuf_c_message_free_unpacked(&m->base, NULL);
    uint64_t ignored = stats(h).ignored_messages;
    for (int i = 0; i < 2; i++) {
        deliver_worker_bytes(h, stale[i].data, stale[i].len);
        free(stale[i].data);
    }
    assert_int_equal(stats(h).ignored_messages, ignored + 2);
    assert_int_equal(a->n_out, a_out);
    assert_int_equal(b->n_out, b_out);
    pump(h);
    expect_output(a, pa, 7, 12, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(b, pb, 12, 12, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    harness_close(h);
}

/* Step n's result is lost and step n+1's arrives: the scheduler resyncs at once (no timeout),
 * and the outputs are unchanged. */
static void test_missing_result_resyncs_at_once(void **state)
{
    (void)state;
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t pa[9];
    make_prompt(44, 9, pa);
    struct req_rec *a = submit(h, 1, pa, 9, 8);
    exchange(h);
    assert_int_equal(h->to_worker.count, 2);
    worker_handle_one(h);
    worker_handle_one(h);
    struct bytes lost = {0};
    assert_true(queue_pop(&h->from_worker, &lost));
    free(lost.data);
    struct scheduler_stats before = stats(h);
    assert_true(deliver_one(h));
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.resyncs, before.resyncs + 1);
    assert_int_equal(st.result_timeouts, 0);
    assert_int_equal(st.malformed_messages, before.malformed_messages + 1);
    assert_int_equal(a->n_out, 1);
    Pagoda__Internal__ToWorker *m = peek_worker(h);
    assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC);
    assert_int_equal(m->resync->next_step_id, 4);
    protobuf_c_message_free_unpacked(&m->base, NULL);
    pump(h);
    expect_output(a, pa, 9, 8, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    harness_close(h);
}

/* The step sent behind another could start only when the first was answered: its timeout
 * counts from that result, not from its own send. */
static void test_second_step_timeout_counts_from_first_result(void **state)
{
    (void)state;
    struct setup su = DEFAULT_SETUP;
    su.step_timeout_per_token_us = -1; /* the fixed timeout alone */
    struct harness *h = harness_open(&su);
    const int64_t base = SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS;
    int32_t pa[9];
    make_prompt(45, 9, pa);
    struct req_rec *a = submit(h, 1, pa, 9, 8);
    exchange(h); /* at 0: steps 2 and 3 go out */
    worker_handle_one(h);
    h->now = 1500;
    assert_true(deliver_one(h)); /* step 2 answered at 1500: step 3 starts now */
    assert_int_equal(a->n_out, 2);
    tick(h, base);
    tick(h, 1500 + base - 1);
    assert_int_equal(stats(h).result_timeouts, 0);
    tick(h, 1500 + base);
    assert_int_equal(stats(h).result_timeouts, 1);
    pump(h);
    expect_output(a, pa, 9, 8, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_idle_pool(h);
    harness_close(h);
}

/* A step of 2000 prompt tokens may take result_timeout_ms + 2000 x step_timeout_per_token_us:
 * a worker that answers it just within that (well after result_timeout_ms) is not resynced; with
 * the fixed timeout alone it would be, and the step replayed. */
static void test_long_step_not_timed_out(void **state)
{
    (void)state;
    static int32_t p[2000];
    make_prompt(46, 2000, p);
    const int64_t base = SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS;
    const int64_t allowed = base + 2000LL * SCHEDULER_DEFAULT_STEP_TIMEOUT_PER_TOKEN_US / 1000;
    for (int fixed = 0; fixed <= 1; fixed++) {
        struct setup su = DEFAULT_SETUP;
        su.step_timeout_per_token_us = fixed ? -1 : 0;
        struct harness *h = harness_open(&su);
        struct req_rec *a = submit(h, 1, p, 2000, 2);
        worker_handle_one(h); /* the long step runs; its answer is slow */
        tick(h, base);
        if (fixed) {
            assert_int_equal(stats(h).result_timeouts, 1);
            harness_close(h);
            continue;
        }
        tick(h, allowed - 1);
        struct scheduler_stats st = stats(h);
        assert_int_equal(st.result_timeouts, 0);
        assert_int_equal(st.hung_reports, 0);
        h->now = allowed - 1;
        deliver_answers(h);
        assert_int_equal(a->n_out, 1);
        pump(h);
        expect_output(a, p, 2000, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
        st = stats(h);
        assert_int_equal(st.result_timeouts, 0);
        assert_int_equal(st.resyncs, 1); /* the start's */
        harness_close(h);
    }
}

/* The watchdog allows the same per-token time: a worker silent for longer than watchdog_ms on
 * a step of 2000 tokens, but within its allowance, is not reported hung (with the fixed
 * watchdog it would be, and killed amid its step). */
static void test_watchdog_allows_a_long_step(void **state)
{
    (void)state;
    static int32_t p[2000];
    make_prompt(48, 2000, p);
    const int64_t quiet = SCHEDULER_DEFAULT_WATCHDOG_MS + 500;
    for (int fixed = 0; fixed <= 1; fixed++) {
        struct setup su = DEFAULT_SETUP;
        su.step_timeout_per_token_us = fixed ? -1 : 0;
        struct harness *h = harness_open(&su);
        submit(h, 1, p, 2000, 2);
        h->fw.silent = true;
        exchange(h); /* the long step is taken and computed in silence */
        for (int64_t t = 0; t <= quiet; t += 100)
            tick(h, t);
        struct scheduler_stats st = stats(h);
        assert_int_equal(st.hung_reports, fixed ? 1 : 0);
        /* The fixed timeout resynced it long ago; the per-token one not yet. */
        assert_int_equal(st.result_timeouts > 0, fixed);
        harness_close(h);
    }
}

/* max_steps_in_flight 1 is lock-step; values outside [1, 2] and a negative per-token timeout
 * are refused. */
static void test_steps_in_flight_config(void **state)
{
    (void)state;
    struct setup su = DEFAULT_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
    int32_t pa[9];
    make_prompt(47, 9, pa);
    struct req_rec *a = submit(h, 1, pa, 9, 6);
    pump(h);
    expect_output(a, pa, 9, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).peak_steps_in_flight, 1);
    assert_int_equal(stats(h).steps, 6);
    struct scheduler_config cfg = h->cfg;
    struct scheduler_io io = {.ctx = h,
                              .to_worker = io_to_worker,
                              .to_router = io_to_router,
                              .to_supervisor = io_to_supervisor};
    struct scheduler *s = NULL;
    const int32_t bad[] = {0, 3, -1};
    for (size_t i = 0; i < 3; i++) {
        cfg.max_steps_in_flight = bad[i];
        assert_int_equal(scheduler_open(&cfg, &io, &s), PAGODA_ERANGE);
    }
    cfg.max_steps_in_flight = 2;
    cfg.step_timeout_per_token_us = -1;
    assert_int_equal(scheduler_open(&cfg, &io, &s), PAGODA_ERANGE);
    cfg.step_timeout_per_token_us = 0;
    assert_int_equal(scheduler_open(&cfg, &io, &s), 0);
    scheduler_close(s);
    struct scheduler_config def;
    scheduler_config_default(&def);
    assert_int_equal(def.max_steps_in_flight, 2);
    harness_close(h);
}

int main(void)
{
    log_set_level(LOG_OFF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_one_step_ahead),
        cmocka_unit_test(test_prefill_continues_behind_chunk),
        cmocka_unit_test(test_stop_found_late_discards_one_token),
        cmocka_unit_test(test_cancel_with_two_in_flight),
        cmocka_unit_test(test_preemption_with_two_in_flight),
        cmocka_unit_test(test_worker_error_with_two_in_flight),
        cmocka_unit_test(test_resync_with_two_outstanding),
        cmocka_unit_test(test_missing_result_resyncs_at_once),
        cmocka_unit_test(test_first_sample_decoded_ahead),
        cmocka_unit_test(test_failure_with_the_next_step_out),
        cmocka_unit_test(test_second_step_timeout_counts_from_first_result),
        cmocka_unit_test(test_long_step_not_timed_out),
        cmocka_unit_test(test_watchdog_allows_a_long_step),
        cmocka_unit_test(test_steps_in_flight_config),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    nng_fini();
    return rc;
}
