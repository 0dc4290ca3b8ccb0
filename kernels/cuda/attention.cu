/* Paged attention on the GPU: the plan (host validation, decode/prefill split, split-KV
 * partition, one asynchronous metadata copy) and the run (a decode kernel, a merge kernel for
 * split decode contexts, a prefill kernel), all reading K/V in place through the block table.
 *
 * Both kernels run on the tensor cores (mma.sync m16n8k16, bf16 operands, f32 accumulators) and
 * keep, per query row, a running max m, a running sum l of exp(score - m) and an f32
 * accumulator of the exp-weighted V (online softmax, as the CPU's paged version does). K/V tiles
 * of 64 keys (128 for decode CTAs of 8 warps) come from the pool through the block table into
 * XOR-swizzled shared memory by a cp.async pipeline (16-byte copies; the block-table entries a copy
 * needs are already at hand: in registers for decode, copied into shared memory a tile ahead for
 * prefill) and reach the tensor cores by ldmatrix; keys beyond a row's causal limit (or beyond the
 * context) get probability 0, and tiles past the last one a CTA needs are never read. */
#include "kernels/cuda/attention.h"

#include "kernels/attention_batch.h"
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

namespace
{

/* Decode: one CTA of kDecodeWarps (4) warps, or of kDecodeWideWarps (8; tiles of twice the
 * keys, cuda_attention_set_decode_warps), per (decode partition, KV head, chunk of at most
 * kDecodeHeadsMax query heads of that KV head), so that each K/V byte is read once for all the
 * query heads that use it. */
constexpr int kDecodeWarps = 4;
constexpr int kDecodeWideWarps = 8;
constexpr int kDecodeHeadsMax = 8;

/* Prefill: one CTA of 128 threads (4 warps of 32 rows) per (tile of query rows, KV head); a row
 * is one (query token, query head of the KV head), 128 rows per tile. */
constexpr int kPrefillThreads = 128;
constexpr int kPrefillWarpRows = 32;
constexpr int kPrefillRows = 128;
constexpr int kPrefillKeys = 64; /* keys per shared-memory tile */

/* Query heads per KV head the kernels accept (one prefill tile must hold a token's heads; the
 * decode kernel's chunks of kDecodeHeadsMax cover them). */
constexpr int kGroupMax = 64;

/* Split-KV: decode contexts are cut into partitions of at least kSplitMinTokens keys, multiples
 * of kSplitAlign (the tile of CTAs of 4 warps; of 128 keys, their tile, for CTAs of 8), sized for 1
 * .. kSplitWavesMax waves of the resident decode CTAs, or not cut: whichever split_cost models
 * fastest. Its costs are in keys streamed by one CTA: kSplitStartupKeys for each wave (a CTA's
 * dependent loads before its first tile: partition record, block table, K/V), and for a split
 * kSplitMergeKeys (partial results out, the counter, the last CTA's reads) plus kSplitMergePartKeys
 * per partition the widest merge reads. The minimum is one decode tile: it was 256 until
 * 2026-12-02, when one sequence of 1100 keys on the Llama-3-8B shape ran 40 CTAs on the H200's 132
 * SMs (5 partitions of 8 KV heads), 12.1 us a layer; with 64 it runs 144 CTAs (18 partitions), 10.0
 * (bench/RESULTS.md). Splits forced finer than the model's (cuda_attention_set_decode_split) were
 * slower at 8, 16 and 32 sequences of 1100 keys: 16 took 28.6 us a layer split in two (the
 * model's), 33.8-44.8 in 3 to 9 (bench/RESULTS.md, eighteenth session). */
constexpr int kSplitWavesMax = 4;
constexpr int kSplitStartupKeys = 128;
constexpr int kSplitMinTokens = 64;
constexpr int kSplitAlign = 64;
constexpr int kSplitMergeKeys = 64;
constexpr int kSplitMergePartKeys = 2;
/* Partitions whose partial results the merge loads at once: 32, so that the 32 partitions of
 * one 32k-token sequence at batch 1 come through L2 in one round trip (ncu on the H200: the
 * merge took ~3.4 of 42 us with 8 at a time, ~2.9 with 32; bench/RESULTS.md). The decode
 * kernel's registers rise without costing occupancy, which shared memory limits to 2 and 3 CTAs
 * per SM (174-181 registers at head dim 128, 140 at 64, thirty-sixth session; the dense variant,
 * bound to 3 CTAs at head dim 128 by its registers, 168 with a few spilled). */
constexpr int kMergeBatch = 32;

/* Everything a kernel needs, passed by value. Metadata pointers point into the plan's device
 * buffer. */
struct attn_args {
    const void *k, *v; /* the pool's layer: bf16, or F8E4M3 for the kernels' F8 variants */
    int64_t block_stride, head_stride, slot_stride;
    int32_t block_size;
    int32_t block_shift; /* log2(block_size) when it is a power of two, else -1 */
    int32_t num_heads, num_kv_heads, group;
    float scale;
    const uint16_t *q;
    int64_t q_row_stride;
    uint16_t *out;
    const int32_t *query_start, *context_len, *block_tables;
    int32_t table_stride;
    const int4 *dparts;    /* decode partitions: sequence, first key (complemented in the one
                              that holds the newest key), end key, merge index or -1 */
    const int4 *merges;    /* split sequences: sequence, first partition, partitions, unused */
    const int4 *pitems;    /* prefill tiles: sequence, first query token (within the sequence),
                              keys needed, unused; the most keys first */
    int32_t decode_chunks; /* CTAs sharing the query heads of one KV head in decode */
    int32_t tile_tokens;   /* query tokens per prefill tile: kPrefillRows / group */
    float *part_out;       /* [partition][num_heads][head_dim], normalised */
    float *part_lse;       /* [partition][num_heads] */
    int32_t *merge_count;  /* [merge][decode chunk][KV head]: partitions done, 0 between runs */
    /* A graph plan's (cuda_attention_plan_graph) device words: the decode CTAs that have work,
     * then the table stride; NULL for a plan of the step alone (the grid is exact). */
    const int32_t *graph_hdr;
    /* 1: the decode kernel requests the tiles of keys before each sequence's newest before it
     * waits for the kernel ahead (cuda_attention_set_early_kv). */
    int32_t early_kv;
    /* 1: the decode kernel signals its dependents only at its end (kernels/cuda/util.h's late
     * trigger, cuda_set_pdl_late); 0: right after its wait. */
    int32_t late;
    /* cuda_attention_run_rope: q (and the step's K and V after it in each row) as the QKV
     * linear left them, RoPE applied here (rope 1) at rope_pos[token] with rope_inv_freq; the
     * CTAs that hold a sequence's newest key write its K (rotated) and V to slot
     * rope_slots[token] of the pool first (none where the slot is not a valid one: padding). */
    int32_t rope;
    int32_t num_blocks;
    const int32_t *rope_pos;
    const float *rope_inv_freq;
    const int64_t *rope_slots;
};

/* The block of key pos and its slot in it: shifts when the block size is a power of two. */
__device__ __forceinline__ int32_t block_of(const attn_args &a, int32_t pos)
{
    return a.block_shift >= 0 ? pos >> a.block_shift : pos / a.block_size;
}

__device__ __forceinline__ int32_t slot_of(const attn_args &a, int32_t pos)
{
    return a.block_shift >= 0 ? pos & (a.block_size - 1) : pos % a.block_size;
}

/* ---- decode ---- */

/* cp.async of 16 bytes into shared memory, bypassing L1; with valid false nothing is read and
 * the 16 bytes are zero-filled (src must still be a valid address). */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid)
{
    const uint32_t d = (uint32_t)__cvta_generic_to_shared(dst);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

/* The same with a shared-memory address. */
__device__ __forceinline__ void cp_async16_s(uint32_t d, const void *src, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::: "memory");
}

/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N> __device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* 2^x by the MUFU unit (ex2.approx, subnormal results flushed to zero: they are far below what
 * a bf16 output or an f32 sum of at least one 1 can hold); 2^-inf = 0. */
__device__ __forceinline__ float fast_exp2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

/* Two f32 to a bf16 pair (lo at the lower address). */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    return float2_to_bf16x2(lo, hi);
}

