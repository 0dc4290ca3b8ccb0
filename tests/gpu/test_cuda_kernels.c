/* Tests of kernels/cuda's ops and linears (embedding, RMSNorm, biases, RoPE, SiLU-mul, the
 * KV cache writes, the GEMVs and cuBLASLt linears) against the CPU reference kernels
 * (kernels/cpu/ops.h) on the same bf16 inputs, compared in f32. The paged attention has its own
 * program, test_cuda_attention.c; the helpers both use are tests/gpu/kernel_check.h.
 *
 * Every input is fresh random data; every device output is poisoned (0xFF bytes: NaN in bf16
 * and f32) before the run, so a kernel that skips an output produces NaN and fails. One line
 * per case (kernel, config, relative error ||out - ref|| / ||ref||), then "N passed, M failed". */
#include "tests/gpu/kernel_check.h"

#include "kernels/cpu/ops.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/linear_lt.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/util.h"
#include "kvpool/geometry.h"

#include <cublas_v2.h>
#include <string.h>
#include <time.h>

/* ---- ops ---- */

static void test_embedding(int32_t vocab, int32_t hidden, int32_t num_tokens)
{
    size_t tn = (size_t)vocab * hidden, rn = (size_t)num_tokens * hidden;
    uint16_t *table = xmalloc(tn * sizeof(uint16_t));
    int32_t *ids = xmalloc((size_t)num_tokens * sizeof(int32_t));
    float *ref = xmalloc(rn * sizeof(float)), *got = xmalloc(rn * sizeof(float));
    fill_bf16(table, tn, -1.0f, 1.0f);
    for (int32_t t = 0; t < num_tokens; t++)
        ids[t] = t == 0 ? vocab - 1 : rand_int(vocab);
    for (int32_t t = 0; t < num_tokens; t++)
        bf16_to_f32_n(table + (size_t)ids[t] * hidden, ref + (size_t)t * hidden, (size_t)hidden);

    uint16_t *d_table = dev_upload(table, tn * sizeof(uint16_t));
    int32_t *d_ids = dev_upload(ids, (size_t)num_tokens * sizeof(int32_t));
    float *d_res = dev_alloc(rn * sizeof(float));
    poison(d_res, rn * sizeof(float));
    int rc = cuda_embedding(d_table, d_ids, num_tokens, hidden, d_res, stream);
    GPU_CHECK(rc == 0, "cuda_embedding: %d", rc);
    download(got, d_res, rn * sizeof(float));
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "vocab %d hidden %d tokens %d", (int)vocab, (int)hidden,
             (int)num_tokens);
    report("embedding", cfg, rel_err(got, ref, rn), EXACT);

    GPU_CK(cudaFree(d_table));
    GPU_CK(cudaFree(d_ids));
    GPU_CK(cudaFree(d_res));
    free(table);
    free(ids);
    free(ref);
    free(got);
}

/* cuda_embedding_rows for a rank holding rows [begin, end) of a vocab-row table (the last
 * rank's run possibly shorter than the others'): its own ids read table[id - begin] (the offset
 * indexing), every other id (another rank's rows, past the vocabulary, negative) reads zeros.
 * The table uploaded is the rank's rows only, with a guard row of NaN on each side, so a read
 * outside them shows. Compared exactly (a copy). */
static void test_embedding_rows(int32_t vocab, int32_t hidden, int32_t begin, int32_t end)
{
    const int32_t num_tokens = 12, mine = end - begin;
    size_t tn = (size_t)(mine + 2) * hidden, rn = (size_t)num_tokens * hidden;
    uint16_t *table = xmalloc(tn * sizeof(uint16_t));
    int32_t *ids = xmalloc((size_t)num_tokens * sizeof(int32_t));
    float *ref = xmalloc(rn * sizeof(float)), *got = xmalloc(rn * sizeof(float));
    fill_bf16(table, tn, -1.0f, 1.0f);
    for (int32_t c = 0; c < hidden; c++) { /* the guard rows: NaN */
        table[c] = 0x7fc0;
        table[(size_t)(mine + 1) * hidden + c] = 0x7fc0;
    }
    const uint16_t *rows = table + hidden; /* row begin */
    /* Own rows (the first, the last, one inside), the neighbours' rows on either side, the
     * whole vocabulary's ends, ids past it and negative ones; the rest random in [-2, vocab + 2).
     */
    const int32_t fixed[] = {begin, end - 1, begin + mine / 2, begin - 1, end, 0, vocab - 1,
                             vocab, -1,      INT32_MIN};
    for (int32_t t = 0; t < num_tokens; t++)
        ids[t] =
            t < (int32_t)(sizeof(fixed) / sizeof(fixed[0])) ? fixed[t] : rand_int(vocab + 4) - 2;
    for (int32_t t = 0; t < num_tokens; t++) {
        float *dst = ref + (size_t)t * hidden;
        if (ids[t] >= begin && ids[t] < end)
            bf16_to_f32_n(rows + (size_t)(ids[t] - begin) * hidden, dst, (size_t)hidden);
        else
            memset(dst, 0, (size_t)hidden * sizeof(float));
    }

    uint16_t *d_table = dev_upload(table, tn * sizeof(uint16_t));
    int32_t *d_ids = dev_upload(ids, (size_t)num_tokens * sizeof(int32_t));
    float *d_res = dev_alloc(rn * sizeof(float));
    poison(d_res, rn * sizeof(float));
    int rc =
        cuda_embedding_rows(d_table + hidden, d_ids, num_tokens, hidden, begin, end, d_res, stream);
    GPU_CHECK(rc == 0, "cuda_embedding_rows: %d", rc);
    download(got, d_res, rn * sizeof(float));
    size_t differ = 0;
    for (size_t i = 0; i < rn; i++)
        differ += memcmp(&got[i], &ref[i], sizeof(float)) != 0;
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "vocab %d hidden %d rows %d .. %d", (int)vocab, (int)hidden,
             (int)begin, (int)end);
    report("embedding_rows", cfg, rel_err(got, ref, rn), EXACT);
    GPU_CHECK(differ == 0, "embedding_rows %s: %zu values differ from the copy or zeros", cfg,
              differ);

    GPU_CK(cudaFree(d_table));
    GPU_CK(cudaFree(d_ids));
    GPU_CK(cudaFree(d_res));
    free(table);
    free(ids);
    free(ref);
    free(got);
}

/* cuda_add_parts_rmsnorm (cuda_add_rmsnorm with nparts 0): the residual plus x (with_x) plus
 * nparts f32 slices (rows x dim each, 8 floats of slack between them) against the same sums on
 * the host, then cpu_rmsnorm. */
static void test_add_rmsnorm(int32_t rows, int32_t dim, bool with_x, int32_t nparts)
{
    size_t n = (size_t)rows * dim;
    const int64_t stride = (int64_t)n + 8;
    float *parts = xmalloc(((size_t)stride * (size_t)(nparts > 0 ? nparts : 1)) * sizeof(float));
    for (size_t i = 0; i < (size_t)stride * (size_t)nparts; i++)
        parts[i] = uniform(-1.0f, 1.0f);
    const float eps = 1e-6f;
    float *res = xmalloc(n * sizeof(float)), *res_ref = xmalloc(n * sizeof(float));
    float *res_got = xmalloc(n * sizeof(float));
    uint16_t *x = xmalloc(n * sizeof(uint16_t)), *w = xmalloc((size_t)dim * sizeof(uint16_t));
    uint16_t *out = xmalloc(n * sizeof(uint16_t));
    float *xf = xmalloc(n * sizeof(float)), *wf = xmalloc((size_t)dim * sizeof(float));
    float *ref = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        res[i] = uniform(-2.0f, 2.0f);
    fill_bf16(x, n, -1.0f, 1.0f);
    fill_bf16(w, (size_t)dim, 0.5f, 1.5f);
    bf16_to_f32_n(x, xf, n);
    bf16_to_f32_n(w, wf, (size_t)dim);
    memcpy(res_ref, res, n * sizeof(float));
    if (with_x)
        cpu_add_rmsnorm(res_ref, xf, wf, ref, rows, dim, eps);
    if (nparts > 0 || !with_x) {
        for (int32_t p = 0; p < nparts; p++)
            for (size_t i = 0; i < n; i++)
                res_ref[i] += parts[(size_t)p * (size_t)stride + i];
        cpu_rmsnorm(res_ref, wf, ref, rows, dim, eps);
    }

    float *d_res = dev_upload(res, n * sizeof(float));
    uint16_t *d_x = dev_upload(x, n * sizeof(uint16_t));
    uint16_t *d_w = dev_upload(w, (size_t)dim * sizeof(uint16_t));
    uint16_t *d_out = dev_alloc(n * sizeof(uint16_t));
    float *d_parts = dev_upload(parts, (size_t)stride * (size_t)(nparts > 0 ? nparts : 1) * 4);
    poison(d_out, n * sizeof(uint16_t));
    int rc = nparts == 0
                 ? cuda_add_rmsnorm(d_res, with_x ? d_x : NULL, d_w, d_out, rows, dim, eps, stream)
                 : cuda_add_parts_rmsnorm(d_res, with_x ? d_x : NULL, d_parts, nparts, stride, d_w,
                                          d_out, rows, dim, eps, stream);
    GPU_CHECK(rc == 0, "cuda_add_rmsnorm: %d", rc);
    download(out, d_out, n * sizeof(uint16_t));
    download(res_got, d_res, n * sizeof(float));
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "rows %d dim %d%s + %d parts (%s)", (int)rows, (int)dim,
             with_x ? " + residual add" : "", (int)nparts, dim % 8 == 0 ? "16-byte" : "scalar");
    report("add_rmsnorm out", cfg, rel_err_bf16(out, ref, n), TOLERANCE);
    report("add_rmsnorm residual", cfg, rel_err(res_got, res_ref, n), EXACT);

    GPU_CK(cudaFree(d_res));
    GPU_CK(cudaFree(d_x));
    GPU_CK(cudaFree(d_w));
    GPU_CK(cudaFree(d_out));
    GPU_CK(cudaFree(d_parts));
    free(parts);
    free(res);
    free(res_ref);
    free(res_got);
    free(x);
    free(w);
    free(out);
    free(xf);
    free(wf);
    free(ref);
}

