/* pagoda-supervisor's command line: its usage, the parser and the checks of the flags together
 * (supervisor_opts.h). */
#include "deploy/supervisor_opts.h"

#include "common/error.h"
#include "common/log.h"
#include "common/parse.h"
#include "wire/address.h"
#include "wire/wire.h"

#include <getopt.h>
#include <stdlib.h>
#include <string.h>

const char *const sup_link_flags[LINK_COUNT] = {"--kvpool-listen", "--worker-listen",
                                                "--scheduler-listen"};

void sup_usage(FILE *f)
{
    fprintf(
        f,
        "usage: pagoda-supervisor --run-dir DIR --bin-dir BINDIR --model MODEL\n"
        "         [--workers N (%d for now, the default)] [--listen URL (tcp://127.0.0.1:7450)]\n"
        "         [--block-size B] [--kv-blocks N | --kv-bytes B]\n"
        "         [--backend cpu|cuda|null (the workers'; cuda puts the pool on the GPU)]\n"
        "         [--log-level debug|info|warn|error] [--ready-timeout-ms 60000]\n"
        "         [--stop-timeout-ms 30000] [--heartbeat-ms %d (0: off)]\n"
        "         [--heartbeat-misses %d] [--kvpool-arg A]... [--worker-arg A]...\n"
        "         [--scheduler-arg A]... [--router-arg A]... [--http-listen HOST:PORT]\n"
        "         [--gateway-arg A]...\n"
        "Starts BINDIR/pagoda-kvpool, -worker (x N), -scheduler and -router with run\n"
        "directory DIR (and -gateway, the OpenAI-compatible HTTP front, with --http-listen),\n"
        "restarts any that exits, and drains them on SIGTERM or SIGINT.\n"
        "Writes DIR/ready (the client URL) once every program is ready. Each --X-arg adds\n"
        "one argument (at most %d) to program X's command line. A ready program that sends\n"
        "no heartbeat for --heartbeat-ms x --heartbeat-misses is killed and restarted.\n"
        "DIR must be the caller's and writable by nobody else; one supervisor at a time\n"
        "runs in it (exit status %d when another already does).\n"
        "--allow-multi-worker lets --workers go up to %d (for tests of the supervisor\n"
        "with stand-in programs: pagoda's scheduler drives one worker).\n"
        "Engines and roles:\n"
        "  [--engines N (1..%d; each a kvpool, worker and scheduler in DIR/engine-I when N > 1,\n"
        "   --kv-blocks/--kv-bytes per engine)] [--role all|engine|router]\n"
        "  [--scheduler-listen URL] [--worker-listen URL] [--kvpool-listen URL] (ipc:// or\n"
        "   tcp://HOST:PORT; engine I of N listens on PORT+I; default: ipc:// paths in DIR)\n"
        "  [--scheduler URL]... (--role router: one per engine, in order)\n"
        "  [--routing cache-aware|round-robin] (passed to the router)\n"
        "--role engine starts the engines only (DIR/ready lists their --scheduler-listen);\n"
        "--role router starts the router (and gateway) only. The supervisor's control socket\n"
        "is always ipc://DIR/control.ipc (it credits messages by the sender's pid).\n"
        "Tensor parallelism: [--tensor-parallel N (1..%d ranks per engine: a kvpool and a\n"
        "   worker each, one unit)] [--devices D0,D1,... (--backend cuda: rank R's GPU)]\n"
        "--check-args checks the command line (addresses included) and exits: 0, or 2\n"
        "with the reason; nothing is created or started (deploy/pagoda-up uses it).\n",
        SUP_SUPPORTED_WORKERS, SUP_DEFAULT_HEARTBEAT_MS, SUP_DEFAULT_HEARTBEAT_MISSES,
        SUP_MAX_EXTRA_ARGS, SUP_EXIT_BUSY, SUP_MAX_WORKERS, SUP_MAX_ENGINES, SUP_MAX_TP);
}

