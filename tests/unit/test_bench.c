/* Tests of bench/: the report's statistics (percentiles, TTFT/TPOT/ITL, failures, engine deltas,
 * the bandwidth floor, JSON), the workloads (determinism, lengths, shared prefixes, tenants,
 * arrivals) and the bytes of a decode step. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "bench/floor.h"
#include "bench/report.h"
#include "bench/timeline.h"
#include "bench/workload.h"
#include "common/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static void test_percentile_exact_values(void **state)
{
    const double x[] = {1, 2, 3, 4};
    /* numpy.percentile([1, 2, 3, 4], p) */
    assert_true(report_percentile(x, 4, 0) == 1.0);
    assert_true(fabs(report_percentile(x, 4, 50) - 2.5) < 1e-12);
    assert_true(fabs(report_percentile(x, 4, 90) - 3.7) < 1e-12);
    assert_true(fabs(report_percentile(x, 4, 99) - 3.97) < 1e-12);
    assert_true(report_percentile(x, 4, 100) == 4.0);
    const double one[] = {7};
    assert_true(report_percentile(one, 1, 99) == 7.0);
    assert_true(isnan(report_percentile(x, 0, 50)));
    /* 0..100: the percentile p is p itself. */
    double r[101];
    for (int i = 0; i < 101; i++)
        r[i] = i;
    assert_true(fabs(report_percentile(r, 101, 37.5) - 37.5) < 1e-12);
}

static void test_summary_is_ordered(void **state)
{
    double v[1000];
    uint64_t x = 12345;
    double sum = 0;
    for (int i = 0; i < 1000; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        v[i] = (double)(x >> 40) / 1000.0;
        sum += v[i];
    }
    struct report_summary s;
    report_summarize(v, 1000, &s);
    assert_int_equal(s.count, 1000);
    assert_true(s.min <= s.p50 && s.p50 <= s.p90 && s.p90 <= s.p95 && s.p95 <= s.p99 &&
                s.p99 <= s.max);
    assert_true(fabs(s.p95 - report_percentile(v, 1000, 95)) < 1e-12);
    assert_true(fabs(s.mean - sum / 1000) < 1e-9 * fabs(sum));
    for (int i = 1; i < 1000; i++)
        assert_true(v[i - 1] <= v[i]); /* sorted in place */
    report_summarize(v, 0, &s);
    assert_int_equal(s.count, 0);
    assert_true(isnan(s.mean) && isnan(s.p99));
}

/* A completed request: prompt_len tokens in, polls[k] tokens at times t[k]. */
static void make_request(struct report_request *r, uint32_t index, uint32_t prompt_len,
                         double start, const double *t, const size_t *polls, size_t npolls,
                         double end)
{
    memset(r, 0, sizeof(*r));
    size_t total = 0;
    for (size_t k = 0; k < npolls; k++)
        total += polls[k];
    assert_int_equal(report_request_reserve(r, total), 0);
    r->index = index;
    r->prompt_len = prompt_len;
    r->max_tokens = (uint32_t)total;
    r->start_s = start;
    int32_t ids[64] = {0};
    for (size_t k = 0; k < npolls; k++)
        assert_int_equal(report_request_add_tokens(r, t[k], ids, polls[k]), 0);
    r->end_s = end;
    r->finish_reason = PAGODA_FINISH_LENGTH;
    r->prompt_tokens = prompt_len;
    r->completion_tokens = (uint32_t)total;
}

