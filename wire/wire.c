#include "wire/wire.h"
#include "common/error.h"

#include <nng/protocol/pair1/pair.h>
#include <nng/protocol/pipeline0/push.h>
#include <nng/supplemental/util/platform.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>

int wire_pair_open(nng_socket *s, const char *url, int listen, size_t max_bytes)
{
    int rv = nng_pair1_open(s);
    if (rv != 0)
        return wire_error(rv, "nng_pair1_open");
    if ((rv = nng_socket_set_size(*s, NNG_OPT_RECVMAXSZ, max_bytes)) != 0) {
        nng_close(*s);
        return wire_error(rv, "NNG_OPT_RECVMAXSZ");
    }
    /* NNG's PAIR send buffer defaults to 0: a non-blocking send while the previous message is
     * still being written would fail and drop it. 64 messages of slack avoids that. */
    if ((rv = nng_socket_set_int(*s, NNG_OPT_SENDBUF, 64)) != 0 ||
        (rv = nng_socket_set_int(*s, NNG_OPT_RECVBUF, 64)) != 0) {
        nng_close(*s);
        return wire_error(rv, "NNG_OPT_SENDBUF");
    }
    /* A dialer retries quickly, so a restarted peer is found within ~100 ms. */
    nng_socket_set_ms(*s, NNG_OPT_RECONNMINT, 20);
    nng_socket_set_ms(*s, NNG_OPT_RECONNMAXT, 100);
    rv = listen ? nng_listen(*s, url, NULL, 0) : nng_dial(*s, url, NULL, NNG_FLAG_NONBLOCK);
    if (rv != 0) {
        nng_close(*s);
        return wire_error(rv, url);
    }
    return 0;
}

int wire_send(nng_socket s, const ProtobufCMessage *msg)
{
    size_t len = protobuf_c_message_get_packed_size(msg);
    nng_msg *m;
    int rv = nng_msg_alloc(&m, len);
    if (rv != 0)
        return wire_error(rv, "nng_msg_alloc");
    protobuf_c_message_pack(msg, nng_msg_body(m));
    if ((rv = nng_sendmsg(s, m, NNG_FLAG_NONBLOCK)) != 0) {
        nng_msg_free(m);
        return wire_error(rv, "nng_sendmsg");
    }
    return 0;
}

ProtobufCMessage *wire_unpack(const ProtobufCMessageDescriptor *desc, nng_msg *m)
{
    return protobuf_c_message_unpack(desc, NULL, nng_msg_len(m), nng_msg_body(m));
}

/* ---- the inbox --------------------------------------------------------------------------- */

struct mail {
    nng_msg *msg;
    struct mail *next;
};

struct wire_inbox {
    uv_async_t async;
    nng_socket sock;
    nng_aio *aio;
    wire_handler handler;
    void *ctx;
    pthread_mutex_t lock;
    struct mail *head, *tail; /* guarded by lock */
    int closing;              /* guarded by lock */
};

/* NNG thread: queue the message, wake the loop, receive the next one. */
static void on_recv(void *arg)
{
    struct wire_inbox *in = arg;
    if (nng_aio_result(in->aio) != 0) {
        pthread_mutex_lock(&in->lock);
        int closing = in->closing;
        pthread_mutex_unlock(&in->lock);
        if (!closing)
            nng_recv_aio(in->sock, in->aio); /* a transient error: keep receiving */
        return;
    }
    struct mail *mail = malloc(sizeof(*mail));
    nng_msg *m = nng_aio_get_msg(in->aio);
    pthread_mutex_lock(&in->lock);
    if (mail != NULL && !in->closing) {
        mail->msg = m;
        mail->next = NULL;
        if (in->tail)
            in->tail->next = mail;
        else
            in->head = mail;
        in->tail = mail;
        m = NULL;
        mail = NULL;
    }
    int closing = in->closing;
    pthread_mutex_unlock(&in->lock);
    free(mail);
    if (m != NULL)
        nng_msg_free(m); /* out of memory or closing: the protocol recovers from a loss */
    if (!closing) {
        uv_async_send(&in->async);
        nng_recv_aio(in->sock, in->aio);
    }
}

