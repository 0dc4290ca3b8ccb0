/* The greedy fast path of kernels/cuda/sampler_greedy.cu (a part of test_cuda_sampler; main is
 * in test_cuda_sampler.c): ties and bad values around its chunk boundaries, masked rows, 1 to 300
 * rows and mixed calls, against the CPU sampler and the general path; and its timings. */
#include "tests/gpu/sampler_test.h"

#include "kernels/cpu/sampler.h"
#include "kernels/cuda/sampler.h"

#include <math.h>
#include <string.h>

/* ---- the greedy fast path ---- */

/* The fast path splits a row into chunks of this many tokens; the rows below put ties and bad
 * values on either side of its boundaries. */
#define CHUNK CUDA_SAMPLER_GREEDY_CHUNK
#define GREEDY_CASES 14

/* A token id in chunk k's first or last few, or anywhere when the row has one chunk. */
static int32_t near_boundary(int32_t vocab, int last_of_chunk)
{
    const int32_t chunks = (vocab + CHUNK - 1) / CHUNK;
    if (chunks < 2)
        return (int32_t)(rng_next() % (uint64_t)vocab);
    const int32_t k = 1 + (int32_t)(rng_next() % (uint64_t)(chunks - 1));
    return last_of_chunk ? k * CHUNK - 1 : k * CHUNK;
}

/* Row kinds for greedy rows, by r % GREEDY_CASES: plain and quantised (many ties below the
 * top); the maximum at the two sides of a chunk boundary, at three places (one the last id),
 * in the last chunk only; NaN and +inf in a later chunk than the maximum, the first bad one at
 * a chunk's first id or last id, one at the last id only, one in a row otherwise all -inf;
 * every logit -inf; one or two finite logits among -inf (whole chunks masked); +0/-0 ties; a
 * constant row. */
static void make_greedy_row(float *l, int32_t vocab, int kind)
{
    make_row(l, vocab, kind == 1 ? 1 : kind == 11 ? 4 : 0);
    const int32_t last = vocab - 1;
    int32_t a, b;
    switch (kind) {
    case 2: /* tie across a boundary: the earlier id wins */
        a = near_boundary(vocab, 1);
        b = a + 1 < vocab ? a + 1 : 0;
        l[a] = l[b] = 20.0f;
        break;
    case 3: /* three maxima, one the last id */
        l[last] = l[vocab / 2] = l[rng_next() % (uint64_t)vocab] = 19.5f;
        break;
    case 4: /* the maximum in chunk 0, NaN then +inf further on */
        l[0] = 30.0f;
        a = near_boundary(vocab, 0);
        l[a] = NAN;
        if (a + 5 < vocab)
            l[a + 5] = INFINITY;
        break;
    case 5: /* +inf at a chunk's first id, NaN later */
        a = near_boundary(vocab, 0);
        l[a] = INFINITY;
        l[last] = NAN;
        break;
    case 6: /* NaN at a chunk's last id, +inf at the next chunk's first */
        a = near_boundary(vocab, 1);
        l[a] = -NAN;
        if (a + 1 < vocab)
            l[a + 1] = INFINITY;
        break;
    case 7: /* every logit -inf */
        for (int32_t i = 0; i < vocab; i++)
            l[i] = -INFINITY;
        break;
    case 8: /* one finite logit, in the last chunk */
    case 9: /* two equal finite logits, in different chunks when there are several */
        for (int32_t i = 0; i < vocab; i++)
            l[i] = -INFINITY;
        a = last - (int32_t)(rng_next() % (uint64_t)(vocab < 100 ? vocab : 100));
        l[a] = -3.0f;
        if (kind == 9) {
            b = near_boundary(vocab, 1);
            l[b] = -3.0f;
        }
        break;
    case 10: /* the only bad value at the last id; or NaN among -inf */
        if (rng_next() & 1) {
            l[last] = INFINITY;
        } else {
            for (int32_t i = 0; i < vocab; i++)
                l[i] = -INFINITY;
            l[near_boundary(vocab, 0)] = NAN;
        }
        break;
    case 12: /* the maximum only in the last chunk */
        l[last - (int32_t)(rng_next() % (uint64_t)(vocab < 7 ? vocab : 7))] = 25.0f;
        break;
    case 13: /* constant: token 0 */
        for (int32_t i = 0; i < vocab; i++)
            l[i] = 1.25f;
        break;
    default:
        break;
    }
}

/* The results of slot from cuda_sampler_result for rows rows: code, token, logprob, detail. */
struct slot_results {
    int rc[512];
    int32_t token[512];
    float logprob[512];
    char detail[512][160];
};

