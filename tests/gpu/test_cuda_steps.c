/* The CUDA backend's asynchronous steps (backend_submit, backend_complete) against its
 * synchronous ones, with penalised sampling: SEQS sequences of a model prefilled together, then
 * DECODE decode steps of all of them, each row with a repetition, presence and frequency penalty
 * (greedy, and every other row sampled with a seed). Synchronously (backend_forward_sample_rows)
 * each step has its inputs and the rows' whole histories on the host. Asynchronously step n + 1 is
 * submitted before step n is completed, as the worker's executor does: its input tokens are
 * gathered on the device from step n's slot (struct backend_gather) and so are its rows' last
 * history tokens (struct backend_history_gather: 0 on the host in their place). The same batches
 * through the same kernels: the tokens must be equal at every step. A history gather that read
 * nothing would change them: the synchronous run with 0 in place of each history's last token
 * must differ (the comparison can fail).
 *
 *   test_cuda_steps [MODEL_DIR]   (default: $PAGODA_SOURCE_DIR/assets/pagoda-brown) */
#include "common/error.h"
#include "tests/gpu/gpu_test.h"
#include "worker/cuda_backend.h"

#include <string.h>

#define SEQS 4
#define PROMPT 12
#define DECODE 24
#define BLOCK_SIZE 16
#define BLOCKS_PER_SEQ 3 /* 48 tokens: PROMPT + DECODE fit */
#define NUM_BLOCKS (1 + SEQS * BLOCKS_PER_SEQ)

struct run {
    int rc;
    char detail[256];
    int32_t prompt[SEQS][PROMPT];
    int32_t out[SEQS][DECODE + 1]; /* the prefill's token, then each decode step's */
};

