/* pagoda-worker: runs the forward passes of one pool's sequences for the scheduler.
 *
 *   pagoda-worker --run-dir DIR --model MODEL_DIR --worker-id I [--backend cpu|cuda|null]
 *                 [--load-format safetensors|random] [--seed N]
 *                 [--step-delay-ms X] [--fault drop-step=N|drop-result=N|lose-device=PATH]
 *                 [--max-batched-tokens 2048] [--max-seqs 256] [--log-level info]
 *                 [--kvpool URL] [--scheduler URL] [--tensor-parallel N]
 *                 [--tp-rank R --tp-size N --tp-group PATH] [--cuda-graphs on|off]
 *                 [--cuda-pdl on|off] [--cuda-residual-gemm on|off]
 *                 [--cuda-tma on|off|stream-k]
 *                 [--tp-timeout-ms 30000]
 *
 * --kvpool (default ipc://DIR/kvpool.ipc) and --scheduler (default ipc://DIR/worker-I.ipc)
 * replace the two addresses below; either may be tcp:// (the pool itself is of this host).
 * --tensor-parallel N (CPU backend) splits the model over N ranks that are threads of this
 * worker, sharing its pool (worker/tp_local.h, docs/tensor-parallel.md); the scheduler still
 * sees one worker. A size the model's heads, KV heads or MLP cannot be divided by is refused.
 * --tp-rank R --tp-size N --tp-group PATH (CPU or CUDA backend) makes this worker rank R of a
 * group of N worker processes (worker/tp_proc.h, docs/tensor-parallel.md): it maps its own
 * kvpool's pool of the shard's KV heads (default for R > 0: ipc://DIR/kvpool-rR.ipc), meets the
 * other ranks in the group file PATH (made fresh by the supervisor for each start of the group;
 * a stale or malformed one is refused, naming it), and loads only its shard. Rank 0 runs
 * everything below with its backend wrapped by tp_leader_open (each step goes to the other ranks
 * first) and announces tp_size 1 and the group's pool identity to the scheduler; ranks above 0
 * open no scheduler link: after Control{ready} they run the steps rank 0 sends until it says
 * stop (exit 0), rank 0's process or this one's parent is gone, or a signal (which aborts the
 * group, so that rank 0 fails at once instead of at the collectives' timeout; exit 0 on a signal,
 * 1 otherwise). Rank 0 exits 1 at once when a step's collective fails for the group itself (a
 * rank did not arrive in time, or aborted): the supervisor then restarts every rank, a hung one
 * too. --tp-size 1 is a plain worker (the file is not used). --tp-timeout-ms MS (default
 * COMM_DEFAULT_TIMEOUT_MS, 30 s; 1 s to 1 h) is "in time": how long a collective (those
 * that open the backend too) waits for a rank (the supervisor gives every rank the same); a longer
 * step than that on one rank breaks the group, a shorter value finds a hung rank sooner.
 *
 * Start (docs/protocol.md): asks kvpool (REQ ipc://DIR/kvpool.ipc, for up to 30 s) for the
 * pool's geometry, maps the pool and checks that it fits the model, loads the model and opens
 * the backend over the pool, pushes Control{ready, "worker-I"} to the supervisor, dials its
 * scheduler link (PAIR ipc://DIR/worker-I.ipc) and sends Hello every 200 ms until a Resync
 * answers. Hello is sent again the same way whenever the link connects anew (a restarted
 * scheduler learns who is there).
 *
 * Then, on one libuv loop, for each ToWorker (the step loop, worker/step_loop.h):
 *  - Resync: the mirror (worker/mirror.h) takes the snapshot; answers ResyncDone (with an
 *    error code when the snapshot is refused; the mirror is then unchanged; with the sequences
 *    it left out for their own content in failed) naming the pool this worker maps. A resync
 *    for another pool (its pool_id) is refused with PAGODA_EMISMATCH after a Hello that tells
 *    the scheduler which pool this is. Steps queued and not started are discarded first; a step
 *    that runs is waited for (without blocking the loop) and answered before the ResyncDone.
 *  - Step: checks the step against the mirror and prepares its batch on the loop, then hands it
 *    to the executor (worker/executor.h), whose thread waits --step-delay-ms (or the step's
 *    delay_ms, whichever is longer), runs one forward pass and samples; the loop answers
 *    StepResult{epoch, step_id, results, computed_tokens, step timing} when it is done. Steps
 *    run in order and up to MIRROR_MAX_STEPS_IN_FLIGHT are held, so a step can arrive and be
 *    prepared while the one before it runs (its decode inputs are that one's tokens, resolved
 *    when it runs). A step of another epoch is ignored (counted, no answer). An error that
 *    belongs to one sequence (its token ids, length, block table or sampling parameters, found
 *    by the mirror; its logits or its sampling, found by the backend; a sequence whose token of
 *    the step before could not be sampled) fails that sequence only: its SeqResult carries
 *    error_code and error_message instead of a token, the mirror drops it, and the step goes on
 *    for the others. A refused step (it disagrees with the mirror, or breaks a limit of the
 *    whole step) is answered with StepResult{error_code, error_message} and leaves the mirror
 *    unchanged; a failed forward pass is answered the same way, and so is every step after it
 *    until the next Resync (the steps prepared from it are not run).
 *  - Shutdown (or SIGTERM / SIGINT): exits 0 (the step running is finished, queued ones are
 *    dropped).
 * computed_tokens counts every token this process computed in forward passes since it started.
 * A malformed message is counted and logged, never fatal.
 *
 * The KV pool is kvpool's: the worker maps it (worker/worker_pool.h) and never removes it, so a
 * restarted worker finds the KV its predecessor wrote; the pool must fit the model and the
 * backend's dtype. Before it loads anything onto the GPU, a CUDA worker checks its memory
 * budget (worker/worker_budget.h): weights, activations (for --max-batched-tokens and
 * --max-seqs) and reserve must fit in the memory left beside the pool, or it refuses to start,
 * saying by how much. A worker that cannot run as configured (that refusal, a pool of the wrong
 * kind, dtype or shape) exits with PAGODA_EXIT_CANNOT_RUN (common/exit_status.h), which tells the
 * supervisor that a restart would fail the same way; other start failures exit 1.
 *
 * --load-format random (CUDA backend) draws weights of the shape in MODEL_DIR/config.json on
 * the GPU from --seed instead of reading them (as pagoda-run --load-format random does, so the
 * two give the same weights for the same seed).
 *
 * --cuda-graphs on (the default; CUDA backend) captures a CUDA graph per decode batch size when
 * the backend opens, before the worker reports ready, and replays it for each decode-only step
 * (worker/cuda_backend.h); off runs every step launch by launch, for comparison. The log says
 * how long the capture took and how much memory it used, and at exit how many steps replayed a
 * graph. The memory budget counts the graphs either way.
 *
 * --cuda-pdl on (the default; CUDA backend) launches the kernels that support it with
 * programmatic dependent launch (worker/cuda_backend.h .pdl); off keeps plain stream order, for
 * comparison (the same bits either way).
 *
 * --cuda-residual-gemm on (the default; CUDA backend) adds the O and down projections of steps of
 * 2 to 256 tokens into the FP32 residual stream inside their GEMMs (worker/cuda_backend.h
 * .residual_gemm_max_rows: one rank, and not where a GEMV of ours takes them); off rounds the
 * products to BF16 and adds them in the RMSNorm, as before: other bits, for comparison.
 *
 * --cuda-tma on (the default; CUDA backend) runs a layer's linears of steps of 2 to 16 tokens
 * through kernels/cuda/linear_tma's GEMM (worker/cuda_backend.h .tma_max_rows); off through the
 * GEMVs and cuBLAS, as before: other bits, for comparison.
 *
 * --backend null loads only config.json and answers every step at once with deterministic
 * tokens (worker/null_backend.h), still through the mirror: for benchmarks of the engine.
 * --fault drop-step=N ignores the N-th Step received (no answer, mirror unchanged);
 * --fault drop-result=N runs the N-th Step (the mirror advances) but does not send its result.
 * Both count every Step message received, of any epoch, from 1. --fault lose-device=PATH makes
 * the first step that runs once PATH exists fail as a lost device does (PATH is removed first):
 * the worker exits, as it does when backend_health says its device context is lost, so that the
 * supervisor starts a new one. */
