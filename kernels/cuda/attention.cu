/* Paged attention on the GPU: the plan (host validation, decode/prefill split, split-KV
 * partition, one asynchronous metadata copy) and the run (a decode kernel, a merge kernel for
 * split decode contexts, a prefill kernel), all reading K/V in place through the block table.
 *
 * Both kernels run on the tensor cores (mma.sync m16n8k16, bf16 operands, f32 accumulators) and
 * keep, per query row, a running max m, a running sum l of exp(score - m) and an f32
 * accumulator of the exp-weighted V (online softmax, as the CPU's paged version does). K/V tiles
 * of 64 keys (128 for decode CTAs of 8 warps) come from the pool through the block table into
 * XOR-swizzled shared memory by a cp.async pipeline (16-byte copies; the block-table entries a copy
 * needs are already at hand: in registers for decode, copied into shared memory a tile ahead for
 * prefill) and reach the tensor cores by ldmatrix; keys beyond a row's causal limit (or beyond the
 * context) get probability 0, and tiles past the last one a CTA needs are never read.
 *
 * This file holds the plan and the run; the decode kernel (with its merge) is in
 * attention_decode.cu, the prefill kernel in attention_prefill.cu, and what they share with the
 * plan (the geometry's constants, attn_args, the kernels' tables) in attention_impl.cuh. */
#include "kernels/cuda/attention.h"

#include "kernels/attention_batch.h"
#include "kernels/cuda/attention_impl.cuh"
#include "kernels/cuda/common.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

using namespace attn;

namespace
{

/* Rows (consecutive keys of one block) one bulk copy of the decode kernel moves: 4 (1 KiB at head
 * dim 128) for a step of fewer than kDecodeWideCopySeqs decode sequences, else 16 (4 KiB; 8 when
 * the block size is not a multiple of 16). On the H200 (bench/RESULTS.md, 2026-12-03) copies of
 * 16 rows made the attention of 256 sequences at 512 keys 8% faster (3.62 -> 3.92 TB/s) and the
 * decode step of 256 at context 640 4% faster (96: 0.8%, 128: 1.5%), but one sequence of 1100
 * keys 9% slower (each of its CTAs streams one tile, which more, smaller copies bring in sooner)
 * and 32 sequences' step 1.2% slower; at 64 they tie. */
constexpr int32_t kDecodeWideCopySeqs = 64;

/* The copy rows of a step with n decode sequences (a graph plan's n: its padded size, so that
 * capture and replay agree): kDecodeWideCopySeqs above, or what
 * cuda_attention_set_decode_copy_rows set. */
static int32_t decode_copy_rows(int32_t set, int32_t n, int32_t block_size)
{
    if (set != 0)
        return set;
    if (n < kDecodeWideCopySeqs)
        return 4;
    return block_size % 16 == 0 ? 16 : block_size % 8 == 0 ? 8 : 4;
}

/* Whether a step with n decode sequences (a graph plan's n: its padded size, so that capture and
 * replay agree) runs the decode kernel's CTAs of kDecodeWideWarps: from kDecodeWideMinSeqs to
 * kDecodeWideMaxSeqs sequences, or as cuda_attention_set_decode_warps set. Measured on an H100
 * (bench/RESULTS.md, thirtieth session; decode_step at 1152 keys, device ms, 4 warps -> 8): 1
 * sequence 5.64-5.80 -> 5.89 (its 9 partitions of 128 keys stream from 72 SMs, 18 of 64 from
 * 144 CTAs), 2 5.91 -> 5.86, 4 5.97 -> 5.95, 8 6.24 -> 6.25, 12 6.58 -> 6.35, 16 6.73 -> 6.56
 * (CTAs of 4 warps split each context in two and merge; one of 8 takes it whole), 24 7.54 ->
 * 8.01, 32 8.06 -> 8.16 (two rounds of 132 CTAs where 4 warps ran one of 256). */
/* Only at head dim 128, the one measured: at 64 a CTA of 4 warps takes 66 KiB, three an SM (12
 * warps), where one of 8 takes 130 KiB, one an SM. */
constexpr int32_t kDecodeWideMinSeqs = 2, kDecodeWideMaxSeqs = 16;
static bool decode_wide(int32_t set, int32_t n, int32_t head_dim)
{
    if (set != 0)
        return set == kDecodeWideWarps;
    return head_dim == 128 && n >= kDecodeWideMinSeqs && n <= kDecodeWideMaxSeqs;
}

/* The variant of a step with n decode sequences (a graph plan's n: its padded size): the wide one
 * as decode_wide says; else the dense one where the plan has it, from kDecodeDenseMinSeqs
 * sequences, or as cuda_attention_set_decode_ctas set (3 dense, 2 narrow). Measured on an H100
 * (bench/RESULTS.md, thirty-sixth session; decode_step fp8, device ms, narrow -> dense): 1
 * sequence at 1100 keys 5.641 -> 5.645, 16 6.211 -> 6.170 (8 warps either way), 64 8.457 ->
 * 8.961 and at 640 keys 7.480 -> 8.007, 96 9.855 -> 9.494 (640: 8.371 -> 8.191), 128 10.986 ->
 * 10.454 (9.075 -> 8.841), 192 13.600 -> 12.884 (10.864 -> 10.653), 256 at 640 12.58-12.63 ->
 * 12.33-12.34; the throughput workload (fp8, 256 in flight) 18,015 -> 18,770 tok/s. On an H200,
 * 256 at 640 keys 11.56-11.60 -> 11.18-11.23. At 64 the dense kernel loses uncut too (both forced
 * to one partition: 7.46 -> 7.50 at 640 keys, 8.43 -> 8.56 at 1100; thirty-seventh session), so
 * the split-KV cost model's cut with its 396 slots is only part of its loss there. */
constexpr int32_t kDecodeDenseMinSeqs = 96;

/* Rounds a word count up to a multiple of 4, so that int4 arrays stay 16-byte aligned. */
size_t align4(size_t words)
{
    return (words + 3) & ~(size_t)3;
}

} // namespace

