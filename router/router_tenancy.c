/* The tenancy the router owns (router_internal.h): tenant slots for the registry, the configured
 * pins with what the scheduler last said of them, reloads, and the Policy that tells the
 * scheduler all of it. */
#include "router/router_internal.h"

#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
#include <malloc.h>
#include <stdlib.h>
#include <string.h>

static void pin_state_fini(struct pin_state *p)
{
    router_pin_fini(&p->pin);
    free(p->error_message);
    memset(p, 0, sizeof(*p));
}

/* Room for extra more slots, so that the slot_for calls of a reload cannot fail. */
static int slots_reserve(struct router *r, uint32_t extra)
{
    if (r->num_slots + extra <= r->cap_slots)
        return 0;
    uint32_t cap = r->cap_slots ? r->cap_slots : 16;
    while (cap < r->num_slots + extra)
        cap *= 2;
    struct tenant_slot *s = realloc(r->slots, cap * sizeof(*s));
    if (s == NULL)
        return PAGODA_ENOMEM;
    r->slots = s;
    r->cap_slots = cap;
    return 0;
}

/* The slot of the tenant named name: the one it had (a tenant that a reload removed and a later
 * one brought back finds its requests again), else one that no tenant and no request holds, else
 * a new one. The caller has reserved room. Marks it active with its limits. */
static uint32_t slot_for(struct router *r, const char *name, uint32_t limit, uint32_t max_finished)
{
    uint32_t i, free_slot = UINT32_MAX;
    for (i = 0; i < r->num_slots; i++) {
        if (strcmp(r->slots[i].name, name) == 0)
            break;
        if (free_slot == UINT32_MAX && !r->slots[i].active && r->slots[i].refs == 0 &&
            r->slots[i].parked == 0) /* its calls parked take its share until answered */
            free_slot = i;
    }
    if (i == r->num_slots) {
        if (free_slot != UINT32_MAX)
            i = free_slot;
        else
            r->num_slots++;
        memset(&r->slots[i], 0, sizeof(r->slots[i]));
        snprintf(r->slots[i].name, sizeof(r->slots[i].name), "%s", name);
    }
    r->slots[i].active = 1;
    r->slots[i].limit = limit;
    r->slots[i].max_finished = max_finished;
    return i;
}

/* Gives every tenant of t its slot (room reserved); slots of tenants t does not have become
 * inactive: their keys are gone, their requests stay. */
static void assign_slots(struct router *r, const struct router_tenants *t, uint32_t *slot_of)
{
    for (uint32_t i = 0; i < r->num_slots; i++) {
        r->slots[i].active = 0;
        r->slots[i].limit = 0;
    }
    /* Names that have a slot first: otherwise a new name could take the free slot of a tenant
     * listed later in the file, whose parked calls would then be answered as the newcomer's. */
    for (uint32_t i = 0; i < t->count; i++) {
        slot_of[i] = UINT32_MAX;
        for (uint32_t k = 0; k < r->num_slots; k++)
            if (strcmp(r->slots[k].name, t->tenants[i].name) == 0)
                slot_of[i] = slot_for(r, t->tenants[i].name,
                                      t->tenants[i].max_running + t->tenants[i].max_waiting,
                                      t->tenants[i].max_finished);
    }
    for (uint32_t i = 0; i < t->count; i++)
        if (slot_of[i] == UINT32_MAX)
            slot_of[i] = slot_for(r, t->tenants[i].name,
                                  t->tenants[i].max_running + t->tenants[i].max_waiting,
                                  t->tenants[i].max_finished);
}

/* Takes the file's pins into pins (from_file), leaving t with none: the router's pin table is
 * their one owner. */
static void take_file_pins(struct router_tenants *t, struct pin_state *pins, uint32_t *n)
{
    for (uint32_t i = 0; i < t->num_pins; i++) {
        memset(&pins[*n], 0, sizeof(pins[*n]));
        pins[*n].pin = t->pins[i];
        pins[*n].from_file = 1;
        (*n)++;
        memset(&t->pins[i], 0, sizeof(t->pins[i]));
    }
    t->num_pins = 0;
}

