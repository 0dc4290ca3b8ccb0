/* The CPU sampler, the reference for the CUDA one. docs/sampling.md is the specification; the
 * step numbers in the comments below are its section numbers. Every float operation here is
 * meant to be one IEEE-754 operation rounded to nearest: the file must not be compiled with
 * -ffast-math or floating-point contraction (GCC's ISO C mode, which pagoda uses, does not
 * contract). test_sampler's golden draws fail if that changes. */
#include "kernels/cpu/sampler.h"

#include "common/error.h"
#include "kernels/philox.h"
#include "kernels/sampling_math.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The most likely token's weight (step 4), exactly 2^40. */
#define WEIGHT_ONE SAMPLING_WEIGHT_ONE

struct sampling_params sampling_params_default(void)
{
    struct sampling_params p = {
        .temperature = 1.0f,
        .top_k = 0,
        .top_p = 1.0f,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .seed = 0,
    };
    return p;
}

int sampling_params_penalised(const struct sampling_params *p)
{
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f ||
           p->frequency_penalty != 0.0f;
}

int sampling_params_validate(const struct sampling_params *p)
{
    if (!p)
        return pagoda_error_set(PAGODA_EINVAL, "sampling params: NULL");
    const struct {
        const char *name;
        float value;
    } floats[] = {
        {"temperature", p->temperature},
        {"top_p", p->top_p},
        {"min_p", p->min_p},
        {"repetition_penalty", p->repetition_penalty},
        {"presence_penalty", p->presence_penalty},
        {"frequency_penalty", p->frequency_penalty},
    };
    for (size_t i = 0; i < sizeof(floats) / sizeof(floats[0]); i++)
        if (isnan(floats[i].value))
            return pagoda_error_set(PAGODA_EINVAL, "sampling param %s is NaN", floats[i].name);
    if (p->temperature != 0.0f &&
        !(p->temperature >= SAMPLING_TEMPERATURE_MIN && p->temperature <= SAMPLING_TEMPERATURE_MAX))
        return pagoda_error_set(PAGODA_ERANGE,
                                "sampling param temperature %g must be 0 (greedy) or in [%g, %g]",
                                (double)p->temperature, (double)SAMPLING_TEMPERATURE_MIN,
                                (double)SAMPLING_TEMPERATURE_MAX);
    if (p->min_tokens < 0)
        return pagoda_error_set(PAGODA_ERANGE, "sampling param min_tokens %d must be >= 0",
                                (int)p->min_tokens);
    if (p->top_k < 0)
        return pagoda_error_set(PAGODA_ERANGE, "sampling param top_k %d must be >= 0 (0: off)",
                                (int)p->top_k);
    if (!(p->top_p > 0.0f && p->top_p <= 1.0f))
        return pagoda_error_set(PAGODA_ERANGE, "sampling param top_p %g must be in (0, 1]",
                                (double)p->top_p);
    if (!(p->min_p >= 0.0f && p->min_p <= 1.0f))
        return pagoda_error_set(PAGODA_ERANGE, "sampling param min_p %g must be in [0, 1]",
                                (double)p->min_p);
    if (!(p->repetition_penalty >= SAMPLING_REPETITION_PENALTY_MIN &&
          p->repetition_penalty <= SAMPLING_REPETITION_PENALTY_MAX))
        return pagoda_error_set(
            PAGODA_ERANGE, "sampling param repetition_penalty %g must be in [%g, %g] (1: off)",
            (double)p->repetition_penalty, (double)SAMPLING_REPETITION_PENALTY_MIN,
            (double)SAMPLING_REPETITION_PENALTY_MAX);
    if (fabsf(p->presence_penalty) > SAMPLING_PENALTY_LIMIT)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sampling param presence_penalty %g must be in [-2, 2]",
                                (double)p->presence_penalty);
    if (fabsf(p->frequency_penalty) > SAMPLING_PENALTY_LIMIT)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sampling param frequency_penalty %g must be in [-2, 2]",
                                (double)p->frequency_penalty);
    return 0;
}

/* One allocation, carved in decreasing alignment: weights, logits, order, output_counts,
 * in_prompt. weights is its start, which is what fini frees. */
