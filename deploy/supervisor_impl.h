/* pagoda-supervisor's private state, shared by supervisor.c (the running group: starts,
 * restarts, tensor-parallel units, stops, control messages, the loop) and supervisor_setup.c
 * (what is made before the loop: the run directory's checks, lock and files, each engine's
 * directory and addresses, each program's name and command line). The command line is
 * supervisor_opts.h. Nothing outside deploy/ includes it. */
#ifndef PAGODA_DEPLOY_SUPERVISOR_IMPL_H
#define PAGODA_DEPLOY_SUPERVISOR_IMPL_H

#include "deploy/control.h"
#include "deploy/keeper.h"
#include "deploy/restart_policy.h"
#include "deploy/supervisor_opts.h"

#include <nng/nng.h>

#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <uv.h>

/* Limits of the running group (those of the command line are in supervisor_opts.h). The group
 * file of a tensor-parallel engine, in its run directory. */
#define SUP_TP_GROUP_FILE "tp-group"
/* A Unix socket path holds 107 bytes; the longest name the group binds in DIR is about 25
 * ("engine-15/scheduler.ipc", "engine-15/kvpool-fds.ipc"), so DIR's absolute path gets 80. */
#define SUP_MAX_RUN_DIR 80
/* Control messages are a few dozen bytes; the socket refuses anything larger than this. */
#define SUP_MAX_CONTROL_BYTES 4096
/* How long a process that got SIGKILL may take to be reaped before it is given up on. */
#define SUP_KILL_WAIT_MS 5000
/* Control pipes whose peer pid is remembered (see on_pipe_event): every program's heartbeat
 * pipe stays connected, and closed pipes are remembered a while for their last messages. */
#define SUP_PIPE_SLOTS (2 * SUP_MAX_CHILDREN)
/* argv of one child: program, --run-dir, --log-level, role flags (the router's --scheduler
 * once per engine), extra flags, NULL. */
#define SUP_MAX_ARGV (1 + 4 + 8 + 2 * SUP_MAX_ENGINES + SUP_MAX_EXTRA_ARGS + 1)

enum child_state {
    CHILD_IDLE,    /* not started yet, or stopped; the process handle is closed */
    CHILD_RUNNING, /* spawned, its exit not seen yet */
    CHILD_CLOSING, /* exited (or failed to spawn, or abandoned): the handle is closing */
    CHILD_BACKOFF, /* waiting on restart_timer to be started again */
};

struct supervisor;

struct child {
    struct supervisor *sup;
    enum role role;
    int worker_id; /* -1 for the other roles */
    int engine;    /* -1 for the router and the gateway */
    int tp_rank;   /* a kvpool's or worker's rank with --tensor-parallel above 1; else -1 */
    char name[48]; /* "kvpool", "worker-3", "engine-1/scheduler", "worker-0-r1", ... */
    char *argv[SUP_MAX_ARGV];
    char worker_id_text[12];
    char tp_rank_text[12];
    char tp_group[PATH_MAX]; /* a worker rank's group file */
    /* A worker unit's rank 0: the unit is down (a rank exited, the others are being stopped),
     * since the exit of the first rank, after uptime_ms, described in how. */
    int unit_down;
    uint64_t unit_uptime_ms;
    char unit_how[192];       /* name (48) and describe_exit's text (128) */
    uv_process_t proc;        /* initialized by each spawn, closed after each exit */
    uv_timer_t restart_timer; /* initialized once, closed at the end */
    enum child_state state;
    int pid;             /* of the current or last process */
    int ready;           /* the current process pushed Control{ready} */
    int starts;          /* how many times it was spawned */
    uint64_t started_ms; /* loop time of the last spawn */
    int64_t exit_status; /* of the last exit */
    int term_signal;     /* of the last exit, 0 if none */
    int spawn_error;     /* libuv error of the last spawn, 0 if it succeeded */
    int hung_killed;     /* the current process was killed as hung */
    int watched;         /* the current process sent a ready or heartbeat: liveness applies */
    uint64_t alive_ms;   /* loop time of its last ready or heartbeat */
    struct restart_state restart;
    struct keeper keeper; /* a kvpool's (deploy/keeper.h); unused for the other roles */
};