static void test_add_bias(int32_t rows, int32_t cols, int64_t ld)
{
    size_t n = (size_t)rows * (size_t)ld;
    uint16_t *x = xmalloc(n * sizeof(uint16_t)), *got = xmalloc(n * sizeof(uint16_t));
    uint16_t *b = xmalloc((size_t)cols * sizeof(uint16_t));
    float *ref = xmalloc((size_t)rows * cols * sizeof(float));
    float *gotf = xmalloc((size_t)rows * cols * sizeof(float));
    fill_bf16(x, n, -2.0f, 2.0f);
    fill_bf16(b, (size_t)cols, -1.0f, 1.0f);
    for (int32_t r = 0; r < rows; r++)
        for (int32_t c = 0; c < cols; c++)
            ref[(size_t)r * cols + c] =
                bf16_to_f32(f32_to_bf16(bf16_to_f32(x[r * ld + c]) + bf16_to_f32(b[c])));

    uint16_t *d_x = dev_upload(x, n * sizeof(uint16_t));
    uint16_t *d_b = dev_upload(b, (size_t)cols * sizeof(uint16_t));
    int rc = cuda_add_bias(d_x, ld, d_b, rows, cols, stream);
    GPU_CHECK(rc == 0, "cuda_add_bias: %d", rc);
    download(got, d_x, n * sizeof(uint16_t));
    size_t untouched_changed = 0;
    for (int32_t r = 0; r < rows; r++) {
        for (int32_t c = 0; c < cols; c++)
            gotf[(size_t)r * cols + c] = bf16_to_f32(got[r * ld + c]);
        for (int64_t c = cols; c < ld; c++)
            untouched_changed += got[r * ld + c] != x[r * ld + c];
    }
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "rows %d cols %d ld %lld", (int)rows, (int)cols, (long long)ld);
    report("add_bias", cfg, rel_err(gotf, ref, (size_t)rows * cols), EXACT);
    GPU_CHECK(untouched_changed == 0, "add_bias wrote %zu elements beyond cols", untouched_changed);

    GPU_CK(cudaFree(d_x));
    GPU_CK(cudaFree(d_b));
    free(x);
    free(got);
    free(b);
    free(ref);
    free(gotf);
}

/* cuda_to_bf16_bias: y = bf16(bf16(x) + bias), or bf16(x) without a bias, bit for bit against
 * the CPU's bf16 rounding (as one rank's bf16 GEMM output then cuda_add_bias give). */
static void test_to_bf16_bias(int32_t rows, int32_t cols, bool with_bias)
{
    size_t n = (size_t)rows * cols;
    float *x = xmalloc(n * sizeof(float));
    uint16_t *b = xmalloc((size_t)cols * sizeof(uint16_t));
    uint16_t *ref = xmalloc(n * sizeof(uint16_t)), *got = xmalloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++)
        x[i] = uniform(-4.0f, 4.0f);
    fill_bf16(b, (size_t)cols, -1.0f, 1.0f);
    for (int32_t r = 0; r < rows; r++)
        for (int32_t c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            uint16_t v = f32_to_bf16(x[i]);
            ref[i] = with_bias ? f32_to_bf16(bf16_to_f32(v) + bf16_to_f32(b[c])) : v;
        }

    float *d_x = dev_upload(x, n * sizeof(float));
    uint16_t *d_b = dev_upload(b, (size_t)cols * sizeof(uint16_t));
    uint16_t *d_y = dev_alloc(n * sizeof(uint16_t));
    poison(d_y, n * sizeof(uint16_t));
    int rc = cuda_to_bf16_bias(d_x, with_bias ? d_b : NULL, d_y, rows, cols, stream);
    GPU_CHECK(rc == 0, "cuda_to_bf16_bias: %d", rc);
    download(got, d_y, n * sizeof(uint16_t));
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += got[i] != ref[i];
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "rows %d cols %d %s", (int)rows, (int)cols,
             with_bias ? "bias" : "no bias");
    printf("%-20s %-58s %zu of %zu differ%s\n", "to_bf16_bias", cfg, differ, n,
           differ ? "  FAIL" : "");
    GPU_CHECK(differ == 0, "to_bf16_bias %s: %zu of %zu values differ", cfg, differ, n);

    GPU_CK(cudaFree(d_x));
    GPU_CK(cudaFree(d_b));
    GPU_CK(cudaFree(d_y));
    free(x);
    free(b);
    free(ref);
    free(got);
}

static void test_rope(int32_t rows, int32_t num_heads, int32_t head_dim, int64_t row_stride,
                      enum cpu_rope_type type, double theta)
{
    size_t n = (size_t)rows * (size_t)row_stride, hn = (size_t)rows * num_heads * head_dim;
    uint16_t *x = xmalloc(n * sizeof(uint16_t)), *got = xmalloc(n * sizeof(uint16_t));
    float *ref = xmalloc(hn * sizeof(float)), *gotf = xmalloc(hn * sizeof(float));
    int32_t *pos = xmalloc((size_t)rows * sizeof(int32_t));
    float *inv_freq = xmalloc((size_t)head_dim / 2 * sizeof(float));
    struct cpu_rope_params params = {type, theta, 8.0, 1.0, 4.0, 8192.0};
    cpu_rope_inv_freq(&params, head_dim, inv_freq);
    fill_bf16(x, n, -1.0f, 1.0f);
    for (int32_t r = 0; r < rows; r++)
        pos[r] = r == 0 ? 0 : r == 1 ? 131071 : rand_int(r % 2 ? 100000 : 4096);
    for (int32_t r = 0; r < rows; r++)
        bf16_to_f32_n(x + r * row_stride, ref + (size_t)r * num_heads * head_dim,
                      (size_t)num_heads * head_dim);
    cpu_rope(ref, pos, inv_freq, rows, num_heads, head_dim);

    uint16_t *d_x = dev_upload(x, n * sizeof(uint16_t));
    int32_t *d_pos = dev_upload(pos, (size_t)rows * sizeof(int32_t));
    float *d_inv = dev_upload(inv_freq, (size_t)head_dim / 2 * sizeof(float));
    int rc = cuda_rope(d_x, row_stride, d_pos, d_inv, rows, num_heads, head_dim, stream);
    GPU_CHECK(rc == 0, "cuda_rope: %d", rc);
    download(got, d_x, n * sizeof(uint16_t));
    size_t untouched_changed = 0;
    for (int32_t r = 0; r < rows; r++) {
        bf16_to_f32_n(got + r * row_stride, gotf + (size_t)r * num_heads * head_dim,
                      (size_t)num_heads * head_dim);
        for (int64_t c = (int64_t)num_heads * head_dim; c < row_stride; c++)
            untouched_changed += got[r * row_stride + c] != x[r * row_stride + c];
    }
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "rows %d heads %d head_dim %d stride %lld %s", (int)rows,
             (int)num_heads, (int)head_dim, (long long)row_stride,
             type == CPU_ROPE_LLAMA3 ? "llama3" : "default");
    report("rope", cfg, rel_err(gotf, ref, hn), TOLERANCE);
    GPU_CHECK(untouched_changed == 0, "rope wrote %zu elements beyond its heads",
              untouched_changed);

    GPU_CK(cudaFree(d_x));
    GPU_CK(cudaFree(d_pos));
    GPU_CK(cudaFree(d_inv));
    free(x);
    free(got);
    free(ref);
    free(gotf);
    free(pos);
    free(inv_freq);
}

