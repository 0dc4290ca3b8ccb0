#include "kvpool/geometry.h"
#include "common/error.h"

/* The pool's byte size must fit in an off_t, a size_t and a CUDA allocation size with room to
 * spare: 2^62 leaves headroom for a segment header and for alignment. */
#define KV_POOL_BYTES_LIMIT (UINT64_C(1) << 62)

static int dtype_known(enum dtype t)
{
    return t == DTYPE_BF16 || t == DTYPE_F16 || t == DTYPE_F32 || t == DTYPE_F8E4M3;
}

/* Multiplies *acc by factor (both positive) and reports whether the product stays below
 * KV_POOL_BYTES_LIMIT; checked before multiplying so that nothing overflows. */
static int mul_below_limit(uint64_t *acc, uint64_t factor)
{
    if (*acc > (KV_POOL_BYTES_LIMIT - 1) / factor)
        return 0;
    *acc *= factor;
    return 1;
}

/* Every field is checked before the size, so that the product below only sees positive
 * values; the first bad field is the one named in the detail. */
int kv_geometry_validate(const struct kv_geometry *g)
{
    if (g == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "kv geometry: NULL");
    if (g->num_layers < 1)
        return pagoda_error_set(PAGODA_ERANGE, "kv geometry: num_layers %d, must be at least 1",
                                g->num_layers);
    if (g->num_blocks < 2)
        return pagoda_error_set(PAGODA_ERANGE,
                                "kv geometry: num_blocks %d, must be at least 2 (block 0 is "
                                "reserved as padding)",
                                g->num_blocks);
    if (g->block_size < KV_BLOCK_SIZE_MIN || g->block_size > KV_BLOCK_SIZE_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "kv geometry: block_size %d, must be %d to %d",
                                g->block_size, KV_BLOCK_SIZE_MIN, KV_BLOCK_SIZE_MAX);
    if (g->num_kv_heads < 1)
        return pagoda_error_set(PAGODA_ERANGE, "kv geometry: num_kv_heads %d, must be at least 1",
                                g->num_kv_heads);
    if (g->head_dim < 1 || g->head_dim > KV_HEAD_DIM_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "kv geometry: head_dim %d, must be 1 to %d",
                                g->head_dim, KV_HEAD_DIM_MAX);
    if (!dtype_known(g->dtype))
        return pagoda_error_set(PAGODA_ERANGE, "kv geometry: dtype %d is not a known dtype",
                                (int)g->dtype);

    uint64_t bytes = dtype_size(g->dtype);
    if (!mul_below_limit(&bytes, (uint64_t)g->head_dim) ||
        !mul_below_limit(&bytes, (uint64_t)g->block_size) ||
        !mul_below_limit(&bytes, (uint64_t)g->num_kv_heads) || !mul_below_limit(&bytes, 2) ||
        !mul_below_limit(&bytes, (uint64_t)g->num_blocks) ||
        !mul_below_limit(&bytes, (uint64_t)g->num_layers))
        return pagoda_error_set(PAGODA_ERANGE,
                                "kv geometry: total bytes of %d layers x %d blocks x 2 x %d "
                                "heads x %d slots x %d x %zu bytes reach 2^62",
                                g->num_layers, g->num_blocks, g->num_kv_heads, g->block_size,
                                g->head_dim, dtype_size(g->dtype));
    return 0;
}

/* Offsets follow [layer][block][K|V][kv_head][slot][head_dim]: within a layer, K of block b
 * starts at element b * 2 * num_kv_heads * tile and V right after the block's K heads. */
struct kv_layer_view kv_layer_view_make(const struct kv_geometry *g, void *base, int32_t layer)
{
    struct kv_layer_view v = {0};
    int64_t tile = kv_tile_elems(g);
    char *layer_base = (char *)base + (size_t)layer * kv_layer_bytes(g);
    v.head_stride = tile;
    v.block_stride = 2 * (int64_t)g->num_kv_heads * tile;
    v.slot_stride = g->head_dim;
    v.k = layer_base;
    v.v = layer_base + (size_t)g->num_kv_heads * (size_t)tile * dtype_size(g->dtype);
    v.block_size = g->block_size;
    v.num_kv_heads = g->num_kv_heads;
    v.head_dim = g->head_dim;
    v.num_blocks = g->num_blocks;
    v.dtype = g->dtype;
    return v;
}

int kv_geometry_equal(const struct kv_geometry *a, const struct kv_geometry *b)
{
    return a->pool_id == b->pool_id && a->num_layers == b->num_layers &&
           a->num_blocks == b->num_blocks && a->block_size == b->block_size &&
           a->num_kv_heads == b->num_kv_heads && a->head_dim == b->head_dim && a->dtype == b->dtype;
}
