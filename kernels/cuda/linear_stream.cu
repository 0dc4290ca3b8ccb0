/* The streaming small-M linear (kernels/cuda/linear.h cuda_gemv_stream): the weights pass
 * through shared memory on the bulk-copy engine and are multiplied on the tensor cores.
 *
 * A tile is 16 output features (16 rows of w) for every input row. The grid is one CTA an SM
 * (at most the tile count); CTA b takes tiles b, b + grid, ..., and its tiles' columns go
 * through a ring of shared-memory stages (struct cuda_gemv_ring): a stage holds the 16 weight
 * rows and the x rows of those columns, each row one bulk copy completing on the stage's mbarrier;
 * or, x resident (struct cuda_gemv_ring x_resident 1; 16 rows of 4096 columns fit beside a ring
 * of 2 x 1024), the stages hold weights only and x's columns are copied once, with the stages of
 * the CTA's first tile, into a region of their own (at 16 rows half of every stage is x:
 * kernel_bench on the H200, QKV at 16 rows 2.07 against 1.85 TB/s, at 8 rows 2.62 against 2.37).
 * Not the default: the fifteenth session's GPU suite ran with it on a main whose decode kernel
 * had a race (bench/RESULTS.md), so it is not yet proven in a model's run.
 * One producer thread issues the copies as stages free up, running ahead across tile boundaries, so
 * an SM keeps its ring of weights in flight without a gap between tiles; eight consumer warps
 * multiply (kernels/cuda/gemv_mma.cuh): in a stage's chunks of 32 columns warp v takes chunks
 * v, v + 8, ..., and gives the stage back with one arrival on its `empty` barrier. Rows in
 * shared memory are 64 bytes longer than their data (a multiple of 1 KiB), so that the 8 lanes
 * of a quarter-warp read 8 distinct 16-byte bank groups. At a tile's end the warps' partial sums
 * meet in shared memory and are added in warp order (a fixed order: deterministic results).
 *
 * Launched by launch_pdl, the producer fills the whole ring with weights before it waits for the
 * kernel ahead (whose output is x): at a decode step's kernel boundaries the next linear's
 * weights are already on their way. The default ring is the fastest of the H200's first run
 * (2 stages of 2048 columns up to 8 rows, 3 of 1024 above: 199 and 211 KiB). Rings of 512-column
 * stages (4 stages: 106 KiB, room beside one CTA of the decode attention) ran at 1.0-1.6 TB/s:
 * the copies are too small. On the large weights no ring reaches cuBLAS (gate/up at one row 3.5
 * against 4.0 TB/s; bench/RESULTS.md, 2026-12-02, eleventh session).
 *
 * The sums are cuda_gemv's, in the same order (a warp's chunks v, v + 8, v + 16, ... through
 * the same products, then the warps in order): the results are equal bit for bit. The eighth
 * session's bulk-copy GEMV (one tile a CTA, its ring filled anew for each, no early start) lost
 * to cuBLAS on the large weights (bench/RESULTS.md, 3.4 against 3.96 TB/s on gate/up); this form
 * keeps each SM's ring full across tiles and starts before the kernel ahead ends. */
#include "kernels/cuda/linear.h"

#include "kernels/cuda/async_copy.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_mma.cuh"

#include <atomic>

