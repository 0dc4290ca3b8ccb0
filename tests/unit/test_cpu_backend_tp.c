/* Tests of the CPU backend's tensor-parallel path (worker/cpu_backend.c with comm/): two ranks
 * (threads, each with its shard of the weights, its own pool of its KV heads and a cpu comm)
 * run a prompt and then decode; their logits, teacher-forced along TP 1's greedy path, are
 * TP 1's within a tolerance (the sums are split, so rounding differs), every greedy token is
 * TP 1's except at near ties, and both ranks return the same logits bit for bit. A rank whose
 * peer is gone fails its step with PAGODA_ETIMEDOUT within the group's timeout.
 *
 * Models: the tiny preset (untied, made by pagoda-mkmodel), the tiny preset with attention
 * biases (O's bias is added once, after the all-reduce), and the bundled pagoda-brown (tied
 * embeddings: the LM head is the embedding's vocabulary rows). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "comm/comm.h"
#include "common/error.h"
#include "worker/cpu_backend.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define PROMPT 24
#define DECODE 12
#define ROWS (PROMPT + DECODE)
#define BLOCK_SIZE 16
#define NUM_BLOCKS 8 /* 7 usable: 112 tokens */
/* |logit(TP 2) - logit(TP 1)| at most this times max(1, |logit(TP 1)|). */
#define REL_TOL 1e-4
#define DEAD_PEER_TIMEOUT_MS 400

static char tmpdir[] = "/tmp/pagoda-tp-XXXXXX";
static char tiny[4200], tiny_bias[4200], brown[4200];

static int setup(void **state)
{
    (void)state;
    const char *src = getenv("PAGODA_SOURCE_DIR"), *bin = getenv("PAGODA_BINARY_DIR");
    if (src == NULL || bin == NULL || mkdtemp(tmpdir) == NULL)
        return -1;
    snprintf(brown, sizeof(brown), "%s/assets/pagoda-brown", src);
    snprintf(tiny, sizeof(tiny), "%s/tiny", tmpdir);
    snprintf(tiny_bias, sizeof(tiny_bias), "%s/tiny-bias", tmpdir);
    char cmd[9000];
    snprintf(cmd, sizeof(cmd),
             "'%s/bin/pagoda-mkmodel' --preset tiny --out '%s' >/dev/null && "
             "'%s/bin/pagoda-mkmodel' --preset tiny --attention-bias --seed 7 --out '%s' "
             ">/dev/null",
             bin, tiny, bin, tiny_bias);
    return system(cmd) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* One rank's run (or TP 1's, comm NULL). */
