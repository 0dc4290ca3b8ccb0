/* Tests of worker/tp_group.c: rank 0's backend, wrapped by tp_leader_open, hands every step to
 * a follower (tp_follower_run in a thread) over the group; the tokens it samples (a greedy and a
 * seeded sampling sequence in one batch, prompt then decode) are TP 1's; a bad step is refused
 * on rank 0 without reaching the follower; a follower that is gone fails rank 0's step within
 * the timeout; a follower whose rank 0 never sends leaves when told to. And worker/tp_local.c,
 * the in-process group pagoda-worker runs: its tokens are TP 1's too, over one shared pool.
 * Model: the bundled pagoda-brown. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "comm/comm.h"
#include "common/error.h"
#include "worker/cpu_backend.h"
#include "worker/tp_group.h"
#include "worker/tp_local.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SEQS 2
#define PROMPT 10
#define DECODE 12
#define BLOCK_SIZE 16
#define BLOCKS_PER_SEQ 2
#define NUM_BLOCKS (1 + SEQS * BLOCKS_PER_SEQ)
#define TIMEOUT_MS 400

static char brown[4200];
static const struct backend_limits limits = {
    .max_num_tokens = 64, .max_num_seqs = 8, .max_blocks_per_seq = BLOCKS_PER_SEQ};

static int setup(void **state)
{
    (void)state;
    const char *src = getenv("PAGODA_SOURCE_DIR");
    snprintf(brown, sizeof(brown), "%s/assets/pagoda-brown", src ? src : ".");
    return 0;
}

/* One rank: its shard, its pool, its CPU backend. */
struct rank {
    struct model_weights *w;
    void *pool;
    struct backend *be;
};

static int rank_open(struct rank *r, struct comm *c)
{
    int rank = c ? comm_rank(c) : 0, size = c ? comm_size(c) : 1;
    int rc = model_weights_open_shard(brown, rank, size, &r->w);
    if (rc != 0)
        return rc;
    struct kv_geometry g = {.pool_id = 1,
                            .num_layers = (int32_t)r->w->config.num_layers,
                            .num_blocks = NUM_BLOCKS,
                            .block_size = BLOCK_SIZE,
                            .num_kv_heads = (int32_t)r->w->shard.num_kv_heads,
                            .head_dim = (int32_t)r->w->config.head_dim,
                            .dtype = DTYPE_F32};
    r->pool = calloc(1, kv_pool_bytes(&g));
    struct cpu_backend_options o = cpu_backend_default_options();
    o.limits = limits;
    o.comm = c;
    return cpu_backend_open(r->w, &g, r->pool, &o, &r->be);
}

static void rank_close(struct rank *r)
{
    backend_close(r->be);
    model_weights_close(r->w);
    free(r->pool);
}

/* Prompt then decode for SEQS sequences (greedy, and seeded sampling at temperature 0.8),
 * each step through backend_forward_sample_rows; out[s][i] is sequence s's i-th token. */