static void test_report_counts_tokens_latencies_and_failures(void **state)
{
    struct report_request reqs[4];
    /* 0: tokens at 0.1 (one), 0.2 (two in one poll), 0.4 (one); ends at 0.4. */
    const double t0[] = {0.1, 0.2, 0.4};
    const size_t p0[] = {1, 2, 1};
    make_request(&reqs[0], 0, 10, 0.0, t0, p0, 3, 0.4);
    reqs[0].cached_tokens = 4;
    /* 1: refused at submit. */
    memset(&reqs[1], 0, sizeof(reqs[1]));
    reqs[1].index = 1;
    reqs[1].prompt_len = 7;
    reqs[1].rc = PAGODA_EPERM;
    snprintf(reqs[1].error, sizeof(reqs[1].error), "unknown API key");
    reqs[1].start_s = 0.0;
    reqs[1].end_s = 0.01;
    /* 2: one token, then the engine failed it. */
    const double t2[] = {0.3};
    const size_t p2[] = {1};
    make_request(&reqs[2], 2, 5, 0.1, t2, p2, 1, 0.5);
    reqs[2].finish_reason = PAGODA_FINISH_ERROR;
    snprintf(reqs[2].error, sizeof(reqs[2].error), "worker lost");
    /* 3: completed, 2 tokens, but the usage says 3: a mismatch. Ends last, at 1.0. */
    const double t3[] = {0.5, 0.9};
    const size_t p3[] = {1, 1};
    make_request(&reqs[3], 3, 20, 0.2, t3, p3, 2, 1.0);
    reqs[3].completion_tokens = 3;

    struct report_config cfg = {.workload = "random", .open_loop = 1, .rate = 4, .concurrency = 8};
    struct report rep;
    assert_int_equal(report_compute(&cfg, reqs, 4, NULL, &rep), 0);
    assert_int_equal(rep.num_requests, 4);
    assert_int_equal(rep.completed, 2);
    assert_int_equal(rep.failed, 2);
    assert_int_equal(rep.completed + rep.failed, rep.num_requests);
    assert_int_equal(rep.num_failure_kinds, 2);
    assert_string_equal(rep.failures[0].what, "unknown API key");
    assert_string_equal(rep.failures[1].what, "finished with error: worker lost");
    assert_int_equal(rep.usage_mismatches, 1);
    assert_int_equal(rep.input_tokens, 30);
    assert_int_equal(rep.output_tokens, 6);
    assert_int_equal(rep.failed_output_tokens, 1);
    assert_int_equal(rep.cached_tokens, 4);
    assert_true(fabs(rep.cached_fraction - 4.0 / 30.0) < 1e-12);
    assert_true(fabs(rep.duration_s - 1.0) < 1e-12);
    assert_true(fabs(rep.request_throughput - 2.0) < 1e-12);
    assert_true(fabs(rep.output_tps - 6.0) < 1e-12);
    assert_true(fabs(rep.input_tps - 30.0) < 1e-12);
    /* TTFT: 100 and 300 ms; E2E: 400 and 800; TPOT: (400-100)/3 = 100 and (800-300)/1 = 500. */
    assert_int_equal(rep.ttft_ms.count, 2);
    assert_true(fabs(rep.ttft_ms.mean - 200) < 1e-9);
    assert_true(fabs(rep.e2e_ms.p50 - 600) < 1e-9);
    assert_true(fabs(rep.tpot_ms.min - 100) < 1e-9 && fabs(rep.tpot_ms.max - 500) < 1e-9);
    /* ITL: 100, 0 (shared poll), 200 from request 0; 400 from request 3. */
    assert_int_equal(rep.itl_ms.count, 4);
    assert_true(fabs(rep.itl_ms.min - 0) < 1e-9 && fabs(rep.itl_ms.max - 400) < 1e-9);
    assert_true(fabs(rep.itl_ms.mean - 175) < 1e-9);
    assert_int_equal(rep.shared_tokens, 1);
    assert_int_equal(rep.polls, 5);
    assert_int_equal(rep.multi_token_polls, 1);
    assert_int_equal(rep.max_poll_tokens, 2);
    assert_true(fabs(rep.shared_fraction - 0.25) < 1e-12);
    assert_false(rep.have_engine);
    assert_true(isnan(rep.prefix_hit_rate));
    assert_true(isnan(rep.baseline_ratio));
    report_fini(&rep);
    for (int i = 0; i < 4; i++)
        report_request_fini(&reqs[i]);
}

static void test_add_tokens_refuses_more_than_reserved(void **state)
{
    struct report_request r;
    memset(&r, 0, sizeof(r));
    assert_int_equal(report_request_reserve(&r, 2), 0);
    int32_t ids[3] = {1, 2, 3};
    assert_int_equal(report_request_add_tokens(&r, 0.1, ids, 3), PAGODA_ERANGE);
    assert_int_equal(report_request_add_tokens(&r, 0.1, ids, 2), 0);
    assert_int_equal(report_request_add_tokens(&r, 0.2, ids, 1), PAGODA_ERANGE);
    assert_int_equal(r.num_tokens, 2);
    report_request_fini(&r);
}

