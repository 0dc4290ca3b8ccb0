/* The memory budget a CUDA worker checks before it loads anything onto the GPU: its weights,
 * the activations of its largest step and a reserve (model/model_budget.h, the one formula that
 * kvpool and the CUDA backend use too) must fit in the memory the GPU has free beside the KV
 * pool, which is mapped already, so that free memory no longer counts it.
 *
 * A predecessor killed a moment ago may still be releasing its weights, so a worker that does
 * not fit waits for memory to come free, up to a bound, before it refuses to start, saying by
 * how much it is short. Plain C: the free memory comes from a callback (kv_cuda_mem_info in
 * pagoda-worker), so that the rule is tested without a GPU. */
#ifndef PAGODA_WORKER_WORKER_BUDGET_H
#define PAGODA_WORKER_WORKER_BUDGET_H

#include "model/model_config.h"

#include <signal.h>
#include <stdint.h>

/* How long pagoda-worker waits for GPU memory to come free before it refuses to start, and how
 * often it looks. */
#define WORKER_BUDGET_WAIT_MS 5000
#define WORKER_BUDGET_POLL_MS 200

/* Fills *free_bytes and *total_bytes for the GPU the worker runs on; returns 0 or a PAGODA_E*
 * code. */
typedef int (*worker_budget_mem_info_fn)(void *ctx, uint64_t *free_bytes, uint64_t *total_bytes);

/* What the check needs to know. */
struct worker_budget_request {
    const struct model_config *config; /* the model's shape */
    int64_t max_tokens;                /* the largest step: tokens (--max-batched-tokens) */
    int64_t max_seqs;                  /* and sequences (--max-seqs) */
    int device;                        /* the GPU, for messages */
    uint64_t pool_bytes;               /* the KV pool mapped on it, for messages */
    worker_budget_mem_info_fn mem_info;
    void *mem_info_ctx;
    int wait_ms; /* how long to wait for memory to come free (WORKER_BUDGET_WAIT_MS) */
    int poll_ms; /* how often to look meanwhile (WORKER_BUDGET_POLL_MS), at least 1 */
    const volatile sig_atomic_t *stop; /* when not NULL and set, stop waiting (a signal) */
};

/* Asks mem_info until what the worker needs (model_budget_worker_bytes) is free, and logs what
 * it found; waits up to r->wait_ms, asking every r->poll_ms, and stops waiting early once
 * *r->stop is set. Returns 0 when the worker fits, PAGODA_EEXHAUSTED when it does not (the
 * detail says how many MiB and bytes it is short by and what to change; a restart would fail
 * the same way), or mem_info's error. */
int worker_budget_check(const struct worker_budget_request *r);

#endif
