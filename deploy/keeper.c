#include "deploy/keeper.h"
#include "common/error.h"
#include "common/log.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void keeper_init(struct keeper *k, const char *name)
{
    memset(k, 0, sizeof(*k));
    k->name = name;
    k->link = -1;
    for (int i = 0; i < KEEPER_MAX_FDS; i++)
        k->fds[i] = -1;
}

/* Lets go of what is held. */
static void drop(struct keeper *k)
{
    fd_pass_close(k->fds, k->num_fds);
    k->num_fds = 0;
    k->len = 0;
}

int keeper_collect(struct keeper *k)
{
    if (k->link < 0)
        return 0;
    int taken = 0;
    for (int reads = 0; reads < KEEPER_MAX_READS; reads++) {
        unsigned char msg[KEEPER_MAX_BYTES];
        int fds[KEEPER_MAX_FDS], n = 0;
        size_t len = 0;
        char text[700];
        int rc = fd_pass_recv(k->link, msg, sizeof(msg), &len, fds, KEEPER_MAX_FDS, &n,
                              MSG_DONTWAIT, "a deposit");
        if (rc == PAGODA_ETIMEDOUT || rc == PAGODA_ECLOSED)
            break;
        if (rc != 0) {
            /* A malformed deposit (its descriptors closed), or a reset, which Linux reports
             * before the messages still queued: read on. */
            log_warn("%s: %s; ignored (still holding %d descriptor(s))", k->name,
                     pagoda_error_message(rc, text, sizeof(text)), k->num_fds);
            continue;
        }
        if (n == 0) {
            /* The kvpool refused what it was offered: let go of it. */
            if (k->num_fds > 0)
                log_info("%s refused the pool it was offered: letting go of it (%d "
                         "descriptor(s))",
                         k->name, k->num_fds);
            drop(k);
            continue;
        }
        drop(k);
        memcpy(k->msg, msg, len);
        k->len = len;
        memcpy(k->fds, fds, (size_t)n * sizeof(int));
        k->num_fds = n;
        taken++;
        log_info("%s deposited its pool's %d descriptor(s): kept for the next %s", k->name, n,
                 k->name);
    }
    return taken;
}

int keeper_open_link(struct keeper *k, int *child_fd)
{
    *child_fd = -1;
    keeper_close_link(k);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return pagoda_error_set(PAGODA_EIO, "socketpair for %s's keeper link: %s", k->name,
                                strerror(errno));
    k->link = sv[0];
    *child_fd = sv[1];
    if (k->num_fds > 0) {
        int rc = fd_pass_send(k->link, k->msg, k->len, k->fds, k->num_fds, MSG_DONTWAIT,
                              "the kept pool");
        if (rc != 0) {
            char text[700];
            log_warn("%s: %s; it starts without it", k->name,
                     pagoda_error_message(rc, text, sizeof(text)));
        } else {
            log_info("offering %s the pool its predecessor deposited (%d descriptor(s))", k->name,
                     k->num_fds);
        }
    }
    return 0;
}

void keeper_close_link(struct keeper *k)
{
    if (k->link < 0)
        return;
    keeper_collect(k);
    close(k->link);
    k->link = -1;
}

void keeper_release(struct keeper *k)
{
    keeper_close_link(k);
    if (k->num_fds > 0)
        log_info("letting go of %s's pool (%d descriptor(s))", k->name, k->num_fds);
    drop(k);
}