static void test_silu_mul(int32_t rows, int32_t inter)
{
    size_t in = (size_t)rows * 2 * inter, on = (size_t)rows * inter;
    uint16_t *gu = xmalloc(in * sizeof(uint16_t)), *out = xmalloc(on * sizeof(uint16_t));
    float *guf = xmalloc(in * sizeof(float)), *ref = xmalloc(on * sizeof(float));
    fill_bf16(gu, in, -6.0f, 6.0f);
    bf16_to_f32_n(gu, guf, in);
    cpu_silu_mul(guf, ref, rows, inter);

    uint16_t *d_gu = dev_upload(gu, in * sizeof(uint16_t));
    uint16_t *d_out = dev_alloc(on * sizeof(uint16_t));
    poison(d_out, on * sizeof(uint16_t));
    int rc = cuda_silu_mul(d_gu, d_out, rows, inter, stream);
    GPU_CHECK(rc == 0, "cuda_silu_mul: %d", rc);
    download(out, d_out, on * sizeof(uint16_t));
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "rows %d inter %d (%s)", (int)rows, (int)inter,
             inter % 8 == 0 ? "16-byte" : "scalar");
    report("silu_mul", cfg, rel_err_bf16(out, ref, on), TOLERANCE);

    GPU_CK(cudaFree(d_gu));
    GPU_CK(cudaFree(d_out));
    free(gu);
    free(out);
    free(guf);
    free(ref);
}

/* cuda_rope_cache against cuda_rope then cuda_reshape_and_cache on the same rows and a poisoned
 * pool: the QKV rows and the whole pool equal bit for bit. One token is padding (slot -1), one
 * points into the reserved block 0: neither writes to the pool. */
static void test_rope_cache(int32_t block_size, int32_t num_q_heads, int32_t num_kv_heads,
                            int32_t head_dim, int64_t extra_stride)
{
    const int32_t rows = 11;
    struct kv_geometry g = {7, 2, 12, block_size, num_kv_heads, head_dim, DTYPE_BF16};
    const size_t pool_bytes = kv_pool_bytes(&g);
    const int64_t row_stride = (int64_t)(num_q_heads + 2 * num_kv_heads) * head_dim + extra_stride;
    const size_t qn = (size_t)rows * row_stride;
    uint16_t *qkv = xmalloc(qn * 2), *got_qkv = xmalloc(qn * 2), *want_qkv = xmalloc(qn * 2);
    uint8_t *got_pool = xmalloc(pool_bytes), *want_pool = xmalloc(pool_bytes);
    int32_t pos[11];
    int64_t slots[11];
    float *inv_freq = xmalloc((size_t)head_dim / 2 * sizeof(float));
    struct cpu_rope_params params = {CPU_ROPE_LLAMA3, 500000.0, 8.0, 1.0, 4.0, 8192.0};
    cpu_rope_inv_freq(&params, head_dim, inv_freq);
    fill_bf16(qkv, qn, -1.0f, 1.0f);
    const int64_t usable = (int64_t)(g.num_blocks - 1) * block_size;
    for (int32_t t = 0; t < rows; t++) {
        pos[t] = t == 0 ? 0 : rand_int(t % 2 ? 100000 : 4096);
        bool again;
        do {
            slots[t] = block_size + (int64_t)(rng_next() % (uint64_t)usable);
            again = false;
            for (int32_t u = 0; u < t; u++)
                again |= slots[u] == slots[t];
        } while (again);
    }
    slots[3] = -1;             /* padding */
    slots[7] = block_size / 2; /* block 0: reserved */
    int32_t *d_pos = dev_upload(pos, sizeof(pos));
    int64_t *d_slots = dev_upload(slots, sizeof(slots));
    float *d_inv = dev_upload(inv_freq, (size_t)head_dim / 2 * sizeof(float));
    void *d_pool = dev_alloc(pool_bytes);
    struct kv_layer_view view = kv_layer_view_make(&g, d_pool, 1);
    const int64_t qd = (int64_t)num_q_heads * head_dim, kvd = (int64_t)num_kv_heads * head_dim;

    /* the two calls */
    uint16_t *d_qkv = dev_upload(qkv, qn * 2);
    poison(d_pool, pool_bytes);
    int rc = cuda_rope(d_qkv, row_stride, d_pos, d_inv, rows, num_q_heads + num_kv_heads, head_dim,
                       stream);
    rc |= cuda_reshape_and_cache(&view, d_qkv + qd, d_qkv + qd + kvd, row_stride, d_slots, rows,
                                 stream);
    GPU_CHECK(rc == 0, "cuda_rope + cuda_reshape_and_cache: %d", rc);
    download(want_qkv, d_qkv, qn * 2);
    download(want_pool, d_pool, pool_bytes);
    GPU_CK(cudaFree(d_qkv));

    /* the fused call */
    d_qkv = dev_upload(qkv, qn * 2);
    poison(d_pool, pool_bytes);
    rc =
        cuda_rope_cache(d_qkv, row_stride, d_pos, d_inv, rows, num_q_heads, &view, d_slots, stream);
    GPU_CHECK(rc == 0, "cuda_rope_cache: %d", rc);
    download(got_qkv, d_qkv, qn * 2);
    download(got_pool, d_pool, pool_bytes);

    size_t qkv_diff = 0, pool_diff = 0, pool_written = 0;
    for (size_t i = 0; i < qn; i++)
        qkv_diff += got_qkv[i] != want_qkv[i];
    for (size_t i = 0; i < pool_bytes; i++) {
        pool_diff += got_pool[i] != want_pool[i];
        pool_written += got_pool[i] != 0xFF;
    }
    char cfg[128];
    snprintf(cfg, sizeof(cfg), "bs %d heads %d/%d head_dim %d stride %lld, pad + block 0",
             (int)block_size, (int)num_q_heads, (int)num_kv_heads, (int)head_dim,
             (long long)row_stride);
    const bool ok = qkv_diff == 0 && pool_diff == 0 && pool_written > 0;
    printf("%-20s %-58s %zu + %zu bytes differ%s\n", "rope_cache", cfg, qkv_diff, pool_diff,
           ok ? "" : "  FAIL");
    GPU_CHECK(qkv_diff == 0, "rope_cache: %zu QKV elements differ from cuda_rope's", qkv_diff);
    GPU_CHECK(pool_diff == 0, "rope_cache: %zu pool bytes differ from reshape_and_cache's",
              pool_diff);
    GPU_CHECK(pool_written > 0, "rope_cache: nothing written to the pool");

    GPU_CK(cudaFree(d_qkv));
    GPU_CK(cudaFree(d_pool));
    GPU_CK(cudaFree(d_pos));
    GPU_CK(cudaFree(d_slots));
    GPU_CK(cudaFree(d_inv));
    free(qkv);
    free(got_qkv);
    free(want_qkv);
    free(got_pool);
    free(want_pool);
    free(inv_freq);
}

/* y = x . w^T on the device: cuda_gemv (ring NULL) or cuda_gemv_stream with that ring (fields 0:
 * its default), twice; y has one row more than rows, poisoned, which must stay poison, and the
 * two runs give the same bits (a fixed order of the sums). The result (rows * out elements of
 * esz bytes) is in got. */
static void gemv_run(const uint16_t *d_x, const uint16_t *d_w, int32_t rows, int32_t in,
                     int32_t out, int y_f32, const struct cuda_gemv_ring *ring, const char *cfg,
                     uint8_t *got)
{
    const size_t esz = y_f32 ? 4 : 2, yn = (size_t)(rows + 1) * out;
    uint8_t *first = xmalloc(yn * esz), *again = xmalloc(yn * esz);
    void *d_y = dev_alloc(yn * esz);
    char form[64] = "cuda_gemv";
    if (ring != NULL)
        snprintf(form, sizeof(form), "cuda_gemv_stream ring %d x %d", ring->stages, ring->cols);
    for (int run = 0; run < 2; run++) {
        poison(d_y, yn * esz);
        int rc = ring == NULL ? cuda_gemv(d_x, d_w, d_y, y_f32, rows, in, out, stream)
                              : cuda_gemv_stream(d_x, d_w, d_y, y_f32, rows, in, out, ring, stream);
        GPU_CHECK(rc == 0, "%s %s: %d (%s)", form, cfg, rc, pagoda_error_detail());
        download(run ? again : first, d_y, yn * esz);
    }
    size_t extra = 0;
    for (size_t i = (size_t)rows * out * esz; i < yn * esz; i++)
        extra += first[i] != 0xFF;
    GPU_CHECK(extra == 0, "%s %s: %zu bytes written past the rows", form, cfg, extra);
    GPU_CHECK(memcmp(first, again, yn * esz) == 0, "%s %s: two runs differ", form, cfg);
    memcpy(got, first, (size_t)rows * out * esz);
    GPU_CK(cudaFree(d_y));
    free(first);
    free(again);
}

