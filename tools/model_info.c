/* pagoda-model-info: loads a model directory through the weight loader, exactly as the worker
 * will, and describes it: architecture, sizes, RoPE, tying, biases, dtypes, parameter and byte
 * counts, shards. Because it goes through model_weights_open, a model it describes is one the
 * worker can load, and a model it refuses comes with the loader's reason (exit status 1). */
#include "common/dtype.h"
#include "common/error.h"
#include "common/json_util.h"
#include "model/model_config.h"
#include "model/model_weights.h"

#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#define PROG "pagoda-model-info"
#define EXIT_USAGE 2
/* Index files larger than this are refused (the loader bounds its own read the same way). */
#define MODEL_INFO_INDEX_MAX_BYTES (16u << 20)

struct weight_stats {
    uint64_t params;
    uint64_t bytes;
    size_t tensors;
    bool has_dtype[DTYPE_F32 + 1];
    int shards;
};

static void count_view(struct weight_stats *s, const struct tensor_view *v)
{
    if (v->data == NULL)
        return; /* an optional bias the config does not call for */
    s->params += v->nbytes / dtype_size(v->dtype);
    s->bytes += v->nbytes;
    s->tensors++;
    if ((unsigned)v->dtype <= DTYPE_F32)
        s->has_dtype[v->dtype] = true;
}

/* The shard count: 1 for model.safetensors (which the loader prefers when both exist), else
 * the distinct files the index's weight_map names. */
static int count_shards(const char *model_dir, int *out)
{
    char path[PATH_MAX];
    struct stat st;
    if ((size_t)snprintf(path, sizeof(path), "%s/model.safetensors", model_dir) >= sizeof(path))
        return pagoda_error_set(PAGODA_ERANGE, "%s: path is too long", model_dir);
    if (stat(path, &st) == 0) {
        *out = 1;
        return 0;
    }
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", model_dir);
    json_t *index;
    int rc = json_util_load_file(path, MODEL_INFO_INDEX_MAX_BYTES, &index);
    if (rc != 0)
        return rc;
    json_t *map = json_object_get(index, "weight_map");
    json_t *seen = json_object();
    const char *key;
    json_t *value;
    if (seen == NULL) {
        rc = PAGODA_ENOMEM;
    } else if (!json_is_object(map)) {
        rc = pagoda_error_set(PAGODA_EFORMAT, "%s: \"weight_map\" is not an object", path);
    } else {
        json_object_foreach(map, key, value)
        {
            if (json_is_string(value) &&
                json_object_set_new(seen, json_string_value(value), json_true()) != 0) {
                rc = PAGODA_ENOMEM;
                break;
            }
        }
    }
    if (rc == 0)
        *out = (int)json_object_size(seen);
    json_decref(seen);
    json_decref(index);
    return rc;
}

static int collect_stats(const char *model_dir, const struct model_weights *w,
                         struct weight_stats *s)
{
    memset(s, 0, sizeof(*s));
    count_view(s, &w->embed_tokens);
    count_view(s, &w->norm);
    if (w->lm_head.data != w->embed_tokens.data)
        count_view(s, &w->lm_head);
    for (int64_t i = 0; i < w->config.num_layers; i++) {
        const struct model_weights_layer *l = &w->layers[i];
        const struct tensor_view *views[] = {
            &l->input_layernorm, &l->q_proj,
            &l->k_proj,          &l->v_proj,
            &l->o_proj,          &l->q_bias,
            &l->k_bias,          &l->v_bias,
            &l->o_bias,          &l->post_attention_layernorm,
            &l->gate_proj,       &l->up_proj,
            &l->down_proj,
        };
        for (size_t j = 0; j < sizeof(views) / sizeof(views[0]); j++)
            count_view(s, views[j]);
    }
    return count_shards(model_dir, &s->shards);
}

