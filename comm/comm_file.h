/* A cpu comm group over a shared file: the group of a tensor-parallel engine whose ranks are
 * processes started apart (one pagoda-worker per rank, docs/tensor-parallel.md).
 *
 * The file holds a header (magic, version, size, state, and per rank its pid, a phase and a small
 * payload) and, after rank 0 has made it, the cpu comm region (comm_cpu_shared_*). Whoever starts
 * the group (the supervisor) creates a fresh file for every start of the group with
 * comm_file_create; rank 0 extends it and initialises the region, the other ranks wait for
 * that. Each rank claims its place once: a file whose place is already claimed belongs to an
 * earlier start of the group (its region may be broken, a dead process counted as arrived) and is
 * refused (PAGODA_EEXIST, naming the file and the pid that claimed it). Nothing in the file is
 * ever reset: a group is started anew with a new file.
 *
 * Waits here have no deadline (a peer may still be loading a large model) but are bounded by a
 * keep_waiting callback, asked every COMM_FILE_POLL_MS, and by the peer's life: a peer whose
 * process is gone (its pid, as it claimed its place) ends the wait with PAGODA_ECLOSED. */
#ifndef PAGODA_COMM_COMM_FILE_H
#define PAGODA_COMM_COMM_FILE_H

#include "comm/comm.h"

#include <stddef.h>
#include <stdint.h>

/* Bytes each rank may publish (comm_file_publish). */
#define COMM_FILE_PAYLOAD_BYTES 512
/* How often a wait looks at the file, its peers and keep_waiting, in milliseconds. */
#define COMM_FILE_POLL_MS 5
/* The format's version, in the header: a file of another version is refused. 2 since 2026-12-03
 * (the comm region's barrier became a lock-free word: comm/comm_cpu.c). */
#define COMM_FILE_VERSION 2

struct comm_file;

/* Creates path (mode 0600) as a fresh group file of size ranks (1..COMM_MAX_RANKS), replacing
 * whatever was there through a rename (never writing through a link; processes that still map
 * an older file keep theirs). Errors: PAGODA_EINVAL (a size outside the range), PAGODA_ERANGE (a
 * path too long), the file system's (PAGODA_EIO, PAGODA_EPERM, ...), with the path. */
int comm_file_create(const char *path, int size);

/* Opens rank's place in the group file at path, made for size ranks. Rank 0 makes the comm
 * region (collectives bounded by timeout_ms); the others wait for it, without deadline while
 * keep_waiting(ctx) (may be NULL) says go on and rank 0's process lives. *out is the caller's.
 * Errors, each naming the file: PAGODA_EFORMAT (not a group file: magic, version, length),
 * PAGODA_EMISMATCH (a file made for another size), PAGODA_EEXIST (this rank's place, or for rank 0
 * the region, was claimed by an earlier start: a stale file), PAGODA_EPERM (a file owned by
 * another user, or writable by group or others), PAGODA_ECLOSED (keep_waiting said stop, rank 0
 * is gone), PAGODA_EINVAL, PAGODA_ENOMEM, the file system's. */
int comm_file_open(const char *path, int rank, int size, int timeout_ms,
                   int (*keep_waiting)(void *ctx), void *ctx, struct comm_file **out);

/* This rank's handle on the group's collectives (borrowed: closed with the file). */
struct comm *comm_file_comm(struct comm_file *f);

/* The pid that claimed rank's place, 0 while none has. */
int comm_file_pid(const struct comm_file *f, int rank);

/* Whether rank's process (as it claimed its place) is still there; 1 while none has claimed. */
int comm_file_alive(const struct comm_file *f, int rank);

/* Publishes this rank's payload (len <= COMM_FILE_PAYLOAD_BYTES; NULL keeps the last) and
 * phase (> the last published): peers waiting for that phase see the payload. Errors:
 * PAGODA_EINVAL. */
int comm_file_publish(struct comm_file *f, int phase, const void *payload, size_t len);

/* Waits until rank has published phase (or a later one), then copies len bytes of its payload
 * into out (may be NULL). No deadline: keep_waiting (may be NULL) and rank's life bound it.
 * Errors: PAGODA_ECLOSED (keep_waiting said stop, or rank's process is gone: the detail says
 * which), PAGODA_EINVAL. */
int comm_file_wait(struct comm_file *f, int rank, int phase, void *out, size_t len,
                   int (*keep_waiting)(void *ctx), void *ctx);

/* Closes this rank's comm handle and unmaps the file (the file stays: its creator removes or
 * replaces it). Accepts NULL. */
void comm_file_close(struct comm_file *f);

#endif
