/* pagoda-supervisor: starts pagoda's process group on one machine, keeps it running, stops it.
 *
 *   pagoda-supervisor --run-dir DIR --bin-dir BINDIR --model MODEL [--workers 1] [--listen URL]
 *                     [--http-listen HOST:PORT] [--engines 1] [--role all|engine|router]
 *                     [--scheduler-listen URL] [--worker-listen URL] [--kvpool-listen URL]
 *                     [--scheduler URL]... [--routing cache-aware|round-robin]
 *                     [--block-size B] [--kv-blocks N | --kv-bytes B] [--backend cpu|cuda|null]
 *                     [--log-level info] [--ready-timeout-ms 60000] [--stop-timeout-ms 30000]
 *                     [--heartbeat-ms 1000] [--heartbeat-misses 15]
 *                     [--kvpool-arg A]... [--worker-arg A]... [--scheduler-arg A]...
 *                     [--router-arg A]... [--tensor-parallel N [--devices D0,D1,...]]
 *
 * Everything happens on one libuv loop. The supervisor listens PULL on ipc://DIR/control.ipc,
 * where every program pushes Control messages (docs/protocol.md), and starts the programs of
 * BINDIR in order, kvpool, worker 0..N-1, scheduler, router, each after the one before it has
 * pushed Control{ready}: every program needs the ones before it (a worker maps the kvpool's
 * memory, the scheduler resyncs every worker, the router dials the scheduler). Before any of
 * them, the router's own command line with --check reads its tenants file and the model's
 * tokenizer files and exits: one it cannot take fails the start at once, rather than once the
 * engines have loaded the weights. A program that
 * exits or stays silent for --ready-timeout-ms during this start fails it: the supervisor stops
 * what it started and exits 1, naming the program. When the last is ready it writes DIR/ready
 * (the client URL, as a client on this host dials it) for whoever waits on the group
 * (deploy/pagoda-up, tests).
 *
 * Afterwards a program that exits, however, is restarted with back-off (restart_policy.h), and
 * not waited for: the others keep running, and the protocol reconnects them. Repeated fast
 * exits stop the group (exit 1): the whole group, every engine and the router, even when the
 * program that loops is one engine's (a known limit: stopping that engine alone and keeping the
 * router serving the others is not done; across hosts, --role engine per host, it is only that
 * host's engines that stop). So does, at once, an exit with
 * PAGODA_EXIT_CANNOT_RUN (common/exit_status.h: a program that says it cannot run as configured,
 * such as a GPU worker whose weights do not fit beside the pool: restarting it would only repeat
 * that). A Control{hung_worker_id, hung_worker_pid} from the scheduler's watchdog kills that worker
 * with SIGKILL when the pid is the worker's current process (a stale report about a process already
 * replaced kills nothing); its restart follows from its exit.
 *
 * Liveness: the supervisor puts PAGODA_HEARTBEAT_MS=--heartbeat-ms in its programs' environment
 * and each of them pushes Control{heartbeat} that often from its event loop (wire.h). A program
 * that sent its ready or a first heartbeat and then nothing for --heartbeat-ms x
 * --heartbeat-misses has a loop that no longer runs (blocked in a call, deadlocked, stopped):
 * it is killed with SIGKILL and restarted like any exit. --heartbeat-ms 0 turns this off. The
 * default (15 s) outlasts the scheduler's watchdog (10 s), which reports a worker stuck in a
 * step more precisely.
 *
 * --workers: the scheduler drives one worker for now, so --workers above 1 is refused here, at
 * once, rather than by the scheduler after the workers have started (several engines are how a
 * group grows: --engines N).
 *
 * Engines: an engine is one kvpool, its worker(s) and its scheduler. --engines N (default 1)
 * starts N of them, then one router given every engine's scheduler address (--scheduler, once
 * per engine, in order; --routing passes through). With one engine everything runs in DIR as it
 * always has; with N each engine runs in DIR/engine-I (its own sockets, shared-memory pool,
 * control socket and logs, e.g. DIR/engine-1/worker-0.log), and --kv-blocks/--kv-bytes size
 * each engine's pool (a GPU shared by N engines needs one of them: each kvpool would otherwise
 * take all the free memory). The start goes engine by engine, each program after the one
 * before it is ready; a program that exits is restarted alone, like any other.
 *
 * Tensor parallelism: --tensor-parallel N (1..SUP_MAX_TP; --backend cpu or cuda) gives every
 * engine N ranks, each one kvpool and one worker process (docs/tensor-parallel.md): kvpool rank R
 * gets --tp-rank R --tp-size N (a pool of the shard's KV heads; R > 0 under its own names,
 * "kvpool-rR" and DIR/kvpool-rR.ipc), with --backend cuda on GPU --devices' R-th entry (--device
 * D); worker rank R gets --tp-rank R --tp-size N --tp-group DIR/tp-group (rank 0 is "worker-0" and
 * talks to the scheduler, R > 0 are "worker-0-rR" and follow rank 0's steps). The supervisor
 * makes the group file DIR/tp-group fresh (comm_file_create: a new file through a rename) each
 * time it starts the worker ranks, so a stale one (from a killed group or supervisor) is never
 * joined; the file stays after the group stops and is replaced at the next start. The worker
 * ranks are one unit: they start together (the start waits for rank 0, which is ready once every
 * rank has loaded), and when any of them exits the others are killed (SIGKILL: a rank of a broken
 * group holds nothing a clean exit would save, the KV is kvpool's) and, once all are gone, all
 * are restarted with the unit's back-off (rank 0's restart policy); the scheduler's resync
 * replays what the group lost. A kvpool rank restarts alone, like any kvpool. With --backend cuda
 * every rank's pool must have the same block count, so --kv-blocks or --kv-bytes is required
 * (each GPU's free memory would size its pool differently). --workers stays 1.
 *
 * Roles: --role engine starts only the engines (no router: a router on another host is
 * configured with their addresses, as SGLang's router takes its workers' URLs; DIR/ready then
 * holds the schedulers' --scheduler-listen addresses, one a line); --role router starts only the
 * router (and the gateway), given its engines with --scheduler URL, repeated.
 *
 * Addresses: every link between programs is configuration. --listen (clients, default
 * tcp://127.0.0.1:7450), --scheduler-listen (the router's link to a scheduler), --worker-listen
 * (a scheduler's link to its worker) and --kvpool-listen (kvpool's control link) may each be
 * ipc://PATH or tcp://HOST:PORT; absent, they are the ipc:// paths of the run directory as
 * before. With N engines an explicit address must be tcp://, and engine I uses PORT+I. Ports that
 * overlap (a link's PORT..PORT+N-1 and another link's, or --listen's and --http-listen's, those
 * of the router) are refused: they would cross-wire links. Whatever dials on this host (workers,
 * schedulers, the router, the gateway's --router) and DIR/ready take a listening host of 0.0.0.0
 * or * as 127.0.0.1 (and [::] as [::1], wire_address_dial_form); --scheduler, which only dials,
 * refuses them. --role engine needs a tcp:// --scheduler-listen (an ipc:// link reaches no
 * router elsewhere). Every address is checked (wire/address.h) before anything starts. The KV pool
 * itself stays on its engine's host (shared memory or GPU descriptors), whatever --kvpool-listen
 * says.
 *
 * The supervisor's own control link is not configurable and never tcp: it listens on
 * ipc://DIR/control.ipc (and, with several engines, on DIR/engine-I/control.ipc, where each
 * engine's programs push), because it credits every Control message to the process that sent it
 * by the peer pid that only a Unix socket carries, and the programs it supervises are its
 * children on this host anyway. Nobody else can reach it: DIR is 0700.
 *
 * The keeper (deploy/keeper.h): each kvpool is started with one end of a socket pair as its
 * descriptor 3 (WIRE_KVPOOL_KEEPER_ENV=3 in its environment). A GPU kvpool deposits its pool's
 * descriptors there; the supervisor takes the deposit when kvpool is ready (and when it exits),
 * holds it, and offers it on the next kvpool's link, so a kvpool killed with SIGKILL is replaced
 * by one that re-adopts the same pool (a GPU pool has no name a new kvpool could find it by).
 * What is held is let go of when the group has stopped.
 *
 * SIGTERM or SIGINT drains the group in the reverse order of its dependencies: the router first
 * (it stops admitting and lets running requests finish), then the scheduler, the workers, and
 * the kvpool last, whose memory must outlive everyone who maps it. Each is sent SIGTERM and
 * waited for up to --stop-timeout-ms, then killed. A second signal hurries the rest with
 * SIGKILL. The supervisor then removes DIR/ready and DIR/supervisor.pid and exits 0.
 *
 * Children run in their own session (UV_PROCESS_DETACHED), so a Ctrl-C at a terminal reaches
 * the supervisor only and the drain order holds. The price: a supervisor killed with SIGKILL
 * leaves its children running; they are ordinary processes that an operator stops by pid.
 *
 * Output: DIR/<name>.log (appended; kvpool, worker-I, scheduler, router) holds each program's
 * stdout and stderr, one header line per start. The supervisor logs to its own stderr.
 *
 * DIR is created with mode 0700 when it does not exist: anyone who can write to control.ipc can
 * have workers killed. Its absolute path is bounded so that every ipc:// address the group uses
 * in it fits a Unix socket path (SUP_MAX_RUN_DIR).
 *
 * DIR is the group's own: the supervisor refuses one that belongs to another user or that
 * others may write to, and one under a directory that another user owns or may rename entries
 * of (writable by others without the sticky bit), so that nobody else can prepare files or
 * symbolic links in it for a privileged group to write through. It also refuses a DIR where a
 * file it writes (the logs, ready, supervisor.pid, lock) is a symbolic link or not a regular
 * file, and opens every one of them with O_NOFOLLOW. DIR/lock is locked (flock) for the
 * supervisor's life: a second supervisor on DIR exits at once with SUP_EXIT_BUSY, saying
 * "already running (pid N)", and touches nothing of the first's.
 *
 * What is made before the loop starts (the run directory's checks, lock and files, the engines'
 * directories and addresses, each program's command line) is supervisor_setup.c; the state the
 * two files share is supervisor_impl.h. */
