/* A streaming writer of safetensors files, for the tools that make test models.
 *
 * The caller describes every tensor up front (name, dtype, shape, in file order); the writer
 * lays the data out in that order, writes the header (JSON with dtype, shape and data_offsets
 * per tensor and "__metadata__": {"format": "pt"}, padded with spaces to a multiple of 8 bytes,
 * as the reference implementation does), then takes the tensors' bytes in order. The file is
 * written under a temporary name and renamed into place only when every byte has arrived, so a
 * failed or interrupted run never leaves a plausible-looking truncated file. Same entries and
 * same data give byte-identical files. */
#ifndef PAGODA_TOOLS_SAFETENSORS_WRITE_H
#define PAGODA_TOOLS_SAFETENSORS_WRITE_H

#include "common/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define SAFETENSORS_WRITE_MAX_TENSORS 65536
#define SAFETENSORS_WRITE_MAX_DIMS 8
#define SAFETENSORS_WRITE_NAME_MAX 256
/* Headers larger than this are refused (readers bound theirs at 100 MB). */
#define SAFETENSORS_WRITE_MAX_HEADER_BYTES (64u << 20)

struct safetensors_entry {
    char name[SAFETENSORS_WRITE_NAME_MAX];
    enum dtype dtype;
    int ndim;
    int64_t shape[SAFETENSORS_WRITE_MAX_DIMS];
};

struct safetensors_writer;

/* Bytes of one tensor's data (product of the shape times the element size). */
uint64_t safetensors_entry_bytes(const struct safetensors_entry *e);

/* Creates "<path>.tmp", writes the header for count entries and returns the writer in *out.
 * The entries are copied; the caller keeps its array. Errors: PAGODA_EINVAL (no entries, too
 * many, a bad name, dtype or shape, a duplicate name), PAGODA_ERANGE (header too large),
 * PAGODA_ENOMEM, PAGODA_EIO and the other codes of creating a file; each with a detail. */
int safetensors_writer_open(const char *path, const struct safetensors_entry *entries, size_t count,
                            struct safetensors_writer **out);

/* Appends bytes of tensor data; the tensors' bytes come in entry order, in any chunking.
 * Errors: PAGODA_ERANGE (more bytes than the entries describe), PAGODA_EIO. After an error the
 * writer can only be aborted. */
int safetensors_writer_write(struct safetensors_writer *w, const void *data, size_t bytes);

/* Checks that every byte arrived, flushes, syncs and closes the file and renames it to path;
 * frees w in every case (on error the temporary file is removed). Errors: PAGODA_EINVAL (bytes
 * missing), PAGODA_EIO. */
int safetensors_writer_commit(struct safetensors_writer *w);

/* Closes and removes the temporary file and frees w. Accepts NULL. */
void safetensors_writer_abort(struct safetensors_writer *w);

#endif
