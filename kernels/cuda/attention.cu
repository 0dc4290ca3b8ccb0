/* Paged attention on the GPU: the plan (host validation, decode/prefill split, split-KV
 * partition, one asynchronous metadata copy) and the run (a decode kernel, a merge kernel for
 * split decode contexts, a prefill kernel), all reading K/V in place through the block table.
 *
 * Both kernels keep, per query row, a running max m, a running sum l of exp(score - m) and an
 * f32 accumulator of the exp-weighted V, as the CPU's paged version does; K/V tiles of 64 keys
 * are staged in shared memory with 16-byte loads, and keys beyond a row's causal limit (or
 * beyond the context) get probability 0 and are never read from the pool. Arithmetic is plain
 * FMA in f32; tensor cores are the next step. */
#include "kernels/cuda/attention.h"

#include "kernels/attention_batch.h"
#include "kernels/cuda/common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

namespace
{

/* Decode: one CTA of 128 threads per (decode partition, KV head, chunk of at most 8 query
 * heads of that KV head). */
constexpr int kDecodeThreads = 128;
constexpr int kDecodeTile = 64;    /* keys per shared-memory tile */
constexpr int kDecodeHeadsMax = 8; /* query heads per decode CTA */

/* Prefill: one CTA of 256 threads per (tile of query rows, KV head); a row is one (query
 * token, query head of the KV head), 64 rows per tile. */
constexpr int kPrefillThreads = 256;
constexpr int kPrefillRows = 64;
constexpr int kPrefillKeys = 64;        /* keys per shared-memory tile */
constexpr int kPrefillScoreStride = 80; /* floats per score row: 64 + 16 against bank conflicts */

/* Query heads per KV head the kernels accept (one prefill tile must hold a token's heads). */
constexpr int kGroupMax = kPrefillRows;

/* Split-KV: decode contexts are split when fewer than kDecodeCtasPerSm CTAs per SM would run,
 * into partitions of at least kSplitMinTokens keys (a multiple of kDecodeTile). */
constexpr int kDecodeCtasPerSm = 2;
constexpr int kSplitMinTokens = 256;

/* Everything a kernel needs, passed by value. Metadata pointers point into the plan's device
 * buffer. */
struct attn_args {
    const uint16_t *k, *v; /* the pool's layer */
    int64_t block_stride, head_stride, slot_stride;
    int32_t block_size;
    int32_t num_heads, num_kv_heads, group;
    float scale;
    const uint16_t *q;
    int64_t q_row_stride;
    uint16_t *out;
    const int32_t *query_start, *context_len, *block_tables;
    int32_t table_stride;
    const int4 *dparts;    /* decode partitions: sequence, first key, end key, merge index or -1 */
    const int4 *merges;    /* split sequences: sequence, first partition, partitions, unused */
    const int2 *pitems;    /* prefill tiles: sequence, first query token (within the sequence) */
    int32_t decode_chunks; /* CTAs sharing the query heads of one KV head in decode */
    int32_t tile_tokens;   /* query tokens per prefill tile: kPrefillRows / group */
    float *part_out;       /* [partition][num_heads][head_dim], normalised */
    float *part_lse;       /* [partition][num_heads] */
};

/* The pool offset (elements) of key pos of a sequence for KV head kh. */
__device__ __forceinline__ int64_t key_offset(const attn_args &a, const int32_t *table, int32_t pos,
                                              int32_t kh)
{
    const int32_t b = pos / a.block_size;
    const int32_t slot = pos - b * a.block_size;
    return (int64_t)table[b] * a.block_stride + (int64_t)kh * a.head_stride +
           (int64_t)slot * a.slot_stride;
}

/* ---- decode ---- */

template <int HD> __global__ void __launch_bounds__(kDecodeThreads) decode_kernel(attn_args a)
{
    constexpr int W = HD / 2;  /* bf16 pairs per vector */
    constexpr int KS = W + 1;  /* K row stride in words: odd, so a column read is conflict-free */
    constexpr int C8 = HD / 8; /* 16-byte chunks per vector */
    constexpr int SCORES = kDecodeHeadsMax * kDecodeTile / kDecodeThreads; /* per thread */
    constexpr int PAIRS = kDecodeHeadsMax * W / kDecodeThreads;            /* per thread */

    __shared__ __align__(16) float qs[kDecodeHeadsMax][HD]; /* read as float2 */
    __shared__ uint32_t ks[kDecodeTile * KS];
    __shared__ __align__(16) uint32_t vs[kDecodeTile * W];
    __shared__ float ps[kDecodeHeadsMax][kDecodeTile];
    __shared__ float row_max[kDecodeHeadsMax], row_sum[kDecodeHeadsMax], row_alpha[kDecodeHeadsMax];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int4 part = a.dparts[blockIdx.x];
    const int32_t kh = blockIdx.y;
    const int32_t heads = (a.group + a.decode_chunks - 1) / a.decode_chunks;
    const int32_t g0 = blockIdx.z * heads;
    const int32_t gc = min(heads, a.group - g0); /* query heads of this CTA */
    if (gc <= 0)
        return;
    const int32_t seq = part.x;
    const int32_t token = a.query_start[seq];
    const int32_t *table = a.block_tables + (int64_t)seq * a.table_stride;
    const int32_t h0 = kh * a.group + g0;

    const uint16_t *qrow = a.q + (int64_t)token * a.q_row_stride + (int64_t)h0 * HD;
    for (int i = tid; i < gc * C8; i += kDecodeThreads) {
        const int g = i / C8, c = i % C8;
        float f[8];
        bf16x8_to_float(__ldg(reinterpret_cast<const uint4 *>(qrow + g * HD + c * 8)), f);
#pragma unroll
        for (int e = 0; e < 8; e++)
            qs[g][c * 8 + e] = f[e];
    }
    if (tid < kDecodeHeadsMax) {
        row_max[tid] = -INFINITY;
        row_sum[tid] = 0.0f;
    }
    float2 acc[PAIRS];
#pragma unroll
    for (int i = 0; i < PAIRS; i++)
        acc[i] = make_float2(0.0f, 0.0f);
    __syncthreads();

    for (int32_t k0 = part.y; k0 < part.z; k0 += kDecodeTile) {
        const int n = min(kDecodeTile, part.z - k0);
        /* K and V of keys k0 .. k0 + n - 1; the rest of the tile is zeros. */
        for (int i = tid; i < kDecodeTile * C8; i += kDecodeThreads) {
            const int r = i / C8, c = i % C8;
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
            if (r < n) {
                const int64_t off = key_offset(a, table, k0 + r, kh) + c * 8;
                kv4 = __ldg(reinterpret_cast<const uint4 *>(a.k + off));
                vv4 = __ldg(reinterpret_cast<const uint4 *>(a.v + off));
            }
            uint32_t *kd = ks + r * KS + c * 4;
            kd[0] = kv4.x;
            kd[1] = kv4.y;
            kd[2] = kv4.z;
            kd[3] = kv4.w;
            *reinterpret_cast<uint4 *>(vs + r * W + c * 4) = vv4;
        }
        __syncthreads();

        /* Scores: thread column j, query heads gs, gs + 2, ... (warp-uniform). */
        {
            const int j = tid % kDecodeTile, gs = tid / kDecodeTile;
            float s[SCORES];
#pragma unroll
            for (int i = 0; i < SCORES; i++)
                s[i] = 0.0f;
            const uint32_t *kr = ks + j * KS;
            for (int w = 0; w < W; w++) {
                const float2 kf = bf16x2_to_float2(kr[w]);
#pragma unroll
                for (int i = 0; i < SCORES; i++) {
                    const int g = gs + i * (kDecodeThreads / kDecodeTile);
                    if (g < gc) {
                        const float2 qf = *reinterpret_cast<const float2 *>(&qs[g][2 * w]);
                        s[i] = fmaf(qf.x, kf.x, s[i]);
                        s[i] = fmaf(qf.y, kf.y, s[i]);
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < SCORES; i++) {
                const int g = gs + i * (kDecodeThreads / kDecodeTile);
                if (g < gc)
                    ps[g][j] = j < n ? s[i] * a.scale : -INFINITY;
            }
        }
        __syncthreads();

        /* Online softmax, one warp per query head. Every tile holds at least one key, so the
         * new max is finite. */
        for (int g = warp; g < gc; g += kDecodeThreads / 32) {
            const float v0 = ps[g][lane], v1 = ps[g][lane + 32];
            const float m_old = row_max[g];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));
            const float p0 = expf(v0 - m_new), p1 = expf(v1 - m_new);
            const float sum = warp_sum(p0 + p1);
            ps[g][lane] = p0;
            ps[g][lane + 32] = p1;
            __syncwarp(); /* every lane has read row_max[g] before lane 0 rewrites it */
            if (lane == 0) {
                const float alpha = expf(m_old - m_new); /* 0 on the first tile */
                row_alpha[g] = alpha;
                row_sum[g] = row_sum[g] * alpha + sum;
                row_max[g] = m_new;
            }
        }
        __syncthreads();

        /* acc = acc * alpha + P V: thread pairs tid, tid + 128, ... of [head][W]. */
#pragma unroll
        for (int i = 0; i < PAIRS; i++) {
            const int pidx = tid + i * kDecodeThreads;
            const int g = pidx / W, w = pidx % W;
            if (g < gc) {
                const float alpha = row_alpha[g];
                float2 o = make_float2(acc[i].x * alpha, acc[i].y * alpha);
                for (int j = 0; j < n; j++) {
                    const float p = ps[g][j];
                    const float2 vf = bf16x2_to_float2(vs[j * W + w]);
                    o.x = fmaf(p, vf.x, o.x);
                    o.y = fmaf(p, vf.y, o.y);
                }
                acc[i] = o;
            }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < PAIRS; i++) {
        const int pidx = tid + i * kDecodeThreads;
        const int g = pidx / W, w = pidx % W;
        if (g >= gc)
            continue;
        const int32_t h = h0 + g;
        const float l = row_sum[g];
        const float ox = acc[i].x / l, oy = acc[i].y / l;
        if (part.w < 0) {
            uint16_t *o = a.out + (int64_t)token * a.num_heads * HD + (int64_t)h * HD;
            reinterpret_cast<uint32_t *>(o)[w] = float2_to_bf16x2(ox, oy);
        } else {
            const int64_t row = (int64_t)blockIdx.x * a.num_heads + h;
            reinterpret_cast<float2 *>(a.part_out + row * HD)[w] = make_float2(ox, oy);
            if (w == 0)
                a.part_lse[row] = row_max[g] + logf(l);
        }
    }
}

/* Merges the partitions of one split decode sequence for one query head: each partition's
 * normalised output weighted by its share of the exp mass, exp(lse_p - max lse). */
template <int HD> __global__ void merge_kernel(attn_args a)
{
    const int4 m = a.merges[blockIdx.x];
    const int32_t h = blockIdx.y;
    const int32_t token = a.query_start[m.x];
    float mx = -INFINITY;
    for (int p = 0; p < m.z; p++)
        mx = fmaxf(mx, a.part_lse[(int64_t)(m.y + p) * a.num_heads + h]);
    for (int w = threadIdx.x; w < HD / 2; w += blockDim.x) {
        float ox = 0.0f, oy = 0.0f, total = 0.0f;
        for (int p = 0; p < m.z; p++) {
            const int64_t row = (int64_t)(m.y + p) * a.num_heads + h;
            const float wt = expf(a.part_lse[row] - mx);
            const float2 o = reinterpret_cast<const float2 *>(a.part_out + row * HD)[w];
            total += wt;
            ox = fmaf(wt, o.x, ox);
            oy = fmaf(wt, o.y, oy);
        }
        uint16_t *o = a.out + (int64_t)token * a.num_heads * HD + (int64_t)h * HD;
        reinterpret_cast<uint32_t *>(o)[w] = float2_to_bf16x2(ox / total, oy / total);
    }
}

/* ---- prefill ---- */

template <int HD> struct prefill_smem {
    static constexpr int W = HD / 2;
    static constexpr int KS = W + 1;  /* K row stride in words (odd) */
    static constexpr int QS = HD + 2; /* Q row stride in floats: two rows per warp, no conflict */
    static constexpr size_t vs = 0;   /* uint32 [keys][W], 16-byte aligned */
    static constexpr size_t ks = vs + sizeof(uint32_t) * kPrefillKeys * W;
    static constexpr size_t qs = ks + sizeof(uint32_t) * kPrefillKeys * KS;
    static constexpr size_t ps = qs + sizeof(float) * kPrefillRows * QS;
    static constexpr size_t stats = ps + sizeof(float) * kPrefillRows * kPrefillScoreStride;
    static constexpr size_t bytes = stats + sizeof(float) * 4 * kPrefillRows;
};

template <int HD> __global__ void __launch_bounds__(kPrefillThreads) prefill_kernel(attn_args a)
{
    using L = prefill_smem<HD>;
    constexpr int W = L::W, KS = L::KS, QS = L::QS, PS = kPrefillScoreStride;
    constexpr int C8 = HD / 8;
    constexpr int PAIRS = W / 16; /* column pairs per thread in P V */
    extern __shared__ __align__(16) unsigned char smem[];
    uint32_t *vs = reinterpret_cast<uint32_t *>(smem + L::vs);
    uint32_t *ks = reinterpret_cast<uint32_t *>(smem + L::ks);
    float *qs = reinterpret_cast<float *>(smem + L::qs);
    float *ps = reinterpret_cast<float *>(smem + L::ps);
    float *row_max = reinterpret_cast<float *>(smem + L::stats);
    float *row_sum = row_max + kPrefillRows;
    float *row_alpha = row_sum + kPrefillRows;
    int32_t *row_pos = reinterpret_cast<int32_t *>(row_alpha + kPrefillRows);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int tx = tid % 16, ty = tid / 16;
    const int2 item = a.pitems[blockIdx.x];
    const int32_t kh = blockIdx.y;
    const int32_t seq = item.x, first = item.y;
    const int32_t q0 = a.query_start[seq];
    const int32_t query_len = a.query_start[seq + 1] - q0;
    const int32_t context_len = a.context_len[seq];
    const int32_t ntok = min(a.tile_tokens, query_len - first);
    const int32_t rows = ntok * a.group;
    const int32_t pos0 = context_len - query_len + first; /* position of the tile's token 0 */
    const int32_t key_end = pos0 + ntok;                  /* one past the last key needed */
    const int32_t *table = a.block_tables + (int64_t)seq * a.table_stride;

    /* Q rows: row r is token r / group of the tile, query head kh * group + r % group. */
    for (int i = tid; i < kPrefillRows * C8; i += kPrefillThreads) {
        const int r = i / C8, c = i % C8;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (r < rows) {
            const int32_t t = q0 + first + r / a.group;
            const int32_t h = kh * a.group + r % a.group;
            const uint16_t *src = a.q + (int64_t)t * a.q_row_stride + (int64_t)h * HD + c * 8;
            bf16x8_to_float(__ldg(reinterpret_cast<const uint4 *>(src)), f);
        }
#pragma unroll
        for (int e = 0; e < 8; e++)
            qs[r * QS + c * 8 + e] = f[e];
    }
    if (tid < kPrefillRows) {
        row_max[tid] = -INFINITY;
        row_sum[tid] = 0.0f;
        row_pos[tid] = tid < rows ? pos0 + tid / a.group : -1;
    }
    float2 acc[4][PAIRS];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < PAIRS; j++)
            acc[i][j] = make_float2(0.0f, 0.0f);
    __syncthreads();

    for (int32_t k0 = 0; k0 < key_end; k0 += kPrefillKeys) {
        const int n = min(kPrefillKeys, key_end - k0);
        for (int i = tid; i < kPrefillKeys * C8; i += kPrefillThreads) {
            const int r = i / C8, c = i % C8;
            uint4 kv4 = make_uint4(0, 0, 0, 0), vv4 = make_uint4(0, 0, 0, 0);
            if (r < n) {
                const int64_t off = key_offset(a, table, k0 + r, kh) + c * 8;
                kv4 = __ldg(reinterpret_cast<const uint4 *>(a.k + off));
                vv4 = __ldg(reinterpret_cast<const uint4 *>(a.v + off));
            }
            uint32_t *kd = ks + r * KS + c * 4;
            kd[0] = kv4.x;
            kd[1] = kv4.y;
            kd[2] = kv4.z;
            kd[3] = kv4.w;
            *reinterpret_cast<uint4 *>(vs + r * W + c * 4) = vv4;
        }
        __syncthreads();

        /* S = Q K^T * scale on a 4 x 4 micro-tile: rows ty + 16 i, keys tx + 16 j. */
        {
            float s[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    s[i][j] = 0.0f;
            for (int w = 0; w < W; w++) {
                float2 qf[4], kf[4];
#pragma unroll
                for (int i = 0; i < 4; i++)
                    qf[i] = *reinterpret_cast<const float2 *>(qs + (ty + 16 * i) * QS + 2 * w);
#pragma unroll
                for (int j = 0; j < 4; j++)
                    kf[j] = bf16x2_to_float2(ks[(tx + 16 * j) * KS + w]);
#pragma unroll
                for (int i = 0; i < 4; i++)
#pragma unroll
                    for (int j = 0; j < 4; j++) {
                        s[i][j] = fmaf(qf[i].x, kf[j].x, s[i][j]);
                        s[i][j] = fmaf(qf[i].y, kf[j].y, s[i][j]);
                    }
            }
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int r = ty + 16 * i;
                const int32_t limit = row_pos[r]; /* causal: keys 0 .. limit */
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int c = tx + 16 * j;
                    ps[r * PS + c] = k0 + c <= limit ? s[i][j] * a.scale : -INFINITY;
                }
            }
        }
        __syncthreads();

        /* Online softmax, one warp per 8 rows. A row may have no key in this tile (its token
         * precedes the tile), or none at all (a padding row): then nothing changes. */
        for (int rr = 0; rr < kPrefillRows / (kPrefillThreads / 32); rr++) {
            const int r = warp * (kPrefillRows / (kPrefillThreads / 32)) + rr;
            const float v0 = ps[r * PS + lane], v1 = ps[r * PS + lane + 32];
            const float m_old = row_max[r];
            const float m_new = fmaxf(m_old, warp_max(fmaxf(v0, v1)));
            float p0 = 0.0f, p1 = 0.0f, alpha = 1.0f;
            if (m_new != -INFINITY) {
                p0 = expf(v0 - m_new);
                p1 = expf(v1 - m_new);
                alpha = expf(m_old - m_new);
            }
            const float sum = warp_sum(p0 + p1);
            ps[r * PS + lane] = p0;
            ps[r * PS + lane + 32] = p1;
            __syncwarp(); /* every lane has read row_max[r] before lane 0 rewrites it */
            if (lane == 0) {
                row_alpha[r] = alpha;
                row_sum[r] = row_sum[r] * alpha + sum;
                row_max[r] = m_new;
            }
        }
        __syncthreads();

        /* acc = acc * alpha + P V: rows ty + 16 i, column pairs tx + 16 j. */
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float alpha = row_alpha[ty + 16 * i];
#pragma unroll
            for (int j = 0; j < PAIRS; j++) {
                acc[i][j].x *= alpha;
                acc[i][j].y *= alpha;
            }
        }
        for (int c = 0; c < n; c++) {
            float p[4];
            float2 vf[PAIRS];
#pragma unroll
            for (int i = 0; i < 4; i++)
                p[i] = ps[(ty + 16 * i) * PS + c];
#pragma unroll
            for (int j = 0; j < PAIRS; j++)
                vf[j] = bf16x2_to_float2(vs[c * W + tx + 16 * j]);
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < PAIRS; j++) {
                    acc[i][j].x = fmaf(p[i], vf[j].x, acc[i][j].x);
                    acc[i][j].y = fmaf(p[i], vf[j].y, acc[i][j].y);
                }
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = ty + 16 * i;
        if (r >= rows)
            continue;
        const int32_t t = q0 + first + r / a.group;
        const int32_t h = kh * a.group + r % a.group;
        const float l = row_sum[r];
        uint32_t *o =
            reinterpret_cast<uint32_t *>(a.out + (int64_t)t * a.num_heads * HD + (int64_t)h * HD);
#pragma unroll
        for (int j = 0; j < PAIRS; j++)
            o[tx + 16 * j] = float2_to_bf16x2(acc[i][j].x / l, acc[i][j].y / l);
    }
}

