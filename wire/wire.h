/* Messages between processes: protobuf-c messages over NNG sockets, received on a libuv loop.
 *
 * NNG's aio callbacks run on NNG's threads; they never block and never touch process state.
 * A wire_inbox keeps one receive outstanding on a socket; each message that arrives is put in a
 * mailbox and the loop is woken with uv_async_send, so the owner handles every message on its
 * loop thread, in arrival order. Sending is non-blocking: a message that cannot be queued now
 * (no peer, full buffers) is dropped and counted, which the protocol tolerates (steps and
 * results are numbered; a loss leads to a resync). */
#ifndef PAGODA_WIRE_WIRE_H
#define PAGODA_WIRE_WIRE_H

#include "proto/internal.pb-c.h"
#include "wire/wire_error.h"

#include <nng/nng.h>
#include <protobuf-c/protobuf-c.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* The protocol version every internal envelope carries. */
#define WIRE_PROTOCOL_VERSION 1u

/* The largest internal message any socket accepts (NNG_OPT_RECVMAXSZ): a step or resync of
 * thousands of sequences with their tokens fits. */
#define WIRE_MAX_MESSAGE_BYTES (64u << 20)

/* Opens a PAIR socket and listens (listen != 0) or dials (non-blocking: the dial retries in the
 * background until the peer is there) at url. Sets NNG_OPT_RECVMAXSZ to max_bytes. */
int wire_pair_open(nng_socket *s, const char *url, int listen, size_t max_bytes);

/* Packs msg into a new NNG message and sends it without blocking. Returns 0, PAGODA_EBUSY (not
 * sent now: no peer or full buffers; the message is dropped), PAGODA_ENOMEM or PAGODA_ECLOSED. */
int wire_send(nng_socket s, const ProtobufCMessage *msg);

/* Unpacks an NNG message body as desc; NULL when it is malformed. The caller frees the result
 * with protobuf_c_message_free_unpacked and keeps ownership of m. */
ProtobufCMessage *wire_unpack(const ProtobufCMessageDescriptor *desc, nng_msg *m);

struct wire_inbox;

/* Called on the loop thread for every message received; the handler owns m (nng_msg_free). */
typedef void (*wire_handler)(void *ctx, nng_msg *m);

/* Starts receiving on s into a mailbox drained on loop. On success *out is released with
 * wire_inbox_close, which must run on the loop thread before the socket is closed. Errors:
 * PAGODA_ENOMEM, PAGODA_EIO. */
int wire_inbox_open(uv_loop_t *loop, nng_socket s, wire_handler handler, void *ctx,
                    struct wire_inbox **out);

/* Stops receiving, drops undelivered messages and frees the inbox once libuv has closed its
 * handle (so the loop must run a little after this). Accepts NULL. */
void wire_inbox_close(struct wire_inbox *in);

/* Pushes ctl (protocol_version is filled in) to the supervisor's control socket,
 * ipc://RUN_DIR/control.ipc, waiting up to 1 s for the connection. Processes started without a
 * supervisor (run_dir NULL or no listener) lose nothing but the message. Returns 0 or a
 * PAGODA_E* code. */
int wire_control_send(const char *run_dir, Pagoda__Internal__Control *ctl);

/* Pushes Control{ready, sender} to the supervisor. */
int wire_control_ready(const char *run_dir, const char *sender);

/* Formats "ipc://RUN_DIR/NAME" into buf (len bytes). Returns 0 or PAGODA_ERANGE. */
int wire_ipc_url(char *buf, size_t len, const char *run_dir, const char *name);

/* Heartbeats: the supervisor's proof that a program's event loop still runs. A supervisor that
 * checks them puts WIRE_HEARTBEAT_ENV=N (milliseconds) in its programs' environment; each
 * program then pushes Control{heartbeat, sender} to ipc://RUN_DIR/control.ipc every N ms from
 * its loop, over a socket of its own that is dialed in the background and sent to without
 * blocking (a heartbeat that cannot leave now is dropped: the next one follows). */
#define WIRE_HEARTBEAT_ENV "PAGODA_HEARTBEAT_MS"
#define WIRE_MAX_HEARTBEAT_MS 3600000

/* The keeper: a supervisor gives each kvpool it starts one end of a SOCK_SEQPACKET socket pair
 * as a descriptor named by WIRE_KVPOOL_KEEPER_ENV=FD in that kvpool's environment. A GPU kvpool
 * deposits its pool's descriptors there, and the supervisor offers them to the kvpool it starts
 * next (kvpool/cuda_pool.h, deploy/keeper.h). */
#define WIRE_KVPOOL_KEEPER_ENV "PAGODA_KVPOOL_KEEPER_FD"

struct wire_heartbeat;

/* Prepares sender's heartbeat when WIRE_HEARTBEAT_ENV asks for one (and run_dir is set): *out
 * is then the heartbeat, released with wire_heartbeat_close; otherwise *out is NULL and nothing
 * is sent. Errors: PAGODA_EINVAL (the variable is not a number of ms in
 * 0..WIRE_MAX_HEARTBEAT_MS), PAGODA_ERANGE, PAGODA_ENOMEM, or NNG's. */
int wire_heartbeat_open(const char *run_dir, const char *sender, struct wire_heartbeat **out);

/* The interval asked for, in ms; 0 for NULL. */
uint64_t wire_heartbeat_interval_ms(const struct wire_heartbeat *hb);

/* Sends one heartbeat now, without blocking, for a program that has its own loop (not libuv).
 * Accepts NULL. */
void wire_heartbeat_send(struct wire_heartbeat *hb);

/* Sends a heartbeat every interval from a timer on loop, which does not keep the loop alive
 * (uv_unref). Accepts NULL (nothing to do). Returns 0 or PAGODA_EIO. */
int wire_heartbeat_start(struct wire_heartbeat *hb, uv_loop_t *loop);

/* Stops and frees hb: on the loop thread when it was started (its timer closes there, so the
 * loop must run once more before uv_loop_close). Accepts NULL. */
void wire_heartbeat_close(struct wire_heartbeat *hb);

#endif
