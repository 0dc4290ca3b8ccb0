/* Tests of kernels/cpu/attention: reshape-and-cache, both attention implementations against a
 * plain contiguous attention written here (double precision, from contiguous K/V arrays, never
 * through the pool), plan validation, scratch that does not grow in the paged version, and the
 * merge of partial states.
 *
 * The pool has two layers and the tests use layer 1; everything in it that the tests do not
 * write is NaN, so a kernel that reads the wrong layer, a slot past the context, or a block it
 * was not given produces NaN and fails. Outputs are poisoned with NaN before every run. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "kernels/cpu/attention.h"
#include "kvpool/geometry.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEQS 8
#define TOLERANCE 1e-5

static uint64_t xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    *s = x;
    return x;
}

/* Uniform in [-1, 1). */
static float frand(uint64_t *s)
{
    return (float)((double)(xorshift(s) >> 11) / (double)(1ull << 52) - 1.0);
}

static void fill_random(float *x, size_t n, uint64_t *rng)
{
    for (size_t i = 0; i < n; i++)
        x[i] = frand(rng);
}

static void poison(float *x, size_t n)
{
    for (size_t i = 0; i < n; i++)
        x[i] = NAN;
}

struct shape {
    int32_t block_size;
    int32_t num_heads;
    int32_t num_kv_heads;
    int32_t head_dim;
};

/* One sequence's whole context, contiguous: the truth the pool must reproduce. */
struct seq_data {
    int32_t total_len;
    float *k, *v;   /* [total_len][num_kv_heads][head_dim] */
    float *q;       /* [total_len][num_heads][head_dim]: the query of each position */
    int32_t *table; /* physical blocks for total_len tokens */
    int32_t written;
};

struct world {
    struct shape sh;
    float scale;
    struct kv_geometry geo;
    float *pool;
    struct kv_layer_view view; /* layer 1 */
    int32_t *free_blocks;      /* 1 .. num_blocks - 1, shuffled */
    int32_t num_free;
    int32_t num_seqs;
    struct seq_data seqs[MAX_SEQS];
    int32_t table_width; /* max blocks of any sequence */
    uint64_t rng;
};

static int32_t blocks_for(int32_t tokens, int32_t block_size)
{
    return (tokens + block_size - 1) / block_size;
}

/* A pool with room for the sequences (plus spare blocks that stay NaN) and each sequence's
 * random K, V and queries. Physical blocks are handed out in shuffled order. */
static void world_init(struct world *w, struct shape sh, const int32_t *total_lens,
                       int32_t num_seqs, uint64_t seed)
{
    memset(w, 0, sizeof(*w));
    w->sh = sh;
    w->scale = 1.0f / sqrtf((float)sh.head_dim);
    w->rng = seed;
    w->num_seqs = num_seqs;
    int32_t needed = 0;
    for (int32_t s = 0; s < num_seqs; s++) {
        int32_t b = blocks_for(total_lens[s], sh.block_size);
        needed += b;
        if (b > w->table_width)
            w->table_width = b;
    }
    w->geo = (struct kv_geometry){.pool_id = 7,
                                  .num_layers = 2,
                                  .num_blocks = needed + 5,
                                  .block_size = sh.block_size,
                                  .num_kv_heads = sh.num_kv_heads,
                                  .head_dim = sh.head_dim,
                                  .dtype = DTYPE_F32};
    size_t pool_floats = kv_pool_bytes(&w->geo) / sizeof(float);
    w->pool = malloc(pool_floats * sizeof(float));
    assert_non_null(w->pool);
    poison(w->pool, pool_floats);
    w->view = kv_layer_view_make(&w->geo, w->pool, 1);

    w->num_free = w->geo.num_blocks - 1;
    w->free_blocks = malloc((size_t)w->num_free * sizeof(int32_t));
    assert_non_null(w->free_blocks);
    for (int32_t i = 0; i < w->num_free; i++)
        w->free_blocks[i] = i + 1;
    for (int32_t i = w->num_free - 1; i > 0; i--) {
        int32_t j = (int32_t)(xorshift(&w->rng) % (uint64_t)(i + 1));
        int32_t tmp = w->free_blocks[i];
        w->free_blocks[i] = w->free_blocks[j];
        w->free_blocks[j] = tmp;
    }

    for (int32_t s = 0; s < num_seqs; s++) {
        struct seq_data *sd = &w->seqs[s];
        sd->total_len = total_lens[s];
        size_t kv_n = (size_t)sd->total_len * sh.num_kv_heads * sh.head_dim;
        size_t q_n = (size_t)sd->total_len * sh.num_heads * sh.head_dim;
        sd->k = malloc(kv_n * sizeof(float));
        sd->v = malloc(kv_n * sizeof(float));
        sd->q = malloc(q_n * sizeof(float));
        int32_t nb = blocks_for(sd->total_len, sh.block_size);
        sd->table = malloc((size_t)nb * sizeof(int32_t));
        assert_true(sd->k && sd->v && sd->q && sd->table);
        fill_random(sd->k, kv_n, &w->rng);
        fill_random(sd->v, kv_n, &w->rng);
        fill_random(sd->q, q_n, &w->rng);
        for (int32_t b = 0; b < nb; b++)
            sd->table[b] = w->free_blocks[--w->num_free];
    }
}

