/* The worker's executor: a thread of its own that runs prepared steps in order
 * (DESIGN.md, "The worker as an asynchronous executor").
 *
 * The worker's event loop receives a Step, checks and prepares it against the mirror
 * (worker/mirror.h), hands the prepared batch to executor_submit and commits it pending; the
 * executor's thread runs the backend's forward pass and sampling, then posts the result back to
 * the loop (uv_async_send), where the done callback answers the scheduler and resolves the
 * mirror. The loop never waits for a forward pass.
 *
 * Steps run strictly in the order they were submitted, and their results are delivered in that
 * order. A step prepared while an earlier one was in flight carries pending tokens
 * (MIRROR_PENDING_TOKEN) in its token ids and sampling histories: the executor replaces them with
 * the tokens the earlier step sampled before it runs this one. A sequence whose pending token
 * comes from a row that could not be sampled fails in this step too (its row is reported with
 * that error; its K/V is computed from token 0 at slots the scheduler frees with it). A step whose
 * forward pass fails as a whole fails every later step submitted before the next
 * executor_discard, without running them: they were prepared from what it did not write.
 *
 * With a backend that has asynchronous steps (backend_submit: the CUDA backend), the thread
 * submits step n + 1 before it completes step n, so the device runs them back to back: step
 * n + 1's pending input tokens are read on the device from the slot where step n samples them
 * (struct backend_gather), as are the tokens of step n that end penalised rows' histories
 * (struct backend_history_gather: the sampler reads them there, so penalties do not make the
 * steps wait for each other), and whether their rows were sampled is known once step n has ended,
 * when step n + 1 is completed; a sequence whose pending input failed then fails its row as above
 * (its K/V at its own slots was computed from token 0: the scheduler frees them with it). A step
 * whose forward pass fails as a whole on the device (found on completion) fails the step
 * submitted behind it the same way. Steps fall back to running one at a time when the backend
 * must see something on the host first (see executor_thread in executor.c). Backends without
 * asynchronous steps (CPU, null) run each step synchronously.
 *
 * Bounded: at most EXECUTOR_MAX_STEPS steps are held at once (queued, running, or done and not yet
 * delivered); a submit beyond that is refused. All buffers are sized at open from the limits,
 * except the block tables and sampling histories, which grow on submit (on the loop's thread).
 *
 * Threads: every function is called on the loop's thread; the done callback runs there too. The
 * backend is used by the executor's thread only between executor_open and executor_close. */
#ifndef PAGODA_WORKER_EXECUTOR_H
#define PAGODA_WORKER_EXECUTOR_H

#include "worker/backend.h"
#include "worker/mirror.h"

#include <stdint.h>
#include <uv.h>

/* Steps held at once: the mirror holds as many in flight. */
#define EXECUTOR_MAX_STEPS MIRROR_MAX_STEPS_IN_FLIGHT

/* The longest message of a step that failed as a whole. */
#define EXECUTOR_ERROR_MAX 700

struct executor_limits {
    int32_t max_num_tokens; /* tokens of one step */
    int32_t max_num_seqs;   /* sequences (and logits rows) of one step */
};

/* One step's result, valid during the done callback only. */
struct executor_result {
    uint64_t epoch, step_id;
    int rc; /* 0, or the error that failed the whole step */
    /* 1: after this step's failure the backend cannot run passes any more (backend_health: a
     * lost device context); every later result says so too. Only a new process mends it. */
    int lost;
    char error[EXECUTOR_ERROR_MAX];             /* rc's message */
    int32_t num_tokens;                         /* tokens computed (0 when rc != 0) */
    int32_t num_rows;                           /* logits rows, one per sampling sequence */
    const uint64_t *seq_ids;                    /* [num_rows] */
    const int32_t *tokens;                      /* [num_rows]: -1 for a failed row */
    const float *logprobs;                      /* [num_rows] */
    const struct backend_row_error *row_errors; /* [num_rows]: code 0 for a sampled row */
    const struct mirror_seq_error *failed;      /* [num_failed]: the mirror's failures */
    int32_t num_failed;
    double wall_us;   /* the step on the executor's thread, its delay excluded; submitted
                       * asynchronously: from its submission, or the end of the step before it
                       * if later, to its end */
    double device_us; /* the backend's device time, else the thread's CPU time */
};

/* Called on the loop with each step's result, in order; then, once the results delivered leave
 * nothing held, with r == NULL (the executor is idle: a held Resync may be applied). */
typedef void (*executor_done_fn)(void *ctx, const struct executor_result *r);

struct executor;

/* Starts an executor over backend b (which must outlive it) on loop: its thread and its uv_async
 * handle. done(ctx, result) is called on the loop for each step submitted and not discarded, in
 * order. On success *out is released with executor_close. Errors: PAGODA_EINVAL (NULL argument,
 * a limit that is not positive or max_num_seqs above MIRROR_PENDING_ROWS), PAGODA_ENOMEM,
 * PAGODA_EIO (the thread or the handle could not be made). */
int executor_open(uv_loop_t *loop, struct backend *b, const struct executor_limits *limits,
                  executor_done_fn done, void *ctx, struct executor **out);

/* Queues the prepared step ms (of epoch and step_id) behind the others: copies its batch, rows
 * (their histories only where a penalty reads them), row sequence ids and failed sequences, so
 * ms may change once this returns. The executor's thread waits delay_ms before running it (a
 * test's slow step; interrupted by executor_discard). Returns 0, PAGODA_EBUSY when
 * EXECUTOR_MAX_STEPS steps are held, PAGODA_ERANGE for a batch above the limits, PAGODA_ENOMEM. */
int executor_submit(struct executor *e, uint64_t epoch, uint64_t step_id,
                    const struct mirror_step *ms, uint32_t delay_ms);

/* Drops every step not started yet (a step still in its delay counts as not started): none of
 * them is delivered. The running step finishes and is delivered. Returns the number dropped. */
int executor_discard(struct executor *e);

/* Whether no step is held: nothing queued, running, or waiting to be delivered. */
int executor_idle(const struct executor *e);

/* Steps held (queued, running, or not yet delivered). */
int executor_held(const struct executor *e);

/* Fault injection (pagoda-worker --fault lose-device=PATH): the first step that runs (or, submitted
 * asynchronously, completes) once the file path exists fails as a lost device fails it, with
 * executor_result.lost set; the file is removed, so the fault fires once. path must outlive e.
 * Call before the first executor_submit. */
void executor_fault_lose_device(struct executor *e, const char *path);

/* Discards what is queued, waits for the running step, stops the thread and closes the handle;
 * the memory is freed by the handle's close callback, so the caller runs the loop afterwards.
 * Nothing more is delivered. Accepts NULL. */
void executor_close(struct executor *e);

#endif
