/* libFuzzer target: the worker's handler of the scheduler's messages, i.e. ToWorker unpacked as
 * pagoda-worker unpacks it and applied to the mirror (worker/mirror.h) as pagoda-worker applies
 * it: a Resync replaces the mirror, a Step is prepared and, when accepted, committed with one
 * sampled token per logits row.
 *
 * The input is a series of messages, each a 2-byte little-endian length and that many bytes,
 * into one mirror of a small geometry (17 blocks of 8 tokens, 4 sequences, 64 tokens per step,
 * a vocabulary of 100). Checked after each accepted step: the forward batch stays inside the
 * limits and the pool (every token id in the vocabulary, every slot in a block of the pool and
 * not block 0, every block table entry in the pool, positions consistent with the context
 * lengths, logits rows inside the batch); and a refused step or resync leaves the mirror as it
 * was (same sequences, same expected step). */
#include "common/error.h"
#include "common/log.h"
#include "worker/mirror.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 100
#define NUM_BLOCKS 17
#define BLOCK_SIZE 8
#define MAX_SEQS 4
#define MAX_BATCHED 64
#define MAX_TOKENS_PER_SEQ 96
#define MAX_MESSAGE 4096

static void die(const char *why)
{
    fprintf(stderr, "fuzz_mirror: %s\n", why);
    abort();
}

static void check_batch(const struct mirror_step *ms, int32_t max_blocks_per_seq)
{
    const struct fwd_batch *b = &ms->batch;
    if (b->num_tokens < 0 || b->num_tokens > MAX_BATCHED || b->num_seqs < 0 ||
        b->num_seqs > MAX_SEQS || b->num_logits < 0 || b->num_logits > b->num_seqs)
        die("batch counts outside the limits");
    if (b->num_tokens == 0)
        return;
    /* The tables are as wide as the batch's widest one, at most the limit. */
    int32_t width = b->max_blocks_per_seq;
    if (width < 1 || width > max_blocks_per_seq)
        die("block table width");
    if (b->query_start[0] != 0 || b->query_start[b->num_seqs] != b->num_tokens)
        die("query_start does not cover the batch");
    for (int32_t s = 0; s < b->num_seqs; s++) {
        int32_t q0 = b->query_start[s], q1 = b->query_start[s + 1];
        if (q1 < q0 || b->context_lens[s] < q1 - q0 || b->context_lens[s] > MAX_TOKENS_PER_SEQ)
            die("a sequence's chunk or context length");
        int32_t used = (b->context_lens[s] + BLOCK_SIZE - 1) / BLOCK_SIZE;
        if (used > width)
            die("context longer than the block table");
        for (int32_t j = 0; j < used; j++) {
            int32_t blk = b->block_tables[(size_t)s * (size_t)width + (size_t)j];
            if (blk < 1 || blk >= NUM_BLOCKS)
                die("a block table entry outside the pool");
        }
        for (int32_t t = q0; t < q1; t++) {
            if (b->token_ids[t] < 0 || b->token_ids[t] >= VOCAB)
                die("a token outside the vocabulary");
            int32_t pos = b->positions[t];
            if (pos != b->context_lens[s] - (q1 - t))
                die("a position inconsistent with the context length");
            int32_t blk = b->block_tables[(size_t)s * (size_t)width + (size_t)(pos / BLOCK_SIZE)];
            if (b->slot_mapping[t] != (int64_t)blk * BLOCK_SIZE + pos % BLOCK_SIZE)
                die("a slot that is not the block table's");
        }
    }
    for (int32_t r = 0; r < b->num_logits; r++)
        if (b->logits_indices[r] < 0 || b->logits_indices[r] >= b->num_tokens)
            die("a logits row outside the batch");
    /* The logit bias entries: in the rows and the vocabulary, each (row, token) once. */
    if (b->num_logit_entries < 0 ||
        b->num_logit_entries > b->num_logits * (int32_t)LOGIT_ENTRIES_PER_ROW)
        die("logit entries outside the limit");
    for (int32_t i = 0; i < b->num_logit_entries; i++) {
        const struct logit_entry *e = &b->logit_entries[i];
        if (e->row < 0 || e->row >= b->num_logits || e->token < 0 || e->token >= VOCAB ||
            e->value != e->value)
            die("a logit entry outside the batch");
        for (int32_t j = 0; j < i; j++)
            if (b->logit_entries[j].row == e->row && b->logit_entries[j].token == e->token)
                die("a logit entry twice");
    }
}

/* What a refusal must leave unchanged. */
struct snapshot {
    int32_t num_seqs;
    uint64_t next_step, epoch;
    int synced;
};

static struct snapshot snap(const struct mirror *m)
{
    return (struct snapshot){mirror_num_seqs(m), mirror_next_step_id(m), mirror_epoch(m),
                             mirror_synced(m)};
}

static void same(const struct snapshot *a, const struct snapshot *b, const char *what)
{
    if (a->num_seqs != b->num_seqs || a->next_step != b->next_step || a->epoch != b->epoch ||
        a->synced != b->synced)
        die(what);
}

