/* Tests of worker/mirror.c: resyncs and steps against the worker's mirror, and the forward
 * batches they build (positions, slots through shuffled block tables, logits rows, sample
 * rows). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "worker/mirror.h"

#include <math.h>
#include <string.h>

#define BS 8 /* block size */

static struct mirror_limits test_limits(void)
{
    return (struct mirror_limits){
        .max_seqs = 8,
        .max_tokens_per_seq = 64,
        .max_batched_tokens = 32,
        .num_blocks = 16,
        .block_size = BS,
        .vocab_size = 100,
    };
}

static struct mirror *new_mirror(void)
{
    struct mirror_limits l = test_limits();
    struct mirror *m = NULL;
    assert_int_equal(mirror_new(&l, &m), 0);
    return m;
}

static Pagoda__Internal__SequenceSnapshot snap(uint64_t id, int32_t *tokens, size_t n,
                                               int32_t prompt, int32_t computed, int32_t *blocks,
                                               size_t nb)
{
    Pagoda__Internal__SequenceSnapshot s = PAGODA__INTERNAL__SEQUENCE_SNAPSHOT__INIT;
    s.has_seq_id = 1;
    s.seq_id = id;
    s.n_token_ids = n;
    s.token_ids = tokens;
    s.has_num_prompt_tokens = 1;
    s.num_prompt_tokens = prompt;
    s.has_num_computed_tokens = 1;
    s.num_computed_tokens = computed;
    s.n_block_ids = nb;
    s.block_ids = blocks;
    return s;
}

static Pagoda__Internal__NewSequence new_seq(uint64_t id, int32_t *tokens, size_t n, int32_t prompt,
                                             int32_t computed, int32_t new_tokens, int32_t *blocks,
                                             size_t nb)
{
    Pagoda__Internal__NewSequence s = PAGODA__INTERNAL__NEW_SEQUENCE__INIT;
    s.has_seq_id = 1;
    s.seq_id = id;
    s.n_token_ids = n;
    s.token_ids = tokens;
    s.has_num_prompt_tokens = 1;
    s.num_prompt_tokens = prompt;
    s.has_num_computed_tokens = 1;
    s.num_computed_tokens = computed;
    s.has_num_new_tokens = 1;
    s.num_new_tokens = new_tokens;
    s.n_block_ids = nb;
    s.block_ids = blocks;
    return s;
}

static Pagoda__Internal__ContinuingSequence
cont_seq(uint64_t id, int32_t computed, int32_t new_tokens, int32_t *appended, size_t na)
{
    Pagoda__Internal__ContinuingSequence c = PAGODA__INTERNAL__CONTINUING_SEQUENCE__INIT;
    c.has_seq_id = 1;
    c.seq_id = id;
    c.has_num_computed_tokens = 1;
    c.num_computed_tokens = computed;
    c.has_num_new_tokens = 1;
    c.num_new_tokens = new_tokens;
    c.n_appended_block_ids = na;
    c.appended_block_ids = appended;
    return c;
}

static Pagoda__Internal__Step step_msg(uint64_t epoch, uint64_t id)
{
    Pagoda__Internal__Step s = PAGODA__INTERNAL__STEP__INIT;
    s.has_epoch = 1;
    s.epoch = epoch;
    s.has_step_id = 1;
    s.step_id = id;
    return s;
}

static void resync(struct mirror *m, uint64_t epoch, uint64_t next,
                   Pagoda__Internal__SequenceSnapshot **seqs, size_t n)
{
    Pagoda__Internal__Resync r = PAGODA__INTERNAL__RESYNC__INIT;
    r.has_epoch = 1;
    r.epoch = epoch;
    r.has_next_step_id = 1;
    r.next_step_id = next;
    r.n_seqs = n;
    r.seqs = seqs;
    assert_int_equal(mirror_resync(m, &r), 0);
}

static void assert_i32s(const int32_t *have, const int32_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (have[i] != want[i])
            fail_msg("entry %zu: %d, expected %d", i, have[i], want[i]);
    }
}

static void assert_i64s(const int64_t *have, const int64_t *want, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (have[i] != want[i])
            fail_msg("entry %zu: %lld, expected %lld", i, (long long)have[i], (long long)want[i]);
    }
}

static struct mirror_seq_view view(const struct mirror *m, uint64_t id)
{
    struct mirror_seq_view v;
    assert_int_equal(mirror_find(m, id, &v), 0);
    return v;
}

/* Step s is not refused, but fails sequence id alone with code, the message containing what;
 * the step is then forgotten (the mirror unchanged). */
static void expect_seq_fails(struct mirror *m, const Pagoda__Internal__Step *s, uint64_t id,
                             int code, const char *what)
{
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, s, &ms), 0);
    assert_int_equal(ms.num_failed, 1);
    assert_int_equal(ms.failed[0].seq_id, id);
    assert_int_equal(ms.failed[0].code, code);
    if (what != NULL && strstr(ms.failed[0].message, what) == NULL)
        fail_msg("failure of sequence %llu: '%s' does not say '%s'", (unsigned long long)id,
                 ms.failed[0].message, what);
    for (int32_t r = 0; r < ms.batch.num_logits; r++)
        assert_true(ms.seq_ids[r] != id);
    mirror_step_abort(m);
}

