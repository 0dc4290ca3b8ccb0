/* Tests of http/'s limits and endings: header and body sizes (431, 413), the bodies held at
 * once (503), slow clients (408) while others are served, the CORS headers of these answers, idle
 * connections closed, the connection cap (503), a client that stops reading cut, the slowest reader
 * cut for the responses held at once, a client gone mid-stream (the close callback once), and
 * http_server_close with connections open. The harness is test_http_server_harness.h. */
#include "tests/unit/test_http_server_harness.h"

#include <poll.h>
#include <signal.h>

/* ---- limits ---- */

static void client_size_limits(struct fx *f)
{
    bool ok;
    char big[4096];
    snprintf(big, sizeof(big), "GET /echo HTTP/1.1\r\nHost: t\r\nX-Big: %03000d\r\n\r\n", 7);
    expect_error_and_close(f, big, 431, &ok);
    CHECK(f, ok);
    /* Many small headers, over the limit together. */
    size_t n = (size_t)snprintf(big, sizeof(big), "GET /echo HTTP/1.1\r\n");
    for (int i = 0; i < 200; i++)
        n += (size_t)snprintf(big + n, sizeof(big) - n, "H%d: v\r\n", i);
    snprintf(big + n, sizeof(big) - n, "\r\n");
    expect_error_and_close(f, big, 431, &ok);
    CHECK(f, ok);
    /* A declared body over the limit is refused before it is sent. */
    expect_error_and_close(f, "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n", 413,
                           &ok);
    CHECK(f, ok);
    /* Chunks over the limit together. */
    n = (size_t)snprintf(big, sizeof(big),
                         "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
    for (int i = 0; i < 5; i++)
        n += (size_t)snprintf(big + n, sizeof(big) - n, "100\r\n%0256d\r\n", i);
    expect_error_and_close(f, big, 413, &ok);
    CHECK(f, ok);
    /* A chunk whose size line passes the limit is refused at that line, before its bytes. */
    expect_error_and_close(
        f, "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n7FFFFFFF\r\nabc",
        413, &ok);
    CHECK(f, ok);
    /* Under the limits the same server answers. */
    struct cl c;
    struct resp r;
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, "POST /echo HTTP/1.1\r\nContent-Length: 1000\r\n\r\n") == 0);
    char body[1000];
    memset(body, 'b', sizeof(body));
    CHECK(f, cl_send(&c, body, sizeof(body)) == 0);
    CHECK(f, cl_response(&c, &r, false) == 0 && r.status == 200 && strstr(r.body, "len=1000"));
    resp_free(&r);
    cl_close(&c);
}

static void test_size_limits(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.max_header_bytes = 1024;
    f.cfg.max_body_bytes = 1000;
    fx_run(&f, client_size_limits);
}

/* The server's own error answers carry the CORS headers the handler's answers would (a page then
 * reads why it was refused, where it saw a network error) once the request's Origin header has
 * all arrived: a declared body too large (413), headers too large after it (431), a body that
 * stops (408), broken chunks (400), a body past the budget of bodies held (503). A head too large
 * before its Origin line (431), or that stops before it (408), has only Vary: Origin. */
