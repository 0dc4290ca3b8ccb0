/* pagoda-mkmodel: writes a random-weight model in the Hugging Face layout (config.json and
 * BF16 safetensors, sharded with an index when asked), of any Llama, Mistral or Qwen2 shape.
 *
 * The output is a pure function of the flags: every tensor's values come from a generator
 * keyed by the seed and the tensor's name, so neither sharding nor the order of tensors changes
 * a value, and the same flags give byte-identical files. The weights are scaled so that a
 * forward pass gives logits that are far from flat (the Hugging Face check relies on it):
 * embeddings of standard deviation 1, linear weights of 1/sqrt(fan_in), norm weights near 1,
 * small biases. */
#include "common/dtype.h"
#include "common/error.h"
#include "common/parse.h"
#include "model/model_config.h"
#include "tools/safetensors_write.h"

#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "pagoda-mkmodel"
#define EXIT_USAGE 2

/* Flag ranges: wide enough for any real model, small enough that sizes never overflow. */
#define MKMODEL_MAX_VOCAB (1 << 24)
#define MKMODEL_MAX_HIDDEN (1 << 18)
#define MKMODEL_MAX_INTERMEDIATE (1 << 20)
#define MKMODEL_MAX_LAYERS 1024
#define MKMODEL_MAX_HEADS 1024
#define MKMODEL_MAX_HEAD_DIM 4096
#define MKMODEL_MAX_POSITIONS (1 << 30)
#define MKMODEL_MAX_SHARDS 9999
/* Largest model written (1 TiB of weights). */
#define MKMODEL_MAX_BYTES (UINT64_C(1) << 40)
/* Per layer: two norms, four projections, three MLP matrices, four biases at most. */
#define MKMODEL_TENSORS_PER_LAYER 13
/* Elements generated and written per step, so memory stays bounded for any model size. */
#define MKMODEL_CHUNK_ELEMS 65536

enum init_kind { INIT_EMBED, INIT_LINEAR, INIT_NORM, INIT_BIAS };

struct tensor_init {
    enum init_kind kind;
    int64_t fan_in;
    int shard;
};

struct model_plan {
    struct safetensors_entry *entries;
    struct tensor_init *inits;
    size_t count;
    size_t cap;
    uint64_t params;
    uint64_t bytes;
    int num_shards;
};

struct options {
    struct model_config cfg;
    bool legacy_rope;
    bool force;
    int64_t shards;
    uint64_t seed;
    const char *out_dir;
};

/* ---- deterministic random numbers ---- */

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * UINT64_C(0x100000001b3);
    return h;
}

/* The generator of one tensor: a function of the seed and the name only. */
static uint64_t tensor_stream(uint64_t seed, const char *name)
{
    uint64_t s = seed;
    uint64_t key = splitmix64(&s) ^ fnv1a64(name);
    return splitmix64(&key);
}

/* Uniform in [-1, 1), computed exactly in float (24 random bits scaled by a power of two), so
 * that the values do not depend on the platform's libm. */
static float uniform_pm1(uint64_t *state)
{
    return (float)(splitmix64(state) >> 40) * 0x1p-23f - 1.0f;
}

/* A uniform distribution on [-a, a] has standard deviation a / sqrt(3). */
static float init_half_width(const struct tensor_init *t)
{
    switch (t->kind) {
    case INIT_EMBED:
        return sqrtf(3.0f);
    case INIT_LINEAR:
        return sqrtf(3.0f / (float)t->fan_in);
    case INIT_NORM:
        return 0.1f;
    case INIT_BIAS:
    default:
        return 0.1f * sqrtf(3.0f);
    }
}

/* ---- the tensor list ---- */

static int plan_add(struct model_plan *p, int ndim, int64_t d0, int64_t d1, enum init_kind kind,
                    int64_t fan_in, const char *fmt, ...) __attribute__((format(printf, 7, 8)));

static int plan_add(struct model_plan *p, int ndim, int64_t d0, int64_t d1, enum init_kind kind,
                    int64_t fan_in, const char *fmt, ...)
{
    if (p->count == p->cap)
        return pagoda_error_set(PAGODA_EINTERNAL, "more tensors than planned (%zu)", p->cap);
    struct safetensors_entry *e = &p->entries[p->count];
    memset(e, 0, sizeof(*e));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->name, sizeof(e->name), fmt, ap);
    va_end(ap);
    e->dtype = DTYPE_BF16;
    e->ndim = ndim;
    e->shape[0] = d0;
    e->shape[1] = d1;
    p->inits[p->count] = (struct tensor_init){.kind = kind, .fan_in = fan_in, .shard = 0};
    p->params += (uint64_t)d0 * (uint64_t)(ndim == 2 ? d1 : 1);
    p->bytes += safetensors_entry_bytes(e);
    p->count++;
    return 0;
}