static void test_engine_deltas_and_hit_rate(void **state)
{
    struct report_request r;
    const double t[] = {0.1, 0.2};
    const size_t p[] = {1, 1};
    make_request(&r, 0, 64, 0, t, p, 2, 0.2);
    struct report_engine e;
    memset(&e, 0, sizeof(e));
    e.have_before = e.have_after = 1;
    e.before.prefix_query_tokens = 1000;
    e.before.prefix_hit_tokens = 100;
    e.before.preemptions = 3;
    e.before.steps = 10;
    e.after.prefix_query_tokens = 1400;
    e.after.prefix_hit_tokens = 400;
    e.after.preemptions = 5;
    e.after.steps = 30;
    e.after.peak_kv_usage = 0.75;
    e.after.fragmentation = 0.1;
    /* The worker's step times: 18 results over the run, 36 ms of device and 40 of wall time; the
     * means since a worker's start (worker_step_*_us) are not what the figure reads. */
    e.before.worker_steps_timed = 7;
    e.before.worker_step_device_us_total = 14000;
    e.before.worker_step_wall_us_total = 15000;
    e.before.worker_step_device_us = 9999;
    e.after.worker_steps_timed = 25;
    e.after.worker_step_device_us_total = 50000;
    e.after.worker_step_wall_us_total = 55000;
    e.after.worker_step_device_us = 1;
    e.samples = 4;
    e.fragmentation_samples = 2;
    e.fragmentation_sum = 0.5;
    e.fragmentation_max = 0.3;
    e.kv_usage_max = 0.6;
    struct report_config cfg = {.workload = "shared-prefix", .concurrency = 1};
    struct report rep;
    assert_int_equal(report_compute(&cfg, &r, 1, &e, &rep), 0);
    assert_true(rep.have_engine);
    assert_int_equal(rep.prefix_query_tokens, 400);
    assert_int_equal(rep.prefix_hit_tokens, 300);
    assert_true(fabs(rep.prefix_hit_rate - 0.75) < 1e-12);
    assert_int_equal(rep.preemptions, 2);
    assert_int_equal(rep.steps, 20);
    assert_true(rep.peak_kv_usage == 0.75 && rep.kv_usage_max_sampled == 0.6);
    assert_true(fabs(rep.fragmentation_mean - 0.25) < 1e-12 && rep.fragmentation_max == 0.3);
    assert_int_equal(rep.worker_steps_timed, 18);
    assert_true(fabs(rep.worker_step_device_ms - 2.0) < 1e-12);
    assert_true(fabs(rep.worker_step_wall_ms - 40.0 / 18.0) < 1e-12);
    report_fini(&rep);
    /* A counter that fell (a router restarted between the readings), or no result in the run:
     * no figure. */
    e.after.worker_step_device_us_total = 100;
    assert_int_equal(report_compute(&cfg, &r, 1, &e, &rep), 0);
    assert_true(isnan(rep.worker_step_device_ms) && isnan(rep.worker_step_wall_ms));
    report_fini(&rep);
    e.after.worker_step_device_us_total = 50000;
    e.after.worker_steps_timed = e.before.worker_steps_timed;
    assert_int_equal(report_compute(&cfg, &r, 1, &e, &rep), 0);
    assert_true(isnan(rep.worker_step_device_ms));
    report_fini(&rep);
    /* A tenant's figures: no engine-wide step time. */
    e.after.worker_steps_timed = 25;
    snprintf(e.after.tenant, sizeof(e.after.tenant), "%s", "t1");
    assert_int_equal(report_compute(&cfg, &r, 1, &e, &rep), 0);
    assert_true(isnan(rep.worker_step_device_ms));
    report_fini(&rep);
    e.after.tenant[0] = '\0';
    /* No lookups in the run: no hit rate (null), not 0. */
    e.after.prefix_query_tokens = e.before.prefix_query_tokens;
    e.after.prefix_hit_tokens = e.before.prefix_hit_tokens;
    assert_int_equal(report_compute(&cfg, &r, 1, &e, &rep), 0);
    assert_true(isnan(rep.prefix_hit_rate));
    json_t *j = NULL;
    assert_int_equal(report_to_json(&rep, &j), 0);
    assert_true(json_is_null(json_object_get(json_object_get(j, "engine"), "prefix_hit_rate")));
    json_decref(j);
    report_fini(&rep);
    report_request_fini(&r);
}

static void test_bandwidth_floor(void **state)
{
    /* Two clients decoding together: prompts of 100, 11 tokens each, the first at 50 ms and
     * then one every 2 ms: TPOT 2 ms. Mean context 100 + 11/2 = 105.5. */
    struct report_request r[2];
    double t[11];
    size_t p[11];
    for (int k = 0; k < 11; k++) {
        t[k] = 0.05 + 0.002 * k;
        p[k] = 1;
    }
    make_request(&r[0], 0, 100, 0, t, p, 11, t[10]);
    make_request(&r[1], 1, 100, 0, t, p, 11, t[10]);
    struct report_config cfg = {.workload = "random",
                                .open_loop = 0,
                                .concurrency = 2,
                                .bandwidth_gbs = 1000,
                                .weight_bytes = 1e9,
                                .kv_bytes_per_token = 1e6,
                                .baseline_output_tps = 100};
    struct report rep;
    assert_int_equal(report_compute(&cfg, r, 2, NULL, &rep), 0);
    assert_true(rep.have_floor);
    assert_true(fabs(rep.decode_step_ms - 2.0) < 1e-9);
    assert_true(fabs(rep.mean_context - 105.5) < 1e-9);
    assert_true(fabs(rep.kv_bytes_per_step - 2 * 105.5 * 1e6) < 1e-3);
    /* (1e9 + 2.11e8) bytes / 1e12 bytes/s = 1.211 ms */
    assert_true(fabs(rep.floor_step_ms - 1.211) < 1e-9);
    assert_true(fabs(rep.floor_fraction - 1.211 / 2.0) < 1e-9);
    assert_true(rep.floor_reliable);
    assert_true(fabs(rep.baseline_ratio - rep.output_tps / 100) < 1e-12);
    report_fini(&rep);
    /* A prefill stall of 30 ms before the fifth token of each request: TPOT (each request's
     * mean gap, 50 ms / 10 = 5 ms) counts it, the median gap does not: the step is still 2 ms. */
    for (int k = 5; k < 11; k++)
        t[k] += 0.030;
    struct report_request stalled[2];
    make_request(&stalled[0], 0, 100, 0, t, p, 11, t[10]);
    make_request(&stalled[1], 1, 100, 0, t, p, 11, t[10]);
    assert_int_equal(report_compute(&cfg, stalled, 2, NULL, &rep), 0);
    assert_true(rep.have_floor);
    assert_true(fabs(rep.decode_step_ms - 2.0) < 1e-9);
    assert_true(fabs(rep.decode_step_tpot_ms - 5.0) < 1e-9);
    assert_true(fabs(rep.floor_fraction - 1.211 / 2.0) < 1e-9);
    report_fini(&rep);
    report_request_fini(&stalled[0]);
    report_request_fini(&stalled[1]);
    /* Tokens that arrive several to a poll hide the steps: the floor is marked unreliable. */
    struct report_request bunched[2];
    const double tb[] = {0.05, 0.07};
    const size_t pb[] = {1, 10};
    make_request(&bunched[0], 0, 100, 0, tb, pb, 2, 0.07);
    make_request(&bunched[1], 1, 100, 0, tb, pb, 2, 0.07);
    assert_int_equal(report_compute(&cfg, bunched, 2, NULL, &rep), 0);
    assert_true(rep.have_floor);
    assert_false(rep.floor_reliable);
    report_fini(&rep);
    report_request_fini(&bunched[0]);
    report_request_fini(&bunched[1]);
    /* Open loop: no floor (the batch is not known). */
    cfg.open_loop = 1;
    cfg.rate = 1;
    assert_int_equal(report_compute(&cfg, r, 2, NULL, &rep), 0);
    assert_false(rep.have_floor);
    report_fini(&rep);
    report_request_fini(&r[0]);
    report_request_fini(&r[1]);
}

