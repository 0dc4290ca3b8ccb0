/* comm_nccl.h: NCCL's communicator in non-blocking mode (ncclCommInitRankConfig with
 * blocking = 0), so that no call can hang on a dead peer: each collective is queued, then the
 * stream and the communicator's async error are polled until the deadline, past which the
 * communicator is aborted (ncclCommAbort) and the group broken. */
#include "comm/comm_nccl.h"
#include "common/error.h"

#include <cuda_runtime.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

_Static_assert(sizeof(ncclUniqueId) == COMM_NCCL_ID_BYTES, "NCCL's unique id size");

struct nccl_comm {
    struct comm base;
    ncclComm_t nc;
    cudaStream_t stream;
    int timeout_ms;
    int broken; /* 0 or the error every later call returns */
};

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static int fail(struct nccl_comm *c, int err, const char *what, ncclResult_t r)
{
    if (!c->broken) {
        c->broken = err;
        ncclCommAbort(c->nc);
        c->nc = NULL;
    }
    return pagoda_error_set(err, "nccl rank %d: %s (%s)", c->base.rank, what,
                            ncclGetErrorString(r));
}

/* Polls the communicator (a call still in progress) and then the stream until both are done,
 * or the deadline passes. */
static int wait_done(struct nccl_comm *c, ncclResult_t queued, const char *what)
{
    double deadline = now_ms() + c->timeout_ms;
    ncclResult_t st = queued;
    while (st == ncclInProgress) {
        if (now_ms() > deadline)
            return fail(c, PAGODA_ETIMEDOUT, what, st);
        ncclCommGetAsyncError(c->nc, &st);
    }
    if (st != ncclSuccess)
        return fail(c, PAGODA_EIO, what, st);
    for (;;) {
        cudaError_t e = cudaStreamQuery(c->stream);
        if (e == cudaSuccess)
            return 0;
        if (e != cudaErrorNotReady)
            return fail(c, PAGODA_ECUDA, cudaGetErrorString(e), ncclSuccess);
        ncclCommGetAsyncError(c->nc, &st);
        if (st != ncclSuccess && st != ncclInProgress)
            return fail(c, PAGODA_EIO, what, st);
        if (now_ms() > deadline)
            return fail(c, PAGODA_ETIMEDOUT, what, ncclInProgress);
    }
}

static int check_broken(struct nccl_comm *c)
{
    if (c->broken)
        return pagoda_error_set(PAGODA_ECLOSED, "nccl rank %d: the group is broken (%s)",
                                c->base.rank, pagoda_strerror(c->broken));
    return 0;
}

static ncclDataType_t nccl_type(enum dtype t)
{
    return t == DTYPE_F32 ? ncclFloat32 : t == DTYPE_BF16 ? ncclBfloat16 : ncclFloat16;
}

static int nccl_all_reduce_sum(struct comm *base, void *buf, size_t count, enum dtype dtype)
{
    struct nccl_comm *c = (struct nccl_comm *)base;
    int rc = check_broken(c);
    if (rc != 0)
        return rc;
    ncclResult_t r = ncclAllReduce(buf, buf, count, nccl_type(dtype), ncclSum, c->nc, c->stream);
    return wait_done(c, r, "all-reduce");
}

static int nccl_all_gather(struct comm *base, const void *send, void *recv, size_t count,
                           enum dtype dtype)
{
    struct nccl_comm *c = (struct nccl_comm *)base;
    int rc = check_broken(c);
    if (rc != 0)
        return rc;
    ncclResult_t r = ncclAllGather(send, recv, count, nccl_type(dtype), c->nc, c->stream);
    return wait_done(c, r, "all-gather");
}

static int nccl_broadcast(struct comm *base, void *buf, size_t bytes, int root)
{
    struct nccl_comm *c = (struct nccl_comm *)base;
    int rc = check_broken(c);
    if (rc != 0)
        return rc;
    ncclResult_t r = ncclBroadcast(buf, buf, bytes, ncclUint8, root, c->nc, c->stream);
    return wait_done(c, r, "broadcast");
}

static void nccl_abort(struct comm *base)
{
    struct nccl_comm *c = (struct nccl_comm *)base;
    if (!c->broken) {
        c->broken = PAGODA_ECLOSED;
        ncclCommAbort(c->nc);
        c->nc = NULL;
    }
}

static void nccl_close(struct comm *base)
{
    struct nccl_comm *c = (struct nccl_comm *)base;
    if (c->nc != NULL)
        ncclCommDestroy(c->nc);
    free(c);
}

static const struct comm_ops nccl_ops = {
    .name = "nccl",
    .all_reduce_sum = nccl_all_reduce_sum,
    .all_gather = nccl_all_gather,
    .broadcast = nccl_broadcast,
    .abort = nccl_abort,
    .close = nccl_close,
};

int comm_nccl_unique_id(uint8_t id[COMM_NCCL_ID_BYTES])
{
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess)
        return pagoda_error_set(PAGODA_EIO, "ncclGetUniqueId: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof(u));
    return 0;
}

int comm_nccl_open(const uint8_t id[COMM_NCCL_ID_BYTES], int size, int rank, void *stream,
                   int timeout_ms, struct comm **out)
{
    if (size < 1 || size > COMM_MAX_RANKS || rank < 0 || rank >= size || timeout_ms <= 0)
        return pagoda_error_set(PAGODA_EINVAL, "nccl: rank %d of %d, timeout %d ms", rank, size,
                                timeout_ms);
    struct nccl_comm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "nccl: out of memory");
    c->base = (struct comm){.ops = &nccl_ops, .rank = rank, .size = size};
    c->stream = (cudaStream_t)stream;
    c->timeout_ms = timeout_ms;
    ncclUniqueId u;
    memcpy(&u, id, sizeof(u));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&c->nc, size, u, rank, &config);
    int rc = wait_done(c, r, "joining the group");
    if (rc != 0) {
        free(c);
        return rc;
    }
    *out = &c->base;
    return 0;
}

int comm_nccl_device(const struct comm *base)
{
    if (base == NULL || base->ops != &nccl_ops) {
        pagoda_error_set(PAGODA_EINVAL, "nccl: not an NCCL comm");
        return -1;
    }
    const struct nccl_comm *c = (const struct nccl_comm *)base;
    int device = -1;
    ncclResult_t r = ncclCommCuDevice(c->nc, &device);
    if (r != ncclSuccess) {
        pagoda_error_set(PAGODA_EIO, "ncclCommCuDevice: %s", ncclGetErrorString(r));
        return -1;
    }
    return device;
}
