#include "common/json_util.h"
#include "common/error.h"
#include "common/file.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* file_open_regular: no wait on a FIFO, nothing but a regular file read. */
int json_util_read_file(const char *path, size_t max_bytes, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    int fd;
    struct stat st;
    int rc = file_open_regular(path, PAGODA_EINVAL, &fd, &st);
    if (rc != 0)
        return rc;
    if ((size_t)st.st_size > max_bytes) {
        close(fd);
        return pagoda_error_set(PAGODA_ERANGE, "%s: %lld bytes, more than the limit of %zu", path,
                                (long long)st.st_size, max_bytes);
    }
    /* Large reads (jansson's json_loadfd reads one byte per read(2)), never more than
     * max_bytes even when the file grows after the fstat; one byte more is room for a NUL. */
    size_t cap = (size_t)st.st_size + 1, len = 0;
    char *buf = malloc(cap + 1);
    if (buf == NULL) {
        close(fd);
        return PAGODA_ENOMEM;
    }
    for (;;) {
        if (len == cap) {
            size_t ncap = cap * 2 > max_bytes + 1 ? max_bytes + 1 : cap * 2;
            char *nb = ncap > cap ? realloc(buf, ncap + 1) : NULL;
            if (nb == NULL) {
                rc = ncap > cap ? PAGODA_ENOMEM
                                : pagoda_error_set(PAGODA_ERANGE,
                                                   "%s: grew past the limit of %zu bytes while "
                                                   "being read",
                                                   path, max_bytes);
                break;
            }
            buf = nb;
            cap = ncap;
        }
        ssize_t n = read(fd, buf + len, cap - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = pagoda_error_set(pagoda_from_errno(errno), "%s: read failed", path);
            break;
        }
        if (n == 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (rc == 0 && len > max_bytes)
        rc =
            pagoda_error_set(PAGODA_ERANGE, "%s: grew past the limit of %zu bytes while being read",
                             path, max_bytes);
    if (rc != 0) {
        free(buf);
        return rc;
    }
    buf[len] = '\0';
    *out = buf;
    *out_len = len;
    return 0;
}

int json_util_load_file(const char *path, size_t max_bytes, json_t **out)
{
    return json_util_load_file_with(path, max_bytes, JSON_REJECT_DUPLICATES, out);
}

int json_util_load_file_with(const char *path, size_t max_bytes, size_t flags, json_t **out)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = json_util_read_file(path, max_bytes, &buf, &len);
    if (rc != 0)
        return rc;
    json_error_t jerr;
    json_t *root = json_loadb(buf, len, flags, &jerr);
    free(buf);
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

void json_util_print_string(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}
