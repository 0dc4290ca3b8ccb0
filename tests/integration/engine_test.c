/* Integration tests of the engine as processes: a real group (pagoda-supervisor with
 * pagoda-kvpool, pagoda-worker, pagoda-scheduler and pagoda-router) serving the tiny model on
 * the CPU, driven by libpagoda clients; outputs checked against pagoda-run.
 *
 * usage: engine_test BIN_DIR SCENARIO [cuda]
 *   cuda: the same scenario on the GPU (group_use_cuda: a CUDA worker on a GPU pool, a
 *   random-weight Llama shape; exit 77 without CUDA). Greedy outputs are compared with
 *   pagoda-run --backend cuda up to the reference's first near tie (GPU_MARGIN), as tests/gpu
 *   does: bf16 results depend slightly on the batch. Meant for concurrent and kill-worker.
 *   concurrent   64 concurrent clients: peak running >= 32, every output equals pagoda-run
 *   overlap      concurrent with no step delay: steps back to back (on the GPU, step n+1 is
 *                enqueued behind step n and reads its tokens on the device)
 *   streaming    with a step delay, the first token arrives before the request finishes
 *   kill-worker  kill -9 of the worker amid 32 running requests: all complete unchanged, and
 *                the new worker computed no sequence's prompt again
 *   lose-device  the same with the worker's device lost (--fault lose-device: its step fails as
 *                a lost CUDA context fails it): the worker exits by itself, nothing is lost
 *   cancel       cancel ends a running request and its blocks return to the pool
 *   kill-scheduler  kill -9 of the scheduler amid 32 requests (greedy and seeded sampling):
 *                all complete, outputs equal a run without the kill
 *   kill-router  kill -9 of the router amid 32 requests (greedy and seeded sampling): the
 *                scheduler announces them to the new router, all complete unchanged
 *   kill-router-scheduler  the same, then, once the new router has the announcement, kill -9 of
 *                the scheduler: the new router submits the requests it adopted again (their
 *                prompts and parameters came in the announcement), all complete unchanged
 *   stop-worker  SIGSTOP of the worker: the watchdog reports it, the supervisor replaces it,
 *                all requests complete unchanged
 *   stop-worker-kill-scheduler  the same, the scheduler killed right after the SIGSTOP: the new
 *                one reports a worker that sends no Hello, the supervisor kills it (no heartbeat
 *                either), all requests complete unchanged
 *   stop-router  SIGSTOP of the router amid 8 long requests until the scheduler's messages to
 *                it are lost (its log says so): the scheduler sends what it holds again, and
 *                every request completes unchanged
 *   faults       a dropped step, a dropped result and a duplicated step: resyncs, unchanged
 *                outputs
 *   resend       a client with a 2 ms REQ resend time submits 32 requests while the router is
 *                stopped: the router receives duplicates (its duplicate_submits counter) and
 *                still holds exactly 32 requests, each completing once and unchanged; a Submit
 *                sent twice by hand answers with the same request, and the same id with other
 *                parameters is PAGODA_EEXIST
 *   stream-cli   `pagoda generate --stream` prints its tokens in several pieces while the request
 *                runs, the same tokens as `--json` prints for the same seeded request;
 *                `--stream --json` pieces carry consecutive offsets
 *   poll-resume  a client polls a request, disconnects, and a new client polls on from the
 *                offset reached: every token arrives once, in order, and the whole equals a
 *                one-shot generate of the same seeded request
 *   bias-restart a request with a logit bias of +100 on a token X that is also its stop id, and
 *                min_tokens M: M tokens without X, then X; kill -9 of the router, then, once the
 *                new router has adopted it, of the scheduler: the request submitted again from
 *                the announcement keeps its bias and min_tokens (the same output as without
 *                the kills) */
