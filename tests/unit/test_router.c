/* Tests of router/: pagoda-router against a stand-in scheduler (router_fake_scheduler.h),
 * spoken to through libpagoda and through raw REQ sockets (for what libpagoda never sends). The
 * tenants file and what it bounds are test_router_tenants.c's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "client/pagoda.h"
#include "client/pagoda_async.h"
#include "common/error.h"
#include "common/exit_status.h"
#include "proto/pagoda.pb-c.h"
#include "router/router.h"
#include "router/tenants.h"
#include "tests/unit/router_fake_scheduler.h"
#include "tests/unit/router_test_client.h"
#include "tests/unit/test_files.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- the shared router ------------------------------------------------------------------ */

static int group_setup(void **state)
{
    static struct rtr_env env;
    if (rtr_env_start(&env, NULL) != 0)
        return -1;
    *state = &env;
    return 0;
}

static void test_poll_from_offset_returns_only_later_tokens(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    const int32_t prompt[] = {5, 6, 7};
    pagoda_generate_params p = rt_greedy(10);
    pagoda_result all;
    assert_int_equal(pagoda_generate(c, &p, prompt, 3, &all), 0);
    assert_int_equal(all.finish_reason, PAGODA_FINISH_LENGTH);
    assert_int_equal(all.num_tokens, 10);
    rt_assert_tokens(prompt, 3, all.token_ids, 10, 0);

    pagoda_result r;
    assert_int_equal(pagoda_poll(c, all.request_id, 4, 0, &r), 0);
    assert_int_equal(r.offset, 4);
    assert_int_equal(r.num_tokens, 6);
    rt_assert_tokens(prompt, 3, r.token_ids, 6, 4);
    assert_non_null(r.logprobs);
    assert_true(r.logprobs[0] == fake_sched_logprob(4));
    assert_int_equal(r.finish_reason, PAGODA_FINISH_LENGTH);
    assert_int_equal(r.prompt_tokens, 3);
    assert_int_equal(r.completion_tokens, 10);
    assert_int_equal(r.cached_tokens, 1);
    pagoda_result_free(&r);

    assert_int_equal(pagoda_poll(c, all.request_id, 10, 1000, &r), 0);
    assert_int_equal(r.num_tokens, 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_LENGTH);
    pagoda_result_free(&r);

    assert_int_equal(pagoda_poll(c, all.request_id, 11, 0, &r), PAGODA_ERANGE);
    pagoda_result_free(&all);
    pagoda_client_close(c);
}

struct release_arg {
    struct fake_sched *fs;
    int delay_ms;
};

static void *release_later(void *arg)
{
    struct release_arg *a = arg;
    usleep((useconds_t)a->delay_ms * 1000);
    fake_sched_hold(a->fs, 0);
    return NULL;
}

static void test_poll_wait_returns_early_when_tokens_come(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    const int32_t prompt[] = {21, 22};
    pagoda_generate_params p = rt_greedy(5);
    uint8_t id[16];
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(c, &p, prompt, 2, id), 0);
    struct release_arg a = {e->fs, 150};
    pthread_t t;
    pthread_create(&t, NULL, release_later, &a);
    uint64_t t0 = rtr_now_ms();
    pagoda_result r;
    assert_int_equal(pagoda_poll(c, id, 0, 5000, &r), 0);
    uint64_t elapsed = rtr_now_ms() - t0;
    pthread_join(t, NULL);
    assert_true(elapsed >= 100);
    assert_true(elapsed < 2500);
    assert_true(r.num_tokens >= 1);
    assert_int_equal(r.offset, 0);
    rt_assert_tokens(prompt, 2, r.token_ids, r.num_tokens, 0);
    pagoda_result_free(&r);
    assert_int_equal(rt_wait_finished(c, id, NULL), PAGODA_FINISH_LENGTH);
    pagoda_client_close(c);
}

static void test_poll_wait_runs_out_empty(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    const int32_t prompt[] = {31};
    pagoda_generate_params p = rt_greedy(5);
    uint8_t id[16];
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, id), 0);
    uint64_t t0 = rtr_now_ms();
    pagoda_result r;
    assert_int_equal(pagoda_poll(c, id, 0, 200, &r), 0);
    uint64_t elapsed = rtr_now_ms() - t0;
    assert_true(elapsed >= 190);
    assert_true(elapsed < 2000);
    assert_int_equal(r.num_tokens, 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_NONE);
    pagoda_result_free(&r);
    /* wait_ms 0 answers at once. */
    t0 = rtr_now_ms();
    assert_int_equal(pagoda_poll(c, id, 0, 0, &r), 0);
    assert_true(rtr_now_ms() - t0 < 150);
    assert_int_equal(r.num_tokens, 0);
    pagoda_result_free(&r);
    fake_sched_hold(e->fs, 0);
    assert_int_equal(rt_wait_finished(c, id, NULL), PAGODA_FINISH_LENGTH);
    pagoda_client_close(c);
}