/* PAGODA_FUZZ_VERBOSE=1: what happens to every message is printed (to check what a seed does). */
static int verbose;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_OFF);
    verbose = getenv("PAGODA_FUZZ_VERBOSE") != NULL;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const struct mirror_limits ml = {.max_seqs = MAX_SEQS,
                                     .max_tokens_per_seq = MAX_TOKENS_PER_SEQ,
                                     .max_batched_tokens = MAX_BATCHED,
                                     .num_blocks = NUM_BLOCKS,
                                     .block_size = BLOCK_SIZE,
                                     .vocab_size = VOCAB};
    struct mirror *m = NULL;
    if (mirror_new(&ml, &m) != 0)
        die("mirror_new");
    int32_t max_blocks = mirror_limits_max_blocks_per_seq(&ml);
    while (size >= 2) {
        size_t len = (size_t)(data[0] | data[1] << 8) % MAX_MESSAGE;
        data += 2;
        size -= 2;
        if (len > size)
            len = size;
        Pagoda__Internal__ToWorker *msg = pagoda__internal__to_worker__unpack(NULL, len, data);
        data += len;
        size -= len;
        if (msg == NULL) {
            if (verbose)
                fprintf(stderr, "not a ToWorker\n");
            continue;
        }
        struct snapshot before = snap(m);
        if (msg->msg_case == PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC) {
            int rc = mirror_resync(m, msg->resync);
            if (verbose)
                fprintf(stderr, "resync: %d %s\n", rc, rc ? pagoda_error_detail() : "");
            if (rc != 0) {
                struct snapshot after = snap(m);
                same(&before, &after, "a refused resync changed the mirror");
            } else {
                /* Sequences left out for their own content are not held, and the held ones
                 * with them are within max_seqs. */
                const struct mirror_seq_error *failed;
                int32_t n_failed = mirror_resync_failures(m, &failed);
                if (verbose)
                    fprintf(stderr, "resync: %d held, %d left out\n", mirror_num_seqs(m), n_failed);
                if (n_failed < 0 || mirror_num_seqs(m) > MAX_SEQS ||
                    mirror_num_seqs(m) + n_failed > (int32_t)msg->resync->n_seqs)
                    die("a resync's failures out of bounds");
                for (int32_t i = 0; i < n_failed; i++) {
                    struct mirror_seq_view v;
                    if (failed[i].code == 0 || mirror_find(m, failed[i].seq_id, &v) == 0)
                        die("a sequence a resync left out is held, or has no error code");
                }
            }
        } else if (msg->msg_case == PAGODA__INTERNAL__TO_WORKER__MSG_STEP) {
            struct mirror_step ms;
            int rc = mirror_step_prepare(m, msg->step, &ms);
            if (verbose)
                fprintf(stderr, "step: %d %s\n", rc, rc ? pagoda_error_detail() : "");
            if (rc == 0) {
                check_batch(&ms, max_blocks);
                /* A failed sequence is not in the batch; it is gone after the commit, with the
                 * rows that could not be sampled (here those of seq ids that are multiples of
                 * 5, as pagoda-worker fails a row whose logits are not finite). */
                if (ms.num_failed < 0 || ms.num_failed > 2 * MAX_SEQS)
                    die("more failed sequences than a step may hold");
                uint64_t gone[3 * MAX_SEQS];
                int32_t num_gone = 0;
                for (int32_t i = 0; i < ms.num_failed; i++) {
                    if (ms.failed[i].code == 0)
                        die("a failed sequence with no error code");
                    for (int32_t r = 0; r < ms.batch.num_logits; r++)
                        if (ms.seq_ids[r] == ms.failed[i].seq_id)
                            die("a failed sequence in the batch");
                    gone[num_gone++] = ms.failed[i].seq_id;
                }
                int32_t tokens[MAX_SEQS], row_errors[MAX_SEQS];
                for (int32_t r = 0; r < ms.batch.num_logits; r++) {
                    tokens[r] = (int32_t)(ms.seq_ids[r] % VOCAB);
                    row_errors[r] = ms.seq_ids[r] % 5 == 0 ? PAGODA_ERANGE : 0;
                    if (row_errors[r] != 0)
                        gone[num_gone++] = ms.seq_ids[r];
                }
                mirror_step_commit_rows(m, tokens, row_errors);
                if (verbose)
                    fprintf(stderr, "step: %d failed, %d gone in all, %d held\n", ms.num_failed,
                            num_gone, mirror_num_seqs(m));
                if (mirror_num_seqs(m) > MAX_SEQS)
                    die("more sequences than max_seqs after a step");
                for (int32_t i = 0; i < num_gone; i++) {
                    struct mirror_seq_view v;
                    if (mirror_find(m, gone[i], &v) == 0)
                        die("a sequence the step failed is still held");
                }
            } else {
                struct snapshot after = snap(m);
                same(&before, &after, "a refused step changed the mirror");
            }
        }
        pagoda__internal__to_worker__free_unpacked(msg, NULL);
    }
    mirror_free(m);
    return 0;
}
