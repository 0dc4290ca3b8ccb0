/* Linears of a few rows by a GEMM of ours (kernels/cuda/linear_tma.h): a plan per call, kept
 * in an open-addressing table that doubles when half full, and the kernel for tiles of 64 and
 * 128 weight rows. */
#include "kernels/cuda/linear_tma.h"

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"

#include <cuda.h>
#include <stdlib.h>
#include <string.h>

namespace
{

constexpr int BK = 64; /* reduction columns a stage: 128 bytes a row, one swizzle span */
constexpr int MR = CUDA_TMA_MAX_ROWS;
constexpr int kConsumers = 4; /* warps 0-3 multiply; warp 4 feeds the ring */
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr uint32_t kXBytes = MR * BK * 2; /* 2 KiB a stage */
constexpr int kMaxStages = 16;
/* The dynamic shared memory a CTA may have on sm_90 (227 KiB). */
constexpr size_t kSmemMax = 227 * 1024;
/* Stream-K: the units whose pieces a plan may count (kConsumers counters each), and the floats
 * a consumer lane keeps of a unit (MT x 2 x 4 at tile 128). */
constexpr int kSkMaxUnits = 4096;
constexpr int kSkLaneFloats = 16;
/* Stream-K where it balances: a CTA takes at least this many stages (one stage a CTA would make
 * a small linear's every unit a sum of one-stage pieces). */
constexpr int kSkMinStages = 2;

__host__ __device__ constexpr uint32_t stage_bytes(int tile)
{
    return (uint32_t)tile * BK * 2 + kXBytes;
}

/* Stages of a tile's ring: as many as fit beside the 1 KiB alignment slack and two mbarriers a
 * stage, at most kMaxStages. */
__host__ __device__ constexpr int ring_stages(int tile)
{
    return (int)((kSmemMax - 1024) / (stage_bytes(tile) + 16)) < kMaxStages
               ? (int)((kSmemMax - 1024) / (stage_bytes(tile) + 16))
               : kMaxStages;
}

__host__ __device__ constexpr size_t ring_smem(int tile)
{
    return 1024 + (size_t)ring_stages(tile) * (stage_bytes(tile) + 16);
}

struct tma_args {
    int32_t rows, n;  /* x [rows][k], y [rows][n] or parts [splits][rows][n]; SILU: n = inter */
    int32_t splits;   /* slices of k */
    int32_t kstages;  /* k / splits / BK: stages a unit */
    int32_t units;    /* n / tile * splits */
    __nv_bfloat16 *y; /* splits == 1 */
    float *parts;     /* splits > 1 */
    /* 1: stream-K. The grid's G CTAs share the W = units x kstages stages of work evenly, CTA c
     * taking stages [c W / G, (c + 1) W / G) in unit order; a unit cut between CTAs is summed,
     * its pieces in the order of k, by the piece's warp that arrives last (sk_fixup). */
    int32_t sk;
    float *ws; /* [grid][2][kConsumers][kSkLaneFloats / 4][32] float4: the pieces' partial sums */
    uint32_t *counts; /* [units][kConsumers]: pieces arrived; zero between launches */
};

/* Stream-K: the first stage of CTA c, and the CTA that stage g falls to. */
__device__ __forceinline__ int64_t sk_begin(int64_t c, int64_t W, int64_t G)
{
    return c * W / G;
}

__device__ __forceinline__ int32_t sk_cta_of(int64_t g, int64_t W, int64_t G)
{
    return (int32_t)(((g + 1) * G - 1) / W);
}

/* Stream-K: warp `warp` of this CTA holds in acc its piece of unit u (stages k0 <= k < k1 of
 * the unit's, not all of them). It stores the piece in its workspace slot (0 for a piece that
 * starts this CTA's share, 1 for one that ends it: a cut piece does one or the other, and a
 * CTA has at most one of each), then counts itself in. The warp that comes last sums every
 * piece in the order of k (the first piece as it is, then each next added), so the bits do not
 * depend on who came last, resets the count for the next launch (which waits for this grid to
 * end before it touches the counts), and returns true with the sum in acc; the others return
 * false. Every lane fences its stores before the count; the last warp's lanes fence after it
 * and meet (__syncwarp) before they read, through L2 (the threadFenceReduction pattern). A
 * lane's float4 j of a piece sits at [j][lane], so that a warp's store of one is 512
 * contiguous bytes. */
template <int MT>
__device__ __forceinline__ bool sk_fixup(const tma_args &a, float (&acc)[MT][2][4], int32_t u,
                                         int warp, int lane)
{
    static_assert(MT * 8 <= kSkLaneFloats, "a lane's piece fits its workspace");
    const int64_t W = (int64_t)a.units * a.kstages, G = gridDim.x;
    const int64_t t0 = (int64_t)u * a.kstages;
    const int32_t c0 = sk_cta_of(t0, W, G), c1 = sk_cta_of(t0 + a.kstages - 1, W, G);
    const int32_t me = (int32_t)blockIdx.x;
    auto piece = [&](int32_t c) {
        const int slot = sk_begin(c, W, G) >= t0 ? 0 : 1;
        return reinterpret_cast<float4 *>(a.ws) +
               (((size_t)c * 2 + slot) * kConsumers + warp) * (kSkLaneFloats / 4) * 32 + lane;
    };
    float4 *mine = piece(me);
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
            __stcg(mine + (mt * 2 + nt) * 32,
                   make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]));
    __threadfence();
    __syncwarp();
    uint32_t *count = a.counts + (size_t)u * kConsumers + warp;
    uint32_t before = 0;
    if (lane == 0)
        before = atomicAdd(count, 1u);
    before = __shfl_sync(0xffffffffu, before, 0);
    if (before != (uint32_t)(c1 - c0))
        return false;
    __threadfence();
    __syncwarp();
    float sum[MT][2][4];
    for (int32_t c = c0; c <= c1; c++) {
        const float4 *p = piece(c);
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                float v[4] = {acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]};
                if (c != me) {
                    const float4 q = __ldcg(p + (mt * 2 + nt) * 32);
                    v[0] = q.x;
                    v[1] = q.y;
                    v[2] = q.z;
                    v[3] = q.w;
                }
