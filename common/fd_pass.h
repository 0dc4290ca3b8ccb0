/* One message with file descriptors attached (SCM_RIGHTS) on a Unix socket of SOCK_SEQPACKET
 * (or SOCK_DGRAM): the one place pagoda builds and takes apart such messages. kvpool hands a GPU
 * pool's descriptors to workers with it (kvpool/cuda_pool.h), deposits them with its supervisor
 * and takes them back after a restart (deploy/keeper.h).
 *
 * A message is taken whole or not at all: one whose bytes or descriptors did not fit the
 * receiver's room is refused (PAGODA_EPROTO), and every descriptor it carried is closed, so a
 * peer cannot leak descriptors into the receiver. Received descriptors are close-on-exec. */
#ifndef PAGODA_COMMON_FD_PASS_H
#define PAGODA_COMMON_FD_PASS_H

#include <stddef.h>

/* The most descriptors one message carries (the kernel's SCM_MAX_FD is 253). */
#define FD_PASS_MAX_FDS 253

/* Sends len bytes with n descriptors (0 to FD_PASS_MAX_FDS) as one message; flags as send(2)'s
 * (MSG_NOSIGNAL is added). 0, or PAGODA_ETIMEDOUT when the socket would block or its timeout
 * ran out, PAGODA_ECLOSED when the peer is gone, PAGODA_EIO otherwise (with a detail naming
 * what, the caller's words). The caller's descriptors stay its own. */
int fd_pass_send(int sock, const void *buf, size_t len, const int *fds, int n, int flags,
                 const char *what);

/* Receives one message: its bytes into buf (cap of them; *len their count) and its descriptors
 * into fds (max of them, at most FD_PASS_MAX_FDS; *n their count). flags as recv(2)'s
 * (MSG_DONTWAIT). 0; PAGODA_ETIMEDOUT when nothing waits (or the timeout ran out);
 * PAGODA_ECLOSED at the end of the stream (the peer closed; a message of no bytes and no
 * descriptors reads the same, so none is ever sent); PAGODA_EPROTO for a message larger than cap
 * or with more descriptors than max (then nothing is kept); PAGODA_EIO otherwise, a reset
 * included (Linux reports a peer that closed with messages unread before the messages it sent:
 * reading on finds them). On any failure *n is 0 and no descriptor stays open. */
int fd_pass_recv(int sock, void *buf, size_t cap, size_t *len, int *fds, int max, int *n, int flags,
                 const char *what);

/* Raises this process's soft limit on open descriptors to its hard limit (a process that holds
 * many: the router's connections, the supervisor's kept pools); logs a failure. */
void fd_limit_raise(void);

/* Closes n descriptors and sets each entry to -1. */
void fd_pass_close(int *fds, int n);

#endif
