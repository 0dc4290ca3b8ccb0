/* Small-M linear layers on the GPU: y[rows][out] = x[rows][in] . w[out][in]^T for the few rows
 * of a decode step, where a linear is a pass over its weights and cuBLAS's general kernels fall
 * short of the weights' bandwidth (bench/RESULTS.md, issue 15).
 *
 * Types: x and w are bf16 bit patterns (uint16_t), device pointers; y is bf16 or f32. The dot
 * products accumulate in f32 on the tensor cores (mma.sync m16n8k16, bf16 in, f32 out); the
 * order of the sum is fixed (no atomics), so equal inputs give equal outputs on every run. The
 * results differ from cuBLAS's only by the order of the f32 sums.
 *
 * Like kernels/cuda/ops.h: the call enqueues on stream s and returns 0, PAGODA_EINVAL (bad
 * sizes, NULL or misaligned buffers: cuda_gemv_fits says beforehand) or PAGODA_ECUDA (the
 * launch failed); it neither allocates nor synchronises, so it can be captured in a graph. */
#ifndef PAGODA_KERNELS_CUDA_LINEAR_H
#define PAGODA_KERNELS_CUDA_LINEAR_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The most rows cuda_gemv takes: above it the weights are re-read from L2 for each group of
 * rows and a library GEMM is the better tool. */
#define CUDA_GEMV_MAX_ROWS 16

/* 1 when cuda_gemv accepts these sizes and buffers: 1 <= rows <= CUDA_GEMV_MAX_ROWS, in a
 * multiple of 32, out >= 1, x, w and y 16-byte aligned; else 0. */
int cuda_gemv_fits(int32_t rows, int32_t in, int32_t out, const void *x, const void *w,
                   const void *y);

/* y[r][o] = sum_i x[r][i] * w[o][i], for r < rows, o < out; y is f32 when y_f32, else bf16
 * (rounded to nearest even once). x is [rows][in], w [out][in], y [rows][out], all dense. */
int cuda_gemv(const uint16_t *x, const uint16_t *w, void *y, int y_f32, int32_t rows, int32_t in,
              int32_t out, cudaStream_t s);

/* The shape of cuda_gemv_stream's ring, a knob for benchmarks: stages of cols columns each (a
 * multiple of 512 up to 4096); a field of 0 takes the default. x_resident: 1, x is copied into
 * shared memory once (with the CTA's first tile) and the stages hold weights only (x of 16
 * rows up to 4096 columns fits beside the default resident ring); 0 (the default) or -1, every
 * stage brings its columns of x beside the weights (at 16 rows half a stage's bytes are x).
 * Default rings: x in the stages, 2 stages of 2048 columns up to 8 rows, 3 of 1024 above (the
 * H200's fastest); x resident, 2 of 2048 up to 8 rows, 2 of 1024 above. */
struct cuda_gemv_ring {
    int stages;
    int cols;
    int x_resident;
};

/* cuda_gemv's streaming form (kernels/cuda/linear_stream.cu), which the CUDA backend uses for the
 * small weights of decode steps (worker/cuda_backend.h; it loses to cuBLAS on the large ones,
 * bench/RESULTS.md): the weights pass through a ring of shared-memory stages filled by bulk copies
 * (one CTA an SM), and the ring's first stages are requested before the kernel waits for the kernel
 * ahead (launch_pdl), so that at a decode step's kernel boundaries the next linear's weights are
 * already on their way. The same sizes and buffers as cuda_gemv (cuda_gemv_fits) and the same
 * results, bit for bit (the same sums in the same order). ring: NULL for the default; PAGODA_EINVAL
 * for negative fields, columns that are not a multiple of 512 or above 4096, x_resident outside
 * -1 .. 1, or a ring that does not fit in 227 KiB of shared memory (stages beyond what a CTA
 * streams are dropped first). */
int cuda_gemv_stream(const uint16_t *x, const uint16_t *w, void *y, int y_f32, int32_t rows,
                     int32_t in, int32_t out, const struct cuda_gemv_ring *ring, cudaStream_t s);

/* 1 when cuda_gemv_stream takes this ring for these sizes on a device of `sms` SMs (the fields
 * valid, and the ring, cut to what one CTA streams, fits in shared memory), else 0. */
int cuda_gemv_stream_ring_fits(int32_t rows, int32_t in, int32_t out,
                               const struct cuda_gemv_ring *ring, int sms);

/* One input row (kernels/cuda/linear_row.cu): each warp reads whole weight rows, 512
 * contiguous bytes a load, for a decode step of one sequence (the CUDA backend's option
 * gemv_row, on by default). 1 when
 * cuda_gemv_row takes these sizes and buffers: rows 1, in a multiple of 2048 up to 24576 (x fits in
 * 48 KiB of shared memory), out >= 1, x, w and y 16-byte aligned; else 0. */
int cuda_gemv_row_fits(int32_t rows, int32_t in, int32_t out, const void *x, const void *w,
                       const void *y);

/* y[o] = sum_i x[i] * w[o][i] for o < out (one row: x [in], y [out]), f32 products summed in a
 * fixed order (deterministic; not cuda_gemv's order, so not its bits). PAGODA_EINVAL for sizes
 * cuda_gemv_row_fits refuses. */
int cuda_gemv_row(const uint16_t *x, const uint16_t *w, void *y, int y_f32, int32_t in, int32_t out,
                  cudaStream_t s);

/* cuda_gemv_row with the transformer block's normalisation ahead of it in the same kernel: the
 * input row is x = cuda_add_rmsnorm's output for residual (f32 [in]) plus add (bf16 [in], or
 * NULL for none) with the norm weight and eps, bit for bit; residual + add goes to residual_out
 * (which must not overlap residual: the kernel's CTAs all read residual; unused when add is
 * NULL); y must overlap none of the inputs.
 * One kernel where cuda_add_rmsnorm and cuda_gemv_row were two. cuda_gemv_row_norm_fits: 1 when
 * it takes these sizes and buffers (cuda_gemv_row_fits' and in up to 8192, residual, add,
 * weight and residual_out 16-byte aligned), else 0; the call returns PAGODA_EINVAL for those it
 * refuses and for an eps that is negative or not finite. */
int cuda_gemv_row_norm_fits(int32_t in, int32_t out, const float *residual, const uint16_t *add,
                            const uint16_t *weight, const float *residual_out, const void *w,
                            const void *y);
int cuda_gemv_row_norm(const float *residual, const uint16_t *add, const uint16_t *weight,
                       float eps, float *residual_out, const uint16_t *w, void *y, int y_f32,
                       int32_t in, int32_t out, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
