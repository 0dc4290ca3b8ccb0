/* pagoda-worker's command line (worker_main.c's synopsis says what each flag does): parsed and
 * checked into struct worker_opts, before anything starts. */
#ifndef PAGODA_WORKER_WORKER_ARGS_H
#define PAGODA_WORKER_WORKER_ARGS_H

#include <stdint.h>

#define WORKER_MAX_ID 1023
#define WORKER_MAX_SEQS 4096
#define WORKER_MAX_BATCHED_TOKENS (1 << 16)
/* The longest --step-delay-ms (worker/step_loop.h's STEP_LOOP_MAX_DELAY_MS). */
#define WORKER_MAX_DELAY_MS 600000
/* The longest --tp-group path. */
#define WORKER_MAX_PATH 1024
/* --tp-timeout-ms' bounds: a collective waits at least a second, at most an hour. */
#define WORKER_MIN_TP_TIMEOUT_MS 1000
#define WORKER_MAX_TP_TIMEOUT_MS 3600000

struct worker_opts {
    const char *run_dir;
    const char *kvpool;    /* NULL: ipc://DIR/kvpool.ipc */
    const char *scheduler; /* NULL: ipc://DIR/worker-I.ipc */
    const char *model;
    const char *backend;     /* "cpu", "cuda" or "null" */
    const char *load_format; /* "safetensors" or "random" */
    uint64_t seed;           /* the random weights' seed */
    const char *log_level;
    uint32_t worker_id;
    int worker_id_set;
    uint32_t step_delay_ms;
    uint64_t drop_step;   /* 0: off */
    uint64_t drop_result; /* 0: off */
    /* --fault lose-device=PATH: the first step that runs once PATH exists fails as if the device
     * were lost (PATH is removed); NULL: off. */
    const char *lose_device;
    int32_t max_batched_tokens;
    int32_t max_seqs;
    /* Ranks of the model (--tensor-parallel, CPU backend: threads of this worker over its one
     * pool, worker/tp_local.h); 1: no tensor parallelism. */
    int tensor_parallel;
    /* A rank of a group of worker processes (--tp-rank/--tp-size/--tp-group, worker/tp_proc.h);
     * tp_size 0: none. */
    int tp_rank, tp_size, tp_rank_set;
    const char *tp_group;
    /* --tp-timeout-ms: how long a rank waits for its peers in a collective before the group is
     * broken (every rank of a group is given the same); COMM_DEFAULT_TIMEOUT_MS unless
     * given. */
    int tp_timeout_ms, tp_timeout_set;
    int cuda_graphs;        /* --cuda-graphs: 1 on (the default), 0 off */
    int cuda_pdl;           /* --cuda-pdl: 1 on (the default), 0 off */
    int cuda_residual_gemm; /* --cuda-residual-gemm: 1 on (the default), 0 off */
    int cuda_tma;           /* --cuda-tma: worker/backend.h BACKEND_CUDA_TMA_* (default on) */
};

/* worker_args_parse's results besides 0: a usage error (printed on stderr) and --help (the
 * usage printed on stdout). */
#define WORKER_ARGS_USAGE 2
#define WORKER_ARGS_HELP 3

/* Fills *o with the defaults, then with argv's flags (getopt_long from argv[1]; resets optind).
 * Returns 0, WORKER_ARGS_USAGE after printing what is wrong ("pagoda-worker: ..."), or
 * WORKER_ARGS_HELP after printing the usage. Sets nothing outside *o (the log level is checked,
 * not set). */
int worker_args_parse(int argc, char **argv, struct worker_opts *o);

/* Parses a --cuda-tma value ("off", "on" or "stream-k") into *out (worker/backend.h
 * BACKEND_CUDA_TMA_*), for pagoda-worker, pagoda-run and pagoda-logits alike. Errors:
 * PAGODA_EINVAL naming the flag. */
int worker_parse_cuda_tma(const char *flag, const char *text, int *out);

#endif
