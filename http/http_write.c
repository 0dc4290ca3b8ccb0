/* A connection's writing side: responses whole or in chunks, the error answers of the server
 * itself, and the limit on bytes queued for a client that does not read. */
#include "http/http_conn.h"

#include "common/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* One write: the libuv request and the bytes it carries, freed by its callback. */
struct http_write {
    uv_write_t uv;
    struct http_conn *conn;
    size_t len, cap;
    char data[];
};

static struct http_write *wbuf_new(size_t cap)
{
    struct http_write *w = malloc(sizeof(*w) + cap);
    if (!w)
        return NULL;
    w->len = 0;
    w->cap = cap;
    return w;
}

static void wbuf_put(struct http_write *w, const void *data, size_t len)
{
    /* Every caller sized w for what it puts. */
    memcpy(w->data + w->len, data, len);
    w->len += len;
}

static void wbuf_printf(struct http_write *w, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void wbuf_printf(struct http_write *w, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(w->data + w->len, w->cap - w->len, fmt, ap);
    va_end(ap);
    if (n > 0)
        w->len += (size_t)n < w->cap - w->len ? (size_t)n : w->cap - w->len - 1;
}

static void on_write(uv_write_t *uv, int status)
{
    struct http_write *w = (struct http_write *)uv;
    struct http_conn *c = w->conn;
    c->write_bytes -= w->len;
    if (!c->closing) {
        c->server->write_bytes -= w->len; /* a closing one's were taken off at its close */
        c->progress_ms = uv_now(c->server->loop);
    }
    free(w);
    c->writes_in_flight--;
    if (status < 0)
        http_conn_close(c); /* the client is gone (or the close cancelled the write) */
    else if (c->writes_in_flight == 0)
        http_conn_writes_done(c);
}

/* Stalled longest first; of two stalled as long, the one holding more. */
static int cmp_stalled(const void *a, const void *b)
{
    const struct http_conn *x = *(struct http_conn *const *)a, *y = *(struct http_conn *const *)b;
    if (x->progress_ms != y->progress_ms)
        return x->progress_ms < y->progress_ms ? -1 : 1;
    return x->write_bytes > y->write_bytes ? -1 : x->write_bytes < y->write_bytes;
}

/* Makes room for len more bytes of responses under max_write_memory, when cutting can: the
 * connections with bytes unsent are cut, the one whose client has taken no whole write for
 * longest first (a fresh large answer is not cut for older stalled ones), until the total fits.
 * Connections whose writes have all reached the kernel hold theirs until their callbacks (the next
 * loop turn) only, and are left alone; when even cutting every other one would not make room (the
 * write itself is larger than the budget, say), none is cut and the write goes out. One pass over
 * the connections and a sort, however many are cut. */
static void make_room(struct http_server *s, size_t len)
{
    if (s->write_bytes + len <= s->cfg.max_write_memory)
        return;
    size_t cuttable = 0, n = 0;
    for (struct http_conn *k = s->conns.head; k; k = k->next) {
        if (k->closing || k->tcp.write_queue_size == 0)
            continue;
        cuttable += k->write_bytes;
        n++;
    }
    if (n == 0 || s->write_bytes - cuttable + len > s->cfg.max_write_memory)
        return;
    struct http_conn **cand = malloc(n * sizeof(*cand));
    if (cand == NULL)
        return; /* no memory to choose with: the write goes out */
    size_t i = 0;
    for (struct http_conn *k = s->conns.head; k && i < n; k = k->next)
        if (!k->closing && k->tcp.write_queue_size > 0)
            cand[i++] = k;
    qsort(cand, i, sizeof(*cand), cmp_stalled);
    for (size_t j = 0; j < i && s->write_bytes + len > s->cfg.max_write_memory; j++) {
        s->write_cuts++;
        http_conn_close(cand[j]); /* takes its bytes off s->write_bytes */
    }
    free(cand);
}

/* Sends w and takes it, whatever happens. */
static int wbuf_send(struct http_conn *c, struct http_write *w)
{
    if (c->closing) {
        free(w);
        return PAGODA_ECLOSED;
    }
    struct http_server *s = c->server;
    if (!s->loop) {
        s->sink(s->sink_arg, w->data, w->len);
        free(w);
        return 0;
    }
    make_room(s, w->len);
    if (c->closing) { /* it was cut */
        free(w);
        return PAGODA_ECLOSED;
    }
    w->conn = c;
    uv_buf_t buf = uv_buf_init(w->data, (unsigned)w->len);
    if (uv_write(&w->uv, (uv_stream_t *)&c->tcp, &buf, 1, on_write) < 0) {
        free(w);
        http_conn_close(c);
        return PAGODA_ECLOSED;
    }
    if (c->writes_in_flight == 0)
        c->progress_ms = uv_now(s->loop); /* a backlog begins (if the kernel leaves one) */
    c->writes_in_flight++;
    c->write_bytes += w->len;
    s->write_bytes += w->len;
    return 0;
}

int http_conn_send(struct http_conn *c, const char *data, size_t len)
{
    struct http_write *w = wbuf_new(len);
    if (!w)
        return PAGODA_ENOMEM;
    wbuf_put(w, data, len);
    return wbuf_send(c, w);
}

const char *http_status_reason(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 304:
        return "Not Modified";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 413:
        return "Content Too Large";
    case 415:
        return "Unsupported Media Type";
    case 422:
        return "Unprocessable Content";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    default:
        return "Unknown";
    }
}

