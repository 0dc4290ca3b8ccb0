/* The CUDA backend: the forward pass of worker/backend.h on one GPU. Weights live on the GPU in
 * BF16; the projections and the LM head are cuBLAS GEMMs (BF16 in, FP32 accumulate); the
 * residual stream is FP32; K/V are written into and read from a BF16 pool in device memory
 * through the same layout as the CPU pool; tokens are sampled on the GPU with the algorithm of
 * docs/sampling.md. Decode steps replay CUDA graphs captured at open (cuda_backend_options
 * .cuda_graphs). Available only in builds with CUDA (PAGODA_HAVE_CUDA). */
#ifndef PAGODA_WORKER_CUDA_BACKEND_H
#define PAGODA_WORKER_CUDA_BACKEND_H

#include "comm/comm.h"
#include "kvpool/geometry.h"
#include "model/model_weights.h"
#include "worker/backend.h"

#include <stdint.h>

/* The default gemv_max_rows: 0, every linear through cuBLAS. cuda_gemv takes at most the linears
 * whose weights have at most CUDA_BACKEND_GEMV_MAX_WEIGHT elements (the 8B shape's O projection,
 * 4096 x 4096; a tensor-parallel rank compares its own slice, so at TP 4 the down projection's
 * fits too): on the H200 (bench/RESULTS.md, issue 15, 2026-12-02 ninth session) it lost to
 * cuBLAS on every larger weight at every row count; on O it wins in isolation up to 8 rows (one
 * kernel where cuBLAS takes a split-K pass and its reduction), but in the decode step at batch 1
 * it moved the step by -107, -52 and +51 us in three calls (the spread between runs of one
 * call is about 50 us) and lost at batch 8: not on until it wins clearly. */
#define CUDA_BACKEND_GEMV_MAX_ROWS 0
#define CUDA_BACKEND_GEMV_MAX_WEIGHT ((int64_t)4096 * 4096)

struct cuda_backend_options {
    int device;
    struct backend_limits limits;
    /* 1: the kernel sequence before issue 15, for comparison (bench/decode_step): every linear
     * through cublasGemmEx, RoPE and the K/V cache write as two launches. 0 (the default): RoPE
     * fused with the cache write, and linears of up to gemv_max_rows rows through cuda_gemv.
     * (The RMSNorm kernel is the same in both: it changed underneath, cuda_add_rmsnorm.) */
    int baseline_kernels;
    /* Linears of at most this many rows (0 .. CUDA_GEMV_MAX_ROWS) and weights of at most
     * gemv_max_weight elements go through cuda_gemv (0: none), the others through cuBLAS. */
    int gemv_max_rows;
    int64_t gemv_max_weight; /* default CUDA_BACKEND_GEMV_MAX_WEIGHT */
    /* 1: the linears cuda_gemv would take go through its streaming form, cuda_gemv_stream (a
     * candidate not yet measured: bench/decode_step's pdl_gemvs versions); 0 (the default):
     * cuda_gemv. */
    int gemv_stream;
    /* 1 (the default): the kernels of kernels/cuda that support it are launched with
     * programmatic dependent launch (kernels/cuda/util.h cuda_set_pdl): each may be scheduled
     * while the kernel ahead ends and read its weights before waiting for it. Most of a layer's
     * kernels of ours follow a cuBLAS GEMM, which does not signal, so the overlap is small: 1-2%
     * of a decode step below batch 64 on the H200 (bench/RESULTS.md). 0: stream order only
     * (--cuda-pdl off). Results are the same bits either way. */
    int pdl;
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
 * kernels of issue 15 with gemv_max_rows CUDA_BACKEND_GEMV_MAX_ROWS, CUDA graphs on. */
struct cuda_backend_options cuda_backend_default_options(void);

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