int sampler_workspace_init(struct sampler_workspace *ws, int32_t vocab)
{
    if (!ws)
        return pagoda_error_set(PAGODA_EINVAL, "sampler workspace: NULL");
    memset(ws, 0, sizeof(*ws));
    if (vocab < 1 || vocab > SAMPLER_VOCAB_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "sampler workspace: vocab %d outside [1, %d]",
                                (int)vocab, SAMPLER_VOCAB_MAX);
    size_t n = (size_t)vocab;
    size_t per_token = sizeof(uint64_t) + sizeof(float) + 2 * sizeof(int32_t) + sizeof(uint8_t);
    unsigned char *mem = calloc(n, per_token);
    if (!mem)
        return pagoda_error_set(PAGODA_ENOMEM, "sampler workspace: %zu bytes for vocab %d",
                                n * per_token, (int)vocab);
    ws->weights = (uint64_t *)mem;
    ws->logits = (float *)(mem + n * sizeof(uint64_t));
    ws->order = (int32_t *)(mem + n * (sizeof(uint64_t) + sizeof(float)));
    ws->output_counts = ws->order + n;
    ws->in_prompt = (uint8_t *)(ws->output_counts + n);
    ws->vocab = vocab;
    return 0;
}

void sampler_workspace_fini(struct sampler_workspace *ws)
{
    if (!ws)
        return;
    free(ws->weights);
    memset(ws, 0, sizeof(*ws));
}

static int check_tokens(const char *which, const int32_t *tokens, size_t n, int32_t vocab)
{
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= vocab)
            return pagoda_error_set(PAGODA_EINVAL, "sampler: %s token %zu is %d, outside [0, %d)",
                                    which, i, (int)tokens[i], (int)vocab);
    return 0;
}

/* Step 1 for one token (kernels/sampling_math.h, shared with the CUDA sampler). */
static float penalise(float v, const struct sampling_params *p, int32_t output_count)
{
    return sampling_penalise(v, p->repetition_penalty, p->presence_penalty, p->frequency_penalty,
                             output_count);
}

/* Step 1. Each distinct token of the history is penalised once: the output pass handles tokens
 * that occur in the output (counted first), the prompt pass those only in the prompt; each
 * pass clears the marks it consumed, which leaves in_prompt and output_counts all-zero again
 * whatever happens. */
static int apply_penalties(const struct sampling_params *p, const int32_t *prompt_tokens,
                           size_t n_prompt, const int32_t *output_tokens, size_t n_output,
                           struct sampler_workspace *ws)
{
    float *l = ws->logits;
    int32_t overflowed = -1;
    for (size_t i = 0; i < n_prompt; i++)
        ws->in_prompt[prompt_tokens[i]] = 1;
    for (size_t i = 0; i < n_output; i++)
        ws->output_counts[output_tokens[i]]++;
    for (size_t i = 0; i < n_output; i++) {
        int32_t t = output_tokens[i];
        if (ws->output_counts[t] == 0)
            continue;
        float v = penalise(l[t], p, ws->output_counts[t]);
        if (isinf(v) && !isinf(l[t]))
            overflowed = t;
        l[t] = v;
        ws->output_counts[t] = 0;
        ws->in_prompt[t] = 0;
    }
    for (size_t i = 0; i < n_prompt; i++) {
        int32_t t = prompt_tokens[i];
        if (!ws->in_prompt[t])
            continue;
        float v = penalise(l[t], p, 0);
        if (isinf(v) && !isinf(l[t]))
            overflowed = t;
        l[t] = v;
        ws->in_prompt[t] = 0;
    }
    if (overflowed >= 0)
        return pagoda_error_set(PAGODA_ERANGE, "sampler: penalties make token %d's logit overflow",
                                (int)overflowed);
    return 0;
}

/* Steps 3 and 4: the weight of a token, floor(exp~((l - m) / temperature) * 2^40), by the
 * arithmetic in kernels/sampling_math.h, which the CUDA sampler shares. */
static uint64_t token_weight(float l, float max_logit, float temperature)
{
    return sampling_weight(sampling_scaled_logit(l, max_logit, temperature));
}

