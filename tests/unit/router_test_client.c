/* The router tests' client side: router_test_client.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "tests/unit/router_test_client.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

pagoda_client *rt_open_client(const struct rtr_env *e)
{
    pagoda_client *c = NULL;
    assert_int_equal(pagoda_client_open(e->url, &c), 0);
    pagoda_client_set_timeout_ms(c, 5000);
    return c;
}

pagoda_generate_params rt_greedy(int32_t max_tokens)
{
    pagoda_generate_params p = pagoda_generate_params_default();
    p.temperature = 0.0f;
    p.max_tokens = max_tokens;
    p.logprobs = 1;
    return p;
}

void rt_assert_tokens(const int32_t *prompt, size_t n, const int32_t *got, size_t count,
                      uint32_t first)
{
    for (size_t i = 0; i < count; i++)
        assert_int_equal(got[i], fake_sched_token(prompt, n, first + (uint32_t)i));
}

Pagoda__ClientResponse *rt_raw_call(const struct rtr_env *e, const void *bytes, size_t len,
                                    int timeout_ms)
{
    nng_socket s;
    assert_int_equal(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, timeout_ms);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, timeout_ms);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, 60000);
    assert_int_equal(nng_dial(s, e->url, NULL, 0), 0);
    assert_int_equal(nng_send(s, (void *)bytes, len, 0), 0);
    nng_msg *m = NULL;
    Pagoda__ClientResponse *resp = NULL;
    if (nng_recvmsg(s, &m, 0) == 0) {
        resp = pagoda__client_response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
        assert_non_null(resp);
        nng_msg_free(m);
    }
    nng_close(s);
    return resp;
}

Pagoda__ClientResponse *rt_raw_request(const struct rtr_env *e, Pagoda__ClientRequest *req)
{
    size_t len = pagoda__client_request__get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    pagoda__client_request__pack(req, buf);
    Pagoda__ClientResponse *resp = rt_raw_call(e, buf, len, 5000);
    free(buf);
    assert_non_null(resp);
    return resp;
}

void rt_calls_send(struct rt_calls *k, const char *url, Pagoda__ClientRequest *req, int n)
{
    size_t len = pagoda__client_request__get_packed_size(req);
    uint8_t *buf = malloc(len + 1);
    assert_non_null(buf);
    pagoda__client_request__pack(req, buf);
    k->n = n;
    k->ctxs = calloc((size_t)n, sizeof(*k->ctxs));
    k->aios = calloc((size_t)n, sizeof(*k->aios));
    assert_true(k->ctxs != NULL && k->aios != NULL);
    assert_int_equal(nng_req0_open(&k->s), 0);
    assert_int_equal(nng_dial(k->s, url, NULL, 0), 0);
    for (int i = 0; i < n; i++) {
        nng_msg *m;
        assert_int_equal(nng_ctx_open(&k->ctxs[i], k->s), 0);
        assert_int_equal(nng_aio_alloc(&k->aios[i], NULL, NULL), 0);
        assert_int_equal(nng_msg_alloc(&m, len), 0);
        memcpy(nng_msg_body(m), buf, len);
        nng_aio_set_msg(k->aios[i], m);
        nng_aio_set_timeout(k->aios[i], 30000);
        nng_ctx_send(k->ctxs[i], k->aios[i]);
        nng_aio_wait(k->aios[i]);
        assert_int_equal(nng_aio_result(k->aios[i]), 0);
        nng_ctx_recv(k->ctxs[i], k->aios[i]);
    }
    free(buf);
}

void rt_calls_end(struct rt_calls *k, int wait)
{
    for (int i = 0; i < k->n; i++) {
        if (wait) {
            nng_aio_wait(k->aios[i]);
            assert_int_equal(nng_aio_result(k->aios[i]), 0);
        } else {
            nng_aio_stop(k->aios[i]);
        }
        if (nng_aio_result(k->aios[i]) == 0)
            nng_msg_free(nng_aio_get_msg(k->aios[i]));
        nng_aio_free(k->aios[i]);
        nng_ctx_close(k->ctxs[i]);
    }
    nng_close(k->s);
    free(k->ctxs);
    free(k->aios);
    memset(k, 0, sizeof(*k));
}

void rt_raw_submit_init(struct rt_raw_submit *r, const uint8_t *id, int32_t max_tokens)
{
    pagoda__client_request__init(&r->req);
    pagoda__submit_request__init(&r->sub);
    pagoda__sampling_params__init(&r->sp);
    memcpy(r->id, id, 16);
    r->prompt[0] = 11;
    r->prompt[1] = 12;
    r->prompt[2] = 13;
    r->sub.has_request_id = 1;
    r->sub.request_id.data = r->id;
    r->sub.request_id.len = 16;
    r->sub.n_prompt_token_ids = 3;
    r->sub.prompt_token_ids = r->prompt;
    r->sub.has_max_tokens = 1;
    r->sub.max_tokens = max_tokens;
    r->sp.has_temperature = 1;
    r->sp.temperature = 0.0f;
    r->sub.sampling = &r->sp;
    r->req.call_case = PAGODA__CLIENT_REQUEST__CALL_SUBMIT;
    r->req.submit = &r->sub;
}

int rt_response_code(const Pagoda__ClientResponse *resp)
{
    return resp->has_error_code ? resp->error_code : 0;
}

pagoda_finish_reason rt_wait_finished(pagoda_client *c, const uint8_t *id, uint32_t *count)
{
    uint32_t have = 0;
    for (int i = 0; i < 1000; i++) {
        pagoda_result r;
        assert_int_equal(pagoda_poll(c, id, have, 2000, &r), 0);
        have += (uint32_t)r.num_tokens;
        pagoda_finish_reason f = r.finish_reason;
        pagoda_result_free(&r);
        if (f != PAGODA_FINISH_NONE) {
            if (count)
                *count = have;
            return f;
        }
    }
    fail_msg("the request never finished");
    return PAGODA_FINISH_NONE;
}

void rt_random_id(uint8_t id[16])
{
    assert_int_equal(getrandom(id, 16, 0), 16);
}

int rt_env_teardown(void **state)
{
    struct rtr_env *e = *state;
    int status = rtr_env_stop(e);
    if (status != 0) {
        fprintf(stderr, "pagoda-router exited with status %d after SIGTERM\n", status);
        return -1;
    }
    return 0;
}