enum {
    OPT_RUN_DIR = 256,
    OPT_BIN_DIR,
    OPT_MODEL,
    OPT_WORKERS,
    OPT_LISTEN,
    OPT_BLOCK_SIZE,
    OPT_KV_BLOCKS,
    OPT_KV_BYTES,
    OPT_BACKEND,
    OPT_LOG_LEVEL,
    OPT_READY_TIMEOUT,
    OPT_STOP_TIMEOUT,
    OPT_HEARTBEAT_MS,
    OPT_HEARTBEAT_MISSES,
    OPT_KVPOOL_ARG,
    OPT_WORKER_ARG,
    OPT_SCHEDULER_ARG,
    OPT_ROUTER_ARG,
    OPT_GATEWAY_ARG,
    OPT_HTTP_LISTEN,
    OPT_ENGINES,
    OPT_ROLE,
    OPT_ROUTING,
    OPT_SCHEDULER_LISTEN,
    OPT_WORKER_LISTEN,
    OPT_KVPOOL_LISTEN,
    OPT_SCHEDULER,
    OPT_TENSOR_PARALLEL,
    OPT_DEVICES,
    OPT_HELP,
    OPT_ALLOW_MULTI_WORKER, /* after OPT_HELP: takes no value */
    OPT_CHECK_ARGS,
};

static int check_len(const char *flag, const char *text, size_t min, size_t max)
{
    size_t n = strlen(text);
    if (n < min || n >= max)
        return pagoda_error_set(PAGODA_ERANGE, "--%s: the value must have %zu to %zu bytes", flag,
                                min, max - 1);
    return 0;
}

/* The tcp ports one group listens on: each engine link's PORT..PORT+N-1 (N engines), --listen's
 * and --http-listen's (those of the router, unless --role engine). Two that overlap would
 * cross-wire links (one engine's worker on another's router link) or fail to bind, so they are
 * refused, whatever their hosts (one machine; 127.0.0.1 and 0.0.0.0 collide). */
static int check_port_overlap(const struct sup_opts *o)
{
    struct {
        const char *flag, *address;
        int first, last;
    } r[LINK_COUNT + 2];
    int n = 0;
    if (o->role != SUP_ROLE_ROUTER)
        for (int l = 0; l < LINK_COUNT; l++) {
            int port = wire_address_port(o->link_listen[l]);
            if (port > 0) {
                r[n].flag = sup_link_flags[l];
                r[n].address = o->link_listen[l];
                r[n].first = port;
                r[n++].last = port + o->engines - 1;
            }
        }
    if (o->role != SUP_ROLE_ENGINE) {
        int port = wire_address_port(o->listen);
        if (port > 0) {
            r[n].flag = "--listen";
            r[n].address = o->listen;
            r[n].first = r[n].last = port;
            n++;
        }
        /* HOST:PORT: the digits after the last ':' (the gateway checks the rest). */
        const char *colon = o->http_listen ? strrchr(o->http_listen, ':') : NULL;
        int64_t v;
        if (colon != NULL && parse_i64("--http-listen", colon + 1, 1, 65535, &v) == 0) {
            r[n].flag = "--http-listen";
            r[n].address = o->http_listen;
            r[n].first = r[n].last = (int)v;
            n++;
        }
        pagoda_error_clear();
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (r[i].first <= r[j].last && r[j].first <= r[i].last)
                return pagoda_error_set(
                    PAGODA_EINVAL,
                    "%s %s and %s %s use the same port%s (%d..%d and %d..%d%s): every link "
                    "needs its own ports",
                    r[i].flag, r[i].address, r[j].flag, r[j].address, o->engines > 1 ? "s" : "",
                    r[i].first, r[i].last, r[j].first, r[j].last,
                    o->engines > 1 ? "; engine I of --engines N listens on PORT+I" : "");
    return 0;
}

/* PAGODA_TP_SHARED_DEVICES=1 (for tests on a one-GPU machine, tests/gpu/run): --devices may name
 * a device twice; the ranks sharing it then do their collectives through the cpu group (NCCL
 * refuses two ranks on one device). A trial of the plumbing, never a way to serve faster. */
#define SUP_SHARED_DEVICES_ENV "PAGODA_TP_SHARED_DEVICES"

/* --devices D0,D1,...: device numbers, each at most 4 digits, none twice (unless
 * SUP_SHARED_DEVICES_ENV is 1). */
static int parse_devices(const char *text, struct sup_opts *o)
{
    const char *shared = getenv(SUP_SHARED_DEVICES_ENV);
    const int allow_twice = shared != NULL && strcmp(shared, "1") == 0;
    o->num_devices = 0;
    const char *p = text;
    for (;;) {
        size_t n = strcspn(p, ",");
        if (n == 0 || n > 4 || strspn(p, "0123456789") != n)
            return pagoda_error_set(
                PAGODA_EINVAL, "--devices %s: device numbers separated by commas (e.g. 0,1)", text);
        if (o->num_devices == SUP_MAX_TP)
            return pagoda_error_set(PAGODA_ERANGE, "--devices %s: more than %d devices", text,
                                    SUP_MAX_TP);
        snprintf(o->devices[o->num_devices], SUP_MAX_DEVICE_TEXT, "%.*s", (int)n, p);
        for (int i = 0; i < o->num_devices && !allow_twice; i++)
            if (atoi(o->devices[i]) == atoi(o->devices[o->num_devices]))
                return pagoda_error_set(PAGODA_EINVAL, "--devices %s names a device twice", text);
        o->num_devices++;
        if (p[n] == '\0')
            return 0;
        p += n + 1;
    }
}

/* Checks what --tensor-parallel and --devices ask for with the backend and the pool's size. */
static int check_tensor_parallel(const struct sup_opts *o)
{
    int cuda = strcmp(o->backend, "cuda") == 0;
    if (o->num_devices > 0 && !cuda)
        return pagoda_error_set(PAGODA_EINVAL, "--devices needs --backend cuda");
    if (o->num_devices > 0 && o->num_devices != o->tensor_parallel)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--devices names %d device(s), --tensor-parallel is %d",
                                o->num_devices, o->tensor_parallel);
    /* Only ranks get a device from --devices: a lone kvpool would be started without it and
     * take GPU 0, whatever --devices said (pagoda-up turns --devices D into --kvpool-arg). */
    if (o->num_devices > 0 && o->tensor_parallel == 1)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--devices %s with --tensor-parallel 1: give one GPU with "
                                "--kvpool-arg --device --kvpool-arg %s",
                                o->devices[0], o->devices[0]);
    if (o->tensor_parallel == 1)
        return 0;
    if (strcmp(o->backend, "null") == 0)
        return pagoda_error_set(PAGODA_EINVAL, "--tensor-parallel %d needs --backend cpu or cuda",
                                o->tensor_parallel);
    if (o->workers != 1)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--tensor-parallel %d with --workers %d: a tensor-parallel engine "
                                "runs one worker of N ranks",
                                o->tensor_parallel, o->workers);
    if (cuda && o->num_devices == 0)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--tensor-parallel %d --backend cuda needs --devices (one GPU a "
                                "rank)",
                                o->tensor_parallel);
    if (cuda && o->kv_blocks == NULL && o->kv_bytes == NULL)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--tensor-parallel %d --backend cuda: give every rank's pool the "
                                "same size with --kv-blocks N or --kv-bytes B (each GPU's free "
                                "memory would size its pool differently, and the ranks share one "
                                "block table)",
                                o->tensor_parallel);
    return 0;
}

