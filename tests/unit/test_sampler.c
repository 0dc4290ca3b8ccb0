/* Tests of kernels/philox.h and kernels/cpu/sampler.c: Philox known answers, reproducible
 * draws, greedy and top-k 1, the distributions of temperature, top-k, top-p and min-p draws
 * (chi-square), independence from the batch, penalties, logprobs, parameter and input errors,
 * and golden draws that a CUDA sampler must reproduce. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "kernels/cpu/sampler.h"
#include "kernels/philox.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N_DRAWS 20000

/* A deterministic generator for test data, independent of Philox. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint64_t rng_next(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* Uniform in [lo, hi). */
static float rng_float(float lo, float hi)
{
    return lo + (hi - lo) * (float)((rng_next() >> 40) * (1.0 / 16777216.0));
}

static void random_logits(float *l, int32_t vocab, float spread, int quantise)
{
    for (int32_t i = 0; i < vocab; i++) {
        l[i] = rng_float(-spread, spread);
        if (quantise)
            l[i] = roundf(l[i]); /* many exact ties */
    }
}

/* log_softmax(l)[t] in double, written without the sampler's code. */
static double ref_log_softmax(const float *l, int32_t vocab, int32_t t)
{
    double m = -INFINITY;
    for (int32_t i = 0; i < vocab; i++)
        m = fmax(m, (double)l[i]);
    double s = 0.0;
    for (int32_t i = 0; i < vocab; i++)
        s += exp((double)l[i] - m);
    return (double)l[t] - m - log(s);
}

static int sample(const struct sampling_params *p, const float *logits, int32_t vocab,
                  uint64_t output_index, struct sampler_workspace *ws, int32_t *token,
                  float *logprob)
{
    return sampler_sample(p, logits, vocab, NULL, 0, NULL, 0, output_index, ws, token, logprob);
}