static void test_duplicate_submit_is_one_request(void **state)
{
    struct rtr_env *e = *state;
    struct fake_sched_counts before, after;
    fake_sched_get_counts(e->fs, &before);
    uint8_t id[16];
    rt_random_id(id);
    struct rt_raw_submit s;
    rt_raw_submit_init(&s, id, 4);
    for (int i = 0; i < 2; i++) {
        Pagoda__ClientResponse *resp = rt_raw_request(e, &s.req);
        assert_int_equal(rt_response_code(resp), 0);
        assert_int_equal(resp->result_case, PAGODA__CLIENT_RESPONSE__RESULT_UPDATE);
        assert_int_equal(resp->update->offset, 0);
        assert_int_equal(resp->update->n_token_ids, 0);
        assert_memory_equal(resp->update->request_id.data, id, 16);
        pagoda__client_response__free_unpacked(resp, NULL);
    }
    pagoda_client *c = rt_open_client(e);
    uint32_t count = 0;
    assert_int_equal(rt_wait_finished(c, id, &count), PAGODA_FINISH_LENGTH);
    assert_int_equal(count, 4);
    /* Submitted again after it finished: still the same request, not a new one. */
    Pagoda__ClientResponse *resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), 0);
    assert_int_equal(resp->update->finish_reason, PAGODA__FINISH_REASON__FINISH_LENGTH);
    pagoda__client_response__free_unpacked(resp, NULL);
    fake_sched_get_counts(e->fs, &after);
    assert_int_equal(after.submits, before.submits + 1);
    assert_int_equal(after.repeated_submits, before.repeated_submits);
    /* The router drew a seed, and the request belongs to the default tenant. */
    assert_true(after.last_has_seed);
    assert_string_equal(after.last_tenant, "default");

    /* The same id with other parameters is refused (the finished request's prompt is gone, its
     * hash remains). */
    s.prompt[1] = 99;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_EEXIST);
    pagoda__client_response__free_unpacked(resp, NULL);
    s.prompt[1] = 12;
    s.sub.max_tokens = 5;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_EEXIST);
    assert_non_null(resp->error_message);
    pagoda__client_response__free_unpacked(resp, NULL);
    s.sub.max_tokens = 4;
    s.sp.has_seed = 1;
    s.sp.seed = 7;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_EEXIST);
    pagoda__client_response__free_unpacked(resp, NULL);
    pagoda_client_close(c);
}

static void test_unknown_id_is_enoent(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    uint8_t id[16];
    rt_random_id(id);
    pagoda_result r;
    assert_int_equal(pagoda_poll(c, id, 0, 100, &r), PAGODA_ENOENT);
    assert_non_null(strstr(pagoda_error_detail(), "no request"));
    assert_int_equal(pagoda_cancel(c, id, NULL), PAGODA_ENOENT);
    pagoda_client_close(c);
}

static void test_bad_submits_are_refused(void **state)
{
    struct rtr_env *e = *state;
    uint8_t id[16];
    rt_random_id(id);
    struct rt_raw_submit s;
    Pagoda__ClientResponse *resp;

    rt_raw_submit_init(&s, id, 4);
    s.sub.request_id.len = 15;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_EINVAL);
    pagoda__client_response__free_unpacked(resp, NULL);

    rt_raw_submit_init(&s, id, 4);
    s.sub.has_request_id = 0;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_EINVAL);
    pagoda__client_response__free_unpacked(resp, NULL);

    rt_raw_submit_init(&s, id, 4);
    s.sub.n_prompt_token_ids = 0;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_EINVAL);
    pagoda__client_response__free_unpacked(resp, NULL);

    rt_raw_submit_init(&s, id, 0);
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_ERANGE);
    pagoda__client_response__free_unpacked(resp, NULL);

    rt_raw_submit_init(&s, id, 4);
    s.prompt[1] = -3;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_ERANGE);
    pagoda__client_response__free_unpacked(resp, NULL);

    rt_raw_submit_init(&s, id, 4);
    s.sp.has_top_p = 1;
    s.sp.top_p = 1.5f;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_ERANGE);
    assert_non_null(strstr(resp->error_message, "top_p"));
    pagoda__client_response__free_unpacked(resp, NULL);

    rt_raw_submit_init(&s, id, 4);
    s.sp.temperature = NAN;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_ERANGE);
    pagoda__client_response__free_unpacked(resp, NULL);

    rt_raw_submit_init(&s, id, 4);
    s.sp.has_presence_penalty = 1;
    s.sp.presence_penalty = -2.5f;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_ERANGE);
    pagoda__client_response__free_unpacked(resp, NULL);

    /* Finite and above 0, but outside the sampler's range (a logit divided by it overflows):
     * refused here with the sampler's own definition, not left to fail in the worker. */
    const float bad_penalties[] = {1e-45f, 0.001f, 1000.0f};
    for (size_t k = 0; k < sizeof(bad_penalties) / sizeof(bad_penalties[0]); k++) {
        rt_raw_submit_init(&s, id, 4);
        s.sp.has_repetition_penalty = 1;
        s.sp.repetition_penalty = bad_penalties[k];
        resp = rt_raw_request(e, &s.req);
        assert_int_equal(rt_response_code(resp), PAGODA_ERANGE);
        assert_non_null(strstr(resp->error_message, "repetition_penalty"));
        pagoda__client_response__free_unpacked(resp, NULL);
    }
    rt_raw_submit_init(&s, id, 4);
    s.sp.temperature = 1e-30f;
    resp = rt_raw_request(e, &s.req);
    assert_int_equal(rt_response_code(resp), PAGODA_ERANGE);
    assert_non_null(strstr(resp->error_message, "temperature"));
    pagoda__client_response__free_unpacked(resp, NULL);

    /* The logit bias and min_tokens: each bad one refused, naming why (ids in the vocabulary are
     * the scheduler's to check) */
    int32_t bias_ids[2] = {5, 5};
    float bias_values[2] = {1.0f, 2.0f};
    const struct {
        int32_t id1;
        float v0;
        size_t n_values;
        int32_t min_tokens;
        int code;
        const char *says;
    } bad_bias[] = {
        {5, 1.0f, 2, 0, PAGODA_EINVAL, "names token 5 twice"},
        {6, 100.5f, 2, 0, PAGODA_ERANGE, "outside [-100, 100]"},
        {6, INFINITY, 2, 0, PAGODA_EINVAL, "not a finite number"},
        {-6, 1.0f, 2, 0, PAGODA_ERANGE, "token id -6 is negative"},
        {6, 1.0f, 1, 0, PAGODA_EINVAL, "2 token ids but 1 values"},
        {6, 1.0f, 2, 5, PAGODA_ERANGE, "min_tokens 5 is more than max_tokens 4"},
        {6, 1.0f, 2, -1, PAGODA_ERANGE, "min_tokens"},
    };
    for (size_t k = 0; k < sizeof(bad_bias) / sizeof(bad_bias[0]); k++) {
        rt_raw_submit_init(&s, id, 4);
        bias_ids[1] = bad_bias[k].id1;
        bias_values[0] = bad_bias[k].v0;
        s.sp.n_logit_bias_token_ids = 2;
        s.sp.logit_bias_token_ids = bias_ids;
        s.sp.n_logit_bias_values = bad_bias[k].n_values;
        s.sp.logit_bias_values = bias_values;
        s.sp.has_min_tokens = bad_bias[k].min_tokens != 0;
        s.sp.min_tokens = bad_bias[k].min_tokens;
        resp = rt_raw_request(e, &s.req);
        assert_int_equal(rt_response_code(resp), bad_bias[k].code);
        if (strstr(resp->error_message, bad_bias[k].says) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", k, resp->error_message, bad_bias[k].says);
        pagoda__client_response__free_unpacked(resp, NULL);
    }

    /* None of them was registered. */
    pagoda_client *c = rt_open_client(e);
    pagoda_result r;
    assert_int_equal(pagoda_poll(c, id, 0, 0, &r), PAGODA_ENOENT);
    pagoda_client_close(c);
}

