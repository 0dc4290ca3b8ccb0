/* The forward pass on one GPU, read top to bottom in cuda_forward_device. */
#include "worker/cuda_backend.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_lt.h"
#include "kernels/cuda/linear_tma.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampler.h"
#include "kernels/cuda/util.h"
#include "model/model_budget.h"
#include "worker/cuda_tp.h"
#ifdef PAGODA_HAVE_NCCL
#include "comm/comm_nccl.h"
#endif

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
/* Each step slot samples into the sampler's slot of the same index. */
_Static_assert(CUDA_SAMPLER_SLOTS >= BACKEND_STEP_SLOTS,
               "the CUDA sampler has fewer slots than the backend's steps");

struct step_stage {
    int32_t *token_ids, *positions, *logits_rows, *gathers; /* gathers: [max_num_tokens][2] */
    int64_t *slots;
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
    int batch_refused;   /* the last forward_pass failed refusing its batch, before any work */
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
    /* The sampler's per-row arguments, one array per field, sized max_num_seqs. */
    struct sampling_params *row_params;
    uint64_t *row_index;
    const int32_t **row_prompt, **row_output;
    size_t *row_n_prompt, *row_n_output;
    uint64_t *row_keys; /* the rows' history keys (struct sample_row history_key) */
    struct cuda_history_gather *row_gathers; /* a step's history gathers, at most one a row */
    /* CUDA graphs of decode steps (capture_graphs), by batch size, ascending; a decode step of
     * n sequences replays the first of at least n, padded. */
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

static const struct backend_ops cuda_ops, cuda_tp_ops;
static int capture_graphs(struct cuda_backend *b);
static int forward_layers(struct cuda_backend *b, int32_t n, int32_t num_logits);
static int32_t graph_of(const struct cuda_backend *b, const struct fwd_batch *batch);

static int cuda_fail(cudaError_t e, const char *what)
{
    return pagoda_error_set(PAGODA_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

static int cublas_fail(cublasStatus_t st, const char *what)
{
    return pagoda_error_set(PAGODA_ECUDA, "%s: cuBLAS status %d", what, (int)st);
}

/* Allocates device memory owned by the backend (freed in cuda_close). */
static int dev_alloc(struct cuda_backend *b, size_t bytes, void **out)
{
    if (b->num_allocs == b->cap_allocs) {
        size_t cap = b->cap_allocs ? 2 * b->cap_allocs : 64;
        void **grown = realloc(b->allocs, cap * sizeof(void *));
        if (grown == NULL)
            return PAGODA_ENOMEM;
        b->allocs = grown;
        b->cap_allocs = cap;
    }
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaMalloc");
    b->allocs[b->num_allocs++] = *out;
    return 0;
}

static void cuda_close(struct backend *base)
{
    struct cuda_backend *b = (struct cuda_backend *)base;
    if (b->stream != NULL)
        cudaStreamSynchronize(b->stream);
    for (int i = 0; i < STAGES; i++) {
        if (b->stage != NULL) {
            cudaFreeHost(b->stage[i].token_ids);
            cudaFreeHost(b->stage[i].positions);
            cudaFreeHost(b->stage[i].logits_rows);
            cudaFreeHost(b->stage[i].gathers);
            cudaFreeHost(b->stage[i].slots);
        }
        if (b->ev_start[i] != NULL)
            cudaEventDestroy(b->ev_start[i]);
        if (b->ev_end[i] != NULL)
            cudaEventDestroy(b->ev_end[i]);
        if (b->ev_layers[i] != NULL)
            cudaEventDestroy(b->ev_layers[i]);
        if (b->ev_sample[i] != NULL)
            cudaEventDestroy(b->ev_sample[i]);
        if (b->staged[i] != NULL)
            cudaEventDestroy(b->staged[i]);
    }
    free(b->stage);
    cuda_tp_fini(&b->tp);
    for (int32_t i = 0; i < b->num_graphs; i++)
        cudaGraphExecDestroy(b->graph[i]);
    cuda_attention_plan_free(b->plan);
    cuda_sampler_free(b->sampler);
    for (size_t i = 0; i < b->num_allocs; i++)
        cudaFree(b->allocs[i]);
    free(b->allocs);
    free(b->layers);
    free(b->row_params);
    free(b->row_index);
    free(b->row_prompt);
    free(b->row_output);
    free(b->row_n_prompt);
    free(b->row_n_output);
    free(b->row_keys);
    free(b->row_gathers);
    cuda_lt_free(b->lt);
    if (b->tma != NULL && b->opt.tma_stream_k != CUDA_TMA_SK_OFF)
        log_info("cuda: linear_tma made %zu plans, %zu of them with stream-K",
                 cuda_tma_plans(b->tma), cuda_tma_plans_stream_k(b->tma));
    cuda_tma_free(b->tma);
    if (b->cublas != NULL)
        cublasDestroy(b->cublas);
    if (b->stream != NULL)
        cudaStreamDestroy(b->stream);
    free(b);
}

struct cuda_backend_options cuda_backend_default_options(void)
{
    struct cuda_backend_options o = {
        .device = 0,
        .limits = {.max_num_tokens = 2048, .max_num_seqs = 256, .max_blocks_per_seq = 4096},
        .gemv_max_rows = CUDA_BACKEND_GEMV_MAX_ROWS,
        .gemv_max_weight = CUDA_BACKEND_GEMV_MAX_WEIGHT,
        .gemv_stream = 1,
        .gemv_row = 1,
        .gemv_row_norm = 1,
        .pdl = 1,
        .decode_early_kv = 1,
        .cuda_graphs = 1,
        .residual_gemm_max_rows = CUDA_BACKEND_RESIDUAL_GEMM_MAX_ROWS,
        .split_parts = CUDA_BACKEND_SPLIT_PARTS,
        .pdl_late_max_rows = CUDA_BACKEND_PDL_LATE_MAX_ROWS,
        .fused_rope_max_seqs = CUDA_BACKEND_FUSED_ROPE_MAX_SEQS,
        .tma_max_rows = CUDA_BACKEND_TMA_MAX_ROWS,
        .tma_silu = 1,
        .tma_linears = CUDA_TMA_LINEARS,
    };
    return o;
}

void cuda_backend_set_tma(struct cuda_backend_options *o, int flag)
{
    if (flag == BACKEND_CUDA_TMA_OFF)
        o->tma_max_rows = 0;
    else if (flag == BACKEND_CUDA_TMA_STREAM_K)
        o->tma_stream_k = CUDA_TMA_SK_BALANCE;
}

/* ---- weights ---------------------------------------------------------------------------- */

/* Where one weight comes from: a checkpoint view, or random numbers of a given scale. A random
 * shard's tensor is a slice of the whole model's draw: rows of cols values, rows ld apart in
 * the whole tensor, starting at its element first (the whole tensor: first 0, cols = ld =
 * elems), so that every rank draws the values TP 1 draws. */
struct weight_src {
    const struct tensor_view *view; /* NULL: random */
    int64_t elems;
    float std, offset;
    int64_t first, cols, ld;
};

/* Copies (or draws) src into device memory at dst, converting a checkpoint's F16/F32 to BF16.
 * stream_id keeps random tensors independent of one another. */
static int upload(struct cuda_backend *b, uint16_t *dst, const struct weight_src *src,
                  uint64_t seed, uint64_t stream_id)
{
    if (src->view == NULL && src->first == 0 && src->cols == src->ld && src->cols == src->elems)
        return cuda_fill_random_bf16(dst, src->elems, seed, stream_id, src->std, src->offset,
                                     b->stream);
    if (src->view == NULL)
        return cuda_fill_random_bf16_slice(dst, src->elems / src->cols, src->cols, src->ld,
                                           src->first, seed, stream_id, src->std, src->offset,
                                           b->stream);
    const struct tensor_view *t = src->view;
    size_t n = (size_t)src->elems;
    cudaError_t e;
    if (t->dtype == DTYPE_BF16) {
        e = cudaMemcpy(dst, t->data, n * 2, cudaMemcpyHostToDevice);
    } else {
        uint16_t *tmp = malloc(n * 2);
        float *f = malloc(n * sizeof(float));
        if (tmp == NULL || f == NULL) {
            free(tmp);
            free(f);
            return PAGODA_ENOMEM;
        }
        dtype_to_f32(t->dtype, t->data, f, n);
        for (size_t i = 0; i < n; i++)
            tmp[i] = f32_to_bf16(f[i]);
        e = cudaMemcpy(dst, tmp, n * 2, cudaMemcpyHostToDevice);
        free(tmp);
        free(f);
    }
    return e == cudaSuccess ? 0 : cuda_fail(e, "cudaMemcpy (weights)");
}

/* Allocates one device tensor made of parts stacked row-wise and fills it. */
static int load_stacked(struct cuda_backend *b, uint16_t **out, const struct weight_src *parts,
                        int num_parts, uint64_t seed, uint64_t *stream_id)
{
    int64_t total = 0;
    for (int i = 0; i < num_parts; i++)
        total += parts[i].elems;
    int rc = dev_alloc(b, (size_t)total * 2, (void **)out);
    int64_t off = 0;
    for (int i = 0; rc == 0 && i < num_parts; i++) {
        rc = upload(b, *out + off, &parts[i], seed, (*stream_id)++);
        off += parts[i].elems;
    }
    return rc;
}

static struct weight_src src_of(const struct tensor_view *v, int64_t elems, float std, float offset,
                                int random)
{
    struct weight_src s = {random ? NULL : v, elems, std, offset, 0, elems, elems};
    return s;
}

/* src_of for a random shard's slice: a run of elems values starting at element first of the
 * whole tensor (row slices), or rows of cols values ld apart (column slices). */
static struct weight_src src_run(const struct tensor_view *v, int64_t elems, int64_t first,
                                 float std, float offset, int random)
{
    struct weight_src s = src_of(v, elems, std, offset, random);
    s.first = first;
    return s;
}

static struct weight_src src_cols(const struct tensor_view *v, int64_t rows, int64_t cols,
                                  int64_t ld, int64_t first, float std, int random)
{
    struct weight_src s = {random ? NULL : v, rows * cols, std, 0.0f, first, cols, ld};
    return s;
}

static int load_weights(struct cuda_backend *b, const struct model_weights *w, uint64_t seed)
{
    const struct model_config *c = &b->base.config;
    const struct model_shard *sh = &b->shard;
    const int rnd = (w == NULL);
    /* The shard's sizes (the whole model's for one rank); the row-parallel O and down keep
     * the whole output dimension H, a slice of the input one. */
    const int64_t H = c->hidden_size, I = sh->intermediate_size;
    const int64_t V = sh->vocab_end - sh->vocab_begin;
    const int64_t qd = sh->num_heads * c->head_dim, kvd = sh->num_kv_heads * c->head_dim;
    const float norm_std = 0.1f / 1.7320508f; /* 1 +- 0.1 uniform, as pagoda-mkmodel */
    uint64_t sid = 0;
    int rc;
    static const struct tensor_view none = {0};
#define VIEW(expr) (rnd ? &none : &(expr))
    /* Where the rank's slices start in the whole model's tensors (all 0 for one rank). */
    const int64_t r = sh->rank, v0 = sh->vocab_begin * H;
    struct weight_src e = src_run(VIEW(w->embed_tokens), V * H, v0, 1.0f, 0.0f, rnd);
    if ((rc = load_stacked(b, &b->embed, &e, 1, seed, &sid)) != 0)
        return rc;
    struct weight_src n = src_of(VIEW(w->norm), H, norm_std, 1.0f, rnd);
    if ((rc = load_stacked(b, &b->final_norm, &n, 1, seed, &sid)) != 0)
        return rc;
    if (c->tie_word_embeddings && (rnd || w->lm_head.data == w->embed_tokens.data)) {
        b->lm_head = b->embed;
    } else {
        struct weight_src l = src_run(VIEW(w->lm_head), V * H, v0, 1.0f / sqrtf((float)H), 0, rnd);
        if ((rc = load_stacked(b, &b->lm_head, &l, 1, seed, &sid)) != 0)
            return rc;
    }
    b->layers = calloc((size_t)c->num_layers, sizeof(*b->layers));
    if (b->layers == NULL)
        return PAGODA_ENOMEM;
    for (int64_t i = 0; i < c->num_layers; i++) {
        const struct model_weights_layer *lw = rnd ? NULL : &w->layers[i];
        struct cuda_layer *l = &b->layers[i];
        float s_in = 1.0f / sqrtf((float)H);
        float s_o = 1.0f / sqrtf((float)(c->num_heads * c->head_dim));
        struct weight_src in_norm = src_of(VIEW(lw->input_layernorm), H, norm_std, 1.0f, rnd);
        struct weight_src post = src_of(VIEW(lw->post_attention_layernorm), H, norm_std, 1, rnd);
        struct weight_src qkv[3] = {src_run(VIEW(lw->q_proj), qd * H, r * qd * H, s_in, 0, rnd),
                                    src_run(VIEW(lw->k_proj), kvd * H, r * kvd * H, s_in, 0, rnd),
                                    src_run(VIEW(lw->v_proj), kvd * H, r * kvd * H, s_in, 0, rnd)};
        struct weight_src o =
            src_cols(VIEW(lw->o_proj), H, qd, c->num_heads * c->head_dim, r * qd, s_o, rnd);
        struct weight_src gu[2] = {src_run(VIEW(lw->gate_proj), I * H, r * I * H, s_in, 0, rnd),
                                   src_run(VIEW(lw->up_proj), I * H, r * I * H, s_in, 0, rnd)};
        struct weight_src down = src_cols(VIEW(lw->down_proj), H, I, c->intermediate_size, r * I,
                                          1.0f / sqrtf((float)c->intermediate_size), rnd);
        if ((rc = load_stacked(b, &l->input_norm, &in_norm, 1, seed, &sid)) != 0 ||
            (rc = load_stacked(b, &l->post_norm, &post, 1, seed, &sid)) != 0 ||
            (rc = load_stacked(b, &l->w_qkv, qkv, 3, seed, &sid)) != 0 ||
            (rc = load_stacked(b, &l->w_o, &o, 1, seed, &sid)) != 0 ||
            (rc = load_stacked(b, &l->w_gate_up, gu, 2, seed, &sid)) != 0 ||
            (rc = load_stacked(b, &l->w_down, &down, 1, seed, &sid)) != 0)
            return rc;
        if (c->qkv_bias) {
            struct weight_src bias[3] = {src_run(VIEW(lw->q_bias), qd, r * qd, 0.1f, 0, rnd),
                                         src_run(VIEW(lw->k_bias), kvd, r * kvd, 0.1f, 0, rnd),
                                         src_run(VIEW(lw->v_bias), kvd, r * kvd, 0.1f, 0, rnd)};
            if ((rc = load_stacked(b, &l->b_qkv, bias, 3, seed, &sid)) != 0)
                return rc;
        }
        if (c->o_bias) {
            struct weight_src ob = src_of(VIEW(lw->o_bias), H, 0.1f, 0, rnd);
            if ((rc = load_stacked(b, &l->b_o, &ob, 1, seed, &sid)) != 0)
                return rc;
        }
    }
#undef VIEW
    cudaError_t err = cudaStreamSynchronize(b->stream);
    return err == cudaSuccess ? 0 : cuda_fail(err, "loading weights");
}

static int alloc_activations(struct cuda_backend *b)
{
    const struct model_config *c = &b->base.config;
    size_t T = (size_t)b->opt.limits.max_num_tokens, S = (size_t)b->opt.limits.max_num_seqs;
    const struct model_shard *sh = &b->shard;
    size_t H = (size_t)c->hidden_size, I = (size_t)sh->intermediate_size;
    size_t qd = (size_t)(sh->num_heads * c->head_dim),
           kvd = (size_t)(sh->num_kv_heads * c->head_dim);
    int rc;
    if (b->opt.comm != NULL &&
        ((rc = dev_alloc(b, T * H * 4, (void **)&b->partial)) ||
         (rc = dev_alloc(b, S * (size_t)sh->vocab_per_rank * 4, (void **)&b->local_logits))))
        return rc;
    /* The all-gather's receive buffer of an NCCL group (cuda_tp.h); the cpu group's staging is
     * pinned host memory, made by cuda_tp_init. */
    float *gathered = NULL;
    if (cuda_tp_device_buffers(b->opt.comm) &&
        (rc = dev_alloc(b, cuda_tp_gathered_floats(sh, (int32_t)S) * sizeof(float),
                        (void **)&gathered)) != 0)
        return rc;
    if (b->opt.comm != NULL && (rc = cuda_tp_init(&b->tp, b->opt.comm, sh, c->vocab_size, T * H,
                                                  (int32_t)S, gathered, b->stream)) != 0)
        return rc;
    if ((rc = dev_alloc(b, T * H * 4, (void **)&b->residual)) ||
        (rc = dev_alloc(b, H * 4, (void **)&b->residual_alt)) ||
        (rc = dev_alloc(b, T * H * 2, (void **)&b->hidden)) ||
        (rc = dev_alloc(b, T * (qd + 2 * kvd) * 2, (void **)&b->qkv)) ||
        (rc = dev_alloc(b, T * qd * 2, (void **)&b->attn)) ||
        (rc = dev_alloc(b, T * H * 2, (void **)&b->proj)) ||
        (rc = dev_alloc(b, T * 2 * I * 2, (void **)&b->gate_up)) ||
        (rc = dev_alloc(b, T * I * 2, (void **)&b->act)) ||
        (rc = dev_alloc(b, S * H * 2, (void **)&b->selected)) ||
        (rc = dev_alloc(b, S * (size_t)c->vocab_size * 4, (void **)&b->logits)) ||
        (rc = dev_alloc(b, T * 4, (void **)&b->d_token_ids)) ||
        (rc = dev_alloc(b, T * 4, (void **)&b->d_positions)) ||
        (rc = dev_alloc(b, T * 8, (void **)&b->d_slots)) ||
        (rc = dev_alloc(b, S * 4, (void **)&b->d_logits_rows)))
        return rc;
    return 0;
}

/* The pinned stages, the events around each pass, the sampled tokens of the step slots. */
static int alloc_steps(struct cuda_backend *b)
{
    size_t T = (size_t)b->opt.limits.max_num_tokens, S = (size_t)b->opt.limits.max_num_seqs;
    int rc;
    cudaError_t e;
    if ((rc = dev_alloc(b, BACKEND_STEP_SLOTS * S * 4, (void **)&b->d_sampled)) != 0 ||
        (rc = dev_alloc(b, T * 8, (void **)&b->d_gathers)) != 0)
        return rc;
    if ((e = cudaMemset(b->d_sampled, 0, BACKEND_STEP_SLOTS * S * 4)) != cudaSuccess)
        return cuda_fail(e, "cudaMemset (sampled tokens)");
    for (int i = 0; i < BACKEND_STEP_SLOTS; i++)
        b->held[i] = b->slot_prev[i] = -1;
    b->last_slot = -1;
    b->stage = calloc(STAGES, sizeof(*b->stage));
    if (b->stage == NULL)
        return PAGODA_ENOMEM;
    for (int i = 0; i < STAGES; i++) {
        struct step_stage *st = &b->stage[i];
        if ((e = cudaMallocHost((void **)&st->token_ids, T * 4)) != cudaSuccess ||
            (e = cudaMallocHost((void **)&st->positions, T * 4)) != cudaSuccess ||
            (e = cudaMallocHost((void **)&st->logits_rows, S * 4)) != cudaSuccess ||
            (e = cudaMallocHost((void **)&st->gathers, T * 8)) != cudaSuccess ||
            (e = cudaMallocHost((void **)&st->slots, T * 8)) != cudaSuccess)
            return cuda_fail(e, "cudaMallocHost (step stage)");
        if ((e = cudaEventCreate(&b->ev_start[i])) != cudaSuccess ||
            (e = cudaEventCreate(&b->ev_end[i])) != cudaSuccess ||
            (e = cudaEventCreate(&b->ev_layers[i])) != cudaSuccess ||
            (e = cudaEventCreate(&b->ev_sample[i])) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&b->staged[i], cudaEventDisableTiming)) != cudaSuccess)
            return cuda_fail(e, "cudaEventCreate");
    }
    return 0;
}

/* cuda_tp_agree with this rank's identity: the config's fields that change the math, the whole
 * tensors every rank holds (the final norm and the first layer's input norm: two checkpoints of
 * one shape differ there) or the random seed, the limits, the pool's blocks, the devices. */
static int tp_agree(struct cuda_backend *b, const struct model_weights *w, uint64_t random_seed)
{
    const struct model_config *c = &b->base.config;
    struct cuda_tp_identity id = {
        .rank = b->shard.rank,
        .size = b->shard.size,
        .device = b->opt.device,
        .comm_device = -1,
        .max_num_tokens = b->opt.limits.max_num_tokens,
        .max_num_seqs = b->opt.limits.max_num_seqs,
        .max_blocks_per_seq = b->opt.limits.max_blocks_per_seq,
        .num_blocks = b->geometry.num_blocks,
        .block_size = b->geometry.block_size,
    };
    const int64_t ints[] = {c->arch,
                            c->vocab_size,
                            c->hidden_size,
                            c->intermediate_size,
                            c->num_layers,
                            c->num_heads,
                            c->num_kv_heads,
                            c->head_dim,
                            c->tie_word_embeddings,
                            c->qkv_bias,
                            c->o_bias,
                            c->max_position_embeddings,
                            c->rope.type,
                            c->rope.original_max_position_embeddings};
    const double reals[] = {c->rms_norm_eps, c->rope.theta, c->rope.factor, c->rope.low_freq_factor,
                            c->rope.high_freq_factor};
    uint64_t h = cuda_tp_hash(CUDA_TP_HASH_START, ints, sizeof(ints));
    id.config_hash = cuda_tp_hash(h, reals, sizeof(reals));
    h = CUDA_TP_HASH_START;
    if (w == NULL) {
        h = cuda_tp_hash(cuda_tp_hash(h, "random", 6), &random_seed, sizeof(random_seed));
    } else {
        h = cuda_tp_hash(h, w->norm.data, w->norm.nbytes);
        if (c->num_layers > 0)
            h = cuda_tp_hash(h, w->layers[0].input_layernorm.data,
                             w->layers[0].input_layernorm.nbytes);
    }
    id.weights_hash = h;
    if (cuda_tp_device_buffers(b->opt.comm)) {
#ifdef PAGODA_HAVE_NCCL
        if ((id.comm_device = comm_nccl_device(b->opt.comm)) < 0)
            return PAGODA_EIO;
#endif
    }
    return cuda_tp_agree(b->opt.comm, &id);
}

/* Makes the calling thread run b's work: its device, and its kernels' launch setting
 * (cuda_set_pdl), both per thread. */
static cudaError_t bind_thread(const struct cuda_backend *b)
{
    cudaError_t e = cudaSetDevice(b->opt.device);
    if (e == cudaSuccess)
        cuda_set_pdl(b->opt.pdl && !b->opt.baseline_kernels);
    return e;
}

static int open_backend(const struct model_config *cfg, const struct model_weights *w,
                        uint64_t random_seed, const struct kv_geometry *g, void *pool,
                        const struct cuda_backend_options *opt, struct backend **out)
{
    struct comm *comm = opt ? opt->comm : NULL;
    int tp_rank = comm ? comm_rank(comm) : 0, tp_size = comm ? comm_size(comm) : 1;
    struct model_shard shard;
    int rc;
    if (w != NULL) {
        if (w->shard.rank != tp_rank || w->shard.size != tp_size)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    "the weights are the shard of rank %d of %d, the group's rank "
                                    "is %d of %d",
                                    w->shard.rank, w->shard.size, tp_rank, tp_size);
        shard = w->shard;
    } else if ((rc = model_shard_make(cfg, tp_rank, tp_size, &shard)) != 0) {
        return rc;
    }
    /* A shard's pool holds its KV heads only, or the whole model's, of which the rank uses its
     * own run (ranks sharing one device and one pool): the pool is checked against the shard's
     * heads, then (a shard of a group) against the whole model's, before anything of it is
     * used. */
    if (g == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda: no pool geometry");
    struct model_config pool_view = *cfg;
    pool_view.num_kv_heads = shard.num_kv_heads;
    int pool_whole = 0;
    /* bf16, or F8E4M3 (--kv-cache-dtype fp8): the kernels read either (cuda_attention_config) */
    const enum dtype kv_dtype = g->dtype == DTYPE_F8E4M3 ? DTYPE_F8E4M3 : DTYPE_BF16;
    rc = backend_check_pool(&pool_view, g, kv_dtype, "CUDA");
    if (rc != 0 && shard.size > 1 && backend_check_pool(cfg, g, kv_dtype, "CUDA") == 0)
        rc = 0, pool_whole = 1;
    if (rc != 0)
        return backend_check_pool(&pool_view, g, kv_dtype, "CUDA"); /* its message again */
    if (kv_dtype == DTYPE_F8E4M3 && (comm == NULL || tp_rank == 0))
        log_warn("cuda: K and V are stored as 8-bit floats (E4M3, scale 1: magnitudes above 448 "
                 "are clipped to 448, below 2^-10 lost); outputs are near bf16's, not equal "
                 "(--kv-cache-dtype fp8; tests/gpu/hf_compare.py bounds the distance)");
    struct cuda_backend *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return PAGODA_ENOMEM;
    /* A rank of a group has no asynchronous steps (cuda_tp_ops). */
    b->base.ops = comm != NULL ? &cuda_tp_ops : &cuda_ops;
    b->base.config = *cfg;
    b->opt = opt ? *opt : cuda_backend_default_options();
    b->geometry = *g;
    b->pool = pool;
    b->shard = shard;
    b->pool_whole = pool_whole;
    b->kv_head_offset = shard.rank * shard.num_kv_heads;
    if (b->opt.limits.max_blocks_per_seq > g->num_blocks - 1)
        b->opt.limits.max_blocks_per_seq = g->num_blocks - 1;

    cudaError_t e;
    /* The graphs captured below take this thread's launch setting too. */
    if ((e = bind_thread(b)) != cudaSuccess) {
        rc = cuda_fail(e, "cudaSetDevice");
        goto fail;
    }
    /* The ranks agree on everything that must be equal before anything is allocated (which
     * also finds every peer alive). */
    if (comm != NULL && (rc = tp_agree(b, w, random_seed)) != 0)
        goto fail;
    size_t free_bytes = 0, total_bytes = 0;
    if ((e = cudaMemGetInfo(&free_bytes, &total_bytes)) != cudaSuccess) {
        rc = cuda_fail(e, "cudaMemGetInfo");
        goto fail;
    }
    const int64_t max_tokens = b->opt.limits.max_num_tokens;
    const int64_t max_seqs = b->opt.limits.max_num_seqs;
    const enum model_budget_comm bc = comm == NULL                   ? MODEL_BUDGET_COMM_NONE
                                      : cuda_tp_device_buffers(comm) ? MODEL_BUDGET_COMM_NCCL
                                                                     : MODEL_BUDGET_COMM_HOST;
    uint64_t need = model_budget_shard_worker_bytes(cfg, &shard, bc, max_tokens, max_seqs);
    if (need > free_bytes) {
        rc = pagoda_error_set(
            PAGODA_EEXHAUSTED,
            "the model needs %llu MiB on the GPU (weights %llu, activations "
            "%llu, reserve %llu), %zu MiB are free: short by %llu MiB",
            (unsigned long long)(need >> 20),
            (unsigned long long)(model_budget_shard_weight_bytes(cfg, &shard) >> 20),
            (unsigned long long)(model_budget_shard_activation_bytes(cfg, &shard, bc, max_tokens,
                                                                     max_seqs) >>
                                 20),
            (unsigned long long)(MODEL_BUDGET_RESERVE_BYTES >> 20), free_bytes >> 20,
            (unsigned long long)((need - free_bytes + (1 << 20) - 1) >> 20));
        goto fail;
    }
    if ((e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        rc = cuda_fail(e, "cudaStreamCreate");
        goto fail;
    }
    cublasStatus_t st = cublasCreate(&b->cublas);
    if (st != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetStream(b->cublas, b->stream)) != CUBLAS_STATUS_SUCCESS) {
        rc = cublas_fail(st, "cublasCreate");
        goto fail;
    }
    /* A workspace of the handle's own: a GEMM captured in a graph then allocates nothing, and
     * eager GEMMs see the same workspace, so cuBLAS picks the same algorithms for both. */
    if ((rc = dev_alloc(b, MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES, &b->cublas_workspace)) != 0)
        goto fail;
    if ((st = cublasSetWorkspace(b->cublas, b->cublas_workspace,
                                 MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES)) != CUBLAS_STATUS_SUCCESS) {
        rc = cublas_fail(st, "cublasSetWorkspace");
        goto fail;
    }
    /* cuBLASLt shares the workspace: its GEMMs and cuBLAS's run in one stream's order. */
    if (b->opt.lt_max_rows > 0 &&
        (rc = cuda_lt_new(b->cublas_workspace, MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES, &b->lt)) != 0)
        goto fail;
    /* linear_tma, for one rank outside the baseline kernels: where the device or driver cannot
     * run it (PAGODA_ECUDA), a warning, and the linears go to the GEMVs and cuBLAS (as
     * --cuda-tma off). */
    if (b->opt.tma_max_rows > 0 && b->opt.comm == NULL && !b->opt.baseline_kernels) {
        if ((rc = cuda_tma_new(&b->tma)) != 0 && rc != PAGODA_ECUDA)
            goto fail;
        if (rc != 0) {
            log_warn("cuda: linear_tma is not available (%s): a layer's linears of 2 to %d rows "
                     "go through the GEMVs and cuBLAS, as with --cuda-tma off",
                     pagoda_error_detail(), b->opt.tma_max_rows);
            b->tma = NULL;
            rc = 0;
            (void)cudaGetLastError();
        } else if ((rc = cuda_tma_set_tile(b->tma, b->opt.tma_tile)) != 0) {
            goto fail;
        } else if (b->opt.tma_stream_k != CUDA_TMA_SK_OFF &&
                   (rc = cuda_tma_set_stream_k(b->tma, b->opt.tma_stream_k)) != 0) {
            if (rc != PAGODA_ECUDA)
                goto fail;
            log_warn("cuda: linear_tma's stream-K is not available (%s): its plans take whole "
                     "units",
                     pagoda_error_detail());
            rc = 0;
            (void)cudaGetLastError();
        }
    }
    /* Random weights of a shard: the rank's slices of the whole model's draw (one seed for
     * every rank), so a random group computes what a random TP 1 computes. */
    if ((rc = load_weights(b, w, random_seed)) != 0 || (rc = alloc_activations(b)) != 0 ||
        (rc = alloc_steps(b)) != 0)
        goto fail;
    size_t S = (size_t)b->opt.limits.max_num_seqs;
    b->row_params = malloc(S * sizeof(*b->row_params));
    b->row_index = malloc(S * sizeof(*b->row_index));
    b->row_prompt = malloc(S * sizeof(*b->row_prompt));
    b->row_output = malloc(S * sizeof(*b->row_output));
    b->row_n_prompt = malloc(S * sizeof(*b->row_n_prompt));
    b->row_n_output = malloc(S * sizeof(*b->row_n_output));
    b->row_keys = malloc(S * sizeof(*b->row_keys));
    b->row_gathers = malloc(S * sizeof(*b->row_gathers));
    if (!b->row_params || !b->row_index || !b->row_prompt || !b->row_output || !b->row_n_prompt ||
        !b->row_n_output || !b->row_keys || !b->row_gathers) {
        rc = PAGODA_ENOMEM;
        goto fail;
    }

    float inv_freq[1024];
    struct cpu_rope_params rp = {
        .type = (enum cpu_rope_type)cfg->rope.type,
        .theta = cfg->rope.theta,
        .factor = cfg->rope.factor,
        .low_freq_factor = cfg->rope.low_freq_factor,
        .high_freq_factor = cfg->rope.high_freq_factor,
        .original_max_position_embeddings = (double)cfg->rope.original_max_position_embeddings,
    };
    if (cfg->head_dim > 2048) {
        rc = pagoda_error_set(PAGODA_EUNSUPPORTED, "head_dim %lld", (long long)cfg->head_dim);
        goto fail;
    }
    cpu_rope_inv_freq(&rp, cfg->head_dim, inv_freq);
    if ((rc = dev_alloc(b, (size_t)cfg->head_dim / 2 * sizeof(float), (void **)&b->inv_freq)))
        goto fail;
    if ((e = cudaMemcpy(b->inv_freq, inv_freq, (size_t)cfg->head_dim / 2 * sizeof(float),
                        cudaMemcpyHostToDevice)) != cudaSuccess) {
        rc = cuda_fail(e, "cudaMemcpy (inv_freq)");
        goto fail;
    }
    struct cuda_attention_config ac = {
        .num_heads = (int32_t)shard.num_heads,
        .num_kv_heads = (int32_t)shard.num_kv_heads,
        .head_dim = (int32_t)cfg->head_dim,
        .scale = (float)(1.0 / sqrt((double)cfg->head_dim)),
        .block_size = g->block_size,
        .num_blocks = g->num_blocks,
        .max_num_seqs = b->opt.limits.max_num_seqs,
        .max_num_tokens = b->opt.limits.max_num_tokens,
        .max_blocks_per_seq = b->opt.limits.max_blocks_per_seq,
        .kv_dtype = g->dtype,
    };
    if ((rc = cuda_attention_plan_new(&ac, &b->plan)) == 0) {
        cuda_attention_set_early_kv(b->plan, b->opt.decode_early_kv);
        cuda_attention_set_decode_copy_rows(b->plan, b->opt.decode_copy_rows);
        cuda_attention_set_decode_warps(b->plan, b->opt.decode_warps);
        cuda_attention_set_decode_ctas(b->plan, b->opt.decode_ctas);
        cuda_attention_set_decode_split(b->plan, b->opt.decode_split);
    }
    if (rc != 0 ||
        (rc = cuda_sampler_new((int32_t)cfg->vocab_size, b->opt.limits.max_num_seqs,
                               (size_t)cfg->max_position_embeddings, &b->sampler)) != 0 ||
        (rc = capture_graphs(b)) != 0)
        goto fail;
    *out = &b->base;
    return 0;
fail:
    cuda_close(&b->base);
    return rc;
}

/* A rank that cannot open aborts its group: the peers' open (cuda_tp_agree) or first step fails
 * at once instead of waiting for the timeout. */
int cuda_backend_open(const struct model_config *cfg, const struct model_weights *w,
                      uint64_t random_seed, const struct kv_geometry *g, void *pool,
                      const struct cuda_backend_options *opt, struct backend **out)
{
    int rc = open_backend(cfg, w, random_seed, g, pool, opt, out);
    if (rc != 0 && opt != NULL && opt->comm != NULL)
        comm_abort(opt->comm);
    return rc;
}

/* ---- the forward pass ------------------------------------------------------------------- */

/* Whether gemm_ld takes a linear of these sizes (and dense output) through cuda_gemv or
 * cuda_gemv_stream (opt.gemv_max_rows, opt.gemv_max_weight). */
static int takes_gemv(const struct cuda_backend *b, const uint16_t *x, const uint16_t *w,
                      const void *y, int64_t rows, int64_t in, int64_t out)
{
    return !b->opt.baseline_kernels && rows <= b->opt.gemv_max_rows &&
           in * out <= b->opt.gemv_max_weight &&
           cuda_gemv_fits((int32_t)rows, (int32_t)in, (int32_t)out, x, w, y);
}

/* ---- the late trigger into cuBLAS (kernels/cuda/util.h, opt.pdl_late_max_rows) ----
 * Around the launch of a kernel of ours whose successor is a cuBLAS GEMM (next_cublas), while
 * a graph is captured: late_begin asks for the late trigger, late_end records the node the
 * kernel became if it was launched so, and cublas_after_late, called before each cuBLAS call,
 * makes the edge from that node programmatic when it is still the capture's only dependency
 * (any launch between them, or a kernel that did not trigger late, leaves full stream order). */
static void late_begin(struct cuda_backend *b, int32_t rows, int next_cublas)
{
    cuda_pdl_note_late(0);
    cuda_set_pdl_late(b->capturing && rows <= b->opt.pdl_late_max_rows && next_cublas);
}

static void late_end(struct cuda_backend *b)
{
    cudaGraphNode_t node;
    b->late_node = cuda_pdl_late_launched() && cuda_capture_tip(b->stream, &node) ? node : NULL;
    cuda_set_pdl_late(0);
    cuda_pdl_note_late(0);
}

static int cublas_after_late(struct cuda_backend *b)
{
    cudaGraphNode_t node;
    if (b->late_node == NULL)
        return 0;
    const int tip = cuda_capture_tip(b->stream, &node) && node == b->late_node;
    b->late_node = NULL;
    return tip ? cuda_capture_make_programmatic(b->stream, node) : 0;
}

/* y [rows][ldy] = x . w^T + beta * y through cublasGemmEx (BF16 inputs, FP32 accumulation, y in
 * ytype): gemm_ld's last resort with beta 0, and gemm_add's addition into the residual with beta
 * 1. */
static int cublas_linear(struct cuda_backend *b, const uint16_t *x, const uint16_t *w, void *y,
                         cudaDataType ytype, int64_t rows, int64_t in, int64_t out, int64_t ldy,
                         float beta)
{
    const float one = 1.0f;
    int rc = cublas_after_late(b);
    if (rc != 0)
        return rc;
    cublasStatus_t st =
        cublasGemmEx(b->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)rows, (int)in, &one, w,
                     CUDA_R_16BF, (int)in, x, CUDA_R_16BF, (int)in, &beta, y, ytype, (int)ldy,
                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : cublas_fail(st, "cublasGemmEx");
}

/* Whether cuda_gemv_row takes this linear (gemm_ld's first path). */
static int row_takes(const struct cuda_backend *b, const uint16_t *x, const uint16_t *w,
                     const void *y, int64_t rows, int64_t in, int64_t out)
{
    return !b->opt.baseline_kernels && b->opt.gemv_row &&
           cuda_gemv_row_fits((int32_t)rows, (int32_t)in, (int32_t)out, x, w, y);
}

/* Whether a layer's linear (one rank) goes through cuda_tma_linear: 2 to opt.tma_max_rows rows,
 * in S slices of its reduction (1: whole, bf16 out). Only the linears of a layer: each is
 * followed by a kernel of ours that waits for it (RoPE or the attention, an RMSNorm, SiLU-mul),
 * or, after gate/up with SiLU-mul inside (opt.tma_silu), by down, which may be cuBLAS's: no edge
 * out of the TMA GEMM is ever made programmatic (it signals the kernel behind before it ends,
 * which a cuBLAS GEMM would not wait for), so that edge keeps full stream order, and down there
 * loses the late trigger's overlap the SiLU-mul kernel gave it. */
static int tma_rows(const struct cuda_backend *b, int64_t rows)
{
    /* (b->tma exists for one rank outside the baseline kernels only: open_backend) */
    return b->tma != NULL && rows >= 2 && rows <= b->opt.tma_max_rows;
}

/* tma_rows for linear `kind` (CUDA_TMA_QKV .. CUDA_TMA_DOWN), which opt.tma_linears names. */
static int tma_kind_rows(const struct cuda_backend *b, int kind, int64_t rows)
{
    return (b->opt.tma_linears & kind) && tma_rows(b, rows);
}

static int tma_takes(const struct cuda_backend *b, int kind, const uint16_t *x, const uint16_t *w,
                     const void *y, int64_t rows, int64_t in, int64_t out, int32_t S)
{
    return tma_kind_rows(b, kind, rows) && cuda_tma_fits(rows, in, out, S, x, w, y);
}

/* Whether a layer's linear of a bf16 output (gemm_layer) runs through cuBLAS or cuBLASLt (not
 * a kernel of ours). */
static int gemm_cublas(const struct cuda_backend *b, int kind, const uint16_t *x, const uint16_t *w,
                       const void *y, int64_t rows, int64_t in, int64_t out, int64_t ldy)
{
    return !row_takes(b, x, w, y, rows, in, out) &&
           !(ldy == out && takes_gemv(b, x, w, y, rows, in, out)) &&
           !(ldy == out && tma_takes(b, kind, x, w, y, rows, in, out, 1));
}

/* y[rows][out] = x[rows][in] . w[out][in]^T, BF16 inputs, FP32 accumulation, output in ytype,
 * y's rows ldy >= out elements apart. One row through cuda_gemv_row with opt.gemv_row; up to
 * opt.gemv_max_rows rows of a weight of at most
 * opt.gemv_max_weight elements through cuda_gemv_stream or cuda_gemv (cuda_backend.h;
 * contiguous outputs only), up to opt.lt_max_rows rows (of a weight of at most opt.lt_max_weight
 * elements, where that is not 0) through cuBLASLt (a shape it has no
 * algorithm for falls back), the rest through cublasGemmEx. */
static int gemm_ld(struct cuda_backend *b, const uint16_t *x, const uint16_t *w, void *y,
                   cudaDataType ytype, int64_t rows, int64_t in, int64_t out, int64_t ldy)
{
    if (row_takes(b, x, w, y, rows, in, out))
        return cuda_gemv_row(x, w, y, ytype == CUDA_R_32F, (int32_t)in, (int32_t)out, b->stream);
    if (ldy == out && takes_gemv(b, x, w, y, rows, in, out))
        return b->opt.gemv_stream ? cuda_gemv_stream(x, w, y, ytype == CUDA_R_32F, (int32_t)rows,
                                                     (int32_t)in, (int32_t)out, NULL, b->stream)
                                  : cuda_gemv(x, w, y, ytype == CUDA_R_32F, (int32_t)rows,
                                              (int32_t)in, (int32_t)out, b->stream);
    if (b->lt != NULL && rows <= b->opt.lt_max_rows &&
        (b->opt.lt_max_weight == 0 || in * out <= b->opt.lt_max_weight)) {
        int rc = cublas_after_late(b);
        if (rc != 0)
            return rc;
        rc = cuda_lt_linear(b->lt, x, w, y, ytype == CUDA_R_32F, rows, in, out, ldy, b->stream);
        if (rc != PAGODA_EUNSUPPORTED)
            return rc;
    }
    return cublas_linear(b, x, w, y, ytype, rows, in, out, ldy, 0.0f);
}

/* res [rows][out] f32 += x . w^T (opt.residual_gemm_max_rows): cuBLAS with beta 1. */
static int gemm_add(struct cuda_backend *b, const uint16_t *x, const uint16_t *w, float *res,
                    int64_t rows, int64_t in, int64_t out)
{
    return cublas_linear(b, x, w, res, CUDA_R_32F, rows, in, out, out, 1.0f);
}

/* The slices gemm_parts cuts a linear of reduction `in` into (opt.split_parts), or 0 where it
 * is not cut: slices of a multiple of 8 columns (16-byte aligned), out f32 per row and slice
 * within the gate/up buffer's 2 x intermediate bf16 a row. */
static int32_t split_of(const struct cuda_backend *b, int64_t in, int64_t out)
{
    const int64_t S = b->opt.split_parts;
    if (S < 2 || in % (S * 8) != 0 || S * out * 4 > 4 * b->shard.intermediate_size)
        return 0;
    return (int32_t)S;
}

/* parts[s][rows][out] f32 = x[:, s * in / S ..] . w[:, s * in / S ..]^T for s < S: the slices of
 * the reduction, each its own product (beta 0), in one cublasGemmStridedBatchedEx; the RMSNorm
 * behind adds them (cuda_add_parts_rmsnorm). */
static int gemm_parts(struct cuda_backend *b, int kind, const uint16_t *x, const uint16_t *w,
                      float *parts, int32_t S, int64_t rows, int64_t in, int64_t out)
{
    if (tma_takes(b, kind, x, w, parts, rows, in, out, S))
        return cuda_tma_linear(b->tma, x, w, parts, rows, in, out, S, b->stream);
    const float one = 1.0f, zero = 0.0f;
    const int64_t k = in / S;
    int rc = cublas_after_late(b);
    if (rc != 0)
        return rc;
    cublasStatus_t st = cublasGemmStridedBatchedEx(
        b->cublas, CUBLAS_OP_T, CUBLAS_OP_N, (int)out, (int)rows, (int)k, &one, w, CUDA_R_16BF,
        (int)in, k, x, CUDA_R_16BF, (int)in, k, &zero, parts, CUDA_R_32F, (int)out, rows * out, S,
        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    return st == CUBLAS_STATUS_SUCCESS ? 0 : cublas_fail(st, "cublasGemmStridedBatchedEx");
}

/* gemm_ld with a contiguous output. */
static int gemm(struct cuda_backend *b, const uint16_t *x, const uint16_t *w, void *y,
                cudaDataType ytype, int64_t rows, int64_t in, int64_t out)
{
    return gemm_ld(b, x, w, y, ytype, rows, in, out, out);
}

/* A layer's linear into bf16 y (QKV, gate/up; O and down where they neither add into the
 * residual nor are cut): one row by cuda_gemv_row first, then cuda_tma_linear where it takes
 * the call (tma_takes), else gemm. */
static int gemm_layer(struct cuda_backend *b, int kind, const uint16_t *x, const uint16_t *w,
                      uint16_t *y, int64_t rows, int64_t in, int64_t out)
{
    if (!row_takes(b, x, w, y, rows, in, out) && tma_takes(b, kind, x, w, y, rows, in, out, 1))
        return cuda_tma_linear(b->tma, x, w, y, rows, in, out, 1, b->stream);
    return gemm(b, x, w, y, CUDA_R_16BF, rows, in, out);
}

/* RoPE on the Q and K heads of b->qkv, then K and V into layer kv of the pool: one launch, or
 * two with opt.baseline_kernels. */
static int rope_and_cache(struct cuda_backend *b, const struct kv_layer_view *kv, int32_t n)
{
    const struct model_shard *sh = &b->shard;
    const int64_t hd = b->base.config.head_dim, qd = sh->num_heads * hd;
    const int64_t kvd = sh->num_kv_heads * hd, qkvd = qd + 2 * kvd;
    if (!b->opt.baseline_kernels)
        return cuda_rope_cache(b->qkv, qkvd, b->d_positions, b->inv_freq, n, (int32_t)sh->num_heads,
                               kv, b->d_slots, b->stream);
    int rc = cuda_rope(b->qkv, qkvd, b->d_positions, b->inv_freq, n,
                       (int32_t)(sh->num_heads + sh->num_kv_heads), (int32_t)hd, b->stream);
    return rc ? rc
              : cuda_reshape_and_cache(kv, b->qkv + qd, b->qkv + qd + kvd, qkvd, b->d_slots, n,
                                       b->stream);
}

/* RoPE, the K/V cache write and the attention of one layer: in the decode attention's kernel
 * when the planned step is 2 to opt.fused_rope_max_seqs decode sequences only (n tokens, a
 * graph's padded size when captured), else rope_and_cache then cuda_attention_run. */
static int rope_attention(struct cuda_backend *b, const struct kv_layer_view *kv, int32_t n)
{
    const struct model_shard *sh = &b->shard;
    const int64_t hd = b->base.config.head_dim;
    const int64_t qkvd = (sh->num_heads + 2 * sh->num_kv_heads) * hd;
    if (n >= 2 && n <= b->opt.fused_rope_max_seqs && !b->opt.baseline_kernels &&
        cuda_attention_planned_decode_only(b->plan)) {
        const struct cuda_attention_rope rope = {b->d_positions, b->inv_freq, b->d_slots};
        return cuda_attention_run_rope(b->plan, kv, b->qkv, qkvd, &rope, b->attn, b->stream);
    }
    int rc = rope_and_cache(b, kv, n);
    return rc ? rc : cuda_attention_run(b->plan, kv, b->qkv, qkvd, b->attn, b->stream);
}

/* Copies the step's metadata to the device through pinned stage k, then writes the gathered
 * input tokens (sampled by earlier steps, still on the device) over their placeholders. With pad
 * above the batch's tokens (a graph's batch size), tokens num_tokens .. pad - 1 are padding:
 * token 0 at position 0, slot -1 (their K/V is written nowhere), and logits rows num_logits ..
 * pad - 1 name rows inside the step (computed, never sampled). */
static int stage_step(struct cuda_backend *b, int k, const struct fwd_batch *batch, int32_t pad,
                      const struct backend_gather *gathers, int32_t num_gathers)
{
    struct step_stage *st = &b->stage[k];
    cudaStream_t s = b->stream;
    /* The copy from this stage STAGES passes ago has ended long since (a slot is completed
     * before it is used again); the wait only guards it. */
    cudaError_t e = cudaEventSynchronize(b->staged[k]);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaEventSynchronize (step stage)");
    size_t n = (size_t)batch->num_tokens, nl = (size_t)batch->num_logits;
    if (n > 0) {
        memcpy(st->token_ids, batch->token_ids, n * 4);
        memcpy(st->positions, batch->positions, n * 4);
        memcpy(st->slots, batch->slot_mapping, n * 8);
    }
    if (nl > 0)
        memcpy(st->logits_rows, batch->logits_indices, nl * 4);
    /* A graph step (pad > 0): the graph's every row gets a token, a slot (-1: no K/V write) and
     * a logits row, also when the step has as many tokens as the graph but fewer logits rows
     * (graph_of keeps num_logits <= num_tokens <= pad). */
    if (pad > 0) {
        for (size_t i = n; i < (size_t)pad; i++) {
            st->token_ids[i] = 0;
            st->positions[i] = 0;
            st->slots[i] = -1;
        }
        for (size_t i = nl; i < (size_t)pad; i++)
            st->logits_rows[i] = (int32_t)i;
        n = nl = (size_t)pad;
    }
    const int32_t seqs = b->opt.limits.max_num_seqs;
    for (int32_t i = 0; i < num_gathers; i++) {
        st->gathers[2 * i] = gathers[i].token;
        st->gathers[2 * i + 1] = gathers[i].slot * seqs + gathers[i].row;
    }
    if ((e = cudaMemcpyAsync(b->d_token_ids, st->token_ids, n * 4, cudaMemcpyHostToDevice, s)) !=
            cudaSuccess ||
        (e = cudaMemcpyAsync(b->d_positions, st->positions, n * 4, cudaMemcpyHostToDevice, s)) !=
            cudaSuccess ||
        (e = cudaMemcpyAsync(b->d_slots, st->slots, n * 8, cudaMemcpyHostToDevice, s)) !=
            cudaSuccess ||
        (nl > 0 && (e = cudaMemcpyAsync(b->d_logits_rows, st->logits_rows, nl * 4,
                                        cudaMemcpyHostToDevice, s)) != cudaSuccess) ||
        (num_gathers > 0 && (e = cudaMemcpyAsync(b->d_gathers, st->gathers, (size_t)num_gathers * 8,
                                                 cudaMemcpyHostToDevice, s)) != cudaSuccess) ||
        (e = cudaEventRecord(b->staged[k], s)) != cudaSuccess)
        return cuda_fail(e, "cudaMemcpyAsync (step metadata)");
    return cuda_gather_tokens(b->d_token_ids, b->d_gathers, num_gathers, b->d_sampled, s);
}

/* The end of a row-parallel projection (O, down) whose f32 output is in b->partial: summed
 * over the group, then rounded to bf16 into b->proj once, O's bias (whole on every rank)
 * added before the rounding, after the sum. */
static int tp_row_parallel_end(struct cuda_backend *b, const uint16_t *bias, int32_t n)
{
    const int32_t H = (int32_t)b->base.config.hidden_size;
    int rc = cuda_tp_all_reduce(&b->tp, b->partial, (size_t)n * (size_t)H);
    return rc ? rc : cuda_to_bf16_bias(b->partial, bias, b->proj, n, H, b->stream);
}

/* The LM head over the selected rows into b->logits [rows][vocab]. One rank computes the whole
 * vocabulary; a tensor-parallel rank its vocabulary rows (the last rank's padding is left as it
 * is: the gather drops it), then gathers every rank's. */
static int lm_head(struct cuda_backend *b, int32_t rows)
{
    const struct model_config *c = &b->base.config;
    if (rows == 0)
        return 0;
    if (b->opt.comm == NULL)
        return gemm(b, b->selected, b->lm_head, b->logits, CUDA_R_32F, rows, c->hidden_size,
                    c->vocab_size);
    const struct model_shard *sh = &b->shard;
    const int64_t per = sh->vocab_per_rank, mine = sh->vocab_end - sh->vocab_begin;
    /* Rows of per floats: the last rank's (mine < per) leave their padding unwritten. */
    int rc = gemm_ld(b, b->selected, b->lm_head, b->local_logits, CUDA_R_32F, rows, c->hidden_size,
                     mine, per);
    return rc ? rc : cuda_tp_gather_logits(&b->tp, b->local_logits, rows, b->logits);
}

/* Runs the (checked) batch and leaves the logits rows in b->logits (device); k names the stage
 * and the events (a step slot, or STAGE_SYNC). With tensor parallelism (Megatron, as the CPU
 * backend): the embedding rows outside the rank's vocabulary are zeros and the lookups summed; Q,
 * K, V and gate/up give the rank's heads and MLP columns; O and down give f32 partial sums, summed
 * by one all-reduce each (tp_row_parallel_end); the logits are gathered (lm_head). */
static int forward_pass(struct cuda_backend *b, const struct fwd_batch *batch, int k,
                        const struct backend_gather *gathers, int32_t num_gathers)
{
    int rc;
    /* The worker's executor thread is not the one that opened the backend (worker/executor.h):
     * bind it on every pass (cheap calls once bound). */
    cudaError_t e = bind_thread(b);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaSetDevice");
    if (k == STAGE_SYNC) {
        b->timed = 0;
        b->last_slot = -1;
    }
    if ((e = cudaEventRecord(b->ev_start[k], b->stream)) != cudaSuccess)
        return cuda_fail(e, "cudaEventRecord");
    struct attention_batch ab = {
        .num_seqs = batch->num_seqs,
        .num_tokens = batch->num_tokens,
        .query_start = batch->query_start,
        .context_len = batch->context_lens,
        .block_tables = batch->block_tables,
        .max_blocks_per_seq = batch->max_blocks_per_seq,
    };
    /* A decode step replays the graph of its batch size; should its graph plan fail, the step
     * runs eagerly (the plan of the step alone reports what is wrong with it, if anything). */
    int32_t g = graph_of(b, batch);
    if (g >= 0 && cuda_attention_plan_graph(b->plan, &ab, b->graph_batch[g], b->stream) != 0)
        g = -1;
    if (g < 0 && (rc = cuda_attention_plan(b->plan, &ab, b->stream)) != 0) {
        /* A batch the plan refuses (a block or slot outside the pool) is refused alike by every
         * rank, before any collective; a CUDA error is this rank's own. */
        b->batch_refused = rc != PAGODA_ECUDA;
        return rc;
    }
    if ((rc = stage_step(b, k, batch, g >= 0 ? b->graph_batch[g] : 0, gathers, num_gathers)) != 0)
        return rc;
    if ((e = cudaEventRecord(b->ev_layers[k], b->stream)) != cudaSuccess)
        return cuda_fail(e, "cudaEventRecord");
    b->slot_graph[k] = g >= 0;
    if (g >= 0) {
        if ((e = cudaGraphLaunch(b->graph[g], b->stream)) != cudaSuccess)
            return cuda_fail(e, "cudaGraphLaunch");
        b->base.graph_steps++;
        return 0;
    }
    return forward_layers(b, batch->num_tokens, batch->num_logits);
}

/* The residual stream's RMSNorm (after adding `add`, NULL for nothing) and the linear behind it,
 * y = norm . w^T. A step of one row with opt.gemv_row and opt.gemv_row_norm (and no tensor
 * parallelism): one kernel, cuda_gemv_row_norm, which writes the residual to the other buffer
 * (*res and *alt swap); otherwise cuda_add_rmsnorm into b->hidden (the residual in place), then
 * gemm_layer. The same bits either way. With silu (gate/up where opt.tma_silu takes the step:
 * 2 rows or more, cuda_tma_silu_fits), w is the gate/up weight of out = 2 x inter rows and y
 * the activations [n][inter]: cuda_tma_linear_silu, SiLU-and-multiply in its epilogue. */
static int norm_linear(struct cuda_backend *b, float **res, float **alt, const uint16_t *add,
                       int32_t nparts, const uint16_t *norm, int kind, const uint16_t *w,
                       uint16_t *y, int32_t n, int64_t in, int64_t out, int silu)
{
    const float eps = (float)b->base.config.rms_norm_eps;
    if (!silu && n == 1 && nparts == 0 && b->opt.gemv_row && b->opt.gemv_row_norm &&
        !b->opt.baseline_kernels && b->opt.comm == NULL &&
        cuda_gemv_row_norm_fits((int32_t)in, (int32_t)out, *res, add, norm, *alt, w, y)) {
        int rc = cuda_gemv_row_norm(*res, add, norm, eps, *alt, w, y, 0, (int32_t)in, (int32_t)out,
                                    b->stream);
        if (rc == 0 && add != NULL) {
            float *t = *res;
            *res = *alt;
            *alt = t;
        }
        return rc;
    }
    late_begin(b, n,
               b->opt.comm == NULL && !silu &&
                   gemm_cublas(b, kind, b->hidden, w, y, n, in, out, out));
    int rc = cuda_add_parts_rmsnorm(*res, add, (const float *)b->gate_up, nparts, (int64_t)n * in,
                                    norm, b->hidden, n, (int32_t)in, eps, b->stream);
    late_end(b);
    if (rc != 0)
        return rc;
    return silu ? cuda_tma_linear_silu(b->tma, b->hidden, w, y, n, in, out / 2, b->stream)
                : gemm_layer(b, kind, b->hidden, w, y, n, in, out);
}

/* The layers and the LM head over the n tokens staged on the device, into num_logits rows of
 * b->logits: launches on the stream only (one rank), so that it can be captured in a graph. */
static int forward_layers(struct cuda_backend *b, int32_t n, int32_t num_logits)
{
    const struct model_config *c = &b->base.config;
    cudaStream_t s = b->stream;
    int rc;
    const struct model_shard *sh = &b->shard;
    const int tp = b->opt.comm != NULL;
    const int64_t H = c->hidden_size, I = sh->intermediate_size, hd = c->head_dim;
    const int64_t qd = sh->num_heads * hd, kvd = sh->num_kv_heads * hd, qkvd = qd + 2 * kvd;
    const float eps = (float)c->rms_norm_eps;
    /* One rank holds every row: an id outside the vocabulary (a gathered token is checked by no
     * one on the host) reads zeros, not past the table. */
    if (!tp)
        rc = cuda_embedding_rows(b->embed, b->d_token_ids, n, (int32_t)H, 0, (int32_t)c->vocab_size,
                                 b->residual, s);
    else if ((rc = cuda_embedding_rows(b->embed, b->d_token_ids, n, (int32_t)H,
                                       (int32_t)sh->vocab_begin, (int32_t)sh->vocab_end,
                                       b->residual, s)) == 0)
        rc = cuda_tp_all_reduce(&b->tp, b->residual, (size_t)n * (size_t)H);
    if (rc != 0)
        return rc;
    /* The residual stream: b->residual, or after a fused normalisation the other buffer. */
    float *res = b->residual, *alt = b->residual_alt;
    /* O and down add into the residual themselves (opt.residual_gemm_max_rows), unless a GEMV
     * of ours takes them (a few rows: their output is BF16 proj, as before); the RMSNorm behind
     * each adds proj only where its linear did not add. All layers alike: the weights of a
     * kind share their shape. */
    const int into_res = !tp && c->num_layers > 0 && n >= 2 && n <= b->opt.residual_gemm_max_rows;
    /* (where cuda_tma_linear takes O or down in their slices, it goes before the GEMVs) */
    float *parts = (float *)b->gate_up;
    const int32_t o_split = split_of(b, qd, H), down_split = split_of(b, I, H);
    const int o_tma = into_res && !c->o_bias && o_split &&
                      tma_takes(b, CUDA_TMA_O, b->attn, b->layers[0].w_o, parts, n, qd, H, o_split);
    const int down_tma =
        into_res && down_split &&
        tma_takes(b, CUDA_TMA_DOWN, b->act, b->layers[0].w_down, parts, n, I, H, down_split);
    const int gemv_o = !o_tma && takes_gemv(b, b->attn, b->layers[0].w_o, b->proj, n, qd, H);
    const int gemv_down = !down_tma && takes_gemv(b, b->act, b->layers[0].w_down, b->proj, n, I, H);
    const int o_into = into_res && !c->o_bias && !gemv_o;
    const int down_into = into_res && !gemv_down;
    const uint16_t *after_o = o_into ? NULL : b->proj, *after_down = down_into ? NULL : b->proj;
    /* ... cut into slices whose sum the RMSNorm behind forms (opt.split_parts), in the gate/up
     * buffer: no kernel uses it between O and the RMSNorm after it, or between down and the
     * next layer's first RMSNorm (or the final one). */
    const int32_t o_parts = o_into ? o_split : 0;
    const int32_t down_parts = down_into ? down_split : 0;
    /* gate/up with SiLU-and-multiply in one kernel of linear_tma (opt.tma_silu) */
    const int silu_tma = b->opt.tma_silu && c->num_layers > 0 &&
                         tma_kind_rows(b, CUDA_TMA_GATE_UP, n) &&
                         cuda_tma_silu_fits(n, H, I, b->hidden, b->layers[0].w_gate_up, b->act);
    for (int64_t i = 0; i < c->num_layers; i++) {
        const struct cuda_layer *l = &b->layers[i];
        struct kv_layer_view kv = kv_layer_view_make(&b->geometry, b->pool, (int32_t)i);
        if (b->pool_whole) {
            size_t skip = (size_t)(b->kv_head_offset * kv.head_stride) * dtype_size(kv.dtype);
            kv.k = (char *)kv.k + skip;
            kv.v = (char *)kv.v + skip;
            kv.num_kv_heads = (int32_t)sh->num_kv_heads;
        }
        /* Attention block; the previous block's output (proj) joins the residual stream. */
        if ((rc = norm_linear(b, &res, &alt, i ? after_down : NULL, i ? down_parts : 0,
                              l->input_norm, CUDA_TMA_QKV, l->w_qkv, b->qkv, n, H, qkvd, 0)) ||
            (l->b_qkv && (rc = cuda_add_bias(b->qkv, qkvd, l->b_qkv, n, (int32_t)qkvd, s))))
            return rc;
        /* Q and K heads sit side by side in a QKV row: one RoPE call rotates both, and writes K
         * and V into the pool in the same pass (or the attention does both). */
        late_begin(b, n,
                   !tp && (o_parts ? !o_tma
                                   : o_into || gemm_cublas(b, CUDA_TMA_O, b->attn, l->w_o, b->proj,
                                                           n, qd, H, H)));
        rc = rope_attention(b, &kv, n);
        late_end(b);
        if (rc != 0)
            return rc;
        if (tp) {
            if ((rc = gemm(b, b->attn, l->w_o, b->partial, CUDA_R_32F, n, qd, H)) == 0)
                rc = tp_row_parallel_end(b, l->b_o, n);
        } else if (o_parts)
            rc = gemm_parts(b, CUDA_TMA_O, b->attn, l->w_o, parts, o_parts, n, qd, H);
        else if (o_into)
            rc = gemm_add(b, b->attn, l->w_o, res, n, qd, H);
        else if ((rc = gemm_layer(b, CUDA_TMA_O, b->attn, l->w_o, b->proj, n, qd, H)) == 0 &&
                 l->b_o)
            rc = cuda_add_bias(b->proj, H, l->b_o, n, (int32_t)H, s);
        if (rc != 0)
            return rc;
        /* MLP block: SiLU-and-multiply in gate/up's epilogue (opt.tma_silu), or a kernel. */
        if ((rc = norm_linear(b, &res, &alt, after_o, o_parts, l->post_norm, CUDA_TMA_GATE_UP,
                              l->w_gate_up, silu_tma ? b->act : b->gate_up, n, H, 2 * I,
                              silu_tma)) != 0)
            return rc;
        if (!silu_tma) {
            late_begin(b, n,
                       !tp &&
                           (down_parts ? !down_tma
                                       : down_into || gemm_cublas(b, CUDA_TMA_DOWN, b->act,
                                                                  l->w_down, b->proj, n, I, H, H)));
            rc = cuda_silu_mul(b->gate_up, b->act, n, (int32_t)I, s);
            late_end(b);
            if (rc != 0)
                return rc;
        }
        if (tp) {
            if ((rc = gemm(b, b->act, l->w_down, b->partial, CUDA_R_32F, n, I, H)) == 0)
                rc = tp_row_parallel_end(b, NULL, n);
        } else if (down_parts)
            rc = gemm_parts(b, CUDA_TMA_DOWN, b->act, l->w_down, parts, down_parts, n, I, H);
        else if (down_into)
            rc = gemm_add(b, b->act, l->w_down, res, n, I, H);
        else
            rc = gemm_layer(b, CUDA_TMA_DOWN, b->act, l->w_down, b->proj, n, I, H);
        if (rc != 0)
            return rc;
    }
    if ((rc = cuda_add_parts_rmsnorm(res, c->num_layers ? after_down : NULL, parts,
                                     c->num_layers ? down_parts : 0, (int64_t)n * H, b->final_norm,
                                     b->hidden, n, (int32_t)H, eps, s)) ||
        (rc = cuda_gather_rows_bf16(b->hidden, H, b->d_logits_rows, num_logits, (int32_t)H,
                                    b->selected, s)))
        return rc;
    return lm_head(b, num_logits);
}

/* The graph a step replays: the smallest batch size of at least its sequences when every
 * sequence decodes one token (query_len 1) and graphs are on; else -1 (eager). */
static int32_t graph_of(const struct cuda_backend *b, const struct fwd_batch *batch)
{
    const int32_t n = batch->num_seqs;
    /* More logits rows than sequences (backend.h allows repeats) would outnumber the graph's
     * rows: such a step runs eagerly. */
    if (b->num_graphs == 0 || n < 1 || batch->num_tokens != n || batch->num_logits > n ||
        n > b->graph_batch[b->num_graphs - 1])
        return -1;
    for (int32_t i = 0; i < n; i++)
        if (batch->query_start[i + 1] - batch->query_start[i] != 1)
            return -1;
    int32_t g = 0;
    while (b->graph_batch[g] < n)
        g++;
    return g;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* PAGODA_CUDA_GRAPH_FAIL_AT=<batch>, for tests only (tests/gpu/test_cuda_graph_fallback.c): the
 * capture of the decode graph of that batch size fails as a real capture can fail, through an
 * operation a capturing stream refuses (a synchronization, which invalidates the capture), so
 * that the fallback to launch-by-launch steps is exercised on the device. Read once per open;
 * 0 (unset, or not a batch size of 1 .. MODEL_BUDGET_GRAPH_BATCH_MAX, which is ignored with a
 * warning): no fault. */
#define CUDA_GRAPH_FAIL_AT_ENV "PAGODA_CUDA_GRAPH_FAIL_AT"

static int32_t graph_fail_at(void)
{
    const char *v = getenv(CUDA_GRAPH_FAIL_AT_ENV);
    if (v == NULL || *v == '\0')
        return 0;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > MODEL_BUDGET_GRAPH_BATCH_MAX) {
        log_warn("cuda: %s=%s ignored: a batch size of 1 .. %d is expected (a test's fault "
                 "injection)",
                 CUDA_GRAPH_FAIL_AT_ENV, v, MODEL_BUDGET_GRAPH_BATCH_MAX);
        return 0;
    }
    log_warn("cuda: %s=%ld: the capture of the decode graph of batch %ld will fail (a test's "
             "fault injection)",
             CUDA_GRAPH_FAIL_AT_ENV, n, n);
    return (int32_t)n;
}

/* Captures, instantiates and replays once the graph of a decode step of pad sequences into
 * b->graph[i]: the attention planned for pad padding sequences (the layout and grid every step of
 * that size will have), the metadata staged, then forward_layers captured from the stream, and
 * one replay (padding only: it writes no K/V). fail: the fault of PAGODA_CUDA_GRAPH_FAIL_AT.
 * Adds the device memory the graph took to *used (cudaMemGetInfo before and after). Returns 0
 * or an error with a detail; on an error the capture may still be open on the stream, or have
 * left the stream's last error set (graphs_abandon undoes both). */
static int capture_one(struct cuda_backend *b, int32_t i, int32_t pad, int fail, size_t *used)
{
    static const int32_t zero = 0;
    const struct attention_batch none = {.query_start = &zero, .max_blocks_per_seq = 1};
    const struct fwd_batch empty = {.query_start = &zero, .max_blocks_per_seq = 1};
    size_t free0 = 0, free1 = 0, unused = 0;
    cudaError_t e;
    if ((e = cudaStreamSynchronize(b->stream)) != cudaSuccess ||
        (e = cudaMemGetInfo(&free0, &unused)) != cudaSuccess)
        return cuda_fail(e, "before the capture");
    int rc = cuda_attention_plan_graph(b->plan, &none, pad, b->stream);
    if (rc == 0)
        rc = stage_step(b, STAGE_SYNC, &empty, pad, NULL, 0);
    if (rc != 0)
        return rc;
    if ((e = cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal)) != cudaSuccess)
        return cuda_fail(e, "cudaStreamBeginCapture");
    b->capturing = 1;
    rc = forward_layers(b, pad, pad);
    b->capturing = 0;
    b->late_node = NULL;
    if (rc == 0 && fail) {
        /* Refused while the stream captures, and the capture is invalidated: cudaStreamEndCapture
         * below fails as it would after a launch the capture cannot record. */
        e = cudaStreamSynchronize(b->stream);
        rc = cuda_fail(e != cudaSuccess ? e : cudaErrorStreamCaptureUnsupported,
                       "a synchronization while capturing (" CUDA_GRAPH_FAIL_AT_ENV ")");
    }
    cudaGraph_t graph = NULL;
    e = cudaStreamEndCapture(b->stream, &graph);
    if (rc == 0 && e != cudaSuccess)
        rc = cuda_fail(e, "cudaStreamEndCapture");
    if (rc == 0 && (e = cudaGraphInstantiate(&b->graph[i], graph, 0)) != cudaSuccess)
        rc = cuda_fail(e, "cudaGraphInstantiate");
    if (graph != NULL)
        cudaGraphDestroy(graph);
    if (rc != 0)
        return rc;
    b->graph_batch[i] = pad;
    b->num_graphs = i + 1;
    if ((e = cudaGraphLaunch(b->graph[i], b->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(b->stream)) != cudaSuccess ||
        (e = cudaMemGetInfo(&free1, &unused)) != cudaSuccess)
        return cuda_fail(e, "replaying the graph");
    *used = free0 > free1 ? free0 - free1 : 0;
    return 0;
}

/* After a failed capture_one: ends a capture still open on the stream (its graph dropped),
 * clears the last error the capture left (capture errors are not sticky: the context stays
 * usable), destroys every graph captured so far, and checks that the stream still runs work.
 * Returns 0 when steps can run launch by launch, or PAGODA_ECUDA when the device itself failed
 * (a sticky error, which eager steps would meet too). */
static int graphs_abandon(struct cuda_backend *b)
{
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(b->stream, &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
        cudaGraph_t graph = NULL;
        (void)cudaStreamEndCapture(b->stream, &graph);
        if (graph != NULL)
            cudaGraphDestroy(graph);
    }
    (void)cudaGetLastError();
    for (int32_t i = 0; i < b->num_graphs; i++)
        cudaGraphExecDestroy(b->graph[i]);
    b->num_graphs = 0;
    cudaError_t e = cudaStreamIsCapturing(b->stream, &status);
    if (e == cudaSuccess && status != cudaStreamCaptureStatusNone)
        e = cudaErrorStreamCaptureUnmatched;
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->stream);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_fail(e, "the stream after a failed graph capture");
}

/* Captures the graph of a decode step of each batch size of model_budget_graph_batches (when
 * opt.cuda_graphs is on), through capture_one. Logs the time and the device memory the graphs
 * took; the memory budget counts MODEL_BUDGET_GRAPH_BYTES for each (model/model_budget.h).
 *
 * A capture that fails does not fail the open (the supervisor would restart the worker into
 * the same failure): the graphs are given up (graphs_abandon frees those captured before), a
 * warning names the batch size and the error, base.graph_capture_failures counts it, and every
 * step runs launch by launch, as with cuda_graphs off. Only a device that no longer runs work
 * afterwards fails the open. */
static int capture_graphs(struct cuda_backend *b)
{
    /* A tensor-parallel step's collectives wait on the host (cuda_tp.h): not capturable. Such
     * a backend runs every step launch by launch (the budget still counts the graphs: an
     * over-estimate). */
    if (!b->opt.cuda_graphs || b->opt.comm != NULL)
        return 0;
    const int32_t fail_at = graph_fail_at();
    int32_t sizes[MODEL_BUDGET_GRAPHS_MAX];
    const int32_t count =
        model_budget_graph_batches(b->opt.limits.max_num_tokens, b->opt.limits.max_num_seqs, sizes);
    const double t0 = now_ms();
    size_t total = 0, largest = 0;
    for (int32_t i = 0; i < count; i++) {
        const int32_t pad = sizes[i];
        size_t used = 0;
        int rc = capture_one(b, i, pad, pad == fail_at, &used);
        if (rc != 0) {
            char detail[512];
            snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
            const int32_t captured = b->num_graphs;
            int arc = graphs_abandon(b);
            if (arc != 0)
                return pagoda_error_set(arc, "capturing the decode graph of batch %d (%s), then %s",
                                        (int)pad, detail, pagoda_error_detail());
            /* A programmatic edge may join only kernels: should cuBLAS put another node first
             * for some shape, the graphs are captured again without the late trigger. */
            if (b->opt.pdl_late_max_rows > 0 && pad != fail_at) {
                log_warn("cuda: capturing the decode graph of batch %d failed: %s; capturing "
                         "every graph again without the late trigger into cuBLAS",
                         (int)pad, detail);
                b->opt.pdl_late_max_rows = 0;
                total = largest = 0;
                i = -1;
                continue;
            }
            b->base.graph_capture_failures++;
            log_warn("cuda: capturing the decode graph of batch %d failed: %s; every step runs "
                     "without CUDA graphs, launch by launch (%d graphs captured, freed)",
                     (int)pad, detail, (int)captured);
            return 0;
        }
        total += used;
        largest = used > largest ? used : largest;
    }
    const double mib = 1024.0 * 1024.0;
    log_info("cuda: %d decode graphs (batch 1 .. %d) captured in %.0f ms, %.1f MiB of device "
             "memory (%.1f MiB the largest; the budget counts %.0f MiB each)",
             (int)count, count > 0 ? (int)sizes[count - 1] : 0, now_ms() - t0, (double)total / mib,
             (double)largest / mib, (double)MODEL_BUDGET_GRAPH_BYTES / mib);
    if (largest > MODEL_BUDGET_GRAPH_BYTES)
        log_warn("cuda: a decode graph took %.1f MiB, above the %.0f MiB the memory budget "
                 "counts (model/model_budget.h)",
                 (double)largest / mib, (double)MODEL_BUDGET_GRAPH_BYTES / mib);
    return 0;
}

/* A rank of a group that fails on its own (a CUDA or cuBLAS error, a failed attention plan, a
 * collective's error) aborts the group: the peers' pending collectives fail at once instead of
 * waiting for the timeout, and no later collective of this rank can pair with a peer's
 * collective of another point of the pass (every all-reduce of a step has the same op and
 * count: a rank one collective behind would sum the wrong buffers, silently). The rank stays
 * broken: every later pass fails with PAGODA_ECLOSED, as the comm would, until the group is
 * made again. Returns rc. */
static int tp_fail(struct cuda_backend *b, int rc)
{
    if (rc != 0 && b->opt.comm != NULL && !b->tp_broken) {
        b->tp_broken = 1;
        comm_abort(b->opt.comm);
    }
    return rc;
}

/* forward_pass after the checks. A batch the limits or the attention plan refuse fails alike on
 * every rank before any collective (every rank checks the same batch against the same limits
 * and pool size): the group goes on. Any other failure aborts the group (tp_fail). */
static int cuda_forward_device(struct cuda_backend *b, const struct fwd_batch *batch, int k,
                               const struct backend_gather *gathers, int32_t num_gathers)
{
    if (b->tp_broken)
        return pagoda_error_set(PAGODA_ECLOSED,
                                "tensor parallel: rank %d's group was aborted by an earlier "
                                "failed step",
                                b->shard.rank);
    int rc = backend_check_batch(&b->base.config, &b->opt.limits, batch);
    if (rc != 0)
        return rc;
    b->batch_refused = 0;
    rc = forward_pass(b, batch, k, gathers, num_gathers);
    return b->batch_refused ? rc : tp_fail(b, rc);
}

static int cuda_forward(struct backend *base, const struct fwd_batch *batch, float *logits)
{
    struct cuda_backend *b = (struct cuda_backend *)base;
    int rc = cuda_forward_device(b, batch, STAGE_SYNC, NULL, 0);
    if (rc != 0)
        return rc;
    cudaError_t e = cudaMemcpyAsync(logits, b->logits,
                                    (size_t)batch->num_logits * (size_t)b->base.config.vocab_size *
                                        sizeof(float),
                                    cudaMemcpyDeviceToHost, b->stream);
    if (e == cudaSuccess && (e = cudaEventRecord(b->ev_end[STAGE_SYNC], b->stream)) == cudaSuccess)
        b->timed = 1;
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->stream);
    return e == cudaSuccess ? 0 : tp_fail(b, cuda_fail(e, "forward pass"));
}

