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
 */
#include "kernels/cuda/sampler.h"

extern "C" {
#include "common/error.h"
}
#include "kernels/philox.h"
#include "kernels/sampling_math.h"

#include <cuda_runtime.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* What the kernel reports for a row (struct row_result.status). */
enum row_status {
    ROW_OK = 0,
    ROW_BAD_LOGIT = 1, /* a NaN or +inf logit; detail = its index, value = it */
    ROW_OVERFLOW = 2,  /* a penalty made a finite logit infinite; detail = the token */
    ROW_ALL_MASKED = 3 /* every logit is -inf */
};

/* One row's parameters as the kernel reads them. hist_offset, n_prompt and n_output index the
 * call's packed history; they are 0 when the row's penalties are off. A row whose history is kept
 * on the device (hslot >= 0, struct cuda_sampler's history slots) reads it from its slot: the
 * packed history holds only the slot's missing tokens, up_count of them from index up_from on. */
struct row_desc {
    uint64_t seed;
    uint64_t output_index;
    float temperature;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    int32_t top_k;
    int32_t penalties; /* 1 when step 1 is not the identity */
    uint32_t hist_offset;
    uint32_t n_prompt;
    uint32_t n_output;
    int32_t hslot; /* the row's history slot, or -1: the history is the packed one */
    uint32_t up_from;
    uint32_t up_count;
    uint64_t pad;
};
static_assert(sizeof(struct row_desc) % 16 == 0, "descriptors stay 16-byte aligned");

struct row_result {
    int32_t token;
    float logprob;
    int32_t status; /* enum row_status */
    int32_t detail;
    float value;
    int32_t pad;
};

/* A history slot (host bookkeeping; the tokens are in d_hist): key 0 is a free slot. */
struct hist_slot {
    uint64_t key;
    uint64_t used;     /* the call that last read it (struct cuda_sampler's calls) */
    uint64_t staged;   /* the call whose row took it (a second row with its key does not) */
    uint64_t twice;    /* a call that had its key in two rows: its appended token is not kept */
    uint32_t have;     /* its first `have` tokens are the key's history */
    uint32_t n_prompt; /* the key's prompt length, a check that the key still means the same */
};

struct cuda_sampler {
    int32_t vocab;
    int32_t max_rows;
    size_t max_history;
    float *d_logits;       /* [max_rows][vocab] penalised logits (rows with penalties) */
    int32_t *d_marks;      /* [max_rows][vocab] history marks, zero between calls */
    int32_t greedy_chunks; /* blocks per row of sample_greedy */
    struct greedy_partial *d_partials; /* [max_rows][greedy_chunks] */
    uint32_t *d_arrivals;              /* [max_rows], zero between calls */
    /* A call's row_desc[rows], its row list (int32[rows]: the greedy fast path's rows, then the
     * others, each in order), its history gathers (int32[2 * rows]: packed history index, source
     * index), then its packed int32 history. */
    unsigned char *d_stage;
    /* Pinned, the same layout, two in turn: a call fills one while the copy of the call before
     * may still wait on the stream; stage_copied[i] marks the end of the last copy from i. */
    unsigned char *h_stage[2];
    cudaEvent_t stage_copied[2];
    int next_stage;
    struct row_result *d_results; /* [max_rows] */
    /* The histories kept on the device (cuda_sampler_enqueue_keyed): max_rows slots of
     * max_history tokens, each holding the first `have` tokens of one key's history, its
     * sampled tokens appended by the kernels themselves; slots are found by key through an
     * open-addressing index (linear probing, index_cap a power of two >= 2 * max_rows). */
    int32_t *d_hist;
    struct hist_slot *slots;
    int32_t *index; /* [index_cap]: a slot, or -1 */
    uint32_t index_cap;
    uint64_t calls; /* enqueue calls so far: a slot's `used` is the last call that read it */
    int32_t hand;   /* where the search for a slot to take over starts */
    /* [CUDA_SAMPLER_SLOTS + 1][max_rows], pinned: one per slot of cuda_sampler_enqueue, then
     * cuda_sampler_sample's. */
    struct row_result *h_results;
};

/* ---- device side ---------------------------------------------------------------------- */

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

