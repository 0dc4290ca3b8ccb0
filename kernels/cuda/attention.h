/* Paged attention on the GPU: the plan/run split of kernels/cpu/attention.h, over a bf16 pool
 * or an F8E4M3 one (cuda_attention_config's kv_dtype).
 *
 * The batch is described exactly as on the CPU (struct attention_batch: query_start,
 * context_len, block tables; host arrays), with the same semantics: query token j of a
 * sequence with query_len tokens sits at absolute position context_len - query_len + j and
 * attends causally to keys 0 .. that position; query head h reads KV head h / (num_heads /
 * num_kv_heads). Scores, softmax and accumulation are f32 (online softmax); the output is
 * rounded to bf16 once.
 *
 * Lifecycle: cuda_attention_plan_new once per model (device and pinned host buffers, sized by
 * the config's limits, at addresses that never change), cuda_attention_plan once per step (host
 * validation, then one asynchronous copy of the step's metadata to the device),
 * cuda_attention_run once per layer (launches only: no allocation, no synchronisation).
 *
 * Two kernels behind run, both on the tensor cores (mma.sync bf16, f32 accumulation): sequences
 * with query_len 1 (decode) go to a paged decode kernel, one CTA per (KV partition, KV head)
 * handling up to 8 of that KV head's query heads so that each K/V byte is read once (CTAs of 8
 * warps from 2 to 16 decode sequences at head dim 128, else of 4:
 * cuda_attention_set_decode_warps; over an F8E4M3 pool at head dim 128, three CTAs of 4 an SM
 * from 96 sequences: cuda_attention_set_decode_ctas), K/V tiles
 * brought in by bulk copies through the block table (4 keys a copy below 64 decode sequences, 16
 * from 64 up, 8 where the block size is not a multiple of 16:
 * cuda_attention_set_decode_copy_rows), with a merge kernel when a context was
 * split across CTAs (split-KV: the plan picks no split or a split sized for 1 to 4 waves of the
 * resident CTAs into partitions of 64 keys or more, whichever a cost model of the batch, the
 * merge included, finds fastest, so that batch 1 and batch 256 both fill the GPU); the others
 * (prefill chunks, a chunk continuing a sequence already in the pool included) go to a causal
 * prefill kernel, one CTA per (128 rows of (query token, query head of the KV head), KV head),
 * launched in descending order of the keys they need, K/V tiles read in place through the block
 * table into shared memory by a cp.async pipeline, tiles past the diagonal never read.
 *
 * Streams: plan's copy and run's kernels are ordered by the stream. Run on the stream the step
 * was planned on (or order the streams with an event); the plan owns one set of device
 * metadata and split-KV scratch, so one run at a time per plan. Decode results depend (in the
 * last bits) on the batch a decode sequence is planned in (its split, its copy rows, its CTAs'
 * warps). */
#ifndef PAGODA_KERNELS_CUDA_ATTENTION_H
#define PAGODA_KERNELS_CUDA_ATTENTION_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/cpu/attention.h"
#include "kvpool/geometry.h"

/* What stays fixed for the life of a plan: the model's attention shape, the pool's geometry
 * and the largest batch a step may bring. */
struct cuda_attention_config {
    int32_t num_heads;    /* query heads; a multiple of num_kv_heads, at most 64 per KV head */
    int32_t num_kv_heads; /* query head h reads KV head h / (num_heads / num_kv_heads) */
    int32_t head_dim;     /* 64 or 128 */
    float scale;          /* multiplies q.k before the softmax, usually 1 / sqrt(head_dim); > 0 */
    int32_t block_size;   /* the pool's, KV_BLOCK_SIZE_MIN .. KV_BLOCK_SIZE_MAX */
    int32_t num_blocks;   /* the pool's, including the reserved block 0 */
    int32_t max_num_seqs; /* limits on one step's batch */
    int32_t max_num_tokens;
    int32_t max_blocks_per_seq; /* bounds the context: max_blocks_per_seq * block_size tokens */
    /* The pool's element: DTYPE_BF16 (0, so a config that leaves it out reads bf16) or
     * DTYPE_F8E4M3 (pagoda-kvpool --kv-cache-dtype fp8). With F8E4M3 the kernels convert the codes
     * to f16 (exact: the decode kernel in registers, the prefill kernel through shared memory) and
     * multiply in f16 (Q clamped to f16's range, P rounded to f16), accumulating in f32 as for
     * bf16. */
    enum dtype kv_dtype;
};

