/* The admin API (pagoda.proto AdminRequest): calls from a key of the tenants file's admin_keys
 * (router_front.c checks the key before admin_handle).
 *
 *   tenants  every tenant's configuration joined with the scheduler's figures (AdminCall{figures}:
 *            TenantFigures by tenant name, NamespaceFigures by namespace name), and every pin
 *   pin      adds or replaces a runtime pin, pushes the Policy, answers once the scheduler has
 *            applied it (PolicyApplied of that version or a later one) with the pin's status
 *   unpin    removes a pin (a file pin too, until the next reload), the same way
 *   flush    drops a tenant's namespace (its group's when it has one) or a group's
 *            (AdminCall{flush_namespace}), answers how many blocks went
 *   reload   reads the tenants file again, on libuv's threadpool (the loop serves everyone
 *            meanwhile; router_tenants_load refuses a FIFO, a directory or a file too large
 *            without blocking): on any error nothing changes; else the same way as pin. One
 *            read at a time: a reload while another is reading is refused with PAGODA_EBUSY
 *            (retry). The read and the scheduler's PolicyApplied share admin_timeout_ms; a read
 *            that takes longer is answered PAGODA_ETIMEDOUT and its late result is dropped.
 *
 * A tenant's Stats (admin_tenant_stats) also asks the scheduler for the figures, and answers
 * with the caller's own only.
 *
 * A call that needs the scheduler is refused with PAGODA_ECLOSED while the link is down (and
 * changes nothing), and answered with PAGODA_ETIMEDOUT when the scheduler has not answered within
 * cfg.admin_timeout_ms; a pin, unpin or reload then stays configured, and the Policy carrying it
 * is sent again whenever the link comes up. */
#include "router/router_internal.h"

#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int send_admin_call(struct engine *e, uint64_t cookie, int figures, const char *flush_ns)
{
    Pagoda__Internal__AdminCall call = PAGODA__INTERNAL__ADMIN_CALL__INIT;
    call.has_cookie = 1;
    call.cookie = cookie;
    call.has_figures = figures != 0;
    call.figures = figures != 0;
    call.flush_namespace = (char *)flush_ns;
    Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_ADMIN;
    env.admin = &call;
    return router_send(e, &env);
}

static int engine_usable(const struct engine *e)
{
    return engine_linked(e) && !e->hung;
}

uint64_t admin_applied_version(const struct router *r)
{
    uint64_t v = UINT64_MAX;
    for (uint32_t i = 0; i < r->num_engines; i++)
        if (engine_usable(&r->engines[i]) && r->engines[i].applied_version < v)
            v = r->engines[i].applied_version;
    return v == UINT64_MAX ? 0 : v;
}

/* Sends an AdminCall for c to every usable engine (the same cookie) and parks it until the
 * AdminResult with its cookie has arrived from each. */
static void ask_scheduler(struct router *r, struct rctx *c, enum admin_op op, const char *flush_ns)
{
    uint64_t cookie = ++r->admin_cookie; /* from 1: cookie 0 is a reload's read */
    int figures = op == ADMIN_OP_TENANTS || op == ADMIN_OP_STATS;
    uint64_t asked = 0;
    int rc = PAGODA_ECLOSED;
    for (uint32_t i = 0; i < r->num_engines; i++) {
        if (!engine_usable(&r->engines[i]))
            continue;
        int rv = send_admin_call(&r->engines[i], cookie, figures, flush_ns);
        if (rv == 0)
            asked |= 1ull << i;
        else
            rc = rv;
    }
    if (asked == 0) {
        router_reply_error(c, rc, "%s: %s", op == ADMIN_OP_STATS ? "stats" : "admin",
                           rc == PAGODA_ECLOSED ? "the scheduler link is down"
                                                : pagoda_error_detail());
        return;
    }
    c->engines_asked = c->engines_waited = asked;
    c->admin_acc = NULL;
    c->park = PARK_ADMIN;
    c->admin_op = op;
    c->cookie = cookie;
    router_park(&r->admin_waiters, c,
                op == ADMIN_OP_STATS ? r->cfg.stats_timeout_ms : r->cfg.admin_timeout_ms);
}

