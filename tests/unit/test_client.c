/* Tests of client/: libpagoda and the pagoda command against pagoda-router and a stand-in
 * scheduler (router_fake_scheduler.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "client/pagoda.h"
#include "client/client_internal.h"
#include "client/pagoda_async.h"
#include "common/error.h"
#include "tests/unit/router_fake_scheduler.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <math.h>
#include <time.h>
#include <unistd.h>

#ifndef PAGODA_BIN_DIR
#error "PAGODA_BIN_DIR must name the directory of the pagoda program"
#endif

static pagoda_client *open_client(const struct rtr_env *e)
{
    pagoda_client *c = NULL;
    assert_int_equal(pagoda_client_open(e->url, &c), 0);
    pagoda_client_set_timeout_ms(c, 5000);
    return c;
}

/* ---- without a router ----------------------------------------------------------------------- */

static void test_params_default_and_local_checks(void **state)
{
    pagoda_generate_params p = pagoda_generate_params_default();
    assert_true(p.temperature == 1.0f);
    assert_true(p.top_p == 1.0f);
    assert_int_equal(p.top_k, 0);
    assert_true(p.repetition_penalty == 1.0f);
    assert_int_equal(p.max_tokens, 16);
    assert_false(p.has_seed);

    pagoda_client *c = NULL;
    assert_int_equal(pagoda_client_open("ipc:///nonexistent/pagoda.ipc", &c), 0);
    uint8_t id[16];
    const int32_t prompt[] = {1};
    assert_int_equal(pagoda_submit(c, &p, prompt, 0, id), PAGODA_EINVAL);
    p.max_tokens = 0;
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, id), PAGODA_ERANGE);
    /* logit bias and min_tokens: what the client can tell without the model */
    p = pagoda_generate_params_default();
    assert_int_equal(p.num_logit_bias, 0);
    assert_int_equal(p.min_tokens, 0);
    static const int32_t bias_ids[PAGODA_MAX_LOGIT_BIAS + 1];
    static const float bias_values[PAGODA_MAX_LOGIT_BIAS + 1];
    p.num_logit_bias = 1;
    p.logit_bias_values = bias_values;
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, id), PAGODA_EINVAL); /* ids NULL */
    p.logit_bias_ids = bias_ids;
    p.logit_bias_values = NULL;
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, id), PAGODA_EINVAL); /* values NULL */
    p.logit_bias_values = bias_values;
    p.num_logit_bias = PAGODA_MAX_LOGIT_BIAS + 1;
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, id), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "301 logit bias pairs"));
    p.num_logit_bias = 0;
    p.min_tokens = -1;
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, id), PAGODA_ERANGE);
    p.min_tokens = p.max_tokens + 1;
    assert_int_equal(pagoda_submit(c, &p, prompt, 1, id), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "min_tokens 17"));
    pagoda_client_close(c);
    assert_int_equal(pagoda_client_open("nonsense://x", &c), PAGODA_EINVAL);
    pagoda_client_close(NULL);
    pagoda_result_free(NULL);
    assert_string_equal(pagoda_finish_reason_name(PAGODA_FINISH_CANCELLED), "cancelled");
    const uint8_t hex_id[16] = {0x01, 0xab, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff};
    char hex[33];
    pagoda_request_id_hex(hex_id, hex);
    assert_string_equal(hex, "01ab00000000000000000000000000ff");
}

/* The Submit carries logit_bias and min_tokens in its sampling params, and leaves them out when
 * they are off (a router that predates them sees the Submit it knew). */
