#include "model/model_config.h"
#include "common/error.h"
#include "common/json_util.h"

#include <limits.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every detail recorded while parsing starts with this, so that a user reading "rope type
 * "yarn" is not supported" knows which file to look at. model_config_load replaces it with the
 * full path. */
#define CFG "config.json: "

/* Upper bounds that no real model reaches. They keep every product of two sizes (weight
 * shapes, byte counts) far inside int64_t, so that the weight loader need not check overflow.
 * The vocabulary and the positions are the scheduler's bounds (scheduler.h SCHEDULER_MAX_VOCAB and
 * SCHEDULER_MAX_POSITIONS, 2^24: it refuses a worker's Hello past them), so that a model past them
 * is refused where it is read, by name, instead of loading in a worker the scheduler never takes
 * (which left pagoda-up waiting for its whole --timeout). */
#define MAX_VOCAB (INT64_C(1) << 24)
#define MAX_HIDDEN (INT64_C(1) << 18)
#define MAX_INTERMEDIATE (INT64_C(1) << 20)
#define MAX_LAYERS 1024
#define MAX_HEADS 1024
#define MAX_HEAD_DIM 1024
#define MAX_POSITIONS (INT64_C(1) << 24)

static const struct {
    const char *class_name;
    const char *type;
} arch_names[] = {
    [MODEL_ARCH_LLAMA] = {"LlamaForCausalLM", "llama"},
    [MODEL_ARCH_MISTRAL] = {"MistralForCausalLM", "mistral"},
    [MODEL_ARCH_QWEN2] = {"Qwen2ForCausalLM", "qwen2"},
};
#define NUM_ARCHS (sizeof(arch_names) / sizeof(arch_names[0]))

static const char *const rope_names[] = {
    [ROPE_DEFAULT] = "default",
    [ROPE_LINEAR] = "linear",
    [ROPE_LLAMA3] = "llama3",
};
#define NUM_ROPE_TYPES (sizeof(rope_names) / sizeof(rope_names[0]))

const char *model_arch_class(enum model_arch arch)
{
    return (unsigned)arch < NUM_ARCHS ? arch_names[arch].class_name : "?";
}

const char *model_arch_type(enum model_arch arch)
{
    return (unsigned)arch < NUM_ARCHS ? arch_names[arch].type : "?";
}

/* Re-records the current detail (set by a json_util getter, which names only the key) with
 * the file and, for nested objects, the enclosing key in front. */
static int with_context(int rc, const char *where)
{
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
    if (where != NULL)
        return pagoda_error_set(rc, CFG "%s: %s", where, detail);
    return pagoda_error_set(rc, CFG "%s", detail);
}

/* Optional fields: 0, or PAGODA_ENOENT (absent or null, nothing recorded), or an error whose
 * detail names the field. */
static int opt_int(const json_t *obj, const char *where, const char *key, int64_t *out)
{
    int rc = json_util_get_int(obj, key, out);
    return rc != 0 && rc != PAGODA_ENOENT ? with_context(rc, where) : rc;
}

static int opt_number(const json_t *obj, const char *where, const char *key, double *out)
{
    int rc = json_util_get_number(obj, key, out);
    return rc != 0 && rc != PAGODA_ENOENT ? with_context(rc, where) : rc;
}

static int opt_bool(const json_t *obj, const char *key, bool *out)
{
    int rc = json_util_get_bool(obj, key, out);
    return rc != 0 && rc != PAGODA_ENOENT ? with_context(rc, NULL) : rc;
}

static int opt_string(const json_t *obj, const char *where, const char *key, const char **out)
{
    int rc = json_util_get_string(obj, key, out);
    return rc != 0 && rc != PAGODA_ENOENT ? with_context(rc, where) : rc;
}

static int missing(const char *where, const char *key)
{
    if (where != NULL)
        return pagoda_error_set(PAGODA_EFORMAT, CFG "%s: \"%s\" is missing", where, key);
    return pagoda_error_set(PAGODA_EFORMAT, CFG "\"%s\" is missing", key);
}

/* Required fields: as above, but absence is PAGODA_EFORMAT with a detail. */
static int req_int(const json_t *obj, const char *where, const char *key, int64_t *out)
{
    int rc = opt_int(obj, where, key, out);
    return rc == PAGODA_ENOENT ? missing(where, key) : rc;
}

static int req_number(const json_t *obj, const char *where, const char *key, double *out)
{
    int rc = opt_number(obj, where, key, out);
    return rc == PAGODA_ENOENT ? missing(where, key) : rc;
}

/* Finds the architecture from `architectures` (exactly one class) and checks that
 * `model_type`, when present, names the same one. Without `architectures`, `model_type` alone
 * decides, as transformers' AutoModelForCausalLM does. */
static int parse_arch(const json_t *root, enum model_arch *out)
{
    const char *model_type = NULL;
    int rc = opt_string(root, NULL, "model_type", &model_type);
    if (rc != 0 && rc != PAGODA_ENOENT)
        return rc;

    json_t *archs = json_object_get(root, "architectures");
    if (archs == NULL || json_is_null(archs)) {
        if (model_type == NULL)
            return pagoda_error_set(PAGODA_EFORMAT,
                                    CFG "neither \"architectures\" nor \"model_type\" is given");
        for (size_t a = 0; a < NUM_ARCHS; a++) {
            if (strcmp(model_type, arch_names[a].type) == 0) {
                *out = (enum model_arch)a;
                return 0;
            }
        }
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                CFG "model_type \"%s\" is not supported (llama, mistral, qwen2)",
                                model_type);
    }
    if (!json_is_array(archs))
        return pagoda_error_set(PAGODA_EFORMAT, CFG "\"architectures\" must be a list");
    size_t n = json_array_size(archs);
    if (n == 0)
        return pagoda_error_set(PAGODA_EFORMAT, CFG "\"architectures\" is empty");
    for (size_t i = 0; i < n; i++) {
        if (!json_is_string(json_array_get(archs, i)))
            return pagoda_error_set(PAGODA_EFORMAT,
                                    CFG "\"architectures\" entry %zu is not a string", i);
    }
    const char *name = json_string_value(json_array_get(archs, 0));
    if (n > 1)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                CFG "\"architectures\" lists %zu classes (\"%s\", \"%s\"%s); "
                                    "pagoda supports exactly one",
                                n, name, json_string_value(json_array_get(archs, 1)),
                                n > 2 ? ", ..." : "");
    for (size_t a = 0; a < NUM_ARCHS; a++) {
        if (strcmp(name, arch_names[a].class_name) != 0)
            continue;
        if (model_type != NULL && strcmp(model_type, arch_names[a].type) != 0)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    CFG "model_type \"%s\" does not match architecture %s "
                                        "(which has model_type \"%s\")",
                                    model_type, name, arch_names[a].type);
        *out = (enum model_arch)a;
        return 0;
    }
    return pagoda_error_set(PAGODA_EUNSUPPORTED,
                            CFG "architecture \"%s\" is not supported (LlamaForCausalLM, "
                                "MistralForCausalLM, Qwen2ForCausalLM)",
                            name);
}