enum phase { PHASE_STARTING, PHASE_RUNNING, PHASE_STOPPING, PHASE_DONE };

struct pipe_pid {
    uint32_t pipe_id;
    int pid;
    int live; /* connected; a closed pipe's slot is reused first */
};

struct supervisor {
    uv_loop_t loop;
    struct sup_opts opts;
    struct restart_policy policy;
    char run_dir[PATH_MAX];
    char pid_path[PATH_MAX];
    char ready_path[PATH_MAX];
    int lock_fd; /* DIR/lock, flock'ed for the supervisor's life; -1 before */
    char program[ROLE_COUNT][PATH_MAX];
    char model_name[256]; /* the model folder's last component (the gateway's model id) */
    char workers_text[12];
    char tp_size_text[12];
    /* Each engine's run directory (DIR itself with one engine) and its links' addresses: the
     * one its program listens on and the one its peers dial ("" for the ipc:// default). */
    char engine_dir[SUP_MAX_ENGINES][PATH_MAX];
    char listen_addr[SUP_MAX_ENGINES][LINK_COUNT][SUP_MAX_URL_BYTES];
    char dial_addr[SUP_MAX_ENGINES][LINK_COUNT][SUP_MAX_URL_BYTES];
    /* --listen as clients on this host dial it (the gateway, DIR/ready): 0.0.0.0 and * as
     * 127.0.0.1, [::] as [::1]. */
    char listen_dial[SUP_MAX_URL_BYTES];

    nng_socket control;
    int control_open;
    struct wire_inbox *inbox;
    /* Written on NNG's threads (on_pipe_add), read on the loop thread. */
    pthread_mutex_t pipe_lock;
    struct pipe_pid pipes[SUP_PIPE_SLOTS];
    unsigned pipe_next;

    uv_signal_t sigterm, sigint;
    int signals_init;
    uv_timer_t ready_timer; /* the start of the awaited child (or of the router's check) */
    /* The router's check before the start (pagoda-router --check, start_group): running while
     * check_running, its handle closing after. */
    uv_process_t check_proc;
    int check_running;
    uv_timer_t stop_timer;     /* the bound of the current stop stage */
    uv_timer_t liveness_timer; /* every --heartbeat-ms: who stopped sending */
    uint64_t liveness_tick_ms; /* loop time of the last liveness check (or of its start) */
    int timers_init;

    struct child children[SUP_MAX_CHILDREN]; /* in start order */
    int num_children;

    enum phase phase;
    int awaiting;   /* PHASE_STARTING: index of the child whose ready is awaited */
    int stop_stage; /* PHASE_STOPPING: index into stop_order */
    int stage_killed;
    int hurry; /* a second signal: SIGKILL instead of SIGTERM */
    int exit_code;
    uint64_t malformed;
};

/* ---- supervisor_setup.c, for supervisor.c ---- */

/* Resolves the run directory (created 0700, checked, locked: PAGODA_EBUSY when another
 * supervisor holds it) and the programs, and prepares each child (sup->children in start
 * order, names and argv). Returns 0 or a PAGODA_E* code with a detail. */
int sup_prepare(struct supervisor *sup);

/* Opens a file of the run directory for writing (flags: O_CREAT, O_APPEND, O_TRUNC, O_EXCL)
 * without following a symbolic link, and checks that it is a regular file. Returns the
 * descriptor (O_CLOEXEC; the caller closes it) or a PAGODA_E* code naming path. */
int sup_open_run_file(const char *path, int flags);

/* Writes text to path through a temporary file and a rename (a reader sees all or nothing).
 * Returns 0 or a PAGODA_E* code naming path. */
int sup_write_file_atomic(const char *path, const char *text);

/* Removes path; a file already gone is not an error, another failure is logged. */
void sup_remove_file(const char *path);

#endif