/* The sampler's per-row arguments from rows. */
static void fill_rows(struct cuda_backend *b, const struct sample_row *rows, int32_t n)
{
    for (int32_t r = 0; r < n; r++) {
        b->row_params[r] = rows[r].params;
        b->row_index[r] = rows[r].output_index;
        b->row_prompt[r] = rows[r].prompt_tokens;
        b->row_n_prompt[r] = rows[r].n_prompt;
        b->row_output[r] = rows[r].output_tokens;
        b->row_n_output[r] = rows[r].n_output;
        b->row_keys[r] = rows[r].history_key;
    }
}

static int cuda_forward_sample(struct backend *base, const struct fwd_batch *batch,
                               const struct sample_row *rows, int32_t *tokens, float *logprobs)
{
    struct cuda_backend *b = (struct cuda_backend *)base;
    int rc = cuda_forward_device(b, batch, STAGE_SYNC, NULL, 0);
    if (rc != 0)
        return rc;
    int32_t n = batch->num_logits;
    if (n == 0) {
        if (cudaEventRecord(b->ev_end[STAGE_SYNC], b->stream) == cudaSuccess)
            b->timed = 1;
        return 0;
    }
    fill_rows(b, rows, n);
    rc = cuda_sampler_sample_keyed(b->sampler, b->logits, n, b->row_params, b->row_index,
                                   b->row_prompt, b->row_n_prompt, b->row_output, b->row_n_output,
                                   b->row_keys, tokens, logprobs, b->stream);
    /* The sampler has waited for its stream: the end event marks the step's last work. */
    if (rc == 0 && cudaEventRecord(b->ev_end[STAGE_SYNC], b->stream) == cudaSuccess)
        b->timed = 1;
    /* A device error leaves this rank unable to go on; a refused argument does not. */
    return rc == PAGODA_ECUDA ? tp_fail(b, rc) : rc;
}

