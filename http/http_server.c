/* The server's socket side: listening, accepting up to the connection cap, reading, the
 * per-connection timer, lingering close, and freeing everything after libuv's close callbacks.
 * The request accessors are here too (they only read what http_conn.c stored). */
#include "http/http_conn.h"

#include "common/error.h"
#include "common/list.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

PAGODA_LIST_DEFINE(conn_list, struct http_conn_list, struct http_conn)

/* The listen backlog. */
#define HTTP_BACKLOG 511

void http_config_default(struct http_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->host = "127.0.0.1";
    cfg->port = 8000;
    cfg->max_connections = 4096;
    cfg->max_header_bytes = 64 * 1024;
    cfg->max_body_bytes = 8 * 1024 * 1024;
    cfg->max_body_memory = 256 * 1024 * 1024;
    cfg->request_timeout_ms = 30000;
    cfg->idle_timeout_ms = 60000;
    cfg->max_queued_write_bytes = 8 * 1024 * 1024;
    cfg->max_write_memory = 256 * 1024 * 1024;
}

static int config_check(const struct http_config *cfg)
{
    if (!cfg->host || strlen(cfg->host) >= sizeof(((struct http_server *)0)->host))
        return pagoda_error_set(PAGODA_EINVAL, "http: host missing or too long");
    if (cfg->max_connections == 0 || cfg->max_header_bytes < 64 || cfg->max_body_bytes == 0 ||
        cfg->max_body_memory < cfg->max_body_bytes || cfg->request_timeout_ms == 0 ||
        cfg->idle_timeout_ms == 0 || cfg->max_queued_write_bytes == 0 || cfg->max_write_memory == 0)
        return pagoda_error_set(PAGODA_EINVAL, "http: every limit must be set (headers >= 64, "
                                               "body memory at least the body limit)");
    for (const char *o = cfg->allowed_origins; o != NULL && *o != '\0'; o++)
        if (*o <= ' ' || *o > '~')
            return pagoda_error_set(PAGODA_EINVAL,
                                    "http: allowed origins must be printable ASCII without blanks "
                                    "(origins separated by commas)");
    /* Header offsets are 32 bits. */
    if (cfg->max_header_bytes > UINT32_MAX / 2 || cfg->max_body_bytes > SIZE_MAX / 2)
        return pagoda_error_set(PAGODA_EINVAL, "http: limits too large");
    return 0;
}

static int server_new(const struct http_config *cfg, http_handler_fn handler, void *user,
                      struct http_server **out)
{
    if (!cfg || !handler || !out)
        return PAGODA_EINVAL;
    int rc = config_check(cfg);
    if (rc < 0)
        return rc;
    struct http_server *s = calloc(1, sizeof(*s));
    if (!s)
        return PAGODA_ENOMEM;
    s->cfg = *cfg;
    strcpy(s->host, cfg->host);
    s->cfg.host = s->host;
    s->handler = handler;
    s->user = user;
    http_conn_settings_init(&s->settings);
    *out = s;
    return 0;
}

/* Frees the server once nothing of it is open. */
static void server_maybe_free(struct http_server *s)
{
    if (s->closing && !s->listener_open && s->conns.count == 0)
        free(s);
}

/* ---- a connection ---- */

static void conn_init(struct http_server *s, struct http_conn *c)
{
    c->server = s;
    c->state = CONN_IDLE;
    llhttp_init(&c->parser, HTTP_REQUEST, &s->settings);
    c->parser.data = c;
    conn_list_push_back(&s->conns, c);
}

static void conn_free(struct http_conn *c)
{
    struct http_server *s = c->server;
    struct http_request *req = c->req;
    /* The request's last moment: the handler had it and no response ended. */
    if (req && (req->state == REQ_HANDLER || req->state == REQ_STREAMING) && req->on_close)
        req->on_close(req->on_close_arg);
    http_request_free(req);
    free(c->pending);
    conn_list_remove(&s->conns, c);
    free(c);
    server_maybe_free(s);
}

