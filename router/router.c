/* The router (router.h): its lifecycle (open, drain, close), the loop's housekeeping tick, and
 * the helpers its files share. The rest is in the files router_internal.h lists: the REP front
 * (router_front.c), the request registry and the client calls on requests (router_registry.c),
 * the scheduler link (router_link.c), the tenancy, the admin API and the text side. */
#include "router/router.h"
#include "router/router_internal.h"

#include "common/error.h"
#include "common/log.h"
#include "wire/wire.h"

#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>

/* The housekeeping tick: resends what the link refused, expires results, checks a drain. */
#define HOUSEKEEPING_MS 100
/* How often the live requests are looked over for abandoned ones (registry_cancel_abandoned). */
#define ABANDON_CHECK_MS 1000

/* A drain waits this long for a client to fetch a result that finished during the drain. */
#define DRAIN_LINGER_MS 2000

/* ---- small helpers --------------------------------------------------------------------------- */

void router_config_default(struct router_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->num_contexts = ROUTER_DEFAULT_CONTEXTS;
    cfg->max_parked_calls = ROUTER_DEFAULT_MAX_PARKED_CALLS;
    cfg->max_connections = ROUTER_DEFAULT_MAX_CONNECTIONS;
    cfg->idle_timeout_ms = ROUTER_DEFAULT_IDLE_TIMEOUT_MS;
    cfg->max_live_requests = ROUTER_DEFAULT_MAX_LIVE_REQUESTS;
    cfg->max_finished_requests = ROUTER_DEFAULT_MAX_FINISHED_REQUESTS;
    cfg->finished_ttl_ms = ROUTER_DEFAULT_FINISHED_TTL_MS;
    cfg->max_prompt_tokens = ROUTER_DEFAULT_MAX_PROMPT_TOKENS;
    cfg->max_new_tokens = ROUTER_DEFAULT_MAX_NEW_TOKENS;
    cfg->max_wait_ms = ROUTER_DEFAULT_MAX_WAIT_MS;
    cfg->stats_timeout_ms = ROUTER_DEFAULT_STATS_TIMEOUT_MS;
    cfg->admin_timeout_ms = ROUTER_DEFAULT_ADMIN_TIMEOUT_MS;
    cfg->drain_timeout_ms = ROUTER_DEFAULT_DRAIN_TIMEOUT_MS;
    cfg->abandon_ms = ROUTER_DEFAULT_ABANDON_MS;
    cfg->sampling_defaults = sampling_params_default();
}

size_t router_max_message_bytes(uint32_t max_prompt_tokens)
{
    size_t n =
        (size_t)max_prompt_tokens * ROUTER_BYTES_PER_PROMPT_TOKEN + ROUTER_MESSAGE_OVERHEAD_BYTES;
    return n < ROUTER_MAX_CLIENT_MESSAGE_BYTES ? n : ROUTER_MAX_CLIENT_MESSAGE_BYTES;
}

void router_id_hex(const uint8_t *id, char out[2 * ID_BYTES + 1])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < ID_BYTES; i++) {
        out[2 * i] = digits[id[i] >> 4];
        out[2 * i + 1] = digits[id[i] & 15];
    }
    out[2 * ID_BYTES] = '\0';
}

uint64_t router_random_u64(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) {
        /* getrandom on Linux only fails before the entropy pool is ready; a seed or a hash
         * key from the clock is still a valid one. */
        v = (uint64_t)uv_hrtime() * 0x9E3779B97F4A7C15ull;
    }
    return v;
}

/* ---- the loop -------------------------------------------------------------------------------- */

/* Loop thread: the link changed, or calls are waiting in the mailbox. The one door between NNG's
 * threads and the loop: the link's pipe callbacks (router_link.c) and the contexts' receives
 * (router_front.c) both wake it. */
static void on_async(uv_async_t *h)
{
    struct router *r = h->data;
    link_on_async(r);
    front_on_mail(r);
}

static void drain_check(struct router *r)
{
    if (!r->draining || r->drained_fn == NULL)
        return;
    uint64_t now = uv_now(r->loop);
    int done = r->live.count == 0 && r->text_waiters == NULL; /* Tokenize calls answered too */
    for (struct request *q = r->finished.tail; done && q != NULL; q = q->prev) {
        if (now - q->finished_at_ms >= DRAIN_LINGER_MS)
            break; /* the list is in finishing order: all older ones had their time */
        if (!q->delivered)
            done = 0;
    }
    if (done || now >= r->drain_deadline_ms) {
        router_drained_fn fn = r->drained_fn;
        r->drained_fn = NULL;
        if (!done)
            log_warn("drain timed out with %u requests unfinished", r->live.count);
        fn(r->drained_arg, done);
    }
}