#pragma unroll
                for (int e = 0; e < 4; e++)
                    sum[mt][nt][e] = c == c0 ? v[e] : sum[mt][nt][e] + v[e];
            }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int nt = 0; nt < 2; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[mt][nt][e] = sum[mt][nt][e];
    if (lane == 0)
        atomicExch(count, 0u);
    return true;
}

__device__ __forceinline__ void tma_load_2d(void *dst, const CUtensorMap *map, int32_t c0,
                                            int32_t c1, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
                 : "memory");
}

/* The byte offset of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled box of 128-byte
 * rows (the box 1024-byte aligned): the copy engine puts chunk c of row r at c ^ (r % 8). */
__device__ __forceinline__ uint32_t swz(int row, int chunk)
{
    return (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
}

/* Warp 4's lane 0 feeds the ring (the first stages' weights before the wait: no kernel writes
 * them; x after it); warps 0-3 each multiply TILE / 4 of the tile's weight rows by the 16 input
 * rows. Every thread triggers the kernel behind right after its wait.
 * SILU (gate/up with SiLU-and-multiply behind it, splits 1): a unit's TILE weight rows are
 * TILE / 2 gate rows and the up rows of the same features (rows n + those), two boxes a stage,
 * the gate box in the stage's first TILE / 2 rows; each m16 tile of a warp takes 8 gate rows
 * (its rows 0-7, by ldmatrix's lanes 0-7 and 16-23) and their 8 up rows (rows 8-15, lanes 8-15
 * and 24-31), so a thread holds a feature's gate (elements 0, 1) and up (2, 3) for the same
 * input rows and writes silu(bf16(gate)) * bf16(up) in bf16, cuda_silu_mul's bits on the
 * unfused output.
 * The work: without stream-K (SK false, a.sk 0) CTA c takes units c, c + G, ... whole; with it,
 * stages [c W / G, (c + 1) W / G) of the units' stages in order, whole units and pieces alike (the
 * producer and the consumers walk the same sequence, so the ring's stages pair up as before). */
template <int TILE, bool SILU, bool SK>
__global__ void __launch_bounds__(kThreads, 1)
    tma_linear_kernel(const __grid_constant__ CUtensorMap wmap,
                      const __grid_constant__ CUtensorMap xmap, tma_args a)
{
    constexpr int S = ring_stages(TILE);
    constexpr uint32_t kW = (uint32_t)TILE * BK * 2, kStage = stage_bytes(TILE);
    constexpr int FW = TILE / kConsumers; /* weight rows a consumer warp */
    constexpr int MT = FW / 16;           /* m16 tiles a consumer warp */
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = reinterpret_cast<uint8_t *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + (size_t)S * kStage);
    uint64_t *empty = full + S;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    /* without stream-K this CTA's units: blockIdx.x, blockIdx.x + gridDim.x, ... (the grid is
     * at most units); with it, the stages first .. last - 1 (the grid is at most W) */
    const int32_t my_units = SK ? 0 : (a.units - 1 - (int32_t)blockIdx.x) / (int32_t)gridDim.x + 1;
    const int64_t W = (int64_t)a.units * a.kstages;
    const int64_t first = SK ? sk_begin(blockIdx.x, W, gridDim.x) : 0;
    const int64_t last = SK ? sk_begin((int64_t)blockIdx.x + 1, W, gridDim.x) : 0;
    const int32_t iters = SK ? (int32_t)(last - first) : my_units * a.kstages;

    if (tid == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kConsumers);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == kConsumers) {
        if (lane == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(&wmap) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(&xmap) : "memory");
            auto coords = [&](int32_t it, int32_t &kc, int32_t &nc) {
                int32_t u, ks;
                if constexpr (SK) {
                    u = (int32_t)((first + it) / a.kstages);
                    ks = (int32_t)((first + it) % a.kstages);
                } else {
                    u = (int32_t)blockIdx.x + (it / a.kstages) * (int32_t)gridDim.x;
                    ks = it % a.kstages;
                }
                const int32_t tile = u / a.splits, split = u % a.splits;
                kc = (split * a.kstages + ks) * BK;
                nc = tile * (SILU ? TILE / 2 : TILE);
            };
            /* a stage's weights: one box of TILE rows, or SILU's gate and up boxes */
            auto load_w = [&](uint8_t *st, int32_t kc, int32_t nc, uint64_t *bar) {
                tma_load_2d(st, &wmap, kc, nc, bar);
                if (SILU)
                    tma_load_2d(st + kW / 2, &wmap, kc, a.n + nc, bar);
            };
            const int32_t early = iters < S ? iters : S;
            for (int32_t it = 0; it < early; it++) {
                int32_t kc, nc;
                coords(it, kc, nc);
                mbar_arrive_expect_tx(&full[it], kStage);
                load_w(smem + (size_t)it * kStage, kc, nc, &full[it]);
            }
            pdl_wait();
            pdl_launch_dependents();
            for (int32_t it = 0; it < early; it++) {
                int32_t kc, nc;
                coords(it, kc, nc);
                tma_load_2d(smem + (size_t)it * kStage + kW, &xmap, kc, 0, &full[it]);
            }
            for (int32_t it = early; it < iters; it++) {
                const int s = it % S;
                mbar_wait(&empty[s], ((uint32_t)(it / S) & 1u) ^ 1u); /* stage s given back */
                int32_t kc, nc;
                coords(it, kc, nc);
                uint8_t *st = smem + (size_t)s * kStage;
                mbar_arrive_expect_tx(&full[s], kStage);
                load_w(st, kc, nc, &full[s]);
                tma_load_2d(st + kW, &xmap, kc, 0, &full[s]);
            }
        } else {
            pdl_wait();
            pdl_launch_dependents();
        }
        return;
    }

    pdl_wait(); /* y may still be read by the kernel ahead */
    pdl_launch_dependents();
    const int m = lane >> 3, r8 = lane & 7;
    const int g = lane >> 2, c2 = 2 * (lane & 3);
    int32_t it = 0;
    int64_t next = first; /* stream-K: the next stage of this CTA's share */
    for (int32_t j = 0;; j++) {
        int32_t u, k0 = 0, k1 = a.kstages; /* this piece: stages k0 .. k1 - 1 of unit u */
        if constexpr (SK) {
            if (next >= last)
                break;
            u = (int32_t)(next / a.kstages);
            k0 = (int32_t)(next - (int64_t)u * a.kstages);
            const int64_t end = (int64_t)u * a.kstages + a.kstages;
            k1 = (int32_t)((end < last ? end : last) - (int64_t)u * a.kstages);
            next = (int64_t)u * a.kstages + k1;
        } else {
            if (j >= my_units)
                break;
            u = (int32_t)blockIdx.x + j * (int32_t)gridDim.x;
        }
        const int32_t tile = u / a.splits, split = u % a.splits;
        float acc[MT][2][4] = {};
        for (int32_t ks = k0; ks < k1; ks++, it++) {
            const int s = it % S;
            mbar_wait(&full[s], (uint32_t)(it / S) & 1u);
            const uint32_t wbase = smem_addr(smem + (size_t)s * kStage);
            const uint32_t xbase = wbase + kW;
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                uint32_t af[MT][4], bf[4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    /* SILU: A rows 0-7 gate rows, 8-15 the same features' up rows */
                    const int row = SILU ? (m & 1) * (TILE / 2) + warp * (FW / 2) + mt * 8 + r8
                                         : warp * FW + mt * 16 + (m & 1) * 8 + r8;
                    ldsm_x4(af[mt], wbase + swz(row, kk * 2 + (m >> 1)));
                }
                ldsm_x4(bf, xbase + swz((m >> 1) * 8 + r8, kk * 2 + (m & 1)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(acc[mt][0], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[0], bf[1]);
                    mma_bf16(acc[mt][1], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[2], bf[3]);
                }
            }
            __syncwarp();
            if (lane == 0)
                mbar_arrive(&empty[s]);
        }
        /* a piece of a unit: the last of its pieces to arrive writes the unit */
        if constexpr (SK)
            if ((k0 != 0 || k1 != a.kstages) && !sk_fixup<MT>(a, acc, u, warp, lane))
                continue;
        /* acc[mt][nt]: C[weight row][input row], weight rows mt * 16 + g (+8 for elements 2
         * and 3), input rows nt * 8 + c2 (+1 for the odd elements). */
        if constexpr (SILU) {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 2; e++) {
                        const int32_t f = tile * (TILE / 2) + warp * (FW / 2) + mt * 8 + g;
                        const int32_t r = nt * 8 + c2 + e;
                        if (r >= a.rows)
                            continue;
                        const float gate = __bfloat162float(__float2bfloat16(acc[mt][nt][e]));
                        const float up = __bfloat162float(__float2bfloat16(acc[mt][nt][e + 2]));
                        a.y[(int64_t)r * a.n + f] = __float2bfloat16(silu_mul1(gate, up));
                    }
        } else {
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < 2; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        const int32_t f = tile * TILE + warp * FW + mt * 16 + g + (e >> 1) * 8;
                        const int32_t r = nt * 8 + c2 + (e & 1);
                        if (r >= a.rows)
                            continue;
                        if (a.splits == 1)
                            a.y[(int64_t)r * a.n + f] = __float2bfloat16(acc[mt][nt][e]);
                        else
                            a.parts[((int64_t)split * a.rows + r) * a.n + f] = acc[mt][nt][e];
                    }
        }
    }
}

