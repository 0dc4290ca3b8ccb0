/* The CUDA backend's tensor-parallel path (worker/cuda_backend*.c, worker/cuda_tp.c) on one GPU:
 * two ranks as threads of one process, both on device 0, each with its shard of the weights and
 * a cpu comm (the collectives staged through pinned host memory), run a prompt and then decode
 * teacher-forced along TP 1's greedy path:
 *
 * - each rank's device sampler, run greedy on the last decode step, picks the argmax of that
 *   rank's own gathered logits (the sampler reads the whole vocabulary's logits on every rank;
 *   that the two ranks' logits are equal is the all-gather's doing and not checked);
 * - their logits are TP 1's within REL_TOL of the row's largest |logit|. The row-parallel sums
 *   are split (each rank sums half of O's and down's input dimension in f32, then the halves
 *   are added), so the f32 results differ by rounding, and a sum that lands near a bf16
 *   rounding boundary rounds to the neighbouring bf16 value (a step of 2^-8 relative) and
 *   carries through the later layers (measured on the H200 before O's bias was rounded as TP 1
 *   rounds it: 0.5e-2 to 0.8e-2);
 * - every greedy token over DECODE steps is TP 1's, except where TP 1's logit of TP 2's token
 *   is within MARGIN of its best (a near tie; counted and printed);
 * - the same with one pool of the whole model's KV heads shared by the ranks (each writes its
 *   own run of heads), and with random weights (--load-format random: each rank draws its
 *   slices of the whole model's draw, so random TP 2 computes what random TP 1 does), and,
 *   where NCCL was built, with a one-rank NCCL group (device buffers straight to NCCL; one GPU
 *   cannot hold an NCCL group of two), whose logits are TP 1's bit for bit, with or without
 *   O's bias (the tensor-parallel path's f32 outputs rounded by cuda_to_bf16_bias equal
 *   cuBLAS's bf16 outputs, and O's bias is added to the rounded value as TP 1 adds it);
 * - the whole model's weights on a rank of two are refused (PAGODA_EMISMATCH), and so are two
 *   ranks with different step limits, on both ranks at open (cuda_tp_agree).
 *
 *   test_cuda_tp [MODEL_DIR...]   (each model must split in two: heads, KV heads, MLP; default:
 *                                  $PAGODA_SOURCE_DIR/assets/pagoda-brown) */
#include "comm/comm.h"
#include "common/error.h"
#include "tests/gpu/gpu_test.h"
#include "worker/cuda_backend.h"
#ifdef PAGODA_HAVE_NCCL
#include "comm/comm_nccl.h"
#endif

#include <math.h>
#include <pthread.h>
#include <string.h>

#define PROMPT 24
#define DECODE 32
#define ROWS (PROMPT + DECODE)
#define BLOCK_SIZE 16
#define NUM_BLOCKS 8 /* 7 usable: 112 tokens */
#define REL_TOL 1e-2
#define RANDOM_SEED 7
#define MARGIN 0.05
#define TIMEOUT_MS 60000

/* One rank's run (or TP 1's, comm NULL). */
struct run {
    const char *model;
    struct comm *comm;
    int whole_shard;       /* open the shard of rank 0 of 1 even with a comm (NCCL of one) */
    int random;            /* random weights (RANDOM_SEED) of the model's shape */
    int32_t max_seqs;      /* the step limit max_num_seqs; 0: 64 */
    const int32_t *forced; /* [DECODE]: the tokens fed while decoding; NULL: its own greedy */
    void *shared_pool;     /* non-NULL: a device pool of the whole model's heads */
    int rc;
    char detail[256];
    int64_t vocab;
    int o_bias;
    float *logits;          /* [ROWS][vocab] */
    int32_t tokens[DECODE]; /* argmax of rows PROMPT - 1 ... ROWS - 2 */
    int32_t sampled;        /* the device sampler's greedy token of the last step (row ROWS - 1) */
};

static int32_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

/* A prefill of PROMPT tokens asking for every row's logits, then DECODE single-token steps. */
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
        /* The last step again (the same token at the same position: the same K and V written
         * over themselves), sampled greedily on the device. */
        if (rc == 0 && s == DECODE - 1) {
            struct sample_row sr = {.params = sampling_params_default()};
            sr.params.temperature = 0.0f;
            float logprob = 0.0f;
            rc = backend_forward_sample(be, &d, &sr, &r->sampled, &logprob);
        }
    }
    return rc;
}

