#include "kvpool/shm_pool.h"
#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Where the data starts: the header rounded up to KV_SHM_DATA_ALIGN, one page, so that the
 * data is page-aligned (as cudaHostRegister and huge-page mappings want). An opener accepts any
 * aligned offset past the header up to KV_SHM_DATA_OFFSET_MAX, a bound on a value it reads
 * from shared memory. */
#define KV_SHM_DATA_OFFSET ((uint64_t)KV_SHM_DATA_ALIGN)
#define KV_SHM_DATA_OFFSET_MAX (UINT64_C(1) << 20)

/* posix_fallocate on a large pool can be interrupted by a signal; it is retried this often. */
#define KV_SHM_EINTR_RETRIES 16

_Static_assert(sizeof(struct kv_shm_header) <= KV_SHM_DATA_ALIGN, "header fits one page");
_Static_assert(sizeof(size_t) >= 8 && sizeof(off_t) >= 8, "pools up to 2^62 bytes need 64 bits");
_Static_assert(sizeof(_Atomic uint32_t) == sizeof(uint32_t) && ATOMIC_INT_LOCK_FREE == 2,
               "the ready flag is shared between processes, so it must be lock-free");

struct kv_shm_pool {
    char name[KV_SHM_NAME_MAX + 1];
    struct kv_geometry geometry;
    void *map; /* the whole segment, header included */
    size_t map_bytes;
    void *data;
};

/* shm_open's names are file names under /dev/shm: one leading '/', then a portable set of
 * characters, so that a name cannot reach another directory or be mistaken for an option. */
static int check_name(const char *name)
{
    if (name == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "kv pool name: NULL");
    size_t len = strnlen(name, KV_SHM_NAME_MAX + 1);
    if (len > KV_SHM_NAME_MAX)
        return pagoda_error_set(PAGODA_EINVAL, "kv pool name %.*s...: longer than %d bytes",
                                KV_SHM_NAME_MAX, name, KV_SHM_NAME_MAX);
    if (len < 2 || name[0] != '/')
        return pagoda_error_set(PAGODA_EINVAL,
                                "kv pool name \"%s\": must be '/' followed by a name", name);
    if (strcmp(name, "/.") == 0 || strcmp(name, "/..") == 0)
        return pagoda_error_set(PAGODA_EINVAL, "kv pool name \"%s\": not a file name", name);
    for (size_t i = 1; i < len; i++) {
        char c = name[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        if (!ok)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "kv pool name \"%s\": character %zu is not one of "
                                    "[A-Za-z0-9._-]",
                                    name, i);
    }
    return 0;
}

static int errno_error(const char *name, const char *what)
{
    int e = errno;
    return pagoda_error_set(pagoda_from_errno(e), "kv pool %s: %s: %s", name, what, strerror(e));
}

/* The segment is new (O_EXCL), so ftruncate and posix_fallocate hand back zeroed memory; the
 * reservation makes a pool larger than the shared memory file system fail here with ENOSPC
 * instead of raising SIGBUS when a kernel first touches a block. ready is stored last. */
