/* Tests of model/model_shard.c and model_weights_open_shard: which sizes are refused and why,
 * that each rank's views are exactly its slice of the whole model's tensors (rows of Q/K/V,
 * gate and up, columns of O and down, vocabulary rows of the embedding and the tied LM head),
 * and that the memory budget counts the shard. Uses the bundled model (assets/pagoda-brown:
 * 4 heads, 2 KV heads, intermediate 704, vocabulary 8192, tied). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "model/model_budget.h"
#include "model/model_shard.h"
#include "model/model_weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char brown[4096];

static int setup(void **state)
{
    (void)state;
    const char *src = getenv("PAGODA_SOURCE_DIR");
    snprintf(brown, sizeof(brown), "%s/assets/pagoda-brown", src ? src : ".");
    return 0;
}

static void expect_refused(const struct model_config *c, int size, int code, const char *needle)
{
    struct model_shard s;
    assert_int_equal(model_shard_make(c, 0, size, &s), code);
    if (strstr(pagoda_error_detail(), needle) == NULL)
        fail_msg("detail \"%s\" lacks \"%s\"", pagoda_error_detail(), needle);
}

static void test_shard_sizes(void **state)
{
    (void)state;
    struct model_config c;
    model_config_tiny(&c); /* 4 heads, 2 KV heads, intermediate 688, vocabulary 512 */
    struct model_shard s;
    assert_int_equal(model_shard_make(&c, 1, 2, &s), 0);
    assert_int_equal(s.num_heads, 2);
    assert_int_equal(s.num_kv_heads, 1);
    assert_int_equal(s.intermediate_size, 344);
    assert_int_equal(s.vocab_begin, 256);
    assert_int_equal(s.vocab_end, 512);
    assert_int_equal(s.vocab_per_rank, 256);
    expect_refused(&c, 3, PAGODA_EUNSUPPORTED, "num_attention_heads (4)");
    expect_refused(&c, 4, PAGODA_EUNSUPPORTED, "num_key_value_heads (2)");
    c.num_kv_heads = 4;
    c.intermediate_size = 690;
    expect_refused(&c, 4, PAGODA_EUNSUPPORTED, "intermediate_size (690)");
    expect_refused(&c, 0, PAGODA_EINVAL, "size 0");
    expect_refused(&c, MODEL_SHARD_MAX_SIZE + 1, PAGODA_EINVAL, "size");
    assert_int_equal(model_shard_make(&c, 2, 2, &s), PAGODA_EINVAL);
    /* An uneven vocabulary: runs of ceil(10 / 4) = 3 rows, the last rank's shorter. */
    c.intermediate_size = 688;
    c.vocab_size = 10;
    assert_int_equal(model_shard_make(&c, 3, 4, &s), 0);
    assert_int_equal(s.vocab_begin, 9);
    assert_int_equal(s.vocab_end, 10);
    assert_int_equal(s.vocab_per_rank, 3);
    c.vocab_size = 5; /* runs of 2: rank 3 would have none */
    expect_refused(&c, 4, PAGODA_EUNSUPPORTED, "without vocabulary");
}

/* view holds rows [begin, begin + view rows) of whole. */
static void assert_rows(const struct tensor_view *whole, const struct tensor_view *view,
                        int64_t begin)
{
    size_t esize = dtype_size(whole->dtype);
    int64_t row = whole->ndim == 2 ? whole->shape[1] : 1;
    assert_int_equal(view->ndim, whole->ndim);
    assert_int_equal(view->nbytes, (size_t)(view->shape[0] * row) * esize);
    assert_memory_equal(view->data, (const char *)whole->data + (size_t)(begin * row) * esize,
                        view->nbytes);
}

