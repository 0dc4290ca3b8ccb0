#include "kernels/cuda/util.h"
#include "common/error.h"
#include "kernels/cuda/common.cuh"

#include <cuda_bf16.h>
#include <string.h>

__device__ static inline uint64_t splitmix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* offset + uniform(-a, a) from a counter-based hash of (key, i) into dst[i]: bf16, or (F8) the
 * bf16 value's nearest F8E4M3 code. */
template <bool F8>
__global__ static void fill_random_kernel(void *dst, int64_t n, uint64_t key, float a, float offset)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t r = splitmix64(key ^ splitmix64((uint64_t)i));
        float u = (float)(r >> 40) * (1.0f / 16777216.0f); /* [0, 1) from 24 bits */
        const __nv_bfloat16 x = __float2bfloat16(offset + a * (2.0f * u - 1.0f));
        if (F8)
            static_cast<uint8_t *>(dst)[i] = float_to_e4m3(__bfloat162float(x));
        else
            static_cast<__nv_bfloat16 *>(dst)[i] = x;
    }
}

/* The key of (seed, stream_id) and the grid of n elements, shared by the fills. */
static uint64_t fill_key(uint64_t seed, uint64_t stream_id)
{
    return seed * 0x2545f4914f6cdd1dull ^ (stream_id + 1) * 0x9e3779b97f4a7c15ull;
}

static unsigned fill_blocks(int64_t n)
{
    const int64_t blocks = (n + 255) / 256;
    return (unsigned)(blocks > 65536 ? 65536 : blocks);
}

template <bool F8>
static int fill_random(void *dst, int64_t n, uint64_t seed, uint64_t stream_id, float std,
                       float offset, cudaStream_t s, const char *name)
{
    if (n < 0 || (n > 0 && dst == NULL))
        return PAGODA_EINVAL;
    if (n == 0)
        return 0;
    fill_random_kernel<F8><<<fill_blocks(n), 256, 0, s>>>(dst, n, fill_key(seed, stream_id),
                                                          1.7320508f * std, offset);
    return cuda_launch_result(name);
}

extern "C" int cuda_fill_random_bf16(uint16_t *dst, int64_t n, uint64_t seed, uint64_t stream_id,
                                     float std, float offset, cudaStream_t s)
{
    return fill_random<false>(dst, n, seed, stream_id, std, offset, s, "cuda_fill_random_bf16");
}

extern "C" int cuda_fill_random_e4m3(uint8_t *dst, int64_t n, uint64_t seed, uint64_t stream_id,
                                     float std, float offset, cudaStream_t s)
{
    return fill_random<true>(dst, n, seed, stream_id, std, offset, s, "cuda_fill_random_e4m3");
}

/* fill_random_kernel's values of the whole tensor at first + r * ld + c, into dst[r][c]. */
__global__ static void fill_random_slice_kernel(__nv_bfloat16 *dst, int64_t rows, int64_t cols,
                                                int64_t ld, int64_t first, uint64_t key, float a,
                                                float offset)
{
    const int64_t n = rows * cols;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i / cols, c = i - r * cols;
        uint64_t h = splitmix64(key ^ splitmix64((uint64_t)(first + r * ld + c)));
        float u = (float)(h >> 40) * (1.0f / 16777216.0f);
        dst[i] = __float2bfloat16(offset + a * (2.0f * u - 1.0f));
    }
}

extern "C" int cuda_fill_random_bf16_slice(uint16_t *dst, int64_t rows, int64_t cols, int64_t ld,
                                           int64_t first, uint64_t seed, uint64_t stream_id,
                                           float std, float offset, cudaStream_t s)
{
    if (rows < 0 || cols < 0 || first < 0 || (rows > 1 && ld < cols) ||
        (rows * cols > 0 && dst == NULL))
        return PAGODA_EINVAL;
    if (rows * cols == 0)
        return 0;
    fill_random_slice_kernel<<<fill_blocks(rows * cols), 256, 0, s>>>(
        (__nv_bfloat16 *)dst, rows, cols, ld, first, fill_key(seed, stream_id), 1.7320508f * std,
        offset);
    return cuda_launch_result("cuda_fill_random_bf16_slice");
}

__global__ static void gather_rows_kernel(const uint16_t *src, int64_t ld_src, const int32_t *rows,
                                          int32_t cols, uint16_t *dst)
{
    const uint16_t *from = src + (int64_t)rows[blockIdx.x] * ld_src;
    uint16_t *to = dst + (int64_t)blockIdx.x * cols;
    for (int32_t c = threadIdx.x; c < cols; c += blockDim.x)
        to[c] = from[c];
}

extern "C" int cuda_gather_rows_bf16(const uint16_t *src, int64_t ld_src, const int32_t *rows,
                                     int32_t num_rows, int32_t cols, uint16_t *dst, cudaStream_t s)
{
    if (num_rows < 0 || cols <= 0)
        return PAGODA_EINVAL;
    if (num_rows == 0)
        return 0;
    gather_rows_kernel<<<num_rows, 256, 0, s>>>(src, ld_src, rows, cols, dst);
    return cuda_launch_result("cuda_gather_rows_bf16");
}

/* cuda_set_pdl's setting: per thread, as the current device is. */
static thread_local int pdl_on;

extern "C" void cuda_set_pdl(int on)
{
    pdl_on = on != 0;
}

extern "C" int cuda_pdl_enabled(void)
{
    return pdl_on;
}

/* cuda_set_pdl_late's setting, and whether the last launch_pdl launch triggered late. */
static thread_local int pdl_late, pdl_late_last;

extern "C" void cuda_set_pdl_late(int on)
{
    pdl_late = on != 0;
}

extern "C" int cuda_pdl_late_wanted(void)
{
    return pdl_late && pdl_on;
}

extern "C" int cuda_pdl_late_launched(void)
{
    return pdl_late_last;
}

extern "C" void cuda_pdl_note_late(int late)
{
    pdl_late_last = late != 0;
}

extern "C" int cuda_capture_tip(cudaStream_t s, cudaGraphNode_t *node)
{
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    const cudaGraphNode_t *deps = NULL;
    size_t n = 0;
    if (cudaStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, NULL, &n) != cudaSuccess) {
        (void)cudaGetLastError(); /* not left for the next launch to report as its own */
        return 0;
    }
    if (st != cudaStreamCaptureStatusActive || n != 1)
        return 0;
    *node = deps[0];
    return 1;
}

extern "C" int cuda_capture_make_programmatic(cudaStream_t s, cudaGraphNode_t node)
{
    cudaGraphEdgeData e;
    memset(&e, 0, sizeof e);
    e.from_port = cudaGraphKernelNodePortProgrammatic;
    e.type = cudaGraphDependencyTypeProgrammatic;
    const cudaError_t err =
        cudaStreamUpdateCaptureDependencies(s, &node, &e, 1, cudaStreamSetCaptureDependencies);
    if (err != cudaSuccess)
        return pagoda_error_set(PAGODA_ECUDA, "cudaStreamUpdateCaptureDependencies: %s",
                                cudaGetErrorString(err));
    return 0;
}
