/* The dense operations of the forward pass on the GPU: embedding, residual add + RMSNorm, bias,
 * RoPE, SiLU-and-multiply, reshape-and-cache. Each is memory-bound: one pass over its rows,
 * 16-byte accesses where the buffers allow (see ops.h), f32 arithmetic in the order the CPU
 * reference (kernels/cpu/ops.c) uses, so that the two differ only by the final bf16 rounding
 * and the last bits of the library functions. */
#include "kernels/cuda/ops.h"

#include "kernels/cuda/common.cuh"

#include <math.h>

namespace
{

constexpr int kThreads = 256;
/* The largest CTA (the register-resident RMSNorm, the fused RoPE and cache write). */
constexpr int kMaxThreads = 1024;
/* Grid-stride kernels never need more CTAs than this to fill the GPU. */
constexpr int64_t kMaxGrid = 8192;

unsigned grid_for(int64_t work, int threads)
{
    int64_t g = (work + threads - 1) / threads;
    if (g < 1)
        g = 1;
    return (unsigned)(g < kMaxGrid ? g : kMaxGrid);
}

/* Threads for one CTA per row of n work items: a multiple of 32 up to kThreads. */
int threads_for_row(int64_t n)
{
    int64_t t = (n + 31) / 32 * 32;
    if (t < 32)
        t = 32;
    return (int)(t < kThreads ? t : kThreads);
}

/* ---- embedding ---- */

template <bool VEC>
__global__ void embedding_kernel(const uint16_t *__restrict__ table,
                                 const int32_t *__restrict__ ids, int32_t hidden,
                                 int32_t vocab_begin, int32_t vocab_end,
                                 float *__restrict__ residual)
{
    pdl_wait();
    pdl_launch_dependents();
    const int64_t t = blockIdx.x;
    const int32_t id = ids[t];
    float *dst = residual + t * hidden;
    if (id < vocab_begin || id >= vocab_end) { /* another rank's row: zeros */
        for (int32_t c = threadIdx.x; c < hidden; c += blockDim.x)
            dst[c] = 0.0f;
        return;
    }
    const uint16_t *src = table + (int64_t)(id - vocab_begin) * hidden;
    if (VEC) {
        for (int32_t c = threadIdx.x * 8; c < hidden; c += blockDim.x * 8) {
            float f[8];
            bf16x8_to_float(__ldg(reinterpret_cast<const uint4 *>(src + c)), f);
            reinterpret_cast<float4 *>(dst + c)[0] = make_float4(f[0], f[1], f[2], f[3]);
            reinterpret_cast<float4 *>(dst + c)[1] = make_float4(f[4], f[5], f[6], f[7]);
        }
    } else {
        for (int32_t c = threadIdx.x; c < hidden; c += blockDim.x)
            dst[c] = bf16_bits_to_float(src[c]);
    }
}

/* ---- residual add + RMSNorm ---- */

/* The sum of v over the CTA, returned to every thread. */
__device__ float block_sum(float v)
{
    __shared__ float partial[32];
    __shared__ float total;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    if (lane == 0)
        partial[warp] = v;
    __syncthreads();
    if (warp == 0) {
        v = lane < (int)(blockDim.x >> 5) ? partial[lane] : 0.0f;
        v = warp_sum(v);
        if (lane == 0)
            total = v;
    }
    __syncthreads();
    return total;
}

/* v[0 .. 7] += the 8 f32 at p (16-byte aligned): a partial product of the kernel ahead, read
 * through L2 (coherent loads: never __ldg on another kernel's output). */
__device__ __forceinline__ void add_parts8(float v[8], const float *p)
{
    const float4 a = __ldcg(reinterpret_cast<const float4 *>(p));
    const float4 b = __ldcg(reinterpret_cast<const float4 *>(p) + 1);
    v[0] += a.x, v[1] += a.y, v[2] += a.z, v[3] += a.w;
    v[4] += b.x, v[5] += b.y, v[6] += b.z, v[7] += b.w;
}

/* One CTA per row. The first pass adds x and then the parts into the residual and sums squares; the
 * second reads back the residual values this same thread wrote, normalises and applies the weight.
 */
template <bool VEC>
__global__ void add_rmsnorm_kernel(float *__restrict__ residual, const uint16_t *__restrict__ x,
                                   const float *__restrict__ parts, int32_t nparts,
                                   int64_t part_stride, const uint16_t *__restrict__ weight,
                                   uint16_t *__restrict__ out, int32_t dim, float eps, int late)
{
    pdl_wait();
    pdl_trigger_early(late);
    const int64_t row = blockIdx.x;
    float *r = residual + row * dim;
    const uint16_t *xr = x != nullptr ? x + row * dim : nullptr;
    const float *pr = parts + row * dim; /* used only when nparts > 0 */
    const bool adds = xr != nullptr || nparts > 0;
    uint16_t *o = out + row * dim;

    float ss = 0.0f;
    if (VEC) {
        for (int32_t c = threadIdx.x * 8; c < dim; c += blockDim.x * 8) {
            float4 a = reinterpret_cast<float4 *>(r + c)[0];
            float4 b = reinterpret_cast<float4 *>(r + c)[1];
            float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            if (xr != nullptr) {
                float xf[8];
                bf16x8_to_float(*reinterpret_cast<const uint4 *>(xr + c), xf);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    v[i] += xf[i];
            }
            for (int32_t p = 0; p < nparts; p++)
                add_parts8(v, pr + p * part_stride + c);
            if (adds) {
                reinterpret_cast<float4 *>(r + c)[0] = make_float4(v[0], v[1], v[2], v[3]);
                reinterpret_cast<float4 *>(r + c)[1] = make_float4(v[4], v[5], v[6], v[7]);
            }
#pragma unroll
            for (int i = 0; i < 8; i++)
                ss += v[i] * v[i];
        }
    } else {
        for (int32_t c = threadIdx.x; c < dim; c += blockDim.x) {
            float v = r[c];
            if (xr != nullptr)
                v += bf16_bits_to_float(xr[c]);
            for (int32_t p = 0; p < nparts; p++)
                v += __ldcg(pr + p * part_stride + c);
            if (adds)
                r[c] = v;
            ss += v * v;
        }
    }
    ss = block_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);

