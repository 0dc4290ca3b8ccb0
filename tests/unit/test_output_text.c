/* text/output_text.c: a request's output text. With the test tokenizer of
 * tests/data/tiny-text (a byte-level BPE laid out as Llama 3's), the text visible token by token
 * joins to the full decode; stop strings are found across token boundaries and nothing after
 * them is ever visible; held-back text comes out at the end. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "common/error.h"
#include "text/output_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static Tokenizer *tok;

static int setup(void **state)
{
    (void)state;
    char path[1024];
    const char *src = getenv("PAGODA_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/tests/data/tiny-text/tokenizer.json", src ? src : ".");
    int rc = tokenizer_new_from_file(path, &tok);
    if (rc != 0)
        fprintf(stderr, "%s: %s\n", path, pagoda_error_detail());
    return rc;
}

static int teardown(void **state)
{
    (void)state;
    tokenizer_free(tok);
    return 0;
}

static void encode(const char *text, TokenizerIds *ids)
{
    memset(ids, 0, sizeof(*ids));
    assert_int_equal(tokenizer_encode(tok, text, strlen(text), false, ids), 0);
}

/* Pushes every id and checks that each token's piece, joined, is the visible text, which only
 * grows. Returns the stop index reported (0: none) and the number of ids taken. */
static int push_all(struct output_text *o, const int32_t *ids, size_t n, size_t *taken)
{
    size_t prev = 0;
    for (size_t i = 0; i < n; i++) {
        int stop = 0;
        assert_int_equal(output_text_push(o, ids[i], &stop), 0);
        size_t len;
        output_text_visible(o, &len);
        assert_true(len >= prev);
        assert_int_equal(output_text_start(o, (uint32_t)i + 1), len);
        assert_int_equal(output_text_start(o, (uint32_t)i + 5), len); /* past the tokens */
        assert_int_equal(output_text_start(o, (uint32_t)i), prev);
        prev = len;
        if (stop) {
            *taken = i + 1;
            return stop;
        }
    }
    *taken = n;
    return 0;
}

static void test_pieces_join_to_the_full_decode(void **state)
{
    (void)state;
    /* Random ids, byte tokens among them, so that characters are split and bytes are invalid. */
    uint32_t x = 12345;
    for (int round = 0; round < 200; round++) {
        int32_t ids[64];
        size_t n = 1 + round % 64;
        for (size_t i = 0; i < n; i++) {
            x = x * 1664525u + 1013904223u;
            ids[i] = (int32_t)(x >> 8) % 512;
        }
        for (int skip = 0; skip < 2; skip++) {
            struct output_text *o;
            assert_int_equal(output_text_new(tok, skip, NULL, NULL, 0, &o), 0);
            size_t taken;
            assert_int_equal(push_all(o, ids, n, &taken), 0);
            int stop;
            assert_int_equal(output_text_finish(o, &stop), 0);
            assert_int_equal(stop, 0);
            char *full;
            size_t full_len, len;
            assert_int_equal(tokenizer_decode(tok, ids, n, skip, &full, &full_len), 0);
            const char *vis = output_text_visible(o, &len);
            assert_int_equal(len, full_len);
            assert_memory_equal(vis, full, len);
            free(full);
            output_text_free(o);
        }
    }
}

static void test_a_stop_string_across_tokens_cuts_the_text(void **state)
{
    (void)state;
    const char *text = "The scheduler owns the block table, and the worker runs the kernels.";
    TokenizerIds ids;
    encode(text, &ids);
    assert_true(ids.len > 6);
    const char *stops[] = {"zzz", "le, and th"};
    size_t lens[] = {3, strlen(stops[1])};
    struct output_text *o;
    assert_int_equal(output_text_new(tok, true, stops, lens, 2, &o), 0);
    size_t taken;
    int stop = push_all(o, ids.ids, ids.len, &taken);
    assert_int_equal(stop, 2);
    assert_true(taken < ids.len);
    size_t len;
    const char *vis = output_text_visible(o, &len);
    const char *at = strstr(text, stops[1]);
    assert_int_equal(len, (size_t)(at - text));
    assert_memory_equal(vis, text, len);
    size_t n;
    const char *which = output_text_stop(o, stop, &n);
    assert_int_equal(n, lens[1]);
    assert_memory_equal(which, stops[1], n);
    /* The output is over. */
    int again;
    assert_int_equal(output_text_push(o, ids.ids[0], &again), PAGODA_ECLOSED);
    assert_int_equal(output_text_finish(o, &again), 0);
    assert_int_equal(output_text_visible(o, &len) != NULL, 1);
    assert_int_equal(len, (size_t)(at - text));
    output_text_free(o);
    tokenizer_ids_fini(&ids);
}