/* A token id field that may be a number, a list of numbers or null. At most cap ids are
 * accepted; *count is 0 for null or absent. */
static int parse_token_ids(const json_t *root, const char *key, int32_t *ids, int cap, int *count)
{
    json_t *v = json_object_get(root, key);
    *count = 0;
    if (v == NULL || json_is_null(v))
        return 0;
    size_t n = json_is_array(v) ? json_array_size(v) : 1;
    if (!json_is_array(v) && !json_is_integer(v))
        return pagoda_error_set(PAGODA_EFORMAT,
                                CFG "\"%s\" must be a token id, a list of them or null", key);
    if (n > (size_t)cap)
        return pagoda_error_set(PAGODA_ERANGE, CFG "\"%s\" lists %zu token ids, more than %d", key,
                                n, cap);
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(e))
            return pagoda_error_set(PAGODA_EFORMAT, CFG "\"%s\" entry %zu is not an integer", key,
                                    i);
        json_int_t id = json_integer_value(e);
        if (id < 0 || id > INT32_MAX)
            return pagoda_error_set(PAGODA_ERANGE, CFG "\"%s\" token id %lld is out of range", key,
                                    (long long)id);
        ids[i] = (int32_t)id;
    }
    *count = (int)n;
    return 0;
}

static int parse_rope_type_name(const char *where, const char *name, enum rope_type *out)
{
    for (size_t t = 0; t < NUM_ROPE_TYPES; t++) {
        if (strcmp(name, rope_names[t]) == 0) {
            *out = (enum rope_type)t;
            return 0;
        }
    }
    return pagoda_error_set(PAGODA_EUNSUPPORTED,
                            CFG "rope type \"%s\" is not supported (default, linear, llama3) in "
                                "\"%s\"",
                            name, where);
}

/* Reads the scaling part of `rope_scaling` or `rope_parameters` (where names which) into r.
 * The type may be spelled `rope_type` or `type`; both present must agree. Without either the
 * object is refused: transformers 4 fails on such a rope_scaling, transformers 5 always writes
 * rope_type, and a rope_parameters keyed by layer type (as other architectures have) must not
 * be read as plain RoPE. */
static int parse_rope_object(const json_t *obj, const char *where, struct rope_config *r)
{
    if (!json_is_object(obj))
        return pagoda_error_set(PAGODA_EFORMAT, CFG "\"%s\" must be an object or null", where);
    const char *type_a = NULL, *type_b = NULL;
    int rc = opt_string(obj, where, "rope_type", &type_a);
    if (rc != 0 && rc != PAGODA_ENOENT)
        return rc;
    rc = opt_string(obj, where, "type", &type_b);
    if (rc != 0 && rc != PAGODA_ENOENT)
        return rc;
    if (type_a != NULL && type_b != NULL && strcmp(type_a, type_b) != 0)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                CFG "%s: \"rope_type\" \"%s\" and \"type\" \"%s\" disagree", where,
                                type_a, type_b);
    const char *type = type_a != NULL ? type_a : type_b;
    if (type == NULL)
        return missing(where, "rope_type");
    if ((rc = parse_rope_type_name(where, type, &r->type)) != 0)
        return rc;

    r->factor = 1.0;
    r->low_freq_factor = 0.0;
    r->high_freq_factor = 0.0;
    r->original_max_position_embeddings = 0;
    if (r->type == ROPE_DEFAULT)
        return 0;
    if ((rc = req_number(obj, where, "factor", &r->factor)) != 0)
        return rc;
    if (r->type != ROPE_LLAMA3)
        return 0;
    if ((rc = req_number(obj, where, "low_freq_factor", &r->low_freq_factor)) != 0)
        return rc;
    if ((rc = req_number(obj, where, "high_freq_factor", &r->high_freq_factor)) != 0)
        return rc;
    return req_int(obj, where, "original_max_position_embeddings",
                   &r->original_max_position_embeddings);
}

static bool rope_equal(const struct rope_config *a, const struct rope_config *b)
{
    return a->type == b->type && a->theta == b->theta && a->factor == b->factor &&
           a->low_freq_factor == b->low_freq_factor && a->high_freq_factor == b->high_freq_factor &&
           a->original_max_position_embeddings == b->original_max_position_embeddings;
}

/* RoPE in either spelling. transformers 5 writes `rope_parameters` (type, theta and scaling in
 * one object); older files have top-level `rope_theta` (default 10000) and `rope_scaling`
 * (null for plain RoPE). A file carrying both spellings must say the same thing in both. */
static int parse_rope(const json_t *root, struct rope_config *r)
{
    double top_theta = 10000.0;
    int rc = opt_number(root, NULL, "rope_theta", &top_theta);
    if (rc != 0 && rc != PAGODA_ENOENT)
        return rc;
    bool has_top_theta = rc == 0;

    double partial = 1.0;
    rc = opt_number(root, NULL, "partial_rotary_factor", &partial);
    if (rc != 0 && rc != PAGODA_ENOENT)
        return rc;

    json_t *params = json_object_get(root, "rope_parameters");
    json_t *scaling = json_object_get(root, "rope_scaling");
    if (params != NULL && json_is_null(params))
        params = NULL;
    if (scaling != NULL && json_is_null(scaling))
        scaling = NULL;

    struct rope_config legacy = {.type = ROPE_DEFAULT, .theta = top_theta, .factor = 1.0};
    if (scaling != NULL && (rc = parse_rope_object(scaling, "rope_scaling", &legacy)) != 0)
        return rc;
    if (params == NULL) {
        *r = legacy;
    } else {
        if ((rc = parse_rope_object(params, "rope_parameters", r)) != 0)
            return rc;
        r->theta = top_theta;
        rc = opt_number(params, "rope_parameters", "rope_theta", &r->theta);
        if (rc != 0 && rc != PAGODA_ENOENT)
            return rc;
        rc = opt_number(params, "rope_parameters", "partial_rotary_factor", &partial);
        if (rc != 0 && rc != PAGODA_ENOENT)
            return rc;
        if (has_top_theta && r->theta != top_theta)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    CFG "\"rope_parameters\" has rope_theta %g but \"rope_theta\" "
                                        "is %g",
                                    r->theta, top_theta);
        legacy.theta = r->theta;
        if (scaling != NULL && !rope_equal(r, &legacy))
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    CFG "\"rope_parameters\" and \"rope_scaling\" disagree");
    }
    if (partial != 1.0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                CFG "partial_rotary_factor %g is not supported (only 1)", partial);
    return 0;
}

