/* Tests of worker/history_cache.c: over hundreds of uses of one cache, with sequences arriving,
 * growing and leaving, every placed history equals its source exactly, although the caller
 * scribbles over the last `tail` outputs of its copies between uses (as the executor's gathers
 * do) and the sources change their last outputs in place (pending tokens resolved) or drop them
 * (which the mirror does not do today, but the cache allows within the tail); rows without a
 * penalty get no history; key 0 and a key twice in one use are copied whole; a use without
 * penalised rows forgets nothing; in a steady state a use copies about the new tokens and the
 * tails, not the histories; and the buffer stays within a few times the live histories. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "kernels/cpu/sampler.h"
#include "worker/history_cache.h"

#include <stdlib.h>
#include <string.h>

#define TAIL 8
#define MAX_SEQS 40
#define MAX_LEN 6000

struct seq {
    int live;
    uint64_t key;
    int penalised;
    int32_t *tokens; /* prompt, then outputs */
    size_t n_prompt, n_output;
};

static uint64_t rng = 88172645463325252ull;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static uint64_t g_keys;

static void seq_start(struct seq *s)
{
    s->live = 1;
    s->key = ++g_keys;
    s->penalised = next_rand() % 5 != 0;
    s->n_prompt = 1 + next_rand() % 700;
    s->n_output = 0;
    for (size_t i = 0; i < s->n_prompt; i++)
        s->tokens[i] = (int32_t)(next_rand() % 50000);
}

static struct sample_row row_of(const struct seq *s)
{
    struct sample_row r;
    memset(&r, 0, sizeof(r));
    r.params = sampling_params_default();
    if (s->penalised)
        r.params.repetition_penalty = 1.1f;
    r.history_key = s->key;
    r.prompt_tokens = s->tokens;
    r.n_prompt = s->n_prompt;
    r.output_tokens = s->tokens + s->n_prompt;
    r.n_output = s->n_output;
    return r;
}

/* dst's history equals src's, or (no penalty) is empty. */
static void check_row(const struct sample_row *src, const struct sample_row *dst)
{
    assert_int_equal(dst->history_key, src->history_key);
    if (!sampling_params_penalised(&src->params)) {
        assert_null(dst->prompt_tokens);
        assert_null(dst->output_tokens);
        assert_int_equal(dst->n_prompt, 0);
        assert_int_equal(dst->n_output, 0);
        return;
    }
    assert_int_equal(dst->n_prompt, src->n_prompt);
    assert_int_equal(dst->n_output, src->n_output);
    assert_memory_equal(dst->prompt_tokens, src->prompt_tokens, src->n_prompt * sizeof(int32_t));
    if (src->n_output > 0)
        assert_memory_equal(dst->output_tokens, src->output_tokens,
                            src->n_output * sizeof(int32_t));
}

/* Four caches used in turn (the executor's slots), 400 uses: each use, every live sequence
 * appends a token, its last 4 outputs may change in place, a few sequences end and new ones
 * start, some drop their last outputs; the rows go in shuffled order. */
static void test_many_uses(void **state)
{
    (void)state;
    struct history_cache hc[4];
    for (int i = 0; i < 4; i++)
        history_cache_init(&hc[i]);
    struct seq seqs[MAX_SEQS];
    for (int i = 0; i < MAX_SEQS; i++) {
        seqs[i].tokens = malloc(MAX_LEN * sizeof(int32_t));
        assert_non_null(seqs[i].tokens);
        seq_start(&seqs[i]);
    }
    struct sample_row src[MAX_SEQS + 2], dst[MAX_SEQS + 2];
    uint64_t total = 0;
    uint64_t copied_before = 0, total_late = 0;
    for (int use = 0; use < 400; use++) {
        for (int i = 0; i < MAX_SEQS; i++) {
            struct seq *s = &seqs[i];
            if (!s->live || s->n_prompt + s->n_output + 1 >= MAX_LEN || next_rand() % 97 == 0)
                seq_start(s);
            /* a failed step: its pending token dropped */
            if (s->n_output > 0 && next_rand() % 53 == 0)
                s->n_output--;
            s->tokens[s->n_prompt + s->n_output++] = (int32_t)(next_rand() % 50000);
            /* pending tokens resolved in place among the last 4 */
            for (size_t k = s->n_output > 4 ? s->n_output - 4 : 0; k < s->n_output; k++)
                if (next_rand() % 3 == 0)
                    s->tokens[s->n_prompt + k] = -1 - (int32_t)(next_rand() % 4);
        }
        /* the rows: a shuffled subset (about 15 in 16: a sequence left out of a slot's use is
         * copied whole in its next), sometimes a key twice, sometimes key 0 */
        size_t n = 0;
        for (int i = 0; i < MAX_SEQS; i++)
            if (next_rand() % 16 != 0)
                src[n++] = row_of(&seqs[i]);
        for (size_t i = n; i > 1; i--) {
            const size_t j = next_rand() % i;
            struct sample_row t = src[i - 1];
            src[i - 1] = src[j];
            src[j] = t;
        }
        if (n > 0 && use % 7 == 3)
            src[n++] = src[0]; /* the same key twice */
        if (use % 11 == 5) {
            src[n] = row_of(&seqs[use % MAX_SEQS]);
            src[n].history_key = 0;
            n++;
        }
        struct history_cache *h = &hc[use % 4];
        assert_int_equal(history_cache_place(h, src, dst, n, TAIL), 0);
        size_t held = 0; /* the histories placed: the buffer stays within a few times them */
        for (size_t i = 0; i < n; i++)
            held += dst[i].n_prompt + dst[i].n_output + 256;
        assert_true(h->used <= 4 * held + 65536);
        for (size_t i = 0; i < n; i++) {
            check_row(&src[i], &dst[i]);
            const size_t back = 1 + next_rand() % 2; /* the caller scribbles over its tail */
            if (dst[i].n_output >= back)
                ((int32_t *)dst[i].output_tokens)[dst[i].n_output - back] = 0;
            if (use >= 200)
                total_late += dst[i].n_prompt + dst[i].n_output;
        }
        if (use == 199)
            copied_before = hc[0].copied + hc[1].copied + hc[2].copied + hc[3].copied;
        total += n;
    }
    /* In the second half (histories of hundreds to thousands of tokens), the copies are a small
     * part of the histories placed. */
    const uint64_t copied_late =
        hc[0].copied + hc[1].copied + hc[2].copied + hc[3].copied - copied_before;
    print_message("placed %llu rows; the last 200 uses copied %llu of %llu history entries\n",
                  (unsigned long long)total, (unsigned long long)copied_late,
                  (unsigned long long)total_late);
    assert_true(copied_late * 5 < total_late);
    for (int i = 0; i < 4; i++)
        history_cache_free(&hc[i]);
    for (int i = 0; i < MAX_SEQS; i++)
        free(seqs[i].tokens);
}