#include "common/error.h"
#include "common/exit_status.h"
#include "common/fd_pass.h"
#include "common/log.h"
#include "comm/comm_file.h"
#include "deploy/control.h"
#include "deploy/restart_policy.h"
#include "deploy/supervisor_impl.h"
#include "deploy/supervisor_opts.h"
#include "wire/wire.h"

#include <nng/nng.h>
#include <nng/protocol/pipeline0/pull.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

/* The stop order: the HTTP gateway (its clients' requests are cancelled), then the router drains,
 * the kvpool's memory outlives everyone mapping it. */
static const enum role stop_order[ROLE_COUNT] = {ROLE_GATEWAY, ROLE_ROUTER, ROLE_SCHEDULER,
                                                 ROLE_WORKER, ROLE_KVPOOL};

static void begin_stop(struct supervisor *sup, int exit_code);
static void on_child_closed(uv_handle_t *h);

/* ---- children ---------------------------------------------------------------------------- */

static void describe_exit(const struct child *c, char *buf, size_t len)
{
    if (c->spawn_error != 0)
        snprintf(buf, len, "could not be started: %s", uv_strerror(c->spawn_error));
    else if (c->term_signal != 0)
        snprintf(buf, len, "killed by signal %d (%s)", c->term_signal, strsignal(c->term_signal));
    else
        snprintf(buf, len, "exit status %lld", (long long)c->exit_status);
}

static void on_child_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct child *c = p->data;
    /* What it deposited is kept for the next one (deploy/keeper.h). */
    keeper_close_link(&c->keeper);
    c->exit_status = exit_status;
    c->term_signal = term_signal;
    c->state = CHILD_CLOSING;
    uv_close((uv_handle_t *)p, on_child_closed);
}

/* Opens DIR/<name>.log for appending and writes a header line for this start (what: "starting",
 * or "checking" for the router's check). Returns the descriptor or a PAGODA_E* code. */
static int child_open_log(struct supervisor *sup, struct child *c, const char *what)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/%s.log", sup->run_dir, c->name) >= (int)sizeof(path))
        return pagoda_error_set(PAGODA_ERANGE, "path too long: %s/%s.log", sup->run_dir, c->name);
    int fd = sup_open_run_file(path, O_CREAT | O_APPEND);
    if (fd < 0)
        return fd;
    char line[128], stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(line, sizeof(line), "---- %s pagoda-supervisor: %s %s (start %d)\n", stamp,
                     what, c->name, c->starts + 1);
    if (n > 0 && write(fd, line, (size_t)n) < 0)
        log_warn("cannot write to %s: %s", path, strerror(errno));
    return fd;
}

extern char **environ;

/* This process's environment with entry ("NAME=VALUE") in place of any NAME it has: a new array
 * of the same strings (free only the array), or NULL when out of memory. */
static char **env_with(const char *entry)
{
    size_t name_len = strcspn(entry, "=") + 1, n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = calloc(n + 2, sizeof(*env));
    if (env == NULL)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], entry, name_len) != 0)
            env[k++] = environ[i];
    env[k++] = (char *)entry;
    env[k] = NULL;
    return env;
}

/* Spawns argv (c's program, or its check) as proc with its output appended to c's log (a header
 * line saying what), stdin closed, extra_fd (>= 0) as its descriptor 3, and env (NULL: this
 * process's). Returns uv_spawn's code; the handle is initialized either way. */
static int spawn_logged(struct child *c, const char *what, char **argv, uv_process_t *proc,
                        uv_exit_cb exit_cb, unsigned int flags, int extra_fd, char **env)
{
    int fd = child_open_log(c->sup, c, what);
    if (fd < 0) {
        /* The program matters more than its log: let it write to the supervisor's stderr. */
        char msg[700];
        log_warn("%s: %s; its output goes to the supervisor's", c->name,
                 pagoda_error_message(fd, msg, sizeof(msg)));
    }
    int out_fd = fd >= 0 ? fd : STDERR_FILENO;
    uv_stdio_container_t stdio[4];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = stdio[2].flags = UV_INHERIT_FD;
    stdio[1].data.fd = stdio[2].data.fd = out_fd;
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = extra_fd;
    uv_process_options_t options;
    memset(&options, 0, sizeof(options));
    options.exit_cb = exit_cb;
    options.file = argv[0];
    options.args = argv;
    options.stdio_count = extra_fd >= 0 ? 4 : 3;
    options.stdio = stdio;
    options.flags = flags;
    options.env = env;
    int rv = uv_spawn(&c->sup->loop, proc, &options);
    if (fd >= 0)
        close(fd);
    return rv;
}

/* Starts c's program. Whatever happens, c leaves CHILD_IDLE: on success it is CHILD_RUNNING;
 * when uv_spawn fails its handle is closing and on_child_closed treats the failure like an
 * exit (a failed start of the group, or a fast exit counted towards giving up). */