    if (VEC) {
        for (int32_t c = threadIdx.x * 8; c < dim; c += blockDim.x * 8) {
            float4 a = reinterpret_cast<const float4 *>(r + c)[0];
            float4 b = reinterpret_cast<const float4 *>(r + c)[1];
            float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
            float w[8];
            bf16x8_to_float(__ldg(reinterpret_cast<const uint4 *>(weight + c)), w);
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[i] = __fmul_rn(__fmul_rn(v[i], inv), w[i]);
            *reinterpret_cast<uint4 *>(o + c) = float_to_bf16x8(v);
        }
    } else {
        for (int32_t c = threadIdx.x; c < dim; c += blockDim.x)
            o[c] =
                float_to_bf16_bits(__fmul_rn(__fmul_rn(r[c], inv), bf16_bits_to_float(weight[c])));
    }
    pdl_trigger_late(late);
}

/* The same function for rows of at most kMaxThreads * 8 elements in 16-byte vectors: one
 * vector per thread, kept in registers between the sum of squares and the scaling, the weight
 * loaded before the reduction (one round trip to memory instead of three; issue 15 measured the
 * two-pass kernel at 4.1 us a row-set in a decode step). */
__global__ void add_rmsnorm_reg_kernel(float *__restrict__ residual, const uint16_t *__restrict__ x,
                                       const float *__restrict__ parts, int32_t nparts,
                                       int64_t part_stride, const uint16_t *__restrict__ weight,
                                       uint16_t *__restrict__ out, int32_t dim, float eps, int late)
{
    const int64_t row = blockIdx.x;
    const int32_t c = threadIdx.x * 8;
    const bool mine = c < dim;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0}, w[8];
    float ss = 0.0f;
    /* The weight is no kernel's output: loaded before the wait for the kernel ahead. */
    if (mine)
        bf16x8_to_float(__ldg(reinterpret_cast<const uint4 *>(weight + c)), w);
    pdl_wait();
    pdl_trigger_early(late);
    if (mine) {
        float *r = residual + row * dim + c;
        float4 a = reinterpret_cast<float4 *>(r)[0];
        float4 b = reinterpret_cast<float4 *>(r)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
        if (x != nullptr) {
            float xf[8];
            bf16x8_to_float(*reinterpret_cast<const uint4 *>(x + row * dim + c), xf);
#pragma unroll
            for (int i = 0; i < 8; i++)
                v[i] += xf[i];
        }
        for (int32_t p = 0; p < nparts; p++)
            add_parts8(v, parts + p * part_stride + row * dim + c);
        if (x != nullptr || nparts > 0) {
            reinterpret_cast<float4 *>(r)[0] = make_float4(v[0], v[1], v[2], v[3]);
            reinterpret_cast<float4 *>(r)[1] = make_float4(v[4], v[5], v[6], v[7]);
        }
#pragma unroll
        for (int i = 0; i < 8; i++)
            ss += v[i] * v[i];
    }
    ss = block_sum(ss);
    const float inv = 1.0f / sqrtf(ss / (float)dim + eps);
    if (mine) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            v[i] = __fmul_rn(__fmul_rn(v[i], inv), w[i]);
        *reinterpret_cast<uint4 *>(out + row * dim + c) = float_to_bf16x8(v);
    }
    pdl_trigger_late(late);
}