static struct kv_geometry geometry_of(const struct model_weights *w, int64_t kv_heads)
{
    struct kv_geometry g = {.pool_id = 1,
                            .num_layers = (int32_t)w->config.num_layers,
                            .num_blocks = NUM_BLOCKS,
                            .block_size = BLOCK_SIZE,
                            .num_kv_heads = (int32_t)kv_heads,
                            .head_dim = (int32_t)w->config.head_dim,
                            .dtype = DTYPE_BF16};
    return g;
}

static void *run_main(void *arg)
{
    struct run *r = arg;
    struct model_weights *w = NULL;
    struct backend *be = NULL;
    void *pool = NULL;
    int rank = r->comm && !r->whole_shard ? comm_rank(r->comm) : 0;
    int size = r->comm && !r->whole_shard ? comm_size(r->comm) : 1;
    if ((r->rc = model_weights_open_shard(r->model, rank, size, &w)) != 0)
        goto done;
    r->vocab = w->config.vocab_size;
    r->o_bias = w->config.o_bias;
    r->logits = calloc((size_t)ROWS * (size_t)r->vocab, sizeof(float));
    if (r->logits == NULL) {
        r->rc = PAGODA_ENOMEM;
        goto done;
    }
    struct kv_geometry g =
        geometry_of(w, r->shared_pool ? w->config.num_kv_heads : w->shard.num_kv_heads);
    if (r->shared_pool == NULL && (r->rc = cuda_pool_alloc(&g, 0, &pool)) != 0)
        goto done;
    struct cuda_backend_options o = cuda_backend_default_options();
    o.limits = (struct backend_limits){.max_num_tokens = 64,
                                       .max_num_seqs = r->max_seqs ? r->max_seqs : 64,
                                       .max_blocks_per_seq = NUM_BLOCKS - 1};
    o.comm = r->comm;
    /* A tensor-parallel rank's row-parallel sums join the residual stream as BF16 values, the
     * form TP 1 takes without residual_gemm (which adds O's and down's f32 products inside the
     * GEMM): TP 1 runs in that form, so that what is compared is the split and nothing else. */
    o.residual_gemm_max_rows = 0;
    if ((r->rc = cuda_backend_open(&w->config, r->random ? NULL : w, r->random ? RANDOM_SEED : 0,
                                   &g, r->shared_pool ? r->shared_pool : pool, &o, &be)) != 0)
        goto done;
    r->rc = steps(r, be);
done:
    if (r->rc != 0)
        snprintf(r->detail, sizeof(r->detail), "%s", pagoda_error_detail());
    backend_close(be);
    model_weights_close(w);
    cuda_pool_free(pool);
    return NULL;
}

/* Two ranks as threads over a fresh cpu group; runs[0..1] are filled in. */
static void run_pair(struct run *runs)
{
    void *shared = aligned_alloc(64, comm_cpu_shared_bytes(2));
    int rc = shared ? comm_cpu_shared_init(shared, 2, TIMEOUT_MS) : PAGODA_ENOMEM;
    GPU_CHECK(rc == 0, "comm_cpu_shared_init");
    if (rc != 0)
        return;
    pthread_t th[2];
    for (int r = 0; r < 2; r++) {
        rc = comm_cpu_open(shared, r, &runs[r].comm);
        GPU_CHECK(rc == 0, "comm_cpu_open");
        if (rc != 0 || pthread_create(&th[r], NULL, run_main, &runs[r]) != 0)
            exit(1); /* cannot happen; do not leave a peer waiting */
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        comm_close(runs[r].comm);
    }
    comm_cpu_shared_fini(shared);
    free(shared);
}

/* The device sampler's greedy token of a rank against the argmax of the rank's own last row. */
static void check_sampled(const char *what, int rank, const struct run *r)
{
    int32_t want = argmax(r->logits + (int64_t)(ROWS - 1) * r->vocab, r->vocab);
    GPU_CHECK(r->sampled == want, "%s: rank %d's device sampler picks its logits' argmax (%d, %d)",
              what, rank, (int)r->sampled, (int)want);
}

