/* The CUDA backend: the forward pass of worker/backend.h on one GPU. Weights live on the GPU in
 * BF16; the projections and the LM head are cuBLAS GEMMs (BF16 in, FP32 accumulate); the
 * residual stream is FP32; K/V are written into and read from a BF16 pool in device memory
 * through the same layout as the CPU pool; tokens are sampled on the GPU with the algorithm of
 * docs/sampling.md, after the step's logit entries (struct fwd_batch) are added to the logits on
 * the GPU (kernels/cuda/logit_bias.h; backend_forward's logits are without them). Decode steps
 * replay CUDA graphs captured at open (cuda_backend_options .cuda_graphs), which hold the layers
 * and the LM head; the logit entries and the sampler run behind them, launch by launch. Available
 * only in builds with CUDA (PAGODA_HAVE_CUDA). */
#ifndef PAGODA_WORKER_CUDA_BACKEND_H
#define PAGODA_WORKER_CUDA_BACKEND_H

#include "comm/comm.h"
#include "kvpool/geometry.h"
#include "model/model_weights.h"
#include "worker/backend.h"

#include <stdint.h>

/* The defaults: linears of up to 8 rows whose weights have at most
 * CUDA_BACKEND_GEMV_MAX_WEIGHT elements (the 8B shape's QKV, 6144 x 4096, and O; a
 * tensor-parallel rank compares its own slice) go through cuda_gemv_stream, the others through
 * cuBLAS. On the H200 (bench/RESULTS.md, issue 15, 2026-12-02 eleventh session) the streaming
 * form, whose weights are on their way before the kernel ahead ends (programmatic dependent
 * launch on both sides: the RMSNorm before QKV and the attention before O are ours), took the
 * decode step at batch 1 from 4.85 to 4.63 ms and at 4 from 4.99 to 4.86 (two runs, the same
 * figures), even at 8; alone it hardly beats cuBLAS on these weights, and it loses on the large
 * ones (gate/up and down) in isolation and in the step. */
#define CUDA_BACKEND_GEMV_MAX_ROWS 8
#define CUDA_BACKEND_GEMV_MAX_WEIGHT ((int64_t)6144 * 4096)

/* The default of cuda_backend_options.residual_gemm_max_rows: the decode steps' sizes (the
 * largest graph's batch). On the H200 (bench/RESULTS.md, issue 15, nineteenth session) the
 * decode step of the 8B shape took 20-50 us less at 16 to 128 sequences with the projections
 * added inside their GEMMs (at 256 within the spread). Prefill steps of more rows keep the BF16
 * products (not measured). */
#define CUDA_BACKEND_RESIDUAL_GEMM_MAX_ROWS 256

/* cuda_backend_options.fused_rope_max_seqs' default. On the H200 (bench/RESULTS.md, issue 15,
 * twenty-second session) RoPE inside the decode attention made the 8B shape's decode step
 * 0.16 ms faster at 8 sequences, 0.03-0.07 at 16, 0.055 at 32, and nothing at 64 and 128, but
 * 0.07-0.09 ms slower at 96 (context 640) and 0.015-0.035 slower at one sequence: without the
 * RoPE kernel, which lets the attention's CTAs in early, the attention starts only when the
 * QKV GEMM (cuBLAS, which never signals its dependents) has ended, and its requests of earlier
 * K/V no longer overlap anything. */
#define CUDA_BACKEND_FUSED_ROPE_MAX_SEQS 32

/* cuda_backend_options.split_parts' default. On the H200 (bench/RESULTS.md, issue 15, twenty-
 * second session, kernel_bench's linear_*_split2 against linear_*_res) the 8B shape's O took
 * 13.5 us cut in two against 16.4 at 16 rows and 17.9 against 20.8 at 256, down 32.7 against
 * 34.8 at 16 and 44.8 against 51.0 at 256: cuBLAS's own choice for the whole reduction at these
 * few rows fills the SMs worse. */
#define CUDA_BACKEND_SPLIT_PARTS 2

