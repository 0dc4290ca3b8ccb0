/* The worker's mirror of the sequences it runs (docs/protocol.md, "Steps").
 *
 * The scheduler holds the truth about every sequence; the mirror is the worker's derived copy:
 * per sequence its token ids (prompt, then the output sampled so far), how many of them have
 * their K/V in the pool (num_computed_tokens), its block table and its sampling parameters. A
 * Resync replaces the whole mirror with the scheduler's snapshot; each Step then changes it in
 * the order the protocol defines: finished and preempted sequences are dropped, new ones are
 * added, continuing ones get their appended blocks, and after the forward pass every sequence in
 * the step has its chunk computed and, when it sampled, its new token appended.
 *
 * A step is applied in two halves so that a refused step, or one whose forward pass fails,
 * leaves the mirror exactly as it was: mirror_step_prepare checks the whole step against the
 * mirror and the limits and builds the forward batch without changing any sequence;
 * mirror_step_commit then applies it (and cannot fail), or mirror_step_abort forgets it.
 *
 * Positions are absolute: a continuing sequence's num_computed_tokens must equal the mirror's,
 * so a lost or repeated step is detected instead of absorbed. Decode inputs are the mirror's own
 * tokens, i.e. the tokens this worker sampled.
 *
 * Steps in flight (worker/executor.h): a step may be committed before its forward pass has run,
 * with mirror_step_commit_pending. Its sampled tokens are then not known yet: each sampling
 * sequence gets a pending token (MIRROR_PENDING_TOKEN, a negative value naming the step's slot
 * and logits row), so the next step is prepared from what this one will have written. Pending
 * tokens appear in a later step's batch.token_ids and in its rows' histories; whoever runs that
 * step replaces them with the tokens sampled by then (mirror_pending_slot, mirror_pending_row).
 * mirror_step_resolve later writes the tokens into the mirror, in step order. A sequence whose
 * row could not be sampled is dropped then, one a step failed for its own content at that step's
 * commit; either is remembered for MIRROR_MAX_STEPS_IN_FLIGHT steps: a later step the scheduler
 * formed before it knew (it decodes every sequence one step ahead, from its first sample on)
 * fails that sequence alone (with the first error, "failed in step N: ...") instead of being
 * refused for naming a sequence the mirror no longer holds. A sequence it never held, or
 * dropped longer ago, still refuses the step (PAGODA_ENOENT).
 *
 * Pure: no I/O, no threads; one mirror is used by one thread. */
#ifndef PAGODA_WORKER_MIRROR_H
#define PAGODA_WORKER_MIRROR_H

#include "kernels/cpu/sampler.h"
#include "proto/internal.pb-c.h"
#include "worker/backend.h"

#include <stdint.h>

/* What mirror_step_prepare returns for a step of another epoch than the mirror's (or any step
 * before the first resync): not a failure of this worker but a stale message, which the caller
 * ignores (no answer) and counts. No other function returns it. */
#define MIRROR_EOTHER_EPOCH PAGODA_ECLOSED

/* Steps committed and not yet resolved, at most (mirror_step_commit_pending). A step appends
 * at most one token to a sequence and steps resolve in order, so a sequence's pending tokens are
 * among its last MIRROR_MAX_STEPS_IN_FLIGHT: the executor copies and scans only a history's last
 * 2 x MIRROR_MAX_STEPS_IN_FLIGHT outputs again from step to step (worker/executor.c
 * HISTORY_TAIL, worker/history_cache.h). A step that appended more would break that. */
#define MIRROR_MAX_STEPS_IN_FLIGHT 4

/* A pending token: logits row `row` of the step in flight in slot `slot` (its step_id modulo
 * MIRROR_MAX_STEPS_IN_FLIGHT). Negative, so never a token id; rows stay below
 * MIRROR_PENDING_ROWS (mirror_new bounds max_seqs by it). */
#define MIRROR_PENDING_ROWS (1 << 20)
#define MIRROR_PENDING_TOKEN(slot, row) ((int32_t)(-1 - ((slot)*MIRROR_PENDING_ROWS + (row))))

static inline int mirror_token_pending(int32_t token)
{
    return token < 0;
}

static inline int32_t mirror_pending_slot(int32_t token)
{
    return (-1 - token) / MIRROR_PENDING_ROWS;
}

static inline int32_t mirror_pending_row(int32_t token)
{
    return (-1 - token) % MIRROR_PENDING_ROWS;
}

/* finished_seq_ids plus preempted_seq_ids of one step: at most this many times max_seqs. */
#define MIRROR_MAX_DROPS_PER_SEQ 4

struct mirror_limits {
    int32_t max_seqs;           /* sequences held at once, and per step */
    int32_t max_tokens_per_seq; /* known tokens of one sequence (prompt + output) */
    int32_t max_batched_tokens; /* tokens computed in one step */
    int32_t num_blocks;         /* the pool's blocks, reserved block 0 included */
    int32_t block_size;         /* tokens per block */
    int64_t vocab_size;         /* token ids lie in [0, vocab_size) */
};

