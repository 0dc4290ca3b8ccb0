/* The scheduler link (router_internal.h): the PAIR socket the router dials, what goes to the
 * scheduler (submits, cancels, the RouterHello, stats requests; the Policy is router_tenancy.c's)
 * and is sent again when it was refused or when a scheduler (new or restarted) joins, and what
 * comes back: token events (with the announcement of a restarted router's requests), stats for
 * the Stats calls parked, ModelInfo (which bounds prompts), and the admin API's answers, which go
 * to router_admin.c. */
#include "router/router_internal.h"

#include "common/dtype.h"
#include "common/error.h"
#include "common/log.h"
#include "wire/sampling_wire.h"
#include "wire/wire.h"

#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Messages each engine link queues in each direction, so that a burst of submits or events is
 * not refused by a non-blocking send while the pipe is busy. */
#define LINK_BUFFER_MESSAGES 1024
/* How often each engine is asked for its stats when there are several: its load for routing, and
 * its liveness (an engine from which nothing comes within stats_timeout_ms is hung). */
#define ENGINE_PROBE_MS 250
/* The probes in a row an engine must leave unanswered (on top of stats_timeout_ms of silence)
 * before it is hung: a router loop that stalled and sent none is not the engine's fault. */
#define ENGINE_HUNG_MISSED_PROBES 3

/* ---- what goes to the schedulers ------------------------------------------------------------- */

/* Whether a scheduler is on e's link, as far as the loop knows: a pipe that joined is only
 * counted once on_link_joined has run for it, so that it sees every unfinished request exactly
 * once. */
int engine_linked(const struct engine *e)
{
    return e->gen_seen == atomic_load(&((struct engine *)e)->gen) &&
           atomic_load(&((struct engine *)e)->pipes) > 0;
}

/* Linked and not hung: requests may go there. */
static int engine_usable(const struct engine *e)
{
    return engine_linked(e) && !e->hung;
}

int router_link_up(struct router *r)
{
    for (uint32_t i = 0; i < r->num_engines; i++)
        if (engine_usable(&r->engines[i]))
            return 1;
    return 0;
}

struct engine *router_any_engine(struct router *r)
{
    for (uint32_t i = 0; i < r->num_engines; i++)
        if (engine_usable(&r->engines[i]))
            return &r->engines[i];
    return NULL;
}

static int send_submit(struct engine *e, struct request *q)
{
    struct router *r = e->r;
    Pagoda__Internal__SamplingParams sp = sampling_to_internal(&q->p.sampling);
    const struct logit_bias bias = {(int32_t)q->p.num_bias, q->bias_ids, q->bias_values};
    logit_bias_to_internal(&bias, &sp);

    Pagoda__Internal__SubmitSeq sub = PAGODA__INTERNAL__SUBMIT_SEQ__INIT;
    sub.has_request_id = 1;
    sub.request_id.data = q->sched_id;
    sub.request_id.len = ID_BYTES;
    sub.tenant = r->slots[q->tenant].name;
    sub.n_prompt_token_ids = q->p.num_prompt;
    sub.prompt_token_ids = q->prompt;
    sub.sampling = &sp;
    sub.has_max_tokens = 1;
    sub.max_tokens = q->p.max_tokens;
    sub.has_strict_max_tokens = q->p.strict_max_tokens != 0;
    sub.strict_max_tokens = q->p.strict_max_tokens != 0;
    sub.n_stop_token_ids = q->p.num_stop;
    sub.stop_token_ids = q->stop_ids;
    sub.has_ignore_eos = 1;
    sub.ignore_eos = q->p.ignore_eos;
    sub.has_logprobs = q->p.logprobs != 0;
    sub.logprobs = q->p.logprobs != 0;
    sub.has_router_text = q->router_text != NULL;
    sub.router_text.data = q->router_text;
    sub.router_text.len = q->router_text_len;
    sub.n_output_token_ids = q->num_tokens;
    sub.output_token_ids = q->tokens;
    sub.has_client_request_id = 1;
    sub.client_request_id.data = q->id;
    sub.client_request_id.len = ID_BYTES;

    Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_SUBMIT;
    env.submit = &sub;
    return router_send(e, &env);
}

static int send_cancel(struct engine *e, const uint8_t *sched_id)
{
    Pagoda__Internal__CancelSeq cancel = PAGODA__INTERNAL__CANCEL_SEQ__INIT;
    cancel.has_request_id = 1;
    cancel.request_id.data = (uint8_t *)sched_id;
    cancel.request_id.len = ID_BYTES;
    Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_CANCEL;
    env.cancel = &cancel;
    return router_send(e, &env);
}

static int send_hello(struct engine *e)
{
    Pagoda__Internal__RouterHello hello = PAGODA__INTERNAL__ROUTER_HELLO__INIT;
    Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_ROUTER_HELLO;
    env.router_hello = &hello;
    return router_send(e, &env);
}

static int send_stats_request(struct engine *e, uint64_t cookie)
{
    Pagoda__Internal__StatsRequest sreq = PAGODA__INTERNAL__STATS_REQUEST__INIT;
    sreq.has_cookie = 1;
    sreq.cookie = cookie;
    Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS;
    env.stats = &sreq;
    return router_send(e, &env);
}

int router_send(struct engine *e, Pagoda__Internal__ToScheduler *env)
{
    env->has_protocol_version = 1;
    env->protocol_version = WIRE_PROTOCOL_VERSION;
    int rc = wire_send(e->link, &env->base);
    if (rc != 0)
        e->sends_refused++;
    return rc;
}

/* The namespace of q's tenant (the scheduler's prefix cache's, so routing keeps tenants apart
 * exactly as the cache does: a group's tenants share theirs). */
static const char *request_namespace(const struct router *r, const struct request *q)
{
    if (r->tenants == NULL)
        return "t:" ROUTER_DEFAULT_TENANT;
    const struct router_tenant *tn = router_tenants_find(r->tenants, r->slots[q->tenant].name);
    return tn != NULL ? tn->namespace_name : r->slots[q->tenant].name;
}

