/* Tests of worker/backend.c: backend_forward_sample_rows fails one row, not the step, on the
 * host path and on a backend that samples on the device, with a fake backend whose forward
 * pass writes fixed logits. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "worker/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 8
#define ROWS 3

struct fake_backend {
    struct backend base;
    float logits[ROWS][VOCAB]; /* what each forward pass writes */
    int forward_rc;            /* what it returns */
    int forwards, device_samples;
};

static int fake_forward(struct backend *b, const struct fwd_batch *batch, float *logits)
{
    struct fake_backend *f = (struct fake_backend *)b;
    f->forwards++;
    if (f->forward_rc != 0)
        return pagoda_error_set(f->forward_rc, "fake forward fails");
    memcpy(logits, f->logits, (size_t)batch->num_logits * VOCAB * sizeof(float));
    return 0;
}

/* A device sampler: like the CUDA one, it fails the whole call when any row fails. */
static int fake_forward_sample(struct backend *b, const struct fwd_batch *batch,
                               const struct sample_row *rows, int32_t *tokens, float *logprobs)
{
    struct fake_backend *f = (struct fake_backend *)b;
    f->device_samples++;
    if (f->forward_rc != 0)
        return pagoda_error_set(f->forward_rc, "fake forward fails");
    for (int32_t r = 0; r < batch->num_logits; r++)
        for (int i = 0; i < VOCAB; i++)
            if (!isfinite(f->logits[r][i]))
                return pagoda_error_set(PAGODA_EINVAL, "row %d failed", (int)r);
    for (int32_t r = 0; r < batch->num_logits; r++) {
        (void)rows;
        tokens[r] = 1000 + r; /* marks the device's answer */
        logprobs[r] = 0.0f;
    }
    return 0;
}

static void fake_close(struct backend *b)
{
    free(b);
}

static const struct backend_ops host_ops = {
    .name = "fake-host", .forward = fake_forward, .close = fake_close};
static const struct backend_ops device_ops = {.name = "fake-device",
                                              .forward = fake_forward,
                                              .forward_sample = fake_forward_sample,
                                              .close = fake_close};

static struct fake_backend *fake_open(const struct backend_ops *ops)
{
    struct fake_backend *f = calloc(1, sizeof(*f));
    assert_non_null(f);
    f->base.ops = ops;
    f->base.config.vocab_size = VOCAB;
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < VOCAB; i++)
            f->logits[r][i] = (float)((i * 3 + r) % VOCAB); /* argmax: (i*3+r)%8 == 7 */
    return f;
}

static int32_t argmax_of(const float *l)
{
    int32_t best = 0;
    for (int32_t i = 1; i < VOCAB; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* Runs one batch of ROWS rows, greedy, and checks that row bad (or none: -1) failed alone. */
static void run_batch(struct fake_backend *f, int bad, const char *what)
{
    struct fwd_batch batch = {.num_tokens = ROWS, .num_seqs = ROWS, .num_logits = ROWS};
    struct sample_row rows[ROWS];
    for (int r = 0; r < ROWS; r++) {
        memset(&rows[r], 0, sizeof(rows[r]));
        rows[r].params = sampling_params_default();
        rows[r].params.temperature = 0.0f;
    }
    int32_t tokens[ROWS];
    float logprobs[ROWS];
    struct backend_row_error errors[ROWS];
    assert_int_equal(backend_forward_sample_rows(&f->base, &batch, rows, tokens, logprobs, errors),
                     0);
    for (int r = 0; r < ROWS; r++) {
        if (r == bad) {
            assert_int_equal(errors[r].code, PAGODA_EINVAL);
            assert_non_null(strstr(errors[r].message, what));
            assert_int_equal(tokens[r], -1);
        } else {
            assert_int_equal(errors[r].code, 0);
            assert_int_equal(tokens[r], argmax_of(f->logits[r]));
        }
    }
}

/* The host path: a NaN row fails alone; the others get their tokens. */
static void test_host_rows_fail_alone(void **state)
{
    struct fake_backend *f = fake_open(&host_ops);
    run_batch(f, -1, NULL);
    f->logits[1][4] = NAN;
    run_batch(f, 1, "logit 4");
    assert_int_equal(f->forwards, 2);
    /* A failed forward pass fails the step: nothing is sampled. */
    f->forward_rc = PAGODA_ERANGE;
    struct fwd_batch batch = {.num_tokens = 1, .num_seqs = 1, .num_logits = 1};
    struct sample_row row = {.params = sampling_params_default()};
    int32_t token = -7;
    float lp;
    struct backend_row_error err = {.code = 99};
    assert_int_equal(backend_forward_sample_rows(&f->base, &batch, &row, &token, &lp, &err),
                     PAGODA_ERANGE);
    assert_int_equal(err.code, 99);
    backend_close(&f->base);
}

/* A device sampler: its answer is used when every row samples; when one fails, the logits are
 * computed again on the host path and the rows sampled one by one, so the failing row is found
 * and the others still get their (host-drawn, equal) tokens. */
static void test_device_failure_is_attributed_to_its_row(void **state)
{
    struct fake_backend *f = fake_open(&device_ops);
    struct fwd_batch batch = {.num_tokens = ROWS, .num_seqs = ROWS, .num_logits = ROWS};
    struct sample_row rows[ROWS];
    for (int r = 0; r < ROWS; r++)
        rows[r] = (struct sample_row){.params = sampling_params_default()};
    int32_t tokens[ROWS];
    float logprobs[ROWS];
    struct backend_row_error errors[ROWS];
    assert_int_equal(backend_forward_sample_rows(&f->base, &batch, rows, tokens, logprobs, errors),
                     0);
    assert_int_equal(tokens[2], 1002);
    assert_int_equal(errors[2].code, 0);
    assert_int_equal(f->forwards, 0);
    assert_int_equal(backend_forward_count(&f->base), 1);

    f->logits[2][0] = INFINITY;
    run_batch(f, 2, "logit 0");
    assert_int_equal(f->device_samples, 2);
    assert_int_equal(f->forwards, 1);
    backend_close(&f->base);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_rows_fail_alone),
        cmocka_unit_test(test_device_failure_is_attributed_to_its_row),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
