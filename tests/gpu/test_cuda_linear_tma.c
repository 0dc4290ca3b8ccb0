/* kernels/cuda/linear_tma (the GEMM of ours for a few rows) against the CPU's linear: every
 * row count 1 to 16 on small shapes, the 8B shape's four layer linears in the forms the worker
 * calls (QKV and gate/up whole in bf16, O and down in two f32 slices), both tiles; equal calls
 * give equal bits; gate/up with SiLU-mul in its epilogue, bit for bit the two kernels it
 * replaces; and chains of MLP blocks captured in a CUDA graph with programmatic dependent
 * launch (RMSNorm -> gate/up -> SiLU-mul (or both in one) -> down in slices -> RMSNorm ...,
 * each reading what the one ahead wrote) replay to the bits of the same chain run launch by
 * launch without PDL. Then again with stream-K (cuda_tma_set_stream_k): always, where a unit is
 * cut into pieces on up to every CTA (one unit of 128 stages on 128 CTAs), and where the plan
 * balances (the 8B shape's QKV and gate/up take it, O and down do not); the same checks, but
 * the fused gate/up is compared with the CPU only (its units are cut elsewhere than the
 * unfused pair's). Refusals: shapes it does not take. */
#include "tests/gpu/kernel_check.h"

#include "kernels/cpu/ops.h"
#include "kernels/cuda/linear_tma.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/util.h"

#include <string.h>
#include <time.h>

static struct cuda_tma *tma;
static int sk_mode; /* cuda_tma_set_stream_k's mode of the checks */

/* Sets the stream-K mode for the checks that follow. */
static void set_sk(int mode)
{
    int rc = cuda_tma_set_stream_k(tma, mode);
    GPU_CHECK(rc == 0, "cuda_tma_set_stream_k(%d): %s", mode, pagoda_error_detail());
    sk_mode = mode;
}

/* y = x . w^T through cuda_tma_linear (rows x in times out x in, S slices) against cpu_linear
 * on the bf16 values in f32: bf16 y to TOLERANCE, or each f32 slice to 1e-5 (f32 sums in
 * another order). tile 0: the plan's choice. */
static void check_linear(int64_t rows, int64_t in, int64_t out, int32_t S, int tile)
{
    const size_t nx = (size_t)(rows * in), nw = (size_t)(out * in);
    const size_t ny = (size_t)(rows * out) * (size_t)S;
    uint16_t *x = xmalloc(nx * 2), *w = xmalloc(nw * 2);
    fill_bf16(x, nx, -1.0f, 1.0f);
    fill_bf16(w, nw, -0.05f, 0.05f);
    uint16_t *dx = dev_upload(x, nx * 2), *dw = dev_upload(w, nw * 2);
    const size_t ybytes = ny * (S > 1 ? 4 : 2);
    void *dy = dev_alloc(ybytes);
    poison(dy, ybytes);
    GPU_CK(cuda_tma_set_tile(tma, tile) == 0 ? cudaSuccess : cudaErrorInvalidValue);
    int rc = cuda_tma_linear(tma, dx, dw, dy, rows, in, out, S, stream);
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "rows %lld in %lld out %lld S %d tile %d%s", (long long)rows,
             (long long)in, (long long)out, S, cuda_tma_last_tile(tma),
             cuda_tma_last_stream_k(tma) ? " sk" : "");
    GPU_CHECK(rc == 0, "cuda_tma_linear %s: %s", cfg, pagoda_error_detail());
    GPU_CHECK(sk_mode != CUDA_TMA_SK_ALWAYS || cuda_tma_last_stream_k(tma),
              "tma_linear %s: stream-K asked always, not taken", cfg);
    GPU_CHECK(tile == 0 || cuda_tma_last_tile(tma) == tile, "tma_linear %s: tile %d asked", cfg,
              tile);
    void *got = xmalloc(ybytes);
    download(got, dy, ybytes);

    /* the reference: slice by slice (the whole when S == 1) */
    const int64_t k = in / S;
    float *xs = xmalloc((size_t)(rows * k) * 4), *ws = xmalloc((size_t)(out * k) * 4);
    float *ref = xmalloc(ny * 4);
    for (int32_t s = 0; s < S; s++) {
        for (int64_t r = 0; r < rows; r++)
            bf16_to_f32_n(x + r * in + s * k, xs + r * k, (size_t)k);
        for (int64_t o = 0; o < out; o++)
            bf16_to_f32_n(w + o * in + s * k, ws + o * k, (size_t)k);
        cpu_linear(xs, ws, NULL, ref + (size_t)s * (size_t)(rows * out), rows, k, out);
    }
    const double err = S > 1 ? rel_err(got, ref, ny) : rel_err_bf16(got, ref, ny);
    report("tma_linear", cfg, err, S > 1 ? 1e-5 : TOLERANCE);

    /* the same call again, twice (stream-K: its counts were left at zero): the same bits */
    void *again = xmalloc(ybytes);
    for (int i = 0; i < 2; i++) {
        poison(dy, ybytes);
        rc = cuda_tma_linear(tma, dx, dw, dy, rows, in, out, S, stream);
        download(again, dy, ybytes);
        GPU_CHECK(rc == 0 && memcmp(got, again, ybytes) == 0,
                  "tma_linear %s: call %d again differs", cfg, i + 1);
    }
    free(again);
    free(xs);
    free(ws);
    free(ref);
    free(got);
    free(x);
    free(w);
    GPU_CK(cudaFree(dx));
    GPU_CK(cudaFree(dw));
    GPU_CK(cudaFree(dy));
}

