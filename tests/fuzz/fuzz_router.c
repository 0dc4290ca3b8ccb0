/* libFuzzer target: the client API, i.e. a ClientRequest's bytes through the router's unpacking,
 * authentication, validation and handling (router/router.c, router_tenancy.c, router_admin.c),
 * and the scheduler's ToRouter messages through the router's handler of its link.
 *
 * No sockets carry anything: the router is opened for real (router_open) on a libuv loop, but
 * the NNG calls through which messages enter and leave it are replaced at link time
 * (-Wl,--wrap, below). A client call is delivered the way NNG delivers one: the context's aio
 * completes (its callback runs with the call's bytes as the received message), the router's
 * mailbox wakes its loop and the loop handles the call. A reply (nng_ctx_send) is taken here,
 * and it must unpack as a ClientResponse; every message the router sends the scheduler
 * (wire_send) must unpack as a ToScheduler. Messages from the scheduler go to the handler the
 * router gave wire_inbox_open, and the scheduler's arrival and departure to its pipe callback.
 * So the whole path a peer reaches runs as in pagoda-router, with no change to the router.
 *
 * The input: a flags byte (a tenants file or none; the scheduler there from the start), then
 * commands: a client call of raw bytes (the common case), raw bytes from the scheduler, a
 * well-formed message from the scheduler built from the input and from what the router sent
 * it (token events for the requests it submitted, stats, PolicyApplied, AdminResult answering
 * the router's cookies), the link going down or up or refusing sends, and a little time passing
 * (the router's timeouts are set to 1 ms so that parked calls time out). */
#include "common/error.h"
#include "common/log.h"
#include "proto/internal.pb-c.h"
#include "proto/pagoda.pb-c.h"
#include "router/router.h"
#include "wire/wire.h"

#include <nng/nng.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#define NUM_CONTEXTS 4
#define MAX_AIOS 64
#define MAX_CALL_BYTES 4096
#define MAX_SLEEPS 1 /* time passing costs real time: once per input */
#define SLEEP_US 1100
#define KNOWN_IDS 8

/* ---- what the router does with NNG, replaced ------------------------------------------------ */

struct fake_aio {
    nng_aio *aio;
    void (*cb)(void *);
    void *arg;
    bool busy;         /* a call was delivered and has not been answered */
    nng_msg *incoming; /* the call being delivered */
    bool delivering;
};

static struct {
    struct fake_aio aios[MAX_AIOS];
    int num_aios;
    bool capture; /* aios allocated now are the router's contexts' */
    wire_handler link_handler;
    void *link_ctx;
    nng_pipe_cb pipe_cb;
    void *pipe_arg;
    bool link_busy; /* wire_send refuses (a full link) */
    int link_pipes;
    /* What the router sent the scheduler, for the scheduler's answers. */
    uint8_t ids[KNOWN_IDS][16];
    int num_ids;
    uint64_t policy_version, admin_cookie, stats_cookie;
    uint64_t replies, sends;
} fx;

/* PAGODA_FUZZ_VERBOSE=1: every reply and every message to the scheduler is printed (to check
 * what a seed does). */
static bool verbose;

int __real_nng_aio_alloc(nng_aio **aio, void (*cb)(void *), void *arg);
int __real_nng_aio_result(nng_aio *aio);
nng_msg *__real_nng_aio_get_msg(nng_aio *aio);

static struct fake_aio *find_aio(nng_aio *aio)
{
    for (int i = 0; i < fx.num_aios; i++)
        if (fx.aios[i].aio == aio)
            return &fx.aios[i];
    return NULL;
}

int __wrap_nng_aio_alloc(nng_aio **aio, void (*cb)(void *), void *arg)
{
    int rv = __real_nng_aio_alloc(aio, cb, arg);
    if (rv == 0 && fx.capture && fx.num_aios < MAX_AIOS)
        fx.aios[fx.num_aios++] = (struct fake_aio){.aio = *aio, .cb = cb, .arg = arg};
    return rv;
}

int __wrap_nng_aio_result(nng_aio *aio)
{
    struct fake_aio *f = find_aio(aio);
    return f != NULL ? 0 : __real_nng_aio_result(aio);
}