static void on_housekeeping(uv_timer_t *t)
{
    struct router *r = t->data;
    link_tick(r);
    router_flush_pending(r);
    front_close_idle(r, r->cfg.idle_timeout_ms);
    front_ensure_contexts(r); /* retries a context that could not be opened */
    uint64_t now = uv_now(r->loop);
    while (r->finished.head != NULL &&
           now - r->finished.head->finished_at_ms >= r->cfg.finished_ttl_ms)
        registry_drop(r, r->finished.head);
    if (r->cfg.abandon_ms > 0 && now - r->abandon_checked_ms >= ABANDON_CHECK_MS) {
        r->abandon_checked_ms = now;
        registry_cancel_abandoned(r, now);
    }
    drain_check(r);
}

void router_drain(struct router *r, router_drained_fn done, void *arg)
{
    if (r->draining)
        return;
    r->draining = 1;
    r->drain_deadline_ms = uv_now(r->loop) + r->cfg.drain_timeout_ms;
    r->drained_fn = done;
    r->drained_arg = arg;
    log_info("draining: %u requests still running", r->live.count);
    drain_check(r);
}

int router_reload(struct router *r)
{
    return tenancy_reload_start(r, 1);
}

/* ---- lifecycle ------------------------------------------------------------------------------- */

static void router_free(struct router *r)
{
    router_text_router_closing(r);
    struct req_list *lists[2] = {&r->live, &r->finished};
    for (int l = 0; l < 2; l++) {
        struct request *q = lists[l]->head;
        while (q != NULL) {
            struct request *next = q->next;
            registry_request_free(r, q);
            q = next;
        }
    }
    free(r->buckets);
    free(r->alias_buckets);
    link_free_engines(r);
    front_pipes_free(r->pipes);
    tenancy_close(r);
    router_text_close(r);
    if (r->lock_init)
        pthread_mutex_destroy(&r->lock);
    free(r->run_dir);
    free(r->listen_url);
    free(r);
}

static void on_handle_closed(uv_handle_t *h)
{
    struct router *r = h->data;
    if (--r->handles_open == 0)
        router_free(r);
}

static void on_ctx_timer_closed(uv_handle_t *h)
{
    struct rctx *c = h->data;
    struct router *r = c->r;
    if (c->admin_acc != NULL)
        protobuf_c_message_free_unpacked(&c->admin_acc->base, NULL);
    free(c);
    if (--r->handles_open == 0)
        router_free(r);
}

void router_close(struct router *r)
{
    if (r == NULL)
        return;
    atomic_store(&r->closing, 1);
    /* Stop the aios first: nng_aio_stop waits for a running callback, and none re-arms after
     * closing is set. */
    for (struct rctx *c = r->ctxs; c != NULL; c = c->all_next)
        nng_aio_stop(c->aio);
    /* Then the sockets (the engines' inboxes first). */
    link_close_engines(r);
    if (r->rep_open)
        nng_close(r->rep);
    /* Then free what the contexts held, and close the loop's handles. */
    pthread_mutex_lock(&r->lock);
    r->mail_head = r->mail_tail = NULL;
    pthread_mutex_unlock(&r->lock);
    r->handles_open = 1; /* held until every close below is issued */
    struct rctx *next;
    for (struct rctx *c = r->ctxs; c != NULL; c = next) {
        next = c->all_next;
        if (c->aio != NULL)
            nng_aio_free(c->aio);
        c->aio = NULL;
        nng_msg_free(c->msg);
        c->msg = NULL;
        if (c->park != PARK_NONE)
            router_unpark(c);
        r->handles_open++;
        uv_close((uv_handle_t *)&c->timer, on_ctx_timer_closed);
    }
    if (r->async_init) {
        r->handles_open++;
        uv_close((uv_handle_t *)&r->async, on_handle_closed);
    }
    if (r->timer_init) {
        r->handles_open++;
        uv_close((uv_handle_t *)&r->housekeeping, on_handle_closed);
    }
    if (--r->handles_open == 0)
        router_free(r);
}

/* The file descriptor limit bounds the connections: the cap stays ROUTER_RESERVED_FDS below it
 * (pagoda-router raises its soft limit to the hard one at start). */
static uint32_t connection_cap(uint32_t wanted)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY)
        return wanted;
    rlim_t room =
        rl.rlim_cur > 2 * ROUTER_RESERVED_FDS ? rl.rlim_cur - ROUTER_RESERVED_FDS : rl.rlim_cur / 2;
    if (room < 1)
        room = 1;
    if ((rlim_t)wanted > room) {
        log_warn("%u client connections asked, %llu fit the descriptor limit of %llu: capped",
                 wanted, (unsigned long long)room, (unsigned long long)rl.rlim_cur);
        return (uint32_t)room;
    }
    return wanted;
}