/* got's logits and greedy tokens against TP 1's (one); returns the worst relative difference. */
static double compare(const char *what, const struct run *one, const struct run *got)
{
    const int64_t V = one->vocab;
    double worst = 0;
    for (int64_t row = 0; row < ROWS; row++) {
        const float *a = one->logits + row * V, *b = got->logits + row * V;
        double scale = 1;
        for (int64_t i = 0; i < V; i++)
            scale = fabs((double)a[i]) > scale ? fabs((double)a[i]) : scale;
        for (int64_t i = 0; i < V; i++) {
            double d = fabs((double)b[i] - a[i]) / scale;
            worst = d > worst ? d : worst;
        }
    }
    GPU_CHECK(worst <= REL_TOL, "%s: logits within %g of TP 1's (worst %g)", what, REL_TOL, worst);
    int near_ties = 0, bad = 0;
    for (int s = 0; s < DECODE; s++) {
        if (got->tokens[s] == one->tokens[s])
            continue;
        const float *row = one->logits + (int64_t)(PROMPT - 1 + s) * V;
        double gap = (double)row[one->tokens[s]] - row[got->tokens[s]];
        if (gap <= MARGIN) {
            near_ties++;
        } else {
            bad++;
            printf("  %s: greedy token %d is %d, TP 1's %d (gap %g)\n", what, s, got->tokens[s],
                   one->tokens[s], gap);
        }
    }
    GPU_CHECK(bad == 0, "%s: %d greedy tokens equal TP 1's but for near ties (%d bad)", what,
              DECODE, bad);
    printf("%s: worst relative logit difference %.3g, %d of %d greedy tokens at near ties\n", what,
           worst, near_ties, DECODE);
    return worst;
}

static void check_model(const char *model)
{
    printf("== %s\n", model);
    struct run one = {.model = model};
    run_main(&one);
    GPU_CHECK(one.rc == 0, "%s: TP 1: %s (%s)", model, pagoda_strerror(one.rc), one.detail);
    if (one.rc != 0)
        return;
    check_sampled("TP 1", 0, &one);
    /* Own pools (the shard's KV heads each), then one shared pool of the whole model's. */
    for (int shared = 0; shared < 2; shared++) {
        void *pool = NULL;
        if (shared) {
            struct model_weights *w = NULL;
            int rc = model_weights_open(model, &w);
            struct kv_geometry g =
                rc == 0 ? geometry_of(w, w->config.num_kv_heads) : (struct kv_geometry){0};
            GPU_CHECK(rc == 0 && cuda_pool_alloc(&g, 0, &pool) == 0, "the shared pool");
            model_weights_close(w);
            if (pool == NULL)
                continue;
        }
        struct run two[2] = {{.model = model, .forced = one.tokens, .shared_pool = pool},
                             {.model = model, .forced = one.tokens, .shared_pool = pool}};
        run_pair(two);
        const char *what = shared ? "TP 2, one shared pool" : "TP 2, a pool per rank";
        GPU_CHECK(two[0].rc == 0 && two[1].rc == 0, "%s: ranks: %s (%s), %s (%s)", what,
                  pagoda_strerror(two[0].rc), two[0].detail, pagoda_strerror(two[1].rc),
                  two[1].detail);
        if (two[0].rc == 0 && two[1].rc == 0) {
            check_sampled(what, 0, &two[0]);
            check_sampled(what, 1, &two[1]);
            compare(what, &one, &two[0]);
        }
        free(two[0].logits);
        free(two[1].logits);
        cuda_pool_free(pool);
    }
    /* Random weights: TP 2's slices of the draw against random TP 1. */
    struct run rone = {.model = model, .random = 1};
    run_main(&rone);
    GPU_CHECK(rone.rc == 0, "%s: random TP 1: %s (%s)", model, pagoda_strerror(rone.rc),
              rone.detail);
    if (rone.rc == 0) {
        struct run two[2] = {{.model = model, .random = 1, .forced = rone.tokens},
                             {.model = model, .random = 1, .forced = rone.tokens}};
        run_pair(two);
        GPU_CHECK(two[0].rc == 0 && two[1].rc == 0, "random TP 2: ranks: %s (%s), %s (%s)",
                  pagoda_strerror(two[0].rc), two[0].detail, pagoda_strerror(two[1].rc),
                  two[1].detail);
        if (two[0].rc == 0 && two[1].rc == 0)
            compare("TP 2, random weights", &rone, &two[0]);
        free(two[0].logits);
        free(two[1].logits);
    }
    free(rone.logits);
#ifdef PAGODA_HAVE_NCCL
    uint8_t id[COMM_NCCL_ID_BYTES];
    struct comm *nc = NULL;
    int rc = cudaSetDevice(0) == cudaSuccess ? comm_nccl_unique_id(id) : PAGODA_ECUDA;
    if (rc == 0)
        rc = comm_nccl_open(id, 1, 0, NULL, TIMEOUT_MS, &nc);
    GPU_CHECK(rc == 0, "NCCL group of one: %s (%s)", pagoda_strerror(rc), pagoda_error_detail());
    if (rc == 0) {
        struct run n1 = {.model = model, .comm = nc, .whole_shard = 1, .forced = one.tokens};
        run_main(&n1);
        GPU_CHECK(n1.rc == 0, "NCCL group of one: %s (%s)", pagoda_strerror(n1.rc), n1.detail);
        if (n1.rc == 0) {
            double worst = compare("NCCL group of one", &one, &n1);
            GPU_CHECK(worst == 0, "NCCL group of one: TP 1's logits bit for bit (%g, O bias %d)",
                      worst, one.o_bias);
            check_sampled("NCCL group of one", 0, &n1);
        }
        free(n1.logits);
        comm_close(nc);
    }
#else
    printf("NCCL not built: the one-rank NCCL group was not run\n");
#endif
    free(one.logits);
}

