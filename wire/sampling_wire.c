#include "wire/sampling_wire.h"

/* Both messages carry the same fields under the same names; one macro reads either. */
#define SAMPLING_READ(m, s)                                                                        \
    do {                                                                                           \
        if ((m)->has_temperature)                                                                  \
            (s).temperature = (m)->temperature;                                                    \
        if ((m)->has_top_k)                                                                        \
            (s).top_k = (m)->top_k;                                                                \
        if ((m)->has_top_p)                                                                        \
            (s).top_p = (m)->top_p;                                                                \
        if ((m)->has_min_p)                                                                        \
            (s).min_p = (m)->min_p;                                                                \
        if ((m)->has_repetition_penalty)                                                           \
            (s).repetition_penalty = (m)->repetition_penalty;                                      \
        if ((m)->has_presence_penalty)                                                             \
            (s).presence_penalty = (m)->presence_penalty;                                          \
        if ((m)->has_frequency_penalty)                                                            \
            (s).frequency_penalty = (m)->frequency_penalty;                                        \
        if ((m)->has_seed)                                                                         \
            (s).seed = (m)->seed;                                                                  \
        if ((m)->has_min_tokens)                                                                   \
            (s).min_tokens = (m)->min_tokens;                                                      \
    } while (0)

int sampling_from_client(const Pagoda__SamplingParams *m, struct sampling_params *out)
{
    const struct sampling_params base = sampling_params_default();
    return sampling_from_client_over(m, &base, out);
}

int sampling_from_client_over(const Pagoda__SamplingParams *m, const struct sampling_params *base,
                              struct sampling_params *out)
{
    struct sampling_params s = *base;
    if (m != NULL)
        SAMPLING_READ(m, s);
    *out = s;
    return sampling_params_validate(out);
}

int sampling_from_internal(const Pagoda__Internal__SamplingParams *m, struct sampling_params *out)
{
    struct sampling_params s = sampling_params_default();
    if (m != NULL)
        SAMPLING_READ(m, s);
    *out = s;
    return sampling_params_validate(out);
}

Pagoda__Internal__SamplingParams sampling_to_internal(const struct sampling_params *p)
{
    Pagoda__Internal__SamplingParams m = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    m.has_temperature = m.has_top_k = m.has_top_p = m.has_min_p = 1;
    m.has_repetition_penalty = m.has_presence_penalty = m.has_frequency_penalty = 1;
    m.has_seed = 1;
    m.has_min_tokens = p->min_tokens != 0;
    m.min_tokens = p->min_tokens;
    m.temperature = p->temperature;
    m.top_k = p->top_k;
    m.top_p = p->top_p;
    m.min_p = p->min_p;
    m.repetition_penalty = p->repetition_penalty;
    m.presence_penalty = p->presence_penalty;
    m.frequency_penalty = p->frequency_penalty;
    m.seed = p->seed;
    return m;
}

static int bias_read(const int32_t *ids, size_t n_ids, const float *values, size_t n_values,
                     int64_t vocab, struct logit_bias *out)
{
    *out = (struct logit_bias){0};
    int rc = logit_bias_validate(ids, n_ids, values, n_values, vocab);
    return rc != 0 ? rc : logit_bias_copy(out, ids, values, n_ids);
}

int logit_bias_from_client(const Pagoda__SamplingParams *m, int64_t vocab, struct logit_bias *out)
{
    if (m == NULL) {
        *out = (struct logit_bias){0};
        return 0;
    }
    return bias_read(m->logit_bias_token_ids, m->n_logit_bias_token_ids, m->logit_bias_values,
                     m->n_logit_bias_values, vocab, out);
}

int logit_bias_from_internal(const Pagoda__Internal__SamplingParams *m, int64_t vocab,
                             struct logit_bias *out)
{
    if (m == NULL) {
        *out = (struct logit_bias){0};
        return 0;
    }
    return bias_read(m->logit_bias_token_ids, m->n_logit_bias_token_ids, m->logit_bias_values,
                     m->n_logit_bias_values, vocab, out);
}

void logit_bias_to_internal(const struct logit_bias *b, Pagoda__Internal__SamplingParams *m)
{
    m->n_logit_bias_token_ids = m->n_logit_bias_values = (size_t)b->n;
    m->logit_bias_token_ids = b->ids;
    m->logit_bias_values = b->values;
}