/* backend_submit: the pass, then the sampler writing the slot's device tokens and, by an
 * asynchronous copy, its pinned results; the slot's end event marks both. */
static int cuda_submit(struct backend *base, int slot, const struct fwd_batch *batch,
                       const struct sample_row *rows, const struct backend_gather *gathers,
                       int32_t num_gathers, const struct backend_history_gather *hgathers,
                       int32_t num_hgathers)
{
    struct cuda_backend *b = (struct cuda_backend *)base;
    const int32_t seqs = b->opt.limits.max_num_seqs;
    if (b->held[slot] >= 0)
        return pagoda_error_set(PAGODA_EINVAL, "cuda: step slot %d holds a step not completed",
                                slot);
    /* A gather reads d_sampled, [slot][max_num_seqs]: a row that the step of another slot, not
     * completed yet, samples (a completed slot's tokens are the host's to send). */
    for (int32_t i = 0; i < num_gathers; i++)
        if (gathers[i].slot == slot || gathers[i].row >= seqs ||
            b->held[gathers[i].slot] <= gathers[i].row)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "cuda: gather from slot %d row %d (it holds %d rows)",
                                    gathers[i].slot, gathers[i].row, b->held[gathers[i].slot]);
    /* The sampler reads a history gather from d_sampled, [slot][max_num_seqs]: a row that the
     * step of another slot, not completed yet, samples. */
    if (num_hgathers > batch->num_logits || num_hgathers > seqs)
        return pagoda_error_set(PAGODA_EINVAL, "cuda: %d history gathers for %d rows", num_hgathers,
                                batch->num_logits);
    for (int32_t i = 0; i < num_hgathers; i++) {
        const struct backend_history_gather *g = &hgathers[i];
        if (g->slot == slot || g->src_row >= seqs || b->held[g->slot] <= g->src_row)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "cuda: history gather from slot %d row %d (it holds %d rows)",
                                    g->slot, g->src_row, b->held[g->slot]);
        b->row_gathers[i] = (struct cuda_history_gather){
            .row = hgathers[i].row,
            .index = hgathers[i].index,
            .src = hgathers[i].slot * seqs + hgathers[i].src_row,
        };
    }
    int rc = cuda_forward_device(b, batch, slot, gathers, num_gathers);
    if (rc != 0)
        return rc;
    cudaError_t e = cudaEventRecord(b->ev_sample[slot], b->stream);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaEventRecord");
    int32_t n = batch->num_logits;
    if (n > 0) {
        fill_rows(b, rows, n);
        rc = cuda_sampler_enqueue_gathered(
            b->sampler, slot, b->logits, n, b->row_params, b->row_index, b->row_prompt,
            b->row_n_prompt, b->row_output, b->row_n_output, b->row_gathers, num_hgathers,
            b->d_sampled, b->row_keys, b->d_sampled + (size_t)slot * (size_t)seqs, b->stream);
        if (rc != 0)
            return rc;
    }
    if ((e = cudaEventRecord(b->ev_end[slot], b->stream)) != cudaSuccess)
        return cuda_fail(e, "cudaEventRecord");
    b->held[slot] = n;
    b->slot_prev[slot] = b->last_slot;
    b->last_slot = slot;
    return 0;
}

