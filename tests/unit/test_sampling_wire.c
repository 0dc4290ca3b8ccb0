/* wire/sampling_wire.c: the one reading of the protocols' sampling parameters. The client's and
 * the internal message, absent or partly set, give the same parameters as
 * sampling_params_default() with the set fields applied, and both refuse the same values. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "common/error.h"
#include "wire/sampling_wire.h"

#include <math.h>
#include <string.h>

static void assert_params_equal(const struct sampling_params *a, const struct sampling_params *b)
{
    assert_true(a->temperature == b->temperature);
    assert_int_equal(a->top_k, b->top_k);
    assert_true(a->top_p == b->top_p);
    assert_true(a->min_p == b->min_p);
    assert_true(a->repetition_penalty == b->repetition_penalty);
    assert_true(a->presence_penalty == b->presence_penalty);
    assert_true(a->frequency_penalty == b->frequency_penalty);
    assert_true(a->seed == b->seed);
    assert_int_equal(a->min_tokens, b->min_tokens);
}

static void test_absent_means_the_default_everywhere(void **state)
{
    (void)state;
    struct sampling_params def = sampling_params_default(), c, i;
    assert_true(def.temperature == 1.0f);
    assert_int_equal(sampling_from_client(NULL, &c), 0);
    assert_int_equal(sampling_from_internal(NULL, &i), 0);
    assert_params_equal(&c, &def);
    assert_params_equal(&i, &def);
    Pagoda__SamplingParams cm = PAGODA__SAMPLING_PARAMS__INIT;
    Pagoda__Internal__SamplingParams im = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    assert_int_equal(sampling_from_client(&cm, &c), 0);
    assert_int_equal(sampling_from_internal(&im, &i), 0);
    assert_params_equal(&c, &def);
    assert_params_equal(&i, &def);
}

static void test_set_fields_survive_the_round_trip(void **state)
{
    (void)state;
    Pagoda__SamplingParams cm = PAGODA__SAMPLING_PARAMS__INIT;
    cm.has_temperature = cm.has_top_k = cm.has_min_p = cm.has_seed = 1;
    cm.temperature = 0.0f;
    cm.top_k = 7;
    cm.min_p = 0.25f;
    cm.seed = 99;
    struct sampling_params c, back;
    assert_int_equal(sampling_from_client(&cm, &c), 0);
    assert_true(c.temperature == 0.0f);
    assert_int_equal(c.top_k, 7);
    assert_true(c.top_p == 1.0f); /* absent: the default */
    Pagoda__Internal__SamplingParams im = sampling_to_internal(&c);
    assert_int_equal(sampling_from_internal(&im, &back), 0);
    assert_params_equal(&back, &c);
}

static void test_both_refuse_the_same_values(void **state)
{
    (void)state;
    Pagoda__SamplingParams cm = PAGODA__SAMPLING_PARAMS__INIT;
    Pagoda__Internal__SamplingParams im = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    struct sampling_params out;
    cm.has_top_p = im.has_top_p = 1;
    cm.top_p = im.top_p = 0.0f;
    assert_int_equal(sampling_from_client(&cm, &out), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "top_p"));
    assert_int_equal(sampling_from_internal(&im, &out), PAGODA_ERANGE);
    cm.top_p = im.top_p = 1.0f;
    cm.has_temperature = im.has_temperature = 1;
    cm.temperature = im.temperature = NAN;
    assert_int_equal(sampling_from_client(&cm, &out), PAGODA_EINVAL);
    assert_int_equal(sampling_from_internal(&im, &out), PAGODA_EINVAL);
}

/* A client's absent fields take the base given (the router's: the model's recommendations),
 * its present ones stay its own; the result is validated either way. */