static void child_spawn(struct child *c)
{
    struct supervisor *sup = c->sup;
    c->ready = 0;
    c->watched = 0;
    c->hung_killed = 0;
    c->spawn_error = 0;
    c->exit_status = 0;
    c->term_signal = 0;
    c->pid = 0;
    c->started_ms = uv_now(&sup->loop);

    /* A kvpool's keeper link (deploy/keeper.h) becomes its descriptor 3, named in its
     * environment; without one (out of descriptors) it starts as a kvpool started by hand. */
    int keeper_fd = -1;
    char **env = NULL;
    if (c->role == ROLE_KVPOOL) {
        char msg[700];
        int rc = keeper_open_link(&c->keeper, &keeper_fd);
        if (rc == 0 && (env = env_with(WIRE_KVPOOL_KEEPER_ENV "=3")) == NULL)
            rc = pagoda_error_set(PAGODA_ENOMEM, "the environment of %s", c->name);
        if (rc != 0) {
            log_warn("%s starts without a keeper link: %s", c->name,
                     pagoda_error_message(rc, msg, sizeof(msg)));
            if (keeper_fd >= 0)
                close(keeper_fd);
            keeper_fd = -1;
        }
    }
    int rv = spawn_logged(c, "starting", c->argv, &c->proc, on_child_exit, UV_PROCESS_DETACHED,
                          keeper_fd, env);
    if (keeper_fd >= 0)
        close(keeper_fd);
    free(env);
    c->proc.data = c;
    c->starts++;
    if (rv != 0) {
        /* uv_spawn initializes the handle before it fails, so it is closed like any other. */
        c->spawn_error = rv;
        c->state = CHILD_CLOSING;
        uv_close((uv_handle_t *)&c->proc, on_child_closed);
        return;
    }
    c->pid = c->proc.pid;
    c->state = CHILD_RUNNING;
    log_info("started %s (pid %d)", c->name, c->pid);
}

static void child_signal(struct child *c, int signum)
{
    if (c->state != CHILD_RUNNING)
        return;
    int rv = uv_process_kill(&c->proc, signum);
    if (rv != 0)
        log_warn("cannot send signal %d to %s (pid %d): %s", signum, c->name, c->pid,
                 uv_strerror(rv));
}

/* ---- tensor-parallel worker units --------------------------------------------------------- */

/* A worker rank of a tensor-parallel engine: its ranks are one unit. */
static int is_unit_rank(const struct child *c)
{
    return c->role == ROLE_WORKER && c->tp_rank >= 0;
}

static int same_unit(const struct child *a, const struct child *b)
{
    return is_unit_rank(a) && is_unit_rank(b) && a->engine == b->engine &&
           a->worker_id == b->worker_id;
}

/* The unit's rank 0 (the scheduler's worker; it holds the unit's restart state and timer). */
static struct child *unit_leader(struct supervisor *sup, struct child *c)
{
    for (int i = 0; i < sup->num_children; i++) {
        struct child *x = &sup->children[i];
        if (same_unit(x, c) && x->tp_rank == 0)
            return x;
    }
    return c;
}

/* Makes the unit's group file fresh (a stale one is never joined) and starts its ranks, rank 0
 * last. A file that cannot be made is logged; the ranks then fail to join and exit, which the
 * unit's restart (and its crash-loop limit) handles. */
static void unit_spawn(struct supervisor *sup, struct child *leader)
{
    int rc = comm_file_create(leader->tp_group, sup->opts.tensor_parallel);
    if (rc != 0) {
        char msg[700];
        log_error("%s", pagoda_error_message(rc, msg, sizeof(msg)));
    }
    for (int i = 0; i < sup->num_children; i++) {
        struct child *x = &sup->children[i];
        if (same_unit(x, leader) && x != leader && x->state == CHILD_IDLE)
            child_spawn(x);
    }
    if (leader->state == CHILD_IDLE)
        child_spawn(leader);
}

static void on_restart_timer(uv_timer_t *t);

/* A rank of a unit is gone (on_child_closed, outside a stop): the others are killed, and once
 * every rank is gone the unit restarts with rank 0's back-off. */
static void unit_exited(struct supervisor *sup, struct child *c, uint64_t uptime_ms,
                        const char *how)
{
    struct child *leader = unit_leader(sup, c);
    if (!leader->unit_down) {
        leader->unit_down = 1;
        leader->unit_uptime_ms = uptime_ms;
        snprintf(leader->unit_how, sizeof(leader->unit_how), "%s %s", c->name, how);
        log_warn("%s (pid %d) exited after %llu ms%s: %s; its tensor-parallel group goes down "
                 "with it",
                 c->name, c->pid, (unsigned long long)uptime_ms,
                 c->hung_killed ? " (killed as hung)" : "", how);
        for (int i = 0; i < sup->num_children; i++) {
            struct child *x = &sup->children[i];
            if (same_unit(x, c) && x->state == CHILD_RUNNING) {
                log_info("stopping %s (pid %d) with SIGKILL: its group lost a rank", x->name,
                         x->pid);
                child_signal(x, SIGKILL);
            }
        }
    } else {
        log_info("%s (pid %d) of the stopped group is gone: %s", c->name, c->pid, how);
    }
    for (int i = 0; i < sup->num_children; i++) {
        const struct child *x = &sup->children[i];
        if (same_unit(x, c) && (x->state == CHILD_RUNNING || x->state == CHILD_CLOSING))
            return; /* the last one's close goes on */
    }
    leader->unit_down = 0;
    uint64_t delay_ms = 0;
    if (restart_policy_exit(&sup->policy, &leader->restart, leader->unit_uptime_ms, &delay_ms) !=
        0) {
        log_error("the tensor-parallel group of %s went down %d times in a row, each within %llu "
                  "ms of its start; the last time: %s (see %s/%s*.log); stopping the group",
                  leader->name, sup->policy.max_fast_exits,
                  (unsigned long long)sup->policy.fast_exit_ms, leader->unit_how, sup->run_dir,
                  leader->name);
        begin_stop(sup, 1);
        return;
    }
    log_warn("restarting the tensor-parallel group of %s (%d ranks, a fresh group file) in %llu ms",
             leader->name, sup->opts.tensor_parallel, (unsigned long long)delay_ms);
    leader->state = CHILD_BACKOFF;
    uv_timer_start(&leader->restart_timer, on_restart_timer, delay_ms, 0);
}

static void on_restart_timer(uv_timer_t *t)
{
    struct child *c = t->data;
    if (c->state != CHILD_BACKOFF)
        return;
    c->state = CHILD_IDLE;
    log_info("restarting %s (start %d)", c->name, c->starts + 1);
    if (is_unit_rank(c))
        unit_spawn(c->sup, c); /* c is the unit's rank 0 */
    else
        child_spawn(c);
}

/* ---- starting the group ------------------------------------------------------------------ */

static void on_ready_timeout(uv_timer_t *t);

/* The program the start waits for: the one started last, or, once all are started, the first
 * that is not ready now (one that crashed during the start and is being restarted). NULL when
 * every program is ready. */
static struct child *start_waits_for(struct supervisor *sup)
{
    if (sup->awaiting < sup->num_children)
        return &sup->children[sup->awaiting];
    for (int i = 0; i < sup->num_children; i++) {
        struct child *c = &sup->children[i];
        if (c->state != CHILD_RUNNING || !c->ready)
            return c;
    }
    return NULL;
}

/* Once every program has been started: writes DIR/ready when all of them are ready now, or
 * waits (bounded by --ready-timeout-ms) for the one that is not. */
static void check_group_ready(struct supervisor *sup)
{
    struct child *c = start_waits_for(sup);
    if (c != NULL) {
        log_info("waiting for %s, restarted during the start, before the group is ready", c->name);
        if (!uv_is_active((uv_handle_t *)&sup->ready_timer))
            uv_timer_start(&sup->ready_timer, on_ready_timeout, sup->opts.ready_timeout_ms, 0);
        return;
    }
    uv_timer_stop(&sup->ready_timer);
    /* The address clients use; for engines alone, the ones a router is given. */
    char text[SUP_MAX_ENGINES * (SUP_MAX_URL_BYTES + 1) + 2];
    size_t len = 0;
    if (sup->opts.role == SUP_ROLE_ENGINE) {
        for (int e = 0; e < sup->opts.engines; e++)
            len += (size_t)snprintf(text + len, sizeof(text) - len, "%s\n",
                                    sup->listen_addr[e][LINK_SCHEDULER]);
    } else {
        snprintf(text, sizeof(text), "%s\n", sup->listen_dial);
    }
    int rc = sup_write_file_atomic(sup->ready_path, text);
    if (rc != 0) {
        char msg[700];
        log_error("%s; stopping the group", pagoda_error_message(rc, msg, sizeof(msg)));
        begin_stop(sup, 1);
        return;
    }
    sup->phase = PHASE_RUNNING;
    if (sup->opts.role == SUP_ROLE_ENGINE)
        log_info("the engine%s ready: routers connect to %s%s",
                 sup->opts.engines == 1 ? " is" : "s are", sup->listen_addr[0][LINK_SCHEDULER],
                 sup->opts.engines == 1 ? "" : " (and the next ports; see DIR/ready)");
    else
        log_info("the group is ready (%d engine%s, %d worker%s each): clients connect to %s",
                 sup->opts.engines, sup->opts.engines == 1 ? "" : "s", sup->opts.workers,
                 sup->opts.workers == 1 ? "" : "s", sup->listen_dial);
}