/* Checks what the engine and role flags ask for together. */
static int check_engines(const struct sup_opts *o)
{
    int tp = o->tensor_parallel;
    if (o->engines * (tp * (o->workers + 1) + 1) + 2 > SUP_MAX_CHILDREN)
        return pagoda_error_set(PAGODA_ERANGE,
                                "--engines %d x --workers %d x --tensor-parallel %d: more than %d "
                                "programs",
                                o->engines, o->workers, tp, SUP_MAX_CHILDREN);
    int rc = check_tensor_parallel(o);
    if (rc != 0)
        return rc;
    if (o->role == SUP_ROLE_ROUTER) {
        if (o->num_schedulers == 0)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "--role router needs its engines: --scheduler URL, once per "
                                    "engine (the addresses their --scheduler-listen gave)");
        if (o->engines != 1)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "--engines with --role router: the router's engines are its "
                                    "--scheduler addresses");
        for (int l = 0; l < LINK_COUNT; l++)
            if (o->link_listen[l] != NULL)
                return pagoda_error_set(PAGODA_EINVAL,
                                        "%s with --role router: that is an engine's address",
                                        sup_link_flags[l]);
        /* An engine's settings would be taken and go nowhere: the engines are started elsewhere,
         * with their own (pagoda-up turns --kv-cache-dtype, --device, --cuda-* and the like
         * into these). */
        for (int r = ROLE_SCHEDULER; r >= ROLE_KVPOOL; r--) /* --max-seqs: the scheduler's */
            if (o->num_extra[r] > 0)
                return pagoda_error_set(PAGODA_EINVAL,
                                        "--%s-arg %s with --role router: an engine's setting "
                                        "(this group starts no %s; give it to --role engine)",
                                        role_names[r], o->extra[r][0], role_names[r]);
        const char *engine_flag = o->tensor_parallel != 1          ? "--tensor-parallel"
                                  : o->kv_blocks != NULL           ? "--kv-blocks"
                                  : o->kv_bytes != NULL            ? "--kv-bytes"
                                  : o->block_size != NULL          ? "--block-size"
                                  : strcmp(o->backend, "cpu") != 0 ? "--backend"
                                                                   : NULL;
        if (engine_flag != NULL)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "%s with --role router: an engine's setting (give it to "
                                    "--role engine)",
                                    engine_flag);
        return check_port_overlap(o);
    }
    if (o->num_schedulers > 0)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--scheduler is for --role router (with --role %s the router's "
                                "engines are the ones started here)",
                                o->role == SUP_ROLE_ENGINE ? "engine" : "all");
    if (o->role == SUP_ROLE_ENGINE && o->http_listen != NULL)
        return pagoda_error_set(PAGODA_EINVAL, "--http-listen with --role engine: the gateway "
                                               "runs beside the router (--role router)");
    for (int l = 0; l < LINK_COUNT; l++) {
        const char *a = o->link_listen[l];
        if (a == NULL || o->engines == 1)
            continue;
        int port = wire_address_port(a);
        if (port < 0)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "%s %s with --engines %d: several engines need a "
                                    "tcp://HOST:PORT (engine I listens on PORT+I)",
                                    sup_link_flags[l], a, o->engines);
        if (port + o->engines - 1 > 65535)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "%s %s with --engines %d: ports up to %d do not exist",
                                    sup_link_flags[l], a, o->engines, port + o->engines - 1);
    }
    rc = check_port_overlap(o);
    if (rc != 0)
        return rc;
    if (o->role == SUP_ROLE_ENGINE && wire_address_port(o->link_listen[LINK_SCHEDULER]) < 0)
        return pagoda_error_set(
            PAGODA_EINVAL,
            "--role engine%s%s: a router on another host cannot reach an ipc:// scheduler link; "
            "give --scheduler-listen tcp://0.0.0.0:PORT (or --role all for one host)",
            o->link_listen[LINK_SCHEDULER] ? " --scheduler-listen " : "",
            o->link_listen[LINK_SCHEDULER] ? o->link_listen[LINK_SCHEDULER] : "");
    /* Every kvpool would size itself from the same free GPU memory. */
    if (o->engines > 1 && strcmp(o->backend, "cuda") == 0 && o->kv_blocks == NULL &&
        o->kv_bytes == NULL)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--engines %d --backend cuda: give each engine its share of the "
                                "GPU with --kv-bytes B or --kv-blocks N (per engine)",
                                o->engines);
    return 0;
}

