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
 * Last, logit entries (struct fwd_batch logit_entries: logit bias and min_tokens' suppressed
 * stop tokens), on the prefill (eager) and on a decode step (a graph's replay): the tokens the
 * device samples after adding them (backend_forward_sample, and three steps in flight through
 * backend_submit, each with entries of its own or none) must be those of the host path, the CPU
 * sampler on backend_forward's logits with logit_entries_apply, where a +100 bias makes a token
 * win and a -inf hides a row's best (so that entries the device ignored or mixed up between
 * steps would fail); and backend_forward's logits stay without them (the host path adds them).
 *
 *   test_cuda_steps [MODEL_DIR]   (default: $PAGODA_SOURCE_DIR/assets/pagoda-brown) */
#include "common/error.h"
#include "kernels/cpu/logit_bias.h"
#include "tests/gpu/gpu_test.h"
#include "worker/cuda_backend.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
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
 * k + 1 submitted before step k is completed; or (BIAS) no decode run but the logit entries'
 * checks (bias_run). */
enum mode { SYNC, SYNC_NO_LAST, ASYNC, ASYNC_KEYED, BIAS };

/* Sequence s's sampling: the penalised runs' (greedy, and every other sequence sampled with a
 * seed), or BIAS's: sequences 0 and 1 greedy without penalties (whose tokens the entries decide
 * where the test says), 2 sampled with a seed, 3 greedy with the penalties (added after the
 * entries). */
static struct sampling_params seq_params(enum mode mode, int s)
{
    struct sampling_params p = sampling_params_default();
    if (mode == BIAS) {
        p.temperature = s == 2 ? 0.8f : 0.0f;
        p.top_k = s == 2 ? 20 : 0;
        p.seed = 91u + (uint64_t)s;
        if (s == 3) {
            p.repetition_penalty = 1.3f;
            p.presence_penalty = 0.4f;
            p.frequency_penalty = 0.6f;
        }
        return p;
    }
    p.repetition_penalty = 1.3f;
    p.presence_penalty = 0.4f;
    p.frequency_penalty = 0.6f;
    if (s % 2) {
        p.temperature = 0.8f;
        p.top_k = 20;
        p.seed = 77u + (uint64_t)s;
    }
    return p;
}

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

/* The prefill of the prompts (row s: sequence s) into q and *prefill, over the caller's arrays
 * of SEQS * PROMPT entries. */
static void prefill_batch(struct seqs *q, struct run *r, enum mode mode, int32_t *tokens,
                          int32_t *positions, int64_t *slots, struct fwd_batch *prefill)
{
    memset(q, 0, sizeof(*q));
    for (int s = 0; s < SEQS; s++) {
        for (int i = 0; i < BLOCKS_PER_SEQ; i++)
            q->tables[s][i] = NUM_BLOCKS - 1 - (s * BLOCKS_PER_SEQ + i);
        const struct sampling_params p = seq_params(mode, s);
        q->params[s] = p;
        q->rows[s] =
            (struct sample_row){.params = p,
                                .prompt_tokens = r->prompt[s],
                                .n_prompt = PROMPT,
                                .history_key = mode == ASYNC_KEYED ? 100u + (uint64_t)s : 0};
        memcpy(q->btab[s], q->tables[s], sizeof(q->btab[s]));
        for (int i = 0; i < PROMPT; i++) {
            tokens[s * PROMPT + i] = r->prompt[s][i];
            positions[s * PROMPT + i] = i;
            slots[s * PROMPT + i] = slot_of(q->tables[s], i);
        }
        q->qs[s] = s * PROMPT;
        q->ctx[s] = PROMPT;
        q->logit_rows[s] = s * PROMPT + PROMPT - 1;
    }
    q->qs[SEQS] = SEQS * PROMPT;
    *prefill = (struct fwd_batch){.num_tokens = SEQS * PROMPT,
                                  .token_ids = tokens,
                                  .positions = positions,
                                  .slot_mapping = slots,
                                  .num_seqs = SEQS,
                                  .query_start = q->qs,
                                  .context_lens = q->ctx,
                                  .block_tables = &q->btab[0][0],
                                  .max_blocks_per_seq = BLOCKS_PER_SEQ,
                                  .num_logits = SEQS,
                                  .logits_indices = q->logit_rows};
}

