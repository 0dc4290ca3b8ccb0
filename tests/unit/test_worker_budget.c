/* Tests of worker/worker_budget.c: a CUDA worker starts when what it needs (model_budget.h) is
 * free beside the pool, waits a bounded time for memory a predecessor is still releasing, and
 * otherwise refuses, saying exactly how much it is short by. The GPU's free memory comes from a
 * scripted callback. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "model/model_budget.h"
#include "worker/worker_budget.h"

#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>

#define SCRIPT_MAX 8

/* The free memory the GPU reports, call after call (the last value repeats). */
struct fake_gpu {
    uint64_t free_bytes[SCRIPT_MAX];
    int n;
    int calls;
    int fail_with;                      /* a PAGODA_E* code to return instead, or 0 */
    volatile sig_atomic_t *set_on_call; /* set to 1 at the first call, when not NULL */
};

static int fake_mem_info(void *ctx, uint64_t *free_bytes, uint64_t *total_bytes)
{
    struct fake_gpu *g = ctx;
    int i = g->calls < g->n ? g->calls : g->n - 1;
    g->calls++;
    if (g->set_on_call != NULL)
        *g->set_on_call = 1;
    if (g->fail_with != 0)
        return pagoda_error_set(g->fail_with, "cudaMemGetInfo failed");
    *free_bytes = g->free_bytes[i];
    *total_bytes = UINT64_C(80) << 30;
    return 0;
}

static struct model_config tiny(void)
{
    struct model_config c;
    model_config_tiny(&c);
    return c;
}

static struct worker_budget_request request(const struct model_config *c, struct fake_gpu *g)
{
    return (struct worker_budget_request){
        .config = c,
        .max_tokens = 2048,
        .max_seqs = 256,
        .device = 3,
        .pool_bytes = UINT64_C(1) << 30,
        .mem_info = fake_mem_info,
        .mem_info_ctx = g,
        .wait_ms = 1000,
        .poll_ms = 1,
    };
}

static void assert_detail_has(int rc, const char *needle)
{
    char msg[700];
    pagoda_error_message(rc, msg, sizeof(msg));
    if (strstr(msg, needle) == NULL)
        fail_msg("\"%s\" does not say \"%s\"", msg, needle);
}

/* Exactly what model_budget_worker_bytes says is enough; one byte less is not. */
static void test_fits_exactly(void **state)
{
    (void)state;
    struct model_config c = tiny();
    uint64_t need = model_budget_worker_bytes(&c, 2048, 256);
    struct fake_gpu g = {.free_bytes = {need}, .n = 1};
    struct worker_budget_request r = request(&c, &g);
    assert_int_equal(worker_budget_check(&r), 0);
    assert_int_equal(g.calls, 1);
}

static void test_one_byte_short_is_refused(void **state)
{
    (void)state;
    struct model_config c = tiny();
    uint64_t need = model_budget_worker_bytes(&c, 2048, 256);
    struct fake_gpu g = {.free_bytes = {need - 1}, .n = 1};
    struct worker_budget_request r = request(&c, &g);
    r.wait_ms = 5;
    int rc = worker_budget_check(&r);
    assert_int_equal(rc, PAGODA_EEXHAUSTED);
    assert_detail_has(rc, "short by 0 MiB (1 bytes)");
    assert_detail_has(rc, "on GPU 3");
    assert_detail_has(rc, "for 2048 tokens and 256 sequences a step");
    assert_detail_has(rc, "beside the KV pool (1024 MiB)");
    /* It waited (asked more than once), within its bound. */
    assert_true(g.calls >= 2);
    assert_true(g.calls <= 6 + 1);
}

/* Memory that comes free while the worker waits (a predecessor releasing its weights) is
 * enough: the worker starts. */
static void test_memory_freed_while_waiting(void **state)
{
    (void)state;
    struct model_config c = tiny();
    uint64_t need = model_budget_worker_bytes(&c, 2048, 256);
    struct fake_gpu g = {.free_bytes = {0, need / 2, need + 1}, .n = 3};
    struct worker_budget_request r = request(&c, &g);
    assert_int_equal(worker_budget_check(&r), 0);
    assert_int_equal(g.calls, 3);
}

/* The step limits count: a smaller step needs less. */
static void test_smaller_steps_need_less(void **state)
{
    (void)state;
    struct model_config c = tiny();
    uint64_t need_small = model_budget_worker_bytes(&c, 256, 16);
    assert_true(need_small < model_budget_worker_bytes(&c, 2048, 256));
    struct fake_gpu g = {.free_bytes = {need_small}, .n = 1};
    struct worker_budget_request r = request(&c, &g);
    r.wait_ms = 0;
    assert_int_equal(worker_budget_check(&r), PAGODA_EEXHAUSTED);
    g.calls = 0;
    r.max_tokens = 256;
    r.max_seqs = 16;
    assert_int_equal(worker_budget_check(&r), 0);
}

/* A stop (a signal during start) ends the wait at once. */
static void test_stop_ends_the_wait(void **state)
{
    (void)state;
    struct model_config c = tiny();
    volatile sig_atomic_t stop = 0;
    struct fake_gpu g = {.free_bytes = {0}, .n = 1, .set_on_call = &stop};
    struct worker_budget_request r = request(&c, &g);
    r.wait_ms = 600000;
    r.poll_ms = 1000;
    r.stop = &stop;
    assert_int_equal(worker_budget_check(&r), PAGODA_EEXHAUSTED);
    assert_int_equal(g.calls, 1);
}

/* The GPU's own error goes back as it is, without waiting. */
static void test_mem_info_error_is_returned(void **state)
{
    (void)state;
    struct model_config c = tiny();
    struct fake_gpu g = {.free_bytes = {0}, .n = 1, .fail_with = PAGODA_ECUDA};
    struct worker_budget_request r = request(&c, &g);
    assert_int_equal(worker_budget_check(&r), PAGODA_ECUDA);
    assert_int_equal(g.calls, 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fits_exactly),
        cmocka_unit_test(test_one_byte_short_is_refused),
        cmocka_unit_test(test_memory_freed_while_waiting),
        cmocka_unit_test(test_smaller_steps_need_less),
        cmocka_unit_test(test_stop_ends_the_wait),
        cmocka_unit_test(test_mem_info_error_is_returned),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