/* Two f32 in [0, 1] (probabilities) to an f16 pair (lo at the lower address). */
__device__ __forceinline__ uint32_t pack_f16(float lo, float hi)
{
    const __half2 h = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* The tensor-core product of the kernels' K/V element type: bf16 for a bf16 pool; f16 for an
 * F8E4M3 one, whose codes convert to f16 exactly (and Q, clamped to f16's range, and P with
 * them). */
template <bool F8>
__device__ __forceinline__ void mma_kv(float d[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                       uint32_t a3, uint32_t b0, uint32_t b1)
{
    if (F8)
        mma_f16(d, a0, a1, a2, a3, b0, b1);
    else
        mma_bf16(d, a0, a1, a2, a3, b0, b1);
}

template <bool F8> __device__ __forceinline__ uint32_t pack_p(float lo, float hi)
{
    return F8 ? pack_f16(lo, hi) : pack_bf16(lo, hi);
}

/* The element offset of 16-byte chunk c of row r in a shared-memory tile of rows of HD bf16:
 * chunks are XOR-swizzled by r % 8, so that the 8 rows an ldmatrix reads at one logical column
 * fall in 8 different bank groups. */
template <int HD> __device__ __forceinline__ int swz(int r, int c)
{
    return r * HD + ((c ^ (r & 7)) << 3);
}

/* Rows (consecutive keys of one block) one bulk copy of the decode kernel moves: 4 (1 KiB at head
 * dim 128) for a step of fewer than kDecodeWideCopySeqs decode sequences, else 16 (4 KiB; 8 when
 * the block size is not a multiple of 16). On the H200 (bench/RESULTS.md, 2026-12-03) copies of
 * 16 rows made the attention of 256 sequences at 512 keys 8% faster (3.62 -> 3.92 TB/s) and the
 * decode step of 256 at context 640 4% faster (96: 0.8%, 128: 1.5%), but one sequence of 1100
 * keys 9% slower (each of its CTAs streams one tile, which more, smaller copies bring in sooner)
 * and 32 sequences' step 1.2% slower; at 64 they tie. */
constexpr int32_t kDecodeWideCopySeqs = 64;

/* The decode kernel's geometry for head dimension HD, copies of G rows and W warps: tiles of
 * 16 W keys (64, or 128 with 8 warps: warps 4 .. 7 lay out the second 64 as 0 .. 3 the first). In
 * shared memory the K (and V) rows of a tile are groups of G consecutive keys, each group followed
 * by 16 bytes of padding, so that one bulk copy moves a group (G consecutive slots of a block
 * are contiguous in the pool) and, for G = 4 and 8, the 8 rows an ldmatrix reads, one from each
 * of 8 groups, fall in 8 different bank groups. Warp w's n-tile nt (8 keys) holds, in column j,
 * key key(j, w, nt) of the tile. The pipeline is 3 stages deep at head dim 128 (97.5 KiB; 195
 * with 8 warps) and 4 at 64 (66 KiB; 130). With G = 16 the 8 rows an ldmatrix reads lie two in each
 * of 4 groups: two-way bank conflicts, which the larger copies more than pay for where they are
 * used.
 *
 * (A producer warp issuing the copies, consumers giving stages back on `empty` mbarriers, was
 * main from 7c8d6a5 to the fifteenth session: 3% faster at 8 to 64 sequences, but a model's
 * greedy outputs then differed between runs of one seed (tests/gpu/run's random_load, 0 of 3
 * reruns equal; test_cuda_steps 2 failures) where this kernel repeats itself: it was taken
 * out. The race, found later in its compiled code: its q loads (__ldg) ran ahead of the PDL
 * wait; q is now read with __ldcg below. tests/gpu/RESULTS.md, fifteenth session.)
 * (3 CTAs an SM, __launch_bounds__(128, 3) with 2 stages at head dim 128, was measured in the
 * eighteenth session: slower from 8 sequences up, 21% at 32; bench/RESULTS.md.) */
/* F8 (an F8E4M3 pool): elements of one byte, so a stage holds half the bytes and the pipeline is
 * twice as deep (6 stages at head dim 128: 99 KiB a CTA of 4 warps, two an SM as for bf16; 8 at
 * 64). The warps read the codes from the stage by ldmatrix as b16 pairs and convert them in
 * registers (decode_kernel), with no copy of the tile in f16. */
/* DENSE (F8 at head dim 128, 4 warps; decode_variant): 4 stages (66 KiB) and at most 168
 * registers (__launch_bounds__ of 3 CTAs; ptxas spills 48 bytes), so that three CTAs share an SM
 * where two did. An F8 CTA is bound by its warps' latency, not by the bytes in flight (the
 * thirty-sixth session's ncu: issue slots 26% busy, DRAM 69%, 7 cycles between a warp's
 * instructions), and a third CTA streams while the others start or merge. */
template <int HD, int G_, int W_, bool F8_ = false, bool DENSE_ = false> struct decode_geom {
    static constexpr bool F8 = F8_;
    static constexpr bool DENSE = DENSE_;
    static_assert(!DENSE || (F8 && HD == 128 && W_ == 4), "dense: F8, head dim 128, 4 warps");
    static constexpr int EB = F8 ? 1 : 2; /* bytes per pool element */
    static constexpr int W = W_;          /* warps */
    static constexpr int THREADS = 32 * W;
    static constexpr int T = 16 * W;
    static constexpr int G = G_;
    static_assert(W == kDecodeWarps || W == kDecodeWideWarps, "decode warps");
    static_assert(G == 4 || G == 8 || G == 16, "decode copy rows");
    static constexpr int STAGES = F8 ? (HD == 128 ? (DENSE ? 4 : 6) : 8) : (HD == 128 ? 3 : 4);
    static constexpr int GROUP = G * HD + 16 / EB; /* elements per group of rows, 16 bytes of
                                                      padding included */
    static constexpr int STAGE_ELEMS = 2 * (T / G) * GROUP;
    static constexpr size_t bars = (size_t)STAGES * STAGE_ELEMS * EB;
    static constexpr size_t smem = bars + STAGES * sizeof(uint64_t);
    static_assert(T == 16 * W && kSplitAlign == 16 * kDecodeWarps,
                  "tile shape: partitions of whole tiles");
    static_assert(2 * T == THREADS, "one row copy per thread and tile");
    /* The element offset of key row r (0 .. T - 1) in a K or V tile. */
    static __device__ __forceinline__ int row(int r)
    {
        return (r / G) * GROUP + (r % G) * HD;
    }
    /* The key of column j (0 .. 7) of warp w's n-tile nt (0, 1): 8 columns in 8 groups; warps
     * 4 .. 7 of a wide CTA take the second 64 keys of its tile as warps 0 .. 3 take the first. */
    static __device__ __forceinline__ int key(int j, int w, int nt)
    {
        const int u = W > 4 ? w & 3 : w, half = W > 4 ? 64 * (w >> 2) : 0;
        return (G == 4 ? 4 * (nt * 8 + j) + u : 8 * j + 2 * u + nt) + half;
    }
};

/* The merge of a split decode sequence, done by the last of its partitions' CTAs to finish
 * (per KV head and chunk of query heads): a counter per (merge, chunk, KV head) counts the CTAs
 * whose partial results are out (written, then fenced); the last one reads them all (through
 * L2) and writes out each head's output, every partition's normalised output weighted by its
 * share of the exp mass, exp(lse_p - max lse). It also sets the counter back to 0 for the next
 * run. */
template <int HD, int THREADS>
__device__ __forceinline__ void merge_if_last(const attn_args &a, int32_t merge, int32_t chunk,
                                              int32_t kh, int32_t h0, int32_t gc, int32_t token)
{
    __shared__ int last;
    const int tid = threadIdx.x;
    const int4 m = a.merges[merge];
    __threadfence();
    __syncthreads();
    if (tid == 0) {
        int32_t *count =
            a.merge_count + ((int64_t)merge * a.decode_chunks + chunk) * a.num_kv_heads + kh;
        last = atomicAdd(count, 1) == m.z - 1;
        if (last)
            *count = 0;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    /* One pass per (head, float4 column), partitions kMergeBatch at a time so that their loads
     * are in flight together: an online merge of the partitions' exp masses. */
    constexpr int Q = HD / 4; /* float4 columns of a head */
    constexpr int B = kMergeBatch;
    for (int idx = tid; idx < gc * Q; idx += THREADS) {
        const int g = idx / Q, col = idx % Q;
        const int32_t h = h0 + g;
        float mx = -INFINITY, total = 0.0f;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int p0 = 0; p0 < m.z; p0 += B) {
            float lse[B];
            float4 o[B];
#pragma unroll
            for (int j = 0; j < B; j++) {
                const int64_t row = (int64_t)(m.y + min(p0 + j, m.z - 1)) * a.num_heads + h;
                lse[j] = p0 + j < m.z ? __ldcg(a.part_lse + row) : -INFINITY;
                o[j] = __ldcg(reinterpret_cast<const float4 *>(a.part_out + row * HD) + col);
            }
            float bmx = mx;
#pragma unroll
            for (int j = 0; j < B; j++)
                bmx = fmaxf(bmx, lse[j]);
            const float sc = expf(mx - bmx); /* every partition has a finite lse */
            total *= sc;
            acc.x *= sc;
            acc.y *= sc;
            acc.z *= sc;
            acc.w *= sc;
#pragma unroll
            for (int j = 0; j < B; j++) {
                const float wt = expf(lse[j] - bmx);
                total += wt;
                acc.x = fmaf(wt, o[j].x, acc.x);
                acc.y = fmaf(wt, o[j].y, acc.y);
                acc.z = fmaf(wt, o[j].z, acc.z);
                acc.w = fmaf(wt, o[j].w, acc.w);
            }
            mx = bmx;
        }
        uint16_t *out = a.out + (int64_t)token * a.num_heads * HD + (int64_t)h * HD;
        reinterpret_cast<uint2 *>(out)[col] =
            make_uint2(float2_to_bf16x2(acc.x / total, acc.y / total),
                       float2_to_bf16x2(acc.z / total, acc.w / total));
    }
}

/* cuda_attention_run_rope: the step's K and V of KV head kh for one token, which the CTAs holding
 * a sequence's newest key write into its slot of the pool (cuda_rope_cache's writes for that
 * head, the same bits). Loaded into registers right after the wait (thread t: K elements t and
 * t + HD / 2 when t < HD / 2, V element t), stored (K rotated with rope_cs: [HD / 2] cos, then
 * sin) only before the copy of the newest key's tile is issued, behind a proxy fence and a
 * barrier of the CTA, so that the loads' latency stays off the CTA's path to its first tiles.
 * Several CTAs (the decode chunks of one KV head) may write the same values. */
struct newest_kv {
    int64_t base; /* the slot's element offset in the pool, kh's head included; -1: none */
    uint16_t k0, k1, v;
};

template <int HD>
__device__ __forceinline__ newest_kv newest_kv_at(const attn_args &a, int32_t token, int32_t kh)
{
    newest_kv n = {-1, 0, 0, 0};
    /* the slot is metadata: readable before the wait */
    n.base = kv_slot_base(a.rope_slots[token], a.block_size, a.num_blocks, a.block_stride,
                          a.slot_stride);
    if (n.base >= 0)
        n.base += (int64_t)kh * a.head_stride;
    return n;
}

template <int HD>
__device__ __forceinline__ void newest_kv_load(const attn_args &a, int32_t token, int32_t kh,
                                               newest_kv &n)
{
    static_assert(kDecodeWarps * 32 >= HD, "a V element a thread");
    if (n.base < 0)
        return;
    const uint16_t *row = a.q + (int64_t)token * a.q_row_stride;
    const uint16_t *ks = row + (int64_t)(a.num_heads + kh) * HD;
    const uint16_t *vs = row + (int64_t)(a.num_heads + a.num_kv_heads + kh) * HD;
    const int t = threadIdx.x;
    if (t < HD / 2) {
        n.k0 = __ldcg(ks + t);
        n.k1 = __ldcg(ks + t + HD / 2);
    }
    if (t < HD)
        n.v = __ldcg(vs + t);
}

template <int HD, bool F8>
__device__ __forceinline__ void newest_kv_store(const attn_args &a, const newest_kv &n,
                                                const float *rope_cs)
{
    if (n.base < 0)
        return;
    const int t = threadIdx.x;
    void *kd = const_cast<void *>(a.k), *vd = const_cast<void *>(a.v);
    if (t < HD / 2) {
        uint16_t rx, ry;
        rope_pair(bf16_bits_to_float(n.k0), bf16_bits_to_float(n.k1), rope_cs[t],
                  rope_cs[HD / 2 + t], rx, ry);
        kv_cache_store(kd, n.base + t, rx, F8);
        kv_cache_store(kd, n.base + t + HD / 2, ry, F8);
    }
    if (t < HD)
        kv_cache_store(vd, n.base + t, n.v, F8);
    asm volatile("fence.proxy.async.global;\n" ::: "memory");
}

/* Split-KV decode (flash decoding) on the tensor cores: the CTA walks its partition's keys
 * [begin, end) (part.y, or ~part.y where negative; part.z) tile by tile through a pipeline of bulk
 * copies (thread t copies the K or V row of key t % T, its block-table entry fetched one tile
 * ahead; keys past the partition repeat its last key, which the mask then drops). Each warp takes
 * 16 keys of every tile: S = Q K^T with the CTA's query heads as the rows of one m16n8k16 A operand
 * (rows gc .. 15 zero), an online softmax per head in f32, then O += P V with P (bf16) as the next
 * A operand. The warps merge through shared memory at the end. A partition that is the whole
 * context writes bf16 out, otherwise the normalised f32 output and its log-sum-exp for the merge
 * kernel. */
template <int HD, int G_, int W_, bool F8, bool DENSE = false>
__global__ void __launch_bounds__(32 * W_, DENSE ? 3 : 0) decode_kernel(attn_args a)
{
    using D = decode_geom<HD, G_, W_, F8, DENSE>;
    using E = typename std::conditional<F8, uint8_t, uint16_t>::type; /* a pool element */
    constexpr int T = D::T, S = D::STAGES, W = D::W, THREADS = D::THREADS, EB = D::EB;
    extern __shared__ __align__(16) unsigned char smem[];
    E *tiles = reinterpret_cast<E *>(smem); /* [stage][K, V][T / G][GROUP] */
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + D::bars);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* Launched by launch_pdl. Without early_kv everything below waits for the kernels ahead.
     * With it, the metadata (copied before the step's first kernel) and the K/V of keys before
     * each sequence's newest (written by earlier steps: the kernel ahead, RoPE with the cache
     * write, writes only the step's own keys) are read first: the tiles of the first stages
     * that hold no newest key are requested, then the kernel waits. While this kernel is not
     * past its wait only the kernel just ahead of it can still run (every kernel ahead waits
     * for its own before it lets the next start), so that is the contract
     * cuda_attention_set_early_kv states. */
    if (!a.early_kv) {
        pdl_wait();
        pdl_trigger_early(a.late);
    }
    /* One linear grid, the KV head fastest: the CTAs running together read every head's part
     * of the same pool blocks, spreading over the memory channels (in-order block tables). */
    const int32_t kh = (int32_t)(blockIdx.x % (uint32_t)a.num_kv_heads);
    const int32_t rest = (int32_t)(blockIdx.x / (uint32_t)a.num_kv_heads);
    const int32_t pidx = rest / a.decode_chunks;
    /* The partition record is requested with the graph header, not after it: a CTA's chain of
     * dependent loads before its first copy is the header and record, then the block table (at
     * 256 sequences a CTA entering mid-kernel took 5.6 us to its first copy with the chain of
     * record, context length and three table entries one after another; bench/RESULTS.md,
     * twentieth session). A graph grid's CTA past the step's end reads a record inside the
     * plan's buffer and uses none of it. */
    const int4 part = __ldg(a.dparts + pidx);
    int32_t table_stride = a.table_stride;
    if (a.graph_hdr != nullptr) { /* a grid fixed for a CUDA graph: CTAs past the step's end */
        if (blockIdx.x >= (uint32_t)a.graph_hdr[0])
            return;
        table_stride = a.graph_hdr[1];
    }
    const int32_t heads = (a.group + a.decode_chunks - 1) / a.decode_chunks;
    const int32_t g0 = (rest % a.decode_chunks) * heads;
    const int32_t gc = min(heads, a.group - g0); /* query heads of this CTA, at most 8 */
    if (gc <= 0)
        return;
    /* The record's begin is stored complemented (negative) in the partition that holds the
     * sequence's newest key, the one that ends at its context length. */
    const bool holds_newest = part.y < 0;
    const int32_t seq = part.x, begin = holds_newest ? ~part.y : part.y, end = part.z;
    const int32_t token = a.query_start[seq];
    const int32_t *table = a.block_tables + (int64_t)seq * table_stride;
    const int32_t h0 = kh * a.group + g0;
    const int32_t ntiles = (end - begin + T - 1) / T;
    /* a.rope: the cos, then the sin, of the token's angles (its position is metadata, copied
     * before the step's first kernel: read before the wait). */
    __shared__ float rope_cs[HD];
    if (a.rope) {
        const float pos = (float)__ldg(a.rope_pos + token);
        for (int i = tid; i < HD / 2; i += THREADS) {
            rope_cos_sin(pos, __ldg(a.rope_inv_freq + i), rope_cs[i], rope_cs[HD / 2 + i]);
        }
    }
    if (tid == 0) {
        for (int st = 0; st < S; st++)
            mbar_init(&full[st], 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    /* Copies: with groups (the block size a multiple of G and rows contiguous), thread
     * t < 2 * T / G copies group t % (T / G) of K (t < T / G) or V, row by row where the group
     * runs past the partition; otherwise thread t copies the K (t < T) or V row of key t % T.
     * Keys past the partition repeat its last key, which the mask then drops. */
    constexpr int G = D::G, NG = T / G;
    const bool groups = a.block_size % G == 0 && a.slot_stride == HD;
    const int ckey = groups ? G * (tid % NG) : tid % T, cv = groups ? (tid / NG) & 1 : tid / T;
    const bool copier = !groups || tid < 2 * NG;
    const E *cbase = static_cast<const E *>(cv ? a.v : a.k) + (int64_t)kh * a.head_stride;
    /* The block-table entry of this thread's first key in tile t (0 past the last tile). */
    auto table_entry = [&](int32_t t) -> int32_t {
        const int32_t pos = min(begin + t * T + ckey, end - 1);
        return t < ntiles && copier ? __ldg(table + block_of(a, pos)) : 0;
    };
    /* The entries of the first S tiles, requested together. */
    int32_t first_blk[S];
#pragma unroll
    for (int t = 0; t < S; t++)
        first_blk[t] = table_entry(t);
    int32_t blk = first_blk[S - 1]; /* the entry for the next tile the loop copies */
    auto copy_tile = [&](int32_t t, int32_t blk) {
        const int st = t % S;
        if (tid == 0)
            mbar_arrive_expect_tx(&full[st], 2 * T * HD * EB);
        if (!copier)
            return;
        E *dst = tiles + (size_t)st * D::STAGE_ELEMS + cv * NG * D::GROUP + D::row(ckey);
        const int32_t pos = begin + t * T + ckey;
        const E *blk_base = cbase + (int64_t)blk * a.block_stride;
        if (groups && pos + G - 1 < end) {
            bulk_copy(dst, blk_base + (int64_t)slot_of(a, pos) * HD, G * HD * EB, &full[st]);
        } else {
            const int rows = groups ? G : 1;
            for (int r = 0; r < rows; r++) {
                const int32_t p = min(pos + r, end - 1); /* in pos's block (groups) */
                bulk_copy(dst + r * HD, blk_base + (int64_t)slot_of(a, p) * a.slot_stride, HD * EB,
                          &full[st]);
            }
        }
    };

    int32_t early = 0; /* tiles requested before the wait: none holds the newest key */
    if (a.early_kv) {
        const int32_t newest = holds_newest ? end - 1 : INT32_MAX;
#pragma unroll
        for (int t = 0; t < S - 1; t++)
            if (early == t && t < ntiles && min(begin + (t + 1) * T, end) <= newest) {
                copy_tile(t, first_blk[t]);
                early = t + 1;
            }
        pdl_wait();
        pdl_trigger_early(a.late);
    }
    /* a.rope: the newest key's K and V are this kernel's to write before the copy of the last
     * tile reads them (tiles requested early hold none of them): loaded now, stored before
     * that copy is issued (newest_kv). */
    const bool write_newest = a.rope && holds_newest;
    newest_kv nkv = {-1, 0, 0, 0};
    if (write_newest) {
        nkv = newest_kv_at<HD>(a, token, kh);
        newest_kv_load<HD>(a, token, kh, nkv);
    }
#pragma unroll
    for (int t = 0; t < S - 1; t++)
        if (t >= early && t < ntiles && !(write_newest && t == ntiles - 1))
            copy_tile(t, first_blk[t]);

    /* Q as A fragments: row lane / 4 is query head g0 + lane / 4 (zero beyond gc). q is the
     * kernel ahead's output: coherent loads (__ldcg), never the non-coherent __ldg, which
     * promises data read-only for the kernel's lifetime and which the compiler may therefore
     * hoist above griddepcontrol.wait (it did in 7c8d6a5's kernel: q read while RoPE rotated
     * it; the fifteenth session's review, bench/RESULTS.md). */
    const int qr = lane >> 2, qc = 2 * (lane & 3);
    /* The dims of qa[k][j]'s pair: k * 16 + j * 8 + qc, the A fragment's own; for F8, k * 16 +
     * 2 * qc + 2 * j, the order in which the K codes reach each lane (the k index of the product
     * permuted within each 16 dims, alike in Q and K: the same sum). */
    auto qdim = [&](int k, int j) { return k * 16 + (F8 ? 2 * qc + 2 * j : j * 8 + qc); };
    uint32_t qa[HD / 16][2];
    {
        const uint16_t *qrow = a.q + (int64_t)token * a.q_row_stride + (int64_t)(h0 + qr) * HD;
#pragma unroll
        for (int k = 0; k < HD / 16; k++)
#pragma unroll
            for (int j = 0; j < 2; j++)
                qa[k][j] =
                    qr < gc ? __ldcg(reinterpret_cast<const uint32_t *>(qrow + qdim(k, j))) : 0;
    }
    /* a.rope: element i's partner i + HD / 2 sits in the same lane, in qa[k + HD / 32]. */
    if (a.rope) {
#pragma unroll
        for (int k = 0; k < HD / 32; k++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int i = qdim(k, j);
                const float2 x = bf16x2_to_float2(qa[k][j]),
                             y = bf16x2_to_float2(qa[k + HD / 32][j]);
                uint16_t x0, y0, x1, y1;
                rope_pair(x.x, y.x, rope_cs[i], rope_cs[HD / 2 + i], x0, y0);
                rope_pair(x.y, y.y, rope_cs[i + 1], rope_cs[HD / 2 + i + 1], x1, y1);
                qa[k][j] = (uint32_t)x0 | ((uint32_t)x1 << 16);
                qa[k + HD / 32][j] = (uint32_t)y0 | ((uint32_t)y1 << 16);
            }
    }
    if (F8) /* the A fragments in f16, for the f16 products (mma_kv) */
#pragma unroll
        for (int k = 0; k < HD / 16; k++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const float2 x = bf16x2_to_float2(qa[k][j]);
                qa[k][j] = float2_to_f16x2_sat(x.x, x.y);
            }
    /* The newest key's tile among the first S - 1: its K/V stored, then its copy. */
    if (write_newest && ntiles - 1 < S - 1) {
        newest_kv_store<HD, F8>(a, nkv, rope_cs);
        __syncthreads();
        /* its table entry loaded again: first_blk indexed at run time would go to local memory
         * in every CTA of every decode kernel */
        copy_tile(ntiles - 1, table_entry(ntiles - 1));
    }
    const float qscale = a.scale * 1.4426950408889634f; /* scores in log2 units */
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m = -INFINITY, l = 0.0f; /* of row qr, l over this lane's keys only */
    /* The warp's keys: n-tile nt, column j is key D::key(j, warp, nt) of the tile. */

    for (int32_t i = 0; i < ntiles; i++) {
        if (write_newest && i + S - 1 == ntiles - 1) /* the barrier below orders it */
            newest_kv_store<HD, F8>(a, nkv, rope_cs);
        __syncthreads(); /* every warp is done with tile i - 1's stage: refill it */
        if (i + S - 1 < ntiles)
            copy_tile(i + S - 1, blk);
        blk = table_entry(i + S);
        mbar_wait(&full[i % S], (uint32_t)(i / S) & 1u);

        const E *ks = tiles + (size_t)(i % S) * D::STAGE_ELEMS;
        const E *vs = ks + NG * D::GROUP;
        /* S = Q K^T for the warp's 16 keys: two n-tiles of 8 keys. */
        /* Four independent accumulator chains (n-tile x even/odd k-step), summed after. */
        float s[2][4], s2[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                s[nt][j] = s2[nt][j] = 0.0f;
        if (F8) {
            /* Each 8 x 8 b16 matrix is 8 keys' codes of 16 dims: lane l gets codes 4 (l % 4) ..
             * + 3 of key l / 4, converted to the B fragments of one k-step (qdim's order). */
#pragma unroll
            for (int kq = 0; kq < HD / 64; kq++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    uint32_t b[4];
                    ldmatrix_x4(b, ks + D::row(D::key(lane & 7, warp, nt)) +
                                       (kq * 4 + (lane >> 3)) * 16);
#pragma unroll
                    for (int m = 0; m < 4; m++) {
                        const int k = kq * 4 + m;
                        mma_f16(m & 1 ? s2[nt] : s[nt], qa[k][0], 0u, qa[k][1], 0u,
                                e4m3x2_to_f16x2((uint16_t)b[m]),
                                e4m3x2_to_f16x2((uint16_t)(b[m] >> 16)));
                    }
                }
        } else {
#pragma unroll
            for (int kk = 0; kk < HD / 32; kk++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++) {
                    uint32_t b[4];
                    ldmatrix_x4(b, ks + D::row(D::key(lane & 7, warp, nt)) +
                                       (kk * 4 + (lane >> 3)) * 8);
                    mma_bf16(s[nt], qa[2 * kk][0], 0u, qa[2 * kk][1], 0u, b[0], b[1]);
                    mma_bf16(s2[nt], qa[2 * kk + 1][0], 0u, qa[2 * kk + 1][1], 0u, b[2], b[3]);
                }
        }
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                s[nt][j] += s2[nt][j];
        const int32_t key0 = begin + i * T;
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int j = 0; j < 2; j++) {
                s[nt][j] = key0 + D::key(qc + j, warp, nt) < end ? s[nt][j] * qscale : -INFINITY;
                mx = fmaxf(mx, s[nt][j]);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx);
        float alpha = 1.0f;
        if (m_new != -INFINITY) {
            alpha = fast_exp2(m - m_new);
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int j = 0; j < 2; j++)
                    s[nt][j] = fast_exp2(s[nt][j] - m_new);
        } else {
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
                s[nt][0] = s[nt][1] = 0.0f;
        }
        m = m_new;
        l = l * alpha + (s[0][0] + s[0][1] + s[1][0] + s[1][1]);
        const uint32_t p0 = pack_p<F8>(s[0][0], s[0][1]), p1 = pack_p<F8>(s[1][0], s[1][1]);
        /* O += P V: V^T fragments by ldmatrix.trans, two n-tiles of 8 dims per load. F8: a
         * transposed b16 matrix gives lane l the codes of dims 2 (l / 4) and 2 (l / 4) + 1 of
         * keys 2 (l % 4) and 2 (l % 4) + 1; a byte permute pairs them by dim, so each matrix feeds
         * two n-tiles, the even dims of 16 (o[2 q]) and the odd ones (o[2 q + 1]): output column
         * c of n-tile 2 q + e is dim 16 q + 2 c + e (undone below). */
#pragma unroll
        for (int dp = 0; dp < HD / 16; dp++) {
            o[2 * dp][0] *= alpha;
            o[2 * dp][1] *= alpha;
            o[2 * dp + 1][0] *= alpha;
            o[2 * dp + 1][1] *= alpha;
        }
        if (F8) {
#pragma unroll
            for (int dp = 0; dp < HD / 32; dp++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, vs + D::row(D::key(lane & 7, warp, (lane >> 3) & 1)) +
                                         (2 * dp + (lane >> 4)) * 16);
#pragma unroll
                for (int hq = 0; hq < 2; hq++) {
                    const int q = 2 * dp + hq;
                    /* keys 0 .. 7 of the k-step (n-tile 0's), then 8 .. 15: by dim, even | odd */
                    const uint32_t lo = __byte_perm(b[2 * hq], 0, 0x3120),
                                   hi = __byte_perm(b[2 * hq + 1], 0, 0x3120);
                    mma_f16(o[2 * q], p0, 0u, p1, 0u, e4m3x2_to_f16x2((uint16_t)lo),
                            e4m3x2_to_f16x2((uint16_t)hi));
                    mma_f16(o[2 * q + 1], p0, 0u, p1, 0u, e4m3x2_to_f16x2((uint16_t)(lo >> 16)),
                            e4m3x2_to_f16x2((uint16_t)(hi >> 16)));
                }
            }
        } else {
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                ldmatrix_x4_trans(b, vs + D::row(D::key(lane & 7, warp, (lane >> 3) & 1)) +
                                         (2 * dp + (lane >> 4)) * 8);
                mma_bf16(o[2 * dp], p0, 0u, p1, 0u, b[0], b[1]);
                mma_bf16(o[2 * dp + 1], p0, 0u, p1, 0u, b[2], b[3]);
            }
        }
    }

    /* l over the row's four lanes; then the warps merge through shared memory (the pipeline's,
     * now idle). */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    __syncthreads(); /* every copy was waited for: the tiles are free */
    float *red_o = reinterpret_cast<float *>(smem); /* [warp][8][HD] */
    float *red_ml = red_o + W * 8 * HD;             /* [warp][8][2] */
    static_assert(sizeof(float) * W * 8 * (HD + 2) <= D::smem, "merge fits");
    if (F8) /* n-tiles 2 q and 2 q + 1 hold dims 16 q + 2 c (+ 1) in their column c */
#pragma unroll
        for (int q = 0; q < HD / 16; q++)
            *reinterpret_cast<float4 *>(red_o + (warp * 8 + qr) * HD + q * 16 + 2 * qc) =
                make_float4(o[2 * q][0], o[2 * q + 1][0], o[2 * q][1], o[2 * q + 1][1]);
    else
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *reinterpret_cast<float2 *>(red_o + (warp * 8 + qr) * HD + n * 8 + qc) =
                make_float2(o[n][0], o[n][1]);
    if ((lane & 3) == 0) {
        red_ml[(warp * 8 + qr) * 2] = m;
        red_ml[(warp * 8 + qr) * 2 + 1] = l;
    }
    __syncthreads();
    for (int idx = tid; idx < gc * (HD / 2); idx += THREADS) {
        const int g = idx / (HD / 2), w = idx % (HD / 2);
        float mx = -INFINITY;
#pragma unroll
        for (int k = 0; k < W; k++)
            mx = fmaxf(mx, red_ml[(k * 8 + g) * 2]);
        float total = 0.0f, ox = 0.0f, oy = 0.0f;
#pragma unroll
        for (int k = 0; k < W; k++) {
            const float mk = red_ml[(k * 8 + g) * 2];
            const float wt = mk == -INFINITY ? 0.0f : exp2f(mk - mx);
            const float2 ov = *reinterpret_cast<const float2 *>(red_o + (k * 8 + g) * HD + 2 * w);
            total = fmaf(wt, red_ml[(k * 8 + g) * 2 + 1], total);
            ox = fmaf(wt, ov.x, ox);
            oy = fmaf(wt, ov.y, oy);
        }
        const int32_t h = h0 + g;
        ox /= total;
        oy /= total;
        if (part.w < 0) {
            uint16_t *out = a.out + (int64_t)token * a.num_heads * HD + (int64_t)h * HD;
            reinterpret_cast<uint32_t *>(out)[w] = float2_to_bf16x2(ox, oy);
        } else {
            const int64_t row = (int64_t)pidx * a.num_heads + h;
            reinterpret_cast<float2 *>(a.part_out + row * HD)[w] = make_float2(ox, oy);
            if (w == 0) /* natural log: (mx + log2(total)) * ln 2 */
                a.part_lse[row] = (mx + log2f(total)) * 0.6931471805599453f;
        }
    }
    if (part.w >= 0)
        merge_if_last<HD, THREADS>(a, part.w, rest % a.decode_chunks, kh, h0, gc, token);
    /* Every thread of a CTA that got this far (the CTAs that returned above stored nothing). */
    pdl_trigger_late(a.late);
}

/* ---- prefill ---- */

/* Whether a prefill tile needs the causal mask, as a type, so that each case compiles to its
 * own straight block of code. */
struct masked_t {
    static constexpr bool value = true;
};
struct unmasked_t {
    static constexpr bool value = false;
};

/* The prefill kernel's geometry for head dimension HD: 128 query rows per CTA (32 per warp, two
 * m16 tiles, so that each K/V fragment read from shared memory feeds four mma instead of two),
 * K/V tiles of 64 keys, the pipeline 2 stages deep, Q in shared memory beside them (96 KiB at
 * head dim 128) and re-read by ldmatrix each tile: Q in registers as well as 32 rows of O and S
 * would not fit in 255 registers. Two CTAs fit on an SM at head dim 128, three at 64. */
/* F8 (an F8E4M3 pool): the stages hold the codes (half the bytes), unswizzled; at each tile the
 * CTA converts its stage to f16 into one swizzled tile (conv), which the products read, with Q
 * converted to f16 once (the same 96 KiB at head dim 128). */
template <int HD, bool F8_ = false> struct prefill_geom {
    static constexpr bool F8 = F8_;
    static constexpr int EB = F8 ? 1 : 2; /* bytes per pool element */
    static constexpr int T = kPrefillKeys;
    static constexpr int STAGES = 2;
    static constexpr int CTAS_PER_SM = 2;
    static constexpr int C8 = HD / 8; /* 16-byte chunks of a bf16 (Q) row */
    static constexpr int ROW_STEP = kPrefillThreads / C8;
    static constexpr int QLOADS = kPrefillRows / ROW_STEP;
    static constexpr int KC = HD * EB / 16; /* 16-byte chunks of a K or V row in the pool */
    static constexpr int KROW_STEP = kPrefillThreads / KC;
    static constexpr int LOADS = T / KROW_STEP;      /* rows a thread copies per tile */
    static constexpr int MT = kPrefillWarpRows / 16; /* m16 tiles per warp */
    static constexpr size_t q_elems = (size_t)kPrefillRows * HD;
    /* Block-table entries one tile can span (a tile of T keys over blocks of at least
     * KV_BLOCK_SIZE_MIN), two tiles' worth in shared memory. */
    static constexpr int TAB = T / KV_BLOCK_SIZE_MIN + 1;
    static constexpr size_t stage_bytes = (size_t)2 * T * HD * EB; /* K and V of one tile */
    static constexpr size_t conv_bytes = F8 ? (size_t)2 * T * HD * sizeof(uint16_t) : 0;
    static constexpr size_t tiles_bytes =
        q_elems * sizeof(uint16_t) + STAGES * stage_bytes + conv_bytes;
    static constexpr size_t smem = tiles_bytes + 2 * TAB * sizeof(int32_t);
    static_assert(TAB <= kPrefillThreads, "one thread per table entry");
    static_assert(kPrefillRows == kPrefillWarpRows * (kPrefillThreads / 32), "rows per warp");
};

/* Causal prefill (FlashAttention-2 style) on the tensor cores: one CTA per (tile of query rows,
 * KV head); row r of the tile is token first + r / group of the sequence, query head kh * group
 * + r % group, so that the K/V tiles read for one KV head serve all of its query heads. Q is
 * copied once into swizzled shared memory; K/V tiles of 64 keys come through the block table
 * into swizzled shared memory by a cp.async pipeline, from key 0 to the tile's last query
 * position (tiles past it, fully masked, are never read). Each warp holds 32 rows: S = Q K^T
 * (m16n8k16, bf16, f32 accumulators, Q and K both by ldmatrix), online softmax in f32 (exp2 with
 * log2(e) folded into the scale), O += P V with P rounded to bf16 as the A operand and V by
 * ldmatrix.trans. A warp masks only the tiles that reach past its first row's position and
 * skips the tiles that lie wholly past its last row's. A chunk continuing a sequence already in
 * the pool is the same computation with context_len > query_len. */
template <int HD, bool F8>
__global__ void __launch_bounds__(kPrefillThreads, prefill_geom<HD, F8>::CTAS_PER_SM)
    prefill_kernel(attn_args a)
{
    using P = prefill_geom<HD, F8>;
    using E = typename std::conditional<F8, uint8_t, uint16_t>::type; /* a pool element */
    constexpr int T = P::T, S = P::STAGES, MT = P::MT;
    extern __shared__ __align__(16) unsigned char smem[];
    uint16_t *qs = reinterpret_cast<uint16_t *>(smem); /* [kPrefillRows][HD], swizzled */
    /* [stage][K, V][T][HD]: bf16 swizzled, or F8 codes row after row */
    E *tiles = reinterpret_cast<E *>(qs + P::q_elems);
    /* F8: the current tile's K, V in f16, [K, V][T][HD] swizzled */
    uint16_t *conv =
        reinterpret_cast<uint16_t *>(smem + P::q_elems * sizeof(uint16_t) + S * P::stage_bytes);
    int32_t *tab = reinterpret_cast<int32_t *>(smem + P::tiles_bytes); /* [2][TAB] */

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    /* One linear grid, the KV head fastest, over the tiles in descending order of length: the
     * CTAs start longest first, whatever the KV head. */
    const int32_t kh = (int32_t)(blockIdx.x % (uint32_t)a.num_kv_heads);
    const int4 item = a.pitems[blockIdx.x / (uint32_t)a.num_kv_heads];
    const int32_t seq = item.x, first = item.y;
    const int32_t q0 = a.query_start[seq];
    const int32_t query_len = a.query_start[seq + 1] - q0;
    const int32_t context_len = a.context_len[seq];
    const int32_t ntok = min(a.tile_tokens, query_len - first);
    const int32_t rows = ntok * a.group;
    const int32_t pos0 = context_len - query_len + first; /* position of the tile's token 0 */
    const int32_t key_end = pos0 + ntok;                  /* one past the last key needed */
    const int32_t *table = a.block_tables + (int64_t)seq * a.table_stride;
    const int32_t ntiles = (key_end + T - 1) / T;

    const int lcol = tid % P::C8, lrow = tid / P::C8;
    /* Q rows into shared memory (padding rows zero-filled), in the first tile's group. */
#pragma unroll
    for (int j = 0; j < P::QLOADS; j++) {
        const int r = lrow + j * P::ROW_STEP;
        const bool live = r < rows;
        const uint16_t *src = live ? a.q + (int64_t)(q0 + first + r / a.group) * a.q_row_stride +
                                         (int64_t)(kh * a.group + r % a.group) * HD + lcol * 8
                                   : a.q;
        cp_async16(qs + swz<HD>(r, lcol), src, live);
    }

    /* K/V copies: thread tid copies 16-byte chunk kcl of rows krw * P::LOADS on. */
    const int kcl = tid % P::KC, krw = tid / P::KC;
    const E *kcol = static_cast<const E *>(a.k) + (int64_t)kh * a.head_stride + kcl * (16 / P::EB);
    const E *vcol = static_cast<const E *>(a.v) + (int64_t)kh * a.head_stride + kcl * (16 / P::EB);
    /* Tile t's block-table entries, from the block of its first key on, go to tab[t % 2] by
     * 4-byte cp.async a tile ahead of its K/V copy, so that no copy waits for a global load of
     * the table (nor holds the entries in registers, all taken by O and S). */
    auto copy_table = [&](int32_t t) {
        const int32_t b0 = block_of(a, t * T);
        const int32_t bend = block_of(a, min(t * T + T, key_end) - 1);
        if (tid < P::TAB && b0 + tid <= bend) {
            const uint32_t d = smem_addr(tab + (t & 1) * P::TAB + tid);
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d),
                         "l"(table + b0 + tid)
                         : "memory");
        }
    };
    /* Tile t's K/V rows; the entries from tab[t % 2] (from the table itself for tile 0).
     * Thread tid copies chunk lcol of the P::LOADS consecutive rows from crow on. When the
     * block size is a multiple of P::LOADS those rows lie in one block (tiles start at
     * multiples of T): one table entry and one offset per tile, and with rows of the pool
     * contiguous (slot_stride HD, as kv_layer_view_make lays them) constant offsets after it;
     * otherwise each row looks up its own block. */
    const int crow = krw * P::LOADS;
    const bool grouped = a.block_size % P::LOADS == 0 && a.slot_stride == HD;
    /* The byte offset of row r's chunk c in a stage's K tile: swizzled (bf16), or plain (F8). */
    auto stage_off = [&](int r, int c) -> uint32_t {
        return F8 ? (uint32_t)(r * HD + c * 16) : 2 * swz<HD>(r, c);
    };
    auto copy_tile = [&](int32_t t, bool direct) {
        const uint32_t kdst = smem_addr(tiles + (size_t)(t % S) * 2 * T * HD);
        /* kcl made opaque here, so that the compiler recomputes the rows' swizzled addresses
         * each tile (an XOR and an add each) rather than keeping them in registers across the
         * loop, where they would spill (measured: 1-2% at 16k tokens). */
        int lc = kcl;
        asm volatile("" : "+r"(lc));
        const int32_t b0 = block_of(a, t * T);
        const int32_t *tt = tab + (t & 1) * P::TAB;
        const int32_t pos = t * T + crow;
        auto offset = [&](int32_t p) -> int64_t {
            const int32_t blk = direct ? __ldg(table + block_of(a, p)) : tt[block_of(a, p) - b0];
            return (int64_t)blk * a.block_stride + (int64_t)slot_of(a, p) * a.slot_stride;
        };
        if (grouped) {
            const int64_t off = pos < key_end ? offset(pos) : 0;
            const E *ksrc = kcol + off, *vsrc = vcol + off;
#pragma unroll
            for (int j = 0; j < P::LOADS; j++) {
                const uint32_t d = kdst + stage_off(crow + j, lc);
                const bool valid = pos + j < key_end;
                cp_async16_s(d, ksrc + j * HD, valid);
                cp_async16_s(d + T * HD * P::EB, vsrc + j * HD, valid);
            }
        } else {
#pragma unroll
            for (int j = 0; j < P::LOADS; j++) {
                const uint32_t d = kdst + stage_off(crow + j, lc);
                const bool valid = pos + j < key_end;
                const int64_t off = valid ? offset(pos + j) : 0;
                cp_async16_s(d, kcol + off, valid);
                cp_async16_s(d + T * HD * P::EB, vcol + off, valid);
            }
        }
    };
    static_assert(S == 2, "the table ring and the copies below assume two stages");
    copy_tile(0, true);
    if (ntiles > 1)
        copy_table(1);
    cp_async_commit();

    /* This thread's rows: g and g + 8 of each of the warp's m16 tiles. */
    const int g = lane >> 2, qc = 2 * (lane & 3);
    const int wrow = warp * kPrefillWarpRows;
    /* The warp's first and last positions: tiles up to wfirst need no mask, tiles past wlast
     * are skipped (a warp wholly in the padding skips them all). */
    const int32_t wfirst = pos0 + wrow / a.group;
    const int32_t wlast =
        wrow < rows ? pos0 + (min(wrow + kPrefillWarpRows, rows) - 1) / a.group : -1;
    const float qscale = a.scale * 1.4426950408889634f;
    float o[MT][HD / 8][4];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            o[mi][n][0] = o[mi][n][1] = o[mi][n][2] = o[mi][n][3] = 0.0f;
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mi = 0; mi < MT; mi++)
        m[mi][0] = m[mi][1] = -INFINITY, l[mi][0] = l[mi][1] = 0.0f;
    /* ldmatrix lane addresses: A (Q) and V^T read rows (lane & 7) + 8 * ((lane >> 3) & 1) at
     * chunk offset lane >> 4; K (two n8 tiles of one k16 step) reads rows (lane & 7) + 8 *
     * (lane >> 4) at chunk offset (lane >> 3) & 1. */
    const int arow = (lane & 7) + ((lane >> 3) & 1) * 8, achunk = lane >> 4;
    const int krow = (lane & 7) + (lane >> 4) * 8, kchunk = (lane >> 3) & 1;
    /* In bytes: a row is 2 * HD, and chunk c of a row whose r % 8 is lane % 8 sits at
     * ((c ^ lane % 8) << 4); for c = 2 * d + c0 that is (c0 ^ lane % 8) << 4 XOR d << 5, so
     * each step's address is one XOR off the row's, with no table of addresses to keep. */
    const uint32_t aoff = (uint32_t)(achunk ^ (lane & 7)) << 4;
    const uint32_t koff = (uint32_t)(kchunk ^ (lane & 7)) << 4;
    const uint32_t qrow_addr = smem_addr(qs) + (uint32_t)(wrow + arow) * (2 * HD);

    /* One K/V tile: S = Q K^T, online softmax, O += P V. */
    auto tile = [&](int32_t k0, int stage, auto mask_tag) {
        constexpr bool MASK = decltype(mask_tag)::value;
        /* the tile's K then V, [T][HD] each, swizzled: the stage's, or the f16 conversion */
        const uint16_t *kv =
            F8 ? conv : reinterpret_cast<const uint16_t *>(tiles) + (size_t)stage * 2 * T * HD;
        const uint32_t k_addr = smem_addr(kv) + krow * (2 * HD);
        const uint32_t v_addr = smem_addr(kv + T * HD) + arow * (2 * HD);
        /* S = Q K^T, 16 dims per step: the step's Q fragments of both m16 tiles, then each
         * K fragment (16 keys) into four mma. */
        float s[MT][T / 8][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
#pragma unroll
            for (int nt = 0; nt < T / 8; nt++)
                s[mi][nt][0] = s[mi][nt][1] = s[mi][nt][2] = s[mi][nt][3] = 0.0f;
#pragma unroll
        for (int kd = 0; kd < HD / 16; kd++) {
            uint32_t qa[MT][4];
            const uint32_t qa_addr = qrow_addr + (aoff ^ (kd << 5));
#pragma unroll
            for (int mi = 0; mi < MT; mi++)
                ldsm_x4(qa[mi], qa_addr + mi * 16 * (2 * HD));
            const uint32_t kb_addr = k_addr + (koff ^ (kd << 5));
#pragma unroll
            for (int np = 0; np < T / 16; np++) {
                uint32_t b[4];
                ldsm_x4(b, kb_addr + np * 16 * (2 * HD));
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    mma_kv<F8>(s[mi][2 * np], qa[mi][0], qa[mi][1], qa[mi][2], qa[mi][3], b[0],
                               b[1]);
                    mma_kv<F8>(s[mi][2 * np + 1], qa[mi][0], qa[mi][1], qa[mi][2], qa[mi][3], b[2],
                               b[3]);
                }
            }
        }
        /* Mask the tiles that reach past the warp's first position; online softmax on the raw
         * scores, the scale (log2(e) included) folded into exp2's argument by one fma, so the
         * row maximum is taken unscaled (hence a positive scale); P packed to bf16 A fragments
         * as it is made. */
        uint32_t pa[MT][T / 16][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++) {
            if (MASK) {
                /* The rows' causal limits, -1 for padding rows (every key masked); computed
                 * here rather than kept, as the registers are all taken. */
                int32_t limit[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int r = wrow + mi * 16 + g + 8 * h;
                    limit[h] = (r < rows ? pos0 + r / a.group : -1) - k0 - qc;
                }
#pragma unroll
                for (int nt = 0; nt < T / 8; nt++)
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        if (nt * 8 + (j & 1) > limit[j >> 1])
                            s[mi][nt][j] = -INFINITY;
            }
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int nt = 0; nt < T / 8; nt++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    mx[j >> 1] = fmaxf(mx[j >> 1], s[mi][nt][j]);
            float alpha[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
                mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
                const float m_new = fmaxf(m[mi][h], mx[h] * qscale);
                /* A row with no key yet keeps m = -inf: subtract 0 instead, exp2(-inf) = 0. */
                const float base = m_new == -INFINITY ? 0.0f : m_new;
                alpha[h] = fast_exp2(m[mi][h] - base);
                m[mi][h] = m_new;
                float sum = 0.0f;
#pragma unroll
                for (int nt = 0; nt < T / 8; nt++) {
                    s[mi][nt][2 * h] = fast_exp2(fmaf(s[mi][nt][2 * h], qscale, -base));
                    s[mi][nt][2 * h + 1] = fast_exp2(fmaf(s[mi][nt][2 * h + 1], qscale, -base));
                    sum += s[mi][nt][2 * h] + s[mi][nt][2 * h + 1];
                }
                l[mi][h] = l[mi][h] * alpha[h] + sum;
            }
            /* Past the first tiles a row's max rarely moves: skip the rescale when no row of
             * the warp's m16 tile needs it. */
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
#pragma unroll
                for (int n = 0; n < HD / 8; n++) {
                    o[mi][n][0] *= alpha[0];
                    o[mi][n][1] *= alpha[0];
                    o[mi][n][2] *= alpha[1];
                    o[mi][n][3] *= alpha[1];
                }
#pragma unroll
            for (int kk = 0; kk < T / 16; kk++) {
                pa[mi][kk][0] = pack_p<F8>(s[mi][2 * kk][0], s[mi][2 * kk][1]);
                pa[mi][kk][1] = pack_p<F8>(s[mi][2 * kk][2], s[mi][2 * kk][3]);
                pa[mi][kk][2] = pack_p<F8>(s[mi][2 * kk + 1][0], s[mi][2 * kk + 1][1]);
                pa[mi][kk][3] = pack_p<F8>(s[mi][2 * kk + 1][2], s[mi][2 * kk + 1][3]);
            }
        }
        /* O += P V, 16 keys per k-step: each V^T fragment into four mma. */
#pragma unroll
        for (int kk = 0; kk < T / 16; kk++)
#pragma unroll
            for (int dp = 0; dp < HD / 16; dp++) {
                uint32_t b[4];
                ldsm_x4_trans(b, v_addr + (aoff ^ (dp << 5)) + kk * 16 * (2 * HD));
#pragma unroll
                for (int mi = 0; mi < MT; mi++) {
                    mma_kv<F8>(o[mi][2 * dp], pa[mi][kk][0], pa[mi][kk][1], pa[mi][kk][2],
                               pa[mi][kk][3], b[0], b[1]);
                    mma_kv<F8>(o[mi][2 * dp + 1], pa[mi][kk][0], pa[mi][kk][1], pa[mi][kk][2],
                               pa[mi][kk][3], b[2], b[3]);
                }
            }
    };

    for (int32_t i = 0; i < ntiles; i++) {
        cp_async_wait<0>();
        if (F8 && i == 0) /* this thread's Q chunks, now in, to f16 in place */
#pragma unroll
            for (int j = 0; j < P::QLOADS; j++) {
                uint4 *q = reinterpret_cast<uint4 *>(qs + swz<HD>(lrow + j * P::ROW_STEP, lcol));
                const uint4 w = *q;
                const float2 x0 = bf16x2_to_float2(w.x), x1 = bf16x2_to_float2(w.y),
                             x2 = bf16x2_to_float2(w.z), x3 = bf16x2_to_float2(w.w);
                *q = make_uint4(float2_to_f16x2_sat(x0.x, x0.y), float2_to_f16x2_sat(x1.x, x1.y),
                                float2_to_f16x2_sat(x2.x, x2.y), float2_to_f16x2_sat(x3.x, x3.y));
            }
        __syncthreads();
        if (F8) {
            /* Stage i % S to f16 in conv (every warp is done with the last tile's), then
             * the stage may be refilled. */
            const uint8_t *st = reinterpret_cast<const uint8_t *>(tiles) + (i % S) * P::stage_bytes;
            constexpr int CH = 2 * T * HD / 16; /* 16-byte code chunks of K and V */
#pragma unroll
            for (int c = tid; c < CH; c += kPrefillThreads) {
                const int r = c / (HD / 16), ch = c % (HD / 16); /* row of K then V, chunk */
                uint4 lo, hi;
                e4m3x16_to_f16x16(*reinterpret_cast<const uint4 *>(st + 16 * c), lo, hi);
                uint16_t *d = conv + (r / T) * T * HD;
                *reinterpret_cast<uint4 *>(d + swz<HD>(r % T, 2 * ch)) = lo;
                *reinterpret_cast<uint4 *>(d + swz<HD>(r % T, 2 * ch + 1)) = hi;
            }
            __syncthreads();
        }
        if (i + 1 < ntiles)
            copy_tile(i + 1, false);
        if (i + 2 < ntiles)
            copy_table(i + 2);
        cp_async_commit();

        const int32_t k0 = i * T;
        /* The tiles wholly at or below the warp's first position need no mask; those that
         * reach past it do, those wholly past its last position are skipped. Each case is one
         * straight block of code, so that the compiler can interleave its parts. */
        if (k0 + T - 1 <= wfirst)
            tile(k0, i % S, unmasked_t());
        else if (k0 <= wlast)
            tile(k0, i % S, masked_t());
    }
    cp_async_wait<0>();