/* The engine q goes to now: the one it is on while that is usable; otherwise (new, or its engine
 * is down and another is usable) the one routing picks. NULL when none is usable: q waits (with
 * one engine, for its scheduler to come back). An adopted request without its prompt never
 * moves. */
static struct engine *request_engine(struct router *r, struct request *q)
{
    uint32_t old = q->engine;
    if (old != ROUTE_NONE && (engine_usable(&r->engines[old]) || q->no_prompt))
        return engine_usable(&r->engines[old]) ? &r->engines[old] : NULL;
    /* Neither an engine that is not usable now (routing's view may lag its link) nor one whose
     * copy of q may still run (q->left). */
    uint64_t avoid = q->left;
    for (uint32_t i = 0; i < r->num_engines; i++)
        if (!engine_usable(&r->engines[i]))
            avoid |= 1ull << i;
    uint32_t pick = route_pick_avoiding(r->route, request_namespace(r, q), q->prompt,
                                        q->p.num_prompt, avoid, NULL);
    if (pick == ROUTE_NONE)
        return NULL;
    if (old != ROUTE_NONE) {
        char hex[2 * ID_BYTES + 1];
        router_id_hex(q->id, hex);
        log_info("request %s moves from engine %u to engine %u with %u tokens of output", hex, old,
                 pick, q->num_tokens);
        route_release(r->route, old);
        /* Its copy there is told to stop now when the link is there (a hung engine reads it when
         * it answers again; best effort: its later events ask again, and so does its return). */
        q->left |= 1ull << old;
        if (engine_linked(&r->engines[old]))
            send_cancel(&r->engines[old], q->sched_id);
    }
    q->engine = pick;
    r->engines[pick].routed++;
    return &r->engines[pick];
}

void link_request_done(struct router *r, struct request *q)
{
    if (q->engine != ROUTE_NONE)
        route_release(r->route, q->engine);
}

/* Sends what is still to be sent to the engines, while their links take it. A refused send
 * stays pending for the next housekeeping tick, and nothing more is tried on that engine's link
 * in this pass: its buffer is full, and every further SubmitSeq would be packed only to be
 * refused (a pass over thousands of pending prompts then cost every Submit tens of
 * milliseconds). The Policy goes first on each link: nothing is submitted under an older
 * tenancy than the router's (but nothing waits for the scheduler to apply it either: only admin
 * calls do). */
void router_flush_pending(struct router *r)
{
    uint64_t full = 0; /* bit e: engine e refused a send in this pass */
    int any = 0;
    for (uint32_t i = 0; i < r->num_engines; i++) {
        struct engine *e = &r->engines[i];
        if (!engine_linked(e))
            continue;
        if (e->need_policy && tenancy_send_policy(r, e) == 0)
            e->need_policy = 0;
        if (!e->need_policy && e->need_hello && send_hello(e) == 0)
            e->need_hello = 0;
        any |= !e->need_policy;
    }
    if (!any || r->num_pending == 0)
        return;
    struct req_list *lists[2] = {&r->live, &r->finished};
    for (int l = 0; l < 2; l++) {
        for (struct request *q = lists[l]->head; q != NULL && r->num_pending > 0; q = q->next) {
            if (q->need_submit) {
                struct engine *e = request_engine(r, q);
                if (e != NULL && !e->need_policy && !(full & (1ull << e->index))) {
                    if (send_submit(e, q) == 0)
                        registry_set_pending(r, q, &q->need_submit, 0);
                    else
                        full |= 1ull << e->index;
                }
            }
            if (q->need_cancel) {
                if (q->engine == ROUTE_NONE) {
                    registry_set_pending(r, q, &q->need_cancel, 0); /* never sent anywhere */
                } else {
                    struct engine *e = &r->engines[q->engine];
                    if (engine_linked(e) && !e->need_policy && !(full & (1ull << e->index))) {
                        if (send_cancel(e, q->sched_id) == 0)
                            registry_set_pending(r, q, &q->need_cancel, 0);
                        else
                            full |= 1ull << e->index;
                    }
                }
            }
        }
    }
}

/* A pipe joined e's link: a scheduler (new or restarted) is there. It may not know the tenancy,
 * so the current Policy goes first; nor its unfinished requests, so each is sent again with the
 * output it already has; and this router may not know the scheduler's (after a router restart),
 * so a RouterHello asks for them. */
static void on_link_joined(struct router *r, struct engine *e)
{
    uint32_t n = 0;
    uint64_t bit = 1ull << e->index;
    for (struct request *q = r->live.head; q != NULL; q = q->next) {
        q->heard &= ~bit; /* its announcement tells which copies it holds */
        if (q->job == NULL && q->engine == e->index) { /* a prompt being tokenized goes later */
            registry_set_pending(r, q, &q->need_submit, 1);
            n++;
        }
    }
    if (r->num_engines == 1)
        log_info("scheduler link up (%s): sending %u unfinished requests", e->url, n);
    else
        log_info("engine %u up (%s): sending its %u unfinished requests", e->index, e->url, n);
    e->hung = 0;
    e->heard_ms = uv_now(r->loop);
    e->probes_unanswered = 0;
    tenancy_on_link_up(r, e);
    e->need_hello = 1;
}

/* e stopped being usable (its link went down, or it is hung): its unfinished requests are marked
 * to be sent again, whether or not another engine is usable now. router_flush_pending sends each
 * to the first engine usable again: another one (routing picks it), or e itself when it comes
 * back first (with one engine: today's behaviour, they are resent when it comes back). Marking
 * them now rather than when another engine is usable is what keeps them from being stranded when
 * every engine is down at once and one other than e returns. */
static void stats_on_engine_down(struct router *r, struct engine *e);