/* The compute-and-bandwidth bound, worked by hand: two requests of 100 prompt tokens and 11
 * output tokens, the second with 40 prompt tokens cached. */
static void test_workload_bound(void **state)
{
    (void)state;
    struct report_request r[2];
    double t[11];
    size_t p[11];
    for (int k = 0; k < 11; k++) {
        t[k] = 0.05 + 0.002 * k;
        p[k] = 1;
    }
    make_request(&r[0], 0, 100, 0, t, p, 11, t[10]);
    make_request(&r[1], 1, 100, 0, t, p, 11, t[10]);
    r[1].cached_tokens = 40;
    struct report_config cfg = {.workload = "random",
                                .open_loop = 1,
                                .rate = INFINITY,
                                .concurrency = 2,
                                .bandwidth_gbs = 1000,
                                .weight_bytes = 1e9,
                                .kv_bytes_per_token = 1e6,
                                .matrix_tflops = 1e-6, /* 1e6 FLOP/s */
                                .flops_per_token = 10,
                                .attention_flops_per_key = 1};
    struct report rep;
    assert_int_equal(report_compute(&cfg, r, 2, NULL, &rep), 0);
    assert_false(rep.have_floor); /* open loop */
    assert_true(rep.have_bound);
    /* Prefill: 10 x 100 + (1 + ... + 100) = 6050; 10 x 60 + (41 + ... + 100) = 4830. */
    assert_true(fabs(rep.bound_prefill_flops - 10880) < 1e-9);
    assert_true(fabs(rep.bound_prefill_s - 0.01088) < 1e-12);
    /* Decode: 10 tokens each after the first, reading 101 .. 110 keys (1055 each); 20 tokens, 2
     * at a time: 10 steps of the weights. */
    assert_true(rep.bound_decode_steps == 10);
    assert_true(fabs(rep.bound_decode_bytes - (10 * 1e9 + 2110 * 1e6)) < 1e-3);
    assert_true(fabs(rep.bound_decode_s - 0.01211) < 1e-12);
    assert_true(fabs(rep.bound_s - 0.02299) < 1e-12);
    assert_true(fabs(rep.bound_output_tps - 22 / 0.02299) < 1e-6);
    assert_true(fabs(rep.bound_fraction - 0.02299 / rep.duration_s) < 1e-12);
    json_t *j = NULL;
    assert_int_equal(report_to_json(&rep, &j), 0);
    assert_true(fabs(json_number_value(json_object_get(json_object_get(j, "bound"), "bound_s")) -
                     0.02299) < 1e-12);
    json_decref(j);
    report_fini(&rep);
    /* The output layer runs once per request (its last prompt token's logits). */
    cfg.lm_head_flops = 100;
    assert_int_equal(report_compute(&cfg, r, 2, NULL, &rep), 0);
    assert_true(fabs(rep.bound_prefill_flops - 11080) < 1e-9);
    report_fini(&rep);
    /* A whole prompt reported cached: its last token is still computed (the router's
     * prompt_tokens is the length when it gave one): 10 x 1 + 100 + (5050 - 4950). */
    r[1].cached_tokens = 100;
    assert_int_equal(report_compute(&cfg, r, 2, NULL, &rep), 0);
    assert_true(fabs(rep.bound_prefill_flops - (6050 + 100 + 210)) < 1e-9);
    report_fini(&rep);
    r[1].cached_tokens = 40;
    /* Unequal lengths: 10 and 2 decode tokens two at a time would be 6 steps, but the longest
     * request alone needs 10. */
    struct report_request shorter[2];
    make_request(&shorter[0], 0, 100, 0, t, p, 11, t[10]);
    make_request(&shorter[1], 1, 100, 0, t, p, 3, t[10]);
    assert_int_equal(report_compute(&cfg, shorter, 2, NULL, &rep), 0);
    assert_true(rep.bound_decode_steps == 10);
    report_fini(&rep);
    report_request_fini(&shorter[0]);
    report_request_fini(&shorter[1]);
    /* Arrivals at a finite rate: the duration is theirs, no bound. */
    cfg.rate = 40;
    assert_int_equal(report_compute(&cfg, r, 2, NULL, &rep), 0);
    assert_false(rep.have_bound);
    report_fini(&rep);
    cfg.rate = INFINITY;
    /* No matrix rate: no bound. */
    cfg.matrix_tflops = 0;
    assert_int_equal(report_compute(&cfg, r, 2, NULL, &rep), 0);
    assert_false(rep.have_bound);
    report_fini(&rep);
    report_request_fini(&r[0]);
    report_request_fini(&r[1]);
}

