/* pagoda-kvpool: the process that owns one machine's CPU KV pool, or one GPU's.
 *
 *   pagoda-kvpool --run-dir DIR --model MODEL_DIR [--block-size 16]
 *                 [--kv-blocks N | --kv-bytes B] [--backend cpu|cuda] [--device 0]
 *                 [--reserve-bytes B] [--max-batched-tokens N] [--max-seqs N]
 *                 [--log-level info] [--listen URL] [--tp-rank R --tp-size N]
 *                 [--kv-cache-dtype auto|fp8]
 *
 * It reads MODEL_DIR/config.json for the pool's shape (layers, KV heads, head dim), creates the
 * pool, answers every KvpoolRequest on --listen (default ipc://DIR/kvpool.ipc; a tcp:// address
 * only moves this control link: the pool is shared memory or GPU descriptors of this host, so
 * its workers run here whatever the address) with the pool's geometry, and pushes
 * Control{ready, "kvpool"} to the supervisor. The pool outlives every worker that maps it: a
 * restarted worker finds the KV it left. On SIGTERM or SIGINT it stops serving, releases the
 * pool (the memory goes away with the last mapping) and exits 0.
 *
 * --tp-rank R --tp-size N: the pool of rank R of a tensor-parallel group of N worker processes
 * (docs/tensor-parallel.md): num_kv_heads / N KV heads (a size the model cannot be split by is
 * refused, naming the field), the block count of --kv-blocks as every rank's (so that one block
 * table, the scheduler's, serves every rank's pool; --kv-bytes gives every rank the same count
 * too), and for R > 0 names of its own beside rank 0's in DIR: the default --listen
 * ipc://DIR/kvpool-rR.ipc, the shared memory name's suffix "-rR", the descriptor socket
 * kvpool-fds-rR.ipc. Rank 0 keeps the usual names (the scheduler asks it for the geometry). A GPU
 * pool sized by default counts the rank's shard of the weights and activations.
 *
 * --backend cpu (the default): f32, in POSIX shared memory (kvpool/shm_pool.h) under a name
 * derived from DIR (the geometry's shm_name), 256 MiB unless --kv-blocks or --kv-bytes say.
 *
 * --kv-cache-dtype fp8 (or fp8_e4m3; --backend cuda only): the pool's elements are F8E4M3 codes,
 * one byte each (common/dtype.h; each bf16 K or V value stored as its nearest code, scale 1, as
 * vLLM's --kv-cache-dtype fp8 without scales): twice the tokens in the same bytes, and half the
 * K/V bytes a decode step reads. auto (the default) keeps the backend's own element.
 *
 * --backend cuda: bf16 (or fp8), on GPU --device, allocated with the CUDA VMM API and handed to
 * workers as file descriptors on the Unix socket DIR/kvpool-fds.ipc (kvpool/cuda_pool.h; the
 * geometry carries device and handle_socket, no shm_name). The pool is sized here, because this
 * process sees the GPU's free memory just before it allocates: without --kv-blocks or --kv-bytes it
 * takes what the GPU has free (measured once this process's CUDA context exists) minus the
 * model's weights as the CUDA backend stores them (bf16, model/model_budget.h) minus a reserve
 * for the worker: its activations at its step limits (--max-batched-tokens, --max-seqs: give the
 * worker's; the worker's defaults when absent), MODEL_BUDGET_RESERVE_BYTES
 * (cuBLAS workspaces, attention plan, sampler) and MODEL_BUDGET_CONTEXT_BYTES (the worker's own
 * CUDA context). --reserve-bytes replaces that reserve (for workers started with larger
 * limits, or several workers on one GPU). An explicit size that leaves the worker too little is
 * allowed but warned about: the worker is the one that refuses, saying by how much.
 *
 * The name is "/pagoda-" and 16 hex digits of the 64-bit FNV-1a hash of DIR's absolute path,
 * so each run directory has its own pool and a supervisor can find it again. A kvpool still
 * serving DIR is found first (its socket is in use) and this one refuses to start. A pool left
 * under the name by a kvpool that was killed is re-adopted when it is a ready pool of the same
 * geometry: its identity (pool_id, drawn at creation and kept in the segment's header) and its
 * KV stay, so the worker that maps it and the scheduler's block table stay right and nothing is
 * recomputed, and the machine holds one pool, not two. Anything else under the name is unlinked
 * and a new pool (a new identity) is created; a worker still mapping the old one keeps it until
 * it exits, and the scheduler, seeing the new identity in the next worker's Hello, drops its
 * prefix cache and recomputes (scheduler/scheduler.h).
 *
 * A GPU pool has no name to be found by: it lives while any process holds a descriptor of it.
 * Started by pagoda-supervisor, kvpool gets a keeper link (wire.h's WIRE_KVPOOL_KEEPER_ENV,
 * deploy/keeper.h) and deposits the pool's descriptors there once the pool is made; a kvpool
 * restarted after a kill is offered them and re-adopts the pool (kv_cuda_pool_adopt: the same
 * geometry on the same device; its identity and its KV stay, nothing is zeroed), as above. A
 * pool sized by default keeps the offered block count (the GPU's free memory, measured now,
 * counts the old pool as used). An offer that does not fit is logged, the supervisor is told to
 * let go of it, and a new pool is made; without a keeper link (a kvpool started by hand) a
 * restarted kvpool always makes a new pool.
 *
 * Serving: the pool's state never changes after start, so both possible answers (the geometry,
 * and the error for a malformed request) are packed once; NNG aio callbacks on a few REP
 * contexts copy one of them into the reply, which never blocks. The main thread waits for
 * signals and logs the counters the callbacks keep. A peer that drops during NNG's handshake
 * leaves the listener serving (nanomsg/nng#1518 is patched in the NNG pagoda links: see
 * scripts/nng.patch), and another kvpool serving DIR makes nng_listen fail with
 * NNG_EADDRINUSE. */