/* ---- host ---- */

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                    const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                    const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                    CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

struct key {
    const void *x, *w, *y;
    int64_t rows, in, out; /* silu: out is inter (the weight has 2 x inter rows) */
    int32_t splits, tile_wanted, silu, stream_k;
};

struct plan {
    key k;
    int used;
    int tile;
    int grid;
    CUtensorMap wmap, xmap;
    tma_args a;
};

bool key_eq(const key &a, const key &b)
{
    return a.x == b.x && a.w == b.w && a.y == b.y && a.rows == b.rows && a.in == b.in &&
           a.out == b.out && a.splits == b.splits && a.tile_wanted == b.tile_wanted &&
           a.silu == b.silu && a.stream_k == b.stream_k;
}

uint64_t key_hash(const key &k)
{
    uint64_t h = 1469598103934665603ull;
    const uint64_t f[10] = {(uint64_t)(uintptr_t)k.x, (uint64_t)(uintptr_t)k.w,
                            (uint64_t)(uintptr_t)k.y, (uint64_t)k.rows,
                            (uint64_t)k.in,           (uint64_t)k.out,
                            (uint64_t)k.splits,       (uint64_t)k.tile_wanted,
                            (uint64_t)k.silu,         (uint64_t)k.stream_k};
    for (int i = 0; i < 10; i++) {
        h ^= f[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

/* A 2-D map of a row-major bf16 matrix [outer][inner] read in boxes of BK x box_outer, 128-byte
 * swizzled; rows past `outer` read as zeros. */
int encode_map(encode_tiled_fn encode, CUtensorMap *map, const void *base, int64_t inner,
               int64_t outer, int box_outer)
{
    const cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer};
    const cuuint64_t strides[1] = {(cuuint64_t)inner * 2};
    const cuuint32_t box[2] = {(cuuint32_t)BK, (cuuint32_t)box_outer};
    const cuuint32_t estr[2] = {1, 1};
    const CUresult r =
        encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims, strides,
               box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return pagoda_error_set(PAGODA_ECUDA, "cuTensorMapEncodeTiled: CUresult %d", (int)r);
    return 0;
}

/* Plan slots, zeroed: a plan holds CUtensorMaps, which are 64-byte aligned (calloc gives 16). */
plan *alloc_slots(size_t cap)
{
    plan *p = static_cast<plan *>(aligned_alloc(alignof(plan), cap * sizeof(plan)));
    if (p != NULL)
        memset(static_cast<void *>(p), 0, cap * sizeof(plan));
    return p;
}

} // namespace

struct cuda_tma {
    encode_tiled_fn encode;
    int device, sms;
    int tile_wanted;
    int last_tile, last_sk;
    int stream_k;     /* cuda_tma_set_stream_k's mode */
    float *ws;        /* stream-K's workspace and counts (tma_args), made by the first */
    uint32_t *counts; /* cuda_tma_set_stream_k that turns it on */
    plan *slots;
    size_t cap, count; /* cap a power of two */
    size_t count_sk;   /* plans with stream-K */
};

/* Lets both of a tile's kernels (with and without stream-K) take their ring. */
template <int TILE, bool SILU> static cudaError_t allow_ring_smem()
{
    cudaError_t e =
        cudaFuncSetAttribute(tma_linear_kernel<TILE, SILU, false>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ring_smem(TILE));
    if (e == cudaSuccess)
        e = cudaFuncSetAttribute(tma_linear_kernel<TILE, SILU, true>,
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, (int)ring_smem(TILE));
    return e;
}

int cuda_tma_new(struct cuda_tma **out)
{
    *out = NULL;
    int dev = 0, sms = 0;
    int rc = cuda_device_sms(&dev, &sms, "cuda_tma_new");
    if (rc != 0)
        return rc;
    void *fn = NULL;
    cudaDriverEntryPointQueryResult q;
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000,
                                                     cudaEnableDefault, &q);
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || fn == NULL)
        return e != cudaSuccess ? cuda_call_failed(e, "cudaGetDriverEntryPointByVersion")
                                : pagoda_error_set(PAGODA_ECUDA, "cuda_tma_new: the driver has no "
                                                                 "cuTensorMapEncodeTiled");
    if ((e = allow_ring_smem<64, false>()) != cudaSuccess ||
        (e = allow_ring_smem<128, false>()) != cudaSuccess ||
        (e = allow_ring_smem<64, true>()) != cudaSuccess ||
        (e = allow_ring_smem<128, true>()) != cudaSuccess)
        return cuda_call_failed(e, "cuda_tma_new: cudaFuncSetAttribute");
    cuda_tma *t = static_cast<cuda_tma *>(calloc(1, sizeof(*t)));
    if (t == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "cuda_tma_new: out of host memory");
    t->cap = 64;
    t->slots = alloc_slots(t->cap);
    if (t->slots == NULL) {
        free(t);
        return pagoda_error_set(PAGODA_ENOMEM, "cuda_tma_new: out of host memory");
    }
    t->encode = reinterpret_cast<encode_tiled_fn>(fn);
    t->device = dev;
    t->sms = sms;
    *out = t;
    return 0;
}

