/* libFuzzer target: the client API, i.e. a ClientRequest's bytes through the router's unpacking,
 * authentication, validation and handling (router/router_front.c, router_registry.c,
 * router_tenancy.c, router_admin.c), and the scheduler's ToRouter messages through the router's
 * handler of its link (router_link.c).
 *
 * No sockets carry anything: the router is opened for real (router_open) on a libuv loop, but
 * the NNG calls through which messages enter and leave it are replaced at link time
 * (-Wl,--wrap, below). A client call is delivered the way NNG delivers one: the context's aio
 * completes (its callback runs with the call's bytes as the received message), the router's
 * mailbox wakes its loop and the loop handles the call. A reply (nng_ctx_send) is taken here,
 * and it must unpack as a ClientResponse; every message the router sends the scheduler
 * (wire_send) must unpack as a ToScheduler. Messages from the scheduler go to the handler the
 * router gave wire_inbox_open, and the scheduler's arrival and departure to the link's pipe
 * callback; client connections arrive and go through the client socket's pipe callback (the
 * router caps them and closes idle ones, with nng_pipe_close), and a call carries its
 * connection as NNG's received message does. Contexts the router opens on demand (while calls
 * are parked) are the harness's too. The router's housekeeping runs every millisecond instead of
 * every 100, and a reload's read (libuv's threadpool) completes when the input says. So the
 * whole path a peer reaches runs as in pagoda-router, with no change to the router.
 *
 * The input: a flags byte (a tenants file or none; the scheduler there from the start), then
 * commands: a client call of raw bytes (the common case), raw bytes from the scheduler, a
 * well-formed message from the scheduler built from the input and from what the router sent
 * it (token events for the requests it submitted, stats, PolicyApplied, AdminResult answering
 * the router's cookies, ModelInfo), the link going down or up or refusing sends, client
 * connections arriving or going, the threadpool's work completing, and a little time passing
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
#define MAX_CLIENT_PIPES 8
#define MAX_PARKED 3      /* cfg.max_parked_calls: small, so that the bound is reached */
#define MAX_CONNECTIONS 4 /* cfg.max_connections: the fifth client connection is refused */

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
    /* The pipe callbacks the router registered: the link's (the socket it dials) and the
     * client socket's (the one it listens on), per event. */
    struct {
        nng_socket sock;
        nng_pipe_ev ev;
        nng_pipe_cb cb;
        void *arg;
    } notify[4];
    int num_notify;
    nng_socket link_sock;
    bool link_busy; /* wire_send refuses (a full link) */
    int link_pipes;
    /* Client connections that arrived (ids from 1) and were not closed. */
    uint32_t client_pipes[MAX_CLIENT_PIPES];
    int num_client_pipes;
    uint32_t next_pipe_id;
    bool closed_now; /* nng_pipe_close was called on the client connection arriving */
    /* Work queued on libuv's threadpool (the tenants file's reads), run at the next pump. */
    struct {
        uv_work_t *req;
        uv_work_cb work;
        uv_after_work_cb after;
        bool cancelled;
    } work[2];
    int num_work;
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
    fx.link_sock = s; /* the router dials the scheduler: this socket is the link */
    return 0;
}

int __wrap_nng_listen(nng_socket s, const char *url, nng_listener *l, int flags)
{
    return 0;
}

int __wrap_nng_pipe_notify(nng_socket s, nng_pipe_ev ev, nng_pipe_cb cb, void *arg)
{
    if (fx.num_notify == (int)(sizeof(fx.notify) / sizeof(fx.notify[0])))
        die("more pipe callbacks than this harness expects");
    fx.notify[fx.num_notify].sock = s;
    fx.notify[fx.num_notify].ev = ev;
    fx.notify[fx.num_notify].cb = cb;
    fx.notify[fx.num_notify].arg = arg;
    fx.num_notify++;
    return 0;
}

/* Runs the callback registered for event ev on the link (link != 0) or the client socket. */
static void pipe_event(bool link, uint32_t id, nng_pipe_ev ev)
{
    for (int i = 0; i < fx.num_notify; i++) {
        bool is_link = fx.notify[i].sock.id == fx.link_sock.id;
        if (is_link == link && fx.notify[i].ev == ev) {
            nng_pipe p = NNG_PIPE_INITIALIZER;
            p.id = id;
            fx.notify[i].cb(p, ev, fx.notify[i].arg);
        }
    }
}