/* The tensors of a Hugging Face Llama / Mistral / Qwen2 checkpoint, in the order
 * transformers' own save_pretrained writes them for one layer, layers ascending. */
static int plan_tensors(const struct model_config *c, struct model_plan *p)
{
    int64_t h = c->hidden_size, q_dim = c->num_heads * c->head_dim;
    int64_t kv_dim = c->num_kv_heads * c->head_dim, inter = c->intermediate_size;
    int rc = plan_add(p, 2, c->vocab_size, h, INIT_EMBED, 0, "model.embed_tokens.weight");
    for (int64_t i = 0; i < c->num_layers && rc == 0; i++) {
        const char *l = "model.layers";
        long long n = (long long)i;
        rc = plan_add(p, 1, h, 0, INIT_NORM, 0, "%s.%lld.input_layernorm.weight", l, n);
        if (rc == 0)
            rc = plan_add(p, 2, q_dim, h, INIT_LINEAR, h, "%s.%lld.self_attn.q_proj.weight", l, n);
        if (rc == 0 && c->qkv_bias)
            rc = plan_add(p, 1, q_dim, 0, INIT_BIAS, 0, "%s.%lld.self_attn.q_proj.bias", l, n);
        if (rc == 0)
            rc = plan_add(p, 2, kv_dim, h, INIT_LINEAR, h, "%s.%lld.self_attn.k_proj.weight", l, n);
        if (rc == 0 && c->qkv_bias)
            rc = plan_add(p, 1, kv_dim, 0, INIT_BIAS, 0, "%s.%lld.self_attn.k_proj.bias", l, n);
        if (rc == 0)
            rc = plan_add(p, 2, kv_dim, h, INIT_LINEAR, h, "%s.%lld.self_attn.v_proj.weight", l, n);
        if (rc == 0 && c->qkv_bias)
            rc = plan_add(p, 1, kv_dim, 0, INIT_BIAS, 0, "%s.%lld.self_attn.v_proj.bias", l, n);
        if (rc == 0)
            rc = plan_add(p, 2, h, q_dim, INIT_LINEAR, q_dim, "%s.%lld.self_attn.o_proj.weight", l,
                          n);
        if (rc == 0 && c->o_bias)
            rc = plan_add(p, 1, h, 0, INIT_BIAS, 0, "%s.%lld.self_attn.o_proj.bias", l, n);
        if (rc == 0)
            rc =
                plan_add(p, 1, h, 0, INIT_NORM, 0, "%s.%lld.post_attention_layernorm.weight", l, n);
        if (rc == 0)
            rc = plan_add(p, 2, inter, h, INIT_LINEAR, h, "%s.%lld.mlp.gate_proj.weight", l, n);
        if (rc == 0)
            rc = plan_add(p, 2, inter, h, INIT_LINEAR, h, "%s.%lld.mlp.up_proj.weight", l, n);
        if (rc == 0)
            rc = plan_add(p, 2, h, inter, INIT_LINEAR, inter, "%s.%lld.mlp.down_proj.weight", l, n);
    }
    if (rc == 0)
        rc = plan_add(p, 1, h, 0, INIT_NORM, 0, "model.norm.weight");
    if (rc == 0 && !c->tie_word_embeddings)
        rc = plan_add(p, 2, c->vocab_size, h, INIT_LINEAR, h, "lm_head.weight");
    return rc;
}

/* Splits the tensors, in order, into num_shards runs of roughly equal bytes, none empty: a
 * tensor opens the next shard when its middle lies past the current shard's share, or when
 * the remaining tensors are just enough to give every remaining shard one. */
static void plan_shards(struct model_plan *p, int num_shards)
{
    int shard = 0;
    size_t in_shard = 0;
    uint64_t before = 0;
    for (size_t i = 0; i < p->count; i++) {
        uint64_t bytes = safetensors_entry_bytes(&p->entries[i]);
        size_t shards_after = (size_t)(num_shards - 1 - shard);
        /* (shard + 1) / num_shards of the total, in floating point: exact enough for a split
         * that is only meant to be even, and free of overflow. */
        double share_end = (double)p->bytes * (double)(shard + 1) / (double)num_shards;
        if (in_shard > 0 && shards_after > 0 &&
            (p->count - i == shards_after || (double)before + (double)bytes / 2 > share_end)) {
            shard++;
            in_shard = 0;
        }
        p->inits[i].shard = shard;
        in_shard++;
        before += bytes;
    }
    p->num_shards = num_shards;
}