/* Random inputs of a linear (x [rows][in], w [out][in], bf16 in [-1, 1]) and their product in
 * float64, rounded to f32 (ref [rows][out]); the caller frees the three. */
static void linear_inputs(int32_t rows, int32_t in, int32_t out, uint16_t **x, uint16_t **w,
                          float **ref)
{
    *x = xmalloc((size_t)rows * in * 2);
    *w = xmalloc((size_t)out * in * 2);
    *ref = xmalloc((size_t)rows * out * sizeof(float));
    fill_bf16(*x, (size_t)rows * in, -1.0f, 1.0f);
    fill_bf16(*w, (size_t)out * in, -1.0f, 1.0f);
    for (int32_t r = 0; r < rows; r++)
        for (int32_t o = 0; o < out; o++) {
            double acc = 0.0;
            for (int32_t i = 0; i < in; i++)
                acc += (double)bf16_to_f32((*x)[(size_t)r * in + i]) *
                       (double)bf16_to_f32((*w)[(size_t)o * in + i]);
            (*ref)[(size_t)r * out + o] = (float)acc;
        }
}

/* Frees what linear_inputs allocated and the device copies (d_y may be NULL). */
static void linear_free(uint16_t *x, uint16_t *w, float *ref, void *d_x, void *d_w, void *d_y)
{
    GPU_CK(cudaFree(d_x));
    GPU_CK(cudaFree(d_w));
    if (d_y != NULL)
        GPU_CK(cudaFree(d_y));
    free(x);
    free(w);
    free(ref);
}

/* The streaming rings test_gemv ran, by x_resident + 1. */
static int gemv_forms_run[3];

/* cuda_gemv against a float64 product of the same bf16 inputs; cuda_gemv_stream equal to it bit
 * for bit (the same sums in the same order) with its default ring, the smallest (one stage:
 * every stage waits for the one before to be given back), more stages, and wider ones (2 KiB
 * and 4 KiB rows, some partial at the end of a row). */
static void test_gemv(int32_t rows, int32_t in, int32_t out, int y_f32)
{
    const size_t xn = (size_t)rows * in, wn = (size_t)out * in, yn = (size_t)rows * out;
    const size_t esz = y_f32 ? 4 : 2;
    uint16_t *x, *w;
    float *ref, *gotf = xmalloc(yn * sizeof(float));
    linear_inputs(rows, in, out, &x, &w, &ref);
    uint8_t *want = xmalloc(yn * esz), *got = xmalloc(yn * esz);
    uint16_t *d_x = dev_upload(x, xn * 2), *d_w = dev_upload(w, wn * 2);
    GPU_CHECK(cuda_gemv_fits(rows, in, out, d_x, d_w, d_x) == 1, "cuda_gemv_fits refused");
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "rows %d in %d out %d %s", (int)rows, (int)in, (int)out,
             y_f32 ? "f32" : "bf16");
    gemv_run(d_x, d_w, rows, in, out, y_f32, NULL, cfg, want);
    if (y_f32)
        memcpy(gotf, want, yn * 4);
    else
        bf16_to_f32_n((const uint16_t *)want, gotf, yn);
    report("gemv", cfg, rel_err(gotf, ref, yn), y_f32 ? 1e-5 : TOLERANCE);
    /* Rings with x through the stages (-1), resident (1) and by default (0); those that do not
     * fit are skipped (1 x 4096 with x in the stages fits only up to 8 rows, x resident only
     * where 8 or 16 rows of x fit), but the default ring and both forms always run somewhere. */
    static const struct cuda_gemv_ring rings[] = {
        {0, 0, 0},    {1, 512, 0},  {6, 512, 0},  {3, 1024, 0},  {1, 2048, 0},
        {1, 4096, 0}, {0, 0, -1},   {1, 512, -1}, {3, 1024, -1}, {0, 0, 1},
        {1, 512, 1},  {2, 1024, 1}, {1, 4096, 1}};
    int sms = 0;
    GPU_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    for (size_t k = 0; k < sizeof(rings) / sizeof(rings[0]); k++) {
        if (!cuda_gemv_stream_ring_fits(rows, in, out, &rings[k], sms)) {
            GPU_CHECK(k != 0, "cuda_gemv_stream %s: the default ring does not fit", cfg);
            continue;
        }
        gemv_run(d_x, d_w, rows, in, out, y_f32, &rings[k], cfg, got);
        GPU_CHECK(memcmp(got, want, yn * esz) == 0,
                  "cuda_gemv_stream %s ring %d x %d x resident %d: not cuda_gemv's result bit "
                  "for bit",
                  cfg, rings[k].stages, rings[k].cols, rings[k].x_resident);
        gemv_forms_run[rings[k].x_resident + 1]++;
    }
    linear_free(x, w, ref, d_x, d_w, NULL);
    free(gotf);
    free(want);
    free(got);
}

/* Two linears in a row, the second reading the first's output, launched with programmatic
 * dependent launch (cuda_set_pdl): the second may start, and request its weights, while the
 * first runs, and must read its input only once the first has written it. The chain with
 * cuda_gemv_stream equals the same chain with cuda_gemv launched without it, bit for bit; with
 * row, a chain of cuda_gemv_row (one row) equals itself launched without it. */
static void test_gemv_chain(int32_t rows, int32_t in, int32_t mid, int32_t out, bool row)
{
    uint16_t *x = xmalloc((size_t)rows * in * 2), *w1 = xmalloc((size_t)mid * in * 2);
    uint16_t *w2 = xmalloc((size_t)out * mid * 2);
    uint16_t *want = xmalloc((size_t)rows * out * 2), *got = xmalloc((size_t)rows * out * 2);
    fill_bf16(x, (size_t)rows * in, -1.0f, 1.0f);
    fill_bf16(w1, (size_t)mid * in, -0.1f, 0.1f);
    fill_bf16(w2, (size_t)out * mid, -0.1f, 0.1f);
    uint16_t *d_x = dev_upload(x, (size_t)rows * in * 2);
    uint16_t *d_w1 = dev_upload(w1, (size_t)mid * in * 2);
    uint16_t *d_w2 = dev_upload(w2, (size_t)out * mid * 2);
    uint16_t *d_h = dev_alloc((size_t)rows * mid * 2), *d_y = dev_alloc((size_t)rows * out * 2);
    /* Pass 0: cuda_gemv (or cuda_gemv_row) without the attribute, the reference; then five
     * chains with it, each after poisoning the intermediate (NaN: a read before the first kernel
     * wrote it shows). */
    int differ = 0, nan = 0;
    for (int pass = 0; pass < 6; pass++) {
        cuda_set_pdl(pass > 0);
        poison(d_h, (size_t)rows * mid * 2);
        poison(d_y, (size_t)rows * out * 2);
        GPU_CK(cudaStreamSynchronize(stream));
        const uint16_t *xs[2] = {d_x, d_h}, *ws[2] = {d_w1, d_w2};
        uint16_t *ys[2] = {d_h, d_y};
        const int32_t ins[2] = {in, mid}, outs[2] = {mid, out};
        int rc = 0;
        for (int k = 0; k < 2 && rc == 0; k++)
            rc = row ? cuda_gemv_row(xs[k], ws[k], ys[k], 0, ins[k], outs[k], stream)
                 : pass
                     ? cuda_gemv_stream(xs[k], ws[k], ys[k], 0, rows, ins[k], outs[k], NULL, stream)
                     : cuda_gemv(xs[k], ws[k], ys[k], 0, rows, ins[k], outs[k], stream);
        GPU_CHECK(rc == 0, "gemv chain (pass %d): %d", pass, rc);
        download(pass ? got : want, d_y, (size_t)rows * out * 2);
        differ += pass > 0 && memcmp(got, want, (size_t)rows * out * 2) != 0;
        for (size_t o = 0; o < (size_t)rows * out; o++)
            nan += !isfinite(bf16_to_f32((pass ? got : want)[o]));
    }
    cuda_set_pdl(0);
    GPU_CHECK(differ == 0 && nan == 0,
              "%s chain rows %d %d -> %d -> %d with pdl: %d of 5 differ from the chain without it, "
              "%d NaN",
              row ? "gemv_row" : "gemv_stream", rows, in, mid, out, differ, nan);
    GPU_CK(cudaFree(d_x));
    GPU_CK(cudaFree(d_w1));
    GPU_CK(cudaFree(d_w2));
    GPU_CK(cudaFree(d_h));
    GPU_CK(cudaFree(d_y));
    free(x);
    free(w1);
    free(w2);
    free(want);
    free(got);
}

