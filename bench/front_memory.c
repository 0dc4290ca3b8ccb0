/* front_memory: the router's resident memory under hostile connections, against the bound the
 * README states (router/router.h: the client message limit; --max-connections).
 *
 * Starts pagoda-router alone (no scheduler: the client message limit is then the one sized from
 * --max-prompt-tokens, 131,072 by default, the largest the router ever uses without a model
 * that reports a longer context) on tcp://127.0.0.1:PORT and measures its VmRSS:
 *
 *   1. at rest;
 *   2. with PARTIAL connections each holding a maximum-size message but for its last byte;
 *   3. after they left;
 *   4. with IDLE connections that completed the SP handshake and send nothing (from four child
 *      processes, as one process may not hold them all), with a health check made meanwhile.
 *
 * usage: front_memory BIN_DIR [PARTIAL [IDLE [ROUTER_FLAG...]]]   (defaults 1000 and 20000)
 *
 * Prints one line per phase and the bound: rest + connections x (message limit + per-connection
 * allowance). Exits 1 when a measurement exceeds its bound or the health check goes unanswered. */
#include "client/pagoda.h"
#include "router/router.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define PORT 17461
#define IDLE_PROCS 4
/* What NNG and the router hold per connection beside the message (pipe, buffers, table node):
 * the allowance the README's bound uses. */
#define PER_CONNECTION_KIB 16

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

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

static long open_fds(pid_t pid)
{
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "ls /proc/%d/fd | wc -l", (int)pid);
    FILE *p = popen(cmd, "r");
    long n = -1;
    if (p != NULL) {
        if (fscanf(p, "%ld", &n) != 1)
            n = -1;
        pclose(p);
    }
    return n;
}

/* A TCP connection that completed the SP handshake as a REQ peer, or -1. */
static int sp_connect(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(PORT)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    static const uint8_t hdr[8] = {0, 'S', 'P', 0, 0, 48, 0, 0};
    uint8_t peer[8];
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 ||
        write(fd, hdr, sizeof(hdr)) != (ssize_t)sizeof(hdr) || poll(&pfd, 1, 10000) != 1 ||
        read(fd, peer, sizeof(peer)) != (ssize_t)sizeof(peer)) {
        close(fd);
        return -1;
    }
    return fd;
}

static int still_open(int fd)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    if (poll(&pfd, 1, 0) != 1)
        return 1;
    char b;
    return !(read(fd, &b, 1) <= 0);
}

static void raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

/* A child holding n idle connections: reports how many are still open after settle_ms, then
 * holds them until its parent's pipe closes. */