/* Prefills the prompts (synchronously), then decodes DECODE penalised steps as mode says. */
static int decode(struct backend *be, enum mode mode, struct run *r)
{
    static struct seqs q;
    int32_t tokens[SEQS * PROMPT], positions[SEQS * PROMPT];
    int64_t slots[SEQS * PROMPT];
    struct fwd_batch prefill;
    prefill_batch(&q, r, mode, tokens, positions, slots, &prefill);
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

/* ---- logit entries ---- */

/* One step's logit entries, and the greedy tokens of rows 0 and 1 that only they make win. */
struct entries {
    struct logit_entry e[SEQS * LOGIT_ENTRIES_PER_ROW];
    int32_t n;
    int32_t expect[2];
};

/* Appends (row, token, value) unless the row has the token already (a row's tokens are
 * distinct). */
static void add_entry(struct entries *x, int32_t row, int32_t token, float value)
{
    for (int32_t i = 0; i < x->n; i++)
        if (x->e[i].row == row && x->e[i].token == token)
            return;
    x->e[x->n++] = (struct logit_entry){row, token, value};
}

/* count small biases (-1.48 .. 1.48) on tokens spread over the vocabulary, after the row's
 * entries so far (whose tokens keep their values). */
static void add_spread(struct entries *x, int32_t row, int32_t count, int32_t vocab)
{
    for (int32_t j = 1; j <= count; j++)
        add_entry(x, row, (int32_t)((int64_t)j * 13 % vocab), (float)(j % 9 - 4) * 0.37f);
}

/* The row's best token other than skip (-1: none); the lowest id of equals. */
static int32_t best_but(const float *row, int32_t vocab, int32_t skip)
{
    int32_t best = -1;
    for (int32_t i = 0; i < vocab; i++)
        if (i != skip && (best < 0 || row[i] > row[best]))
            best = i;
    return best;
}

/* The row's lowest token within 90 of its best, best excepted: +100 makes it win by 10. */
static int32_t lifted(const float *row, int32_t vocab, int32_t best)
{
    int32_t t = -1;
    for (int32_t i = 0; i < vocab; i++)
        if (i != best && row[i] > row[best] - 90.0f && (t < 0 || row[i] < row[t]))
            t = i;
    return t;
}

/* The entries of variant v over the raw logits [SEQS][vocab]. v 0, in row order: row 0 a +100
 * bias on a low token, row 1 its best suppressed (-inf: the second best wins), row 2 (sampled)
 * its best suppressed, +2 on the second and 300 small biases, row 3 (penalised) its best and two
 * prompt tokens suppressed and +1.5 on a third. v 1, rows in reverse order: row 3 +2.5 on its
 * second best and 40 small biases, row 2 none, row 1 a +100 bias, row 0 its best suppressed. */
static void build_entries(const float *raw, int32_t vocab, const struct sample_row *rows, int v,
                          struct entries *x)
{
    int32_t best[SEQS];
    for (int r = 0; r < SEQS; r++)
        best[r] = best_but(raw + (size_t)r * vocab, vocab, -1);
    const float *r0 = raw, *r1 = raw + vocab, *r2 = raw + 2 * (size_t)vocab;
    const float *r3 = raw + 3 * (size_t)vocab;
    x->n = 0;
    if (v == 0) {
        x->expect[0] = lifted(r0, vocab, best[0]);
        add_entry(x, 0, x->expect[0], 100.0f);
        x->expect[1] = best_but(r1, vocab, best[1]);
        add_entry(x, 1, best[1], -INFINITY);
        add_entry(x, 2, best[2], -INFINITY);
        add_entry(x, 2, best_but(r2, vocab, best[2]), 2.0f);
        add_spread(x, 2, 300, vocab);
        add_entry(x, 3, best[3], -INFINITY);
        add_entry(x, 3, rows[3].prompt_tokens[0], -INFINITY);
        add_entry(x, 3, rows[3].prompt_tokens[1], -INFINITY);
        add_entry(x, 3, rows[3].prompt_tokens[2], 1.5f);
    } else {
        add_entry(x, 3, best_but(r3, vocab, best[3]), 2.5f);
        add_spread(x, 3, 40, vocab);
        x->expect[1] = lifted(r1, vocab, best[1]);
        add_entry(x, 1, x->expect[1], 100.0f);
        x->expect[0] = best_but(r0, vocab, best[0]);
        add_entry(x, 0, best[0], -INFINITY);
    }
}

/* The host path's tokens: the CPU sampler on raw with x's entries added (x NULL: none), in work
 * [SEQS][vocab]. */
static int host_tokens(const float *raw, int32_t vocab, const struct entries *x,
                       const struct sample_row *rows, struct sampler_workspace *ws, float *work,
                       int32_t *tok, float *lp)
{
    memcpy(work, raw, (size_t)SEQS * (size_t)vocab * sizeof(float));
    if (x != NULL)
        logit_entries_apply(work, vocab, x->e, x->n);
    int rc = 0;
    for (int r = 0; rc == 0 && r < SEQS; r++)
        rc = sampler_sample(&rows[r].params, work + (size_t)r * vocab, vocab, rows[r].prompt_tokens,
                            rows[r].n_prompt, rows[r].output_tokens, rows[r].n_output,
                            rows[r].output_index, ws, &tok[r], &lp[r]);
    return rc;
}

/* The device's tokens and log-probabilities are the host's (these within 1e-3: the device's
 * log-softmax may round differently). */
static int same_as_host(const int32_t *tok, const float *lp, const int32_t *host,
                        const float *host_lp)
{
    for (int r = 0; r < SEQS; r++)
        if (tok[r] != host[r] || !(fabsf(lp[r] - host_lp[r]) <= 1e-3f))
            return 0;
    return 1;
}

/* Completes the step in slot into tok and lp; 0 or the error (a row's among them). */
static int complete_slot(struct backend *be, int slot, int32_t *tok, float *lp)
{
    struct backend_row_error re[SEQS];
    double us;
    int rc = backend_complete(be, slot, 1, tok, lp, re, &us);
    return rc != 0 ? rc : check_rows(re);
}

/* The checks of the file's comment on one batch (rows[SEQS]): what names it in the messages. */
static int bias_check(struct backend *be, const char *what, const struct fwd_batch *batch,
                      const struct sample_row *rows)
{
    const int32_t vocab = (int32_t)backend_config(be)->vocab_size;
    const size_t n = (size_t)SEQS * (size_t)vocab;
    static struct entries xa, xb;
    int32_t h0[SEQS], ha[SEQS], hb[SEQS], ta[SEQS], tb[SEQS], tok[SEQS];
    float h0_lp[SEQS], ha_lp[SEQS], hb_lp[SEQS], la[SEQS], lb[SEQS], lp[SEQS];
    struct sampler_workspace ws = {0};
    float *raw = malloc(n * sizeof(float)), *again = malloc(n * sizeof(float));
    float *work = malloc(n * sizeof(float));
    int rc = raw && again && work ? sampler_workspace_init(&ws, vocab) : PAGODA_ENOMEM;
    struct fwd_batch plain = *batch, fa = *batch, fb = *batch;
    plain.logit_entries = NULL;
    plain.num_logit_entries = 0;
    if (rc == 0)
        rc = backend_forward(be, &plain, raw);
    if (rc != 0)
        goto done;
    build_entries(raw, vocab, rows, 0, &xa);
    build_entries(raw, vocab, rows, 1, &xb);
    fa.logit_entries = xa.e;
    fa.num_logit_entries = xa.n;
    fb.logit_entries = xb.e;
    fb.num_logit_entries = xb.n;
    if ((rc = backend_forward(be, &fa, again)) != 0)
        goto done;
    GPU_CHECK(memcmp(raw, again, n * sizeof(float)) == 0,
              "%s: backend_forward's logits are without the batch's %d entries", what, xa.n);

    if ((rc = host_tokens(raw, vocab, NULL, rows, &ws, work, h0, h0_lp)) != 0 ||
        (rc = host_tokens(raw, vocab, &xa, rows, &ws, work, ha, ha_lp)) != 0 ||
        (rc = host_tokens(raw, vocab, &xb, rows, &ws, work, hb, hb_lp)) != 0)
        goto done;
    GPU_CHECK(ha[0] == xa.expect[0] && ha[1] == xa.expect[1] && hb[0] == xb.expect[0] &&
                  hb[1] == xb.expect[1] && ha[0] != h0[0] && ha[1] != h0[1] && hb[0] != h0[0] &&
                  hb[1] != h0[1],
              "%s: on the host, a +100 bias makes a low token win and a -inf suppression the "
              "second best (rows 0 and 1: %d %d and %d %d, expected %d %d and %d %d, without "
              "entries %d %d)",
              what, ha[0], ha[1], hb[0], hb[1], xa.expect[0], xa.expect[1], xb.expect[0],
              xb.expect[1], h0[0], h0[1]);

    /* Synchronous: backend_forward_sample (cuda_forward_sample). */
    if ((rc = backend_forward_sample(be, &fa, rows, tok, lp)) != 0)
        goto done;
    GPU_CHECK(same_as_host(tok, lp, ha, ha_lp),
              "%s: backend_forward_sample with %d entries samples the host path's tokens (%d %d "
              "%d %d, the host %d %d %d %d)",
              what, xa.n, tok[0], tok[1], tok[2], tok[3], ha[0], ha[1], ha[2], ha[3]);
    if ((rc = backend_forward_sample(be, &fb, rows, tok, lp)) != 0)
        goto done;
    GPU_CHECK(same_as_host(tok, lp, hb, hb_lp),
              "%s: backend_forward_sample with the other %d entries: the host's tokens (%d %d %d "
              "%d, the host %d %d %d %d)",
              what, xb.n, tok[0], tok[1], tok[2], tok[3], hb[0], hb[1], hb[2], hb[3]);
    if ((rc = backend_forward_sample(be, &plain, rows, tok, lp)) != 0)
        goto done;
    GPU_CHECK(same_as_host(tok, lp, h0, h0_lp),
              "%s: backend_forward_sample without entries after steps with them: the host's "
              "tokens without entries (%d %d %d %d, the host %d %d %d %d)",
              what, tok[0], tok[1], tok[2], tok[3], h0[0], h0[1], h0[2], h0[3]);

    /* Three steps in flight (cuda_submit), each staged through its own slot: A, B, none. */
    if ((rc = backend_submit(be, 0, &fa, rows, NULL, 0, NULL, 0)) != 0 ||
        (rc = backend_submit(be, 1, &fb, rows, NULL, 0, NULL, 0)) != 0 ||
        (rc = backend_submit(be, 2, &plain, rows, NULL, 0, NULL, 0)) != 0)
        goto done;
    if ((rc = complete_slot(be, 0, ta, la)) != 0 || (rc = complete_slot(be, 1, tb, lb)) != 0 ||
        (rc = complete_slot(be, 2, tok, lp)) != 0)
        goto done;
    GPU_CHECK(same_as_host(ta, la, ha, ha_lp) && same_as_host(tb, lb, hb, hb_lp) &&
                  same_as_host(tok, lp, h0, h0_lp),
              "%s: three submitted steps in flight, with %d entries, %d others and none: the "
              "host's tokens (%d %d %d %d / %d %d %d %d / %d %d %d %d, the host %d %d %d %d / %d "
              "%d %d %d / %d %d %d %d)",
              what, xa.n, xb.n, ta[0], ta[1], ta[2], ta[3], tb[0], tb[1], tb[2], tb[3], tok[0],
              tok[1], tok[2], tok[3], ha[0], ha[1], ha[2], ha[3], hb[0], hb[1], hb[2], hb[3], h0[0],
              h0[1], h0[2], h0[3]);
done:
    sampler_workspace_fini(&ws);
    free(raw);
    free(again);
    free(work);
    return rc;
}

/* The prefill (eager: query_len PROMPT) and the first decode step (a graph's replay) with logit
 * entries (bias_check). */
static int bias_run(struct backend *be, struct run *r)
{
    static struct seqs q;
    int32_t tokens[SEQS * PROMPT], positions[SEQS * PROMPT];
    int64_t slots[SEQS * PROMPT];
    struct fwd_batch prefill;
    prefill_batch(&q, r, BIAS, tokens, positions, slots, &prefill);
    int32_t got[SEQS];
    float lp[SEQS];
    int rc = backend_forward_sample(be, &prefill, q.rows, got, lp);
    if (rc == 0)
        rc = bias_check(be, "prefill (eager)", &prefill, q.rows);
    if (rc != 0)
        return rc;
    for (int s = 0; s < SEQS; s++)
        r->out[s][0] = got[s]; /* the decode step's inputs */
    decode_batch(&q, r, 0);
    const uint64_t graphs = backend_graph_steps(be);
    rc = bias_check(be, "decode (graph)", &q.batch, q.rows);
    GPU_CHECK(rc != 0 || backend_graph_steps(be) > graphs,
              "the decode steps with entries replayed a graph (%llu replays)",
              (unsigned long long)(backend_graph_steps(be) - graphs));
    return rc;
}

/* Opens the backend over a fresh pool and decodes (BIAS: bias_run). */
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
    r->rc = mode == BIAS ? bias_run(be, r) : decode(be, mode, r);
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

    static struct run sync_pen, no_last, async_pen, keyed, bias;
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
    run(model, BIAS, &bias);
    GPU_CHECK(bias.rc == 0, "the run with logit entries: %s (%s)", pagoda_strerror(bias.rc),
              bias.detail);
    return gpu_test_finish();
}