struct cuda_attention_plan;

/* Allocates a plan on the current device: device buffers for one step's metadata and for the
 * split-KV partial results, pinned host staging (two slots, so that planning step n + 1 does
 * not wait for step n's copy), and the events that guard the staging. On success *out is the
 * caller's, to release with cuda_attention_plan_free; it holds no batch until
 * cuda_attention_plan succeeds. Returns 0, PAGODA_EINVAL (a non-positive head count, num_heads
 * not a multiple of num_kv_heads, a scale that is not finite or not positive: the prefill
 * kernel takes row maxima of unscaled scores), PAGODA_ERANGE (block_size, num_blocks, head_dim
 * or a limit out of range: the CPU plan's checks), PAGODA_EUNSUPPORTED (head_dim other than 64
 * or 128, more than 64 query heads per KV head, a kv_dtype other than BF16 and F8E4M3),
 * PAGODA_ENOMEM or PAGODA_ECUDA. */
int cuda_attention_plan_new(const struct cuda_attention_config *c,
                            struct cuda_attention_plan **out);

/* Frees a plan; NULL is accepted. Waits for the plan's pending copies, not for runs: the caller
 * makes sure no run that uses the plan is still in flight (synchronise its stream first). */
void cuda_attention_plan_free(struct cuda_attention_plan *p);

/* Validates one step's batch on the host exactly as the CPU plan does (same errors and
 * details), splits it into decode sequences (query_len 1) and prefill tiles, chooses the
 * split-KV partition of the decode contexts, and enqueues on stream s one copy of that
 * metadata from pinned staging to the device. The batch's arrays stay the caller's and may be
 * reused as soon as this returns. May wait for the copy enqueued two plans ago to finish (the
 * staging slot it used). On failure the plan holds no batch (run refuses it). Returns 0,
 * PAGODA_EINVAL, PAGODA_ERANGE (as attention_plan) or PAGODA_ECUDA. */
int cuda_attention_plan(struct cuda_attention_plan *p, const struct attention_batch *batch,
                        cudaStream_t s);

/* cuda_attention_plan for a step that a CUDA graph replays: every sequence of batch is a decode
 * (query_len 1), and the step is padded to num_seqs sequences (at least batch->num_seqs, at most
 * the config's max_num_seqs and max_num_tokens): padding sequence q (batch->num_seqs <= q <
 * num_seqs) is query token q and attends to one key, slot 0 of the reserved block 0, so it reads
 * nothing out of bounds; its output is to be ignored. The real sequences are split exactly as
 * cuda_attention_plan splits them (the same results, bit for bit) where the copy rows and the
 * CTAs' warps chosen by num_seqs are those chosen by the batch's decode count: the same side of
 * their thresholds (2 and 16 sequences for the warps, 64 for the rows), or set. The metadata's
 * layout and device addresses, and the grid cuda_attention_run launches afterwards (the most decode
 * CTAs num_seqs sequences can need; those past the step's return at once, the count read from the
 * metadata), depend on num_seqs alone, so that the launches of one run captured in a graph
 * serve every later step planned with the same num_seqs. Returns 0, the errors of
 * cuda_attention_plan, PAGODA_ERANGE (num_seqs out of range) or PAGODA_EUNSUPPORTED (a sequence
 * that is not a decode); on an error the step can still be planned by cuda_attention_plan. */
int cuda_attention_plan_graph(struct cuda_attention_plan *p, const struct attention_batch *batch,
                              int32_t num_seqs, cudaStream_t s);