static void client_pipe_remove(uint32_t id)
{
    for (int i = 0; i < fx.num_client_pipes; i++)
        if (fx.client_pipes[i] == id) {
            fx.client_pipes[i] = fx.client_pipes[--fx.num_client_pipes];
            pipe_event(false, id, NNG_PIPE_EV_REM_POST);
            return;
        }
}

/* The router closes a client connection (over the cap, or idle): it goes, as with NNG. */
int __wrap_nng_pipe_close(nng_pipe p)
{
    if (fx.next_pipe_id != 0 && p.id == fx.next_pipe_id)
        fx.closed_now = true;
    client_pipe_remove(p.id);
    return 0;
}

/* The router's housekeeping (its one repeating timer, every 100 ms) runs every millisecond here,
 * so that an input's time passing reaches it (idle connections, expired results, the drain). */
int __real_uv_timer_start(uv_timer_t *t, uv_timer_cb cb, uint64_t timeout, uint64_t repeat);

int __wrap_uv_timer_start(uv_timer_t *t, uv_timer_cb cb, uint64_t timeout, uint64_t repeat)
{
    if (repeat != 0)
        timeout = repeat = 1;
    return __real_uv_timer_start(t, cb, timeout, repeat);
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
    return fx.link_busy ? pagoda_error_set(PAGODA_EBUSY, "fuzz: the link is full") : 0;
}

/* Work for libuv's threadpool (a reload's read) waits until the input says it completes (then
 * it runs on the loop's thread, and its completion before the loop runs: no race with the 1 ms
 * timeouts, the same input takes the same path). Work cancelled before (the router closed
 * first) completes with UV_ECANCELED without running, as libuv does for work not started. */
int __wrap_uv_queue_work(uv_loop_t *l, uv_work_t *req, uv_work_cb work, uv_after_work_cb after)
{
    if (fx.num_work == (int)(sizeof(fx.work) / sizeof(fx.work[0])))
        return UV_EBUSY;
    req->loop = l;
    fx.work[fx.num_work].req = req;
    fx.work[fx.num_work].work = work;
    fx.work[fx.num_work].after = after;
    fx.work[fx.num_work].cancelled = false;
    fx.num_work++;
    return 0;
}

int __real_uv_cancel(uv_req_t *req);

int __wrap_uv_cancel(uv_req_t *req)
{
    for (int i = 0; i < fx.num_work; i++)
        if ((uv_req_t *)fx.work[i].req == req) {
            fx.work[i].cancelled = true;
            return 0;
        }
    return __real_uv_cancel(req);
}

