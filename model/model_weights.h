/* A model's weights: config.json plus the safetensors files of a model directory, with every
 * tensor the architecture needs found, checked against the config and bound by role.
 *
 * Nothing is copied: each view points into the read-only mappings, which live until
 * model_weights_close. Tensors may each be BF16, F16 or F32 (one checkpoint may mix them);
 * shapes must match the config exactly. A checkpoint holding a tensor pagoda would not use is
 * refused too (rotary inv_freq buffers excepted, which are recomputed from the config): a
 * leftover tensor usually means the config and the weights describe different models. */
#ifndef PAGODA_MODEL_MODEL_WEIGHTS_H
#define PAGODA_MODEL_MODEL_WEIGHTS_H

#include "common/dtype.h"
#include "model/model_config.h"
#include "model/model_shard.h"

#include <stddef.h>
#include <stdint.h>

/* One weight: a row-major array in the mapping. An absent optional weight (a bias the config
 * does not call for) has name == NULL, data == NULL and nbytes == 0. */
struct tensor_view {
    const char *name; /* the checkpoint's name, e.g. "model.layers.0.self_attn.q_proj.weight" */
    enum dtype dtype;
    int ndim;
    int64_t shape[4];
    const void *data; /* aligned to dtype_size(dtype) */
    size_t nbytes;
};

/* The weights of one decoder layer. Projections are [out_features, in_features], as
 * torch.nn.Linear stores them. The shapes are those of the whole model; a tensor-parallel
 * shard's views (model_weights_open_shard) have the shard's shapes instead: rows of Q, K, V,
 * gate and up (and of the Q/K/V biases), columns of O and down, as model_shard.h says. */
struct model_weights_layer {
    struct tensor_view input_layernorm;          /* [hidden] */
    struct tensor_view q_proj;                   /* [heads * head_dim, hidden] */
    struct tensor_view k_proj;                   /* [kv_heads * head_dim, hidden] */
    struct tensor_view v_proj;                   /* [kv_heads * head_dim, hidden] */
    struct tensor_view o_proj;                   /* [hidden, heads * head_dim] */
    struct tensor_view q_bias;                   /* [heads * head_dim] when config.qkv_bias */
    struct tensor_view k_bias;                   /* [kv_heads * head_dim] when config.qkv_bias */
    struct tensor_view v_bias;                   /* [kv_heads * head_dim] when config.qkv_bias */
    struct tensor_view o_bias;                   /* [hidden] when config.o_bias */
    struct tensor_view post_attention_layernorm; /* [hidden] */
    struct tensor_view gate_proj;                /* [intermediate, hidden] */
    struct tensor_view up_proj;                  /* [intermediate, hidden] */
    struct tensor_view down_proj;                /* [hidden, intermediate] */
};

struct safetensors_set;

struct model_weights {
    struct model_config config;
    struct tensor_view embed_tokens; /* [vocab, hidden] */
    struct tensor_view norm;         /* [hidden], the final RMSNorm */
    /* [vocab, hidden]: lm_head.weight; when the config ties embeddings and the checkpoint has
     * no lm_head.weight, the same view as embed_tokens. */
    struct tensor_view lm_head;
    struct model_weights_layer *layers; /* config.num_layers of them */
    /* The part of the model these views hold (model_shard_whole for model_weights_open). The
     * embedding and LM head views are its vocabulary rows. */
    struct model_shard shard;
    struct safetensors_set *files; /* private: the mappings the views point into */
    /* private: copies of the row-parallel slices (O and down), whose columns are not
     * contiguous in the files; num_owned of them. */
    void **owned;
    size_t num_owned;
};

/* Loads model_dir/config.json (model_config_load), opens the weights (safetensors_set_open:
 * model.safetensors or a sharded index) and binds every tensor the architecture needs. On
 * success *out is the caller's, to be closed with model_weights_close. Errors, each with a
 * detail naming the tensor or field: those of model_config_load and safetensors_set_open;
 * PAGODA_ENOENT ("tensor model.layers.3.mlp.up_proj.weight is missing"); PAGODA_EMISMATCH (a
 * shape that differs from the config's: "tensor X has shape [a, b], config expects [c, d]",
 * or a tensor the config does not call for); PAGODA_ENOMEM. */
int model_weights_open(const char *model_dir, struct model_weights **out);

/* model_weights_open for rank's shard of a tensor-parallel group of size ranks (model_shard.h):
 * every tensor is found and checked against the whole model's shape as model_weights_open
 * does, then the views are bound to the rank's slice only. Column-parallel and vocabulary
 * slices point into the mapping (only their pages are ever read); the row-parallel slices (O
 * and down) are copied out, column run by column run, into memory the weights own. Extra
 * errors: those of model_shard_make (a size that does not divide the heads, KV heads or
 * intermediate size: PAGODA_EUNSUPPORTED naming the field). Size 1 is model_weights_open. */
int model_weights_open_shard(const char *model_dir, int rank, int size, struct model_weights **out);

/* Unmaps the files and frees w; every view becomes invalid. Accepts NULL. */
void model_weights_close(struct model_weights *w);

#endif
