/* The prefix cache in the scheduler: lookups at admission, publication after acknowledgement,
 * tenants and their namespaces, pinned public prefixes, the router's policy and the admin calls.
 * scheduler.h tells the policy; prefix_cache.h the cache itself. */
#include "common/error.h"
#include "common/log.h"
#include "scheduler/scheduler_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* ---- opening and closing -------------------------------------------------------------------- */

int sched_cache_open(struct scheduler *s)
{
    uint8_t secret[PREFIX_CACHE_SECRET_BYTES];
    size_t got = 0;
    while (got < sizeof(secret)) {
        ssize_t n = getrandom(secret + got, sizeof(secret) - got, 0);
        if (n < 0)
            return pagoda_error_set(PAGODA_EIO, "scheduler: drawing the prefix cache's secret");
        got += (size_t)n;
    }
    int rc = prefix_cache_open(s->bm, s->block_size, secret, &s->pc);
    if (rc != 0)
        return rc;
    s->match = calloc((size_t)block_manager_usable(s->bm) + 1, sizeof(*s->match));
    return s->match ? 0 : PAGODA_ENOMEM;
}

static void pin_free(struct sched_pin *p)
{
    free(p->tokens);
    free(p->held);
    free(p);
}

void sched_cache_close(struct scheduler *s)
{
    struct sched_tenant *t = s->tenants;
    while (t) {
        struct sched_tenant *next = t->next;
        free(t->pins);
        free(t);
        t = next;
    }
    struct sched_pin *p = s->pins;
    while (p) {
        struct sched_pin *next = p->next;
        pin_free(p);
        p = next;
    }
    free(s->match);
    prefix_cache_close(s->pc);
}

/* ---- tenants -------------------------------------------------------------------------------- */

static struct pc_namespace *named_namespace(struct scheduler *s, const char *prefix,
                                            const char *name)
{
    char full[PREFIX_CACHE_NAMESPACE_MAX + 2];
    int n = snprintf(full, sizeof(full), "%s%s", prefix, name);
    if (n < 0 || n > PREFIX_CACHE_NAMESPACE_MAX)
        return NULL;
    return prefix_cache_namespace(s->pc, full);
}

static void tenant_defaults(struct scheduler *s, struct sched_tenant *t)
{
    struct pc_namespace *ns = named_namespace(s, "t:", t->name);
    if (ns != NULL)
        t->ns = ns;
    t->max_running = 0;
    t->num_pins = 0;
}

struct sched_tenant *sched_tenant_get(struct scheduler *s, const char *name)
{
    for (struct sched_tenant *t = s->tenants; t; t = t->next)
        if (strcmp(t->name, name) == 0)
            return t;
    size_t len = strlen(name);
    if (len + 2 > PREFIX_CACHE_NAMESPACE_MAX)
        return NULL;
    struct sched_tenant *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return NULL;
    memcpy(t->name, name, len + 1);
    tenant_defaults(s, t);
    if (t->ns == NULL) {
        free(t);
        return NULL;
    }
    t->next = s->tenants;
    s->tenants = t;
    return t;
}

/* ---- keys ----------------------------------------------------------------------------------- */

static int reserve(void **arr, int32_t *cap, int32_t need, size_t size)
{
    if (*cap >= need)
        return 0;
    int32_t c = *cap ? *cap : 8;
    while (c < need)
        c *= 2;
    void *p = realloc(*arr, (size_t)c * size);
    if (p == NULL)
        return PAGODA_ENOMEM;
    *arr = p;
    *cap = c;
    return 0;
}

static struct pc_namespace *block_ns(const struct seq *q, int32_t i)
{
    return i < q->key_switch ? q->pin_ns : q->ns;
}

static struct pc_key parent_key(const struct scheduler *s, const struct seq *q, int32_t i)
{
    return i == 0 ? prefix_cache_root(s->pc) : q->keys[i - 1];
}

/* Makes keys[0..n) valid (n full blocks of q's known tokens). */
static int seq_keys(struct scheduler *s, struct seq *q, int32_t n)
{
    if (reserve((void **)&q->keys, &q->cap_keys, n, sizeof(*q->keys)) != 0)
        return PAGODA_ENOMEM;
    for (int32_t i = q->num_keys; i < n; i++)
        q->keys[i] = prefix_cache_key(s->pc, block_ns(q, i), parent_key(s, q, i),
                                      q->tokens + (size_t)i * s->block_size);
    if (n > q->num_keys)
        q->num_keys = n;
    return 0;
}

static bool cache_on(const struct scheduler *s)
{
    return s->cfg.prefix_cache && prefix_cache_ready(s->pc);
}

/* ---- lookup --------------------------------------------------------------------------------- */

/* Walks ns from parent over blocks [from, max) of q, writing keys and hits; returns the index
 * of the first miss. */