static void read_slot(const struct cuda_sampler *s, int slot, int32_t rows,
                      struct slot_results *out)
{
    for (int32_t r = 0; r < rows; r++) {
        out->token[r] = -1;
        out->logprob[r] = NAN;
        out->rc[r] = cuda_sampler_result(s, slot, r, &out->token[r], &out->logprob[r]);
        snprintf(out->detail[r], sizeof(out->detail[r]), "%s",
                 out->rc[r] != 0 ? pagoda_error_detail() : "");
    }
}

/* One call of rows rows from dev into slot 0 with device tokens: its results into out, the
 * device tokens into dev_tokens. Returns 0, or the call's error (reported as a failed check). */
static int sample_slot0(struct cuda_sampler *s, const float *dev, int32_t rows,
                        const struct sampling_params *params, const uint64_t *oi, int32_t *d_tokens,
                        int32_t *dev_tokens, struct slot_results *out)
{
    int rc = cuda_sampler_enqueue(s, 0, dev, rows, params, oi, NULL, NULL, NULL, NULL, d_tokens, 0);
    if (rc != 0) {
        GPU_CHECK(0, "cuda_sampler_enqueue: %d (%s)", rc, pagoda_error_detail());
        return rc;
    }
    GPU_CK(cudaStreamSynchronize(0));
    read_slot(s, 0, rows, out);
    GPU_CK(
        cudaMemcpy(dev_tokens, d_tokens, (size_t)rows * sizeof(int32_t), cudaMemcpyDeviceToHost));
    return 0;
}

/* rows greedy rows (temperature 0, no penalties: the fast path) of make_greedy_row's kinds
 * against the CPU (code, token, logprob within 1e-4) and against the general path (the same
 * rows with a repetition penalty and no history, which leaves the logits as they are: the same
 * code, detail, token); the device tokens (0 for a failed row); the same logprob bits when the
 * call is repeated and when a row is sampled alone; unaligned logits (4-byte loads) giving the
 * same results; and one call mixing fast-path rows, greedy rows with penalties and sampled rows,
 * each against the CPU. */