/* A: 16 prompt tokens, 14 computed, blocks 7, 3. B arrives new in the first step. */
static void test_resync_then_steps_build_the_batch(void **state)
{
    struct mirror *m = new_mirror();
    int32_t a_tokens[16], b_tokens[9];
    for (int i = 0; i < 16; i++)
        a_tokens[i] = 10 + i;
    for (int i = 0; i < 9; i++)
        b_tokens[i] = 20 + i;
    int32_t a_blocks[] = {7, 3}, b_blocks[] = {12, 5};
    Pagoda__Internal__SequenceSnapshot sa = snap(1, a_tokens, 16, 16, 14, a_blocks, 2);
    Pagoda__Internal__SequenceSnapshot *snaps[] = {&sa};
    resync(m, 5, 10, snaps, 1);
    assert_true(mirror_synced(m));
    assert_int_equal(mirror_epoch(m), 5);
    assert_int_equal(mirror_next_step_id(m), 10);

    /* Step 10: A computes its last two prompt tokens (and samples); B its first chunk of 5. */
    Pagoda__Internal__Step s = step_msg(5, 10);
    Pagoda__Internal__ContinuingSequence ca = cont_seq(1, 14, 2, NULL, 0);
    Pagoda__Internal__ContinuingSequence *conts[] = {&ca};
    Pagoda__Internal__NewSequence nb = new_seq(2, b_tokens, 9, 9, 0, 5, b_blocks, 2);
    Pagoda__Internal__NewSequence *news[] = {&nb};
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    s.n_new_seqs = 1;
    s.new_seqs = news;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    const struct fwd_batch *b = &ms.batch;
    assert_int_equal(b->num_tokens, 7);
    assert_i32s(b->token_ids, (int32_t[]){24, 25, 20, 21, 22, 23, 24}, 7);
    assert_i32s(b->positions, (int32_t[]){14, 15, 0, 1, 2, 3, 4}, 7);
    assert_i64s(b->slot_mapping, (int64_t[]){3 * BS + 6, 3 * BS + 7, 96, 97, 98, 99, 100}, 7);
    assert_int_equal(b->num_seqs, 2);
    assert_i32s(b->query_start, (int32_t[]){0, 2, 7}, 3);
    assert_i32s(b->context_lens, (int32_t[]){16, 5}, 2);
    assert_int_equal(b->max_blocks_per_seq, 2);
    assert_i32s(b->block_tables, (int32_t[]){7, 3, 12, 5}, 4);
    /* Only A's chunk reaches the end of its tokens. */
    assert_int_equal(b->num_logits, 1);
    assert_int_equal(b->logits_indices[0], 1);
    assert_int_equal(ms.seq_ids[0], 1);
    assert_int_equal(ms.rows[0].output_index, 0);
    assert_int_equal(ms.rows[0].n_prompt, 16);
    assert_int_equal(ms.rows[0].n_output, 0);
    assert_int_equal(ms.rows[0].prompt_tokens[15], 25);
    const uint64_t key_a = ms.rows[0].history_key;
    assert_true(key_a != 0);
    /* No sampling message: the one default (wire/sampling_wire.h), temperature 1 as the router's
     * and the scheduler's. */
    assert_true(ms.rows[0].params.temperature == 1.0f);
    int32_t t1[] = {42};
    mirror_step_commit(m, t1);
    struct mirror_seq_view va = view(m, 1), vb = view(m, 2);
    assert_int_equal(va.num_tokens, 17);
    assert_int_equal(va.token_ids[16], 42);
    assert_int_equal(va.num_computed_tokens, 16);
    assert_int_equal(vb.num_tokens, 9);
    assert_int_equal(vb.num_computed_tokens, 5);
    assert_int_equal(mirror_next_step_id(m), 11);

    /* Step 11: A decodes its own token at position 16 in the appended block 11; B finishes its
     * prompt across its block boundary and samples. */
    s = step_msg(5, 11);
    int32_t appended[] = {11};
    ca = cont_seq(1, 16, 1, appended, 1);
    Pagoda__Internal__ContinuingSequence cb = cont_seq(2, 5, 4, NULL, 0);
    Pagoda__Internal__ContinuingSequence *conts2[] = {&ca, &cb};
    s.n_cont_seqs = 2;
    s.cont_seqs = conts2;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(b->num_tokens, 5);
    assert_i32s(b->token_ids, (int32_t[]){42, 25, 26, 27, 28}, 5);
    assert_i32s(b->positions, (int32_t[]){16, 5, 6, 7, 8}, 5);
    assert_i64s(b->slot_mapping,
                (int64_t[]){11 * BS, 12 * BS + 5, 12 * BS + 6, 12 * BS + 7, 5 * BS}, 5);
    assert_i32s(b->query_start, (int32_t[]){0, 1, 5}, 3);
    assert_i32s(b->context_lens, (int32_t[]){17, 9}, 2);
    assert_int_equal(b->max_blocks_per_seq, 3);
    assert_i32s(b->block_tables, (int32_t[]){7, 3, 11, 12, 5, 0}, 6);
    assert_int_equal(b->num_logits, 2);
    assert_i32s(b->logits_indices, (int32_t[]){0, 4}, 2);
    assert_int_equal(ms.seq_ids[0], 1);
    assert_int_equal(ms.seq_ids[1], 2);
    assert_int_equal(ms.rows[0].output_index, 1);
    assert_int_equal(ms.rows[0].n_output, 1);
    assert_int_equal(ms.rows[0].output_tokens[0], 42);
    assert_int_equal(ms.rows[1].output_index, 0);
    assert_int_equal(ms.rows[1].n_prompt, 9);
    /* Each sequence's history keeps its key from step to step; the keys differ. */
    assert_true(ms.rows[0].history_key == key_a);
    assert_true(ms.rows[1].history_key != 0 && ms.rows[1].history_key != key_a);
    int32_t t2[] = {43, 44};
    mirror_step_commit(m, t2);
    va = view(m, 1);
    vb = view(m, 2);
    assert_int_equal(va.num_tokens, 18);
    assert_int_equal(va.token_ids[17], 43);
    assert_int_equal(va.num_blocks, 3);
    assert_int_equal(va.block_table[2], 11);
    assert_int_equal(vb.num_tokens, 10);
    assert_int_equal(vb.token_ids[9], 44);
    assert_int_equal(vb.num_computed_tokens, 9);
    assert_int_equal(mirror_next_step_id(m), 12);
    mirror_free(m);
}

static void test_other_epochs_and_step_ids_are_refused(void **state)
{
    struct mirror *m = new_mirror();
    Pagoda__Internal__Step s = step_msg(2, 0);
    struct mirror_step ms;
    /* Before the first resync every step is stale. */
    assert_int_equal(mirror_step_prepare(m, &s, &ms), MIRROR_EOTHER_EPOCH);
    resync(m, 2, 0, NULL, 0);
    s = step_msg(1, 0);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), MIRROR_EOTHER_EPOCH);
    s = step_msg(3, 0);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), MIRROR_EOTHER_EPOCH);
    s = step_msg(2, 1);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_EPROTO);
    assert_non_null(strstr(pagoda_error_detail(), "expects step 0"));
    assert_int_equal(mirror_next_step_id(m), 0);
    s = step_msg(2, 0);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_tokens, 0);
    mirror_step_commit(m, NULL);
    assert_int_equal(mirror_next_step_id(m), 1);
    /* A repeated step is refused, not absorbed. */
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_EPROTO);
    s.has_epoch = 0;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_EINVAL);
    /* A new resync adopts its epoch and step id. */
    resync(m, 7, 100, NULL, 0);
    s = step_msg(2, 1);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), MIRROR_EOTHER_EPOCH);
    s = step_msg(7, 100);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    mirror_free(m);
}

