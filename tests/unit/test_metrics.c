/* Tests of metrics/: the exact text of a small registry, escaping, cumulative buckets, names
 * refused, the size bound. `test_metrics --print` writes a registry shaped like the router's
 * for `promtool check metrics` (the test_metrics_promtool script test). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "metrics/metrics.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static void test_small_registry_exact_text(void **state)
{
    struct metrics_buf b;
    metrics_buf_init(&b, 1 << 16);
    static const double bounds[] = {0.1, 0.5, 1};
    struct metrics_hist h;
    assert_int_equal(metrics_hist_init(&h, bounds, 3), 0);
    metrics_hist_observe(&h, 0.05);
    metrics_hist_observe(&h, 0.1); /* le: on the bound counts in it */
    metrics_hist_observe(&h, 0.7);
    metrics_hist_observe(&h, 3);
    struct metrics_label tenant = {"tenant", "acme"};
    struct metrics_label reason[] = {{"tenant", "acme"}, {"finished_reason", "stop"}};
    assert_int_equal(metrics_family(&b, "pagoda_prompt_tokens_total", METRICS_COUNTER,
                                    "Prompt tokens processed."),
                     0);
    assert_int_equal(metrics_sample(&b, &tenant, 1, 1234), 0);
    assert_int_equal(metrics_family(&b, "pagoda_request_success_total", METRICS_COUNTER,
                                    "Requests finished, by reason."),
                     0);
    assert_int_equal(metrics_sample(&b, reason, 2, 7), 0);
    assert_int_equal(metrics_family(&b, "pagoda_kv_cache_usage_perc", METRICS_GAUGE,
                                    "KV blocks in use, 0 to 1."),
                     0);
    assert_int_equal(metrics_sample(&b, NULL, 0, 0.25), 0);
    assert_int_equal(metrics_family(&b, "pagoda_e2e_request_latency_seconds", METRICS_HISTOGRAM,
                                    "End-to-end latency."),
                     0);
    assert_int_equal(metrics_histogram(&b, &tenant, 1, &h), 0);
    const char *want = "# HELP pagoda_prompt_tokens_total Prompt tokens processed.\n"
                       "# TYPE pagoda_prompt_tokens_total counter\n"
                       "pagoda_prompt_tokens_total{tenant=\"acme\"} 1234\n"
                       "# HELP pagoda_request_success_total Requests finished, by reason.\n"
                       "# TYPE pagoda_request_success_total counter\n"
                       "pagoda_request_success_total{tenant=\"acme\",finished_reason=\"stop\"} 7\n"
                       "# HELP pagoda_kv_cache_usage_perc KV blocks in use, 0 to 1.\n"
                       "# TYPE pagoda_kv_cache_usage_perc gauge\n"
                       "pagoda_kv_cache_usage_perc 0.25\n"
                       "# HELP pagoda_e2e_request_latency_seconds End-to-end latency.\n"
                       "# TYPE pagoda_e2e_request_latency_seconds histogram\n"
                       "pagoda_e2e_request_latency_seconds_bucket{tenant=\"acme\",le=\"0.1\"} 2\n"
                       "pagoda_e2e_request_latency_seconds_bucket{tenant=\"acme\",le=\"0.5\"} 2\n"
                       "pagoda_e2e_request_latency_seconds_bucket{tenant=\"acme\",le=\"1\"} 3\n"
                       "pagoda_e2e_request_latency_seconds_bucket{tenant=\"acme\",le=\"+Inf\"} 4\n"
                       "pagoda_e2e_request_latency_seconds_sum{tenant=\"acme\"} 3.85\n"
                       "pagoda_e2e_request_latency_seconds_count{tenant=\"acme\"} 4\n";
    assert_string_equal(b.data, want);
    assert_int_equal(b.len, strlen(want));
    metrics_buf_fini(&b);
}

static void test_escaping_of_label_values_and_help(void **state)
{
    struct metrics_buf b;
    metrics_buf_init(&b, 4096);
    struct metrics_label l = {"tenant", "a\"b\\c\nd"};
    metrics_family(&b, "x_total", METRICS_COUNTER, "line one\nback\\slash \"quoted\"");
    assert_int_equal(metrics_sample(&b, &l, 1, 1), 0);
    assert_string_equal(b.data, "# HELP x_total line one\\nback\\\\slash \"quoted\"\n"
                                "# TYPE x_total counter\n"
                                "x_total{tenant=\"a\\\"b\\\\c\\nd\"} 1\n");
    metrics_buf_fini(&b);
}

