#include "scheduler/prefix_cache.h"

#include "common/error.h"
#include "common/log.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

struct pc_entry {
    struct pc_key key, parent;
    struct pc_namespace *ns;
    struct pc_entry *parent_entry; /* its cached parent, or NULL */
    int32_t block;
    uint32_t users, pinned, num_children;
    bool in_lru, detached;
    uint64_t stamp;               /* when it joined the LRU */
    struct pc_entry *prev, *next; /* in the LRU, or in the detached list */
    struct pc_entry *hash_next;   /* in its namespace's table */
    int32_t tokens[];             /* block_size of them */
};

struct entry_list {
    struct pc_entry *head, *tail; /* head: oldest */
    uint32_t count;
};

struct pc_namespace {
    char name[PREFIX_CACHE_NAMESPACE_MAX + 1];
    struct pc_entry **buckets;
    uint32_t num_buckets, count;
    struct entry_list lru;
    uint32_t quota;
    uint64_t evictions, inserted;
    struct pc_namespace *next; /* creation order */
};

struct prefix_cache {
    struct block_manager *bm;
    int32_t block_size;
    uint8_t secret[PREFIX_CACHE_SECRET_BYTES];
    bool has_root;
    struct pc_key root;
    struct pc_namespace *namespaces, *last_ns;
    struct entry_list detached;
    uint64_t clock;
    uint32_t cached, pinned, evictable;
    uint64_t evictions;
};

/* ---- lists ---------------------------------------------------------------------------------- */

static void elist_remove(struct entry_list *l, struct pc_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        l->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        l->tail = e->prev;
    e->prev = e->next = NULL;
    l->count--;
}

static void elist_push_back(struct entry_list *l, struct pc_entry *e)
{
    e->next = NULL;
    e->prev = l->tail;
    if (l->tail)
        l->tail->next = e;
    else
        l->head = e;
    l->tail = e;
    l->count++;
}

/* ---- tables --------------------------------------------------------------------------------- */

static uint32_t bucket_of(const struct pc_namespace *ns, struct pc_key key)
{
    return (uint32_t)(key.lo & (ns->num_buckets - 1));
}

static int table_grow(struct pc_namespace *ns)
{
    uint32_t n = ns->num_buckets ? ns->num_buckets * 2 : 64;
    struct pc_entry **b = calloc(n, sizeof(*b));
    if (b == NULL)
        return PAGODA_ENOMEM;
    for (uint32_t i = 0; i < ns->num_buckets; i++) {
        struct pc_entry *e = ns->buckets[i];
        while (e) {
            struct pc_entry *next = e->hash_next;
            uint32_t j = (uint32_t)(e->key.lo & (n - 1));
            e->hash_next = b[j];
            b[j] = e;
            e = next;
        }
    }
    free(ns->buckets);
    ns->buckets = b;
    ns->num_buckets = n;
    return 0;
}

static void table_remove(struct pc_namespace *ns, struct pc_entry *e)
{
    struct pc_entry **p = &ns->buckets[bucket_of(ns, e->key)];
    while (*p && *p != e)
        p = &(*p)->hash_next;
    if (*p)
        *p = e->hash_next;
    e->hash_next = NULL;
    ns->count--;
}

/* ---- entry life ----------------------------------------------------------------------------- */

static bool unused(const struct pc_entry *e)
{
    return e->users == 0 && e->pinned == 0;
}

static void lru_leave(struct prefix_cache *pc, struct pc_entry *e)
{
    if (!e->in_lru)
        return;
    elist_remove(&e->ns->lru, e);
    e->in_lru = false;
    pc->evictable--;
}

/* Frees a detached entry nobody uses and no cached child depends on, and then its parent when
 * that one waited only for it. */
static void maybe_free(struct prefix_cache *pc, struct pc_entry *e)
{
    while (e != NULL && e->detached && unused(e) && e->num_children == 0) {
        struct pc_entry *parent = e->parent_entry;
        elist_remove(&pc->detached, e);
        if (block_manager_unref(pc->bm, e->block) != 0)
            log_error("prefix cache: dropping block %d: %s", (int)e->block, pagoda_error_detail());
        free(e);
        if (parent == NULL)
            return;
        parent->num_children--;
        e = parent;
    }
}

/* Takes e out of its table (and the LRU) into the detached list. */
static void detach(struct prefix_cache *pc, struct pc_entry *e)
{
    lru_leave(pc, e);
    table_remove(e->ns, e);
    pc->cached--;
    e->detached = true;
    elist_push_back(&pc->detached, e);
}

static void became_unused(struct prefix_cache *pc, struct pc_entry *e)
{
    if (e->detached) {
        maybe_free(pc, e);
        return;
    }
    e->stamp = ++pc->clock;
    e->in_lru = true;
    elist_push_back(&e->ns->lru, e);
    pc->evictable++;
}