#pragma unroll
    for (int mi = 0; mi < MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float lsum = l[mi][h];
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 1);
            lsum += __shfl_xor_sync(0xffffffffu, lsum, 2);
            const int r = wrow + mi * 16 + g + 8 * h;
            if (r >= rows)
                continue;
            const int32_t t = q0 + first + r / a.group;
            const int32_t head = kh * a.group + r % a.group;
            const float inv = 1.0f / lsum;
            uint16_t *out = a.out + (int64_t)t * a.num_heads * HD + (int64_t)head * HD + qc;
#pragma unroll
            for (int n = 0; n < HD / 8; n++)
                *reinterpret_cast<uint32_t *>(out + n * 8) =
                    float2_to_bf16x2(o[mi][n][2 * h] * inv, o[mi][n][2 * h + 1] * inv);
        }
}

using kernel_fn = void (*)(attn_args);

/* The decode kernels of head dimension HD and W warps for copies of 4, 8 and 16 rows, and their
 * shared memory. */
template <int HD, int W, bool F8, bool DENSE = false>
static void decode_variants(kernel_fn *fn, size_t *smem)
{
    fn[0] = decode_kernel<HD, 4, W, F8, DENSE>;
    fn[1] = decode_kernel<HD, 8, W, F8, DENSE>;
    fn[2] = decode_kernel<HD, 16, W, F8, DENSE>;
    smem[0] = decode_geom<HD, 4, W, F8, DENSE>::smem;
    smem[1] = decode_geom<HD, 8, W, F8, DENSE>::smem;
    smem[2] = decode_geom<HD, 16, W, F8, DENSE>::smem;
}