static void test_json_report_and_record(void **state)
{
    struct report_request r;
    const double t[] = {0.1, 0.1, 0.3};
    const size_t p[] = {2, 0, 1};
    make_request(&r, 5, 12, 0, t, p, 3, 0.3);
    r.tenant = 1;
    const char *names[] = {"alice", "bob"};
    struct report_config cfg = {.workload = "multi-tenant",
                                .open_loop = 1,
                                .rate = INFINITY,
                                .concurrency = 4,
                                .tenant_names = names,
                                .num_tenants = 2};
    struct report rep;
    assert_int_equal(report_compute(&cfg, &r, 1, NULL, &rep), 0);
    json_t *j = NULL;
    assert_int_equal(report_to_json(&rep, &j), 0);
    assert_int_equal(json_integer_value(json_object_get(j, "completed")), 1);
    assert_int_equal(json_integer_value(json_object_get(j, "output_tokens")), 3);
    assert_true(json_is_null(json_object_get(j, "request_rate"))); /* inf is not JSON */
    json_t *ttft = json_object_get(j, "ttft_ms");
    assert_true(fabs(json_real_value(json_object_get(ttft, "p50")) - 100) < 1e-9);
    json_t *tenants = json_object_get(j, "tenants");
    assert_int_equal(json_array_size(tenants), 2);
    json_t *bob = json_array_get(tenants, 1);
    assert_string_equal(json_string_value(json_object_get(bob, "name")), "bob");
    assert_int_equal(json_integer_value(json_object_get(bob, "completed")), 1);
    assert_int_equal(json_integer_value(json_object_get(json_array_get(tenants, 0), "requests")),
                     0);
    json_decref(j);

    assert_int_equal(report_request_to_json(&r, "bob", &j), 0);
    assert_true(json_is_true(json_object_get(j, "ok")));
    assert_int_equal(json_array_size(json_object_get(j, "token_ids")), 3);
    json_t *itl = json_object_get(j, "itl_ms");
    assert_int_equal(json_array_size(itl), 2);
    assert_true(json_real_value(json_array_get(itl, 0)) == 0.0); /* same poll */
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 3);
    json_decref(j);
    report_fini(&rep);
    report_request_fini(&r);
}

static int same_tokens(const int32_t *a, const int32_t *b, size_t n)
{
    return memcmp(a, b, n * sizeof(*a)) == 0;
}

static void test_random_workload(void **state)
{
    struct workload_random_params p = {
        .num_requests = 200, .input_min = 3, .input_max = 9, .output_min = 1, .output_max = 4};
    struct workload_tenants t;
    struct workload a, b, c;
    assert_int_equal(workload_tenants_single(NULL, &t), 0);
    assert_int_equal(workload_random(&p, 50, 7, &t, &a), 0);
    assert_int_equal(workload_tenants_single(NULL, &t), 0);
    assert_int_equal(workload_random(&p, 50, 7, &t, &b), 0);
    assert_int_equal(workload_tenants_single(NULL, &t), 0);
    assert_int_equal(workload_random(&p, 50, 8, &t, &c), 0);
    int seen_min = 0, seen_max = 0, differs = 0;
    for (size_t i = 0; i < 200; i++) {
        const struct workload_request *q = &a.requests[i];
        assert_true(q->prompt_len >= 3 && q->prompt_len <= 9);
        assert_true(q->max_tokens >= 1 && q->max_tokens <= 4);
        seen_min |= q->prompt_len == 3;
        seen_max |= q->prompt_len == 9;
        for (uint32_t k = 0; k < q->prompt_len; k++)
            assert_true(q->prompt[k] >= 0 && q->prompt[k] < 50);
        assert_int_equal(q->prompt_len, b.requests[i].prompt_len);
        assert_true(same_tokens(q->prompt, b.requests[i].prompt, q->prompt_len));
        differs |= q->prompt_len != c.requests[i].prompt_len ||
                   !same_tokens(q->prompt, c.requests[i].prompt, q->prompt_len);
    }
    assert_true(seen_min && seen_max && differs);
    /* The context check names the flags. */
    assert_int_equal(workload_check_context(&a, 13), 0);
    assert_int_equal(workload_check_context(&a, 12), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "--input-len"));
    /* Arrivals: in order, mean gap 1/rate, and the prompts stay as they were. */
    struct workload_random_params big = {
        .num_requests = 20000, .input_min = 1, .input_max = 1, .output_min = 1, .output_max = 1};
    struct workload w;
    assert_int_equal(workload_tenants_single(NULL, &t), 0);
    assert_int_equal(workload_random(&big, 50, 1, &t, &w), 0);
    workload_poisson_arrivals(&w, 10);
    for (size_t i = 1; i < w.num_requests; i++)
        assert_true(w.requests[i].arrival_s >= w.requests[i - 1].arrival_s);
    double mean_gap = w.requests[w.num_requests - 1].arrival_s / (double)w.num_requests;
    assert_true(fabs(mean_gap - 0.1) < 0.005);
    workload_poisson_arrivals(&w, INFINITY);
    assert_true(w.requests[w.num_requests - 1].arrival_s == 0);
    workload_poisson_arrivals(&a, 3);
    assert_true(same_tokens(a.requests[5].prompt, b.requests[5].prompt, a.requests[5].prompt_len));
    workload_fini(&w);
    workload_fini(&a);
    workload_fini(&b);
    workload_fini(&c);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return (x > y) - (x < y);
}

