/* What the CUDA backend needs on the GPU beside the KV pool, computed from a model's config
 * alone (no CUDA): the one formula that the backend checks before it allocates, that a worker
 * checks against the memory left beside the pool, and that pagoda-kvpool subtracts when it
 * sizes a GPU pool by default. Plain C, built with or without CUDA. */
#ifndef PAGODA_MODEL_MODEL_BUDGET_H
#define PAGODA_MODEL_MODEL_BUDGET_H

#include "model/model_config.h"
#include "model/model_shard.h"

#include <stdint.h>

/* Kept free beside the weights and activations (the sampler's among them) for cuBLAS
 * workspaces, the attention plan and the CUDA context's own needs. */
#define MODEL_BUDGET_RESERVE_BYTES (UINT64_C(512) << 20)

/* A worker's CUDA context, created after kvpool measured the free memory: pagoda-kvpool leaves
 * this much more when it sizes the pool by default. */
#define MODEL_BUDGET_CONTEXT_BYTES (UINT64_C(1) << 30)

/* The worker's default step limits (pagoda-worker --max-batched-tokens, --max-seqs), which a
 * default pool size assumes. */
#define MODEL_BUDGET_DEFAULT_MAX_TOKENS 2048
#define MODEL_BUDGET_DEFAULT_MAX_SEQS 256

/* CUDA graphs of decode steps (worker/cuda_backend.h): one per batch size of
 * model_budget_graph_batches, captured when the backend opens. Each is counted at
 * MODEL_BUDGET_GRAPH_BYTES, twice the most one graph took on the H200 with the Llama-3-8B shape
 * (cudaMemGetInfo before and after each capture, which the backend logs: 35 graphs took 42 MiB,
 * the largest 4 MiB, counted in the 2 MiB pages of the allocator; bench/RESULTS.md, 2026-12-02,
 * CUDA graphs), and the cuBLAS handle gets a workspace of its own of
 * MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES, so that a capture allocates nothing (eager steps use the
 * same workspace, hence the same algorithms). */
#define MODEL_BUDGET_GRAPH_BATCH_MAX 256
#define MODEL_BUDGET_GRAPHS_MAX 40
#define MODEL_BUDGET_GRAPH_BYTES (UINT64_C(8) << 20)
#define MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES (UINT64_C(32) << 20)

/* The batch sizes a decode step's graph is captured for, as vLLM's capture sizes: 1, 2, 4, 8,
 * then the multiples of 8, up to the largest decode step, min(max_tokens, max_seqs,
 * MODEL_BUDGET_GRAPH_BATCH_MAX), which is itself the last size when it is no multiple of 8 (so
 * that every decode step up to it has a graph). Writes them in ascending order to sizes (when not
 * NULL; MODEL_BUDGET_GRAPHS_MAX entries) and returns their count (0 for a limit below 1). */
int32_t model_budget_graph_batches(int64_t max_tokens, int64_t max_seqs, int32_t *sizes);

/* The graphs' bytes: MODEL_BUDGET_GRAPH_BYTES per batch size, and the cuBLAS workspace. */
uint64_t model_budget_graph_bytes(int64_t max_tokens, int64_t max_seqs);

/* Bytes of the model's weights on the GPU (BF16, whatever the checkpoint's dtype). */
uint64_t model_budget_weight_bytes(const struct model_config *c);

/* Device bytes of a CUDA sampler (kernels/cuda/sampler.h) for max_seqs rows of vocab tokens
 * and histories of up to max_history tokens: with 128256 tokens, 256 rows and 8192 positions,
 * about 279 MB, more than half of MODEL_BUDGET_RESERVE_BYTES, so it is counted. */
uint64_t model_budget_sampler_bytes(int64_t vocab, int64_t max_seqs, int64_t max_history);

/* A step's logit entries (kernels/cpu/logit_bias.h: the rows' logit bias and min_tokens'
 * suppressed stop tokens), which the CUDA backend copies to the GPU before it adds them to the
 * logits: at most LOGIT_ENTRIES_PER_ROW a row, each a struct logit_entry of 12 bytes. model/
 * includes common/ only, so the two are repeated here; worker/cuda_backend_impl.h asserts that
 * they still match. */
#define MODEL_BUDGET_LOGIT_ENTRIES_PER_ROW 428
#define MODEL_BUDGET_LOGIT_ENTRY_BYTES 12

/* The CUDA backend's step slots (worker/backend.h's BACKEND_STEP_SLOTS, repeated here as the two
 * above; worker/cuda_backend_impl.h asserts that they match): each keeps its step's sampled tokens
 * on the device, max_seqs int32s, counted in the activations with the gathers that read them (an
 * 8-byte (slot, row) pair per token). */
#define MODEL_BUDGET_STEP_SLOTS 4

/* Device bytes of the logit entries of a step of max_seqs rows: about 1.3 MB for 256 rows. One
 * buffer serves every step slot (the steps run in the order of one stream); their staging in
 * pinned host memory (one per step slot and one for the synchronous calls) is not the GPU's. */
uint64_t model_budget_logit_entry_bytes(int64_t max_seqs);

/* Bytes of the activations of a step of up to max_tokens tokens and max_seqs sequences, the
 * sampler's, the logit entries' and the step slots' sampled tokens among them. */
uint64_t model_budget_activation_bytes(const struct model_config *c, int64_t max_tokens,
                                       int64_t max_seqs);

/* Weights, activations, the decode graphs (model_budget_graph_bytes: counted whether or not
 * the worker captures them, so that turning graphs on never needs a smaller pool) and
 * MODEL_BUDGET_RESERVE_BYTES: what a worker needs free beside the pool once its CUDA context
 * exists. */
uint64_t model_budget_worker_bytes(const struct model_config *c, int64_t max_tokens,
                                   int64_t max_seqs);

/* How a backend does its collectives, which decides the device buffers they need beside the
 * activations: none (no group), a group staged through host memory (the cpu comm: the staging
 * is pinned host memory, not the GPU's), or NCCL (the gathered logits on the device). */
enum model_budget_comm {
    MODEL_BUDGET_COMM_NONE = 0,
    MODEL_BUDGET_COMM_HOST,
    MODEL_BUDGET_COMM_NCCL,
};

/* The same three for one rank of a tensor-parallel group (model_shard.h): the rank's slices of
 * the weights (whole norms and O bias, its vocabulary rows of the embedding and LM head), the
 * activations of its heads and MLP columns plus the gathered logits, and, with a group (comm not
 * MODEL_BUDGET_COMM_NONE, whatever its size), the f32 output of a row-parallel projection
 * ([max_tokens][hidden]) and the rank's own logits ([max_seqs][vocab_per_rank]), and with NCCL
 * the all-gather's receive buffer ([size][max_seqs][vocab_per_rank] f32). The shard of
 * model_shard_whole without a group gives exactly the functions above. */
uint64_t model_budget_shard_weight_bytes(const struct model_config *c, const struct model_shard *s);
uint64_t model_budget_shard_activation_bytes(const struct model_config *c,
                                             const struct model_shard *s,
                                             enum model_budget_comm comm, int64_t max_tokens,
                                             int64_t max_seqs);
uint64_t model_budget_shard_worker_bytes(const struct model_config *c, const struct model_shard *s,
                                         enum model_budget_comm comm, int64_t max_tokens,
                                         int64_t max_seqs);

#endif