static int32_t walk(struct scheduler *s, struct seq *q, struct pc_namespace *ns, int32_t from,
                    int32_t max)
{
    int32_t i = from;
    for (; i < max; i++) {
        struct pc_key parent = parent_key(s, q, i);
        const int32_t *tok = q->tokens + (size_t)i * s->block_size;
        q->keys[i] = prefix_cache_key(s->pc, ns, parent, tok);
        struct pc_entry *e = prefix_cache_lookup(s->pc, ns, q->keys[i], parent, tok);
        if (e == NULL)
            break;
        s->match[i] = e;
    }
    return i;
}

int32_t sched_cache_match(struct scheduler *s, struct seq *q, int32_t *evictable_hits)
{
    *evictable_hits = 0;
    q->ns = q->pin ? q->pin->ns : q->owner ? q->owner->ns : NULL;
    q->pin_ns = NULL;
    q->key_switch = 0;
    q->num_keys = 0;
    q->num_published = 0;
    if (!cache_on(s) || q->ns == NULL)
        return 0;
    /* Never the block that holds the last known token: its logits must be computed. */
    int32_t max = (q->num_tokens - 1) / s->block_size;
    if (max == 0 || reserve((void **)&q->keys, &q->cap_keys, max, sizeof(*q->keys)) != 0)
        return 0;
    /* The public chains first: the pin that covers most of the prompt. */
    struct sched_pin *best = NULL;
    int32_t best_n = 0;
    for (uint32_t k = 0; q->owner && k < q->owner->num_pins; k++) {
        struct sched_pin *p = q->owner->pins[k];
        if (p->state != PIN_READY)
            continue;
        int32_t n = walk(s, q, p->ns, 0, max);
        if (n > best_n) {
            best = p;
            best_n = n;
        }
    }
    int32_t n = 0;
    if (best != NULL) {
        n = walk(s, q, best->ns, 0, best_n);
        q->pin_ns = best->ns;
        q->key_switch = n;
    }
    /* Then the sequence's own namespace. */
    int32_t hits = walk(s, q, q->ns, n, max);
    q->num_keys = hits < max ? hits + 1 : max;
    for (int32_t i = 0; i < hits; i++)
        *evictable_hits += prefix_cache_entry_evictable(s->match[i]);
    return hits;
}

bool sched_cache_computed_elsewhere(struct scheduler *s, struct seq *q, int32_t hits)
{
    if (!cache_on(s) || q->ns == NULL || hits < 0 || hits >= q->num_keys)
        return false;
    const struct pc_key key = q->keys[hits];
    for (struct seq *p = s->running.head; p != NULL; p = p->next) {
        /* p publishes block hits when it is computed (sched_cache_publish) only if it has decided
         * the blocks before it and holds the entry of the one before it (a block after a
         * private one stays private): the very entry q matched there (a parent flushed since
         * q's lookup would not be what q matched, and p's child of it stays private), and if
         * the block is a full block of p's known tokens not computed yet. */
        if (p == q || p->ns == NULL || p->num_published != hits ||
            (int64_t)(hits + 1) * s->block_size > p->num_tokens ||
            /* computed already (its publication failed for memory, or comes with the result
             * being read): nothing to wait for */
            p->num_computed >= (int64_t)(hits + 1) * s->block_size ||
            (hits > 0 && (p->table.num_blocks < hits || p->cap_entries < hits ||
                          p->entries[hits - 1] != s->match[hits - 1])))
            continue;
        if (seq_keys(s, p, hits + 1) != 0)
            continue;
        if (pc_key_equal(p->keys[hits], key))
            return true;
    }
    return false;
}

int sched_cache_take_match(struct scheduler *s, struct seq *q, int32_t n)
{
    if (reserve((void **)&q->entries, &q->cap_entries, n + 1, sizeof(*q->entries)) != 0)
        return PAGODA_ENOMEM;
    for (int32_t i = 0; i < n; i++) {
        int rc = block_table_append_shared(s->bm, &q->table, prefix_cache_entry_block(s->match[i]));
        if (rc != 0) {
            sched_seq_release_blocks(s, q);
            return rc;
        }
        prefix_cache_acquire(s->pc, s->match[i]);
        q->entries[i] = s->match[i];
    }
    q->num_computed = n * s->block_size;
    q->num_scheduled = q->num_computed;
    q->num_published = n;
    if (!q->looked_up && q->pin == NULL) {
        q->looked_up = true;
        uint32_t hit = (uint32_t)(q->num_computed < q->num_prompt_tokens ? q->num_computed
                                                                         : q->num_prompt_tokens);
        q->cached_tokens = hit;
        s->stats.prefix_query_tokens += (uint64_t)q->num_prompt_tokens;
        s->stats.prefix_hit_tokens += hit;
        if (q->owner) {
            q->owner->lookups++;
            q->owner->hits += n > 0;
            q->owner->query_tokens += (uint64_t)q->num_prompt_tokens;
            q->owner->hit_tokens += hit;
        }
    }
    return 0;
}

/* ---- blocks --------------------------------------------------------------------------------- */

