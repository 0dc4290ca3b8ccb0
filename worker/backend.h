/* The forward-pass interface every backend (cpu, cuda) implements.
 *
 * A step's batch is flattened: num_tokens tokens of num_seqs sequences, any mix of prefill
 * chunks (possibly continuing a sequence whose earlier tokens are already in the pool) and
 * decode tokens. The caller (pagoda-run, or the worker's mirror) derives positions and the slot
 * mapping from block tables it owns; the backend writes each token's K/V at its slot, attends
 * through the block tables, and returns the logits of the rows it is asked for. */
#ifndef PAGODA_WORKER_BACKEND_H
#define PAGODA_WORKER_BACKEND_H

#include "kernels/cpu/attention.h"
#include "kernels/cpu/logit_bias.h"
#include "kernels/cpu/sampler.h"
#include "kvpool/geometry.h"
#include "model/model_config.h"

#include <stdint.h>

struct fwd_batch {
    int32_t num_tokens;
    const int32_t *token_ids;    /* [num_tokens], each < vocab_size */
    const int32_t *positions;    /* [num_tokens], absolute positions within the sequence */
    const int64_t *slot_mapping; /* [num_tokens]: block_id * block_size + offset */
    int32_t num_seqs;
    const int32_t *query_start;  /* [num_seqs + 1]: sequence s owns tokens [qs[s], qs[s+1]) */
    const int32_t *context_lens; /* [num_seqs]: tokens in the pool after this step */
    const int32_t *block_tables; /* [num_seqs][max_blocks_per_seq], row-major */
    int32_t max_blocks_per_seq;
    int32_t num_logits;            /* rows of logits wanted */
    const int32_t *logits_indices; /* [num_logits]: token rows (usually each sequence's last) */
    /* Added to the logits rows before they are sampled (backend_forward's logits are without
     * them; backend_check_batch checks them): the rows'
     * logit bias and min_tokens' suppressed stop tokens (kernels/cpu/logit_bias.h; rows below
     * num_logits, tokens below the vocabulary, distinct within a row; at most num_logits *
     * LOGIT_ENTRIES_PER_ROW). NULL when num_logit_entries is 0. */
    const struct logit_entry *logit_entries;
    int32_t num_logit_entries;
};

/* Limits a backend is built for: the largest step it accepts. */
struct backend_limits {
    int32_t max_num_tokens;
    int32_t max_num_seqs;
    int32_t max_blocks_per_seq;
};

struct backend;

/* The model a backend serves: its config (valid while the backend is open). */
const struct model_config *backend_config(const struct backend *b);

/* One forward pass over batch, reading and writing the pool. logits is [num_logits][vocab]
 * f32. Returns 0, PAGODA_EINVAL / PAGODA_ERANGE for a batch that breaks its contract (a token
 * id at or above the vocabulary, a position at or above max positions, a slot or block id
 * outside the pool, a batch above the limits), each with a detail; the pool may then hold
 * partial writes of this step's slots only. */
int backend_forward(struct backend *b, const struct fwd_batch *batch, float *logits);

/* What the sampler needs for one logits row: the parameters, the number of tokens the sequence
 * generated before (which, with the seed, selects the Philox draw), and its history for the
 * penalties (either pointer may be NULL when its count is 0). history_key (0: none) names the
 * sequence's history for as long as the backend is open: one prompt, outputs only appended,
 * never reused for another sequence. A backend may keep a keyed history where it samples (the
 * CUDA backend: on the device, kernels/cuda/sampler.h) and then copies only what it lacks. */
struct sample_row {
    struct sampling_params params;
    uint64_t output_index;
    const int32_t *prompt_tokens;
    size_t n_prompt;
    const int32_t *output_tokens;
    size_t n_output;
    uint64_t history_key;
};

/* One forward pass, then one token per logits row (rows[i] describes logits row i), sampled
 * where the backend computes: tokens[num_logits] and logprobs[num_logits] are host arrays.
 * Every backend draws with the algorithm of docs/sampling.md, so equal logits give equal
 * tokens on any backend. Errors: those of backend_forward and of sampler_sample. */
int backend_forward_sample(struct backend *b, const struct fwd_batch *batch,
                           const struct sample_row *rows, int32_t *tokens, float *logprobs);

/* Why one logits row could not be sampled (backend_forward_sample_rows). */
#define BACKEND_ROW_ERROR_MAX 256
struct backend_row_error {
    int32_t code; /* 0: sampled; else a PAGODA_E* code */
    char message[BACKEND_ROW_ERROR_MAX];
};