/* Parks c until the scheduler has applied policy version (or a later one), or timeout_ms. */
static void wait_applied_for(struct router *r, struct rctx *c, enum admin_op op, uint64_t version,
                             const char *pin_name, uint32_t timeout_ms)
{
    c->park = PARK_POLICY;
    c->admin_op = op;
    c->cookie = version;
    snprintf(c->admin_name, sizeof(c->admin_name), "%s", pin_name ? pin_name : "");
    router_park(&r->policy_waiters, c, timeout_ms);
}

static void wait_applied(struct router *r, struct rctx *c, enum admin_op op, uint64_t version,
                         const char *pin_name)
{
    wait_applied_for(r, c, op, version, pin_name, r->cfg.admin_timeout_ms);
}

/* A pin as the admin sees it. A status the scheduler just sent (fresh, from an AdminResult) is
 * used when the pin's tokens are the ones the scheduler has applied; otherwise the last
 * PolicyApplied's. */
static void fill_pin_info(const struct router *r, const struct pin_state *p,
                          const Pagoda__Internal__PinStatus *fresh, Pagoda__PinInfo *out)
{
    pagoda__pin_info__init(out);
    out->name = (char *)p->pin.name;
    out->has_num_tokens = out->has_ready = out->has_blocks = out->has_from_file = 1;
    out->num_tokens = p->pin.num_tokens;
    out->n_tenants = p->pin.num_tenants;
    out->tenants = p->pin.tenants;
    out->from_file = p->from_file != 0;
    int32_t error_code = p->error_code;
    const char *error = p->error_message;
    out->ready = p->has_status && p->ready;
    out->blocks = p->has_status ? p->blocks : 0;
    if (fresh != NULL && p->version <= r->applied_version) {
        out->ready = fresh->has_ready && fresh->ready;
        out->blocks = fresh->has_blocks ? fresh->blocks : 0;
        error_code = fresh->has_error_code ? fresh->error_code : 0;
        error = fresh->error_message;
    }
    if (error_code != 0)
        out->error = (char *)(error != NULL ? error : pagoda_strerror(error_code));
}

static const Pagoda__Internal__PinStatus *find_pin_status(const Pagoda__Internal__AdminResult *res,
                                                          const char *name)
{
    for (size_t i = 0; res != NULL && i < res->n_pins; i++)
        if (res->pins[i]->name != NULL && strcmp(res->pins[i]->name, name) == 0)
            return res->pins[i];
    return NULL;
}

