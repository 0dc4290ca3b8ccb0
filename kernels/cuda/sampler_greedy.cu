/* The CUDA sampler's greedy fast path (kernels/cuda/sampler.h): sample_greedy, the kernel that
 * samples the greedy rows without penalties, each row split over several blocks, and its launch.
 * The host side that stages the rows and calls the launch is sampler.cu; the general path,
 * sample_rows, is sampler_rows.cu; what they share is in sampler_kernels.cuh. */
#include "kernels/cuda/sampler_kernels.cuh"

#include "kernels/cuda/sampler.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

/* A greedy row without penalties needs step 2 and step 8's normaliser only; sample_rows makes
 * three passes over it with one block, a single SM reading 513 KB (vocab 128256): 86 us for
 * one row, 212 us for 256 rows (0.6 TB/s). Here the row is split into chunks of GREEDY_CHUNK
 * tokens, one block each, that read their chunk once into registers: the bad-value check, the
 * chunk's argmax and its exp sum relative to the chunk's maximum. The last block of the row to
 * finish (an arrival counter per row) combines the chunks in chunk order. One row spreads over
 * 32 SMs (8 us); 256 rows take 79 us (1.7 TB/s). There the f64 exp of every logit (about 22
 * f64 operations each: ~43 us of the H200's f64 units) costs more than the reads (~30 us).
 * Blocks that stay resident and loop over the chunks, loading the next one while computing on
 * the current one, measured slower (117 us at 256 rows, 4 blocks per SM against 6 here). */
#define GREEDY_THREADS 256
#define GREEDY_WARPS (GREEDY_THREADS / 32)
#define GREEDY_PER_THREAD 16 /* four 16-byte loads in flight per thread */
#define GREEDY_CHUNK (GREEDY_THREADS * GREEDY_PER_THREAD)
static_assert(GREEDY_CHUNK == CUDA_SAMPLER_GREEDY_CHUNK, "sampler.h's chunk size");

/* Reduces (bv, bi) over the warp (warp_argmax) and the lowest bad id with it. Lane 0 holds the
 * result. */
__device__ static void warp_argmax_bad(float &bv, int32_t &bi, int32_t &bad)
{
    warp_argmax(bv, bi);
    for (int o = 16; o > 0; o >>= 1)
        bad = min(bad, __shfl_down_sync(0xffffffffu, bad, o));
}

