/* Tests of common/: error codes and details, JSON access, command-line value parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/dtype.h"
#include "common/error.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/sampling_flags.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* -Wl,--wrap=clock_gettime: while fake_clock is set, every clock reads fake_ms. */
static int fake_clock;
static int64_t fake_ms;
int __real_clock_gettime(clockid_t clk, struct timespec *ts);
int __wrap_clock_gettime(clockid_t clk, struct timespec *ts)
{
    if (!fake_clock)
        return __real_clock_gettime(clk, ts);
    ts->tv_sec = (time_t)(fake_ms / 1000);
    ts->tv_nsec = (long)(fake_ms % 1000) * 1000000;
    return 0;
}

static void test_strerror_covers_every_code(void **state)
{
    for (int e = PAGODA_EINTERNAL; e <= 0; e++)
        assert_string_not_equal(pagoda_strerror(e), "unknown error");
    assert_string_equal(pagoda_strerror(-1000), "unknown error");
}

static void test_error_detail_is_kept_and_cleared(void **state)
{
    int rc = pagoda_error_set(PAGODA_ENOENT, "tensor %s missing", "lm_head.weight");
    assert_int_equal(rc, PAGODA_ENOENT);
    char buf[128];
    assert_string_equal(pagoda_error_message(rc, buf, sizeof(buf)),
                        "tensor lm_head.weight missing (not found)");
    pagoda_error_clear();
    assert_string_equal(pagoda_error_message(rc, buf, sizeof(buf)), "not found");
}

static void test_json_getters_tell_missing_from_wrong(void **state)
{
    json_error_t jerr;
    json_t *o = json_loads("{\"a\": 3, \"b\": 2.5, \"c\": true, \"d\": \"x\", \"e\": null,"
                           " \"f\": 4.0}",
                           0, &jerr);
    assert_non_null(o);
    int64_t i;
    double d;
    bool b;
    const char *s;
    assert_int_equal(json_util_get_int(o, "a", &i), 0);
    assert_int_equal(i, 3);
    assert_int_equal(json_util_get_int(o, "f", &i), 0);
    assert_int_equal(i, 4);
    assert_int_equal(json_util_get_int(o, "b", &i), PAGODA_EFORMAT);
    assert_int_equal(json_util_get_int(o, "zz", &i), PAGODA_ENOENT);
    assert_int_equal(json_util_get_int(o, "e", &i), PAGODA_ENOENT);
    assert_int_equal(json_util_get_number(o, "b", &d), 0);
    assert_true(d == 2.5);
    assert_int_equal(json_util_get_bool(o, "c", &b), 0);
    assert_true(b);
    assert_int_equal(json_util_get_bool(o, "a", &b), PAGODA_EFORMAT);
    assert_int_equal(json_util_get_string(o, "d", &s), 0);
    assert_string_equal(s, "x");
    assert_int_equal(json_util_get_string(o, "a", &s), PAGODA_EFORMAT);
    json_decref(o);
}

static void test_json_load_file_errors(void **state)
{
    json_t *root;
    assert_int_equal(json_util_load_file("/nonexistent/config.json", 100, &root), PAGODA_ENOENT);
    char path[] = "/tmp/pagoda_json_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("{\"a\": [1, 2,}", f);
    fclose(f);
    assert_int_equal(json_util_load_file(path, 100, &root), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), path));
    assert_int_equal(json_util_load_file(path, 4, &root), PAGODA_ERANGE);
    unlink(path);
    /* A directory or a FIFO in place of the file: refused by name, and the FIFO's open does not
     * wait for a writer (before, it blocked here until the test timed out). */
    assert_int_equal(mkdir(path, 0700), 0);
    assert_int_equal(json_util_load_file(path, 100, &root), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "directory"));
    assert_int_equal(rmdir(path), 0);
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_int_equal(json_util_load_file(path, 100, &root), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), path));
    assert_non_null(strstr(pagoda_error_detail(), "FIFO"));
    unlink(path);
}