static void client_error_cors(struct fx *f)
{
    static const char allowed[] = "https://a.example";
    char before[2048], after[2048];
    snprintf(before, sizeof(before), "GET /echo HTTP/1.1\r\nOrigin: %s\r\nX-Big: %01200d\r\n\r\n",
             allowed, 7);
    snprintf(after, sizeof(after), "GET /echo HTTP/1.1\r\nX-Big: %01200d\r\nOrigin: %s\r\n\r\n", 7,
             allowed);
    const struct {
        const char *request;
        int status;
        const char *origin;
    } cases[] = {
        {before, 431, allowed},
        {after, 431, NULL},
        {"POST /echo HTTP/1.1\r\nOrigin: https://a.example\r\nContent-Length: 5000\r\n\r\n", 413,
         allowed},
        {"POST /echo HTTP/1.1\r\nOrigin: https://a.example\r\nContent-Length: 10\r\n\r\nabc", 408,
         allowed},
        /* a value still arriving is not read: the Origin that begins with an allowed one is not
         * known */
        {"GET /echo HTTP/1.1\r\nOrigin: https://a.example", 408, NULL},
        {"POST /echo HTTP/1.1\r\nOrigin: https://a.example\r\nTransfer-Encoding: chunked\r\n\r\n"
         "zz\r\n",
         400, allowed},
    };
    bool ok;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        expect_cors_error_and_close(f, cases[i].request, cases[i].status, cases[i].origin, &ok);
        CHECK(f, ok);
    }
    /* 900 bytes of one body held: the next body of 1000 passes the budget of 1500 */
    struct cl held;
    CHECK(f, cl_connect(&held, f->port) == 0);
    CHECK(f, cl_sends(&held, "POST /echo HTTP/1.1\r\nContent-Length: 1000\r\n\r\n") == 0);
    char body[900];
    memset(body, 'b', sizeof(body));
    CHECK(f, cl_send(&held, body, sizeof(body)) == 0);
    sleep_ms(50); /* read by the server before the next */
    expect_cors_error_and_close(
        f, "POST /echo HTTP/1.1\r\nOrigin: https://a.example\r\nContent-Length: 1000\r\n\r\n", 503,
        allowed, &ok);
    CHECK(f, ok);
    cl_close(&held);
}

static void test_error_answers_carry_cors(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.allowed_origins = "http://b.example,https://a.example";
    f.cfg.max_header_bytes = 1024;
    f.cfg.max_body_bytes = 1000;
    f.cfg.max_body_memory = 1500;
    f.cfg.request_timeout_ms = 300;
    fx_run(&f, client_error_cors);
}

/* Two bodies of 1000 bytes under a budget of 1500 body bytes for every connection, 900 bytes of
 * each sent: whichever the server reads second is refused at once (503, closed; at its headers,
 * or at the byte that passes the budget) while the other waits for the rest of its body. A third
 * declaring 1000 bytes with Expect: 100-continue meanwhile gets its 503 before any 100 Continue,
 * and a chunked body its 503 at the size line of the chunk that would pass the budget.
 * Once the second is served the budget is free again. */
static void client_body_memory(struct fx *f)
{
    struct cl c[3];
    struct resp r;
    char body[1000];
    memset(body, 'b', sizeof(body));
    for (int i = 0; i < 2; i++) {
        CHECK(f, cl_connect(&c[i], f->port) == 0);
        CHECK(f, cl_sends(&c[i], "POST /echo HTTP/1.1\r\nContent-Length: 1000\r\n\r\n") == 0);
        (void)cl_send(&c[i], body, 900); /* the refused one may be closed already */
    }
    /* Only the refused one has anything to read. */
    struct pollfd pf[2] = {{.fd = c[0].fd, .events = POLLIN}, {.fd = c[1].fd, .events = POLLIN}};
    CHECK(f, poll(pf, 2, 5000) == 1);
    const int refused = (pf[0].revents & POLLIN) ? 0 : 1, served = 1 - refused;
    char retry[16];
    CHECK(f, cl_response(&c[refused], &r, false) == 0 && r.status == 503 &&
                 strstr(r.body, "leave no room") &&
                 resp_header(&r, "Retry-After", retry, sizeof(retry)) && strcmp(retry, "1") == 0);
    resp_free(&r);
    CHECK(f, cl_closed(&c[refused]));
    /* The served one holds 600 bytes or more (the refusal needed 1500 in all): no room for 1000. */
    CHECK(f, cl_connect(&c[2], f->port) == 0);
    CHECK(f, cl_sends(&c[2], "POST /echo HTTP/1.1\r\nContent-Length: 1000\r\n"
                             "Expect: 100-continue\r\n\r\n") == 0);
    char line[64]; /* the first line is the 503: no 100 Continue ahead of it */
    CHECK(f, cl_line(&c[2], line, sizeof(line)) == 0 &&
                 strcmp(line, "HTTP/1.1 503 Service Unavailable") == 0);
    cl_close(&c[2]);
    /* A chunked body declares its chunks: one of 950 bytes is refused at its size line, before
     * any of its bytes is sent. */
    CHECK(f, cl_connect(&c[2], f->port) == 0);
    CHECK(f,
          cl_sends(&c[2], "POST /echo HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3b6\r\n") == 0);
    CHECK(f, cl_response(&c[2], &r, false) == 0 && r.status == 503);
    resp_free(&r);
    CHECK(f, cl_closed(&c[2]));
    cl_close(&c[2]);
    CHECK(f, cl_send(&c[served], body + 900, sizeof(body) - 900) == 0);
    CHECK(f,
          cl_response(&c[served], &r, false) == 0 && r.status == 200 && strstr(r.body, "len=1000"));
    resp_free(&r);
    for (int i = 0; i < 2; i++)
        cl_close(&c[i]);
    /* The served body's bytes are back: a third is served. */
    CHECK(f, cl_connect(&c[0], f->port) == 0);
    CHECK(f, cl_sends(&c[0], "POST /echo HTTP/1.1\r\nContent-Length: 1000\r\n\r\n") == 0);
    CHECK(f, cl_send(&c[0], body, sizeof(body)) == 0);
    CHECK(f, cl_response(&c[0], &r, false) == 0 && r.status == 200 && strstr(r.body, "len=1000"));
    resp_free(&r);
    cl_close(&c[0]);
}

