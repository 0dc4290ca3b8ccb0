#include "kernels/cpu/ops.h"

#include <math.h>

/* One dot product with eight independent partial sums: the compiler can keep them in one
 * vector register, and the summation order is fixed, so a row's result never depends on what
 * else is in the batch. */
static float dot(const float *a, const float *b, int64_t n)
{
    float acc[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= n; k += 8)
        for (int j = 0; j < 8; j++)
            acc[j] += a[k + j] * b[k + j];
    float s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (; k < n; k++)
        s += a[k] * b[k];
    return s;
}

void cpu_linear(const float *x, const float *w, const float *bias, float *y, int64_t rows,
                int64_t in, int64_t out)
{
    /* Blocks of 16 rows share each weight row while it is in cache. */
    const int64_t rb = 16;
    for (int64_t m0 = 0; m0 < rows; m0 += rb) {
        int64_t m1 = m0 + rb < rows ? m0 + rb : rows;
        for (int64_t n = 0; n < out; n++) {
            const float *wn = w + n * in;
            float b = bias ? bias[n] : 0.0f;
            for (int64_t m = m0; m < m1; m++)
                y[m * out + n] = dot(x + m * in, wn, in) + b;
        }
    }
}

static void rmsnorm_row(const float *x, const float *weight, float *y, int64_t dim, float eps)
{
    double ss = 0.0;
    for (int64_t i = 0; i < dim; i++)
        ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)dim + eps));
    for (int64_t i = 0; i < dim; i++)
        y[i] = x[i] * inv * weight[i];
}

void cpu_rmsnorm(const float *x, const float *weight, float *y, int64_t rows, int64_t dim,
                 float eps)
{
    for (int64_t t = 0; t < rows; t++)
        rmsnorm_row(x + t * dim, weight, y + t * dim, dim, eps);
}

void cpu_add_rmsnorm(float *residual, const float *x, const float *weight, float *y, int64_t rows,
                     int64_t dim, float eps)
{
    for (int64_t t = 0; t < rows; t++) {
        float *r = residual + t * dim;
        const float *xt = x + t * dim;
        for (int64_t i = 0; i < dim; i++)
            r[i] += xt[i];
        rmsnorm_row(r, weight, y + t * dim, dim, eps);
    }
}

void cpu_silu_mul(const float *gate_up, float *out, int64_t rows, int64_t inter)
{
    for (int64_t t = 0; t < rows; t++) {
        const float *g = gate_up + t * 2 * inter;
        const float *u = g + inter;
        float *o = out + t * inter;
        for (int64_t i = 0; i < inter; i++)
            o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

void cpu_rope(float *x, const int32_t *positions, const float *inv_freq, int64_t rows,
              int64_t num_heads, int64_t head_dim)
{
    int64_t half = head_dim / 2;
    for (int64_t t = 0; t < rows; t++) {
        float pos = (float)positions[t];
        for (int64_t i = 0; i < half; i++) {
            float angle = pos * inv_freq[i];
            float c = (float)cos((double)angle);
            float s = (float)sin((double)angle);
            for (int64_t h = 0; h < num_heads; h++) {
                float *v = x + (t * num_heads + h) * head_dim;
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

void cpu_rope_inv_freq(const struct cpu_rope_params *p, int64_t head_dim, float *inv_freq)
{
    int64_t half = head_dim / 2;
    for (int64_t i = 0; i < half; i++) {
        /* transformers: 1 / base ** (arange(0, dim, 2).float() / dim), in f32. */
        float expo = (float)(2 * i) / (float)head_dim;
        inv_freq[i] = 1.0f / powf((float)p->theta, expo);
    }
    if (p->type == CPU_ROPE_LINEAR) {
        for (int64_t i = 0; i < half; i++)
            inv_freq[i] = inv_freq[i] / (float)p->factor;
    } else if (p->type == CPU_ROPE_LLAMA3) {
        float factor = (float)p->factor;
        float lo = (float)p->low_freq_factor, hi = (float)p->high_freq_factor;
        float old_len = (float)p->original_max_position_embeddings;
        float low_freq_wavelen = old_len / lo;
        float high_freq_wavelen = old_len / hi;
        for (int64_t i = 0; i < half; i++) {
            float f = inv_freq[i];
            float wavelen = 2.0f * (float)M_PI / f;
            float scaled = wavelen > low_freq_wavelen ? f / factor : f;
            if (!(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen)) {
                float smooth = (old_len / wavelen - lo) / (hi - lo);
                scaled = (1.0f - smooth) * scaled / factor + smooth * scaled;
            }
            inv_freq[i] = scaled;
        }
    }
}
