/* Several engines behind one router (issue 20), on one host: two engine groups (a supervisor
 * each, with its kvpool, worker and scheduler; the group's own router points nowhere) and one
 * pagoda-router started by the test with a --scheduler flag per engine.
 *
 *   spread    a shared prefix goes to one engine (cache-aware routing), distinct prompts go to
 *             both; Stats sums the engines and lists each one; on the same shape of workload
 *             (three shared prefixes, requests one after the other) cache-aware routing gets
 *             more prefix-cache hits than round robin; `pagoda stats --json` lists the routing
 *             and each engine (connected, its routed requests adding up to those sent), and
 *             pagoda-gateway's /metrics has the per-engine series (promtool passes, the same
 *             figures)
 *   failover  kill -9 of one engine's scheduler and worker amid 32 requests: all complete,
 *             greedy outputs equal pagoda-run's, the engine's requests moved to the other one,
 *             and once it is back it takes new work again */
#include "common/error.h"
#include "tests/integration/group.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define VOCAB 512
#define ENGINES 2
#define JOBS 32

struct job {
    pagoda_client *client;
    int32_t prompt[256];
    size_t prompt_len;
    int32_t max_tokens;
    pagoda_result result;
    int rc;
};

static struct group engines[ENGINES];
static struct group front; /* the test's router: url and tmp */
static pid_t router_pid, gateway_pid;
static atomic_int started_jobs;

