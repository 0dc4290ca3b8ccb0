/* A tensor-parallel worker group's step plumbing: rank 0's backend hands every step to the
 * other ranks, which run it in lock step.
 *
 * Rank 0 wraps its own backend (tp_leader_open): the executor uses the wrapper like any
 * backend, and each forward pass first broadcasts the step (its batch, flattened) over the
 * group's step channel, then runs rank 0's shard, whose collectives meet the other ranks'. The
 * other ranks run tp_follower_run: wait for a step (idle as long as the engine is, see
 * comm_wait_broadcast), run their shard's forward pass, repeat until rank 0 says stop. Every
 * rank computes the same gathered logits; only rank 0 samples and answers (the others' logits
 * are dropped), so the scheduler sees one worker whatever the size (DESIGN.md).
 *
 * The step channel is a comm group of the same ranks: for the CPU backend the very group its
 * collectives use; for GPUs a cpu group over shared memory beside the NCCL one (steps are host
 * data, docs/tensor-parallel.md).
 *
 * Failures: a step that breaks the batch's contract is refused by rank 0 before it is sent (no
 * other rank sees it). A step that fails in the forward pass for a reason of its own (a slot
 * outside the pool) fails at the same point on every rank, which check the same batch alike:
 * the group goes on. A dead or stuck follower makes rank 0's step fail within the group's
 * timeout, and the group is broken for good; a dead rank 0 leaves the followers waiting idle
 * until keep_waiting says stop (the supervisor restarts the group). */
#ifndef PAGODA_WORKER_TP_GROUP_H
#define PAGODA_WORKER_TP_GROUP_H

#include "comm/comm.h"
#include "worker/backend.h"

/* Wraps rank 0's backend inner (taken: closed with the wrapper) so that each forward pass is
 * first sent over steps (rank 0's handle, borrowed) to the other ranks. limits are the step
 * limits every rank was opened with (bounding what is sent). Closing the wrapper tells the
 * followers to stop (bounded by the group's timeout). On success *out is the caller's; on error
 * inner is closed. Errors: PAGODA_EINVAL (a handle that is not rank 0's, a size of 1),
 * PAGODA_ENOMEM. */
int tp_leader_open(struct backend *inner, struct comm *steps, const struct backend_limits *limits,
                   struct backend **out);

/* Has fn(rc, ctx) called when a forward pass of leader (a tp_leader_open wrapper) fails for the
 * group itself (PAGODA_ETIMEDOUT, PAGODA_ECLOSED, PAGODA_EPROTO: a rank did not arrive in time,
 * aborted, or called another collective), before the error is returned. Such a group can run no
 * other step; a worker of process ranks exits there (worker_main.c), so that its supervisor
 * restarts the group. fn NULL: none (the default). */
void tp_leader_on_broken(struct backend *leader, void (*fn)(int rc, void *ctx), void *ctx);

/* Runs the steps rank 0 sends over steps (this rank's handle) through inner (this rank's
 * backend, opened with limits) until rank 0 says stop: returns 0. Otherwise returns
 * PAGODA_ECLOSED when keep_waiting(ctx) said stop while idle or the group broke, the errors of
 * the collectives (PAGODA_ETIMEDOUT, PAGODA_EPROTO), PAGODA_EPROTO for a step above limits
 * (after aborting the group), or PAGODA_ENOMEM.
 * *steps_run counts the steps run (may be NULL). */
int tp_follower_run(struct backend *inner, struct comm *steps, const struct backend_limits *limits,
                    int (*keep_waiting)(void *ctx), void *ctx, uint64_t *steps_run);

#endif
