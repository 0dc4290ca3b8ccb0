/* Integration tests of the KV pool's identity on a real CPU group: kvpool killed with -9 (and
 * the worker after it), with a long greedy request running and prefix-cache hits. Outputs are
 * checked against pagoda-run, so KV read from the wrong pool changes the tokens.
 *
 *   pool_test BIN_DIR readopt     kill -9 of kvpool, then of the worker, amid a long request: the
 *                                 new kvpool re-adopts the pool (same identity), the new worker
 *                                 maps it, every output equals pagoda-run's and a repeated
 *                                 prefix is still served from the cache
 *   pool_test BIN_DIR lost-pool   the same, but the pool's segment is removed while kvpool is
 *                                 down (as if /dev/shm had been cleared): the new kvpool makes a
 *                                 new pool, and once the new worker maps it the scheduler drops
 *                                 its prefix cache and recomputes the running request; every
 *                                 output equals pagoda-run's and no cached_tokens are served
 *                                 from the old pool
 *   pool_test BIN_DIR kill-kvpool kill -9 of kvpool alone: the machine holds one pool afterwards
 *                                 (the worker maps no removed segment, /dev/shm holds the
 *                                 group's one segment, with its identity unchanged), the request
 *                                 completes unchanged, and after the drain no segment is left */
#include "group.h"
#include "kvpool/kvpool_client.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define VOCAB 512
#define BLOCK 16 /* the supervisor's default block size */
/* The long request: output tokens, and how many must have arrived before the kills. */
/* The long request: 1500 tokens, 700 in a sanitizer build (PAGODA_TEST_TIME_SCALE above 1),
 * which runs the model about 25 times slower; either is far past LONG_BEFORE_KILL, so the kills
 * come while it runs and hundreds of its tokens are computed after them. */
