/* A connection's reading side: bytes through llhttp into a request, its limits (header bytes,
 * body bytes), the hand-off to the handler, and what happens once the response has ended
 * (keep-alive or close). The socket, the timers and closing are http_server.c's. */
#include "http/http_conn.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* The message of a body refused for the bodies held at once (http_config.max_body_memory). */
static const char kBodyBudget[] = "the request bodies the server holds at once leave no room for "
                                  "this one: try again";

static struct http_conn *conn_of(llhttp_t *p)
{
    return (struct http_conn *)p->data;
}

/* ---- the request being read ---- */

void http_request_free(struct http_request *req)
{
    if (!req)
        return;
    if (req->conn != NULL)
        req->conn->server->body_bytes -= req->body_len;
    free(req->head);
    free(req->headers);
    free(req->body);
    free(req);
}

/* Appends to the head buffer, at most max_header_bytes in all (431 beyond). */
static int head_append(struct http_conn *c, const char *at, size_t n)
{
    struct http_request *req = c->req;
    size_t max = c->server->cfg.max_header_bytes;
    if (n > max || req->head_len + n + 1 > max + 1) {
        c->error_status = 431;
        return -1;
    }
    if (req->head_len + n + 1 > req->head_cap) {
        size_t cap = req->head_cap ? req->head_cap : 256;
        while (cap < req->head_len + n + 1)
            cap *= 2;
        if (cap > max + 1)
            cap = max + 1;
        char *head = realloc(req->head, cap);
        if (!head) {
            c->error_status = 503;
            return -1;
        }
        req->head = head;
        req->head_cap = cap;
    }
    memcpy(req->head + req->head_len, at, n);
    req->head_len += n;
    req->head[req->head_len] = '\0';
    return 0;
}

/* Ends the string being appended (a NUL that counts against the header bytes). */
static int head_terminate(struct http_conn *c)
{
    if (head_append(c, "", 0) < 0)
        return -1;
    c->req->head_len++; /* keeps the NUL head_append wrote */
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    struct http_conn *c = conn_of(p);
    if (!c->req) {
        c->req = calloc(1, sizeof(*c->req));
        if (!c->req) {
            c->error_status = 503;
            return -1;
        }
        c->req->conn = c;
    }
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t n)
{
    return head_append(conn_of(p), at, n);
}

static int on_url_complete(llhttp_t *p)
{
    return head_terminate(conn_of(p));
}

static int on_header_field(llhttp_t *p, const char *at, size_t n)
{
    struct http_conn *c = conn_of(p);
    struct http_request *req = c->req;
    if (req->in_value || req->num_headers == 0 ||
        req->headers[req->num_headers - 1].value != UINT32_MAX) {
        /* A new header. Each takes at least "x:\r\n" of the header bytes, so the array is
         * bounded by them too. */
        if (req->num_headers == req->cap_headers) {
            size_t cap = req->cap_headers ? 2 * req->cap_headers : 16;
            struct http_header_ref *h = realloc(req->headers, cap * sizeof(*h));
            if (!h) {
                c->error_status = 503;
                return -1;
            }
            req->headers = h;
            req->cap_headers = cap;
        }
        req->headers[req->num_headers].name = (uint32_t)req->head_len;
        req->headers[req->num_headers].value = UINT32_MAX;
        req->num_headers++;
        req->in_value = false;
    }
    return head_append(c, at, n);
}

static int on_header_field_complete(llhttp_t *p)
{
    return head_terminate(conn_of(p));
}

static int on_header_value(llhttp_t *p, const char *at, size_t n)
{
    struct http_conn *c = conn_of(p);
    struct http_request *req = c->req;
    struct http_header_ref *h = &req->headers[req->num_headers - 1];
    if (h->value == UINT32_MAX)
        h->value = (uint32_t)req->head_len;
    req->in_value = true;
    return head_append(c, at, n);
}

static int on_header_value_complete(llhttp_t *p)
{
    struct http_conn *c = conn_of(p);
    struct http_request *req = c->req;
    struct http_header_ref *h = &req->headers[req->num_headers - 1];
    if (h->value == UINT32_MAX) /* an empty value: no on_header_value */
        h->value = (uint32_t)req->head_len;
    /* llhttp skips the blanks before a value but keeps those after it (RFC 9110: not part of
     * the value). */
    while (req->head_len > h->value &&
           (req->head[req->head_len - 1] == ' ' || req->head[req->head_len - 1] == '\t'))
        req->head_len--;
    req->in_value = true;
    if (head_terminate(c) < 0)
        return -1;
    req->num_complete_headers = req->num_headers;
    return 0;
}

/* A declared length (Content-Length, or a chunk's size) of bytes still to come: refused (-1, with
 * the status set) when it would take the body past its limit (413) or the bodies held at once
 * past theirs (503), before any of it is read (and before a 100 Continue invites it). */
