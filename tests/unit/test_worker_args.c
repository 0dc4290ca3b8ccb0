/* Tests of worker/worker_args.c: pagoda-worker's flags parsed and checked before anything starts:
 * the defaults, each flag's value, and the refusals of a bad value or a combination that cannot
 * run (each must be a usage error, never a start). The messages go to stderr. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "worker/backend.h"
#include "worker/worker_args.h"

#include <string.h>

#define ARGS_MAX 48

/* Parses the NULL-terminated flags after "pagoda-worker" into *o. */
static int parse(struct worker_opts *o, const char *first, ...)
{
    char *argv[ARGS_MAX + 2];
    int argc = 0;
    argv[argc++] = (char *)"pagoda-worker";
    va_list ap;
    va_start(ap, first);
    const char *a = first;
    for (; a != NULL && argc <= ARGS_MAX; a = va_arg(ap, const char *))
        argv[argc++] = (char *)a;
    va_end(ap);
    assert_null(a); /* more flags than ARGS_MAX: raise it (none may be dropped) */
    argv[argc] = NULL;
    return worker_args_parse(argc, argv, o);
}

#define BASE "--run-dir", "/tmp/r", "--model", "/m", "--worker-id", "3"

static void test_defaults_and_values(void **state)
{
    (void)state;
    struct worker_opts o;
    assert_int_equal(parse(&o, BASE, NULL), 0);
    assert_string_equal(o.run_dir, "/tmp/r");
    assert_string_equal(o.model, "/m");
    assert_int_equal(o.worker_id, 3);
    assert_string_equal(o.backend, "cpu");
    assert_string_equal(o.load_format, "safetensors");
    assert_int_equal(o.max_batched_tokens, 2048);
    assert_int_equal(o.max_seqs, 256);
    assert_int_equal(o.tensor_parallel, 1);
    assert_int_equal(o.cuda_graphs, 1);
    assert_int_equal(o.cuda_pdl, 1);
    assert_int_equal(o.cuda_residual_gemm, 1);
    assert_int_equal(o.cuda_tma, 1);
    assert_int_equal(o.tp_size, 0);
    assert_int_equal(o.tp_timeout_ms, 30000);
    assert_null(o.kvpool);
    assert_int_equal(parse(&o, BASE, "--max-seqs", "64", "--max-batched-tokens", "512", "--fault",
                           "drop-result=7", "--step-delay-ms", "5", "--seed", "9", "--kvpool",
                           "tcp://127.0.0.1:7000", "--cuda-graphs", "off", "--cuda-pdl", "off",
                           "--cuda-residual-gemm", "off", "--cuda-tma", "off", "--tp-rank", "1",
                           "--tp-size", "2", "--tp-group", "/tmp/g", "--tp-timeout-ms", "5000",
                           NULL),
                     0);
    assert_int_equal(o.max_seqs, 64);
    assert_int_equal(o.max_batched_tokens, 512);
    assert_int_equal(o.drop_result, 7);
    assert_int_equal(o.drop_step, 0);
    assert_null(o.lose_device);
    assert_int_equal(o.step_delay_ms, 5);
    assert_int_equal(o.seed, 9);
    assert_string_equal(o.kvpool, "tcp://127.0.0.1:7000");
    assert_int_equal(o.cuda_graphs, 0);
    assert_int_equal(o.cuda_pdl, 0);
    assert_int_equal(o.cuda_residual_gemm, 0);
    assert_int_equal(o.cuda_tma, 0);
    assert_int_equal(o.tp_rank, 1);
    assert_int_equal(o.tp_size, 2);
    assert_string_equal(o.tp_group, "/tmp/g");
    assert_int_equal(o.tp_timeout_ms, 5000);
    assert_int_equal(parse(&o, BASE, "--tensor-parallel", "2", "--tp-timeout-ms", "3600000", NULL),
                     0);
    assert_int_equal(o.tp_timeout_ms, 3600000);
    assert_int_equal(parse(&o, BASE, "--cuda-tma", "stream-k", NULL), 0);
    assert_int_equal(o.cuda_tma, BACKEND_CUDA_TMA_STREAM_K);
    /* A second parse starts from the defaults again. */
    assert_int_equal(parse(&o, BASE, NULL), 0);
    assert_int_equal(o.max_seqs, 256);
    assert_int_equal(o.tp_size, 0);
    assert_int_equal(o.cuda_residual_gemm, 1);
    assert_int_equal(o.cuda_tma, 1);
    assert_int_equal(o.tp_timeout_ms, 30000);
    assert_int_equal(parse(&o, "--help", NULL), WORKER_ARGS_HELP);
}

