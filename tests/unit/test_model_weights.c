/* Tests of model/model_weights.c: tiny models written here (config.json from
 * model_config_to_json, weights from a small safetensors writer), loaded whole, sharded, and
 * with each kind of damage a user meets. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "model/model_weights.h"

#include <dirent.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_TENSORS 64

struct tensor {
    char name[96];
    const char *dtype;
    int ndim;
    int64_t shape[2];
};

struct model {
    struct model_config cfg;
    struct tensor t[MAX_TENSORS];
    size_t n;
};

static size_t tensor_bytes(const struct tensor *t)
{
    size_t n = strcmp(t->dtype, "F32") == 0 ? 4 : 2;
    for (int i = 0; i < t->ndim; i++)
        n *= (size_t)t->shape[i];
    return n;
}

static void add(struct model *m, const char *dtype, int64_t d0, int64_t d1, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void add(struct model *m, const char *dtype, int64_t d0, int64_t d1, const char *fmt, ...)
{
    assert_true(m->n < MAX_TENSORS);
    struct tensor *t = &m->t[m->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof(t->name), fmt, ap);
    va_end(ap);
    t->dtype = dtype;
    t->ndim = d1 < 0 ? 1 : 2;
    t->shape[0] = d0;
    t->shape[1] = d1;
}

static struct tensor *find(struct model *m, const char *name)
{
    for (size_t i = 0; i < m->n; i++) {
        if (strcmp(m->t[i].name, name) == 0)
            return &m->t[i];
    }
    fail_msg("no tensor %s in the test model", name);
    return NULL;
}

static void drop(struct model *m, const char *name)
{
    struct tensor *t = find(m, name);
    size_t i = (size_t)(t - m->t);
    memmove(&m->t[i], &m->t[i + 1], (m->n - i - 1) * sizeof(*t));
    m->n--;
}

/* The tiny model: vocabulary 32, hidden 16, 2 layers, 4 heads of 6 (so that q_proj and o_proj
 * are not square), 2 KV heads, intermediate 20. Norms are F32, down_proj F16, the rest BF16:
 * one checkpoint may mix dtypes. lm_head.weight is written when with_lm_head. */
static void tiny_model(struct model *m, enum model_arch arch, bool with_lm_head)
{
    memset(m, 0, sizeof(*m));
    struct model_config *c = &m->cfg;
    model_config_tiny(c);
    c->arch = arch;
    c->vocab_size = 32;
    c->hidden_size = 16;
    c->intermediate_size = 20;
    c->num_layers = 2;
    c->num_heads = 4;
    c->num_kv_heads = 2;
    c->head_dim = 6;
    c->max_position_embeddings = 64;
    c->qkv_bias = arch == MODEL_ARCH_QWEN2;
    c->tie_word_embeddings = !with_lm_head;
    int64_t h = 16, q = 24, kv = 12, in = 20;
    add(m, "BF16", 32, h, "model.embed_tokens.weight");
    for (int l = 0; l < 2; l++) {
        add(m, "F32", h, -1, "model.layers.%d.input_layernorm.weight", l);
        add(m, "BF16", q, h, "model.layers.%d.self_attn.q_proj.weight", l);
        add(m, "BF16", kv, h, "model.layers.%d.self_attn.k_proj.weight", l);
        add(m, "BF16", kv, h, "model.layers.%d.self_attn.v_proj.weight", l);
        add(m, "BF16", h, q, "model.layers.%d.self_attn.o_proj.weight", l);
        if (c->qkv_bias) {
            add(m, "BF16", q, -1, "model.layers.%d.self_attn.q_proj.bias", l);
            add(m, "BF16", kv, -1, "model.layers.%d.self_attn.k_proj.bias", l);
            add(m, "BF16", kv, -1, "model.layers.%d.self_attn.v_proj.bias", l);
        }
        add(m, "F32", h, -1, "model.layers.%d.post_attention_layernorm.weight", l);
        add(m, "BF16", in, h, "model.layers.%d.mlp.gate_proj.weight", l);
        add(m, "BF16", in, h, "model.layers.%d.mlp.up_proj.weight", l);
        add(m, "F16", h, in, "model.layers.%d.mlp.down_proj.weight", l);
    }
    add(m, "F32", h, -1, "model.norm.weight");
    if (with_lm_head)
        add(m, "BF16", 32, h, "lm_head.weight");
}