/* A tenants file's parse tree (a jansson value per token id of a pin: about 40 MB for a file of
 * 6 MB), freed once the file is read, stays resident in the reading thread's malloc arena under
 * glibc: each reload on another pool thread kept its own, and the router's RSS grew by about
 * 35 MB a reload up to 250 MB (bench/RESULTS.md). Trimming after each read hands the pages back;
 * a reload does it on the pool's thread, off the loop. */
static void release_parse_memory(void)
{
#ifdef __GLIBC__
    malloc_trim(0);
#endif
}

int tenancy_open(struct router *r, const char *tenants_file)
{
    int rc;
    r->pins = calloc(ROUTER_MAX_PINS, sizeof(*r->pins));
    if (r->pins == NULL)
        return PAGODA_ENOMEM;
    if (tenants_file == NULL) {
        if ((rc = slots_reserve(r, 1)) != 0)
            return rc;
        slot_for(r, ROUTER_DEFAULT_TENANT, r->cfg.max_live_requests, r->cfg.max_finished_requests);
    } else {
        if ((r->tenants_file = strdup(tenants_file)) == NULL)
            return PAGODA_ENOMEM;
        /* Read on the loop's thread, before the router serves anyone: it cannot block on a FIFO
         * (router_tenants_load), and a slow disk only delays the start. */
        if ((rc = router_tenants_load(tenants_file, &r->tenants)) != 0)
            return rc;
        release_parse_memory();
        r->slot_of = calloc(r->tenants->count, sizeof(*r->slot_of));
        if (r->slot_of == NULL || (rc = slots_reserve(r, r->tenants->count)) != 0)
            return r->slot_of == NULL ? PAGODA_ENOMEM : rc;
        assign_slots(r, r->tenants, r->slot_of);
        take_file_pins(r->tenants, r->pins, &r->num_pins);
        log_info("%u tenants, %u groups, %u pins and %u admin keys from %s", r->tenants->count,
                 r->tenants->num_groups, r->num_pins, r->tenants->num_admin_keys, tenants_file);
    }
    r->policy_version = 1;
    if ((rc = pins_file_open(r)) != 0)
        return rc;
    for (uint32_t i = 0; i < r->num_pins; i++)
        r->pins[i].version = 1;
    return 0; /* each engine gets the Policy when its link comes up */
}

/* A read of the tenants file on libuv's threadpool. It outlives the router when the router
 * closes first (r is then NULL, and the result is dropped): the loop runs until after_reload. */
struct reload_job {
    uv_work_t work;
    struct router *r;
    char *path;
    uint64_t started_ms;
    struct router_tenants *t; /* what the thread parsed */
    int rc;
    char detail[512]; /* the thread's pagoda_error_detail (thread-local) */
    int by_signal;    /* SIGHUP's: its outcome is logged, no call waits for it */
};

static void reload_job_free(struct reload_job *job)
{
    router_tenants_free(job->t);
    free(job->path);
    free(job);
}

void tenancy_close(struct router *r)
{
    pins_file_close(r);
    if (r->reload != NULL) {
        r->reload->r = NULL; /* after_reload frees it */
        uv_cancel((uv_req_t *)&r->reload->work);
        r->reload = NULL;
    }
    for (uint32_t i = 0; r->pins != NULL && i < r->num_pins; i++)
        pin_state_fini(&r->pins[i]);
    free(r->pins);
    r->pins = NULL;
    r->num_pins = 0;
    router_tenants_free(r->tenants);
    r->tenants = NULL;
    free(r->slot_of);
    r->slot_of = NULL;
    free(r->slots);
    r->slots = NULL;
    free(r->tenants_file);
    r->tenants_file = NULL;
}

int tenancy_authenticate(const struct router *r, const char *api_key, uint32_t *slot, int *admin)
{
    *slot = 0;
    *admin = 0;
    if (r->tenants == NULL)
        return 0;
    if (router_tenants_is_admin_key(r->tenants, api_key)) {
        *admin = 1;
        return 0;
    }
    const struct router_tenant *t = router_tenants_find_key(r->tenants, api_key);
    if (t == NULL)
        return PAGODA_EPERM;
    *slot = r->slot_of[t - r->tenants->tenants];
    return 0;
}

