/* Small-M linears (kernels/cuda/linear.h): a split-K pass over the weights on the tensor cores.
 *
 * One CTA computes 16 output features (16 rows of w) for every input row, its 8 warps sharing
 * the reduction dimension: warp v takes the 32-wide chunks v, v + 8, v + 16, ... and keeps 4
 * chunks of loads in flight. In a chunk, lane (g = lane / 4, c = lane % 4) loads 16 bytes of w
 * rows g and g + 8 and 16 bytes of x rows g (and g + 8 when there are more than 8 rows), all at
 * columns 8c .. 8c + 7, and feeds them to two m16n8k16 products as the A (weights) and B (inputs)
 * fragments. The fragments' reduction index is a permutation of the chunk's 32 columns, the same
 * for A and B, so the products sum the right pairs without any shuffle. The warps' partial sums
 * meet in shared memory and are added in warp order (a fixed order: deterministic results).
 * Each warp loads the next 4 chunks while it multiplies the current ones (a register double
 * buffer): without it, bench/RESULTS.md (issue 15) measured 2.7 TB/s on the down projection. */
#include "kernels/cuda/linear.h"

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemv_mma.cuh"

namespace
{

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kRowsPerCta = 16; /* output features: the M of one m16n8k16 product */
constexpr int kChunk = 32;      /* reduction columns per warp step: 4 lanes x 8 bf16 */
constexpr int kUnroll = 4;      /* chunks of loads in flight per warp */

/* 16 bytes of weights, read once: not kept in L1. */
__device__ __forceinline__ uint4 load_once(const uint16_t *p)
{
    uint4 v;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p));
    return v;
}

/* The weight loads of kUnroll chunks starting at chunk ch (then ch + kWarps, ...): rows g and
 * g + 8. */
__device__ __forceinline__ void load_group(const uint16_t *wa, const uint16_t *wb, int32_t ch,
                                           uint4 va[kUnroll], uint4 vb[kUnroll])
{
#pragma unroll
    for (int u = 0; u < kUnroll; u++) {
        const int64_t k = (int64_t)(ch + u * kWarps) * kChunk;
        va[u] = load_once(wa + k);
        vb[u] = load_once(wb + k);
    }
}

/* The inputs of chunk ch: rows 8t + g, zeros past the last row (they are small and stay in L2).
 * x is the kernel ahead's output: coherent loads, never __ldg (see attention_decode.cu's q). */
template <int TILES>
__device__ __forceinline__ void load_x(const uint16_t *const xr[TILES], const bool xok[TILES],
                                       int32_t ch, uint4 xv[TILES])
{
    const int64_t k = (int64_t)ch * kChunk;
#pragma unroll
    for (int t = 0; t < TILES; t++)
        xv[t] =
            xok[t] ? __ldcg(reinterpret_cast<const uint4 *>(xr[t] + k)) : make_uint4(0, 0, 0, 0);
}

template <int TILES, bool F32>
__global__ void __launch_bounds__(kThreads)
    gemv_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
                void *__restrict__ y, int32_t rows, int32_t in, int32_t out)
{
    __shared__ float part[kWarps][TILES][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, c = lane & 3;
    const int64_t n0 = (int64_t)blockIdx.x * kRowsPerCta;
    /* Rows past the end load the last row (in bounds) and are never stored. */
    const int64_t ra = min(n0 + g, (int64_t)out - 1), rb = min(n0 + g + 8, (int64_t)out - 1);
    const uint16_t *wa = w + ra * in + c * 8;
    const uint16_t *wb = w + rb * in + c * 8;
    const uint16_t *xr[TILES];
    bool xok[TILES];
#pragma unroll
    for (int t = 0; t < TILES; t++) {
        const int tok = t * 8 + g;
        xok[t] = tok < rows;
        xr[t] = x + (int64_t)(xok[t] ? tok : 0) * in + c * 8;
    }
    float acc[TILES][4];
#pragma unroll
    for (int t = 0; t < TILES; t++)
        acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;

    /* Software pipeline: the weight loads of the next kUnroll chunks are issued before the
     * products of the current ones, so a warp always has a group of loads in flight to DRAM. */
    const int32_t chunks = in / kChunk;
    const int32_t step = kUnroll * kWarps;
    int32_t ch = warp;
    uint4 va[kUnroll], vb[kUnroll];
    bool have = ch + (kUnroll - 1) * kWarps < chunks;
    if (have)
        load_group(wa, wb, ch, va, vb);
    /* Launched by launch_pdl: the first weights are on their way while the kernel ahead ends;
     * x is its output. */
    pdl_wait();
    pdl_launch_dependents();
    while (have) {
        const int32_t next = ch + step;
        const bool more = next + (kUnroll - 1) * kWarps < chunks;
        uint4 na[kUnroll], nb[kUnroll];
        if (more)
            load_group(wa, wb, next, na, nb);
#pragma unroll
        for (int u = 0; u < kUnroll; u++) {
            uint4 xv[TILES];
            load_x<TILES>(xr, xok, ch + u * kWarps, xv);
            chunk_mma<TILES>(acc, va[u], vb[u], xv);
        }
        if (more) {
#pragma unroll
            for (int u = 0; u < kUnroll; u++) {
                va[u] = na[u];
                vb[u] = nb[u];
            }
        }
        ch = next;
        have = more;
    }
    for (; ch < chunks; ch += kWarps) {
        const int64_t k = (int64_t)ch * kChunk;
        uint4 xv[TILES];
        load_x<TILES>(xr, xok, ch, xv);
        chunk_mma<TILES>(acc, load_once(wa + k), load_once(wb + k), xv);
    }

#pragma unroll
    for (int t = 0; t < TILES; t++)
#pragma unroll
        for (int j = 0; j < 4; j++)
            part[warp][t][j][lane] = acc[t][j];
    __syncthreads();
    gemv_tile_store<TILES, kWarps, F32>(&part[0][0][0][0], threadIdx.x, kThreads, n0, rows, out, y);
}

template <int TILES>
int launch(const uint16_t *x, const uint16_t *w, void *y, int y_f32, int32_t rows, int32_t in,
           int32_t out, cudaStream_t s)
{
    const unsigned grid = (unsigned)((out + kRowsPerCta - 1) / kRowsPerCta);
    return launch_pdl("cuda_gemv", y_f32 ? gemv_kernel<TILES, true> : gemv_kernel<TILES, false>,
                      grid, kThreads, 0, s, x, w, y, rows, in, out);
}

} // namespace

int cuda_gemv_fits(int32_t rows, int32_t in, int32_t out, const void *x, const void *w,
                   const void *y)
{
    return rows >= 1 && rows <= CUDA_GEMV_MAX_ROWS && in > 0 && in % kChunk == 0 && out >= 1 &&
           x != NULL && w != NULL && y != NULL && cuda_aligned16(x) && cuda_aligned16(w) &&
           cuda_aligned16(y);
}

int cuda_gemv(const uint16_t *x, const uint16_t *w, void *y, int y_f32, int32_t rows, int32_t in,
              int32_t out, cudaStream_t s)
{
    if (!cuda_gemv_fits(rows, in, out, x, w, y))
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_gemv: rows %d (1 .. %d), in %d (a multiple of %d), out %d, "
                                "buffers 16-byte aligned",
                                (int)rows, CUDA_GEMV_MAX_ROWS, (int)in, kChunk, (int)out);
    return rows <= 8 ? launch<1>(x, w, y, y_f32, rows, in, out, s)
                     : launch<2>(x, w, y, y_f32, rows, in, out, s);
}
