/* comm.h's NCCL implementation: one rank per GPU, buffers in device memory, collectives queued
 * on the rank's CUDA stream. Built only when NCCL was found at build time (PAGODA_HAVE_NCCL;
 * the configure log says "pagoda: NCCL ..."). */
#ifndef PAGODA_COMM_COMM_NCCL_H
#define PAGODA_COMM_COMM_NCCL_H

#include "comm/comm.h"

#include <stdint.h>

/* NCCL's unique id, as bytes (NCCL_UNIQUE_ID_BYTES): rank 0 makes it, the others receive it
 * (the supervisor hands it to each rank's worker, or comm_broadcast over a cpu group). */
#define COMM_NCCL_ID_BYTES 128

/* Fills id with a fresh NCCL unique id. Returns 0 or PAGODA_EIO (NCCL's error in the detail). */
int comm_nccl_unique_id(uint8_t id[COMM_NCCL_ID_BYTES]);

/* Joins the group of size ranks named by id as rank, on the current CUDA device, queueing
 * collectives on stream (a cudaStream_t; NULL: the default stream). Every rank's call must
 * come within timeout_ms, and every collective waits at most timeout_ms for the peers (NCCL's
 * non-blocking communicator is polled and aborted past the deadline, so a dead peer is
 * PAGODA_ETIMEDOUT, never a hang). *out is the caller's. Errors: PAGODA_EINVAL, PAGODA_EIO,
 * PAGODA_ETIMEDOUT, PAGODA_ENOMEM. */
int comm_nccl_open(const uint8_t id[COMM_NCCL_ID_BYTES], int size, int rank, void *stream,
                   int timeout_ms, struct comm **out);

/* The CUDA device c's communicator was made on (NCCL's own record), or -1 with the error set
 * (PAGODA_EINVAL: c is not an NCCL comm, PAGODA_EIO). */
int comm_nccl_device(const struct comm *c);

#endif
