/* The reference forward pass of a Llama-family decoder, read top to bottom in cpu_forward. */
#include "worker/cpu_backend.h"
#include "common/error.h"
#include "kernels/cpu/ops.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct cpu_layer {
    float *input_norm, *post_norm;
    float *wq, *wk, *wv, *wo; /* [out][in] */
    float *bq, *bk, *bv, *bo; /* NULL when the model has no bias */
    float *w_gate_up;         /* gate and up stacked: [2 * inter][hidden] */
    float *w_down;            /* [hidden][inter] */
};

struct cpu_backend {
    struct backend base;
    struct cpu_backend_options opt;
    struct kv_geometry geometry;
    char *pool_base;
    struct model_shard shard; /* the whole model when opt.comm is NULL */
    bool pool_whole;          /* a shard over a pool of the whole model's KV heads: */
    int64_t kv_head_offset;   /* the rank's first KV head in it */
    float *embed;             /* [shard vocab rows][hidden] */
    float *lm_head;           /* [shard vocab rows][hidden]; equals embed when tied */
    float *final_norm;
    struct cpu_layer *layers;
    float *inv_freq; /* [head_dim / 2] */
    struct attention_plan *plan;
    /* Activations, sized for opt.limits.max_num_tokens rows. */
    float *residual, *hidden, *q, *k, *v, *attn, *proj, *gate_up, *act;
    /* Tensor parallelism: this rank's logits [max_num_seqs][vocab_per_rank] and every rank's,
     * gathered [size][max_num_seqs][vocab_per_rank]. */
    float *local_logits, *gathered_logits;
};

static const struct backend_ops cpu_ops;

/* A weight converted to f32; NULL for an absent optional tensor. */
static int to_f32(const struct tensor_view *t, float **out)
{
    *out = NULL;
    if (t->data == NULL)
        return 0;
    size_t n = t->nbytes / dtype_size(t->dtype);
    float *f = malloc(n * sizeof(float));
    if (f == NULL)
        return PAGODA_ENOMEM;
    dtype_to_f32(t->dtype, t->data, f, n);
    *out = f;
    return 0;
}

/* Two weights stacked row-wise into one [rows_a + rows_b][cols] matrix. */
static int stack_f32(const struct tensor_view *a, const struct tensor_view *b, float **out)
{
    size_t na = a->nbytes / dtype_size(a->dtype), nb = b->nbytes / dtype_size(b->dtype);
    float *f = malloc((na + nb) * sizeof(float));
    if (f == NULL)
        return PAGODA_ENOMEM;
    dtype_to_f32(a->dtype, a->data, f, na);
    dtype_to_f32(b->dtype, b->data, f + na, nb);
    *out = f;
    return 0;
}

static void free_layer(struct cpu_layer *l)
{
    float *ptrs[] = {l->input_norm, l->post_norm, l->wq, l->wk,        l->wv,     l->wo,
                     l->bq,         l->bk,        l->bv, l->w_gate_up, l->w_down, l->bo};
    for (size_t i = 0; i < sizeof(ptrs) / sizeof(ptrs[0]); i++)
        free(ptrs[i]);
}

static void cpu_close(struct backend *base)
{
    struct cpu_backend *b = (struct cpu_backend *)base;
    if (b->layers != NULL) {
        for (int64_t i = 0; i < b->base.config.num_layers; i++)
            free_layer(&b->layers[i]);
        free(b->layers);
    }
    if (b->lm_head != b->embed)
        free(b->lm_head);
    free(b->embed);
    free(b->final_norm);
    free(b->inv_freq);
    attention_plan_free(b->plan);
    float *acts[] = {b->residual,       b->hidden, b->q,       b->k,   b->v,
                     b->attn,           b->proj,   b->gate_up, b->act, b->local_logits,
                     b->gathered_logits};
    for (size_t i = 0; i < sizeof(acts) / sizeof(acts[0]); i++)
        free(acts[i]);
    free(b);
}

struct cpu_backend_options cpu_backend_default_options(void)
{
    struct cpu_backend_options o = {
        .attention = ATTN_CPU_PAGED,
        .limits = {.max_num_tokens = 2048, .max_num_seqs = 256, .max_blocks_per_seq = 4096},
    };
    return o;
}