/* ---- bias ---- */

template <bool VEC>
__global__ void add_bias_kernel(uint16_t *__restrict__ x, int64_t ld,
                                const uint16_t *__restrict__ bias, int32_t rows, int32_t cols)
{
    const int32_t width = VEC ? cols / 8 : cols;
    const int64_t n = (int64_t)rows * width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / width;
        const int32_t c = (int32_t)(i - r * width);
        if (VEC) {
            uint4 *p = reinterpret_cast<uint4 *>(x + r * ld + (int64_t)c * 8);
            float a[8], b[8];
            bf16x8_to_float(*p, a);
            bf16x8_to_float(__ldg(reinterpret_cast<const uint4 *>(bias + (int64_t)c * 8)), b);
#pragma unroll
            for (int k = 0; k < 8; k++)
                a[k] += b[k];
            *p = float_to_bf16x8(a);
        } else {
            uint16_t *p = x + r * ld + c;
            *p = float_to_bf16_bits(bf16_bits_to_float(*p) + bf16_bits_to_float(bias[c]));
        }
    }
}

/* y = bf16(bf16(x) + bias) (bias NULL: bf16(x)) over [rows][cols]: a row (blockIdx.y stride)
 * and its columns (blockIdx.x, threadIdx.x stride), so the bias is indexed by column. */
__global__ void to_bf16_bias_kernel(const float *__restrict__ x, const uint16_t *__restrict__ bias,
                                    uint16_t *__restrict__ y, int32_t rows, int32_t cols)
{
    for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
        const float *xr = x + r * cols;
        uint16_t *yr = y + r * cols;
        for (int32_t c = blockIdx.x * blockDim.x + threadIdx.x; c < cols;
             c += gridDim.x * blockDim.x) {
            const uint16_t v = float_to_bf16_bits(xr[c]);
            yr[c] = bias == NULL
                        ? v
                        : float_to_bf16_bits(bf16_bits_to_float(v) + bf16_bits_to_float(bias[c]));
        }
    }
}

/* ---- RoPE ---- */

/* One CTA per row: the row's cos and sin (one per frequency) are computed once into shared
 * memory, then every head of the row is rotated with them. */
__global__ void rope_kernel(uint16_t *__restrict__ x, int64_t row_stride,
                            const int32_t *__restrict__ positions,
                            const float *__restrict__ inv_freq, int32_t num_heads, int32_t head_dim)
{
    extern __shared__ float rope_cs[]; /* [half] cos, then [half] sin */
    const int32_t half = head_dim / 2;
    const int64_t row = blockIdx.x;
    const float pos = (float)positions[row];
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x)
        rope_cos_sin(pos, inv_freq[i], rope_cs[i], rope_cs[half + i]);
    __syncthreads();
    uint16_t *base = x + row * row_stride;
    const int32_t n = num_heads * half;
    for (int32_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
        const int32_t h = idx / half, i = idx - h * half;
        uint16_t *v = base + (int64_t)h * head_dim;
        const float a = bf16_bits_to_float(v[i]), b = bf16_bits_to_float(v[i + half]);
        rope_pair(a, b, rope_cs[i], rope_cs[half + i], v[i], v[i + half]);
    }
}