namespace
{

constexpr int kConsumerWarps = 8;
constexpr int kThreads = (kConsumerWarps + 1) * 32; /* + the producer warp */
constexpr int kRowsPerTile = 16;                    /* output features a tile */
constexpr int kChunk = 32;                          /* reduction columns a warp step */
constexpr int kColsUnit = 512;                      /* a ring's stage width is a multiple of this */
constexpr int kMaxCols = 4096;                      /* and at most this */
constexpr int kRowPad = 64; /* bytes after a row's data, against bank conflicts */
constexpr int kMaxSmem = 227 * 1024;

/* A ring: stages of cols columns; a stage holds 16 weight rows, then x rows 0 .. 8 * TILES - 1
 * (those past rows are never copied and their products never stored), each row_bytes apart;
 * after the ring, the warps' partial sums and the barriers. */
struct ring {
    int32_t stages, cols, row_bytes, stage_bytes;
    /* 0, or x resident (the x-resident form): x rows x_row_bytes apart after the stages, copied
     * once, with the stages of the CTA's first tile; the stages hold weights only. */
    int32_t x_row_bytes;
};

template <int TILES> struct geom {
    static constexpr int part_floats = kConsumerWarps * TILES * 4 * 32;
    /* The defaults, the fastest rings of the H200's first run (bench/RESULTS.md, 2026-12-02,
     * eleventh session): 2 stages of 2048 columns up to 8 rows, 3 of 1024 above. x resident:
     * 2 stages of 2048 columns up to 8 rows, 2 of 1024 above (what fits beside 16 rows of 4096). */
    static constexpr int default_stages = TILES == 1 ? 2 : 3;
    static constexpr int default_cols = TILES == 1 ? 2048 : 1024;
    static constexpr int default_stages_x = 2;
    static constexpr int default_cols_x = TILES == 1 ? 2048 : 1024;
    /* A ring of stages of cols columns; x_in > 0: x resident, rows of x_in columns. */
    static ring make(int stages, int cols, int32_t x_in)
    {
        ring r;
        r.stages = stages;
        r.cols = cols;
        r.row_bytes = cols * 2 + kRowPad;
        /* x rows padded as the stages' rows: a multiple of 128 bytes, plus kRowPad. */
        r.x_row_bytes = x_in > 0 ? (x_in * 2 + 127) / 128 * 128 + kRowPad : 0;
        r.stage_bytes = (kRowsPerTile + (x_in > 0 ? 0 : 8 * TILES)) * r.row_bytes;
        return r;
    }
    __host__ __device__ static int64_t x_bytes(const ring &r)
    {
        return (int64_t)8 * TILES * r.x_row_bytes;
    }
    static int64_t smem(const ring &r)
    {
        return (int64_t)r.stages * r.stage_bytes + x_bytes(r) + part_floats * 4 + 2 * r.stages * 8;
    }
};

/* Where the i-th stage of this CTA's sequence reads: its tile's first feature, first column and
 * column count. */
struct stage_at {
    int64_t n0;
    int32_t k0, cols;
};

__device__ __forceinline__ stage_at stage_of(int32_t i, int32_t per_tile, int32_t in, int32_t cols)
{
    stage_at s;
    s.n0 = ((int64_t)blockIdx.x + (int64_t)(i / per_tile) * gridDim.x) * kRowsPerTile;
    s.k0 = (i % per_tile) * cols;
    s.cols = min(cols, in - s.k0);
    return s;
}

/* The 16 weight rows of stage s into ring stage st (rows past out repeat the last row: in
 * bounds, never stored). */
__device__ __forceinline__ void copy_weights(unsigned char *st, int32_t row_bytes,
                                             const uint16_t *w, stage_at s, int32_t in, int32_t out,
                                             uint64_t *bar, uint64_t policy)
{
    for (int r = 0; r < kRowsPerTile; r++) {
        const int64_t row = min(s.n0 + r, (int64_t)out - 1);
        bulk_copy_hint(st + r * row_bytes, w + row * in + s.k0, (uint32_t)s.cols * 2, bar, policy);
    }
}

__device__ __forceinline__ void copy_inputs(unsigned char *st, int32_t row_bytes, const uint16_t *x,
                                            stage_at s, int32_t rows, int32_t in, uint64_t *bar,
                                            uint64_t policy)
{
    for (int t = 0; t < rows; t++)
        bulk_copy_hint(st + (kRowsPerTile + t) * row_bytes, x + (int64_t)t * in + s.k0,
                       (uint32_t)s.cols * 2, bar, policy);
}

/* x resident: the columns of stage s of every row into the x region. */
__device__ __forceinline__ void copy_inputs_x(unsigned char *xr, int32_t x_row_bytes,
                                              const uint16_t *x, stage_at s, int32_t rows,
                                              int32_t in, uint64_t *bar, uint64_t policy)
{
    for (int t = 0; t < rows; t++)
        bulk_copy_hint(xr + (int64_t)t * x_row_bytes + (int64_t)s.k0 * 2,
                       x + (int64_t)t * in + s.k0, (uint32_t)s.cols * 2, bar, policy);
}

__device__ __forceinline__ uint4 lds128(const unsigned char *p)
{
    return *reinterpret_cast<const uint4 *>(p);
}

template <int TILES, bool F32>
__global__ void __launch_bounds__(kThreads, 1)
    gemv_stream_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
                       void *__restrict__ y, int32_t rows, int32_t in, int32_t out, ring rg)
{
    using G = geom<TILES>;
    extern __shared__ __align__(128) unsigned char smem[];
    unsigned char *xres = smem + (size_t)rg.stages * rg.stage_bytes; /* with rg.x_row_bytes */
    float *part = reinterpret_cast<float *>(xres + G::x_bytes(rg));
    uint64_t *full = reinterpret_cast<uint64_t *>(part + G::part_floats);
    uint64_t *empty = full + rg.stages;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int32_t tiles = (out + kRowsPerTile - 1) / kRowsPerTile;
    const int32_t per_tile = (in + rg.cols - 1) / rg.cols;
    const int32_t mine = (int32_t)blockIdx.x < tiles
                             ? (tiles - 1 - (int32_t)blockIdx.x) / (int32_t)gridDim.x + 1
                             : 0;
    const int32_t total = mine * per_tile; /* this CTA's stages */

    if (threadIdx.x == 0) {
        for (int s = 0; s < rg.stages; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kConsumerWarps);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == kConsumerWarps) {
        /* The producer: one thread announces a stage's bytes, then issues its copies. */
        if (lane != 0)
            return;
        const uint64_t once = l2_policy_evict_first(), normal = l2_policy_evict_normal();
        const int32_t pre = total < rg.stages ? total : rg.stages;
        /* x's bytes come with every stage, or (x resident) with the first tile's only. */
        const bool xr = rg.x_row_bytes > 0;
        for (int32_t i = 0; i < pre; i++) {
            const stage_at s = stage_of(i, per_tile, in, rg.cols);
            const int32_t xrows = !xr || i < per_tile ? rows : 0;
            mbar_arrive_expect_tx(&full[i], (uint32_t)s.cols * 2 * (kRowsPerTile + xrows));
            copy_weights(smem + (size_t)i * rg.stage_bytes, rg.row_bytes, w, s, in, out, &full[i],
                         once);
        }
        /* x is the kernel ahead's output; the ring's first weights are on their way. */
        pdl_wait();
        pdl_launch_dependents();
        for (int32_t i = 0; i < total; i++) {
            const int slot = i % rg.stages;
            const stage_at s = stage_of(i, per_tile, in, rg.cols);
            unsigned char *st = smem + (size_t)slot * rg.stage_bytes;
            const int32_t xrows = !xr || i < per_tile ? rows : 0;
            if (i >= pre) {
                mbar_wait(&empty[slot], (uint32_t)((i / rg.stages - 1) & 1));
                mbar_arrive_expect_tx(&full[slot], (uint32_t)s.cols * 2 * (kRowsPerTile + xrows));
                copy_weights(st, rg.row_bytes, w, s, in, out, &full[slot], once);
            }
            if (!xr)
                copy_inputs(st, rg.row_bytes, x, s, rows, in, &full[slot], normal);
            else if (xrows > 0)
                copy_inputs_x(xres, rg.x_row_bytes, x, s, rows, in, &full[slot], normal);
        }
        return;
    }

    /* The consumers: they write y, which a kernel ahead may still read. */
    pdl_wait();
    const int g = lane >> 2, c = lane & 3;
    int32_t i = 0;
    for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
        float acc[TILES][4];
#pragma unroll
        for (int t = 0; t < TILES; t++)
            acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
        for (int32_t k = 0; k < per_tile; k++, i++) {
            const int slot = i % rg.stages;
            mbar_wait(&full[slot], (uint32_t)((i / rg.stages) & 1));
            const int32_t chunks = min(rg.cols, in - k * rg.cols) / kChunk;
            const unsigned char *st = smem + (size_t)slot * rg.stage_bytes + c * 16;
            /* x's rows: in the stage after the weights, or in the x region at the stage's
             * columns. */
            const unsigned char *xs = rg.x_row_bytes > 0 ? xres + (size_t)k * rg.cols * 2 + c * 16
                                                         : st + (size_t)kRowsPerTile * rg.row_bytes;
            const int32_t xstride = rg.x_row_bytes > 0 ? rg.x_row_bytes : rg.row_bytes;
            /* Warp v's chunks v, v + 8, ...: over the stages, every 8th chunk of the row in
             * order, as cuda_gemv sums them. */
            for (int j = warp; j < chunks; j += kConsumerWarps) {
                const unsigned char *at = st + j * (kChunk * 2);
                const uint4 wa = lds128(at + g * rg.row_bytes);
                const uint4 wb = lds128(at + (g + 8) * rg.row_bytes);
                uint4 xv[TILES];
#pragma unroll
                for (int t = 0; t < TILES; t++)
                    xv[t] = lds128(xs + j * (kChunk * 2) + (8 * t + g) * xstride);
                chunk_mma<TILES>(acc, wa, wb, xv);
            }
            __syncwarp();
            if (lane == 0)
                mbar_arrive(&empty[slot]);
        }
#pragma unroll
        for (int t = 0; t < TILES; t++)
#pragma unroll
            for (int j = 0; j < 4; j++)
                part[((warp * TILES + t) * 4 + j) * 32 + lane] = acc[t][j];
        /* The consumers alone (the producer runs ahead): named barrier 1. */
        asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
        gemv_tile_store<TILES, kConsumerWarps, F32>(part, threadIdx.x, kConsumerWarps * 32,
                                                    tile * kRowsPerTile, rows, out, y);
        asm volatile("bar.sync 1, %0;" ::"n"(kConsumerWarps * 32) : "memory");
    }
}