/* `dtype` (transformers 5) or `torch_dtype` (older); bfloat16 when neither is given. */
static int parse_dtype(const json_t *root, enum dtype *out)
{
    const char *a = NULL, *b = NULL;
    int rc = opt_string(root, NULL, "dtype", &a);
    if (rc != 0 && rc != PAGODA_ENOENT)
        return rc;
    rc = opt_string(root, NULL, "torch_dtype", &b);
    if (rc != 0 && rc != PAGODA_ENOENT)
        return rc;
    if (a != NULL && b != NULL && strcmp(a, b) != 0)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                CFG "\"dtype\" \"%s\" and \"torch_dtype\" \"%s\" disagree", a, b);
    const char *key = a != NULL ? "dtype" : "torch_dtype";
    const char *name = a != NULL ? a : b;
    if (name == NULL) {
        *out = DTYPE_BF16;
        return 0;
    }
    if (dtype_from_torch(name, out) != 0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                CFG "\"%s\" \"%s\" is not supported (bfloat16, float16, float32)",
                                key, name);
    return 0;
}

/* Refuses every form of sliding-window attention that would be active: pagoda attends over the
 * whole context, so serving such a model would silently compute something else. */
static int check_sliding_window(const json_t *root, const struct model_config *c)
{
    int64_t window = 0;
    int rc = opt_int(root, NULL, "sliding_window", &window);
    if (rc != 0 && rc != PAGODA_ENOENT)
        return rc;
    bool has_window = rc == 0;

    switch (c->arch) {
    case MODEL_ARCH_LLAMA:
        if (has_window)
            return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                    CFG "sliding_window %lld is set; sliding-window attention is "
                                        "not supported",
                                    (long long)window);
        break;
    case MODEL_ARCH_MISTRAL:
        if (has_window && window < c->max_position_embeddings)
            return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                    CFG "active sliding_window %lld (below "
                                        "max_position_embeddings %lld) is not supported",
                                    (long long)window, (long long)c->max_position_embeddings);
        break;
    case MODEL_ARCH_QWEN2: {
        bool use = false;
        if ((rc = opt_bool(root, "use_sliding_window", &use)) != 0 && rc != PAGODA_ENOENT)
            return rc;
        if (use)
            return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                    CFG "active sliding_window (use_sliding_window: true) is not "
                                        "supported");
        break;
    }
    }

    /* transformers 5 may spell per-layer attention kinds out. */
    json_t *types = json_object_get(root, "layer_types");
    if (types == NULL || json_is_null(types))
        return 0;
    if (!json_is_array(types))
        return pagoda_error_set(PAGODA_EFORMAT, CFG "\"layer_types\" must be a list");
    for (size_t i = 0; i < json_array_size(types); i++) {
        const char *t = json_string_value(json_array_get(types, i));
        if (t == NULL || strcmp(t, "full_attention") != 0)
            return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                    CFG "\"layer_types\" entry %zu is \"%s\"; only "
                                        "full_attention is supported",
                                    i, t != NULL ? t : "(not a string)");
    }
    return 0;
}

/* Fields that change the math in ways pagoda does not implement. */
static int check_unsupported(const json_t *root, const struct model_config *c)
{
    const char *act = NULL;
    int rc = opt_string(root, NULL, "hidden_act", &act);
    if (rc != 0 && rc != PAGODA_ENOENT)
        return rc;
    if (act != NULL && strcmp(act, "silu") != 0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                CFG "hidden_act \"%s\" is not supported (silu)", act);
    json_t *quant = json_object_get(root, "quantization_config");
    if (quant != NULL && !json_is_null(quant))
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                CFG "\"quantization_config\" is present; quantized checkpoints "
                                    "are not supported");
    if (c->arch == MODEL_ARCH_LLAMA) {
        bool mlp_bias = false;
        if ((rc = opt_bool(root, "mlp_bias", &mlp_bias)) != 0 && rc != PAGODA_ENOENT)
            return rc;
        if (mlp_bias)
            return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                    CFG "mlp_bias: true is not supported (MLP projections "
                                        "without bias only)");
    }
    return 0;
}

int model_config_parse(const json_t *root, struct model_config *out)
{
    if (!json_is_object(root))
        return pagoda_error_set(PAGODA_EFORMAT, CFG "not a JSON object");
    struct model_config c = {0};
    int rc;
    if ((rc = parse_arch(root, &c.arch)) != 0)
        return rc;
    if ((rc = req_int(root, NULL, "vocab_size", &c.vocab_size)) != 0 ||
        (rc = req_int(root, NULL, "hidden_size", &c.hidden_size)) != 0 ||
        (rc = req_int(root, NULL, "intermediate_size", &c.intermediate_size)) != 0 ||
        (rc = req_int(root, NULL, "num_hidden_layers", &c.num_layers)) != 0 ||
        (rc = req_int(root, NULL, "num_attention_heads", &c.num_heads)) != 0 ||
        (rc = req_number(root, NULL, "rms_norm_eps", &c.rms_norm_eps)) != 0 ||
        (rc = req_int(root, NULL, "max_position_embeddings", &c.max_position_embeddings)) != 0)
        return rc;
    if (c.num_heads <= 0)
        return pagoda_error_set(PAGODA_ERANGE, CFG "num_attention_heads %lld must be positive",
                                (long long)c.num_heads);

    c.num_kv_heads = c.num_heads;
    if ((rc = opt_int(root, NULL, "num_key_value_heads", &c.num_kv_heads)) != 0 &&
        rc != PAGODA_ENOENT)
        return rc;
    rc = opt_int(root, NULL, "head_dim", &c.head_dim);
    if (rc == PAGODA_ENOENT) {
        if (c.hidden_size % c.num_heads != 0)
            return pagoda_error_set(PAGODA_ERANGE,
                                    CFG "hidden_size %lld is not divisible by "
                                        "num_attention_heads %lld and head_dim is not given",
                                    (long long)c.hidden_size, (long long)c.num_heads);
        c.head_dim = c.hidden_size / c.num_heads;
    } else if (rc != 0) {
        return rc;
    }

    c.tie_word_embeddings = false;
    if ((rc = opt_bool(root, "tie_word_embeddings", &c.tie_word_embeddings)) != 0 &&
        rc != PAGODA_ENOENT)
        return rc;

    /* Which projections carry a bias is fixed per architecture, except Llama's switch. */
    if (c.arch == MODEL_ARCH_QWEN2) {
        c.qkv_bias = true;
    } else if (c.arch == MODEL_ARCH_LLAMA) {
        bool bias = false;
        if ((rc = opt_bool(root, "attention_bias", &bias)) != 0 && rc != PAGODA_ENOENT)
            return rc;
        c.qkv_bias = c.o_bias = bias;
    }

    int32_t bos[1];
    int num_bos;
    if ((rc = parse_token_ids(root, "bos_token_id", bos, 1, &num_bos)) != 0)
        return rc;
    c.bos_token_id = num_bos > 0 ? bos[0] : -1;
    if ((rc = parse_token_ids(root, "eos_token_id", c.eos_token_ids, MODEL_MAX_EOS, &c.num_eos)) !=
        0)
        return rc;

    if ((rc = parse_rope(root, &c.rope)) != 0 || (rc = parse_dtype(root, &c.dtype)) != 0 ||
        (rc = check_sliding_window(root, &c)) != 0 || (rc = check_unsupported(root, &c)) != 0)
        return rc;
    if ((rc = model_config_validate(&c)) != 0)
        return with_context(rc, NULL);
    *out = c;
    return 0;
}