int kv_shm_pool_create(const char *name, const struct kv_geometry *g, struct kv_shm_pool **out)
{
    if (out == NULL || g == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "kv_shm_pool_create: NULL argument");
    *out = NULL;
    int rc = check_name(name);
    if (rc != 0)
        return rc;
    rc = kv_geometry_validate(g);
    if (rc != 0)
        return rc;

    uint64_t data_bytes = kv_pool_bytes(g);
    uint64_t total_bytes = KV_SHM_DATA_OFFSET + data_bytes;
    struct kv_shm_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "kv pool %s: out of memory", name);

    int fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            rc = pagoda_error_set(PAGODA_EEXIST, "kv pool %s: the name already exists", name);
        else
            rc = errno_error(name, "shm_open");
        free(p);
        return rc;
    }
    p->map = MAP_FAILED;
    if (ftruncate(fd, (off_t)total_bytes) != 0) {
        rc = errno_error(name, "ftruncate");
        goto fail;
    }
    int err = EINTR;
    for (int i = 0; i < KV_SHM_EINTR_RETRIES && err == EINTR; i++)
        err = posix_fallocate(fd, 0, (off_t)total_bytes);
    if (err == ENOSPC) {
        rc = pagoda_error_set(PAGODA_EEXHAUSTED,
                              "kv pool %s: cannot reserve %" PRIu64
                              " bytes of shared memory (/dev/shm is too small or full)",
                              name, total_bytes);
        goto fail;
    }
    if (err != 0) {
        errno = err;
        rc = errno_error(name, "posix_fallocate");
        goto fail;
    }
    p->map = mmap(NULL, (size_t)total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p->map == MAP_FAILED) {
        rc = errno_error(name, "mmap");
        goto fail;
    }
    close(fd);
    fd = -1;

    struct kv_shm_header *h = p->map;
    h->magic = KV_SHM_MAGIC;
    h->layout_version = KV_SHM_LAYOUT_VERSION;
    h->header_bytes = (uint32_t)sizeof(*h);
    h->data_offset = KV_SHM_DATA_OFFSET;
    h->data_bytes = data_bytes;
    h->total_bytes = total_bytes;
    h->pool_id = g->pool_id;
    h->num_layers = g->num_layers;
    h->num_blocks = g->num_blocks;
    h->block_size = g->block_size;
    h->num_kv_heads = g->num_kv_heads;
    h->head_dim = g->head_dim;
    h->dtype = (int32_t)g->dtype;
    atomic_store_explicit(&h->ready, KV_SHM_READY, memory_order_release);

    memcpy(p->name, name, strlen(name) + 1);
    p->geometry = *g;
    p->map_bytes = (size_t)total_bytes;
    p->data = (char *)p->map + KV_SHM_DATA_OFFSET;
    *out = p;
    return 0;

fail:
    if (p->map != MAP_FAILED)
        munmap(p->map, (size_t)total_bytes);
    if (fd >= 0)
        close(fd);
    shm_unlink(name);
    free(p);
    return rc;
}

/* Reads the header of a mapped segment of size bytes into *g and *data_offset, trusting nothing
 * until ready is seen with acquire order. A segment whose ready flag and magic are both still
 * zero is taken for one its creator is setting up (PAGODA_EBUSY); anything else that is off is
 * not a pool. The fields are checked on a private copy, so that another process that scribbles
 * on the header cannot change a value between its check and its use. */
