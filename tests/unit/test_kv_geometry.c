/* Tests of kvpool/geometry.c: the range checks and the layer view against the layout
 * [layer][block][K|V][kv_head][slot][head_dim]. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "kvpool/geometry.h"

#include <stdlib.h>
#include <string.h>

static struct kv_geometry small_geometry(enum dtype t)
{
    struct kv_geometry g = {
        .pool_id = 7,
        .num_layers = 3,
        .num_blocks = 5,
        .block_size = 8,
        .num_kv_heads = 3,
        .head_dim = 4,
        .dtype = t,
    };
    return g;
}

/* A realistic geometry (Llama-3-8B-like shard) and the edges of each range are accepted. */
static void test_validate_accepts_valid(void **state)
{
    struct kv_geometry g = {.pool_id = 1,
                            .num_layers = 32,
                            .num_blocks = 4096,
                            .block_size = KV_BLOCK_SIZE_DEFAULT,
                            .num_kv_heads = 8,
                            .head_dim = 128,
                            .dtype = DTYPE_BF16};
    assert_int_equal(kv_geometry_validate(&g), 0);
    g.block_size = KV_BLOCK_SIZE_MIN;
    g.num_blocks = 2;
    g.head_dim = 1;
    g.num_layers = 1;
    g.num_kv_heads = 1;
    assert_int_equal(kv_geometry_validate(&g), 0);
    g.block_size = KV_BLOCK_SIZE_MAX;
    g.head_dim = KV_HEAD_DIM_MAX;
    g.dtype = DTYPE_F32;
    assert_int_equal(kv_geometry_validate(&g), 0);
    g.dtype = DTYPE_F16;
    assert_int_equal(kv_geometry_validate(&g), 0);
}

struct bad_case {
    const char *field;
    struct kv_geometry g;
};

static void expect_range_error(const struct kv_geometry *g, const char *field)
{
    pagoda_error_clear();
    int rc = kv_geometry_validate(g);
    if (rc != PAGODA_ERANGE || strstr(pagoda_error_detail(), field) == NULL)
        fail_msg("field %s: rc %d, detail \"%s\"", field, rc, pagoda_error_detail());
}

/* Every out-of-range field is refused with PAGODA_ERANGE and a detail that names it. */
static void test_validate_names_the_bad_field(void **state)
{
    struct kv_geometry base = small_geometry(DTYPE_F32);
    struct kv_geometry g;

    g = base, g.num_layers = 0;
    expect_range_error(&g, "num_layers");
    g = base, g.num_layers = -3;
    expect_range_error(&g, "num_layers");
    g = base, g.num_blocks = 1; /* block 0 alone would leave nothing to allocate */
    expect_range_error(&g, "num_blocks");
    g = base, g.num_blocks = 0;
    expect_range_error(&g, "num_blocks");
    g = base, g.block_size = KV_BLOCK_SIZE_MIN - 1;
    expect_range_error(&g, "block_size");
    g = base, g.block_size = KV_BLOCK_SIZE_MAX + 1;
    expect_range_error(&g, "block_size");
    g = base, g.block_size = 0;
    expect_range_error(&g, "block_size");
    g = base, g.num_kv_heads = 0;
    expect_range_error(&g, "num_kv_heads");
    g = base, g.head_dim = 0;
    expect_range_error(&g, "head_dim");
    g = base, g.head_dim = KV_HEAD_DIM_MAX + 1;
    expect_range_error(&g, "head_dim");
    g = base, g.dtype = (enum dtype)17;
    expect_range_error(&g, "dtype");
    g = base, g.dtype = (enum dtype) - 1;
    expect_range_error(&g, "dtype");

    assert_int_equal(kv_geometry_validate(NULL), PAGODA_EINVAL);
}

/* The total size bound is exact at 2^62 and never overflows on the way: f32 x head_dim 1024 x
 * block 64 x 2 (K, V) = 2^19 bytes per (layer, block, head), so layers x blocks x heads = 2^43
 * reaches 2^62 exactly. */
static void test_validate_bounds_total_bytes(void **state)
{
    struct kv_geometry g = {.num_layers = 1 << 13,
                            .num_blocks = 1 << 20,
                            .block_size = 64,
                            .num_kv_heads = 1 << 10,
                            .head_dim = 1024,
                            .dtype = DTYPE_F32};
    expect_range_error(&g, "bytes");
    g.num_blocks = (1 << 20) - 1;
    assert_int_equal(kv_geometry_validate(&g), 0);
    assert_true(kv_pool_bytes(&g) < (UINT64_C(1) << 62));
    assert_int_equal(kv_pool_bytes(&g), (uint64_t)((1 << 20) - 1) << 42);

    /* Products far beyond 2^64 must be refused, not wrapped into something small. */
    struct kv_geometry huge = {.num_layers = INT32_MAX,
                               .num_blocks = INT32_MAX,
                               .block_size = 64,
                               .num_kv_heads = INT32_MAX,
                               .head_dim = 1024,
                               .dtype = DTYPE_F32};
    expect_range_error(&huge, "bytes");
    huge.num_layers = 1 << 16;
    huge.num_blocks = 1 << 16;
    huge.num_kv_heads = 1 << 16; /* 2^48 x 2^19 = 2^67, which wraps to 0 in 64 bits */
    expect_range_error(&huge, "bytes");
}

/* The byte offset of one element according to the layout, computed independently of the
 * view: [layer][block][K|V][kv_head][slot][head_dim]. */