static void test_submit_carries_logit_bias_and_min_tokens(void **state)
{
    (void)state;
    const uint8_t id[PAGODA_REQUEST_ID_BYTES] = {1};
    const int32_t prompt_ids[] = {4, 5};
    const int32_t bias_ids[] = {7, 50256, 0};
    const float bias_values[] = {-100.0f, 2.5f, 100.0f};
    pagoda_prompt prompt = pagoda_prompt_default();
    prompt.token_ids = prompt_ids;
    prompt.num_token_ids = 2;
    for (int on = 0; on < 2; on++) {
        pagoda_generate_params p = pagoda_generate_params_default();
        if (on) {
            p.logit_bias_ids = bias_ids;
            p.logit_bias_values = bias_values;
            p.num_logit_bias = 3;
            p.min_tokens = 16; /* max_tokens' default */
        }
        struct client_submit cs;
        assert_int_equal(client_submit_build(&cs, &p, &prompt, id), 0);
        size_t len = pagoda__client_request__get_packed_size(&cs.req);
        uint8_t *buf = malloc(len);
        assert_non_null(buf);
        pagoda__client_request__pack(&cs.req, buf);
        client_submit_fini(&cs);
        Pagoda__ClientRequest *req = pagoda__client_request__unpack(NULL, len, buf);
        free(buf);
        assert_non_null(req);
        assert_int_equal(req->call_case, PAGODA__CLIENT_REQUEST__CALL_SUBMIT);
        const Pagoda__SamplingParams *sp = req->submit->sampling;
        assert_non_null(sp);
        if (!on) {
            assert_int_equal(sp->n_logit_bias_token_ids, 0);
            assert_int_equal(sp->n_logit_bias_values, 0);
            assert_false(sp->has_min_tokens);
        } else {
            assert_int_equal(sp->n_logit_bias_token_ids, 3);
            assert_int_equal(sp->n_logit_bias_values, 3);
            for (size_t i = 0; i < 3; i++) {
                assert_int_equal(sp->logit_bias_token_ids[i], bias_ids[i]);
                assert_true(sp->logit_bias_values[i] == bias_values[i]);
            }
            assert_true(sp->has_min_tokens);
            assert_int_equal(sp->min_tokens, 16);
        }
        pagoda__client_request__free_unpacked(req, NULL);
    }
}

static void test_unreachable_router_times_out(void **state)
{
    pagoda_client *c = NULL;
    assert_int_equal(pagoda_client_open("ipc:///nonexistent/pagoda.ipc", &c), 0);
    pagoda_client_set_timeout_ms(c, 200);
    uint64_t t0 = rtr_now_ms();
    int healthy = 1;
    assert_int_equal(pagoda_health(c, &healthy), PAGODA_ETIMEDOUT);
    assert_true(rtr_now_ms() - t0 < 2000);
    pagoda_client_close(c);
}

/* ---- with a router ------------------------------------------------------------------------- */

static int group_setup(void **state)
{
    static struct rtr_env env;
    if (rtr_env_start(&env, NULL) != 0)
        return -1;
    *state = &env;
    return 0;
}

static int group_teardown(void **state)
{
    return rtr_env_stop(*state) == 0 ? 0 : -1;
}

static void test_generate_returns_every_token_once_in_order(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = open_client(e);
    const int32_t prompt[] = {3, 1, 4, 1};
    pagoda_generate_params p = pagoda_generate_params_default();
    p.max_tokens = 25; /* nine events of up to three tokens */
    p.logprobs = 1;
    pagoda_result r;
    assert_int_equal(pagoda_generate(c, &p, prompt, 4, &r), 0);
    assert_int_equal(r.num_tokens, 25);
    for (uint32_t i = 0; i < 25; i++) {
        assert_int_equal(r.token_ids[i], fake_sched_token(prompt, 4, i));
        assert_true(r.logprobs[i] == fake_sched_logprob(i));
    }
    assert_int_equal(r.finish_reason, PAGODA_FINISH_LENGTH);
    assert_int_equal(r.prompt_tokens, 4);
    assert_int_equal(r.completion_tokens, 25);
    assert_int_equal(r.cached_tokens, 2);
    assert_null(r.error_message);
    pagoda_result_free(&r);

    /* Without logprobs asked for, none come back. */
    p.logprobs = 0;
    p.max_tokens = 4;
    assert_int_equal(pagoda_generate(c, &p, prompt, 4, &r), 0);
    assert_int_equal(r.num_tokens, 4);
    assert_null(r.logprobs);
    pagoda_result_free(&r);
    pagoda_client_close(c);
}

struct stream_seen {
    uint32_t next;
    int calls;
    int32_t tokens[64];
};

static void on_piece(void *user, uint32_t offset, const int32_t *ids, const float *lp, size_t n)
{
    struct stream_seen *s = user;
    assert_int_equal(offset, s->next);
    assert_true(n > 0);
    assert_true(offset + n <= 64);
    memcpy(s->tokens + offset, ids, n * sizeof(int32_t));
    s->next += (uint32_t)n;
    s->calls++;
}

static void test_generate_stream_sees_contiguous_pieces(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = open_client(e);
    const int32_t prompt[] = {9, 9};
    pagoda_generate_params p = pagoda_generate_params_default();
    p.max_tokens = 40;
    struct stream_seen seen = {0};
    pagoda_result r;
    assert_int_equal(pagoda_generate_stream(c, &p, prompt, 2, on_piece, &seen, &r), 0);
    assert_int_equal(seen.next, 40);
    assert_true(seen.calls >= 1);
    assert_memory_equal(seen.tokens, r.token_ids, 40 * sizeof(int32_t));
    pagoda_result_free(&r);
    pagoda_client_close(c);
}

