/* Tests of kvpool/kvpool_proto.c: kvpool's request check and the client's reading of its
 * answer, without sockets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "kvpool/kvpool_proto.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const struct kv_geometry geometry = {
    .pool_id = 42,
    .num_layers = 4,
    .num_blocks = 128,
    .block_size = 16,
    .num_kv_heads = 2,
    .head_dim = 64,
    .dtype = DTYPE_F16,
};

/* Packs an answer the way pagoda-kvpool does and reads it back as a client does. */
static int round_trip(const char *shm, int device, const char *sock, int error_code,
                      struct kvpool_info *info)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    assert_int_equal(kvpool_response_pack(&geometry, shm, device, sock, error_code,
                                          error_code ? "refused" : NULL, &buf, &len),
                     0);
    int rc = kvpool_response_decode(buf, len, info);
    free(buf);
    return rc;
}

static void test_cpu_and_gpu_answers_read_back(void **state)
{
    (void)state;
    struct kvpool_info info;
    assert_int_equal(round_trip("/pagoda-x", -1, NULL, 0, &info), 0);
    assert_true(kv_geometry_equal(&info.geometry, &geometry));
    assert_string_equal(info.shm_name, "/pagoda-x");
    assert_string_equal(info.handle_socket, "");
    assert_int_equal(info.device, -1);

    assert_int_equal(round_trip(NULL, 2, "/run/fds.sock", 0, &info), 0);
    assert_true(kv_geometry_equal(&info.geometry, &geometry));
    assert_string_equal(info.shm_name, "");
    assert_string_equal(info.handle_socket, "/run/fds.sock");
    assert_int_equal(info.device, 2);
}

/* kvpool's error comes through as itself when it is one of pagoda's codes; "not ready" means ask
 * again. */
static void test_known_error_codes(void **state)
{
    (void)state;
    struct kvpool_info info;
    assert_int_equal(round_trip("/p", -1, NULL, PAGODA_EFORMAT, &info), PAGODA_EFORMAT);
    assert_int_equal(round_trip("/p", -1, NULL, PAGODA_EINTERNAL, &info), PAGODA_EINTERNAL);
    assert_int_equal(round_trip("/p", -1, NULL, PAGODA_EBUSY, &info), PAGODA_ETIMEDOUT);
}

/* Found by fuzz_kvpool_response: an error code outside pagoda's error space (a negative number
 * no PAGODA_E* has, or a positive one) is a broken answer, never handed on as a code the
 * callers would print or compare as if it were pagoda's. */
static void test_foreign_error_codes_are_protocol_errors(void **state)
{
    (void)state;
    struct kvpool_info info;
    assert_int_equal(round_trip("/p", -1, NULL, -1000, &info), PAGODA_EPROTO);
    assert_int_equal(round_trip("/p", -1, NULL, PAGODA_EINTERNAL - 1, &info), PAGODA_EPROTO);
    assert_int_equal(round_trip("/p", -1, NULL, INT_MIN, &info), PAGODA_EPROTO);
    assert_int_equal(round_trip("/p", -1, NULL, 5, &info), PAGODA_EPROTO);
}

static void test_broken_answers_are_refused(void **state)
{
    (void)state;
    struct kvpool_info info;
    const uint8_t garbage[] = {0x0f, 0x01};
    assert_int_equal(kvpool_response_decode(garbage, sizeof(garbage), &info), PAGODA_EPROTO);
    assert_int_equal(kvpool_response_decode(NULL, 0, &info), PAGODA_EPROTO); /* no geometry */
    assert_int_equal(round_trip(NULL, -1, NULL, 0, &info), PAGODA_EPROTO);   /* nowhere */
    assert_int_equal(round_trip(NULL, -1, "/s", 0, &info), PAGODA_EPROTO);   /* no device */
    char long_name[KVPOOL_NAME_MAX + 1];
    memset(long_name, 'n', sizeof(long_name) - 1);
    long_name[0] = '/';
    long_name[sizeof(long_name) - 1] = '\0';
    assert_int_equal(round_trip(long_name, -1, NULL, 0, &info), PAGODA_EPROTO);
}

static void test_request_check(void **state)
{
    (void)state;
    const uint8_t request[] = {0x08, 0x01, 0x10, 0x01, 0x18, 0x03}; /* version, geometry, id */
    assert_int_equal(kvpool_request_check(request, sizeof(request)), 0);
    assert_int_equal(kvpool_request_check(NULL, 0), 0); /* every field is optional */
    const uint8_t truncated[] = {0x08, 0x01, 0x10};
    assert_int_equal(kvpool_request_check(truncated, sizeof(truncated)), PAGODA_EFORMAT);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_and_gpu_answers_read_back),
        cmocka_unit_test(test_known_error_codes),
        cmocka_unit_test(test_foreign_error_codes_are_protocol_errors),
        cmocka_unit_test(test_broken_answers_are_refused),
        cmocka_unit_test(test_request_check),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
