/* pagoda-worker's command line (worker_args.h). */
#include "worker/worker_args.h"
#include "comm/comm.h"
#include "common/error.h"
#include "common/log.h"
#include "common/parse.h"
#include "wire/address.h"
#include "worker/backend.h"
#include "worker/step_loop.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

_Static_assert(WORKER_MAX_DELAY_MS == STEP_LOOP_MAX_DELAY_MS,
               "--step-delay-ms is bounded as the step loop bounds a step's delay");

/* The backends of this build, as --help names them (deploy/pagoda-up looks for "cpu|cuda"). */
#ifdef PAGODA_HAVE_CUDA
#define WORKER_BACKENDS "cpu|cuda|null"
#else
#define WORKER_BACKENDS "cpu|null"
#endif

static void usage(FILE *f)
{
    fprintf(f, "usage: pagoda-worker --run-dir DIR --model MODEL_DIR --worker-id I\n"
               "                     [--backend " WORKER_BACKENDS "] [--step-delay-ms X]\n"
               "                     [--load-format safetensors|random] [--seed N]\n"
               "                     [--fault drop-step=N|drop-result=N|lose-device=PATH]\n"
               "                     [--max-batched-tokens 2048] [--max-seqs 256]\n"
               "                     [--log-level debug|info|warn|error]\n"
               "                     [--kvpool URL] [--scheduler URL] [--tensor-parallel N]\n"
               "                     [--tp-rank R --tp-size N --tp-group PATH]\n"
               "                     [--tp-timeout-ms 30000]\n"
               "                     [--cuda-graphs on|off] [--cuda-pdl on|off]\n"
               "                     [--cuda-residual-gemm on|off] [--cuda-tma on|off|stream-k]\n"
               "Maps the kv pool that pagoda-kvpool serves in DIR (asked at --kvpool, default\n"
               "ipc://DIR/kvpool.ipc), loads the model and runs the steps the scheduler sends\n"
               "on --scheduler (default ipc://DIR/worker-I.ipc; tcp://HOST:PORT too).\n");
}

enum {
    OPT_RUN_DIR = 256,
    OPT_MODEL,
    OPT_WORKER_ID,
    OPT_BACKEND,
    OPT_STEP_DELAY,
    OPT_FAULT,
    OPT_MAX_BATCHED,
    OPT_MAX_SEQS,
    OPT_LOG_LEVEL,
    OPT_LOAD_FORMAT,
    OPT_SEED,
    OPT_KVPOOL,
    OPT_SCHEDULER,
    OPT_TENSOR_PARALLEL,
    OPT_CUDA_GRAPHS,
    OPT_CUDA_PDL,
    OPT_CUDA_RESIDUAL_GEMM,
    OPT_CUDA_TMA,
    OPT_TP_RANK,
    OPT_TP_SIZE,
    OPT_TP_GROUP,
    OPT_TP_TIMEOUT,
};

#define FAULTS "drop-step=N, drop-result=N or lose-device=PATH"

static int parse_fault(const char *arg, struct worker_opts *o)
{
    const char *eq = strchr(arg, '=');
    int64_t n;
    if (eq == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "--fault %s: expected " FAULTS, arg);
    if ((size_t)(eq - arg) == 11 && strncmp(arg, "lose-device", 11) == 0) {
        if (eq[1] == '\0' || strlen(eq + 1) >= WORKER_MAX_PATH)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "--fault lose-device: a path of 1 .. %d bytes expected",
                                    WORKER_MAX_PATH - 1);
        o->lose_device = eq + 1;
        return 0;
    }
    int rc = parse_i64("--fault", eq + 1, 1, INT64_MAX, &n);
    if (rc != 0)
        return rc;
    size_t klen = (size_t)(eq - arg);
    if (klen == 9 && strncmp(arg, "drop-step", klen) == 0)
        o->drop_step = (uint64_t)n;
    else if (klen == 11 && strncmp(arg, "drop-result", klen) == 0)
        o->drop_result = (uint64_t)n;
    else
        return pagoda_error_set(PAGODA_EINVAL, "--fault %s: expected " FAULTS, arg);
    return 0;
}

int worker_parse_cuda_tma(const char *flag, const char *text, int *out)
{
    static const char *const names[] = {"off", "on", "stream-k"};
    _Static_assert(BACKEND_CUDA_TMA_OFF == 0 && BACKEND_CUDA_TMA_ON == 1 &&
                       BACKEND_CUDA_TMA_STREAM_K == 2,
                   "names[] in the order of the values");
    for (int i = 0; i < 3; i++)
        if (strcmp(text, names[i]) == 0) {
            *out = i;
            return 0;
        }
    return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' is not on, off or stream-k", flag, text);
}