struct cuda_attention_plan {
    struct cuda_attention_config config;
    int32_t group;                  /* query heads per KV head */
    int32_t decode_chunks;          /* decode CTAs per KV head: ceil(group / kDecodeHeadsMax) */
    int32_t tile_tokens;            /* query tokens per prefill tile */
    int32_t slots[kDecodeVariants]; /* decode CTAs resident at once on the GPU, per variant */
    /* The kernels for head_dim and the pool's dtype (decode_kernels, prefill_kernel_of):
     * decode_kernel of each variant (narrow, wide, dense), copies of 4, 8, 16 rows; prefill_kernel;
     * and their shared memory. */
    kernel_fn decode[kDecodeVariants][3];
    size_t decode_smem[kDecodeVariants][3];
    bool has_dense; /* decode[kDecodeDense] is decode_geom's DENSE (F8 at head dim 128) */
    kernel_fn prefill;
    size_t prefill_smem;
    int32_t max_parts;   /* decode partitions the scratch holds */
    int32_t split_extra; /* partitions a split adds to one per sequence, at most */
    /* The same for each variant alone (its own slots): a graph plan's grid holds pad +
     * graph_extra[variant] partitions' CTAs, split_extra for the largest. */
    int32_t graph_extra[kDecodeVariants];

    /* Metadata: packed per step into pinned staging (two slots, each guarded by an event
     * recorded after its copy), then one copy into the device buffer. */
    size_t meta_words;
    int32_t *staging[2];
    cudaEvent_t staged[2];
    bool pending[2];
    int next_slot;
    int32_t *meta;
    float *part_out, *part_lse;
    int32_t *merge_count;

    /* The planned step. */
    bool planned;
    bool graph; /* planned by cuda_attention_plan_graph: grid and layout fixed by num_seqs */
    int32_t num_seqs, num_tokens, table_stride;
    int32_t num_parts, num_merges, num_items;
    size_t off_query_start, off_context_len, off_tables, off_merges, off_parts, off_items;

    int early_kv;          /* cuda_attention_set_early_kv */
    int32_t copy_rows_set; /* cuda_attention_set_decode_copy_rows: 0, 4, 8 or 16 */
    int32_t split_set;     /* cuda_attention_set_decode_split: 0 or the partition's keys */
    int32_t copy_rows;     /* the planned step's: 4, 8 or 16 */
    int32_t warps_set;     /* cuda_attention_set_decode_warps: 0, 4 or 8 */
    int32_t ctas_set;      /* cuda_attention_set_decode_ctas: 0, 2 or 3 */
    int32_t variant;       /* the planned step's: kDecodeNarrow, kDecodeWide or kDecodeDense */
};

static int decode_variant(const struct cuda_attention_plan *p, int32_t n)
{
    if (decode_wide(p->warps_set, n, p->config.head_dim))
        return kDecodeWide;
    if (!p->has_dense || p->ctas_set == 2)
        return kDecodeNarrow;
    return p->ctas_set == 3 || n >= kDecodeDenseMinSeqs ? kDecodeDense : kDecodeNarrow;
}

/* Prefill tiles (sequence, first token, keys needed, 0) in descending order of keys needed;
 * ties in the order of the batch. */
static int item_cmp(const void *x, const void *y)
{
    const int4 *a = static_cast<const int4 *>(x), *b = static_cast<const int4 *>(y);
    if (a->z != b->z)
        return a->z > b->z ? -1 : 1;
    if (a->x != b->x)
        return a->x < b->x ? -1 : 1;
    return a->y < b->y ? -1 : a->y > b->y;
}

/* How a context of context_len keys is cut for a split of split keys: into n nearly equal,
 * tile-aligned partitions of *len keys (a multiple of align, the decode tile; the last one
 * shorter), n = ceil(context_len / split) at most. Returns n. */
static int32_t split_parts(int64_t context_len, int64_t split, int64_t align, int64_t *len)
{
    int64_t n = context_len <= split ? 1 : (context_len + split - 1) / split;
    *len = context_len;
    if (n > 1) {
        *len = ((context_len + n - 1) / n + align - 1) / align * align;
        n = (context_len + *len - 1) / *len;
    }
    return (int32_t)n;
}