static void test_parse_values(void **state)
{
    int64_t i;
    double d;
    assert_int_equal(parse_i64("--n", "42", 0, 100, &i), 0);
    assert_int_equal(i, 42);
    assert_int_equal(parse_i64("--n", "42x", 0, 100, &i), PAGODA_EINVAL);
    assert_int_equal(parse_i64("--n", "", 0, 100, &i), PAGODA_EINVAL);
    assert_int_equal(parse_i64("--n", "101", 0, 100, &i), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "--n"));
    assert_int_equal(parse_f64("--t", "0.5", 0, 2, &d), 0);
    assert_true(d == 0.5);
    assert_int_equal(parse_f64("--t", "nan", 0, 2, &d), PAGODA_EINVAL);
    assert_int_equal(parse_f64("--t", "-1", 0, 2, &d), PAGODA_ERANGE);
    /* decimal text alone: no white space, hexadecimal or infinity; 1e400 is out of range */
    assert_int_equal(parse_i64("--n", " 42", 0, 100, &i), PAGODA_EINVAL);
    assert_int_equal(parse_i64("--n", "+42", 0, 100, &i), 0);
    assert_int_equal(parse_f64("--t", " 0.5", 0, 2, &d), PAGODA_EINVAL);
    assert_int_equal(parse_f64("--t", "0x1", 0, 2, &d), PAGODA_EINVAL);
    assert_int_equal(parse_f64("--t", "inf", -1e9, 1e9, &d), PAGODA_EINVAL);
    assert_int_equal(parse_f64("--t", "1e400", -1e9, 1e9, &d), PAGODA_ERANGE);
    assert_int_equal(parse_f64("--t", "-1e400", -1e9, 1e9, &d), PAGODA_ERANGE);
    assert_int_equal(parse_f64("--t", "1e-400", -1, 1, &d), PAGODA_ERANGE);
    assert_int_equal(parse_f64("--t", "0e-400", -1, 1, &d), 0);
    assert_true(d == 0.0);
    assert_int_equal(parse_f64("--t", "2.5e-1", 0, 2, &d), 0);
    assert_true(d == 0.25);
    float f;
    assert_int_equal(parse_f32("--t", "1e-50", 0, 2, &f), PAGODA_ERANGE);
    assert_int_equal(parse_f32("--t", "1e-30", 0, 2, &f), 0);
    assert_true(f == 1e-30f);
    assert_int_equal(parse_f32("--t", "0", 0, 2, &f), 0);
    assert_true(f == 0.0f);
    int32_t id;
    assert_int_equal(parse_id_value("--logit-bias", "5:-1.5", 100, &id, &d), 0);
    assert_true(id == 5 && d == -1.5);
    assert_int_equal(parse_id_value("--logit-bias", " 5:1", 100, &id, &d), PAGODA_EINVAL);
    assert_int_equal(parse_id_value("--logit-bias", "5: 1", 100, &id, &d), PAGODA_EINVAL);
    assert_int_equal(parse_id_value("--logit-bias", "5:0x10", 100, &id, &d), PAGODA_EINVAL);
    assert_int_equal(parse_id_value("--logit-bias", "5:1e400", 100, &id, &d), PAGODA_ERANGE);

    int32_t *v;
    size_t n;
    assert_int_equal(parse_i32_list("--tokens", "1,2,3", 0, 10, 8, &v, &n), 0);
    assert_int_equal(n, 3);
    assert_int_equal(v[2], 3);
    free(v);
    assert_int_equal(parse_i32_list("--tokens", "1,,3", 0, 10, 8, &v, &n), PAGODA_EINVAL);
    assert_int_equal(parse_i32_list("--tokens", "1,2,", 0, 10, 8, &v, &n), PAGODA_EINVAL);
    assert_int_equal(parse_i32_list("--tokens", "1,11", 0, 10, 8, &v, &n), PAGODA_ERANGE);
    assert_int_equal(parse_i32_list("--tokens", " 1,2", 0, 10, 8, &v, &n), PAGODA_EINVAL);
    assert_int_equal(parse_i32_list("--tokens", "1, 2", 0, 10, 8, &v, &n), PAGODA_EINVAL);
    assert_int_equal(parse_i32_list("--tokens", "1,2,3", 0, 10, 2, &v, &n), PAGODA_ERANGE);
    int on = -1;
    assert_int_equal(parse_on_off("--cuda-graphs", "on", &on), 0);
    assert_int_equal(on, 1);
    assert_int_equal(parse_on_off("--cuda-graphs", "off", &on), 0);
    assert_int_equal(on, 0);
    assert_int_equal(parse_on_off("--cuda-graphs", "yes", &on), PAGODA_EINVAL);
    assert_int_equal(parse_on_off("--cuda-graphs", "", &on), PAGODA_EINVAL);
    assert_int_equal(on, 0);
}

