/* pagoda-scheduler: runs the scheduler (scheduler.h) on its links.
 *
 *   pagoda-scheduler --run-dir DIR [--workers 1] [--max-batched-tokens 2048] [--max-seqs 256]
 *                    [--max-queued 4096] [--result-timeout-ms 2000] [--watchdog-ms 10000]
 *                    [--max-steps-in-flight 2] [--step-timeout-per-token-us 5000]
 *                    [--epoch E] [--fault dup-step=N] [--log-level info]
 *                    [--kvpool URL] [--listen URL] [--worker-listen URL]
 *
 * Start: asks kvpool for the pool's geometry (REQ to --kvpool, default ipc://DIR/kvpool.ipc,
 * retried for up to GEOMETRY_WAIT_MS while kvpool starts), then listens PAIR on --listen
 * (default ipc://DIR/scheduler.ipc: the router) and --worker-listen (default
 * ipc://DIR/worker-0.ipc: worker 0) and runs a libuv loop: a wire_inbox per socket
 * hands each message to the scheduler, a timer ticks it every TICK_MS. Control{ready,
 * sender "scheduler"} goes to the supervisor once the worker has answered its first resync.
 * SIGTERM or SIGINT stops the loop and exits 0.
 *
 * Only --workers 1 is supported for now (one worker group, one pool); other values are
 * refused (several engines, each a scheduler of its own, scale out: pagoda-up --engines N).
 * Every address may be tcp://HOST:PORT (wire/address.h checks them before anything starts).
 * --epoch defaults to CLOCK_REALTIME in nanoseconds, which differs for every start.
 * --fault dup-step=N (tests) sends step N twice. */
#include "common/error.h"
#include "common/log.h"
#include "common/parse.h"
#include "scheduler/scheduler.h"
#include "kvpool/kvpool_client.h"
#include "wire/address.h"
#include "wire/wire.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

#include <inttypes.h>
#include <stdbool.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <uv.h>

/* How long to wait for kvpool's answer at start, and how often to ask. */
#define GEOMETRY_WAIT_MS 30000
/* The scheduler's timer period. */
#define TICK_MS 20
/* Messages NNG may queue per PAIR socket before a send is dropped (a step and a duplicate, a
 * burst of token events while the router catches up). */
#define SEND_BUFFER_MSGS 256
#define URL_MAX 512

struct app {
    const char *run_dir;
    const char *kvpool_url;    /* NULL: ipc://DIR/kvpool.ipc */
    const char *listen_url;    /* NULL: ipc://DIR/scheduler.ipc */
    const char *worker_listen; /* NULL: ipc://DIR/worker-0.ipc */
    uv_loop_t loop;
    uv_timer_t timer;
    uv_signal_t sigterm, sigint;
    nng_socket router_sock, worker_sock;
    struct wire_inbox *router_inbox, *worker_inbox;
    struct scheduler *sched;
    struct wire_heartbeat *heartbeat; /* the supervisor's liveness check (wire.h) */
    bool stopping;
};

static int64_t now_ms(void)
{
    return (int64_t)(uv_hrtime() / 1000000u);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: pagoda-scheduler --run-dir DIR [--workers 1] [--max-batched-tokens N]\n"
               "         [--max-seqs N] [--max-queued N] [--result-timeout-ms MS]\n"
               "         [--watchdog-ms MS] [--max-steps-in-flight 1|2]\n"
               "         [--step-timeout-per-token-us US] [--epoch E] [--fault dup-step=N]\n"
               "         [--prefix-cache on|off] [--log-level debug|info|warn|error]\n"
               "         [--kvpool URL] [--listen URL] [--worker-listen URL]\n"
               "--kvpool: kvpool's address (default ipc://DIR/kvpool.ipc); --listen: the\n"
               "router's link (ipc://DIR/scheduler.ipc); --worker-listen: worker 0's link\n"
               "(ipc://DIR/worker-0.ipc). Each may be tcp://HOST:PORT.\n");
}

/* ---- the scheduler's outputs ---------------------------------------------------------------- */

static void send_to_worker(void *ctx, uint32_t worker_id, const Pagoda__Internal__ToWorker *m)
{
    struct app *app = ctx;
    int rc = wire_send(app->worker_sock, &m->base);
    if (rc != 0)
        log_debug("to worker %u: dropped (%s)", (unsigned)worker_id, pagoda_strerror(rc));
}

