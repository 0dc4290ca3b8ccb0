/* decode_step: the CUDA backend's decode step on its own, timed on the GPU (issue 15).
 *
 *   decode_step MODEL_DIR [--batches 1,16,64] [--context N] [--reps N] [--profile]
 *               [--only VERSION | --versions V1,V2,...] [--layout contiguous|interleaved]
 *               [--pool-blocks N] [--split KEYS] [--pipelined] [--max-tokens N]
 *               [--max-seqs N] [--debug] [--context-spread S] [--kv-cache-dtype auto|fp8]
 *
 * MODEL_DIR holds a config.json (weights are drawn at random on the GPU, as --load-format
 * random). For each batch size B, B sequences of N tokens already in a pool of random K/V
 * (block size 16) decode one token each through backend_forward_sample (greedy), in each version
 * of the backend's options (struct version below: the kernel sequence before issue 15, every
 * linear through cuBLAS launch by launch, cuda_gemv for the linears it takes, CUDA graphs,
 * programmatic dependent launch, and "shipped": cuda_backend_default_options()), on the same
 * weights. Per batch and version: the median device time of a step (backend_device_time_us: CUDA
 * events around the forward pass and the sampler) and the median host time of the call, against
 * the step's bandwidth floor (weights + K/V read once at 4.3 TB/s, the device-to-device copy rate
 * of GPU.md). Each version's logits of the same step are compared with its reference version's
 * (the graphs' with cublas's, the same kernels launched one by one: equal bit for bit at a batch
 * that is a graph's size) (max |a - b| / max |a|) and their greedy tokens counted equal; "graph
 * steps" counts the passes that replayed a graph.
 * --profile wraps one extra step per batch and version in cudaProfilerStart/Stop, for
 * `ncu --profile-from-start off` (bench/run_decode_profile.sh; bench/profile_decode.py reads the
 * CSV); --only runs one version (for a profile of it), --versions the ones named and those they
 * are compared with (the versions: struct version below). --layout says how the sequences' blocks
 * lie in the pool: contiguous (the default: sequence s owns blocks 1 + s * bps ...) or
 * interleaved (block b of sequence s is 1 + b * B + s, as blocks come when every sequence of a
 * batch grows by one block in turn, as in a serving run); --pool-blocks makes the pool that many
 * blocks (at least what the batches need; the worker's pool on the H200 is ~50,000), the
 * sequences' blocks spread over it at a stride of pool / needed; --split forces the decode
 * attention's split-KV partition in every version (cuda_backend_options.decode_split; 0, the
 * default, leaves it to the plan's cost model). --pipelined times the steps as the worker's
 * executor runs them, two in flight (backend_submit into the slots in turn, backend_complete of
 * the one before: each step's device time then starts as the step ahead ends, not from an idle
 * device), and the host time is the wall time between two completions. Exit status 0, or 1 on a
 * failed call (the message names it). --max-tokens and --max-seqs set the backend's limits
 * (default 256 tokens a step, and 64 sequences or the largest batch; the worker's are 2048 and
 * 256). --debug logs at debug level: with --pipelined, the backend's line per step that splits
 * its device time into staging, the layers and the LM head, and sampling (as the worker's debug
 * log does). --context-spread S gives the sequences contexts from N down to N - S, evenly (the
 * floor counts each at its own). --kv-cache-dtype fp8 makes the pool F8E4M3 (the worker's
 * --kv-cache-dtype fp8; random K/V are cuda_fill_random_e4m3's), whose floor counts one byte a
 * K/V element. */
#define _POSIX_C_SOURCE 200809L
#include "bench/cuda_check.h"
#include "common/dtype.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_tma.h"
#include "kernels/cuda/util.h"
#include "model/model_config.h"
#include "worker/backend.h"
#include "worker/cuda_backend.h"

#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define kBlockSize 16
#define kMaxBatches 8
#define kMaxReps 200
#define kWarmup 3
#define kFloorBytesPerSecond 4.3e12
#define kSeed 20261202ull

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return v[n / 2];
}

/* One decode batch of B sequences at context N: sequence s owns blocks 1 + s * bps ... */
struct step {
    int32_t *tokens, *positions, *qs, *ctx, *tables, *logits_idx;
    int64_t *slots;
    struct sample_row *rows;
    struct fwd_batch batch;
};

/* --layout and --pool-blocks: the physical block of logical block b of sequence s. */
static int layout_interleaved;
static int64_t block_stride = 1; /* pool blocks between two used ones */

static int32_t block_at(int32_t s, int32_t b, int32_t B, int32_t bps)
{
    const int64_t i = layout_interleaved ? (int64_t)b * B + s : (int64_t)s * bps + b;
    return (int32_t)(1 + i * block_stride);
}