/* A refused step changes nothing, even when its refusal comes after parts that were fine. */
static void test_computed_mismatch_is_refused_and_the_mirror_kept(void **state)
{
    struct mirror *m = new_mirror();
    int32_t a_tokens[] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, b_tokens[] = {11, 12, 13},
            c_tokens[] = {21, 22};
    int32_t a_blocks[] = {4, 2}, b_blocks[] = {9}, c_blocks[] = {6};
    Pagoda__Internal__SequenceSnapshot sa = snap(1, a_tokens, 9, 9, 8, a_blocks, 2);
    Pagoda__Internal__SequenceSnapshot sb = snap(2, b_tokens, 3, 3, 2, b_blocks, 1);
    Pagoda__Internal__SequenceSnapshot *snaps[] = {&sa, &sb};
    resync(m, 1, 0, snaps, 2);

    Pagoda__Internal__Step s = step_msg(1, 0);
    int32_t appended[] = {10};
    Pagoda__Internal__ContinuingSequence cb = cont_seq(2, 2, 1, appended, 1);
    Pagoda__Internal__ContinuingSequence ca = cont_seq(1, 7, 2, NULL, 0); /* mirror says 8 */
    Pagoda__Internal__ContinuingSequence *conts[] = {&cb, &ca};
    Pagoda__Internal__NewSequence nc = new_seq(3, c_tokens, 2, 2, 0, 2, c_blocks, 1);
    Pagoda__Internal__NewSequence *news[] = {&nc};
    uint64_t finished[] = {2};
    s.n_cont_seqs = 2;
    s.cont_seqs = conts;
    s.n_new_seqs = 1;
    s.new_seqs = news;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_EMISMATCH);
    assert_non_null(strstr(pagoda_error_detail(), "sequence 1"));
    assert_int_equal(mirror_num_seqs(m), 2);
    assert_int_equal(mirror_find(m, 3, &(struct mirror_seq_view){0}), PAGODA_ENOENT);
    struct mirror_seq_view vb = view(m, 2), va = view(m, 1);
    assert_int_equal(vb.num_blocks, 1);
    assert_int_equal(vb.num_computed_tokens, 2);
    assert_int_equal(va.num_computed_tokens, 8);
    assert_int_equal(va.num_tokens, 9);
    assert_int_equal(mirror_next_step_id(m), 0);

    /* A continuing sequence the same step drops is not held. */
    ca = cont_seq(1, 8, 1, NULL, 0);
    s.n_finished_seq_ids = 1;
    s.finished_seq_ids = finished;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_ENOENT);
    assert_int_equal(mirror_num_seqs(m), 2);

    /* The corrected step goes through, and an abort of it keeps the mirror too. */
    s.n_finished_seq_ids = 0;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_tokens, 4);
    mirror_step_abort(m);
    assert_int_equal(mirror_num_seqs(m), 2);
    assert_int_equal(view(m, 2).num_blocks, 1);
    assert_int_equal(mirror_next_step_id(m), 0);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_logits, 3);
    mirror_step_commit(m, (int32_t[]){50, 51, 52});
    assert_int_equal(mirror_num_seqs(m), 3);
    assert_int_equal(view(m, 2).num_blocks, 2);
    assert_int_equal(view(m, 3).token_ids[2], 52);
    mirror_free(m);
}

static void test_finished_and_preempted_are_dropped(void **state)
{
    struct mirror *m = new_mirror();
    int32_t t[] = {5, 6, 7}, t2[] = {8, 9, 10, 11};
    int32_t b1[] = {1}, b2[] = {2}, b3[] = {3}, b4[] = {4};
    Pagoda__Internal__SequenceSnapshot s1 = snap(1, t, 3, 3, 2, b1, 1);
    Pagoda__Internal__SequenceSnapshot s2 = snap(2, t, 3, 3, 2, b2, 1);
    Pagoda__Internal__SequenceSnapshot s3 = snap(3, t, 3, 3, 2, b3, 1);
    Pagoda__Internal__SequenceSnapshot *snaps[] = {&s1, &s2, &s3};
    resync(m, 1, 0, snaps, 3);
    assert_int_equal(mirror_num_seqs(m), 3);

    /* 1 finishes, 2 is preempted and comes back new in the same step, 99 is unknown. */
    Pagoda__Internal__Step s = step_msg(1, 0);
    uint64_t finished[] = {1, 99}, preempted[] = {2};
    Pagoda__Internal__NewSequence n2 = new_seq(2, t2, 4, 4, 0, 4, b4, 1);
    Pagoda__Internal__NewSequence *news[] = {&n2};
    Pagoda__Internal__ContinuingSequence c3 = cont_seq(3, 2, 1, NULL, 0);
    Pagoda__Internal__ContinuingSequence *conts[] = {&c3};
    s.n_finished_seq_ids = 2;
    s.finished_seq_ids = finished;
    s.n_preempted_seq_ids = 1;
    s.preempted_seq_ids = preempted;
    s.n_new_seqs = 1;
    s.new_seqs = news;
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_tokens, 5);
    mirror_step_commit(m, (int32_t[]){60, 61});
    assert_int_equal(mirror_num_seqs(m), 2);
    struct mirror_seq_view v;
    assert_int_equal(mirror_find(m, 1, &v), PAGODA_ENOENT);
    v = view(m, 2);
    assert_int_equal(v.num_tokens, 5);
    assert_int_equal(v.token_ids[0], 8);
    assert_int_equal(v.block_table[0], 4);
    assert_int_equal(v.token_ids[4], 61);
    assert_int_equal(view(m, 3).token_ids[3], 60);

    /* A new sequence the mirror holds and the step does not drop is refused. */
    s = step_msg(1, 1);
    Pagoda__Internal__NewSequence n3 = new_seq(3, t, 3, 3, 0, 3, b3, 1);
    Pagoda__Internal__NewSequence *news3[] = {&n3};
    s.n_new_seqs = 1;
    s.new_seqs = news3;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_EEXIST);
    /* A sequence listed twice among the new ones too. */
    Pagoda__Internal__NewSequence n5 = new_seq(5, t, 3, 3, 0, 3, b1, 1);
    Pagoda__Internal__NewSequence *twice[] = {&n5, &n5};
    s.n_new_seqs = 2;
    s.new_seqs = twice;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_EEXIST);
    assert_int_equal(mirror_num_seqs(m), 2);
    mirror_free(m);
}

/* A prompt of 20 tokens in chunks of 8, 8 and 4: logits only for the last chunk. Then a prefix
 * hit: a new sequence whose first 8 tokens are already in the pool. */