/* Whether (v, i) beats (bv, bi) for the argmax: larger logit, then lower id. */
__device__ static bool argmax_better(float v, int32_t i, float bv, int32_t bi)
{
    return v > bv || (v == bv && i < bi);
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
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, bv, o);
        int32_t oi = __shfl_down_sync(0xffffffffu, bi, o);
        if (argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) {
        sh.red_f32[warp] = bv;
        sh.red_i32[warp] = bi;
    }
    __syncthreads();
    if (warp == 0) {
        bv = sh.red_f32[lane];
        bi = sh.red_i32[lane];
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_down_sync(0xffffffffu, bv, o);
            int32_t oi = __shfl_down_sync(0xffffffffu, bi, o);
            if (argmax_better(ov, oi, bv, bi)) {
                bv = ov;
                bi = oi;
            }
        }
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

/* ---- the greedy fast path ------------------------------------------------------------- */

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

/* One chunk's summary, written by its block and read by the row's last block. */
struct greedy_partial {
    double exp_sum;  /* sum of exp(l[i] - max_logit) over the chunk; 0 when max_logit is -inf */
    float max_logit; /* -inf when every logit of the chunk is -inf */
    int32_t best;    /* the lowest id of max_logit in the chunk */
    int32_t bad;     /* the lowest id of a NaN or +inf logit in the chunk, INT32_MAX if none */
    int32_t pad;
};

/* Reduces (bv, bi) over the warp and the lowest bad id with it: the argmax pair is a total
 * order, so the result does not depend on the order of the shuffles. Lane 0 holds the result. */
__device__ static void warp_argmax_bad(float &bv, int32_t &bi, int32_t &bad)
{
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, bv, o);
        int32_t oi = __shfl_down_sync(0xffffffffu, bi, o);
        int32_t ob = __shfl_down_sync(0xffffffffu, bad, o);
        if (argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
        bad = min(bad, ob);
    }
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

/* ---- host side ------------------------------------------------------------------------ */

static int cuda_failed(cudaError_t err, const char *call)
{
    return pagoda_error_set(PAGODA_ECUDA, "cuda sampler: %s: %s", call, cudaGetErrorString(err));
}

static size_t stage_desc_bytes(int32_t max_rows)
{
    return (size_t)max_rows * sizeof(struct row_desc);
}

/* Whether sample_greedy takes the row: greedy without penalties, the token the argmax of the
 * logits as given. */
static bool greedy_fast(const struct row_desc *d)
{
    return d->temperature == 0.0f && !d->penalties;
}

/* Where the row list ends and the history gathers begin in a stage of rows rows. */
static size_t stage_list_end(int32_t rows)
{
    return stage_desc_bytes(rows) + (size_t)rows * sizeof(int32_t);
}

/* Where the history gathers end and the history begins. */
static size_t stage_history_at(int32_t rows)
{
    return stage_list_end(rows) + 2 * (size_t)rows * sizeof(int32_t);
}

extern "C" int cuda_sampler_new(int32_t vocab, int32_t max_rows, size_t max_history,
                                struct cuda_sampler **out)
{
    if (!out)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: NULL out");
    *out = NULL;
    if (vocab < 1 || vocab > SAMPLER_VOCAB_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "cuda sampler: vocab %d outside [1, %d]", (int)vocab,
                                SAMPLER_VOCAB_MAX);
    if (max_rows < 1 || max_rows > CUDA_SAMPLER_ROWS_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "cuda sampler: max_rows %d outside [1, %d]",
                                (int)max_rows, CUDA_SAMPLER_ROWS_MAX);
    if (max_history > SAMPLER_HISTORY_MAX || max_history * (size_t)max_rows > INT32_MAX)
        return pagoda_error_set(PAGODA_ERANGE,
                                "cuda sampler: max_history %zu (per row, %d rows) exceeds %d per "
                                "row or %d in all",
                                max_history, (int)max_rows, SAMPLER_HISTORY_MAX, INT32_MAX);