void test_greedy_fast_path(int32_t vocab, int32_t rows)
{
    MUST(rows <= 512);
    const size_t n = (size_t)vocab * (size_t)rows;
    float *host = malloc(n * sizeof(float)), *dev, *dev_shifted;
    MUST(host);
    for (int32_t r = 0; r < rows; r++)
        make_greedy_row(host + (size_t)r * (size_t)vocab, vocab, r % GREEDY_CASES);
    GPU_CK(cudaMalloc((void **)&dev, n * sizeof(float)));
    GPU_CK(cudaMalloc((void **)&dev_shifted, (n + 1) * sizeof(float)));
    GPU_CK(cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice));
    GPU_CK(cudaMemcpy(dev_shifted + 1, host, n * sizeof(float), cudaMemcpyHostToDevice));
    int32_t *d_tokens, dev_tokens[512];
    GPU_CK(cudaMalloc((void **)&d_tokens, (size_t)rows * sizeof(int32_t)));
    GPU_CK(cudaMemset(d_tokens, 0x7f, (size_t)rows * sizeof(int32_t)));
    struct cuda_sampler *s;
    MUST(cuda_sampler_new(vocab, rows, 0, &s) == 0);
    struct sampler_workspace ws;
    MUST(sampler_workspace_init(&ws, vocab) == 0);
    static struct sampling_params greedy[512], general[512], mixed[512];
    static uint64_t oi[512];
    static struct slot_results fast, gen, again, shifted;
    for (int32_t r = 0; r < rows; r++) {
        greedy[r] = sampling_params_default();
        greedy[r].temperature = 0.0f;
        general[r] = greedy[r];
        general[r].repetition_penalty = 1.5f;
        mixed[r] = r % 3 == 0 ? greedy[r] : general[r];
        if (r % 3 == 2) {
            mixed[r].temperature = 0.8f;
            mixed[r].repetition_penalty = 1.0f;
            mixed[r].seed = 555u + (uint64_t)r;
        }
        oi[r] = (uint64_t)r;
    }
    const cudaStream_t st = 0;
    if (sample_slot0(s, dev, rows, greedy, oi, d_tokens, dev_tokens, &fast) != 0)
        return;
    SAMPLE_OR_RETURN(
        cuda_sampler_enqueue(s, 1, dev, rows, general, oi, NULL, NULL, NULL, NULL, NULL, st));
    SAMPLE_OR_RETURN(
        cuda_sampler_enqueue(s, 2, dev, rows, greedy, oi, NULL, NULL, NULL, NULL, NULL, st));
    GPU_CK(cudaStreamSynchronize(st));
    SAMPLE_OR_RETURN(cuda_sampler_enqueue(s, 3, dev_shifted + 1, rows, greedy, oi, NULL, NULL, NULL,
                                          NULL, NULL, st));
    GPU_CK(cudaStreamSynchronize(st));
    read_slot(s, 1, rows, &gen);
    read_slot(s, 2, rows, &again);
    read_slot(s, 3, rows, &shifted);

    int same_cpu = 0, same_general = 0, same_device = 0, same_again = 0, same_shifted = 0;
    int failed_rows = 0, shown = 0;
    double lp_diff = 0.0;
    for (int32_t r = 0; r < rows; r++) {
        int32_t token = -1;
        float lp = NAN;
        int cpu_rc = sampler_sample(&greedy[r], host + (size_t)r * (size_t)vocab, vocab, NULL, 0,
                                    NULL, 0, 0, &ws, &token, &lp);
        /* The CPU's detail ("sampler: logit 77 is nan") ends the GPU's ("cuda sampler: row 3:
         * logit 77 is nan"). */
        const char *cpu_what = cpu_rc != 0 ? strstr(pagoda_error_detail(), ": ") : NULL;
        const size_t gl = strlen(fast.detail[r]), cl = cpu_what ? strlen(cpu_what) : 0;
        const int same_detail = cpu_rc == 0 || (cpu_what && gl >= cl &&
                                                strcmp(fast.detail[r] + gl - cl, cpu_what) == 0);
        const int ok = fast.rc[r] == 0;
        failed_rows += !ok;
        if (fast.rc[r] == cpu_rc && same_detail && (!ok || fast.token[r] == token)) {
            same_cpu++;
            double d = ok ? fabs((double)lp - (double)fast.logprob[r]) : 0.0;
            if (!(d <= lp_diff))
                lp_diff = d; /* also a NaN */
        } else if (shown++ < MISMATCHES_SHOWN) {
            printf("MISMATCH greedy vocab %d row %d (kind %d): cpu %d token %d, gpu %d token %d "
                   "(%s)\n",
                   (int)vocab, (int)r, (int)(r % GREEDY_CASES), cpu_rc, (int)token, fast.rc[r],
                   (int)fast.token[r], fast.detail[r]);
        }
        same_general += fast.rc[r] == gen.rc[r] && strcmp(fast.detail[r], gen.detail[r]) == 0 &&
                        (!ok || fast.token[r] == gen.token[r]);
        same_device += dev_tokens[r] == (ok ? fast.token[r] : 0);
        same_again += fast.rc[r] == again.rc[r] &&
                      (!ok || (fast.token[r] == again.token[r] &&
                               memcmp(&fast.logprob[r], &again.logprob[r], sizeof(float)) == 0));
        same_shifted +=
            fast.rc[r] == shifted.rc[r] && strcmp(fast.detail[r], shifted.detail[r]) == 0 &&
            (!ok || (fast.token[r] == shifted.token[r] &&
                     fabs((double)fast.logprob[r] - (double)shifted.logprob[r]) < 1e-6));
    }
    printf("greedy fast path, vocab %d, %d rows (%d failing by design): max |logprob "
           "difference| %.3g\n",
           (int)vocab, (int)rows, failed_rows, lp_diff);
    GPU_CHECK(same_cpu == rows,
              "greedy vocab %d: code, detail and token equal the CPU's (%d of %d)", (int)vocab,
              same_cpu, (int)rows);
    GPU_CHECK(lp_diff < 1e-4, "greedy vocab %d: logprobs agree within 1e-4 (max %.3g)", (int)vocab,
              lp_diff);
    GPU_CHECK(same_general == rows,
              "greedy vocab %d: code, detail and token equal the general path's (%d of %d)",
              (int)vocab, same_general, (int)rows);
    GPU_CHECK(same_device == rows, "greedy vocab %d: device tokens, 0 for failed rows (%d of %d)",
              (int)vocab, same_device, (int)rows);
    GPU_CHECK(same_again == rows, "greedy vocab %d: a second call gives the same bits (%d of %d)",
              (int)vocab, same_again, (int)rows);
    GPU_CHECK(same_shifted == rows,
              "greedy vocab %d: unaligned logits (4-byte loads) give the same results (%d of %d)",
              (int)vocab, same_shifted, (int)rows);

    /* Each row alone, for the first rows of every kind: the same bits as in the batch. */
    int same_alone = 0, alone = rows < GREEDY_CASES ? rows : GREEDY_CASES;
    for (int32_t r = 0; r < alone; r++) {
        int32_t t = -1;
        float lp = NAN;
        SAMPLE_OR_RETURN(cuda_sampler_enqueue(s, 0, dev + (size_t)r * (size_t)vocab, 1, &greedy[r],
                                              &oi[r], NULL, NULL, NULL, NULL, NULL, st));
        GPU_CK(cudaStreamSynchronize(st));
        int rc = cuda_sampler_result(s, 0, 0, &t, &lp);
        same_alone += rc == fast.rc[r] &&
                      (rc != 0 || (t == fast.token[r] && memcmp(&lp, &fast.logprob[r], 4) == 0));
    }
    GPU_CHECK(same_alone == alone, "greedy vocab %d: a row alone gives its batch result (%d of %d)",
              (int)vocab, same_alone, alone);

    /* Mixed: fast-path rows, greedy rows with a penalty, sampled rows, in one call. */
    if (sample_slot0(s, dev, rows, mixed, oi, d_tokens, dev_tokens, &again) != 0)
        return;
    int same_mixed = 0;
    for (int32_t r = 0; r < rows; r++) {
        int32_t token = -1;
        int cpu_rc = sampler_sample(&mixed[r], host + (size_t)r * (size_t)vocab, vocab, NULL, 0,
                                    NULL, 0, oi[r], &ws, &token, NULL);
        same_mixed += again.rc[r] == cpu_rc && (cpu_rc != 0 || again.token[r] == token) &&
                      dev_tokens[r] == (cpu_rc == 0 ? token : 0);
    }
    GPU_CHECK(same_mixed == rows,
              "greedy vocab %d: a call mixing the fast path, penalties and sampling matches the "
              "CPU (%d of %d)",
              (int)vocab, same_mixed, (int)rows);

    sampler_workspace_fini(&ws);
    cuda_sampler_free(s);
    GPU_CK(cudaFree(d_tokens));
    GPU_CK(cudaFree(dev_shifted));
    GPU_CK(cudaFree(dev));
    free(host);
}

