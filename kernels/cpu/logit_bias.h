/* Logit bias: what a request adds to its logits before they are sampled (OpenAI's logit_bias),
 * and min_tokens' suppression of its stop tokens, as one list of additions per step.
 *
 * A request's bias is a set of (token id, value) pairs with distinct ids, each value finite and
 * in [-SAMPLING_LOGIT_BIAS_LIMIT, SAMPLING_LOGIT_BIAS_LIMIT], at most SAMPLING_LOGIT_BIAS_MAX of
 * them. While a sequence has generated fewer than its min_tokens tokens (struct
 * sampling_params.min_tokens), its stop tokens (the model's EOS ids, also with ignore_eos, and the
 * request's stop token ids: at most SAMPLING_SUPPRESS_MAX) are suppressed: their logits become
 * -inf, so that the sampler cannot choose them, as vLLM's min_tokens does.
 *
 * Both apply to the logits the LM head produced, before the sampler's penalties (vLLM's order),
 * on every backend: the worker's mirror turns each step's rows into a list of struct logit_entry
 * (logit_entries_build) that the backend adds to its logits rows (logit_entries_apply on the
 * host, kernels/cuda/logit_bias.h on the device). The log-probabilities the sampler reports are
 * of these logits (as for the penalties). A plain C header. */
#ifndef PAGODA_KERNELS_CPU_LOGIT_BIAS_H
#define PAGODA_KERNELS_CPU_LOGIT_BIAS_H

#include <stddef.h>
#include <stdint.h>

/* Most pairs of one request's logit bias (vLLM has no limit; this bounds the worker's staging
 * memory: max_num_seqs * (SAMPLING_LOGIT_BIAS_MAX + SAMPLING_SUPPRESS_MAX) entries a step). */
#define SAMPLING_LOGIT_BIAS_MAX 300
/* A bias value lies in [-100, 100] (OpenAI's range). */
#define SAMPLING_LOGIT_BIAS_LIMIT 100.0f
/* Most stop tokens min_tokens suppresses for one sequence (the model's EOS ids and the request's
 * stop token ids, the scheduler's limits of 64 each). */
#define SAMPLING_SUPPRESS_MAX 128
/* Most entries one logits row adds. */
#define LOGIT_ENTRIES_PER_ROW (SAMPLING_LOGIT_BIAS_MAX + SAMPLING_SUPPRESS_MAX)

/* One request's logit bias. The arrays belong to whoever holds the struct (logit_bias_copy,
 * logit_bias_fini); n == 0 with NULL arrays is no bias. */
struct logit_bias {
    int32_t n;
    int32_t *ids;
    float *values;
};

/* Checks a message's two lists of n_ids ids and n_values values: as many of each, at most
 * SAMPLING_LOGIT_BIAS_MAX, every id in [0, vocab) (vocab <= 0: ids only >= 0, for a caller that
 * does not know the vocabulary), no id twice, every value finite and within the limit. Returns 0,
 * PAGODA_EINVAL (lists of two lengths, a NULL array with pairs, a NaN or infinite value, an id
 * twice) or PAGODA_ERANGE (too many pairs, an id or value out of range); the detail names the
 * pair. The router, the scheduler (wire/sampling_wire.h) and the worker's mirror all check so. */
int logit_bias_validate(const int32_t *ids, size_t n_ids, const float *values, size_t n_values,
                        int64_t vocab);

/* Checks min_tokens' stop ids: at most SAMPLING_SUPPRESS_MAX, each in [0, vocab), distinct.
 * Returns 0, PAGODA_EINVAL (NULL with n > 0, an id twice) or PAGODA_ERANGE. */
int logit_suppress_validate(const int32_t *ids, size_t n, int64_t vocab);

/* The stop rules of a request, one definition for the group's scheduler and pagoda-run. A
 * request's stop tokens are the model's EOS ids and its own stop token ids (each list at most
 * 64 ids, the scheduler's limits).
 *
 * stop_ids_suppressed: what min_tokens suppresses, into out (room for SAMPLING_SUPPRESS_MAX):
 * the EOS ids, also with ignore_eos (vLLM's _all_stop_token_ids: ignore_eos decides only whether
 * an EOS ends the request), then the stop ids, each once, in that order, without the ids outside
 * [0, vocab) (never sampled: nothing to suppress). Returns their number; n_eos + n_stop must not
 * exceed SAMPLING_SUPPRESS_MAX. */
int32_t stop_ids_suppressed(const int32_t *eos, int32_t n_eos, const int32_t *stop, int32_t n_stop,
                            int64_t vocab, int32_t *out);

/* Whether a sequence whose newest token is tok, its out_len-th output token (counted with it),
 * stops there: never within the first min_tokens tokens of its output (where its stop tokens
 * were suppressed), then at an EOS id unless ignore_eos, or at one of its stop ids. 1 or 0; the
 * length limits are the caller's. */
int stop_token_ends(int32_t tok, int32_t out_len, int32_t min_tokens, int ignore_eos,
                    const int32_t *eos, int32_t n_eos, const int32_t *stop, int32_t n_stop);

/* *out = a copy of the n pairs (no arrays when n is 0). Returns 0 or PAGODA_ENOMEM (then *out
 * is empty). Does not validate. */
int logit_bias_copy(struct logit_bias *out, const int32_t *ids, const float *values, size_t n);

/* Frees the arrays and empties b. Accepts NULL and an empty b. */
void logit_bias_fini(struct logit_bias *b);

/* One addition to a step's logits: logits[row][token] += value (-INFINITY suppresses the
 * token). Within one row, tokens are distinct. */
struct logit_entry {
    int32_t row;
    int32_t token;
    float value;
};

/* *out = the pairs of bias whose id is not among suppress[0..n) (a copy, to be released with
 * logit_bias_fini): the bias of a row whose stop ids are suppressed. 0 or PAGODA_ENOMEM (then *out
 * is empty). */
int logit_bias_without(const struct logit_bias *bias, const int32_t *suppress, int32_t n,
                       struct logit_bias *out);

/* Appends one logits row's entries to out and returns their number: suppress[0..n_suppress) at
 * -INFINITY, then bias's pairs (bias may be NULL), which must name no suppressed id
 * (logit_bias_without). Within the lists' limits that is at most LOGIT_ENTRIES_PER_ROW. */
int32_t logit_entries_build(int32_t row, const struct logit_bias *bias, const int32_t *suppress,
                            int32_t n_suppress, struct logit_entry *out);

/* logits[e.row * vocab + e.token] += e.value for the n entries (host memory). The caller keeps
 * rows and tokens in range (the worker's mirror has checked them). */
void logit_entries_apply(float *logits, int64_t vocab, const struct logit_entry *entries,
                         int32_t n);

#endif