static void test_philox_known_answers(void **state)
{
    static const struct {
        uint32_t ctr[4], key[2], out[4];
    } kat[] = {
        {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
        {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
         {0xffffffff, 0xffffffff},
         {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
        {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
         {0xa4093822, 0x299f31d0},
         {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
    };
    for (size_t k = 0; k < sizeof(kat) / sizeof(kat[0]); k++) {
        struct philox4x32 c = {{kat[k].ctr[0], kat[k].ctr[1], kat[k].ctr[2], kat[k].ctr[3]}};
        struct philox4x32 r = philox4x32_10(c, kat[k].key[0], kat[k].key[1]);
        for (int w = 0; w < 4; w++)
            assert_int_equal(r.v[w], kat[k].out[w]);
    }
    /* The sampling layout: key (seed lo, seed hi), counter (index lo, index hi, draw, 0). */
    struct philox4x32 zero = philox_draw(0, 0, 0);
    assert_int_equal(zero.v[0], 0x6627e8d5);
    assert_int_equal(zero.v[3], 0x9b00dbd8);
    struct philox4x32 c = {{0x89abcdef, 0x01234567, 7, 0}};
    struct philox4x32 a = philox4x32_10(c, 0xdeadbeef, 0xfeedface);
    struct philox4x32 b = philox_draw(0xfeedfacedeadbeefull, 0x0123456789abcdefull, 7);
    assert_memory_equal(a.v, b.v, sizeof(a.v));
    assert_int_equal(philox_u64(b), (uint64_t)b.v[0] | (uint64_t)b.v[1] << 32);
}

static void test_philox_uniform_and_scale(void **state)
{
    assert_true(philox_uniform_f32(0) == 0.0f);
    assert_true(philox_uniform_f32(0xffffffffu) == 1.0f - ldexpf(1.0f, -24));
    assert_true(philox_uniform_f32(0x80000000u) == 0.5f);
    assert_true(philox_uniform_f64(0) == 0.0);
    assert_true(philox_uniform_f64(UINT64_MAX) == 1.0 - ldexp(1.0, -53));
    assert_true(philox_uniform_f64(UINT64_MAX) < 1.0);
    assert_int_equal(philox_scale_u64(0, 1000), 0);
    assert_int_equal(philox_scale_u64(UINT64_MAX, 1000), 999);
    assert_int_equal(philox_scale_u64(1ull << 63, 10), 5);
    assert_int_equal(philox_scale_u64(UINT64_MAX, 1ull << 62), (1ull << 62) - 1);
    for (int i = 0; i < 10000; i++) {
        uint64_t r = rng_next(), n = rng_next() >> (rng_next() % 64);
        unsigned __int128 full = (unsigned __int128)r * n;
        assert_int_equal(philox_scale_u64(r, n), (uint64_t)(full >> 64));
    }
}

static void test_seeded_runs_repeat_and_seeds_differ(void **state)
{
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, 1000), 0);
    float logits[1000];
    random_logits(logits, 1000, 1.0f, 0);
    struct sampling_params p = sampling_params_default();
    p.seed = 42;
    int32_t first[200], again[200], other[200];
    for (uint64_t i = 0; i < 200; i++)
        assert_int_equal(sample(&p, logits, 1000, i, &ws, &first[i], NULL), 0);
    /* Replayed out of order, each output index draws the same token. */
    for (uint64_t i = 200; i-- > 0;)
        assert_int_equal(sample(&p, logits, 1000, i, &ws, &again[i], NULL), 0);
    assert_memory_equal(first, again, sizeof(first));
    p.seed = 43;
    int same = 0;
    for (uint64_t i = 0; i < 200; i++) {
        assert_int_equal(sample(&p, logits, 1000, i, &ws, &other[i], NULL), 0);
        same += other[i] == first[i];
    }
    /* Near-uniform over 1000 tokens: a shared seed would agree 200 times, independent streams
     * a handful of times. */
    assert_true(same < 20);
    /* Output indices that differ only in their high 32 bits draw from different blocks. */
    p.seed = 42;
    int32_t hi;
    same = 0;
    for (uint64_t i = 0; i < 200; i++) {
        assert_int_equal(sample(&p, logits, 1000, i | (1ull << 32), &ws, &hi, NULL), 0);
        same += hi == first[i];
    }
    assert_true(same < 20);
    sampler_workspace_fini(&ws);
}

static void test_top_k_one_is_greedy(void **state)
{
    enum { V = 50 };
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, V), 0);
    float logits[V];
    for (int trial = 0; trial < 2000; trial++) {
        random_logits(logits, V, 4.0f, trial % 2);
        struct sampling_params g = sampling_params_default();
        g.temperature = 0.0f;
        int32_t greedy, tok;
        float greedy_lp, lp;
        assert_int_equal(sample(&g, logits, V, 0, &ws, &greedy, &greedy_lp), 0);
        struct sampling_params p = sampling_params_default();
        p.top_k = 1;
        p.temperature = rng_float(0.01f, 5.0f);
        p.top_p = rng_float(0.05f, 1.0f);
        p.min_p = rng_float(0.0f, 1.0f);
        p.seed = rng_next();
        assert_int_equal(sample(&p, logits, V, (uint64_t)trial, &ws, &tok, &lp), 0);
        assert_int_equal(tok, greedy);
        assert_true(lp == greedy_lp);
        /* A tiny top_p keeps only the first token in canonical order: the argmax again. */
        p.top_k = 0;
        p.top_p = 1e-6f;
        assert_int_equal(sample(&p, logits, V, (uint64_t)trial, &ws, &tok, NULL), 0);
        assert_int_equal(tok, greedy);
        /* min_p 1 keeps every token as likely as the argmax, ties included. */
        p.top_p = 1.0f;
        p.min_p = 1.0f;
        assert_int_equal(sample(&p, logits, V, (uint64_t)trial, &ws, &tok, NULL), 0);
        assert_true(ws.weights[tok] == 1ull << 40);
        if (trial % 2 == 0) /* no exact ties: the argmax alone */
            assert_int_equal(tok, greedy);
    }
    sampler_workspace_fini(&ws);
}

static void test_greedy_ties_take_lowest_id(void **state)
{
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, 8), 0);
    float logits[8] = {-INFINITY, 0.5f, 3.0f, -2.0f, 3.0f, 1.0f, 3.0f, -INFINITY};
    struct sampling_params p = sampling_params_default();
    p.temperature = 0.0f;
    int32_t tok;
    float lp;
    assert_int_equal(sample(&p, logits, 8, 0, &ws, &tok, &lp), 0);
    assert_int_equal(tok, 2);
    assert_float_equal(lp, ref_log_softmax(logits, 8, 2), 1e-6);
    /* top-k 1 breaks the tie the same way, and top-k 2 never leaves the tied pair (2, 4). */
    p.temperature = 1.0f;
    p.top_k = 1;
    assert_int_equal(sample(&p, logits, 8, 5, &ws, &tok, NULL), 0);
    assert_int_equal(tok, 2);
    p.top_k = 2;
    int seen[8] = {0};
    for (uint64_t i = 0; i < 400; i++) {
        assert_int_equal(sample(&p, logits, 8, i, &ws, &tok, NULL), 0);
        seen[tok]++;
    }
    assert_true(seen[2] > 150 && seen[4] > 150 && seen[2] + seen[4] == 400);
    sampler_workspace_fini(&ws);
}