#define THREADS 8
#define PER_THREAD 6

struct worker_arg {
    pagoda_client *c;
    int index;
    int failures;
};

static void *generate_many(void *arg)
{
    struct worker_arg *a = arg;
    for (int k = 0; k < PER_THREAD; k++) {
        const int32_t prompt[] = {100 + a->index, k, 7};
        pagoda_generate_params p = pagoda_generate_params_default();
        p.max_tokens = 5 + (a->index + k) % 11;
        pagoda_result r;
        int rc = pagoda_generate(a->c, &p, prompt, 3, &r);
        int ok = rc == 0 && r.finish_reason == PAGODA_FINISH_LENGTH &&
                 r.num_tokens == (size_t)p.max_tokens;
        for (size_t i = 0; ok && i < r.num_tokens; i++)
            ok = r.token_ids[i] == fake_sched_token(prompt, 3, (uint32_t)i);
        a->failures += !ok;
        pagoda_result_free(&r);
    }
    return NULL;
}

static void test_concurrent_generates_on_one_client(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = open_client(e);
    pthread_t threads[THREADS];
    struct worker_arg args[THREADS];
    for (int i = 0; i < THREADS; i++) {
        args[i] = (struct worker_arg){.c = c, .index = i};
        pthread_create(&threads[i], NULL, generate_many, &args[i]);
    }
    int failures = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        failures += args[i].failures;
    }
    assert_int_equal(failures, 0);
    struct fake_sched_counts counts;
    fake_sched_get_counts(e->fs, &counts);
    assert_int_equal(counts.repeated_submits, 0);
    pagoda_client_close(c);
}

/* Runs a shell command line; returns its exit status, its standard output in out. */
static int run(const char *cmd, char *out, size_t len)
{
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, len - 1, f);
    out[n] = '\0';
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* A router that answers one call with a crafted Stats (a tenant's figures), for the CLI. */
struct one_reply_router {
    nng_socket sock;
    int served;
};

static void *one_reply_router_main(void *arg)
{
    struct one_reply_router *r = arg;
    nng_msg *m = NULL;
    if (nng_recvmsg(r->sock, &m, 0) != 0)
        return NULL;
    nng_msg_free(m);
    Pagoda__Stats st = PAGODA__STATS__INIT;
    st.tenant = "a\"b\\c";
    st.has_prefix_hit_rate = 1;
    st.prefix_hit_rate = NAN; /* 0/0: no prompt looked up yet */
    st.has_running = 1;
    st.running = 3;
    Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
    resp.has_protocol_version = 1;
    resp.protocol_version = CLIENT_PROTOCOL_VERSION;
    resp.result_case = PAGODA__CLIENT_RESPONSE__RESULT_STATS;
    resp.stats = &st;
    size_t len = protobuf_c_message_get_packed_size(&resp.base);
    if (nng_msg_alloc(&m, len) != 0)
        return NULL;
    protobuf_c_message_pack(&resp.base, nng_msg_body(m));
    if (nng_sendmsg(r->sock, m, 0) != 0)
        nng_msg_free(m);
    else
        r->served = 1;
    return NULL;
}

/* pagoda stats --json prints whatever the router's strings hold as valid JSON (the tenant
 * escaped) and a figure that is not finite as null. */
static void test_cli_stats_json_is_valid(void **state)
{
    (void)state;
    char url[128], cmd[512], out[4096];
    snprintf(url, sizeof(url), "ipc:///tmp/pagoda-test-cli-stats-%d.ipc", (int)getpid());
    struct one_reply_router r = {.served = 0};
    assert_int_equal(nng_rep0_open(&r.sock), 0);
    assert_int_equal(nng_socket_set_ms(r.sock, NNG_OPT_RECVTIMEO, 10000), 0);
    assert_int_equal(nng_socket_set_ms(r.sock, NNG_OPT_SENDTIMEO, 10000), 0);
    assert_int_equal(nng_listen(r.sock, url, NULL, 0), 0);
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, one_reply_router_main, &r), 0);
    snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda --url %s stats --json --timeout-ms 5000",
             url);
    int status = run(cmd, out, sizeof(out));
    pthread_join(t, NULL);
    nng_close(r.sock);
    assert_int_equal(r.served, 1);
    assert_int_equal(status, 0);
    assert_non_null(strstr(out, "{\"tenant\": \"a\\\"b\\\\c\", \"running\": 3, "));
    assert_non_null(strstr(out, "\"prefix_hit_rate\": null, "));
    assert_null(strstr(out, ": nan"));
}

