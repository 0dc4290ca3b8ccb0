/* The router tests' client side (test_router.c, test_router_tenants.c, test_router_admin.c):
 * libpagoda clients with
 * the tests' timeout, greedy parameters, the stand-in scheduler's tokens checked, raw REQ calls
 * for what libpagoda never sends, and the teardown of a cmocka group's router. */
#ifndef PAGODA_TESTS_UNIT_ROUTER_TEST_CLIENT_H
#define PAGODA_TESTS_UNIT_ROUTER_TEST_CLIENT_H

#include "client/pagoda.h"
#include "proto/pagoda.pb-c.h"
#include "tests/unit/router_fake_scheduler.h"

#include <nng/nng.h>
#include <stddef.h>
#include <stdint.h>

/* A client of e's router with a 5 s timeout. */
pagoda_client *rt_open_client(const struct rtr_env *e);

/* Greedy sampling of max_tokens tokens, with their log-probabilities. */
pagoda_generate_params rt_greedy(int32_t max_tokens);

/* Asserts that got[0..count) are the stand-in scheduler's tokens for prompt from position first. */
void rt_assert_tokens(const int32_t *prompt, size_t n, const int32_t *got, size_t count,
                      uint32_t first);

/* Sends bytes on a fresh REQ socket and returns the unpacked reply, or NULL when none came
 * within timeout_ms. */
Pagoda__ClientResponse *rt_raw_call(const struct rtr_env *e, const void *bytes, size_t len,
                                    int timeout_ms);

/* Packs req, sends it as rt_raw_call does (5 s) and asserts that a reply came. */
Pagoda__ClientResponse *rt_raw_request(const struct rtr_env *e, Pagoda__ClientRequest *req);

/* A Submit with defaults for everything but what the test changes. */
struct rt_raw_submit {
    Pagoda__ClientRequest req;
    Pagoda__SubmitRequest sub;
    Pagoda__SamplingParams sp;
    uint8_t id[16];
    int32_t prompt[8];
};

/* A greedy Submit of the prompt 11 12 13 with id and max_tokens. */
void rt_raw_submit_init(struct rt_raw_submit *r, const uint8_t *id, int32_t max_tokens);

/* The response's error code, 0 when it has none. */
int rt_response_code(const Pagoda__ClientResponse *resp);

/* Polls until the request has finished; returns the final piece's finish reason (and the count
 * of tokens in *count unless NULL). */
pagoda_finish_reason rt_wait_finished(pagoda_client *c, const uint8_t *id, uint32_t *count);

/* n copies of one call sent at once on one REQ socket's contexts, each then waiting for its
 * answer (a poll or stats call the router parks). */
struct rt_calls {
    nng_socket s;
    int n;
    nng_ctx *ctxs;
    nng_aio **aios;
};

/* Packs req and sends it n times on a fresh socket to url (asserting each send). */
void rt_calls_send(struct rt_calls *k, const char *url, Pagoda__ClientRequest *req, int n);

/* With wait, asserts that every call is answered (within 30 s of its send); without, drops the
 * calls unanswered. Closes the socket. */
void rt_calls_end(struct rt_calls *k, int wait);

/* A random request id. */
void rt_random_id(uint8_t id[16]);

/* A cmocka group teardown: stops the router of *state (a struct rtr_env), -1 unless it exited 0
 * after SIGTERM. */
int rt_env_teardown(void **state);

#endif