static void on_engine_down(struct router *r, struct engine *e)
{
    uint32_t n = 0;
    for (struct request *q = r->live.head; q != NULL; q = q->next)
        if (q->engine == e->index && q->job == NULL && !q->no_prompt) {
            registry_set_pending(r, q, &q->need_submit, 1);
            n++;
        }
    if (r->num_engines > 1)
        log_warn("engine %u (%s) is %s: %u unfinished requests move to another engine once one "
                 "is usable",
                 e->index, e->url, e->hung ? "not answering" : "down", n);
    /* The calls waiting for it are answered with the other engines' figures; with one engine
     * they wait for their timeout, as they always did. */
    if (r->num_engines > 1) {
        stats_on_engine_down(r, e);
        admin_on_engine_down(r, e);
    }
}

/* e is usable again: the copies it may still run of requests that moved away from it are told
 * to stop (again), so that their end events come and those requests may go back there. */
static void cancel_left_copies(struct router *r, struct engine *e)
{
    uint64_t bit = 1ull << e->index;
    for (struct request *q = r->live.head; q != NULL; q = q->next)
        if ((q->left & bit) && q->engine != e->index)
            send_cancel(e, q->sched_id);
}

/* Brings each engine's state up to date with its link: joined, down, or back. */
static void engines_update(struct router *r)
{
    int changed = 0;
    for (uint32_t i = 0; i < r->num_engines; i++) {
        struct engine *e = &r->engines[i];
        unsigned gen = atomic_load(&e->gen);
        if (gen != e->gen_seen) {
            e->gen_seen = gen;
            on_link_joined(r, e);
            changed = 1;
        }
        int up = engine_usable(e);
        if (up != e->up) {
            e->up = up;
            route_set_up(r->route, i, up);
            if (!up)
                on_engine_down(r, e);
            else
                cancel_left_copies(r, e);
            changed = 1;
        }
    }
    if (changed)
        router_flush_pending(r);
}

void link_on_async(struct router *r)
{
    engines_update(r);
}

/* The liveness probes (with several engines; one engine keeps today's behaviour: never hung) and
 * the loads routing uses. */
void link_tick(struct router *r)
{
    uint64_t now = uv_now(r->loop);
    for (uint32_t i = 0; r->num_engines > 1 && i < r->num_engines; i++) {
        struct engine *e = &r->engines[i];
        if (!engine_linked(e))
            continue;
        if (!e->hung && e->probes_unanswered >= ENGINE_HUNG_MISSED_PROBES &&
            now - e->heard_ms >= r->cfg.stats_timeout_ms)
            e->hung = 1;
        if (now - e->probe_sent_ms >= ENGINE_PROBE_MS && send_stats_request(e, 0) == 0) {
            e->probe_sent_ms = now;
            e->probes_unanswered++;
        }
    }
    engines_update(r);
}

/* NNG thread: an engine link's pipes come and go. */
static void on_link_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    struct engine *e = arg;
    if (ev == NNG_PIPE_EV_ADD_POST) {
        atomic_fetch_add(&e->pipes, 1);
        atomic_fetch_add(&e->gen, 1);
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        atomic_fetch_sub(&e->pipes, 1);
    }
    if (!atomic_load(&e->r->closing))
        uv_async_send(&e->r->async);
}

/* Opens one engine link by hand rather than with wire_pair_open: the pipe notifications that
 * tell the router when a scheduler is there must be registered before the dial. */
static int engine_dial(struct engine *e)
{
    int rv = nng_pair1_open(&e->link);
    if (rv != 0)
        return wire_error(rv, "nng_pair1_open");
    e->link_open = 1;
    if ((rv = nng_socket_set_size(e->link, NNG_OPT_RECVMAXSZ, WIRE_MAX_MESSAGE_BYTES)) != 0 ||
        (rv = nng_socket_set_int(e->link, NNG_OPT_SENDBUF, LINK_BUFFER_MESSAGES)) != 0 ||
        (rv = nng_socket_set_int(e->link, NNG_OPT_RECVBUF, LINK_BUFFER_MESSAGES)) != 0 ||
        (rv = nng_socket_set_ms(e->link, NNG_OPT_RECONNMINT, 20)) != 0 ||
        (rv = nng_socket_set_ms(e->link, NNG_OPT_RECONNMAXT, 100)) != 0)
        return wire_error(rv, "scheduler link options");
    if ((rv = nng_pipe_notify(e->link, NNG_PIPE_EV_ADD_POST, on_link_pipe, e)) != 0 ||
        (rv = nng_pipe_notify(e->link, NNG_PIPE_EV_REM_POST, on_link_pipe, e)) != 0)
        return wire_error(rv, "nng_pipe_notify");
    if ((rv = nng_dial(e->link, e->url, NULL, NNG_FLAG_NONBLOCK)) != 0)
        return wire_error(rv, e->url);
    return wire_inbox_open(e->r->loop, e->link, link_on_msg, e, &e->inbox);
}

int link_open_engines(struct router *r)
{
    const struct router_config *cfg = &r->cfg;
    uint32_t n = cfg->num_scheduler_urls > 0 ? cfg->num_scheduler_urls : 1;
    enum route_mode mode = ROUTE_CACHE_AWARE;
    int rc;
    if (n > ROUTE_MAX_ENGINES)
        return pagoda_error_set(PAGODA_ERANGE, "router: at most %u schedulers (got %u)",
                                ROUTE_MAX_ENGINES, n);
    if (cfg->routing != NULL && (rc = route_mode_parse(cfg->routing, &mode)) != 0)
        return rc;
    r->routing = mode;
    r->engines = calloc(n, sizeof(*r->engines));
    if (r->engines == NULL)
        return PAGODA_ENOMEM;
    r->num_engines = n;
    for (uint32_t i = 0; i < n; i++) {
        struct engine *e = &r->engines[i];
        e->r = r;
        e->index = i;
        const char *url = cfg->num_scheduler_urls > 0 ? cfg->scheduler_urls[i] : cfg->scheduler_url;
        if (url != NULL) {
            int len = snprintf(e->url, sizeof(e->url), "%s", url);
            if (len < 0 || (size_t)len >= sizeof(e->url))
                return pagoda_error_set(PAGODA_ERANGE, "router: scheduler address too long");
        } else if ((rc = wire_ipc_url(e->url, sizeof(e->url), cfg->run_dir, "scheduler.ipc")) !=
                   0) {
            return rc;
        }
    }
    if ((rc = route_new(n, mode, ROUTE_DEFAULT_MAX_ENTRIES, router_random_u64(), &r->route)) != 0)
        return rc;
    for (uint32_t i = 0; i < n; i++)
        if ((rc = engine_dial(&r->engines[i])) != 0)
            return rc;
    if (n > 1)
        log_info("%u engines, %s routing", n, route_mode_name(mode));
    return 0;
}