static void test_cli(void **state)
{
    struct rtr_env *e = *state;
    char cmd[512], out[4096], expect[256];
    const int32_t prompt[] = {5, 6};

    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR "/pagoda --url %s generate --tokens 5,6 "
                            "--max-tokens 4 --json",
             e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    snprintf(expect, sizeof(expect), "\"token_ids\": [%d, %d, %d, %d]",
             fake_sched_token(prompt, 2, 0), fake_sched_token(prompt, 2, 1),
             fake_sched_token(prompt, 2, 2), fake_sched_token(prompt, 2, 3));
    assert_non_null(strstr(out, expect));
    assert_non_null(strstr(out, "\"finish_reason\": \"length\""));
    assert_non_null(strstr(out, "\"usage\": {\"prompt_tokens\": 2, \"completion_tokens\": 4, "
                                "\"cached_tokens\": 1}"));
    assert_non_null(strstr(out, "\"logprobs\": [-0.125, -0.25, -0.375, -0.5]"));
    assert_non_null(strstr(out, "{\"id\": \""));
    assert_int_equal(strchr(out, '\n') - out, (long)strlen(out) - 1); /* one line */

    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR
             "/pagoda --url %s generate --tokens 5,6 "
             "--max-tokens 2 --temperature 0.7 --top-p 0.9 --top-k 5 --min-p 0.1 --seed 3 "
             "--stop-token-ids 1,2 --ignore-eos",
             e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    snprintf(expect, sizeof(expect), "%d,%d\n", fake_sched_token(prompt, 2, 0),
             fake_sched_token(prompt, 2, 1));
    assert_string_equal(out, expect);

    /* --logit-bias and --min-tokens go with the request (the fake scheduler does not apply
     * them: what they change is the router's and the engine's to test) */
    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR "/pagoda --url %s generate --tokens 5,6 --max-tokens 2 "
                            "--logit-bias 3:-100 --logit-bias 4:2.5 --min-tokens 2",
             e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, expect);

    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR "/pagoda --url %s generate --tokens 5,6 "
                            "--max-tokens 2 --stream",
             e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, expect);

    snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda --url %s stats --json", e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "\"peak_running\": 10"));
    assert_non_null(strstr(out, "\"kv_usage\": 0.25"));
    assert_non_null(strstr(out, "\"scheduler_connected\": true"));
    assert_int_equal(out[0], '{');
    /* One engine: the router lists none, and the CLI prints no routing and no engines. */
    assert_null(strstr(out, "\"engines\""));
    assert_null(strstr(out, "\"routing\""));

    snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda --url %s health", e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);

    /* Bad flags: 2. A failed request: 1. No router: 1. */
    snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda --url %s generate --bogus 2>/dev/null",
             e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR "/pagoda --url %s generate --tokens 1,x "
                            "2>/dev/null",
             e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR "/pagoda --url %s generate --tokens 1 "
                            "--top-p 0 2>/dev/null",
             e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda frobnicate 2>/dev/null");
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    /* --logit-bias ID:VALUE with VALUE in [-100, 100], each id once; --min-tokens at most
     * max_tokens (given or the default): refused before anything is sent */
    static const char *const bad_bias[] = {
        "--logit-bias 3",
        "--logit-bias :1",
        "--logit-bias x:1",
        "--logit-bias 3:x",
        "--logit-bias -1:1",
        "--logit-bias 3:101",
        "--logit-bias 3:-100.5",
        "--logit-bias 3:1 --logit-bias 3:2",
        "--min-tokens -1",
        "--min-tokens 17",
        "--max-tokens 4 --min-tokens 5",
    };
    for (size_t i = 0; i < sizeof(bad_bias) / sizeof(bad_bias[0]); i++) {
        snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda --url %s generate --tokens 1 %s 2>&1",
                 e->url, bad_bias[i]);
        if (run(cmd, out, sizeof(out)) != 2)
            fail_msg("'%s' was not refused as a bad flag: %s", bad_bias[i], out);
    }
    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR "/pagoda --url %s generate --tokens 1 --min-tokens 17 2>&1", e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 2);
    assert_non_null(strstr(out, "--min-tokens 17 is more than max_tokens (16, the default"));
    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR "/pagoda --url %s generate --tokens %d "
                            "--max-tokens 3 --json 2>/dev/null",
             e->url, FAKE_SCHED_ERROR_TOKEN);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "\"finish_reason\": \"error\""));
    assert_non_null(strstr(out, "vocabulary"));
    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR "/pagoda --url %s generate --tokens 1 "
                            "--max-tokens 1000000000 2>&1",
             e->url);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "max_tokens"));
    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR
             "/pagoda --url ipc:///nonexistent/x.ipc health --timeout-ms 300 2>/dev/null");
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
}

