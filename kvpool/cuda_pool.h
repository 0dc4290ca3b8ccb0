/* The GPU KV pool: KV memory on one CUDA device, allocated by pagoda-kvpool with the CUDA VMM
 * API and mapped by every worker of the pool.
 *
 * Export side (the kvpool process): kv_cuda_pool_create allocates the pool as one or several
 * chunks (cuMemCreate, POSIX file descriptor handles, the device's recommended granularity, 2
 * MiB on an H200), maps them at one device address, zeroes them and exports each chunk as a
 * file descriptor; kv_cuda_server_open then hands those descriptors to whoever asks on a Unix
 * socket. Import side (a worker): kv_cuda_pool_import asks that socket, receives the
 * descriptors (SCM_RIGHTS) and maps them (cuMemImportFromShareableHandle, cuMemAddressReserve,
 * cuMemMap, cuMemSetAccess) at a device address of its own. A worker that restarts imports
 * again and finds the KV its predecessor wrote: a VMM allocation lives while any process holds
 * a handle to it, a mapping of it or an exported descriptor of it, whoever exported it (GPU.md:
 * measured on the H200; a descriptor alone: tests/gpu/test_cuda_pool.c).
 *
 * Same shape as kvpool/shm_pool.h: a pool is created or opened against a geometry (checked
 * field by field), and gives its geometry, the base address of the KV data (a device address
 * here) and layer views; closing only unmaps. The memory goes back to the device when the last
 * process that maps it or holds a descriptor of it has closed it (or exited).
 *
 * The socket protocol (SOCK_SEQPACKET, one exchange per connection, host byte order: a pool
 * never leaves its machine): the importer sends a request {magic, version, worker id, the pool
 * id it expects}; the server answers {magic, version, error code, number of chunks, pool id,
 * data bytes, chunk bytes, mapped bytes, the device's UUID, the exporter's device ordinal, a
 * message} with one descriptor per chunk attached, each a fresh dup() made for this importer
 * (so no two importers share a descriptor, and the server's own stay untouched). The server accepts
 * only peers of its own user (SO_PEERCRED), and bounds every wait on a peer
 * (KV_CUDA_IO_TIMEOUT_MS). The device is found again in the importer by its UUID, so the two
 * processes may number their devices differently (CUDA_VISIBLE_DEVICES).
 *
 * CUDA: driver entry points are looked up through the CUDA runtime (linked statically), not
 * linked against libcuda, so that programs built with CUDA still start on machines without a
 * driver (there every call here fails with PAGODA_ECUDA: "no CUDA device"). Every driver call
 * is checked and its failure is reported with the call, its arguments and cuGetErrorString.
 * Functions are called from one thread at a time per pool; the server runs on its own thread
 * and touches only descriptors, never CUDA. */
#ifndef PAGODA_KVPOOL_CUDA_POOL_H
#define PAGODA_KVPOOL_CUDA_POOL_H

#include "kvpool/geometry.h"

#include <stddef.h>
#include <stdint.h>

/* At most this many chunks (descriptors in one SCM_RIGHTS message; the kernel allows 253). */
#define KV_CUDA_MAX_CHUNKS 128
/* The largest chunk by default; a pool larger than KV_CUDA_MAX_CHUNKS of them uses larger
 * chunks. */
#define KV_CUDA_CHUNK_BYTES_DEFAULT (UINT64_C(2) << 30)
/* How long an importer waits on the server's send or receive, and the server on a peer's:
 * shorter, since the server serves one peer at a time, so that a silent peer cannot make the
 * importers queued behind it run out of time (and stop holds a shutdown up no longer). */
#define KV_CUDA_IO_TIMEOUT_MS 2000
#define KV_CUDA_SERVER_IO_TIMEOUT_MS 300

struct kv_cuda_pool;

struct kv_cuda_pool_options {
    int device;               /* the CUDA device ordinal, in this process's numbering */
    uint64_t max_chunk_bytes; /* 0: KV_CUDA_CHUNK_BYTES_DEFAULT; rounded up to the granularity */
};

/* The number of CUDA devices this process sees: 0 when there is no driver or no device. */
int kv_cuda_device_count(void);

/* Free and total memory of device (cudaMemGetInfo, after making the device's primary context
 * current on the calling thread, which the measure then includes). Errors: PAGODA_ECUDA. */
int kv_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes);

/* Export side. Allocates a zeroed pool of geometry g (any dtype) on opt->device and
 * exports its chunks. On success *out is the caller's, released with kv_cuda_pool_close (the
 * memory then stays as long as an importer maps it). Errors: PAGODA_EINVAL (NULL argument),
 * PAGODA_ERANGE (invalid geometry), PAGODA_EEXHAUSTED (the device has not enough free memory:
 * the detail says how much was asked and how much is free), PAGODA_EUNSUPPORTED (a device
 * without VMM or POSIX file descriptor handles), PAGODA_ECUDA (any other failed CUDA call, or no
 * device), PAGODA_ENOMEM. */
int kv_cuda_pool_create(const struct kv_geometry *g, const struct kv_cuda_pool_options *opt,
                        struct kv_cuda_pool **out);