static void test_body_memory(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.max_body_bytes = 1000;
    f.cfg.max_body_memory = 1500;
    fx_run(&f, client_body_memory);
}

static void client_slow_and_idle(struct fx *f)
{
    struct cl slow, other, idle;
    struct resp r;
    /* Half a request, then nothing. */
    CHECK(f, cl_connect(&slow, f->port) == 0);
    CHECK(f, cl_sends(&slow, "GET /echo HTTP/1.1\r\nHost: t\r\n") == 0);
    /* Meanwhile another client is served. */
    CHECK(f, cl_connect(&other, f->port) == 0);
    CHECK(f, cl_sends(&other, "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(f, cl_response(&other, &r, false) == 0 && r.status == 200);
    resp_free(&r);
    /* The slow one gets its 408 and the close. */
    CHECK(f, cl_response(&slow, &r, false) == 0 && r.status == 408);
    resp_free(&r);
    CHECK(f, cl_closed(&slow));
    cl_close(&slow);
    /* A slow body too: the timeout runs from the first byte to the complete body. */
    CHECK(f, cl_connect(&slow, f->port) == 0);
    CHECK(f, cl_sends(&slow, "POST /echo HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc") == 0);
    CHECK(f, cl_response(&slow, &r, false) == 0 && r.status == 408);
    resp_free(&r);
    CHECK(f, cl_closed(&slow));
    cl_close(&slow);
    /* The client served before, idle since: closed without a word; and one that never sent
     * a byte too. */
    CHECK(f, cl_closed(&other));
    cl_close(&other);
    CHECK(f, cl_connect(&idle, f->port) == 0);
    CHECK(f, cl_closed(&idle));
    cl_close(&idle);
}

static void test_slow_and_idle_clients(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.request_timeout_ms = 300;
    f.cfg.idle_timeout_ms = 300;
    fx_run(&f, client_slow_and_idle);
}

/* At the cap a new connection takes the place of one idle or whose request has not all arrived
 * (a slowloris client's), never of one whose request is with the handler; only when every place
 * is busy so is it refused. */
static void client_connection_cap(struct fx *f)
{
    struct cl a, b, c, d, extra;
    struct resp r;
    CHECK(f, cl_connect(&a, f->port) == 0);
    CHECK(f, cl_connect(&b, f->port) == 0);
    CHECK(f, cl_sends(&a, "GET /echo HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, cl_response(&a, &r, false) == 0 && r.status == 200);
    resp_free(&r);
    CHECK(f, cl_sends(&b, "GET /hold HTTP/1.1\r\n\r\n") == 0); /* busy from now on */
    CHECK(f, wait_atomic(&f->num_held, 1));
    /* a third takes the place of a, idle between requests */
    CHECK(f, cl_connect(&extra, f->port) == 0);
    CHECK(f, cl_sends(&extra, "GET /echo HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, cl_response(&extra, &r, false) == 0 && r.status == 200);
    resp_free(&r);
    CHECK(f, cl_closed(&a));
    cl_close(&a);
    /* c sends half a head and holds its place (slowloris) after taking extra's; d takes c's */
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, "GET /echo HTTP/1.1\r\nX-Slow: 1\r\n") == 0);
    CHECK(f, cl_closed(&extra));
    cl_close(&extra);
    CHECK(f, cl_connect(&d, f->port) == 0);
    CHECK(f, cl_sends(&d, "GET /hold HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, wait_atomic(&f->num_held, 2));
    CHECK(f, cl_closed(&c));
    cl_close(&c);
    /* both places busy with the handler: the next is refused with a 503 and closed, before
     * anything of it is read (so no Access-Control-Allow-Origin: its Origin is not known; the
     * Vary: Origin of the list of origins all the same) */
    CHECK(f, cl_connect(&extra, f->port) == 0);
    char v[64];
    CHECK(f, cl_response(&extra, &r, false) == 0 && r.status == 503 &&
                 !resp_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)) &&
                 resp_header(&r, "Vary", v, sizeof(v)) && strcmp(v, "Origin") == 0);
    resp_free(&r);
    CHECK(f, cl_closed(&extra));
    cl_close(&extra);
    cl_close(&b);
    cl_close(&d);
}

/* Of the connections that may give their place, the one whose last bytes came longest ago does:
 * a slowloris client's half head before a connection just opened (whose request is on its way). */
static void client_quietest_gives_way(struct fx *f)
{
    struct cl b, c, x, y;
    struct resp r;
    CHECK(f, cl_connect(&b, f->port) == 0);
    CHECK(f, cl_sends(&b, "GET /hold HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, wait_atomic(&f->num_held, 1));
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, "GET /echo HTTP/1.1\r\nX-Slow: 1\r\n") == 0);
    sleep_ms(50);
    CHECK(f, cl_connect(&x, f->port) == 0); /* nothing sent yet */
    sleep_ms(20);
    CHECK(f, cl_connect(&y, f->port) == 0);
    CHECK(f, cl_closed(&c));
    CHECK(f, cl_sends(&x, "GET /echo HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, cl_response(&x, &r, false) == 0 && r.status == 200);
    resp_free(&r);
    cl_close(&c);
    cl_close(&x);
    cl_close(&y);
    cl_close(&b);
}

static void test_connection_cap(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.max_connections = 2;
    f.cfg.allowed_origins = "https://a.example";
    fx_run(&f, client_connection_cap);
    /* (a connection closing still counts until libuv has closed it) */
    assert_true(f.max_conns_seen >= 2 && f.max_conns_seen <= 3);
    assert_int_equal(f.evictions, 3);
    fx_config(&f);
    f.cfg.max_connections = 3;
    fx_run(&f, client_quietest_gives_way);
    assert_int_equal(f.evictions, 1);
}

/* ---- clients that go away or do not read ---- */

static void client_stops_reading(struct fx *f)
{
    struct cl c;
    CHECK(f, cl_connect_buf(&c, f->port, 4096) == 0);
    CHECK(f, cl_sends(&c, "GET /flood HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    char line[64];
    CHECK(f, cl_line(&c, line, sizeof(line)) == 0 && strcmp(line, "HTTP/1.1 200 OK") == 0);
    /* And reads no more: the server cuts it and the handler's close callback runs. */
    CHECK(f, wait_atomic(&f->on_close_calls, 1));
    cl_close(&c);
}

static void test_client_not_reading_is_cut(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.max_queued_write_bytes = 256 * 1024;
    fx_run(&f, client_stops_reading);
    assert_int_equal(atomic_load(&f.on_close_calls), 1);
    assert_int_equal(f.flood_last_rc, PAGODA_ECLOSED);
    assert_true(f.flood_writes < FLOOD_MAX_WRITES);
}

static void client_disconnects_mid_stream(struct fx *f)
{
    struct cl c;
    char line[64];
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, "GET /streamhold HTTP/1.1\r\nHost: t\r\n\r\n") == 0);
    CHECK(f, cl_line(&c, line, sizeof(line)) == 0 && strcmp(line, "HTTP/1.1 200 OK") == 0);
    do {
        CHECK(f, cl_line(&c, line, sizeof(line)) == 0);
    } while (line[0]);
    CHECK(f, cl_line(&c, line, sizeof(line)) == 0 && strcmp(line, "6") == 0);
    CHECK(f, cl_line(&c, line, sizeof(line)) == 0 && strcmp(line, "first") == 0);
    cl_close(&c);
    CHECK(f, wait_atomic(&f->on_close_calls, 1));
    /* And before the response: a request the handler holds. */
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, "POST /hold HTTP/1.1\r\nContent-Length: 2\r\n\r\nhi") == 0);
    CHECK(f, wait_atomic(&f->num_held, 2));
    cl_close(&c);
    CHECK(f, wait_atomic(&f->on_close_calls, 2));
}

static void test_disconnect_mid_stream_closes_once(void **state)
{
    struct fx f;
    fx_config(&f);
    fx_run(&f, client_disconnects_mid_stream);
    /* Once each, not again when the server closes. */
    assert_int_equal(atomic_load(&f.on_close_calls), 2);
    assert_null(f.held[0]);
    assert_null(f.held[1]);
}

static void client_leaves_everything_open(struct fx *f)
{
    struct cl c[4];
    CHECK(f, cl_connect(&c[0], f->port) == 0); /* idle */
    CHECK(f, cl_connect(&c[1], f->port) == 0); /* half a request */
    CHECK(f, cl_sends(&c[1], "POST /echo HTTP/1.1\r\nContent-Length: 100\r\n\r\nab") == 0);
    CHECK(f, cl_connect(&c[2], f->port) == 0); /* held by the handler */
    CHECK(f, cl_sends(&c[2], "GET /hold HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, cl_connect(&c[3], f->port) == 0); /* streaming */
    CHECK(f, cl_sends(&c[3], "GET /streamhold HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, wait_atomic(&f->num_held, 2));
    for (int i = 0; i < 4; i++)
        f->leftover[f->num_leftover++] = c[i].fd;
    /* Returning closes the server with all four open. */
}

/* The responses held for every client together (max_write_memory, 48 MiB here), counted from
 * each write to its completion: a client that reads nothing of a 16 MiB answer (stalled), then
 * one that has not read its 24 MiB answer yet either (fresh, and larger); a third client's 16 MiB
 * would pass the budget, so the stalled one is cut (the larger fresh one is not), the third is
 * served whole, and so is the second once it reads. With the budget off the first would read all
 * of its answer; cutting the largest first would have cut the second. */
#define WM_STALLED_BYTES (16 << 20)
#define WM_FRESH_BYTES (24 << 20)
#define WM_THIRD_BYTES (16 << 20)

/* Reads the rest of c's answer to its end (EOF or a reset); the bytes read, buffered ones too. */
static size_t read_to_end(struct cl *c, bool *ended)
{
    size_t got = c->end - c->start;
    char buf[65536];
    ssize_t n;
    while ((n = recv(c->fd, buf, sizeof(buf), 0)) > 0)
        got += (size_t)n;
    *ended = n == 0 || (n < 0 && errno == ECONNRESET);
    return got;
}

static void client_write_memory(struct fx *f)
{
    struct cl stalled, fresh, third;
    char line[128];
    CHECK(f, cl_connect_buf(&stalled, f->port, 4096) == 0);
    snprintf(line, sizeof(line), "GET /big?n=%d HTTP/1.1\r\nHost: t\r\n\r\n", WM_STALLED_BYTES);
    CHECK(f, cl_sends(&stalled, line) == 0);
    CHECK(f, cl_line(&stalled, line, sizeof(line)) == 0 && strcmp(line, "HTTP/1.1 200 OK") == 0);
    sleep_ms(300); /* ... and reads no more */
    CHECK(f, cl_connect_buf(&fresh, f->port, 4096) == 0);
    snprintf(line, sizeof(line), "GET /big?n=%d HTTP/1.1\r\nConnection: close\r\n\r\n",
             WM_FRESH_BYTES);
    CHECK(f, cl_sends(&fresh, line) == 0);
    CHECK(f, cl_line(&fresh, line, sizeof(line)) == 0 && strcmp(line, "HTTP/1.1 200 OK") == 0);
    struct resp r;
    CHECK(f, cl_connect(&third, f->port) == 0);
    snprintf(line, sizeof(line), "GET /big?n=%d HTTP/1.1\r\nHost: t\r\n\r\n", WM_THIRD_BYTES);
    CHECK(f, cl_sends(&third, line) == 0);
    CHECK(f,
          cl_response(&third, &r, false) == 0 && r.status == 200 && r.body_len == WM_THIRD_BYTES);
    resp_free(&r);
    cl_close(&third);
    /* The fresh one reads all of its answer (head and body, to the close it asked for). */
    bool ended;
    size_t got = read_to_end(&fresh, &ended);
    CHECK(f, ended && got > WM_FRESH_BYTES);
    cl_close(&fresh);
    /* The stalled one reads what reached its socket before the cut, then the end. */
    got = read_to_end(&stalled, &ended);
    CHECK(f, ended && got < WM_STALLED_BYTES);
    cl_close(&stalled);
}

static void test_write_memory(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.max_write_memory = 48 << 20;
    fx_run(&f, client_write_memory);
    assert_int_equal(f.write_cuts, 1);
}

/* An answer larger than the whole budget (16 MiB against 8) cannot be made room for: nobody is
 * cut for it (cutting the stalled client would not make it fit), and both are served. */
static void client_write_memory_no_useless_cut(struct fx *f)
{
    struct cl stalled, big;
    char line[128];
    CHECK(f, cl_connect_buf(&stalled, f->port, 4096) == 0);
    snprintf(line, sizeof(line), "GET /big?n=%d HTTP/1.1\r\nConnection: close\r\n\r\n", 4 << 20);
    CHECK(f, cl_sends(&stalled, line) == 0);
    CHECK(f, cl_line(&stalled, line, sizeof(line)) == 0 && strcmp(line, "HTTP/1.1 200 OK") == 0);
    struct resp r;
    CHECK(f, cl_connect(&big, f->port) == 0);
    snprintf(line, sizeof(line), "GET /big?n=%d HTTP/1.1\r\nHost: t\r\n\r\n", 16 << 20);
    CHECK(f, cl_sends(&big, line) == 0);
    CHECK(f, cl_response(&big, &r, false) == 0 && r.status == 200 && r.body_len == 16 << 20);
    resp_free(&r);
    cl_close(&big);
    bool ended;
    size_t got = read_to_end(&stalled, &ended);
    CHECK(f, ended && got > (4 << 20));
    cl_close(&stalled);
}

static void test_write_memory_no_useless_cut(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.max_write_memory = 8 << 20;
    fx_run(&f, client_write_memory_no_useless_cut);
    assert_int_equal(f.write_cuts, 0);
}

static void test_close_with_connections_open(void **state)
{
    struct fx f;
    fx_config(&f);
    fx_run(&f, client_leaves_everything_open);
    assert_int_equal(atomic_load(&f.on_close_calls), 2);
}

int main(void)
{
    /* As pagoda's programs do (http_server.h): a write to a client gone must not end us. */
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_size_limits),
        cmocka_unit_test(test_body_memory),
        cmocka_unit_test(test_error_answers_carry_cors),
        cmocka_unit_test(test_slow_and_idle_clients),
        cmocka_unit_test(test_connection_cap),
        cmocka_unit_test(test_client_not_reading_is_cut),
        cmocka_unit_test(test_disconnect_mid_stream_closes_once),
        cmocka_unit_test(test_write_memory),
        cmocka_unit_test(test_write_memory_no_useless_cut),
        cmocka_unit_test(test_close_with_connections_open),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
