/* Small CUDA helpers of the GPU backend: random weights for --load-format random, and row
 * gathering for the LM head. Plain C interface; every function launches asynchronously on the
 * given stream and returns 0, PAGODA_EINVAL or PAGODA_ECUDA. */
#ifndef PAGODA_KERNELS_CUDA_UTIL_H
#define PAGODA_KERNELS_CUDA_UTIL_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Fills n bf16 values at dst with offset + uniform(-a, a) where a = sqrt(3) * std, from a
 * counter-based hash of (seed, stream_id, index): deterministic whatever the launch shape. */
int cuda_fill_random_bf16(uint16_t *dst, int64_t n, uint64_t seed, uint64_t stream_id, float std,
                          float offset, cudaStream_t s);

/* cuda_fill_random_bf16's values (the same seed, stream_id, std and offset), each then stored as
 * its nearest F8E4M3 code (common/dtype.h): an 8-bit K/V pool's random contents. */
int cuda_fill_random_e4m3(uint8_t *dst, int64_t n, uint64_t seed, uint64_t stream_id, float std,
                          float offset, cudaStream_t s);

/* A slice of what cuda_fill_random_bf16 draws for a whole tensor (the same seed and stream_id):
 * dst[r][c] (rows x cols, contiguous) gets the whole tensor's value at index first + r * ld +
 * c. A tensor-parallel rank's rows (rows 1, cols its run, first its offset) or columns (ld the
 * whole row) of the whole model's random weights. */
int cuda_fill_random_bf16_slice(uint16_t *dst, int64_t rows, int64_t cols, int64_t ld,
                                int64_t first, uint64_t seed, uint64_t stream_id, float std,
                                float offset, cudaStream_t s);

/* dst[i] = src[rows[i]] for num_rows rows of cols bf16 values (src row stride ld_src, dst
 * contiguous); rows is a device array. */
int cuda_gather_rows_bf16(const uint16_t *src, int64_t ld_src, const int32_t *rows,
                          int32_t num_rows, int32_t cols, uint16_t *dst, cudaStream_t s);

/* Programmatic dependent launch for the kernels of kernels/cuda that support it (common.cuh's
 * launch_pdl: the embedding, the normalisations, RoPE and the cache write, SiLU-and-multiply,
 * the decode attention, cuda_gemv): such a kernel may be scheduled while the one before it in
 * the stream finishes (as soon as that one signals, if it is one of these; as its blocks exit,
 * if it is another, cuBLAS's say) and read its weights before waiting for it. A setting of the
 * calling thread (the thread that launches, or captures a graph), off until set: 1 on, 0 off. */
void cuda_set_pdl(int on);
int cuda_pdl_enabled(void);

/* The late trigger, for a kernel of ours followed by one that never waits (cuBLAS's GEMMs do
 * not execute griddepcontrol.wait: bench/pdl_cublas.cu). With cuda_set_pdl_late(1) (a setting
 * of the calling thread, off until set) and PDL on, each launch of a kernel that supports it
 * (cuda_add_rmsnorm and cuda_add_parts_rmsnorm, cuda_silu_mul, the decode attention of
 * cuda_attention_run and cuda_attention_run_rope) signals its dependents only at its end, each
 * CTA after a gpu-scope fence of its threads' stores (generic and async proxy) and a barrier,
 * instead of right after its wait: once every CTA has signalled, all of the kernel's writes
 * have been made visible and none of its reads is pending, so a dependent that does not wait
 * may start. A CUDA graph edge from such a kernel into a cuBLAS kernel may then be made
 * programmatic (cuda_capture_make_programmatic): cuBLAS's CTAs are scheduled as the last CTAs
 * signal, not after the grid has completed and been flushed (0.4-0.5 us an edge on the H200,
 * bench/RESULTS.md, twenty-third session). That such a fence makes the writes visible to a
 * grid that never waits is what the H200 showed (bench/pdl_cublas.cu: 0 of 400 replays wrong,
 * where an early trigger gave 20 of 20), not a documented guarantee of CUDA's; the worker's
 * pdl_late_max_rows 0 turns every such edge off.
 * cuda_pdl_late_wanted: 1 when the calling thread asks for the late trigger and PDL is on (what
 * a supporting kernel's launcher passes its kernel). cuda_pdl_note_late: what the calling
 * thread's last launch was (1: a supporting kernel, launched with the late trigger; launch_pdl,
 * cuda_launch_result and plain launches note 0). cuda_pdl_late_launched: that note: only when
 * it is 1 may the edge after the kernel just launched be made programmatic. */
void cuda_set_pdl_late(int on);
int cuda_pdl_late_wanted(void);
int cuda_pdl_late_launched(void);
void cuda_pdl_note_late(int late);

/* While s captures a graph: 1 and its only dependency (the node last captured) in *node when
 * the capture has exactly one, else 0. */
int cuda_capture_tip(cudaStream_t s, cudaGraphNode_t *node);

/* While s captures: the capture's dependency on node, its only one, made programmatic (the
 * next kernel captured may be scheduled as node's CTAs signal, cudaGraphKernelNodePort-
 * Programmatic): safe only where node was launched with the late trigger and
 * cuda_pdl_late_launched() said so. 0, or PAGODA_ECUDA. */
int cuda_capture_make_programmatic(cudaStream_t s, cudaGraphNode_t node);

#ifdef __cplusplus
}
#endif

#endif
