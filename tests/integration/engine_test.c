/* Integration tests of the engine as processes: a real group (pagoda-supervisor with
 * pagoda-kvpool, pagoda-worker, pagoda-scheduler and pagoda-router) serving the tiny model on
 * the CPU, driven by libpagoda clients; outputs checked against pagoda-run.
 *
 * usage: engine_test BIN_DIR SCENARIO
 *   concurrent   64 concurrent clients: peak running >= 32, every output equals pagoda-run
 *   streaming    with a step delay, the first token arrives before the request finishes
 *   kill-worker  kill -9 of the worker amid 32 running requests: all complete unchanged, and
 *                the new worker computed no sequence's prompt again
 *   cancel       cancel ends a running request and its blocks return to the pool
 *   kill-scheduler  kill -9 of the scheduler amid 32 requests (greedy and seeded sampling):
 *                all complete, outputs equal a run without the kill
 *   kill-router  kill -9 of the router amid 32 requests (greedy and seeded sampling): the
 *                scheduler announces them to the new router, all complete unchanged
 *   stop-worker  SIGSTOP of the worker: the watchdog reports it, the supervisor replaces it,
 *                all requests complete unchanged
 *   faults       a dropped step, a dropped result and a duplicated step: resyncs, unchanged
 *                outputs */
#include "common/error.h"
#include "tests/integration/group.h"

#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define VOCAB 512
#define MAX_CLIENTS 64

struct job {
    pagoda_client *client;
    int32_t prompt[256];
    size_t prompt_len;
    int32_t max_tokens;
    pagoda_result result;
    int rc;
    atomic_int received; /* output tokens delivered so far */
    float temperature;   /* 0: greedy */
    uint64_t seed;       /* used when temperature > 0 */
};

static atomic_int started_jobs; /* jobs that received their first token */

/* The sanitizer build runs the CPU model about 25 times slower: CMake sets
 * PAGODA_TEST_TIME_SCALE there, and every time limit given to the group is multiplied by it. */
static long time_scale(void)
{
    const char *s = getenv("PAGODA_TEST_TIME_SCALE");
    long v = s ? atol(s) : 1;
    return v >= 1 ? v : 1;
}

/* A millisecond figure scaled, as a string that lives for the test. */
static const char *ms(long value)
{
    static char bufs[16][24];
    static int next;
    char *b = bufs[next++ % 16];
    snprintf(b, sizeof(bufs[0]), "%ld", value * time_scale());
    return b;
}

static void on_tokens(void *user, uint32_t offset, const int32_t *ids, const float *lp, size_t n)
{
    struct job *j = user;
    (void)ids, (void)lp;
    if (offset == 0 && n > 0)
        atomic_fetch_add(&started_jobs, 1);
    atomic_store(&j->received, (int)(offset + n));
}

static void *run_job(void *arg)
{
    struct job *j = arg;
    pagoda_generate_params p = group_greedy(j->max_tokens);
    if (j->temperature > 0) {
        p.temperature = j->temperature;
        p.has_seed = 1;
        p.seed = j->seed;
    }
    j->rc =
        pagoda_generate_stream(j->client, &p, j->prompt, j->prompt_len, on_tokens, j, &j->result);
    return NULL;
}

