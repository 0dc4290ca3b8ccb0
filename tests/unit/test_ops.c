/* The CPU forward pass's dense operations against direct double-precision formulas. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "kernels/cpu/ops.h"

#include <math.h>
#include <stdlib.h>

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float frand(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((rng_state >> 11) * (1.0 / 9007199254740992.0)) * 2.0f - 1.0f;
}

static void fill(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand();
}

static void test_linear_matches_double(void **state)
{
    const int64_t rows = 7, in = 37, out = 13;
    float x[7 * 37], w[13 * 37], b[13], y[7 * 13];
    fill(x, sizeof(x) / 4);
    fill(w, sizeof(w) / 4);
    fill(b, sizeof(b) / 4);
    cpu_linear(x, w, b, y, rows, in, out);
    for (int64_t m = 0; m < rows; m++)
        for (int64_t n = 0; n < out; n++) {
            double s = b[n];
            for (int64_t k = 0; k < in; k++)
                s += (double)x[m * in + k] * w[n * in + k];
            assert_true(fabs(s - y[m * out + n]) < 1e-5);
        }
    /* A row's result does not depend on the other rows of the batch. */
    float y1[13];
    cpu_linear(x + 5 * in, w, b, y1, 1, in, out);
    for (int64_t n = 0; n < out; n++)
        assert_true(y1[n] == y[5 * out + n]);
}

static void test_add_rmsnorm(void **state)
{
    const int64_t rows = 3, dim = 24;
    float r[72], x[72], w[24], y[72], r0[72];
    fill(r, 72);
    fill(x, 72);
    fill(w, 24);
    for (int i = 0; i < 72; i++)
        r0[i] = r[i];
    cpu_add_rmsnorm(r, x, w, y, rows, dim, 1e-5f);
    for (int64_t t = 0; t < rows; t++) {
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) {
            double v = (double)r0[t * dim + i] + x[t * dim + i];
            assert_true(fabs(v - r[t * dim + i]) < 1e-6);
            ss += v * v;
        }
        double inv = 1.0 / sqrt(ss / dim + 1e-5);
        for (int64_t i = 0; i < dim; i++)
            assert_true(fabs(r[t * dim + i] * inv * w[i] - y[t * dim + i]) < 1e-5);
    }
}

static void test_silu_mul(void **state)
{
    float gu[2 * 2 * 5], o[2 * 5];
    fill(gu, 20);
    cpu_silu_mul(gu, o, 2, 5);
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 5; i++) {
            double g = gu[t * 10 + i], u = gu[t * 10 + 5 + i];
            assert_true(fabs(g / (1 + exp(-g)) * u - o[t * 5 + i]) < 1e-6);
        }
}

static void test_rope_rotates_pairs(void **state)
{
    const int64_t heads = 2, hd = 8;
    float x[3 * 2 * 8], x0[48], inv[4];
    int32_t pos[3] = {0, 5, 1000};
    struct cpu_rope_params p = {.type = CPU_ROPE_DEFAULT, .theta = 10000.0, .factor = 1.0};
    cpu_rope_inv_freq(&p, hd, inv);
    for (int i = 0; i < 4; i++)
        assert_true(fabs(inv[i] - pow(10000.0, -2.0 * i / hd)) < 1e-6 * inv[i]);
    fill(x, 48);
    for (int i = 0; i < 48; i++)
        x0[i] = x[i];
    cpu_rope(x, pos, inv, 3, heads, hd);
    for (int t = 0; t < 3; t++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < 4; i++) {
                const float *a = x0 + (t * heads + h) * hd;
                const float *b = x + (t * heads + h) * hd;
                double ang = (double)pos[t] * inv[i];
                double re = a[i] * cos(ang) - a[i + 4] * sin(ang);
                double im = a[i + 4] * cos(ang) + a[i] * sin(ang);
                assert_true(fabs(re - b[i]) < 1e-4);
                assert_true(fabs(im - b[i + 4]) < 1e-4);
            }
}

static void test_rope_scalings(void **state)
{
    const int64_t hd = 64;
    float base[32], lin[32], l3[32];
    struct cpu_rope_params p = {.type = CPU_ROPE_DEFAULT, .theta = 500000.0, .factor = 1.0};
    cpu_rope_inv_freq(&p, hd, base);
    p.type = CPU_ROPE_LINEAR;
    p.factor = 4.0;
    cpu_rope_inv_freq(&p, hd, lin);
    for (int i = 0; i < 32; i++)
        assert_true(fabs(lin[i] - base[i] / 4.0) <= 1e-7 * base[i]);
    /* llama3 (factor 8, low 1, high 4, original 8192): high frequencies (short wavelengths)
     * are kept, low frequencies divided by the factor, the middle band interpolated. */
    p.type = CPU_ROPE_LLAMA3;
    p.factor = 8.0;
    p.low_freq_factor = 1.0;
    p.high_freq_factor = 4.0;
    p.original_max_position_embeddings = 8192;
    cpu_rope_inv_freq(&p, hd, l3);
    int kept = 0, divided = 0, mid = 0;
    for (int i = 0; i < 32; i++) {
        double wavelen = 2 * M_PI / base[i];
        if (wavelen < 8192 / 4.0) {
            assert_true(l3[i] == base[i]);
            kept++;
        } else if (wavelen > 8192 / 1.0) {
            assert_true(fabs(l3[i] - base[i] / 8.0) <= 1e-6 * base[i]);
            divided++;
        } else {
            double smooth = (8192 / wavelen - 1.0) / 3.0;
            double want = (1 - smooth) * base[i] / 8.0 + smooth * base[i];
            assert_true(fabs(l3[i] - want) <= 1e-5 * want);
            mid++;
        }
    }
    assert_true(kept > 0 && divided > 0 && mid > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linear_matches_double),
        cmocka_unit_test(test_add_rmsnorm),
        cmocka_unit_test(test_silu_mul),
        cmocka_unit_test(test_rope_rotates_pairs),
        cmocka_unit_test(test_rope_scalings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