/* ---- the asynchronous calls ------------------------------------------------------------------ */

/* What one asynchronous call reported: the test waits on cond until done. */
struct waiter {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int calls;
    pagoda_async_result *res;
};

static void waiter_init(struct waiter *w)
{
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->cond, NULL);
    w->calls = 0;
    w->res = NULL;
}

static void on_async(void *user, pagoda_async_result *res)
{
    struct waiter *w = user;
    pthread_mutex_lock(&w->lock);
    w->calls++;
    pagoda_async_result_free(w->res); /* a second call would be a bug: keep the last */
    w->res = res;
    pthread_cond_signal(&w->cond);
    pthread_mutex_unlock(&w->lock);
}

/* Waits (up to 10 s) for the callback and takes its result. */
static pagoda_async_result *waiter_take(struct waiter *w)
{
    pthread_mutex_lock(&w->lock);
    uint64_t until = rtr_now_ms() + 10000;
    while (w->res == NULL && rtr_now_ms() < until) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 50 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&w->cond, &w->lock, &ts);
    }
    pagoda_async_result *res = w->res;
    w->res = NULL;
    pthread_mutex_unlock(&w->lock);
    assert_non_null(res);
    return res;
}

static void test_async_calls_report_once_each(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = open_client(e);
    struct waiter w;
    waiter_init(&w);
    const int32_t prompt[] = {2, 7, 1, 8};
    pagoda_generate_params p = pagoda_generate_params_default();
    p.max_tokens = 10;
    pagoda_prompt pr = pagoda_prompt_default();
    pr.token_ids = prompt;
    pr.num_token_ids = 4;
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    assert_int_equal(pagoda_submit_async(c, NULL, &p, &pr, id, on_async, &w), 0);
    pagoda_async_result *res = waiter_take(&w);
    assert_int_equal(res->rc, 0);
    assert_memory_equal(res->request_id, id, sizeof(id));
    /* Only a stats call carries the engine's figures: a submit's result has no room for them. */
    assert_null(res->stats);
    assert_true(sizeof(*res) < sizeof(pagoda_engine_stats));
    pagoda_async_result_free(res);
    /* Poll until the end: every token once, in order. */
    uint32_t have = 0;
    int32_t got[16];
    pagoda_finish_reason finish = PAGODA_FINISH_NONE;
    int polls = 0;
    for (int i = 0; i < 100 && finish == PAGODA_FINISH_NONE; i++) {
        polls++;
        assert_int_equal(pagoda_poll_async(c, NULL, id, have, 2000, on_async, &w), 0);
        res = waiter_take(&w);
        assert_int_equal(res->rc, 0);
        assert_int_equal(res->result.offset, have);
        assert_true(have + res->result.num_tokens <= 10);
        memcpy(got + have, res->result.token_ids, res->result.num_tokens * sizeof(int32_t));
        have += (uint32_t)res->result.num_tokens;
        finish = res->result.finish_reason;
        pagoda_async_result_free(res);
    }
    assert_int_equal(finish, PAGODA_FINISH_LENGTH);
    assert_int_equal(have, 10);
    for (uint32_t i = 0; i < 10; i++)
        assert_int_equal(got[i], fake_sched_token(prompt, 4, i));
    /* Stats, health, cancel of a finished request, and an unknown id. */
    assert_int_equal(pagoda_stats_async(c, NULL, on_async, &w), 0);
    res = waiter_take(&w);
    assert_int_equal(res->rc, 0);
    assert_non_null(res->stats);
    assert_true(res->stats->scheduler_connected);
    pagoda_async_result_free(res);
    assert_int_equal(pagoda_health_async(c, on_async, &w), 0);
    res = waiter_take(&w);
    assert_int_equal(res->rc, 0);
    assert_int_equal(res->healthy, 1);
    pagoda_async_result_free(res);
    assert_int_equal(pagoda_cancel_async(c, NULL, id, on_async, &w), 0);
    res = waiter_take(&w);
    assert_int_equal(res->rc, 0);
    assert_int_equal(res->result.finish_reason, PAGODA_FINISH_LENGTH);
    pagoda_async_result_free(res);
    uint8_t unknown[PAGODA_REQUEST_ID_BYTES] = {9};
    assert_int_equal(pagoda_poll_async(c, NULL, unknown, 0, 0, on_async, &w), 0);
    res = waiter_take(&w);
    assert_int_equal(res->rc, PAGODA_ENOENT);
    assert_non_null(strstr(res->detail, "no request"));
    pagoda_async_result_free(res);
    /* Refused locally: no callback. */
    p.max_tokens = 0;
    assert_int_equal(pagoda_submit_async(c, NULL, &p, &pr, id, on_async, &w), PAGODA_ERANGE);
    assert_int_equal(w.calls, 1 + polls + 4); /* submit, polls, stats, health, cancel, unknown */
    pagoda_client_close(c);
}

