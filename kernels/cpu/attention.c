/* Paged attention on the CPU. The plan copies a step's metadata into arrays allocated once, so
 * that a run only reads the plan, the pool and q, and writes out: no allocation, no I/O. Both
 * implementations do plain f32 arithmetic; the gather version is the readable reference, the
 * paged version is the shape the GPU kernels take (block table walk, online softmax). */
#include "kernels/cpu/attention.h"

#include "common/error.h"
#include "kernels/attention_batch.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct attention_plan {
    struct attention_config config;
    int32_t group; /* query heads per KV head */

    /* The planned batch, in the plan's own arrays (sized by the config's limits). */
    bool planned;
    int32_t num_seqs;
    int32_t num_tokens;
    int32_t max_context_len;
    int32_t *query_start;  /* max_num_seqs + 1 */
    int32_t *context_len;  /* max_num_seqs */
    int32_t *block_tables; /* [max_num_seqs][config.max_blocks_per_seq] */

    float *scratch; /* sized for the config's impl at its largest batch */
    size_t scratch_floats;
};

/* Floats of scratch each implementation needs for contexts up to max_context_len. The gather
 * version holds one sequence's K and V of one KV head contiguously, plus one row of scores; the
 * paged version holds, for the query heads of one KV head, an accumulator, the scores of one
 * block, and the running max and sum: nothing that depends on the context length. */
static uint64_t scratch_floats_for(const struct attention_config *c, int32_t group,
                                   enum attention_impl impl, int32_t max_context_len)
{
    if (impl == ATTN_CPU_GATHER)
        return (2 * (uint64_t)c->head_dim + 1) * (uint64_t)max_context_len;
    return (uint64_t)group * ((uint64_t)c->head_dim + (uint64_t)c->block_size + 2);
}

static struct attention_limits limits_of(const struct attention_config *c)
{
    struct attention_limits l = {
        .block_size = c->block_size,
        .num_blocks = c->num_blocks,
        .max_num_seqs = c->max_num_seqs,
        .max_num_tokens = c->max_num_tokens,
        .max_blocks_per_seq = c->max_blocks_per_seq,
    };
    return l;
}

static int config_check(const struct attention_config *c)
{
    if (c->impl != ATTN_CPU_GATHER && c->impl != ATTN_CPU_PAGED)
        return pagoda_error_set(PAGODA_EINVAL, "attention: unknown implementation %d",
                                (int)c->impl);
    if (c->dtype != DTYPE_F32)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "attention: the CPU kernels read f32 K/V, not %s",
                                dtype_name(c->dtype));
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
    struct attention_limits limits = limits_of(c);
    return attention_limits_check(&limits);
}

/* calloc of n elements of size bytes, refusing products that do not fit size_t. */
static void *alloc_array(uint64_t n, size_t size)
{
    if (n == 0)
        n = 1;
    if (n > SIZE_MAX / size)
        return NULL;
    return calloc((size_t)n, size);
}

int attention_plan_new(const struct attention_config *config, struct attention_plan **out)
{
    if (config == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_plan_new: NULL argument");
    *out = NULL;
    int rc = config_check(config);
    if (rc < 0)
        return rc;

    struct attention_plan *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "attention_plan_new: plan");
    p->config = *config;
    p->group = config->num_heads / config->num_kv_heads;
    int32_t max_context_len = config->max_blocks_per_seq * config->block_size;
    uint64_t scratch = scratch_floats_for(config, p->group, config->impl, max_context_len);
    p->query_start = alloc_array((uint64_t)config->max_num_seqs + 1, sizeof(int32_t));
    p->context_len = alloc_array((uint64_t)config->max_num_seqs, sizeof(int32_t));
    p->block_tables =
        alloc_array((uint64_t)config->max_num_seqs * config->max_blocks_per_seq, sizeof(int32_t));
    p->scratch = alloc_array(scratch, sizeof(float));
    if (p->query_start == NULL || p->context_len == NULL || p->block_tables == NULL ||
        p->scratch == NULL) {
        rc = pagoda_error_set(PAGODA_ENOMEM,
                              "attention_plan_new: %llu scratch floats and tables for %d "
                              "sequences of %d blocks",
                              (unsigned long long)scratch, (int)config->max_num_seqs,
                              (int)config->max_blocks_per_seq);
        goto fail;
    }
    p->scratch_floats = (size_t)scratch;
    *out = p;
    return 0;

fail:
    attention_plan_free(p);
    return rc;
}

void attention_plan_free(struct attention_plan *plan)
{
    if (plan == NULL)
        return;
    free(plan->query_start);
    free(plan->context_len);
    free(plan->block_tables);
    free(plan->scratch);
    free(plan);
}