static void test_prefill_chunks_continue_a_sequence(void **state)
{
    struct mirror *m = new_mirror();
    resync(m, 9, 3, NULL, 0);
    int32_t prompt[20];
    for (int i = 0; i < 20; i++)
        prompt[i] = 30 + i;
    int32_t blocks[] = {14, 2, 8};
    Pagoda__Internal__Step s = step_msg(9, 3);
    Pagoda__Internal__NewSequence n = new_seq(77, prompt, 20, 20, 0, 8, blocks, 1);
    Pagoda__Internal__NewSequence *news[] = {&n};
    s.n_new_seqs = 1;
    s.new_seqs = news;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_tokens, 8);
    assert_int_equal(ms.batch.num_logits, 0);
    assert_int_equal(ms.batch.positions[7], 7);
    assert_int_equal(ms.batch.slot_mapping[7], 14 * BS + 7);
    mirror_step_commit(m, NULL);

    s = step_msg(9, 4);
    int32_t more[] = {2};
    Pagoda__Internal__ContinuingSequence c = cont_seq(77, 8, 8, more, 1);
    Pagoda__Internal__ContinuingSequence *conts[] = {&c};
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_logits, 0);
    assert_i32s(ms.batch.token_ids, prompt + 8, 8);
    assert_int_equal(ms.batch.positions[0], 8);
    assert_int_equal(ms.batch.slot_mapping[0], 2 * BS);
    assert_int_equal(ms.batch.context_lens[0], 16);
    mirror_step_commit(m, NULL);

    /* The last chunk: its block table must cover position 19. */
    s = step_msg(9, 5);
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    c = cont_seq(77, 16, 4, NULL, 0);
    expect_seq_fails(m, &s, 77, PAGODA_ERANGE, "cannot hold");
    int32_t last[] = {8};
    c = cont_seq(77, 16, 4, last, 1);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_tokens, 4);
    assert_int_equal(ms.batch.num_logits, 1);
    assert_int_equal(ms.batch.logits_indices[0], 3);
    assert_int_equal(ms.batch.positions[3], 19);
    assert_int_equal(ms.batch.slot_mapping[3], 8 * BS + 3);
    assert_int_equal(ms.rows[0].n_prompt, 20);
    assert_int_equal(ms.rows[0].output_index, 0);
    mirror_step_commit(m, (int32_t[]){7});
    assert_int_equal(view(m, 77).num_tokens, 21);

    /* Prefix hit: 8 tokens computed already; the chunk starts at position 8. */
    s = step_msg(9, 6);
    int32_t hit_blocks[] = {14, 5};
    Pagoda__Internal__NewSequence h = new_seq(78, prompt, 12, 12, 8, 4, hit_blocks, 2);
    Pagoda__Internal__NewSequence *hits[] = {&h};
    s.n_new_seqs = 1;
    s.new_seqs = hits;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_i32s(ms.batch.positions, (int32_t[]){8, 9, 10, 11}, 4);
    assert_i64s(ms.batch.slot_mapping, (int64_t[]){5 * BS, 5 * BS + 1, 5 * BS + 2, 5 * BS + 3}, 4);
    assert_int_equal(ms.batch.context_lens[0], 12);
    assert_int_equal(ms.batch.num_logits, 1);
    mirror_free(m);
}

/* After a resync the output so far is history: the sample row says so. */
static void test_sample_rows_carry_histories_after_a_resync(void **state)
{
    struct mirror *m = new_mirror();
    int32_t tokens[] = {3, 4, 5, 6, 90, 91, 92}; /* 4 prompt tokens, 3 output */
    int32_t blocks[] = {13};
    Pagoda__Internal__SequenceSnapshot sn = snap(4, tokens, 7, 4, 6, blocks, 1);
    Pagoda__Internal__SamplingParams sp = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    sp.has_temperature = 1;
    sp.temperature = 0.7f;
    sp.has_seed = 1;
    sp.seed = 1234;
    sp.has_frequency_penalty = 1;
    sp.frequency_penalty = 0.5f;
    sn.sampling = &sp;
    Pagoda__Internal__SequenceSnapshot *snaps[] = {&sn};
    resync(m, 1, 0, snaps, 1);
    Pagoda__Internal__Step s = step_msg(1, 0);
    Pagoda__Internal__ContinuingSequence c = cont_seq(4, 6, 1, NULL, 0);
    Pagoda__Internal__ContinuingSequence *conts[] = {&c};
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.token_ids[0], 92);
    assert_int_equal(ms.batch.positions[0], 6);
    const struct sample_row *r = &ms.rows[0];
    assert_int_equal(r->output_index, 3);
    assert_int_equal(r->n_prompt, 4);
    assert_int_equal(r->n_output, 3);
    assert_i32s(r->prompt_tokens, tokens, 4);
    assert_i32s(r->output_tokens, tokens + 4, 3);
    assert_true(r->params.temperature == 0.7f);
    assert_true(r->params.frequency_penalty == 0.5f);
    assert_true(r->params.top_p == 1.0f);
    assert_true(r->params.repetition_penalty == 1.0f);
    assert_int_equal(r->params.seed, 1234);
    const uint64_t key = r->history_key;
    assert_true(key != 0);
    mirror_step_commit(m, (int32_t[]){93});
    s = step_msg(1, 1);
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    c = cont_seq(4, 7, 1, NULL, 0);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.token_ids[0], 93);
    assert_int_equal(ms.rows[0].output_index, 4);
    assert_int_equal(ms.rows[0].output_tokens[3], 93);
    assert_true(ms.rows[0].history_key == key); /* the same sequence, the same key */

    /* Rebuilt by a resync, the same sequence's history gets a new key: what a backend keeps
     * under the old one may be ahead of the snapshot. */
    resync(m, 2, 0, snaps, 1);
    s = step_msg(2, 0);
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    c = cont_seq(4, 6, 1, NULL, 0);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.rows[0].output_index, 3);
    assert_true(ms.rows[0].history_key != 0 && ms.rows[0].history_key != key);

    /* A sequence with invalid sampling parameters is left out, named with its reason. */
    Pagoda__Internal__SamplingParams bad = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    bad.has_top_p = 1;
    bad.top_p = 0.0f;
    sn.sampling = &bad;
    Pagoda__Internal__Resync r2 = PAGODA__INTERNAL__RESYNC__INIT;
    r2.has_epoch = r2.has_next_step_id = 1;
    r2.epoch = 3;
    r2.n_seqs = 1;
    r2.seqs = snaps;
    assert_int_equal(mirror_resync(m, &r2), 0);
    const struct mirror_seq_error *left_out;
    assert_int_equal(mirror_resync_failures(m, &left_out), 1);
    assert_int_equal(left_out[0].seq_id, 4);
    assert_int_equal(left_out[0].code, PAGODA_ERANGE);
    assert_non_null(strstr(left_out[0].message, "sequence 4"));
    assert_non_null(strstr(left_out[0].message, "top_p"));
    assert_int_equal(mirror_epoch(m), 3);
    assert_int_equal(mirror_num_seqs(m), 0);
    mirror_free(m);
}

