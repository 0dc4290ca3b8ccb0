/* The CUDA backend's decode graphs: the graph a step replays (cuda_be_graph_of), and their
 * capture at open (cuda_be_capture_graphs), one per batch size, with the fallback to steps
 * launched one by one when a capture fails. */
#include "worker/cuda_backend_impl.h"
#include "common/error.h"
#include "common/log.h"
#include "kernels/cuda/attention.h"
#include "model/model_budget.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

/* The graph a step replays: the smallest batch size of at least its sequences when every
 * sequence decodes one token (query_len 1) and graphs are on; else -1 (eager). */
int32_t cuda_be_graph_of(const struct cuda_backend *b, const struct fwd_batch *batch)
{
    const int32_t n = batch->num_seqs;
    /* More logits rows than sequences (backend.h allows repeats) would outnumber the graph's
     * rows: such a step runs eagerly. */
    if (b->num_graphs == 0 || n < 1 || batch->num_tokens != n || batch->num_logits > n ||
        n > b->graph_batch[b->num_graphs - 1])
        return -1;
    for (int32_t i = 0; i < n; i++)
        if (batch->query_start[i + 1] - batch->query_start[i] != 1)
            return -1;
    int32_t g = 0;
    while (b->graph_batch[g] < n)
        g++;
    return g;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* PAGODA_CUDA_GRAPH_FAIL_AT=<batch>, for tests only (tests/gpu/test_cuda_graph_fallback.c): the
 * capture of the decode graph of that batch size fails as a real capture can fail, through an
 * operation a capturing stream refuses (a synchronization, which invalidates the capture), so
 * that the fallback to launch-by-launch steps is exercised on the device. Read once per open;
 * 0 (unset, or not a batch size of 1 .. MODEL_BUDGET_GRAPH_BATCH_MAX, which is ignored with a
 * warning): no fault. */
#define CUDA_GRAPH_FAIL_AT_ENV "PAGODA_CUDA_GRAPH_FAIL_AT"

static int32_t graph_fail_at(void)
{
    const char *v = getenv(CUDA_GRAPH_FAIL_AT_ENV);
    if (v == NULL || *v == '\0')
        return 0;
    char *end = NULL;
    long n = strtol(v, &end, 10);
    if (*end != '\0' || n < 1 || n > MODEL_BUDGET_GRAPH_BATCH_MAX) {
        log_warn("cuda: %s=%s ignored: a batch size of 1 .. %d is expected (a test's fault "
                 "injection)",
                 CUDA_GRAPH_FAIL_AT_ENV, v, MODEL_BUDGET_GRAPH_BATCH_MAX);
        return 0;
    }
    log_warn("cuda: %s=%ld: the capture of the decode graph of batch %ld will fail (a test's "
             "fault injection)",
             CUDA_GRAPH_FAIL_AT_ENV, n, n);
    return (int32_t)n;
}

/* Captures, instantiates and replays once the graph of a decode step of pad sequences into
 * b->graph[i]: the attention planned for pad padding sequences (the layout and grid every step of
 * that size will have), the metadata staged, then cuda_be_forward_layers captured from the stream,
 * and one replay (padding only: it writes no K/V). fail: the fault of PAGODA_CUDA_GRAPH_FAIL_AT.
 * Adds the device memory the graph took to *used (cudaMemGetInfo before and after). Returns 0
 * or an error with a detail; on an error the capture may still be open on the stream, or have
 * left the stream's last error set (graphs_abandon undoes both). */
static int capture_one(struct cuda_backend *b, int32_t i, int32_t pad, int fail, size_t *used)
{
    static const int32_t zero = 0;
    const struct attention_batch none = {.query_start = &zero, .max_blocks_per_seq = 1};
    const struct fwd_batch empty = {.query_start = &zero, .max_blocks_per_seq = 1};
    size_t free0 = 0, free1 = 0, unused = 0;
    cudaError_t e;
    if ((e = cudaStreamSynchronize(b->stream)) != cudaSuccess ||
        (e = cudaMemGetInfo(&free0, &unused)) != cudaSuccess)
        return cuda_be_fail(e, "before the capture");
    int rc = cuda_attention_plan_graph(b->plan, &none, pad, b->stream);
    if (rc == 0)
        rc = cuda_be_stage_step(b, STAGE_SYNC, &empty, pad, NULL, 0);
    if (rc != 0)
        return rc;
    if ((e = cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal)) != cudaSuccess)
        return cuda_be_fail(e, "cudaStreamBeginCapture");
    b->capturing = 1;
    rc = cuda_be_forward_layers(b, pad, pad);
    b->capturing = 0;
    b->late_node = NULL;
    if (rc == 0 && fail) {
        /* Refused while the stream captures, and the capture is invalidated: cudaStreamEndCapture
         * below fails as it would after a launch the capture cannot record. */
        e = cudaStreamSynchronize(b->stream);
        rc = cuda_be_fail(e != cudaSuccess ? e : cudaErrorStreamCaptureUnsupported,
                          "a synchronization while capturing (" CUDA_GRAPH_FAIL_AT_ENV ")");
    }
    cudaGraph_t graph = NULL;
    e = cudaStreamEndCapture(b->stream, &graph);
    if (rc == 0 && e != cudaSuccess)
        rc = cuda_be_fail(e, "cudaStreamEndCapture");
    if (rc == 0 && (e = cudaGraphInstantiate(&b->graph[i], graph, 0)) != cudaSuccess)
        rc = cuda_be_fail(e, "cudaGraphInstantiate");
    if (graph != NULL)
        cudaGraphDestroy(graph);
    if (rc != 0)
        return rc;
    b->graph_batch[i] = pad;
    b->num_graphs = i + 1;
    if ((e = cudaGraphLaunch(b->graph[i], b->stream)) != cudaSuccess ||
        (e = cudaStreamSynchronize(b->stream)) != cudaSuccess ||
        (e = cudaMemGetInfo(&free1, &unused)) != cudaSuccess)
        return cuda_be_fail(e, "replaying the graph");
    *used = free0 > free1 ? free0 - free1 : 0;
    return 0;
}

