/* Integration test of bad input against a real group (tiny model on the CPU) started with a
 * tenants file of two tenants: every bad call is answered with a clear error, and the group
 * keeps serving (a good request succeeds after each).
 *
 * usage: bad_input_test BIN_DIR */
#include "tests/integration/group.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define VOCAB 512
#define KV_BLOCKS 16
#define BLOCK_SIZE 16
#define MAX_NEW_TOKENS 1000
#define MAX_PROMPT_TOKENS 1024
#define BOB_LIMIT 4 /* bob's max_running + max_waiting */

static const char tenants_json[] =
    "{\"tenants\": ["
    "{\"name\": \"alice\", \"api_keys\": [\"alice-key\"]},"
    "{\"name\": \"bob\", \"api_keys\": [\"bob-key\"], \"max_running\": 2, \"max_waiting\": 2}"
    "]}";

static pagoda_client *open_tenant(const struct group *g, const char *key)
{
    pagoda_client *c = NULL;
    if (pagoda_client_open(g->url, &c) != 0)
        return NULL;
    pagoda_client_set_timeout_ms(c, (uint32_t)(60000 * group_time_scale()));
    if (key != NULL && pagoda_client_set_api_key(c, key) != 0) {
        pagoda_client_close(c);
        return NULL;
    }
    return c;
}

/* A good request: alice generates 4 tokens. */
static void still_serving(pagoda_client *alice, const char *after)
{
    int32_t prompt[6];
    group_prompt(prompt, 6, 77, VOCAB);
    pagoda_generate_params p = group_greedy(4);
    pagoda_result r = {0};
    int rc = pagoda_generate(alice, &p, prompt, 6, &r);
    CHECK(rc == 0 && r.num_tokens == 4 && r.finish_reason == PAGODA_FINISH_LENGTH,
          "after %s, a good request succeeds (rc %d, %zu tokens)", after, rc, r.num_tokens);
    pagoda_result_free(&r);
}

/* Sends bytes on a fresh REQ socket; returns the unpacked reply or NULL. */
static Pagoda__ClientResponse *raw_call(const struct group *g, const void *bytes, size_t len)
{
    return group_raw_call(g, bytes, len, (uint32_t)(30000 * group_time_scale()));
}

static int resp_code(const Pagoda__ClientResponse *r)
{
    return r == NULL ? 1 : r->has_error_code ? r->error_code : 0;
}

static const char *resp_msg(const Pagoda__ClientResponse *r)
{
    return r != NULL && r->error_message != NULL ? r->error_message : "";
}

/* A raw Submit of alice's with defaults for what the check does not change. */
struct raw_submit {
    Pagoda__ClientRequest req;
    Pagoda__SubmitRequest sub;
    Pagoda__SamplingParams sp;
    uint8_t id[16];
    int32_t *prompt;
};

static void raw_submit_init(struct raw_submit *r, int32_t *prompt, size_t n)
{
    pagoda__client_request__init(&r->req);
    pagoda__submit_request__init(&r->sub);
    pagoda__sampling_params__init(&r->sp);
    if (getrandom(r->id, 16, 0) != 16)
        memset(r->id, 7, 16);
    r->req.has_protocol_version = 1;
    r->req.protocol_version = 1;
    r->req.api_key = (char *)"alice-key";
    r->sub.has_request_id = 1;
    r->sub.request_id.data = r->id;
    r->sub.request_id.len = 16;
    r->sub.n_prompt_token_ids = n;
    r->sub.prompt_token_ids = prompt;
    r->sub.has_max_tokens = 1;
    r->sub.max_tokens = 4;
    r->sp.has_temperature = 1;
    r->sp.temperature = 0.0f;
    r->sub.sampling = &r->sp;
    r->req.call_case = PAGODA__CLIENT_REQUEST__CALL_SUBMIT;
    r->req.submit = &r->sub;
}