/* ---- SiLU and multiply ---- */

template <bool VEC>
__global__ void silu_mul_kernel(const uint16_t *__restrict__ gate_up, uint16_t *__restrict__ out,
                                int32_t rows, int32_t inter, int late)
{
    pdl_wait();
    pdl_trigger_early(late);
    const int32_t width = VEC ? inter / 8 : inter;
    const int64_t n = (int64_t)rows * width;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / width;
        const int32_t c = (int32_t)(i - r * width);
        const uint16_t *g = gate_up + r * 2 * inter;
        if (VEC) {
            float gf[8], uf[8];
            /* g is the kernel ahead's output: coherent loads (see attention_decode.cu's q). */
            bf16x8_to_float(__ldcg(reinterpret_cast<const uint4 *>(g + (int64_t)c * 8)), gf);
            bf16x8_to_float(__ldcg(reinterpret_cast<const uint4 *>(g + inter + (int64_t)c * 8)),
                            uf);
#pragma unroll
            for (int k = 0; k < 8; k++)
                gf[k] = silu_mul1(gf[k], uf[k]);
            *reinterpret_cast<uint4 *>(out + r * inter + (int64_t)c * 8) = float_to_bf16x8(gf);
        } else {
            out[r * inter + c] = float_to_bf16_bits(
                silu_mul1(bf16_bits_to_float(g[c]), bf16_bits_to_float(g[inter + c])));
        }
    }
    pdl_trigger_late(late);
}

/* ---- reshape and cache (and RoPE fused with it) ---- */

struct cache_dst {
    void *k, *v;
    int64_t block_stride, head_stride, slot_stride;
    int32_t block_size, num_kv_heads, head_dim, num_blocks;
    int32_t f8; /* 1: an F8E4M3 pool (each bf16 value stored as its nearest code), 0: bf16 */
};

/* Eight bf16 values (16 bytes) at element at (a multiple of 8) of a pool layer's K or V. */
__device__ __forceinline__ void cache_store8(void *base, int64_t at, uint4 h, bool f8)
{
    if (f8) {
        const uint32_t w[4] = {h.x, h.y, h.z, h.w};
        uint32_t b[2] = {0, 0};
#pragma unroll
        for (int i = 0; i < 8; i++)
            b[i / 4] |=
                (uint32_t)float_to_e4m3(bf16_bits_to_float((uint16_t)(w[i / 2] >> (16 * (i & 1)))))
                << (8 * (i & 3));
        *reinterpret_cast<uint2 *>(static_cast<uint8_t *>(base) + at) = make_uint2(b[0], b[1]);
    } else {
        *reinterpret_cast<uint4 *>(static_cast<uint16_t *>(base) + at) = h;
    }
}

/* A bf16 or F8E4M3 layer view as the cache-writing kernels take it. */
static cache_dst cache_dst_of(const struct kv_layer_view *kv)
{
    cache_dst dst;
    dst.k = kv->k;
    dst.v = kv->v;
    dst.f8 = kv->dtype == DTYPE_F8E4M3;
    dst.block_stride = kv->block_stride;
    dst.head_stride = kv->head_stride;
    dst.slot_stride = kv->slot_stride;
    dst.block_size = kv->block_size;
    dst.num_kv_heads = kv->num_kv_heads;
    dst.head_dim = kv->head_dim;
    dst.num_blocks = kv->num_blocks;
    return dst;
}

/* One CTA per token. Slots outside the pool's usable range (padding, block 0, beyond the end)
 * write nothing. */
