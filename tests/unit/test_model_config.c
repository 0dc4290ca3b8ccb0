/* Tests of model/model_config.c: config.json of the three supported architectures in both
 * RoPE spellings, every refusal naming its field, validation, and the writer's round trip. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "model/model_config.h"
#include "tests/unit/test_files.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Shaped like meta-llama/Llama-3.1-8B's config.json. */
static const char *const LLAMA31 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
    " \"vocab_size\": 128256, \"hidden_size\": 4096, \"intermediate_size\": 14336,"
    " \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
    " \"head_dim\": 128, \"rms_norm_eps\": 1e-05, \"max_position_embeddings\": 131072,"
    " \"tie_word_embeddings\": false, \"attention_bias\": false, \"mlp_bias\": false,"
    " \"bos_token_id\": 128000, \"eos_token_id\": [128001, 128008, 128009],"
    " \"rope_theta\": 500000.0, \"rope_scaling\": {\"factor\": 8.0, \"low_freq_factor\": 1.0,"
    " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192,"
    " \"rope_type\": \"llama3\"}, \"torch_dtype\": \"bfloat16\", \"hidden_act\": \"silu\","
    " \"pretraining_tp\": 1, \"use_cache\": true, \"transformers_version\": \"4.43.0\"}";

/* Shaped like mistralai/Mistral-7B-v0.3's config.json. */
static const char *const MISTRAL =
    "{\"architectures\": [\"MistralForCausalLM\"], \"model_type\": \"mistral\","
    " \"vocab_size\": 32768, \"hidden_size\": 4096, \"intermediate_size\": 14336,"
    " \"num_hidden_layers\": 32, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,"
    " \"rms_norm_eps\": 1e-05, \"max_position_embeddings\": 32768, \"rope_theta\": 1000000.0,"
    " \"sliding_window\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"float16\","
    " \"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\"}";

/* Shaped like Qwen/Qwen2.5-0.5B's config.json. */
static const char *const QWEN2 =
    "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\","
    " \"vocab_size\": 151936, \"hidden_size\": 896, \"intermediate_size\": 4864,"
    " \"num_hidden_layers\": 24, \"num_attention_heads\": 14, \"num_key_value_heads\": 2,"
    " \"rms_norm_eps\": 1e-06, \"max_position_embeddings\": 32768, \"max_window_layers\": 21,"
    " \"rope_theta\": 1000000.0, \"rope_scaling\": null, \"sliding_window\": 32768,"
    " \"use_sliding_window\": false, \"tie_word_embeddings\": true,"
    " \"torch_dtype\": \"bfloat16\", \"bos_token_id\": 151643, \"eos_token_id\": 151643,"
    " \"hidden_act\": \"silu\", \"attention_dropout\": 0.0}";

/* A transformers 5 file: `rope_parameters` and `dtype`. */
static const char *const LLAMA_V5 =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\","
    " \"vocab_size\": 32000, \"hidden_size\": 2048, \"intermediate_size\": 5632,"
    " \"num_hidden_layers\": 22, \"num_attention_heads\": 32, \"num_key_value_heads\": 4,"
    " \"rms_norm_eps\": 1e-05, \"max_position_embeddings\": 8192, \"attention_bias\": true,"
    " \"rope_parameters\": {\"rope_type\": \"linear\", \"rope_theta\": 10000.0,"
    " \"factor\": 4.0}, \"dtype\": \"float32\", \"bos_token_id\": 1, \"eos_token_id\": 2}";

/* Parses base with the keys of overrides (a JSON object) replacing its own and the key
 * remove (when not NULL) deleted. */
static int parse_with(const char *base, const char *overrides, const char *remove,
                      struct model_config *c)
{
    json_error_t jerr;
    json_t *root = json_loads(base, 0, &jerr);
    assert_non_null(root);
    if (overrides != NULL) {
        json_t *o = json_loads(overrides, 0, &jerr);
        assert_non_null(o);
        assert_int_equal(json_object_update(root, o), 0);
        json_decref(o);
    }
    if (remove != NULL)
        assert_int_equal(json_object_del(root, remove), 0);
    pagoda_error_clear();
    int rc = model_config_parse(root, c);
    json_decref(root);
    return rc;
}

/* Asserts that the change is refused with code and a detail containing each of the needles. */
static void expect_refusal(const char *base, const char *overrides, const char *remove, int code,
                           const char *needle1, const char *needle2)
{
    struct model_config c;
    int rc = parse_with(base, overrides, remove, &c);
    if (rc != code || strstr(pagoda_error_detail(), needle1) == NULL ||
        (needle2 != NULL && strstr(pagoda_error_detail(), needle2) == NULL))
        print_error("with %s: got %d \"%s\", want %d naming \"%s\"\n",
                    overrides ? overrides : remove, rc, pagoda_error_detail(), code, needle1);
    assert_int_equal(rc, code);
    assert_non_null(strstr(pagoda_error_detail(), needle1));
    if (needle2 != NULL)
        assert_non_null(strstr(pagoda_error_detail(), needle2));
    assert_non_null(strstr(pagoda_error_detail(), "config.json"));
}

static void assert_config_equal(const struct model_config *a, const struct model_config *b)
{
    assert_int_equal(a->arch, b->arch);
    assert_int_equal(a->vocab_size, b->vocab_size);
    assert_int_equal(a->hidden_size, b->hidden_size);
    assert_int_equal(a->intermediate_size, b->intermediate_size);
    assert_int_equal(a->num_layers, b->num_layers);
    assert_int_equal(a->num_heads, b->num_heads);
    assert_int_equal(a->num_kv_heads, b->num_kv_heads);
    assert_int_equal(a->head_dim, b->head_dim);
    assert_true(a->rms_norm_eps == b->rms_norm_eps);
    assert_int_equal(a->tie_word_embeddings, b->tie_word_embeddings);
    assert_int_equal(a->qkv_bias, b->qkv_bias);
    assert_int_equal(a->o_bias, b->o_bias);
    assert_int_equal(a->bos_token_id, b->bos_token_id);
    assert_int_equal(a->num_eos, b->num_eos);
    for (int i = 0; i < a->num_eos; i++)
        assert_int_equal(a->eos_token_ids[i], b->eos_token_ids[i]);
    assert_int_equal(a->max_position_embeddings, b->max_position_embeddings);
    assert_int_equal(a->rope.type, b->rope.type);
    assert_true(a->rope.theta == b->rope.theta);
    assert_true(a->rope.factor == b->rope.factor);
    assert_true(a->rope.low_freq_factor == b->rope.low_freq_factor);
    assert_true(a->rope.high_freq_factor == b->rope.high_freq_factor);
    assert_int_equal(a->rope.original_max_position_embeddings,
                     b->rope.original_max_position_embeddings);
    assert_int_equal(a->dtype, b->dtype);
}

