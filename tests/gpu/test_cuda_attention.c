/* Tests of kernels/cuda's paged attention (prefill and decode, split and unsplit contexts,
 * early K/V, replays from captured decode graphs, the plans' refusals) against the CPU
 * reference (kernels/cpu/attention.h) on the same bf16 inputs, compared in f32. Until
 * 2026-12-03 part of test_cuda_kernels.c (the ops and linears stay there); the helpers both
 * use are tests/gpu/kernel_check.h. "test_cuda_attention graph" runs the graph cases alone.
 *
 * Every input is fresh random data; every device output is poisoned (0xFF bytes: NaN in bf16
 * and f32) before the run, and so is the whole KV pool before K/V is written, so a kernel that
 * skips an output, reads a slot past the context, a block it was not given or the wrong layer
 * produces NaN and fails. The pool has two layers and the tests use layer 1. Block tables are
 * random permutations of blocks 1 .. num_blocks - 1. One line per case (kernel, config, relative
 * error ||out - ref|| / ||ref||), then "N passed, M failed". */
#include "tests/gpu/kernel_check.h"

#include "kernels/cpu/attention.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/util.h"
#include "kvpool/geometry.h"
#include "tests/gpu/hide_q.h"

#include <string.h>
#include <time.h>

/* ---- attention ---- */

struct shape {
    int32_t num_heads, num_kv_heads, head_dim, block_size;
};

/* The decode kernel's copy rows the attention cases force (cuda_attention_set_decode_copy_rows):
 * 0 lets each plan choose (4 rows below 64 decode sequences, 16 or 8 from 64 up). */
static int attn_copy_rows;
/* The decode kernel's warps a CTA the cases force (cuda_attention_set_decode_warps): 0 lets
 * each plan choose (8 from 2 to 16 decode sequences, else 4), 4 or 8. */
static int attn_warps;
/* The decode kernel's CTAs of 4 warps an SM over an F8E4M3 pool at head dim 128 the cases force
 * (cuda_attention_set_decode_ctas): 0 lets each plan choose (3 from 96 decode sequences, else 2),
 * 2 or 3. */
static int attn_ctas;
/* 1: test_attention_early_kv's passes keep early K/V off (they still launch with the attribute) */
static int attn_early_off;
/* 1: the cases' GPU pools are F8E4M3 (--kv-cache-dtype fp8): the CPU reference's K/V are then
 * each bf16 value rounded to its nearest code by common/dtype.h's f32_to_e4m3, and the codes
 * the GPU's cache writes store must be those, bit for bit. */
static int attn_f8;

static enum dtype attn_pool_dtype(void)
{
    return attn_f8 ? DTYPE_F8E4M3 : DTYPE_BF16;
}

/* x[i] = the value of its nearest F8E4M3 code, under attn_f8. */
static void pool_round(float *x, size_t n)
{
    for (size_t i = 0; attn_f8 && i < n; i++)
        x[i] = e4m3_to_f32(f32_to_e4m3(x[i]));
}

/* Under attn_f8: every code cuda_reshape_and_cache wrote for the n tokens at slots (K/V rows of
 * kvw bf16 at k + t * stride, v + t * stride) equals f32_to_e4m3 of the bf16 value. */
static void check_pool_codes(const struct kv_geometry *g, const void *d_pool, int32_t layer,
                             int32_t n, const int64_t *slots, const uint16_t *k, const uint16_t *v,
                             int64_t stride)
{
    if (!attn_f8 || n == 0)
        return;
    uint8_t *pool = xmalloc(kv_pool_bytes(g));
    download(pool, d_pool, kv_pool_bytes(g));
    struct kv_layer_view view = kv_layer_view_make(g, pool, layer);
    const int32_t nkv = g->num_kv_heads, hd = g->head_dim, bs = g->block_size;
    int64_t bad = 0, first = -1;
    for (int32_t t = 0; t < n; t++)
        for (int c = 0; c < 2; c++)
            for (int32_t i = 0; i < nkv * hd; i++) {
                const int32_t h = i / hd, d = i % hd;
                const uint8_t *at = (const uint8_t *)(c ? view.v : view.k) +
                                    slots[t] / bs * view.block_stride +
                                    slots[t] % bs * view.slot_stride + h * view.head_stride + d;
                const uint16_t x = (c ? v : k)[t * stride + i];
                if (*at != f32_to_e4m3(bf16_to_f32(x)) && bad++ == 0)
                    first = (int64_t)t * nkv * hd + i;
            }
    GPU_CHECK(bad == 0,
              "F8E4M3 cache write: %lld of %lld codes differ from f32_to_e4m3 (first at %lld)",
              (long long)bad, (long long)n * 2 * nkv * hd, (long long)first);
    free(pool);
}

/* One step: sequences with (query_len, context_len), the last query_len tokens of each context
 * being this step's. K/V of the earlier tokens is written by one reshape-and-cache call (a
 * prefix already in the pool), this step's from the fused QKV rows by another, as the worker
 * does; the CPU pool gets the same values in f32. */