nng_msg *__wrap_nng_aio_get_msg(nng_aio *aio)
{
    struct fake_aio *f = find_aio(aio);
    if (f != NULL && f->delivering) {
        nng_msg *m = f->incoming;
        f->incoming = NULL;
        return m;
    }
    return __real_nng_aio_get_msg(aio);
}

void __wrap_nng_ctx_recv(nng_ctx ctx, nng_aio *aio)
{
    /* The harness delivers calls itself. */
}

static void die(const char *why)
{
    fprintf(stderr, "fuzz_router: %s\n", why);
    abort();
}

void __wrap_nng_ctx_send(nng_ctx ctx, nng_aio *aio)
{
    struct fake_aio *f = find_aio(aio);
    if (f == NULL)
        die("a reply on an aio that is not a context's");
    if (!f->busy)
        die("a second reply to one call");
    nng_msg *m = __real_nng_aio_get_msg(aio);
    nng_aio_set_msg(aio, NULL);
    Pagoda__ClientResponse *resp =
        pagoda__client_response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    if (resp == NULL)
        die("a reply that is not a ClientResponse");
    if (verbose)
        fprintf(stderr, "reply: error %d %s, update %s\n", resp->error_code,
                resp->error_message ? resp->error_message : "", resp->update ? "yes" : "no");
    pagoda__client_response__free_unpacked(resp, NULL);
    nng_msg_free(m);
    f->busy = false;
    fx.replies++;
    /* The send completed: the router's callback re-arms the receive. */
    f->cb(f->arg);
}

int __wrap_nng_dial(nng_socket s, const char *url, nng_dialer *d, int flags)
{
    return 0;
}

int __wrap_nng_listen(nng_socket s, const char *url, nng_listener *l, int flags)
{
    return 0;
}

int __wrap_nng_pipe_notify(nng_socket s, nng_pipe_ev ev, nng_pipe_cb cb, void *arg)
{
    fx.pipe_cb = cb;
    fx.pipe_arg = arg;
    return 0;
}

static int inbox_token;

int __wrap_wire_inbox_open(uv_loop_t *loop, nng_socket s, wire_handler handler, void *ctx,
                           struct wire_inbox **out)
{
    fx.link_handler = handler;
    fx.link_ctx = ctx;
    *out = (struct wire_inbox *)&inbox_token;
    return 0;
}

void __wrap_wire_inbox_close(struct wire_inbox *in)
{
    fx.link_handler = NULL;
}

int __wrap_wire_send(nng_socket s, const ProtobufCMessage *msg)
{
    if (msg->descriptor != &pagoda__internal__to_scheduler__descriptor)
        die("the router sent the scheduler something else than a ToScheduler");
    size_t n = protobuf_c_message_get_packed_size(msg);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL)
        abort();
    protobuf_c_message_pack(msg, buf);
    Pagoda__Internal__ToScheduler *m = pagoda__internal__to_scheduler__unpack(NULL, n, buf);
    free(buf);
    if (m == NULL)
        die("a message to the scheduler that does not unpack");
    fx.sends++;
    if (verbose)
        fprintf(stderr, "to scheduler: case %d\n", (int)m->msg_case);
    if (m->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_SUBMIT && m->submit->has_request_id &&
        m->submit->request_id.len == 16) {
        memcpy(fx.ids[fx.num_ids % KNOWN_IDS], m->submit->request_id.data, 16);
        fx.num_ids++;
    } else if (m->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_POLICY) {
        fx.policy_version = m->policy->version;
    } else if (m->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_ADMIN) {
        fx.admin_cookie = m->admin->cookie;
    } else if (m->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS) {
        fx.stats_cookie = m->stats->cookie;
    }
    pagoda__internal__to_scheduler__free_unpacked(m, NULL);
    return fx.link_busy ? PAGODA_EBUSY : 0;
}

/* ---- the input ------------------------------------------------------------------------------ */

struct input {
    const uint8_t *p;
    size_t left;
};