void link_close_engines(struct router *r)
{
    for (uint32_t i = 0; i < r->num_engines; i++) {
        struct engine *e = &r->engines[i];
        wire_inbox_close(e->inbox);
        e->inbox = NULL;
    }
    for (uint32_t i = 0; i < r->num_engines; i++) {
        struct engine *e = &r->engines[i];
        if (e->link_open)
            nng_close(e->link);
        e->link_open = 0;
    }
}

void link_free_engines(struct router *r)
{
    for (uint32_t i = 0; r->engines != NULL && i < r->num_engines; i++)
        if (r->engines[i].stats != NULL)
            protobuf_c_message_free_unpacked(&r->engines[i].stats->base, NULL);
    free(r->engines);
    r->engines = NULL;
    route_free(r->route);
    r->route = NULL;
}

/* ---- events ---------------------------------------------------------------------------------- */

/* Appends one token; a request never holds more than max_tokens. */
static int append_token(struct request *q, int32_t token, float logprob)
{
    if (q->num_tokens == q->cap_tokens) {
        uint32_t cap = q->cap_tokens ? 2 * q->cap_tokens : 16;
        if (cap > (uint32_t)q->p.max_tokens)
            cap = (uint32_t)q->p.max_tokens;
        int32_t *t = realloc(q->tokens, cap * sizeof(*t));
        if (t == NULL)
            return PAGODA_ENOMEM;
        q->tokens = t;
        float *l = realloc(q->logprobs, cap * sizeof(*l));
        if (l == NULL)
            return PAGODA_ENOMEM;
        q->logprobs = l;
        q->cap_tokens = cap;
    }
    q->tokens[q->num_tokens] = token;
    q->logprobs[q->num_tokens] = logprob;
    q->num_tokens++;
    return 0;
}

static Pagoda__FinishReason finish_from_internal(Pagoda__Internal__FinishReason f)
{
    switch (f) {
    case PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP:
        return PAGODA__FINISH_REASON__FINISH_STOP;
    case PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH:
        return PAGODA__FINISH_REASON__FINISH_LENGTH;
    case PAGODA__INTERNAL__FINISH_REASON__FINISH_CANCELLED:
        return PAGODA__FINISH_REASON__FINISH_CANCELLED;
    case PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE:
        return PAGODA__FINISH_REASON__FINISH_NONE;
    default:
        return PAGODA__FINISH_REASON__FINISH_ERROR;
    }
}

/* An engine's announcement is complete; once every engine's is, polls parked for unknown ids are
 * answered. */
static void on_announced(struct router *r, struct engine *e)
{
    /* The copies it did not announce are not there (a restarted scheduler): the requests that
     * left it may go back. */
    uint64_t bit = 1ull << e->index;
    for (struct request *q = r->live.head; q != NULL; q = q->next)
        if ((q->left & bit) && !(q->heard & bit))
            q->left &= ~bit;
    e->announced = 1;
    for (uint32_t i = 0; i < r->num_engines; i++)
        if (!r->engines[i].announced)
            return;
    if (!r->announced)
        log_info("the scheduler's announcement arrived: %u unfinished requests held",
                 r->live.count);
    r->announced = 1;
    while (r->unknown_waiters != NULL)
        registry_unpark_unknown(r->unknown_waiters, 0);
}

/* Appends an event's new tokens (those beyond what the request holds: a resent or overlapping
 * event adds nothing twice), records its end, and answers the polls waiting on it. */
