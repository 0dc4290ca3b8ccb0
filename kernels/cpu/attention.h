/* Paged attention on the CPU: reshape-and-cache, a plan/run split, and mergeable partial states.
 *
 * One step's batch is flattened: num_tokens query tokens of num_seqs sequences. Sequence s owns
 * query tokens query_start[s] .. query_start[s + 1] - 1 (a prefill chunk or one decode token)
 * and has context_len[s] tokens in the pool once this step's K/V is written; its query tokens
 * are the last query_len of that context, so query token j sits at absolute position
 * context_len - query_len + j and attends (causally) to keys 0 .. that position. Logical token
 * i of a sequence lives in physical block block_table[i / block_size] at slot i % block_size.
 *
 * Lifecycle: attention_plan_new once per model (it allocates everything, sized by the limits in
 * the config), attention_plan once per step (validates the batch and copies it into the plan's
 * own arrays, whose addresses never change; no allocation), attention_run once per layer (no
 * allocation, no I/O). The pool holds f32 K/V; other dtypes are refused when the plan is made.
 *
 * Two implementations, chosen in the config:
 * - ATTN_CPU_GATHER, the teaching version: for each sequence and KV head, copy its K/V through
 *   the block table into a contiguous scratch buffer, then plain softmax attention. Its scratch
 *   grows with the context length.
 * - ATTN_CPU_PAGED, the direct version: walk the block table block by block with an online
 *   softmax (running max and sum), reading K/V in place. Its scratch depends only on the head
 *   counts, head_dim and block_size, never on the context length.
 *
 * Partial states: attention_run_partial also returns, per (token, query head), the natural
 * log-sum-exp of the scaled scores, lse = log(sum_i exp(scale * q.k_i)). Two states computed
 * over disjoint key sets of the same queries merge exactly into the state over their union
 * (attention_merge_states). A decode query (query_len 1) attends to its whole context, so a
 * context split at a block boundary is two plans: one with context_len = the split and the
 * first split / block_size table entries, one with the rest of the context and the remaining
 * entries. */
#ifndef PAGODA_KERNELS_CPU_ATTENTION_H
#define PAGODA_KERNELS_CPU_ATTENTION_H

#include "common/dtype.h"
#include "kvpool/geometry.h"

#include <stddef.h>
#include <stdint.h>

/* The largest head_dim the CPU kernels accept. */
#define ATTENTION_HEAD_DIM_MAX 1024

enum attention_impl {
    ATTN_CPU_GATHER = 0, /* gather K/V into contiguous scratch, then plain attention */
    ATTN_CPU_PAGED = 1,  /* online softmax block by block through the block table */
};

/* What stays fixed for the life of a plan: the model's attention shape, the pool's geometry
 * and the largest batch a step may bring. */
struct attention_config {
    enum attention_impl impl;
    int32_t num_heads;    /* query heads; a multiple of num_kv_heads */
    int32_t num_kv_heads; /* query head h reads KV head h / (num_heads / num_kv_heads) */
    int32_t head_dim;     /* 1 .. ATTENTION_HEAD_DIM_MAX */
    float scale;          /* multiplies q.k before the softmax, usually 1 / sqrt(head_dim) */
    int32_t block_size;   /* the pool's, KV_BLOCK_SIZE_MIN .. KV_BLOCK_SIZE_MAX */
    int32_t num_blocks;   /* the pool's, including the reserved block 0 */
    enum dtype dtype;     /* the pool's; only DTYPE_F32 on the CPU */
    int32_t max_num_seqs; /* limits on one step's batch */
    int32_t max_num_tokens;
    int32_t max_blocks_per_seq; /* bounds the context: max_blocks_per_seq * block_size tokens */
};

/* One step's batch metadata. The arrays stay the caller's; attention_plan copies them. */
struct attention_batch {
    int32_t num_seqs;
    int32_t num_tokens;
    /* num_seqs + 1 entries from 0 to num_tokens, strictly increasing: every sequence in a step
     * has at least one query token. */
    const int32_t *query_start;
    const int32_t *context_len; /* num_seqs entries, each >= that sequence's query_len */
    /* [num_seqs][max_blocks_per_seq], row-major: row s is sequence s's block table. Only the
     * first ceil(context_len[s] / block_size) entries of a row are read; each must be a block id
     * in 1 .. num_blocks - 1. The rest of the row is ignored (padding). */
    const int32_t *block_tables;
    int32_t max_blocks_per_seq; /* entries per row of block_tables */
};