/* Pearson's chi-square statistic of counts against probabilities expected[], which must be 0
 * exactly where counts are; compared with the critical value at p = 0.001. */
static void assert_distribution(const int *counts, const double *expected, int vocab, int n)
{
    static const double critical_0001[] = {0,      10.828, 13.816, 16.266, 18.467,
                                           20.515, 22.458, 24.322, 26.124};
    double chi2 = 0.0;
    int categories = 0;
    for (int i = 0; i < vocab; i++) {
        if (expected[i] == 0.0) {
            assert_int_equal(counts[i], 0);
            continue;
        }
        double e = expected[i] * n;
        assert_true(e >= 5.0);
        chi2 += (counts[i] - e) * (counts[i] - e) / e;
        categories++;
    }
    assert_true(categories >= 2 && categories <= 9);
    if (chi2 >= critical_0001[categories - 1])
        fail_msg("chi-square %.3f >= %.3f (df %d)", chi2, critical_0001[categories - 1],
                 categories - 1);
}

/* Fixed logits for the distribution tests; at temperature 0.8 the probabilities sorted are
 * 1: .437, 4: .234, 7: .161, 0: .067, 6: .059, 3: .028, 2: .010, 5: .004 (cumulative .437,
 * .671, .831, .898, .958, ...; relative to the top .535, .368, .153, .135, .064, ...). */
static const float dist_logits[8] = {1.0f, 2.5f, -0.5f, 0.3f, 2.0f, -1.2f, 0.9f, 1.7f};

/* The expected distribution, computed in double from the definitions: softmax(l / T), then
 * top-k, top-p over what top-k kept, min-p against the top, renormalised. */
static void expected_distribution(const struct sampling_params *p, double *out)
{
    double prob[8], sum = 0.0;
    int order[8];
    for (int i = 0; i < 8; i++) {
        prob[i] = exp((double)dist_logits[i] / p->temperature);
        sum += prob[i];
        order[i] = i;
    }
    for (int i = 0; i < 8; i++)
        prob[i] /= sum;
    for (int i = 1; i < 8; i++) /* insertion sort, descending */
        for (int j = i; j > 0 && prob[order[j]] > prob[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1];
            order[j - 1] = t;
        }
    int keep = p->top_k > 0 && p->top_k < 8 ? p->top_k : 8;
    double kept = 0.0;
    for (int j = 0; j < keep; j++)
        kept += prob[order[j]];
    double acc = 0.0;
    for (int j = 0; j < keep; j++) {
        acc += prob[order[j]];
        if (acc >= p->top_p * kept) {
            keep = j + 1;
            break;
        }
    }
    memset(out, 0, 8 * sizeof(double));
    sum = 0.0;
    for (int j = 0; j < keep; j++) {
        int t = order[j];
        if (prob[t] >= p->min_p * prob[order[0]]) {
            out[t] = prob[t];
            sum += prob[t];
        }
    }
    for (int i = 0; i < 8; i++)
        out[i] /= sum;
}

static void check_distribution(const struct sampling_params *p, int expected_kept)
{
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, 8), 0);
    int counts[8] = {0};
    for (uint64_t i = 0; i < N_DRAWS; i++) {
        int32_t tok;
        assert_int_equal(sample(p, dist_logits, 8, i, &ws, &tok, NULL), 0);
        counts[tok]++;
    }
    double expected[8];
    expected_distribution(p, expected);
    int kept = 0;
    for (int i = 0; i < 8; i++)
        kept += expected[i] > 0.0;
    assert_int_equal(kept, expected_kept);
    assert_distribution(counts, expected, 8, N_DRAWS);
    sampler_workspace_fini(&ws);
}

static void test_temperature_distribution(void **state)
{
    struct sampling_params p = sampling_params_default();
    p.temperature = 0.8f;
    p.seed = 1234;
    check_distribution(&p, 8);
    p.temperature = 2.5f;
    p.seed = 99;
    check_distribution(&p, 8);
}

static void test_top_k_distribution(void **state)
{
    struct sampling_params p = sampling_params_default();
    p.temperature = 0.8f;
    p.top_k = 3;
    p.seed = 7;
    check_distribution(&p, 3);
}