struct run {
    const char *model;
    struct comm *comm;
    const int32_t *forced; /* [DECODE]: the tokens fed while decoding; NULL: its own greedy */
    int leave_early;       /* opens the backend and leaves without a step (a dead peer) */
    /* Non-NULL: a pool of the whole model's heads, which the ranks share (TP 1: its own). */
    float *shared_pool;
    int rc;
    double step_ms; /* how long the failing step took */
    int64_t vocab;
    size_t pool_bytes;      /* of a whole-model pool */
    float *pool_copy;       /* TP 1: its pool after the run, when shared_pool asks for it */
    float *logits;          /* [ROWS][vocab] */
    int32_t tokens[DECODE]; /* argmax of rows PROMPT - 1 ... ROWS - 2 */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int32_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* Steps through the run's model: a prefill of PROMPT tokens asking for every row's logits, then
 * DECODE single-token steps. */
static int steps(struct run *r, struct backend *be)
{
    int32_t tokens[PROMPT], positions[PROMPT], rows[PROMPT], table[NUM_BLOCKS - 1];
    int64_t slots[PROMPT];
    uint32_t x = 12345;
    for (int i = 0; i < NUM_BLOCKS - 1; i++)
        table[i] = NUM_BLOCKS - 1 - i; /* not the identity */
    for (int i = 0; i < PROMPT; i++) {
        x = x * 1664525u + 1013904223u;
        tokens[i] = 3 + (int32_t)((x >> 8) % (uint32_t)(r->vocab - 3));
        positions[i] = i;
        rows[i] = i;
        slots[i] = (int64_t)table[i / BLOCK_SIZE] * BLOCK_SIZE + i % BLOCK_SIZE;
    }
    int32_t qs[2] = {0, PROMPT}, ctx = PROMPT;
    struct fwd_batch b = {.num_tokens = PROMPT,
                          .token_ids = tokens,
                          .positions = positions,
                          .slot_mapping = slots,
                          .num_seqs = 1,
                          .query_start = qs,
                          .context_lens = &ctx,
                          .block_tables = table,
                          .max_blocks_per_seq = NUM_BLOCKS - 1,
                          .num_logits = PROMPT,
                          .logits_indices = rows};
    int rc = backend_forward(be, &b, r->logits);
    for (int s = 0; s < DECODE && rc == 0; s++) {
        r->tokens[s] = argmax(r->logits + (int64_t)(PROMPT - 1 + s) * r->vocab, r->vocab);
        int32_t tok = r->forced ? r->forced[s] : r->tokens[s], pos = PROMPT + s, row = 0;
        int64_t slot = (int64_t)table[pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE;
        int32_t dqs[2] = {0, 1}, dctx = pos + 1;
        struct fwd_batch d = b;
        d.num_tokens = 1;
        d.token_ids = &tok;
        d.positions = &pos;
        d.slot_mapping = &slot;
        d.query_start = dqs;
        d.context_lens = &dctx;
        d.num_logits = 1;
        d.logits_indices = &row;
        rc = backend_forward(be, &d, r->logits + (int64_t)(PROMPT + s) * r->vocab);
    }
    return rc;
}

static void *run_main(void *arg)
{
    struct run *r = arg;
    struct model_weights *w = NULL;
    struct backend *be = NULL;
    void *pool = NULL;
    int rank = r->comm ? comm_rank(r->comm) : 0, size = r->comm ? comm_size(r->comm) : 1;
    if ((r->rc = model_weights_open_shard(r->model, rank, size, &w)) != 0)
        goto done;
    r->vocab = w->config.vocab_size;
    struct kv_geometry g = {.pool_id = 1,
                            .num_layers = (int32_t)w->config.num_layers,
                            .num_blocks = NUM_BLOCKS,
                            .block_size = BLOCK_SIZE,
                            .num_kv_heads = (int32_t)w->shard.num_kv_heads,
                            .head_dim = (int32_t)w->config.head_dim,
                            .dtype = DTYPE_F32};
    if (r->shared_pool != NULL)
        g.num_kv_heads = (int32_t)w->config.num_kv_heads;
    pool = calloc(1, kv_pool_bytes(&g));
    if (pool != NULL && r->shared_pool != NULL)
        r->pool_bytes = kv_pool_bytes(&g);
    r->logits = calloc((size_t)ROWS * (size_t)r->vocab, sizeof(float));
    struct cpu_backend_options o = cpu_backend_default_options();
    o.limits = (struct backend_limits){
        .max_num_tokens = 64, .max_num_seqs = 64, .max_blocks_per_seq = NUM_BLOCKS - 1};
    o.comm = r->comm;
    if (pool == NULL || r->logits == NULL) {
        r->rc = PAGODA_ENOMEM;
        goto done;
    }
    if ((r->rc = cpu_backend_open(w, &g, r->shared_pool && r->comm ? r->shared_pool : pool, &o,
                                  &be)) != 0 ||
        r->leave_early)
        goto done;
    double t0 = now_ms();
    r->rc = steps(r, be);
    r->step_ms = now_ms() - t0;
    if (r->shared_pool != NULL && r->comm == NULL) {
        r->pool_copy = malloc(r->pool_bytes);
        if (r->pool_copy != NULL)
            memcpy(r->pool_copy, pool, r->pool_bytes);
    }
done:
    backend_close(be);
    model_weights_close(w);
    free(pool);
    if (r->comm)
        comm_close(r->comm);
    return NULL;
}

/* Runs `size` ranks as threads over a fresh cpu group; runs[r] are filled in. */
static void *run_group(struct run *runs, int size, int timeout_ms)
{
    void *shared = aligned_alloc(64, comm_cpu_shared_bytes(size));
    assert_non_null(shared);
    assert_int_equal(comm_cpu_shared_init(shared, size, timeout_ms), 0);
    pthread_t th[COMM_MAX_RANKS];
    for (int r = 0; r < size; r++) {
        assert_int_equal(comm_cpu_open(shared, r, &runs[r].comm), 0);
        assert_int_equal(pthread_create(&th[r], NULL, run_main, &runs[r]), 0);
    }
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    comm_cpu_shared_fini(shared);
    free(shared);
    return NULL;
}

static void check_tp2_equals_tp1(const char *model)
{
    struct run one = {.model = model};
    run_main(&one);
    assert_int_equal(one.rc, 0);
    struct run two[2] = {{.model = model, .forced = one.tokens},
                         {.model = model, .forced = one.tokens}};
    run_group(two, 2, COMM_DEFAULT_TIMEOUT_MS);
    assert_int_equal(two[0].rc, 0);
    assert_int_equal(two[1].rc, 0);
    int64_t V = one.vocab;
    /* Every rank returns the same gathered logits. */
    assert_memory_equal(two[0].logits, two[1].logits, (size_t)(ROWS * V) * sizeof(float));
    double worst = 0;
    for (int64_t i = 0; i < ROWS * V; i++) {
        double d = fabs((double)two[0].logits[i] - one.logits[i]);
        double scale = fabs((double)one.logits[i]) > 1 ? fabs((double)one.logits[i]) : 1;
        if (d / scale > worst)
            worst = d / scale;
    }
    if (worst > REL_TOL)
        fail_msg("%s: TP 2's logits differ from TP 1's by %g (relative)", model, worst);
    int near_ties = 0;
    for (int s = 0; s < DECODE; s++) {
        if (two[0].tokens[s] == one.tokens[s])
            continue;
        /* A different argmax is allowed only where TP 1's top two are within the tolerance. */
        const float *row = one.logits + (int64_t)(PROMPT - 1 + s) * V;
        double gap = fabs((double)row[one.tokens[s]] - row[two[0].tokens[s]]);
        if (gap > 4 * REL_TOL * (fabs((double)row[one.tokens[s]]) + 1))
            fail_msg("%s: greedy token %d is %d at TP 2, %d at TP 1 (gap %g)", model, s,
                     two[0].tokens[s], one.tokens[s], gap);
        near_ties++;
    }
    print_message("%s: worst relative logit difference %g, %d near ties\n", model, worst,
                  near_ties);
    free(one.logits);
    free(two[0].logits);
    free(two[1].logits);
}

/* Two ranks sharing one pool of the whole model's KV heads (each writes its own heads): their
 * logits are TP 1's, and the pool they filled together is TP 1's pool. */
static void test_shared_pool_tp2_equals_tp1(void **state)
{
    (void)state;
    float marker = 0;
    struct run one = {.model = brown, .shared_pool = &marker};
    run_main(&one);
    assert_int_equal(one.rc, 0);
    assert_non_null(one.pool_copy);
    float *pool = calloc(1, one.pool_bytes);
    assert_non_null(pool);
    struct run two[2] = {{.model = brown, .forced = one.tokens, .shared_pool = pool},
                         {.model = brown, .forced = one.tokens, .shared_pool = pool}};
    run_group(two, 2, COMM_DEFAULT_TIMEOUT_MS);
    assert_int_equal(two[0].rc, 0);
    assert_int_equal(two[1].rc, 0);
    int64_t n = ROWS * one.vocab;
    for (int64_t i = 0; i < n; i++)
        if (fabs((double)two[0].logits[i] - one.logits[i]) > REL_TOL * (fabs(one.logits[i]) + 1))
            fail_msg("logit %lld: %g at TP 2, %g at TP 1", (long long)i, two[0].logits[i],
                     one.logits[i]);
    size_t floats = one.pool_bytes / sizeof(float), written = 0;
    for (size_t i = 0; i < floats; i++) {
        if (fabs((double)pool[i] - one.pool_copy[i]) > REL_TOL * (fabs(one.pool_copy[i]) + 1))
            fail_msg("pool float %zu: %g at TP 2, %g at TP 1", i, pool[i], one.pool_copy[i]);
        written += one.pool_copy[i] != 0;
    }
    assert_true(written > floats / 8); /* the comparison saw real K/V */
    free(pool);
    free(one.pool_copy);
    free(one.logits);
    free(two[0].logits);
    free(two[1].logits);
}

static void test_tiny_tp2_equals_tp1(void **state)
{
    (void)state;
    check_tp2_equals_tp1(tiny);
}

static void test_tiny_attention_bias_tp2_equals_tp1(void **state)
{
    (void)state;
    check_tp2_equals_tp1(tiny_bias);
}

static void test_brown_tp2_equals_tp1(void **state)
{
    (void)state;
    check_tp2_equals_tp1(brown);
}

/* Rank 1 opens its backend and goes away: rank 0's first step fails within the timeout. */
static void test_dead_peer_fails_the_step(void **state)
{
    (void)state;
    struct run two[2] = {{.model = tiny}, {.model = tiny, .leave_early = 1}};
    run_group(two, 2, DEAD_PEER_TIMEOUT_MS);
    assert_int_equal(two[1].rc, 0);
    assert_int_equal(two[0].rc, PAGODA_ETIMEDOUT);
    assert_true(two[0].step_ms >= DEAD_PEER_TIMEOUT_MS * 0.9);
    assert_true(two[0].step_ms < DEAD_PEER_TIMEOUT_MS * 20); /* bounded: no hang */
    free(two[0].logits);
    free(two[1].logits);
}

/* The whole model's weights on a rank of two are refused, naming both. */
static void test_weights_must_be_the_ranks_shard(void **state)
{
    (void)state;
    void *shared = aligned_alloc(64, comm_cpu_shared_bytes(2));
    assert_int_equal(comm_cpu_shared_init(shared, 2, 1000), 0);
    struct comm *c;
    assert_int_equal(comm_cpu_open(shared, 1, &c), 0);
    struct model_weights *w;
    assert_int_equal(model_weights_open(tiny, &w), 0);
    struct kv_geometry g = {.pool_id = 1,
                            .num_layers = (int32_t)w->config.num_layers,
                            .num_blocks = NUM_BLOCKS,
                            .block_size = BLOCK_SIZE,
                            .num_kv_heads = (int32_t)w->config.num_kv_heads,
                            .head_dim = (int32_t)w->config.head_dim,
                            .dtype = DTYPE_F32};
    struct cpu_backend_options o = cpu_backend_default_options();
    o.comm = c;
    struct backend *be = NULL;
    char pool[1];
    assert_int_equal(cpu_backend_open(w, &g, pool, &o, &be), PAGODA_EMISMATCH);
    assert_non_null(strstr(pagoda_error_detail(), "rank 0 of 1"));
    assert_non_null(strstr(pagoda_error_detail(), "rank is 1 of 2"));
    model_weights_close(w);
    /* A shard's pool holds the shard's KV heads or the model's, nothing else. */
    assert_int_equal(model_weights_open_shard(tiny, 1, 2, &w), 0);
    g.num_kv_heads = 3;
    assert_int_equal(cpu_backend_open(w, &g, pool, &o, &be), PAGODA_EMISMATCH);
    assert_non_null(strstr(pagoda_error_detail(), "KV heads"));
    model_weights_close(w);
    comm_close(c);
    comm_cpu_shared_fini(shared);
    free(shared);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tiny_tp2_equals_tp1),
        cmocka_unit_test(test_tiny_attention_bias_tp2_equals_tp1),
        cmocka_unit_test(test_brown_tp2_equals_tp1),
        cmocka_unit_test(test_shared_pool_tp2_equals_tp1),
        cmocka_unit_test(test_dead_peer_fails_the_step),
        cmocka_unit_test(test_weights_must_be_the_ranks_shard),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
