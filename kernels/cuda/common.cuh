/* Device helpers shared by the .cu files of kernels/cuda: bf16 conversions, 16-byte vectors
 * of eight bf16, warp reductions, and the translation of CUDA errors into pagoda's error space
 * at the boundary. Private to kernels/cuda (not a public header). */
#ifndef PAGODA_KERNELS_CUDA_COMMON_CUH
#define PAGODA_KERNELS_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "common/error.h"
}
#include "kernels/cuda/util.h"

/* Records the result of the launch just made (a bad configuration, too much shared memory)
 * as PAGODA_ECUDA with a detail naming the kernel. */
static inline int cuda_launch_result(const char *kernel)
{
    cuda_pdl_note_late(0); /* a plain launch never triggers late (util.h) */
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return pagoda_error_set(PAGODA_ECUDA, "%s: launch failed: %s", kernel,
                                cudaGetErrorString(e));
    return 0;
}

/* Translates the result of one CUDA runtime call, naming the call. */
static inline int cuda_call_result(cudaError_t e, const char *call)
{
    if (e != cudaSuccess)
        return pagoda_error_set(PAGODA_ECUDA, "%s: %s", call, cudaGetErrorString(e));
    return 0;
}

/* A runtime call's failure as cuda_call_result, its error also taken off cudaGetLastError (so
 * that a later launch is not blamed for it). */
static inline int cuda_call_failed(cudaError_t e, const char *what)
{
    (void)cudaGetLastError();
    return cuda_call_result(e, what);
}

/* The current device and its SM count (what a persistent kernel's grid is sized by); what
 * names the query in a failure's detail (cuda_call_failed). */
static inline int cuda_device_sms(int *dev, int *sms, const char *what)
{
    cudaError_t e = cudaGetDevice(dev);
    if (e == cudaSuccess)
        e = cudaDeviceGetAttribute(sms, cudaDevAttrMultiProcessorCount, *dev);
    return e == cudaSuccess ? 0 : cuda_call_failed(e, what);
}

static inline bool cuda_aligned16(const void *p)
{
    return ((uintptr_t)p & 15u) == 0;
}

/* ---- programmatic dependent launch (PDL, sm_90) ----
 * A kernel launched by launch_pdl while cuda_pdl_enabled() may be scheduled before the kernel
 * ahead of it in the stream has finished: as soon as every CTA of that kernel has executed
 * pdl_launch_dependents (or exited). Such a kernel must execute pdl_wait before it reads anything
 * an earlier kernel of the stream writes and before it writes anything an earlier kernel reads;
 * the wait returns when the kernel ahead has completed and its memory is visible, so the chain
 * stays ordered transitively. What it may do before the wait is read what no kernel writes (the
 * weights). Only kernels that wait may be launched by launch_pdl; every other launch keeps the
 * stream's full order. Both instructions do nothing when the kernel was launched without the
 * attribute. The kernels here trigger their dependents right after their own wait: a kernel
 * then runs at most one kernel ahead of the one that works (triggered before the wait, kernel
 * after kernel was scheduled ahead, each holding its SM resources while it waited: the step at
 * batch 1 took 1.2 ms longer with cuda_gemv, bench/RESULTS.md). */
__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#elif defined(__CUDA_ARCH__)
#error "kernels launched by launch_pdl need sm_90 or later (the project builds sm_90a)"
#endif
}

__device__ __forceinline__ void pdl_launch_dependents()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* The two halves of kernels/cuda/util.h's late trigger, for kernels that support it (`late`
 * from cuda_pdl_late_wanted() at launch): pdl_trigger_early right after pdl_wait signals as
 * above unless late; pdl_trigger_late, reached by every thread of every CTA that stored
 * anything (a CTA may exit earlier only if it stored nothing), fences this thread's stores at
 * gpu scope, and for the async proxy too (the GEMM behind reads them by TMA), waits for the
 * CTA's threads, then signals. */
__device__ __forceinline__ void pdl_trigger_early(bool late)
{
    if (!late)
        pdl_launch_dependents();
}

__device__ __forceinline__ void pdl_trigger_late(bool late)
{
    if (late) {
        __threadfence();
        asm volatile("fence.proxy.async.global;" ::: "memory");
        __syncthreads();
        pdl_launch_dependents();
    }
}

