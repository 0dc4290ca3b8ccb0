/* The null backend: no model, no arithmetic, no KV writes. It answers every forward pass at once
 * with a deterministic token per logits row, so that the engine around the model (scheduler,
 * worker mirror, wire, router) can be measured and tested on its own.
 *
 * The token of a logits row whose input token is t at position p is (t * 31 + p) % vocab_size,
 * with logprob 0; forward's logits put 1 on that token and 0 elsewhere, so greedy sampling of
 * them agrees. Batches are checked as every backend checks them (backend_check_batch). */
#ifndef PAGODA_WORKER_NULL_BACKEND_H
#define PAGODA_WORKER_NULL_BACKEND_H

#include "model/model_config.h"
#include "worker/backend.h"

#include <stdint.h>

/* The token the null backend returns for input token `token` at position `position`. */
int32_t null_backend_token(int64_t vocab_size, int32_t token, int32_t position);

/* Opens a null backend for a model of config c (copied) that accepts batches within limits.
 * On success *out is released with backend_close. Errors: PAGODA_EINVAL (NULL argument),
 * PAGODA_ENOMEM. */
int null_backend_open(const struct model_config *c, const struct backend_limits *limits,
                      struct backend **out);

#endif