/* min_tokens (output_text_min_tokens): a stop string that ends in the text of the first
 * min_tokens tokens ends nothing and is not looked for again; one ending in the text of token
 * min_tokens or later does, as without it. */
static void test_min_tokens_defers_stop_strings(void **state)
{
    (void)state;
    const char *text = "the worker runs the kernels, and the worker ends the step.";
    TokenizerIds ids;
    encode(text, &ids);
    const char *stops[] = {"the worker"};
    size_t lens[] = {strlen(stops[0])};
    struct output_text *o;
    assert_int_equal(output_text_new(tok, true, stops, lens, 1, &o), 0);
    size_t first;
    assert_int_equal(push_all(o, ids.ids, ids.len, &first), 1);
    size_t len;
    output_text_visible(o, &len);
    assert_int_equal(len, 0); /* the text begins with the stop */
    output_text_free(o);
    /* the token completing it is token first - 1: min_tokens = first skips it */
    assert_int_equal(output_text_new(tok, true, stops, lens, 1, &o), 0);
    output_text_min_tokens(o, (uint32_t)first);
    size_t second;
    assert_int_equal(push_all(o, ids.ids, ids.len, &second), 1);
    assert_true(second > first && second < ids.len);
    const char *vis = output_text_visible(o, &len);
    const char *at = strstr(text + 1, stops[0]);
    assert_int_equal(len, (size_t)(at - text));
    assert_memory_equal(vis, text, len);
    output_text_free(o);
    /* min_tokens = first - 1: token first - 1 is past it, and the first match ends the text */
    assert_int_equal(output_text_new(tok, true, stops, lens, 1, &o), 0);
    output_text_min_tokens(o, (uint32_t)first - 1);
    size_t again;
    assert_int_equal(push_all(o, ids.ids, ids.len, &again), 1);
    assert_int_equal(again, first);
    output_text_free(o);
    tokenizer_ids_fini(&ids);
}

/* include_stop_str_in_output (output_text_keep_stops): the text ends after the stop string,
 * nothing past it within the token that completed it, and nothing is held back meanwhile: each
 * token's own text shows with it, the stop's beginning included. */
static void test_a_kept_stop_string_ends_the_text(void **state)
{
    (void)state;
    const char *text = "The scheduler owns the block table, and the worker runs the kernels.";
    TokenizerIds ids;
    encode(text, &ids);
    const char *stops[] = {"zzz", "le, and th"};
    size_t lens[] = {3, strlen(stops[1])};
    struct output_text *o;
    assert_int_equal(output_text_new(tok, true, stops, lens, 2, &o), 0);
    output_text_keep_stops(o);
    const char *at = strstr(text, stops[1]);
    size_t end = (size_t)(at - text) + lens[1], len, decoded = 0;
    int stop = 0;
    size_t i = 0;
    for (; i < ids.len && stop == 0; i++) {
        assert_int_equal(output_text_push(o, ids.ids[i], &stop), 0);
        if (stop == 0) { /* all its text so far is visible (every token here is whole text) */
            char *all;
            assert_int_equal(tokenizer_decode(tok, ids.ids, i + 1, true, &all, &decoded), 0);
            free(all);
            output_text_visible(o, &len);
            assert_int_equal(len, decoded);
        }
    }
    assert_int_equal(stop, 2);
    assert_true(decoded < end); /* the stop completed within the last token pushed... */
    const char *vis = output_text_visible(o, &len);
    assert_int_equal(len, end); /* ...and the text ends with it, nothing after */
    assert_memory_equal(vis, text, len);
    assert_int_equal(output_text_start(o, (uint32_t)i), end);
    int again;
    assert_int_equal(output_text_finish(o, &again), 0);
    output_text_visible(o, &len);
    assert_int_equal(len, end);
    output_text_free(o);
    tokenizer_ids_fini(&ids);
}