/* The copy rows of a step with n decode sequences (a graph plan's n: its padded size, so that
 * capture and replay agree): kDecodeWideCopySeqs above, or what
 * cuda_attention_set_decode_copy_rows set. */
static int32_t decode_copy_rows(int32_t set, int32_t n, int32_t block_size)
{
    if (set != 0)
        return set;
    if (n < kDecodeWideCopySeqs)
        return 4;
    return block_size % 16 == 0 ? 16 : block_size % 8 == 0 ? 8 : 4;
}

/* Whether a step with n decode sequences (a graph plan's n: its padded size, so that capture and
 * replay agree) runs the decode kernel's CTAs of kDecodeWideWarps: from kDecodeWideMinSeqs to
 * kDecodeWideMaxSeqs sequences, or as cuda_attention_set_decode_warps set. Measured on an H100
 * (bench/RESULTS.md, thirtieth session; decode_step at 1152 keys, device ms, 4 warps -> 8): 1
 * sequence 5.64-5.80 -> 5.89 (its 9 partitions of 128 keys stream from 72 SMs, 18 of 64 from
 * 144 CTAs), 2 5.91 -> 5.86, 4 5.97 -> 5.95, 8 6.24 -> 6.25, 12 6.58 -> 6.35, 16 6.73 -> 6.56
 * (CTAs of 4 warps split each context in two and merge; one of 8 takes it whole), 24 7.54 ->
 * 8.01, 32 8.06 -> 8.16 (two rounds of 132 CTAs where 4 warps ran one of 256). */
