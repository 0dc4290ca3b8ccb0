#include "model/safetensors.h"
#include "common/error.h"
#include "common/file.h"
#include "common/json_util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define SINGLE_NAME "model.safetensors"
#define INDEX_NAME "model.safetensors.index.json"
/* Paths built from a directory and a file name longer than this are refused. */
#define MAX_PATH 4096

struct safetensors_file {
    char *path;
    void *map;
    size_t map_bytes;
    struct safetensors_tensor *tensors; /* sorted by name */
    size_t count;
    char *names; /* every tensor's name, NUL-terminated, one after another */
};

/* A tensor of a set, with the shard it came from (for messages about duplicates). */
struct set_entry {
    const struct safetensors_tensor *tensor;
    const struct safetensors_file *file;
};

struct safetensors_set {
    struct safetensors_file **files;
    size_t num_files;
    struct set_entry *entries; /* sorted by name */
    size_t count;
};

/* "[a, b, c]" into buf. */
static const char *format_shape(char *buf, size_t len, const int64_t *shape, int ndim)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used +=
            (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
    return buf;
}

/* Reads one non-negative JSON integer, or fails. */
static bool get_u64(const json_t *v, uint64_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0)
        return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

/* Validates one header entry and fills *t. data_offset is where the data area starts in the
 * file (8 + N) and data_bytes its length. */
static int parse_entry(const char *path, const char *name, const json_t *v, const uint8_t *data,
                       size_t data_offset, size_t data_bytes, struct safetensors_tensor *t)
{
    if (!json_is_object(v))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: tensor %s: header entry is not an object",
                                path, name);
    const char *dtype_name_s;
    if (json_util_get_string(v, "dtype", &dtype_name_s) != 0)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: tensor %s: \"dtype\" is missing or not a "
                                "string",
                                path, name);
    if (dtype_from_safetensors(dtype_name_s, &t->dtype) != 0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "%s: tensor %s has dtype %s, which is not supported (BF16, F16, "
                                "F32)",
                                path, name, dtype_name_s);

    const json_t *shape = json_object_get(v, "shape");
    if (!json_is_array(shape))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: tensor %s: \"shape\" is missing or not a "
                                "list",
                                path, name);
    if (json_array_size(shape) > SAFETENSORS_MAX_DIMS)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "%s: tensor %s has %zu dimensions, more than %d", path, name,
                                json_array_size(shape), SAFETENSORS_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    uint64_t expect = dtype_size(t->dtype);
    bool overflow = false;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t dim;
        if (!get_u64(json_array_get(shape, (size_t)i), &dim) || dim > INT64_MAX)
            return pagoda_error_set(PAGODA_EFORMAT,
                                    "%s: tensor %s: shape entry %d is not a non-negative integer",
                                    path, name, i);
        t->shape[i] = (int64_t)dim;
        overflow |= __builtin_mul_overflow(expect, dim, &expect);
    }
    char sbuf[160];
    if (overflow)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: tensor %s: shape %s overflows", path, name,
                                format_shape(sbuf, sizeof(sbuf), t->shape, t->ndim));

    const json_t *offs = json_object_get(v, "data_offsets");
    uint64_t begin, end;
    if (!json_is_array(offs) || json_array_size(offs) != 2 ||
        !get_u64(json_array_get(offs, 0), &begin) || !get_u64(json_array_get(offs, 1), &end))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: tensor %s: \"data_offsets\" must be two non-negative "
                                "integers",
                                path, name);
    if (begin > end)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: tensor %s: data_offsets [%llu, %llu] begin after they end",
                                path, name, (unsigned long long)begin, (unsigned long long)end);
    if (end > data_bytes)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: tensor %s: data_offsets [%llu, %llu] go past the end of "
                                "the %zu-byte data area (truncated file or wrong offsets)",
                                path, name, (unsigned long long)begin, (unsigned long long)end,
                                data_bytes);
    if (end - begin != expect)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: tensor %s: data_offsets span %llu bytes but shape %s of %s "
                                "needs %llu",
                                path, name, (unsigned long long)(end - begin),
                                format_shape(sbuf, sizeof(sbuf), t->shape, t->ndim),
                                dtype_name(t->dtype), (unsigned long long)expect);
    /* The mapping starts on a page, so this is the data pointer's alignment. Files written by
     * the reference implementation are always aligned (8-byte padded header, tensors sorted
     * by alignment); kernels read the data as float or uint16_t arrays. */
    if ((data_offset + begin) % dtype_size(t->dtype) != 0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "%s: tensor %s: data at file offset %llu is not aligned to its "
                                "%zu-byte elements",
                                path, name, (unsigned long long)(data_offset + begin),
                                dtype_size(t->dtype));
    t->data = data + begin;
    t->nbytes = (size_t)expect;
    return 0;
}