static void test_llama_every_field(void **state)
{
    struct model_config c;
    assert_int_equal(parse_with(LLAMA31, NULL, NULL, &c), 0);
    assert_int_equal(c.arch, MODEL_ARCH_LLAMA);
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.hidden_size, 4096);
    assert_int_equal(c.intermediate_size, 14336);
    assert_int_equal(c.num_layers, 32);
    assert_int_equal(c.num_heads, 32);
    assert_int_equal(c.num_kv_heads, 8);
    assert_int_equal(c.head_dim, 128);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_false(c.tie_word_embeddings);
    assert_false(c.qkv_bias);
    assert_false(c.o_bias);
    assert_int_equal(c.bos_token_id, 128000);
    assert_int_equal(c.num_eos, 3);
    assert_int_equal(c.eos_token_ids[0], 128001);
    assert_int_equal(c.eos_token_ids[1], 128008);
    assert_int_equal(c.eos_token_ids[2], 128009);
    assert_int_equal(c.max_position_embeddings, 131072);
    assert_int_equal(c.rope.type, ROPE_LLAMA3);
    assert_true(c.rope.theta == 500000.0);
    assert_true(c.rope.factor == 8.0);
    assert_true(c.rope.low_freq_factor == 1.0);
    assert_true(c.rope.high_freq_factor == 4.0);
    assert_int_equal(c.rope.original_max_position_embeddings, 8192);
    assert_int_equal(c.dtype, DTYPE_BF16);

    /* Llama's attention_bias puts a bias on all four projections. */
    assert_int_equal(parse_with(LLAMA31, "{\"attention_bias\": true}", NULL, &c), 0);
    assert_true(c.qkv_bias);
    assert_true(c.o_bias);
}

static void test_mistral_fields(void **state)
{
    struct model_config c;
    assert_int_equal(parse_with(MISTRAL, NULL, NULL, &c), 0);
    assert_int_equal(c.arch, MODEL_ARCH_MISTRAL);
    assert_int_equal(c.vocab_size, 32768);
    assert_int_equal(c.num_kv_heads, 8);
    assert_int_equal(c.head_dim, 128); /* 4096 / 32 */
    assert_int_equal(c.max_position_embeddings, 32768);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_true(c.rope.theta == 1e6);
    assert_true(c.rope.factor == 1.0);
    assert_int_equal(c.dtype, DTYPE_F16);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.num_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_false(c.qkv_bias);
    assert_false(c.o_bias);
    assert_false(c.tie_word_embeddings);

    /* A window as long as the context never slides. */
    assert_int_equal(parse_with(MISTRAL, "{\"sliding_window\": 32768}", NULL, &c), 0);
}

static void test_qwen2_fields(void **state)
{
    struct model_config c;
    assert_int_equal(parse_with(QWEN2, NULL, NULL, &c), 0);
    assert_int_equal(c.arch, MODEL_ARCH_QWEN2);
    assert_int_equal(c.vocab_size, 151936);
    assert_int_equal(c.hidden_size, 896);
    assert_int_equal(c.intermediate_size, 4864);
    assert_int_equal(c.num_layers, 24);
    assert_int_equal(c.num_heads, 14);
    assert_int_equal(c.num_kv_heads, 2);
    assert_int_equal(c.head_dim, 64);
    assert_true(c.rms_norm_eps == 1e-6);
    assert_true(c.tie_word_embeddings);
    /* Qwen2 always has q/k/v biases and never an o_proj bias. */
    assert_true(c.qkv_bias);
    assert_false(c.o_bias);
    assert_int_equal(c.bos_token_id, 151643);
    assert_int_equal(c.num_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 151643);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_true(c.rope.theta == 1e6);
}

static void test_defaults_when_absent(void **state)
{
    static const char *const minimal =
        "{\"architectures\": [\"LlamaForCausalLM\"], \"vocab_size\": 1000,"
        " \"hidden_size\": 64, \"intermediate_size\": 128, \"num_hidden_layers\": 2,"
        " \"num_attention_heads\": 8, \"head_dim\": null, \"rms_norm_eps\": 1e-6,"
        " \"max_position_embeddings\": 512, \"bos_token_id\": null}";
    struct model_config c;
    assert_int_equal(parse_with(minimal, NULL, NULL, &c), 0);
    assert_int_equal(c.num_kv_heads, 8);
    assert_int_equal(c.head_dim, 8);
    assert_true(c.rope.theta == 10000.0);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.dtype, DTYPE_BF16);
    assert_int_equal(c.bos_token_id, -1);
    assert_int_equal(c.num_eos, 0);
    assert_false(c.qkv_bias);

    /* Without `architectures`, model_type decides. */
    assert_int_equal(parse_with(minimal, "{\"model_type\": \"qwen2\"}", "architectures", &c), 0);
    assert_int_equal(c.arch, MODEL_ARCH_QWEN2);
}

static void test_rope_parameters_spelling(void **state)
{
    struct model_config c;
    assert_int_equal(parse_with(LLAMA_V5, NULL, NULL, &c), 0);
    assert_int_equal(c.rope.type, ROPE_LINEAR);
    assert_true(c.rope.theta == 10000.0);
    assert_true(c.rope.factor == 4.0);
    assert_int_equal(c.dtype, DTYPE_F32);
    assert_true(c.qkv_bias);
    assert_true(c.o_bias);

    assert_int_equal(parse_with(LLAMA_V5,
                                "{\"rope_parameters\": {\"rope_type\": \"llama3\","
                                " \"rope_theta\": 500000.0, \"factor\": 32.0,"
                                " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                                " \"original_max_position_embeddings\": 8192}}",
                                NULL, &c),
                     0);
    assert_int_equal(c.rope.type, ROPE_LLAMA3);
    assert_true(c.rope.theta == 500000.0);
    assert_true(c.rope.factor == 32.0);
    assert_true(c.rope.low_freq_factor == 1.0);
    assert_true(c.rope.high_freq_factor == 4.0);
    assert_int_equal(c.rope.original_max_position_embeddings, 8192);

    assert_int_equal(parse_with(LLAMA_V5,
                                "{\"rope_parameters\": {\"rope_type\": \"default\","
                                " \"rope_theta\": 250000.0}}",
                                NULL, &c),
                     0);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_true(c.rope.theta == 250000.0);
    assert_true(c.rope.factor == 1.0);

    /* Both spellings in one file must agree. */
    assert_int_equal(parse_with(LLAMA_V5, "{\"rope_theta\": 10000.0}", NULL, &c), 0);
    expect_refusal(LLAMA_V5, "{\"rope_theta\": 500000.0}", NULL, PAGODA_EMISMATCH, "rope_theta",
                   NULL);
    expect_refusal(LLAMA_V5, "{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 2.0}}",
                   NULL, PAGODA_EMISMATCH, "rope_scaling", NULL);
    /* Keyed by layer type (other architectures do this): not plain RoPE with theta 10000. */
    expect_refusal(LLAMA_V5,
                   "{\"rope_parameters\": {\"full_attention\": {\"rope_type\": \"default\","
                   " \"rope_theta\": 1000000.0}}}",
                   NULL, PAGODA_EFORMAT, "rope_parameters", "rope_type");
}