/* Only at head dim 128, the one measured: at 64 a CTA of 4 warps takes 66 KiB, three an SM (12
 * warps), where one of 8 takes 130 KiB, one an SM. */
constexpr int32_t kDecodeWideMinSeqs = 2, kDecodeWideMaxSeqs = 16;
static bool decode_wide(int32_t set, int32_t n, int32_t head_dim)
{
    if (set != 0)
        return set == kDecodeWideWarps;
    return head_dim == 128 && n >= kDecodeWideMinSeqs && n <= kDecodeWideMaxSeqs;
}

/* The decode kernel's variants: kDecodeNarrow (CTAs of kDecodeWarps, two an SM at head dim 128,
 * three at 64), kDecodeWide (kDecodeWideWarps) and kDecodeDense (kDecodeWarps, three an SM:
 * decode_geom's DENSE, F8 at head dim 128 only; elsewhere the plan's kernels of that index are
 * the narrow ones and never chosen). Only DENSE passes __launch_bounds__ a minimum of CTAs an
 * SM: a minimum of 1 for the others let ptxas take 236 registers a thread (from 140 at head dim
 * 64: two CTAs an SM where shared memory allows three; the thirty-sixth session's review). */
enum { kDecodeNarrow = 0, kDecodeWide = 1, kDecodeDense = 2, kDecodeVariants = 3 };
/* The variant of a step with n decode sequences (a graph plan's n: its padded size): the wide one
 * as decode_wide says; else the dense one where the plan has it, from kDecodeDenseMinSeqs
 * sequences, or as cuda_attention_set_decode_ctas set (3 dense, 2 narrow). Measured on an H100
 * (bench/RESULTS.md, thirty-sixth session; decode_step fp8, device ms, narrow -> dense): 1
 * sequence at 1100 keys 5.641 -> 5.645, 16 6.211 -> 6.170 (8 warps either way), 64 8.457 ->
 * 8.961 and at 640 keys 7.480 -> 8.007, 96 9.855 -> 9.494 (640: 8.371 -> 8.191), 128 10.986 ->
 * 10.454 (9.075 -> 8.841), 192 13.600 -> 12.884 (10.864 -> 10.653), 256 at 640 12.58-12.63 ->
 * 12.33-12.34; the throughput workload (fp8, 256 in flight) 18,015 -> 18,770 tok/s. On an H200,
 * 256 at 640 keys 11.56-11.60 -> 11.18-11.23. At 64 the dense kernel loses uncut too (both forced
 * to one partition: 7.46 -> 7.50 at 640 keys, 8.43 -> 8.56 at 1100; thirty-seventh session), so
 * the split-KV cost model's cut with its 396 slots is only part of its loss there. */