uint32_t tenancy_find_slot(const struct router *r, const char *name)
{
    if (name == NULL)
        return UINT32_MAX;
    if (r->tenants == NULL)
        return strcmp(name, ROUTER_DEFAULT_TENANT) == 0 ? 0 : UINT32_MAX;
    const struct router_tenant *t = router_tenants_find(r->tenants, name);
    return t == NULL ? UINT32_MAX : r->slot_of[t - r->tenants->tenants];
}

void tenancy_ref(struct router *r, uint32_t slot)
{
    r->slots[slot].refs++;
}

void tenancy_unref(struct router *r, uint32_t slot)
{
    r->slots[slot].refs--;
}

struct pin_state *tenancy_find_pin(struct router *r, const char *name)
{
    for (uint32_t i = 0; name != NULL && i < r->num_pins; i++)
        if (strcmp(r->pins[i].pin.name, name) == 0)
            return &r->pins[i];
    return NULL;
}

static int same_tokens(const struct router_pin *a, const struct router_pin *b)
{
    return a->num_tokens == b->num_tokens &&
           memcmp(a->token_ids, b->token_ids, a->num_tokens * sizeof(int32_t)) == 0;
}

static int same_tenants(const struct router_pin *a, const struct router_pin *b)
{
    if (a->num_tenants != b->num_tenants)
        return 0;
    for (uint32_t i = 0; i < a->num_tenants; i++)
        if (strcmp(a->tenants[i], b->tenants[i]) != 0)
            return 0;
    return 1;
}

static uint64_t pinned_tokens(const struct router *r)
{
    uint64_t n = 0;
    for (uint32_t i = 0; i < r->num_pins; i++)
        n += r->pins[i].pin.num_tokens;
    return n;
}

int tenancy_set_pin(struct router *r, struct router_pin *pin, int *changed)
{
    struct pin_state *old = tenancy_find_pin(r, pin->name);
    *changed = 0;
    if (old != NULL && same_tokens(&old->pin, pin) && same_tenants(&old->pin, pin)) {
        router_pin_fini(pin); /* a resent call: nothing to change */
        return 0;
    }
    uint64_t total = pinned_tokens(r) - (old ? old->pin.num_tokens : 0) + pin->num_tokens;
    if (total > ROUTER_MAX_PINNED_TOKENS)
        return pagoda_error_set(PAGODA_ERANGE,
                                "the pins would hold %llu tokens in all, more than the limit of %u",
                                (unsigned long long)total, ROUTER_MAX_PINNED_TOKENS);
    if (old == NULL && r->num_pins >= ROUTER_MAX_PINS)
        return pagoda_error_set(PAGODA_ERANGE, "%u pins already, the limit", ROUTER_MAX_PINS);
    if (old == NULL) {
        old = &r->pins[r->num_pins++];
        memset(old, 0, sizeof(*old));
    } else if (same_tokens(&old->pin, pin)) {
        /* Only who may read it changes: what the scheduler holds is still good. */
        router_pin_fini(&old->pin);
        old->pin = *pin;
        old->from_file = 0;
        memset(pin, 0, sizeof(*pin));
        *changed = 1;
        return 0;
    } else {
        pin_state_fini(old);
    }
    old->pin = *pin;
    old->version = 0; /* tenancy_changed gives it the next version */
    memset(pin, 0, sizeof(*pin));
    *changed = 1;
    return 0;
}

int tenancy_remove_pin(struct router *r, const char *name)
{
    struct pin_state *p = tenancy_find_pin(r, name);
    if (p == NULL)
        return pagoda_error_set(PAGODA_ENOENT, "no pin named \"%.64s\"", name ? name : "");
    pin_state_fini(p);
    size_t i = (size_t)(p - r->pins);
    memmove(&r->pins[i], &r->pins[i + 1], (r->num_pins - i - 1) * sizeof(*p));
    r->num_pins--;
    return 0;
}

/* A deep copy of a runtime pin for a new configuration t: the tenants t no longer has are left
 * out (the pin stays, readable by the others; one left with no reader is dropped by the
 * caller). */