static void test_malformed_bytes_are_answered_and_router_serves(void **state)
{
    struct rtr_env *e = *state;
    static const uint8_t garbage[] = {0xff, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x0a, 0x40, 0x01};
    Pagoda__ClientResponse *resp = rt_raw_call(e, garbage, sizeof(garbage), 5000);
    assert_non_null(resp);
    assert_int_equal(rt_response_code(resp), PAGODA_EFORMAT);
    assert_non_null(resp->error_message);
    pagoda__client_response__free_unpacked(resp, NULL);

    /* An empty message is a valid ClientRequest that names no call. */
    resp = rt_raw_call(e, "", 0, 5000);
    assert_non_null(resp);
    assert_int_equal(rt_response_code(resp), PAGODA_EFORMAT);
    pagoda__client_response__free_unpacked(resp, NULL);

    /* A message above the router's limit is refused by NNG: no answer, and no harm. */
    size_t big = (5u << 20);
    uint8_t *huge = calloc(1, big);
    resp = rt_raw_call(e, huge, big, 300);
    free(huge);
    assert_null(resp);

    /* Within the size limit, but 100,000 one-byte stop strings: refused before a hundred thousand
     * allocations are made, as malformed, and the router goes on. */
    struct rt_raw_submit many;
    rt_raw_submit_init(&many, (const uint8_t *)"many-empty-stops", 4);
    size_t n_stops = 100000;
    ProtobufCBinaryData *stops = calloc(n_stops, sizeof(*stops));
    assert_non_null(stops);
    for (size_t i = 0; i < n_stops; i++) {
        stops[i].data = (uint8_t *)"x";
        stops[i].len = 1;
    }
    many.sub.n_stop = n_stops;
    many.sub.stop = stops;
    size_t len = pagoda__client_request__get_packed_size(&many.req);
    assert_true(len < router_max_message_bytes(ROUTER_DEFAULT_MAX_PROMPT_TOKENS));
    resp = rt_raw_request(e, &many.req);
    free(stops);
    assert_int_equal(rt_response_code(resp), PAGODA_EFORMAT);
    assert_non_null(strstr(resp->error_message, "strings and messages"));
    pagoda__client_response__free_unpacked(resp, NULL);

    pagoda_client *c = rt_open_client(e);
    int healthy = 0;
    assert_int_equal(pagoda_health(c, &healthy), 0);
    assert_true(healthy);
    pagoda_engine_stats st;
    assert_int_equal(pagoda_stats(c, &st), 0);
    assert_true(st.malformed_requests >= 3);
    const int32_t prompt[] = {1, 2};
    pagoda_generate_params p = rt_greedy(3);
    pagoda_result r;
    assert_int_equal(pagoda_generate(c, &p, prompt, 2, &r), 0);
    assert_int_equal(r.num_tokens, 3);
    pagoda_result_free(&r);
    pagoda_client_close(c);
}