static void on_conn_handle_closed(uv_handle_t *h)
{
    struct http_conn *c = h->data;
    if (--c->handles_open == 0)
        conn_free(c);
}

void http_conn_close(struct http_conn *c)
{
    if (c->closing)
        return;
    c->closing = true;
    /* Its writes in flight are cancelled by the close: no longer the server's to count. */
    c->server->write_bytes -= c->write_bytes;
    if (!c->server->loop)
        return; /* detached: http_server_reap frees it */
    uv_close((uv_handle_t *)&c->tcp, on_conn_handle_closed);
    uv_close((uv_handle_t *)&c->timer, on_conn_handle_closed);
}

static void on_timer(uv_timer_t *t)
{
    http_conn_timeout(t->data);
}

void http_conn_timeout(struct http_conn *c)
{
    if (c->closing)
        return;
    if (c->state == CONN_READING)
        http_conn_fail(c, 408); /* a request begun and not finished in time */
    else if (c->state != CONN_HANDLING)
        http_conn_close(c); /* idle, not reading our answer, or lingering */
}

void http_conn_arm_timer(struct http_conn *c)
{
    if (!c->server->loop || c->closing)
        return;
    const struct http_config *cfg = &c->server->cfg;
    uint64_t ms = 0;
    switch (c->state) {
    case CONN_IDLE:
    case CONN_DRAINING:
        ms = cfg->idle_timeout_ms;
        break;
    case CONN_READING:
        ms = cfg->request_timeout_ms;
        break;
    case CONN_LINGER:
        ms = HTTP_LINGER_MS;
        break;
    case CONN_HANDLING:
        break;
    }
    if (ms)
        uv_timer_start(&c->timer, on_timer, ms, 0);
    else
        uv_timer_stop(&c->timer);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    /* One buffer per read, freed in on_read: bounded by HTTP_READ_BYTES at a time. */
    buf->base = malloc(HTTP_READ_BYTES);
    buf->len = buf->base ? HTTP_READ_BYTES : 0;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct http_conn *c = stream->data;
    if (nread > 0) {
        c->read_ms = uv_now(c->server->loop);
        http_conn_feed(c, buf->base, (size_t)nread);
    } else if (nread < 0)
        http_conn_close(c); /* EOF or an error: the client is gone */
    free(buf->base);
}

void http_conn_read(struct http_conn *c, bool on)
{
    if (!c->server->loop || c->closing || c->reading == on)
        return;
    if (on && uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) < 0) {
        http_conn_close(c);
        return;
    }
    if (!on)
        uv_read_stop((uv_stream_t *)&c->tcp);
    c->reading = on;
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct http_conn *c = req->data;
    if (status < 0)
        http_conn_close(c);
}

/* The last response is written: FIN, then read and drop until the client's EOF (on_read
 * closes) or HTTP_LINGER_MS. */
void http_conn_linger(struct http_conn *c)
{
    if (c->closing)
        return;
    if (!c->server->loop) {
        http_conn_close(c);
        return;
    }
    c->state = CONN_LINGER;
    c->shutdown.data = c;
    if (uv_shutdown(&c->shutdown, (uv_stream_t *)&c->tcp, on_shutdown) < 0) {
        http_conn_close(c);
        return;
    }
    http_conn_arm_timer(c);
    http_conn_read(c, true);
}

/* ---- accepting ---- */

static void on_refused_closed(uv_handle_t *h)
{
    free(h);
}

/* Over the cap: a 503 if the socket takes it at once, and the connection closes. No byte of the
 * request is read, so its Origin is not known: the answer has no Access-Control-Allow-Origin (a
 * page sees a network error), only the Vary: Origin of a list of origins. */