/* cuda_tma_linear_silu (gate/up with SiLU-and-multiply in its epilogue) on rows x in times a
 * gate/up weight of 2 x inter rows: bit for bit cuda_tma_linear into gate/up then cuda_silu_mul,
 * and against the CPU (cpu_linear's gate and up rounded to bf16, then silu(g) * u) to
 * TOLERANCE. */
static void check_silu(int64_t rows, int64_t in, int64_t inter, int tile)
{
    const size_t nx = (size_t)(rows * in), nw = (size_t)(2 * inter * in);
    const size_t nact = (size_t)(rows * inter), ngu = 2 * nact;
    uint16_t *x = xmalloc(nx * 2), *w = xmalloc(nw * 2);
    fill_bf16(x, nx, -1.0f, 1.0f);
    fill_bf16(w, nw, -2.0f / sqrtf((float)in), 2.0f / sqrtf((float)in));
    uint16_t *dx = dev_upload(x, nx * 2), *dw = dev_upload(w, nw * 2);
    uint16_t *dact = dev_alloc(nact * 2), *dgu = dev_alloc(ngu * 2), *dref = dev_alloc(nact * 2);
    poison(dact, nact * 2);
    poison(dref, nact * 2);
    GPU_CK(cuda_tma_set_tile(tma, tile) == 0 ? cudaSuccess : cudaErrorInvalidValue);
    /* the unfused pair first: a stray write of the fused kernel into dref would show */
    int rc = cuda_tma_linear(tma, dx, dw, dgu, rows, in, 2 * inter, 1, stream);
    const int unfused_sk = cuda_tma_last_stream_k(tma);
    if (rc == 0)
        rc = cuda_silu_mul(dgu, dref, (int32_t)rows, (int32_t)inter, stream);
    GPU_CHECK(rc == 0, "tma_silu: the unfused pair: %s", pagoda_error_detail());
    rc = cuda_tma_linear_silu(tma, dx, dw, dact, rows, in, inter, stream);
    char cfg[96];
    const int sk = cuda_tma_last_stream_k(tma);
    snprintf(cfg, sizeof(cfg), "rows %lld in %lld inter %lld tile %d%s", (long long)rows,
             (long long)in, (long long)inter, cuda_tma_last_tile(tma), sk ? " sk" : "");
    GPU_CHECK(rc == 0, "cuda_tma_linear_silu %s: %s", cfg, pagoda_error_detail());
    GPU_CHECK(sk_mode != CUDA_TMA_SK_ALWAYS || sk, "tma_silu %s: stream-K asked always, not taken",
              cfg);
    GPU_CHECK(tile == 0 || cuda_tma_last_tile(tma) == tile, "tma_silu %s: tile %d asked", cfg,
              tile);
    uint16_t *got = xmalloc(nact * 2), *want = xmalloc(nact * 2);
    download(got, dact, nact * 2);
    download(want, dref, nact * 2);
    size_t differ = 0;
    for (size_t i = 0; i < nact; i++)
        differ += got[i] != want[i];
    /* stream-K cuts the fused kernel's units (a gate and an up half) elsewhere than the
     * unfused GEMM's: other sums, other bits; compared where neither plan took it */
    const int bits = !sk && !unfused_sk;
    printf("%-20s %-58s %zu of %zu differ from the two kernels%s\n", "tma_silu", cfg, differ, nact,
           differ && bits ? "  FAIL" : (bits ? "" : " (stream-K: not compared)"));
    GPU_CHECK(differ == 0 || !bits,
              "tma_silu %s: %zu of %zu values differ from cuda_tma_linear + "
              "cuda_silu_mul",
              cfg, differ, nact);
    /* the fused call again: the same bits */
    poison(dact, nact * 2);
    rc = cuda_tma_linear_silu(tma, dx, dw, dact, rows, in, inter, stream);
    download(want, dact, nact * 2);
    GPU_CHECK(rc == 0 && memcmp(got, want, nact * 2) == 0, "tma_silu %s: a second call differs",
              cfg);

    float *xf = xmalloc(nx * 4), *wf = xmalloc(nw * 4), *gu = xmalloc(ngu * 4);
    float *ref = xmalloc(nact * 4);
    bf16_to_f32_n(x, xf, nx);
    bf16_to_f32_n(w, wf, nw);
    cpu_linear(xf, wf, NULL, gu, rows, in, 2 * inter);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < inter; i++) {
            const float g = bf16_to_f32(f32_to_bf16(gu[r * 2 * inter + i]));
            const float u = bf16_to_f32(f32_to_bf16(gu[r * 2 * inter + inter + i]));
            ref[r * inter + i] = g / (1.0f + expf(-g)) * u;
        }
    report("tma_silu", cfg, rel_err_bf16(got, ref, nact), TOLERANCE);
    free(xf);
    free(wf);
    free(gu);
    free(ref);
    free(got);
    free(want);
    free(x);
    free(w);
    GPU_CK(cudaFree(dx));
    GPU_CK(cudaFree(dw));
    GPU_CK(cudaFree(dact));
    GPU_CK(cudaFree(dgu));
    GPU_CK(cudaFree(dref));
}