static void test_top_p_distribution(void **state)
{
    struct sampling_params p = sampling_params_default();
    p.temperature = 0.8f;
    p.top_p = 0.85f; /* .831 < .85 <= .898: keeps 1, 4, 7, 0 */
    p.seed = 2024;
    check_distribution(&p, 4);
}

static void test_min_p_distribution(void **state)
{
    struct sampling_params p = sampling_params_default();
    p.temperature = 0.8f;
    p.min_p = 0.1f; /* .135 >= .1 > .064: keeps 1, 4, 7, 0, 6 */
    p.seed = 5;
    check_distribution(&p, 5);
}

static void test_combined_truncation_distribution(void **state)
{
    /* top-k 5 keeps mass .958; top-p .9 of it stops at token 0 (.898 / .958 = .938); min-p .16
     * then drops token 0 (.153). */
    struct sampling_params p = sampling_params_default();
    p.temperature = 0.8f;
    p.top_k = 5;
    p.top_p = 0.9f;
    p.min_p = 0.16f;
    p.seed = 77;
    check_distribution(&p, 3);
}

/* One row of a batch: its own logits, parameters and history. */
struct row {
    float logits[64];
    struct sampling_params p;
    int32_t prompt[10];
    int32_t output[6];
    uint64_t output_index;
};

static void random_row(struct row *r)
{
    random_logits(r->logits, 64, 3.0f, 0);
    r->p = sampling_params_default();
    r->p.temperature = rng_float(0.3f, 1.5f);
    r->p.top_k = (int32_t)(rng_next() % 20);
    r->p.top_p = rng_float(0.5f, 1.0f);
    r->p.min_p = rng_float(0.0f, 0.2f);
    r->p.repetition_penalty = rng_float(0.8f, 1.5f);
    r->p.presence_penalty = rng_float(-1.0f, 1.0f);
    r->p.frequency_penalty = rng_float(-1.0f, 1.0f);
    r->p.seed = rng_next();
    for (int i = 0; i < 10; i++)
        r->prompt[i] = (int32_t)(rng_next() % 64);
    for (int i = 0; i < 6; i++)
        r->output[i] = (int32_t)(rng_next() % 64);
    r->output_index = 6;
}

static void sample_row(const struct row *r, struct sampler_workspace *ws, int32_t *tok, float *lp)
{
    assert_int_equal(sampler_sample(&r->p, r->logits, 64, r->prompt, 10, r->output, 6,
                                    r->output_index, ws, tok, lp),
                     0);
}

static void test_token_does_not_depend_on_batch_position(void **state)
{
    enum { B = 6 };
    struct row target, others[B];
    random_row(&target);
    for (int i = 0; i < B; i++)
        random_row(&others[i]);
    struct sampler_workspace alone, shared;
    assert_int_equal(sampler_workspace_init(&alone, 64), 0);
    assert_int_equal(sampler_workspace_init(&shared, 128), 0); /* larger than the vocabulary */
    for (uint64_t step = 0; step < 50; step++) {
        target.output_index = 6 + step;
        int32_t want;
        float want_lp;
        sample_row(&target, &alone, &want, &want_lp);
        /* The same row at every position of a batch of other rows, sampled in order with one
         * workspace, as a worker does. */
        for (int pos = 0; pos < B; pos++) {
            for (int i = 0; i < B; i++) {
                int32_t tok;
                float lp;
                if (i == pos) {
                    sample_row(&target, &shared, &tok, &lp);
                    assert_int_equal(tok, want);
                    assert_true(lp == want_lp);
                } else {
                    sample_row(&others[(i + pos + step) % B], &shared, &tok, &lp);
                }
            }
        }
    }
    sampler_workspace_fini(&alone);
    sampler_workspace_fini(&shared);
}

static void test_penalties_worked_example(void **state)
{
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, 5), 0);
    const float logits[5] = {2.0f, -1.0f, 0.5f, 3.0f, -4.0f};
    const int32_t prompt[] = {0, 4, 0};
    const int32_t output[] = {3, 1, 3};
    struct sampling_params p = sampling_params_default();
    p.temperature = 0.0f;
    p.repetition_penalty = 2.0f;
    p.frequency_penalty = 0.5f;
    p.presence_penalty = 0.25f;
    int32_t tok;
    float lp;
    assert_int_equal(sampler_sample(&p, logits, 5, prompt, 3, output, 3, 3, &ws, &tok, &lp), 0);
    /* 0: prompt only, 2 / 2 = 1. 1: output once, -1 * 2 - 0.5 * 1 - 0.25 = -2.75. 2: absent.
     * 3: output twice, 3 / 2 - 0.5 * 2 - 0.25 = 0.25. 4: prompt only, -4 * 2 = -8. */
    const float want[5] = {1.0f, -2.75f, 0.5f, 0.25f, -8.0f};
    for (int i = 0; i < 5; i++)
        assert_true(ws.logits[i] == want[i]);
    assert_int_equal(tok, 0); /* without penalties token 3 would win */
    assert_float_equal(lp, ref_log_softmax(want, 5, 0), 1e-6);
    /* Negative presence and frequency penalties raise a token instead. */
    p.repetition_penalty = 1.0f;
    p.frequency_penalty = -1.0f;
    p.presence_penalty = -2.0f;
    const int32_t once[] = {2};
    assert_int_equal(sampler_sample(&p, logits, 5, NULL, 0, once, 1, 1, &ws, &tok, NULL), 0);
    assert_true(ws.logits[2] == 3.5f);
    assert_int_equal(tok, 2);
    sampler_workspace_fini(&ws);
}

static void test_repetition_penalty_lowers_probability(void **state)
{
    /* Uniform logits; token 3 was already generated twice. Under repetition penalty 1.5 its
     * logit 1 becomes 2/3, so its probability drops from 1/4 to e^(2/3) / (3e + e^(2/3)). */
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, 4), 0);
    const float logits[4] = {1.0f, 1.0f, 1.0f, 1.0f};
    const int32_t output[] = {3, 3};
    struct sampling_params p = sampling_params_default();
    p.repetition_penalty = 1.5f;
    p.seed = 11;
    int counts[4] = {0};
    for (uint64_t i = 0; i < N_DRAWS; i++) {
        int32_t tok;
        assert_int_equal(sampler_sample(&p, logits, 4, NULL, 0, output, 2, i, &ws, &tok, NULL), 0);
        counts[tok]++;
    }
    double e3 = exp(2.0 / 3.0), e = exp(1.0);
    double expected[4] = {e / (3 * e + e3), e / (3 * e + e3), e / (3 * e + e3), e3 / (3 * e + e3)};
    assert_distribution(counts, expected, 4, N_DRAWS);
    assert_true(counts[3] < N_DRAWS / 5);
    sampler_workspace_fini(&ws);
}

static void test_logprob_is_log_softmax_of_penalised_logits(void **state)
{
    enum { V = 300 };
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, V), 0);
    float logits[V];
    for (int trial = 0; trial < 200; trial++) {
        random_logits(logits, V, 10.0f, 0);
        logits[trial % V] = -INFINITY;
        struct sampling_params p = sampling_params_default();
        p.temperature = trial % 3 == 0 ? 0.0f : rng_float(0.1f, 3.0f);
        p.top_k = (int32_t)(rng_next() % 50);
        p.seed = rng_next();
        int32_t tok;
        float lp;
        assert_int_equal(sample(&p, logits, V, (uint64_t)trial, &ws, &tok, &lp), 0);
        assert_true(isfinite(logits[tok]));
        /* Raw log-softmax: neither temperature nor truncation changes it. */
        assert_float_equal(lp, ref_log_softmax(logits, V, tok), 1e-5);
    }
    sampler_workspace_fini(&ws);
}

