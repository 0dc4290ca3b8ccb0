/* Tests of comm/comm_file.c and worker/tp_proc.c: ranks that are processes meet in a group
 * file (the collectives work across them), a stale, malformed or mis-sized file, or one another
 * user may write, is refused with a clear error, a waiting rank sees its peer's death, the ranks
 * agree or all refuse, and the group's pool identity follows every rank's pool. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "comm/comm_file.h"
#include "common/error.h"
#include "worker/tp_proc.h"

#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define TIMEOUT_MS 2000

static char dir[] = "/tmp/pagoda-tp-proc-XXXXXX";
static char path[sizeof(dir) + 16];

static int setup(void **state)
{
    (void)state;
    if (mkdtemp(dir) == NULL)
        return -1;
    snprintf(path, sizeof(path), "%s/group", dir);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(path);
    rmdir(dir);
    return 0;
}

/* Child: joins as rank 1 and adds its rank + 1 to a sum; exits 0 when the sum is right. */
static void child_rank1(int size)
{
    struct comm_file *f = NULL;
    if (comm_file_open(path, 1, size, TIMEOUT_MS, NULL, NULL, &f) != 0)
        _exit(10);
    float v = 2.0f;
    int rc = comm_all_reduce_sum(comm_file_comm(f), &v, 1, DTYPE_F32);
    comm_file_close(f);
    _exit(rc == 0 && v == 3.0f ? 0 : 11);
}

static int child_status(pid_t pid)
{
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100 + WTERMSIG(st);
}

static void test_two_processes_and_stale(void **state)
{
    (void)state;
    assert_int_equal(comm_file_create(path, 2), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        child_rank1(2); /* waits for rank 0's region first */
    usleep(20000);
    struct comm_file *f = NULL;
    assert_int_equal(comm_file_open(path, 0, 2, TIMEOUT_MS, NULL, NULL, &f), 0);
    float v = 1.0f;
    assert_int_equal(comm_all_reduce_sum(comm_file_comm(f), &v, 1, DTYPE_F32), 0);
    assert_true(v == 3.0f);
    assert_int_equal(child_status(pid), 0);
    assert_int_equal(comm_file_pid(f, 1), pid);
    comm_file_close(f);

    /* The file served one start: every place is claimed, the region made. */
    struct comm_file *g = NULL;
    assert_int_equal(comm_file_open(path, 0, 2, TIMEOUT_MS, NULL, NULL, &g), PAGODA_EEXIST);
    assert_non_null(strstr(pagoda_error_detail(), "stale"));
    assert_int_equal(comm_file_open(path, 1, 2, TIMEOUT_MS, NULL, NULL, &g), PAGODA_EEXIST);
    assert_non_null(strstr(pagoda_error_detail(), "rank 1's place was claimed"));
    /* A fresh file serves again. */
    assert_int_equal(comm_file_create(path, 2), 0);
    assert_int_equal(comm_file_open(path, 0, 2, TIMEOUT_MS, NULL, NULL, &g), 0);
    comm_file_close(g);
}

static void test_malformed_and_mismatched(void **state)
{
    (void)state;
    struct comm_file *f = NULL;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "not a group file", 16), 16);
    close(fd);
    assert_int_equal(comm_file_open(path, 0, 2, TIMEOUT_MS, NULL, NULL, &f), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "not a tensor-parallel group file"));
    fd = open(path, O_WRONLY | O_TRUNC);
    assert_true(fd >= 0);
    static char junk[32768];
    memset(junk, 0x5a, sizeof(junk));
    assert_int_equal(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    close(fd);
    assert_int_equal(comm_file_open(path, 1, 2, TIMEOUT_MS, NULL, NULL, &f), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), "bad magic"));
    assert_int_equal(comm_file_create(path, 4), 0);
    assert_int_equal(comm_file_open(path, 0, 2, TIMEOUT_MS, NULL, NULL, &f), PAGODA_EMISMATCH);
    assert_non_null(strstr(pagoda_error_detail(), "made for 4 ranks"));
    assert_int_equal(comm_file_open("/nonexistent/group", 0, 2, TIMEOUT_MS, NULL, NULL, &f),
                     PAGODA_ENOENT);
}

/* A group file another user may write (group or other write bits, another owner) is refused
 * before anything in it is read or claimed. */
