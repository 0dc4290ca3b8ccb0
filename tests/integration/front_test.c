/* Integration test of the router's front against a real group (tiny model on the CPU): what a
 * crowd of clients, idle or slow peers and oversized prompts may hold of the router.
 *
 *   polls     2,000 polls parked at once (raw REQ sockets, 200 connections of 10 calls each)
 *             while a health check and a new request from another client are answered
 *   conns     connections over --max-connections are closed as they arrive, while a client
 *             connected before keeps being served
 *   idle      a peer holding a partial message, and one that sends nothing, are dropped after
 *             --idle-timeout-ms
 *   refused   prompts over the model's context are refused at once and nothing of them stays
 *             (Stats.registry_bytes, the router's resident memory); a finished request's prompt
 *             is not kept
 *
 * usage: front_test BIN_DIR SCENARIO */
#include "tests/integration/group.h"

#include "proto/pagoda.pb-c.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define VOCAB 512
#define MODEL_POSITIONS 2048 /* pagoda-mkmodel --preset tiny */
#define POLL_SOCKETS 200
#define POLLS_PER_SOCKET 10
#define NUM_POLLS (POLL_SOCKETS * POLLS_PER_SOCKET)
/* The router clamps a poll's wait to 30 s (ROUTER_DEFAULT_MAX_WAIT_MS): on a router whose
 * contexts are all held by parked polls, a call waits that long. A health check that must be
 * answered while polls are parked therefore gets less than that, whatever the time scale (the
 * router itself is not slowed by the CPU model). */
#define POLL_WAIT_MS 30000u
#define HEALTH_TIMEOUT_MS 10000u
#define CONN_CAP 32
#define FLOOD_CONNS 60
#define IDLE_TIMEOUT_MS 1000
#define REFUSED_PROMPTS 1000

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static pagoda_client *open_client(const struct group *g, uint32_t timeout_ms)
{
    pagoda_client *c = NULL;
    if (pagoda_client_open(g->url, &c) != 0)
        return NULL;
    pagoda_client_set_timeout_ms(c, timeout_ms);
    return c;
}

static void still_serving(pagoda_client *c, const char *after)
{
    int32_t prompt[6];
    group_prompt(prompt, 6, 77, VOCAB);
    pagoda_generate_params p = group_greedy(4);
    pagoda_result r = {0};
    int rc = pagoda_generate(c, &p, prompt, 6, &r);
    CHECK(rc == 0 && r.num_tokens == 4 && r.finish_reason == PAGODA_FINISH_LENGTH,
          "after %s, a good request succeeds (rc %d, %zu tokens)", after, rc, r.num_tokens);
    pagoda_result_free(&r);
}

/* The router's own Stats, through a raw call (the figures libpagoda does not copy). */
static Pagoda__Stats *router_stats(const struct group *g, Pagoda__ClientResponse **resp)
{
    Pagoda__StatsRequest sreq = PAGODA__STATS_REQUEST__INIT;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_STATS;
    req.stats = &sreq;
    uint8_t buf[64];
    size_t len = pagoda__client_request__pack(&req, buf);
    *resp = group_raw_call(g, buf, len, (uint32_t)(30000 * group_time_scale()));
    if (*resp == NULL || (*resp)->result_case != PAGODA__CLIENT_RESPONSE__RESULT_STATS)
        return NULL;
    return (*resp)->stats;
}

/* The resident memory of a process in KiB, or -1. */
static long rss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    long kib = -1;
    while (fgets(line, sizeof(line), f) != NULL)
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

/* ---- raw connections: the SP protocol over a Unix socket, by hand ------------------------- */

/* Connects to the group's ipc:// address and exchanges the SP header as a REQ peer (protocol
 * 48; the router's REP answers 49). Returns the descriptor or -1. */
static int raw_connect(const struct group *g)
{
    const char *path = g->url + strlen("ipc://");
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    static const uint8_t hdr[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};
    uint8_t peer[8];
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        write(fd, hdr, sizeof(hdr)) != (ssize_t)sizeof(hdr) ||
        poll(&pfd, 1, (int)(10000 * group_time_scale())) != 1 ||
        read(fd, peer, sizeof(peer)) != (ssize_t)sizeof(peer) || peer[5] != 49) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Whether the router has closed the connection (a read finds its end). */
