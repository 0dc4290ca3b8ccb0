/* Megatron-style tensor-parallel sharding of a model: which part of each weight rank r of a
 * group of size t holds. Plain arithmetic on the config; model_weights_open_shard binds the
 * slices, model_budget counts them.
 *
 * - Column-parallel (split along the output rows of the [out, in] weight): Q, K, V (each rank
 *   a contiguous run of heads: num_heads / t query heads and num_kv_heads / t KV heads, so a
 *   rank's query heads use only its own KV heads), their biases, gate and up (intermediate / t
 *   rows each).
 * - Row-parallel (split along the input columns): O (the rank's heads' columns) and down (its
 *   intermediate columns). Their outputs are partial sums, added by an all-reduce; O's bias is
 *   whole on every rank and added once, after the all-reduce.
 * - Vocabulary-parallel: the embedding and the LM head hold rows [vocab_begin, vocab_end), a
 *   run of ceil(vocab / t) rows (the last rank's may be shorter). The embedding's lookups are
 *   summed by an all-reduce (a rank writes zeros for tokens outside its rows); the LM head's
 *   logits are gathered, vocab_per_rank per rank.
 * - Norms are whole on every rank. */
#ifndef PAGODA_MODEL_MODEL_SHARD_H
#define PAGODA_MODEL_MODEL_SHARD_H

#include "model/model_config.h"

#include <stdint.h>

/* Largest tensor-parallel size accepted (comm.h's COMM_MAX_RANKS). */
#define MODEL_SHARD_MAX_SIZE 8

struct model_shard {
    int rank, size;
    int64_t num_heads;         /* this rank's query heads */
    int64_t num_kv_heads;      /* this rank's KV heads */
    int64_t intermediate_size; /* this rank's MLP columns */
    int64_t vocab_begin, vocab_end;
    int64_t vocab_per_rank; /* ceil(vocab / size): every rank's count in the logits' gather */
};

/* Computes rank's shard of c in a group of size ranks into *out. Errors: PAGODA_EINVAL (size
 * outside [1, MODEL_SHARD_MAX_SIZE], rank outside [0, size)); PAGODA_EUNSUPPORTED, with a
 * detail naming the field, when size does not divide the attention heads, the KV heads or the
 * intermediate size, or leaves a rank without vocabulary rows (Megatron's rule: no head is
 * split, and the KV heads are divided, not replicated). */
int model_shard_make(const struct model_config *c, int rank, int size, struct model_shard *out);

/* The shard of a single rank (size 1): the whole model. */
struct model_shard model_shard_whole(const struct model_config *c);

#endif