static int send_to_router(void *ctx, const Pagoda__Internal__ToRouter *m)
{
    struct app *app = ctx;
    int rc = wire_send(app->router_sock, &m->base);
    if (rc != 0)
        log_warn("to router: message dropped (%s); resent later", pagoda_strerror(rc));
    return rc;
}

/* Blocks the loop for up to ~1 s when the supervisor is slow; happens once at readiness and
 * once per hung-worker incident. */
static void send_to_supervisor(void *ctx, const Pagoda__Internal__Control *m)
{
    struct app *app = ctx;
    Pagoda__Internal__Control copy = *m;
    if (m->has_ready && m->ready)
        log_info("ready");
    int rc = wire_control_send(app->run_dir, &copy);
    if (rc != 0)
        log_warn("control message not delivered: %s", pagoda_error_detail());
}

/* ---- the loop ------------------------------------------------------------------------------- */

static Pagoda__Internal__ToScheduler *unpack(nng_msg *m)
{
    Pagoda__Internal__ToScheduler *msg = (Pagoda__Internal__ToScheduler *)wire_unpack(
        &pagoda__internal__to_scheduler__descriptor, m);
    nng_msg_free(m);
    return msg;
}

static void on_router_msg(void *ctx, nng_msg *m)
{
    struct app *app = ctx;
    Pagoda__Internal__ToScheduler *msg = unpack(m);
    scheduler_on_router(app->sched, msg, now_ms());
    if (msg != NULL)
        protobuf_c_message_free_unpacked(&msg->base, NULL);
}

static void on_worker_msg(void *ctx, nng_msg *m)
{
    struct app *app = ctx;
    Pagoda__Internal__ToScheduler *msg = unpack(m);
    scheduler_on_worker(app->sched, 0, msg, now_ms());
    if (msg != NULL)
        protobuf_c_message_free_unpacked(&msg->base, NULL);
}

static void on_tick(uv_timer_t *t)
{
    struct app *app = t->data;
    scheduler_tick(app->sched, now_ms());
}

static void stop(struct app *app)
{
    if (app->stopping)
        return;
    app->stopping = true;
    uv_timer_stop(&app->timer);
    uv_close((uv_handle_t *)&app->timer, NULL);
    uv_close((uv_handle_t *)&app->sigterm, NULL);
    uv_close((uv_handle_t *)&app->sigint, NULL);
    wire_inbox_close(app->router_inbox);
    wire_inbox_close(app->worker_inbox);
    app->router_inbox = app->worker_inbox = NULL;
    wire_heartbeat_close(app->heartbeat);
    app->heartbeat = NULL;
}

static void on_signal(uv_signal_t *h, int signum)
{
    log_info("signal %d: exiting", signum);
    stop(h->data);
}

/* Listens on address, or on ipc://RUN_DIR/NAME when it is NULL. */
static int open_link(nng_socket *s, const char *address, const char *run_dir, const char *name)
{
    char url[URL_MAX];
    int rc = 0;
    if (address != NULL)
        snprintf(url, sizeof(url), "%s", address); /* checked: WIRE_ADDRESS_MAX */
    else
        rc = wire_ipc_url(url, sizeof(url), run_dir, name);
    if (rc != 0)
        return rc;
    if ((rc = wire_pair_open(s, url, 1, WIRE_MAX_MESSAGE_BYTES)) != 0)
        return rc;
    nng_socket_set_int(*s, NNG_OPT_SENDBUF, SEND_BUFFER_MSGS);
    log_info("listening on %s", url);
    return 0;
}

/* ---- flags ---------------------------------------------------------------------------------- */