/* Answers with every pin (and, with res, every tenant joined with res's figures). */
static void reply_listing(struct router *r, struct rctx *c,
                          const Pagoda__Internal__AdminResult *res)
{
    const struct router_tenants *t = r->tenants;
    uint32_t num_tenants = res != NULL && t != NULL ? t->count : 0;
    Pagoda__TenantInfo *ti = calloc(num_tenants ? num_tenants : 1, sizeof(*ti));
    Pagoda__TenantInfo **ti_ptrs = calloc(num_tenants ? num_tenants : 1, sizeof(*ti_ptrs));
    Pagoda__PinInfo *pi = calloc(r->num_pins ? r->num_pins : 1, sizeof(*pi));
    Pagoda__PinInfo **pi_ptrs = calloc(r->num_pins ? r->num_pins : 1, sizeof(*pi_ptrs));
    uint32_t *offsets = NULL;
    char **pin_names = NULL;
    if (ti == NULL || ti_ptrs == NULL || pi == NULL || pi_ptrs == NULL ||
        tenancy_pins_by_tenant(r, &offsets, &pin_names) != 0) {
        router_reply_error(c, PAGODA_ENOMEM, "admin: out of memory for the answer");
        goto out;
    }
    for (uint32_t i = 0; i < num_tenants; i++) {
        const struct router_tenant *tn = &t->tenants[i];
        Pagoda__TenantInfo *info = &ti[i];
        pagoda__tenant_info__init(info);
        info->name = (char *)tn->name;
        info->group = tn->group >= 0 ? (char *)t->groups[tn->group].name : NULL;
        info->namespace_ = (char *)tn->namespace_name;
        info->has_max_running = info->has_max_waiting = info->has_cache_quota_blocks = 1;
        info->max_running = tn->max_running;
        info->max_waiting = tn->max_waiting;
        info->cache_quota_blocks = tn->cache_quota_blocks;
        info->n_pins = offsets[i + 1] - offsets[i];
        info->pins = pin_names + offsets[i];
        info->has_lookups = info->has_hits = info->has_hit_rate = info->has_query_tokens = 1;
        info->has_hit_tokens = info->has_cached_blocks = info->has_evictions = 1;
        info->has_running = info->has_waiting = 1;
        for (size_t k = 0; k < res->n_tenants; k++) {
            const Pagoda__Internal__TenantFigures *f = res->tenants[k];
            if (f->name == NULL || strcmp(f->name, tn->name) != 0)
                continue;
            info->lookups = f->lookups;
            info->hits = f->hits;
            info->query_tokens = f->query_tokens;
            info->hit_tokens = f->hit_tokens;
            info->hit_rate =
                f->query_tokens == 0 ? 0.0 : (double)f->hit_tokens / (double)f->query_tokens;
            info->running = f->running;
            info->waiting = f->waiting;
            break;
        }
        for (size_t k = 0; k < res->n_namespaces; k++) {
            const Pagoda__Internal__NamespaceFigures *f = res->namespaces[k];
            if (f->name == NULL || strcmp(f->name, tn->namespace_name) != 0)
                continue;
            info->cached_blocks = f->cached_blocks;
            info->evictions = f->evictions;
            break;
        }
        ti_ptrs[i] = info;
    }
    for (uint32_t p = 0; p < r->num_pins; p++) {
        fill_pin_info(r, &r->pins[p], find_pin_status(res, r->pins[p].pin.name), &pi[p]);
        pi_ptrs[p] = &pi[p];
    }
    Pagoda__AdminResponse admin = PAGODA__ADMIN_RESPONSE__INIT;
    admin.n_tenants = num_tenants;
    admin.tenants = ti_ptrs;
    admin.n_pins = r->num_pins;
    admin.pins = pi_ptrs;
    Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
    resp.result_case = PAGODA__CLIENT_RESPONSE__RESULT_ADMIN;
    resp.admin = &admin;
    router_reply(c, &resp);
out:
    free(ti);
    free(ti_ptrs);
    free(pi);
    free(pi_ptrs);
    free(offsets);
    free(pin_names);
}

static void reply_admin(struct rctx *c, Pagoda__AdminResponse *admin)
{
    Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
    resp.result_case = PAGODA__CLIENT_RESPONSE__RESULT_ADMIN;
    resp.admin = admin;
    router_reply(c, &resp);
}

/* The answer to a pin once the scheduler has applied it: its status, or the error the scheduler
 * found in it (a token outside the vocabulary, a prefix too long). */
static void reply_pin(struct router *r, struct rctx *c, const char *name)
{
    const struct pin_state *p = tenancy_find_pin(r, name);
    if (p == NULL) {
        router_reply_error(c, PAGODA_ENOENT,
                           "pin: \"%s\" was unpinned before the scheduler applied it", name);
        return;
    }
    if (p->has_status && p->error_code != 0) {
        router_reply_error(c, p->error_code, "pin \"%s\": %s", name,
                           p->error_message ? p->error_message : pagoda_strerror(p->error_code));
        return;
    }
    Pagoda__PinInfo info, *ptr = &info;
    fill_pin_info(r, p, NULL, &info);
    Pagoda__AdminResponse admin = PAGODA__ADMIN_RESPONSE__INIT;
    admin.n_pins = 1;
    admin.pins = &ptr;
    reply_admin(c, &admin);
}