static void world_fini(struct world *w)
{
    for (int32_t s = 0; s < w->num_seqs; s++) {
        free(w->seqs[s].k);
        free(w->seqs[s].v);
        free(w->seqs[s].q);
        free(w->seqs[s].table);
    }
    free(w->free_blocks);
    free(w->pool);
}

/* Writes tokens written .. upto - 1 of every sequence in one attention_write_kv call, as one
 * step would, with a padding token (slot -1) between sequences. */
static void world_write(struct world *w, const int32_t *upto)
{
    const struct shape *sh = &w->sh;
    size_t vec = (size_t)sh->num_kv_heads * sh->head_dim;
    int32_t n = 0;
    for (int32_t s = 0; s < w->num_seqs; s++)
        n += upto[s] - w->seqs[s].written + 1;
    int64_t *slots = malloc((size_t)n * sizeof(int64_t));
    float *k = malloc((size_t)n * vec * sizeof(float));
    float *v = malloc((size_t)n * vec * sizeof(float));
    assert_true(slots && k && v);
    int32_t t = 0;
    for (int32_t s = 0; s < w->num_seqs; s++) {
        struct seq_data *sd = &w->seqs[s];
        for (int32_t i = sd->written; i < upto[s]; i++, t++) {
            slots[t] = (int64_t)sd->table[i / sh->block_size] * sh->block_size + i % sh->block_size;
            memcpy(k + (size_t)t * vec, sd->k + (size_t)i * vec, vec * sizeof(float));
            memcpy(v + (size_t)t * vec, sd->v + (size_t)i * vec, vec * sizeof(float));
        }
        slots[t] = -1; /* padding: its (random) K/V must go nowhere */
        fill_random(k + (size_t)t * vec, vec, &w->rng);
        fill_random(v + (size_t)t * vec, vec, &w->rng);
        t++;
        if (upto[s] > sd->written)
            sd->written = upto[s];
    }
    assert_int_equal(attention_write_kv(&w->view, n, slots, k, v), 0);
    free(slots);
    free(k);
    free(v);
}

/* Plain attention of one query row against keys 0 .. pos of a contiguous context, in double. */
static double reference_row(const struct world *w, const struct seq_data *sd, const float *qv,
                            int32_t head, int32_t pos, double *out, double *scores)
{
    const struct shape *sh = &w->sh;
    int32_t kh = head / (sh->num_heads / sh->num_kv_heads);
    double max = -INFINITY;
    for (int32_t i = 0; i <= pos; i++) {
        const float *kv = sd->k + ((size_t)i * sh->num_kv_heads + kh) * sh->head_dim;
        double acc = 0.0;
        for (int32_t d = 0; d < sh->head_dim; d++)
            acc += (double)qv[d] * kv[d];
        scores[i] = acc * (double)w->scale;
        if (scores[i] > max)
            max = scores[i];
    }
    double sum = 0.0;
    for (int32_t d = 0; d < sh->head_dim; d++)
        out[d] = 0.0;
    for (int32_t i = 0; i <= pos; i++) {
        double p = exp(scores[i] - max);
        sum += p;
        const float *vv = sd->v + ((size_t)i * sh->num_kv_heads + kh) * sh->head_dim;
        for (int32_t d = 0; d < sh->head_dim; d++)
            out[d] += p * vv[d];
    }
    for (int32_t d = 0; d < sh->head_dim; d++)
        out[d] /= sum;
    return max + log(sum);
}

/* ||out - ref|| / ||ref|| */
static double rel_error(const float *out, const double *ref, size_t n)
{
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)out[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return sqrt(num / den);
}

static double max_abs_error(const float *out, const double *ref, size_t n)
{
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)out[i] - ref[i]);
        if (!(e <= worst))
            worst = e; /* NaN becomes the worst */
    }
    return worst;
}

static struct attention_config world_config(const struct world *w, enum attention_impl impl,
                                            int32_t max_num_tokens)
{
    return (struct attention_config){.impl = impl,
                                     .num_heads = w->sh.num_heads,
                                     .num_kv_heads = w->sh.num_kv_heads,
                                     .head_dim = w->sh.head_dim,
                                     .scale = w->scale,
                                     .block_size = w->sh.block_size,
                                     .num_blocks = w->geo.num_blocks,
                                     .dtype = DTYPE_F32,
                                     .max_num_seqs = MAX_SEQS,
                                     .max_num_tokens = max_num_tokens,
                                     .max_blocks_per_seq = w->table_width};
}

