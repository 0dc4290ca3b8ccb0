/* Integration test: every listener of a real group (tiny model on the CPU) survives peers that
 * connect and go away during NNG's SP handshake, and still accepts a real peer afterwards.
 *
 * NNG 1.5.2 (Debian 12's) stops an ipc:// listener for good after one such peer
 * (nanomsg/nng#1518; pagoda links NNG built with scripts/nng.patch). Each scenario sends
 * LISTENER_POKES raw connections to one listener (a plain connect, 1 to 6 random bytes of the
 * 8-byte SP header, close) while the process that owns it is stopped for a moment (see poke),
 * then shows that the listener takes a new peer:
 *
 * usage: listener_test BIN_DIR SCENARIO
 *   client-ipc  the router's client listener on ipc://: a client request is answered
 *   client-tcp  the same on tcp:// (the default transport; not hit by the bug, tested as well)
 *   scheduler   scheduler.ipc: the router is killed, and its replacement links to the scheduler
 *               and serves a request
 *   worker      worker-0.ipc: the worker is killed, and its replacement links to the scheduler,
 *               is resynced and serves a request
 *   control     control.ipc, poked by a second pagoda-supervisor started on the live run dir
 *               (which refuses to start) and by raw peers: the worker is stopped (SIGSTOP), the
 *               scheduler's watchdog report reaches the supervisor, which replaces the worker
 *   kvpool      kvpool.ipc, poked by a second pagoda-kvpool started on the live run dir (which
 *               refuses to start) and by raw peers: a new request for the pool's geometry is
 *               answered, and the group still serves */
#include "common/error.h"
#include "kvpool/kvpool_client.h"
#include "tests/integration/group.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define VOCAB 512
/* Raw peers sent to a listener; one is enough to stop an unpatched NNG's. */
#define LISTENER_POKES 6
/* Bytes a poke writes at most (the SP header is 8: these never complete it). */
#define POKE_MAX_BYTES 7
/* How long the listener is given to see the pokes fail before a real peer comes (times the
 * detection scale). */
#define POKE_SETTLE_MS 300
/* A real peer's call, or a request's whole run, may take this long (times the time scale)
 * before the test gives up. */
#define CALL_TIMEOUT_MS 30000
/* One poll's wait for new tokens. */
#define POLL_WAIT_MS 1000
/* Tries of a call answered "the scheduler link is down" while a restarted router links. */
#define LINK_TRIES 100
#define LINK_RETRY_MS 300