#include "common/error.h"
#include "tests/integration/group.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define VOCAB 512
/* GPU runs: top-two logit margin below which the reference's choice may flip. */
#define GPU_MARGIN 0.05f
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
    pagoda_client_set_timeout_ms(client, (uint32_t)(120000 * group_time_scale()));
    pthread_t threads[MAX_CLIENTS];
    atomic_store(&started_jobs, 0);
    for (int i = 0; i < n; i++) {
        jobs[i].client = client;
        pthread_create(&threads[i], NULL, run_job, &jobs[i]);
    }
    if (during != NULL) {
        /* 60 s, scaled like every other wait (the sanitizer build is several times slower). */
        for (long t = 0; t < 6000 * group_time_scale() && atomic_load(&started_jobs) < n; t++)
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
    int differ = 0, exact = 0;
    for (int i = 0; i < n; i++) {
        size_t m = (size_t)jobs[i].max_tokens;
        int same = jobs[i].rc == 0 && jobs[i].result.num_tokens == m && want_len[i] >= m &&
                   memcmp(jobs[i].result.token_ids, want[i], m * sizeof(int32_t)) == 0;
        if (!same) {
            size_t first = 0;
            while (first < m && first < jobs[i].result.num_tokens && first < want_len[i] &&
                   jobs[i].result.token_ids[first] == want[i][first])
                first++;
            /* On the GPU a difference at or after the reference's first near tie is allowed. */
            long tie = g->cuda && jobs[i].rc == 0 && jobs[i].result.num_tokens == m
                           ? group_first_near_tie(g, jobs[i].prompt, jobs[i].prompt_len, want[i], m,
                                                  GPU_MARGIN)
                           : -1;
            differ += tie < 0 || first < (size_t)tie;
            printf("     job %d: rc %d, %zu tokens (want %zu), finish %s, first difference at "
                   "%zu, first near tie at %ld\n",
                   i, jobs[i].rc, jobs[i].result.num_tokens, m,
                   pagoda_finish_reason_name(jobs[i].result.finish_reason), first, tie);
            fflush(stdout); /* before the next pagoda-logits is forked */
        } else {
            exact++;
        }
        free(want[i]);
    }
    if (g->cuda)
        printf("     %d of %d outputs equal pagoda-run --backend cuda exactly, %d differ before "
               "the reference's first near tie (margin %.2f)\n",
               exact, n, differ, (double)GPU_MARGIN);
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

/* 64 concurrent requests; step_delay_ms "0": the worker runs steps back to back, so on the GPU
 * the executor enqueues step n+1 behind step n with its pending tokens read on the device (the
 * "overlap" scenario); with a delay each step ends before the next starts. */
static void scenario_concurrent(struct group *g, const char *step_delay_ms)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", step_delay_ms,
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_ms(10000),
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
    /* The scheduler's default: step n+1 goes out while the worker runs step n. */
    CHECK(st.peak_steps_in_flight == 2, "two steps were in flight (peak %u, %llu tokens discarded)",
          st.peak_steps_in_flight, (unsigned long long)st.discarded_tokens);
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

/* The worker's --fault lose-device file (lose_device). */
static char lose_device_path[400];

/* Makes the worker's next step fail as a lost device does (--fault lose-device): the worker
 * exits by itself, and the supervisor starts a new one. */
static void lose_device(struct group *g)
{
    (void)g;
    tokens_received_at_kill = 0;
    for (int i = 0; i < 32; i++)
        tokens_received_at_kill += atomic_load(&kill_jobs[i].received);
    CHECK(atomic_load(&started_jobs) == 32,
          "every request has its first token (all prefilled); the worker's device is lost");
    FILE *f = fopen(lose_device_path, "w");
    CHECK(f != NULL && fclose(f) == 0, "%s written", lose_device_path);
}

/* kill -9 of the worker amid 32 requests (lost 0), or the loss of its device (lost 1: its backend
 * says it cannot run any more, and it exits). */
static void scenario_kill_worker(struct group *g, int lost)
{
    snprintf(lose_device_path, sizeof(lose_device_path), "lose-device=%s/lose-device", g->tmp);
    /* clang-format off */
    const char *extra[24] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "30",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_ms(10000),
        "--scheduler-arg", "--max-batched-tokens", "--scheduler-arg", "512",
        NULL};
    /* clang-format on */
    if (lost) {
        size_t n = 16;
        extra[n++] = "--worker-arg";
        extra[n++] = "--fault";
        extra[n++] = "--worker-arg";
        extra[n++] = lose_device_path;
        extra[n] = NULL;
    }
    CHECK(group_start(g, extra) == 0, "group started");
    /* The file's path, without the flag's "lose-device=". */
    memmove(lose_device_path, lose_device_path + strlen("lose-device="),
            strlen(lose_device_path) - strlen("lose-device=") + 1);
    make_jobs(kill_jobs, 32, 100, 100, 30, 11);
    run_jobs(g, kill_jobs, 32, lost ? lose_device : kill_worker);
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
    if (lost) {
        char cmd[1200];
        snprintf(cmd, sizeof(cmd),
                 "grep -q 'the backend cannot run any more' '%s/worker-0.log' && grep -q "
                 "'worker-0 (pid [0-9]*) exited' '%s/supervisor.log'",
                 g->run_dir, g->tmp);
        CHECK(system(cmd) == 0, "the worker said its backend was lost and exited");
        CHECK(access(lose_device_path, F_OK) != 0, "the fault fired once (its file is gone)");
    }
    free_jobs(kill_jobs, 32);
    CHECK(group_stop(g) == 0, "the group stops");
}

/* The program the kill-scheduler and kill-router scenarios kill ("scheduler" or "router"), or
 * "router-scheduler": the router, then the scheduler once the new router has its announcement. */
static const char *victim;
/* The engine's figures just before the kill. */
static pagoda_engine_stats before_kill;

/* router-scheduler: the requests the new router held when the scheduler was killed. */
static uint32_t adopted_at_kill;

static void kill_victim(struct group *g)
{
    int both = strcmp(victim, "router-scheduler") == 0;
    char program[32];
    snprintf(program, sizeof(program), "pagoda-%s", both ? "router" : victim);
    CHECK(get_stats(g, &before_kill) == 0, "stats before the kill");
    pid_t pid = group_program_pid(g, program);
    CHECK(pid > 0 && atomic_load(&started_jobs) == 32,
          "every request has its first token; killing %s %d", program, (int)pid);
    if (pid > 0)
        kill(pid, SIGKILL);
    if (!both)
        return;
    /* The new router answers Stats; its live requests are the ones it adopted from the
     * announcement (one message: all of them at once). */
    pagoda_engine_stats st = {0};
    for (int i = 0; i < 600; i++) {
        if (get_stats(g, &st) == 0 && st.live_requests > 0)
            break;
        usleep(50 * 1000);
    }
    adopted_at_kill = st.live_requests;
    CHECK(adopted_at_kill > 0, "the new router adopted %u unfinished requests", adopted_at_kill);
    pid = group_program_pid(g, "pagoda-scheduler");
    CHECK(pid > 0, "killing pagoda-scheduler %d as well", (int)pid);
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
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_ms(10000),
        "--scheduler-arg", "--max-batched-tokens", "--scheduler-arg", "512",
        NULL};
    /* clang-format on */
    victim = program;
    int both = strcmp(program, "router-scheduler") == 0;
    CHECK(group_start(g, extra) == 0, "group started");
    /* two kills: outputs long enough that requests still run at the second */
    int32_t max_new = both ? 120 : 40;
    make_jobs(kill_jobs, 32, 20, 80, max_new - 10, 11);
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
    CHECK(compare_with_pagoda_run(g, kill_jobs, 16, max_new) == 0,
          "greedy outputs equal a run without the kill");
    CHECK(compare_with_pagoda_run(g, kill_jobs + 16, 16, max_new) == 0,
          "seeded sampled outputs equal a run without the kill");
    char log[700], cmd[1600];
    snprintf(log, sizeof(log), "%s/supervisor.log", g->tmp);
    if (strcmp(program, "router-scheduler") == 0)
        snprintf(cmd, sizeof(cmd),
                 "grep -q 'router.*exited' '%s' && grep -q 'scheduler.*exited' '%s'", log, log);
    else
        snprintf(cmd, sizeof(cmd), "grep -q '%s.*exited' '%s'", program, log);
    CHECK(system(cmd) == 0, "the supervisor restarted the %s", program);
    /* The worker's step-time counters go on across a scheduler that started again (the router
     * carries what the killed one counted), where the steps count starts again with one engine:
     * at least the steps timed before the kill plus the new scheduler's steps, less the two it
     * may have in flight. */
    pagoda_engine_stats after;
    if (strcmp(program, "scheduler") == 0 && get_stats(g, &after) == 0)
        CHECK(after.worker_steps_timed + 2 >= before_kill.worker_steps_timed + after.steps &&
                  after.worker_step_device_us_total >= before_kill.worker_step_device_us_total,
              "the step-time counters carried across the restart (%llu timed before the kill, "
              "%llu after, %llu steps of the new scheduler)",
              (unsigned long long)before_kill.worker_steps_timed,
              (unsigned long long)after.worker_steps_timed, (unsigned long long)after.steps);
    free_jobs(kill_jobs, 32);
    CHECK(group_stop(g) == 0, "the group stops");
}