/* The canonical order (step 5): higher logit first, then lower token id. Whether a comes after
 * b. */
static bool later(const float *l, int32_t a, int32_t b)
{
    return l[a] < l[b] || (l[a] == l[b] && a > b);
}

/* Whether a belongs above b in a heap whose root is the latest token in canonical order
 * (latest_root) or the earliest (!latest_root). */
static bool heap_above(const float *l, int32_t a, int32_t b, bool latest_root)
{
    return latest_root ? later(l, a, b) : later(l, b, a);
}

/* Sifts order[i] down the heap order[0..n). */
static void sift_down(int32_t *order, int32_t n, int32_t i, const float *l, bool latest_root)
{
    for (;;) {
        int32_t child = 2 * i + 1;
        if (child >= n)
            return;
        if (child + 1 < n && heap_above(l, order[child + 1], order[child], latest_root))
            child++;
        if (!heap_above(l, order[child], order[i], latest_root))
            return;
        int32_t tmp = order[i];
        order[i] = order[child];
        order[child] = tmp;
        i = child;
    }
}

static void heapify(int32_t *order, int32_t n, const float *l, bool latest_root)
{
    for (int32_t i = n / 2 - 1; i >= 0; i--)
        sift_down(order, n, i, l, latest_root);
}

/* Moves the first k of order[0..n) in canonical order to order[0..k) (in no particular order),
 * in O(n log k): a heap of the best k seen so far whose root is the worst of them. Heaps need
 * no allocation and no recursion, and because the canonical order is total the set selected
 * does not depend on the algorithm. */
static void select_first_k(int32_t *order, int32_t n, int32_t k, const float *l)
{
    heapify(order, k, l, true);
    for (int32_t j = k; j < n; j++) {
        if (later(l, order[0], order[j])) {
            int32_t tmp = order[0];
            order[0] = order[j];
            order[j] = tmp;
            sift_down(order, k, 0, l, true);
        }
    }
}

/* Keeps the shortest canonical prefix of order[0..n) whose weight reaches top_p of the weight
 * of all n, zeroes the others' weights, moves the prefix to order[0..) and returns its length.
 * Pops tokens off a heap whose root is the earliest, so it costs O(n + kept * log n) and never
 * sorts the tail. The popped tokens collect at the end of the array. */
static int32_t keep_top_p(int32_t *order, int32_t n, float top_p, const float *l, uint64_t *w)
{
    uint64_t total = 0;
    for (int32_t j = 0; j < n; j++)
        total += w[order[j]];
    double target = (double)top_p * (double)total;
    heapify(order, n, l, false);
    uint64_t acc = 0;
    int32_t end = n;
    while (end > 0) { /* stops at the latest when end is 0: acc is then total >= target */
        int32_t t = order[0];
        order[0] = order[end - 1];
        order[end - 1] = t;
        end--;
        sift_down(order, end, 0, l, false);
        acc += w[t];
        if ((double)acc >= target)
            break;
    }
    for (int32_t j = 0; j < end; j++)
        w[order[j]] = 0;
    memmove(order, order + end, (size_t)(n - end) * sizeof(*order));
    return n - end;
}

/* Steps 3 to 7 for a temperature > 0: weights, truncation, one Philox draw. max_logit is the
 * largest penalised logit (finite). */