static void plan_free(struct model_plan *p)
{
    free(p->entries);
    free(p->inits);
}

/* ---- files ---- */

static int join_path(char *buf, size_t len, const char *dir, const char *name)
{
    if ((size_t)snprintf(buf, len, "%s/%s", dir, name) >= len)
        return pagoda_error_set(PAGODA_EINVAL, "%s/%s: path too long", dir, name);
    return 0;
}

static void shard_name(char *buf, size_t len, int shard, int num_shards)
{
    if (num_shards == 1)
        snprintf(buf, len, "model.safetensors");
    else
        snprintf(buf, len, "model-%05d-of-%05d.safetensors", shard + 1, num_shards);
}

/* Writes text to dir/name through a temporary file and a rename. */
static int write_text_file(const char *dir, const char *name, const char *text)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    int rc = join_path(path, sizeof(path), dir, name);
    if (rc != 0)
        return rc;
    if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= sizeof(tmp))
        return pagoda_error_set(PAGODA_EINVAL, "%s: path too long", path);
    FILE *f = fopen(tmp, "wb");
    if (f == NULL)
        return pagoda_error_set(pagoda_from_errno(errno), "%s: cannot create: %s", tmp,
                                strerror(errno));
    size_t len = strlen(text);
    bool ok = fwrite(text, 1, len, f) == len && fflush(f) == 0 && fsync(fileno(f)) == 0;
    int saved = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (!ok) {
        unlink(tmp);
        return pagoda_error_set(pagoda_from_errno(saved), "%s: write failed: %s", tmp,
                                strerror(saved));
    }
    if (rename(tmp, path) != 0) {
        saved = errno;
        unlink(tmp);
        return pagoda_error_set(pagoda_from_errno(saved), "%s: cannot rename: %s", tmp,
                                strerror(saved));
    }
    return 0;
}

/* Serialises a JSON document the way transformers does (indent 2, sorted keys, final newline)
 * and writes it to dir/name. */
static int write_json_file(const char *dir, const char *name, const json_t *doc)
{
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS);
    if (text == NULL)
        return PAGODA_ENOMEM;
    size_t len = strlen(text);
    char *with_newline = malloc(len + 2);
    if (with_newline == NULL) {
        free(text);
        return PAGODA_ENOMEM;
    }
    memcpy(with_newline, text, len);
    memcpy(with_newline + len, "\n", 2);
    int rc = write_text_file(dir, name, with_newline);
    free(with_newline);
    free(text);
    return rc;
}

/* Creates dir and its missing parents. */
static int make_dirs(const char *dir)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof(path), "%s", dir) >= sizeof(path))
        return pagoda_error_set(PAGODA_EINVAL, "--out: path too long");
    for (char *p = path + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char saved = *p;
        *p = '\0';
        if (mkdir(path, 0755) != 0 && errno != EEXIST)
            return pagoda_error_set(pagoda_from_errno(errno), "--out: cannot create %s: %s", path,
                                    strerror(errno));
        *p = saved;
        if (saved == '\0')
            break;
    }
    struct stat st;
    if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
        return pagoda_error_set(PAGODA_EINVAL, "--out: %s is not a directory", dir);
    return 0;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* The files a model directory's loader would read, and our temporary files: what --force
 * removes so that a previous model (another shard count) cannot mix with the new one. */
static bool is_model_file(const char *name)
{
    return strcmp(name, "config.json") == 0 || strcmp(name, "config.json.tmp") == 0 ||
           ends_with(name, ".safetensors") || ends_with(name, ".safetensors.tmp") ||
           strcmp(name, "model.safetensors.index.json") == 0 ||
           strcmp(name, "model.safetensors.index.json.tmp") == 0;
}

/* Refuses a non-empty output directory, or with force empties it of model files. */
static int prepare_out_dir(const char *dir, bool force)
{
    int rc = make_dirs(dir);
    if (rc != 0)
        return rc;
    DIR *d = opendir(dir);
    if (d == NULL)
        return pagoda_error_set(pagoda_from_errno(errno), "--out: cannot open %s: %s", dir,
                                strerror(errno));
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") == 0 || strcmp(ent->d_name, "..") == 0)
            continue;
        if (!force) {
            rc = pagoda_error_set(PAGODA_EEXIST,
                                  "--out: %s is not empty (--force replaces the model in it)", dir);
            break;
        }
        if (!is_model_file(ent->d_name))
            continue;
        char path[PATH_MAX];
        rc = join_path(path, sizeof(path), dir, ent->d_name);
        if (rc == 0 && unlink(path) != 0)
            rc = pagoda_error_set(pagoda_from_errno(errno), "--force: cannot remove %s: %s", path,
                                  strerror(errno));
        if (rc != 0)
            break;
    }
    closedir(d);
    return rc;
}

