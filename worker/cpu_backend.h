/* The CPU backend: the reference forward pass, plain and exact f32 arithmetic on the BF16 (or
 * F16/F32) weights, reading and writing an f32 KV pool through kernels/cpu/attention. */
#ifndef PAGODA_WORKER_CPU_BACKEND_H
#define PAGODA_WORKER_CPU_BACKEND_H

#include "comm/comm.h"
#include "kernels/cpu/attention.h"
#include "kvpool/geometry.h"
#include "model/model_weights.h"
#include "worker/backend.h"

struct cpu_backend_options {
    enum attention_impl attention; /* ATTN_CPU_PAGED by default */
    struct backend_limits limits;
    /* Tensor parallelism: NULL (the default) for one rank; else this rank's handle on the
     * group (borrowed: it must outlive the backend), and the weights must be the matching
     * shard (model_weights_open_shard with comm_rank, comm_size). Every rank is then given the
     * same steps in the same order; each returns the same, gathered logits (so each samples
     * the same Philox draw: docs/tensor-parallel.md). */
    struct comm *comm;
};

/* Defaults: paged attention, 2048 tokens and 256 sequences per step, 4096 blocks per sequence
 * (further bounded by the pool). */
struct cpu_backend_options cpu_backend_default_options(void);

/* Opens a CPU backend for the loaded model over a pool of geometry g whose KV data starts at
 * pool_base (the caller keeps both alive while the backend is open). Converts the weights to
 * f32 (the backend does not keep a reference to w afterwards). The pool must be f32 with the
 * model's layers, KV heads and head dim (a shard's pool: its KV heads only, or the whole model's
 * shared by the ranks, each using its own run of heads). On success *out is
 * released with backend_close. Errors: PAGODA_EMISMATCH (pool and model disagree, naming the
 * field; weights that are not the shard of opt->comm's rank and size), PAGODA_EINVAL,
 * PAGODA_ENOMEM. A forward pass of a tensor-parallel rank adds the errors of the collectives:
 * PAGODA_ETIMEDOUT when a peer does not take part within the group's timeout, PAGODA_ECLOSED
 * once the group is broken. */
int cpu_backend_open(const struct model_weights *w, const struct kv_geometry *g, void *pool_base,
                     const struct cpu_backend_options *opt, struct backend **out);

#endif
