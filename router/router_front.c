/* The router's REP front (router_internal.h): the client connections it tracks and caps, the
 * contexts that receive calls and the mailbox that hands them to the loop, authentication and the
 * dispatch of each call, parking (calls that wait: polls, stats, admin calls), and the replies.
 * What a call does to a request is router_registry.c's; the Stats call is router_link.c's. */
#include "router/router_internal.h"

#include "common/error.h"
#include "common/log.h"
#include "wire/wire.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/supplemental/util/platform.h>

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The most idle connections one housekeeping tick closes (the rest go on the next ticks). */
#define IDLE_CLOSE_BATCH 1024

/* ---- client connections ---------------------------------------------------------------------- */

/* Every client connection (NNG pipe) of the REP socket, with what the idle rule needs: when its
 * last complete message arrived or its last reply left, and how many of its calls are in
 * progress. NNG 1.5.2 has no per-pipe timeout and no connection limit, so the router keeps this
 * itself: NNG's threads add and remove pipes and count calls, the loop's housekeeping closes
 * those idle too long. Nodes are preallocated (cap, the connection limit) and chained in
 * buckets by pipe id; everything is guarded by lock. */
struct pipe_node {
    uint32_t id; /* 0: free */
    uint32_t calls;
    nng_time last_ms;
    struct pipe_node *next; /* bucket chain, or the free list */
};

struct pipe_table {
    pthread_mutex_t lock;
    struct pipe_node *nodes, *free_list, **buckets;
    uint32_t cap, count, mask;
    uint64_t refused; /* connections closed on arrival: the table was full */
    uint64_t idle_closed;
};

struct pipe_table *front_pipes_new(uint32_t cap)
{
    struct pipe_table *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    t->cap = cap;
    uint32_t nb = 64;
    while (nb < 2 * cap)
        nb *= 2;
    t->mask = nb - 1;
    t->nodes = calloc(cap, sizeof(*t->nodes));
    t->buckets = calloc(nb, sizeof(*t->buckets));
    if (t->nodes == NULL || t->buckets == NULL || pthread_mutex_init(&t->lock, NULL) != 0) {
        free(t->nodes);
        free(t->buckets);
        free(t);
        return NULL;
    }
    for (uint32_t i = 0; i < cap; i++) {
        t->nodes[i].next = t->free_list;
        t->free_list = &t->nodes[i];
    }
    return t;
}

void front_pipes_free(struct pipe_table *t)
{
    if (t == NULL)
        return;
    pthread_mutex_destroy(&t->lock);
    free(t->nodes);
    free(t->buckets);
    free(t);
}

/* With t->lock held: the node of pipe id, or NULL; *link is where it is chained from. */
static struct pipe_node *pipe_find(struct pipe_table *t, uint32_t id, struct pipe_node ***link)
{
    struct pipe_node **pp = &t->buckets[id & t->mask];
    while (*pp != NULL && (*pp)->id != id)
        pp = &(*pp)->next;
    if (link != NULL)
        *link = pp;
    return *pp;
}

/* NNG thread: a client connection arrives (ADD_PRE, before any message of it is received) or
 * goes (REM_POST). One over the limit is closed at once. */
static void on_rep_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct router *r = arg;
    struct pipe_table *t = r->pipes;
    uint32_t id = (uint32_t)nng_pipe_id(p);
    pthread_mutex_lock(&t->lock);
    if (ev == NNG_PIPE_EV_ADD_PRE) {
        struct pipe_node *n = t->free_list;
        if (n == NULL) {
            t->refused++;
            pthread_mutex_unlock(&t->lock);
            nng_pipe_close(p); /* NNG then never starts it */
            return;
        }
        t->free_list = n->next;
        n->id = id;
        n->calls = 0;
        n->last_ms = nng_clock();
        n->next = t->buckets[id & t->mask];
        t->buckets[id & t->mask] = n;
        t->count++;
    } else if (ev == NNG_PIPE_EV_REM_POST) {
        struct pipe_node **link;
        struct pipe_node *n = pipe_find(t, id, &link);
        if (n != NULL) {
            *link = n->next;
            n->id = 0;
            n->next = t->free_list;
            t->free_list = n;
            t->count--;
        }
    }
    pthread_mutex_unlock(&t->lock);
}