/* Import side. Connects to the kvpool's socket (retrying while it does not exist yet or
 * refuses connections, for up to wait_ms), asks for the pool with the geometry expected
 * (pool id included; worker_id identifies the caller in kvpool's log, -1: none), and maps it on
 * the device with the exporter's UUID. On success *out is the caller's, released with
 * kv_cuda_pool_close. Errors: PAGODA_EINVAL, PAGODA_ETIMEDOUT (no kvpool answered in time),
 * PAGODA_EPROTO (a malformed answer), PAGODA_EMISMATCH (another pool id or size than expected),
 * PAGODA_ENOENT (no device of this process has the pool's UUID), PAGODA_ECUDA, PAGODA_EIO,
 * PAGODA_ENOMEM, or the error the kvpool answered. */
int kv_cuda_pool_import(const char *socket_path, int64_t worker_id,
                        const struct kv_geometry *expected, int wait_ms, struct kv_cuda_pool **out);

/* Kept across kvpool's restarts. A GPU pool is alive while any process holds a descriptor of
 * it, so a kvpool killed with SIGKILL leaves it to whoever holds one: the worker that maps it,
 * and the supervisor's keeper (deploy/keeper.h), to which kvpool deposits its descriptors on a
 * socket the supervisor gives it. The kvpool the supervisor starts next takes them back as an
 * offer and adopts the pool (its identity, its memory and the KV in it: nothing is zeroed), as a
 * CPU kvpool re-adopts its shared memory by name; without an offer it creates a new pool.
 *
 * kv_cuda_pool_deposit sends the pool's descriptors with its identity, layout, device and
 * geometry as one message on sock (SOCK_SEQPACKET, without blocking); the descriptors stay the
 * pool's. */
int kv_cuda_pool_deposit(const struct kv_cuda_pool *pool, int sock);

struct kv_cuda_offer;

/* Takes what a keeper offers on sock, without waiting: 0 with *out NULL when nothing is offered,
 * 0 with an offer (checked for form: its geometry valid, its layout whole, a descriptor per
 * chunk), or a PAGODA_E* code for a malformed one (its descriptors closed). */
int kv_cuda_offer_take(int sock, struct kv_cuda_offer **out);

/* The offered pool's geometry, its identity (pool_id) included. */
const struct kv_geometry *kv_cuda_offer_geometry(const struct kv_cuda_offer *offer);

/* Adopts the offered pool when it has want's geometry (pool_id aside) and lies on opt's device:
 * imports and maps its chunks, and keeps its descriptors to hand to workers, as a created pool
 * does (kv_cuda_server_open). The pool keeps the offer's pool_id. PAGODA_EMISMATCH, giving both
 * geometries or both devices, when it is another pool; a failed import or mapping is the driver's
 * error. On any failure the offer's descriptors stay the offer's. */
int kv_cuda_pool_adopt(struct kv_cuda_offer *offer, const struct kv_geometry *want,
                       const struct kv_cuda_pool_options *opt, struct kv_cuda_pool **out);

/* Closes the offer's descriptors (those not adopted) and frees it. Accepts NULL. */
void kv_cuda_offer_free(struct kv_cuda_offer *offer);

/* Unmaps the pool and releases this process's handles (and, on the export side, its
 * descriptors). The memory returns to the device once no process maps it. Accepts NULL. The
 * caller makes sure no kernel still uses the pool (synchronize first). */
void kv_cuda_pool_close(struct kv_cuda_pool *pool);

/* The pool's geometry (a private copy). Valid until kv_cuda_pool_close. */
const struct kv_geometry *kv_cuda_pool_geometry(const struct kv_cuda_pool *pool);

/* The device address of the KV data (kv_pool_bytes(geometry) long, laid out as
 * kvpool/geometry.h says). Valid until kv_cuda_pool_close. */
void *kv_cuda_pool_data(const struct kv_cuda_pool *pool);

/* The device the pool is on, in this process's numbering. */
int kv_cuda_pool_device(const struct kv_cuda_pool *pool);

/* The UUID of the device the pool is on (16 bytes, the same in every process). */
const uint8_t *kv_cuda_pool_uuid(const struct kv_cuda_pool *pool);

/* Bytes mapped (the KV data rounded up to whole granules; every chunk but the last has one
 * size, the last holds the rest), and the number of chunks. */
uint64_t kv_cuda_pool_mapped_bytes(const struct kv_cuda_pool *pool);
int kv_cuda_pool_num_chunks(const struct kv_cuda_pool *pool);

/* Fills *out with the view of layer `layer`. Returns 0 or PAGODA_ERANGE. */
int kv_cuda_pool_layer_view(const struct kv_cuda_pool *pool, int32_t layer,
                            struct kv_layer_view *out);

struct kv_cuda_server;

/* Serves pool's descriptors on a Unix socket at socket_path (a leftover file there is removed
 * first: the caller has made sure that no other kvpool serves it) from a thread of its own,
 * until kv_cuda_server_close. The pool must be an exported one (kv_cuda_pool_create) and
 * outlive the server. On success *out is the caller's. Errors: PAGODA_EINVAL (an imported pool,
 * a path too long for a Unix socket), PAGODA_EIO (socket, bind, listen or the thread),
 * PAGODA_ENOMEM. */
int kv_cuda_server_open(struct kv_cuda_pool *pool, const char *socket_path,
                        struct kv_cuda_server **out);

/* Stops the thread, closes the socket and removes its file. Accepts NULL. */
void kv_cuda_server_close(struct kv_cuda_server *server);

/* Pools handed out, and requests refused, since the server opened (any thread). */
uint64_t kv_cuda_server_handouts(const struct kv_cuda_server *server);
uint64_t kv_cuda_server_refusals(const struct kv_cuda_server *server);

#endif