/* The planned step's decode work, for tests and benchmarks: *ctas is the grid the decode kernel
 * gets (for a plan of cuda_attention_plan_graph, the fixed grid of its num_seqs; 0 when no
 * decode kernel runs), *partitions the split-KV partitions planned (one per unsplit decode
 * context, the padding sequences' included). Returns 0, or PAGODA_EINVAL (a NULL argument, no
 * batch planned). */
int cuda_attention_decode_shape(const struct cuda_attention_plan *p, int32_t *ctas,
                                int32_t *partitions);

/* Attention of one layer for the planned batch, enqueued on s. q holds num_heads * head_dim
 * bf16 per token at q + t * q_row_stride (q may live inside the fused QKV output); out is
 * [num_tokens][num_heads * head_dim] bf16, contiguous, and must not overlap q. kv is the
 * layer's view of the pool (device pointers; bf16 or F8E4M3, the config's), whose K/V for every
 * context token must already be written (cuda_reshape_and_cache earlier on the stream). q and out
 * must be 16-byte aligned and q_row_stride a multiple of 8 elements, at least num_heads * head_dim;
 * the view's pointers 16-byte aligned and its strides whole 16-byte chunks (multiples of 8 bf16
 * elements, of 16 F8E4M3 ones). Returns 0, PAGODA_EINVAL (no
 * batch planned, NULL buffers, a stride or alignment as above), PAGODA_EMISMATCH (the view's dtype,
 * block_size, num_kv_heads, head_dim or num_blocks differ from the config) or PAGODA_ECUDA. */
int cuda_attention_run(struct cuda_attention_plan *p, const struct kv_layer_view *kv,
                       const uint16_t *q, int64_t q_row_stride, uint16_t *out, cudaStream_t s);

/* RoPE for cuda_attention_run_rope, device arrays: positions [num_tokens] (the step's, as
 * cuda_rope_cache takes them), inv_freq [head_dim / 2] f32, slot_mapping [num_tokens] (a slot
 * outside block_size .. num_blocks * block_size - 1, that is in the reserved block 0 or past the
 * pool: no write, as cuda_rope_cache). */
struct cuda_attention_rope {
    const int32_t *positions;
    const float *inv_freq;
    const int64_t *slot_mapping;
};

/* cuda_rope_cache and cuda_attention_run in one kernel, for a step of decode sequences only:
 * qkv's rows (row_stride elements apart, at least (num_heads + 2 * num_kv_heads) * head_dim)
 * hold each token's Q heads, then its K heads, then its V heads, as the fused QKV linear wrote
 * them (RoPE not applied). The decode kernel rotates Q in registers, and each CTA that holds a
 * sequence's newest key first writes that token's K (rotated) and V into its slot of the pool;
 * qkv is not modified. The outputs, and the pool's contents after, are those of cuda_rope_cache
 * then cuda_attention_run, bit for bit. With early_kv the kernel just ahead may be the QKV
 * linear itself (it writes no key). Errors: cuda_attention_run's, PAGODA_EINVAL (NULL rope or
 * rope arrays, a row stride without room for K and V) and PAGODA_EUNSUPPORTED (the planned step
 * has prefill tokens: use cuda_rope_cache and cuda_attention_run). */
int cuda_attention_run_rope(struct cuda_attention_plan *p, const struct kv_layer_view *kv,
                            const uint16_t *qkv, int64_t row_stride,
                            const struct cuda_attention_rope *rope, uint16_t *out, cudaStream_t s);

/* 1 when the planned step has decode sequences only (cuda_attention_run_rope takes it), else 0
 * (also for NULL or no batch planned). */
int cuda_attention_planned_decode_only(const struct cuda_attention_plan *p);