int sched_seq_append_block(struct scheduler *s, struct seq *q)
{
    if (reserve((void **)&q->entries, &q->cap_entries, q->table.num_blocks + 1,
                sizeof(*q->entries)) != 0)
        return PAGODA_ENOMEM;
    for (;;) {
        int rc = block_table_append_new(s->bm, &q->table);
        if (rc == 0) {
            q->entries[q->table.num_blocks - 1] = NULL;
            return 0;
        }
        if (rc != PAGODA_EEXHAUSTED || !prefix_cache_evict_one(s->pc))
            return rc;
    }
}

void sched_seq_release_blocks(struct scheduler *s, struct seq *q)
{
    /* From the tail, so that a chain's leaves enter the LRU before their parents. */
    for (int32_t i = q->table.num_blocks - 1; i >= 0; i--) {
        int32_t b = q->table.ids[i];
        int rc;
        if (i < q->cap_entries && q->entries[i] != NULL) {
            prefix_cache_release(s->pc, q->entries[i]);
            q->entries[i] = NULL;
            rc = block_manager_unref(s->bm, b);
        } else {
            rc = block_manager_defer(s->bm, b, s->last_step_id);
        }
        if (rc != 0)
            log_error("scheduler: releasing block %d: %s", (int)b, pagoda_error_detail());
    }
    q->table.num_blocks = 0;
    q->num_published = 0;
    q->num_keys = 0;
}

void sched_cache_publish(struct scheduler *s, struct seq *q)
{
    if (!cache_on(s) || q->ns == NULL)
        return;
    int32_t full = q->num_computed / s->block_size;
    if (full > q->table.num_blocks)
        full = q->table.num_blocks;
    if (full <= q->num_published || seq_keys(s, q, full) != 0)
        return;
    for (int32_t i = q->num_published; i < full; i++) {
        if (q->entries[i] != NULL)
            continue;
        struct pc_namespace *ns = block_ns(q, i);
        struct pc_key parent = parent_key(s, q, i);
        const int32_t *tok = q->tokens + (size_t)i * s->block_size;
        /* A block whose contents are cached already stays private. */
        if (prefix_cache_lookup(s->pc, ns, q->keys[i], parent, tok) != NULL)
            continue;
        /* Only under a parent this sequence holds: what is in use then always hangs under what
         * is in use, so an unused entry never has a child in use and every entry in an LRU can
         * be evicted (leaves first); the evictable count admission relies on stays true. A
         * block after one kept private (its key was cached meanwhile by another sequence)
         * stays private too. */
        struct pc_entry *up = i > 0 ? q->entries[i - 1] : NULL;
        if (i > 0 && up == NULL)
            continue;
        q->entries[i] =
            prefix_cache_insert(s->pc, ns, up, q->keys[i], parent, tok, q->table.ids[i]);
    }
    q->num_published = full;
}

void sched_cache_assert_writable(const struct scheduler *s, const struct seq *q, int32_t num_new)
{
    if (num_new <= 0)
        return;
    int32_t first = q->num_scheduled / s->block_size;
    int32_t last = (q->num_scheduled + num_new - 1) / s->block_size;
    for (int32_t b = first; b <= last && b < q->table.num_blocks; b++) {
        if ((b < q->cap_entries && q->entries[b] != NULL) ||
            block_manager_refcount(s->bm, q->table.ids[b]) != 1) {
            log_error("scheduler: BUG: seq %llu would write positions [%d, %d) into block %d, "
                      "which is cached or shared (%d references)",
                      (unsigned long long)q->seq_id, (int)q->num_scheduled,
                      (int)(q->num_scheduled + num_new), (int)q->table.ids[b],
                      (int)block_manager_refcount(s->bm, q->table.ids[b]));
            abort();
        }
    }
}

/* ---- pins ----------------------------------------------------------------------------------- */

static void pin_unhold(struct scheduler *s, struct sched_pin *p)
{
    for (int32_t i = 0; i < p->num_held; i++)
        prefix_cache_unpin(s->pc, p->held[i]);
    p->num_held = 0;
}

static void pin_fail(struct sched_pin *p, int error, const char *message)
{
    p->state = PIN_FAILED;
    p->error_code = error;
    snprintf(p->error, sizeof(p->error), "%s", message ? message : "failed");
    log_warn("pin %s failed: %s", p->name, p->error);
}

/* Pinned blocks are out of every sequence's reach (sched_context_limit): the pins together hold at
 * most half the pool, so that pins cannot shrink every tenant's context to nothing (a hostile
 * probe's pins held 1,018 of 1,023 blocks, and requests of tenants that could read none of them
 * ended at 80 tokens). A pin counts the full blocks it holds or will hold (pins that share a
 * prefix share blocks: an overcount, on the safe side). */
static int64_t pins_cap(const struct scheduler *s)
{
    return block_manager_usable(s->bm) / 2;
}

static int64_t pin_blocks(const struct scheduler *s, const struct sched_pin *p)
{
    return p->num_tokens / s->block_size;
}