static void refuse(uv_stream_t *listener)
{
    const struct http_server *s = listener->data;
    uv_tcp_t *t = malloc(sizeof(*t));
    if (!t)
        return; /* out of memory: libuv holds the connection until the next accept */
    if (uv_tcp_init(listener->loop, t) < 0) {
        free(t);
        return;
    }
    if (uv_accept(listener, (uv_stream_t *)t) == 0) {
        char buf[HTTP_ERROR_RESPONSE_BYTES];
        bool vary;
        const char *origin = http_cors_origin(&s->cfg, NULL, &vary);
        size_t n = http_error_response(buf, sizeof(buf), 503, "too many connections", origin, vary);
        uv_buf_t b = uv_buf_init(buf, (unsigned)n);
        (void)uv_try_write((uv_stream_t *)t, &b, 1);
    }
    uv_close((uv_handle_t *)t, on_refused_closed);
}

/* At max_connections: closes the connection that least deserves its place, so that a new one is
 * taken instead of refused. Clients that open connections and hold them without completing a
 * request (slowloris: a header line every few seconds, within request_timeout_ms) would otherwise
 * keep every other client out for as long as they like, with no key needed. The place given is
 * that of a connection lingering after its last answer, else of the one whose last bytes came
 * longest ago (so that a trickle loses to a client sending now, a fresh connection included)
 * among those idle between keep-alive requests with nothing left to send or parse, and those
 * whose request has not all arrived. A connection whose request is with the handler (a
 * generation, a stream), or whose answer is still going out, is never closed here. Connections
 * already closing count until libuv has closed them, so as many of those as there are keep the
 * cap: true when a place is (being) made. */
static bool make_room(struct http_server *s)
{
    struct http_conn *linger = NULL, *quiet = NULL;
    unsigned closing = 0;
    for (struct http_conn *c = s->conns.head; c != NULL; c = c->next) {
        if (c->closing) {
            closing++;
        } else if (c->state == CONN_LINGER) {
            if (linger == NULL)
                linger = c;
        } else if ((c->state == CONN_IDLE && c->writes_in_flight == 0 && c->pending_len == 0) ||
                   c->state == CONN_READING) {
            if (quiet == NULL || c->read_ms < quiet->read_ms)
                quiet = c;
        }
    }
    if (s->conns.count - closing < s->cfg.max_connections)
        return true; /* the places of those closing are being made */
    struct http_conn *victim = linger != NULL ? linger : quiet;
    if (victim == NULL)
        return false;
    s->evictions++;
    http_conn_close(victim);
    return true;
}

static void on_connection(uv_stream_t *listener, int status)
{
    struct http_server *s = listener->data;
    if (status < 0 || s->closing)
        return;
    if (s->conns.count >= s->cfg.max_connections && !make_room(s)) {
        refuse(listener);
        return;
    }
    struct http_conn *c = calloc(1, sizeof(*c));
    if (!c) {
        refuse(listener);
        return;
    }
    if (uv_tcp_init(s->loop, &c->tcp) < 0) {
        free(c);
        return;
    }
    uv_timer_init(s->loop, &c->timer); /* cannot fail */
    c->tcp.data = c;
    c->timer.data = c;
    c->handles_open = 2;
    c->read_ms = uv_now(s->loop);
    conn_init(s, c);
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) < 0) {
        http_conn_close(c);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1); /* streamed tokens go out as they come */
    http_conn_arm_timer(c);
    http_conn_read(c, true);
}

int http_server_open(uv_loop_t *loop, const struct http_config *cfg, http_handler_fn handler,
                     void *user, struct http_server **out)
{
    if (!loop)
        return PAGODA_EINVAL;
    struct http_server *s;
    int rc = server_new(cfg, handler, user, &s);
    if (rc < 0)
        return rc;
    s->loop = loop;
    struct sockaddr_storage addr;
    if (strchr(s->host, ':'))
        rc = uv_ip6_addr(s->host, cfg->port, (struct sockaddr_in6 *)&addr);
    else
        rc = uv_ip4_addr(s->host, cfg->port, (struct sockaddr_in *)&addr);
    if (rc < 0) {
        free(s);
        return pagoda_error_set(PAGODA_EINVAL, "http: host %s is not an IP address", cfg->host);
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->listener_open = true;
    rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&addr, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, HTTP_BACKLOG, on_connection);
    if (rc < 0) {
        pagoda_error_set(PAGODA_EIO, "http: cannot listen on %s:%u: %s", cfg->host,
                         (unsigned)cfg->port, uv_strerror(rc));
        http_server_close(s);
        return PAGODA_EIO;
    }
    *out = s;
    return 0;
}