#include "common/error.h"
#include "common/exit_status.h"
#include "common/log.h"
#include "common/parse.h"
#include "kvpool/kvpool_client.h"
#include "kvpool/kvpool_proto.h"
#include "kvpool/shm_pool.h"
#include "model/model_config.h"
#include "model/model_fingerprint.h"
#include "model/model_shard.h"
#include "model/model_weights.h"
#include "wire/address.h"
#include "wire/wire.h"
#include "worker/backend.h"
#include "worker/cpu_backend.h"
#include "worker/mirror.h"
#include "worker/null_backend.h"
#include "worker/step_loop.h"
#include "worker/tp_group.h"
#include "worker/tp_local.h"
#include "worker/tp_proc.h"
#include "worker/worker_args.h"
#include "worker/worker_pool.h"
#ifdef PAGODA_HAVE_CUDA
#include "kvpool/cuda_pool.h"
#include "worker/cuda_backend.h"
#include "worker/worker_budget.h"
#endif

#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>
#include <nng/protocol/reqrep0/req.h>

#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>

/* How long the worker waits for kvpool's answer at start, and how often it asks. */
#define WORKER_KVPOOL_WAIT_MS 30000
#define WORKER_HELLO_MS 200
/* Messages the scheduler link queues while the transport is busy. NNG's PAIR socket holds none
 * by default, so a non-blocking send made while the previous message is still being written
 * fails; results sent back to back (fast steps) would be dropped at random. */
#define WORKER_SEND_BUFFER 64
/* Malformed messages are logged one by one up to this many, then every 1000th. */
#define WORKER_MALFORMED_LOGGED 10

struct worker {
    struct worker_opts o;
    char name[32]; /* "worker-I": the Control sender */
    uv_loop_t loop;
    uv_timer_t hello_timer;
    struct wire_heartbeat *heartbeat; /* the supervisor's liveness check (wire.h) */
    uv_signal_t sigterm, sigint;
    uv_async_t pipe_async;
    atomic_int pipe_added; /* set on NNG's thread, taken on the loop */
    atomic_int connected;  /* pipes of the scheduler link; kept on NNG's thread */
    int handles_open;
    nng_socket sock;
    int sock_open;
    struct wire_inbox *inbox;
    int hello_active;
    int stopping;