static void scenario_bias_restart(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "15",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_ms(10000),
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    pagoda_client *c = NULL;
    CHECK(pagoda_client_open(g->url, &c) == 0, "a client");
    if (c == NULL)
        return;
    pagoda_client_set_timeout_ms(c, (uint32_t)(60000 * group_time_scale()));
    int32_t prompt[] = {7, 8, 9, 10, 11};
    int32_t x = 77;
    float plus = 100.0f;
    const int32_t m = 100;
    pagoda_generate_params p = group_greedy(200);
    p.ignore_eos = 0;
    p.stop_token_ids = &x;
    p.num_stop_token_ids = 1;
    p.logit_bias_ids = &x;
    p.logit_bias_values = &plus;
    p.num_logit_bias = 1;
    p.min_tokens = m;
    pagoda_result ref = {0};
    int rc = pagoda_generate(c, &p, prompt, 5, &ref);
    int shape = rc == 0 && ref.num_tokens == (size_t)m + 1 && ref.token_ids[m] == x &&
                ref.finish_reason == PAGODA_FINISH_STOP;
    for (int32_t i = 0; shape && i < m; i++)
        shape = ref.token_ids[i] != x;
    CHECK(shape, "without kills: %zu tokens, %d of them without token %d, then it (%s)",
          rc == 0 ? ref.num_tokens : 0, (int)m, (int)x, rc == 0 ? "served" : pagoda_strerror(rc));
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    CHECK(pagoda_submit(c, &p, prompt, 5, id) == 0, "submitted again");
    pagoda_result first;
    rc = pagoda_poll(c, id, 0, 5000, &first);
    CHECK(rc == 0 && first.num_tokens > 0 && first.num_tokens < (size_t)m, "its first tokens (%zu)",
          rc == 0 ? first.num_tokens : 0);
    if (rc == 0)
        pagoda_result_free(&first);
    pid_t pid = group_program_pid(g, "pagoda-router");
    CHECK(pid > 0 && kill(pid, SIGKILL) == 0, "kill -9 of the router (%d)", (int)pid);
    pagoda_engine_stats st = {0};
    for (int i = 0; i < 600 && !(pagoda_stats(c, &st) == 0 && st.live_requests > 0); i++)
        sleep_ms(50);
    CHECK(st.live_requests > 0, "the new router adopted it (%u live)", st.live_requests);
    pid = group_program_pid(g, "pagoda-scheduler");
    CHECK(pid > 0 && kill(pid, SIGKILL) == 0, "kill -9 of the scheduler (%d)", (int)pid);
    pagoda_result all = {0};
    uint32_t off = 0;
    int done = 0, finish = -1;
    for (int i = 0; i < 400 && !done; i++) {
        pagoda_result piece;
        if (pagoda_poll(c, id, off, 5000, &piece) != 0) {
            sleep_ms(100);
            continue;
        }
        pagoda_result_append(&all, &piece, 0);
        off += (uint32_t)piece.num_tokens;
        done = piece.finish_reason != PAGODA_FINISH_NONE;
        finish = (int)piece.finish_reason;
        pagoda_result_free(&piece);
    }
    int same = done && rc == 0 && all.num_tokens == ref.num_tokens;
    for (size_t i = 0; same && i < all.num_tokens; i++)
        same = all.token_ids[i] == ref.token_ids[i];
    CHECK(same, "after the kills: %zu tokens, finish %d, the same as without them (%zu)",
          all.num_tokens, finish, ref.num_tokens);
    pagoda_result_free(&all);
    if (ref.token_ids != NULL)
        pagoda_result_free(&ref);
    pagoda_client_close(c);
    CHECK(group_stop(g) == 0, "the group stops");
}

/* The stop-router scenario's requests, and the scheduler's lost messages it waits for. */
#define STOP_JOBS 8

/* How many times text occurs in file, a line "... [repeated N times]" (the log's own folding
 * of repeats) counting N (0 when it cannot be read). */
static int count_in_file(const char *file, const char *text)
{
    FILE *f = fopen(file, "r");
    if (f == NULL)
        return 0;
    int n = 0;
    char line[4096];
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, text) == NULL)
            continue;
        const char *r = strstr(line, "[repeated ");
        n += r != NULL ? atoi(r + strlen("[repeated ")) : 1;
    }
    fclose(f);
    return n;
}

/* The scheduler's lost messages seen while the router was stopped. */
static int stop_drops;