/* The realistic workload: deterministic from its seed; log-normal lengths (the sample median near
 * the median, a long tail: the 95th percentile well above it), within the caps and the context. */
static void test_realistic_workload(void **state)
{
    struct workload_realistic_params p = {.num_requests = 2000,
                                          .input_median = 200,
                                          .input_cap = 3000,
                                          .output_median = 50,
                                          .output_cap = 400,
                                          .input_sigma = 1.0,
                                          .output_sigma = 0.8,
                                          .max_context = 2048};
    struct workload_tenants t;
    struct workload a, b;
    assert_int_equal(workload_tenants_single(NULL, &t), 0);
    assert_int_equal(workload_realistic(&p, 100, 3, &t, &a), 0);
    assert_int_equal(workload_tenants_single(NULL, &t), 0);
    assert_int_equal(workload_realistic(&p, 100, 3, &t, &b), 0);
    static uint32_t in[2000], out[2000];
    for (size_t i = 0; i < 2000; i++) {
        const struct workload_request *q = &a.requests[i];
        assert_int_equal(q->prompt_len, b.requests[i].prompt_len);
        assert_int_equal(q->max_tokens, b.requests[i].max_tokens);
        assert_memory_equal(q->prompt, b.requests[i].prompt, q->prompt_len * sizeof(int32_t));
        assert_true(q->prompt_len >= 1 && q->prompt_len <= 2047);
        assert_true(q->max_tokens >= 1 && q->max_tokens <= 400);
        assert_true(q->prompt_len + q->max_tokens <= 2048);
        in[i] = q->prompt_len;
        out[i] = q->max_tokens;
    }
    qsort(in, 2000, sizeof(in[0]), cmp_u32);
    qsort(out, 2000, sizeof(out[0]), cmp_u32);
    /* median 200 (sampling error at n = 2000 is a few %); p95 = 200 e^1.645 = 1036 */
    assert_true(in[1000] > 180 && in[1000] < 220);
    assert_true(in[1900] > 850 && in[1900] < 1250);
    assert_true(out[1000] > 45 && out[1000] < 55);
    assert_true(in[1999] == 2047 || in[1999] > 1500); /* the tail reaches the context's cap */
    workload_fini(&a);
    workload_fini(&b);
    /* Bad parameters are refused with the flag's name. */
    p.input_sigma = -1;
    assert_int_equal(workload_tenants_single(NULL, &t), 0);
    assert_int_equal(workload_realistic(&p, 100, 3, &t, &a), PAGODA_ERANGE);
    p.input_sigma = 1;
    p.input_cap = 10;
    assert_int_equal(workload_tenants_single(NULL, &t), 0);
    assert_int_equal(workload_realistic(&p, 100, 3, &t, &a), PAGODA_ERANGE);
}