int32_t sched_pins_computing_blocks(const struct scheduler *s)
{
    int64_t n = 0;
    for (const struct sched_pin *p = s->pins; p; p = p->next)
        if (p->state == PIN_COMPUTING)
            n += pin_blocks(s, p);
    return (int32_t)n; /* at most pins_cap */
}

static void pin_fail_cap(struct scheduler *s, struct sched_pin *p, int64_t pinned)
{
    char msg[160];
    snprintf(msg, sizeof(msg),
             "the pins would hold %lld blocks, more than half the pool's %d: unpin others first",
             (long long)pinned, (int)block_manager_usable(s->bm));
    pin_fail(p, PAGODA_EEXHAUSTED, msg);
}

/* Queues p's sequence at the front (or fails p at once when it cannot be computed). */
static void pin_start(struct scheduler *s, struct sched_pin *p)
{
    pin_unhold(s, p);
    p->state = PIN_COMPUTING;
    p->error_code = 0;
    p->error[0] = '\0';
    if (p->num_tokens < s->block_size) {
        char msg[96];
        snprintf(msg, sizeof(msg), "a pinned prefix needs at least one full block (%d tokens)",
                 (int)s->block_size);
        pin_fail(p, PAGODA_ERANGE, msg);
        return;
    }
    for (int32_t i = 0; i < p->num_tokens; i++) {
        if (p->tokens[i] < 0) {
            pin_fail(p, PAGODA_EINVAL, "a negative token id");
            return;
        }
    }
    /* The others of the policy in force (sched_on_policy checks again once the pins it drops are
     * gone: pins_within_cap). */
    int64_t pinned = pin_blocks(s, p);
    for (const struct sched_pin *o = s->pins; o; o = o->next)
        if (o != p && o->in_policy && o->state != PIN_FAILED)
            pinned += pin_blocks(s, o);
    if (pinned > pins_cap(s)) {
        pin_fail_cap(s, p, pinned);
        return;
    }
    struct seq *q = sched_seq_new(p->tokens, p->num_tokens, 0);
    if (q == NULL) {
        pin_fail(p, PAGODA_ENOMEM, "out of memory");
        return;
    }
    q->pin = p;
    q->max_tokens = 1;
    q->ignore_eos = true;
    q->sampling.temperature = 0.0f;
    p->computing = q;
    waiting_push(s, q, true);
}

static void policy_maybe_reply(struct scheduler *s);

void sched_pin_seq_ended(struct scheduler *s, struct seq *q, bool ok, int error,
                         const char *message)
{
    struct sched_pin *p = q->pin;
    q->pin = NULL; /* the sequence goes; the pin stays */
    p->computing = NULL;
    if (!ok) {
        pin_fail(p, error, message);
    } else {
        int32_t full = p->num_tokens / s->block_size;
        free(p->held);
        p->held = calloc((size_t)full, sizeof(*p->held));
        p->num_held = 0;
        struct pc_key parent = prefix_cache_root(s->pc);
        for (int32_t i = 0; p->held && i < full; i++) {
            const int32_t *tok = p->tokens + (size_t)i * s->block_size;
            struct pc_key key = prefix_cache_key(s->pc, p->ns, parent, tok);
            struct pc_entry *e = prefix_cache_lookup(s->pc, p->ns, key, parent, tok);
            if (e == NULL)
                break;
            prefix_cache_pin(s->pc, e);
            p->held[p->num_held++] = e;
            parent = key;
        }
        if (p->num_held == 0) {
            pin_fail(p, p->held ? PAGODA_EEXHAUSTED : PAGODA_ENOMEM,
                     "its blocks could not be cached");
        } else {
            p->state = PIN_READY;
            log_info("pin %s ready: %d tokens, %d blocks held", p->name, (int)p->num_tokens,
                     (int)p->num_held);
        }
    }
    policy_maybe_reply(s);
}

/* Lets p go: its blocks become ordinary cached blocks (evictable), its sequence is dropped. */
static void pin_drop(struct scheduler *s, struct sched_pin *p)
{
    pin_unhold(s, p);
    if (p->computing != NULL) {
        struct seq *q = p->computing;
        q->pin = NULL;
        p->computing = NULL;
        sched_seq_remove(s, q);
    }
}

/* After a policy: the pins held (ready) count first, then those being computed, in order; one
 * that takes the pins past pins_cap fails (pin_start counted the policy's pins as far as it had
 * applied them, and the pins it drops). */
static void pins_within_cap(struct scheduler *s)
{
    int64_t pinned = 0;
    for (const struct sched_pin *p = s->pins; p; p = p->next)
        if (p->state == PIN_READY)
            pinned += pin_blocks(s, p);
    for (struct sched_pin *p = s->pins; p; p = p->next) {
        if (p->state != PIN_COMPUTING)
            continue;
        if (pinned + pin_blocks(s, p) > pins_cap(s)) {
            pin_drop(s, p);
            pin_fail_cap(s, p, pinned + pin_blocks(s, p));
            continue;
        }
        pinned += pin_blocks(s, p);
    }
}