static void sleep_ms(long millis)
{
    struct timespec ts = {millis / 1000, (millis % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Starts the engine groups, each with its own router pointed at an address nobody listens on
 * (the test's router holds the schedulers' links). */
static int start_engines(void)
{
    for (int i = 0; i < ENGINES; i++) {
        char nowhere[700];
        snprintf(nowhere, sizeof(nowhere), "ipc://%s/nowhere.ipc", engines[i].tmp);
        /* clang-format off */
        const char *extra[] = {
            "--worker-arg", "--step-delay-ms", "--worker-arg", "30",
            "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_ms(2000),
            "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_ms(10000),
            "--router-arg", "--scheduler", "--router-arg", nowhere,
            NULL};
        /* clang-format on */
        if (group_start(&engines[i], extra) != 0)
            return -1;
    }
    return 0;
}

/* One raw Stats call to the test's router (admin-free: no tenants file). */
static Pagoda__ClientResponse *raw_stats(void)
{
    Pagoda__StatsRequest sreq = PAGODA__STATS_REQUEST__INIT;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.has_protocol_version = 1;
    req.protocol_version = 1;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_STATS;
    req.stats = &sreq;
    uint8_t buf[256];
    size_t len = pagoda__client_request__pack(&req, buf);
    return group_raw_call(&front, buf, len, 5000);
}

/* Each engine's routed count (Stats.engines), and how many are connected. */
static int engine_figures(uint64_t routed[ENGINES], int *connected)
{
    Pagoda__ClientResponse *resp = raw_stats();
    int rc = -1;
    *connected = 0;
    if (resp != NULL && resp->stats != NULL && resp->stats->n_engines == ENGINES) {
        for (size_t i = 0; i < ENGINES; i++) {
            routed[i] = resp->stats->engines[i]->routed;
            *connected += resp->stats->engines[i]->connected;
        }
        rc = 0;
    }
    if (resp != NULL)
        pagoda__client_response__free_unpacked(resp, NULL);
    return rc;
}

static int start_router(const char *routing)
{
    char bin[1100], log[700], run[300], s0[700], s1[700];
    snprintf(bin, sizeof(bin), "%s/pagoda-router", engines[0].bin_dir);
    snprintf(log, sizeof(log), "%s/router.log", front.tmp);
    snprintf(run, sizeof(run), "%s/front-run", front.tmp);
    snprintf(s0, sizeof(s0), "ipc://%s/scheduler.ipc", engines[0].run_dir);
    snprintf(s1, sizeof(s1), "ipc://%s/scheduler.ipc", engines[1].run_dir);
    snprintf(front.url, sizeof(front.url), "ipc://%s/front.ipc", front.tmp);
    snprintf(front.run_dir, sizeof(front.run_dir), "%s", run);
    mkdir(run, 0700);
    fflush(NULL);
    router_pid = fork();
    if (router_pid < 0)
        return -1;
    if (router_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (freopen(log, "w", stderr) == NULL || freopen(log, "a", stdout) == NULL)
            _exit(127);
        execl(bin, bin, "--run-dir", run, "--listen", front.url, "--scheduler", s0, "--scheduler",
              s1, "--routing", routing, "--stats-timeout-ms", group_ms(2000), "--log-level", "info",
              (char *)NULL);
        _exit(127);
    }
    /* Ready when both engines are linked (60 s, scaled). */
    for (long t = 0; t < 600 * group_time_scale(); t++) {
        uint64_t routed[ENGINES];
        int connected = 0;
        if (engine_figures(routed, &connected) == 0 && connected == ENGINES)
            return 0;
        sleep_ms(100);
    }
    return -1;
}

/* SIGTERM: the router drains (nothing is running) and exits 0; a leak or an error (the
 * sanitizer build) makes it exit otherwise. */
static int stop_router(void)
{
    if (router_pid <= 0)
        return -1;
    kill(router_pid, SIGTERM);
    int status = -1;
    for (long t = 0; t < 300 * group_time_scale(); t++) {
        if (waitpid(router_pid, &status, WNOHANG) == router_pid) {
            router_pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        sleep_ms(100);
    }
    kill(router_pid, SIGKILL);
    waitpid(router_pid, NULL, 0);
    router_pid = 0;
    return -1;
}

static void *run_job(void *arg)
{
    struct job *j = arg;
    pagoda_generate_params p = group_greedy(j->max_tokens);
    j->rc = pagoda_generate(j->client, &p, j->prompt, j->prompt_len, &j->result);
    return NULL;
}

static void on_tokens(void *user, uint32_t offset, const int32_t *ids, const float *lp, size_t n)
{
    (void)user, (void)ids, (void)lp;
    if (offset == 0 && n > 0)
        atomic_fetch_add(&started_jobs, 1);
}

static void *run_job_stream(void *arg)
{
    struct job *j = arg;
    pagoda_generate_params p = group_greedy(j->max_tokens);
    j->rc =
        pagoda_generate_stream(j->client, &p, j->prompt, j->prompt_len, on_tokens, j, &j->result);
    return NULL;
}

/* Runs n jobs at once; calls during() once every job has its first token (when not NULL). */
static void run_jobs(struct job *jobs, int n, void (*during)(void))
{
    pagoda_client *client;
    if (pagoda_client_open(front.url, &client) != 0) {
        for (int i = 0; i < n; i++)
            jobs[i].rc = PAGODA_EIO;
        return;
    }
    pagoda_client_set_timeout_ms(client, (uint32_t)(120000 * group_time_scale()));
    pthread_t threads[JOBS];
    atomic_store(&started_jobs, 0);
    for (int i = 0; i < n; i++) {
        jobs[i].client = client;
        pthread_create(&threads[i], NULL, during ? run_job_stream : run_job, &jobs[i]);
    }
    if (during != NULL) {
        for (long t = 0; t < 6000 * group_time_scale() && atomic_load(&started_jobs) < n; t++)
            sleep_ms(10);
        during();
    }
    for (int i = 0; i < n; i++)
        pthread_join(threads[i], NULL);
    pagoda_client_close(client);
}

/* How many jobs' greedy outputs differ from pagoda-run's. */
static int compare_with_pagoda_run(struct job *jobs, int n, int32_t max_tokens)
{
    int32_t *prompts[JOBS], *want[JOBS];
    size_t lens[JOBS], want_len[JOBS];
    for (int i = 0; i < n; i++) {
        prompts[i] = jobs[i].prompt;
        lens[i] = jobs[i].prompt_len;
    }
    if (group_expected(&engines[0], prompts, lens, n, max_tokens, want, want_len) != 0)
        return n;
    int differ = 0;
    for (int i = 0; i < n; i++) {
        size_t m = (size_t)jobs[i].max_tokens;
        int same = jobs[i].rc == 0 && jobs[i].result.num_tokens == m && want_len[i] >= m &&
                   memcmp(jobs[i].result.token_ids, want[i], m * sizeof(int32_t)) == 0;
        if (!same) {
            differ++;
            printf("     job %d: rc %d, %zu tokens (want %zu)\n", i, jobs[i].rc,
                   jobs[i].result.num_tokens, m);
        }
        free(want[i]);
    }
    return differ;
}

static void free_jobs(struct job *jobs, int n)
{
    for (int i = 0; i < n; i++)
        pagoda_result_free(&jobs[i].result);
}

/* ---- scenarios ------------------------------------------------------------------------ */

static struct job jobs[JOBS];

/* The engines' prefix hit tokens so far (Stats). */
static uint64_t hit_tokens(void)
{
    pagoda_client *c;
    pagoda_engine_stats st = {0};
    if (pagoda_client_open(front.url, &c) != 0)
        return 0;
    if (pagoda_stats(c, &st) != 0)
        st.prefix_hit_tokens = 0;
    pagoda_client_close(c);
    return st.prefix_hit_tokens;
}

/* Three prefixes of 64 tokens (from seed), six requests each with its own tail, one after the
 * other in turn (A B C A B C ...). Returns the prefix hit tokens they added; *ok counts those
 * that completed. */
static uint64_t prefix_workload(uint32_t seed, int *ok)
{
    uint64_t before = hit_tokens();
    *ok = 0;
    for (int i = 0; i < 18; i++) {
        struct job j;
        memset(&j, 0, sizeof(j));
        j.prompt_len = 72;
        group_prompt(j.prompt, 64, seed + (uint32_t)(i % 3), VOCAB);
        group_prompt(j.prompt + 64, 8, seed + 100 + (uint32_t)i, VOCAB);
        j.max_tokens = 4;
        run_jobs(&j, 1, NULL);
        *ok += j.rc == 0;
        free_jobs(&j, 1);
    }
    return hit_tokens() - before;
}

/* The scheduler address of engine i, as the test's router was given it. */
static void engine_address(int i, char *out, size_t len)
{
    snprintf(out, len, "ipc://%s/scheduler.ipc", engines[i].run_dir);
}

/* `pagoda stats --json` and `pagoda stats` against the test's router, with `routed` requests
 * sent since it started and `hit_tokens` the engines' summed prefix hits (pagoda_stats, no
 * request in between): the routing and both engines are listed, each connected, with its
 * address; their routed counts add up to the requests sent and their prefix hits to the sum. */
static void check_cli_engines(uint64_t routed, uint64_t hit_tokens)
{
    char cmd[2400], path[700];
    snprintf(path, sizeof(path), "%s/stats.json", front.tmp);
    snprintf(cmd, sizeof(cmd), "'%s/pagoda' --url '%s' stats --json >'%s'", front.bin_dir,
             front.url, path);
    int rc = system(cmd);
    json_error_t err;
    json_t *doc = rc == 0 ? json_load_file(path, 0, &err) : NULL;
    CHECK(doc != NULL, "pagoda stats --json prints JSON (exit %d)", rc);
    const char *routing = json_string_value(json_object_get(doc, "routing"));
    CHECK(routing != NULL && strcmp(routing, "cache-aware") == 0,
          "pagoda stats --json names the routing (%s)", routing ? routing : "none");
    json_t *list = json_object_get(doc, "engines");
    CHECK(json_is_array(list) && json_array_size(list) == ENGINES,
          "pagoda stats --json lists %d engines (%zu)", ENGINES, json_array_size(list));
    uint64_t sum_routed = 0, sum_hits = 0;
    int connected = 0, addressed = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *e = json_array_get(list, i);
        char want[700];
        engine_address((int)i, want, sizeof(want));
        const char *address = json_string_value(json_object_get(e, "address"));
        addressed += json_integer_value(json_object_get(e, "engine")) == (json_int_t)i &&
                     address != NULL && strcmp(address, want) == 0;
        connected += json_is_true(json_object_get(e, "connected"));
        sum_routed += (uint64_t)json_integer_value(json_object_get(e, "routed"));
        sum_hits += (uint64_t)json_integer_value(json_object_get(e, "prefix_hit_tokens"));
        CHECK(json_is_integer(json_object_get(e, "load")) &&
                  json_is_integer(json_object_get(e, "running")) &&
                  json_is_integer(json_object_get(e, "waiting")) &&
                  json_is_integer(json_object_get(e, "prefix_query_tokens")),
              "engine %zu has its load, running, waiting and prefix lookups", i);
    }
    CHECK(addressed == ENGINES && connected == ENGINES,
          "each engine has its index and address (%d) and is connected (%d)", addressed, connected);
    CHECK(sum_routed == routed, "the engines' routed counts add up to the %llu requests (%llu)",
          (unsigned long long)routed, (unsigned long long)sum_routed);
    CHECK(sum_hits == hit_tokens, "their prefix hits add up to Stats' (%llu of %llu)",
          (unsigned long long)sum_hits, (unsigned long long)hit_tokens);
    json_decref(doc);

    /* The text form: the routing and a row per engine ending in its address. */
    snprintf(path, sizeof(path), "%s/stats.txt", front.tmp);
    snprintf(cmd, sizeof(cmd), "'%s/pagoda' --url '%s' stats >'%s'", front.bin_dir, front.url,
             path);
    rc = system(cmd);
    FILE *f = rc == 0 ? fopen(path, "r") : NULL;
    char line[1024];
    int routing_line = 0, rows = 0;
    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        routing_line += strcmp(line, "routing cache-aware\n") == 0;
        for (int i = 0; i < ENGINES; i++) {
            char want[700], head[16];
            engine_address(i, want, sizeof(want));
            snprintf(head, sizeof(head), "%d ", i);
            size_t n = strlen(line), w = strlen(want);
            rows += strncmp(line, head, strlen(head)) == 0 && n > w &&
                    strncmp(line + n - w - 1, want, w) == 0;
        }
    }
    if (f != NULL)
        fclose(f);
    CHECK(routing_line == 1 && rows == ENGINES,
          "pagoda stats prints the routing and a row per engine (%d, %d rows)", routing_line, rows);
}

/* The body of GET path from 127.0.0.1:port (malloc'd, NUL-terminated), or NULL. Reads at most
 * 1 MiB, for at most 5 s (scaled) without data. */
static char *http_get(int port, const char *path)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return NULL;
    struct timeval tv = {5 * group_time_scale(), 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    char req[256];
    int n = snprintf(req, sizeof(req),
                     "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n", path);
    const size_t cap = 1u << 20;
    char *buf = malloc(cap + 1);
    size_t len = 0;
    if (buf == NULL || connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0 ||
        send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        free(buf);
        close(fd);
        return NULL;
    }
    ssize_t got;
    while (len < cap && (got = recv(fd, buf + len, cap - len, 0)) > 0)
        len += (size_t)got;
    close(fd);
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    if (strncmp(buf, "HTTP/1.1 200", 12) != 0 || body == NULL) {
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

/* The value of the sample of family name with engine i's labels in the page text, or -1. */
static double engine_sample(const char *text, const char *name, int i)
{
    char address[700], head[1000];
    engine_address(i, address, sizeof(address));
    snprintf(head, sizeof(head), "\n%s{engine=\"%d\",address=\"%s\"} ", name, i, address);
    const char *p = strstr(text, head);
    return p ? strtod(p + strlen(head), NULL) : -1.0;
}

/* pagoda-gateway in front of the test's router: its /metrics passes promtool and has each
 * engine's series, with the figures of `pagoda stats --json` (no request in between). */
static void check_gateway_engines(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0), port = 0;
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof(a);
    if (s >= 0 && bind(s, (struct sockaddr *)&a, sizeof(a)) == 0 &&
        getsockname(s, (struct sockaddr *)&a, &alen) == 0)
        port = ntohs(a.sin_port);
    if (s >= 0)
        close(s);
    char bin[1100], log[700], listen[64];
    snprintf(bin, sizeof(bin), "%s/pagoda-gateway", front.bin_dir);
    snprintf(log, sizeof(log), "%s/gateway.log", front.tmp);
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", port);
    fflush(NULL);
    gateway_pid = port > 0 ? fork() : -1;
    if (gateway_pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (freopen(log, "w", stderr) == NULL || freopen(log, "a", stdout) == NULL)
            _exit(127);
        execl(bin, bin, "--router", front.url, "--listen", listen, (char *)NULL);
        _exit(127);
    }
    char *page = NULL;
    for (long t = 0; gateway_pid > 0 && page == NULL && t < 300 * group_time_scale(); t++) {
        page = http_get(port, "/metrics");
        if (page == NULL)
            sleep_ms(100);
    }
    CHECK(page != NULL, "pagoda-gateway in front of the router serves /metrics");
    char path[700], cmd[1600];
    snprintf(path, sizeof(path), "%s/metrics.txt", front.tmp);
    FILE *f = page ? fopen(path, "w") : NULL;
    if (f != NULL) {
        fputs(page, f);
        fclose(f);
    }
    snprintf(cmd, sizeof(cmd), "promtool check metrics <'%s'", path);
    CHECK(f != NULL && system(cmd) == 0, "promtool check metrics passes on it");
    json_error_t err;
    snprintf(path, sizeof(path), "%s/stats.json", front.tmp);
    json_t *doc = json_load_file(path, 0, &err), *list = json_object_get(doc, "engines");
    /* The last figures of `pagoda stats --json` (check_cli_engines) are still the engines'. */
    static const struct {
        const char *family, *field;
    } same[] = {{"pagoda_engine_routed_total", "routed"},
                {"pagoda_engine_prefix_query_tokens_total", "prefix_query_tokens"},
                {"pagoda_engine_prefix_hit_tokens_total", "prefix_hit_tokens"},
                {"pagoda_engine_running", "running"},
                {"pagoda_engine_waiting", "waiting"},
                {"pagoda_engine_load", "load"},
                {"pagoda_engine_prefix_waits_total", "prefix_waits"}};
    for (int i = 0; i < ENGINES; i++) {
        json_t *e = json_array_get(list, (size_t)i);
        CHECK(page && engine_sample(page, "pagoda_engine_up", i) == 1.0,
              "/metrics: pagoda_engine_up{engine=\"%d\",address=...} is 1", i);
        for (size_t k = 0; k < sizeof(same) / sizeof(same[0]); k++) {
            double got = page ? engine_sample(page, same[k].family, i) : -1.0;
            json_int_t want = json_integer_value(json_object_get(e, same[k].field));
            CHECK(e != NULL && got == (double)want, "/metrics: %s of engine %d is %lld (%g)",
                  same[k].family, i, (long long)want, got);
        }
    }
    /* An engine-wide counter: the engines' sum, as `pagoda stats` shows it. */
    const char *waits = page ? strstr(page, "\npagoda_prefix_waits_total ") : NULL;
    json_int_t want_waits = json_integer_value(json_object_get(doc, "prefix_waits"));
    CHECK(waits != NULL && json_object_get(doc, "prefix_waits") != NULL &&
              strtod(waits + strlen("\npagoda_prefix_waits_total "), NULL) == (double)want_waits,
          "/metrics: pagoda_prefix_waits_total is pagoda stats' prefix_waits (%lld)",
          (long long)want_waits);
    CHECK(page && strstr(page, "\n# TYPE pagoda_engine_routed_total counter\n") &&
              strstr(page, "\n# HELP pagoda_engine_load ") && !strstr(page, "\npagoda_engine_up "),
          "/metrics: HELP and TYPE lines, and no unlabelled pagoda_engine_up beside the engines'");
    json_decref(doc);
    free(page);
    /* SIGTERM: it exits 0 (a leak or an error in the sanitizer build makes it exit otherwise). */
    int status = -1;
    if (gateway_pid > 0) {
        kill(gateway_pid, SIGTERM);
        waitpid(gateway_pid, &status, 0);
        gateway_pid = 0;
    }
    CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0,
          "pagoda-gateway stops cleanly (status %d)", status);
}

static void scenario_spread(void)
{
    CHECK(start_engines() == 0, "two engine groups started");
    CHECK(start_router("cache-aware") == 0, "the router links both engines");
    uint64_t before[ENGINES] = {0}, after[ENGINES] = {0};
    int connected;
    /* A shared prefix of 96 tokens (6 blocks of 16) with distinct tails, one request after the
     * other: every one goes where the first went. */
    memset(jobs, 0, sizeof(jobs));
    for (int i = 0; i < 8; i++) {
        jobs[i].prompt_len = 104;
        group_prompt(jobs[i].prompt, 96, 4242, VOCAB);
        group_prompt(jobs[i].prompt + 96, 8, (uint32_t)i + 100, VOCAB);
        jobs[i].max_tokens = 8;
    }
    engine_figures(before, &connected);
    for (int i = 0; i < 8; i++)
        run_jobs(&jobs[i], 1, NULL);
    engine_figures(after, &connected);
    uint64_t d0 = after[0] - before[0], d1 = after[1] - before[1];
    CHECK((d0 == 8 && d1 == 0) || (d0 == 0 && d1 == 8),
          "a shared prefix went to one engine (engine 0: %llu, engine 1: %llu)",
          (unsigned long long)d0, (unsigned long long)d1);
    CHECK(compare_with_pagoda_run(jobs, 8, 8) == 0, "their greedy outputs equal pagoda-run's");
    free_jobs(jobs, 8);

    /* Distinct prompts at once: both engines take some. */
    memset(jobs, 0, sizeof(jobs));
    for (int i = 0; i < 16; i++) {
        jobs[i].prompt_len = 20 + (size_t)(i * 37) % 60;
        group_prompt(jobs[i].prompt, jobs[i].prompt_len, (uint32_t)i + 1, VOCAB);
        jobs[i].max_tokens = 8 + i % 5;
    }
    memcpy(before, after, sizeof(before));
    run_jobs(jobs, 16, NULL);
    engine_figures(after, &connected);
    d0 = after[0] - before[0];
    d1 = after[1] - before[1];
    CHECK(d0 + d1 == 16 && d0 >= 4 && d1 >= 4,
          "16 distinct prompts spread over both engines (%llu and %llu)", (unsigned long long)d0,
          (unsigned long long)d1);
    int ok = 0;
    for (int i = 0; i < 16; i++)
        ok += jobs[i].rc == 0;
    CHECK(ok == 16, "all 16 completed (%d)", ok);
    CHECK(compare_with_pagoda_run(jobs, 16, 12) == 0, "their greedy outputs equal pagoda-run's");
    free_jobs(jobs, 16);

    /* Stats sums the engines: the prefix cache served the shared prefix. */
    pagoda_client *c;
    pagoda_engine_stats st = {0};
    int rc = pagoda_client_open(front.url, &c);
    if (rc == 0) {
        rc = pagoda_stats(c, &st);
        pagoda_client_close(c);
    }
    CHECK(rc == 0 && st.prefix_hit_tokens >= 7 * 80,
          "Stats sums the engines' prefix hits (%llu of %llu tokens)",
          (unsigned long long)st.prefix_hit_tokens, (unsigned long long)st.prefix_query_tokens);

    /* The figures of both engines as the CLI and the gateway show them. */
    check_cli_engines(24, st.prefix_hit_tokens);
    check_gateway_engines();

    /* The same workload shape under both policies (fresh prefixes for each). */
    int ok_ca = 0, ok_rr = 0;
    uint64_t hits_ca = prefix_workload(9000, &ok_ca);
    CHECK(stop_router() == 0, "the router drains and exits 0");
    CHECK(start_router("round-robin") == 0, "a round-robin router links both engines");
    uint64_t hits_rr = prefix_workload(9500, &ok_rr);
    CHECK(ok_ca == 18 && ok_rr == 18 && hits_ca > hits_rr,
          "cache-aware routing: %llu prefix hit tokens, round robin: %llu (18 requests each)",
          (unsigned long long)hits_ca, (unsigned long long)hits_rr);
    CHECK(stop_router() == 0, "the round-robin router drains and exits 0");
}

static void kill_engine0(void)
{
    pid_t s = group_program_pid(&engines[0], "pagoda-scheduler");
    pid_t w = group_worker_pid(&engines[0]);
    CHECK(s > 0 && w > 0 && atomic_load(&started_jobs) == JOBS,
          "every request has its first token; killing engine 0's scheduler %d and worker %d",
          (int)s, (int)w);
    if (s > 0)
        kill(s, SIGKILL);
    if (w > 0)
        kill(w, SIGKILL);
}

static void scenario_failover(void)
{
    CHECK(start_engines() == 0, "two engine groups started");
    CHECK(start_router("cache-aware") == 0, "the router links both engines");
    memset(jobs, 0, sizeof(jobs));
    for (int i = 0; i < JOBS; i++) {
        jobs[i].prompt_len = 20 + (size_t)(i * 37) % 80;
        group_prompt(jobs[i].prompt, jobs[i].prompt_len, (uint32_t)i + 11, VOCAB);
        jobs[i].max_tokens = 30 + (i * 13) % 11;
    }
    uint64_t before[ENGINES] = {0}, after[ENGINES] = {0};
    int connected;
    engine_figures(before, &connected);
    run_jobs(jobs, JOBS, kill_engine0);
    int ok = 0;
    for (int i = 0; i < JOBS; i++) {
        ok += jobs[i].rc == 0;
        if (jobs[i].rc != 0)
            printf("     job %d: %s\n", i, pagoda_strerror(jobs[i].rc));
    }
    CHECK(ok == JOBS, "all %d requests completed after the kill (%d)", JOBS, ok);
    CHECK(compare_with_pagoda_run(jobs, JOBS, 40) == 0,
          "greedy outputs equal pagoda-run's on the same prompts");
    engine_figures(after, &connected);
    CHECK(after[1] - before[1] > (uint64_t)JOBS / 2,
          "engine 0's unfinished requests moved to engine 1 (routed there: %llu)",
          (unsigned long long)(after[1] - before[1]));
    free_jobs(jobs, JOBS);

    /* Engine 0 comes back (its supervisor restarts it) and takes new work again. */
    for (long t = 0; t < 600 * group_time_scale(); t++) {
        if (engine_figures(after, &connected) == 0 && connected == ENGINES)
            break;
        sleep_ms(100);
    }
    CHECK(connected == ENGINES, "engine 0 is back");
    engine_figures(before, &connected);
    memset(jobs, 0, sizeof(jobs));
    for (int i = 0; i < 8; i++) {
        jobs[i].prompt_len = 30;
        group_prompt(jobs[i].prompt, 30, (uint32_t)i + 500, VOCAB);
        jobs[i].max_tokens = 6;
    }
    run_jobs(jobs, 8, NULL);
    engine_figures(after, &connected);
    ok = 0;
    for (int i = 0; i < 8; i++)
        ok += jobs[i].rc == 0;
    CHECK(ok == 8 && after[0] > before[0], "engine 0 takes new work again (%llu requests)",
          (unsigned long long)(after[0] - before[0]));
    CHECK(compare_with_pagoda_run(jobs, 8, 6) == 0, "their greedy outputs equal pagoda-run's");
    free_jobs(jobs, 8);
    CHECK(stop_router() == 0, "the router drains and exits 0");
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: route_test BIN_DIR spread|failover\n");
        return 2;
    }
    int rc = 0;
    for (int i = 0; i < ENGINES && rc == 0; i++)
        if ((rc = group_setup(&engines[i], argv[1], 0)) != 0) {
            for (int k = 0; k < i; k++)
                group_cleanup(&engines[k]);
            return rc == 77 ? 77 : 1;
        }
    snprintf(front.tmp, sizeof(front.tmp), "%s", engines[0].tmp);
    snprintf(front.bin_dir, sizeof(front.bin_dir), "%s", argv[1]);
    if (strcmp(argv[2], "spread") == 0)
        scenario_spread();
    else if (strcmp(argv[2], "failover") == 0)
        scenario_failover();
    else {
        fprintf(stderr, "unknown scenario %s\n", argv[2]);
        group_failed++;
    }
    if (gateway_pid > 0) {
        kill(gateway_pid, SIGKILL);
        waitpid(gateway_pid, NULL, 0);
    }
    if (router_pid > 0)
        stop_router();
    if (group_failed > 0) {
        char cmd[1200];
        snprintf(cmd, sizeof(cmd), "tail -n 40 '%s/router.log' '%s/gateway.log'", front.tmp,
                 front.tmp);
        if (system(cmd) != 0)
            printf("(no router log)\n");
    }
    for (int i = 1; i < ENGINES; i++) {
        if (engines[i].supervisor > 0)
            group_stop(&engines[i]);
        group_cleanup(&engines[i]);
    }
    if (engines[0].supervisor > 0)
        group_stop(&engines[0]);
    return group_finish(&engines[0]);
}