/* One step's batch over the sequences with query_len[s] > 0: sequence s has context_len[s]
 * tokens and its last query_len[s] are queried. Owns its arrays. */
struct step {
    struct attention_batch batch;
    int32_t query_start[MAX_SEQS + 1];
    int32_t context_len[MAX_SEQS];
    int32_t *tables;
    int32_t seq_of[MAX_SEQS]; /* batch index -> world sequence */
    float *q;                 /* [num_tokens][num_heads][head_dim] */
    double *ref;              /* same shape */
    double *ref_lse;          /* [num_tokens][num_heads] */
    float *out;
    float *lse;
    size_t out_n;
    size_t lse_n;
};

static void step_build(struct step *st, const struct world *w, const int32_t *context_len,
                       const int32_t *query_len)
{
    const struct shape *sh = &w->sh;
    memset(st, 0, sizeof(*st));
    int32_t n = 0, tokens = 0;
    for (int32_t s = 0; s < w->num_seqs; s++) {
        if (query_len[s] == 0)
            continue;
        st->seq_of[n] = s;
        st->context_len[n] = context_len[s];
        st->query_start[n] = tokens;
        tokens += query_len[s];
        n++;
    }
    st->query_start[n] = tokens;
    size_t row = (size_t)sh->num_heads * sh->head_dim;
    st->out_n = (size_t)tokens * row;
    st->lse_n = (size_t)tokens * sh->num_heads;
    st->tables = malloc((size_t)n * w->table_width * sizeof(int32_t) + 1);
    st->q = malloc(st->out_n * sizeof(float));
    st->out = malloc(st->out_n * sizeof(float));
    st->lse = malloc(st->lse_n * sizeof(float));
    st->ref = malloc(st->out_n * sizeof(double));
    st->ref_lse = malloc(st->lse_n * sizeof(double));
    double *scores = malloc(8192 * sizeof(double));
    assert_true(st->tables && st->q && st->out && st->lse && st->ref && st->ref_lse && scores);

    for (int32_t b = 0; b < n; b++) {
        const struct seq_data *sd = &w->seqs[st->seq_of[b]];
        int32_t used = blocks_for(st->context_len[b], sh->block_size);
        int32_t *row_table = st->tables + (size_t)b * w->table_width;
        for (int32_t i = 0; i < w->table_width; i++)
            row_table[i] = i < used ? sd->table[i] : -3; /* past the context: ignored */
        int32_t qlen = st->query_start[b + 1] - st->query_start[b];
        for (int32_t j = 0; j < qlen; j++) {
            int32_t pos = st->context_len[b] - qlen + j;
            int32_t t = st->query_start[b] + j;
            assert_true(pos < 8192);
            memcpy(st->q + (size_t)t * row, sd->q + (size_t)pos * row, row * sizeof(float));
            for (int32_t h = 0; h < sh->num_heads; h++) {
                size_t r = (size_t)t * sh->num_heads + h;
                st->ref_lse[r] = reference_row(w, sd, st->q + r * sh->head_dim, h, pos,
                                               st->ref + r * sh->head_dim, scores);
            }
        }
    }
    free(scores);
    st->batch = (struct attention_batch){.num_seqs = n,
                                         .num_tokens = tokens,
                                         .query_start = st->query_start,
                                         .context_len = st->context_len,
                                         .block_tables = st->tables,
                                         .max_blocks_per_seq = w->table_width};
}

static void step_free(struct step *st)
{
    free(st->tables);
    free(st->q);
    free(st->out);
    free(st->lse);
    free(st->ref);
    free(st->ref_lse);
}

/* Runs the step with both implementations, with and without the log-sum-exp, and checks them
 * against the reference. */
static void step_check(struct step *st, const struct world *w)
{
    const enum attention_impl impls[] = {ATTN_CPU_GATHER, ATTN_CPU_PAGED};
    for (size_t k = 0; k < 2; k++) {
        struct attention_config config = world_config(w, impls[k], st->batch.num_tokens);
        struct attention_plan *plan;
        assert_int_equal(attention_plan_new(&config, &plan), 0);
        assert_int_equal(attention_plan(plan, &st->batch), 0);

        poison(st->out, st->out_n);
        assert_int_equal(attention_run(plan, &w->view, st->q, st->out), 0);
        double err = rel_error(st->out, st->ref, st->out_n);
        if (!(err < TOLERANCE))
            fail_msg("impl %d: relative error %g", (int)impls[k], err);

        poison(st->out, st->out_n);
        poison(st->lse, st->lse_n);
        assert_int_equal(attention_run_partial(plan, &w->view, st->q, st->out, st->lse), 0);
        err = rel_error(st->out, st->ref, st->out_n);
        double lse_err = max_abs_error(st->lse, st->ref_lse, st->lse_n);
        if (!(err < TOLERANCE) || !(lse_err < 1e-4))
            fail_msg("impl %d partial: relative error %g, lse error %g", (int)impls[k], err,
                     lse_err);
        attention_plan_free(plan);
    }
}

