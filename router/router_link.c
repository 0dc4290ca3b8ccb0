/* The scheduler link (router_internal.h): the PAIR socket the router dials, what goes to the
 * scheduler (submits, cancels, the RouterHello, stats requests; the Policy is router_tenancy.c's)
 * and is sent again when it was refused or when a scheduler (new or restarted) joins, and what
 * comes back: token events (with the announcement of a restarted router's requests), stats for
 * the Stats calls parked, ModelInfo (which bounds prompts), and the admin API's answers, which go
 * to router_admin.c. */
#include "router/router_internal.h"

#include "common/error.h"
#include "common/log.h"
#include "wire/sampling_wire.h"
#include "wire/wire.h"

#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Messages the scheduler link queues in each direction, so that a burst of submits or events
 * is not refused by a non-blocking send while the pipe is busy. */
#define LINK_BUFFER_MESSAGES 1024

/* ---- what goes to the scheduler -------------------------------------------------------------- */

/* Whether a scheduler is on the link, as far as the loop knows: a pipe that joined is only
 * counted once on_link_joined has run for it, so that it sees every unfinished request exactly
 * once. */
int router_link_up(struct router *r)
{
    return r->link_gen_seen == atomic_load(&r->link_gen) && atomic_load(&r->link_pipes) > 0;
}

static int send_submit(struct router *r, struct request *q)
{
    Pagoda__Internal__SamplingParams sp = sampling_to_internal(&q->p.sampling);

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
    sub.n_stop_token_ids = q->p.num_stop;
    sub.stop_token_ids = q->stop_ids;
    sub.has_ignore_eos = 1;
    sub.ignore_eos = q->p.ignore_eos;
    sub.n_output_token_ids = q->num_tokens;
    sub.output_token_ids = q->tokens;
    sub.has_client_request_id = 1;
    sub.client_request_id.data = q->id;
    sub.client_request_id.len = ID_BYTES;

    Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_SUBMIT;
    env.submit = &sub;
    return router_send(r, &env);
}

static int send_cancel(struct router *r, struct request *q)
{
    Pagoda__Internal__CancelSeq cancel = PAGODA__INTERNAL__CANCEL_SEQ__INIT;
    cancel.has_request_id = 1;
    cancel.request_id.data = q->sched_id;
    cancel.request_id.len = ID_BYTES;
    Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_CANCEL;
    env.cancel = &cancel;
    return router_send(r, &env);
}

static int send_hello(struct router *r)
{
    Pagoda__Internal__RouterHello hello = PAGODA__INTERNAL__ROUTER_HELLO__INIT;
    Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_ROUTER_HELLO;
    env.router_hello = &hello;
    return router_send(r, &env);
}

int router_send(struct router *r, Pagoda__Internal__ToScheduler *env)
{
    env->has_protocol_version = 1;
    env->protocol_version = WIRE_PROTOCOL_VERSION;
    return wire_send(r->link, &env->base);
}

/* Sends what is still to be sent to the scheduler, while the link takes it. A refused send
 * stays pending for the next housekeeping tick. The Policy goes first: nothing is submitted
 * under an older tenancy than the router's (but nothing waits for the scheduler to apply it
 * either: only admin calls do). */
void router_flush_pending(struct router *r)
{
    if (!router_link_up(r))
        return;
    if (r->need_policy) {
        if (tenancy_send_policy(r) != 0)
            return;
        r->need_policy = 0;
    }
    if (r->need_hello && send_hello(r) == 0)
        r->need_hello = 0;
    if (r->num_pending == 0)
        return;
    struct req_list *lists[2] = {&r->live, &r->finished};
    for (int l = 0; l < 2; l++) {
        for (struct request *q = lists[l]->head; q != NULL && r->num_pending > 0; q = q->next) {
            if (q->need_submit) {
                if (send_submit(r, q) != 0)
                    return;
                registry_set_pending(r, q, &q->need_submit, 0);
            }
            if (q->need_cancel) {
                if (send_cancel(r, q) != 0)
                    return;
                registry_set_pending(r, q, &q->need_cancel, 0);
            }
        }
    }
}

/* A pipe joined the link: a scheduler (new or restarted) is there. It may not know the tenancy,
 * so the current Policy goes first; nor the unfinished requests, so each is sent again with the
 * output it already has; and this router may not know the scheduler's (after a router restart),
 * so a RouterHello asks for them. */