/* The server's own error answers: OpenAI's error shape, so that the front's clients read them
 * like the front's own. No byte of the request is echoed. */
static const char *error_message(int status)
{
    switch (status) {
    case 400:
        return "malformed HTTP request";
    case 408:
        return "request not received in time";
    case 413:
        return "request body too large";
    case 431:
        return "request headers too large";
    case 503:
        return "server over capacity";
    default:
        return "request failed";
    }
}

size_t http_error_response(char *buf, size_t cap, int status, const char *detail,
                           const char *origin, bool vary)
{
    char body[192];
    int blen =
        snprintf(body, sizeof(body),
                 "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":null,\"code\":null}}\n",
                 detail ? detail : error_message(status),
                 status >= 500 ? "server_error" : "invalid_request_error");
    int n = snprintf(
        buf, cap,
        "HTTP/1.1 %d %s\r\n%s%s%s%sContent-Type: application/json\r\n"
        "Content-Length: %d\r\n%sConnection: close\r\n\r\n%s",
        status, http_status_reason(status), origin != NULL ? "Access-Control-Allow-Origin: " : "",
        origin != NULL ? origin : "", origin != NULL ? "\r\n" : "", vary ? "Vary: Origin\r\n" : "",
        blen, status == 503 ? "Retry-After: 1\r\n" : "", body);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

void http_conn_fail(struct http_conn *c, int status)
{
    if (c->closing)
        return;
    if (c->state != CONN_IDLE && c->state != CONN_READING) {
        http_conn_close(c); /* a response may be under way: no second one */
        return;
    }
    /* The request's headers that have arrived whole may hold its Origin (http_request_header
     * reads no other): 413, 503 and a 408 or 400 in the body know it, a 431 or a 408 or 400 in
     * the head only when it came before. */
    bool vary;
    const char *origin = http_cors_origin(&c->server->cfg, c->req, &vary);
    const size_t cap = HTTP_ERROR_RESPONSE_BYTES + (origin != NULL ? strlen(origin) : 0);
    char *buf = malloc(cap);
    size_t n =
        buf != NULL ? http_error_response(buf, cap, status, c->error_detail, origin, vary) : 0;
    c->keep_alive = false;
    int rc = n > 0 ? http_conn_send(c, buf, n) : PAGODA_ENOMEM;
    free(buf);
    if (rc < 0) {
        http_conn_close(c);
        return;
    }
    http_conn_response_done(c); /* frees the partial request, drains, closes */
}

/* ---- the handler's side ---- */

static bool line_ok(const char *s, bool need_colon)
{
    if (!s)
        return false;
    if (strpbrk(s, "\r\n"))
        return false;
    return !need_colon || strchr(s, ':') != NULL;
}

/* Checks the request's state and the handler's strings; PAGODA_ECLOSED when the connection is
 * gone (the close callback is on its way). */
static int check_answer(struct http_request *req, enum http_req_state want, int status,
                        const char *content_type, const char *const *headers, size_t num_headers)
{
    if (!req || req->state != want)
        return PAGODA_EINVAL;
    if (req->conn->closing)
        return PAGODA_ECLOSED;
    if (status < 200 || status > 999)
        return pagoda_error_set(PAGODA_EINVAL, "http: status %d", status);
    if (content_type && !line_ok(content_type, false))
        return pagoda_error_set(PAGODA_EINVAL, "http: Content-Type with a line break");
    if (num_headers > 0 && !headers)
        return PAGODA_EINVAL;
    for (size_t i = 0; i < num_headers; i++)
        if (!line_ok(headers[i], true))
            return pagoda_error_set(PAGODA_EINVAL, "http: header %zu is not one \"Name: value\"",
                                    i);
    return 0;
}

bool http_origin_allowed(const char *list, const char *origin)
{
    if (list == NULL || *list == '\0' || origin == NULL)
        return false;
    if (strcmp(list, "*") == 0)
        return true;
    const size_t n = strlen(origin);
    for (const char *p = list;;) {
        const char *comma = strchr(p, ',');
        const size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (len == n && strncasecmp(p, origin, n) == 0)
            return true;
        if (comma == NULL)
            return false;
        p = comma + 1;
    }
}

/* Every answer to an Origin of a list says Vary: Origin, so that a shared cache keeps one per
 * origin. */
const char *http_cors_origin(const struct http_config *cfg, const struct http_request *req,
                             bool *vary)
{
    const char *list = cfg->allowed_origins;
    *vary = list != NULL && *list != '\0' && strcmp(list, "*") != 0;
    const char *origin =
        list != NULL && *list != '\0' && req != NULL ? http_request_header(req, "Origin") : NULL;
    if (origin == NULL)
        return NULL;
    if (!*vary)
        return "*";
    return http_origin_allowed(list, origin) ? origin : NULL;
}

static const char *cors_origin(const struct http_request *req, bool *vary)
{
    return http_cors_origin(&req->conn->server->cfg, req, vary);
}

/* The status line and headers: their size, then their bytes into w. */
static size_t head_size(const struct http_request *req, int status, const char *content_type,
                        const char *const *headers, size_t num_headers)
{
    size_t n = 128 + strlen(http_status_reason(status)); /* fixed lines and numbers */
    bool vary;
    const char *origin = cors_origin(req, &vary);
    if (origin != NULL || vary)
        n += (origin != NULL ? strlen(origin) : 0) + 64;
    if (content_type)
        n += strlen(content_type) + 16;
    for (size_t i = 0; i < num_headers; i++)
        n += strlen(headers[i]) + 2;
    return n;
}

static void head_write(struct http_write *w, const struct http_request *req, int status,
                       const char *content_type, const char *const *headers, size_t num_headers)
{
    const struct http_conn *c = req->conn;
    wbuf_printf(w, "HTTP/1.1 %d %s\r\n", status, http_status_reason(status));
    bool vary;
    const char *origin = cors_origin(req, &vary);
    if (origin != NULL)
        wbuf_printf(w, "Access-Control-Allow-Origin: %s\r\n", origin);
    if (vary)
        wbuf_printf(w, "Vary: Origin\r\n");
    if (content_type)
        wbuf_printf(w, "Content-Type: %s\r\n", content_type);
    if (!c->keep_alive)
        wbuf_printf(w, "Connection: close\r\n");
    else if (c->http10)
        wbuf_printf(w, "Connection: keep-alive\r\n");
    for (size_t i = 0; i < num_headers; i++)
        wbuf_printf(w, "%s\r\n", headers[i]);
}

int http_respond(struct http_request *req, int status, const char *content_type, const void *body,
                 size_t len, const char *const *headers, size_t num_headers)
{
    int rc = check_answer(req, REQ_HANDLER, status, content_type, headers, num_headers);
    if (rc < 0)
        return rc;
    if (len > 0 && !body)
        return PAGODA_EINVAL;
    struct http_conn *c = req->conn;
    bool has_body = status != 204 && status != 304;
    bool send_body = has_body && !req->head_only;
    size_t size = head_size(req, status, content_type, headers, num_headers) + 48;
    if (send_body)
        size += len;
    struct http_write *w = wbuf_new(size);
    if (!w)
        return PAGODA_ENOMEM;
    head_write(w, req, status, content_type, headers, num_headers);
    if (has_body)
        wbuf_printf(w, "Content-Length: %zu\r\n", len);
    wbuf_put(w, "\r\n", 2);
    if (send_body && len > 0)
        wbuf_put(w, body, len);
    req->state = REQ_ENDED;
    rc = wbuf_send(c, w);
    if (rc < 0) {
        req->state = REQ_HANDLER; /* the close callback still comes */
        return rc;
    }
    http_conn_response_done(c);
    return 0;
}

int http_stream_start(struct http_request *req, int status, const char *content_type,
                      const char *const *headers, size_t num_headers)
{
    int rc = check_answer(req, REQ_HANDLER, status, content_type, headers, num_headers);
    if (rc < 0)
        return rc;
    struct http_conn *c = req->conn;
    if (!req->chunked_response)
        c->keep_alive = false; /* HTTP/1.0: the body ends with the connection */
    struct http_write *w =
        wbuf_new(head_size(req, status, content_type, headers, num_headers) + 48);
    if (!w)
        return PAGODA_ENOMEM;
    head_write(w, req, status, content_type, headers, num_headers);
    if (req->chunked_response)
        wbuf_printf(w, "Transfer-Encoding: chunked\r\n");
    wbuf_put(w, "\r\n", 2);
    rc = wbuf_send(c, w);
    if (rc < 0)
        return rc;
    req->state = REQ_STREAMING;
    return 0;
}

int http_stream_write(struct http_request *req, const void *data, size_t len)
{
    if (!req || req->state != REQ_STREAMING || (len > 0 && !data))
        return PAGODA_EINVAL;
    struct http_conn *c = req->conn;
    if (c->closing)
        return PAGODA_ECLOSED;
    if (len == 0 || req->head_only)
        return 0; /* an empty chunk would end the stream */
    /* A client that lets bytes pile up is cut; one write alone is always taken, whatever its
     * size, when nothing waits before it. */
    size_t queued = c->server->loop ? c->tcp.write_queue_size : 0;
    if (queued > 0 && queued + len > c->server->cfg.max_queued_write_bytes) {
        http_conn_close(c);
        return PAGODA_ECLOSED;
    }
    struct http_write *w = wbuf_new(len + 32);
    if (!w)
        return PAGODA_ENOMEM;
    if (req->chunked_response)
        wbuf_printf(w, "%zx\r\n", len);
    wbuf_put(w, data, len);
    if (req->chunked_response)
        wbuf_put(w, "\r\n", 2);
    return wbuf_send(c, w);
}

int http_stream_end(struct http_request *req)
{
    if (!req || req->state != REQ_STREAMING)
        return PAGODA_EINVAL;
    struct http_conn *c = req->conn;
    if (c->closing)
        return PAGODA_ECLOSED;
    if (req->chunked_response && !req->head_only) {
        static const char last[] = "0\r\n\r\n";
        int rc = http_conn_send(c, last, sizeof(last) - 1);
        if (rc == PAGODA_ENOMEM)
            return rc;
        if (rc < 0)
            return rc; /* closed: the close callback still comes */
    }
    req->state = REQ_ENDED;
    http_conn_response_done(c);
    return 0;
}