static int parse_flags(int argc, char **argv, struct scheduler_config *cfg, struct app *app)
{
    const char **run_dir = &app->run_dir;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    cfg->epoch = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    *run_dir = NULL;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (strcmp(flag, "--help") == 0 || strcmp(flag, "-h") == 0) {
            usage(stdout);
            exit(0);
        }
        if (i + 1 >= argc)
            return pagoda_error_set(PAGODA_EINVAL, "%s: missing value (or unknown flag)", flag);
        const char *v = argv[++i];
        int64_t x = 0;
        int rc = 0;
        if (strcmp(flag, "--run-dir") == 0) {
            *run_dir = v;
        } else if (strcmp(flag, "--kvpool") == 0) {
            if ((rc = wire_address_check(flag, v, WIRE_ADDRESS_DIAL)) == 0)
                app->kvpool_url = v;
        } else if (strcmp(flag, "--listen") == 0) {
            if ((rc = wire_address_check(flag, v, WIRE_ADDRESS_ANY)) == 0)
                app->listen_url = v;
        } else if (strcmp(flag, "--worker-listen") == 0) {
            if ((rc = wire_address_check(flag, v, WIRE_ADDRESS_ANY)) == 0)
                app->worker_listen = v;
        } else if (strcmp(flag, "--workers") == 0) {
            if ((rc = parse_i64(flag, v, 1, 1024, &x)) == 0 && x != 1)
                return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                        "--workers %s: only 1 worker is supported for now (run "
                                        "several engines instead: pagoda-up --engines N)",
                                        v);
            cfg->num_workers = (int32_t)x;
        } else if (strcmp(flag, "--max-batched-tokens") == 0) {
            if ((rc = parse_i64(flag, v, 1, SCHEDULER_MAX_BATCHED_TOKENS_LIMIT, &x)) == 0)
                cfg->max_batched_tokens = (int32_t)x;
        } else if (strcmp(flag, "--max-seqs") == 0) {
            if ((rc = parse_i64(flag, v, 1, SCHEDULER_MAX_SEQS_LIMIT, &x)) == 0)
                cfg->max_seqs = (int32_t)x;
        } else if (strcmp(flag, "--max-queued") == 0) {
            if ((rc = parse_i64(flag, v, 1, SCHEDULER_MAX_QUEUED_LIMIT, &x)) == 0)
                cfg->max_queued = (int32_t)x;
        } else if (strcmp(flag, "--result-timeout-ms") == 0) {
            if ((rc = parse_i64(flag, v, 1, SCHEDULER_MAX_TIMEOUT_MS, &x)) == 0)
                cfg->result_timeout_ms = (int32_t)x;
        } else if (strcmp(flag, "--watchdog-ms") == 0) {
            if ((rc = parse_i64(flag, v, 1, SCHEDULER_MAX_TIMEOUT_MS, &x)) == 0)
                cfg->watchdog_ms = (int32_t)x;
        } else if (strcmp(flag, "--max-steps-in-flight") == 0) {
            if ((rc = parse_i64(flag, v, 1, SCHEDULER_MAX_STEPS_IN_FLIGHT, &x)) == 0)
                cfg->max_steps_in_flight = (int32_t)x;
        } else if (strcmp(flag, "--step-timeout-per-token-us") == 0) {
            if ((rc = parse_i64(flag, v, 0, SCHEDULER_MAX_STEP_TIMEOUT_PER_TOKEN_US, &x)) == 0)
                cfg->step_timeout_per_token_us = (int32_t)x;
        } else if (strcmp(flag, "--epoch") == 0) {
            if ((rc = parse_i64(flag, v, 1, INT64_MAX, &x)) == 0)
                cfg->epoch = (uint64_t)x;
        } else if (strcmp(flag, "--fault") == 0) {
            const char *prefix = "dup-step=";
            if (strncmp(v, prefix, strlen(prefix)) != 0)
                return pagoda_error_set(PAGODA_EINVAL, "--fault %s: expected dup-step=N", v);
            if ((rc = parse_i64(flag, v + strlen(prefix), 1, INT64_MAX, &x)) == 0)
                cfg->fault_dup_step = (uint64_t)x;
        } else if (strcmp(flag, "--prefix-cache") == 0) {
            if (strcmp(v, "on") != 0 && strcmp(v, "off") != 0)
                return pagoda_error_set(PAGODA_EINVAL, "--prefix-cache %s: expected on or off", v);
            cfg->prefix_cache = strcmp(v, "on") == 0;
        } else if (strcmp(flag, "--log-level") == 0) {
            enum log_level level;
            if ((rc = log_level_parse(v, &level)) != 0)
                return pagoda_error_set(rc, "--log-level %s: expected debug, info, warn or error",
                                        v);
            log_set_level(level);
        } else {
            return pagoda_error_set(PAGODA_EINVAL, "unknown flag %s", flag);
        }
        if (rc != 0)
            return rc;
    }
    if (*run_dir == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "--run-dir is required");
    /* The queue bound follows --max-seqs when only that was raised. */
    if (cfg->max_queued < cfg->max_seqs)
        cfg->max_queued = cfg->max_seqs;
    return 0;
}