/* The shared-memory opt-in of each kernel, once per device (threads of a tensor-parallel group
 * may launch at once: the flag is atomic, the opt-in itself idempotent). */
constexpr int kMaxDevices = 64;

/* One CTA an SM, at most one a tile. */
static unsigned grid_of(int32_t out, int sms)
{
    const int32_t tiles = (out + kRowsPerTile - 1) / kRowsPerTile;
    return (unsigned)(tiles < sms ? tiles : sms);
}

/* The ring a launch uses: want's fields or the defaults, its stages cut to what one CTA streams
 * (the rest would only keep other kernels off the SM). */
template <int TILES>
static ring ring_of(int32_t in, int32_t out, const struct cuda_gemv_ring *want, int sms)
{
    const int32_t tiles = (out + kRowsPerTile - 1) / kRowsPerTile;
    const unsigned grid = grid_of(out, sms);
    /* x resident when asked (want->x_resident 1); else (0, the default, and -1) through the
     * stages. */
    const bool xres = want != NULL && want->x_resident > 0;
    const int cols = want != NULL && want->cols > 0 ? want->cols
                     : xres                         ? geom<TILES>::default_cols_x
                                                    : geom<TILES>::default_cols;
    int stages = want != NULL && want->stages > 0 ? want->stages
                 : xres                           ? geom<TILES>::default_stages_x
                                                  : geom<TILES>::default_stages;
    const int64_t most = (int64_t)((tiles + grid - 1) / grid) * ((in + cols - 1) / cols);
    if (stages > most)
        stages = (int)most;
    return geom<TILES>::make(stages, cols, xres ? in : 0);
}

