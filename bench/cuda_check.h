/* The exit-on-error checks of the CUDA benchmarks and probes of bench/ (decode_step.c,
 * kernel_bench.c, and cuda_probe.cuh's probes): a failing call prints where it was and why, and
 * the program exits 1. A benchmark has nothing to report after a failure, and a device fault
 * poisons the context for everything after it. */
#ifndef PAGODA_BENCH_CUDA_CHECK_H
#define PAGODA_BENCH_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

/* A CUDA runtime call. */
#define CK(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A call of pagoda's returning 0 or an error code (common/error.h: include it first). */
#define PK(call)                                                                                   \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            fprintf(stderr, "%s:%d: %s: %s (%s)\n", __FILE__, __LINE__, #call,                     \
                    pagoda_strerror(rc_), pagoda_error_detail());                                  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#endif