/* Writes tensors [first, last) of m as one safetensors file; tensor k's bytes are all k + 1. */
static void write_safetensors(const char *path, const struct model *m, size_t first, size_t last)
{
    json_t *h = json_pack("{s:{s:s}}", "__metadata__", "format", "pt");
    size_t offset = 0;
    for (size_t k = first; k < last; k++) {
        const struct tensor *t = &m->t[k];
        json_t *shape = json_array();
        for (int i = 0; i < t->ndim; i++)
            json_array_append_new(shape, json_integer(t->shape[i]));
        json_object_set_new(h, t->name,
                            json_pack("{s:s,s:o,s:[I,I]}", "dtype", t->dtype, "shape", shape,
                                      "data_offsets", (json_int_t)offset,
                                      (json_int_t)(offset + tensor_bytes(t))));
        offset += tensor_bytes(t);
    }
    char *header = json_dumps(h, JSON_COMPACT);
    json_decref(h);
    assert_non_null(header);
    size_t len = strlen(header), padded = (len + 7) / 8 * 8;
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        fputc((int)((padded >> (8 * i)) & 0xff), f);
    fwrite(header, 1, len, f);
    for (size_t i = len; i < padded; i++)
        fputc(' ', f);
    for (size_t k = first; k < last; k++) {
        for (size_t i = 0; i < tensor_bytes(&m->t[k]); i++)
            fputc((int)(k + 1), f);
    }
    assert_int_equal(fclose(f), 0);
    free(header);
}

static void write_config(const char *dir, const struct model_config *c)
{
    char path[128];
    json_t *root;
    assert_int_equal(model_config_to_json(c, false, &root), 0);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    assert_int_equal(json_dump_file(root, path, JSON_INDENT(2)), 0);
    json_decref(root);
}

/* Writes config.json and model.safetensors into a new directory named in dir. */
static void write_model(char *dir, const struct model *m)
{
    strcpy(dir, "/tmp/pagoda_weights_XXXXXX");
    assert_non_null(mkdtemp(dir));
    write_config(dir, &m->cfg);
    char path[128];
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    write_safetensors(path, m, 0, m->n);
}

/* Writes config.json, two shards (the first half of the tensors, then the rest) and the
 * index into a new directory named in dir. */
static void write_sharded_model(char *dir, const struct model *m)
{
    strcpy(dir, "/tmp/pagoda_weights_XXXXXX");
    assert_non_null(mkdtemp(dir));
    write_config(dir, &m->cfg);
    static const char *const shards[] = {"model-00001-of-00002.safetensors",
                                         "model-00002-of-00002.safetensors"};
    size_t split = m->n / 2;
    char path[128];
    json_t *map = json_object();
    for (size_t k = 0; k < m->n; k++)
        json_object_set_new(map, m->t[k].name, json_string(shards[k >= split]));
    for (int s = 0; s < 2; s++) {
        snprintf(path, sizeof(path), "%s/%s", dir, shards[s]);
        write_safetensors(path, m, s == 0 ? 0 : split, s == 0 ? split : m->n);
    }
    json_t *index = json_pack("{s:{s:i},s:o}", "metadata", "total_size", 0, "weight_map", map);
    snprintf(path, sizeof(path), "%s/model.safetensors.index.json", dir);
    assert_int_equal(json_dump_file(index, path, 0), 0);
    json_decref(index);
}

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    struct dirent *e;
    char path[512];
    while ((e = readdir(d)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
        unlink(path);
    }
    closedir(d);
    rmdir(dir);
}

/* The view is the tensor called name in m: same name, dtype, shape, and its data (every byte
 * the tensor's index plus one). */
static void assert_view(struct model *m, const struct tensor_view *v, const char *name)
{
    assert_non_null(v->name);
    assert_string_equal(v->name, name);
    const struct tensor *t = find(m, name);
    assert_string_equal(dtype_name(v->dtype), t->dtype);
    assert_int_equal(v->ndim, t->ndim);
    for (int i = 0; i < t->ndim; i++)
        assert_int_equal(v->shape[i], t->shape[i]);
    assert_int_equal(v->nbytes, tensor_bytes(t));
    const uint8_t *p = v->data;
    assert_int_equal(p[0], (t - m->t) + 1);
    assert_int_equal(p[v->nbytes - 1], (t - m->t) + 1);
}

static void assert_absent(const struct tensor_view *v)
{
    assert_null(v->name);
    assert_null(v->data);
    assert_int_equal(v->nbytes, 0);
}

