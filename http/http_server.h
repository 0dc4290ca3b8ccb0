/* A small HTTP/1.1 server on a libuv loop, for the OpenAI-compatible front and the metrics and
 * status pages: keep-alive, request bodies (Content-Length or chunked, Expect: 100-continue
 * answered), responses whole or chunked (server-sent events), parsed by llhttp (Debian's
 * node-llhttp sources, never a parser of our own). Everything runs on the loop thread; nothing
 * blocks it. HTTP/1.0 clients get keep-alive only when they ask for it, and streams delimited by
 * the close instead of chunks.
 *
 * Bounded: connections at once (more are closed as they arrive, after a 503 when the write can be
 * made without waiting), header bytes (431), body bytes (413), the time from a request's first
 * byte to its complete body (408: slow clients), the idle time of a keep-alive connection, and
 * the bytes a response may have queued unsent (a client that stops reading is disconnected), and
 * the bytes of responses held for every client together (the clients stalled longest are cut).
 * None
 * of them stops the server serving others. Malformed requests get 400. These answers of the
 * server's own carry a JSON body in OpenAI's error shape ({"error": {"message", "type",
 * "param", "code"}}, the last two null, as the gateway's own) and the CORS headers of the
 * handler's answers (allowed_origins) where the request's Origin header had all arrived: not
 * those of a connection refused at the cap (nothing of it is read), nor those of a head that
 * grew too large (431), stopped (408) or broke (400) before its Origin line; and they close the
 * connection (after a short linger, so that a client still sending reads them).
 *
 * One request per connection at a time: while a response is in progress the connection parses
 * no further request. It keeps reading, so that a client that goes away is noticed (EOF counts as
 * gone, a half-closed client too, as uvicorn does); bytes of a pipelined request are held, up to
 * 128 KiB, and beyond that wait in the kernel's buffer. */
#ifndef PAGODA_HTTP_HTTP_SERVER_H
#define PAGODA_HTTP_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct http_config {
    const char *host;         /* address to listen on, e.g. "127.0.0.1" or "0.0.0.0" */
    uint16_t port;            /* 0: any free port (http_server_port tells which) */
    uint32_t max_connections; /* open at once (a new one past it takes the place of one idle or
                                 whose request has not all arrived: http_server_evictions) */
    size_t max_header_bytes;  /* request line and headers */
    size_t max_body_bytes;    /* a body over it: 413 and the connection closes */
    /* Body bytes held by every request together, until a handler takes one
     * (http_request_take_body): a declared length, or bytes, that would pass it get 503 and the
     * connection closes. */
    size_t max_body_memory;
    uint32_t request_timeout_ms;   /* first byte to complete body, else 408 and close */
    uint32_t idle_timeout_ms;      /* a keep-alive connection with no request in progress */
    size_t max_queued_write_bytes; /* a response's unsent bytes beyond this: the client is cut */
    /* Bytes of responses every connection together holds, each write from its queueing until
     * the kernel has taken all of it (what the kernel's socket buffers hold is not counted): a
     * write that would pass it first cuts connections with bytes unsent, the one whose client
     * has taken no whole write for longest first, until it fits; none when even cutting all of
     * them would not make it fit (the write then goes out). */
    size_t max_write_memory;
    /* CORS: the origins whose pages may read the answers: NULL or "" none, "*" any, else a
     * comma-separated list ("https://a.example,http://b.example:8080"). The answer to a request
     * whose Origin header is allowed carries Access-Control-Allow-Origin ("*", or the origin with
     * Vary: Origin), the server's own error answers too (above); preflights (OPTIONS) are the
     * handler's. Printable ASCII without blanks; not copied: it must outlive the server. */
    const char *allowed_origins;
};

/* Defaults: 127.0.0.1:8000, 4096 connections, 64 KiB of headers, 8 MiB bodies, 256 MiB of bodies
 * held at once, 30 s per request, 60 s idle, 8 MiB queued a connection, 256 MiB of responses held
 * at once. */
void http_config_default(struct http_config *cfg);

struct http_server;
struct http_request;

/* Called on the loop for every complete request. The handler must answer it, now or later, with
 * http_respond or http_stream_start..http_stream_end, unless the connection closes first (see
 * http_request_on_close). */
typedef void (*http_handler_fn)(void *user, struct http_request *req);