/* view holds columns [begin, begin + view cols) of whole. */
static void assert_cols(const struct tensor_view *whole, const struct tensor_view *view,
                        int64_t begin)
{
    size_t esize = dtype_size(whole->dtype);
    int64_t len = view->shape[1];
    assert_int_equal(view->shape[0], whole->shape[0]);
    assert_int_equal(view->nbytes, (size_t)(whole->shape[0] * len) * esize);
    for (int64_t r = 0; r < whole->shape[0]; r++)
        assert_memory_equal((const char *)view->data + (size_t)(r * len) * esize,
                            (const char *)whole->data +
                                (size_t)(r * whole->shape[1] + begin) * esize,
                            (size_t)len * esize);
}

static void test_shards_are_slices(void **state)
{
    (void)state;
    struct model_weights *whole;
    assert_int_equal(model_weights_open(brown, &whole), 0);
    const struct model_config *c = &whole->config;
    assert_int_equal(whole->shard.size, 1);
    for (int rank = 0; rank < 2; rank++) {
        struct model_weights *w;
        assert_int_equal(model_weights_open_shard(brown, rank, 2, &w), 0);
        int64_t hd = c->head_dim;
        assert_int_equal(w->layers[0].q_proj.shape[0], 2 * hd);
        assert_int_equal(w->layers[0].k_proj.shape[0], hd);
        assert_int_equal(w->layers[0].o_proj.shape[1], 2 * hd);
        assert_int_equal(w->layers[0].down_proj.shape[1], 352);
        assert_int_equal(w->embed_tokens.shape[0], 4096);
        for (int64_t i = 0; i < c->num_layers; i++) {
            const struct model_weights_layer *a = &whole->layers[i], *b = &w->layers[i];
            assert_rows(&a->q_proj, &b->q_proj, rank * 2 * hd);
            assert_rows(&a->k_proj, &b->k_proj, rank * hd);
            assert_rows(&a->v_proj, &b->v_proj, rank * hd);
            assert_cols(&a->o_proj, &b->o_proj, rank * 2 * hd);
            assert_rows(&a->gate_proj, &b->gate_proj, rank * 352);
            assert_rows(&a->up_proj, &b->up_proj, rank * 352);
            assert_cols(&a->down_proj, &b->down_proj, rank * 352);
            assert_memory_equal(a->input_layernorm.data, b->input_layernorm.data,
                                a->input_layernorm.nbytes);
        }
        assert_rows(&whole->embed_tokens, &w->embed_tokens, rank * 4096);
        assert_ptr_equal(w->lm_head.data, w->embed_tokens.data); /* tied */
        assert_memory_equal(whole->norm.data, w->norm.data, whole->norm.nbytes);
        model_weights_close(w);
    }
    struct model_weights *w = NULL;
    assert_int_equal(model_weights_open_shard(brown, 0, 3, &w), PAGODA_EUNSUPPORTED);
    assert_null(w);
    model_weights_close(whole);
}

/* Two ranks hold everything once, except the norms, which both hold. */
static void test_budget_counts_the_shard(void **state)
{
    (void)state;
    struct model_config c;
    model_config_tiny(&c);
    struct model_shard whole = model_shard_whole(&c), s0, s1;
    assert_int_equal(model_shard_make(&c, 0, 2, &s0), 0);
    assert_int_equal(model_shard_make(&c, 1, 2, &s1), 0);
    uint64_t norms = (uint64_t)(2 * c.num_layers + 1) * (uint64_t)c.hidden_size * 2;
    assert_int_equal(model_budget_shard_weight_bytes(&c, &whole), model_budget_weight_bytes(&c));
    assert_int_equal(model_budget_shard_weight_bytes(&c, &s0) +
                         model_budget_shard_weight_bytes(&c, &s1) - norms,
                     model_budget_weight_bytes(&c));
    assert_true(model_budget_shard_worker_bytes(&c, &s0, MODEL_BUDGET_COMM_NONE, 2048, 256) <
                model_budget_worker_bytes(&c, 2048, 256));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shard_sizes),
        cmocka_unit_test(test_shards_are_slices),
        cmocka_unit_test(test_budget_counts_the_shard),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
