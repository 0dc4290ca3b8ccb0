#include "kvpool/kvpool_client.h"
#include "kvpool/kvpool_proto.h"
#include "common/error.h"
#include "common/log.h"
#include "proto/internal.pb-c.h"
#include "wire/wire.h"

#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>
#include <stdio.h>

/* One try: each send and receive waits this long. */
#define KVPOOL_TRY_MS 500

/* One request on an open REQ socket: 0, PAGODA_ETIMEDOUT (ask again) or another error. */
static int ask_once(nng_socket s, int64_t worker_id, struct kvpool_info *info)
{
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
    int rc = kvpool_response_decode(nng_msg_body(m), nng_msg_len(m), info);
    nng_msg_free(m);
    return rc;
}

int kvpool_fetch_pool(const char *run_dir, int64_t worker_id, int wait_ms,
                      const volatile sig_atomic_t *stop, struct kvpool_info *info)
{
    char url[512];
    int rc = wire_ipc_url(url, sizeof(url), run_dir, "kvpool.ipc");
    if (rc != 0)
        return rc;
    return kvpool_fetch_pool_at(url, worker_id, wait_ms, stop, info);
}

int kvpool_fetch_pool_at(const char *url, int64_t worker_id, int wait_ms,
                         const volatile sig_atomic_t *stop, struct kvpool_info *info)
{
    int rc;
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
    char url[512];
    int rc = wire_ipc_url(url, sizeof(url), run_dir, "kvpool.ipc");
    if (rc != 0)
        return rc;
    return kvpool_fetch_geometry_at(url, worker_id, wait_ms, stop, g, shm_name, len);
}

int kvpool_fetch_geometry_at(const char *url, int64_t worker_id, int wait_ms,
                             const volatile sig_atomic_t *stop, struct kv_geometry *g,
                             char *shm_name, size_t len)
{
    struct kvpool_info info;
    int rc = kvpool_fetch_pool_at(url, worker_id, wait_ms, stop, &info);
    if (rc != 0)
        return rc;
    if (shm_name != NULL &&
        (info.shm_name[0] == '\0' || (size_t)snprintf(shm_name, len, "%s", info.shm_name) >= len))
        return pagoda_error_set(PAGODA_EPROTO, "kvpool's shm name is missing or too long");
    *g = info.geometry;
    return 0;
}