/* Holds the router stopped while the steps go on, until the scheduler's log shows a message to
 * it lost (the link's buffers full: NNG's 256 messages and the socket's), then half a second
 * more; at most 120 s (not scaled: the steps' kernels are not instrumented in the sanitizer
 * build, and the wait stays below the test's limit; the supervisor kills a router silent for
 * 15 s, which the scenario checks did not happen). */
static void stop_router_until_drops(struct group *g)
{
    char log[700];
    snprintf(log, sizeof(log), "%s/scheduler.log", g->run_dir);
    const int before = count_in_file(log, "to router: message dropped");
    pid_t pid = group_program_pid(g, "pagoda-router");
    int stopped = pid > 0 && atomic_load(&started_jobs) == STOP_JOBS && kill(pid, SIGSTOP) == 0;
    CHECK(stopped, "every request has its first token; router %d stopped", (int)pid);
    if (!stopped)
        return;
    for (long t = 0; t < 120000 / 20 && count_in_file(log, "to router: message dropped") == before;
         t++)
        sleep_ms(20);
    sleep_ms(500);
    kill(pid, SIGCONT);
    stop_drops = count_in_file(log, "to router: message dropped") - before;
}

/* SIGSTOP of the router amid 8 requests of 1500-1799 tokens, steps back to back, until the
 * scheduler's token events (ends among them, perhaps) are lost: the router ignores the events
 * that follow a loss, and the scheduler sends everything it holds again once a second until a
 * resend goes through (docs/protocol.md, "Lost events"). Every request completes, each output
 * equal to pagoda-run's. */
static void scenario_stop_router(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "0",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_ms(10000),
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    enum { N = STOP_JOBS };
    static struct job jobs[N];
    make_jobs(jobs, N, 20, 40, 1500, 300);
    run_jobs(g, jobs, N, stop_router_until_drops);
    CHECK(stop_drops >= 1, "the scheduler lost %d messages to the stopped router", stop_drops);
    int ok = 0;
    for (int i = 0; i < N; i++) {
        ok += jobs[i].rc == 0 && jobs[i].result.finish_reason == PAGODA_FINISH_LENGTH;
        if (jobs[i].rc != 0)
            printf("job %d: %s\n", i, pagoda_strerror(jobs[i].rc));
    }
    CHECK(ok == N, "all %d requests completed (%d)", N, ok);
    CHECK(compare_with_pagoda_run(g, jobs, N, 1800) == 0, "every output equals pagoda-run");
    char log[700];
    snprintf(log, sizeof(log), "%s/scheduler.log", g->run_dir);
    int resends = count_in_file(log, "requests sent again from offset 0");
    CHECK(resends >= 1, "the scheduler sent what it held again, whole (%d times)", resends);
    /* Not by a new router's announcement: the supervisor did not restart the stopped one (its
     * heartbeat limit is 15 s). */
    char cmd[800];
    snprintf(cmd, sizeof(cmd), "grep -q 'router (pid [0-9]*) exited' '%s/supervisor.log'", g->tmp);
    CHECK(system(cmd) != 0, "the router was not restarted");
    free_jobs(jobs, N);
    CHECK(group_stop(g) == 0, "the group stops");
}

/* Cancel ends a running request, and its blocks return to the pool. */
static void scenario_cancel(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "20",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_ms(10000),
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    pagoda_client *c;
    pagoda_client_open(g->url, &c);
    pagoda_client_set_timeout_ms(c, (uint32_t)(30000 * group_time_scale()));
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
        if (after.running == 0 && after.free_blocks + (int32_t)after.cached_blocks ==
                                      idle.free_blocks + (int32_t)idle.cached_blocks)
            break;
        sleep_ms(50);
    }
    /* Its full blocks stay in the prefix cache, unused (kv_usage 0), the others are free. */
    CHECK(after.running == 0 && after.kv_usage == 0.0 &&
              after.free_blocks + (int32_t)after.cached_blocks ==
                  idle.free_blocks + (int32_t)idle.cached_blocks,
          "its blocks returned to the pool (%d free + %u cached of %d free + %u cached; usage %g)",
          after.free_blocks, after.cached_blocks, idle.free_blocks, idle.cached_blocks,
          after.kv_usage);
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

/* SIGSTOP of the worker, then kill -9 of the scheduler before its watchdog fires: the new
 * scheduler never hears from the worker and knows no pid to report. Before the 44th session the
 * group waited for good (every tenant); now it reports the worker's silence and the supervisor,
 * seeing no heartbeat from it either, kills it. */
static void stop_worker_kill_scheduler(struct group *g)
{
    stop_worker(g);
    pid_t pid = group_program_pid(g, "pagoda-scheduler");
    CHECK(pid > 0, "kill -9 of the scheduler %d", (int)pid);
    if (pid > 0)
        kill(pid, SIGKILL);
}

static void scenario_stop_worker(struct group *g, int kill_scheduler)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "20",
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_detect_ms(1500),
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_detect_ms(500),
        "--scheduler-arg", "--max-batched-tokens", "--scheduler-arg", "512",
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    static struct job jobs[16];
    make_jobs(jobs, 16, 10, 60, 30, 11);
    run_jobs(g, jobs, 16, kill_scheduler ? stop_worker_kill_scheduler : stop_worker);
    int ok = 0;
    for (int i = 0; i < 16; i++)
        ok += jobs[i].rc == 0;
    CHECK(ok == 16, "all 16 requests completed (%d)", ok);
    CHECK(compare_with_pagoda_run(g, jobs, 16, 40) == 0, "outputs unchanged");
    pagoda_engine_stats st = {0};
    /* (a new scheduler counts no restart of a worker it never heard from) */
    CHECK(kill_scheduler || (get_stats(g, &st) == 0 && st.worker_restarts >= 1),
          "the hung worker was replaced (restarts %llu)", (unsigned long long)st.worker_restarts);
    char log[700], cmd[800];
    snprintf(log, sizeof(log), "%s/supervisor.log", g->tmp);
    snprintf(cmd, sizeof(cmd),
             kill_scheduler ? "grep -q 'sent it no Hello.*killing it' '%s'"
                            : "grep -qi 'hung' '%s'",
             log);
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
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_ms(400),
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