/* ---- the router's check before the start --------------------------------------------------- */

/* The router reads its tenants file and the model's tokenizer files at start, and one it cannot
 * take stops a starting group (PAGODA_EXIT_CANNOT_RUN). It starts last, after the engines have
 * loaded the weights (minutes for a large model on a GPU), so the group first runs the router's
 * own argv with --check, which reads them and exits: a broken file fails the start at once,
 * before anything else starts (the 43rd session's note). Its output goes to the router's log. */
static void start_next(struct supervisor *sup);

static struct child *router_child(struct supervisor *sup)
{
    for (int i = 0; i < sup->num_children; i++)
        if (sup->children[i].role == ROLE_ROUTER)
            return &sup->children[i];
    return NULL;
}

static void on_check_closed(uv_handle_t *h)
{
    (void)h;
}

static void on_check_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct supervisor *sup = p->data;
    sup->check_running = 0;
    uv_close((uv_handle_t *)p, on_check_closed);
    uv_timer_stop(&sup->ready_timer);
    if (sup->phase != PHASE_STARTING)
        return; /* stopped meanwhile: nothing was started */
    struct child *c = router_child(sup);
    if (term_signal == 0 && exit_status == 0) {
        start_next(sup);
        return;
    }
    if (term_signal != 0)
        log_error("the router's check (%s --check) was killed by signal %d (see %s/%s.log); "
                  "stopping the group",
                  c->argv[0], term_signal, sup->run_dir, c->name);
    else if (exit_status == PAGODA_EXIT_CANNOT_RUN)
        log_error("the router cannot run as configured (its check, %s --check, exit status %d, "
                  "see %s/%s.log); nothing was started: stopping the group",
                  c->argv[0], PAGODA_EXIT_CANNOT_RUN, sup->run_dir, c->name);
    else
        log_error("the router's check (%s --check) failed: exit status %lld (see %s/%s.log); "
                  "stopping the group",
                  c->argv[0], (long long)exit_status, sup->run_dir, c->name);
    begin_stop(sup, 1);
}

static void on_check_timeout(uv_timer_t *t)
{
    struct supervisor *sup = t->data;
    if (!sup->check_running)
        return;
    log_error("the router's check did not end within %llu ms: killing it",
              (unsigned long long)sup->opts.ready_timeout_ms);
    uv_process_kill(&sup->check_proc, SIGKILL); /* its exit stops the group */
}

/* Starts the group: the router's check first where there is a router, then the programs in
 * order (start_next). */
static void start_group(struct supervisor *sup)
{
    struct child *c = router_child(sup);
    if (c == NULL) {
        start_next(sup);
        return;
    }
    char *argv[SUP_MAX_ARGV + 1];
    int n = 0;
    while (c->argv[n] != NULL) {
        argv[n] = c->argv[n];
        n++;
    }
    argv[n++] = "--check";
    argv[n] = NULL;
    int rv = spawn_logged(c, "checking", argv, &sup->check_proc, on_check_exit, 0, -1, NULL);
    sup->check_proc.data = sup;
    if (rv != 0) {
        uv_close((uv_handle_t *)&sup->check_proc, on_check_closed);
        log_error("the router (%s) could not be started for its check: %s; stopping the group",
                  argv[0], uv_strerror(rv));
        begin_stop(sup, 1);
        return;
    }
    sup->check_running = 1;
    uv_timer_start(&sup->ready_timer, on_check_timeout, sup->opts.ready_timeout_ms, 0);
}

/* Starts the next program of the start order; after the last, checks the group. */
static void start_next(struct supervisor *sup)
{
    sup->awaiting++;
    if (sup->awaiting == sup->num_children) {
        check_group_ready(sup);
        return;
    }
    struct child *c = &sup->children[sup->awaiting];
    if (is_unit_rank(c)) {
        /* A tensor-parallel worker: every rank at once (they wait for each other), then the
         * start waits for rank 0, the unit's last child, ready once every rank has loaded. */
        c = unit_leader(sup, c);
        sup->awaiting = (int)(c - sup->children);
        unit_spawn(sup, c);
    } else {
        child_spawn(c);
    }
    if (c->state == CHILD_RUNNING)
        uv_timer_start(&sup->ready_timer, on_ready_timeout, sup->opts.ready_timeout_ms, 0);
}

static void on_ready_timeout(uv_timer_t *t)
{
    struct supervisor *sup = t->data;
    struct child *c = start_waits_for(sup);
    if (sup->phase != PHASE_STARTING || c == NULL)
        return;
    log_error("%s (pid %d) did not become ready within %llu ms (see %s/%s.log); stopping the "
              "group",
              c->name, c->pid, (unsigned long long)sup->opts.ready_timeout_ms, sup->run_dir,
              c->name);
    begin_stop(sup, 1);
}

/* ---- stopping the group ------------------------------------------------------------------ */

static void on_stop_timeout(uv_timer_t *t);

/* Children of the current stop stage whose process is still there. */
static int stage_alive(struct supervisor *sup)
{
    enum role role = stop_order[sup->stop_stage];
    int n = 0;
    for (int i = 0; i < sup->num_children; i++) {
        const struct child *c = &sup->children[i];
        if (c->role == role && (c->state == CHILD_RUNNING || c->state == CHILD_CLOSING))
            n++;
    }
    return n;
}

