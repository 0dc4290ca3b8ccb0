/* The dispatch of comm.h: argument checks shared by every implementation. */
#include "comm/comm.h"
#include "common/error.h"

int comm_rank(const struct comm *c)
{
    return c->rank;
}

int comm_size(const struct comm *c)
{
    return c->size;
}

const char *comm_name(const struct comm *c)
{
    return c->ops->name;
}

int comm_all_reduce_sum(struct comm *c, void *buf, size_t count, enum dtype dtype)
{
    if (dtype != DTYPE_F32 && dtype != DTYPE_BF16)
        return pagoda_error_set(PAGODA_EINVAL, "all-reduce over %s (f32 and bf16 only)",
                                dtype_name(dtype));
    if (buf == NULL && count > 0)
        return pagoda_error_set(PAGODA_EINVAL, "all-reduce of a NULL buffer");
    return c->ops->all_reduce_sum(c, buf, count, dtype);
}

int comm_all_gather(struct comm *c, const void *send, void *recv, size_t count, enum dtype dtype)
{
    if ((send == NULL || recv == NULL) && count > 0)
        return pagoda_error_set(PAGODA_EINVAL, "all-gather of a NULL buffer");
    return c->ops->all_gather(c, send, recv, count, dtype);
}

int comm_broadcast(struct comm *c, void *buf, size_t bytes, int root)
{
    if (root < 0 || root >= c->size)
        return pagoda_error_set(PAGODA_EINVAL, "broadcast from rank %d of a group of %d", root,
                                c->size);
    if (buf == NULL && bytes > 0)
        return pagoda_error_set(PAGODA_EINVAL, "broadcast of a NULL buffer");
    return c->ops->broadcast(c, buf, bytes, root);
}

int comm_wait_broadcast(struct comm *c, void *buf, size_t bytes, int root,
                        int (*keep_waiting)(void *ctx), void *ctx)
{
    if (root < 0 || root >= c->size || root == c->rank || keep_waiting == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "rank %d waits for a broadcast from rank %d",
                                c->rank, root);
    if (buf == NULL && bytes > 0)
        return pagoda_error_set(PAGODA_EINVAL, "broadcast of a NULL buffer");
    if (c->ops->wait_broadcast == NULL)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s groups cannot wait idle for a step",
                                c->ops->name);
    return c->ops->wait_broadcast(c, buf, bytes, root, keep_waiting, ctx);
}

void comm_abort(struct comm *c)
{
    if (c != NULL)
        c->ops->abort(c);
}

void comm_close(struct comm *c)
{
    if (c != NULL)
        c->ops->close(c);
}