/* A read-only view of one sequence, for the caller's logs and for tests. Pointers are the
 * mirror's, valid until the next call that changes the mirror. */
struct mirror_seq_view {
    uint64_t seq_id;
    const int32_t *token_ids;
    int32_t num_tokens; /* prompt + output */
    int32_t num_prompt_tokens;
    int32_t num_computed_tokens;
    const int32_t *block_table;
    int32_t num_blocks;
    struct sampling_params sampling;
};

/* The longest message of a per-sequence error. */
#define MIRROR_ERROR_MESSAGE_MAX 256

/* A sequence the prepared step fails because of its own content (a token id outside the
 * vocabulary, a length beyond the limit, invalid sampling parameters, a chunk or block table
 * that does not fit): the rest of the step runs without it, and commit drops it. */
struct mirror_seq_error {
    uint64_t seq_id;
    int32_t code; /* a PAGODA_E* code */
    char message[MIRROR_ERROR_MESSAGE_MAX];
};

/* A prepared step: what the forward pass needs. batch's arrays, rows and seq_ids are the
 * mirror's, valid until mirror_step_commit, mirror_step_abort or the next prepare (after
 * mirror_step_commit_pending: until the next prepare or resolve). With steps in flight,
 * batch.token_ids and the rows' histories may hold pending tokens.
 *
 * Order: the continuing sequences with tokens to compute, in the step's order, then the new ones,
 * in the step's order. Logits row r (batch.logits_indices[r], the last token of its chunk)
 * belongs to sequence seq_ids[r] and is sampled as rows[r] says. A step that computes nothing
 * (only drops, or chunks of 0 tokens) has batch.num_tokens == 0: the caller skips the forward
 * pass and commits. */
struct mirror_step {
    struct fwd_batch batch;
    const struct sample_row *rows;         /* [batch.num_logits] */
    const uint64_t *seq_ids;               /* [batch.num_logits] */
    const struct mirror_seq_error *failed; /* [num_failed]: not in the batch */
    int32_t num_failed;
};

struct mirror;

/* Derived limit: blocks one sequence's table may hold, min(ceil(max_tokens_per_seq /
 * block_size), num_blocks - 1). A backend serving the mirror's batches must accept block tables
 * this wide. */
int32_t mirror_limits_max_blocks_per_seq(const struct mirror_limits *limits);

/* Creates an empty mirror, not yet synced (every step is of "another epoch" until the first
 * mirror_resync). All batch buffers that depend only on the limits are allocated here. On
 * success *out is released with mirror_free. Errors: PAGODA_EINVAL (NULL argument), PAGODA_ERANGE
 * (a limit that is not positive, a block size outside 8..64, fewer than 2 blocks, a vocabulary
 * above SAMPLER_VOCAB_MAX), PAGODA_ENOMEM. */
int mirror_new(const struct mirror_limits *limits, struct mirror **out);

/* Frees the mirror and any prepared step. Accepts NULL. */
void mirror_free(struct mirror *m);

/* Replaces the mirror with the snapshot r, adopts r->epoch and expects r->next_step_id next.
 * Forgets a prepared step. The snapshot is checked completely first; when it is refused the
 * mirror is left as it was (epoch and expected step included). A sequence whose own content is
 * wrong (the PAGODA_ERANGE cases below) does not refuse the resync: it is left out of the mirror
 * and listed by mirror_resync_failures. An absent SamplingParams field
 * takes its "off" value (temperature: 0, greedy; top_p: 1; repetition_penalty: 1; the others 0),
 * an absent SamplingParams message is greedy. r is only read.
 *
 * Errors, with a detail naming the sequence: PAGODA_EINVAL (NULL argument, a missing epoch,
 * next_step_id, seq_id or num_prompt_tokens (an absent num_computed_tokens is 0), a sequence
 * listed twice), PAGODA_ERANGE (more than
 * max_seqs sequences, more than max_tokens_per_seq tokens or max_blocks_per_seq blocks, a token id
 * outside the vocabulary, a block id outside 1..num_blocks-1, num_prompt_tokens outside
 * 1..tokens, num_computed_tokens outside 0..tokens, a block table shorter than the computed
 * tokens, sampling parameters out of range), PAGODA_ENOMEM. */
int mirror_resync(struct mirror *m, const Pagoda__Internal__Resync *r);