static int compare_by_name(const void *a, const void *b)
{
    return strcmp(((const struct safetensors_tensor *)a)->name,
                  ((const struct safetensors_tensor *)b)->name);
}

static int compare_by_data(const void *a, const void *b)
{
    const struct safetensors_tensor *x = *(const struct safetensors_tensor *const *)a;
    const struct safetensors_tensor *y = *(const struct safetensors_tensor *const *)b;
    uintptr_t px = (uintptr_t)x->data, py = (uintptr_t)y->data;
    return px < py ? -1 : px > py;
}

/* Refuses two tensors whose bytes overlap: one of them would be read as the other's data. */
static int check_overlaps(struct safetensors_file *f)
{
    if (f->count < 2)
        return 0;
    const struct safetensors_tensor **order = malloc(f->count * sizeof(*order));
    if (order == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", f->path);
    for (size_t i = 0; i < f->count; i++)
        order[i] = &f->tensors[i];
    qsort(order, f->count, sizeof(*order), compare_by_data);
    int rc = 0;
    const struct safetensors_tensor *prev = NULL;
    for (size_t i = 0; i < f->count && rc == 0; i++) {
        const struct safetensors_tensor *t = order[i];
        if (t->nbytes == 0)
            continue;
        if (prev != NULL && (const uint8_t *)prev->data + prev->nbytes > (const uint8_t *)t->data)
            rc = pagoda_error_set(PAGODA_EFORMAT, "%s: tensors %s and %s overlap", f->path,
                                  prev->name, t->name);
        prev = t;
    }
    free(order);
    return rc;
}

/* Parses the JSON header into f->tensors. */
static int parse_header(struct safetensors_file *f, const uint8_t *header, size_t header_bytes)
{
    json_error_t jerr;
    json_t *root = json_loadb((const char *)header, header_bytes, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: header is not valid JSON: %s (column %d)",
                                f->path, jerr.text, jerr.column);
    int rc = 0;
    if (!json_is_object(root)) {
        rc = pagoda_error_set(PAGODA_EFORMAT, "%s: header is not a JSON object", f->path);
        goto done;
    }
    size_t names_bytes = 0, count = 0;
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(value)) {
                rc = pagoda_error_set(PAGODA_EFORMAT, "%s: \"__metadata__\" is not an object",
                                      f->path);
                goto done;
            }
            continue;
        }
        size_t len = strlen(key);
        if (len == 0 || len > SAFETENSORS_MAX_NAME) {
            rc = pagoda_error_set(PAGODA_ERANGE, "%s: a tensor name of %zu bytes (limit %d)",
                                  f->path, len, SAFETENSORS_MAX_NAME);
            goto done;
        }
        names_bytes += len + 1;
        count++;
    }
    f->tensors = calloc(count ? count : 1, sizeof(*f->tensors));
    f->names = malloc(names_bytes ? names_bytes : 1);
    if (f->tensors == NULL || f->names == NULL) {
        rc = pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory for %zu tensors", f->path, count);
        goto done;
    }
    size_t data_offset = 8 + header_bytes;
    const uint8_t *data = (const uint8_t *)f->map + data_offset;
    size_t data_bytes = f->map_bytes - data_offset;
    char *name = f->names;
    json_object_foreach(root, key, value)
    {
        if (strcmp(key, "__metadata__") == 0)
            continue;
        size_t len = strlen(key);
        memcpy(name, key, len + 1);
        struct safetensors_tensor *t = &f->tensors[f->count];
        t->name = name;
        name += len + 1;
        rc = parse_entry(f->path, t->name, value, data, data_offset, data_bytes, t);
        if (rc != 0)
            goto done;
        f->count++;
    }
    qsort(f->tensors, f->count, sizeof(*f->tensors), compare_by_name);
    rc = check_overlaps(f);