static void test_rope_scaling_type_or_rope_type(void **state)
{
    struct model_config c;
    assert_int_equal(parse_with(MISTRAL,
                                "{\"rope_scaling\": {\"type\": \"linear\","
                                " \"factor\": 2.0}}",
                                NULL, &c),
                     0);
    assert_int_equal(c.rope.type, ROPE_LINEAR);
    assert_true(c.rope.factor == 2.0);
    assert_true(c.rope.theta == 1e6);
    assert_int_equal(parse_with(MISTRAL,
                                "{\"rope_scaling\": {\"rope_type\": \"linear\","
                                " \"factor\": 3.0}}",
                                NULL, &c),
                     0);
    assert_int_equal(c.rope.type, ROPE_LINEAR);
    assert_true(c.rope.factor == 3.0);
    assert_int_equal(parse_with(MISTRAL,
                                "{\"rope_scaling\": {\"rope_type\": \"llama3\","
                                " \"type\": \"llama3\", \"factor\": 8.0,"
                                " \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
                                " \"original_max_position_embeddings\": 8192}}",
                                NULL, &c),
                     0);
    assert_int_equal(c.rope.type, ROPE_LLAMA3);
    expect_refusal(MISTRAL,
                   "{\"rope_scaling\": {\"rope_type\": \"linear\", \"type\": \"llama3\","
                   " \"factor\": 2.0}}",
                   NULL, PAGODA_EMISMATCH, "rope_scaling", NULL);
    expect_refusal(MISTRAL, "{\"rope_scaling\": {\"factor\": 2.0}}", NULL, PAGODA_EFORMAT,
                   "rope_scaling", "rope_type");
    expect_refusal(MISTRAL, "{\"rope_scaling\": {\"rope_type\": \"linear\"}}", NULL, PAGODA_EFORMAT,
                   "\"factor\" is missing", NULL);
    expect_refusal(MISTRAL, "{\"rope_scaling\": {\"rope_type\": \"linear\", \"factor\": 0}}", NULL,
                   PAGODA_ERANGE, "factor", NULL);
}

static void test_eos_number_list_null(void **state)
{
    struct model_config c;
    assert_int_equal(parse_with(MISTRAL, "{\"eos_token_id\": 7}", NULL, &c), 0);
    assert_int_equal(c.num_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 7);
    assert_int_equal(parse_with(MISTRAL, "{\"eos_token_id\": [2, 5]}", NULL, &c), 0);
    assert_int_equal(c.num_eos, 2);
    assert_int_equal(c.eos_token_ids[0], 2);
    assert_int_equal(c.eos_token_ids[1], 5);
    assert_int_equal(parse_with(MISTRAL, "{\"eos_token_id\": null}", NULL, &c), 0);
    assert_int_equal(c.num_eos, 0);
    assert_int_equal(parse_with(MISTRAL, NULL, "eos_token_id", &c), 0);
    assert_int_equal(c.num_eos, 0);
    assert_int_equal(parse_with(MISTRAL, "{\"bos_token_id\": [3]}", NULL, &c), 0);
    assert_int_equal(c.bos_token_id, 3);
    expect_refusal(
        MISTRAL, "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]}",
        NULL, PAGODA_ERANGE, "eos_token_id", NULL);
    expect_refusal(MISTRAL, "{\"eos_token_id\": \"2\"}", NULL, PAGODA_EFORMAT, "eos_token_id",
                   NULL);
    expect_refusal(MISTRAL, "{\"eos_token_id\": [2, -1]}", NULL, PAGODA_ERANGE, "eos_token_id",
                   NULL);
    expect_refusal(MISTRAL, "{\"eos_token_id\": 40000}", NULL, PAGODA_ERANGE, "eos_token_id", NULL);
}

static void test_head_dim_given_or_derived(void **state)
{
    struct model_config c;
    /* Given: need not be hidden / heads (Mistral Nemo: 5120 / 32 heads, head_dim 128). */
    assert_int_equal(parse_with(MISTRAL, "{\"hidden_size\": 5120, \"head_dim\": 128}", NULL, &c),
                     0);
    assert_int_equal(c.head_dim, 128);
    assert_int_equal(parse_with(MISTRAL, "{\"hidden_size\": 5120, \"head_dim\": null}", NULL, &c),
                     0);
    assert_int_equal(c.head_dim, 160);
    expect_refusal(MISTRAL, "{\"hidden_size\": 5000}", NULL, PAGODA_ERANGE, "hidden_size",
                   "num_attention_heads");
    expect_refusal(MISTRAL, "{\"head_dim\": 127}", NULL, PAGODA_ERANGE, "head_dim", NULL);
}

static void test_refuses_active_sliding_window(void **state)
{
    expect_refusal(MISTRAL, "{\"sliding_window\": 4096}", NULL, PAGODA_EUNSUPPORTED,
                   "active sliding_window 4096", NULL);
    expect_refusal(QWEN2, "{\"use_sliding_window\": true}", NULL, PAGODA_EUNSUPPORTED,
                   "sliding_window", "use_sliding_window");
    expect_refusal(LLAMA31, "{\"sliding_window\": 4096}", NULL, PAGODA_EUNSUPPORTED,
                   "sliding_window 4096", NULL);
    expect_refusal(QWEN2, "{\"layer_types\": [\"full_attention\", \"sliding_attention\"]}", NULL,
                   PAGODA_EUNSUPPORTED, "sliding_attention", NULL);
}