static uint8_t u8(struct input *in)
{
    if (in->left == 0)
        return 0;
    in->left--;
    return *in->p++;
}

static uint16_t u16(struct input *in)
{
    return (uint16_t)(u8(in) | u8(in) << 8);
}

static nng_msg *take_msg(struct input *in, size_t max)
{
    size_t n = u16(in) % max;
    if (n > in->left)
        n = in->left;
    nng_msg *m;
    if (nng_msg_alloc(&m, n) != 0)
        abort();
    memcpy(nng_msg_body(m), in->p, n);
    in->p += n;
    in->left -= n;
    return m;
}

/* ---- the harness ---------------------------------------------------------------------------- */

static uv_loop_t loop;
static char tenants_path[64];

/* The tenants file of the runs that have one (keys k1, k2, k3 and the admin key adm; the pin's
 * tokens are the scheduler's to compute). */
static const char TENANTS[] =
    "{\"admin_keys\": [\"adm\"], \"groups\": [{\"name\": \"team\", \"cache_quota_blocks\": 100}],"
    " \"tenants\": [{\"name\": \"alice\", \"api_keys\": [\"k1\", \"k2\"], \"group\": \"team\","
    " \"max_running\": 2, \"max_waiting\": 2},"
    " {\"name\": \"bob\", \"api_keys\": [\"k3\"], \"cache_quota_blocks\": 10}],"
    " \"pins\": [{\"name\": \"sys\", \"token_ids\": [1, 2, 3], \"tenants\": [\"alice\"]}]}";

static void remove_tenants_file(void)
{
    unlink(tenants_path);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_OFF);
    verbose = getenv("PAGODA_FUZZ_VERBOSE") != NULL;
    if (uv_loop_init(&loop) != 0)
        abort();
    snprintf(tenants_path, sizeof(tenants_path), "/tmp/pagoda-fuzz-router-%d.json", (int)getpid());
    FILE *f = fopen(tenants_path, "w");
    if (f == NULL || fputs(TENANTS, f) < 0 || fclose(f) != 0)
        abort();
    atexit(remove_tenants_file);
    return 0;
}

static void pump(void)
{
    uv_run(&loop, UV_RUN_NOWAIT);
}

/* A client call on the first context not busy with another (the others' calls are parked). */
static void client_call(struct input *in)
{
    nng_msg *m = take_msg(in, MAX_CALL_BYTES);
    for (int i = 0; i < fx.num_aios; i++) {
        struct fake_aio *f = &fx.aios[i];
        if (f->busy)
            continue;
        f->busy = true;
        f->incoming = m;
        f->delivering = true;
        f->cb(f->arg); /* on_ctx_io: the received call goes to the mailbox */
        f->delivering = false;
        if (f->incoming != NULL)
            die("the router did not take a received call");
        pump();
        return;
    }
    nng_msg_free(m);
}

static void link_message(const Pagoda__Internal__ToRouter *msg)
{
    size_t n = pagoda__internal__to_router__get_packed_size(msg);
    nng_msg *m;
    if (nng_msg_alloc(&m, n) != 0)
        abort();
    pagoda__internal__to_router__pack(msg, nng_msg_body(m));
    fx.link_handler(fx.link_ctx, m);
    pump();
}