/* Writes the whole context of every sequence, then checks one step that queries the last
 * query_len tokens of each. */
static void check_one_step(struct shape sh, const int32_t *context_len, const int32_t *query_len,
                           int32_t num_seqs, uint64_t seed)
{
    struct world w;
    world_init(&w, sh, context_len, num_seqs, seed);
    /* The history first (as a prefix already in the pool), then the step's own tokens. */
    int32_t history[MAX_SEQS];
    for (int32_t s = 0; s < num_seqs; s++)
        history[s] = context_len[s] - query_len[s];
    world_write(&w, history);
    world_write(&w, context_len);
    struct step st;
    step_build(&st, &w, context_len, query_len);
    step_check(&st, &w);
    step_free(&st);
    world_fini(&w);
}

static struct shape gqa_shape(int32_t block_size)
{
    return (struct shape){block_size, 8, 2, 64}; /* 4 query heads per KV head */
}

static struct shape mha_shape(int32_t block_size)
{
    return (struct shape){block_size, 2, 2, 48};
}

static void test_write_kv_places_vectors_and_skips_padding(void **state)
{
    struct shape sh = {8, 4, 2, 16};
    int32_t len = 19;
    struct world w;
    world_init(&w, sh, &len, 1, 11);
    int32_t upto = len;
    world_write(&w, &upto);
    /* Every written vector is where the view's strides say; everything else is still NaN. */
    struct seq_data *sd = &w.seqs[0];
    size_t written = 0, nan = 0;
    size_t layer_floats = kv_layer_bytes(&w.geo) / sizeof(float);
    const float *layer0 = w.pool, *layer1 = w.pool + layer_floats;
    for (int32_t i = 0; i < len; i++)
        for (int32_t h = 0; h < sh.num_kv_heads; h++) {
            int32_t block = sd->table[i / sh.block_size], slot = i % sh.block_size;
            int64_t off =
                block * w.view.block_stride + h * w.view.head_stride + slot * w.view.slot_stride;
            const float *want = sd->k + ((size_t)i * sh.num_kv_heads + h) * sh.head_dim;
            assert_memory_equal((const float *)w.view.k + off, want, sh.head_dim * sizeof(float));
            want = sd->v + ((size_t)i * sh.num_kv_heads + h) * sh.head_dim;
            assert_memory_equal((const float *)w.view.v + off, want, sh.head_dim * sizeof(float));
            written += 2 * (size_t)sh.head_dim;
        }
    for (size_t i = 0; i < layer_floats; i++) {
        assert_true(isnan(layer0[i]));
        nan += isnan(layer1[i]) ? 1 : 0;
    }
    assert_int_equal(nan, layer_floats - written); /* the padding token went nowhere */
    world_fini(&w);
}

static void test_write_kv_refuses_bad_slots(void **state)
{
    struct shape sh = {16, 2, 2, 8};
    int32_t len = 3;
    struct world w;
    world_init(&w, sh, &len, 1, 12);
    float k[2 * 2 * 8], v[2 * 2 * 8];
    fill_random(k, 32, &w.rng);
    fill_random(v, 32, &w.rng);
    int64_t num_slots = (int64_t)w.geo.num_blocks * sh.block_size;
    int64_t good = (int64_t)w.seqs[0].table[0] * sh.block_size;
    const float *good_k = (const float *)w.view.k + w.seqs[0].table[0] * w.view.block_stride;

    int64_t past_end[2] = {good, num_slots};
    assert_int_equal(attention_write_kv(&w.view, 2, past_end, k, v), PAGODA_ERANGE);
    assert_true(isnan(good_k[0])); /* checked before anything was written */
    int64_t huge[2] = {good, INT64_MAX};
    assert_int_equal(attention_write_kv(&w.view, 2, huge, k, v), PAGODA_ERANGE);
    int64_t reserved[2] = {good, 3}; /* block 0 is padding, never a sequence's */
    assert_int_equal(attention_write_kv(&w.view, 2, reserved, k, v), PAGODA_ERANGE);
    assert_true(isnan(good_k[0]));
    assert_int_equal(attention_write_kv(&w.view, 2, NULL, k, v), PAGODA_EINVAL);
    assert_int_equal(attention_write_kv(&w.view, 0, NULL, NULL, NULL), 0);
    int64_t fine[2] = {good, num_slots - 1};
    assert_int_equal(attention_write_kv(&w.view, 2, fine, k, v), 0);
    assert_memory_equal(good_k, k, 8 * sizeof(float));

    struct kv_layer_view bf16 = w.view;
    bf16.dtype = DTYPE_BF16;
    assert_int_equal(attention_write_kv(&bf16, 2, fine, k, v), PAGODA_EUNSUPPORTED);
    world_fini(&w);
}

