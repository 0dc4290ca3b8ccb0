/* Tests of http/: a real server on a loop in the test's main thread, clients made of plain
 * blocking sockets (with receive timeouts) in a second thread. Each test runs one client
 * function; when it returns, the server is closed with whatever is still open, the loop runs
 * until every handle is closed, and uv_loop_close must succeed (everything freed; the ASan
 * build checks the memory). Client checks record the first failure, which the main thread
 * asserts after joining. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "http/http_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* A client's wait for any one answer. */
#define CLIENT_RECV_TIMEOUT_S 5
/* The whole test, after which the loop stops it (a hang fails instead of stalling). */
#define GUARD_MS 30000
/* Bounded waits of the client for something the server does. */
#define WAIT_STEPS 1000
#define WAIT_STEP_MS 10
/* The flood handler: bytes per write, writes per tick, most writes before giving up. */
#define FLOOD_CHUNK 65536
#define FLOOD_PER_TICK 8
#define FLOOD_MAX_WRITES 4000

struct fx {
    uv_loop_t loop;
    struct http_config cfg;
    struct http_server *srv;
    uint16_t port;
    uv_async_t done;
    uv_timer_t guard;
    pthread_t thread;
    void (*client)(struct fx *f);
    char failure[512];
    bool guard_fired;
    /* The handler's state (loop thread), read by the client only through the atomics. */
    int requests;
    uint32_t max_conns_seen;
    struct http_request *held[4];
    atomic_int num_held;
    atomic_int on_close_calls;
    struct http_request *later; /* answered by later_timer */
    uv_timer_t later_timer;
    struct http_request *flood;
    uv_timer_t flood_timer;
    bool flood_timer_open;
    int flood_writes;
    int flood_last_rc;
    /* Client sockets left open for the server's close; closed after the loop ends. */
    int leftover[8];
    int num_leftover;
};