/* cuda_backend_options.pdl_late_max_rows' default. On the H200 (bench/RESULTS.md, issue 15,
 * twenty-third session) the late trigger made the 8B shape's decode step 0.05-0.07 ms faster at
 * 16 sequences and 0.03-0.08 at 32, nothing measurable at 64, but 0.05-0.07 ms slower at 128
 * and 0.09-0.14 at 256 (context 640): there the decode attention runs its CTAs in several
 * rounds and each CTA's closing fence lengthens every round (without the attention, the
 * RMSNorms and SiLU-mul alone gained nothing there either). */
#define CUDA_BACKEND_PDL_LATE_MAX_ROWS 64

/* The rows kernels/cuda/linear_tma.h takes at most (CUDA_TMA_MAX_ROWS): the default of
 * cuda_backend_options.tma_max_rows (pagoda-run --cuda-tma off sets 0). */
#define CUDA_BACKEND_TMA_MAX_ROWS 16

struct cuda_backend_options {
    int device;
    struct backend_limits limits;
    /* 1: the kernel sequence before issue 15, for comparison (bench/decode_step): every linear
     * through cublasGemmEx, RoPE and the K/V cache write as two launches. 0 (the default): RoPE
     * fused with the cache write, and linears of up to gemv_max_rows rows through our GEMVs.
     * (The RMSNorm kernel is the same in both: it changed underneath, cuda_add_rmsnorm.) */
    int baseline_kernels;
    /* Linears of at most this many rows (0 .. CUDA_GEMV_MAX_ROWS) and weights of at most
     * gemv_max_weight elements go through a GEMV of ours (0: none), the others through cuBLAS. */
    int gemv_max_rows;
    int64_t gemv_max_weight; /* default CUDA_BACKEND_GEMV_MAX_WEIGHT */
    /* 1 (the default): the linears gemv_max_rows and gemv_max_weight take go through the
     * streaming form, cuda_gemv_stream; 0: through cuda_gemv. */
    int gemv_stream;
    /* 1 (the default): linears of one row that cuda_gemv_row takes (kernels/cuda/linear.h: each
     * warp reads whole weight rows) go through it, before any other path; 0: they take the
     * paths below. On the H200 (bench/RESULTS.md, issue 15, fifteenth session) it reads QKV at
     * 3.1 TB/s, O at 2.7, gate/up at 4.1, down at 3.7 and the LM head at 4.4 where cuBLAS and
     * the streaming GEMV reach 2.7-2.8, 1.9-2.4, 4.0, 3.5 and 4.2. On since the seventeenth
     * session, when the GPU suite passed with it (and with gemv_row_norm) on a race-free main. */
    int gemv_row;
    /* 1 (the default): with gemv_row, a step of one row (and no tensor parallelism) runs each
     * RMSNorm that feeds a linear inside that linear's kernel (cuda_gemv_row_norm: QKV and
     * gate/up), 64 kernels fewer a step of the 8B shape; the same bits (test_cuda_kernels). 0:
     * separate kernels. The seventeenth session measured, in one call, the closed loop of one
     * client at 0.821-0.822 of the floor with both on against 0.788 with both off (the
     * fifteenth had found the fused form slower on another machine; bench/RESULTS.md). */
    int gemv_row_norm;
    /* Linears of at most this many rows that no GEMV of ours takes go through cuBLASLt with its
     * heuristic's first algorithm (kernels/cuda/linear_lt.h), the others through cublasGemmEx;
     * 0 (the default): none. On the H200 (bench/RESULTS.md, issue 15, fifteenth session)
     * cuBLASLt is faster alone on O at 16 rows (14.7 against 16.8 us) but slower on gate/up
     * (64.1 against 60.5), and the decode step moved within its spread at 1 to 256 sequences
     * (decode_step --versions nolt,lt), so cublasGemmEx stays. */
    int lt_max_rows;
    /* With lt_max_rows: only weights of at most this many elements go through cuBLASLt; 0 (the
     * default): every weight. For benchmarks (decode_step's lt_qo and lt_o versions). */
    int64_t lt_max_weight;
    /* Linears of a layer (QKV, O, gate/up, down; one rank) of 2 to this many rows (at most
     * CUDA_TMA_MAX_ROWS) that kernels/cuda/linear_tma.h takes go through that GEMM of ours
     * (weights streamed by TMA, launched with programmatic dependent launch), before the GEMVs
     * and cuBLAS; O and down in their split_parts slices. Default CUDA_BACKEND_TMA_MAX_ROWS; 0:
     * none. Alone each linear is 0.85-0.99 of cuBLAS's speed (bench/gemm16), but in the step,
     * where it overlaps the kernel ahead, the decode step of the 8B shape at 1152 positions
     * took 5.16-5.21 ms at 16 sequences against 5.35-5.38 without, and the closed loop's
     * 0.05-0.10 ms less on three machines of four (bench/RESULTS.md, issue 15, twenty-fifth
     * session). Where cuda_tma_new fails with a CUDA error (a device or driver without it), the
     * backend warns and goes on without it. */
    int tma_max_rows;
    /* With tma_max_rows: 0 (the default) lets each call's plan pick its tile; 64 or 128 force
     * it (cuda_tma_set_tile), for benchmarks. */
    int tma_tile;
    /* With tma_max_rows: 1 (the default) runs gate/up and SiLU-and-multiply as one kernel
     * (cuda_tma_linear_silu: the same bits, one kernel and the gate/up round trip fewer a
     * layer) where it takes the step; 0: two. */
    int tma_silu;
    /* With tma_max_rows: linear_tma's stream-K mode (cuda_tma_set_stream_k: CUDA_TMA_SK_OFF,
     * the default, _BALANCE or _ALWAYS). Balanced, the 8B shape's QKV and gate/up at 2 to 16
     * rows spread their stages over every SM instead of whole units over some (O and down,
     * which fill the SMs, stay as they are); other bits. On the H200 it loses (twenty-eighth
     * session, bench/RESULTS.md: every linear alone, and the closed loop of 16, 5.374 ms a step
     * against 5.322-5.353), hence off. Its workspace (about 2 MiB) comes out of
     * MODEL_BUDGET_RESERVE_BYTES; where it cannot be allocated, a warning and none. */
    int tma_stream_k;
    /* With tma_max_rows: which of a layer's linears it takes (CUDA_TMA_QKV | CUDA_TMA_O |
     * CUDA_TMA_GATE_UP | CUDA_TMA_DOWN, the default CUDA_TMA_LINEARS); the others keep the
     * GEMVs and cuBLAS. For benchmarks (decode_step's tma_no* versions: on the H200 at 8 and
     * 16 sequences each linear taken out was slower or within 0.03 ms of all four, though QKV
     * and down alone are slower than cuBLAS's; twenty-eighth session). */
    int tma_linears;
    /* Steps of 2 .. residual_gemm_max_rows rows (one rank) add the O and down projections into
     * the FP32 residual stream inside their GEMMs (cublasGemmEx with beta 1 and an FP32 output;
     * O only without a bias, and neither where a GEMV of ours takes it, which keeps its BF16
     * output), and the RMSNorm behind each only normalises: the products are not rounded
     * to BF16 on their way and no kernel reads them back. Default
     * CUDA_BACKEND_RESIDUAL_GEMM_MAX_ROWS; 0: the products in BF16, added by the RMSNorm (as
     * before the nineteenth session, and always for one row, whose GEMVs add nothing: there
     * cuda_gemv_row_norm does the addition). */
    int residual_gemm_max_rows;
    /* With residual_gemm_max_rows: the O and down projections that add into the residual are cut
     * into this many slices of their reduction dimension (cublasGemmStridedBatchedEx, each slice's
     * f32 product beside the others in the gate/up buffer, free at both points), and the RMSNorm
     * behind each adds the slices into the residual (cuda_add_parts_rmsnorm); a linear whose
     * reduction does not divide into slices of multiples of 8, or whose slices would not fit
     * (parts x hidden x 4 bytes a row over the gate/up buffer's 4 x intermediate), adds with
     * beta 1 as before. 0 or 1: never cut. Default CUDA_BACKEND_SPLIT_PARTS. */
    int split_parts;
    /* A step of 2 to this many decode sequences only (and not baseline_kernels) applies RoPE
     * and writes the step's K and V inside the decode attention (cuda_attention_run_rope), one
     * kernel fewer a layer, the same bits; other steps run cuda_rope_cache, then the attention.
     * Default CUDA_BACKEND_FUSED_ROPE_MAX_SEQS; 0 or 1: never. */
    int fused_rope_max_seqs;
    /* 1 (the default): the kernels of kernels/cuda that support it are launched with
     * programmatic dependent launch (kernels/cuda/util.h cuda_set_pdl): each may be scheduled
     * while the kernel ahead ends and read its weights before waiting for it. Most of a layer's
     * kernels of ours follow a cuBLAS GEMM, which does not signal, so the overlap is small: 1-2%
     * of a decode step below batch 64 on the H200 (bench/RESULTS.md). 0: stream order only
     * (--cuda-pdl off). Results are the same bits either way. */
    int pdl;
    /* With pdl, in the decode graphs of up to this many sequences, each kernel of ours followed
     * by a cuBLAS GEMM (the RMSNorms before QKV and gate/up, the attention before O,
     * SiLU-and-multiply before down) signals its dependents only at its end, after a fence of
     * its stores (kernels/cuda/util.h's late trigger), and the graph's edge into the GEMM is
     * programmatic: the GEMM's CTAs are scheduled as the last CTAs ahead end, not after that
     * grid has completed (cuBLAS's kernels never wait, so such an edge is safe only behind the
     * late trigger; bench/pdl_cublas.cu). 0: those edges keep full stream order. The same bits
     * either way. Default CUDA_BACKEND_PDL_LATE_MAX_ROWS. Should a capture fail with it, the
     * graphs are captured again with 0. */
    int pdl_late_max_rows;
    /* 1 (the default): with pdl, the decode attention requests its sequences' earlier K/V before
     * it waits for RoPE with the cache write (cuda_attention_set_early_kv), which writes only
     * the step's own keys; 0: it waits first. Results are the same bits either way. */
    int decode_early_kv;
    /* 0 (the default): the decode attention's plan chooses how many keys one bulk copy moves
     * per step; 4, 8 or 16 force it (kernels/cuda/attention.h
     * cuda_attention_set_decode_copy_rows), for benchmarks. */
    int decode_copy_rows;
    /* 0 (the default): the decode attention's plan chooses its CTAs' warps per step (8 from 2 to
     * 16 sequences, else 4); 4 or 8 force them (kernels/cuda/attention.h
     * cuda_attention_set_decode_warps), for benchmarks. */
    int decode_warps;
    /* 0 (the default): the decode attention's plan chooses how many of its CTAs of 4 warps share
     * an SM over an F8E4M3 pool (3 from 96 sequences, else 2); 2 or 3 force it
     * (kernels/cuda/attention.h cuda_attention_set_decode_ctas), for benchmarks. */
    int decode_ctas;
    /* 0 (the default): the decode attention's plan cuts contexts into split-KV partitions as its
     * cost model finds fastest; a multiple of 64 keys forces that partition (kernels/cuda/
     * attention.h cuda_attention_set_decode_split), for benchmarks. */
    int decode_split;
    /* Tensor parallelism: NULL (the default) for one rank; else this rank's handle on the group
     * (borrowed: it must outlive the backend), and the weights must be the matching shard
     * (model_weights_open_shard with comm_rank, comm_size), or, with random weights, the shard
     * of that rank is drawn (not a slice of the whole model's draw). An NCCL group
     * (comm_nccl_open, on this device) is given device buffers; any other group (the cpu one)
     * gets them through pinned host memory. Every rank is given the same steps in the same
     * order and returns (and samples from) the same, gathered logits (docs/tensor-parallel.md).
     * Each collective waits for the backend's stream: a tensor-parallel step runs one at a
     * time on the host's side too. */
    struct comm *comm;
    /* 1 (the default): decode steps (every sequence's query_len 1) of up to
     * min(max_num_seqs, max_num_tokens, MODEL_BUDGET_GRAPH_BATCH_MAX) sequences replay a CUDA
     * graph captured when the backend opens, one per batch size of model_budget_graph_batches
     * (model/model_budget.h), the step padded to that size with rows that write no K/V and are
     * not sampled; other steps run launch by launch. 0: every step launch by launch
     * (pagoda-worker --cuda-graphs off). Greedy outputs are the same either way at a batch that
     * is a graph's size (the same kernels and cuBLAS algorithms); a padded batch's GEMMs have
     * more rows and may round differently. backend_graph_steps counts the replays. A
     * tensor-parallel rank (comm set) captures none: its collectives wait on the host. A capture
     * that fails does not fail the open: the graphs captured are freed, a warning names the
     * batch size and the CUDA error, backend_graph_capture_failures counts it, and every step
     * runs launch by launch. For tests, PAGODA_CUDA_GRAPH_FAIL_AT=<batch> in the environment
     * (read at open) makes the capture of that batch size fail. */
    int cuda_graphs;
};

