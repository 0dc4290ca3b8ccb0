/* The CUDA sampler: docs/sampling.md on the GPU, one thread block per row. The step numbers in
 * the comments are that page's section numbers; kernels/cpu/sampler.c is the reference.
 *
 * How the block gets the CPU's token without sorting and without depending on its own
 * parallelism:
 * - every float operation that decides the token is in kernels/sampling_math.h, written with
 *   round-to-nearest intrinsics, so -fmad cannot change it;
 * - the weight of a token is recomputed from its penalised logit wherever it is needed, so no
 *   per-token weight array exists and no pass depends on an earlier pass's write order;
 * - each truncation (top-k, top-p) is a threshold on the canonical key (logit descending, id
 *   ascending, a total order packed into 54 bits), found by a most-significant-digit radix
 *   select: top-k counts tokens per digit, top-p sums their integer weights per digit and
 *   compares in f64 exactly as the CPU does; both sums are exact, so the order in which threads
 *   add them does not matter;
 * - the final draw scans token ids upwards: each warp owns a contiguous range of ids, the block
 *   finds the warp whose integer prefix sum crosses the target, and that warp finds the token.
 *
 * This file holds that kernel, sample_rows, for the rows that the greedy fast path
 * (sampler_greedy.cu) does not take; the host side is sampler.cu, and what they share is in
 * sampler_kernels.cuh. */
#include "kernels/cuda/sampler_kernels.cuh"

#include "kernels/philox.h"
#include "kernels/sampling_math.h"

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

/* One block per row; the draw scan gives each warp a range of ids, so the code assumes exactly
 * SAMPLER_THREADS threads. */
#define SAMPLER_THREADS 1024
#define SAMPLER_WARPS (SAMPLER_THREADS / 32)

/* The canonical key: the logit's order-preserving bits above (2^22 - 1 - id), so that a larger
 * key comes earlier in the canonical order. Ids fit in 22 bits (SAMPLER_VOCAB_MAX). */
#define KEY_ID_BITS 22
#define KEY_BITS (32 + KEY_ID_BITS)
#define RADIX_BITS 8
#define RADIX_BINS (1 << RADIX_BITS)
#define RADIX_TOP_SHIFT (((KEY_BITS - 1) / RADIX_BITS) * RADIX_BITS) /* 48 */

/* History marks (one int32 per token and row, zero between calls): the number of occurrences in
 * the output in the low bits (at most 2^24, SAMPLER_HISTORY_MAX), and a flag for the prompt. */
#define MARK_PROMPT (1 << 30)
#define MARK_COUNT_MASK ((1 << 25) - 1)

/* What the rows' weight computations need: the row's maximum and temperature, and the
 * truncation thresholds found so far (0 keeps everything: every key is positive). */
struct keep_rule {
    float max_logit;
    float temperature;
    uint64_t key_k;      /* top-k: keep keys >= key_k */
    uint64_t key_p;      /* top-p: keep keys >= key_p */
    double min_p_weight; /* min-p: keep weights >= this; 0 when off */
};

struct block_shared {
    uint32_t bin_count[RADIX_BINS];
    uint64_t bin_weight[RADIX_BINS];
    double red_f64[SAMPLER_WARPS];
    uint64_t red_u64[SAMPLER_WARPS];
    float red_f32[SAMPLER_WARPS];
    int32_t red_i32[SAMPLER_WARPS];
    int32_t bad_index;
    int32_t overflow_token;
    int32_t best;
    float max_logit;
    uint64_t u64_result;
    double f64_result;
    uint32_t sel_bin;
    uint32_t sel_count;
    uint32_t sel_above_count;
    uint64_t sel_above_weight;
    int32_t draw_warp;
    uint64_t draw_rest;
    int32_t token;
};

/* The canonical key of token i with penalised logit v (finite or -inf, never NaN). -0 and +0
 * are equal logits, so -0 is keyed as +0. */
__device__ static uint64_t canonical_key(float v, int32_t i)
{
    uint32_t u = __float_as_uint(v);
    if ((u << 1) == 0) /* -0: bits, so that no optimisation can treat the zeros as the same */
        u = 0;
    u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((uint64_t)u << KEY_ID_BITS) | (uint64_t)((1u << KEY_ID_BITS) - 1u - (uint32_t)i);
}