constexpr int32_t kDecodeDenseMinSeqs = 96;

/* Rounds a word count up to a multiple of 4, so that int4 arrays stay 16-byte aligned. */
size_t align4(size_t words)
{
    return (words + 3) & ~(size_t)3;
}

} // namespace

struct cuda_attention_plan {
    struct cuda_attention_config config;
    int32_t group;                  /* query heads per KV head */
    int32_t decode_chunks;          /* decode CTAs per KV head: ceil(group / kDecodeHeadsMax) */
    int32_t tile_tokens;            /* query tokens per prefill tile */
    int32_t slots[kDecodeVariants]; /* decode CTAs resident at once on the GPU, per variant */
    /* The kernels for head_dim and the pool's dtype (kernel_set): decode_kernel of each variant
     * (narrow, wide, dense), copies of 4, 8, 16 rows; prefill_kernel; and their shared memory. */
    kernel_fn decode[kDecodeVariants][3];
    size_t decode_smem[kDecodeVariants][3];
    bool has_dense; /* decode[kDecodeDense] is decode_geom's DENSE (F8 at head dim 128) */
    kernel_fn prefill;
    size_t prefill_smem;
    int32_t max_parts;   /* decode partitions the scratch holds */
    int32_t split_extra; /* partitions a split adds to one per sequence, at most */
    /* The same for each variant alone (its own slots): a graph plan's grid holds pad +
     * graph_extra[variant] partitions' CTAs, split_extra for the largest. */
    int32_t graph_extra[kDecodeVariants];

    /* Metadata: packed per step into pinned staging (two slots, each guarded by an event
     * recorded after its copy), then one copy into the device buffer. */
    size_t meta_words;
    int32_t *staging[2];
    cudaEvent_t staged[2];
    bool pending[2];
    int next_slot;
    int32_t *meta;
    float *part_out, *part_lse;
    int32_t *merge_count;

    /* The planned step. */
    bool planned;
    bool graph; /* planned by cuda_attention_plan_graph: grid and layout fixed by num_seqs */
    int32_t num_seqs, num_tokens, table_stride;
    int32_t num_parts, num_merges, num_items;
    size_t off_query_start, off_context_len, off_tables, off_merges, off_parts, off_items;

    int early_kv;          /* cuda_attention_set_early_kv */
    int32_t copy_rows_set; /* cuda_attention_set_decode_copy_rows: 0, 4, 8 or 16 */
    int32_t split_set;     /* cuda_attention_set_decode_split: 0 or the partition's keys */
    int32_t copy_rows;     /* the planned step's: 4, 8 or 16 */
    int32_t warps_set;     /* cuda_attention_set_decode_warps: 0, 4 or 8 */
    int32_t ctas_set;      /* cuda_attention_set_decode_ctas: 0, 2 or 3 */
    int32_t variant;       /* the planned step's: kDecodeNarrow, kDecodeWide or kDecodeDense */
};

static int decode_variant(const struct cuda_attention_plan *p, int32_t n)
{
    if (decode_wide(p->warps_set, n, p->config.head_dim))
        return kDecodeWide;
    if (!p->has_dense || p->ctas_set == 2)
        return kDecodeNarrow;
    return p->ctas_set == 3 || n >= kDecodeDenseMinSeqs ? kDecodeDense : kDecodeNarrow;
}

/* The plan's kernels for head dimension HD and a bf16 (F8 false) or F8E4M3 pool. */
template <int HD, bool F8> static void kernel_set(struct cuda_attention_plan *p)
{
    decode_variants<HD, kDecodeWarps, F8>(p->decode[kDecodeNarrow], p->decode_smem[kDecodeNarrow]);
    decode_variants<HD, kDecodeWideWarps, F8>(p->decode[kDecodeWide], p->decode_smem[kDecodeWide]);
    p->has_dense = F8 && HD == 128;
    decode_variants<HD, kDecodeWarps, F8, F8 && HD == 128>(p->decode[kDecodeDense],
                                                           p->decode_smem[kDecodeDense]);
    p->prefill = prefill_kernel<HD, F8>;
    p->prefill_smem = prefill_geom<HD, F8>::smem;
}

/* Prefill tiles (sequence, first token, keys needed, 0) in descending order of keys needed;
 * ties in the order of the batch. */
static int item_cmp(const void *x, const void *y)
{
    const int4 *a = static_cast<const int4 *>(x), *b = static_cast<const int4 *>(y);
    if (a->z != b->z)
        return a->z > b->z ? -1 : 1;
    if (a->x != b->x)
        return a->x < b->x ? -1 : 1;
    return a->y < b->y ? -1 : a->y > b->y;
}

/* How a context of context_len keys is cut for a split of split keys: into n nearly equal,
 * tile-aligned partitions of *len keys (a multiple of align, the decode tile; the last one
 * shorter), n = ceil(context_len / split) at most. Returns n. */
static int32_t split_parts(int64_t context_len, int64_t split, int64_t align, int64_t *len)
{
    int64_t n = context_len <= split ? 1 : (context_len + split - 1) / split;
    *len = context_len;
    if (n > 1) {
        *len = ((context_len + n - 1) / n + align - 1) / align * align;
        n = (context_len + *len - 1) / *len;
    }
    return (int32_t)n;
}

/* The partitions a split for `waves` waves of the resident decode CTAs aims at: the candidate
 * split (plan) is ceil(decode keys / this), raised to kSplitMinTokens and kSplitAlign. */
static int64_t split_want(int64_t waves, int64_t slots, int64_t ctas_per_part)
{
    return (waves * slots + ctas_per_part - 1) / ctas_per_part;
}

/* The modelled time of the decode CTAs for a split, in keys streamed by one CTA: rounds of
 * `slots` CTAs over the mean partition, or the longest partition when it is longer, plus a
 * startup of kSplitStartupKeys per round, plus the merge when a context is split (the widest
 * merge's, which the last CTA of that sequence does after its own partition). (A model where
 * the CTAs resident on an SM share its bandwidth, so that one CTA an SM would stream as fast as
 * two, splits less from about 9 to 16 sequences: measured on the H200, 16 sequences of 1100 keys
 * took 36.9 us a layer unsplit against 28.5 split in two; bench/RESULTS.md, 2026-12-03.) */
static int64_t split_cost(const struct attention_batch *b, int64_t split, int64_t align,
                          int64_t ctas_per_part, int64_t slots)
{
    int64_t ctas = 0, keys = 0, longest = 0, widest = 1;
    for (int32_t q = 0; q < b->num_seqs; q++) {
        if (b->query_start[q + 1] - b->query_start[q] != 1)
            continue;
        int64_t len;
        const int32_t n = split_parts(b->context_len[q], split, align, &len);
        ctas += n * ctas_per_part;
        keys += b->context_len[q] * ctas_per_part;
        longest = len > longest ? len : longest;
        widest = n > widest ? n : widest;
    }
    if (ctas == 0)
        return 0;
    const int64_t rounds = (ctas + slots - 1) / slots;
    const int64_t spread = rounds * ((keys + ctas - 1) / ctas);
    const int64_t merge = widest > 1 ? kSplitMergeKeys + widest * kSplitMergePartKeys : 0;
    return (spread > longest ? spread : longest) + rounds * kSplitStartupKeys + merge;
}

static int config_check(const struct cuda_attention_config *c)
{
    if (c->num_heads <= 0 || c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads != 0)
        return pagoda_error_set(PAGODA_EINVAL,
                                "attention: num_heads %d is not a positive multiple of "
                                "num_kv_heads %d",
                                (int)c->num_heads, (int)c->num_kv_heads);
    if (c->head_dim <= 0 || c->head_dim > ATTENTION_HEAD_DIM_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "attention: head_dim %d outside 1..%d",
                                (int)c->head_dim, ATTENTION_HEAD_DIM_MAX);
    if (!isfinite(c->scale))
        return pagoda_error_set(PAGODA_EINVAL, "attention: scale is not finite");
    /* The prefill kernel folds the scale into exp2's argument and takes the row maximum of the
     * unscaled scores, which is the maximum of the scaled ones only for a positive scale. */
    if (!(c->scale > 0.0f))
        return pagoda_error_set(PAGODA_EINVAL, "attention: scale is not positive");
    struct attention_limits limits = {c->block_size, c->num_blocks, c->max_num_seqs,
                                      c->max_num_tokens, c->max_blocks_per_seq};
    int rc = attention_limits_check(&limits);
    if (rc < 0)
        return rc;
    if (c->head_dim != 64 && c->head_dim != 128)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuda attention: head_dim %d (the kernels take 64 or 128)",
                                (int)c->head_dim);
    if (c->kv_dtype != DTYPE_BF16 && c->kv_dtype != DTYPE_F8E4M3)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuda attention: a %s pool (the kernels read BF16 or F8_E4M3)",
                                dtype_name(c->kv_dtype));
    if (c->num_heads / c->num_kv_heads > kGroupMax)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuda attention: %d query heads per KV head (at most %d)",
                                (int)(c->num_heads / c->num_kv_heads), kGroupMax);
    return 0;
}