/* Re-records the current detail with the file it came from in front, in place of config.json's
 * own prefix (CFG), where it has one. Returns rc. */
static int with_path(int rc, const char *path)
{
    char detail[512];
    const char *d = pagoda_error_detail();
    if (strncmp(d, CFG, strlen(CFG)) == 0)
        d += strlen(CFG);
    snprintf(detail, sizeof(detail), "%s", d);
    return pagoda_error_set(rc, "%s: %s", path, detail);
}

/* Reads DIR/name (JSON, at most max_bytes, jansson's decoding flags) into *root; path receives
 * its path. */
static int load_model_json_max(const char *model_dir, const char *name, size_t max_bytes,
                               size_t flags, char *path, size_t path_size, json_t **root)
{
    if ((size_t)snprintf(path, path_size, "%s/%s", model_dir, name) >= path_size)
        return pagoda_error_set(PAGODA_ERANGE, "%s: model directory path is too long", model_dir);
    return json_util_load_file_with(path, max_bytes, flags, root);
}

/* The same, at most MODEL_CONFIG_MAX_BYTES: config.json, generation_config.json. */
static int load_model_json(const char *model_dir, const char *name, char *path, size_t path_size,
                           json_t **root)
{
    return load_model_json_max(model_dir, name, MODEL_CONFIG_MAX_BYTES, JSON_REJECT_DUPLICATES,
                               path, path_size, root);
}

/* tokenizer_config.json (Gemma 3's, with its added tokens, passes 1 MiB) and tokenizer.json: the
 * tokenizer library's limit (tokenizer.h's TOKENIZER_MAX_FILE_BYTES). */
#define MODEL_TOKENIZER_MAX_BYTES (64u << 20)

/* Merges DIR/generation_config.json's eos_token_id (transformers' GenerationConfig, which
 * generate() stops at, and so does vLLM) into c's, after config.json's, without repeats: Llama 3
 * Instruct's config.json names only <|end_of_text|> (128001), its generation_config.json the end
 * of a turn too (<|eot_id|>, 128009), and a chat that ends its turn must stop there. Before, its
 * answers ran on to max_tokens. An absent file changes nothing; one that cannot be read, is not
 * JSON or lists ids of the wrong type is refused by name. */
#define MODEL_MAX_EOS_LISTED 64 /* in the file, repeats of config.json's counted */

/* Reads DIR/generation_config.json into *root (NULL when there is none); a document that is not an
 * object is refused. path receives its path. */
static int load_generation_config(const char *model_dir, char *path, size_t path_size,
                                  json_t **root)
{
    *root = NULL;
    int rc = load_model_json(model_dir, "generation_config.json", path, path_size, root);
    if (rc == PAGODA_ENOENT)
        return 0;
    if (rc == 0 && !json_is_object(*root)) {
        json_decref(*root);
        *root = NULL;
        rc = pagoda_error_set(PAGODA_EFORMAT, "%s: not a JSON object", path);
    }
    return rc;
}

static bool is_eos_id(const struct model_config *c, int32_t id)
{
    for (int k = 0; k < c->num_eos; k++)
        if (c->eos_token_ids[k] == id)
            return true;
    return false;
}

/* Adds id to c's EOS ids unless there already; file names the source in a refusal. */
static int add_eos(struct model_config *c, int32_t id, const char *file)
{
    if (is_eos_id(c, id))
        return 0;
    if (c->num_eos == MODEL_MAX_EOS)
        return pagoda_error_set(PAGODA_ERANGE,
                                "%s: with config.json's, more than %d eos_token_id values", file,
                                MODEL_MAX_EOS);
    c->eos_token_ids[c->num_eos++] = id;
    return 0;
}

static int merge_generation_eos(const char *model_dir, struct model_config *c)
{
    char path[4096];
    json_t *root;
    int rc = load_generation_config(model_dir, path, sizeof(path), &root);
    if (rc != 0 || root == NULL)
        return rc;
    int32_t ids[MODEL_MAX_EOS_LISTED];
    int n = 0;
    if ((rc = parse_token_ids(root, "eos_token_id", ids, MODEL_MAX_EOS_LISTED, &n)) != 0)
        rc = with_path(rc, path);
    json_decref(root);
    for (int i = 0; rc == 0 && i < n; i++)
        if ((rc = add_eos(c, ids[i], path)) != 0)
            return rc;
    if (rc == 0 && (rc = model_config_validate(c)) != 0)
        rc = with_path(rc, path);
    return rc;
}

/* Whether v is a string of exactly these len bytes (a NUL inside a JSON string is part of it). */
static bool same_text(const json_t *v, const char *text, size_t len)
{
    return json_is_string(v) && json_string_length(v) == len &&
           memcmp(json_string_value(v), text, len) == 0;
}

/* Whether v is an integer id in [0, INT32_MAX]; then *out is it. */
static bool token_id(const json_t *v, int32_t *out)
{
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
        return false;
    *out = (int32_t)json_integer_value(v);
    return true;
}

/* Says why the tokenizer's EOS adds nothing, in note (note_size bytes; NULL: not told) unless it
 * already says something. */
