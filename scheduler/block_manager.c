#include "scheduler/block_manager.h"

#include "common/error.h"

#include <stdlib.h>

/* Per block: its reference count, the drops deferred to a fence and the fence itself, and its
 * links in the deferred list (ordered by fence, oldest first). A block is free (its bit set in
 * free_bits) exactly when its count is 0. The free set is a bitmap with a summary (bit w of
 * free_sum is set when word w of free_bits has a free block), so the lowest free block is found
 * in O(num_blocks / 4096) words at worst, from a cursor below which no summary word has a bit. */
struct block_manager {
    int32_t num_blocks;
    int32_t *refcount;
    int32_t *pending; /* deferred drops, at most refcount */
    uint64_t *fence;  /* valid while pending > 0 */
    int32_t *dprev, *dnext;
    int32_t dhead, dtail; /* -1 when empty */
    int32_t num_deferred;
    uint64_t *free_bits, *free_sum;
    int32_t num_words, num_sum_words;
    int32_t sum_lo; /* free_sum[i] == 0 for every i < sum_lo */
    int32_t free_count;
    uint64_t acked_through;
};

static int is_free(const struct block_manager *bm, int32_t b)
{
    return (bm->free_bits[b >> 6] >> (b & 63)) & 1u;
}

static void set_free(struct block_manager *bm, int32_t b)
{
    int32_t w = b >> 6;
    bm->free_bits[w] |= 1ull << (b & 63);
    bm->free_sum[w >> 6] |= 1ull << (w & 63);
    if ((w >> 6) < bm->sum_lo)
        bm->sum_lo = w >> 6;
    bm->free_count++;
}

static void take(struct block_manager *bm, int32_t b)
{
    int32_t w = b >> 6;
    bm->free_bits[w] &= ~(1ull << (b & 63));
    if (bm->free_bits[w] == 0)
        bm->free_sum[w >> 6] &= ~(1ull << (w & 63));
    bm->free_count--;
    bm->refcount[b] = 1;
}

/* The lowest free block; the caller checked that one exists. */
static int32_t lowest_free(struct block_manager *bm)
{
    while (bm->free_sum[bm->sum_lo] == 0)
        bm->sum_lo++;
    int32_t w = (bm->sum_lo << 6) + __builtin_ctzll(bm->free_sum[bm->sum_lo]);
    return (w << 6) + __builtin_ctzll(bm->free_bits[w]);
}

/* The block to hand out: hint when it is free (a sequence's next block right after its last),
 * else the lowest free one. */
static int32_t pick(struct block_manager *bm, int32_t hint)
{
    if (hint >= 1 && hint < bm->num_blocks && is_free(bm, hint))
        return hint;
    return lowest_free(bm);
}

int block_manager_open(int32_t num_blocks, struct block_manager **out)
{
    if (out == NULL)
        return PAGODA_EINVAL;
    if (num_blocks < 2 || num_blocks > BLOCK_MANAGER_MAX_BLOCKS)
        return pagoda_error_set(PAGODA_ERANGE, "block manager: num_blocks %d outside [2, %d]",
                                (int)num_blocks, BLOCK_MANAGER_MAX_BLOCKS);
    struct block_manager *bm = calloc(1, sizeof(*bm));
    if (bm == NULL)
        return PAGODA_ENOMEM;
    size_t n = (size_t)num_blocks;
    bm->refcount = calloc(n, sizeof(int32_t));
    bm->pending = calloc(n, sizeof(int32_t));
    bm->fence = calloc(n, sizeof(uint64_t));
    bm->dprev = malloc(n * sizeof(int32_t));
    bm->dnext = malloc(n * sizeof(int32_t));
    bm->num_words = (num_blocks + 63) / 64;
    bm->num_sum_words = (bm->num_words + 63) / 64;
    bm->free_bits = calloc((size_t)bm->num_words, sizeof(uint64_t));
    bm->free_sum = calloc((size_t)bm->num_sum_words + 1, sizeof(uint64_t));
    if (!bm->refcount || !bm->pending || !bm->fence || !bm->dprev || !bm->dnext || !bm->free_bits ||
        !bm->free_sum) {
        block_manager_close(bm);
        return PAGODA_ENOMEM;
    }
    bm->num_blocks = num_blocks;
    bm->refcount[0] = 1; /* the padding block: held forever, never free */
    for (int32_t b = 1; b < num_blocks; b++)
        set_free(bm, b);
    bm->sum_lo = 0;
    bm->dhead = bm->dtail = -1;
    *out = bm;
    return 0;
}

