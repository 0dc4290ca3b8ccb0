/* The CUDA sampler: one token per row of a batch of device logits, by the algorithm of
 * docs/sampling.md, so that it chooses exactly the token kernels/cpu/sampler.c's
 * sampler_sample() chooses for the same logits, parameters, history, seed and output index, in
 * any batch and at any position in it.
 *
 * One thread block per row, except greedy rows without penalties, which need only the argmax
 * and the log-probability's normaliser: those are split over several blocks (chunks of 4096
 * tokens) so that one row fills the GPU and a batch reads its logits at memory bandwidth. The
 * penalties, the argmax, the weights, top-k, top-p, min-p and the inverse-CDF scan run on the
 * device; everything that decides the token is exact integer
 * arithmetic or single IEEE-754 operations (kernels/sampling_math.h, shared with the CPU), so
 * the result does not depend on how the work is split between threads. The log-probability is
 * the one value that may differ from the CPU's in the last bits.
 *
 * A plain C header: the implementation is kernels/cuda/sampler.cu, the host side, with its
 * kernels in sampler_rows.cu and sampler_greedy.cu. It also needs pagoda_kernels_cpu at link time
 * (sampling_params_validate(), so that both samplers refuse the same parameters with the same
 * errors). */
#ifndef PAGODA_KERNELS_CUDA_SAMPLER_H
#define PAGODA_KERNELS_CUDA_SAMPLER_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/cpu/sampler.h"

/* Largest batch a sampler can be created for. */
#define CUDA_SAMPLER_ROWS_MAX 65536

/* The greedy fast path's logits per block (a row of vocab logits takes ceil(vocab / this)
 * blocks): tests place ties and bad values on either side of its boundaries. */
#define CUDA_SAMPLER_GREEDY_CHUNK 4096

/* The device buffers and pinned staging memory of one sampler. Opaque. */
struct cuda_sampler;

/* Creates a sampler for vocabularies of exactly vocab tokens and batches of up to max_rows rows,
 * each with a history (prompt plus output tokens) of at most max_history tokens. Everything is
 * allocated here, on the current CUDA device, and never during sampling: 8 bytes per token per
 * row of device memory (penalised logits and history counts), 24 bytes per row and 4096 tokens
 * and 4 per row of device memory (the greedy path's partial results and counters), about 92 +
 * 4 * max_history bytes per row of device memory and twice that of pinned host memory (two
 * stages used in turn), 4 * max_history bytes per row of device memory for the histories kept on
 * the device (history keys, below), and 24 bytes per row and slot of pinned results
 * (model/model_budget.c model_budget_sampler_bytes counts the device memory). The sampler belongs
 * to the caller until cuda_sampler_free(), and serves one thread at a time.
 *
 * Returns 0, PAGODA_EINVAL for a NULL out, PAGODA_ERANGE when vocab is outside [1,
 * SAMPLER_VOCAB_MAX], max_rows outside [1, CUDA_SAMPLER_ROWS_MAX], max_history outside [0,
 * SAMPLER_HISTORY_MAX] or max_rows * max_history above INT32_MAX, PAGODA_ENOMEM when host memory
 * runs out, or PAGODA_ECUDA (the detail names the call) when a device or pinned allocation
 * fails. *out is NULL on failure. */
int cuda_sampler_new(int32_t vocab, int32_t max_rows, size_t max_history,
                     struct cuda_sampler **out);

/* Frees the sampler's memory. Accepts NULL. Its device must be current, and no sample call may
 * be in flight (none is once cuda_sampler_sample() has returned). */
void cuda_sampler_free(struct cuda_sampler *s);

/* Samples one token for each of rows rows and writes it to tokens[r], and when logprobs is not
 * NULL the natural log-probability of that token under log_softmax of the penalised logits to
 * logprobs[r] (as sampler_sample() does).
 *
 * logits is a device pointer to rows * vocab f32 logits, row r at logits + r * vocab, on the
 * sampler's device; it is only read. Everything else is host memory with one entry per row:
 * params[r], output_index[r], and the history of row r: prompt_tokens[r][0..n_prompt[r]) and
 * output_tokens[r][0..n_output[r]). n_prompt and prompt_tokens may both be NULL when no row has
 * a prompt, and prompt_tokens[r] may be NULL when n_prompt[r] is 0; likewise for the output.
 * History is copied to the device only for rows whose penalties are on. tokens and logprobs are
 * host arrays of rows entries, written when the call returns: the work is queued on stream and
 * the call waits for it (cudaStreamSynchronize), so the caller's arrays are free again on
 * return and nothing is kept.
 *
 * Returns 0, or, with nothing written to tokens or logprobs: PAGODA_EINVAL for a NULL s,
 * logits, params, output_index or tokens, or a NULL history that has tokens; PAGODA_ERANGE
 * when rows is negative or above the sampler's max_rows (0 rows does nothing) or a row's
 * history exceeds max_history; and for the first failing row (the detail names it) the errors
 * of sampler_sample(): those of sampling_params_validate(), PAGODA_EINVAL for a token id
 * outside [0, vocab), a NaN or +inf logit or a row whose logits are all -inf, PAGODA_ERANGE
 * when a penalty makes a finite logit overflow. PAGODA_ECUDA when a CUDA call fails (the detail
 * names it). */
