/* test_hide_q (tests/gpu/hide_q.cu): for test_cuda_attention's "slow q" cases. */
#ifndef PAGODA_TESTS_GPU_HIDE_Q_H
#define PAGODA_TESTS_GPU_HIDE_Q_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Launched on s with programmatic dependent launch while cuda_pdl_enabled() (as the kernels of
 * kernels/cuda are): waits for the kernel ahead, copies the first cols columns of rows rows of
 * qkv (stride elements apart) to scratch (rows x cols) and overwrites them with NaN, lets its
 * dependents start, pauses pause_us microseconds, and writes them back. Returns 0,
 * PAGODA_EINVAL, or PAGODA_ECUDA. */
int test_hide_q(uint16_t *qkv, int64_t stride, int32_t rows, int32_t cols, uint16_t *scratch,
                int32_t pause_us, cudaStream_t s);

/* The slow-q cases' positive control, launched right behind test_hide_q (programmatic dependent
 * launch while cuda_pdl_enabled()): lets its own dependents start at once, reads q[0] before it
 * waits for test_hide_q, and writes 1 to *seen when that read found hide_q's NaN, that is when
 * the launches really overlapped; 0 otherwise. Returns 0 or PAGODA_ECUDA. */
int test_pdl_probe(const uint16_t *q, int32_t *seen, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
