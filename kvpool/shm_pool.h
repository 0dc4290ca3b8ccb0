/* The CPU KV pool: KV memory in a POSIX shared memory segment that several processes map.
 *
 * The kvpool process creates the pool under a name (kv_shm_pool_create); workers map it by the
 * same name (kv_shm_pool_open) and read or write KV data through layer views. Closing a pool
 * only unmaps it: the segment and its contents outlive every process that mapped it, so a
 * restarted worker finds its KV memory where it left it. Only kv_shm_pool_unlink removes the
 * name, and the memory goes away when the last mapping does.
 *
 * Import/export shape: what a worker needs to map a pool is a descriptor, the pool's name plus
 * the geometry it expects (kv_shm_pool_open checks one against the other). The GPU pool will
 * keep that shape: its descriptor is the geometry plus the VMM allocation's file descriptor
 * (sent over a Unix socket with SCM_RIGHTS instead of named), and its open maps the allocation
 * and checks the geometry the same way. Callers that hold "a descriptor" and "a pool with a
 * geometry, a base pointer and layer views" need not know which kind they have.
 *
 * Access: the segment is created with mode 0600 (the creating user only). Pools are sized up
 * front with posix_fallocate, so a pool larger than /dev/shm is refused at creation instead of
 * raising SIGBUS on first touch. Functions are safe to call from any thread; a pool handle is
 * not shared between threads without the caller's own locking (the KV data itself is the
 * scheduler's business: it decides which block belongs to whom). */
#ifndef PAGODA_KVPOOL_SHM_POOL_H
#define PAGODA_KVPOOL_SHM_POOL_H

#include "kvpool/geometry.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Longest accepted name, including the leading '/' (not the terminating NUL). Names are '/'
 * followed by 1 to KV_SHM_NAME_MAX - 1 characters from [A-Za-z0-9._-], and not "/." or "/..". */
#define KV_SHM_NAME_MAX 64

/* The segment format. A segment is a kv_shm_header at offset 0, then the KV data at
 * data_offset (a multiple of KV_SHM_DATA_ALIGN) in the layout of kvpool/geometry.h. The creator
 * writes every field, then stores ready = KV_SHM_READY with release order; an opener loads
 * ready with acquire order before it trusts any other field. Fields are fixed width in host
 * byte order (a pool never leaves its machine). The header is shown here for tools and tests;
 * everything else goes through the functions below. A change to it changes
 * KV_SHM_LAYOUT_VERSION. */
#define KV_SHM_MAGIC UINT64_C(0x4c4f4f50564b4750) /* "PGKVPOOL" in memory order */
#define KV_SHM_LAYOUT_VERSION 1u
#define KV_SHM_READY UINT32_C(0x59444552) /* "REDY" in memory order */
#define KV_SHM_DATA_ALIGN 4096u

struct kv_shm_header {
    uint64_t magic;
    uint32_t layout_version;
    uint32_t header_bytes; /* sizeof(struct kv_shm_header) */
    uint64_t data_offset;
    uint64_t data_bytes;  /* kv_pool_bytes(geometry) */
    uint64_t total_bytes; /* data_offset + data_bytes: the segment's size */
    uint64_t pool_id;
    int32_t num_layers;
    int32_t num_blocks;
    int32_t block_size;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t dtype;
    _Atomic uint32_t ready; /* KV_SHM_READY once the pool may be opened */
    uint32_t reserved;
};

struct kv_shm_pool;

/* Creates the pool `name` with geometry g: a new segment (never an existing one), sized and
 * zero-filled, with its header written and marked ready. On success *out is the caller's pool,
 * to be released with kv_shm_pool_close; the name stays until kv_shm_pool_unlink. On failure
 * nothing is left behind under the name. Errors: PAGODA_EINVAL (bad name or NULL argument),
 * PAGODA_ERANGE (invalid geometry), PAGODA_EEXIST (the name exists), PAGODA_EEXHAUSTED (not
 * enough shared memory), PAGODA_EPERM, PAGODA_ENOMEM, PAGODA_EIO; each with a detail. */
int kv_shm_pool_create(const char *name, const struct kv_geometry *g, struct kv_shm_pool **out);

/* Maps the existing pool `name` for reading and writing. With expected non-NULL, the pool's
 * geometry must equal it field by field (pool id included); with NULL any valid geometry is
 * accepted and kv_shm_pool_geometry tells which. On success *out is the caller's pool, to be
 * released with kv_shm_pool_close. Errors: PAGODA_EINVAL (bad name or NULL out), PAGODA_ENOENT
 * (no such name), PAGODA_EBUSY (the creator has not finished: an empty segment or one not yet
 * marked ready; retrying later may succeed), PAGODA_EFORMAT (not a kv pool: wrong magic,
 * layout version or header, an invalid geometry, or a segment whose size differs from what its
 * header says), PAGODA_EMISMATCH (the geometry differs from expected; the detail names the
 * first field that differs, e.g. "kv pool /x: block_size 16, expected 32"), PAGODA_EPERM,
 * PAGODA_ENOMEM, PAGODA_EIO. */
int kv_shm_pool_open(const char *name, const struct kv_geometry *expected,
                     struct kv_shm_pool **out);

/* Unmaps the pool and frees the handle; the segment and its name stay. Accepts NULL. Views
 * and pointers obtained from the pool are invalid afterwards. */
void kv_shm_pool_close(struct kv_shm_pool *pool);

/* Removes the name `name`; processes that have the pool mapped keep their mapping, and the
 * memory is released when the last one closes. Meant for the pool's owner (the kvpool process,
 * or the supervisor cleaning up after it). Errors: PAGODA_EINVAL (bad name), PAGODA_ENOENT (no
 * such name), PAGODA_EPERM, PAGODA_EIO. */
int kv_shm_pool_unlink(const char *name);

/* The pool's geometry, as validated at create or open time (a private copy, not the shared
 * header). Owned by the pool; valid until kv_shm_pool_close. */
const struct kv_geometry *kv_shm_pool_geometry(const struct kv_shm_pool *pool);

/* The pool's name as given to create or open. Owned by the pool. */
const char *kv_shm_pool_name(const struct kv_shm_pool *pool);

/* The start of the KV data (KV_SHM_DATA_ALIGN-aligned, kv_pool_bytes(geometry) long, laid out
 * as kvpool/geometry.h says). Valid until kv_shm_pool_close. */
void *kv_shm_pool_data(const struct kv_shm_pool *pool);

/* Fills *out with the view of layer `layer` (kv_layer_view_make on the pool's data). Returns
 * 0 or PAGODA_ERANGE when layer is outside 0..num_layers-1. */
int kv_shm_pool_layer_view(const struct kv_shm_pool *pool, int32_t layer,
                           struct kv_layer_view *out);

#endif
