/* The CUDA backend's fallback when a decode graph cannot be captured at open
 * (worker/cuda_backend_graphs.c, cuda_be_capture_graphs): with PAGODA_CUDA_GRAPH_FAIL_AT=<batch> (a
 * test's fault: the capture of that batch size is invalidated by a synchronization, as a capture
 * the stream refuses is), the backend still opens, counts one capture failure, frees the graphs
 * captured before, and runs every step launch by launch: SEQS sequences prefilled together, then
 * DECODE greedy decode steps of all of them give the same tokens, token for token, as the same
 * run with graphs off, and no step replays a graph. The fault at the first and at the last batch
 * size (the graphs of the smaller sizes captured, then freed). Then, in the same process, the
 * backend with graphs and no fault replays a graph at every decode step with the same tokens
 * (the knob, not something else, turned the graphs off; the device is fine after the fallback).
 * Last (it ruins the process's device context): a lost device. The backend is healthy
 * (backend_health) after its steps; a kernel that reads an address nothing maps faults the
 * context, after which a step fails and backend_health says the device context is lost (the
 * worker then exits so that a new process starts: engine_test's lose-device scenario).
 *
 *   test_cuda_graph_fallback [MODEL_DIR]   (default: $PAGODA_SOURCE_DIR/assets/pagoda-brown) */
#include "common/error.h"
#include "kernels/cuda/linear.h"
#include "tests/gpu/gpu_test.h"
#include "worker/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <string.h>

#define SEQS 4 /* max_num_seqs: the graphs of batches 1, 2 and 4 (model_budget_graph_batches) */
#define PROMPT 12
#define DECODE 24
#define BLOCK_SIZE 16
#define BLOCKS_PER_SEQ 3 /* 48 tokens: PROMPT + DECODE fit */
#define NUM_BLOCKS (1 + SEQS * BLOCKS_PER_SEQ)
#define FAIL_AT_ENV "PAGODA_CUDA_GRAPH_FAIL_AT"

struct result {
    int rc;
    char detail[256];
    uint64_t graph_steps, capture_failures;
    int32_t tokens[SEQS][DECODE]; /* the greedy token after the prompt and each decode step */
    /* With lose: backend_health after the steps, the fault's synchronisation, a step after the
     * fault, and backend_health then (its message in lost_detail). */
    int health_before, fault_sync, step_after, health_after;
    char lost_detail[256];
};

static int32_t argmax(const float *x, int64_t n)
{
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = i;
    return (int32_t)best;
}

