/* The dense, memory-bound operations of the forward pass on the GPU, behind a plain C header.
 *
 * Types: bf16 tensors are raw uint16_t bit patterns (the GEMM inputs and outputs, weights,
 * the KV pool); the residual stream is f32. Every pointer is a device pointer unless a comment
 * says otherwise. Arithmetic is f32; every bf16 result is rounded to nearest even once.
 *
 * Every function enqueues its work on stream s and returns without waiting: 0 when the launch
 * was accepted, PAGODA_EINVAL for bad sizes or NULL buffers (with a detail naming the
 * argument), PAGODA_ECUDA when the launch failed (with a detail naming the kernel and the CUDA
 * error). A zero-row call is accepted and launches nothing. Errors of the kernel itself (a bad
 * address) surface at the stream's next synchronisation, as for any CUDA work. Nothing here
 * allocates or synchronises, so every call can be captured in a CUDA graph.
 *
 * Vector paths: a kernel uses 16-byte loads and stores when its buffers are 16-byte aligned and
 * its row lengths and strides are multiples of 8 elements (cudaMalloc'd buffers and the usual
 * model sizes); otherwise it falls back to element-wise code, with the same results. */
#ifndef PAGODA_KERNELS_CUDA_OPS_H
#define PAGODA_KERNELS_CUDA_OPS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kvpool/geometry.h"

/* residual[t][i] = table[ids[t]][i] in f32: the token embedding. table is [vocab][hidden]
 * bf16, ids [num_tokens] int32 on the device, residual [num_tokens][hidden] f32. The ids are
 * not checked (they live on the device): each must be in 0 .. vocab - 1. (The backend calls
 * cuda_embedding_rows(..., 0, vocab, ...) instead, which reads zeros for an id outside the
 * vocabulary rather than past the table.) */
int cuda_embedding(const uint16_t *table, const int32_t *ids, int32_t num_tokens, int32_t hidden,
                   float *residual, cudaStream_t s);

/* cuda_embedding for a tensor-parallel rank holding the rows [vocab_begin, vocab_end) of the
 * table (table[0] is row vocab_begin): a token outside them gets a row of zeros (the ranks'
 * rows are then summed by an all-reduce). 0 <= vocab_begin < vocab_end. */
int cuda_embedding_rows(const uint16_t *table, const int32_t *ids, int32_t num_tokens,
                        int32_t hidden, int32_t vocab_begin, int32_t vocab_end, float *residual,
                        cudaStream_t s);

/* y[r][c] = bf16(bf16(x[r][c]) + bias[c]) (the sum in f32), or bf16(x[r][c]) with bias NULL: a
 * row-parallel projection's f32 output, summed over the ranks, rounded as one rank's GEMM
 * rounds its bf16 output, then the bias added and rounded again as cuda_add_bias does, so that
 * a group of one gives TP 1's values bit for bit. x [rows][cols] f32, bias [cols] bf16, y
 * [rows][cols] bf16. */
int cuda_to_bf16_bias(const float *x, const uint16_t *bias, uint16_t *y, int32_t rows, int32_t cols,
                      cudaStream_t s);

/* The fused residual add and RMSNorm of a transformer block: when x is not NULL, residual += x
 * (x is bf16, the sum f32, written back to residual); then out = bf16(residual / sqrt(mean(
 * residual^2) + eps) * weight), the sum of squares in f32. residual is [rows][dim] f32, x and
 * out [rows][dim] bf16, weight [dim] bf16. out must not overlap residual or x. eps must be
 * finite and >= 0. */
int cuda_add_rmsnorm(float *residual, const uint16_t *x, const uint16_t *weight, uint16_t *out,
                     int32_t rows, int32_t dim, float eps, cudaStream_t s);

/* cuda_add_rmsnorm that also adds nparts f32 partial sums into the residual (after x, in order:
 * residual = ((residual + x) + parts[0]) + parts[1] + ...), part p of row r at parts + p *
 * part_stride + r * dim (part_stride >= rows * dim): the slices of a split-K product whose sum
 * no kernel formed (worker/cuda_backend_forward.c, opt.split_parts). nparts 0: cuda_add_rmsnorm.
 * The slices must overlap neither the residual nor out (PAGODA_EINVAL). */
