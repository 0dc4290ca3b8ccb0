/* What the three files of test_cuda_sampler share (tests/gpu/test_cuda_sampler.c: the general
 * path, the asynchronous calls, errors and main; test_cuda_sampler_history.c: histories read on
 * the device, history gathers and keys; test_cuda_sampler_greedy.c: the greedy fast path):
 * limits of the test batches, fatal checks, the test data's generator (one sequence for the
 * whole run), logit banks, batches and parameter combinations (defined in test_cuda_sampler.c)
 * and the other files' entry points. */
#ifndef PAGODA_TESTS_GPU_SAMPLER_TEST_H
#define PAGODA_TESTS_GPU_SAMPLER_TEST_H

#include "tests/gpu/gpu_test.h"

#include "common/error.h"
#include "kernels/cpu/sampler.h"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define MAX_ROWS 64
#define MAX_HISTORY 128
#define MAX_PROMPT 48
#define MAX_OUTPUT 24
#define TOP_IDS 64
#define MISMATCHES_SHOWN 20

#define MUST(cond)                                                                                 \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            printf("FATAL %s:%d: %s (%s)\n", __FILE__, __LINE__, #cond, pagoda_error_detail());    \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* A sampling call that must succeed: counts a failure and leaves the test function (leaking
 * what it holds) so that the other tests still run. */
#define SAMPLE_OR_RETURN(call)                                                                     \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != 0) {                                                                            \
            GPU_CHECK(0, "%s: %d (%s)", #call, rc_, pagoda_error_detail());                        \
            return;                                                                                \
        }                                                                                          \
    } while (0)

/* A deterministic generator for test data, independent of Philox (test_cuda_sampler.c). */
uint64_t rng_next(void);
float rng_unit(void);   /* [0, 1) */
float rng_normal(void); /* roughly N(0, 1) */
/* A logit row of kind 0 .. 5 (test_cuda_sampler.c make_row). */
void make_row(float *l, int32_t vocab, int kind);

/* A bank of logit rows on the host and the device, with each row's most likely ids (so that
 * histories hit the tokens that matter). */
struct bank {
    int32_t vocab, rows;
    float *host;
    float *dev;
    int32_t *top; /* [rows][TOP_IDS] */
};

/* Rows rows of vocab logits (row r of kind (r + kind_offset) % 6), uploaded. */
void bank_init(struct bank *b, int32_t vocab, int32_t rows, int kind_offset);
void bank_fini(struct bank *b);

/* One batch's host-side inputs. */
struct batch {
    int32_t rows;
    struct sampling_params params[MAX_ROWS];
    uint64_t output_index[MAX_ROWS];
    int32_t prompt[MAX_ROWS][MAX_PROMPT], output[MAX_ROWS][MAX_OUTPUT];
    const int32_t *prompt_ptr[MAX_ROWS], *output_ptr[MAX_ROWS];
    size_t n_prompt[MAX_ROWS], n_output[MAX_ROWS];
    int32_t tokens[MAX_ROWS];
    float logprobs[MAX_ROWS];
};

/* A fresh history for slot `slot` of bt from row r of b (test_cuda_sampler.c make_history_of). */
void make_history(struct batch *bt, int32_t slot, const struct bank *b, int32_t r);

/* Parameter combination `combo` of the test grid (temperature, top-k, top-p, min-p, penalties;
 * 576 of them), with seed. */
struct sampling_params combo_params(int combo, uint64_t seed);

static inline int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* test_cuda_sampler_greedy.c: the greedy fast path against the CPU and the general path, and its
 * timings. */
void test_greedy_fast_path(int32_t vocab, int32_t rows);
void greedy_timings(void);

/* test_cuda_sampler_history.c: history gathers and keys. */
void test_enqueue_history_gathers(int32_t vocab, int32_t rows);
void test_history_keys(int32_t vocab, int32_t rows, int32_t slots);
void test_history_key_edges(void);

#endif
