/* Asking pagoda-kvpool for its pool: the one request every process that uses the pool makes at
 * start (the scheduler for the geometry, a worker also for the shared-memory name to map). */
#ifndef PAGODA_KVPOOL_KVPOOL_CLIENT_H
#define PAGODA_KVPOOL_KVPOOL_CLIENT_H

#include "kvpool/geometry.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* What kvpool says about its pool: the geometry, and where the pool is. A CPU pool has a
 * shared-memory name (device -1, no socket); a GPU pool has a device and the Unix socket that
 * hands out its descriptors (kvpool/cuda_pool.h), and no shared-memory name. */
#define KVPOOL_NAME_MAX 128
#define KVPOOL_SOCKET_MAX 108

struct kvpool_info {
    struct kv_geometry geometry;
    char shm_name[KVPOOL_NAME_MAX];        /* "" for a GPU pool */
    int32_t device;                        /* -1 for a CPU pool; kvpool's ordinal otherwise */
    char handle_socket[KVPOOL_SOCKET_MAX]; /* "" for a CPU pool */
};

/* Asks the kvpool of run_dir for its pool, as kvpool_fetch_geometry does. Returns 0 with *out
 * filled (the geometry validated, exactly one of shm_name and handle_socket set), or the errors
 * of kvpool_fetch_geometry (PAGODA_EPROTO also for a name or path that does not fit). */
int kvpool_fetch_pool(const char *run_dir, int64_t worker_id, int wait_ms,
                      const volatile sig_atomic_t *stop, struct kvpool_info *out);

/* Asks the kvpool of run_dir (REQ to ipc://RUN_DIR/kvpool.ipc) for its geometry, retrying for
 * up to wait_ms while kvpool starts (or answers that it is not ready). worker_id identifies the
 * caller in kvpool's log (-1: not a worker). When shm_name is not NULL it receives the pool's
 * shared-memory name (len bytes at most). stop, when not NULL, ends the wait early once it is
 * set (a signal handler's flag). Returns 0 with *g validated, or PAGODA_ETIMEDOUT, PAGODA_EPROTO
 * (a malformed or incomplete answer), PAGODA_ECLOSED (stopped), or kvpool's own error. */
int kvpool_fetch_geometry(const char *run_dir, int64_t worker_id, int wait_ms,
                          const volatile sig_atomic_t *stop, struct kv_geometry *g, char *shm_name,
                          size_t len);

/* kvpool_fetch_pool and kvpool_fetch_geometry for a kvpool that answers at url (its --listen;
 * ipc:// or tcp://, the pool itself being on this host all the same) instead of the one of a
 * run directory. Same results. */
int kvpool_fetch_pool_at(const char *url, int64_t worker_id, int wait_ms,
                         const volatile sig_atomic_t *stop, struct kvpool_info *out);
int kvpool_fetch_geometry_at(const char *url, int64_t worker_id, int wait_ms,
                             const volatile sig_atomic_t *stop, struct kv_geometry *g,
                             char *shm_name, size_t len);

#endif