/* The partitions a split for `waves` waves of the resident decode CTAs aims at: the candidate
 * split (plan) is ceil(decode keys / this), raised to kSplitMinTokens and kSplitAlign. */
static int64_t split_want(int64_t waves, int64_t slots, int64_t ctas_per_part)
{
    return (waves * slots + ctas_per_part - 1) / ctas_per_part;
}

/* The modelled time of the decode CTAs for a split, in keys streamed by one CTA: rounds of
 * `slots` CTAs over the mean partition, or the longest partition when it is longer, plus a
 * startup of kSplitStartupKeys per round, plus the merge when a context is split (the widest
 * merge's, which the last CTA of that sequence does after its own partition). (A model where
 * the CTAs resident on an SM share its bandwidth, so that one CTA an SM would stream as fast as
 * two, splits less from about 9 to 16 sequences: measured on the H200, 16 sequences of 1100 keys
 * took 36.9 us a layer unsplit against 28.5 split in two; bench/RESULTS.md, 2026-12-03.) */
static int64_t split_cost(const struct attention_batch *b, int64_t split, int64_t align,
                          int64_t ctas_per_part, int64_t slots)
{
    int64_t ctas = 0, keys = 0, longest = 0, widest = 1;
    for (int32_t q = 0; q < b->num_seqs; q++) {
        if (b->query_start[q + 1] - b->query_start[q] != 1)
            continue;
        int64_t len;
        const int32_t n = split_parts(b->context_len[q], split, align, &len);
        ctas += n * ctas_per_part;
        keys += b->context_len[q] * ctas_per_part;
        longest = len > longest ? len : longest;
        widest = n > widest ? n : widest;
    }
    if (ctas == 0)
        return 0;
    const int64_t rounds = (ctas + slots - 1) / slots;
    const int64_t spread = rounds * ((keys + ctas - 1) / ctas);
    const int64_t merge = widest > 1 ? kSplitMergeKeys + widest * kSplitMergePartKeys : 0;
    return (spread > longest ? spread : longest) + rounds * kSplitStartupKeys + merge;
}

static int config_check(const struct cuda_attention_config *c)
{
    if (c->num_heads <= 0 || c->num_kv_heads <= 0 || c->num_heads % c->num_kv_heads != 0)
        return pagoda_error_set(PAGODA_EINVAL,
                                "attention: num_heads %d is not a positive multiple of "
                                "num_kv_heads %d",
                                (int)c->num_heads, (int)c->num_kv_heads);
    if (c->head_dim <= 0 || c->head_dim > ATTENTION_HEAD_DIM_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "attention: head_dim %d outside 1..%d",
                                (int)c->head_dim, ATTENTION_HEAD_DIM_MAX);
    if (!isfinite(c->scale))
        return pagoda_error_set(PAGODA_EINVAL, "attention: scale is not finite");
    /* The prefill kernel folds the scale into exp2's argument and takes the row maximum of the
     * unscaled scores, which is the maximum of the scaled ones only for a positive scale. */
    if (!(c->scale > 0.0f))
        return pagoda_error_set(PAGODA_EINVAL, "attention: scale is not positive");
    struct attention_limits limits = {c->block_size, c->num_blocks, c->max_num_seqs,
                                      c->max_num_tokens, c->max_blocks_per_seq};
    int rc = attention_limits_check(&limits);
    if (rc < 0)
        return rc;
    if (c->head_dim != 64 && c->head_dim != 128)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuda attention: head_dim %d (the kernels take 64 or 128)",
                                (int)c->head_dim);
    if (c->kv_dtype != DTYPE_BF16 && c->kv_dtype != DTYPE_F8E4M3)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuda attention: a %s pool (the kernels read BF16 or F8_E4M3)",
                                dtype_name(c->kv_dtype));
    if (c->num_heads / c->num_kv_heads > kGroupMax)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "cuda attention: %d query heads per KV head (at most %d)",
                                (int)(c->num_heads / c->num_kv_heads), kGroupMax);
    return 0;
}

