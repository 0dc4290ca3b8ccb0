/* The prefill kernel of kernels/cuda/attention.cu's plan (causal, FlashAttention-2 style, on the
 * tensor cores: one CTA per tile of 128 query rows and KV head, K/V tiles by a cp.async pipeline
 * through the block table), and its table (prefill_kernel_of). */
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_impl.cuh"

#include <math.h>

#include <type_traits>

namespace attn
{
namespace
{

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

/* The element offset of 16-byte chunk c of row r in a shared-memory tile of rows of HD bf16:
 * chunks are XOR-swizzled by r % 8, so that the 8 rows an ldmatrix reads at one logical column
 * fall in 8 different bank groups. */
template <int HD> __device__ __forceinline__ int swz(int r, int c)
{
    return r * HD + ((c ^ (r & 7)) << 3);
}

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

} // namespace

void prefill_kernel_of(int hd, bool f8, kernel_fn *fn, size_t *smem)
{
    if (hd == 64) {
        *fn = f8 ? prefill_kernel<64, true> : prefill_kernel<64, false>;
        *smem = f8 ? prefill_geom<64, true>::smem : prefill_geom<64, false>::smem;
    } else {
        *fn = f8 ? prefill_kernel<128, true> : prefill_kernel<128, false>;
        *smem = f8 ? prefill_geom<128, true>::smem : prefill_geom<128, false>::smem;
    }
}

} // namespace attn
