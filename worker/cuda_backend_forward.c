/* The CUDA backend's forward pass (cuda_be_forward_pass, behind cuda_forward_device): the choice
 * of kernel for each linear (our GEMVs, linear_tma, cuBLASLt, cuBLAS), the late trigger into
 * cuBLAS, RoPE and the attention, a step's metadata staged, a rank's row-parallel sums, the LM
 * head, and the layers (cuda_be_forward_layers, which a decode graph captures). */
#include "worker/cuda_backend_impl.h"
#include "common/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_lt.h"
#include "kernels/cuda/linear_tma.h"
#include "kernels/cuda/logit_bias.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/util.h"
#include "worker/cuda_tp.h"

#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <string.h>

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
    return st == CUBLAS_STATUS_SUCCESS ? 0 : cuda_be_cublas_fail(st, "cublasGemmEx");
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
    return st == CUBLAS_STATUS_SUCCESS ? 0 : cuda_be_cublas_fail(st, "cublasGemmStridedBatchedEx");
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

/* Copies the step's metadata and its logit entries to the device through pinned stage k, then
 * writes the gathered input tokens (sampled by earlier steps, still on the device) over their
 * placeholders. With pad above the batch's tokens (a graph's batch size), tokens num_tokens ..
 * pad - 1 are padding: token 0 at position 0, slot -1 (their K/V is written nowhere), and logits
 * rows num_logits .. pad - 1 name rows inside the step (computed, never sampled, never biased). */
int cuda_be_stage_step(struct cuda_backend *b, int k, const struct fwd_batch *batch, int32_t pad,
                       const struct backend_gather *gathers, int32_t num_gathers)
{
    struct step_stage *st = &b->stage[k];
    cudaStream_t s = b->stream;
    /* The copy from this stage STAGES passes ago has ended long since (a slot is completed
     * before it is used again); the wait only guards it. */
    cudaError_t e = cudaEventSynchronize(b->staged[k]);
    if (e != cudaSuccess)
        return cuda_be_fail(e, "cudaEventSynchronize (step stage)");
    size_t n = (size_t)batch->num_tokens, nl = (size_t)batch->num_logits;
    /* (backend_check_batch keeps them within num_logits * LOGIT_ENTRIES_PER_ROW, which the
     * stage holds: num_logits <= max_num_seqs) */
    const size_t ne = (size_t)batch->num_logit_entries;
    if (ne > 0)
        memcpy(st->entries, batch->logit_entries, ne * sizeof(*st->entries));
    if (n > 0) {
        memcpy(st->token_ids, batch->token_ids, n * 4);
        memcpy(st->positions, batch->positions, n * 4);
        memcpy(st->slots, batch->slot_mapping, n * 8);
    }
    if (nl > 0)
        memcpy(st->logits_rows, batch->logits_indices, nl * 4);
    /* A graph step (pad > 0): the graph's every row gets a token, a slot (-1: no K/V write) and
     * a logits row, also when the step has as many tokens as the graph but fewer logits rows
     * (cuda_be_graph_of keeps num_logits <= num_tokens <= pad). */
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
        (ne > 0 && (e = cudaMemcpyAsync(b->d_logit_entries, st->entries, ne * sizeof(*st->entries),
                                        cudaMemcpyHostToDevice, s)) != cudaSuccess) ||
        (e = cudaEventRecord(b->staged[k], s)) != cudaSuccess)
        return cuda_be_fail(e, "cudaMemcpyAsync (step metadata)");
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
int cuda_be_forward_pass(struct cuda_backend *b, const struct fwd_batch *batch, int k,
                         const struct backend_gather *gathers, int32_t num_gathers)
{
    int rc;
    /* The worker's executor thread is not the one that opened the backend (worker/executor.h):
     * bind it on every pass (cheap calls once bound). */
    cudaError_t e = cuda_be_bind_thread(b);
    if (e != cudaSuccess)
        return cuda_be_fail(e, "cudaSetDevice");
    if (k == STAGE_SYNC) {
        b->timed = 0;
        b->last_slot = -1;
    }
    if ((e = cudaEventRecord(b->ev_start[k], b->stream)) != cudaSuccess)
        return cuda_be_fail(e, "cudaEventRecord");
    struct attention_batch ab = backend_attention_batch(batch);
    /* A decode step replays the graph of its batch size; should its graph plan fail, the step
     * runs eagerly (the plan of the step alone reports what is wrong with it, if anything). */
    int32_t g = cuda_be_graph_of(b, batch);
    if (g >= 0 && cuda_attention_plan_graph(b->plan, &ab, b->graph_batch[g], b->stream) != 0)
        g = -1;
    if (g < 0 && (rc = cuda_attention_plan(b->plan, &ab, b->stream)) != 0) {
        /* A batch the plan refuses (a block or slot outside the pool) is refused alike by every
         * rank, before any collective; a CUDA error is this rank's own. */
        b->batch_refused = rc != PAGODA_ECUDA;
        return rc;
    }
    if ((rc = cuda_be_stage_step(b, k, batch, g >= 0 ? b->graph_batch[g] : 0, gathers,
                                 num_gathers)) != 0)
        return rc;
    if ((e = cudaEventRecord(b->ev_layers[k], b->stream)) != cudaSuccess)
        return cuda_be_fail(e, "cudaEventRecord");
    b->slot_graph[k] = g >= 0;
    if (g >= 0) {
        if ((e = cudaGraphLaunch(b->graph[g], b->stream)) != cudaSuccess)
            return cuda_be_fail(e, "cudaGraphLaunch");
        b->base.graph_steps++;
    } else if ((rc = cuda_be_forward_layers(b, batch->num_tokens, batch->num_logits)) != 0) {
        return rc;
    }
    /* The logit entries, after the LM head and outside the graphs (their count changes from
     * step to step): one launch, none without entries. */
    return cuda_logit_entries_apply(b->logits, b->base.config.vocab_size, b->d_logit_entries,
                                    batch->num_logit_entries, b->stream);
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
int cuda_be_forward_layers(struct cuda_backend *b, int32_t n, int32_t num_logits)
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
