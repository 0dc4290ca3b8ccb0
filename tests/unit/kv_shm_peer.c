/* The second process of test_kv_shm: maps (or creates) a pool by name, as a worker would, and
 * reads or writes it through layer views. Elements hold f32 codes derived from their position
 * in the layout [layer][block][K|V][kv_head][slot][head_dim], computed here independently of
 * kv_layer_view_make, so a view that writes to the wrong place is caught from either side.
 *
 *   kv_shm_peer NAME check-and-write POOL_ID LAYERS BLOCKS BLOCK_SIZE HEADS HEAD_DIM
 *       opens NAME expecting that f32 geometry, checks that every element holds +code (read
 *       both through the view and at the layout's offset), then writes -code through the view.
 *   kv_shm_peer NAME create POOL_ID LAYERS BLOCKS BLOCK_SIZE HEADS HEAD_DIM
 *       creates NAME, writes -code through the view, and exits without unlinking.
 *
 * Exit status: 0 on success, 1 for bad arguments, 2 when open or create fails, 3 when an
 * element differs. */
#include "common/error.h"
#include "common/parse.h"
#include "kvpool/shm_pool.h"

#include <stdio.h>
#include <string.h>

static size_t layout_index(const struct kv_geometry *g, int layer, int block, int kv, int head,
                           int slot, int d)
{
    size_t i = (size_t)layer;
    i = i * (size_t)g->num_blocks + (size_t)block;
    i = i * 2 + (size_t)kv;
    i = i * (size_t)g->num_kv_heads + (size_t)head;
    i = i * (size_t)g->block_size + (size_t)slot;
    return i * (size_t)g->head_dim + (size_t)d;
}

/* Visits every element: checks it holds `expect` times its code (unless expect is 0) and then
 * stores `store` times its code (unless store is 0). Returns 0 or 3 at the first difference. */
static int walk(struct kv_shm_pool *pool, float expect, float store)
{
    const struct kv_geometry *g = kv_shm_pool_geometry(pool);
    float *data = kv_shm_pool_data(pool);
    for (int layer = 0; layer < g->num_layers; layer++) {
        struct kv_layer_view v;
        if (kv_shm_pool_layer_view(pool, layer, &v) != 0)
            return 3;
        for (int block = 0; block < g->num_blocks; block++)
            for (int kv = 0; kv < 2; kv++)
                for (int head = 0; head < g->num_kv_heads; head++)
                    for (int slot = 0; slot < g->block_size; slot++)
                        for (int d = 0; d < g->head_dim; d++) {
                            size_t i = layout_index(g, layer, block, kv, head, slot, d);
                            float code = (float)(i + 1);
                            float *p = (float *)(kv ? v.v : v.k) + block * v.block_stride +
                                       head * v.head_stride + slot * v.slot_stride + d;
                            if (expect != 0 && (*p != expect * code || data[i] != *p)) {
                                fprintf(stderr,
                                        "kv_shm_peer: element %zu: view %g, layout %g, "
                                        "expected %g\n",
                                        i, (double)*p, (double)data[i], (double)(expect * code));
                                return 3;
                            }
                            if (store != 0)
                                *p = store * code;
                        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: kv_shm_peer NAME check-and-write|create POOL_ID LAYERS BLOCKS "
                        "BLOCK_SIZE HEADS HEAD_DIM\n");
        return 1;
    }
    int64_t f[6];
    for (int i = 0; i < 6; i++) {
        int64_t max = i == 0 ? INT64_MAX : INT32_MAX;
        if (parse_i64(argv[3 + i], argv[3 + i], 0, max, &f[i]) != 0) {
            fprintf(stderr, "kv_shm_peer: %s\n", pagoda_error_detail());
            return 1;
        }
    }
    struct kv_geometry g = {.pool_id = (uint64_t)f[0],
                            .num_layers = (int32_t)f[1],
                            .num_blocks = (int32_t)f[2],
                            .block_size = (int32_t)f[3],
                            .num_kv_heads = (int32_t)f[4],
                            .head_dim = (int32_t)f[5],
                            .dtype = DTYPE_F32};
    struct kv_shm_pool *pool;
    int create = strcmp(argv[2], "create") == 0;
    if (!create && strcmp(argv[2], "check-and-write") != 0) {
        fprintf(stderr, "kv_shm_peer: unknown mode %s\n", argv[2]);
        return 1;
    }
    int rc = create ? kv_shm_pool_create(argv[1], &g, &pool) : kv_shm_pool_open(argv[1], &g, &pool);
    if (rc != 0) {
        char buf[600];
        fprintf(stderr, "kv_shm_peer: %s\n", pagoda_error_message(rc, buf, sizeof(buf)));
        return 2;
    }
    int status = create ? walk(pool, 0, -1) : walk(pool, 1, -1);
    kv_shm_pool_close(pool);
    return status;
}
