#include "worker/null_backend.h"
#include "common/error.h"

#include <stdlib.h>

struct null_backend {
    struct backend base;
    struct backend_limits limits;
};

int32_t null_backend_token(int64_t vocab_size, int32_t token, int32_t position)
{
    return (int32_t)(((int64_t)token * 31 + position) % vocab_size);
}

static int null_forward(struct backend *base, const struct fwd_batch *batch, float *logits)
{
    struct null_backend *b = (struct null_backend *)base;
    int64_t vocab = b->base.config.vocab_size;
    int rc = backend_check_batch(&b->base.config, &b->limits, batch);
    if (rc != 0)
        return rc;
    for (int32_t r = 0; r < batch->num_logits; r++) {
        int32_t t = batch->logits_indices[r];
        float *row = logits + (int64_t)r * vocab;
        for (int64_t v = 0; v < vocab; v++)
            row[v] = 0.0f;
        row[null_backend_token(vocab, batch->token_ids[t], batch->positions[t])] = 1.0f;
    }
    return 0;
}

static int null_forward_sample(struct backend *base, const struct fwd_batch *batch,
                               const struct sample_row *rows, int32_t *tokens, float *logprobs)
{
    struct null_backend *b = (struct null_backend *)base;
    int rc = backend_check_batch(&b->base.config, &b->limits, batch);
    if (rc != 0)
        return rc;
    for (int32_t r = 0; r < batch->num_logits; r++) {
        int32_t t = batch->logits_indices[r];
        tokens[r] =
            null_backend_token(b->base.config.vocab_size, batch->token_ids[t], batch->positions[t]);
        logprobs[r] = 0.0f;
    }
    return 0;
}

static void null_close(struct backend *base)
{
    free(base);
}

static const struct backend_ops null_ops = {
    .name = "null",
    .forward = null_forward,
    .forward_sample = null_forward_sample,
    .close = null_close,
};

int null_backend_open(const struct model_config *c, const struct backend_limits *limits,
                      struct backend **out)
{
    if (c == NULL || limits == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "null_backend_open: NULL argument");
    struct null_backend *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return PAGODA_ENOMEM;
    b->base.ops = &null_ops;
    b->base.config = *c;
    b->limits = *limits;
    *out = &b->base;
    return 0;
}
