/* Element types of weights and KV memory, and the conversions between them.
 *
 * BF16 and F16 values are stored as raw uint16_t bit patterns. Conversion to f32 is exact;
 * conversion from f32 rounds to nearest even (NaN stays NaN), as PyTorch does. */
#ifndef PAGODA_COMMON_DTYPE_H
#define PAGODA_COMMON_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

enum dtype { DTYPE_BF16 = 0, DTYPE_F16 = 1, DTYPE_F32 = 2 };

/* Bytes per element. */
static inline size_t dtype_size(enum dtype t)
{
    return t == DTYPE_F32 ? 4 : 2;
}

/* The safetensors spelling: "BF16", "F16", "F32". */
const char *dtype_name(enum dtype t);

/* Parses a safetensors dtype ("BF16", "F16", "F32"). Returns 0 or PAGODA_EUNSUPPORTED. */
int dtype_from_safetensors(const char *name, enum dtype *out);

/* Parses a torch dtype name as config.json spells it ("bfloat16", "float16", "float32").
 * Returns 0 or PAGODA_EUNSUPPORTED. */
int dtype_from_torch(const char *name, enum dtype *out);

/* The torch spelling of t ("bfloat16", ...). */
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

/* Converts n elements of type t at src to f32 at dst. */
void dtype_to_f32(enum dtype t, const void *src, float *dst, size_t n);

#endif
