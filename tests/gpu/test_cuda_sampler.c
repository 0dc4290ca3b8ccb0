/* Tests of the CUDA sampler (kernels/cuda/sampler.cu, sampler_rows.cu, sampler_greedy.cu) against
 * kernels/cpu/sampler.c: the GPU must choose exactly the CPU's token for every draw (10,000 draws
 * over vocabularies of 512, 32000 and 151936 tokens, temperatures, top-k, top-p, min-p, penalties,
 * ties, -0 and -inf logits), the same token wherever a row sits in a batch, docs/sampling.md's
 * golden draws, and the CPU's errors; the asynchronous calls (cuda_sampler_enqueue,
 * cuda_sampler_result, cuda_gather_tokens); the histories read on the device (history gathers and
 * keys: test_cuda_sampler_history.c); and the greedy fast path (ties and bad values around its
 * chunk boundaries, masked rows, 1 to 300 rows, mixed calls) against the CPU and the general path
 * (those cases in test_cuda_sampler_greedy.c). Prints the largest log-probability difference and a
 * few timings, then "N passed, M failed". */
#include "tests/gpu/sampler_test.h"

#include "common/error.h"
#include "kernels/cpu/sampler.h"
#include "kernels/cuda/sampler.h"
#include "model/model_budget.h"

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* A deterministic generator for test data, independent of Philox. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