    struct model_config config;
    uint8_t fingerprint[MODEL_FINGERPRINT_BYTES]; /* model_fingerprint.h: in every Hello */
    struct worker_pool pool; /* kvpool's pool, as this worker maps it (worker_pool.h) */
    int cannot_run;          /* the start failed in a way a restart would repeat */
    int lost_rc;             /* the backend cannot run any more (backend_lost_cb), or 0 */
    char lost_why[700];
    struct backend *backend;
    struct backend_limits limits;
    struct mirror_limits mirror_limits;
    /* A rank of a group of processes: the group, the CUDA backend's collectives (NCCL's, owned,
     * or the group's), the parent the rank watches, the pool identity announced. */
    struct tp_proc *tp;
    struct comm *tp_device_comm;
    int tp_device_comm_owned;
    pid_t parent;
    uint64_t pool_id;
    struct step_loop *steps; /* the mirror and the executor (worker/step_loop.h) */

    uint64_t malformed;
    uint64_t send_failures;
};

/* Set by the signal handler while the loop does not run yet (start-up). */
static volatile sig_atomic_t g_stop;

static void on_early_signal(int sig)
{
    (void)sig;
    g_stop = 1;
}

static void log_rc(enum log_level level, const char *what, int rc)
{
    char msg[700];
    log_msg(level, "%s: %s", what, pagoda_error_message(rc, msg, sizeof(msg)));
}

/* ---- start: the pool, the model, the backend ----------------------------------------------- */

#ifdef PAGODA_HAVE_CUDA
static int gpu_mem_info(void *ctx, uint64_t *free_bytes, uint64_t *total_bytes)
{
    return kv_cuda_mem_info(*(const int *)ctx, free_bytes, total_bytes);
}

/* The memory budget (worker/worker_budget.h), against the GPU the pool is on. */
static int check_gpu_memory(struct worker *w, const struct backend_limits *bl)
{
    int device = kv_cuda_pool_device(w->pool.gpu);
    struct worker_budget_request r = {
        .config = &w->config,
        .max_tokens = bl->max_num_tokens,
        .max_seqs = bl->max_num_seqs,
        .device = device,
        .pool_bytes = kv_cuda_pool_mapped_bytes(w->pool.gpu),
        .mem_info = gpu_mem_info,
        .mem_info_ctx = &device,
        .wait_ms = WORKER_BUDGET_WAIT_MS,
        .poll_ms = WORKER_BUDGET_POLL_MS,
        .stop = &g_stop,
    };
    int rc = worker_budget_check(&r);
    if (rc == PAGODA_EEXHAUSTED)
        w->cannot_run = 1;
    return rc;
}
#endif

/* A model folder's file that cannot be read as a model (config.json, generation_config.json,
 * the safetensors files: broken, missing, a FIFO) is the operator's to fix, and a restart at once
 * would fail alike: the worker cannot run as configured, so that a served group tries it again
 * without end instead of counting a crash loop and stopping (the router and gateway with it, and
 * the requests waiting). Out of memory is not the files'. Returns rc. */
static int model_files_failed(struct worker *w, int rc)
{
    if (rc != 0 && rc != PAGODA_ENOMEM && !g_stop) /* (a stop during the start is not) */
        w->cannot_run = 1;
    return rc;
}

/* Opens the backend the options ask for over the mapped pool. */
static int open_backend(struct worker *w, const struct backend_limits *bl)
{
    const struct worker_opts *o = &w->o;
    const struct kv_geometry *pg = &w->pool.info.geometry;
    if (strcmp(o->backend, "null") == 0)
        return null_backend_open(&w->config, bl, &w->backend);
    struct model_weights *mw = NULL;
    int rc = 0;
    if (strcmp(o->backend, "cuda") == 0) {
#ifdef PAGODA_HAVE_CUDA
        /* A rank's budget is its shard's: cuda_backend_open checks it (model_budget_shard_*). */
        if (w->tp == NULL && (rc = check_gpu_memory(w, bl)) != 0)
            return rc;
        struct cuda_backend_options co = cuda_backend_default_options();
        co.device = kv_cuda_pool_device(w->pool.gpu);
        co.limits = *bl;
        co.cuda_graphs = o->cuda_graphs;
        co.pdl = o->cuda_pdl;
        if (!o->cuda_residual_gemm)
            co.residual_gemm_max_rows = 0;
        cuda_backend_set_tma(&co, o->cuda_tma);
        /* The ranks' communicator first, while they are in step (every rank just joined): its
         * opening is collective and bounded by the group's timeout. */
        if (w->tp != NULL && (rc = tp_proc_device_comm(w->tp, co.device, &w->tp_device_comm,
                                                       &w->tp_device_comm_owned)) != 0)
            return rc;
        co.comm = w->tp_device_comm;
        if (strcmp(o->load_format, "random") != 0 &&
            (rc = w->tp != NULL ? model_weights_open_shard(o->model, o->tp_rank, o->tp_size, &mw)
                                : model_weights_open(o->model, &mw)) != 0)
            return model_files_failed(w, rc);
        rc = cuda_backend_open(&w->config, mw, o->seed, pg, kv_cuda_pool_data(w->pool.gpu), &co,
                               &w->backend);
        if (rc == PAGODA_EEXHAUSTED)
            w->cannot_run = 1;
#endif
    } else if (w->tp != NULL) {
        /* One rank of a group of processes: its shard, over its kvpool's pool of the shard's
         * KV heads, collectives through the group. */
        if ((rc = model_weights_open_shard(o->model, o->tp_rank, o->tp_size, &mw)) != 0)
            return model_files_failed(w, rc);
        struct cpu_backend_options co = cpu_backend_default_options();
        co.limits = *bl;
        co.comm = tp_proc_comm(w->tp);
        rc = cpu_backend_open(mw, pg, kv_shm_pool_data(w->pool.shm), &co, &w->backend);
    } else if (o->tensor_parallel > 1) {
        struct cpu_backend_options co = cpu_backend_default_options();
        co.limits = *bl;
        rc = tp_local_open(o->model, o->tensor_parallel, pg, kv_shm_pool_data(w->pool.shm), &co,
                           o->tp_timeout_ms, &w->backend);
        if (rc == PAGODA_EUNSUPPORTED)
            w->cannot_run = 1; /* a size the model cannot be split by: restarting will not help */
    } else if ((rc = model_weights_open(o->model, &mw)) != 0) {
        return model_files_failed(w, rc);
    } else {
        struct cpu_backend_options co = cpu_backend_default_options();
        co.limits = *bl;
        rc = cpu_backend_open(mw, pg, kv_shm_pool_data(w->pool.shm), &co, &w->backend);
    }
    model_weights_close(mw); /* both backends keep their own copy of the weights */
    return rc;
}