static int cuda_complete(struct backend *base, int slot, int wait, int32_t *tokens, float *logprobs,
                         struct backend_row_error *row_errors, double *device_us)
{
    struct cuda_backend *b = (struct cuda_backend *)base;
    const int32_t n = b->held[slot];
    if (n < 0)
        return pagoda_error_set(PAGODA_EINVAL, "cuda: step slot %d holds no step", slot);
    cudaError_t e = wait ? cudaEventSynchronize(b->ev_end[slot]) : cudaEventQuery(b->ev_end[slot]);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* not an error: keep it from the next launch's check */
        return PAGODA_EBUSY;
    }
    b->held[slot] = -1;
    if (e != cudaSuccess)
        return cuda_fail(e, "the step on the device");
    float ms = 0.0f;
    if ((e = cudaEventElapsedTime(&ms, b->ev_start[slot], b->ev_end[slot])) != cudaSuccess)
        return cuda_fail(e, "cudaEventElapsedTime");
    *device_us = (double)ms * 1e3;
    /* The debug log's split of the device time, and the device's idle time before the step (from
     * the end of the step submitted before it, whose slot is not reused before this one is
     * completed): idle time, or staging longer than its copies take, says the step came late. */
    if (log_get_level() <= LOG_DEBUG) {
        float staged = 0.0f, layers = 0.0f, idle = -1.0f;
        const int prev = b->slot_prev[slot];
        if (cudaEventElapsedTime(&staged, b->ev_start[slot], b->ev_layers[slot]) == cudaSuccess &&
            cudaEventElapsedTime(&layers, b->ev_layers[slot], b->ev_sample[slot]) == cudaSuccess) {
            if (prev >= 0 &&
                cudaEventElapsedTime(&idle, b->ev_end[prev], b->ev_start[slot]) != cudaSuccess)
                idle = -1.0f;
            log_debug("cuda: step slot %d: %.0f us staging, %.0f us the layers and LM head (%s), "
                      "%.0f us sampling; the device idle %.0f us before it (-1: not known)",
                      slot, staged * 1e3, layers * 1e3, b->slot_graph[slot] ? "graph" : "eager",
                      (ms - staged - layers) * 1e3, idle < 0 ? -1.0 : idle * 1e3);
        }
        (void)cudaGetLastError(); /* an elapsed time not available: no error for the next call */
    }
    for (int32_t r = 0; r < n; r++) {
        struct backend_row_error *re = &row_errors[r];
        re->code = cuda_sampler_result(b->sampler, slot, r, &tokens[r], &logprobs[r]);
        re->message[0] = '\0';
        if (re->code != 0) {
            snprintf(re->message, sizeof(re->message), "%s", pagoda_error_detail());
            tokens[r] = -1;
            logprobs[r] = 0.0f;
        }
    }
    return 0;
}