/* ---- the policy ----------------------------------------------------------------------------- */

static Pagoda__Internal__PinStatus *pin_statuses(struct scheduler *s, size_t *n_out,
                                                 Pagoda__Internal__PinStatus ***ptrs_out)
{
    size_t n = 0;
    for (struct sched_pin *p = s->pins; p; p = p->next)
        n++;
    Pagoda__Internal__PinStatus *st = calloc(n ? n : 1, sizeof(*st));
    Pagoda__Internal__PinStatus **ptrs = calloc(n ? n : 1, sizeof(*ptrs));
    if (st == NULL || ptrs == NULL) {
        free(st);
        free(ptrs);
        *n_out = 0;
        *ptrs_out = NULL;
        return NULL;
    }
    size_t i = 0;
    for (struct sched_pin *p = s->pins; p; p = p->next, i++) {
        pagoda__internal__pin_status__init(&st[i]);
        st[i].name = p->name;
        st[i].has_ready = st[i].has_blocks = 1;
        st[i].ready = p->state == PIN_READY;
        st[i].blocks = (uint32_t)p->num_held;
        if (p->state == PIN_FAILED) {
            st[i].has_error_code = 1;
            st[i].error_code = p->error_code;
            st[i].error_message = p->error;
        }
        ptrs[i] = &st[i];
    }
    *n_out = n;
    *ptrs_out = ptrs;
    return st;
}

static void policy_maybe_reply(struct scheduler *s)
{
    if (!s->policy_reply_owed)
        return;
    for (struct sched_pin *p = s->pins; p; p = p->next)
        if (p->state == PIN_COMPUTING)
            return;
    s->policy_reply_owed = false;
    Pagoda__Internal__PolicyApplied pa = PAGODA__INTERNAL__POLICY_APPLIED__INIT;
    pa.has_version = 1;
    pa.version = s->policy_version;
    Pagoda__Internal__PinStatus **ptrs = NULL;
    Pagoda__Internal__PinStatus *st = pin_statuses(s, &pa.n_pins, &ptrs);
    pa.pins = ptrs;
    Pagoda__Internal__ToRouter m = PAGODA__INTERNAL__TO_ROUTER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_POLICY_APPLIED;
    m.policy_applied = &pa;
    sched_send_router(s, &m);
    free(st);
    free(ptrs);
}

static struct sched_pin *pin_find(struct scheduler *s, const char *name)
{
    for (struct sched_pin *p = s->pins; p; p = p->next)
        if (strcmp(p->name, name) == 0)
            return p;
    return NULL;
}

static bool same_tokens(const struct sched_pin *p, const Pagoda__Internal__PinPolicy *pp)
{
    /* An empty pin's token_ids is NULL, which memcmp may not be given even for 0 bytes. */
    return (size_t)p->num_tokens == pp->n_token_ids &&
           (pp->n_token_ids == 0 ||
            memcmp(p->tokens, pp->token_ids, pp->n_token_ids * sizeof(int32_t)) == 0);
}

static void apply_pin(struct scheduler *s, const Pagoda__Internal__PinPolicy *pp)
{
    if (pp->name == NULL || strlen(pp->name) + 2 > PREFIX_CACHE_NAMESPACE_MAX) {
        log_warn("policy: a pin without a name or with a name too long: ignored");
        return;
    }
    struct sched_pin *p = pin_find(s, pp->name);
    if (p != NULL && p->in_policy) {
        log_warn("policy: pin %s named twice: the first one holds", pp->name);
        return;
    }
    if (p != NULL && same_tokens(p, pp) && p->state != PIN_FAILED) {
        p->in_policy = true;
        return;
    }
    if (p == NULL) {
        p = calloc(1, sizeof(*p));
        if (p == NULL || (p->ns = named_namespace(s, "p:", pp->name)) == NULL) {
            free(p);
            log_error("policy: out of memory for pin %s", pp->name);
            return;
        }
        snprintf(p->name, sizeof(p->name), "%s", pp->name);
        p->next = s->pins;
        s->pins = p;
    } else {
        /* new tokens: its old blocks become ordinary cached blocks; or a pin that failed, named
         * again, is tried again (one over the cap fits once others are unpinned) */
        pin_drop(s, p);
    }
    p->in_policy = true;
    free(p->tokens);
    p->num_tokens = 0;
    p->tokens = malloc((pp->n_token_ids ? pp->n_token_ids : 1) * sizeof(int32_t));
    if (p->tokens == NULL) {
        pin_fail(p, PAGODA_ENOMEM, "out of memory");
        return;
    }
    if (pp->n_token_ids > 0)
        memcpy(p->tokens, pp->token_ids, pp->n_token_ids * sizeof(int32_t));
    p->num_tokens = (int32_t)pp->n_token_ids;
    pin_start(s, p);
}