/* Defaults: device 0, 2048 tokens and 256 sequences per step, 4096 blocks per sequence, the
 * kernels of issue 15 with the streaming GEMV up to CUDA_BACKEND_GEMV_MAX_ROWS rows of weights
 * of up to CUDA_BACKEND_GEMV_MAX_WEIGHT elements, programmatic dependent launch and CUDA graphs
 * on (cuda_gemv_row and cuBLASLt off). */
struct cuda_backend_options cuda_backend_default_options(void);

/* cuda_backend_options.tma_linears: a layer's linears. */
enum { CUDA_TMA_QKV = 1, CUDA_TMA_O = 2, CUDA_TMA_GATE_UP = 4, CUDA_TMA_DOWN = 8 };
#define CUDA_TMA_LINEARS (CUDA_TMA_QKV | CUDA_TMA_O | CUDA_TMA_GATE_UP | CUDA_TMA_DOWN)

/* Applies a --cuda-tma value (worker/backend.h BACKEND_CUDA_TMA_*): off sets tma_max_rows 0,
 * on leaves the defaults, stream-k sets tma_stream_k CUDA_TMA_SK_BALANCE. */
void cuda_backend_set_tma(struct cuda_backend_options *o, int flag);

/* Opens a CUDA backend. Weights come from w (copied to the GPU, converted to BF16 when the
 * checkpoint holds F16 or F32), or, when w is NULL, are drawn at random on the GPU from
 * random_seed with the scales of pagoda-mkmodel (--load-format random: any shape, no file), for
 * config cfg. pool is the device address of a BF16 pool of geometry g (the caller keeps it
 * alive): with opt->comm, a pool of the shard's KV heads, or of the whole model's of which
 * the rank uses its own run (ranks sharing one device and one pool). On success *out is
 * released with backend_close. Errors: PAGODA_EMISMATCH (pool and model disagree; weights that
 * are not the shard of opt->comm's rank and size), PAGODA_EUNSUPPORTED (a group size the model
 * cannot be split by, naming the field), PAGODA_ECUDA (no device, a failed CUDA or cuBLAS call,
 * with a detail), PAGODA_EEXHAUSTED (the weights and activations do not fit on the GPU, saying by
 * how much), PAGODA_ENOMEM. A forward pass of a tensor-parallel rank adds the errors of the
 * collectives (PAGODA_ETIMEDOUT, PAGODA_ECLOSED, PAGODA_EPROTO). */
int cuda_backend_open(const struct model_config *cfg, const struct model_weights *w,
                      uint64_t random_seed, const struct kv_geometry *g, void *pool,
                      const struct cuda_backend_options *opt, struct backend **out);

/* Allocates a zeroed BF16 pool of geometry g on the device (for pagoda-run and tests; the
 * serving group's pool belongs to the kvpool process). Free with cuda_pool_free. */
int cuda_pool_alloc(const struct kv_geometry *g, int device, void **pool);
void cuda_pool_free(void *pool);

#endif