static int read_header(const char *name, const void *map, uint64_t size, struct kv_geometry *g,
                       uint64_t *data_offset)
{
    const struct kv_shm_header *shared = map;
    uint32_t ready = atomic_load_explicit(&shared->ready, memory_order_acquire);
    struct kv_shm_header copy;
    memcpy(&copy, shared, sizeof(copy));
    const struct kv_shm_header *h = &copy;
    if (ready != KV_SHM_READY) {
        if (ready == 0 && (h->magic == 0 || h->magic == KV_SHM_MAGIC))
            return pagoda_error_set(PAGODA_EBUSY,
                                    "kv pool %s: not ready (its creator has not finished "
                                    "setting it up)",
                                    name);
        return pagoda_error_set(PAGODA_EFORMAT,
                                "kv pool %s: not a kv pool (ready flag 0x%08" PRIx32
                                ", magic 0x%016" PRIx64 ")",
                                name, ready, h->magic);
    }
    if (h->magic != KV_SHM_MAGIC)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "kv pool %s: not a kv pool (magic 0x%016" PRIx64
                                ", expected 0x%016" PRIx64 ")",
                                name, h->magic, KV_SHM_MAGIC);
    if (h->layout_version != KV_SHM_LAYOUT_VERSION)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "kv pool %s: layout version %" PRIu32 ", expected %u", name,
                                h->layout_version, KV_SHM_LAYOUT_VERSION);
    if (h->header_bytes != sizeof(*h))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "kv pool %s: header_bytes %" PRIu32 ", expected %zu", name,
                                h->header_bytes, sizeof(*h));

    g->pool_id = h->pool_id;
    g->num_layers = h->num_layers;
    g->num_blocks = h->num_blocks;
    g->block_size = h->block_size;
    g->num_kv_heads = h->num_kv_heads;
    g->head_dim = h->head_dim;
    g->dtype = (enum dtype)h->dtype;
    if (kv_geometry_validate(g) != 0) {
        char why[512];
        snprintf(why, sizeof(why), "%s", pagoda_error_detail());
        return pagoda_error_set(PAGODA_EFORMAT, "kv pool %s: invalid header: %s", name, why);
    }
    if (h->data_offset < h->header_bytes || h->data_offset > KV_SHM_DATA_OFFSET_MAX ||
        h->data_offset % KV_SHM_DATA_ALIGN != 0)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "kv pool %s: data_offset %" PRIu64
                                " is not a multiple of %u between the header and %" PRIu64,
                                name, h->data_offset, KV_SHM_DATA_ALIGN, KV_SHM_DATA_OFFSET_MAX);
    if (h->data_bytes != kv_pool_bytes(g))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "kv pool %s: data_bytes %" PRIu64 ", the geometry needs %zu", name,
                                h->data_bytes, kv_pool_bytes(g));
    if (h->total_bytes != h->data_offset + h->data_bytes)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "kv pool %s: total_bytes %" PRIu64 ", expected %" PRIu64, name,
                                h->total_bytes, h->data_offset + h->data_bytes);
    if (size < h->total_bytes)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "kv pool %s: truncated (%" PRIu64 " bytes, the header says %" PRIu64
                                ")",
                                name, size, h->total_bytes);
    if (size > h->total_bytes)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "kv pool %s: %" PRIu64 " bytes, the header says %" PRIu64, name,
                                size, h->total_bytes);
    *data_offset = h->data_offset;
    return 0;
}

static int field_mismatch(const char *name, const char *field, int32_t have, int32_t want)
{
    return pagoda_error_set(PAGODA_EMISMATCH, "kv pool %s: %s %d, expected %d", name, field, have,
                            want);
}

/* Names the first field in which the pool's geometry differs from the expected one. */
static int compare_geometry(const char *name, const struct kv_geometry *have,
                            const struct kv_geometry *want)
{
    if (have->pool_id != want->pool_id)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "kv pool %s: pool_id %" PRIu64 ", expected %" PRIu64, name,
                                have->pool_id, want->pool_id);
    if (have->num_layers != want->num_layers)
        return field_mismatch(name, "num_layers", have->num_layers, want->num_layers);
    if (have->num_blocks != want->num_blocks)
        return field_mismatch(name, "num_blocks", have->num_blocks, want->num_blocks);
    if (have->block_size != want->block_size)
        return field_mismatch(name, "block_size", have->block_size, want->block_size);
    if (have->num_kv_heads != want->num_kv_heads)
        return field_mismatch(name, "num_kv_heads", have->num_kv_heads, want->num_kv_heads);
    if (have->head_dim != want->head_dim)
        return field_mismatch(name, "head_dim", have->head_dim, want->head_dim);
    if (have->dtype != want->dtype)
        return pagoda_error_set(PAGODA_EMISMATCH, "kv pool %s: dtype %s, expected %s", name,
                                dtype_name(have->dtype), dtype_name(want->dtype));
    return 0;
}

/* The whole segment is mapped at once (mapping is lazy, so its size costs nothing until
 * touched) and validated before the handle is handed out. */
