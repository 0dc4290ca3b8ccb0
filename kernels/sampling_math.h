/* The float arithmetic of docs/sampling.md that decides a token: the penalties (step 1), the
 * scaled logit (step 3) and the integer weight exp~ (step 4).
 *
 * Header-only so that the CPU sampler (kernels/cpu/sampler.c) and the CUDA sampler
 * (kernels/cuda/sampler_rows.cu) compile the same text and agree bit for bit. Every function is
 * SAMPLING_FN: `static inline` in C, `__host__ __device__` as well under nvcc. Each float
 * operation goes through sampling_fmul/fadd/fsub/fdiv, which are the plain operators on the
 * host and the round-to-nearest intrinsics (__fmul_rn, ...) on the device, which nvcc never
 * contracts into an FMA whatever -fmad says. On the host the including file must be compiled
 * without FMA contraction (-ffp-contract=off, the default of GCC's ISO C modes) and without
 * -ffast-math; test_sampler's golden values fail otherwise. */
#ifndef PAGODA_KERNELS_SAMPLING_MATH_H
#define PAGODA_KERNELS_SAMPLING_MATH_H

#include <math.h>
#include <stdint.h>

#ifdef __CUDACC__
#define SAMPLING_FN static inline __host__ __device__
#else
#define SAMPLING_FN static inline
#endif

/* Weights (step 4): the most likely token weighs 2^40; x below SAMPLING_WEIGHT_X_MIN weighs 0
 * (exp(-32) < 2^-46, so the cut-off only saves work: those weights truncate to 0 anyway). */
#define SAMPLING_WEIGHT_ONE 0x1p40f
#define SAMPLING_WEIGHT_X_MIN -32.0f

/* exp(x) = 2^k * exp(r), k = rint(x * log2(e)), r = x - k * ln2 in two parts (Cody and Waite)
 * so that k * LN2_HI is exact for |k| < 128; exp(r) by its Taylor polynomial to degree 6. */
#define SAMPLING_EXP_LOG2E 0x1.715476p+0f
#define SAMPLING_EXP_LN2_HI 0x1.62e4p-1f
#define SAMPLING_EXP_LN2_LO 0x1.7f7d1cp-20f
#define SAMPLING_EXP_C6 0x1.6c16c2p-10f /* 1/720 */
#define SAMPLING_EXP_C5 0x1.111112p-7f  /* 1/120 */
#define SAMPLING_EXP_C4 0x1.555556p-5f  /* 1/24 */
#define SAMPLING_EXP_C3 0x1.555556p-3f  /* 1/6 */
#define SAMPLING_EXP_C2 0.5f
#define SAMPLING_EXP_C1 1.0f
#define SAMPLING_EXP_C0 1.0f

/* One f32 operation each, rounded to nearest-even, never fused with a neighbour. */
SAMPLING_FN float sampling_fmul(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

SAMPLING_FN float sampling_fadd(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

SAMPLING_FN float sampling_fsub(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fsub_rn(a, b);
#else
    return a - b;
#endif
}

SAMPLING_FN float sampling_fdiv(float a, float b)
{
#ifdef __CUDA_ARCH__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

/* Step 1 for one token of the history: repetition, then frequency (output_count times), then
 * presence; output_count is the token's number of occurrences in the output (0 when it occurs
 * only in the prompt). */
SAMPLING_FN float sampling_penalise(float v, float repetition_penalty, float presence_penalty,
                                    float frequency_penalty, int32_t output_count)
{
    v = v > 0.0f ? sampling_fdiv(v, repetition_penalty) : sampling_fmul(v, repetition_penalty);
    if (output_count > 0) {
        v = sampling_fsub(v, sampling_fmul(frequency_penalty, (float)output_count));
        v = sampling_fsub(v, presence_penalty);
    }
    return v;
}

/* Step 3: x = (l - m) / temperature, a subtraction, then a division. */
SAMPLING_FN float sampling_scaled_logit(float l, float max_logit, float temperature)
{
    return sampling_fdiv(sampling_fsub(l, max_logit), temperature);
}

/* Step 4: the weight of a token whose scaled logit is x <= 0, floor(exp~(x) * 2^40), where exp~
 * is this exact sequence of f32 operations (relative error below 3e-7 on [-32, 0]). 2^k is
 * applied exactly on both sides: ldexpf on the host, a product with 2^k built from its bits on
 * the device (k is in [-46, 0], so the result is a normal number and both are exact). */
SAMPLING_FN uint64_t sampling_weight(float x)
{
    if (!(x >= SAMPLING_WEIGHT_X_MIN))
        return 0;
    float k = rintf(sampling_fmul(x, SAMPLING_EXP_LOG2E));
    float r = sampling_fsub(x, sampling_fmul(k, SAMPLING_EXP_LN2_HI));
    r = sampling_fsub(r, sampling_fmul(k, SAMPLING_EXP_LN2_LO));
    float q = SAMPLING_EXP_C6;
    q = sampling_fadd(sampling_fmul(q, r), SAMPLING_EXP_C5);
    q = sampling_fadd(sampling_fmul(q, r), SAMPLING_EXP_C4);
    q = sampling_fadd(sampling_fmul(q, r), SAMPLING_EXP_C3);
    q = sampling_fadd(sampling_fmul(q, r), SAMPLING_EXP_C2);
    q = sampling_fadd(sampling_fmul(q, r), SAMPLING_EXP_C1);
    q = sampling_fadd(sampling_fmul(q, r), SAMPLING_EXP_C0);
#ifdef __CUDA_ARCH__
    float e = __fmul_rn(q, __int_as_float((127 + (int)k) << 23));
    return __float2ull_rz(__fmul_rn(e, SAMPLING_WEIGHT_ONE));
#else
    return (uint64_t)(ldexpf(q, (int)k) * SAMPLING_WEIGHT_ONE);
#endif
}

#endif
