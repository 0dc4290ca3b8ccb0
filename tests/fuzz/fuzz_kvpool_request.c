/* libFuzzer target: what a peer on kvpool.ipc sends pagoda-kvpool (kvpool/kvpool_proto.h), the
 * bytes as one request.
 *
 * pagoda-kvpool answers every request with one of two replies packed at start: the geometry, or
 * the error for a malformed KvpoolRequest. The bytes must pick exactly the reply protobuf-c's own
 * unpack says they deserve, and both replies (a CPU pool's and a GPU pool's) must read back through
 * the client's decode as what was packed. */
#include "common/error.h"
#include "kvpool/kvpool_proto.h"
#include "proto/internal.pb-c.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const struct kv_geometry geometry = {
    .pool_id = 0x1234,
    .num_layers = 2,
    .num_blocks = 64,
    .block_size = 16,
    .num_kv_heads = 2,
    .head_dim = 64,
    .dtype = DTYPE_BF16,
};

/* The reply the server sends for a verdict, decoded as a client does. */
static void check_reply(int verdict, int gpu)
{
    const char *shm = gpu ? NULL : "/pagoda-fuzz-pool";
    const char *sock = gpu ? "/run/pagoda/kvpool-fds.sock" : NULL;
    uint8_t *buf = NULL;
    size_t len = 0;
    int rc =
        kvpool_response_pack(&geometry, shm, gpu ? 3 : -1, sock, verdict == 0 ? 0 : PAGODA_EFORMAT,
                             verdict == 0 ? NULL : "malformed KvpoolRequest", &buf, &len);
    if (rc != 0)
        abort();
    struct kvpool_info info;
    rc = kvpool_response_decode(buf, len, &info);
    free(buf);
    if (verdict != 0) {
        if (rc != PAGODA_EFORMAT)
            abort();
        return;
    }
    if (rc != 0 || !kv_geometry_equal(&info.geometry, &geometry))
        abort();
    if (gpu ? (info.device != 3 || strcmp(info.handle_socket, sock) != 0 || info.shm_name[0])
            : (info.device != -1 || strcmp(info.shm_name, shm) != 0 || info.handle_socket[0]))
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int verdict = kvpool_request_check(data, size);
    Pagoda__Internal__KvpoolRequest *req =
        pagoda__internal__kvpool_request__unpack(NULL, size, data);
    if ((verdict == 0) != (req != NULL) || (verdict != 0 && verdict != PAGODA_EFORMAT))
        abort();
    if (req != NULL) {
        /* What was accepted packs again (its unknown fields left out, as in
         * fuzz_supervisor_control.c) into a request that is accepted too. */
        unsigned unknown = req->base.n_unknown_fields;
        req->base.n_unknown_fields = 0;
        size_t n = pagoda__internal__kvpool_request__get_packed_size(req);
        uint8_t *again = malloc(n > 0 ? n : 1);
        if (again == NULL)
            abort();
        pagoda__internal__kvpool_request__pack(req, again);
        if (kvpool_request_check(again, n) != 0)
            abort();
        free(again);
        req->base.n_unknown_fields = unknown;
        protobuf_c_message_free_unpacked(&req->base, NULL);
    }
    check_reply(verdict, size > 0 && (data[0] & 1));
    return 0;
}