/* Whether the decode kernel, launched with programmatic dependent launch (cuda_set_pdl), may
 * request the K/V of each sequence's keys before its newest (position context_len - 2 and
 * below) before it waits for the kernel ahead in the stream: 0 (a new plan's setting) or 1. It
 * loads while the kernel ahead ends (bench/RESULTS.md, 2026-12-03: 1.2-1.4% of a decode step at
 * batch 1 to 4, 0.2-0.6% from 16 to 256).
 * With 1 the caller guarantees that the kernel launched just before each cuda_attention_run on
 * its stream writes no key that a decode sequence reads other than its newest (RoPE with the
 * cache write of the step's own tokens: cuda_rope_cache, cuda_reshape_and_cache); every kernel
 * before that one has completed by then when it waits for its own before it lets the next
 * start, as the kernels of kernels/cuda do, or is not launched with the attribute (a cuBLAS
 * GEMM that a programmatic edge let in early never waits, but only follows a kernel that
 * signalled late, once its writes were visible: kernels/cuda/util.h). NULL is accepted. */
void cuda_attention_set_early_kv(struct cuda_attention_plan *p, int on);

/* How many consecutive keys of a block one bulk copy of the decode kernel moves: 0 (a new plan's
 * setting) lets each step choose, 4 rows below 64 decode sequences (a graph plan: its padded
 * size) and 16 (8 when the block size is not a multiple of 16) from 64 up, the faster on the
 * H200 (bench/RESULTS.md, 2026-12-03); 4, 8 or 16 force it, for benchmarks and tests (rows that
 * do not divide the block size are copied one by one). Results differ in the last bits between
 * settings (the warps sum their keys in another order). Other values and NULL are ignored. */
void cuda_attention_set_decode_copy_rows(struct cuda_attention_plan *p, int rows);

/* How many warps a CTA of the decode kernel has: 0 (a new plan's setting) lets each step
 * choose, 8 for 2 to 16 decode sequences at head dim 128 (a graph plan: its padded size), else 4,
 * the faster on the H100 (bench/RESULTS.md, thirtieth session; head dim 64 not measured); 4 or 8
 * force it. With 4, tiles of 64 keys and
 * two CTAs an SM at head dim 128; with 8, tiles of 128 keys, one CTA an SM, split-KV partitions
 * of multiples of 128 keys (a context that CTAs of 4 warps split in two and merge, one CTA of 8
 * takes whole). Set it before a graph plan's first plan. Results differ in the last bits between
 * settings. Other values and NULL are ignored. */
void cuda_attention_set_decode_warps(struct cuda_attention_plan *p, int warps);

/* How many CTAs of 4 warps an SM the decode kernel runs over an F8E4M3 pool at head dim 128: 0
 * (a new plan's setting) lets each step choose, 3 from 96 decode sequences (a graph plan: its
 * padded size), else 2, the faster on the H100 (bench/RESULTS.md, thirty-sixth session); 2 or 3
 * force it. With 3, 4 pipeline stages where 2 CTAs have 6, and at most 168 registers a thread.
 * Steps whose CTAs have 8 warps (cuda_attention_set_decode_warps), bf16 pools and head dim 64
 * are not affected. Set it before a graph plan's first plan. Results can differ in the last bits
 * between settings (the split-KV cost model counts each variant's resident CTAs, so a context
 * may be cut otherwise). Other values and NULL are ignored. */
void cuda_attention_set_decode_ctas(struct cuda_attention_plan *p, int ctas);

/* The split-KV partition of decode contexts, for benchmarks and tests: 0 (a new plan's setting)
 * lets each step's cost model choose; a multiple of 64 keys cuts every decode context longer
 * than it into partitions of that many keys (the last shorter; rounded up to a multiple of 128
 * where the step's CTAs have 8 warps: cuda_attention_set_decode_warps). A step whose partitions
 * then exceed the plan's capacity (a graph plan's grid: cuda_attention_plan_graph) fails to plan
 * with PAGODA_EINTERNAL. Other values and NULL are ignored. */
void cuda_attention_set_decode_split(struct cuda_attention_plan *p, int32_t keys);

#ifdef __cplusplus
}
#endif

#endif
