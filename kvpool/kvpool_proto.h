/* kvpool's one request and its answer, as bytes: what pagoda-kvpool does with a KvpoolRequest
 * and what a client makes of the KvpoolResponse, without sockets (kvpool_main.c and
 * kvpool_client.c send and receive them; tests/fuzz drives these directly). */
#ifndef PAGODA_KVPOOL_KVPOOL_PROTO_H
#define PAGODA_KVPOOL_KVPOOL_PROTO_H

#include "kvpool/kvpool_client.h"
#include "proto/internal.pb-c.h"

#include <stddef.h>
#include <stdint.h>

/* Fills *pg (initialised here) with the geometry g and where the pool is: device and
 * handle_socket for a GPU pool (handle_socket not NULL), else shm_name. The strings are
 * borrowed: they must outlive *pg. kvpool's answer and the worker's Hello both use it. */
void kvpool_geometry_to_proto(const struct kv_geometry *g, const char *shm_name, int device,
                              const char *handle_socket, Pagoda__Internal__PoolGeometry *pg);

/* Packs the answer to every request: the geometry g and where the pool is (shm_name for the CPU
 * pool; device and handle_socket for a GPU pool, the other NULL / -1), or, with error_code not
 * 0, that error and its message. On success *out (malloc'd, the caller frees it) holds *len
 * bytes. Returns 0 or PAGODA_ENOMEM. */
int kvpool_response_pack(const struct kv_geometry *g, const char *shm_name, int device,
                         const char *handle_socket, int error_code, const char *error_message,
                         uint8_t **out, size_t *len);

/* Whether len bytes at buf are a KvpoolRequest: 0 (answer with the geometry) or PAGODA_EFORMAT
 * (answer with the error reply). Nothing in a request changes the answer. */
int kvpool_request_check(const uint8_t *buf, size_t len);

/* Reads a KvpoolResponse into *out: 0 with the geometry validated and exactly one of shm_name
 * and handle_socket set (device -1 for a CPU pool), PAGODA_ETIMEDOUT when kvpool answers that
 * it is not ready (ask again), PAGODA_EPROTO for a malformed or incomplete answer, a name or
 * path that does not fit, or an error code outside pagoda's error space (common/error.h), or
 * kvpool's own error code. */
int kvpool_response_decode(const uint8_t *buf, size_t len, struct kvpool_info *out);

#endif