static void answer_applied(struct router *r, struct rctx *c)
{
    Pagoda__AdminResponse empty = PAGODA__ADMIN_RESPONSE__INIT;
    switch (c->admin_op) {
    case ADMIN_OP_PIN:
        reply_pin(r, c, c->admin_name);
        break;
    case ADMIN_OP_RELOAD:
        reply_listing(r, c, NULL);
        break;
    default:
        reply_admin(c, &empty);
    }
}

/* Answers the calls waiting for a policy version every usable engine has applied. */
static void wake_policy_waiters(struct router *r)
{
    r->applied_version = admin_applied_version(r);
    struct rctx *c = r->policy_waiters;
    while (c != NULL) {
        struct rctx *next = c->next;
        if (r->applied_version > 0 && c->cookie <= r->applied_version &&
            c->cookie <= r->pins_saved_version) {
            router_unpark(c);
            if (r->pins_failed_version >= c->cookie)
                router_reply_error(c, PAGODA_EIO,
                                   "admin: the change is applied (the scheduler has policy version "
                                   "%llu), but the runtime pins could not be saved, so a restarted "
                                   "router would not have it: %s",
                                   (unsigned long long)c->cookie, r->pins_failed_detail);
            else
                answer_applied(r, c);
        }
        c = next;
    }
}

void admin_on_pins_saved(struct router *r)
{
    wake_policy_waiters(r);
}

void admin_on_policy_applied(struct router *r, struct engine *e,
                             const Pagoda__Internal__PolicyApplied *pa)
{
    if (pa == NULL || !pa->has_version) {
        r->malformed_internal++;
        log_warn("a PolicyApplied without a version: ignored");
        return;
    }
    if (pa->version > r->policy_version) {
        /* From before a router restart: versions start again at 1 in each router process. */
        log_warn("a PolicyApplied for version %llu, beyond this router's %llu: ignored",
                 (unsigned long long)pa->version, (unsigned long long)r->policy_version);
        return;
    }
    if (pa->version > e->applied_version)
        e->applied_version = pa->version;
    tenancy_on_policy_applied(r, pa);
    log_debug("engine %u applied policy version %llu", e->index, (unsigned long long)pa->version);
    wake_policy_waiters(r);
}

/* A tenant's Stats: its own figures from the scheduler's (its prefix-cache lookups, its running
 * and waiting requests, its namespace's cached blocks and evictions: its group's namespace when
 * it is in one, which the group shares by configuration) and the router's of it. Nothing global
 * (the pool, the steps, the other tenants' requests) is filled in: those are an admin key's. */
static void reply_tenant_stats(struct router *r, struct rctx *c,
                               const Pagoda__Internal__AdminResult *res)
{
    const struct tenant_slot *slot = &r->slots[c->tenant];
    const struct router_tenant *tn = router_tenants_find(r->tenants, slot->name);
    Pagoda__Stats st = PAGODA__STATS__INIT;
    st.tenant = (char *)slot->name;
    for (size_t k = 0; k < res->n_tenants; k++) {
        const Pagoda__Internal__TenantFigures *f = res->tenants[k];
        if (f->name == NULL || strcmp(f->name, slot->name) != 0)
            continue;
        st.has_running = st.has_waiting = 1;
        st.running = f->running;
        st.waiting = f->waiting;
        st.has_prefix_query_tokens = st.has_prefix_hit_tokens = st.has_prefix_hit_rate = 1;
        st.prefix_query_tokens = f->query_tokens;
        st.prefix_hit_tokens = f->hit_tokens;
        st.prefix_hit_rate =
            f->query_tokens == 0 ? 0.0 : (double)f->hit_tokens / (double)f->query_tokens;
        break;
    }
    for (size_t k = 0; tn != NULL && k < res->n_namespaces; k++) {
        const Pagoda__Internal__NamespaceFigures *f = res->namespaces[k];
        if (f->name == NULL || strcmp(f->name, tn->namespace_name) != 0)
            continue;
        st.has_cached_blocks = st.has_evictions = 1;
        st.cached_blocks = f->cached_blocks;
        st.evictions = f->evictions;
        break;
    }
    st.has_live_requests = st.has_finished_requests = st.has_duplicate_submits = 1;
    st.live_requests = slot->live;
    st.finished_requests = slot->num_finished;
    st.duplicate_submits = slot->duplicate_submits;
    st.has_scheduler_connected = 1;
    st.scheduler_connected = router_link_up(r);
    Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
    resp.result_case = PAGODA__CLIENT_RESPONSE__RESULT_STATS;
    resp.stats = &st;
    router_reply(c, &resp);
}