static void test_block_ids_outside_the_pool_are_refused(void **state)
{
    struct mirror *m = new_mirror();
    int32_t t[] = {1, 2, 3};
    int32_t ok[] = {15}, past[] = {16}, zero[] = {0}, neg[] = {-1};
    Pagoda__Internal__SequenceSnapshot good = snap(1, t, 3, 3, 2, ok, 1);
    Pagoda__Internal__SequenceSnapshot *snaps[] = {&good};
    resync(m, 1, 0, snaps, 1);

    /* A snapshot sequence with a block past the pool is left out (and listed), not the resync
     * refused: its request fails, the others go on. */
    Pagoda__Internal__SequenceSnapshot far = snap(2, t, 3, 3, 2, past, 1);
    Pagoda__Internal__SequenceSnapshot *bad_snaps[] = {&good, &far};
    Pagoda__Internal__Resync r = PAGODA__INTERNAL__RESYNC__INIT;
    r.has_epoch = r.has_next_step_id = 1;
    r.epoch = 1;
    r.next_step_id = 0;
    r.n_seqs = 2;
    r.seqs = bad_snaps;
    assert_int_equal(mirror_resync(m, &r), 0);
    const struct mirror_seq_error *left_out;
    assert_int_equal(mirror_resync_failures(m, &left_out), 1);
    assert_int_equal(left_out[0].seq_id, 2);
    assert_int_equal(left_out[0].code, PAGODA_ERANGE);
    assert_non_null(strstr(left_out[0].message, "block id 16"));
    assert_int_equal(mirror_num_seqs(m), 1);
    assert_int_equal(view(m, 1).num_computed_tokens, 2);
    /* What is wrong with the snapshot itself still refuses it, and the old mirror stays. */
    Pagoda__Internal__SequenceSnapshot *twice[] = {&good, &good};
    r.epoch = 2;
    r.next_step_id = 50;
    r.seqs = twice;
    assert_int_equal(mirror_resync(m, &r), PAGODA_EINVAL);
    assert_int_equal(mirror_epoch(m), 1);
    assert_int_equal(mirror_next_step_id(m), 0);
    assert_int_equal(mirror_num_seqs(m), 1);

    int32_t *bad_blocks[] = {past, zero, neg};
    for (int i = 0; i < 3; i++) {
        Pagoda__Internal__Step s = step_msg(1, 0);
        Pagoda__Internal__NewSequence n = new_seq(5, t, 3, 3, 0, 3, bad_blocks[i], 1);
        Pagoda__Internal__NewSequence *news[] = {&n};
        s.n_new_seqs = 1;
        s.new_seqs = news;
        expect_seq_fails(m, &s, 5, PAGODA_ERANGE, "outside the pool");
        Pagoda__Internal__ContinuingSequence c = cont_seq(1, 2, 1, bad_blocks[i], 1);
        Pagoda__Internal__ContinuingSequence *conts[] = {&c};
        s.n_new_seqs = 0;
        s.n_cont_seqs = 1;
        s.cont_seqs = conts;
        expect_seq_fails(m, &s, 1, PAGODA_ERANGE, "outside the pool");
    }
    assert_int_equal(mirror_num_seqs(m), 1);
    assert_int_equal(view(m, 1).num_blocks, 1);
    mirror_free(m);
}

static void test_limits_are_enforced(void **state)
{
    struct mirror *m = new_mirror();
    resync(m, 1, 0, NULL, 0);
    struct mirror_step ms;
    int32_t big[40] = {0}, blocks[8] = {1, 2, 3, 4, 5, 6, 7, 8};

    /* More tokens than the step budget (32). */
    Pagoda__Internal__Step s = step_msg(1, 0);
    Pagoda__Internal__NewSequence n = new_seq(1, big, 40, 40, 0, 33, blocks, 5);
    Pagoda__Internal__NewSequence *news[] = {&n};
    s.n_new_seqs = 1;
    s.new_seqs = news;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_ERANGE);
    /* What is wrong with one sequence fails that sequence, not the step: a chunk past the known
     * tokens, */
    n = new_seq(1, big, 4, 4, 0, 5, blocks, 1);
    expect_seq_fails(m, &s, 1, PAGODA_ERANGE, "new tokens");
    /* a token outside the vocabulary, */
    big[2] = 100;
    n = new_seq(1, big, 4, 4, 0, 4, blocks, 1);
    expect_seq_fails(m, &s, 1, PAGODA_ERANGE, "vocabulary");
    big[2] = 0;
    /* more than max_tokens_per_seq (64) tokens, */
    int32_t huge[65] = {0};
    n = new_seq(1, huge, 65, 65, 0, 1, blocks, 8);
    expect_seq_fails(m, &s, 1, PAGODA_ERANGE, "limit");
    /* a sequence at the limit that would sample once more. */
    int32_t full_blocks[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    n = new_seq(1, huge, 64, 64, 60, 4, full_blocks, 8);
    expect_seq_fails(m, &s, 1, PAGODA_ERANGE, "exceed");
    /* One token below the limit it samples its last token; the decode after that is refused. */
    n = new_seq(1, huge, 63, 63, 60, 3, full_blocks, 8);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    mirror_step_commit(m, (int32_t[]){77});
    assert_int_equal(view(m, 1).num_tokens, 64);
    assert_int_equal(view(m, 1).token_ids[63], 77);
    s = step_msg(1, 1);
    Pagoda__Internal__ContinuingSequence last = cont_seq(1, 63, 1, NULL, 0);
    Pagoda__Internal__ContinuingSequence *lasts[] = {&last};
    s.n_cont_seqs = 1;
    s.cont_seqs = lasts;
    expect_seq_fails(m, &s, 1, PAGODA_ERANGE, "exceed");
    uint64_t gone[] = {1};
    s = step_msg(1, 1);
    s.n_finished_seq_ids = 1;
    s.finished_seq_ids = gone;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    mirror_step_commit(m, NULL);
    s = step_msg(1, 2);
    /* More sequences than max_seqs (8). */
    Pagoda__Internal__NewSequence many[9];
    Pagoda__Internal__NewSequence *many_p[9];
    for (int i = 0; i < 9; i++) {
        many[i] = new_seq((uint64_t)i + 1, big, 1, 1, 0, 1, blocks + (i % 8), 1);
        many_p[i] = &many[i];
    }
    s.n_new_seqs = 9;
    s.new_seqs = many_p;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_ERANGE);
    s.n_new_seqs = 8;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_seqs, 8);
    mirror_step_commit(m, (int32_t[]){1, 2, 3, 4, 5, 6, 7, 8});
    /* The mirror is full: one more new sequence is refused unless one is dropped. */
    s = step_msg(1, 3);
    Pagoda__Internal__NewSequence extra = new_seq(20, big, 1, 1, 0, 1, blocks, 1);
    Pagoda__Internal__NewSequence *extra_p[] = {&extra};
    s.n_new_seqs = 1;
    s.new_seqs = extra_p;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_ERANGE);
    uint64_t done[] = {3};
    s.n_finished_seq_ids = 1;
    s.finished_seq_ids = done;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    mirror_step_commit(m, (int32_t[]){9});
    assert_int_equal(mirror_num_seqs(m), 8);
    mirror_free(m);
}

/* One sequence's error ends that sequence only: the step runs for the others, the failed one
 * leaves the mirror at commit (and a later drop of it is harmless); a row that could not be
 * sampled drops its sequence the same way. */
