/* Tests of worker/worker_pool.c: a worker maps the pool kvpool describes when it is of the kind
 * its backend needs, refuses one of another kind (as a configuration that a restart would not
 * fix), and refuses a pool that does not fit its model, naming what differs. Shared-memory names
 * are unique per run (they include the pid) and every teardown unlinks them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "kvpool/shm_pool.h"
#include "worker/worker_pool.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

struct fixture {
    char name[KV_SHM_NAME_MAX + 1];
    struct kv_shm_pool *owner; /* kvpool's side */
    struct kvpool_info info;   /* what kvpool says */
    struct model_config config;
    struct worker_pool pool; /* the worker's side */
};

static int setup(void **state)
{
    static int counter;
    struct fixture *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    snprintf(f->name, sizeof(f->name), "/pagoda-test-wpool-%ld-%d", (long)getpid(), counter++);
    model_config_tiny(&f->config);
    f->info.geometry = (struct kv_geometry){.pool_id = 42,
                                            .num_layers = (int32_t)f->config.num_layers,
                                            .num_blocks = 6,
                                            .block_size = 8,
                                            .num_kv_heads = (int32_t)f->config.num_kv_heads,
                                            .head_dim = (int32_t)f->config.head_dim,
                                            .dtype = DTYPE_F32};
    snprintf(f->info.shm_name, sizeof(f->info.shm_name), "%s", f->name);
    f->info.device = -1;
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    worker_pool_fini(&f->pool);
    kv_shm_pool_close(f->owner);
    shm_unlink(f->name);
    free(f);
    return 0;
}

static void create_pool(struct fixture *f)
{
    assert_int_equal(kv_shm_pool_create(f->name, &f->info.geometry, &f->owner), 0);
}

static void assert_detail_has(int rc, const char *needle)
{
    char msg[700];
    pagoda_error_message(rc, msg, sizeof(msg));
    if (strstr(msg, needle) == NULL)
        fail_msg("\"%s\" does not say \"%s\"", msg, needle);
}

/* The CPU backend maps kvpool's shared-memory pool: the worker sees the memory kvpool made. */
static void test_cpu_backend_maps_the_shm_pool(void **state)
{
    struct fixture *f = *state;
    create_pool(f);
    int cannot_run = 0;
    assert_int_equal(worker_pool_init(&f->pool, &f->info, "cpu", 0, 1000, &cannot_run), 0);
    assert_non_null(f->pool.shm);
    assert_null(f->pool.gpu);
    assert_string_equal(f->pool.where, f->name);
    assert_true(kv_geometry_equal(&f->pool.info.geometry, &f->info.geometry));
    /* The same memory: what kvpool's side writes, the worker reads. */
    ((unsigned char *)kv_shm_pool_data(f->owner))[0] = 0x5a;
    assert_int_equal(((unsigned char *)kv_shm_pool_data(f->pool.shm))[0], 0x5a);
    assert_int_equal(cannot_run, 0);
    worker_pool_fini(&f->pool);
    assert_null(f->pool.shm);
    /* The pool is kvpool's: unmapping it removes nothing. */
    struct kv_shm_pool *again = NULL;
    assert_int_equal(kv_shm_pool_open(f->name, &f->info.geometry, &again), 0);
    kv_shm_pool_close(again);
}

/* The null backend maps a CPU pool too (it never touches it, but the pool must exist). */
static void test_null_backend_maps_the_shm_pool(void **state)
{
    struct fixture *f = *state;
    create_pool(f);
    int cannot_run = 0;
    assert_int_equal(worker_pool_init(&f->pool, &f->info, "null", 0, 1000, &cannot_run), 0);
    assert_non_null(f->pool.shm);
}

/* A segment under kvpool's name that is another pool (another pool id: a kvpool restarted in
 * between) is refused; that is not a configuration error, a restart may well succeed. */
static void test_another_pool_under_the_name_is_refused(void **state)
{
    struct fixture *f = *state;
    create_pool(f);
    f->info.geometry.pool_id = 43;
    int cannot_run = 0;
    int rc = worker_pool_init(&f->pool, &f->info, "cpu", 0, 1000, &cannot_run);
    assert_int_equal(rc, PAGODA_EMISMATCH);
    assert_detail_has(rc, "is not the pool kvpool described");
    assert_int_equal(cannot_run, 0);
}

/* No segment under the name: kv_shm_pool_open's error, not a configuration error. */
static void test_missing_shm_pool(void **state)
{
    struct fixture *f = *state;
    int cannot_run = 0;
    assert_int_equal(worker_pool_init(&f->pool, &f->info, "cpu", 0, 1000, &cannot_run),
                     PAGODA_ENOENT);
    assert_int_equal(cannot_run, 0);
    assert_null(f->pool.shm);
}

/* A GPU pool for the CPU backend, or a CPU pool for the CUDA backend: the worker cannot run as
 * configured, and says what to start differently. */
static void test_gpu_pool_for_the_cpu_backend_cannot_run(void **state)
{
    struct fixture *f = *state;
    f->info.shm_name[0] = '\0';
    f->info.device = 0;
    snprintf(f->info.handle_socket, sizeof(f->info.handle_socket), "/run/x/kvpool-fds.ipc");
    f->info.geometry.dtype = DTYPE_BF16;
    int cannot_run = 0;
    int rc = worker_pool_init(&f->pool, &f->info, "cpu", 0, 1000, &cannot_run);
    assert_int_equal(rc, PAGODA_EMISMATCH);
    assert_int_equal(cannot_run, 1);
    assert_string_equal(f->pool.where, "on GPU 0 (/run/x/kvpool-fds.ipc)");
    assert_detail_has(rc, "the cpu backend needs a CPU pool");
    assert_null(f->pool.shm);
}