void admin_tenant_stats(struct router *r, struct rctx *c, uint32_t slot)
{
    if (!router_link_up(r)) {
        router_reply_error(c, PAGODA_ECLOSED, "stats: the scheduler link is down");
        return;
    }
    c->tenant = slot;
    ask_scheduler(r, c, ADMIN_OP_STATS, NULL);
}

/* Adds another engine's figures to acc's: tenants and namespaces by name (every engine has the
 * same Policy, so the same names), flushed blocks. Pins keep the first engine's statuses. */
static void merge_result(Pagoda__Internal__AdminResult *acc,
                         const Pagoda__Internal__AdminResult *res)
{
    for (size_t k = 0; k < res->n_tenants; k++) {
        const Pagoda__Internal__TenantFigures *f = res->tenants[k];
        for (size_t j = 0; f->name != NULL && j < acc->n_tenants; j++) {
            Pagoda__Internal__TenantFigures *a = acc->tenants[j];
            if (a->name == NULL || strcmp(a->name, f->name) != 0)
                continue;
            a->lookups += f->lookups;
            a->hits += f->hits;
            a->query_tokens += f->query_tokens;
            a->hit_tokens += f->hit_tokens;
            a->running += f->running;
            a->waiting += f->waiting;
            break;
        }
    }
    for (size_t k = 0; k < res->n_namespaces; k++) {
        const Pagoda__Internal__NamespaceFigures *f = res->namespaces[k];
        for (size_t j = 0; f->name != NULL && j < acc->n_namespaces; j++) {
            Pagoda__Internal__NamespaceFigures *a = acc->namespaces[j];
            if (a->name == NULL || strcmp(a->name, f->name) != 0)
                continue;
            a->cached_blocks += f->cached_blocks;
            a->evictions += f->evictions;
            a->inserted += f->inserted;
            break;
        }
    }
    acc->has_flushed_blocks |= res->has_flushed_blocks;
    acc->flushed_blocks += res->flushed_blocks;
}

static void drop_acc(struct rctx *c)
{
    if (c->admin_acc != NULL)
        protobuf_c_message_free_unpacked(&c->admin_acc->base, NULL);
    c->admin_acc = NULL;
}

/* Every engine asked has answered (or gone): c is answered from the merged results. */
static void admin_finish(struct router *r, struct rctx *c)
{
    router_unpark(c);
    const Pagoda__Internal__AdminResult *res = c->admin_acc->admin;
    if (c->admin_op == ADMIN_OP_STATS) {
        reply_tenant_stats(r, c, res);
    } else if (c->admin_op == ADMIN_OP_TENANTS) {
        reply_listing(r, c, res);
    } else {
        Pagoda__AdminResponse admin = PAGODA__ADMIN_RESPONSE__INIT;
        admin.has_flushed_blocks = 1;
        admin.flushed_blocks = res->has_flushed_blocks ? res->flushed_blocks : 0;
        reply_admin(c, &admin);
    }
    drop_acc(c);
}