int cuda_attention_plan_new(const struct cuda_attention_config *c, struct cuda_attention_plan **out)
{
    if (c == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_plan_new: NULL argument");
    *out = NULL;
    int rc = config_check(c);
    if (rc < 0)
        return rc;

    int dev = 0, sms = 0;
    if ((rc = cuda_device_sms(&dev, &sms, "cuda_attention_plan_new: the device's SM count")) < 0)
        return rc;

    struct cuda_attention_plan *p =
        static_cast<struct cuda_attention_plan *>(calloc(1, sizeof(*p)));
    if (p == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "cuda_attention_plan_new: plan");
    p->config = *c;
    p->group = c->num_heads / c->num_kv_heads;
    p->decode_chunks = (p->group + kDecodeHeadsMax - 1) / kDecodeHeadsMax;
    p->tile_tokens = kPrefillRows / p->group;
    const bool f8 = c->kv_dtype == DTYPE_F8E4M3;
    if (c->head_dim == 64)
        f8 ? kernel_set<64, true>(p) : kernel_set<64, false>(p);
    else
        f8 ? kernel_set<128, true>(p) : kernel_set<128, false>(p);
    p->copy_rows = 4;
    /* The slots of each variant: the fewest CTAs an SM holds of its three copy widths (the same
     * today). */
    for (int w = 0; w < kDecodeVariants && rc == 0; w++) {
        int resident = INT32_MAX;
        const int threads = 32 * (w == kDecodeWide ? kDecodeWideWarps : kDecodeWarps);
        for (int v = 0; v < 3 && rc == 0; v++) {
            int r = 0;
            rc = cuda_call_result(cudaFuncSetAttribute(p->decode[w][v],
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       (int)p->decode_smem[w][v]),
                                  "cuda_attention_plan_new: cudaFuncSetAttribute (decode)");
            if (rc == 0)
                rc = cuda_call_result(
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r, p->decode[w][v], threads,
                                                                  p->decode_smem[w][v]),
                    "cuda_attention_plan_new: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
            resident = r < resident ? r : resident;
        }
        p->slots[w] = (resident > 0 ? resident : 1) * (sms > 0 ? sms : 1);
    }
    if (rc < 0) {
        free(p);
        return rc;
    }
    const int32_t ctas_per_part = c->num_kv_heads * p->decode_chunks;
    /* At most one partition per sequence, plus the extra ones a split adds, whatever the
     * minimum partition: a split is at least D / want keys (D the decode keys of the step, want
     * = split_want of its waves), so the sequences' ceil(context / split) partitions number
     * fewer than D / split + sequences <= want + sequences. A graph plan launches the decode
     * CTAs of that many partitions (launch), so that one captured launch serves every split a
     * step of its size can get. */
    p->split_extra = 0;
    for (int w = 0; w < kDecodeVariants; w++) {
        p->graph_extra[w] = (int32_t)split_want(kSplitWavesMax, p->slots[w], ctas_per_part) + 1;
        p->split_extra = p->graph_extra[w] > p->split_extra ? p->graph_extra[w] : p->split_extra;
    }
    p->max_parts = c->max_num_seqs + p->split_extra;

    /* Words of one step's metadata at its largest (int32 sizes: no overflow in uint64). */
    const uint64_t seqs = (uint64_t)c->max_num_seqs;
    const uint64_t words = align4(seqs + 1) + align4(seqs) +
                           align4(seqs * (uint64_t)c->max_blocks_per_seq) + 4 * seqs +
                           4 * (uint64_t)p->max_parts + 4 * (uint64_t)c->max_num_tokens;
    const uint64_t part_floats = (uint64_t)p->max_parts * (uint64_t)c->num_heads * c->head_dim;
    if (words > SIZE_MAX / sizeof(int32_t) / 4 || part_floats > SIZE_MAX / sizeof(float) / 4) {
        rc = pagoda_error_set(PAGODA_ENOMEM, "cuda_attention_plan_new: limits too large");
        goto fail;
    }
    p->meta_words = (size_t)words;
    for (int i = 0; i < 2; i++) {
        rc = cuda_call_result(cudaMallocHost(reinterpret_cast<void **>(&p->staging[i]),
                                             p->meta_words * sizeof(int32_t)),
                              "cuda_attention_plan_new: cudaMallocHost");
        if (rc < 0)
            goto fail;
        rc = cuda_call_result(cudaEventCreateWithFlags(&p->staged[i], cudaEventDisableTiming),
                              "cuda_attention_plan_new: cudaEventCreateWithFlags");
        if (rc < 0)
            goto fail;
    }
    rc = cuda_call_result(
        cudaMalloc(reinterpret_cast<void **>(&p->meta), p->meta_words * sizeof(int32_t)),
        "cuda_attention_plan_new: cudaMalloc (metadata)");
    if (rc < 0)
        goto fail;
    rc = cuda_call_result(
        cudaMalloc(reinterpret_cast<void **>(&p->part_out), (size_t)part_floats * sizeof(float)),
        "cuda_attention_plan_new: cudaMalloc (split-KV outputs)");
    if (rc < 0)
        goto fail;
    rc = cuda_call_result(cudaMalloc(reinterpret_cast<void **>(&p->part_lse),
                                     (size_t)p->max_parts * c->num_heads * sizeof(float)),
                          "cuda_attention_plan_new: cudaMalloc (split-KV lse)");
    if (rc < 0)
        goto fail;
    {
        const size_t counts = (size_t)c->max_num_seqs * p->decode_chunks * c->num_kv_heads;
        rc = cuda_call_result(
            cudaMalloc(reinterpret_cast<void **>(&p->merge_count), counts * sizeof(int32_t)),
            "cuda_attention_plan_new: cudaMalloc (split-KV counters)");
        if (rc == 0)
            rc = cuda_call_result(cudaMemset(p->merge_count, 0, counts * sizeof(int32_t)),
                                  "cuda_attention_plan_new: cudaMemset");
        if (rc == 0) /* the memset is on the legacy stream: done before any run */
            rc = cuda_call_result(cudaDeviceSynchronize(),
                                  "cuda_attention_plan_new: cudaDeviceSynchronize");
        if (rc < 0)
            goto fail;
    }
    rc = cuda_call_result(cudaFuncSetAttribute(p->prefill,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)p->prefill_smem),
                          "cuda_attention_plan_new: cudaFuncSetAttribute");
    if (rc < 0)
        goto fail;
    *out = p;
    return 0;

fail:
    cuda_attention_plan_free(p);
    return rc;
}

void cuda_attention_plan_free(struct cuda_attention_plan *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < 2; i++) {
        if (p->staged[i] != NULL) {
            if (p->pending[i])
                (void)cudaEventSynchronize(p->staged[i]);
            (void)cudaEventDestroy(p->staged[i]);
        }
        if (p->staging[i] != NULL)
            (void)cudaFreeHost(p->staging[i]);
    }
    (void)cudaFree(p->meta);
    (void)cudaFree(p->part_out);
    (void)cudaFree(p->part_lse);
    (void)cudaFree(p->merge_count);
    free(p);
}

/* The plan of cuda_attention_plan, or with pad >= batch->num_seqs that of
 * cuda_attention_plan_graph (pad sequences in all, the batch's and padding ones). */
static int plan_impl(struct cuda_attention_plan *p, const struct attention_batch *batch,
                     int32_t pad, cudaStream_t s)
{
    if (p == NULL || batch == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_plan: NULL argument");
    p->planned = false;
    p->graph = pad > 0;
    const struct cuda_attention_config *c = &p->config;
    struct attention_limits limits = {c->block_size, c->num_blocks, c->max_num_seqs,
                                      c->max_num_tokens, c->max_blocks_per_seq};
    int32_t max_context_len = 0;
    int rc = attention_batch_check(&limits, batch, &max_context_len);
    if (rc < 0)
        return rc;

    const int32_t ns = batch->num_seqs;
    if (p->graph) {
        if (pad < ns || pad > c->max_num_seqs || pad > c->max_num_tokens)
            return pagoda_error_set(
                PAGODA_ERANGE,
                "cuda_attention_plan_graph: %d sequences padded to %d (at "
                "most %d)",
                (int)ns, (int)pad,
                (int)(c->max_num_seqs < c->max_num_tokens ? c->max_num_seqs : c->max_num_tokens));
        for (int32_t q = 0; q < ns; q++)
            if (batch->query_start[q + 1] - batch->query_start[q] != 1)
                return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                        "cuda_attention_plan_graph: sequence %d of the step is "
                                        "not a decode (%d tokens)",
                                        (int)q,
                                        (int)(batch->query_start[q + 1] - batch->query_start[q]));
    }
    p->num_seqs = p->graph ? pad : ns;
    p->num_tokens = p->graph ? pad : batch->num_tokens;
    p->num_parts = p->num_merges = p->num_items = 0;
    if (p->num_tokens == 0) {
        p->planned = true;
        return 0;
    }

    /* The staging slot's previous copy must have left it before it is rewritten. */
    const int slot = p->next_slot;
    if (p->pending[slot]) {
        rc = cuda_call_result(cudaEventSynchronize(p->staged[slot]),
                              "cuda_attention_plan: cudaEventSynchronize");
        if (rc < 0)
            return rc;
        p->pending[slot] = false;
    }
    int32_t *h = p->staging[slot];

    /* Layout of this step: tables are as wide as the longest context needs. */
    const int32_t table_stride = (max_context_len + c->block_size - 1) / c->block_size;
    p->table_stride = table_stride > 0 ? table_stride : 1;
    /* A graph plan's layout depends on pad alone: the header, query starts and context lengths
     * of pad sequences, merges, the most partitions pad sequences can have, then the tables. */
    const size_t ps = (size_t)p->num_seqs, graph_parts = ps + (size_t)p->split_extra;
    p->off_query_start = p->graph ? 4 : 0;
    p->off_context_len = align4(p->off_query_start + ps + 1);
    p->off_tables = p->graph ? align4(p->off_context_len + ps) + 4 * ps + 4 * graph_parts
                             : align4(p->off_context_len + ps);
    p->off_merges = p->graph ? align4(p->off_context_len + ps)
                             : align4(p->off_tables + ps * (size_t)p->table_stride);

    memcpy(h + p->off_query_start, batch->query_start, ((size_t)ns + 1) * sizeof(int32_t));
    memcpy(h + p->off_context_len, batch->context_len, (size_t)ns * sizeof(int32_t));
    for (int32_t q = ns; q < p->num_seqs; q++) { /* padding: one key, the reserved block's */
        h[p->off_query_start + (size_t)q + 1] = q + 1;
        h[p->off_context_len + (size_t)q] = 1;
        h[p->off_tables + (size_t)q * (size_t)p->table_stride] = 0;
    }
    int32_t num_decode = 0;
    int64_t decode_keys = 0;
    for (int32_t q = 0; q < ns; q++) {
        const int32_t context_len = batch->context_len[q];
        const int32_t blocks = (context_len + c->block_size - 1) / c->block_size;
        memcpy(h + p->off_tables + (size_t)q * (size_t)p->table_stride,
               batch->block_tables + (size_t)q * (size_t)batch->max_blocks_per_seq,
               (size_t)blocks * sizeof(int32_t));
        if (batch->query_start[q + 1] - batch->query_start[q] == 1) {
            num_decode++;
            decode_keys += context_len;
        }
    }
    p->copy_rows =
        decode_copy_rows(p->copy_rows_set, p->graph ? p->num_seqs : num_decode, c->block_size);
    p->variant = decode_variant(p, p->graph ? p->num_seqs : num_decode);
    /* Partitions are whole tiles of the kernel's width. */
    const int64_t align = p->variant == kDecodeWide ? 16 * kDecodeWideWarps : kSplitAlign;
    const int64_t slots = p->slots[p->variant];

    /* Split-KV: the cheapest of no split and splits sized for 1 .. kSplitWavesMax waves of the
     * resident decode CTAs (split_cost); see the loop below for how a context is cut. */
    const int64_t ctas_per_part = (int64_t)c->num_kv_heads * p->decode_chunks;
    int64_t split = INT64_MAX;
    if (num_decode > 0 && p->split_set > 0) {
        split = (p->split_set + align - 1) / align * align;
    } else if (num_decode > 0) {
        int64_t best = split_cost(batch, split, align, ctas_per_part, slots);
        for (int w = 1; w <= kSplitWavesMax; w++) {
            const int64_t want = split_want(w, slots, ctas_per_part);
            int64_t cand = (decode_keys + want - 1) / want;
            if (cand < kSplitMinTokens)
                cand = kSplitMinTokens;
            cand = (cand + align - 1) / align * align;
            const int64_t cost = split_cost(batch, cand, align, ctas_per_part, slots);
            if (cost < best) {
                best = cost;
                split = cand;
            }
        }
    }
    /* Merges (at most one per decode sequence) come first, then the partitions. */
    p->off_parts = p->off_merges + 4 * (p->graph ? ps : (size_t)num_decode);
    int4 *merges = reinterpret_cast<int4 *>(h + p->off_merges);
    int4 *parts = reinterpret_cast<int4 *>(h + p->off_parts);
    int32_t num_parts = 0, num_merges = 0;
    for (int32_t q = 0; q < ns; q++) {
        if (batch->query_start[q + 1] - batch->query_start[q] != 1)
            continue;
        const int64_t context_len = batch->context_len[q];
        int64_t len;
        const int32_t n = split_parts(context_len, split, align, &len);
        if (num_parts + n > p->max_parts)
            return pagoda_error_set(PAGODA_EINTERNAL,
                                    "cuda_attention_plan: %d split-KV partitions exceed %d",
                                    (int)(num_parts + n), (int)p->max_parts);
        for (int32_t i = 0; i < n; i++) {
            const int64_t begin = i * len;
            const int64_t end = begin + len < context_len ? begin + len : context_len;
            /* begin complemented where the partition holds the newest key (the kernel's
             * early K/V) */
            parts[num_parts + i] = make_int4(q, i == n - 1 ? ~(int)begin : (int)begin, (int)end,
                                             n > 1 ? num_merges : -1);
        }
        if (n > 1)
            merges[num_merges++] = make_int4(q, num_parts, n, 0);
        num_parts += n;
    }
    if (p->graph) {
        /* the grid's partitions: as many as the layout holds for the step's variant (decode_ctas),
         * whose splits aim at its own slots (fewer for CTAs of 8 warps, more for dense ones) */
        const size_t grid_parts = ps + (size_t)p->graph_extra[p->variant];
        if ((size_t)num_parts + ps - (size_t)ns > grid_parts)
            return pagoda_error_set(PAGODA_EINTERNAL,
                                    "cuda_attention_plan_graph: %d split-KV partitions exceed "
                                    "%d",
                                    (int)(num_parts + p->num_seqs - ns), (int)grid_parts);
        for (int32_t q = ns; q < p->num_seqs; q++)
            parts[num_parts++] = make_int4(q, ~0, 1, -1);
        h[0] = num_parts * c->num_kv_heads * p->decode_chunks; /* the decode kernel's header */
        h[1] = p->table_stride;
        h[2] = h[3] = 0;
    }
    /* Prefill tiles, the most keys first (the CTAs start in grid order, the KV head fastest:
     * the longest go first and the short ones fill the last wave, as FlashAttention does for
     * causal prefill). */
    p->off_items = p->graph ? p->off_tables + ps * (size_t)p->table_stride
                            : p->off_parts + 4 * (size_t)num_parts;
    int4 *items = reinterpret_cast<int4 *>(h + p->off_items);
    int32_t num_items = 0;
    for (int32_t q = 0; q < ns; q++) {
        const int32_t query_len = batch->query_start[q + 1] - batch->query_start[q];
        if (query_len == 1)
            continue;
        const int32_t pos0 = batch->context_len[q] - query_len;
        for (int32_t first = 0; first < query_len; first += p->tile_tokens) {
            const int32_t last =
                first + p->tile_tokens < query_len ? first + p->tile_tokens : query_len;
            items[num_items++] = make_int4(q, first, pos0 + last, 0);
        }
    }
    qsort(items, (size_t)num_items, sizeof(int4), item_cmp);
    const size_t words = p->off_items + 4 * (size_t)num_items;

    rc = cuda_call_result(
        cudaMemcpyAsync(p->meta, h, words * sizeof(int32_t), cudaMemcpyHostToDevice, s),
        "cuda_attention_plan: cudaMemcpyAsync");
    if (rc == 0)
        rc = cuda_call_result(cudaEventRecord(p->staged[slot], s),
                              "cuda_attention_plan: cudaEventRecord");
    if (rc < 0)
        return rc;
    p->pending[slot] = true;
    p->next_slot = slot ^ 1;
    p->num_parts = num_parts;
    p->num_merges = num_merges;
    p->num_items = num_items;
    p->planned = true;
    return 0;
}

