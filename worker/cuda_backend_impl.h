/* The CUDA backend's private state (struct cuda_backend), shared by cuda_backend.c (the ops table
 * and its entry points, open and close), cuda_backend_load.c (the weights, the activations and the
 * steps' allocations, the ranks' agreement), cuda_backend_forward.c (the forward pass: the linears,
 * RoPE and the attention, a step's metadata staged) and cuda_backend_graphs.c (decode steps
 * captured in CUDA graphs, and the graph a step replays). Nothing outside worker/ includes it. */
#ifndef PAGODA_WORKER_CUDA_BACKEND_IMPL_H
#define PAGODA_WORKER_CUDA_BACKEND_IMPL_H

#include "kernels/cuda/attention.h"
#include "kernels/cuda/linear_lt.h"
#include "kernels/cuda/linear_tma.h"
#include "kernels/cuda/sampler.h"
#include "model/model_budget.h"
#include "worker/cuda_backend.h"
#include "worker/cuda_tp.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

struct cuda_layer {
    uint16_t *input_norm, *post_norm;
    uint16_t *w_qkv;     /* [(heads + 2 kv_heads) * head_dim][hidden]: q, k, v stacked */
    uint16_t *b_qkv;     /* [(heads + 2 kv_heads) * head_dim] or NULL */
    uint16_t *w_o;       /* [hidden][heads * head_dim] */
    uint16_t *b_o;       /* [hidden] or NULL */
    uint16_t *w_gate_up; /* [2 * inter][hidden]: gate and up stacked */
    uint16_t *w_down;    /* [hidden][inter] */
};

/* Staging: STAGES sets of pinned step metadata (the step slots, then the synchronous calls'). */
#define STAGES (BACKEND_STEP_SLOTS + 1)
#define STAGE_SYNC BACKEND_STEP_SLOTS
/* The memory budget counts the step's logit entries on the device with its own copy of their
 * sizes (model/model_budget.h). */
_Static_assert(MODEL_BUDGET_LOGIT_ENTRIES_PER_ROW == LOGIT_ENTRIES_PER_ROW &&
                   MODEL_BUDGET_LOGIT_ENTRY_BYTES == sizeof(struct logit_entry),
               "model/model_budget.h's logit entry sizes differ from kernels/cpu/logit_bias.h's");
_Static_assert(MODEL_BUDGET_STEP_SLOTS == BACKEND_STEP_SLOTS,
               "model/model_budget.h's step slots differ from worker/backend.h's");
/* Each step slot samples into the sampler's slot of the same index. */
_Static_assert(CUDA_SAMPLER_SLOTS >= BACKEND_STEP_SLOTS,
               "the CUDA sampler has fewer slots than the backend's steps");

struct step_stage {
    int32_t *token_ids, *positions, *logits_rows, *gathers; /* gathers: [max_num_tokens][2] */
    int64_t *slots;
    /* [max_num_seqs * LOGIT_ENTRIES_PER_ROW]: the step's logit entries (cuda_forward_sample and
     * cuda_submit only: cuda_forward's logits are without them) */
    struct logit_entry *entries;
};