static void test_refusals(void **state)
{
    (void)state;
    struct worker_opts o;
    const int U = WORKER_ARGS_USAGE;
    assert_int_equal(parse(&o, "--run-dir", "/tmp/r", "--model", "/m", NULL), U); /* no id */
    assert_int_equal(parse(&o, BASE, "extra", NULL), U);
    assert_int_equal(parse(&o, BASE, "--worker-id", "1024", NULL), U);
    assert_int_equal(parse(&o, BASE, "--backend", "tpu", NULL), U);
    assert_int_equal(parse(&o, BASE, "--load-format", "gguf", NULL), U);
    assert_int_equal(parse(&o, BASE, "--load-format", "random", NULL), U); /* needs cuda */
    assert_int_equal(parse(&o, BASE, "--max-seqs", "0", NULL), U);
    assert_int_equal(parse(&o, BASE, "--max-seqs", "4097", NULL), U);
    assert_int_equal(parse(&o, BASE, "--max-batched-tokens", "70000", NULL), U);
    assert_int_equal(parse(&o, BASE, "--fault", "drop-steps=1", NULL), U);
    assert_int_equal(parse(&o, BASE, "--fault", "drop-step=0", NULL), U);
    assert_int_equal(parse(&o, BASE, "--fault", "lose-device=", NULL), U);
    assert_int_equal(parse(&o, BASE, "--fault", "lose-device=/tmp/x", NULL), 0);
    assert_string_equal(o.lose_device, "/tmp/x");
    assert_int_equal(parse(&o, BASE, "--kvpool", "http://x", NULL), U);
    assert_int_equal(parse(&o, BASE, "--cuda-graphs", "maybe", NULL), U);
    assert_int_equal(parse(&o, BASE, "--cuda-pdl", "1", NULL), U);
    assert_int_equal(parse(&o, BASE, "--cuda-residual-gemm", "yes", NULL), U);
    assert_int_equal(parse(&o, BASE, "--cuda-tma", "1", NULL), U);
    assert_int_equal(parse(&o, BASE, "--cuda-tma", "streamk", NULL), U);
    assert_int_equal(parse(&o, BASE, "--log-level", "loud", NULL), U);
    assert_int_equal(parse(&o, BASE, "--tp-rank", "0", "--tp-size", "2", NULL), U); /* no file */
    assert_int_equal(parse(&o, BASE, "--tp-rank", "2", "--tp-size", "2", "--tp-group", "/g", NULL),
                     U);
    assert_int_equal(parse(&o, BASE, "--tp-group", "", NULL), U);
    assert_int_equal(parse(&o, BASE, "--tensor-parallel", "2", "--tp-rank", "0", "--tp-size", "2",
                           "--tp-group", "/g", NULL),
                     U);
    assert_int_equal(parse(&o, BASE, "--backend", "null", "--tp-rank", "0", "--tp-size", "2",
                           "--tp-group", "/g", NULL),
                     U);
    assert_int_equal(parse(&o, BASE, "--backend", "null", "--tensor-parallel", "2", NULL), U);
    assert_int_equal(parse(&o, BASE, "--tensor-parallel", "2", "--tp-timeout-ms", "999", NULL), U);
    assert_int_equal(parse(&o, BASE, "--tensor-parallel", "2", "--tp-timeout-ms", "3600001", NULL),
                     U);
    assert_int_equal(parse(&o, BASE, "--tp-timeout-ms", "5000", NULL), U); /* no group */
    assert_int_equal(parse(&o, BASE, "--no-such-flag", NULL), U);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults_and_values),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
