/* Collectives of a tensor-parallel group: the few a Megatron-sharded forward pass needs (a sum
 * all-reduce after the row-parallel projections, an all-gather of the vocabulary-split logits,
 * a broadcast of a step from rank 0), behind one interface with two implementations:
 *
 * - cpu: ranks that are threads or processes of one host, exchanging through a shared memory
 *   region (comm_cpu_shared_*) and a process-shared barrier. Buffers are host memory.
 * - nccl: one rank per GPU through NCCL (comm_nccl.h), built only when NCCL is found at build
 *   time. Buffers are device memory on the rank's stream.
 *
 * Every collective is called by every rank of the group in the same order with the same count
 * (a rank calling another collective or count is PAGODA_EPROTO where the implementation can
 * tell). Every wait is bounded: a peer that died or stopped calling makes the others' call
 * fail with PAGODA_ETIMEDOUT (or PAGODA_ECLOSED once a peer has aborted the group) within the
 * group's timeout, never hang. After any error the group is broken for good: every later call
 * on any rank fails at once, and the group must be made again (the worker group restarts).
 *
 * Sums are deterministic and identical on every rank: the cpu implementation adds the ranks'
 * contributions in rank order, in f32, so all ranks hold bit-identical results. */
#ifndef PAGODA_COMM_COMM_H
#define PAGODA_COMM_COMM_H

#include "common/dtype.h"

#include <stddef.h>

/* Most ranks in one group. */
#define COMM_MAX_RANKS 8
/* A collective's default bound on waiting for the peers, in milliseconds. */
#define COMM_DEFAULT_TIMEOUT_MS 30000

struct comm;

/* This rank's index in [0, comm_size) and the group's size. */
int comm_rank(const struct comm *c);
int comm_size(const struct comm *c);

/* The implementation's name ("cpu", "nccl"), for logs. */
const char *comm_name(const struct comm *c);

/* buf[count] (DTYPE_F32 or DTYPE_BF16) becomes the element-wise sum of every rank's buf.
 * Returns 0, PAGODA_EINVAL (another dtype, a NULL buffer with count > 0), PAGODA_EPROTO (the
 * ranks disagree on the call), PAGODA_ETIMEDOUT (a peer did not arrive in time), PAGODA_ECLOSED
 * (the group is broken or a peer aborted it), or the implementation's errors (PAGODA_ECUDA). On
 * an error buf holds unspecified values. */
int comm_all_reduce_sum(struct comm *c, void *buf, size_t count, enum dtype dtype);

/* recv[size][count] receives every rank's send[count], rank r's at recv + r * count (send may
 * not alias recv). Same errors as comm_all_reduce_sum; any dtype. */
int comm_all_gather(struct comm *c, const void *send, void *recv, size_t count, enum dtype dtype);

/* buf[bytes] of rank root is copied into buf on every other rank. Same errors; PAGODA_EINVAL for
 * a root outside the group. */
int comm_broadcast(struct comm *c, void *buf, size_t bytes, int root);

/* How often a peer waiting for the next step (comm_wait_broadcast) asks whether to go on. */
#define COMM_IDLE_POLL_MS 200

/* comm_broadcast for a rank waiting for its next step, which may come after any idle time:
 * the wait for root does not time out (an idle engine is not a dead peer) while
 * keep_waiting(ctx) returns nonzero, asked every COMM_IDLE_POLL_MS; once root has arrived, the
 * transfer is bounded as comm_broadcast's is. Returns 0, PAGODA_ECLOSED when keep_waiting said
 * stop (this rank leaves the wait; the group is not broken) or the group is broken, the errors
 * of comm_broadcast, or PAGODA_EUNSUPPORTED for an implementation without it (NCCL: steps travel
 * over a cpu group of the same ranks, docs/tensor-parallel.md). root may not wait this way. */
int comm_wait_broadcast(struct comm *c, void *buf, size_t bytes, int root,
                        int (*keep_waiting)(void *ctx), void *ctx);

/* Breaks the group on purpose (this rank is stopping, or its step failed): the peers' pending
 * and later calls fail with PAGODA_ECLOSED at once instead of waiting for the timeout. */
void comm_abort(struct comm *c);

/* Frees this rank's handle (not the shared region of a cpu group). Accepts NULL. */
void comm_close(struct comm *c);

/* ---- cpu: ranks on one host ------------------------------------------------------------- */

/* Bytes of each rank's staging slot in the shared region; larger buffers travel in chunks. */
#define COMM_CPU_SLOT_BYTES ((size_t)1 << 20)

/* Bytes of the shared region of a group of size ranks (0 for a size outside
 * [1, COMM_MAX_RANKS]). */
size_t comm_cpu_shared_bytes(int size);

/* Initialises the shared region at mem (comm_cpu_shared_bytes(size) bytes, 64-byte aligned):
 * memory of the process for ranks that are threads, a MAP_SHARED mapping made before fork (or a
 * shared memory file) for ranks that are processes. Every collective waits at most timeout_ms
 * (> 0) for the peers. Returns 0 or PAGODA_EINVAL. */
int comm_cpu_shared_init(void *mem, int size, int timeout_ms);

/* Marks the region no longer initialised, once no rank uses it (nothing in it needs destroying:
 * the barrier is two atomic words). Accepts NULL. */
void comm_cpu_shared_fini(void *mem);

/* Opens rank's handle on an initialised shared region (which must outlive it). *out is the
 * caller's, to be closed with comm_close. Errors: PAGODA_EINVAL (a region not initialised, a
 * rank outside the group), PAGODA_ENOMEM. */
int comm_cpu_open(void *shared, int rank, struct comm **out);

/* Internal: what each implementation provides. */
struct comm_ops {
    const char *name;
    int (*all_reduce_sum)(struct comm *c, void *buf, size_t count, enum dtype dtype);
    int (*all_gather)(struct comm *c, const void *send, void *recv, size_t count, enum dtype dtype);
    int (*broadcast)(struct comm *c, void *buf, size_t bytes, int root);
    /* NULL: comm_wait_broadcast is PAGODA_EUNSUPPORTED. */
    int (*wait_broadcast)(struct comm *c, void *buf, size_t bytes, int root,
                          int (*keep_waiting)(void *ctx), void *ctx);
    void (*abort)(struct comm *c);
    void (*close)(struct comm *c);
};

struct comm {
    const struct comm_ops *ops;
    int rank, size;
};

#endif