static void test_one_sequence_fails_and_the_step_goes_on(void **state)
{
    struct mirror *m = new_mirror();
    int32_t a_tokens[] = {1, 2, 3}, a_blocks[] = {4};
    Pagoda__Internal__SequenceSnapshot a = snap(1, a_tokens, 3, 3, 2, a_blocks, 1);
    Pagoda__Internal__SequenceSnapshot *snaps[] = {&a};
    resync(m, 1, 0, snaps, 1);

    /* B's sampling parameters are out of range, C's token is outside the vocabulary, D is fine;
     * A continues. */
    int32_t b_tokens[] = {5, 6}, c_tokens[] = {7, 100}, d_tokens[] = {8, 9};
    int32_t b_blocks[] = {5}, c_blocks[] = {6}, d_blocks[] = {7};
    Pagoda__Internal__SamplingParams bad = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    bad.has_repetition_penalty = 1;
    bad.repetition_penalty = 1e-45f;
    Pagoda__Internal__NewSequence b = new_seq(2, b_tokens, 2, 2, 0, 2, b_blocks, 1);
    b.sampling = &bad;
    Pagoda__Internal__NewSequence c = new_seq(3, c_tokens, 2, 2, 0, 2, c_blocks, 1);
    Pagoda__Internal__NewSequence d = new_seq(4, d_tokens, 2, 2, 0, 2, d_blocks, 1);
    Pagoda__Internal__NewSequence *news[] = {&b, &c, &d};
    Pagoda__Internal__ContinuingSequence ca = cont_seq(1, 2, 1, NULL, 0);
    Pagoda__Internal__ContinuingSequence *conts[] = {&ca};
    Pagoda__Internal__Step s = step_msg(1, 0);
    s.n_new_seqs = 3;
    s.new_seqs = news;
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.num_failed, 2);
    assert_int_equal(ms.failed[0].seq_id, 2);
    assert_int_equal(ms.failed[0].code, PAGODA_ERANGE);
    assert_non_null(strstr(ms.failed[0].message, "repetition_penalty"));
    assert_int_equal(ms.failed[1].seq_id, 3);
    assert_non_null(strstr(ms.failed[1].message, "vocabulary"));
    /* A's decode and D's prefill: 3 tokens, 2 rows. */
    assert_int_equal(ms.batch.num_tokens, 3);
    assert_int_equal(ms.batch.num_logits, 2);
    assert_int_equal(ms.seq_ids[0], 1);
    assert_int_equal(ms.seq_ids[1], 4);
    assert_i32s(ms.batch.token_ids, (int32_t[]){3, 8, 9}, 3);
    /* D's row could not be sampled (its logits were NaN, say): D goes too. */
    mirror_step_commit_rows(m, (int32_t[]){11, -1}, (int32_t[]){0, PAGODA_EINVAL});
    assert_int_equal(mirror_num_seqs(m), 1);
    assert_int_equal(view(m, 1).num_tokens, 4);
    assert_int_equal(view(m, 1).token_ids[3], 11);
    struct mirror_seq_view v;
    assert_int_equal(mirror_find(m, 2, &v), PAGODA_ENOENT);
    assert_int_equal(mirror_find(m, 3, &v), PAGODA_ENOENT);
    assert_int_equal(mirror_find(m, 4, &v), PAGODA_ENOENT);

    /* The scheduler names them finished in the next step: accepted, A goes on. */
    uint64_t gone[] = {2, 3, 4};
    ca = cont_seq(1, 3, 1, NULL, 0);
    s = step_msg(1, 1);
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    s.n_finished_seq_ids = 3;
    s.finished_seq_ids = gone;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.num_failed, 0);
    mirror_step_commit(m, (int32_t[]){12});
    assert_int_equal(view(m, 1).num_tokens, 5);

    /* What says that the step and the mirror disagree still refuses the whole step. */
    ca = cont_seq(1, 2, 1, NULL, 0);
    s = step_msg(1, 2);
    s.n_cont_seqs = 1;
    s.cont_seqs = conts;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_EMISMATCH);
    mirror_free(m);
}

/* Steps in flight: a step committed pending leaves a pending token where its sample goes; the
 * next step, prepared before the first is resolved, decodes that pending token; resolving writes
 * the sampled tokens in order. */
static void test_steps_in_flight_carry_pending_tokens(void **state)
{
    (void)state;
    struct mirror *m = new_mirror();
    int32_t tokens[] = {1, 2, 3}, blocks[] = {4};
    Pagoda__Internal__SequenceSnapshot a = snap(1, tokens, 3, 3, 0, blocks, 1), *seqs[] = {&a};
    resync(m, 1, 10, seqs, 1);
    Pagoda__Internal__ContinuingSequence c = cont_seq(1, 0, 3, NULL, 0), *cp[] = {&c};
    Pagoda__Internal__Step s = step_msg(1, 10);
    s.cont_seqs = cp;
    s.n_cont_seqs = 1;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    mirror_step_commit_pending(m);
    assert_int_equal(mirror_steps_in_flight(m), 1);
    struct mirror_seq_view v = view(m, 1);
    assert_int_equal(v.num_tokens, 4);
    assert_int_equal(v.num_computed_tokens, 3);
    assert_int_equal(v.token_ids[3], MIRROR_PENDING_TOKEN(10 % MIRROR_MAX_STEPS_IN_FLIGHT, 0));

    c = cont_seq(1, 3, 1, NULL, 0);
    s = step_msg(1, 11);
    s.cont_seqs = cp;
    s.n_cont_seqs = 1;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_tokens, 1);
    int32_t t = ms.batch.token_ids[0];
    assert_true(mirror_token_pending(t));
    assert_int_equal(mirror_pending_slot(t), 10 % MIRROR_MAX_STEPS_IN_FLIGHT);
    assert_int_equal(mirror_pending_row(t), 0);
    assert_int_equal(ms.batch.positions[0], 3);
    mirror_step_commit_pending(m);
    assert_int_equal(mirror_steps_in_flight(m), 2);

    int32_t t11 = 43, t10 = 42;
    mirror_step_resolve(m, 11, &t11, NULL); /* not the oldest: ignored */
    assert_int_equal(mirror_steps_in_flight(m), 2);
    mirror_step_resolve(m, 10, &t10, NULL);
    mirror_step_resolve(m, 11, &t11, NULL);
    assert_int_equal(mirror_steps_in_flight(m), 0);
    v = view(m, 1);
    int32_t want[] = {1, 2, 3, 42, 43};
    assert_int_equal(v.num_tokens, 5);
    assert_i32s(v.token_ids, want, 5);
    assert_int_equal(v.num_computed_tokens, 4);
    mirror_free(m);
}

/* At most MIRROR_MAX_STEPS_IN_FLIGHT steps are in flight; a whole-step failure refuses every
 * step until a resync. */