/* Generates one tensor's values chunk by chunk and streams them to w. */
static int write_tensor(struct safetensors_writer *w, const struct safetensors_entry *e,
                        const struct tensor_init *init, uint64_t seed, uint16_t *chunk)
{
    uint64_t state = tensor_stream(seed, e->name);
    uint64_t n = safetensors_entry_bytes(e) / dtype_size(e->dtype);
    float a = init_half_width(init);
    float center = init->kind == INIT_NORM ? 1.0f : 0.0f;
    while (n > 0) {
        size_t m = n < MKMODEL_CHUNK_ELEMS ? (size_t)n : MKMODEL_CHUNK_ELEMS;
        for (size_t i = 0; i < m; i++)
            chunk[i] = f32_to_bf16(center + a * uniform_pm1(&state));
        int rc = safetensors_writer_write(w, chunk, m * sizeof(*chunk));
        if (rc != 0)
            return rc;
        n -= m;
    }
    return 0;
}

static int write_shards(const struct options *o, const struct model_plan *p)
{
    int rc = 0;
    uint16_t *chunk = malloc(MKMODEL_CHUNK_ELEMS * sizeof(*chunk));
    if (chunk == NULL)
        return PAGODA_ENOMEM;
    size_t first = 0;
    for (int s = 0; s < p->num_shards && rc == 0; s++) {
        size_t end = first;
        while (end < p->count && p->inits[end].shard == s)
            end++;
        char name[64], path[PATH_MAX];
        shard_name(name, sizeof(name), s, p->num_shards);
        rc = join_path(path, sizeof(path), o->out_dir, name);
        struct safetensors_writer *w = NULL;
        if (rc == 0)
            rc = safetensors_writer_open(path, &p->entries[first], end - first, &w);
        for (size_t i = first; i < end && rc == 0; i++)
            rc = write_tensor(w, &p->entries[i], &p->inits[i], o->seed, chunk);
        if (rc == 0)
            rc = safetensors_writer_commit(w);
        else
            safetensors_writer_abort(w);
        first = end;
    }
    free(chunk);
    return rc;
}

/* model.safetensors.index.json: {"metadata": {"total_size": bytes}, "weight_map": {...}}. */
static int write_index(const struct options *o, const struct model_plan *p)
{
    int rc = PAGODA_ENOMEM;
    json_t *map = json_object();
    json_t *root = json_pack("{s:{s:I}}", "metadata", "total_size", (json_int_t)p->bytes);
    if (map == NULL || root == NULL)
        goto fail;
    for (size_t i = 0; i < p->count; i++) {
        char name[64];
        shard_name(name, sizeof(name), p->inits[i].shard, p->num_shards);
        if (json_object_set_new(map, p->entries[i].name, json_string(name)) != 0)
            goto fail;
    }
    rc = json_object_set(root, "weight_map", map) != 0
             ? PAGODA_ENOMEM
             : write_json_file(o->out_dir, "model.safetensors.index.json", root);
fail:
    json_decref(map);
    json_decref(root);
    return rc;
}

/* ---- flags ---- */

enum flag_id {
    F_HELP,
    F_PRESET,
    F_ARCH,
    F_VOCAB,
    F_HIDDEN,
    F_INTERMEDIATE,
    F_LAYERS,
    F_HEADS,
    F_KV_HEADS,
    F_HEAD_DIM,
    F_RMS_EPS,
    F_MAX_POSITIONS,
    F_BOS,
    F_EOS,
    F_TIE,
    F_ATTN_BIAS,
    F_ROPE_THETA,
    F_ROPE_TYPE,
    F_ROPE_FACTOR,
    F_ROPE_LOW,
    F_ROPE_HIGH,
    F_ROPE_ORIG,
    F_LEGACY_ROPE,
    F_SHARDS,
    F_SEED,
    F_OUT,
    F_FORCE,
    F_COUNT
};

static const struct flag {
    const char *name;
    bool boolean;
} flags[F_COUNT] = {
    [F_HELP] = {"--help", true},
    [F_PRESET] = {"--preset", false},
    [F_ARCH] = {"--arch", false},
    [F_VOCAB] = {"--vocab", false},
    [F_HIDDEN] = {"--hidden", false},
    [F_INTERMEDIATE] = {"--intermediate", false},
    [F_LAYERS] = {"--layers", false},
    [F_HEADS] = {"--heads", false},
    [F_KV_HEADS] = {"--kv-heads", false},
    [F_HEAD_DIM] = {"--head-dim", false},
    [F_RMS_EPS] = {"--rms-eps", false},
    [F_MAX_POSITIONS] = {"--max-positions", false},
    [F_BOS] = {"--bos", false},
    [F_EOS] = {"--eos", false},
    [F_TIE] = {"--tie-embeddings", true},
    [F_ATTN_BIAS] = {"--attention-bias", true},
    [F_ROPE_THETA] = {"--rope-theta", false},
    [F_ROPE_TYPE] = {"--rope-type", false},
    [F_ROPE_FACTOR] = {"--rope-factor", false},
    [F_ROPE_LOW] = {"--rope-low-freq-factor", false},
    [F_ROPE_HIGH] = {"--rope-high-freq-factor", false},
    [F_ROPE_ORIG] = {"--rope-original-max-positions", false},
    [F_LEGACY_ROPE] = {"--legacy-rope", true},
    [F_SHARDS] = {"--shards", false},
    [F_SEED] = {"--seed", false},
    [F_OUT] = {"--out", false},
    [F_FORCE] = {"--force", true},
};

static void usage(FILE *f)
{
    fprintf(f, "usage: " PROG " --out DIR [flags]\n"
               "Writes a random-weight model (config.json + BF16 safetensors) in the Hugging Face\n"
               "layout. Flags apply on top of the preset; the same flags give identical files.\n"
               "  --preset tiny            the base config (default; see docs/mkmodel.md)\n"
               "  --arch llama|mistral|qwen2\n"
               "  --vocab N --hidden N --intermediate N --layers N\n"
               "  --heads N --kv-heads N --head-dim N   (head dim: hidden/heads unless given)\n"
               "  --rms-eps X --max-positions N --bos ID --eos ID[,ID...]\n"
               "  --tie-embeddings         share lm_head with the embeddings\n"
               "  --attention-bias         Llama: biases on q, k, v and o (Qwen2 always has QKV)\n"
               "  --rope-theta X --rope-type default|linear|llama3 --rope-factor X\n"
               "  --rope-low-freq-factor X --rope-high-freq-factor X\n"
               "  --rope-original-max-positions N\n"
               "  --legacy-rope            write rope_theta + rope_scaling, not rope_parameters\n"
               "  --shards N               N > 1: model-0000K-of-0000N files and an index\n"
               "  --seed S                 (default 0)\n"
               "  --out DIR                created; must be empty unless --force\n"
               "  --force                  replace the model files in a non-empty DIR\n");
}

/* What the command line said, before it is applied to the preset. */
struct flag_values {
    const char *text[F_COUNT]; /* NULL when the flag was not given */
};

static int bool_value(const char *flag, const char *text, bool *out)
{
    if (strcmp(text, "true") == 0 || strcmp(text, "1") == 0)
        *out = true;
    else if (strcmp(text, "false") == 0 || strcmp(text, "0") == 0)
        *out = false;
    else
        return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' is not true or false", flag, text);
    return 0;
}

/* Splits argv into flag values; "--flag value" and "--flag=value" both work, booleans take
 * "=true" or "=false" or nothing. */
static int collect_flags(int argc, char **argv, struct flag_values *v)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *eq = strchr(arg, '=');
        size_t name_len = eq != NULL ? (size_t)(eq - arg) : strlen(arg);
        int id = -1;
        for (int f = 0; f < F_COUNT; f++) {
            if (strlen(flags[f].name) == name_len && strncmp(flags[f].name, arg, name_len) == 0)
                id = f;
        }
        if (id < 0 && strcmp(arg, "-h") == 0)
            id = F_HELP;
        if (id < 0)
            return pagoda_error_set(PAGODA_EINVAL, "%s: unknown flag (see --help)", arg);
        if (eq != NULL)
            v->text[id] = eq + 1;
        else if (flags[id].boolean)
            v->text[id] = "true";
        else if (i + 1 < argc)
            v->text[id] = argv[++i];
        else
            return pagoda_error_set(PAGODA_EINVAL, "%s: needs a value", flags[id].name);
    }
    return 0;
}

/* Parses an integer flag when given. */
static int int_flag(const struct flag_values *v, int id, int64_t min, int64_t max, int64_t *out)
{
    if (v->text[id] == NULL)
        return 0;
    return parse_i64(flags[id].name, v->text[id], min, max, out);
}

static int real_flag(const struct flag_values *v, int id, double min, double max, double *out)
{
    if (v->text[id] == NULL)
        return 0;
    return parse_f64(flags[id].name, v->text[id], min, max, out);
}

static int apply_sizes(const struct flag_values *v, struct model_config *c)
{
    int rc;
    bool head_dim_given = v->text[F_HEAD_DIM] != NULL;
    if ((rc = int_flag(v, F_VOCAB, 1, MKMODEL_MAX_VOCAB, &c->vocab_size)) != 0 ||
        (rc = int_flag(v, F_HIDDEN, 1, MKMODEL_MAX_HIDDEN, &c->hidden_size)) != 0 ||
        (rc = int_flag(v, F_INTERMEDIATE, 1, MKMODEL_MAX_INTERMEDIATE, &c->intermediate_size)) !=
            0 ||
        (rc = int_flag(v, F_LAYERS, 1, MKMODEL_MAX_LAYERS, &c->num_layers)) != 0 ||
        (rc = int_flag(v, F_HEADS, 1, MKMODEL_MAX_HEADS, &c->num_heads)) != 0 ||
        (rc = int_flag(v, F_KV_HEADS, 1, MKMODEL_MAX_HEADS, &c->num_kv_heads)) != 0 ||
        (rc = int_flag(v, F_HEAD_DIM, 1, MKMODEL_MAX_HEAD_DIM, &c->head_dim)) != 0)
        return rc;
    /* The head dim follows hidden / heads, as transformers derives it, unless given. */
    if (!head_dim_given && (v->text[F_HIDDEN] != NULL || v->text[F_HEADS] != NULL)) {
        if (c->hidden_size % c->num_heads != 0)
            return pagoda_error_set(
                PAGODA_EINVAL,
                "%s: hidden size %lld is not divisible by %lld heads (or give --head-dim)",
                v->text[F_HEADS] != NULL ? "--heads" : "--hidden", (long long)c->hidden_size,
                (long long)c->num_heads);
        c->head_dim = c->hidden_size / c->num_heads;
    }
    if (c->head_dim % 2 != 0 || c->head_dim < 2)
        return pagoda_error_set(PAGODA_EINVAL,
                                "%s: head dim %lld must be even (RoPE rotates pairs)",
                                head_dim_given ? "--head-dim" : "--heads", (long long)c->head_dim);
    if (c->num_heads % c->num_kv_heads != 0)
        return pagoda_error_set(PAGODA_EINVAL, "--kv-heads: %lld KV heads do not divide %lld heads",
                                (long long)c->num_kv_heads, (long long)c->num_heads);
    return 0;
}

static int apply_arch(const struct flag_values *v, struct model_config *c)
{
    int rc;
    const char *arch = v->text[F_ARCH];
    if (arch != NULL) {
        if (strcmp(arch, "llama") == 0)
            c->arch = MODEL_ARCH_LLAMA;
        else if (strcmp(arch, "mistral") == 0)
            c->arch = MODEL_ARCH_MISTRAL;
        else if (strcmp(arch, "qwen2") == 0)
            c->arch = MODEL_ARCH_QWEN2;
        else
            return pagoda_error_set(PAGODA_EINVAL, "--arch: '%s' is not llama, mistral or qwen2",
                                    arch);
    }
    bool attention_bias = false;
    if (v->text[F_ATTN_BIAS] != NULL &&
        (rc = bool_value("--attention-bias", v->text[F_ATTN_BIAS], &attention_bias)) != 0)
        return rc;
    if (attention_bias && c->arch != MODEL_ARCH_LLAMA)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--attention-bias: only for --arch llama (qwen2 always has Q, K "
                                "and V biases, mistral none)");
    /* Qwen2 always carries Q, K and V biases and no o_proj bias; Llama's attention_bias puts a
     * bias on all four projections; Mistral has none. */
    c->qkv_bias = c->arch == MODEL_ARCH_QWEN2 || attention_bias;
    c->o_bias = attention_bias;
    if (v->text[F_TIE] != NULL &&
        (rc = bool_value("--tie-embeddings", v->text[F_TIE], &c->tie_word_embeddings)) != 0)
        return rc;
    return 0;
}

