/* A read-only, memory-mapped reader of safetensors files, single or sharded.
 *
 * A file is an 8-byte little-endian header length N, N bytes of JSON header
 * ({"name": {"dtype": "BF16", "shape": [..], "data_offsets": [begin, end]}, ...,
 * "__metadata__": {...}}) and then the data area, which offsets count from. Opening checks
 * everything before anything is handed out: lengths against the file size (a short file is
 * reported as truncated), every tensor's offsets inside the data area, its byte count against
 * its shape and dtype, overlaps, alignment of the data to the element size, and the dtype
 * (BF16, F16 and F32 only; any other refuses the whole file, naming the tensor). Tensor data
 * is never copied: it points into the mapping, valid until the file or set is closed.
 *
 * A model directory holds either `model.safetensors` or `model.safetensors.index.json` with
 * the shards it names; a safetensors_set opens either and finds tensors by name across shards. */
#ifndef PAGODA_MODEL_SAFETENSORS_H
#define PAGODA_MODEL_SAFETENSORS_H

#include "common/dtype.h"

#include <stddef.h>
#include <stdint.h>

/* Headers larger than this are refused, as the reference implementation does. */
#define SAFETENSORS_MAX_HEADER_BYTES (100u << 20)
/* Tensors of more dimensions are refused. */
#define SAFETENSORS_MAX_DIMS 8
/* Longest tensor name accepted, in bytes, not counting the terminating NUL. */
#define SAFETENSORS_MAX_NAME 255
/* model.safetensors.index.json files larger than this are refused (real ones: < 1 MiB). */
#define SAFETENSORS_INDEX_MAX_BYTES (16u << 20)
/* Most shard files one index may name. */
#define SAFETENSORS_MAX_SHARDS 4096

/* One tensor of an open file. Every pointer lives as long as the file (or set) it came from. */
struct safetensors_tensor {
    const char *name;
    enum dtype dtype;
    int ndim; /* 0 for a scalar */
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const void *data; /* in the read-only mapping, aligned to dtype_size(dtype) */
    size_t nbytes;    /* product(shape) * dtype_size(dtype) */
};

struct safetensors_file;

/* Maps and validates the safetensors file at path and returns it in *out (the caller closes
 * it). Errors, each with a detail naming the file (and the tensor when one is at fault):
 * PAGODA_ENOENT / PAGODA_EIO / PAGODA_EPERM (opening or mapping), PAGODA_EFORMAT (truncated,
 * malformed header, offsets outside the data area or overlapping, byte count not matching the
 * shape), PAGODA_ERANGE (header or a name above the limits), PAGODA_EUNSUPPORTED (a dtype other
 * than BF16/F16/F32, too many dimensions, misaligned data), PAGODA_ENOMEM. */
int safetensors_open(const char *path, struct safetensors_file **out);

/* Unmaps the file and frees it; every tensor pointer from it becomes invalid. Accepts NULL. */
void safetensors_close(struct safetensors_file *file);

/* The path the file was opened with (owned by the file). */
const char *safetensors_path(const struct safetensors_file *file);

/* The number of tensors (the "__metadata__" entry is not one). */
size_t safetensors_count(const struct safetensors_file *file);

/* The tensor at index (< safetensors_count), in name order, for iteration. */
const struct safetensors_tensor *safetensors_tensor_at(const struct safetensors_file *file,
                                                       size_t index);

/* Finds a tensor by exact name and points *out at it. Returns 0 or PAGODA_ENOENT (no detail
 * recorded: the caller knows what it was looking for). */
int safetensors_find(const struct safetensors_file *file, const char *name,
                     const struct safetensors_tensor **out);

struct safetensors_set;

/* Opens the weights of a model directory: DIR/model.safetensors when it exists (preferred, as
 * transformers does), else DIR/model.safetensors.index.json and every shard its weight_map
 * names (plain file names in DIR). Refuses a shard that is missing (PAGODA_ENOENT, naming the
 * file), a weight_map entry whose tensor is not in the shard it names (PAGODA_EMISMATCH), a
 * tensor present in two shards or a malformed index (PAGODA_EFORMAT), more than
 * SAFETENSORS_MAX_SHARDS shards (PAGODA_ERANGE), and a directory with neither file
 * (PAGODA_ENOENT); plus every error of safetensors_open. On success *out is the caller's. */
int safetensors_set_open(const char *model_dir, struct safetensors_set **out);

/* Closes every file of the set and frees it. Accepts NULL. */
void safetensors_set_close(struct safetensors_set *set);

/* The number of tensors over all shards. */
size_t safetensors_set_count(const struct safetensors_set *set);

/* The tensor at index (< safetensors_set_count), in name order over all shards. */
const struct safetensors_tensor *safetensors_set_tensor_at(const struct safetensors_set *set,
                                                           size_t index);

/* Finds a tensor by exact name in whichever shard holds it: *out points at it and, when index
 * is not NULL, *index is its position for safetensors_set_tensor_at. Returns 0 or
 * PAGODA_ENOENT (no detail recorded). */
int safetensors_set_find(const struct safetensors_set *set, const char *name,
                         const struct safetensors_tensor **out, size_t *index);

#endif
