/* pagoda-supervisor's command line (supervisor_opts.c): the limits of what it may ask for, what
 * it asks for (struct sup_opts), and its parser, which checks every flag and every combination
 * before anything is created or started (--check-args stops there). The running supervisor is
 * supervisor.c; its file comment says what each flag does to the group. */
#ifndef PAGODA_DEPLOY_SUPERVISOR_OPTS_H
#define PAGODA_DEPLOY_SUPERVISOR_OPTS_H

#include "comm/comm.h"
#include "deploy/control.h"

#include <stdint.h>
#include <stdio.h>

/* Limits on what the command line may ask for. */
#define SUP_MAX_WORKERS 64
/* Workers a group may have: the scheduler drives one (scheduler_main.c). SUP_MAX_WORKERS is
 * reached only with --allow-multi-worker, which tests of the supervisor use with stand-ins. */
#define SUP_SUPPORTED_WORKERS 1
#define SUP_DEFAULT_HEARTBEAT_MS 1000
#define SUP_DEFAULT_HEARTBEAT_MISSES 15
#define SUP_MAX_HEARTBEAT_MISSES 1000
/* The exit status of a supervisor that found another one running in its run directory. */
#define SUP_EXIT_BUSY 3
#define SUP_MAX_EXTRA_ARGS 32  /* --X-arg values per program */
#define SUP_MAX_ARG_BYTES 4096 /* any one flag value */
#define SUP_MAX_URL_BYTES 256  /* --listen */
/* Engines of one supervisor (--engines); --role router takes at most this many --scheduler. */
#define SUP_MAX_ENGINES 16
/* Ranks of a tensor-parallel engine (--tensor-parallel), and the bytes of one --devices entry. */
#define SUP_MAX_TP COMM_MAX_RANKS
#define SUP_MAX_DEVICE_TEXT 8
/* Programs of one group: every engine's kvpool, workers and scheduler, the router, the
 * gateway. */
#define SUP_MAX_CHILDREN (2 + SUP_MAX_WORKERS + 2 + 3 * SUP_MAX_ENGINES)
#define SUP_MAX_TIMEOUT_MS 3600000

/* The links of an engine whose address is configuration. */
enum link { LINK_KVPOOL, LINK_WORKER, LINK_SCHEDULER, LINK_COUNT };
/* The flag of each link's address ("--kvpool-listen", ...). */
extern const char *const sup_link_flags[LINK_COUNT];

/* What one supervisor starts. */
enum sup_role { SUP_ROLE_ALL, SUP_ROLE_ENGINE, SUP_ROLE_ROUTER };

struct sup_opts {
    const char *run_dir;
    const char *bin_dir;
    const char *model;
    const char *listen;
    const char *http_listen; /* NULL: no gateway */
    const char *block_size;
    const char *kv_blocks;
    const char *kv_bytes;
    const char *backend;
    const char *log_level;
    int workers;
    int allow_multi_worker;
    int check_args; /* --check-args: check the command line, start nothing */
    int engines;
    enum sup_role role;
    const char *routing;                     /* NULL: the router's default */
    const char *link_listen[LINK_COUNT];     /* NULL: the run directory's ipc:// paths */
    const char *schedulers[SUP_MAX_ENGINES]; /* --role router: the engines */
    int num_schedulers;
    uint64_t ready_timeout_ms;
    uint64_t stop_timeout_ms;
    uint64_t heartbeat_ms; /* 0: no heartbeats watched (stuck starts still are) */
    int heartbeat_misses;
    const char *extra[ROLE_COUNT][SUP_MAX_EXTRA_ARGS];
    int num_extra[ROLE_COUNT];
    int tensor_parallel;                           /* ranks per engine; 1: none */
    char devices[SUP_MAX_TP][SUP_MAX_DEVICE_TEXT]; /* --devices, one a rank */
    int num_devices;
};

/* pagoda-supervisor's usage text. */
void sup_usage(FILE *f);

/* Parses argv into o (its strings point into argv) and checks the flags together (engines,
 * roles, tensor parallelism, addresses and their ports). Returns 0, 1 when --help was asked for,
 * or a PAGODA_E* code with a detail naming the flag. */
int sup_parse_opts(int argc, char **argv, struct sup_opts *o);

#endif