static int copy_runtime_pin(const struct pin_state *from, const struct router_tenants *t,
                            struct pin_state *to)
{
    memset(to, 0, sizeof(*to));
    *to = *from;
    to->pin.token_ids = malloc(from->pin.num_tokens * sizeof(int32_t));
    to->pin.tenants = calloc(from->pin.num_tenants ? from->pin.num_tenants : 1, sizeof(char *));
    to->pin.num_tenants = 0;
    to->error_message = from->error_message ? strdup(from->error_message) : NULL;
    if (to->pin.token_ids == NULL || to->pin.tenants == NULL ||
        (from->error_message != NULL && to->error_message == NULL))
        goto nomem;
    memcpy(to->pin.token_ids, from->pin.token_ids, from->pin.num_tokens * sizeof(int32_t));
    for (uint32_t i = 0; i < from->pin.num_tenants; i++) {
        if (router_tenants_find(t, from->pin.tenants[i]) == NULL) {
            log_warn("reload: tenant \"%s\" is gone, so it no longer reads pin \"%s\"",
                     from->pin.tenants[i], from->pin.name);
            continue;
        }
        if ((to->pin.tenants[to->pin.num_tenants] = strdup(from->pin.tenants[i])) == NULL)
            goto nomem;
        to->pin.num_tenants++;
    }
    return 0;
nomem:
    pin_state_fini(to);
    return PAGODA_ENOMEM;
}

/* Threadpool: opens, reads and parses the file; touches nothing of the router. */
static void reload_work(uv_work_t *w)
{
    struct reload_job *job = w->data;
    job->rc = router_tenants_load(job->path, &job->t);
    if (job->rc != 0)
        snprintf(job->detail, sizeof(job->detail), "%s", pagoda_error_detail());
    release_parse_memory();
}

/* Loop: the read is over (or was cancelled because the router closed). */
static void after_reload(uv_work_t *w, int status)
{
    struct reload_job *job = w->data;
    struct router *r = job->r;
    if (r == NULL) {
        reload_job_free(job);
        return;
    }
    r->reload = NULL;
    if (status != 0 && job->rc == 0) {
        job->rc = PAGODA_EIO;
        snprintf(job->detail, sizeof(job->detail), "%s: the read was cancelled", job->path);
    }
    struct router_tenants *t = job->t;
    job->t = NULL;
    admin_on_reload_read(r, t, job->rc, job->detail, job->started_ms, job->by_signal);
    reload_job_free(job);
}

int tenancy_reload_start(struct router *r, int by_signal)
{
    if (r->tenants_file == NULL)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "the router was started without a tenants "
                                                     "file: there is nothing to reload");
    if (r->reload != NULL)
        return pagoda_error_set(PAGODA_EBUSY, "%s: another reload is still reading it; retry",
                                r->tenants_file);
    struct reload_job *job = calloc(1, sizeof(*job));
    if (job == NULL || (job->path = strdup(r->tenants_file)) == NULL) {
        free(job);
        return PAGODA_ENOMEM;
    }
    job->r = r;
    job->by_signal = by_signal;
    job->started_ms = uv_now(r->loop);
    job->work.data = job;
    int uv = uv_queue_work(r->loop, &job->work, reload_work, after_reload);
    if (uv != 0) {
        reload_job_free(job);
        return pagoda_error_set(PAGODA_EIO, "cannot start reading the tenants file: %s",
                                uv_strerror(uv));
    }
    r->reload = job;
    return 0;
}