/* Decode (one query per sequence) at the lengths where block arithmetic goes wrong, all in one
 * batch, for three block sizes, with GQA and MHA. */
static void test_decode_at_edge_lengths(void **state)
{
    const int32_t block_sizes[] = {8, 16, 32};
    for (size_t b = 0; b < 3; b++) {
        int32_t bs = block_sizes[b];
        int32_t context_len[6] = {1, bs - 1, bs, bs + 1, 5 * bs, 3000};
        int32_t query_len[6] = {1, 1, 1, 1, 1, 1};
        check_one_step(gqa_shape(bs), context_len, query_len, 6, 100 + b);
        check_one_step(mha_shape(bs), context_len, query_len, 6, 200 + b);
    }
}

/* Causal multi-token prefill at the same lengths: whole prompts for the short ones, a chunk of
 * 37 at the end of a 3000-token context for the long one. */
static void test_prefill_causal_at_edge_lengths(void **state)
{
    const int32_t block_sizes[] = {8, 16, 32};
    for (size_t b = 0; b < 3; b++) {
        int32_t bs = block_sizes[b];
        int32_t context_len[6] = {1, bs - 1, bs, bs + 1, 5 * bs, 3000};
        int32_t query_len[6] = {1, bs - 1, bs, bs + 1, 5 * bs, 37};
        check_one_step(gqa_shape(bs), context_len, query_len, 6, 300 + b);
        check_one_step(mha_shape(bs), context_len, query_len, 6, 400 + b);
    }
}

/* Prefill chunks (continuing and fresh) and decode tokens in one flattened batch. */
static void test_mixed_batch_prefill_and_decode(void **state)
{
    int32_t context_len[5] = {3000, 80, 17, 15, 35};
    int32_t query_len[5] = {1, 13, 17, 1, 35};
    check_one_step(gqa_shape(16), context_len, query_len, 5, 500);
    check_one_step(mha_shape(8), context_len, query_len, 5, 501);
}

/* A sequence prefilled in two chunks, then decoded: each step writes only its own tokens, and
 * every step's output equals full causal attention over the whole sequence at those positions.
 * A second sequence is prefilled whole and decoded alongside. */
static void test_prefill_chunk_continues_sequence(void **state)
{
    const int32_t block_sizes[] = {8, 16};
    for (size_t b = 0; b < 2; b++) {
        int32_t totals[2] = {46, 70};
        struct world w;
        world_init(&w, gqa_shape(block_sizes[b]), totals, 2, 600 + b);
        /* step 1: chunk 0..20 of A, all of B but its last token */
        /* step 2: chunk 21..44 of A (starts inside a partly filled block), decode of B */
        /* step 3: decode of A only */
        const int32_t steps[3][2][2] = {
            {{21, 21}, {69, 69}},
            {{45, 24}, {70, 1}},
            {{46, 1}, {70, 0}},
        };
        for (int k = 0; k < 3; k++) {
            int32_t context_len[2] = {steps[k][0][0], steps[k][1][0]};
            int32_t query_len[2] = {steps[k][0][1], steps[k][1][1]};
            world_write(&w, context_len);
            struct step st;
            step_build(&st, &w, context_len, query_len);
            step_check(&st, &w);
            step_free(&st);
        }
        world_fini(&w);
    }
}

static void test_paged_scratch_does_not_grow_with_context(void **state)
{
    int32_t totals[2] = {100, 3000};
    struct world w;
    world_init(&w, gqa_shape(16), totals, 2, 700);
    world_write(&w, totals);
    int32_t short_only[2] = {1, 0}, long_only[2] = {0, 1};
    struct step st_short, st_long;
    step_build(&st_short, &w, totals, short_only);
    step_build(&st_long, &w, totals, long_only);

    struct attention_config config = world_config(&w, ATTN_CPU_PAGED, 4);
    struct attention_plan *plan;
    assert_int_equal(attention_plan_new(&config, &plan), 0);
    assert_int_equal(attention_scratch_bytes(plan, ATTN_CPU_PAGED), 0); /* nothing planned */
    assert_int_equal(attention_plan(plan, &st_short.batch), 0);
    size_t paged_short = attention_scratch_bytes(plan, ATTN_CPU_PAGED);
    size_t gather_short = attention_scratch_bytes(plan, ATTN_CPU_GATHER);
    poison(st_short.out, st_short.out_n);
    assert_int_equal(attention_run(plan, &w.view, st_short.q, st_short.out), 0);
    assert_true(rel_error(st_short.out, st_short.ref, st_short.out_n) < TOLERANCE);

    assert_int_equal(attention_plan(plan, &st_long.batch), 0);
    size_t paged_long = attention_scratch_bytes(plan, ATTN_CPU_PAGED);
    size_t gather_long = attention_scratch_bytes(plan, ATTN_CPU_GATHER);
    poison(st_long.out, st_long.out_n);
    assert_int_equal(attention_run(plan, &w.view, st_long.q, st_long.out), 0);
    assert_true(rel_error(st_long.out, st_long.ref, st_long.out_n) < TOLERANCE);

    assert_true(paged_short > 0);
    assert_int_equal(paged_short, paged_long);
    assert_true(gather_short > 0);
    assert_true(gather_long >= 29 * gather_short); /* 3000 / 100 tokens of K and V */
    attention_plan_free(plan);
    step_free(&st_short);
    step_free(&st_long);
    world_fini(&w);
}