/* backend_forward_sample, where an error of one row fails that row only (its logits are NaN or
 * +inf, all -inf, or a penalty overflows them: sampler_sample's row errors). row_errors has
 * num_logits entries: {0, ""} for a row sampled into tokens[r] and logprobs[r], or the row's code
 * and message (tokens[r] is then -1). Returns 0 when the forward pass ran, whatever its rows did,
 * or the error of the forward pass (then nothing is sampled and row_errors is not written).
 *
 * A backend that samples on the device (ops.forward_sample) reports only that a row failed, not
 * which: when its call fails, the step's logits are computed again through ops.forward (the same
 * K/V written at the same slots: steps are idempotent) and each row is sampled on the host by
 * the CPU sampler, which draws what the device would have (docs/sampling.md). A failure costs a
 * second forward pass; a success costs nothing more. */
int backend_forward_sample_rows(struct backend *b, const struct fwd_batch *batch,
                                const struct sample_row *rows, int32_t *tokens, float *logprobs,
                                struct backend_row_error *row_errors);

/* ---- asynchronous steps (a backend whose ops.submit is set) ----------------------------------
 *
 * A step is submitted into one of BACKEND_STEP_SLOTS slots (the worker uses its step id modulo
 * the slots, as the mirror's pending tokens name them): its forward pass and its sampling are
 * queued on the backend's stream and the call returns without waiting. The tokens it samples stay
 * in the slot's device buffer, where a later step's inputs read them (struct backend_gather), and
 * travel to the host asynchronously; backend_complete waits for them (or asks whether they are
 * there). So the caller submits step n + 1 before step n has ended and the device runs them back
 * to back. Steps run in the order they are submitted. A slot holds one step until it is
 * completed; submitting into a slot that holds one is refused. */
#define BACKEND_STEP_SLOTS 4

/* Token `token` of a submitted batch is the token sampled into logits row `row` of the step in
 * slot `slot` (submitted earlier; the batch's token_ids holds any valid id there, e.g. 0). A row
 * that could not be sampled leaves token 0 there: its sequence must fail with it. */
struct backend_gather {
    int32_t token;
    int32_t slot;
    int32_t row;
};

/* Output token `index` of logits row `row`'s history (a penalised row's: struct sample_row's
 * output_tokens, where the caller puts 0 in its place) is the token sampled into logits row
 * `src_row` of the step in slot `slot`: the sampler reads it on the device, so a step whose
 * penalised rows' histories end with the token of the step still running need not wait for it.
 * A source row that could not be sampled leaves token 0 there (its sequence fails with it, as
 * its input does). */
struct backend_history_gather {
    int32_t row;
    int32_t index;
    int32_t slot;
    int32_t src_row;
};

/* Whether b has asynchronous steps (else backend_forward_sample_rows is the way). */
int backend_can_submit(const struct backend *b);

/* Queues one forward pass over batch and one token per logits row into slot (rows as for
 * backend_forward_sample), gathers[num_gathers] first replacing input tokens by tokens sampled in
 * earlier slots, and hgathers[num_hgathers] replacing tokens of the rows' histories likewise. The
 * histories of rows are read before this returns (they hold no pending token: 0 where a history
 * gather writes). Returns 0, or with nothing queued in the slot: PAGODA_EINVAL (a NULL argument,
 * a slot outside [0, BACKEND_STEP_SLOTS) or holding a step, a gather outside the batch, its
 * histories or the slots),
 * the errors of backend_check_batch and the attention plan, the sampler's host checks
 * (parameters, history) or PAGODA_ECUDA. After an error the caller can run the step through
 * backend_forward_sample_rows to learn which row failed (work already queued on the device by
 * the refused call writes the same K/V at the same slots: harmless). */
int backend_submit(struct backend *b, int slot, const struct fwd_batch *batch,
                   const struct sample_row *rows, const struct backend_gather *gathers,
                   int32_t num_gathers, const struct backend_history_gather *hgathers,
                   int32_t num_hgathers);

/* Completes the step in slot: when it has ended (wait != 0 waits for it), writes its num_logits
 * tokens, logprobs and row_errors (as backend_forward_sample_rows: a row whose logits are NaN or
 * +inf, all -inf, or overflow under a penalty fails alone, tokens[r] = -1) and its device time in
 * *device_us, and frees the slot. Returns 0, PAGODA_EBUSY when wait is 0 and the step has not
 * ended (nothing written, the slot still held), PAGODA_EINVAL for a slot that holds no step, or
 * PAGODA_ECUDA when the device failed (the slot is freed; the step is lost). */
int backend_complete(struct backend *b, int slot, int wait, int32_t *tokens, float *logprobs,
                     struct backend_row_error *row_errors, double *device_us);

