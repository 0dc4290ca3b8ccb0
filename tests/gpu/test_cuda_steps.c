/* The CUDA backend's asynchronous steps (backend_submit, backend_complete) against its
 * synchronous ones, with penalised sampling: SEQS sequences of a model prefilled together, then
 * DECODE decode steps of all of them, each row with a repetition, presence and frequency penalty
 * (greedy, and every other row sampled with a seed). Synchronously (backend_forward_sample_rows)
 * each step has its inputs and the rows' whole histories on the host. Asynchronously step n + 1 is
 * submitted before step n is completed, as the worker's executor does: its input tokens are
 * gathered on the device from step n's slot (struct backend_gather) and so are its rows' last
 * history tokens (struct backend_history_gather: 0 on the host in their place). The same batches
 * through the same kernels: the tokens must be equal at every step. The sequences change rows
 * from step to step (a gather must name its own sequence's row of the step before), and the
 * backend's row limit is not its slot count. A history gather that read nothing would change the
 * tokens: the synchronous run with 0 in place of each history's last token (from the second
 * decode step on, where gathers begin) must differ, so the comparison can fail. Then the
 * asynchronous run again with history keys (struct sample_row history_key, from the prefill on),
 * every token of the host's histories wrong (3) from the first decode step on: the sampler's
 * history slots hold the true ones, so the tokens must still be the synchronous run's.
 *
 *   test_cuda_steps [MODEL_DIR]   (default: $PAGODA_SOURCE_DIR/assets/pagoda-brown) */
#include "common/error.h"
#include "tests/gpu/gpu_test.h"
#include "worker/cuda_backend.h"

#include <string.h>

#define SEQS 4
#define MAX_SEQS 6 /* the backend's limit: d_sampled's stride differs from the slot count */
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
    int refused; /* ASYNC: backend_submit's code for a gather from a completed step's slot */
};

static int64_t slot_of(const int32_t *table, int32_t pos)
{
    return (int64_t)table[pos / BLOCK_SIZE] * BLOCK_SIZE + pos % BLOCK_SIZE;
}

struct seqs {
    int32_t tables[SEQS][BLOCKS_PER_SEQ]; /* by sequence */
    struct sampling_params params[SEQS];  /* by sequence */
    int32_t btab[SEQS][BLOCKS_PER_SEQ];   /* the step's block tables, by batch row */
    struct sample_row rows[SEQS];         /* by batch row */
    int32_t tok[SEQS], pos[SEQS], qs[SEQS + 1], ctx[SEQS], logit_rows[SEQS];
    int64_t slot[SEQS];
    struct fwd_batch batch;
};

/* Decode step k's batch row r holds sequence (r + k) % SEQS: the rows move from step to step,
 * so that a gather must name the source step's row of its own sequence. */
static int seq_at(int k, int row)
{
    return (row + k) % SEQS;
}

static int row_of(int k, int seq)
{
    return ((seq - k) % SEQS + SEQS) % SEQS;
}

/* The decode batch of step k (its tokens are at position PROMPT + k; k = 0 is the first decode
 * step, whose inputs are the prefill's tokens): inputs from out[seq][k], histories the prompt and
 * out[seq][0 .. k] (n_output k + 1). */