static void apply_event(struct router *r, struct engine *e, const Pagoda__Internal__TokenEvent *ev)
{
    char hex[2 * ID_BYTES + 1];
    if (!ev->has_request_id || ev->request_id.len != ID_BYTES) {
        r->malformed_internal++;
        log_warn("a token event without a 16-byte request id: ignored");
        return;
    }
    struct request *q = registry_find(r, ev->request_id.data);
    if (q == NULL && ev->has_announce && ev->announce) {
        q = registry_adopt(r, ev, e->index);
        if (q != NULL)
            route_charge(r->route, e->index);
    }
    if (q == NULL) {
        /* A request this router does not know: finished and expired, or from before a router
         * restart and not announced. */
        r->unknown_events++;
        router_id_hex(ev->request_id.data, hex);
        log_debug("an event for request %s, which this router does not hold: ignored", hex);
        return;
    }
    if (q->engine != e->index) {
        /* An engine the request moved away from (it was down or hung, and is back): the request
         * goes on elsewhere, so this one stops it (best effort: a later event asks again). Once
         * its copy's end arrives (whatever the reason), the request may go back there. */
        uint64_t bit = 1ull << e->index;
        if (!ev->has_finish_reason ||
            ev->finish_reason == PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE) {
            q->heard |= bit;
            send_cancel(e, q->sched_id);
        } else {
            q->left &= ~bit;
        }
        return;
    }
    if (q->finish != PAGODA__FINISH_REASON__FINISH_NONE)
        return;
    /* The prefix cache's figure of the request's first admission (vLLM's num_cached_tokens): a
     * later one (its scheduler restarted, or it moved engine) finds its own blocks of before, or
     * its siblings', and says more; before, the last figure was taken (usage's cached_tokens of
     * n choices went from 0 to 6 across a scheduler restart). Taken from an event with tokens or
     * an end: a scheduler before the forty-fifth session announced 0 for a request it had not
     * admitted yet. */
    if (ev->has_cached_tokens && !q->cached_known &&
        (ev->n_token_ids > 0 ||
         (ev->has_finish_reason &&
          ev->finish_reason != PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE))) {
        q->cached_tokens = ev->cached_tokens;
        q->cached_known = 1;
    }
    uint32_t offset = ev->has_offset ? ev->offset : 0;
    if (offset > q->num_tokens) {
        /* An event before it was lost; the scheduler sends what it holds again
         * (docs/protocol.md, "Lost events"). Logged at the 1st, 2nd, 4th, ... gap. */
        r->event_gaps++;
        if ((r->event_gaps & (r->event_gaps - 1)) == 0) {
            router_id_hex(q->id, hex);
            log_warn("request %s: an event from output offset %u, but %u tokens are held: "
                     "ignored (%llu such events so far)",
                     hex, offset, q->num_tokens, (unsigned long long)r->event_gaps);
        }
        return;
    }
    for (size_t i = q->num_tokens - offset; i < ev->n_token_ids; i++) {
        if (q->num_tokens >= (uint32_t)q->p.max_tokens)
            break;
        float lp = i < ev->n_logprobs ? ev->logprobs[i] : 0.0f;
        int stop = 0;
        /* The token that stopped the sequence (the model's end-of-sequence or a stop token id:
         * the scheduler's FINISH_STOP comes with it) is an output token without text, as vLLM's,
         * unless the client asked for include_stop_str_in_output. */
        bool stopper = i + 1 == ev->n_token_ids && ev->has_finish_reason &&
                       ev->finish_reason == PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP &&
                       !q->keep_stops;
        if (append_token(q, ev->token_ids[i], lp) != 0 ||
            router_text_on_token(q, stopper ? -1 : ev->token_ids[i], &stop) != 0) {
            registry_finish(r, q, PAGODA__FINISH_REASON__FINISH_ERROR, PAGODA_ENOMEM,
                            "the router ran out of memory for this request's tokens");
            registry_set_pending(r, q, &q->need_cancel, 1);
            router_flush_pending(r);
            registry_trim(r, q->tenant);
            return;
        }
        if (stop > 0) {
            /* A stop string: the output ends at this token (the text before the string), and
             * the scheduler stops the sequence; what it sends later is ignored. */
            if (ev->has_prompt_tokens)
                q->prompt_tokens = ev->prompt_tokens;
            registry_finish(r, q, PAGODA__FINISH_REASON__FINISH_STOP, 0, NULL);
            registry_set_pending(r, q, &q->need_cancel, 1);
            router_flush_pending(r);
            registry_account(r, q);
            registry_trim(r, q->tenant);
            return;
        }
    }
    registry_account(r, q);
    if (ev->has_finish_reason &&
        ev->finish_reason != PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE) {
        if (ev->has_prompt_tokens)
            q->prompt_tokens = ev->prompt_tokens;
        /* Which stop: a stop token id is the last token; EOS is neither. */
        if (ev->finish_reason == PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP &&
            q->num_tokens > 0 && q->stop_ids != NULL) {
            int32_t last = q->tokens[q->num_tokens - 1];
            for (uint32_t k = 0; k < q->p.num_stop; k++)
                if (q->stop_ids[k] == last) {
                    q->has_stop_token_id = 1;
                    q->stop_token_id = last;
                    break;
                }
        }
        registry_finish(r, q, finish_from_internal(ev->finish_reason),
                        ev->has_error_code ? ev->error_code : 0, ev->error_message);
        registry_trim(r, q->tenant);
        return;
    }
    router_wake_waiters(q);
}

/* ---- stats ----------------------------------------------------------------------------------- */

static void fill_stats(struct router *r, const Pagoda__Internal__SchedulerStats *s,
                       Pagoda__Stats *out)
{
    out->has_running = s->has_running;
    out->running = s->running;
    out->has_waiting = s->has_waiting;
    out->waiting = s->waiting;
    out->has_kv_usage = s->has_kv_usage;
    out->kv_usage = s->kv_usage;
    out->has_preemptions = s->has_preemptions;
    out->preemptions = s->preemptions;
    out->has_peak_running = s->has_peak_running;
    out->peak_running = s->peak_running;
    out->has_steps = s->has_steps;
    out->steps = s->steps;
    out->has_resyncs = s->has_resyncs;
    out->resyncs = s->resyncs;
    out->has_worker_restarts = s->has_worker_restarts;
    out->worker_restarts = s->worker_restarts;
    out->has_num_blocks = s->has_num_blocks;
    out->num_blocks = s->num_blocks;
    out->has_free_blocks = s->has_free_blocks;
    out->free_blocks = s->free_blocks;
    out->has_computed_tokens = s->has_computed_tokens;
    out->computed_tokens = s->computed_tokens;
    out->has_malformed_messages = s->has_malformed_messages;
    out->malformed_messages = s->malformed_messages;
    out->has_step_cpu_us = s->has_step_cpu_us;
    out->step_cpu_us = s->step_cpu_us;
#define COPY(f)                                                                                    \
    do {                                                                                           \
        out->has_##f = s->has_##f;                                                                 \
        out->f = s->f;                                                                             \
    } while (0)
    COPY(fragmentation);
    COPY(cached_blocks);
    COPY(peak_kv_usage);
    COPY(prefix_query_tokens);
    COPY(prefix_hit_tokens);
    COPY(evictions);
    COPY(pinned_blocks);
    COPY(steps_in_flight);
    COPY(peak_steps_in_flight);
    COPY(discarded_tokens);
    COPY(prefix_waits);
    COPY(worker_step_wall_us);
    COPY(worker_step_device_us);
    COPY(worker_steps_timed);
    COPY(worker_step_wall_us_total);
    COPY(worker_step_device_us_total);
    COPY(prefill_tokens);
    COPY(decode_tokens);
    COPY(locality);
    COPY(locality_run_length);
    COPY(router_drops);
    COPY(router_resends);
#undef COPY
    out->has_event_gaps = 1;
    out->event_gaps = r->event_gaps;
    /* A dtype the scheduler names that is none of ours is left out, as the engines' disagreeing. */
    if (s->has_kv_dtype && (int)s->kv_dtype >= DTYPE_BF16 && (int)s->kv_dtype <= DTYPE_F8E4M3)
        out->kv_cache_dtype = (char *)dtype_torch_name((enum dtype)s->kv_dtype);
    out->has_prefix_hit_rate = s->has_prefix_query_tokens;
    out->prefix_hit_rate = s->prefix_query_tokens == 0
                               ? 0.0
                               : (double)s->prefix_hit_tokens / (double)s->prefix_query_tokens;
    out->has_live_requests = out->has_finished_requests = out->has_malformed_requests = 1;
    out->live_requests = r->live.count;
    out->finished_requests = r->finished.count;
    out->malformed_requests = r->malformed_requests;
    out->has_duplicate_submits = 1;
    out->duplicate_submits = r->duplicate_submits;
    out->has_scheduler_connected = 1;
    out->scheduler_connected = router_link_up(r);
    out->has_registry_bytes = out->has_client_connections = 1;
    out->registry_bytes = r->registry_bytes;
    out->client_connections = front_pipes_count(r->pipes);
    out->has_parked_calls = out->has_parked_refused = 1;
    out->parked_calls = r->num_parked;
    out->parked_refused = r->parked_refused;
    out->has_text_jobs = 1;
    out->text_jobs = r->text_jobs_run;
}