uint16_t http_server_port(const struct http_server *s)
{
    struct sockaddr_storage addr;
    int len = sizeof(addr);
    if (!s->loop || uv_tcp_getsockname(&s->listener, (struct sockaddr *)&addr, &len) < 0)
        return 0;
    if (addr.ss_family == AF_INET6)
        return ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
    return ntohs(((struct sockaddr_in *)&addr)->sin_port);
}

uint32_t http_server_connections(const struct http_server *s)
{
    return s->conns.count;
}

size_t http_server_write_bytes(const struct http_server *s)
{
    return s->write_bytes;
}

uint64_t http_server_evictions(const struct http_server *s)
{
    return s->evictions;
}

uint64_t http_server_write_cuts(const struct http_server *s)
{
    return s->write_cuts;
}

static void on_listener_closed(uv_handle_t *h)
{
    struct http_server *s = h->data;
    s->listener_open = false;
    server_maybe_free(s);
}

void http_server_close(struct http_server *s)
{
    if (!s || s->closing)
        return;
    s->closing = true;
    for (struct http_conn *c = s->conns.head; c; c = c->next)
        http_conn_close(c);
    if (!s->loop) {
        if (s->conns.count == 0)
            free(s);
        else
            http_server_reap(s); /* frees s with its last connection */
        return;
    }
    uv_close((uv_handle_t *)&s->listener, on_listener_closed);
}

/* ---- detached (the fuzzer) ---- */

int http_server_open_detached(const struct http_config *cfg, http_handler_fn handler, void *user,
                              void (*sink)(void *arg, const char *data, size_t len), void *sink_arg,
                              struct http_server **out)
{
    if (!sink)
        return PAGODA_EINVAL;
    struct http_server *s;
    int rc = server_new(cfg, handler, user, &s);
    if (rc < 0)
        return rc;
    s->sink = sink;
    s->sink_arg = sink_arg;
    *out = s;
    return 0;
}

int http_conn_open_detached(struct http_server *s, struct http_conn **out)
{
    if (s->loop || s->closing)
        return PAGODA_EINVAL;
    struct http_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return PAGODA_ENOMEM;
    conn_init(s, c);
    *out = c;
    return 0;
}

void http_server_reap(struct http_server *s)
{
    struct http_conn *c = s->conns.head;
    while (c) {
        struct http_conn *next = c->next;
        if (c->closing)
            conn_free(c); /* may free s when it is closing and c was the last */
        c = next;
    }
}

/* ---- the request ---- */

const char *http_request_method(const struct http_request *req)
{
    return req->method;
}

const char *http_request_path(const struct http_request *req)
{
    return req->path;
}

const char *http_request_query(const struct http_request *req)
{
    return req->query;
}

const char *http_request_header(const struct http_request *req, const char *name)
{
    for (size_t i = 0; i < req->num_complete_headers; i++) {
        const struct http_header_ref *h = &req->headers[i];
        if (strcasecmp(req->head + h->name, name) == 0)
            return req->head + h->value;
    }
    return NULL;
}

const char *http_request_body(const struct http_request *req, size_t *len)
{
    if (len)
        *len = req->body_len;
    return req->body ? req->body : "";
}

char *http_request_take_body(struct http_request *req, size_t *len)
{
    char *body = req->body != NULL ? req->body : strdup("");
    if (body == NULL)
        return NULL;
    if (len)
        *len = req->body_len;
    if (req->conn != NULL)
        req->conn->server->body_bytes -= req->body_len;
    req->body = NULL;
    req->body_len = req->body_cap = 0;
    return body;
}

void http_request_on_close(struct http_request *req, void (*fn)(void *arg), void *arg)
{
    req->on_close = fn;
    req->on_close_arg = arg;
}

void http_request_abort(struct http_request *req)
{
    http_conn_close(req->conn);
}