    struct cuda_sampler *s = (struct cuda_sampler *)calloc(1, sizeof(*s));
    if (!s)
        return pagoda_error_set(PAGODA_ENOMEM, "cuda sampler: %zu bytes", sizeof(*s));
    s->vocab = vocab;
    s->max_rows = max_rows;
    s->max_history = max_history;
    const size_t per_row = (size_t)max_rows * (size_t)vocab;
    const size_t stage_bytes =
        stage_history_at(max_rows) + max_history * (size_t)max_rows * sizeof(int32_t);
    s->greedy_chunks = (vocab + GREEDY_CHUNK - 1) / GREEDY_CHUNK;
    const size_t result_bytes = (size_t)max_rows * sizeof(struct row_result);
    int rc;
    cudaError_t err;
    if ((err = cudaMalloc((void **)&s->d_logits, per_row * sizeof(float))) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(logits)");
        goto fail;
    }
    if ((err = cudaMalloc((void **)&s->d_marks, per_row * sizeof(int32_t))) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(marks)");
        goto fail;
    }
    if ((err = cudaMemset(s->d_marks, 0, per_row * sizeof(int32_t))) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMemset(marks)");
        goto fail;
    }
    if ((err = cudaMalloc((void **)&s->d_partials, (size_t)max_rows * (size_t)s->greedy_chunks *
                                                       sizeof(struct greedy_partial))) !=
        cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(partials)");
        goto fail;
    }
    if ((err = cudaMalloc((void **)&s->d_arrivals, (size_t)max_rows * sizeof(uint32_t))) !=
        cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(arrivals)");
        goto fail;
    }
    if ((err = cudaMemset(s->d_arrivals, 0, (size_t)max_rows * sizeof(uint32_t))) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMemset(arrivals)");
        goto fail;
    }
    if ((err = cudaMalloc((void **)&s->d_stage, stage_bytes)) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(stage)");
        goto fail;
    }
    for (int i = 0; i < 2; i++) {
        if ((err = cudaMallocHost((void **)&s->h_stage[i], stage_bytes)) != cudaSuccess) {
            rc = cuda_failed(err, "cudaMallocHost(stage)");
            goto fail;
        }
        if ((err = cudaEventCreateWithFlags(&s->stage_copied[i], cudaEventDisableTiming)) !=
            cudaSuccess) {
            rc = cuda_failed(err, "cudaEventCreate(stage)");
            goto fail;
        }
    }
    if ((err = cudaMalloc((void **)&s->d_results, result_bytes)) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(results)");
        goto fail;
    }
    if (max_history > 0) {
        if ((err = cudaMalloc((void **)&s->d_hist,
                              max_history * (size_t)max_rows * sizeof(int32_t))) != cudaSuccess) {
            rc = cuda_failed(err, "cudaMalloc(history slots)");
            goto fail;
        }
        s->index_cap = 1;
        while (s->index_cap < 2 * (uint32_t)max_rows)
            s->index_cap *= 2;
        s->slots = (struct hist_slot *)calloc((size_t)max_rows, sizeof(*s->slots));
        s->index = (int32_t *)malloc(s->index_cap * sizeof(*s->index));
        if (!s->slots || !s->index) {
            rc = pagoda_error_set(PAGODA_ENOMEM, "cuda sampler: history slots of %d rows",
                                  (int)max_rows);
            goto fail;
        }
        for (uint32_t i = 0; i < s->index_cap; i++)
            s->index[i] = -1;
    }
    if ((err = cudaMallocHost((void **)&s->h_results, (CUDA_SAMPLER_SLOTS + 1) * result_bytes)) !=
        cudaSuccess) {
        rc = cuda_failed(err, "cudaMallocHost(results)");
        goto fail;
    }
    /* The memsets above run on the legacy default stream, which the caller's stream need not
     * wait for (a non-blocking stream: the CUDA backend's): the greedy path's counters must be
     * zero before its first launch, whatever stream that is. */
    if ((err = cudaDeviceSynchronize()) != cudaSuccess) {
        rc = cuda_failed(err, "cudaDeviceSynchronize(zeroed counters)");
        goto fail;
    }
    *out = s;
    return 0;

fail:
    cuda_sampler_free(s);
    return rc;
}

/* Frees what exists; errors are ignored, since nothing could be done about them here. */
extern "C" void cuda_sampler_free(struct cuda_sampler *s)
{
    if (!s)
        return;
    cudaFree(s->d_logits);
    cudaFree(s->d_marks);
    cudaFree(s->d_partials);
    cudaFree(s->d_arrivals);
    cudaFree(s->d_stage);
    for (int i = 0; i < 2; i++) {
        if (s->stage_copied[i]) {
            cudaEventSynchronize(s->stage_copied[i]);
            cudaEventDestroy(s->stage_copied[i]);
        }
        cudaFreeHost(s->h_stage[i]);
    }
    cudaFree(s->d_results);
    cudaFreeHost(s->h_results);
    cudaFree(s->d_hist);
    free(s->slots);
    free(s->index);
    free(s);
}