/* The whole model's weights on rank 1 of 2 are refused, naming both. */
static void check_refusal(const char *model)
{
    void *shared = aligned_alloc(64, comm_cpu_shared_bytes(2));
    struct comm *c = NULL;
    struct model_weights *w = NULL;
    if (shared == NULL || comm_cpu_shared_init(shared, 2, 1000) != 0 ||
        comm_cpu_open(shared, 1, &c) != 0 || model_weights_open(model, &w) != 0) {
        GPU_CHECK(0, "refusal: setup");
        return;
    }
    struct kv_geometry g = geometry_of(w, w->config.num_kv_heads);
    struct cuda_backend_options o = cuda_backend_default_options();
    o.comm = c;
    struct backend *be = NULL;
    char pool[1];
    int rc = cuda_backend_open(&w->config, w, 0, &g, pool, &o, &be);
    GPU_CHECK(rc == PAGODA_EMISMATCH && strstr(pagoda_error_detail(), "rank is 1 of 2"),
              "the whole model on rank 1 of 2 is refused: %s (%s)", pagoda_strerror(rc),
              pagoda_error_detail());
    backend_close(be);
    model_weights_close(w);
    comm_close(c);
    comm_cpu_shared_fini(shared);
    free(shared);
}

/* Two ranks whose step limits differ both refuse at open, naming the limits. */
static void check_disagreement(const char *model)
{
    struct run two[2] = {{.model = model}, {.model = model, .max_seqs = 32}};
    run_pair(two);
    for (int r = 0; r < 2; r++)
        GPU_CHECK(two[r].rc == PAGODA_EMISMATCH && strstr(two[r].detail, "step limits"),
                  "rank %d with other step limits refused at open: %s (%s)", r,
                  pagoda_strerror(two[r].rc), two[r].detail);
    free(two[0].logits);
    free(two[1].logits);
}

int main(int argc, char **argv)
{
    gpu_test_require_device("test_cuda_tp");
    /* Without arguments (ctest): the bundled pagoda-brown. */
    char brown[4200];
    const char *src = getenv("PAGODA_SOURCE_DIR");
    snprintf(brown, sizeof(brown), "%s/assets/pagoda-brown", src ? src : ".");
    char *dflt[] = {argv[0], brown};
    if (argc < 2) {
        argc = 2;
        argv = dflt;
    }
    for (int i = 1; i < argc; i++)
        check_model(argv[i]);
    check_refusal(argv[1]);
    check_disagreement(argv[1]);
    printf("test_cuda_tp: %d passed, %d failed\n", gpu_test_passed, gpu_test_failed);
    return gpu_test_failed ? 1 : 0;
}