int cuda_attention_plan_new(const struct cuda_attention_config *c, struct cuda_attention_plan **out)
{
    if (c == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_plan_new: NULL argument");
    *out = NULL;
    int rc = config_check(c);
    if (rc < 0)
        return rc;

    int dev = 0, sms = 0;
    if ((rc = cuda_device_sms(&dev, &sms, "cuda_attention_plan_new: the device's SM count")) < 0)
        return rc;

    struct cuda_attention_plan *p =
        static_cast<struct cuda_attention_plan *>(calloc(1, sizeof(*p)));
    if (p == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "cuda_attention_plan_new: plan");
    p->config = *c;
    p->group = c->num_heads / c->num_kv_heads;
    p->decode_chunks = (p->group + kDecodeHeadsMax - 1) / kDecodeHeadsMax;
    p->tile_tokens = kPrefillRows / p->group;
    const bool f8 = c->kv_dtype == DTYPE_F8E4M3;
    decode_kernels(c->head_dim, f8, p->decode, p->decode_smem, &p->has_dense);
    prefill_kernel_of(c->head_dim, f8, &p->prefill, &p->prefill_smem);
    p->copy_rows = 4;
    /* The slots of each variant: the fewest CTAs an SM holds of its three copy widths (the same
     * today). */
    for (int w = 0; w < kDecodeVariants && rc == 0; w++) {
        int resident = INT32_MAX;
        const int threads = 32 * (w == kDecodeWide ? kDecodeWideWarps : kDecodeWarps);
        for (int v = 0; v < 3 && rc == 0; v++) {
            int r = 0;
            rc = cuda_call_result(cudaFuncSetAttribute(p->decode[w][v],
                                                       cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                       (int)p->decode_smem[w][v]),
                                  "cuda_attention_plan_new: cudaFuncSetAttribute (decode)");
            if (rc == 0)
                rc = cuda_call_result(
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&r, p->decode[w][v], threads,
                                                                  p->decode_smem[w][v]),
                    "cuda_attention_plan_new: cudaOccupancyMaxActiveBlocksPerMultiprocessor");
            resident = r < resident ? r : resident;
        }
        p->slots[w] = (resident > 0 ? resident : 1) * (sms > 0 ? sms : 1);
    }
    if (rc < 0) {
        free(p);
        return rc;
    }
    const int32_t ctas_per_part = c->num_kv_heads * p->decode_chunks;
    /* At most one partition per sequence, plus the extra ones a split adds, whatever the
     * minimum partition: a split is at least D / want keys (D the decode keys of the step, want
     * = split_want of its waves), so the sequences' ceil(context / split) partitions number
     * fewer than D / split + sequences <= want + sequences. A graph plan launches the decode
     * CTAs of that many partitions (launch), so that one captured launch serves every split a
     * step of its size can get. */
    p->split_extra = 0;
    for (int w = 0; w < kDecodeVariants; w++) {
        p->graph_extra[w] = (int32_t)split_want(kSplitWavesMax, p->slots[w], ctas_per_part) + 1;
        p->split_extra = p->graph_extra[w] > p->split_extra ? p->graph_extra[w] : p->split_extra;
    }
    p->max_parts = c->max_num_seqs + p->split_extra;

    /* Words of one step's metadata at its largest (int32 sizes: no overflow in uint64). */
    const uint64_t seqs = (uint64_t)c->max_num_seqs;
    const uint64_t words = align4(seqs + 1) + align4(seqs) +
                           align4(seqs * (uint64_t)c->max_blocks_per_seq) + 4 * seqs +
                           4 * (uint64_t)p->max_parts + 4 * (uint64_t)c->max_num_tokens;
    const uint64_t part_floats = (uint64_t)p->max_parts * (uint64_t)c->num_heads * c->head_dim;
    if (words > SIZE_MAX / sizeof(int32_t) / 4 || part_floats > SIZE_MAX / sizeof(float) / 4) {
        rc = pagoda_error_set(PAGODA_ENOMEM, "cuda_attention_plan_new: limits too large");
        goto fail;
    }
    p->meta_words = (size_t)words;
    for (int i = 0; i < 2; i++) {
        rc = cuda_call_result(cudaMallocHost(reinterpret_cast<void **>(&p->staging[i]),
                                             p->meta_words * sizeof(int32_t)),
                              "cuda_attention_plan_new: cudaMallocHost");
        if (rc < 0)
            goto fail;
        rc = cuda_call_result(cudaEventCreateWithFlags(&p->staged[i], cudaEventDisableTiming),
                              "cuda_attention_plan_new: cudaEventCreateWithFlags");
        if (rc < 0)
            goto fail;
    }
    rc = cuda_call_result(
        cudaMalloc(reinterpret_cast<void **>(&p->meta), p->meta_words * sizeof(int32_t)),
        "cuda_attention_plan_new: cudaMalloc (metadata)");
    if (rc < 0)
        goto fail;
    rc = cuda_call_result(
        cudaMalloc(reinterpret_cast<void **>(&p->part_out), (size_t)part_floats * sizeof(float)),
        "cuda_attention_plan_new: cudaMalloc (split-KV outputs)");
    if (rc < 0)
        goto fail;
    rc = cuda_call_result(cudaMalloc(reinterpret_cast<void **>(&p->part_lse),
                                     (size_t)p->max_parts * c->num_heads * sizeof(float)),
                          "cuda_attention_plan_new: cudaMalloc (split-KV lse)");
    if (rc < 0)
        goto fail;
    {
        const size_t counts = (size_t)c->max_num_seqs * p->decode_chunks * c->num_kv_heads;
        rc = cuda_call_result(
            cudaMalloc(reinterpret_cast<void **>(&p->merge_count), counts * sizeof(int32_t)),
            "cuda_attention_plan_new: cudaMalloc (split-KV counters)");
        if (rc == 0)
            rc = cuda_call_result(cudaMemset(p->merge_count, 0, counts * sizeof(int32_t)),
                                  "cuda_attention_plan_new: cudaMemset");
        if (rc == 0) /* the memset is on the legacy stream: done before any run */
            rc = cuda_call_result(cudaDeviceSynchronize(),
                                  "cuda_attention_plan_new: cudaDeviceSynchronize");
        if (rc < 0)
            goto fail;
    }
    rc = cuda_call_result(cudaFuncSetAttribute(p->prefill,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               (int)p->prefill_smem),
                          "cuda_attention_plan_new: cudaFuncSetAttribute");
    if (rc < 0)
        goto fail;
    *out = p;
    return 0;

fail:
    cuda_attention_plan_free(p);
    return rc;
}