/* ---- resends and deduplication ---------------------------------------------------------- */

static atomic_int submitting; /* resend jobs that have started their call */

static void *run_counted_job(void *arg)
{
    atomic_fetch_add(&submitting, 1);
    return run_job(arg);
}

/* A Submit of (id, prompt, max_tokens), greedy, EOS ignored, sent on a REQ socket of its own:
 * returns the router's reply or NULL. */
static Pagoda__ClientResponse *raw_submit(struct group *g, const uint8_t id[16], int32_t *prompt,
                                          size_t n, int32_t max_tokens)
{
    Pagoda__SamplingParams sp = PAGODA__SAMPLING_PARAMS__INIT;
    sp.has_temperature = 1;
    sp.temperature = 0.0f;
    Pagoda__SubmitRequest sub = PAGODA__SUBMIT_REQUEST__INIT;
    sub.has_request_id = 1;
    sub.request_id.data = (uint8_t *)id;
    sub.request_id.len = 16;
    sub.n_prompt_token_ids = n;
    sub.prompt_token_ids = prompt;
    sub.sampling = &sp;
    sub.has_max_tokens = 1;
    sub.max_tokens = max_tokens;
    sub.has_ignore_eos = 1;
    sub.ignore_eos = 1;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.has_protocol_version = 1;
    req.protocol_version = 1;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_SUBMIT;
    req.submit = &sub;
    uint8_t buf[1024];
    size_t len = pagoda__client_request__get_packed_size(&req);
    if (len > sizeof(buf))
        return NULL;
    pagoda__client_request__pack(&req, buf);
    return group_raw_call(g, buf, len, (uint32_t)(30000 * group_time_scale()));
}

/* Whether resp is a successful Submit answer for request id: no error, an update naming id at
 * offset 0 with no tokens. */
static int submit_answer_for(const Pagoda__ClientResponse *resp, const uint8_t id[16])
{
    if (resp == NULL || (resp->has_error_code && resp->error_code != 0) ||
        resp->result_case != PAGODA__CLIENT_RESPONSE__RESULT_UPDATE || resp->update == NULL)
        return 0;
    const Pagoda__TokenUpdate *up = resp->update;
    return up->has_request_id && up->request_id.len == 16 &&
           memcmp(up->request_id.data, id, 16) == 0 && (!up->has_offset || up->offset == 0) &&
           up->n_token_ids == 0;
}

static int resp_error(const Pagoda__ClientResponse *resp)
{
    return resp == NULL ? 1 : resp->has_error_code ? resp->error_code : 0;
}

/* Polls id until it finishes: every reply must carry its tokens from the offset asked. Returns
 * the number of tokens (written to out, at most cap), or -1 on an error or a wrong offset. */
static int poll_to_end(pagoda_client *c, const uint8_t id[PAGODA_REQUEST_ID_BYTES], int32_t *out,
                       size_t cap, pagoda_finish_reason *finish)
{
    size_t have = 0;
    *finish = PAGODA_FINISH_NONE;
    for (int i = 0; i < 10000 && *finish == PAGODA_FINISH_NONE; i++) {
        pagoda_result r = {0};
        if (pagoda_poll(c, id, (uint32_t)have, 10000, &r) != 0)
            return -1;
        int bad = (r.num_tokens > 0 && r.offset != have) || have + r.num_tokens > cap;
        if (!bad) {
            memcpy(out + have, r.token_ids, r.num_tokens * sizeof(int32_t));
            have += r.num_tokens;
        }
        *finish = r.finish_reason;
        pagoda_result_free(&r);
        if (bad)
            return -1;
    }
    return (int)have;
}

