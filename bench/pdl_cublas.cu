/* Does cuBLAS's GEMM kernel wait for the kernel ahead of it (griddepcontrol.wait) when a CUDA
 * graph's edge into it is programmatic, and what does such an edge save?
 *
 * For each linear of the decode step at R rows (the worker's calls: cublasGemmEx, or
 * cublasGemmStridedBatchedEx over two slices of the reduction), a graph is captured of a small
 * kernel of ours that writes the GEMM's input x (launched with programmatic stream
 * serialization, it triggers its dependents at once and writes x only after a pause), followed
 * by the GEMM, with the edge between them turned programmatic during the capture
 * (cudaStreamUpdateCaptureDependencies). x is zeroed before each replay. A GEMM that does not
 * wait reads zeros or a mix, and its output differs from the same GEMM run in plain stream order;
 * one that waits gives equal outputs, bit for bit (cuBLAS is deterministic for one shape).
 * Then a graph of LAYERS pairs [small kernel -> GEMM] with plain edges against the same with
 * programmatic ones: replays timed with CUDA events, alternated.
 *
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I. -o pdl_cublas bench/pdl_cublas.cu
 * \ -lcublas -lcuda
 *   ./pdl_cublas [rows (16)] [late (0)] [replays checked (20)]
 *
 * late 1: the writer signals only at its end, by common.cuh's pdl_trigger_late, as the worker's
 * kernels do before a cuBLAS GEMM (kernels/cuda/util.h's late trigger). */
#include <cuda.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "bench/cuda_probe.cuh"

struct shape {
    const char *name;
    int64_t in, out;
    int parts; /* 0: cublasGemmEx, bf16 out; S: S slices, f32 out */
};

static int g_late; /* the writer's `late` */

static void launch_writer(cudaStream_t s, __nv_bfloat16 *x, int64_t n, uint32_t seed,
                          uint64_t pause_ns)
{
    probe_launch_writer(s, x, n, seed, pause_ns, g_late);
}

static void gemm(cublasHandle_t h, const shape &sh, int rows, const __nv_bfloat16 *x,
                 const __nv_bfloat16 *w, void *y)
{
    const float one = 1.0f, zero = 0.0f;
    if (sh.parts == 0) {
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)sh.out, rows, (int)sh.in, &one, w,
                        CUDA_R_16BF, (int)sh.in, x, CUDA_R_16BF, (int)sh.in, &zero, y, CUDA_R_16BF,
                        (int)sh.out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    } else {
        const int64_t k = sh.in / sh.parts;
        CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, (int)sh.out, rows, (int)k, &one,
                                      w, CUDA_R_16BF, (int)sh.in, k, x, CUDA_R_16BF, (int)sh.in, k,
                                      &zero, y, CUDA_R_32F, (int)sh.out, (int64_t)rows * sh.out,
                                      sh.parts, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
}

/* Makes the stream's capture dependencies (the last kernel node) programmatic. */
static void make_programmatic(cudaStream_t s)
{
    cudaStreamCaptureStatus st;
    const cudaGraphNode_t *deps = NULL;
    const cudaGraphEdgeData *ed = NULL;
    size_t n = 0;
    CK(cudaStreamGetCaptureInfo(s, &st, NULL, NULL, &deps, &ed, &n));
    if (st != cudaStreamCaptureStatusActive || n != 1) {
        fprintf(stderr, "capture: status %d, %zu dependencies\n", (int)st, n);
        exit(1);
    }
    cudaGraphNode_t node = deps[0];
    cudaGraphEdgeData e;
    memset(&e, 0, sizeof e);
    e.from_port = cudaGraphKernelNodePortProgrammatic;
    e.type = cudaGraphDependencyTypeProgrammatic;
    CK(cudaStreamUpdateCaptureDependencies(s, &node, &e, 1, cudaStreamSetCaptureDependencies));
}

static void describe(cudaGraph_t g)
{
    size_t n = 0;
    CK(cudaGraphGetNodes(g, NULL, &n));
    std::vector<cudaGraphNode_t> nodes(n);
    CK(cudaGraphGetNodes(g, nodes.data(), &n));
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType t;
        CK(cudaGraphNodeGetType(nodes[i], &t));
        if (t != cudaGraphNodeTypeKernel) {
            printf("    node %zu: type %d\n", i, (int)t);
            continue;
        }
        CUDA_KERNEL_NODE_PARAMS p;
        memset(&p, 0, sizeof p);
        const char *name = "?";
        if (cuGraphKernelNodeGetParams((CUgraphNode)nodes[i], &p) == CUDA_SUCCESS && p.func)
            cuFuncGetName(&name, p.func);
        printf("    node %zu: kernel grid %ux%ux%u block %u smem %u: %s\n", i, p.gridDimX,
               p.gridDimY, p.gridDimZ, p.blockDimX, p.sharedMemBytes, name);
    }
    size_t ne = 0;
    CK(cudaGraphGetEdges(g, NULL, NULL, NULL, &ne));
    std::vector<cudaGraphNode_t> from(ne), to(ne);
    std::vector<cudaGraphEdgeData> ed(ne);
    CK(cudaGraphGetEdges(g, from.data(), to.data(), ed.data(), &ne));
    int prog = 0;
    for (size_t i = 0; i < ne; i++)
        prog += ed[i].type == cudaGraphDependencyTypeProgrammatic;
    printf("    %zu edges, %d programmatic\n", ne, prog);
}

