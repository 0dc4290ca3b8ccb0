/* The asynchronous calls (pagoda_async.h): one NNG context and aio per call, sent then received
 * from the aio's callback; the aio is reaped (nng_aio_reap), never freed from its own callback. */
#include "client/pagoda_async.h"
#include "client/client_internal.h"

#include "wire/wire_error.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

enum call_kind {
    CALL_SUBMIT,
    CALL_POLL,
    CALL_CANCEL,
    CALL_STATS,
    CALL_HEALTH,
    CALL_TENANTS,
    CALL_TOKENIZE
};

struct acall {
    pagoda_client *client;
    enum call_kind kind;
    nng_ctx ctx;
    nng_aio *aio;
    int ctx_open;
    int receiving;
    uint32_t recv_timeout_ms;
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    pagoda_async_fn done;
    void *user;
    pagoda_async_result *res; /* allocated with the call, so that ending it cannot fail */
};

void pagoda_async_result_free(pagoda_async_result *res)
{
    if (res == NULL)
        return;
    pagoda_result_free(&res->result);
    pagoda_admin_list_free(&res->tenants);
    pagoda_tokenized_free(&res->tokenized);
    free(res->stats);
    free(res);
}

/* Ends the call: the callback gets its result. */
static void finish(struct acall *a)
{
    if (a->ctx_open)
        nng_ctx_close(a->ctx);
    nng_aio_reap(a->aio);
    pagoda_async_fn done = a->done;
    void *user = a->user;
    pagoda_async_result *res = a->res;
    free(a);
    done(user, res);
}

static void set_error(struct acall *a, int rc, const char *what, int rv)
{
    a->res->rc = rc;
    snprintf(a->res->detail, sizeof(a->res->detail), "%s: %s", what, nng_strerror(rv));
}

/* The reply, as the blocking calls read it. */
static void read_reply(struct acall *a, nng_msg *m)
{
    pagoda_async_result *res = a->res;
    Pagoda__ClientResponse *resp =
        pagoda__client_response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    if (resp == NULL) {
        res->rc = PAGODA_EPROTO;
        snprintf(res->detail, sizeof(res->detail), "a malformed %zu-byte reply from the router",
                 nng_msg_len(m));
        return;
    }
    client_note_reply(a->client, resp);
    if (resp->has_error_code && resp->error_code != 0) {
        int code = resp->error_code;
        res->rc = code < PAGODA_EINTERNAL || code > 0 ? PAGODA_EPROTO : code;
        snprintf(res->detail, sizeof(res->detail), "router: %s",
                 resp->error_message ? resp->error_message : pagoda_strerror(code));
    } else if (a->kind == CALL_STATS) {
        if (resp->result_case == PAGODA__CLIENT_RESPONSE__RESULT_STATS && resp->stats != NULL) {
            client_stats_from_proto(resp->stats, res->stats);
        } else {
            res->rc = PAGODA_EPROTO;
            snprintf(res->detail, sizeof(res->detail), "the router's reply carries no stats");
        }
    } else if (a->kind == CALL_TENANTS) {
        if (resp->result_case == PAGODA__CLIENT_RESPONSE__RESULT_ADMIN && resp->admin != NULL) {
            res->rc = client_admin_list_from_proto(resp->admin, &res->tenants);
            if (res->rc != 0)
                snprintf(res->detail, sizeof(res->detail), "out of memory");
        } else {
            res->rc = PAGODA_EPROTO;
            snprintf(res->detail, sizeof(res->detail), "the router's reply carries no tenants");
        }
    } else if (a->kind == CALL_TOKENIZE) {
        pagoda_error_clear();
        res->rc = client_tokenized_from_reply(resp, &res->tokenized);
        if (res->rc != 0)
            snprintf(res->detail, sizeof(res->detail), "%s", pagoda_error_detail());
    } else if (a->kind == CALL_HEALTH) {
        if (resp->result_case == PAGODA__CLIENT_RESPONSE__RESULT_HEALTHY) {
            res->healthy = resp->healthy != 0;
            res->max_model_len = resp->has_max_model_len ? resp->max_model_len : 0;
            if (!res->healthy)
                snprintf(res->detail, sizeof(res->detail), "%s",
                         resp->error_message ? resp->error_message : "the router is not healthy");
        } else {
            res->rc = PAGODA_EPROTO;
            snprintf(res->detail, sizeof(res->detail), "the router's reply carries no health");
        }
    } else {
        pagoda_error_clear();
        res->rc = client_result_from_update(resp, a->id, &res->result);
        if (res->rc != 0)
            snprintf(res->detail, sizeof(res->detail), "%s", pagoda_error_detail());
    }
    pagoda__client_response__free_unpacked(resp, NULL);
}