void cuda_tma_free(struct cuda_tma *t)
{
    if (t == NULL)
        return;
    cudaFree(t->ws);
    cudaFree(t->counts);
    free(t->slots);
    free(t);
}

int cuda_tma_set_tile(struct cuda_tma *t, int tile)
{
    if (tile != 0 && tile != 64 && tile != 128)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_tma_set_tile: %d (0, 64 or 128)", tile);
    t->tile_wanted = tile;
    return 0;
}

int cuda_tma_set_stream_k(struct cuda_tma *t, int mode)
{
    if (mode < CUDA_TMA_SK_OFF || mode > CUDA_TMA_SK_ALWAYS)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_tma_set_stream_k: mode %d (0, 1 or 2)", mode);
    if (mode != CUDA_TMA_SK_OFF && t->ws == NULL) {
        int dev = -1;
        cudaError_t e = cudaGetDevice(&dev);
        if (e != cudaSuccess)
            return cuda_call_failed(e, "cuda_tma_set_stream_k: cudaGetDevice");
        if (dev != t->device)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "cuda_tma_set_stream_k: device %d is current, the plans' "
                                    "is %d",
                                    dev, t->device);
        const size_t ws = (size_t)t->sms * 2 * kConsumers * 32 * kSkLaneFloats * sizeof(float);
        const size_t counts = (size_t)kSkMaxUnits * kConsumers * sizeof(uint32_t);
        e = cudaMalloc((void **)&t->ws, ws);
        if (e == cudaSuccess)
            e = cudaMalloc((void **)&t->counts, counts);
        /* zero before any launch, whatever stream it is on: the default stream, waited for */
        if (e == cudaSuccess)
            e = cudaMemsetAsync(t->counts, 0, counts, 0);
        if (e == cudaSuccess)
            e = cudaStreamSynchronize(0);
        if (e != cudaSuccess) {
            cudaFree(t->ws);
            cudaFree(t->counts);
            t->ws = NULL;
            t->counts = NULL;
            return cuda_call_failed(e, "cuda_tma_set_stream_k");
        }
    }
    t->stream_k = mode;
    return 0;
}

