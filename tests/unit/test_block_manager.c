/* Tests of scheduler/block_manager.c: the free set and its allocation order, reference counts,
 * deferred frees fenced on acknowledged steps, exhaustion, and block 0 never handed out. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "scheduler/block_manager.h"

#include <stdlib.h>
#include <string.h>

static struct block_manager *open_bm(int32_t num_blocks)
{
    struct block_manager *bm = NULL;
    assert_int_equal(block_manager_open(num_blocks, &bm), 0);
    assert_non_null(bm);
    return bm;
}

/* Every usable block is handed out exactly once, block 0 never; then the pool is exhausted and
 * an exhausted alloc changes nothing. */
static void test_alloc_until_exhausted(void **state)
{
    const int32_t n = 9;
    struct block_manager *bm = open_bm(n);
    assert_int_equal(block_manager_usable(bm), n - 1);
    assert_int_equal(block_manager_free_count(bm), n - 1);
    assert_int_equal(block_manager_refcount(bm, 0), 1);
    int seen[9] = {0};
    for (int i = 0; i < n - 1; i++) {
        int32_t b = -1;
        assert_int_equal(block_manager_alloc(bm, &b), 0);
        assert_true(b >= 1 && b < n);
        assert_int_equal(seen[b], 0);
        seen[b] = 1;
        assert_int_equal(block_manager_refcount(bm, b), 1);
    }
    assert_int_equal(block_manager_free_count(bm), 0);
    int32_t b = 77;
    assert_int_equal(block_manager_alloc(bm, &b), PAGODA_EEXHAUSTED);
    assert_int_equal(b, 77);
    /* One freed block is the next one handed out. */
    assert_int_equal(block_manager_unref(bm, 5), 0);
    assert_int_equal(block_manager_free_count(bm), 1);
    assert_int_equal(block_manager_alloc(bm, &b), 0);
    assert_int_equal(b, 5);
    block_manager_close(bm);
}

/* Block 0, ids out of range and free blocks cannot be referenced or released. */
static void test_invalid_ids_and_double_free(void **state)
{
    struct block_manager *bm = open_bm(4);
    assert_int_equal(block_manager_unref(bm, 0), PAGODA_ERANGE);
    assert_int_equal(block_manager_ref(bm, 0), PAGODA_ERANGE);
    assert_int_equal(block_manager_defer(bm, 0, 1), PAGODA_ERANGE);
    assert_int_equal(block_manager_unref(bm, 4), PAGODA_ERANGE);
    assert_int_equal(block_manager_unref(bm, -1), PAGODA_ERANGE);
    assert_int_equal(block_manager_refcount(bm, 4), -1);
    int32_t b;
    assert_int_equal(block_manager_alloc(bm, &b), 0);
    assert_int_equal(block_manager_unref(bm, b), 0);
    assert_int_equal(block_manager_unref(bm, b), PAGODA_EINVAL); /* double free */
    assert_int_equal(block_manager_ref(bm, b), PAGODA_EINVAL);   /* ref of a free block */
    assert_int_equal(block_manager_free_count(bm), 3);
    assert_int_equal(block_manager_refcount(bm, 0), 1);
    struct block_manager *bad = NULL;
    assert_int_equal(block_manager_open(1, &bad), PAGODA_ERANGE);
    assert_null(bad);
    block_manager_close(bm);
    block_manager_close(NULL);
}

/* A shared block is free only when its last holder lets go. */
static void test_refcount_sharing(void **state)
{
    struct block_manager *bm = open_bm(4);
    struct block_table a, b;
    block_table_init(&a);
    block_table_init(&b);
    assert_int_equal(block_table_append_new(bm, &a), 0);
    int32_t shared = a.ids[0];
    assert_int_equal(block_table_append_shared(bm, &b, shared), 0);
    assert_int_equal(block_table_append_new(bm, &b), 0);
    assert_int_equal(block_manager_refcount(bm, shared), 2);
    assert_int_equal(block_manager_free_count(bm), 1);
    assert_int_equal(block_table_release(bm, &a, 0), 0);
    assert_int_equal(a.num_blocks, 0);
    assert_int_equal(block_manager_refcount(bm, shared), 1);
    assert_int_equal(block_manager_free_count(bm), 1);
    assert_int_equal(block_table_release(bm, &b, 0), 0);
    assert_int_equal(block_manager_refcount(bm, shared), 0);
    assert_int_equal(block_manager_free_count(bm), 3);
    block_table_fini(&a);
    block_table_fini(&b);
    block_manager_close(bm);
}

/* A released block stays out of the free list until its fence step is acknowledged; acks are
 * monotone and release in fence order. */