int kv_shm_pool_open(const char *name, const struct kv_geometry *expected, struct kv_shm_pool **out)
{
    if (out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "kv_shm_pool_open: NULL argument");
    *out = NULL;
    int rc = check_name(name);
    if (rc != 0)
        return rc;
    struct kv_shm_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "kv pool %s: out of memory", name);
    p->map = MAP_FAILED;

    int fd = shm_open(name, O_RDWR | O_CLOEXEC, 0);
    if (fd < 0) {
        if (errno == ENOENT)
            rc = pagoda_error_set(PAGODA_ENOENT, "kv pool %s: no such pool", name);
        else
            rc = errno_error(name, "shm_open");
        goto fail;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        rc = errno_error(name, "fstat");
        goto fail;
    }
    /* The name is predictable and /dev/shm is writable by everyone: a segment another user made
     * (or may read or write) is not ours, whatever its header says. Adopting it would let that
     * user read every tenant's K/V or change the answers. Pools are created 0600. */
    if (st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
        rc = pagoda_error_set(PAGODA_EPERM,
                              "kv pool %s: owned by uid %u with mode %03o: a pool must belong to "
                              "this user (uid %u) with no access for others; refusing it",
                              name, (unsigned)st.st_uid, (unsigned)(st.st_mode & 0777),
                              (unsigned)geteuid());
        goto fail;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size == 0) {
        rc = pagoda_error_set(PAGODA_EBUSY,
                              "kv pool %s: not ready (empty segment; its creator has not "
                              "sized it yet)",
                              name);
        goto fail;
    }
    if (size < sizeof(struct kv_shm_header)) {
        rc = pagoda_error_set(PAGODA_EFORMAT,
                              "kv pool %s: truncated (%" PRIu64 " bytes, a header is %zu)", name,
                              size, sizeof(struct kv_shm_header));
        goto fail;
    }
    p->map = mmap(NULL, (size_t)size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p->map == MAP_FAILED) {
        rc = errno_error(name, "mmap");
        goto fail;
    }
    p->map_bytes = (size_t)size;
    close(fd);
    fd = -1;

    uint64_t data_offset = 0;
    rc = read_header(name, p->map, size, &p->geometry, &data_offset);
    if (rc == 0 && expected != NULL)
        rc = compare_geometry(name, &p->geometry, expected);
    if (rc != 0)
        goto fail;
    memcpy(p->name, name, strlen(name) + 1);
    p->data = (char *)p->map + data_offset;
    *out = p;
    return 0;

fail:
    if (p->map != MAP_FAILED)
        munmap(p->map, p->map_bytes);
    if (fd >= 0)
        close(fd);
    free(p);
    return rc;
}

void kv_shm_pool_close(struct kv_shm_pool *pool)
{
    if (pool == NULL)
        return;
    munmap(pool->map, pool->map_bytes);
    free(pool);
}

int kv_shm_pool_unlink(const char *name)
{
    int rc = check_name(name);
    if (rc != 0)
        return rc;
    if (shm_unlink(name) != 0) {
        if (errno == ENOENT)
            return pagoda_error_set(PAGODA_ENOENT, "kv pool %s: no such pool", name);
        return errno_error(name, "shm_unlink");
    }
    return 0;
}

const struct kv_geometry *kv_shm_pool_geometry(const struct kv_shm_pool *pool)
{
    return &pool->geometry;
}

const char *kv_shm_pool_name(const struct kv_shm_pool *pool)
{
    return pool->name;
}

void *kv_shm_pool_data(const struct kv_shm_pool *pool)
{
    return pool->data;
}

int kv_shm_pool_layer_view(const struct kv_shm_pool *pool, int32_t layer, struct kv_layer_view *out)
{
    if (layer < 0 || layer >= pool->geometry.num_layers)
        return pagoda_error_set(PAGODA_ERANGE, "kv pool %s: layer %d, the pool has %d", pool->name,
                                layer, pool->geometry.num_layers);
    *out = kv_layer_view_make(&pool->geometry, pool->data, layer);
    return 0;
}
