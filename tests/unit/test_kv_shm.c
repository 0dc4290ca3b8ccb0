/* Tests of kvpool/shm_pool.c: a pool created by one process and mapped by another, and every
 * way an open is refused. Names are unique per run (they include the pid) and every test's
 * teardown unlinks them, so a failing test leaves nothing in /dev/shm. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "kvpool/shm_pool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef KV_SHM_PEER_PATH
#error "KV_SHM_PEER_PATH must name the kv_shm_peer executable"
#endif

struct fixture {
    char name[KV_SHM_NAME_MAX + 1];
    struct kv_shm_pool *pool;
    struct kv_shm_pool *other;
};

static int setup(void **state)
{
    static int counter;
    struct fixture *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return -1;
    snprintf(f->name, sizeof(f->name), "/pagoda-test-kv-%ld-%d", (long)getpid(), counter++);
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    struct fixture *f = *state;
    kv_shm_pool_close(f->pool);
    kv_shm_pool_close(f->other);
    shm_unlink(f->name);
    free(f);
    return 0;
}

static struct kv_geometry test_geometry(void)
{
    struct kv_geometry g = {.pool_id = 42,
                            .num_layers = 3,
                            .num_blocks = 6,
                            .block_size = 8,
                            .num_kv_heads = 2,
                            .head_dim = 16,
                            .dtype = DTYPE_F32};
    return g;
}

static int name_exists(const char *name)
{
    char path[KV_SHM_NAME_MAX + 16];
    snprintf(path, sizeof(path), "/dev/shm%s", name);
    return access(path, F_OK) == 0;
}

static void expect_detail(const char *needle)
{
    if (strstr(pagoda_error_detail(), needle) == NULL)
        fail_msg("detail \"%s\" does not contain \"%s\"", pagoda_error_detail(), needle);
}

/* The layout's element index, computed here without kv_layer_view_make. */
static size_t layout_index(const struct kv_geometry *g, int layer, int block, int kv, int head,
                           int slot, int d)
{
    size_t i = (size_t)layer;
    i = i * (size_t)g->num_blocks + (size_t)block;
    i = i * 2 + (size_t)kv;
    i = i * (size_t)g->num_kv_heads + (size_t)head;
    i = i * (size_t)g->block_size + (size_t)slot;
    return i * (size_t)g->head_dim + (size_t)d;
}

/* Runs kv_shm_peer with the pool's name, a mode and the f32 geometry; returns its exit status,
 * or -1 when it did not exit normally. */