static void test_async_call_to_nobody_times_out(void **state)
{
    pagoda_client *c = NULL;
    assert_int_equal(pagoda_client_open("ipc:///nonexistent/pagoda.ipc", &c), 0);
    pagoda_client_set_timeout_ms(c, 200);
    struct waiter w;
    waiter_init(&w);
    assert_int_equal(pagoda_health_async(c, on_async, &w), 0);
    pagoda_async_result *res = waiter_take(&w);
    assert_int_equal(res->rc, PAGODA_ETIMEDOUT);
    pagoda_async_result_free(res);
    assert_int_equal(w.calls, 1);
    pagoda_client_close(c);
}

/* A router's per-engine figures (Stats.engines) reach pagoda_engine_stats in order, with the
 * routing; beyond PAGODA_STATS_MAX_ENGINES they are counted in engines_dropped, and an address
 * longer than the room is cut, NUL-terminated. */
static void test_stats_engines_are_bounded(void **state)
{
    (void)state;
    enum { N = PAGODA_STATS_MAX_ENGINES + 3 };
    static Pagoda__EngineStats es[N];
    static Pagoda__EngineStats *ptrs[N];
    static char long_address[PAGODA_STATS_ADDRESS_BYTES + 50];
    memset(long_address, 'a', sizeof(long_address) - 1);
    for (uint32_t i = 0; i < N; i++) {
        pagoda__engine_stats__init(&es[i]);
        es[i].has_engine = 1;
        es[i].engine = i;
        es[i].address = i == 1 ? long_address : "tcp://10.0.0.2:7460";
        es[i].connected = i != 2;
        es[i].load = 10 + i;
        es[i].running = 20 + i;
        es[i].waiting = 30 + i;
        es[i].prefix_query_tokens = 40 + i;
        es[i].prefix_hit_tokens = 50 + i;
        es[i].routed = 60 + i;
        ptrs[i] = &es[i];
    }
    Pagoda__Stats s = PAGODA__STATS__INIT;
    s.routing = "round-robin";
    s.n_engines = N;
    s.engines = ptrs;
    pagoda_engine_stats *out = malloc(sizeof(*out));
    assert_non_null(out);
    client_stats_from_proto(&s, out);
    assert_string_equal(out->routing, "round-robin");
    assert_int_equal(out->num_engines, PAGODA_STATS_MAX_ENGINES);
    assert_int_equal(out->engines_dropped, 3);
    for (uint32_t i = 0; i < PAGODA_STATS_MAX_ENGINES; i++) {
        const pagoda_engine_info *e = &out->engines[i];
        assert_int_equal(e->engine, i);
        assert_int_equal(e->connected, i != 2);
        assert_int_equal(e->load, 10 + i);
        assert_int_equal(e->running, 20 + i);
        assert_int_equal(e->waiting, 30 + i);
        assert_int_equal(e->prefix_query_tokens, 40 + i);
        assert_int_equal(e->prefix_hit_tokens, 50 + i);
        assert_int_equal(e->routed, 60 + i);
    }
    assert_string_equal(out->engines[0].address, "tcp://10.0.0.2:7460");
    assert_int_equal(strlen(out->engines[1].address), PAGODA_STATS_ADDRESS_BYTES - 1);
    /* One engine: nothing listed. */
    Pagoda__Stats one = PAGODA__STATS__INIT;
    client_stats_from_proto(&one, out);
    assert_string_equal(out->routing, "");
    assert_int_equal(out->num_engines, 0);
    assert_int_equal(out->engines_dropped, 0);
    free(out);
}

/* A router's strings reach the API printable: invalid UTF-8, C0 control bytes and DEL become
 * '?', quotes and backslashes stay as they are (escaping is the printer's job), valid UTF-8 is
 * kept, and a string cut to its room is cut before a character that would not fit whole. */
