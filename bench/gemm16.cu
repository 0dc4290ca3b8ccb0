/* A GEMM of ours for the decode step's linears at 16 rows or fewer, the design bench/RESULTS.md
 * (issue 15, twenty-third session) names as what is left: weights streamed by the tensor copy
 * engine (TMA) into a deep ring of shared memory, as cuBLAS's 128 x 16 tiles do, rather than
 * into registers as our four earlier GEMVs did, and programmatic dependent launch on both sides
 * (cuBLAS's kernels neither wait nor signal: bench/pdl_cublas.cu).
 *
 * NOT YET RUN: written and compiled in the twenty-third session after its device time was
 * spent. The first call of a session should run it; it checks itself against cublasGemmEx
 * before it times anything.
 *
 *   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -I. -o gemm16 bench/gemm16.cu \
 *        -lcublas -lcuda
 *   ./gemm16 [rows (16)] [stages (12)]     (also rows 1 and 5: x's box then runs past x)
 *
 * The kernel: y[m][n] = sum_k x[m][k] w[n][k] (bf16 in, f32 accumulation) for m < rows <= 16.
 * A unit of work is a tile of BN = 128 weight rows (features) over one of S slices of the
 * reduction; S = 1 writes y in bf16, S > 1 writes each slice's f32 product (the worker's
 * split_parts layout, parts[s][m][n], for the RMSNorm behind to add). One CTA per SM, persistent
 * over its units (blockIdx.x, + gridDim.x, ...), so that the ring runs on from one unit into
 * the next. Warp 4's elected lane feeds the ring: per stage a 128 x 64 box of w and a 16 x 64
 * box of x (rows past `rows` filled with zeros by the copy engine), both 128-byte swizzled, on
 * one mbarrier; warps 0-3 each multiply 32 of the tile's features by the 16 rows (m16n8k16,
 * the weights the A operand by ldmatrix, x the B operand by ldmatrix) and give the stage back.
 * The weights of the first stages are requested before griddepcontrol.wait (they are no
 * kernel's output), x after it.
 *
 * What it prints: per linear, the largest difference from cuBLAS's f32 product (the whole, or
 * its slices by cublasGemmStridedBatchedEx) over the largest magnitude; then microseconds alone
 * (the median of 30 samples of 20 launches back to back, weight copies rotated past L2)
 * against cuBLAS; then a graph of 32 [small writer kernel -> GEMM] pairs, ours launched with
 * PDL behind a writer that signals right after its wait, against cuBLAS behind the same writer
 * (a plain edge): microseconds a pair. */
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
#include "kernels/cuda/async_copy.cuh"

namespace
{

constexpr int BN = 128;       /* weight rows (features) a tile */
constexpr int BK = 64;        /* reduction columns a stage: 128 bytes a row */
constexpr int MR = 16;        /* input rows, at most */
constexpr int kConsumers = 4; /* warps 0-3: 32 features each */
constexpr int kThreads = 32 * (kConsumers + 1);
constexpr uint32_t kWBytes = BN * BK * 2; /* 16 KiB */
constexpr uint32_t kXBytes = MR * BK * 2; /* 2 KiB */
constexpr uint32_t kStageBytes = kWBytes + kXBytes;

__device__ __forceinline__ void tma_2d(void *dst, const CUtensorMap *map, int32_t c0, int32_t c1,
                                       uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
                 "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
                 "l"(map), "r"(c0), "r"(c1), "r"(smem_addr(bar))
                 : "memory");
}

/* The byte offset of 16-byte chunk `chunk` of row `row` in a 128-byte-swizzled tile of
 * 128-byte rows (the tile 1024-byte aligned): chunk c of row r sits at c ^ (r % 8). */
__device__ __forceinline__ uint32_t swz(int row, int chunk)
{
    return (uint32_t)(row * 128 + ((chunk ^ (row & 7)) << 4));
}

struct gemm_args {
    int32_t rows, k, n; /* x [rows][k], w [n][k] */
    int32_t splits;     /* S: slices of k */
    int32_t kstages;    /* k / S / BK: stages a unit */
    int32_t units;      /* n / BN * S */
    int32_t stages;     /* ring depth */
    __nv_bfloat16 *y;   /* S == 1: [rows][n] bf16 */
    float *parts;       /* S > 1: [S][rows][n] f32 */
};

