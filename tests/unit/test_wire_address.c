/* Tests of wire/address.c: the check every program applies to its address flags. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "wire/address.h"

#include <string.h>

static void test_accepted(void **state)
{
    (void)state;
    const char *good[] = {"ipc:///tmp/pagoda/scheduler.ipc",
                          "tcp://127.0.0.1:7450",
                          "tcp://0.0.0.0:1",
                          "tcp://*:65535",
                          "tcp://engine-0.pagoda.svc:7460",
                          "tcp://[::1]:7450",
                          "tcp://localhost:80"};
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
        assert_int_equal(wire_address_check("--listen", good[i], WIRE_ADDRESS_ANY), 0);
    assert_int_equal(wire_address_check("--x", "ipc:///tmp/a.ipc", WIRE_ADDRESS_IPC_ONLY), 0);
}

/* Each refusal names the flag and says what is wrong. */
static void expect_refused(const char *address, enum wire_address_kind kind, int err,
                           const char *says)
{
    pagoda_error_clear();
    assert_int_equal(wire_address_check("--scheduler-listen", address, kind), err);
    const char *detail = pagoda_error_detail();
    assert_non_null(detail);
    assert_non_null(strstr(detail, "--scheduler-listen"));
    if (strstr(detail, says) == NULL)
        fail_msg("'%s': '%s' does not say '%s'", address, detail, says);
}

static void test_refused(void **state)
{
    (void)state;
    expect_refused("", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "empty");
    expect_refused("http://127.0.0.1:80", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "expected ipc://");
    expect_refused("127.0.0.1:7450", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "expected ipc://");
    expect_refused("tcp://127.0.0.1", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "port is missing");
    expect_refused("tcp://127.0.0.1:", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "must be a number");
    expect_refused("tcp://127.0.0.1:http", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "must be a number");
    expect_refused("tcp://127.0.0.1:-1", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "must be a number");
    expect_refused("tcp://127.0.0.1:0", WIRE_ADDRESS_ANY, PAGODA_ERANGE, "out of range");
    expect_refused("tcp://127.0.0.1:65536", WIRE_ADDRESS_ANY, PAGODA_ERANGE, "out of range");
    expect_refused("tcp://127.0.0.1:999999", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "must be a number");
    expect_refused("tcp://:7450", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "host is missing");
    expect_refused("tcp://a b:7450", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "cannot be in a host");
    expect_refused("tcp://::1:7450", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "cannot be in a host");
    expect_refused("tcp://[::1:7450", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "closing ']'");
    expect_refused("ipc://", WIRE_ADDRESS_ANY, PAGODA_EINVAL, "path is missing");
    expect_refused("tcp://127.0.0.1:7450", WIRE_ADDRESS_IPC_ONLY, PAGODA_EINVAL, "must be ipc://");

    char long_path[200] = "ipc:///";
    memset(long_path + 7, 'a', 120);
    long_path[127] = '\0';
    expect_refused(long_path, WIRE_ADDRESS_ANY, PAGODA_ERANGE, "at most 107");
    char too_long[WIRE_ADDRESS_MAX + 20] = "tcp://";
    memset(too_long + 6, 'h', WIRE_ADDRESS_MAX);
    too_long[WIRE_ADDRESS_MAX + 6] = '\0';
    expect_refused(too_long, WIRE_ADDRESS_ANY, PAGODA_ERANGE, "bytes long");
}

static void test_ports(void **state)
{
    (void)state;
    assert_int_equal(wire_address_port("tcp://127.0.0.1:7460"), 7460);
    assert_int_equal(wire_address_port("tcp://[::1]:80"), 80);
    assert_int_equal(wire_address_port("ipc:///tmp/x.ipc"), -1);
    assert_int_equal(wire_address_port("tcp://h:0"), -1);
    char buf[64];
    assert_int_equal(wire_address_offset_port(buf, sizeof(buf), "tcp://127.0.0.1:7460", 2), 0);
    assert_string_equal(buf, "tcp://127.0.0.1:7462");
    assert_int_equal(wire_address_offset_port(buf, sizeof(buf), "tcp://[::1]:7460", 1), 0);
    assert_string_equal(buf, "tcp://[::1]:7461");
    assert_int_equal(wire_address_offset_port(buf, sizeof(buf), "tcp://h:65535", 1), PAGODA_ERANGE);
    assert_int_equal(wire_address_offset_port(buf, sizeof(buf), "ipc:///x", 1), PAGODA_EINVAL);
    assert_int_equal(wire_address_offset_port(buf, 8, "tcp://127.0.0.1:7460", 1), PAGODA_ERANGE);
}

/* A flag that only dials refuses a host of every interface: NNG cannot dial *, and 0.0.0.0 or
 * [::] name no peer. */
static void test_dial_only(void **state)
{
    (void)state;
    expect_refused("tcp://*:7460", WIRE_ADDRESS_DIAL, PAGODA_EINVAL, "this flag dials");
    expect_refused("tcp://0.0.0.0:7460", WIRE_ADDRESS_DIAL, PAGODA_EINVAL, "this flag dials");
    expect_refused("tcp://[::]:7460", WIRE_ADDRESS_DIAL, PAGODA_EINVAL, "this flag dials");
    assert_int_equal(wire_address_check("--scheduler", "tcp://10.0.0.5:7460", WIRE_ADDRESS_DIAL),
                     0);
    assert_int_equal(wire_address_check("--scheduler", "tcp://[::1]:7460", WIRE_ADDRESS_DIAL), 0);
    assert_int_equal(wire_address_check("--scheduler", "ipc:///tmp/s.ipc", WIRE_ADDRESS_DIAL), 0);
    assert_int_equal(wire_address_is_wildcard("tcp://*:1"), 1);
    assert_int_equal(wire_address_is_wildcard("tcp://0.0.0.0:1"), 1);
    assert_int_equal(wire_address_is_wildcard("tcp://[::]:1"), 1);
    assert_int_equal(wire_address_is_wildcard("tcp://0.0.0.01:1"), 0);
    assert_int_equal(wire_address_is_wildcard("ipc:///tmp/*"), 0);
}

/* The address a peer on this host dials: every interface is reached on the loopback. */
static void test_dial_form(void **state)
{
    (void)state;
    char buf[64];
    const char *cases[][2] = {{"tcp://*:7450", "tcp://127.0.0.1:7450"},
                              {"tcp://0.0.0.0:7450", "tcp://127.0.0.1:7450"},
                              {"tcp://[::]:7450", "tcp://[::1]:7450"},
                              {"tcp://10.1.2.3:7450", "tcp://10.1.2.3:7450"},
                              {"ipc:///tmp/c.ipc", "ipc:///tmp/c.ipc"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(wire_address_dial_form(buf, sizeof(buf), cases[i][0]), 0);
        assert_string_equal(buf, cases[i][1]);
    }
    assert_int_equal(wire_address_dial_form(buf, 10, "tcp://*:7450"), PAGODA_ERANGE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted),  cmocka_unit_test(test_refused),
        cmocka_unit_test(test_ports),     cmocka_unit_test(test_dial_only),
        cmocka_unit_test(test_dial_form),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