/* The sum of a double per lane in a fixed tree (lane 0 holds it): the same bits on every run. */
__device__ static double warp_sum_f64(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

/* Block b handles chunk b % chunks of row rows_list[b / chunks]. kVec: 16-byte loads (vocab a
 * multiple of 4 and the logits 16-byte aligned), else 4-byte loads. arrivals[g] counts the
 * finished blocks of the g-th row of the list; the last one sets it back to 0 for the next
 * launch, so the counters need no reset between calls (or graph replays). */
template <bool kVec>
__global__ void __launch_bounds__(GREEDY_THREADS)
    sample_greedy(const float *__restrict__ logits, int32_t vocab, int32_t chunks,
                  const int32_t *__restrict__ row_list, struct greedy_partial *partials,
                  uint32_t *arrivals, struct row_result *results, int32_t *out_tokens)
{
    __shared__ float red_max[GREEDY_WARPS];
    __shared__ int32_t red_best[GREEDY_WARPS], red_bad[GREEDY_WARPS];
    __shared__ double red_sum[GREEDY_WARPS];
    __shared__ int is_last;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t g = blockIdx.x / chunks, chunk = blockIdx.x % chunks;
    const int32_t row = row_list[g];
    const float *in = logits + (size_t)row * vocab;
    const int32_t begin = chunk * GREEDY_CHUNK;

    /* Value j of this thread is token id_of(j). A slot past the vocabulary holds -inf, which
     * adds 0 to the sum; the argmax and the check skip it. */
    float v[GREEDY_PER_THREAD];
    auto id_of = [&](int j) -> int32_t {
        return kVec ? begin + ((j / 4) * GREEDY_THREADS + (int32_t)threadIdx.x) * 4 + (j % 4)
                    : begin + j * GREEDY_THREADS + (int32_t)threadIdx.x;
    };
    if (kVec) {
#pragma unroll
        for (int q = 0; q < GREEDY_PER_THREAD / 4; q++) {
            const int32_t i = id_of(4 * q);
            float4 x = i < vocab ? __ldg((const float4 *)(in + i))
                                 : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
            v[4 * q] = x.x;
            v[4 * q + 1] = x.y;
            v[4 * q + 2] = x.z;
            v[4 * q + 3] = x.w;
        }
    } else {
#pragma unroll
        for (int j = 0; j < GREEDY_PER_THREAD; j++) {
            const int32_t i = id_of(j);
            v[j] = i < vocab ? __ldg(in + i) : -INFINITY;
        }
    }

    float bv = -INFINITY;
    int32_t bi = INT32_MAX, bad = INT32_MAX;
#pragma unroll
    for (int j = 0; j < GREEDY_PER_THREAD; j++) {
        const int32_t i = id_of(j);
        if (i >= vocab)
            continue;
        if (isnan(v[j]) || v[j] == INFINITY)
            bad = min(bad, i);
        if (argmax_better(v[j], i, bv, bi)) {
            bv = v[j];
            bi = i;
        }
    }
    warp_argmax_bad(bv, bi, bad);
    if (lane == 0) {
        red_max[warp] = bv;
        red_best[warp] = bi;
        red_bad[warp] = bad;
    }
    __syncthreads();
    /* Every thread folds the warps' results, so the chunk's maximum needs no second barrier. */
    float m = -INFINITY;
    int32_t best = INT32_MAX, first_bad = INT32_MAX;
    for (int w = 0; w < GREEDY_WARPS; w++) {
        if (argmax_better(red_max[w], red_best[w], m, best)) {
            m = red_max[w];
            best = red_best[w];
        }
        first_bad = min(first_bad, red_bad[w]);
    }

    /* Step 8's sum relative to the chunk's maximum, in double as sampler_sample() computes it;
     * skipped when the row fails anyway. The order is fixed: this thread's values in turn, then
     * the warps' trees, then the warps in order. */
    double sum = 0.0;
    if (first_bad == INT32_MAX && m != -INFINITY) {
#pragma unroll
        for (int j = 0; j < GREEDY_PER_THREAD; j++)
            sum += exp((double)v[j] - (double)m); /* exp(-inf) = 0 for the -inf slots */
    }
    sum = warp_sum_f64(sum);
    if (lane == 0)
        red_sum[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        double chunk_sum = 0.0;
        for (int w = 0; w < GREEDY_WARPS; w++)
            chunk_sum += red_sum[w];
        struct greedy_partial p = {chunk_sum, m, best, first_bad, 0};
        partials[(size_t)g * chunks + chunk] = p;
        /* Release the partial before arriving; the last block's fence after its arrival orders
         * its reads of the others' partials after theirs. */
        __threadfence();
        is_last = atomicAdd(&arrivals[g], 1u) == (uint32_t)chunks - 1;
        if (is_last) {
            arrivals[g] = 0;
            __threadfence();
        }
    }
    __syncthreads();
    if (!is_last || warp != 0)
        return;

    /* The combine, by warp 0 of the row's last block: lane k takes chunks k, k + 32, ... (read
     * from L2, where the other blocks wrote them). */
    const struct greedy_partial *rp = partials + (size_t)g * chunks;
    bv = -INFINITY;
    bi = INT32_MAX;
    bad = INT32_MAX;
    for (int32_t c = lane; c < chunks; c += 32) {
        float cm = __ldcg(&rp[c].max_logit);
        int32_t cb = __ldcg(&rp[c].best);
        if (argmax_better(cm, cb, bv, bi)) {
            bv = cm;
            bi = cb;
        }
        bad = min(bad, __ldcg(&rp[c].bad));
    }
    warp_argmax_bad(bv, bi, bad);
    bv = __shfl_sync(0xffffffffu, bv, 0);
    bi = __shfl_sync(0xffffffffu, bi, 0);
    bad = __shfl_sync(0xffffffffu, bad, 0);
    struct row_result *res = &results[row];
    if (bad != INT32_MAX || bv == -INFINITY) { /* NaN or +inf first, as in sample_rows */
        if (lane == 0) {
            if (bad != INT32_MAX) {
                res->status = ROW_BAD_LOGIT;
                res->detail = bad;
                res->value = in[bad];
            } else {
                res->status = ROW_ALL_MASKED;
            }
            if (out_tokens)
                out_tokens[row] = 0;
        }
        return;
    }
    /* sum_i exp(l[i] - m) = sum_c exp(m_c - m) * sum_{i in c} exp(l[i] - m_c), in chunk order
     * per lane and a fixed tree across lanes. */
    sum = 0.0;
    for (int32_t c = lane; c < chunks; c += 32) {
        float cm = __ldcg(&rp[c].max_logit);
        if (cm != -INFINITY)
            sum += exp((double)cm - (double)bv) * __ldcg(&rp[c].exp_sum);
    }
    sum = warp_sum_f64(sum);
    if (lane == 0) {
        res->status = ROW_OK;
        res->token = bi;
        res->logprob = (float)(((double)in[bi] - (double)bv) - log(sum));
        if (out_tokens)
            out_tokens[row] = bi;
    }
}

cudaError_t launch_sample_greedy(int32_t rows, const float *logits, int32_t vocab, int32_t chunks,
                                 const int32_t *row_list, struct greedy_partial *partials,
                                 uint32_t *arrivals, struct row_result *results,
                                 int32_t *out_tokens, cudaStream_t stream)
{
    /* At most 2^16 rows of 2^10 chunks: the grid stays far below its 2^31 - 1 blocks. */
    const unsigned blocks = (unsigned)rows * (unsigned)chunks;
    if (vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0)
        sample_greedy<true><<<blocks, GREEDY_THREADS, 0, stream>>>(
            logits, vocab, chunks, row_list, partials, arrivals, results, out_tokens);
    else
        sample_greedy<false><<<blocks, GREEDY_THREADS, 0, stream>>>(
            logits, vocab, chunks, row_list, partials, arrivals, results, out_tokens);
    return cudaGetLastError();
}