/* NNG thread: a complete call arrived on pipe id (started != 0) or its reply left or was
 * dropped (started == 0). */
static void pipe_call(struct pipe_table *t, uint32_t id, int started)
{
    if (id == 0)
        return;
    pthread_mutex_lock(&t->lock);
    struct pipe_node *n = pipe_find(t, id, NULL);
    if (n != NULL) {
        if (started)
            n->calls++;
        else if (n->calls > 0)
            n->calls--;
        n->last_ms = nng_clock();
    }
    pthread_mutex_unlock(&t->lock);
}

/* Loop thread: closes connections with no call in progress and no complete message for longer
 * than idle_ms (an idle client, or a slow one holding a partial message). */
void front_close_idle(struct router *r, uint32_t idle_ms)
{
    struct pipe_table *t = r->pipes;
    uint32_t ids[IDLE_CLOSE_BATCH];
    uint32_t n = 0;
    nng_time now = nng_clock();
    pthread_mutex_lock(&t->lock);
    for (uint32_t i = 0; i < t->cap && n < IDLE_CLOSE_BATCH; i++) {
        struct pipe_node *p = &t->nodes[i];
        if (p->id != 0 && p->calls == 0 && now - p->last_ms >= idle_ms) {
            ids[n++] = p->id;
            p->last_ms = now; /* closed below; not counted twice should the close be slow */
        }
    }
    t->idle_closed += n;
    pthread_mutex_unlock(&t->lock);
    for (uint32_t i = 0; i < n; i++) {
        nng_pipe p = NNG_PIPE_INITIALIZER;
        p.id = ids[i];
        nng_pipe_close(p); /* REM_POST takes it off the table */
    }
    if (n > 0)
        log_debug("closed %u idle client connections (no call for %u ms)", n, idle_ms);
}

uint32_t front_pipes_count(struct pipe_table *t)
{
    pthread_mutex_lock(&t->lock);
    uint32_t n = t->count;
    pthread_mutex_unlock(&t->lock);
    return n;
}

/* ---- replies --------------------------------------------------------------------------------- */

/* The context is free again: its call is over (answered or dropped), it receives the next. */
static void arm_recv(struct rctx *c)
{
    pipe_call(c->r->pipes, c->pipe, 0);
    c->pipe = 0;
    if (!atomic_load(&c->r->closing)) {
        nng_aio_set_timeout(c->aio, NNG_DURATION_INFINITE);
        nng_ctx_recv(c->ctx, c->aio);
    }
}

/* Packs resp and sends it on c's context. The context receives its next call once the send has
 * completed. If no message can be allocated, the call goes unanswered and the client's REQ
 * resends it later. */
void router_reply(struct rctx *c, Pagoda__ClientResponse *resp)
{
    resp->has_protocol_version = 1;
    resp->protocol_version = ROUTER_CLIENT_PROTOCOL_VERSION;
    resp->has_max_request_bytes = 1;
    resp->max_request_bytes = (uint32_t)c->r->recv_max_bytes;
    size_t len = protobuf_c_message_get_packed_size(&resp->base);
    nng_msg *m;
    if (nng_msg_alloc(&m, len) != 0) {
        log_warn("out of memory for a %zu-byte reply: the call goes unanswered", len);
        arm_recv(c);
        return;
    }
    protobuf_c_message_pack(&resp->base, nng_msg_body(m));
    c->sending = 1;
    /* A client that does not read its replies gives its context back after this long. */
    nng_aio_set_timeout(c->aio, ROUTER_SEND_TIMEOUT_MS);
    nng_aio_set_msg(c->aio, m);
    nng_ctx_send(c->ctx, c->aio);
}