static void close_handle(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Closes every handle, so that the loop ends. Runs once everything has stopped, or when the
 * start-up fails before anything was spawned; every child is CHILD_IDLE then. */
static void finish(struct supervisor *sup)
{
    sup->phase = PHASE_DONE;
    /* Every kvpool has stopped: the pools kept for their restarts go. */
    for (int i = 0; i < sup->num_children; i++)
        keeper_release(&sup->children[i].keeper);
    if (sup->timers_init) {
        close_handle((uv_handle_t *)&sup->ready_timer);
        close_handle((uv_handle_t *)&sup->stop_timer);
        close_handle((uv_handle_t *)&sup->liveness_timer);
        for (int i = 0; i < sup->num_children; i++)
            close_handle((uv_handle_t *)&sup->children[i].restart_timer);
        sup->timers_init = 0;
    }
    if (sup->signals_init) {
        close_handle((uv_handle_t *)&sup->sigterm);
        close_handle((uv_handle_t *)&sup->sigint);
        sup->signals_init = 0;
    }
    /* The inbox before its socket (wire.h); closing the listener removes control.ipc. */
    wire_inbox_close(sup->inbox);
    sup->inbox = NULL;
    if (sup->control_open) {
        nng_close(sup->control);
        sup->control_open = 0;
    }
}

/* Moves to the next stop stage that has a process to stop and signals it; after the last
 * stage, finishes. */
static void advance_stage(struct supervisor *sup)
{
    for (sup->stop_stage++; sup->stop_stage < ROLE_COUNT; sup->stop_stage++) {
        enum role role = stop_order[sup->stop_stage];
        int signum = sup->hurry ? SIGKILL : SIGTERM;
        for (int i = 0; i < sup->num_children; i++) {
            struct child *c = &sup->children[i];
            if (c->role == role && c->state == CHILD_RUNNING) {
                log_info("stopping %s (pid %d) with %s", c->name, c->pid,
                         signum == SIGKILL ? "SIGKILL" : "SIGTERM");
                child_signal(c, signum);
            }
        }
        if (stage_alive(sup) > 0) {
            sup->stage_killed = sup->hurry;
            uv_timer_start(&sup->stop_timer, on_stop_timeout,
                           sup->hurry ? SUP_KILL_WAIT_MS : sup->opts.stop_timeout_ms, 0);
            return;
        }
    }
    log_info("every program has stopped");
    finish(sup);
}

static void on_stop_timeout(uv_timer_t *t)
{
    struct supervisor *sup = t->data;
    enum role role = stop_order[sup->stop_stage];
    for (int i = 0; i < sup->num_children; i++) {
        struct child *c = &sup->children[i];
        if (c->role != role || c->state != CHILD_RUNNING)
            continue;
        if (!sup->stage_killed) {
            log_warn("%s (pid %d) did not stop within %llu ms: SIGKILL", c->name, c->pid,
                     (unsigned long long)sup->opts.stop_timeout_ms);
            child_signal(c, SIGKILL);
        } else {
            /* Stuck in the kernel; waiting longer helps nobody. */
            log_error("%s (pid %d) survived SIGKILL for %d ms; leaving it", c->name, c->pid,
                      SUP_KILL_WAIT_MS);
            c->state = CHILD_CLOSING;
            uv_close((uv_handle_t *)&c->proc, on_child_closed);
        }
    }
    if (!sup->stage_killed) {
        sup->stage_killed = 1;
        uv_timer_start(&sup->stop_timer, on_stop_timeout, SUP_KILL_WAIT_MS, 0);
    }
}

/* Stops the group in stop_order; the process exits with exit_code when it is done (the first
 * non-zero code given wins). */
static void begin_stop(struct supervisor *sup, int exit_code)
{
    if (exit_code != 0 && sup->exit_code == 0)
        sup->exit_code = exit_code;
    if (sup->phase == PHASE_STOPPING || sup->phase == PHASE_DONE)
        return;
    sup->phase = PHASE_STOPPING;
    uv_timer_stop(&sup->ready_timer);
    if (sup->check_running)
        uv_process_kill(&sup->check_proc, SIGKILL); /* its exit, now, starts nothing */
    uv_timer_stop(&sup->liveness_timer);
    sup_remove_file(sup->ready_path);
    for (int i = 0; i < sup->num_children; i++) {
        struct child *c = &sup->children[i];
        if (c->state == CHILD_BACKOFF) {
            uv_timer_stop(&c->restart_timer);
            c->state = CHILD_IDLE;
        }
    }
    sup->stop_stage = -1;
    advance_stage(sup);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct supervisor *sup = h->data;
    const char *name = signum == SIGINT ? "SIGINT" : "SIGTERM";
    if (sup->phase == PHASE_STOPPING) {
        if (sup->hurry)
            return;
        log_warn("%s again: killing the rest of the group", name);
        sup->hurry = 1;
        sup->stage_killed = 1;
        enum role role = stop_order[sup->stop_stage];
        for (int i = 0; i < sup->num_children; i++)
            if (sup->children[i].role == role)
                child_signal(&sup->children[i], SIGKILL);
        uv_timer_start(&sup->stop_timer, on_stop_timeout, SUP_KILL_WAIT_MS, 0);
        return;
    }
    if (sup->phase == PHASE_DONE)
        return;
    log_info("%s: draining the group (router, scheduler, workers, kvpool)", name);
    begin_stop(sup, 0);
}

/* ---- what happens when a child's process is gone ------------------------------------------ */

static void on_child_closed(uv_handle_t *h)
{
    struct child *c = h->data;
    struct supervisor *sup = c->sup;
    c->state = CHILD_IDLE;
    uint64_t uptime_ms = c->spawn_error != 0 ? 0 : uv_now(&sup->loop) - c->started_ms;
    char how[128];
    describe_exit(c, how, sizeof(how));

    switch (sup->phase) {
    case PHASE_STOPPING:
        log_info("%s (pid %d) stopped: %s", c->name, c->pid, how);
        if (c->role == stop_order[sup->stop_stage] && stage_alive(sup) == 0) {
            uv_timer_stop(&sup->stop_timer);
            advance_stage(sup);
        }
        return;
    case PHASE_DONE:
        return;
    case PHASE_STARTING:
    case PHASE_RUNNING:
        /* "Cannot run as configured" stops a group that is starting; once it has served, the
         * same status can be passing or the operator's to fix (a restarted worker that found
         * the GPU memory of the one it replaces not yet released, a router whose tenants file
         * or model's tokenizer files were broken since): tried again with back-off, without end
         * (below). */
        if (sup->phase == PHASE_STARTING && c->spawn_error == 0 && c->term_signal == 0 &&
            c->exit_status == PAGODA_EXIT_CANNOT_RUN) {
            log_error("%s (pid %d) cannot run as configured (exit status %d, see %s/%s.log); not "
                      "restarting it: stopping the group",
                      c->name, c->pid, PAGODA_EXIT_CANNOT_RUN, sup->run_dir, c->name);
            begin_stop(sup, 1);
            return;
        }
        if (sup->phase == PHASE_RUNNING)
            break;
        /* The awaited program, or a rank of the awaited tensor-parallel worker. */
        struct child *awaited_as = is_unit_rank(c) ? unit_leader(sup, c) : c;
        if (sup->awaiting < sup->num_children && awaited_as == &sup->children[sup->awaiting] &&
            !c->ready) {
            if (c->spawn_error != 0)
                log_error("%s (%s) %s; stopping the group", c->name, c->argv[0], how);
            else
                log_error("%s (pid %d) exited before it was ready: %s (see %s/%s.log); "
                          "stopping the group",
                          c->name, c->pid, how, sup->run_dir, c->name);
            begin_stop(sup, 1);
            return;
        }
        break;
    }

    /* "Cannot run as configured" once the group has served: the operator can fix it while the
     * rest goes on (the router's tenants file or tokenizer files; a worker's GPU memory still
     * held by the one it replaces), so it is tried again without end, with the back-off, never
     * counted as a crash
     * loop that would stop the group and lose the engines' requests. A tensor-parallel unit's
     * count is its rank 0's: a rank's such exit clears it the same way. */
    const int cannot_run =
        c->spawn_error == 0 && c->term_signal == 0 && c->exit_status == PAGODA_EXIT_CANNOT_RUN;
    /* Killed by this supervisor as stuck in its start (on_liveness_timer): not a crash of its
     * own, however short --ready-timeout-ms is (below fast_exit_ms it would count as one, and
     * five would stop the group). */
    const int stuck_killed = c->hung_killed && !c->ready;
    if (is_unit_rank(c)) {
        if (cannot_run || stuck_killed)
            unit_leader(sup, c)->restart.fast_exits = 0;
        unit_exited(sup, c, uptime_ms, how);
        return;
    }
    uint64_t delay_ms = 0;
    if (cannot_run || stuck_killed)
        c->restart.fast_exits = 0;
    if (restart_policy_exit(&sup->policy, &c->restart, uptime_ms, &delay_ms) != 0) {
        log_error("%s exited %d times in a row, each within %llu ms of its start; the last "
                  "time: %s (see %s/%s.log); stopping the group",
                  c->name, sup->policy.max_fast_exits, (unsigned long long)sup->policy.fast_exit_ms,
                  how, sup->run_dir, c->name);
        begin_stop(sup, 1);
        return;
    }
    if (cannot_run)
        log_error("%s (pid %d) cannot run as configured (see %s/%s.log); the group goes on "
                  "without it: trying again in %llu ms",
                  c->name, c->pid, sup->run_dir, c->name, (unsigned long long)delay_ms);
    else if (c->spawn_error != 0)
        log_warn("%s (%s) %s; trying again in %llu ms", c->name, c->argv[0], how,
                 (unsigned long long)delay_ms);
    else
        log_warn("%s (pid %d) exited after %llu ms%s: %s; restarting it in %llu ms", c->name,
                 c->pid, (unsigned long long)uptime_ms, c->hung_killed ? " (killed as hung)" : "",
                 how, (unsigned long long)delay_ms);
    c->state = CHILD_BACKOFF;
    uv_timer_start(&c->restart_timer, on_restart_timer, delay_ms, 0);
}

/* ---- control messages -------------------------------------------------------------------- */

/* NNG thread: remembers the pid of the process at the other end of a new control pipe, so
 * that a Control{ready} or heartbeat is credited to the exact process that sent it (two workers
 * both say "worker"; a restarted one may be ready while the next one is awaited). A closed
 * pipe's pid is kept until its slot is needed (its last messages may still be in the inbox);
 * closed slots are reused in turn before any connected one. */
static void on_pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct supervisor *sup = arg;
    uint32_t id = (uint32_t)nng_pipe_id(p);
    pthread_mutex_lock(&sup->pipe_lock);
    if (ev == NNG_PIPE_EV_REM_POST) {
        for (int i = 0; i < SUP_PIPE_SLOTS; i++)
            if (sup->pipes[i].pipe_id == id)
                sup->pipes[i].live = 0;
        pthread_mutex_unlock(&sup->pipe_lock);
        return;
    }
    pthread_mutex_unlock(&sup->pipe_lock);
    uint64_t peer = 0; /* NNG_OPT_IPC_PEER_PID is a uint64 option */
    int pid =
        nng_pipe_get_uint64(p, NNG_OPT_IPC_PEER_PID, &peer) == 0 && peer > 0 && peer <= INT32_MAX
            ? (int)peer
            : -1;
    pthread_mutex_lock(&sup->pipe_lock);
    struct pipe_pid *slot = NULL;
    for (int k = 0; k < SUP_PIPE_SLOTS && slot == NULL; k++) {
        struct pipe_pid *s = &sup->pipes[(sup->pipe_next + (unsigned)k) % SUP_PIPE_SLOTS];
        if (!s->live)
            slot = s;
    }
    if (slot == NULL) /* every slot connected: the oldest position goes */
        slot = &sup->pipes[sup->pipe_next % SUP_PIPE_SLOTS];
    sup->pipe_next = (unsigned)(slot - sup->pipes) + 1;
    slot->pipe_id = id;
    slot->pid = pid;
    slot->live = 1;
    pthread_mutex_unlock(&sup->pipe_lock);
}