/* Sends the raw submit; checks the answer is code with a message naming what. */
static void expect_refused(const struct group *g, struct raw_submit *s, int code, const char *what,
                           const char *label)
{
    size_t len = pagoda__client_request__get_packed_size(&s->req);
    uint8_t *buf = malloc(len + 1);
    pagoda__client_request__pack(&s->req, buf);
    Pagoda__ClientResponse *resp = raw_call(g, buf, len);
    free(buf);
    CHECK(resp_code(resp) == code && strstr(resp_msg(resp), what) != NULL,
          "%s: answered %d (%s), expected %d naming %s", label, resp_code(resp), resp_msg(resp),
          code, what);
    if (resp != NULL)
        pagoda__client_response__free_unpacked(resp, NULL);
}

static void sleep_ms(long millis)
{
    struct timespec ts = {millis / 1000, (millis % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void check_malformed(struct group *g, pagoda_client *alice)
{
    /* Bytes that cannot be a ClientRequest: an 11-byte varint. */
    uint8_t garbage[64];
    memset(garbage, 0xff, sizeof(garbage));
    Pagoda__ClientResponse *resp = raw_call(g, garbage, sizeof(garbage));
    CHECK(resp_code(resp) == PAGODA_EFORMAT && strstr(resp_msg(resp), "malformed") != NULL,
          "malformed bytes: PAGODA_EFORMAT (%d, %s)", resp_code(resp), resp_msg(resp));
    if (resp != NULL)
        pagoda__client_response__free_unpacked(resp, NULL);
    /* Random bytes: each answered with an error (most are malformed, the rest name no call or
     * carry no key). */
    int answered = 0;
    for (int i = 0; i < 20; i++) {
        uint8_t blob[48];
        if (getrandom(blob, sizeof(blob), 0) != (ssize_t)sizeof(blob))
            memset(blob, i, sizeof(blob));
        resp = raw_call(g, blob, sizeof(blob));
        answered += resp != NULL && resp_code(resp) < 0;
        if (resp != NULL)
            pagoda__client_response__free_unpacked(resp, NULL);
    }
    CHECK(answered == 20, "random bytes: all 20 answered with an error (%d)", answered);
    still_serving(alice, "random bytes");

    /* A valid Submit cut in half. */
    int32_t prompt[32];
    group_prompt(prompt, 32, 5, VOCAB);
    struct raw_submit s;
    raw_submit_init(&s, prompt, 32);
    size_t len = pagoda__client_request__get_packed_size(&s.req);
    uint8_t *buf = malloc(len);
    pagoda__client_request__pack(&s.req, buf);
    resp = raw_call(g, buf, len / 2);
    free(buf);
    CHECK(resp_code(resp) == PAGODA_EFORMAT, "a truncated protobuf: PAGODA_EFORMAT (%d, %s)",
          resp_code(resp), resp_msg(resp));
    if (resp != NULL)
        pagoda__client_response__free_unpacked(resp, NULL);
    still_serving(alice, "a truncated protobuf");
}

static void check_ids_and_keys(struct group *g, pagoda_client *alice, pagoda_client *bob)
{
    uint8_t unknown[16], id[16];
    if (getrandom(unknown, 16, 0) != 16)
        memset(unknown, 3, 16);
    pagoda_result r = {0};
    int rc = pagoda_poll(alice, unknown, 0, 0, &r);
    CHECK(rc == PAGODA_ENOENT && strstr(pagoda_error_detail(), "no request") != NULL,
          "poll of an unknown id: PAGODA_ENOENT (%d, %s)", rc, pagoda_error_detail());
    rc = pagoda_cancel(alice, unknown, NULL);
    CHECK(rc == PAGODA_ENOENT, "cancel of an unknown id: PAGODA_ENOENT (%d)", rc);
    still_serving(alice, "an unknown id");

    int32_t prompt[8];
    group_prompt(prompt, 8, 9, VOCAB);
    pagoda_generate_params p = group_greedy(20);
    rc = pagoda_submit(alice, &p, prompt, 8, id);
    CHECK(rc == 0, "alice submits (%d)", rc);
    rc = pagoda_poll(bob, id, 0, 0, &r);
    CHECK(rc == PAGODA_ENOENT, "bob's poll of alice's id: PAGODA_ENOENT like an unknown id (%d)",
          rc);
    rc = pagoda_cancel(bob, id, NULL);
    CHECK(rc == PAGODA_ENOENT, "bob's cancel of alice's id: PAGODA_ENOENT (%d)", rc);
    uint32_t have = 0;
    pagoda_finish_reason f = PAGODA_FINISH_NONE;
    for (int i = 0; i < 1000 && f == PAGODA_FINISH_NONE; i++) {
        if ((rc = pagoda_poll(alice, id, have, 5000, &r)) != 0)
            break;
        have += (uint32_t)r.num_tokens;
        f = r.finish_reason;
        pagoda_result_free(&r);
    }
    CHECK(f == PAGODA_FINISH_LENGTH && have == 20,
          "alice's request was not touched by bob's cancel (%s, %u tokens)",
          pagoda_finish_reason_name(f), have);
    still_serving(alice, "another tenant's id");

    const char *bad_keys[] = {"wrong-key", NULL};
    for (int i = 0; i < 2; i++) {
        pagoda_client *c = open_tenant(g, bad_keys[i]);
        rc = c ? pagoda_submit(c, &p, prompt, 8, id) : -1;
        CHECK(rc == PAGODA_EPERM && strstr(pagoda_error_detail(), "unknown API key") != NULL &&
                  strstr(pagoda_error_detail(), "alice") == NULL,
              "%s: PAGODA_EPERM unknown API key (%d, %s)", bad_keys[i] ? "a wrong key" : "no key",
              rc, pagoda_error_detail());
        pagoda_client_close(c);
    }
    still_serving(alice, "a wrong API key");
}

static void check_parameters(struct group *g, pagoda_client *alice)
{
    static int32_t prompt[MAX_PROMPT_TOKENS + 1];
    group_prompt(prompt, MAX_PROMPT_TOKENS + 1, 13, VOCAB);
    struct raw_submit s;

    raw_submit_init(&s, prompt, 8);
    s.sub.max_tokens = 0;
    expect_refused(g, &s, PAGODA_ERANGE, "max_tokens", "max tokens 0");
    raw_submit_init(&s, prompt, 8);
    s.sub.max_tokens = MAX_NEW_TOKENS + 1;
    expect_refused(g, &s, PAGODA_ERANGE, "max_tokens", "max tokens over the limit");
    raw_submit_init(&s, prompt, 8);
    s.sp.has_top_p = 1;
    s.sp.top_p = 0.0f;
    expect_refused(g, &s, PAGODA_ERANGE, "top_p", "top-p 0");
    raw_submit_init(&s, prompt, 8);
    s.sp.has_top_p = 1;
    s.sp.top_p = 1.5f;
    expect_refused(g, &s, PAGODA_ERANGE, "top_p", "top-p 1.5");
    raw_submit_init(&s, prompt, 8);
    s.sp.temperature = -1.0f;
    expect_refused(g, &s, PAGODA_ERANGE, "temperature", "a negative temperature");
    raw_submit_init(&s, prompt, 0);
    expect_refused(g, &s, PAGODA_EINVAL, "empty", "an empty prompt");
    raw_submit_init(&s, prompt, MAX_PROMPT_TOKENS + 1);
    expect_refused(g, &s, PAGODA_ERANGE, "limit", "a prompt above --max-prompt-tokens");
    still_serving(alice, "bad parameters");

    /* What only the scheduler can judge ends the request with FINISH_ERROR and its message. */
    int32_t bad[8];
    group_prompt(bad, 8, 21, VOCAB);
    bad[3] = VOCAB;
    pagoda_generate_params p = group_greedy(4);
    pagoda_result r = {0};
    int rc = pagoda_generate(alice, &p, bad, 8, &r);
    CHECK(rc == 0 && r.finish_reason == PAGODA_FINISH_ERROR && r.error_message != NULL &&
              strstr(r.error_message, "vocabulary") != NULL,
          "a token id at the vocabulary size: FINISH_ERROR (%d, %s, %s)", rc,
          pagoda_finish_reason_name(r.finish_reason), r.error_message ? r.error_message : "-");
    pagoda_result_free(&r);
    still_serving(alice, "a token id outside the vocabulary");

    size_t n = KV_BLOCKS * BLOCK_SIZE + 40; /* more than the pool, less than max positions */
    rc = pagoda_generate(alice, &p, prompt, n, &r);
    CHECK(rc == 0 && r.finish_reason == PAGODA_FINISH_ERROR && r.error_message != NULL,
          "a %zu-token prompt that cannot fit in the pool: FINISH_ERROR (%d, %s, %s)", n, rc,
          pagoda_finish_reason_name(r.finish_reason), r.error_message ? r.error_message : "-");
    pagoda_result_free(&r);
    still_serving(alice, "a prompt that cannot fit in the pool");
}

static void check_exhausted(pagoda_client *alice, pagoda_client *bob)
{
    uint8_t ids[BOB_LIMIT][16], extra[16];
    int32_t prompt[8];
    pagoda_generate_params p = group_greedy(30);
    int admitted = 0, rc;
    for (int i = 0; i < BOB_LIMIT; i++) {
        group_prompt(prompt, 8, 100 + (uint32_t)i, VOCAB);
        admitted += pagoda_submit(bob, &p, prompt, 8, ids[i]) == 0;
    }
    CHECK(admitted == BOB_LIMIT, "bob's first %d requests admitted (%d)", BOB_LIMIT, admitted);
    rc = pagoda_submit(bob, &p, prompt, 8, extra);
    CHECK(rc == PAGODA_EEXHAUSTED && strstr(pagoda_error_detail(), "limit") != NULL,
          "one more than bob's queues hold: PAGODA_EEXHAUSTED (%d, %s)", rc, pagoda_error_detail());
    still_serving(alice, "bob's queues filled (alice is not held back)");
    int complete = 0;
    for (int i = 0; i < admitted; i++) {
        uint32_t have = 0;
        pagoda_finish_reason f = PAGODA_FINISH_NONE;
        for (int t = 0; t < 1000 && f == PAGODA_FINISH_NONE; t++) {
            pagoda_result r = {0};
            if (pagoda_poll(bob, ids[i], have, 5000, &r) != 0)
                break;
            have += (uint32_t)r.num_tokens;
            f = r.finish_reason;
            pagoda_result_free(&r);
        }
        complete += f == PAGODA_FINISH_LENGTH && have == 30;
    }
    CHECK(complete == admitted, "every admitted request completed (%d of %d)", complete, admitted);
    pagoda_result r = {0};
    rc = pagoda_generate(bob, &p, prompt, 8, &r);
    CHECK(rc == 0 && r.num_tokens == 30, "bob is admitted again once his requests ended (%d)", rc);
    pagoda_result_free(&r);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: bad_input_test BIN_DIR\n");
        return 2;
    }
    struct group g;
    int rc = group_setup(&g, argv[1], 0);
    if (rc != 0)
        return rc;
    char tenants[600], max_new[16], max_prompt[16];
    snprintf(tenants, sizeof(tenants), "%s/tenants.json", g.tmp);
    snprintf(max_new, sizeof(max_new), "%d", MAX_NEW_TOKENS);
    snprintf(max_prompt, sizeof(max_prompt), "%d", MAX_PROMPT_TOKENS);
    FILE *f = fopen(tenants, "w");
    if (f == NULL || fputs(tenants_json, f) < 0 || fclose(f) != 0) {
        printf("cannot write %s\n", tenants);
        group_cleanup(&g);
        return 1;
    }
    g.kv_blocks = KV_BLOCKS;
    /* clang-format off */
    const char *extra[] = {
        "--router-arg", "--tenants", "--router-arg", tenants,
        "--router-arg", "--max-new-tokens", "--router-arg", max_new,
        "--router-arg", "--max-prompt-tokens", "--router-arg", max_prompt,
        "--worker-arg", "--step-delay-ms", "--worker-arg", "10",
        NULL};
    /* clang-format on */
    int started = group_start(&g, extra) == 0;
    CHECK(started, "group started with two tenants and %d KV blocks", KV_BLOCKS);
    pagoda_client *alice = open_tenant(&g, "alice-key");
    pagoda_client *bob = open_tenant(&g, "bob-key");
    if (started && alice != NULL && bob != NULL) {
        still_serving(alice, "start");
        check_malformed(&g, alice);
        check_ids_and_keys(&g, alice, bob);
        check_parameters(&g, alice);
        check_exhausted(alice, bob);
        sleep_ms(10);
        CHECK(group_stop(&g) == 0, "the group stops");
    }
    pagoda_client_close(alice);
    pagoda_client_close(bob);
    group_stop(&g);
    return group_finish(&g);
}