static void test_bf16_round_trip_and_rounding(void **state)
{
    /* Values exactly representable in bf16 survive; others round to nearest even. */
    float exact[] = {0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f};
    for (size_t k = 0; k < sizeof(exact) / sizeof(exact[0]); k++)
        assert_true(bf16_to_f32(f32_to_bf16(exact[k])) == exact[k]);
    /* 1 + 2^-8 lies exactly between 1 and 1 + 2^-7: ties go to the even mantissa (1). */
    assert_true(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)) == 1.0f);
    assert_true(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)) == 1.0f + 4.0f / 256);
    assert_true(isnan(bf16_to_f32(f32_to_bf16(NAN))));
    assert_true(f16_to_f32(0x3c00) == 1.0f);
    assert_true(f16_to_f32(0xc000) == -2.0f);
    assert_true(f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    assert_true(isinf(f16_to_f32(0x7c00)));
}

/* The F8E4M3 codes' values from their fields, and f32_to_e4m3 against a search of all 254
 * finite codes for the nearest (ties to the even code, magnitudes past 448 saturating). */
static void test_e4m3_codes_and_rounding(void **state)
{
    (void)state;
    assert_true(e4m3_to_f32(0x00) == 0.0f && signbit(e4m3_to_f32(0x80)));
    assert_true(e4m3_to_f32(0x38) == 1.0f);                   /* exponent 7 = bias */
    assert_true(e4m3_to_f32(0x7e) == 448.0f);                 /* the largest */
    assert_true(e4m3_to_f32(0x01) == ldexpf(1.0f, -9));       /* the smallest subnormal */
    assert_true(e4m3_to_f32(0x08) == ldexpf(1.0f, -6));       /* the smallest normal */
    assert_true(e4m3_to_f32(0xb5) == -(1.0f + 5.0f / 8) / 2); /* -1.625 * 2^-1 */
    assert_true(isnan(e4m3_to_f32(0x7f)) && isnan(e4m3_to_f32(0xff)));
    assert_int_equal(dtype_size(DTYPE_F8E4M3), 1);
    for (int c = 0; c < 256; c++)
        if ((c & 0x7f) != 0x7f)
            assert_int_equal(f32_to_e4m3(e4m3_to_f32((uint8_t)c)), c);
    assert_int_equal(f32_to_e4m3(NAN), 0x7f);
    assert_int_equal(f32_to_e4m3(INFINITY), 0x7e);
    assert_int_equal(f32_to_e4m3(-INFINITY), 0xfe);
    assert_int_equal(f32_to_e4m3(1e6f), 0x7e);
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < 200000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        /* magnitudes 2^-12 .. 2^10, and every 8th exactly between two codes */
        float f = ldexpf((float)(x >> 40) / (float)(1 << 24) + 0.5f, (int)(x % 23) - 11);
        if (x % 2)
            f = -f;
        if (i % 8 == 0) {
            const uint8_t lo = f32_to_e4m3(f) & 0x7f;
            if (lo < 0x7e)
                f = copysignf((e4m3_to_f32(lo) + e4m3_to_f32((uint8_t)(lo + 1))) / 2, f);
        }
        int best = -1;
        double best_d = INFINITY;
        for (int c = 0; c < 256; c++) {
            if ((c & 0x7f) == 0x7f || (c & 0x80) != (signbit(f) ? 0x80 : 0))
                continue;
            const double d = fabs((double)e4m3_to_f32((uint8_t)c) - (double)f);
            if (d < best_d || (d == best_d && (c & 1) == 0)) {
                best_d = d;
                best = c;
            }
        }
        if (fabsf(f) > 448.0f)
            best = (signbit(f) ? 0x80 : 0) | 0x7e;
        if (f32_to_e4m3(f) != best)
            fail_msg("f32_to_e4m3(%a) = 0x%02x, nearest 0x%02x", (double)f, f32_to_e4m3(f), best);
    }
}