int cuda_sampler_sample(struct cuda_sampler *s, const float *logits, int32_t rows,
                        const struct sampling_params *params, const uint64_t *output_index,
                        const int32_t *const *prompt_tokens, const size_t *n_prompt,
                        const int32_t *const *output_tokens, const size_t *n_output,
                        int32_t *tokens, float *logprobs, cudaStream_t stream);

/* Result buffers of cuda_sampler_enqueue: a call's results stay in its slot until read. */
#define CUDA_SAMPLER_SLOTS 4

/* cuda_sampler_sample without the wait: the same arguments, checks and errors (nothing is queued
 * on an error), but the call returns once the work is queued on stream. The rows' results land
 * in the pinned buffer of slot (in [0, CUDA_SAMPLER_SLOTS)), to be read with cuda_sampler_result
 * once the stream has passed this call's work (an event recorded after it has completed); and
 * when d_tokens is not NULL, each row's token is also written to the device array d_tokens[r]
 * (token 0 for a row that could not be sampled) for later kernels on the stream to read. The
 * histories are copied before this returns. The slot's previous results must have been read;
 * the call before the previous one must have completed (the sampler stages two calls at once). */
int cuda_sampler_enqueue(struct cuda_sampler *s, int slot, const float *logits, int32_t rows,
                         const struct sampling_params *params, const uint64_t *output_index,
                         const int32_t *const *prompt_tokens, const size_t *n_prompt,
                         const int32_t *const *output_tokens, const size_t *n_output,
                         int32_t *d_tokens, cudaStream_t stream);

/* A token of a row's output history that is on the device when the call is queued: output token
 * `index` of row `row` is d_src[src] (cuda_sampler_enqueue_gathered; the host history holds any
 * valid token there, e.g. 0). */
struct cuda_history_gather {
    int32_t row;
    int32_t index;
    int32_t src;
};

/* cuda_sampler_enqueue, with gathers[num_gathers] (at most rows of them) read from the device
 * array d_src on stream after the histories are copied and before the rows are sampled: a
 * penalised row's history may end with the token of a step still on the device. A gather of a
 * row without penalties is ignored (its history is not read), as is one whose token the row's
 * history slot holds. PAGODA_EINVAL for a NULL gathers or d_src with gathers, or a gather
 * outside the rows or its row's output; src is the caller's to keep in range.
 *
 * History keys (history_keys[r], NULL for none, 0 for a row without): a penalised row with a
 * key keeps its history on the device, in a slot of the sampler's (max_rows of them), so that
 * only what the slot lacks is copied: the whole history the first time, nothing after when each
 * call's row has the history of the call before plus the token that call sampled for it (the
 * kernel appends that token to the slot). A key names one sequence's history while the caller
 * uses it: the same prompt, outputs only appended (a shorter history is read as the slot's
 * first tokens; another prompt length drops the slot). Slots not read for two calls are taken
 * over first, then any the call does not use; a key seen twice in one call has its history
 * copied the second time. Calls with keys must be queued on one stream, in order. The other
 * arguments and errors are cuda_sampler_enqueue's; the host checks only the tokens it copies. */
int cuda_sampler_enqueue_gathered(struct cuda_sampler *s, int slot, const float *logits,
                                  int32_t rows, const struct sampling_params *params,
                                  const uint64_t *output_index, const int32_t *const *prompt_tokens,
                                  const size_t *n_prompt, const int32_t *const *output_tokens,
                                  const size_t *n_output, const struct cuda_history_gather *gathers,
                                  int32_t num_gathers, const int32_t *d_src,
                                  const uint64_t *history_keys, int32_t *d_tokens,
                                  cudaStream_t stream);

/* cuda_sampler_sample with history keys (cuda_sampler_enqueue_gathered's). */
int cuda_sampler_sample_keyed(struct cuda_sampler *s, const float *logits, int32_t rows,
                              const struct sampling_params *params, const uint64_t *output_index,
                              const int32_t *const *prompt_tokens, const size_t *n_prompt,
                              const int32_t *const *output_tokens, const size_t *n_output,
                              const uint64_t *history_keys, int32_t *tokens, float *logprobs,
                              cudaStream_t stream);

/* Row r of the call enqueued in slot, once it has completed: 0 with *token and (logprob not
 * NULL) *logprob, or that row's error as cuda_sampler_sample reports it (the detail names the
 * row): PAGODA_EINVAL for a NaN or +inf logit or every logit -inf, PAGODA_ERANGE when a penalty
 * overflows a logit. PAGODA_EINVAL for a slot or row out of range. */
int cuda_sampler_result(const struct cuda_sampler *s, int slot, int32_t r, int32_t *token,
                        float *logprob);

/* On stream: d_dst[d_pairs[2i]] = d_src[d_pairs[2i + 1]] for i < n (device arrays; the indices
 * are the caller's to keep in range). The way a step's input tokens read tokens sampled by an
 * earlier step without a trip through the host. Returns 0 or PAGODA_ECUDA. */
int cuda_gather_tokens(int32_t *d_dst, const int32_t *d_pairs, int32_t n, const int32_t *d_src,
                       cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