done:
    json_decref(root);
    return rc;
}

int safetensors_open(const char *path, struct safetensors_file **out)
{
    int rc;
    int fd = -1;
    struct safetensors_file *f = calloc(1, sizeof(*f));
    if (f == NULL || (f->path = strdup(path)) == NULL) {
        rc = pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", path);
        goto fail;
    }
    /* no wait on a FIFO in the file's place (a worker's start, for ever) */
    struct stat st;
    if ((rc = file_open_regular(path, PAGODA_EFORMAT, &fd, &st)) != 0)
        goto fail;
    if (st.st_size < 8) {
        rc = pagoda_error_set(PAGODA_EFORMAT,
                              "%s: truncated: %lld bytes, less than the 8-byte header length", path,
                              (long long)st.st_size);
        goto fail;
    }
    f->map_bytes = (size_t)st.st_size;
    f->map = mmap(NULL, f->map_bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    if (f->map == MAP_FAILED) {
        int e = errno;
        f->map = NULL;
        rc = pagoda_error_set(pagoda_from_errno(e), "%s: cannot map %zu bytes: %s", path,
                              f->map_bytes, strerror(e));
        goto fail;
    }
    close(fd);
    fd = -1;

    const uint8_t *p = f->map;
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; i--)
        header_bytes = header_bytes << 8 | p[i];
    if (header_bytes > SAFETENSORS_MAX_HEADER_BYTES) {
        rc = pagoda_error_set(PAGODA_ERANGE,
                              "%s: header length %llu exceeds the limit of %u bytes (not a "
                              "safetensors file?)",
                              path, (unsigned long long)header_bytes, SAFETENSORS_MAX_HEADER_BYTES);
        goto fail;
    }
    if (header_bytes > f->map_bytes - 8) {
        rc = pagoda_error_set(PAGODA_EFORMAT,
                              "%s: truncated: the header is %llu bytes but only %zu follow the "
                              "length",
                              path, (unsigned long long)header_bytes, f->map_bytes - 8);
        goto fail;
    }
    if ((rc = parse_header(f, p + 8, (size_t)header_bytes)) != 0)
        goto fail;
    *out = f;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    safetensors_close(f);
    return rc;
}

void safetensors_close(struct safetensors_file *file)
{
    if (file == NULL)
        return;
    if (file->map != NULL)
        munmap(file->map, file->map_bytes);
    free(file->tensors);
    free(file->names);
    free(file->path);
    free(file);
}

const char *safetensors_path(const struct safetensors_file *file)
{
    return file->path;
}

size_t safetensors_count(const struct safetensors_file *file)
{
    return file->count;
}

const struct safetensors_tensor *safetensors_tensor_at(const struct safetensors_file *file,
                                                       size_t index)
{
    return index < file->count ? &file->tensors[index] : NULL;
}

static int compare_key_tensor(const void *key, const void *elem)
{
    return strcmp(key, ((const struct safetensors_tensor *)elem)->name);
}

int safetensors_find(const struct safetensors_file *file, const char *name,
                     const struct safetensors_tensor **out)
{
    const struct safetensors_tensor *t =
        bsearch(name, file->tensors, file->count, sizeof(*file->tensors), compare_key_tensor);
    if (t == NULL)
        return PAGODA_ENOENT;
    *out = t;
    return 0;
}

/* ---- sets ---- */

static int join_path(char *buf, const char *dir, const char *name)
{
    if ((size_t)snprintf(buf, MAX_PATH, "%s/%s", dir, name) >= MAX_PATH)
        return pagoda_error_set(PAGODA_ERANGE, "%s/%s: path is too long", dir, name);
    return 0;
}

