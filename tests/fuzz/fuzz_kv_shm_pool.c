/* libFuzzer target: a leftover CPU pool segment that pagoda-kvpool re-adopts or a worker maps
 * (kvpool/shm_pool.h: kv_shm_pool_open reads and checks its header).
 *
 * The input is the segment: 4 bytes (little endian) give its size, at most FUZZ_SHM_MAX_BYTES,
 * and the rest is its contents from offset 0 (zeros after them). They are written into a
 * segment of this process's own name, mode 0600, which is opened. A segment is refused with an
 * error of the contract, or opened into a pool whose geometry validates, whose data and every
 * layer's K and V lie inside the segment (their first and last bytes are read and written),
 * that opens again when the same geometry is expected, and is refused (PAGODA_EMISMATCH) when
 * another pool id is.
 *
 * The segment is /dev/shm/pagoda-fuzz-shm-PID, removed when the process exits normally; a run that
 * crashes leaves it (4 bytes to 2 MiB) for `rm /dev/shm/pagoda-fuzz-shm-*`. */
#include "common/error.h"
#include "kvpool/shm_pool.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* The largest segment an input makes: room for the largest data offset the header may give
 * (1 MiB) and a small pool after it. */
#define FUZZ_SHM_MAX_BYTES (UINT32_C(2) << 20)

static char name[64];
static int fd = -1;

static void remove_segment(void)
{
    if (name[0] != '\0')
        shm_unlink(name);
}

static void setup(void)
{
    snprintf(name, sizeof(name), "/pagoda-fuzz-shm-%d", (int)getpid());
    shm_unlink(name); /* a leftover of an earlier process with this pid */
    fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0 || fchmod(fd, 0600) != 0) {
        perror("fuzz_kv_shm_pool: shm_open");
        abort();
    }
    atexit(remove_segment);
}

static void touch(volatile char *p)
{
    char c = *p;
    *p = c;
}

static void check(struct kv_shm_pool *pool, uint64_t size)
{
    const struct kv_geometry *g = kv_shm_pool_geometry(pool);
    if (kv_geometry_validate(g) != 0)
        abort();
    char *data = kv_shm_pool_data(pool);
    size_t bytes = kv_pool_bytes(g);
    if ((uintptr_t)data % KV_SHM_DATA_ALIGN != 0 || bytes == 0 || bytes > size)
        abort();
    touch(data);
    touch(data + bytes - 1);
    size_t esize = dtype_size(g->dtype);
    for (int32_t l = 0; l < g->num_layers; l++) {
        struct kv_layer_view v;
        if (kv_shm_pool_layer_view(pool, l, &v) != 0)
            abort();
        /* K (and V) of the last block: num_blocks - 1 strides on, then one head tile each. */
        size_t extent = ((size_t)(v.num_blocks - 1) * (size_t)v.block_stride +
                         (size_t)v.num_kv_heads * (size_t)v.head_stride) *
                        esize;
        char *k = v.k, *vv = v.v;
        if (extent == 0 || k < data || vv < data || k + extent > data + bytes ||
            vv + extent > data + bytes)
            abort();
        touch(k);
        touch(k + extent - 1);
        touch(vv);
        touch(vv + extent - 1);
    }
    struct kv_layer_view v;
    if (kv_shm_pool_layer_view(pool, g->num_layers, &v) != PAGODA_ERANGE)
        abort();

    struct kv_geometry want = *g;
    struct kv_shm_pool *again = NULL;
    if (kv_shm_pool_open(name, &want, &again) != 0 || again == NULL ||
        !kv_geometry_equal(kv_shm_pool_geometry(again), g))
        abort();
    kv_shm_pool_close(again);
    want.pool_id++;
    again = NULL;
    if (kv_shm_pool_open(name, &want, &again) != PAGODA_EMISMATCH || again != NULL)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (fd < 0)
        setup();
    if (size < 4)
        return 0;
    uint32_t seg = (uint32_t)data[0] | (uint32_t)data[1] << 8 | (uint32_t)data[2] << 16 |
                   (uint32_t)data[3] << 24;
    seg %= FUZZ_SHM_MAX_BYTES + 1;
    data += 4;
    size -= 4;
    if (ftruncate(fd, 0) != 0 || ftruncate(fd, (off_t)seg) != 0)
        abort();
    size_t n = size < seg ? size : seg;
    if (n > 0 && pwrite(fd, data, n, 0) != (ssize_t)n)
        abort();

    struct kv_shm_pool *pool = NULL;
    int rc = kv_shm_pool_open(name, NULL, &pool);
    if (rc == 0) {
        if (pool == NULL)
            abort();
        check(pool, seg);
        kv_shm_pool_close(pool);
    } else if (pool != NULL || (rc != PAGODA_EBUSY && rc != PAGODA_EFORMAT)) {
        abort();
    }
    return 0;
}