void cuda_attention_plan_free(struct cuda_attention_plan *p)
{
    if (p == NULL)
        return;
    for (int i = 0; i < 2; i++) {
        if (p->staged[i] != NULL) {
            if (p->pending[i])
                (void)cudaEventSynchronize(p->staged[i]);
            (void)cudaEventDestroy(p->staged[i]);
        }
        if (p->staging[i] != NULL)
            (void)cudaFreeHost(p->staging[i]);
    }
    (void)cudaFree(p->meta);
    (void)cudaFree(p->part_out);
    (void)cudaFree(p->part_lse);
    (void)cudaFree(p->merge_count);
    free(p);
}

/* The plan of cuda_attention_plan, or with pad >= batch->num_seqs that of
 * cuda_attention_plan_graph (pad sequences in all, the batch's and padding ones). */
static int plan_impl(struct cuda_attention_plan *p, const struct attention_batch *batch,
                     int32_t pad, cudaStream_t s)
{
    if (p == NULL || batch == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_plan: NULL argument");
    p->planned = false;
    p->graph = pad > 0;
    const struct cuda_attention_config *c = &p->config;
    struct attention_limits limits = {c->block_size, c->num_blocks, c->max_num_seqs,
                                      c->max_num_tokens, c->max_blocks_per_seq};
    int32_t max_context_len = 0;
    int rc = attention_batch_check(&limits, batch, &max_context_len);
    if (rc < 0)
        return rc;

    const int32_t ns = batch->num_seqs;
    if (p->graph) {
        if (pad < ns || pad > c->max_num_seqs || pad > c->max_num_tokens)
            return pagoda_error_set(
                PAGODA_ERANGE,
                "cuda_attention_plan_graph: %d sequences padded to %d (at "
                "most %d)",
                (int)ns, (int)pad,
                (int)(c->max_num_seqs < c->max_num_tokens ? c->max_num_seqs : c->max_num_tokens));
        for (int32_t q = 0; q < ns; q++)
            if (batch->query_start[q + 1] - batch->query_start[q] != 1)
                return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                        "cuda_attention_plan_graph: sequence %d of the step is "
                                        "not a decode (%d tokens)",
                                        (int)q,
                                        (int)(batch->query_start[q + 1] - batch->query_start[q]));
    }
    p->num_seqs = p->graph ? pad : ns;
    p->num_tokens = p->graph ? pad : batch->num_tokens;
    p->num_parts = p->num_merges = p->num_items = 0;
    if (p->num_tokens == 0) {
        p->planned = true;
        return 0;
    }

    /* The staging slot's previous copy must have left it before it is rewritten. */
    const int slot = p->next_slot;
    if (p->pending[slot]) {
        rc = cuda_call_result(cudaEventSynchronize(p->staged[slot]),
                              "cuda_attention_plan: cudaEventSynchronize");
        if (rc < 0)
            return rc;
        p->pending[slot] = false;
    }
    int32_t *h = p->staging[slot];

    /* Layout of this step: tables are as wide as the longest context needs. */
    const int32_t table_stride = (max_context_len + c->block_size - 1) / c->block_size;
    p->table_stride = table_stride > 0 ? table_stride : 1;
    /* A graph plan's layout depends on pad alone: the header, query starts and context lengths
     * of pad sequences, merges, the most partitions pad sequences can have, then the tables. */
    const size_t ps = (size_t)p->num_seqs, graph_parts = ps + (size_t)p->split_extra;
    p->off_query_start = p->graph ? 4 : 0;
    p->off_context_len = align4(p->off_query_start + ps + 1);
    p->off_tables = p->graph ? align4(p->off_context_len + ps) + 4 * ps + 4 * graph_parts
                             : align4(p->off_context_len + ps);
    p->off_merges = p->graph ? align4(p->off_context_len + ps)
                             : align4(p->off_tables + ps * (size_t)p->table_stride);

    memcpy(h + p->off_query_start, batch->query_start, ((size_t)ns + 1) * sizeof(int32_t));
    memcpy(h + p->off_context_len, batch->context_len, (size_t)ns * sizeof(int32_t));
    for (int32_t q = ns; q < p->num_seqs; q++) { /* padding: one key, the reserved block's */
        h[p->off_query_start + (size_t)q + 1] = q + 1;
        h[p->off_context_len + (size_t)q] = 1;
        h[p->off_tables + (size_t)q * (size_t)p->table_stride] = 0;
    }
    int32_t num_decode = 0;
    int64_t decode_keys = 0;
    for (int32_t q = 0; q < ns; q++) {
        const int32_t context_len = batch->context_len[q];
        const int32_t blocks = (context_len + c->block_size - 1) / c->block_size;
        memcpy(h + p->off_tables + (size_t)q * (size_t)p->table_stride,
               batch->block_tables + (size_t)q * (size_t)batch->max_blocks_per_seq,
               (size_t)blocks * sizeof(int32_t));
        if (batch->query_start[q + 1] - batch->query_start[q] == 1) {
            num_decode++;
            decode_keys += context_len;
        }
    }
    p->copy_rows =
        decode_copy_rows(p->copy_rows_set, p->graph ? p->num_seqs : num_decode, c->block_size);
    p->variant = decode_variant(p, p->graph ? p->num_seqs : num_decode);
    /* Partitions are whole tiles of the kernel's width. */
    const int64_t align = p->variant == kDecodeWide ? 16 * kDecodeWideWarps : kSplitAlign;
    const int64_t slots = p->slots[p->variant];

    /* Split-KV: the cheapest of no split and splits sized for 1 .. kSplitWavesMax waves of the
     * resident decode CTAs (split_cost); see the loop below for how a context is cut. */
    const int64_t ctas_per_part = (int64_t)c->num_kv_heads * p->decode_chunks;
    int64_t split = INT64_MAX;
    if (num_decode > 0 && p->split_set > 0) {
        split = (p->split_set + align - 1) / align * align;
    } else if (num_decode > 0) {
        int64_t best = split_cost(batch, split, align, ctas_per_part, slots);
        for (int w = 1; w <= kSplitWavesMax; w++) {
            const int64_t want = split_want(w, slots, ctas_per_part);
            int64_t cand = (decode_keys + want - 1) / want;
            if (cand < kSplitMinTokens)
                cand = kSplitMinTokens;
            cand = (cand + align - 1) / align * align;
            const int64_t cost = split_cost(batch, cand, align, ctas_per_part, slots);
            if (cost < best) {
                best = cost;
                split = cand;
            }
        }
    }
    /* Merges (at most one per decode sequence) come first, then the partitions. */
    p->off_parts = p->off_merges + 4 * (p->graph ? ps : (size_t)num_decode);
    int4 *merges = reinterpret_cast<int4 *>(h + p->off_merges);
    int4 *parts = reinterpret_cast<int4 *>(h + p->off_parts);
    int32_t num_parts = 0, num_merges = 0;
    for (int32_t q = 0; q < ns; q++) {
        if (batch->query_start[q + 1] - batch->query_start[q] != 1)
            continue;
        const int64_t context_len = batch->context_len[q];
        int64_t len;
        const int32_t n = split_parts(context_len, split, align, &len);
        if (num_parts + n > p->max_parts)
            return pagoda_error_set(PAGODA_EINTERNAL,
                                    "cuda_attention_plan: %d split-KV partitions exceed %d",
                                    (int)(num_parts + n), (int)p->max_parts);
        for (int32_t i = 0; i < n; i++) {
            const int64_t begin = i * len;
            const int64_t end = begin + len < context_len ? begin + len : context_len;
            /* begin complemented where the partition holds the newest key (the kernel's
             * early K/V) */
            parts[num_parts + i] = make_int4(q, i == n - 1 ? ~(int)begin : (int)begin, (int)end,
                                             n > 1 ? num_merges : -1);
        }
        if (n > 1)
            merges[num_merges++] = make_int4(q, num_parts, n, 0);
        num_parts += n;
    }
    if (p->graph) {
        /* the grid's partitions: as many as the layout holds for the step's variant (decode_ctas),
         * whose splits aim at its own slots (fewer for CTAs of 8 warps, more for dense ones) */
        const size_t grid_parts = ps + (size_t)p->graph_extra[p->variant];
        if ((size_t)num_parts + ps - (size_t)ns > grid_parts)
            return pagoda_error_set(PAGODA_EINTERNAL,
                                    "cuda_attention_plan_graph: %d split-KV partitions exceed "
                                    "%d",
                                    (int)(num_parts + p->num_seqs - ns), (int)grid_parts);
        for (int32_t q = ns; q < p->num_seqs; q++)
            parts[num_parts++] = make_int4(q, ~0, 1, -1);
        h[0] = num_parts * c->num_kv_heads * p->decode_chunks; /* the decode kernel's header */
        h[1] = p->table_stride;
        h[2] = h[3] = 0;
    }
    /* Prefill tiles, the most keys first (the CTAs start in grid order, the KV head fastest:
     * the longest go first and the short ones fill the last wave, as FlashAttention does for
     * causal prefill). */
    p->off_items = p->graph ? p->off_tables + ps * (size_t)p->table_stride
                            : p->off_parts + 4 * (size_t)num_parts;
    int4 *items = reinterpret_cast<int4 *>(h + p->off_items);
    int32_t num_items = 0;
    for (int32_t q = 0; q < ns; q++) {
        const int32_t query_len = batch->query_start[q + 1] - batch->query_start[q];
        if (query_len == 1)
            continue;
        const int32_t pos0 = batch->context_len[q] - query_len;
        for (int32_t first = 0; first < query_len; first += p->tile_tokens) {
            const int32_t last =
                first + p->tile_tokens < query_len ? first + p->tile_tokens : query_len;
            items[num_items++] = make_int4(q, first, pos0 + last, 0);
        }
    }
    qsort(items, (size_t)num_items, sizeof(int4), item_cmp);
    const size_t words = p->off_items + 4 * (size_t)num_items;

    rc = cuda_call_result(
        cudaMemcpyAsync(p->meta, h, words * sizeof(int32_t), cudaMemcpyHostToDevice, s),
        "cuda_attention_plan: cudaMemcpyAsync");
    if (rc == 0)
        rc = cuda_call_result(cudaEventRecord(p->staged[slot], s),
                              "cuda_attention_plan: cudaEventRecord");
    if (rc < 0)
        return rc;
    p->pending[slot] = true;
    p->next_slot = slot ^ 1;
    p->num_parts = num_parts;
    p->num_merges = num_merges;
    p->num_items = num_items;
    p->planned = true;
    return 0;
}

