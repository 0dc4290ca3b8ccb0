/* libFuzzer target: a safetensors file (model/safetensors.h), the bytes as the whole file.
 *
 * safetensors_open maps a path, so the bytes go into a memfd that is opened through /proc (no
 * file on disk). A file is refused with an error of the contract, or opened into tensors that
 * each lie inside the file, aligned to their dtype, with the byte count their shape says, that
 * do not overlap, and that are found again by name. */
#include "common/error.h"
#include "model/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static int memfd = -1;
static char path[64];

/* Tensors checked pairwise for overlaps (the module sorts; this is the slow, obvious check). */
#define MAX_PAIRWISE 256

static void check(const struct safetensors_file *f)
{
    size_t n = safetensors_count(f);
    for (size_t i = 0; i < n; i++) {
        const struct safetensors_tensor *t = safetensors_tensor_at(f, i);
        const struct safetensors_tensor *found = NULL;
        if (t == NULL || safetensors_find(f, t->name, &found) != 0 || found != t)
            abort();
        if (t->ndim < 0 || t->ndim > SAFETENSORS_MAX_DIMS)
            abort();
        size_t elems = 1;
        for (int d = 0; d < t->ndim; d++) {
            if (t->shape[d] < 0)
                abort();
            elems *= (size_t)t->shape[d];
        }
        size_t esize = dtype_size(t->dtype);
        if (esize == 0 || elems * esize != t->nbytes || (uintptr_t)t->data % esize != 0)
            abort();
        /* Every byte of it is readable (ASan has no view of the mapping; a read past it
         * faults). */
        uint8_t sum = 0;
        for (size_t b = 0; b < t->nbytes; b++)
            sum += ((const volatile uint8_t *)t->data)[b];
        (void)sum;
    }
    if (safetensors_tensor_at(f, n) != NULL)
        abort();
    for (size_t i = 0; i < n && n <= MAX_PAIRWISE; i++) {
        const struct safetensors_tensor *a = safetensors_tensor_at(f, i);
        const uint8_t *a0 = a->data, *a1 = a0 + a->nbytes;
        for (size_t j = i + 1; j < n; j++) {
            const struct safetensors_tensor *b = safetensors_tensor_at(f, j);
            const uint8_t *b0 = b->data, *b1 = b0 + b->nbytes;
            if (a->nbytes > 0 && b->nbytes > 0 && a0 < b1 && b0 < a1)
                abort();
        }
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (memfd < 0) {
        memfd = memfd_create("fuzz-safetensors", MFD_CLOEXEC);
        if (memfd < 0)
            abort();
        snprintf(path, sizeof(path), "/proc/self/fd/%d", memfd);
    }
    if (ftruncate(memfd, 0) != 0 || ftruncate(memfd, (off_t)size) != 0 ||
        (size > 0 && pwrite(memfd, data, size, 0) != (ssize_t)size))
        abort();
    struct safetensors_file *f = NULL;
    int rc = safetensors_open(path, &f);
    if (rc == 0) {
        check(f);
        safetensors_close(f);
    } else if (f != NULL || (rc != PAGODA_EFORMAT && rc != PAGODA_ERANGE &&
                             rc != PAGODA_EUNSUPPORTED && rc != PAGODA_ENOMEM)) {
        abort();
    }
    return 0;
}