/* ---- public --------------------------------------------------------------------------------- */

int prefix_cache_open(struct block_manager *bm, int32_t block_size, const uint8_t *secret,
                      struct prefix_cache **out)
{
    if (bm == NULL || secret == NULL || out == NULL || block_size < 1)
        return pagoda_error_set(PAGODA_EINVAL, "prefix_cache_open: bad argument");
    struct prefix_cache *pc = calloc(1, sizeof(*pc));
    if (pc == NULL)
        return PAGODA_ENOMEM;
    pc->bm = bm;
    pc->block_size = block_size;
    memcpy(pc->secret, secret, sizeof(pc->secret));
    *out = pc;
    return 0;
}

static void free_entries(struct prefix_cache *pc, struct pc_entry *e)
{
    while (e) {
        struct pc_entry *next = e->hash_next;
        block_manager_unref(pc->bm, e->block);
        free(e);
        e = next;
    }
}

void prefix_cache_close(struct prefix_cache *pc)
{
    if (pc == NULL)
        return;
    struct pc_namespace *ns = pc->namespaces;
    while (ns) {
        struct pc_namespace *next = ns->next;
        for (uint32_t i = 0; i < ns->num_buckets; i++)
            free_entries(pc, ns->buckets[i]);
        free(ns->buckets);
        free(ns);
        ns = next;
    }
    struct pc_entry *e = pc->detached.head;
    while (e) {
        struct pc_entry *next = e->next;
        block_manager_unref(pc->bm, e->block);
        free(e);
        e = next;
    }
    free(pc);
}

static struct pc_key digest(XXH3_state_t *st)
{
    XXH128_hash_t h = XXH3_128bits_digest(st);
    return (struct pc_key){h.low64, h.high64};
}

int prefix_cache_set_root(struct prefix_cache *pc, const void *fingerprint, size_t len,
                          int32_t dtype)
{
    XXH3_state_t st;
    XXH3_128bits_reset_withSecret(&st, pc->secret, sizeof(pc->secret));
    XXH3_128bits_update(&st, "pagoda prefix root", 18);
    XXH3_128bits_update(&st, &len, sizeof(len));
    if (len > 0)
        XXH3_128bits_update(&st, fingerprint, len);
    XXH3_128bits_update(&st, &dtype, sizeof(dtype));
    struct pc_key root = digest(&st);
    if (pc->has_root && pc_key_equal(root, pc->root))
        return 0;
    bool had = pc->has_root;
    for (struct pc_namespace *ns = pc->namespaces; ns; ns = ns->next)
        prefix_cache_flush(pc, ns);
    pc->root = root;
    pc->has_root = true;
    return had ? 1 : 0;
}

int prefix_cache_ready(const struct prefix_cache *pc)
{
    return pc->has_root;
}

struct pc_key prefix_cache_root(const struct prefix_cache *pc)
{
    return pc->root;
}

struct pc_namespace *prefix_cache_namespace(struct prefix_cache *pc, const char *name)
{
    size_t len = strlen(name);
    if (len > PREFIX_CACHE_NAMESPACE_MAX)
        return NULL;
    for (struct pc_namespace *ns = pc->namespaces; ns; ns = ns->next)
        if (strcmp(ns->name, name) == 0)
            return ns;
    struct pc_namespace *ns = calloc(1, sizeof(*ns));
    if (ns == NULL || table_grow(ns) != 0) {
        free(ns);
        return NULL;
    }
    memcpy(ns->name, name, len + 1);
    if (pc->last_ns)
        pc->last_ns->next = ns;
    else
        pc->namespaces = ns;
    pc->last_ns = ns;
    return ns;
}

void prefix_cache_set_quota(struct pc_namespace *ns, uint32_t quota_blocks)
{
    ns->quota = quota_blocks;
}

const char *prefix_cache_namespace_name(const struct pc_namespace *ns)
{
    return ns->name;
}

void prefix_cache_namespace_stats(const struct pc_namespace *ns, struct pc_namespace_stats *out)
{
    out->cached_blocks = ns->count;
    out->quota_blocks = ns->quota;
    out->evictions = ns->evictions;
    out->inserted = ns->inserted;
}

void prefix_cache_each_namespace(struct prefix_cache *pc,
                                 void (*fn)(void *user, struct pc_namespace *ns), void *user)
{
    for (struct pc_namespace *ns = pc->namespaces; ns; ns = ns->next)
        fn(user, ns);
}

