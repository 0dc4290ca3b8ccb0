/* Shared by the standalone CUDA probes of bench/ (pdl_cublas.cu, gemm16.cu; each built by hand
 * with nvcc from the project root, -I.): exit-on-error checks for CUDA and cuBLAS calls, weights
 * and inputs drawn by a hash, and the small kernel that writes a GEMM's input ahead of it in a
 * chain, with either of the kernels/cuda triggers (common.cuh), and the stream and cuBLAS handle
 * they time on. */
#ifndef PAGODA_BENCH_CUDA_PROBE_CUH
#define PAGODA_BENCH_CUDA_PROBE_CUH

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "bench/cuda_check.h"
#include "kernels/cuda/common.cuh"

#define CB(call)                                                                                   \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                         \
            fprintf(stderr, "%s:%d %s: cublas %d\n", __FILE__, __LINE__, #call, (int)s_);          \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

__device__ __forceinline__ uint64_t probe_gtimer()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

/* x[i] = a value of i and seed in [-1, 1), after pause_ns. late 0: signals its dependents right
 * after its wait, as the kernels of kernels/cuda do; 1: only at its end (the late trigger). */
__global__ void probe_writer(__nv_bfloat16 *x, int64_t n, uint32_t seed, uint64_t pause_ns,
                             int late)
{
    pdl_wait();
    pdl_trigger_early(late);
    if (pause_ns) {
        const uint64_t t0 = probe_gtimer();
        while (probe_gtimer() - t0 < pause_ns) {
        }
    }
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = __float2bfloat16(((float)(h & 1023) - 511.5f) / 512.0f);
    }
    pdl_trigger_late(late);
}

/* w[i] = a small value of i and seed (|w| < 1/64). */
__global__ void probe_fill(__nv_bfloat16 *w, int64_t n, uint32_t seed)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)(i * 40503u) ^ seed;
        h ^= h >> 16;
        h *= 73244475u;
        h ^= h >> 16;
        w[i] = __float2bfloat16(((float)(h & 4095) - 2047.5f) / (2048.0f * 64.0f));
    }
}

/* A non-blocking stream, and a cuBLAS handle on it with a 32 MiB workspace of its own (so that
 * its GEMMs allocate nothing inside a graph's capture). */
static inline void probe_cublas_open(cudaStream_t *s, cublasHandle_t *h)
{
    CK(cudaStreamCreateWithFlags(s, cudaStreamNonBlocking));
    CB(cublasCreate(h));
    CB(cublasSetStream(*h, *s));
    const size_t ws_bytes = 32u << 20;
    void *ws;
    CK(cudaMalloc(&ws, ws_bytes));
    CB(cublasSetWorkspace(*h, ws, ws_bytes));
}

/* probe_writer on 16 CTAs of 256 threads, launched with programmatic stream serialization. */
static inline void probe_launch_writer(cudaStream_t s, __nv_bfloat16 *x, int64_t n, uint32_t seed,
                                       uint64_t pause_ns, int late)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(16);
    cfg.blockDim = dim3(256);
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CK(cudaLaunchKernelEx(&cfg, probe_writer, x, n, seed, pause_ns, late));
}

#endif