static void test_foreign_file(void **state)
{
    (void)state;
    struct comm_file *f = NULL;
    assert_int_equal(comm_file_create(path, 2), 0);
    assert_int_equal(chmod(path, 0622), 0);
    assert_int_equal(comm_file_open(path, 0, 2, TIMEOUT_MS, NULL, NULL, &f), PAGODA_EPERM);
    assert_non_null(strstr(pagoda_error_detail(), "writable by other users"));
    assert_int_equal(chmod(path, 0600), 0);
    /* Root can give the file away (the usual user cannot: the owner check is then moot, as
     * such a file could not be made in the caller's directory by another user either). */
    if (geteuid() == 0 && chown(path, 65534, 65534) == 0) {
        assert_int_equal(comm_file_open(path, 0, 2, TIMEOUT_MS, NULL, NULL, &f), PAGODA_EPERM);
        assert_non_null(strstr(pagoda_error_detail(), "is owned by uid 65534"));
    }
    /* Nothing was claimed: the file, made private again, is fresh. */
    assert_int_equal(chown(path, geteuid(), getegid()), 0);
    assert_int_equal(comm_file_open(path, 0, 2, TIMEOUT_MS, NULL, NULL, &f), 0);
    comm_file_close(f);
}

/* A rank waiting for a peer's phase learns of its death (no deadline otherwise). */
static void test_dead_peer_ends_wait(void **state)
{
    (void)state;
    assert_int_equal(comm_file_create(path, 2), 0);
    struct comm_file *f = NULL;
    assert_int_equal(comm_file_open(path, 0, 2, TIMEOUT_MS, NULL, NULL, &f), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct comm_file *c = NULL;
        if (comm_file_open(path, 1, 2, TIMEOUT_MS, NULL, NULL, &c) != 0)
            _exit(10);
        pause(); /* killed below, having published nothing */
        _exit(0);
    }
    while (comm_file_pid(f, 1) != pid)
        usleep(1000);
    kill(pid, SIGKILL);
    assert_int_equal(child_status(pid), 100 + SIGKILL);
    assert_int_equal(comm_file_wait(f, 1, 1, NULL, 0, NULL, NULL), PAGODA_ECLOSED);
    assert_non_null(strstr(pagoda_error_detail(), "exited"));
    comm_file_close(f);
}

static int stop_now(void *ctx)
{
    (void)ctx;
    return 0;
}

/* Rank 1 alone: keep_waiting ends its wait for rank 0's region. */
static void test_keep_waiting_ends_wait(void **state)
{
    (void)state;
    assert_int_equal(comm_file_create(path, 2), 0);
    struct comm_file *f = NULL;
    assert_int_equal(comm_file_open(path, 1, 2, TIMEOUT_MS, stop_now, NULL, &f), PAGODA_ECLOSED);
}

static struct tp_proc_member member(int rank, uint64_t pool_id)
{
    struct tp_proc_member m = {.rank = rank,
                               .size = 2,
                               .num_layers = 2,
                               .num_blocks = 64,
                               .block_size = 16,
                               .num_kv_heads = 1,
                               .head_dim = 8,
                               .max_num_tokens = 256,
                               .max_num_seqs = 8,
                               .max_blocks_per_seq = 63,
                               .pool_id = pool_id};
    snprintf(m.backend, sizeof(m.backend), "cpu");
    return m;
}

static void test_compare(void **state)
{
    (void)state;
    struct tp_proc_member m[2] = {member(0, 7), member(1, 9)};
    assert_int_equal(tp_proc_compare(m, 2), 0);
    m[1].num_blocks = 65;
    assert_int_equal(tp_proc_compare(m, 2), PAGODA_EMISMATCH);
    assert_non_null(strstr(pagoda_error_detail(), "block count"));
    m[1] = member(1, 9);
    m[1].fingerprint[3] = 1;
    assert_int_equal(tp_proc_compare(m, 2), PAGODA_EMISMATCH);
    assert_non_null(strstr(pagoda_error_detail(), "different models"));
    m[1] = member(1, 9);
    m[1].max_num_seqs = 9;
    assert_int_equal(tp_proc_compare(m, 2), PAGODA_EMISMATCH);
    assert_non_null(strstr(pagoda_error_detail(), "--max-seqs"));
    m[1] = member(1, 9);
    m[1].layout = m[0].layout + 1; /* a rank of another build */
    m[1].fingerprint[3] = 1;       /* which would read as another model */
    assert_int_equal(tp_proc_compare(m, 2), PAGODA_EMISMATCH);
    assert_non_null(strstr(pagoda_error_detail(), "different pagoda builds"));
}

/* NCCL only when rank 0 asked for it, every rank's build has it and no two ranks share a GPU;
 * the refusals say why, and the cpu group of a group that never asked says nothing. */