/* Re-records the current detail with "row r: " in front. */
static int row_error(int rc, int32_t row)
{
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
    return pagoda_error_set(rc, "cuda sampler: row %d: %s", (int)row, detail);
}

/* ---- history slots ---- */

static uint32_t key_home(const struct cuda_sampler *s, uint64_t key)
{
    return (uint32_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (s->index_cap - 1);
}

/* The slot of key, or -1. */
static int32_t slot_find(const struct cuda_sampler *s, uint64_t key)
{
    for (uint32_t i = key_home(s, key);; i = (i + 1) & (s->index_cap - 1)) {
        const int32_t k = s->index[i];
        if (k < 0)
            return -1;
        if (s->slots[k].key == key)
            return k;
    }
}

/* Removes key from the index (linear probing's backward shift: the entries after it that would
 * no longer be found move up). */
static void index_remove(struct cuda_sampler *s, uint64_t key)
{
    const uint32_t mask = s->index_cap - 1;
    uint32_t i = key_home(s, key);
    while (s->index[i] >= 0 && s->slots[s->index[i]].key != key)
        i = (i + 1) & mask;
    if (s->index[i] < 0)
        return;
    for (uint32_t j = (i + 1) & mask; s->index[j] >= 0; j = (j + 1) & mask) {
        const uint32_t home = key_home(s, s->slots[s->index[j]].key);
        /* the entry at j may fill the hole at i when its home is not in (i, j] cyclically */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            s->index[i] = s->index[j];
            i = j;
        }
    }
    s->index[i] = -1;
}

/* A slot for key, which has none: a free one, else one that no call read in the last two (most
 * likely done with), else any whose key this call does not have (slots_mark has marked those it
 * has: a call has at most max_rows keys, so one is left). Its tokens are none yet. Taking over
 * the slot of a call still on the device is safe: calls run in order on one stream, so this
 * call's copy into the slot comes after that call's reads and its append. */
static int32_t slot_take(struct cuda_sampler *s, uint64_t key)
{
    int32_t pick = -1;
    for (int32_t n = 0; n < s->max_rows && pick < 0; n++) {
        const int32_t k = (s->hand + n) % s->max_rows;
        if (s->slots[k].key == 0 || s->slots[k].used + 2 < s->calls)
            pick = k;
    }
    for (int32_t n = 0; n < s->max_rows && pick < 0; n++) {
        const int32_t k = (s->hand + n) % s->max_rows;
        if (s->slots[k].used != s->calls)
            pick = k;
    }
    s->hand = (pick + 1) % s->max_rows;
    if (s->slots[pick].key != 0)
        index_remove(s, s->slots[pick].key);
    s->slots[pick] = (struct hist_slot){.key = key};
    uint32_t i = key_home(s, key);
    while (s->index[i] >= 0)
        i = (i + 1) & (s->index_cap - 1);
    s->index[i] = pick;
    return pick;
}

/* Marks the slots of the call's keys (those of penalised rows) as read by it before any row
 * takes a slot, so that none of them is taken over for another key of the call. */
static void slots_mark(struct cuda_sampler *s, int32_t rows, const struct sampling_params *params,
                       const uint64_t *keys)
{
    if (!keys || !s->d_hist)
        return;
    for (int32_t r = 0; r < rows; r++) {
        if (keys[r] == 0 || !sampling_params_penalised(&params[r]))
            continue;
        const int32_t k = slot_find(s, keys[r]);
        if (k < 0)
            continue;
        s->slots[k].used = s->calls;
    }
}

/* The history slot of a penalised row with key (not 0) and its tokens of the device's that
 * stand (*have), or -1 when the row's history is packed whole: no key, no slots, or a key that
 * an earlier row of this call has taken. */
static int32_t row_slot(struct cuda_sampler *s, uint64_t key, size_t n_prompt, size_t n_history,
                        size_t *have)
{
    *have = 0;
    if (key == 0 || !s->d_hist)
        return -1;
    int32_t k = slot_find(s, key);
    if (k >= 0 && s->slots[k].staged == s->calls) {
        s->slots[k].twice = s->calls;
        return -1;
    }
    if (k < 0)
        k = slot_take(s, key);
    struct hist_slot *h = &s->slots[k];
    h->used = h->staged = s->calls;
    if (h->n_prompt != (uint32_t)n_prompt) { /* a key that means another history now */
        h->n_prompt = (uint32_t)n_prompt;
        h->have = 0;
    }
    if (h->have > n_history) /* tokens past the history (a wasted one's) do not stand */
        h->have = (uint32_t)n_history;
    *have = h->have;
    return k;
}