static void test_log_level_parse(void **state)
{
    enum log_level l;
    assert_int_equal(log_level_parse("warn", &l), 0);
    assert_int_equal(l, LOG_WARN);
    assert_int_equal(log_level_parse("loud", &l), PAGODA_EINVAL);
}

/* Standard error is captured in a temporary file between log_capture and log_captured, which
 * returns what was written (malloc'd) and the number of lines. */
static int saved_stderr = -1;
static FILE *capture;

static void log_capture(void)
{
    fflush(stderr);
    capture = tmpfile();
    assert_non_null(capture);
    saved_stderr = dup(2);
    assert_true(saved_stderr >= 0);
    assert_int_equal(dup2(fileno(capture), 2), 2);
}

static char *log_captured(int *lines)
{
    fflush(stderr);
    assert_int_equal(dup2(saved_stderr, 2), 2);
    close(saved_stderr);
    long n = ftell(capture);
    assert_true(n >= 0);
    char *text = calloc(1, (size_t)n + 1);
    assert_non_null(text);
    rewind(capture);
    assert_int_equal(fread(text, 1, (size_t)n, capture), (size_t)n);
    fclose(capture);
    *lines = 0;
    for (long i = 0; i < n; i++)
        *lines += text[i] == '\n';
    return text;
}

/* A line repeated back to back is printed once, then counted: the count comes out with the next
 * other line, and every LOG_REPEAT_REPORT_MS while the repetition lasts. */
static void test_log_repeats_are_counted(void **state)
{
    fake_clock = 1;
    fake_ms = 1000000;
    log_set_level(LOG_INFO);
    log_capture();
    for (int i = 0; i < 1000; i++)
        log_warn("worker 0 refused step 7: sampler: logit 3 is nan");
    log_info("something else");
    int lines;
    char *text = log_captured(&lines);
    assert_int_equal(lines, 3);
    assert_non_null(strstr(text, "refused step 7: sampler: logit 3 is nan\n"));
    assert_non_null(strstr(text, "refused step 7: sampler: logit 3 is nan [repeated 999 times]\n"));
    assert_non_null(strstr(text, "something else\n"));
    free(text);

    /* One repetition a second for 100 s: reported every 10 s, not 100 times. */
    log_capture();
    for (int i = 0; i < 100; i++) {
        log_error("the pool is gone");
        fake_ms += 1000;
    }
    log_info("back");
    text = log_captured(&lines);
    assert_int_equal(lines, 1 + 9 + 1 + 1);
    assert_non_null(strstr(text, "the pool is gone [repeated 10 times]"));
    assert_non_null(strstr(text, "the pool is gone [repeated 9 times]"));
    free(text);
    fake_clock = 0;
}

/* One call site making different lines (a counter in them) prints at most LOG_SITE_BURST a
 * window; the rest are counted and reported with its next printed line. Debug is not limited. */