/* The timeline: requests and engine samples fall into their windows; counters are deltas. */
static void test_timeline_windows(void **state)
{
    struct report_request r[2];
    memset(r, 0, sizeof(r));
    double ts0[] = {0.5, 0.6, 1.2}, ts1[] = {1.5, 2.5};
    int32_t ids[] = {1, 2, 3};
    r[0].start_s = 0.1;
    r[0].end_s = 1.3;
    r[0].token_s = ts0;
    r[0].token_ids = ids;
    r[0].num_tokens = 3;
    r[0].finish_reason = PAGODA_FINISH_LENGTH;
    r[1].start_s = 1.1;
    r[1].end_s = 2.6;
    r[1].token_s = ts1;
    r[1].token_ids = ids;
    r[1].num_tokens = 2;
    r[1].finish_reason = PAGODA_FINISH_STOP;
    struct timeline_sample s[4];
    memset(s, 0, sizeof(s));
    for (int i = 0; i < 4; i++) {
        s[i].t_s = 0.4 + 0.7 * i; /* 0.4, 1.1, 1.8, 2.5 */
        s[i].st.prefill_tokens = 100 * (uint64_t)(i + 1);
        s[i].st.prefix_query_tokens = 10 * (uint64_t)i;
        s[i].st.prefix_hit_tokens = 5 * (uint64_t)i;
        s[i].st.running = i < 3 ? 1 : 0;
        s[i].st.locality = 0.5 + 0.1 * i;
        s[i].st.kv_usage = 0.1 * i;
    }
    struct timeline_window *w = NULL;
    size_t n = 0;
    double used = 0;
    assert_int_equal(timeline_compute(s, 4, NULL, r, 2, 1.0, 2.6, &w, &n, &used), 0);
    assert_int_equal(n, 3);
    assert_true(used == 1.0);
    assert_int_equal(w[0].started, 1);
    assert_int_equal(w[1].started, 1);
    assert_int_equal(w[1].completed, 1);
    assert_int_equal(w[2].completed, 1);
    assert_int_equal(w[0].output_tokens, 2);
    assert_int_equal(w[1].output_tokens, 2);
    assert_int_equal(w[2].output_tokens, 1);
    assert_int_equal(w[0].ttft_ms.count, 1);
    assert_true(fabs(w[0].ttft_ms.p99 - 400.0) < 1e-9);
    assert_int_equal(w[1].tpot_ms.count, 1); /* r[0] ended at 1.3: (1.3 - 0.5) / 2 */
    assert_true(fabs(w[1].tpot_ms.p50 - 400.0) < 1e-9);
    /* Window 0 holds the sample at 0.4 (its own first is the base: no delta); window 1 holds
     * 1.1 and 1.8: deltas from 0.4 to 1.8. */
    assert_int_equal(w[0].prefill_tokens, 0);
    assert_int_equal(w[1].prefill_tokens, 200);
    assert_int_equal(w[1].prefix_query_tokens, 20);
    assert_true(fabs(w[1].hit_rate - 0.5) < 1e-12);
    assert_int_equal(w[2].prefill_tokens, 100);
    assert_true(fabs(w[1].locality_mean - 0.65) < 1e-12);
    assert_true(isnan(w[2].locality_mean)); /* nothing running at 2.5 */
    assert_true(fabs(w[2].kv_usage_max - 0.3) < 1e-12);
    /* Rates: engine deltas over the time between their samples (0.4 -> 1.8: 200 / 1.4 s), client
     * tokens over the window's part of the run (the last window ends at 2.6: 1 token / 0.6 s). */
    assert_true(isnan(w[0].prefill_tps));
    assert_true(fabs(w[1].prefill_tps - 200.0 / 1.4) < 1e-9);
    assert_true(fabs(w[2].prefill_tps - 100.0 / 0.7) < 1e-9);
    assert_true(fabs(w[0].output_tps - 2.0) < 1e-9);
    assert_true(fabs(w[2].output_tps - 1.0 / 0.6) < 1e-9);
    free(w);
    /* With the stats read at t = 0 as the base, the first window's counters start there. */
    pagoda_engine_stats base;
    memset(&base, 0, sizeof(base));
    base.prefill_tokens = 40;
    assert_int_equal(timeline_compute(s, 4, &base, r, 2, 1.0, 2.6, &w, &n, &used), 0);
    assert_int_equal(w[0].prefill_tokens, 60);
    assert_true(fabs(w[0].prefill_tps - 60.0 / 0.4) < 1e-9);
    free(w);
    /* A long run gets stretched windows, never more than TIMELINE_MAX_WINDOWS. */
    assert_int_equal(timeline_compute(s, 4, NULL, r, 2, 0.1, 1e6, &w, &n, &used), 0);
    assert_true(n <= TIMELINE_MAX_WINDOWS && used > 0.1);
    free(w);
    assert_int_equal(timeline_compute(s, 4, NULL, r, 2, 0, 3, &w, &n, &used), PAGODA_EINVAL);
}

static void test_shared_prefix_workload(void **state)
{
    struct workload_shared_prefix_params p = {
        .groups = 4, .prompts_per_group = 5, .system_len = 32, .question_len = 6, .output_len = 3};
    struct workload_tenants t;
    struct workload w;
    assert_int_equal(workload_tenants_single("k", &t), 0);
    assert_int_equal(workload_shared_prefix(&p, 1000, 3, &t, &w), 0);
    assert_int_equal(w.num_requests, 20);
    assert_string_equal(w.tenants.tenants[0].api_key, "k");
    /* Exactly 4 distinct system prompts, each starting 5 prompts; questions all differ. */
    size_t distinct = 0;
    for (size_t i = 0; i < 20; i++) {
        const struct workload_request *q = &w.requests[i];
        assert_int_equal(q->prompt_len, 38);
        assert_int_equal(q->max_tokens, 3);
        assert_int_equal(q->prefix_len, 32);
        size_t same = 0, first = 1;
        for (size_t j = 0; j < 20; j++) {
            if (!same_tokens(q->prompt, w.requests[j].prompt, 32))
                continue;
            same++;
            if (j < i)
                first = 0;
            if (j != i)
                assert_false(same_tokens(q->prompt + 32, w.requests[j].prompt + 32, 6));
        }
        assert_int_equal(same, 5);
        distinct += first;
    }
    assert_int_equal(distinct, 4);
    /* Shuffled: the first five are not all one group. */
    int mixed = 0;
    for (size_t i = 1; i < 5; i++)
        mixed |= !same_tokens(w.requests[0].prompt, w.requests[i].prompt, 32);
    assert_true(mixed);
    assert_int_equal(workload_check_context(&w, 41), 0); /* 38 + 3 */
    assert_int_equal(workload_check_context(&w, 40), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "--system-prompt-len"));
    workload_fini(&w);
}

static const char *tenants_doc =
    "{\"admin_keys\": [\"adm\"],"
    " \"groups\": [{\"name\": \"team\", \"cache_quota_blocks\": 1000}],"
    " \"tenants\": ["
    "  {\"name\": \"alice\", \"api_keys\": [\"k1\", \"k1b\"], \"group\": \"team\","
    "   \"max_running\": 64},"
    "  {\"name\": \"bob\", \"api_keys\": [\"k2\"], \"group\": \"team\"},"
    "  {\"name\": \"carol\", \"api_keys\": [\"k3\"]},"
    "  {\"name\": \"dave\", \"api_keys\": [\"k4\"]}],"
    " \"pins\": [{\"name\": \"sys\", \"token_ids\": [9, 8, 7], \"tenants\": [\"dave\"]}]}";