/* The time between the events around the last forward pass (and its sampling). */
static int cuda_device_time_us(struct backend *base, double *us)
{
    struct cuda_backend *b = (struct cuda_backend *)base;
    if (!b->timed)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "no forward pass timed yet");
    float ms = 0.0f;
    cudaError_t e = cudaEventSynchronize(b->ev_end[STAGE_SYNC]);
    if (e == cudaSuccess)
        e = cudaEventElapsedTime(&ms, b->ev_start[STAGE_SYNC], b->ev_end[STAGE_SYNC]);
    if (e != cudaSuccess)
        return cuda_fail(e, "cudaEventElapsedTime");
    *us = (double)ms * 1e3;
    return 0;
}

/* backend_health: after a fault the device context is lost, and every call of the process fails
 * with the fault's (sticky) error, the stream's synchronisation among them; errors that are not
 * sticky (a refused launch, a cuBLAS status) leave it working. Waits for the steps on the stream
 * (it writes nothing). */
static int cuda_health(struct backend *base)
{
    struct cuda_backend *b = (struct cuda_backend *)base;
    cudaError_t e = bind_thread(b);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->stream);
    if (e == cudaSuccess)
        return 0;
    return pagoda_error_set(PAGODA_ECUDA, "the device context of GPU %d is lost: %s (%s)",
                            b->opt.device, cudaGetErrorString(e), cudaGetErrorName(e));
}