static int pipe_peer_pid(struct supervisor *sup, nng_pipe p)
{
    uint32_t id = (uint32_t)nng_pipe_id(p);
    int pid = -1;
    pthread_mutex_lock(&sup->pipe_lock);
    for (int i = 0; i < SUP_PIPE_SLOTS; i++)
        if (sup->pipes[i].pipe_id == id && id != 0)
            pid = sup->pipes[i].pid;
    pthread_mutex_unlock(&sup->pipe_lock);
    return pid;
}

/* Maps a sender ("kvpool", "worker", "worker-3", ...) to a role and, for "worker-I", an id. */
static int parse_sender(const char *sender, enum role *role, int *worker_id)
{
    return control_parse_sender(sender, SUP_MAX_WORKERS, role, worker_id);
}

/* The parent of pid, from /proc (Linux); -1 when it cannot be read (the process is gone). */
static int parent_pid(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* "pid (comm) state ppid ...": comm may hold anything, so parse after its last ')'. */
    const char *p = strrchr(buf, ')');
    char state;
    int ppid;
    if (p == NULL || sscanf(p + 1, " %c %d", &state, &ppid) != 2)
        return -1;
    return ppid;
}

/* The running child whose process is pid or an ancestor of pid (a program started through a
 * wrapper that did not exec), or NULL. */
static struct child *child_of_pid(struct supervisor *sup, int pid)
{
    for (int depth = 0; depth < 8 && pid > 1; depth++) {
        for (int i = 0; i < sup->num_children; i++) {
            struct child *c = &sup->children[i];
            if (c->state == CHILD_RUNNING && c->pid == pid)
                return c;
        }
        pid = parent_pid(pid);
    }
    return NULL;
}

static void on_ready(struct supervisor *sup, const char *sender, int pid)
{
    enum role role;
    int worker_id;
    if (parse_sender(sender, &role, &worker_id) != 0) {
        log_warn("Control{ready} from an unknown sender '%s' (pid %d) ignored",
                 sender ? sender : "", pid);
        return;
    }
    struct child *c = NULL;
    if (pid > 0) {
        c = child_of_pid(sup, pid);
    } else {
        /* No peer pid (not an ipc:// pipe): only an unambiguous sender can be credited. */
        int candidates = 0;
        for (int i = 0; i < sup->num_children; i++) {
            struct child *x = &sup->children[i];
            if (x->state == CHILD_RUNNING && x->role == role && !x->ready &&
                (worker_id < 0 || x->worker_id == worker_id)) {
                c = x;
                candidates++;
            }
        }
        if (candidates > 1)
            c = NULL;
    }
    if (c == NULL || c->role != role || (worker_id >= 0 && c->worker_id != worker_id)) {
        /* A process that has exited since, or one this supervisor did not start. */
        log_warn("Control{ready} from %s (pid %d) matches no running process of this group; "
                 "ignored",
                 sender, pid);
        return;
    }
    if (c->ready)
        return;
    c->ready = 1;
    c->watched = 1;
    c->alive_ms = uv_now(&sup->loop);
    log_info("%s (pid %d) is ready%s", c->name, c->pid, c->starts > 1 ? " again" : "");
    keeper_collect(&c->keeper); /* a GPU kvpool deposits its pool before it is ready */
    if (sup->phase != PHASE_STARTING)
        return;
    if (sup->awaiting < sup->num_children && c == &sup->children[sup->awaiting]) {
        uv_timer_stop(&sup->ready_timer);
        start_next(sup);
    } else if (sup->awaiting == sup->num_children) {
        check_group_ready(sup);
    }
}

/* A heartbeat from pid: its loop runs. Only a process of this group counts (by its pid; a
 * heartbeat carries no proof of anything else), and a stray one is dropped without a word, as
 * one arrives every --heartbeat-ms. */
static void on_heartbeat(struct supervisor *sup, const char *sender, int pid)
{
    enum role role;
    int worker_id;
    if (pid <= 0 || parse_sender(sender, &role, &worker_id) != 0)
        return;
    struct child *c = child_of_pid(sup, pid);
    if (c == NULL || c->role != role || (worker_id >= 0 && c->worker_id != worker_id))
        return;
    c->watched = 1;
    c->alive_ms = uv_now(&sup->loop);
}

/* How often, at the least, the liveness check runs: starts that outlast --ready-timeout-ms are
 * checked whether or not heartbeats are watched, and soon after that limit whatever
 * --heartbeat-ms is (up to an hour: the check ran every --heartbeat-ms before, and a stuck start
 * waited that long). */
#define SUP_START_CHECK_MS 500u

static uint64_t liveness_period_ms(const struct supervisor *sup)
{
    return sup->opts.heartbeat_ms > 0 && sup->opts.heartbeat_ms < SUP_START_CHECK_MS
               ? sup->opts.heartbeat_ms
               : SUP_START_CHECK_MS;
}

/* Every --heartbeat-ms, or SUP_START_CHECK_MS where that is shorter: a program that has shown signs
 * of life (a ready or a heartbeat: before them it may be loading, which the ready timeout bounds)
 * and then stays silent for
 * --heartbeat-ms x --heartbeat-misses has a loop that no longer runs; SIGKILL it (SIGTERM would
 * need that loop), and its exit restarts it with the usual back-off. With --heartbeat-ms 0 no
 * silence is watched, and the check runs for stuck starts alone (before the forty-eighth session
 * it did not run at all, and a restart stuck in its start stayed so).
 *
 * Workers are left to the scheduler's step watchdog (on_hung): a worker runs each step on its
 * loop, and a long step (a long prefill on the CPU backend, a sanitizer build) may outlast any
 * fixed heartbeat limit while it is making progress; the scheduler knows when a step is due and
 * lengthens its wait for slow steps, so it tells a hung worker from a slow one.
 *
 * When this check itself runs late (the supervisor's loop was stopped: SIGSTOP, a frozen cgroup,
 * swapping), libuv runs timers before reading the heartbeats that queued meanwhile: every child
 * would look silent. Such a late tick only restarts the count. */
