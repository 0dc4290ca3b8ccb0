/* Validation shared by the CPU and CUDA attention plans. Moved here from the CPU plan so that
 * the GPU plan refuses exactly what the CPU plan refuses, with the same details. */
#include "kernels/attention_batch.h"

#include "common/error.h"

#include <stddef.h>

int attention_limits_check(const struct attention_limits *l)
{
    if (l == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention: NULL limits");
    if (l->block_size < KV_BLOCK_SIZE_MIN || l->block_size > KV_BLOCK_SIZE_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "attention: block_size %d outside %d..%d",
                                (int)l->block_size, KV_BLOCK_SIZE_MIN, KV_BLOCK_SIZE_MAX);
    if (l->num_blocks < 2)
        return pagoda_error_set(PAGODA_ERANGE, "attention: num_blocks %d, at least 2 needed",
                                (int)l->num_blocks);
    if (l->max_num_seqs <= 0 || l->max_num_tokens <= 0 || l->max_blocks_per_seq <= 0)
        return pagoda_error_set(PAGODA_ERANGE,
                                "attention: limits must be positive (max_num_seqs %d, "
                                "max_num_tokens %d, max_blocks_per_seq %d)",
                                (int)l->max_num_seqs, (int)l->max_num_tokens,
                                (int)l->max_blocks_per_seq);
    /* Context lengths are int32: the longest context a block table can hold must be one. */
    if ((int64_t)l->max_blocks_per_seq * l->block_size > INT32_MAX)
        return pagoda_error_set(PAGODA_ERANGE,
                                "attention: max_blocks_per_seq %d * block_size %d exceeds int32",
                                (int)l->max_blocks_per_seq, (int)l->block_size);
    if (l->max_num_seqs == INT32_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "attention: max_num_seqs too large");
    return 0;
}

int attention_batch_check(const struct attention_limits *l, const struct attention_batch *b,
                          int32_t *max_context_len)
{
    if (l == NULL || b == NULL || max_context_len == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_plan: NULL argument");
    if (b->num_seqs < 0 || b->num_seqs > l->max_num_seqs)
        return pagoda_error_set(PAGODA_ERANGE, "attention_plan: num_seqs %d outside 0..%d",
                                (int)b->num_seqs, (int)l->max_num_seqs);
    if (b->num_tokens < 0 || b->num_tokens > l->max_num_tokens)
        return pagoda_error_set(PAGODA_ERANGE, "attention_plan: num_tokens %d outside 0..%d",
                                (int)b->num_tokens, (int)l->max_num_tokens);
    if (b->query_start == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_plan: query_start is NULL");
    if (b->query_start[0] != 0 || b->query_start[b->num_seqs] != b->num_tokens)
        return pagoda_error_set(
            PAGODA_EINVAL, "attention_plan: query_start runs %d..%d, not 0..num_tokens %d",
            (int)b->query_start[0], (int)b->query_start[b->num_seqs], (int)b->num_tokens);
    if (b->num_seqs > 0 && (b->context_len == NULL || b->block_tables == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "attention_plan: context_len or block_tables "
                                               "is NULL");
    if (b->num_seqs > 0 && b->max_blocks_per_seq <= 0)
        return pagoda_error_set(PAGODA_EINVAL, "attention_plan: max_blocks_per_seq %d",
                                (int)b->max_blocks_per_seq);

    *max_context_len = 0;
    for (int32_t s = 0; s < b->num_seqs; s++) {
        int32_t query_len = b->query_start[s + 1] - b->query_start[s];
        int32_t context_len = b->context_len[s];
        if (b->query_start[s + 1] <= b->query_start[s] || b->query_start[s + 1] > b->num_tokens)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "attention_plan: sequence %d has query tokens %d..%d (every "
                                    "sequence needs at least one, within num_tokens %d)",
                                    (int)s, (int)b->query_start[s], (int)b->query_start[s + 1] - 1,
                                    (int)b->num_tokens);
        if (context_len < query_len)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "attention_plan: sequence %d has context_len %d < query_len "
                                    "%d",
                                    (int)s, (int)context_len, (int)query_len);
        int64_t blocks_needed = ((int64_t)context_len + l->block_size - 1) / l->block_size;
        if (blocks_needed > b->max_blocks_per_seq || blocks_needed > l->max_blocks_per_seq)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "attention_plan: sequence %d needs %lld blocks for "
                                    "context_len %d; its table has %d (plan limit %d)",
                                    (int)s, (long long)blocks_needed, (int)context_len,
                                    (int)b->max_blocks_per_seq, (int)l->max_blocks_per_seq);
        const int32_t *row = b->block_tables + (size_t)s * (size_t)b->max_blocks_per_seq;
        for (int64_t i = 0; i < blocks_needed; i++)
            if (row[i] <= 0 || row[i] >= l->num_blocks)
                return pagoda_error_set(PAGODA_ERANGE,
                                        "attention_plan: sequence %d, table entry %lld: block %d "
                                        "outside 1..%d",
                                        (int)s, (long long)i, (int)row[i], (int)l->num_blocks - 1);
        if (context_len > *max_context_len)
            *max_context_len = context_len;
    }
    return 0;
}
