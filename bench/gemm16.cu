/* kernels/cuda/linear_tma's GEMM (a decode step's linears at 16 rows or fewer) against cuBLAS,
 * the design bench/RESULTS.md (issue 15, twenty-third session) names as what is left: weights
 * streamed by the tensor copy engine (TMA) into a deep ring of shared memory, as cuBLAS's
 * 128 x 16 tiles do, rather than into registers as our four earlier GEMVs did, and programmatic
 * dependent launch on both sides (cuBLAS's kernels neither wait nor signal:
 * bench/pdl_cublas.cu).
 *
 * Built with the project (build-gpu/bin/gemm16):  gemm16 [rows (16)]   (also rows 1 and 5:
 * x's box then runs past x)
 *
 * What it prints, per linear of the 8B shape in the forms the worker would call (QKV and gate/up
 * whole in bf16, O and down in two f32 slices, the LM head), per tile (64, 128 weight rows) and
 * without and with stream-K (cuda_tma_set_stream_k always; sk 1):
 * the largest difference from cuBLAS's f32 product (the whole, or its slices by
 * cublasGemmStridedBatchedEx) over the largest magnitude; microseconds alone (the median of 30
 * samples of 20 launches back to back, weight copies rotated past L2) against cuBLAS; then a
 * graph of 32 [small writer kernel -> GEMM] pairs, ours launched with PDL behind a writer that
 * signals right after its wait, against cuBLAS behind the same writer (a plain edge):
 * microseconds a pair. */
#include <cublas_v2.h>
#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

#include "bench/cuda_probe.cuh"
#include "kernels/cuda/linear_tma.h"