size_t cuda_tma_plans(const struct cuda_tma *t)
{
    return t->count;
}

size_t cuda_tma_plans_stream_k(const struct cuda_tma *t)
{
    return t->count_sk;
}

int cuda_tma_last_stream_k(const struct cuda_tma *t)
{
    return t->last_sk;
}

int cuda_tma_last_tile(const struct cuda_tma *t)
{
    return t->last_tile;
}

int cuda_tma_fits(int64_t rows, int64_t in, int64_t out, int32_t splits, const void *x,
                  const void *w, const void *y)
{
    return rows >= 1 && rows <= MR && splits >= 1 && splits <= 8 && out > 0 && out % 64 == 0 &&
           out <= INT32_MAX && in > 0 && in % ((int64_t)BK * splits) == 0 && in <= INT32_MAX &&
           cuda_aligned16(x) && cuda_aligned16(w) && cuda_aligned16(y);
}

static int grow(cuda_tma *t)
{
    const size_t cap = t->cap * 2;
    plan *slots = alloc_slots(cap);
    if (slots == NULL)
        return PAGODA_ENOMEM;
    for (size_t i = 0; i < t->cap; i++) {
        if (!t->slots[i].used)
            continue;
        size_t j = key_hash(t->slots[i].k) & (cap - 1);
        while (slots[j].used)
            j = (j + 1) & (cap - 1);
        slots[j] = t->slots[i];
    }
    free(t->slots);
    t->slots = slots;
    t->cap = cap;
    return 0;
}

