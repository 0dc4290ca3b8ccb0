#include "common/fd_pass.h"
#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

union fd_control {
    char buf[CMSG_SPACE(FD_PASS_MAX_FDS * sizeof(int))];
    struct cmsghdr align;
};

static int io_error(int err, const char *doing, const char *what)
{
    int code = (err == EAGAIN || err == EWOULDBLOCK)                    ? PAGODA_ETIMEDOUT
               : (err == EPIPE || err == ECONNRESET || err == ENOTCONN) ? PAGODA_ECLOSED
                                                                        : PAGODA_EIO;
    return pagoda_error_set(code, "%s %s: %s", doing, what, strerror(err));
}

int fd_pass_send(int sock, const void *buf, size_t len, const int *fds, int n, int flags,
                 const char *what)
{
    if (n < 0 || n > FD_PASS_MAX_FDS || (n > 0 && fds == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "sending %s: %d descriptors (at most %d)", what, n,
                                FD_PASS_MAX_FDS);
    union fd_control control;
    memset(&control, 0, sizeof(control));
    struct iovec iov = {(void *)buf, len};
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    if (n > 0) {
        msg.msg_control = control.buf;
        msg.msg_controllen = CMSG_SPACE((size_t)n * sizeof(int));
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN((size_t)n * sizeof(int));
        memcpy(CMSG_DATA(c), fds, (size_t)n * sizeof(int));
    }
    ssize_t sent = sendmsg(sock, &msg, flags | MSG_NOSIGNAL);
    if (sent < 0)
        return io_error(errno, "sending", what);
    if ((size_t)sent != len)
        return pagoda_error_set(PAGODA_EIO, "sending %s: %zd of %zu bytes sent", what, sent, len);
    return 0;
}

void fd_pass_close(int *fds, int n)
{
    for (int i = 0; i < n; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
        fds[i] = -1;
    }
}

int fd_pass_recv(int sock, void *buf, size_t cap, size_t *len, int *fds, int max, int *n, int flags,
                 const char *what)
{
    *n = 0;
    *len = 0;
    if (max < 0 || max > FD_PASS_MAX_FDS)
        return pagoda_error_set(PAGODA_EINVAL, "receiving %s: room for %d descriptors", what, max);
    union fd_control control;
    struct iovec iov = {buf, cap};
    struct msghdr msg;
    memset(&msg, 0, sizeof(msg));
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.buf;
    msg.msg_controllen = sizeof(control.buf);
    ssize_t got = recvmsg(sock, &msg, flags | MSG_CMSG_CLOEXEC);
    if (got < 0 && errno == ECONNRESET)
        return pagoda_error_set(PAGODA_EIO,
                                "receiving %s: the peer reset the connection (the messages it "
                                "sent before may follow)",
                                what);
    if (got < 0)
        return io_error(errno, "receiving", what);
    /* Every descriptor that arrived, kept or closed below. */
    int all[FD_PASS_MAX_FDS], count = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&msg); c != NULL; c = CMSG_NXTHDR(&msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (count < FD_PASS_MAX_FDS)
                all[count++] = fd;
            else
                close(fd);
        }
    }
    if (got == 0 && count == 0 && cap > 0)
        return pagoda_error_set(PAGODA_ECLOSED, "receiving %s: the peer closed the socket", what);
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || count > max) {
        fd_pass_close(all, count);
        return pagoda_error_set(PAGODA_EPROTO,
                                "receiving %s: a message of %zd bytes%s with %d descriptor(s)%s "
                                "does not fit (room for %zu bytes and %d descriptors)",
                                what, got, (msg.msg_flags & MSG_TRUNC) ? " or more" : "", count,
                                (msg.msg_flags & MSG_CTRUNC) ? " or more (or this process is out "
                                                               "of descriptors)"
                                                             : "",
                                cap, max);
    }
    memcpy(fds, all, (size_t)count * sizeof(int));
    *n = count;
    *len = (size_t)got;
    return 0;
}

void fd_limit_raise(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            log_warn("could not raise the descriptor limit to %llu",
                     (unsigned long long)rl.rlim_max);
    }
}