static void test_nothing_that_may_begin_a_stop_is_shown_until_finish(void **state)
{
    (void)state;
    const char *text = "worker runs the kernels";
    TokenizerIds ids;
    encode(text, &ids);
    const char *stops[] = {"kernels!"}; /* never completes: "kernels" is held back to the end */
    size_t lens[] = {8};
    struct output_text *o;
    assert_int_equal(output_text_new(tok, true, stops, lens, 1, &o), 0);
    size_t taken, len;
    assert_int_equal(push_all(o, ids.ids, ids.len, &taken), 0);
    output_text_visible(o, &len);
    assert_true(len <= strlen(text) - 7);
    int stop;
    assert_int_equal(output_text_finish(o, &stop), 0);
    assert_int_equal(stop, 0);
    const char *vis = output_text_visible(o, &len);
    assert_int_equal(len, strlen(text));
    assert_memory_equal(vis, text, len);
    output_text_free(o);
    tokenizer_ids_fini(&ids);
}

/* Only what may begin a stop string is held back: with a stop string the text never begins,
 * each token's piece is its own text (before the forty-first session every token's text went to
 * the token after it, the last longest-stop - 1 bytes being held whatever they were). */
static void test_a_token_shows_its_own_text_when_it_may_begin_no_stop(void **state)
{
    (void)state;
    const char *text = "The scheduler owns the block table, and the worker runs the kernels.";
    TokenizerIds ids;
    encode(text, &ids);
    const char *stops[] = {"zzzzz"};
    size_t lens[] = {5};
    struct output_text *o;
    assert_int_equal(output_text_new(tok, true, stops, lens, 1, &o), 0);
    size_t taken;
    assert_int_equal(push_all(o, ids.ids, ids.len, &taken), 0);
    size_t vis_len;
    const char *vis = output_text_visible(o, &vis_len);
    for (size_t i = 0; i < ids.len; i++) {
        char *own;
        size_t own_len;
        assert_int_equal(tokenizer_decode(tok, &ids.ids[i], 1, true, &own, &own_len), 0);
        size_t start = output_text_start(o, (uint32_t)i),
               end = output_text_start(o, (uint32_t)i + 1);
        assert_int_equal(end - start, own_len);
        assert_memory_equal(vis + start, own, own_len);
        free(own);
    }
    output_text_free(o);
    tokenizer_ids_fini(&ids);
}

/* The longest k < n such that t[0..len) ends with s[0..k). */
static size_t ends_with_prefix(const char *t, size_t len, const char *s, size_t n)
{
    for (size_t k = n - 1; k > 0; k--)
        if (k <= len && memcmp(t + len - k, s, k) == 0)
            return k;
    return 0;
}

/* After a push that took the text t[0..len) from before bytes to len: checks o against a brute
 * force. A stop string found at or after before - (its length - 1), the earliest beginning first,
 * must have cut the text there (stop says which); else the visible text is the most of t ever
 * shown (*shown) once the longest end of t that begins a stop string is held. Returns 1 when the
 * output stopped. */