#include "common/error.h"
#include "common/exit_status.h"
#include "common/fd_pass.h"
#include "common/log.h"
#include "common/parse.h"
#include "kvpool/geometry.h"
#include "kvpool/kvpool_proto.h"
#include "kvpool/shm_pool.h"
#include "model/model_budget.h"
#include "model/model_config.h"
#include "model/model_shard.h"
#include "wire/address.h"
#include "wire/wire.h"
#ifdef PAGODA_HAVE_CUDA
#include "kvpool/cuda_pool.h"
#endif

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define KVPOOL_DEFAULT_KV_BYTES (UINT64_C(256) << 20)
#define KVPOOL_MAX_KV_BYTES (UINT64_C(1) << 50)
/* A KvpoolRequest is a few bytes; anything larger is refused by the socket. */
#define KVPOOL_MAX_REQUEST_BYTES 4096
/* REP contexts served at once: workers and the scheduler ask once each at start. */
#define KVPOOL_CONTEXTS 4
/* A reply that cannot leave within this long (a peer that stopped reading) is dropped. */
#define KVPOOL_SEND_TIMEOUT_MS 1000
/* How often the main thread wakes to log new malformed requests. */
#define KVPOOL_TICK_S 2
/* The Unix socket in DIR that hands out a GPU pool's descriptors. */
#define KVPOOL_FDS_SOCKET "kvpool-fds.ipc"
#define KVPOOL_MAX_DEVICE 1023

struct opts {
    const char *run_dir;
    const char *listen; /* NULL: ipc://DIR/kvpool.ipc */
    const char *model;
    const char *log_level;
    int32_t block_size;
    int64_t kv_blocks; /* 0: from kv_bytes */
    uint64_t kv_bytes;
    int kv_bytes_set;
    const char *backend; /* "cpu" or "cuda" */
    int device;
    uint64_t reserve_bytes;       /* 0: computed (see the file comment) */
    int64_t max_tokens, max_seqs; /* the worker's step limits, for that reserve */
    int tp_rank, tp_size;         /* the rank's pool of a tensor-parallel group; size 1: none */
    int kv_fp8;                   /* --kv-cache-dtype fp8: an F8E4M3 pool */
};

struct server;

/* One REP context and its aio: receive, then send the reply, then receive again. */
struct slot {
    struct server *srv;
    nng_ctx ctx;
    nng_aio *aio;
    int sending; /* touched only by this slot's callback, which NNG runs one at a time */
};

struct server {
    nng_socket sock;
    nng_listener listener;
    char url[512];
    struct slot slots[KVPOOL_CONTEXTS];
    int num_slots;
    uint8_t *geometry_reply, *error_reply; /* packed KvpoolResponses */
    size_t geometry_reply_len, error_reply_len;
    atomic_uint_fast64_t requests, malformed;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pagoda-kvpool --run-dir DIR --model MODEL_DIR [--block-size 16]\n"
            "                     [--kv-blocks N | --kv-bytes B] [--backend cpu|cuda]\n"
            "                     [--device 0] [--reserve-bytes B] [--max-batched-tokens N]\n"
            "                     [--max-seqs N] [--listen URL] [--tp-rank R --tp-size N]\n"
            "                     [--kv-cache-dtype auto|fp8] [--log-level debug|info|warn|error]\n"
            "Creates the KV pool for the model and serves its geometry on --listen\n"
            "(ipc://DIR/kvpool.ipc by default; tcp://HOST:PORT too, though the pool itself\n"
            "is shared on this host only) until SIGTERM, which removes the pool.\n"
            "--backend cpu: f32 in shared memory, 256 MiB unless --kv-blocks/--kv-bytes.\n"
            "--backend cuda: bf16 on GPU --device (CUDA VMM, descriptors on\n"
            "DIR/" KVPOOL_FDS_SOCKET "); by default the GPU's free memory minus the model's\n"
            "weights and a reserve for the worker (--reserve-bytes; default: activations at\n"
            "the worker's step limits, --max-batched-tokens (2048) and --max-seqs (256),\n"
            "512 MiB of workspaces and 1 GiB for its context).\n"
            "--kv-cache-dtype fp8 (--backend cuda): F8E4M3 elements, one byte (twice the\n"
            "tokens); auto (the default): the backend's own, f32 or bf16.\n"
            "--tp-rank R --tp-size N: rank R's pool of a tensor-parallel group (the shard's\n"
            "KV heads; for R > 0 its own names: DIR/kvpool-rR.ipc, ...).\n");
}

static int fail_msg(int rc)
{
    char msg[700];
    log_error("%s", pagoda_error_message(rc, msg, sizeof(msg)));
    return 1;
}

/* ---- the pool ---------------------------------------------------------------------------- */