/* The weight token i keeps under the rule (steps 3 to 5): 0 when it is no candidate or was
 * truncated. */
__device__ static uint64_t kept_weight(float v, int32_t i, const struct keep_rule &kr)
{
    uint64_t w = sampling_weight(sampling_scaled_logit(v, kr.max_logit, kr.temperature));
    if (w == 0)
        return 0;
    if (kr.key_k | kr.key_p) {
        uint64_t key = canonical_key(v, i);
        if (key < kr.key_k || key < kr.key_p)
            return 0;
    }
    if (__ull2double_rn(w) < kr.min_p_weight)
        return 0;
    return w;
}

__device__ static uint64_t warp_sum_u64(uint64_t v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    return v;
}

/* The block's sum (exact) of one u64 per thread, returned to every thread. */
__device__ static uint64_t block_sum_u64(uint64_t v, struct block_shared &sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_u64(v);
    if (lane == 0)
        sh.red_u64[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = warp_sum_u64(sh.red_u64[lane]);
        if (lane == 0)
            sh.u64_result = v;
    }
    __syncthreads();
    return sh.u64_result;
}

/* The block's sum of one double per thread (in some order: for the log-probability only). */
__device__ static double block_sum_f64(double v, struct block_shared &sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_down_sync(0xffffffffu, v, o);
    if (lane == 0)
        sh.red_f64[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = sh.red_f64[lane];
        for (int o = 16; o > 0; o >>= 1)
            v += __shfl_down_sync(0xffffffffu, v, o);
        if (lane == 0)
            sh.f64_result = v;
    }
    __syncthreads();
    return sh.f64_result;
}

/* Step 2: the lowest id of the largest logit into sh.best and sh.max_logit (INT32_MAX and -inf
 * when every logit is -inf). */
