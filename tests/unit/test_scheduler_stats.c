/* Tests of the scheduler's work and page-locality figures (scheduler_stats: prefill_tokens,
 * decode_tokens, locality, locality_run_length, the worker's step times), through the fake worker
 * of scheduler_harness.h. */
#include "scheduler_harness.h"

#include <math.h>

/* One sequence on a fresh pool: its blocks are consecutive (locality 1, one run of all its
 * blocks); prefill and decode tokens count what the acknowledged steps computed. */
static void test_one_sequence_is_local(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP); /* block size 8 */
    int32_t p[30];
    make_prompt(7, 30, p);
    struct req_rec *r = submit(h, 1, p, 30, 20);
    for (int i = 0; i < 8; i++)
        exchange(h);
    struct scheduler_stats st = stats(h);
    assert_int_equal(st.running, 1);
    assert_true(st.locality == 1.0);
    /* 30 prompt tokens plus decodes so far: every block of the table in one run. */
    assert_true(st.locality_run_length >= 4.0);
    assert_int_equal(st.prefill_tokens, 30);
    assert_true(st.decode_tokens >= 5);
    pump(h);
    expect_output(r, p, 30, 20, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    st = stats(h);
    assert_int_equal(st.prefill_tokens, 30);
    /* The first output token comes from the prefill; the other 19 from decodes of which the
     * last one's token ends the request: 19 decode steps computed one token each. */
    assert_int_equal(st.decode_tokens, 19);
    assert_int_equal(st.prefill_tokens + st.decode_tokens, st.computed_tokens);
    /* Every step answered: each result's times summed (the counters pagoda-bench's per-step
     * times are differences of). */
    assert_int_equal(st.steps_in_flight, 0);
    assert_int_equal(st.worker_steps_timed, st.steps);
    assert_true(st.worker_step_wall_us_sum == FW_STEP_WALL_US * (double)st.steps);
    assert_true(st.worker_step_device_us_sum == FW_STEP_DEVICE_US * (double)st.steps);
    harness_close(h);
}

/* Sequences decoding side by side grow into each other's neighbourhood: after churn the tables
 * interleave (locality below 1, shorter runs); no running sequence: locality 1, run length 0. */
static void test_churn_lowers_locality(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP); /* block size 8 */
    int32_t p[8][16];
    for (int i = 0; i < 8; i++) {
        make_prompt(40 + i, 3, p[i]);
        submit(h, i + 1, p[i], 3, 40 + 4 * i);
    }
    /* Exchange until the tables interleave (bounded: the requests end after 68 tokens). */
    bool interleaved = false;
    struct scheduler_stats st;
    for (int i = 0; i < 200 && !interleaved; i++) {
        exchange(h);
        st = stats(h);
        interleaved = st.running >= 2 && st.locality < 1.0;
    }
    assert_true(interleaved);
    assert_true(st.locality_run_length >= 1.0 && st.locality_run_length < 4.0);
    pump(h);
    st = stats(h);
    assert_int_equal(st.running, 0);
    assert_true(st.locality == 1.0);
    assert_true(st.locality_run_length == 0.0);
    assert_int_equal(st.prefill_tokens, 8 * 3);
    assert_int_equal(st.prefill_tokens + st.decode_tokens, st.computed_tokens);
    harness_close(h);
}

/* A worker's step times count only when they are times: NaN, negative, or longer than
 * SCHEDULER_STEP_US_MAX (whose sums would leave the counters' range), in either of the two,
 * leave the counters as they were; good times count again after. */
static void test_step_times_from_a_peer(void **state)
{
    struct harness *h = harness_open(&DEFAULT_SETUP);
    int32_t p[16];
    make_prompt(3, 16, p);
    struct req_rec *r = submit(h, 1, p, 16, 40);
    const double bad[][2] = {{NAN, 750.0}, {1250.0, -1.0}, {1e300, 750.0}, {1250.0, INFINITY}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        fw_step_wall_us = bad[i][0];
        fw_step_device_us = bad[i][1];
        for (int k = 0; k < 3; k++)
            exchange(h);
    }
    fw_step_wall_us = FW_STEP_WALL_US;
    fw_step_device_us = FW_STEP_DEVICE_US;
    struct scheduler_stats st = stats(h);
    assert_true(st.steps >= 10);
    assert_int_equal(st.worker_steps_timed, 0);
    assert_true(st.worker_step_wall_us_sum == 0 && st.worker_step_device_us_sum == 0);
    const uint64_t steps = st.steps;
    pump(h);
    expect_output(r, p, 16, 40, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    st = stats(h);
    /* every step sent after the good times came back was timed (and at most the two in flight
     * before them too) */
    assert_true(st.worker_steps_timed + steps >= st.steps &&
                st.worker_steps_timed <= st.steps - steps + 2);
    assert_true(st.worker_step_device_us_sum == FW_STEP_DEVICE_US * (double)st.worker_steps_timed);
    harness_close(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_one_sequence_is_local),
        cmocka_unit_test(test_churn_lowers_locality),
        cmocka_unit_test(test_step_times_from_a_peer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