/* Device time (CUDA events around cuda_sampler_enqueue: the stage's copy, the kernels and the
 * results' copy) of greedy rows at Llama 3's vocabulary, median of 20 after 3 warm-ups: the fast
 * path, and the general path that the same rows take with a repetition penalty (no history; it
 * also copies the row once). Informational: no check. */
void greedy_timings(void)
{
    enum { V = 128256, ROWS = 256, REPS = 20 };
    float *dev;
    const size_t n = (size_t)V * ROWS;
    float *host = malloc(n * sizeof(float));
    MUST(host);
    for (size_t i = 0; i < n; i++)
        host[i] = 20.0f * rng_unit() - 10.0f;
    GPU_CK(cudaMalloc((void **)&dev, n * sizeof(float)));
    GPU_CK(cudaMemcpy(dev, host, n * sizeof(float), cudaMemcpyHostToDevice));
    free(host);
    struct cuda_sampler *s;
    MUST(cuda_sampler_new(V, ROWS, 0, &s) == 0);
    static struct sampling_params params[2][ROWS];
    static uint64_t oi[ROWS];
    for (int r = 0; r < ROWS; r++) {
        params[0][r] = sampling_params_default();
        params[0][r].temperature = 0.0f;
        params[1][r] = params[0][r];
        params[1][r].repetition_penalty = 1.5f;
    }
    cudaEvent_t a, b;
    GPU_CK(cudaEventCreate(&a));
    GPU_CK(cudaEventCreate(&b));
    static const int32_t row_counts[] = {1, 16, 64, 256};
    printf("greedy rows, vocab %d: device time of cuda_sampler_enqueue, median of %d (us)\n", V,
           REPS);
    printf("%-28s %8s %8s %8s %8s\n", "path", "1 row", "16 rows", "64 rows", "256 rows");
    for (int path = 0; path < 2; path++) {
        printf("%-28s", path == 0 ? "fast path" : "general (rep. penalty 1.5)");
        for (int k = 0; k < 4; k++) {
            double t[REPS];
            for (int i = 0; i < REPS + 3; i++) {
                GPU_CK(cudaEventRecord(a, 0));
                SAMPLE_OR_RETURN(cuda_sampler_enqueue(s, 0, dev, row_counts[k], params[path], oi,
                                                      NULL, NULL, NULL, NULL, NULL, 0));
                GPU_CK(cudaEventRecord(b, 0));
                GPU_CK(cudaEventSynchronize(b));
                float ms;
                GPU_CK(cudaEventElapsedTime(&ms, a, b));
                if (i >= 3)
                    t[i - 3] = ms * 1e3;
            }
            qsort(t, REPS, sizeof(double), cmp_double);
            printf(" %8.1f", t[REPS / 2]);
        }
        printf("\n");
    }
    printf("\n");
    GPU_CK(cudaEventDestroy(a));
    GPU_CK(cudaEventDestroy(b));
    cuda_sampler_free(s);
    GPU_CK(cudaFree(dev));
}