static void apply_tenant(struct scheduler *s, const Pagoda__Internal__TenantPolicy *tp)
{
    if (tp->name == NULL)
        return;
    struct sched_tenant *t = sched_tenant_get(s, tp->name);
    if (t == NULL) {
        log_warn("policy: tenant %s: name too long or out of memory", tp->name);
        return;
    }
    t->in_policy = true;
    struct pc_namespace *ns = tp->namespace_ ? prefix_cache_namespace(s->pc, tp->namespace_)
                                             : named_namespace(s, "t:", t->name);
    if (ns != NULL)
        t->ns = ns;
    t->max_running = tp->has_max_running ? tp->max_running : 0;
    t->num_pins = 0;
    struct sched_pin **pins = realloc(t->pins, (tp->n_pins ? tp->n_pins : 1) * sizeof(*pins));
    if (pins == NULL)
        return;
    t->pins = pins;
    for (size_t i = 0; i < tp->n_pins; i++) {
        struct sched_pin *p = pin_find(s, tp->pins[i]);
        if (p != NULL)
            t->pins[t->num_pins++] = p;
    }
}

void sched_on_policy(struct scheduler *s, const Pagoda__Internal__Policy *m)
{
    for (size_t i = 0; i < m->n_namespaces; i++) {
        const Pagoda__Internal__NamespacePolicy *np = m->namespaces[i];
        struct pc_namespace *ns = np->name ? prefix_cache_namespace(s->pc, np->name) : NULL;
        if (ns != NULL)
            prefix_cache_set_quota(ns, np->has_quota_blocks ? np->quota_blocks : 0);
    }
    for (struct sched_pin *p = s->pins; p; p = p->next)
        p->in_policy = false;
    for (size_t i = 0; i < m->n_pins; i++)
        apply_pin(s, m->pins[i]);
    /* Pins the policy no longer names: their blocks become ordinary cached blocks. Tenants'
     * pin lists are rebuilt below, so no pointer to a freed pin survives. */
    for (struct sched_pin **pp = &s->pins; *pp;) {
        struct sched_pin *p = *pp;
        if (p->in_policy) {
            pp = &p->next;
            continue;
        }
        log_info("pin %s released", p->name);
        pin_drop(s, p);
        *pp = p->next;
        pin_free(p);
    }
    pins_within_cap(s);
    for (struct sched_tenant *t = s->tenants; t; t = t->next)
        t->in_policy = false;
    for (size_t i = 0; i < m->n_tenants; i++)
        apply_tenant(s, m->tenants[i]);
    for (struct sched_tenant *t = s->tenants; t; t = t->next)
        if (!t->in_policy)
            tenant_defaults(s, t);
    /* A running sequence whose tenant changed namespace publishes no more: its blocks computed
     * from now on must not reach the namespace it left (a preemption readmits it in the new
     * one). */
    for (struct seq *q = s->running.head; q; q = q->next)
        if (q->owner != NULL && q->ns != NULL && q->ns != q->owner->ns)
            q->ns = NULL;
    s->policy_version = m->has_version ? m->version : 0;
    s->policy_reply_owed = true;
    log_info("policy %llu: %zu tenants, %zu namespaces, %zu pins",
             (unsigned long long)s->policy_version, m->n_tenants, m->n_namespaces, m->n_pins);
    policy_maybe_reply(s);
}

int sched_cache_on_hello(struct scheduler *s, const Pagoda__Internal__Hello *h)
{
    char fallback[96];
    const void *fp;
    size_t len;
    if (h->has_model_fingerprint && h->model_fingerprint.len > 0) {
        fp = h->model_fingerprint.data;
        len = h->model_fingerprint.len;
    } else {
        /* An older worker: the model's shape stands in, which a worker restarted with another
         * model of the same shape would not change. */
        len = (size_t)snprintf(fallback, sizeof(fallback), "no fingerprint %lld %lld %s",
                               (long long)h->vocab_size, (long long)h->max_position_embeddings,
                               h->backend ? h->backend : "");
        fp = fallback;
        log_warn("worker 0 sent no model fingerprint: the prefix cache keys on the model's shape");
    }
    if (prefix_cache_set_root(s->pc, fp, len, (int32_t)s->cfg.geometry.dtype) == 1) {
        log_warn("the worker's model changed: the prefix cache was flushed, pins are recomputed");
        for (struct sched_pin *p = s->pins; p; p = p->next) {
            pin_drop(s, p);
            pin_start(s, p);
        }
        s->policy_reply_owed = s->policy_version != 0;
        return 1;
    }
    return 0;
}

struct flush_all {
    struct prefix_cache *pc;
    uint32_t blocks;
};

static void flush_ns(void *user, struct pc_namespace *ns)
{
    struct flush_all *f = user;
    f->blocks += prefix_cache_flush(f->pc, ns);
}