/* The start's waits for the other ranks go on until a signal, or until the parent (the
 * supervisor) is gone: a peer that never claims its place (its process never got that far) has
 * no pid to watch, and without the supervisor, which would kill the group, nothing else would
 * end the wait. */
static int start_keep_waiting(void *ctx)
{
    const struct worker *w = ctx;
    if (g_stop)
        return 0;
    if (getppid() != w->parent) {
        log_error("the parent (pid %d) exited during the start: tensor-parallel rank %d stops "
                  "waiting for its group",
                  (int)w->parent, w->o.tp_rank);
        return 0;
    }
    return 1;
}

/* Joins the group of processes (worker/tp_proc.h): every rank agrees on the model, the pool's
 * geometry and the step limits before anything heavy is loaded. */
static int join_group(struct worker *w, const struct backend_limits *bl)
{
    const struct worker_opts *o = &w->o;
    const struct kv_geometry *pg = &w->pool.info.geometry;
    struct tp_proc_member me = {
        .num_layers = pg->num_layers,
        .num_blocks = pg->num_blocks,
        .block_size = pg->block_size,
        .num_kv_heads = pg->num_kv_heads,
        .head_dim = pg->head_dim,
        .dtype = (int32_t)pg->dtype,
        .max_num_tokens = bl->max_num_tokens,
        .max_num_seqs = bl->max_num_seqs,
        .max_blocks_per_seq = bl->max_blocks_per_seq,
        .pool_id = pg->pool_id,
    };
    memcpy(me.fingerprint, w->fingerprint, sizeof(me.fingerprint));
    snprintf(me.backend, sizeof(me.backend), "%s", o->backend);
#ifdef PAGODA_HAVE_CUDA
    if (w->pool.gpu != NULL) {
        me.has_device = 1;
        memcpy(me.device_uuid, kv_cuda_pool_uuid(w->pool.gpu), sizeof(me.device_uuid));
    }
#endif
    struct tp_proc_options to = {
        .path = o->tp_group,
        .rank = o->tp_rank,
        .size = o->tp_size,
        .timeout_ms = o->tp_timeout_ms,
        .want_nccl = strcmp(o->backend, "cuda") == 0,
        .keep_waiting = start_keep_waiting,
        .ctx = w,
    };
    int rc = tp_proc_join(&to, &me, &w->tp);
    if (rc == PAGODA_EMISMATCH || rc == PAGODA_EFORMAT)
        w->cannot_run = 1; /* a restart would disagree, or find the same file, alike */
    if (rc == 0)
        w->pool_id = tp_proc_pool_id(w->tp);
    return rc;
}

/* Rank 0's group broke (tp_leader_on_broken): it can run no other step, and a step error would
 * not get it restarted: a peer that hangs is still there, so the supervisor sees no exit, while
 * the scheduler, retrying and isolating, would fail request after request. Rank 0 exits at once
 * instead, as a killed rank does: the supervisor restarts the unit (killing the hung rank) and
 * the scheduler's resync replays what the group lost. */
static void group_broke(int rc, void *ctx)
{
    (void)ctx;
    log_rc(LOG_ERROR,
           "the tensor-parallel group broke: rank 0 exits so that the supervisor "
           "restarts the group",
           rc);
    _exit(1);
}