static void idle_child(int n, int report_fd, int hold_fd, long settle_ms)
{
    int *fds = malloc((size_t)n * sizeof(*fds));
    for (int i = 0; i < n; i++)
        fds[i] = sp_connect();
    sleep_ms(settle_ms);
    int open = 0;
    for (int i = 0; i < n; i++)
        open += fds[i] >= 0 && still_open(fds[i]);
    if (write(report_fd, &open, sizeof(open)) != (ssize_t)sizeof(open))
        _exit(1);
    char b;
    while (read(hold_fd, &b, 1) > 0)
        ;
    _exit(0);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: front_memory BIN_DIR [PARTIAL [IDLE [ROUTER_FLAG...]]]\n");
        return 2;
    }
    int partial = argc > 2 ? atoi(argv[2]) : 1000;
    int idle = argc > 3 ? atoi(argv[3]) : 20000;
    signal(SIGPIPE, SIG_IGN);
    raise_nofile();
    char dir[] = "/tmp/pagoda-front-memory-XXXXXX";
    if (mkdtemp(dir) == NULL)
        return 1;
    char prog[1100], url[64];
    snprintf(prog, sizeof(prog), "%s/pagoda-router", argv[1]);
    snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", PORT);
    const char *rargv[64] = {prog, "--run-dir", dir, "--listen", url, "--log-level", "warn"};
    int n = 7;
    for (int i = 4; i < argc && n < 62; i++)
        rargv[n++] = argv[i];
    rargv[n] = NULL;
    pid_t router = fork();
    if (router == 0) {
        execv(prog, (char *const *)rargv);
        _exit(127);
    }
    int fd = -1;
    for (int i = 0; i < 100 && fd < 0; i++) {
        sleep_ms(50);
        fd = sp_connect();
    }
    if (fd < 0) {
        fprintf(stderr, "the router did not listen on %s\n", url);
        kill(router, SIGKILL);
        return 1;
    }
    close(fd);
    sleep_ms(500);
    int status = 0;
    /* The router's own figures: its connection cap and message limit. */
    uint32_t max_prompt = ROUTER_DEFAULT_MAX_PROMPT_TOKENS;
    uint32_t cap = ROUTER_DEFAULT_MAX_CONNECTIONS;
    for (int i = 4; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--max-prompt-tokens") == 0)
            max_prompt = (uint32_t)atol(argv[i + 1]);
        if (strcmp(argv[i], "--max-connections") == 0)
            cap = (uint32_t)atol(argv[i + 1]);
    }
    size_t limit = router_max_message_bytes(max_prompt);
    long rest = rss_kib(router);
    printf("router at rest: VmRSS %ld KiB; message limit %zu bytes, connection cap %u\n", rest,
           limit, cap);

    /* 2. Partial maximum-size messages. */
    int *fds = malloc((size_t)(partial > 0 ? partial : 1) * sizeof(*fds));
    uint8_t *body = calloc(1, limit);
    int holding = 0;
    for (int i = 0; i < partial; i++) {
        fds[i] = sp_connect();
        if (fds[i] < 0)
            continue;
        uint8_t len[8];
        for (int k = 0; k < 8; k++)
            len[k] = (uint8_t)((uint64_t)limit >> (56 - 8 * k));
        size_t off = 0;
        if (write(fds[i], len, 8) != 8)
            continue;
        while (off < limit - 1) {
            ssize_t w = write(fds[i], body + off, limit - 1 - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
        holding += off == limit - 1;
    }
    sleep_ms(1000);
    long with_partial = rss_kib(router);
    int partial_open = 0;
    for (int i = 0; i < partial; i++)
        partial_open += fds[i] >= 0 && still_open(fds[i]);
    long conns = partial_open < (int)cap ? partial_open : (long)cap;
    long bound = rest + conns * (long)(limit / 1024 + PER_CONNECTION_KIB);
    printf("%d connections holding %zu of %zu bytes each (%d still open): VmRSS %ld KiB "
           "(+%ld); bound rest + %ld x (%zu + %d) KiB = %ld KiB: %s\n",
           holding, limit - 1, limit, partial_open, with_partial, with_partial - rest, conns,
           limit / 1024, PER_CONNECTION_KIB, bound, with_partial <= bound ? "within" : "OVER");
    if (with_partial > bound)
        status = 1;
    for (int i = 0; i < partial; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    free(body);
    sleep_ms(2000);
    long after = rss_kib(router);
    printf("after they left: VmRSS %ld KiB (+%ld over rest)\n", after, after - rest);

    /* 4. Idle connections from child processes. */
    int report[2], hold[2];
    if (pipe(report) != 0 || pipe(hold) != 0)
        return 1;
    pid_t kids[IDLE_PROCS];
    for (int k = 0; k < IDLE_PROCS; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            close(hold[1]);
            close(report[0]);
            idle_child(idle / IDLE_PROCS, report[1], hold[0], 3000);
        }
    }
    close(hold[0]);
    close(report[1]);
    int idle_open = 0;
    for (int k = 0; k < IDLE_PROCS; k++) {
        int v = 0;
        if (read(report[0], &v, sizeof(v)) == (ssize_t)sizeof(v))
            idle_open += v;
    }
    long with_idle = rss_kib(router);
    long fds_open = open_fds(router);
    pagoda_client *c = NULL;
    int healthy = -1, rc = pagoda_client_open(url, &c);
    if (rc == 0) {
        pagoda_client_set_timeout_ms(c, 10000);
        rc = pagoda_health(c, &healthy);
    }
    pagoda_client_close(c);
    conns = idle_open < (int)cap ? idle_open : (long)cap;
    bound = after + conns * (long)PER_CONNECTION_KIB;
    printf("%d idle connections made, %d still open: VmRSS %ld KiB (+%ld over rest), %ld "
           "descriptors open; bound %ld + %ld x %d KiB = %ld KiB: %s; health check %s\n",
           idle, idle_open, with_idle, with_idle - rest, fds_open, after, conns, PER_CONNECTION_KIB,
           bound, with_idle <= bound ? "within" : "OVER", rc == 0 ? "answered" : "NOT answered");
    if (with_idle > bound || rc != 0 || idle_open > (int)cap)
        status = 1;
    close(hold[1]);
    for (int k = 0; k < IDLE_PROCS; k++)
        waitpid(kids[k], NULL, 0);
    kill(router, SIGKILL);
    waitpid(router, NULL, 0);
    char rm[128];
    snprintf(rm, sizeof(rm), "rm -rf %s", dir);
    if (system(rm) != 0)
        status = 1;
    return status;
}
