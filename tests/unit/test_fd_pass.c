/* common/fd_pass.h: one message with descriptors on a SOCK_SEQPACKET socket pair, taken whole or
 * not at all, and no descriptor left open by a message that does not fit. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "common/fd_pass.h"
#include "tests/unit/proc_fds.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

/* A memfd holding value. */
static int memfd_with(int value)
{
    int fd = memfd_create("test_fd_pass", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, &value, sizeof(value), 0), (ssize_t)sizeof(value));
    return fd;
}

static int memfd_value(int fd)
{
    int value = -1;
    assert_int_equal(pread(fd, &value, sizeof(value), 0), (ssize_t)sizeof(value));
    return value;
}

static void pair(int sv[2])
{
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
}

static void test_message_and_descriptors_arrive(void **state)
{
    (void)state;
    int sv[2], fds[3] = {memfd_with(7), memfd_with(8), memfd_with(9)};
    pair(sv);
    assert_int_equal(fd_pass_send(sv[0], "hello", 5, fds, 3, 0, "test"), 0);
    char buf[16];
    size_t len = 0;
    int got[4], n = 0;
    assert_int_equal(fd_pass_recv(sv[1], buf, sizeof(buf), &len, got, 4, &n, 0, "test"), 0);
    assert_int_equal(len, 5);
    assert_memory_equal(buf, "hello", 5);
    assert_int_equal(n, 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(memfd_value(got[i]), 7 + i);
        assert_int_equal(fcntl(got[i], F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);
    }
    fd_pass_close(got, n);
    assert_int_equal(got[0], -1);
    fd_pass_close(fds, 3);
    /* Nothing more waits; then the peer closes. */
    assert_int_equal(fd_pass_recv(sv[1], buf, sizeof(buf), &len, got, 4, &n, MSG_DONTWAIT, "test"),
                     PAGODA_ETIMEDOUT);
    close(sv[0]);
    assert_int_equal(fd_pass_recv(sv[1], buf, sizeof(buf), &len, got, 4, &n, 0, "test"),
                     PAGODA_ECLOSED);
    close(sv[1]);
}

/* Too many bytes, or too many descriptors: refused, and every descriptor it carried closed. */
static void test_what_does_not_fit_is_refused_and_closed(void **state)
{
    (void)state;
    int sv[2], fds[3] = {memfd_with(1), memfd_with(2), memfd_with(3)};
    pair(sv);
    int before = proc_fds(getpid());
    assert_true(before > 0);
    char big[64] = {0}, buf[16];
    size_t len = 0;
    int got[4], n = 0;
    assert_int_equal(fd_pass_send(sv[0], big, sizeof(big), fds, 3, 0, "test"), 0);
    assert_int_equal(fd_pass_recv(sv[1], buf, sizeof(buf), &len, got, 4, &n, 0, "test"),
                     PAGODA_EPROTO);
    assert_int_equal(n, 0);
    assert_non_null(strstr(pagoda_error_detail(), "does not fit"));
    assert_int_equal(proc_fds(getpid()), before);
    assert_int_equal(fd_pass_send(sv[0], "x", 1, fds, 3, 0, "test"), 0);
    assert_int_equal(fd_pass_recv(sv[1], buf, sizeof(buf), &len, got, 2, &n, 0, "test"),
                     PAGODA_EPROTO);
    assert_int_equal(n, 0);
    assert_int_equal(proc_fds(getpid()), before);
    /* The socket goes on: the next message arrives whole. */
    assert_int_equal(fd_pass_send(sv[0], "ok", 2, fds, 1, 0, "test"), 0);
    assert_int_equal(fd_pass_recv(sv[1], buf, sizeof(buf), &len, got, 2, &n, 0, "test"), 0);
    assert_int_equal(n, 1);
    assert_int_equal(memfd_value(got[0]), 1);
    fd_pass_close(got, n);
    fd_pass_close(fds, 3);
    close(sv[0]);
    close(sv[1]);
}

/* A peer that closes with messages of ours unread: Linux reports a reset first, then the
 * messages it sent before, then the end. */
static void test_reset_comes_before_queued_messages(void **state)
{
    (void)state;
    int sv[2], fd = memfd_with(5);
    pair(sv);
    assert_int_equal(fd_pass_send(sv[0], "unread", 6, NULL, 0, 0, "test"), 0);
    assert_int_equal(fd_pass_send(sv[1], "last", 4, &fd, 1, 0, "test"), 0);
    close(sv[1]);
    char buf[16];
    size_t len = 0;
    int got[2], n = 0;
    int rc = fd_pass_recv(sv[0], buf, sizeof(buf), &len, got, 2, &n, MSG_DONTWAIT, "test");
    if (rc == PAGODA_EIO) /* the reset */
        rc = fd_pass_recv(sv[0], buf, sizeof(buf), &len, got, 2, &n, MSG_DONTWAIT, "test");
    assert_int_equal(rc, 0);
    assert_int_equal(len, 4);
    assert_int_equal(n, 1);
    assert_int_equal(memfd_value(got[0]), 5);
    fd_pass_close(got, n);
    assert_int_equal(fd_pass_recv(sv[0], buf, sizeof(buf), &len, got, 2, &n, 0, "test"),
                     PAGODA_ECLOSED);
    close(fd);
    close(sv[0]);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    int sv[2];
    pair(sv);
    assert_int_equal(fd_pass_send(sv[0], "x", 1, NULL, 1, 0, "test"), PAGODA_EINVAL);
    assert_int_equal(fd_pass_send(sv[0], "x", 1, NULL, FD_PASS_MAX_FDS + 1, 0, "test"),
                     PAGODA_EINVAL);
    char buf[4];
    size_t len;
    int got[1], n;
    assert_int_equal(fd_pass_recv(sv[1], buf, sizeof(buf), &len, got, FD_PASS_MAX_FDS + 1, &n,
                                  MSG_DONTWAIT, "test"),
                     PAGODA_EINVAL);
    close(sv[1]);
    assert_int_equal(fd_pass_send(sv[0], "x", 1, NULL, 0, 0, "test"), PAGODA_ECLOSED);
    close(sv[0]);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_message_and_descriptors_arrive),
        cmocka_unit_test(test_what_does_not_fit_is_refused_and_closed),
        cmocka_unit_test(test_reset_comes_before_queued_messages),
        cmocka_unit_test(test_bad_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