int cuda_attention_plan(struct cuda_attention_plan *p, const struct attention_batch *batch,
                        cudaStream_t s)
{
    return plan_impl(p, batch, 0, s);
}

int cuda_attention_plan_graph(struct cuda_attention_plan *p, const struct attention_batch *batch,
                              int32_t num_seqs, cudaStream_t s)
{
    if (num_seqs < 1)
        return pagoda_error_set(PAGODA_ERANGE, "cuda_attention_plan_graph: %d sequences",
                                (int)num_seqs);
    return plan_impl(p, batch, num_seqs, s);
}

static int view_check(const struct cuda_attention_config *c, const struct kv_layer_view *kv)
{
    if (kv->dtype != c->kv_dtype || kv->block_size != c->block_size ||
        kv->num_kv_heads != c->num_kv_heads || kv->head_dim != c->head_dim ||
        kv->num_blocks != c->num_blocks)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "cuda_attention_run: the layer view (%s, block_size %d, %d KV "
                                "heads, head_dim %d, %d blocks) differs from the plan (%s, %d, "
                                "%d, %d, %d)",
                                dtype_name(kv->dtype), (int)kv->block_size, (int)kv->num_kv_heads,
                                (int)kv->head_dim, (int)kv->num_blocks, dtype_name(c->kv_dtype),
                                (int)c->block_size, (int)c->num_kv_heads, (int)c->head_dim,
                                (int)c->num_blocks);
    if (kv->k == NULL || kv->v == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run: the layer view has no K/V");
    /* strides of whole 16-byte chunks: 8 bf16 elements, 16 F8E4M3 ones */
    const int64_t chunk = 16 / (int64_t)dtype_size(kv->dtype);
    if (!cuda_aligned16(kv->k) || !cuda_aligned16(kv->v) || kv->block_stride % chunk != 0 ||
        kv->head_stride % chunk != 0 || kv->slot_stride % chunk != 0)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_attention_run: the layer view is not 16-byte aligned "
                                "(strides %lld, %lld, %lld)",
                                (long long)kv->block_stride, (long long)kv->head_stride,
                                (long long)kv->slot_stride);
    return 0;
}