__device__ static void block_argmax(const float *l, int32_t vocab, struct block_shared &sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float bv = -INFINITY;
    int32_t bi = INT32_MAX;
    for (int32_t i = threadIdx.x; i < vocab; i += SAMPLER_THREADS) {
        float v = l[i];
        if (v > bv) { /* ids rise in this loop: equal logits keep the earlier id */
            bv = v;
            bi = i;
        }
    }
    warp_argmax(bv, bi);
    if (lane == 0) {
        sh.red_f32[warp] = bv;
        sh.red_i32[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = sh.red_f32[lane];
        bi = sh.red_i32[lane];
        warp_argmax(bv, bi);
        if (lane == 0) {
            sh.best = bi;
            sh.max_logit = bv;
        }
    }
    __syncthreads();
}

/* Adds one run of tokens that fell into the same radix bin to the block's histogram. */
__device__ static void flush_bin(struct block_shared &sh, int bin, uint32_t count, uint64_t weight)
{
    if (bin >= 0) {
        atomicAdd(&sh.bin_count[bin], count);
        atomicAdd((unsigned long long *)&sh.bin_weight[bin], (unsigned long long)weight);
    }
}

/* Step 5's thresholds. Among the tokens kr keeps, finds the key T such that the tokens with
 * key >= T are the shortest canonical prefix that satisfies the goal: by count, exactly k
 * tokens (k less than the number kept); by weight, the first prefix whose exact weight sum S
 * has (double)S >= target (target at most the kept total). Digit by digit from the top: a
 * histogram of the next digit over the tokens that share the prefix found so far, then warp 0
 * walks the bins from the top, 8 to a lane, to the one where the goal is first met. It stops
 * early once every token of that bin belongs to the prefix, so ties and the id bits cost
 * passes only when they matter. */
__device__ static uint64_t radix_select(const float *l, int32_t vocab, const struct keep_rule &kr,
                                        bool by_weight, uint32_t k, double target,
                                        struct block_shared &sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    uint64_t prefix = 0, mask = 0;
    uint32_t above_count = 0;  /* tokens whose key is above the prefix's range */
    uint64_t above_weight = 0; /* and their weight */
    for (int shift = RADIX_TOP_SHIFT; shift >= 0; shift -= RADIX_BITS) {
        for (int b = threadIdx.x; b < RADIX_BINS; b += SAMPLER_THREADS) {
            sh.bin_count[b] = 0;
            sh.bin_weight[b] = 0;
        }
        __syncthreads();
        /* Runs of equal bins are added once: tokens crowd into few bins, which would otherwise
         * serialise the shared-memory atomics. */
        int run_bin = -1;
        uint32_t run_count = 0;
        uint64_t run_weight = 0;
        for (int32_t i = threadIdx.x; i < vocab; i += SAMPLER_THREADS) {
            float v = l[i];
            uint64_t w = kept_weight(v, i, kr);
            if (w == 0)
                continue;
            uint64_t key = canonical_key(v, i);
            if ((key & mask) != prefix)
                continue;
            int bin = (int)((key >> shift) & (RADIX_BINS - 1));
            if (bin != run_bin) {
                flush_bin(sh, run_bin, run_count, run_weight);
                run_bin = bin;
                run_count = 0;
                run_weight = 0;
            }
            run_count++;
            run_weight += w;
        }
        flush_bin(sh, run_bin, run_count, run_weight);
        __syncthreads();
        if (warp == 0) {
            const int per_lane = RADIX_BINS / 32;
            const int hi = RADIX_BINS - 1 - lane * per_lane; /* lane 0 holds the top bins */
            uint32_t c = 0;
            uint64_t w = 0;
            for (int j = 0; j < per_lane; j++) {
                c += sh.bin_count[hi - j];
                w += sh.bin_weight[hi - j];
            }
            uint32_t ci = c;
            uint64_t wi = w;
            for (int o = 1; o < 32; o <<= 1) {
                uint32_t oc = __shfl_up_sync(0xffffffffu, ci, o);
                uint64_t ow = __shfl_up_sync(0xffffffffu, wi, o);
                if (lane >= o) {
                    ci += oc;
                    wi += ow;
                }
            }
            bool met =
                by_weight ? __ull2double_rn(above_weight + wi) >= target : above_count + ci >= k;
            unsigned ballot = __ballot_sync(0xffffffffu, met);
            int first = ballot ? __ffs(ballot) - 1 : 31; /* not 0: the goal is reachable */
            if (lane == first) {
                uint32_t ac = above_count + (ci - c);
                uint64_t aw = above_weight + (wi - w);
                int bin = hi - per_lane + 1;
                for (int j = 0; j < per_lane; j++) {
                    uint32_t bc = sh.bin_count[hi - j];
                    uint64_t bw = sh.bin_weight[hi - j];
                    bool bin_met = by_weight ? __ull2double_rn(aw + bw) >= target : ac + bc >= k;
                    if (bin_met) {
                        bin = hi - j;
                        break;
                    }
                    ac += bc;
                    aw += bw;
                }
                sh.sel_bin = (uint32_t)bin;
                sh.sel_count = sh.bin_count[bin];
                sh.sel_above_count = ac;
                sh.sel_above_weight = aw;
            }
        }
        __syncthreads();
        prefix |= (uint64_t)sh.sel_bin << shift;
        mask |= (uint64_t)(RADIX_BINS - 1) << shift;
        above_count = sh.sel_above_count;
        above_weight = sh.sel_above_weight;
        bool done = by_weight ? sh.sel_count == 1 : above_count + sh.sel_count == k;
        __syncthreads(); /* everyone has read sh.sel_* before the next pass overwrites it */
        if (done)
            break;
    }
    return prefix;
}

/* Steps 6 and 7: the kept weights' total W, a Philox draw scaled onto [0, W), and the first id
 * (upwards) whose inclusive prefix sum of kept weights exceeds it. */
__device__ static int32_t draw(const float *l, int32_t vocab, const struct keep_rule &kr,
                               const struct row_desc &d, struct block_shared &sh)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t span = (vocab + SAMPLER_WARPS - 1) / SAMPLER_WARPS;
    const int32_t begin = min(vocab, warp * span), end = min(vocab, begin + span);
    uint64_t sum = 0;
    for (int32_t i = begin + lane; i < end; i += 32)
        sum += kept_weight(l[i], i, kr);
    sum = warp_sum_u64(sum);
    if (lane == 0)
        sh.red_u64[warp] = sum;
    __syncthreads();
    if (threadIdx.x == 0) {
        uint64_t total = 0;
        for (int w = 0; w < SAMPLER_WARPS; w++)
            total += sh.red_u64[w];
        uint64_t target =
            philox_scale_u64(philox_u64(philox_draw(d.seed, d.output_index, 0)), total);
        uint64_t acc = 0;
        int w = 0;
        while (w < SAMPLER_WARPS - 1 && acc + sh.red_u64[w] <= target)
            acc += sh.red_u64[w++];
        sh.draw_warp = w;
        sh.draw_rest = target - acc;
        sh.token = -1;
    }
    __syncthreads();
    if (warp == sh.draw_warp) {
        const uint64_t rest = sh.draw_rest;
        uint64_t acc = 0;
        for (int32_t base = begin; base < end; base += 32) {
            int32_t i = base + lane;
            uint64_t w = i < end ? kept_weight(l[i], i, kr) : 0;
            uint64_t incl = w;
            for (int o = 1; o < 32; o <<= 1) {
                uint64_t other = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o)
                    incl += other;
            }
            unsigned hit = __ballot_sync(0xffffffffu, acc + incl > rest);
            if (hit) {
                if (lane == __ffs(hit) - 1)
                    sh.token = i;
                break;
            }
            acc += __shfl_sync(0xffffffffu, incl, 31);
        }
    }
    __syncthreads();
    return sh.token;
}

