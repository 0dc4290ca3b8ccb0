/* The decode kernel of kernels/cuda/attention.cu's plan (split-KV flash decoding on the tensor
 * cores, one CTA per decode partition, KV head and chunk of its query heads, K/V tiles by bulk
 * copies through the block table) with the merge of a split sequence's partitions, which the last
 * of its CTAs does, and the table of its variants (decode_kernels). */
#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/attention_impl.cuh"

#include <math.h>

namespace attn
{
namespace
{

/* Partitions whose partial results the merge loads at once: 32, so that the 32 partitions of
 * one 32k-token sequence at batch 1 come through L2 in one round trip (ncu on the H200: the
 * merge took ~3.4 of 42 us with 8 at a time, ~2.9 with 32; bench/RESULTS.md). The decode
 * kernel's registers rise without costing occupancy, which shared memory limits to 2 and 3 CTAs
 * per SM (174-181 registers at head dim 128, 140 at 64, thirty-sixth session; the dense variant,
 * bound to 3 CTAs at head dim 128 by its registers, 168 with a few spilled). */
constexpr int kMergeBatch = 32;

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

/* The kernels of head dimension HD and a bf16 (F8 false) or F8E4M3 pool, per variant. */
template <int HD, bool F8>
void decode_set(kernel_fn fn[kDecodeVariants][3], size_t smem[kDecodeVariants][3], bool *has_dense)
{
    decode_variants<HD, kDecodeWarps, F8>(fn[kDecodeNarrow], smem[kDecodeNarrow]);
    decode_variants<HD, kDecodeWideWarps, F8>(fn[kDecodeWide], smem[kDecodeWide]);
    *has_dense = F8 && HD == 128;
    decode_variants<HD, kDecodeWarps, F8, F8 && HD == 128>(fn[kDecodeDense], smem[kDecodeDense]);
}

} // namespace

void decode_kernels(int hd, bool f8, kernel_fn fn[kDecodeVariants][3],
                    size_t smem[kDecodeVariants][3], bool *has_dense)
{
    if (hd == 64)
        f8 ? decode_set<64, true>(fn, smem, has_dense) : decode_set<64, false>(fn, smem, has_dense);
    else
        f8 ? decode_set<128, true>(fn, smem, has_dense)
           : decode_set<128, false>(fn, smem, has_dense);
}

} // namespace attn