static void scenario_resend(struct group *g)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "5",
        "--scheduler-arg", "--result-timeout-ms", "--scheduler-arg", group_ms(2000),
        "--scheduler-arg", "--watchdog-ms", "--scheduler-arg", group_ms(10000),
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    pagoda_client *c, *plain;
    pagoda_client_open(g->url, &c);
    pagoda_client_open(g->url, &plain);
    pagoda_client_set_timeout_ms(c, (uint32_t)(120000 * group_time_scale()));
    pagoda_client_set_resend_ms(c, 2);
    pagoda_client_set_timeout_ms(plain, (uint32_t)(30000 * group_time_scale()));
    pagoda_engine_stats before = {0}, after = {0};
    int healthy = 0;
    /* The stats call waits for the router's link to the scheduler; the health call on c makes
     * sure c's connection is up before the router stops. */
    CHECK(pagoda_stats(plain, &before) == 0 && pagoda_health(c, &healthy) == 0 && healthy,
          "stats and health answered (duplicate submits so far %llu)",
          (unsigned long long)before.duplicate_submits);

    /* The router stops answering (SIGSTOP) while 32 submits are sent: each goes out again every
     * 2 ms, so the router finds many copies waiting when it continues. */
    enum { N = 32 };
    static struct job jobs[N];
    make_jobs(jobs, N, 8, 40, 40, 9);
    pid_t router = group_program_pid(g, "pagoda-router");
    CHECK(router > 0 && kill(router, SIGSTOP) == 0, "router %d stopped", (int)router);
    pthread_t threads[N];
    atomic_store(&submitting, 0);
    for (int i = 0; i < N; i++) {
        jobs[i].client = c;
        pthread_create(&threads[i], NULL, run_counted_job, &jobs[i]);
    }
    for (int t = 0; t < 6000 && atomic_load(&submitting) < N; t++)
        sleep_ms(1);
    sleep_ms(200);
    if (router > 0)
        kill(router, SIGCONT);
    for (int i = 0; i < N; i++)
        pthread_join(threads[i], NULL);

    int ok = 0;
    size_t prompt_total = 0, output_total = 0;
    for (int i = 0; i < N; i++) {
        ok += jobs[i].rc == 0 && jobs[i].result.finish_reason == PAGODA_FINISH_LENGTH &&
              jobs[i].result.num_tokens == (size_t)jobs[i].max_tokens;
        prompt_total += jobs[i].prompt_len;
        output_total += jobs[i].result.num_tokens;
    }
    CHECK(ok == N, "all %d requests completed once with max_tokens tokens (%d)", N, ok);
    CHECK(compare_with_pagoda_run(g, jobs, N, 48) == 0, "every output equals pagoda-run");
    int rc = pagoda_stats(plain, &after);
    CHECK(rc == 0 && after.duplicate_submits > before.duplicate_submits,
          "the router received duplicated submits: %llu",
          (unsigned long long)(after.duplicate_submits - before.duplicate_submits));
    CHECK(rc == 0 && after.finished_requests == N && after.live_requests == 0,
          "the router holds exactly %d requests (finished %u, live %u)", N, after.finished_requests,
          after.live_requests);
    /* Each request computed once: its prompt, and one token per decode step after the first
     * output token, allowing one more per request (a step run ahead of a stop). A request run
     * twice would add at least its 39 or more decode tokens and a prompt token. */
    uint64_t once = prompt_total + output_total - N;
    CHECK(rc == 0 && after.computed_tokens <= once + N,
          "the worker computed %llu tokens: every request once (%llu)",
          (unsigned long long)after.computed_tokens, (unsigned long long)once);
    free_jobs(jobs, N);
    pagoda_client_close(c);

    /* By hand: the same Submit twice, then the same id with other parameters. */
    uint8_t id[16];
    if (getrandom(id, sizeof(id), 0) != (ssize_t)sizeof(id))
        memset(id, 0x5a, sizeof(id));
    int32_t prompt[10];
    group_prompt(prompt, 10, 99, VOCAB);
    pagoda_engine_stats s1 = {0}, s2 = {0}, s3 = {0};
    Pagoda__ClientResponse *first = raw_submit(g, id, prompt, 10, 12);
    CHECK(submit_answer_for(first, id), "a raw Submit is accepted (%d)", resp_error(first));
    rc = pagoda_stats(plain, &s1);
    Pagoda__ClientResponse *second = raw_submit(g, id, prompt, 10, 12);
    CHECK(submit_answer_for(second, id), "the same Submit again answers with the same request (%d)",
          resp_error(second));
    rc |= pagoda_stats(plain, &s2);
    CHECK(rc == 0 && s2.duplicate_submits == s1.duplicate_submits + 1 &&
              s2.live_requests + s2.finished_requests == N + 1,
          "the router counted it as a duplicate (%llu -> %llu) and holds no second request "
          "(%u live, %u finished)",
          (unsigned long long)s1.duplicate_submits, (unsigned long long)s2.duplicate_submits,
          s2.live_requests, s2.finished_requests);
    Pagoda__ClientResponse *other = raw_submit(g, id, prompt, 10, 13);
    CHECK(resp_error(other) == PAGODA_EEXIST && other->error_message != NULL &&
              strstr(other->error_message, "different parameters") != NULL,
          "the same id with another max_tokens: PAGODA_EEXIST (%d, %s)", resp_error(other),
          other && other->error_message ? other->error_message : "-");
    rc = pagoda_stats(plain, &s3);
    CHECK(rc == 0 && s3.duplicate_submits == s2.duplicate_submits &&
              s3.live_requests + s3.finished_requests == N + 1,
          "the refused Submit changed nothing (%u live, %u finished)", s3.live_requests,
          s3.finished_requests);
    Pagoda__ClientResponse *answers[] = {first, second, other};
    for (int i = 0; i < 3; i++)
        if (answers[i] != NULL)
            pagoda__client_response__free_unpacked(answers[i], NULL);
    int32_t got[16], *want = NULL, *prompts[1] = {prompt};
    size_t lens[1] = {10}, want_len = 0;
    pagoda_finish_reason finish;
    int n = poll_to_end(plain, id, got, 16, &finish);
    int expected = group_expected(g, prompts, lens, 1, 12, &want, &want_len) == 0;
    CHECK(n == 12 && finish == PAGODA_FINISH_LENGTH && expected && want_len == 12 &&
              memcmp(got, want, 12 * sizeof(int32_t)) == 0,
          "the request generates its 12 tokens once, equal to pagoda-run (%d, %s)", n,
          pagoda_finish_reason_name(finish));
    free(want);
    pagoda_client_close(plain);
    CHECK(group_stop(g) == 0, "the group stops");
}

/* ---- streaming from the command line, and polls resumed by another client ----------------- */

/* What one run of the pagoda CLI printed, read through a pipe as it came. */
struct cli_output {
    char text[8192];
    size_t len;
    int pieces;         /* reads that returned bytes: separate arrivals */
    size_t first_piece; /* bytes of the first */
    int status;         /* exit status, or -1 */
};

/* Runs BIN_DIR/pagoda --url URL generate ARGS... (NULL-terminated) and reads its stdout through a
 * pipe until it closes. */