/* --context-spread: the sequences' contexts run evenly from N down to N - spread (as in a
 * serving run, where sequences that joined a few steps apart decode side by side). */
static int32_t context_spread;

static int32_t context_of(int32_t s, int32_t B, int32_t ctx)
{
    return B > 1 ? ctx - (int32_t)((int64_t)context_spread * s / (B - 1)) : ctx;
}

static void step_make(struct step *st, int32_t B, int32_t ctx, int32_t bps, int32_t vocab)
{
    st->tokens = calloc((size_t)B, 4);
    st->positions = calloc((size_t)B, 4);
    st->qs = calloc((size_t)B + 1, 4);
    st->ctx = calloc((size_t)B, 4);
    st->tables = calloc((size_t)B * bps, 4);
    st->logits_idx = calloc((size_t)B, 4);
    st->slots = calloc((size_t)B, 8);
    st->rows = calloc((size_t)B, sizeof(*st->rows));
    if (!st->tokens || !st->positions || !st->qs || !st->ctx || !st->tables || !st->logits_idx ||
        !st->slots || !st->rows) {
        fprintf(stderr, "decode_step: out of host memory\n");
        exit(1);
    }
    for (int32_t s = 0; s < B; s++) {
        const int32_t n = context_of(s, B, ctx);
        st->tokens[s] = (int32_t)((s * 7919 + 13) % vocab);
        st->positions[s] = n - 1;
        st->qs[s + 1] = s + 1;
        st->ctx[s] = n;
        for (int32_t b = 0; b < bps; b++)
            st->tables[(int64_t)s * bps + b] = block_at(s, b, B, bps);
        st->slots[s] = (int64_t)st->tables[(int64_t)s * bps + (n - 1) / kBlockSize] * kBlockSize +
                       (n - 1) % kBlockSize;
        st->logits_idx[s] = s;
        st->rows[s].params = sampling_params_default();
        st->rows[s].params.temperature = 0.0f;
    }
    struct fwd_batch fb = {
        B,   st->tokens, st->positions,  st->slots, B, st->qs, st->ctx, st->tables,
        bps, B,          st->logits_idx, NULL,      0};
    st->batch = fb;
}

static void step_free(struct step *st)
{
    free(st->tokens);
    free(st->positions);
    free(st->qs);
    free(st->ctx);
    free(st->tables);
    free(st->logits_idx);
    free(st->slots);
    free(st->rows);
}

struct result {
    double device_ms, host_ms;
    float *logits; /* [B][vocab], host */
    int32_t *tokens;
    float *logprobs;
    unsigned long long graph_steps, steps; /* backend_graph_steps, backend_forward_count */
};

/* The versions compared, each against its ref's logits and tokens: the kernels before issue 15;
 * the current ones with every linear through cuBLAS; the current ones with cuda_gemv for up to
 * CUDA_GEMV_MAX_ROWS rows (the linears it takes: worker/cuda_backend.h); CUDA graphs with cuBLAS;
 * the graphs with programmatic dependent launch (cuda_backend_options.pdl), with cuBLAS, and with
 * cuda_gemv for up to 8 and 16 rows; the graphs with cuda_gemv for up to 8 rows without it; the
 * streaming form (cuda_gemv_stream) on every linear of up to 16 and 8 rows, with pdl, and of up
 * to 16 without; cuda_gemv and its streaming form on QKV and O only (the small weights, where
 * they beat cuBLAS alone), up to 8 rows, with pdl; the streaming form on QKV, O and down up to 8
 * rows, and on QKV and O up to 16; the defaults (graphs, pdl, the streaming form on QKV and O up
 * to CUDA_BACKEND_GEMV_MAX_ROWS rows: worker/cuda_backend.h); the defaults with the decode
 * attention waiting before it requests any K/V (cuda_backend_options.decode_early_kv 0); the
 * defaults with the decode attention's copies of 4 and of 16 rows at every batch size
 * (cuda_backend_options.decode_copy_rows); the defaults with the decode attention's CTAs of 8
 * and of 4 warps at every batch size (warps8, warps4: cuda_backend_options.decode_warps); the
 * defaults with two and three of the decode attention's CTAs of 4 warps an SM over an F8E4M3 pool
 * at every batch size whose CTAs have 4 warps (ctas2, ctas3: cuda_backend_options.decode_ctas); the
 * defaults with cuBLASLt on the linears no GEMV takes up to 256 rows
 * (cuda_backend_options.lt_max_rows); the defaults with the streaming GEMV on QKV and O up to
 * CUDA_GEMV_MAX_ROWS rows; the defaults with cuda_gemv_row on the linears of one row
 * (cuda_backend_options.gemv_row 1), and with the RMSNorms inside it too (gemv_row_norm 1); the
 * defaults without cuda_gemv_row (norow); the defaults with cuBLASLt on QKV and O only (lt_qo) and
 * on O only (lt_o), up to 256 rows; the defaults without O and down adding into the residual inside
 * their GEMMs (cuda_backend_options.residual_gemm_max_rows 0: noracc) and without programmatic
 * dependent launch (nopdl); the defaults with the streaming GEMV on O alone (QKV through cuBLAS at
 * every size, so that at 1 to 8 rows QKV differs from the defaults too) up to CUDA_GEMV_MAX_ROWS
 * rows (o_gemvs16: behind the decode attention, whose tail it overlaps); the defaults with O and
 * down adding into the residual whole, not cut into split_parts slices (nosplit); the defaults with
 * RoPE and the cache write as a kernel of their own, not inside the decode attention (rope_apart),
 * and with them inside it at every size (rope_in); the defaults without the late trigger into
 * cuBLAS (cuda_backend_options.pdl_late_max_rows 0: nolate); the defaults without
 * kernels/cuda/linear_tma's GEMM on the layers' linears at 2 to 16 rows (notma), with its tiles
 * forced (tma64, tma128), with gate/up and SiLU-mul as two kernels (tma_unfused). */
