/* The CUDA backend's weights and allocations at open (open_backend, cuda_backend.c): the weights
 * copied or drawn onto the device, the activations, the steps' pinned stages and events, and the
 * agreement of a tensor-parallel group's ranks before anything is allocated. */
#include "worker/cuda_backend_impl.h"
#include "common/error.h"
#include "kernels/cuda/util.h"
#include "worker/cuda_tp.h"
#ifdef PAGODA_HAVE_NCCL
#include "comm/comm_nccl.h"
#endif

#include <cuda_runtime_api.h>
#include <math.h>
#include <stdlib.h>

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
    return e == cudaSuccess ? 0 : cuda_be_fail(e, "cudaMemcpy (weights)");
}

/* Allocates one device tensor made of parts stacked row-wise and fills it. */
static int load_stacked(struct cuda_backend *b, uint16_t **out, const struct weight_src *parts,
                        int num_parts, uint64_t seed, uint64_t *stream_id)
{
    int64_t total = 0;
    for (int i = 0; i < num_parts; i++)
        total += parts[i].elems;
    int rc = cuda_be_alloc(b, (size_t)total * 2, (void **)out);
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

int cuda_be_load_weights(struct cuda_backend *b, const struct model_weights *w, uint64_t seed)
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
    return err == cudaSuccess ? 0 : cuda_be_fail(err, "loading weights");
}

int cuda_be_alloc_activations(struct cuda_backend *b)
{
    const struct model_config *c = &b->base.config;
    size_t T = (size_t)b->opt.limits.max_num_tokens, S = (size_t)b->opt.limits.max_num_seqs;
    const struct model_shard *sh = &b->shard;
    size_t H = (size_t)c->hidden_size, I = (size_t)sh->intermediate_size;
    size_t qd = (size_t)(sh->num_heads * c->head_dim),
           kvd = (size_t)(sh->num_kv_heads * c->head_dim);
    int rc;
    if (b->opt.comm != NULL &&
        ((rc = cuda_be_alloc(b, T * H * 4, (void **)&b->partial)) ||
         (rc = cuda_be_alloc(b, S * (size_t)sh->vocab_per_rank * 4, (void **)&b->local_logits))))
        return rc;
    /* The all-gather's receive buffer of an NCCL group (cuda_tp.h); the cpu group's staging is
     * pinned host memory, made by cuda_tp_init. */
    float *gathered = NULL;
    if (cuda_tp_device_buffers(b->opt.comm) &&
        (rc = cuda_be_alloc(b, cuda_tp_gathered_floats(sh, (int32_t)S) * sizeof(float),
                            (void **)&gathered)) != 0)
        return rc;
    if (b->opt.comm != NULL && (rc = cuda_tp_init(&b->tp, b->opt.comm, sh, c->vocab_size, T * H,
                                                  (int32_t)S, gathered, b->stream)) != 0)
        return rc;
    if ((rc = cuda_be_alloc(b, T * H * 4, (void **)&b->residual)) ||
        (rc = cuda_be_alloc(b, H * 4, (void **)&b->residual_alt)) ||
        (rc = cuda_be_alloc(b, T * H * 2, (void **)&b->hidden)) ||
        (rc = cuda_be_alloc(b, T * (qd + 2 * kvd) * 2, (void **)&b->qkv)) ||
        (rc = cuda_be_alloc(b, T * qd * 2, (void **)&b->attn)) ||
        (rc = cuda_be_alloc(b, T * H * 2, (void **)&b->proj)) ||
        (rc = cuda_be_alloc(b, T * 2 * I * 2, (void **)&b->gate_up)) ||
        (rc = cuda_be_alloc(b, T * I * 2, (void **)&b->act)) ||
        (rc = cuda_be_alloc(b, S * H * 2, (void **)&b->selected)) ||
        (rc = cuda_be_alloc(b, S * (size_t)c->vocab_size * 4, (void **)&b->logits)) ||
        (rc = cuda_be_alloc(b, T * 4, (void **)&b->d_token_ids)) ||
        (rc = cuda_be_alloc(b, T * 4, (void **)&b->d_positions)) ||
        (rc = cuda_be_alloc(b, T * 8, (void **)&b->d_slots)) ||
        (rc = cuda_be_alloc(b, S * 4, (void **)&b->d_logits_rows)) ||
        (rc = cuda_be_alloc(b, (size_t)model_budget_logit_entry_bytes((int64_t)S),
                            (void **)&b->d_logit_entries)))
        return rc;
    return 0;
}

/* The pinned stages (with the step's logit entries: max_num_seqs * LOGIT_ENTRIES_PER_ROW of 12
 * bytes each, 1.3 MB of pinned memory per stage at 256 rows), the events around each pass, the
 * sampled tokens of the step slots. */
int cuda_be_alloc_steps(struct cuda_backend *b)
{
    size_t T = (size_t)b->opt.limits.max_num_tokens, S = (size_t)b->opt.limits.max_num_seqs;
    int rc;
    cudaError_t e;
    if ((rc = cuda_be_alloc(b, BACKEND_STEP_SLOTS * S * 4, (void **)&b->d_sampled)) != 0 ||
        (rc = cuda_be_alloc(b, T * 8, (void **)&b->d_gathers)) != 0)
        return rc;
    if ((e = cudaMemset(b->d_sampled, 0, BACKEND_STEP_SLOTS * S * 4)) != cudaSuccess)
        return cuda_be_fail(e, "cudaMemset (sampled tokens)");
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
            (e = cudaMallocHost((void **)&st->slots, T * 8)) != cudaSuccess ||
            (e = cudaMallocHost((void **)&st->entries,
                                S * LOGIT_ENTRIES_PER_ROW * sizeof(*st->entries))) != cudaSuccess)
            return cuda_be_fail(e, "cudaMallocHost (step stage)");
        if ((e = cudaEventCreate(&b->ev_start[i])) != cudaSuccess ||
            (e = cudaEventCreate(&b->ev_end[i])) != cudaSuccess ||
            (e = cudaEventCreate(&b->ev_layers[i])) != cudaSuccess ||
            (e = cudaEventCreate(&b->ev_sample[i])) != cudaSuccess ||
            (e = cudaEventCreateWithFlags(&b->staged[i], cudaEventDisableTiming)) != cudaSuccess)
            return cuda_be_fail(e, "cudaEventCreate");
    }
    return 0;
}

/* cuda_tp_agree with this rank's identity: the config's fields that change the math, the whole
 * tensors every rank holds (the final norm and the first layer's input norm: two checkpoints of
 * one shape differ there) or the random seed, the limits, the pool's blocks, the devices. */
int cuda_be_tp_agree(struct cuda_backend *b, const struct model_weights *w, uint64_t random_seed)
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