/* The plan of key k, made on first use. */
static int find_plan(cuda_tma *t, const key &k, plan **out)
{
    size_t i = key_hash(k) & (t->cap - 1);
    while (t->slots[i].used) {
        if (key_eq(t->slots[i].k, k)) {
            *out = &t->slots[i];
            return 0;
        }
        i = (i + 1) & (t->cap - 1);
    }
    plan p = {};
    p.k = k;
    p.used = 1;
    /* features a unit of 128 weight rows covers: 128, or with silu 64 gate and their 64 up */
    const int64_t f128 = k.silu ? 64 : 128;
    const int fits128 = k.out % f128 == 0;
    /* a unit's output columns at a tile, and the units (tiles times slices) */
    auto features_at = [&](int tile) { return k.silu ? tile / 2 : tile; };
    auto units_at = [&](int tile) { return k.out / features_at(tile) * k.splits; };
    if (k.tile_wanted == 128 && fits128)
        p.tile = 128;
    else if (k.tile_wanted == 64)
        p.tile = 64;
    else
        p.tile = fits128 && units_at(128) >= t->sms ? 128 : 64;
    /* Stream-K where whole units would leave more than a tenth of the SMs' rounds idle (or
     * always, CUDA_TMA_SK_ALWAYS), at tile 128 where the plan picks: its share of the stages
     * is the same whatever the units, and 128 rows a stage bring in x half as often. */
    const int64_t rounds = (units_at(p.tile) + t->sms - 1) / t->sms;
    const int idle = units_at(p.tile) * 10 < rounds * t->sms * 9;
    p.a.sk = k.stream_k == CUDA_TMA_SK_ALWAYS || (k.stream_k == CUDA_TMA_SK_BALANCE && idle);
    if (p.a.sk && k.tile_wanted == 0 && fits128)
        p.tile = 128;
    if (p.a.sk && units_at(p.tile) > kSkMaxUnits)
        p.a.sk = 0;
    int rc =
        encode_map(t->encode, &p.wmap, k.w, k.in, k.silu ? 2 * k.out : k.out, features_at(p.tile));
    if (rc == 0)
        rc = encode_map(t->encode, &p.xmap, k.x, k.in, k.rows, MR);
    if (rc != 0)
        return rc;
    p.a.rows = (int32_t)k.rows;
    p.a.n = (int32_t)k.out;
    p.a.splits = k.splits;
    p.a.kstages = (int32_t)(k.in / k.splits / BK);
    p.a.units = (int32_t)units_at(p.tile);
    p.a.y = k.splits == 1 ? (__nv_bfloat16 *)k.y : nullptr;
    p.a.parts = k.splits > 1 ? (float *)k.y : nullptr;
    p.grid = p.a.units < t->sms ? p.a.units : t->sms;
    if (p.a.sk) {
        /* every CTA a share (at most one CTA a stage); where it balances, shares of at least
         * kSkMinStages */
        const int64_t stages = (int64_t)p.a.units * p.a.kstages;
        const int64_t most = k.stream_k == CUDA_TMA_SK_BALANCE
                                 ? (stages / kSkMinStages > 0 ? stages / kSkMinStages : 1)
                                 : stages;
        p.grid = most < t->sms ? (int)most : t->sms;
        p.a.ws = t->ws;
        p.a.counts = t->counts;
    }
    if ((t->count + 1) * 2 > t->cap) {
        if ((rc = grow(t)) != 0)
            return rc;
        i = key_hash(k) & (t->cap - 1);
        while (t->slots[i].used)
            i = (i + 1) & (t->cap - 1);
    }
    t->slots[i] = p;
    t->count++;
    t->count_sk += p.a.sk != 0;
    *out = &t->slots[i];
    return 0;
}