static void test_cancel_finishes_cancelled(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    struct fake_sched_counts before, after;
    fake_sched_get_counts(e->fs, &before);
    const int32_t prompt[] = {41, 42, 43};
    pagoda_generate_params p = rt_greedy(50);
    uint8_t id[16];
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(c, &p, prompt, 3, id), 0);
    /* A poll parked on the request is answered by the cancel. */
    pagoda_result r;
    assert_int_equal(pagoda_cancel(c, id, &r), 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_CANCELLED);
    assert_int_equal(r.num_tokens, 0);
    pagoda_result_free(&r);
    for (uint64_t t0 = rtr_now_ms(); rtr_now_ms() - t0 < 2000; usleep(5000)) {
        fake_sched_get_counts(e->fs, &after);
        if (after.cancels > before.cancels)
            break;
    }
    assert_int_equal(after.cancels, before.cancels + 1);
    fake_sched_hold(e->fs, 0);
    usleep(20000);
    assert_int_equal(pagoda_poll(c, id, 0, 1000, &r), 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_CANCELLED);
    assert_int_equal(r.num_tokens, 0);
    assert_int_equal(r.completion_tokens, 0);
    assert_int_equal(r.prompt_tokens, 3);
    pagoda_result_free(&r);
    /* Cancelling again changes nothing. */
    assert_int_equal(pagoda_cancel(c, id, &r), 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_CANCELLED);
    pagoda_result_free(&r);
    pagoda_client_close(c);
}

struct parked_poll {
    pagoda_client *c;
    uint8_t id[16];
    int rc;
    pagoda_result r;
};

static void *poll_thread(void *arg)
{
    struct parked_poll *pp = arg;
    pp->rc = pagoda_poll(pp->c, pp->id, 0, 10000, &pp->r);
    return NULL;
}

static void *poll_thread_3s(void *arg)
{
    struct parked_poll *pp = arg;
    pp->rc = pagoda_poll(pp->c, pp->id, 0, 3000, &pp->r);
    return NULL;
}

static void test_cancel_wakes_a_parked_poll(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    const int32_t prompt[] = {44};
    pagoda_generate_params p = rt_greedy(50);
    struct parked_poll pp = {.c = c};
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, pp.id), 0);
    pthread_t t;
    pthread_create(&t, NULL, poll_thread, &pp);
    usleep(100000);
    uint64_t t0 = rtr_now_ms();
    assert_int_equal(pagoda_cancel(c, pp.id, NULL), 0);
    pthread_join(t, NULL);
    assert_true(rtr_now_ms() - t0 < 2000);
    assert_int_equal(pp.rc, 0);
    assert_int_equal(pp.r.finish_reason, PAGODA_FINISH_CANCELLED);
    pagoda_result_free(&pp.r);
    fake_sched_hold(e->fs, 0);
    pagoda_client_close(c);
}

static void test_stats_round_trip(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    pagoda_engine_stats st;
    assert_int_equal(pagoda_stats(c, &st), 0);
    assert_true(st.peak_running > FAKE_SCHED_PEAK_RUNNING_BASE);
    assert_int_equal(st.num_blocks, 64);
    assert_int_equal(st.free_blocks, 48);
    assert_true(st.kv_usage == 0.25);
    assert_int_equal(st.resyncs, 3);
    assert_int_equal(st.preemptions, 2);
    assert_int_equal(st.prefix_waits, FAKE_SCHED_PREFIX_WAITS);
    assert_true(st.steps > 0);
    assert_true(st.computed_tokens > 0);
    assert_true(st.scheduler_connected);
    assert_true(st.finished_requests > 0);
    assert_string_equal(st.kv_cache_dtype, "float32");
    /* An element the router does not know is left out, as is one not said. */
    fake_sched_set_kv_dtype(e->fs, 99);
    assert_int_equal(pagoda_stats(c, &st), 0);
    assert_string_equal(st.kv_cache_dtype, "");
    fake_sched_set_kv_dtype(e->fs, -1);
    assert_int_equal(pagoda_stats(c, &st), 0);
    assert_string_equal(st.kv_cache_dtype, "");
    fake_sched_set_kv_dtype(e->fs, PAGODA__INTERNAL__DTYPE__DTYPE_F8E4M3);
    assert_int_equal(pagoda_stats(c, &st), 0);
    assert_string_equal(st.kv_cache_dtype, "float8_e4m3fn");
    fake_sched_set_kv_dtype(e->fs, PAGODA__INTERNAL__DTYPE__DTYPE_F32);
    struct fake_sched_counts counts;
    fake_sched_get_counts(e->fs, &counts);
    assert_true(counts.stats_requests >= 1);
    pagoda_client_close(c);
}

static void test_resent_events_do_not_duplicate_tokens(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    fake_sched_set_duplicates(e->fs, 1);
    const int32_t prompt[] = {51, 52, 53, 54};
    pagoda_generate_params p = rt_greedy(20);
    pagoda_result r;
    int rc = pagoda_generate(c, &p, prompt, 4, &r);
    fake_sched_set_duplicates(e->fs, 0);
    assert_int_equal(rc, 0);
    assert_int_equal(r.num_tokens, 20);
    rt_assert_tokens(prompt, 4, r.token_ids, 20, 0);
    for (uint32_t i = 0; i < 20; i++)
        assert_true(r.logprobs[i] == fake_sched_logprob(i));
    assert_int_equal(r.completion_tokens, 20);
    pagoda_result_free(&r);
    pagoda_client_close(c);
}