/* Launches kernel<<<grid, block, smem, s>>>(args...), with programmatic stream serialization
 * when cuda_pdl_enabled() (the calling thread's setting, cuda_set_pdl). The kernel must call
 * pdl_wait as the comment above says. Returns 0, or PAGODA_ECUDA naming what (the launch's own
 * error, which cuda_launch_result takes off cudaGetLastError so that it is not blamed on a later
 * launch; a launch that succeeds leaves cudaGetLastError alone). */
template <typename... Params, typename... Args>
static inline int launch_pdl(const char *what, void (*kernel)(Params...), dim3 grid, dim3 block,
                             size_t smem, cudaStream_t s, Args... args)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = cuda_pdl_enabled() ? 1 : 0;
    cuda_pdl_note_late(0); /* a kernel launched late says so after this (util.h) */
    const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
    return e == cudaSuccess ? 0 : cuda_launch_result(what);
}

/* launch_pdl for a kernel whose last parameter is `late` (util.h's late trigger): passes it
 * cuda_pdl_late_wanted() and, once launched, notes what it passed (cuda_pdl_note_late). */
template <typename... Params, typename... Args>
static inline int launch_pdl_late(const char *what, void (*kernel)(Params...), dim3 grid,
                                  dim3 block, size_t smem, cudaStream_t s, Args... args)
{
    const int late = cuda_pdl_late_wanted();
    const int rc = launch_pdl(what, kernel, grid, block, smem, s, args..., late);
    if (rc == 0)
        cuda_pdl_note_late(late);
    return rc;
}

__device__ __forceinline__ float bf16_bits_to_float(uint16_t h)
{
    return __uint_as_float((uint32_t)h << 16);
}

/* silu(g) * u = g / (1 + exp(-g)) * u, each step rounded as written (f32): SiLU-and-multiply's
 * one definition (cuda_silu_mul, and linear_tma's gate/up epilogue, which must give its bits). */
__device__ __forceinline__ float silu_mul1(float g, float u)
{
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

/* Round to nearest even, NaN kept (cuda_bf16's conversion, as PyTorch and common/dtype.h). */
__device__ __forceinline__ uint16_t float_to_bf16_bits(float f)
{
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

/* The two bf16 of a 32-bit word (low half first, the element with the lower address). */
__device__ __forceinline__ float2 bf16x2_to_float2(uint32_t w)
{
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

__device__ __forceinline__ uint32_t float2_to_bf16x2(float lo, float hi)
{
    return (uint32_t)float_to_bf16_bits(lo) | ((uint32_t)float_to_bf16_bits(hi) << 16);
}

/* Eight bf16 of a 16-byte vector to f32 and back. */
__device__ __forceinline__ void bf16x8_to_float(uint4 v, float f[8])
{
    float2 a = bf16x2_to_float2(v.x), b = bf16x2_to_float2(v.y);
    float2 c = bf16x2_to_float2(v.z), d = bf16x2_to_float2(v.w);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
    f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

__device__ __forceinline__ uint4 float_to_bf16x8(const float f[8])
{
    return make_uint4(float2_to_bf16x2(f[0], f[1]), float2_to_bf16x2(f[2], f[3]),
                      float2_to_bf16x2(f[4], f[5]), float2_to_bf16x2(f[6], f[7]));
}

/* c += a . b on the tensor cores: m16n8k16, bf16 inputs, f32 accumulators. Fragments (lane
 * t, g = t / 4, c = 2 * (t % 4)): a0 = A[g][c, c+1], a1 = A[g+8][c, c+1], a2 = A[g][c+8, c+9],
 * a3 = A[g+8][c+8, c+9]; b0 = B[c, c+1][g], b1 = B[c+8, c+9][g]; c0, c1 = C[g][c, c+1], c2, c3 =
 * C[g+8][c, c+1]. */
__device__ __forceinline__ void mma_bf16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, "
        "%7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The same with f16 inputs (the attention over an F8E4M3 pool: its keys and values convert to
 * f16 exactly). */
__device__ __forceinline__ void mma_f16(float d[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                        uint32_t a3, uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, "
        "%7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* ---- F8E4M3 (common/dtype.h): the K/V pool's 8-bit element ---- */

/* x clamped to f16's finite range (a bf16 query beyond 65504 would otherwise become infinite);
 * NaN stays NaN. */
__device__ __forceinline__ float f16_range(float x)
{
    return isnan(x) ? x : fminf(fmaxf(x, -65504.0f), 65504.0f);
}

/* Two f32 to an f16 pair (lo at the lower address), each clamped by f16_range first. */
__device__ __forceinline__ uint32_t float2_to_f16x2_sat(float lo, float hi)
{
    const __half2 h = __floats2half2_rn(f16_range(lo), f16_range(hi));
    return *reinterpret_cast<const uint32_t *>(&h);
}

/* Two F8E4M3 codes (the lower byte first) to an f16 pair: exact. */
__device__ __forceinline__ uint32_t e4m3x2_to_f16x2(uint16_t w)
{
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)w, __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}

/* Sixteen codes (a 16-byte chunk) to sixteen f16 (two 16-byte chunks). */
__device__ __forceinline__ void e4m3x16_to_f16x16(uint4 in, uint4 &lo, uint4 &hi)
{
    lo.x = e4m3x2_to_f16x2((uint16_t)in.x), lo.y = e4m3x2_to_f16x2((uint16_t)(in.x >> 16));
    lo.z = e4m3x2_to_f16x2((uint16_t)in.y), lo.w = e4m3x2_to_f16x2((uint16_t)(in.y >> 16));
    hi.x = e4m3x2_to_f16x2((uint16_t)in.z), hi.y = e4m3x2_to_f16x2((uint16_t)(in.z >> 16));
    hi.z = e4m3x2_to_f16x2((uint16_t)in.w), hi.w = e4m3x2_to_f16x2((uint16_t)(in.w >> 16));
}

/* f32 to the nearest F8E4M3 code, saturating (f32_to_e4m3 of common/dtype.h, bit for bit). */
__device__ __forceinline__ uint8_t float_to_e4m3(float f)
{
    return (uint8_t)__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3);
}

/* Four 8 x 8 bf16 matrices from shared memory at shared-memory address a (lane i gives the
 * address of row i % 8 of matrix i / 8); trans gives each thread a column pair instead of a row
 * pair. */
__device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t a)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t r[4], uint32_t a)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a)
                 : "memory");
}