static int64_t slot_of(const int32_t *table, int32_t pos)
{
    return (int64_t)table[pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE;
}

/* The prompts prefilled in one step, then DECODE steps of the SEQS sequences decoding together
 * (each a graph's exact batch size when graphs are on), greedy on the host. */
static int decode(struct backend *be, int64_t vocab, float *logits, struct result *r)
{
    int32_t tables[SEQS][BLOCKS_PER_SEQ], tokens[SEQS * PROMPT], positions[SEQS * PROMPT];
    int32_t qs[SEQS + 1], ctx[SEQS], rows[SEQS];
    int64_t slots[SEQS * PROMPT];
    uint32_t x = 4242;
    for (int s = 0; s < SEQS; s++)
        for (int i = 0; i < BLOCKS_PER_SEQ; i++)
            tables[s][i] = NUM_BLOCKS - 1 - (s * BLOCKS_PER_SEQ + i); /* not the identity */
    for (int s = 0; s <= SEQS; s++)
        qs[s] = s * PROMPT;
    for (int s = 0; s < SEQS; s++) {
        for (int i = 0; i < PROMPT; i++) {
            x = x * 1664525u + 1013904223u;
            tokens[s * PROMPT + i] = 3 + (int32_t)((x >> 8) % (uint32_t)(vocab - 3));
            positions[s * PROMPT + i] = i;
            slots[s * PROMPT + i] = slot_of(tables[s], i);
        }
        ctx[s] = PROMPT;
        rows[s] = s * PROMPT + PROMPT - 1;
    }
    struct fwd_batch b = {.num_tokens = SEQS * PROMPT,
                          .token_ids = tokens,
                          .positions = positions,
                          .slot_mapping = slots,
                          .num_seqs = SEQS,
                          .query_start = qs,
                          .context_lens = ctx,
                          .block_tables = &tables[0][0],
                          .max_blocks_per_seq = BLOCKS_PER_SEQ,
                          .num_logits = SEQS,
                          .logits_indices = rows};
    int rc = backend_forward(be, &b, logits);
    for (int step = 0; step < DECODE && rc == 0; step++) {
        int32_t tok[SEQS], pos[SEQS];
        int64_t slot[SEQS];
        for (int s = 0; s < SEQS; s++) {
            r->tokens[s][step] = argmax(logits + (int64_t)s * vocab, vocab);
            tok[s] = r->tokens[s][step];
            pos[s] = PROMPT + step;
            slot[s] = slot_of(tables[s], pos[s]);
            qs[s] = s;
            ctx[s] = pos[s] + 1;
            rows[s] = s;
        }
        qs[SEQS] = SEQS;
        if (step == DECODE - 1)
            break; /* the last token is sampled, not fed */
        struct fwd_batch d = b;
        d.num_tokens = SEQS;
        d.token_ids = tok;
        d.positions = pos;
        d.slot_mapping = slot;
        rc = backend_forward(be, &d, logits);
    }
    return rc;
}

/* A kernel that reads and writes where nothing is mapped: the context faults (an illegal address,
 * a sticky error). Returns the synchronisation's error. */
static cudaError_t fault_context(void)
{
    uint16_t *nowhere = (uint16_t *)(uintptr_t)0x100000; /* 16-byte aligned, unmapped */
    int rc = cuda_gemv(nowhere, nowhere, nowhere, 0, 1, 32, 16, 0);
    if (rc != 0)
        return cudaErrorLaunchFailure;
    return cudaDeviceSynchronize();
}

/* Opens the backend over a fresh pool with graphs on or off and, when fail_at > 0, the fault
 * at that batch size (the environment is read at open), then decodes; with lose, then faults the
 * device context and runs a step and backend_health again. */
static void run(const char *model, int graphs, int fail_at, int lose, struct result *r)
{
    memset(r, 0, sizeof(*r));
    struct model_weights *w = NULL;
    struct backend *be = NULL;
    void *pool = NULL;
    float *logits = NULL;
    if ((r->rc = model_weights_open(model, &w)) != 0)
        goto done;
    struct kv_geometry g = {.pool_id = 1,
                            .num_layers = (int32_t)w->config.num_layers,
                            .num_blocks = NUM_BLOCKS,
                            .block_size = BLOCK_SIZE,
                            .num_kv_heads = (int32_t)w->config.num_kv_heads,
                            .head_dim = (int32_t)w->config.head_dim,
                            .dtype = DTYPE_BF16};
    logits = calloc((size_t)SEQS * (size_t)w->config.vocab_size, sizeof(float));
    if (logits == NULL) {
        r->rc = PAGODA_ENOMEM;
        goto done;
    }
    if ((r->rc = cuda_pool_alloc(&g, 0, &pool)) != 0)
        goto done;
    struct cuda_backend_options o = cuda_backend_default_options();
    o.limits = (struct backend_limits){.max_num_tokens = SEQS * PROMPT,
                                       .max_num_seqs = SEQS,
                                       .max_blocks_per_seq = BLOCKS_PER_SEQ};
    o.cuda_graphs = graphs;
    char value[16];
    snprintf(value, sizeof(value), "%d", fail_at);
    if (fail_at > 0)
        setenv(FAIL_AT_ENV, value, 1);
    else
        unsetenv(FAIL_AT_ENV);
    r->rc = cuda_backend_open(&w->config, w, 0, &g, pool, &o, &be);
    unsetenv(FAIL_AT_ENV);
    if (r->rc != 0)
        goto done;
    r->rc = decode(be, w->config.vocab_size, logits, r);
    r->graph_steps = backend_graph_steps(be);
    r->capture_failures = backend_graph_capture_failures(be);
    if (lose && r->rc == 0) {
        static struct result again;
        r->health_before = backend_health(be);
        r->fault_sync = (int)fault_context();
        r->step_after = decode(be, w->config.vocab_size, logits, &again);
        r->health_after = backend_health(be);
        snprintf(r->lost_detail, sizeof(r->lost_detail), "%s", pagoda_error_detail());
    }
done:
    if (r->rc != 0)
        snprintf(r->detail, sizeof(r->detail), "%s", pagoda_error_detail());
    backend_close(be);
    cuda_pool_free(pool);
    free(logits);
    model_weights_close(w);
}

static int same_tokens(const struct result *a, const struct result *b)
{
    return memcmp(a->tokens, b->tokens, sizeof(a->tokens)) == 0;
}

int main(int argc, char **argv)
{
    gpu_test_require_device("test_cuda_graph_fallback");
    char path[4096];
    const char *model = gpu_test_model(argc, argv, path, sizeof(path));
    printf("== %s\n", model);

    static struct result off, fail, on;
    run(model, 0, 0, 0, &off);
    GPU_CHECK(off.rc == 0, "graphs off: %s (%s)", pagoda_strerror(off.rc), off.detail);
    if (off.rc != 0)
        return gpu_test_finish();
    GPU_CHECK(off.graph_steps == 0 && off.capture_failures == 0,
              "graphs off: no replay (%llu), no capture failure (%llu)",
              (unsigned long long)off.graph_steps, (unsigned long long)off.capture_failures);

    static const int fail_at[] = {1, SEQS};
    for (size_t k = 0; k < sizeof(fail_at) / sizeof(fail_at[0]); k++) {
        run(model, 1, fail_at[k], 0, &fail);
        GPU_CHECK(fail.rc == 0, "%s=%d: the backend opens all the same: %s (%s)", FAIL_AT_ENV,
                  fail_at[k], pagoda_strerror(fail.rc), fail.detail);
        if (fail.rc != 0)
            continue;
        GPU_CHECK(fail.capture_failures == 1, "%s=%d: one capture failure counted (%llu)",
                  FAIL_AT_ENV, fail_at[k], (unsigned long long)fail.capture_failures);
        GPU_CHECK(fail.graph_steps == 0, "%s=%d: no step replays a graph (%llu did)", FAIL_AT_ENV,
                  fail_at[k], (unsigned long long)fail.graph_steps);
        GPU_CHECK(same_tokens(&fail, &off),
                  "%s=%d: the greedy tokens of %d sequences over %d steps equal graphs off's",
                  FAIL_AT_ENV, fail_at[k], SEQS, DECODE);
    }

    run(model, 1, 0, 0, &on);
    GPU_CHECK(on.rc == 0, "graphs on, no fault: %s (%s)", pagoda_strerror(on.rc), on.detail);
    if (on.rc == 0) {
        GPU_CHECK(on.capture_failures == 0 && on.graph_steps == DECODE - 1,
                  "graphs on, no fault: every decode step replays a graph (%llu of %d), no "
                  "capture failure (%llu)",
                  (unsigned long long)on.graph_steps, DECODE - 1,
                  (unsigned long long)on.capture_failures);
        GPU_CHECK(same_tokens(&on, &off), "graphs on: the greedy tokens equal graphs off's");
    }

    static struct result lost;
    run(model, 1, 0, 1, &lost);
    GPU_CHECK(lost.rc == 0, "before the fault: %s (%s)", pagoda_strerror(lost.rc), lost.detail);
    if (lost.rc == 0) {
        GPU_CHECK(lost.health_before == 0, "backend_health after the steps: %s",
                  pagoda_strerror(lost.health_before));
        GPU_CHECK(lost.fault_sync != 0, "the faulting kernel faulted (%s)",
                  cudaGetErrorName((cudaError_t)lost.fault_sync));
        GPU_CHECK(lost.step_after == PAGODA_ECUDA, "a step after the fault fails: %s",
                  pagoda_strerror(lost.step_after));
        GPU_CHECK(lost.health_after == PAGODA_ECUDA && strstr(lost.lost_detail, "lost") != NULL,
                  "backend_health then says the device context is lost: %s (%s)",
                  pagoda_strerror(lost.health_after), lost.lost_detail);
    }
    return gpu_test_finish();
}