/* Event messages lost on the link, the end among them, are made good by the scheduler's resend
 * from offset 0: the client gets every token once and its end (a lost end used to leave the
 * client polling for ever). */
static void test_lost_events_are_made_good(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    struct fake_sched_counts before, after;
    fake_sched_get_counts(e->fs, &before);
    fake_sched_lose_events(e->fs, 4);
    const int32_t prompt[] = {57, 58};
    pagoda_generate_params p = rt_greedy(7);
    uint8_t id[16];
    assert_int_equal(pagoda_submit(c, &p, prompt, 2, id), 0);
    /* Polls with a deadline, so that a lost end fails the test instead of hanging it. */
    int32_t tokens[7];
    uint32_t count = 0;
    pagoda_finish_reason f = PAGODA_FINISH_NONE;
    for (uint64_t t0 = rtr_now_ms(); f == PAGODA_FINISH_NONE && rtr_now_ms() - t0 < 10000;) {
        pagoda_result r;
        assert_int_equal(pagoda_poll(c, id, count, 500, &r), 0);
        assert_true(count + r.num_tokens <= 7);
        for (size_t i = 0; i < r.num_tokens; i++) {
            tokens[count + i] = r.token_ids[i];
            assert_true(r.logprobs[i] == fake_sched_logprob(count + (uint32_t)i));
        }
        count += (uint32_t)r.num_tokens;
        f = r.finish_reason;
        if (f != PAGODA_FINISH_NONE)
            assert_int_equal(r.completion_tokens, 7);
        pagoda_result_free(&r);
    }
    fake_sched_lose_events(e->fs, 0);
    assert_int_equal(f, PAGODA_FINISH_LENGTH);
    assert_int_equal(count, 7);
    rt_assert_tokens(prompt, 2, tokens, 7, 0);
    /* The losses and resends reach pagoda stats (the fake reports its own counts). */
    pagoda_engine_stats st;
    assert_int_equal(pagoda_stats(c, &st), 0);
    fake_sched_get_counts(e->fs, &after);
    assert_true(after.resends > before.resends);
    assert_true(after.drops >= before.drops + 4);
    assert_int_equal(st.router_drops, after.drops);
    /* A last resend may come after the end was delivered, between the two calls. */
    assert_true(st.router_resends >= 1 && st.router_resends <= after.resends);
    pagoda_client_close(c);
}

static void test_stop_token_and_engine_error(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    const int32_t prompt[] = {61, 62};
    int32_t stop = fake_sched_token(prompt, 2, 4);
    pagoda_generate_params p = rt_greedy(20);
    p.stop_token_ids = &stop;
    p.num_stop_token_ids = 1;
    pagoda_result r;
    assert_int_equal(pagoda_generate(c, &p, prompt, 2, &r), 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_STOP);
    assert_int_equal(r.num_tokens, 5);
    assert_int_equal(r.token_ids[4], stop);
    pagoda_result_free(&r);

    const int32_t bad[] = {FAKE_SCHED_ERROR_TOKEN};
    p = rt_greedy(5);
    assert_int_equal(pagoda_generate(c, &p, bad, 1, &r), 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_ERROR);
    assert_non_null(r.error_message);
    assert_non_null(strstr(r.error_message, "vocabulary"));
    pagoda_result_free(&r);
    pagoda_client_close(c);
}

/* ---- routers of their own ------------------------------------------------------------------ */

static void test_scheduler_restart_resumes_requests(void **state)
{
    struct rtr_env env, *e = &env;
    assert_int_equal(rtr_env_start(e, NULL), 0);
    pagoda_client *c = rt_open_client(e);
    const int32_t prompt[] = {71, 72, 73};
    pagoda_generate_params p = rt_greedy(30);
    uint8_t id[16];
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(c, &p, prompt, 3, id), 0);
    /* Let the first scheduler produce a few tokens, then replace it. */
    fake_sched_hold(e->fs, 0);
    pagoda_result r;
    assert_int_equal(pagoda_poll(c, id, 0, 2000, &r), 0);
    fake_sched_hold(e->fs, 1);
    uint32_t have = (uint32_t)r.num_tokens;
    assert_true(have >= 1 && have < 30);
    pagoda_result_free(&r);
    fake_sched_stop(e->fs);
    e->fs = NULL;
    assert_int_equal(fake_sched_start(e->sched_url, &e->fs), 0);

    uint32_t count = 0;
    int32_t tokens[30];
    while (count < 30) {
        assert_int_equal(pagoda_poll(c, id, count, 3000, &r), 0);
        assert_true(r.num_tokens > 0 || r.finish_reason == PAGODA_FINISH_NONE);
        assert_true(count + r.num_tokens <= 30);
        memcpy(tokens + count, r.token_ids, r.num_tokens * sizeof(int32_t));
        count += (uint32_t)r.num_tokens;
        pagoda_finish_reason f = r.finish_reason;
        pagoda_result_free(&r);
        if (f != PAGODA_FINISH_NONE) {
            assert_int_equal(f, PAGODA_FINISH_LENGTH);
            break;
        }
    }
    assert_int_equal(count, 30);
    rt_assert_tokens(prompt, 3, tokens, 30, 0);
    struct fake_sched_counts counts;
    fake_sched_get_counts(e->fs, &counts);
    assert_int_equal(counts.submits, 1);
    assert_int_equal(counts.resumed, 1);
    assert_int_equal(counts.output_mismatches, 0);
    pagoda_client_close(c);
    assert_int_equal(rtr_env_stop(e), 0);
}

