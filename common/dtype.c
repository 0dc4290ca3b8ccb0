#include "common/dtype.h"
#include "common/error.h"

#include <math.h>

const char *dtype_name(enum dtype t)
{
    switch (t) {
    case DTYPE_BF16:
        return "BF16";
    case DTYPE_F16:
        return "F16";
    case DTYPE_F32:
        return "F32";
    case DTYPE_F8E4M3:
        return "F8_E4M3";
    }
    return "?";
}

const char *dtype_torch_name(enum dtype t)
{
    switch (t) {
    case DTYPE_BF16:
        return "bfloat16";
    case DTYPE_F16:
        return "float16";
    case DTYPE_F32:
        return "float32";
    case DTYPE_F8E4M3:
        return "float8_e4m3fn";
    }
    return "?";
}

int dtype_from_safetensors(const char *name, enum dtype *out)
{
    for (int t = DTYPE_BF16; t <= DTYPE_F32; t++) {
        if (strcmp(name, dtype_name((enum dtype)t)) == 0) {
            *out = (enum dtype)t;
            return 0;
        }
    }
    return pagoda_error_set(PAGODA_EUNSUPPORTED, "dtype %s is not supported (BF16, F16, F32)",
                            name);
}

int dtype_from_torch(const char *name, enum dtype *out)
{
    for (int t = DTYPE_BF16; t <= DTYPE_F32; t++) {
        if (strcmp(name, dtype_torch_name((enum dtype)t)) == 0) {
            *out = (enum dtype)t;
            return 0;
        }
    }
    return pagoda_error_set(PAGODA_EUNSUPPORTED,
                            "dtype %s is not supported (bfloat16, float16, float32)", name);
}

float f16_to_f32(uint16_t h)
{
    int sign = h >> 15;
    int exp = (h >> 10) & 0x1f;
    int mant = h & 0x3ff;
    float v;
    if (exp == 0)
        v = ldexpf((float)mant, -24);
    else if (exp == 31)
        v = mant ? NAN : INFINITY;
    else
        v = ldexpf((float)(mant | 0x400), exp - 25);
    return sign ? -v : v;
}

int dtype_from_kv_cache_name(const char *flag, const char *name, enum dtype native, enum dtype *out)
{
    if (strcmp(name, "auto") == 0)
        *out = native;
    else if (strcmp(name, "fp8") == 0 || strcmp(name, "fp8_e4m3") == 0)
        *out = DTYPE_F8E4M3;
    else
        return pagoda_error_set(PAGODA_EINVAL, "%s %s: expected auto, fp8 or fp8_e4m3", flag, name);
    return 0;
}

float e4m3_to_f32(uint8_t c)
{
    const int exp = (c >> 3) & 0xf, mant = c & 7;
    float v;
    if ((c & 0x7f) == 0x7f)
        v = NAN;
    else if (exp == 0)
        v = ldexpf((float)mant, -9);
    else
        v = ldexpf((float)(mant | 8), exp - 10);
    return c & 0x80 ? -v : v;
}

uint8_t f32_to_e4m3(float f)
{
    const uint8_t sign = signbit(f) ? 0x80 : 0;
    const float a = fabsf(f);
    if (isnan(a))
        return 0x7f;
    if (a >= 448.0f)
        return sign | 0x7e;
    if (a == 0.0f)
        return sign;
    int e;
    frexpf(a, &e); /* a = m * 2^e, 0.5 <= m < 1: the leading bit is 2^(e - 1) */
    /* Steps of 2^(e - 4) among normals (3 mantissa bits), of 2^-9 among subnormals (below
     * 2^-6); nearbyintf rounds ties to even in the default rounding mode. A step count that
     * reaches the next power of two carries into the exponent, as the code's bits do. */
    const int step = e - 1 >= -6 ? e - 4 : -9;
    const int n = (int)nearbyintf(ldexpf(a, -step)); /* 0 .. 16 */
    int code;
    if (step == -9)
        code = n; /* subnormal codes 0 .. 7; 8 is 2^-6, the first normal */
    else
        code = ((e - 1 + 7) << 3) + (n - 8); /* n in 8 .. 16 */
    return (uint8_t)(sign | (code > 0x7e ? 0x7e : code));
}

void dtype_to_f32(enum dtype t, const void *src, float *dst, size_t n)
{
    const uint16_t *h = src;
    switch (t) {
    case DTYPE_BF16:
        for (size_t i = 0; i < n; i++)
            dst[i] = bf16_to_f32(h[i]);
        break;
    case DTYPE_F16:
        for (size_t i = 0; i < n; i++)
            dst[i] = f16_to_f32(h[i]);
        break;
    case DTYPE_F32:
        memcpy(dst, src, n * sizeof(float));
        break;
    case DTYPE_F8E4M3:
        for (size_t i = 0; i < n; i++)
            dst[i] = e4m3_to_f32(((const uint8_t *)src)[i]);
        break;
    }
}
