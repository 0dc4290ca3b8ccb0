/* Heartbeats to the supervisor (wire.h): one PUSH socket per program, one pre-packed message. */
#include "common/error.h"
#include "common/parse.h"
#include "wire/wire.h"

#include <nng/protocol/pipeline0/push.h>
#include <stdlib.h>
#include <string.h>

/* Control{protocol_version, sender, heartbeat} packs into a few bytes more than the sender. */
#define WIRE_HEARTBEAT_MAX_SENDER 64
#define WIRE_HEARTBEAT_MAX_BYTES (WIRE_HEARTBEAT_MAX_SENDER + 32)

struct wire_heartbeat {
    nng_socket sock;
    uv_timer_t timer;
    int started;
    uint64_t interval_ms;
    uint8_t packed[WIRE_HEARTBEAT_MAX_BYTES];
    size_t packed_len;
};

int wire_heartbeat_open(const char *run_dir, const char *sender, struct wire_heartbeat **out)
{
    *out = NULL;
    const char *text = getenv(WIRE_HEARTBEAT_ENV);
    if (run_dir == NULL || text == NULL || text[0] == '\0')
        return 0;
    int64_t interval_ms;
    int rc = parse_i64(WIRE_HEARTBEAT_ENV, text, 0, WIRE_MAX_HEARTBEAT_MS, &interval_ms);
    if (rc != 0)
        return rc;
    if (interval_ms == 0)
        return 0;
    if (strlen(sender) > WIRE_HEARTBEAT_MAX_SENDER)
        return pagoda_error_set(PAGODA_ERANGE, "heartbeat sender name too long: %s", sender);
    char url[512];
    if ((rc = wire_ipc_url(url, sizeof(url), run_dir, "control.ipc")) != 0)
        return rc;

    struct wire_heartbeat *hb = calloc(1, sizeof(*hb));
    if (hb == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "heartbeat");
    hb->interval_ms = (uint64_t)interval_ms;
    Pagoda__Internal__Control ctl = PAGODA__INTERNAL__CONTROL__INIT;
    ctl.has_protocol_version = 1;
    ctl.protocol_version = WIRE_PROTOCOL_VERSION;
    ctl.sender = (char *)sender;
    ctl.has_heartbeat = 1;
    ctl.heartbeat = 1;
    hb->packed_len = protobuf_c_message_get_packed_size(&ctl.base);
    if (hb->packed_len > sizeof(hb->packed)) {
        free(hb);
        return pagoda_error_set(PAGODA_ERANGE, "heartbeat message too large");
    }
    protobuf_c_message_pack(&ctl.base, hb->packed);

    int rv = nng_push0_open(&hb->sock);
    if (rv != 0) {
        free(hb);
        return wire_error(rv, "nng_push0_open");
    }
    /* A supervisor that restarts its listener is found again within a second. */
    nng_socket_set_ms(hb->sock, NNG_OPT_RECONNMINT, 50);
    nng_socket_set_ms(hb->sock, NNG_OPT_RECONNMAXT, 1000);
    if ((rv = nng_dial(hb->sock, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
        nng_close(hb->sock);
        free(hb);
        return wire_error(rv, url);
    }
    *out = hb;
    return 0;
}

uint64_t wire_heartbeat_interval_ms(const struct wire_heartbeat *hb)
{
    return hb != NULL ? hb->interval_ms : 0;
}

void wire_heartbeat_send(struct wire_heartbeat *hb)
{
    if (hb == NULL)
        return;
    nng_msg *m;
    if (nng_msg_alloc(&m, hb->packed_len) != 0)
        return;
    memcpy(nng_msg_body(m), hb->packed, hb->packed_len);
    if (nng_sendmsg(hb->sock, m, NNG_FLAG_NONBLOCK) != 0)
        nng_msg_free(m); /* no supervisor now, or a full buffer: the next one follows */
}

static void on_heartbeat_timer(uv_timer_t *t)
{
    wire_heartbeat_send(t->data);
}

int wire_heartbeat_start(struct wire_heartbeat *hb, uv_loop_t *loop)
{
    if (hb == NULL || hb->started)
        return 0;
    int rv = uv_timer_init(loop, &hb->timer);
    if (rv != 0)
        return pagoda_error_set(PAGODA_EIO, "heartbeat timer: %s", uv_strerror(rv));
    hb->timer.data = hb;
    hb->started = 1;
    uv_unref((uv_handle_t *)&hb->timer);
    uv_timer_start(&hb->timer, on_heartbeat_timer, 0, hb->interval_ms);
    return 0;
}

static void on_timer_closed(uv_handle_t *h)
{
    free(h->data);
}

void wire_heartbeat_close(struct wire_heartbeat *hb)
{
    if (hb == NULL)
        return;
    nng_close(hb->sock);
    if (hb->started)
        uv_close((uv_handle_t *)&hb->timer, on_timer_closed);
    else
        free(hb);
}