static void test_refuses_unsupported_rope(void **state)
{
    expect_refusal(LLAMA31, "{\"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 4.0}}", NULL,
                   PAGODA_EUNSUPPORTED, "rope type \"yarn\" is not supported", NULL);
    expect_refusal(LLAMA31, "{\"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}", NULL,
                   PAGODA_EUNSUPPORTED, "\"dynamic\"", NULL);
    expect_refusal(LLAMA_V5, "{\"rope_parameters\": {\"rope_type\": \"longrope\"}}", NULL,
                   PAGODA_EUNSUPPORTED, "\"longrope\"", "rope_parameters");
    expect_refusal(LLAMA31, "{\"partial_rotary_factor\": 0.5}", NULL, PAGODA_EUNSUPPORTED,
                   "partial_rotary_factor", NULL);
    /* llama3's ramp divides by high - low. */
    expect_refusal(LLAMA31,
                   "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
                   " \"low_freq_factor\": 4.0, \"high_freq_factor\": 4.0,"
                   " \"original_max_position_embeddings\": 8192}}",
                   NULL, PAGODA_ERANGE, "high_freq_factor", NULL);
    expect_refusal(LLAMA31,
                   "{\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0,"
                   " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}}",
                   NULL, PAGODA_EFORMAT, "\"low_freq_factor\" is missing", NULL);
}

static void test_refuses_architecture(void **state)
{
    expect_refusal(LLAMA31, "{\"architectures\": [\"GPT2LMHeadModel\"], \"model_type\": null}",
                   NULL, PAGODA_EUNSUPPORTED, "\"GPT2LMHeadModel\" is not supported", NULL);
    expect_refusal(LLAMA31, "{\"architectures\": [\"LlamaForCausalLM\", \"MistralForCausalLM\"]}",
                   NULL, PAGODA_EUNSUPPORTED, "architectures", "2 classes");
    expect_refusal(LLAMA31, "{\"model_type\": \"qwen2\"}", NULL, PAGODA_EMISMATCH,
                   "model_type \"qwen2\"", "LlamaForCausalLM");
    expect_refusal(LLAMA31, "{\"architectures\": []}", NULL, PAGODA_EFORMAT, "architectures", NULL);
    expect_refusal(LLAMA31, "{\"model_type\": \"gemma\"}", "architectures", PAGODA_EUNSUPPORTED,
                   "\"gemma\"", NULL);
}

static void test_refuses_dtype(void **state)
{
    expect_refusal(LLAMA31, "{\"torch_dtype\": \"float8_e4m3fn\"}", NULL, PAGODA_EUNSUPPORTED,
                   "torch_dtype", "\"float8_e4m3fn\" is not supported");
    expect_refusal(LLAMA31, "{\"dtype\": \"int8\"}", "torch_dtype", PAGODA_EUNSUPPORTED,
                   "\"dtype\" \"int8\"", NULL);
    expect_refusal(LLAMA31, "{\"dtype\": \"float16\"}", NULL, PAGODA_EMISMATCH, "float16",
                   "bfloat16");
}

static void test_refuses_other_math(void **state)
{
    expect_refusal(LLAMA31, "{\"mlp_bias\": true}", NULL, PAGODA_EUNSUPPORTED, "mlp_bias", NULL);
    expect_refusal(LLAMA31, "{\"hidden_act\": \"gelu\"}", NULL, PAGODA_EUNSUPPORTED, "\"gelu\"",
                   NULL);
    expect_refusal(LLAMA31, "{\"quantization_config\": {\"quant_method\": \"fp8\"}}", NULL,
                   PAGODA_EUNSUPPORTED, "quantization_config", NULL);
}

static void test_missing_or_mistyped_fields(void **state)
{
    expect_refusal(LLAMA31, NULL, "hidden_size", PAGODA_EFORMAT, "\"hidden_size\" is missing",
                   NULL);
    expect_refusal(QWEN2, NULL, "rms_norm_eps", PAGODA_EFORMAT, "\"rms_norm_eps\"", NULL);
    expect_refusal(LLAMA31, "{\"num_hidden_layers\": \"32\"}", NULL, PAGODA_EFORMAT,
                   "\"num_hidden_layers\" must be an integer", NULL);
    expect_refusal(LLAMA31, "{\"tie_word_embeddings\": 1}", NULL, PAGODA_EFORMAT,
                   "tie_word_embeddings", NULL);
    expect_refusal(LLAMA31, "{\"num_key_value_heads\": 5}", NULL, PAGODA_ERANGE,
                   "num_key_value_heads 5", NULL);
    expect_refusal(LLAMA31, "{\"rms_norm_eps\": 0}", NULL, PAGODA_ERANGE, "rms_norm_eps", NULL);
    expect_refusal(LLAMA31, "{\"vocab_size\": 2147483649}", NULL, PAGODA_ERANGE, "vocab_size",
                   NULL);
    expect_refusal(LLAMA31, "{\"num_attention_heads\": 0}", NULL, PAGODA_ERANGE,
                   "num_attention_heads", NULL);
    /* past what the scheduler takes from a worker (2^24): refused here, by name */
    expect_refusal(LLAMA31, "{\"vocab_size\": 16777217}", NULL, PAGODA_ERANGE, "vocab_size", NULL);
    expect_refusal(LLAMA31, "{\"max_position_embeddings\": 16777217}", NULL, PAGODA_ERANGE,
                   "max_position_embeddings", NULL);
    expect_refusal(LLAMA31, "{\"max_position_embeddings\": 1}", NULL, PAGODA_ERANGE,
                   "max_position_embeddings", NULL);

    struct model_config c;
    json_t *not_object = json_array();
    assert_int_equal(model_config_parse(not_object, &c), PAGODA_EFORMAT);
    json_decref(not_object);
}