template <bool VEC>
__global__ void reshape_and_cache_kernel(cache_dst dst, const uint16_t *__restrict__ k,
                                         const uint16_t *__restrict__ v, int64_t row_stride,
                                         const int64_t *__restrict__ slot_mapping)
{
    const int64_t t = blockIdx.x;
    const int64_t base = kv_slot_base(slot_mapping[t], dst.block_size, dst.num_blocks,
                                      dst.block_stride, dst.slot_stride);
    if (base < 0)
        return;
    const uint16_t *ks = k + t * row_stride;
    const uint16_t *vs = v + t * row_stride;
    const int32_t step = VEC ? 8 : 1;
    const int32_t n = dst.num_kv_heads * dst.head_dim;
    for (int32_t c = threadIdx.x * step; c < n; c += blockDim.x * step) {
        const int32_t h = c / dst.head_dim, d = c - h * dst.head_dim;
        const int64_t at = base + h * dst.head_stride + d;
        if (VEC) {
            cache_store8(dst.k, at, *reinterpret_cast<const uint4 *>(ks + c), dst.f8);
            cache_store8(dst.v, at, *reinterpret_cast<const uint4 *>(vs + c), dst.f8);
        } else {
            kv_cache_store(dst.k, at, ks[c], dst.f8);
            kv_cache_store(dst.v, at, vs[c], dst.f8);
        }
    }
}

/* RoPE and the cache write in one pass (cuda_rope_cache): one CTA per token, cos and sin in
 * shared memory as rope_kernel; each thread rotates its pairs of the Q and K heads with
 * rope_kernel's arithmetic, writes them back and, for K, into the pool; then the row's V heads are
 * copied. A slot outside the pool's usable range rotates the row and writes nothing to the pool. */
__global__ void rope_cache_kernel(uint16_t *__restrict__ qkv, int64_t row_stride,
                                  const int32_t *__restrict__ positions,
                                  const float *__restrict__ inv_freq, int32_t num_q_heads,
                                  cache_dst dst, const int64_t *__restrict__ slot_mapping)
{
    extern __shared__ float rope_cs[]; /* [half] cos, then [half] sin */
    pdl_wait();
    pdl_launch_dependents();
    const int32_t head_dim = dst.head_dim, half = head_dim / 2;
    const int64_t row = blockIdx.x;
    const float pos = (float)positions[row];
    for (int32_t i = threadIdx.x; i < half; i += blockDim.x)
        rope_cos_sin(pos, inv_freq[i], rope_cs[i], rope_cs[half + i]);
    __syncthreads();
    const int64_t base = kv_slot_base(slot_mapping[row], dst.block_size, dst.num_blocks,
                                      dst.block_stride, dst.slot_stride);
    const bool store = base >= 0;
    uint16_t *x = qkv + row * row_stride;
    const int32_t n = (num_q_heads + dst.num_kv_heads) * half;
    for (int32_t idx = threadIdx.x; idx < n; idx += blockDim.x) {
        const int32_t h = idx / half, i = idx - h * half;
        uint16_t *v = x + (int64_t)h * head_dim;
        const float a = bf16_bits_to_float(v[i]), b = bf16_bits_to_float(v[i + half]);
        uint16_t ra, rb;
        rope_pair(a, b, rope_cs[i], rope_cs[half + i], ra, rb);
        v[i] = ra;
        v[i + half] = rb;
        if (h >= num_q_heads && store) {
            const int64_t k = base + (int64_t)(h - num_q_heads) * dst.head_stride;
            kv_cache_store(dst.k, k + i, ra, dst.f8);
            kv_cache_store(dst.k, k + i + half, rb, dst.f8);
        }
    }
    if (!store)
        return;
    const uint16_t *vs = x + (int64_t)(num_q_heads + dst.num_kv_heads) * head_dim;
    for (int32_t c = threadIdx.x; c < dst.num_kv_heads * head_dim; c += blockDim.x) {
        const int32_t h = c / head_dim, d = c - h * head_dim;
        kv_cache_store(dst.v, base + h * dst.head_stride + d, vs[c], dst.f8);
    }
}

} // namespace

int cuda_embedding(const uint16_t *table, const int32_t *ids, int32_t num_tokens, int32_t hidden,
                   float *residual, cudaStream_t s)
{
    return cuda_embedding_rows(table, ids, num_tokens, hidden, 0, INT32_MAX, residual, s);
}