static int generate(struct backend *be, int32_t out[SEQS][DECODE])
{
    int32_t prompt[SEQS][PROMPT], table[SEQS][BLOCKS_PER_SEQ];
    for (int s = 0; s < SEQS; s++) {
        for (int i = 0; i < PROMPT; i++)
            prompt[s][i] = 5 + (int32_t)((s * 131 + i * 977) % 8000);
        for (int k = 0; k < BLOCKS_PER_SEQ; k++)
            table[s][k] = 1 + s * BLOCKS_PER_SEQ + k;
    }
    struct sample_row rows[SEQS];
    for (int s = 0; s < SEQS; s++) {
        rows[s] = (struct sample_row){
            .params = sampling_params_default(), .prompt_tokens = prompt[s], .n_prompt = PROMPT};
        rows[s].params.temperature = s == 0 ? 0.0f : 0.8f;
        rows[s].params.seed = 42;
    }
    for (int step = 0; step < DECODE; step++) {
        int32_t tokens[SEQS * PROMPT], positions[SEQS * PROMPT], qs[SEQS + 1], ctx[SEQS];
        int32_t idx[SEQS], sampled[SEQS];
        int64_t slots[SEQS * PROMPT];
        float logprobs[SEQS];
        struct backend_row_error errs[SEQS];
        int32_t n = 0;
        qs[0] = 0;
        for (int s = 0; s < SEQS; s++) {
            int32_t first = step == 0 ? 0 : PROMPT + step - 1, count = step == 0 ? PROMPT : 1;
            for (int32_t j = 0; j < count; j++) {
                int32_t pos = first + j;
                tokens[n] = pos < PROMPT ? prompt[s][pos] : out[s][pos - PROMPT];
                positions[n] = pos;
                slots[n] = (int64_t)table[s][pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE;
                n++;
            }
            qs[s + 1] = n;
            ctx[s] = first + count;
            idx[s] = n - 1;
            rows[s].output_index = (uint64_t)step;
            rows[s].output_tokens = out[s];
            rows[s].n_output = (size_t)step;
        }
        struct fwd_batch b = {.num_tokens = n,
                              .token_ids = tokens,
                              .positions = positions,
                              .slot_mapping = slots,
                              .num_seqs = SEQS,
                              .query_start = qs,
                              .context_lens = ctx,
                              .block_tables = &table[0][0],
                              .max_blocks_per_seq = BLOCKS_PER_SEQ,
                              .num_logits = SEQS,
                              .logits_indices = idx};
        int rc = backend_forward_sample_rows(be, &b, rows, sampled, logprobs, errs);
        if (rc != 0)
            return rc;
        for (int s = 0; s < SEQS; s++) {
            if (errs[s].code != 0)
                return errs[s].code;
            out[s][step] = sampled[s];
        }
    }
    return 0;
}

/* The follower's thread. */
struct follower {
    struct comm *c;
    int max_polls; /* keep_waiting says stop after this many idle polls */
    int polls;
    int open_rc, rc;
    uint64_t steps;
};

static int keep_waiting(void *ctx)
{
    struct follower *f = ctx;
    return ++f->polls < f->max_polls;
}

static void *follower_main(void *arg)
{
    struct follower *f = arg;
    struct rank r = {0};
    if ((f->open_rc = rank_open(&r, f->c)) == 0)
        f->rc = tp_follower_run(r.be, f->c, &limits, keep_waiting, f, &f->steps);
    rank_close(&r);
    comm_close(f->c);
    return NULL;
}

struct group {
    void *shared;
    struct comm *c0;
    struct follower f;
    pthread_t th;
};

static void group_start(struct group *g, int max_polls)
{
    g->shared = aligned_alloc(64, comm_cpu_shared_bytes(2));
    assert_int_equal(comm_cpu_shared_init(g->shared, 2, TIMEOUT_MS), 0);
    assert_int_equal(comm_cpu_open(g->shared, 0, &g->c0), 0);
    g->f = (struct follower){.max_polls = max_polls};
    assert_int_equal(comm_cpu_open(g->shared, 1, &g->f.c), 0);
    assert_int_equal(pthread_create(&g->th, NULL, follower_main, &g->f), 0);
}

static void group_end(struct group *g)
{
    pthread_join(g->th, NULL);
    comm_close(g->c0);
    comm_cpu_shared_fini(g->shared);
    free(g->shared);
}

static void test_leader_and_follower_sample_tp1s_tokens(void **state)
{
    (void)state;
    struct rank one = {0};
    assert_int_equal(rank_open(&one, NULL), 0);
    int32_t want[SEQS][DECODE];
    assert_int_equal(generate(one.be, want), 0);
    rank_close(&one);

    struct group g;
    group_start(&g, 1 << 30);
    struct rank r0 = {0};
    assert_int_equal(rank_open(&r0, g.c0), 0);
    struct backend *leader;
    assert_int_equal(tp_leader_open(r0.be, g.c0, &limits, &leader), 0);
    r0.be = NULL; /* the leader owns it */
    int32_t got[SEQS][DECODE];
    assert_int_equal(generate(leader, got), 0);
    assert_memory_equal(got, want, sizeof(got));
    backend_close(leader); /* tells the follower to stop */
    rank_close(&r0);
    group_end(&g);
    assert_int_equal(g.f.open_rc, 0);
    assert_int_equal(g.f.rc, 0);
    assert_int_equal(g.f.steps, DECODE);
}

/* A step above the vocabulary is refused on rank 0 and never sent; the next one runs. */
/* tp_leader_on_broken's callback: how often, with which code. */
struct broken {
    int calls, rc;
};

static void on_broken(int rc, void *ctx)
{
    struct broken *b = ctx;
    b->calls++;
    b->rc = rc;
}

static void test_bad_step_stays_on_rank0(void **state)
{
    (void)state;
    struct group g;
    group_start(&g, 1 << 30);
    struct rank r0 = {0};
    assert_int_equal(rank_open(&r0, g.c0), 0);
    struct backend *leader;
    assert_int_equal(tp_leader_open(r0.be, g.c0, &limits, &leader), 0);
    r0.be = NULL;
    struct broken broke = {0};
    tp_leader_on_broken(leader, on_broken, &broke);
    int32_t tok = 1 << 20, pos = 0, qs[2] = {0, 1}, ctx = 1, table[1] = {1}, row = 0;
    int64_t slot = BLOCK_SIZE;
    struct fwd_batch b = {.num_tokens = 1,
                          .token_ids = &tok,
                          .positions = &pos,
                          .slot_mapping = &slot,
                          .num_seqs = 1,
                          .query_start = qs,
                          .context_lens = &ctx,
                          .block_tables = table,
                          .max_blocks_per_seq = 1,
                          .num_logits = 1,
                          .logits_indices = &row};
    float *logits = malloc(8192 * sizeof(float));
    assert_int_equal(backend_forward(leader, &b, logits), PAGODA_ERANGE);
    tok = 7;
    assert_int_equal(backend_forward(leader, &b, logits), 0);
    assert_int_equal(broke.calls, 0); /* a refused step is no broken group */
    backend_close(leader);
    rank_close(&r0);
    group_end(&g);
    assert_int_equal(g.f.rc, 0);
    assert_int_equal(g.f.steps, 1);
    free(logits);
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The follower leaves before any step: rank 0's first step fails within the timeout. */
static void test_gone_follower_fails_the_step(void **state)
{
    (void)state;
    struct group g;
    group_start(&g, 1);
    pthread_join(g.th, NULL);
    assert_int_equal(g.f.rc, PAGODA_ECLOSED);
    struct rank r0 = {0};
    assert_int_equal(rank_open(&r0, g.c0), 0);
    struct backend *leader;
    assert_int_equal(tp_leader_open(r0.be, g.c0, &limits, &leader), 0);
    r0.be = NULL;
    struct broken broke = {0};
    tp_leader_on_broken(leader, on_broken, &broke);
    int32_t out[SEQS][DECODE];
    double t0 = now_ms();
    assert_int_equal(generate(leader, out), PAGODA_ETIMEDOUT);
    double waited = now_ms() - t0;
    assert_int_equal(broke.calls, 1);
    assert_int_equal(broke.rc, PAGODA_ETIMEDOUT);
    assert_true(waited >= TIMEOUT_MS * 0.9 && waited < TIMEOUT_MS * 20);
    backend_close(leader); /* its stop fails at once: the group is broken */
    rank_close(&r0);
    comm_close(g.c0);
    comm_cpu_shared_fini(g.shared);
    free(g.shared);
}

/* Rank 0 never sends: the follower waits idle past the timeout, then leaves when told. */
static void test_follower_leaves_when_told(void **state)
{
    (void)state;
    struct group g;
    group_start(&g, 3 + TIMEOUT_MS / COMM_IDLE_POLL_MS);
    group_end(&g);
    assert_int_equal(g.f.rc, PAGODA_ECLOSED);
    assert_int_equal(g.f.steps, 0);
    assert_int_equal(g.f.polls, 3 + TIMEOUT_MS / COMM_IDLE_POLL_MS);
}

/* tp_local: two ranks in threads over one pool of the whole model's heads sample TP 1's tokens;
 * three ranks are refused (4 query heads). */
static void test_local_group_samples_tp1s_tokens(void **state)
{
    (void)state;
    struct rank one = {0};
    assert_int_equal(rank_open(&one, NULL), 0);
    int32_t want[SEQS][DECODE];
    assert_int_equal(generate(one.be, want), 0);
    struct kv_geometry g = {.pool_id = 1,
                            .num_layers = (int32_t)one.w->config.num_layers,
                            .num_blocks = NUM_BLOCKS,
                            .block_size = BLOCK_SIZE,
                            .num_kv_heads = (int32_t)one.w->config.num_kv_heads,
                            .head_dim = (int32_t)one.w->config.head_dim,
                            .dtype = DTYPE_F32};
    rank_close(&one);
    void *pool = calloc(1, kv_pool_bytes(&g));
    struct cpu_backend_options o = cpu_backend_default_options();
    o.limits = limits;
    struct backend *be = NULL;
    assert_int_equal(tp_local_open(brown, 2, &g, pool, &o, TIMEOUT_MS, &be), 0);
    int32_t got[SEQS][DECODE];
    assert_int_equal(generate(be, got), 0);
    assert_memory_equal(got, want, sizeof(got));
    backend_close(be);
    assert_int_equal(tp_local_open(brown, 3, &g, pool, &o, TIMEOUT_MS, &be), PAGODA_EUNSUPPORTED);
    assert_non_null(strstr(pagoda_error_detail(), "num_attention_heads"));
    assert_int_equal(tp_local_open(brown, 1, &g, pool, &o, TIMEOUT_MS, &be), PAGODA_EINVAL);
    free(pool);
}

static void test_leader_needs_rank0(void **state)
{
    (void)state;
    void *shared = aligned_alloc(64, comm_cpu_shared_bytes(2));
    assert_int_equal(comm_cpu_shared_init(shared, 2, TIMEOUT_MS), 0);
    struct comm *c1;
    assert_int_equal(comm_cpu_open(shared, 1, &c1), 0);
    struct rank r1 = {0};
    assert_int_equal(rank_open(&r1, c1), 0);
    struct backend *leader = NULL;
    assert_int_equal(tp_leader_open(r1.be, c1, &limits, &leader), PAGODA_EINVAL);
    r1.be = NULL; /* closed by the refusal */
    rank_close(&r1);
    comm_close(c1);
    comm_cpu_shared_fini(shared);
    free(shared);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_leader_and_follower_sample_tp1s_tokens),
        cmocka_unit_test(test_bad_step_stays_on_rank0),
        cmocka_unit_test(test_gone_follower_fails_the_step),
        cmocka_unit_test(test_follower_leaves_when_told),
        cmocka_unit_test(test_leader_needs_rank0),
        cmocka_unit_test(test_local_group_samples_tp1s_tokens),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