/* Maps the pool kvpool named, loads the model and opens the backend and the mirror. */
static int worker_load(struct worker *w)
{
    const struct worker_opts *o = &w->o;
    struct kvpool_info info;
    char kvpool_url[512];
    const char *kvpool = o->kvpool;
    int rc = 0;
    if (kvpool == NULL && o->tp_size > 1 && o->tp_rank > 0) {
        /* A rank above 0 has a kvpool of its own (pagoda-kvpool --tp-rank R's default). */
        char file[32];
        snprintf(file, sizeof(file), "kvpool-r%d.ipc", o->tp_rank);
        if ((rc = wire_ipc_url(kvpool_url, sizeof(kvpool_url), o->run_dir, file)) != 0)
            return rc;
        kvpool = kvpool_url;
    }
    /* The tokenizer's EOS only where the Hello announces the stop ids: rank 0. */
    char note[640] = "";
    if ((rc = model_config_load(o->model, &w->config)) != 0 ||
        (o->tp_rank == 0 &&
         (rc = model_config_add_tokenizer_eos(o->model, &w->config, note, sizeof(note))) != 0) ||
        (rc = model_fingerprint(o->model, o->load_format, o->seed, w->fingerprint)) != 0)
        return model_files_failed(w, rc);
    if (note[0] != '\0')
        log_warn("%s: the tokenizer's EOS is not a stop id (vLLM would stop at it)", note);
    /* A rank's pool holds its shard's KV heads: a size the model cannot be split by stops here,
     * naming the field. */
    struct model_config pool_config = w->config;
    if (o->tp_size > 1) {
        struct model_shard shard;
        if ((rc = model_shard_make(&w->config, o->tp_rank, o->tp_size, &shard)) != 0) {
            w->cannot_run = 1;
            return rc;
        }
        pool_config.num_kv_heads = shard.num_kv_heads;
    }
    if ((rc = kvpool != NULL ? kvpool_fetch_pool_at(kvpool, o->worker_id, WORKER_KVPOOL_WAIT_MS,
                                                    &g_stop, &info)
                             : kvpool_fetch_pool(o->run_dir, o->worker_id, WORKER_KVPOOL_WAIT_MS,
                                                 &g_stop, &info)) != 0 ||
        (rc = worker_pool_init(&w->pool, &info, o->backend, o->worker_id, WORKER_KVPOOL_WAIT_MS,
                               &w->cannot_run)) != 0)
        return rc;
    const struct kv_geometry *pg = &w->pool.info.geometry;
    w->pool_id = pg->pool_id;
    if ((rc = worker_pool_check_model(&w->pool, &pool_config, o->model, o->backend)) != 0) {
        w->cannot_run = 1;
        return rc;
    }

    int64_t max_tokens = w->config.max_position_embeddings;
    int64_t pool_tokens = (int64_t)(pg->num_blocks - 1) * pg->block_size;
    if (max_tokens > pool_tokens)
        max_tokens = pool_tokens;
    if (max_tokens > SAMPLER_HISTORY_MAX)
        max_tokens = SAMPLER_HISTORY_MAX;
    struct mirror_limits ml = {
        .max_seqs = o->max_seqs,
        .max_tokens_per_seq = (int32_t)max_tokens,
        .max_batched_tokens = o->max_batched_tokens,
        .num_blocks = pg->num_blocks,
        .block_size = pg->block_size,
        .vocab_size = w->config.vocab_size,
    };
    struct backend_limits bl = {
        .max_num_tokens = o->max_batched_tokens,
        .max_num_seqs = o->max_seqs,
        .max_blocks_per_seq = mirror_limits_max_blocks_per_seq(&ml),
    };
    w->mirror_limits = ml;
    w->limits = bl;

    if (o->tp_size > 1 && (rc = join_group(w, &bl)) != 0)
        return rc;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if ((rc = open_backend(w, &bl)) != 0)
        return rc;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (o->tensor_parallel > 1)
        log_info("worker %u: tensor parallel, %d ranks (threads) over one pool", o->worker_id,
                 o->tensor_parallel);
    if (w->tp != NULL) {
        /* Rank 0 serves once every rank has loaded; it hands each step to them first. */
        if ((rc = tp_proc_loaded(w->tp, start_keep_waiting, w)) != 0)
            return rc;
        if (o->tp_rank == 0) {
            rc = tp_leader_open(w->backend, tp_proc_comm(w->tp), &bl, &w->backend);
            if (rc != 0) {
                w->backend = NULL; /* closed by tp_leader_open */
                return rc;
            }
            tp_leader_on_broken(w->backend, group_broke, NULL);
        }
        log_info("worker %u: tensor-parallel rank %d of %d (processes, group file %s); group pool "
                 "id %016" PRIx64,
                 o->worker_id, o->tp_rank, o->tp_size, o->tp_group, w->pool_id);
    }

    log_info("worker %u: %s backend, model %s%s (%" PRId64 " layers, vocab %" PRId64
             ") loaded in %.2f s; kv pool %s: %d blocks of %d tokens (%" PRId64
             " tokens), %s; up to %d sequences, %d tokens a step, %d tokens a sequence",
             o->worker_id, o->backend, o->model,
             strcmp(o->load_format, "random") == 0 ? " (random weights)" : "", w->config.num_layers,
             w->config.vocab_size,
             (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9,
             w->pool.where, pg->num_blocks, pg->block_size,
             (int64_t)(pg->num_blocks - 1) * pg->block_size, dtype_name(pg->dtype), o->max_seqs,
             o->max_batched_tokens, ml.max_tokens_per_seq);
    return 0;
}

/* ---- messages out ------------------------------------------------------------------------ */

static void send_to_scheduler(struct worker *w, Pagoda__Internal__ToScheduler *msg,
                              const char *what)
{
    msg->has_protocol_version = 1;
    msg->protocol_version = WIRE_PROTOCOL_VERSION;
    int rc = wire_send(w->sock, &msg->base);
    if (rc != 0) {
        w->send_failures++;
        log_rc(rc == PAGODA_EBUSY ? LOG_DEBUG : LOG_WARN, what, rc);
    }
}

static void send_hello(struct worker *w)
{
    const struct kvpool_info *pi = &w->pool.info;
    int gpu_pool = pi->handle_socket[0] != '\0';
    Pagoda__Internal__PoolGeometry pg;
    kvpool_geometry_to_proto(&pi->geometry, gpu_pool ? NULL : pi->shm_name, pi->device,
                             gpu_pool ? pi->handle_socket : NULL, &pg);
    pg.pool_id = w->pool_id; /* a group's: every rank's pool (worker/tp_proc.h) */
    Pagoda__Internal__Hello h = PAGODA__INTERNAL__HELLO__INIT;
    h.has_worker_id = h.has_pid = h.has_tp_rank = h.has_tp_size = 1;
    h.worker_id = w->o.worker_id;
    h.pid = (int32_t)getpid();
    h.tp_rank = 0;
    h.tp_size = 1;
    h.geometry = &pg;
    h.has_vocab_size = h.has_max_position_embeddings = 1;
    h.vocab_size = w->config.vocab_size;
    h.max_position_embeddings = w->config.max_position_embeddings;
    h.n_eos_token_ids = (size_t)w->config.num_eos;
    h.eos_token_ids = w->config.eos_token_ids;
    h.backend = (char *)w->o.backend;
    h.has_model_fingerprint = 1;
    h.model_fingerprint.data = w->fingerprint;
    h.model_fingerprint.len = sizeof(w->fingerprint);
    Pagoda__Internal__ToScheduler msg = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    msg.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_HELLO;
    msg.hello = &h;
    send_to_scheduler(w, &msg, "Hello");
}

static void send_to_scheduler_cb(void *ctx, Pagoda__Internal__ToScheduler *msg, const char *what)
{
    send_to_scheduler(ctx, msg, what);
}

static void send_hello_cb(void *ctx)
{
    send_hello(ctx);
}

/* ---- messages in --------------------------------------------------------------------------- */

static void stop_hello(struct worker *w)
{
    if (w->hello_active) {
        uv_timer_stop(&w->hello_timer);
        w->hello_active = 0;
    }
}

static void worker_stop(struct worker *w, const char *why)
{
    if (w->stopping)
        return;
    w->stopping = 1;
    struct step_loop_stats st = {0};
    if (w->steps != NULL)
        step_loop_stats(w->steps, &st);
    double n = st.steps_run ? (double)st.steps_run : 1.0;
    log_info("stopping (%s) after %" PRIu64 " steps (%.1f us wall, %.1f us device each), %" PRIu64
             " tokens computed; %" PRIu64 " steps refused, %" PRIu64
             " of other epochs ignored, %" PRIu64 " resyncs, %" PRIu64 " malformed messages",
             why, st.steps_run, st.wall_us_total / n, st.device_us_total / n, st.computed_tokens,
             st.steps_refused, st.stale_steps, st.resyncs, w->malformed);
    uv_stop(&w->loop);
}

/* step_loop_options.lost: the worker stops without answering and exits with an error (main
 * logs it, worker_serve's), so that the supervisor starts a new one on a new device context. */
static void backend_lost_cb(void *ctx, int rc, const char *why)
{
    struct worker *w = ctx;
    w->lost_rc = rc != 0 ? rc : PAGODA_ECUDA;
    snprintf(w->lost_why, sizeof(w->lost_why), "%s", why);
    worker_stop(w, "the backend cannot run any more");
}

static void count_malformed(struct worker *w, const char *what)
{
    w->malformed++;
    if (w->malformed <= WORKER_MALFORMED_LOGGED || w->malformed % 1000 == 0)
        log_warn("malformed message from the scheduler (%s); %" PRIu64 " so far", what,
                 w->malformed);
}

static void on_message(void *ctx, nng_msg *m)
{
    struct worker *w = ctx;
    if (w->stopping) {
        nng_msg_free(m);
        return;
    }
    Pagoda__Internal__ToWorker *msg =
        (Pagoda__Internal__ToWorker *)wire_unpack(&pagoda__internal__to_worker__descriptor, m);
    nng_msg_free(m);
    if (msg == NULL) {
        count_malformed(w, "not a ToWorker");
        return;
    }
    switch (msg->msg_case) {
    case PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC:
        stop_hello(w);
        step_loop_handle(w->steps, msg); /* takes msg */
        return;
    case PAGODA__INTERNAL__TO_WORKER__MSG_STEP:
        step_loop_handle(w->steps, msg); /* takes msg */
        return;
    case PAGODA__INTERNAL__TO_WORKER__MSG_SHUTDOWN:
        worker_stop(w, "Shutdown");
        break;
    default:
        count_malformed(w, "an empty ToWorker");
        break;
    }
    protobuf_c_message_free_unpacked(&msg->base, NULL);
}

/* ---- loop handles ---------------------------------------------------------------------------- */

/* Hello goes out only while the link is up: queued, a pile of stale Hellos would reach the
 * next scheduler and each would ask it for a resync. */
static void on_hello_timer(uv_timer_t *t)
{
    struct worker *w = t->data;
    if (atomic_load(&w->connected) > 0)
        send_hello(w);
}

/* NNG thread: the link connected (the first time, or to a restarted scheduler) or dropped. */
static void on_pipe_event(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct worker *w = arg;
    if (ev == NNG_PIPE_EV_REM_POST) {
        atomic_fetch_sub(&w->connected, 1);
        return;
    }
    atomic_fetch_add(&w->connected, 1);
    atomic_store(&w->pipe_added, 1);
    uv_async_send(&w->pipe_async);
}

static void on_pipe_async(uv_async_t *a)
{
    struct worker *w = a->data;
    if (!atomic_exchange(&w->pipe_added, 0) || w->stopping)
        return;
    if (!w->hello_active)
        log_info("scheduler link connected anew: sending Hello until a Resync answers");
    w->hello_active = 1;
    uv_timer_start(&w->hello_timer, on_hello_timer, 0, WORKER_HELLO_MS);
}

static void on_signal(uv_signal_t *s, int signum)
{
    worker_stop(s->data, strsignal(signum));
}

/* The scheduler link: wire_pair_open's PAIR dialer, plus a send buffer and pipe events, which
 * must be in place before the dial starts (a connection made before them would go unseen). */
static int open_link(struct worker *w, const char *url)
{
    int rv = nng_pair1_open(&w->sock);
    if (rv != 0)
        return wire_error(rv, "nng_pair1_open");
    w->sock_open = 1;
    if ((rv = nng_socket_set_size(w->sock, NNG_OPT_RECVMAXSZ, WIRE_MAX_MESSAGE_BYTES)) != 0 ||
        (rv = nng_socket_set_int(w->sock, NNG_OPT_SENDBUF, WORKER_SEND_BUFFER)) != 0 ||
        (rv = nng_socket_set_ms(w->sock, NNG_OPT_RECONNMINT, 20)) != 0 ||
        (rv = nng_socket_set_ms(w->sock, NNG_OPT_RECONNMAXT, 100)) != 0 ||
        (rv = nng_pipe_notify(w->sock, NNG_PIPE_EV_ADD_POST, on_pipe_event, w)) != 0 ||
        (rv = nng_pipe_notify(w->sock, NNG_PIPE_EV_REM_POST, on_pipe_event, w)) != 0)
        return wire_error(rv, "scheduler link options");
    if ((rv = nng_dial(w->sock, url, NULL, NNG_FLAG_NONBLOCK)) != 0)
        return wire_error(rv, url);
    return 0;
}

static int worker_serve(struct worker *w)
{
    char url[512], file[48];
    snprintf(file, sizeof(file), "%s.ipc", w->name);
    int rc = 0;
    if (w->o.scheduler != NULL)
        snprintf(url, sizeof(url), "%s", w->o.scheduler); /* checked: WIRE_ADDRESS_MAX */
    else
        rc = wire_ipc_url(url, sizeof(url), w->o.run_dir, file);
    if (rc != 0)
        return rc;

    if (uv_loop_init(&w->loop) != 0)
        return pagoda_error_set(PAGODA_EIO, "uv_loop_init failed");
    uv_timer_init(&w->loop, &w->hello_timer);
    uv_signal_init(&w->loop, &w->sigterm);
    uv_signal_init(&w->loop, &w->sigint);
    uv_async_init(&w->loop, &w->pipe_async, on_pipe_async);
    w->hello_timer.data = w->sigterm.data = w->sigint.data = w->pipe_async.data = w;
    w->handles_open = 1;
    uv_signal_start(&w->sigterm, on_signal, SIGTERM);
    uv_signal_start(&w->sigint, on_signal, SIGINT);

    struct step_loop_options so = {
        .mirror = w->mirror_limits,
        .pool_id = w->pool_id,
        .step_delay_ms = w->o.step_delay_ms,
        .drop_step = w->o.drop_step,
        .drop_result = w->o.drop_result,
        .send = send_to_scheduler_cb,
        .send_hello = send_hello_cb,
        .lost = backend_lost_cb,
        .lose_device = w->o.lose_device,
        .ctx = w,
    };
    if ((rc = step_loop_open(&w->loop, w->backend, &so, &w->steps)) != 0)
        return rc;
    if ((rc = open_link(w, url)) != 0)
        return rc;
    if ((rc = wire_inbox_open(&w->loop, w->sock, on_message, w, &w->inbox)) != 0)
        return rc;
    log_info("dialing the scheduler at %s", url);
    if ((rc = wire_heartbeat_open(w->o.run_dir, w->name, &w->heartbeat)) != 0 ||
        (rc = wire_heartbeat_start(w->heartbeat, &w->loop)) != 0)
        log_rc(LOG_WARN, "no heartbeat to the supervisor", rc);
    w->hello_active = 1;
    uv_timer_start(&w->hello_timer, on_hello_timer, 0, WORKER_HELLO_MS);
    if (g_stop)
        worker_stop(w, "signal during start");
    uv_run(&w->loop, UV_RUN_DEFAULT);
    if (w->lost_rc != 0)
        return pagoda_error_set(w->lost_rc,
                                "the backend cannot run any more: exiting, so that the supervisor "
                                "starts a new worker (the scheduler resyncs it; no request is "
                                "lost): %s",
                                w->lost_why);
    return 0;
}

static void close_cb(uv_handle_t *h)
{
    (void)h;
}

/* Teardown: the inbox and its aio first, then the socket, then the loop's handles. */
static void worker_fini(struct worker *w)
{
    wire_inbox_close(w->inbox);
    w->inbox = NULL;
    if (w->sock_open)
        nng_close(w->sock);
    if (w->handles_open) {
        step_loop_close(w->steps); /* joins the executor's thread: no forward pass runs after */
        w->steps = NULL;
        uv_close((uv_handle_t *)&w->hello_timer, close_cb);
        uv_close((uv_handle_t *)&w->sigterm, close_cb);
        uv_close((uv_handle_t *)&w->sigint, close_cb);
        uv_close((uv_handle_t *)&w->pipe_async, close_cb);
        wire_heartbeat_close(w->heartbeat);
        w->heartbeat = NULL;
        uv_run(&w->loop, UV_RUN_DEFAULT);
        uv_loop_close(&w->loop);
    }
    if (w->backend != NULL) /* the executor's thread is joined: the counts are still */
        log_info("%llu forward passes, %llu of them replayed a CUDA graph%s",
                 (unsigned long long)backend_forward_count(w->backend),
                 (unsigned long long)backend_graph_steps(w->backend),
                 backend_graph_capture_failures(w->backend) > 0
                     ? " (graphs off: their capture failed at open)"
                     : "");
    backend_close(w->backend); /* first: it synchronizes its stream, then nothing uses the pool */
    w->backend = NULL;
    if (w->tp_device_comm_owned)
        comm_close(w->tp_device_comm);
    tp_proc_close(w->tp); /* after the backend: rank 0's close told the other ranks to stop */
    w->tp = NULL;
    worker_pool_fini(&w->pool); /* unmaps only: the pool is kvpool's */
}

/* ---- main ------------------------------------------------------------------------------------ */

/* A rank above 0 waits for its next step as long as rank 0 and its own parent are there and no
 * signal came. */
static int follower_keep_waiting(void *ctx)
{
    struct worker *w = ctx;
    return !g_stop && getppid() == w->parent && tp_proc_leader_alive(w->tp);
}

/* A rank above 0: runs rank 0's steps until it says stop (0) or this rank stops waiting. */
static int follow(struct worker *w)
{
    uint64_t steps = 0;
    log_info("worker %u: tensor-parallel rank %d of %d following rank 0's steps", w->o.worker_id,
             w->o.tp_rank, w->o.tp_size);
    int rc = tp_follower_run(w->backend, tp_proc_comm(w->tp), &w->limits, follower_keep_waiting, w,
                             &steps);
    if (rc == 0) {
        log_info("rank 0 said stop after %" PRIu64 " steps", steps);
        return 0;
    }
    /* Whatever ended the wait, rank 0 must not wait for this rank at its next collective. */
    comm_abort(tp_proc_comm(w->tp));
    if (g_stop) {
        log_info("stopped by a signal after %" PRIu64 " steps", steps);
        return 0;
    }
    if (rc == PAGODA_ECLOSED && !tp_proc_leader_alive(w->tp))
        return pagoda_error_set(PAGODA_ECLOSED, "rank 0 exited (after %" PRIu64 " steps)", steps);
    if (rc == PAGODA_ECLOSED && getppid() != w->parent)
        return pagoda_error_set(PAGODA_ECLOSED, "the parent exited (after %" PRIu64 " steps)",
                                steps);
    return rc;
}

int main(int argc, char **argv)
{
    static struct worker w; /* large and process-wide; zeroed */
    log_set_name("worker");
    /* A hang-up (SIGHUP: a closed terminal, or an operator's "reload") would kill it by default;
     * the group's programs stop on SIGTERM and SIGINT only (the router's SIGHUP reloads). */
    signal(SIGHUP, SIG_IGN);
    int status = worker_args_parse(argc, argv, &w.o);
    if (status != 0)
        return status == WORKER_ARGS_HELP ? 0 : status;
    enum log_level level;
    log_level_parse(w.o.log_level, &level); /* checked by worker_args_parse */
    log_set_level(level);
    snprintf(w.name, sizeof(w.name), "worker-%u", w.o.worker_id);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_early_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    w.parent = getppid();
    int rc = worker_load(&w);
    if (rc == 0) {
        if ((rc = wire_control_ready(w.o.run_dir, w.name)) != 0)
            log_rc(LOG_DEBUG, "no supervisor told of readiness", rc);
        rc = w.tp != NULL && w.o.tp_rank > 0 ? follow(&w) : worker_serve(&w);
    }
    if (rc != 0) {
        if (g_stop && rc == PAGODA_ECLOSED) {
            log_info("stopped by a signal during start");
            rc = 0;
        } else {
            log_rc(LOG_ERROR, "worker", rc);
        }
    }
    worker_fini(&w);
    nng_fini();
    if (rc != 0 && w.cannot_run) {
        log_error("worker %u cannot run as configured: exiting with status %d so that the "
                  "supervisor does not restart it",
                  w.o.worker_id, PAGODA_EXIT_CANNOT_RUN);
        return PAGODA_EXIT_CANNOT_RUN;
    }
    return rc == 0 ? 0 : 1;
}
