/* The attention kernels' shared part (kernels/cuda/attention.cu's plan and run, the decode kernel
 * of attention_decode.cu, the prefill kernel of attention_prefill.cu): the constants of their
 * geometry, which the plan sizes its grids and splits by; the arguments every kernel takes
 * (attn_args); the device helpers both kernels use; and the tables through which the plan reaches
 * each file's kernels (kernel pointers and their shared memory), so that a kernel compiles in the
 * file that holds it. Internal to those three files. */
#ifndef PAGODA_KERNELS_CUDA_ATTENTION_IMPL_CUH
#define PAGODA_KERNELS_CUDA_ATTENTION_IMPL_CUH

#include "kernels/attention_batch.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/common.cuh"

#include <stddef.h>
#include <stdint.h>

namespace attn
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

using kernel_fn = void (*)(attn_args);

/* The decode kernel's variants: kDecodeNarrow (CTAs of kDecodeWarps, two an SM at head dim 128,
 * three at 64), kDecodeWide (kDecodeWideWarps) and kDecodeDense (kDecodeWarps, three an SM:
 * decode_geom's DENSE, F8 at head dim 128 only; elsewhere the plan's kernels of that index are
 * the narrow ones and never chosen). Only DENSE passes __launch_bounds__ a minimum of CTAs an
 * SM: a minimum of 1 for the others let ptxas take 236 registers a thread (from 140 at head dim
 * 64: two CTAs an SM where shared memory allows three; the thirty-sixth session's review). */
enum { kDecodeNarrow = 0, kDecodeWide = 1, kDecodeDense = 2, kDecodeVariants = 3 };

/* The decode kernels of head dimension hd (64 or 128) and an F8E4M3 pool (f8) or a bf16 one, per
 * variant (kDecodeNarrow, kDecodeWide, kDecodeDense; the dense one is decode_geom's DENSE only
 * where *has_dense says so, else the narrow one again) and copies of 4, 8 and 16 rows, with their
 * shared memory (attention_decode.cu). */
void decode_kernels(int hd, bool f8, kernel_fn fn[kDecodeVariants][3],
                    size_t smem[kDecodeVariants][3], bool *has_dense);

/* The prefill kernel of head dimension hd and a bf16 or F8E4M3 (f8) pool, and its shared memory
 * (attention_prefill.cu). */
void prefill_kernel_of(int hd, bool f8, kernel_fn *fn, size_t *smem);

} // namespace attn

#endif
