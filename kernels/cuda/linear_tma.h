/* Linears of a few rows (a decode step's QKV, O, gate/up and down at up to 16 sequences) by a
 * GEMM of ours: y = x . w^T, x [rows][in] and w [out][in] bf16, f32 accumulation.
 *
 * Why (bench/RESULTS.md, issue 15, twenty-third session): at 16 rows cuBLAS's kernels spend
 * 5-7 us of each linear ramping up and draining (QKV 18.3 us where its bytes take 11.7), and
 * they neither wait for the kernel ahead nor signal the one behind (bench/pdl_cublas.cu), so
 * nothing overlaps their ramps. This kernel is launched with programmatic dependent launch: its
 * CTAs come in while the kernel ahead ends and request their first weight tiles before they
 * wait for it; they trigger the kernel behind right after that wait.
 *
 * The kernel: one CTA per SM (persistent over its units of work), a unit a tile of `tile` (64 or
 * 128) weight rows over one of `splits` slices of the reduction. A producer warp feeds a ring of
 * shared-memory stages by the tensor copy engine (TMA, 128-byte swizzled 2-D boxes: a tile x 64
 * columns of w and 16 rows x 64 columns of x, rows past `rows` read as zeros), on mbarriers; four
 * consumer warps multiply (ldmatrix, mma.sync m16n8k16) and give the stages back. splits == 1
 * writes y in bf16 [rows][out]; splits > 1 writes each slice's f32 product, parts[s][rows][out]
 * (the worker's split_parts layout, which its RMSNorm behind adds up: worker/cuda_backend.h).
 * Equal calls give equal bits (a fixed order of the reduction).
 *
 * Stream-K (cuda_tma_set_stream_k, off by default): the grid's CTAs share the units' stages
 * evenly instead of taking whole units, so that no SM idles through a last round that the
 * units do not fill (the 8B shape's QKV at 16 rows: 96 units of 64 rows on 132 SMs; gate/up:
 * 224 units of 128 rows, a second round 70% full). A unit cut between CTAs is written by the
 * last of its pieces to arrive (an atomic count a unit and consumer warp), which adds the
 * pieces in the order of k: the bits depend on the plan (its grid, so the SM count, and tile),
 * not on timing, but differ from those without it (and the fused gate/up's from the unfused
 * pair's, whose units are cut elsewhere). No CTA waits for another, so a grid that is not
 * resident at once (another kernel, another process under MPS) cannot deadlock. It takes
 * device memory the first time it is turned on: 16 KiB an SM and 64 KiB (a workspace of the
 * cut units' partial sums and their counts), which every stream-K launch of the cuda_tma
 * uses: its launches must be ordered (one stream, or streams joined by events), since two at
 * once would mix their partial sums and could leave a count behind, spoiling later ones.
 *
 * A struct cuda_tma keeps one plan (the two tensor maps, the launch's figures) per call shape
 * and pointers, made on first use (host work only, so a first use may happen during a graph's
 * capture); not thread-safe (one per backend). The launch enqueues on the stream and neither
 * allocates nor synchronises. Errors: PAGODA_EINVAL (a shape cuda_tma_fits refuses),
 * PAGODA_ENOMEM, PAGODA_ECUDA. */
#ifndef PAGODA_KERNELS_CUDA_LINEAR_TMA_H
#define PAGODA_KERNELS_CUDA_LINEAR_TMA_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Rows a call takes at most. */
#define CUDA_TMA_MAX_ROWS 16

struct cuda_tma;

int cuda_tma_new(struct cuda_tma **out);
void cuda_tma_free(struct cuda_tma *t);

/* 0 (the default): each plan picks its tile (128 weight rows where the units of 128 fill the
 * SMs, else 64); 64 or 128 force it where the shape allows, for benchmarks. */
int cuda_tma_set_tile(struct cuda_tma *t, int tile);

/* Whether cuda_tma_linear takes the call: 1 <= rows <= CUDA_TMA_MAX_ROWS, out a multiple of 64,
 * in a multiple of 64 x splits, 1 <= splits <= 8, x, w and y 16-byte aligned. */
int cuda_tma_fits(int64_t rows, int64_t in, int64_t out, int32_t splits, const void *x,
                  const void *w, const void *y);

/* splits == 1: y [rows][out] bf16 = x . w^T. splits > 1: y [splits][rows][out] f32, slice s the
 * product of columns s * in / splits .. (s + 1) * in / splits - 1 of x and w. On stream s, with
 * programmatic dependent launch when cuda_pdl_enabled() (kernels/cuda/util.h): it signals the
 * kernel behind right after its own wait, so a kernel behind it launched with PDL must wait
 * before touching what it touches (kernels/cuda's launch_pdl kernels do); a plain launch (a
 * cuBLAS GEMM's) keeps the full stream order, and no graph edge out of it may be made
 * programmatic (cuda_capture_make_programmatic). */
int cuda_tma_linear(struct cuda_tma *t, const uint16_t *x, const uint16_t *w, void *y, int64_t rows,
                    int64_t in, int64_t out, int32_t splits, cudaStream_t s);

/* Gate/up with SiLU-and-multiply in its epilogue: act [rows][inter] bf16 = silu(gate) * up,
 * gate = x . w[0 .. inter - 1]^T and up = x . w[inter .. 2 inter - 1]^T (w [2 inter][in]: the
 * gate/up weight), each rounded to bf16 first: the bits of cuda_tma_linear into gate/up [rows]
 * [2 inter] followed by cuda_silu_mul, with one kernel and no gate/up buffer. A unit is a tile's
 * half of gate features and the same features' up rows. The same rules for the kernel behind
 * as cuda_tma_linear. cuda_tma_silu_fits: cuda_tma_fits for out 2 x inter, and inter a multiple
 * of 64. */
int cuda_tma_silu_fits(int64_t rows, int64_t in, int64_t inter, const void *x, const void *w,
                       const void *act);
int cuda_tma_linear_silu(struct cuda_tma *t, const uint16_t *x, const uint16_t *w, uint16_t *act,
                         int64_t rows, int64_t in, int64_t inter, cudaStream_t s);

/* Stream-K's modes: off (the default: CTAs take whole units), where whole units would leave
 * more than a tenth of the SMs' time idle (then at tile 128 unless cuda_tma_set_tile forces
 * one, and at least two stages a CTA), or always (for tests: as many CTAs as SMs or stages,
 * down to one stage each). The first mode other than off allocates the workspace (and waits
 * for the default stream to zero it); the device of cuda_tma_new must be current (else
 * PAGODA_EINVAL). PAGODA_ECUDA when that fails (the mode is unchanged), PAGODA_EINVAL for
 * another mode. A plan is made for the mode of its first call (the mode is part of its key). */
#define CUDA_TMA_SK_OFF 0
#define CUDA_TMA_SK_BALANCE 1
#define CUDA_TMA_SK_ALWAYS 2
int cuda_tma_set_stream_k(struct cuda_tma *t, int mode);

/* Plans made so far, and the tile of the last call's plan and whether it ran stream-K (for
 * tests and benchmarks). */
size_t cuda_tma_plans(const struct cuda_tma *t);
size_t cuda_tma_plans_stream_k(const struct cuda_tma *t); /* of those, with stream-K */
int cuda_tma_last_tile(const struct cuda_tma *t);
int cuda_tma_last_stream_k(const struct cuda_tma *t);

#ifdef __cplusplus
}
#endif

#endif