/* The decode kernel's grid for the planned step. */
static unsigned decode_ctas(const struct cuda_attention_plan *p)
{
    const int32_t parts = p->graph ? p->num_seqs + p->graph_extra[p->variant] : p->num_parts;
    return (unsigned)parts * (unsigned)p->config.num_kv_heads * (unsigned)p->decode_chunks;
}

static int launch(const struct cuda_attention_plan *p, const attn_args &a, cudaStream_t s)
{
    const struct cuda_attention_config *c = &p->config;
    /* A graph plan launches the most CTAs its sequences can need (the header says how many have
     * work), so that the launch captured once fits every step of that size. */
    const unsigned ctas = decode_ctas(p);
    if (ctas > 0) {
        const int v = p->copy_rows == 4 ? 0 : p->copy_rows == 8 ? 1 : 2;
        const int threads = 32 * (p->variant == kDecodeWide ? kDecodeWideWarps : kDecodeWarps);
        int rc = launch_pdl("cuda_attention_run: decode kernel", p->decode[p->variant][v], ctas,
                            threads, p->decode_smem[p->variant][v], s, a);
        if (rc < 0)
            return rc;
        cuda_pdl_note_late(a.late);
    }
    if (p->num_items > 0) {
        const unsigned ctas = (unsigned)p->num_items * c->num_kv_heads;
        const kernel_fn prefill = p->prefill;
        prefill<<<ctas, kPrefillThreads, p->prefill_smem, s>>>(a);
        int rc = cuda_launch_result("cuda_attention_run: prefill kernel");
        if (rc < 0)
            return rc;
    }
    return 0;
}