/* A chain of `links` MLP blocks as the worker runs them: RMSNorm (residual += the slices of the
 * block ahead's down, then normalised -> x) -> gate/up GEMM (x -> gu) -> SiLU-mul (gu -> act) ->
 * down GEMM in S slices (act -> parts). As in the worker, one gate/up buffer serves every block
 * and holds the slices too (S * hidden <= inter), so down writes over what SiLU-mul reads and
 * gate/up over what the RMSNorm reads; x and act are a block's own; all are poisoned (NaN)
 * before each run, the f32 residual reset. Captured with PDL (each kernel may start while the
 * one ahead ends, and must wait before it reads what that one wrote or writes what it reads: a
 * read too early reads NaN or another block's values) and replayed `replays` times, each time
 * to the bits of every buffer of the chain launched one kernel after another without PDL. */
static uint8_t *chain_unfused; /* check_chain's last eager buffers without silu, for the next */

/* (with silu, the fused chain's x, act, slices and residual are also compared with the
 * unfused chain of the same figures run just before: the same bits) */
static void check_chain(int32_t rows, int32_t hidden, int32_t inter, int32_t S, int links,
                        int replays, int tile, int silu)
{
    const size_t nx = (size_t)rows * hidden, ngu = (size_t)rows * 2 * inter;
    const size_t nact = (size_t)rows * inter, nparts = (size_t)S * nx;
    /* the same figures draw the same values: the fused chain runs on the unfused one's inputs */
    rng = 0x2545f4914f6cdd1dull ^ ((uint64_t)rows << 48) ^ ((uint64_t)hidden << 32) ^
          ((uint64_t)inter << 8) ^ ((uint64_t)S << 4) ^ (uint64_t)links;
    float *hres = xmalloc(nx * 4);
    for (size_t i = 0; i < nx; i++)
        hres[i] = uniform(-1.0f, 1.0f);
    float *res0 = dev_upload(hres, nx * 4);
    free(hres);
    uint16_t *hnorm = xmalloc((size_t)hidden * 2);
    fill_bf16(hnorm, (size_t)hidden, 0.5f, 1.5f);
    uint16_t *norm = dev_upload(hnorm, (size_t)hidden * 2);
    free(hnorm);
    uint16_t **wgu = xmalloc((size_t)links * sizeof(*wgu));
    uint16_t **wdown = xmalloc((size_t)links * sizeof(*wdown));
    for (int l = 0; l < links; l++) {
        const size_t n = (size_t)2 * inter * hidden;
        uint16_t *w = xmalloc(n * 2);
        fill_bf16(w, n, -1.7f / sqrtf((float)hidden), 1.7f / sqrtf((float)hidden));
        wgu[l] = dev_upload(w, n * 2);
        fill_bf16(w, n / 2, -1.7f / sqrtf((float)inter), 1.7f / sqrtf((float)inter));
        wdown[l] = dev_upload(w, n);
        free(w);
    }
    GPU_CHECK(nparts * 4 <= ngu * 2, "chain: %d slices of %d do not fit gate/up's %d", S, hidden,
              2 * inter);
    /* per block: x and act (bf16); then the last RMSNorm's x, the shared gate/up buffer (bf16,
     * the slices f32 at its start) and the residual (f32) */
    const size_t block_bytes = (nx + nact) * 2;
    const size_t all = (size_t)links * block_bytes + nx * 2 + ngu * 2 + nx * 4;
    uint8_t *buf = dev_alloc(all);
#define X(l) ((uint16_t *)(buf + (size_t)(l)*block_bytes))
#define ACT(l) (X(l) + nx)
#define GU(l) (X(links) + nx)
#define PARTS(l) ((float *)GU(l))
    float *res = (float *)(GU(0) + ngu);
    GPU_CK(cuda_tma_set_tile(tma, tile) == 0 ? cudaSuccess : cudaErrorInvalidValue);
    int rc = 0;
#define RUN_CHAIN()                                                                                \
    do {                                                                                           \
        GPU_CK(cudaMemcpyAsync(res, res0, nx * 4, cudaMemcpyDeviceToDevice, stream));              \
        for (int l = 0; l <= links && rc == 0; l++) {                                              \
            rc = cuda_add_parts_rmsnorm(res, NULL, l ? PARTS(l - 1) : NULL, l ? S : 0,             \
                                        (int64_t)nx, norm, X(l), rows, hidden, 1e-5f, stream);     \
            if (l == links)                                                                        \
                break;                                                                             \
            if (rc == 0 && silu)                                                                   \
                rc = cuda_tma_linear_silu(tma, X(l), wgu[l], ACT(l), rows, hidden, inter, stream); \
            if (rc == 0 && !silu)                                                                  \
                rc =                                                                               \
                    cuda_tma_linear(tma, X(l), wgu[l], GU(l), rows, hidden, 2 * inter, 1, stream); \
            if (rc == 0 && !silu)                                                                  \
                rc = cuda_silu_mul(GU(l), ACT(l), rows, inter, stream);                            \
            if (rc == 0)                                                                           \
                rc = cuda_tma_linear(tma, ACT(l), wdown[l], PARTS(l), rows, inter, hidden, S,      \
                                     stream);                                                      \
        }                                                                                          \
    } while (0)
    uint8_t *want = xmalloc(all), *got = xmalloc(all);
    cuda_set_pdl(0);
    poison(buf, all);
    RUN_CHAIN();
    download(want, buf, all);
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "rows %d hidden %d inter %d S %d links %d tile %d%s%s", rows, hidden,
             inter, S, links, cuda_tma_last_tile(tma), silu ? " silu" : "", sk_mode ? " sk" : "");
    GPU_CHECK(rc == 0, "chain %s (eager): %s", cfg, pagoda_error_detail());
    /* the last RMSNorm's output: finite and of the norm's scale (no block lost its values) */
    uint16_t *last = (uint16_t *)(want + (size_t)links * block_bytes);
    size_t good = 0;
    for (size_t i = 0; i < nx; i++) {
        const float v = fabsf(bf16_to_f32(last[i]));
        good += isfinite(v) && v > 1e-3f && v < 100.0f;
    }
    GPU_CHECK(good > nx / 2, "chain %s: %zu of %zu outputs of a sane size", cfg, good, nx);
    if (silu && chain_unfused != NULL && sk_mode == CUDA_TMA_SK_OFF) {
        /* x and act of every block, the last x, the slices at gate/up's start, the residual */
        const size_t head = (size_t)links * block_bytes + nx * 2;
        const size_t slices = (size_t)S * nx * 4, res_at = head + ngu * 2;
        const int same = memcmp(want, chain_unfused, head) == 0 &&
                         memcmp(want + head, chain_unfused + head, slices) == 0 &&
                         memcmp(want + res_at, chain_unfused + res_at, nx * 4) == 0;
        printf("%-20s %-58s %s\n", "tma_chain_fused", cfg,
               same ? "the unfused chain's bits" : "differs from the unfused chain  FAIL");
        GPU_CHECK(same, "chain %s: the fused chain differs from the unfused one", cfg);
    }

    cudaGraph_t g;
    cudaGraphExec_t ge;
    cuda_set_pdl(1);
    GPU_CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    RUN_CHAIN();
    GPU_CK(cudaStreamEndCapture(stream, &g));
    cuda_set_pdl(0);