static int run_peer(const char *name, const char *mode, const struct kv_geometry *g)
{
    char a[6][24];
    snprintf(a[0], sizeof(a[0]), "%llu", (unsigned long long)g->pool_id);
    snprintf(a[1], sizeof(a[1]), "%d", g->num_layers);
    snprintf(a[2], sizeof(a[2]), "%d", g->num_blocks);
    snprintf(a[3], sizeof(a[3]), "%d", g->block_size);
    snprintf(a[4], sizeof(a[4]), "%d", g->num_kv_heads);
    snprintf(a[5], sizeof(a[5]), "%d", g->head_dim);
    char *argv[] = {
        KV_SHM_PEER_PATH, (char *)name, (char *)mode, a[0], a[1], a[2], a[3], a[4], a[5], NULL};
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* Maps the raw segment `name` read-write, bypassing the pool's checks, to damage it. */
static void *raw_map(const char *name, size_t *size)
{
    int fd = shm_open(name, O_RDWR, 0);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    *size = (size_t)st.st_size;
    void *p = mmap(NULL, *size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    assert_true(p != MAP_FAILED);
    return p;
}

static void raw_truncate(const char *name, off_t size)
{
    int fd = shm_open(name, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, size), 0);
    close(fd);
}

/* The first process writes +code through its layer views; a second process (exec'd, so it
 * inherits no mapping) opens the pool by name, finds every code at the layout's offset and
 * writes -code through its own views; the first process then reads those at the layout's
 * offsets. */
static void test_second_process_sees_writes(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    for (int layer = 0; layer < g.num_layers; layer++) {
        struct kv_layer_view v;
        assert_int_equal(kv_shm_pool_layer_view(f->pool, layer, &v), 0);
        for (int block = 0; block < g.num_blocks; block++)
            for (int kv = 0; kv < 2; kv++)
                for (int head = 0; head < g.num_kv_heads; head++)
                    for (int slot = 0; slot < g.block_size; slot++)
                        for (int d = 0; d < g.head_dim; d++) {
                            float *p = (float *)(kv ? v.v : v.k) + block * v.block_stride +
                                       head * v.head_stride + slot * v.slot_stride + d;
                            *p = (float)(layout_index(&g, layer, block, kv, head, slot, d) + 1);
                        }
    }

    assert_int_equal(run_peer(f->name, "check-and-write", &g), 0);

    const float *data = kv_shm_pool_data(f->pool);
    size_t n = kv_pool_bytes(&g) / sizeof(float);
    for (size_t i = 0; i < n; i++)
        if (data[i] != -(float)(i + 1))
            fail_msg("element %zu: %g, expected %g", i, (double)data[i], -(double)(i + 1));
}

/* A second process can only map a pool whose geometry it expects: a peer expecting other
 * dimensions is refused, and the data stays untouched. */
static void test_second_process_with_other_geometry_is_refused(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    struct kv_geometry other = g;
    other.head_dim = 32;
    assert_int_equal(run_peer(f->name, "check-and-write", &other), 2);
    const float *data = kv_shm_pool_data(f->pool);
    for (size_t i = 0; i < kv_pool_bytes(&g) / sizeof(float); i++)
        assert_true(data[i] == 0.0f);
}

/* The KV memory outlives the process that created it: a peer creates and fills the pool and
 * exits, and this process maps it afterwards and finds the data. */
static void test_pool_outlives_its_creator(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    assert_int_equal(run_peer(f->name, "create", &g), 0);
    assert_true(name_exists(f->name));
    assert_int_equal(kv_shm_pool_open(f->name, &g, &f->pool), 0);
    const float *data = kv_shm_pool_data(f->pool);
    for (size_t i = 0; i < kv_pool_bytes(&g) / sizeof(float); i++)
        assert_true(data[i] == -(float)(i + 1));
}

/* Create zeroes the data and aligns it to a page; an open without an expected geometry
 * reports the pool's; two mappings in one process see each other's writes. */
static void test_open_without_expected_reads_geometry(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    g.dtype = DTYPE_BF16;
    g.block_size = 16;
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    assert_string_equal(kv_shm_pool_name(f->pool), f->name);
    unsigned char *a = kv_shm_pool_data(f->pool);
    assert_int_equal((uintptr_t)a % KV_SHM_DATA_ALIGN, 0);
    for (size_t i = 0; i < kv_pool_bytes(&g); i++)
        assert_int_equal(a[i], 0);

    assert_int_equal(kv_shm_pool_open(f->name, NULL, &f->other), 0);
    assert_true(kv_geometry_equal(kv_shm_pool_geometry(f->other), &g));
    unsigned char *b = kv_shm_pool_data(f->other);
    assert_ptr_not_equal(a, b);
    a[0] = 0x5a;
    a[kv_pool_bytes(&g) - 1] = 0xa5;
    assert_int_equal(b[0], 0x5a);
    assert_int_equal(b[kv_pool_bytes(&g) - 1], 0xa5);
}

/* Layer views point at the layer's place in the data, and a layer outside the pool is
 * refused. */
static void test_layer_view_range(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    struct kv_layer_view v;
    assert_int_equal(kv_shm_pool_layer_view(f->pool, 2, &v), 0);
    assert_ptr_equal(v.k, (char *)kv_shm_pool_data(f->pool) + 2 * kv_layer_bytes(&g));
    assert_int_equal(kv_shm_pool_layer_view(f->pool, 3, &v), PAGODA_ERANGE);
    expect_detail("layer 3");
    assert_int_equal(kv_shm_pool_layer_view(f->pool, -1, &v), PAGODA_ERANGE);
}

/* Each field of the geometry, when it differs from what the opener expects, is refused with
 * PAGODA_EMISMATCH and a detail that names the field and both values. */
static void test_open_refuses_each_geometry_mismatch(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    struct {
        struct kv_geometry want;
        const char *detail;
    } cases[7];
    for (int i = 0; i < 7; i++)
        cases[i].want = g;
    cases[0].want.pool_id = 43, cases[0].detail = "pool_id 42, expected 43";
    cases[1].want.num_layers = 4, cases[1].detail = "num_layers 3, expected 4";
    cases[2].want.num_blocks = 7, cases[2].detail = "num_blocks 6, expected 7";
    cases[3].want.block_size = 16, cases[3].detail = "block_size 8, expected 16";
    cases[4].want.num_kv_heads = 1, cases[4].detail = "num_kv_heads 2, expected 1";
    cases[5].want.head_dim = 128, cases[5].detail = "head_dim 16, expected 128";
    cases[6].want.dtype = DTYPE_BF16, cases[6].detail = "dtype F32, expected BF16";
    for (int i = 0; i < 7; i++) {
        char full[160];
        snprintf(full, sizeof(full), "kv pool %s: %s", f->name, cases[i].detail);
        pagoda_error_clear();
        struct kv_shm_pool *p = NULL;
        int rc = kv_shm_pool_open(f->name, &cases[i].want, &p);
        if (rc != PAGODA_EMISMATCH || p != NULL)
            fail_msg("case %s: rc %d", cases[i].detail, rc);
        expect_detail(full);
    }
    assert_int_equal(kv_shm_pool_open(f->name, &g, &f->other), 0);
}

/* A segment that is not a pool (random bytes, a wrong magic, another layout version, a
 * header with an impossible geometry) is refused with PAGODA_EFORMAT. */
static void test_open_refuses_what_is_not_a_pool(void **state)
{
    struct fixture *f = *state;
    struct kv_shm_pool *p = NULL;

    int fd = shm_open(f->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    unsigned char junk[8192];
    memset(junk, 0xa5, sizeof(junk));
    assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    close(fd);
    assert_int_equal(kv_shm_pool_open(f->name, NULL, &p), PAGODA_EFORMAT);
    expect_detail("not a kv pool");
    assert_null(p);
    assert_int_equal(shm_unlink(f->name), 0);

    struct kv_geometry g = test_geometry();
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    kv_shm_pool_close(f->pool);
    f->pool = NULL;
    size_t size;
    struct kv_shm_header *h = raw_map(f->name, &size);

    h->magic ^= 1;
    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_EFORMAT);
    expect_detail("magic");
    h->magic ^= 1;

    h->layout_version = KV_SHM_LAYOUT_VERSION + 1;
    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_EFORMAT);
    expect_detail("layout version 2, expected 1");
    h->layout_version = KV_SHM_LAYOUT_VERSION;

    h->block_size = 3;
    assert_int_equal(kv_shm_pool_open(f->name, NULL, &p), PAGODA_EFORMAT);
    expect_detail("block_size 3");
    h->block_size = g.block_size;

    h->data_bytes -= 4;
    assert_int_equal(kv_shm_pool_open(f->name, NULL, &p), PAGODA_EFORMAT);
    expect_detail("data_bytes");
    h->data_bytes += 4;

    /* repaired, it opens again: the checks above refused the damage, not the pool */
    assert_int_equal(kv_shm_pool_open(f->name, &g, &f->pool), 0);
    munmap(h, size);
}

