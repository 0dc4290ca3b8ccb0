/* tp_local.h: the ranks are opened one after the other on the caller's thread (each converts
 * its own shard to f32), then ranks 1.. start on their threads in tp_follower_run. */
#include "worker/tp_local.h"
#include "common/error.h"
#include "common/log.h"
#include "worker/tp_group.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

struct follower {
    struct backend *be;
    struct comm *comm;
    struct backend_limits limits;
    atomic_int *stop;
    pthread_t thread;
    int started;
    int rc;
};

struct tp_local {
    struct backend base;
    struct backend *leader; /* rank 0's, wrapped by tp_leader_open */
    void *shared;
    struct comm *comm0;
    struct follower followers[COMM_MAX_RANKS - 1];
    int size;
    atomic_int stop;
};

static int keep_waiting(void *ctx)
{
    struct follower *f = ctx;
    return !atomic_load(f->stop);
}

static void *follower_main(void *arg)
{
    struct follower *f = arg;
    f->rc = tp_follower_run(f->be, f->comm, &f->limits, keep_waiting, f, NULL);
    if (f->rc != 0 && !atomic_load(f->stop))
        log_error("tensor-parallel rank %d stopped: %s (%s)", comm_rank(f->comm),
                  pagoda_strerror(f->rc), pagoda_error_detail());
    return NULL;
}

static int local_forward(struct backend *base, const struct fwd_batch *batch, float *logits)
{
    return backend_forward(((struct tp_local *)base)->leader, batch, logits);
}

/* Stops the ranks: rank 0's close tells them (when it can), the flag ends an idle wait, an
 * abort ends any other. */
/* Joins the other ranks' threads (t->stop set, rank 0's backend closed or aborted before), closes
 * their backends and communicators, rank 0's communicator and the shared segment, and frees t. */
static void local_free(struct tp_local *t)
{
    for (int r = 0; r < t->size - 1; r++) {
        struct follower *f = &t->followers[r];
        if (f->started)
            pthread_join(f->thread, NULL);
        backend_close(f->be);
        comm_close(f->comm);
    }
    comm_close(t->comm0);
    if (t->shared != NULL)
        comm_cpu_shared_fini(t->shared);
    free(t->shared);
    free(t);
}

static void local_close(struct backend *base)
{
    struct tp_local *t = (struct tp_local *)base;
    backend_close(t->leader); /* sends the stop, then closes rank 0's backend */
    atomic_store(&t->stop, 1);
    local_free(t);
}

static const struct backend_ops local_ops = {
    .name = "cpu-tp",
    .forward = local_forward,
    .close = local_close,
};

/* Opens rank's shard and its CPU backend over the shared pool. */
static int open_rank(const char *model_dir, struct comm *comm, const struct kv_geometry *g,
                     void *pool_base, const struct cpu_backend_options *opt, struct backend **out)
{
    struct model_weights *w = NULL;
    int rc = model_weights_open_shard(model_dir, comm_rank(comm), comm_size(comm), &w);
    if (rc == 0) {
        struct cpu_backend_options o = *opt;
        o.comm = comm;
        rc = cpu_backend_open(w, g, pool_base, &o, out);
    }
    model_weights_close(w); /* the backend keeps its own f32 copy */
    return rc;
}

int tp_local_open(const char *model_dir, int size, const struct kv_geometry *g, void *pool_base,
                  const struct cpu_backend_options *opt, int timeout_ms, struct backend **out)
{
    if (size < 2 || size > COMM_MAX_RANKS)
        return pagoda_error_set(PAGODA_EINVAL, "tensor-parallel size %d (2 to %d)", size,
                                COMM_MAX_RANKS);
    struct tp_local *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    t->base.ops = &local_ops;
    t->size = size;
    atomic_init(&t->stop, 0);
    struct backend *rank0 = NULL;
    int rc;
    t->shared = aligned_alloc(64, comm_cpu_shared_bytes(size));
    if (t->shared == NULL) {
        rc = pagoda_error_set(PAGODA_ENOMEM, "out of memory");
        goto fail;
    }
    if ((rc = comm_cpu_shared_init(t->shared, size, timeout_ms)) != 0 ||
        (rc = comm_cpu_open(t->shared, 0, &t->comm0)) != 0)
        goto fail;
    for (int r = 1; r < size; r++) {
        struct follower *f = &t->followers[r - 1];
        f->stop = &t->stop;
        f->limits = opt->limits;
        if ((rc = comm_cpu_open(t->shared, r, &f->comm)) != 0 ||
            (rc = open_rank(model_dir, f->comm, g, pool_base, opt, &f->be)) != 0)
            goto fail;
    }
    if ((rc = open_rank(model_dir, t->comm0, g, pool_base, opt, &rank0)) != 0)
        goto fail;
    t->base.config = *backend_config(rank0);
    for (int r = 1; r < size; r++) {
        struct follower *f = &t->followers[r - 1];
        if (pthread_create(&f->thread, NULL, follower_main, f) != 0) {
            rc = pagoda_error_set(PAGODA_EIO, "tensor-parallel rank %d: no thread", r);
            goto fail;
        }
        f->started = 1;
    }
    /* The leader takes rank 0's backend, on error too. */
    rc = tp_leader_open(rank0, t->comm0, &opt->limits, &t->leader);
    rank0 = NULL;
    if (rc != 0)
        goto fail;
    *out = &t->base;
    return 0;
fail:
    atomic_store(&t->stop, 1);
    if (t->comm0 != NULL)
        comm_abort(t->comm0); /* ends a started rank's wait at once */
    backend_close(rank0);
    local_free(t);
    return rc;
}