static int apply_rope(const struct flag_values *v, struct model_config *c)
{
    int rc;
    struct rope_config *r = &c->rope;
    const char *type = v->text[F_ROPE_TYPE];
    if (type != NULL) {
        if (strcmp(type, "default") == 0)
            r->type = ROPE_DEFAULT;
        else if (strcmp(type, "linear") == 0)
            r->type = ROPE_LINEAR;
        else if (strcmp(type, "llama3") == 0)
            r->type = ROPE_LLAMA3;
        else
            return pagoda_error_set(PAGODA_EINVAL,
                                    "--rope-type: '%s' is not default, linear or llama3", type);
    }
    if ((rc = real_flag(v, F_ROPE_THETA, 1e-3, 1e12, &r->theta)) != 0)
        return rc;
    if (r->type == ROPE_DEFAULT) {
        if (v->text[F_ROPE_FACTOR] != NULL)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "--rope-factor: only with --rope-type linear or llama3");
        r->factor = 1.0;
    } else {
        /* Defaults that make a plausible scaled model: linear x2; llama3 as Llama 3.1 (x8,
         * low 1, high 4), trained originally on max_positions / factor positions. */
        double factor = r->type == ROPE_LINEAR ? 2.0 : 8.0;
        if ((rc = real_flag(v, F_ROPE_FACTOR, 1.0, 1e6, &factor)) != 0)
            return rc;
        r->factor = factor;
    }
    if (r->type != ROPE_LLAMA3) {
        for (int id = F_ROPE_LOW; id <= F_ROPE_ORIG; id++) {
            if (v->text[id] != NULL)
                return pagoda_error_set(PAGODA_EINVAL, "%s: only with --rope-type llama3",
                                        flags[id].name);
        }
        return 0;
    }
    r->low_freq_factor = 1.0;
    r->high_freq_factor = 4.0;
    int64_t orig = (int64_t)((double)c->max_position_embeddings / r->factor);
    r->original_max_position_embeddings = orig > 0 ? orig : 1;
    if ((rc = real_flag(v, F_ROPE_LOW, 1e-6, 1e6, &r->low_freq_factor)) != 0 ||
        (rc = real_flag(v, F_ROPE_HIGH, 1e-6, 1e6, &r->high_freq_factor)) != 0 ||
        (rc = int_flag(v, F_ROPE_ORIG, 1, MKMODEL_MAX_POSITIONS,
                       &r->original_max_position_embeddings)) != 0)
        return rc;
    if (r->high_freq_factor <= r->low_freq_factor)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--rope-high-freq-factor: %g must be greater than the low "
                                "frequency factor %g",
                                r->high_freq_factor, r->low_freq_factor);
    return 0;
}

static int apply_tokens(const struct flag_values *v, struct model_config *c)
{
    int64_t bos = c->bos_token_id;
    int rc = int_flag(v, F_BOS, -1, INT32_MAX, &bos);
    if (rc != 0)
        return rc;
    if (bos >= c->vocab_size)
        return pagoda_error_set(PAGODA_ERANGE,
                                "--bos: token %lld is outside the vocabulary of %lld",
                                (long long)bos, (long long)c->vocab_size);
    c->bos_token_id = (int32_t)bos;
    if (v->text[F_EOS] != NULL) {
        int32_t *ids;
        size_t n;
        rc = parse_i32_list("--eos", v->text[F_EOS], 0, INT32_MAX, MODEL_MAX_EOS, &ids, &n);
        if (rc != 0)
            return rc;
        memcpy(c->eos_token_ids, ids, n * sizeof(*ids));
        c->num_eos = (int)n;
        free(ids);
    }
    for (int i = 0; i < c->num_eos; i++) {
        if (c->eos_token_ids[i] >= c->vocab_size)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "--eos: token %d is outside the vocabulary of %lld",
                                    (int)c->eos_token_ids[i], (long long)c->vocab_size);
    }
    return 0;
}

/* Turns the command line into options: the preset, then every flag on top, then the checks
 * that name the flag at fault, then model_config_validate as the last word. */
