/* A kernel for test_cuda_attention's "slow q" cases (tests/gpu/hide_q.h): it stands between the
 * kernel that writes the attention's q (RoPE with the cache write) and the attention, hides q
 * (NaN) while the attention, launched with programmatic dependent launch, may already run its
 * part before griddepcontrol.wait, and puts q back only after a pause. test_pdl_probe, launched
 * between the two, reads q before its own wait to show that the launches overlapped. An attention
 * that reads q before its wait (a load the compiler hoisted above it: an ld.global.nc, __ldg, may
 * be, as in the fifteenth session's producer-warp kernel) reads NaN; one that waits reads q. */
#include "kernels/cuda/common.cuh"
#include "tests/gpu/hide_q.h"

namespace
{

constexpr int kThreads = 256;
constexpr int kCtas = 16; /* few: the attention's CTAs find SMs free while this one pauses */

__device__ __forceinline__ unsigned long long global_ns()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__global__ void hide_q_kernel(uint16_t *qkv, int64_t stride, int32_t rows, int32_t cols,
                              uint16_t *scratch, unsigned long long pause_ns)
{
    pdl_wait(); /* q is the kernel ahead's output */
    const int64_t n = (int64_t)rows * cols;
    const int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        uint16_t *p = qkv + (i / cols) * stride + i % cols;
        scratch[i] = *p;
        *p = 0xFFFF; /* NaN in bf16 */
    }
    __threadfence();
    __syncthreads();
    pdl_launch_dependents(); /* the attention may start now, q hidden */
    const unsigned long long t0 = global_ns();
    while (global_ns() - t0 < pause_ns)
        __nanosleep(1000);
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        qkv[(i / cols) * stride + i % cols] = scratch[i];
}

/* One warp: lets its dependents start, reads q[0] before its own wait (on purpose: whether it
 * sees hide_q's NaN says whether this launch overlapped hide_q's pause) and writes what it saw,
 * then waits. The read is volatile and its result stored before the wait, so that neither the
 * compiler nor ptxas can move it past the wait (where it would always see q restored). */
__global__ void pdl_probe_kernel(const uint16_t *q, int32_t *seen)
{
    pdl_launch_dependents();
    if (threadIdx.x == 0) {
        const uint16_t v = *(const volatile uint16_t *)q;
        *(volatile int32_t *)seen = v == 0xFFFF;
    }
    pdl_wait();
}

} // namespace

extern "C" int test_pdl_probe(const uint16_t *q, int32_t *seen, cudaStream_t s)
{
    return launch_pdl("test_pdl_probe", pdl_probe_kernel, 1, 32, 0, s, q, seen);
}

extern "C" int test_hide_q(uint16_t *qkv, int64_t stride, int32_t rows, int32_t cols,
                           uint16_t *scratch, int32_t pause_us, cudaStream_t s)
{
    if (rows <= 0 || cols <= 0 || stride < cols || pause_us < 0)
        return pagoda_error_set(PAGODA_EINVAL, "test_hide_q: rows %d, cols %d, stride %lld",
                                (int)rows, (int)cols, (long long)stride);
    return launch_pdl("test_hide_q", hide_q_kernel, kCtas, kThreads, 0, s, qkv, stride, rows, cols,
                      scratch, (unsigned long long)pause_us * 1000ull);
}