/* Every view of w is bound to the right tensor of m. */
static void assert_all_views(struct model *m, const struct model_weights *w)
{
    char name[96];
    assert_view(m, &w->embed_tokens, "model.embed_tokens.weight");
    assert_view(m, &w->norm, "model.norm.weight");
    for (int l = 0; l < 2; l++) {
        const struct model_weights_layer *L = &w->layers[l];
#define CHECK(field, suffix)                                                                       \
    snprintf(name, sizeof(name), "model.layers.%d.%s", l, suffix);                                 \
    assert_view(m, &L->field, name)
        CHECK(input_layernorm, "input_layernorm.weight");
        CHECK(q_proj, "self_attn.q_proj.weight");
        CHECK(k_proj, "self_attn.k_proj.weight");
        CHECK(v_proj, "self_attn.v_proj.weight");
        CHECK(o_proj, "self_attn.o_proj.weight");
        CHECK(post_attention_layernorm, "post_attention_layernorm.weight");
        CHECK(gate_proj, "mlp.gate_proj.weight");
        CHECK(up_proj, "mlp.up_proj.weight");
        CHECK(down_proj, "mlp.down_proj.weight");
        if (w->config.qkv_bias) {
            CHECK(q_bias, "self_attn.q_proj.bias");
            CHECK(k_bias, "self_attn.k_proj.bias");
            CHECK(v_bias, "self_attn.v_proj.bias");
        } else {
            assert_absent(&L->q_bias);
            assert_absent(&L->k_bias);
            assert_absent(&L->v_bias);
        }
        if (w->config.o_bias) {
            CHECK(o_bias, "self_attn.o_proj.bias");
        } else {
            assert_absent(&L->o_bias);
        }
#undef CHECK
    }
}

static struct model_weights *open_ok(const char *dir)
{
    struct model_weights *w = NULL;
    int rc = model_weights_open(dir, &w);
    if (rc != 0)
        print_error("%s\n", pagoda_error_detail());
    assert_int_equal(rc, 0);
    return w;
}

static void expect_open_error(const char *dir, int code, const char *needle)
{
    struct model_weights *w = NULL;
    pagoda_error_clear();
    int rc = model_weights_open(dir, &w);
    if (rc != code || strstr(pagoda_error_detail(), needle) == NULL)
        print_error("got %d \"%s\", want %d with \"%s\"\n", rc, pagoda_error_detail(), code,
                    needle);
    assert_int_equal(rc, code);
    assert_null(w);
    assert_non_null(strstr(pagoda_error_detail(), needle));
}

static void test_llama_loads(void **state)
{
    struct model m;
    char dir[32];
    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    write_model(dir, &m);
    struct model_weights *w = open_ok(dir);
    assert_int_equal(w->config.arch, MODEL_ARCH_LLAMA);
    assert_int_equal(w->config.num_layers, 2);
    assert_int_equal(w->config.head_dim, 6);
    assert_all_views(&m, w);
    assert_view(&m, &w->lm_head, "lm_head.weight");
    assert_ptr_not_equal(w->lm_head.data, w->embed_tokens.data);
    model_weights_close(w);
    model_weights_close(NULL);
    remove_dir(dir);
}

static void test_qwen2_biases_and_tied_head(void **state)
{
    struct model m;
    char dir[32];
    tiny_model(&m, MODEL_ARCH_QWEN2, false);
    /* Older checkpoints carry the rotary inverse frequencies; they are recomputed, not used. */
    add(&m, "F32", 3, -1, "model.layers.0.self_attn.rotary_emb.inv_freq");
    write_model(dir, &m);
    struct model_weights *w = open_ok(dir);
    assert_true(w->config.qkv_bias);
    assert_false(w->config.o_bias);
    assert_all_views(&m, w);
    /* Tied and no lm_head.weight: the head is the embedding. */
    assert_view(&m, &w->lm_head, "model.embed_tokens.weight");
    assert_ptr_equal(w->lm_head.data, w->embed_tokens.data);
    model_weights_close(w);
    remove_dir(dir);
}

static void test_llama_attention_bias(void **state)
{
    struct model m;
    char dir[32];
    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    m.cfg.qkv_bias = m.cfg.o_bias = true;
    /* Tied, but the checkpoint has lm_head.weight too: it is used. */
    m.cfg.tie_word_embeddings = true;
    for (int l = 0; l < 2; l++) {
        add(&m, "BF16", 24, -1, "model.layers.%d.self_attn.q_proj.bias", l);
        add(&m, "BF16", 12, -1, "model.layers.%d.self_attn.k_proj.bias", l);
        add(&m, "BF16", 12, -1, "model.layers.%d.self_attn.v_proj.bias", l);
        add(&m, "F32", 16, -1, "model.layers.%d.self_attn.o_proj.bias", l);
    }
    write_model(dir, &m);
    struct model_weights *w = open_ok(dir);
    assert_all_views(&m, w);
    assert_view(&m, &w->lm_head, "lm_head.weight");
    model_weights_close(w);

    /* Without the o_proj biases the config's attention_bias cannot be honoured. */
    drop(&m, "model.layers.1.self_attn.o_proj.bias");
    remove_dir(dir);
    write_model(dir, &m);
    expect_open_error(dir, PAGODA_ENOENT, "tensor model.layers.1.self_attn.o_proj.bias is missing");
    remove_dir(dir);
}