static int check_push(const struct output_text *o, const char *t, size_t len, size_t before,
                      const char *const *stops, const size_t *lens, size_t num_stops, int stop,
                      size_t *shown)
{
    size_t begin = SIZE_MAX, vis_len;
    int want = 0;
    for (size_t i = 0; i < num_stops; i++) {
        size_t from = before >= lens[i] - 1 ? before - (lens[i] - 1) : 0;
        for (size_t p = from; p + lens[i] <= len; p++)
            if (memcmp(t + p, stops[i], lens[i]) == 0) {
                if (p < begin) {
                    begin = p;
                    want = (int)i + 1;
                }
                break;
            }
    }
    const char *vis = output_text_visible(o, &vis_len);
    if (want != 0) {
        assert_int_equal(stop, want);
        assert_int_equal(vis_len, begin);
        assert_memory_equal(vis, t, begin);
        return 1;
    }
    assert_int_equal(stop, 0);
    size_t hold = 0;
    for (size_t i = 0; i < num_stops; i++) {
        size_t h = ends_with_prefix(t, len, stops[i], lens[i]);
        hold = h > hold ? h : hold;
    }
    if (len - hold > *shown)
        *shown = len - hold;
    assert_int_equal(vis_len, *shown);
    assert_memory_equal(vis, t, *shown);
    return 0;
}

/* Random text over a three-letter alphabet, one byte token a letter, against random stop strings
 * over it (so that partial matches are frequent): after each token the visible text is what a
 * brute force says (everything but the longest end that begins a stop string), and a stop cuts
 * where the earliest stop string completed by that token begins. */
static void test_what_is_held_is_the_longest_beginning_of_a_stop(void **state)
{
    (void)state;
    uint32_t x = 777;
#define NEXT() (x = x * 1664525u + 1013904223u, x >> 8)
    for (int round = 0; round < 3000; round++) {
        char stop_buf[4][8];
        const char *stops[4];
        size_t lens[4], num_stops = 1 + NEXT() % 4;
        for (size_t i = 0; i < num_stops; i++) {
            lens[i] = 1 + NEXT() % 7;
            for (size_t k = 0; k < lens[i]; k++)
                stop_buf[i][k] = (char)('a' + NEXT() % 3);
            stops[i] = stop_buf[i];
        }
        struct output_text *o;
        assert_int_equal(output_text_new(tok, true, stops, lens, num_stops, &o), 0);
        char t[64];
        size_t len = 0, shown = 0;
        for (size_t step = 0; step < 48; step++) {
            t[len++] = (char)('a' + NEXT() % 3);
            int stop = 0;
            assert_int_equal(output_text_push(o, 6 + (unsigned char)t[len - 1], &stop), 0);
            if (check_push(o, t, len, len - 1, stops, lens, num_stops, stop, &shown))
                break;
        }
        output_text_free(o);
    }
#undef NEXT
}

/* The same against tokens of several characters (the test tokenizer's encoding of English), whose
 * new text may complete, begin and continue partial matches at once: stop strings are pieces of
 * the text, some with their last character changed so that they begin without completing. */
static void test_what_is_held_across_tokens_of_several_characters(void **state)
{
    (void)state;
    const char *text = "the router accepts the requests and the scheduler forms the batches "
                       "while the worker runs the kernels on the batches the scheduler forms";
    TokenizerIds ids;
    encode(text, &ids);
    size_t text_len = strlen(text);
    uint32_t x = 4242;
#define NEXT() (x = x * 1664525u + 1013904223u, x >> 8)
    for (int round = 0; round < 400; round++) {
        char stop_buf[3][9];
        const char *stops[3];
        size_t lens[3], num_stops = 1 + NEXT() % 3;
        for (size_t i = 0; i < num_stops; i++) {
            lens[i] = 2 + NEXT() % 7;
            size_t at = NEXT() % (text_len - lens[i]);
            memcpy(stop_buf[i], text + at, lens[i]);
            if (NEXT() % 2)
                stop_buf[i][lens[i] - 1] = '#'; /* begins, never completes */
            stops[i] = stop_buf[i];
        }
        struct output_text *o;
        assert_int_equal(output_text_new(tok, true, stops, lens, num_stops, &o), 0);
        size_t shown = 0, before = 0;
        for (size_t k = 0; k < ids.len; k++) {
            int stop = 0;
            assert_int_equal(output_text_push(o, ids.ids[k], &stop), 0);
            char *t;
            size_t len;
            assert_int_equal(tokenizer_decode(tok, ids.ids, k + 1, true, &t, &len), 0);
            int stopped = check_push(o, t, len, before, stops, lens, num_stops, stop, &shown);
            free(t);
            if (stopped)
                break;
            before = len;
        }
        output_text_free(o);
    }
#undef NEXT
    tokenizer_ids_fini(&ids);
}