float rng_unit(void) /* [0, 1) */
{
    return (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

float rng_normal(void) /* roughly N(0, 1): Irwin-Hall of 12 */
{
    float s = 0.0f;
    for (int i = 0; i < 12; i++)
        s += rng_unit();
    return s - 6.0f;
}

/* Logit rows of six kinds, chosen by row % 6: plain, quantised (ties, also at the top), masked
 * (-inf, and the maximum twice), peaked, flat (+0 and -0 ties everywhere, some -inf) and wide
 * (most tokens weigh 0 at low temperatures). */
void make_row(float *l, int32_t vocab, int kind)
{
    for (int32_t i = 0; i < vocab; i++) {
        switch (kind) {
        case 0:
            l[i] = 2.5f * rng_normal();
            break;
        case 1:
            l[i] = (float)((int)(rng_next() % 41) - 30) * 0.25f;
            break;
        case 2:
            l[i] = rng_unit() < 0.4f ? -INFINITY : 2.0f * rng_normal();
            break;
        case 3:
            l[i] = rng_normal();
            break;
        case 4:
            l[i] = rng_unit() < 0.2f ? -INFINITY : (rng_next() & 1) ? 0.0f : -0.0f;
            break;
        default:
            l[i] = rng_unit() < 0.05f ? -INFINITY : 100.0f * rng_unit() - 50.0f;
            break;
        }
    }
    if (kind == 2) { /* the maximum at two ids */
        int32_t a = (int32_t)(rng_next() % (uint64_t)vocab), b = (a + vocab / 3) % vocab;
        l[a] = l[b] = 13.0f;
    }
    if (kind == 3) {
        const float peaks[] = {12.0f, 11.5f, 11.5f, 10.0f, 9.0f};
        for (int j = 0; j < 5; j++)
            l[rng_next() % (uint64_t)vocab] = peaks[j];
    }
}

/* Parameter grid: 4 temperatures x 4 top-k x 3 top-p x 3 min-p x 4 penalty sets. */
#define N_COMBOS (4 * 4 * 3 * 3 * 4)

struct sampling_params combo_params(int combo, uint64_t seed)
{
    static const float temps[] = {0.0f, 0.5f, 1.0f, 1.7f};
    static const int32_t top_ks[] = {0, 1, 5, 50};
    static const float top_ps[] = {1.0f, 0.9f, 0.5f};
    static const float min_ps[] = {0.0f, 0.05f, 0.2f};
    static const float pens[][3] = {
        {1.0f, 0.0f, 0.0f}, {1.3f, 0.5f, 0.25f}, {0.8f, -0.7f, 1.1f}, {1.1f, 0.0f, 0.0f}};
    struct sampling_params p = sampling_params_default();
    p.temperature = temps[combo % 4];
    combo /= 4;
    p.top_k = top_ks[combo % 4];
    combo /= 4;
    p.top_p = top_ps[combo % 3];
    combo /= 3;
    p.min_p = min_ps[combo % 3];
    combo /= 3;
    p.repetition_penalty = pens[combo % 4][0];
    p.presence_penalty = pens[combo % 4][1];
    p.frequency_penalty = pens[combo % 4][2];
    p.seed = seed;
    return p;
}

static const float *sort_base;

static int by_logit_desc(const void *a, const void *b)
{
    float x = sort_base[*(const int32_t *)a], y = sort_base[*(const int32_t *)b];
    return x < y ? 1 : x > y ? -1 : 0;
}

void bank_init(struct bank *b, int32_t vocab, int32_t rows, int kind_offset)
{
    b->vocab = vocab;
    b->rows = rows;
    b->host = malloc((size_t)vocab * (size_t)rows * sizeof(float));
    b->top = malloc((size_t)rows * TOP_IDS * sizeof(int32_t));
    int32_t *idx = malloc((size_t)vocab * sizeof(int32_t));
    MUST(b->host && b->top && idx);
    for (int32_t r = 0; r < rows; r++) {
        float *l = b->host + (size_t)r * (size_t)vocab;
        make_row(l, vocab, (r + kind_offset) % 6);
        for (int32_t i = 0; i < vocab; i++)
            idx[i] = i;
        sort_base = l;
        qsort(idx, (size_t)vocab, sizeof(*idx), by_logit_desc);
        for (int j = 0; j < TOP_IDS; j++)
            b->top[r * TOP_IDS + j] = idx[j % vocab];
    }
    free(idx);
    GPU_CK(cudaMalloc((void **)&b->dev, (size_t)vocab * (size_t)rows * sizeof(float)));
    GPU_CK(cudaMemcpy(b->dev, b->host, (size_t)vocab * (size_t)rows * sizeof(float),
                      cudaMemcpyHostToDevice));
}

void bank_fini(struct bank *b)
{
    free(b->host);
    free(b->top);
    GPU_CK(cudaFree(b->dev));
}

/* A history for row r of a bank: half its ids among the row's likeliest, half anywhere, with
 * repeats. */
static void make_history_of(struct batch *bt, int32_t slot, const struct bank *b, int32_t r,
                            size_t max_prompt, size_t max_output)
{
    bt->n_prompt[slot] = rng_next() % (max_prompt + 1);
    bt->n_output[slot] = rng_next() % (max_output + 1);
    for (size_t i = 0; i < bt->n_prompt[slot] + bt->n_output[slot]; i++) {
        int32_t t = (rng_next() & 1) ? b->top[r * TOP_IDS + rng_next() % TOP_IDS]
                                     : (int32_t)(rng_next() % (uint64_t)b->vocab);
        if (i < bt->n_prompt[slot])
            bt->prompt[slot][i] = t;
        else
            bt->output[slot][i - bt->n_prompt[slot]] = t;
    }
    bt->prompt_ptr[slot] = bt->prompt[slot];
    bt->output_ptr[slot] = bt->output[slot];
}

void make_history(struct batch *bt, int32_t slot, const struct bank *b, int32_t r)
{
    make_history_of(bt, slot, b, r, MAX_PROMPT, MAX_OUTPUT);
}

static void poison(struct batch *bt)
{
    for (int32_t r = 0; r < MAX_ROWS; r++) {
        bt->tokens[r] = -12345;
        bt->logprobs[r] = NAN;
    }
}

static int gpu_sample(struct cuda_sampler *s, const float *dev_logits, struct batch *bt)
{
    poison(bt);
    return cuda_sampler_sample(s, dev_logits, bt->rows, bt->params, bt->output_index,
                               bt->prompt_ptr, bt->n_prompt, bt->output_ptr, bt->n_output,
                               bt->tokens, bt->logprobs, 0);
}

static int cpu_sample(struct sampler_workspace *ws, const float *logits, int32_t vocab,
                      const struct batch *bt, int32_t slot, int32_t *token, float *logprob)
{
    return sampler_sample(&bt->params[slot], logits, vocab, bt->prompt[slot], bt->n_prompt[slot],
                          bt->output[slot], bt->n_output[slot], bt->output_index[slot], ws, token,
                          logprob);
}

static double max_logprob_diff;

/* calls batches of bank->rows rows each: row r of call c gets the parameter combination
 * (c * rows + r) * 7919 mod N_COMBOS (which visits every combination), a seed shared by
 * several rows, an output index sometimes above 2^32, and a fresh history. */
static void test_draws_match_cpu(int32_t vocab, int32_t rows, int calls)
{
    struct bank b;
    bank_init(&b, vocab, rows, vocab % 6);
    struct cuda_sampler *s;
    MUST(cuda_sampler_new(vocab, MAX_ROWS, MAX_HISTORY, &s) == 0);
    struct sampler_workspace ws;
    MUST(sampler_workspace_init(&ws, vocab) == 0);
    static struct batch bt;
    int draws = 0, mismatches = 0, errors = 0, greedy = 0;
    double lp_diff = 0.0;
    for (int c = 0; c < calls; c++) {
        bt.rows = rows;
        for (int32_t r = 0; r < rows; r++) {
            int combo = (int)(((int64_t)c * rows + r) * 7919 % N_COMBOS);
            uint64_t seed = 0x9e3779b97f4a7c15ull * (uint64_t)(r % 7 + 1) ^ (uint64_t)vocab;
            bt.params[r] = combo_params(combo, seed);
            bt.output_index[r] = c % 5 == 4 ? (uint64_t)c << 32 | (uint64_t)r : (uint64_t)c;
            make_history(&bt, r, &b, r);
        }
        int rc = gpu_sample(s, b.dev, &bt);
        if (rc != 0) {
            errors++;
            printf("FAIL vocab %d call %d: cuda_sampler_sample %d (%s)\n", (int)vocab, c, rc,
                   pagoda_error_detail());
            continue;
        }
        for (int32_t r = 0; r < rows; r++) {
            int32_t token;
            float lp;
            MUST(cpu_sample(&ws, b.host + (size_t)r * (size_t)vocab, vocab, &bt, r, &token, &lp) ==
                 0);
            draws++;
            greedy += bt.params[r].temperature == 0.0f;
            if (token != bt.tokens[r]) {
                if (mismatches++ < MISMATCHES_SHOWN) {
                    const struct sampling_params *p = &bt.params[r];
                    printf("MISMATCH vocab %d call %d row %d (kind %d): cpu %d gpu %d; T %g "
                           "top_k %d top_p %g min_p %g pen %g/%g/%g seed %llx index %llu\n",
                           (int)vocab, c, (int)r, (int)((r + vocab % 6) % 6), (int)token,
                           (int)bt.tokens[r], (double)p->temperature, (int)p->top_k,
                           (double)p->top_p, (double)p->min_p, (double)p->repetition_penalty,
                           (double)p->presence_penalty, (double)p->frequency_penalty,
                           (unsigned long long)p->seed, (unsigned long long)bt.output_index[r]);
                }
            } else {
                double d = fabs((double)lp - (double)bt.logprobs[r]);
                if (!(d <= lp_diff))
                    lp_diff = d; /* also a NaN */
            }
        }
    }
    printf("vocab %d: %d draws (%d greedy), %d mismatches, %d failed calls, max |logprob "
           "difference| %.3g\n",
           (int)vocab, draws, greedy, mismatches, errors, lp_diff);
    GPU_CHECK(mismatches == 0 && errors == 0 && draws == rows * calls,
              "vocab %d: the GPU's token equals the CPU's in all %d draws", (int)vocab,
              rows * calls);
    GPU_CHECK(lp_diff < 1e-4, "vocab %d: logprobs agree within 1e-4 (max %.3g)", (int)vocab,
              lp_diff);
    if (lp_diff > max_logprob_diff)
        max_logprob_diff = lp_diff;
    sampler_workspace_fini(&ws);
    cuda_sampler_free(s);
    bank_fini(&b);
}

/* The same row (logits, parameters, history, seed, output index) gives the same token at any
 * position of a batch: in order, permuted, repeated in every slot, and alone. */
static void test_batch_position(int32_t vocab, int32_t rows)
{
    struct bank b;
    bank_init(&b, vocab, rows, 1);
    struct cuda_sampler *s;
    MUST(cuda_sampler_new(vocab, MAX_ROWS, MAX_HISTORY, &s) == 0);
    static struct batch a, p;
    a.rows = rows;
    for (int32_t r = 0; r < rows; r++) {
        a.params[r] = combo_params((r * 13 + 1) % N_COMBOS, 1000u + (uint64_t)r);
        if (a.params[r].temperature == 0.0f)
            a.params[r].temperature = 0.9f;
        a.output_index[r] = 17u * (uint64_t)r;
        make_history(&a, r, &b, r);
    }
    SAMPLE_OR_RETURN(gpu_sample(s, b.dev, &a));

    /* Permuted: slot j holds row perm[j]. */
    int32_t perm[MAX_ROWS];
    for (int32_t j = 0; j < rows; j++)
        perm[j] = (j * 7 + 3) % rows; /* rows is prime to 7 */
    float *dev;
    GPU_CK(cudaMalloc((void **)&dev, (size_t)vocab * (size_t)rows * sizeof(float)));
    p.rows = rows;
    for (int32_t j = 0; j < rows; j++) {
        int32_t r = perm[j];
        GPU_CK(cudaMemcpy(dev + (size_t)j * (size_t)vocab, b.dev + (size_t)r * (size_t)vocab,
                          (size_t)vocab * sizeof(float), cudaMemcpyDeviceToDevice));
        p.params[j] = a.params[r];
        p.output_index[j] = a.output_index[r];
        memcpy(p.prompt[j], a.prompt[r], sizeof(a.prompt[r]));
        memcpy(p.output[j], a.output[r], sizeof(a.output[r]));
        p.n_prompt[j] = a.n_prompt[r];
        p.n_output[j] = a.n_output[r];
        p.prompt_ptr[j] = p.prompt[j];
        p.output_ptr[j] = p.output[j];
    }
    SAMPLE_OR_RETURN(gpu_sample(s, dev, &p));
    int same = 0;
    for (int32_t j = 0; j < rows; j++)
        same += p.tokens[j] == a.tokens[perm[j]];
    GPU_CHECK(same == rows, "vocab %d: permuted batch gives the same tokens (%d of %d)", (int)vocab,
              same, (int)rows);

    /* Row 3 in every slot, then alone. */
    for (int32_t j = 0; j < rows; j++) {
        GPU_CK(cudaMemcpy(dev + (size_t)j * (size_t)vocab, b.dev + 3 * (size_t)vocab,
                          (size_t)vocab * sizeof(float), cudaMemcpyDeviceToDevice));
        p.params[j] = a.params[3];
        p.output_index[j] = a.output_index[3];
        memcpy(p.prompt[j], a.prompt[3], sizeof(a.prompt[3]));
        memcpy(p.output[j], a.output[3], sizeof(a.output[3]));
        p.n_prompt[j] = a.n_prompt[3];
        p.n_output[j] = a.n_output[3];
    }
    SAMPLE_OR_RETURN(gpu_sample(s, dev, &p));
    same = 0;
    for (int32_t j = 0; j < rows; j++)
        same += p.tokens[j] == a.tokens[3];
    GPU_CHECK(same == rows, "vocab %d: one row repeated in all %d slots gives its token (%d)",
              (int)vocab, (int)rows, same);
    p.rows = 1;
    SAMPLE_OR_RETURN(gpu_sample(s, dev, &p));
    GPU_CHECK(p.tokens[0] == a.tokens[3], "vocab %d: the row alone gives its token (%d, %d)",
              (int)vocab, (int)p.tokens[0], (int)a.tokens[3]);
    GPU_CK(cudaFree(dev));
    cuda_sampler_free(s);
    bank_fini(&b);
}

/* cuda_sampler_enqueue: two calls queued back to back into their slots give
 * cuda_sampler_sample's tokens, read after the stream has passed them, and write them to the
 * device array; a NaN row fails alone there (token 0 on the device); cuda_gather_tokens reads
 * them back into another array at chosen places. */
#define NAN_ROW 4 /* even: the gather below reads it from the slot where it failed */
static void test_enqueue_slots(int32_t vocab, int32_t rows)
{
    struct bank b;
    bank_init(&b, vocab, rows, 1);
    struct cuda_sampler *s;
    MUST(cuda_sampler_new(vocab, MAX_ROWS, MAX_HISTORY, &s) == 0);
    static struct batch a;
    a.rows = rows;
    for (int32_t r = 0; r < rows; r++) {
        a.params[r] = combo_params((r * 5 + 2) % N_COMBOS, 2000u + (uint64_t)r);
        a.output_index[r] = 3u * (uint64_t)r;
        make_history(&a, r, &b, r);
    }
    SAMPLE_OR_RETURN(gpu_sample(s, b.dev, &a));
    float *nan_logits;
    int32_t *d_tokens, *d_dst, *d_pairs;
    const size_t bytes = (size_t)vocab * (size_t)rows * sizeof(float);
    GPU_CK(cudaMalloc((void **)&nan_logits, bytes));
    GPU_CK(cudaMemcpy(nan_logits, b.dev, bytes, cudaMemcpyDeviceToDevice));
    const float nan = NAN;
    GPU_CK(cudaMemcpy(nan_logits + NAN_ROW * (size_t)vocab + 7, &nan, sizeof(nan),
                      cudaMemcpyHostToDevice));
    GPU_CK(cudaMalloc((void **)&d_tokens, 2 * MAX_ROWS * sizeof(int32_t)));
    GPU_CK(cudaMemset(d_tokens, 0xff, 2 * MAX_ROWS * sizeof(int32_t)));
    cudaStream_t st;
    GPU_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    SAMPLE_OR_RETURN(cuda_sampler_enqueue(s, 1, b.dev, rows, a.params, a.output_index, a.prompt_ptr,
                                          a.n_prompt, a.output_ptr, a.n_output, d_tokens, st));
    SAMPLE_OR_RETURN(cuda_sampler_enqueue(s, 2, nan_logits, rows, a.params, a.output_index,
                                          a.prompt_ptr, a.n_prompt, a.output_ptr, a.n_output,
                                          d_tokens + MAX_ROWS, st));
    /* Gather: dst[j] = the token of slot-2 row j for even j, slot-1 row j for odd j; the NaN row
     * is even, so the gather reads the failed row's 0. */
    int32_t pairs[2 * MAX_ROWS], dst[MAX_ROWS], dev_tokens[2 * MAX_ROWS];
    for (int32_t j = 0; j < rows; j++) {
        pairs[2 * j] = j;
        pairs[2 * j + 1] = (j % 2 == 0 ? MAX_ROWS : 0) + j;
    }
    GPU_CK(cudaMalloc((void **)&d_dst, MAX_ROWS * sizeof(int32_t)));
    GPU_CK(cudaMalloc((void **)&d_pairs, 2 * MAX_ROWS * sizeof(int32_t)));
    GPU_CK(cudaMemcpyAsync(d_pairs, pairs, 2 * (size_t)rows * sizeof(int32_t),
                           cudaMemcpyHostToDevice, st));
    SAMPLE_OR_RETURN(cuda_gather_tokens(d_dst, d_pairs, rows, d_tokens, st));
    GPU_CK(cudaStreamSynchronize(st));
    GPU_CK(cudaMemcpy(dst, d_dst, (size_t)rows * sizeof(int32_t), cudaMemcpyDeviceToHost));
    GPU_CK(cudaMemcpy(dev_tokens, d_tokens, sizeof(dev_tokens), cudaMemcpyDeviceToHost));
    int same1 = 0, same2 = 0, gathered = 0;
    for (int32_t r = 0; r < rows; r++) {
        int32_t t1 = -1, t2 = -1;
        float lp;
        same1 += cuda_sampler_result(s, 1, r, &t1, &lp) == 0 && t1 == a.tokens[r] &&
                 dev_tokens[r] == a.tokens[r];
        int rc2 = cuda_sampler_result(s, 2, r, &t2, &lp);
        if (r == NAN_ROW)
            same2 += rc2 == PAGODA_EINVAL && dev_tokens[MAX_ROWS + r] == 0;
        else
            same2 += rc2 == 0 && t2 == a.tokens[r] && dev_tokens[MAX_ROWS + r] == a.tokens[r];
        gathered += dst[r] == (r == NAN_ROW ? 0 : a.tokens[r]);
    }
    GPU_CHECK(same1 == rows,
              "vocab %d: enqueued in slot 1: sample's tokens, on the device too "
              "(%d of %d)",
              (int)vocab, same1, (int)rows);
    GPU_CHECK(same2 == rows,
              "vocab %d: slot 2, queued behind it, row 4 NaN: that row fails "
              "alone, token 0 on the device (%d of %d)",
              (int)vocab, same2, (int)rows);
    GPU_CHECK(gathered == rows, "vocab %d: cuda_gather_tokens reads both slots (%d of %d)",
              (int)vocab, gathered, (int)rows);
    GPU_CK(cudaStreamDestroy(st));
    GPU_CK(cudaFree(nan_logits));
    GPU_CK(cudaFree(d_tokens));
    GPU_CK(cudaFree(d_dst));
    GPU_CK(cudaFree(d_pairs));
    cuda_sampler_free(s);
    bank_fini(&b);
}

/* The worker's memory budget counts the sampler (model_budget_sampler_bytes): a sampler of 256
 * rows of the Llama-3 vocabulary (128256) and 131072 positions takes at least what it says and
 * at most the allocator's 2 MiB pages of its 8 allocations more (its history slots alone are 128
 * MiB: a budget without them would fail). */
static void test_budget_counts_the_sampler(void)
{
    const int64_t vocab = 128256, rows = 256, positions = 131072;
    size_t free0 = 0, free1 = 0, total = 0;
    GPU_CK(cudaDeviceSynchronize());
    GPU_CK(cudaMemGetInfo(&free0, &total));
    struct cuda_sampler *s;
    MUST(cuda_sampler_new((int32_t)vocab, (int32_t)rows, (size_t)positions, &s) == 0);
    GPU_CK(cudaMemGetInfo(&free1, &total));
    const uint64_t budget = model_budget_sampler_bytes(vocab, rows, positions);
    const int64_t used = (int64_t)free0 - (int64_t)free1;
    const int64_t slack = 8 * (INT64_C(2) << 20);
    GPU_CHECK(used <= (int64_t)budget + slack && used >= (int64_t)budget,
              "a sampler of 256 rows, vocab 128256, 131072 positions takes %lld bytes of device "
              "memory; the budget counts %llu",
              (long long)used, (unsigned long long)budget);
    cuda_sampler_free(s);
}

/* docs/sampling.md's worked example and tests/unit/test_sampler.c's golden values. */
static void test_golden(void)
{
    static const float dist_logits[8] = {1.0f, 2.5f, -0.5f, 0.3f, 2.0f, -1.2f, 0.9f, 1.7f};
    struct cuda_sampler *s;
    MUST(cuda_sampler_new(8, 16, 8, &s) == 0);
    float *dev;
    GPU_CK(cudaMalloc((void **)&dev, 16 * 8 * sizeof(float)));
    for (int r = 0; r < 16; r++)
        GPU_CK(cudaMemcpy(dev + r * 8, dist_logits, sizeof(dist_logits), cudaMemcpyHostToDevice));
    static struct batch bt;
    memset(&bt, 0, sizeof(bt));
    bt.rows = 16;
    for (int r = 0; r < 16; r++) {
        bt.params[r] = sampling_params_default();
        bt.params[r].temperature = 0.8f;
        bt.params[r].seed = 0x0123456789abcdefull;
        bt.output_index[r] = (uint64_t)r;
    }
    static const int32_t plain[16] = {4, 1, 2, 1, 6, 6, 7, 4, 3, 7, 4, 1, 1, 1, 1, 4};
    SAMPLE_OR_RETURN(gpu_sample(s, dev, &bt));
    GPU_CHECK(memcmp(bt.tokens, plain, sizeof(plain)) == 0, "golden draws, plain");
    GPU_CHECK(fabsf(bt.logprobs[0] - -1.480654f) < 1e-5f, "golden logprob %.7f",
              (double)bt.logprobs[0]);

    static const int32_t truncated[16] = {4, 1, 1, 1, 7, 7, 7, 4, 4, 7, 4, 1, 1, 1, 1, 4};
    for (int r = 0; r < 16; r++) {
        bt.params[r].top_k = 5;
        bt.params[r].top_p = 0.9f;
        bt.params[r].min_p = 0.16f;
    }
    SAMPLE_OR_RETURN(gpu_sample(s, dev, &bt));
    GPU_CHECK(memcmp(bt.tokens, truncated, sizeof(truncated)) == 0, "golden draws, truncated");

    static const int32_t prompt[] = {1, 4, 4}, output[] = {7, 1, 7, 7};
    static const int32_t penalised[16] = {4, 0, 0, 3, 0, 3, 1, 2, 7, 3, 0, 6, 0, 6, 0, 3};
    for (int r = 0; r < 16; r++) {
        bt.params[r] = sampling_params_default();
        bt.params[r].temperature = 1.3f;
        bt.params[r].top_p = 0.95f;
        bt.params[r].repetition_penalty = 1.3f;
        bt.params[r].presence_penalty = 0.5f;
        bt.params[r].frequency_penalty = 0.25f;
        bt.params[r].seed = 987654321;
        memcpy(bt.prompt[r], prompt, sizeof(prompt));
        memcpy(bt.output[r], output, sizeof(output));
        bt.prompt_ptr[r] = bt.prompt[r];
        bt.output_ptr[r] = bt.output[r];
        bt.n_prompt[r] = 3;
        bt.n_output[r] = 4;
    }
    SAMPLE_OR_RETURN(gpu_sample(s, dev, &bt));
    GPU_CHECK(memcmp(bt.tokens, penalised, sizeof(penalised)) == 0, "golden draws, penalised");
    GPU_CK(cudaFree(dev));
    cuda_sampler_free(s);

    /* The 4096-token row that covers exp~'s whole range. */
    enum { V = 4096 };
    static float logits[V];
    for (uint32_t i = 0; i < V; i++)
        logits[i] = (float)((i * 2654435761u) % 20001u) / 1000.0f - 10.0f;
    MUST(cuda_sampler_new(V, 1, 0, &s) == 0);
    GPU_CK(cudaMalloc((void **)&dev, sizeof(logits)));
    GPU_CK(cudaMemcpy(dev, logits, sizeof(logits), cudaMemcpyHostToDevice));
    memset(&bt, 0, sizeof(bt));
    bt.rows = 1;
    bt.params[0] = sampling_params_default();
    bt.params[0].temperature = 0.7f;
    bt.params[0].seed = 31337;
    SAMPLE_OR_RETURN(cuda_sampler_sample(s, dev, 1, bt.params, bt.output_index, NULL, NULL, NULL,
                                         NULL, bt.tokens, NULL, 0));
    GPU_CHECK(bt.tokens[0] == 647, "golden large row: token %d (647)", (int)bt.tokens[0]);
    GPU_CK(cudaFree(dev));
    cuda_sampler_free(s);
}

/* The CPU's errors, for a bad row at slot 2 of 4; nothing is written; the sampler works
 * afterwards. */
static void test_errors(void)
{
    enum { V = 512, ROWS = 4 };
    struct bank b;
    bank_init(&b, V, ROWS, 0);
    struct cuda_sampler *s;
    MUST(cuda_sampler_new(V, ROWS, 16, &s) == 0);
    struct sampler_workspace ws;
    MUST(sampler_workspace_init(&ws, V) == 0);
    static struct batch bt;
    float *host = malloc(sizeof(float) * V * ROWS), *dev;
    MUST(host);
    GPU_CK(cudaMalloc((void **)&dev, sizeof(float) * V * ROWS));

    enum { N_CASES = 14 };
    for (int e = 0; e < N_CASES; e++) {
        memcpy(host, b.host, sizeof(float) * V * ROWS);
        memset(&bt, 0, sizeof(bt));
        bt.rows = ROWS;
        for (int32_t r = 0; r < ROWS; r++) {
            bt.params[r] = sampling_params_default();
            bt.params[r].repetition_penalty = 1.2f;
            bt.output_index[r] = (uint64_t)r;
            bt.prompt[r][0] = 5;
            bt.output[r][0] = 6;
            bt.n_prompt[r] = bt.n_output[r] = 1;
            bt.prompt_ptr[r] = bt.prompt[r];
            bt.output_ptr[r] = bt.output[r];
        }
        struct sampling_params *p = &bt.params[2];
        float *l = host + 2 * V;
        const char *what = "";
        switch (e) {
        case 0:
            what = "NaN temperature";
            p->temperature = NAN;
            break;
        case 1:
            what = "negative temperature";
            p->temperature = -1.0f;
            break;
        case 2:
            what = "top_k -1";
            p->top_k = -1;
            break;
        case 3:
            what = "top_p 0";
            p->top_p = 0.0f;
            break;
        case 4:
            what = "min_p 1.5";
            p->min_p = 1.5f;
            break;
        case 5:
            what = "repetition_penalty 0";
            p->repetition_penalty = 0.0f;
            break;
        case 6:
            what = "presence_penalty 2.5";
            p->presence_penalty = 2.5f;
            break;
        case 7:
            what = "prompt token = vocab";
            bt.prompt[2][0] = V;
            break;
        case 8:
            what = "output token -1";
            bt.output[2][0] = -1;
            break;
        case 9:
            what = "NaN logit";
            l[77] = NAN;
            break;
        case 10:
            what = "+inf logit";
            l[300] = INFINITY;
            break;
        case 11:
            what = "all -inf";
            for (int i = 0; i < V; i++)
                l[i] = -INFINITY;
            break;
        case 12:
            what = "penalty overflow";
            l[5] = -3e38f;
            p->repetition_penalty = 2.0f;
            break;
        default:
            what = "history over max_history";
            bt.n_prompt[2] = 17;
            break;
        }
        int32_t cpu_token;
        int cpu_rc = e == N_CASES - 1 ? PAGODA_ERANGE /* the CPU's limit is SAMPLER_HISTORY_MAX */
                                      : cpu_sample(&ws, l, V, &bt, 2, &cpu_token, NULL);
        GPU_CK(cudaMemcpy(dev, host, sizeof(float) * V * ROWS, cudaMemcpyHostToDevice));
        int rc = gpu_sample(s, dev, &bt);
        int untouched = 1;
        for (int r = 0; r < ROWS; r++)
            untouched &= bt.tokens[r] == -12345 && isnan(bt.logprobs[r]);
        GPU_CHECK(cpu_rc < 0 && rc == cpu_rc && untouched,
                  "%s: gpu %d, cpu %d, outputs untouched %d (%s)", what, rc, cpu_rc, untouched,
                  pagoda_error_detail());
    }

    /* Batch-level errors. */
    memset(&bt, 0, sizeof(bt));
    for (int r = 0; r < MAX_ROWS; r++)
        bt.params[r] = sampling_params_default();
    bt.rows = ROWS + 1;
    GPU_CHECK(gpu_sample(s, b.dev, &bt) == PAGODA_ERANGE, "rows above max_rows: ERANGE");
    bt.rows = -1;
    GPU_CHECK(gpu_sample(s, b.dev, &bt) == PAGODA_ERANGE, "negative rows: ERANGE");
    GPU_CHECK(cuda_sampler_sample(s, NULL, 1, bt.params, bt.output_index, NULL, NULL, NULL, NULL,
                                  bt.tokens, NULL, 0) == PAGODA_EINVAL,
              "NULL logits: EINVAL");
    bt.n_prompt[0] = 2;
    GPU_CHECK(cuda_sampler_sample(s, b.dev, 1, bt.params, bt.output_index, NULL, bt.n_prompt, NULL,
                                  NULL, bt.tokens, NULL, 0) == PAGODA_EINVAL,
              "NULL prompt with tokens: EINVAL");
    struct cuda_sampler *bad = (struct cuda_sampler *)&bt;
    GPU_CHECK(cuda_sampler_new(0, 1, 0, &bad) == PAGODA_ERANGE && bad == NULL,
              "vocab 0: ERANGE, *out NULL");
    GPU_CHECK(cuda_sampler_new(V, 1, (size_t)SAMPLER_HISTORY_MAX + 1, &bad) == PAGODA_ERANGE,
              "max_history above SAMPLER_HISTORY_MAX: ERANGE");
    cuda_sampler_free(NULL);

    /* After every error above (some in the middle of the penalties), a batch with penalties on
     * every row matches the CPU: the history marks were left clean. */
    memset(&bt, 0, sizeof(bt));
    bt.rows = ROWS;
    int match = 0;
    for (int round = 0; round < 3; round++) {
        for (int32_t r = 0; r < ROWS; r++) {
            bt.params[r] = combo_params(4 * 4 * 3 * 3 * (1 + r % 3) + 2 + round, 77u + round);
            bt.output_index[r] = (uint64_t)(round * ROWS + r);
            make_history_of(&bt, r, &b, r, 10, 6); /* within the sampler's 16 */
        }
        SAMPLE_OR_RETURN(gpu_sample(s, b.dev, &bt));
        for (int32_t r = 0; r < ROWS; r++) {
            int32_t token;
            MUST(cpu_sample(&ws, b.host + r * V, V, &bt, r, &token, NULL) == 0);
            match += token == bt.tokens[r];
        }
    }
    GPU_CHECK(match == 3 * ROWS, "after the errors, penalised draws match the CPU (%d of %d)",
              match, 3 * ROWS);

    GPU_CK(cudaFree(dev));
    free(host);
    sampler_workspace_fini(&ws);
    cuda_sampler_free(s);
    bank_fini(&b);
}

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* Wall time of one cuda_sampler_sample() call (copies and synchronisation included), median of
 * 20 after 3 warm-ups, for vocab 151936. Informational: no check. */
static void timings(void)
{
    enum { V = 151936, REPS = 20 };
    struct bank b;
    bank_init(&b, V, MAX_ROWS, 0);
    struct cuda_sampler *s;
    MUST(cuda_sampler_new(V, MAX_ROWS, MAX_HISTORY, &s) == 0);
    static struct batch bt;
    static const char *const names[] = {"greedy", "T=1", "T=0.8 k=50 p=0.9 minp=0.05 +pen",
                                        "T=0.8 p=0.95"};
    static const int32_t row_counts[] = {1, 8, 64};
    printf("\ncuda_sampler_sample wall time, vocab %d, median of %d (us per call)\n", V, REPS);
    printf("%-32s %8s %8s %8s\n", "params", "1 row", "8 rows", "64 rows");
    for (int cfg = 0; cfg < 4; cfg++) {
        printf("%-32s", names[cfg]);
        for (int rc = 0; rc < 3; rc++) {
            bt.rows = row_counts[rc];
            for (int32_t r = 0; r < bt.rows; r++) {
                struct sampling_params p = sampling_params_default();
                p.seed = (uint64_t)r;
                if (cfg == 0)
                    p.temperature = 0.0f;
                if (cfg == 2) {
                    p.temperature = 0.8f;
                    p.top_k = 50;
                    p.top_p = 0.9f;
                    p.min_p = 0.05f;
                    p.repetition_penalty = 1.1f;
                    p.frequency_penalty = 0.2f;
                }
                if (cfg == 3) {
                    p.temperature = 0.8f;
                    p.top_p = 0.95f;
                }
                bt.params[r] = p;
                bt.output_index[r] = 5;
                make_history(&bt, r, &b, r);
            }
            double t[REPS];
            for (int i = 0; i < REPS + 3; i++) {
                double t0 = now_us();
                SAMPLE_OR_RETURN(gpu_sample(s, b.dev, &bt));
                if (i >= 3)
                    t[i - 3] = now_us() - t0;
            }
            qsort(t, REPS, sizeof(double), cmp_double);
            printf(" %8.1f", t[REPS / 2]);
        }
        printf("\n");
    }
    printf("\n");
    cuda_sampler_free(s);
    bank_fini(&b);
}

int main(void)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* keep what was printed if the device fails */
    gpu_test_require_device("test_cuda_sampler");
    test_golden();
    test_errors();
    test_budget_counts_the_sampler();
    test_greedy_fast_path(128256, 300); /* 16-byte loads; the last chunk holds 1280 tokens */
    test_greedy_fast_path(12289, 60);   /* 4-byte loads; the last chunk holds 1 token */
    test_greedy_fast_path(4096, 28);    /* one chunk */
    test_greedy_fast_path(7, 14);
    /* SAMPLER_TEST_QUICK (for compute-sanitizer) makes 2 calls of each size instead of 100. */
    int calls = getenv("SAMPLER_TEST_QUICK") ? 2 : 100;
    test_draws_match_cpu(512, 40, calls);
    test_draws_match_cpu(32000, 40, calls);
    test_draws_match_cpu(151936, 20, calls);
    test_batch_position(32000, 40);
    test_batch_position(151936, 20);
    test_enqueue_slots(32000, 40);
    test_enqueue_history_gathers(32000, 40);
    test_history_keys(32000, 40, 40);
    test_history_keys(32000, 40, 80);
    test_history_keys(151936, 16, 16);
    test_history_key_edges();
    printf("max |logprob difference| over all draws: %.3g\n", max_logprob_diff);
    if (!getenv("SAMPLER_TEST_QUICK")) {
        timings();
        greedy_timings();
    }
    return gpu_test_finish();
}
