/* The bytes a decode step must move, from a model's shape: the denominator-free half of the
 * bandwidth floor that pagoda-bench reports (report.h divides by the measured bandwidth). */
#ifndef PAGODA_BENCH_FLOOR_H
#define PAGODA_BENCH_FLOOR_H

#include "model/model_config.h"

/* Bytes of weights one decode step reads once, stored dtype_bytes per parameter: every layer's
 * projections (q, k, v, o, gate, up, down, with their biases) and norms, the final norm and the
 * output layer (lm_head, or the embeddings when tied). The embedding table is not counted when
 * untied: a step reads only the rows of its tokens. */
double floor_weight_bytes(const struct model_config *cfg, int dtype_bytes);

/* Bytes of K and V that one token holds across all layers, dtype_bytes per element:
 * layers x 2 x kv_heads x head_dim x dtype_bytes. A decode step at context c reads c times
 * this for its sequence. */
double floor_kv_bytes_per_token(const struct model_config *cfg, int dtype_bytes);

/* Matrix FLOPs of one prompt token through the layers: 2 per parameter that floor_weight_bytes
 * counts, less the output layer (norms and biases included: a rounding error). The output layer
 * runs for the tokens whose logits are needed only: floor_lm_head_flops each. */
double floor_flops_per_token(const struct model_config *cfg);

/* Matrix FLOPs of one token's logits: 2 x vocab x hidden. */
double floor_lm_head_flops(const struct model_config *cfg);

/* Attention FLOPs per (query token, key) pair: q.k and the weighted sum of v, 2 x head_dim
 * each, for every query head of every layer: 4 x layers x heads x head_dim. */
double floor_attention_flops_per_key(const struct model_config *cfg);

#endif