static int load_layers(struct cpu_backend *b, const struct model_weights *w)
{
    int64_t n = b->base.config.num_layers;
    b->layers = calloc((size_t)n, sizeof(*b->layers));
    if (b->layers == NULL)
        return PAGODA_ENOMEM;
    for (int64_t i = 0; i < n; i++) {
        const struct model_weights_layer *lw = &w->layers[i];
        struct cpu_layer *l = &b->layers[i];
        int rc;
        if ((rc = to_f32(&lw->input_layernorm, &l->input_norm)) ||
            (rc = to_f32(&lw->post_attention_layernorm, &l->post_norm)) ||
            (rc = to_f32(&lw->q_proj, &l->wq)) || (rc = to_f32(&lw->k_proj, &l->wk)) ||
            (rc = to_f32(&lw->v_proj, &l->wv)) || (rc = to_f32(&lw->o_proj, &l->wo)) ||
            (rc = to_f32(&lw->q_bias, &l->bq)) || (rc = to_f32(&lw->k_bias, &l->bk)) ||
            (rc = to_f32(&lw->v_bias, &l->bv)) || (rc = to_f32(&lw->o_bias, &l->bo)) ||
            (rc = stack_f32(&lw->gate_proj, &lw->up_proj, &l->w_gate_up)) ||
            (rc = to_f32(&lw->down_proj, &l->w_down)))
            return rc;
    }
    return 0;
}

static int alloc_activations(struct cpu_backend *b)
{
    const struct model_config *c = &b->base.config;
    size_t rows = (size_t)b->opt.limits.max_num_tokens;
    const struct model_shard *sh = &b->shard;
    size_t qdim = (size_t)(sh->num_heads * c->head_dim),
           kvdim = (size_t)(sh->num_kv_heads * c->head_dim);
    struct {
        float **p;
        size_t cols;
    } bufs[] = {
        {&b->residual, (size_t)c->hidden_size},
        {&b->hidden, (size_t)c->hidden_size},
        {&b->q, qdim},
        {&b->k, kvdim},
        {&b->v, kvdim},
        {&b->attn, qdim},
        {&b->proj, (size_t)c->hidden_size},
        {&b->gate_up, 2 * (size_t)sh->intermediate_size},
        {&b->act, (size_t)sh->intermediate_size},
    };
    if (sh->size > 1) {
        size_t logits = (size_t)b->opt.limits.max_num_seqs * (size_t)sh->vocab_per_rank;
        b->local_logits = malloc(logits * sizeof(float));
        b->gathered_logits = malloc(logits * (size_t)sh->size * sizeof(float));
        if (b->local_logits == NULL || b->gathered_logits == NULL)
            return PAGODA_ENOMEM;
    }
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++) {
        *bufs[i].p = malloc(rows * bufs[i].cols * sizeof(float));
        if (*bufs[i].p == NULL)
            return PAGODA_ENOMEM;
    }
    return 0;
}