__global__ void __launch_bounds__(kThreads, 1)
    gemm16_kernel(const __grid_constant__ CUtensorMap wmap,
                  const __grid_constant__ CUtensorMap xmap, gemm_args a)
{
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = reinterpret_cast<uint8_t *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + (size_t)a.stages * kStageBytes);
    uint64_t *empty = full + a.stages;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int S = a.stages;
    /* this CTA's units: blockIdx.x, blockIdx.x + gridDim.x, ... */
    const int32_t my_units = blockIdx.x < (uint32_t)a.units
                                 ? (a.units - 1 - (int32_t)blockIdx.x) / (int32_t)gridDim.x + 1
                                 : 0;
    const int32_t iters = my_units * a.kstages;

    if (tid == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(&full[s], 1);
            mbar_init(&empty[s], kConsumers);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    if (warp == kConsumers) {
        if (lane == 0) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(&wmap) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"(&xmap) : "memory");
            auto coords = [&](int32_t it, int32_t &kc, int32_t &nc) {
                const int32_t u = (int32_t)blockIdx.x + (it / a.kstages) * (int32_t)gridDim.x;
                const int32_t tile = u / a.splits, split = u % a.splits;
                kc = (split * a.kstages + it % a.kstages) * BK;
                nc = tile * BN;
            };
            /* The first stages' weights before the wait: no kernel writes them. */
            const int32_t early = iters < S ? iters : S;
            for (int32_t it = 0; it < early; it++) {
                int32_t kc, nc;
                coords(it, kc, nc);
                uint8_t *st = smem + (size_t)it * kStageBytes;
                mbar_arrive_expect_tx(&full[it], kStageBytes);
                tma_2d(st, &wmap, kc, nc, &full[it]);
            }
            asm volatile("griddepcontrol.wait;" ::: "memory");
            for (int32_t it = 0; it < early; it++) {
                int32_t kc, nc;
                coords(it, kc, nc);
                tma_2d(smem + (size_t)it * kStageBytes + kWBytes, &xmap, kc, 0, &full[it]);
            }
            for (int32_t it = early; it < iters; it++) {
                const int s = it % S;
                const uint32_t phase = (uint32_t)(it / S) & 1u;
                mbar_wait(&empty[s], phase ^ 1u); /* the consumers gave stage s back */
                int32_t kc, nc;
                coords(it, kc, nc);
                uint8_t *st = smem + (size_t)s * kStageBytes;
                mbar_arrive_expect_tx(&full[s], kStageBytes);
                tma_2d(st, &wmap, kc, nc, &full[s]);
                tma_2d(st + kWBytes, &xmap, kc, 0, &full[s]);
            }
        }
        /* (only a CTA's first launch_dependents counts: with lanes 1-31 here, every CTA
         * signals at its start; the kernels behind it wait for the whole grid anyway) */
        asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
        return;
    }

    /* Consumers: warp w multiplies features w * 32 .. + 31 of the tile. */
    asm volatile("griddepcontrol.wait;" ::: "memory"); /* y may still be read by the kernel ahead */
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    const int m = lane >> 3, r8 = lane & 7;
    const int g = lane >> 2, c2 = 2 * (lane & 3);
    int32_t it = 0;
    for (int32_t j = 0; j < my_units; j++) {
        const int32_t u = (int32_t)blockIdx.x + j * (int32_t)gridDim.x;
        const int32_t tile = u / a.splits, split = u % a.splits;
        float acc[2][2][4] = {};
        for (int32_t ks = 0; ks < a.kstages; ks++, it++) {
            const int s = it % S;
            mbar_wait(&full[s], (uint32_t)(it / S) & 1u);
            const uint32_t wbase = smem_addr(smem + (size_t)s * kStageBytes);
            const uint32_t xbase = wbase + kWBytes;
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                uint32_t af[2][4], bf[4];
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const int row = warp * 32 + mt * 16 + (m & 1) * 8 + r8;
                    ldsm_x4(af[mt], wbase + swz(row, kk * 2 + (m >> 1)));
                }
                {
                    const int row = (m >> 1) * 8 + r8;
                    ldsm_x4(bf, xbase + swz(row, kk * 2 + (m & 1)));
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma_bf16(acc[mt][0], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[0], bf[1]);
                    mma_bf16(acc[mt][1], af[mt][0], af[mt][1], af[mt][2], af[mt][3], bf[2], bf[3]);
                }
            }
            __syncwarp();
            if (lane == 0)
                mbar_arrive(&empty[s]);
        }
        /* acc[mt][nt]: C[feature][input row], features mt * 16 + g (+8 for elements 2, 3),
         * input rows nt * 8 + c2 (+1 for odd elements). */
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int nt = 0; nt < 2; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int32_t f = tile * BN + warp * 32 + mt * 16 + g + (e >> 1) * 8;
                    const int32_t r = nt * 8 + c2 + (e & 1);
                    if (r >= a.rows)
                        continue;
                    if (a.splits == 1)
                        a.y[(int64_t)r * a.n + f] = __float2bfloat16(acc[mt][nt][e]);
                    else
                        a.parts[((int64_t)split * a.rows + r) * a.n + f] = acc[mt][nt][e];
                }
    }
}