static uint64_t fnv1a64(const char *s)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (; *s != '\0'; s++) {
        h ^= (uint8_t)*s;
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

static uint64_t random_pool_id(void)
{
    uint64_t id = 0;
    if (getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id)) {
        /* getrandom only fails this early in boot; a pool id needs uniqueness, not secrecy. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id = fnv1a64("pool") ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)ts.tv_nsec ^
             ((uint64_t)getpid() << 16);
    }
    return id != 0 ? id : 1;
}

/* The pool's geometry: the model's shape, and the block count asked for or what fits. */
static int pool_geometry(const struct opts *o, const struct model_config *c, enum dtype dtype,
                         struct kv_geometry *g)
{
    *g = (struct kv_geometry){
        .pool_id = random_pool_id(),
        .num_layers = (int32_t)c->num_layers,
        .num_blocks = 2,
        .block_size = o->block_size,
        .num_kv_heads = (int32_t)c->num_kv_heads,
        .head_dim = (int32_t)c->head_dim,
        .dtype = dtype,
    };
    if (c->num_layers > INT32_MAX || c->num_kv_heads > INT32_MAX || c->head_dim > INT32_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "the model is too large for a KV pool");
    if (o->tp_size > 1) {
        /* The shard's KV heads (model_shard_make refuses a size the model cannot be split by). */
        struct model_shard shard;
        int rc = model_shard_make(c, o->tp_rank, o->tp_size, &shard);
        if (rc != 0)
            return rc;
        g->num_kv_heads = (int32_t)shard.num_kv_heads;
    }
    int rc = kv_geometry_validate(g);
    if (rc != 0)
        return rc;
    uint64_t block_bytes = kv_pool_bytes(g) / 2;
    int64_t blocks = o->kv_blocks;
    if (blocks == 0) {
        uint64_t fit = o->kv_bytes / block_bytes;
        if (fit < 2)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "--kv-bytes %" PRIu64 " holds %" PRIu64 " blocks of %" PRIu64
                                    " bytes; at least 2 are needed",
                                    o->kv_bytes, fit, block_bytes);
        blocks = fit > INT32_MAX ? INT32_MAX : (int64_t)fit;
    }
    g->num_blocks = (int32_t)blocks;
    return kv_geometry_validate(g);
}

static double mib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

/* The socket pagoda-supervisor gives a kvpool (wire.h's WIRE_KVPOOL_KEEPER_ENV): a GPU
 * pool's descriptors are deposited there and offered back to the next kvpool. -1 when there is
 * none, or for a CPU pool (re-adopted by its shared memory's name: nothing to keep). */
static int keeper_link(int gpu)
{
    const char *value = getenv(WIRE_KVPOOL_KEEPER_ENV);
    if (value == NULL)
        return -1;
    char text[32];
    snprintf(text, sizeof(text), "%s", value);
    unsetenv(WIRE_KVPOOL_KEEPER_ENV);
    int64_t fd = -1;
    struct stat st;
    if (parse_i64(WIRE_KVPOOL_KEEPER_ENV, text, 3, INT_MAX, &fd) != 0 || fstat((int)fd, &st) != 0 ||
        !S_ISSOCK(st.st_mode)) {
        log_warn("%s=%s is not a socket of this process: ignored", WIRE_KVPOOL_KEEPER_ENV, text);
        return -1;
    }
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    if (!gpu) {
        close((int)fd);
        return -1;
    }
    return (int)fd;
}

#ifdef PAGODA_HAVE_CUDA
/* Takes what the supervisor's keeper offers and adopts it (see the file comment): *out is the
 * adopted pool, or NULL (nothing offered, or an offer that does not fit: the keeper is then told
 * to let go of it, and a new pool is made, sized as if nothing had been offered). */
static void adopt_kept_pool(int keeper, const struct opts *o, const struct model_config *c,
                            enum dtype dtype, struct kv_cuda_pool **out)
{
    *out = NULL;
    struct kv_cuda_offer *offer = NULL;
    char msg[700];
    int rc = kv_cuda_offer_take(keeper, &offer);
    if (rc == 0 && offer == NULL)
        return;
    if (rc == 0) {
        const struct kv_geometry *og = kv_cuda_offer_geometry(offer);
        log_info("the supervisor offers pool %016" PRIx64 " (%d blocks), left by the kvpool "
                 "before this one",
                 og->pool_id, og->num_blocks);
        /* A pool sized by default keeps its block count: the GPU's free memory, measured now,
         * counts the pool as used, and the scheduler's block table has that count. */
        struct opts sized = *o;
        if (sized.kv_blocks == 0 && !sized.kv_bytes_set)
            sized.kv_blocks = og->num_blocks;
        struct kv_geometry want;
        struct kv_cuda_pool_options co = {.device = o->device};
        if ((rc = pool_geometry(&sized, c, dtype, &want)) == 0)
            rc = kv_cuda_pool_adopt(offer, &want, &co, out);
        if (rc == 0)
            log_warn("kv pool %016" PRIx64 " on GPU %d, left by the kvpool before this one: "
                     "re-adopting it, with its identity and its KV",
                     og->pool_id, o->device);
    }
    kv_cuda_offer_free(offer);
    if (rc == 0)
        return;
    log_warn("cannot re-adopt the pool the supervisor kept (%s): it is told to let go of it, and "
             "a new pool is made",
             pagoda_error_message(rc, msg, sizeof(msg)));
    /* A message without descriptors: the keeper lets go of what it holds (deploy/keeper.h). */
    if ((rc = fd_pass_send(keeper, "refused", 7, NULL, 0, MSG_DONTWAIT,
                           "the refusal to the keeper")) != 0)
        log_warn("%s", pagoda_error_message(rc, msg, sizeof(msg)));
}
#endif

/* What the GPU has free before the pool, and what the worker will need beside it. */
struct gpu_budget {
    uint64_t free_bytes, total_bytes;
    uint64_t weight_bytes;  /* the model's, as the CUDA backend stores them */
    uint64_t reserve_bytes; /* the worker's activations, workspaces and context */
};

#ifdef PAGODA_HAVE_CUDA
/* --backend cuda: measures the GPU and, without --kv-blocks or --kv-bytes, sets o->kv_bytes to
 * what is free minus the weights minus the reserve (see the file comment). */
static int gpu_size(struct opts *o, const struct model_config *c, struct gpu_budget *b)
{
    int rc = kv_cuda_mem_info(o->device, &b->free_bytes, &b->total_bytes);
    if (rc != 0)
        return rc;
    b->weight_bytes = model_budget_weight_bytes(c);
    b->reserve_bytes = o->reserve_bytes != 0
                           ? o->reserve_bytes
                           : model_budget_activation_bytes(c, o->max_tokens, o->max_seqs) +
                                 model_budget_graph_bytes(o->max_tokens, o->max_seqs) +
                                 MODEL_BUDGET_RESERVE_BYTES + MODEL_BUDGET_CONTEXT_BYTES;
    if (o->tp_size > 1) {
        /* A rank's shard (NCCL's buffers counted; a rank captures no CUDA graphs). */
        struct model_shard shard;
        if ((rc = model_shard_make(c, o->tp_rank, o->tp_size, &shard)) != 0)
            return rc;
        b->weight_bytes = model_budget_shard_weight_bytes(c, &shard);
        if (o->reserve_bytes == 0)
            b->reserve_bytes = model_budget_shard_activation_bytes(
                                   c, &shard, MODEL_BUDGET_COMM_NCCL, o->max_tokens, o->max_seqs) +
                               MODEL_BUDGET_RESERVE_BYTES + MODEL_BUDGET_CONTEXT_BYTES;
    }
    log_info("GPU %d: %.0f MiB free of %.0f MiB; the model's weights take %.0f MiB, the "
             "worker's reserve %.0f MiB",
             o->device, mib(b->free_bytes), mib(b->total_bytes), mib(b->weight_bytes),
             mib(b->reserve_bytes));
    if (o->kv_blocks != 0 || o->kv_bytes_set)
        return 0;
    uint64_t beside = b->weight_bytes + b->reserve_bytes;
    if (beside >= b->free_bytes)
        return pagoda_error_set(PAGODA_EEXHAUSTED,
                                "GPU %d has %.0f MiB free; the model's weights (%.0f MiB) and the "
                                "worker's reserve (%.0f MiB) leave nothing for a KV pool: short "
                                "by %.0f MiB",
                                o->device, mib(b->free_bytes), mib(b->weight_bytes),
                                mib(b->reserve_bytes), mib(beside - b->free_bytes));
    o->kv_bytes = b->free_bytes - beside;
    if (o->kv_bytes > KVPOOL_MAX_KV_BYTES)
        o->kv_bytes = KVPOOL_MAX_KV_BYTES;
    log_info("--kv-bytes by default: %.0f MiB free - %.0f MiB of weights - %.0f MiB of reserve "
             "= %.0f MiB",
             mib(b->free_bytes), mib(b->weight_bytes), mib(b->reserve_bytes), mib(o->kv_bytes));
    return 0;
}
#endif

/* Creates the pool, or re-adopts the one a kvpool that did not exit cleanly left under the
 * name (see the file comment): a ready pool whose geometry equals g but for the identity is
 * kept, and g->pool_id becomes its identity. Anything else there is unlinked first. */
static int pool_create(const char *name, struct kv_geometry *g, struct kv_shm_pool **out)
{
    int rc = kv_shm_pool_create(name, g, out);
    if (rc != PAGODA_EEXIST)
        return rc;
    struct kv_shm_pool *old = NULL;
    char why[600];
    rc = kv_shm_pool_open(name, NULL, &old);
    if (rc == 0) {
        const struct kv_geometry *og = kv_shm_pool_geometry(old);
        struct kv_geometry same = *g;
        same.pool_id = og->pool_id;
        if (og->pool_id != 0 && kv_geometry_equal(&same, og)) {
            log_warn("kv pool %s (pool id %016" PRIx64 ") was left by a kvpool that did not exit "
                     "cleanly: re-adopting it, with its identity and its KV",
                     name, og->pool_id);
            *g = same;
            *out = old;
            return 0;
        }
        snprintf(why, sizeof(why),
                 "its geometry differs (%d blocks of %d tokens, %d layers, %d KV heads, head dim "
                 "%d, %s)",
                 og->num_blocks, og->block_size, og->num_layers, og->num_kv_heads, og->head_dim,
                 dtype_name(og->dtype));
        kv_shm_pool_close(old);
    } else {
        pagoda_error_message(rc, why, sizeof(why));
    }
    log_warn("kv pool %s exists (left by a kvpool that did not exit cleanly) but cannot be "
             "re-adopted: %s; removing it and creating a new pool",
             name, why);
    if ((rc = kv_shm_pool_unlink(name)) != 0 && rc != PAGODA_ENOENT)
        return rc;
    return kv_shm_pool_create(name, g, out);
}

/* ---- serving ----------------------------------------------------------------------------- */

/* Waits for the next request on the slot's context, for as long as it takes. */
static void slot_recv(struct slot *s)
{
    nng_aio_set_timeout(s->aio, NNG_DURATION_INFINITE);
    nng_ctx_recv(s->ctx, s->aio);
}

/* NNG thread. A receive hands the request over; the reply reuses its message (a REP context
 * remembers whom to answer). Never blocks: the replies are packed already. */
static void on_slot(void *arg)
{
    struct slot *s = arg;
    struct server *srv = s->srv;
    int rv = nng_aio_result(s->aio);
    if (s->sending) {
        s->sending = 0;
        if (rv != 0)
            nng_msg_free(nng_aio_get_msg(s->aio)); /* not sent: still ours */
        if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
            return;
        slot_recv(s);
        return;
    }
    if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
        return;
    if (rv != 0) {
        slot_recv(s);
        return;
    }
    nng_msg *m = nng_aio_get_msg(s->aio);
    const uint8_t *reply = srv->geometry_reply;
    size_t len = srv->geometry_reply_len;
    atomic_fetch_add(&srv->requests, 1);
    if (kvpool_request_check(nng_msg_body(m), nng_msg_len(m)) != 0) {
        atomic_fetch_add(&srv->malformed, 1);
        reply = srv->error_reply;
        len = srv->error_reply_len;
    }
    nng_msg_clear(m);
    if (nng_msg_append(m, reply, len) != 0) {
        nng_msg_free(m); /* out of memory: the requester's REQ asks again */
        slot_recv(s);
        return;
    }
    nng_aio_set_msg(s->aio, m);
    nng_aio_set_timeout(s->aio, KVPOOL_SEND_TIMEOUT_MS);
    s->sending = 1;
    nng_ctx_send(s->ctx, s->aio);
}

/* Opens the REP socket and listens on listen (NULL: ipc://DIR/kvpool.ipc), unless a kvpool
 * already serves there. */
static int server_listen(struct server *srv, const char *run_dir, const char *listen)
{
    int rc = 0;
    if (listen != NULL)
        snprintf(srv->url, sizeof(srv->url), "%s", listen); /* checked: WIRE_ADDRESS_MAX */
    else
        rc = wire_ipc_url(srv->url, sizeof(srv->url), run_dir, "kvpool.ipc");
    if (rc != 0)
        return rc;
    int rv = nng_rep0_open(&srv->sock);
    if (rv != 0)
        return wire_error(rv, "nng_rep0_open");
    if ((rv = nng_socket_set_size(srv->sock, NNG_OPT_RECVMAXSZ, KVPOOL_MAX_REQUEST_BYTES)) != 0) {
        nng_close(srv->sock);
        return wire_error(rv, "NNG_OPT_RECVMAXSZ");
    }
    if ((rv = nng_listen(srv->sock, srv->url, &srv->listener, 0)) != 0) {
        nng_close(srv->sock);
        if (rv == NNG_EADDRINUSE)
            return pagoda_error_set(PAGODA_EEXIST, "%s is in use by another process", srv->url);
        return wire_error(rv, srv->url);
    }
    return 0;
}

/* Starts the contexts receiving. On failure the started ones keep running until
 * server_close. */
static int server_start(struct server *srv)
{
    for (int i = 0; i < KVPOOL_CONTEXTS; i++) {
        struct slot *s = &srv->slots[i];
        s->srv = srv;
        int rv = nng_aio_alloc(&s->aio, on_slot, s);
        if (rv != 0)
            return wire_error(rv, "nng_aio_alloc");
        if ((rv = nng_ctx_open(&s->ctx, srv->sock)) != 0) {
            nng_aio_free(s->aio);
            return wire_error(rv, "nng_ctx_open");
        }
        srv->num_slots++;
        slot_recv(s);
    }
    return 0;
}

/* Stops the aios (waiting for running callbacks), then closes the socket, then frees. */
static void server_close(struct server *srv)
{
    for (int i = 0; i < srv->num_slots; i++)
        nng_aio_stop(srv->slots[i].aio);
    for (int i = 0; i < srv->num_slots; i++) {
        struct slot *s = &srv->slots[i];
        if (s->sending) /* stopped before the send took the message */
            nng_msg_free(nng_aio_get_msg(s->aio));
        nng_ctx_close(s->ctx);
    }
    nng_close(srv->sock);
    for (int i = 0; i < srv->num_slots; i++)
        nng_aio_free(srv->slots[i].aio);
    srv->num_slots = 0;
}

/* ---- main -------------------------------------------------------------------------------- */

enum {
    OPT_RUN_DIR = 256,
    OPT_MODEL,
    OPT_BLOCK_SIZE,
    OPT_KV_BLOCKS,
    OPT_KV_BYTES,
    OPT_LOG_LEVEL,
    OPT_BACKEND,
    OPT_DEVICE,
    OPT_RESERVE_BYTES,
    OPT_MAX_TOKENS,
    OPT_MAX_SEQS,
    OPT_LISTEN,
    OPT_TP_RANK,
    OPT_TP_SIZE,
    OPT_KV_CACHE_DTYPE,
};

/* Returns 0, 2 for a usage error (after printing it), or 3 for --help. */
static int parse_args(int argc, char **argv, struct opts *o)
{
    static const struct option longopts[] = {
        {"run-dir", required_argument, NULL, OPT_RUN_DIR},
        {"model", required_argument, NULL, OPT_MODEL},
        {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
        {"kv-blocks", required_argument, NULL, OPT_KV_BLOCKS},
        {"kv-bytes", required_argument, NULL, OPT_KV_BYTES},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"device", required_argument, NULL, OPT_DEVICE},
        {"reserve-bytes", required_argument, NULL, OPT_RESERVE_BYTES},
        {"max-batched-tokens", required_argument, NULL, OPT_MAX_TOKENS},
        {"max-seqs", required_argument, NULL, OPT_MAX_SEQS},
        {"listen", required_argument, NULL, OPT_LISTEN},
        {"tp-rank", required_argument, NULL, OPT_TP_RANK},
        {"tp-size", required_argument, NULL, OPT_TP_SIZE},
        {"kv-cache-dtype", required_argument, NULL, OPT_KV_CACHE_DTYPE},
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
        case OPT_BLOCK_SIZE:
            if ((rc = parse_i64("--block-size", optarg, KV_BLOCK_SIZE_MIN, KV_BLOCK_SIZE_MAX,
                                &v)) == 0)
                o->block_size = (int32_t)v;
            break;
        case OPT_KV_BLOCKS:
            if ((rc = parse_i64("--kv-blocks", optarg, 2, INT32_MAX, &v)) == 0)
                o->kv_blocks = v;
            break;
        case OPT_KV_BYTES:
            if ((rc = parse_i64("--kv-bytes", optarg, 1, (int64_t)KVPOOL_MAX_KV_BYTES, &v)) == 0) {
                o->kv_bytes = (uint64_t)v;
                o->kv_bytes_set = 1;
            }
            break;
        case OPT_LOG_LEVEL:
            o->log_level = optarg;
            break;
        case OPT_BACKEND:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "cuda") != 0)
                rc = pagoda_error_set(PAGODA_EINVAL, "--backend %s: expected cpu or cuda", optarg);
#ifndef PAGODA_HAVE_CUDA
            else if (strcmp(optarg, "cuda") == 0)
                rc = pagoda_error_set(PAGODA_EUNSUPPORTED,
                                      "--backend cuda: this build has no CUDA (configure with "
                                      "-DPAGODA_CUDA=ON)");
#endif
            o->backend = optarg;
            break;
        case OPT_DEVICE:
            if ((rc = parse_i64("--device", optarg, 0, KVPOOL_MAX_DEVICE, &v)) == 0)
                o->device = (int)v;
            break;
        case OPT_RESERVE_BYTES:
            if ((rc = parse_i64("--reserve-bytes", optarg, 1, (int64_t)KVPOOL_MAX_KV_BYTES, &v)) ==
                0)
                o->reserve_bytes = (uint64_t)v;
            break;
        case OPT_MAX_TOKENS:
            if ((rc = parse_i64("--max-batched-tokens", optarg, 1, 1 << 20, &v)) == 0)
                o->max_tokens = v;
            break;
        case OPT_MAX_SEQS:
            if ((rc = parse_i64("--max-seqs", optarg, 1, 65536, &v)) == 0)
                o->max_seqs = v;
            break;
        case OPT_LISTEN:
            if ((rc = wire_address_check("--listen", optarg, WIRE_ADDRESS_ANY)) == 0)
                o->listen = optarg;
            break;
        case OPT_TP_RANK:
            if ((rc = parse_i64("--tp-rank", optarg, 0, MODEL_SHARD_MAX_SIZE - 1, &v)) == 0)
                o->tp_rank = (int)v;
            break;
        case OPT_TP_SIZE:
            if ((rc = parse_i64("--tp-size", optarg, 1, MODEL_SHARD_MAX_SIZE, &v)) == 0)
                o->tp_size = (int)v;
            break;
        case OPT_KV_CACHE_DTYPE: {
            enum dtype t;
            if ((rc = dtype_from_kv_cache_name("--kv-cache-dtype", optarg, DTYPE_BF16, &t)) == 0)
                o->kv_fp8 = t == DTYPE_F8E4M3;
            break;
        }
        case 'h':
            usage(stdout);
            return 3;
        default:
            usage(stderr);
            return 2;
        }
        if (rc != 0) {
            char msg[700];
            fprintf(stderr, "pagoda-kvpool: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
            return 2;
        }
    }
    if (optind != argc || o->run_dir == NULL || o->model == NULL) {
        usage(stderr);
        return 2;
    }
    if (o->tp_rank >= o->tp_size) {
        fprintf(stderr,
                "pagoda-kvpool: --tp-rank %d needs --tp-size above it (the ranks of a "
                "group of N are 0 to N - 1)\n",
                o->tp_rank);
        return 2;
    }
    if (o->kv_fp8 && strcmp(o->backend, "cuda") != 0) {
        fprintf(stderr, "pagoda-kvpool: --kv-cache-dtype fp8 needs --backend cuda (the CPU "
                        "backend's kernels read f32)\n");
        return 2;
    }
    if (o->kv_blocks != 0 && o->kv_bytes_set) {
        fprintf(stderr, "pagoda-kvpool: --kv-blocks and --kv-bytes exclude each other\n");
        return 2;
    }
    enum log_level level;
    if (log_level_parse(o->log_level, &level) != 0) {
        fprintf(stderr, "pagoda-kvpool: --log-level '%s' is not debug, info, warn or error\n",
                o->log_level);
        return 2;
    }
    log_set_level(level);
    return 0;
}

