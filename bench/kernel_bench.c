/* kernel_bench: times pagoda's CUDA kernels on device buffers, on the Llama-3-8B shape.
 *
 *   kernel_bench [--json FILE] [--quick] [--filter SUB[,SUB...]] [--pool vmm|malloc]
 *                [--copy-rows 0|4|8|16] [--split KEYS] [--early-kv]
 *
 * --filter runs only the cases whose name contains one of the substrings. --pool says where the
 * attention cases' KV pool comes from: vmm (the default) allocates it as pagoda-kvpool does, by
 * kv_cuda_pool_create (CUDA VMM: cuMemCreate chunks of the recommended granularity mapped at one
 * address), since that is the memory the worker's kernels read; malloc takes it from cudaMalloc
 * (the layout is the same, but where it lands physically depends on what the process allocated
 * and freed before: bench/RESULTS.md measured both). --copy-rows sets the rows of the decode
 * kernel's copies (cuda_attention_set_decode_copy_rows; 0, the default, lets the plan choose),
 * --decode-warps 4|8 the decode kernel's warps a CTA (cuda_attention_set_decode_warps; by
 * default the plan chooses), --decode-ctas 2|3 the decode kernel's CTAs of 4 warps an SM over an
 * F8E4M3 pool (cuda_attention_set_decode_ctas; by default the plan chooses), --split the decode
 * split-KV partition in keys
 * (cuda_attention_set_decode_split; 0, the default, lets the plan's cost model choose), --early-kv
 * the decode kernel's K/V requested before its PDL wait, as the worker runs it
 * (cuda_attention_set_early_kv; off by default), --kv-cache-dtype fp8 the attention cases over an
 * F8E4M3 pool (pagoda-kvpool --kv-cache-dtype fp8; every code 0x2c, 0.375: the kernels' time does
 * not depend on the values, and bench/kernel_competitor.py has no such case), --lt-algos N how many
 * of cuBLASLt's heuristic algorithms the linears time (default 8, at most 64) and
 * --lt-sm-target N the SM count the heuristic is asked to plan for
 * (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET; unset by default).
 * Cases: paged decode attention (batch x context, head dim 64 and 128, block sizes 8 to 64,
 * block tables in order and shuffled), the decode step's attention (decode_step_*: the 32 layers
 * of a step, each layer's K/V its own, as one captured CUDA graph of 32 launches, the time per
 * layer reported: one layer's K/V at small batch would sit in the 60 MB L2, as it never does in
 * a real step, and launches one by one would time the host; the _g cases plan the step as a
 * decode graph of the worker does, cuda_attention_plan_graph padded to the graph's batch size,
 * the graph captured on a plan of padding alone and replayed on the step's), paged causal
 * prefill attention, the append case (a chunk continuing a sequence already in the pool), each
 * linear of the model through the worker's cuBLAS call, RMSNorm with the residual add, RoPE +
 * cache write, SiLU-mul and the sampler.
 *
 * Data: every input is drawn on the device by cuda_fill_random_bf16 (seed kBenchSeed, one
 * stream id per buffer, std 1, offset 0), and block tables follow a formula (in order, or an
 * affine permutation of the blocks), so that bench/kernel_competitor.py rebuilds the same bytes
 * in PyTorch, lays the same K/V out contiguously and times SDPA and torch.matmul on them. Each
 * attention and linear case records a checksum of pagoda's output (sum |x| and sum x * w_i with
 * w_i = i % 7 - 3) that the script compares with its own output: equal data, equal function.
 * Correctness against the CPU implementation is tests/gpu/test_cuda_kernels (run first by
 * bench/run_kernels.sh).
 *
 * Timing: CUDA events around each launch after warm-up, the median of the repetitions; inputs
 * that would fit in L2 (the linears' weights) rotate among copies that together exceed it.
 * Prints one line per case and writes the JSON the script reads. Exit status 0, or 1 on a
 * failed CUDA or pagoda call (the message names it). */
#define _POSIX_C_SOURCE 200809L
#include "bench/cuda_check.h"
#include "common/dtype.h"
#include "common/error.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/sampler.h"
#include "kernels/cuda/util.h"
#include "kvpool/cuda_pool.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define kBenchSeed 20261201ull
#define kWarmup 3
#define kReps 15

/* Stream ids of cuda_fill_random_bf16 (the script uses the same). */
enum { STREAM_POOL = 1, STREAM_Q = 2, STREAM_X = 3, STREAM_W = 4, STREAM_AUX = 5 };

static cudaStream_t stream;
static cublasHandle_t cublas;
static FILE *json;
static int json_cases;
static size_t l2_bytes;
static int sm_count;         /* the device's SMs (cuda_gemv_stream's grid) */
static const char *filter;   /* comma-separated substrings, or NULL for every case */
static bool pool_vmm = true; /* --pool: the attention pools by kv_cuda_pool_create */
static int copy_rows;        /* --copy-rows: cuda_attention_set_decode_copy_rows */
static int decode_split;     /* --split: cuda_attention_set_decode_split */
static int decode_warps;     /* --decode-warps: cuda_attention_set_decode_warps */
static int decode_ctas;      /* --decode-ctas: cuda_attention_set_decode_ctas */
static int early_kv;         /* --early-kv: cuda_attention_set_early_kv, as the worker */
static enum dtype kv_dtype = DTYPE_BF16; /* --kv-cache-dtype: the attention cases' pool */

/* True when the case name passes --filter. */
static bool wanted(const char *name)
{
    if (filter == NULL)
        return true;
    const char *p = filter;
    while (*p != '\0') {
        const char *comma = strchr(p, ',');
        size_t n = comma != NULL ? (size_t)(comma - p) : strlen(p);
        char sub[64];
        if (n > 0 && n < sizeof(sub)) {
            memcpy(sub, p, n);
            sub[n] = '\0';
            if (strstr(name, sub) != NULL)
                return true;
        }
        p += n + (comma != NULL);
    }
    return false;
}

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CK(cudaMalloc(&p, bytes > 0 ? bytes : 16));
    return p;
}