static void tell(char *note, size_t note_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void tell(char *note, size_t note_size, const char *fmt, ...)
{
    if (note == NULL || note_size == 0 || note[0] != '\0')
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(note, note_size, fmt, ap);
    va_end(ap);
}

/* tokenizer.json's ids as HF tokenizers gives them: the model vocabulary's (an object of text to
 * id; a Unigram model's list of [text, score], where the id is the index), then its added_tokens'
 * as HF's AddedVocabulary numbers them, whatever the file's "id" says: in order, a token the
 * vocabulary has keeps its id, a repeat its first, any other takes the next id past the largest
 * so far, or the vocabulary's size (an empty content is passed over). tokenizer/tokenizer.c
 * parse_added, the router's tokenizer, numbers them alike, so that the id stopped at is the one
 * the router encodes the text to. */
struct tok_ids {
    const json_t *vocab;
    json_t *index; /* a Unigram list's texts to their index; NULL for an object */
    json_t *added; /* added_tokens' contents to their ids */
    int64_t next;  /* the id a token added next takes */
};

static void tok_ids_fini(struct tok_ids *t)
{
    json_decref(t->index);
    json_decref(t->added);
}

/* Whether text (len bytes) is in t's model vocabulary; then *out is its id. */
static bool tok_ids_vocab(const struct tok_ids *t, const char *text, size_t len, int32_t *out)
{
    return token_id(json_object_getn(t->index != NULL ? t->index : t->vocab, text, len), out);
}

/* Whether text (len bytes) has an id in t; then *out is it. */
static bool tok_ids_find(const struct tok_ids *t, const char *text, size_t len, int32_t *out)
{
    return tok_ids_vocab(t, text, len, out) || token_id(json_object_getn(t->added, text, len), out);
}

/* The id an added token the vocabulary lacks takes: the next past the largest so far (max_id, -1
 * for none) where that lies at or past the vocabulary's count ids, else count. */
static int64_t next_added_id(int64_t max_id, size_t count)
{
    return max_id >= 0 && ((size_t)max_id >= count || count == 0) ? max_id + 1 : (int64_t)count;
}

static int tok_ids_build(const json_t *root, struct tok_ids *t)
{
    *t = (struct tok_ids){.vocab = json_object_get(json_object_get(root, "model"), "vocab")};
    json_t *v;
    size_t i;
    if ((t->added = json_object()) == NULL)
        return PAGODA_ENOMEM;
    if (json_is_array(t->vocab)) {
        if ((t->index = json_object()) == NULL)
            return PAGODA_ENOMEM;
        json_array_foreach(t->vocab, i, v)
        {
            const json_t *text = json_array_get(v, 0);
            if (json_is_string(text) && i <= INT32_MAX &&
                json_object_setn_new(t->index, json_string_value(text), json_string_length(text),
                                     json_integer((json_int_t)i)) != 0)
                return PAGODA_ENOMEM;
        }
    }
    const size_t count =
        json_is_array(t->vocab) ? json_array_size(t->vocab) : json_object_size(t->vocab);
    int64_t max_id = -1;
    json_array_foreach(json_object_get(root, "added_tokens"), i, v)
    {
        const json_t *content = json_object_get(v, "content");
        const char *c = json_string_value(content);
        size_t n = json_string_length(content);
        int32_t vid;
        if (c == NULL || n == 0 || json_object_getn(t->added, c, n) != NULL)
            continue;
        int64_t id = tok_ids_vocab(t, c, n, &vid) ? vid : next_added_id(max_id, count);
        if (id > INT32_MAX)
            break;
        if (id > max_id)
            max_id = id;
        if (json_object_setn_new(t->added, c, n, json_integer(id)) != 0)
            return PAGODA_ENOMEM;
    }
    t->next = next_added_id(max_id, count);
    return 0;
}

/* Whether an added_tokens_decoder key is a decimal id in [0, INT32_MAX]; then *out is it. */
static bool decoder_key(const char *key, int32_t *out)
{
    char *end;
    long long k = strtoll(key, &end, 10);
    if (*key == '\0' || *end != '\0' || k < 0 || k > INT32_MAX)
        return false;
    *out = (int32_t)k;
    return true;
}

/* Where tokenizer.json lacks the token eos (len bytes) that tokenizer_config.json's
 * added_tokens_decoder ({"ID": {"content": ...}}) lists: transformers' fast tokenizer adds, at its
 * start, the decoder's tokens that tokenizer.json lacks, in the order of their ids, each numbered
 * next; *out is the id eos takes so, -1 where the decoder does not list it. */
static void decoder_added_id(const json_t *config, const struct tok_ids *t, const char *eos,
                             size_t len, int32_t *out)
{
    *out = -1;
    const json_t *decoder = json_object_get(config, "added_tokens_decoder");
    const char *key;
    json_t *v;
    int32_t eos_key = -1, k;
    json_object_foreach((json_t *)decoder, key, v)
    {
        if (same_text(json_object_get(v, "content"), eos, len) && decoder_key(key, &k) &&
            (eos_key < 0 || k < eos_key))
            eos_key = k;
    }
    if (eos_key < 0)
        return;
    int64_t before = 0; /* the decoder's tokens tokenizer.json lacks, with a smaller id */
    json_object_foreach((json_t *)decoder, key, v)
    {
        const json_t *content = json_object_get(v, "content");
        int32_t id;
        if (decoder_key(key, &k) && k < eos_key && json_is_string(content) &&
            json_string_length(content) > 0 &&
            !tok_ids_find(t, json_string_value(content), json_string_length(content), &id))
            before++;
    }
    if (t->next + before <= INT32_MAX)
        *out = (int32_t)(t->next + before);
}

/* The id of the token whose text is eos (len bytes): tokenizer.json's (struct tok_ids), what
 * transformers' fast tokenizer and the router's find, or the one that tokenizer adds from
 * added_tokens_decoder where tokenizer.json lacks it (decoder_added_id); where tokenizer.json
 * cannot be read (absent: a slow tokenizer's folder; or broken, which the router refuses for text
 * and says why), added_tokens_decoder's key (what transformers 4.34 and later write; config may be
 * NULL). -1 in *out: none. */
static int find_token_id(const char *model_dir, const json_t *config, const char *eos, size_t len,
                         int32_t *out, char *note, size_t note_size)
{
    *out = -1;
    char path[4096];
    json_t *root;
    int rc =
        load_model_json_max(model_dir, "tokenizer.json", MODEL_TOKENIZER_MAX_BYTES,
                            JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, path, sizeof(path), &root);
    if (rc == 0) {
        struct tok_ids t;
        if ((rc = tok_ids_build(root, &t)) == 0 && !tok_ids_find(&t, eos, len, out))
            decoder_added_id(config, &t, eos, len, out);
        tok_ids_fini(&t);
        json_decref(root);
        return rc;
    }
    if (rc != PAGODA_ENOENT)
        tell(note, note_size, "%s", pagoda_error_detail());
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)json_object_get(config, "added_tokens_decoder"), key, v)
    {
        if (same_text(json_object_get(v, "content"), eos, len) && decoder_key(key, out))
            break;
    }
    return 0;
}

/* root's eos_token (a string, or an AddedToken's "content"), into *text (NULL: none, or null);
 * another type is refused by name, as the router's reading of tokenizer_config.json refuses it
 * (chat/chat_template.c), and transformers too. */