static void test_invalid_params_are_named(void **state)
{
    static const struct {
        const char *field;
        float value;
        int rc;
    } cases[] = {
        {"temperature", -0.5f, PAGODA_ERANGE},
        {"temperature", INFINITY, PAGODA_ERANGE},
        {"temperature", NAN, PAGODA_EINVAL},
        {"temperature", 1e-45f, PAGODA_ERANGE},
        {"temperature", 5e-7f, PAGODA_ERANGE},
        {"temperature", 100.5f, PAGODA_ERANGE},
        {"top_p", 0.0f, PAGODA_ERANGE},
        {"top_p", 1.5f, PAGODA_ERANGE},
        {"top_p", NAN, PAGODA_EINVAL},
        {"min_p", -0.1f, PAGODA_ERANGE},
        {"min_p", 1.01f, PAGODA_ERANGE},
        {"min_p", NAN, PAGODA_EINVAL},
        {"repetition_penalty", 0.0f, PAGODA_ERANGE},
        {"repetition_penalty", -1.0f, PAGODA_ERANGE},
        {"repetition_penalty", INFINITY, PAGODA_ERANGE},
        {"repetition_penalty", NAN, PAGODA_EINVAL},
        /* Finite and above 0, but a logit divided by it overflows (the probe). */
        {"repetition_penalty", 1e-45f, PAGODA_ERANGE},
        {"repetition_penalty", 0.0099f, PAGODA_ERANGE},
        {"repetition_penalty", 100.5f, PAGODA_ERANGE},
        {"repetition_penalty", 1e30f, PAGODA_ERANGE},
        {"presence_penalty", 2.5f, PAGODA_ERANGE},
        {"presence_penalty", -2.01f, PAGODA_ERANGE},
        {"presence_penalty", NAN, PAGODA_EINVAL},
        {"frequency_penalty", -3.0f, PAGODA_ERANGE},
        {"frequency_penalty", INFINITY, PAGODA_ERANGE},
        {"frequency_penalty", NAN, PAGODA_EINVAL},
    };
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, 4), 0);
    const float logits[4] = {0};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        struct sampling_params p = sampling_params_default();
        float *f = !strcmp(cases[k].field, "temperature")          ? &p.temperature
                   : !strcmp(cases[k].field, "top_p")              ? &p.top_p
                   : !strcmp(cases[k].field, "min_p")              ? &p.min_p
                   : !strcmp(cases[k].field, "repetition_penalty") ? &p.repetition_penalty
                   : !strcmp(cases[k].field, "presence_penalty")   ? &p.presence_penalty
                                                                   : &p.frequency_penalty;
        *f = cases[k].value;
        pagoda_error_clear();
        assert_int_equal(sampling_params_validate(&p), cases[k].rc);
        assert_non_null(strstr(pagoda_error_detail(), cases[k].field));
        int32_t tok = -7;
        assert_int_equal(sample(&p, logits, 4, 0, &ws, &tok, NULL), cases[k].rc);
        assert_int_equal(tok, -7);
    }
    struct sampling_params p = sampling_params_default();
    p.top_k = -1;
    assert_int_equal(sampling_params_validate(&p), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "top_k"));
    /* Boundaries that are allowed. */
    p = sampling_params_default();
    p.temperature = 0.0f;
    p.top_p = 1.0f;
    p.min_p = 1.0f;
    p.presence_penalty = -2.0f;
    p.frequency_penalty = 2.0f;
    p.repetition_penalty = SAMPLING_REPETITION_PENALTY_MIN;
    p.top_k = 1 << 30;
    assert_int_equal(sampling_params_validate(&p), 0);
    p.repetition_penalty = SAMPLING_REPETITION_PENALTY_MAX;
    p.temperature = SAMPLING_TEMPERATURE_MIN;
    assert_int_equal(sampling_params_validate(&p), 0);
    p.temperature = SAMPLING_TEMPERATURE_MAX;
    assert_int_equal(sampling_params_validate(&p), 0);
    assert_int_equal(sampling_params_validate(NULL), PAGODA_EINVAL);
    sampler_workspace_fini(&ws);
}

/* The valid ranges cannot overflow: at every corner of them, a row of logits up to 3e36 in
 * magnitude (far beyond any sane model) with its whole vocabulary in the history samples. */
static void test_valid_ranges_cannot_overflow(void **state)
{
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, 4), 0);
    const float logits[4] = {3e36f, -3e36f, 1.0f, -1.0f};
    const int32_t hist[] = {0, 1, 2, 3, 0, 1};
    const float reps[] = {SAMPLING_REPETITION_PENALTY_MIN, SAMPLING_REPETITION_PENALTY_MAX};
    const float temps[] = {0.0f, SAMPLING_TEMPERATURE_MIN, SAMPLING_TEMPERATURE_MAX};
    const float pens[] = {-SAMPLING_PENALTY_LIMIT, SAMPLING_PENALTY_LIMIT};
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 3; t++)
            for (int k = 0; k < 2; k++) {
                struct sampling_params p = sampling_params_default();
                p.repetition_penalty = reps[r];
                p.temperature = temps[t];
                p.presence_penalty = p.frequency_penalty = pens[k];
                p.top_p = 0.5f;
                p.min_p = 0.01f;
                assert_int_equal(sampling_params_validate(&p), 0);
                int32_t tok = -1;
                float lp = 0.0f;
                assert_int_equal(sampler_sample(&p, logits, 4, hist, 6, hist, 6, 6, &ws, &tok, &lp),
                                 0);
                assert_true(tok >= 0 && tok < 4);
            }
    sampler_workspace_fini(&ws);
}