uint32_t sched_cache_drop_all(struct scheduler *s)
{
    struct flush_all f = {.pc = s->pc};
    prefix_cache_each_namespace(s->pc, flush_ns, &f);
    for (struct sched_pin *p = s->pins; p; p = p->next) {
        pin_drop(s, p);
        pin_start(s, p);
    }
    s->policy_reply_owed = s->policy_version != 0;
    return f.blocks;
}

/* ---- admin ---------------------------------------------------------------------------------- */

struct ns_collect {
    Pagoda__Internal__NamespaceFigures *figs, **ptrs;
    size_t n, cap;
};

static void collect_ns(void *user, struct pc_namespace *ns)
{
    struct ns_collect *c = user;
    if (c->n == c->cap)
        return;
    struct pc_namespace_stats st;
    prefix_cache_namespace_stats(ns, &st);
    Pagoda__Internal__NamespaceFigures *f = &c->figs[c->n];
    pagoda__internal__namespace_figures__init(f);
    f->name = (char *)prefix_cache_namespace_name(ns);
    f->has_cached_blocks = f->has_quota_blocks = f->has_evictions = f->has_inserted = 1;
    f->cached_blocks = st.cached_blocks;
    f->quota_blocks = st.quota_blocks;
    f->evictions = st.evictions;
    f->inserted = st.inserted;
    c->ptrs[c->n++] = f;
}

static void count_ns(void *user, struct pc_namespace *ns)
{
    (void)ns;
    (*(size_t *)user)++;
}

void sched_on_admin(struct scheduler *s, const Pagoda__Internal__AdminCall *m)
{
    Pagoda__Internal__AdminResult r = PAGODA__INTERNAL__ADMIN_RESULT__INIT;
    r.has_cookie = m->has_cookie;
    r.cookie = m->cookie;
    Pagoda__Internal__TenantFigures *tf = NULL, **tptrs = NULL;
    struct ns_collect nc = {0};
    Pagoda__Internal__PinStatus *ps = NULL, **pptrs = NULL;
    char msg[160];
    if (m->flush_namespace != NULL) {
        if (strncmp(m->flush_namespace, "p:", 2) == 0) {
            r.has_error_code = 1;
            r.error_code = PAGODA_EPERM;
            snprintf(msg, sizeof(msg), "%s is a pinned prefix's: unpin it instead",
                     m->flush_namespace);
            r.error_message = msg;
        } else {
            struct pc_namespace *ns = prefix_cache_namespace(s->pc, m->flush_namespace);
            r.has_flushed_blocks = 1;
            r.flushed_blocks = ns ? prefix_cache_flush(s->pc, ns) : 0;
            log_info("admin: flushed %u blocks of %s", r.flushed_blocks, m->flush_namespace);
        }
    }
    if (m->has_figures && m->figures) {
        size_t nt = 0;
        for (struct sched_tenant *t = s->tenants; t; t = t->next)
            nt++;
        tf = calloc(nt ? nt : 1, sizeof(*tf));
        tptrs = calloc(nt ? nt : 1, sizeof(*tptrs));
        prefix_cache_each_namespace(s->pc, count_ns, &nc.cap);
        nc.figs = calloc(nc.cap ? nc.cap : 1, sizeof(*nc.figs));
        nc.ptrs = calloc(nc.cap ? nc.cap : 1, sizeof(*nc.ptrs));
        if (tf && tptrs && nc.figs && nc.ptrs) {
            size_t i = 0;
            for (struct sched_tenant *t = s->tenants; t; t = t->next, i++) {
                Pagoda__Internal__TenantFigures *f = &tf[i];
                pagoda__internal__tenant_figures__init(f);
                f->name = t->name;
                f->namespace_ = (char *)prefix_cache_namespace_name(t->ns);
                f->has_lookups = f->has_hits = f->has_query_tokens = f->has_hit_tokens = 1;
                f->has_running = f->has_waiting = 1;
                f->lookups = t->lookups;
                f->hits = t->hits;
                f->query_tokens = t->query_tokens;
                f->hit_tokens = t->hit_tokens;
                f->running = t->running;
                for (struct seq *q = s->waiting.head; q; q = q->next)
                    f->waiting += q->owner == t;
                tptrs[i] = f;
            }
            r.n_tenants = nt;
            r.tenants = tptrs;
            prefix_cache_each_namespace(s->pc, collect_ns, &nc);
            r.n_namespaces = nc.n;
            r.namespaces = nc.ptrs;
            ps = pin_statuses(s, &r.n_pins, &pptrs);
            r.pins = pptrs;
        } else {
            r.has_error_code = 1;
            r.error_code = PAGODA_ENOMEM;
            r.error_message = "out of memory for the figures";
        }
    }
    Pagoda__Internal__ToRouter out = PAGODA__INTERNAL__TO_ROUTER__INIT;
    out.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_ADMIN;
    out.admin = &r;
    sched_send_router(s, &out);
    free(tf);
    free(tptrs);
    free(nc.figs);
    free(nc.ptrs);
    free(ps);
    free(pptrs);
}