void admin_on_result(struct router *r, struct engine *e, Pagoda__Internal__ToRouter *msg)
{
    const Pagoda__Internal__AdminResult *res = msg->admin;
    uint64_t bit = 1ull << e->index;
    if (res == NULL || !res->has_cookie) {
        r->malformed_internal++;
        log_warn("an AdminResult without a cookie: ignored");
        protobuf_c_message_free_unpacked(&msg->base, NULL);
        return;
    }
    struct rctx *c = r->admin_waiters;
    while (c != NULL && (c->cookie != res->cookie || c->admin_op == ADMIN_OP_RELOAD ||
                         !(c->engines_waited & bit)))
        c = c->next;
    if (c == NULL) {
        log_debug("an AdminResult for cookie %llu, which no call waits for (it timed out)",
                  (unsigned long long)res->cookie);
        protobuf_c_message_free_unpacked(&msg->base, NULL);
        return;
    }
    if (res->has_error_code && res->error_code != 0) {
        router_unpark(c);
        drop_acc(c);
        router_reply_error(c, res->error_code, "%s: the scheduler: %s",
                           c->admin_op == ADMIN_OP_STATS ? "stats" : "admin",
                           res->error_message ? res->error_message
                                              : pagoda_strerror(res->error_code));
        protobuf_c_message_free_unpacked(&msg->base, NULL);
        return;
    }
    c->engines_waited &= ~bit;
    if (c->admin_acc == NULL) {
        c->admin_acc = msg;
    } else {
        merge_result(c->admin_acc->admin, res);
        protobuf_c_message_free_unpacked(&msg->base, NULL);
    }
    if (c->engines_waited == 0)
        admin_finish(r, c);
}

void admin_on_engine_down(struct router *r, struct engine *e)
{
    uint64_t bit = 1ull << e->index;
    struct rctx *c = r->admin_waiters;
    while (c != NULL) {
        struct rctx *next = c->next;
        if (c->admin_op != ADMIN_OP_RELOAD && (c->engines_waited & bit)) {
            c->engines_waited &= ~bit;
            c->engines_asked &= ~bit;
            if (c->engines_waited == 0 && c->admin_acc != NULL) {
                admin_finish(r, c);
            } else if (c->engines_waited == 0) {
                router_unpark(c);
                router_reply_error(c, PAGODA_ECLOSED, "%s: the scheduler link is down",
                                   c->admin_op == ADMIN_OP_STATS ? "stats" : "admin");
            }
        }
        c = next;
    }
    wake_policy_waiters(r);
}

void admin_on_timeout(struct rctx *c)
{
    struct router *r = c->r;
    drop_acc(c);
    if (c->admin_op == ADMIN_OP_STATS)
        router_reply_error(c, PAGODA_ETIMEDOUT,
                           "the scheduler did not answer a stats request within %u ms",
                           r->cfg.stats_timeout_ms);
    else if (c->admin_op == ADMIN_OP_RELOAD && c->cookie == 0)
        router_reply_error(c, PAGODA_ETIMEDOUT,
                           "reload: reading %s took more than %u ms: nothing changed (the read's "
                           "late result is dropped)",
                           r->tenants_file, r->cfg.admin_timeout_ms);
    else if (c->admin_op == ADMIN_OP_TENANTS || c->admin_op == ADMIN_OP_FLUSH)
        router_reply_error(c, PAGODA_ETIMEDOUT, "admin: the scheduler did not answer within %u ms",
                           r->cfg.admin_timeout_ms);
    else if (c->cookie > r->pins_saved_version && c->cookie <= r->applied_version)
        router_reply_error(c, PAGODA_ETIMEDOUT,
                           "admin: the scheduler applied policy version %llu, but saving the "
                           "runtime pins (RUN_DIR/router-pins.json) took more than %u ms; the "
                           "change stays configured",
                           (unsigned long long)c->cookie, r->cfg.admin_timeout_ms);
    else
        router_reply_error(c, PAGODA_ETIMEDOUT,
                           "admin: the scheduler did not apply policy version %llu within %u ms; "
                           "the change stays configured and goes out with every later policy",
                           (unsigned long long)c->cookie, r->cfg.admin_timeout_ms);
}

/* ---- the calls ------------------------------------------------------------------------------ */

static int need_link(struct router *r, struct rctx *c, const char *what)
{
    if (router_link_up(r))
        return 0;
    router_reply_error(c, PAGODA_ECLOSED, "%s: the scheduler link is down (nothing changed)", what);
    return -1;
}