static void on_link_joined(struct router *r)
{
    log_info("scheduler link up (%s): sending %u unfinished requests", r->sched_url, r->live.count);
    for (struct request *q = r->live.head; q != NULL; q = q->next)
        if (q->job == NULL) /* a prompt still being tokenized goes when it is ready */
            registry_set_pending(r, q, &q->need_submit, 1);
    tenancy_on_link_up(r);
    r->need_hello = 1;
    router_flush_pending(r);
}

void link_on_async(struct router *r)
{
    unsigned gen = atomic_load(&r->link_gen);
    if (gen != r->link_gen_seen) {
        r->link_gen_seen = gen;
        on_link_joined(r);
    }
}

/* NNG thread: the link's pipes come and go. */
static void on_link_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct router *r = arg;
    if (ev == NNG_PIPE_EV_ADD_POST) {
        atomic_fetch_add(&r->link_pipes, 1);
        atomic_fetch_add(&r->link_gen, 1);
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        atomic_fetch_sub(&r->link_pipes, 1);
    }
    if (!atomic_load(&r->closing))
        uv_async_send(&r->async);
}

/* Opens the scheduler link by hand rather than with wire_pair_open: the pipe notifications
 * that tell the router when a scheduler is there must be registered before the dial. */
int link_dial(struct router *r)
{
    int rv = nng_pair1_open(&r->link);
    if (rv != 0)
        return wire_error(rv, "nng_pair1_open");
    r->link_open = 1;
    if ((rv = nng_socket_set_size(r->link, NNG_OPT_RECVMAXSZ, WIRE_MAX_MESSAGE_BYTES)) != 0 ||
        (rv = nng_socket_set_int(r->link, NNG_OPT_SENDBUF, LINK_BUFFER_MESSAGES)) != 0 ||
        (rv = nng_socket_set_int(r->link, NNG_OPT_RECVBUF, LINK_BUFFER_MESSAGES)) != 0 ||
        (rv = nng_socket_set_ms(r->link, NNG_OPT_RECONNMINT, 20)) != 0 ||
        (rv = nng_socket_set_ms(r->link, NNG_OPT_RECONNMAXT, 100)) != 0)
        return wire_error(rv, "scheduler link options");
    if ((rv = nng_pipe_notify(r->link, NNG_PIPE_EV_ADD_POST, on_link_pipe, r)) != 0 ||
        (rv = nng_pipe_notify(r->link, NNG_PIPE_EV_REM_POST, on_link_pipe, r)) != 0)
        return wire_error(rv, "nng_pipe_notify");
    if ((rv = nng_dial(r->link, r->sched_url, NULL, NNG_FLAG_NONBLOCK)) != 0)
        return wire_error(rv, r->sched_url);
    return 0;
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

/* The scheduler's announcement is complete: polls parked for unknown ids are answered. */
static void on_announced(struct router *r)
{
    if (!r->announced)
        log_info("the scheduler's announcement arrived: %u unfinished requests held",
                 r->live.count);
    r->announced = 1;
    while (r->unknown_waiters != NULL)
        registry_unpark_unknown(r->unknown_waiters);
}

/* Appends an event's new tokens (those beyond what the request holds: a resent or overlapping
 * event adds nothing twice), records its end, and answers the polls waiting on it. */
static void apply_event(struct router *r, const Pagoda__Internal__TokenEvent *ev)
{
    char hex[2 * ID_BYTES + 1];
    if (!ev->has_request_id || ev->request_id.len != ID_BYTES) {
        r->malformed_internal++;
        log_warn("a token event without a 16-byte request id: ignored");
        return;
    }
    struct request *q = registry_find(r, ev->request_id.data);
    if (q == NULL && ev->has_announce && ev->announce)
        q = registry_adopt(r, ev);
    if (q == NULL) {
        /* A request this router does not know: finished and expired, or from before a router
         * restart and not announced. */
        r->unknown_events++;
        router_id_hex(ev->request_id.data, hex);
        log_debug("an event for request %s, which this router does not hold: ignored", hex);
        return;
    }
    if (q->finish != PAGODA__FINISH_REASON__FINISH_NONE)
        return;
    uint32_t offset = ev->has_offset ? ev->offset : 0;
    if (offset > q->num_tokens) {
        r->event_gaps++;
        router_id_hex(q->id, hex);
        log_warn("request %s: an event from output offset %u, but %u tokens are held: ignored", hex,
                 offset, q->num_tokens);
        return;
    }
    for (size_t i = q->num_tokens - offset; i < ev->n_token_ids; i++) {
        if (q->num_tokens >= (uint32_t)q->p.max_tokens)
            break;
        float lp = i < ev->n_logprobs ? ev->logprobs[i] : 0.0f;
        int stop = 0;
        if (append_token(q, ev->token_ids[i], lp) != 0 ||
            router_text_on_token(q, ev->token_ids[i], &stop) != 0) {
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
            if (ev->has_cached_tokens)
                q->cached_tokens = ev->cached_tokens;
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
        if (ev->has_cached_tokens)
            q->cached_tokens = ev->cached_tokens;
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
    COPY(worker_step_wall_us);
    COPY(worker_step_device_us);
    COPY(prefill_tokens);
    COPY(decode_tokens);
    COPY(locality);
    COPY(locality_run_length);
#undef COPY
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
}

/* Answers the stats calls waiting for this answer (every one sent no later than it). */
static void answer_stats(struct router *r, const Pagoda__Internal__SchedulerStats *s)
{
    Pagoda__Stats stats = PAGODA__STATS__INIT;
    fill_stats(r, s, &stats);
    struct rctx *c = r->stats_waiters;
    while (c != NULL) {
        struct rctx *next = c->next;
        if (!s->has_cookie || c->cookie <= s->cookie) {
            router_unpark(c);
            Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
            resp.result_case = PAGODA__CLIENT_RESPONSE__RESULT_STATS;
            resp.stats = &stats;
            router_reply(c, &resp);
        }
        c = next;
    }
}

/* Stats: a tenant's key (with a tenants file) gets the tenant's own figures
 * (admin_tenant_stats); the engine's, which show every tenant's traffic, need an admin key. With
 * no tenants file the one default tenant is everyone, and any key gets the engine's. */
void link_handle_stats(struct router *r, struct rctx *c, uint32_t tenant, int admin)
{
    /* Every Stats call parks until the scheduler answers, a tenant's too: all of them count
     * against --max-parked. */
    if (r->num_parked >= r->cfg.max_parked_calls) {
        r->parked_refused++;
        router_reply_error(c, PAGODA_EBUSY, "stats: %u calls wait already: retry later",
                           r->num_parked);
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
    Pagoda__Internal__StatsRequest sreq = PAGODA__INTERNAL__STATS_REQUEST__INIT;
    sreq.has_cookie = 1;
    sreq.cookie = ++r->stats_cookie;
    Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS;
    env.stats = &sreq;
    int rc = router_send(r, &env);
    if (rc != 0) {
        router_reply_error(c, rc, "stats: %s", pagoda_error_detail());
        return;
    }
    c->park = PARK_STATS;
    c->cookie = sreq.cookie;
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

/* The scheduler's ModelInfo: the model's context. */
static void on_model_info(struct router *r, const Pagoda__Internal__ModelInfo *info)
{
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
    struct router *r = arg;
    Pagoda__Internal__ToRouter *msg =
        (Pagoda__Internal__ToRouter *)wire_unpack(&pagoda__internal__to_router__descriptor, m);
    size_t len = nng_msg_len(m);
    nng_msg_free(m);
    if (msg == NULL) {
        r->malformed_internal++;
        log_warn("a malformed %zu-byte message from the scheduler: ignored", len);
        return;
    }
    switch (msg->msg_case) {
    case PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS:
        for (size_t i = 0; msg->events != NULL && i < msg->events->n_events; i++)
            apply_event(r, msg->events->events[i]);
        if (msg->events != NULL && msg->events->has_announce_done && msg->events->announce_done)
            on_announced(r);
        break;
    case PAGODA__INTERNAL__TO_ROUTER__MSG_STATS:
        answer_stats(r, msg->stats);
        break;
    case PAGODA__INTERNAL__TO_ROUTER__MSG_POLICY_APPLIED:
        admin_on_policy_applied(r, msg->policy_applied);
        break;
    case PAGODA__INTERNAL__TO_ROUTER__MSG_ADMIN:
        admin_on_result(r, msg->admin);
        break;
    case PAGODA__INTERNAL__TO_ROUTER__MSG_MODEL:
        on_model_info(r, msg->model);
        break;
    default:
        r->malformed_internal++;
        log_warn("a message from the scheduler with no known content: ignored");
    }
    protobuf_c_message_free_unpacked(&msg->base, NULL);
}