void block_manager_close(struct block_manager *bm)
{
    if (bm == NULL)
        return;
    free(bm->refcount);
    free(bm->pending);
    free(bm->fence);
    free(bm->dprev);
    free(bm->dnext);
    free(bm->free_bits);
    free(bm->free_sum);
    free(bm);
}

int32_t block_manager_usable(const struct block_manager *bm)
{
    return bm->num_blocks - 1;
}

int32_t block_manager_free_count(const struct block_manager *bm)
{
    return bm->free_count;
}

int32_t block_manager_deferred_count(const struct block_manager *bm)
{
    return bm->num_deferred;
}

int32_t block_manager_refcount(const struct block_manager *bm, int32_t block)
{
    if (block < 0 || block >= bm->num_blocks)
        return -1;
    return bm->refcount[block];
}

uint64_t block_manager_acked_through(const struct block_manager *bm)
{
    return bm->acked_through;
}

int block_manager_alloc(struct block_manager *bm, int32_t *block)
{
    if (bm->free_count == 0)
        return PAGODA_EEXHAUSTED;
    int32_t b = lowest_free(bm);
    take(bm, b);
    *block = b;
    return 0;
}

/* A block a holder may name: in range and not the padding block. */
static int check_held(const struct block_manager *bm, int32_t block, const char *what)
{
    if (block <= 0 || block >= bm->num_blocks)
        return pagoda_error_set(PAGODA_ERANGE, "block manager: %s of block %d outside [1, %d)",
                                what, (int)block, (int)bm->num_blocks);
    if (bm->refcount[block] <= 0)
        return pagoda_error_set(PAGODA_EINVAL, "block manager: %s of free block %d", what,
                                (int)block);
    return 0;
}

int block_manager_ref(struct block_manager *bm, int32_t block)
{
    int rc = check_held(bm, block, "ref");
    if (rc != 0)
        return rc;
    bm->refcount[block]++;
    return 0;
}

static void drop(struct block_manager *bm, int32_t block, int32_t count)
{
    bm->refcount[block] -= count;
    if (bm->refcount[block] == 0)
        set_free(bm, block);
}

int block_manager_unref(struct block_manager *bm, int32_t block)
{
    int rc = check_held(bm, block, "unref");
    if (rc != 0)
        return rc;
    if (bm->pending[block] >= bm->refcount[block])
        return pagoda_error_set(PAGODA_EINVAL,
                                "block manager: unref of block %d whose "
                                "references are all deferred",
                                (int)block);
    drop(bm, block, 1);
    return 0;
}

static void unlink_deferred(struct block_manager *bm, int32_t b)
{
    int32_t p = bm->dprev[b], n = bm->dnext[b];
    if (p >= 0)
        bm->dnext[p] = n;
    else
        bm->dhead = n;
    if (n >= 0)
        bm->dprev[n] = p;
    else
        bm->dtail = p;
}

static void append_deferred(struct block_manager *bm, int32_t b)
{
    bm->dprev[b] = bm->dtail;
    bm->dnext[b] = -1;
    if (bm->dtail >= 0)
        bm->dnext[bm->dtail] = b;
    else
        bm->dhead = b;
    bm->dtail = b;
}

int block_manager_defer(struct block_manager *bm, int32_t block, uint64_t fence)
{
    int rc = check_held(bm, block, "deferred free");
    if (rc != 0)
        return rc;
    if (bm->pending[block] >= bm->refcount[block])
        return pagoda_error_set(PAGODA_EINVAL,
                                "block manager: block %d released more often "
                                "than it is held",
                                (int)block);
    if (fence <= bm->acked_through) {
        drop(bm, block, 1);
        return 0;
    }
    if (bm->pending[block] > 0) {
        unlink_deferred(bm, block);
        if (bm->fence[block] > fence)
            fence = bm->fence[block];
    } else {
        bm->num_deferred++;
    }
    bm->pending[block]++;
    bm->fence[block] = fence;
    /* The newest fence goes last, which keeps the list ordered by fence. */
    append_deferred(bm, block);
    return 0;
}