/* A segment shorter than its header says (or than a header) is refused, and so is a longer
 * one: its header does not describe it. */
static void test_open_refuses_wrong_size(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    struct kv_shm_pool *p = NULL;
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    kv_shm_pool_close(f->pool);
    f->pool = NULL;
    off_t total = (off_t)(KV_SHM_DATA_ALIGN + kv_pool_bytes(&g));

    raw_truncate(f->name, total - 4096);
    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_EFORMAT);
    expect_detail("truncated");
    raw_truncate(f->name, total + 4096);
    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_EFORMAT);
    expect_detail("the header says");
    raw_truncate(f->name, 16);
    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_EFORMAT);
    expect_detail("truncated");
    assert_null(p);
}

/* A pool whose creator has not finished (an empty segment, or a full-size one whose ready
 * flag is not set) is refused with PAGODA_EBUSY, which a worker may retry. */
static void test_open_refuses_pool_not_ready(void **state)
{
    struct fixture *f = *state;
    struct kv_shm_pool *p = NULL;
    int fd = shm_open(f->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(kv_shm_pool_open(f->name, NULL, &p), PAGODA_EBUSY);
    expect_detail("not ready");
    assert_int_equal(shm_unlink(f->name), 0);

    struct kv_geometry g = test_geometry();
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    size_t size;
    struct kv_shm_header *h = raw_map(f->name, &size);
    atomic_store(&h->ready, 0);
    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_EBUSY);
    expect_detail("not ready");
    atomic_store(&h->ready, 0x12345678u);
    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_EFORMAT);
    atomic_store(&h->ready, KV_SHM_READY);
    assert_int_equal(kv_shm_pool_open(f->name, &g, &f->other), 0);
    munmap(h, size);
}