/* The host's share of sampler_sample()'s checks for row r, in the same order (parameters,
 * NULLs, history length, token ids: of the tokens packed, the others are on the device), and
 * the row's packing into the stage: its whole history, or with a key (not 0) the tokens its
 * history slot lacks. */
static int stage_row(struct cuda_sampler *s, int32_t r, const struct sampling_params *p,
                     uint64_t output_index, const int32_t *prompt, size_t n_prompt,
                     const int32_t *output, size_t n_output, uint64_t key, struct row_desc *desc,
                     int32_t *history, size_t *history_used)
{
    int rc = sampling_params_validate(p);
    if (rc < 0)
        return row_error(rc, r);
    if ((n_prompt > 0 && !prompt) || (n_output > 0 && !output))
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: row %d: NULL history", (int)r);
    if (n_prompt > s->max_history || n_output > s->max_history - n_prompt)
        return pagoda_error_set(PAGODA_ERANGE,
                                "cuda sampler: row %d: history of %zu prompt + %zu output "
                                "tokens exceeds %zu",
                                (int)r, n_prompt, n_output, s->max_history);
    size_t from = 0;
    const int32_t hslot =
        sampling_params_penalised(p) ? row_slot(s, key, n_prompt, n_prompt + n_output, &from) : -1;
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *t = pass == 0 ? prompt : output;
        size_t n = pass == 0 ? n_prompt : n_output, base = pass == 0 ? 0 : n_prompt;
        for (size_t i = from > base ? from - base : 0; i < n; i++)
            if (t[i] < 0 || t[i] >= s->vocab)
                return pagoda_error_set(PAGODA_EINVAL,
                                        "cuda sampler: row %d: %s token %zu is %d, outside "
                                        "[0, %d)",
                                        (int)r, pass == 0 ? "prompt" : "output", i, (int)t[i],
                                        (int)s->vocab);
    }

    memset(desc, 0, sizeof(*desc));
    desc->seed = p->seed;
    desc->output_index = output_index;
    desc->temperature = p->temperature;
    desc->top_p = p->top_p;
    desc->min_p = p->min_p;
    desc->repetition_penalty = p->repetition_penalty;
    desc->presence_penalty = p->presence_penalty;
    desc->frequency_penalty = p->frequency_penalty;
    desc->top_k = p->top_k;
    /* With every penalty off the history stays on the host. */
    desc->penalties = sampling_params_penalised(p);
    desc->hslot = hslot;
    if (desc->penalties) {
        desc->hist_offset = (uint32_t)*history_used;
        desc->n_prompt = (uint32_t)n_prompt;
        desc->n_output = (uint32_t)n_output;
        desc->up_from = (uint32_t)from;
        desc->up_count = (uint32_t)(n_prompt + n_output - from);
        int32_t *dst = history + *history_used;
        if (from < n_prompt)
            memcpy(dst, prompt + from, (n_prompt - from) * sizeof(int32_t));
        const size_t out_from = from > n_prompt ? from - n_prompt : 0;
        if (n_output > out_from)
            memcpy(dst + (n_prompt > from ? n_prompt - from : 0), output + out_from,
                   (n_output - out_from) * sizeof(int32_t));
        *history_used += desc->up_count;
    }
    return 0;
}

/* Queues the call: stages the rows (the host checks), copies them, launches the kernel and the
 * copy of its results into h_results' slot. */