struct pc_key prefix_cache_key(const struct prefix_cache *pc, const struct pc_namespace *ns,
                               struct pc_key parent, const int32_t *tokens)
{
    XXH3_state_t st;
    XXH3_128bits_reset_withSecret(&st, pc->secret, sizeof(pc->secret));
    size_t len = strlen(ns->name);
    XXH3_128bits_update(&st, &len, sizeof(len));
    XXH3_128bits_update(&st, ns->name, len);
    XXH3_128bits_update(&st, &parent, sizeof(parent));
    XXH3_128bits_update(&st, tokens, (size_t)pc->block_size * sizeof(int32_t));
    return digest(&st);
}

static struct pc_entry *find(const struct pc_namespace *ns, struct pc_key key)
{
    for (struct pc_entry *e = ns->buckets[bucket_of(ns, key)]; e; e = e->hash_next)
        if (pc_key_equal(e->key, key))
            return e;
    return NULL;
}

struct pc_entry *prefix_cache_lookup(const struct prefix_cache *pc, const struct pc_namespace *ns,
                                     struct pc_key key, struct pc_key parent, const int32_t *tokens)
{
    if (!pc->has_root)
        return NULL;
    struct pc_entry *e = find(ns, key);
    if (e == NULL || !pc_key_equal(e->parent, parent) ||
        memcmp(e->tokens, tokens, (size_t)pc->block_size * sizeof(int32_t)) != 0)
        return NULL;
    return e;
}

void prefix_cache_acquire(struct prefix_cache *pc, struct pc_entry *e)
{
    lru_leave(pc, e);
    e->users++;
}

void prefix_cache_release(struct prefix_cache *pc, struct pc_entry *e)
{
    if (e->users == 0) {
        log_error("prefix cache: release of block %d without a user", (int)e->block);
        return;
    }
    if (--e->users == 0 && e->pinned == 0)
        became_unused(pc, e);
}

struct pc_entry *prefix_cache_insert(struct prefix_cache *pc, struct pc_namespace *ns,
                                     struct pc_entry *parent_entry, struct pc_key key,
                                     struct pc_key parent, const int32_t *tokens, int32_t block)
{
    /* Nothing goes under a flushed (detached) parent: such an entry would be found again once
     * the parent's key is cached anew, in use under a parent nobody uses, and would keep the
     * flushed blocks from being freed. */
    if (!pc->has_root || find(ns, key) != NULL || (parent_entry && parent_entry->detached))
        return NULL;
    if (ns->count >= ns->num_buckets && table_grow(ns) != 0)
        return NULL;
    size_t bytes = (size_t)pc->block_size * sizeof(int32_t);
    struct pc_entry *e = calloc(1, sizeof(*e) + bytes);
    if (e == NULL)
        return NULL;
    if (block_manager_ref(pc->bm, block) != 0) {
        log_error("prefix cache: referencing block %d: %s", (int)block, pagoda_error_detail());
        free(e);
        return NULL;
    }
    e->key = key;
    e->parent = parent;
    e->ns = ns;
    e->block = block;
    e->users = 1;
    e->parent_entry = parent_entry;
    if (parent_entry)
        parent_entry->num_children++;
    memcpy(e->tokens, tokens, bytes);
    uint32_t b = bucket_of(ns, key);
    e->hash_next = ns->buckets[b];
    ns->buckets[b] = e;
    ns->count++;
    ns->inserted++;
    pc->cached++;
    return e;
}

void prefix_cache_pin(struct prefix_cache *pc, struct pc_entry *e)
{
    lru_leave(pc, e);
    if (e->pinned++ == 0)
        pc->pinned++;
}

void prefix_cache_unpin(struct prefix_cache *pc, struct pc_entry *e)
{
    if (e->pinned == 0) {
        log_error("prefix cache: unpin of block %d that is not pinned", (int)e->block);
        return;
    }
    if (--e->pinned == 0) {
        pc->pinned--;
        if (e->users == 0)
            became_unused(pc, e);
    }
}

int32_t prefix_cache_entry_block(const struct pc_entry *e)
{
    return e->block;
}

int prefix_cache_entry_evictable(const struct pc_entry *e)
{
    return e->in_lru;
}

struct pc_key prefix_cache_entry_key(const struct pc_entry *e)
{
    return e->key;
}

static struct pc_entry *first_leaf(const struct pc_namespace *ns)
{
    for (struct pc_entry *e = ns->lru.head; e; e = e->next)
        if (e->num_children == 0)
            return e;
    return NULL;
}

int prefix_cache_evict_one(struct prefix_cache *pc)
{
    struct pc_entry *best = NULL;
    for (int pass = 0; pass < 2 && best == NULL; pass++) {
        for (struct pc_namespace *ns = pc->namespaces; ns; ns = ns->next) {
            if (ns->lru.count == 0 || (pass == 0 && (ns->quota == 0 || ns->count <= ns->quota)))
                continue;
            struct pc_entry *e = first_leaf(ns);
            if (e != NULL && (best == NULL || e->stamp < best->stamp))
                best = e;
        }
    }
    if (best == NULL)
        return 0;
    best->ns->evictions++;
    pc->evictions++;
    detach(pc, best);
    maybe_free(pc, best);
    return 1;
}