static void fill(uint16_t *d, int64_t n, uint64_t stream_id)
{
    PK(cuda_fill_random_bf16(d, n, kBenchSeed, stream_id, 1.0f, 0.0f, stream));
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The median time of fn(ctx, rep) over kReps launches after kWarmup, in ms (CUDA events). */
typedef void (*bench_fn)(void *ctx, int rep);
static double time_median_ms(bench_fn fn, void *ctx)
{
    cudaEvent_t ev[2 * kReps];
    for (int i = 0; i < 2 * kReps; i++)
        CK(cudaEventCreate(&ev[i]));
    for (int i = 0; i < kWarmup; i++)
        fn(ctx, i);
    for (int i = 0; i < kReps; i++) {
        CK(cudaEventRecord(ev[2 * i], stream));
        fn(ctx, i);
        CK(cudaEventRecord(ev[2 * i + 1], stream));
    }
    CK(cudaStreamSynchronize(stream));
    CK(cudaGetLastError());
    float t[kReps];
    for (int i = 0; i < kReps; i++)
        CK(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]));
    for (int i = 0; i < 2 * kReps; i++)
        CK(cudaEventDestroy(ev[i]));
    qsort(t, kReps, sizeof(float), cmp_float);
    return t[kReps / 2];
}

/* sum |x| and sum x * (i % 7 - 3) of n bf16 on the device. */
static void checksum(const uint16_t *d, int64_t n, double *sum_abs, double *sum_w)
{
    uint16_t *h = malloc((size_t)n * sizeof(uint16_t));
    if (h == NULL) {
        fprintf(stderr, "kernel_bench: out of host memory\n");
        exit(1);
    }
    CK(cudaMemcpy(h, d, (size_t)n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
    double a = 0.0, w = 0.0;
    for (int64_t i = 0; i < n; i++) {
        uint32_t bits = (uint32_t)h[i] << 16;
        float f;
        memcpy(&f, &bits, sizeof(f));
        a += fabs((double)f);
        w += (double)f * (double)(i % 7 - 3);
    }
    free(h);
    *sum_abs = a;
    *sum_w = w;
}

static void json_begin_case(const char *name, const char *kind)
{
    fprintf(json, "%s\n  {\"name\": \"%s\", \"kind\": \"%s\"", json_cases++ ? "," : "", name, kind);
}

/* ---- attention ---- */

struct attn_case {
    const char *name;
    const char *kind; /* decode, prefill, append */
    int32_t batch, context_len, query_len;
    int32_t num_heads, num_kv_heads, head_dim, block_size;
    bool shuffled;
    int32_t layers;     /* 0: one layer, timed launch by launch; else that many, as one graph */
    int32_t graph_seqs; /* 0: cuda_attention_plan; else cuda_attention_plan_graph, padded */
};

static int64_t gcd64(int64_t a, int64_t b)
{
    while (b != 0) {
        int64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

/* The physical block of logical block i (0 .. n - 1, sequence after sequence): 1 + i in order,
 * else 1 + (i * mult + n / 3) % n with mult the first number >= 0x9E3779B1 % n (at least 2)
 * coprime with n. bench/kernel_competitor.py computes the same. */
static int64_t shuffle_mult(int64_t n)
{
    int64_t m = 0x9E3779B1ll % n;
    if (m < 2)
        m = 2;
    while (gcd64(m, n) != 1)
        m++;
    return m;
}

struct attn_run {
    struct cuda_attention_plan *plan;
    struct kv_layer_view view;
    const uint16_t *q;
    int64_t q_stride;
    uint16_t *out;
    cudaGraphExec_t graph; /* the layers' launches, or NULL */
};

static void attn_launch(void *ctx, int rep)
{
    (void)rep;
    struct attn_run *r = ctx;
    if (r->graph != NULL)
        CK(cudaGraphLaunch(r->graph, stream));
    else
        PK(cuda_attention_run(r->plan, &r->view, r->q, r->q_stride, r->out, stream));
}

static void bench_attention(const struct attn_case *c)
{
    const int32_t bs = c->block_size, nb = (c->context_len + bs - 1) / bs;
    const int64_t total_blocks = (int64_t)c->batch * nb;
    const int32_t layers = c->layers > 0 ? c->layers : 1;
    struct kv_geometry g = {1,           layers,  (int32_t)(total_blocks + 1), bs, c->num_kv_heads,
                            c->head_dim, kv_dtype};
    const size_t pool_bytes = kv_pool_bytes(&g);
    struct kv_cuda_pool *vmm = NULL;
    uint16_t *pool;
    if (pool_vmm) {
        struct kv_cuda_pool_options po = {0, 0};
        CK(cudaGetDevice(&po.device));
        PK(kv_cuda_pool_create(&g, &po, &vmm));
        pool = kv_cuda_pool_data(vmm);
    } else {
        pool = dev_alloc(pool_bytes);
    }
    if (kv_dtype == DTYPE_F8E4M3)
        CK(cudaMemsetAsync(pool, 0x2c, pool_bytes, stream));
    else
        fill(pool, (int64_t)(pool_bytes / 2), STREAM_POOL);
    const int32_t num_tokens = c->batch * c->query_len;
    /* A graph's padding rows (one token each) have q rows and outputs too. */
    const int32_t rows = c->graph_seqs > num_tokens ? c->graph_seqs : num_tokens;
    const int64_t qw = (int64_t)c->num_heads * c->head_dim;
    uint16_t *q = dev_alloc((size_t)rows * qw * 2);
    fill(q, rows * qw, STREAM_Q);
    uint16_t *out = dev_alloc((size_t)rows * qw * 2);
    CK(cudaMemsetAsync(out, 0xff, (size_t)rows * qw * 2, stream));

    int32_t *query_start = malloc(((size_t)c->batch + 1) * sizeof(int32_t));
    int32_t *context_len = malloc((size_t)c->batch * sizeof(int32_t));
    int32_t *tables = malloc((size_t)total_blocks * sizeof(int32_t));
    if (query_start == NULL || context_len == NULL || tables == NULL) {
        fprintf(stderr, "kernel_bench: out of host memory\n");
        exit(1);
    }
    const int64_t mult = shuffle_mult(total_blocks);
    for (int64_t i = 0; i < total_blocks; i++)
        tables[i] = (int32_t)(1 + (c->shuffled ? (i * mult + total_blocks / 3) % total_blocks : i));
    for (int32_t s = 0; s <= c->batch; s++)
        query_start[s] = s * c->query_len;
    for (int32_t s = 0; s < c->batch; s++)
        context_len[s] = c->context_len;

    struct cuda_attention_config ac = {c->num_heads,
                                       c->num_kv_heads,
                                       c->head_dim,
                                       1.0f / sqrtf((float)c->head_dim),
                                       bs,
                                       g.num_blocks,
                                       c->batch > c->graph_seqs ? c->batch : c->graph_seqs,
                                       rows,
                                       nb,
                                       kv_dtype};
    struct attn_run r = {NULL, kv_layer_view_make(&g, pool, 0), q, qw, out, NULL};
    PK(cuda_attention_plan_new(&ac, &r.plan));
    cuda_attention_set_decode_copy_rows(r.plan, copy_rows);
    cuda_attention_set_decode_split(r.plan, decode_split);
    cuda_attention_set_decode_warps(r.plan, decode_warps);
    cuda_attention_set_decode_ctas(r.plan, decode_ctas);
    cuda_attention_set_early_kv(r.plan, early_kv);
    struct attention_batch b = {c->batch, num_tokens, query_start, context_len, tables, nb};
    cudaGraph_t graph = NULL;
    if (c->layers > 0) {
        /* A decode graph of the worker is captured on a plan of padding alone
         * (cuda_be_capture_graphs), then replayed on each step's plan. */
        static const int32_t zero = 0;
        const struct attention_batch none = {0, 0, &zero, NULL, NULL, 1};
        if (c->graph_seqs > 0)
            PK(cuda_attention_plan_graph(r.plan, &none, c->graph_seqs, stream));
        else
            PK(cuda_attention_plan(r.plan, &b, stream));
        CK(cudaStreamSynchronize(stream)); /* the plan's copy is not part of the graph */
        CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        for (int32_t l = 0; l < layers; l++) {
            struct kv_layer_view v = kv_layer_view_make(&g, pool, l);
            PK(cuda_attention_run(r.plan, &v, q, qw, out, stream));
        }
        CK(cudaStreamEndCapture(stream, &graph));
        CK(cudaGraphInstantiate(&r.graph, graph, 0));
    }
    if (c->graph_seqs > 0)
        PK(cuda_attention_plan_graph(r.plan, &b, c->graph_seqs, stream));
    else
        PK(cuda_attention_plan(r.plan, &b, stream));
    int32_t ctas = 0, parts = 0;
    PK(cuda_attention_decode_shape(r.plan, &ctas, &parts));
    const double ms = time_median_ms(attn_launch, &r) / layers;
    double sum_abs, sum_w;
    checksum(out, num_tokens * qw, &sum_abs, &sum_w);

    /* Bytes: the K/V the queries need, each read once (decode); FLOPs: 4 per (query head, key,
     * dimension) pair the causal mask keeps (QK^T and PV). */
    double pairs = 0.0;
    for (int32_t j = 0; j < c->query_len; j++)
        pairs += (double)(c->context_len - c->query_len + j + 1);
    pairs *= c->batch;
    const double kv_bytes = (double)c->batch * c->context_len * c->num_kv_heads * c->head_dim *
                            2.0 * (double)dtype_size(kv_dtype);
    const double flops = 4.0 * pairs * c->num_heads * c->head_dim;
    printf("%-28s %9.4f ms  %7.3f TB/s  %7.1f TFLOP/s  decode grid %d, partitions %d, "
           "checksum %.9e\n",
           c->name, ms, kv_bytes / ms * 1e-9, flops / ms * 1e-9, (int)ctas, (int)parts, sum_w);
    fflush(stdout);

    /* The first four bf16 of the pool and of q: the script checks its generator on them. */
    uint16_t ph[4], qh[4];
    CK(cudaMemcpy(ph, pool, sizeof(ph), cudaMemcpyDeviceToHost));
    CK(cudaMemcpy(qh, q, sizeof(qh), cudaMemcpyDeviceToHost));
    json_begin_case(c->name, c->kind);
    fprintf(json,
            ", \"batch\": %d, \"context_len\": %d, \"query_len\": %d, \"num_heads\": %d, "
            "\"num_kv_heads\": %d, \"head_dim\": %d, \"block_size\": %d, \"shuffled\": %s, "
            "\"shuffle_mult\": %lld, \"num_blocks\": %d, \"ms\": %.6f, \"bytes\": %.0f, "
            "\"flops\": %.0f, \"sum_abs\": %.9e, \"sum_w\": %.9e, "
            "\"pool_head\": [%u, %u, %u, %u], \"q_head\": [%u, %u, %u, %u], \"pool\": \"%s\", "
            "\"layers\": %d, \"graph_seqs\": %d, \"decode_grid\": %d, \"decode_partitions\": %d}",
            c->batch, c->context_len, c->query_len, c->num_heads, c->num_kv_heads, c->head_dim, bs,
            c->shuffled ? "true" : "false", (long long)mult, g.num_blocks, ms, kv_bytes, flops,
            sum_abs, sum_w, ph[0], ph[1], ph[2], ph[3], qh[0], qh[1], qh[2], qh[3],
            pool_vmm ? "vmm" : "malloc", (int)layers, (int)c->graph_seqs, (int)ctas, (int)parts);

    if (r.graph != NULL) {
        CK(cudaGraphExecDestroy(r.graph));
        CK(cudaGraphDestroy(graph));
    }
    cuda_attention_plan_free(r.plan);
    if (vmm != NULL) {
        CK(cudaStreamSynchronize(stream));
        kv_cuda_pool_close(vmm);
    } else {
        CK(cudaFree(pool));
    }
    CK(cudaFree(q));
    CK(cudaFree(out));
    free(query_start);
    free(context_len);
    free(tables);
}

/* ---- linears: y[rows][out] = x[rows][in] . w[out][in]^T, the worker's cublasGemmEx ---- */

/* How a linear case runs: the worker's cublasGemmEx, cuda_gemv (kernels/cuda/linear.h), its
 * streaming form cuda_gemv_stream (with `ring`), cuda_gemv_row (one row), or cublasLtMatmul
 * with one algorithm of the heuristic's list (a 32 MiB workspace). */
/* GEMM_RES: cublasGemmEx into an f32 y with beta 1 (the worker's gemm_add, the residual stream);
 * GEMM_SPLIT: cublasGemmStridedBatchedEx over `splits` slices of the reduction dimension, each
 * slice's f32 partial product in a y of its own (beta 0), for a kernel behind to add. */
enum gemm_mode {
    GEMM_CUBLAS,
    GEMM_GEMV,
    GEMM_GEMV_STREAM,
    GEMM_LT,
    GEMM_ROW,
    GEMM_RES,
    GEMM_SPLIT
};
#define kLtWorkspace (32u << 20)
#define kLtAlgosMax 64
static int lt_algos = 8;     /* --lt-algos: the heuristic's first N algorithms are timed */
static int lt_sm_target = 0; /* --lt-sm-target: CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, 0 unset */

struct gemm_run {
    const uint16_t *x;
    uint16_t *w; /* copies of the weight, each out * in */
    int copies;
    uint16_t *y;
    float *yf; /* GEMM_RES's and GEMM_SPLIT's f32 outputs: splits x rows x out */
    int32_t rows, in, out, splits;
    enum gemm_mode mode;
    struct cuda_gemv_ring ring; /* GEMM_GEMV_STREAM's */
    cublasLtHandle_t lt;
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t lw, lx, ly;
    cublasLtMatmulAlgo_t algo;
    void *workspace;
};

static cublasLtHandle_t lt_handle;

static void lt_check(cublasStatus_t st, const char *what)
{
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "kernel_bench: %s: status %d\n", what, (int)st);
        exit(1);
    }
}

static void gemm_launch(void *ctx, int rep)
{
    struct gemm_run *r = ctx;
    const float one = 1.0f, zero = 0.0f;
    const uint16_t *w = r->w + (size_t)(rep % r->copies) * r->out * r->in;
    if (r->mode == GEMM_GEMV) {
        PK(cuda_gemv(r->x, w, r->y, 0, r->rows, r->in, r->out, stream));
        return;
    }
    if (r->mode == GEMM_ROW) {
        PK(cuda_gemv_row(r->x, w, r->y, 0, r->in, r->out, stream));
        return;
    }
    if (r->mode == GEMM_GEMV_STREAM) {
        PK(cuda_gemv_stream(r->x, w, r->y, 0, r->rows, r->in, r->out, &r->ring, stream));
        return;
    }
    if (r->mode == GEMM_RES) {
        cublasStatus_t st =
            cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, r->out, r->rows, r->in, &one, w,
                         CUDA_R_16BF, r->in, r->x, CUDA_R_16BF, r->in, &one, r->yf, CUDA_R_32F,
                         r->out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        lt_check(st, "cublasGemmEx (f32, beta 1)");
        return;
    }
    if (r->mode == GEMM_SPLIT) {
        const int32_t k = r->in / r->splits;
        cublasStatus_t st = cublasGemmStridedBatchedEx(
            cublas, CUBLAS_OP_T, CUBLAS_OP_N, r->out, r->rows, k, &one, w, CUDA_R_16BF, r->in, k,
            r->x, CUDA_R_16BF, r->in, k, &zero, r->yf, CUDA_R_32F, r->out,
            (long long)r->rows * r->out, r->splits, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
        lt_check(st, "cublasGemmStridedBatchedEx");
        return;
    }
    if (r->mode == GEMM_LT) {
        lt_check(cublasLtMatmul(r->lt, r->op, &one, w, r->lw, r->x, r->lx, &zero, r->y, r->ly, r->y,
                                r->ly, &r->algo, r->workspace, kLtWorkspace, stream),
                 "cublasLtMatmul");
        return;
    }
    cublasStatus_t st = cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, r->out, r->rows, r->in, &one,
                                     w, CUDA_R_16BF, r->in, r->x, CUDA_R_16BF, r->in, &zero, r->y,
                                     CUDA_R_16BF, r->out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "kernel_bench: cublasGemmEx: status %d\n", (int)st);
        exit(1);
    }
}

static void linear_report(const char *name, struct gemm_run *r, double ms, size_t wbytes)
{
    double sum_abs = 0, sum_w = 0; /* f32 outputs (GEMM_RES, GEMM_SPLIT): not summed */
    if (r->mode != GEMM_RES && r->mode != GEMM_SPLIT) {
        gemm_launch(r, 0); /* the first copy's product, for the checksum */
        checksum(r->y, (int64_t)r->rows * r->out, &sum_abs, &sum_w);
    }
    const double bytes = (double)wbytes + (double)r->rows * (r->in + r->out) * 2.0;
    const double flops = 2.0 * r->rows * (double)r->in * r->out;
    printf("%-28s %9.4f ms  %7.3f TB/s  %7.1f TFLOP/s\n", name, ms, bytes / ms * 1e-9,
           flops / ms * 1e-9);
    fflush(stdout);
    json_begin_case(name, "linear");
    fprintf(json,
            ", \"rows\": %d, \"in\": %d, \"out\": %d, \"copies\": %d, \"ms\": %.6f, \"bytes\": "
            "%.0f, \"flops\": %.0f, \"sum_abs\": %.9e, \"sum_w\": %.9e}",
            r->rows, r->in, r->out, r->copies, ms, bytes, flops, sum_abs, sum_w);
}

/* Times the linear's cuBLASLt algorithms (the heuristic's first lt_algos for these sizes, asked
 * for lt_sm_target SMs when set): prints the heuristic's first choice and the fastest, with the
 * fastest's configuration (algorithm id, tile, stages, split-K, cluster shape). */
static void bench_linear_lt(const char *name, struct gemm_run *r, size_t wbytes)
{
    r->mode = GEMM_LT;
    r->lt = lt_handle;
    r->workspace = dev_alloc(kLtWorkspace);
    lt_check(cublasLtMatmulDescCreate(&r->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "MatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    lt_check(cublasLtMatmulDescSetAttribute(r->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)),
             "TRANSA");
    lt_check(cublasLtMatmulDescSetAttribute(r->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)),
             "TRANSB");
    if (lt_sm_target > 0)
        lt_check(cublasLtMatmulDescSetAttribute(r->op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                                &lt_sm_target, sizeof(lt_sm_target)),
                 "SM_COUNT_TARGET");
    lt_check(cublasLtMatrixLayoutCreate(&r->lw, CUDA_R_16BF, r->in, r->out, r->in), "layout w");
    lt_check(cublasLtMatrixLayoutCreate(&r->lx, CUDA_R_16BF, r->in, r->rows, r->in), "layout x");
    lt_check(cublasLtMatrixLayoutCreate(&r->ly, CUDA_R_16BF, r->out, r->rows, r->out), "layout y");
    cublasLtMatmulPreference_t pref;
    lt_check(cublasLtMatmulPreferenceCreate(&pref), "PreferenceCreate");
    const size_t ws = kLtWorkspace;
    lt_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                  &ws, sizeof(ws)),
             "workspace");
    cublasLtMatmulHeuristicResult_t h[kLtAlgosMax];
    int found = 0;
    lt_check(cublasLtMatmulAlgoGetHeuristic(r->lt, r->op, r->lw, r->lx, r->ly, r->ly, pref,
                                            lt_algos, h, &found),
             "AlgoGetHeuristic");
    double best = 1e30;
    int best_i = -1;
    for (int i = 0; i < found; i++) {
        r->algo = h[i].algo;
        const double ms = time_median_ms(gemm_launch, r);
        if (i == 0) {
            char n0[80];
            snprintf(n0, sizeof(n0), "%s_lt1", name);
            linear_report(n0, r, ms, wbytes);
        }
        if (ms < best) {
            best = ms;
            best_i = i;
        }
    }
    if (best_i >= 0) {
        char nb[80];
        snprintf(nb, sizeof(nb), "%s_ltbest", name);
        r->algo = h[best_i].algo;
        linear_report(nb, r, best, wbytes);
        /* 32-bit attributes (cublasLt.h), then the cluster shape's 16 bits; -1: not reported */
        int32_t cfg[4] = {-1, -1, -1, -1};
        uint16_t cluster = 0xFFFF;
        const cublasLtMatmulAlgoConfigAttributes_t attr[4] = {
            CUBLASLT_ALGO_CONFIG_ID, CUBLASLT_ALGO_CONFIG_TILE_ID, CUBLASLT_ALGO_CONFIG_STAGES_ID,
            CUBLASLT_ALGO_CONFIG_SPLITK_NUM};
        size_t got = 0;
        for (int k = 0; k < 4; k++)
            (void)cublasLtMatmulAlgoConfigGetAttribute(&r->algo, attr[k], &cfg[k], sizeof(cfg[k]),
                                                       &got);
        (void)cublasLtMatmulAlgoConfigGetAttribute(&r->algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID,
                                                   &cluster, sizeof(cluster), &got);
        printf("  (%d algorithms, the fastest is #%d: id %d, tile %d, stages %d, split-K %d, "
               "cluster %d)\n",
               found, best_i + 1, (int)cfg[0], (int)cfg[1], (int)cfg[2], (int)cfg[3],
               cluster == 0xFFFF ? -1 : (int)cluster);
    }
    cublasLtMatmulPreferenceDestroy(pref);
    cublasLtMatrixLayoutDestroy(r->lw);
    cublasLtMatrixLayoutDestroy(r->lx);
    cublasLtMatrixLayoutDestroy(r->ly);
    cublasLtMatmulDescDestroy(r->op);
    CK(cudaFree(r->workspace));
}