int main(int argc, char **argv)
{
    struct opts o = {
        .log_level = "info",
        .block_size = KV_BLOCK_SIZE_DEFAULT,
        .kv_bytes = KVPOOL_DEFAULT_KV_BYTES,
        .backend = "cpu",
        .max_tokens = MODEL_BUDGET_DEFAULT_MAX_TOKENS,
        .max_seqs = MODEL_BUDGET_DEFAULT_MAX_SEQS,
        .tp_size = 1,
    };
    log_set_name("kvpool");
    /* A hang-up (SIGHUP: a closed terminal, or an operator's "reload") would kill it by default;
     * the group's programs stop on SIGTERM and SIGINT only (the router's SIGHUP reloads). */
    signal(SIGHUP, SIG_IGN);
    int status = parse_args(argc, argv, &o);
    if (status != 0)
        return status == 3 ? 0 : status;
    const int gpu = strcmp(o.backend, "cuda") == 0;

    /* Signals are taken by sigwait only; NNG's threads inherit the mask. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    struct server srv = {0};
    struct kv_shm_pool *pool = NULL;
#ifdef PAGODA_HAVE_CUDA
    struct kv_cuda_pool *gpu_pool = NULL;
    struct kv_cuda_server *fds_server = NULL;
#endif
#ifdef PAGODA_HAVE_CUDA
    struct gpu_budget budget = {0};
#endif
    int keeper = -1;
    int listening = 0, rc;
    struct wire_heartbeat *heartbeat = NULL;
    char run_dir[PATH_MAX], shm_name[KV_SHM_NAME_MAX + 1], fds_path[PATH_MAX + 32];
    char where[PATH_MAX + 160];
    struct model_config cfg;
    struct kv_geometry g;
    status = 1;
    if (realpath(o.run_dir, run_dir) == NULL) {
        rc = pagoda_error_set(pagoda_from_errno(errno), "--run-dir %s: %s", o.run_dir,
                              strerror(errno));
        goto fail;
    }
    if ((rc = model_config_load(o.model, &cfg)) != 0) {
        /* The model folder's files (config.json, generation_config.json) are the operator's to
         * fix: a served group tries again without stopping (common/exit_status.h). */
        if (rc != PAGODA_ENOMEM)
            status = PAGODA_EXIT_CANNOT_RUN;
        goto fail;
    }
    keeper = keeper_link(gpu);
    const enum dtype dtype = !gpu ? DTYPE_F32 : o.kv_fp8 ? DTYPE_F8E4M3 : DTYPE_BF16;
    int adopted = 0;
