/* What pagoda-supervisor keeps for a kvpool across its restarts: the descriptors of a GPU pool.
 *
 * A GPU KV pool (kvpool/cuda_pool.h) lives while any process holds a descriptor of it. A kvpool
 * killed with SIGKILL takes its own with it; the worker that maps the pool keeps it alive, but a
 * kvpool started after it could not reach it and would make a second pool (or, sized by
 * default, find no memory left and stop the group). So each kvpool gets a keeper link (one end
 * of a SOCK_SEQPACKET socket pair, WIRE_KVPOOL_KEEPER_ENV in wire.h) on which it deposits its
 * pool's descriptors; the supervisor holds the newest deposit and offers it, as it came, to the
 * next kvpool it starts for that slot, which adopts the pool: the same identity and the same KV,
 * as a CPU kvpool re-adopts its shared memory by name. The keeper knows nothing of CUDA: a
 * deposit is one message of at most KEEPER_MAX_BYTES with 1 to KEEPER_MAX_FDS descriptors. A
 * message without descriptors says that the kvpool refused what it was offered (another geometry,
 * a failed import): the keeper lets go of it, so that the pool it holds does not stand in the way
 * of the new one.
 *
 * The memory is the supervisor's to hold until the group stops: keeper_release at the end. All
 * of it runs on the supervisor's loop and never blocks (the socket is read and written with
 * MSG_DONTWAIT; an offer fits an empty socket's buffer). */
#ifndef PAGODA_DEPLOY_KEEPER_H
#define PAGODA_DEPLOY_KEEPER_H

#include "common/fd_pass.h"

#include <stddef.h>

#define KEEPER_MAX_BYTES 1024
#define KEEPER_MAX_FDS FD_PASS_MAX_FDS
/* Messages read in one keeper_collect: a kvpool sends one or two; a runaway one cannot hold the
 * supervisor's loop. */
#define KEEPER_MAX_READS 16

struct keeper {
    const char *name; /* the kvpool's, for logs */
    unsigned char msg[KEEPER_MAX_BYTES];
    size_t len;
    int fds[KEEPER_MAX_FDS];
    int num_fds; /* 0: nothing held */
    int link;    /* the supervisor's end of the current process's link, or -1 */
};

void keeper_init(struct keeper *k, const char *name);

/* Before a start: a new link (the previous one closed); what is held is offered on it. *child_fd
 * is the end to give the process (close-on-exec: the spawn's stdio makes it inheritable); the
 * caller closes it once the process is spawned. 0 or PAGODA_EIO (then no link: the process starts
 * without one and makes a new pool). */
int keeper_open_link(struct keeper *k, int *child_fd);

/* Takes what the process sent since (at most KEEPER_MAX_READS messages): the newest well-formed
 * deposit replaces what was held (whose descriptors are closed), a refusal lets go of it, a
 * malformed one is logged and dropped. Returns how many deposits were taken. */
int keeper_collect(struct keeper *k);

/* Collects, then closes the link (the process has exited). */
void keeper_close_link(struct keeper *k);

/* Closes the link and lets go of what is held (the group stops). */
void keeper_release(struct keeper *k);

#endif