static void test_stop_strings_are_checked(void **state)
{
    (void)state;
    struct output_text *o = NULL;
    const char *s1[] = {""};
    size_t l1[] = {0};
    assert_int_equal(output_text_new(tok, true, s1, l1, 1, &o), PAGODA_EINVAL);
    const char *s2[] = {"\xff\xfe"};
    size_t l2[] = {2};
    assert_int_equal(output_text_new(tok, true, s2, l2, 1, &o), PAGODA_EINVAL);
    char big[OUTPUT_TEXT_MAX_STOP_BYTES + 2];
    memset(big, 'a', sizeof(big));
    const char *s3[] = {big};
    size_t l3[] = {OUTPUT_TEXT_MAX_STOP_BYTES + 1};
    assert_int_equal(output_text_new(tok, true, s3, l3, 1, &o), PAGODA_ERANGE);
    const char *many[OUTPUT_TEXT_MAX_STOPS + 1];
    size_t ml[OUTPUT_TEXT_MAX_STOPS + 1];
    for (size_t i = 0; i <= OUTPUT_TEXT_MAX_STOPS; i++) {
        many[i] = "x";
        ml[i] = 1;
    }
    assert_int_equal(output_text_new(tok, true, many, ml, OUTPUT_TEXT_MAX_STOPS + 1, &o),
                     PAGODA_ERANGE);
    assert_null(o);
}

static void test_an_id_outside_the_tokenizer_adds_nothing(void **state)
{
    (void)state;
    struct output_text *o;
    assert_int_equal(output_text_new(tok, true, NULL, NULL, 0, &o), 0);
    /* an offset ahead of an output without tokens (a poll asking ahead) */
    assert_int_equal(output_text_start(o, 5), 0);
    int stop;
    assert_int_equal(output_text_push(o, 100000, &stop), 0);
    assert_int_equal(output_text_push(o, -1, &stop), 0);
    size_t len;
    output_text_visible(o, &len);
    assert_int_equal(len, 0);
    output_text_free(o);
}

/* The byte 0 token (id 6 in the test tokenizer) is text like any other: U+0000 is kept, counted
 * in the length, and what follows it is not lost. */
static void test_a_nul_is_text(void **state)
{
    (void)state;
    struct output_text *o;
    assert_int_equal(output_text_new(tok, true, NULL, NULL, 0, &o), 0);
    int stop;
    /* The byte tokens: 6 + the byte. */
    assert_int_equal(output_text_push(o, 6 + 'a', &stop), 0);
    assert_int_equal(output_text_push(o, 6, &stop), 0);
    assert_int_equal(output_text_push(o, 6 + 'b', &stop), 0);
    assert_int_equal(output_text_finish(o, &stop), 0);
    size_t len;
    const char *t = output_text_visible(o, &len);
    assert_int_equal(len, 3);
    assert_memory_equal(t, "a\0b", 3);
    output_text_free(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pieces_join_to_the_full_decode),
        cmocka_unit_test(test_a_stop_string_across_tokens_cuts_the_text),
        cmocka_unit_test(test_min_tokens_defers_stop_strings),
        cmocka_unit_test(test_a_kept_stop_string_ends_the_text),
        cmocka_unit_test(test_nothing_that_may_begin_a_stop_is_shown_until_finish),
        cmocka_unit_test(test_a_token_shows_its_own_text_when_it_may_begin_no_stop),
        cmocka_unit_test(test_what_is_held_is_the_longest_beginning_of_a_stop),
        cmocka_unit_test(test_what_is_held_across_tokens_of_several_characters),
        cmocka_unit_test(test_stop_strings_are_checked),
        cmocka_unit_test(test_an_id_outside_the_tokenizer_adds_nothing),
        cmocka_unit_test(test_a_nul_is_text),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