static void test_in_flight_limit_and_break(void **state)
{
    (void)state;
    struct mirror *m = new_mirror();
    int32_t tokens[] = {1, 2, 3}, blocks[] = {4};
    Pagoda__Internal__SequenceSnapshot a = snap(1, tokens, 3, 3, 2, blocks, 1), *seqs[] = {&a};
    resync(m, 1, 1, seqs, 1);
    Pagoda__Internal__ContinuingSequence c, *cp[] = {&c};
    Pagoda__Internal__Step s;
    struct mirror_step ms;
    for (int i = 0; i < MIRROR_MAX_STEPS_IN_FLIGHT; i++) {
        c = cont_seq(1, 2 + i, 1, NULL, 0); /* each decodes the one before's token */
        s = step_msg(1, 1 + (uint64_t)i);
        s.cont_seqs = cp;
        s.n_cont_seqs = 1;
        assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
        mirror_step_commit_pending(m);
    }
    c = cont_seq(1, 2 + MIRROR_MAX_STEPS_IN_FLIGHT, 1, NULL, 0);
    s = step_msg(1, 1 + MIRROR_MAX_STEPS_IN_FLIGHT);
    s.cont_seqs = cp;
    s.n_cont_seqs = 1;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_EBUSY);
    int32_t t = 5;
    mirror_step_resolve(m, 1, &t, NULL);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    mirror_step_abort(m);
    mirror_step_break(m, 2);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_EPROTO);
    resync(m, 1, 9, seqs, 1);
    assert_int_equal(mirror_steps_in_flight(m), 0);
    c = cont_seq(1, 2, 0, NULL, 0);
    s = step_msg(1, 9);
    s.cont_seqs = cp;
    s.n_cont_seqs = 1;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    mirror_step_abort(m);
    mirror_free(m);
}

/* A row that could not be sampled drops its sequence (at resolve when the step was committed
 * pending, at commit otherwise); a later step that still continues it (the scheduler formed it
 * before it knew) fails that sequence alone, saying why, instead of being refused for an unknown
 * sequence. */
static void expect_row_failure_remembered(int pending)
{
    struct mirror *m = new_mirror();
    int32_t ta[] = {1, 2, 3}, tb[] = {4, 5, 6}, ba[] = {4}, bb[] = {5};
    Pagoda__Internal__SequenceSnapshot a = snap(1, ta, 3, 3, 2, ba, 1),
                                       b = snap(2, tb, 3, 3, 2, bb, 1), *seqs[] = {&a, &b};
    resync(m, 1, 1, seqs, 2);
    Pagoda__Internal__ContinuingSequence ca = cont_seq(1, 2, 1, NULL, 0),
                                         cb = cont_seq(2, 2, 1, NULL, 0), *cp[] = {&ca, &cb};
    Pagoda__Internal__Step s = step_msg(1, 1);
    s.cont_seqs = cp;
    s.n_cont_seqs = 2;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    int32_t toks[] = {-1, 7};
    if (pending) {
        mirror_step_commit_pending(m);
        struct backend_row_error errs[2] = {{.code = PAGODA_EINVAL, .message = "logit 0 is nan"},
                                            {.code = 0}};
        mirror_step_resolve(m, 1, toks, errs);
    } else {
        mirror_step_commit_rows(m, toks, (int32_t[]){PAGODA_ERANGE, 0});
    }
    struct mirror_seq_view v;
    assert_int_equal(mirror_find(m, 1, &v), PAGODA_ENOENT);
    assert_int_equal(view(m, 2).token_ids[3], 7);
    ca = cont_seq(1, 3, 1, NULL, 0);
    cb = cont_seq(2, 3, 1, NULL, 0);
    s = step_msg(1, 2);
    s.cont_seqs = cp;
    s.n_cont_seqs = 2;
    if (pending)
        expect_seq_fails(m, &s, 1, PAGODA_EINVAL, "failed in step 1: logit 0 is nan");
    else
        expect_seq_fails(m, &s, 1, PAGODA_ERANGE,
                         "failed in step 1: its token could not be sampled");
    mirror_free(m);
}

static void test_row_failure_fails_the_sequence_in_later_steps(void **state)
{
    (void)state;
    expect_row_failure_remembered(1);
}

/* The synchronous commit (mirror_step_commit_rows: the fuzz target's worker, or a caller without
 * steps in flight) remembers the failure too. */
static void test_row_failure_at_commit_fails_the_sequence_in_the_next_step(void **state)
{
    (void)state;
    expect_row_failure_remembered(0);
}

/* A new sequence the step fails for its own content at its first sample (sampling parameters
 * out of range), while the step behind it, which the scheduler formed before it knew, already
 * decodes it ahead: that step fails the sequence alone, naming the first failure, and runs for
 * the others; a sequence it never held still refuses the step. With steps in flight (commit
 * pending) and without. */
static void expect_first_sample_failure_remembered(int pending)
{
    struct mirror *m = new_mirror();
    int32_t ta[] = {1, 2, 3}, ba[] = {4};
    Pagoda__Internal__SequenceSnapshot a = snap(1, ta, 3, 3, 2, ba, 1), *seqs[] = {&a};
    resync(m, 1, 1, seqs, 1);
    int32_t tb[] = {5, 6}, bb[] = {5};
    Pagoda__Internal__SamplingParams bad = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    bad.has_repetition_penalty = 1;
    bad.repetition_penalty = 1e-45f;
    Pagoda__Internal__NewSequence nb = new_seq(2, tb, 2, 2, 0, 2, bb, 1), *news[] = {&nb};
    nb.sampling = &bad;
    Pagoda__Internal__ContinuingSequence ca = cont_seq(1, 2, 1, NULL, 0),
                                         cb = cont_seq(2, 2, 1, NULL, 0), *cp[] = {&ca, &cb};
    Pagoda__Internal__Step s = step_msg(1, 1);
    s.cont_seqs = cp;
    s.n_cont_seqs = 1;
    s.new_seqs = news;
    s.n_new_seqs = 1;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.num_failed, 1);
    assert_int_equal(ms.failed[0].seq_id, 2);
    assert_int_equal(ms.batch.num_logits, 1);
    if (pending) {
        mirror_step_commit_pending(m);
        mirror_step_resolve(m, 1, (int32_t[]){7}, NULL);
    } else {
        mirror_step_commit(m, (int32_t[]){7});
    }
    struct mirror_seq_view v;
    assert_int_equal(mirror_find(m, 2, &v), PAGODA_ENOENT);
    /* Step 2 decodes A and B ahead: B fails alone, A runs. */
    ca = cont_seq(1, 3, 1, NULL, 0);
    cb = cont_seq(2, 2, 1, NULL, 0);
    s = step_msg(1, 2);
    s.cont_seqs = cp;
    s.n_cont_seqs = 2;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.num_failed, 1);
    assert_int_equal(ms.failed[0].seq_id, 2);
    assert_int_equal(ms.failed[0].code, PAGODA_ERANGE);
    if (strstr(ms.failed[0].message, "failed in step 1") == NULL ||
        strstr(ms.failed[0].message, "repetition_penalty") == NULL)
        fail_msg("B's failure in step 2 does not name the first one: '%s'", ms.failed[0].message);
    assert_int_equal(ms.batch.num_logits, 1);
    assert_int_equal(ms.seq_ids[0], 1);
    mirror_step_abort(m);
    /* A sequence the worker never held is still a protocol violation. */
    cb = cont_seq(9, 2, 1, NULL, 0);
    assert_int_equal(mirror_step_prepare(m, &s, &ms), PAGODA_ENOENT);
    mirror_free(m);
}