#define CHECK(f, cond)                                                                             \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            if (!(f)->failure[0])                                                                  \
                snprintf((f)->failure, sizeof((f)->failure), "%s:%d: %s", __FILE__, __LINE__,      \
                         #cond);                                                                   \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* ---- the handler ---- */

static struct fx *the_fx; /* the test running, for the close callbacks (they get a slot) */

static void count_close(void *arg)
{
    struct http_request **slot = arg;
    *slot = NULL;
    atomic_fetch_add(&the_fx->on_close_calls, 1);
}

static void flood_stop(struct fx *f)
{
    if (f->flood_timer_open) {
        uv_timer_stop(&f->flood_timer);
    }
}

static void on_flood_closed(void *arg)
{
    struct fx *f = arg;
    f->flood = NULL;
    flood_stop(f);
    atomic_fetch_add(&f->on_close_calls, 1);
}

static void on_flood_tick(uv_timer_t *t)
{
    struct fx *f = t->data;
    static char chunk[FLOOD_CHUNK];
    memset(chunk, 'x', sizeof(chunk));
    for (int i = 0; i < FLOOD_PER_TICK && f->flood; i++) {
        if (f->flood_writes >= FLOOD_MAX_WRITES) {
            flood_stop(f);
            return;
        }
        f->flood_writes++;
        f->flood_last_rc = http_stream_write(f->flood, chunk, sizeof(chunk));
        if (f->flood_last_rc < 0) {
            flood_stop(f); /* cut: the close callback comes from the loop */
            return;
        }
    }
}

static void on_later_closed(void *arg)
{
    struct fx *f = arg;
    f->later = NULL;
    atomic_fetch_add(&f->on_close_calls, 1);
}

static void on_later(uv_timer_t *t)
{
    struct fx *f = t->data;
    if (f->later && http_respond(f->later, 200, "text/plain", "later\n", 6, NULL, 0) != 0)
        snprintf(f->failure, sizeof(f->failure), "the later answer failed");
    f->later = NULL;
}

static int query_int(struct http_request *req, const char *key, int def)
{
    const char *q = http_request_query(req);
    const char *p = strstr(q, key);
    return p ? atoi(p + strlen(key)) : def;
}

static void handler(void *user, struct http_request *req)
{
    struct fx *f = user;
    f->requests++;
    if (http_server_connections(f->srv) > f->max_conns_seen)
        f->max_conns_seen = http_server_connections(f->srv);
    const char *path = http_request_path(req);
    if (strcmp(path, "/echo") == 0) {
        size_t len;
        const char *body = http_request_body(req, &len);
        const char *x = http_request_header(req, "x-test");
        char head[512];
        int n = snprintf(head, sizeof(head), "%s %s ?%s x=%s conns=%u len=%zu\n",
                         http_request_method(req), path, http_request_query(req), x ? x : "-",
                         http_server_connections(f->srv), len);
        char *out = malloc((size_t)n + len);
        memcpy(out, head, (size_t)n);
        memcpy(out + n, body, len);
        const char *extra[] = {"X-Echo: yes"};
        int rc = http_respond(req, 200, "text/plain", out, (size_t)n + len, extra, 1);
        free(out);
        if (rc != 0)
            snprintf(f->failure, sizeof(f->failure), "http_respond: %d", rc);
    } else if (strcmp(path, "/stream") == 0) {
        int n = query_int(req, "n=", 3);
        assert_int_equal(http_stream_start(req, 200, "text/event-stream", NULL, 0), 0);
        /* A second answer to a streamed request is refused. */
        assert_int_equal(http_respond(req, 200, NULL, NULL, 0, NULL, 0), PAGODA_EINVAL);
        for (int i = 0; i < n; i++) {
            char line[64];
            int len = snprintf(line, sizeof(line), "data: %d\n\n", i);
            assert_int_equal(http_stream_write(req, line, (size_t)len), 0);
        }
        assert_int_equal(http_stream_end(req), 0);
    } else if (strcmp(path, "/hold") == 0 || strcmp(path, "/streamhold") == 0) {
        int i = atomic_load(&f->num_held);
        assert_true(i < 4);
        f->held[i] = req;
        http_request_on_close(req, count_close, &f->held[i]);
        if (strcmp(path, "/streamhold") == 0) {
            assert_int_equal(http_stream_start(req, 200, "text/event-stream", NULL, 0), 0);
            assert_int_equal(http_stream_write(req, "first\n", 6), 0);
        }
        atomic_fetch_add(&f->num_held, 1);
    } else if (strcmp(path, "/later") == 0) {
        assert_null(f->later);
        f->later = req;
        http_request_on_close(req, on_later_closed, f);
        uv_timer_start(&f->later_timer, on_later, 50, 0);
    } else if (strcmp(path, "/flood") == 0) {
        assert_null(f->flood);
        f->flood = req;
        http_request_on_close(req, on_flood_closed, f);
        assert_int_equal(http_stream_start(req, 200, "application/octet-stream", NULL, 0), 0);
        uv_timer_start(&f->flood_timer, on_flood_tick, 1, 1);
    } else {
        http_respond(req, 404, "text/plain", "no\n", 3, NULL, 0);
    }
}

/* ---- the runner ---- */

static void shut_everything(struct fx *f)
{
    http_server_close(f->srv);
    f->srv = NULL;
    if (f->flood_timer_open) {
        uv_close((uv_handle_t *)&f->flood_timer, NULL);
        f->flood_timer_open = false;
    }
    uv_close((uv_handle_t *)&f->later_timer, NULL);
    uv_close((uv_handle_t *)&f->done, NULL);
    uv_close((uv_handle_t *)&f->guard, NULL);
}

static void on_done(uv_async_t *a)
{
    shut_everything(a->data);
}

static void on_guard(uv_timer_t *t)
{
    struct fx *f = t->data;
    f->guard_fired = true;
    /* The client thread is stuck in a receive with a timeout: it returns on its own. */
    shut_everything(f);
}

static void *client_main(void *arg)
{
    struct fx *f = arg;
    f->client(f);
    uv_async_send(&f->done);
    return NULL;
}

static void fx_config(struct fx *f)
{
    memset(f, 0, sizeof(*f));
    http_config_default(&f->cfg);
    f->cfg.port = 0;
    f->cfg.request_timeout_ms = 5000;
    f->cfg.idle_timeout_ms = 5000;
}

static void fx_run(struct fx *f, void (*client)(struct fx *f))
{
    the_fx = f;
    assert_int_equal(uv_loop_init(&f->loop), 0);
    assert_int_equal(http_server_open(&f->loop, &f->cfg, handler, f, &f->srv), 0);
    f->port = http_server_port(f->srv);
    assert_true(f->port != 0);
    uv_async_init(&f->loop, &f->done, on_done);
    f->done.data = f;
    uv_timer_init(&f->loop, &f->guard);
    f->guard.data = f;
    uv_timer_start(&f->guard, on_guard, GUARD_MS, 0);
    uv_timer_init(&f->loop, &f->later_timer);
    f->later_timer.data = f;
    uv_timer_init(&f->loop, &f->flood_timer);
    f->flood_timer.data = f;
    f->flood_timer_open = true;
    f->client = client;
    assert_int_equal(pthread_create(&f->thread, NULL, client_main, f), 0);
    uv_run(&f->loop, UV_RUN_DEFAULT);
    pthread_join(f->thread, NULL);
    uv_run(&f->loop, UV_RUN_DEFAULT); /* the async sent after the guard, if so */
    for (int i = 0; i < f->num_leftover; i++)
        close(f->leftover[i]);
    if (f->failure[0])
        fail_msg("%s", f->failure);
    assert_false(f->guard_fired);
    /* Everything of the server is closed and freed. */
    assert_int_equal(uv_loop_close(&f->loop), 0);
}

/* ---- a client of plain sockets ---- */

struct cl {
    int fd;
    char buf[65536];
    size_t start, end;
};

struct resp {
    int status;
    char head[16384]; /* status line and headers, lower-cased names kept as sent */
    char *body;
    size_t body_len;
};

static void resp_free(struct resp *r)
{
    free(r->body);
    r->body = NULL;
}

static int cl_connect_buf(struct cl *c, uint16_t port, int rcvbuf)
{
    c->start = c->end = 0;
    c->fd = socket(AF_INET, SOCK_STREAM, 0);
    if (c->fd < 0)
        return -1;
    struct timeval tv = {.tv_sec = CLIENT_RECV_TIMEOUT_S};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(c->fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (rcvbuf)
        setsockopt(c->fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(c->fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        close(c->fd);
        c->fd = -1;
        return -1;
    }
    return 0;
}

static int cl_connect(struct cl *c, uint16_t port)
{
    return cl_connect_buf(c, port, 0);
}

static void cl_close(struct cl *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

static int cl_send(struct cl *c, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t k = send(c->fd, s, n, MSG_NOSIGNAL);
        if (k <= 0)
            return -1;
        s += k;
        n -= (size_t)k;
    }
    return 0;
}

static int cl_sends(struct cl *c, const char *s)
{
    return cl_send(c, s, strlen(s));
}

/* 1 when bytes are buffered, 0 at EOF, -1 on a timeout or an error. */
static int cl_fill(struct cl *c)
{
    if (c->start < c->end)
        return 1;
    c->start = c->end = 0;
    ssize_t k = recv(c->fd, c->buf, sizeof(c->buf), 0);
    if (k < 0)
        return errno == ECONNRESET ? 0 : -1;
    c->end = (size_t)k;
    return k > 0;
}

/* A line without its CRLF into out; -1 when it does not come or does not fit. */
static int cl_line(struct cl *c, char *out, size_t cap)
{
    size_t n = 0;
    for (;;) {
        if (cl_fill(c) <= 0)
            return -1;
        char ch = c->buf[c->start++];
        if (ch == '\n') {
            if (n > 0 && out[n - 1] == '\r')
                n--;
            out[n] = '\0';
            return 0;
        }
        if (n + 1 >= cap)
            return -1;
        out[n++] = ch;
    }
}

static int cl_bytes(struct cl *c, char *out, size_t n)
{
    while (n > 0) {
        if (cl_fill(c) <= 0)
            return -1;
        size_t k = c->end - c->start < n ? c->end - c->start : n;
        memcpy(out, c->buf + c->start, k);
        c->start += k;
        out += k;
        n -= k;
    }
    return 0;
}

/* A header's value in a response head ("\nName: value\r"), copied; NULL when absent. */
static const char *resp_header(const struct resp *r, const char *name, char *out, size_t cap)
{
    size_t nl = strlen(name);
    for (const char *p = strchr(r->head, '\n'); p; p = strchr(p + 1, '\n')) {
        if (strncasecmp(p + 1, name, nl) == 0 && p[1 + nl] == ':') {
            const char *v = p + 2 + nl;
            while (*v == ' ')
                v++;
            size_t n = strcspn(v, "\r\n");
            if (n >= cap)
                n = cap - 1;
            memcpy(out, v, n);
            out[n] = '\0';
            return out;
        }
    }
    return NULL;
}

static int body_append(struct resp *r, const char *data, size_t n)
{
    char *b = realloc(r->body, r->body_len + n + 1);
    if (!b)
        return -1;
    memcpy(b + r->body_len, data, n);
    r->body = b;
    r->body_len += n;
    r->body[r->body_len] = '\0';
    return 0;
}

/* Reads one response: head, then a body by Content-Length, by chunks, or to EOF. 0, or -1
 * when it does not come whole. A 100 Continue is skipped. head_only: the answer to a HEAD. */
static int cl_response(struct cl *c, struct resp *r, bool head_only)
{
    memset(r, 0, sizeof(*r));
    body_append(r, "", 0);
    for (;;) {
        size_t n = 0;
        char line[8192];
        if (cl_line(c, line, sizeof(line)) < 0)
            return -1;
        if (sscanf(line, "HTTP/1.%*d %d", &r->status) != 1)
            return -1;
        n = (size_t)snprintf(r->head, sizeof(r->head), "%s\r\n", line);
        for (;;) {
            if (cl_line(c, line, sizeof(line)) < 0)
                return -1;
            if (!line[0])
                break;
            n += (size_t)snprintf(r->head + n, sizeof(r->head) - n, "%s\r\n", line);
            if (n >= sizeof(r->head))
                return -1;
        }
        if (r->status != 100)
            break;
    }
    char v[64];
    if (head_only || r->status == 204 || r->status == 304)
        return 0;
    if (resp_header(r, "Transfer-Encoding", v, sizeof(v))) {
        if (strcasecmp(v, "chunked") != 0)
            return -1;
        for (;;) {
            char line[64];
            if (cl_line(c, line, sizeof(line)) < 0)
                return -1;
            char *end;
            unsigned long size = strtoul(line, &end, 16);
            if (end == line || size > (64ul << 20))
                return -1;
            if (size == 0) {
                if (cl_line(c, line, sizeof(line)) < 0 || line[0]) /* no trailers here */
                    return -1;
                return 0;
            }
            char *chunk = malloc(size);
            int rc = chunk ? cl_bytes(c, chunk, size) : -1;
            if (rc == 0)
                rc = body_append(r, chunk, size);
            free(chunk);
            if (rc < 0 || cl_line(c, line, sizeof(line)) < 0 || line[0])
                return -1;
        }
    }
    if (resp_header(r, "Content-Length", v, sizeof(v))) {
        size_t len = strtoul(v, NULL, 10);
        char *b = malloc(len + 1);
        int rc = cl_bytes(c, b, len);
        if (rc == 0)
            rc = body_append(r, b, len);
        free(b);
        return rc;
    }
    for (;;) { /* to EOF */
        int rc = cl_fill(c);
        if (rc < 0)
            return -1;
        if (rc == 0)
            return 0;
        body_append(r, c->buf + c->start, c->end - c->start);
        c->start = c->end;
    }
}

/* True when the server closes the connection (EOF or reset) within the receive timeout,
 * with nothing more sent before. */
static bool cl_closed(struct cl *c)
{
    return cl_fill(c) == 0;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

static bool wait_atomic(atomic_int *v, int at_least)
{
    for (int i = 0; i < WAIT_STEPS; i++) {
        if (atomic_load(v) >= at_least)
            return true;
        sleep_ms(WAIT_STEP_MS);
    }
    return false;
}

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

/* ---- limits ---- */

static void expect_error_and_close(struct fx *f, const char *request, int status, bool *ok)
{
    struct cl c;
    struct resp r;
    char v[64];
    *ok = false;
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, request) == 0);
    CHECK(f, cl_response(&c, &r, false) == 0);
    if (r.status != status)
        snprintf(f->failure, sizeof(f->failure), "status %d, not %d, for %.60s", r.status, status,
                 request);
    CHECK(f, r.status == status);
    CHECK(f, resp_header(&r, "Connection", v, sizeof(v)) && strcmp(v, "close") == 0);
    CHECK(f, strstr(r.body, "\"error\"") != NULL);
    resp_free(&r);
    CHECK(f, cl_closed(&c));
    cl_close(&c);
    *ok = true;
}

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

static void client_connection_cap(struct fx *f)
{
    struct cl a, b, extra;
    struct resp r;
    CHECK(f, cl_connect(&a, f->port) == 0);
    CHECK(f, cl_connect(&b, f->port) == 0);
    CHECK(f, cl_sends(&a, "GET /echo HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, cl_response(&a, &r, false) == 0 && r.status == 200);
    resp_free(&r);
    CHECK(f, cl_sends(&b, "GET /echo HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, cl_response(&b, &r, false) == 0 && r.status == 200 && strstr(r.body, "conns=2"));
    resp_free(&r);
    /* The third is refused with a 503 and closed. */
    CHECK(f, cl_connect(&extra, f->port) == 0);
    CHECK(f, cl_response(&extra, &r, false) == 0 && r.status == 503);
    resp_free(&r);
    CHECK(f, cl_closed(&extra));
    cl_close(&extra);
    /* The others are still served; once one leaves, a new one is let in. */
    CHECK(f, cl_sends(&a, "GET /echo HTTP/1.1\r\n\r\n") == 0);
    CHECK(f, cl_response(&a, &r, false) == 0 && r.status == 200);
    resp_free(&r);
    cl_close(&a);
    bool served = false;
    for (int i = 0; i < 50 && !served; i++) { /* until the server has seen a's close */
        CHECK(f, cl_connect(&extra, f->port) == 0);
        CHECK(f, cl_sends(&extra, "GET /echo HTTP/1.1\r\n\r\n") == 0);
        CHECK(f, cl_response(&extra, &r, false) == 0);
        served = r.status == 200;
        resp_free(&r);
        cl_close(&extra);
        if (!served)
            sleep_ms(20);
    }
    CHECK(f, served);
    cl_close(&b);
}

static void test_connection_cap(void **state)
{
    struct fx f;
    fx_config(&f);
    f.cfg.max_connections = 2;
    fx_run(&f, client_connection_cap);
    assert_int_equal(f.max_conns_seen, 2);
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

static void test_close_with_connections_open(void **state)
{
    struct fx f;
    fx_config(&f);
    fx_run(&f, client_leaves_everything_open);
    assert_int_equal(atomic_load(&f.on_close_calls), 2);
}

/* ---- configuration ---- */

static void noop_handler(void *user, struct http_request *req) {}

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
        cmocka_unit_test(test_size_limits),
        cmocka_unit_test(test_malformed_requests),
        cmocka_unit_test(test_slow_and_idle_clients),
        cmocka_unit_test(test_connection_cap),
        cmocka_unit_test(test_client_not_reading_is_cut),
        cmocka_unit_test(test_disconnect_mid_stream_closes_once),
        cmocka_unit_test(test_close_with_connections_open),
        cmocka_unit_test(test_bad_config_and_busy_port),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
