#include "kernels/cpu/logit_bias.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

int logit_bias_validate(const int32_t *ids, size_t n_ids, const float *values, size_t n_values,
                        int64_t vocab)
{
    if (n_ids != n_values)
        return pagoda_error_set(PAGODA_EINVAL, "logit_bias: %zu token ids but %zu values", n_ids,
                                n_values);
    const size_t n = n_ids;
    if (n > SAMPLING_LOGIT_BIAS_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "logit_bias has %zu tokens, more than %d", n,
                                SAMPLING_LOGIT_BIAS_MAX);
    if (n > 0 && (ids == NULL || values == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "logit_bias: NULL array");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 && vocab <= 0)
            return pagoda_error_set(PAGODA_ERANGE, "logit_bias token id %d is negative",
                                    (int)ids[i]);
        if (ids[i] < 0 || (vocab > 0 && ids[i] >= vocab))
            return pagoda_error_set(PAGODA_ERANGE,
                                    "logit_bias token id %d is outside the vocabulary [0, %lld)",
                                    (int)ids[i], (long long)vocab);
        if (!isfinite(values[i]))
            return pagoda_error_set(PAGODA_EINVAL, "logit_bias of token %d is not a finite number",
                                    (int)ids[i]);
        if (fabsf(values[i]) > SAMPLING_LOGIT_BIAS_LIMIT)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "logit_bias of token %d, %g, is outside [%g, %g]", (int)ids[i],
                                    (double)values[i], -(double)SAMPLING_LOGIT_BIAS_LIMIT,
                                    (double)SAMPLING_LOGIT_BIAS_LIMIT);
        for (size_t j = 0; j < i; j++)
            if (ids[j] == ids[i])
                return pagoda_error_set(PAGODA_EINVAL, "logit_bias names token %d twice",
                                        (int)ids[i]);
    }
    return 0;
}

int logit_suppress_validate(const int32_t *ids, size_t n, int64_t vocab)
{
    if (n > SAMPLING_SUPPRESS_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "min_tokens has %zu stop ids, more than %d", n,
                                SAMPLING_SUPPRESS_MAX);
    if (n > 0 && ids == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "min_tokens stop ids: NULL array");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "min_tokens stop id %d is outside the vocabulary [0, %lld)",
                                    (int)ids[i], (long long)vocab);
        for (size_t j = 0; j < i; j++)
            if (ids[j] == ids[i])
                return pagoda_error_set(PAGODA_EINVAL, "min_tokens stop id %d listed twice",
                                        (int)ids[i]);
    }
    return 0;
}

int32_t stop_ids_suppressed(const int32_t *eos, int32_t n_eos, const int32_t *stop, int32_t n_stop,
                            int64_t vocab, int32_t *out)
{
    const int32_t *lists[2] = {eos, stop};
    const int32_t counts[2] = {n_eos, n_stop};
    int32_t n = 0;
    for (int l = 0; l < 2; l++)
        for (int32_t i = 0; i < counts[l]; i++) {
            const int32_t id = lists[l][i];
            int seen = id < 0 || id >= vocab;
            for (int32_t j = 0; j < n && !seen; j++)
                seen = out[j] == id;
            if (!seen)
                out[n++] = id;
        }
    return n;
}

static int among(int32_t tok, const int32_t *ids, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        if (ids[i] == tok)
            return 1;
    return 0;
}

int stop_token_ends(int32_t tok, int32_t out_len, int32_t min_tokens, int ignore_eos,
                    const int32_t *eos, int32_t n_eos, const int32_t *stop, int32_t n_stop)
{
    if (out_len <= min_tokens)
        return 0;
    return (!ignore_eos && among(tok, eos, n_eos)) || among(tok, stop, n_stop);
}

int logit_bias_copy(struct logit_bias *out, const int32_t *ids, const float *values, size_t n)
{
    *out = (struct logit_bias){0};
    if (n == 0)
        return 0;
    out->ids = malloc(n * sizeof(*out->ids));
    out->values = malloc(n * sizeof(*out->values));
    if (out->ids == NULL || out->values == NULL) {
        logit_bias_fini(out);
        return pagoda_error_set(PAGODA_ENOMEM, "logit_bias: out of memory");
    }
    memcpy(out->ids, ids, n * sizeof(*out->ids));
    memcpy(out->values, values, n * sizeof(*out->values));
    out->n = (int32_t)n;
    return 0;
}

void logit_bias_fini(struct logit_bias *b)
{
    if (b == NULL)
        return;
    free(b->ids);
    free(b->values);
    *b = (struct logit_bias){0};
}

int logit_bias_without(const struct logit_bias *bias, const int32_t *suppress, int32_t n,
                       struct logit_bias *out)
{
    *out = (struct logit_bias){0};
    if (bias == NULL || bias->n == 0)
        return 0;
    if (logit_bias_copy(out, bias->ids, bias->values, (size_t)bias->n) != 0)
        return PAGODA_ENOMEM;
    int32_t kept = 0;
    for (int32_t i = 0; i < bias->n; i++) {
        int suppressed = 0;
        for (int32_t j = 0; j < n && !suppressed; j++)
            suppressed = suppress[j] == bias->ids[i];
        if (!suppressed) {
            out->ids[kept] = bias->ids[i];
            out->values[kept++] = bias->values[i];
        }
    }
    out->n = kept;
    return 0;
}

int32_t logit_entries_build(int32_t row, const struct logit_bias *bias, const int32_t *suppress,
                            int32_t n_suppress, struct logit_entry *out)
{
    int32_t n = 0;
    for (int32_t i = 0; i < n_suppress; i++)
        out[n++] = (struct logit_entry){row, suppress[i], -INFINITY};
    for (int32_t i = 0; bias != NULL && i < bias->n; i++)
        out[n++] = (struct logit_entry){row, bias->ids[i], bias->values[i]};
    return n;
}

void logit_entries_apply(float *logits, int64_t vocab, const struct logit_entry *entries, int32_t n)
{
    for (int32_t i = 0; i < n; i++)
        logits[(int64_t)entries[i].row * vocab + entries[i].token] += entries[i].value;
}