/* cuda_gemv_row against a float64 product of the same bf16 inputs, twice (equal bits), y with
 * one element more than out, poisoned, which must stay poison. */
static void test_gemv_row(int32_t in, int32_t out, int y_f32)
{
    const size_t esz = y_f32 ? 4 : 2;
    uint16_t *x, *w;
    float *ref, *gotf = xmalloc((size_t)out * sizeof(float));
    linear_inputs(1, in, out, &x, &w, &ref);
    uint8_t *first = xmalloc((size_t)(out + 1) * esz), *again = xmalloc((size_t)(out + 1) * esz);
    uint16_t *d_x = dev_upload(x, (size_t)in * 2), *d_w = dev_upload(w, (size_t)out * in * 2);
    void *d_y = dev_alloc((size_t)(out + 1) * esz);
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "in %d out %d %s", (int)in, (int)out, y_f32 ? "f32" : "bf16");
    GPU_CHECK(cuda_gemv_row_fits(1, in, out, d_x, d_w, d_y) == 1, "cuda_gemv_row_fits %s", cfg);
    for (int run = 0; run < 2; run++) {
        poison(d_y, (size_t)(out + 1) * esz);
        int rc = cuda_gemv_row(d_x, d_w, d_y, y_f32, in, out, stream);
        GPU_CHECK(rc == 0, "cuda_gemv_row %s: %d (%s)", cfg, rc, pagoda_error_detail());
        download(run ? again : first, d_y, (size_t)(out + 1) * esz);
    }
    GPU_CHECK(memcmp(first, again, (size_t)(out + 1) * esz) == 0,
              "cuda_gemv_row %s: two runs "
              "differ",
              cfg);
    size_t extra = 0;
    for (size_t k = 0; k < esz; k++)
        extra += first[(size_t)out * esz + k] != 0xFF;
    GPU_CHECK(extra == 0, "cuda_gemv_row %s: wrote past out", cfg);
    for (int32_t o = 0; o < out; o++)
        gotf[o] = y_f32 ? ((const float *)first)[o] : bf16_to_f32(((const uint16_t *)first)[o]);
    report("gemv_row", cfg, rel_err(gotf, ref, (size_t)out), y_f32 ? 1e-5 : TOLERANCE);
    linear_free(x, w, ref, d_x, d_w, d_y);
    free(gotf);
    free(first);
    free(again);
}

/* cuda_gemv_row_norm against cuda_add_rmsnorm then cuda_gemv_row on the same inputs: the same
 * output and the same new residual, bit for bit, five times. `add` is the output of a kernel
 * just ahead in the stream (a cuda_gemv_row), poisoned before it runs and launched with it
 * under programmatic dependent launch, so that a read of add before the wait shows (NaN or
 * another value); the input residual stays untouched; with add NULL, residual_out stays poison. */
static void test_gemv_row_norm(int32_t in, int32_t out, bool with_add, int y_f32)
{
    const float eps = 1e-5f;
    const int32_t in2 = 2048; /* the writer's input */
    const size_t esz = y_f32 ? 4 : 2;
    float *res = xmalloc((size_t)in * 4), *res_want = xmalloc((size_t)in * 4);
    float *res_got = xmalloc((size_t)in * 4), *res_after = xmalloc((size_t)in * 4);
    uint16_t *xa = xmalloc((size_t)in2 * 2), *wa = xmalloc((size_t)in * in2 * 2);
    uint16_t *norm = xmalloc((size_t)in * 2), *w = xmalloc((size_t)out * in * 2);
    uint8_t *want = xmalloc((size_t)out * esz), *got = xmalloc((size_t)out * esz);
    for (int32_t i = 0; i < in; i++)
        res[i] = uniform(-4.0f, 4.0f);
    fill_bf16(xa, (size_t)in2, -1.0f, 1.0f);
    fill_bf16(wa, (size_t)in * in2, -0.05f, 0.05f);
    fill_bf16(norm, (size_t)in, 0.5f, 1.5f);
    fill_bf16(w, (size_t)out * in, -0.1f, 0.1f);
    float *d_res = dev_upload(res, (size_t)in * 4), *d_ref_res = dev_upload(res, (size_t)in * 4);
    float *d_out_res = dev_alloc((size_t)in * 4);
    uint16_t *d_xa = dev_upload(xa, (size_t)in2 * 2), *d_wa = dev_upload(wa, (size_t)in * in2 * 2);
    uint16_t *d_add = dev_alloc((size_t)in * 2), *d_norm = dev_upload(norm, (size_t)in * 2);
    uint16_t *d_w = dev_upload(w, (size_t)out * in * 2), *d_x = dev_alloc((size_t)in * 2);
    void *d_y = dev_alloc((size_t)out * esz);
    const uint16_t *a = with_add ? d_add : NULL;
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "in %d out %d%s %s", (int)in, (int)out, with_add ? " add" : "",
             y_f32 ? "f32" : "bf16");
    /* The reference: the writer, then the two kernels, the residual updated in place. */
    int rc = cuda_gemv_row(d_xa, d_wa, d_add, 0, in2, in, stream);
    if (rc == 0)
        rc = cuda_add_rmsnorm(d_ref_res, a, d_norm, d_x, 1, in, eps, stream);
    if (rc == 0)
        rc = cuda_gemv_row(d_x, d_w, d_y, y_f32, in, out, stream);
    GPU_CHECK(rc == 0, "gemv_row_norm reference %s: %d", cfg, rc);
    download(want, d_y, (size_t)out * esz);
    download(res_want, d_ref_res, (size_t)in * 4);
    int differ = 0;
    for (int pass = 0; pass < 5; pass++) {
        poison(d_y, (size_t)out * esz);
        poison(d_out_res, (size_t)in * 4);
        poison(d_add, (size_t)in * 2);
        cuda_set_pdl(1);
        rc = cuda_gemv_row(d_xa, d_wa, d_add, 0, in2, in, stream);
        if (rc == 0)
            rc = cuda_gemv_row_norm(d_res, a, d_norm, eps, d_out_res, d_w, d_y, y_f32, in, out,
                                    stream);
        cuda_set_pdl(0);
        GPU_CHECK(rc == 0, "cuda_gemv_row_norm %s: %d (%s)", cfg, rc, pagoda_error_detail());
        download(got, d_y, (size_t)out * esz);
        download(res_got, d_out_res, (size_t)in * 4);
        download(res_after, d_res, (size_t)in * 4);
        differ += memcmp(got, want, (size_t)out * esz) != 0;
        if (with_add)
            differ += memcmp(res_got, res_want, (size_t)in * 4) != 0;
        else
            for (int32_t i = 0; i < in; i++)
                differ += !isnan(res_got[i]); /* poison: left alone */
        differ += memcmp(res_after, res, (size_t)in * 4) != 0;
    }
    printf("%-20s %-58s %s\n", "gemv_row_norm", cfg, differ ? "FAIL" : "equal");
    GPU_CHECK(differ == 0,
              "cuda_gemv_row_norm %s: %d differences from cuda_add_rmsnorm + cuda_gemv_row", cfg,
              differ);
    void *dev[] = {d_res, d_ref_res, d_out_res, d_xa, d_wa, d_add, d_norm, d_w, d_x, d_y};
    for (size_t k = 0; k < sizeof(dev) / sizeof(dev[0]); k++)
        GPU_CK(cudaFree(dev[k]));
    void *host[] = {res, res_want, res_got, res_after, xa, wa, norm, w, want, got};
    for (size_t k = 0; k < sizeof(host) / sizeof(host[0]); k++)
        free(host[k]);
}

/* cuda_lt_linear against a float64 product of the same bf16 inputs, into rows ldy >= out apart
 * (the columns between out and ldy, and a row past the last, must stay poison), twice (equal
 * bits: one plan, made on first use, then found); then sizes it refuses. */