static int parse_doc(const char *doc, int32_t vocab, struct workload_tenants *t)
{
    json_error_t err;
    json_t *root = json_loads(doc, 0, &err);
    assert_non_null(root);
    int rc = workload_tenants_parse(root, "test", vocab, t);
    json_decref(root);
    return rc;
}

static void test_multi_tenant_workload(void **state)
{
    struct workload_tenants t;
    assert_int_equal(parse_doc(tenants_doc, 100, &t), 0);
    assert_int_equal(t.num_tenants, 4);
    assert_string_equal(t.admin_key, "adm");
    assert_string_equal(t.tenants[0].api_key, "k1"); /* the first key */
    assert_int_equal(t.tenants[0].group, 0);
    assert_int_equal(t.tenants[2].group, -1);
    assert_int_equal(t.tenants[3].pin, 0);
    struct workload_multi_tenant_params p = {
        .num_requests = 8, .system_len = 10, .question_len = 4, .output_len = 2};
    struct workload w;
    assert_int_equal(workload_multi_tenant(&p, 100, 1, &t, &w), 0);
    const struct workload_request *r = w.requests;
    /* Round-robin: request i is tenant i % 4. */
    for (size_t i = 0; i < 8; i++)
        assert_int_equal(r[i].tenant, i % 4);
    /* alice and bob share the group's system prompt; carol has her own. */
    assert_true(same_tokens(r[0].prompt, r[1].prompt, 10));
    assert_false(same_tokens(r[0].prompt, r[2].prompt, 10));
    assert_true(same_tokens(r[2].prompt, r[6].prompt, 10));           /* carol's, both times */
    assert_false(same_tokens(r[0].prompt + 10, r[1].prompt + 10, 4)); /* own questions */
    /* dave reads the pin: the pin's tokens, then his own system prompt. */
    assert_int_equal(r[3].prompt_len, 3 + 10 + 4);
    assert_int_equal(r[3].prefix_len, 13);
    assert_int_equal(r[3].prompt[0], 9);
    assert_int_equal(r[3].prompt[2], 7);
    assert_true(same_tokens(r[3].prompt, r[7].prompt, 13));
    assert_int_equal(r[0].prompt_len, 14);
    workload_fini(&w);
}

static void test_tenants_file_errors(void **state)
{
    struct workload_tenants t;
    /* A pin token outside the vocabulary. */
    assert_int_equal(parse_doc(tenants_doc, 9, &t), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "pins[0].token_ids[0]"));
    assert_int_equal(parse_doc("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], "
                               "\"group\": \"nope\"}]}",
                               100, &t),
                     PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "nope"));
    assert_int_equal(parse_doc("{\"tenants\": []}", 100, &t), PAGODA_ERANGE);
    assert_int_equal(parse_doc("{\"tenants\": [{\"name\": \"a\"}]}", 100, &t), PAGODA_EFORMAT);
    /* Today's router format (tenants only) is accepted. */
    assert_int_equal(parse_doc("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], "
                               "\"max_running\": 2, \"max_waiting\": 4}]}",
                               100, &t),
                     0);
    assert_null(t.admin_key);
    workload_tenants_fini(&t);
    assert_int_equal(workload_tenants_from_keys("a,b,c", &t), 0);
    assert_int_equal(t.num_tenants, 3);
    assert_string_equal(t.tenants[2].api_key, "c");
    assert_string_equal(t.tenants[2].name, "tenant2");
    workload_tenants_fini(&t);
    assert_int_equal(workload_tenants_from_keys("a,,c", &t), PAGODA_EINVAL);
}

static void test_floor_bytes_of_the_tiny_model(void **state)
{
    struct model_config cfg;
    model_config_tiny(&cfg);
    /* Per layer: q 256x256, k and v 256x128, o 256x256, gate, up and down 256x688, two norms
     * of 256: 725504; 4 layers + final norm 256 + lm_head 512x256 = 3033344 parameters. */
    assert_true(floor_weight_bytes(&cfg, 2) == 3033344.0 * 2);
    /* 4 layers x K and V x 2 KV heads x 64 x 2 bytes */
    assert_true(floor_kv_bytes_per_token(&cfg, 2) == 2048.0);
    assert_true(floor_kv_bytes_per_token(&cfg, 4) == 4096.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_percentile_exact_values),
        cmocka_unit_test(test_summary_is_ordered),
        cmocka_unit_test(test_report_counts_tokens_latencies_and_failures),
        cmocka_unit_test(test_add_tokens_refuses_more_than_reserved),
        cmocka_unit_test(test_engine_deltas_and_hit_rate),
        cmocka_unit_test(test_bandwidth_floor),
        cmocka_unit_test(test_workload_bound),
        cmocka_unit_test(test_json_report_and_record),
        cmocka_unit_test(test_random_workload),
        cmocka_unit_test(test_shared_prefix_workload),
        cmocka_unit_test(test_realistic_workload),
        cmocka_unit_test(test_timeline_windows),
        cmocka_unit_test(test_multi_tenant_workload),
        cmocka_unit_test(test_tenants_file_errors),
        cmocka_unit_test(test_floor_bytes_of_the_tiny_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