static int eos_token_text(const json_t *root, const char *path, const json_t **text)
{
    const json_t *eos = json_object_get(root, "eos_token");
    if (json_is_object(eos))
        eos = json_object_get(eos, "content");
    *text = json_is_string(eos) ? eos : NULL;
    if (eos != NULL && !json_is_null(eos) && !json_is_string(eos))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: \"eos_token\" must be a string or an object with a string "
                                "\"content\"",
                                path);
    return 0;
}

/* DIR/name as a JSON object (integers past 64 bits read as reals, as Python reads them), or NULL:
 * absent, or a file that cannot be read, is not JSON or not an object (note says which). The
 * tokenizer's EOS is read at its best: the router, which reads these files for text, refuses such
 * a file and says why; a group that serves token ids alone starts as it did before the
 * tokenizer's EOS was read. */
static json_t *load_tokenizer_file(const char *model_dir, const char *name, char *path,
                                   size_t path_size, char *note, size_t note_size)
{
    json_t *root = NULL;
    int rc = load_model_json_max(model_dir, name, MODEL_TOKENIZER_MAX_BYTES,
                                 JSON_DECODE_INT_AS_REAL, path, path_size, &root);
    if (rc != 0) {
        if (rc != PAGODA_ENOENT)
            tell(note, note_size, "%s", pagoda_error_detail());
        return NULL;
    }
    if (!json_is_object(root)) {
        tell(note, note_size, "%s: not a JSON object", path);
        json_decref(root);
        return NULL;
    }
    return root;
}

/* Merges the tokenizer's EOS into c's: vLLM stops at the tokenizer's eos_token_id beside
 * generation_config.json's ids (SamplingParams.update_from_generation_config), and a model tuned
 * to a chat format often names its end of turn there alone (a Llama 2 tuned to ChatML: eos_token
 * <|im_end|>, config.json and generation_config.json still </s>). Before, such a chat ran on to
 * max_tokens. The token is tokenizer_config.json's eos_token; where that file predates
 * transformers 4.34 (no added_tokens_decoder) or is absent, special_tokens_map.json's eos_token
 * wins, as transformers' legacy loading lets it. No eos_token, a text no token has, an id past the
 * model's vocabulary (the model cannot sample it) or no room left among MODEL_MAX_EOS ids adds
 * nothing; an eos_token of another type is refused by name. */
int model_config_add_tokenizer_eos(const char *model_dir, struct model_config *c, char *note,
                                   size_t note_size)
{
    if (note != NULL && note_size > 0)
        note[0] = '\0';
    char path[4096], map_path[4096];
    json_t *config = load_tokenizer_file(model_dir, "tokenizer_config.json", path, sizeof(path),
                                         note, note_size);
    json_t *map = NULL;
    const json_t *eos = NULL;
    int rc = 0;
    /* the map's eos_token replaces the config's, which is then not read at all (transformers
     * replaces it before reading it): the chat template's special tokens follow the same rule
     * (chat_template_apply_special_tokens_map) */
    if (json_object_get(config, "added_tokens_decoder") == NULL)
        map = load_tokenizer_file(model_dir, "special_tokens_map.json", map_path, sizeof(map_path),
                                  note, note_size);
    if (json_object_get(map, "eos_token") != NULL)
        rc = eos_token_text(map, map_path, &eos);
    else if (config != NULL)
        rc = eos_token_text(config, path, &eos);
    int32_t id = -1;
    if (rc == 0 && eos != NULL) {
        const char *text = json_string_value(eos);
        rc = find_token_id(model_dir, config, text, json_string_length(eos), &id, note, note_size);
        if (rc == 0 && id < 0)
            tell(note, note_size, "the tokenizer's eos_token \"%.200s\" is no token of the model",
                 text);
        else if (rc == 0 && id >= c->vocab_size)
            tell(note, note_size,
                 "the tokenizer's eos_token \"%.200s\" is token %d, past the model's vocabulary "
                 "(%lld)",
                 text, (int)id, (long long)c->vocab_size);
        else if (rc == 0 && c->num_eos == MODEL_MAX_EOS && !is_eos_id(c, id))
            tell(note, note_size,
                 "the tokenizer's eos_token \"%.200s\" (%d): no room past %d EOS ids", text,
                 (int)id, MODEL_MAX_EOS);
    }
    json_decref(map);
    json_decref(config);
    if (rc == 0 && id >= 0 && id < c->vocab_size &&
        (c->num_eos < MODEL_MAX_EOS || is_eos_id(c, id))) {
        rc = add_eos(c, id, path);
        if (note != NULL && note_size > 0)
            note[0] = '\0'; /* a file that could not be read did not keep it from a stop id */
    }
    return rc;
}

/* generation_config.json's sampling defaults, as vLLM's --generation-config auto takes them
 * (ModelConfig.get_diff_sampling_param): transformers' GenerationConfig.to_diff_dict keeps only
 * values other than GenerationConfig's own defaults, so temperature 1, top_p 1, top_k 50 and
 * repetition_penalty 1 are not defaults of the model's (a file naming top_k 50 samples without a
 * top-k in vLLM, and here). A negative top_k is off (0), as vLLM's -1. A model without
 * generation_config.json has config.json's fields instead, as vLLM's try_get_generation_config
 * falls back to GenerationConfig.from_model_config (an old config.json's serialised transformers
 * defaults, temperature 1.0 and top_k 50, are not the model's); a config.json that is absent,
 * cannot be read or is no JSON object gives none here (the worker refuses it and says why). */