static int refuse_declared(struct http_conn *c, uint64_t declared)
{
    const struct http_server *s = c->server;
    if (declared > s->cfg.max_body_bytes - c->req->body_len) {
        c->error_status = 413;
        return -1;
    }
    if (s->body_bytes + declared > s->cfg.max_body_memory) {
        c->error_status = 503;
        c->error_detail = kBodyBudget;
        return -1;
    }
    return 0;
}

/* Refuses a body over the limit before it is read; answers Expect: 100-continue. Pauses the
 * parser, so that conn_parse learns where the headers ended. */
static int on_headers_complete(llhttp_t *p)
{
    struct http_conn *c = conn_of(p);
    struct http_request *req = c->req;
    if (llhttp_get_method(p) == HTTP_CONNECT) {
        c->error_status = 400; /* no tunnels */
        return -1;
    }
    if (!(p->flags & F_CHUNKED) && refuse_declared(c, p->content_length) != 0)
        return -1;
    /* No protocol switches: an Upgrade request is answered as plain HTTP (llhttp reads the flag
     * after this callback), and the connection goes on. */
    p->upgrade = 0;
    c->http10 = llhttp_get_http_major(p) == 1 && llhttp_get_http_minor(p) == 0;
    req->method = llhttp_method_name((llhttp_method_t)llhttp_get_method(p));
    req->head_only = llhttp_get_method(p) == HTTP_HEAD;
    const char *expect = http_request_header(req, "Expect");
    if (expect && !c->http10 && strcasecmp(expect, "100-continue") == 0) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        if (http_conn_send(c, cont, sizeof(cont) - 1) < 0)
            return -1;
    }
    return HPE_PAUSED;
}

static int on_body(llhttp_t *p, const char *at, size_t n)
{
    struct http_conn *c = conn_of(p);
    struct http_request *req = c->req;
    size_t max = c->server->cfg.max_body_bytes;
    if (n > max || req->body_len + n > max) {
        c->error_status = 413;
        return -1;
    }
    /* Every connection's bodies together, in bytes received (a declared length reserves none of
     * it: its allocation is touched only as bytes arrive): past the budget, this one is refused. */
    struct http_server *s = c->server;
    if (s->body_bytes + n > s->cfg.max_body_memory) {
        c->error_status = 503;
        c->error_detail = kBodyBudget;
        return -1;
    }
    if (req->body_len + n + 1 > req->body_cap) {
        size_t cap = req->body_cap ? req->body_cap : 1024;
        /* A Content-Length body is read into one allocation of its size (llhttp's content_length
         * is what is left after these n bytes). */
        if (!(p->flags & F_CHUNKED) && req->body_len + n + p->content_length + 1 > cap)
            cap = req->body_len + n + (size_t)p->content_length + 1;
        while (cap < req->body_len + n + 1)
            cap *= 2;
        if (cap > max + 1)
            cap = max + 1;
        char *body = realloc(req->body, cap);
        if (!body) {
            c->error_status = 503;
            return -1;
        }
        req->body = body;
        req->body_cap = cap;
    }
    s->body_bytes += n;
    memcpy(req->body + req->body_len, at, n);
    req->body_len += n;
    req->body[req->body_len] = '\0';
    return 0;
}

/* A chunk's size is known (llhttp's content_length): refused now as a declared Content-Length
 * is, rather than once its bytes have come (or, never coming, at the request's timeout). */
static int on_chunk_header(llhttp_t *p)
{
    return refuse_declared(conn_of(p), p->content_length);
}

static int on_message_complete(llhttp_t *p)
{
    return HPE_PAUSED;
}

void http_conn_settings_init(llhttp_settings_t *s)
{
    llhttp_settings_init(s);
    s->on_message_begin = on_message_begin;
    s->on_url = on_url;
    s->on_url_complete = on_url_complete;
    s->on_header_field = on_header_field;
    s->on_header_field_complete = on_header_field_complete;
    s->on_header_value = on_header_value;
    s->on_header_value_complete = on_header_value_complete;
    s->on_headers_complete = on_headers_complete;
    s->on_body = on_body;
    s->on_chunk_header = on_chunk_header;
    s->on_message_complete = on_message_complete;
}

/* ---- parsing and the hand-off ---- */

/* The request is complete: split the target, give it to the handler. */
static void dispatch(struct http_conn *c)
{
    struct http_request *req = c->req;
    /* llhttp refuses an empty target, so head holds at least the target and its NUL. */
    char *query = strchr(req->head, '?');
    if (query)
        *query++ = '\0';
    req->path = req->head;
    req->query = query ? query : "";
    c->keep_alive = llhttp_should_keep_alive(&c->parser);
    req->chunked_response = !c->http10;
    req->state = REQ_HANDLER;
    c->state = CONN_HANDLING;
    http_conn_arm_timer(c);
    c->server->handler(c->server->user, req);
}

