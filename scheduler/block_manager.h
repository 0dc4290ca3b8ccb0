/* The block manager: who holds which block of one KV pool.
 *
 * The scheduler is the only actor that decides which block belongs to whom; this module is its
 * ledger. It keeps the set of free blocks, a reference count per block and, per sequence, a
 * block table (struct block_table, storage owned by the sequence). Block 0 is reserved as
 * padding (kvpool/geometry.h) and never handed out.
 *
 * Allocation order, for locality (a sequence's blocks physically consecutive where it costs
 * nothing, which the scheduler's Stats measure as locality): a table's next block is the one
 * right after its last when that one is free, otherwise (and for a table's first block, and for
 * block_manager_alloc) the lowest free block. Both are O(1) but for the search of the lowest,
 * which scans a bitmap summary (one bit per 64 blocks) from a cursor. (Until 2026-12 the free
 * set was a LIFO stack, which hands a freed block straight back to the next sequence that asks
 * and scatters tables after churn; bench/RESULTS.md "Page locality" measures both.)
 *
 * Sharing: a block may be held by several tables (the prefix cache of a later issue shares
 * full prompt blocks, and will hold a reference of its own); it returns to the free list only
 * when its count reaches 0.
 *
 * Steps in flight: a worker may still be writing a block when its holder finishes, is cancelled
 * or is preempted. So a holder never drops a reference directly: it defers the drop to a fence,
 * the id of the last step sent that could write the block, and the reference is dropped when
 * the scheduler reports that every step up to the fence has been acknowledged
 * (block_manager_ack). Until then the block is neither free nor reusable. Fences come from an
 * increasing step counter, so the deferred list stays ordered and acknowledging is O(released).
 *
 * Not thread-safe: one scheduler loop owns it. */
#ifndef PAGODA_SCHEDULER_BLOCK_MANAGER_H
#define PAGODA_SCHEDULER_BLOCK_MANAGER_H

#include <stdint.h>

/* The largest pool this module manages (block ids are int32 on the wire). */
#define BLOCK_MANAGER_MAX_BLOCKS (1 << 30)

/* A sequence's blocks, in position order: block ids[i] holds positions [i * block_size,
 * (i + 1) * block_size). The caller owns the struct; the manager grows ids as blocks are added
 * and empties it on release. Zero-initialised (or block_table_init) is an empty table. */
struct block_table {
    int32_t *ids;
    int32_t num_blocks;
    int32_t cap;
};

struct block_manager;

/* Creates a manager for a pool of num_blocks blocks, block 0 included (so num_blocks - 1 can
 * be handed out), all free. On success *out is the caller's, released with block_manager_close.
 * Errors: PAGODA_EINVAL (NULL out), PAGODA_ERANGE (num_blocks outside [2,
 * BLOCK_MANAGER_MAX_BLOCKS]), PAGODA_ENOMEM. */
int block_manager_open(int32_t num_blocks, struct block_manager **out);

/* Frees the manager. Tables that still hold its blocks keep stale ids (fini them). Accepts
 * NULL. */
void block_manager_close(struct block_manager *bm);

/* Blocks that can ever be handed out: num_blocks - 1. */
int32_t block_manager_usable(const struct block_manager *bm);

/* Free blocks now (not counting deferred ones). */
int32_t block_manager_free_count(const struct block_manager *bm);

/* Blocks whose last reference waits for a fence (held, but by nobody who will write them). */
int32_t block_manager_deferred_count(const struct block_manager *bm);

/* The reference count of block (0 for a free block; block 0 reports 1). -1 when block is out
 * of range. */
int32_t block_manager_refcount(const struct block_manager *bm, int32_t block);

/* Takes the lowest free block with reference count 1 into *block. Errors: PAGODA_EEXHAUSTED (no
 * free block; nothing changes). */
int block_manager_alloc(struct block_manager *bm, int32_t *block);

/* Adds a reference to a held block (sharing). Errors: PAGODA_ERANGE (not a valid block id),
 * PAGODA_EINVAL (block is free or is block 0). */
int block_manager_ref(struct block_manager *bm, int32_t block);

/* Drops one reference now; at 0 the block is free again. Only for a holder that knows no step
 * in flight can write the block (use block_manager_defer otherwise). Errors: PAGODA_ERANGE,
 * PAGODA_EINVAL (the block is free or is block 0: a double free, nothing changes). */
int block_manager_unref(struct block_manager *bm, int32_t block);

/* Drops one reference once step `fence` has been acknowledged (block_manager_ack with
 * acked_through >= fence); immediately when that already happened. Fences passed over time
 * should not decrease (a decreasing one is still safe, only released later). Errors as
 * block_manager_unref, plus PAGODA_EINVAL when more drops are pending than references held. */
int block_manager_defer(struct block_manager *bm, int32_t block, uint64_t fence);

/* Records that every step with id <= acked_through was acknowledged, and drops every deferred
 * reference whose fence is covered. Returns the number of blocks that became free. A smaller
 * acked_through than an earlier call's changes nothing. */
int32_t block_manager_ack(struct block_manager *bm, uint64_t acked_through);

/* The highest acked_through reported so far (0 at the start). */
uint64_t block_manager_acked_through(const struct block_manager *bm);

/* Tests: adds to counts[b] (num_blocks entries) the drops of block b deferred to a fence. */
void block_manager_add_deferred(const struct block_manager *bm, int32_t *counts);

/* Tests: checks the free set (exactly the blocks with reference count 0, block 0 never; the
 * summary agreeing with it) and the deferred drops (never more than the references). Returns 0,
 * or -1 with a reason in *why. */
int block_manager_check(const struct block_manager *bm, const char **why);

/* Empties a table for reuse: (re)initialises t to no blocks and no storage. */
void block_table_init(struct block_table *t);

/* Frees the table's storage (not its blocks: release them first). Accepts NULL. */
void block_table_fini(struct block_table *t);

/* Allocates a block (the one after t's last when free, else the lowest free) and appends it to
 * t. Errors: PAGODA_EEXHAUSTED (no free block),
 * PAGODA_ENOMEM (the table could not grow; the block is returned). Nothing changes on error. */
int block_table_append_new(struct block_manager *bm, struct block_table *t);

/* Appends a held block shared with another holder (a reference is added). Errors as
 * block_manager_ref, plus PAGODA_ENOMEM. */
int block_table_append_shared(struct block_manager *bm, struct block_table *t, int32_t block);

/* Releases every block of t with fence (see block_manager_defer) and empties the table (its
 * storage is kept for reuse). Returns 0 or the first error of block_manager_defer (a broken
 * invariant; the remaining blocks are still released). */
int block_table_release(struct block_manager *bm, struct block_table *t, uint64_t fence);

/* Blocks needed to hold num_tokens tokens: ceil(num_tokens / block_size). */
static inline int32_t block_count_for(int64_t num_tokens, int32_t block_size)
{
    return (int32_t)((num_tokens + block_size - 1) / block_size);
}

#endif