/* The worker's cublasGemmEx, then (when the sizes allow) cuda_gemv_row, cuda_gemv,
 * cuda_gemv_stream with its rings, and cuBLASLt's algorithms, on the same data. */
static void bench_linear(const char *name, int32_t rows, int32_t in, int32_t out, bool variants)
{
    const size_t wbytes = (size_t)out * in * 2;
    int copies = (int)((4 * l2_bytes + wbytes - 1) / wbytes);
    if (copies < 1)
        copies = 1;
    if (copies > 16)
        copies = 16;
    struct gemm_run r = {0};
    r.x = dev_alloc((size_t)rows * in * 2);
    r.w = dev_alloc(wbytes * copies);
    r.copies = copies;
    r.y = dev_alloc((size_t)rows * out * 2);
    r.rows = rows;
    r.in = in;
    r.out = out;
    fill((uint16_t *)r.x, (int64_t)rows * in, STREAM_X);
    for (int i = 0; i < copies; i++)
        fill(r.w + (size_t)i * out * in, (int64_t)out * in, STREAM_W + 16 * (uint64_t)i);
    r.mode = GEMM_CUBLAS;
    linear_report(name, &r, time_median_ms(gemm_launch, &r), wbytes);
    if (variants && cuda_gemv_row_fits(rows, in, out, r.x, r.w, r.y)) {
        char n[80];
        snprintf(n, sizeof(n), "%s_row", name);
        r.mode = GEMM_ROW;
        linear_report(n, &r, time_median_ms(gemm_launch, &r), wbytes);
    }
    if (variants && cuda_gemv_fits(rows, in, out, r.x, r.w, r.y)) {
        char n[80];
        snprintf(n, sizeof(n), "%s_gemv", name);
        r.mode = GEMM_GEMV;
        linear_report(n, &r, time_median_ms(gemm_launch, &r), wbytes);
        /* The streaming form: its default ring, the default resident ring (x copied once), then
         * rings of more stages and wider copies (the eighth session's one-tile bulk GEMV did
         * better with 4 KiB copies than with 1 KiB). */
        static const struct {
            const char *suffix;
            struct cuda_gemv_ring ring;
        } rings[] = {{"gemvs", {0, 0, 0}},           {"gemvs_xres", {0, 0, 1}},
                     {"gemvs_8x512", {8, 512, 0}},   {"gemvs_6x512", {6, 512, 0}},
                     {"gemvs_4x1024", {4, 1024, 0}}, {"gemvs_3x1024", {3, 1024, 0}},
                     {"gemvs_2x2048", {2, 2048, 0}}, {"gemvs_1x2048", {1, 2048, 0}},
                     {"gemvs_3x512", {3, 512, 0}},   {"gemvs_4x512", {4, 512, 0}}};
        r.mode = GEMM_GEMV_STREAM;
        for (size_t k = 0; k < sizeof(rings) / sizeof(rings[0]); k++) {
            r.ring = rings[k].ring;
            if (!cuda_gemv_stream_ring_fits(rows, in, out, &r.ring, sm_count))
                continue;
            snprintf(n, sizeof(n), "%s_%s", name, rings[k].suffix);
            linear_report(n, &r, time_median_ms(gemm_launch, &r), wbytes);
        }
    }
    if (variants) {
        /* Into the f32 residual (beta 1), then split into f32 partials (beta 0). */
        static const int32_t splits[] = {2, 3, 4, 6, 7, 8, 14};
        r.yf = dev_alloc((size_t)rows * out * 4 * 14);
        CK(cudaMemset(r.yf, 0, (size_t)rows * out * 4 * 14));
        char n[80];
        snprintf(n, sizeof(n), "%s_res", name);
        r.mode = GEMM_RES;
        linear_report(n, &r, time_median_ms(gemm_launch, &r), wbytes);
        for (size_t k = 0; k < sizeof(splits) / sizeof(splits[0]); k++) {
            if (in % (splits[k] * 64) != 0)
                continue;
            r.splits = splits[k];
            r.mode = GEMM_SPLIT;
            snprintf(n, sizeof(n), "%s_split%d", name, (int)splits[k]);
            linear_report(n, &r, time_median_ms(gemm_launch, &r), wbytes);
        }
        CK(cudaFree(r.yf));
        r.yf = NULL;
        bench_linear_lt(name, &r, wbytes);
    }
    CK(cudaFree((void *)r.x));
    CK(cudaFree(r.w));
    CK(cudaFree(r.y));
}