/* Rounds a word count up to a multiple of 4, so that int4 arrays stay 16-byte aligned. */
size_t align4(size_t words)
{
    return (words + 3) & ~(size_t)3;
}

} // namespace

struct cuda_attention_plan {
    struct cuda_attention_config config;
    int32_t group;         /* query heads per KV head */
    int32_t decode_chunks; /* decode CTAs per KV head: ceil(group / kDecodeHeadsMax) */
    int32_t tile_tokens;   /* query tokens per prefill tile */
    int32_t target_ctas;   /* decode CTAs wanted before contexts are split */
    int32_t max_parts;     /* decode partitions the scratch holds */

    /* Metadata: packed per step into pinned staging (two slots, each guarded by an event
     * recorded after its copy), then one copy into the device buffer. */
    size_t meta_words;
    int32_t *staging[2];
    cudaEvent_t staged[2];
    bool pending[2];
    int next_slot;
    int32_t *meta;
    float *part_out, *part_lse;

    /* The planned step. */
    bool planned;
    int32_t num_seqs, num_tokens, table_stride;
    int32_t num_parts, num_merges, num_items;
    size_t off_query_start, off_context_len, off_tables, off_merges, off_parts, off_items;
};

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
    struct attention_limits limits = {c->block_size, c->num_blocks, c->max_num_seqs,
                                      c->max_num_tokens, c->max_blocks_per_seq};
    int rc = attention_limits_check(&limits);
    if (rc < 0)
        return rc;
    if (c->head_dim != 64 && c->head_dim != 128)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuda attention: head_dim %d (the kernels take 64 or 128)",
                                (int)c->head_dim);
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
    rc = cuda_call_result(cudaGetDevice(&dev), "cuda_attention_plan_new: cudaGetDevice");
    if (rc == 0)
        rc = cuda_call_result(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev),
                              "cuda_attention_plan_new: cudaDeviceGetAttribute");
    if (rc < 0)
        return rc;

    struct cuda_attention_plan *p =
        static_cast<struct cuda_attention_plan *>(calloc(1, sizeof(*p)));
    if (p == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "cuda_attention_plan_new: plan");
    p->config = *c;
    p->group = c->num_heads / c->num_kv_heads;
    p->decode_chunks = (p->group + kDecodeHeadsMax - 1) / kDecodeHeadsMax;
    p->tile_tokens = kPrefillRows / p->group;
    p->target_ctas = kDecodeCtasPerSm * (sms > 0 ? sms : 1);
    const int32_t ctas_per_part = c->num_kv_heads * p->decode_chunks;
    /* At most one partition per sequence, plus the extra ones a split adds (see plan). */
    p->max_parts = c->max_num_seqs + (p->target_ctas + ctas_per_part - 1) / ctas_per_part + 1;

    /* Words of one step's metadata at its largest (int32 sizes: no overflow in uint64). */
    const uint64_t seqs = (uint64_t)c->max_num_seqs;
    const uint64_t words = align4(seqs + 1) + align4(seqs) +
                           align4(seqs * (uint64_t)c->max_blocks_per_seq) + 4 * seqs +
                           4 * (uint64_t)p->max_parts + align4(2 * (uint64_t)c->max_num_tokens);
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
    if (c->head_dim == 64)
        rc = cuda_call_result(cudaFuncSetAttribute(prefill_kernel<64>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)prefill_smem<64>::bytes),
                              "cuda_attention_plan_new: cudaFuncSetAttribute");
    else
        rc = cuda_call_result(cudaFuncSetAttribute(prefill_kernel<128>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)prefill_smem<128>::bytes),
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
    free(p);
}

