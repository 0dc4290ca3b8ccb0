/* Tests of http/ (the protocol): keep-alive, HEAD, pipelining, Connection: close, HTTP/1.0,
 * Upgrade answered as HTTP, request bodies by Content-Length and chunks, Expect: 100-continue,
 * a chunked stream read back, malformed requests, the configuration. The harness
 * (test_http_server_harness.h) runs a real server and socket clients; the limits are in
 * test_http_server_limits.c. */
#include "tests/unit/test_http_server_harness.h"

#include <signal.h>

/* ---- keep-alive ---- */

static void client_keep_alive(struct fx *f)
{
    struct cl c;
    struct resp r;
    char v[64];
    CHECK(f, cl_connect(&c, f->port) == 0);
    for (int i = 0; i < 3; i++) {
        char req[128];
        snprintf(req, sizeof(req), "GET /echo?i=%d HTTP/1.1\r\nHost: t\r\nX-Test: %d\r\n\r\n", i,
                 i);
        CHECK(f, cl_sends(&c, req) == 0);
        CHECK(f, cl_response(&c, &r, false) == 0);
        char want[128];
        snprintf(want, sizeof(want), "GET /echo ?i=%d x=%d conns=1 len=0\n", i, i);
        if (r.status != 200 || strcmp(r.body, want) != 0)
            fprintf(stderr, "got %d [%s] [%s]\n", r.status, r.head, r.body);
        CHECK(f, r.status == 200);
        CHECK(f, strcmp(r.body, want) == 0);
        CHECK(f, resp_header(&r, "X-Echo", v, sizeof(v)) && strcmp(v, "yes") == 0);
        CHECK(f, resp_header(&r, "Connection", v, sizeof(v)) == NULL);
        resp_free(&r);
    }
    /* HEAD: the length of the body that GET would have, no body; the connection goes on. */
    CHECK(f, cl_sends(&c, "HEAD /echo HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, true) == 0);
    CHECK(f, r.status == 200 && resp_header(&r, "Content-Length", v, sizeof(v)));
    resp_free(&r);
    /* Two requests in one write (pipelined): two answers, in order. */
    CHECK(f, cl_sends(&c, "GET /echo?p=1 HTTP/1.1\r\nHost: t\r\n\r\n"
                          "GET /echo?p=2 HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && strstr(r.body, "?p=1 "));
    resp_free(&r);
    CHECK(f, cl_response(&c, &r, false) == 0 && strstr(r.body, "?p=2 "));
    resp_free(&r);
    /* The same when the first is answered later: the second waits for it, unparsed. */
    CHECK(f, cl_sends(&c, "POST /later HTTP/1.1\r\nContent-Length: 1\r\n\r\nx"
                          "GET /echo?p=3 HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && strcmp(r.body, "later\n") == 0);
    resp_free(&r);
    CHECK(f, cl_response(&c, &r, false) == 0 && strstr(r.body, "?p=3 "));
    resp_free(&r);
    /* An Upgrade request is answered as plain HTTP, and the connection goes on. */
    CHECK(f, cl_sends(&c, "GET /echo?u=1 HTTP/1.1\r\nConnection: upgrade\r\n"
                          "Upgrade: websocket\r\n\r\nGET /echo?u=2 HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200 && strstr(r.body, "?u=1 "));
    resp_free(&r);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200 && strstr(r.body, "?u=2 "));
    resp_free(&r);
    /* Connection: close is honoured: the answer says so and the connection ends. */
    CHECK(f, cl_sends(&c, "GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    CHECK(f, resp_header(&r, "Connection", v, sizeof(v)) && strcasecmp(v, "close") == 0);
    resp_free(&r);
    CHECK(f, cl_closed(&c));
    cl_close(&c);

    /* HTTP/1.0 without keep-alive: one answer, then the close. */
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, "GET /echo HTTP/1.0\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    resp_free(&r);
    CHECK(f, cl_closed(&c));
    cl_close(&c);

    /* HTTP/1.0 with keep-alive: it stays open, and a stream to it ends with the close. */
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, "GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    CHECK(f, resp_header(&r, "Connection", v, sizeof(v)) && strcasecmp(v, "keep-alive") == 0);
    resp_free(&r);
    CHECK(f, cl_sends(&c, "GET /stream?n=2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    CHECK(f, strcmp(r.body, "data: 0\n\ndata: 1\n\n") == 0);
    CHECK(f, !resp_header(&r, "Transfer-Encoding", v, sizeof(v)));
    resp_free(&r);
    cl_close(&c);
}

static void test_keep_alive(void **state)
{
    struct fx f;
    fx_config(&f);
    fx_run(&f, client_keep_alive);
    assert_int_equal(f.requests, 14);
    assert_int_equal(atomic_load(&f.on_close_calls), 0);
}

/* ---- bodies ---- */

static void client_bodies(struct fx *f)
{
    struct cl c;
    struct resp r;
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f,
          cl_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\nhello") == 0);
    sleep_ms(20); /* the rest in a later read */
    CHECK(f, cl_sends(&c, " world") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    CHECK(f, strcmp(r.body, "POST /echo ? x=- conns=1 len=11\nhello world") == 0);
    resp_free(&r);
    /* A repeated header: the first; names without case; values without surrounding blanks. */
    CHECK(f, cl_sends(&c, "GET /echo HTTP/1.1\r\nx-TEST:  one \r\nX-Test: two\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    CHECK(f, strcmp(r.body, "GET /echo ? x=one conns=1 len=0\n") == 0);
    resp_free(&r);
    /* Chunked, in pieces across writes, with a chunk extension. */
    CHECK(f, cl_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                          "5\r\nhello\r\n") == 0);
    sleep_ms(20);
    CHECK(f, cl_sends(&c, "6;ext=1\r\n wor") == 0);
    sleep_ms(20);
    CHECK(f, cl_sends(&c, "ld\r\n0\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    CHECK(f, strcmp(r.body, "POST /echo ? x=- conns=1 len=11\nhello world") == 0);
    resp_free(&r);
    /* Expect: 100-continue gets its interim answer before the body is sent. */
    CHECK(f, cl_sends(&c, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n"
                          "Expect: 100-continue\r\n\r\n") == 0);
    char line[64];
    CHECK(f, cl_line(&c, line, sizeof(line)) == 0 && strcmp(line, "HTTP/1.1 100 Continue") == 0);
    CHECK(f, cl_line(&c, line, sizeof(line)) == 0 && line[0] == '\0');
    CHECK(f, cl_sends(&c, "ok") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200 && strstr(r.body, "len=2\nok"));
    resp_free(&r);
    cl_close(&c);
}

static void test_request_bodies(void **state)
{
    struct fx f;
    fx_config(&f);
    fx_run(&f, client_bodies);
}

/* ---- a streamed response ---- */

static void client_stream(struct fx *f)
{
    struct cl c;
    struct resp r;
    char v[64];
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, "GET /stream?n=100 HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    CHECK(f, resp_header(&r, "Transfer-Encoding", v, sizeof(v)) && strcmp(v, "chunked") == 0);
    CHECK(f, resp_header(&r, "Content-Type", v, sizeof(v)) && strcmp(v, "text/event-stream") == 0);
    char want[2048];
    size_t n = 0;
    for (int i = 0; i < 100; i++)
        n += (size_t)snprintf(want + n, sizeof(want) - n, "data: %d\n\n", i);
    CHECK(f, r.body_len == n && memcmp(r.body, want, n) == 0);
    resp_free(&r);
    /* A whole response larger than the socket takes at once. */
    CHECK(f, cl_sends(&c, "GET /big?n=3000000 HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200 && r.body_len == 3000000);
    bool same = true;
    for (size_t i = 0; i < r.body_len && same; i++)
        same = r.body[i] == (char)('a' + i % 26);
    CHECK(f, same);
    resp_free(&r);
    /* The connection goes on after a stream. */
    CHECK(f, cl_sends(&c, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    resp_free(&r);
    cl_close(&c);
}

static void test_chunked_stream(void **state)
{
    struct fx f;
    fx_config(&f);
    fx_run(&f, client_stream);
}

static void client_malformed(struct fx *f)
{
    static const char *const bad[] = {
        "GARBAGE\r\n\r\n",
        "GET / HTTP/1.1\r\nContent-Length: abc\r\n\r\n",
        "GET / HTTP/9.9\r\n\r\n",
        "GET / HTTP/1.1\r\nBad Header\r\n\r\n",
        "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "POST /echo HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        "POST /echo HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        bool ok;
        expect_error_and_close(f, bad[i], 400, &ok);
        CHECK(f, ok);
    }
}

static void test_malformed_requests(void **state)
{
    struct fx f;
    fx_config(&f);
    fx_run(&f, client_malformed);
    assert_int_equal(f.requests, 0);
}

/* ---- CORS ---- */

static void noop_handler(void *user, struct http_request *req) {}

static void client_cors(struct fx *f)
{
    struct cl c;
    struct resp r;
    char v[128];
    CHECK(f, cl_connect(&c, f->port) == 0);
    /* listed (either one, any case): the origin echoed, with Vary: Origin */
    const char *listed[] = {"https://a.example", "http://B.example:8080"};
    for (int i = 0; i < 2; i++) {
        char req[160];
        snprintf(req, sizeof(req), "GET /echo HTTP/1.1\r\nOrigin: %s\r\n\r\n", listed[i]);
        CHECK(f, cl_sends(&c, req) == 0);
        CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
        CHECK(f, resp_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)) &&
                     strcmp(v, listed[i]) == 0);
        CHECK(f, resp_header(&r, "Vary", v, sizeof(v)) && strcmp(v, "Origin") == 0);
        resp_free(&r);
    }
    /* not listed (a prefix of one, one longer), or no Origin: nothing */
    const char *other[] = {"GET /echo HTTP/1.1\r\nOrigin: https://a.exampl\r\n\r\n",
                           "GET /echo HTTP/1.1\r\nOrigin: https://a.example.evil\r\n\r\n",
                           "GET /echo HTTP/1.1\r\n\r\n"};
    for (int i = 0; i < 3; i++) {
        CHECK(f, cl_sends(&c, other[i]) == 0);
        CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
        CHECK(f, !resp_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)));
        /* the answer depends on the Origin all the same (a shared cache keeps one per origin) */
        CHECK(f, resp_header(&r, "Vary", v, sizeof(v)) && strcmp(v, "Origin") == 0);
        resp_free(&r);
    }
    /* a stream's head too */
    CHECK(f, cl_sends(&c, "GET /stream?n=1 HTTP/1.1\r\nOrigin: https://a.example\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    CHECK(f, resp_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)) &&
                 strcmp(v, "https://a.example") == 0);
    resp_free(&r);
    cl_close(&c);
}

static void client_cors_any(struct fx *f)
{
    struct cl c;
    struct resp r;
    char v[64];
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, "GET /echo HTTP/1.1\r\nOrigin: http://x.example\r\n\r\n") == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200);
    CHECK(f, resp_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)) && strcmp(v, "*") == 0);
    CHECK(f, !resp_header(&r, "Vary", v, sizeof(v)));
    resp_free(&r);
    cl_close(&c);
}

static void test_cors(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.allowed_origins = "https://a.example,http://b.example:8080";
    fx_run(&f, client_cors);
    fx_config(&f);
    f.cfg.allowed_origins = "*";
    fx_run(&f, client_cors_any);
    /* blanks or control characters in the list: refused */
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct http_config cfg;
    http_config_default(&cfg);
    cfg.port = 0;
    cfg.allowed_origins = "https://a.example, https://b.example";
    struct http_server *srv = NULL;
    assert_int_equal(http_server_open(&loop, &cfg, noop_handler, NULL, &srv), PAGODA_EINVAL);
    uv_loop_close(&loop);
}

/* ---- configuration ---- */

static void test_bad_config_and_busy_port(void **state)
{
    uv_loop_t loop;
    uv_loop_init(&loop);
    struct http_config cfg;
    struct http_server *s, *s2;
    http_config_default(&cfg);
    assert_int_equal(cfg.port, 8000);
    assert_int_equal(cfg.max_connections, 4096);
    cfg.port = 0;
    cfg.max_body_bytes = 0;
    assert_int_equal(http_server_open(&loop, &cfg, noop_handler, NULL, &s), PAGODA_EINVAL);
    /* Room for one body of the largest size is enough; less is not, nor no room for responses. */
    http_config_default(&cfg);
    cfg.port = 0;
    cfg.max_body_memory = cfg.max_body_bytes - 1;
    assert_int_equal(http_server_open(&loop, &cfg, noop_handler, NULL, &s), PAGODA_EINVAL);
    cfg.max_body_memory = cfg.max_body_bytes;
    assert_int_equal(http_server_open(&loop, &cfg, noop_handler, NULL, &s), 0);
    http_server_close(s);
    cfg.max_write_memory = 0;
    assert_int_equal(http_server_open(&loop, &cfg, noop_handler, NULL, &s), PAGODA_EINVAL);
    http_config_default(&cfg);
    cfg.port = 0;
    cfg.host = "not an address";
    assert_int_equal(http_server_open(&loop, &cfg, noop_handler, NULL, &s), PAGODA_EINVAL);
    cfg.host = "127.0.0.1";
    assert_int_equal(http_server_open(&loop, &cfg, noop_handler, NULL, &s), 0);
    cfg.port = http_server_port(s);
    assert_int_equal(http_server_open(&loop, &cfg, noop_handler, NULL, &s2), PAGODA_EIO);
    assert_non_null(strstr(pagoda_error_detail(), "cannot listen"));
    assert_int_equal(http_server_connections(s), 0);
    http_server_close(s);
    http_server_close(NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    /* As pagoda's programs do (http_server.h): a write to a client gone must not end us. */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keep_alive),
        cmocka_unit_test(test_request_bodies),
        cmocka_unit_test(test_chunked_stream),
        cmocka_unit_test(test_malformed_requests),
        cmocka_unit_test(test_bad_config_and_busy_port),
        cmocka_unit_test(test_cors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