/* NNG thread: the send or the receive completed. */
static void on_io(void *arg)
{
    struct acall *a = arg;
    int rv = nng_aio_result(a->aio);
    if (!a->receiving) {
        if (rv != 0) {
            nng_msg_free(nng_aio_get_msg(a->aio)); /* not sent: still ours */
            set_error(a, rv == NNG_ETIMEDOUT ? PAGODA_ETIMEDOUT : PAGODA_EIO,
                      "sending to the router", rv);
            finish(a);
            return;
        }
        a->receiving = 1;
        nng_aio_set_timeout(a->aio, (nng_duration)a->recv_timeout_ms);
        nng_ctx_recv(a->ctx, a->aio);
        return;
    }
    if (rv != 0) {
        set_error(a, rv == NNG_ETIMEDOUT ? PAGODA_ETIMEDOUT : PAGODA_EIO,
                  "receiving from the router", rv);
    } else {
        nng_msg *m = nng_aio_get_msg(a->aio);
        read_reply(a, m);
        nng_msg_free(m);
    }
    finish(a);
}

/* Packs req and starts the call. On error nothing was started and a is freed. */
static int start(pagoda_client *c, const char *api_key, Pagoda__ClientRequest *req,
                 uint32_t wait_ms, struct acall *a)
{
    req->has_protocol_version = 1;
    req->protocol_version = CLIENT_PROTOCOL_VERSION;
    req->api_key = (char *)api_key;
    size_t len = protobuf_c_message_get_packed_size(&req->base);
    nng_msg *m = NULL;
    a->client = c;
    int rc = client_check_size(c, len);
    if (rc != 0)
        goto fail;
    uint32_t timeout_ms = client_timeout_ms(c);
    int rv = nng_ctx_open(&a->ctx, client_socket(c));
    if (rv != 0) {
        rc = wire_error(rv, "nng_ctx_open");
        goto fail;
    }
    a->ctx_open = 1;
    if ((rv = nng_ctx_set_ms(a->ctx, NNG_OPT_REQ_RESENDTIME,
                             (nng_duration)(wait_ms + client_resend_ms(c)))) != 0 ||
        (rv = nng_aio_alloc(&a->aio, on_io, a)) != 0 || (rv = nng_msg_alloc(&m, len)) != 0) {
        rc = wire_error(rv, "client call setup");
        goto fail;
    }
    protobuf_c_message_pack(&req->base, nng_msg_body(m));
    a->recv_timeout_ms = wait_ms + timeout_ms;
    nng_aio_set_timeout(a->aio, (nng_duration)timeout_ms);
    nng_aio_set_msg(a->aio, m);
    nng_ctx_send(a->ctx, a->aio);
    return 0;
fail:
    nng_msg_free(m);
    if (a->aio != NULL)
        nng_aio_free(a->aio);
    if (a->ctx_open)
        nng_ctx_close(a->ctx);
    pagoda_async_result_free(a->res);
    free(a);
    return rc;
}

static struct acall *acall_new(enum call_kind kind, const uint8_t *id, pagoda_async_fn done,
                               void *user)
{
    struct acall *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return NULL;
    if ((a->res = calloc(1, sizeof(*a->res))) == NULL ||
        (kind == CALL_STATS && (a->res->stats = calloc(1, sizeof(*a->res->stats))) == NULL)) {
        free(a->res);
        free(a);
        return NULL;
    }
    a->kind = kind;
    if (id != NULL) {
        memcpy(a->id, id, sizeof(a->id));
        memcpy(a->res->request_id, id, sizeof(a->id));
    }
    a->done = done;
    a->user = user;
    return a;
}