static int enqueue(struct cuda_sampler *s, int slot, const float *logits, int32_t rows,
                   const struct sampling_params *params, const uint64_t *output_index,
                   const int32_t *const *prompt_tokens, const size_t *n_prompt,
                   const int32_t *const *output_tokens, const size_t *n_output,
                   const struct cuda_history_gather *gathers, int32_t num_gathers,
                   const int32_t *d_src, const uint64_t *keys, int32_t *d_tokens,
                   cudaStream_t stream)
{
    /* The stage holds this call's descriptors, its row list, its history gathers, then the
     * histories of its rows with penalties, so that one copy of exactly the bytes used moves
     * them all. The copy from
     * this stage two calls ago has long ended when the caller completes each call before the
     * next but one. */
    const int k = s->next_stage;
    cudaError_t err = cudaEventSynchronize(s->stage_copied[k]);
    if (err != cudaSuccess)
        return cuda_failed(err, "cudaEventSynchronize(stage)");
    struct row_desc *descs = (struct row_desc *)s->h_stage[k];
    int32_t *row_list = (int32_t *)(s->h_stage[k] + stage_desc_bytes(rows));
    int32_t *pairs = (int32_t *)(s->h_stage[k] + stage_list_end(rows));
    int32_t *history = (int32_t *)(s->h_stage[k] + stage_history_at(rows));
    size_t history_used = 0;
    int32_t n_greedy = 0;
    s->calls++;
    slots_mark(s, rows, params, keys);
    for (int32_t r = 0; r < rows; r++) {
        size_t np = n_prompt ? n_prompt[r] : 0, no = n_output ? n_output[r] : 0;
        const int32_t *pt = np > 0 && prompt_tokens ? prompt_tokens[r] : NULL;
        const int32_t *ot = no > 0 && output_tokens ? output_tokens[r] : NULL;
        int rc = stage_row(s, r, &params[r], output_index[r], pt, np, ot, no, keys ? keys[r] : 0,
                           &descs[r], history, &history_used);
        if (rc < 0)
            return rc;
        if (greedy_fast(&descs[r]))
            row_list[n_greedy++] = r;
    }
    int32_t n_listed = n_greedy;
    for (int32_t r = 0; r < rows; r++)
        if (!greedy_fast(&descs[r]))
            row_list[n_listed++] = r;
    /* A history gather names its token in the packed history; a row without penalties has no
     * history there, and a history slot that has the token (appended on the device by the call
     * that sampled it) needs none. */
    int32_t n_pairs = 0;
    for (int32_t i = 0; i < num_gathers; i++) {
        const struct cuda_history_gather *g = &gathers[i];
        if (g->row < 0 || g->row >= rows || g->index < 0 || !n_output ||
            (size_t)g->index >= n_output[g->row])
            return pagoda_error_set(PAGODA_EINVAL,
                                    "cuda sampler: history gather %d (row %d, output token %d) "
                                    "outside the rows' output",
                                    (int)i, (int)g->row, (int)g->index);
        const struct row_desc *d = &descs[g->row];
        const uint32_t at = d->n_prompt + (uint32_t)g->index;
        if (!d->penalties || at < d->up_from)
            continue;
        pairs[2 * n_pairs] = (int32_t)(d->hist_offset + at - d->up_from);
        pairs[2 * n_pairs + 1] = g->src;
        n_pairs++;
    }

    const size_t copy_bytes = stage_history_at(rows) + history_used * sizeof(int32_t);
    const size_t result_bytes = (size_t)rows * sizeof(struct row_result);
    err = cudaMemcpyAsync(s->d_stage, s->h_stage[k], copy_bytes, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess)
        return cuda_failed(err, "cudaMemcpyAsync(stage)");
    if ((err = cudaEventRecord(s->stage_copied[k], stream)) != cudaSuccess)
        return cuda_failed(err, "cudaEventRecord(stage)");
    s->next_stage = 1 - k;
    const int32_t *d_list = (const int32_t *)(s->d_stage + stage_desc_bytes(rows));
    int32_t *d_history = (int32_t *)(s->d_stage + stage_history_at(rows));
    if (n_pairs > 0) {
        int rc = cuda_gather_tokens(d_history, (const int32_t *)(s->d_stage + stage_list_end(rows)),
                                    n_pairs, d_src, stream);
        if (rc != 0)
            return rc;
    }
    if (n_greedy > 0) {
        /* At most 2^16 rows of 2^10 chunks: the grid stays far below its 2^31 - 1 blocks. */
        const unsigned blocks = (unsigned)n_greedy * (unsigned)s->greedy_chunks;
        if (s->vocab % 4 == 0 && ((uintptr_t)logits & 15u) == 0)
            sample_greedy<true><<<blocks, GREEDY_THREADS, 0, stream>>>(
                logits, s->vocab, s->greedy_chunks, d_list, s->d_partials, s->d_arrivals,
                s->d_results, d_tokens);
        else
            sample_greedy<false><<<blocks, GREEDY_THREADS, 0, stream>>>(
                logits, s->vocab, s->greedy_chunks, d_list, s->d_partials, s->d_arrivals,
                s->d_results, d_tokens);
        if ((err = cudaGetLastError()) != cudaSuccess)
            return cuda_failed(err, "sample_greedy<<<>>>");
    }
    if (rows > n_greedy) {
        sample_rows<<<rows - n_greedy, SAMPLER_THREADS, 0, stream>>>(
            logits, s->vocab, (const struct row_desc *)s->d_stage, d_list + n_greedy, d_history,
            s->d_hist, (uint32_t)s->max_history, s->d_logits, s->d_marks, s->d_results, d_tokens);
        if ((err = cudaGetLastError()) != cudaSuccess)
            return cuda_failed(err, "sample_rows<<<>>>");
    }
    /* Queued: each history slot read now holds its whole history and, once the call has run,
     * the token sampled after it (0 for a row that could not be sampled), unless its key was in
     * two rows. */
    for (int32_t r = 0; r < rows; r++)
        if (descs[r].penalties && descs[r].hslot >= 0) {
            struct hist_slot *h = &s->slots[descs[r].hslot];
            const uint32_t n = descs[r].n_prompt + descs[r].n_output;
            h->have = n < s->max_history && h->twice != s->calls ? n + 1 : n;
        }
    err = cudaMemcpyAsync(s->h_results + (size_t)slot * (size_t)s->max_rows, s->d_results,
                          result_bytes, cudaMemcpyDeviceToHost, stream);
    if (err != cudaSuccess)
        return cuda_failed(err, "cudaMemcpyAsync(results)");
    return 0;
}

