/* Tests of model/model_budget.c: the GPU memory a model's weights take (BF16), checked against
 * parameter counts known from the models' own cards, and the parts a worker needs added up. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "model/model_budget.h"

#include <string.h>

/* Llama-3-8B's config.json shape: 8,030,261,248 parameters. */
static struct model_config llama3_8b(void)
{
    struct model_config c;
    memset(&c, 0, sizeof(c));
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    return c;
}

static void test_llama3_8b_weights(void **state)
{
    (void)state;
    struct model_config c = llama3_8b();
    assert_int_equal(model_budget_weight_bytes(&c), UINT64_C(8030261248) * 2);
}

/* Tied embeddings store the vocabulary matrix once; biases add their vectors. */
static void test_tied_embeddings_and_biases(void **state)
{
    (void)state;
    struct model_config c = llama3_8b();
    uint64_t untied = model_budget_weight_bytes(&c);
    c.tie_word_embeddings = true;
    assert_int_equal(untied - model_budget_weight_bytes(&c), UINT64_C(128256) * 4096 * 2);
    c.tie_word_embeddings = false;
    c.qkv_bias = true;
    assert_int_equal(model_budget_weight_bytes(&c) - untied, UINT64_C(32) * (4096 + 2 * 1024) * 2);
}

/* A worker needs its weights, its activations and the reserve, and activations grow with the
 * step's tokens and sequences. */
static void test_worker_bytes_add_up(void **state)
{
    (void)state;
    struct model_config c = llama3_8b();
    uint64_t acts = model_budget_activation_bytes(&c, 2048, 256);
    assert_int_equal(model_budget_worker_bytes(&c, 2048, 256),
                     model_budget_weight_bytes(&c) + acts + MODEL_BUDGET_RESERVE_BYTES);
    assert_true(model_budget_activation_bytes(&c, 4096, 256) > acts);
    assert_true(model_budget_activation_bytes(&c, 2048, 512) > acts);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3_8b_weights),
        cmocka_unit_test(test_tied_embeddings_and_biases),
        cmocka_unit_test(test_worker_bytes_add_up),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