/* 1 when path exists, 0 when it does not, or an error. */
static int exists(const char *path)
{
    struct stat st;
    if (stat(path, &st) == 0)
        return 1;
    if (errno == ENOENT)
        return 0;
    int e = errno;
    return pagoda_error_set(pagoda_from_errno(e), "%s: %s", path, strerror(e));
}

static int compare_strings(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int compare_entries(const void *a, const void *b)
{
    return strcmp(((const struct set_entry *)a)->tensor->name,
                  ((const struct set_entry *)b)->tensor->name);
}

static int compare_key_entry(const void *key, const void *elem)
{
    return strcmp(key, ((const struct set_entry *)elem)->tensor->name);
}

/* A shard name must be a plain file in the model directory: an index cannot send the loader
 * elsewhere on the file system. */
static bool plain_file_name(const char *s)
{
    size_t len = strlen(s);
    return len > 0 && len <= SAFETENSORS_MAX_NAME && strchr(s, '/') == NULL &&
           strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

/* Opens the shards named by the index at index_path, in name order, into set->files. */
static int open_shards(struct safetensors_set *set, const char *model_dir, const char *index_path,
                       const json_t *weight_map)
{
    size_t n = json_object_size(weight_map);
    if (n == 0)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: \"weight_map\" is empty", index_path);
    const char **names = malloc(n * sizeof(*names));
    if (names == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", index_path);
    int rc = 0;
    size_t i = 0;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)weight_map, key, value)
    {
        names[i] = json_string_value(value);
        if (names[i] == NULL || !plain_file_name(names[i])) {
            rc = pagoda_error_set(PAGODA_EFORMAT,
                                  "%s: weight_map entry for %s must name a file in the model "
                                  "directory",
                                  index_path, key);
            goto done;
        }
        i++;
    }
    qsort(names, n, sizeof(*names), compare_strings);
    size_t unique = 0;
    for (i = 0; i < n; i++) {
        if (i == 0 || strcmp(names[i], names[unique - 1]) != 0)
            names[unique++] = names[i];
    }
    if (unique > SAFETENSORS_MAX_SHARDS) {
        rc = pagoda_error_set(PAGODA_ERANGE, "%s: %zu shards, more than %d", index_path, unique,
                              SAFETENSORS_MAX_SHARDS);
        goto done;
    }
    set->files = calloc(unique, sizeof(*set->files));
    if (set->files == NULL) {
        rc = pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", index_path);
        goto done;
    }
    for (i = 0; i < unique; i++) {
        char path[MAX_PATH];
        if ((rc = join_path(path, model_dir, names[i])) != 0)
            goto done;
        if ((rc = exists(path)) <= 0) {
            if (rc == 0)
                rc = pagoda_error_set(PAGODA_ENOENT, "%s: shard %s named by %s is missing", path,
                                      names[i], INDEX_NAME);
            goto done;
        }
        if ((rc = safetensors_open(path, &set->files[i])) != 0)
            goto done;
        set->num_files++;
    }
done:
    free(names);
    return rc;
}

/* Checks that every weight_map entry's tensor is in the shard the index names. */
static int check_weight_map(const struct safetensors_set *set, const char *index_path,
                            const json_t *weight_map)
{
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)weight_map, key, value)
    {
        const char *shard = json_string_value(value);
        /* open_shards opened the files in name order: search them by file name. */
        const struct safetensors_file *file = NULL;
        size_t lo = 0, hi = set->num_files;
        while (lo < hi && file == NULL) {
            size_t mid = lo + (hi - lo) / 2;
            int cmp = strcmp(shard, strrchr(safetensors_path(set->files[mid]), '/') + 1);
            if (cmp == 0)
                file = set->files[mid];
            else if (cmp < 0)
                hi = mid;
            else
                lo = mid + 1;
        }
        const struct safetensors_tensor *t;
        if (file == NULL || safetensors_find(file, key, &t) != 0)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    "%s: weight_map puts tensor %s in %s, which does not hold it",
                                    index_path, key, shard);
    }
    return 0;
}