static void test_plan_refuses_bad_metadata(void **state)
{
    int32_t total = 40; /* 5 blocks of 8 */
    struct world w;
    world_init(&w, gqa_shape(8), &total, 1, 800);
    world_write(&w, &total);
    int32_t query_len = 4;
    struct step st;
    step_build(&st, &w, &total, &query_len);
    struct attention_config config = world_config(&w, ATTN_CPU_PAGED, 8);
    struct attention_plan *plan;
    assert_int_equal(attention_plan_new(&config, &plan), 0);
    assert_int_equal(attention_plan(plan, &st.batch), 0);

    struct attention_batch bad = st.batch;
    bad.max_blocks_per_seq = 4; /* the row cannot hold 40 tokens */
    assert_int_equal(attention_plan(plan, &bad), PAGODA_ERANGE);
    assert_true(strlen(pagoda_error_detail()) > 0);
    /* a failed plan leaves nothing to run */
    assert_int_equal(attention_run(plan, &w.view, st.q, st.out), PAGODA_EINVAL);

    const int32_t bad_ids[] = {0, -1, w.geo.num_blocks, w.geo.num_blocks + 100};
    for (size_t i = 0; i < 4; i++) {
        int32_t saved = st.tables[4]; /* the last block the context uses */
        st.tables[4] = bad_ids[i];
        assert_int_equal(attention_plan(plan, &st.batch), PAGODA_ERANGE);
        st.tables[4] = saved;
    }
    assert_int_equal(attention_plan(plan, &st.batch), 0);

    int32_t short_context = 3; /* fewer tokens than the 4 queried */
    bad = st.batch;
    bad.context_len = &short_context;
    assert_int_equal(attention_plan(plan, &bad), PAGODA_EINVAL);

    int32_t query_start[2] = {0, 5}; /* does not end at num_tokens */
    bad = st.batch;
    bad.query_start = query_start;
    assert_int_equal(attention_plan(plan, &bad), PAGODA_EINVAL);
    int32_t empty_seq[3] = {0, 4, 4}; /* the second sequence has no query tokens */
    int32_t two_contexts[2] = {40, 40};
    int32_t two_tables[10];
    memcpy(two_tables, st.tables, 5 * sizeof(int32_t));
    memcpy(two_tables + 5, st.tables, 5 * sizeof(int32_t));
    bad = st.batch;
    bad.num_seqs = 2;
    bad.context_len = two_contexts;
    bad.block_tables = two_tables;
    bad.max_blocks_per_seq = 5;
    int32_t two_seqs[3] = {0, 2, 4};
    bad.query_start = two_seqs;
    assert_int_equal(attention_plan(plan, &bad), 0); /* the same blocks twice is allowed */
    bad.query_start = empty_seq;
    assert_int_equal(attention_plan(plan, &bad), PAGODA_EINVAL);
    int32_t decreasing[3] = {0, 5, 4};
    bad.query_start = decreasing;
    assert_int_equal(attention_plan(plan, &bad), PAGODA_EINVAL);
    bad.query_start = two_seqs;
    bad.max_blocks_per_seq = 0;
    assert_int_equal(attention_plan(plan, &bad), PAGODA_EINVAL);
    bad.max_blocks_per_seq = 5;
    bad.num_seqs = MAX_SEQS + 1; /* above max_num_seqs */
    assert_int_equal(attention_plan(plan, &bad), PAGODA_ERANGE);

    bad = st.batch;
    bad.num_tokens = 9; /* above max_num_tokens */
    assert_int_equal(attention_plan(plan, &bad), PAGODA_ERANGE);
    bad.num_tokens = -1;
    assert_int_equal(attention_plan(plan, &bad), PAGODA_ERANGE);
    attention_plan_free(plan);

    /* A plan whose limit is below what the caller's table rows could hold. */
    config.max_blocks_per_seq = 4;
    assert_int_equal(attention_plan_new(&config, &plan), 0);
    assert_int_equal(attention_plan(plan, &st.batch), PAGODA_ERANGE);
    attention_plan_free(plan);
    step_free(&st);
    world_fini(&w);
}