static void test_absent_client_fields_take_the_base(void **state)
{
    (void)state;
    struct sampling_params base = sampling_params_default(), out;
    base.temperature = 0.6f;
    base.top_p = 0.9f;
    base.top_k = 20;
    Pagoda__SamplingParams cm = PAGODA__SAMPLING_PARAMS__INIT;
    cm.has_top_p = cm.has_seed = 1;
    cm.top_p = 0.5f;
    cm.seed = 3;
    assert_int_equal(sampling_from_client_over(&cm, &base, &out), 0);
    assert_true(out.temperature == 0.6f && out.top_p == 0.5f && out.top_k == 20);
    assert_true(out.min_p == 0.0f && out.repetition_penalty == 1.0f && out.seed == 3);
    assert_int_equal(sampling_from_client_over(NULL, &base, &out), 0);
    assert_params_equal(&out, &base);
    base.top_p = 0.0f; /* a bad base is refused as a bad field would be */
    assert_int_equal(sampling_from_client_over(NULL, &base, &out), PAGODA_ERANGE);
    cm.top_p = 0.25f;
    assert_int_equal(sampling_from_client_over(&cm, &base, &out), 0);
}

/* min_tokens travels as the other fields do, and a negative one is refused by both. */
static void test_min_tokens_round_trip(void **state)
{
    (void)state;
    Pagoda__SamplingParams cm = PAGODA__SAMPLING_PARAMS__INIT;
    cm.has_min_tokens = 1;
    cm.min_tokens = 5;
    struct sampling_params c, back;
    assert_int_equal(sampling_from_client(&cm, &c), 0);
    assert_int_equal(c.min_tokens, 5);
    Pagoda__Internal__SamplingParams im = sampling_to_internal(&c);
    assert_true(im.has_min_tokens && im.min_tokens == 5);
    assert_int_equal(sampling_from_internal(&im, &back), 0);
    assert_params_equal(&back, &c);
    cm.min_tokens = -1;
    assert_int_equal(sampling_from_client(&cm, &c), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "min_tokens"));
}

/* The logit bias: read from either message, checked, copied; written back into a message. */
static void test_logit_bias_read_and_checked(void **state)
{
    (void)state;
    int32_t ids[3] = {7, 0, 99};
    float values[3] = {100.0f, -100.0f, 0.5f};
    Pagoda__SamplingParams cm = PAGODA__SAMPLING_PARAMS__INIT;
    cm.n_logit_bias_token_ids = cm.n_logit_bias_values = 3;
    cm.logit_bias_token_ids = ids;
    cm.logit_bias_values = values;
    struct logit_bias b;
    assert_int_equal(logit_bias_from_client(&cm, 100, &b), 0);
    assert_int_equal(b.n, 3);
    assert_true(b.ids != ids && b.ids[2] == 99 && b.values[1] == -100.0f);
    Pagoda__Internal__SamplingParams im = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    logit_bias_to_internal(&b, &im);
    struct logit_bias back;
    assert_int_equal(logit_bias_from_internal(&im, 0, &back), 0);
    assert_int_equal(back.n, 3);
    assert_memory_equal(back.ids, ids, sizeof(ids));
    assert_memory_equal(back.values, values, sizeof(values));
    logit_bias_fini(&back);
    logit_bias_fini(&b);
    assert_null(b.ids);
    /* absent: none */
    assert_int_equal(logit_bias_from_client(NULL, 100, &b), 0);
    assert_int_equal(b.n, 0);
    /* refusals, each naming what is wrong */
    const struct {
        int32_t id;
        float value;
        size_t n_values;
        int64_t vocab;
        int code;
        const char *says;
    } bad[] = {
        {7, 1.0f, 2, 100, PAGODA_EINVAL, "3 token ids but 2 values"},
        {100, 1.0f, 3, 100, PAGODA_ERANGE, "outside the vocabulary"},
        {-1, 1.0f, 3, 0, PAGODA_ERANGE, "token id -1 is negative"},
        {7, 100.5f, 3, 100, PAGODA_ERANGE, "outside [-100, 100]"},
        {7, NAN, 3, 100, PAGODA_EINVAL, "not a finite number"},
        {7, INFINITY, 3, 100, PAGODA_EINVAL, "not a finite number"},
        {0, 1.0f, 3, 100, PAGODA_EINVAL, "names token 0 twice"},
    };
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        int32_t bids[3] = {bad[k].id, 0, 99};
        float bvalues[3] = {bad[k].value, 1.0f, 2.0f};
        if (bad[k].id == 0) /* the duplicate case: 0 is listed second too */
            bids[2] = 5;
        cm.logit_bias_token_ids = bids;
        cm.logit_bias_values = bvalues;
        cm.n_logit_bias_values = bad[k].n_values;
        assert_int_equal(logit_bias_from_client(&cm, bad[k].vocab, &b), bad[k].code);
        if (strstr(pagoda_error_detail(), bad[k].says) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", k, pagoda_error_detail(), bad[k].says);
        assert_int_equal(b.n, 0);
        cm.n_logit_bias_values = 3;
    }
    /* more than the limit */
    int32_t many_ids[SAMPLING_LOGIT_BIAS_MAX + 1];
    float many_values[SAMPLING_LOGIT_BIAS_MAX + 1];
    for (int i = 0; i <= SAMPLING_LOGIT_BIAS_MAX; i++) {
        many_ids[i] = i;
        many_values[i] = 1.0f;
    }
    assert_int_equal(logit_bias_validate(many_ids, SAMPLING_LOGIT_BIAS_MAX, many_values,
                                         SAMPLING_LOGIT_BIAS_MAX, 0),
                     0);
    assert_int_equal(logit_bias_validate(many_ids, SAMPLING_LOGIT_BIAS_MAX + 1, many_values,
                                         SAMPLING_LOGIT_BIAS_MAX + 1, 0),
                     PAGODA_ERANGE);
}