static void test_cpu_pool_for_the_cuda_backend_cannot_run(void **state)
{
    struct fixture *f = *state;
    create_pool(f);
    int cannot_run = 0;
    int rc = worker_pool_init(&f->pool, &f->info, "cuda", 0, 1000, &cannot_run);
    assert_int_equal(rc, PAGODA_EMISMATCH);
    assert_int_equal(cannot_run, 1);
    assert_detail_has(rc, "the CUDA backend needs a GPU pool");
    assert_null(f->pool.shm);
}

/* The null backend leaves a GPU pool alone: nothing to map, nothing refused. */
static void test_null_backend_leaves_a_gpu_pool_alone(void **state)
{
    struct fixture *f = *state;
    f->info.shm_name[0] = '\0';
    f->info.device = 1;
    snprintf(f->info.handle_socket, sizeof(f->info.handle_socket), "/run/x/kvpool-fds.ipc");
    int cannot_run = 0;
    assert_int_equal(worker_pool_init(&f->pool, &f->info, "null", 0, 1000, &cannot_run), 0);
    assert_null(f->pool.shm);
    assert_null(f->pool.gpu);
    assert_int_equal(cannot_run, 0);
}

static void test_fini_accepts_null_and_zero(void **state)
{
    (void)state;
    struct worker_pool zero;
    memset(&zero, 0, sizeof(zero));
    worker_pool_fini(NULL);
    worker_pool_fini(&zero);
    worker_pool_fini(&zero);
}

/* A pool made for the model fits; each shape field that differs is named with both values. */
static void test_pool_fits_its_model(void **state)
{
    struct fixture *f = *state;
    f->pool.info = f->info;
    assert_int_equal(worker_pool_check_model(&f->pool, &f->config, "m", "cpu"), 0);
    assert_int_equal(worker_pool_check_model(&f->pool, &f->config, "m", "null"), 0);
}

static void test_pool_of_another_model_is_refused(void **state)
{
    struct fixture *f = *state;
    snprintf(f->pool.where, sizeof(f->pool.where), "/pool");
    f->pool.info = f->info;
    f->pool.info.geometry.num_layers = 3;
    int rc = worker_pool_check_model(&f->pool, &f->config, "/models/tiny", "cpu");
    assert_int_equal(rc, PAGODA_EMISMATCH);
    assert_detail_has(rc, "kv pool /pool does not fit the model /models/tiny: layers 3 in the "
                          "pool, 4 in the model");
    f->pool.info = f->info;
    f->pool.info.geometry.num_kv_heads = 4;
    rc = worker_pool_check_model(&f->pool, &f->config, "/models/tiny", "cpu");
    assert_int_equal(rc, PAGODA_EMISMATCH);
    assert_detail_has(rc, "KV heads 4 in the pool, 2 in the model");
    f->pool.info = f->info;
    f->pool.info.geometry.head_dim = 128;
    rc = worker_pool_check_model(&f->pool, &f->config, "/models/tiny", "null");
    assert_int_equal(rc, PAGODA_EMISMATCH);
    assert_detail_has(rc, "head dim 128 in the pool, 64 in the model");
}

/* The CPU backend reads F32 pools, the CUDA backend BF16 and F8E4M3 ones (--kv-cache-dtype fp8);
 * the null backend takes any. */
static void test_pool_of_another_dtype_is_refused(void **state)
{
    struct fixture *f = *state;
    snprintf(f->pool.where, sizeof(f->pool.where), "/pool");
    f->pool.info = f->info;
    int rc = worker_pool_check_model(&f->pool, &f->config, "m", "cuda");
    assert_int_equal(rc, PAGODA_EMISMATCH);
    assert_detail_has(rc, "kv pool /pool holds F32; the cuda backend needs BF16 or F8_E4M3");
    f->pool.info.geometry.dtype = DTYPE_F8E4M3;
    assert_int_equal(worker_pool_check_model(&f->pool, &f->config, "m", "cuda"), 0);
    rc = worker_pool_check_model(&f->pool, &f->config, "m", "cpu");
    assert_detail_has(rc, "holds F8_E4M3; the cpu backend needs F32");
    f->pool.info.geometry.dtype = DTYPE_BF16;
    assert_int_equal(worker_pool_check_model(&f->pool, &f->config, "m", "cuda"), 0);
    assert_int_equal(worker_pool_check_model(&f->pool, &f->config, "m", "null"), 0);
    rc = worker_pool_check_model(&f->pool, &f->config, "m", "cpu");
    assert_int_equal(rc, PAGODA_EMISMATCH);
    assert_detail_has(rc, "holds BF16; the cpu backend needs F32");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cpu_backend_maps_the_shm_pool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_null_backend_maps_the_shm_pool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_another_pool_under_the_name_is_refused, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_missing_shm_pool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gpu_pool_for_the_cpu_backend_cannot_run, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_cpu_pool_for_the_cuda_backend_cannot_run, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_null_backend_leaves_a_gpu_pool_alone, setup, teardown),
        cmocka_unit_test(test_fini_accepts_null_and_zero),
        cmocka_unit_test_setup_teardown(test_pool_fits_its_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_of_another_model_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_of_another_dtype_is_refused, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
