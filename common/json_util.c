#include "common/json_util.h"
#include "common/error.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

int json_util_load_file(const char *path, size_t max_bytes, json_t **out)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return pagoda_error_set(pagoda_from_errno(errno), "%s: cannot open", path);
    if ((size_t)st.st_size > max_bytes)
        return pagoda_error_set(PAGODA_ERANGE, "%s: %lld bytes, more than the limit of %zu", path,
                                (long long)st.st_size, max_bytes);
    json_error_t jerr;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return pagoda_error_set(PAGODA_EFORMAT, "%s:%d:%d: %s", path, jerr.line, jerr.column,
                                jerr.text);
    *out = root;
    return 0;
}

static int lookup(const json_t *obj, const char *key, json_t **value)
{
    *value = json_is_object(obj) ? json_object_get(obj, key) : NULL;
    if (*value == NULL || json_is_null(*value))
        return PAGODA_ENOENT;
    return 0;
}

int json_util_get_int(const json_t *obj, const char *key, int64_t *out)
{
    json_t *v;
    if (lookup(obj, key, &v) != 0)
        return PAGODA_ENOENT;
    if (json_is_integer(v)) {
        *out = (int64_t)json_integer_value(v);
        return 0;
    }
    if (json_is_real(v)) {
        double d = json_real_value(v);
        if (d == floor(d) && fabs(d) < 9.0e15) {
            *out = (int64_t)d;
            return 0;
        }
    }
    return pagoda_error_set(PAGODA_EFORMAT, "\"%s\" must be an integer", key);
}

int json_util_get_number(const json_t *obj, const char *key, double *out)
{
    json_t *v;
    if (lookup(obj, key, &v) != 0)
        return PAGODA_ENOENT;
    if (!json_is_number(v))
        return pagoda_error_set(PAGODA_EFORMAT, "\"%s\" must be a number", key);
    *out = json_number_value(v);
    return 0;
}

int json_util_get_bool(const json_t *obj, const char *key, bool *out)
{
    json_t *v;
    if (lookup(obj, key, &v) != 0)
        return PAGODA_ENOENT;
    if (!json_is_boolean(v))
        return pagoda_error_set(PAGODA_EFORMAT, "\"%s\" must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

int json_util_get_string(const json_t *obj, const char *key, const char **out)
{
    json_t *v;
    if (lookup(obj, key, &v) != 0)
        return PAGODA_ENOENT;
    if (!json_is_string(v))
        return pagoda_error_set(PAGODA_EFORMAT, "\"%s\" must be a string", key);
    *out = json_string_value(v);
    return 0;
}

bool json_util_is_null(const json_t *obj, const char *key)
{
    json_t *v;
    return lookup(obj, key, &v) != 0;
}
