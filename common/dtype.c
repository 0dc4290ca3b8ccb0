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
    }
}