int main(int argc, char **argv)
{
    const int rows = argc > 1 ? atoi(argv[1]) : 16;
    g_late = argc > 2 ? atoi(argv[2]) : 0;
    const int checks = argc > 3 ? atoi(argv[3]) : 20;
    const int LAYERS = 32, REPS = 30;
    const shape shapes[] = {
        {"qkv", 4096, 6144, 0},          {"o_split2", 4096, 4096, 2}, {"gate_up", 4096, 28672, 0},
        {"down_split2", 14336, 4096, 2}, {"o", 4096, 4096, 0},        {"down", 14336, 4096, 0},
    };
    cudaStream_t s;
    cublasHandle_t h;
    probe_cublas_open(&s, &h);
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));

    printf("rows %d, writer triggers %s\n", rows, g_late ? "at its end" : "at its start");
    for (const shape &sh : shapes) {
        const int64_t nx = (int64_t)rows * sh.in, nw = sh.in * sh.out;
        const int64_t ny_bytes = (int64_t)rows * sh.out * (sh.parts ? 4 * sh.parts : 2);
        __nv_bfloat16 *x, *w;
        char *y, *yref;
        CK(cudaMalloc(&x, nx * 2));
        /* a weight per layer: LAYERS copies would be 7.5 GB for gate/up; 4 rotate (each larger
         * than L2 with the others) */
        const int NW = 4;
        CK(cudaMalloc(&w, nw * 2 * NW));
        CK(cudaMalloc(&y, ny_bytes));
        CK(cudaMalloc(&yref, ny_bytes));
        probe_fill<<<1024, 256, 0, s>>>(w, nw * NW, 7);
        CK(cudaGetLastError());

        /* reference, plain stream order */
        launch_writer(s, x, nx, 11, 0);
        CK(cudaStreamSynchronize(s));
        gemm(h, sh, rows, x, w, yref);
        CK(cudaStreamSynchronize(s));
        std::vector<char> href(ny_bytes), hy(ny_bytes);
        CK(cudaMemcpy(href.data(), yref, ny_bytes, cudaMemcpyDeviceToHost));

        /* the check graph: writer (pause 30 us) -> programmatic -> GEMM */
        cudaGraph_t g;
        cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
        launch_writer(s, x, nx, 11, 30000);
        make_programmatic(s);
        gemm(h, sh, rows, x, w, y);
        CK(cudaStreamEndCapture(s, &g));
        printf("%s (%lld x %lld, parts %d): check graph\n", sh.name, (long long)sh.out,
               (long long)sh.in, sh.parts);
        describe(g);
        CK(cudaGraphInstantiate(&ge, g, 0));
        int bad = 0;
        for (int r = 0; r < checks; r++) {
            CK(cudaMemsetAsync(x, 0, nx * 2, s));
            CK(cudaMemsetAsync(y, 0xff, ny_bytes, s));
            CK(cudaGraphLaunch(ge, s));
            CK(cudaStreamSynchronize(s));
            CK(cudaMemcpy(hy.data(), y, ny_bytes, cudaMemcpyDeviceToHost));
            bad += memcmp(hy.data(), href.data(), ny_bytes) != 0;
        }
        printf("  programmatic edge into cuBLAS, writer triggering %s: %d of %d replays differ "
               "from stream order\n",
               g_late ? "at its end (fence, barrier)" : "at its start", bad, checks);
        CK(cudaGraphExecDestroy(ge));
        CK(cudaGraphDestroy(g));

        /* timing graphs: LAYERS x [writer (no pause) -> GEMM], plain and programmatic */
        cudaGraphExec_t tg[2];
        for (int p = 0; p < 2; p++) {
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < LAYERS; l++) {
                launch_writer(s, x, nx, 11 + l, 0);
                if (p)
                    make_programmatic(s);
                gemm(h, sh, rows, x, w + (l % NW) * nw, y);
            }
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&tg[p], g, 0));
            CK(cudaGraphDestroy(g));
        }
        double sum[2] = {0, 0};
        float best[2] = {1e9f, 1e9f};
        for (int r = 0; r < REPS + 3; r++) {
            for (int p = 0; p < 2; p++) {
                CK(cudaEventRecord(e0, s));
                CK(cudaGraphLaunch(tg[p], s));
                CK(cudaEventRecord(e1, s));
                CK(cudaEventSynchronize(e1));
                float ms;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (r >= 3) {
                    sum[p] += ms;
                    best[p] = ms < best[p] ? ms : best[p];
                }
            }
        }
        const double us_plain = sum[0] / REPS * 1000 / LAYERS,
                     us_prog = sum[1] / REPS * 1000 / LAYERS;
        printf("  us a [writer -> GEMM] pair: plain %.2f (best %.2f), programmatic %.2f (best "
               "%.2f), saved %.2f\n",
               us_plain, best[0] * 1000 / LAYERS, us_prog, best[1] * 1000 / LAYERS,
               us_plain - us_prog);
        for (int p = 0; p < 2; p++)
            CK(cudaGraphExecDestroy(tg[p]));
        CK(cudaFree(x));
        CK(cudaFree(w));
        CK(cudaFree(y));
        CK(cudaFree(yref));
    }
    printf("done\n");
    return 0;
}