/* "BF16", or "BF16+F32" for a checkpoint that mixes dtypes. */
static void weight_dtypes(const struct weight_stats *s, char *buf, size_t len)
{
    size_t used = 0;
    buf[0] = '\0';
    for (int t = 0; t <= DTYPE_F32 && used < len; t++) {
        if (s->has_dtype[t])
            used += (size_t)snprintf(buf + used, len - used, "%s%s", used ? "+" : "",
                                     dtype_name((enum dtype)t));
    }
}

static const char *rope_type_name(enum rope_type t)
{
    switch (t) {
    case ROPE_DEFAULT:
        return "default";
    case ROPE_LINEAR:
        return "linear";
    case ROPE_LLAMA3:
        return "llama3";
    }
    return "?";
}

static const char *bias_name(const struct model_config *c)
{
    if (c->qkv_bias && c->o_bias)
        return "q/k/v/o";
    return c->qkv_bias ? "q/k/v" : "none";
}

static void print_human(const char *dir, const struct model_weights *w,
                        const struct weight_stats *s)
{
    const struct model_config *c = &w->config;
    char dtypes[64];
    weight_dtypes(s, dtypes, sizeof(dtypes));
    printf("model:          %s\n", dir);
    printf("architecture:   %s (%s)\n", model_arch_class(c->arch), model_arch_type(c->arch));
    printf("layers:         %lld\n", (long long)c->num_layers);
    printf("hidden:         %lld\n", (long long)c->hidden_size);
    printf("heads:          %lld (KV heads %lld, head dim %lld)\n", (long long)c->num_heads,
           (long long)c->num_kv_heads, (long long)c->head_dim);
    printf("intermediate:   %lld\n", (long long)c->intermediate_size);
    printf("vocab:          %lld\n", (long long)c->vocab_size);
    printf("max positions:  %lld\n", (long long)c->max_position_embeddings);
    printf("rms norm eps:   %g\n", c->rms_norm_eps);
    printf("rope:           %s, theta %g", rope_type_name(c->rope.type), c->rope.theta);
    if (c->rope.type != ROPE_DEFAULT)
        printf(", factor %g", c->rope.factor);
    if (c->rope.type == ROPE_LLAMA3)
        printf(", low freq factor %g, high freq factor %g, original max positions %lld",
               c->rope.low_freq_factor, c->rope.high_freq_factor,
               (long long)c->rope.original_max_position_embeddings);
    printf("\n");
    if (w->lm_head.data == w->embed_tokens.data)
        printf("tied:           yes\n");
    else if (c->tie_word_embeddings)
        /* transformers unties too when the checkpoint brings a different lm_head.weight. */
        printf("tied:           no (config ties, but the checkpoint has its own lm_head.weight)\n");
    else
        printf("tied:           no\n");
    printf("bias:           %s\n", bias_name(c));
    printf("dtype:          %s (weights %s)\n", dtype_torch_name(c->dtype), dtypes);
    if (c->bos_token_id >= 0)
        printf("tokens:         bos %d, eos", (int)c->bos_token_id);
    else
        printf("tokens:         bos none, eos");
    for (int i = 0; i < c->num_eos; i++)
        printf("%s%d", i ? "," : " ", (int)c->eos_token_ids[i]);
    printf("%s\n", c->num_eos == 0 ? " none" : "");
    printf("parameters:     %" PRIu64 " (%.2fM)\n", s->params, (double)s->params / 1e6);
    printf("bytes:          %" PRIu64 " (%.2f MiB)\n", s->bytes, (double)s->bytes / 1048576.0);
    printf("tensors:        %zu\n", s->tensors);
    printf("shards:         %d\n", s->shards);
}