static void test_numbers_print_exactly(void **state)
{
    struct metrics_buf b;
    metrics_buf_init(&b, 4096);
    metrics_family(&b, "g", METRICS_GAUGE, "");
    metrics_sample(&b, NULL, 0, 0.1);
    metrics_sample(&b, NULL, 0, -3);
    metrics_sample(&b, NULL, 0, 1e300);
    metrics_sample(&b, NULL, 0, NAN);
    metrics_sample(&b, NULL, 0, INFINITY);
    metrics_sample(&b, NULL, 0, -INFINITY);
    assert_int_equal(metrics_sample(&b, NULL, 0, 9007199254740993.0 /* rounds to 2^53 */), 0);
    assert_string_equal(b.data, "# HELP g \n# TYPE g gauge\n"
                                "g 0.1\ng -3\ng 1e+300\ng NaN\ng +Inf\ng -Inf\n"
                                "g 9007199254740992\n");
    metrics_buf_fini(&b);
}

static void test_histogram_buckets_are_cumulative(void **state)
{
    struct metrics_hist h;
    assert_int_equal(metrics_hist_init(&h, metrics_buckets_tpot_s, metrics_buckets_tpot_s_count),
                     0);
    /* One observation just above each bound, and one far above all of them. */
    for (size_t i = 0; i < h.num_bounds; i++)
        metrics_hist_observe(&h, h.bounds[i] * 1.0001);
    metrics_hist_observe(&h, 1e9);
    metrics_hist_observe(&h, NAN); /* ignored */
    assert_int_equal(h.count, h.num_bounds + 1);
    assert_int_equal(metrics_hist_cumulative(&h, 0), 0);
    for (size_t i = 1; i < h.num_bounds; i++)
        assert_int_equal(metrics_hist_cumulative(&h, i), i);
    assert_int_equal(metrics_hist_cumulative(&h, h.num_bounds), h.count);

    /* The rendered buckets never decrease and end at the count. */
    struct metrics_buf b;
    metrics_buf_init(&b, 1 << 16);
    metrics_family(&b, "pagoda_time_per_output_token_seconds", METRICS_HISTOGRAM, "TPOT.");
    assert_int_equal(metrics_histogram(&b, NULL, 0, &h), 0);
    const char *p = b.data;
    unsigned long prev = 0, n = 0, lines = 0;
    while ((p = strstr(p, "_bucket{le=\""))) {
        p = strchr(p, '}');
        assert_non_null(p);
        assert_int_equal(sscanf(p, "} %lu", &n), 1);
        assert_true(n >= prev);
        prev = n;
        lines++;
    }
    assert_int_equal(lines, h.num_bounds + 1);
    assert_int_equal(n, h.count);
    assert_non_null(strstr(b.data, "_bucket{le=\"+Inf\"} 25\n"));
    metrics_buf_fini(&b);
}

static void test_default_buckets_are_valid(void **state)
{
    struct metrics_hist h;
    assert_int_equal(metrics_hist_init(&h, metrics_buckets_ttft_s, metrics_buckets_ttft_s_count),
                     0);
    assert_int_equal(metrics_hist_init(&h, metrics_buckets_tpot_s, metrics_buckets_tpot_s_count),
                     0);
    assert_int_equal(metrics_hist_init(&h, metrics_buckets_e2e_s, metrics_buckets_e2e_s_count), 0);
    static const double bad[] = {1, 1};
    assert_int_equal(metrics_hist_init(&h, bad, 2), PAGODA_EINVAL);
    static const double inf[] = {1, INFINITY};
    assert_int_equal(metrics_hist_init(&h, inf, 2), PAGODA_EINVAL);
    assert_int_equal(metrics_hist_init(&h, bad, 0), PAGODA_EINVAL);
}

static void test_bad_names_and_misuse_are_refused(void **state)
{
    struct metrics_buf b;
    metrics_buf_init(&b, 4096);
    assert_int_equal(metrics_sample(&b, NULL, 0, 1), PAGODA_EINVAL); /* no family */
    metrics_buf_reset(&b);
    assert_int_equal(metrics_family(&b, "9lives", METRICS_GAUGE, ""), PAGODA_EINVAL);
    metrics_buf_reset(&b);
    assert_int_equal(metrics_family(&b, "a b", METRICS_GAUGE, ""), PAGODA_EINVAL);
    metrics_buf_reset(&b);
    metrics_family(&b, "ok", METRICS_GAUGE, "");
    struct metrics_label l1 = {"ten:ant", "x"};
    assert_int_equal(metrics_sample(&b, &l1, 1, 1), PAGODA_EINVAL);
    /* Sticky: a later good call returns the first error. */
    assert_int_equal(metrics_sample(&b, NULL, 0, 1), PAGODA_EINVAL);
    metrics_buf_reset(&b);
    metrics_family(&b, "ok", METRICS_GAUGE, "");
    struct metrics_label l2 = {"__reserved", "x"};
    assert_int_equal(metrics_sample(&b, &l2, 1, 1), PAGODA_EINVAL);
    metrics_buf_reset(&b);
    static const double bounds[] = {1};
    struct metrics_hist h;
    metrics_hist_init(&h, bounds, 1);
    metrics_family(&b, "h_seconds", METRICS_HISTOGRAM, "");
    struct metrics_label le = {"le", "1"};
    assert_int_equal(metrics_histogram(&b, &le, 1, &h), PAGODA_EINVAL);
    metrics_buf_reset(&b);
    metrics_family(&b, "h_seconds", METRICS_HISTOGRAM, "");
    assert_int_equal(metrics_sample(&b, NULL, 0, 1), PAGODA_EINVAL);
    metrics_buf_reset(&b);
    metrics_family(&b, "c_total", METRICS_COUNTER, "");
    assert_int_equal(metrics_histogram(&b, NULL, 0, &h), PAGODA_EINVAL);
    metrics_buf_fini(&b);
}