int cuda_embedding_rows(const uint16_t *table, const int32_t *ids, int32_t num_tokens,
                        int32_t hidden, int32_t vocab_begin, int32_t vocab_end, float *residual,
                        cudaStream_t s)
{
    if (num_tokens < 0 || hidden <= 0 || vocab_begin < 0 || vocab_end <= vocab_begin)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_embedding: num_tokens %d, hidden %d, rows %d .. %d",
                                (int)num_tokens, (int)hidden, (int)vocab_begin, (int)vocab_end);
    if (num_tokens == 0)
        return 0;
    if (table == NULL || ids == NULL || residual == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_embedding: NULL buffer");
    const bool vec = hidden % 8 == 0 && cuda_aligned16(table) && cuda_aligned16(residual);
    const int threads = threads_for_row(vec ? hidden / 8 : hidden);
    return launch_pdl("cuda_embedding", vec ? embedding_kernel<true> : embedding_kernel<false>,
                      num_tokens, threads, 0, s, table, ids, hidden, vocab_begin, vocab_end,
                      residual);
}

int cuda_add_rmsnorm(float *residual, const uint16_t *x, const uint16_t *weight, uint16_t *out,
                     int32_t rows, int32_t dim, float eps, cudaStream_t s)
{
    return cuda_add_parts_rmsnorm(residual, x, NULL, 0, 0, weight, out, rows, dim, eps, s);
}