/* ---- host ---- */

typedef CUresult (*encode_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                              const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                              const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                              CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

CUtensorMap make_map(const void *base, int64_t inner, int64_t outer, int box_outer)
{
    CUtensorMap map;
    const cuuint64_t dims[2] = {(cuuint64_t)inner, (cuuint64_t)outer};
    const cuuint64_t strides[1] = {(cuuint64_t)inner * 2};
    const cuuint32_t box[2] = {(cuuint32_t)BK, (cuuint32_t)box_outer};
    const cuuint32_t estr[2] = {1, 1};
    CUresult r = cuTensorMapEncodeTiled(
        &map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void *>(base), dims, strides, box,
        estr, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
        CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
        fprintf(stderr, "cuTensorMapEncodeTiled: %d\n", (int)r);
        exit(1);
    }
    return map;
}

struct plan {
    CUtensorMap wmap, xmap;
    gemm_args a;
    int grid;
    size_t smem;
};

plan make_plan(const __nv_bfloat16 *x, const __nv_bfloat16 *w, void *y, int rows, int k, int n,
               int splits, int stages, int sms)
{
    if (n % BN != 0 || splits < 1 || k % (splits * BK) != 0) {
        fprintf(stderr, "gemm16: n %d (a multiple of %d), k %d in %d slices of multiples of %d\n",
                n, BN, k, splits, BK);
        exit(2);
    }
    plan p;
    p.wmap = make_map(w, k, n, BN);
    p.xmap = make_map(x, k, rows, MR);
    p.a.rows = rows;
    p.a.k = k;
    p.a.n = n;
    p.a.splits = splits;
    p.a.kstages = k / splits / BK;
    p.a.units = n / BN * splits;
    p.a.stages = stages;
    p.a.y = splits == 1 ? (__nv_bfloat16 *)y : nullptr;
    p.a.parts = splits > 1 ? (float *)y : nullptr;
    p.grid = std::min(p.a.units, sms);
    p.smem = 1024 + (size_t)stages * kStageBytes + 2 * stages * sizeof(uint64_t);
    return p;
}

void launch(const plan &p, cudaStream_t s, bool pdl)
{
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(p.grid);
    cfg.blockDim = dim3(kThreads);
    cfg.dynamicSmemBytes = p.smem;
    cfg.stream = s;
    cfg.attrs = attr;
    cfg.numAttrs = pdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cfg, gemm16_kernel, p.wmap, p.xmap, p.a));
}

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
    const int stages = argc > 2 ? atoi(argv[2]) : 12;
    if (rows < 1 || rows > MR || stages < 2 ||
        1024 + (size_t)stages * kStageBytes + 16 * stages > 227 * 1024) {
        fprintf(stderr, "gemm16: rows 1..16, stages 2..12\n");
        return 2;
    }
    int dev = 0, sms = 0;
    CK(cudaGetDevice(&dev));
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    CK(cudaFuncSetAttribute(gemm16_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                            227 * 1024));
    cudaStream_t s;
    cublasHandle_t h;
    probe_cublas_open(&s, &h);

    struct shape {
        const char *name;
        int k, n, splits;
    };
    /* the worker's forms: QKV and gate/up whole (bf16 out), O and down in two slices (f32) */
    const shape shapes[] = {
        {"qkv", 4096, 6144, 1},      {"qkv_s2", 4096, 6144, 2},   {"qkv_s4", 4096, 6144, 4},
        {"o_s2", 4096, 4096, 2},     {"o_s4", 4096, 4096, 4},     {"o_s8", 4096, 4096, 8},
        {"gate_up", 4096, 28672, 1}, {"down_s2", 14336, 4096, 2}, {"down_s4", 14336, 4096, 4},
        {"down_s8", 14336, 4096, 8}, {"lm_head", 4096, 128256, 1}};
    printf("gemm16: %d rows, %d stages, %d SMs\n", rows, stages, sms);
    printf("%-10s %8s %10s %10s %8s %12s %12s\n", "linear", "max_err", "ours_us", "cublas_us",
           "ratio", "chain_ours", "chain_cublas");
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
        std::vector<plan> plans;
        for (int c = 0; c < copies; c++)
            plans.push_back(
                make_plan(x, w + (size_t)c * nw, y, rows, sh.k, sh.n, sh.splits, stages, sms));

        /* check: ours (slices summed) against cublasGemmEx's f32 product */
        CK(cudaMemsetAsync(y, 0xff, ybytes, s));
        launch(plans[0], s, false);
        /* the reference in f32: the whole product (one slice), or cuBLAS's own slices */
        cublas_gemm(h, x, w, yref, rows, sh.k, sh.n, sh.splits, true);
        CK(cudaStreamSynchronize(s));
        const size_t nref = (size_t)rows * sh.n * sh.splits;
        std::vector<float> ref(nref);
        std::vector<uint8_t> got(ybytes);
        CK(cudaMemcpy(ref.data(), yref, nref * 4, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(got.data(), y, ybytes, cudaMemcpyDeviceToHost));
        double maxd = 0, maxv = 0;
        for (size_t i = 0; i < nref; i++) {
            const double v = sh.splits == 1 ? bf16_host(((const __nv_bfloat16 *)got.data())[i])
                                            : ((const float *)got.data())[i];
            maxd = std::max(maxd, fabs(v - ref[i]));
            maxv = std::max(maxv, (double)fabs(ref[i]));
            if (std::isnan(v))
                maxd = INFINITY;
        }
        const double err = maxd / (maxv > 0 ? maxv : 1);
        const bool ok = err < (sh.splits == 1 ? 1e-2 : 1e-4);

        /* alone, weight copies rotated */
        const double t_ours =
            median_us(s, 30, 20, [&](int r) { launch(plans[r % copies], s, false); });
        const double t_cub = median_us(s, 30, 20, [&](int r) {
            cublas_gemm(h, x, w + (size_t)(r % copies) * nw, y, rows, sh.k, sh.n, sh.splits, false);
        });

        /* in a chain: graphs of 32 [writer -> GEMM] pairs */
        double chain[2] = {0, 0};
        for (int which = 0; which < 2 && ok; which++) {
            cudaGraph_t g;
            cudaGraphExec_t ge;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            for (int l = 0; l < 32; l++) {
                probe_launch_writer(s, x, (int64_t)rows * sh.k, 11 + l, 0, 0);
                if (which == 0)
                    launch(plans[l % copies], s, true);
                else
                    cublas_gemm(h, x, w + (size_t)(l % copies) * nw, y, rows, sh.k, sh.n, sh.splits,
                                false);
            }
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&ge, g, 0));
            chain[which] = median_us(s, 20, 1, [&](int) { CK(cudaGraphLaunch(ge, s)); }) / 32;
            CK(cudaGraphExecDestroy(ge));
            CK(cudaGraphDestroy(g));
        }
        printf("%-10s %8.1e %10.2f %10.2f %8.3f %12.2f %12.2f%s\n", sh.name, err, t_ours, t_cub,
               t_cub / t_ours, chain[0], chain[1], ok ? "" : "  WRONG (not timed in a chain)");
        CK(cudaFree(x));
        CK(cudaFree(w));
        CK(cudaFree(y));
        CK(cudaFree(yref));
    }
    return 0;
}