static void sleep_ms(long millis)
{
    struct timespec ts = {millis / 1000, (millis % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* One raw peer: connects to addr, writes i % (POKE_MAX_BYTES + 1) random bytes, closes. Returns
 * 1 when the connection was made. */
static int poke_once(const struct sockaddr *addr, socklen_t len, int i)
{
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int ok = connect(fd, addr, len) == 0;
    size_t n = (size_t)i % (POKE_MAX_BYTES + 1);
    uint8_t bytes[POKE_MAX_BYTES];
    if (ok && n > 0 && getrandom(bytes, n, 0) == (ssize_t)n)
        ok = write(fd, bytes, n) == (ssize_t)n;
    close(fd);
    return ok;
}

/* LISTENER_POKES raw peers to the listener at url (ipc://PATH or tcp://127.0.0.1:PORT) while
 * the process that owns it is stopped (SIGSTOP, then SIGCONT), then time for the listener to see
 * them go. Stopped, it accepts each only after the peer has gone, so that its half of the
 * handshake meets a closed socket every time (EPIPE: what NNG 1.5.2 mistakes for its own close);
 * running, it often writes first, and the peer's close then reads as a reset, which 1.5.2
 * survives. Returns how many connected. */
static int poke(const char *url, pid_t owner)
{
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    struct sockaddr_in in = {.sin_family = AF_INET};
    const struct sockaddr *addr;
    socklen_t len;
    if (strncmp(url, "ipc://", 6) == 0) {
        size_t n = strlen(url + 6);
        if (n >= sizeof(un.sun_path))
            return 0;
        memcpy(un.sun_path, url + 6, n + 1);
        addr = (const struct sockaddr *)&un;
        len = sizeof(un);
    } else {
        const char *colon = strrchr(url, ':');
        in.sin_port = htons((uint16_t)atoi(colon + 1));
        in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        addr = (const struct sockaddr *)&in;
        len = sizeof(in);
    }
    int connected = 0;
    if (owner <= 0 || kill(owner, SIGSTOP) != 0)
        return 0;
    for (int i = 0; i < LISTENER_POKES; i++)
        connected += poke_once(addr, len, i + 1);
    kill(owner, SIGCONT);
    sleep_ms(POKE_SETTLE_MS * group_detect_scale());
    return connected;
}

/* Pokes the listener name ("client" for the client address, else a socket of the run dir)
 * owned by program (NULL: the supervisor). */
static void poke_listener(const struct group *g, const char *name, const char *program)
{
    char url[700];
    if (strcmp(name, "client") == 0)
        snprintf(url, sizeof(url), "%s", g->url);
    else
        snprintf(url, sizeof(url), "ipc://%s/%s", g->run_dir, name);
    pid_t owner = program != NULL ? group_program_pid(g, program) : g->supervisor;
    int n = poke(url, owner);
    CHECK(n == LISTENER_POKES, "%d raw peers connected to %s and dropped mid-handshake", n, url);
}

static pagoda_client *open_client(const struct group *g)
{
    pagoda_client *c = NULL;
    if (pagoda_client_open(g->url, &c) != 0)
        return NULL;
    pagoda_client_set_timeout_ms(c, (uint32_t)(CALL_TIMEOUT_MS * group_time_scale()));
    return c;
}

static long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* A request of 4 tokens: submitted (again while the router answers that its scheduler link is
 * down: a restarted router links within a moment), then polled until it ends or
 * CALL_TIMEOUT_MS (scaled) has passed, when it is cancelled. Returns 0 or the error. */
static int request(const struct group *g, uint32_t seed)
{
    pagoda_client *c = open_client(g);
    if (c == NULL)
        return PAGODA_EIO;
    int32_t prompt[6];
    group_prompt(prompt, 6, seed, VOCAB);
    pagoda_generate_params p = group_greedy(4);
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    int rc = PAGODA_ECLOSED;
    for (int i = 0; i < LINK_TRIES && rc == PAGODA_ECLOSED; i++) {
        if (i > 0)
            sleep_ms(LINK_RETRY_MS);
        rc = pagoda_submit(c, &p, prompt, 6, id);
    }
    uint32_t have = 0;
    pagoda_finish_reason finish = PAGODA_FINISH_NONE;
    long deadline = now_ms() + CALL_TIMEOUT_MS * group_time_scale();
    while (rc == 0 && finish == PAGODA_FINISH_NONE && now_ms() < deadline) {
        pagoda_result r = {0};
        if ((rc = pagoda_poll(c, id, have, POLL_WAIT_MS, &r)) == 0) {
            have += (uint32_t)r.num_tokens;
            finish = r.finish_reason;
        }
        pagoda_result_free(&r);
    }
    if (rc == 0 && finish == PAGODA_FINISH_NONE) {
        pagoda_result r = {0};
        pagoda_cancel(c, id, &r); /* so that the group can drain */
        pagoda_result_free(&r);
        rc = PAGODA_ETIMEDOUT;
    } else if (rc == 0 && (have != 4 || finish != PAGODA_FINISH_LENGTH)) {
        rc = PAGODA_EPROTO;
    }
    pagoda_client_close(c);
    return rc;
}

static int get_stats(const struct group *g, pagoda_engine_stats *st)
{
    pagoda_client *c = open_client(g);
    if (c == NULL)
        return -1;
    int rc = pagoda_stats(c, st);
    pagoda_client_close(c);
    return rc;
}

static void check_request(const struct group *g, uint32_t seed, const char *after)
{
    int rc = request(g, seed);
    CHECK(rc == 0, "after %s, a client request is answered (rc %d)", after, rc);
}

/* kill -9 of a program of the group; then waits (bounded) until the supervisor runs another. */
static void replace(const struct group *g, const char *program)
{
    pid_t old = group_program_pid(g, program);
    CHECK(old > 0 && kill(old, SIGKILL) == 0, "kill -9 of %s %d", program, (int)old);
    pid_t now = old;
    for (int i = 0; i < 600 && (now <= 0 || now == old); i++) {
        sleep_ms(100);
        now = group_program_pid(g, program);
    }
    CHECK(now > 0 && now != old, "the supervisor started another %s (%d)", program, (int)now);
}

static void scenario_client(struct group *g)
{
    CHECK(group_start(g, NULL) == 0, "group started, clients on %s", g->url);
    check_request(g, 1, "start");
    poke_listener(g, "client", "pagoda-router");
    check_request(g, 2, "the raw peers");
    CHECK(group_stop(g) == 0, "the group stops");
}

/* A TCP port free a moment ago on the loopback, or 0. */
static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    int port = 0;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void scenario_scheduler(struct group *g)
{
    CHECK(group_start(g, NULL) == 0, "group started");
    check_request(g, 1, "start");
    poke_listener(g, "scheduler.ipc", "pagoda-scheduler");
    replace(g, "pagoda-router");
    check_request(g, 2, "the raw peers and a new router");
    CHECK(group_stop(g) == 0, "the group stops");
}

static void scenario_worker(struct group *g)
{
    CHECK(group_start(g, NULL) == 0, "group started");
    check_request(g, 1, "start");
    pagoda_engine_stats before = {0}, after = {0};
    CHECK(get_stats(g, &before) == 0, "stats (resyncs %llu, worker restarts %llu)",
          (unsigned long long)before.resyncs, (unsigned long long)before.worker_restarts);
    poke_listener(g, "worker-0.ipc", "pagoda-scheduler");
    replace(g, "pagoda-worker");
    check_request(g, 2, "the raw peers and a new worker");
    CHECK(get_stats(g, &after) == 0 && after.resyncs > before.resyncs &&
              after.worker_restarts > before.worker_restarts,
          "the new worker was resynced (resyncs %llu, worker restarts %llu)",
          (unsigned long long)after.resyncs, (unsigned long long)after.worker_restarts);
    CHECK(group_stop(g) == 0, "the group stops");
}

/* A second program (argv, NULL-terminated; argv[0] a program name in g's bin dir) on g's live
 * run dir: it must refuse to start, saying its listener's socket is in use, within a bound. Its
 * nng_listen finds out by connecting to the live socket and going away: one more raw peer. */
static void second_instance(const struct group *g, const char *const *argv)
{
    char prog[1100], log[700], cmd[1600];
    snprintf(prog, sizeof(prog), "%s/%s", g->bin_dir, argv[0]);
    snprintf(log, sizeof(log), "%s/second-%s.log", g->tmp, argv[0]);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return;
    if (pid == 0) {
        if (freopen(log, "w", stderr) == NULL || freopen(log, "a", stdout) == NULL)
            _exit(127);
        execv(prog, (char *const *)argv);
        _exit(127);
    }
    int status = 0, done = 0;
    for (long i = 0; i < 300 * group_time_scale() && !done; i++) {
        done = waitpid(pid, &status, WNOHANG) == pid;
        if (!done)
            sleep_ms(100);
    }
    if (!done) {
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
    }
    /* The supervisor is refused by the run directory's lock before it listens; kvpool by its
     * socket being in use. */
    snprintf(cmd, sizeof(cmd), "grep -Eq 'in use|already running' '%s'", log);
    CHECK(done && WIFEXITED(status) && WEXITSTATUS(status) != 0 && WEXITSTATUS(status) != 127 &&
              system(cmd) == 0,
          "a second %s on the live run dir refuses to start (status %d)", argv[0], status);
    sleep_ms(POKE_SETTLE_MS * group_detect_scale());
}

static void scenario_control(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_detect_ms(1500),
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_detect_ms(500),
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    check_request(g, 1, "start");
    const char *argv[] = {"pagoda-supervisor", "--run-dir", g->run_dir, "--bin-dir", g->bin_dir,
                          "--model",           g->model,    "--listen", g->url,      NULL};
    second_instance(g, argv);
    poke_listener(g, "control.ipc", NULL);
    pid_t hung = group_worker_pid(g);
    CHECK(hung > 0 && kill(hung, SIGSTOP) == 0, "SIGSTOP to worker %d", (int)hung);
    check_request(g, 2, "the raw peers and a hung worker");
    pagoda_engine_stats st = {0};
    CHECK(get_stats(g, &st) == 0 && st.worker_restarts >= 1,
          "the supervisor replaced the hung worker (worker restarts %llu)",
          (unsigned long long)st.worker_restarts);
    char cmd[800];
    snprintf(cmd, sizeof(cmd), "grep -qi 'hung' '%s/supervisor.log'", g->tmp);
    CHECK(system(cmd) == 0, "the supervisor logged the watchdog's report");
    /* Whatever happened, the stopped worker must not outlive the test. */
    if (hung > 0 && group_program_pid(g, "pagoda-worker") == hung)
        kill(hung, SIGKILL);
    CHECK(group_stop(g) == 0, "the group stops");
}

static void scenario_kvpool(struct group *g)
{
    CHECK(group_start(g, NULL) == 0, "group started");
    const char *argv[] = {"pagoda-kvpool", "--run-dir", g->run_dir, "--model", g->model, NULL};
    second_instance(g, argv);
    poke_listener(g, "kvpool.ipc", "pagoda-kvpool");
    struct kv_geometry geo;
    int rc = kvpool_fetch_geometry(g->run_dir, -1, (int)(CALL_TIMEOUT_MS * group_time_scale()),
                                   NULL, &geo, NULL, 0);
    CHECK(rc == 0 && geo.num_blocks > 0,
          "after the raw peers, kvpool answers a new request (rc %d, %d blocks)", rc,
          rc == 0 ? (int)geo.num_blocks : -1);
    check_request(g, 1, "the raw peers to kvpool");
    CHECK(group_stop(g) == 0, "the group stops");
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: listener_test BIN_DIR "
                        "client-ipc|client-tcp|scheduler|worker|control|kvpool\n");
        return 2;
    }
    const char *s = argv[2];
    struct group g;
    int rc = group_setup(&g, argv[1], 0);
    if (rc != 0)
        return rc;
    if (strcmp(s, "client-ipc") == 0) {
        scenario_client(&g);
    } else if (strcmp(s, "client-tcp") == 0) {
        int port = free_port();
        CHECK(port > 0, "a free TCP port (%d)", port);
        snprintf(g.url, sizeof(g.url), "tcp://127.0.0.1:%d", port);
        scenario_client(&g);
    } else if (strcmp(s, "scheduler") == 0) {
        scenario_scheduler(&g);
    } else if (strcmp(s, "worker") == 0) {
        scenario_worker(&g);
    } else if (strcmp(s, "control") == 0) {
        scenario_control(&g);
    } else if (strcmp(s, "kvpool") == 0) {
        scenario_kvpool(&g);
    } else {
        fprintf(stderr, "unknown scenario %s\n", s);
        group_cleanup(&g);
        return 2;
    }
    group_stop(&g);
    return group_finish(&g);
}