int cpu_backend_open(const struct model_weights *w, const struct kv_geometry *g, void *pool_base,
                     const struct cpu_backend_options *opt, struct backend **out)
{
    const struct model_config *c = &w->config;
    struct comm *comm = opt ? opt->comm : NULL;
    int tp_rank = comm ? comm_rank(comm) : 0, tp_size = comm ? comm_size(comm) : 1;
    if (w->shard.rank != tp_rank || w->shard.size != tp_size)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "the weights are the shard of rank %d of %d, the group's rank is "
                                "%d of %d",
                                w->shard.rank, w->shard.size, tp_rank, tp_size);
    /* A shard's pool holds its KV heads only, or the whole model's, of which the rank uses its
     * own run (ranks that are threads of one process sharing one pool). */
    struct model_config pool_view = *c;
    bool pool_whole = w->shard.size > 1 && g->num_kv_heads == c->num_kv_heads;
    if (!pool_whole)
        pool_view.num_kv_heads = w->shard.num_kv_heads;
    int rc = backend_check_pool(&pool_view, g, DTYPE_F32, "CPU");
    if (rc != 0)
        return rc;
    struct cpu_backend *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return PAGODA_ENOMEM;
    b->base.ops = &cpu_ops;
    b->base.config = *c;
    b->opt = opt ? *opt : cpu_backend_default_options();
    b->geometry = *g;
    b->pool_base = pool_base;
    b->shard = w->shard;
    b->pool_whole = pool_whole;
    b->kv_head_offset = w->shard.rank * w->shard.num_kv_heads;
    if (b->opt.limits.max_blocks_per_seq > g->num_blocks - 1)
        b->opt.limits.max_blocks_per_seq = g->num_blocks - 1;

    if ((rc = to_f32(&w->embed_tokens, &b->embed)) != 0 ||
        (rc = to_f32(&w->norm, &b->final_norm)) != 0)
        goto fail;
    if (w->lm_head.data != w->embed_tokens.data) {
        if ((rc = to_f32(&w->lm_head, &b->lm_head)) != 0)
            goto fail;
    } else {
        b->lm_head = b->embed;
    }
    if ((rc = load_layers(b, w)) != 0 || (rc = alloc_activations(b)) != 0)
        goto fail;

    b->inv_freq = malloc((size_t)c->head_dim / 2 * sizeof(float));
    if (b->inv_freq == NULL) {
        rc = PAGODA_ENOMEM;
        goto fail;
    }
    struct cpu_rope_params rp = {
        .type = (enum cpu_rope_type)c->rope.type,
        .theta = c->rope.theta,
        .factor = c->rope.factor,
        .low_freq_factor = c->rope.low_freq_factor,
        .high_freq_factor = c->rope.high_freq_factor,
        .original_max_position_embeddings = (double)c->rope.original_max_position_embeddings,
    };
    cpu_rope_inv_freq(&rp, c->head_dim, b->inv_freq);

    struct attention_config ac = {
        .impl = b->opt.attention,
        .num_heads = (int32_t)b->shard.num_heads,
        .num_kv_heads = (int32_t)b->shard.num_kv_heads,
        .head_dim = (int32_t)c->head_dim,
        .scale = (float)(1.0 / sqrt((double)c->head_dim)),
        .block_size = g->block_size,
        .num_blocks = g->num_blocks,
        .dtype = g->dtype,
        .max_num_seqs = b->opt.limits.max_num_seqs,
        .max_num_tokens = b->opt.limits.max_num_tokens,
        .max_blocks_per_seq = b->opt.limits.max_blocks_per_seq,
    };
    if ((rc = attention_plan_new(&ac, &b->plan)) != 0)
        goto fail;
    *out = &b->base;
    return 0;
fail:
    cpu_close(&b->base);
    return rc;
}

/* Sums buf[count] over the tensor-parallel group (nothing to do for one rank). */
static int tp_sum(struct cpu_backend *b, float *buf, int64_t count)
{
    if (b->opt.comm == NULL)
        return 0;
    return comm_all_reduce_sum(b->opt.comm, buf, (size_t)count, DTYPE_F32);
}

/* The LM head over the rows asked for. One rank writes logits directly; a tensor-parallel rank
 * computes its vocabulary rows, gathers every rank's, and lays them out as the whole
 * vocabulary, so every rank returns the same logits. */
static int lm_head(struct cpu_backend *b, const struct fwd_batch *batch, float *logits)
{
    const struct model_config *c = &b->base.config;
    const struct model_shard *sh = &b->shard;
    const int64_t hidden = c->hidden_size, vocab = c->vocab_size;
    if (sh->size == 1) {
        for (int32_t r = 0; r < batch->num_logits; r++)
            cpu_linear(b->hidden + (int64_t)batch->logits_indices[r] * hidden, b->lm_head, NULL,
                       logits + (int64_t)r * vocab, 1, hidden, vocab);
        return 0;
    }
    const int64_t per = sh->vocab_per_rank, mine = sh->vocab_end - sh->vocab_begin;
    for (int32_t r = 0; r < batch->num_logits; r++) {
        float *row = b->local_logits + (int64_t)r * per;
        cpu_linear(b->hidden + (int64_t)batch->logits_indices[r] * hidden, b->lm_head, NULL, row, 1,
                   hidden, mine);
        for (int64_t i = mine; i < per; i++)
            row[i] = 0.0f; /* the last rank's padding, dropped below */
    }
    int rc = comm_all_gather(b->opt.comm, b->local_logits, b->gathered_logits,
                             (size_t)(batch->num_logits * per), DTYPE_F32);
    if (rc != 0)
        return rc;
    for (int q = 0; q < sh->size; q++) {
        int64_t begin = per * q, len = begin + per <= vocab ? per : vocab - begin;
        const float *from = b->gathered_logits + (int64_t)q * batch->num_logits * per;
        for (int32_t r = 0; r < batch->num_logits; r++)
            memcpy(logits + (int64_t)r * vocab + begin, from + (int64_t)r * per,
                   (size_t)len * sizeof(float));
    }
    return 0;
}

