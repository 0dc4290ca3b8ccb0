/* What the two files of test_cuda_sampler share (tests/gpu/test_cuda_sampler.c: the general
 * path, the asynchronous calls, history keys, errors and main; test_cuda_sampler_greedy.c: the
 * greedy fast path): limits of the test batches, fatal checks, the test data's generator (one
 * sequence for the whole run, defined in test_cuda_sampler.c) and the greedy tests' entry
 * points. */
#ifndef PAGODA_TESTS_GPU_SAMPLER_TEST_H
#define PAGODA_TESTS_GPU_SAMPLER_TEST_H

#include "tests/gpu/gpu_test.h"

#include "common/error.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_ROWS 64
#define MAX_HISTORY 128
#define MAX_PROMPT 48
#define MAX_OUTPUT 24
#define TOP_IDS 64
#define MISMATCHES_SHOWN 20

#define CUDA_OK(call)                                                                              \
    do {                                                                                           \
        cudaError_t err_ = (call);                                                                 \
        if (err_ != cudaSuccess) {                                                                 \
            printf("FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_));  \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define MUST(cond)                                                                                 \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FATAL %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, pagoda_error_detail());    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A sampling call that must succeed: counts a failure and leaves the test function (leaking
 * what it holds) so that the other tests still run. */
#define SAMPLE_OR_RETURN(call)                                                                     \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            GPU_CHECK(0, "%s: %d (%s)", #call, rc_, pagoda_error_detail());                        \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* A deterministic generator for test data, independent of Philox (test_cuda_sampler.c). */
uint64_t rng_next(void);
float rng_unit(void);   /* [0, 1) */
float rng_normal(void); /* roughly N(0, 1) */
/* A logit row of kind 0 .. 5 (test_cuda_sampler.c make_row). */
void make_row(float *l, int32_t vocab, int kind);

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* test_cuda_sampler_greedy.c: the greedy fast path against the CPU and the general path, and its
 * timings. */
void test_greedy_fast_path(int32_t vocab, int32_t rows);
void greedy_timings(void);
/* The checks counted in test_cuda_sampler_greedy.c (gpu_test.h's counters are per file): main
 * adds them to its own before it prints the total. */
void greedy_check_counts(int *passed, int *failed);

#endif