/* Launches the plan's kernel: its tile, SILU and stream-K are template parameters, so that a
 * plan without stream-K runs a kernel with none of its code. aaed19e's runtime flag cost the
 * whole-unit kernel 0-40% at 16 rows on the H200 (gemm16, tile 64: QKV 20.1 -> 28.5 us, O 12.6 ->
 * 17.2, down 33.0 -> 45.7; ptxas: 51-73 registers became 72-116). */
template <int TILE, bool SILU>
static int launch_plan(const plan *p, const char *name, const char *name_sk, cudaStream_t s)
{
    const dim3 grid(p->grid), block(kThreads);
    if (p->a.sk)
        return launch_pdl(name_sk, tma_linear_kernel<TILE, SILU, true>, grid, block,
                          ring_smem(TILE), s, p->wmap, p->xmap, p->a);
    return launch_pdl(name, tma_linear_kernel<TILE, SILU, false>, grid, block, ring_smem(TILE), s,
                      p->wmap, p->xmap, p->a);
}

/* Finds or makes the plan of k and launches its kernel. */
static int run(cuda_tma *t, const key &k, cudaStream_t s)
{
    plan *p = NULL;
    int rc = find_plan(t, k, &p);
    if (rc != 0)
        return rc;
    t->last_tile = p->tile;
    t->last_sk = p->a.sk;
    if (k.silu)
        return p->tile == 128 ? launch_plan<128, true>(p, "tma_linear_kernel<128, silu>",
                                                       "tma_linear_kernel<128, silu, sk>", s)
                              : launch_plan<64, true>(p, "tma_linear_kernel<64, silu>",
                                                      "tma_linear_kernel<64, silu, sk>", s);
    return p->tile == 128
               ? launch_plan<128, false>(p, "tma_linear_kernel<128>", "tma_linear_kernel<128, sk>",
                                         s)
               : launch_plan<64, false>(p, "tma_linear_kernel<64>", "tma_linear_kernel<64, sk>", s);
}