int main(int argc, char **argv)
{
    log_set_name("scheduler");
    /* A hang-up (SIGHUP: a closed terminal, or an operator's "reload") would kill it by default;
     * the group's programs stop on SIGTERM and SIGINT only (the router's SIGHUP reloads). */
    signal(SIGHUP, SIG_IGN);
    struct app app;
    memset(&app, 0, sizeof(app));
    struct scheduler_config cfg;
    scheduler_config_default(&cfg);
    char buf[600];
    int rc = parse_flags(argc, argv, &cfg, &app);
    if (rc != 0) {
        fprintf(stderr, "pagoda-scheduler: %s\n", pagoda_error_message(rc, buf, sizeof(buf)));
        usage(stderr);
        return 2;
    }
    if ((rc = app.kvpool_url != NULL
                  ? kvpool_fetch_geometry_at(app.kvpool_url, -1, GEOMETRY_WAIT_MS, NULL,
                                             &cfg.geometry, NULL, 0)
                  : kvpool_fetch_geometry(app.run_dir, -1, GEOMETRY_WAIT_MS, NULL, &cfg.geometry,
                                          NULL, 0)) != 0) {
        log_error("pool geometry: %s", pagoda_error_message(rc, buf, sizeof(buf)));
        return 1;
    }
    log_info("pool %" PRIu64 ": %d blocks of %d tokens; epoch %" PRIu64, cfg.geometry.pool_id,
             (int)cfg.geometry.num_blocks, (int)cfg.geometry.block_size, cfg.epoch);
    struct scheduler_io io = {.ctx = &app,
                              .to_worker = send_to_worker,
                              .to_router = send_to_router,
                              .to_supervisor = send_to_supervisor};
    bool router_open = false, worker_open = false, loop_open = false;
    if ((rc = scheduler_open(&cfg, &io, &app.sched)) != 0)
        goto fail;
    if ((rc = open_link(&app.router_sock, app.listen_url, app.run_dir, "scheduler.ipc")) != 0)
        goto fail;
    router_open = true;
    if ((rc = open_link(&app.worker_sock, app.worker_listen, app.run_dir, "worker-0.ipc")) != 0)
        goto fail;
    worker_open = true;
    if (uv_loop_init(&app.loop) != 0) {
        rc = pagoda_error_set(PAGODA_EIO, "uv_loop_init failed");
        goto fail;
    }
    loop_open = true;
    uv_timer_init(&app.loop, &app.timer);
    app.timer.data = &app;
    uv_signal_init(&app.loop, &app.sigterm);
    uv_signal_init(&app.loop, &app.sigint);
    app.sigterm.data = app.sigint.data = &app;
    uv_signal_start(&app.sigterm, on_signal, SIGTERM);
    uv_signal_start(&app.sigint, on_signal, SIGINT);
    if ((rc = wire_inbox_open(&app.loop, app.router_sock, on_router_msg, &app,
                              &app.router_inbox)) != 0 ||
        (rc = wire_inbox_open(&app.loop, app.worker_sock, on_worker_msg, &app,
                              &app.worker_inbox)) != 0) {
        stop(&app);
        uv_run(&app.loop, UV_RUN_DEFAULT);
        goto fail;
    }
    scheduler_tick(app.sched, now_ms()); /* announces the epoch to the worker */
    uv_timer_start(&app.timer, on_tick, TICK_MS, TICK_MS);
    if ((rc = wire_heartbeat_open(app.run_dir, "scheduler", &app.heartbeat)) != 0 ||
        (rc = wire_heartbeat_start(app.heartbeat, &app.loop)) != 0)
        log_warn("no heartbeat to the supervisor: %s", pagoda_error_message(rc, buf, sizeof(buf)));
    uv_run(&app.loop, UV_RUN_DEFAULT);
    uv_loop_close(&app.loop);
    nng_close(app.router_sock);
    nng_close(app.worker_sock);
    struct scheduler_stats st;
    scheduler_get_stats(app.sched, &st);
    log_info("exit: %" PRIu64 " steps (at most %u in flight), %" PRIu64 " resyncs, %" PRIu64
             " preemptions, %" PRIu64 " tokens discarded, %.1f us CPU per step",
             st.steps, st.peak_steps_in_flight, st.resyncs, st.preemptions, st.discarded_tokens,
             st.step_cpu_us);
    scheduler_close(app.sched);
    return 0;
fail:
    log_error("%s", pagoda_error_message(rc, buf, sizeof(buf)));
    if (loop_open)
        uv_loop_close(&app.loop);
    if (worker_open)
        nng_close(app.worker_sock);
    if (router_open)
        nng_close(app.router_sock);
    scheduler_close(app.sched);
    return 1;
}