/* A history copied whole the first time; then only the tail and the new tokens; a prompt of
 * another length under the same key, or outputs that shrank by more than the tail, copy it whole
 * again; a history past its region's room moves to a new one. */
static void test_reuse_rules(void **state)
{
    (void)state;
    struct history_cache h;
    history_cache_init(&h);
    static int32_t tokens[20000];
    for (int i = 0; i < 20000; i++)
        tokens[i] = i;
    struct sample_row r, d;
    memset(&r, 0, sizeof(r));
    r.params = sampling_params_default();
    r.params.presence_penalty = 0.5f;
    r.history_key = 7;
    r.prompt_tokens = tokens;
    r.n_prompt = 100;
    r.output_tokens = tokens + 100;
    r.n_output = 1000;
    assert_int_equal(history_cache_place(&h, &r, &d, 1, TAIL), 0);
    check_row(&r, &d);
    assert_int_equal(h.copied, 1100);
    r.n_output = 1003; /* three new tokens: the tail of 8 and the 3 */
    assert_int_equal(history_cache_place(&h, &r, &d, 1, TAIL), 0);
    check_row(&r, &d);
    assert_int_equal(h.copied, 1100 + TAIL + 3);
    r.n_output = 1003 - TAIL; /* shrank by the tail: in place, its new tail copied again */
    assert_int_equal(history_cache_place(&h, &r, &d, 1, TAIL), 0);
    check_row(&r, &d);
    assert_int_equal(h.copied, 1100 + TAIL + 3 + TAIL);
    r.n_output = 900; /* shrank by more: whole */
    assert_int_equal(history_cache_place(&h, &r, &d, 1, TAIL), 0);
    check_row(&r, &d);
    assert_int_equal(h.copied, 1100 + TAIL + 3 + TAIL + 1000);
    r.n_prompt = 101; /* another prompt: whole */
    r.output_tokens = tokens + 101;
    assert_int_equal(history_cache_place(&h, &r, &d, 1, TAIL), 0);
    check_row(&r, &d);
    assert_int_equal(h.copied, 1100 + TAIL + 3 + TAIL + 1000 + 1001);
    r.n_output = 15000; /* past the region's room: moved, whole */
    const uint64_t before = h.copied;
    assert_int_equal(history_cache_place(&h, &r, &d, 1, TAIL), 0);
    check_row(&r, &d);
    assert_int_equal(h.copied - before, 15101);
    /* a use without penalised rows forgets nothing */
    struct sample_row plain = r, dplain;
    plain.params = sampling_params_default();
    assert_int_equal(history_cache_place(&h, &plain, &dplain, 1, TAIL), 0);
    check_row(&plain, &dplain);
    const uint64_t kept = h.copied;
    assert_int_equal(history_cache_place(&h, &r, &d, 1, TAIL), 0);
    check_row(&r, &d);
    assert_int_equal(h.copied - kept, TAIL);
    /* not seen in a use: forgotten */
    struct sample_row other = r;
    other.history_key = 8;
    assert_int_equal(history_cache_place(&h, &other, &d, 1, TAIL), 0);
    check_row(&other, &d);
    const uint64_t again = h.copied;
    assert_int_equal(history_cache_place(&h, &r, &d, 1, TAIL), 0);
    check_row(&r, &d);
    assert_int_equal(h.copied - again, 15101);
    history_cache_free(&h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_many_uses),
        cmocka_unit_test(test_reuse_rules),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