namespace
{

void cublas_gemm(cublasHandle_t h, const __nv_bfloat16 *x, const __nv_bfloat16 *w, void *y,
                 int rows, int k, int n, int splits, bool f32)
{
    const float one = 1.0f, zero = 0.0f;
    if (splits == 1)
        CB(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, w, CUDA_R_16BF, k, x,
                        CUDA_R_16BF, k, &zero, y, f32 ? CUDA_R_32F : CUDA_R_16BF, n,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    else
        CB(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k / splits, &one, w,
                                      CUDA_R_16BF, k, k / splits, x, CUDA_R_16BF, k, k / splits,
                                      &zero, y, CUDA_R_32F, n, (long long)rows * n, splits,
                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

float bf16_host(__nv_bfloat16 v)
{
    uint16_t b;
    memcpy(&b, &v, 2);
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The median over reps samples of the time of `per` calls of f back to back, over per: the
 * calls are enqueued ahead of the device, so that the host's launch cost is not timed. */
template <typename F> double median_us(cudaStream_t s, int reps, int per, F &&f)
{
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    std::vector<float> t;
    for (int r = 0; r < reps + 5; r++) {
        CK(cudaEventRecord(e0, s));
        for (int i = 0; i < per; i++)
            f(r * per + i);
        CK(cudaEventRecord(e1, s));
        CK(cudaEventSynchronize(e1));
        float ms;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        if (r >= 5)
            t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
    return t[t.size() / 2] * 1000.0 / per;
}

} // namespace

int main(int argc, char **argv)
{
    const int rows = argc > 1 ? atoi(argv[1]) : 16;
    if (rows < 1 || rows > CUDA_TMA_MAX_ROWS) {
        fprintf(stderr, "gemm16: rows 1..%d\n", CUDA_TMA_MAX_ROWS);
        return 2;
    }
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaStream_t s;
    cublasHandle_t h;
    probe_cublas_open(&s, &h);
    struct cuda_tma *tma = NULL;
    if (cuda_tma_new(&tma) != 0) {
        fprintf(stderr, "gemm16: %s\n", pagoda_error_detail());
        return 1;
    }

    struct shape {
        const char *name;
        int k, n, splits;
    };
    /* the worker's forms: QKV and gate/up whole (bf16 out), O and down in two slices (f32) */
    const shape shapes[] = {{"qkv", 4096, 6144, 1},
                            {"o_s2", 4096, 4096, 2},
                            {"gate_up", 4096, 28672, 1},
                            {"down_s2", 14336, 4096, 2},
                            {"lm_head", 4096, 128256, 1}};
    printf("gemm16: %d rows, %d SMs\n", rows, sms);
    printf("%-8s %4s %2s %8s %10s %10s %8s %12s %12s %8s\n", "linear", "tile", "sk", "max_err",
           "ours_us", "cublas_us", "ratio", "chain_ours", "chain_cublas", "ratio");
    int wrong = 0;
    for (const shape &sh : shapes) {
        const int64_t nw = (int64_t)sh.k * sh.n;
        const int copies = (int)std::max<int64_t>(2, (int64_t)(200 << 20) / (nw * 2) + 1);
        __nv_bfloat16 *x, *w;
        void *y, *yref;
        const size_t ybytes = (size_t)rows * sh.n * (sh.splits > 1 ? 4 * sh.splits : 2);
        CK(cudaMalloc(&x, (size_t)rows * sh.k * 2));
        CK(cudaMalloc(&w, (size_t)nw * 2 * copies));
        CK(cudaMalloc(&y, ybytes));
        CK(cudaMalloc(&yref, (size_t)rows * sh.n * 4 * sh.splits));
        probe_fill<<<1024, 256, 0, s>>>(w, nw * copies, 7);
        probe_launch_writer(s, x, (int64_t)rows * sh.k, 11, 0, 0);
        CK(cudaStreamSynchronize(s));
        const uint16_t *xu = reinterpret_cast<const uint16_t *>(x);
        auto ours = [&](int c) {
            if (cuda_tma_linear(tma, xu, reinterpret_cast<const uint16_t *>(w + (size_t)c * nw), y,
                                rows, sh.k, sh.n, sh.splits, s) != 0) {
                fprintf(stderr, "gemm16: %s\n", pagoda_error_detail());
                exit(1);
            }
        };
        /* the reference in f32: the whole product (one slice), or cuBLAS's own slices */
        cublas_gemm(h, x, w, yref, rows, sh.k, sh.n, sh.splits, true);
        const size_t nref = (size_t)rows * sh.n * sh.splits;
        std::vector<float> ref(nref);
        CK(cudaMemcpyAsync(ref.data(), yref, nref * 4, cudaMemcpyDeviceToHost, s));
        CK(cudaStreamSynchronize(s));
        const double t_cub = median_us(s, 30, 20, [&](int r) {
            cublas_gemm(h, x, w + (size_t)(r % copies) * nw, y, rows, sh.k, sh.n, sh.splits, false);
        });
        /* in a chain: a graph of 32 [writer -> GEMM] pairs, microseconds a pair */
        auto chain_us = [&](bool use_ours) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            cuda_set_pdl(use_ours);
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < 32; l++) {
                probe_launch_writer(s, x, (int64_t)rows * sh.k, 11 + l, 0, 0);
                if (use_ours)
                    ours(l % copies);
                else
                    cublas_gemm(h, x, w + (size_t)(l % copies) * nw, y, rows, sh.k, sh.n, sh.splits,
                                false);
            }
            CK(cudaStreamEndCapture(s, &g));
            cuda_set_pdl(0);
            CK(cudaGraphInstantiate(&ge, g, 0));
            const double us = median_us(s, 20, 1, [&](int) { CK(cudaGraphLaunch(ge, s)); }) / 32;
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
            return us;
        };
        const double chain_cub = chain_us(false);
        for (int sk : {CUDA_TMA_SK_OFF, CUDA_TMA_SK_ALWAYS})
            for (int tile : {64, 128}) {
                if (sh.n % tile != 0)
                    continue;
                if (cuda_tma_set_tile(tma, tile) != 0 || cuda_tma_set_stream_k(tma, sk) != 0) {
                    fprintf(stderr, "gemm16: %s\n", pagoda_error_detail());
                    return 1;
                }
                /* check: ours against cuBLAS's f32 product, on the x it was taken from (the chains
                 * write x over) */
                probe_launch_writer(s, x, (int64_t)rows * sh.k, 11, 0, 0);
                CK(cudaMemsetAsync(y, 0xff, ybytes, s));
                ours(0);
                std::vector<uint8_t> got(ybytes);
                CK(cudaMemcpyAsync(got.data(), y, ybytes, cudaMemcpyDeviceToHost, s));
                CK(cudaStreamSynchronize(s));
                double maxd = 0, maxv = 0;
                for (size_t i = 0; i < nref; i++) {
                    const double v = sh.splits == 1
                                         ? bf16_host(((const __nv_bfloat16 *)got.data())[i])
                                         : ((const float *)got.data())[i];
                    maxd = std::max(maxd, fabs(v - ref[i]));
                    maxv = std::max(maxv, (double)fabs(ref[i]));
                    if (std::isnan(v))
                        maxd = INFINITY;
                }
                const double err = maxd / (maxv > 0 ? maxv : 1);
                const bool ok = err < (sh.splits == 1 ? 1e-2 : 1e-4);
                wrong += !ok;
                const int got_tile = cuda_tma_last_tile(tma);
                /* alone, weight copies rotated (without PDL) */
                const double t_ours = median_us(s, 30, 20, [&](int r) { ours(r % copies); });
                const double chain_ours = ok ? chain_us(true) : 0;
                printf("%-8s %4d %2d %8.1e %10.2f %10.2f %8.3f %12.2f %12.2f %8.3f%s\n", sh.name,
                       got_tile, cuda_tma_last_stream_k(tma), err, t_ours, t_cub, t_cub / t_ours,
                       chain_ours, chain_cub, ok ? chain_cub / chain_ours : 0.0,
                       ok ? "" : "  WRONG (not timed in a chain)");
            }
        CK(cudaFree(x));
        CK(cudaFree(w));
        CK(cudaFree(y));
        CK(cudaFree(yref));
    }
    cuda_tma_free(tma);
    return wrong ? 1 : 0;
}