static void test_lt_linear(struct cuda_lt *lt, int32_t rows, int32_t in, int32_t out, int32_t ldy,
                           int y_f32)
{
    const size_t xn = (size_t)rows * in, wn = (size_t)out * in, yn = (size_t)(rows + 1) * ldy;
    const size_t esz = y_f32 ? 4 : 2;
    uint16_t *x, *w;
    float *ref, *gotf = xmalloc((size_t)rows * out * sizeof(float));
    linear_inputs(rows, in, out, &x, &w, &ref);
    uint8_t *first = xmalloc(yn * esz), *again = xmalloc(yn * esz);
    uint16_t *d_x = dev_upload(x, xn * 2), *d_w = dev_upload(w, wn * 2);
    void *d_y = dev_alloc(yn * esz);
    char cfg[96];
    snprintf(cfg, sizeof(cfg), "rows %d in %d out %d ldy %d %s", (int)rows, (int)in, (int)out,
             (int)ldy, y_f32 ? "f32" : "bf16");
    const size_t plans = cuda_lt_plans(lt);
    for (int run = 0; run < 2; run++) {
        poison(d_y, yn * esz);
        int rc = cuda_lt_linear(lt, d_x, d_w, d_y, y_f32, rows, in, out, ldy, stream);
        GPU_CHECK(rc == 0, "cuda_lt_linear %s: %d (%s)", cfg, rc, pagoda_error_detail());
        download(run ? again : first, d_y, yn * esz);
    }
    GPU_CHECK(cuda_lt_plans(lt) == plans + 1, "cuda_lt_linear %s: %zu plans made, expected 1", cfg,
              cuda_lt_plans(lt) - plans);
    GPU_CHECK(memcmp(first, again, yn * esz) == 0, "cuda_lt_linear %s: two runs differ", cfg);
    size_t stray = 0;
    for (int32_t r = 0; r <= rows; r++)
        for (int32_t c = r < rows ? out : 0; c < ldy; c++)
            for (size_t k = 0; k < esz; k++)
                stray += first[((size_t)r * ldy + c) * esz + k] != 0xFF;
    GPU_CHECK(stray == 0, "cuda_lt_linear %s: %zu bytes written outside the rows", cfg, stray);
    for (int32_t r = 0; r < rows; r++)
        for (int32_t o = 0; o < out; o++) {
            const size_t at = (size_t)r * ldy + o;
            gotf[(size_t)r * out + o] =
                y_f32 ? ((const float *)first)[at] : bf16_to_f32(((const uint16_t *)first)[at]);
        }
    report("lt_linear", cfg, rel_err(gotf, ref, (size_t)rows * out), y_f32 ? 1e-5 : TOLERANCE);
    linear_free(x, w, ref, d_x, d_w, d_y);
    free(gotf);
    free(first);
    free(again);
}

/* The GEMM behind test_late_into_cublas's kernel, as the worker calls it: 0 cuBLASLt
 * (cuda_lt_linear, bf16 out), 1 cublasGemmEx (bf16 out: QKV, gate/up), 2
 * cublasGemmStridedBatchedEx over two slices of the reduction (f32 out: O and down). The bytes
 * of its output. */
static size_t late_gemm(int gemm, struct cuda_lt *lt, cublasHandle_t h, const uint16_t *x,
                        const uint16_t *w, void *y, int32_t rows, int32_t dim, int *rc)
{
    const float one = 1.0f, zero = 0.0f;
    cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
    if (gemm == 0)
        *rc = cuda_lt_linear(lt, x, w, y, 0, rows, dim, dim, dim, stream);
    else if (gemm == 1)
        st = cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, dim, rows, dim, &one, w, CUDA_R_16BF, dim, x,
                          CUDA_R_16BF, dim, &zero, y, CUDA_R_16BF, dim, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, dim, rows, dim / 2, &one, w,
                                        CUDA_R_16BF, dim, dim / 2, x, CUDA_R_16BF, dim, dim / 2,
                                        &zero, y, CUDA_R_32F, dim, (long long)rows * dim, 2,
                                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (st != CUBLAS_STATUS_SUCCESS)
        *rc = PAGODA_ECUDA;
    return (size_t)rows * dim * (gemm == 2 ? 2 * sizeof(float) : sizeof(uint16_t));
}

/* kernels/cuda/util.h's late trigger: a graph of [cuda_add_parts_rmsnorm (kind 0) or
 * cuda_silu_mul (kind 1), launched with the late trigger] -> a cuBLAS GEMM on its output
 * (late_gemm's three forms), the edge between them made programmatic as
 * worker/cuda_backend_forward.c makes it (cuBLAS's kernels never wait, bench/pdl_cublas.cu),
 * replayed on fresh inputs each time, the kernel's output zeroed before: every product equals, bit
 * for bit, the same two calls in plain stream order without PDL. A control (printed, not counted:
 * whether a race shows is timing) makes the same edge behind the usual early trigger. */
static void test_late_into_cublas(struct cuda_lt *lt, cublasHandle_t h, int kind, int gemm)
{
    const int32_t rows = 16, dim = 4096, nparts = 2, reps = 40;
    const size_t xn = (size_t)rows * dim, in_n = kind ? 2 * xn : xn * (1 + nparts);
    const size_t ymax = 2 * xn * sizeof(float);
    float *in_f = xmalloc(in_n * sizeof(float));
    uint16_t *in_h = xmalloc(in_n * sizeof(uint16_t)), *wn = xmalloc(dim * sizeof(uint16_t));
    uint16_t *w = xmalloc((size_t)dim * dim * sizeof(uint16_t));
    uint8_t *got = xmalloc(ymax), *want = xmalloc(ymax);
    fill_bf16(wn, (size_t)dim, 0.5f, 1.5f);
    fill_bf16(w, (size_t)dim * dim, -0.05f, 0.05f);
    /* kind 0: the residual then the parts (f32); kind 1: gate/up rows (bf16) */
    void *d_in = dev_alloc(in_n * sizeof(float));
    uint16_t *d_wn = dev_upload(wn, dim * sizeof(uint16_t));
    uint16_t *d_w = dev_upload(w, (size_t)dim * dim * sizeof(uint16_t));
    uint16_t *d_x = dev_alloc(xn * sizeof(uint16_t));
    void *d_y = dev_alloc(ymax);
    float *d_res = d_in, *d_parts = (float *)d_in + xn;
    uint16_t *d_gu = d_in;
    char name[64];
    snprintf(name, sizeof name, "%s -> %s", kind ? "silu_mul" : "add_parts_rmsnorm",
             gemm == 0   ? "cuBLASLt"
             : gemm == 1 ? "cublasGemmEx"
                         : "cublasGemmStridedBatchedEx");
    int rc = 0;
    size_t ybytes = 0;
    /* run 0: a warm-up in stream order (plans made outside the capture); 1: the late trigger;
     * 2: the control, triggering early */
    for (int run = 0; run < 3 && rc == 0; run++) {
        const int late = run == 1;
        cudaGraph_t g = NULL;
        if (run) {
            GPU_CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
            cuda_set_pdl(1);
            cuda_set_pdl_late(late);
        }
        rc = kind ? cuda_silu_mul(d_gu, d_x, rows, dim, stream)
                  : cuda_add_parts_rmsnorm(d_res, NULL, d_parts, nparts, (int64_t)xn, d_wn, d_x,
                                           rows, dim, 1e-5f, stream);
        const int launched_late = cuda_pdl_late_launched();
        cuda_set_pdl_late(0);
        cuda_set_pdl(0);
        if (run && rc == 0) {
            cudaGraphNode_t node;
            const int tip = cuda_capture_tip(stream, &node);
            GPU_CHECK(launched_late == late && tip, "late %s: launched late %d, one dependency %d",
                      name, launched_late, tip);
            if (tip)
                rc = cuda_capture_make_programmatic(stream, node);
        }
        if (rc == 0)
            ybytes = late_gemm(gemm, lt, h, d_x, d_w, d_y, rows, dim, &rc);
        if (!run)
            continue;
        GPU_CK(cudaStreamEndCapture(stream, &g));
        cudaGraphNode_t from[8], to[8];
        cudaGraphEdgeData ed[8];
        size_t ne = 0, programmatic = 0;
        GPU_CK(cudaGraphGetEdges(g, NULL, NULL, NULL, &ne));
        if (ne <= 8) {
            GPU_CK(cudaGraphGetEdges(g, from, to, ed, &ne));
            for (size_t i = 0; i < ne; i++)
                programmatic += ed[i].type == cudaGraphDependencyTypeProgrammatic;
        }
        GPU_CHECK(programmatic >= 1, "late %s: %zu edges, none programmatic", name, ne);
        cudaGraphExec_t ge;
        GPU_CK(cudaGraphInstantiate(&ge, g, 0));
        GPU_CK(cudaGraphDestroy(g));
        int differ = 0;
        for (int r = 0; r < reps && rc == 0; r++) {
            if (kind) {
                fill_bf16(in_h, 2 * xn, -6.0f, 6.0f);
            } else {
                for (size_t i = 0; i < in_n; i++)
                    in_f[i] = uniform(-2.0f, 2.0f);
            }
            const void *src = kind ? (const void *)in_h : (const void *)in_f;
            const size_t bytes = kind ? 2 * xn * sizeof(uint16_t) : in_n * sizeof(float);
            GPU_CK(cudaMemcpyAsync(d_in, src, bytes, cudaMemcpyHostToDevice, stream));
            GPU_CK(cudaMemsetAsync(d_x, 0, xn * sizeof(uint16_t), stream));
            GPU_CK(cudaGraphLaunch(ge, stream));
            download(got, d_y, ybytes);
            /* the same, in stream order */
            GPU_CK(cudaMemcpyAsync(d_in, src, bytes, cudaMemcpyHostToDevice, stream));
            GPU_CK(cudaMemsetAsync(d_x, 0, xn * sizeof(uint16_t), stream));
            rc = kind ? cuda_silu_mul(d_gu, d_x, rows, dim, stream)
                      : cuda_add_parts_rmsnorm(d_res, NULL, d_parts, nparts, (int64_t)xn, d_wn, d_x,
                                               rows, dim, 1e-5f, stream);
            if (rc == 0)
                late_gemm(gemm, lt, h, d_x, d_w, d_y, rows, dim, &rc);
            download(want, d_y, ybytes);
            differ += memcmp(got, want, ybytes) != 0;
        }
        GPU_CK(cudaGraphExecDestroy(ge));
        GPU_CHECK(rc == 0, "late %s: %d (%s)", name, rc, pagoda_error_detail());
        if (late)
            GPU_CHECK(differ == 0, "late %s: %d of %d replays differ from stream order", name,
                      differ, reps);
        else
            printf("control: %s behind the early trigger: %d of %d replays differ\n", name, differ,
                   reps);
    }
    GPU_CK(cudaFree(d_in));
    GPU_CK(cudaFree(d_wn));
    GPU_CK(cudaFree(d_w));
    GPU_CK(cudaFree(d_x));
    GPU_CK(cudaFree(d_y));
    free(in_f);
    free(in_h);
    free(wn);
    free(w);
    free(got);
    free(want);
}