static int check_config(const struct router_config *cfg)
{
    if (cfg->run_dir == NULL && cfg->scheduler_url == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "router: a run directory or a scheduler address "
                                               "is needed");
    if (cfg->listen_url == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "router: no listen address");
    if (cfg->admin_timeout_ms < 1 || cfg->admin_timeout_ms > ROUTER_MAX_ADMIN_TIMEOUT_MS)
        return pagoda_error_set(PAGODA_ERANGE, "router: admin timeout %u ms, outside [1, %u]",
                                cfg->admin_timeout_ms, ROUTER_MAX_ADMIN_TIMEOUT_MS);
    if (cfg->num_contexts < 1 || cfg->num_contexts > 65536)
        return pagoda_error_set(PAGODA_ERANGE, "router: %u contexts, outside [1, 65536]",
                                cfg->num_contexts);
    if (cfg->max_parked_calls < 1 || cfg->max_parked_calls > ROUTER_MAX_CONTEXTS / 2)
        return pagoda_error_set(PAGODA_ERANGE, "router: %u parked calls, outside [1, %u]",
                                cfg->max_parked_calls, ROUTER_MAX_CONTEXTS / 2);
    if (cfg->max_connections < 1 || cfg->max_connections > (1u << 20))
        return pagoda_error_set(PAGODA_ERANGE, "router: %u connections, outside [1, 2^20]",
                                cfg->max_connections);
    if (cfg->idle_timeout_ms < 1)
        return pagoda_error_set(PAGODA_ERANGE, "router: the idle timeout must be >= 1 ms");
    if (cfg->max_live_requests < 1 || cfg->max_live_requests > (1u << 24) ||
        cfg->max_finished_requests < 1 || cfg->max_finished_requests > (1u << 24))
        return pagoda_error_set(
            PAGODA_ERANGE, "router: request limits must be in [1, 2^24] (live %u, finished %u)",
            cfg->max_live_requests, cfg->max_finished_requests);
    if (cfg->max_prompt_tokens < 1 || cfg->max_new_tokens < 1 ||
        cfg->max_new_tokens > (uint32_t)INT32_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "router: token limits must be >= 1");
    return 0;
}

int router_open(uv_loop_t *loop, const struct router_config *cfg, struct router **out)
{
    int rc = check_config(cfg);
    if (rc != 0)
        return rc;
    struct router *r = calloc(1, sizeof(*r));
    if (r == NULL)
        return PAGODA_ENOMEM;
    r->loop = loop;
    uv_update_time(loop);
    r->started_ms = uv_now(loop);
    r->cfg = *cfg;
    r->run_dir = cfg->run_dir ? strdup(cfg->run_dir) : NULL;
    r->listen_url = strdup(cfg->listen_url);
    r->cfg.run_dir = r->run_dir;
    r->cfg.listen_url = r->listen_url;
    r->cfg.tenants_file = NULL;
    r->num_buckets = 1024;
    while (r->num_buckets < 2 * ((size_t)cfg->max_live_requests + cfg->max_finished_requests))
        r->num_buckets *= 2;
    r->buckets = calloc(r->num_buckets, sizeof(*r->buckets));
    r->alias_buckets = calloc(r->num_buckets, sizeof(*r->alias_buckets));
    r->prompt_limit_cfg = cfg->max_prompt_tokens;
    r->max_ctxs = 2 * cfg->num_contexts + cfg->max_parked_calls;
    r->cfg.max_connections = connection_cap(cfg->max_connections);
    r->pipes = front_pipes_new(r->cfg.max_connections);
    if ((cfg->run_dir != NULL && r->run_dir == NULL) || r->listen_url == NULL ||
        r->buckets == NULL || r->alias_buckets == NULL || r->pipes == NULL) {
        rc = PAGODA_ENOMEM;
        goto fail;
    }
    r->hash_seed = router_random_u64();
    r->id_seed = router_random_u64();
    if ((rc = tenancy_open(r, cfg->tenants_file)) != 0)
        goto fail;
    if (pthread_mutex_init(&r->lock, NULL) != 0) {
        rc = pagoda_error_set(PAGODA_EIO, "router: pthread_mutex_init failed");
        goto fail;
    }
    r->lock_init = 1;
    if (uv_async_init(loop, &r->async, on_async) != 0) {
        rc = pagoda_error_set(PAGODA_EIO, "router: uv_async_init failed");
        goto fail;
    }
    r->async.data = r;
    r->async_init = 1;
    uv_timer_init(loop, &r->housekeeping);
    r->housekeeping.data = r;
    r->timer_init = 1;
    rc = link_open_engines(r); /* copies cfg's addresses */
    r->cfg.scheduler_url = NULL;
    r->cfg.scheduler_urls = NULL;
    r->cfg.routing = NULL;
    if (rc != 0)
        goto fail;
    if ((rc = front_open(r)) != 0)
        goto fail;
    uv_timer_start(&r->housekeeping, on_housekeeping, HOUSEKEEPING_MS, HOUSEKEEPING_MS);
    /* Taken once nothing can fail (it stays the caller's on error); no call is served before
     * the loop runs. */
    router_text_adopt(r, cfg->text);
    r->cfg.text = NULL;
    *out = r;
    return 0;

fail:
    if (r->async_init)
        router_close(r); /* frees r once the loop has closed the handles */
    else
        router_free(r);
    return rc;
}