/* A row's entries: the suppressed stop ids (-inf), then the bias pairs, without the suppressed
 * ids' pairs (logit_bias_without). Applied, each adds to its own row and token. */
static void test_logit_entries_build_and_apply(void **state)
{
    (void)state;
    int32_t ids[3] = {4, 2, 6};
    float values[3] = {1.5f, 3.0f, -2.0f};
    struct logit_bias b = {3, ids, values}, rest;
    int32_t suppress[2] = {2, 5};
    assert_int_equal(logit_bias_without(&b, suppress, 2, &rest), 0);
    assert_int_equal(rest.n, 2);
    assert_true(rest.ids[0] == 4 && rest.ids[1] == 6 && rest.values[1] == -2.0f);
    struct logit_entry e[LOGIT_ENTRIES_PER_ROW];
    int32_t n = logit_entries_build(1, &rest, suppress, 2, e);
    assert_int_equal(n, 4); /* 2 and 5 suppressed; 4 and 6 biased */
    assert_true(e[0].row == 1 && e[0].token == 2 && isinf(e[0].value) && e[0].value < 0);
    assert_true(e[1].token == 5 && isinf(e[1].value));
    assert_true(e[2].token == 4 && e[2].value == 1.5f && e[3].token == 6 && e[3].value == -2.0f);
    n = logit_entries_build(1, &b, NULL, 0, e); /* not suppressing: the whole bias */
    assert_int_equal(n, 3);
    assert_true(e[0].token == 4 && e[1].token == 2 && e[1].value == 3.0f && e[2].token == 6);
    assert_int_equal(logit_entries_build(0, NULL, NULL, 0, e), 0);
    assert_int_equal(logit_entries_build(0, NULL, suppress, 2, e), 2);
    logit_bias_fini(&rest);
    struct logit_bias none = {0};
    assert_int_equal(logit_bias_without(&none, suppress, 2, &rest), 0);
    assert_int_equal(rest.n, 0);

    float logits[2][8] = {{0}};
    for (int v = 0; v < 8; v++)
        logits[0][v] = logits[1][v] = (float)v;
    struct logit_entry add[3] = {{0, 7, -100.0f}, {1, 0, 50.0f}, {1, 3, -INFINITY}};
    logit_entries_apply(&logits[0][0], 8, add, 3);
    assert_true(logits[0][7] == -93.0f && logits[1][0] == 50.0f && isinf(logits[1][3]));
    assert_true(logits[0][0] == 0.0f && logits[1][7] == 7.0f && logits[0][3] == 3.0f);
}