static void test_lt_cases(void)
{
    void *ws = dev_alloc(32u << 20);
    struct cuda_lt *lt = NULL;
    int rc = cuda_lt_new(ws, 32u << 20, &lt);
    GPU_CHECK(rc == 0, "cuda_lt_new: %d (%s)", rc, pagoda_error_detail());
    if (rc != 0) {
        GPU_CK(cudaFree(ws));
        return;
    }
    test_lt_linear(lt, 1, 4096, 1000, 1000, 0);
    test_lt_linear(lt, 16, 4096, 4096, 4096, 0);
    test_lt_linear(lt, 16, 14336, 256, 256, 1);
    test_lt_linear(lt, 64, 1024, 6144, 6144, 0);
    test_lt_linear(lt, 7, 4096, 1003, 1010, 1); /* the LM head into a wider row */
    test_lt_linear(lt, 300, 512, 768, 768, 0);
    cublasHandle_t h;
    GPU_CHECK(cublasCreate(&h) == CUBLAS_STATUS_SUCCESS, "cublasCreate");
    GPU_CK(cudaStreamSynchronize(stream));
    if (cublasSetStream(h, stream) == CUBLAS_STATUS_SUCCESS &&
        cublasSetWorkspace(h, ws, 32u << 20) == CUBLAS_STATUS_SUCCESS) {
        for (int gemm = 0; gemm < 3; gemm++) {
            test_late_into_cublas(lt, h, 0, gemm);
            test_late_into_cublas(lt, h, 1, gemm);
        }
    }
    cublasDestroy(h);
    void *p = ws;
    expect_rc("lt rows 0", cuda_lt_linear(lt, p, p, p, 0, 0, 64, 8, 8, stream), PAGODA_EINVAL);
    expect_rc("lt ldy < out", cuda_lt_linear(lt, p, p, p, 0, 1, 64, 8, 7, stream), PAGODA_EINVAL);
    expect_rc("lt NULL w", cuda_lt_linear(lt, p, NULL, p, 0, 1, 64, 8, 8, stream), PAGODA_EINVAL);
    cuda_lt_free(lt);
    GPU_CK(cudaFree(ws));
}

static void test_gemv_refusals(void)
{
    void *d = dev_alloc(1 << 20);
    uint16_t *p = d;
    expect_rc("gemv rows 0", cuda_gemv(p, p, p, 0, 0, 64, 8, stream), PAGODA_EINVAL);
    expect_rc("gemv rows > max", cuda_gemv(p, p, p, 0, CUDA_GEMV_MAX_ROWS + 1, 64, 8, stream),
              PAGODA_EINVAL);
    expect_rc("gemv in % 32", cuda_gemv(p, p, p, 0, 1, 40, 8, stream), PAGODA_EINVAL);
    expect_rc("gemv misaligned x", cuda_gemv(p + 1, p, p, 0, 1, 64, 8, stream), PAGODA_EINVAL);
    expect_rc("gemv NULL w", cuda_gemv(p, NULL, p, 0, 1, 64, 8, stream), PAGODA_EINVAL);
    expect_rc("gemv_stream rows > max",
              cuda_gemv_stream(p, p, p, 0, CUDA_GEMV_MAX_ROWS + 1, 64, 8, NULL, stream),
              PAGODA_EINVAL);
    expect_rc("gemv_stream misaligned w", cuda_gemv_stream(p, p + 1, p, 0, 1, 64, 8, NULL, stream),
              PAGODA_EINVAL);
    static const struct cuda_gemv_ring bad[] = {{-1, 0, 0},   {0, -512, 0}, {0, 700, 0},
                                                {0, 8192, 0}, {0, 0, 2},    {0, 0, -2}};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++)
        expect_rc("gemv_stream bad ring", cuda_gemv_stream(p, p, p, 0, 1, 64, 8, &bad[k], stream),
                  PAGODA_EINVAL);
    /* 8 stages of 4096 columns (in is 8 x 4096: a CTA streams 8) do not fit in shared memory; the
     * same ring over a row of 4096 columns is one stage, which fits. */
    const struct cuda_gemv_ring big = {8, 4096, 0};
    expect_rc("gemv_stream ring too large",
              cuda_gemv_stream(p, p, p, 0, 1, 8 * 4096, 8, &big, stream), PAGODA_EINVAL);
    expect_rc("gemv_stream ring cut to what a CTA streams",
              cuda_gemv_stream(p, p, p, 0, 1, 4096, 8, &big, stream), 0);
    GPU_CK(cudaFree(d));
}

/* A token's K and V come from a fused QKV row (row_stride wide), one token is padding (slot
 * -1); afterwards every written vector matches its source and everything else in the pool is
 * still poison. */