/* Builds the name-sorted list of every tensor over all files, refusing duplicates. */
static int build_entries(struct safetensors_set *set)
{
    size_t total = 0;
    for (size_t i = 0; i < set->num_files; i++)
        total += safetensors_count(set->files[i]);
    set->entries = calloc(total ? total : 1, sizeof(*set->entries));
    if (set->entries == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory for %zu tensors", total);
    for (size_t i = 0; i < set->num_files; i++) {
        for (size_t j = 0; j < safetensors_count(set->files[i]); j++) {
            set->entries[set->count].tensor = safetensors_tensor_at(set->files[i], j);
            set->entries[set->count].file = set->files[i];
            set->count++;
        }
    }
    qsort(set->entries, set->count, sizeof(*set->entries), compare_entries);
    for (size_t i = 1; i < set->count; i++) {
        if (strcmp(set->entries[i - 1].tensor->name, set->entries[i].tensor->name) == 0)
            return pagoda_error_set(
                PAGODA_EFORMAT, "tensor %s is in both %s and %s", set->entries[i].tensor->name,
                safetensors_path(set->entries[i - 1].file), safetensors_path(set->entries[i].file));
    }
    return 0;
}

int safetensors_set_open(const char *model_dir, struct safetensors_set **out)
{
    json_t *index = NULL;
    char path[MAX_PATH];
    int rc;
    struct safetensors_set *set = calloc(1, sizeof(*set));
    if (set == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", model_dir);

    if ((rc = join_path(path, model_dir, SINGLE_NAME)) != 0 || (rc = exists(path)) < 0)
        goto fail;
    if (rc == 1) {
        set->files = calloc(1, sizeof(*set->files));
        if (set->files == NULL) {
            rc = pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", path);
            goto fail;
        }
        if ((rc = safetensors_open(path, &set->files[0])) != 0)
            goto fail;
        set->num_files = 1;
    } else {
        if ((rc = join_path(path, model_dir, INDEX_NAME)) != 0 || (rc = exists(path)) < 0)
            goto fail;
        if (rc == 0) {
            rc = pagoda_error_set(PAGODA_ENOENT, "%s: neither %s nor %s exists", model_dir,
                                  SINGLE_NAME, INDEX_NAME);
            goto fail;
        }
        if ((rc = json_util_load_file(path, SAFETENSORS_INDEX_MAX_BYTES, &index)) != 0)
            goto fail;
        const json_t *weight_map = json_object_get(index, "weight_map");
        if (!json_is_object(weight_map)) {
            rc = pagoda_error_set(PAGODA_EFORMAT, "%s: \"weight_map\" is missing or not an object",
                                  path);
            goto fail;
        }
        if ((rc = open_shards(set, model_dir, path, weight_map)) != 0 ||
            (rc = check_weight_map(set, path, weight_map)) != 0)
            goto fail;
    }
    if ((rc = build_entries(set)) != 0)
        goto fail;
    json_decref(index);
    *out = set;
    return 0;
fail:
    json_decref(index);
    safetensors_set_close(set);
    return rc;
}

void safetensors_set_close(struct safetensors_set *set)
{
    if (set == NULL)
        return;
    for (size_t i = 0; i < set->num_files; i++)
        safetensors_close(set->files[i]);
    free(set->files);
    free(set->entries);
    free(set);
}

size_t safetensors_set_count(const struct safetensors_set *set)
{
    return set->count;
}

const struct safetensors_tensor *safetensors_set_tensor_at(const struct safetensors_set *set,
                                                           size_t index)
{
    return index < set->count ? set->entries[index].tensor : NULL;
}

int safetensors_set_find(const struct safetensors_set *set, const char *name,
                         const struct safetensors_tensor **out, size_t *index)
{
    const struct set_entry *e =
        bsearch(name, set->entries, set->count, sizeof(*set->entries), compare_key_entry);
    if (e == NULL)
        return PAGODA_ENOENT;
    *out = e->tensor;
    if (index != NULL)
        *index = (size_t)(e - set->entries);
    return 0;
}
