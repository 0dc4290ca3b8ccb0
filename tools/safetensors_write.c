#include "tools/safetensors_write.h"
#include "common/error.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct safetensors_writer {
    FILE *file;
    char path[PATH_MAX];
    char tmp_path[PATH_MAX];
    uint64_t data_bytes;    /* what the entries describe */
    uint64_t written_bytes; /* tensor data received so far */
    int failed;             /* a write failed: only abort is left */
    int created;            /* tmp_path is ours to remove */
};

uint64_t safetensors_entry_bytes(const struct safetensors_entry *e)
{
    uint64_t n = dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++)
        n *= (uint64_t)e->shape[d];
    return n;
}

/* Names end up in JSON and in error messages: printable ASCII only keeps both simple. */
static int check_entry(const struct safetensors_entry *e, size_t index)
{
    size_t len = strnlen(e->name, sizeof(e->name));
    if (len == 0 || len == sizeof(e->name))
        return pagoda_error_set(PAGODA_EINVAL, "tensor %zu: name empty or longer than %d bytes",
                                index, SAFETENSORS_WRITE_NAME_MAX - 1);
    for (size_t i = 0; i < len; i++) {
        if (e->name[i] < 0x20 || e->name[i] > 0x7e || e->name[i] == '"' || e->name[i] == '\\')
            return pagoda_error_set(PAGODA_EINVAL, "tensor %zu: name has a character %#x", index,
                                    (unsigned)(unsigned char)e->name[i]);
    }
    if (strcmp(e->name, "__metadata__") == 0)
        return pagoda_error_set(PAGODA_EINVAL, "tensor %zu: the name __metadata__ is reserved",
                                index);
    if (e->dtype != DTYPE_BF16 && e->dtype != DTYPE_F16 && e->dtype != DTYPE_F32)
        return pagoda_error_set(PAGODA_EINVAL, "tensor %s: unknown dtype %d", e->name,
                                (int)e->dtype);
    if (e->ndim < 0 || e->ndim > SAFETENSORS_WRITE_MAX_DIMS)
        return pagoda_error_set(PAGODA_EINVAL, "tensor %s: %d dimensions (at most %d)", e->name,
                                e->ndim, SAFETENSORS_WRITE_MAX_DIMS);
    /* Bound the product below 2^62 so that offsets never overflow however many tensors. */
    uint64_t n = dtype_size(e->dtype);
    for (int d = 0; d < e->ndim; d++) {
        if (e->shape[d] < 0 || (e->shape[d] > 0 && n > (UINT64_C(1) << 46) / (uint64_t)e->shape[d]))
            return pagoda_error_set(PAGODA_EINVAL, "tensor %s: dimension %d (%lld) is invalid",
                                    e->name, d, (long long)e->shape[d]);
        n *= (uint64_t)e->shape[d];
    }
    return 0;
}

/* Builds the header object: "__metadata__" first, then the tensors in data order. */
static int build_header(const struct safetensors_entry *entries, size_t count, json_t **out,
                        uint64_t *data_bytes)
{
    int rc = PAGODA_ENOMEM;
    json_t *root = json_object();
    json_t *meta = json_pack("{s:s}", "format", "pt");
    if (root == NULL || meta == NULL || json_object_set_new(root, "__metadata__", meta) != 0) {
        json_decref(meta);
        goto fail;
    }
    uint64_t offset = 0;
    for (size_t i = 0; i < count; i++) {
        const struct safetensors_entry *e = &entries[i];
        rc = check_entry(e, i);
        if (rc != 0)
            goto fail;
        if (json_object_get(root, e->name) != NULL) {
            rc = pagoda_error_set(PAGODA_EINVAL, "tensor %s: name given twice", e->name);
            goto fail;
        }
        rc = PAGODA_ENOMEM;
        uint64_t bytes = safetensors_entry_bytes(e);
        json_t *shape = json_array();
        json_t *t = json_object();
        if (t == NULL || shape == NULL ||
            json_object_set_new(t, "dtype", json_string(dtype_name(e->dtype))) != 0) {
            json_decref(shape);
            json_decref(t);
            goto fail;
        }
        for (int d = 0; d < e->ndim; d++) {
            if (json_array_append_new(shape, json_integer(e->shape[d])) != 0) {
                json_decref(shape);
                json_decref(t);
                goto fail;
            }
        }
        if (json_object_set_new(t, "shape", shape) != 0 ||
            json_object_set_new(
                t, "data_offsets",
                json_pack("[II]", (json_int_t)offset, (json_int_t)(offset + bytes))) != 0 ||
            json_object_set_new(root, e->name, t) != 0)
            goto fail;
        offset += bytes;
    }
    *out = root;
    *data_bytes = offset;
    return 0;
fail:
    json_decref(root);
    return rc;
}

static int write_all(struct safetensors_writer *w, const void *data, size_t bytes)
{
    if (bytes > 0 && fwrite(data, 1, bytes, w->file) != bytes) {
        w->failed = 1;
        return pagoda_error_set(pagoda_from_errno(errno), "%s: write failed: %s", w->tmp_path,
                                strerror(errno));
    }
    return 0;
}

