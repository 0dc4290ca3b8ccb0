/* The dense operations of the CPU forward pass, in f32 on buffers the caller owns.
 *
 * Each is written to be read: plain loops in a fixed order, so that results do not depend on
 * the batch they are computed in (a row's result depends only on that row). No allocation. */
#ifndef PAGODA_KERNELS_CPU_OPS_H
#define PAGODA_KERNELS_CPU_OPS_H

#include <stddef.h>
#include <stdint.h>

/* y[m][n] = sum_k x[m][k] * w[n][k] (+ bias[n] when bias is not NULL): a linear layer with the
 * weight in PyTorch's [out, in] layout. x is [rows][in], y is [rows][out]; y must not alias x. */
void cpu_linear(const float *x, const float *w, const float *bias, float *y, int64_t rows,
                int64_t in, int64_t out);

/* RMSNorm of each row: y = x / sqrt(mean(x^2) + eps) * weight. y may alias x. */
void cpu_rmsnorm(const float *x, const float *weight, float *y, int64_t rows, int64_t dim,
                 float eps);

/* residual += x, then y = rmsnorm(residual): the fused residual add of a transformer block.
 * y may alias x but not residual. */
void cpu_add_rmsnorm(float *residual, const float *x, const float *weight, float *y, int64_t rows,
                     int64_t dim, float eps);

/* out[t][i] = silu(gate_up[t][i]) * gate_up[t][inter + i], where gate_up holds the gate and up
 * projections side by side ([rows][2 * inter]); out is [rows][inter]. */
void cpu_silu_mul(const float *gate_up, float *out, int64_t rows, int64_t inter);

/* Rotary position embedding in the "rotate half" form of Hugging Face's Llama: for each row t
 * and head, the pairs (i, i + head_dim/2) are rotated by positions[t] * inv_freq[i]. x is
 * [rows][num_heads][head_dim], rotated in place. Angles are formed in f32 as transformers does
 * (position times inv_freq), then cos and sin in double rounded to f32. */
void cpu_rope(float *x, const int32_t *positions, const float *inv_freq, int64_t rows,
              int64_t num_heads, int64_t head_dim);

/* RoPE scaling types, as config.json names them. */
enum cpu_rope_type { CPU_ROPE_DEFAULT = 0, CPU_ROPE_LINEAR = 1, CPU_ROPE_LLAMA3 = 2 };

struct cpu_rope_params {
    enum cpu_rope_type type;
    double theta;
    double factor;
    double low_freq_factor;
    double high_freq_factor;
    double original_max_position_embeddings;
};

/* Fills inv_freq[head_dim / 2] with the inverse frequencies of the given RoPE type, computed the
 * way transformers computes them (f32 base frequencies, then the scaling). */
void cpu_rope_inv_freq(const struct cpu_rope_params *p, int64_t head_dim, float *inv_freq);

#endif