struct cuda_backend {
    struct backend base;
    struct cuda_backend_options opt;
    struct kv_geometry geometry;
    void *pool;
    /* The rank's part of the model (the whole model without opt.comm). A shard over a pool of
     * the whole model's KV heads uses the run starting at kv_head_offset. */
    struct model_shard shard;
    int pool_whole;
    int64_t kv_head_offset;
    struct cuda_tp tp;   /* with opt.comm: the collectives */
    int tp_broken;       /* with opt.comm: a pass failed on this rank, the group was aborted */
    int batch_refused;   /* the last cuda_be_forward_pass refused its batch, before any work */
    float *partial;      /* with opt.comm: [max_num_tokens][hidden], a row-parallel output */
    float *local_logits; /* with opt.comm: [max_num_seqs][vocab_per_rank] */
    cudaStream_t stream;
    /* Around each forward pass on the stream, one pair per step slot (backend_submit) and one for
     * the synchronous calls (STAGE_SYNC): its device time. */
    cudaEvent_t ev_start[STAGES], ev_end[STAGES];
    /* Inside that pair, for the worker's debug log (cuda_complete): after the step's metadata
     * is staged (the layers begin), and after the LM head (the sampler begins). */
    cudaEvent_t ev_layers[STAGES], ev_sample[STAGES];
    int slot_graph[STAGES]; /* whether the step in a slot replayed a graph */
    /* The slot submitted just before the step in each slot (-1: a synchronous call came between,
     * or none), and the last slot submitted: the device's idle time between two steps. */
    int slot_prev[BACKEND_STEP_SLOTS], last_slot;
    int timed; /* the synchronous pair recorded since the last synchronous pass began */
    /* The step's metadata in pinned memory, one stage per step slot and one for the
     * synchronous calls; staged[i] marks the end of the last copy from stage i. */
    struct step_stage *stage;
    cudaEvent_t staged[STAGES];
    int32_t held[BACKEND_STEP_SLOTS]; /* logits rows of the step in each slot; -1: none */
    int32_t *d_sampled;               /* [BACKEND_STEP_SLOTS][max_num_seqs]: sampled tokens */
    int32_t *d_gathers;               /* [max_num_tokens][2]: (token, slot * seqs + row) */
    cublasHandle_t cublas;
    uint16_t *embed, *lm_head, *final_norm;
    struct cuda_layer *layers;
    float *inv_freq;
    struct cuda_attention_plan *plan;
    struct cuda_sampler *sampler;
    /* Activations, sized for opt.limits. */
    float *residual;
    float *residual_alt; /* [hidden]: the residual of one row, for cuda_gemv_row_norm */
    uint16_t *hidden, *qkv, *attn, *proj, *gate_up, *act, *selected;
    float *logits; /* [max_num_seqs][vocab] */
    /* The step's token metadata on the device. */
    int32_t *d_token_ids, *d_positions, *d_logits_rows;
    int64_t *d_slots;
    /* [max_num_seqs * LOGIT_ENTRIES_PER_ROW]: the step's logit entries, added to its logits
     * after the LM head (model_budget_logit_entry_bytes). One buffer for every stage, as the
     * metadata above: a step's copy into it is queued on the one stream behind the addition of
     * the step before, so no step sees another's entries (the pinned stages are per stage: the
     * host writes one while the device may still copy from another). */
    struct logit_entry *d_logit_entries;
    /* The sampler's per-row arguments, one array per field, sized max_num_seqs. */
    struct sampling_params *row_params;
    uint64_t *row_index;
    const int32_t **row_prompt, **row_output;
    size_t *row_n_prompt, *row_n_output;
    uint64_t *row_keys; /* the rows' history keys (struct sample_row history_key) */
    struct cuda_history_gather *row_gathers; /* a step's history gathers, at most one a row */
    /* CUDA graphs of decode steps (cuda_be_capture_graphs), by batch size, ascending; a decode step
     * of n sequences replays the first of at least n, padded. */
    int32_t num_graphs;
    int32_t graph_batch[MODEL_BUDGET_GRAPHS_MAX];
    cudaGraphExec_t graph[MODEL_BUDGET_GRAPHS_MAX];
    void *cublas_workspace; /* MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES, eager and captured GEMMs */
    struct cuda_lt *lt;     /* opt.lt_max_rows: cuBLASLt plans, on cublas_workspace */
    struct cuda_tma *tma;   /* opt.tma_max_rows: linear_tma's plans */
    /* 1 while capture_one captures a decode graph (the late trigger is asked for then only),
     * and the node of the kernel just launched with the late trigger (opt.pdl_late_max_rows),
     * whose edge into the cuBLAS GEMM behind may be made programmatic; NULL when there is none. */
    int capturing;
    cudaGraphNode_t late_node;
    /* Every device allocation, for cuda_close. */
    void **allocs;
    size_t num_allocs, cap_allocs;
};

/* ---- cuda_backend.c ---- */

/* PAGODA_ECUDA with "what: CUDA's message for e" as the detail; returns the code. */
int cuda_be_fail(cudaError_t e, const char *what);
/* PAGODA_ECUDA with "what: cuBLAS status st" as the detail; returns the code. */
int cuda_be_cublas_fail(cublasStatus_t st, const char *what);
/* Device memory of bytes into *out, freed by cuda_close. Errors: PAGODA_ENOMEM, PAGODA_ECUDA. */
int cuda_be_alloc(struct cuda_backend *b, size_t bytes, void **out);
/* Makes the calling thread run b's work (its device, its launch setting); CUDA's error. */
cudaError_t cuda_be_bind_thread(const struct cuda_backend *b);

/* ---- cuda_backend_load.c, for open_backend ---- */

/* The weights of w (NULL: random from seed) on the device, in b->embed .. b->layers. */
int cuda_be_load_weights(struct cuda_backend *b, const struct model_weights *w, uint64_t seed);
/* The activations, sized for b->opt.limits (and the collectives' buffers of a rank). */
int cuda_be_alloc_activations(struct cuda_backend *b);
/* The steps' pinned stages and events, and the step slots' sampled tokens on the device. */
int cuda_be_alloc_steps(struct cuda_backend *b);
/* The ranks of b->opt.comm agree on the model, the limits, the pool and the devices. */
int cuda_be_tp_agree(struct cuda_backend *b, const struct model_weights *w, uint64_t random_seed);

/* ---- cuda_backend_forward.c ---- */

/* Runs a checked batch into b->logits through stage k (a step slot, or STAGE_SYNC), for
 * cuda_forward_device; the batch's logit entries are added to the logits after the LM head (a
 * graph's or the eager one), so a caller that wants the raw logits passes a batch without
 * them. */
int cuda_be_forward_pass(struct cuda_backend *b, const struct fwd_batch *batch, int k,
                         const struct backend_gather *gathers, int32_t num_gathers);
/* For capture_one: the step's metadata (and its logit entries) staged through stage k, and the
 * layers and LM head (the part of a step a graph holds). */
int cuda_be_stage_step(struct cuda_backend *b, int k, const struct fwd_batch *batch, int32_t pad,
                       const struct backend_gather *gathers, int32_t num_gathers);
int cuda_be_forward_layers(struct cuda_backend *b, int32_t n, int32_t num_logits);

/* ---- cuda_backend_graphs.c ---- */

/* The graph a step replays (an index of b->graph), or -1 (eager), for cuda_be_forward_pass. */
int32_t cuda_be_graph_of(const struct cuda_backend *b, const struct fwd_batch *batch);
/* The decode graphs, captured at open: a capture that fails leaves none and the open goes on,
 * launch by launch; only a device that no longer runs work fails it. */
int cuda_be_capture_graphs(struct cuda_backend *b);

#endif