static int raw_closed(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, 0) != 1)
        return 0;
    uint8_t buf[256];
    ssize_t n = read(fd, buf, sizeof(buf));
    return n == 0 || (n < 0 && errno == ECONNRESET);
}

/* Waits up to timeout_ms until at least want of fds[0..n) are closed; returns how many are. */
static int wait_closed(const int *fds, int n, int want, long timeout_ms, int *closed_flags)
{
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    int closed = 0;
    for (;;) {
        for (int i = 0; i < n; i++)
            if (fds[i] >= 0 && !closed_flags[i] && raw_closed(fds[i])) {
                closed_flags[i] = 1;
                closed++;
            }
        if (closed >= want || now_ms() >= deadline)
            return closed;
        sleep_ms(50);
    }
}

/* ---- polls ---------------------------------------------------------------------------------- */

static void scenario_polls(struct group *g)
{
    pagoda_client *a = open_client(g, (uint32_t)(60000 * group_time_scale()));
    pagoda_client *h = open_client(g, HEALTH_TIMEOUT_MS);
    pagoda_client *b = open_client(g, HEALTH_TIMEOUT_MS);
    pid_t sched = group_program_pid(g, "pagoda-scheduler");
    CHECK(a != NULL && h != NULL && b != NULL && sched > 0, "clients open, scheduler pid %d",
          (int)sched);
    if (a == NULL || h == NULL || b == NULL || sched <= 0)
        goto out;
    still_serving(a, "start");
    /* A stopped scheduler sends no tokens: every poll parks until it resumes. */
    int32_t prompt[8];
    group_prompt(prompt, 8, 5, VOCAB);
    pagoda_generate_params p = group_greedy(4);
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    kill(sched, SIGSTOP);
    int rc = pagoda_submit(a, &p, prompt, 8, id);
    CHECK(rc == 0, "a request submitted while the scheduler is stopped (rc %d)", rc);

    Pagoda__PollRequest poll = PAGODA__POLL_REQUEST__INIT;
    poll.has_request_id = poll.has_offset = poll.has_wait_ms = 1;
    poll.request_id.data = id;
    poll.request_id.len = sizeof(id);
    poll.offset = 0;
    poll.wait_ms = POLL_WAIT_MS;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_POLL;
    req.poll = &poll;
    uint8_t buf[128];
    size_t len = pagoda__client_request__pack(&req, buf);

    pid_t router = group_program_pid(g, "pagoda-router");
    long rss0 = router > 0 ? rss_kib(router) : -1;
    static nng_socket socks[POLL_SOCKETS];
    static nng_ctx ctxs[NUM_POLLS];
    static nng_aio *aios[NUM_POLLS];
    int sent = 0, opened = 0;
    for (int s = 0; s < POLL_SOCKETS; s++) {
        if (nng_req0_open(&socks[s]) != 0)
            break;
        opened++;
        nng_socket_set_ms(socks[s], NNG_OPT_REQ_RESENDTIME, 600000);
        if (nng_dial(socks[s], g->url, NULL, 0) != 0)
            break;
        for (int k = 0; k < POLLS_PER_SOCKET; k++) {
            int i = s * POLLS_PER_SOCKET + k;
            nng_msg *m;
            if (nng_ctx_open(&ctxs[i], socks[s]) != 0 || nng_aio_alloc(&aios[i], NULL, NULL) != 0)
                break;
            nng_aio_set_timeout(aios[i], (nng_duration)(10000 * group_time_scale()));
            if (nng_msg_alloc(&m, len) != 0)
                break;
            memcpy(nng_msg_body(m), buf, len);
            nng_aio_set_msg(aios[i], m);
            nng_ctx_send(ctxs[i], aios[i]);
            nng_aio_wait(aios[i]);
            if (nng_aio_result(aios[i]) != 0) {
                nng_msg_free(m);
                break;
            }
            nng_aio_set_timeout(aios[i], (nng_duration)(POLL_WAIT_MS + 60000 * group_time_scale()));
            nng_ctx_recv(ctxs[i], aios[i]);
            sent++;
        }
    }
    CHECK(sent == NUM_POLLS, "%d polls sent with a %u ms wait on %d connections", sent,
          POLL_WAIT_MS, opened);
    sleep_ms(500); /* the router takes them in */
    long rss1 = router > 0 ? rss_kib(router) : -1;
    printf("     the router's resident memory: %ld KiB before the polls, %ld KiB with them "
           "parked\n",
           rss0, rss1);

    uint64_t t0 = now_ms();
    int healthy = 0;
    rc = pagoda_health(h, &healthy);
    CHECK(rc == 0 && healthy,
          "with %d polls parked, a health check is answered: healthy "
          "(rc %d, %llu ms)",
          sent, rc, (unsigned long long)(now_ms() - t0));
    uint8_t id_b[PAGODA_REQUEST_ID_BYTES];
    t0 = now_ms();
    rc = pagoda_submit(b, &p, prompt, 8, id_b);
    CHECK(rc == 0,
          "with %d polls parked, another client's new request is admitted (rc %d, "
          "%llu ms)",
          sent, rc, (unsigned long long)(now_ms() - t0));

    kill(sched, SIGCONT);
    int answered = 0, with_tokens = 0;
    for (int i = 0; i < sent; i++) {
        nng_aio_wait(aios[i]);
        if (nng_aio_result(aios[i]) != 0)
            continue;
        nng_msg *m = nng_aio_get_msg(aios[i]);
        Pagoda__ClientResponse *resp =
            pagoda__client_response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
        nng_msg_free(m);
        if (resp != NULL && !(resp->has_error_code && resp->error_code != 0) &&
            resp->update != NULL) {
            answered++;
            with_tokens += resp->update->n_token_ids > 0;
        }
        if (resp != NULL)
            pagoda__client_response__free_unpacked(resp, NULL);
    }
    CHECK(answered == sent && with_tokens == sent,
          "once the scheduler resumes, every parked poll is answered with tokens (%d answered, "
          "%d with tokens, of %d)",
          answered, with_tokens, sent);
    pagoda_result r = {0};
    pagoda_client_set_timeout_ms(b, (uint32_t)(60000 * group_time_scale()));
    uint32_t have = 0;
    rc = 0;
    for (int i = 0; rc == 0 && i < 1000; i++) {
        rc = pagoda_poll(b, id_b, have, 2000, &r);
        have += rc == 0 ? (uint32_t)r.num_tokens : 0;
        int done = rc == 0 && r.finish_reason != PAGODA_FINISH_NONE;
        pagoda_result_free(&r);
        if (done)
            break;
    }
    CHECK(rc == 0 && have == 4, "the other client's request completes (rc %d, %u tokens)", rc,
          have);
    for (int i = 0; i < sent; i++) {
        nng_aio_free(aios[i]);
        nng_ctx_close(ctxs[i]);
    }
    for (int s = 0; s < opened; s++)
        nng_close(socks[s]);
    still_serving(a, "2,000 parked polls");
out:
    if (sched > 0)
        kill(sched, SIGCONT);
    pagoda_client_close(a);
    pagoda_client_close(h);
    pagoda_client_close(b);
}