static void test_reshape_and_cache(int32_t block_size, int32_t num_kv_heads, int32_t head_dim,
                                   int64_t extra_stride)
{
    const int32_t num_tokens = 10, num_heads = 2 * num_kv_heads, padding = 3;
    struct kv_geometry g = {7, 2, 12, block_size, num_kv_heads, head_dim, DTYPE_BF16};
    size_t pool_elems = kv_pool_bytes(&g) / sizeof(uint16_t); /* both layers */
    const int64_t kvw = (int64_t)num_kv_heads * head_dim;
    const int64_t row_stride = (num_heads + 2 * num_kv_heads) * head_dim + extra_stride;
    size_t qn = (size_t)num_tokens * row_stride;
    uint16_t *qkv = xmalloc(qn * sizeof(uint16_t));
    uint16_t *pool = xmalloc(pool_elems * sizeof(uint16_t));
    int64_t slots[10];
    fill_bf16(qkv, qn, -1.0f, 1.0f);
    /* distinct slots in blocks 1 .. 11 */
    int64_t usable = (int64_t)(g.num_blocks - 1) * block_size;
    for (int32_t t = 0; t < num_tokens; t++) {
        bool again;
        do {
            slots[t] = block_size + rng_next() % (uint64_t)usable;
            again = false;
            for (int32_t u = 0; u < t; u++)
                again |= slots[u] == slots[t];
        } while (again);
    }
    slots[padding] = -1;

    void *d_pool = dev_alloc(pool_elems * sizeof(uint16_t));
    poison(d_pool, pool_elems * sizeof(uint16_t));
    struct kv_layer_view view = kv_layer_view_make(&g, d_pool, 1);
    uint16_t *d_qkv = dev_upload(qkv, qn * sizeof(uint16_t));
    int64_t *d_slots = dev_upload(slots, sizeof(slots));
    int rc = cuda_reshape_and_cache(&view, d_qkv + (int64_t)num_heads * head_dim,
                                    d_qkv + (int64_t)(num_heads + num_kv_heads) * head_dim,
                                    row_stride, d_slots, num_tokens, stream);
    GPU_CHECK(rc == 0, "cuda_reshape_and_cache: %d", rc);
    download(pool, d_pool, pool_elems * sizeof(uint16_t));

    struct kv_layer_view hv = kv_layer_view_make(&g, pool, 1);
    size_t mismatched = 0, written = 0, not_poison = 0;
    for (int32_t t = 0; t < num_tokens; t++) {
        if (slots[t] < 0)
            continue;
        int64_t block = slots[t] / block_size, off = slots[t] % block_size;
        for (int32_t h = 0; h < num_kv_heads; h++)
            for (int32_t d = 0; d < head_dim; d++) {
                int64_t at =
                    block * hv.block_stride + h * hv.head_stride + off * hv.slot_stride + d;
                const uint16_t *src = qkv + t * row_stride + (int64_t)num_heads * head_dim;
                mismatched += ((uint16_t *)hv.k)[at] != src[h * head_dim + d];
                mismatched += ((uint16_t *)hv.v)[at] != src[kvw + h * head_dim + d];
                written += 2;
            }
    }
    for (size_t i = 0; i < pool_elems; i++)
        not_poison += pool[i] != 0xFFFF;
    char cfg[128];
    snprintf(cfg, sizeof(cfg), "bs %d kv heads %d head_dim %d stride %lld (%s), 1 padding",
             (int)block_size, (int)num_kv_heads, (int)head_dim, (long long)row_stride,
             row_stride % 8 == 0 ? "16-byte" : "scalar");
    printf("%-20s %-58s %zu of %zu differ, %zu written%s\n", "reshape_and_cache", cfg, mismatched,
           written, not_poison, mismatched == 0 && not_poison == written ? "" : "  FAIL");
    GPU_CHECK(mismatched == 0, "reshape_and_cache: %zu elements differ", mismatched);
    GPU_CHECK(not_poison == written,
              "reshape_and_cache: %zu pool elements written, %zu expected (padding skipped)",
              not_poison, written);

    GPU_CK(cudaFree(d_pool));
    GPU_CK(cudaFree(d_qkv));
    GPU_CK(cudaFree(d_slots));
    free(qkv);
    free(pool);
}

int main(void)
{
    gpu_test_require_device("test_cuda_kernels");
    GPU_CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    test_embedding(1000, 4096, 37);
    test_embedding(97, 100, 9);
    /* Ranks of two of a 32001-row vocabulary (16001 rows each, the last 16000) and a rank of
     * three of 97 rows (33 each, the last 31); hidden 100, not a multiple of 8: the
     * scalar path. */
    test_embedding_rows(32001, 1024, 0, 16001);
    test_embedding_rows(32001, 1024, 16001, 32001);
    test_embedding_rows(97, 100, 33, 66);
    test_embedding_rows(97, 100, 66, 97);
    test_embedding_rows(97, 4096, 0, 97); /* one rank: every row, ids outside read zeros */
    test_add_rmsnorm(7, 4096, true, 0);
    test_add_rmsnorm(5, 1000, false, 0);
    test_add_rmsnorm(3, 100, true, 0);
    test_add_rmsnorm(3, 16384, true, 0); /* past the register-resident kernel */
    /* the slices of a split-K product (worker/cuda_backend_forward.c split_parts) */
    test_add_rmsnorm(16, 4096, false, 2);
    test_add_rmsnorm(5, 4096, true, 3);
    test_add_rmsnorm(3, 16384, false, 2);
    test_add_rmsnorm(3, 100, false, 4);
    test_add_bias(5, 4096, 4096 + 64);
    test_add_bias(3, 100, 130);
    test_to_bf16_bias(7, 4096, true);
    test_to_bf16_bias(7, 4096, false);
    test_to_bf16_bias(3, 100, true);
    test_to_bf16_bias(9000, 24, true); /* more rows than one grid's CTAs: the row stride */
    test_rope(9, 32 + 8, 128, (32 + 2 * 8) * 128, CPU_ROPE_LLAMA3, 500000.0);
    test_rope(6, 6, 64, 6 * 64 + 5, CPU_ROPE_DEFAULT, 10000.0);
    test_silu_mul(6, 1024);
    test_silu_mul(4, 77);
    test_reshape_and_cache(16, 4, 128, 0);
    test_reshape_and_cache(32, 2, 64, 3);
    test_rope_cache(16, 32, 8, 128, 0);
    test_rope_cache(32, 6, 2, 64, 5);
    test_gemv(1, 4096, 1000, 0);
    test_gemv(5, 1024 + 32, 333, 0);
    test_gemv(8, 96, 17, 1);
    test_gemv(9, 4096, 256, 0);
    test_gemv(16, 14336, 160, 0);
    test_gemv(16, 4096, 1003, 1);
    test_gemv(16, 4096, 16 * 140 + 3, 0); /* x resident: CTAs of two tiles */
    /* More tiles than SMs (a CTA takes several, its ring running across them), the last stage
     * of each tile partial. */
    test_gemv(3, 1056, 16 * 300 + 5, 0);
    test_gemv(12, 1056, 16 * 300 + 5, 1);
    test_gemv_chain(1, 4096, 4096, 4096, false);
    test_gemv_chain(16, 4096, 14336, 4096, false);
    GPU_CHECK(gemv_forms_run[0] > 0 && gemv_forms_run[1] > 0 && gemv_forms_run[2] > 0,
              "cuda_gemv_stream rings run: x in the stages %d, default %d, resident %d",
              gemv_forms_run[0], gemv_forms_run[1], gemv_forms_run[2]);
    test_gemv_refusals();
    test_gemv_row(4096, 1000, 0);
    test_gemv_row(2048, 17, 1);
    test_gemv_row(14336, 4096 + 5, 0);
    test_gemv_row(24576, 300, 1);
    test_gemv_row(4096, 28672, 0); /* more features than warps: several a warp */
    test_gemv_chain(1, 4096, 14336, 4096, true);
    test_gemv_row_norm(4096, 6144, true, 0);
    test_gemv_row_norm(4096, 28672, true, 0);
    test_gemv_row_norm(4096, 1000, false, 1);
    test_gemv_row_norm(2048, 300, true, 1);
    test_gemv_row_norm(6144, 700, true, 1);
    test_gemv_row_norm(8192, 512, true, 1);
    {
        void *p = NULL;
        GPU_CK(cudaMalloc(&p, 1 << 20));
        uint16_t *q = p;
        expect_rc("gemv_row in % 2048", cuda_gemv_row(q, q, q, 0, 3072, 8, stream), PAGODA_EINVAL);
        expect_rc("gemv_row in > 24576", cuda_gemv_row(q, q, q, 0, 26624, 8, stream),
                  PAGODA_EINVAL);
        expect_rc("gemv_row misaligned y", cuda_gemv_row(q, q, q + 1, 0, 2048, 8, stream),
                  PAGODA_EINVAL);
        GPU_CHECK(cuda_gemv_row_fits(2, 2048, 8, q, q, q) == 0, "cuda_gemv_row_fits took 2 rows");
        float *f = p;
        expect_rc("gemv_row_norm residual_out = residual",
                  cuda_gemv_row_norm(f, q, q, 1e-5f, f, q, q, 0, 2048, 8, stream), PAGODA_EINVAL);
        expect_rc("gemv_row_norm in > 8192",
                  cuda_gemv_row_norm(f, q, q, 1e-5f, f + 16384, q, q, 0, 10240, 8, stream),
                  PAGODA_EINVAL);
        expect_rc("gemv_row_norm residual_out overlapping residual",
                  cuda_gemv_row_norm(f, q, q, 1e-5f, f + 8, q, q, 0, 2048, 8, stream),
                  PAGODA_EINVAL);
        expect_rc("gemv_row_norm eps < 0",
                  cuda_gemv_row_norm(f, q, q, -1.0f, f + 16384, q, q, 0, 2048, 8, stream),
                  PAGODA_EINVAL);
        GPU_CK(cudaFree(p));
    }
    test_lt_cases();

    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("worst relative error of the bf16 cases: %.2e; %.1f s\n", worst_err,
           (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));
    GPU_CK(cudaStreamDestroy(stream));
    return gpu_test_finish();
}