static size_t layout_offset(const struct kv_geometry *g, int layer, int block, int kv, int head,
                            int slot, int d)
{
    size_t i = (size_t)layer;
    i = i * (size_t)g->num_blocks + (size_t)block;
    i = i * 2 + (size_t)kv;
    i = i * (size_t)g->num_kv_heads + (size_t)head;
    i = i * (size_t)g->block_size + (size_t)slot;
    i = i * (size_t)g->head_dim + (size_t)d;
    return i * dtype_size(g->dtype);
}

/* Walks every (layer, block, K/V, head, slot, dim) through the view: each address equals the
 * layout formula, lies inside the pool, and is hit exactly once; each tile is contiguous. */
static void check_view_covers_layout(enum dtype t)
{
    struct kv_geometry g = small_geometry(t);
    assert_int_equal(kv_geometry_validate(&g), 0);
    size_t bytes = kv_pool_bytes(&g);
    size_t esize = dtype_size(t);
    assert_int_equal(bytes, (size_t)3 * 5 * 2 * 3 * 8 * 4 * esize);
    char *base = malloc(bytes);
    unsigned char *hits = calloc(bytes / esize, 1);
    assert_non_null(base);
    assert_non_null(hits);

    for (int layer = 0; layer < g.num_layers; layer++) {
        struct kv_layer_view v = kv_layer_view_make(&g, base, layer);
        assert_int_equal(v.block_size, g.block_size);
        assert_int_equal(v.num_kv_heads, g.num_kv_heads);
        assert_int_equal(v.head_dim, g.head_dim);
        assert_int_equal(v.num_blocks, g.num_blocks);
        assert_int_equal(v.dtype, t);
        for (int block = 0; block < g.num_blocks; block++) {
            for (int kv = 0; kv < 2; kv++) {
                for (int head = 0; head < g.num_kv_heads; head++) {
                    char *tile = (char *)(kv ? v.v : v.k) +
                                 (size_t)(block * v.block_stride + head * v.head_stride) * esize;
                    for (int slot = 0; slot < g.block_size; slot++) {
                        for (int d = 0; d < g.head_dim; d++) {
                            int64_t elem = block * v.block_stride + head * v.head_stride +
                                           slot * v.slot_stride + d;
                            char *p = (char *)(kv ? v.v : v.k) + (size_t)elem * esize;
                            assert_true(p >= base && p + esize <= base + bytes);
                            size_t off = (size_t)(p - base);
                            assert_int_equal(off,
                                             layout_offset(&g, layer, block, kv, head, slot, d));
                            /* contiguous tile: (slot, d) follow each other without gaps */
                            assert_ptr_equal(p, tile + ((size_t)slot * g.head_dim + d) * esize);
                            assert_int_equal(hits[off / esize], 0);
                            hits[off / esize] = 1;
                        }
                    }
                }
            }
        }
    }
    for (size_t i = 0; i < bytes / esize; i++)
        assert_int_equal(hits[i], 1);
    free(hits);
    free(base);
}

static void test_layer_view_matches_layout_f32(void **state)
{
    check_view_covers_layout(DTYPE_F32);
}

static void test_layer_view_matches_layout_bf16(void **state)
{
    check_view_covers_layout(DTYPE_BF16);
}

/* The sizes in the header's worked example: a 16 x 128 bf16 tile is 4 KiB. */
static void test_tile_and_layer_bytes(void **state)
{
    struct kv_geometry g = {.num_layers = 2,
                            .num_blocks = 10,
                            .block_size = 16,
                            .num_kv_heads = 8,
                            .head_dim = 128,
                            .dtype = DTYPE_BF16};
    assert_int_equal(kv_tile_elems(&g) * (int64_t)dtype_size(g.dtype), 4096);
    assert_int_equal(kv_layer_bytes(&g), (size_t)10 * 2 * 8 * 4096);
    assert_int_equal(kv_pool_bytes(&g), (size_t)2 * 10 * 2 * 8 * 4096);
}

/* Two geometries are equal only when every field, pool id included, is. */
static void test_equal_compares_every_field(void **state)
{
    struct kv_geometry a = small_geometry(DTYPE_F32);
    struct kv_geometry b = a;
    assert_true(kv_geometry_equal(&a, &b));
    b = a, b.pool_id++;
    assert_false(kv_geometry_equal(&a, &b));
    b = a, b.num_layers++;
    assert_false(kv_geometry_equal(&a, &b));
    b = a, b.num_blocks++;
    assert_false(kv_geometry_equal(&a, &b));
    b = a, b.block_size++;
    assert_false(kv_geometry_equal(&a, &b));
    b = a, b.num_kv_heads++;
    assert_false(kv_geometry_equal(&a, &b));
    b = a, b.head_dim++;
    assert_false(kv_geometry_equal(&a, &b));
    b = a, b.dtype = DTYPE_BF16;
    assert_false(kv_geometry_equal(&a, &b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_validate_accepts_valid),
        cmocka_unit_test(test_validate_names_the_bad_field),
        cmocka_unit_test(test_validate_bounds_total_bytes),
        cmocka_unit_test(test_layer_view_matches_layout_f32),
        cmocka_unit_test(test_layer_view_matches_layout_bf16),
        cmocka_unit_test(test_tile_and_layer_bytes),
        cmocka_unit_test(test_equal_compares_every_field),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