int cuda_attention_plan(struct cuda_attention_plan *p, const struct attention_batch *batch,
                        cudaStream_t s)
{
    if (p == NULL || batch == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_plan: NULL argument");
    p->planned = false;
    const struct cuda_attention_config *c = &p->config;
    struct attention_limits limits = {c->block_size, c->num_blocks, c->max_num_seqs,
                                      c->max_num_tokens, c->max_blocks_per_seq};
    int32_t max_context_len = 0;
    int rc = attention_batch_check(&limits, batch, &max_context_len);
    if (rc < 0)
        return rc;

    const int32_t ns = batch->num_seqs;
    p->num_seqs = ns;
    p->num_tokens = batch->num_tokens;
    p->num_parts = p->num_merges = p->num_items = 0;
    if (batch->num_tokens == 0) {
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
    p->off_query_start = 0;
    p->off_context_len = align4(p->off_query_start + (size_t)ns + 1);
    p->off_tables = align4(p->off_context_len + (size_t)ns);
    p->off_merges = align4(p->off_tables + (size_t)ns * (size_t)p->table_stride);

    memcpy(h + p->off_query_start, batch->query_start, ((size_t)ns + 1) * sizeof(int32_t));
    memcpy(h + p->off_context_len, batch->context_len, (size_t)ns * sizeof(int32_t));
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

    /* Split-KV: with too few decode CTAs to fill the GPU, cut the contexts into partitions of
     * split keys, sized so that all decode contexts together make about target_ctas CTAs.
     * Partitions then number at most target / ctas_per_part + num_decode < max_parts. */
    const int64_t ctas_per_part = (int64_t)c->num_kv_heads * p->decode_chunks;
    int64_t split = INT32_MAX;
    if (num_decode > 0 && (int64_t)num_decode * ctas_per_part < p->target_ctas) {
        const int64_t want = (p->target_ctas + ctas_per_part - 1) / ctas_per_part;
        split = (decode_keys + want - 1) / want;
        if (split < kSplitMinTokens)
            split = kSplitMinTokens;
        split = (split + kDecodeTile - 1) / kDecodeTile * kDecodeTile;
    }
    /* Merges (at most one per decode sequence) come first, then the partitions. */
    p->off_parts = p->off_merges + 4 * (size_t)num_decode;
    int4 *merges = reinterpret_cast<int4 *>(h + p->off_merges);
    int4 *parts = reinterpret_cast<int4 *>(h + p->off_parts);
    int32_t num_parts = 0, num_merges = 0;
    for (int32_t q = 0; q < ns; q++) {
        if (batch->query_start[q + 1] - batch->query_start[q] != 1)
            continue;
        const int64_t context_len = batch->context_len[q];
        const int32_t n = (int32_t)((context_len + split - 1) / split);
        if (num_parts + n > p->max_parts)
            return pagoda_error_set(PAGODA_EINTERNAL,
                                    "cuda_attention_plan: %d split-KV partitions exceed %d",
                                    (int)(num_parts + n), (int)p->max_parts);
        for (int32_t i = 0; i < n; i++) {
            const int64_t begin = i * split;
            const int64_t end = begin + split < context_len ? begin + split : context_len;
            parts[num_parts + i] = make_int4(q, (int)begin, (int)end, n > 1 ? num_merges : -1);
        }
        if (n > 1)
            merges[num_merges++] = make_int4(q, num_parts, n, 0);
        num_parts += n;
    }
    p->off_items = p->off_parts + 4 * (size_t)num_parts;
    int2 *items = reinterpret_cast<int2 *>(h + p->off_items);
    int32_t num_items = 0;
    for (int32_t q = 0; q < ns; q++) {
        const int32_t query_len = batch->query_start[q + 1] - batch->query_start[q];
        if (query_len == 1)
            continue;
        for (int32_t first = 0; first < query_len; first += p->tile_tokens)
            items[num_items++] = make_int2(q, first);
    }
    const size_t words = p->off_items + 2 * (size_t)num_items;

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

static int view_check(const struct cuda_attention_config *c, const struct kv_layer_view *kv)
{
    if (kv->dtype != DTYPE_BF16 || kv->block_size != c->block_size ||
        kv->num_kv_heads != c->num_kv_heads || kv->head_dim != c->head_dim ||
        kv->num_blocks != c->num_blocks)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "cuda_attention_run: the layer view (%s, block_size %d, %d KV "
                                "heads, head_dim %d, %d blocks) differs from the plan (BF16, %d, "
                                "%d, %d, %d)",
                                dtype_name(kv->dtype), (int)kv->block_size, (int)kv->num_kv_heads,
                                (int)kv->head_dim, (int)kv->num_blocks, (int)c->block_size,
                                (int)c->num_kv_heads, (int)c->head_dim, (int)c->num_blocks);
    if (kv->k == NULL || kv->v == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run: the layer view has no K/V");
    if (!cuda_aligned16(kv->k) || !cuda_aligned16(kv->v) || kv->block_stride % 8 != 0 ||
        kv->head_stride % 8 != 0 || kv->slot_stride % 8 != 0)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_attention_run: the layer view is not 16-byte aligned "
                                "(strides %lld, %lld, %lld)",
                                (long long)kv->block_stride, (long long)kv->head_stride,
                                (long long)kv->slot_stride);
    return 0;
}

template <int HD>
static int launch(const struct cuda_attention_plan *p, const attn_args &a, cudaStream_t s)
{
    const struct cuda_attention_config *c = &p->config;
    if (p->num_parts > 0) {
        dim3 grid(p->num_parts, c->num_kv_heads, p->decode_chunks);
        decode_kernel<HD><<<grid, kDecodeThreads, 0, s>>>(a);
        int rc = cuda_launch_result("cuda_attention_run: decode kernel");
        if (rc < 0)
            return rc;
    }
    if (p->num_merges > 0) {
        dim3 grid(p->num_merges, c->num_heads);
        merge_kernel<HD><<<grid, HD / 2, 0, s>>>(a);
        int rc = cuda_launch_result("cuda_attention_run: merge kernel");
        if (rc < 0)
            return rc;
    }
    if (p->num_items > 0) {
        dim3 grid(p->num_items, c->num_kv_heads);
        prefill_kernel<HD><<<grid, kPrefillThreads, prefill_smem<HD>::bytes, s>>>(a);
        int rc = cuda_launch_result("cuda_attention_run: prefill kernel");
        if (rc < 0)
            return rc;
    }
    return 0;
}

int cuda_attention_run(struct cuda_attention_plan *p, const struct kv_layer_view *kv,
                       const uint16_t *q, int64_t q_row_stride, uint16_t *out, cudaStream_t s)
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
    a.pitems = reinterpret_cast<const int2 *>(p->meta + p->off_items);
    a.decode_chunks = p->decode_chunks;
    a.tile_tokens = p->tile_tokens;
    a.part_out = p->part_out;
    a.part_lse = p->part_lse;
    return c->head_dim == 64 ? launch<64>(p, a, s) : launch<128>(p, a, s);
}