#define LONG_TOKENS (group_time_scale() > 1 ? 700 : 1500)
#define LONG_BEFORE_KILL 200
#define PREFIX_LEN 100 /* a prompt whose first 96 tokens (6 blocks) the cache holds */
#define SHORT_TOKENS 12
#define WAIT_STEPS 6000
static void sleep_ms(long millis)
{
    struct timespec ts = {millis / 1000, (millis % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static pagoda_client *client_open(const struct group *g)
{
    pagoda_client *c = NULL;
    if (pagoda_client_open(g->url, &c) != 0)
        return NULL;
    pagoda_client_set_timeout_ms(c, (uint32_t)(300000 * group_time_scale()));
    return c;
}

/* ---- the long request, in a thread of its own ------------------------------------------- */

struct long_job {
    const struct group *g;
    int32_t prompt[40];
    pagoda_result result;
    int rc;
    atomic_int received;
};

static void on_tokens(void *user, uint32_t offset, const int32_t *ids, const float *lp, size_t n)
{
    struct long_job *j = user;
    (void)ids, (void)lp;
    atomic_store(&j->received, (int)(offset + n));
}

static void *run_long(void *arg)
{
    struct long_job *j = arg;
    pagoda_client *c = client_open(j->g);
    if (c == NULL) {
        j->rc = -1;
        return NULL;
    }
    pagoda_generate_params p = group_greedy(LONG_TOKENS);
    j->rc = pagoda_generate_stream(c, &p, j->prompt, 40, on_tokens, j, &j->result);
    pagoda_client_close(c);
    return NULL;
}

/* ---- helpers ------------------------------------------------------------------------------ */

/* Generates greedily on a client of its own. */
static int generate(const struct group *g, const int32_t *prompt, size_t n, int32_t max_tokens,
                    pagoda_result *r)
{
    memset(r, 0, sizeof(*r));
    pagoda_client *c = client_open(g);
    if (c == NULL)
        return -1;
    pagoda_generate_params p = group_greedy(max_tokens);
    int rc = pagoda_generate(c, &p, prompt, n, r);
    pagoda_client_close(c);
    return rc;
}

/* r's tokens equal want's first n. */
static int same_tokens(const pagoda_result *r, const int32_t *want, size_t want_len, size_t n)
{
    if (r->num_tokens != n || want_len < n)
        return 0;
    return memcmp(r->token_ids, want, n * sizeof(int32_t)) == 0;
}

static size_t first_difference(const pagoda_result *r, const int32_t *want, size_t want_len)
{
    size_t i = 0;
    while (i < r->num_tokens && i < want_len && r->token_ids[i] == want[i])
        i++;
    return i;
}

/* What kvpool serves now (waiting for a restarted one to answer). */
static int fetch_pool(const struct group *g, struct kvpool_info *info)
{
    return kvpool_fetch_pool(g->run_dir, -1, (int)(60000 * group_time_scale()), NULL, info);
}

/* Waits for a running program of the group other than old_pid; returns its pid or -1. */
static pid_t wait_new_pid(const struct group *g, const char *program, pid_t old_pid)
{
    for (long i = 0; i < WAIT_STEPS * group_time_scale(); i++) {
        pid_t pid = group_program_pid(g, program);
        if (pid > 0 && pid != old_pid)
            return pid;
        sleep_ms(10);
    }
    return -1;
}

/* Waits until the scheduler has seen more than `restarts` worker restarts (the new worker's
 * Hello was handled). Returns 0 or -1. */
static int wait_worker_restarts(const struct group *g, uint64_t restarts)
{
    for (long i = 0; i < WAIT_STEPS * group_time_scale(); i++) {
        pagoda_client *c = client_open(g);
        pagoda_engine_stats st = {0};
        int rc = c ? pagoda_stats(c, &st) : -1;
        pagoda_client_close(c);
        if (rc == 0 && st.worker_restarts > restarts)
            return 0;
        sleep_ms(10);
    }
    return -1;
}

static uint64_t worker_restarts(const struct group *g)
{
    pagoda_client *c = client_open(g);
    pagoda_engine_stats st = {0};
    if (c != NULL)
        pagoda_stats(c, &st);
    pagoda_client_close(c);
    return st.worker_restarts;
}

/* Mappings of the pool's shared-memory segment in pid: all of them, and those of a segment
 * that was removed (the kernel marks them "(deleted)"). */
static void count_pool_maps(pid_t pid, const char *shm_name, int *all, int *deleted)
{
    *all = *deleted = 0;
    char path[64], line[1024], needle[160];
    snprintf(path, sizeof(path), "/proc/%d/maps", (int)pid);
    snprintf(needle, sizeof(needle), "/dev/shm%s", shm_name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return;
    while (fgets(line, sizeof(line), f) != NULL) {
        if (strstr(line, needle) == NULL)
            continue;
        (*all)++;
        if (strstr(line, "(deleted)") != NULL)
            (*deleted)++;
    }
    fclose(f);
}

static int shm_exists(const char *shm_name)
{
    char path[160];
    snprintf(path, sizeof(path), "/dev/shm%s", shm_name);
    return access(path, F_OK) == 0;
}

/* ---- scenarios ---------------------------------------------------------------------------- */

/* kill -9 of kvpool, then of the worker, amid a long greedy request (lose_pool: with the pool's
 * segment removed while kvpool is down, so that the new kvpool makes a new pool). */
static void scenario_kill_kvpool_then_worker(struct group *g, int lose_pool)
{
    /* clang-format off */
    const char *extra[] = {
        "--worker-arg", "--step-delay-ms", "--worker-arg", "4",
        NULL};
    /* clang-format on */
    CHECK(group_start(g, extra) == 0, "group started");
    struct kvpool_info before;
    CHECK(fetch_pool(g, &before) == 0 && before.shm_name[0] != '\0',
          "kvpool serves pool %016llx (%s)", (unsigned long long)before.geometry.pool_id,
          before.shm_name);

    /* Prompts: A, whose blocks the cache holds before the kills; B and C share A's first 96
     * tokens (asked after the kills); L, the long request. */
    int32_t pa[PREFIX_LEN], pb[PREFIX_LEN], pc[PREFIX_LEN];
    group_prompt(pa, PREFIX_LEN, 41, VOCAB);
    memcpy(pb, pa, sizeof(pa));
    group_prompt(pb + 96, PREFIX_LEN - 96, 42, VOCAB);
    memcpy(pc, pa, sizeof(pa));
    group_prompt(pc + 96, PREFIX_LEN - 96, 43, VOCAB);
    static struct long_job lj;
    memset(&lj, 0, sizeof(lj));
    lj.g = g;
    group_prompt(lj.prompt, 40, 44, VOCAB);

    pagoda_result ra, rb, rc_;
    int rc = generate(g, pa, PREFIX_LEN, SHORT_TOKENS, &ra);
    CHECK(rc == 0 && ra.num_tokens == SHORT_TOKENS, "A generated before the kills (%zu tokens)",
          ra.num_tokens);

    pthread_t th;
    pthread_create(&th, NULL, run_long, &lj);
    for (long i = 0;
         i < WAIT_STEPS * group_time_scale() && atomic_load(&lj.received) < LONG_BEFORE_KILL; i++)
        sleep_ms(10);
    uint64_t restarts = worker_restarts(g);

    /* kvpool dies. For lost-pool, the supervisor is held while the segment is removed, so that
     * the new kvpool cannot find it. */
    pid_t kvpool = group_program_pid(g, "pagoda-kvpool");
    pid_t worker = group_worker_pid(g);
    if (lose_pool)
        kill(g->supervisor, SIGSTOP);
    CHECK(kvpool > 0 && kill(kvpool, SIGKILL) == 0, "killed kvpool %d with %d tokens of L out",
          (int)kvpool, atomic_load(&lj.received));
    if (lose_pool) {
        int unlinked = shm_unlink(before.shm_name);
        CHECK(unlinked == 0, "removed %s while kvpool is down%s%s", before.shm_name,
              unlinked == 0 ? "" : ": ", unlinked == 0 ? "" : strerror(errno));
        kill(g->supervisor, SIGCONT);
    }
    CHECK(wait_new_pid(g, "pagoda-kvpool", kvpool) > 0, "the supervisor restarted kvpool");
    struct kvpool_info after;
    rc = fetch_pool(g, &after);
    CHECK(rc == 0, "the new kvpool serves pool %016llx",
          (unsigned long long)after.geometry.pool_id);
    if (lose_pool)
        CHECK(after.geometry.pool_id != before.geometry.pool_id,
              "a new pool: its identity differs from the old one's");
    else
        CHECK(after.geometry.pool_id == before.geometry.pool_id,
              "the old pool was re-adopted: same identity");

    /* The worker dies; its successor maps what kvpool serves now. */
    int long_at_kill = atomic_load(&lj.received);
    CHECK(worker > 0 && long_at_kill < LONG_TOKENS && kill(worker, SIGKILL) == 0,
          "killed worker %d while L runs (%d of %d tokens out)", (int)worker, long_at_kill,
          LONG_TOKENS);
    CHECK(wait_worker_restarts(g, restarts) == 0, "the scheduler took the new worker's Hello");

    /* B shares A's first 96 tokens: from the cache when the pool survived, computed when not. */
    rc = generate(g, pb, PREFIX_LEN, SHORT_TOKENS, &rb);
    CHECK(rc == 0 && rb.num_tokens == SHORT_TOKENS, "B generated after the kills");
    if (lose_pool)
        CHECK(rb.cached_tokens == 0, "B hit nothing of the old pool (cached_tokens %u)",
              rb.cached_tokens);
    else
        CHECK(rb.cached_tokens == 96, "B hit A's 96 tokens in the re-adopted pool (%u)",
              rb.cached_tokens);
    /* C too: by now the new pool caches B's blocks, which are A's. */
    rc = generate(g, pc, PREFIX_LEN, SHORT_TOKENS, &rc_);
    CHECK(rc == 0 && rc_.cached_tokens == 96, "C hit 96 cached tokens (%u)", rc_.cached_tokens);
    pthread_join(th, NULL);
    CHECK(lj.rc == 0 && lj.result.num_tokens == LONG_TOKENS, "L completed (%zu tokens)",
          lj.result.num_tokens);

    /* pagoda-run: the short prompts in one batch, the long one alone (one max_tokens each). */
    int32_t *prompts[4] = {pa, pb, pc, lj.prompt}, *want[4] = {0};
    size_t lens[4] = {PREFIX_LEN, PREFIX_LEN, PREFIX_LEN, 40}, want_len[4] = {0};
    rc = group_expected(g, prompts, lens, 3, SHORT_TOKENS, want, want_len);
    if (rc == 0)
        rc = group_expected(g, prompts + 3, lens + 3, 1, LONG_TOKENS, want + 3, want_len + 3);
    CHECK(rc == 0, "pagoda-run ran");
    if (rc == 0) {
        const pagoda_result *got[4] = {&ra, &rb, &rc_, &lj.result};
        const size_t n[4] = {SHORT_TOKENS, SHORT_TOKENS, SHORT_TOKENS, LONG_TOKENS};
        const char *name[4] = {"A", "B", "C", "L"};
        for (int i = 0; i < 4; i++)
            CHECK(same_tokens(got[i], want[i], want_len[i], n[i]),
                  "%s equals pagoda-run's tokens (first difference at %zu of %zu)", name[i],
                  first_difference(got[i], want[i], want_len[i]), n[i]);
    }
    for (int i = 0; i < 4; i++)
        free(want[i]);
    pagoda_result_free(&ra);
    pagoda_result_free(&rb);
    pagoda_result_free(&rc_);
    pagoda_result_free(&lj.result);
    CHECK(group_stop(g) == 0, "the group drains and stops");
    CHECK(!shm_exists(before.shm_name), "no segment is left in /dev/shm (%s)", before.shm_name);
}

/* kill -9 of kvpool alone: the restarted kvpool re-adopts the pool, so one pool is held. */
static void scenario_kill_kvpool(struct group *g)
{
    const char *extra[] = {"--worker-arg", "--step-delay-ms", "--worker-arg", "4", NULL};
    CHECK(group_start(g, extra) == 0, "group started");
    struct kvpool_info before;
    CHECK(fetch_pool(g, &before) == 0 && before.shm_name[0] != '\0', "kvpool serves %s",
          before.shm_name);
    static struct long_job lj;
    memset(&lj, 0, sizeof(lj));
    lj.g = g;
    group_prompt(lj.prompt, 40, 51, VOCAB);
    pthread_t th;
    pthread_create(&th, NULL, run_long, &lj);
    for (long i = 0;
         i < WAIT_STEPS * group_time_scale() && atomic_load(&lj.received) < LONG_BEFORE_KILL; i++)
        sleep_ms(10);
    pid_t kvpool = group_program_pid(g, "pagoda-kvpool");
    pid_t worker = group_worker_pid(g);
    CHECK(kvpool > 0 && atomic_load(&lj.received) < LONG_TOKENS && kill(kvpool, SIGKILL) == 0,
          "killed kvpool %d while the request runs (%d of %d tokens out)", (int)kvpool,
          atomic_load(&lj.received), LONG_TOKENS);
    CHECK(wait_new_pid(g, "pagoda-kvpool", kvpool) > 0, "the supervisor restarted kvpool");
    struct kvpool_info after;
    int rc = fetch_pool(g, &after);
    CHECK(rc == 0 && strcmp(after.shm_name, before.shm_name) == 0 &&
              after.geometry.pool_id == before.geometry.pool_id,
          "the new kvpool serves the same pool (%016llx, was %016llx)",
          (unsigned long long)after.geometry.pool_id, (unsigned long long)before.geometry.pool_id);
    int all = 0, deleted = 0;
    count_pool_maps(worker, before.shm_name, &all, &deleted);
    CHECK(all >= 1 && deleted == 0,
          "the worker maps the named pool and no removed one (%d mappings, %d removed): one pool "
          "is held",
          all, deleted);
    CHECK(shm_exists(before.shm_name), "/dev/shm holds the group's pool");
    pthread_join(th, NULL);
    int32_t *prompts[1] = {lj.prompt}, *want[1] = {0};
    size_t lens[1] = {40}, want_len[1] = {0};
    rc = group_expected(g, prompts, lens, 1, LONG_TOKENS, want, want_len);
    CHECK(lj.rc == 0 && rc == 0 && same_tokens(&lj.result, want[0], want_len[0], LONG_TOKENS),
          "the request completed with pagoda-run's tokens (first difference at %zu)",
          rc == 0 ? first_difference(&lj.result, want[0], want_len[0]) : 0);
    free(want[0]);
    pagoda_result_free(&lj.result);
    CHECK(group_stop(g) == 0, "the group drains and stops");
    CHECK(!shm_exists(before.shm_name), "no segment is left in /dev/shm after the drain");
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: pool_test BIN_DIR readopt|lost-pool|kill-kvpool\n");
        return 2;
    }
    struct group g;
    int rc = group_setup(&g, argv[1], 0);
    if (rc != 0)
        return rc;
    const char *s = argv[2];
    if (strcmp(s, "readopt") == 0)
        scenario_kill_kvpool_then_worker(&g, 0);
    else if (strcmp(s, "lost-pool") == 0)
        scenario_kill_kvpool_then_worker(&g, 1);
    else if (strcmp(s, "kill-kvpool") == 0)
        scenario_kill_kvpool(&g);
    else
        fprintf(stderr, "unknown scenario %s\n", s);
    return group_finish(&g);
}