/* Listens and serves on loop. The process must ignore SIGPIPE (pagoda's programs do): libuv writes
 * with writev, and a write to a client that has gone would otherwise end it. On success *out is
 * released with http_server_close. Errors: PAGODA_EINVAL (bad config, host not an IP address),
 * PAGODA_EIO (cannot listen: the detail says why; what was opened is freed once the loop runs),
 * PAGODA_ENOMEM. */
int http_server_open(uv_loop_t *loop, const struct http_config *cfg, http_handler_fn handler,
                     void *user, struct http_server **out);

/* The port listened on (useful with port 0). */
uint16_t http_server_port(const struct http_server *s);

/* Whether origin is one of list's (http_config.allowed_origins: "*" any, else a comma-separated
 * list; NULL or "" none). */
bool http_origin_allowed(const char *list, const char *origin);

/* Connections open now, and those closed so far at max_connections to take a new one in their
 * place (one lingering, else the quietest of those idle or whose request has not all arrived:
 * never one whose request is with the handler or whose answer is still going out). */
uint32_t http_server_connections(const struct http_server *s);
uint64_t http_server_evictions(const struct http_server *s);

/* Bytes of responses held until the kernel takes them (http_config.max_write_memory), and the
 * connections cut so far to keep within it. */
size_t http_server_write_bytes(const struct http_server *s);
uint64_t http_server_write_cuts(const struct http_server *s);

/* Stops listening, closes every connection (requests in progress get their close callbacks) and
 * frees the server once libuv has closed its handles (the loop must run). Accepts NULL. */
void http_server_close(struct http_server *s);

/* The request, valid until its response has ended or its close callback has returned. Strings are
 * NUL-terminated and owned by the request; the path is not percent-decoded. */
const char *http_request_method(const struct http_request *req); /* "GET", "POST", ... */
const char *http_request_path(const struct http_request *req);   /* without the query */
const char *http_request_query(const struct http_request *req);  /* after '?', or "" */
/* A header's value (name matched without case), or NULL; the first when repeated. */
const char *http_request_header(const struct http_request *req, const char *name);
/* The body ("" when none), NUL-terminated after its len bytes. */
const char *http_request_body(const struct http_request *req, size_t *len);
/* The body handed over: the caller owns it (free), NUL-terminated after its len bytes, and the
 * request holds none from then on (http_request_body gives ""), so that a long response does not
 * keep it. NULL when out of memory (a request without a body gives a new ""). */
char *http_request_take_body(struct http_request *req, size_t *len);

/* Called once if the connection goes away (the client closed it, a limit cut it, the server
 * closes) before the response ended: the handler's chance to cancel what it started. It runs
 * from the loop, never inside one of the calls below (one that finds the connection gone returns
 * PAGODA_ECLOSED and the callback follows). After it returns the request is gone; respond calls
 * must not be made on it. */
void http_request_on_close(struct http_request *req, void (*fn)(void *arg), void *arg);

/* Gives up a request that cannot be answered (a respond call below failed for want of memory,
 * say): closes its connection, the client seeing it close without an answer. The close callback
 * follows, from the loop, never inside this call. For a request not ended, also one whose
 * connection is closing already. */
void http_request_abort(struct http_request *req);

/* A whole response: status (200..999), Content-Type (may be NULL), body (copied; not sent to a
 * HEAD request), and extra header lines ("Name: value" without line breaks, num_headers of them;
 * may be NULL). Ends the request. Errors: PAGODA_EINVAL (already answered, a bad status or
 * header line), PAGODA_ECLOSED (the connection is gone), PAGODA_ENOMEM. */
int http_respond(struct http_request *req, int status, const char *content_type, const void *body,
                 size_t len, const char *const *headers, size_t num_headers);

/* A response sent in pieces (Transfer-Encoding: chunked), e.g. text/event-stream. Data is
 * copied; a client that reads too slowly is disconnected (a write finding unsent bytes queued
 * and the total over max_queued_write_bytes) and the close callback runs. http_stream_end ends
 * the request. Errors: PAGODA_EINVAL (wrong state), PAGODA_ECLOSED (the connection is gone),
 * PAGODA_ENOMEM. */
int http_stream_start(struct http_request *req, int status, const char *content_type,
                      const char *const *headers, size_t num_headers);
int http_stream_write(struct http_request *req, const void *data, size_t len);
int http_stream_end(struct http_request *req);

#endif