static void test_log_call_site_burst_is_limited(void **state)
{
    fake_clock = 1;
    fake_ms = 2000000;
    log_set_level(LOG_DEBUG);
    log_capture();
    for (int i = 0; i < 1000; i++)
        log_warn("resync %d to worker 0", i);
    fake_ms += LOG_SITE_WINDOW_MS;
    log_warn("resync %d to worker 0", 1000);
    for (int i = 0; i < 100; i++)
        log_debug("step %d: 1 token", i);
    int lines;
    char *text = log_captured(&lines);
    assert_int_equal(lines, LOG_SITE_BURST + 1 + 100);
    assert_non_null(strstr(text, "resync 19 to worker 0\n"));
    assert_null(strstr(text, "resync 20 to worker 0"));
    char want[96];
    snprintf(want, sizeof(want), "resync 1000 to worker 0 [%d similar lines suppressed]\n",
             1000 - LOG_SITE_BURST);
    assert_non_null(strstr(text, want));
    assert_non_null(strstr(text, "step 99: 1 token\n"));
    free(text);
    log_set_level(LOG_INFO);
    fake_clock = 0;
}

/* The sampling flags pagoda-run and `pagoda generate` share: each value read into its field
 * and marked given; refusals name the flag. */
static void test_sampling_flags(void **state)
{
    (void)state;
    struct sampling_flags f = {0};
    assert_false(sampling_flag_is('m'));
    assert_true(sampling_flag_is(SAMPLING_FLAG_SEED));
    assert_false(sampling_flag_is(SAMPLING_FLAG_END));
    assert_int_equal(sampling_flag_parse(SAMPLING_FLAG_TEMPERATURE, "0.5", &f), 0);
    assert_int_equal(sampling_flag_parse(SAMPLING_FLAG_TOP_K, "40", &f), 0);
    assert_int_equal(sampling_flag_parse(SAMPLING_FLAG_SEED, "18446744073709551615", &f),
                     PAGODA_ERANGE);
    assert_int_equal(sampling_flag_parse(SAMPLING_FLAG_SEED, "7", &f), 0);
    assert_true(f.temperature == 0.5f && f.top_k == 40 && f.seed == 7);
    assert_true(SAMPLING_FLAG_GIVEN(&f, SAMPLING_FLAG_TEMPERATURE));
    assert_true(SAMPLING_FLAG_GIVEN(&f, SAMPLING_FLAG_SEED));
    assert_false(SAMPLING_FLAG_GIVEN(&f, SAMPLING_FLAG_TOP_P));
    /* a refused value leaves its field and its bit as they were */
    assert_int_equal(sampling_flag_parse(SAMPLING_FLAG_TOP_P, "0", &f), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "--top-p"));
    assert_false(SAMPLING_FLAG_GIVEN(&f, SAMPLING_FLAG_TOP_P));
    assert_int_equal(sampling_flag_parse(SAMPLING_FLAG_REPETITION_PENALTY, "0", &f), PAGODA_ERANGE);
    assert_int_equal(sampling_flag_parse(SAMPLING_FLAG_TEMPERATURE, "1e-50", &f), PAGODA_ERANGE);
    assert_true(f.temperature == 0.5f);
    assert_int_equal(sampling_flag_parse(SAMPLING_FLAG_PRESENCE_PENALTY, "-2.5", &f),
                     PAGODA_ERANGE);
    assert_int_equal(sampling_flag_parse(SAMPLING_FLAG_FREQUENCY_PENALTY, "-2", &f), 0);
    assert_true(f.frequency_penalty == -2.0f);
    assert_int_equal(sampling_flag_parse('m', "x", &f), PAGODA_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_strerror_covers_every_code),
        cmocka_unit_test(test_error_detail_is_kept_and_cleared),
        cmocka_unit_test(test_json_getters_tell_missing_from_wrong),
        cmocka_unit_test(test_json_load_file_errors),
        cmocka_unit_test(test_parse_values),
        cmocka_unit_test(test_sampling_flags),
        cmocka_unit_test(test_bf16_round_trip_and_rounding),
        cmocka_unit_test(test_e4m3_codes_and_rounding),
        cmocka_unit_test(test_log_level_parse),
        cmocka_unit_test(test_log_repeats_are_counted),
        cmocka_unit_test(test_log_call_site_burst_is_limited),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