static void test_plan_new_refuses_bad_config(void **state)
{
    struct world w;
    int32_t total = 8;
    world_init(&w, gqa_shape(8), &total, 1, 900);
    struct attention_config good = world_config(&w, ATTN_CPU_GATHER, 8), c;
    struct attention_plan *plan = (struct attention_plan *)&w; /* must be reset to NULL */

    c = good;
    c.dtype = DTYPE_BF16;
    assert_int_equal(attention_plan_new(&c, &plan), PAGODA_EUNSUPPORTED);
    assert_null(plan);
    c = good;
    c.num_heads = 6; /* not a multiple of 4... */
    c.num_kv_heads = 4;
    assert_int_equal(attention_plan_new(&c, &plan), PAGODA_EINVAL);
    c = good;
    c.impl = (enum attention_impl)7;
    assert_int_equal(attention_plan_new(&c, &plan), PAGODA_EINVAL);
    c = good;
    c.block_size = 4;
    assert_int_equal(attention_plan_new(&c, &plan), PAGODA_ERANGE);
    c = good;
    c.head_dim = ATTENTION_HEAD_DIM_MAX + 1;
    assert_int_equal(attention_plan_new(&c, &plan), PAGODA_ERANGE);
    c = good;
    c.max_blocks_per_seq = INT32_MAX / 4; /* contexts past int32 */
    assert_int_equal(attention_plan_new(&c, &plan), PAGODA_ERANGE);
    c = good;
    c.scale = NAN;
    assert_int_equal(attention_plan_new(&c, &plan), PAGODA_EINVAL);
    attention_plan_free(NULL);
    world_fini(&w);
}

static void test_run_refuses_mismatched_view(void **state)
{
    int32_t total = 20;
    struct world w;
    world_init(&w, gqa_shape(8), &total, 1, 1000);
    world_write(&w, &total);
    int32_t query_len = 1;
    struct step st;
    step_build(&st, &w, &total, &query_len);
    struct attention_config config = world_config(&w, ATTN_CPU_PAGED, 4);
    struct attention_plan *plan;
    assert_int_equal(attention_plan_new(&config, &plan), 0);
    assert_int_equal(attention_plan(plan, &st.batch), 0);
    struct kv_layer_view v = w.view;
    v.head_dim = 32;
    assert_int_equal(attention_run(plan, &v, st.q, st.out), PAGODA_EMISMATCH);
    v = w.view;
    v.num_blocks = w.geo.num_blocks + 1;
    assert_int_equal(attention_run(plan, &v, st.q, st.out), PAGODA_EMISMATCH);
    v = w.view;
    v.dtype = DTYPE_BF16;
    assert_int_equal(attention_run(plan, &v, st.q, st.out), PAGODA_EMISMATCH);
    assert_int_equal(attention_run(plan, &w.view, NULL, st.out), PAGODA_EINVAL);
    assert_int_equal(attention_run(plan, &w.view, st.q, st.out), 0);
    attention_plan_free(plan);
    step_free(&st);
    world_fini(&w);
}

/* Decode queries against the first blocks of their context and against the rest, merged, equal
 * attention over the whole context (the split-KV and shared-prefix use). */