static bool ring_valid(const struct cuda_gemv_ring *ring)
{
    return ring == NULL ||
           (ring->stages >= 0 && ring->cols >= 0 && ring->cols % kColsUnit == 0 &&
            ring->cols <= kMaxCols && ring->x_resident >= -1 && ring->x_resident <= 1);
}

template <int TILES, bool F32>
int launch(const uint16_t *x, const uint16_t *w, void *y, int32_t rows, int32_t in, int32_t out,
           const struct cuda_gemv_ring *want, cudaStream_t s)
{
    static std::atomic<int> opted_in[kMaxDevices];
    int dev = 0, sms = 0;
    int rc = cuda_device_sms(&dev, &sms, "cuda_gemv_stream: the device's SM count");
    if (rc < 0)
        return rc;
    const unsigned grid = grid_of(out, sms);
    const int asked = want != NULL && want->stages > 0 ? want->stages : geom<TILES>::default_stages;
    const ring rg = ring_of<TILES>(in, out, want, sms);
    const int stages = rg.stages, cols = rg.cols;
    if (geom<TILES>::smem(rg) > kMaxSmem)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_gemv_stream: a ring of %d stages (%d asked) of %d columns "
                                "needs %lld bytes of shared memory (at most %d)",
                                stages, asked, cols, (long long)geom<TILES>::smem(rg), kMaxSmem);
    if (dev < 0 || dev >= kMaxDevices || !opted_in[dev].load(std::memory_order_relaxed)) {
        cudaError_t e = cudaFuncSetAttribute(gemv_stream_kernel<TILES, F32>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, kMaxSmem);
        if (e != cudaSuccess)
            return cuda_call_failed(e, "cuda_gemv_stream: cudaFuncSetAttribute");
        if (dev >= 0 && dev < kMaxDevices)
            opted_in[dev].store(1, std::memory_order_relaxed);
    }
    return launch_pdl("cuda_gemv_stream", gemv_stream_kernel<TILES, F32>, grid, kThreads,
                      (size_t)geom<TILES>::smem(rg), s, x, w, y, rows, in, out, rg);
}

} // namespace