static void test_use_nccl(void **state)
{
    (void)state;
    char why[160];
    struct tp_proc_member m[3] = {member(0, 7), member(1, 9), member(2, 11)};
    for (int r = 0; r < 3; r++) {
        m[r].nccl_capable = 1;
        m[r].has_device = 1;
        memset(m[r].device_uuid, 0x10 + r, sizeof(m[r].device_uuid));
    }
    assert_int_equal(tp_proc_use_nccl(m, 3, why, sizeof(why)), 0); /* rank 0 did not ask */
    assert_string_equal(why, "");
    m[0].nccl = 1;
    assert_int_equal(tp_proc_use_nccl(m, 3, why, sizeof(why)), 1);
    assert_string_equal(why, "");
    m[2].nccl_capable = 0;
    assert_int_equal(tp_proc_use_nccl(m, 3, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "rank 2's build has no NCCL"));
    m[2].nccl_capable = 1;
    m[2].device_uuid[15] = 0x11; /* rank 2's UUID: 0x12.. with the last byte of rank 1's */
    assert_int_equal(tp_proc_use_nccl(m, 3, why, sizeof(why)), 1);
    memcpy(m[2].device_uuid, m[1].device_uuid, sizeof(m[1].device_uuid));
    assert_int_equal(tp_proc_use_nccl(m, 3, why, sizeof(why)), 0);
    assert_non_null(strstr(why, "ranks 1 and 2 share a GPU"));
    m[1].has_device = 0; /* a rank without a GPU shares nothing */
    assert_int_equal(tp_proc_use_nccl(m, 3, why, sizeof(why)), 1);
}

static void test_group_pool_id(void **state)
{
    (void)state;
    uint64_t one = 0x1234;
    assert_true(tp_proc_group_pool_id(&one, 1) == 0x1234);
    uint64_t a[2] = {0x1234, 0x5678}, b[2] = {0x1234, 0x5679}, c[2] = {0x1235, 0x5678};
    uint64_t ia = tp_proc_group_pool_id(a, 2);
    assert_true(ia != 0);
    assert_true(ia == tp_proc_group_pool_id(a, 2));
    assert_true(ia != tp_proc_group_pool_id(b, 2));
    assert_true(ia != tp_proc_group_pool_id(c, 2));
}

/* Two processes join through tp_proc: they agree, or both refuse a disagreement. */
static void test_join(void **state)
{
    (void)state;
    for (int bad = 0; bad < 2; bad++) {
        assert_int_equal(comm_file_create(path, 2), 0);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            struct tp_proc_options o = {
                .path = path, .rank = 1, .size = 2, .timeout_ms = TIMEOUT_MS};
            struct tp_proc_member m = member(1, 9);
            m.max_num_tokens = bad ? 512 : 256;
            struct tp_proc *t = NULL;
            int rc = tp_proc_join(&o, &m, &t);
            if (rc == 0)
                rc = tp_proc_loaded(t, NULL, NULL);
            tp_proc_close(t);
            _exit(rc == 0 ? 0 : rc == PAGODA_EMISMATCH ? 20 : 21);
        }
        struct tp_proc_options o = {.path = path, .rank = 0, .size = 2, .timeout_ms = TIMEOUT_MS};
        struct tp_proc_member m = member(0, 7);
        struct tp_proc *t = NULL;
        int rc = tp_proc_join(&o, &m, &t);
        if (!bad) {
            assert_int_equal(rc, 0);
            uint64_t ids[2] = {7, 9};
            assert_true(tp_proc_pool_id(t) == tp_proc_group_pool_id(ids, 2));
            assert_int_equal(tp_proc_loaded(t, NULL, NULL), 0);
            assert_int_equal(child_status(pid), 0);
        } else {
            assert_int_equal(rc, PAGODA_EMISMATCH);
            assert_non_null(strstr(pagoda_error_detail(), "--max-batched-tokens"));
            assert_int_equal(child_status(pid), 20);
        }
        tp_proc_close(t);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_two_processes_and_stale),
        cmocka_unit_test(test_malformed_and_mismatched),
        cmocka_unit_test(test_foreign_file),
        cmocka_unit_test(test_dead_peer_ends_wait),
        cmocka_unit_test(test_keep_waiting_ends_wait),
        cmocka_unit_test(test_compare),
        cmocka_unit_test(test_use_nccl),
        cmocka_unit_test(test_group_pool_id),
        cmocka_unit_test(test_join),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
