/* Tests of deploy/control.c: the sender names of the supervisor's Control messages. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "deploy/control.h"

static void test_role_names(void **state)
{
    (void)state;
    for (int r = 0; r < ROLE_COUNT; r++) {
        enum role role = ROLE_COUNT;
        int id = 5;
        assert_int_equal(control_parse_sender(role_names[r], 4, &role, &id), 0);
        assert_int_equal(role, r);
        assert_int_equal(id, -1);
    }
}

static void test_worker_ids(void **state)
{
    (void)state;
    enum role role = ROLE_COUNT;
    int id = -1;
    assert_int_equal(control_parse_sender("worker-0", 4, &role, &id), 0);
    assert_int_equal(role, ROLE_WORKER);
    assert_int_equal(id, 0);
    assert_int_equal(control_parse_sender("worker-3", 4, &role, &id), 0);
    assert_int_equal(id, 3);
    assert_int_equal(control_parse_sender("worker-4", 4, &role, &id), PAGODA_EINVAL);
    assert_int_equal(id, -1);
    assert_int_equal(control_parse_sender("worker--1", 4, &role, &id), PAGODA_EINVAL);
    assert_int_equal(control_parse_sender("worker-", 4, &role, &id), PAGODA_EINVAL);
    assert_int_equal(control_parse_sender("worker-1x", 4, &role, &id), PAGODA_EINVAL);
    assert_int_equal(control_parse_sender("Router", 4, &role, &id), PAGODA_EINVAL);
    assert_int_equal(control_parse_sender(NULL, 4, &role, &id), PAGODA_EINVAL);
    assert_int_equal(control_parse_sender("worker-99999999999999999999", 4, &role, &id),
                     PAGODA_EINVAL);
}

/* Found by fuzz_supervisor_control: strtoll's leniency made "worker-+1", "worker- 1" and
 * "worker-01" all worker 1. A sender is accepted only under the name the programs send
 * ("worker-%d"), so that each worker has one name (in the log, and in what is compared). */
static void test_only_canonical_worker_names(void **state)
{
    (void)state;
    enum role role = ROLE_COUNT;
    int id = -1;
    const char *odd[] = {"worker-+1", "worker- 1", "worker-01", "worker-00", "worker-\t2"};
    for (size_t i = 0; i < sizeof(odd) / sizeof(odd[0]); i++) {
        assert_int_equal(control_parse_sender(odd[i], 4, &role, &id), PAGODA_EINVAL);
        assert_int_equal(id, -1);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_role_names),
        cmocka_unit_test(test_worker_ids),
        cmocka_unit_test(test_only_canonical_worker_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
