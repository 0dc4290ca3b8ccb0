/* Helpers shared by the kernel tests that compare kernels/cuda with the CPU reference kernels
 * (test_cuda_kernels: ops and linears; test_cuda_attention: paged attention): random bf16
 * inputs, device buffers poisoned before a run (0xFF bytes: NaN in bf16 and f32), relative
 * errors, one report line per case. Header-only (static, like gpu_test.h's counters): each test
 * program is one translation unit. */
#ifndef PAGODA_TESTS_GPU_KERNEL_CHECK_H
#define PAGODA_TESTS_GPU_KERNEL_CHECK_H

#include "tests/gpu/gpu_test.h"

#include "common/dtype.h"
#include "common/error.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define TOLERANCE 1e-2 /* bf16 outputs: expect about 3e-3 */
#define EXACT 1e-6     /* copies and f32 sums that must match */

static cudaStream_t stream;

static uint64_t rng = 0x2545f4914f6cdd1dull;

static inline uint64_t rng_next(void)
{
    uint64_t x = (rng += 0x9e3779b97f4a7c15ull);
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

static inline float uniform(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(rng_next() >> 11) / (double)(1ull << 53));
}

static inline int32_t rand_int(int32_t n) /* 0 .. n - 1 */
{
    return (int32_t)(rng_next() % (uint64_t)n);
}

static inline void fill_bf16(uint16_t *x, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        x[i] = f32_to_bf16(uniform(lo, hi));
}

static inline void bf16_to_f32_n(const uint16_t *x, float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        y[i] = bf16_to_f32(x[i]);
}

static inline void *xmalloc(size_t bytes)
{
    void *p = malloc(bytes > 0 ? bytes : 1);
    if (p == NULL) {
        printf("FATAL: out of host memory (%zu bytes)\n", bytes);
        exit(1);
    }
    return p;
}

static inline void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    GPU_CK(cudaMalloc(&p, bytes > 0 ? bytes : 1));
    return p;
}

static inline void *dev_upload(const void *h, size_t bytes)
{
    void *d = dev_alloc(bytes);
    GPU_CK(cudaMemcpy(d, h, bytes, cudaMemcpyHostToDevice));
    GPU_CK(cudaDeviceSynchronize()); /* a pageable copy may still be in flight */
    return d;
}

static inline void download(void *h, const void *d, size_t bytes)
{
    GPU_CK(cudaStreamSynchronize(stream));
    GPU_CK(cudaMemcpy(h, d, bytes, cudaMemcpyDeviceToHost));
}

static inline void poison(void *d, size_t bytes)
{
    GPU_CK(cudaMemset(d, 0xFF, bytes));
    GPU_CK(cudaDeviceSynchronize()); /* cudaMemset is asynchronous, on the legacy stream */
}

/* ||out - ref|| / ||ref|| in double; infinite when out holds a NaN or an infinity. */
static inline double rel_err(const float *out, const float *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(out[i]))
            return INFINITY;
        double d = (double)out[i] - (double)ref[i];
        num += d * d;
        den += (double)ref[i] * (double)ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static inline double rel_err_bf16(const uint16_t *out, const float *ref, size_t n)
{
    float *f = xmalloc(n * sizeof(float));
    bf16_to_f32_n(out, f, n);
    double e = rel_err(f, ref, n);
    free(f);
    return e;
}

static double worst_err;

static inline void report(const char *kernel, const char *config, double err, double tol)
{
    bool ok = err < tol;
    printf("%-20s %-58s rel err %.2e%s\n", kernel, config, err, ok ? "" : "  FAIL");
    GPU_CHECK(ok, "%s %s: rel err %.3e, tolerance %.1e", kernel, config, err, tol);
    if (tol == TOLERANCE && err > worst_err)
        worst_err = err;
}

static inline void expect_rc(const char *what, int got, int want)
{
    bool ok = got == want;
    printf("%-20s %-58s rc %d%s\n", "refusal", what, got, ok ? "" : "  FAIL");
    GPU_CHECK(ok, "%s: returned %d (%s), expected %d (%s)", what, got, pagoda_strerror(got), want,
              pagoda_strerror(want));
}

#endif