static void test_validate(void **state)
{
    struct model_config c;
    model_config_tiny(&c);
    assert_int_equal(model_config_validate(&c), 0);

    struct model_config bad = c;
    bad.num_kv_heads = 3;
    assert_int_equal(model_config_validate(&bad), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "num_key_value_heads"));
    bad = c;
    bad.head_dim = 63;
    assert_int_equal(model_config_validate(&bad), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "head_dim 63"));
    bad = c;
    bad.rms_norm_eps = 0.0;
    assert_int_equal(model_config_validate(&bad), PAGODA_ERANGE);
    bad = c;
    bad.vocab_size = (INT64_C(1) << 24) + 1;
    assert_int_equal(model_config_validate(&bad), PAGODA_ERANGE);
    bad.vocab_size = INT64_C(1) << 24;
    assert_int_equal(model_config_validate(&bad), 0);
    bad = c;
    bad.rope.type = ROPE_LINEAR;
    bad.rope.factor = -2.0;
    assert_int_equal(model_config_validate(&bad), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "factor"));
    bad = c;
    bad.rope.type = ROPE_LLAMA3;
    bad.rope.factor = 8.0;
    bad.rope.low_freq_factor = 1.0;
    bad.rope.high_freq_factor = 4.0;
    bad.rope.original_max_position_embeddings = 0;
    assert_int_equal(model_config_validate(&bad), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "original_max_position_embeddings"));
    bad = c;
    bad.hidden_size = 0;
    assert_int_equal(model_config_validate(&bad), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "hidden_size"));
    /* A Qwen2 config without q/k/v biases is not one config.json can express. */
    bad = c;
    bad.arch = MODEL_ARCH_QWEN2;
    assert_int_equal(model_config_validate(&bad), PAGODA_ERANGE);
    bad.qkv_bias = true;
    assert_int_equal(model_config_validate(&bad), 0);
}

static void test_tiny_preset(void **state)
{
    struct model_config c;
    model_config_tiny(&c);
    assert_int_equal(c.arch, MODEL_ARCH_LLAMA);
    assert_int_equal(c.vocab_size, 512);
    assert_int_equal(c.hidden_size, 256);
    assert_int_equal(c.num_layers, 4);
    assert_int_equal(c.num_heads, 4);
    assert_int_equal(c.num_kv_heads, 2);
    assert_int_equal(c.head_dim, 64);
    assert_int_equal(c.intermediate_size, 688);
    assert_true(c.rope.theta == 10000.0);
    assert_int_equal(c.rope.type, ROPE_DEFAULT);
    assert_true(c.rms_norm_eps == 1e-5);
    assert_false(c.tie_word_embeddings);
    assert_int_equal(c.dtype, DTYPE_BF16);
    assert_int_equal(c.max_position_embeddings, 2048);
    assert_int_equal(c.bos_token_id, 1);
    assert_int_equal(c.num_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 2);
}

/* Writes cfg in one spelling, checks the keys transformers reads are there, parses it back
 * and compares. */
static void round_trip(const struct model_config *cfg, bool legacy)
{
    json_t *root;
    assert_int_equal(model_config_to_json(cfg, legacy, &root), 0);
    assert_string_equal(
        json_string_value(json_array_get(json_object_get(root, "architectures"), 0)),
        model_arch_class(cfg->arch));
    assert_string_equal(json_string_value(json_object_get(root, "model_type")),
                        model_arch_type(cfg->arch));
    assert_string_equal(json_string_value(json_object_get(root, "torch_dtype")),
                        dtype_torch_name(cfg->dtype));
    assert_string_equal(json_string_value(json_object_get(root, "dtype")),
                        dtype_torch_name(cfg->dtype));
    assert_string_equal(json_string_value(json_object_get(root, "hidden_act")), "silu");
    assert_true(json_is_boolean(json_object_get(root, "tie_word_embeddings")));
    if (legacy) {
        assert_null(json_object_get(root, "rope_parameters"));
        assert_true(json_is_number(json_object_get(root, "rope_theta")));
        assert_non_null(json_object_get(root, "rope_scaling"));
    } else {
        assert_null(json_object_get(root, "rope_theta"));
        assert_null(json_object_get(root, "rope_scaling"));
        assert_true(json_is_object(json_object_get(root, "rope_parameters")));
    }
    if (cfg->arch == MODEL_ARCH_QWEN2) {
        assert_true(json_is_false(json_object_get(root, "use_sliding_window")));
        assert_true(json_is_null(json_object_get(root, "sliding_window")));
    }
    if (cfg->arch == MODEL_ARCH_MISTRAL)
        assert_true(json_is_null(json_object_get(root, "sliding_window")));
    if (cfg->arch == MODEL_ARCH_LLAMA)
        assert_int_equal(json_is_true(json_object_get(root, "attention_bias")), cfg->o_bias);

    /* Through text, as a file would go. */
    char *text = json_dumps(root, JSON_INDENT(2));
    assert_non_null(text);
    json_decref(root);
    json_error_t jerr;
    root = json_loads(text, 0, &jerr);
    free(text);
    assert_non_null(root);
    struct model_config back;
    int rc = model_config_parse(root, &back);
    if (rc != 0)
        print_error("%s\n", pagoda_error_detail());
    assert_int_equal(rc, 0);
    json_decref(root);
    assert_config_equal(&back, cfg);
}

static void test_to_json_round_trip(void **state)
{
    const char *const sources[] = {LLAMA31, MISTRAL, QWEN2, LLAMA_V5};
    for (size_t i = 0; i < sizeof(sources) / sizeof(sources[0]); i++) {
        struct model_config c;
        assert_int_equal(parse_with(sources[i], NULL, NULL, &c), 0);
        round_trip(&c, false);
        round_trip(&c, true);
    }
    struct model_config c;
    model_config_tiny(&c);
    round_trip(&c, false);
    round_trip(&c, true);
    /* No BOS, no EOS, F16, an odd epsilon, Qwen2 with llama3 RoPE and many EOS ids. */
    c.bos_token_id = -1;
    c.num_eos = 0;
    c.dtype = DTYPE_F16;
    c.rms_norm_eps = 1e-5 / 3.0;
    round_trip(&c, false);
    round_trip(&c, true);
    c.arch = MODEL_ARCH_QWEN2;
    c.qkv_bias = true;
    c.tie_word_embeddings = true;
    c.rope = (struct rope_config){.type = ROPE_LLAMA3,
                                  .theta = 123456.5,
                                  .factor = 16.0,
                                  .low_freq_factor = 0.5,
                                  .high_freq_factor = 2.5,
                                  .original_max_position_embeddings = 1024};
    c.num_eos = MODEL_MAX_EOS;
    for (int i = 0; i < MODEL_MAX_EOS; i++)
        c.eos_token_ids[i] = 500 - i;
    round_trip(&c, false);
    round_trip(&c, true);
}