/* Checks that a pool of geometry g fits the model: the dtype the backend computes in (named
 * backend_name in the message), and the model's layers, KV heads and head dim. Returns 0 or
 * PAGODA_EMISMATCH with a detail naming the field. */
int backend_check_pool(const struct model_config *c, const struct kv_geometry *g, enum dtype dtype,
                       const char *backend_name);

/* Checks what every backend checks before a forward pass and the attention plan does not:
 * the step's size against the limits, token ids against the vocabulary, positions against the
 * model's positions, logits rows inside the step. Returns 0 or PAGODA_ERANGE with a detail. */
int backend_check_batch(const struct model_config *c, const struct backend_limits *limits,
                        const struct fwd_batch *batch);

/* The attention kernels' view of batch (sequences, query starts, contexts, block tables), over
 * its arrays: what every backend plans its attention with. */
struct attention_batch backend_attention_batch(const struct fwd_batch *batch);

/* The device time of the last forward pass (with its sampling) in microseconds, measured on the
 * backend's stream (CUDA events), in *us. Returns 0, or PAGODA_EUNSUPPORTED for a backend that
 * computes on the host (its caller measures the thread's CPU time instead). */
int backend_device_time_us(struct backend *b, double *us);

/* Whether the backend can still run passes after one failed as a whole: 0, or the error that
 * says why it cannot (its message set). The CUDA backend's device context is lost after a fault
 * (an illegal address, a launch failure, an uncorrectable ECC error: such errors are sticky, and
 * every later call of the process fails with them), which only a new process mends: the worker
 * exits so that the supervisor starts a new one (docs/protocol.md, "What a worker answers"). Called
 * on the thread that runs the passes, after a failed one; it may wait for the backend's stream.
 * Backends that compute on the host: always 0. */
int backend_health(struct backend *b);

/* The number of forward passes run since the backend was opened. */
uint64_t backend_forward_count(const struct backend *b);

/* How many of those replayed a captured CUDA graph (worker/cuda_backend.h: decode steps); the
 * others ran launch by launch. 0 for a backend without graphs. */
uint64_t backend_graph_steps(const struct backend *b);

/* How many captures of CUDA graphs failed when the backend opened (worker/cuda_backend.h: the
 * backend then runs every step launch by launch, as with graphs off); 0 for a backend without
 * graphs. */
uint64_t backend_graph_capture_failures(const struct backend *b);

/* Closes a backend; NULL is accepted. */
void backend_close(struct backend *b);

/* Internal: what each backend implements. */
struct backend_ops {
    const char *name;
    int (*forward)(struct backend *b, const struct fwd_batch *batch, float *logits);
    /* NULL: backend_forward_sample runs forward and the CPU sampler on the host logits. */
    int (*forward_sample)(struct backend *b, const struct fwd_batch *batch,
                          const struct sample_row *rows, int32_t *tokens, float *logprobs);
    void (*close)(struct backend *b);
    /* NULL: the backend computes on the host (backend_device_time_us). */
    int (*device_time_us)(struct backend *b, double *us);
    /* Both NULL: no asynchronous steps (backend_can_submit). */
    int (*submit)(struct backend *b, int slot, const struct fwd_batch *batch,
                  const struct sample_row *rows, const struct backend_gather *gathers,
                  int32_t num_gathers, const struct backend_history_gather *hgathers,
                  int32_t num_hgathers);
    int (*complete)(struct backend *b, int slot, int wait, int32_t *tokens, float *logprobs,
                    struct backend_row_error *row_errors, double *device_us);
    /* NULL: always healthy (backend_health). */
    int (*health)(struct backend *b);
};

struct backend {
    const struct backend_ops *ops;
    struct model_config config;
    uint64_t forward_count;
    uint64_t graph_steps;            /* counted by the backend (backend_graph_steps) */
    uint64_t graph_capture_failures; /* counted by the backend (backend_graph_capture_failures) */
    /* Host sampling (forward_sample == NULL): grown on first use, freed by backend_close. */
    float *host_logits;
    int32_t host_logits_rows;
    struct sampler_workspace workspace;
};

/* The values of the --cuda-tma flag of pagoda-worker, pagoda-run and pagoda-logits (CUDA
 * backend; worker/worker_args.h worker_parse_cuda_tma reads it): "off" (a layer's linears of 2
 * to 16 rows through the GEMVs and cuBLAS), "on" (the default: through kernels/cuda/linear_tma)
 * or "stream-k" (on, with linear_tma's stream-K where it balances: worker/cuda_backend.h
 * cuda_backend_set_tma). */
#define BACKEND_CUDA_TMA_OFF 0
#define BACKEND_CUDA_TMA_ON 1
#define BACKEND_CUDA_TMA_STREAM_K 2

#endif
