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
 * the one ahead (whose output is x).
 *
 * cuda_gemv_row_norm computes x itself, the transformer block's RMSNorm of the residual stream
 * (plus the last block's output), as cuda_add_rmsnorm does, bit for bit: every CTA normalises
 * the whole row (16 KiB of f32 read from L2), CTA 0 writes the new residual to a second buffer.
 * One kernel, and one wait on the kernel ahead, fewer for each linear behind a norm; on by
 * default in the CUDA backend (cuda_backend_options.gemv_row_norm). Measured slower than
 * cuda_gemv_row alone on one machine (fifteenth session), as fast or faster on others
 * (seventeenth; bench/RESULTS.md). */
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
/* cuda_gemv_row_norm: rows of up to 4 x 2048 (cuda_add_rmsnorm's one-pass kernel: up to 1024
 * threads of 8 elements). */
constexpr int kMaxNormGroups = 4;

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

/* The normalisation ahead of the linear (cuda_gemv_row_norm): x = RMSNorm(residual + add).
 * Every CTA computes it for the whole row; CTA 0 writes residual + add to residual_out. */
struct row_norm {
    const float *residual;
    const uint16_t *add;    /* NULL: nothing added, residual_out unused */
    const uint16_t *weight; /* the norm's weight */
    float *residual_out;
    float eps;
};

/* x into shared memory as cuda_add_rmsnorm (kernels/cuda/ops.cu) computes it for a row of `in`
 * elements, bit for bit: its kernel gives a thread 8 elements (in / 8 threads, kMaxNormGroups x
 * 256 at most) and adds each thread's 8 squares in order, each warp's threads with a butterfly,
 * then the warps' sums with a butterfly in warp 0. Here thread t holds that kernel's threads
 * t + 256 k (group k), so warp w of group k is its warp 8k + w: the same sums in the same order. */
__device__ __forceinline__ void norm_into(uint4 *xs, const row_norm &nrm, int32_t in)
{
    __shared__ float part[32];
    __shared__ float total;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int groups = in / kStepCols;
    float v[kMaxNormGroups][8];
#pragma unroll
    for (int k = 0; k < kMaxNormGroups; k++) {
        if (k >= groups)
            break;
        const int32_t c = (k * kThreads + threadIdx.x) * 8;
        const float4 a = reinterpret_cast<const float4 *>(nrm.residual + c)[0];
        const float4 b = reinterpret_cast<const float4 *>(nrm.residual + c)[1];
        v[k][0] = a.x, v[k][1] = a.y, v[k][2] = a.z, v[k][3] = a.w;
        v[k][4] = b.x, v[k][5] = b.y, v[k][6] = b.z, v[k][7] = b.w;
        if (nrm.add != nullptr) {
            float xf[8];
            bf16x8_to_float(*reinterpret_cast<const uint4 *>(nrm.add + c), xf);
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[k][i] += xf[i];
            if (blockIdx.x == 0) {
                reinterpret_cast<float4 *>(nrm.residual_out + c)[0] =
                    make_float4(v[k][0], v[k][1], v[k][2], v[k][3]);
                reinterpret_cast<float4 *>(nrm.residual_out + c)[1] =
                    make_float4(v[k][4], v[k][5], v[k][6], v[k][7]);
            }
        }
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++)
            ss += v[k][i] * v[k][i];
        ss = warp_sum(ss);
        if (lane == 0)
            part[k * kWarps + warp] = ss;
    }
    __syncthreads();
    if (warp == 0) {
        float t = lane < groups * kWarps ? part[lane] : 0.0f;
        t = warp_sum(t);
        if (lane == 0)
            total = t;
    }
    __syncthreads();
    const float inv = 1.0f / sqrtf(total / (float)in + nrm.eps);
#pragma unroll
    for (int k = 0; k < kMaxNormGroups; k++) {
        if (k >= groups)
            break;
        const int32_t c = (k * kThreads + threadIdx.x) * 8;
        float wf[8];
        bf16x8_to_float(__ldg(reinterpret_cast<const uint4 *>(nrm.weight + c)), wf);
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[k][i] = __fmul_rn(__fmul_rn(v[k][i], inv), wf[i]);
        xs[c / 8] = float_to_bf16x8(v[k]);
    }
}