int cuda_add_parts_rmsnorm(float *residual, const uint16_t *x, const float *parts, int32_t nparts,
                           int64_t part_stride, const uint16_t *weight, uint16_t *out, int32_t rows,
                           int32_t dim, float eps, cudaStream_t s)
{
    if (rows < 0 || dim <= 0 || !(eps >= 0.0f) || !isfinite(eps) || nparts < 0 ||
        (nparts > 0 && part_stride < (int64_t)rows * dim))
        return pagoda_error_set(
            PAGODA_EINVAL, "cuda_add_rmsnorm: rows %d, dim %d, eps %g, %d parts %lld apart",
            (int)rows, (int)dim, (double)eps, (int)nparts, (long long)part_stride);
    if (rows == 0)
        return 0;
    if (residual == NULL || weight == NULL || out == NULL || (nparts > 0 && parts == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "cuda_add_rmsnorm: NULL buffer");
    if (nparts > 0) { /* the kernels take the slices as overlapping nothing they write */
        const uintptr_t p0 = (uintptr_t)parts,
                        p1 = p0 + ((size_t)(nparts - 1) * (size_t)part_stride +
                                   (size_t)rows * (size_t)dim) *
                                      sizeof(float);
        const uintptr_t r0 = (uintptr_t)residual, r1 = r0 + (size_t)rows * dim * sizeof(float);
        const uintptr_t o0 = (uintptr_t)out, o1 = o0 + (size_t)rows * dim * sizeof(uint16_t);
        if ((p0 < r1 && r0 < p1) || (p0 < o1 && o0 < p1))
            return pagoda_error_set(PAGODA_EINVAL,
                                    "cuda_add_rmsnorm: the slices overlap the residual or the "
                                    "output");
    }
    const bool vec = dim % 8 == 0 && cuda_aligned16(residual) && cuda_aligned16(weight) &&
                     cuda_aligned16(out) && (x == NULL || cuda_aligned16(x)) &&
                     (nparts == 0 || (cuda_aligned16(parts) && part_stride % 4 == 0));
    if (vec && dim / 8 <= kMaxThreads) {
        const int threads = (dim / 8 + 31) / 32 * 32;
        return launch_pdl_late("cuda_add_rmsnorm", add_rmsnorm_reg_kernel, rows, threads, 0, s,
                               residual, x, parts, nparts, part_stride, weight, out, dim, eps);
    }
    const int threads = threads_for_row(vec ? dim / 8 : dim);
    return launch_pdl_late(
        "cuda_add_rmsnorm", vec ? add_rmsnorm_kernel<true> : add_rmsnorm_kernel<false>, rows,
        threads, 0, s, residual, x, parts, nparts, part_stride, weight, out, dim, eps);
}

int cuda_add_bias(uint16_t *x, int64_t ld, const uint16_t *bias, int32_t rows, int32_t cols,
                  cudaStream_t s)
{
    if (rows < 0 || cols <= 0 || ld < cols)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_add_bias: rows %d, cols %d, ld %lld",
                                (int)rows, (int)cols, (long long)ld);
    if (rows == 0)
        return 0;
    if (x == NULL || bias == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_add_bias: NULL buffer");
    const bool vec = cols % 8 == 0 && ld % 8 == 0 && cuda_aligned16(x) && cuda_aligned16(bias);
    const int64_t work = (int64_t)rows * (vec ? cols / 8 : cols);
    if (vec)
        add_bias_kernel<true>
            <<<grid_for(work, kThreads), kThreads, 0, s>>>(x, ld, bias, rows, cols);
    else
        add_bias_kernel<false>
            <<<grid_for(work, kThreads), kThreads, 0, s>>>(x, ld, bias, rows, cols);
    return cuda_launch_result("cuda_add_bias");
}

int cuda_to_bf16_bias(const float *x, const uint16_t *bias, uint16_t *y, int32_t rows, int32_t cols,
                      cudaStream_t s)
{
    if (rows < 0 || cols <= 0)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_to_bf16_bias: rows %d, cols %d", (int)rows,
                                (int)cols);
    if (rows == 0)
        return 0;
    if (x == NULL || y == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_to_bf16_bias: NULL buffer");
    /* Up to kMaxGrid CTAs in all: a row's columns, then as many rows as fit (grid-stride). */
    const unsigned gx = grid_for(cols, kThreads);
    int64_t gy = kMaxGrid / gx;
    gy = gy < 1 ? 1 : (gy < rows ? gy : rows);
    to_bf16_bias_kernel<<<dim3(gx, (unsigned)gy), kThreads, 0, s>>>(x, bias, y, rows, cols);
    return cuda_launch_result("cuda_to_bf16_bias");
}

int cuda_rope(uint16_t *x, int64_t row_stride, const int32_t *positions, const float *inv_freq,
              int32_t rows, int32_t num_heads, int32_t head_dim, cudaStream_t s)
{
    if (rows < 0 || num_heads <= 0 || head_dim <= 0 || head_dim % 2 != 0 ||
        head_dim > KV_HEAD_DIM_MAX || row_stride < (int64_t)num_heads * head_dim)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_rope: rows %d, num_heads %d, head_dim %d, row_stride %lld",
                                (int)rows, (int)num_heads, (int)head_dim, (long long)row_stride);
    if (rows == 0)
        return 0;
    if (x == NULL || positions == NULL || inv_freq == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_rope: NULL buffer");
    const int threads = threads_for_row((int64_t)num_heads * (head_dim / 2));
    const size_t smem = (size_t)head_dim * sizeof(float);
    rope_kernel<<<rows, threads, smem, s>>>(x, row_stride, positions, inv_freq, num_heads,
                                            head_dim);
    return cuda_launch_result("cuda_rope");
}

int cuda_silu_mul(const uint16_t *gate_up, uint16_t *out, int32_t rows, int32_t inter,
                  cudaStream_t s)
{
    if (rows < 0 || inter <= 0)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_silu_mul: rows %d, inter %d", (int)rows,
                                (int)inter);
    if (rows == 0)
        return 0;
    if (gate_up == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_silu_mul: NULL buffer");
    const bool vec = inter % 8 == 0 && cuda_aligned16(gate_up) && cuda_aligned16(out);
    const int64_t work = (int64_t)rows * (vec ? inter / 8 : inter);
    return launch_pdl_late("cuda_silu_mul", vec ? silu_mul_kernel<true> : silu_mul_kernel<false>,
                           grid_for(work, kThreads), kThreads, 0, s, gate_up, out, rows, inter);
}

int cuda_reshape_and_cache(const struct kv_layer_view *kv, const uint16_t *k, const uint16_t *v,
                           int64_t row_stride, const int64_t *slot_mapping, int32_t num_tokens,
                           cudaStream_t s)
{
    if (kv == NULL || num_tokens < 0)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_reshape_and_cache: NULL view or num_tokens %d",
                                (int)num_tokens);
    if (kv->dtype != DTYPE_BF16 && kv->dtype != DTYPE_F8E4M3)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuda_reshape_and_cache: the GPU pool is BF16 or F8_E4M3, not %s",
                                dtype_name(kv->dtype));
    if (kv->block_size <= 0 || kv->num_blocks <= 0 || kv->num_kv_heads <= 0 || kv->head_dim <= 0 ||
        kv->k == NULL || kv->v == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_reshape_and_cache: empty layer view");
    if (row_stride < (int64_t)kv->num_kv_heads * kv->head_dim)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_reshape_and_cache: row_stride %lld < %d KV heads * "
                                "head_dim %d",
                                (long long)row_stride, (int)kv->num_kv_heads, (int)kv->head_dim);
    if (num_tokens == 0)
        return 0;
    if (k == NULL || v == NULL || slot_mapping == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_reshape_and_cache: NULL buffer");

    const cache_dst dst = cache_dst_of(kv);
    const bool vec = kv->head_dim % 8 == 0 && kv->block_stride % 8 == 0 &&
                     kv->head_stride % 8 == 0 && kv->slot_stride % 8 == 0 && row_stride % 8 == 0 &&
                     cuda_aligned16(kv->k) && cuda_aligned16(kv->v) && cuda_aligned16(k) &&
                     cuda_aligned16(v);
    const int64_t n = (int64_t)kv->num_kv_heads * kv->head_dim;
    const int threads = threads_for_row(vec ? n / 8 : n);
    if (vec)
        reshape_and_cache_kernel<true>
            <<<num_tokens, threads, 0, s>>>(dst, k, v, row_stride, slot_mapping);
    else
        reshape_and_cache_kernel<false>
            <<<num_tokens, threads, 0, s>>>(dst, k, v, row_stride, slot_mapping);
    return cuda_launch_result("cuda_reshape_and_cache");
}