int safetensors_writer_open(const char *path, const struct safetensors_entry *entries, size_t count,
                            struct safetensors_writer **out)
{
    int rc;
    json_t *header = NULL;
    char *text = NULL;
    struct safetensors_writer *w = NULL;

    if (count == 0 || count > SAFETENSORS_WRITE_MAX_TENSORS)
        return pagoda_error_set(PAGODA_EINVAL, "%s: %zu tensors (1 to %d allowed)", path, count,
                                SAFETENSORS_WRITE_MAX_TENSORS);
    w = calloc(1, sizeof(*w));
    if (w == NULL)
        return PAGODA_ENOMEM;
    if ((size_t)snprintf(w->path, sizeof(w->path), "%s", path) >= sizeof(w->path) ||
        (size_t)snprintf(w->tmp_path, sizeof(w->tmp_path), "%s.tmp", path) >= sizeof(w->tmp_path)) {
        rc = pagoda_error_set(PAGODA_EINVAL, "%s: path too long", path);
        goto fail;
    }
    rc = build_header(entries, count, &header, &w->data_bytes);
    if (rc != 0)
        goto fail;
    text = json_dumps(header, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (text == NULL) {
        rc = PAGODA_ENOMEM;
        goto fail;
    }
    size_t len = strlen(text);
    size_t padded = (len + 7) & ~(size_t)7;
    if (padded > SAFETENSORS_WRITE_MAX_HEADER_BYTES) {
        rc = pagoda_error_set(PAGODA_ERANGE, "%s: header of %zu bytes is over the limit of %u",
                              path, padded, SAFETENSORS_WRITE_MAX_HEADER_BYTES);
        goto fail;
    }
    w->file = fopen(w->tmp_path, "wb");
    if (w->file == NULL) {
        rc = pagoda_error_set(pagoda_from_errno(errno), "%s: cannot create: %s", w->tmp_path,
                              strerror(errno));
        goto fail;
    }
    w->created = 1;
    unsigned char size_le[8];
    for (int i = 0; i < 8; i++)
        size_le[i] = (unsigned char)((uint64_t)padded >> (8 * i));
    static const char spaces[8] = "        ";
    if ((rc = write_all(w, size_le, sizeof(size_le))) != 0 || (rc = write_all(w, text, len)) != 0 ||
        (rc = write_all(w, spaces, padded - len)) != 0)
        goto fail;
    free(text);
    json_decref(header);
    *out = w;
    return 0;
fail:
    free(text);
    json_decref(header);
    safetensors_writer_abort(w);
    return rc;
}

int safetensors_writer_write(struct safetensors_writer *w, const void *data, size_t bytes)
{
    if (w->failed)
        return pagoda_error_set(PAGODA_EIO, "%s: an earlier write failed", w->tmp_path);
    if (bytes > w->data_bytes - w->written_bytes) {
        w->failed = 1;
        return pagoda_error_set(PAGODA_ERANGE, "%s: %zu bytes more than the %llu described",
                                w->path, bytes,
                                (unsigned long long)(w->data_bytes - w->written_bytes));
    }
    int rc = write_all(w, data, bytes);
    if (rc == 0)
        w->written_bytes += bytes;
    return rc;
}

int safetensors_writer_commit(struct safetensors_writer *w)
{
    int rc;
    if (w->failed) {
        rc = pagoda_error_set(PAGODA_EIO, "%s: an earlier write failed", w->tmp_path);
        goto fail;
    }
    if (w->written_bytes != w->data_bytes) {
        rc = pagoda_error_set(PAGODA_EINVAL, "%s: %llu of %llu bytes of tensor data written",
                              w->path, (unsigned long long)w->written_bytes,
                              (unsigned long long)w->data_bytes);
        goto fail;
    }
    if (fflush(w->file) != 0 || fsync(fileno(w->file)) != 0) {
        rc = pagoda_error_set(pagoda_from_errno(errno), "%s: write failed: %s", w->tmp_path,
                              strerror(errno));
        goto fail;
    }
    FILE *f = w->file;
    w->file = NULL;
    if (fclose(f) != 0) {
        rc = pagoda_error_set(pagoda_from_errno(errno), "%s: close failed: %s", w->tmp_path,
                              strerror(errno));
        goto fail;
    }
    if (rename(w->tmp_path, w->path) != 0) {
        rc = pagoda_error_set(pagoda_from_errno(errno), "%s: cannot rename to %s: %s", w->tmp_path,
                              w->path, strerror(errno));
        goto fail;
    }
    free(w);
    return 0;
fail:
    safetensors_writer_abort(w);
    return rc;
}

void safetensors_writer_abort(struct safetensors_writer *w)
{
    if (w == NULL)
        return;
    if (w->file != NULL)
        fclose(w->file);
    if (w->created)
        unlink(w->tmp_path);
    free(w);
}
