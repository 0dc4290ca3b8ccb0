/* A stand-in scheduler and a router harness for the router's and the client's tests.
 *
 * The fake scheduler listens on a PAIR socket like the real one and answers every SubmitSeq with
 * TokenEvents of deterministic tokens (fake_sched_token), a few per event, one event per request
 * every couple of milliseconds; it answers StatsRequest with figures of its own. A request whose
 * first prompt token is FAKE_SCHED_ERROR_TOKEN fails (FINISH_ERROR). A resubmission
 * (output_token_ids set) continues from the output it carries. A RouterHello is answered with
 * an announcement of every unfinished request (TokenEvent{announce}, then announce_done). */
#ifndef PAGODA_TESTS_ROUTER_FAKE_SCHEDULER_H
#define PAGODA_TESTS_ROUTER_FAKE_SCHEDULER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FAKE_SCHED_PIECE_TOKENS 3
#define FAKE_SCHED_ERROR_TOKEN 999999
#define FAKE_SCHED_PEAK_RUNNING_BASE 1000u /* peak_running reported is this + the real peak */

struct fake_sched;

struct fake_sched_counts {
    uint32_t submits;           /* SubmitSeq for an id it did not hold */
    uint32_t repeated_submits;  /* SubmitSeq for an id it held */
    uint32_t resumed;           /* submits that carried output_token_ids */
    uint32_t output_mismatches; /* carried output that differs from the deterministic tokens */
    uint32_t cancels;
    uint32_t stats_requests;
    uint32_t router_hellos;
    uint32_t running;
    int last_has_seed;
    uint64_t last_seed;
    char last_tenant[32];
};

/* The i-th output token of a prompt, and its logprob. */
int32_t fake_sched_token(const int32_t *prompt, size_t n, uint32_t i);
float fake_sched_logprob(uint32_t i);

/* Listens at url and starts answering on a thread of its own. */
int fake_sched_start(const char *url, struct fake_sched **out);
void fake_sched_stop(struct fake_sched *fs);
/* While held, no tokens are sent (submits, cancels and stats are still handled). */
void fake_sched_hold(struct fake_sched *fs, int hold);
/* Sends every event twice, each overlapping the previous one by a token. */
void fake_sched_set_duplicates(struct fake_sched *fs, int on);
void fake_sched_get_counts(struct fake_sched *fs, struct fake_sched_counts *out);

/* A router process with a fake scheduler in a fresh run directory. */
struct rtr_env {
    char dir[64];
    char sched_url[128];
    char url[128]; /* the router's client address (ipc://) */
    pid_t router;
    struct fake_sched *fs;
    const char *argv[32]; /* the router's command line */
};

/* Starts the fake scheduler and pagoda-router (with extra flags, NULL-terminated; may be
 * NULL) and waits until the router reports healthy. Returns 0 or -1. */
int rtr_env_start(struct rtr_env *e, const char *const *extra_args);
/* kill -9 of the router, then starts it again with the same arguments and waits until it reports
 * healthy. Returns 0 or -1. */
int rtr_env_restart_router(struct rtr_env *e);
/* Sends SIGTERM (when the router still runs), waits for it and returns its exit status (or -1
 * when it did not exit normally); stops the fake and removes the run directory. */
int rtr_env_stop(struct rtr_env *e);
/* Waits up to timeout_ms for the router to exit; returns its status, -1 for a signal or -2 for
 * a timeout. */
int rtr_env_wait(struct rtr_env *e, int timeout_ms);

/* Monotonic milliseconds. */
uint64_t rtr_now_ms(void);

#endif