static void test_load_from_directory(void **state)
{
    char dir[] = "/tmp/pagoda_config_XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[256];
    snprintf(path, sizeof(path), "%s/config.json", dir);
    struct model_config c;
    assert_int_equal(model_config_load(dir, &c), PAGODA_ENOENT);

    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(QWEN2, f);
    fclose(f);
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(c.arch, MODEL_ARCH_QWEN2);

    /* A refusal names the file it came from. */
    f = fopen(path, "w");
    assert_non_null(f);
    fputs("{\"architectures\": [\"GPT2LMHeadModel\"]}", f);
    fclose(f);
    assert_int_equal(model_config_load(dir, &c), PAGODA_EUNSUPPORTED);
    assert_non_null(strstr(pagoda_error_detail(), path));
    assert_non_null(strstr(pagoda_error_detail(), "GPT2LMHeadModel"));
    unlink(path);
    rmdir(dir);
}

/* generation_config.json's eos_token_id joins config.json's (Llama 3 Instruct's <|eot_id|> is
 * only there); an absent file changes nothing, a broken one is refused by name. */
static void test_generation_config_eos(void **state)
{
    (void)state;
    char dir[] = "/tmp/pagoda_genconf_XXXXXX";
    assert_non_null(mkdtemp(dir));
    test_write_text(dir, "config.json", QWEN2); /* eos_token_id 151643 */
    struct model_config c;
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(c.num_eos, 1);
    assert_int_equal(c.eos_token_ids[0], 151643);

    test_write_text(
        dir, "generation_config.json",
        "{\"bos_token_id\": 151643, \"eos_token_id\": [151645, 151643], \"top_p\": 0.8}");
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(c.num_eos, 2);
    assert_int_equal(c.eos_token_ids[0], 151643);
    assert_int_equal(c.eos_token_ids[1], 151645);

    test_write_text(dir, "generation_config.json", "{\"eos_token_id\": 151645}");
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(c.num_eos, 2);
    test_write_text(dir, "generation_config.json", "{\"do_sample\": true}");
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(c.num_eos, 1);

    test_write_text(dir, "generation_config.json", "{\"eos_token_id\": \"</s>\"}");
    assert_int_equal(model_config_load(dir, &c), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "generation_config.json: \"eos_token_id\""));
    test_write_text(dir, "generation_config.json", "{\"eos_token_id\": [999999999]}");
    assert_int_equal(model_config_load(dir, &c), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "generation_config.json"));
    assert_non_null(strstr(pagoda_error_detail(), "outside the vocabulary"));
    /* past 16 in all is refused; repeats do not count */
    test_write_text(dir, "generation_config.json",
                    "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]}");
    assert_int_equal(model_config_load(dir, &c), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "more than 16 eos_token_id values"));
    test_write_text(dir, "generation_config.json",
                    "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 1, 2, "
                    "3, 4, 151643, 5, 6, 7, 8, 9, 10]}");
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(c.num_eos, 16);
    test_write_text(dir, "generation_config.json", "{\"eos_token_id\": [1,");
    assert_int_equal(model_config_load(dir, &c), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "generation_config.json"));

    char path[256];
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    unlink(path);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

/* model_config_load's EOS ids, then with the tokenizer's: n of them, the last `last`; the note
 * says why nothing was added (note: a part of it), or nothing (NULL). */
static void expect_eos_note(const char *dir, int n, int32_t last, const char *note)
{
    struct model_config c;
    char said[640];
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(model_config_add_tokenizer_eos(dir, &c, said, sizeof(said)), 0);
    assert_int_equal(c.num_eos, n);
    assert_int_equal(c.eos_token_ids[0], 151643);
    assert_int_equal(c.eos_token_ids[n - 1], last);
    if (note == NULL && said[0] != '\0')
        fail_msg("a note where none was due: %s", said);
    if (note != NULL && strstr(said, note) == NULL)
        fail_msg("note [%s] does not say [%s]", said, note);
}

static void expect_eos(const char *dir, int n, int32_t last)
{
    expect_eos_note(dir, n, last, NULL);
}

/* tokenizer_config.json's eos_token joins the EOS ids (vLLM stops at the tokenizer's
 * eos_token_id): its id from added_tokens_decoder, else tokenizer.json's vocabulary or
 * added_tokens; special_tokens_map.json's wins over a file without added_tokens_decoder (legacy);
 * a text no token has, an id past the vocabulary, no room or a file that cannot be read adds
 * nothing; an eos_token of another type is refused by name. */
