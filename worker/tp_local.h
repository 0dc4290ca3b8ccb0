/* A tensor-parallel group of CPU ranks inside one worker process: rank 0 on the caller's
 * thread (the executor's), ranks 1.. on threads of their own, all sharing the one pool kvpool
 * made (the whole model's KV heads; each rank uses its own run of heads) and one cpu comm group
 * for both the steps and the collectives (tp_group.h). The scheduler sees one worker.
 *
 * This is the CPU backend's tensor parallelism as pagoda-worker --tensor-parallel N runs it:
 * useful to test the whole path (and to split a model's arithmetic over cores), not to hold a
 * model larger than one host. GPU groups are one worker process per GPU (docs/tensor-parallel.md:
 * not wired yet). */
#ifndef PAGODA_WORKER_TP_LOCAL_H
#define PAGODA_WORKER_TP_LOCAL_H

#include "worker/cpu_backend.h"

/* Opens size ranks (2..COMM_MAX_RANKS) of the model in model_dir over the pool of geometry g at
 * pool_base (the whole model's KV heads; both outlive the backend), each a CPU backend with
 * opt's limits and attention, collectives bounded by timeout_ms. On success *out is rank 0's
 * backend, the group's face: closing it stops and joins the other ranks and frees the group.
 * Errors: PAGODA_EINVAL (a size outside the range), those of model_weights_open_shard (a size
 * that does not divide the heads: PAGODA_EUNSUPPORTED naming the field), of cpu_backend_open,
 * of comm_cpu_shared_init, PAGODA_ENOMEM, PAGODA_EIO (a thread not started). */
int tp_local_open(const char *model_dir, int size, const struct kv_geometry *g, void *pool_base,
                  const struct cpu_backend_options *opt, int timeout_ms, struct backend **out);

#endif