/* ---- the memory-bound operations ---- */

static void json_simple(const char *name, const char *kind, int32_t rows, double ms, double bytes)
{
    printf("%-28s %9.3f ms  %7.3f TB/s\n", name, ms, bytes / ms * 1e-9);
    fflush(stdout);
    json_begin_case(name, kind);
    fprintf(json, ", \"rows\": %d, \"ms\": %.6f, \"bytes\": %.0f, \"flops\": 0}", rows, ms, bytes);
}

struct norm_run {
    float *residual;
    uint16_t *x, *weight, *out;
    int32_t rows, dim;
};

static void norm_launch(void *ctx, int rep)
{
    (void)rep;
    struct norm_run *r = ctx;
    PK(cuda_add_rmsnorm(r->residual, r->x, r->weight, r->out, r->rows, r->dim, 1e-5f, stream));
}

static void bench_rmsnorm(int32_t rows, int32_t dim)
{
    struct norm_run r = {dev_alloc((size_t)rows * dim * 4),
                         dev_alloc((size_t)rows * dim * 2),
                         dev_alloc((size_t)dim * 2),
                         dev_alloc((size_t)rows * dim * 2),
                         rows,
                         dim};
    /* The residual from the embedding of a random table: f32 values that are not zeros. */
    uint16_t *table = dev_alloc((size_t)rows * dim * 2);
    int32_t *ids = malloc((size_t)rows * sizeof(int32_t));
    for (int32_t i = 0; i < rows; i++)
        ids[i] = i;
    int32_t *d_ids = dev_alloc((size_t)rows * sizeof(int32_t));
    CK(cudaMemcpy(d_ids, ids, (size_t)rows * sizeof(int32_t), cudaMemcpyHostToDevice));
    fill(table, (int64_t)rows * dim, STREAM_AUX);
    PK(cuda_embedding(table, d_ids, rows, dim, r.residual, stream));
    fill(r.x, (int64_t)rows * dim, STREAM_X);
    fill(r.weight, dim, STREAM_W);
    const double ms = time_median_ms(norm_launch, &r);
    char name[64];
    snprintf(name, sizeof(name), "add_rmsnorm_%dx%d", (int)rows, (int)dim);
    json_simple(name, "rmsnorm", rows, ms, (double)rows * dim * (4 + 4 + 2 + 2) + dim * 2.0);
    CK(cudaFree(r.residual));
    CK(cudaFree(r.x));
    CK(cudaFree(r.weight));
    CK(cudaFree(r.out));
    CK(cudaFree(table));
    CK(cudaFree(d_ids));
    free(ids);
}