/* After a failed capture_one: ends a capture still open on the stream (its graph dropped),
 * clears the last error the capture left (capture errors are not sticky: the context stays
 * usable), destroys every graph captured so far, and checks that the stream still runs work.
 * Returns 0 when steps can run launch by launch, or PAGODA_ECUDA when the device itself failed
 * (a sticky error, which eager steps would meet too). */
static int graphs_abandon(struct cuda_backend *b)
{
    enum cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(b->stream, &status) == cudaSuccess &&
        status != cudaStreamCaptureStatusNone) {
        cudaGraph_t graph = NULL;
        (void)cudaStreamEndCapture(b->stream, &graph);
        if (graph != NULL)
            cudaGraphDestroy(graph);
    }
    (void)cudaGetLastError();
    for (int32_t i = 0; i < b->num_graphs; i++)
        cudaGraphExecDestroy(b->graph[i]);
    b->num_graphs = 0;
    cudaError_t e = cudaStreamIsCapturing(b->stream, &status);
    if (e == cudaSuccess && status != cudaStreamCaptureStatusNone)
        e = cudaErrorStreamCaptureUnmatched;
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(b->stream);
    if (e == cudaSuccess)
        e = cudaGetLastError();
    return e == cudaSuccess ? 0 : cuda_be_fail(e, "the stream after a failed graph capture");
}

/* Captures the graph of a decode step of each batch size of model_budget_graph_batches (when
 * opt.cuda_graphs is on), through capture_one. Logs the time and the device memory the graphs
 * took; the memory budget counts MODEL_BUDGET_GRAPH_BYTES for each (model/model_budget.h).
 *
 * A capture that fails does not fail the open (the supervisor would restart the worker into
 * the same failure): the graphs are given up (graphs_abandon frees those captured before), a
 * warning names the batch size and the error, base.graph_capture_failures counts it, and every
 * step runs launch by launch, as with cuda_graphs off. Only a device that no longer runs work
 * afterwards fails the open. */
int cuda_be_capture_graphs(struct cuda_backend *b)
{
    /* A tensor-parallel step's collectives wait on the host (cuda_tp.h): not capturable. Such
     * a backend runs every step launch by launch (the budget still counts the graphs: an
     * over-estimate). */
    if (!b->opt.cuda_graphs || b->opt.comm != NULL)
        return 0;
    const int32_t fail_at = graph_fail_at();
    int32_t sizes[MODEL_BUDGET_GRAPHS_MAX];
    const int32_t count =
        model_budget_graph_batches(b->opt.limits.max_num_tokens, b->opt.limits.max_num_seqs, sizes);
    const double t0 = now_ms();
    size_t total = 0, largest = 0;
    for (int32_t i = 0; i < count; i++) {
        const int32_t pad = sizes[i];
        size_t used = 0;
        int rc = capture_one(b, i, pad, pad == fail_at, &used);
        if (rc != 0) {
            char detail[512];
            snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
            const int32_t captured = b->num_graphs;
            int arc = graphs_abandon(b);
            if (arc != 0)
                return pagoda_error_set(arc, "capturing the decode graph of batch %d (%s), then %s",
                                        (int)pad, detail, pagoda_error_detail());
            /* A programmatic edge may join only kernels: should cuBLAS put another node first
             * for some shape, the graphs are captured again without the late trigger. */
            if (b->opt.pdl_late_max_rows > 0 && pad != fail_at) {
                log_warn("cuda: capturing the decode graph of batch %d failed: %s; capturing "
                         "every graph again without the late trigger into cuBLAS",
                         (int)pad, detail);
                b->opt.pdl_late_max_rows = 0;
                total = largest = 0;
                i = -1;
                continue;
            }
            b->base.graph_capture_failures++;
            log_warn("cuda: capturing the decode graph of batch %d failed: %s; every step runs "
                     "without CUDA graphs, launch by launch (%d graphs captured, freed)",
                     (int)pad, detail, (int)captured);
            return 0;
        }
        total += used;
        largest = used > largest ? used : largest;
    }
    const double mib = 1024.0 * 1024.0;
    log_info("cuda: %d decode graphs (batch 1 .. %d) captured in %.0f ms, %.1f MiB of device "
             "memory (%.1f MiB the largest; the budget counts %.0f MiB each)",
             (int)count, count > 0 ? (int)sizes[count - 1] : 0, now_ms() - t0, (double)total / mib,
             (double)largest / mib, (double)MODEL_BUDGET_GRAPH_BYTES / mib);
    if (largest > MODEL_BUDGET_GRAPH_BYTES)
        log_warn("cuda: a decode graph took %.1f MiB, above the %.0f MiB the memory budget "
                 "counts (model/model_budget.h)",
                 (double)largest / mib, (double)MODEL_BUDGET_GRAPH_BYTES / mib);
    return 0;
}
