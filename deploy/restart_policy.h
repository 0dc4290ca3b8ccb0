/* When the supervisor restarts a program that exited, and when it gives up.
 *
 * Pure arithmetic over (how long the program ran), so that the rules are tested without
 * processes or clocks. A program that exits is restarted after a delay that starts at
 * backoff_min_ms and doubles with every exit up to backoff_max_ms; a run of stable_ms or more
 * resets the delay. An exit within fast_exit_ms of the start is a fast exit; max_fast_exits
 * of them in a row mean the program cannot run (a bad flag, a missing model, a crash at load)
 * and the supervisor stops the group instead of restarting it forever. A slower exit resets
 * that count, so a program that crashes every few seconds keeps being restarted, at the
 * longest delay, while the operator reads its log. A program that exits with
 * PAGODA_EXIT_CANNOT_RUN (common/exit_status.h) while the group starts is not restarted at all;
 * once the group has served, such exits are not counted as fast exits (the supervisor clears the
 * count before it asks this policy): the program is tried again, without end. */
#ifndef PAGODA_DEPLOY_RESTART_POLICY_H
#define PAGODA_DEPLOY_RESTART_POLICY_H

#include <stdint.h>

struct restart_policy {
    uint64_t backoff_min_ms; /* the delay before the first restart */
    uint64_t backoff_max_ms; /* the delay doubles up to this */
    uint64_t stable_ms;      /* a run at least this long resets the delay */
    uint64_t fast_exit_ms;   /* an exit sooner than this after the start is a fast exit */
    int max_fast_exits;      /* this many fast exits in a row: give up */
};

/* One program's history; all zero for a program that has not exited yet. */
struct restart_state {
    uint64_t next_backoff_ms; /* 0: the next delay is backoff_min_ms */
    int fast_exits;           /* fast exits in a row */
};

/* The supervisor's policy: 100 ms doubling up to 5 s, reset after 30 s of running; five exits
 * in a row, each within 2 s of its start, give up. */
struct restart_policy restart_policy_default(void);

/* Records that a program exited uptime_ms after it started. Returns 0 and sets *delay_ms to
 * the wait before the restart, or PAGODA_EEXHAUSTED when this was the max_fast_exits-th fast
 * exit in a row (the caller stops the group; *delay_ms is untouched). */
int restart_policy_exit(const struct restart_policy *p, struct restart_state *s, uint64_t uptime_ms,
                        uint64_t *delay_ms);

#endif