int cuda_gemv_stream(const uint16_t *x, const uint16_t *w, void *y, int y_f32, int32_t rows,
                     int32_t in, int32_t out, const struct cuda_gemv_ring *ring, cudaStream_t s)
{
    if (!cuda_gemv_fits(rows, in, out, x, w, y) || !ring_valid(ring))
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_gemv_stream: rows %d (1 .. %d), in %d (a multiple of %d), "
                                "out %d, buffers 16-byte aligned, a ring of %d stages (>= 0) of "
                                "%d columns (0, or a multiple of %d up to %d)",
                                (int)rows, CUDA_GEMV_MAX_ROWS, (int)in, kChunk, (int)out,
                                ring ? ring->stages : 0, ring ? ring->cols : 0, kColsUnit,
                                kMaxCols);
    if (rows <= 8)
        return y_f32 ? launch<1, true>(x, w, y, rows, in, out, ring, s)
                     : launch<1, false>(x, w, y, rows, in, out, ring, s);
    return y_f32 ? launch<2, true>(x, w, y, rows, in, out, ring, s)
                 : launch<2, false>(x, w, y, rows, in, out, ring, s);
}

int cuda_gemv_stream_ring_fits(int32_t rows, int32_t in, int32_t out,
                               const struct cuda_gemv_ring *ring, int sms)
{
    if (rows < 1 || rows > CUDA_GEMV_MAX_ROWS || in < 1 || out < 1 || sms < 1 || !ring_valid(ring))
        return 0;
    if (rows <= 8)
        return geom<1>::smem(ring_of<1>(in, out, ring, sms)) <= kMaxSmem;
    return geom<2>::smem(ring_of<2>(in, out, ring, sms)) <= kMaxSmem;
}
