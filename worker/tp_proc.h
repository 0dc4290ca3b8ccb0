/* A tensor-parallel rank that is a process of its own: pagoda-worker --tp-rank R --tp-size N
 * --tp-group PATH (docs/tensor-parallel.md). One worker per rank (per GPU), each over its own
 * kvpool's pool of the shard's KV heads; rank 0 talks to the scheduler, the others run
 * tp_follower_run (worker/tp_group.h).
 *
 * The ranks meet in the group file PATH (comm/comm_file.h), which whoever starts the group (the
 * supervisor) makes fresh for each start. Joining:
 *  1. every rank opens its place (rank 0 makes the cpu comm region: the step channel, and with
 *     the CPU backend the collectives too);
 *  2. every rank publishes what the group must agree on (struct tp_proc_member: its place, the
 *     model's fingerprint, the backend, its pool's geometry and identity, the step limits; rank
 *     0 also an NCCL unique id when the collectives go through NCCL) and waits for every other
 *     rank's, then compares them all: every rank refuses alike (PAGODA_EMISMATCH, naming the
 *     field and the ranks), before anything heavy is loaded;
 *  3. each rank loads its shard and opens its backend, then says so (tp_proc_loaded): rank 0
 *     waits for every rank to have loaded before it serves, so the first step never waits on a
 *     slow load.
 * The waits of 1 to 3 have no deadline (loading a large model takes what it takes): they end
 * when keep_waiting says stop or a peer's process is gone. The collectives afterwards are
 * bounded by the group's timeout (comm.h).
 *
 * The group's pool identity (what rank 0 announces to the scheduler as its pool_id) combines
 * every rank's pool identity (tp_proc_group_pool_id): a rank whose kvpool made a new pool (its
 * KV lost) changes it, and the scheduler, seeing a new identity, recomputes what the pools held
 * (scheduler.h's adopt_pool). The scheduler first learns rank 0's own pool from kvpool; the pool
 * a worker names at its first accepted Hello, before any step ran, is taken without counting a
 * change of pool. */
#ifndef PAGODA_WORKER_TP_PROC_H
#define PAGODA_WORKER_TP_PROC_H

#include "comm/comm.h"
#include "model/model_fingerprint.h"

#include <stddef.h>
#include <stdint.h>

#define TP_PROC_NCCL_ID_BYTES 128
/* Set by tp_proc_join in every member; changed whenever struct tp_proc_member changes, so that
 * a group of two pagoda builds is refused as such, not as a disagreement read at wrong offsets. */
#define TP_PROC_MEMBER_LAYOUT 0x70610002

/* What every rank publishes and the group agrees on. */
struct tp_proc_member {
    int32_t rank, size;
    int32_t pid;
    int32_t num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype;
    int32_t max_num_tokens, max_num_seqs, max_blocks_per_seq;
    int32_t nccl; /* rank 0: nccl_id holds an NCCL unique id (the collectives go through NCCL) */
    int32_t has_device;   /* device_uuid names the rank's GPU */
    int32_t nccl_capable; /* this rank's build has NCCL */
    int32_t layout;       /* TP_PROC_MEMBER_LAYOUT: ranks of other builds are told apart */
    uint8_t device_uuid[16];
    uint64_t pool_id;
    uint8_t fingerprint[MODEL_FINGERPRINT_BYTES];
    char backend[16];
    uint8_t nccl_id[TP_PROC_NCCL_ID_BYTES];
};

struct tp_proc_options {
    const char *path; /* the group file */
    int rank, size;
    int timeout_ms; /* the collectives' bound (rank 0 sets it for the group) */
    /* Rank 0 with the CUDA backend: make an NCCL unique id (when this build has NCCL) so that
     * the collectives go through NCCL; otherwise (or without NCCL) they go through the cpu
     * group (the CUDA backend stages them through pinned memory). */
    int want_nccl;
    int (*keep_waiting)(void *ctx); /* may be NULL */
    void *ctx;
};

struct tp_proc;

/* Steps 1 and 2 above for o->rank; mine's rank, size, pid and NCCL fields are filled here.
 * On success *out is the caller's. Errors: comm_file_open's (PAGODA_EFORMAT, PAGODA_EMISMATCH,
 * PAGODA_EEXIST for a stale file, ...), PAGODA_EMISMATCH (the ranks disagree: every rank refuses),
 * PAGODA_ECLOSED (keep_waiting said stop; a peer is gone), PAGODA_EIO (NCCL's unique id). */
int tp_proc_join(const struct tp_proc_options *o, const struct tp_proc_member *mine,
                 struct tp_proc **out);

/* The cpu group: the step channel (tp_leader_open, tp_follower_run), and the CPU backend's
 * collectives. Borrowed. */
struct comm *tp_proc_comm(struct tp_proc *t);

/* Whether the group's collectives go through NCCL, as every rank decides it alike from the
 * members (members[r] is rank r's): 1 when rank 0 made an NCCL unique id, every rank's build
 * has NCCL and no two ranks share a GPU (NCCL refuses two ranks on one device); else 0, with
 * why (a message for the log) filled when rank 0 asked for NCCL but the group cannot use it. */
int tp_proc_use_nccl(const struct tp_proc_member *members, int n, char *why, size_t why_len);

/* The collectives of a CUDA backend on device: an NCCL communicator when rank 0 made an NCCL id
 * (opened here on device, every rank at once, bounded by the timeout; *owned set: close it with
 * comm_close after the backend), else the cpu group (*owned 0). Errors: comm_nccl_open's,
 * PAGODA_ECUDA. */
int tp_proc_device_comm(struct tp_proc *t, int device, struct comm **out, int *owned);

/* The group's pool identity (see the file comment). */
uint64_t tp_proc_pool_id(const struct tp_proc *t);

/* Step 3: says this rank has loaded; rank 0 then waits for every rank's (without deadline,
 * bounded as tp_proc_join's waits). Errors: PAGODA_ECLOSED. */
int tp_proc_loaded(struct tp_proc *t, int (*keep_waiting)(void *ctx), void *ctx);

/* Whether rank 0's process is still there (a follower's keep_waiting asks). */
int tp_proc_leader_alive(const struct tp_proc *t);

/* Closes this rank's place (the file stays). Accepts NULL. */
void tp_proc_close(struct tp_proc *t);

/* Combines the ranks' pool identities into the group's: ids[0] itself for one rank; never 0. */
uint64_t tp_proc_group_pool_id(const uint64_t *ids, int n);

/* Compares every rank's member (members[r] is rank r's) with rank 0's: 0, or PAGODA_EMISMATCH
 * naming the field and the ranks. */
int tp_proc_compare(const struct tp_proc_member *members, int n);

#endif