uint32_t prefix_cache_flush(struct prefix_cache *pc, struct pc_namespace *ns)
{
    uint32_t n = ns->count;
    if (n == 0)
        return 0;
    /* Detach everything first, then free what nobody holds, starting from the leaves:
     * maybe_free climbs to the parents, which are never leaves, so no pointer kept in the
     * array is freed before its turn. */
    struct pc_entry **leaves = malloc((size_t)n * sizeof(*leaves));
    uint32_t k = 0;
    for (uint32_t i = 0; i < ns->num_buckets; i++) {
        while (ns->buckets[i]) {
            struct pc_entry *e = ns->buckets[i];
            detach(pc, e);
            if (leaves != NULL && e->num_children == 0)
                leaves[k++] = e;
        }
    }
    if (leaves != NULL) {
        for (uint32_t i = 0; i < k; i++)
            maybe_free(pc, leaves[i]);
        free(leaves);
        return n;
    }
    /* Out of memory for the copy: passes over the detached list until nothing moves. */
    for (bool freed = true; freed;) {
        freed = false;
        for (struct pc_entry *e = pc->detached.head; e; e = e->next) {
            if (unused(e) && e->num_children == 0) {
                maybe_free(pc, e);
                freed = true;
                break;
            }
        }
    }
    return n;
}

uint32_t prefix_cache_cached_blocks(const struct prefix_cache *pc)
{
    return pc->cached;
}

uint32_t prefix_cache_pinned_blocks(const struct prefix_cache *pc)
{
    return pc->pinned;
}

uint32_t prefix_cache_evictable_blocks(const struct prefix_cache *pc)
{
    return pc->evictable;
}

uint64_t prefix_cache_evictions(const struct prefix_cache *pc)
{
    return pc->evictions;
}

/* ---- checks --------------------------------------------------------------------------------- */

static int check_entry(const struct pc_entry *e, int32_t *refs, int32_t num_blocks,
                       const char **why)
{
    if (e->block < 1 || e->block >= num_blocks) {
        *why = "an entry's block is out of range";
        return -1;
    }
    refs[e->block]++;
    /* What is in use hangs under what is in use: every LRU entry can go once its unused
     * descendants went before it (so the evictable count is true). */
    if (!unused(e) && e->parent_entry != NULL && unused(e->parent_entry)) {
        *why = "an entry in use or pinned under an unused parent";
        return -1;
    }
    if (e->in_lru != (unused(e) && !e->detached)) {
        *why = "an entry is in the LRU exactly when unused and not detached: broken";
        return -1;
    }
    return 0;
}

int prefix_cache_check(const struct prefix_cache *pc, int32_t *refs, int32_t num_blocks,
                       const char **why)
{
    uint32_t cached = 0, pinned = 0, evictable = 0;
    for (const struct pc_namespace *ns = pc->namespaces; ns; ns = ns->next) {
        uint32_t in_table = 0;
        for (uint32_t i = 0; i < ns->num_buckets; i++) {
            for (const struct pc_entry *e = ns->buckets[i]; e; e = e->hash_next) {
                if (e->detached || e->ns != ns) {
                    *why = "a detached or foreign entry in a table";
                    return -1;
                }
                if (check_entry(e, refs, num_blocks, why) != 0)
                    return -1;
                in_table++;
                pinned += e->pinned > 0;
                evictable += e->in_lru;
            }
        }
        if (in_table != ns->count) {
            *why = "a namespace's count differs from its table";
            return -1;
        }
        uint32_t in_lru = 0;
        for (const struct pc_entry *e = ns->lru.head; e; e = e->next, in_lru++)
            if (!e->in_lru || e->ns != ns) {
                *why = "an LRU holds an entry not marked as in it";
                return -1;
            }
        if (in_lru != ns->lru.count) {
            *why = "an LRU's count differs from its list";
            return -1;
        }
        cached += in_table;
    }
    for (const struct pc_entry *e = pc->detached.head; e; e = e->next) {
        if (!e->detached) {
            *why = "an entry in the detached list is not marked detached";
            return -1;
        }
        if (unused(e) && e->num_children == 0) {
            *why = "a detached entry nobody needs was not freed";
            return -1;
        }
        if (check_entry(e, refs, num_blocks, why) != 0)
            return -1;
        pinned += e->pinned > 0;
    }
    if (cached != pc->cached || pinned != pc->pinned || evictable != pc->evictable) {
        *why = "the cache's counters differ from its entries";
        return -1;
    }
    return 0;
}