/* The checks every entry point makes; *done is set when there is nothing to do (0 rows). */
static int check_call(const struct cuda_sampler *s, const float *logits, int32_t rows,
                      const struct sampling_params *params, const uint64_t *output_index,
                      const void *tokens, int *done)
{
    *done = 0;
    if (!s)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: NULL sampler");
    if (rows < 0 || rows > s->max_rows)
        return pagoda_error_set(PAGODA_ERANGE, "cuda sampler: %d rows outside [0, %d]", (int)rows,
                                (int)s->max_rows);
    if (rows == 0) {
        *done = 1;
        return 0;
    }
    if (!logits || !params || !output_index || !tokens)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: NULL argument");
    return 0;
}

extern "C" int
cuda_sampler_enqueue_gathered(struct cuda_sampler *s, int slot, const float *logits, int32_t rows,
                              const struct sampling_params *params, const uint64_t *output_index,
                              const int32_t *const *prompt_tokens, const size_t *n_prompt,
                              const int32_t *const *output_tokens, const size_t *n_output,
                              const struct cuda_history_gather *gathers, int32_t num_gathers,
                              const int32_t *d_src, const uint64_t *history_keys, int32_t *d_tokens,
                              cudaStream_t stream)
{
    int done;
    int rc = check_call(s, logits, rows, params, output_index, logits, &done);
    if (rc != 0 || done)
        return rc;
    if (slot < 0 || slot >= CUDA_SAMPLER_SLOTS)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: slot %d outside [0, %d)", slot,
                                CUDA_SAMPLER_SLOTS);
    if (num_gathers < 0 || num_gathers > rows || (num_gathers > 0 && (!gathers || !d_src)))
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda sampler: %d history gathers for %d rows (gathers %s, "
                                "source %s)",
                                (int)num_gathers, (int)rows, gathers ? "given" : "NULL",
                                d_src ? "given" : "NULL");
    return enqueue(s, slot, logits, rows, params, output_index, prompt_tokens, n_prompt,
                   output_tokens, n_output, gathers, num_gathers, d_src, history_keys, d_tokens,
                   stream);
}

extern "C" int cuda_sampler_enqueue(struct cuda_sampler *s, int slot, const float *logits,
                                    int32_t rows, const struct sampling_params *params,
                                    const uint64_t *output_index,
                                    const int32_t *const *prompt_tokens, const size_t *n_prompt,
                                    const int32_t *const *output_tokens, const size_t *n_output,
                                    int32_t *d_tokens, cudaStream_t stream)
{
    return cuda_sampler_enqueue_gathered(s, slot, logits, rows, params, output_index, prompt_tokens,
                                         n_prompt, output_tokens, n_output, NULL, 0, NULL, NULL,
                                         d_tokens, stream);
}

