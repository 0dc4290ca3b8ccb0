#include "model/model_weights.h"
#include "common/error.h"
#include "model/safetensors.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Binding state: the open files, which of their tensors have been bound, and the shard. */
struct binder {
    const struct safetensors_set *set;
    bool *used; /* [safetensors_set_count] */
    struct model_weights *w;
};

/* The part of a tensor a shard binds: all of it (dim < 0), rows [begin, begin + len) (dim 0),
 * or columns [begin, begin + len) of a 2-D tensor (dim 1). */
struct slice {
    int dim;
    int64_t begin, len;
};

static const struct slice WHOLE = {.dim = -1};

static struct slice rows_of(int64_t begin, int64_t len)
{
    return (struct slice){.dim = 0, .begin = begin, .len = len};
}

static struct slice cols_of(int64_t begin, int64_t len)
{
    return (struct slice){.dim = 1, .begin = begin, .len = len};
}

static const char *format_shape(char *buf, size_t len, const int64_t *shape, int ndim)
{
    size_t used = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < ndim && used < len; i++)
        used +=
            (size_t)snprintf(buf + used, len - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < len)
        snprintf(buf + used, len - used, "]");
    return buf;
}

/* Points view at its slice sl. Rows are contiguous in the mapping; columns are copied into a
 * buffer the weights own (w->owned has room for every one of them: see open_shard). */