static void test_sigterm_drains(void **state)
{
    static const char *const args[] = {"--drain-timeout-ms", "5000", NULL};
    struct rtr_env env, *e = &env;
    assert_int_equal(rtr_env_start(e, args), 0);
    pagoda_client *c = rt_open_client(e);
    const int32_t prompt[] = {81, 82};
    pagoda_generate_params p = rt_greedy(10);
    uint8_t id[16];
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(c, &p, prompt, 2, id), 0);

    assert_int_equal(kill(e->router, SIGTERM), 0);
    int healthy = 1;
    for (uint64_t t0 = rtr_now_ms(); healthy && rtr_now_ms() - t0 < 3000;) {
        assert_int_equal(pagoda_health(c, &healthy), 0);
        if (healthy)
            usleep(5000);
    }
    assert_false(healthy);
    assert_non_null(strstr(pagoda_error_detail(), "draining"));

    uint8_t other[16];
    assert_int_equal(pagoda_submit(c, &p, prompt, 2, other), PAGODA_ECLOSED);
    assert_non_null(strstr(pagoda_error_detail(), "draining"));
    assert_int_equal(rtr_env_wait(e, 200), -2); /* still serving the running request */

    fake_sched_hold(e->fs, 0);
    uint32_t count = 0;
    assert_int_equal(rt_wait_finished(c, id, &count), PAGODA_FINISH_LENGTH);
    assert_int_equal(count, 10);
    assert_int_equal(rtr_env_wait(e, 5000), 0);
    pagoda_client_close(c);
    rtr_env_stop(e);
}

/* Requests about the size of the router's message limit (--max-prompt-tokens 1000: 20,384
 * bytes, REQ's 4-byte header counted) are answered at once, refused by the router (its prompt
 * limit) or by libpagoda (its message limit, learnt from a reply), never left to time out: sent
 * over the limit, a request makes NNG drop the connection at every resend. Sizes byte by byte
 * across the limit (the last token's varint takes 1 to 4 bytes). */
static void test_requests_at_the_message_limit_are_answered(void **state)
{
    (void)state;
    static const char *const args[] = {"--max-prompt-tokens", "1000", NULL};
    struct rtr_env env, *e = &env;
    assert_int_equal(rtr_env_start(e, args), 0);
    pagoda_client *c = rt_open_client(e);
    pagoda_client_set_timeout_ms(c, 3000);
    int healthy;
    assert_int_equal(pagoda_health(c, &healthy), 0); /* a reply: the limit is known */
    static int32_t prompt[5200];
    for (int i = 0; i < 5200; i++)
        prompt[i] = 3000000; /* 4 bytes each, packed */
    const int32_t last[] = {1, 200, 20000, 3000000};
    pagoda_generate_params p = rt_greedy(1);
    int refused_by_client = 0, refused_by_router = 0;
    for (int n = 5075; n <= 5100; n++) {
        for (int k = 0; k < 4; k++) {
            prompt[n - 1] = last[k];
            uint8_t id[16];
            int rc = pagoda_submit(c, &p, prompt, (size_t)n, id);
            if (rc == PAGODA_ETIMEDOUT)
                fail_msg("a prompt of %d tokens (last %d) timed out: %s", n, last[k],
                         pagoda_error_detail());
            assert_int_equal(rc, PAGODA_ERANGE);
            if (strstr(pagoda_error_detail(), "router's limit") != NULL)
                refused_by_client++;
            else
                refused_by_router++;
        }
        prompt[n - 1] = 3000000;
    }
    assert_true(refused_by_client > 0 && refused_by_router > 0);
    pagoda_client_close(c);
    rtr_env_stop(e);
}

/* The sampling a request of `mask` (PAGODA_PARAM_*; top_p 0.5 and the rest rt_greedy's where
 * given) reached the scheduler with, through a router started with args. */
static Pagoda__Internal__SamplingParams sampled_with(const char *const *args, unsigned mask)
{
    struct rtr_env env, *e = &env;
    assert_int_equal(rtr_env_start(e, args), 0);
    pagoda_client *c = rt_open_client(e);
    pagoda_generate_params p = rt_greedy(2);
    p.top_p = 0.5f;
    p.model_defaults = mask;
    const int32_t prompt[] = {4, 5};
    pagoda_result r;
    assert_int_equal(pagoda_generate(c, &p, prompt, 2, &r), 0);
    assert_int_equal(r.num_tokens, 2);
    pagoda_result_free(&r);
    struct fake_sched_counts counts;
    fake_sched_get_counts(e->fs, &counts);
    pagoda_client_close(c);
    assert_int_equal(rtr_env_stop(e), 0);
    return counts.last_sampling;
}

/* A model's generation_config.json recommends sampling defaults: a field a request leaves to the
 * model (sent absent) is sampled with the model's value, as vLLM's --generation-config auto does,
 * a field it gives with its own, and one the file does not name with the usual default;
 * --generation-config vllm leaves the file unused. A value out of range stops the router at start
 * naming the file (it would fail every request that leaves the field out). */
