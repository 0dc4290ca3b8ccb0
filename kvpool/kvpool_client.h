/* Asking pagoda-kvpool for its pool: the one request every process that uses the pool makes at
 * start (the scheduler for the geometry, a worker also for the shared-memory name to map). */
#ifndef PAGODA_KVPOOL_KVPOOL_CLIENT_H
#define PAGODA_KVPOOL_KVPOOL_CLIENT_H

#include "kvpool/geometry.h"

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* Asks the kvpool of run_dir (REQ to ipc://RUN_DIR/kvpool.ipc) for its geometry, retrying for
 * up to wait_ms while kvpool starts (or answers that it is not ready). worker_id identifies the
 * caller in kvpool's log (-1: not a worker). When shm_name is not NULL it receives the pool's
 * shared-memory name (len bytes at most). stop, when not NULL, ends the wait early once it is
 * set (a signal handler's flag). Returns 0 with *g validated, or PAGODA_ETIMEDOUT, PAGODA_EPROTO
 * (a malformed or incomplete answer), PAGODA_ECLOSED (stopped), or kvpool's own error. */
int kvpool_fetch_geometry(const char *run_dir, int64_t worker_id, int wait_ms,
                          const volatile sig_atomic_t *stop, struct kv_geometry *g, char *shm_name,
                          size_t len);

#endif
