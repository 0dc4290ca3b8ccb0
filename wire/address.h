/* Addresses of pagoda's links as configuration: the one check every program applies to an
 * address flag before it listens or dials, so that a typo is refused at start with a message
 * naming the flag instead of surfacing later as an NNG error or a silent wait. */
#ifndef PAGODA_WIRE_ADDRESS_H
#define PAGODA_WIRE_ADDRESS_H

#include <stddef.h>

/* The longest address accepted, in bytes (without the terminating NUL). */
#define WIRE_ADDRESS_MAX 255
/* The longest path an ipc:// address may name: a Unix socket path holds 107 bytes. */
#define WIRE_IPC_PATH_MAX 107

/* What an address may be. */
enum wire_address_kind {
    WIRE_ADDRESS_ANY,      /* ipc:// or tcp:// */
    WIRE_ADDRESS_IPC_ONLY, /* ipc:// only (a link whose peer must be on this host) */
    WIRE_ADDRESS_DIAL,     /* ipc:// or tcp:// naming one peer: no 0.0.0.0, * or [::] */
};

/* Checks address, given as flag (named in the message), before anything uses it: it must be
 * ipc://PATH (PATH not empty, at most WIRE_IPC_PATH_MAX bytes) or, unless kind is
 * WIRE_ADDRESS_IPC_ONLY, tcp://HOST:PORT (HOST a name, an IPv4 address, [an IPv6 one] or * for
 * every interface; PORT a decimal number 1..65535), and at most WIRE_ADDRESS_MAX bytes long.
 * WIRE_ADDRESS_DIAL, for a flag that only dials, also refuses a host of every interface
 * (0.0.0.0, *, [::]): those say where to listen, not whom to reach (NNG cannot dial *).
 * Returns 0 or PAGODA_EINVAL (bad scheme, host or port) or PAGODA_ERANGE (too long, port out
 * of range), with a detail naming flag and what was wrong. */
int wire_address_check(const char *flag, const char *address, enum wire_address_kind kind);

/* The port of a tcp:// address that wire_address_check accepted, or -1 for any other. */
int wire_address_port(const char *address);

/* Writes address with its tcp port raised by offset into buf (len bytes): engine I of a group
 * listens on PORT+I. Returns 0, or PAGODA_EINVAL (not a tcp:// address with a port) or
 * PAGODA_ERANGE (the port passes 65535, or buf is too small). */
int wire_address_offset_port(char *buf, size_t len, const char *address, int offset);

/* Whether address is tcp:// with a host of every interface (0.0.0.0, * or [::]). */
int wire_address_is_wildcard(const char *address);

/* Writes into buf (len bytes) the address a peer on this host dials to reach a program listening
 * on address: a host of every interface is dialed on the loopback (0.0.0.0 and * as 127.0.0.1,
 * [::] as [::1]); any other address is copied. Returns 0, or PAGODA_ERANGE when buf is too
 * small. */
int wire_address_dial_form(char *buf, size_t len, const char *address);

#endif