static void test_deferred_free_waits_for_ack(void **state)
{
    struct block_manager *bm = open_bm(8);
    struct block_table t1, t2;
    block_table_init(&t1);
    block_table_init(&t2);
    for (int i = 0; i < 3; i++)
        assert_int_equal(block_table_append_new(bm, &t1), 0);
    for (int i = 0; i < 2; i++)
        assert_int_equal(block_table_append_new(bm, &t2), 0);
    assert_int_equal(block_manager_free_count(bm), 2);
    assert_int_equal(block_manager_ack(bm, 4), 0);
    /* Step 5 could write t1's blocks, step 6 t2's. */
    assert_int_equal(block_table_release(bm, &t1, 5), 0);
    assert_int_equal(block_table_release(bm, &t2, 6), 0);
    assert_int_equal(block_manager_free_count(bm), 2);
    assert_int_equal(block_manager_deferred_count(bm), 5);
    int32_t b;
    assert_int_equal(block_manager_alloc(bm, &b), 0);
    assert_int_equal(block_manager_alloc(bm, &b), 0);
    assert_int_equal(block_manager_alloc(bm, &b), PAGODA_EEXHAUSTED); /* deferred aren't free */
    assert_int_equal(block_manager_ack(bm, 3), 0);                    /* older ack: nothing */
    assert_int_equal(block_manager_ack(bm, 5), 3);
    assert_int_equal(block_manager_free_count(bm), 3);
    assert_int_equal(block_manager_deferred_count(bm), 2);
    assert_int_equal(block_manager_acked_through(bm), 5);
    assert_int_equal(block_manager_ack(bm, 9), 2);
    assert_int_equal(block_manager_free_count(bm), 5);
    assert_int_equal(block_manager_deferred_count(bm), 0);
    /* A fence already acknowledged frees at once. */
    assert_int_equal(block_table_append_new(bm, &t1), 0);
    int32_t held = t1.ids[0];
    assert_int_equal(block_table_release(bm, &t1, 9), 0);
    assert_int_equal(block_manager_refcount(bm, held), 0);
    assert_int_equal(block_manager_free_count(bm), 5);
    block_table_fini(&t1);
    block_table_fini(&t2);
    block_manager_close(bm);
}

/* A shared block released by two holders with different fences is free after the later one;
 * it cannot be released more often than it is held. */
static void test_deferred_shared_block(void **state)
{
    struct block_manager *bm = open_bm(4);
    int32_t b;
    assert_int_equal(block_manager_alloc(bm, &b), 0);
    assert_int_equal(block_manager_ref(bm, b), 0);
    assert_int_equal(block_manager_defer(bm, b, 2), 0);
    assert_int_equal(block_manager_defer(bm, b, 3), 0);
    assert_int_equal(block_manager_defer(bm, b, 3), PAGODA_EINVAL);
    assert_int_equal(block_manager_unref(bm, b), PAGODA_EINVAL); /* all drops already pending */
    assert_int_equal(block_manager_deferred_count(bm), 1);
    assert_int_equal(block_manager_ack(bm, 2), 0);
    assert_int_equal(block_manager_refcount(bm, b), 2);
    assert_int_equal(block_manager_ack(bm, 3), 1);
    assert_int_equal(block_manager_refcount(bm, b), 0);
    assert_int_equal(block_manager_free_count(bm), 3);
    block_manager_close(bm);
}

/* Many alloc/defer/ack rounds keep the ledger consistent: free + held + deferred = usable. */
static void test_churn_keeps_ledger(void **state)
{
    const int32_t n = 65;
    struct block_manager *bm = open_bm(n);
    struct block_table tables[8];
    for (int i = 0; i < 8; i++)
        block_table_init(&tables[i]);
    uint32_t rng = 12345;
    uint64_t step = 0;
    for (int round = 0; round < 2000; round++) {
        rng = rng * 1103515245u + 12345u;
        int which = (int)((rng >> 16) % 8);
        if ((rng >> 8) % 3 != 0) {
            int rc = block_table_append_new(bm, &tables[which]);
            assert_true(rc == 0 || rc == PAGODA_EEXHAUSTED);
        } else {
            assert_int_equal(block_table_release(bm, &tables[which], step + 1), 0);
        }
        step++;
        if (round % 3 == 0)
            block_manager_ack(bm, step - 1);
        int32_t held = 0;
        for (int i = 0; i < 8; i++) {
            held += tables[i].num_blocks;
            for (int32_t j = 0; j < tables[i].num_blocks; j++) {
                assert_true(tables[i].ids[j] >= 1 && tables[i].ids[j] < n);
                assert_int_equal(block_manager_refcount(bm, tables[i].ids[j]), 1);
            }
        }
        assert_int_equal(block_manager_free_count(bm) + held + block_manager_deferred_count(bm),
                         n - 1);
    }
    for (int i = 0; i < 8; i++) {
        block_table_release(bm, &tables[i], step);
        block_table_fini(&tables[i]);
    }
    block_manager_ack(bm, step);
    assert_int_equal(block_manager_free_count(bm), n - 1);
    block_manager_close(bm);
}