/* Offsets of each counter's value and has_ flag in a SchedulerStats. */
#define ROUTER_COUNTER_FIELD(f)                                                                    \
    {offsetof(Pagoda__Internal__SchedulerStats, f),                                                \
     offsetof(Pagoda__Internal__SchedulerStats, has_##f)},
static const struct {
    size_t value, has;
} counter_fields[ROUTER_NUM_COUNTERS] = {ROUTER_COUNTERS(ROUTER_COUNTER_FIELD)};
#undef ROUTER_COUNTER_FIELD
#define ROUTER_COUNTER_IS_U64(f)                                                                   \
    _Static_assert(sizeof(((Pagoda__Internal__SchedulerStats *)0)->f) == sizeof(uint64_t),         \
                   #f " is a uint64");
ROUTER_COUNTERS(ROUTER_COUNTER_IS_U64)
#undef ROUTER_COUNTER_IS_U64

static uint64_t *counter_at(Pagoda__Internal__SchedulerStats *s, int k)
{
    return (uint64_t *)((char *)s + counter_fields[k].value);
}

static protobuf_c_boolean *counter_has(Pagoda__Internal__SchedulerStats *s, int k)
{
    return (protobuf_c_boolean *)((char *)s + counter_fields[k].has);
}

/* Takes engine e's counters from its latest SchedulerStats (of msg's epoch): a counter that fell,
 * or every counter when the scheduler's epoch changed (a restarted scheduler, whose counters may
 * already have passed the old ones), carries what the last figure said. */
static void engine_count(struct engine *e, Pagoda__Internal__ToRouter *msg)
{
    struct engine_counters *c = &e->counters;
    const int new_epoch = c->seen && msg->has_epoch && msg->epoch != c->epoch;
    for (int k = 0; k < ROUTER_NUM_COUNTERS; k++) {
        if (!*counter_has(msg->stats, k))
            continue;
        const uint64_t v = *counter_at(msg->stats, k);
        if (new_epoch || v < c->last[k])
            c->carry[k] += c->last[k];
        c->last[k] = v;
        c->has |= 1u << k;
    }
    if (msg->has_epoch)
        c->epoch = msg->epoch;
    c->seen = 1;
}

/* The engines' SchedulerStats of mask as one: counters and sizes summed, ratios and means
 * averaged over the engines that have them, peaks the highest. With one engine: its own (but
 * for the worker step-time counters, carried as below). With several, each counter is the sum
 * of every engine's totals (engine_count), those not asked (down now) included: a merged
 * counter never falls while the router runs. */
static void merge_stats(struct router *r, uint64_t mask, Pagoda__Internal__SchedulerStats *agg)
{
    const int several = r->num_engines > 1;
    uint32_t n_mean[16] = {0};
    int dtypes_differ = 0;
    for (uint32_t i = 0; i < r->num_engines; i++) {
        if (!(mask & (1ull << i)) || r->engines[i].stats == NULL ||
            r->engines[i].stats->stats == NULL)
            continue;
        const Pagoda__Internal__SchedulerStats *s = r->engines[i].stats->stats;
#define SUM(f)                                                                                     \
    do {                                                                                           \
        agg->has_##f |= s->has_##f;                                                                \
        agg->f += s->f;                                                                            \
    } while (0)
#define COUNT(f)                                                                                   \
    do {                                                                                           \
        if (!several)                                                                              \
            SUM(f);                                                                                \
    } while (0);
#define MEAN(k, f)                                                                                 \
    do {                                                                                           \
        if (s->has_##f) {                                                                          \
            agg->has_##f = 1;                                                                      \
            agg->f += s->f;                                                                        \
            n_mean[k]++;                                                                           \
        }                                                                                          \
    } while (0)
#define HIGHEST(f)                                                                                 \
    do {                                                                                           \
        if (s->has_##f && (!agg->has_##f || s->f > agg->f)) {                                      \
            agg->has_##f = 1;                                                                      \
            agg->f = s->f;                                                                         \
        }                                                                                          \
    } while (0)
        SUM(running);
        SUM(waiting);
        SUM(num_blocks);
        SUM(free_blocks);
        SUM(cached_blocks);
        SUM(pinned_blocks);
        SUM(steps_in_flight);
        ROUTER_COUNTERS(COUNT)
        MEAN(0, kv_usage);
        MEAN(1, step_cpu_us);
        MEAN(2, fragmentation);
        MEAN(3, worker_step_wall_us);
        MEAN(4, worker_step_device_us);
        MEAN(5, locality);
        MEAN(6, locality_run_length);
        HIGHEST(peak_kv_usage);
        HIGHEST(peak_running);
        HIGHEST(peak_steps_in_flight);
        if (s->has_kv_dtype) { /* one K/V element for all, or none */
            dtypes_differ |= agg->has_kv_dtype && agg->kv_dtype != s->kv_dtype;
            agg->has_kv_dtype = 1;
            agg->kv_dtype = s->kv_dtype;
        }
#undef SUM
#undef COUNT
#undef MEAN
#undef HIGHEST
    }
    for (uint32_t i = 0; several && i < r->num_engines; i++) {
        const struct engine_counters *c = &r->engines[i].counters;
        for (int k = 0; k < ROUTER_NUM_COUNTERS; k++)
            if (c->has & (1u << k)) {
                *counter_has(agg, k) = 1;
                *counter_at(agg, k) += c->carry[k] + c->last[k];
            }
    }
    /* The worker's step-time counters are carried with one engine too (its scheduler restarted
     * while the router ran): a client takes their differences over an interval (pagoda-bench's
     * time per step), which a counter that started again would bend. */
    static const int carried[] = {ROUTER_COUNTER_worker_steps_timed,
                                  ROUTER_COUNTER_worker_step_wall_us_total,
                                  ROUTER_COUNTER_worker_step_device_us_total};
    for (uint32_t i = 0; !several && i < r->num_engines; i++) {
        const struct engine_counters *c = &r->engines[i].counters;
        if (!(mask & (1ull << i)))
            continue;
        for (size_t j = 0; j < sizeof(carried) / sizeof(carried[0]); j++)
            if (c->has & (1u << carried[j])) {
                *counter_has(agg, carried[j]) = 1;
                *counter_at(agg, carried[j]) = c->carry[carried[j]] + c->last[carried[j]];
            }
    }
    double *means[] = {&agg->kv_usage,
                       &agg->step_cpu_us,
                       &agg->fragmentation,
                       &agg->worker_step_wall_us,
                       &agg->worker_step_device_us,
                       &agg->locality,
                       &agg->locality_run_length};
    for (size_t k = 0; k < sizeof(means) / sizeof(means[0]); k++)
        if (n_mean[k] > 1)
            *means[k] /= n_mean[k];
    if (dtypes_differ)
        agg->has_kv_dtype = 0;
}

/* Answers a stats call with the figures of the engines it asked (those that answered). */
static void reply_stats(struct router *r, struct rctx *c)
{
    Pagoda__Internal__SchedulerStats agg = PAGODA__INTERNAL__SCHEDULER_STATS__INIT;
    merge_stats(r, c->engines_asked, &agg);
    Pagoda__Stats stats = PAGODA__STATS__INIT;
    fill_stats(r, &agg, &stats);
    Pagoda__EngineStats es[ROUTE_MAX_ENGINES], *es_ptrs[ROUTE_MAX_ENGINES];
    if (r->num_engines > 1) {
        stats.routing = (char *)route_mode_name(r->routing);
        for (uint32_t i = 0; i < r->num_engines; i++) {
            struct engine *e = &r->engines[i];
            const Pagoda__Internal__SchedulerStats *s = e->stats ? e->stats->stats : NULL;
            pagoda__engine_stats__init(&es[i]);
            es[i].has_engine = es[i].has_connected = es[i].has_load = es[i].has_routed = 1;
            es[i].engine = i;
            es[i].address = e->url;
            es[i].connected = engine_usable(e);
            es[i].load = route_load(r->route, i);
            es[i].routed = e->routed;
            if (s != NULL && (c->engines_asked & (1ull << i))) {
                es[i].has_running = s->has_running;
                es[i].running = s->running;
                es[i].has_waiting = s->has_waiting;
                es[i].waiting = s->waiting;
                es[i].has_prefix_query_tokens = s->has_prefix_query_tokens;
                es[i].prefix_query_tokens = s->prefix_query_tokens;
                es[i].has_prefix_hit_tokens = s->has_prefix_hit_tokens;
                es[i].prefix_hit_tokens = s->prefix_hit_tokens;
                es[i].has_prefix_waits = s->has_prefix_waits;
                es[i].prefix_waits = s->prefix_waits;
            }
            es_ptrs[i] = &es[i];
        }
        stats.n_engines = r->num_engines;
        stats.engines = es_ptrs;
    }
    router_unpark(c);
    Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
    resp.result_case = PAGODA__CLIENT_RESPONSE__RESULT_STATS;
    resp.stats = &stats;
    router_reply(c, &resp);
}

/* Engine e's SchedulerStats (msg, taken): kept as its latest; it counts for liveness and gives
 * routing its load; the stats calls waiting for it (every one sent to it no later than this
 * answer) are answered once every engine they asked has answered. */
static void on_stats(struct router *r, struct engine *e, Pagoda__Internal__ToRouter *msg)
{
    const Pagoda__Internal__SchedulerStats *s = msg->stats;
    if (s == NULL) {
        r->malformed_internal++;
        protobuf_c_message_free_unpacked(&msg->base, NULL);
        return;
    }
    if (e->stats != NULL)
        protobuf_c_message_free_unpacked(&e->stats->base, NULL);
    e->stats = msg;
    engine_count(e, msg);
    route_set_engine_load(r->route, e->index, s->running + s->waiting);
    uint64_t bit = 1ull << e->index;
    struct rctx *c = r->stats_waiters;
    while (c != NULL) {
        struct rctx *next = c->next;
        if ((c->engines_waited & bit) && (!s->has_cookie || c->cookie <= s->cookie)) {
            c->engines_waited &= ~bit;
            if (c->engines_waited == 0)
                reply_stats(r, c);
        }
        c = next;
    }
}

/* e went down: the stats calls waiting for it are answered with the others' figures. */
static void stats_on_engine_down(struct router *r, struct engine *e)
{
    uint64_t bit = 1ull << e->index;
    struct rctx *c = r->stats_waiters;
    while (c != NULL) {
        struct rctx *next = c->next;
        if (c->engines_waited & bit) {
            c->engines_waited &= ~bit;
            c->engines_asked &= ~bit;
            if (c->engines_waited == 0) {
                if (c->engines_asked != 0)
                    reply_stats(r, c);
                else {
                    router_unpark(c);
                    router_reply_error(c, PAGODA_ECLOSED, "stats: the scheduler link is down");
                }
            }
        }
        c = next;
    }
}

/* Stats: a tenant's key (with a tenants file) gets the tenant's own figures
 * (admin_tenant_stats); the engines', which show every tenant's traffic, need an admin key. With
 * no tenants file the one default tenant is everyone, and any key gets the engines'. */
void link_handle_stats(struct router *r, struct rctx *c, uint32_t tenant, int admin)
{
    /* Every Stats call parks until the schedulers answer, a tenant's too: all of them count
     * against --max-parked, and a tenant's against its share (router_may_park). */
    if (!router_may_park(r, c)) {
        r->parked_refused++;
        router_reply_error(
            c, PAGODA_EBUSY, "stats: %u calls wait already (%u of them this tenant's): retry later",
            r->num_parked, c->caller != CALLER_NONE ? r->slots[c->caller].parked : 0);
        return;
    }
    if (r->tenants != NULL && !admin) {
        admin_tenant_stats(r, c, tenant);
        return;
    }
    if (!router_link_up(r)) {
        router_reply_error(c, PAGODA_ECLOSED, "stats: the scheduler link is down");
        return;
    }
    uint64_t cookie = ++r->stats_cookie, asked = 0;
    int rc = 0;
    for (uint32_t i = 0; i < r->num_engines; i++) {
        if (!engine_usable(&r->engines[i]))
            continue;
        int rv = send_stats_request(&r->engines[i], cookie);
        if (rv == 0)
            asked |= 1ull << i;
        else
            rc = rv;
    }
    if (asked == 0) {
        router_reply_error(c, rc, "stats: %s", pagoda_error_detail());
        return;
    }
    c->park = PARK_STATS;
    c->cookie = cookie;
    c->engines_asked = c->engines_waited = asked;
    router_park(&r->stats_waiters, c, r->cfg.stats_timeout_ms);
}

/* ---- ModelInfo, and what comes from the scheduler -------------------------------------------- */

/* The prompt limit in force: as configured, lowered to the model's context less one token (the
 * scheduler refuses a prompt that leaves no room for output) once ModelInfo has arrived. The
 * largest message the REP socket accepts follows it, for connections to come and those open. */
static void apply_prompt_limit(struct router *r)
{
    uint32_t limit = r->prompt_limit_cfg;
    if (r->model_positions > 1 && r->model_positions - 1 < limit)
        limit = r->model_positions - 1;
    r->cfg.max_prompt_tokens = limit;
    size_t bytes = router_max_message_bytes(limit);
    if (bytes == r->recv_max_bytes)
        return;
    int rv = nng_socket_set_size(r->rep, NNG_OPT_RECVMAXSZ, bytes);
    if (rv != 0) {
        log_warn("could not set the client message limit to %zu bytes: %s", bytes,
                 nng_strerror(rv));
        return;
    }
    r->recv_max_bytes = bytes;
    log_info("prompts of up to %u tokens, client messages of up to %zu bytes", limit, bytes);
}

/* A scheduler's ModelInfo: the model's context (every engine serves the same model), and the
 * block size routing cuts prompts by. */
static void on_model_info(struct router *r, const Pagoda__Internal__ModelInfo *info)
{
    if (info != NULL && info->has_block_size && info->block_size > 0)
        route_set_block_tokens(r->route, info->block_size);
    if (info == NULL || !info->has_max_position_embeddings || info->max_position_embeddings < 2 ||
        info->max_position_embeddings > UINT32_MAX) {
        r->malformed_internal++;
        log_warn("a ModelInfo without a valid max_position_embeddings: ignored");
        return;
    }
    r->model_positions = (uint32_t)info->max_position_embeddings;
    apply_prompt_limit(r);
}

/* Loop thread: one message from the scheduler. */
void link_on_msg(void *arg, nng_msg *m)
{
    struct engine *e = arg;
    struct router *r = e->r;
    Pagoda__Internal__ToRouter *msg =
        (Pagoda__Internal__ToRouter *)wire_unpack(&pagoda__internal__to_router__descriptor, m);
    size_t len = nng_msg_len(m);
    nng_msg_free(m);
    /* Any message is a sign of life (a malformed one too: the engine's loop runs). */
    e->heard_ms = uv_now(r->loop);
    e->probes_unanswered = 0;
    if (e->hung) {
        log_info("engine %u (%s) answers again: it takes new work", e->index, e->url);
        e->hung = 0;
        engines_update(r);
    }
    if (msg == NULL) {
        r->malformed_internal++;
        log_warn("a malformed %zu-byte message from the scheduler: ignored", len);
        return;
    }
    switch (msg->msg_case) {
    case PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS:
        for (size_t i = 0; msg->events != NULL && i < msg->events->n_events; i++)
            apply_event(r, e, msg->events->events[i]);
        if (msg->events != NULL && msg->events->has_announce_done && msg->events->announce_done)
            on_announced(r, e);
        break;
    case PAGODA__INTERNAL__TO_ROUTER__MSG_STATS:
        on_stats(r, e, msg); /* takes msg */
        return;
    case PAGODA__INTERNAL__TO_ROUTER__MSG_POLICY_APPLIED:
        admin_on_policy_applied(r, e, msg->policy_applied);
        break;
    case PAGODA__INTERNAL__TO_ROUTER__MSG_ADMIN:
        admin_on_result(r, e, msg); /* takes msg */
        return;
    case PAGODA__INTERNAL__TO_ROUTER__MSG_MODEL:
        on_model_info(r, msg->model);
        break;
    default:
        r->malformed_internal++;
        log_warn("a message from the scheduler with no known content: ignored");
    }
    protobuf_c_message_free_unpacked(&msg->base, NULL);
}