int model_generation_defaults_load(const char *model_dir, struct model_generation_defaults *out)
{
    memset(out, 0, sizeof(*out));
    out->file = "generation_config.json";
    char path[4096];
    json_t *root;
    int rc = load_generation_config(model_dir, path, sizeof(path), &root);
    if (rc == 0 && root == NULL) {
        out->file = "config.json";
        rc = load_model_json(model_dir, "config.json", path, sizeof(path), &root);
        if ((rc != 0 && rc != PAGODA_ENOMEM) || (rc == 0 && !json_is_object(root))) {
            json_decref(root);
            pagoda_error_clear();
            return 0;
        }
    }
    if (rc != 0)
        return rc;
    static const struct {
        const char *key;
        unsigned bit;
        double transformers_default;
    } fields[] = {
        {"temperature", MODEL_GEN_TEMPERATURE, 1.0},
        {"top_p", MODEL_GEN_TOP_P, 1.0},
        {"top_k", MODEL_GEN_TOP_K, 50.0},
        {"min_p", MODEL_GEN_MIN_P, NAN}, /* None in transformers: any number is the model's */
        {"repetition_penalty", MODEL_GEN_REPETITION_PENALTY, 1.0},
    };
    struct model_generation_defaults g = {.file = out->file};
    /* config.json's fields are the model's only by the fallback: one that is not a number
     * transformers could sample with (a boolean, a string, out of range) is passed over, as vLLM
     * starts with it; generation_config.json's are refused (the operator's to fix). */
    const bool lenient = strcmp(g.file, "config.json") == 0;
    for (size_t i = 0; rc == 0 && i < sizeof(fields) / sizeof(fields[0]); i++) {
        double v;
        if ((rc = opt_number(root, NULL, fields[i].key, &v)) == PAGODA_ENOENT) {
            rc = 0;
            continue;
        }
        if (rc == 0 && (!(fabs(v) <= 1e30) || (v != 0 && fabs(v) < 1e-30)))
            /* a float's range, with room (1e-50 would be a float's 0, greedy): the sampler's
             * ranges are checked by the caller */
            rc = pagoda_error_set(PAGODA_ERANGE, "%s: \"%s\" %g is out of range", path,
                                  fields[i].key, v);
        else if (rc == 0 && fields[i].bit == MODEL_GEN_TOP_K && (v != floor(v) || v > INT32_MAX))
            rc = pagoda_error_set(PAGODA_EFORMAT, "%s: \"top_k\" must be an integer (%g)", path, v);
        else if (rc != 0)
            rc = with_path(rc, path);
        if (rc != 0 && lenient && rc != PAGODA_ENOMEM) {
            rc = 0;
            pagoda_error_clear();
            continue;
        }
        if (rc != 0)
            break;
        if (v == fields[i].transformers_default)
            continue;
        g.set |= fields[i].bit;
        switch (fields[i].bit) {
        case MODEL_GEN_TEMPERATURE:
            g.temperature = v;
            break;
        case MODEL_GEN_TOP_P:
            g.top_p = v;
            break;
        case MODEL_GEN_TOP_K:
            g.top_k = v < 0 ? 0 : (int32_t)v;
            break;
        case MODEL_GEN_MIN_P:
            g.min_p = v;
            break;
        default:
            g.repetition_penalty = v;
            break;
        }
    }
    json_decref(root);
    if (rc == 0)
        *out = g;
    return rc;
}

int model_config_load(const char *model_dir, struct model_config *out)
{
    char path[4096];
    json_t *root;
    int rc = load_model_json(model_dir, "config.json", path, sizeof(path), &root);
    if (rc != 0)
        return rc;
    rc = model_config_parse(root, out);
    json_decref(root);
    if (rc != 0)
        return with_path(rc, path);
    return merge_generation_eos(model_dir, out);
}

static int check_range(const char *key, int64_t v, int64_t min, int64_t max)
{
    if (v < min || v > max)
        return pagoda_error_set(PAGODA_ERANGE, "%s %lld is outside [%lld, %lld]", key, (long long)v,
                                (long long)min, (long long)max);
    return 0;
}

static int check_positive(const char *key, double v)
{
    if (!(v > 0.0) || !isfinite(v))
        return pagoda_error_set(PAGODA_ERANGE, "%s %g must be positive and finite", key, v);
    return 0;
}

int model_config_validate(const struct model_config *c)
{
    int rc;
    if ((unsigned)c->arch >= NUM_ARCHS)
        return pagoda_error_set(PAGODA_ERANGE, "architecture %d is unknown", (int)c->arch);
    if ((unsigned)c->rope.type >= NUM_ROPE_TYPES)
        return pagoda_error_set(PAGODA_ERANGE, "rope type %d is unknown", (int)c->rope.type);
    if ((unsigned)c->dtype > DTYPE_F32)
        return pagoda_error_set(PAGODA_ERANGE, "dtype %d is unknown", (int)c->dtype);
    if ((rc = check_range("vocab_size", c->vocab_size, 1, MAX_VOCAB)) != 0 ||
        (rc = check_range("hidden_size", c->hidden_size, 1, MAX_HIDDEN)) != 0 ||
        (rc = check_range("intermediate_size", c->intermediate_size, 1, MAX_INTERMEDIATE)) != 0 ||
        (rc = check_range("num_hidden_layers", c->num_layers, 1, MAX_LAYERS)) != 0 ||
        (rc = check_range("num_attention_heads", c->num_heads, 1, MAX_HEADS)) != 0 ||
        (rc = check_range("num_key_value_heads", c->num_kv_heads, 1, c->num_heads)) != 0 ||
        (rc = check_range("head_dim", c->head_dim, 2, MAX_HEAD_DIM)) != 0 ||
        (rc = check_range("max_position_embeddings", c->max_position_embeddings, 2,
                          MAX_POSITIONS)) != 0)
        return rc;
    if (c->num_heads % c->num_kv_heads != 0)
        return pagoda_error_set(PAGODA_ERANGE,
                                "num_attention_heads %lld is not a multiple of "
                                "num_key_value_heads %lld",
                                (long long)c->num_heads, (long long)c->num_kv_heads);
    if (c->head_dim % 2 != 0)
        return pagoda_error_set(PAGODA_ERANGE, "head_dim %lld must be even for RoPE",
                                (long long)c->head_dim);
    if ((rc = check_positive("rms_norm_eps", c->rms_norm_eps)) != 0 ||
        (rc = check_positive("rope_theta", c->rope.theta)) != 0 ||
        (rc = check_positive("rope factor", c->rope.factor)) != 0)
        return rc;
    if (c->rope.type == ROPE_DEFAULT && c->rope.factor != 1.0)
        return pagoda_error_set(PAGODA_ERANGE, "rope factor %g must be 1 for rope type default",
                                c->rope.factor);
    if (c->rope.type == ROPE_LLAMA3) {
        if ((rc = check_positive("rope low_freq_factor", c->rope.low_freq_factor)) != 0 ||
            (rc = check_positive("rope high_freq_factor", c->rope.high_freq_factor)) != 0 ||
            (rc = check_range("rope original_max_position_embeddings",
                              c->rope.original_max_position_embeddings, 1, MAX_POSITIONS)) != 0)
            return rc;
        /* The llama3 ramp divides by their difference. */
        if (!(c->rope.high_freq_factor > c->rope.low_freq_factor))
            return pagoda_error_set(PAGODA_ERANGE,
                                    "rope high_freq_factor %g must exceed low_freq_factor %g",
                                    c->rope.high_freq_factor, c->rope.low_freq_factor);
    }
    if (c->bos_token_id != -1 && (c->bos_token_id < 0 || c->bos_token_id >= c->vocab_size))
        return pagoda_error_set(PAGODA_ERANGE, "bos_token_id %d is outside the vocabulary (%lld)",
                                (int)c->bos_token_id, (long long)c->vocab_size);
    if (c->num_eos < 0 || c->num_eos > MODEL_MAX_EOS)
        return pagoda_error_set(PAGODA_ERANGE, "%d eos_token_id values, more than %d", c->num_eos,
                                MODEL_MAX_EOS);
    for (int i = 0; i < c->num_eos; i++) {
        if (c->eos_token_ids[i] < 0 || c->eos_token_ids[i] >= c->vocab_size)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "eos_token_id %d is outside the vocabulary (%lld)",
                                    (int)c->eos_token_ids[i], (long long)c->vocab_size);
    }
    /* The biases config.json can express for each architecture. */
    bool qkv = c->arch == MODEL_ARCH_QWEN2 || (c->arch == MODEL_ARCH_LLAMA && c->qkv_bias);
    bool o = c->arch == MODEL_ARCH_LLAMA && c->qkv_bias;
    if (c->qkv_bias != qkv || c->o_bias != o)
        return pagoda_error_set(PAGODA_ERANGE,
                                "%s cannot have q/k/v bias %s with o_proj bias %s (qwen2: q/k/v "
                                "only; llama: all four or none; mistral: none)",
                                model_arch_type(c->arch), c->qkv_bias ? "on" : "off",
                                c->o_bias ? "on" : "off");
    return 0;
}

