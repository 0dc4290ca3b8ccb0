/* The model's configuration, as read from a Hugging Face config.json.
 *
 * Supported: LlamaForCausalLM, MistralForCausalLM and Qwen2ForCausalLM with RoPE of type
 * default, linear or llama3, in either spelling real files use (`rope_theta` + `rope_scaling`,
 * or transformers 5's `rope_parameters`). Anything else that changes the math (another
 * architecture, rope type or dtype, an active sliding window) is refused by name rather than
 * silently computed wrong. */
#ifndef PAGODA_MODEL_MODEL_CONFIG_H
#define PAGODA_MODEL_MODEL_CONFIG_H

#include "common/dtype.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

/* The most EOS ids a model's config and generation_config.json name together. */
#define MODEL_MAX_EOS 16
/* config.json files larger than this are refused (real ones are a few KiB). */
#define MODEL_CONFIG_MAX_BYTES (1u << 20)

enum model_arch { MODEL_ARCH_LLAMA = 0, MODEL_ARCH_MISTRAL = 1, MODEL_ARCH_QWEN2 = 2 };

enum rope_type { ROPE_DEFAULT = 0, ROPE_LINEAR = 1, ROPE_LLAMA3 = 2 };

struct rope_config {
    enum rope_type type;
    double theta;  /* base of the inverse frequencies */
    double factor; /* linear and llama3: the scaling factor; 1 for default */
    /* llama3 only */
    double low_freq_factor;
    double high_freq_factor;
    int64_t original_max_position_embeddings;
};

struct model_config {
    enum model_arch arch;
    int64_t vocab_size;
    int64_t hidden_size;
    int64_t intermediate_size;
    int64_t num_layers;   /* num_hidden_layers */
    int64_t num_heads;    /* num_attention_heads */
    int64_t num_kv_heads; /* num_key_value_heads, num_heads when absent */
    int64_t head_dim;     /* head_dim, hidden_size / num_heads when absent */
    double rms_norm_eps;
    bool tie_word_embeddings;
    /* Q, K and V projections carry a bias (Qwen2 always; Llama with attention_bias, which
     * also gives o_proj a bias: see o_bias). */
    bool qkv_bias;
    bool o_bias;
    int32_t bos_token_id; /* -1 when absent */
    int32_t eos_token_ids[MODEL_MAX_EOS];
    int num_eos;
    int64_t max_position_embeddings;
    struct rope_config rope;
    enum dtype dtype; /* torch_dtype / dtype: the dtype the weights are stored in */
};

/* The architecture's class name ("LlamaForCausalLM", ...) and model_type ("llama", ...). */
const char *model_arch_class(enum model_arch arch);
const char *model_arch_type(enum model_arch arch);

/* Parses a config.json document into *out. Errors: PAGODA_EUNSUPPORTED (an architecture,
 * rope type or dtype pagoda does not support, or an active sliding window), PAGODA_EFORMAT (a
 * field of the wrong type or missing), PAGODA_ERANGE (a value that cannot be right),
 * PAGODA_EMISMATCH (two fields that must agree do not: model_type and architectures, dtype and
 * torch_dtype, rope_parameters and rope_theta/rope_scaling), each with a detail
 * (pagoda_error_detail) that names the field. */
int model_config_parse(const json_t *root, struct model_config *out);

/* Reads DIR/config.json and parses it, then adds DIR/generation_config.json's eos_token_id (when
 * the file is there) to the config's eos_token_ids, as transformers' generate and vLLM stop at
 * them too. Same errors, plus those of opening the files (an absent generation_config.json is
 * not one); a detail names the file. On an error *out may hold config.json's parse. Reads no
 * tokenizer file: what loads a model's shape or weights (kvpool, every tensor-parallel rank,
 * model_weights_open, the benchmarks) needs no stop ids; see model_config_add_tokenizer_eos. */
int model_config_load(const char *model_dir, struct model_config *out);

/* Adds the tokenizer's EOS to c's eos_token_ids, as vLLM stops at the tokenizer's eos_token_id
 * beside generation_config.json's: tokenizer_config.json's eos_token (special_tokens_map.json's
 * where the first has no added_tokens_decoder or is absent), its id from added_tokens_decoder,
 * else tokenizer.json's vocabulary or added_tokens (model_config.c says why each). For what stops
 * generation by c's EOS ids: the worker that announces them to the scheduler (rank 0 of a
 * tensor-parallel group), pagoda-run, pagoda-model-info. Read at its best: no eos_token, a file
 * that cannot be read or is not JSON, a text no token has, an id past c->vocab_size or no room
 * left adds nothing, and note (note_size bytes, or NULL) then says why where a file or the token
 * is there (empty otherwise), for the caller to warn of; only an eos_token that is neither a
 * string nor an object with a string "content" is an error (PAGODA_EFORMAT, the detail naming
 * the file). */
int model_config_add_tokenizer_eos(const char *model_dir, struct model_config *c, char *note,
                                   size_t note_size);

/* The sampling defaults a model's generation_config.json recommends (what vLLM applies to a
 * request that leaves them out, --generation-config auto): the fields named in set, each a value
 * other than transformers' own default (model_config.c says which). */
enum {
    MODEL_GEN_TEMPERATURE = 1u << 0,
    MODEL_GEN_TOP_P = 1u << 1,
    MODEL_GEN_TOP_K = 1u << 2,
    MODEL_GEN_MIN_P = 1u << 3,
    MODEL_GEN_REPETITION_PENALTY = 1u << 4,
};
struct model_generation_defaults {
    unsigned set;     /* MODEL_GEN_* */
    const char *file; /* where they come from: "generation_config.json", or "config.json" */
    double temperature, top_p, min_p, repetition_penalty;
    int32_t top_k; /* 0: off (the file's negative top_k) */
};

/* Reads DIR/generation_config.json's temperature, top_p, top_k, min_p and repetition_penalty
 * into *out, or config.json's where that file is absent, as vLLM does (set 0 when neither names
 * one). Types are checked here (PAGODA_EFORMAT, the detail
 * naming the file and the field), ranges by the caller (the sampler's one definition). Errors
 * also those of reading the file (a symbolic link to nothing, not JSON). */
int model_generation_defaults_load(const char *model_dir, struct model_generation_defaults *out);

/* Checks that a config is self-consistent (positive sizes, heads divisible by KV heads, ...).
 * model_config_parse calls it; pagoda-mkmodel calls it on what it is asked to write. */
int model_config_validate(const struct model_config *cfg);

/* Fills *out with the `tiny` preset: Llama, vocabulary 512, hidden 256, 4 layers, 4 heads,
 * 2 KV heads, head dim 64, intermediate 688, rope theta 10000, eps 1e-5, untied, BF16, 2048
 * positions, BOS 1, EOS 2. */
void model_config_tiny(struct model_config *out);

/* Serialises cfg as a config.json that Hugging Face transformers loads. legacy_rope selects
 * the older spelling (`rope_theta` + `rope_scaling`) instead of `rope_parameters`. On success
 * *out is a new reference. Errors: PAGODA_ENOMEM. */
int model_config_to_json(const struct model_config *cfg, bool legacy_rope, json_t **out);

#endif