int cuda_rope_cache(uint16_t *qkv, int64_t row_stride, const int32_t *positions,
                    const float *inv_freq, int32_t rows, int32_t num_q_heads,
                    const struct kv_layer_view *kv, const int64_t *slot_mapping, cudaStream_t s)
{
    if (kv == NULL || rows < 0 || num_q_heads <= 0)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_rope_cache: NULL view, rows %d, %d Q heads",
                                (int)rows, (int)num_q_heads);
    if (kv->dtype != DTYPE_BF16 && kv->dtype != DTYPE_F8E4M3)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuda_rope_cache: the GPU pool is BF16 or F8_E4M3, not %s",
                                dtype_name(kv->dtype));
    if (kv->block_size <= 0 || kv->num_blocks <= 0 || kv->num_kv_heads <= 0 || kv->head_dim <= 0 ||
        kv->head_dim % 2 != 0 || kv->head_dim > KV_HEAD_DIM_MAX || kv->k == NULL || kv->v == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_rope_cache: empty layer view or head_dim %d",
                                (int)kv->head_dim);
    const int64_t width = (int64_t)(num_q_heads + 2 * kv->num_kv_heads) * kv->head_dim;
    if (row_stride < width)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_rope_cache: row_stride %lld < QKV width %lld",
                                (long long)row_stride, (long long)width);
    if (rows == 0)
        return 0;
    if (qkv == NULL || positions == NULL || inv_freq == NULL || slot_mapping == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_rope_cache: NULL buffer");
    const cache_dst dst = cache_dst_of(kv);
    /* Up to kMaxThreads threads: one CTA per token is the whole grid of a small decode step,
     * so its pairs are spread as wide as a CTA allows. */
    const int64_t pairs = (int64_t)(num_q_heads + kv->num_kv_heads) * (kv->head_dim / 2);
    const int threads = (int)(pairs >= kMaxThreads ? kMaxThreads : (pairs + 31) / 32 * 32);
    const size_t smem = (size_t)kv->head_dim * sizeof(float);
    return launch_pdl("cuda_rope_cache", rope_cache_kernel, rows, threads, smem, s, qkv, row_stride,
                      positions, inv_freq, num_q_heads, dst, slot_mapping);
}