static void test_generation_config_defaults(void **state)
{
    (void)state;
    char dir[] = "/tmp/pagoda_gencfg_XXXXXX";
    assert_non_null(mkdtemp(dir));
    test_write_text(dir, "generation_config.json",
                    "{\"temperature\": 0.6, \"top_p\": 0.9, \"top_k\": 20, \"min_p\": 0.05, "
                    "\"repetition_penalty\": 1.1}");
    const char *const args[] = {"--model", dir, NULL};
    const unsigned all = PAGODA_PARAM_TEMPERATURE | PAGODA_PARAM_TOP_P | PAGODA_PARAM_TOP_K |
                         PAGODA_PARAM_MIN_P | PAGODA_PARAM_REPETITION_PENALTY;
    Pagoda__Internal__SamplingParams s = sampled_with(args, all);
    assert_true(s.temperature == 0.6f && s.top_p == 0.9f && s.top_k == 20 && s.min_p == 0.05f &&
                s.repetition_penalty == 1.1f);
    s = sampled_with(args, PAGODA_PARAM_TEMPERATURE | PAGODA_PARAM_TOP_K);
    assert_true(s.temperature == 0.6f && s.top_p == 0.5f && s.top_k == 20 && s.min_p == 0.0f &&
                s.repetition_penalty == 1.0f);
    s = sampled_with(args, 0);
    assert_true(s.temperature == 0.0f && s.top_p == 0.5f && s.top_k == 0 && s.min_p == 0.0f &&
                s.repetition_penalty == 1.0f);
    const char *const vllm[] = {"--model", dir, "--generation-config", "vllm", NULL};
    s = sampled_with(vllm, all);
    assert_true(s.temperature == 1.0f && s.top_p == 1.0f && s.top_k == 0 &&
                s.repetition_penalty == 1.0f);
    s = sampled_with(NULL, all); /* no model folder */
    assert_true(s.temperature == 1.0f && s.top_p == 1.0f && s.top_k == 0);

    char err[4096];
    assert_int_equal(rtr_router_check(args, err, sizeof(err)), 0);
    test_write_text(dir, "generation_config.json", "{\"temperature\": 0.6, \"top_p\": 0}");
    assert_int_equal(rtr_router_check(args, err, sizeof(err)), PAGODA_EXIT_CANNOT_RUN);
    assert_non_null(strstr(err, "generation_config.json: sampling param top_p 0"));
    assert_int_equal(rtr_router_check(vllm, err, sizeof(err)), 0);
    test_write_text(dir, "generation_config.json", "{\"top_k\": \"20\"}");
    assert_int_equal(rtr_router_check(args, err, sizeof(err)), PAGODA_EXIT_CANNOT_RUN);
    assert_non_null(strstr(err, "generation_config.json: \"top_k\""));
    const char *const typo[] = {"--model", dir, "--generation-config", "hf", NULL};
    assert_int_not_equal(rtr_router_check(typo, err, sizeof(err)), 0);
    assert_non_null(strstr(err, "--generation-config: auto or vllm"));

    /* without generation_config.json, config.json's (vLLM's from_model_config): a value out of
     * the sampler's range there is passed over, the start goes on */
    char path[256];
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    unlink(path);
    test_write_text(dir, "config.json", "{\"temperature\": -1, \"top_p\": 0.25}");
    assert_int_equal(rtr_router_check(args, err, sizeof(err)), 0);
    s = sampled_with(args, all);
    assert_true(s.temperature == 1.0f && s.top_p == 0.25f);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* A live request that no call names for --abandon-ms is cancelled, its client taken for gone
 * (its scheduler told, as a Cancel would); one polled meanwhile, or with a poll waiting on it
 * (longer than --abandon-ms), is not, nor in the second after that poll left (a poll names its
 * request until it leaves). */
static void test_abandoned_request_is_cancelled(void **state)
{
    (void)state;
    static const char *const args[] = {"--abandon-ms", "2000", NULL};
    struct rtr_env env, *e = &env;
    assert_int_equal(rtr_env_start(e, args), 0);
    pagoda_client *c = rt_open_client(e);
    struct fake_sched_counts before, after;
    fake_sched_get_counts(e->fs, &before);
    const int32_t prompt[] = {61, 62, 63};
    pagoda_generate_params p = rt_greedy(50);
    uint8_t gone[16], kept[16], waited[16];
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(c, &p, prompt, 3, gone), 0);
    assert_int_equal(pagoda_submit(c, &p, prompt, 2, kept), 0);
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, waited), 0);
    pagoda_result r;
    /* kept is polled every 500 ms; waited has a poll waiting on it for 3 s */
    struct parked_poll pp = {.c = c};
    memcpy(pp.id, waited, 16);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, poll_thread_3s, &pp), 0);
    for (int i = 0; i < 6; i++) {
        usleep(500000);
        assert_int_equal(pagoda_poll(c, kept, 0, 0, &r), 0);
        assert_int_equal(r.finish_reason, PAGODA_FINISH_NONE);
        pagoda_result_free(&r);
    }
    assert_int_equal(pthread_join(t, NULL), 0);
    assert_int_equal(pp.rc, 0);
    assert_int_equal(pp.r.finish_reason, PAGODA_FINISH_NONE);
    pagoda_result_free(&pp.r);
    usleep(1200000); /* past the router's check each second, short of --abandon-ms */
    assert_int_equal(pagoda_poll(c, gone, 0, 0, &r), 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_CANCELLED);
    pagoda_result_free(&r);
    fake_sched_get_counts(e->fs, &after);
    assert_int_equal(after.cancels, before.cancels + 1);
    fake_sched_hold(e->fs, 0);
    pagoda_client_close(c);
    rtr_env_stop(e);
}

