/* The prefix cache: full KV blocks kept after the sequences that computed them, found again by
 * their contents.
 *
 * Keys. A block's key is a keyed 128-bit hash (XXH3-128 with a secret of PREFIX_CACHE_SECRET_BYTES
 * random bytes drawn when the cache is created) of (namespace name, parent key, the block's
 * token ids); the first block's parent is the root key, which covers the model fingerprint and
 * the KV dtype. A lookup also compares the stored parent key and token ids, so a collision can
 * never serve a wrong prefix.
 *
 * Namespaces. Every entry belongs to one namespace ("t:TENANT", "g:GROUP", "p:PIN"), and each
 * namespace has its own table: a lookup in one never finds another's entries. A chain may start
 * in a pinned prefix's namespace and continue in a tenant's (the parent key says where it came
 * from).
 *
 * References. The cache holds one block_manager reference per entry. users counts the sequences
 * holding the entry's block in their tables now (prefix_cache_acquire / _release); pinned counts
 * the pins holding it. An entry with neither waits in its namespace's LRU, and only those are
 * evicted: leaves first (an entry with cached children stays until they go), and namespaces over
 * their quota before the others; an evicted entry drops the cache's reference, so its block
 * is free at once (a sequence drops its own reference on a cached block at release, without a
 * fence, since no step ever writes a cached block). A flush detaches a namespace's entries from
 * its table: those unused are freed now, the others when their last user releases them.
 *
 * Not thread-safe: one scheduler loop owns it. */
#ifndef PAGODA_SCHEDULER_PREFIX_CACHE_H
#define PAGODA_SCHEDULER_PREFIX_CACHE_H

#include "scheduler/block_manager.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PREFIX_CACHE_SECRET_BYTES 192
#define PREFIX_CACHE_NAMESPACE_MAX 80

struct pc_key {
    uint64_t lo, hi;
};

static inline bool pc_key_equal(struct pc_key a, struct pc_key b)
{
    return a.lo == b.lo && a.hi == b.hi;
}

struct prefix_cache;
struct pc_entry;
struct pc_namespace;

/* A namespace's figures. */
struct pc_namespace_stats {
    uint32_t cached_blocks; /* entries in its table */
    uint32_t quota_blocks;  /* 0: none */
    uint64_t evictions, inserted;
};

/* Creates an empty cache over bm's blocks (block_size tokens each). secret: the hash key,
 * PREFIX_CACHE_SECRET_BYTES bytes (copied). Errors: PAGODA_EINVAL, PAGODA_ENOMEM. */
int prefix_cache_open(struct block_manager *bm, int32_t block_size, const uint8_t *secret,
                      struct prefix_cache **out);

/* Frees the cache and drops its references (entries still used keep their blocks with their
 * users). Accepts NULL. */
void prefix_cache_close(struct prefix_cache *pc);

/* Sets the root key from the model's fingerprint and the KV dtype. A different root than the
 * current one flushes every namespace and returns 1 (pinned entries stay, detached, until the
 * caller unpins them); the same one, or the first, returns 0. Until a root is set, lookups miss
 * and inserts are refused. */
int prefix_cache_set_root(struct prefix_cache *pc, const void *fingerprint, size_t len,
                          int32_t dtype);

/* Whether a root is set. */
int prefix_cache_ready(const struct prefix_cache *pc);

struct pc_key prefix_cache_root(const struct prefix_cache *pc);

/* The namespace called name (at most PREFIX_CACHE_NAMESPACE_MAX bytes), created empty when new.
 * NULL when out of memory or the name is too long. Namespaces live as long as the cache. */
struct pc_namespace *prefix_cache_namespace(struct prefix_cache *pc, const char *name);

/* Sets a namespace's quota in blocks (0: none). */
void prefix_cache_set_quota(struct pc_namespace *ns, uint32_t quota_blocks);

const char *prefix_cache_namespace_name(const struct pc_namespace *ns);
void prefix_cache_namespace_stats(const struct pc_namespace *ns, struct pc_namespace_stats *out);

/* Calls fn for every namespace, in creation order. */
void prefix_cache_each_namespace(struct prefix_cache *pc,
                                 void (*fn)(void *user, struct pc_namespace *ns), void *user);

/* The key of a block of block_size tokens in ns after parent. */
struct pc_key prefix_cache_key(const struct prefix_cache *pc, const struct pc_namespace *ns,
                               struct pc_key parent, const int32_t *tokens);

/* The entry of ns with this key, parent and tokens, or NULL. Counts nothing, moves nothing. */
struct pc_entry *prefix_cache_lookup(const struct prefix_cache *pc, const struct pc_namespace *ns,
                                     struct pc_key key, struct pc_key parent,
                                     const int32_t *tokens);

/* Adds a user (a sequence putting the entry's block in its table): the entry leaves the LRU. */
void prefix_cache_acquire(struct prefix_cache *pc, struct pc_entry *e);

/* Drops a user: with no user and no pin it joins its namespace's LRU as the newest (release a
 * chain from its tail so that leaves are older than their parents), or is freed when detached. */
void prefix_cache_release(struct prefix_cache *pc, struct pc_entry *e);

/* Inserts block (held by the caller, who becomes the entry's first user) under key in ns, as a
 * child of parent_entry (NULL for a first block, or one whose parent is not cached). The cache
 * takes a reference on block. Returns the entry, or NULL when the key is already cached, no
 * root is set, parent_entry was flushed since the caller took it, or memory ran out (the caller
 * keeps its block private). */
struct pc_entry *prefix_cache_insert(struct prefix_cache *pc, struct pc_namespace *ns,
                                     struct pc_entry *parent_entry, struct pc_key key,
                                     struct pc_key parent, const int32_t *tokens, int32_t block);

/* Pins and unpins an entry (a pinned entry is never evicted). */
void prefix_cache_pin(struct prefix_cache *pc, struct pc_entry *e);
void prefix_cache_unpin(struct prefix_cache *pc, struct pc_entry *e);

int32_t prefix_cache_entry_block(const struct pc_entry *e);
/* Whether the entry waits in an LRU now (unused, unpinned: evictable). */
int prefix_cache_entry_evictable(const struct pc_entry *e);
struct pc_key prefix_cache_entry_key(const struct pc_entry *e);

/* Evicts one unused, unpinned leaf, from a namespace over its quota if there is one, else the
 * least recently used; its block becomes free. Returns 1, or 0 when nothing can be evicted. */
int prefix_cache_evict_one(struct prefix_cache *pc);

/* Detaches every entry of ns from its table (no later lookup finds them). Returns the number
 * of entries it held. */
uint32_t prefix_cache_flush(struct prefix_cache *pc, struct pc_namespace *ns);

/* Entries in tables, pinned entries, and unused unpinned entries (evictable now). */
uint32_t prefix_cache_cached_blocks(const struct prefix_cache *pc);
uint32_t prefix_cache_pinned_blocks(const struct prefix_cache *pc);
uint32_t prefix_cache_evictable_blocks(const struct prefix_cache *pc);
uint64_t prefix_cache_evictions(const struct prefix_cache *pc);

/* Tests: adds 1 to refs[block] for every block the cache holds a reference on (num_blocks
 * entries), and checks the cache's own invariants (users, pins, LRU membership, children
 * counts, table membership). Returns 0, or -1 with a reason in why. */
int prefix_cache_check(const struct prefix_cache *pc, int32_t *refs, int32_t num_blocks,
                       const char **why);

#endif