/* Step 1 on the row's copy work[0..vocab) of its logits. The marks are counted and flagged with
 * atomics, then each history entry claims (and clears) its token's mark, so each distinct token
 * is penalised exactly once and the marks are zero again afterwards. Returns a token whose
 * finite logit overflowed, or -1, in every thread. */
__device__ static int32_t penalise_row(float *work, int32_t *marks, const int32_t *history,
                                       const struct row_desc &d, struct block_shared &sh)
{
    const uint32_t n_history = d.n_prompt + d.n_output;
    if (threadIdx.x == 0)
        sh.overflow_token = -1;
    for (uint32_t j = threadIdx.x; j < d.n_prompt; j += SAMPLER_THREADS)
        atomicOr(&marks[history[j]], MARK_PROMPT);
    for (uint32_t j = d.n_prompt + threadIdx.x; j < n_history; j += SAMPLER_THREADS)
        atomicAdd(&marks[history[j]], 1);
    __syncthreads();
    int32_t overflowed = -1;
    for (uint32_t j = threadIdx.x; j < n_history; j += SAMPLER_THREADS) {
        int32_t t = history[j];
        int32_t mark = atomicExch(&marks[t], 0);
        if (mark == 0)
            continue;
        float old = work[t];
        float v = sampling_penalise(old, d.repetition_penalty, d.presence_penalty,
                                    d.frequency_penalty, mark & MARK_COUNT_MASK);
        if (isinf(v) && !isinf(old))
            overflowed = t;
        work[t] = v;
    }
    if (overflowed >= 0)
        sh.overflow_token = overflowed;
    __syncthreads();
    return sh.overflow_token;
}