static void sleep_ms(long millis)
{
    struct timespec ts = {millis / 1000, (millis % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Runs n jobs at once; calls during(g) once every job has its first token (when not NULL). */
static int run_jobs(struct group *g, struct job *jobs, int n, void (*during)(struct group *))
{
    pagoda_client *client;
    if (pagoda_client_open(g->url, &client) != 0)
        return -1;
    pagoda_client_set_timeout_ms(client, (uint32_t)(120000 * time_scale()));
    pthread_t threads[MAX_CLIENTS];
    atomic_store(&started_jobs, 0);
    for (int i = 0; i < n; i++) {
        jobs[i].client = client;
        pthread_create(&threads[i], NULL, run_job, &jobs[i]);
    }
    if (during != NULL) {
        for (int t = 0; t < 6000 && atomic_load(&started_jobs) < n; t++)
            sleep_ms(10);
        during(g);
    }
    for (int i = 0; i < n; i++)
        pthread_join(threads[i], NULL);
    pagoda_client_close(client);
    return 0;
}

/* Every job's output equals pagoda-run's on the same prompt and sampling (the jobs' first
 * temperature and seed). Returns the number that differ. */
static int compare_with_pagoda_run(struct group *g, struct job *jobs, int n, int32_t max_tokens)
{
    int32_t *prompts[MAX_CLIENTS], *want[MAX_CLIENTS];
    size_t lens[MAX_CLIENTS], want_len[MAX_CLIENTS];
    for (int i = 0; i < n; i++) {
        prompts[i] = jobs[i].prompt;
        lens[i] = jobs[i].prompt_len;
    }
    /* pagoda-run uses one max_tokens for all prompts: run the longest and cut. */
    if (group_expected_sampled(g, prompts, lens, n, max_tokens, jobs[0].temperature, jobs[0].seed,
                               want, want_len) != 0)
        return n;
    int differ = 0;
    for (int i = 0; i < n; i++) {
        size_t m = (size_t)jobs[i].max_tokens;
        int same = jobs[i].rc == 0 && jobs[i].result.num_tokens == m && want_len[i] >= m &&
                   memcmp(jobs[i].result.token_ids, want[i], m * sizeof(int32_t)) == 0;
        if (!same) {
            size_t first = 0;
            while (first < m && first < jobs[i].result.num_tokens && first < want_len[i] &&
                   jobs[i].result.token_ids[first] == want[i][first])
                first++;
            differ++;
            printf(
                "     job %d: rc %d, %zu tokens (want %zu), finish %s, first difference at %zu\n",
                i, jobs[i].rc, jobs[i].result.num_tokens, m,
                pagoda_finish_reason_name(jobs[i].result.finish_reason), first);
        }
        free(want[i]);
    }
    return differ;
}

static void make_jobs(struct job *jobs, int n, size_t min_len, size_t spread, int32_t min_new,
                      int32_t new_spread)
{
    for (int i = 0; i < n; i++) {
        memset(&jobs[i], 0, sizeof(jobs[i]));
        jobs[i].prompt_len = min_len + (size_t)(i * 37) % spread;
        group_prompt(jobs[i].prompt, jobs[i].prompt_len, (uint32_t)i + 1, VOCAB);
        jobs[i].max_tokens = min_new + (i * 13) % new_spread;
    }
}

static void free_jobs(struct job *jobs, int n)
{
    for (int i = 0; i < n; i++)
        pagoda_result_free(&jobs[i].result);
}

static int get_stats(struct group *g, pagoda_engine_stats *st)
{
    pagoda_client *c;
    if (pagoda_client_open(g->url, &c) != 0)
        return -1;
    int rc = pagoda_stats(c, st);
    pagoda_client_close(c);
    return rc;
}

/* ---- scenarios ------------------------------------------------------------------------ */

static void scenario_concurrent(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "5",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", ms(10000),
        "--scheduler-arg", "--max-batched-tokens", "--scheduler-arg", "512",
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    static struct job jobs[64];
    make_jobs(jobs, 64, 3, 120, 8, 33);
    run_jobs(g, jobs, 64, NULL);
    int ok = 0;
    for (int i = 0; i < 64; i++)
        ok += jobs[i].rc == 0 && jobs[i].result.finish_reason == PAGODA_FINISH_LENGTH;
    CHECK(ok == 64, "64 concurrent requests finished (%d ok)", ok);
    CHECK(compare_with_pagoda_run(g, jobs, 64, 40) == 0,
          "every greedy output equals pagoda-run on the same prompt");
    pagoda_engine_stats st = {0};
    CHECK(get_stats(g, &st) == 0 && st.peak_running >= 32,
          "peak running sequences %u >= 32 (steps %llu)", st.peak_running,
          (unsigned long long)st.steps);
    free_jobs(jobs, 64);
    CHECK(group_stop(g) == 0, "the group drains and stops on SIGTERM");
}

static void scenario_streaming(struct group *g)
{
    const char *extra[] = {"--worker-arg", "--step-delay-ms", "--worker-arg", "100", NULL};
    CHECK(group_start(g, extra) == 0, "group started");
    pagoda_client *c;
    pagoda_client_open(g->url, &c);
    int32_t prompt[8];
    group_prompt(prompt, 8, 7, VOCAB);
    pagoda_generate_params p = group_greedy(20);
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    pagoda_result r = {0};
    int rc = pagoda_submit(c, &p, prompt, 8, id);
    CHECK(rc == 0, "submitted");
    rc = pagoda_poll(c, id, 0, 10000, &r);
    CHECK(rc == 0 && r.num_tokens >= 1 && r.num_tokens < 20 &&
              r.finish_reason == PAGODA_FINISH_NONE,
          "first poll returns %zu token(s) while the request still runs (finish %s)", r.num_tokens,
          pagoda_finish_reason_name(r.finish_reason));
    size_t have = r.num_tokens;
    pagoda_result_free(&r);
    while (rc == 0) {
        rc = pagoda_poll(c, id, (uint32_t)have, 10000, &r);
        have += r.num_tokens;
        int done = r.finish_reason != PAGODA_FINISH_NONE;
        pagoda_result_free(&r);
        if (done)
            break;
    }
    CHECK(rc == 0 && have == 20, "all 20 tokens arrive by polling from offsets (%zu)", have);
    pagoda_client_close(c);
    CHECK(group_stop(g) == 0, "the group stops");
}

static int tokens_received_at_kill;
static struct job kill_jobs[32];

static void kill_worker(struct group *g)
{
    pid_t pid = group_worker_pid(g);
    tokens_received_at_kill = 0;
    for (int i = 0; i < 32; i++)
        tokens_received_at_kill += atomic_load(&kill_jobs[i].received);
    CHECK(pid > 0 && atomic_load(&started_jobs) == 32,
          "every request has its first token (all prefilled); killing worker %d", (int)pid);
    if (pid > 0)
        kill(pid, SIGKILL);
}

static void scenario_kill_worker(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "30",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", ms(10000),
        "--scheduler-arg", "--max-batched-tokens", "--scheduler-arg", "512",
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    make_jobs(kill_jobs, 32, 100, 100, 30, 11);
    run_jobs(g, kill_jobs, 32, kill_worker);
    int ok = 0;
    size_t prompt_total = 0, output_total = 0;
    for (int i = 0; i < 32; i++) {
        ok += kill_jobs[i].rc == 0;
        prompt_total += kill_jobs[i].prompt_len;
        output_total += kill_jobs[i].result.num_tokens;
    }
    CHECK(ok == 32, "all 32 requests completed after the kill (%d)", ok);
    CHECK(compare_with_pagoda_run(g, kill_jobs, 32, 40) == 0,
          "outputs equal a run without the kill");
    pagoda_engine_stats st = {0};
    int rc = get_stats(g, &st);
    CHECK(rc == 0 && st.worker_restarts >= 1, "the scheduler saw the worker restart (%llu)",
          (unsigned long long)st.worker_restarts);
    /* The new worker computes the decode tokens still missing at the kill, plus the step that
     * was in flight and the steps whose tokens had not reached the clients yet (two steps of 32
     * at most). Had it prefilled any prompt (each >= 100 tokens) again, it would be more. */
    size_t remaining = output_total - (size_t)tokens_received_at_kill;
    CHECK(rc == 0 && st.computed_tokens <= remaining + 64 && st.computed_tokens >= remaining - 32,
          "the new worker computed %llu tokens; %zu output tokens were missing at the kill "
          "(prompts hold %zu tokens, none computed again)",
          (unsigned long long)st.computed_tokens, remaining, prompt_total);
    free_jobs(kill_jobs, 32);
    CHECK(group_stop(g) == 0, "the group stops");
}

/* The program the kill-scheduler and kill-router scenarios kill ("scheduler" or "router"). */
static const char *victim;

static void kill_victim(struct group *g)
{
    char program[32];
    snprintf(program, sizeof(program), "pagoda-%s", victim);
    pid_t pid = group_program_pid(g, program);
    CHECK(pid > 0 && atomic_load(&started_jobs) == 32,
          "every request has its first token; killing %s %d", victim, (int)pid);
    if (pid > 0)
        kill(pid, SIGKILL);
}

/* kill -9 of the scheduler or the router amid 32 running requests, half greedy, half sampled
 * with a seed; the supervisor restarts it, and every output equals a run without the kill.
 * A new scheduler gets every unfinished request again from the router, with the output it
 * already has (as output, not prompt); a new router learns every request from the scheduler's
 * announcement, and the clients' polls (resent by NNG's REQ) find them by id. */
static void scenario_kill_program(struct group *g, const char *program)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "30",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", ms(10000),
        "--scheduler-arg", "--max-batched-tokens", "--scheduler-arg", "512",
        NULL};
    /* clang-format on */
    victim = program;
    CHECK(group_start(g, extra) == 0, "group started");
    make_jobs(kill_jobs, 32, 20, 80, 30, 11);
    for (int i = 16; i < 32; i++) {
        kill_jobs[i].temperature = 0.8f;
        kill_jobs[i].seed = 777;
    }
    run_jobs(g, kill_jobs, 32, kill_victim);
    int ok = 0;
    for (int i = 0; i < 32; i++) {
        ok += kill_jobs[i].rc == 0;
        if (kill_jobs[i].rc != 0)
            printf("job %d: %s\n", i, pagoda_strerror(kill_jobs[i].rc));
    }
    CHECK(ok == 32, "all 32 requests completed after the kill (%d)", ok);
    CHECK(compare_with_pagoda_run(g, kill_jobs, 16, 40) == 0,
          "greedy outputs equal a run without the kill");
    CHECK(compare_with_pagoda_run(g, kill_jobs + 16, 16, 40) == 0,
          "seeded sampled outputs equal a run without the kill");
    char log[700], cmd[800];
    snprintf(log, sizeof(log), "%s/supervisor.log", g->tmp);
    snprintf(cmd, sizeof(cmd), "grep -q '%s.*exited' '%s'", program, log);
    CHECK(system(cmd) == 0, "the supervisor restarted the %s", program);
    free_jobs(kill_jobs, 32);
    CHECK(group_stop(g) == 0, "the group stops");
}

/* Cancel ends a running request, and its blocks return to the pool. */
static void scenario_cancel(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "20",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", ms(10000),
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    pagoda_client *c;
    pagoda_client_open(g->url, &c);
    pagoda_client_set_timeout_ms(c, (uint32_t)(30000 * time_scale()));
    int32_t prompt[100];
    group_prompt(prompt, 100, 9, VOCAB);
    pagoda_generate_params p = group_greedy(500);
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    pagoda_result r = {0};
    pagoda_engine_stats idle = {0}, busy = {0}, after = {0};
    pagoda_stats(c, &idle);
    int rc = pagoda_submit(c, &p, prompt, 100, id);
    if (rc == 0)
        rc = pagoda_poll(c, id, 0, 10000, &r);
    pagoda_result_free(&r);
    pagoda_stats(c, &busy);
    CHECK(rc == 0 && busy.running == 1 && busy.free_blocks < idle.free_blocks,
          "a running request holds blocks (%d of %d free)", busy.free_blocks, idle.free_blocks);
    rc = pagoda_cancel(c, id, &r);
    pagoda_result_free(&r);
    CHECK(rc == 0, "cancel accepted");
    uint32_t have = 0;
    int finish = PAGODA_FINISH_NONE;
    for (int i = 0; rc == 0 && i < 100 && finish == PAGODA_FINISH_NONE; i++) {
        rc = pagoda_poll(c, id, have, 1000, &r);
        have += (uint32_t)r.num_tokens;
        finish = r.finish_reason;
        pagoda_result_free(&r);
    }
    CHECK(rc == 0 && finish == PAGODA_FINISH_CANCELLED && have < 500,
          "the request ends as cancelled after %u of 500 tokens", have);
    for (int i = 0; i < 100; i++) {
        pagoda_stats(c, &after);
        if (after.running == 0 && after.free_blocks == idle.free_blocks)
            break;
        sleep_ms(50);
    }
    CHECK(after.running == 0 && after.free_blocks == idle.free_blocks,
          "its blocks returned to the pool (%d of %d free)", after.free_blocks, idle.free_blocks);
    pagoda_client_close(c);
    CHECK(group_stop(g) == 0, "the group stops");
}

static void stop_worker(struct group *g)
{
    pid_t pid = group_worker_pid(g);
    CHECK(pid > 0, "SIGSTOP to worker %d", (int)pid);
    if (pid > 0)
        kill(pid, SIGSTOP);
}

static void scenario_stop_worker(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "20",
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", ms(1500),
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", ms(500),
        "--scheduler-arg", "--max-batched-tokens", "--scheduler-arg", "512",
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    static struct job jobs[16];
    make_jobs(jobs, 16, 10, 60, 30, 11);
    run_jobs(g, jobs, 16, stop_worker);
    int ok = 0;
    for (int i = 0; i < 16; i++)
        ok += jobs[i].rc == 0;
    CHECK(ok == 16, "all 16 requests completed (%d)", ok);
    CHECK(compare_with_pagoda_run(g, jobs, 16, 40) == 0, "outputs unchanged");
    pagoda_engine_stats st = {0};
    CHECK(get_stats(g, &st) == 0 && st.worker_restarts >= 1,
          "the hung worker was replaced (restarts %llu)", (unsigned long long)st.worker_restarts);
    char log[700], cmd[800];
    snprintf(log, sizeof(log), "%s/supervisor.log", g->tmp);
    snprintf(cmd, sizeof(cmd), "grep -qi 'hung' '%s'", log);
    CHECK(system(cmd) == 0, "the supervisor logged the watchdog's report");
    free_jobs(jobs, 16);
    CHECK(group_stop(g) == 0, "the group stops");
}

static void scenario_faults(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--fault", "--worker-arg", "drop-step=5",
        "--worker-arg", "--fault", "--worker-arg", "drop-result=9",
        "--scheduler-arg", "--fault", "--scheduler-arg", "dup-step=13",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", ms(400),
        "--scheduler-arg", "--max-batched-tokens", "--scheduler-arg", "512",
        "--worker-arg", "--step-delay-ms", "--worker-arg", "5",
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    static struct job jobs[16];
    make_jobs(jobs, 16, 5, 50, 30, 11);
    run_jobs(g, jobs, 16, NULL);
    int ok = 0;
    for (int i = 0; i < 16; i++)
        ok += jobs[i].rc == 0;
    CHECK(ok == 16, "all 16 requests completed (%d)", ok);
    CHECK(compare_with_pagoda_run(g, jobs, 16, 40) == 0, "outputs unchanged by the faults");
    pagoda_engine_stats st = {0};
    CHECK(get_stats(g, &st) == 0 && st.resyncs >= 4,
          "a resync for each fault (resyncs %llu, the first at start)",
          (unsigned long long)st.resyncs);
    free_jobs(jobs, 16);
    CHECK(group_stop(g) == 0, "the group stops");
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: engine_test BIN_DIR concurrent|streaming|kill-worker|"
                        "stop-worker|faults\n");
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    struct group g;
    if (group_prepare(&g, argv[1]) != 0) {
        printf("cannot make the model\n");
        return 1;
    }
    const char *s = argv[2];
    if (strcmp(s, "concurrent") == 0)
        scenario_concurrent(&g);
    else if (strcmp(s, "streaming") == 0)
        scenario_streaming(&g);
    else if (strcmp(s, "kill-worker") == 0)
        scenario_kill_worker(&g);
    else if (strcmp(s, "cancel") == 0)
        scenario_cancel(&g);
    else if (strcmp(s, "kill-scheduler") == 0)
        scenario_kill_program(&g, "scheduler");
    else if (strcmp(s, "kill-router") == 0)
        scenario_kill_program(&g, "router");
    else if (strcmp(s, "stop-worker") == 0)
        scenario_stop_worker(&g);
    else if (strcmp(s, "faults") == 0)
        scenario_faults(&g);
    else
        fprintf(stderr, "unknown scenario %s\n", s);
    if (group_failed > 0) {
        char cmd[700];
        snprintf(cmd, sizeof(cmd), "tail -n 20 %s/supervisor.log %s/run/*.log 2>/dev/null", g.tmp,
                 g.tmp);
        if (system(cmd) != 0)
            printf("(no logs)\n");
    }
    group_cleanup(&g);
    printf("%d passed, %d failed\n", group_passed, group_failed);
    return group_failed == 0 && group_passed > 0 ? 0 : 1;
}
