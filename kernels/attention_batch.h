/* Validation shared by the CPU and CUDA attention plans: the limits a plan is made with and
 * one step's batch metadata (struct attention_batch, kernels/cpu/attention.h) checked against
 * them. Both plans call these, so that they refuse the same configurations and batches with
 * the same errors and the same details. Pure host code: no allocation, no I/O. */
#ifndef PAGODA_KERNELS_ATTENTION_BATCH_H
#define PAGODA_KERNELS_ATTENTION_BATCH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/cpu/attention.h"

/* The part of a plan's configuration that bounds a step's batch. */
struct attention_limits {
    int32_t block_size; /* the pool's, KV_BLOCK_SIZE_MIN .. KV_BLOCK_SIZE_MAX */
    int32_t num_blocks; /* the pool's, including the reserved block 0 */
    int32_t max_num_seqs;
    int32_t max_num_tokens;
    int32_t max_blocks_per_seq; /* bounds the context: max_blocks_per_seq * block_size tokens */
};

/* Checks the limits: block_size within KV_BLOCK_SIZE_MIN..MAX, at least 2 blocks, positive
 * batch limits, a longest context (max_blocks_per_seq * block_size) that fits int32, and
 * max_num_seqs below INT32_MAX. Returns 0 or PAGODA_ERANGE with a detail naming the field
 * (PAGODA_EINVAL when l is NULL). */
int attention_limits_check(const struct attention_limits *l);

/* Checks one step's batch against limits l (already checked) before a plan copies anything.
 * On success *max_context_len is the longest context_len of the batch (0 without sequences).
 * Returns 0, PAGODA_EINVAL (NULL arrays, query_start not starting at 0, decreasing or not
 * ending at num_tokens, a sequence without query tokens, context_len < query_len, a
 * non-positive max_blocks_per_seq) or PAGODA_ERANGE (num_seqs or num_tokens above the limits,
 * a block table row shorter than the context needs, a block id that is 0 or >= num_blocks),
 * each with a detail naming the sequence and field. */
int attention_batch_check(const struct attention_limits *l, const struct attention_batch *b,
                          int32_t *max_context_len);

#ifdef __cplusplus
}
#endif

#endif
