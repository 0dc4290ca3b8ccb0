/* Linear layers through cuBLASLt: y[rows][out] = x[rows][in] . w[out][in]^T, BF16 x and w, FP32
 * accumulation, y in BF16 or FP32 with rows ldy elements apart. The CUDA backend's linears that
 * its GEMVs do not take (worker/cuda_backend.h lt_max_rows).
 *
 * Why not cublasGemmEx: at the few rows of a decode step, cuBLASLt's heuristic picks faster
 * kernels than cublasGemmEx's own choice for some weights (the H200's O projection at 16 rows:
 * 16.0 against 19.9 us, bench/RESULTS.md issue 15). The algorithm is the heuristic's first for
 * the sizes, the pointers' alignment and the workspace: a function of the call's shape, never of
 * a timing, so equal calls give equal bits on every run (and a graph's capture the same as an
 * eager step's).
 *
 * A struct cuda_lt keeps one plan (descriptors, layouts, algorithm) per shape it has seen, made
 * on first use (a host call of tens of microseconds, no device work, so a first use may happen
 * during a graph's capture); it is not thread-safe (one per backend). The matmul enqueues on the
 * stream and neither allocates nor synchronises. Errors: PAGODA_EINVAL (bad sizes),
 * PAGODA_EUNSUPPORTED (the heuristic has no algorithm for the shape: the caller may use
 * another path), PAGODA_ENOMEM, PAGODA_ECUDA (a failed cuBLASLt call, with its status). */
#ifndef PAGODA_KERNELS_CUDA_LINEAR_LT_H
#define PAGODA_KERNELS_CUDA_LINEAR_LT_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

struct cuda_lt;

/* A cache of plans using workspace (device memory of workspace_bytes, borrowed: it must outlive
 * the cache and serve no other stream's work at the same time). */
int cuda_lt_new(void *workspace, size_t workspace_bytes, struct cuda_lt **out);
void cuda_lt_free(struct cuda_lt *lt);

/* y = x . w^T as above, on stream s: x [rows][in] and w [out][in] dense, y [rows][ldy] (ldy >=
 * out) in f32 when y_f32, else bf16. */
int cuda_lt_linear(struct cuda_lt *lt, const uint16_t *x, const uint16_t *w, void *y, int y_f32,
                   int64_t rows, int64_t in, int64_t out, int64_t ldy, cudaStream_t s);

/* Plans made so far (for tests). */
size_t cuda_lt_plans(const struct cuda_lt *lt);

#ifdef __cplusplus
}
#endif

#endif