static int32_t draw_token(const struct sampling_params *p, int32_t vocab, float max_logit,
                          uint64_t output_index, struct sampler_workspace *ws)
{
    const float *l = ws->logits;
    uint64_t *w = ws->weights;
    int32_t *order = ws->order;

    /* Steps 3 and 4: scaled logits and weights; the candidates are the tokens of weight > 0. */
    int32_t n = 0;
    for (int32_t i = 0; i < vocab; i++) {
        w[i] = token_weight(l[i], max_logit, p->temperature);
        if (w[i] > 0)
            order[n++] = i;
    }

    /* Step 5: top-k, the first k candidates in canonical order. */
    if (p->top_k > 0 && p->top_k < n) {
        select_first_k(order, n, p->top_k, l);
        for (int32_t j = p->top_k; j < n; j++)
            w[order[j]] = 0;
        n = p->top_k;
    }

    /* Step 5: top-p over what top-k kept, compared in f64. */
    if (p->top_p < 1.0f)
        n = keep_top_p(order, n, p->top_p, l, w);

    /* Step 5: min-p, relative to the most likely token, whose weight is exactly 2^40. */
    if (p->min_p > 0.0f) {
        double threshold = (double)p->min_p * (double)WEIGHT_ONE;
        for (int32_t j = 0; j < n; j++)
            if ((double)w[order[j]] < threshold)
                w[order[j]] = 0;
    }

    /* Steps 6 and 7: one 64-bit uniform, scaled onto the kept weight, found by a scan in token
     * id order. */
    uint64_t total = 0;
    for (int32_t j = 0; j < n; j++)
        total += w[order[j]];
    uint64_t target = philox_scale_u64(philox_u64(philox_draw(p->seed, output_index, 0)), total);
    uint64_t acc = 0;
    int32_t last = 0;
    for (int32_t i = 0; i < vocab; i++) {
        if (w[i] == 0)
            continue;
        acc += w[i];
        last = i;
        if (acc > target)
            return i;
    }
    return last; /* not reached: target < total */
}

/* log_softmax(l)[token] in f64 (step 8). */
static float log_softmax_at(const float *l, int32_t vocab, float max_logit, int32_t token)
{
    double sum = 0.0;
    for (int32_t i = 0; i < vocab; i++)
        sum += exp((double)l[i] - (double)max_logit);
    return (float)(((double)l[token] - (double)max_logit) - log(sum));
}

int sampler_sample(const struct sampling_params *p, const float *logits, int32_t vocab,
                   const int32_t *prompt_tokens, size_t n_prompt, const int32_t *output_tokens,
                   size_t n_output, uint64_t output_index, struct sampler_workspace *ws,
                   int32_t *token, float *logprob)
{
    int rc = sampling_params_validate(p);
    if (rc < 0)
        return rc;
    if (!logits || !ws || !token || (n_prompt > 0 && !prompt_tokens) ||
        (n_output > 0 && !output_tokens))
        return pagoda_error_set(PAGODA_EINVAL, "sampler: NULL argument");
    if (vocab < 1 || vocab > ws->vocab)
        return pagoda_error_set(PAGODA_ERANGE, "sampler: vocab %d outside [1, %d] (workspace)",
                                (int)vocab, (int)ws->vocab);
    if (n_prompt > SAMPLER_HISTORY_MAX || n_output > SAMPLER_HISTORY_MAX - n_prompt)
        return pagoda_error_set(PAGODA_ERANGE,
                                "sampler: history of %zu prompt + %zu output tokens exceeds %d",
                                n_prompt, n_output, SAMPLER_HISTORY_MAX);
    if ((rc = check_tokens("prompt", prompt_tokens, n_prompt, vocab)) < 0 ||
        (rc = check_tokens("output", output_tokens, n_output, vocab)) < 0)
        return rc;

    float *l = ws->logits;
    for (int32_t i = 0; i < vocab; i++) {
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return pagoda_error_set(PAGODA_EINVAL, "sampler: logit %d is %g", (int)i,
                                    (double)logits[i]);
        l[i] = logits[i];
    }

    /* Step 1. With every penalty off the step is the identity, so it is skipped. */
    if (sampling_params_penalised(p)) {
        rc = apply_penalties(p, prompt_tokens, n_prompt, output_tokens, n_output, ws);
        if (rc < 0)
            return rc;
    }

    /* Step 2: the argmax, lowest id among equals; it is also the greedy token. */
    int32_t best = 0;
    for (int32_t i = 1; i < vocab; i++)
        if (l[i] > l[best])
            best = i;
    if (l[best] == -INFINITY)
        return pagoda_error_set(PAGODA_EINVAL, "sampler: every logit is -inf");

    int32_t chosen = best;
    if (p->temperature != 0.0f)
        chosen = draw_token(p, vocab, l[best], output_index, ws);
    if (logprob)
        *logprob = log_softmax_at(l, vocab, l[best], chosen);
    *token = chosen;
    return 0;
}