static void test_stats_strings_are_printable(void **state)
{
    (void)state;
    static const char *const addresses[][2] = {
        {"\xff", "?"},
        {"tcp://a\r\nb:1", "tcp://a??b:1"},
        {"ipc:///tmp/\"x\\y", "ipc:///tmp/\"x\\y"},
        {"tcp://h\xc3\xb6st:2", "tcp://h\xc3\xb6st:2"}, /* U+00F6, kept */
        {"a\x7f\x1b[31mb", "a??[31mb"},
        {"\xc0\xaf\xed\xa0\x80z", "?????z"}, /* an overlong '/', a surrogate */
        {"\xe2\x82", "??"},                  /* a truncated 3-byte character */
    };
    enum { N = sizeof(addresses) / sizeof(addresses[0]) };
    static Pagoda__EngineStats es[N];
    static Pagoda__EngineStats *ptrs[N];
    for (uint32_t i = 0; i < N; i++) {
        pagoda__engine_stats__init(&es[i]);
        es[i].has_engine = 1;
        es[i].engine = i;
        es[i].address = (char *)addresses[i][0];
        ptrs[i] = &es[i];
    }
    /* A 2-byte character straddling the routing name's room: it is left out whole. */
    char routing[PAGODA_STATS_ROUTING_BYTES + 8];
    memset(routing, 'r', PAGODA_STATS_ROUTING_BYTES - 2);
    strcpy(routing + PAGODA_STATS_ROUTING_BYTES - 2, "\xc3\xa9tail");
    Pagoda__Stats s = PAGODA__STATS__INIT;
    s.routing = routing;
    s.tenant = "t\nx";
    s.n_engines = N;
    s.engines = ptrs;
    pagoda_engine_stats *out = malloc(sizeof(*out));
    assert_non_null(out);
    client_stats_from_proto(&s, out);
    assert_int_equal(out->num_engines, N);
    assert_int_equal(out->engines_dropped, 0);
    for (uint32_t i = 0; i < N; i++)
        assert_string_equal(out->engines[i].address, addresses[i][1]);
    assert_int_equal(strlen(out->routing), PAGODA_STATS_ROUTING_BYTES - 2);
    assert_int_equal(strspn(out->routing, "r"), PAGODA_STATS_ROUTING_BYTES - 2);
    assert_string_equal(out->tenant, "t?x");
    /* The same at the address's room: one byte short of the character's second byte. */
    static char address[PAGODA_STATS_ADDRESS_BYTES + 8];
    memset(address, 'a', PAGODA_STATS_ADDRESS_BYTES - 2);
    strcpy(address + PAGODA_STATS_ADDRESS_BYTES - 2, "\xc3\xa9");
    es[0].address = address;
    client_stats_from_proto(&s, out);
    assert_int_equal(strlen(out->engines[0].address), PAGODA_STATS_ADDRESS_BYTES - 2);
    /* One byte shorter, the character fits. */
    strcpy(address + PAGODA_STATS_ADDRESS_BYTES - 3, "\xc3\xa9");
    client_stats_from_proto(&s, out);
    assert_int_equal(strlen(out->engines[0].address), PAGODA_STATS_ADDRESS_BYTES - 1);
    assert_string_equal(out->engines[0].address + PAGODA_STATS_ADDRESS_BYTES - 3, "\xc3\xa9");
    free(out);
}

/* Engine entries that cannot be told apart (no index, an index not below the number of
 * entries, an index seen already) are dropped and counted in engines_dropped; the others are
 * kept in order. */
static void test_stats_malformed_engines_are_dropped(void **state)
{
    (void)state;
    enum { N = 5 };
    static Pagoda__EngineStats es[N];
    static Pagoda__EngineStats *ptrs[N];
    static const int has[N] = {1, 0, 1, 1, 1};
    static const uint32_t index[N] = {0, 2, N, 0, 1};
    for (uint32_t i = 0; i < N; i++) {
        pagoda__engine_stats__init(&es[i]);
        es[i].has_engine = has[i];
        es[i].engine = index[i];
        es[i].has_routed = 1;
        es[i].routed = 100 + i;
        ptrs[i] = &es[i];
    }
    Pagoda__Stats s = PAGODA__STATS__INIT;
    s.routing = "cache-aware";
    s.has_running = 1;
    s.running = 7;
    s.n_engines = N;
    s.engines = ptrs;
    pagoda_engine_stats *out = malloc(sizeof(*out));
    assert_non_null(out);
    client_stats_from_proto(&s, out);
    assert_int_equal(out->running, 7);
    assert_int_equal(out->num_engines, 2);
    assert_int_equal(out->engines_dropped, 3);
    assert_int_equal(out->engines[0].engine, 0);
    assert_int_equal(out->engines[0].routed, 100);
    assert_int_equal(out->engines[1].engine, 1);
    assert_int_equal(out->engines[1].routed, 104);
    free(out);
}

