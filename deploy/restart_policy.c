#include "deploy/restart_policy.h"
#include "common/error.h"

struct restart_policy restart_policy_default(void)
{
    struct restart_policy p = {.backoff_min_ms = 100,
                               .backoff_max_ms = 5000,
                               .stable_ms = 30000,
                               .fast_exit_ms = 2000,
                               .max_fast_exits = 5};
    return p;
}

int restart_policy_exit(const struct restart_policy *p, struct restart_state *s, uint64_t uptime_ms,
                        uint64_t *delay_ms)
{
    if (uptime_ms >= p->stable_ms || s->next_backoff_ms == 0)
        s->next_backoff_ms = p->backoff_min_ms;
    if (uptime_ms < p->fast_exit_ms)
        s->fast_exits++;
    else
        s->fast_exits = 0;
    if (s->fast_exits >= p->max_fast_exits)
        return PAGODA_EEXHAUSTED;
    *delay_ms = s->next_backoff_ms;
    /* Doubling saturates at the maximum, so it cannot overflow however long the history. */
    s->next_backoff_ms =
        s->next_backoff_ms >= p->backoff_max_ms / 2 ? p->backoff_max_ms : s->next_backoff_ms * 2;
    return 0;
}