int cuda_tma_linear(struct cuda_tma *t, const uint16_t *x, const uint16_t *w, void *y, int64_t rows,
                    int64_t in, int64_t out, int32_t splits, cudaStream_t s)
{
    if (!cuda_tma_fits(rows, in, out, splits, x, w, y))
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_tma_linear: rows %lld, in %lld, out %lld, splits %d "
                                "(rows 1..%d, out a multiple of 64, in of 64 x splits, 16-byte "
                                "aligned pointers)",
                                (long long)rows, (long long)in, (long long)out, (int)splits, MR);
    return run(t, key{x, w, y, rows, in, out, splits, t->tile_wanted, 0, t->stream_k}, s);
}

int cuda_tma_silu_fits(int64_t rows, int64_t in, int64_t inter, const void *x, const void *w,
                       const void *act)
{
    return cuda_tma_fits(rows, in, 2 * inter, 1, x, w, act) && inter % 64 == 0;
}

int cuda_tma_linear_silu(struct cuda_tma *t, const uint16_t *x, const uint16_t *w, uint16_t *act,
                         int64_t rows, int64_t in, int64_t inter, cudaStream_t s)
{
    if (!cuda_tma_silu_fits(rows, in, inter, x, w, act))
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_tma_linear_silu: rows %lld, in %lld, inter %lld (rows "
                                "1..%d, inter a multiple of 64, in of 64, 16-byte aligned "
                                "pointers)",
                                (long long)rows, (long long)in, (long long)inter, MR);
    return run(t, key{x, w, act, rows, in, inter, 1, t->tile_wanted, 1, t->stream_k}, s);
}
