#include "kvpool/kvpool_client.h"
#include "common/error.h"
#include "common/log.h"
#include "proto/internal.pb-c.h"
#include "wire/wire.h"

#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <stdio.h>

/* One try: each send and receive waits this long. */
#define KVPOOL_TRY_MS 500

static int geometry_from_proto(const Pagoda__Internal__PoolGeometry *p, struct kv_geometry *g)
{
    if (p == NULL || !p->has_pool_id || !p->has_num_layers || !p->has_num_blocks ||
        !p->has_block_size || !p->has_num_kv_heads || !p->has_head_dim || !p->has_dtype)
        return pagoda_error_set(PAGODA_EPROTO, "kvpool's answer lacks part of the geometry");
    if ((int)p->dtype < DTYPE_BF16 || (int)p->dtype > DTYPE_F32)
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

/* One request on an open REQ socket: 0, PAGODA_ETIMEDOUT (ask again) or another error. */
static int ask_once(nng_socket s, int64_t worker_id, struct kvpool_info *info)
{
    struct kv_geometry *g = &info->geometry;
    Pagoda__Internal__KvpoolRequest req = PAGODA__INTERNAL__KVPOOL_REQUEST__INIT;
    req.has_protocol_version = req.has_geometry = 1;
    req.protocol_version = WIRE_PROTOCOL_VERSION;
    req.geometry = 1;
    if (worker_id >= 0) {
        req.has_worker_id = 1;
        req.worker_id = (uint32_t)worker_id;
    }
    nng_msg *m;
    int rv = nng_msg_alloc(&m, pagoda__internal__kvpool_request__get_packed_size(&req));
    if (rv != 0)
        return wire_error(rv, "nng_msg_alloc");
    pagoda__internal__kvpool_request__pack(&req, nng_msg_body(m));
    if ((rv = nng_sendmsg(s, m, 0)) != 0) {
        nng_msg_free(m);
        return rv == NNG_ETIMEDOUT ? PAGODA_ETIMEDOUT : wire_error(rv, "kvpool request");
    }
    if ((rv = nng_recvmsg(s, &m, 0)) != 0)
        return rv == NNG_ETIMEDOUT ? PAGODA_ETIMEDOUT : wire_error(rv, "kvpool answer");
    Pagoda__Internal__KvpoolResponse *r = (Pagoda__Internal__KvpoolResponse *)wire_unpack(
        &pagoda__internal__kvpool_response__descriptor, m);
    nng_msg_free(m);
    if (r == NULL)
        return pagoda_error_set(PAGODA_EPROTO, "kvpool's answer is malformed");
    int rc;
    if (r->has_error_code && r->error_code == PAGODA_EBUSY)
        rc = PAGODA_ETIMEDOUT; /* not ready yet: ask again */
    else if (r->has_error_code && r->error_code != 0)
        rc = pagoda_error_set(r->error_code < 0 ? r->error_code : PAGODA_EPROTO,
                              "kvpool refused: %s",
                              r->error_message ? r->error_message : "(no message)");
    else if ((rc = geometry_from_proto(r->geometry, g)) == 0)
        rc = location_from_proto(r->geometry, info);
    protobuf_c_message_free_unpacked(&r->base, NULL);
    return rc;
}

int kvpool_fetch_pool(const char *run_dir, int64_t worker_id, int wait_ms,
                      const volatile sig_atomic_t *stop, struct kvpool_info *info)
{
    char url[512];
    int rc = wire_ipc_url(url, sizeof(url), run_dir, "kvpool.ipc");
    if (rc != 0)
        return rc;
    nng_socket s;
    int rv = nng_req0_open(&s);
    if (rv != 0)
        return wire_error(rv, "nng_req0_open");
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, WIRE_MAX_MESSAGE_BYTES);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, KVPOOL_TRY_MS);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, KVPOOL_TRY_MS);
    nng_socket_set_ms(s, NNG_OPT_RECONNMINT, 20);
    nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 200);
    if ((rv = nng_dial(s, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
        nng_close(s);
        return wire_error(rv, url);
    }
    nng_time deadline = nng_clock() + (nng_time)wait_ms;
    int logged = 0;
    for (;;) {
        if (stop != NULL && *stop) {
            rc = pagoda_error_set(PAGODA_ECLOSED, "stopped while waiting for kvpool");
            break;
        }
        rc = ask_once(s, worker_id, info);
        if (rc != PAGODA_ETIMEDOUT && rc != PAGODA_ECLOSED)
            break;
        if (nng_clock() >= deadline) {
            rc = pagoda_error_set(PAGODA_ETIMEDOUT, "kvpool did not answer at %s within %d ms", url,
                                  wait_ms);
            break;
        }
        if (!logged) {
            log_info("waiting for kvpool at %s", url);
            logged = 1;
        }
        nng_msleep(100);
    }
    nng_close(s);
    return rc;
}

int kvpool_fetch_geometry(const char *run_dir, int64_t worker_id, int wait_ms,
                          const volatile sig_atomic_t *stop, struct kv_geometry *g, char *shm_name,
                          size_t len)
{
    struct kvpool_info info;
    int rc = kvpool_fetch_pool(run_dir, worker_id, wait_ms, stop, &info);
    if (rc != 0)
        return rc;
    if (shm_name != NULL &&
        (info.shm_name[0] == '\0' || (size_t)snprintf(shm_name, len, "%s", info.shm_name) >= len))
        return pagoda_error_set(PAGODA_EPROTO, "kvpool's shm name is missing or too long");
    *g = info.geometry;
    return 0;
}
