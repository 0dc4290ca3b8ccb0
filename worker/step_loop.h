/* The worker's step loop: what pagoda-worker does with each ToWorker message on its event loop
 * (docs/protocol.md, "What a worker answers").
 *
 * A Step is checked and prepared against the mirror (worker/mirror.h), handed to the executor
 * (worker/executor.h) and committed pending, so the next step can be prepared while this one
 * runs; when the executor posts the result, the loop resolves the mirror's pending tokens and
 * answers StepResult. A Resync waits for the executor: the steps queued and not started are
 * discarded (the scheduler forgets them with its resync), the running one finishes and is
 * answered, then the snapshot is applied and ResyncDone sent; messages that arrive meanwhile are
 * held, in order (at most STEP_LOOP_MAX_HELD), and handled after it.
 *
 * A step whose forward pass fails as a whole is answered with its error, and so is every later
 * step until the next Resync (the mirror holds what it did not write: mirror_step_break); the
 * scheduler resyncs after any error result. A failure after which the backend cannot run passes
 * at all (a lost device) is not answered: options.lost is told instead, and the worker exits.
 * Everything runs on the loop's thread but the forward passes. */
#ifndef PAGODA_WORKER_STEP_LOOP_H
#define PAGODA_WORKER_STEP_LOOP_H

#include "proto/internal.pb-c.h"
#include "worker/backend.h"
#include "worker/mirror.h"

#include <stdint.h>
#include <uv.h>

/* Messages held while a Resync waits for the running step. The scheduler sends nothing but
 * stale steps and later resyncs before it has the ResyncDone: beyond this many they are
 * dropped (logged; the scheduler's timers resync again). */
#define STEP_LOOP_MAX_HELD 64

/* The longest step delay a message may ask for (Step.delay_ms), in ms. */
#define STEP_LOOP_MAX_DELAY_MS 600000

struct step_loop_options {
    struct mirror_limits mirror;
    uint64_t pool_id;       /* the pool this worker maps: a Resync for another is refused */
    uint32_t step_delay_ms; /* every step waits at least this long (tests) */
    uint64_t drop_step;     /* ignore the N-th Step message received (0: off) */
    uint64_t drop_result;   /* run the N-th Step but send no result (0: off) */
    /* Sends msg to the scheduler (what names it in logs); the message is the caller's again once
     * this returns. */
    void (*send)(void *ctx, Pagoda__Internal__ToScheduler *msg, const char *what);
    /* Sends a Hello (a resync from a scheduler that may not know this worker). */
    void (*send_hello)(void *ctx);
    /* The backend cannot run passes any more (executor_result.lost: a lost device context), told
     * with the failed step's error instead of its result: nothing more is handled or answered
     * (held messages, a held Resync among them, stay unapplied), and the caller ends the process
     * so that a new one starts (the scheduler sees the worker go, as after a kill -9, and
     * resyncs its successor: no request is lost). Called once. NULL: a lost step is answered
     * with its error as any failed step. */
    void (*lost)(void *ctx, int rc, const char *why);
    const char *lose_device; /* executor_fault_lose_device's file, or NULL */
    void *ctx;
};

struct step_loop_stats {
    uint64_t steps_received, steps_run, steps_refused, stale_steps, resyncs, held_dropped;
    uint64_t computed_tokens; /* tokens computed in forward passes */
    double wall_us_total;     /* steps' wall time on the executor */
    double device_us_total;   /* their device time (executor.h) */
};

struct step_loop;

/* Makes the mirror and the executor over backend b (which must outlive the step loop) on loop.
 * On success *out is released with step_loop_close. Errors: those of mirror_new and
 * executor_open, PAGODA_EINVAL for a NULL argument. */
int step_loop_open(uv_loop_t *loop, struct backend *b, const struct step_loop_options *o,
                   struct step_loop **out);

/* Handles one message from the scheduler (a Step or a Resync; anything else is the caller's) and
 * takes msg: it is freed here, now or once handled. */
void step_loop_handle(struct step_loop *sl, Pagoda__Internal__ToWorker *msg);

/* The counters so far. */
void step_loop_stats(const struct step_loop *sl, struct step_loop_stats *out);

/* Stops the executor (steps queued are dropped, the running one is waited for and not answered)
 * and frees the rest once the loop has run its close callbacks (the caller runs the loop after).
 * Accepts NULL. */
void step_loop_close(struct step_loop *sl);

#endif