int tenancy_apply(struct router *r, struct router_tenants *t)
{
    struct pin_state *pins = NULL;
    uint32_t *slot_of = NULL, n = 0;
    int rc = 0;
    pins = calloc(ROUTER_MAX_PINS, sizeof(*pins));
    slot_of = calloc(t->count, sizeof(*slot_of));
    if (pins == NULL || slot_of == NULL || slots_reserve(r, t->count) != 0) {
        rc = PAGODA_ENOMEM;
        goto fail;
    }
    /* The file's pins; one the scheduler already holds with the same tokens keeps its status. */
    uint64_t total = 0;
    for (uint32_t i = 0; i < t->num_pins; i++)
        total += t->pins[i].num_tokens;
    take_file_pins(t, pins, &n);
    for (uint32_t i = 0; i < n; i++) {
        const struct pin_state *old = tenancy_find_pin(r, pins[i].pin.name);
        if (old != NULL && same_tokens(&old->pin, &pins[i].pin)) {
            pins[i].version = old->version;
            pins[i].has_status = old->has_status;
            pins[i].ready = old->ready;
            pins[i].blocks = old->blocks;
            pins[i].error_code = old->error_code;
            if (old->error_message != NULL &&
                (pins[i].error_message = strdup(old->error_message)) == NULL) {
                rc = PAGODA_ENOMEM;
                goto fail;
            }
        }
    }
    /* The runtime pins, unless the file now has one of the same name. */
    uint32_t from_file = n;
    for (uint32_t i = 0; i < r->num_pins; i++) {
        const struct pin_state *old = &r->pins[i];
        int in_file = 0;
        for (uint32_t k = 0; k < from_file && !in_file; k++)
            in_file = strcmp(pins[k].pin.name, old->pin.name) == 0;
        if (old->from_file || in_file)
            continue;
        if (n >= ROUTER_MAX_PINS || total + old->pin.num_tokens > ROUTER_MAX_PINNED_TOKENS) {
            rc = pagoda_error_set(PAGODA_ERANGE,
                                  "%s: with the runtime pins (pinned by the admin API) there "
                                  "would be more than %u pins or %u pinned tokens: unpin some",
                                  r->tenants_file, ROUTER_MAX_PINS, ROUTER_MAX_PINNED_TOKENS);
            goto fail;
        }
        if ((rc = copy_runtime_pin(old, t, &pins[n])) != 0)
            goto fail;
        if (pins[n].pin.num_tenants == 0) {
            /* nobody may read it: it would only hold its blocks (out of every sequence's
             * reach) until unpinned */
            log_warn("reload: pin \"%s\" has no reader left: unpinned", old->pin.name);
            pin_state_fini(&pins[n]);
            continue;
        }
        total += old->pin.num_tokens;
        n++;
    }

    /* Nothing can fail from here on. */
    assign_slots(r, t, slot_of);
    for (uint32_t i = 0; i < r->num_pins; i++)
        pin_state_fini(&r->pins[i]);
    free(r->pins);
    r->pins = pins;
    r->num_pins = n;
    router_tenants_free(r->tenants);
    r->tenants = t;
    free(r->slot_of);
    r->slot_of = slot_of;
    log_info("reloaded %s: %u tenants, %u groups, %u pins (%u from the file), %u admin keys",
             r->tenants_file, t->count, t->num_groups, n, from_file, t->num_admin_keys);
    tenancy_changed(r);
    return 0;

fail:
    for (uint32_t i = 0; pins != NULL && i < n; i++)
        pin_state_fini(&pins[i]);
    free(pins);
    free(slot_of);
    router_tenants_free(t);
    return rc;
}

void tenancy_on_link_up(struct router *r, struct engine *e)
{
    e->need_policy = 1;
    e->applied_version = 0;
    r->applied_version = admin_applied_version(r);
    for (uint32_t i = 0; i < r->num_pins; i++) {
        r->pins[i].has_status = 0;
        r->pins[i].ready = 0;
        r->pins[i].blocks = 0;
        r->pins[i].error_code = 0;
        free(r->pins[i].error_message);
        r->pins[i].error_message = NULL;
    }
}

void tenancy_changed(struct router *r)
{
    r->policy_version++;
    for (uint32_t i = 0; i < r->num_pins; i++)
        if (r->pins[i].version == 0)
            r->pins[i].version = r->policy_version;
    for (uint32_t i = 0; i < r->num_engines; i++)
        r->engines[i].need_policy = 1;
    pins_file_changed(r);
    router_flush_pending(r);
}