struct version {
    const char *name;
    int ref, baseline, gemv_max_rows, graphs, pdl;
    int gemv_stream; /* 1: cuda_gemv_stream, on every weight (cuda_backend_options.gemv_stream) */
    int defaults;    /* 1: cuda_backend_default_options() as they are (the other fields unused) */
    int64_t max_weight;   /* the gemv on weights of up to this many elements */
    int no_early_kv;      /* 1: cuda_backend_options.decode_early_kv 0 (the defaults otherwise) */
    int copy_rows;        /* cuda_backend_options.decode_copy_rows (the defaults otherwise) */
    int warps;            /* cuda_backend_options.decode_warps (the defaults otherwise) */
    int ctas;             /* cuda_backend_options.decode_ctas (the defaults otherwise) */
    int lt_rows;          /* cuda_backend_options.lt_max_rows: 0 the default's */
    int64_t lt_weight;    /* cuda_backend_options.lt_max_weight: 0 the default's */
    int no_residual_gemm; /* 1: cuda_backend_options.residual_gemm_max_rows 0 */
    int no_pdl;           /* 1: cuda_backend_options.pdl 0 (the defaults otherwise) */
    int gemv_row; /* 1: cuda_backend_options.gemv_row 1; 2: gemv_row_norm 1 too; -1: gemv_row 0 */
    int split_parts; /* cuda_backend_options.split_parts; 0 the default's, -1 for 0 (none) */
    int rope;        /* cuda_backend_options.fused_rope_max_seqs: 0 the default's, -1 for 0
                        (RoPE as a kernel of its own), 1 for INT32_MAX (inside every decode step) */
    int no_late;     /* 1: cuda_backend_options.pdl_late_max_rows 0 */
    int tma_rows;    /* cuda_backend_options.tma_max_rows, -1: 0 (the defaults otherwise) */
    int tma_tile;    /* cuda_backend_options.tma_tile */
    int tma_silu;    /* cuda_backend_options.tma_silu 1, -1: 0 (the defaults otherwise) */
    int tma_sk;      /* cuda_backend_options.tma_stream_k (the defaults otherwise) */
    int tma_skip;    /* linears taken out of cuda_backend_options.tma_linears */
};
/* The Llama-3-8B shape's O, QKV and down elements (gate/up's are more), and every weight. */
#define kO ((int64_t)4096 * 4096)
#define kQKV ((int64_t)6144 * 4096)
#define kEvery INT64_MAX
#define kDown ((int64_t)14336 * 4096)
#define kVersions 49
static const struct version versions[kVersions] = {
    {.name = "baseline", .baseline = 1},
    {.name = "cublas"},
    {.name = "gemv", .gemv_max_rows = CUDA_GEMV_MAX_ROWS, .max_weight = kO},
    {.name = "graphs", .ref = 1, .graphs = 1},
    {.name = "pdl", .ref = 3, .graphs = 1, .pdl = 1},
    {.name = "pdl_gemv8", .ref = 3, .gemv_max_rows = 8, .graphs = 1, .pdl = 1, .max_weight = kO},
    {.name = "pdl_gemv16",
     .ref = 3,
     .gemv_max_rows = CUDA_GEMV_MAX_ROWS,
     .graphs = 1,
     .pdl = 1,
     .max_weight = kO},
    {.name = "graphs_gemv8", .ref = 3, .gemv_max_rows = 8, .graphs = 1, .max_weight = kO},
    {.name = "pdl_gemvs",
     .ref = 3,
     .gemv_max_rows = CUDA_GEMV_MAX_ROWS,
     .graphs = 1,
     .pdl = 1,
     .gemv_stream = 1,
     .max_weight = kEvery},
    {.name = "pdl_gemvs8",
     .ref = 3,
     .gemv_max_rows = 8,
     .graphs = 1,
     .pdl = 1,
     .gemv_stream = 1,
     .max_weight = kEvery},
    {.name = "graphs_gemvs",
     .ref = 3,
     .gemv_max_rows = CUDA_GEMV_MAX_ROWS,
     .graphs = 1,
     .gemv_stream = 1,
     .max_weight = kEvery},
    {.name = "pdl_qo_gemv8",
     .ref = 3,
     .gemv_max_rows = 8,
     .graphs = 1,
     .pdl = 1,
     .max_weight = kQKV},
    {.name = "pdl_qo_gemvs8",
     .ref = 3,
     .gemv_max_rows = 8,
     .graphs = 1,
     .pdl = 1,
     .gemv_stream = 1,
     .max_weight = kQKV},
    {.name = "pdl_qod_gemvs8",
     .ref = 3,
     .gemv_max_rows = 8,
     .graphs = 1,
     .pdl = 1,
     .gemv_stream = 1,
     .max_weight = kDown},
    {.name = "pdl_qo_gemvs16",
     .ref = 3,
     .gemv_max_rows = CUDA_GEMV_MAX_ROWS,
     .graphs = 1,
     .pdl = 1,
     .gemv_stream = 1,
     .max_weight = kQKV},
    {.name = "shipped", .ref = 3, .defaults = 1},
    {.name = "noearly", .ref = 3, .defaults = 1, .no_early_kv = 1},
    {.name = "copy4", .ref = 3, .defaults = 1, .copy_rows = 4},
    {.name = "copy16", .ref = 3, .defaults = 1, .copy_rows = 16},
    {.name = "copy8", .ref = 3, .defaults = 1, .copy_rows = 8},
    {.name = "warps8", .ref = 3, .defaults = 1, .warps = 8},
    {.name = "warps4", .ref = 3, .defaults = 1, .warps = 4},
    {.name = "ctas2", .ref = 3, .defaults = 1, .ctas = 2},
    {.name = "ctas3", .ref = 3, .defaults = 1, .ctas = 3},
    /* (lt, qo16, lt_qo, lt_o and o_gemvs16 measure cuBLASLt and the GEMVs at 2 to 16 rows too,
     * which linear_tma takes by default since the twenty-fifth session: they run without it, to
     * be read against notma) */
    {.name = "lt", .ref = 3, .defaults = 1, .lt_rows = 256, .tma_rows = -1},
    {.name = "qo16", .ref = 3, .gemv_max_rows = CUDA_GEMV_MAX_ROWS, .defaults = 1, .tma_rows = -1},
    {.name = "row", .ref = 3, .defaults = 1, .gemv_row = 1},
    {.name = "rowfuse", .ref = 3, .defaults = 1, .gemv_row = 2},
    {.name = "norow", .ref = 3, .defaults = 1, .gemv_row = -1},
    {.name = "lt_qo", .ref = 3, .defaults = 1, .lt_rows = 256, .lt_weight = kQKV, .tma_rows = -1},
    {.name = "lt_o", .ref = 3, .defaults = 1, .lt_rows = 256, .lt_weight = kO, .tma_rows = -1},
    {.name = "noracc", .ref = 3, .defaults = 1, .no_residual_gemm = 1},
    {.name = "nopdl", .ref = 3, .defaults = 1, .no_pdl = 1},
    {.name = "o_gemvs16",
     .ref = 3,
     .gemv_max_rows = CUDA_GEMV_MAX_ROWS,
     .defaults = 1,
     .max_weight = kO,
     .tma_rows = -1},
    /* (without slices linear_tma does not take O and down: cuBLAS adds them whole) */
    {.name = "nosplit", .ref = 3, .defaults = 1, .split_parts = -1},
    {.name = "rope_apart", .ref = 3, .defaults = 1, .rope = -1},
    {.name = "rope_in", .ref = 3, .defaults = 1, .rope = 1},
    {.name = "nolate", .ref = 3, .defaults = 1, .no_late = 1},
    /* the defaults again, run after nolate: versions run in this table's order, and the order
     * itself moved a step by up to 0.04 ms (bench/RESULTS.md, twenty-third session) */
    {.name = "shipped_again", .ref = 3, .defaults = 1},
    /* the defaults without kernels/cuda/linear_tma's GEMM (on by default since the twenty-fifth
     * session): a layer's linears at 2 to 16 rows through the GEMVs and cuBLAS, as shipped before
     */
    {.name = "notma", .ref = 3, .defaults = 1, .tma_rows = -1},
    /* the defaults with linear_tma's tile forced to 64 or 128 weight rows */
    {.name = "tma64", .ref = 3, .defaults = 1, .tma_tile = 64},
    {.name = "tma128", .ref = 3, .defaults = 1, .tma_tile = 128},
    /* the defaults with gate/up and SiLU-and-multiply as two kernels (against shipped, index 15:
     * the same bits, so its max difference reads 0) */
    {.name = "tma_unfused", .ref = 15, .defaults = 1, .tma_silu = -1},
    /* the defaults with linear_tma's stream-K where it balances (QKV and gate/up of the 8B
     * shape), and always (O and down too) */
    {.name = "tma_sk", .ref = 15, .defaults = 1, .tma_sk = CUDA_TMA_SK_BALANCE},
    {.name = "tma_sk_always", .ref = 15, .defaults = 1, .tma_sk = CUDA_TMA_SK_ALWAYS},
    /* the defaults with some of a layer's linears back on the GEMVs and cuBLAS (gemm16: ours
     * slower alone than cuBLAS on QKV and, behind a kernel, on down) */
    {.name = "tma_noqkv", .ref = 3, .defaults = 1, .tma_skip = CUDA_TMA_QKV},
    {.name = "tma_nodown", .ref = 3, .defaults = 1, .tma_skip = CUDA_TMA_DOWN},
    {.name = "tma_noqkv_nodown", .ref = 3, .defaults = 1, .tma_skip = CUDA_TMA_QKV | CUDA_TMA_DOWN},
    {.name = "tma_noo", .ref = 3, .defaults = 1, .tma_skip = CUDA_TMA_O},
};