static const struct backend_ops cuda_ops = {
    .name = "cuda",
    .forward = cuda_forward,
    .forward_sample = cuda_forward_sample,
    .close = cuda_close,
    .device_time_us = cuda_device_time_us,
    .submit = cuda_submit,
    .complete = cuda_complete,
    .health = cuda_health,
};

/* A rank of a tensor-parallel group: no submit/complete (backend_can_submit is false, the
 * executor runs one step at a time). A submitted step would wait on the host at every
 * collective (backend.h's submit returns without waiting), and backend.h's recovery of the
 * steps in flight would run collectives on one rank only: asynchronous steps of a group are
 * left for when they are designed (docs/tensor-parallel.md, "Left"). */
static const struct backend_ops cuda_tp_ops = {
    .name = "cuda",
    .forward = cuda_forward,
    .forward_sample = cuda_forward_sample,
    .close = cuda_close,
    .device_time_us = cuda_device_time_us,
    .health = cuda_health,
};

int cuda_pool_alloc(const struct kv_geometry *g, int device, void **pool)
{
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess)
        e = cudaMalloc(pool, kv_pool_bytes(g));
    if (e == cudaSuccess)
        e = cudaMemset(*pool, 0, kv_pool_bytes(g));
    return e == cudaSuccess ? 0 : cuda_fail(e, "allocating the KV pool");
}

void cuda_pool_free(void *pool)
{
    if (pool != NULL)
        cudaFree(pool);
}