int tenancy_pins_by_tenant(const struct router *r, uint32_t **offsets_out, char ***names_out)
{
    uint32_t count = r->tenants ? r->tenants->count : 0;
    uint32_t *offsets = calloc((size_t)count + 1, sizeof(*offsets));
    uint32_t *fill = calloc(count ? count : 1, sizeof(*fill));
    size_t total = 0;
    for (uint32_t p = 0; p < r->num_pins; p++)
        total += r->pins[p].pin.num_tenants;
    char **names = calloc(total ? total : 1, sizeof(*names));
    if (offsets == NULL || fill == NULL || names == NULL) {
        free(offsets);
        free(fill);
        free(names);
        return PAGODA_ENOMEM;
    }
    /* Count each tenant's pins, then place them: two passes over (pin, tenant) pairs, each
     * tenant found by name in O(log n). */
    for (int pass = 0; pass < 2; pass++) {
        for (uint32_t p = 0; p < r->num_pins; p++) {
            const struct router_pin *pin = &r->pins[p].pin;
            for (uint32_t k = 0; k < pin->num_tenants; k++) {
                const struct router_tenant *t = router_tenants_find(r->tenants, pin->tenants[k]);
                if (t == NULL)
                    continue;
                uint32_t i = (uint32_t)(t - r->tenants->tenants);
                if (pass == 0)
                    offsets[i + 1]++;
                else
                    names[offsets[i] + fill[i]++] = (char *)pin->name;
            }
        }
        if (pass == 0)
            for (uint32_t i = 0; i < count; i++)
                offsets[i + 1] += offsets[i];
    }
    free(fill);
    *offsets_out = offsets;
    *names_out = names;
    return 0;
}

/* The Policy's arrays, filled by fill_policy and freed by policy_parts_free. */
struct policy_parts {
    Pagoda__Internal__NamespacePolicy *ns, **ns_ptrs;
    Pagoda__Internal__TenantPolicy *tp, **tp_ptrs;
    Pagoda__Internal__PinPolicy *pp, **pp_ptrs;
    char (*ns_names)[ROUTER_NAMESPACE_MAX + 1]; /* the groups' (or the default tenant's) */
    uint32_t *offsets;
    char **pin_names;
};

static void policy_parts_free(struct policy_parts *p)
{
    free(p->ns);
    free(p->ns_ptrs);
    free(p->tp);
    free(p->tp_ptrs);
    free(p->pp);
    free(p->pp_ptrs);
    free(p->ns_names);
    free(p->offsets);
    free(p->pin_names);
}

static void add_namespace(struct policy_parts *p, size_t *n, const char *name, uint32_t quota)
{
    pagoda__internal__namespace_policy__init(&p->ns[*n]);
    p->ns[*n].name = (char *)name;
    p->ns[*n].has_quota_blocks = 1;
    p->ns[*n].quota_blocks = quota;
    p->ns_ptrs[*n] = &p->ns[*n];
    (*n)++;
}

static void add_tenant(struct policy_parts *p, size_t i, const char *name, const char *ns,
                       uint32_t max_running)
{
    pagoda__internal__tenant_policy__init(&p->tp[i]);
    p->tp[i].name = (char *)name;
    p->tp[i].namespace_ = (char *)ns;
    p->tp[i].has_max_running = 1;
    p->tp[i].max_running = max_running;
    p->tp_ptrs[i] = &p->tp[i];
}

/* The whole tenancy as a Policy; its strings and arrays point into r and parts. Without a
 * tenants file: the default tenant in "t:default", no quota, no cap of its own, no pins. */