static void run_work(void)
{
    while (fx.num_work > 0) {
        uv_work_t *req = fx.work[0].req;
        uv_work_cb work = fx.work[0].work;
        uv_after_work_cb after = fx.work[0].after;
        bool cancelled = fx.work[0].cancelled;
        fx.num_work--;
        memmove(&fx.work[0], &fx.work[1], (size_t)fx.num_work * sizeof(fx.work[0]));
        if (!cancelled)
            work(req);
        after(req, cancelled ? UV_ECANCELED : 0);
    }
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

/* A client call on the first context not busy with another (the others' calls are parked), on
 * client connection conn (0: none, else the conn-th open one, as NNG sets a received message's
 * pipe). */
static void client_call(struct input *in, unsigned conn)
{
    nng_msg *m = take_msg(in, MAX_CALL_BYTES);
    if (conn > 0 && fx.num_client_pipes > 0) {
        nng_pipe p = NNG_PIPE_INITIALIZER;
        p.id = fx.client_pipes[(conn - 1) % (unsigned)fx.num_client_pipes];
        nng_msg_set_pipe(m, p);
    }
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
    Pagoda__Internal__ModelInfo mi = PAGODA__INTERNAL__MODEL_INFO__INIT;
    int32_t tokens[8], prompt[8];
    Pagoda__Internal__SamplingParams sp = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
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
            uint8_t rest = u8(in);
            if (rest & 1) { /* the rest of its SubmitSeq: a prompt, sampling, stop ids */
                ev.n_prompt_token_ids = 1 + u8(in) % 8;
                ev.prompt_token_ids = prompt;
                for (size_t i = 0; i < ev.n_prompt_token_ids; i++)
                    prompt[i] = (int32_t)u8(in) - 2;
                ev.n_stop_token_ids = (rest >> 1) % 3;
                ev.stop_token_ids = prompt;
                ev.has_strict_max_tokens = ev.strict_max_tokens = (rest & 8) != 0;
                if (rest & 16) { /* some out of range: the adopted request keeps no prompt */
                    ev.sampling = &sp;
                    sp.has_temperature = sp.has_top_p = sp.has_seed = 1;
                    sp.temperature = (float)u8(in) / 64.0f - 0.5f;
                    sp.top_p = (float)u8(in) / 128.0f;
                    sp.seed = u8(in);
                }
            }
        }
        evs.n_events = 1;
        evs.events = &ev_ptr;
        evs.has_announce_done = (what & 128) != 0;
        evs.announce_done = 1;
        msg.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS;
        msg.events = &evs;
        break;
    case 2:
        if ((what & 4) && (what & 128)) { /* the model's context (valid from 2 positions) */
            mi.has_max_position_embeddings = (what & 8) == 0;
            mi.max_position_embeddings = u16(in);
            if (what & 16)
                mi.max_position_embeddings <<= 20; /* some beyond 2^32 */
            msg.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_MODEL;
            msg.model = &mi;
        } else if (what & 4) {
            st.has_cookie = st.has_running = st.has_num_blocks = st.has_free_blocks = 1;
            st.cookie = fx.stats_cookie;
            st.running = u8(in);
            st.num_blocks = 100;
            st.free_blocks = u8(in);
            st.has_kv_dtype = (what & 8) != 0; /* the K/V element, ours (0..3) or not */
            st.kv_dtype = (Pagoda__Internal__DType)(int8_t)u8(in);
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
    switch (what % 5) {
    case 0: /* a scheduler joins */
        fx.link_pipes++;
        pipe_event(true, 1000 + (uint32_t)fx.link_pipes, NNG_PIPE_EV_ADD_POST);
        break;
    case 1:
        if (fx.link_pipes > 0) {
            pipe_event(true, 1000 + (uint32_t)fx.link_pipes, NNG_PIPE_EV_REM_POST);
            fx.link_pipes--;
        }
        break;
    case 2:
        fx.link_busy = !fx.link_busy;
        break;
    case 3: /* a client connects (the router closes it at once over its cap) */
        if (fx.num_client_pipes < MAX_CLIENT_PIPES) {
            uint32_t id = ++fx.next_pipe_id;
            fx.closed_now = false;
            pipe_event(false, id, NNG_PIPE_EV_ADD_PRE);
            if (fx.closed_now)
                pipe_event(false, id, NNG_PIPE_EV_REM_POST);
            else
                fx.client_pipes[fx.num_client_pipes++] = id;
        }
        break;
    default: /* a client goes (its calls in progress stay: their replies find no pipe) */
        if (fx.num_client_pipes > 0)
            client_pipe_remove(fx.client_pipes[(what >> 3) % (unsigned)fx.num_client_pipes]);
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
    cfg.max_parked_calls = MAX_PARKED;
    cfg.max_connections = MAX_CONNECTIONS;
    cfg.idle_timeout_ms = 1;
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
    /* Every aio the router allocates is a context's: those of router_open and those it opens
     * on demand while calls are parked. */
    fx.capture = true;
    int rc = router_open(&loop, &cfg, &r);
    if (rc != 0)
        die("router_open");
    if (fx.num_notify != 4 || fx.link_handler == NULL || fx.num_aios != NUM_CONTEXTS)
        die("the router opened differently than this harness expects");
    if (flags & 2) {
        fx.link_pipes++;
        pipe_event(true, 1000 + (uint32_t)fx.link_pipes, NNG_PIPE_EV_ADD_POST);
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
            client_call(&in, op >> 3);
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
            if (op & 16) { /* the threadpool's work (a reload's read) completes */
                run_work();
                pump();
            } else if (sleeps < MAX_SLEEPS) {
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
    run_work();
    uv_run(&loop, UV_RUN_DEFAULT);
    fx.capture = false;
    return 0;
}