/* ---- figures and checks --------------------------------------------------------------------- */

void sched_cache_stats(const struct scheduler *s, struct scheduler_stats *out)
{
    out->cached_blocks = prefix_cache_cached_blocks(s->pc);
    out->pinned_blocks = prefix_cache_pinned_blocks(s->pc);
    out->evictable_blocks = prefix_cache_evictable_blocks(s->pc);
    out->evictions = prefix_cache_evictions(s->pc);
    out->kv_usage =
        1.0 - (double)(out->free_blocks + (int32_t)out->evictable_blocks) / (double)out->num_blocks;
    int64_t slots = 0, held = 0;
    for (const struct seq *q = s->running.head; q; q = q->next) {
        int64_t n = (int64_t)q->table.num_blocks * s->block_size;
        int64_t t = q->num_scheduled;
        slots += n;
        held += t < n ? t : n;
    }
    out->fragmentation = slots ? (double)(slots - held) / (double)slots : 0.0;
    int64_t pairs = 0, adjacent = 0, blocks = 0, runs = 0;
    for (const struct seq *q = s->running.head; q; q = q->next) {
        const struct block_table *t = &q->table;
        blocks += t->num_blocks;
        runs += t->num_blocks > 0;
        for (int32_t i = 1; i < t->num_blocks; i++) {
            pairs++;
            if (t->ids[i] == t->ids[i - 1] + 1)
                adjacent++;
            else
                runs++;
        }
    }
    out->locality = pairs ? (double)adjacent / (double)pairs : 1.0;
    out->locality_run_length = runs ? (double)blocks / (double)runs : 0.0;
}

/* The recent or refused list l: ended sequences holding no block and no sequence id, in the
 * order they ended, linked both ways, at most cap; refused ones empty and failed. */
static int check_ended(const struct seq_list *l, uint32_t cap, bool refused, const char **why)
{
    uint32_t count = 0;
    const struct seq *prev = NULL;
    for (const struct seq *q = l->head; q != NULL; prev = q, q = q->next) {
        count++;
        if (q->prev != prev || (prev != NULL && prev->end_order >= q->end_order)) {
            *why = "an ended list is out of order or badly linked";
            return -1;
        }
        if (q->table.num_blocks != 0 || q->seq_id != 0 || q->num_tokens < q->num_prompt_tokens ||
            q->finish_reason == PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE) {
            *why = "an ended sequence holds blocks or a sequence id, or has no end";
            return -1;
        }
        if (refused && (q->num_tokens != 0 ||
                        q->finish_reason != PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR)) {
            *why = "a refusal has tokens or is not an error";
            return -1;
        }
    }
    if (l->tail != prev || count != l->count || count > cap) {
        *why = "an ended list's count or tail is wrong, or it holds more than its cap";
        return -1;
    }
    return 0;
}

int scheduler_check_invariants(const struct scheduler *s, const char **why)
{
    int32_t n = s->cfg.geometry.num_blocks;
    int32_t *refs = calloc((size_t)n, sizeof(int32_t));
    if (refs == NULL) {
        *why = "out of memory for the check";
        return -1;
    }
    int rc = -1;
    uint32_t running = 0;
    for (const struct sched_tenant *t = s->tenants; t; t = t->next)
        running += t->running;
    uint32_t owned = 0;
    for (const struct seq *q = s->running.head; q; q = q->next) {
        owned += q->owner != NULL;
        for (int32_t i = 0; i < q->table.num_blocks; i++) {
            int32_t b = q->table.ids[i];
            if (b < 1 || b >= n) {
                *why = "a table holds a block out of range";
                goto out;
            }
            refs[b]++;
            if (i < q->cap_entries && q->entries[i] != NULL &&
                prefix_cache_entry_block(q->entries[i]) != b) {
                *why = "a table's cache entry names another block";
                goto out;
            }
        }
    }
    if (running != owned) {
        *why = "the tenants' running counts differ from the running sequences";
        goto out;
    }
    if (sched_check_inflight(s, why) != 0)
        goto out;
    for (const struct seq *q = s->waiting.head; q; q = q->next) {
        if (q->table.num_blocks != 0) {
            *why = "a waiting sequence holds blocks";
            goto out;
        }
    }
    if (check_ended(&s->recent, SCHEDULER_MAX_RECENT_BEHIND, false, why) != 0 ||
        check_ended(&s->refused, 8 * SCHEDULER_MAX_RECENT_REFUSED, true, why) != 0)
        goto out;
    if (prefix_cache_check(s->pc, refs, n, why) != 0 || block_manager_check(s->bm, why) != 0)
        goto out;
    block_manager_add_deferred(s->bm, refs);
    for (int32_t b = 1; b < n; b++) {
        if (block_manager_refcount(s->bm, b) != refs[b]) {
            *why = "a block's reference count differs from its holders (tables, cache, fences)";
            goto out;
        }
    }
    rc = 0;
out:
    free(refs);
    return rc;
}
