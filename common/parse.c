#include "common/parse.h"
#include "common/error.h"

#include <errno.h>
#include <float.h>
#include <stdlib.h>
#include <string.h>

/* Whether text begins a plain decimal integer, [+-]?[0-9]: what strtoll would also take with
 * leading white space, which a flag's value does not have. */
static int starts_integer(const char *text)
{
    if (*text == '+' || *text == '-')
        text++;
    return *text >= '0' && *text <= '9';
}

int parse_i64(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (!starts_integer(text) || end == text || *end != '\0')
        return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' is not an integer", flag, text);
    if (errno == ERANGE || v < min || v > max)
        return pagoda_error_set(PAGODA_ERANGE, "%s: %s is outside [%lld, %lld]", flag, text,
                                (long long)min, (long long)max);
    *out = v;
    return 0;
}

int parse_f64(const char *flag, const char *text, double min, double max, double *out)
{
    char *end;
    errno = 0;
    /* decimal notation only: strtod's white space, hexadecimal, inf and nan are no flag values */
    if (text[0] == '\0' || text[strspn(text, "0123456789+-.eE")] != '\0')
        return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' is not a number", flag, text);
    double v = strtod(text, &end);
    if (end == text || *end != '\0')
        return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' is not a number", flag, text);
    /* past the doubles (1e400: HUGE_VAL) or below them (1e-400, which would round to 0: a
     * temperature's greedy) is out of range; without the letters of inf and nan, v is finite */
    if (errno == ERANGE || v < min || v > max)
        return pagoda_error_set(PAGODA_ERANGE, "%s: %s is outside [%g, %g]", flag, text, min, max);
    *out = v;
    return 0;
}

int parse_f32(const char *flag, const char *text, double min, double max, float *out)
{
    double d;
    int rc = parse_f64(flag, text, min, max, &d);
    if (rc != 0)
        return rc;
    if (d != 0 && (float)d == 0) /* a temperature's float 0 would decode greedily */
        return pagoda_error_set(PAGODA_ERANGE, "%s: %s is too small for a float (0 or at least %g)",
                                flag, text, (double)FLT_MIN);
    *out = (float)d;
    return 0;
}

int parse_on_off(const char *flag, const char *text, int *out)
{
    if (strcmp(text, "on") != 0 && strcmp(text, "off") != 0)
        return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' is not on or off", flag, text);
    *out = strcmp(text, "on") == 0;
    return 0;
}

int parse_i32_list(const char *flag, const char *text, int32_t min, int32_t max, size_t cap,
                   int32_t **out, size_t *count)
{
    size_t n = 1;
    for (const char *p = text; *p; p++)
        n += (*p == ',');
    if (n > cap)
        return pagoda_error_set(PAGODA_ERANGE, "%s: %zu values, more than the limit of %zu", flag,
                                n, cap);
    int32_t *values = malloc(n * sizeof(*values));
    if (values == NULL)
        return PAGODA_ENOMEM;
    const char *p = text;
    for (size_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (!starts_integer(p) || end == p || (*end != ',' && *end != '\0')) {
            free(values);
            return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' is not a list of integers", flag,
                                    text);
        }
        if (errno == ERANGE || v < min || v > max) {
            free(values);
            return pagoda_error_set(PAGODA_ERANGE, "%s: value %lld is outside [%d, %d]", flag, v,
                                    (int)min, (int)max);
        }
        values[i] = (int32_t)v;
        p = end + 1;
    }
    *out = values;
    *count = n;
    return 0;
}

int parse_id_value(const char *flag, const char *text, double limit, int32_t *id, double *value)
{
    const char *colon = strchr(text, ':');
    char id_text[16];
    int64_t i;
    int rc;
    if (colon == NULL || colon == text || (size_t)(colon - text) >= sizeof(id_text))
        return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' is not ID:VALUE", flag, text);
    memcpy(id_text, text, (size_t)(colon - text));
    id_text[colon - text] = '\0';
    if ((rc = parse_i64(flag, id_text, 0, INT32_MAX, &i)) != 0 ||
        (rc = parse_f64(flag, colon + 1, -limit, limit, value)) != 0)
        return rc;
    *id = (int32_t)i;
    return 0;
}
