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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_absent_means_the_default_everywhere),
        cmocka_unit_test(test_set_fields_survive_the_round_trip),
        cmocka_unit_test(test_both_refuse_the_same_values),
        cmocka_unit_test(test_absent_client_fields_take_the_base),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