static void test_merge_of_two_halves_equals_whole(void **state)
{
    const int32_t bs = 16;
    int32_t totals[2] = {87, 3000};
    const int32_t split_blocks[2] = {2, 100};
    struct world w;
    world_init(&w, gqa_shape(bs), totals, 2, 1100);
    world_write(&w, totals);
    int32_t query_len[2] = {1, 1};
    struct step whole;
    step_build(&whole, &w, totals, query_len);

    int32_t query_start[3] = {0, 1, 2};
    int32_t len_a[2], len_b[2];
    int32_t *tables_a = malloc(2 * (size_t)w.table_width * sizeof(int32_t));
    int32_t *tables_b = malloc(2 * (size_t)w.table_width * sizeof(int32_t));
    size_t n = whole.out_n, rows = whole.lse_n;
    float *out_a = malloc(n * sizeof(float)), *out_b = malloc(n * sizeof(float));
    float *lse_a = malloc(rows * sizeof(float)), *lse_b = malloc(rows * sizeof(float));
    float *merged = malloc(n * sizeof(float)), *merged_lse = malloc(rows * sizeof(float));
    assert_true(tables_a && tables_b && out_a && out_b && lse_a && lse_b && merged && merged_lse);
    for (int32_t s = 0; s < 2; s++) {
        int32_t split = split_blocks[s] * bs;
        len_a[s] = split;
        len_b[s] = totals[s] - split;
        for (int32_t i = 0; i < w.table_width; i++) {
            int32_t nb = blocks_for(totals[s], bs);
            tables_a[s * w.table_width + i] = i < split_blocks[s] ? w.seqs[s].table[i] : -1;
            tables_b[s * w.table_width + i] =
                i + split_blocks[s] < nb ? w.seqs[s].table[i + split_blocks[s]] : -1;
        }
    }
    struct attention_batch batch_a = {.num_seqs = 2,
                                      .num_tokens = 2,
                                      .query_start = query_start,
                                      .context_len = len_a,
                                      .block_tables = tables_a,
                                      .max_blocks_per_seq = w.table_width};
    struct attention_batch batch_b = batch_a;
    batch_b.context_len = len_b;
    batch_b.block_tables = tables_b;

    const enum attention_impl impls[] = {ATTN_CPU_GATHER, ATTN_CPU_PAGED};
    for (size_t k = 0; k < 2; k++) {
        struct attention_config config = world_config(&w, impls[k], 2);
        struct attention_plan *plan;
        assert_int_equal(attention_plan_new(&config, &plan), 0);
        poison(out_a, n);
        poison(lse_a, rows);
        poison(out_b, n);
        poison(lse_b, rows);
        assert_int_equal(attention_plan(plan, &batch_a), 0);
        assert_int_equal(attention_run_partial(plan, &w.view, whole.q, out_a, lse_a), 0);
        assert_int_equal(attention_plan(plan, &batch_b), 0);
        assert_int_equal(attention_run_partial(plan, &w.view, whole.q, out_b, lse_b), 0);
        /* each half alone is far from the whole: the test would notice a lost half */
        assert_true(rel_error(out_a, whole.ref, n) > 100 * TOLERANCE);
        assert_true(rel_error(out_b, whole.ref, n) > 100 * TOLERANCE);

        poison(merged, n);
        poison(merged_lse, rows);
        assert_int_equal(attention_merge_states((int64_t)rows, w.sh.head_dim, out_a, lse_a, out_b,
                                                lse_b, merged, merged_lse),
                         0);
        assert_true(rel_error(merged, whole.ref, n) < TOLERANCE);
        assert_true(max_abs_error(merged_lse, whole.ref_lse, rows) < 1e-4);

        /* in place, into a */
        assert_int_equal(attention_merge_states((int64_t)rows, w.sh.head_dim, out_a, lse_a, out_b,
                                                lse_b, out_a, lse_a),
                         0);
        assert_memory_equal(out_a, merged, n * sizeof(float));
        assert_memory_equal(lse_a, merged_lse, rows * sizeof(float));
        attention_plan_free(plan);
    }

    /* An empty state (lse -inf, any output) is the identity; two empty states give zeros. */
    for (size_t r = 0; r < rows; r++)
        lse_b[r] = -INFINITY;
    poison(out_b, n);
    assert_int_equal(attention_merge_states((int64_t)rows, w.sh.head_dim, merged, merged_lse, out_b,
                                            lse_b, out_a, lse_a),
                     0);
    assert_memory_equal(out_a, merged, n * sizeof(float));
    assert_memory_equal(lse_a, merged_lse, rows * sizeof(float));
    assert_int_equal(
        attention_merge_states(1, w.sh.head_dim, out_b, lse_b, out_b, lse_b, out_a, lse_a), 0);
    assert_true(out_a[0] == 0.0f && out_a[w.sh.head_dim - 1] == 0.0f);
    assert_true(isinf(lse_a[0]) && lse_a[0] < 0);
    assert_int_equal(
        attention_merge_states(-1, w.sh.head_dim, out_a, lse_a, out_b, lse_b, out_a, lse_a),
        PAGODA_EINVAL);

    free(tables_a);
    free(tables_b);
    free(out_a);
    free(out_b);
    free(lse_a);
    free(lse_b);
    free(merged);
    free(merged_lse);
    step_free(&whole);
    world_fini(&w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_kv_places_vectors_and_skips_padding),
        cmocka_unit_test(test_write_kv_refuses_bad_slots),
        cmocka_unit_test(test_decode_at_edge_lengths),
        cmocka_unit_test(test_prefill_causal_at_edge_lengths),
        cmocka_unit_test(test_mixed_batch_prefill_and_decode),
        cmocka_unit_test(test_prefill_chunk_continues_sequence),
        cmocka_unit_test(test_paged_scratch_does_not_grow_with_context),
        cmocka_unit_test(test_plan_refuses_bad_metadata),
        cmocka_unit_test(test_plan_new_refuses_bad_config),
        cmocka_unit_test(test_run_refuses_mismatched_view),
        cmocka_unit_test(test_merge_of_two_halves_equals_whole),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