static int64_t slot_of(const int32_t *table, int32_t pos)
{
    return (int64_t)table[pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE;
}

struct seqs {
    int32_t tables[SEQS][BLOCKS_PER_SEQ];
    struct sample_row rows[SEQS];
    int32_t tok[SEQS], pos[SEQS], qs[SEQS + 1], ctx[SEQS], logit_rows[SEQS];
    int64_t slot[SEQS];
    struct fwd_batch batch;
};

/* The decode batch of step k (its tokens are at position PROMPT + k; k = 0 is the first decode
 * step, whose inputs are the prefill's tokens): inputs from out[s][k], histories the prompt and
 * out[s][0 .. k] (n_output k + 1). */
static void decode_batch(struct seqs *q, struct run *r, int k)
{
    for (int s = 0; s < SEQS; s++) {
        q->tok[s] = r->out[s][k];
        q->pos[s] = PROMPT + k;
        q->slot[s] = slot_of(q->tables[s], q->pos[s]);
        q->qs[s] = s;
        q->ctx[s] = q->pos[s] + 1;
        q->logit_rows[s] = s;
        q->rows[s].output_tokens = r->out[s];
        q->rows[s].n_output = (size_t)k + 1;
        q->rows[s].output_index = (uint64_t)k + 1;
    }
    q->qs[SEQS] = SEQS;
    q->batch = (struct fwd_batch){.num_tokens = SEQS,
                                  .token_ids = q->tok,
                                  .positions = q->pos,
                                  .slot_mapping = q->slot,
                                  .num_seqs = SEQS,
                                  .query_start = q->qs,
                                  .context_lens = q->ctx,
                                  .block_tables = &q->tables[0][0],
                                  .max_blocks_per_seq = BLOCKS_PER_SEQ,
                                  .num_logits = SEQS,
                                  .logits_indices = q->logit_rows};
}

static int check_rows(const struct backend_row_error *re)
{
    for (int s = 0; s < SEQS; s++)
        if (re[s].code != 0)
            return pagoda_error_set(re[s].code, "row %d: %s", s, re[s].message);
    return 0;
}

/* How the decode steps run: synchronously, synchronously with 0 in place of each history's last
 * token (what a history gather that read nothing would leave), or step k + 1 submitted before
 * step k is completed. */
enum mode { SYNC, SYNC_NO_LAST, ASYNC };

/* Prefills the prompts (synchronously), then decodes DECODE penalised steps as mode says. */
static int decode(struct backend *be, enum mode mode, struct run *r)
{
    static struct seqs q;
    memset(&q, 0, sizeof(q));
    int32_t tokens[SEQS * PROMPT], positions[SEQS * PROMPT];
    int64_t slots[SEQS * PROMPT];
    for (int s = 0; s < SEQS; s++) {
        for (int i = 0; i < BLOCKS_PER_SEQ; i++)
            q.tables[s][i] = NUM_BLOCKS - 1 - (s * BLOCKS_PER_SEQ + i);
        struct sampling_params p = sampling_params_default();
        p.repetition_penalty = 1.3f;
        p.presence_penalty = 0.4f;
        p.frequency_penalty = 0.6f;
        if (s % 2) {
            p.temperature = 0.8f;
            p.top_k = 20;
            p.seed = 77u + (uint64_t)s;
        }
        q.rows[s].params = p;
        q.rows[s].prompt_tokens = r->prompt[s];
        q.rows[s].n_prompt = PROMPT;
        for (int i = 0; i < PROMPT; i++) {
            tokens[s * PROMPT + i] = r->prompt[s][i];
            positions[s * PROMPT + i] = i;
            slots[s * PROMPT + i] = slot_of(q.tables[s], i);
        }
        q.qs[s] = s * PROMPT;
        q.ctx[s] = PROMPT;
        q.logit_rows[s] = s * PROMPT + PROMPT - 1;
    }
    q.qs[SEQS] = SEQS * PROMPT;
    struct fwd_batch prefill = {.num_tokens = SEQS * PROMPT,
                                .token_ids = tokens,
                                .positions = positions,
                                .slot_mapping = slots,
                                .num_seqs = SEQS,
                                .query_start = q.qs,
                                .context_lens = q.ctx,
                                .block_tables = &q.tables[0][0],
                                .max_blocks_per_seq = BLOCKS_PER_SEQ,
                                .num_logits = SEQS,
                                .logits_indices = q.logit_rows};
    int32_t got[SEQS];
    float lp[SEQS];
    struct backend_row_error re[SEQS];
    int rc = backend_forward_sample_rows(be, &prefill, q.rows, got, lp, re);
    if (rc == 0)
        rc = check_rows(re);
    for (int s = 0; s < SEQS; s++) {
        r->out[s][0] = got[s];
        q.rows[s].n_output = 0;
    }
    static int32_t hist[SEQS][DECODE + 1];
    if (rc != 0 || mode != ASYNC) {
        for (int k = 0; rc == 0 && k < DECODE; k++) {
            decode_batch(&q, r, k);
            if (mode == SYNC_NO_LAST)
                for (int s = 0; s < SEQS; s++) {
                    memcpy(hist[s], r->out[s], (size_t)k * sizeof(int32_t));
                    hist[s][k] = 0;
                    q.rows[s].output_tokens = hist[s];
                }
            rc = backend_forward_sample_rows(be, &q.batch, q.rows, got, lp, re);
            if (rc == 0)
                rc = check_rows(re);
            for (int s = 0; s < SEQS && rc == 0; s++)
                r->out[s][k + 1] = got[s];
        }
        return rc;
    }
    /* Asynchronous: step k in slot k % BACKEND_STEP_SLOTS; step k + 1 reads step k's tokens on
     * the device. The host's copy of a history holds 0 where step k's token is still to come. */
    struct backend_gather g[SEQS];
    struct backend_history_gather hg[SEQS];
    for (int k = 0; rc == 0 && k < DECODE; k++) {
        decode_batch(&q, r, k);
        int n_g = 0;
        if (k > 0) {
            for (int s = 0; s < SEQS; s++) {
                memcpy(hist[s], r->out[s], (size_t)k * sizeof(int32_t));
                hist[s][k] = 0;
                q.rows[s].output_tokens = hist[s];
                q.tok[s] = 0;
                g[s] = (struct backend_gather){
                    .token = s, .slot = (k - 1) % BACKEND_STEP_SLOTS, .row = s};
                hg[s] = (struct backend_history_gather){
                    .row = s, .index = k, .slot = (k - 1) % BACKEND_STEP_SLOTS, .src_row = s};
            }
            n_g = SEQS;
        }
        rc = backend_submit(be, k % BACKEND_STEP_SLOTS, &q.batch, q.rows, g, n_g, hg, n_g);
        if (rc == 0 && k > 0) {
            double us;
            rc = backend_complete(be, (k - 1) % BACKEND_STEP_SLOTS, 1, got, lp, re, &us);
            if (rc == 0)
                rc = check_rows(re);
            for (int s = 0; s < SEQS && rc == 0; s++)
                r->out[s][k] = got[s];
        }
    }
    if (rc == 0) {
        double us;
        rc = backend_complete(be, (DECODE - 1) % BACKEND_STEP_SLOTS, 1, got, lp, re, &us);
        if (rc == 0)
            rc = check_rows(re);
        for (int s = 0; s < SEQS && rc == 0; s++)
            r->out[s][DECODE] = got[s];
    }
    return rc;
}

/* Opens the backend over a fresh pool and decodes. */
static void run(const char *model, enum mode mode, struct run *r)
{
    r->rc = 0;
    r->detail[0] = '\0';
    memset(r->out, 0, sizeof(r->out));
    struct model_weights *w = NULL;
    struct backend *be = NULL;
    void *pool = NULL;
    if ((r->rc = model_weights_open(model, &w)) != 0)
        goto done;
    uint32_t x = 4242;
    for (int s = 0; s < SEQS; s++)
        for (int i = 0; i < PROMPT; i++) {
            x = x * 1664525u + 1013904223u;
            r->prompt[s][i] = 3 + (int32_t)((x >> 8) % (uint32_t)(w->config.vocab_size - 3));
        }
    struct kv_geometry g = {.pool_id = 1,
                            .num_layers = (int32_t)w->config.num_layers,
                            .num_blocks = NUM_BLOCKS,
                            .block_size = BLOCK_SIZE,
                            .num_kv_heads = (int32_t)w->config.num_kv_heads,
                            .head_dim = (int32_t)w->config.head_dim,
                            .dtype = DTYPE_BF16};
    if ((r->rc = cuda_pool_alloc(&g, 0, &pool)) != 0)
        goto done;
    struct cuda_backend_options o = cuda_backend_default_options();
    o.limits = (struct backend_limits){.max_num_tokens = SEQS * PROMPT,
                                       .max_num_seqs = SEQS,
                                       .max_blocks_per_seq = BLOCKS_PER_SEQ};
    if ((r->rc = cuda_backend_open(&w->config, w, 0, &g, pool, &o, &be)) != 0)
        goto done;
    r->rc = decode(be, mode, r);
done:
    if (r->rc != 0)
        snprintf(r->detail, sizeof(r->detail), "%s", pagoda_error_detail());
    backend_close(be);
    cuda_pool_free(pool);
    model_weights_close(w);
}

int main(int argc, char **argv)
{
    gpu_test_require_device("test_cuda_steps");
    char path[4096];
    const char *src = getenv("PAGODA_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/assets/pagoda-brown", src ? src : ".");
    const char *model = argc > 1 ? argv[1] : path;
    printf("== %s\n", model);

    static struct run sync_pen, no_last, async_pen;
    run(model, SYNC, &sync_pen);
    run(model, SYNC_NO_LAST, &no_last);
    run(model, ASYNC, &async_pen);
    GPU_CHECK(sync_pen.rc == 0 && no_last.rc == 0 && async_pen.rc == 0,
              "the runs: %s (%s), %s (%s), %s (%s)", pagoda_strerror(sync_pen.rc), sync_pen.detail,
              pagoda_strerror(no_last.rc), no_last.detail, pagoda_strerror(async_pen.rc),
              async_pen.detail);
    if (sync_pen.rc == 0 && no_last.rc == 0 && async_pen.rc == 0) {
        GPU_CHECK(memcmp(no_last.out, sync_pen.out, sizeof(sync_pen.out)) != 0,
                  "0 in place of the histories' last tokens changes the tokens (the comparison "
                  "below can fail)");
        int same = 0;
        for (int s = 0; s < SEQS; s++)
            same += memcmp(sync_pen.out[s], async_pen.out[s], sizeof(sync_pen.out[s])) == 0;
        GPU_CHECK(same == SEQS,
                  "%d penalised sequences (greedy and seeded) over %d decode steps: two steps in "
                  "flight, inputs and last history tokens read on the device, give the "
                  "synchronous steps' tokens (%d of %d sequences)",
                  SEQS, DECODE, same, SEQS);
    }
    return gpu_test_finish();
}