static int decode_split;                 /* --split */
static int pipelined;                    /* --pipelined */
static enum dtype kv_dtype = DTYPE_BF16; /* --kv-cache-dtype */
/* --max-tokens, --max-seqs: the backend's limits (the worker's defaults are 2048 and 256) */
static int32_t max_tokens = 256, max_seqs;

static void run_version(const struct model_config *c, const struct kv_geometry *g, void *pool,
                        int version, const int32_t *batches, int nb, int32_t ctx, int reps,
                        int profile, struct result *res)
{
    struct cuda_backend_options o = cuda_backend_default_options();
    o.limits.max_num_tokens = max_tokens;
    o.limits.max_num_seqs = max_seqs > 0 ? max_seqs : batches[nb - 1] > 64 ? batches[nb - 1] : 64;
    o.limits.max_blocks_per_seq = (ctx + kBlockSize - 1) / kBlockSize;
    if (!versions[version].defaults) {
        o.baseline_kernels = versions[version].baseline;
        o.gemv_max_rows = versions[version].gemv_max_rows;
        o.cuda_graphs = versions[version].graphs;
        o.pdl = versions[version].pdl;
        o.gemv_stream = versions[version].gemv_stream;
        o.gemv_max_weight = versions[version].max_weight;
        o.lt_max_rows = 0; /* every version before cuBLASLt, cuda_gemv_row and residual_gemm */
        o.gemv_row = 0;
        o.residual_gemm_max_rows = 0;
        o.tma_max_rows = 0; /* and before linear_tma */
    } else {
        if (versions[version].gemv_max_rows != 0)
            o.gemv_max_rows = versions[version].gemv_max_rows;
        if (versions[version].max_weight != 0)
            o.gemv_max_weight = versions[version].max_weight;
    }
    if (versions[version].gemv_row != 0)
        o.gemv_row = versions[version].gemv_row > 0;
    if (versions[version].gemv_row == 2)
        o.gemv_row_norm = 1;
    if (versions[version].no_early_kv)
        o.decode_early_kv = 0;
    if (versions[version].copy_rows != 0)
        o.decode_copy_rows = versions[version].copy_rows;
    if (versions[version].warps != 0)
        o.decode_warps = versions[version].warps;
    if (versions[version].ctas != 0)
        o.decode_ctas = versions[version].ctas;
    if (versions[version].lt_rows != 0)
        o.lt_max_rows = versions[version].lt_rows;
    o.lt_max_weight = versions[version].lt_weight;
    if (versions[version].no_pdl)
        o.pdl = 0;
    if (versions[version].no_residual_gemm)
        o.residual_gemm_max_rows = 0;
    if (versions[version].rope != 0)
        o.fused_rope_max_seqs = versions[version].rope < 0 ? 0 : INT32_MAX;
    if (versions[version].no_late)
        o.pdl_late_max_rows = 0;
    if (versions[version].split_parts != 0)
        o.split_parts = versions[version].split_parts < 0 ? 0 : versions[version].split_parts;
    if (versions[version].tma_rows != 0)
        o.tma_max_rows = versions[version].tma_rows < 0 ? 0 : versions[version].tma_rows;
    o.tma_tile = versions[version].tma_tile;
    if (versions[version].tma_silu != 0)
        o.tma_silu = versions[version].tma_silu > 0;
    o.tma_stream_k = versions[version].tma_sk;
    o.tma_linears &= ~versions[version].tma_skip;
    o.decode_split = decode_split;
    struct backend *be = NULL;
    PK(cuda_backend_open(c, NULL, kSeed, g, pool, &o, &be));
    const int32_t bps = o.limits.max_blocks_per_seq;
    for (int i = 0; i < nb; i++) {
        const int32_t B = batches[i];
        struct step st;
        step_make(&st, B, ctx, bps, (int32_t)c->vocab_size);
        double dev[kMaxReps], host[kMaxReps];
        const uint64_t graph0 = backend_graph_steps(be), steps0 = backend_forward_count(be);
        if (!pipelined)
            for (int r = 0; r < kWarmup + reps; r++) {
                double t0 = now_s();
                PK(backend_forward_sample(be, &st.batch, st.rows, res[i].tokens, res[i].logprobs));
                double t1 = now_s();
                double us = 0.0;
                PK(backend_device_time_us(be, &us));
                if (r >= kWarmup) {
                    dev[r - kWarmup] = us * 1e-3;
                    host[r - kWarmup] = (t1 - t0) * 1e3;
                }
            }
        else {
            /* two steps in flight: step r is submitted before step r - 1 is completed (the slots
             * in turn, as the executor's step ids take them) */
            struct backend_row_error *errs = calloc((size_t)B, sizeof(*errs));
            if (errs == NULL) {
                fprintf(stderr, "decode_step: out of host memory\n");
                exit(1);
            }
            double t_prev = now_s();
            for (int r = 0; r <= kWarmup + reps; r++) {
                if (r < kWarmup + reps)
                    PK(backend_submit(be, r % BACKEND_STEP_SLOTS, &st.batch, st.rows, NULL, 0, NULL,
                                      0));
                if (r == 0)
                    continue;
                double us = 0.0;
                PK(backend_complete(be, (r - 1) % BACKEND_STEP_SLOTS, 1, res[i].tokens,
                                    res[i].logprobs, errs, &us));
                for (int32_t row = 0; row < B; row++)
                    if (errs[row].code != 0) {
                        fprintf(stderr, "decode_step: row %d of a step: %s\n", (int)row,
                                errs[row].message);
                        exit(1);
                    }
                const double t = now_s();
                if (r - 1 >= kWarmup) {
                    dev[r - 1 - kWarmup] = us * 1e-3;
                    host[r - 1 - kWarmup] = (t - t_prev) * 1e3;
                }
                t_prev = t;
            }
            free(errs);
        }
        res[i].graph_steps = (unsigned long long)(backend_graph_steps(be) - graph0);
        res[i].steps = (unsigned long long)(backend_forward_count(be) - steps0);
        res[i].device_ms = median(dev, reps);
        res[i].host_ms = median(host, reps);
        PK(backend_forward(be, &st.batch, res[i].logits));
        if (profile) {
            CK(cudaDeviceSynchronize());
            CK(cudaProfilerStart());
            PK(backend_forward_sample(be, &st.batch, st.rows, res[i].tokens, res[i].logprobs));
            CK(cudaDeviceSynchronize());
            CK(cudaProfilerStop());
        }
        /* the tokens of the timed step (the profiled one is the same step again) */
        step_free(&st);
    }
    backend_close(be);
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    int32_t batches[kMaxBatches] = {1, 16, 64};
    int nb = 3, reps = 30, profile = 0, only = -1;
    int run[kVersions];
    for (int v = 0; v < kVersions; v++)
        run[v] = 1;
    int32_t ctx = 1100;
    long long pool_blocks = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--batches") == 0 && i + 1 < argc) {
            nb = 0;
            for (char *p = argv[++i]; *p != '\0' && nb < kMaxBatches;) {
                batches[nb++] = (int32_t)strtol(p, &p, 10);
                if (*p == ',')
                    p++;
            }
        } else if (strcmp(argv[i], "--context") == 0 && i + 1 < argc) {
            ctx = (int32_t)atoi(argv[++i]);
        } else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) {
            reps = atoi(argv[++i]);
        } else if ((strcmp(argv[i], "--only") == 0 || strcmp(argv[i], "--versions") == 0) &&
                   i + 1 < argc) {
            const int single = strcmp(argv[i], "--only") == 0;
            ++i;
            char list[512];
            if ((size_t)snprintf(list, sizeof list, ",%s,", argv[i]) >= sizeof list) {
                fprintf(stderr, "decode_step: %s: too long a list\n", argv[i]);
                return 2;
            }
            int named = 0;
            for (int v = 0; v < kVersions; v++) {
                char pat[64];
                snprintf(pat, sizeof pat, ",%s,", versions[v].name);
                run[v] = strstr(list, pat) != NULL;
                named += run[v];
                if (single && run[v])
                    only = v;
            }
            /* every name a version's, each once (a list of n names has n - 1 inner commas) */
            int commas = 0;
            for (const char *p = argv[i]; *p != '\0'; p++)
                commas += *p == ',';
            if (named == 0 || named != commas + 1 || (single && named != 1)) {
                fprintf(stderr, "decode_step: %s %s: unknown or repeated version names\n",
                        argv[i - 1], argv[i]);
                return 2;
            }
            /* a version's ref runs too: its logits are the comparison */
            for (int v = kVersions - 1; v >= 0; v--)
                if (run[v] && !single)
                    run[versions[v].ref] = 1;
        } else if (strcmp(argv[i], "--layout") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "contiguous") == 0 ||
                    strcmp(argv[i + 1], "interleaved") == 0)) {
            layout_interleaved = strcmp(argv[++i], "interleaved") == 0;
        } else if (strcmp(argv[i], "--pool-blocks") == 0 && i + 1 < argc) {
            char *e = NULL;
            pool_blocks = strtoll(argv[++i], &e, 10);
            if (e == argv[i] || *e != '\0' || pool_blocks < 1) {
                fprintf(stderr, "decode_step: --pool-blocks %s: not a positive number\n", argv[i]);
                return 2;
            }
        } else if (strcmp(argv[i], "--profile") == 0) {
            profile = 1;
        } else if (strcmp(argv[i], "--pipelined") == 0) {
            pipelined = 1;
        } else if (strcmp(argv[i], "--kv-cache-dtype") == 0 && i + 1 < argc) {
            if (dtype_from_kv_cache_name("--kv-cache-dtype", argv[++i], DTYPE_BF16, &kv_dtype) <
                0) {
                fprintf(stderr, "%s: %s\n", argv[0], pagoda_error_detail());
                return 2;
            }
        } else if (strcmp(argv[i], "--debug") == 0) {
            log_set_level(LOG_DEBUG);
        } else if (strcmp(argv[i], "--context-spread") == 0 && i + 1 < argc &&
                   atoi(argv[i + 1]) >= 0) {
            context_spread = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--max-tokens") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            max_tokens = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--max-seqs") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0) {
            max_seqs = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--split") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 0 &&
                   atoi(argv[i + 1]) % 64 == 0) {
            decode_split = atoi(argv[++i]);
        } else if (dir == NULL && argv[i][0] != '-') {
            dir = argv[i];
        } else {
            dir = NULL;
            break;
        }
    }
    if (dir == NULL || nb < 1 || ctx < 2 || context_spread > ctx - 1 || reps < 1 ||
        reps > kMaxReps) {
        fprintf(stderr,
                "usage: decode_step MODEL_DIR [--batches 1,16,64] [--context N] "
                "[--reps 1..%d] [--profile] [--only VERSION | --versions V1,V2,...] "
                "[--layout contiguous|interleaved] [--pool-blocks N] [--split KEYS] [--pipelined]\n"
                "[--max-tokens N] [--max-seqs N] [--debug] [--context-spread S] "
                "[--kv-cache-dtype auto|fp8]\n"
                "versions:",
                kMaxReps);
        for (int v = 0; v < kVersions; v++)
            fprintf(stderr, " %s", versions[v].name);
        fprintf(stderr, "\n");
        return 2;
    }
    for (int i = 0; i < nb; i++)
        if (batches[i] < 1 || batches[i] > 256 || (i > 0 && batches[i] < batches[i - 1])) {
            fprintf(stderr, "decode_step: batches must rise, each in 1 .. 256\n");
            return 2;
        }
    struct model_config c;
    PK(model_config_load(dir, &c));
    const int32_t bps = (ctx + kBlockSize - 1) / kBlockSize;
    const int64_t needed = (int64_t)batches[nb - 1] * bps;
    if (pool_blocks < 0 || pool_blocks > INT32_MAX - 1) {
        fprintf(stderr, "decode_step: --pool-blocks %lld out of range\n", pool_blocks);
        return 2;
    }
    if (pool_blocks > needed + 1)
        block_stride = (pool_blocks - 1) / needed;
    struct kv_geometry g = {
        .pool_id = 1,
        .num_layers = (int32_t)c.num_layers,
        .num_blocks = (int32_t)(pool_blocks > needed + 1 ? pool_blocks : needed + 1),
        .block_size = kBlockSize,
        .num_kv_heads = (int32_t)c.num_kv_heads,
        .head_dim = (int32_t)c.head_dim,
        .dtype = kv_dtype,
    };
    void *pool = NULL;
    PK(cuda_pool_alloc(&g, 0, &pool));
    /* Random K/V everywhere (never zeros: see .library METHOD.md). */
    if (kv_dtype == DTYPE_F8E4M3)
        PK(cuda_fill_random_e4m3(pool, (int64_t)kv_pool_bytes(&g), kSeed, 99, 1.0f, 0.0f, 0));
    else
        PK(cuda_fill_random_bf16(pool, (int64_t)(kv_pool_bytes(&g) / 2), kSeed, 99, 1.0f, 0.0f, 0));
    CK(cudaDeviceSynchronize());
    printf("layout %s, %d pool blocks (used every %lld)\n",
           layout_interleaved ? "interleaved" : "contiguous", (int)g.num_blocks,
           (long long)block_stride);

    struct result res[kVersions][kMaxBatches];
    for (int v = 0; v < kVersions; v++)
        for (int i = 0; i < nb && (run[v] || v == only); i++) {
            res[v][i].logits = malloc((size_t)batches[i] * (size_t)c.vocab_size * sizeof(float));
            res[v][i].tokens = malloc((size_t)batches[i] * sizeof(int32_t));
            res[v][i].logprobs = malloc((size_t)batches[i] * sizeof(float));
            if (!res[v][i].logits || !res[v][i].tokens || !res[v][i].logprobs)
                return 1;
        }
    if (only >= 0) {
        run_version(&c, &g, pool, only, batches, nb, ctx, reps, profile, res[only]);
        for (int i = 0; i < nb; i++)
            printf("batch %d %s: device %.3f ms, host %.3f ms, graph steps %llu/%llu\n",
                   (int)batches[i], versions[only].name, res[only][i].device_ms,
                   res[only][i].host_ms, res[only][i].graph_steps, res[only][i].steps);
        cuda_pool_free(pool);
        return 0;
    }
    for (int v = 0; v < kVersions; v++)
        if (run[v])
            run_version(&c, &g, pool, v, batches, nb, ctx, reps, profile, res[v]);

    /* The floor: every weight read once, each sequence's K/V read once. */
    const double H = (double)c.hidden_size, I = (double)c.intermediate_size;
    const double qd = (double)(c.num_heads * c.head_dim),
                 kvd = (double)(c.num_kv_heads * c.head_dim);
    const double layer_w = H * (qd + 2 * kvd) + qd * H + 2 * I * H + I * H + 2 * H;
    const double weights = 2.0 * ((double)c.num_layers * layer_w + (double)c.vocab_size * H);
    const double kv_per_token = 2.0 * (double)dtype_size(kv_dtype) * kvd * (double)c.num_layers;
    printf("\n%-6s %-12s %10s %10s %10s %8s %12s %10s %12s\n", "batch", "version", "device ms",
           "host ms", "floor ms", "floor/dev", "logits diff", "tokens eq", "graph steps");
    for (int i = 0; i < nb; i++) {
        const int32_t B = batches[i];
        double positions = 0;
        for (int32_t s = 0; s < B; s++)
            positions += context_of(s, B, ctx);
        const double bytes = weights + positions * kv_per_token;
        const double floor_ms = bytes / kFloorBytesPerSecond * 1e3;
        for (int v = 0; v < kVersions; v++) {
            if (!run[v])
                continue;
            double amax = 0.0, dmax = 0.0;
            int same = 0;
            const struct result *ref = &res[versions[v].ref][i];
            for (int64_t k = 0; k < (int64_t)B * c.vocab_size; k++) {
                double a = fabs((double)ref->logits[k]);
                double d = fabs((double)ref->logits[k] - (double)res[v][i].logits[k]);
                amax = a > amax ? a : amax;
                dmax = d > dmax ? d : dmax;
            }
            for (int32_t s = 0; s < B; s++)
                same += ref->tokens[s] == res[v][i].tokens[s];
            printf("%-6d %-12s %10.3f %10.3f %10.3f %8.3f %12.2e %7d/%d %8llu/%llu\n", (int)B,
                   versions[v].name, res[v][i].device_ms, res[v][i].host_ms, floor_ms,
                   floor_ms / res[v][i].device_ms, dmax / (amax > 0 ? amax : 1), same, (int)B,
                   res[v][i].graph_steps, res[v][i].steps);
        }
    }
    cuda_pool_free(pool);
    return 0;
}