int sup_parse_opts(int argc, char **argv, struct sup_opts *o)
{
    static const struct option longopts[] = {
        {"run-dir", required_argument, NULL, OPT_RUN_DIR},
        {"bin-dir", required_argument, NULL, OPT_BIN_DIR},
        {"model", required_argument, NULL, OPT_MODEL},
        {"workers", required_argument, NULL, OPT_WORKERS},
        {"listen", required_argument, NULL, OPT_LISTEN},
        {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
        {"kv-blocks", required_argument, NULL, OPT_KV_BLOCKS},
        {"kv-bytes", required_argument, NULL, OPT_KV_BYTES},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"ready-timeout-ms", required_argument, NULL, OPT_READY_TIMEOUT},
        {"stop-timeout-ms", required_argument, NULL, OPT_STOP_TIMEOUT},
        {"heartbeat-ms", required_argument, NULL, OPT_HEARTBEAT_MS},
        {"heartbeat-misses", required_argument, NULL, OPT_HEARTBEAT_MISSES},
        {"allow-multi-worker", no_argument, NULL, OPT_ALLOW_MULTI_WORKER},
        {"check-args", no_argument, NULL, OPT_CHECK_ARGS},
        {"kvpool-arg", required_argument, NULL, OPT_KVPOOL_ARG},
        {"worker-arg", required_argument, NULL, OPT_WORKER_ARG},
        {"scheduler-arg", required_argument, NULL, OPT_SCHEDULER_ARG},
        {"router-arg", required_argument, NULL, OPT_ROUTER_ARG},
        {"gateway-arg", required_argument, NULL, OPT_GATEWAY_ARG},
        {"http-listen", required_argument, NULL, OPT_HTTP_LISTEN},
        {"engines", required_argument, NULL, OPT_ENGINES},
        {"role", required_argument, NULL, OPT_ROLE},
        {"routing", required_argument, NULL, OPT_ROUTING},
        {"scheduler-listen", required_argument, NULL, OPT_SCHEDULER_LISTEN},
        {"worker-listen", required_argument, NULL, OPT_WORKER_LISTEN},
        {"kvpool-listen", required_argument, NULL, OPT_KVPOOL_LISTEN},
        {"scheduler", required_argument, NULL, OPT_SCHEDULER},
        {"tensor-parallel", required_argument, NULL, OPT_TENSOR_PARALLEL},
        {"devices", required_argument, NULL, OPT_DEVICES},
        {"help", no_argument, NULL, OPT_HELP},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof(*o));
    o->listen = "tcp://127.0.0.1:7450";
    o->backend = "cpu";
    o->log_level = "info";
    o->workers = 1;
    o->engines = 1;
    o->tensor_parallel = 1;
    o->role = SUP_ROLE_ALL;
    o->ready_timeout_ms = 60000;
    o->stop_timeout_ms = 30000;
    o->heartbeat_ms = SUP_DEFAULT_HEARTBEAT_MS;
    o->heartbeat_misses = SUP_DEFAULT_HEARTBEAT_MISSES;

    int opt, rc;
    int64_t v;
    opterr = 0;
    int li = -1;
    while ((opt = getopt_long(argc, argv, "", longopts, &li)) != -1) {
        const char *flag = optind > 0 && optind <= argc ? argv[optind - 1] : "?";
        /* Every value is bounded; only the pass-through arguments may be empty. */
        if (opt >= OPT_RUN_DIR && opt < OPT_HELP && li >= 0 &&
            (rc = check_len(longopts[li].name, optarg, opt >= OPT_KVPOOL_ARG ? 0 : 1,
                            opt == OPT_LISTEN ? SUP_MAX_URL_BYTES : SUP_MAX_ARG_BYTES)) != 0)
            return rc;
        li = -1;
        switch (opt) {
        case OPT_RUN_DIR:
            o->run_dir = optarg;
            break;
        case OPT_BIN_DIR:
            o->bin_dir = optarg;
            break;
        case OPT_MODEL:
            o->model = optarg;
            break;
        case OPT_WORKERS:
            if ((rc = parse_i64("--workers", optarg, 1, SUP_MAX_WORKERS, &v)) != 0)
                return rc;
            o->workers = (int)v;
            break;
        case OPT_LISTEN:
            if ((rc = wire_address_check("--listen", optarg, WIRE_ADDRESS_ANY)) != 0)
                return rc;
            o->listen = optarg;
            break;
        case OPT_ENGINES:
            if ((rc = parse_i64("--engines", optarg, 1, SUP_MAX_ENGINES, &v)) != 0)
                return rc;
            o->engines = (int)v;
            break;
        case OPT_ROLE:
            if (strcmp(optarg, "all") == 0)
                o->role = SUP_ROLE_ALL;
            else if (strcmp(optarg, "engine") == 0)
                o->role = SUP_ROLE_ENGINE;
            else if (strcmp(optarg, "router") == 0)
                o->role = SUP_ROLE_ROUTER;
            else
                return pagoda_error_set(PAGODA_EINVAL, "--role %s: expected all, engine or router",
                                        optarg);
            break;
        case OPT_ROUTING:
            if (strcmp(optarg, "cache-aware") != 0 && strcmp(optarg, "round-robin") != 0)
                return pagoda_error_set(
                    PAGODA_EINVAL, "--routing %s: expected cache-aware or round-robin", optarg);
            o->routing = optarg;
            break;
        case OPT_SCHEDULER_LISTEN:
        case OPT_WORKER_LISTEN:
        case OPT_KVPOOL_LISTEN: {
            enum link l = opt == OPT_SCHEDULER_LISTEN ? LINK_SCHEDULER
                          : opt == OPT_WORKER_LISTEN  ? LINK_WORKER
                                                      : LINK_KVPOOL;
            if ((rc = wire_address_check(sup_link_flags[l], optarg, WIRE_ADDRESS_ANY)) != 0)
                return rc;
            o->link_listen[l] = optarg;
            break;
        }
        case OPT_SCHEDULER:
            if ((rc = wire_address_check("--scheduler", optarg, WIRE_ADDRESS_DIAL)) != 0)
                return rc;
            if (o->num_schedulers == SUP_MAX_ENGINES)
                return pagoda_error_set(PAGODA_ERANGE, "more than %d --scheduler addresses",
                                        SUP_MAX_ENGINES);
            o->schedulers[o->num_schedulers++] = optarg;
            break;
        case OPT_HTTP_LISTEN:
            if ((rc = check_len("--http-listen", optarg, 3, SUP_MAX_URL_BYTES)) != 0)
                return rc;
            o->http_listen = optarg;
            break;
        case OPT_BLOCK_SIZE:
            if ((rc = parse_i64("--block-size", optarg, 1, 1024, &v)) != 0)
                return rc;
            o->block_size = optarg;
            break;
        case OPT_KV_BLOCKS:
            if ((rc = parse_i64("--kv-blocks", optarg, 1, INT32_MAX, &v)) != 0)
                return rc;
            o->kv_blocks = optarg;
            break;
        case OPT_KV_BYTES:
            if ((rc = parse_i64("--kv-bytes", optarg, 1, INT64_MAX, &v)) != 0)
                return rc;
            o->kv_bytes = optarg;
            break;
        case OPT_BACKEND:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0 &&
                strcmp(optarg, "null") != 0)
                return pagoda_error_set(PAGODA_EINVAL, "--backend %s: expected cpu, cuda or null",
                                        optarg);
            o->backend = optarg;
            break;
        case OPT_LOG_LEVEL: {
            enum log_level level;
            if ((rc = log_level_parse(optarg, &level)) != 0)
                return rc;
            o->log_level = optarg;
            break;
        }
        case OPT_READY_TIMEOUT:
            if ((rc = parse_i64("--ready-timeout-ms", optarg, 1, SUP_MAX_TIMEOUT_MS, &v)) != 0)
                return rc;
            o->ready_timeout_ms = (uint64_t)v;
            break;
        case OPT_STOP_TIMEOUT:
            if ((rc = parse_i64("--stop-timeout-ms", optarg, 1, SUP_MAX_TIMEOUT_MS, &v)) != 0)
                return rc;
            o->stop_timeout_ms = (uint64_t)v;
            break;
        case OPT_HEARTBEAT_MS:
            if ((rc = parse_i64("--heartbeat-ms", optarg, 0, WIRE_MAX_HEARTBEAT_MS, &v)) != 0)
                return rc;
            o->heartbeat_ms = (uint64_t)v;
            break;
        case OPT_HEARTBEAT_MISSES:
            if ((rc = parse_i64("--heartbeat-misses", optarg, 1, SUP_MAX_HEARTBEAT_MISSES, &v)) !=
                0)
                return rc;
            o->heartbeat_misses = (int)v;
            break;
        case OPT_TENSOR_PARALLEL:
            if ((rc = parse_i64("--tensor-parallel", optarg, 1, SUP_MAX_TP, &v)) != 0)
                return rc;
            o->tensor_parallel = (int)v;
            break;
        case OPT_DEVICES:
            if ((rc = parse_devices(optarg, o)) != 0)
                return rc;
            break;
        case OPT_ALLOW_MULTI_WORKER:
            o->allow_multi_worker = 1;
            break;
        case OPT_CHECK_ARGS:
            o->check_args = 1;
            break;
        case OPT_KVPOOL_ARG:
        case OPT_WORKER_ARG:
        case OPT_SCHEDULER_ARG:
        case OPT_ROUTER_ARG:
        case OPT_GATEWAY_ARG: {
            int role = opt - OPT_KVPOOL_ARG;
            if (o->num_extra[role] == SUP_MAX_EXTRA_ARGS)
                return pagoda_error_set(PAGODA_ERANGE, "more than %d --%s-arg values",
                                        SUP_MAX_EXTRA_ARGS, role_names[role]);
            o->extra[role][o->num_extra[role]++] = optarg;
            break;
        }
        case OPT_HELP:
            return 1;
        default:
            return pagoda_error_set(PAGODA_EINVAL, "unknown flag or missing value: %s", flag);
        }
    }
    if (optind < argc)
        return pagoda_error_set(PAGODA_EINVAL, "unexpected argument '%s'", argv[optind]);
    if (o->run_dir == NULL || o->bin_dir == NULL || o->model == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "--run-dir, --bin-dir and --model are required");
    if (o->kv_blocks != NULL && o->kv_bytes != NULL)
        return pagoda_error_set(PAGODA_EINVAL, "--kv-blocks and --kv-bytes exclude each other");
    if (o->workers > SUP_SUPPORTED_WORKERS && !o->allow_multi_worker)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "--workers %d: a group runs %d worker for now (the scheduler "
                                "drives a single worker); nothing was started. To serve with "
                                "more, run several engines: --engines N",
                                o->workers, SUP_SUPPORTED_WORKERS);
    return check_engines(o);
}