#ifdef PAGODA_HAVE_CUDA
    if (keeper >= 0)
        adopt_kept_pool(keeper, &o, &cfg, dtype, &gpu_pool);
    if ((adopted = gpu_pool != NULL))
        g = *kv_cuda_pool_geometry(gpu_pool);
    else if (gpu && (rc = gpu_size(&o, &cfg, &budget)) != 0)
        goto fail;
#endif
    if (!adopted && (rc = pool_geometry(&o, &cfg, dtype, &g)) != 0)
        goto fail;
    snprintf(shm_name, sizeof(shm_name), "/pagoda-%016" PRIx64, fnv1a64(run_dir));
    snprintf(fds_path, sizeof(fds_path), "%s/%s", run_dir, KVPOOL_FDS_SOCKET);
    char rank_listen[512]; /* as server.url */
    const char *listen = o.listen;
    if (o.tp_rank > 0) {
        /* Rank R's names beside rank 0's (see the file comment). */
        snprintf(shm_name, sizeof(shm_name), "/pagoda-%016" PRIx64 "-r%d", fnv1a64(run_dir),
                 o.tp_rank);
        snprintf(fds_path, sizeof(fds_path), "%s/kvpool-fds-r%d.ipc", run_dir, o.tp_rank);
        char file[32];
        snprintf(file, sizeof(file), "kvpool-r%d.ipc", o.tp_rank);
        if (listen == NULL &&
            (rc = wire_ipc_url(rank_listen, sizeof(rank_listen), run_dir, file)) != 0)
            goto fail;
        if (listen == NULL)
            listen = rank_listen;
    }
    if ((rc = server_listen(&srv, run_dir, listen)) != 0)
        goto fail;
    listening = 1;
    if (!gpu) {
        if ((rc = pool_create(shm_name, &g, &pool)) != 0 ||
            (rc = kvpool_response_pack(&g, shm_name, -1, NULL, 0, NULL, &srv.geometry_reply,
                                       &srv.geometry_reply_len)) != 0 ||
            (rc = kvpool_response_pack(&g, shm_name, -1, NULL, PAGODA_EFORMAT,
                                       "malformed KvpoolRequest", &srv.error_reply,
                                       &srv.error_reply_len)) != 0)
            goto fail;
        snprintf(where, sizeof(where), "%s", shm_name);
    } else {
#ifdef PAGODA_HAVE_CUDA
        uint64_t need = kv_pool_bytes(&g) + budget.weight_bytes + budget.reserve_bytes;
        if (gpu_pool == NULL && need > budget.free_bytes)
            log_warn(
                "the KV pool (%.0f MiB) leaves %.0f MiB of GPU %d free; a worker needs about "
                "%.0f MiB beside it (weights %.0f MiB, reserve %.0f MiB) and will refuse to "
                "start: short by %.0f MiB",
                mib(kv_pool_bytes(&g)),
                budget.free_bytes > kv_pool_bytes(&g) ? mib(budget.free_bytes - kv_pool_bytes(&g))
                                                      : 0.0,
                o.device, mib(budget.weight_bytes + budget.reserve_bytes), mib(budget.weight_bytes),
                mib(budget.reserve_bytes), mib(need - budget.free_bytes));
        struct kv_cuda_pool_options co = {.device = o.device};
        if ((gpu_pool == NULL && (rc = kv_cuda_pool_create(&g, &co, &gpu_pool)) != 0) ||
            (rc = kv_cuda_server_open(gpu_pool, fds_path, &fds_server)) != 0 ||
            (rc = kvpool_response_pack(&g, NULL, o.device, fds_path, 0, NULL, &srv.geometry_reply,
                                       &srv.geometry_reply_len)) != 0 ||
            (rc = kvpool_response_pack(&g, NULL, o.device, fds_path, PAGODA_EFORMAT,
                                       "malformed KvpoolRequest", &srv.error_reply,
                                       &srv.error_reply_len)) != 0)
            goto fail;
        snprintf(where, sizeof(where),
                 "on GPU %d (%.0f MiB mapped in %d chunk(s), descriptors on %.*s)", o.device,
                 mib(kv_cuda_pool_mapped_bytes(gpu_pool)), kv_cuda_pool_num_chunks(gpu_pool),
                 PATH_MAX, fds_path);
        if (keeper >= 0 && (rc = kv_cuda_pool_deposit(gpu_pool, keeper)) != 0) {
            char msg[700];
            log_warn("the supervisor keeps no copy of the pool's descriptors (%s): a kill -9 of "
                     "this kvpool would leave the pool to the workers alone",
                     pagoda_error_message(rc, msg, sizeof(msg)));
        }
#endif
    }
    if (keeper >= 0) {
        close(keeper);
        keeper = -1;
    }
    if ((rc = server_start(&srv)) != 0)
        goto fail;

    log_info("kv pool %s: %d blocks of %d tokens (%d usable, %" PRId64 " tokens), %.1f MiB; "
             "%d layers, %d KV heads, head dim %d, %s, pool id %016" PRIx64 "%s",
             where, g.num_blocks, g.block_size, g.num_blocks - 1,
             (int64_t)(g.num_blocks - 1) * g.block_size, mib(kv_pool_bytes(&g)), g.num_layers,
             g.num_kv_heads, g.head_dim, dtype_name(g.dtype), g.pool_id,
             o.tp_size > 1 ? " (a tensor-parallel rank's shard)" : "");
    if (o.tp_size > 1)
        log_info("tensor-parallel rank %d of %d: %d of the model's %" PRId64 " KV heads", o.tp_rank,
                 o.tp_size, g.num_kv_heads, cfg.num_kv_heads);
    log_info("serving %s", srv.url);
    if ((rc = wire_control_ready(run_dir, "kvpool")) != 0) {
        char msg[700];
        log_debug("no supervisor told of readiness: %s",
                  pagoda_error_message(rc, msg, sizeof(msg)));
    }

    /* The supervisor's liveness check (wire.h): this loop wakes at least every heartbeat. */
    if ((rc = wire_heartbeat_open(run_dir, "kvpool", &heartbeat)) != 0) {
        char msg[700];
        log_warn("no heartbeat to the supervisor: %s", pagoda_error_message(rc, msg, sizeof(msg)));
    }
    uint64_t wake_ms = KVPOOL_TICK_S * 1000;
    if (heartbeat != NULL && wire_heartbeat_interval_ms(heartbeat) < wake_ms)
        wake_ms = wire_heartbeat_interval_ms(heartbeat);
    uint64_t malformed_logged = 0;
    for (;;) {
        wire_heartbeat_send(heartbeat);
        struct timespec tick = {.tv_sec = (time_t)(wake_ms / 1000),
                                .tv_nsec = (long)(wake_ms % 1000) * 1000000L};
        int sig = sigtimedwait(&stop_signals, NULL, &tick);
        uint64_t malformed = atomic_load(&srv.malformed);
        if (malformed != malformed_logged) {
            log_warn("%" PRIu64 " malformed requests answered with an error (%" PRIu64 " in all)",
                     malformed - malformed_logged, malformed);
            malformed_logged = malformed;
        }
        if (sig == SIGTERM || sig == SIGINT) {
            log_info("%s: stopping after %" PRIu64 " requests", strsignal(sig),
                     (uint64_t)atomic_load(&srv.requests));
            break;
        }
    }
    status = 0;
    goto out;
fail:
    fail_msg(rc);
out:
    wire_heartbeat_close(heartbeat);
    if (listening)
        server_close(&srv);
    if (pool != NULL) {
        kv_shm_pool_close(pool);
        if ((rc = kv_shm_pool_unlink(shm_name)) != 0) {
            fail_msg(rc);
            status = 1;
        } else {
            log_info("kv pool %s removed", shm_name);
        }
    }
#ifdef PAGODA_HAVE_CUDA
    if (fds_server != NULL)
        log_info("the pool's descriptors were handed out %" PRIu64 " time(s), refused %" PRIu64
                 " time(s)",
                 kv_cuda_server_handouts(fds_server), kv_cuda_server_refusals(fds_server));
    kv_cuda_server_close(fds_server);
    if (gpu_pool != NULL) {
        kv_cuda_pool_close(gpu_pool);
        log_info("kv pool on GPU %d released (its memory returns once no worker maps it and the "
                 "supervisor has let go of it)",
                 o.device);
    }
#endif
    if (keeper >= 0)
        close(keeper);
    free(srv.geometry_reply);
    free(srv.error_reply);
    nng_fini();
    return status;
}
