/* Internal to http/: one connection's state machine, shared by http_server.c (the socket, the
 * timers, closing), http_conn.c (feeding bytes through llhttp into requests) and http_write.c
 * (responses), and the fuzzer (tests/fuzz/fuzz_http.c), which drives a connection without a
 * socket: a server opened detached has no loop, its connections write into a sink and close
 * when the caller reaps them.
 *
 * A connection's life:
 *
 *   IDLE --first byte--> READING --complete request--> HANDLING --response ended-->
 *     IDLE (keep-alive; bytes already read are parsed once every write has completed)
 *     or DRAINING (close: the last writes complete, then the write side is shut down and
 *     LINGER reads and discards until the client closes or HTTP_LINGER_MS pass, so that a
 *     client still sending does not get a reset that loses the response).
 *   READING --bad or oversized request, timeout--> an error response, DRAINING.
 *   any --client gone, write error, a client cut for not reading, server close--> closed.
 *
 * One timer per connection: the idle timeout in IDLE and DRAINING, the request timeout in
 * READING, HTTP_LINGER_MS in LINGER, none in HANDLING (the handler's business). */
#ifndef PAGODA_HTTP_HTTP_CONN_H
#define PAGODA_HTTP_HTTP_CONN_H

#include "http/http_server.h"

#include <llhttp.h>
#include <stdbool.h>

/* Bytes read per read callback. */
#define HTTP_READ_BYTES 65536
/* Bytes read while a request is handled (a pipelined request, or nothing but the client's
 * EOF), held unparsed; once a further read could pass this the connection stops reading until
 * the response ends (and so notices a client gone only when a write fails). */
#define HTTP_MAX_PENDING_BYTES (2 * HTTP_READ_BYTES)
/* After the last response of a closing connection: how long to wait for the client's EOF. */
#define HTTP_LINGER_MS 1000

enum http_conn_state { CONN_IDLE, CONN_READING, CONN_HANDLING, CONN_DRAINING, CONN_LINGER };

enum http_req_state {
    REQ_PARSING,   /* bytes still arriving */
    REQ_HANDLER,   /* given to the handler, not answered */
    REQ_STREAMING, /* a chunked response started */
    REQ_ENDED,     /* answered (the request is freed right after) */
};

/* A header: offsets of its NUL-terminated name and value in the request's head buffer. */
struct http_header_ref {
    uint32_t name;
    uint32_t value;
};

struct http_request {
    struct http_conn *conn;
    enum http_req_state state;
    /* The target, then each header's name and value, NUL-terminated, in one buffer of at most
     * max_header_bytes. The target is split at '?' when the request is complete. */
    char *head;
    size_t head_len, head_cap;
    struct http_header_ref *headers;
    size_t num_headers, cap_headers;
    /* Headers whose value has all arrived, the first ones (in order): what http_request_header
     * reads, so that an error answered while the head is read sees no value in part. */
    size_t num_complete_headers;
    bool in_value;      /* the last fragment was a header value */
    const char *method; /* llhttp's static name */
    const char *path;   /* into head */
    const char *query;  /* into head, or "" */
    char *body;         /* NUL-terminated, at most max_body_bytes; NULL while empty */
    size_t body_len, body_cap;
    bool head_only;        /* HEAD: the response has no body */
    bool chunked_response; /* a stream in chunks (HTTP/1.1), else delimited by the close */
    void (*on_close)(void *arg);
    void *on_close_arg;
};

struct http_conn {
    struct http_server *server;
    struct http_conn *prev, *next;
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shutdown;
    llhttp_t parser;
    enum http_conn_state state;
    struct http_request *req; /* being read or handled; NULL in IDLE */
    size_t header_bytes;      /* of the request being read, until its headers are complete */
    bool headers_done;
    int error_status;         /* set by a parser callback that refuses: 413, 431 */
    const char *error_detail; /* with it, the message (static), or NULL for the status's */
    bool keep_alive;          /* after the response in progress */
    bool http10;              /* the request in progress is HTTP/1.0 */
    char *pending;            /* bytes read while handling, parsed once the response ends */
    size_t pending_len;
    unsigned writes_in_flight;
    size_t write_bytes; /* of the writes in flight (counted in server.write_bytes until closing) */
    /* When the client last took a whole write (its callback) or a backlog began: under
     * max_write_memory the connection stalled longest is cut first. */
    uint64_t progress_ms;
    /* When its last bytes arrived (or it was accepted): at max_connections, the connection quiet
     * longest gives its place (http_server.c make_room). */
    uint64_t read_ms;
    bool reading; /* uv_read_start in effect */
    bool parsing; /* inside conn_parse: a response ending now is picked up by its loop */
    bool closing; /* closed or being closed: nothing more is read or written */
    int handles_open;
};