/* A well-formed message from the scheduler, about what the router sent it. */
static void scheduler_answer(struct input *in)
{
    uint8_t what = u8(in);
    Pagoda__Internal__ToRouter msg = PAGODA__INTERNAL__TO_ROUTER__INIT;
    Pagoda__Internal__TokenEvents evs = PAGODA__INTERNAL__TOKEN_EVENTS__INIT;
    Pagoda__Internal__TokenEvent ev = PAGODA__INTERNAL__TOKEN_EVENT__INIT;
    Pagoda__Internal__TokenEvent *ev_ptr = &ev;
    Pagoda__Internal__SchedulerStats st = PAGODA__INTERNAL__SCHEDULER_STATS__INIT;
    Pagoda__Internal__PolicyApplied pa = PAGODA__INTERNAL__POLICY_APPLIED__INIT;
    Pagoda__Internal__PinStatus pin = PAGODA__INTERNAL__PIN_STATUS__INIT;
    Pagoda__Internal__PinStatus *pin_ptr = &pin;
    Pagoda__Internal__AdminResult ar = PAGODA__INTERNAL__ADMIN_RESULT__INIT;
    Pagoda__Internal__TenantFigures tf = PAGODA__INTERNAL__TENANT_FIGURES__INIT;
    Pagoda__Internal__TenantFigures *tf_ptr = &tf;
    Pagoda__Internal__NamespaceFigures nf = PAGODA__INTERNAL__NAMESPACE_FIGURES__INIT;
    Pagoda__Internal__NamespaceFigures *nf_ptr = &nf;
    int32_t tokens[8];
    float logprobs[8];
    uint8_t id[16] = {0};
    switch (what % 4) {
    case 0:
    case 1: /* token events of a request the router submitted (or of an unknown one) */
        if (fx.num_ids > 0 && (what & 4) == 0)
            memcpy(id, fx.ids[u8(in) % (fx.num_ids < KNOWN_IDS ? fx.num_ids : KNOWN_IDS)], 16);
        else
            id[0] = u8(in);
        ev.has_request_id = ev.has_offset = 1;
        ev.request_id.data = id;
        ev.request_id.len = 16;
        ev.offset = u8(in) % 24;
        ev.n_token_ids = u8(in) % 9;
        ev.token_ids = tokens;
        for (size_t i = 0; i < ev.n_token_ids; i++)
            tokens[i] = (int32_t)u8(in) - 2;
        if (what & 8) {
            ev.n_logprobs = ev.n_token_ids;
            ev.logprobs = logprobs;
            for (size_t i = 0; i < ev.n_logprobs; i++)
                logprobs[i] = -(float)u8(in) / 16.0f;
        }
        ev.has_finish_reason = (what & 16) != 0;
        ev.finish_reason = (Pagoda__Internal__FinishReason)(u8(in) % 6);
        ev.has_prompt_tokens = ev.has_cached_tokens = 1;
        ev.prompt_tokens = u8(in);
        ev.cached_tokens = u8(in);
        if (ev.finish_reason == PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR) {
            ev.has_error_code = 1;
            ev.error_code = PAGODA_ERANGE;
            ev.error_message = "refused";
        }
        if (what & 32) { /* an announcement (after a RouterHello) */
            ev.has_announce = ev.has_max_tokens = ev.has_ignore_eos = 1;
            ev.announce = 1;
            ev.tenant = (what & 64) ? "alice" : "default";
            ev.max_tokens = u8(in) % 32;
            ev.has_client_request_id = 1;
            ev.client_request_id.data = id;
            ev.client_request_id.len = 16;
        }
        evs.n_events = 1;
        evs.events = &ev_ptr;
        evs.has_announce_done = (what & 128) != 0;
        evs.announce_done = 1;
        msg.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS;
        msg.events = &evs;
        break;
    case 2:
        if (what & 4) {
            st.has_cookie = st.has_running = st.has_num_blocks = st.has_free_blocks = 1;
            st.cookie = fx.stats_cookie;
            st.running = u8(in);
            st.num_blocks = 100;
            st.free_blocks = u8(in);
            msg.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_STATS;
            msg.stats = &st;
        } else {
            pa.has_version = 1;
            pa.version = fx.policy_version - (what & 8 ? 1 : 0);
            pin.name = (what & 16) ? "sys" : "other";
            pin.has_ready = pin.has_blocks = 1;
            pin.ready = (what & 32) != 0;
            pin.blocks = u8(in);
            if (!pin.ready) {
                pin.has_error_code = 1;
                pin.error_code = PAGODA_ERANGE;
                pin.error_message = "too long";
            }
            pa.n_pins = 1;
            pa.pins = &pin_ptr;
            msg.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_POLICY_APPLIED;
            msg.policy_applied = &pa;
        }
        break;
    default:
        ar.has_cookie = 1;
        ar.cookie = fx.admin_cookie;
        if (what & 4) {
            ar.has_error_code = 1;
            ar.error_code = PAGODA_ENOENT;
            ar.error_message = "no such namespace";
        }
        tf.name = (what & 8) ? "alice" : "zed";
        tf.namespace_ = "g:team";
        tf.has_lookups = tf.has_hits = tf.has_query_tokens = tf.has_hit_tokens = 1;
        tf.lookups = u8(in);
        tf.hits = u8(in);
        tf.query_tokens = u8(in);
        tf.hit_tokens = u8(in);
        nf.name = "g:team";
        nf.has_cached_blocks = 1;
        nf.cached_blocks = u8(in);
        ar.n_tenants = (what & 16) ? 1 : 0;
        ar.tenants = &tf_ptr;
        ar.n_namespaces = (what & 32) ? 1 : 0;
        ar.namespaces = &nf_ptr;
        ar.n_pins = (what & 64) ? 1 : 0;
        pin.name = "sys";
        ar.pins = &pin_ptr;
        ar.has_flushed_blocks = 1;
        ar.flushed_blocks = u8(in);
        msg.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_ADMIN;
        msg.admin = &ar;
        break;
    }
    link_message(&msg);
}