int cuda_attention_plan(struct cuda_attention_plan *p, const struct attention_batch *batch,
                        cudaStream_t s)
{
    return plan_impl(p, batch, 0, s);
}

int cuda_attention_plan_graph(struct cuda_attention_plan *p, const struct attention_batch *batch,
                              int32_t num_seqs, cudaStream_t s)
{
    if (num_seqs < 1)
        return pagoda_error_set(PAGODA_ERANGE, "cuda_attention_plan_graph: %d sequences",
                                (int)num_seqs);
    return plan_impl(p, batch, num_seqs, s);
}

static int view_check(const struct cuda_attention_config *c, const struct kv_layer_view *kv)
{
    if (kv->dtype != c->kv_dtype || kv->block_size != c->block_size ||
        kv->num_kv_heads != c->num_kv_heads || kv->head_dim != c->head_dim ||
        kv->num_blocks != c->num_blocks)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "cuda_attention_run: the layer view (%s, block_size %d, %d KV "
                                "heads, head_dim %d, %d blocks) differs from the plan (%s, %d, "
                                "%d, %d, %d)",
                                dtype_name(kv->dtype), (int)kv->block_size, (int)kv->num_kv_heads,
                                (int)kv->head_dim, (int)kv->num_blocks, dtype_name(c->kv_dtype),
                                (int)c->block_size, (int)c->num_kv_heads, (int)c->head_dim,
                                (int)c->num_blocks);
    if (kv->k == NULL || kv->v == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run: the layer view has no K/V");
    /* strides of whole 16-byte chunks: 8 bf16 elements, 16 F8E4M3 ones */
    const int64_t chunk = 16 / (int64_t)dtype_size(kv->dtype);
    if (!cuda_aligned16(kv->k) || !cuda_aligned16(kv->v) || kv->block_stride % chunk != 0 ||
        kv->head_stride % chunk != 0 || kv->slot_stride % chunk != 0)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_attention_run: the layer view is not 16-byte aligned "
                                "(strides %lld, %lld, %lld)",
                                (long long)kv->block_stride, (long long)kv->head_stride,
                                (long long)kv->slot_stride);
    return 0;
}

/* The decode kernel's grid for the planned step. */
static unsigned decode_ctas(const struct cuda_attention_plan *p)
{
    const int32_t parts = p->graph ? p->num_seqs + p->graph_extra[p->variant] : p->num_parts;
    return (unsigned)parts * (unsigned)p->config.num_kv_heads * (unsigned)p->decode_chunks;
}

static int launch(const struct cuda_attention_plan *p, const attn_args &a, cudaStream_t s)
{
    const struct cuda_attention_config *c = &p->config;
    /* A graph plan launches the most CTAs its sequences can need (the header says how many have
     * work), so that the launch captured once fits every step of that size. */
    const unsigned ctas = decode_ctas(p);
    if (ctas > 0) {
        const int v = p->copy_rows == 4 ? 0 : p->copy_rows == 8 ? 1 : 2;
        const int threads = 32 * (p->variant == kDecodeWide ? kDecodeWideWarps : kDecodeWarps);
        int rc = launch_pdl("cuda_attention_run: decode kernel", p->decode[p->variant][v], ctas,
                            threads, p->decode_smem[p->variant][v], s, a);
        if (rc < 0)
            return rc;
        cuda_pdl_note_late(a.late);
    }
    if (p->num_items > 0) {
        const unsigned ctas = (unsigned)p->num_items * c->num_kv_heads;
        const kernel_fn prefill = p->prefill;
        prefill<<<ctas, kPrefillThreads, p->prefill_smem, s>>>(a);
        int rc = cuda_launch_result("cuda_attention_run: prefill kernel");
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int run_impl(struct cuda_attention_plan *p, const struct kv_layer_view *kv,
                    const uint16_t *q, int64_t q_row_stride, uint16_t *out,
                    const struct cuda_attention_rope *rope, cudaStream_t s)
{
    if (p == NULL || kv == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run: NULL plan or view");
    if (!p->planned)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run: no batch planned");
    const struct cuda_attention_config *c = &p->config;
    int rc = view_check(c, kv);
    if (rc < 0)
        return rc;
    if (p->num_tokens == 0)
        return 0;
    if (q == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run: NULL q or out");
    if (!cuda_aligned16(q) || !cuda_aligned16(out) || q_row_stride % 8 != 0 ||
        q_row_stride < (int64_t)c->num_heads * c->head_dim)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_attention_run: q and out must be 16-byte aligned and "
                                "q_row_stride (%lld) a multiple of 8, at least %d",
                                (long long)q_row_stride, (int)(c->num_heads * c->head_dim));

    attn_args a;
    a.k = static_cast<const uint16_t *>(kv->k);
    a.v = static_cast<const uint16_t *>(kv->v);
    a.block_stride = kv->block_stride;
    a.head_stride = kv->head_stride;
    a.slot_stride = kv->slot_stride;
    a.block_size = c->block_size;
    a.block_shift = -1;
    for (int sh = 0; sh < 7; sh++)
        if (c->block_size == 1 << sh)
            a.block_shift = sh;
    a.num_heads = c->num_heads;
    a.num_kv_heads = c->num_kv_heads;
    a.group = p->group;
    a.scale = c->scale;
    a.q = q;
    a.q_row_stride = q_row_stride;
    a.out = out;
    a.query_start = p->meta + p->off_query_start;
    a.context_len = p->meta + p->off_context_len;
    a.block_tables = p->meta + p->off_tables;
    a.table_stride = p->table_stride;
    a.dparts = reinterpret_cast<const int4 *>(p->meta + p->off_parts);
    a.merges = reinterpret_cast<const int4 *>(p->meta + p->off_merges);
    a.pitems = reinterpret_cast<const int4 *>(p->meta + p->off_items);
    a.decode_chunks = p->decode_chunks;
    a.tile_tokens = p->tile_tokens;
    a.part_out = p->part_out;
    a.part_lse = p->part_lse;
    a.merge_count = p->merge_count;
    a.graph_hdr = p->graph ? p->meta : nullptr;
    a.early_kv = p->early_kv;
    a.late = cuda_pdl_late_wanted();
    a.rope = rope != NULL;
    a.num_blocks = c->num_blocks;
    a.rope_pos = rope != NULL ? rope->positions : nullptr;
    a.rope_inv_freq = rope != NULL ? rope->inv_freq : nullptr;
    a.rope_slots = rope != NULL ? rope->slot_mapping : nullptr;
    if (rope != NULL) {
        if (p->num_items > 0)
            return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                    "cuda_attention_run_rope: the step has prefill tokens");
        if (rope->positions == NULL || rope->inv_freq == NULL || rope->slot_mapping == NULL)
            return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run_rope: NULL rope buffer");
        if (q_row_stride < (int64_t)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "cuda_attention_run_rope: q_row_stride %lld holds no K and V "
                                    "after the %d query heads",
                                    (long long)q_row_stride, (int)c->num_heads);
    }
    return launch(p, a, s);
}

int cuda_attention_run(struct cuda_attention_plan *p, const struct kv_layer_view *kv,
                       const uint16_t *q, int64_t q_row_stride, uint16_t *out, cudaStream_t s)
{
    return run_impl(p, kv, q, q_row_stride, out, NULL, s);
}

int cuda_attention_run_rope(struct cuda_attention_plan *p, const struct kv_layer_view *kv,
                            const uint16_t *qkv, int64_t row_stride,
                            const struct cuda_attention_rope *rope, uint16_t *out, cudaStream_t s)
{
    if (rope == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run_rope: NULL rope");
    return run_impl(p, kv, qkv, row_stride, out, rope, s);
}

int cuda_attention_planned_decode_only(const struct cuda_attention_plan *p)
{
    return p != NULL && p->planned && p->num_items == 0;
}

void cuda_attention_set_early_kv(struct cuda_attention_plan *p, int on)
{
    if (p != NULL)
        p->early_kv = on != 0;
}

void cuda_attention_set_decode_copy_rows(struct cuda_attention_plan *p, int rows)
{
    if (p != NULL && (rows == 0 || rows == 4 || rows == 8 || rows == 16))
        p->copy_rows_set = rows;
}

void cuda_attention_set_decode_warps(struct cuda_attention_plan *p, int warps)
{
    if (p != NULL && (warps == 0 || warps == kDecodeWarps || warps == kDecodeWideWarps))
        p->warps_set = warps;
}

void cuda_attention_set_decode_ctas(struct cuda_attention_plan *p, int ctas)
{
    if (p != NULL && (ctas == 0 || ctas == 2 || ctas == 3))
        p->ctas_set = ctas;
}

void cuda_attention_set_decode_split(struct cuda_attention_plan *p, int32_t keys)
{
    if (p != NULL && keys >= 0 &&
        (keys == 0 || (keys >= kSplitMinTokens && keys % kSplitAlign == 0)))
        p->split_set = keys;
}

int cuda_attention_decode_shape(const struct cuda_attention_plan *p, int32_t *ctas,
                                int32_t *partitions)
{
    if (p == NULL || ctas == NULL || partitions == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_decode_shape: NULL argument");
    if (!p->planned)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_decode_shape: no batch planned");
    *ctas = (int32_t)decode_ctas(p);
    *partitions = p->num_parts;
    return 0;
}