static int parse_options(int argc, char **argv, struct options *o, bool *help)
{
    struct flag_values v = {0};
    int rc = collect_flags(argc, argv, &v);
    if (rc != 0)
        return rc;
    *help = v.text[F_HELP] != NULL;
    if (*help)
        return 0;
    if (v.text[F_PRESET] != NULL && strcmp(v.text[F_PRESET], "tiny") != 0)
        return pagoda_error_set(PAGODA_EINVAL, "--preset: '%s' is not a preset (tiny)",
                                v.text[F_PRESET]);
    model_config_tiny(&o->cfg);
    struct model_config *c = &o->cfg;
    c->dtype = DTYPE_BF16;
    if ((rc = apply_arch(&v, c)) != 0 || (rc = apply_sizes(&v, c)) != 0 ||
        (rc = real_flag(&v, F_RMS_EPS, 1e-12, 1.0, &c->rms_norm_eps)) != 0 ||
        (rc = int_flag(&v, F_MAX_POSITIONS, 1, MKMODEL_MAX_POSITIONS,
                       &c->max_position_embeddings)) != 0 ||
        (rc = apply_rope(&v, c)) != 0 || (rc = apply_tokens(&v, c)) != 0)
        return rc;
    if (v.text[F_LEGACY_ROPE] != NULL &&
        (rc = bool_value("--legacy-rope", v.text[F_LEGACY_ROPE], &o->legacy_rope)) != 0)
        return rc;
    if (v.text[F_FORCE] != NULL && (rc = bool_value("--force", v.text[F_FORCE], &o->force)) != 0)
        return rc;
    o->shards = 1;
    int64_t seed = 0;
    if ((rc = int_flag(&v, F_SHARDS, 1, MKMODEL_MAX_SHARDS, &o->shards)) != 0 ||
        (rc = int_flag(&v, F_SEED, 0, INT64_MAX, &seed)) != 0)
        return rc;
    o->seed = (uint64_t)seed;
    o->out_dir = v.text[F_OUT];
    if (o->out_dir == NULL || o->out_dir[0] == '\0')
        return pagoda_error_set(PAGODA_EINVAL, "--out: the output directory is required");
    rc = model_config_validate(c);
    if (rc != 0) {
        const char *detail = pagoda_error_detail();
        char msg[512];
        snprintf(msg, sizeof(msg), "%s", detail[0] != '\0' ? detail : pagoda_strerror(rc));
        return pagoda_error_set(rc, "invalid configuration: %s", msg);
    }
    return 0;
}

static int write_model(const struct options *o, struct model_plan *p)
{
    const struct model_config *c = &o->cfg;
    p->cap = 3 + (size_t)c->num_layers * MKMODEL_TENSORS_PER_LAYER;
    p->entries = calloc(p->cap, sizeof(*p->entries));
    p->inits = calloc(p->cap, sizeof(*p->inits));
    if (p->entries == NULL || p->inits == NULL)
        return PAGODA_ENOMEM;
    int rc = plan_tensors(c, p);
    if (rc != 0)
        return rc;
    if (p->bytes > MKMODEL_MAX_BYTES)
        return pagoda_error_set(PAGODA_ERANGE,
                                "the model would be %" PRIu64 " bytes, over the limit of %" PRIu64,
                                p->bytes, MKMODEL_MAX_BYTES);
    if ((uint64_t)o->shards > p->count)
        return pagoda_error_set(PAGODA_EINVAL, "--shards: %lld shards for only %zu tensors",
                                (long long)o->shards, p->count);
    plan_shards(p, (int)o->shards);

    json_t *config = NULL;
    if ((rc = prepare_out_dir(o->out_dir, o->force)) != 0 || (rc = write_shards(o, p)) != 0 ||
        (p->num_shards > 1 && (rc = write_index(o, p)) != 0))
        return rc;
    /* config.json last: a directory without it is visibly unfinished. */
    if ((rc = model_config_to_json(c, o->legacy_rope, &config)) != 0)
        return rc;
    rc = write_json_file(o->out_dir, "config.json", config);
    json_decref(config);
    return rc;
}

int main(int argc, char **argv)
{
    struct options o = {0};
    bool help = false;
    char msg[700];
    int rc = parse_options(argc, argv, &o, &help);
    if (rc != 0) {
        fprintf(stderr, PROG ": %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
        return EXIT_USAGE;
    }
    if (help) {
        usage(stdout);
        return 0;
    }
    struct model_plan plan = {0};
    pagoda_error_clear();
    rc = write_model(&o, &plan);
    if (rc != 0) {
        fprintf(stderr, PROG ": %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
        plan_free(&plan);
        return rc == PAGODA_EINVAL && strncmp(pagoda_error_detail(), "--", 2) == 0 ? EXIT_USAGE : 1;
    }
    int files = plan.num_shards + 1 + (plan.num_shards > 1);
    printf(PROG ": wrote %s: %s, %lld layers, hidden %lld, vocab %lld, %" PRIu64
                " parameters, %" PRIu64 " bytes of BF16 weights, %d files (%d shard%s)\n",
           o.out_dir, model_arch_class(o.cfg.arch), (long long)o.cfg.num_layers,
           (long long)o.cfg.hidden_size, (long long)o.cfg.vocab_size, plan.params, plan.bytes,
           files, plan.num_shards, plan.num_shards == 1 ? "" : "s");
    plan_free(&plan);
    return 0;
}