struct http_conn_list {
    struct http_conn *head, *tail;
    unsigned count;
};

struct http_server {
    uv_loop_t *loop; /* NULL: detached (the fuzzer) */
    struct http_config cfg;
    char host[64];
    http_handler_fn handler;
    void *user;
    llhttp_settings_t settings;
    uv_tcp_t listener;
    bool listener_open;
    bool closing;
    struct http_conn_list conns;
    size_t body_bytes;   /* body bytes every request holds (cfg.max_body_memory) */
    size_t write_bytes;  /* bytes of writes in flight, connections not closing (max_write_memory) */
    uint64_t write_cuts; /* connections cut for max_write_memory */
    uint64_t evictions;  /* connections closed for a new one at max_connections (make_room) */
    /* Detached: where responses go. */
    void (*sink)(void *arg, const char *data, size_t len);
    void *sink_arg;
};

/* ---- http_conn.c: parsing ---- */

/* The llhttp callbacks every connection of s uses. */
void http_conn_settings_init(llhttp_settings_t *settings);
/* Bytes from the client: parsed in IDLE and READING, held in HANDLING, dropped in LINGER. */
void http_conn_feed(struct http_conn *c, const char *data, size_t len);
/* The response in progress has ended: the request is freed and the connection goes on. */
void http_conn_response_done(struct http_conn *c);
/* Every write has completed: in IDLE, held bytes are parsed; in DRAINING, the close begins. */
void http_conn_writes_done(struct http_conn *c);
/* Frees a request (no callback). Accepts NULL. */
void http_request_free(struct http_request *req);

/* ---- http_write.c: responses ---- */

/* Queues len bytes (copied) for the client, or gives them to the sink. PAGODA_ENOMEM, or
 * PAGODA_ECLOSED when the write fails at once (the connection is closed). */
int http_conn_send(struct http_conn *c, const char *data, size_t len);
/* Answers a request that failed before the handler saw it (400, 408, 413, 431, 503) and closes;
 * with the CORS lines of the request's Origin where its header has arrived (http_cors_origin). */
void http_conn_fail(struct http_conn *c, int status);
/* The reason phrase of a status ("Not Found"); "Unknown" when it has none here. */
const char *http_status_reason(int status);
/* The Access-Control-Allow-Origin value of an answer to req under cfg->allowed_origins: "*", its
 * Origin where the list has it, or NULL (none allowed, no Origin, or req NULL: nothing read yet);
 * *vary where the answer depends on the Origin (a list of origins: every answer then says so,
 * whether or not req's Origin is known). */
const char *http_cors_origin(const struct http_config *cfg, const struct http_request *req,
                             bool *vary);
/* The whole error response (JSON body, Connection: close; a 503 says Retry-After: 1) into buf,
 * with the CORS lines of origin and vary (http_cors_origin's); its length, or 0 when it does not
 * fit (HTTP_ERROR_RESPONSE_BYTES and origin's length always do). detail: the message, or NULL
 * for the status's. */
#define HTTP_ERROR_RESPONSE_BYTES 512
size_t http_error_response(char *buf, size_t cap, int status, const char *detail,
                           const char *origin, bool vary);

/* ---- http_server.c: the socket's side ---- */

/* Closes the connection (idempotent): nothing more is read or written; the request in progress
 * gets its close callback and everything is freed once libuv has closed the handles (detached:
 * at http_server_reap). */
void http_conn_close(struct http_conn *c);
/* What the connection's timer does when it fires (408 in READING, closing otherwise). */
void http_conn_timeout(struct http_conn *c);
/* Starts the timer for the state's timeout (none in HANDLING). */
void http_conn_arm_timer(struct http_conn *c);
/* Starts or stops reading (no-ops detached). */
void http_conn_read(struct http_conn *c, bool on);
/* The write side is done: shut it down and linger (detached: close). */
void http_conn_linger(struct http_conn *c);

/* Detached servers, for the fuzzer: no loop, no socket. */
int http_server_open_detached(const struct http_config *cfg, http_handler_fn handler, void *user,
                              void (*sink)(void *arg, const char *data, size_t len), void *sink_arg,
                              struct http_server **out);
int http_conn_open_detached(struct http_server *s, struct http_conn **out);
/* Frees the detached server's closed connections (their close callbacks run). */
void http_server_reap(struct http_server *s);

#endif
