#include "worker/backend.h"

const struct model_config *backend_config(const struct backend *b)
{
    return &b->config;
}

int backend_forward(struct backend *b, const struct fwd_batch *batch, float *logits)
{
    int rc = b->ops->forward(b, batch, logits);
    if (rc == 0)
        b->forward_count++;
    return rc;
}

uint64_t backend_forward_count(const struct backend *b)
{
    return b->forward_count;
}

void backend_close(struct backend *b)
{
    if (b != NULL)
        b->ops->close(b);
}