static int run_impl(struct cuda_attention_plan *p, const struct kv_layer_view *kv,
                    const uint16_t *q, int64_t q_row_stride, uint16_t *out,
                    const struct cuda_attention_rope *rope, cudaStream_t s)
{
    if (p == NULL || kv == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run: NULL plan or view");
    if (!p->planned)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run: no batch planned");
    const struct cuda_attention_config *c = &p->config;
    int rc = view_check(c, kv);
    if (rc < 0)
        return rc;
    if (p->num_tokens == 0)
        return 0;
    if (q == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run: NULL q or out");
    if (!cuda_aligned16(q) || !cuda_aligned16(out) || q_row_stride % 8 != 0 ||
        q_row_stride < (int64_t)c->num_heads * c->head_dim)
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda_attention_run: q and out must be 16-byte aligned and "
                                "q_row_stride (%lld) a multiple of 8, at least %d",
                                (long long)q_row_stride, (int)(c->num_heads * c->head_dim));

    attn_args a;
    a.k = static_cast<const uint16_t *>(kv->k);
    a.v = static_cast<const uint16_t *>(kv->v);
    a.block_stride = kv->block_stride;
    a.head_stride = kv->head_stride;
    a.slot_stride = kv->slot_stride;
    a.block_size = c->block_size;
    a.block_shift = -1;
    for (int sh = 0; sh < 7; sh++)
        if (c->block_size == 1 << sh)
            a.block_shift = sh;
    a.num_heads = c->num_heads;
    a.num_kv_heads = c->num_kv_heads;
    a.group = p->group;
    a.scale = c->scale;
    a.q = q;
    a.q_row_stride = q_row_stride;
    a.out = out;
    a.query_start = p->meta + p->off_query_start;
    a.context_len = p->meta + p->off_context_len;
    a.block_tables = p->meta + p->off_tables;
    a.table_stride = p->table_stride;
    a.dparts = reinterpret_cast<const int4 *>(p->meta + p->off_parts);
    a.merges = reinterpret_cast<const int4 *>(p->meta + p->off_merges);
    a.pitems = reinterpret_cast<const int4 *>(p->meta + p->off_items);
    a.decode_chunks = p->decode_chunks;
    a.tile_tokens = p->tile_tokens;
    a.part_out = p->part_out;
    a.part_lse = p->part_lse;
    a.merge_count = p->merge_count;
    a.graph_hdr = p->graph ? p->meta : nullptr;
    a.early_kv = p->early_kv;
    a.late = cuda_pdl_late_wanted();
    a.rope = rope != NULL;
    a.num_blocks = c->num_blocks;
    a.rope_pos = rope != NULL ? rope->positions : nullptr;
    a.rope_inv_freq = rope != NULL ? rope->inv_freq : nullptr;
    a.rope_slots = rope != NULL ? rope->slot_mapping : nullptr;
    if (rope != NULL) {
        if (p->num_items > 0)
            return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                    "cuda_attention_run_rope: the step has prefill tokens");
        if (rope->positions == NULL || rope->inv_freq == NULL || rope->slot_mapping == NULL)
            return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run_rope: NULL rope buffer");
        if (q_row_stride < (int64_t)(c->num_heads + 2 * c->num_kv_heads) * c->head_dim)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "cuda_attention_run_rope: q_row_stride %lld holds no K and V "
                                    "after the %d query heads",
                                    (long long)q_row_stride, (int)c->num_heads);
    }
    return launch(p, a, s);
}

int cuda_attention_run(struct cuda_attention_plan *p, const struct kv_layer_view *kv,
                       const uint16_t *q, int64_t q_row_stride, uint16_t *out, cudaStream_t s)
{
    return run_impl(p, kv, q, q_row_stride, out, NULL, s);
}

int cuda_attention_run_rope(struct cuda_attention_plan *p, const struct kv_layer_view *kv,
                            const uint16_t *qkv, int64_t row_stride,
                            const struct cuda_attention_rope *rope, uint16_t *out, cudaStream_t s)
{
    if (rope == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_run_rope: NULL rope");
    return run_impl(p, kv, qkv, row_stride, out, rope, s);
}

int cuda_attention_planned_decode_only(const struct cuda_attention_plan *p)
{
    return p != NULL && p->planned && p->num_items == 0;
}

void cuda_attention_set_early_kv(struct cuda_attention_plan *p, int on)
{
    if (p != NULL)
        p->early_kv = on != 0;
}

void cuda_attention_set_decode_copy_rows(struct cuda_attention_plan *p, int rows)
{
    if (p != NULL && (rows == 0 || rows == 4 || rows == 8 || rows == 16))
        p->copy_rows_set = rows;
}

void cuda_attention_set_decode_warps(struct cuda_attention_plan *p, int warps)
{
    if (p != NULL && (warps == 0 || warps == kDecodeWarps || warps == kDecodeWideWarps))
        p->warps_set = warps;
}

void cuda_attention_set_decode_ctas(struct cuda_attention_plan *p, int ctas)
{
    if (p != NULL && (ctas == 0 || ctas == 2 || ctas == 3))
        p->ctas_set = ctas;
}

void cuda_attention_set_decode_split(struct cuda_attention_plan *p, int32_t keys)
{
    if (p != NULL && keys >= 0 &&
        (keys == 0 || (keys >= kSplitMinTokens && keys % kSplitAlign == 0)))
        p->split_set = keys;
}

int cuda_attention_decode_shape(const struct cuda_attention_plan *p, int32_t *ctas,
                                int32_t *partitions)
{
    if (p == NULL || ctas == NULL || partitions == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_decode_shape: NULL argument");
    if (!p->planned)
        return pagoda_error_set(PAGODA_EINVAL, "cuda_attention_decode_shape: no batch planned");
    *ctas = (int32_t)decode_ctas(p);
    *partitions = p->num_parts;
    return 0;
}
