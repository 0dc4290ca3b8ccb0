#include "worker/worker_pool.h"
#include "common/error.h"
#include "kvpool/shm_pool.h"
#ifdef PAGODA_HAVE_CUDA
#include "kvpool/cuda_pool.h"
#endif

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

int worker_pool_init(struct worker_pool *p, const struct kvpool_info *info, const char *backend,
                     uint32_t worker_id, int wait_ms, int *cannot_run)
{
    memset(p, 0, sizeof(*p));
    p->info = *info;
    const int gpu_pool = info->handle_socket[0] != '\0';
    const int use_cuda = strcmp(backend, "cuda") == 0, use_null = strcmp(backend, "null") == 0;
    if (gpu_pool)
        snprintf(p->where, sizeof(p->where), "on GPU %d (%s)", info->device, info->handle_socket);
    else
        snprintf(p->where, sizeof(p->where), "%s", info->shm_name);
    if (gpu_pool && !use_cuda && !use_null) {
        *cannot_run = 1;
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "kvpool serves a GPU pool %s; the %s backend needs a CPU pool "
                                "(start the worker with --backend cuda, or kvpool with --backend "
                                "cpu)",
                                p->where, backend);
    }
    if (!gpu_pool && use_cuda) {
        *cannot_run = 1;
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "kvpool serves a CPU pool in shared memory (%s); the CUDA backend "
                                "needs a GPU pool (start kvpool with --backend cuda)",
                                p->where);
    }
    if (!gpu_pool) {
        int rc = kv_shm_pool_open(info->shm_name, NULL, &p->shm);
        if (rc != 0)
            return rc;
        const struct kv_geometry *pg = kv_shm_pool_geometry(p->shm);
        if (!kv_geometry_equal(pg, &info->geometry))
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    "kv pool %s (pool id %016" PRIx64
                                    ") is not the pool kvpool described (pool id %016" PRIx64 ")",
                                    info->shm_name, pg->pool_id, info->geometry.pool_id);
        return 0;
    }
#ifdef PAGODA_HAVE_CUDA
    if (use_cuda)
        return kv_cuda_pool_import(info->handle_socket, worker_id, &info->geometry, wait_ms,
                                   &p->gpu);
#else
    (void)worker_id;
    (void)wait_ms;
#endif
    return 0;
}

void worker_pool_fini(struct worker_pool *p)
{
    if (p == NULL)
        return;
    kv_shm_pool_close(p->shm); /* unmaps only: the pool is kvpool's */
    p->shm = NULL;
#ifdef PAGODA_HAVE_CUDA
    kv_cuda_pool_close(p->gpu); /* likewise */
#endif
    p->gpu = NULL;
}

int worker_pool_backend_takes(const char *backend, enum dtype t)
{
    if (strcmp(backend, "cuda") == 0)
        return t == DTYPE_BF16 || t == DTYPE_F8E4M3;
    if (strcmp(backend, "cpu") == 0)
        return t == DTYPE_F32;
    return 1;
}

int worker_pool_check_model(const struct worker_pool *p, const struct model_config *c,
                            const char *model_dir, const char *backend)
{
    const struct kv_geometry *g = &p->info.geometry;
    const char *field = NULL;
    long long have = 0, want = 0;
    if (g->num_layers != c->num_layers)
        field = "layers", have = g->num_layers, want = c->num_layers;
    else if (g->num_kv_heads != c->num_kv_heads)
        field = "KV heads", have = g->num_kv_heads, want = c->num_kv_heads;
    else if (g->head_dim != c->head_dim)
        field = "head dim", have = g->head_dim, want = c->head_dim;
    if (field != NULL)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "kv pool %s does not fit the model %s: %s %lld in the pool, %lld "
                                "in the model (was kvpool started with another --model?)",
                                p->where, model_dir, field, have, want);
    if (!worker_pool_backend_takes(backend, g->dtype))
        return pagoda_error_set(PAGODA_EMISMATCH, "kv pool %s holds %s; the %s backend needs %s",
                                p->where, dtype_name(g->dtype), backend,
                                strcmp(backend, "cuda") == 0 ? "BF16 or F8_E4M3" : "F32");
    return 0;
}
