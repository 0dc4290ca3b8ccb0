/* The harness of the HTTP server's tests (test_http_server_harness.h says what it does). */
#include "tests/unit/test_http_server_harness.h"

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
    } else if (strcmp(path, "/big") == 0) {
        size_t n = (size_t)query_int(req, "n=", 0);
        char *body = malloc(n + 1);
        for (size_t i = 0; i < n; i++)
            body[i] = (char)('a' + i % 26);
        assert_int_equal(http_respond(req, 200, "text/plain", body, n, NULL, 0), 0);
        free(body);
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
    f->write_cuts = http_server_write_cuts(f->srv);
    f->evictions = http_server_evictions(f->srv);
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

void fx_config(struct fx *f)
{
    memset(f, 0, sizeof(*f));
    http_config_default(&f->cfg);
    f->cfg.port = 0;
    f->cfg.request_timeout_ms = 5000;
    f->cfg.idle_timeout_ms = 5000;
}

void fx_run(struct fx *f, void (*client)(struct fx *f))
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

void resp_free(struct resp *r)
{
    free(r->body);
    r->body = NULL;
}

int cl_connect_buf(struct cl *c, uint16_t port, int rcvbuf)
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

int cl_connect(struct cl *c, uint16_t port)
{
    return cl_connect_buf(c, port, 0);
}

void cl_close(struct cl *c)
{
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
}

int cl_send(struct cl *c, const char *s, size_t n)
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

int cl_sends(struct cl *c, const char *s)
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
int cl_line(struct cl *c, char *out, size_t cap)
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
const char *resp_header(const struct resp *r, const char *name, char *out, size_t cap)
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
int cl_response(struct cl *c, struct resp *r, bool head_only)
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
bool cl_closed(struct cl *c)
{
    return cl_fill(c) == 0;
}

void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    nanosleep(&ts, NULL);
}

bool wait_atomic(atomic_int *v, int at_least)
{
    for (int i = 0; i < WAIT_STEPS; i++) {
        if (atomic_load(v) >= at_least)
            return true;
        sleep_ms(WAIT_STEP_MS);
    }
    return false;
}

/* Both: with cors, the CORS headers are checked too. */
static void expect_error(struct fx *f, const char *request, int status, bool cors,
                         const char *origin, bool *ok)
{
    struct cl c;
    struct resp r;
    char v[128];
    *ok = false;
    CHECK(f, cl_connect(&c, f->port) == 0);
    CHECK(f, cl_sends(&c, request) == 0);
    CHECK(f, cl_response(&c, &r, false) == 0);
    bool allowed = resp_header(&r, "Access-Control-Allow-Origin", v, sizeof(v)) != NULL;
    bool right =
        r.status == status &&
        (!cors || (allowed == (origin != NULL) && (origin == NULL || strcmp(v, origin) == 0)));
    if (!right && f->failure[0] == '\0')
        snprintf(f->failure, sizeof(f->failure),
                 "status %d, Access-Control-Allow-Origin %s; not %d, %s; for %.60s", r.status,
                 allowed ? v : "none", status, origin != NULL ? origin : "none", request);
    CHECK(f, right);
    CHECK(f, !cors || (resp_header(&r, "Vary", v, sizeof(v)) && strcmp(v, "Origin") == 0));
    CHECK(f, resp_header(&r, "Connection", v, sizeof(v)) && strcmp(v, "close") == 0);
    CHECK(f, strstr(r.body, "\"error\"") != NULL);
    resp_free(&r);
    CHECK(f, cl_closed(&c));
    cl_close(&c);
    *ok = true;
}

void expect_error_and_close(struct fx *f, const char *request, int status, bool *ok)
{
    expect_error(f, request, status, false, NULL, ok);
}

void expect_cors_error_and_close(struct fx *f, const char *request, int status, const char *origin,
                                 bool *ok)
{
    expect_error(f, request, status, true, origin, ok);
}