static void test_attention(const char *label, struct shape sh, int32_t num_seqs,
                           const int32_t *query_len, const int32_t *context_len)
{
    const int32_t nh = sh.num_heads, nkv = sh.num_kv_heads, hd = sh.head_dim, bs = sh.block_size;
    const int64_t qkv_w = (int64_t)(nh + 2 * nkv) * hd, kvw = (int64_t)nkv * hd;
    const int64_t qw = (int64_t)nh * hd;

    int32_t *query_start = xmalloc(((size_t)num_seqs + 1) * sizeof(int32_t));
    int32_t num_tokens = 0, num_prefix = 0, max_blocks = 1, total_blocks = 0;
    for (int32_t s = 0; s < num_seqs; s++) {
        query_start[s] = num_tokens;
        num_tokens += query_len[s];
        num_prefix += context_len[s] - query_len[s];
        int32_t b = (context_len[s] + bs - 1) / bs;
        total_blocks += b;
        if (b > max_blocks)
            max_blocks = b;
    }
    query_start[num_seqs] = num_tokens;

    /* Block tables: a random permutation of 1 .. num_blocks - 1 (3 blocks left unused),
     * rows padded with zeros past what the context needs. */
    const int32_t num_blocks = total_blocks + 4;
    int32_t *perm = xmalloc((size_t)num_blocks * sizeof(int32_t));
    for (int32_t i = 0; i < num_blocks - 1; i++)
        perm[i] = i + 1;
    for (int32_t i = num_blocks - 2; i > 0; i--) {
        int32_t j = rand_int(i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int32_t *tables = calloc((size_t)num_seqs * max_blocks, sizeof(int32_t));
    for (int32_t s = 0, used = 0; s < num_seqs; s++)
        for (int32_t b = 0; b < (context_len[s] + bs - 1) / bs; b++)
            tables[(size_t)s * max_blocks + b] = perm[used++];

    /* Data: fused QKV rows of this step's tokens, contiguous K/V of the prefixes. */
    uint16_t *qkv = xmalloc((size_t)num_tokens * qkv_w * sizeof(uint16_t));
    uint16_t *pk = xmalloc(((size_t)num_prefix * kvw + 1) * sizeof(uint16_t));
    uint16_t *pv = xmalloc(((size_t)num_prefix * kvw + 1) * sizeof(uint16_t));
    fill_bf16(qkv, (size_t)num_tokens * qkv_w, -1.0f, 1.0f);
    for (int32_t t = 0; t < num_tokens; t++) /* sharper softmax: larger queries */
        for (int64_t i = 0; i < qw; i++)
            qkv[t * qkv_w + i] = f32_to_bf16(3.0f * bf16_to_f32(qkv[t * qkv_w + i]));
    fill_bf16(pk, (size_t)num_prefix * kvw, -1.0f, 1.0f);
    fill_bf16(pv, (size_t)num_prefix * kvw, -1.0f, 1.0f);
    int64_t *step_slots = xmalloc((size_t)num_tokens * sizeof(int64_t));
    int64_t *prefix_slots = xmalloc(((size_t)num_prefix + 1) * sizeof(int64_t));
    for (int32_t s = 0, p = 0; s < num_seqs; s++) {
        const int32_t *row = tables + (size_t)s * max_blocks;
        for (int32_t i = 0; i < context_len[s]; i++) {
            int64_t slot = (int64_t)row[i / bs] * bs + i % bs;
            int32_t j = i - (context_len[s] - query_len[s]);
            if (j < 0)
                prefix_slots[p++] = slot;
            else
                step_slots[query_start[s] + j] = slot;
        }
    }

    /* CPU reference: f32 pool and q with the same values. */
    struct kv_geometry cg = {1, 2, num_blocks, bs, nkv, hd, DTYPE_F32};
    float *cpool = xmalloc(kv_pool_bytes(&cg));
    for (size_t i = 0; i < kv_pool_bytes(&cg) / sizeof(float); i++)
        cpool[i] = NAN;
    struct kv_layer_view cview = kv_layer_view_make(&cg, cpool, 1);
    float *q = xmalloc((size_t)num_tokens * qw * sizeof(float));
    float *sk = xmalloc((size_t)num_tokens * kvw * sizeof(float));
    float *sv = xmalloc((size_t)num_tokens * kvw * sizeof(float));
    float *fk = xmalloc(((size_t)num_prefix * kvw + 1) * sizeof(float));
    float *fv = xmalloc(((size_t)num_prefix * kvw + 1) * sizeof(float));
    for (int32_t t = 0; t < num_tokens; t++) {
        bf16_to_f32_n(qkv + t * qkv_w, q + t * qw, (size_t)qw);
        bf16_to_f32_n(qkv + t * qkv_w + qw, sk + t * kvw, (size_t)kvw);
        bf16_to_f32_n(qkv + t * qkv_w + qw + kvw, sv + t * kvw, (size_t)kvw);
    }
    bf16_to_f32_n(pk, fk, (size_t)num_prefix * kvw);
    bf16_to_f32_n(pv, fv, (size_t)num_prefix * kvw);
    pool_round(sk, (size_t)num_tokens * kvw);
    pool_round(sv, (size_t)num_tokens * kvw);
    pool_round(fk, (size_t)num_prefix * kvw);
    pool_round(fv, (size_t)num_prefix * kvw);
    int rc = attention_write_kv(&cview, num_prefix, prefix_slots, fk, fv);
    rc |= attention_write_kv(&cview, num_tokens, step_slots, sk, sv);
    GPU_CHECK(rc == 0, "attention_write_kv: %d", rc);
    struct attention_config ccfg = {
        ATTN_CPU_PAGED, nh,       nkv,        hd,        1.0f / sqrtf((float)hd), bs, num_blocks,
        DTYPE_F32,      num_seqs, num_tokens, max_blocks};
    struct attention_batch batch = {num_seqs,    num_tokens, query_start,
                                    context_len, tables,     max_blocks};
    struct attention_plan *cplan = NULL;
    float *ref = xmalloc((size_t)num_tokens * qw * sizeof(float));
    rc = attention_plan_new(&ccfg, &cplan);
    if (rc == 0)
        rc = attention_plan(cplan, &batch);
    if (rc == 0)
        rc = attention_run(cplan, &cview, q, ref);
    GPU_CHECK(rc == 0, "CPU attention: %d (%s)", rc, pagoda_error_detail());
    attention_plan_free(cplan);

    /* GPU: bf16 (or F8E4M3) pool (two layers, all poison), reshape-and-cache, plan, run. The
     * plan's limits are larger than the batch, so its tables are repacked. */
    struct kv_geometry gg = cg;
    gg.dtype = attn_pool_dtype();
    size_t gbytes = kv_pool_bytes(&gg);
    void *d_pool = dev_alloc(gbytes);
    poison(d_pool, gbytes);
    struct kv_layer_view gview = kv_layer_view_make(&gg, d_pool, 1);
    uint16_t *d_qkv = dev_upload(qkv, (size_t)num_tokens * qkv_w * sizeof(uint16_t));
    uint16_t *d_pk = dev_upload(pk, ((size_t)num_prefix * kvw + 1) * sizeof(uint16_t));
    uint16_t *d_pv = dev_upload(pv, ((size_t)num_prefix * kvw + 1) * sizeof(uint16_t));
    int64_t *d_ps = dev_upload(prefix_slots, ((size_t)num_prefix + 1) * sizeof(int64_t));
    int64_t *d_ss = dev_upload(step_slots, (size_t)num_tokens * sizeof(int64_t));
    uint16_t *d_out = dev_alloc((size_t)num_tokens * qw * sizeof(uint16_t));
    poison(d_out, (size_t)num_tokens * qw * sizeof(uint16_t));
    rc = cuda_reshape_and_cache(&gview, d_pk, d_pv, kvw, d_ps, num_prefix, stream);
    rc |= cuda_reshape_and_cache(&gview, d_qkv + qw, d_qkv + qw + kvw, qkv_w, d_ss, num_tokens,
                                 stream);
    GPU_CHECK(rc == 0, "cuda_reshape_and_cache: %d", rc);
    check_pool_codes(&gg, d_pool, 1, num_prefix, prefix_slots, pk, pv, kvw);
    check_pool_codes(&gg, d_pool, 1, num_tokens, step_slots, qkv + qw, qkv + qw + kvw, qkv_w);

    struct cuda_attention_config gcfg = {nh,
                                         nkv,
                                         hd,
                                         1.0f / sqrtf((float)hd),
                                         bs,
                                         num_blocks,
                                         num_seqs + 3,
                                         num_tokens + 5,
                                         max_blocks + 7,
                                         attn_pool_dtype()};
    struct cuda_attention_plan *gplan = NULL;
    rc = cuda_attention_plan_new(&gcfg, &gplan);
    GPU_CHECK(rc == 0, "cuda_attention_plan_new: %d (%s)", rc, pagoda_error_detail());
    cuda_attention_set_decode_copy_rows(gplan, attn_copy_rows);
    cuda_attention_set_decode_warps(gplan, attn_warps);
    cuda_attention_set_decode_ctas(gplan, attn_ctas);
    /* Three plans in a row: the staging slots are reused once. */
    for (int i = 0; i < 3 && rc == 0; i++)
        rc = cuda_attention_plan(gplan, &batch, stream);
    GPU_CHECK(rc == 0, "cuda_attention_plan: %d (%s)", rc, pagoda_error_detail());
    /* The batch's arrays are the caller's again: scribble over them before the run. */
    for (size_t i = 0; i < (size_t)num_seqs * max_blocks; i++)
        tables[i] = -7;
    if (rc == 0) {
        rc = cuda_attention_run(gplan, &gview, d_qkv, qkv_w, d_out, stream);
        GPU_CHECK(rc == 0, "cuda_attention_run: %d (%s)", rc, pagoda_error_detail());
    }
    uint16_t *out = xmalloc((size_t)num_tokens * qw * sizeof(uint16_t));
    download(out, d_out, (size_t)num_tokens * qw * sizeof(uint16_t));

    /* Whole batch, and the worst sequence. */
    double all = rel_err_bf16(out, ref, (size_t)num_tokens * qw), worst = 0.0;
    int32_t worst_seq = 0;
    for (int32_t s = 0; s < num_seqs; s++) {
        double e = rel_err_bf16(out + (size_t)query_start[s] * qw,
                                ref + (size_t)query_start[s] * qw, (size_t)query_len[s] * qw);
        if (!(e <= worst)) {
            worst = e;
            worst_seq = s;
        }
    }
    int32_t num_decode = 0;
    for (int32_t s = 0; s < num_seqs; s++)
        num_decode += query_len[s] == 1;
    char cfg[160];
    snprintf(cfg, sizeof(cfg), "%s hd %d bs %d %d/%d heads, %d seqs (%d decode), %d tok%s%s%s%s",
             label, (int)hd, (int)bs, (int)nh, (int)nkv, (int)num_seqs, (int)num_decode,
             (int)num_tokens, attn_f8 ? ", fp8" : "",
             attn_ctas == 3   ? ", 3 ctas"
             : attn_ctas == 2 ? ", 2 ctas"
                              : "",
             attn_copy_rows == 4    ? ", rows 4"
             : attn_copy_rows == 8  ? ", rows 8"
             : attn_copy_rows == 16 ? ", rows 16"
                                    : "",
             attn_warps == 8   ? ", 8 warps"
             : attn_warps == 4 ? ", 4 warps"
                               : "");
    report("attention", cfg, all, TOLERANCE);
    char wcfg[200];
    snprintf(wcfg, sizeof(wcfg), "  worst seq %d (query %d, context %d)", (int)worst_seq,
             (int)query_len[worst_seq], (int)context_len[worst_seq]);
    report("attention", wcfg, worst, TOLERANCE);

    cuda_attention_plan_free(gplan);
    GPU_CK(cudaFree(d_pool));
    GPU_CK(cudaFree(d_qkv));
    GPU_CK(cudaFree(d_pk));
    GPU_CK(cudaFree(d_pv));
    GPU_CK(cudaFree(d_ps));
    GPU_CK(cudaFree(d_ss));
    GPU_CK(cudaFree(d_out));
    free(query_start);
    free(perm);
    free(tables);
    free(qkv);
    free(pk);
    free(pv);
    free(step_slots);
    free(prefix_slots);
    free(cpool);
    free(q);
    free(sk);
    free(sv);
    free(fk);
    free(fv);
    free(ref);
    free(out);
}

/* The mixed step of the brief: decodes at contexts 1, bs - 1, bs, bs + 1, 5 blocks and 3000,
 * fresh prefills (ragged, block-aligned), chunks continuing sequences already in the pool
 * (short and at 3000), in an interleaved order. */
static void test_attention_mixed(struct shape sh)
{
    const int32_t bs = sh.block_size;
    const int32_t query_len[] = {1, 37, 1, 20, 1, bs + 1, 1, 40, 1, 2, 1, 5 * bs, bs - 1};
    const int32_t context_len[] = {1,    37,     bs - 1, 5 * bs + 7, bs,     bs + 1, bs + 1,
                                   3000, 5 * bs, bs + 1, 3000,       5 * bs, bs - 1};
    test_attention("mixed", sh, (int32_t)(sizeof(query_len) / sizeof(query_len[0])), query_len,
                   context_len);
}

/* Many decodes: enough CTAs that no context is split. */
static void test_attention_many_decodes(struct shape sh, int32_t n)
{
    int32_t *query_len = xmalloc((size_t)n * sizeof(int32_t));
    int32_t *context_len = xmalloc((size_t)n * sizeof(int32_t));
    for (int32_t s = 0; s < n; s++) {
        query_len[s] = 1;
        context_len[s] = 1 + rand_int(700);
    }
    test_attention("decodes", sh, n, query_len, context_len);
    free(query_len);
    free(context_len);
}

/* Decodes at the edge lengths of the pool and of the decode kernel's tiles (32 keys at head
 * dim 128, 64 at 64) and split-KV partitions (multiples of 64 keys): in one batch small enough
 * that the long contexts are split and the short ones are not. */
static void test_attention_decode_edges(struct shape sh)
{
    const int32_t bs = sh.block_size;
    const int32_t context_len[] = {1,  bs - 1, bs,  bs + 1, 31,  32,   33,   63,
                                   64, 65,     255, 256,    257, 1000, 3000, 4 * bs + 3};
    enum { n = sizeof(context_len) / sizeof(context_len[0]) };
    int32_t query_len[n];
    for (int i = 0; i < n; i++)
        query_len[i] = 1;
    test_attention("decode edges", sh, n, query_len, context_len);
}

/* One long decode alone: split into many partitions. With one KV head, 10000 keys make at
 * least 40 partitions on any GPU of 40 resident decode CTAs or more (157 of 64 keys on the
 * H200): more than the merge loads at once (kMergeBatch, 32), so that its later batches run. */
static void test_attention_long_decode(struct shape sh, int32_t context)
{
    const int32_t query_len[] = {1}, context_len[] = {context};
    test_attention("one decode", sh, 1, query_len, context_len);
}

/* The decode attention requesting earlier K/V before its PDL wait (cuda_attention_set_early_kv)
 * right behind RoPE with the cache write, as a layer of the decode step runs them: n decodes,
 * every earlier key already in the pool, each newest slot set to NaN first, then cuda_rope_cache
 * (launched with programmatic dependent launch) rotates the step's rows and writes their K/V,
 * and the attention (early K/V on, launched with it) reads them. Ten passes must equal, bit for
 * bit and without a NaN, the same chain launched without the attribute and with early K/V off:
 * a tile requested before the wait that held a newest key would read the NaN (or a half-written
 * row). Contexts: n random ones of 1 .. max_ctx (with few sequences, the long ones are split
 * into partitions, whose first ones hold no newest key).
 * With slow_q, a kernel between RoPE and the attention (test_hide_q, tests/gpu/hide_q.cu)
 * hides the rotated q (NaN) for 500 us while the attention may already run its part before the
 * wait, then puts it back: an attention that reads q before its wait (a load hoisted above it,
 * as in the fifteenth session's producer-warp kernel, whose race test_cuda_kernels did not
 * see: RoPE is over too soon) reads NaN. A probe launched between them (test_pdl_probe) reads
 * q before its own wait: that it saw q hidden in at least one pass shows that the launches did
 * overlap, that is that the case tested something. */
/* The step's K and V of every sequence (each KV head's newest slot) from the pool, into
 * kv[n][2][nkv][hd]. */
static void download_newest(const struct kv_layer_view *view, const int64_t *step_slots, int32_t n,
                            int32_t bs, int32_t nkv, int32_t hd, uint8_t *kv)
{
    const size_t es = dtype_size(view->dtype);
    for (int32_t s = 0; s < n; s++)
        for (int c = 0; c < 2; c++)
            for (int32_t h = 0; h < nkv; h++) {
                const int64_t blk = step_slots[s] / bs, in = step_slots[s] % bs;
                const uint8_t *src = (const uint8_t *)(c ? view->v : view->k) +
                                     (blk * view->block_stride + in * view->slot_stride +
                                      (int64_t)h * view->head_stride) *
                                         (int64_t)es;
                download(kv + (((size_t)s * 2 + c) * nkv + h) * hd * es, src, (size_t)hd * es);
            }
}

/* With fused: passes 1 .. 10 run cuda_attention_run_rope on the unrotated rows instead of
 * cuda_rope_cache then cuda_attention_run, and the step's K and V it leaves in the pool must
 * also equal the reference chain's, bit for bit. */
static void test_attention_early_kv(struct shape sh, int32_t n, int32_t max_ctx, bool slow_q,
                                    bool fused)
{
    const int32_t nh = sh.num_heads, nkv = sh.num_kv_heads, hd = sh.head_dim, bs = sh.block_size;
    const int64_t qkv_w = (int64_t)(nh + 2 * nkv) * hd, kvw = (int64_t)nkv * hd;
    const int64_t qw = (int64_t)nh * hd;
    int32_t *qs = xmalloc(((size_t)n + 1) * sizeof(int32_t));
    int32_t *ctx = xmalloc((size_t)n * sizeof(int32_t)),
            *pos = xmalloc((size_t)n * sizeof(int32_t));
    int32_t max_blocks = 1, num_prefix = 0;
    for (int32_t s = 0; s < n; s++) {
        qs[s] = s;
        ctx[s] = s == 0 ? 1 : 1 + rand_int(max_ctx);
        pos[s] = ctx[s] - 1;
        num_prefix += ctx[s] - 1;
        if ((ctx[s] + bs - 1) / bs > max_blocks)
            max_blocks = (ctx[s] + bs - 1) / bs;
    }
    qs[n] = n;
    /* Blocks in sequence order from block 1, tables padded with zeros. */
    int32_t *tables = calloc((size_t)n * max_blocks, sizeof(int32_t));
    int32_t num_blocks = 1;
    for (int32_t s = 0; s < n; s++)
        for (int32_t b = 0; b < (ctx[s] + bs - 1) / bs; b++)
            tables[(size_t)s * max_blocks + b] = num_blocks++;
    int64_t *step_slots = xmalloc((size_t)n * sizeof(int64_t));
    int64_t *prefix_slots = xmalloc(((size_t)num_prefix + 1) * sizeof(int64_t));
    for (int32_t s = 0, p = 0; s < n; s++)
        for (int32_t i = 0; i < ctx[s]; i++) {
            const int64_t slot = (int64_t)tables[(size_t)s * max_blocks + i / bs] * bs + i % bs;
            if (i < ctx[s] - 1)
                prefix_slots[p++] = slot;
            else
                step_slots[s] = slot;
        }
    uint16_t *qkv = xmalloc((size_t)n * qkv_w * 2),
             *pk = xmalloc(((size_t)num_prefix + 1) * kvw * 2);
    uint16_t *pv = xmalloc(((size_t)num_prefix + 1) * kvw * 2);
    fill_bf16(qkv, (size_t)n * qkv_w, -2.0f, 2.0f);
    fill_bf16(pk, ((size_t)num_prefix + 1) * kvw, -1.0f, 1.0f);
    fill_bf16(pv, ((size_t)num_prefix + 1) * kvw, -1.0f, 1.0f);
    float *inv_freq = xmalloc((size_t)hd / 2 * sizeof(float));
    struct cpu_rope_params params = {CPU_ROPE_LLAMA3, 500000.0, 8.0, 1.0, 4.0, 8192.0};
    cpu_rope_inv_freq(&params, hd, inv_freq);

    struct kv_geometry g = {1, 2, num_blocks, bs, nkv, hd, attn_pool_dtype()};
    const size_t pool_bytes = kv_pool_bytes(&g);
    void *d_pool = dev_alloc(pool_bytes);
    poison(d_pool, pool_bytes);
    struct kv_layer_view view = kv_layer_view_make(&g, d_pool, 1);
    uint16_t *d_pk = dev_upload(pk, ((size_t)num_prefix + 1) * kvw * 2);
    uint16_t *d_pv = dev_upload(pv, ((size_t)num_prefix + 1) * kvw * 2);
    int64_t *d_ps = dev_upload(prefix_slots, ((size_t)num_prefix + 1) * sizeof(int64_t));
    int64_t *d_ss = dev_upload(step_slots, (size_t)n * sizeof(int64_t));
    int32_t *d_pos = dev_upload(pos, (size_t)n * sizeof(int32_t));
    float *d_inv = dev_upload(inv_freq, (size_t)hd / 2 * sizeof(float));
    uint16_t *d_nan = dev_alloc((size_t)n * kvw * 2), *d_qkv = dev_alloc((size_t)n * qkv_w * 2);
    poison(d_nan, (size_t)n * kvw * 2);
    uint16_t *d_out = dev_alloc((size_t)n * qw * 2);
    uint16_t *d_scratch = slow_q ? dev_alloc((size_t)n * qw * 2) : NULL;
    int32_t *d_seen = slow_q ? dev_alloc(sizeof(int32_t)) : NULL;
    int overlapped = 0; /* passes whose probe saw q hidden */
    int rc = cuda_reshape_and_cache(&view, d_pk, d_pv, kvw, d_ps, num_prefix, stream);
    GPU_CHECK(rc == 0, "early kv: the earlier keys: %d", rc);

    struct cuda_attention_config cfg = {
        nh, nkv, hd, 1.0f / sqrtf((float)hd), bs, num_blocks, n, n, max_blocks, attn_pool_dtype()};
    struct cuda_attention_plan *plan = NULL;
    rc = cuda_attention_plan_new(&cfg, &plan);
    cuda_attention_set_decode_copy_rows(plan, attn_copy_rows);
    cuda_attention_set_decode_warps(plan, attn_warps);
    cuda_attention_set_decode_ctas(plan, attn_ctas);
    struct attention_batch batch = {n, n, qs, ctx, tables, max_blocks};
    if (rc == 0)
        rc = cuda_attention_plan(plan, &batch, stream);
    GPU_CHECK(rc == 0, "early kv: plan: %d (%s)", rc, pagoda_error_detail());
    int32_t ctas = 0, parts = 0;
    if (rc == 0)
        rc = cuda_attention_decode_shape(plan, &ctas, &parts);
    uint16_t *want = xmalloc((size_t)n * qw * 2), *got = xmalloc((size_t)n * qw * 2);
    uint8_t *kv_want = xmalloc((size_t)n * 2 * kvw * 2), *kv_got = xmalloc((size_t)n * 2 * kvw * 2);
    const struct cuda_attention_rope rope = {d_pos, d_inv, d_ss};
    int differ = 0, nans = 0, kv_differ = 0;
    /* Pass 0: neither the attribute nor early K/V, the reference; then ten with both. */
    for (int pass = 0; pass < 11 && rc == 0; pass++) {
        cuda_set_pdl(pass > 0);
        cuda_attention_set_early_kv(plan, pass > 0 && !attn_early_off);
        GPU_CK(cudaMemcpyAsync(d_qkv, qkv, (size_t)n * qkv_w * 2, cudaMemcpyHostToDevice, stream));
        poison(d_out, (size_t)n * qw * 2);
        rc = cuda_reshape_and_cache(&view, d_nan, d_nan, kvw, d_ss, n, stream);
        if (rc == 0 && !(fused && pass > 0))
            rc = cuda_rope_cache(d_qkv, qkv_w, d_pos, d_inv, n, nh, &view, d_ss, stream);
        if (rc == 0 && slow_q)
            rc = test_hide_q(d_qkv, qkv_w, n, (int32_t)qw, d_scratch, 500, stream);
        if (rc == 0 && slow_q)
            rc = test_pdl_probe(d_qkv, d_seen, stream);
        if (rc == 0 && fused && pass > 0)
            rc = cuda_attention_run_rope(plan, &view, d_qkv, qkv_w, &rope, d_out, stream);
        else if (rc == 0)
            rc = cuda_attention_run(plan, &view, d_qkv, qkv_w, d_out, stream);
        if (rc == 0 && fused && (pass == 0 || pass == 10)) {
            GPU_CK(cudaStreamSynchronize(stream));
            download_newest(&view, step_slots, n, bs, nkv, hd, pass ? kv_got : kv_want);
            if (pass)
                kv_differ = memcmp(kv_got, kv_want, (size_t)n * 2 * kvw * dtype_size(g.dtype)) != 0;
        }
        if (rc == 0 && slow_q && pass > 0) {
            int32_t seen = 0;
            download(&seen, d_seen, sizeof(seen));
            overlapped += seen == 1;
        }
        GPU_CHECK(rc == 0, "early kv: pass %d: %d (%s)", pass, rc, pagoda_error_detail());
        download(pass ? got : want, d_out, (size_t)n * qw * 2);
        if (pass == 0)
            continue;
        differ += memcmp(got, want, (size_t)n * qw * 2) != 0;
        for (size_t i = 0; i < (size_t)n * qw; i++)
            nans += (got[i] & 0x7F80) == 0x7F80 && (got[i] & 0x7F) != 0;
    }
    for (size_t i = 0; i < (size_t)n * qw; i++)
        nans += (want[i] & 0x7F80) == 0x7F80 && (want[i] & 0x7F) != 0;
    cuda_set_pdl(0);
    char label[160];
    snprintf(label, sizeof(label),
             "hd %d bs %d %d/%d heads, %d decodes, %d partitions, rows %d%s%s%s%s%s", (int)hd,
             (int)bs, (int)nh, (int)nkv, (int)n, (int)parts, attn_copy_rows,
             slow_q ? ", slow q" : "", fused ? ", RoPE" : "", attn_early_off ? ", no early" : "",
             attn_f8 ? ", fp8" : "", attn_ctas == 3 ? ", 3 ctas" : "");
    printf("%-20s %-58s %d of 10 differ, %d NaN%s%s\n", "attention early kv", label, differ, nans,
           fused ? (kv_differ ? ", the step's K/V differ" : ", the step's K/V equal") : "",
           differ == 0 && nans == 0 && kv_differ == 0 ? "" : "  FAIL");
    GPU_CHECK(differ == 0 && nans == 0,
              "early kv: %d of 10 chains with it differ from the chain without, %d NaN", differ,
              nans);
    GPU_CHECK(kv_differ == 0,
              "early kv, RoPE inside: the step's K/V in the pool differ from cuda_rope_cache's");
    if (slow_q)
        GPU_CHECK(overlapped > 0,
                  "early kv, slow q: the probe behind test_hide_q never saw q hidden (0 of 10 "
                  "passes): the launches did not overlap, so this case tested nothing");

    cuda_attention_plan_free(plan);
    GPU_CK(cudaFree(d_pool));
    GPU_CK(cudaFree(d_pk));
    GPU_CK(cudaFree(d_pv));
    GPU_CK(cudaFree(d_ps));
    GPU_CK(cudaFree(d_ss));
    GPU_CK(cudaFree(d_pos));
    GPU_CK(cudaFree(d_inv));
    GPU_CK(cudaFree(d_nan));
    GPU_CK(cudaFree(d_qkv));
    GPU_CK(cudaFree(d_out));
    GPU_CK(cudaFree(d_scratch));
    GPU_CK(cudaFree(d_seen));
    free(qs);
    free(ctx);
    free(pos);
    free(tables);
    free(step_slots);
    free(prefix_slots);
    free(qkv);
    free(pk);
    free(pv);
    free(inv_freq);
    free(want);
    free(got);
    free(kv_want);
    free(kv_got);
}

/* ---- attention through captured decode graphs (issue 15) ---- */

#define GRAPH_MAX_SEQS 16 /* the largest graph the test captures */

/* One decode step of test_attention_graph: num_seqs sequences (contexts) replayed from the
 * graph of pad; min_parts, when positive, the fewest split-KV partitions the step must get. */
struct graph_step {
    int32_t pad, num_seqs, min_parts;
    int32_t context_len[GRAPH_MAX_SEQS];
};

/* Decode attention replayed from CUDA graphs as the worker's decode graphs run it
 * (worker/cuda_backend_graphs.c, cuda_be_capture_graphs): one plan; for each batch size a graph
 * captured on a plan of padding alone (cuda_attention_plan_graph of no sequence), then steps
 * planned by cuda_attention_plan_graph and replayed, padded to the graph's size (3 sequences in the
 * graph of 4, 13 and 2 in 16), at contexts whose splits differ from step to step and from the
 * capture's: one sequence of 1100 keys cut into at least 16 partitions on the Llama-3-8B shape
 * with CTAs of 4 warps (18 of 64 keys on the H200), 8 with CTAs of 8 (9 of 128), one of 32768,
 * short and long
 * ones together. Each replay must write the step's outputs exactly as the same step planned by
 * cuda_attention_plan and launched eagerly (bit for bit: attention.h), within TOLERANCE of the
 * CPU reference, and keep the grid it was captured with. Block 0 of the pool, which the padding
 * sequences read, is NaN: a padding row that leaked into a real one would show. */
static void test_attention_graph(struct shape sh)
{
    const int32_t nh = sh.num_heads, nkv = sh.num_kv_heads, hd = sh.head_dim, bs = sh.block_size;
    const int64_t qw = (int64_t)nh * hd;
    const struct graph_step steps[] = {
        {1, 1, 16, {1100}},
        {1, 1, 2, {32768}},
        {4, 3, 0, {1100, 17, 2900}},
        {16, 13, 0, {1100, 1037, 1163, 1100, 1100, 1089, 1111, 1100, 1076, 1124, 1100, 1099, 1101}},
        {1, 1, 0, {5}},
        {16, 16, 0, {1, 64, 65, 127, 128, 129, 1100, 300, 2000, 15, 16, 17, 4000, 999, 3, 700}},
        {4, 4, 0, {64, 65, 1, 4000}},
        {16, 2, 2, {32768, 1100}},
        {1, 1, 16, {1100}}, /* again, after other splits: the merge counters were reset */
    };
    enum { num_steps = sizeof(steps) / sizeof(steps[0]) };
    const int32_t pads[] = {1, 4, 16};
    enum { num_pads = sizeof(pads) / sizeof(pads[0]) };
    int32_t max_context = 1, max_step_blocks = 0;
    for (int i = 0; i < num_steps; i++) {
        int32_t blocks = 0;
        for (int32_t q = 0; q < steps[i].num_seqs; q++) {
            blocks += (steps[i].context_len[q] + bs - 1) / bs;
            if (steps[i].context_len[q] > max_context)
                max_context = steps[i].context_len[q];
        }
        if (blocks > max_step_blocks)
            max_step_blocks = blocks;
    }
    const int32_t bps = (max_context + bs - 1) / bs, num_blocks = max_step_blocks + 4;

    /* The pool (one layer) random, block 0 NaN; the CPU's in f32 with the same values. Under
     * attn_f8 the GPU's holds each bf16 value's nearest F8E4M3 code (NaN 0x7f in block 0). */
    struct kv_geometry gg = {1, 1, num_blocks, bs, nkv, hd, attn_pool_dtype()};
    struct kv_geometry cg = gg;
    cg.dtype = DTYPE_F32;
    const size_t elems = kv_pool_bytes(&gg) / dtype_size(gg.dtype);
    uint16_t *pool = xmalloc(elems * sizeof(uint16_t));
    fill_bf16(pool, elems, -1.0f, 1.0f);
    const int64_t block0 = (int64_t)2 * nkv * bs * hd; /* block 0: K, then V, of every head */
    for (int64_t i = 0; i < block0; i++)
        pool[i] = 0xFFFF;
    float *cpool = xmalloc(elems * sizeof(float));
    bf16_to_f32_n(pool, cpool, elems);
    pool_round(cpool, elems);
    uint8_t *codes = attn_f8 ? xmalloc(elems) : NULL; /* the F8E4M3 pool's bytes, if it is one */
    for (size_t i = 0; codes != NULL && i < elems; i++)
        codes[i] = f32_to_e4m3(cpool[i]);
    struct kv_layer_view cview = kv_layer_view_make(&cg, cpool, 0);
    void *d_pool = attn_f8 ? dev_upload(codes, elems) : dev_upload(pool, elems * sizeof(uint16_t));
    struct kv_layer_view gview = kv_layer_view_make(&gg, d_pool, 0);
    uint16_t *q = xmalloc((size_t)GRAPH_MAX_SEQS * qw * sizeof(uint16_t));
    fill_bf16(q, (size_t)GRAPH_MAX_SEQS * qw, -3.0f, 3.0f); /* sharper softmax */
    float *fq = xmalloc((size_t)GRAPH_MAX_SEQS * qw * sizeof(float));
    bf16_to_f32_n(q, fq, (size_t)GRAPH_MAX_SEQS * qw);
    uint16_t *d_q = dev_upload(q, (size_t)GRAPH_MAX_SEQS * qw * sizeof(uint16_t));
    uint16_t *d_out = dev_alloc((size_t)GRAPH_MAX_SEQS * qw * sizeof(uint16_t));

    struct cuda_attention_config gcfg = {nh,
                                         nkv,
                                         hd,
                                         1.0f / sqrtf((float)hd),
                                         bs,
                                         num_blocks,
                                         GRAPH_MAX_SEQS,
                                         GRAPH_MAX_SEQS,
                                         bps,
                                         attn_pool_dtype()};
    struct cuda_attention_plan *p = NULL;
    int rc = cuda_attention_plan_new(&gcfg, &p);
    GPU_CHECK(rc == 0, "cuda_attention_plan_new: %d (%s)", rc, pagoda_error_detail());
    cuda_attention_set_decode_warps(p, attn_warps);
    cuda_attention_set_decode_ctas(p, attn_ctas);
    cudaGraphExec_t graphs[num_pads] = {NULL};
    int32_t grid[num_pads] = {0};
    static const int32_t zero = 0;
    const struct attention_batch none = {0, 0, &zero, NULL, NULL, 1};
    for (int g = 0; g < num_pads && rc == 0; g++) {
        int32_t parts = 0;
        rc = cuda_attention_plan_graph(p, &none, pads[g], stream);
        if (rc == 0)
            rc = cuda_attention_decode_shape(p, &grid[g], &parts);
        GPU_CHECK(rc == 0, "graph plan of %d padding sequences: %d (%s)", (int)pads[g], rc,
                  pagoda_error_detail());
        if (rc != 0)
            break;
        GPU_CK(cudaStreamSynchronize(stream));
        GPU_CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
        rc = cuda_attention_run(p, &gview, d_q, qw, d_out, stream);
        cudaGraph_t graph = NULL;
        GPU_CK(cudaStreamEndCapture(stream, &graph));
        GPU_CHECK(rc == 0, "cuda_attention_run (captured): %d (%s)", rc, pagoda_error_detail());
        GPU_CK(cudaGraphInstantiate(&graphs[g], graph, 0));
        GPU_CK(cudaGraphDestroy(graph));
    }

    int32_t qs[GRAPH_MAX_SEQS + 1];
    int32_t *tables = xmalloc((size_t)GRAPH_MAX_SEQS * bps * sizeof(int32_t));
    int32_t *perm = xmalloc((size_t)num_blocks * sizeof(int32_t));
    uint16_t *gout = xmalloc((size_t)GRAPH_MAX_SEQS * qw * sizeof(uint16_t));
    uint16_t *eout = xmalloc((size_t)GRAPH_MAX_SEQS * qw * sizeof(uint16_t));
    float *ref = xmalloc((size_t)GRAPH_MAX_SEQS * qw * sizeof(float));
    for (int i = 0; i < num_steps && rc == 0; i++) {
        const struct graph_step *st = &steps[i];
        const int32_t n = st->num_seqs;
        int g = 0;
        while (pads[g] != st->pad)
            g++;
        /* Block tables: a fresh random permutation of blocks 1 .. num_blocks - 1. */
        for (int32_t b = 0; b < num_blocks - 1; b++)
            perm[b] = b + 1;
        for (int32_t b = num_blocks - 2; b > 0; b--) {
            int32_t j = rand_int(b + 1), t = perm[b];
            perm[b] = perm[j];
            perm[j] = t;
        }
        for (int32_t s = 0, used = 0; s < n; s++) {
            qs[s] = s;
            for (int32_t b = 0; b < bps; b++)
                tables[(size_t)s * bps + b] =
                    b < (st->context_len[s] + bs - 1) / bs ? perm[used++] : 0;
        }
        qs[n] = n;
        const struct attention_batch batch = {n, n, qs, st->context_len, tables, bps};

        /* The graph's replay. */
        int32_t ctas = 0, parts = 0;
        poison(d_out, (size_t)GRAPH_MAX_SEQS * qw * sizeof(uint16_t));
        rc = cuda_attention_plan_graph(p, &batch, st->pad, stream);
        if (rc == 0)
            rc = cuda_attention_decode_shape(p, &ctas, &parts);
        GPU_CHECK(rc == 0, "step %d: cuda_attention_plan_graph: %d (%s)", i, rc,
                  pagoda_error_detail());
        if (rc != 0)
            break;
        GPU_CK(cudaGraphLaunch(graphs[g], stream));
        download(gout, d_out, (size_t)n * qw * sizeof(uint16_t));
        const int32_t real_parts = parts - (st->pad - n); /* one per padding sequence */

        /* The same step, eagerly. */
        poison(d_out, (size_t)GRAPH_MAX_SEQS * qw * sizeof(uint16_t));
        rc = cuda_attention_plan(p, &batch, stream);
        if (rc == 0)
            rc = cuda_attention_run(p, &gview, d_q, qw, d_out, stream);
        GPU_CHECK(rc == 0, "step %d: eager plan and run: %d (%s)", i, rc, pagoda_error_detail());
        download(eout, d_out, (size_t)n * qw * sizeof(uint16_t));

        /* The CPU reference. */
        struct attention_config ccfg = {
            ATTN_CPU_PAGED, nh, nkv, hd, 1.0f / sqrtf((float)hd), bs, num_blocks,
            DTYPE_F32,      n,  n,   bps};
        struct attention_plan *cplan = NULL;
        int crc = attention_plan_new(&ccfg, &cplan);
        if (crc == 0)
            crc = attention_plan(cplan, &batch);
        if (crc == 0)
            crc = attention_run(cplan, &cview, fq, ref);
        GPU_CHECK(crc == 0, "CPU attention: %d (%s)", crc, pagoda_error_detail());
        attention_plan_free(cplan);

        char cfg[160];
        snprintf(cfg, sizeof(cfg), "graph of %d, %d seqs (first context %d): %d partitions%s%s%s",
                 (int)st->pad, (int)n, (int)st->context_len[0], (int)real_parts,
                 attn_warps == 4   ? ", 4 warps"
                 : attn_warps == 8 ? ", 8 warps"
                                   : "",
                 attn_f8 ? ", fp8" : "", attn_ctas == 3 ? ", 3 ctas" : "");
        report("attention graph", cfg, rel_err_bf16(gout, ref, (size_t)n * qw), TOLERANCE);
        const bool same = memcmp(gout, eout, (size_t)n * qw * sizeof(uint16_t)) == 0;
        printf("%-20s   %-56s %s\n", "attention graph", "replay against eager",
               same ? "equal" : "DIFFERENT  FAIL");
        GPU_CHECK(same, "%s: the replay's outputs differ from the eager step's", cfg);
        GPU_CHECK(ctas == grid[g], "%s: grid %d, the graph was captured with %d", cfg, (int)ctas,
                  (int)grid[g]);
        /* CTAs of 8 warps cut a context into half as many partitions, of 128 keys */
        const int32_t want = attn_warps == 8 ? (st->min_parts + 1) / 2 : st->min_parts;
        GPU_CHECK(real_parts >= want, "%s: fewer than %d", cfg, (int)want);
    }

    for (int g = 0; g < num_pads; g++)
        if (graphs[g] != NULL)
            GPU_CK(cudaGraphExecDestroy(graphs[g]));
    cuda_attention_plan_free(p);
    GPU_CK(cudaFree(d_pool));
    GPU_CK(cudaFree(d_q));
    GPU_CK(cudaFree(d_out));
    free(pool);
    free(cpool);
    free(codes);
    free(q);
    free(fq);
    free(tables);
    free(perm);
    free(gout);
    free(eout);
    free(ref);
}

/* The bound a captured decode graph relies on: however a step of up to pad sequences is split,
 * its partitions fit the grid captured for pad (the plan's split_extra; attention.cu says why
 * the bound holds for any minimum partition). Random decode batches of the Llama-3-8B shape,
 * padded to graph sizes 1 .. 64, with one long context among short ones now and then (the
 * splits that add the most partitions), each planned by cuda_attention_plan_graph, which
 * refuses a step whose partitions would not fit (PAGODA_EINTERNAL); nothing runs. */
static void test_attention_graph_bound(void)
{
    enum { max_seqs = 64, bs = 16, rounds = 600 };
    const int32_t max_context = 32768, bps = max_context / bs, pool_blocks = 4096;
    struct cuda_attention_config c = {32,       8,        128, 0.0884f,   bs, pool_blocks + 1,
                                      max_seqs, max_seqs, bps, DTYPE_BF16};
    struct cuda_attention_plan *p = NULL;
    int rc = cuda_attention_plan_new(&c, &p);
    GPU_CHECK(rc == 0, "cuda_attention_plan_new: %d (%s)", rc, pagoda_error_detail());
    if (rc != 0)
        return;
    int32_t qs[max_seqs + 1], ctx[max_seqs];
    int32_t *tables = xmalloc((size_t)max_seqs * bps * sizeof(int32_t));
    for (int64_t i = 0; i < (int64_t)max_seqs * bps; i++)
        tables[i] = 1 + (int32_t)(i % pool_blocks);
    int32_t most = 0, most_pad = 0, most_seqs = 0, allowed = 0, failures = 0;
    for (int r = 0; r < rounds; r++) {
        const int32_t pad = 1 << rand_int(7), n = 1 + rand_int(pad);
        const int32_t shape = rand_int(3); /* short contexts, one long among them, any */
        for (int32_t s = 0; s <= n; s++)
            qs[s] = s;
        for (int32_t s = 0; s < n; s++)
            ctx[s] = shape == 2 || (shape == 1 && s == 0) ? 1 + rand_int(max_context)
                                                          : 1 + rand_int(1 + rand_int(2000));
        const struct attention_batch b = {n, n, qs, ctx, tables, bps};
        int32_t ctas = 0, parts = 0;
        rc = cuda_attention_plan_graph(p, &b, pad, stream);
        if (rc == 0)
            rc = cuda_attention_decode_shape(p, &ctas, &parts);
        if (rc != 0) {
            if (failures++ == 0)
                printf("%-20s graph of %d, %d seqs, first context %d: %d (%s)  FAIL\n",
                       "attention graph", (int)pad, (int)n, (int)ctx[0], rc, pagoda_error_detail());
            continue;
        }
        const int32_t extra = parts - pad; /* partitions beyond one per sequence */
        if (extra > most) {
            most = extra;
            most_pad = pad;
            most_seqs = n;
            allowed = ctas / 8 - pad;
        }
    }
    char line[160];
    snprintf(line, sizeof(line),
             "%d random steps: at most %d extra partitions (graph of %d, %d seqs; %d fit)",
             (int)rounds, (int)most, (int)most_pad, (int)most_seqs, (int)allowed);
    printf("%-20s %-58s %s\n", "attention graph", line, failures == 0 ? "ok" : "FAIL");
    GPU_CHECK(failures == 0, "%d of %d graph plans refused", (int)failures, (int)rounds);
    cuda_attention_plan_free(p);
    free(tables);
}

/* ---- refusals ---- */

/* The GPU plan refuses b with want, as the CPU plan does. */
static void refuse_batch(struct cuda_attention_plan *p, struct attention_plan *cp, const char *what,
                         const struct attention_batch *b, int want)
{
    int cpu = attention_plan(cp, b);
    int gpu = cuda_attention_plan(p, b, stream);
    char line[96];
    snprintf(line, sizeof(line), "plan: %s (CPU %d)", what, cpu);
    expect_rc(line, gpu, want);
    GPU_CHECK(cpu == gpu, "%s: CPU plan %d, GPU plan %d", what, cpu, gpu);
}

static void test_refusals(void)
{
    /* Configurations. */
    struct cuda_attention_config good = {8, 2, 64, 0.125f, 16, 20, 4, 64, 8, DTYPE_BF16};
    struct cuda_attention_plan *p = NULL;
    struct cuda_attention_config c = good;
    c.head_dim = 96;
    expect_rc("plan_new head_dim 96", cuda_attention_plan_new(&c, &p), PAGODA_EUNSUPPORTED);
    c = good;
    c.head_dim = 0;
    expect_rc("plan_new head_dim 0", cuda_attention_plan_new(&c, &p), PAGODA_ERANGE);
    c = good;
    c.num_heads = 7;
    expect_rc("plan_new 7 heads / 2 kv heads", cuda_attention_plan_new(&c, &p), PAGODA_EINVAL);
    c = good;
    c.block_size = 4;
    expect_rc("plan_new block_size 4", cuda_attention_plan_new(&c, &p), PAGODA_ERANGE);
    c = good;
    c.block_size = 128;
    expect_rc("plan_new block_size 128", cuda_attention_plan_new(&c, &p), PAGODA_ERANGE);
    c = good;
    c.num_blocks = 1;
    expect_rc("plan_new num_blocks 1", cuda_attention_plan_new(&c, &p), PAGODA_ERANGE);
    c = good;
    c.scale = NAN;
    expect_rc("plan_new scale NaN", cuda_attention_plan_new(&c, &p), PAGODA_EINVAL);
    c = good;
    c.num_heads = 128;
    c.num_kv_heads = 1;
    expect_rc("plan_new 128 heads per kv head", cuda_attention_plan_new(&c, &p),
              PAGODA_EUNSUPPORTED);
    c = good;
    c.kv_dtype = DTYPE_F32;
    expect_rc("plan_new an F32 pool", cuda_attention_plan_new(&c, &p), PAGODA_EUNSUPPORTED);
    GPU_CHECK(p == NULL, "a refused plan_new left a plan");

    /* Batches: the GPU plan must refuse what the CPU plan refuses, with the same code. */
    int rc = cuda_attention_plan_new(&good, &p);
    GPU_CHECK(rc == 0, "cuda_attention_plan_new: %d (%s)", rc, pagoda_error_detail());
    if (rc != 0)
        return;
    struct attention_config cc = {ATTN_CPU_PAGED, 8, 2, 64, 0.125f, 16, 20, DTYPE_F32, 4, 64, 8};
    struct attention_plan *cp = NULL;
    rc = attention_plan_new(&cc, &cp);
    GPU_CHECK(rc == 0, "attention_plan_new: %d", rc);

    int32_t qs[3] = {0, 4, 5}, ctx[2] = {40, 9}, tables[2][4] = {{3, 1, 7, 0}, {5, 0, 0, 0}};
    struct attention_batch ok = {2, 5, qs, ctx, &tables[0][0], 4};
    expect_rc("valid batch", cuda_attention_plan(p, &ok, stream), 0);

    static int32_t qs_bad0[3] = {1, 4, 5}, qs_end[3] = {0, 4, 6}, qs_empty[3] = {0, 5, 5};
    static int32_t ctx_short[2] = {3, 9}, ctx_long[2] = {40, 200};
    static int32_t t_zero[2][4] = {{3, 0, 7, 0}, {5, 0, 0, 0}};
    static int32_t t_big[2][4] = {{3, 1, 7, 0}, {20, 0, 0, 0}};
    static int32_t t_neg[2][4] = {{3, 1, -1, 0}, {5, 0, 0, 0}};
    struct attention_batch b = ok;
    b.query_start = qs_bad0;
    refuse_batch(p, cp, "query_start[0] = 1", &b, PAGODA_EINVAL);
    b = ok;
    b.query_start = qs_end;
    refuse_batch(p, cp, "query_start ends past num_tokens", &b, PAGODA_EINVAL);
    b = ok;
    b.query_start = qs_empty;
    refuse_batch(p, cp, "sequence without query tokens", &b, PAGODA_EINVAL);
    b = ok;
    b.context_len = ctx_short;
    refuse_batch(p, cp, "context_len < query_len", &b, PAGODA_EINVAL);
    b = ok;
    b.block_tables = &t_zero[0][0];
    refuse_batch(p, cp, "block id 0", &b, PAGODA_ERANGE);
    b = ok;
    b.block_tables = &t_big[0][0];
    refuse_batch(p, cp, "block id num_blocks", &b, PAGODA_ERANGE);
    b = ok;
    b.block_tables = &t_neg[0][0];
    refuse_batch(p, cp, "block id -1", &b, PAGODA_ERANGE);
    b = ok;
    b.max_blocks_per_seq = 2;
    refuse_batch(p, cp, "table row too short", &b, PAGODA_ERANGE);
    b = ok;
    b.context_len = ctx_long;
    refuse_batch(p, cp, "context longer than table and plan allow", &b, PAGODA_ERANGE);
    b = ok;
    b.num_seqs = 5;
    refuse_batch(p, cp, "num_seqs above limit", &b, PAGODA_ERANGE);
    b = ok;
    b.num_tokens = 65;
    refuse_batch(p, cp, "num_tokens above limit", &b, PAGODA_ERANGE);
    b = ok;
    b.context_len = NULL;
    refuse_batch(p, cp, "NULL context_len", &b, PAGODA_EINVAL);
    b = ok;
    b.query_start = NULL;
    refuse_batch(p, cp, "NULL query_start", &b, PAGODA_EINVAL);

    /* Runs: nothing planned after a refusal; a view or q that does not fit. */
    struct kv_geometry g = {1, 1, 20, 16, 2, 64, DTYPE_BF16};
    void *d_pool = dev_alloc(kv_pool_bytes(&g));
    uint16_t *d_q = dev_alloc(5 * 8 * 64 * 2 + 16), *d_out = dev_alloc(5 * 8 * 64 * 2);
    struct kv_layer_view view = kv_layer_view_make(&g, d_pool, 0);
    expect_rc("run after a refused plan", cuda_attention_run(p, &view, d_q, 512, d_out, stream),
              PAGODA_EINVAL);
    expect_rc("plan again", cuda_attention_plan(p, &ok, stream), 0);
    struct kv_layer_view bad = view;
    bad.dtype = DTYPE_F32;
    expect_rc("run on an f32 view", cuda_attention_run(p, &bad, d_q, 512, d_out, stream),
              PAGODA_EMISMATCH);
    bad.dtype = DTYPE_F8E4M3; /* the plan's pool is bf16 */
    expect_rc("run on an fp8 view", cuda_attention_run(p, &bad, d_q, 512, d_out, stream),
              PAGODA_EMISMATCH);
    bad = view;
    bad.block_size = 32;
    expect_rc("run on another block_size", cuda_attention_run(p, &bad, d_q, 512, d_out, stream),
              PAGODA_EMISMATCH);
    expect_rc("run with q_row_stride 516", cuda_attention_run(p, &view, d_q, 516, d_out, stream),
              PAGODA_EINVAL);
    expect_rc("run with q_row_stride 256", cuda_attention_run(p, &view, d_q, 256, d_out, stream),
              PAGODA_EINVAL);
    expect_rc("run with misaligned q", cuda_attention_run(p, &view, d_q + 1, 512, d_out, stream),
              PAGODA_EINVAL);
    expect_rc("run with NULL out", cuda_attention_run(p, &view, d_q, 512, NULL, stream),
              PAGODA_EINVAL);
    /* An F8E4M3 plan: its view's strides must be whole 16-byte chunks, 16 codes (8 bf16). */
    {
        struct cuda_attention_config f8c = good;
        f8c.kv_dtype = DTYPE_F8E4M3;
        struct cuda_attention_plan *p8 = NULL;
        expect_rc("plan_new an F8E4M3 pool", cuda_attention_plan_new(&f8c, &p8), 0);
        expect_rc("plan on it", cuda_attention_plan(p8, &ok, stream), 0);
        struct kv_geometry g8 = g;
        g8.dtype = DTYPE_F8E4M3;
        struct kv_layer_view v8 = kv_layer_view_make(&g8, d_pool, 0);
        v8.slot_stride = 72;
        expect_rc("run on an fp8 view of 72-code slots",
                  cuda_attention_run(p8, &v8, d_q, 512, d_out, stream), PAGODA_EINVAL);
        cuda_attention_plan_free(p8);
    }

    /* Ops. */
    expect_rc("rope odd head_dim",
              cuda_rope(d_q, 64, (const int32_t *)d_pool, (float *)d_pool, 1, 1, 63, stream),
              PAGODA_EINVAL);
    expect_rc("rope row_stride < heads",
              cuda_rope(d_q, 64, (const int32_t *)d_pool, (float *)d_pool, 1, 2, 64, stream),
              PAGODA_EINVAL);
    expect_rc("add_bias ld < cols", cuda_add_bias(d_q, 8, d_q, 1, 16, stream), PAGODA_EINVAL);
    expect_rc("add_rmsnorm dim 0",
              cuda_add_rmsnorm((float *)d_pool, NULL, d_q, d_out, 1, 0, 1e-6f, stream),
              PAGODA_EINVAL);
    expect_rc("add_rmsnorm eps NaN",
              cuda_add_rmsnorm((float *)d_pool, NULL, d_q, d_out, 1, 8, NAN, stream),
              PAGODA_EINVAL);
    expect_rc("add_parts_rmsnorm part_stride < rows * dim",
              cuda_add_parts_rmsnorm((float *)d_pool, NULL, (const float *)d_pool, 2, 7, d_q, d_out,
                                     1, 8, 1e-6f, stream),
              PAGODA_EINVAL);
    expect_rc("add_parts_rmsnorm parts over the residual",
              cuda_add_parts_rmsnorm((float *)d_pool, NULL, (const float *)d_pool + 4, 1, 8, d_q,
                                     d_out, 1, 8, 1e-6f, stream),
              PAGODA_EINVAL);
    expect_rc(
        "add_parts_rmsnorm parts NULL",
        cuda_add_parts_rmsnorm((float *)d_pool, NULL, NULL, 1, 8, d_q, d_out, 1, 8, 1e-6f, stream),
        PAGODA_EINVAL);
    expect_rc("silu_mul rows -1", cuda_silu_mul(d_q, d_out, -1, 8, stream), PAGODA_EINVAL);
    expect_rc("embedding hidden 0",
              cuda_embedding(d_q, (const int32_t *)d_pool, 1, 0, (float *)d_out, stream),
              PAGODA_EINVAL);
    struct kv_layer_view fview = view;
    fview.dtype = DTYPE_F32;
    expect_rc("reshape_and_cache f32 view",
              cuda_reshape_and_cache(&fview, d_q, d_q, 128, (const int64_t *)d_pool, 1, stream),
              PAGODA_EUNSUPPORTED);
    expect_rc("reshape_and_cache row_stride < kv",
              cuda_reshape_and_cache(&view, d_q, d_q, 64, (const int64_t *)d_pool, 1, stream),
              PAGODA_EINVAL);
    GPU_CK(cudaStreamSynchronize(stream));

    cuda_attention_plan_free(p);
    attention_plan_free(cp);
    GPU_CK(cudaFree(d_pool));
    GPU_CK(cudaFree(d_q));
    GPU_CK(cudaFree(d_out));
}

/* Setting r (0 .. 5) of the decode kernel's copy rows (4, 8, 16) and warps (4 for r < 3, else 8)
 * the forced cases run with. */
static void copy_rows_and_warps(int r)
{
    attn_copy_rows = r % 3 == 0 ? 4 : r % 3 == 1 ? 8 : 16;
    attn_warps = r < 3 ? 4 : 8;
}

/* The decode edges under a forced setting: block sizes 16, 8 and 24 (16 does not divide it). */
static void decode_edges_forced(void)
{
    test_attention_decode_edges((struct shape){32, 8, 128, 16});
    test_attention_decode_edges((struct shape){32, 8, 64, 8});
    test_attention_decode_edges((struct shape){32, 8, 128, 24});
}

int main(int argc, char **argv)
{
    gpu_test_require_device("test_cuda_attention");
    GPU_CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    /* "graph": the decode graph cases alone (to run them against another build's kernels). */
    const bool graph_only = argc > 1 && strcmp(argv[1], "graph") == 0;
    if (graph_only)
        goto graphs;

    /* GPU_TEST_QUICK (for compute-sanitizer runs) keeps one case of each kernel path. */
    const bool quick = getenv("GPU_TEST_QUICK") != NULL;
    const int32_t head_dims[] = {64, 128}, block_sizes[] = {16, 32};
    const int32_t heads[][2] = {{32, 8}, {8, 8}};
    for (int h = 0; h < 2; h++)
        for (int d = 0; d < 2; d++)
            for (int b = 0; b < 2; b++) {
                if (quick && (h + d + b) % 3 != 0)
                    continue;
                struct shape sh = {heads[h][0], heads[h][1], head_dims[d], block_sizes[b]};
                test_attention_mixed(sh);
            }
    test_attention_mixed((struct shape){24, 2, 64, 16}); /* 12 heads per KV head */
    if (!quick) {
        test_attention_mixed((struct shape){32, 8, 128, 8}); /* smallest block */
        test_attention_mixed((struct shape){16, 4, 64, 64}); /* largest block */
        test_attention_many_decodes((struct shape){32, 8, 128, 16}, 48);
        test_attention_long_decode((struct shape){8, 8, 128, 32}, 3000);
    }
    test_attention_long_decode((struct shape){64, 1, 64, 16}, 3000);  /* 64 heads per KV head */
    test_attention_long_decode((struct shape){8, 1, 128, 16}, 10000); /* 40 partitions */
    test_attention_long_decode((struct shape){8, 1, 64, 16}, 10000);

    /* Decode: head dims 64 and 128, block sizes 8 to 64 (10: not a multiple of 4), 1, 2, 4 and
     * 12 query heads per KV head, split and unsplit contexts. */
    const int32_t edge_bs[] = {8, 16, 24, 64};
    for (int d = 0; d < 2; d++)
        for (int b = 0; b < 4; b++) {
            if (quick && (d + b) % 3 != 0)
                continue;
            test_attention_decode_edges((struct shape){32, 8, head_dims[d], edge_bs[b]});
        }
    test_attention_decode_edges((struct shape){16, 8, 128, 32});
    test_attention_decode_edges((struct shape){32, 8, 128, 10}); /* no quad copies */
    test_attention_mixed((struct shape){32, 8, 128, 10});
    /* Prefill copies: a thread's rows in one block of a size that is no power of two (24 at
     * head dim 128, 12 at 64), and a block looked up per row (10 at head dim 64). */
    test_attention_mixed((struct shape){32, 8, 128, 24});
    test_attention_mixed((struct shape){16, 4, 64, 12});
    test_attention_mixed((struct shape){16, 4, 64, 10});
    test_attention_decode_edges((struct shape){8, 8, 64, 16});
    test_attention_decode_edges((struct shape){24, 2, 128, 16});
    if (!quick) {
        test_attention_many_decodes((struct shape){32, 8, 128, 16}, 300); /* no split */
        test_attention_many_decodes((struct shape){32, 8, 64, 8}, 300);
    }

    /* Early K/V behind RoPE with the cache write: many unsplit decodes, then a few split ones. */
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 256, 1200, false, false);
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 4, 3000, false, false);
    test_attention_early_kv((struct shape){16, 4, 64, 32}, 64, 700, false, false);
    /* RoPE and the cache write inside the decode attention (cuda_attention_run_rope): the same
     * chains, unsplit and split, head dims 128 and 64, the step's K/V compared too. */
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 256, 1200, false, true);
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 4, 3000, false, true);
    test_attention_early_kv((struct shape){16, 4, 64, 32}, 64, 700, false, true);
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 1, 1100, false, true);
    /* 12 query heads a KV head: two decode chunks' CTAs write the same newest K/V */
    test_attention_early_kv((struct shape){24, 2, 128, 16}, 8, 900, false, true);
    /* early K/V off: the newest K/V written after a wait at the kernel's top */
    attn_early_off = 1;
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 16, 1200, false, true);
    test_attention_early_kv((struct shape){16, 4, 64, 32}, 3, 700, false, true);
    attn_early_off = 0;
    /* The same with q hidden until 500 us after the attention may start: unsplit and split
     * (not under GPU_TEST_QUICK: compute-sanitizer serialises the launches, so the probe would
     * find no overlap). */
    if (!quick) {
        test_attention_early_kv((struct shape){32, 8, 128, 16}, 256, 1200, true, false);
        test_attention_early_kv((struct shape){32, 8, 128, 16}, 4, 3000, true, false);
        test_attention_early_kv((struct shape){16, 4, 64, 32}, 64, 700, true, false);
        /* RoPE inside: Q (unrotated) hidden while the attention may run its part before the
         * wait, which reads no Q, K or V */
        test_attention_early_kv((struct shape){32, 8, 128, 16}, 64, 1200, true, true);
        test_attention_early_kv((struct shape){24, 2, 128, 16}, 8, 900, true, true);
    }

    /* The decode kernel's copies of 4, 8 and 16 rows forced at any batch (the plans choose 4
     * below 64 decode sequences), with CTAs of 4 and of 8 warps forced (the plans choose 8 from 2
     * to 16 sequences at head dim 128): edge lengths, block sizes that 8 or 16 do not divide
     * (copied row by row), split and unsplit contexts, early K/V. */
    for (int r = 0; r < 6; r++) {
        copy_rows_and_warps(r);
        decode_edges_forced();
        test_attention_decode_edges((struct shape){32, 8, 128, 10});
        test_attention_mixed((struct shape){16, 4, 64, 64});
        test_attention_early_kv((struct shape){32, 8, 128, 16}, 4, 3000, false, false);
        test_attention_early_kv((struct shape){16, 4, 64, 32}, 16, 700, false, false);
        test_attention_early_kv((struct shape){32, 8, 128, 10}, 16, 700, false, true);
        if (!quick)
            test_attention_early_kv((struct shape){32, 8, 128, 16}, 64, 1200, true, false);
    }
    attn_copy_rows = 0;

    /* CTAs of 4 and of 8 warps (tiles of 64 and 128 keys) forced, the plans' own copy rows: edge
     * lengths at both head dims and an odd block size, 12 query heads a KV head, split and
     * unsplit contexts, a long context split many ways, mixed steps, early K/V with RoPE inside,
     * graphs of 1, 4 and 16 (the default at 4 warps for one sequence, 8 for 4 and 16). */
    for (int w = 0; w < 2; w++) {
        attn_warps = w == 0 ? 4 : 8;
        test_attention_decode_edges((struct shape){32, 8, 128, 16});
        test_attention_decode_edges((struct shape){32, 8, 64, 8});
        test_attention_decode_edges((struct shape){32, 8, 128, 10});
        test_attention_decode_edges((struct shape){32, 8, 128, 64});
        test_attention_decode_edges((struct shape){24, 2, 128, 16});
        test_attention_long_decode((struct shape){32, 1, 128, 16}, 10000);
        test_attention_mixed((struct shape){16, 4, 64, 64});
        test_attention_mixed((struct shape){32, 8, 128, 10});
        test_attention_early_kv((struct shape){32, 8, 128, 16}, 4, 3000, false, false);
        test_attention_early_kv((struct shape){32, 8, 128, 16}, 16, 1200, false, true);
        test_attention_early_kv((struct shape){16, 4, 64, 32}, 64, 700, false, true);
        if (!quick)
            test_attention_early_kv((struct shape){32, 8, 128, 16}, 16, 1200, true, true);
        test_attention_graph((struct shape){32, 8, 128, 16});
    }
    attn_warps = 0;

    test_refusals();

    /* An F8E4M3 pool (--kv-cache-dtype fp8): the cache writes' codes against f32_to_e4m3, the
     * attention against the CPU's over the codes' values; mixed steps at both head dims and odd
     * block sizes, decodes short and long (split), many decodes, CTAs of 4 and 8 warps with
     * copies of 4, 8 and 16 rows, early K/V and RoPE inside the decode attention (whose K/V
     * writes must equal cuda_rope_cache's codes); their decode graphs below. */
    attn_f8 = 1;
    test_attention_mixed((struct shape){32, 8, 128, 16});
    test_attention_mixed((struct shape){16, 4, 64, 32});
    test_attention_mixed((struct shape){32, 8, 128, 10});
    test_attention_mixed((struct shape){16, 4, 64, 12});
    test_attention_mixed((struct shape){24, 2, 64, 16});
    test_attention_long_decode((struct shape){8, 1, 128, 16}, 10000);
    test_attention_long_decode((struct shape){8, 1, 64, 16}, 10000);
    test_attention_many_decodes((struct shape){32, 8, 128, 16}, 300);
    for (int r = 0; r < 6; r++) {
        copy_rows_and_warps(r);
        decode_edges_forced();
        test_attention_decode_edges((struct shape){24, 2, 128, 16});
    }
    /* Three CTAs of 4 warps an SM (4 stages) at every size, the plan's choice from 96 decode
     * sequences, and two at 300 sequences, where the plan would take three. */
    attn_ctas = 3; /* at head dim 128, the only one with the dense kernel */
    for (int r = 0; r < 3; r++) {
        copy_rows_and_warps(r);
        test_attention_decode_edges((struct shape){32, 8, 128, 16});
        test_attention_decode_edges((struct shape){32, 8, 128, 24});
        test_attention_decode_edges((struct shape){24, 2, 128, 16});
    }
    attn_ctas = 2;
    test_attention_many_decodes((struct shape){32, 8, 128, 16}, 300);
    attn_ctas = 0;
    attn_copy_rows = 0;
    attn_warps = 0;
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 256, 1200, false, false);
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 256, 1200, false, true);
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 4, 3000, false, true);
    test_attention_early_kv((struct shape){16, 4, 64, 32}, 64, 700, false, true);
    test_attention_early_kv((struct shape){24, 2, 128, 16}, 8, 900, false, true);
    /* early K/V and RoPE in the dense kernel where contexts are split (partitions without the
     * newest key), which the plan's choice (from 96 sequences) leaves whole */
    attn_warps = 4;
    attn_ctas = 3;
    test_attention_early_kv((struct shape){32, 8, 128, 16}, 4, 3000, false, true);
    attn_warps = 0;
    attn_ctas = 0;
    attn_f8 = 0;

graphs:
    /* Decode attention replayed from captured graphs (issue 15): the Llama-3-8B shape, and
     * 4 query heads per KV head at head dim 64 with a block size of 32. */
    test_attention_graph((struct shape){32, 8, 128, 16});
    test_attention_graph((struct shape){16, 4, 64, 32});
    attn_f8 = 1; /* the same over an F8E4M3 pool */
    test_attention_graph((struct shape){32, 8, 128, 16});
    test_attention_graph((struct shape){16, 4, 64, 32});
    attn_warps = 4; /* and with three CTAs of 4 warps an SM at every graph size */
    attn_ctas = 3;
    test_attention_graph((struct shape){32, 8, 128, 16});
    attn_warps = 0;
    attn_ctas = 0;
    attn_f8 = 0;
    test_attention_graph_bound();

    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("worst relative error of the cases at TOLERANCE (bf16 and fp8 pools): %.2e; %.1f s\n",
           worst_err, (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    GPU_CK(cudaStreamDestroy(stream));
    return gpu_test_finish();
}
