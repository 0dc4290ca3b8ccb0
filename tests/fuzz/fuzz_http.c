/* libFuzzer target: arbitrary bytes from a client through the HTTP server's request handling
 * (llhttp and http/'s connection state machine: limits, keep-alive, pipelining, the hand-off,
 * responses), without sockets: a detached server (http/http_conn.h) whose connection writes
 * into a sink.
 *
 * Input: a script. Byte 0 chooses how the handler answers (low 2 bits: respond at once, stream
 * at once, hold the request until told, respond with a header the server must refuse first) and,
 * with bit 2, a server that allows a list of origins (CORS lines in every answer, the server's
 * own errors included, from an Origin header read whole or in part).
 * Then commands: a byte L in 1..0xF0 feeds the next L bytes to the connection; 0xF1 fires the
 * connection's timer; 0xF2 answers the held request; 0xF3 starts a stream on it and writes;
 * any other byte ends the stream of the held request, if one was started. At the end the server
 * closes.
 *
 * Checked beyond the sanitizers: every response begins with "HTTP/1.1 "; a request handed to
 * the handler and not answered gets its close callback exactly once; nothing is written after
 * the connection closed. */
#include "common/error.h"
#include "http/http_conn.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct {
    int mode;
    struct http_request *held;
    int held_streaming;
    int closes;
    int handed;
    int answered;
    struct http_conn *conn;
    int expect_head; /* the next write begins a response */
} st;

static void sink(void *arg, const char *data, size_t len)
{
    if (st.conn && st.conn->closing)
        abort(); /* written after the close */
    if (st.expect_head && (len < 9 || memcmp(data, "HTTP/1.1 ", 9) != 0))
        abort();
    st.expect_head = 0;
}

static void on_close(void *arg)
{
    st.closes++;
    st.held = NULL;
}

static void handler(void *user, struct http_request *req)
{
    st.handed++;
    size_t len;
    const char *body = http_request_body(req, &len);
    (void)http_request_header(req, "content-type");
    (void)http_request_query(req);
    if (strlen(http_request_method(req)) == 0 || http_request_path(req) == NULL)
        abort();
    switch (st.mode) {
    case 0:
        st.expect_head = 1;
        if (http_respond(req, 200, "text/plain", body, len, NULL, 0) == 0)
            st.answered++;
        return;
    case 1:
        st.expect_head = 1;
        if (http_stream_start(req, 200, "text/event-stream", NULL, 0) != 0)
            abort();
        http_stream_write(req, body, len);
        http_stream_write(req, "data: x\n\n", 9);
        if (http_stream_end(req) == 0)
            st.answered++;
        return;
    case 3: {
        const char *bad[] = {"X-Bad: a\r\nInjected: b"};
        if (http_respond(req, 200, NULL, NULL, 0, bad, 1) != PAGODA_EINVAL)
            abort();
        if (http_respond(req, 99, NULL, NULL, 0, NULL, 0) != PAGODA_EINVAL)
            abort();
    }
        /* fall through: then held */
    default:
        if (st.held)
            abort(); /* one request at a time per connection */
        st.held = req;
        st.held_streaming = 0;
        http_request_on_close(req, on_close, NULL);
        return;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    memset(&st, 0, sizeof(st));
    st.mode = data[0] & 3;
    struct http_config cfg;
    http_config_default(&cfg);
    cfg.max_header_bytes = 512;
    cfg.max_body_bytes = 1024;
    cfg.allowed_origins = data[0] & 4 ? "https://a.example,http://b.example:8080" : NULL;
    struct http_server *s;
    if (http_server_open_detached(&cfg, handler, NULL, sink, NULL, &s) != 0)
        return 0;
    struct http_conn *c;
    if (http_conn_open_detached(s, &c) != 0) {
        http_server_close(s);
        return 0;
    }
    st.conn = c;
    size_t i = 1;
    while (i < size && !c->closing) {
        uint8_t cmd = data[i++];
        if (cmd >= 1 && cmd <= 0xF0) {
            size_t n = cmd < size - i ? cmd : size - i;
            http_conn_feed(c, (const char *)data + i, n);
            i += n;
        } else if (cmd == 0xF1) {
            st.expect_head = c->state == CONN_READING;
            http_conn_timeout(c);
        } else if (cmd == 0xF2 && st.held && !st.held_streaming) {
            struct http_request *req = st.held;
            st.held = NULL;
            st.expect_head = 1;
            if (http_respond(req, 404, "text/plain", "no", 2, NULL, 0) != 0)
                abort();
            st.answered++;
        } else if (cmd == 0xF3 && st.held) {
            if (!st.held_streaming) {
                st.expect_head = 1;
                if (http_stream_start(st.held, 200, NULL, NULL, 0) != 0)
                    abort();
                st.held_streaming = 1;
            }
            if (http_stream_write(st.held, "chunk", 5) != 0)
                abort();
        } else if (st.held && st.held_streaming) {
            struct http_request *req = st.held;
            st.held = NULL;
            if (http_stream_end(req) != 0)
                abort();
            st.answered++;
        }
    }
    int held = st.held != NULL;
    http_server_close(s); /* frees c, and s */
    /* Every request handed over was answered, or closed once. */
    if (st.closes != held || st.handed != st.answered + st.closes)
        abort();
    return 0;
}