/* Parked calls hold no context others need: with two contexts kept free and at most three calls
 * parked, a fourth poll is answered at once with what there is, Health and Stats still answer,
 * and libpagoda's generate (polling again after such an answer) completes. */
static void test_parked_calls_are_bounded(void **state)
{
    (void)state;
    static const char *const args[] = {"--contexts", "2", "--max-parked", "3", NULL};
    struct rtr_env env, *e = &env;
    assert_int_equal(rtr_env_start(e, args), 0);
    pagoda_client *c = rt_open_client(e);
    const int32_t prompt[] = {91, 92};
    pagoda_generate_params p = rt_greedy(4);
    uint8_t id[16];
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(c, &p, prompt, 2, id), 0);

    Pagoda__PollRequest poll = PAGODA__POLL_REQUEST__INIT;
    poll.has_request_id = poll.has_offset = poll.has_wait_ms = 1;
    poll.request_id.data = id;
    poll.request_id.len = 16;
    poll.wait_ms = 20000;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_POLL;
    req.poll = &poll;
    struct rt_calls polls;
    rt_calls_send(&polls, e->url, &req, 3);
    usleep(200 * 1000); /* the router parks them */

    uint64_t t0 = rtr_now_ms();
    pagoda_result r;
    assert_int_equal(pagoda_poll(c, id, 0, 10000, &r), 0);
    assert_true(rtr_now_ms() - t0 < 5000); /* long before its wait: nothing new, at once */
    assert_int_equal(r.num_tokens, 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_NONE);
    pagoda_result_free(&r);
    int healthy = 0;
    assert_int_equal(pagoda_health(c, &healthy), 0);
    assert_true(healthy);
    pagoda_engine_stats st;
    assert_int_equal(pagoda_stats(c, &st), PAGODA_EBUSY); /* a stats call would park too */

    /* generate polls again after each answer that came at once, and ends once tokens flow. */
    struct release_arg a = {e->fs, 300};
    pthread_t t;
    pthread_create(&t, NULL, release_later, &a);
    pagoda_result all;
    assert_int_equal(pagoda_generate(c, &p, prompt, 2, &all), 0);
    pthread_join(t, NULL);
    assert_int_equal(all.num_tokens, 4);
    rt_assert_tokens(prompt, 2, all.token_ids, 4, 0);
    pagoda_result_free(&all);
    rt_calls_end(&polls, 1);
    pagoda_client_close(c);
    assert_int_equal(rtr_env_stop(e), 0);
}

static void test_drain_timeout_exits_nonzero(void **state)
{
    static const char *const args[] = {"--drain-timeout-ms", "300", NULL};
    struct rtr_env env, *e = &env;
    assert_int_equal(rtr_env_start(e, args), 0);
    pagoda_client *c = rt_open_client(e);
    const int32_t prompt[] = {91};
    pagoda_generate_params p = rt_greedy(10);
    uint8_t id[16];
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, id), 0);
    uint64_t t0 = rtr_now_ms();
    assert_int_equal(kill(e->router, SIGTERM), 0);
    assert_int_equal(rtr_env_wait(e, 5000), 1);
    assert_true(rtr_now_ms() - t0 >= 250);
    pagoda_client_close(c);
    rtr_env_stop(e);
}

int main(void)
{
    const struct CMUnitTest shared[] = {
        cmocka_unit_test(test_poll_from_offset_returns_only_later_tokens),
        cmocka_unit_test(test_poll_wait_returns_early_when_tokens_come),
        cmocka_unit_test(test_poll_wait_runs_out_empty),
        cmocka_unit_test(test_duplicate_submit_is_one_request),
        cmocka_unit_test(test_unknown_id_is_enoent),
        cmocka_unit_test(test_bad_submits_are_refused),
        cmocka_unit_test(test_malformed_bytes_are_answered_and_router_serves),
        cmocka_unit_test(test_cancel_finishes_cancelled),
        cmocka_unit_test(test_cancel_wakes_a_parked_poll),
        cmocka_unit_test(test_stats_round_trip),
        cmocka_unit_test(test_resent_events_do_not_duplicate_tokens),
        cmocka_unit_test(test_lost_events_are_made_good),
        cmocka_unit_test(test_stop_token_and_engine_error),
    };
    const struct CMUnitTest own[] = {
        cmocka_unit_test(test_scheduler_restart_resumes_requests),
        cmocka_unit_test(test_sigterm_drains),
        cmocka_unit_test(test_drain_timeout_exits_nonzero),
        cmocka_unit_test(test_parked_calls_are_bounded),
        cmocka_unit_test(test_abandoned_request_is_cancelled),
        cmocka_unit_test(test_generation_config_defaults),
        cmocka_unit_test(test_requests_at_the_message_limit_are_answered),
    };
    signal(SIGPIPE, SIG_IGN);
    int failed = cmocka_run_group_tests_name("router", shared, group_setup, rt_env_teardown);
    failed += cmocka_run_group_tests_name("router processes", own, NULL, NULL);
    nng_fini();
    return failed;
}