int pagoda_submit_async(pagoda_client *c, const char *api_key, const pagoda_generate_params *params,
                        const pagoda_prompt *prompt,
                        uint8_t request_id_out[PAGODA_REQUEST_ID_BYTES], pagoda_async_fn done,
                        void *user)
{
    if (c == NULL || request_id_out == NULL || done == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit_async: NULL argument");
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    if (getrandom(id, sizeof(id), 0) != (ssize_t)sizeof(id))
        return pagoda_error_set(PAGODA_EIO, "getrandom failed: no request id");
    struct client_submit cs;
    int rc = client_submit_build(&cs, params, prompt, id);
    if (rc != 0)
        return rc;
    struct acall *a = acall_new(CALL_SUBMIT, id, done, user);
    rc = a == NULL ? PAGODA_ENOMEM : start(c, api_key, &cs.req, 0, a);
    client_submit_fini(&cs);
    if (rc == 0)
        memcpy(request_id_out, id, sizeof(id));
    return rc;
}

int pagoda_poll_async(pagoda_client *c, const char *api_key,
                      const uint8_t request_id[PAGODA_REQUEST_ID_BYTES], uint32_t offset,
                      uint32_t wait_ms, pagoda_async_fn done, void *user)
{
    if (c == NULL || request_id == NULL || done == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_poll_async: NULL argument");
    if (wait_ms > PAGODA_POLL_WAIT_MS_MAX)
        wait_ms = PAGODA_POLL_WAIT_MS_MAX;
    struct client_id_call m;
    client_poll_build(&m, request_id, offset, wait_ms);
    struct acall *a = acall_new(CALL_POLL, request_id, done, user);
    return a == NULL ? PAGODA_ENOMEM : start(c, api_key, &m.req, wait_ms, a);
}

int pagoda_cancel_async(pagoda_client *c, const char *api_key,
                        const uint8_t request_id[PAGODA_REQUEST_ID_BYTES], pagoda_async_fn done,
                        void *user)
{
    if (c == NULL || request_id == NULL || done == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_cancel_async: NULL argument");
    struct client_id_call m;
    client_cancel_build(&m, request_id);
    struct acall *a = acall_new(CALL_CANCEL, request_id, done, user);
    return a == NULL ? PAGODA_ENOMEM : start(c, api_key, &m.req, 0, a);
}

int pagoda_stats_async(pagoda_client *c, const char *api_key, pagoda_async_fn done, void *user)
{
    if (c == NULL || done == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_stats_async: NULL argument");
    Pagoda__StatsRequest sreq = PAGODA__STATS_REQUEST__INIT;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_STATS;
    req.stats = &sreq;
    struct acall *a = acall_new(CALL_STATS, NULL, done, user);
    return a == NULL ? PAGODA_ENOMEM : start(c, api_key, &req, 0, a);
}

/* A Health call; with check_key the router checks api_key as a Submit's. */
static int health_start(pagoda_client *c, const char *api_key, int check_key, pagoda_async_fn done,
                        void *user)
{
    if (c == NULL || done == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_health_async: NULL argument");
    Pagoda__HealthRequest hreq = PAGODA__HEALTH_REQUEST__INIT;
    hreq.has_check_key = check_key;
    hreq.check_key = check_key;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_HEALTH;
    req.health = &hreq;
    struct acall *a = acall_new(CALL_HEALTH, NULL, done, user);
    return a == NULL ? PAGODA_ENOMEM : start(c, api_key, &req, 0, a);
}

int pagoda_health_async(pagoda_client *c, pagoda_async_fn done, void *user)
{
    return health_start(c, NULL, 0, done, user);
}

int pagoda_health_key_async(pagoda_client *c, const char *api_key, pagoda_async_fn done, void *user)
{
    return health_start(c, api_key, 1, done, user);
}

int pagoda_admin_tenants_async(pagoda_client *c, const char *api_key, pagoda_async_fn done,
                               void *user)
{
    if (c == NULL || done == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_admin_tenants_async: NULL argument");
    Pagoda__AdminTenantsRequest treq = PAGODA__ADMIN_TENANTS_REQUEST__INIT;
    Pagoda__AdminRequest admin = PAGODA__ADMIN_REQUEST__INIT;
    admin.op_case = PAGODA__ADMIN_REQUEST__OP_TENANTS;
    admin.tenants = &treq;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_ADMIN;
    req.admin = &admin;
    struct acall *a = acall_new(CALL_TENANTS, NULL, done, user);
    return a == NULL ? PAGODA_ENOMEM : start(c, api_key, &req, PAGODA_ADMIN_WAIT_MS, a);
}

static int tokenize_start(pagoda_client *c, const char *api_key, struct client_tokenize *t,
                          pagoda_async_fn done, void *user)
{
    struct acall *a = acall_new(CALL_TOKENIZE, NULL, done, user);
    int rc = a == NULL ? PAGODA_ENOMEM : start(c, api_key, &t->req, PAGODA_TOKENIZE_WAIT_MS, a);
    client_tokenize_fini(t);
    return rc;
}

int pagoda_tokenize_async(pagoda_client *c, const char *api_key, const pagoda_prompt *prompt,
                          pagoda_async_fn done, void *user)
{
    if (c == NULL || prompt == NULL || done == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_tokenize_async: NULL argument");
    struct client_tokenize t;
    int rc = client_tokenize_build(&t, prompt, NULL, 0, 1);
    return rc != 0 ? rc : tokenize_start(c, api_key, &t, done, user);
}

int pagoda_detokenize_async(pagoda_client *c, const char *api_key, const int32_t *ids, size_t n,
                            int skip_special_tokens, pagoda_async_fn done, void *user)
{
    if (c == NULL || done == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_detokenize_async: NULL argument");
    struct client_tokenize t;
    int rc = client_tokenize_build(&t, NULL, ids, n, skip_special_tokens);
    return rc != 0 ? rc : tokenize_start(c, api_key, &t, done, user);
}