/* Loop thread: hand every queued message to the owner. */
static void on_async(uv_async_t *h)
{
    struct wire_inbox *in = h->data;
    pthread_mutex_lock(&in->lock);
    struct mail *list = in->head;
    in->head = in->tail = NULL;
    pthread_mutex_unlock(&in->lock);
    while (list != NULL) {
        struct mail *next = list->next;
        in->handler(in->ctx, list->msg);
        free(list);
        list = next;
    }
}

int wire_inbox_open(uv_loop_t *loop, nng_socket s, wire_handler handler, void *ctx,
                    struct wire_inbox **out)
{
    struct wire_inbox *in = calloc(1, sizeof(*in));
    if (in == NULL)
        return PAGODA_ENOMEM;
    in->sock = s;
    in->handler = handler;
    in->ctx = ctx;
    pthread_mutex_init(&in->lock, NULL);
    int rv = nng_aio_alloc(&in->aio, on_recv, in);
    if (rv != 0) {
        pthread_mutex_destroy(&in->lock);
        free(in);
        return wire_error(rv, "nng_aio_alloc");
    }
    if (uv_async_init(loop, &in->async, on_async) != 0) {
        nng_aio_free(in->aio);
        pthread_mutex_destroy(&in->lock);
        free(in);
        return pagoda_error_set(PAGODA_EIO, "uv_async_init failed");
    }
    in->async.data = in;
    nng_recv_aio(s, in->aio);
    *out = in;
    return 0;
}

static void on_closed(uv_handle_t *h)
{
    struct wire_inbox *in = h->data;
    struct mail *list = in->head;
    while (list != NULL) {
        struct mail *next = list->next;
        nng_msg_free(list->msg);
        free(list);
        list = next;
    }
    pthread_mutex_destroy(&in->lock);
    free(in);
}

void wire_inbox_close(struct wire_inbox *in)
{
    if (in == NULL)
        return;
    pthread_mutex_lock(&in->lock);
    in->closing = 1;
    pthread_mutex_unlock(&in->lock);
    nng_aio_stop(in->aio); /* waits for a running callback; none starts after this */
    nng_aio_free(in->aio);
    uv_close((uv_handle_t *)&in->async, on_closed);
}

/* ---- control messages to the supervisor --------------------------------------------------- */

int wire_ipc_url(char *buf, size_t len, const char *run_dir, const char *name)
{
    int n = snprintf(buf, len, "ipc://%s/%s", run_dir, name);
    if (n < 0 || (size_t)n >= len)
        return pagoda_error_set(PAGODA_ERANGE, "run directory path too long: %s", run_dir);
    return 0;
}

int wire_control_send(const char *run_dir, Pagoda__Internal__Control *ctl)
{
    if (run_dir == NULL)
        return 0;
    char url[512];
    int rc = wire_ipc_url(url, sizeof(url), run_dir, "control.ipc");
    if (rc != 0)
        return rc;
    ctl->has_protocol_version = 1;
    ctl->protocol_version = WIRE_PROTOCOL_VERSION;
    nng_socket s;
    int rv = nng_push0_open(&s);
    if (rv != 0)
        return wire_error(rv, "nng_push0_open");
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, 1000);
    if ((rv = nng_dial(s, url, NULL, 0)) != 0) {
        nng_close(s);
        return wire_error(rv, url);
    }
    size_t len = protobuf_c_message_get_packed_size(&ctl->base);
    nng_msg *m;
    if ((rv = nng_msg_alloc(&m, len)) == 0) {
        protobuf_c_message_pack(&ctl->base, nng_msg_body(m));
        if ((rv = nng_sendmsg(s, m, 0)) != 0)
            nng_msg_free(m);
    }
    /* Let the message leave before the socket closes. */
    nng_msleep(20);
    nng_close(s);
    return rv == 0 ? 0 : wire_error(rv, "control message");
}

int wire_control_ready(const char *run_dir, const char *sender)
{
    Pagoda__Internal__Control ctl = PAGODA__INTERNAL__CONTROL__INIT;
    ctl.has_ready = 1;
    ctl.ready = 1;
    ctl.sender = (char *)sender;
    return wire_control_send(run_dir, &ctl);
}
