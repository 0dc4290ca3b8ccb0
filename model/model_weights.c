#include "model/model_weights.h"
#include "common/error.h"
#include "model/safetensors.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Binding state: the open files and which of their tensors have been bound. */
struct binder {
    const struct safetensors_set *set;
    bool *used; /* [safetensors_set_count] */
};

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

/* Binds the tensor called name, of shape [d0] (d1 < 0) or [d0, d1], to *view. A missing
 * tensor is PAGODA_ENOENT with a detail when required, and without one (for the caller to
 * decide) when not. */
static int bind_tensor(struct binder *b, const char *name, int64_t d0, int64_t d1, bool required,
                       struct tensor_view *view)
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
    return 0;
}

/* Binds "model.layers.<layer>.<suffix>". */
static int bind_layer(struct binder *b, int64_t layer, const char *suffix, int64_t d0, int64_t d1,
                      struct tensor_view *view)
{
    char name[SAFETENSORS_MAX_NAME + 1];
    snprintf(name, sizeof(name), "model.layers.%lld.%s", (long long)layer, suffix);
    return bind_tensor(b, name, d0, d1, true, view);
}

static int bind_layers(struct binder *b, const struct model_config *c,
                       struct model_weights_layer *layers)
{
    int64_t hidden = c->hidden_size, inter = c->intermediate_size;
    int64_t q_dim = c->num_heads * c->head_dim, kv_dim = c->num_kv_heads * c->head_dim;
    int rc = 0;
    for (int64_t i = 0; i < c->num_layers && rc == 0; i++) {
        struct model_weights_layer *l = &layers[i];
        if ((rc = bind_layer(b, i, "input_layernorm.weight", hidden, -1, &l->input_layernorm)) ||
            (rc = bind_layer(b, i, "self_attn.q_proj.weight", q_dim, hidden, &l->q_proj)) ||
            (rc = bind_layer(b, i, "self_attn.k_proj.weight", kv_dim, hidden, &l->k_proj)) ||
            (rc = bind_layer(b, i, "self_attn.v_proj.weight", kv_dim, hidden, &l->v_proj)) ||
            (rc = bind_layer(b, i, "self_attn.o_proj.weight", hidden, q_dim, &l->o_proj)) ||
            (rc = bind_layer(b, i, "post_attention_layernorm.weight", hidden, -1,
                             &l->post_attention_layernorm)) ||
            (rc = bind_layer(b, i, "mlp.gate_proj.weight", inter, hidden, &l->gate_proj)) ||
            (rc = bind_layer(b, i, "mlp.up_proj.weight", inter, hidden, &l->up_proj)) ||
            (rc = bind_layer(b, i, "mlp.down_proj.weight", hidden, inter, &l->down_proj)))
            break;
        if (c->qkv_bias &&
            ((rc = bind_layer(b, i, "self_attn.q_proj.bias", q_dim, -1, &l->q_bias)) ||
             (rc = bind_layer(b, i, "self_attn.k_proj.bias", kv_dim, -1, &l->k_bias)) ||
             (rc = bind_layer(b, i, "self_attn.v_proj.bias", kv_dim, -1, &l->v_bias))))
            break;
        if (c->o_bias && (rc = bind_layer(b, i, "self_attn.o_proj.bias", hidden, -1, &l->o_bias)))
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
    struct binder b = {.set = w->files};
    b.used = calloc(safetensors_set_count(w->files) + 1, sizeof(*b.used));
    if (b.used == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    int rc;
    if ((rc = bind_tensor(&b, "model.embed_tokens.weight", c->vocab_size, c->hidden_size, true,
                          &w->embed_tokens)) != 0 ||
        (rc = bind_tensor(&b, "model.norm.weight", c->hidden_size, -1, true, &w->norm)) != 0 ||
        (rc = bind_layers(&b, c, w->layers)) != 0)
        goto done;
    rc = bind_tensor(&b, "lm_head.weight", c->vocab_size, c->hidden_size, !c->tie_word_embeddings,
                     &w->lm_head);
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
    int rc;
    struct model_weights *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "%s: out of memory", model_dir);
    if ((rc = model_config_load(model_dir, &w->config)) != 0 ||
        (rc = safetensors_set_open(model_dir, &w->files)) != 0)
        goto fail;
    /* num_layers is bounded by model_config_validate. */
    w->layers = calloc((size_t)w->config.num_layers, sizeof(*w->layers));
    if (w->layers == NULL) {
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
    free(w->layers);
    free(w);
}