/* After unlink nothing named like the pool remains in /dev/shm, opening gives PAGODA_ENOENT,
 * and a mapping made before the unlink keeps working. */
static void test_unlink_removes_the_name(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    struct kv_shm_pool *p = NULL;
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    assert_true(name_exists(f->name));
    assert_int_equal(kv_shm_pool_unlink(f->name), 0);
    assert_false(name_exists(f->name));
    assert_int_equal(errno, ENOENT);

    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_ENOENT);
    expect_detail(f->name);
    assert_null(p);
    assert_int_equal(kv_shm_pool_unlink(f->name), PAGODA_ENOENT);

    float *data = kv_shm_pool_data(f->pool);
    data[0] = 1.5f;
    assert_true(data[0] == 1.5f);
    /* the name is free again */
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->other), 0);
    assert_true(((float *)kv_shm_pool_data(f->other))[0] == 0.0f);
}

/* A segment under the pool's name that others may access, or that another user owns, is
 * refused whatever its header says: /dev/shm is writable by everyone and the name predictable. */
static void test_open_refuses_a_segment_not_ours(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    struct kv_shm_pool *p = NULL;
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    int fd = shm_open(f->name, O_RDWR, 0);
    assert_true(fd >= 0);
    assert_int_equal(fchmod(fd, 0666), 0);
    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_EPERM);
    expect_detail("mode 666");
    assert_null(p);
    assert_int_equal(fchmod(fd, 0600), 0);
    assert_int_equal(kv_shm_pool_open(f->name, &g, &p), 0);
    kv_shm_pool_close(p);
    p = NULL;
    if (geteuid() == 0) {
        assert_int_equal(fchown(fd, 65534, 65534), 0);
        assert_int_equal(kv_shm_pool_open(f->name, &g, &p), PAGODA_EPERM);
        expect_detail("owned by uid 65534");
        assert_null(p);
    }
    close(fd);
}

/* Creating a name that exists fails with PAGODA_EEXIST and leaves what is there alone, be it
 * a pool or some other segment. */
static void test_create_existing_name_fails(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    struct kv_shm_pool *p = NULL;
    assert_int_equal(kv_shm_pool_create(f->name, &g, &f->pool), 0);
    ((float *)kv_shm_pool_data(f->pool))[5] = 3.0f;
    assert_int_equal(kv_shm_pool_create(f->name, &g, &p), PAGODA_EEXIST);
    expect_detail(f->name);
    assert_null(p);
    assert_true(name_exists(f->name));
    assert_int_equal(kv_shm_pool_open(f->name, &g, &f->other), 0);
    assert_true(((float *)kv_shm_pool_data(f->other))[5] == 3.0f);
    kv_shm_pool_close(f->pool);
    kv_shm_pool_close(f->other);
    f->pool = f->other = NULL;
    assert_int_equal(kv_shm_pool_unlink(f->name), 0);

    int fd = shm_open(f->name, O_RDWR | O_CREAT | O_EXCL, 0600);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(kv_shm_pool_create(f->name, &g, &p), PAGODA_EEXIST);
    assert_true(name_exists(f->name));
}