void router_reply_error(struct rctx *c, int code, const char *fmt, ...)
{
    char text[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
    resp.has_error_code = 1;
    resp.error_code = code;
    resp.error_message = text;
    router_reply(c, &resp);
}

/* Answers with the request's tokens from offset on (none when offset is at the end), its state,
 * and its usage once it has finished. */
static void reply_update_ex(struct rctx *c, struct request *q, uint32_t offset, int with_tokens)
{
    Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
    Pagoda__TokenUpdate up = PAGODA__TOKEN_UPDATE__INIT;
    Pagoda__Usage usage = PAGODA__USAGE__INIT;
    up.has_request_id = 1;
    up.request_id.data = q->id;
    up.request_id.len = ID_BYTES;
    up.has_offset = 1;
    up.offset = offset;
    if (with_tokens && offset < q->num_tokens) {
        up.n_token_ids = q->num_tokens - offset;
        up.token_ids = q->tokens + offset;
        if (q->p.logprobs) {
            up.n_logprobs = up.n_token_ids;
            up.logprobs = q->logprobs + offset;
        }
    }
    up.has_finish_reason = 1;
    up.finish_reason = q->finish;
    uint32_t *ends = NULL;
    if (with_tokens && q->text != NULL) {
        router_text_fill(q, offset, &up.text, &up.stop_string);
        up.has_text = 1;
        up.has_stop_string = q->stop_index > 0;
        /* Each token's piece of the text, for the log-probabilities' token strings (without
         * memory for them the client names tokens by id). */
        if (q->p.logprobs && up.n_token_ids > 0 &&
            (ends = router_text_token_ends(q, offset)) != NULL) {
            up.n_token_text_ends = up.n_token_ids;
            up.token_text_ends = ends;
        }
    }
    up.has_stop_token_id = q->has_stop_token_id;
    up.stop_token_id = q->stop_token_id;
    if (q->finish != PAGODA__FINISH_REASON__FINISH_NONE) {
        usage.has_prompt_tokens = usage.has_completion_tokens = usage.has_cached_tokens = 1;
        usage.prompt_tokens = q->prompt_tokens;
        usage.completion_tokens = q->num_tokens;
        usage.cached_tokens = q->cached_tokens;
        up.usage = &usage;
        if (q->finish == PAGODA__FINISH_REASON__FINISH_ERROR && q->error_message != NULL)
            resp.error_message = q->error_message;
        if (with_tokens)
            q->delivered = 1;
    }
    resp.result_case = PAGODA__CLIENT_RESPONSE__RESULT_UPDATE;
    resp.update = &up;
    router_reply(c, &resp);
    free(ends);
}

void router_reply_update(struct rctx *c, struct request *q, uint32_t offset)
{
    reply_update_ex(c, q, offset, 1);
}

/* A Submit's answer: the request's id and state, offset 0 and no tokens (a resent Submit of a
 * request that has made progress gets the same answer as the first). */
void router_reply_submitted(struct rctx *c, struct request *q)
{
    reply_update_ex(c, q, 0, 0);
}

/* ---- parking --------------------------------------------------------------------------------- */

void router_park_remove(struct rctx **list, struct rctx *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        *list = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->prev = c->next = NULL;
    c->r->num_parked--;
    if (c->caller != CALLER_NONE)
        c->r->slots[c->caller].parked--;
}

static void park_push(struct rctx **list, struct rctx *c)
{
    c->r->num_parked++;
    if (c->caller != CALLER_NONE)
        c->r->slots[c->caller].parked++;
    c->prev = NULL;
    c->next = *list;
    if (*list)
        (*list)->prev = c;
    *list = c;
}

/* Takes c off whatever it waits on and stops its timer; the call is the loop's to answer. A poll
 * names its request until it leaves (abandon_ms counts from then, not from its arrival: a wait
 * longer than abandon_ms would otherwise leave its request abandoned as it is answered). */
void router_unpark(struct rctx *c)
{
    if (c->park == PARK_POLL) {
        router_park_remove(&c->req->waiters, c);
        c->req->seen_ms = uv_now(c->r->loop);
    } else if (c->park == PARK_STATS)
        router_park_remove(&c->r->stats_waiters, c);
    else if (c->park == PARK_UNKNOWN) {
        router_park_remove(&c->r->unknown_waiters, c);
        c->r->num_unknown_parked--;
        c->r->slots[c->tenant].unknown_parked--;
    } else if (c->park == PARK_ADMIN)
        router_park_remove(&c->r->admin_waiters, c);
    else if (c->park == PARK_POLICY)
        router_park_remove(&c->r->policy_waiters, c);
    else if (c->park == PARK_TEXT) {
        router_park_remove(&c->r->text_waiters, c);
        router_text_call_detach(c);
    }
    c->park = PARK_NONE;
    c->req = NULL;
    uv_timer_stop(&c->timer);
}

static void on_park_timeout(uv_timer_t *t)
{
    struct rctx *c = t->data;
    if (c->park == PARK_UNKNOWN) {
        registry_unpark_unknown(c, 1);
    } else if (c->park == PARK_POLL) {
        struct request *q = c->req;
        uint32_t offset = c->offset;
        router_unpark(c);
        router_reply_update(c, q, offset); /* the wait ran out: an empty update */
    } else if (c->park == PARK_STATS) {
        router_unpark(c);
        router_reply_error(c, PAGODA_ETIMEDOUT,
                           "the scheduler did not answer a stats request within %u ms",
                           c->r->cfg.stats_timeout_ms);
    } else if (c->park == PARK_ADMIN || c->park == PARK_POLICY) {
        router_unpark(c);
        admin_on_timeout(c);
    } else if (c->park == PARK_TEXT) {
        router_unpark(c);
        router_reply_error(c, PAGODA_ETIMEDOUT, "tokenize: not done within %u ms",
                           ROUTER_TEXT_CALL_TIMEOUT_MS);
    }
}

/* A tenant's share of the parked calls (router_may_park). */
static uint32_t tenant_park_share(const struct tenant_slot *slot)
{
    return ROUTER_PARKED_PER_ADMITTED * slot->limit + ROUTER_MAX_TENANT_TEXT_CALLS + 16;
}

int router_may_park(const struct router *r, const struct rctx *c)
{
    if (r->num_parked >= r->cfg.max_parked_calls)
        return 0;
    return r->tenants == NULL || c->caller == CALLER_NONE ||
           r->slots[c->caller].parked < tenant_park_share(&r->slots[c->caller]);
}

void router_park(struct rctx **list, struct rctx *c, uint32_t timeout_ms)
{
    park_push(list, c);
    uv_timer_start(&c->timer, on_park_timeout, timeout_ms, 0);
}

/* Answers every poll parked on q that now has something to say. */
void router_wake_waiters(struct request *q)
{
    struct rctx *c = q->waiters;
    while (c != NULL) {
        struct rctx *next = c->next;
        if (c->offset < q->num_tokens || q->finish != PAGODA__FINISH_REASON__FINISH_NONE) {
            uint32_t offset = c->offset;
            router_unpark(c);
            router_reply_update(c, q, offset);
        }
        c = next;
    }
}

/* ---- calls ----------------------------------------------------------------------------------- */

static void handle_health(struct router *r, struct rctx *c)
{
    Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
    resp.result_case = PAGODA__CLIENT_RESPONSE__RESULT_HEALTHY;
    resp.healthy = router_link_up(r) && !r->draining;
    if (r->model_positions > 0) { /* what /v1/models lists as max_model_len */
        resp.has_max_model_len = 1;
        resp.max_model_len = r->model_positions;
    }
    if (r->draining)
        resp.error_message = (char *)"the router is draining";
    else if (!router_link_up(r))
        resp.error_message = (char *)"the scheduler link is down";
    router_reply(c, &resp);
}

/* Who may make the call: Health anyone, unless it asks for its key to be checked (check_key: then
 * as a Submit); Submit, Poll and Cancel a tenant's key; Stats a tenant's or an admin key; the
 * admin API an admin key only. Without a tenants file every key (or none) is the default tenant's
 * and there is no admin key. Answers the call and returns nonzero when it is refused; otherwise
 * *tenant is the caller's slot (unused when *admin is set for an admin). */
static int check_caller(struct router *r, struct rctx *c, const Pagoda__ClientRequest *req,
                        uint32_t *tenant, int *admin_out)
{
    *tenant = 0;
    *admin_out = 0;
    if (req->call_case == PAGODA__CLIENT_REQUEST__CALL_HEALTH &&
        !(req->health != NULL && req->health->has_check_key && req->health->check_key))
        return 0;
    int admin = 0;
    int rc = tenancy_authenticate(r, req->api_key, tenant, &admin);
    *admin_out = admin;
    if (req->call_case == PAGODA__CLIENT_REQUEST__CALL_ADMIN) {
        if (admin)
            return 0;
        r->refused_keys++;
        if (r->tenants == NULL || r->tenants->num_admin_keys == 0)
            router_reply_error(c, PAGODA_EPERM,
                               "admin: no admin keys configured (admin_keys in the tenants file)");
        else
            router_reply_error(c, PAGODA_EPERM, "admin: not an admin key");
        return -1;
    }
    if (rc != 0) {
        /* The same answer for a missing and a wrong key, and nothing about who exists. */
        r->refused_keys++;
        router_reply_error(c, PAGODA_EPERM, "unknown API key");
        return -1;
    }
    if (admin && req->call_case != PAGODA__CLIENT_REQUEST__CALL_STATS) {
        r->refused_keys++;
        router_reply_error(c, PAGODA_EPERM,
                           "an admin key may not submit, poll, cancel, tokenize or pass a "
                           "Health's key check: use a tenant's key");
        return -1;
    }
    return 0;
}

/* protobuf-c's allocator for client messages: the system's, with a budget of allocations, so
 * that unpacking a message of millions of empty repeated strings fails (as malformed) after
 * ROUTER_MAX_UNPACK_ALLOCATIONS instead of costing the loop millions of mallocs. */
struct unpack_budget {
    uint32_t left;
};

static void *budget_alloc(void *data, size_t size)
{
    struct unpack_budget *b = data;
    if (b->left == 0)
        return NULL;
    b->left--;
    return malloc(size);
}

static void budget_free(void *data, void *p)
{
    (void)data;
    free(p);
}

/* Loop thread: one call from a client. Every path answers the call or parks it. */
static void handle_call(struct router *r, struct rctx *c)
{
    nng_msg *m = c->msg;
    c->msg = NULL;
    size_t len = nng_msg_len(m);
    struct unpack_budget budget = {.left = ROUTER_MAX_UNPACK_ALLOCATIONS};
    ProtobufCAllocator alloc = {
        .alloc = budget_alloc, .free = budget_free, .allocator_data = &budget};
    Pagoda__ClientRequest *req = (Pagoda__ClientRequest *)protobuf_c_message_unpack(
        &pagoda__client_request__descriptor, &alloc, len, nng_msg_body(m));
    nng_msg_free(m);
    if (req == NULL) {
        r->malformed_requests++;
        router_reply_error(c, PAGODA_EFORMAT,
                           "malformed request: %zu bytes that are not a ClientRequest (or that "
                           "hold more than %u strings and messages)",
                           len, ROUTER_MAX_UNPACK_ALLOCATIONS);
        return;
    }
    uint32_t tenant = 0;
    int admin = 0;
    c->caller = CALLER_NONE;
    if (req->call_case != PAGODA__CLIENT_REQUEST__CALL__NOT_SET &&
        check_caller(r, c, req, &tenant, &admin) != 0) {
        protobuf_c_message_free_unpacked(&req->base, &alloc);
        return;
    }
    if (!admin)
        c->caller = tenant;
    switch (req->call_case) {
    case PAGODA__CLIENT_REQUEST__CALL_SUBMIT:
        registry_handle_submit(r, c, tenant, req->submit);
        break;
    case PAGODA__CLIENT_REQUEST__CALL_POLL:
        registry_handle_poll(r, c, tenant, req->poll);
        break;
    case PAGODA__CLIENT_REQUEST__CALL_CANCEL:
        registry_handle_cancel(r, c, tenant, req->cancel);
        break;
    case PAGODA__CLIENT_REQUEST__CALL_HEALTH:
        handle_health(r, c);
        break;
    case PAGODA__CLIENT_REQUEST__CALL_STATS:
        link_handle_stats(r, c, tenant, admin);
        break;
    case PAGODA__CLIENT_REQUEST__CALL_ADMIN:
        admin_handle(r, c, req->admin);
        break;
    case PAGODA__CLIENT_REQUEST__CALL_TOKENIZE:
        router_text_handle_tokenize(r, c, tenant, req->tokenize);
        break;
    default:
        r->malformed_requests++;
        router_reply_error(c, PAGODA_EFORMAT,
                           "malformed request: it names no call (submit, poll, "
                           "cancel, health, stats, admin or tokenize)");
    }
    protobuf_c_message_free_unpacked(&req->base, &alloc);
}

/* ---- contexts -------------------------------------------------------------------------------- */

/* NNG thread: a context's receive or send completed. A received call goes to the loop through
 * the mailbox; a completed send starts the next receive. Never blocks. */
static void on_ctx_io(void *arg)
{
    struct rctx *c = arg;
    struct router *r = c->r;
    int rv = nng_aio_result(c->aio);
    if (c->sending) {
        c->sending = 0;
        if (rv != 0)
            nng_msg_free(nng_aio_get_msg(c->aio)); /* not sent: still ours */
        arm_recv(c);
        return;
    }
    if (rv != 0) {
        if (rv != NNG_ECLOSED && rv != NNG_ECANCELED)
            arm_recv(c);
        return;
    }
    nng_msg *m = nng_aio_get_msg(c->aio);
    c->pipe = (uint32_t)nng_pipe_id(nng_msg_get_pipe(m));
    pipe_call(r->pipes, c->pipe, 1);
    pthread_mutex_lock(&r->lock);
    int closing = atomic_load(&r->closing);
    if (!closing) {
        c->msg = m;
        c->next_mail = NULL;
        if (r->mail_tail)
            r->mail_tail->next_mail = c;
        else
            r->mail_head = c;
        r->mail_tail = c;
    }
    pthread_mutex_unlock(&r->lock);
    if (closing)
        nng_msg_free(m);
    else
        uv_async_send(&r->async);
}

void front_on_mail(struct router *r)
{
    pthread_mutex_lock(&r->lock);
    struct rctx *list = r->mail_head;
    r->mail_head = r->mail_tail = NULL;
    pthread_mutex_unlock(&r->lock);
    while (list != NULL) {
        struct rctx *next = list->next_mail;
        list->next_mail = NULL;
        handle_call(r, list);
        list = next;
    }
    if (!atomic_load(&r->closing))
        front_ensure_contexts(r);
}

/* Opens one more context and starts it receiving. */
static int ctx_add(struct router *r)
{
    struct rctx *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return PAGODA_ENOMEM;
    c->r = r;
    c->caller = CALLER_NONE;
    int rv = nng_ctx_open(&c->ctx, r->rep);
    if (rv != 0) {
        free(c);
        return wire_error(rv, "nng_ctx_open");
    }
    c->ctx_open = 1;
    if ((rv = nng_aio_alloc(&c->aio, on_ctx_io, c)) != 0) {
        nng_ctx_close(c->ctx);
        free(c);
        return wire_error(rv, "nng_aio_alloc");
    }
    uv_timer_init(r->loop, &c->timer);
    c->timer.data = c;
    c->all_next = r->ctxs;
    r->ctxs = c;
    r->num_ctxs++;
    arm_recv(c);
    return 0;
}

/* Keeps cfg.num_contexts contexts free to receive beside the parked calls (a context whose reply
 * is on its way is free again in a moment), up to max_ctxs: a parked poll never keeps others
 * from being answered. */
int front_ensure_contexts(struct router *r)
{
    while (r->num_ctxs < r->max_ctxs && r->num_ctxs - r->num_parked < r->cfg.num_contexts) {
        int rc = ctx_add(r);
        if (rc != 0) {
            log_warn("could not open another context (%u open, %u parked): %s", r->num_ctxs,
                     r->num_parked, pagoda_error_detail());
            return rc;
        }
    }
    return 0;
}

int front_open(struct router *r)
{
    int rv = nng_rep0_open(&r->rep);
    if (rv != 0)
        return wire_error(rv, "nng_rep0_open");
    r->rep_open = 1;
    r->recv_max_bytes = router_max_message_bytes(r->cfg.max_prompt_tokens);
    if ((rv = nng_socket_set_size(r->rep, NNG_OPT_RECVMAXSZ, r->recv_max_bytes)) != 0)
        return wire_error(rv, "NNG_OPT_RECVMAXSZ");
    if ((rv = nng_pipe_notify(r->rep, NNG_PIPE_EV_ADD_PRE, on_rep_pipe, r)) != 0 ||
        (rv = nng_pipe_notify(r->rep, NNG_PIPE_EV_REM_POST, on_rep_pipe, r)) != 0)
        return wire_error(rv, "nng_pipe_notify");
    int rc = front_ensure_contexts(r);
    if (rc != 0)
        return rc;
    if ((rv = nng_listen(r->rep, r->listen_url, NULL, 0)) != 0)
        return wire_error(rv, r->listen_url);
    return 0;
}