int worker_args_parse(int argc, char **argv, struct worker_opts *o)
{
    *o = (struct worker_opts){
        .backend = "cpu",
        .load_format = "safetensors",
        .log_level = "info",
        .max_batched_tokens = 2048,
        .max_seqs = 256,
        .tensor_parallel = 1,
        .cuda_graphs = 1,
        .cuda_pdl = 1,
        .cuda_residual_gemm = 1,
        .cuda_tma = 1,
        .tp_timeout_ms = COMM_DEFAULT_TIMEOUT_MS,
    };
    optind = 0; /* glibc: a full re-initialisation, so that a second parse starts afresh */
    static const struct option longopts[] = {
        {"run-dir", required_argument, NULL, OPT_RUN_DIR},
        {"model", required_argument, NULL, OPT_MODEL},
        {"worker-id", required_argument, NULL, OPT_WORKER_ID},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"step-delay-ms", required_argument, NULL, OPT_STEP_DELAY},
        {"fault", required_argument, NULL, OPT_FAULT},
        {"max-batched-tokens", required_argument, NULL, OPT_MAX_BATCHED},
        {"max-seqs", required_argument, NULL, OPT_MAX_SEQS},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"load-format", required_argument, NULL, OPT_LOAD_FORMAT},
        {"seed", required_argument, NULL, OPT_SEED},
        {"kvpool", required_argument, NULL, OPT_KVPOOL},
        {"scheduler", required_argument, NULL, OPT_SCHEDULER},
        {"tensor-parallel", required_argument, NULL, OPT_TENSOR_PARALLEL},
        {"cuda-graphs", required_argument, NULL, OPT_CUDA_GRAPHS},
        {"cuda-pdl", required_argument, NULL, OPT_CUDA_PDL},
        {"cuda-residual-gemm", required_argument, NULL, OPT_CUDA_RESIDUAL_GEMM},
        {"cuda-tma", required_argument, NULL, OPT_CUDA_TMA},
        {"tp-rank", required_argument, NULL, OPT_TP_RANK},
        {"tp-size", required_argument, NULL, OPT_TP_SIZE},
        {"tp-group", required_argument, NULL, OPT_TP_GROUP},
        {"tp-timeout-ms", required_argument, NULL, OPT_TP_TIMEOUT},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    int opt, rc = 0;
    int64_t v;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case OPT_RUN_DIR:
            o->run_dir = optarg;
            break;
        case OPT_MODEL:
            o->model = optarg;
            break;
        case OPT_WORKER_ID:
            if ((rc = parse_i64("--worker-id", optarg, 0, WORKER_MAX_ID, &v)) == 0) {
                o->worker_id = (uint32_t)v;
                o->worker_id_set = 1;
            }
            break;
        case OPT_BACKEND:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0 &&
                strcmp(optarg, "null") != 0)
                rc = pagoda_error_set(PAGODA_EINVAL, "--backend %s: expected cpu, cuda or null",
                                      optarg);
#ifndef PAGODA_HAVE_CUDA
            else if (strcmp(optarg, "cuda") == 0)
                rc = pagoda_error_set(PAGODA_EUNSUPPORTED,
                                      "--backend cuda: this build has no CUDA backend (configure "
                                      "with -DPAGODA_CUDA=ON)");
