/* The CPU sampler: turns one row of logits into one token id and its log-probability.
 *
 * Penalties (repetition, presence, frequency), then greedy argmax when the temperature is 0,
 * else temperature, top-k, top-p and min-p and one Philox draw keyed by (seed, output index).
 * The algorithm is fixed and written down in docs/sampling.md precisely enough that a CUDA
 * sampler reproduces it token for token: all sums are exact integer sums, every float operation
 * is one IEEE-754 operation in a stated order, and ties are broken by token id. The token drawn
 * depends only on (logits, params, seed, output index, token history), never on the batch or on
 * earlier calls, so a replayed step draws the same token.
 *
 * Stop token ids are not a sampler parameter: like max_tokens and ignore_eos they are request
 * conditions that the scheduler checks on the token this returns (proto: SubmitRequest). */
#ifndef PAGODA_KERNELS_CPU_SAMPLER_H
#define PAGODA_KERNELS_CPU_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

/* Largest vocabulary: keeps the sum of all token weights (each at most 2^40) below 2^62. */
#define SAMPLER_VOCAB_MAX (1 << 22)
/* Largest prompt + output history: keeps token counts exact in f32. */
#define SAMPLER_HISTORY_MAX (1 << 24)
/* The valid ranges of the parameters (docs/sampling.md, "Valid ranges"): vLLM's, with bounds
 * added where vLLM has none so that no step of the algorithm can overflow for any logit of a
 * sane model (|logit| below about 3e36). sampling_params_validate() is the one definition: the
 * router, the scheduler, the worker's mirror and pagoda-run all call it.
 *
 * Presence and frequency penalties lie in [-2, 2], as in OpenAI's API and vLLM. */
#define SAMPLING_PENALTY_LIMIT 2.0f
/* repetition_penalty lies in [1/100, 100]: a logit divided or multiplied by it stays finite up
 * to |logit| = FLT_MAX / 100. vLLM accepts any value > 0, but 1e-45 turns every logit of the
 * history into an infinity. */
#define SAMPLING_REPETITION_PENALTY_MIN 0.01f
#define SAMPLING_REPETITION_PENALTY_MAX 100.0f
/* temperature is 0 (greedy) or lies in [1e-6, 100]: HF users pass 1e-5 for "almost greedy";
 * above 100 every kept token weighs nearly the same. */
#define SAMPLING_TEMPERATURE_MIN 1e-6f
#define SAMPLING_TEMPERATURE_MAX 100.0f

/* How to choose a token. The fields mirror proto SamplingParams; an "off" value makes its step
 * the identity. */
struct sampling_params {
    float temperature;        /* 0: greedy; otherwise in [1e-6, 100] */
    int32_t top_k;            /* 0: off; otherwise keep the k most likely tokens */
    float top_p;              /* 1: off; in (0, 1] */
    float min_p;              /* 0: off; in [0, 1], relative to the most likely token */
    float repetition_penalty; /* 1: off; in [0.01, 100] */
    float presence_penalty;   /* 0: off; in [-2, 2] */
    float frequency_penalty;  /* 0: off; in [-2, 2] */
    uint64_t seed;            /* keys the Philox stream; equal seeds give equal draws */
    /* >= 0: no stop token before this many output tokens (vLLM's min_tokens). Not a step of the
     * sampler: the worker suppresses the stop tokens' logits (kernels/cpu/logit_bias.h), and the
     * scheduler and router end no request by a stop before it. */
    int32_t min_tokens;
};

/* Parameters with every step off and temperature 1 (plain sampling from the softmax), seed 0. */
struct sampling_params sampling_params_default(void);

/* Checks every field's range (the constants above). Returns 0, PAGODA_EINVAL for a NaN or a NULL
 * p, or PAGODA_ERANGE for a value outside its range (a temperature that is neither 0 nor in
 * [SAMPLING_TEMPERATURE_MIN, SAMPLING_TEMPERATURE_MAX], negative top_k, top_p outside (0, 1],
 * min_p outside [0, 1], a negative min_tokens, repetition_penalty outside
 * [SAMPLING_REPETITION_PENALTY_MIN, SAMPLING_REPETITION_PENALTY_MAX], a presence or frequency
 * penalty outside [-2, 2]); the detail names the field, its value and its range. */
int sampling_params_validate(const struct sampling_params *p);

/* 1 when step 1 (the penalties) reads the history: a repetition penalty other than 1 or a
 * presence or frequency penalty other than 0; with every penalty off the step is the identity,
 * and no sampler needs the history. */
int sampling_params_penalised(const struct sampling_params *p);

/* Scratch memory for sampler_sample(), sized once for a vocabulary so that sampling does not
 * allocate. One workspace serves one thread; rows of a batch may share it one after the other.
 * After a successful sampler_sample() a caller may read, for the row just sampled: logits (the
 * penalised logits) and, when the temperature was not 0, weights (the kept tokens' integer
 * weights, 0 for every token that could not be drawn). The other arrays are private and are
 * all-zero between calls. */
struct sampler_workspace {
    int32_t vocab;          /* capacity in tokens */
    float *logits;          /* [vocab] penalised logits */
    uint64_t *weights;      /* [vocab] kept weights */
    int32_t *order;         /* [vocab] candidate token ids */
    int32_t *output_counts; /* [vocab] occurrences in the output, zero between calls */
    uint8_t *in_prompt;     /* [vocab] 1 when in the prompt, zero between calls */
};

/* Allocates a workspace for vocabularies of up to vocab tokens (about 21 bytes a token). The
 * struct's storage is the caller's; release the buffers with sampler_workspace_fini(). Returns
 * 0, PAGODA_EINVAL for a NULL ws, PAGODA_ERANGE when vocab is outside [1, SAMPLER_VOCAB_MAX],
 * or PAGODA_ENOMEM (ws is then left empty, and fini on it is harmless). */
int sampler_workspace_init(struct sampler_workspace *ws, int32_t vocab);

/* Frees the workspace's buffers and empties it. Accepts NULL and an emptied workspace. */
void sampler_workspace_fini(struct sampler_workspace *ws);

/* Samples one token from logits[0..vocab) and stores it in *token, and when logprob is not NULL
 * the natural log-probability of that token under log_softmax of the penalised logits (before
 * temperature and truncation, as vLLM reports by default) in *logprob.
 *
 * prompt_tokens and output_tokens are the sequence's history (either may be NULL when its count
 * is 0): repetition_penalty applies to tokens in either, presence and frequency penalties to
 * tokens in the output, frequency once per occurrence. output_index is the number of tokens
 * the sequence generated before this one (normally n_output); with the seed it selects the
 * Philox draw. The caller's arrays are only read and not kept; ws is overwritten.
 *
 * Returns 0, or, with nothing stored in *token: the codes of sampling_params_validate();
 * PAGODA_EINVAL for a NULL argument, a token id outside [0, vocab), a NaN or +inf logit, or a
 * row whose logits are all -inf; PAGODA_ERANGE when vocab is outside [1, ws->vocab], the
 * history exceeds SAMPLER_HISTORY_MAX tokens, or a penalty makes a finite logit overflow. */
int sampler_sample(const struct sampling_params *p, const float *logits, int32_t vocab,
                   const int32_t *prompt_tokens, size_t n_prompt, const int32_t *output_tokens,
                   size_t n_output, uint64_t output_index, struct sampler_workspace *ws,
                   int32_t *token, float *logprob);

#endif