int attention_plan(struct attention_plan *plan, const struct attention_batch *batch)
{
    if (plan == NULL || batch == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_plan: NULL argument");
    plan->planned = false;
    int32_t max_context_len = 0;
    struct attention_limits limits = limits_of(&plan->config);
    int rc = attention_batch_check(&limits, batch, &max_context_len);
    if (rc < 0)
        return rc;

    const struct attention_config *c = &plan->config;
    memcpy(plan->query_start, batch->query_start, ((size_t)batch->num_seqs + 1) * sizeof(int32_t));
    for (int32_t s = 0; s < batch->num_seqs; s++) {
        int32_t blocks = (batch->context_len[s] + c->block_size - 1) / c->block_size;
        plan->context_len[s] = batch->context_len[s];
        memcpy(plan->block_tables + (size_t)s * (size_t)c->max_blocks_per_seq,
               batch->block_tables + (size_t)s * (size_t)batch->max_blocks_per_seq,
               (size_t)blocks * sizeof(int32_t));
    }
    plan->num_seqs = batch->num_seqs;
    plan->num_tokens = batch->num_tokens;
    plan->max_context_len = max_context_len;
    plan->planned = true;
    return 0;
}

size_t attention_scratch_bytes(const struct attention_plan *plan, enum attention_impl impl)
{
    if (plan == NULL || !plan->planned)
        return 0;
    return (size_t)scratch_floats_for(&plan->config, plan->group, impl, plan->max_context_len) *
           sizeof(float);
}

static float dot(const float *a, const float *b, int32_t n)
{
    float acc = 0.0f;
    for (int32_t d = 0; d < n; d++)
        acc += a[d] * b[d];
    return acc;
}

/* acc += w * x */
static void axpy(float *acc, float w, const float *x, int32_t n)
{
    for (int32_t d = 0; d < n; d++)
        acc[d] += w * x[d];
}

/* The K (or V) vector of one (block, KV head, slot), through the view's strides. */
static float *kv_vector(void *base, const struct kv_layer_view *kv, int32_t block, int32_t head,
                        int32_t slot)
{
    return (float *)base + (int64_t)block * kv->block_stride + (int64_t)head * kv->head_stride +
           (int64_t)slot * kv->slot_stride;
}

/* The teaching version for one sequence: for each KV head, copy the context's K and V into
 * scratch in logical order, then for each query row compute all scores, softmax, and the
 * weighted sum of V. */
static void run_gather_seq(struct attention_plan *p, const struct kv_layer_view *kv, int32_t s,
                           const float *q, float *out, float *lse)
{
    const struct attention_config *c = &p->config;
    const int32_t hd = c->head_dim, bs = c->block_size;
    const int32_t first = p->query_start[s];
    const int32_t query_len = p->query_start[s + 1] - first;
    const int32_t context_len = p->context_len[s];
    const int32_t *table = p->block_tables + (size_t)s * (size_t)c->max_blocks_per_seq;
    float *keys = p->scratch;
    float *values = keys + (size_t)context_len * hd;
    float *scores = values + (size_t)context_len * hd;

    for (int32_t kh = 0; kh < c->num_kv_heads; kh++) {
        for (int32_t i = 0; i < context_len; i++) {
            /* logical token -> logical block -> physical block, offset -> K/V address */
            int32_t block = table[i / bs], slot = i % bs;
            memcpy(keys + (size_t)i * hd, kv_vector(kv->k, kv, block, kh, slot),
                   (size_t)hd * sizeof(float));
            memcpy(values + (size_t)i * hd, kv_vector(kv->v, kv, block, kh, slot),
                   (size_t)hd * sizeof(float));
        }
        for (int32_t j = 0; j < query_len; j++) {
            int64_t t = first + j;
            int32_t num_keys = context_len - query_len + j + 1; /* causal */
            for (int32_t g = 0; g < p->group; g++) {
                int64_t row = t * c->num_heads + (int64_t)kh * p->group + g;
                const float *qv = q + row * hd;
                float *o = out + row * hd;
                float max = -INFINITY;
                for (int32_t i = 0; i < num_keys; i++) {
                    scores[i] = dot(qv, keys + (size_t)i * hd, hd) * c->scale;
                    max = fmaxf(max, scores[i]);
                }
                float sum = 0.0f;
                for (int32_t i = 0; i < num_keys; i++) {
                    scores[i] = expf(scores[i] - max);
                    sum += scores[i];
                }
                memset(o, 0, (size_t)hd * sizeof(float));
                for (int32_t i = 0; i < num_keys; i++)
                    axpy(o, scores[i], values + (size_t)i * hd, hd);
                for (int32_t d = 0; d < hd; d++)
                    o[d] /= sum;
                if (lse != NULL)
                    lse[row] = max + logf(sum);
            }
        }
    }
}

/* The direct version for one sequence: for each (query token, KV head), walk the block table
 * and keep, for each query head of the group, a running max m, a running sum l of exp(score -
 * m) and an accumulator of the exp-weighted V. A new block with a larger max rescales l and the
 * accumulator by exp(m_old - m_new). Each K/V vector is read once per group, from the pool. */
static void run_paged_seq(struct attention_plan *p, const struct kv_layer_view *kv, int32_t s,
                          const float *q, float *out, float *lse)
{
    const struct attention_config *c = &p->config;
    const int32_t hd = c->head_dim, bs = c->block_size, group = p->group;
    const int32_t first = p->query_start[s];
    const int32_t query_len = p->query_start[s + 1] - first;
    const int32_t context_len = p->context_len[s];
    const int32_t *table = p->block_tables + (size_t)s * (size_t)c->max_blocks_per_seq;
    float *acc = p->scratch;                      /* [group][head_dim] */
    float *scores = acc + (size_t)group * hd;     /* [group][block_size] */
    float *run_max = scores + (size_t)group * bs; /* [group] */
    float *run_sum = run_max + group;             /* [group] */

    for (int32_t j = 0; j < query_len; j++) {
        int64_t t = first + j;
        int32_t num_keys = context_len - query_len + j + 1; /* causal */
        int32_t num_blocks = (num_keys + bs - 1) / bs;
        for (int32_t kh = 0; kh < c->num_kv_heads; kh++) {
            int64_t row0 = t * c->num_heads + (int64_t)kh * group;
            memset(acc, 0, (size_t)group * hd * sizeof(float));
            for (int32_t g = 0; g < group; g++) {
                run_max[g] = -INFINITY;
                run_sum[g] = 0.0f;
            }
            for (int32_t b = 0; b < num_blocks; b++) {
                int32_t block = table[b];
                int32_t count = num_keys - b * bs < bs ? num_keys - b * bs : bs;
                for (int32_t g = 0; g < group; g++) {
                    const float *qv = q + (row0 + g) * hd;
                    float *sc = scores + (size_t)g * bs;
                    float *a = acc + (size_t)g * hd;
                    float block_max = -INFINITY;
                    for (int32_t i = 0; i < count; i++) {
                        sc[i] = dot(qv, kv_vector(kv->k, kv, block, kh, i), hd) * c->scale;
                        block_max = fmaxf(block_max, sc[i]);
                    }
                    float new_max = fmaxf(run_max[g], block_max);
                    if (new_max > run_max[g]) {
                        float alpha = expf(run_max[g] - new_max); /* 0 on the first block */
                        run_sum[g] *= alpha;
                        for (int32_t d = 0; d < hd; d++)
                            a[d] *= alpha;
                        run_max[g] = new_max;
                    }
                    for (int32_t i = 0; i < count; i++) {
                        float w = expf(sc[i] - new_max);
                        run_sum[g] += w;
                        axpy(a, w, kv_vector(kv->v, kv, block, kh, i), hd);
                    }
                }
            }
            for (int32_t g = 0; g < group; g++) {
                float *o = out + (row0 + g) * hd;
                const float *a = acc + (size_t)g * hd;
                for (int32_t d = 0; d < hd; d++)
                    o[d] = a[d] / run_sum[g];
                if (lse != NULL)
                    lse[row0 + g] = run_max[g] + logf(run_sum[g]);
            }
        }
    }
}

static int view_check(const struct attention_config *c, const struct kv_layer_view *kv)
{
    if (kv->dtype != c->dtype || kv->block_size != c->block_size ||
        kv->num_kv_heads != c->num_kv_heads || kv->head_dim != c->head_dim ||
        kv->num_blocks != c->num_blocks)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "attention_run: the layer view (%s, block_size %d, %d KV heads, "
                                "head_dim %d, %d blocks) differs from the plan (%s, %d, %d, %d, "
                                "%d)",
                                dtype_name(kv->dtype), (int)kv->block_size, (int)kv->num_kv_heads,
                                (int)kv->head_dim, (int)kv->num_blocks, dtype_name(c->dtype),
                                (int)c->block_size, (int)c->num_kv_heads, (int)c->head_dim,
                                (int)c->num_blocks);
    if (kv->k == NULL || kv->v == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_run: the layer view has no K/V");
    return 0;
}

int attention_run_partial(struct attention_plan *plan, const struct kv_layer_view *kv,
                          const float *q, float *out, float *lse)
{
    if (plan == NULL || kv == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_run: NULL plan or view");
    if (!plan->planned)
        return pagoda_error_set(PAGODA_EINVAL, "attention_run: no batch planned");
    int rc = view_check(&plan->config, kv);
    if (rc < 0)
        return rc;
    if (plan->num_tokens > 0 && (q == NULL || out == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "attention_run: NULL q or out");
    for (int32_t s = 0; s < plan->num_seqs; s++) {
        if (plan->config.impl == ATTN_CPU_GATHER)
            run_gather_seq(plan, kv, s, q, out, lse);
        else
            run_paged_seq(plan, kv, s, q, out, lse);
    }
    return 0;
}

int attention_run(struct attention_plan *plan, const struct kv_layer_view *kv, const float *q,
                  float *out)
{
    return attention_run_partial(plan, kv, q, out, NULL);
}

int attention_merge_states(int64_t num_rows, int32_t head_dim, const float *out_a,
                           const float *lse_a, const float *out_b, const float *lse_b, float *out,
                           float *lse)
{
    if (num_rows < 0 || head_dim <= 0 || head_dim > ATTENTION_HEAD_DIM_MAX)
        return pagoda_error_set(PAGODA_EINVAL, "attention_merge_states: num_rows %lld, head_dim %d",
                                (long long)num_rows, (int)head_dim);
    if (num_rows > 0 && (out_a == NULL || lse_a == NULL || out_b == NULL || lse_b == NULL ||
                         out == NULL || lse == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "attention_merge_states: NULL buffer");
    for (int64_t r = 0; r < num_rows; r++) {
        const float *oa = out_a + r * head_dim, *ob = out_b + r * head_dim;
        float *o = out + r * head_dim;
        float la = lse_a[r], lb = lse_b[r];
        if (la == -INFINITY && lb == -INFINITY) {
            memset(o, 0, (size_t)head_dim * sizeof(float));
            lse[r] = -INFINITY;
        } else if (lb == -INFINITY) {
            memmove(o, oa, (size_t)head_dim * sizeof(float));
            lse[r] = la;
        } else if (la == -INFINITY) {
            memmove(o, ob, (size_t)head_dim * sizeof(float));
            lse[r] = lb;
        } else {
            /* Each output is its own exp-weighted average: reweight by its share of the total
             * exp mass, exp(lse_x - lse), computed from the larger lse to stay in range. */
            float max = fmaxf(la, lb);
            float wa = expf(la - max), wb = expf(lb - max);
            float inv = 1.0f / (wa + wb);
            for (int32_t d = 0; d < head_dim; d++)
                o[d] = (wa * oa[d] + wb * ob[d]) * inv;
            lse[r] = max + logf(wa + wb);
        }
    }
    return 0;
}

int attention_write_kv(const struct kv_layer_view *kv, int32_t num_tokens,
                       const int64_t *slot_mapping, const float *k, const float *v)
{
    if (kv == NULL || num_tokens < 0)
        return pagoda_error_set(PAGODA_EINVAL, "attention_write_kv: NULL view or num_tokens %d",
                                (int)num_tokens);
    if (kv->dtype != DTYPE_F32)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "attention_write_kv: the CPU kernels write f32 K/V, not %s",
                                dtype_name(kv->dtype));
    if (kv->block_size <= 0 || kv->num_blocks <= 0 || kv->num_kv_heads <= 0 || kv->head_dim <= 0 ||
        kv->k == NULL || kv->v == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "attention_write_kv: empty layer view");
    if (num_tokens > 0 && (slot_mapping == NULL || k == NULL || v == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "attention_write_kv: NULL buffer");

    /* int32 * int32 cannot overflow int64, so the bound itself is exact. */
    const int64_t num_slots = (int64_t)kv->num_blocks * kv->block_size;
    for (int32_t t = 0; t < num_tokens; t++) {
        int64_t slot = slot_mapping[t];
        if (slot >= 0 && (slot < kv->block_size || slot >= num_slots))
            return pagoda_error_set(PAGODA_ERANGE,
                                    "attention_write_kv: token %d: slot %lld outside %d..%lld "
                                    "(block 0 is reserved)",
                                    (int)t, (long long)slot, (int)kv->block_size,
                                    (long long)num_slots - 1);
    }

    const int32_t hd = kv->head_dim, heads = kv->num_kv_heads;
    for (int32_t t = 0; t < num_tokens; t++) {
        int64_t slot = slot_mapping[t];
        if (slot < 0)
            continue; /* padding */
        int32_t block = (int32_t)(slot / kv->block_size), offset = (int32_t)(slot % kv->block_size);
        for (int32_t h = 0; h < heads; h++) {
            size_t src = ((size_t)t * (size_t)heads + (size_t)h) * (size_t)hd;
            memcpy(kv_vector(kv->k, kv, block, h, offset), k + src, (size_t)hd * sizeof(float));
            memcpy(kv_vector(kv->v, kv, block, h, offset), v + src, (size_t)hd * sizeof(float));
        }
    }
    return 0;
}