void model_config_tiny(struct model_config *out)
{
    *out = (struct model_config){
        .arch = MODEL_ARCH_LLAMA,
        .vocab_size = 512,
        .hidden_size = 256,
        .intermediate_size = 688,
        .num_layers = 4,
        .num_heads = 4,
        .num_kv_heads = 2,
        .head_dim = 64,
        .rms_norm_eps = 1e-5,
        .tie_word_embeddings = false,
        .qkv_bias = false,
        .o_bias = false,
        .bos_token_id = 1,
        .eos_token_ids = {2},
        .num_eos = 1,
        .max_position_embeddings = 2048,
        .rope = {.type = ROPE_DEFAULT, .theta = 10000.0, .factor = 1.0},
        .dtype = DTYPE_BF16,
    };
}

/* Adds key: v to o; v may be NULL (a failed allocation), which json_object_set_new reports.
 * Clears *ok on failure so that the caller checks once at the end. */
static void put(json_t *o, const char *key, json_t *v, bool *ok)
{
    if (json_object_set_new(o, key, v) != 0)
        *ok = false;
}

/* The RoPE scaling keys both spellings share: factor, and the llama3 parameters. */
static void put_rope_scaling(json_t *o, const struct rope_config *r, bool *ok)
{
    if (r->type == ROPE_DEFAULT)
        return;
    put(o, "factor", json_real(r->factor), ok);
    if (r->type != ROPE_LLAMA3)
        return;
    put(o, "low_freq_factor", json_real(r->low_freq_factor), ok);
    put(o, "high_freq_factor", json_real(r->high_freq_factor), ok);
    put(o, "original_max_position_embeddings", json_integer(r->original_max_position_embeddings),
        ok);
}

int model_config_to_json(const struct model_config *c, bool legacy_rope, json_t **out)
{
    json_t *o = json_object();
    if (o == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "config.json: out of memory");
    bool ok = true;
    json_t *archs = json_array();
    if (archs == NULL || json_array_append_new(archs, json_string(model_arch_class(c->arch))))
        ok = false;
    put(o, "architectures", archs, &ok);
    put(o, "model_type", json_string(model_arch_type(c->arch)), &ok);
    put(o, "vocab_size", json_integer(c->vocab_size), &ok);
    put(o, "hidden_size", json_integer(c->hidden_size), &ok);
    put(o, "intermediate_size", json_integer(c->intermediate_size), &ok);
    put(o, "num_hidden_layers", json_integer(c->num_layers), &ok);
    put(o, "num_attention_heads", json_integer(c->num_heads), &ok);
    put(o, "num_key_value_heads", json_integer(c->num_kv_heads), &ok);
    put(o, "head_dim", json_integer(c->head_dim), &ok);
    put(o, "hidden_act", json_string("silu"), &ok);
    put(o, "rms_norm_eps", json_real(c->rms_norm_eps), &ok);
    put(o, "max_position_embeddings", json_integer(c->max_position_embeddings), &ok);
    put(o, "tie_word_embeddings", json_boolean(c->tie_word_embeddings), &ok);
    put(o, "bos_token_id", c->bos_token_id >= 0 ? json_integer(c->bos_token_id) : json_null(), &ok);
    if (c->num_eos == 1) {
        put(o, "eos_token_id", json_integer(c->eos_token_ids[0]), &ok);
    } else if (c->num_eos == 0) {
        put(o, "eos_token_id", json_null(), &ok);
    } else {
        json_t *eos = json_array();
        for (int i = 0; eos != NULL && i < c->num_eos; i++) {
            if (json_array_append_new(eos, json_integer(c->eos_token_ids[i])) != 0)
                ok = false;
        }
        put(o, "eos_token_id", eos, &ok);
    }
    put(o, "torch_dtype", json_string(dtype_torch_name(c->dtype)), &ok);
    put(o, "dtype", json_string(dtype_torch_name(c->dtype)), &ok);

    switch (c->arch) {
    case MODEL_ARCH_LLAMA:
        put(o, "attention_bias", json_boolean(c->o_bias), &ok);
        put(o, "mlp_bias", json_false(), &ok);
        break;
    case MODEL_ARCH_MISTRAL:
        put(o, "sliding_window", json_null(), &ok);
        break;
    case MODEL_ARCH_QWEN2:
        put(o, "use_sliding_window", json_false(), &ok);
        put(o, "sliding_window", json_null(), &ok);
        put(o, "max_window_layers", json_integer(c->num_layers), &ok);
        break;
    }

    const char *rope_type =
        (unsigned)c->rope.type < NUM_ROPE_TYPES ? rope_names[c->rope.type] : "?";
    if (legacy_rope) {
        put(o, "rope_theta", json_real(c->rope.theta), &ok);
        if (c->rope.type == ROPE_DEFAULT) {
            put(o, "rope_scaling", json_null(), &ok);
        } else {
            json_t *s = json_object();
            if (s != NULL) {
                /* Both keys: transformers before 4.43 reads `type`, later ones `rope_type`. */
                put(s, "rope_type", json_string(rope_type), &ok);
                put(s, "type", json_string(rope_type), &ok);
                put_rope_scaling(s, &c->rope, &ok);
            }
            put(o, "rope_scaling", s, &ok);
        }
    } else {
        json_t *p = json_object();
        if (p != NULL) {
            put(p, "rope_type", json_string(rope_type), &ok);
            put(p, "rope_theta", json_real(c->rope.theta), &ok);
            put_rope_scaling(p, &c->rope, &ok);
        }
        put(o, "rope_parameters", p, &ok);
    }

    if (!ok) {
        json_decref(o);
        return pagoda_error_set(PAGODA_ENOMEM, "config.json: out of memory");
    }
    *out = o;
    return 0;
}