/* pagoda_result_append, which pagoda_generate and the gateway's whole answers gather with: the
 * tokens' text ends move by the text before their piece, a tokenless piece's text joins the last
 * token's piece, a piece without ends after ones with leaves the whole without, log-probabilities
 * only when asked (0 for a piece without). */
static void test_result_append(void **state)
{
    (void)state;
    int32_t ids1[] = {5, 6}, ids2[] = {7}, ids3[] = {8};
    float lps1[] = {-0.5f, -1.5f};
    uint32_t ends1[] = {2, 5}, ends2[] = {0};
    pagoda_result p1 = {.token_ids = ids1,
                        .logprobs = lps1,
                        .num_tokens = 2,
                        .text = "ab\xc3\xa9"
                                "d",
                        .text_len = 5,
                        .token_text_ends = ends1};
    /* a token that completes no character: an empty piece */
    pagoda_result p2 = {
        .token_ids = ids2, .num_tokens = 1, .text = "", .text_len = 0, .token_text_ends = ends2};
    pagoda_result tail = {.text = "xyz", .text_len = 3}; /* a cancel's released text */
    pagoda_result all = {0};
    assert_int_equal(pagoda_result_append(&all, &p1, 1), 0);
    assert_int_equal(pagoda_result_append(&all, &p2, 1), 0);
    assert_int_equal(pagoda_result_append(&all, &tail, 1), 0);
    assert_int_equal(all.num_tokens, 3);
    assert_int_equal(all.token_ids[0], 5);
    assert_int_equal(all.token_ids[2], 7);
    assert_true(all.logprobs[1] == -1.5f && all.logprobs[2] == 0.0f);
    assert_int_equal(all.text_len, 8);
    assert_memory_equal(all.text,
                        "ab\xc3\xa9"
                        "dxyz",
                        9); /* NUL-terminated */
    assert_non_null(all.token_text_ends);
    assert_int_equal(all.token_text_ends[0], 2);
    assert_int_equal(all.token_text_ends[1], 5);
    assert_int_equal(all.token_text_ends[2], 8); /* 5, then the tokenless text joined it */
    /* a piece without ends: the whole has none from then on */
    pagoda_result p3 = {.token_ids = ids3, .num_tokens = 1, .text = "q", .text_len = 1};
    assert_int_equal(pagoda_result_append(&all, &p3, 1), 0);
    assert_null(all.token_text_ends);
    assert_int_equal(all.num_tokens, 4);
    assert_int_equal(all.text_len, 9);
    pagoda_result_free(&all);
    /* without log-probabilities asked: none kept */
    assert_int_equal(pagoda_result_append(&all, &p1, 0), 0);
    assert_null(all.logprobs);
    assert_int_equal(pagoda_result_append(NULL, &p1, 0), PAGODA_EINVAL);
    pagoda_result_free(&all);
}

int main(void)
{
    const struct CMUnitTest alone[] = {
        cmocka_unit_test(test_params_default_and_local_checks),
        cmocka_unit_test(test_submit_carries_logit_bias_and_min_tokens),
        cmocka_unit_test(test_result_append),
        cmocka_unit_test(test_stats_engines_are_bounded),
        cmocka_unit_test(test_stats_strings_are_printable),
        cmocka_unit_test(test_stats_malformed_engines_are_dropped),
        cmocka_unit_test(test_cli_stats_json_is_valid),
        cmocka_unit_test(test_unreachable_router_times_out),
        cmocka_unit_test(test_async_call_to_nobody_times_out),
    };
    const struct CMUnitTest with_router[] = {
        cmocka_unit_test(test_generate_returns_every_token_once_in_order),
        cmocka_unit_test(test_generate_stream_sees_contiguous_pieces),
        cmocka_unit_test(test_concurrent_generates_on_one_client),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_async_calls_report_once_each),
    };
    signal(SIGPIPE, SIG_IGN);
    int failed = cmocka_run_group_tests_name("client", alone, NULL, NULL);
    failed += cmocka_run_group_tests_name("client with a router", with_router, group_setup,
                                          group_teardown);
    nng_fini();
    return failed;
}