static int apply_slice(struct binder *b, struct slice sl, struct tensor_view *view)
{
    size_t esize = dtype_size(view->dtype);
    if (sl.dim == 0) {
        int64_t row = view->ndim == 2 ? view->shape[1] : 1;
        view->data = (const char *)view->data + (size_t)(sl.begin * row) * esize;
        view->shape[0] = sl.len;
        view->nbytes = (size_t)(sl.len * row) * esize;
        return 0;
    }
    int64_t rows = view->shape[0], cols = view->shape[1];
    char *copy = malloc((size_t)(rows * sl.len) * esize);
    if (copy == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory for its shard", view->name);
    for (int64_t r = 0; r < rows; r++)
        memcpy(copy + (size_t)(r * sl.len) * esize,
               (const char *)view->data + (size_t)(r * cols + sl.begin) * esize,
               (size_t)sl.len * esize);
    b->w->owned[b->w->num_owned++] = copy;
    view->data = copy;
    view->shape[1] = sl.len;
    view->nbytes = (size_t)(rows * sl.len) * esize;
    return 0;
}

/* Binds the tensor called name, of shape [d0] (d1 < 0) or [d0, d1], to *view, then narrows it
 * to sl. A missing tensor is PAGODA_ENOENT with a detail when required, and without one (for
 * the caller to decide) when not. */
static int bind_slice(struct binder *b, const char *name, int64_t d0, int64_t d1, bool required,
                      struct slice sl, struct tensor_view *view)
{
    const struct safetensors_tensor *t;
    size_t index;
    if (safetensors_set_find(b->set, name, &t, &index) != 0) {
        if (!required)
            return PAGODA_ENOENT;
        return pagoda_error_set(PAGODA_ENOENT, "tensor %s is missing", name);
    }
    int64_t want[2] = {d0, d1};
    int ndim = d1 < 0 ? 1 : 2;
    if (t->ndim != ndim || t->shape[0] != want[0] || (ndim == 2 && t->shape[1] != want[1])) {
        char have_s[160], want_s[64];
        return pagoda_error_set(PAGODA_EMISMATCH, "tensor %s has shape %s, config expects %s", name,
                                format_shape(have_s, sizeof(have_s), t->shape, t->ndim),
                                format_shape(want_s, sizeof(want_s), want, ndim));
    }
    *view = (struct tensor_view){
        .name = t->name, .dtype = t->dtype, .ndim = ndim, .data = t->data, .nbytes = t->nbytes};
    view->shape[0] = d0;
    view->shape[1] = ndim == 2 ? d1 : 0;
    b->used[index] = true;
    return sl.dim < 0 ? 0 : apply_slice(b, sl, view);
}

static int bind_tensor(struct binder *b, const char *name, int64_t d0, int64_t d1, bool required,
                       struct tensor_view *view)
{
    return bind_slice(b, name, d0, d1, required, WHOLE, view);
}

/* Binds "model.layers.<layer>.<suffix>", narrowed to sl. */
static int bind_layer(struct binder *b, int64_t layer, const char *suffix, int64_t d0, int64_t d1,
                      struct slice sl, struct tensor_view *view)
{
    char name[SAFETENSORS_MAX_NAME + 1];
    snprintf(name, sizeof(name), "model.layers.%lld.%s", (long long)layer, suffix);
    return bind_slice(b, name, d0, d1, true, sl, view);
}

static int bind_layers(struct binder *b, const struct model_config *c,
                       struct model_weights_layer *layers)
{
    const struct model_shard *sh = &b->w->shard;
    int64_t hidden = c->hidden_size, inter = c->intermediate_size;
    int64_t q_dim = c->num_heads * c->head_dim, kv_dim = c->num_kv_heads * c->head_dim;
    /* This rank's runs: its heads' rows of Q (columns of O), of K and V, its MLP columns. A
     * whole model is the shard of rank 0 of 1, whose slices are everything. */
    int64_t q_len = sh->num_heads * c->head_dim, kv_len = sh->num_kv_heads * c->head_dim;
    int64_t i_len = sh->intermediate_size;
    bool split = sh->size > 1;
    struct slice q_rows = split ? rows_of(sh->rank * q_len, q_len) : WHOLE;
    struct slice kv_rows = split ? rows_of(sh->rank * kv_len, kv_len) : WHOLE;
    struct slice i_rows = split ? rows_of(sh->rank * i_len, i_len) : WHOLE;
    struct slice q_cols = split ? cols_of(sh->rank * q_len, q_len) : WHOLE;
    struct slice i_cols = split ? cols_of(sh->rank * i_len, i_len) : WHOLE;
    int rc = 0;
    for (int64_t i = 0; i < c->num_layers && rc == 0; i++) {
        struct model_weights_layer *l = &layers[i];
        if ((rc = bind_layer(b, i, "input_layernorm.weight", hidden, -1, WHOLE,
                             &l->input_layernorm)) ||
            (rc = bind_layer(b, i, "self_attn.q_proj.weight", q_dim, hidden, q_rows, &l->q_proj)) ||
            (rc = bind_layer(b, i, "self_attn.k_proj.weight", kv_dim, hidden, kv_rows,
                             &l->k_proj)) ||
            (rc = bind_layer(b, i, "self_attn.v_proj.weight", kv_dim, hidden, kv_rows,
                             &l->v_proj)) ||
            (rc = bind_layer(b, i, "self_attn.o_proj.weight", hidden, q_dim, q_cols, &l->o_proj)) ||
            (rc = bind_layer(b, i, "post_attention_layernorm.weight", hidden, -1, WHOLE,
                             &l->post_attention_layernorm)) ||
            (rc = bind_layer(b, i, "mlp.gate_proj.weight", inter, hidden, i_rows, &l->gate_proj)) ||
            (rc = bind_layer(b, i, "mlp.up_proj.weight", inter, hidden, i_rows, &l->up_proj)) ||
            (rc = bind_layer(b, i, "mlp.down_proj.weight", hidden, inter, i_cols, &l->down_proj)))
            break;
        if (c->qkv_bias &&
            ((rc = bind_layer(b, i, "self_attn.q_proj.bias", q_dim, -1, q_rows, &l->q_bias)) ||
             (rc = bind_layer(b, i, "self_attn.k_proj.bias", kv_dim, -1, kv_rows, &l->k_bias)) ||
             (rc = bind_layer(b, i, "self_attn.v_proj.bias", kv_dim, -1, kv_rows, &l->v_bias))))
            break;
        if (c->o_bias &&
            (rc = bind_layer(b, i, "self_attn.o_proj.bias", hidden, -1, WHOLE, &l->o_bias)))
            break;
    }
    return rc;
}

/* True for the rotary inverse-frequency buffers older checkpoints saved
 * ("model.layers.0.self_attn.rotary_emb.inv_freq", "model.rotary_emb.inv_freq"): pagoda
 * computes them from the config, as transformers does. */
static bool is_rotary_buffer(const char *name)
{
    static const char suffix[] = "rotary_emb.inv_freq";
    size_t len = strlen(name), slen = sizeof(suffix) - 1;
    return len >= slen && strcmp(name + len - slen, suffix) == 0;
}

/* Refuses tensors nothing was bound to. Ignoring them would be easy, but a user would want to
 * know: an unused tensor (an MLP bias, a layer beyond num_hidden_layers, a quantisation
 * scale) means the weights are not the model the config describes, and serving it anyway
 * would give wrong output without a word. */
static int check_unused(const struct binder *b, const struct model_config *c)
{
    size_t count = safetensors_set_count(b->set), unused = 0;
    const char *first = NULL;
    for (size_t i = 0; i < count; i++) {
        const char *name = safetensors_set_tensor_at(b->set, i)->name;
        if (b->used[i] || is_rotary_buffer(name))
            continue;
        if (first == NULL)
            first = name;
        unused++;
    }
    if (first == NULL)
        return 0;
    return pagoda_error_set(PAGODA_EMISMATCH,
                            "tensor %s is not used by %s with this config.json (%zu unused "
                            "tensor%s in all)",
                            first, model_arch_class(c->arch), unused, unused == 1 ? "" : "s");
}

static int bind_all(struct model_weights *w)
{
    const struct model_config *c = &w->config;
    struct binder b = {.set = w->files, .w = w};
    const struct model_shard *sh = &w->shard;
    struct slice vocab_rows =
        sh->size > 1 ? rows_of(sh->vocab_begin, sh->vocab_end - sh->vocab_begin) : WHOLE;
    b.used = calloc(safetensors_set_count(w->files) + 1, sizeof(*b.used));
    if (b.used == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    int rc;
    if ((rc = bind_slice(&b, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, true,
                         vocab_rows, &w->embed_tokens)) != 0 ||
        (rc = bind_tensor(&b, "model.norm.weight", c->hidden_size, -1, true, &w->norm)) != 0 ||
        (rc = bind_layers(&b, c, w->layers)) != 0)
        goto done;
    rc = bind_slice(&b, "lm_head.weight", c->vocab_size, c->hidden_size, !c->tie_word_embeddings,
                    vocab_rows, &w->lm_head);
    if (rc == PAGODA_ENOENT && c->tie_word_embeddings) {
        w->lm_head = w->embed_tokens;
        rc = 0;
    }
    if (rc == 0)
        rc = check_unused(&b, c);
done:
    free(b.used);
    return rc;
}

int model_weights_open(const char *model_dir, struct model_weights **out)
{
    return model_weights_open_shard(model_dir, 0, 1, out);
}

int model_weights_open_shard(const char *model_dir, int rank, int size, struct model_weights **out)
{
    int rc;
    struct model_weights *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", model_dir);
    if ((rc = model_config_load(model_dir, &w->config)) != 0 ||
        (rc = model_shard_make(&w->config, rank, size, &w->shard)) != 0 ||
        (rc = safetensors_set_open(model_dir, &w->files)) != 0)
        goto fail;
    /* num_layers is bounded by model_config_validate. Each layer of a shard copies two
     * row-parallel slices (O and down). */
    w->layers = calloc((size_t)w->config.num_layers, sizeof(*w->layers));
    w->owned = calloc(2 * (size_t)w->config.num_layers, sizeof(*w->owned));
    if (w->layers == NULL || w->owned == NULL) {
        rc = pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", model_dir);
        goto fail;
    }
    if ((rc = bind_all(w)) != 0)
        goto fail;
    *out = w;
    return 0;
fail:
    model_weights_close(w);
    return rc;
}

void model_weights_close(struct model_weights *w)
{
    if (w == NULL)
        return;
    safetensors_set_close(w->files);
    for (size_t i = 0; i < w->num_owned; i++)
        free(w->owned[i]);
    free(w->owned);
    free(w->layers);
    free(w);
}
