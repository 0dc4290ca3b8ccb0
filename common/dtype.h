/* Element types of weights and KV memory, and the conversions between them.
 *
 * BF16 and F16 values are stored as raw uint16_t bit patterns. Conversion to f32 is exact;
 * conversion from f32 rounds to nearest even (NaN stays NaN), as PyTorch does.
 *
 * F8E4M3 is the KV pool's 8-bit element (an option: pagoda-kvpool --kv-cache-dtype fp8), torch's
 * float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits, subnormals, no infinities, the
 * codes 0x7f and 0xff NaN, the largest finite value 448. Weights are never F8E4M3 (the
 * safetensors and config parsers accept BF16, F16 and F32 only). */
#ifndef PAGODA_COMMON_DTYPE_H
#define PAGODA_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dtype { DTYPE_BF16 = 0, DTYPE_F16 = 1, DTYPE_F32 = 2, DTYPE_F8E4M3 = 3 };

/* Bytes per element. */
static inline size_t dtype_size(enum dtype t)
{
    return t == DTYPE_F32 ? 4 : t == DTYPE_F8E4M3 ? 1 : 2;
}

/* The safetensors spelling: "BF16", "F16", "F32", "F8_E4M3". */
const char *dtype_name(enum dtype t);

/* Parses a safetensors dtype ("BF16", "F16", "F32"). Returns 0 or PAGODA_EUNSUPPORTED. */
int dtype_from_safetensors(const char *name, enum dtype *out);

/* Parses a torch dtype name as config.json spells it ("bfloat16", "float16", "float32").
 * Returns 0 or PAGODA_EUNSUPPORTED. */
int dtype_from_torch(const char *name, enum dtype *out);

/* The torch spelling of t ("bfloat16", ..., "float8_e4m3fn"). */
const char *dtype_torch_name(enum dtype t);

static inline float bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof(f));
    return f;
}

static inline uint16_t f32_to_bf16(float f)
{
    uint32_t bits;
    memcpy(&bits, &f, sizeof(bits));
    if ((bits & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((bits >> 16) | 0x40u); /* quiet NaN */
    bits += 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)(bits >> 16);
}

/* IEEE half to f32 (exact, including subnormals, infinities and NaN). */
float f16_to_f32(uint16_t h);

/* The K/V pool element a --kv-cache-dtype value names (vLLM's spellings): "auto" the backend's own
 * (native), "fp8" or "fp8_e4m3" F8E4M3. Returns 0, or PAGODA_EINVAL with a detail naming flag
 * and the values it takes. */
int dtype_from_kv_cache_name(const char *flag, const char *name, enum dtype native,
                             enum dtype *out);

/* An F8E4M3 code to f32 (exact; NaN for 0x7f and 0xff). */
float e4m3_to_f32(uint8_t c);

/* f32 to the nearest F8E4M3 code, ties to the even code, saturating: magnitudes above 448 and
 * infinities give +-448, NaN gives 0x7f (the GPU's cvt.rn.satfinite.e4m3x2.f32, bit for bit). */
uint8_t f32_to_e4m3(float f);

/* Converts n elements of type t at src to f32 at dst. */
void dtype_to_f32(enum dtype t, const void *src, float *dst, size_t n);

#endif