template <bool F32, bool NORM>
__global__ void __launch_bounds__(kThreads, kCtasPerSm)
    gemv_row_kernel(const uint16_t *__restrict__ x, const uint16_t *__restrict__ w,
                    void *__restrict__ y, int32_t in, int32_t out, row_norm nrm)
{
    /* x: 48 KiB for any row; 16 KiB with the norm (its rows are at most 8192), beside the
     * norm's own few bytes, within the 48 KiB of static shared memory on every architecture. */
    __shared__ uint4 xs[NORM ? kMaxNormGroups * kStepCols / 8 : kMaxIn / 8];
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
    if (NORM) {
        norm_into(xs, nrm, in);
    } else {
        /* Coherent loads: x is the kernel ahead's output (not read-only data for the
         * non-coherent path). */
        for (int i = threadIdx.x; i < in / 8; i += kThreads)
            xs[i] = reinterpret_cast<const uint4 *>(x)[i];
    }
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

namespace
{

int launch_row(const uint16_t *x, const uint16_t *w, void *y, int y_f32, int32_t in, int32_t out,
               const row_norm *nrm, cudaStream_t s)
{
    int dev = 0, sms = 0;
    int rc = cuda_device_sms(&dev, &sms, "cuda_gemv_row: the device's SM count");
    if (rc < 0)
        return rc;
    const int64_t groups = ((int64_t)out + kWarps - 1) / kWarps;
    const int64_t most = (int64_t)sms * kCtasPerSm;
    const unsigned grid = (unsigned)(groups < most ? groups : most);
    const row_norm none = {};
    if (nrm != NULL)
        return launch_pdl("cuda_gemv_row_norm",
                          y_f32 ? gemv_row_kernel<true, true> : gemv_row_kernel<false, true>, grid,
                          kThreads, 0, s, x, w, y, in, out, *nrm);
    return launch_pdl("cuda_gemv_row",
                      y_f32 ? gemv_row_kernel<true, false> : gemv_row_kernel<false, false>, grid,
                      kThreads, 0, s, x, w, y, in, out, none);
}

} // namespace

int cuda_gemv_row(const uint16_t *x, const uint16_t *w, void *y, int y_f32, int32_t in, int32_t out,
                  cudaStream_t s)
{
    if (!cuda_gemv_row_fits(1, in, out, x, w, y))
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_gemv_row: in %d (a multiple of %d up to %d), out %d, "
                                "buffers 16-byte aligned",
                                (int)in, kStepCols, kMaxIn, (int)out);
    return launch_row(x, w, y, y_f32, in, out, NULL, s);
}

int cuda_gemv_row_norm_fits(int32_t in, int32_t out, const float *residual, const uint16_t *add,
                            const uint16_t *weight, const float *residual_out, const void *w,
                            const void *y)
{
    /* residual_out must not overlap residual: every CTA reads residual while CTA 0 writes. */
    const bool apart =
        residual_out != NULL && (residual_out + in <= residual || residual + in <= residual_out);
    return in <= kMaxNormGroups * kStepCols && residual != NULL && weight != NULL &&
           cuda_aligned16(residual) && cuda_aligned16(weight) &&
           (add == NULL || (apart && cuda_aligned16(add) && cuda_aligned16(residual_out))) &&
           cuda_gemv_row_fits(1, in, out, weight, w, y);
}

int cuda_gemv_row_norm(const float *residual, const uint16_t *add, const uint16_t *weight,
                       float eps, float *residual_out, const uint16_t *w, void *y, int y_f32,
                       int32_t in, int32_t out, cudaStream_t s)
{
    if (!cuda_gemv_row_norm_fits(in, out, residual, add, weight, residual_out, w, y) ||
        !(eps >= 0.0f) || !isfinite(eps))
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_gemv_row_norm: in %d (a multiple of %d up to %d), out %d, "
                                "eps %g, buffers 16-byte aligned, residual_out apart from "
                                "residual when add is set",
                                (int)in, kStepCols, kMaxNormGroups * kStepCols, (int)out,
                                (double)eps);
    const row_norm nrm = {residual, add, weight, residual_out, eps};
    return launch_row(NULL, w, y, y_f32, in, out, &nrm, s);
}