static void test_suppress_ids_checked(void **state)
{
    (void)state;
    int32_t ids[3] = {1, 2, 1};
    assert_int_equal(logit_suppress_validate(ids, 2, 10), 0);
    assert_int_equal(logit_suppress_validate(ids, 3, 10), PAGODA_EINVAL);
    assert_int_equal(logit_suppress_validate(ids, 2, 2), PAGODA_ERANGE);
    assert_int_equal(logit_suppress_validate(NULL, 1, 10), PAGODA_EINVAL);
    assert_int_equal(logit_suppress_validate(ids, SAMPLING_SUPPRESS_MAX + 1, 10), PAGODA_ERANGE);
}

/* The stop rules the scheduler and pagoda-run share: min_tokens' suppress list and the stop
 * decision. */
static void test_stop_rules(void **state)
{
    (void)state;
    const int32_t eos[3] = {2, 9, 2}, stop[4] = {9, 4, -1, 10};
    int32_t out[SAMPLING_SUPPRESS_MAX];
    /* the EOS ids first, each once; ids outside [0, 10) left out */
    assert_int_equal(stop_ids_suppressed(eos, 3, stop, 4, 10, out), 3);
    assert_int_equal(out[0], 2);
    assert_int_equal(out[1], 9);
    assert_int_equal(out[2], 4);
    assert_int_equal(stop_ids_suppressed(eos, 0, stop, 2, 5, out), 1);
    assert_int_equal(out[0], 4);
    assert_int_equal(stop_ids_suppressed(NULL, 0, NULL, 0, 10, out), 0);

    /* no stop within the first min_tokens output tokens, then an EOS or a stop id ends it */
    assert_false(stop_token_ends(2, 3, 3, 0, eos, 2, stop, 2));
    assert_true(stop_token_ends(2, 4, 3, 0, eos, 2, stop, 2));
    assert_true(stop_token_ends(4, 1, 0, 0, eos, 2, stop, 2));
    assert_false(stop_token_ends(5, 1, 0, 0, eos, 2, stop, 2));
    /* ignore_eos: an EOS id ends it only as a stop id */
    assert_false(stop_token_ends(2, 1, 0, 1, eos, 2, stop, 2));
    assert_true(stop_token_ends(9, 1, 0, 1, eos, 2, stop, 2));
    /* a stop id's min_tokens boundary, with ignore_eos too */
    assert_false(stop_token_ends(4, 2, 2, 1, eos, 2, stop, 2));
    assert_true(stop_token_ends(4, 3, 2, 1, eos, 2, stop, 2));
    assert_false(stop_token_ends(2, 3, 2, 1, eos, 2, stop, 2));

    /* an id twice in one list, INT32_MAX, and a full list of 64 + 64 distinct ids */
    const int32_t twice[3] = {7, 7, INT32_MAX};
    assert_int_equal(stop_ids_suppressed(twice, 3, NULL, 0, (int64_t)INT32_MAX + 1, out), 2);
    assert_int_equal(out[1], INT32_MAX);
    int32_t a[64], b[64];
    for (int32_t i = 0; i < 64; i++) {
        a[i] = i;
        b[i] = 1000 + i;
    }
    assert_int_equal(stop_ids_suppressed(a, 64, b, 64, 2000, out), SAMPLING_SUPPRESS_MAX);
    assert_int_equal(out[SAMPLING_SUPPRESS_MAX - 1], 1063);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absent_means_the_default_everywhere),
        cmocka_unit_test(test_set_fields_survive_the_round_trip),
        cmocka_unit_test(test_both_refuse_the_same_values),
        cmocka_unit_test(test_absent_client_fields_take_the_base),
        cmocka_unit_test(test_min_tokens_round_trip),
        cmocka_unit_test(test_logit_bias_read_and_checked),
        cmocka_unit_test(test_logit_entries_build_and_apply),
        cmocka_unit_test(test_suppress_ids_checked),
        cmocka_unit_test(test_stop_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