/* Block b samples row row_list[b]: the rows the greedy fast path does not take. */
__global__ void __launch_bounds__(SAMPLER_THREADS)
    sample_rows(const float *__restrict__ logits, int32_t vocab,
                const struct row_desc *__restrict__ descs, const int32_t *__restrict__ row_list,
                const int32_t *__restrict__ history, int32_t *hist_slots, uint32_t max_history,
                float *work_logits, int32_t *marks, struct row_result *results, int32_t *out_tokens)
{
    __shared__ struct block_shared sh;
    const int32_t row = row_list[blockIdx.x];
    /* A row that cannot be sampled leaves token 0 for the kernels that read out_tokens. */
    if (out_tokens && threadIdx.x == 0)
        out_tokens[row] = 0;
    const struct row_desc d = descs[row];
    /* A history slot: its missing tokens come from the packed history; the token sampled here
     * is appended after the history (0 until then, as out_tokens). */
    const uint32_t n_history = d.n_prompt + d.n_output;
    int32_t *slot_hist = d.hslot >= 0 ? hist_slots + (size_t)d.hslot * max_history : nullptr;
    const int32_t *row_history = history + d.hist_offset;
    if (slot_hist) {
        for (uint32_t j = threadIdx.x; j < d.up_count; j += SAMPLER_THREADS)
            slot_hist[d.up_from + j] = history[d.hist_offset + j];
        if (threadIdx.x == 0 && n_history < max_history)
            slot_hist[n_history] = 0;
        __syncthreads();
        row_history = slot_hist;
    }
    const float *in = logits + (size_t)row * vocab;
    float *work = work_logits + (size_t)row * vocab;
    struct row_result *res = &results[row];

    /* NaN and +inf are refused (the first by id is named); a copy is made for the penalties. */
    if (threadIdx.x == 0)
        sh.bad_index = INT32_MAX;
    __syncthreads();
    int32_t bad = INT32_MAX;
    for (int32_t i = threadIdx.x; i < vocab; i += SAMPLER_THREADS) {
        float v = in[i];
        if (bad == INT32_MAX && (isnan(v) || v == INFINITY))
            bad = i;
        if (d.penalties)
            work[i] = v;
    }
    if (bad != INT32_MAX)
        atomicMin(&sh.bad_index, bad);
    __syncthreads();
    if (sh.bad_index != INT32_MAX) {
        if (threadIdx.x == 0) {
            res->status = ROW_BAD_LOGIT;
            res->detail = sh.bad_index;
            res->value = in[sh.bad_index];
        }
        return;
    }

    /* Step 1. */
    const float *l = in;
    if (d.penalties) {
        int32_t overflowed = penalise_row(work, marks + (size_t)row * vocab, row_history, d, sh);
        if (overflowed >= 0) {
            if (threadIdx.x == 0) {
                res->status = ROW_OVERFLOW;
                res->detail = overflowed;
            }
            return;
        }
        l = work;
    }

    /* Step 2. */
    block_argmax(l, vocab, sh);
    const float m = sh.max_logit;
    if (m == -INFINITY) {
        if (threadIdx.x == 0)
            res->status = ROW_ALL_MASKED;
        return;
    }

    /* Step 8's normaliser, and the number of candidates (tokens of weight > 0). */
    struct keep_rule kr = {m, d.temperature, 0, 0, 0.0};
    const bool greedy = d.temperature == 0.0f;
    double exp_sum = 0.0;
    uint64_t candidates = 0;
    for (int32_t i = threadIdx.x; i < vocab; i += SAMPLER_THREADS) {
        float v = l[i];
        exp_sum += exp((double)v - (double)m);
        if (!greedy)
            candidates += kept_weight(v, i, kr) > 0;
    }
    exp_sum = block_sum_f64(exp_sum, sh);

    int32_t token = sh.best;
    if (!greedy) {
        candidates = block_sum_u64(candidates, sh);
        /* Step 5: top-k, then top-p over what top-k kept, then min-p. */
        if (d.top_k > 0 && (uint64_t)d.top_k < candidates)
            kr.key_k = radix_select(l, vocab, kr, false, (uint32_t)d.top_k, 0.0, sh);
        if (d.top_p < 1.0f) {
            uint64_t kept = 0;
            for (int32_t i = threadIdx.x; i < vocab; i += SAMPLER_THREADS)
                kept += kept_weight(l[i], i, kr);
            kept = block_sum_u64(kept, sh);
            double target = __dmul_rn((double)d.top_p, __ull2double_rn(kept));
            kr.key_p = radix_select(l, vocab, kr, true, 0, target, sh);
        }
        if (d.min_p > 0.0f)
            kr.min_p_weight = __dmul_rn((double)d.min_p, (double)SAMPLING_WEIGHT_ONE);
        token = draw(l, vocab, kr, d, sh);
    }

    if (threadIdx.x == 0) {
        res->status = ROW_OK;
        res->token = token;
        if (out_tokens)
            out_tokens[row] = token;
        if (slot_hist && n_history < max_history)
            slot_hist[n_history] = token;
        res->logprob = (float)(((double)l[token] - (double)m) - log(exp_sum));
    }
}

cudaError_t launch_sample_rows(int32_t rows, const float *logits, int32_t vocab,
                               const struct row_desc *descs, const int32_t *row_list,
                               const int32_t *history, int32_t *hist_slots, uint32_t max_history,
                               float *work_logits, int32_t *marks, struct row_result *results,
                               int32_t *out_tokens, cudaStream_t stream)
{
    sample_rows<<<rows, SAMPLER_THREADS, 0, stream>>>(logits, vocab, descs, row_list, history,
                                                      hist_slots, max_history, work_logits, marks,
                                                      results, out_tokens);
    return cudaGetLastError();
}