static void handle_pin(struct router *r, struct rctx *c, const Pagoda__AdminPinRequest *req)
{
    for (size_t i = 0; i < req->n_tenants; i++)
        if (router_tenants_find(r->tenants, req->tenants[i]) == NULL) {
            router_reply_error(c, PAGODA_ENOENT, "pin: no tenant named \"%.64s\"",
                               req->tenants[i] ? req->tenants[i] : "");
            return;
        }
    struct router_pin pin;
    int rc = router_pin_make(r->tenants, "pin", req->name, req->token_ids, req->n_token_ids,
                             (const char *const *)req->tenants, req->n_tenants, &pin);
    if (rc != 0) {
        router_reply_error(c, rc, "%s", pagoda_error_detail());
        return;
    }
    if (need_link(r, c, "pin") != 0) {
        router_pin_fini(&pin);
        return;
    }
    int changed = 0;
    if ((rc = tenancy_set_pin(r, &pin, &changed)) != 0) {
        router_pin_fini(&pin);
        router_reply_error(c, rc, "pin: %s", pagoda_error_detail());
        return;
    }
    if (changed)
        tenancy_changed(r);
    const struct pin_state *p = tenancy_find_pin(r, req->name);
    log_info("admin: pin \"%s\" (%u tokens, %u tenants)%s", p->pin.name, p->pin.num_tokens,
             p->pin.num_tenants, changed ? "" : ": unchanged");
    if (!changed && p->has_status && p->version <= r->applied_version) {
        reply_pin(r, c, p->pin.name); /* a resent call for a pin already computed */
        return;
    }
    /* A pin whose tokens stayed keeps its version, but the new tenants go out with this one. */
    wait_applied(r, c, ADMIN_OP_PIN, changed ? r->policy_version : p->version, p->pin.name);
}

static void handle_unpin(struct router *r, struct rctx *c, const Pagoda__AdminUnpinRequest *req)
{
    if (!router_name_ok(req->name)) {
        router_reply_error(c, PAGODA_EINVAL, "unpin: name a pin");
        return;
    }
    if (tenancy_find_pin(r, req->name) == NULL) {
        router_reply_error(c, PAGODA_ENOENT, "unpin: no pin named \"%s\"", req->name);
        return;
    }
    if (need_link(r, c, "unpin") != 0)
        return;
    tenancy_remove_pin(r, req->name);
    log_info("admin: unpin \"%s\"", req->name);
    tenancy_changed(r);
    wait_applied(r, c, ADMIN_OP_UNPIN, r->policy_version, NULL);
}

static void handle_flush(struct router *r, struct rctx *c, const Pagoda__AdminFlushRequest *req)
{
    if ((req->tenant == NULL) == (req->group == NULL)) {
        router_reply_error(c, PAGODA_EINVAL, "flush: name a tenant or a group (one of them)");
        return;
    }
    char ns[ROUTER_NAMESPACE_MAX + 1];
    if (req->tenant != NULL) {
        const struct router_tenant *t = router_tenants_find(r->tenants, req->tenant);
        if (t == NULL) {
            router_reply_error(c, PAGODA_ENOENT, "flush: no tenant named \"%.64s\"", req->tenant);
            return;
        }
        snprintf(ns, sizeof(ns), "%s", t->namespace_name);
    } else {
        const struct router_group *g = router_tenants_find_group(r->tenants, req->group);
        if (g == NULL) {
            router_reply_error(c, PAGODA_ENOENT, "flush: no group named \"%.64s\"", req->group);
            return;
        }
        snprintf(ns, sizeof(ns), "g:%s", g->name);
    }
    if (need_link(r, c, "flush") != 0)
        return;
    log_info("admin: flush namespace %s", ns);
    ask_scheduler(r, c, ADMIN_OP_FLUSH, ns);
}

/* Starts the read and parks c (cookie 0: no AdminResult answers it) until
 * admin_on_reload_read. */
