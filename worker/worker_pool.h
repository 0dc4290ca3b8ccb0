/* The KV pool as a worker maps it: kvpool's pool (kvpool_fetch_pool's answer) mapped for the
 * backend the worker runs, and checked against the model before any weight is loaded.
 *
 * The pool is kvpool's: a worker maps it and never removes it, so a restarted worker finds the
 * KV its predecessor wrote. The CPU backend maps kvpool's shared-memory pool
 * (kvpool/shm_pool.h); the CUDA backend imports kvpool's GPU pool (kvpool/cuda_pool.h:
 * descriptors over kvpool's Unix socket, mapped on the pool's device, found by its UUID); the
 * null backend, which never touches KV memory, maps a CPU pool and leaves a GPU pool alone. */
#ifndef PAGODA_WORKER_WORKER_POOL_H
#define PAGODA_WORKER_WORKER_POOL_H

#include "kvpool/kvpool_client.h"
#include "model/model_config.h"

#include <stdint.h>

#define WORKER_POOL_WHERE_MAX 160

struct kv_shm_pool;
struct kv_cuda_pool;

/* The caller's storage; zero it (or let worker_pool_init fill it) before use. */
struct worker_pool {
    struct kvpool_info info;           /* what kvpool said: geometry, shm name or device, socket */
    char where[WORKER_POOL_WHERE_MAX]; /* the pool, for messages: its shm name or its GPU */
    struct kv_shm_pool *shm;           /* the CPU pool, when mapped */
    struct kv_cuda_pool *gpu;          /* the GPU pool, when mapped (CUDA builds only) */
};

/* Maps the pool that info describes for a worker of backend ("cpu", "cuda" or "null"):
 * worker_id names the worker to kvpool, and wait_ms bounds the wait for kvpool's descriptor
 * socket (GPU pools). p is filled (info copied, where set) even on failure; release it with
 * worker_pool_fini in every case. Errors: PAGODA_EMISMATCH for a pool of the wrong kind for
 * the backend (a GPU pool for the CPU backend, a CPU pool for the CUDA backend), or a
 * shared-memory pool that is not the one kvpool described (another pool id); the errors of
 * kv_shm_pool_open and kv_cuda_pool_import. *cannot_run is set to 1 when the failure is one that
 * a restart would repeat (the wrong kind of pool) and left alone otherwise. */
int worker_pool_init(struct worker_pool *p, const struct kvpool_info *info, const char *backend,
                     uint32_t worker_id, int wait_ms, int *cannot_run);

/* Unmaps what worker_pool_init mapped (the pool itself stays kvpool's) and clears the
 * handles. Accepts NULL and a zeroed or half-initialized p. */
void worker_pool_fini(struct worker_pool *p);

/* Whether backend reads a pool of dtype t: "cuda" BF16 or F8E4M3 (kvpool --kv-cache-dtype
 * fp8), "cpu" F32; "null" (and anything else) any, as it never touches KV memory. */
int worker_pool_backend_takes(const char *backend, enum dtype t);

/* Whether the pool p describes fits model c (read from model_dir, named in the message): the
 * same layers, KV heads and head dim, and a dtype that backend reads. Returns 0 or
 * PAGODA_EMISMATCH with a detail naming the first field that differs (a kvpool started for
 * another model) or the two dtypes. */
int worker_pool_check_model(const struct worker_pool *p, const struct model_config *c,
                            const char *model_dir, const char *backend);

#endif
