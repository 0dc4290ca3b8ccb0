/* A minimal harness for GPU tests: plain C (they run on the GPU machine, where CMocka is not
 * installed), a check macro that counts, a CUDA call that must succeed, and the CTest skip
 * convention (exit 77 with a line saying why) when there is no CUDA device, as on CI. The counts
 * are one pair per test program, in tests/gpu/gpu_test.c (pagoda_add_gpu_test links it into
 * every GPU test), whatever the number of its source files. */
#ifndef PAGODA_TESTS_GPU_TEST_H
#define PAGODA_TESTS_GPU_TEST_H

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>

extern int gpu_test_passed, gpu_test_failed;

/* Counts one check; prints the failures (and, with GPU_TEST_VERBOSE set, the passes). */
#define GPU_CHECK(cond, ...)                                                                       \
    do {                                                                                           \
        if (cond) {                                                                                \
            gpu_test_passed++;                                                                     \
            if (getenv("GPU_TEST_VERBOSE")) {                                                      \
                printf("ok   ");                                                                   \
                printf(__VA_ARGS__);                                                               \
                printf("\n");                                                                      \
            }                                                                                      \
        } else {                                                                                   \
            gpu_test_failed++;                                                                     \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
            printf(__VA_ARGS__);                                                                   \
            printf("\n");                                                                          \
        }                                                                                          \
    } while (0)

static inline int gpu_test_finish(void);

/* A CUDA runtime call that must succeed: a failure is counted and stops the test, printing the
 * summary first (a device fault poisons the context for every later case). */
#define GPU_CK(call)                                                                               \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            printf("FATAL %s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_));    \
            gpu_test_failed++;                                                                     \
            exit(gpu_test_finish());                                                               \
        }                                                                                          \
    } while (0)

/* Exits 77 (skipped) with a message when no CUDA device is usable. */
static inline void gpu_test_require_device(const char *name)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        printf("SKIP %s: no CUDA device here (GPU tests run on the GPU machine: tests/gpu/run)\n",
               name);
        exit(77);
    }
}

/* The model a test runs: its first argument, else the bundled pagoda-brown
 * ($PAGODA_SOURCE_DIR/assets/pagoda-brown, or ./assets/pagoda-brown), written into buf. */
static inline const char *gpu_test_model(int argc, char **argv, char *buf, size_t size)
{
    const char *src = getenv("PAGODA_SOURCE_DIR");
    snprintf(buf, size, "%s/assets/pagoda-brown", src ? src : ".");
    return argc > 1 ? argv[1] : buf;
}

/* Prints "N passed, M failed" and returns the exit status. */
static inline int gpu_test_finish(void)
{
    printf("%d passed, %d failed\n", gpu_test_passed, gpu_test_failed);
    return gpu_test_failed == 0 ? 0 : 1;
}

#endif
