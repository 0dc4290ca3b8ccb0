/* The forward pass on one GPU, read top to bottom in cuda_forward_device (below), then
 * cuda_backend_forward.c (the pass) and cuda_backend_graphs.c (the decode graphs it replays);
 * cuda_backend_load.c loads the weights and allocates at open. This file: the ops table and its
 * entry points (forward, forward_sample, submit, complete, device time, health), open and close,
 * the pool. struct cuda_backend and what the files share: cuda_backend_impl.h. */
#include "worker/cuda_backend_impl.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/linear_lt.h"
#include "kernels/cuda/linear_tma.h"
#include "kernels/cuda/sampler.h"
#include "kernels/cuda/util.h"
#include "model/model_budget.h"
#include "worker/cuda_tp.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static const struct backend_ops cuda_ops, cuda_tp_ops;

int cuda_be_fail(cudaError_t e, const char *what)
{
    return pagoda_error_set(PAGODA_ECUDA, "%s: %s", what, cudaGetErrorString(e));
}

int cuda_be_cublas_fail(cublasStatus_t st, const char *what)
{
    return pagoda_error_set(PAGODA_ECUDA, "%s: cuBLAS status %d", what, (int)st);
}

/* Allocates device memory owned by the backend (freed in cuda_close). */
int cuda_be_alloc(struct cuda_backend *b, size_t bytes, void **out)
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
        return cuda_be_fail(e, "cudaMalloc");
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
            cudaFreeHost(b->stage[i].entries);
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

/* Makes the calling thread run b's work: its device, and its kernels' launch setting
 * (cuda_set_pdl), both per thread. */
cudaError_t cuda_be_bind_thread(const struct cuda_backend *b)
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
    if ((e = cuda_be_bind_thread(b)) != cudaSuccess) {
        rc = cuda_be_fail(e, "cudaSetDevice");
        goto fail;
    }
    /* The ranks agree on everything that must be equal before anything is allocated (which
     * also finds every peer alive). */
    if (comm != NULL && (rc = cuda_be_tp_agree(b, w, random_seed)) != 0)
        goto fail;
    size_t free_bytes = 0, total_bytes = 0;
    if ((e = cudaMemGetInfo(&free_bytes, &total_bytes)) != cudaSuccess) {
        rc = cuda_be_fail(e, "cudaMemGetInfo");
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
        rc = cuda_be_fail(e, "cudaStreamCreate");
        goto fail;
    }
    cublasStatus_t st = cublasCreate(&b->cublas);
    if (st != CUBLAS_STATUS_SUCCESS ||
        (st = cublasSetStream(b->cublas, b->stream)) != CUBLAS_STATUS_SUCCESS) {
        rc = cuda_be_cublas_fail(st, "cublasCreate");
        goto fail;
    }
    /* A workspace of the handle's own: a GEMM captured in a graph then allocates nothing, and
     * eager GEMMs see the same workspace, so cuBLAS picks the same algorithms for both. */
    if ((rc = cuda_be_alloc(b, MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES, &b->cublas_workspace)) != 0)
        goto fail;
    if ((st = cublasSetWorkspace(b->cublas, b->cublas_workspace,
                                 MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES)) != CUBLAS_STATUS_SUCCESS) {
        rc = cuda_be_cublas_fail(st, "cublasSetWorkspace");
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
    if ((rc = cuda_be_load_weights(b, w, random_seed)) != 0 ||
        (rc = cuda_be_alloc_activations(b)) != 0 || (rc = cuda_be_alloc_steps(b)) != 0)
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
    if ((rc = cuda_be_alloc(b, (size_t)cfg->head_dim / 2 * sizeof(float), (void **)&b->inv_freq)))
        goto fail;
    if ((e = cudaMemcpy(b->inv_freq, inv_freq, (size_t)cfg->head_dim / 2 * sizeof(float),
                        cudaMemcpyHostToDevice)) != cudaSuccess) {
        rc = cuda_be_fail(e, "cudaMemcpy (inv_freq)");
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
        (rc = cuda_be_capture_graphs(b)) != 0)
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

/* cuda_be_forward_pass after the checks. A batch the limits or the attention plan refuse fails
 * alike on every rank before any collective (every rank checks the same batch against the same
 * limits and pool size): the group goes on. Any other failure aborts the group (tp_fail). The
 * batch's logit entries are checked either way, and added to b->logits only with entries (the
 * steps that sample on the device: backend_forward's logits are without them, backend.h). */
static int cuda_forward_device(struct cuda_backend *b, const struct fwd_batch *batch, int k,
                               const struct backend_gather *gathers, int32_t num_gathers,
                               int entries)
{
    if (b->tp_broken)
        return pagoda_error_set(PAGODA_ECLOSED,
                                "tensor parallel: rank %d's group was aborted by an earlier "
                                "failed step",
                                b->shard.rank);
    int rc = backend_check_batch(&b->base.config, &b->opt.limits, batch);
    if (rc != 0)
        return rc;
    struct fwd_batch raw;
    if (!entries && batch->num_logit_entries > 0) {
        raw = *batch;
        raw.logit_entries = NULL;
        raw.num_logit_entries = 0;
        batch = &raw;
    }
    b->batch_refused = 0;
    rc = cuda_be_forward_pass(b, batch, k, gathers, num_gathers);
    return b->batch_refused ? rc : tp_fail(b, rc);
}

/* The raw logits: backend_forward_sample_rows's host path, which adds the entries itself after
 * this returns (worker/backend.c), calls it after a failed cuda_forward_sample. */
static int cuda_forward(struct backend *base, const struct fwd_batch *batch, float *logits)
{
    struct cuda_backend *b = (struct cuda_backend *)base;
    int rc = cuda_forward_device(b, batch, STAGE_SYNC, NULL, 0, 0);
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
    return e == cudaSuccess ? 0 : tp_fail(b, cuda_be_fail(e, "forward pass"));
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
    int rc = cuda_forward_device(b, batch, STAGE_SYNC, NULL, 0, 1);
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
    int rc = cuda_forward_device(b, batch, slot, gathers, num_gathers, 1);
    if (rc != 0)
        return rc;
    cudaError_t e = cudaEventRecord(b->ev_sample[slot], b->stream);
    if (e != cudaSuccess)
        return cuda_be_fail(e, "cudaEventRecord");
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
        return cuda_be_fail(e, "cudaEventRecord");
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
        return cuda_be_fail(e, "the step on the device");
    float ms = 0.0f;
    if ((e = cudaEventElapsedTime(&ms, b->ev_start[slot], b->ev_end[slot])) != cudaSuccess)
        return cuda_be_fail(e, "cudaEventElapsedTime");
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
        return cuda_be_fail(e, "cudaEventElapsedTime");
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
    cudaError_t e = cuda_be_bind_thread(b);
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
    return e == cudaSuccess ? 0 : cuda_be_fail(e, "allocating the KV pool");
}

void cuda_pool_free(void *pool)
{
    if (pool != NULL)
        cudaFree(pool);
}