static void on_liveness_timer(uv_timer_t *t)
{
    struct supervisor *sup = t->data;
    if (sup->phase != PHASE_STARTING && sup->phase != PHASE_RUNNING)
        return;
    uint64_t now = uv_now(&sup->loop);
    uint64_t last = sup->liveness_tick_ms;
    sup->liveness_tick_ms = now;
    /* A tick late by more than a period: the time this supervisor did not run is nobody's
     * silence, so every count moves on by it, and this tick decides nothing (stuck starts
     * included): the messages that queued meanwhile (heartbeats, readies) are read before the
     * next. Counts are not
     * restarted: hiccups of a second under load, each one late, then never let a hung program
     * reach its limit (a review's repro); nor is a tick late only past two heartbeat periods,
     * which killed healthy programs after a shorter stop where --heartbeat-misses is 1 or 2. */
    const uint64_t check = liveness_period_ms(sup);
    if (now - last > 2 * check) {
        const uint64_t lost = now - last - check;
        log_warn("the liveness check ran %llu ms late (this supervisor was stopped?): that time "
                 "is not counted as any program's silence",
                 (unsigned long long)lost);
        for (int i = 0; i < sup->num_children; i++) {
            struct child *c = &sup->children[i];
            c->alive_ms = c->alive_ms + lost < now ? c->alive_ms + lost : now;
        }
        return;
    }
    uint64_t limit_ms = sup->opts.heartbeat_ms * (uint64_t)sup->opts.heartbeat_misses;
    for (int i = 0; i < sup->num_children; i++) {
        struct child *c = &sup->children[i];
        /* A program restarted while the group runs that is not ready within the start's limit
         * (--ready-timeout-ms) is stuck in its start (a file that blocks, a peer that never
         * answers): killed, so that it is started again, where nothing replaced it (a worker's
         * loop sends no heartbeat before it is ready, and the scheduler's reports of it are
         * ignored until then). */
        if (sup->phase == PHASE_RUNNING && c->state == CHILD_RUNNING && !c->ready &&
            !c->hung_killed && now - c->started_ms > sup->opts.ready_timeout_ms) {
            log_warn("%s (pid %d) is not ready %llu ms after its restart (--ready-timeout-ms "
                     "%llu): stuck in its start; killing it with SIGKILL",
                     c->name, c->pid, (unsigned long long)(now - c->started_ms),
                     (unsigned long long)sup->opts.ready_timeout_ms);
            c->hung_killed = 1;
            child_signal(c, SIGKILL);
            continue;
        }
        if (sup->opts.heartbeat_ms == 0 || c->state != CHILD_RUNNING || !c->watched ||
            c->hung_killed || c->role == ROLE_WORKER || now - c->alive_ms <= limit_ms)
            continue;
        log_warn("%s (pid %d) sent no heartbeat for %llu ms (--heartbeat-ms %llu x "
                 "--heartbeat-misses %d): its event loop has stopped; killing it with SIGKILL",
                 c->name, c->pid, (unsigned long long)(now - c->alive_ms),
                 (unsigned long long)sup->opts.heartbeat_ms, sup->opts.heartbeat_misses);
        c->hung_killed = 1;
        child_signal(c, SIGKILL);
    }
}

/* The engine whose scheduler sent a report from pid: its process (or a descendant's) when the
 * pid is known, the only engine otherwise; -1 when it cannot be told. */
static int engine_of_sender(struct supervisor *sup, int pid)
{
    struct child *c = pid > 0 ? child_of_pid(sup, pid) : NULL;
    if (c != NULL)
        return c->engine;
    return sup->opts.engines == 1 && sup->opts.role != SUP_ROLE_ROUTER ? 0 : -1;
}

static void on_hung(struct supervisor *sup, const Pagoda__Internal__Control *ctl, int pid)
{
    if (!ctl->has_hung_worker_id || !ctl->has_hung_worker_pid) {
        log_warn("a hung-worker report without both id and pid ignored");
        return;
    }
    if (ctl->hung_worker_id >= (uint32_t)sup->opts.workers) {
        log_warn("a hung-worker report names worker %u, which does not exist; ignored",
                 ctl->hung_worker_id);
        return;
    }
    /* Worker I of the engine whose scheduler reports it (each engine numbers its own). */
    int engine = engine_of_sender(sup, pid);
    struct child *c = NULL;
    for (int i = 0; i < sup->num_children && engine >= 0; i++)
        if (sup->children[i].role == ROLE_WORKER && sup->children[i].engine == engine &&
            sup->children[i].worker_id == (int)ctl->hung_worker_id)
            c = &sup->children[i];
    if (c == NULL) {
        log_warn("a hung-worker report from pid %d, which is no engine's program; ignored", pid);
        return;
    }
    if (ctl->hung_worker_pid == 0) {
        /* No Hello to a scheduler (one started while the worker hung knows no pid): killed only
         * where it is ready (not loading) and its loop has sent no heartbeat for two intervals
         * (with heartbeats off, on the scheduler's word). */
        uint64_t now = uv_now(&sup->loop), hb = sup->opts.heartbeat_ms;
        if (c->state != CHILD_RUNNING || !c->ready || c->hung_killed ||
            (hb > 0 && now - c->alive_ms < 2 * hb)) {
            log_info("%s says %s sent it no Hello; %s (pid %d) is %s: not killed",
                     ctl->sender ? ctl->sender : "a peer", c->name, c->name, c->pid,
                     c->state != CHILD_RUNNING ? "not running"
                     : !c->ready               ? "not ready yet"
                     : c->hung_killed          ? "being killed"
                                               : "alive (heartbeats)");
            return;
        }
        log_warn("%s says %s sent it no Hello, and %s (pid %d) sent no heartbeat for %llu ms: "
                 "hung; killing it with SIGKILL",
                 ctl->sender ? ctl->sender : "a peer", c->name, c->name, c->pid,
                 (unsigned long long)(now - c->alive_ms));
        c->hung_killed = 1;
        child_signal(c, SIGKILL);
        return;
    }
    if (c->state != CHILD_RUNNING || c->pid != ctl->hung_worker_pid) {
        log_warn("%s reports %s hung as pid %d, which is not its current process (pid %d, "
                 "%s); ignored",
                 ctl->sender ? ctl->sender : "a peer", c->name, ctl->hung_worker_pid, c->pid,
                 c->state == CHILD_RUNNING ? "running" : "not running");
        return;
    }
    log_warn("%s reports %s (pid %d) hung: killing it with SIGKILL",
             ctl->sender ? ctl->sender : "a peer", c->name, c->pid);
    c->hung_killed = 1;
    child_signal(c, SIGKILL);
}

static void on_control(void *ctx, nng_msg *m)
{
    struct supervisor *sup = ctx;
    int pid = pipe_peer_pid(sup, nng_msg_get_pipe(m));
    Pagoda__Internal__Control *ctl =
        (Pagoda__Internal__Control *)wire_unpack(&pagoda__internal__control__descriptor, m);
    nng_msg_free(m);
    if (ctl == NULL) {
        sup->malformed++;
        log_warn("malformed control message from pid %d ignored (%llu so far)", pid,
                 (unsigned long long)sup->malformed);
        return;
    }
    if (sup->phase != PHASE_DONE) {
        if (ctl->has_hung_worker_id || ctl->has_hung_worker_pid)
            on_hung(sup, ctl, pid);
        if (ctl->has_ready && ctl->ready)
            on_ready(sup, ctl->sender, pid);
        if (ctl->has_heartbeat && ctl->heartbeat)
            on_heartbeat(sup, ctl->sender, pid);
    }
    protobuf_c_message_free_unpacked(&ctl->base, NULL);
}

