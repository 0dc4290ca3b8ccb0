/* The one-row linear (kernels/cuda/linear.h cuda_gemv_row): y = w . x for a single input row,
 * the decode step of one sequence, where a linear is nothing but a pass over its weights.
 *
 * Each warp computes whole output features: warp v of CTA b takes features b * 8 + v, then
 * every (grid x 8)-th after it, so that neighbouring warps read neighbouring rows of w. A warp
 * step covers 2048 columns of one row: kUnroll 16-byte loads a lane, each load of the warp 512
 * contiguous bytes (the cuda_gemv of linear.cu reads 64 bytes of 16 rows at once and stays at
 * 3.6 TB/s on gate/up, bench/RESULTS.md). The loads of the next step (of this row or the warp's
 * next one) are issued before the current step's products: a lane keeps 2 x kUnroll loads in
 * flight, 16 warps an SM 128 KiB. x is copied into shared memory once per CTA; a lane sums its
 * products in f32 in a fixed order and the warp adds its lanes with a butterfly (deterministic).
 *
 * Launched by launch_pdl: the first step's weights are requested before the kernel waits for
 * the one ahead (whose output is x). */
#include "kernels/cuda/linear.h"

#include "kernels/cuda/common.cuh"

namespace
{

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 8;                  /* 16-byte loads a lane a step */
constexpr int kStepCols = 32 * 8 * kUnroll; /* 2048 columns a warp step */
constexpr int kCtasPerSm = 2;               /* 16 warps an SM: registers allow no more */
constexpr int kMaxIn = 48 * 1024 / 2;       /* x in the default 48 KiB of shared memory */

__device__ __forceinline__ uint4 load_once(const uint16_t *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* The step's loads: columns u * 256 + lane * 8 .. + 7 of p (the step's first column), u <
 * kUnroll. */
__device__ __forceinline__ void load_step(const uint16_t *p, int lane, uint4 v[kUnroll])
{
#pragma unroll
    for (int u = 0; u < kUnroll; u++)
        v[u] = load_once(p + u * 256 + lane * 8);
}

__device__ __forceinline__ float dot2(uint32_t a, uint32_t b, float acc)
{
    const float2 fa = bf16x2_to_float2(a), fb = bf16x2_to_float2(b);
    return fmaf(fa.y, fb.y, fmaf(fa.x, fb.x, acc));
}

__device__ __forceinline__ float dot8(uint4 w, uint4 x, float acc)
{
    acc = dot2(w.x, x.x, acc);
    acc = dot2(w.y, x.y, acc);
    acc = dot2(w.z, x.z, acc);
    return dot2(w.w, x.w, acc);
}

template <bool F32>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    gemv_row_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
                    void *__restrict__ y, int32_t in, int32_t out)
{
    __shared__ uint4 xs[kMaxIn / 8];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t stride = (int64_t)gridDim.x * kWarps;
    const int32_t steps = in / kStepCols;
    int64_t r = (int64_t)blockIdx.x * kWarps + warp;
    int32_t s = 0;
    bool have = r < out;
    uint4 cur[kUnroll];
    if (have)
        load_step(w + r * in, lane, cur);
    /* x is the kernel ahead's output; this warp's first weights are on their way. */
    pdl_wait();
    for (int i = threadIdx.x; i < in / 8; i += kThreads)
        xs[i] = __ldg(reinterpret_cast<const uint4 *>(x) + i);
    __syncthreads();
    pdl_launch_dependents();
    float acc = 0.0f;
    while (have) {
        int64_t nr = r;
        int32_t ns = s + 1;
        if (ns == steps) {
            nr = r + stride;
            ns = 0;
        }
        const bool more = nr < out;
        uint4 nxt[kUnroll];
        if (more)
            load_step(w + nr * in + (int64_t)ns * kStepCols, lane, nxt);
        const uint4 *xp = xs + s * (kStepCols / 8) + lane;
#pragma unroll
        for (int u = 0; u < kUnroll; u++)
            acc = dot8(cur[u], xp[u * 32], acc);
        if (ns == 0) {
            acc = warp_sum(acc);
            if (lane == 0) {
                if (F32)
                    static_cast<float *>(y)[r] = acc;
                else
                    static_cast<uint16_t *>(y)[r] = float_to_bf16_bits(acc);
            }
            acc = 0.0f;
        }
        if (more) {
#pragma unroll
            for (int u = 0; u < kUnroll; u++)
                cur[u] = nxt[u];
        }
        r = nr;
        s = ns;
        have = more;
    }
}

} // namespace

int cuda_gemv_row_fits(int32_t rows, int32_t in, int32_t out, const void *x, const void *w,
                       const void *y)
{
    return rows == 1 && in >= kStepCols && in % kStepCols == 0 && in <= kMaxIn && out >= 1 &&
           x != NULL && w != NULL && y != NULL && cuda_aligned16(x) && cuda_aligned16(w) &&
           cuda_aligned16(y);
}

int cuda_gemv_row(const uint16_t *x, const uint16_t *w, void *y, int y_f32, int32_t in, int32_t out,
                  cudaStream_t s)
{
    if (!cuda_gemv_row_fits(1, in, out, x, w, y))
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_gemv_row: in %d (a multiple of %d up to %d), out %d, "
                                "buffers 16-byte aligned",
                                (int)in, kStepCols, kMaxIn, (int)out);
    int dev = 0, sms = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return cuda_call_result(e, "cuda_gemv_row: the device's SM count");
    }
    const int64_t groups = ((int64_t)out + kWarps - 1) / kWarps;
    const int64_t most = (int64_t)sms * kCtasPerSm;
    const unsigned grid = (unsigned)(groups < most ? groups : most);
    return launch_pdl("cuda_gemv_row", y_f32 ? gemv_row_kernel<true> : gemv_row_kernel<false>, grid,
                      kThreads, 0, s, x, w, y, in, out);
}