/* Checks step s against the mirror and builds its forward batch into *out, changing no
 * sequence (a previously prepared, uncommitted step is forgotten first). s is only read and may
 * be freed once this returns.
 *
 * An error that belongs to one sequence does not refuse the step: the sequence is left out of
 * the batch and listed in out->failed with its code and message (the codes and limits of
 * PAGODA_ERANGE below: its token ids, its length, its block table, its chunk, its sampling
 * parameters), and commit drops it. What says that the step and the mirror disagree (a
 * sequence unknown, already held or with other computed tokens, a wrong step id, a sequence
 * listed twice) or breaks a limit of the whole step refuses it, as below.
 *
 * Returns 0, or:
 *  - MIRROR_EOTHER_EPOCH: s belongs to another epoch, or the mirror was never synced;
 *  - PAGODA_EPROTO: s->step_id is not the one expected (the detail says both);
 *  - PAGODA_EMISMATCH: a continuing sequence's num_computed_tokens differs from the mirror's
 *    (the detail names the sequence and both counts);
 *  - PAGODA_ENOENT: a continuing sequence the mirror does not hold (or that the step drops);
 *  - PAGODA_EEXIST: a new sequence the mirror already holds (and the step does not drop), or one
 *    listed twice;
 *  - PAGODA_EINVAL: a missing epoch or step_id; a new sequence without seq_id,
 *    num_prompt_tokens or num_new_tokens (an absent num_computed_tokens is 0); a continuing one
 *    without seq_id, num_computed_tokens or num_new_tokens; a sequence continued twice;
 *  - PAGODA_EBUSY: MIRROR_MAX_STEPS_IN_FLIGHT steps are in flight already;
 *  - PAGODA_EPROTO too after mirror_step_break, until the next resync;
 *  - PAGODA_ERANGE: the step breaks a limit: more sequences than max_seqs held after it or in it,
 *    more drops than MIRROR_MAX_DROPS_PER_SEQ * max_seqs, more tokens than max_batched_tokens, a
 *    token id outside the vocabulary, a block id outside 1..num_blocks-1, a chunk reaching past
 *    the sequence's known tokens, a block table too short for the chunk or too long, a sequence
 *    that would exceed max_tokens_per_seq by sampling, invalid sampling parameters;
 *  - PAGODA_ENOMEM.
 * On any error nothing is prepared and the mirror is unchanged. */
int mirror_step_prepare(struct mirror *m, const Pagoda__Internal__Step *s, struct mirror_step *out);

/* Applies the prepared step: drops its finished and preempted sequences, adds its new ones,
 * appends blocks, adds each chunk to num_computed_tokens, appends tokens[r] to the sequence of
 * logits row r (tokens has the prepared batch.num_logits entries; NULL when there are none),
 * drops the sequences the step failed, and expects the next step id. Does nothing when no step
 * is prepared. */
void mirror_step_commit(struct mirror *m, const int32_t *tokens);

/* mirror_step_commit, where row_errors (NULL: none; else batch.num_logits entries) says which
 * rows could not be sampled: a row whose entry is not 0 appends no token and its sequence is
 * dropped with the ones the step failed. */
void mirror_step_commit_rows(struct mirror *m, const int32_t *tokens, const int32_t *row_errors);

/* Applies the prepared step before its forward pass has run (see "Steps in flight" above): as
 * mirror_step_commit, but each sampling sequence gets a pending token for its row, and the step
 * stays in flight until mirror_step_resolve. Does nothing when no step is prepared. */
void mirror_step_commit_pending(struct mirror *m);

/* Writes the tokens of step_id, committed pending, into the mirror: tokens[r] replaces the
 * pending token of row r (sequences dropped since are skipped). row_errors (NULL: none; else one
 * per row) says which rows could not be sampled: their sequences are dropped and remembered (see
 * above). Steps are resolved in the order they were committed; a step_id that is not the oldest
 * in flight (one a resync forgot) is ignored. */
void mirror_step_resolve(struct mirror *m, uint64_t step_id, const int32_t *tokens,
                         const struct backend_row_error *row_errors);

/* The forward pass of step_id, committed pending, failed as a whole: the mirror holds what it
 * did not write. Every later step is refused (PAGODA_EPROTO, naming step_id) until the next
 * resync, which the scheduler sends after any error result. */
void mirror_step_break(struct mirror *m, uint64_t step_id);

/* Steps committed pending and not yet resolved. */
int32_t mirror_steps_in_flight(const struct mirror *m);

/* Forgets the prepared step; the mirror stays as it was before mirror_step_prepare. Does nothing
 * when no step is prepared. */
void mirror_step_abort(struct mirror *m);

/* The sequences the last successful mirror_resync left out (their own content was wrong), in
 * *out; returns how many. Valid until the next call that changes the mirror. */
int32_t mirror_resync_failures(const struct mirror *m, const struct mirror_seq_error **out);

/* Whether a resync has been applied. */
int mirror_synced(const struct mirror *m);

/* The epoch adopted at the last resync (0 before the first). */
uint64_t mirror_epoch(const struct mirror *m);

/* The step id the mirror expects next. */
uint64_t mirror_next_step_id(const struct mirror *m);

/* The number of sequences held. */
int32_t mirror_num_seqs(const struct mirror *m);

/* Fills *out with the sequence seq_id. Returns 0 or PAGODA_ENOENT. */
int mirror_find(const struct mirror *m, uint64_t seq_id, struct mirror_seq_view *out);

#endif