/* Creates the loop's handles and the control socket, and writes the pid file. On failure
 * whatever was created is closed by finish(). */
static int open_loop(struct supervisor *sup)
{
    uv_timer_init(&sup->loop, &sup->ready_timer);
    uv_timer_init(&sup->loop, &sup->stop_timer);
    uv_timer_init(&sup->loop, &sup->liveness_timer);
    sup->ready_timer.data = sup;
    sup->stop_timer.data = sup;
    sup->liveness_timer.data = sup;
    for (int i = 0; i < sup->num_children; i++) {
        uv_timer_init(&sup->loop, &sup->children[i].restart_timer);
        sup->children[i].restart_timer.data = &sup->children[i];
    }
    sup->timers_init = 1;

    int rv = uv_signal_init(&sup->loop, &sup->sigterm);
    if (rv == 0) {
        rv = uv_signal_init(&sup->loop, &sup->sigint);
        if (rv != 0)
            uv_close((uv_handle_t *)&sup->sigterm, NULL);
    }
    if (rv != 0)
        return pagoda_error_set(PAGODA_EIO, "uv_signal_init: %s", uv_strerror(rv));
    sup->signals_init = 1;
    sup->sigterm.data = sup;
    sup->sigint.data = sup;
    if ((rv = uv_signal_start(&sup->sigterm, on_signal, SIGTERM)) != 0 ||
        (rv = uv_signal_start(&sup->sigint, on_signal, SIGINT)) != 0)
        return pagoda_error_set(PAGODA_EIO, "uv_signal_start: %s", uv_strerror(rv));

    char url[PATH_MAX + 16];
    int rc = wire_ipc_url(url, sizeof(url), sup->run_dir, "control.ipc");
    if (rc != 0)
        return rc;
    if ((rv = nng_pull0_open(&sup->control)) != 0)
        return wire_error(rv, "nng_pull0_open");
    sup->control_open = 1;
    if ((rv = nng_socket_set_size(sup->control, NNG_OPT_RECVMAXSZ, SUP_MAX_CONTROL_BYTES)) != 0)
        return wire_error(rv, "NNG_OPT_RECVMAXSZ");
    if ((rv = nng_pipe_notify(sup->control, NNG_PIPE_EV_ADD_PRE, on_pipe_event, sup)) != 0 ||
        (rv = nng_pipe_notify(sup->control, NNG_PIPE_EV_REM_POST, on_pipe_event, sup)) != 0)
        return wire_error(rv, "nng_pipe_notify");
    /* DIR's, and each engine's own when there are several (their programs push to the
     * control socket of their run directory, wire.h): one socket, one listener each. */
    int engine_dirs =
        sup->opts.role != SUP_ROLE_ROUTER && sup->opts.engines > 1 ? sup->opts.engines : 0;
    for (int e = -1; e < engine_dirs; e++) {
        if (e >= 0 && (rc = wire_ipc_url(url, sizeof(url), sup->engine_dir[e], "control.ipc")) != 0)
            return rc;
        if ((rv = nng_listen(sup->control, url, NULL, 0)) != 0) {
            if (rv == NNG_EADDRINUSE)
                return pagoda_error_set(PAGODA_EBUSY, "%s is in use: another supervisor runs in %s",
                                        url, sup->run_dir);
            return wire_error(rv, url);
        }
    }
    if ((rc = wire_inbox_open(&sup->loop, sup->control, on_control, sup, &sup->inbox)) != 0)
        return rc;

    /* A ready file left by an earlier group must not announce this one, and its router's runtime
     * pins (router/router_pins_file.c: they live as long as the group) are not this one's. */
    sup_remove_file(sup->ready_path);
    char pins_path[PATH_MAX];
    if (snprintf(pins_path, sizeof(pins_path), "%s/router-pins.json", sup->run_dir) <
        (int)sizeof(pins_path))
        sup_remove_file(pins_path);
    char text[32];
    snprintf(text, sizeof(text), "%d\n", (int)getpid());
    if ((rc = sup_write_file_atomic(sup->pid_path, text)) != 0)
        return rc;
    sup->liveness_tick_ms = uv_now(&sup->loop);
    uv_timer_start(&sup->liveness_timer, on_liveness_timer, liveness_period_ms(sup),
                   liveness_period_ms(sup));
    return 0;
}

int main(int argc, char **argv)
{
    log_set_name("supervisor");
    static struct supervisor sup_storage; /* large (the children's paths): not on the stack */
    struct supervisor *sup = &sup_storage;
    char msg[700];

    int rc = sup_parse_opts(argc, argv, &sup->opts);
    if (rc == 1) {
        sup_usage(stdout);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "pagoda-supervisor: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
        sup_usage(stderr);
        return 2;
    }
    if (sup->opts.check_args)
        return 0;
    enum log_level level = LOG_INFO;
    log_level_parse(sup->opts.log_level, &level);
    log_set_level(level);
    sup->policy = restart_policy_default();
    sup->awaiting = -1;
    sup->phase = PHASE_STARTING;
    sup->lock_fd = -1;

    if ((rc = sup_prepare(sup)) != 0) {
        log_error("%s", pagoda_error_message(rc, msg, sizeof(msg)));
        return rc == PAGODA_EBUSY ? SUP_EXIT_BUSY : 1;
    }
    /* A keeper link is given to each kvpool by its own environment (child_spawn); one in this
     * process's would name a descriptor nobody gave. */
    unsetenv(WIRE_KVPOOL_KEEPER_ENV);
    /* The keepers hold a descriptor per chunk of every GPU pool (2 GiB each): take all the
     * descriptors the system allows. */
    fd_limit_raise();
    /* The programs learn the heartbeat interval from their environment (wire.h), so that none
     * of them needs a flag for it. */
    if (sup->opts.heartbeat_ms > 0) {
        char text[24];
        snprintf(text, sizeof(text), "%llu", (unsigned long long)sup->opts.heartbeat_ms);
        setenv(WIRE_HEARTBEAT_ENV, text, 1);
    } else {
        unsetenv(WIRE_HEARTBEAT_ENV);
    }
    /* A child that closes its end of a pipe must not kill the supervisor. */
    signal(SIGPIPE, SIG_IGN);
    int rv = uv_loop_init(&sup->loop);
    if (rv != 0) {
        log_error("uv_loop_init: %s", uv_strerror(rv));
        return 1;
    }
    pthread_mutex_init(&sup->pipe_lock, NULL);
    int pid_written = 0;
    if ((rc = open_loop(sup)) != 0) {
        log_error("%s", pagoda_error_message(rc, msg, sizeof(msg)));
        sup->exit_code = rc == PAGODA_EBUSY ? SUP_EXIT_BUSY : 1;
        finish(sup);
    } else {
        pid_written = 1;
        log_info("supervising %d worker%s in %s (programs from %s)", sup->opts.workers,
                 sup->opts.workers == 1 ? "" : "s", sup->run_dir, sup->opts.bin_dir);
        start_group(sup);
    }
    uv_run(&sup->loop, UV_RUN_DEFAULT);

    if (pid_written) {
        sup_remove_file(sup->ready_path);
        sup_remove_file(sup->pid_path);
    }
    /* The lock goes last, once nothing of this group is left in DIR; its file stays (removing
     * it could let two later supervisors lock two different files). */
    if (sup->lock_fd >= 0)
        close(sup->lock_fd);
    if ((rv = uv_loop_close(&sup->loop)) != 0)
        log_error("uv_loop_close: %s (a handle was left open)", uv_strerror(rv));
    pthread_mutex_destroy(&sup->pipe_lock);
    nng_fini();
    if (sup->exit_code != 0)
        log_error("exiting with status %d", sup->exit_code);
    else
        log_info("stopped");
    return sup->exit_code;
}