static void test_bad_inputs_are_refused(void **state)
{
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, 4), 0);
    struct sampling_params p = sampling_params_default();
    float logits[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    const float copy[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    int32_t tok;
    const int32_t bad[] = {1, 4};
    const int32_t neg[] = {-1};
    assert_int_equal(sampler_sample(&p, logits, 4, bad, 2, NULL, 0, 0, &ws, &tok, NULL),
                     PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "prompt token 1 is 4"));
    assert_int_equal(sampler_sample(&p, logits, 4, NULL, 0, neg, 1, 0, &ws, &tok, NULL),
                     PAGODA_EINVAL);
    assert_int_equal(sampler_sample(&p, logits, 4, NULL, 3, NULL, 0, 0, &ws, &tok, NULL),
                     PAGODA_EINVAL);
    assert_int_equal(sample(&p, logits, 5, 0, &ws, &tok, NULL), PAGODA_ERANGE);
    assert_int_equal(sample(&p, logits, 0, 0, &ws, &tok, NULL), PAGODA_ERANGE);
    assert_int_equal(
        sampler_sample(&p, logits, 4, bad, SAMPLER_HISTORY_MAX, bad, 1, 0, &ws, &tok, NULL),
        PAGODA_ERANGE);
    logits[1] = NAN;
    assert_int_equal(sample(&p, logits, 4, 0, &ws, &tok, NULL), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "logit 1"));
    logits[1] = INFINITY;
    assert_int_equal(sample(&p, logits, 4, 0, &ws, &tok, NULL), PAGODA_EINVAL);
    float masked[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
    assert_int_equal(sample(&p, masked, 4, 0, &ws, &tok, NULL), PAGODA_EINVAL);
    /* Masked tokens are never drawn; a lone unmasked one always is. */
    masked[2] = -50.0f;
    for (uint64_t i = 0; i < 100; i++) {
        assert_int_equal(sample(&p, masked, 4, i, &ws, &tok, NULL), 0);
        assert_int_equal(tok, 2);
    }
    /* A penalty that overflows a finite logit is an error, not an infinity. */
    float huge[4] = {-3e38f, 0.0f, 0.0f, 0.0f};
    const int32_t first[] = {0};
    p.repetition_penalty = SAMPLING_REPETITION_PENALTY_MAX;
    assert_int_equal(sampler_sample(&p, huge, 4, first, 1, NULL, 0, 0, &ws, &tok, NULL),
                     PAGODA_ERANGE);
    /* ...and leaves the workspace clean: the next call without history sees no penalty. */
    assert_int_equal(sample(&p, copy, 4, 0, &ws, &tok, NULL), 0);
    assert_memory_equal(ws.logits, copy, sizeof(copy));
    /* The caller's logits are never written. */
    float mine[4] = {0.0f, 1.0f, 2.0f, 3.0f};
    const int32_t hist[] = {3, 2, 3};
    p.frequency_penalty = 1.0f;
    assert_int_equal(sampler_sample(&p, mine, 4, hist, 3, hist, 3, 3, &ws, &tok, NULL), 0);
    assert_memory_equal(mine, copy, sizeof(copy));
    /* Workspace lifecycle errors. */
    struct sampler_workspace w2;
    assert_int_equal(sampler_workspace_init(&w2, 0), PAGODA_ERANGE);
    sampler_workspace_fini(&w2);
    assert_int_equal(sampler_workspace_init(&w2, SAMPLER_VOCAB_MAX + 1), PAGODA_ERANGE);
    assert_int_equal(sampler_workspace_init(NULL, 4), PAGODA_EINVAL);
    sampler_workspace_fini(NULL);
    sampler_workspace_fini(&ws);
    sampler_workspace_fini(&ws);
}

/* Golden draws: the exact weights and tokens of the algorithm in docs/sampling.md (whose worked
 * example is the first case). A CUDA sampler must reproduce them; a change here is a change of
 * the algorithm, and so is a compiler that contracts the weight polynomial into FMAs. */