static void test_size_bound(void **state)
{
    struct metrics_buf b;
    metrics_buf_init(&b, 100);
    metrics_family(&b, "g", METRICS_GAUGE, "");
    int rc = 0;
    for (int i = 0; i < 100 && rc == 0; i++)
        rc = metrics_sample(&b, NULL, 0, i);
    assert_int_equal(rc, PAGODA_EEXHAUSTED);
    assert_true(b.len <= 100);
    metrics_buf_reset(&b);
    assert_int_equal(b.err, 0);
    assert_int_equal(metrics_family(&b, "g", METRICS_GAUGE, ""), 0);
    metrics_buf_fini(&b);
}

/* A registry shaped like the router's, for promtool. */
static int print_registry(void)
{
    struct metrics_buf b;
    metrics_buf_init(&b, 1 << 20);
    struct metrics_hist ttft, tpot, e2e;
    metrics_hist_init(&ttft, metrics_buckets_ttft_s, metrics_buckets_ttft_s_count);
    metrics_hist_init(&tpot, metrics_buckets_tpot_s, metrics_buckets_tpot_s_count);
    metrics_hist_init(&e2e, metrics_buckets_e2e_s, metrics_buckets_e2e_s_count);
    for (int i = 0; i < 50; i++) {
        metrics_hist_observe(&ttft, 0.01 * i);
        metrics_hist_observe(&tpot, 0.002 * i);
        metrics_hist_observe(&e2e, 0.3 * i);
    }
    struct metrics_label tenants[2] = {{"tenant", "default"}, {"tenant", "we \"quote\"\\n"}};
    metrics_family(&b, "pagoda_prompt_tokens_total", METRICS_COUNTER, "Prompt tokens.");
    metrics_sample(&b, &tenants[0], 1, 100);
    metrics_sample(&b, &tenants[1], 1, 5);
    metrics_family(&b, "pagoda_generation_tokens_total", METRICS_COUNTER, "Generated tokens.");
    metrics_sample(&b, &tenants[0], 1, 400);
    metrics_family(&b, "pagoda_request_success_total", METRICS_COUNTER,
                   "Finished requests by reason.");
    const char *reasons[] = {"stop", "length", "abort"};
    for (int i = 0; i < 3; i++) {
        struct metrics_label l[2] = {{"tenant", "default"}, {"finished_reason", reasons[i]}};
        metrics_sample(&b, l, 2, i);
    }
    metrics_family(&b, "pagoda_num_requests_running", METRICS_GAUGE, "Running requests.");
    metrics_sample(&b, NULL, 0, 3);
    metrics_family(&b, "pagoda_kv_cache_usage_perc", METRICS_GAUGE, "KV usage, 0 to 1.");
    metrics_sample(&b, NULL, 0, 0.4375);
    metrics_family(&b, "pagoda_time_to_first_token_seconds", METRICS_HISTOGRAM,
                   "Time to first token.\nSecond line.");
    metrics_histogram(&b, &tenants[0], 1, &ttft);
    metrics_histogram(&b, &tenants[1], 1, &ttft);
    metrics_family(&b, "pagoda_time_per_output_token_seconds", METRICS_HISTOGRAM,
                   "Time per output token.");
    metrics_histogram(&b, NULL, 0, &tpot);
    metrics_family(&b, "pagoda_e2e_request_latency_seconds", METRICS_HISTOGRAM,
                   "End-to-end request latency.");
    int rc = metrics_histogram(&b, NULL, 0, &e2e);
    if (rc == 0)
        fwrite(b.data, 1, b.len, stdout);
    metrics_buf_fini(&b);
    return rc == 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "--print") == 0)
        return print_registry();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_registry_exact_text),
        cmocka_unit_test(test_escaping_of_label_values_and_help),
        cmocka_unit_test(test_numbers_print_exactly),
        cmocka_unit_test(test_histogram_buckets_are_cumulative),
        cmocka_unit_test(test_default_buckets_are_valid),
        cmocka_unit_test(test_bad_names_and_misuse_are_refused),
        cmocka_unit_test(test_size_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