#undef RUN_CHAIN
#undef X
#undef GU
#undef ACT
#undef PARTS
    GPU_CHECK(rc == 0, "chain %s (capture): %s", cfg, pagoda_error_detail());
    GPU_CK(cudaGraphInstantiate(&ge, g, 0));
    int differ = 0;
    for (int r = 0; r < replays; r++) {
        poison(buf, all);
        GPU_CK(cudaGraphLaunch(ge, stream));
        download(got, buf, all);
        differ += memcmp(got, want, all) != 0;
    }
    printf("%-20s %-58s %d of %d replays differ%s\n", "tma_chain_pdl", cfg, differ, replays,
           differ ? "  FAIL" : "");
    GPU_CHECK(differ == 0, "chain %s: %d of %d PDL replays differ from the eager chain", cfg,
              differ, replays);
    GPU_CK(cudaGraphExecDestroy(ge));
    GPU_CK(cudaGraphDestroy(g));
    for (int l = 0; l < links; l++) {
        GPU_CK(cudaFree(wgu[l]));
        GPU_CK(cudaFree(wdown[l]));
    }
    free(wgu);
    free(wdown);
    GPU_CK(cudaFree(buf));
    GPU_CK(cudaFree(res0));
    GPU_CK(cudaFree(norm));
    free(chain_unfused);
    chain_unfused = silu ? NULL : want;
    if (silu)
        free(want);
    free(got);
}

int main(void)
{
    gpu_test_require_device("test_cuda_linear_tma");
    GPU_CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = cuda_tma_new(&tma);
    GPU_CHECK(rc == 0, "cuda_tma_new: %s", pagoda_error_detail());
    if (rc != 0)
        return gpu_test_finish();

    /* every row count, both tiles, whole and in slices; 2048 / 64 = 32 stages a unit whole,
     * past both rings (16 stages at tile 64, 12 at 128) */
    for (int64_t rows = 1; rows <= CUDA_TMA_MAX_ROWS; rows++) {
        check_linear(rows, 2048, 384, 1, 64);
        check_linear(rows, 2048, 384, 2, 64);
        check_linear(rows, 2048, 512, 1, 128);
        check_linear(rows, 2048, 512, 4, 128);
    }
    check_linear(7, 4096, 64 * 300, 1, 0);  /* 150 units of 128: some CTAs take two */
    check_linear(4, 1024, 64 * 160, 2, 64); /* 320 units in slices: two or three a CTA */
    check_linear(3, 64, 64, 1, 0);          /* one stage, one unit */
    check_linear(16, 128 * 8, 128, 8, 128); /* eight slices of two stages */
    /* the 8B shape's layer linears as the worker calls them (rows 16 and 5) */
    const int64_t shapes[4][3] = {
        {4096, 6144, 1}, {4096, 4096, 2}, {4096, 28672, 1}, {14336, 4096, 2}};
    for (int i = 0; i < 4; i++)
        for (int tile = 64; tile <= 128; tile += 64) {
            check_linear(16, shapes[i][0], shapes[i][1], (int32_t)shapes[i][2], tile);
            check_linear(5, shapes[i][0], shapes[i][1], (int32_t)shapes[i][2], tile);
        }

    /* each chain unfused, then fused (compared with the unfused one too) */
    for (int silu = 0; silu <= 1; silu++)
        check_chain(16, 1024, 2048, 2, 8, 40, 64, silu);
    for (int silu = 0; silu <= 1; silu++)
        check_chain(5, 1024, 3072, 2, 8, 40, 128, silu);
    for (int silu = 0; silu <= 1; silu++)
        check_chain(2, 512, 1536, 3, 12, 40, 0, silu);
    for (int silu = 0; silu <= 1; silu++)
        check_chain(16, 4096, 14336, 2, 4, 20, 0, silu); /* the 8B shape's MLP */

    /* gate/up with SiLU-mul in its epilogue: every row count at both tiles, the 8B shape */
    for (int64_t rows = 1; rows <= CUDA_TMA_MAX_ROWS; rows++) {
        check_silu(rows, 2048, 384, 64);
        check_silu(rows, 1024, 512, 128);
    }
    check_silu(16, 4096, 14336, 0);
    check_silu(5, 4096, 14336, 64);
    check_silu(9, 4096, 14336, 128);

    /* stream-K always: every row count on small shapes whole and in slices, both tiles (448
     * rows: 7 units of 32 stages on the CTAs, whose shares do not line up with the units, so
     * pieces that end a CTA's share come in too); one unit of 128 stages cut on 128 CTAs (a
     * piece of one stage each), one of a stage on one CTA, 16 units (8 slices of 2 tiles) of 2
     * stages on 32 CTAs; the 8B shape's linears; chains (PDL replays against eager runs: the
     * counts left at zero launch after launch); gate/up with SiLU-mul */
    set_sk(CUDA_TMA_SK_ALWAYS);
    for (int64_t rows = 1; rows <= CUDA_TMA_MAX_ROWS; rows++) {
        check_linear(rows, 2048, 448, 1, 64);
        check_linear(rows, 2048, 512, 4, 128);
        check_silu(rows, 1024, 448, 0);
    }
    check_linear(16, 64 * 128, 128, 1, 128);
    check_linear(3, 64, 64, 1, 0);
    check_linear(16, 128 * 8, 128, 8, 64);
    for (int i = 0; i < 4; i++) {
        check_linear(16, shapes[i][0], shapes[i][1], (int32_t)shapes[i][2], 0);
        check_linear(5, shapes[i][0], shapes[i][1], (int32_t)shapes[i][2], 64);
    }
    for (int silu = 0; silu <= 1; silu++)
        check_chain(16, 1024, 2048, 2, 8, 40, 0, silu);
    for (int silu = 0; silu <= 1; silu++)
        check_chain(16, 4096, 14336, 2, 4, 20, 0, silu);
    check_silu(16, 4096, 14336, 0);
    check_silu(7, 4096, 14336, 64);

    /* stream-K where it balances: the 8B shape's QKV and gate/up at 16 rows take it, O and
     * down (128 units of 64 on the H200's 132 SMs) do not */
    set_sk(CUDA_TMA_SK_BALANCE);
    for (int i = 0; i < 4; i++) {
        check_linear(16, shapes[i][0], shapes[i][1], (int32_t)shapes[i][2], 0);
        printf("%-20s 8B shape linear %d at 16 rows: %s\n", "tma_sk_balance", i,
               cuda_tma_last_stream_k(tma) ? "stream-K" : "whole units");
    }
    check_silu(16, 4096, 14336, 0);
    /* 224 units of 128 rows (64 features' gate and up): stream-K where they leave a tenth of
     * the rounds idle (on 132 SMs a second round 70% full) */
    int sms = 0;
    GPU_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const int rounds = (224 + sms - 1) / sms, idle = 2240 < rounds * sms * 9;
    GPU_CHECK(cuda_tma_last_stream_k(tma) == idle,
              "the 8B shape's gate/up at 16 rows on %d SMs: stream-K %d, expected %d", sms,
              cuda_tma_last_stream_k(tma), idle);
    check_chain(16, 4096, 14336, 2, 4, 20, 0, 1);
    set_sk(CUDA_TMA_SK_OFF);

    /* refusals: rows 0 and 17, out not a multiple of 64, in not of 64 x splits, 9 slices,
     * a misaligned pointer */
    uint16_t *d = dev_alloc(1 << 20);
    expect_rc("rows 0", cuda_tma_linear(tma, d, d, d, 0, 64, 64, 1, stream), PAGODA_EINVAL);
    expect_rc("rows 17", cuda_tma_linear(tma, d, d, d, 17, 64, 64, 1, stream), PAGODA_EINVAL);
    expect_rc("out 96", cuda_tma_linear(tma, d, d, d, 4, 64, 96, 1, stream), PAGODA_EINVAL);
    expect_rc("in 192 in 2 slices", cuda_tma_linear(tma, d, d, d, 4, 192, 64, 2, stream),
              PAGODA_EINVAL);
    expect_rc("9 slices", cuda_tma_linear(tma, d, d, d, 4, 576, 64, 9, stream), PAGODA_EINVAL);
    expect_rc("x misaligned", cuda_tma_linear(tma, d + 1, d, d, 4, 64, 64, 1, stream),
              PAGODA_EINVAL);
    expect_rc("tile 32", cuda_tma_set_tile(tma, 32), PAGODA_EINVAL);
    expect_rc("stream-K mode 3", cuda_tma_set_stream_k(tma, 3), PAGODA_EINVAL);
    expect_rc("silu inter 96", cuda_tma_linear_silu(tma, d, d, d, 4, 64, 96, stream),
              PAGODA_EINVAL);
    GPU_CK(cudaFree(d));
    printf("plans made: %zu (%zu with stream-K)\n", cuda_tma_plans(tma),
           cuda_tma_plans_stream_k(tma));
    cuda_tma_free(tma);

    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("time %.1f s\n", (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec));
    return gpu_test_finish();
}
