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
                     model_budget_weight_bytes(&c) + acts + model_budget_graph_bytes(2048, 256) +
                         MODEL_BUDGET_RESERVE_BYTES);
    assert_true(model_budget_activation_bytes(&c, 4096, 256) > acts);
    assert_true(model_budget_activation_bytes(&c, 2048, 512) > acts);
}

/* The decode graphs' batch sizes: vLLM's capture sizes up to the largest decode step. */
static void test_graph_batches(void **state)
{
    (void)state;
    int32_t sizes[MODEL_BUDGET_GRAPHS_MAX];
    assert_int_equal(model_budget_graph_batches(2048, 256, sizes), 35);
    assert_int_equal(sizes[0], 1);
    assert_int_equal(sizes[1], 2);
    assert_int_equal(sizes[2], 4);
    assert_int_equal(sizes[3], 8);
    assert_int_equal(sizes[4], 16);
    assert_int_equal(sizes[34], 256);
    /* Capped at MODEL_BUDGET_GRAPH_BATCH_MAX, and by the tokens of a step. */
    assert_int_equal(model_budget_graph_batches(4096, 1024, sizes), 35);
    assert_int_equal(sizes[34], MODEL_BUDGET_GRAPH_BATCH_MAX);
    assert_int_equal(model_budget_graph_batches(16, 256, sizes), 5);
    assert_int_equal(sizes[4], 16);
    /* A limit that is no capture size is the last size. */
    assert_int_equal(model_budget_graph_batches(2048, 20, sizes), 6);
    assert_int_equal(sizes[4], 16);
    assert_int_equal(sizes[5], 20);
    assert_int_equal(model_budget_graph_batches(2048, 3, sizes), 3);
    assert_int_equal(sizes[2], 3);
    assert_int_equal(model_budget_graph_batches(2048, 1, sizes), 1);
    assert_int_equal(model_budget_graph_batches(2048, 0, sizes), 0);
    /* Every graph counted, and the cuBLAS workspace. */
    assert_int_equal(model_budget_graph_bytes(2048, 256),
                     35 * MODEL_BUDGET_GRAPH_BYTES + MODEL_BUDGET_CUBLAS_WORKSPACE_BYTES);
    for (int64_t m = 1; m <= 1024; m++)
        assert_true(model_budget_graph_batches(m, m, NULL) <= MODEL_BUDGET_GRAPHS_MAX);
}

/* A rank of a group counts the buffers of its collectives beside the shard's activations (issue
 * 21's review, item 1): the f32 row-parallel output and its own logits whenever a group is set,
 * even a group of one, and the all-gather's receive buffer with NCCL. Llama-3-8B at TP 2, the
 * worker's default limits: figures worked by hand. */
static void test_shard_counts_the_group_buffers(void **state)
{
    (void)state;
    struct model_config c = llama3_8b();
    struct model_shard s0, whole = model_shard_whole(&c);
    assert_int_equal(model_shard_make(&c, 0, 2, &s0), 0);
    const uint64_t T = 2048, S = 256, H = 4096;
    const uint64_t partial = T * H * 4;   /* 32 MiB */
    const uint64_t local = S * 64128 * 4; /* ceil(128256 / 2) = 64128 rows of logits */
    uint64_t none = model_budget_shard_activation_bytes(&c, &s0, MODEL_BUDGET_COMM_NONE, 2048, 256);
    uint64_t host = model_budget_shard_activation_bytes(&c, &s0, MODEL_BUDGET_COMM_HOST, 2048, 256);
    uint64_t nccl = model_budget_shard_activation_bytes(&c, &s0, MODEL_BUDGET_COMM_NCCL, 2048, 256);
    assert_int_equal(host - none, partial + local);
    assert_int_equal(nccl - host, 2 * local);
    assert_int_equal(model_budget_shard_worker_bytes(&c, &s0, MODEL_BUDGET_COMM_NCCL, 2048, 256),
                     model_budget_shard_weight_bytes(&c, &s0) + nccl +
                         model_budget_graph_bytes(2048, 256) + MODEL_BUDGET_RESERVE_BYTES);
    /* A group of one (the whole model through an NCCL communicator of one rank) still holds
     * both buffers and a gathered copy of the whole vocabulary's logits. */
    uint64_t one =
        model_budget_shard_activation_bytes(&c, &whole, MODEL_BUDGET_COMM_NCCL, 2048, 256);
    assert_int_equal(one - model_budget_activation_bytes(&c, 2048, 256),
                     partial + 2 * S * 128256 * 4);
    /* Without a group the shard functions are the whole model's. */
    assert_int_equal(
        model_budget_shard_activation_bytes(&c, &whole, MODEL_BUDGET_COMM_NONE, 2048, 256),
        model_budget_activation_bytes(&c, 2048, 256));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3_8b_weights),
        cmocka_unit_test(test_tied_embeddings_and_biases),
        cmocka_unit_test(test_worker_bytes_add_up),
        cmocka_unit_test(test_graph_batches),
        cmocka_unit_test(test_shard_counts_the_group_buffers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