#endif
            o->backend = optarg;
            break;
        case OPT_LOAD_FORMAT:
            if (strcmp(optarg, "safetensors") != 0 && strcmp(optarg, "random") != 0)
                rc = pagoda_error_set(PAGODA_EINVAL,
                                      "--load-format %s: expected safetensors or random", optarg);
            o->load_format = optarg;
            break;
        case OPT_SEED:
            if ((rc = parse_i64("--seed", optarg, 0, INT64_MAX, &v)) == 0)
                o->seed = (uint64_t)v;
            break;
        case OPT_KVPOOL:
            if ((rc = wire_address_check("--kvpool", optarg, WIRE_ADDRESS_DIAL)) == 0)
                o->kvpool = optarg;
            break;
        case OPT_SCHEDULER:
            if ((rc = wire_address_check("--scheduler", optarg, WIRE_ADDRESS_DIAL)) == 0)
                o->scheduler = optarg;
            break;
        case OPT_TENSOR_PARALLEL:
            if ((rc = parse_i64("--tensor-parallel", optarg, 1, COMM_MAX_RANKS, &v)) == 0)
                o->tensor_parallel = (int)v;
            break;
        case OPT_CUDA_GRAPHS:
            rc = parse_on_off("--cuda-graphs", optarg, &o->cuda_graphs);
            break;
        case OPT_CUDA_PDL:
            rc = parse_on_off("--cuda-pdl", optarg, &o->cuda_pdl);
            break;
        case OPT_CUDA_RESIDUAL_GEMM:
            rc = parse_on_off("--cuda-residual-gemm", optarg, &o->cuda_residual_gemm);
            break;
        case OPT_CUDA_TMA:
            rc = worker_parse_cuda_tma("--cuda-tma", optarg, &o->cuda_tma);
            break;
        case OPT_TP_RANK:
            if ((rc = parse_i64("--tp-rank", optarg, 0, COMM_MAX_RANKS - 1, &v)) == 0)
                o->tp_rank = (int)v;
            o->tp_rank_set = 1;
            break;
        case OPT_TP_SIZE:
            if ((rc = parse_i64("--tp-size", optarg, 1, COMM_MAX_RANKS, &v)) == 0)
                o->tp_size = (int)v;
            break;
        case OPT_TP_GROUP:
            if (optarg[0] == '\0' || strlen(optarg) >= WORKER_MAX_PATH)
                rc = pagoda_error_set(PAGODA_EINVAL, "--tp-group: a path of 1 to %d bytes",
                                      WORKER_MAX_PATH - 1);
            o->tp_group = optarg;
            break;
        case OPT_TP_TIMEOUT:
            if ((rc = parse_i64("--tp-timeout-ms", optarg, WORKER_MIN_TP_TIMEOUT_MS,
                                WORKER_MAX_TP_TIMEOUT_MS, &v)) == 0)
                o->tp_timeout_ms = (int)v;
            o->tp_timeout_set = 1;
            break;
        case OPT_STEP_DELAY:
            if ((rc = parse_i64("--step-delay-ms", optarg, 0, WORKER_MAX_DELAY_MS, &v)) == 0)
                o->step_delay_ms = (uint32_t)v;
            break;
        case OPT_FAULT:
            rc = parse_fault(optarg, o);
            break;
        case OPT_MAX_BATCHED:
            if ((rc = parse_i64("--max-batched-tokens", optarg, 1, WORKER_MAX_BATCHED_TOKENS,
                                &v)) == 0)
                o->max_batched_tokens = (int32_t)v;
            break;
        case OPT_MAX_SEQS:
            if ((rc = parse_i64("--max-seqs", optarg, 1, WORKER_MAX_SEQS, &v)) == 0)
                o->max_seqs = (int32_t)v;
            break;
        case OPT_LOG_LEVEL:
            o->log_level = optarg;
            break;
        case 'h':
            usage(stdout);
            return WORKER_ARGS_HELP;
        default:
            usage(stderr);
            return WORKER_ARGS_USAGE;
        }
        if (rc != 0) {
            char msg[700];
            fprintf(stderr, "pagoda-worker: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
            return WORKER_ARGS_USAGE;
        }
    }
    if (optind != argc || o->run_dir == NULL || o->model == NULL || !o->worker_id_set) {
        usage(stderr);
        return WORKER_ARGS_USAGE;
    }
    if (strcmp(o->load_format, "random") == 0 && strcmp(o->backend, "cpu") == 0) {
        fprintf(stderr, "pagoda-worker: --load-format random needs --backend cuda (the CPU "
                        "backend runs on checkpoints: make one with pagoda-mkmodel)\n");
        return WORKER_ARGS_USAGE;
    }
    if ((o->tp_size != 0 || o->tp_group != NULL || o->tp_rank_set) &&
        (o->tp_size == 0 || o->tp_group == NULL || !o->tp_rank_set)) {
        fprintf(stderr, "pagoda-worker: --tp-rank, --tp-size and --tp-group go together (a rank "
                        "of a group of worker processes)\n");
        return WORKER_ARGS_USAGE;
    }
    if (o->tp_size != 0 && o->tp_rank >= o->tp_size) {
        fprintf(stderr, "pagoda-worker: --tp-rank %d: the ranks of --tp-size %d are 0 to %d\n",
                o->tp_rank, o->tp_size, o->tp_size - 1);
        return WORKER_ARGS_USAGE;
    }
    if (o->tp_size != 0 && o->tensor_parallel > 1) {
        fprintf(stderr, "pagoda-worker: --tensor-parallel (ranks that are threads of this "
                        "worker) and --tp-size (ranks that are worker processes) exclude each "
                        "other\n");
        return WORKER_ARGS_USAGE;
    }
    if (o->tp_timeout_set && o->tp_size == 0 && o->tensor_parallel == 1) {
        fprintf(stderr, "pagoda-worker: --tp-timeout-ms bounds a tensor-parallel group's "
                        "collectives: it needs --tp-size or --tensor-parallel\n");
        return WORKER_ARGS_USAGE;
    }
    if (o->tp_size != 0 && strcmp(o->backend, "null") == 0) {
        fprintf(stderr, "pagoda-worker: --tp-size needs --backend cpu or cuda\n");
        return WORKER_ARGS_USAGE;
    }
    if (o->tensor_parallel > 1 && strcmp(o->backend, "cpu") != 0) {
        fprintf(stderr,
                "pagoda-worker: --tensor-parallel %d needs --backend cpu: its ranks are "
                "threads of this worker; a GPU group is one worker per GPU (--tp-rank R "
                "--tp-size N --tp-group PATH, docs/tensor-parallel.md)\n",
                o->tensor_parallel);
        return WORKER_ARGS_USAGE;
    }
    enum log_level level;
    if (log_level_parse(o->log_level, &level) != 0) {
        fprintf(stderr, "pagoda-worker: --log-level '%s' is not debug, info, warn or error\n",
                o->log_level);
        return WORKER_ARGS_USAGE;
    }
    return 0;
}