static void decode_batch(struct seqs *q, struct run *r, int k)
{
    for (int row = 0; row < SEQS; row++) {
        const int s = seq_at(k, row);
        q->tok[row] = r->out[s][k];
        q->pos[row] = PROMPT + k;
        q->slot[row] = slot_of(q->tables[s], q->pos[row]);
        memcpy(q->btab[row], q->tables[s], sizeof(q->btab[row]));
        q->qs[row] = row;
        q->ctx[row] = q->pos[row] + 1;
        q->logit_rows[row] = row;
        q->rows[row] = (struct sample_row){.params = q->params[s],
                                           .output_index = (uint64_t)k + 1,
                                           .prompt_tokens = r->prompt[s],
                                           .n_prompt = PROMPT,
                                           .output_tokens = r->out[s],
                                           .n_output = (size_t)k + 1};
    }
    q->qs[SEQS] = SEQS;
    q->batch = (struct fwd_batch){.num_tokens = SEQS,
                                  .token_ids = q->tok,
                                  .positions = q->pos,
                                  .slot_mapping = q->slot,
                                  .num_seqs = SEQS,
                                  .query_start = q->qs,
                                  .context_lens = q->ctx,
                                  .block_tables = &q->btab[0][0],
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
 * token from the second step on (what a history gather that read nothing would leave), or step
 * k + 1 submitted before step k is completed. */
enum mode { SYNC, SYNC_NO_LAST, ASYNC, ASYNC_KEYED };

/* Step k's tokens (got, by batch row) into out[seq][k + 1]. */
static void take(struct run *r, int k, const int32_t *got)
{
    for (int row = 0; row < SEQS; row++)
        r->out[seq_at(k, row)][k + 1] = got[row];
}

/* Completes step k (submitted into slot k % BACKEND_STEP_SLOTS) and takes its tokens. */
static int complete(struct backend *be, struct run *r, int k)
{
    int32_t got[SEQS];
    float lp[SEQS];
    struct backend_row_error re[SEQS];
    double us;
    int rc = backend_complete(be, k % BACKEND_STEP_SLOTS, 1, got, lp, re, &us);
    if (rc == 0)
        rc = check_rows(re);
    if (rc == 0)
        take(r, k, got);
    return rc;
}

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
        q.params[s] = p;
        q.rows[s] =
            (struct sample_row){.params = p,
                                .prompt_tokens = r->prompt[s],
                                .n_prompt = PROMPT,
                                .history_key = mode == ASYNC_KEYED ? 100u + (uint64_t)s : 0};
        memcpy(q.btab[s], q.tables[s], sizeof(q.btab[s]));
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
                                .block_tables = &q.btab[0][0],
                                .max_blocks_per_seq = BLOCKS_PER_SEQ,
                                .num_logits = SEQS,
                                .logits_indices = q.logit_rows};
    int32_t got[SEQS];
    float lp[SEQS];
    struct backend_row_error re[SEQS];
    int rc = backend_forward_sample_rows(be, &prefill, q.rows, got, lp, re);
    if (rc == 0)
        rc = check_rows(re);
    for (int s = 0; s < SEQS; s++)
        r->out[s][0] = got[s]; /* the prefill's row s is sequence s */
    static int32_t hist[SEQS][DECODE + 1], wrong[PROMPT + DECODE + 1];
    for (int i = 0; i < PROMPT + DECODE + 1; i++)
        wrong[i] = 3;
    if (rc != 0 || (mode != ASYNC && mode != ASYNC_KEYED)) {
        for (int k = 0; rc == 0 && k < DECODE; k++) {
            decode_batch(&q, r, k);
            if (mode == SYNC_NO_LAST && k > 0)
                for (int row = 0; row < SEQS; row++) {
                    const int s = seq_at(k, row);
                    memcpy(hist[s], r->out[s], (size_t)k * sizeof(int32_t));
                    hist[s][k] = 0;
                    q.rows[row].output_tokens = hist[s];
                }
            rc = backend_forward_sample_rows(be, &q.batch, q.rows, got, lp, re);
            if (rc == 0)
                rc = check_rows(re);
            if (rc == 0)
                take(r, k, got);
        }
        return rc;
    }
    /* Asynchronous: step k in slot k % BACKEND_STEP_SLOTS; step k + 1 reads step k's tokens on
     * the device, each from the row its sequence had there. The host's copy of a history holds
     * 0 where step k's token is still to come. */
    struct backend_gather g[SEQS];
    struct backend_history_gather hg[SEQS];
    for (int k = 0; rc == 0 && k < DECODE; k++) {
        decode_batch(&q, r, k);
        int n_g = 0;
        if (k > 0) {
            const int from = (k - 1) % BACKEND_STEP_SLOTS;
            for (int row = 0; row < SEQS; row++) {
                const int s = seq_at(k, row), src = row_of(k - 1, s);
                memcpy(hist[s], r->out[s], (size_t)k * sizeof(int32_t));
                hist[s][k] = 0;
                q.rows[row].output_tokens = hist[s];
                q.tok[row] = 0;
                g[row] = (struct backend_gather){.token = row, .slot = from, .row = src};
                hg[row] = (struct backend_history_gather){
                    .row = row, .index = k, .slot = from, .src_row = src};
            }
            n_g = SEQS;
        }
        if (mode == ASYNC_KEYED)
            for (int row = 0; row < SEQS; row++) {
                q.rows[row].history_key = 100u + (uint64_t)seq_at(k, row);
                q.rows[row].prompt_tokens = wrong;
                q.rows[row].output_tokens = wrong;
            }
        rc = backend_submit(be, k % BACKEND_STEP_SLOTS, &q.batch, q.rows, g, n_g, hg, n_g);
        if (rc == 0 && k > 0)
            rc = complete(be, r, k - 1);
    }
    if (rc == 0)
        rc = complete(be, r, DECODE - 1);
    if (rc == 0 && mode == ASYNC) { /* the last step's slot, completed: nothing to gather there */
        g[0] = (struct backend_gather){.token = 0, .slot = (DECODE - 1) % BACKEND_STEP_SLOTS};
        r->refused = backend_submit(be, DECODE % BACKEND_STEP_SLOTS, &q.batch, q.rows, g, 1, hg, 0);
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
                                       .max_num_seqs = MAX_SEQS,
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
    const char *model = gpu_test_model(argc, argv, path, sizeof(path));
    printf("== %s\n", model);

    static struct run sync_pen, no_last, async_pen, keyed;
    run(model, SYNC, &sync_pen);
    run(model, SYNC_NO_LAST, &no_last);
    run(model, ASYNC, &async_pen);
    run(model, ASYNC_KEYED, &keyed);
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
    GPU_CHECK(async_pen.refused == PAGODA_EINVAL,
              "a gather from a completed step's slot is refused (%d, PAGODA_EINVAL %d)",
              async_pen.refused, PAGODA_EINVAL);
    GPU_CHECK(keyed.rc == 0, "the run with history keys: %s (%s)", pagoda_strerror(keyed.rc),
              keyed.detail);
    if (sync_pen.rc == 0 && keyed.rc == 0) {
        int same = 0;
        for (int s = 0; s < SEQS; s++)
            same += memcmp(sync_pen.out[s], keyed.out[s], sizeof(sync_pen.out[s])) == 0;
        GPU_CHECK(same == SEQS,
                  "with history keys and every host history token wrong (3), the histories "
                  "kept on the device give the synchronous steps' tokens (%d of %d sequences)",
                  same, SEQS);
    }
    return gpu_test_finish();
}