static void test_tokenizer_eos(void **state)
{
    (void)state;
    char dir[] = "/tmp/pagoda_tokeos_XXXXXX";
    assert_non_null(mkdtemp(dir));
    test_write_text(dir, "config.json", QWEN2); /* eos_token_id 151643, vocabulary 151936 */
    test_write_text(dir, "tokenizer_config.json",
                    "{\"eos_token\": \"<|im_end|>\", \"added_tokens_decoder\": {\"151643\": "
                    "{\"content\": \"<|endoftext|>\"}, \"151645\": {\"content\": \"<|im_end|>\"}}, "
                    "\"model_max_length\": 1000000000000000019884624838656}");
    expect_eos(dir, 2, 151645);
    struct model_config c;
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(c.num_eos, 1); /* config.json's alone: no tokenizer file read */
    /* an AddedToken object; with generation_config.json's ids, no repeat; special_tokens_map.json
     * does not override a file with added_tokens_decoder */
    test_write_text(dir, "tokenizer_config.json",
                    "{\"eos_token\": {\"__type\": \"AddedToken\", \"content\": \"<|im_end|>\"}, "
                    "\"added_tokens_decoder\": {\"151645\": {\"content\": \"<|im_end|>\"}, "
                    "\"7\": {\"content\": \"</s>\"}}}");
    test_write_text(dir, "special_tokens_map.json", "{\"eos_token\": \"</s>\"}");
    test_write_text(dir, "generation_config.json", "{\"eos_token_id\": [151645, 151643]}");
    expect_eos(dir, 2, 151645);
    test_write_text(dir, "generation_config.json", "{\"eos_token_id\": [151644]}");
    expect_eos(dir, 3, 151645);
    /* no room among the 16: nothing added, nothing refused */
    test_write_text(dir, "generation_config.json",
                    "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]}");
    expect_eos_note(dir, 16, 15, "(151645): no room past 16 EOS ids");
    test_write_text(dir, "generation_config.json", /* there already: a stop id, no note */
                    "{\"eos_token_id\": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 151645]}");
    expect_eos(dir, 16, 151645);
    char path[256];
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    unlink(path);

    /* no added_tokens_decoder (transformers before 4.34): special_tokens_map.json's eos_token
     * wins; tokenizer.json's vocabulary (BPE's object; Unigram's list, the id its index), then
     * its added_tokens */
    test_write_text(dir, "tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
    /* the map's </s> (legacy), and no tokenizer.json */
    expect_eos_note(dir, 1, 151643, "\"</s>\" is no token");
    test_write_text(dir, "tokenizer.json",
                    "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\"}, {\"id\": 2, "
                    "\"content\": \"</s>\"}, {\"id\": 32000, \"content\": \"<|im_end|>\"}], "
                    "\"model\": {\"vocab\": {\"</s>\": 9}}}");
    expect_eos(dir, 2, 9);
    snprintf(path, sizeof(path), "%s/special_tokens_map.json", dir);
    unlink(path);
    /* numbered as HF's AddedVocabulary (and the router's tokenizer) numbers it, not by the file's
     * 32000: <unk> takes the vocabulary's size (1), </s> keeps 9, <|im_end|> the next past 9 */
    expect_eos(dir, 2, 10);
    test_write_text(dir, "special_tokens_map.json",
                    "{\"eos_token\": {\"content\": \"</s>\", \"lstrip\": false}}");
    unlink(strcat(strcpy(path, dir), "/tokenizer_config.json"));
    expect_eos(dir, 2, 9); /* no tokenizer_config.json: the map's */
    unlink(strcat(strcpy(path, dir), "/special_tokens_map.json"));
    test_write_text(dir, "tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    test_write_text(
        dir, "tokenizer.json",
        "{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"<pad>\", 0], [\"a\", -1.5], "
        "[\"</s>\\u0000x\", 0], [\"</s>\", 0]]}}");
    expect_eos(dir, 2, 3); /* not the text with a NUL inside */
    test_write_text(dir, "tokenizer.json",
                    "{\"added_tokens\": [{\"id\": 5, \"content\": \"</s>\\u0000x\"}, {\"id\": 6, "
                    "\"content\": \"</s>\"}], \"model\": {\"vocab\": {}}}");
    expect_eos(dir, 2, 1); /* an empty vocabulary: 0, then 1 */
    /* a repeat keeps its first id and takes none; tokenizer.json's id wins over an
     * added_tokens_decoder key that disagrees (transformers' fast tokenizer asks tokenizer.json) */
    test_write_text(dir, "tokenizer.json",
                    "{\"added_tokens\": [{\"id\": 3, \"content\": \"<a>\"}, {\"id\": 9, "
                    "\"content\": \"<a>\"}, {\"id\": 4, \"content\": \"</s>\"}], \"model\": "
                    "{\"vocab\": {\"x\": 0, \"y\": 1}}}");
    test_write_text(dir, "tokenizer_config.json",
                    "{\"eos_token\": \"</s>\", \"added_tokens_decoder\": {\"77\": {\"content\": "
                    "\"</s>\"}}}");
    expect_eos(dir, 2, 3);
    /* a token tokenizer.json lacks: transformers' fast tokenizer adds added_tokens_decoder's
     * tokens tokenizer.json lacks at its start, in the order of their ids, each numbered next
     * (past <a> 2 and </s> 3: <b> 4, <|im_end|> 5; the decoder's own keys are not the ids); with
     * tokenizer.json broken, the decoder's key, and then no note (a stop id all the same) */
    test_write_text(dir, "tokenizer_config.json",
                    "{\"eos_token\": \"<|im_end|>\", \"added_tokens_decoder\": {\"9\": "
                    "{\"content\": \"<|im_end|>\"}, \"1\": {\"content\": \"<b>\"}, \"3\": "
                    "{\"content\": \"</s>\"}}}");
    expect_eos(dir, 2, 5);
    test_write_text(dir, "tokenizer.json", "{");
    expect_eos(dir, 2, 9);
    test_write_text(dir, "tokenizer.json",
                    "{\"added_tokens\": [{\"id\": 3, \"content\": \"<a>\"}, {\"id\": 9, "
                    "\"content\": \"<a>\"}, {\"id\": 4, \"content\": \"</s>\"}], \"model\": "
                    "{\"vocab\": {\"x\": 0, \"y\": 1}}}");
    test_write_text(dir, "tokenizer_config.json", "{\"eos_token\": \"</s>\"}");

    /* what adds nothing */
    test_write_text(dir, "tokenizer.json", "{\"model\": {\"vocab\": {\"</s>\": 200000}}}");
    expect_eos_note(dir, 1, 151643, "is token 200000, past the model's vocabulary (151936)");
    test_write_text(dir, "tokenizer.json", "{\"added_tokens\": [");
    expect_eos_note(dir, 1, 151643, "/tokenizer.json"); /* not JSON */
    test_write_text(dir, "tokenizer.json", "{\"model\": {\"vocab\": {\"</s>\": 200}}}");
    test_write_text(dir, "tokenizer_config.json", "{\"eos_token\": \"<eos>\"}");
    expect_eos_note(dir, 1, 151643, "\"<eos>\" is no token of the model");
    test_write_text(dir, "tokenizer_config.json", "{\"eos_token\": null}");
    expect_eos(dir, 1, 151643);
    test_write_text(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    expect_eos(dir, 1, 151643);
    test_write_text(dir, "tokenizer_config.json", "[\"</s>\"]");
    expect_eos_note(dir, 1, 151643, "tokenizer_config.json: not a JSON object");
    test_write_text(dir, "tokenizer_config.json", "{\"eos_token\": \"</s>\", \"x\": NaN}");
    expect_eos_note(dir, 1, 151643, "/tokenizer_config.json");

    /* an eos_token of another type is refused by name, by what reads the tokenizer's EOS only:
     * model_config_load (kvpool, every rank, the weights) reads no tokenizer file */
    test_write_text(dir, "tokenizer_config.json", "{\"eos_token\": 2}");
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(model_config_add_tokenizer_eos(dir, &c, NULL, 0), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "tokenizer_config.json: \"eos_token\""));
    /* not where the map's replaces it (legacy), as transformers replaces it unread */
    test_write_text(dir, "special_tokens_map.json", "{\"eos_token\": \"</s>\"}");
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(model_config_add_tokenizer_eos(dir, &c, NULL, 0), 0);
    test_write_text(dir, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    test_write_text(dir, "special_tokens_map.json", "{\"eos_token\": {\"content\": 5}}");
    assert_int_equal(model_config_load(dir, &c), 0);
    assert_int_equal(model_config_add_tokenizer_eos(dir, &c, NULL, 0), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "special_tokens_map.json: \"eos_token\""));

    const char *names[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                           "config.json"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
}

/* generation_config.json's sampling defaults, as vLLM's --generation-config auto reads them:
 * transformers' own defaults (temperature 1, top_p 1, top_k 50, repetition_penalty 1) are not the
 * model's; an absent file or field gives none; a field of the wrong type is refused by name. */
static void test_generation_sampling_defaults(void **state)
{
    (void)state;
    char dir[] = "/tmp/pagoda_gendef_XXXXXX";
    assert_non_null(mkdtemp(dir));
    struct model_generation_defaults g;
    g.set = 99;
    assert_int_equal(model_generation_defaults_load(dir, &g), 0); /* no file */
    assert_int_equal(g.set, 0);

    /* Llama 3.1 8B Instruct's */
    test_write_text(dir, "generation_config.json",
                    "{\"bos_token_id\": 128000, \"do_sample\": true, \"eos_token_id\": [128001, "
                    "128008, 128009], \"temperature\": 0.6, \"top_p\": 0.9}");
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, MODEL_GEN_TEMPERATURE | MODEL_GEN_TOP_P);
    assert_true(g.temperature == 0.6 && g.top_p == 0.9);

    /* Qwen3's: top_k 20 is the model's; transformers' defaults and nulls are not */
    test_write_text(dir, "generation_config.json",
                    "{\"temperature\": 1.0, \"top_p\": 1, \"top_k\": 20, \"min_p\": 0, "
                    "\"repetition_penalty\": 1.05}");
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, MODEL_GEN_TOP_K | MODEL_GEN_MIN_P | MODEL_GEN_REPETITION_PENALTY);
    assert_int_equal(g.top_k, 20);
    assert_true(g.min_p == 0 && g.repetition_penalty == 1.05);
    test_write_text(dir, "generation_config.json",
                    "{\"top_k\": 50, \"temperature\": null, \"min_p\": null, \"top_p\": 0.95}");
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, MODEL_GEN_TOP_P);
    test_write_text(dir, "generation_config.json", "{\"top_k\": -1, \"temperature\": 0}");
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, MODEL_GEN_TOP_K | MODEL_GEN_TEMPERATURE);
    assert_true(g.top_k == 0 && g.temperature == 0);

    test_write_text(dir, "generation_config.json", "{\"temperature\": \"0.7\"}");
    assert_int_equal(model_generation_defaults_load(dir, &g), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "generation_config.json: \"temperature\""));
    test_write_text(dir, "generation_config.json", "{\"top_k\": 2.5}");
    assert_int_equal(model_generation_defaults_load(dir, &g), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "\"top_k\" must be an integer"));
    test_write_text(dir, "generation_config.json", "{\"top_p\": 1e300}");
    assert_int_equal(model_generation_defaults_load(dir, &g), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "\"top_p\""));
    test_write_text(dir, "generation_config.json", "{\"temperature\": 1e-50}"); /* float 0 */
    assert_int_equal(model_generation_defaults_load(dir, &g), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "\"temperature\" 1e-50"));
    test_write_text(dir, "generation_config.json", "{\"repetition_penalty\": 1, \"min_p\": 0.05}");
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, MODEL_GEN_MIN_P);
    assert_true(g.min_p == 0.05);
    test_write_text(dir, "generation_config.json", "[0.7]");
    assert_int_equal(model_generation_defaults_load(dir, &g), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "not a JSON object"));
    test_write_text(dir, "generation_config.json", "{\"temperature\": 0.7");
    assert_int_equal(model_generation_defaults_load(dir, &g), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "generation_config.json"));

    /* No generation_config.json: config.json's fields, as vLLM's from_model_config (an old
     * config.json's serialised transformers defaults are not the model's); a broken config.json
     * gives none (the worker refuses it) */
    char path[256];
    snprintf(path, sizeof(path), "%s/generation_config.json", dir);
    unlink(path);
    test_write_text(
        dir, "config.json",
        "{\"model_type\": \"gpt2\", \"temperature\": 0.7, \"top_k\": 50, \"top_p\": 1.0, "
        "\"repetition_penalty\": 1.0, \"max_length\": 20}");
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, MODEL_GEN_TEMPERATURE);
    assert_true(g.temperature == 0.7);
    /* what transformers could not sample with is passed over there, as vLLM starts with it */
    test_write_text(dir, "config.json",
                    "{\"top_k\": \"20\", \"temperature\": true, \"top_p\": 1e300, \"min_p\": 0.5, "
                    "\"repetition_penalty\": 1.5}");
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, MODEL_GEN_MIN_P | MODEL_GEN_REPETITION_PENALTY);
    test_write_text(dir, "generation_config.json", "{\"top_p\": 0.8}"); /* the file wins */
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, MODEL_GEN_TOP_P);
    unlink(path);
    test_write_text(dir, "config.json", "{\"temperature\": 0.7");
    g.set = 99;
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, 0);
    test_write_text(dir, "config.json", "[1]");
    assert_int_equal(model_generation_defaults_load(dir, &g), 0);
    assert_int_equal(g.set, 0);
    snprintf(path, sizeof(path), "%s/config.json", dir);
    unlink(path);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_every_field),
        cmocka_unit_test(test_mistral_fields),
        cmocka_unit_test(test_qwen2_fields),
        cmocka_unit_test(test_defaults_when_absent),
        cmocka_unit_test(test_rope_parameters_spelling),
        cmocka_unit_test(test_rope_scaling_type_or_rope_type),
        cmocka_unit_test(test_eos_number_list_null),
        cmocka_unit_test(test_head_dim_given_or_derived),
        cmocka_unit_test(test_refuses_active_sliding_window),
        cmocka_unit_test(test_refuses_unsupported_rope),
        cmocka_unit_test(test_refuses_architecture),
        cmocka_unit_test(test_refuses_dtype),
        cmocka_unit_test(test_refuses_other_math),
        cmocka_unit_test(test_missing_or_mistyped_fields),
        cmocka_unit_test(test_validate),
        cmocka_unit_test(test_tiny_preset),
        cmocka_unit_test(test_generation_config_eos),
        cmocka_unit_test(test_tokenizer_eos),
        cmocka_unit_test(test_generation_sampling_defaults),
        cmocka_unit_test(test_to_json_round_trip),
        cmocka_unit_test(test_load_from_directory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