static int fill_policy(const struct router *r, struct policy_parts *parts,
                       Pagoda__Internal__Policy *policy)
{
    const struct router_tenants *t = r->tenants;
    size_t num_tenants = t ? t->count : 1, num_names = t ? t->num_groups : 1;
    size_t max_ns = t ? t->num_groups + t->count : 1, num_pins = r->num_pins, n = 0;
    parts->ns = calloc(max_ns, sizeof(*parts->ns));
    parts->ns_ptrs = calloc(max_ns, sizeof(*parts->ns_ptrs));
    parts->tp = calloc(num_tenants, sizeof(*parts->tp));
    parts->tp_ptrs = calloc(num_tenants, sizeof(*parts->tp_ptrs));
    parts->pp = calloc(num_pins ? num_pins : 1, sizeof(*parts->pp));
    parts->pp_ptrs = calloc(num_pins ? num_pins : 1, sizeof(*parts->pp_ptrs));
    parts->ns_names = calloc(num_names ? num_names : 1, sizeof(*parts->ns_names));
    if (parts->ns == NULL || parts->ns_ptrs == NULL || parts->tp == NULL ||
        parts->tp_ptrs == NULL || parts->pp == NULL || parts->pp_ptrs == NULL ||
        parts->ns_names == NULL || tenancy_pins_by_tenant(r, &parts->offsets, &parts->pin_names))
        return PAGODA_ENOMEM;
    if (t == NULL) {
        snprintf(parts->ns_names[0], sizeof(parts->ns_names[0]), "t:%s", ROUTER_DEFAULT_TENANT);
        add_namespace(parts, &n, parts->ns_names[0], 0);
        add_tenant(parts, 0, ROUTER_DEFAULT_TENANT, parts->ns_names[0], 0);
    } else {
        for (uint32_t g = 0; g < t->num_groups; g++) {
            snprintf(parts->ns_names[g], sizeof(parts->ns_names[g]), "g:%s", t->groups[g].name);
            add_namespace(parts, &n, parts->ns_names[g], t->groups[g].cache_quota_blocks);
        }
        for (uint32_t i = 0; i < t->count; i++) {
            const struct router_tenant *tn = &t->tenants[i];
            if (tn->group < 0)
                add_namespace(parts, &n, tn->namespace_name, tn->cache_quota_blocks);
            add_tenant(parts, i, tn->name, tn->namespace_name, tn->max_running);
            parts->tp[i].n_pins = parts->offsets[i + 1] - parts->offsets[i];
            parts->tp[i].pins = parts->pin_names + parts->offsets[i];
        }
    }
    for (size_t i = 0; i < num_pins; i++) {
        pagoda__internal__pin_policy__init(&parts->pp[i]);
        parts->pp[i].name = (char *)r->pins[i].pin.name;
        parts->pp[i].n_token_ids = r->pins[i].pin.num_tokens;
        parts->pp[i].token_ids = r->pins[i].pin.token_ids;
        parts->pp_ptrs[i] = &parts->pp[i];
    }
    policy->has_version = 1;
    policy->version = r->policy_version;
    policy->n_namespaces = n;
    policy->namespaces = parts->ns_ptrs;
    policy->n_tenants = num_tenants;
    policy->tenants = parts->tp_ptrs;
    policy->n_pins = num_pins;
    policy->pins = parts->pp_ptrs;
    return 0;
}

int tenancy_send_policy(struct router *r, struct engine *e)
{
    struct policy_parts parts = {0};
    Pagoda__Internal__Policy policy = PAGODA__INTERNAL__POLICY__INIT;
    int rc = fill_policy(r, &parts, &policy);
    if (rc == 0) {
        Pagoda__Internal__ToScheduler env = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
        env.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_POLICY;
        env.policy = &policy;
        rc = router_send(e, &env);
    }
    if (rc == 0)
        log_debug("policy version %llu sent to engine %u: %zu tenants, %zu namespaces, %zu pins",
                  (unsigned long long)policy.version, e->index, policy.n_tenants,
                  policy.n_namespaces, policy.n_pins);
    policy_parts_free(&parts);
    return rc;
}

void tenancy_on_policy_applied(struct router *r, const Pagoda__Internal__PolicyApplied *pa)
{
    for (size_t i = 0; i < pa->n_pins; i++) {
        const Pagoda__Internal__PinStatus *st = pa->pins[i];
        struct pin_state *p = tenancy_find_pin(r, st->name);
        if (p == NULL || p->version > pa->version)
            continue; /* unpinned since, or about other tokens than the ones it has now */
        p->has_status = 1;
        p->ready = st->has_ready && st->ready;
        p->blocks = st->has_blocks ? st->blocks : 0;
        p->error_code = st->has_error_code ? st->error_code : 0;
        free(p->error_message);
        p->error_message = st->error_message ? strdup(st->error_message) : NULL;
    }
}