static void link_event(struct input *in)
{
    uint8_t what = u8(in);
    switch (what % 3) {
    case 0: /* a scheduler joins */
        fx.link_pipes++;
        fx.pipe_cb((nng_pipe)NNG_PIPE_INITIALIZER, NNG_PIPE_EV_ADD_POST, fx.pipe_arg);
        break;
    case 1:
        if (fx.link_pipes > 0) {
            fx.link_pipes--;
            fx.pipe_cb((nng_pipe)NNG_PIPE_INITIALIZER, NNG_PIPE_EV_REM_POST, fx.pipe_arg);
        }
        break;
    default:
        fx.link_busy = !fx.link_busy;
        break;
    }
    pump();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct input in = {data, size};
    uint8_t flags = u8(&in);
    memset(&fx, 0, sizeof(fx));

    struct router_config cfg;
    router_config_default(&cfg);
    cfg.run_dir = "/nonexistent";
    cfg.listen_url = "inproc://pagoda-fuzz-router";
    cfg.tenants_file = (flags & 1) ? tenants_path : NULL;
    cfg.num_contexts = NUM_CONTEXTS;
    cfg.max_live_requests = 6;
    cfg.max_finished_requests = 4;
    cfg.finished_ttl_ms = 1;
    cfg.max_prompt_tokens = 64;
    cfg.max_new_tokens = 64;
    cfg.max_wait_ms = 1;
    cfg.stats_timeout_ms = 1;
    cfg.admin_timeout_ms = 1;
    cfg.drain_timeout_ms = 1;
    struct router *r = NULL;
    fx.capture = true;
    int rc = router_open(&loop, &cfg, &r);
    fx.capture = false;
    if (rc != 0)
        die("router_open");
    if (fx.pipe_cb == NULL || fx.link_handler == NULL || fx.num_aios != NUM_CONTEXTS)
        die("the router opened differently than this harness expects");
    if (flags & 2) {
        fx.link_pipes++;
        fx.pipe_cb((nng_pipe)NNG_PIPE_INITIALIZER, NNG_PIPE_EV_ADD_POST, fx.pipe_arg);
    }
    pump();

    int sleeps = 0;
    while (in.left > 0) {
        uint8_t op = u8(&in);
        switch (op % 8) {
        case 0:
        case 1:
        case 2:
        case 3:
            client_call(&in);
            break;
        case 4: {
            nng_msg *m = take_msg(&in, MAX_CALL_BYTES);
            fx.link_handler(fx.link_ctx, m);
            pump();
            break;
        }
        case 5:
            scheduler_answer(&in);
            break;
        case 6:
            link_event(&in);
            break;
        default:
            if (sleeps < MAX_SLEEPS) {
                sleeps++;
                usleep(SLEEP_US);
                pump();
            }
            if (op & 8)
                router_drain(r, NULL, NULL);
            break;
        }
    }

    router_close(r);
    uv_run(&loop, UV_RUN_DEFAULT);
    return 0;
}
