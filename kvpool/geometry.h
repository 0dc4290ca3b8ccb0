/* The KV pool's geometry and layout: the one definition every process and kernel uses.
 *
 * Layout: [layer][block][K|V][kv_head][slot][head_dim]. One (layer, block, K or V, head) tile
 * of block_size x head_dim elements is contiguous (16 x 128 x 2 bytes = 4 KiB in bf16). Block 0
 * is reserved as padding and is never handed to a sequence. Kernels receive a kv_layer_view
 * (base pointers and strides) and never recompute the formula, so a benchmark can move to
 * another layout by changing this file alone. */
#ifndef PAGODA_KVPOOL_GEOMETRY_H
#define PAGODA_KVPOOL_GEOMETRY_H

#include "common/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define KV_BLOCK_SIZE_MIN 8
#define KV_BLOCK_SIZE_MAX 64
#define KV_BLOCK_SIZE_DEFAULT 16
#define KV_HEAD_DIM_MAX 1024

struct kv_geometry {
    uint64_t pool_id;
    int32_t num_layers;
    int32_t num_blocks; /* including the reserved block 0 */
    int32_t block_size; /* tokens per block, 8 to 64 */
    int32_t num_kv_heads;
    int32_t head_dim;
    enum dtype dtype; /* bf16 on the GPU, f32 on the CPU */
};

/* Where one layer's K and V live. Strides are in elements. The K vector of (block, head, slot)
 * starts at k + block * block_stride + head * head_stride + slot * slot_stride; V likewise from
 * v. */
struct kv_layer_view {
    void *k;
    void *v;
    int64_t block_stride;
    int64_t head_stride;
    int64_t slot_stride;
    int32_t block_size;
    int32_t num_kv_heads;
    int32_t head_dim;
    int32_t num_blocks;
    enum dtype dtype;
};

/* Checks the geometry's ranges (block size 8..64, at least 2 blocks, positive sizes, head_dim
 * at most KV_HEAD_DIM_MAX, a known dtype, total size below 2^62 bytes). Returns 0 or
 * PAGODA_ERANGE with a detail naming the field (PAGODA_EINVAL when g is NULL). */
int kv_geometry_validate(const struct kv_geometry *g);

/* Elements in one (layer, block, K or V, head) tile: block_size * head_dim. */
static inline int64_t kv_tile_elems(const struct kv_geometry *g)
{
    return (int64_t)g->block_size * g->head_dim;
}

/* Bytes of one layer: num_blocks * 2 * num_kv_heads * tile. */
static inline size_t kv_layer_bytes(const struct kv_geometry *g)
{
    return (size_t)g->num_blocks * 2 * (size_t)g->num_kv_heads * (size_t)kv_tile_elems(g) *
           dtype_size(g->dtype);
}

/* Bytes of the whole pool's KV data (all layers). */
static inline size_t kv_pool_bytes(const struct kv_geometry *g)
{
    return (size_t)g->num_layers * kv_layer_bytes(g);
}

/* The view of one layer of a pool whose KV data starts at base. */
struct kv_layer_view kv_layer_view_make(const struct kv_geometry *g, void *base, int32_t layer);

/* True when two geometries describe the same pool layout (pool id included). */
int kv_geometry_equal(const struct kv_geometry *a, const struct kv_geometry *b);

#endif