/* The same from a generic pointer into shared memory. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p)
{
    ldsm_x4(r, (uint32_t)__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p)
{
    ldsm_x4_trans(r, (uint32_t)__cvta_generic_to_shared(p));
}

/* ---- shared by the kernels that write the step's K/V (kernels/cuda/ops.cu) and the decode
 * attention that writes it itself (attention_decode.cu, cuda_attention_run_rope): one definition,
 * so that they agree bit for bit ---- */

/* The element offset of slot `slot` in a pool layer (its block times block_stride, plus its
 * place in the block times slot_stride), or -1 for a slot written nowhere: padding (negative),
 * the reserved block 0, or past the pool's num_blocks. */
__device__ __forceinline__ int64_t kv_slot_base(int64_t slot, int32_t block_size,
                                                int32_t num_blocks, int64_t block_stride,
                                                int64_t slot_stride)
{
    if (slot < block_size || slot >= (int64_t)num_blocks * block_size)
        return -1;
    const int64_t block = slot / block_size;
    return block * block_stride + (slot - block * block_size) * slot_stride;
}

/* Stores the bf16 value h at element at of a pool layer's K or V: itself (bf16), or its nearest
 * F8E4M3 code (f8). */
__device__ __forceinline__ void kv_cache_store(void *base, int64_t at, uint16_t h, bool f8)
{
    if (f8)
        static_cast<uint8_t *>(base)[at] = float_to_e4m3(bf16_bits_to_float(h));
    else
        static_cast<uint16_t *>(base)[at] = h;
}

/* RoPE: the cos and sin of a token's angle pos * inv_freq (the product rounded to f32, then the
 * precise sincosf). */
__device__ __forceinline__ void rope_cos_sin(float pos, float inv_freq, float &cs, float &sn)
{
    sincosf(__fmul_rn(pos, inv_freq), &sn, &cs);
}

/* RoPE's rotation of the pair (x, y) = (element i, element i + head_dim / 2) of a head with the
 * cos cs and sin sn of its angle, rounded to bf16: rounded products, no fused multiply-add (the
 * CPU reference's order). */
__device__ __forceinline__ void rope_pair(float x, float y, float cs, float sn, uint16_t &rx,
                                          uint16_t &ry)
{
    rx = float_to_bf16_bits(__fsub_rn(__fmul_rn(x, cs), __fmul_rn(y, sn)));
    ry = float_to_bf16_bits(__fadd_rn(__fmul_rn(y, cs), __fmul_rn(x, sn)));
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

#endif
