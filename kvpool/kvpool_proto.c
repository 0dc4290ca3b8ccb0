#include "kvpool/kvpool_proto.h"
#include "common/error.h"
#include "proto/internal.pb-c.h"
#include "wire/wire.h"

#include <stdio.h>
#include <stdlib.h>

void kvpool_geometry_to_proto(const struct kv_geometry *g, const char *shm_name, int device,
                              const char *handle_socket, Pagoda__Internal__PoolGeometry *pg)
{
    pagoda__internal__pool_geometry__init(pg);
    pg->has_pool_id = pg->has_num_layers = pg->has_num_blocks = pg->has_block_size = 1;
    pg->has_num_kv_heads = pg->has_head_dim = pg->has_dtype = 1;
    pg->pool_id = g->pool_id;
    pg->num_layers = g->num_layers;
    pg->num_blocks = g->num_blocks;
    pg->block_size = g->block_size;
    pg->num_kv_heads = g->num_kv_heads;
    pg->head_dim = g->head_dim;
    pg->dtype = (Pagoda__Internal__DType)g->dtype;
    pg->shm_name = (char *)shm_name;
    if (handle_socket != NULL) {
        pg->has_device = 1;
        pg->device = device;
        pg->handle_socket = (char *)handle_socket;
    }
}

/* The answer to every request: the geometry and where the pool is (shm_name for the CPU pool,
 * device and handle_socket for a GPU pool: the other is NULL / -1), or an error. */
int kvpool_response_pack(const struct kv_geometry *g, const char *shm_name, int device,
                         const char *handle_socket, int error_code, const char *error_message,
                         uint8_t **out, size_t *len)
{
    Pagoda__Internal__PoolGeometry pg;
    kvpool_geometry_to_proto(g, shm_name, device, handle_socket, &pg);
    Pagoda__Internal__KvpoolResponse r = PAGODA__INTERNAL__KVPOOL_RESPONSE__INIT;
    r.has_protocol_version = 1;
    r.protocol_version = WIRE_PROTOCOL_VERSION;
    if (error_code != 0) {
        r.has_error_code = 1;
        r.error_code = error_code;
        r.error_message = (char *)error_message;
    } else {
        r.geometry = &pg;
    }
    *len = pagoda__internal__kvpool_response__get_packed_size(&r);
    *out = malloc(*len > 0 ? *len : 1);
    if (*out == NULL)
        return PAGODA_ENOMEM;
    pagoda__internal__kvpool_response__pack(&r, *out);
    return 0;
}

static int geometry_from_proto(const Pagoda__Internal__PoolGeometry *p, struct kv_geometry *g)
{
    if (p == NULL || !p->has_pool_id || !p->has_num_layers || !p->has_num_blocks ||
        !p->has_block_size || !p->has_num_kv_heads || !p->has_head_dim || !p->has_dtype)
        return pagoda_error_set(PAGODA_EPROTO, "kvpool's answer lacks part of the geometry");
    if ((int)p->dtype < DTYPE_BF16 || (int)p->dtype > DTYPE_F8E4M3)
        return pagoda_error_set(PAGODA_EPROTO, "kvpool's answer has dtype %d", (int)p->dtype);
    *g = (struct kv_geometry){
        .pool_id = p->pool_id,
        .num_layers = p->num_layers,
        .num_blocks = p->num_blocks,
        .block_size = p->block_size,
        .num_kv_heads = p->num_kv_heads,
        .head_dim = p->head_dim,
        .dtype = (enum dtype)p->dtype,
    };
    return kv_geometry_validate(g);
}

/* Where the pool is: a shared-memory name or a device and a socket, each fitting its field. */
static int location_from_proto(const Pagoda__Internal__PoolGeometry *p, struct kvpool_info *out)
{
    out->device = -1;
    out->shm_name[0] = out->handle_socket[0] = '\0';
    if (p->handle_socket != NULL && p->handle_socket[0] != '\0') {
        if (!p->has_device || p->device < 0)
            return pagoda_error_set(PAGODA_EPROTO, "kvpool's GPU pool has no device");
        if ((size_t)snprintf(out->handle_socket, sizeof(out->handle_socket), "%s",
                             p->handle_socket) >= sizeof(out->handle_socket))
            return pagoda_error_set(PAGODA_EPROTO, "kvpool's handle socket path is too long");
        out->device = p->device;
        return 0;
    }
    if (p->shm_name == NULL || p->shm_name[0] == '\0' ||
        (size_t)snprintf(out->shm_name, sizeof(out->shm_name), "%s", p->shm_name) >=
            sizeof(out->shm_name))
        return pagoda_error_set(PAGODA_EPROTO, "kvpool's shm name is missing or too long");
    return 0;
}

int kvpool_request_check(const uint8_t *buf, size_t len)
{
    Pagoda__Internal__KvpoolRequest *req = pagoda__internal__kvpool_request__unpack(NULL, len, buf);
    if (req == NULL)
        return PAGODA_EFORMAT;
    protobuf_c_message_free_unpacked(&req->base, NULL);
    return 0;
}

int kvpool_response_decode(const uint8_t *buf, size_t len, struct kvpool_info *info)
{
    Pagoda__Internal__KvpoolResponse *r = pagoda__internal__kvpool_response__unpack(NULL, len, buf);
    if (r == NULL)
        return pagoda_error_set(PAGODA_EPROTO, "kvpool's answer is malformed");
    int rc;
    if (r->has_error_code && r->error_code == PAGODA_EBUSY)
        rc = PAGODA_ETIMEDOUT; /* not ready yet: ask again */
    else if (r->has_error_code && r->error_code != 0)
        /* Only a code of pagoda's error space is passed on as itself (PAGODA_EINTERNAL is
         * its lowest); anything else is a broken answer. */
        rc = pagoda_error_set(
            r->error_code < 0 && r->error_code >= PAGODA_EINTERNAL ? r->error_code : PAGODA_EPROTO,
            "kvpool refused (code %d): %s", (int)r->error_code,
            r->error_message ? r->error_message : "(no message)");
    else if ((rc = geometry_from_proto(r->geometry, &info->geometry)) == 0)
        rc = location_from_proto(r->geometry, info);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return rc;
}