int32_t block_manager_ack(struct block_manager *bm, uint64_t acked_through)
{
    if (acked_through <= bm->acked_through)
        return 0;
    bm->acked_through = acked_through;
    int32_t freed = 0;
    while (bm->dhead >= 0 && bm->fence[bm->dhead] <= acked_through) {
        int32_t b = bm->dhead;
        unlink_deferred(bm, b);
        bm->num_deferred--;
        int32_t count = bm->pending[b];
        bm->pending[b] = 0;
        drop(bm, b, count);
        freed += bm->refcount[b] == 0;
    }
    return freed;
}

void block_table_init(struct block_table *t)
{
    t->ids = NULL;
    t->num_blocks = 0;
    t->cap = 0;
}

void block_table_fini(struct block_table *t)
{
    if (t == NULL)
        return;
    free(t->ids);
    block_table_init(t);
}

static int table_reserve(struct block_table *t)
{
    if (t->num_blocks < t->cap)
        return 0;
    int32_t cap = t->cap ? t->cap * 2 : 8;
    if (cap > BLOCK_MANAGER_MAX_BLOCKS)
        return PAGODA_ENOMEM;
    int32_t *ids = realloc(t->ids, (size_t)cap * sizeof(*ids));
    if (ids == NULL)
        return PAGODA_ENOMEM;
    t->ids = ids;
    t->cap = cap;
    return 0;
}

int block_table_append_new(struct block_manager *bm, struct block_table *t)
{
    if (bm->free_count == 0)
        return PAGODA_EEXHAUSTED;
    int rc = table_reserve(t);
    if (rc != 0)
        return rc;
    int32_t b = pick(bm, t->num_blocks > 0 ? t->ids[t->num_blocks - 1] + 1 : -1);
    take(bm, b);
    t->ids[t->num_blocks++] = b;
    return 0;
}

int block_table_append_shared(struct block_manager *bm, struct block_table *t, int32_t block)
{
    int rc = check_held(bm, block, "share");
    if (rc != 0)
        return rc;
    if ((rc = table_reserve(t)) != 0)
        return rc;
    bm->refcount[block]++;
    t->ids[t->num_blocks++] = block;
    return 0;
}

int block_table_release(struct block_manager *bm, struct block_table *t, uint64_t fence)
{
    int first = 0;
    for (int32_t i = 0; i < t->num_blocks; i++) {
        int rc = block_manager_defer(bm, t->ids[i], fence);
        if (rc != 0 && first == 0)
            first = rc;
    }
    t->num_blocks = 0;
    return first;
}

void block_manager_add_deferred(const struct block_manager *bm, int32_t *counts)
{
    for (int32_t b = 0; b < bm->num_blocks; b++)
        counts[b] += bm->pending[b];
}

int block_manager_check(const struct block_manager *bm, const char **why)
{
    int32_t zero = 0, deferred = 0;
    for (int32_t b = 0; b < bm->num_blocks; b++) {
        zero += b > 0 && bm->refcount[b] == 0;
        deferred += b > 0 && bm->pending[b] > 0;
        if (b > 0 && (bm->refcount[b] < 0 || bm->pending[b] > bm->refcount[b])) {
            *why = "a block has a negative count or more deferred drops than references";
            return -1;
        }
        if (is_free(bm, b) != (b > 0 && bm->refcount[b] == 0)) {
            *why = "the free bitmap disagrees with a block's reference count";
            return -1;
        }
    }
    if (zero != bm->free_count || deferred != bm->num_deferred) {
        *why = "the free count or the deferred list disagrees with the counts";
        return -1;
    }
    for (int32_t w = 0; w < bm->num_words; w++) {
        int sum = (bm->free_sum[w >> 6] >> (w & 63)) & 1u;
        if (sum != (bm->free_bits[w] != 0) || (sum && (w >> 6) < bm->sum_lo)) {
            *why = "the free summary disagrees with the free bitmap";
            return -1;
        }
    }
    return 0;
}