/* Holds bytes read while a request is handled; stops reading when too many are held. */
static void hold(struct http_conn *c, const char *data, size_t len)
{
    if (len == 0)
        return;
    if (c->pending_len + len > HTTP_MAX_PENDING_BYTES) {
        /* Reading stops below before a socket's read can get here; a caller feeding more
         * (the fuzzer) loses the connection. */
        http_conn_close(c);
        return;
    }
    char *p = realloc(c->pending, c->pending_len + len);
    if (!p) {
        http_conn_close(c);
        return;
    }
    memcpy(p + c->pending_len, data, len);
    c->pending = p;
    c->pending_len += len;
    if (c->pending_len + HTTP_READ_BYTES > HTTP_MAX_PENDING_BYTES)
        http_conn_read(c, false);
}

/* Runs llhttp over data while the connection reads requests. Stops at a complete request
 * (given to the handler; what follows is held, unless the response ended at once and the
 * connection may go on), an error (answered, closing), or the end of data. */
static void conn_parse(struct http_conn *c, const char *data, size_t len)
{
    c->parsing = true;
    /* After a pause llhttp is run once more even with no bytes left: a request without a body
     * completes after its headers without consuming any. */
    bool resumed = false;
    while ((len > 0 || resumed) && !c->closing &&
           (c->state == CONN_IDLE || c->state == CONN_READING)) {
        resumed = false;
        if (c->state == CONN_IDLE) {
            c->state = CONN_READING;
            c->header_bytes = 0;
            c->headers_done = false;
            http_conn_arm_timer(c);
        }
        llhttp_errno_t err = llhttp_execute(&c->parser, data, len);
        size_t used = len;
        if (err != HPE_OK)
            used = (size_t)(llhttp_get_error_pos(&c->parser) - data);
        if (!c->headers_done) {
            c->header_bytes += used;
            if (c->header_bytes > c->server->cfg.max_header_bytes) {
                http_conn_fail(c, 431);
                break;
            }
        }
        data += used;
        len -= used;
        if (err == HPE_OK)
            break;
        if (err != HPE_PAUSED) {
            int status = c->error_status ? c->error_status : 400;
            http_conn_fail(c, status);
            break;
        }
        llhttp_resume(&c->parser);
        resumed = true;
        if (!c->headers_done) {
            c->headers_done = true; /* paused at on_headers_complete */
            continue;
        }
        /* Paused at on_message_complete. */
        resumed = false;
        dispatch(c);
        /* The handler may have answered at once; if the connection goes on, so does this
         * loop (the response's writes are checked before the next request is parsed). */
        if (c->state == CONN_IDLE && c->writes_in_flight == 0)
            continue;
        break;
    }
    c->parsing = false;
    if (len > 0 && !c->closing && c->state == CONN_HANDLING)
        hold(c, data, len);
    else if (len > 0 && !c->closing && c->state == CONN_IDLE)
        hold(c, data, len); /* waiting for the last response's writes */
}

void http_conn_feed(struct http_conn *c, const char *data, size_t len)
{
    if (c->closing || len == 0)
        return;
    switch (c->state) {
    case CONN_IDLE:
        if (c->pending_len > 0 || c->writes_in_flight > 0) {
            hold(c, data, len); /* in order, after what is held */
            return;
        }
        conn_parse(c, data, len);
        return;
    case CONN_READING:
        conn_parse(c, data, len);
        return;
    case CONN_HANDLING:
        hold(c, data, len);
        return;
    case CONN_DRAINING:
    case CONN_LINGER:
        return; /* the connection is closing: what the client sends is dropped */
    }
}

/* In IDLE with every write completed: parses what was held while the last request was
 * handled. */
static void conn_continue(struct http_conn *c)
{
    if (c->parsing || c->closing || c->state != CONN_IDLE || c->writes_in_flight > 0)
        return;
    http_conn_read(c, true);
    if (c->pending_len == 0)
        return;
    char *held = c->pending;
    size_t held_len = c->pending_len;
    c->pending = NULL;
    c->pending_len = 0;
    conn_parse(c, held, held_len);
    free(held);
}

void http_conn_response_done(struct http_conn *c)
{
    http_request_free(c->req);
    c->req = NULL;
    if (c->closing)
        return;
    if (!c->keep_alive) {
        c->state = CONN_DRAINING;
        http_conn_read(c, false);
        free(c->pending);
        c->pending = NULL;
        c->pending_len = 0;
        http_conn_arm_timer(c);
        if (c->writes_in_flight == 0)
            http_conn_linger(c);
        return;
    }
    c->state = CONN_IDLE;
    http_conn_arm_timer(c);
    conn_continue(c);
}

void http_conn_writes_done(struct http_conn *c)
{
    if (c->closing)
        return;
    if (c->state == CONN_DRAINING)
        http_conn_linger(c);
    else if (c->state == CONN_IDLE)
        conn_continue(c);
}