static void handle_reload(struct router *r, struct rctx *c)
{
    if (need_link(r, c, "reload") != 0)
        return;
    int rc = tenancy_reload_start(r, 0);
    if (rc != 0) {
        log_warn("admin: reload refused, the configuration stays: %s", pagoda_error_detail());
        router_reply_error(c, rc, "reload: %s (the configuration stays as it was)",
                           pagoda_error_detail());
        return;
    }
    c->park = PARK_ADMIN;
    c->admin_op = ADMIN_OP_RELOAD;
    c->cookie = 0;
    router_park(&r->admin_waiters, c, r->cfg.admin_timeout_ms);
}

void admin_on_reload_read(struct router *r, struct router_tenants *t, int rc, const char *detail,
                          uint64_t started_ms, int by_signal)
{
    if (by_signal) {
        if (rc == 0 && (rc = tenancy_apply(r, t)) != 0)
            detail = rc == PAGODA_ENOMEM ? "out of memory" : pagoda_error_detail();
        if (rc != 0)
            log_error("SIGHUP: reload of %s refused, the configuration stays: %s", r->tenants_file,
                      detail);
        else
            log_info("SIGHUP: %s reloaded (policy version %llu sent to the engines)",
                     r->tenants_file, (unsigned long long)r->policy_version);
        return;
    }
    struct rctx *c = r->admin_waiters;
    while (c != NULL && !(c->admin_op == ADMIN_OP_RELOAD && c->cookie == 0))
        c = c->next;
    if (c == NULL) {
        log_warn("reload: the read of %s ended after its call timed out: %s", r->tenants_file,
                 rc == 0 ? "its result is dropped, nothing changed" : detail);
        router_tenants_free(t);
        return;
    }
    router_unpark(c);
    /* A file without admin keys would refuse every admin call after it, this one's next reload
     * included, until the router restarts: refused here (a SIGHUP's reload, from the operator's
     * shell, takes it). */
    if (rc == 0 && t->num_admin_keys == 0 && r->tenants != NULL && r->tenants->num_admin_keys > 0) {
        router_tenants_free(t);
        rc = PAGODA_EINVAL;
        detail = "the file names no admin_keys, so no admin call (another reload included) would "
                 "be taken after it";
    }
    if (rc == 0 && (rc = tenancy_apply(r, t)) != 0)
        detail = rc == PAGODA_ENOMEM ? "out of memory" : pagoda_error_detail();
    if (rc != 0) {
        log_warn("admin: reload refused, the configuration stays: %s", detail);
        router_reply_error(c, rc, "reload: %s (the configuration stays as it was)", detail);
        return;
    }
    /* The read and the scheduler's PolicyApplied share the call's admin_timeout_ms, so that the
     * answer still comes before libpagoda resends the call. */
    uint64_t spent = uv_now(r->loop) - started_ms;
    uint32_t left =
        spent >= r->cfg.admin_timeout_ms ? 1 : r->cfg.admin_timeout_ms - (uint32_t)spent;
    wait_applied_for(r, c, ADMIN_OP_RELOAD, r->policy_version, NULL, left);
}

void admin_handle(struct router *r, struct rctx *c, const Pagoda__AdminRequest *a)
{
    switch (a->op_case) {
    case PAGODA__ADMIN_REQUEST__OP_TENANTS:
        if (need_link(r, c, "tenants") == 0)
            ask_scheduler(r, c, ADMIN_OP_TENANTS, NULL);
        break;
    case PAGODA__ADMIN_REQUEST__OP_PIN:
        handle_pin(r, c, a->pin);
        break;
    case PAGODA__ADMIN_REQUEST__OP_UNPIN:
        handle_unpin(r, c, a->unpin);
        break;
    case PAGODA__ADMIN_REQUEST__OP_FLUSH:
        handle_flush(r, c, a->flush);
        break;
    case PAGODA__ADMIN_REQUEST__OP_RELOAD:
        handle_reload(r, c);
        break;
    default:
        r->malformed_requests++;
        router_reply_error(c, PAGODA_EFORMAT,
                           "malformed admin request: it names no operation (tenants, pin, "
                           "unpin, flush or reload)");
    }
}
