#include "model/model_budget.h"

/* Mirrors cuda_be_load_weights in worker/cuda_backend_load.c: embeddings (and an untied LM head),
 * the final norm, and per layer two norms, QKV, O, gate/up and down, with the optional biases; for
 * a shard, its slices of each (model_shard.h). */
uint64_t model_budget_shard_weight_bytes(const struct model_config *c, const struct model_shard *s)
{
    uint64_t H = (uint64_t)c->hidden_size, I = (uint64_t)s->intermediate_size;
    uint64_t V = (uint64_t)(s->vocab_end - s->vocab_begin);
    uint64_t qd = (uint64_t)(s->num_heads * c->head_dim);
    uint64_t kvd = (uint64_t)(s->num_kv_heads * c->head_dim);
    uint64_t per_layer = 2 * H + (qd + 2 * kvd) * H + H * qd + 3 * I * H;
    if (c->qkv_bias)
        per_layer += qd + 2 * kvd;
    if (c->o_bias)
        per_layer += H;
    uint64_t total =
        V * H * (c->tie_word_embeddings ? 1 : 2) + H + per_layer * (uint64_t)c->num_layers;
    return total * 2;
}

/* Mirrors cuda_sampler_new in kernels/cuda/sampler.cu: penalised logits and marks (4 bytes
 * each per token and row), the greedy path's partials (24 bytes per chunk of 4096 tokens and
 * row) and counters (4 per row), the stage (a 80-byte descriptor, 12 bytes of lists and
 * max_history tokens per row), the results (24 per row) and the history slots (max_history
 * tokens per row). */
uint64_t model_budget_sampler_bytes(int64_t vocab, int64_t max_seqs, int64_t max_history)
{
    uint64_t V = (uint64_t)vocab, S = (uint64_t)max_seqs, Hs = (uint64_t)max_history;
    return S * (V * 8 + (V + 4095) / 4096 * 24 + 4 + 80 + 12 + Hs * 4 + 24 + Hs * 4);
}

uint64_t model_budget_logit_entry_bytes(int64_t max_seqs)
{
    return (uint64_t)max_seqs * MODEL_BUDGET_LOGIT_ENTRIES_PER_ROW * MODEL_BUDGET_LOGIT_ENTRY_BYTES;
}

/* Mirrors cuda_be_alloc_activations in worker/cuda_backend_load.c (and the gathered logits of
 * worker/cuda_tp.c, which the backend allocates for an NCCL group, and the step's logit entries,
 * model_budget_logit_entry_bytes), and the sampler the backend opens
 * (model_budget_sampler_bytes: its rows max_seqs, its history the model's positions). */
uint64_t model_budget_shard_activation_bytes(const struct model_config *c,
                                             const struct model_shard *s,
                                             enum model_budget_comm comm, int64_t max_tokens,
                                             int64_t max_seqs)
{
    uint64_t T = (uint64_t)max_tokens, S = (uint64_t)max_seqs;
    uint64_t H = (uint64_t)c->hidden_size, I = (uint64_t)s->intermediate_size;
    uint64_t qd = (uint64_t)(s->num_heads * c->head_dim);
    uint64_t kvd = (uint64_t)(s->num_kv_heads * c->head_dim);
    uint64_t per_rank = S * (uint64_t)s->vocab_per_rank * 4;
    uint64_t tp = 0;
    if (comm != MODEL_BUDGET_COMM_NONE)
        tp = T * H * 4 + per_rank; /* partial, local_logits */
    if (comm == MODEL_BUDGET_COMM_NCCL)
        tp += per_rank * (uint64_t)s->size; /* the all-gather's receive buffer */
    /* residual [T][H] f32 and residual_alt [H] f32, then the bf16 activations */
    return T * H * 4 + H * 4 + T * (H + qd + 2 * kvd + qd + H + 2 * I + I) * 2 + S * H * 2 +
           S * (uint64_t)c->vocab_size * 4 + tp + T * (4 + 4 + 8) + S * 4 +
           MODEL_BUDGET_STEP_SLOTS * S * 4 + T * 8 + /* the slots' sampled tokens, the gathers */
           model_budget_logit_entry_bytes(max_seqs) +
           model_budget_sampler_bytes(c->vocab_size, max_seqs, c->max_position_embeddings);
}

int32_t model_budget_graph_batches(int64_t max_tokens, int64_t max_seqs, int32_t *sizes)
{
    int64_t cap = max_tokens < max_seqs ? max_tokens : max_seqs;
    if (cap > MODEL_BUDGET_GRAPH_BATCH_MAX)
        cap = MODEL_BUDGET_GRAPH_BATCH_MAX;
    int32_t n = 0;
    for (int64_t b = 1; b <= cap; b = b < 8 ? 2 * b : b + 8) {
        if (sizes != NULL)
            sizes[n] = (int32_t)b;
        n++;
    }
    if (cap >= 1 && (cap < 8 ? (cap & (cap - 1)) != 0 : cap % 8 != 0)) {
        if (sizes != NULL)
            sizes[n] = (int32_t)cap;
        n++;
    }
    return n;
}

uint64_t model_budget_graph_bytes(int64_t max_tokens, int64_t max_seqs)
{
    int32_t n = model_budget_graph_batches(max_tokens, max_seqs, NULL);
    return (uint64_t)n * MODEL_BUDGET_GRAPH_BYTES + MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES;
}

uint64_t model_budget_shard_worker_bytes(const struct model_config *c, const struct model_shard *s,
                                         enum model_budget_comm comm, int64_t max_tokens,
                                         int64_t max_seqs)
{
    return model_budget_shard_weight_bytes(c, s) +
           model_budget_shard_activation_bytes(c, s, comm, max_tokens, max_seqs) +
           model_budget_graph_bytes(max_tokens, max_seqs) + MODEL_BUDGET_RESERVE_BYTES;
}

uint64_t model_budget_weight_bytes(const struct model_config *c)
{
    struct model_shard s = model_shard_whole(c);
    return model_budget_shard_weight_bytes(c, &s);
}

uint64_t model_budget_activation_bytes(const struct model_config *c, int64_t max_tokens,
                                       int64_t max_seqs)
{
    struct model_shard s = model_shard_whole(c);
    return model_budget_shard_activation_bytes(c, &s, MODEL_BUDGET_COMM_NONE, max_tokens, max_seqs);
}

uint64_t model_budget_worker_bytes(const struct model_config *c, int64_t max_tokens,
                                   int64_t max_seqs)
{
    struct model_shard s = model_shard_whole(c);
    return model_budget_shard_worker_bytes(c, &s, MODEL_BUDGET_COMM_NONE, max_tokens, max_seqs);
}