/* Allocation order: a fresh pool hands out 1, 2, 3, ...; a table's next block is the one after
 * its last when that is free; otherwise, and for a first block, the lowest free one (not the
 * most recently freed, as the LIFO stack before it did). */
static void test_allocation_order(void **state)
{
    const int32_t n = 300; /* more than one bitmap word, and more than one summary bit */
    struct block_manager *bm = open_bm(n);
    struct block_table a, b;
    block_table_init(&a);
    block_table_init(&b);
    for (int i = 0; i < 4; i++)
        assert_int_equal(block_table_append_new(bm, &a), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(a.ids[i], 1 + i);
    /* b takes 5; a's next (5) is taken, so a gets the lowest free (6); b's next is 6, taken:
     * b gets 7; then a's next after 6 is 7, taken: 8. */
    assert_int_equal(block_table_append_new(bm, &b), 0);
    assert_int_equal(b.ids[0], 5);
    assert_int_equal(block_table_append_new(bm, &a), 0);
    assert_int_equal(a.ids[4], 6);
    assert_int_equal(block_table_append_new(bm, &b), 0);
    assert_int_equal(b.ids[1], 7);
    assert_int_equal(block_table_append_new(bm, &a), 0);
    assert_int_equal(a.ids[5], 8);
    /* Free 2 and 3 (a's), then 200 after filling up to it: the lowest free (2) comes first,
     * although 200 was freed last. */
    int32_t blk;
    for (int32_t want = 9; want <= 200; want++) {
        assert_int_equal(block_manager_alloc(bm, &blk), 0);
        assert_int_equal(blk, want);
    }
    assert_int_equal(block_manager_unref(bm, 2), 0);
    assert_int_equal(block_manager_unref(bm, 3), 0);
    assert_int_equal(block_manager_unref(bm, 200), 0);
    assert_int_equal(block_manager_alloc(bm, &blk), 0);
    assert_int_equal(blk, 2);
    /* A table whose last block is 199 continues at the free 200, not at the lowest (3). */
    struct block_table c;
    block_table_init(&c);
    assert_int_equal(block_table_append_shared(bm, &c, 199), 0);
    assert_int_equal(block_table_append_new(bm, &c), 0);
    assert_int_equal(c.ids[1], 200);
    assert_int_equal(block_table_append_new(bm, &c), 0);
    assert_int_equal(c.ids[2], 201);
    const char *why = NULL;
    assert_int_equal(block_manager_check(bm, &why), 0);
    block_table_fini(&a);
    block_table_fini(&b);
    block_table_fini(&c);
    block_manager_close(bm);

    /* Past one summary word (64 x 64 blocks): the cursor moves up as the low words fill and
     * back down when a lower block is freed. */
    const int32_t big = 20000;
    bm = open_bm(big);
    for (int32_t want = 1; want < big; want++) {
        assert_int_equal(block_manager_alloc(bm, &blk), 0);
        assert_int_equal(blk, want);
    }
    assert_int_equal(block_manager_alloc(bm, &blk), PAGODA_EEXHAUSTED);
    assert_int_equal(block_manager_unref(bm, 19000), 0);
    assert_int_equal(block_manager_unref(bm, 15000), 0);
    assert_int_equal(block_manager_alloc(bm, &blk), 0);
    assert_int_equal(blk, 15000);
    assert_int_equal(block_manager_unref(bm, 100), 0);
    assert_int_equal(block_manager_alloc(bm, &blk), 0);
    assert_int_equal(blk, 100);
    assert_int_equal(block_manager_alloc(bm, &blk), 0);
    assert_int_equal(blk, 19000);
    assert_int_equal(block_manager_check(bm, &why), 0);
    block_manager_close(bm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_until_exhausted),
        cmocka_unit_test(test_invalid_ids_and_double_free),
        cmocka_unit_test(test_refcount_sharing),
        cmocka_unit_test(test_deferred_free_waits_for_ack),
        cmocka_unit_test(test_deferred_shared_block),
        cmocka_unit_test(test_churn_keeps_ledger),
        cmocka_unit_test(test_allocation_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