extern "C" int cuda_sampler_result(const struct cuda_sampler *s, int slot, int32_t r,
                                   int32_t *token, float *logprob)
{
    if (!s || slot < 0 || slot > CUDA_SAMPLER_SLOTS || r < 0 || r >= s->max_rows)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: result of slot %d row %d", slot,
                                (int)r);
    const struct row_result *res = &s->h_results[(size_t)slot * (size_t)s->max_rows + (size_t)r];
    switch (res->status) {
    case ROW_OK:
        *token = res->token;
        if (logprob)
            *logprob = res->logprob;
        return 0;
    case ROW_BAD_LOGIT:
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: row %d: logit %d is %g", (int)r,
                                (int)res->detail, (double)res->value);
    case ROW_OVERFLOW:
        return pagoda_error_set(PAGODA_ERANGE,
                                "cuda sampler: row %d: penalties make token %d's logit overflow",
                                (int)r, (int)res->detail);
    case ROW_ALL_MASKED:
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: row %d: every logit is -inf", (int)r);
    default:
        return pagoda_error_set(PAGODA_EINTERNAL, "cuda sampler: row %d: status %d", (int)r,
                                (int)res->status);
    }
}

/* The call in stage k (rows rows) did not give its results (a row failed, so the call failed):
 * its slots' appended tokens are not the caller's, who samples again (the worker: on the host)
 * and may keep other tokens. They no longer stand. */
static void slots_unappend(struct cuda_sampler *s, int k, int32_t rows)
{
    const struct row_desc *descs = (const struct row_desc *)s->h_stage[k];
    for (int32_t r = 0; r < rows; r++)
        if (descs[r].penalties && descs[r].hslot >= 0) {
            struct hist_slot *h = &s->slots[descs[r].hslot];
            const uint32_t n = descs[r].n_prompt + descs[r].n_output;
            if (h->have > n)
                h->have = n;
        }
}

extern "C" int cuda_sampler_sample_keyed(
    struct cuda_sampler *s, const float *logits, int32_t rows, const struct sampling_params *params,
    const uint64_t *output_index, const int32_t *const *prompt_tokens, const size_t *n_prompt,
    const int32_t *const *output_tokens, const size_t *n_output, const uint64_t *history_keys,
    int32_t *tokens, float *logprobs, cudaStream_t stream)
{
    int done;
    int rc = check_call(s, logits, rows, params, output_index, tokens, &done);
    if (rc != 0 || done)
        return rc;
    rc = enqueue(s, CUDA_SAMPLER_SLOTS, logits, rows, params, output_index, prompt_tokens, n_prompt,
                 output_tokens, n_output, NULL, 0, NULL, history_keys, NULL, stream);
    if (rc != 0)
        return rc;
    const int k = 1 - s->next_stage; /* the stage this call used */
    cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess)
        return cuda_failed(err, "cudaStreamSynchronize");
    /* The first failing row fails the call, before anything is written. */
    int32_t token;
    for (int32_t r = 0; r < rows; r++)
        if ((rc = cuda_sampler_result(s, CUDA_SAMPLER_SLOTS, r, &token, NULL)) != 0) {
            if (history_keys)
                slots_unappend(s, k, rows);
            return rc;
        }
    for (int32_t r = 0; r < rows; r++)
        cuda_sampler_result(s, CUDA_SAMPLER_SLOTS, r, &tokens[r], logprobs ? &logprobs[r] : NULL);
    return 0;
}

extern "C" int cuda_sampler_sample(struct cuda_sampler *s, const float *logits, int32_t rows,
                                   const struct sampling_params *params,
                                   const uint64_t *output_index,
                                   const int32_t *const *prompt_tokens, const size_t *n_prompt,
                                   const int32_t *const *output_tokens, const size_t *n_output,
                                   int32_t *tokens, float *logprobs, cudaStream_t stream)
{
    return cuda_sampler_sample_keyed(s, logits, rows, params, output_index, prompt_tokens, n_prompt,
                                     output_tokens, n_output, NULL, tokens, logprobs, stream);
}

/* dst[pairs[2i]] = src[pairs[2i + 1]]. */
__global__ void gather_tokens(int32_t *dst, const int32_t *pairs, int32_t n, const int32_t *src)
{
    int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[pairs[2 * i]] = src[pairs[2 * i + 1]];
}

extern "C" int cuda_gather_tokens(int32_t *d_dst, const int32_t *d_pairs, int32_t n,
                                  const int32_t *d_src, cudaStream_t stream)
{
    if (n <= 0)
        return 0;
    const int threads = 256;
    gather_tokens<<<(n + threads - 1) / threads, threads, 0, stream>>>(d_dst, d_pairs, n, d_src);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? 0 : cuda_failed(err, "gather_tokens<<<>>>");
}