struct attention_plan;

/* Allocates a plan for config: the copies of a step's metadata at their maximal sizes and the
 * chosen implementation's scratch (for ATTN_CPU_GATHER, one context of max_blocks_per_seq *
 * block_size tokens). On success *out is the caller's, to release with attention_plan_free; it
 * holds no batch until attention_plan succeeds. Returns 0, PAGODA_EINVAL (a non-positive size,
 * num_heads not a multiple of num_kv_heads, an unknown impl, a scale that is not finite),
 * PAGODA_ERANGE (block_size, num_blocks, head_dim or a limit out of range),
 * PAGODA_EUNSUPPORTED (dtype other than f32) or PAGODA_ENOMEM. */
int attention_plan_new(const struct attention_config *config, struct attention_plan **out);

/* Frees a plan; NULL is accepted. */
void attention_plan_free(struct attention_plan *plan);

/* Validates one step's batch and copies it into the plan, replacing the previous batch; no
 * allocation. On failure the plan holds no batch (attention_run refuses it) and a detail names
 * the sequence and field. Returns 0, PAGODA_EINVAL (NULL arrays, query_start not starting at 0,
 * decreasing or not ending at num_tokens, a sequence without query tokens, context_len <
 * query_len), or PAGODA_ERANGE (num_seqs or num_tokens above the plan's limits, a block table
 * row shorter than the context needs, a block id that is 0 or >= num_blocks). */
int attention_plan(struct attention_plan *plan, const struct attention_batch *batch);

/* Attention of one layer for the planned batch. q and out are [num_tokens][num_heads][head_dim]
 * f32 and must not overlap; kv is the layer's view of the pool, whose K/V for every context
 * token must already be written (attention_write_kv). Uses the plan's scratch, so one run at a
 * time per plan. Returns 0, PAGODA_EINVAL (no batch planned, NULL buffers) or PAGODA_EMISMATCH
 * (the view's dtype, block_size, num_kv_heads, head_dim or num_blocks differ from the config).
 */
int attention_run(struct attention_plan *plan, const struct kv_layer_view *kv, const float *q,
                  float *out);

/* As attention_run, and also writes lse [num_tokens][num_heads]: the natural log-sum-exp of the
 * scaled scores each output row was normalised with, so that partial states can be merged. */
int attention_run_partial(struct attention_plan *plan, const struct kv_layer_view *kv,
                          const float *q, float *out, float *lse);

/* Scratch bytes that impl needs to run the planned batch (0 when no batch is planned),
 * whichever impl the plan was made for: ATTN_CPU_GATHER's grows with the longest context,
 * ATTN_CPU_PAGED's does not. */
size_t attention_scratch_bytes(const struct attention_plan *plan, enum attention_impl impl);

/* Merges two partial states of the same num_rows rows (a row = one (token, query head)) over
 * disjoint key sets into the state over their union: out_* are [num_rows][head_dim], lse_*
 * [num_rows]. A row whose lse is -INFINITY attended to no key and counts as empty; when both
 * are empty the result is a zero row with lse -INFINITY. out may be out_a or out_b and lse may
 * be lse_a or lse_b (merging in place); no other overlap. Returns 0 or PAGODA_EINVAL (negative
 * num_rows, head_dim out of range, NULL buffers with num_rows > 0). */
int attention_merge_states(int64_t num_rows, int32_t head_dim, const float *out_a,
                           const float *lse_a, const float *out_b, const float *lse_b, float *out,
                           float *lse);

/* Reshape-and-cache: writes token t's K and V vectors (k and v are [num_tokens][num_kv_heads]
 * [head_dim] f32, the view's head counts) into the pool at slot_mapping[t] = block_id *
 * block_size + offset. A negative slot is padding and is skipped. Every slot is checked before
 * anything is written, so a refused call leaves the pool untouched. Returns 0, PAGODA_EINVAL
 * (NULL buffers or negative num_tokens), PAGODA_ERANGE (a slot in the reserved block 0 or at or
 * beyond num_blocks * block_size) or PAGODA_EUNSUPPORTED (a view that is not f32). */
int attention_write_kv(const struct kv_layer_view *kv, int32_t num_tokens,
                       const int64_t *slot_mapping, const float *k, const float *v);

#endif