/* Names must be '/' and a bounded file name; geometries must be valid. Nothing is left behind
 * by a refused create. */
static void test_create_refuses_bad_input(void **state)
{
    struct fixture *f = *state;
    struct kv_geometry g = test_geometry();
    struct kv_shm_pool *p = NULL;
    char long_name[KV_SHM_NAME_MAX + 2];
    long_name[0] = '/';
    memset(long_name + 1, 'a', KV_SHM_NAME_MAX);
    long_name[KV_SHM_NAME_MAX + 1] = '\0';
    const char *bad[] = {NULL, "", "/", "no-slash", "/a/b", "/.", "/..", "/sp ace", long_name};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        if (kv_shm_pool_create(bad[i], &g, &p) != PAGODA_EINVAL ||
            kv_shm_pool_open(bad[i], &g, &p) != PAGODA_EINVAL ||
            kv_shm_pool_unlink(bad[i]) != PAGODA_EINVAL)
            fail_msg("name %s accepted", bad[i] ? bad[i] : "(null)");
        assert_null(p);
    }
    long_name[KV_SHM_NAME_MAX] = '\0'; /* exactly KV_SHM_NAME_MAX bytes is allowed */
    assert_int_equal(kv_shm_pool_open(long_name, &g, &p), PAGODA_ENOENT);

    g.block_size = 4;
    assert_int_equal(kv_shm_pool_create(f->name, &g, &p), PAGODA_ERANGE);
    expect_detail("block_size");
    assert_null(p);
    assert_false(name_exists(f->name));
    assert_int_equal(kv_shm_pool_create(f->name, NULL, &p), PAGODA_EINVAL);
    assert_false(name_exists(f->name));
}

/* A pool larger than the shared memory file system is refused at create, with
 * PAGODA_EEXHAUSTED, instead of faulting later, and its name is removed. */
static void test_create_too_large_is_refused(void **state)
{
    struct fixture *f = *state;
    struct statvfs vfs;
    assert_int_equal(statvfs("/dev/shm", &vfs), 0);
    uint64_t fs_bytes = (uint64_t)vfs.f_blocks * vfs.f_frsize;
    if (fs_bytes == 0 || fs_bytes > (UINT64_C(1) << 44))
        skip(); /* an unlimited /dev/shm would try to really reserve the memory */
    /* 64 KiB per (layer, block): 2 x 8 heads x 16 slots x 128 x 2 bytes */
    uint64_t blocks = 2 * fs_bytes / 65536 + 1;
    struct kv_geometry g = {.pool_id = 1,
                            .num_layers = (int32_t)(blocks / INT32_MAX + 1),
                            .num_blocks = (int32_t)(blocks < INT32_MAX ? blocks : INT32_MAX),
                            .block_size = 16,
                            .num_kv_heads = 8,
                            .head_dim = 128,
                            .dtype = DTYPE_BF16};
    struct kv_shm_pool *p = NULL;
    assert_int_equal(kv_shm_pool_create(f->name, &g, &p), PAGODA_EEXHAUSTED);
    expect_detail("cannot reserve");
    assert_null(p);
    assert_false(name_exists(f->name));
}

int main(void)
{
#define T(fn) cmocka_unit_test_setup_teardown(fn, setup, teardown)
    const struct CMUnitTest tests[] = {
        T(test_second_process_sees_writes),
        T(test_second_process_with_other_geometry_is_refused),
        T(test_pool_outlives_its_creator),
        T(test_open_without_expected_reads_geometry),
        T(test_layer_view_range),
        T(test_open_refuses_each_geometry_mismatch),
        T(test_open_refuses_what_is_not_a_pool),
        T(test_open_refuses_wrong_size),
        T(test_open_refuses_pool_not_ready),
        T(test_unlink_removes_the_name),
        T(test_open_refuses_a_segment_not_ours),
        T(test_create_existing_name_fails),
        T(test_create_refuses_bad_input),
        T(test_create_too_large_is_refused),
    };
#undef T
    return cmocka_run_group_tests(tests, NULL, NULL);
}