/* ---- conns ------------------------------------------------------------------------------------
 */

static void scenario_conns(struct group *g)
{
    pagoda_client *a = open_client(g, (uint32_t)(60000 * group_time_scale()));
    if (a == NULL) {
        CHECK(0, "client open");
        return;
    }
    still_serving(a, "start");
    int fds[FLOOD_CONNS], flags[FLOOD_CONNS] = {0};
    int connected = 0;
    for (int i = 0; i < FLOOD_CONNS; i++) {
        fds[i] = raw_connect(g);
        connected += fds[i] >= 0;
    }
    CHECK(connected == FLOOD_CONNS, "%d of %d raw connections completed the SP handshake",
          connected, FLOOD_CONNS);
    /* The router holds a's connection: at most CONN_CAP - 1 of the flood fit. */
    int want = FLOOD_CONNS - (CONN_CAP - 1);
    int closed = wait_closed(fds, FLOOD_CONNS, want, 10000 * group_time_scale(), flags);
    CHECK(closed >= want && closed < FLOOD_CONNS,
          "connections over the cap of %d are closed as they arrive (%d of %d closed)", CONN_CAP,
          closed, FLOOD_CONNS);
    still_serving(a, "a flood of connections over the cap");
    /* The stats call needs a connection of its own: a few of the flood leave first. */
    for (int i = 0, left = 0; i < FLOOD_CONNS && left < 4; i++)
        if (fds[i] >= 0 && !flags[i]) {
            close(fds[i]);
            fds[i] = -1;
            left++;
        }
    Pagoda__ClientResponse *resp = NULL;
    Pagoda__Stats *st = router_stats(g, &resp);
    CHECK(st != NULL && st->has_client_connections && st->client_connections <= CONN_CAP,
          "Stats: %u client connections, the cap is %d", st ? st->client_connections : 0, CONN_CAP);
    if (resp != NULL)
        pagoda__client_response__free_unpacked(resp, NULL);
    for (int i = 0; i < FLOOD_CONNS; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    pagoda_client *b = open_client(g, (uint32_t)(30000 * group_time_scale()));
    int healthy = 0;
    int rc = b != NULL ? pagoda_health(b, &healthy) : -1;
    CHECK(rc == 0 && healthy, "once the flood leaves, a new client is answered (rc %d)", rc);
    pagoda_client_close(b);
    pagoda_client_close(a);
}

/* ---- idle -------------------------------------------------------------------------------------
 */

static void scenario_idle(struct group *g)
{
    pagoda_client *a = open_client(g, (uint32_t)(60000 * group_time_scale()));
    if (a == NULL) {
        CHECK(0, "client open");
        return;
    }
    int fds[2], flags[2] = {0};
    fds[0] = raw_connect(g); /* holds a partial message */
    fds[1] = raw_connect(g); /* sends nothing */
    CHECK(fds[0] >= 0 && fds[1] >= 0, "two raw connections completed the SP handshake");
    if (fds[0] >= 0) {
        /* The ipc framing: a type byte, the length (big-endian), then the body, less a byte. */
        static uint8_t msg[9 + 4000];
        uint64_t body = 4000;
        msg[0] = 1;
        for (int i = 0; i < 8; i++)
            msg[1 + i] = (uint8_t)(body >> (56 - 8 * i));
        ssize_t n = write(fds[0], msg, sizeof(msg) - 1);
        CHECK(n == (ssize_t)sizeof(msg) - 1, "a 4,000-byte message sent but for its last byte");
    }
    still_serving(a, "a peer holding a partial message");
    /* Dropped after the idle timeout: allow it many times over. */
    int closed = wait_closed(fds, 2, 2, 15L * IDLE_TIMEOUT_MS * group_time_scale(), flags);
    CHECK(flags[0], "the peer holding a partial message is dropped after %d ms", IDLE_TIMEOUT_MS);
    CHECK(flags[1], "the peer that sent nothing is dropped after %d ms (%d closed)",
          IDLE_TIMEOUT_MS, closed);
    for (int i = 0; i < 2; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    still_serving(a, "idle peers were dropped");
    pagoda_client_close(a);
}

/* ---- refused ----------------------------------------------------------------------------------
 */

static void scenario_refused(struct group *g)
{
    pagoda_client *a = open_client(g, (uint32_t)(60000 * group_time_scale()));
    pid_t router = group_program_pid(g, "pagoda-router");
    if (a == NULL || router <= 0) {
        CHECK(0, "client open, router pid %d", (int)router);
        pagoda_client_close(a);
        return;
    }
    still_serving(a, "start");
    long rss0 = rss_kib(router);
    /* A prompt as long as the model's context leaves no room for output. */
    static int32_t prompt[MODEL_POSITIONS];
    group_prompt(prompt, MODEL_POSITIONS, 31, VOCAB);
    pagoda_generate_params p = group_greedy(4);
    int refused = 0, other = 0;
    for (int i = 0; i < REFUSED_PROMPTS; i++) {
        uint8_t id[PAGODA_REQUEST_ID_BYTES];
        prompt[0] = i % VOCAB; /* each a request of its own */
        int rc = pagoda_submit(a, &p, prompt, MODEL_POSITIONS, id);
        if (rc == PAGODA_ERANGE)
            refused++;
        else
            other++;
    }
    CHECK(refused == REFUSED_PROMPTS,
          "%d prompts of the model's context (%d tokens) refused at once with PAGODA_ERANGE "
          "(%d otherwise answered)",
          refused, MODEL_POSITIONS, other);
    /* strict_max_tokens: a prompt plus max_tokens one past the context is refused at once with
     * the figures; one that fits is served to its max_tokens, and without the flag the one past
     * ends by length at the context. */
    int32_t near = MODEL_POSITIONS - 6;
    pagoda_generate_params ps = group_greedy(7);
    ps.strict_max_tokens = 1;
    uint8_t sid[PAGODA_REQUEST_ID_BYTES];
    int rc = pagoda_submit(a, &ps, prompt, (size_t)near, sid);
    CHECK(rc == PAGODA_ERANGE && strstr(pagoda_error_detail(), "asks for 2049") != NULL,
          "strict max_tokens one past the context refused: %d '%s'", rc, pagoda_error_detail());
    pagoda_result res;
    ps.max_tokens = 6;
    rc = pagoda_generate(a, &ps, prompt, (size_t)near, &res);
    CHECK(rc == 0 && res.finish_reason == PAGODA_FINISH_LENGTH && res.num_tokens == 6,
          "strict max_tokens that fits: %zu tokens (rc %d)", rc == 0 ? res.num_tokens : 0, rc);
    if (rc == 0)
        pagoda_result_free(&res);
    ps.strict_max_tokens = 0;
    ps.max_tokens = 7;
    rc = pagoda_generate(a, &ps, prompt, (size_t)near, &res);
    CHECK(rc == 0 && res.finish_reason == PAGODA_FINISH_LENGTH && res.num_tokens == 6,
          "max_tokens past the context without strict: ends by length at %zu tokens (rc %d)",
          rc == 0 ? res.num_tokens : 0, rc);
    if (rc == 0)
        pagoda_result_free(&res);
    long rss1 = rss_kib(router);
    long kept_kib = (long)REFUSED_PROMPTS * MODEL_POSITIONS * 4 / 1024;
    CHECK(rss0 > 0 && rss1 > 0 && rss1 - rss0 < kept_kib / 2,
          "the router's resident memory grew by %ld KiB over %d refused prompts (keeping them "
          "would take %ld KiB)",
          rss1 - rss0, REFUSED_PROMPTS, kept_kib);

    /* A prompt far over the context, in a message over the limit sized from it: NNG drops the
     * connection without an answer, and the router serves on. */
    static int32_t huge[131072];
    group_prompt(huge, 131072, 3, VOCAB);
    Pagoda__SubmitRequest sub = PAGODA__SUBMIT_REQUEST__INIT;
    uint8_t hid[16] = {7};
    sub.has_request_id = 1;
    sub.request_id.data = hid;
    sub.request_id.len = 16;
    sub.n_prompt_token_ids = 131072;
    sub.prompt_token_ids = huge;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_SUBMIT;
    req.submit = &sub;
    size_t len = pagoda__client_request__get_packed_size(&req);
    uint8_t *buf = malloc(len);
    pagoda__client_request__pack(&req, buf);
    /* Sent on a raw connection, so that no REQ socket reconnects and resends it. */
    int fd = raw_connect(g);
    int dropped = 0;
    if (fd >= 0) {
        uint8_t hdr[9] = {1};
        for (int i = 0; i < 8; i++)
            hdr[1 + i] = (uint8_t)((uint64_t)len >> (56 - 8 * i));
        if (write(fd, hdr, sizeof(hdr)) == (ssize_t)sizeof(hdr)) {
            for (size_t off = 0; off < len;) {
                ssize_t w = write(fd, buf + off, len - off);
                if (w <= 0)
                    break; /* the router closed the connection */
                off += (size_t)w;
            }
        }
        /* The router closes the connection without an answer (a read finds its end), where a
         * router that took the message in answers it. */
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        uint8_t reply[256];
        dropped = poll(&pfd, 1, (int)(10000 * group_time_scale())) == 1 &&
                  read(fd, reply, sizeof(reply)) <= 0;
        close(fd);
    }
    free(buf);
    CHECK(dropped,
          "a %zu-byte Submit (131,072 tokens) is not taken in: the connection is "
          "dropped unanswered",
          len);
    Pagoda__ClientResponse *resp = NULL;
    still_serving(a, "oversized prompts");

    /* A finished request keeps what its client can fetch, not its prompt. */
    Pagoda__Stats *st = router_stats(g, &resp);
    uint64_t bytes0 = st != NULL && st->has_registry_bytes ? st->registry_bytes : 0;
    int has0 = st != NULL && st->has_registry_bytes;
    if (resp != NULL)
        pagoda__client_response__free_unpacked(resp, NULL);
    size_t n = 256; /* one prefill step on a loaded CPU stays within the step timeout */
    pagoda_result r = {0};
    rc = pagoda_generate(a, &p, prompt, n, &r);
    CHECK(rc == 0 && r.finish_reason == PAGODA_FINISH_LENGTH,
          "a %zu-token prompt generates "
          "(rc %d)",
          n, rc);
    pagoda_result_free(&r);
    st = router_stats(g, &resp);
    uint64_t bytes1 = st != NULL && st->has_registry_bytes ? st->registry_bytes : 0;
    CHECK(has0 && st != NULL && st->has_registry_bytes && bytes1 > bytes0 &&
              bytes1 - bytes0 < n * sizeof(int32_t),
          "Stats.registry_bytes grew by %llu bytes for the finished request (its prompt is "
          "%zu bytes)",
          (unsigned long long)(bytes1 - bytes0), n * sizeof(int32_t));
    if (resp != NULL)
        pagoda__client_response__free_unpacked(resp, NULL);
    pagoda_client_close(a);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: front_test BIN_DIR polls|conns|idle|refused\n");
        return 2;
    }
    const char *scenario = argv[2];
    struct group g;
    int rc = group_setup(&g, argv[1], 0);
    if (rc != 0)
        return rc;
    char cap[16], idle[16];
    snprintf(cap, sizeof(cap), "%d", CONN_CAP);
    snprintf(idle, sizeof(idle), "%d", IDLE_TIMEOUT_MS);
    const char *none[] = {NULL};
    const char *conns[] = {
        "--router-arg",      "--max-connections", "--router-arg", cap, "--router-arg",
        "--idle-timeout-ms", "--router-arg",      "600000",       NULL};
    const char *idles[] = {"--router-arg", "--idle-timeout-ms", "--router-arg", idle, NULL};
    const char *const *extra = none;
    if (strcmp(scenario, "conns") == 0)
        extra = conns;
    else if (strcmp(scenario, "idle") == 0)
        extra = idles;
    if (strcmp(scenario, "refused") == 0) {
        /* Under AddressSanitizer freed memory waits in a quarantine, which would count as kept
         * in the router's resident memory: the group runs without one (no effect otherwise). */
        static char asan[512];
        const char *o = getenv("ASAN_OPTIONS");
        snprintf(asan, sizeof(asan), "%s%squarantine_size_mb=0", o ? o : "", o && *o ? ":" : "");
        setenv("ASAN_OPTIONS", asan, 1);
    }
    int started = group_start(&g, extra) == 0;
    CHECK(started, "group started (%s)", scenario);
    if (started) {
        if (strcmp(scenario, "polls") == 0)
            scenario_polls(&g);
        else if (strcmp(scenario, "conns") == 0)
            scenario_conns(&g);
        else if (strcmp(scenario, "idle") == 0)
            scenario_idle(&g);
        else if (strcmp(scenario, "refused") == 0)
            scenario_refused(&g);
        else
            CHECK(0, "unknown scenario %s", scenario);
        CHECK(group_stop(&g) == 0, "the group stops");
    }
    group_stop(&g);
    return group_finish(&g);
}