int cuda_add_parts_rmsnorm(float *residual, const uint16_t *x, const float *parts, int32_t nparts,
                           int64_t part_stride, const uint16_t *weight, uint16_t *out, int32_t rows,
                           int32_t dim, float eps, cudaStream_t s);

/* x[r * ld + c] = bf16(x[r * ld + c] + bias[c]) for r < rows, c < cols (the sum in f32): the
 * bias of a linear layer whose output has leading dimension ld >= cols (elements). */
int cuda_add_bias(uint16_t *x, int64_t ld, const uint16_t *bias, int32_t rows, int32_t cols,
                  cudaStream_t s);

/* Rotary position embedding, "rotate half" form (Hugging Face Llama), in place: for each row r
 * and head h, the head at x + r * row_stride + h * head_dim has its pairs (i, i + head_dim/2)
 * rotated by angle = (float)positions[r] * inv_freq[i] (f32, as transformers forms it), with
 * cos and sin in f32 by the precise sincosf. positions [rows] int32 and inv_freq [head_dim/2]
 * f32 live on the device. head_dim must be even and at most KV_HEAD_DIM_MAX; row_stride >=
 * num_heads * head_dim. The Q and K heads of a fused QKV row are adjacent, so one call with
 * num_heads = num_q_heads + num_kv_heads rotates both. */
int cuda_rope(uint16_t *x, int64_t row_stride, const int32_t *positions, const float *inv_freq,
              int32_t rows, int32_t num_heads, int32_t head_dim, cudaStream_t s);

/* out[r][i] = bf16(silu(gate) * up) with gate = gate_up[r][i], up = gate_up[r][inter + i] and
 * silu(g) = g / (1 + exp(-g)), all in f32. gate_up is [rows][2 * inter] bf16 (the gate and up
 * projections side by side, one GEMM's output), out [rows][inter] bf16; they must not
 * overlap. */
int cuda_silu_mul(const uint16_t *gate_up, uint16_t *out, int32_t rows, int32_t inter,
                  cudaStream_t s);

/* Reshape-and-cache: copies token t's K and V (num_kv_heads * head_dim bf16 each, at
 * k + t * row_stride and v + t * row_stride) into the pool at slot slot_mapping[t] = block *
 * block_size + offset, through kv (a bf16 view with device pointers, or an F8E4M3 one: each
 * bf16 value stored as its nearest code, saturating, as f32_to_e4m3 rounds). slot_mapping
 * [num_tokens] int64 lives on the device. A negative slot is padding and is skipped; so is a
 * slot the device finds in the reserved block 0 or beyond the pool (the caller, who builds the
 * slots on the host, must not produce one: the GPU cannot report it). row_stride >=
 * num_kv_heads * head_dim. Returns PAGODA_EUNSUPPORTED for a view that is neither. */
int cuda_reshape_and_cache(const struct kv_layer_view *kv, const uint16_t *k, const uint16_t *v,
                           int64_t row_stride, const int64_t *slot_mapping, int32_t num_tokens,
                           cudaStream_t s);

/* cuda_rope and then cuda_reshape_and_cache on a fused QKV row in one launch (the decode step's
 * order): for each row r, the num_q_heads Q heads and kv->num_kv_heads K heads at qkv + r *
 * row_stride are rotated in place as cuda_rope rotates them (inv_freq [head_dim / 2], positions
 * [rows]), and the rotated K heads and the V heads after them are written to the pool at
 * slot_mapping[r] as cuda_reshape_and_cache writes them (the same slot rules: negative, block 0
 * or beyond the pool write nothing there). The results equal the two calls', bit for bit.
 * row_stride >= (num_q_heads + 2 * num_kv_heads) * head_dim; head_dim even and at most
 * KV_HEAD_DIM_MAX. Returns PAGODA_EUNSUPPORTED for a view that is neither bf16 nor F8E4M3
 * (the rotated K and the V stored as cuda_reshape_and_cache stores them). */
int cuda_rope_cache(uint16_t *qkv, int64_t row_stride, const int32_t *positions,
                    const float *inv_freq, int32_t rows, int32_t num_q_heads,
                    const struct kv_layer_view *kv, const int64_t *slot_mapping, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif
