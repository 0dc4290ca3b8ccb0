/* A stand-in scheduler and a router harness for the router's and the client's tests.
 *
 * The fake scheduler listens on a PAIR socket like the real one and answers every SubmitSeq with
 * TokenEvents of deterministic tokens (fake_sched_token), a few per event, one event per request
 * every couple of milliseconds; it answers StatsRequest with figures of its own. A request whose
 * first prompt token is FAKE_SCHED_ERROR_TOKEN fails (FINISH_ERROR). A resubmission
 * (output_token_ids set) continues from the output it carries. A RouterHello is answered with
 * an announcement of every unfinished request (TokenEvent{announce}, then announce_done).
 *
 * The tenancy: it keeps the last Policy and answers each with PolicyApplied{version, pins} (a pin
 * whose first token is FAKE_SCHED_ERROR_TOKEN fails with PAGODA_ERANGE, any other is ready with
 * num_tokens / FAKE_SCHED_BLOCK_SIZE blocks), unless held. It answers AdminCall{figures} with
 * the figures of fake_sched_tenant_figures for every tenant of the last Policy (in reverse
 * order, plus one tenant the router does not know), fake_sched_namespace_figures for every
 * namespace, and the pins' statuses; AdminCall{flush_namespace: NS} with flushed_blocks
 * 7 + strlen(NS). */
#ifndef PAGODA_TESTS_ROUTER_FAKE_SCHEDULER_H
#define PAGODA_TESTS_ROUTER_FAKE_SCHEDULER_H

#include "proto/internal.pb-c.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define FAKE_SCHED_PIECE_TOKENS 3
#define FAKE_SCHED_ERROR_TOKEN 999999
#define FAKE_SCHED_PEAK_RUNNING_BASE 1000u /* peak_running reported is this + the real peak */
#define FAKE_SCHED_PREFIX_WAITS 7          /* the prefix_waits it reports */
#define FAKE_SCHED_BLOCK_SIZE 4
#define FAKE_SCHED_TRACE_MAX 256

struct fake_sched;

struct fake_sched_counts {
    uint32_t submits;           /* SubmitSeq for an id it did not hold */
    uint32_t repeated_submits;  /* SubmitSeq for an id it held */
    uint32_t resumed;           /* submits that carried output_token_ids */
    uint32_t output_mismatches; /* carried output that differs from the deterministic tokens */
    uint32_t cancels;
    uint32_t stats_requests;
    uint32_t router_hellos;
    uint32_t resends; /* every request sent again after a lost event message */
    uint32_t drops;   /* event messages lost (reported as SchedulerStats.router_drops) */
    uint32_t running;
    int last_has_seed;
    uint64_t last_seed;
    Pagoda__Internal__SamplingParams last_sampling; /* the last new SubmitSeq's (all scalars) */
    char last_tenant[32];
    uint32_t policies;            /* Policy messages */
    uint64_t last_policy_version; /* of the last one */
    uint32_t policies_applied;    /* PolicyApplied messages sent */
    uint32_t admin_calls;
    char last_flush[80]; /* the last AdminCall's flush_namespace */
    /* One letter per message received, in order (P policy, H hello, S submit, C cancel, T stats,
     * A admin call), the first FAKE_SCHED_TRACE_MAX - 1 of them. */
    char trace[FAKE_SCHED_TRACE_MAX];
};

/* The figures the fake reports for a tenant: lookups 10 + n, hits 2 + n, query_tokens 100 * n
 * and hit_tokens 10 * n * n where n is the name's length (query and hit tokens 0 for a name that
 * starts with 'z'); running is its unfinished requests, waiting 3. */
struct fake_figures {
    uint64_t lookups, hits, query_tokens, hit_tokens;
    uint32_t running, waiting;
};
void fake_sched_tenant_figures(const char *tenant, struct fake_figures *out);
/* And for a namespace: cached_blocks 3 * strlen(ns), evictions strlen(ns), inserted 100. */
void fake_sched_namespace_figures(const char *ns, uint32_t *cached_blocks, uint64_t *evictions);

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
/* The K/V element its stats name (internal.proto DType; F32 at start, -1: none). */
void fake_sched_set_kv_dtype(struct fake_sched *fs, int dtype);
/* The next n event messages are lost, as on a full link; each loss is made good as the real
 * scheduler's are, by sending every request again from offset 0 (counts.resends). */
void fake_sched_lose_events(struct fake_sched *fs, int n);
void fake_sched_get_counts(struct fake_sched *fs, struct fake_sched_counts *out);
/* While held, Policies are kept but not answered; when released, the last one is. */
void fake_sched_hold_policy(struct fake_sched *fs, int hold);
/* While paused, it reads nothing from its socket (a scheduler whose loop stalls): what the router
 * sends piles up in the link's buffers. */
void fake_sched_pause(struct fake_sched *fs, int on);
/* While held, StatsRequests are dropped unanswered (with fake_sched_hold: a hung scheduler). */
void fake_sched_hold_stats(struct fake_sched *fs, int hold);
/* While held, AdminCalls are counted and not answered. */
void fake_sched_hold_admin(struct fake_sched *fs, int hold);
/* The last Policy received (free with pagoda__internal__policy__free_unpacked), or NULL. */
Pagoda__Internal__Policy *fake_sched_last_policy(struct fake_sched *fs);

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

/* Runs pagoda-router --check (its start's checks of files, then exit) with the extra flags
 * (NULL-terminated), its standard error in err. Returns its exit status, or -1. */
int rtr_router_check(const char *const *extra_args, char *err, size_t err_size);

/* Monotonic milliseconds. */
uint64_t rtr_now_ms(void);

#endif