static int print_json(const char *dir, const struct model_weights *w, const struct weight_stats *s)
{
    const struct model_config *c = &w->config;
    char dtypes[64];
    weight_dtypes(s, dtypes, sizeof(dtypes));
    json_t *eos = json_array();
    for (int i = 0; eos != NULL && i < c->num_eos; i++)
        json_array_append_new(eos, json_integer(c->eos_token_ids[i]));
    json_t *rope = json_pack("{s:s,s:f,s:f}", "type", rope_type_name(c->rope.type), "theta",
                             c->rope.theta, "factor", c->rope.factor);
    if (rope != NULL && c->rope.type == ROPE_LLAMA3) {
        json_object_set_new(rope, "low_freq_factor", json_real(c->rope.low_freq_factor));
        json_object_set_new(rope, "high_freq_factor", json_real(c->rope.high_freq_factor));
        json_object_set_new(rope, "original_max_position_embeddings",
                            json_integer(c->rope.original_max_position_embeddings));
    }
    json_t *root = json_pack(
        "{s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:o, s:b, s:b, s:b, s:b,"
        " s:s, s:s, s:I, s:o, s:I, s:I, s:I, s:i}",
        "model_dir", dir, "architecture", model_arch_class(c->arch), "model_type",
        model_arch_type(c->arch), "num_layers", (json_int_t)c->num_layers, "hidden_size",
        (json_int_t)c->hidden_size, "num_heads", (json_int_t)c->num_heads, "num_kv_heads",
        (json_int_t)c->num_kv_heads, "head_dim", (json_int_t)c->head_dim, "intermediate_size",
        (json_int_t)c->intermediate_size, "vocab_size", (json_int_t)c->vocab_size,
        "max_position_embeddings", (json_int_t)c->max_position_embeddings, "rms_norm_eps",
        c->rms_norm_eps, "rope", rope, "tie_word_embeddings", c->tie_word_embeddings,
        "lm_head_shared", w->lm_head.data == w->embed_tokens.data, "qkv_bias", c->qkv_bias,
        "o_bias", c->o_bias, "dtype", dtype_torch_name(c->dtype), "weight_dtypes", dtypes,
        "bos_token_id", (json_int_t)c->bos_token_id, "eos_token_ids", eos, "parameters",
        (json_int_t)s->params, "bytes", (json_int_t)s->bytes, "tensors", (json_int_t)s->tensors,
        "shards", s->shards);
    /* json_pack's "o" steals rope and eos even when it fails. */
    if (root == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    int rc = json_dumpf(root, stdout, JSON_COMPACT | JSON_PRESERVE_ORDER) == 0 &&
                     fputc('\n', stdout) != EOF
                 ? 0
                 : pagoda_error_set(PAGODA_EIO, "cannot write to standard output");
    json_decref(root);
    return rc;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " [--json] MODEL_DIR\n"
               "Loads a Hugging Face model directory (config.json + safetensors) through\n"
               "pagoda's loader and describes it; --json prints one JSON object.\n");
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    bool as_json = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            as_json = true;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || dir != NULL) {
            fprintf(stderr, PROG ": %s: unexpected argument\n", argv[i]);
            usage(stderr);
            return EXIT_USAGE;
        } else {
            dir = argv[i];
        }
    }
    if (dir == NULL) {
        usage(stderr);
        return EXIT_USAGE;
    }

    char msg[700];
    struct model_weights *w = NULL;
    struct weight_stats stats;
    pagoda_error_clear();
    int rc = model_weights_open(dir, &w);
    /* The EOS ids the group stops at: the tokenizer's too. */
    char note[640] = "";
    if (rc == 0)
        rc = model_config_add_tokenizer_eos(dir, &w->config, note, sizeof(note));
    if (note[0] != '\0')
        fprintf(stderr, PROG ": warning: %s: the tokenizer's EOS is not a stop id\n", note);
    if (rc == 0)
        rc = collect_stats(dir, w, &stats);
    if (rc == 0) {
        if (as_json)
            rc = print_json(dir, w, &stats);
        else
            print_human(dir, w, &stats);
    }
    model_weights_close(w);
    if (rc != 0) {
        fprintf(stderr, PROG ": %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
        return 1;
    }
    if (fflush(stdout) != 0) {
        fprintf(stderr, PROG ": cannot write to standard output\n");
        return 1;
    }
    return 0;
}