static void test_golden_draws(void **state)
{
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, 8), 0);
    int32_t tok;
    float lp;

    struct sampling_params p = sampling_params_default();
    p.temperature = 0.8f;
    p.seed = 0x0123456789abcdefull;
    static const uint64_t weights[8] = {168615575552ull, 1099511627776ull, 25858035712ull,
                                        70289424384ull,  588526190592ull,  10779232256ull,
                                        148802715648ull, 404487766016ull};
    static const int32_t plain[16] = {4, 1, 2, 1, 6, 6, 7, 4, 3, 7, 4, 1, 1, 1, 1, 4};
    for (uint64_t i = 0; i < 16; i++) {
        assert_int_equal(sample(&p, dist_logits, 8, i, &ws, &tok, &lp), 0);
        assert_int_equal(tok, plain[i]);
        assert_memory_equal(ws.weights, weights, sizeof(weights));
    }
    assert_int_equal(philox_scale_u64(philox_u64(philox_draw(p.seed, 0, 0)), 2516870567936ull),
                     1942213617220ull);

    p.top_k = 5;
    p.top_p = 0.9f;
    p.min_p = 0.16f;
    static const int32_t truncated[16] = {4, 1, 1, 1, 7, 7, 7, 4, 4, 7, 4, 1, 1, 1, 1, 4};
    for (uint64_t i = 0; i < 16; i++) {
        assert_int_equal(sample(&p, dist_logits, 8, i, &ws, &tok, NULL), 0);
        assert_int_equal(tok, truncated[i]);
    }

    struct sampling_params q = sampling_params_default();
    q.temperature = 1.3f;
    q.top_p = 0.95f;
    q.repetition_penalty = 1.3f;
    q.presence_penalty = 0.5f;
    q.frequency_penalty = 0.25f;
    q.seed = 987654321;
    const int32_t prompt[] = {1, 4, 4}, output[] = {7, 1, 7, 7};
    static const int32_t penalised[16] = {4, 0, 0, 3, 0, 3, 1, 2, 7, 3, 0, 6, 0, 6, 0, 3};
    static const float penalised_logits[8] = {0x1p+0f,        0x1.2c4ec6p+0f, -0x1p-1f,
                                              0x1.333334p-2f, 0x1.89d89ep+0f, -0x1.333334p+0f,
                                              0x1.ccccccp-1f, 0x1.d89dcp-5f};
    for (uint64_t i = 0; i < 16; i++) {
        assert_int_equal(
            sampler_sample(&q, dist_logits, 8, prompt, 3, output, 4, i, &ws, &tok, NULL), 0);
        assert_int_equal(tok, penalised[i]);
        assert_memory_equal(ws.logits, penalised_logits, sizeof(penalised_logits));
    }
    sampler_workspace_fini(&ws);
}

/* The weights of a 4096-token row, hashed (FNV-1a): they cover exp~'s whole range, so that any
 * change in its rounding (an FMA, another polynomial) shows, which 8 weights may not. */
static void test_golden_weights_of_a_large_row(void **state)
{
    enum { V = 4096 };
    struct sampler_workspace ws;
    assert_int_equal(sampler_workspace_init(&ws, V), 0);
    static float logits[V];
    for (uint32_t i = 0; i < V; i++) /* exact arithmetic only */
        logits[i] = (float)((i * 2654435761u) % 20001u) / 1000.0f - 10.0f;
    struct sampling_params p = sampling_params_default();
    p.temperature = 0.7f;
    p.seed = 31337;
    int32_t tok;
    assert_int_equal(sample(&p, logits, V, 0, &ws, &tok, NULL), 0);
    uint64_t hash = 0xcbf29ce484222325ull, nonzero = 0;
    for (int i = 0; i < V; i++) {
        nonzero += ws.weights[i] > 0;
        for (int b = 0; b < 64; b += 8) {
            hash ^= (ws.weights[i] >> b) & 0xff;
            hash *= 0x100000001b3ull;
        }
    }
    assert_int_equal(hash, 0x979f8129f2047680ull);
    assert_int_equal(nonzero, 3968);
    assert_int_equal(tok, 647);
    sampler_workspace_fini(&ws);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_philox_known_answers),
        cmocka_unit_test(test_philox_uniform_and_scale),
        cmocka_unit_test(test_seeded_runs_repeat_and_seeds_differ),
        cmocka_unit_test(test_top_k_one_is_greedy),
        cmocka_unit_test(test_greedy_ties_take_lowest_id),
        cmocka_unit_test(test_temperature_distribution),
        cmocka_unit_test(test_top_k_distribution),
        cmocka_unit_test(test_top_p_distribution),
        cmocka_unit_test(test_min_p_distribution),
        cmocka_unit_test(test_combined_truncation_distribution),
        cmocka_unit_test(test_token_does_not_depend_on_batch_position),
        cmocka_unit_test(test_penalties_worked_example),
        cmocka_unit_test(test_repetition_penalty_lowers_probability),
        cmocka_unit_test(test_logprob_is_log_softmax_of_penalised_logits),
        cmocka_unit_test(test_invalid_params_are_named),
        cmocka_unit_test(test_valid_ranges_cannot_overflow),
        cmocka_unit_test(test_bad_inputs_are_refused),
        cmocka_unit_test(test_golden_draws),
        cmocka_unit_test(test_golden_weights_of_a_large_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