static void run_cli(const struct group *g, const char *const *args, struct cli_output *out)
{
    char prog[1100];
    snprintf(prog, sizeof(prog), "%s/pagoda", g->bin_dir);
    const char *argv[32] = {prog, "--url", g->url, "generate"};
    int n = 4;
    for (int i = 0; args[i] != NULL && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    memset(out, 0, sizeof(*out));
    out->status = -1;
    int fds[2];
    if (pipe(fds) != 0)
        return;
    pid_t pid = fork();
    if (pid < 0) {
        close(fds[0]);
        close(fds[1]);
        return;
    }
    if (pid == 0) {
        dup2(fds[1], STDOUT_FILENO);
        close(fds[0]);
        close(fds[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    for (;;) {
        ssize_t got = read(fds[0], out->text + out->len, sizeof(out->text) - 1 - out->len);
        if (got <= 0)
            break;
        if (out->pieces++ == 0)
            out->first_piece = (size_t)got;
        out->len += (size_t)got;
    }
    close(fds[0]);
    out->text[out->len] = '\0';
    int status;
    if (waitpid(pid, &status, 0) == pid && WIFEXITED(status))
        out->status = WEXITSTATUS(status);
}

/* Parses "1,2,3" (up to the first character that is neither a digit nor a comma) into ids.
 * Returns the count. */
static size_t parse_ids(const char *text, size_t len, int32_t *ids, size_t cap)
{
    size_t n = 0;
    for (size_t i = 0; i < len && n < cap;) {
        if (text[i] < '0' || text[i] > '9')
            break;
        int32_t v = 0;
        while (i < len && text[i] >= '0' && text[i] <= '9')
            v = v * 10 + (text[i++] - '0');
        ids[n++] = v;
        if (i < len && text[i] == ',')
            i++;
    }
    return n;
}

/* The token ids of a JSON object's "token_ids" array; returns the count or -1. */
static int json_ids(json_t *o, int32_t *ids, size_t cap)
{
    json_t *a = json_object_get(o, "token_ids");
    if (!json_is_array(a) || json_array_size(a) > cap)
        return -1;
    for (size_t i = 0; i < json_array_size(a); i++)
        ids[i] = (int32_t)json_integer_value(json_array_get(a, i));
    return (int)json_array_size(a);
}

static void scenario_stream_cli(struct group *g)
{
    /* Steps of 100 ms: the 8 tokens take most of a second to come. */
    const char *extra[] = {"--worker-arg", "--step-delay-ms", "--worker-arg", "100", NULL};
    CHECK(group_start(g, extra) == 0, "group started");
    enum { N = 8 };
    /* clang-format off */
    const char *json_args[] = {"--tokens", "5,17,300,42,7,99", "--max-tokens", "8",
                               "--temperature", "0.8", "--seed", "4242", "--ignore-eos", "--json",
                               NULL};
    const char *stream_args[] = {"--tokens", "5,17,300,42,7,99", "--max-tokens", "8",
                                 "--temperature", "0.8", "--seed", "4242", "--ignore-eos",
                                 "--stream", NULL};
    const char *stream_json_args[] = {"--tokens", "5,17,300,42,7,99", "--max-tokens", "8",
                                      "--temperature", "0.8", "--seed", "4242", "--ignore-eos",
                                      "--stream", "--json", NULL};
    /* clang-format on */
    static struct cli_output out;
    int32_t want[N] = {0}, got[N + 1];
    run_cli(g, json_args, &out);
    json_error_t err;
    json_t *o = json_loads(out.text, 0, &err);
    json_t *finish = json_object_get(o, "finish_reason");
    int n_want = json_ids(o, want, N);
    CHECK(out.status == 0 && n_want == N && json_is_string(finish) &&
              strcmp(json_string_value(finish), "length") == 0,
          "generate --json prints %d tokens, finish length (exit %d)", n_want, out.status);
    json_decref(o);

    run_cli(g, stream_args, &out);
    size_t first = parse_ids(out.text, out.first_piece, got, N + 1);
    size_t n = parse_ids(out.text, out.len, got, N + 1);
    CHECK(out.status == 0 && out.len > 0 && out.text[out.len - 1] == '\n',
          "generate --stream exits 0 and ends its line (exit %d)", out.status);
    CHECK(out.pieces >= 2 && first < N,
          "--stream output came in %d pieces, the first with %zu of the %d tokens", out.pieces,
          first, N);
    CHECK(n == N && memcmp(got, want, sizeof(want)) == 0,
          "--stream prints the %d tokens --json printed for the same seeded request (%zu)", N, n);

    /* --stream --json: one line per piece with its offset, then the summary. */
    run_cli(g, stream_json_args, &out);
    int lines = 0, contiguous = 1, summary_same = 0;
    size_t have = 0;
    for (char *line = strtok(out.text, "\n"); line != NULL; line = strtok(NULL, "\n")) {
        o = json_loads(line, 0, &err);
        int32_t ids[N + 1];
        int k = json_ids(o, ids, N + 1);
        json_t *off = json_object_get(o, "offset");
        if (json_is_integer(off)) {
            lines++;
            contiguous &= k > 0 && (size_t)json_integer_value(off) == have && have + k <= N &&
                          memcmp(ids, want + have, (size_t)k * sizeof(int32_t)) == 0;
            if (k > 0)
                have += (size_t)k;
        } else {
            summary_same = k == N && memcmp(ids, want, sizeof(want)) == 0;
        }
        json_decref(o);
    }
    CHECK(out.status == 0 && lines >= 2 && contiguous && have == N && summary_same,
          "--stream --json: %d pieces at consecutive offsets, %zu tokens, the summary the same "
          "tokens (exit %d)",
          lines, have, out.status);
    CHECK(group_stop(g) == 0, "the group stops");
}

static void scenario_poll_resume(struct group *g)
{
    const char *extra[] = {"--worker-arg", "--step-delay-ms", "--worker-arg", "50", NULL};
    CHECK(group_start(g, extra) == 0, "group started");
    enum { N = 24 };
    int32_t prompt[12];
    group_prompt(prompt, 12, 31, VOCAB);
    pagoda_generate_params p = group_greedy(N);
    p.temperature = 0.8f;
    p.has_seed = 1;
    p.seed = 5150;
    uint32_t timeout_ms = (uint32_t)(30000 * group_time_scale());

    /* The first client polls until a few tokens have come, then goes away. */
    pagoda_client *c;
    pagoda_client_open(g->url, &c);
    pagoda_client_set_timeout_ms(c, timeout_ms);
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    int32_t got[N];
    size_t have = 0;
    int polls = 0, offsets_ok = 1, rc = pagoda_submit(c, &p, prompt, 12, id);
    CHECK(rc == 0, "submitted (%d)", rc);
    pagoda_finish_reason finish = PAGODA_FINISH_NONE;
    while (rc == 0 && have < 3 && finish == PAGODA_FINISH_NONE) {
        pagoda_result r = {0};
        if ((rc = pagoda_poll(c, id, (uint32_t)have, 10000, &r)) == 0) {
            polls++;
            offsets_ok &= r.num_tokens == 0 || r.offset == have;
            for (size_t i = 0; i < r.num_tokens && have < N; i++)
                got[have++] = r.token_ids[i];
            finish = r.finish_reason;
        }
        pagoda_result_free(&r);
    }
    CHECK(rc == 0 && offsets_ok && have >= 3 && have < N && finish == PAGODA_FINISH_NONE,
          "the first client received %zu tokens in %d polls while the request runs", have, polls);
    pagoda_client_close(c);
    size_t resumed_at = have;
    sleep_ms(300); /* the request goes on with no client connected */

    /* A new client polls on from the offset reached. */
    pagoda_client_open(g->url, &c);
    pagoda_client_set_timeout_ms(c, timeout_ms);
    size_t first_piece = 0;
    while (rc == 0 && finish == PAGODA_FINISH_NONE) {
        pagoda_result r = {0};
        if ((rc = pagoda_poll(c, id, (uint32_t)have, 10000, &r)) == 0) {
            polls++;
            offsets_ok &= r.num_tokens == 0 || r.offset == have;
            offsets_ok &= have + r.num_tokens <= N;
            if (first_piece == 0)
                first_piece = r.num_tokens;
            for (size_t i = 0; i < r.num_tokens && have < N; i++)
                got[have++] = r.token_ids[i];
            finish = r.finish_reason;
        }
        pagoda_result_free(&r);
    }
    CHECK(rc == 0 && offsets_ok && have == N && finish == PAGODA_FINISH_LENGTH,
          "a new client polled on from offset %zu (first piece %zu tokens): %zu tokens in all, "
          "every reply at the offset asked (%d polls, finish %s)",
          resumed_at, first_piece, have, polls, pagoda_finish_reason_name(finish));

    /* The whole output once more from offset 0, and a one-shot generate of the same request. */
    pagoda_result again = {0}, once = {0};
    rc = pagoda_poll(c, id, 0, 0, &again);
    CHECK(rc == 0 && again.offset == 0 && again.num_tokens == N &&
              memcmp(again.token_ids, got, sizeof(got)) == 0,
          "a poll from offset 0 returns the same %d tokens (%zu)", N, again.num_tokens);
    rc = pagoda_generate(c, &p, prompt, 12, &once);
    CHECK(rc == 0 && once.num_tokens == N && memcmp(once.token_ids, got, sizeof(got)) == 0,
          "the tokens polled across two clients equal a one-shot generate of the same seeded "
          "request (%zu tokens)",
          once.num_tokens);
    int32_t *prompts[1] = {prompt}, *want = NULL;
    size_t lens[1] = {12}, want_len = 0;
    rc = group_expected_sampled(g, prompts, lens, 1, N, p.temperature, p.seed, &want, &want_len);
    CHECK(rc == 0 && want_len == N && memcmp(want, got, sizeof(got)) == 0,
          "and pagoda-run's output with the same seed");
    free(want);
    pagoda_result_free(&again);
    pagoda_result_free(&once);
    pagoda_client_close(c);
    CHECK(group_stop(g) == 0, "the group stops");
}

int main(int argc, char **argv)
{
    if (argc != 3 && !(argc == 4 && strcmp(argv[3], "cuda") == 0)) {
        fprintf(stderr, "usage: engine_test BIN_DIR SCENARIO [cuda] (see the source's first "
                        "comment)\n");
        return 2;
    }
    struct group g;
    int rc = group_setup(&g, argv[1], argc == 4);
    if (rc != 0)
        return rc;
    const char *s = argv[2];
    if (strcmp(s, "concurrent") == 0)
        scenario_concurrent(&g, "5");
    else if (strcmp(s, "overlap") == 0)
        scenario_concurrent(&g, "0");
    else if (strcmp(s, "streaming") == 0)
        scenario_streaming(&g);
    else if (strcmp(s, "kill-worker") == 0)
        scenario_kill_worker(&g, 0);
    else if (strcmp(s, "lose-device") == 0)
        scenario_kill_worker(&g, 1);
    else if (strcmp(s, "cancel") == 0)
        scenario_cancel(&g);
    else if (strcmp(s, "kill-scheduler") == 0)
        scenario_kill_program(&g, "scheduler");
    else if (strcmp(s, "kill-router") == 0)
        scenario_kill_program(&g, "router");
    else if (strcmp(s, "kill-router-scheduler") == 0)
        scenario_kill_program(&g, "router-scheduler");
    else if (strcmp(s, "stop-worker") == 0)
        scenario_stop_worker(&g, 0);
    else if (strcmp(s, "stop-worker-kill-scheduler") == 0)
        scenario_stop_worker(&g, 1);
    else if (strcmp(s, "faults") == 0)
        scenario_faults(&g);
    else if (strcmp(s, "stop-router") == 0)
        scenario_stop_router(&g);
    else if (strcmp(s, "resend") == 0)
        scenario_resend(&g);
    else if (strcmp(s, "stream-cli") == 0)
        scenario_stream_cli(&g);
    else if (strcmp(s, "poll-resume") == 0)
        scenario_poll_resume(&g);
    else if (strcmp(s, "bias-restart") == 0)
        scenario_bias_restart(&g);
    else
        fprintf(stderr, "unknown scenario %s\n", s);
    return group_finish(&g);
}