static void test_sharded_model_loads(void **state)
{
    struct model m;
    char dir[32];
    tiny_model(&m, MODEL_ARCH_MISTRAL, true);
    write_sharded_model(dir, &m);
    struct model_weights *w = open_ok(dir);
    assert_int_equal(w->config.arch, MODEL_ARCH_MISTRAL);
    assert_all_views(&m, w);
    assert_view(&m, &w->lm_head, "lm_head.weight");
    model_weights_close(w);
    remove_dir(dir);
}

static void test_refuses_missing_tensor(void **state)
{
    struct model m;
    char dir[32];
    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    drop(&m, "model.layers.1.mlp.up_proj.weight");
    write_model(dir, &m);
    expect_open_error(dir, PAGODA_ENOENT, "tensor model.layers.1.mlp.up_proj.weight is missing");
    remove_dir(dir);

    /* Untied: lm_head.weight is required. */
    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    drop(&m, "lm_head.weight");
    write_model(dir, &m);
    expect_open_error(dir, PAGODA_ENOENT, "tensor lm_head.weight is missing");
    remove_dir(dir);

    /* Qwen2 without its q/k/v biases. */
    tiny_model(&m, MODEL_ARCH_QWEN2, true);
    drop(&m, "model.layers.0.self_attn.k_proj.bias");
    write_model(dir, &m);
    expect_open_error(dir, PAGODA_ENOENT, "tensor model.layers.0.self_attn.k_proj.bias is missing");
    remove_dir(dir);
}

static void test_refuses_wrong_shape(void **state)
{
    struct model m;
    char dir[32];
    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    struct tensor *t = find(&m, "model.layers.0.self_attn.o_proj.weight");
    t->shape[0] = 24; /* transposed */
    t->shape[1] = 16;
    write_model(dir, &m);
    expect_open_error(dir, PAGODA_EMISMATCH,
                      "tensor model.layers.0.self_attn.o_proj.weight has shape [24, 16], config "
                      "expects [16, 24]");
    remove_dir(dir);

    /* KV heads in the config that the checkpoint does not have. */
    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    m.cfg.num_kv_heads = 4;
    write_model(dir, &m);
    expect_open_error(dir, PAGODA_EMISMATCH,
                      "tensor model.layers.0.self_attn.k_proj.weight has shape [12, 16], config "
                      "expects [24, 16]");
    remove_dir(dir);

    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    t = find(&m, "model.norm.weight");
    t->ndim = 2;
    t->shape[1] = 1;
    write_model(dir, &m);
    expect_open_error(dir, PAGODA_EMISMATCH,
                      "tensor model.norm.weight has shape [16, 1], config expects [16]");
    remove_dir(dir);
}

static void test_refuses_unused_tensor(void **state)
{
    struct model m;
    char dir[32];
    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    add(&m, "BF16", 20, -1, "model.layers.0.mlp.gate_proj.bias");
    write_model(dir, &m);
    expect_open_error(dir, PAGODA_EMISMATCH,
                      "tensor model.layers.0.mlp.gate_proj.bias is not used");
    remove_dir(dir);

    /* A layer beyond num_hidden_layers. */
    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    add(&m, "F32", 16, -1, "model.layers.2.input_layernorm.weight");
    add(&m, "F32", 16, -1, "model.layers.2.post_attention_layernorm.weight");
    write_model(dir, &m);
    expect_open_error(dir, PAGODA_EMISMATCH, "2 unused tensors");
    remove_dir(dir);
}

static void test_refuses_missing_shard(void **state)
{
    struct model m;
    char dir[32], path[96];
    tiny_model(&m, MODEL_ARCH_QWEN2, true);
    write_sharded_model(dir, &m);
    snprintf(path, sizeof(path), "%s/model-00001-of-00002.safetensors", dir);
    unlink(path);
    expect_open_error(dir, PAGODA_ENOENT, path);
    remove_dir(dir);
}

static void test_refuses_missing_files(void **state)
{
    struct model m;
    char dir[32], path[96];
    tiny_model(&m, MODEL_ARCH_LLAMA, true);
    write_model(dir, &m);
    snprintf(path, sizeof(path), "%s/model.safetensors", dir);
    unlink(path);
    expect_open_error(dir, PAGODA_ENOENT, "model.safetensors");
    snprintf(path, sizeof(path), "%s/config.json", dir);
    unlink(path);
    expect_open_error(dir, PAGODA_ENOENT, "config.json");
    remove_dir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_loads),
        cmocka_unit_test(test_qwen2_biases_and_tied_head),
        cmocka_unit_test(test_llama_attention_bias),
        cmocka_unit_test(test_sharded_model_loads),
        cmocka_unit_test(test_refuses_missing_tensor),
        cmocka_unit_test(test_refuses_wrong_shape),
        cmocka_unit_test(test_refuses_unused_tensor),
        cmocka_unit_test(test_refuses_missing_shard),
        cmocka_unit_test(test_refuses_missing_files),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