/* The forward pass. With tensor parallelism (Megatron): the embedding rows outside the rank's
 * vocabulary are zeros and the lookups are summed; Q, K, V and gate/up produce the rank's heads
 * and MLP columns; O and down produce partial sums, summed by one all-reduce each (O's bias
 * added once, after it); the logits are gathered (lm_head). The sums add the ranks in rank
 * order, so every rank holds the same residual stream bit for bit. */
static int cpu_forward(struct backend *base, const struct fwd_batch *batch, float *logits)
{
    struct cpu_backend *b = (struct cpu_backend *)base;
    const struct model_config *c = &b->base.config;
    const struct model_shard *sh = &b->shard;
    int rc = backend_check_batch(&b->base.config, &b->opt.limits, batch);
    if (rc != 0)
        return rc;
    struct attention_batch ab = backend_attention_batch(batch);
    if ((rc = attention_plan(b->plan, &ab)) != 0)
        return rc;

    const int64_t n = batch->num_tokens, hidden = c->hidden_size, hd = c->head_dim;
    const int64_t qdim = sh->num_heads * hd, kvdim = sh->num_kv_heads * hd;
    const int64_t inter = sh->intermediate_size;
    const float eps = (float)c->rms_norm_eps;
    const bool split = sh->size > 1;

    for (int64_t t = 0; t < n; t++) {
        int64_t id = batch->token_ids[t];
        float *row = b->residual + t * hidden;
        if (id >= sh->vocab_begin && id < sh->vocab_end)
            memcpy(row, b->embed + (id - sh->vocab_begin) * hidden, (size_t)hidden * sizeof(float));
        else
            memset(row, 0, (size_t)hidden * sizeof(float));
    }
    if ((rc = tp_sum(b, b->residual, n * hidden)) != 0)
        return rc;
    memset(b->proj, 0, (size_t)(n * hidden) * sizeof(float));

    for (int64_t i = 0; i < c->num_layers; i++) {
        const struct cpu_layer *l = &b->layers[i];
        /* Attention block: the previous block's output (proj) joins the residual stream. */
        cpu_add_rmsnorm(b->residual, b->proj, l->input_norm, b->hidden, n, hidden, eps);
        cpu_linear(b->hidden, l->wq, l->bq, b->q, n, hidden, qdim);
        cpu_linear(b->hidden, l->wk, l->bk, b->k, n, hidden, kvdim);
        cpu_linear(b->hidden, l->wv, l->bv, b->v, n, hidden, kvdim);
        cpu_rope(b->q, batch->positions, b->inv_freq, n, sh->num_heads, hd);
        cpu_rope(b->k, batch->positions, b->inv_freq, n, sh->num_kv_heads, hd);
        struct kv_layer_view kv = kv_layer_view_make(&b->geometry, b->pool_base, (int32_t)i);
        if (b->pool_whole) {
            size_t skip = (size_t)(b->kv_head_offset * kv.head_stride) * sizeof(float);
            kv.k = (char *)kv.k + skip;
            kv.v = (char *)kv.v + skip;
            kv.num_kv_heads = (int32_t)sh->num_kv_heads;
        }
        if ((rc = attention_write_kv(&kv, (int32_t)n, batch->slot_mapping, b->k, b->v)) != 0 ||
            (rc = attention_run(b->plan, &kv, b->q, b->attn)) != 0)
            return rc;
        cpu_linear(b->attn, l->wo, split ? NULL : l->bo, b->proj, n, qdim, hidden);
        if (split) {
            if ((rc = tp_sum(b, b->proj, n * hidden)) != 0)
                return rc;
            if (l->bo != NULL)
                for (int64_t t = 0; t < n; t++)
                    for (int64_t j = 0; j < hidden; j++)
                        b->proj[t * hidden + j] += l->bo[j];
        }

        /* MLP block. */
        cpu_add_rmsnorm(b->residual, b->proj, l->post_norm, b->hidden, n, hidden, eps);
        cpu_linear(b->hidden, l->w_gate_up, NULL, b->gate_up, n, hidden, 2 * inter);
        cpu_silu_mul(b->gate_up, b->act, n, inter);
        cpu_linear(b->act, l->w_down, NULL, b->proj, n, inter, hidden);
        if ((rc = tp_sum(b, b->proj, n * hidden)) != 0)
            return rc;
    }
    cpu_add_rmsnorm(b->residual, b->proj, b->final_norm, b->hidden, n, hidden, eps);
    return lm_head(b, batch, logits);
}

static const struct backend_ops cpu_ops = {
    .name = "cpu",
    .forward = cpu_forward,
    .close = cpu_close,
};