struct rope_run {
    uint16_t *qkv;
    int32_t *positions;
    float *inv_freq;
    int64_t *slots;
    struct kv_layer_view view;
    int32_t rows, nh, nkv, hd;
};

static void rope_launch(void *ctx, int rep)
{
    (void)rep;
    struct rope_run *r = ctx;
    const int64_t stride = (int64_t)(r->nh + 2 * r->nkv) * r->hd;
    PK(cuda_rope(r->qkv, stride, r->positions, r->inv_freq, r->rows, r->nh + r->nkv, r->hd,
                 stream));
    PK(cuda_reshape_and_cache(&r->view, r->qkv + (int64_t)r->nh * r->hd,
                              r->qkv + (int64_t)(r->nh + r->nkv) * r->hd, stride, r->slots, r->rows,
                              stream));
}

/* RoPE on the fused QKV rows of rows tokens, then their K/V into the pool (one layer). */
static void bench_rope_cache(int32_t rows)
{
    const int32_t nh = 32, nkv = 8, hd = 128, bs = 16;
    struct kv_geometry g = {1, 1, rows / bs + 2, bs, nkv, hd, DTYPE_BF16};
    uint16_t *pool = dev_alloc(kv_pool_bytes(&g));
    const int64_t stride = (int64_t)(nh + 2 * nkv) * hd;
    struct rope_run r = {dev_alloc((size_t)rows * stride * 2),
                         dev_alloc((size_t)rows * sizeof(int32_t)),
                         dev_alloc((size_t)hd / 2 * sizeof(float)),
                         dev_alloc((size_t)rows * sizeof(int64_t)),
                         kv_layer_view_make(&g, pool, 0),
                         rows,
                         nh,
                         nkv,
                         hd};
    fill(r.qkv, (int64_t)rows * stride, STREAM_X);
    int32_t *pos = malloc((size_t)rows * sizeof(int32_t));
    int64_t *slots = malloc((size_t)rows * sizeof(int64_t));
    float inv[64];
    for (int i = 0; i < hd / 2; i++)
        inv[i] = (float)pow(500000.0, -2.0 * i / hd);
    for (int32_t i = 0; i < rows; i++) {
        pos[i] = i;
        slots[i] = bs + i;
    }
    CK(cudaMemcpy(r.positions, pos, (size_t)rows * sizeof(int32_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(r.slots, slots, (size_t)rows * sizeof(int64_t), cudaMemcpyHostToDevice));
    CK(cudaMemcpy(r.inv_freq, inv, sizeof(float) * hd / 2, cudaMemcpyHostToDevice));
    const double ms = time_median_ms(rope_launch, &r);
    char name[64];
    snprintf(name, sizeof(name), "rope_cache_%d", (int)rows);
    /* RoPE reads and writes q and k; the cache write reads k and v and writes them. */
    json_simple(name, "rope_cache", rows, ms,
                (double)rows * hd * 2.0 * (2.0 * (nh + nkv) + 4.0 * nkv));
    CK(cudaFree(pool));
    CK(cudaFree(r.qkv));
    CK(cudaFree(r.positions));
    CK(cudaFree(r.inv_freq));
    CK(cudaFree(r.slots));
    free(pos);
    free(slots);
}

struct silu_run {
    uint16_t *gate_up, *out;
    int32_t rows, inter;
};

static void silu_launch(void *ctx, int rep)
{
    (void)rep;
    struct silu_run *r = ctx;
    PK(cuda_silu_mul(r->gate_up, r->out, r->rows, r->inter, stream));
}

static void bench_silu(int32_t rows, int32_t inter)
{
    struct silu_run r = {dev_alloc((size_t)rows * inter * 4), dev_alloc((size_t)rows * inter * 2),
                         rows, inter};
    fill(r.gate_up, (int64_t)rows * inter * 2, STREAM_X);
    const double ms = time_median_ms(silu_launch, &r);
    char name[64];
    snprintf(name, sizeof(name), "silu_mul_%dx%d", (int)rows, (int)inter);
    json_simple(name, "silu_mul", rows, ms, (double)rows * inter * 6.0);
    CK(cudaFree(r.gate_up));
    CK(cudaFree(r.out));
}

/* The sampler synchronises (tokens come back to the host): host clock, median. */
static void bench_sampler(int32_t rows, int32_t vocab, float temperature, float top_p)
{
    struct cuda_sampler *smp = NULL;
    PK(cuda_sampler_new(vocab, rows, 0, &smp));
    uint16_t *tmp = dev_alloc((size_t)rows * vocab * 2);
    float *logits = dev_alloc((size_t)rows * vocab * 4);
    fill(tmp, (int64_t)rows * vocab, STREAM_X);
    int32_t *ids = malloc((size_t)rows * sizeof(int32_t));
    for (int32_t i = 0; i < rows; i++)
        ids[i] = i;
    int32_t *d_ids = dev_alloc((size_t)rows * sizeof(int32_t));
    CK(cudaMemcpy(d_ids, ids, (size_t)rows * sizeof(int32_t), cudaMemcpyHostToDevice));
    PK(cuda_embedding(tmp, d_ids, rows, vocab, logits, stream)); /* f32 logits in [-1.7, 1.7] */
    CK(cudaStreamSynchronize(stream));
    struct sampling_params *params = malloc((size_t)rows * sizeof(*params));
    uint64_t *oi = calloc((size_t)rows, sizeof(uint64_t));
    int32_t *tokens = malloc((size_t)rows * sizeof(int32_t));
    float *lp = malloc((size_t)rows * sizeof(float));
    for (int32_t i = 0; i < rows; i++) {
        params[i] = sampling_params_default();
        params[i].temperature = temperature;
        params[i].top_p = top_p;
        params[i].seed = (uint64_t)i;
    }
    double t[kReps];
    for (int i = 0; i < kWarmup + kReps; i++) {
        struct timespec a, b;
        clock_gettime(CLOCK_MONOTONIC, &a);
        PK(cuda_sampler_sample(smp, logits, rows, params, oi, NULL, NULL, NULL, NULL, tokens, lp,
                               stream));
        clock_gettime(CLOCK_MONOTONIC, &b);
        if (i >= kWarmup)
            t[i - kWarmup] = (double)(b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) * 1e-6;
    }
    for (int i = 1; i < kReps; i++) /* insertion sort */
        for (int j = i; j > 0 && t[j] < t[j - 1]; j--) {
            double x = t[j];
            t[j] = t[j - 1];
            t[j - 1] = x;
        }
    char name[64];
    snprintf(name, sizeof(name), "sampler_%dx%d_t%g_p%g", (int)rows, (int)vocab, temperature,
             top_p);
    json_simple(name, "sampler", rows, t[kReps / 2], (double)rows * vocab * 4.0);
    cuda_sampler_free(smp);
    CK(cudaFree(tmp));
    CK(cudaFree(logits));
    CK(cudaFree(d_ids));
    free(ids);
    free(params);
    free(oi);
    free(tokens);
    free(lp);
}

int main(int argc, char **argv)
{
    const char *json_path = "kernel_bench.json";
    bool quick = false;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0 && i + 1 < argc)
            json_path = argv[++i];
        else if (strcmp(argv[i], "--quick") == 0)
            quick = true;
        else if (strcmp(argv[i], "--filter") == 0 && i + 1 < argc)
            filter = argv[++i];
        else if (strcmp(argv[i], "--pool") == 0 && i + 1 < argc &&
                 (strcmp(argv[i + 1], "vmm") == 0 || strcmp(argv[i + 1], "malloc") == 0))
            pool_vmm = strcmp(argv[++i], "vmm") == 0;
        else if (strcmp(argv[i], "--copy-rows") == 0 && i + 1 < argc &&
                 (strcmp(argv[i + 1], "0") == 0 || strcmp(argv[i + 1], "4") == 0 ||
                  strcmp(argv[i + 1], "8") == 0 || strcmp(argv[i + 1], "16") == 0)) {
            copy_rows = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--split") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 0 &&
                   atoi(argv[i + 1]) % 64 == 0) {
            decode_split = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--decode-warps") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "4") == 0 || strcmp(argv[i + 1], "8") == 0)) {
            decode_warps = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--decode-ctas") == 0 && i + 1 < argc &&
                   (strcmp(argv[i + 1], "2") == 0 || strcmp(argv[i + 1], "3") == 0)) {
            decode_ctas = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--early-kv") == 0) {
            early_kv = 1;
        } else if (strcmp(argv[i], "--kv-cache-dtype") == 0 && i + 1 < argc) {
            if (dtype_from_kv_cache_name("--kv-cache-dtype", argv[++i], DTYPE_BF16, &kv_dtype) <
                0) {
                fprintf(stderr, "%s: %s\n", argv[0], pagoda_error_detail());
                return 2;
            }
        } else if (strcmp(argv[i], "--lt-algos") == 0 && i + 1 < argc && atoi(argv[i + 1]) >= 1 &&
                   atoi(argv[i + 1]) <= kLtAlgosMax) {
            lt_algos = atoi(argv[++i]);
        } else if (strcmp(argv[i], "--lt-sm-target") == 0 && i + 1 < argc &&
                   atoi(argv[i + 1]) >= 1 && atoi(argv[i + 1]) <= 1024) {
            lt_sm_target = atoi(argv[++i]);
        } else {
            fprintf(stderr, "usage: kernel_bench [--json FILE] [--quick] [--filter SUB[,SUB]] "
                            "[--pool vmm|malloc] [--copy-rows 0|4|8|16] [--split KEYS] "
                            "[--decode-warps 4|8] [--decode-ctas 2|3] [--early-kv] "
                            "[--kv-cache-dtype auto|fp8] [--lt-algos N] "
                            "[--lt-sm-target N]\n");
            return 2;
        }
    }
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
        fprintf(stderr, "kernel_bench: no CUDA device\n");
        return 1;
    }
    struct cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    l2_bytes = (size_t)prop.l2CacheSize;
    sm_count = prop.multiProcessorCount;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    if (cublasLtCreate(&lt_handle) != CUBLAS_STATUS_SUCCESS ||
        cublasCreate(&cublas) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(cublas, stream) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "kernel_bench: cublasCreate failed\n");
        return 1;
    }
    json = fopen(json_path, "w");
    if (json == NULL) {
        perror(json_path);
        return 1;
    }
    fprintf(json, "{\"device\": \"%s\", \"sms\": %d, \"seed\": %llu, \"cases\": [", prop.name,
            prop.multiProcessorCount, (unsigned long long)kBenchSeed);
    printf("kernel_bench on %s (%d SMs, L2 %zu MiB), attention pools by %s\n", prop.name,
           prop.multiProcessorCount, l2_bytes >> 20,
           pool_vmm ? "kv_cuda_pool_create (VMM)" : "cudaMalloc");

    /* Decode, prefill and append: 32 query heads, 8 KV heads, head dim 128, block size 16
     * unless the name says otherwise. */
    const struct attn_case attn[] = {
        {"decode_b64_c4096", "decode", 64, 4096, 1, 32, 8, 128, 16, false, 0, 0},
        {"decode_b64_c4096_shuf", "decode", 64, 4096, 1, 32, 8, 128, 16, true, 0, 0},
        {"decode_b32_c8192", "decode", 32, 8192, 1, 32, 8, 128, 16, false, 0, 0},
        {"decode_b32_c8192_shuf", "decode", 32, 8192, 1, 32, 8, 128, 16, true, 0, 0},
        {"decode_b1_c32768", "decode", 1, 32768, 1, 32, 8, 128, 16, false, 0, 0},
        {"decode_b1_c32768_shuf", "decode", 1, 32768, 1, 32, 8, 128, 16, true, 0, 0},
        {"decode_b256_c512", "decode", 256, 512, 1, 32, 8, 128, 16, true, 0, 0},
        {"decode_b64_c4096_hd64", "decode", 64, 4096, 1, 32, 8, 64, 16, true, 0, 0},
        {"decode_b64_c4096_bs8", "decode", 64, 4096, 1, 32, 8, 128, 8, true, 0, 0},
        {"decode_b64_c4096_bs32", "decode", 64, 4096, 1, 32, 8, 128, 32, true, 0, 0},
        {"decode_b64_c4096_bs64", "decode", 64, 4096, 1, 32, 8, 128, 64, true, 0, 0},
        /* The decode step's attention (issue 15's profile): context 1100 (1024 + 256 tokens at
         * their mean), 32 layers, planned for the step alone and as the worker's decode graph of
         * the batch size (13 sequences replay the graph of 16); one sequence of 32768 keys. */
        {"decode_step_b1_c1100", "decode_step", 1, 1100, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b1_c1100_g1", "decode_step", 1, 1100, 1, 32, 8, 128, 16, false, 32, 1},
        {"decode_step_b13_c1100_g16", "decode_step", 13, 1100, 1, 32, 8, 128, 16, false, 32, 16},
        {"decode_step_b8_c1100", "decode_step", 8, 1100, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b12_c1100", "decode_step", 12, 1100, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b16_c1100", "decode_step", 16, 1100, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b16_c1100_g16", "decode_step", 16, 1100, 1, 32, 8, 128, 16, false, 32, 16},
        {"decode_step_b32_c1100", "decode_step", 32, 1100, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b64_c1100", "decode_step", 64, 1100, 1, 32, 8, 128, 16, false, 32, 0},
        /* the step of 256 at the throughput workload's mean context (issue 15) */
        {"decode_step_b256_c640", "decode_step", 256, 640, 1, 32, 8, 128, 16, false, 32, 0},
        /* and at the contexts its run passes through (129 .. 1152): whether the attention of a
         * step of 256 is linear in the context, so that the run's mean step is the step at its
         * mean context (bench/RESULTS.md, thirty-fifth session) */
        {"decode_step_b256_c128", "decode_step", 256, 128, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b256_c384", "decode_step", 256, 384, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b256_c896", "decode_step", 256, 896, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b256_c1152", "decode_step", 256, 1152, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b64_c1100_g64", "decode_step", 64, 1100, 1, 32, 8, 128, 16, false, 32, 64},
        {"decode_step_b1_c32768", "decode_step", 1, 32768, 1, 32, 8, 128, 16, false, 32, 0},
        {"decode_step_b1_c32768_g1", "decode_step", 1, 32768, 1, 32, 8, 128, 16, false, 32, 1},
        {"prefill_1k", "prefill", 1, 1024, 1024, 32, 8, 128, 16, true, 0, 0},
        {"prefill_4k", "prefill", 1, 4096, 4096, 32, 8, 128, 16, true, 0, 0},
        {"prefill_16k", "prefill", 1, 16384, 16384, 32, 8, 128, 16, true, 0, 0},
        {"append_512_after_4096", "append", 1, 4608, 512, 32, 8, 128, 16, true, 0, 0},
    };
    for (size_t i = 0; i < sizeof(attn) / sizeof(attn[0]); i++) {
        if ((quick && strcmp(attn[i].name, "prefill_16k") == 0) || !wanted(attn[i].name))
            continue;
        bench_attention(&attn[i]);
    }

    /* The linears of the Llama-3-8B shape at decode batches and one prefill chunk. */
    const int32_t rows[] = {1, 8, 16, 32, 64, 256, 8000};
    const struct {
        const char *name;
        int32_t in, out;
    } lin[] = {{"qkv", 4096, 6144},
               {"o", 4096, 4096},
               {"gate_up", 4096, 28672},
               {"down", 14336, 4096},
               {"lm_head", 4096, 128256}};
    for (size_t r = 0; r < sizeof(rows) / sizeof(rows[0]); r++)
        for (size_t i = 0; i < sizeof(lin) / sizeof(lin[0]); i++) {
            if (quick && rows[r] > 64)
                continue;
            char name[64];
            snprintf(name, sizeof(name), "linear_%s_%d", lin[i].name, (int)rows[r]);
            if (wanted(name))
                bench_linear(name, rows[r], lin[i].in, lin[i].out, rows[r] <= 256);
        }

    if (wanted("add_rmsnorm")) {
        bench_rmsnorm(64, 4096);
        bench_rmsnorm(8000, 4096);
    }
    if (wanted("rope_cache")) {
        bench_rope_cache(64);
        bench_rope_cache(8000);
    }
    if (wanted("silu_mul")) {
        bench_silu(64, 14336);
        bench_silu(8000, 14336);
    }
    if (wanted("sampler")) {
        bench_sampler(64, 128256, 0.0f, 1.0f);
        bench_sampler(64, 128256, 1.0f, 0.9f);
        bench_sampler(256, 128256, 1.0f, 0.9f);
    }

    fprintf(json, "\n]}\n");
    fclose(json);
    cublasDestroy(cublas);
    CK(cudaStreamDestroy(stream));
    printf("kernel_bench: %d cases, JSON in %s\n", json_cases, json_path);
    return 0;
}
