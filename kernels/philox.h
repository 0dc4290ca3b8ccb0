/* Philox4x32-10, the counter-based random number generator of Random123 (Salmon et al., "Parallel
 * random numbers: as easy as 1, 2, 3", SC 2011), with its standard multipliers and Weyl
 * constants, and the one counter layout pagoda's samplers use.
 *
 * Header-only so that the CPU sampler and a CUDA sampler compile the same text: every function
 * is marked PHILOX_FN, which is `static inline` in C and adds `__host__ __device__` under nvcc.
 * Only 32- and 64-bit integer arithmetic is used, so the results are bit-identical everywhere.
 *
 * Sampling stream (docs/sampling.md): key = (seed low 32 bits, seed high 32 bits); counter =
 * (output index low 32 bits, output index high 32 bits, draw number, 0). One block of four
 * words per (seed, output index, draw). Counter word 3 is reserved (always 0) so that another
 * stream (speculative acceptance, say) can later use 1, 2, ... without colliding. */
#ifndef PAGODA_KERNELS_PHILOX_H
#define PAGODA_KERNELS_PHILOX_H

#include <stdint.h>

#ifdef __CUDACC__
#define PHILOX_FN static inline __host__ __device__
#else
#define PHILOX_FN static inline
#endif

/* Random123's philox4x32 constants: round multipliers and key increments (golden ratio and
 * sqrt(3) - 1 in 0.32 fixed point). */
#define PHILOX_M4x32_0 0xD2511F53u
#define PHILOX_M4x32_1 0xCD9E8D57u
#define PHILOX_W32_0 0x9E3779B9u
#define PHILOX_W32_1 0xBB67AE85u
#define PHILOX_ROUNDS 10

/* One Philox block: four 32-bit words, used as the counter going in and the output coming out. */
struct philox4x32 {
    uint32_t v[4];
};

/* One round: two 32x32->64 multiplications, the high halves mixed with the other two words and
 * the key. */
PHILOX_FN struct philox4x32 philox4x32_round(struct philox4x32 c, uint32_t k0, uint32_t k1)
{
    uint64_t p0 = (uint64_t)PHILOX_M4x32_0 * c.v[0];
    uint64_t p1 = (uint64_t)PHILOX_M4x32_1 * c.v[2];
    struct philox4x32 out;
    out.v[0] = (uint32_t)(p1 >> 32) ^ c.v[1] ^ k0;
    out.v[1] = (uint32_t)p1;
    out.v[2] = (uint32_t)(p0 >> 32) ^ c.v[3] ^ k1;
    out.v[3] = (uint32_t)p0;
    return out;
}

/* Philox4x32 with 10 rounds of counter ctr under key (k0, k1): Random123's philox4x32_R(10, ...).
 * The first round uses the key as given; the key is bumped by the Weyl constants before each
 * following round. Pure function of its arguments. */
PHILOX_FN struct philox4x32 philox4x32_10(struct philox4x32 ctr, uint32_t k0, uint32_t k1)
{
    for (int r = 0; r < PHILOX_ROUNDS; r++) {
        if (r > 0) {
            k0 += PHILOX_W32_0;
            k1 += PHILOX_W32_1;
        }
        ctr = philox4x32_round(ctr, k0, k1);
    }
    return ctr;
}

/* The block of the sampling stream for (seed, output_index, draw): key (seed & 0xffffffff,
 * seed >> 32), counter (output_index & 0xffffffff, output_index >> 32, draw, 0). output_index
 * is the number of tokens the sequence had generated before this one; draw numbers the
 * independent blocks one token may need (the sampler uses draw 0 only). */
PHILOX_FN struct philox4x32 philox_draw(uint64_t seed, uint64_t output_index, uint32_t draw)
{
    struct philox4x32 ctr;
    ctr.v[0] = (uint32_t)output_index;
    ctr.v[1] = (uint32_t)(output_index >> 32);
    ctr.v[2] = draw;
    ctr.v[3] = 0;
    return philox4x32_10(ctr, (uint32_t)seed, (uint32_t)(seed >> 32));
}

/* The block's first two words as one 64-bit integer: v[0] | v[1] << 32. */
PHILOX_FN uint64_t philox_u64(struct philox4x32 r)
{
    return (uint64_t)r.v[0] | ((uint64_t)r.v[1] << 32);
}

/* A uniform float in [0, 1) from the top 24 bits of x: (x >> 8) * 2^-24. Exact (a 24-bit
 * integer and a power of two), so a GPU gets the same bits; the largest value is 1 - 2^-24. */
PHILOX_FN float philox_uniform_f32(uint32_t x)
{
    return (float)(x >> 8) * (1.0f / 16777216.0f);
}

/* A uniform double in [0, 1) from the top 53 bits of r: (r >> 11) * 2^-53. Exact likewise. */
PHILOX_FN double philox_uniform_f64(uint64_t r)
{
    return (double)(r >> 11) * (1.0 / 9007199254740992.0);
}

/* floor(r * n / 2^64): maps a uniform 64-bit r onto [0, n) (n > 0) without division or
 * rejection. Each value's probability is off from 1/n by less than 2^-64 in absolute terms.
 * The 128-bit product is built from 32-bit halves so that C11 and CUDA agree without
 * extensions. */
PHILOX_FN uint64_t philox_scale_u64(uint64_t r, uint64_t n)
{
    uint64_t r_lo = (uint32_t)r, r_hi = r >> 32;
    uint64_t n_lo = (uint32_t)n, n_hi = n >> 32;
    uint64_t lo_lo = r_lo * n_lo;
    uint64_t hi_lo = r_hi * n_lo;
    uint64_t lo_hi = r_lo * n_hi;
    uint64_t hi_hi = r_hi * n_hi;
    uint64_t mid = (lo_lo >> 32) + (uint32_t)hi_lo + (uint32_t)lo_hi;
    return hi_hi + (hi_lo >> 32) + (lo_hi >> 32) + (mid >> 32);
}

#endif
