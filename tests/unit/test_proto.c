/* The client protocol compiles and round-trips; malformed bytes unpack to NULL, not a crash. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "proto/pagoda.pb-c.h"

#include <stdlib.h>

static void test_submit_round_trip(void **state)
{
    int32_t prompt[] = {1, 2, 3};
    uint8_t id[16] = {7};
    Pagoda__SamplingParams sp = PAGODA__SAMPLING_PARAMS__INIT;
    sp.temperature = 0.5f;
    sp.has_seed = 1;
    sp.seed = 99;
    Pagoda__SubmitRequest sub = PAGODA__SUBMIT_REQUEST__INIT;
    sub.request_id.data = id;
    sub.request_id.len = sizeof(id);
    sub.n_prompt_token_ids = 3;
    sub.prompt_token_ids = prompt;
    sub.sampling = &sp;
    sub.max_tokens = 8;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.protocol_version = 1;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_SUBMIT;
    req.submit = &sub;

    size_t len = pagoda__client_request__get_packed_size(&req);
    uint8_t *buf = malloc(len);
    assert_int_equal(pagoda__client_request__pack(&req, buf), len);
    Pagoda__ClientRequest *back = pagoda__client_request__unpack(NULL, len, buf);
    assert_non_null(back);
    assert_int_equal(back->call_case, PAGODA__CLIENT_REQUEST__CALL_SUBMIT);
    assert_int_equal(back->submit->n_prompt_token_ids, 3);
    assert_int_equal(back->submit->prompt_token_ids[2], 3);
    assert_true(back->submit->sampling->has_seed);
    assert_int_equal(back->submit->sampling->seed, 99);
    pagoda__client_request__free_unpacked(back, NULL);

    /* Truncated input is refused. */
    assert_null(pagoda__client_request__unpack(NULL, len - 3, buf));
    free(buf);
}

static void test_garbage_is_refused(void **state)
{
    uint8_t junk[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01};
    assert_null(pagoda__client_request__unpack(NULL, sizeof(junk), junk));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_submit_round_trip),
        cmocka_unit_test(test_garbage_is_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
