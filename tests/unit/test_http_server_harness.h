/* The harness of test_http_server.c and test_http_server_limits.c: a real server on a loop in
 * the test's main thread, clients made of plain blocking sockets (with receive timeouts) in a
 * second thread. Each test runs one client function; when it returns, the server is closed with
 * whatever is still open, the loop runs until every handle is closed, and uv_loop_close must
 * succeed (everything freed; the ASan build checks the memory). Client checks (CHECK) record the
 * first failure, which the main thread asserts after joining.
 *
 * The handler answers by path: /echo (method, path, query, X-Test, connections, body length,
 * then the body), /big?n=N (N bytes, a..z repeated), /stream?n=N (N server-sent events), /later
 * (answered 50 ms later), /hold and /streamhold (held, the latter after a first chunk, until the
 * close callback), /flood (64 KiB writes every millisecond until the client is cut). */
#ifndef PAGODA_TESTS_UNIT_TEST_HTTP_SERVER_HARNESS_H
#define PAGODA_TESTS_UNIT_TEST_HTTP_SERVER_HARNESS_H

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
    uint64_t write_cuts; /* http_server_write_cuts when the client was done */
    uint64_t evictions;  /* http_server_evictions then */
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

/* Defaults for a test: any port, 5 s timeouts. */
void fx_config(struct fx *f);
/* Runs client in a thread against a server of f->cfg, then closes everything (see above). */
void fx_run(struct fx *f, void (*client)(struct fx *f));

void resp_free(struct resp *r);
int cl_connect_buf(struct cl *c, uint16_t port, int rcvbuf);
int cl_connect(struct cl *c, uint16_t port);
void cl_close(struct cl *c);
int cl_send(struct cl *c, const char *s, size_t n);
int cl_sends(struct cl *c, const char *s);
/* A line without its CRLF into out; -1 when it does not come or does not fit. */
int cl_line(struct cl *c, char *out, size_t cap);
/* A header's value in a response head, copied into out; NULL when absent. */
const char *resp_header(const struct resp *r, const char *name, char *out, size_t cap);
/* Reads one response: head, then a body by Content-Length, by chunks, or to EOF. 0, or -1
 * when it does not come whole. A 100 Continue is skipped. head_only: the answer to a HEAD. */
int cl_response(struct cl *c, struct resp *r, bool head_only);
/* True when the server closes the connection (EOF or reset) within the receive timeout, with
 * nothing more sent before. */
bool cl_closed(struct cl *c);
void sleep_ms(int ms);
/* Waits (bounded) until *v reaches at_least. */
bool wait_atomic(atomic_int *v, int at_least);
/* Sends request on a new connection and expects status with a JSON error body, then the
 * close. *ok tells whether all of it happened (CHECK returns early otherwise). */
void expect_error_and_close(struct fx *f, const char *request, int status, bool *ok);
/* The same, the answer carrying Access-Control-Allow-Origin: origin (none when NULL) and Vary:
 * Origin (for a server allowing a list of origins). */
void expect_cors_error_and_close(struct fx *f, const char *request, int status, const char *origin,
                                 bool *ok);

#endif