static void test_first_sample_failure_fails_the_sequence_in_the_step_behind(void **state)
{
    (void)state;
    expect_first_sample_failure_remembered(1);
    expect_first_sample_failure_remembered(0);
}

/* A sequence's logit bias and min_tokens' stop ids become its row's entries: the stop ids at
 * -inf while its output (pending tokens counted) is shorter than min_tokens, the bias always;
 * a sequence without either adds none. Bad lists fail that sequence alone. */
static void test_logit_bias_and_min_tokens_make_entries(void **state)
{
    (void)state;
    struct mirror *m = new_mirror();
    int32_t a_tokens[] = {1, 2, 3}, b_tokens[] = {5, 6}, a_blocks[] = {4}, b_blocks[] = {5};
    int32_t bias_ids[] = {9, 2}, stop_ids[] = {2, 3};
    float bias_values[] = {5.0f, -1.0f};
    Pagoda__Internal__SamplingParams asp = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    asp.has_min_tokens = 1;
    asp.min_tokens = 2;
    asp.n_min_tokens_stop_ids = 2;
    asp.min_tokens_stop_ids = stop_ids;
    asp.n_logit_bias_token_ids = asp.n_logit_bias_values = 2;
    asp.logit_bias_token_ids = bias_ids;
    asp.logit_bias_values = bias_values;
    Pagoda__Internal__SequenceSnapshot b = snap(2, b_tokens, 2, 2, 0, b_blocks, 1), *seqs[] = {&b};
    resync(m, 1, 10, seqs, 1);
    Pagoda__Internal__NewSequence a = new_seq(1, a_tokens, 3, 3, 0, 3, a_blocks, 1), *np[] = {&a};
    a.sampling = &asp;
    Pagoda__Internal__ContinuingSequence cb = cont_seq(2, 0, 2, NULL, 0), *cp[] = {&cb};
    Pagoda__Internal__Step s = step_msg(1, 10);
    s.new_seqs = np;
    s.n_new_seqs = 1;
    s.cont_seqs = cp;
    s.n_cont_seqs = 1;
    struct mirror_step ms;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.num_failed, 0);
    assert_int_equal(ms.batch.num_logits, 2); /* row 0: B (continuing first), row 1: A */
    assert_int_equal(ms.seq_ids[1], 1);
    /* A's output is empty: 2 and 3 suppressed, then 9's bias (2's is dropped: suppressed) */
    assert_int_equal(ms.batch.num_logit_entries, 3);
    const struct logit_entry *e = ms.batch.logit_entries;
    assert_true(e[0].row == 1 && e[0].token == 2 && isinf(e[0].value) && e[0].value < 0);
    assert_true(e[1].row == 1 && e[1].token == 3 && isinf(e[1].value));
    assert_true(e[2].row == 1 && e[2].token == 9 && e[2].value == 5.0f);
    mirror_step_commit_pending(m);

    /* the next step: A's one pending token is its output: still under min_tokens 2 */
    Pagoda__Internal__ContinuingSequence ca = cont_seq(1, 3, 1, NULL, 0), *cp2[] = {&ca};
    s = step_msg(1, 11);
    s.cont_seqs = cp2;
    s.n_cont_seqs = 1;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_logits, 1);
    assert_int_equal(ms.batch.num_logit_entries, 3);
    mirror_step_commit_pending(m);
    int32_t t10[] = {7, 8}, t11[] = {4};
    mirror_step_resolve(m, 10, t10, NULL);
    mirror_step_resolve(m, 11, t11, NULL);

    /* two output tokens: min_tokens is met, the bias alone (both pairs) */
    ca = cont_seq(1, 4, 1, NULL, 0);
    s = step_msg(1, 12);
    s.cont_seqs = cp2;
    s.n_cont_seqs = 1;
    assert_int_equal(mirror_step_prepare(m, &s, &ms), 0);
    assert_int_equal(ms.batch.num_logit_entries, 2);
    e = ms.batch.logit_entries;
    assert_true(e[0].row == 0 && e[0].token == 9 && e[1].token == 2 && e[1].value == -1.0f);
    mirror_step_abort(m);

    /* bad lists: the sequence fails, naming why */
    int32_t c_tokens[] = {1}, c_blocks[] = {6};
    Pagoda__Internal__SamplingParams bad = asp;
    Pagoda__Internal__NewSequence c = new_seq(3, c_tokens, 1, 1, 0, 1, c_blocks, 1), *np3[] = {&c};
    c.sampling = &bad;
    s = step_msg(1, 12);
    s.new_seqs = np3;
    s.n_new_seqs = 1;
    int32_t out_of_vocab[] = {9, 100};
    bad.logit_bias_token_ids = out_of_vocab;
    expect_seq_fails(m, &s, 3, PAGODA_ERANGE, "outside the vocabulary");
    bad = asp;
    bad.n_logit_bias_values = 1;
    expect_seq_fails(m, &s, 3, PAGODA_EINVAL, "2 token ids but 1 values");
    bad = asp;
    int32_t twice[] = {3, 3};
    bad.min_tokens_stop_ids = twice;
    expect_seq_fails(m, &s, 3, PAGODA_EINVAL, "listed twice");
    mirror_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resync_then_steps_build_the_batch),
        cmocka_unit_test(test_other_epochs_and_step_ids_are_refused),
        cmocka_unit_test(test_computed_mismatch_is_refused_and_the_mirror_kept),
        cmocka_unit_test(test_finished_and_preempted_are_dropped),
        cmocka_unit_test(test_prefill_chunks_continue_a_sequence),
        cmocka_unit_test(test_sample_rows_carry_histories_after_a_resync),
        cmocka_unit_test(test_block_ids_outside_the_pool_are_refused),
        cmocka_unit_test(test_limits_are_enforced),
        cmocka_unit_test(test_one_sequence_fails_and_the_step_goes_on),
        cmocka_unit_test(test_steps_in_flight_carry_pending_tokens),
        cmocka_unit_test(test_in_flight_limit_and_break),
        cmocka_unit_test(test_row_failure_fails_the_sequence_in_later_steps),
        cmocka_unit_test(test_row_failure_at_commit_fails_the_sequence_in_the_next_step),
        cmocka_unit_test(test_first_sample_failure_fails_the_sequence_in_the_step_behind),
        cmocka_unit_test(test_logit_bias_and_min_tokens_make_entries),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
