/* Tests of tokenizer/: small hand-built tokenizer.json files, one per shape of model pagoda
 * serves (byte-level BPE as Llama 3 and Qwen, SentencePiece-style BPE with byte fallback as
 * Llama 2 and Mistral), and each component on its own: merges in both spellings and their
 * order, added tokens with each flag, normalizers, pre-tokenizers and their split behaviors,
 * the template, the decoders, lossy UTF-8, the stream, every refusal by name, invalid input.
 * The expected ids were checked against Hugging Face `tokenizers` (npm 0.23.2) loading the
 * same JSON. The comparison on the real files is tests/tokenizer/. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "tokenizer/tok_internal.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <utf8proc.h>

/* Llama 3's pre-tokenizer pattern. */
#define LLAMA3_REGEX                                                                               \
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "                     \
    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

#define META "\xE2\x96\x81" /* U+2581, SentencePiece's space */

/* ---- fixtures ---- */

/* GPT-2's byte map (written out here independently of the library): the character byte b
 * stands for, as UTF-8. */
static void byte_char(unsigned b, char out[3])
{
    unsigned cp = b;
    if (b <= 32)
        cp = 256 + b;
    else if (b >= 127 && b <= 160)
        cp = 289 + (b - 127);
    else if (b == 173)
        cp = 323;
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static json_t *added(int id, const char *content, bool special, bool normalized)
{
    return json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", content,
                     "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", normalized,
                     "special", special);
}

static json_t *template_bos(const char *bos, int id)
{
    json_t *single = json_pack("[{s:{s:s, s:i}}, {s:{s:s, s:i}}]", "SpecialToken", "id", bos,
                               "type_id", 0, "Sequence", "id", "A", "type_id", 0);
    json_t *pair = json_deep_copy(single);
    json_array_append_new(pair, json_pack("{s:{s:s, s:i}}", "Sequence", "id", "B", "type_id", 1));
    return json_pack("{s:s, s:o, s:o, s:{s:{s:s, s:[i], s:[s]}}}", "type", "TemplateProcessing",
                     "single", single, "pair", pair, "special_tokens", bos, "id", bos, "ids", id,
                     "tokens", bos);
}

/* Byte-level, like Llama 3: the 256 byte characters are ids 0-255 (id == byte), then
 * Ġt 256, he 257, Ġthe 258, ll 259, llo 260, aa 261, 12 262; <|bos|> 263 and <|eot|> 264 are
 * special added tokens, and the tests' added tokens take 265 and 266. merges_as_pairs picks the
 * JSON spelling of the merges. */
static json_t *bytelevel_fixture(bool merges_as_pairs)
{
    json_t *vocab = json_object();
    for (unsigned b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    const char *extra[] = {"\xC4\xA0t", "he", "\xC4\xA0the", "ll", "llo", "aa", "12"};
    for (int i = 0; i < 7; i++)
        json_object_set_new(vocab, extra[i], json_integer(256 + i));
    const char *merges[][2] = {{"\xC4\xA0", "t"}, {"h", "e"}, {"\xC4\xA0t", "he"}, {"l", "l"},
                               {"ll", "o"},       {"a", "a"}, {"1", "2"}};
    json_t *m = json_array();
    for (int i = 0; i < 7; i++) {
        if (merges_as_pairs) {
            json_array_append_new(m, json_pack("[s, s]", merges[i][0], merges[i][1]));
        } else {
            char s[32];
            snprintf(s, sizeof(s), "%s %s", merges[i][0], merges[i][1]);
            json_array_append_new(m, json_string(s));
        }
    }
    json_t *root = json_object();
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens",
                        json_pack("[o, o]", added(263, "<|bos|>", true, false),
                                  added(264, "<|eot|>", true, false)));
    json_object_set_new(root, "normalizer", json_null());
    json_object_set_new(root, "pre_tokenizer",
                        json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]}",
                                  "type", "Sequence", "pretokenizers", "type", "Split", "pattern",
                                  "Regex", LLAMA3_REGEX, "behavior", "Isolated", "invert", 0,
                                  "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 1,
                                  "use_regex", 0));
    json_object_set_new(root, "post_processor", template_bos("<|bos|>", 263));
    json_object_set_new(root, "decoder",
                        json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space",
                                  1, "trim_offsets", 1, "use_regex", 1));
    json_object_set_new(root, "model",
                        json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type",
                                  "BPE", "dropout", "unk_token", "continuing_subword_prefix",
                                  "end_of_word_suffix", "fuse_unk", 0, "byte_fallback", 0,
                                  "ignore_merges", 0, "vocab", vocab, "merges", m));
    return root;
}

/* SentencePiece-style, like Llama 2: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3-258, ▁ 259, a 260,
 * b 261, ▁a 262, ▁b 263, ab 264, ▁ab 265, ba 266, bb 267; Prepend ▁ and Replace " " -> ▁
 * normalizers, no pre-tokenizer, byte fallback, and Llama 2's decoder chain. */
static json_t *sentencepiece_fixture(void)
{
    json_t *vocab = json_object();
    json_object_set_new(vocab, "<unk>", json_integer(0));
    json_object_set_new(vocab, "<s>", json_integer(1));
    json_object_set_new(vocab, "</s>", json_integer(2));
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof(s), "<0x%02X>", b);
        json_object_set_new(vocab, s, json_integer(3 + b));
    }
    const char *extra[] = {META, "a", "b", (META "a"), (META "b"), "ab", (META "ab"), "ba", "bb"};
    for (int i = 0; i < 9; i++)
        json_object_set_new(vocab, extra[i], json_integer(259 + i));
    json_t *m =
        json_pack("[s, s, s, s, s, s]", META " a", META " b", "a b", META "a b", "b a", "b b");
    json_t *root = json_object();
    json_object_set_new(root, "version", json_string("1.0"));
    json_object_set_new(root, "truncation", json_null());
    json_object_set_new(root, "padding", json_null());
    json_object_set_new(root, "added_tokens",
                        json_pack("[o, o, o]", added(0, "<unk>", true, false),
                                  added(1, "<s>", true, false), added(2, "</s>", true, false)));
    json_object_set_new(root, "normalizer",
                        json_pack("{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}", "type", "Sequence",
                                  "normalizers", "type", "Prepend", "prepend", META, "type",
                                  "Replace", "pattern", "String", " ", "content", META));
    json_object_set_new(root, "pre_tokenizer", json_null());
    json_object_set_new(root, "post_processor", template_bos("<s>", 1));
    json_object_set_new(
        root, "decoder",
        json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]}", "type",
                  "Sequence", "decoders", "type", "Replace", "pattern", "String", META, "content",
                  " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip", "content", " ",
                  "start", 1, "stop", 0));
    json_object_set_new(root, "model",
                        json_pack("{s:s, s:n, s:s, s:n, s:n, s:b, s:b, s:o, s:o}", "type", "BPE",
                                  "dropout", "unk_token", "<unk>", "continuing_subword_prefix",
                                  "end_of_word_suffix", "fuse_unk", 1, "byte_fallback", 1, "vocab",
                                  vocab, "merges", m));
    return root;
}

/* Sets root[a][b]... = v (a path of object keys, NULL-terminated); takes v. */
static void set_path(json_t *root, json_t *v, ...)
{
    va_list ap;
    va_start(ap, v);
    json_t *o = root;
    const char *key = va_arg(ap, const char *);
    for (const char *next; (next = va_arg(ap, const char *)) != NULL; key = next)
        o = json_object_get(o, key);
    va_end(ap);
    json_object_set_new(o, key, v);
}

/* Builds a tokenizer from root (released); fails the test if it does not load. */
static Tokenizer *load(json_t *root)
{
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    assert_non_null(s);
    Tokenizer *t = NULL;
    int rc = tokenizer_new_from_json(s, strlen(s), &t);
    if (rc)
        fail_msg("tokenizer did not load: %s (%s)", pagoda_strerror(rc), pagoda_error_detail());
    free(s);
    return t;
}

/* Loading root must fail with code, the detail naming needle1 and needle2 (when not NULL). */
static void refused(json_t *root, int code, const char *needle1, const char *needle2)
{
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    Tokenizer *t = NULL;
    int rc = tokenizer_new_from_json(s, strlen(s), &t);
    free(s);
    if (rc != code || !strstr(pagoda_error_detail(), needle1) ||
        (needle2 && !strstr(pagoda_error_detail(), needle2)))
        fail_msg("expected %s naming \"%s\", got %d: %s", pagoda_strerror(code), needle1, rc,
                 pagoda_error_detail());
    assert_null(t);
}

/* Encodes text and compares with the expected ids (n of them). */
static void expect_ids(const Tokenizer *t, const char *text, bool special, const int32_t *want,
                       size_t n)
{
    TokenizerIds ids = {0};
    int rc = tokenizer_encode(t, text, strlen(text), special, &ids);
    if (rc)
        fail_msg("encode \"%s\": %s (%s)", text, pagoda_strerror(rc), pagoda_error_detail());
    bool same = ids.len == n && (n == 0 || memcmp(ids.ids, want, n * sizeof(*want)) == 0);
    if (!same) {
        char got[512] = "";
        for (size_t i = 0; i < ids.len && strlen(got) < 480; i++)
            snprintf(got + strlen(got), sizeof(got) - strlen(got), "%d ", ids.ids[i]);
        fail_msg("encode \"%s\": got [%s], want %zu ids", text, got, n);
    }
    tokenizer_ids_fini(&ids);
}

#define EXPECT(t, text, special, ...)                                                              \
    do {                                                                                           \
        const int32_t want_[] = {__VA_ARGS__};                                                     \
        expect_ids(t, text, special, want_, sizeof(want_) / sizeof(want_[0]));                     \
    } while (0)

static char *decode(const Tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    char *text = NULL;
    size_t len = 0;
    int rc = tokenizer_decode(t, ids, n, skip, &text, &len);
    if (rc)
        fail_msg("decode: %s (%s)", pagoda_strerror(rc), pagoda_error_detail());
    assert_int_equal(strlen(text), len);
    return text;
}

#define EXPECT_DECODE(t, skip, want, ...)                                                          \
    do {                                                                                           \
        const int32_t ids_[] = {__VA_ARGS__};                                                      \
        char *got_ = decode(t, ids_, sizeof(ids_) / sizeof(ids_[0]), skip);                        \
        assert_string_equal(got_, want);                                                           \
        free(got_);                                                                                \
    } while (0)

/* Whether s[0..n) is whole, valid UTF-8 (checked here without the library). */
static bool valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i], k;
        if (c < 0x80)
            k = 0;
        else if (c >= 0xC2 && c < 0xE0)
            k = 1;
        else if (c >= 0xE0 && c < 0xF0)
            k = 2;
        else if (c >= 0xF0 && c < 0xF5)
            k = 3;
        else
            return false;
        if (i + k >= n && k > 0)
            return false;
        for (unsigned j = 1; j <= k; j++)
            if ((p[i + j] & 0xC0) != 0x80)
                return false;
        i += k + 1;
    }
    return true;
}

/* Streams ids: every delta whole UTF-8, the deltas joined equal to tokenizer_decode; returns
 * the deltas, one per id and the finish, joined by '|' (for tests that check where text comes
 * out). */
static char *stream_deltas(const Tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    TokenizerStream *s = NULL;
    assert_int_equal(tokenizer_stream_new(t, skip, &s), 0);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    char marks[1024] = "";
    for (size_t i = 0; i <= n; i++) {
        size_t before = len;
        int rc = i < n ? tokenizer_stream_step(s, ids[i], &buf, &len, &cap)
                       : tokenizer_stream_finish(s, &buf, &len, &cap);
        assert_int_equal(rc, 0);
        assert_int_equal(buf[len], 0);
        assert_true(valid_utf8(buf + before, len - before));
        snprintf(marks + strlen(marks), sizeof(marks) - strlen(marks), "%s%.*s", i ? "|" : "",
                 (int)(len - before), buf + before);
    }
    char *full = decode(t, ids, n, skip);
    assert_int_equal(len, strlen(full));
    assert_memory_equal(buf, full, len);
    free(full);
    free(buf);
    tokenizer_stream_free(s);
    return strdup(marks);
}

#define EXPECT_STREAM(t, skip, want, ...)                                                          \
    do {                                                                                           \
        const int32_t ids_[] = {__VA_ARGS__};                                                      \
        char *got_ = stream_deltas(t, ids_, sizeof(ids_) / sizeof(ids_[0]), skip);                 \
        assert_string_equal(got_, want);                                                           \
        free(got_);                                                                                \
    } while (0)

/* ---- the BPE model ---- */

static void test_bytelevel_merges_in_both_spellings(void **state)
{
    for (int pairs = 0; pairs < 2; pairs++) {
        Tokenizer *t = load(bytelevel_fixture(pairs));
        EXPECT(t, "the hello", false, 116, 257, 32, 257, 260);
        EXPECT(t, " the", false, 258);
        EXPECT(t, "the", true, 263, 116, 257);
        /* equal ranks: the leftmost pair first */
        EXPECT(t, "aaa", false, 261, 97);
        EXPECT(t, "aaaa", false, 261, 261);
        /* a character outside ASCII: its bytes' characters */
        EXPECT(t, "\xC3\xA9", false, 195, 169);
        EXPECT(t, "", true, 263);
        EXPECT(t, "", false);
        tokenizer_free(t);
    }
}

static void test_ignore_merges_takes_whole_words(void **state)
{
    json_t *root = bytelevel_fixture(true);
    json_object_set_new(json_object_get(json_object_get(root, "model"), "vocab"), "hel",
                        json_integer(263));
    set_path(root, json_true(), "model", "ignore_merges", NULL);
    Tokenizer *t = load(root);
    EXPECT(t, "hel", false, 263); /* merges would give he l */
    EXPECT(t, "hell", false, 257, 259);
    tokenizer_free(t);
}

static void test_byte_fallback_and_unknown(void **state)
{
    Tokenizer *t = load(sentencepiece_fixture());
    EXPECT(t, "ab", true, 1, 265);
    EXPECT(t, "a b", false, 262, 263);
    EXPECT(t, "a\xC3\xA9", false, 262, 3 + 0xC3, 3 + 0xA9);
    EXPECT(t, "", true, 1);
    EXPECT_DECODE(t, false, "a\xC3\xA9", 262, 3 + 0xC3, 3 + 0xA9);
    /* a run of byte tokens that is not UTF-8: one U+FFFD per byte */
    EXPECT_DECODE(t, false, "a\xEF\xBF\xBD", 262, 3 + 0xC3);
    EXPECT_DECODE(t, false, "\xEF\xBF\xBD\xEF\xBF\xBD b", 3 + 'A', 3 + 0xFF, 263);
    EXPECT_DECODE(t, false, "<s> ab", 1, 265);
    EXPECT_DECODE(t, true, "ab", 1, 265);
    tokenizer_free(t);

    /* without byte fallback: the unknown token, consecutive ones fused with fuse_unk */
    for (int fuse = 0; fuse < 2; fuse++) {
        json_t *root = sentencepiece_fixture();
        set_path(root, json_false(), "model", "byte_fallback", NULL);
        set_path(root, json_boolean(fuse), "model", "fuse_unk", NULL);
        t = load(root);
        if (fuse)
            EXPECT(t,
                   "a\xE2\x82\xAC\xE2\x82\xAC"
                   "b",
                   false, 262, 0, 261);
        else
            EXPECT(t,
                   "a\xE2\x82\xAC\xE2\x82\xAC"
                   "b",
                   false, 262, 0, 0, 261);
        tokenizer_free(t);
    }
}

/* A word none of whose characters the model knows (no byte fallback, no unknown token) has no
 * ids, from the merges and then from the cache (found by fuzz_tokenizer: UBSan saw the empty id
 * list's NULL pointer offset). */
static void test_word_without_ids(void **state)
{
    json_t *root = sentencepiece_fixture();
    set_path(root, json_null(), "normalizer", NULL);
    set_path(root, json_false(), "model", "byte_fallback", NULL);
    set_path(root, json_null(), "model", "unk_token", NULL);
    Tokenizer *t = load(root);
    for (int i = 0; i < 2; i++) {
        TokenizerIds ids = {0};
        assert_int_equal(tokenizer_encode(t, "\xE2\x82\xAC", 3, false, &ids), 0);
        assert_int_equal(ids.len, 0);
        tokenizer_ids_fini(&ids);
    }
    EXPECT(t,
           "a\xE2\x82\xAC"
           "b",
           false, 264); /* the unknown character is dropped */
    tokenizer_free(t);
}

static void test_long_word_is_not_quadratic(void **state)
{
    /* 256 KiB without a break: one word of the byte-level model, and the whole text is one word
     * of the SentencePiece one (it has no pre-tokenizer). A rescan per merge would take far
     * longer than the test's timeout. */
    size_t n = 256u << 10;
    char *text = malloc(n + 1);
    memset(text, 'a', n);
    text[n] = 0;
    Tokenizer *t = load(bytelevel_fixture(true));
    TokenizerIds ids = {0};
    assert_int_equal(tokenizer_encode(t, text, n, false, &ids), 0);
    assert_int_equal(ids.len, n / 2);
    for (size_t i = 0; i < ids.len; i++)
        assert_int_equal(ids.ids[i], 261);
    tokenizer_free(t);
    t = load(sentencepiece_fixture());
    for (size_t i = 0; i < n; i += 2)
        text[i] = 'b';
    ids.len = 0;
    assert_int_equal(tokenizer_encode(t, text, n, false, &ids), 0);
    /* "▁baba...ba": ▁b, then ab (rank 2) before ba (rank 4), the last a alone */
    assert_int_equal(ids.len, n / 2 + 1);
    assert_int_equal(ids.ids[0], 263);
    for (size_t i = 1; i < n / 2; i++)
        assert_int_equal(ids.ids[i], 264);
    assert_int_equal(ids.ids[n / 2], 260);
    tokenizer_ids_fini(&ids);
    tokenizer_free(t);
    free(text);
}

/* A SentencePiece-style model encodes a long text (one word: no pre-tokenizer) piece by piece,
 * cut before each run of U+2581, only when no token of its vocabulary could join across such a
 * cut; a vocabulary with "a▁" (merged first) must see the whole word. */
static void test_sentencepiece_long_text(void **state)
{
    char text[256] = "";
    for (int i = 0; i < 40; i++)
        strcat(text, i ? " ab" : "ab");
    Tokenizer *t = load(sentencepiece_fixture());
    int32_t want[40];
    for (int i = 0; i < 40; i++)
        want[i] = 265; /* ▁ab */
    expect_ids(t, text, false, want, 40);
    tokenizer_free(t);

    json_t *root = sentencepiece_fixture();
    json_object_set_new(json_object_get(json_object_get(root, "model"), "vocab"), "a" META,
                        json_integer(268));
    json_array_insert_new(json_object_get(json_object_get(root, "model"), "merges"), 0,
                          json_string("a " META));
    t = load(root);
    memset(text, 0, sizeof(text));
    for (int i = 0; i < 30; i++)
        strcat(text, i ? " a" : "a");
    int32_t want2[31];
    want2[0] = 259; /* ▁, then a▁ 29 times, then a */
    for (int i = 1; i < 30; i++)
        want2[i] = 268;
    want2[30] = 260;
    expect_ids(t, text, false, want2, 31);
    tokenizer_free(t);
}

/* ---- added tokens ---- */

static json_t *with_added(json_t *root, int id, const char *content, const char *flag, bool special,
                          bool normalized)
{
    json_t *a = added(id, content, special, normalized);
    if (flag)
        json_object_set_new(a, flag, json_true());
    json_array_append_new(json_object_get(root, "added_tokens"), a);
    return root;
}

static void test_added_tokens_and_their_flags(void **state)
{
    Tokenizer *t = load(bytelevel_fixture(true));
    EXPECT(t, "<|bos|>the<|eot|>", false, 263, 116, 257, 264);
    EXPECT(t, "x<|bos|><|bos|>", false, 120, 263, 263);
    EXPECT(t, "<|bo", false, 60, 124, 98, 111); /* a prefix is text */
    tokenizer_free(t);

    t = load(with_added(bytelevel_fixture(true), 265, "<m>", NULL, false, false));
    EXPECT(t, "a <m>b", false, 97, 32, 265, 98);
    EXPECT(t, "a<m> b", false, 97, 265, 32, 98);
    tokenizer_free(t);
    t = load(with_added(bytelevel_fixture(true), 265, "<m>", "lstrip", false, false));
    EXPECT(t, "a \t<m>b", false, 97, 265, 98);
    tokenizer_free(t);
    t = load(with_added(bytelevel_fixture(true), 265, "<m>", "rstrip", false, false));
    EXPECT(t, "a<m> \n b", false, 97, 265, 98);
    tokenizer_free(t);
    /* Whitespace tokens with lstrip and rstrip: the "\n" inside the first one's rstrip is
     * matched again with an empty span, which HF drops (as it drops every empty split) */
    json_t *ws = with_added(bytelevel_fixture(true), 265, "\n", "lstrip", false, false);
    with_added(ws, 266, " ", "lstrip", false, false);
    json_t *list = json_object_get(ws, "added_tokens");
    for (size_t i = 2; i < 4; i++)
        json_object_set_new(json_array_get(list, i), "rstrip", json_true());
    t = load(ws);
    EXPECT(t, "a\n\nb", false, 97, 265, 98);
    EXPECT(t, "a\n\n\n\nb", false, 97, 265, 98);
    EXPECT(t, "a   b", false, 97, 266, 98);
    EXPECT(t, "a \n b", false, 97, 266, 98);
    tokenizer_free(t);

    /* single_word: only where no letter or digit touches it */
    t = load(with_added(bytelevel_fixture(true), 265, "ab", "single_word", false, false));
    EXPECT(t, "ab c", false, 265, 32, 99);
    EXPECT(t, "x ab", false, 120, 32, 265);
    EXPECT(t, "xab", false, 120, 97, 98);
    EXPECT(t, "ab1", false, 97, 98, 49);
    /* HF tests \w (the regex crate's): a combining mark is a word character, a numeral that
     * is not a decimal digit (Kaktovik U+1D2C0) is not */
    EXPECT(t,
           "e\xCC\x81"
           "ab",
           false, 101, 204, 129, 97, 98);
    EXPECT(t, "ab\xF0\x9D\x8B\x80", false, 265, 240, 157, 139, 128);
    EXPECT(t, "_ab", false, 95, 97, 98);
    tokenizer_free(t);

    /* normalized: matched in the normalized text (by its normalized content); not normalized:
     * in the raw text */
    json_t *root = bytelevel_fixture(true);
    set_path(root, json_pack("{s:s}", "type", "Lowercase"), "normalizer", NULL);
    with_added(root, 265, "HI", NULL, false, true);
    with_added(root, 266, "YO", NULL, false, false);
    t = load(root);
    EXPECT(t, "HI", false, 265);
    EXPECT(t, "hi", false, 265);
    EXPECT(t, "YO", false, 266);
    EXPECT(t, "yo", false, 121, 111);
    EXPECT(t, "Yo", false, 121, 111);
    assert_false(tokenizer_is_special(t, 265));
    assert_true(tokenizer_is_special(t, 263));
    /* skip_special_tokens drops the special ones only; a normalized token decodes to its
     * normalized content, as in HF */
    EXPECT_DECODE(t, true, "hihit", 263, 104, 105, 265, 116, 264);
    EXPECT_DECODE(t, false, "<|bos|>hihit<|eot|>", 263, 104, 105, 265, 116, 264);
    assert_string_equal(tokenizer_id_to_token(t, 265), "hi");
    assert_int_equal(tokenizer_token_to_id(t, "HI"), 265);
    tokenizer_free(t);
}

static void test_lookups(void **state)
{
    Tokenizer *t = load(bytelevel_fixture(true));
    assert_int_equal(tokenizer_vocab_size(t), 265);
    assert_int_equal(tokenizer_token_to_id(t, "<|eot|>"), 264);
    assert_int_equal(tokenizer_token_to_id(t, "\xC4\xA0the"), 258);
    assert_int_equal(tokenizer_token_to_id(t, "nope"), -1);
    assert_string_equal(tokenizer_id_to_token(t, 258), "\xC4\xA0the");
    assert_string_equal(tokenizer_id_to_token(t, 263), "<|bos|>");
    assert_null(tokenizer_id_to_token(t, 265));
    assert_null(tokenizer_id_to_token(t, -1));
    tokenizer_free(t);
}

/* HF takes an added token's id from the vocabulary when its content is there, else the next
 * id after the vocabulary and the added tokens before it; the "id" written in the file is not
 * read (HF only warns when it differs). */
static void test_added_token_ids_are_assigned_as_hf_does(void **state)
{
    json_t *root = bytelevel_fixture(true);
    with_added(root, 999, "<x>", NULL, false, false);
    with_added(root, 5, "he", NULL, true, false);
    with_added(root, 3, "<y>", NULL, false, false);
    Tokenizer *t = load(root);
    EXPECT(t, "<x>he<y>", false, 265, 257, 266);
    assert_int_equal(tokenizer_vocab_size(t), 267);
    assert_true(tokenizer_is_special(t, 257));
    assert_string_equal(tokenizer_id_to_token(t, 266), "<y>");
    assert_null(tokenizer_id_to_token(t, 999));
    assert_string_equal(tokenizer_id_to_token(t, 5), "\xC4\x85"); /* byte 5's character */
    EXPECT_DECODE(t, true, "<x><y>", 265, 257, 266);
    tokenizer_free(t);
}

/* ---- normalizers and pre-tokenizers ---- */

static void test_normalizers(void **state)
{
    struct {
        const char *type;
        const char *text;
        int32_t want[4];
        size_t n;
    } cases[] = {
        {"NFC", "e\xCC\x81", {195, 169}, 2},      {"NFD", "\xC3\xA9", {101, 204, 129}, 3},
        {"NFKC", "\xEF\xAC\x81", {102, 105}, 2}, /* U+FB01 ﬁ */
        {"NFKD", "\xEF\xAC\x81", {102, 105}, 2},  {"Lowercase", "AB", {97, 98}, 2},
        {"Lowercase", "\xC3\x89", {195, 169}, 2}, /* É */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *root = bytelevel_fixture(true);
        set_path(root, json_pack("{s:s}", "type", cases[i].type), "normalizer", NULL);
        Tokenizer *t = load(root);
        expect_ids(t, cases[i].text, false, cases[i].want, cases[i].n);
        tokenizer_free(t);
    }
    /* Prepend and Replace: the SentencePiece fixture's pair */
    Tokenizer *t = load(sentencepiece_fixture());
    EXPECT(t, " a", false, 259, 262);
    tokenizer_free(t);
}

static void test_split_behaviors(void **state)
{
    struct {
        const char *behavior;
        bool invert;
        const char *text;
        int32_t want[4];
        size_t n;
        const char *regex; /* a Regex pattern in place of the String "b" */
    } cases[] = {
        {"Removed", false, "abab", {260, 260}, 2, NULL},
        {"Isolated", false, "abab", {260, 261, 260, 261}, 4, NULL},
        {"MergedWithPrevious", false, "abab", {264, 264}, 2, NULL},
        {"MergedWithNext", false, "abab", {260, 266, 261}, 3, NULL},
        {"Contiguous", false, "abba", {260, 267, 260}, 3, NULL},
        {"Isolated", false, "abba", {260, 261, 261, 260}, 4, NULL},
        {"Removed", true, "abab", {261, 261}, 2, NULL},
        /* a regex that matches empty: Oniguruma skips the "" right after "aa", so the b is
         * not a word of its own */
        {"MergedWithNext", false, "aab", {260, 264}, 2, "a*"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *root = sentencepiece_fixture();
        set_path(root, json_null(), "normalizer", NULL);
        set_path(root,
                 json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern",
                           cases[i].regex ? "Regex" : "String",
                           cases[i].regex ? cases[i].regex : "b", "behavior", cases[i].behavior,
                           "invert", cases[i].invert),
                 "pre_tokenizer", NULL);
        Tokenizer *t = load(root);
        expect_ids(t, cases[i].text, false, cases[i].want, cases[i].n);
        tokenizer_free(t);
    }
}

/* A pre-tokenizer regex that backtracks without end on a text refuses it with PCRE2's reason
 * and where, not only its error number ("PCRE2 error -47"). */
static void test_regex_match_limit_is_named(void **state)
{
    (void)state;
    json_t *root = sentencepiece_fixture();
    set_path(root, json_null(), "normalizer", NULL);
    set_path(root,
             json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex", "(a|aa)+$",
                       "behavior", "Isolated", "invert", false),
             "pre_tokenizer", NULL);
    Tokenizer *t = load(root);
    char text[64];
    memset(text, 'a', 60);
    text[60] = 'b';
    TokenizerIds ids = {0};
    assert_int_equal(tokenizer_encode(t, text, 61, false, &ids), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "limit"));
    assert_non_null(strstr(pagoda_error_detail(), "at byte 0 of 61"));
    tokenizer_ids_fini(&ids);
    tokenizer_free(t);
}

/* HF's regexes see Unicode 16.0 (Oniguruma), PCRE2 here Unicode 14.0: a character added since
 * is in its class to the pattern (CJK extension H U+31350 a letter, Kaktovik numeral U+1D2C0 a
 * digit, U+1FA75 a symbol, Kawi's U+11F00 a mark, Balinese U+1B7F punctuation, U+1C89 an
 * uppercase letter), U+1171E is Mc and no longer Mn, U+3001 is not Han, and U+180E is not
 * whitespace. */
static void test_regex_classes_follow_hf_unicode(void **state)
{
    struct {
        const char *pattern;
        const char *text;
        int32_t want[6];
        size_t n;
    } cases[] = {
        {"\\p{L}+",
         "a\xF0\xB1\x8D\x90"
         "b",
         {0},
         0},
        {"[^\\p{L}]+",
         "a\xF0\xB1\x8D\x90"
         "b",
         {260, 3 + 0xF0, 3 + 0xB1, 3 + 0x8D, 3 + 0x90, 261},
         6},
        {"\\p{N}", "\xF0\x9D\x8B\x80", {0}, 0},
        {"\\s",
         "a\xE1\xA0\x8E"
         "b",
         {260, 3 + 0xE1, 3 + 0xA0, 3 + 0x8E, 261},
         5},
        {"[\\s]", "a\xE1\xA0\x8E", {260, 3 + 0xE1, 3 + 0xA0, 3 + 0x8E}, 4},
        {"\\S+", "a\xE1\xA0\x8E", {0}, 0},
        {"\\p{S}",
         "a\xF0\x9F\xA9\xB5"
         "b",
         {260, 261},
         2},
        {"\\P{S}+",
         "a\xF0\x9F\xA9\xB5"
         "b",
         {3 + 0xF0, 3 + 0x9F, 3 + 0xA9, 3 + 0xB5},
         4},
        /* the probe's: DeepSeek-V3's pattern has [^\r\n\p{L}\p{P}\p{S}] and [\p{L}\p{M}] */
        {"[^\\p{M}\\p{S}]+", "a\xF0\x9F\xA9\xB5", {3 + 0xF0, 3 + 0x9F, 3 + 0xA9, 3 + 0xB5}, 4},
        {"\\p{M}",
         "a\xF0\x91\xBC\x80"
         "b",
         {260, 261},
         2},
        {"[\\p{P}]",
         "a\xE1\xAD\xBF"
         "b",
         {260, 261},
         2},
        {"\\p{Lu}",
         "a\xE1\xB2\x89"
         "b",
         {260, 261},
         2},
        {"\\p{Mn}", "a\xCC\x81\xF0\x91\x9C\x9E", {260, 3 + 0xF0, 3 + 0x91, 3 + 0x9C, 3 + 0x9E}, 5},
        /* 、 is in Han's Script_Extensions (PCRE2's \p{Han}), not in its Script (HF's) */
        {"\\p{Han}",
         "a\xE3\x80\x81\xE4\xB8\x80"
         "b",
         {260, 3 + 0xE3, 3 + 0x80, 3 + 0x81, 261},
         5},
        {"[\\p{Mc}]",
         "a\xF0\x91\x9C\x9E"
         "b",
         {260, 261},
         2},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *root = sentencepiece_fixture();
        set_path(root, json_null(), "normalizer", NULL);
        set_path(root,
                 json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "Regex",
                           cases[i].pattern, "behavior", "Removed", "invert", 0),
                 "pre_tokenizer", NULL);
        Tokenizer *t = load(root);
        expect_ids(t, cases[i].text, false, cases[i].want, cases[i].n);
        tokenizer_free(t);
    }
}

static void test_bytelevel_pretokenizer_regex_and_prefix_space(void **state)
{
    json_t *root = bytelevel_fixture(true);
    set_path(root,
             json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", 1,
                       "trim_offsets", 0, "use_regex", 1),
             "pre_tokenizer", NULL);
    Tokenizer *t = load(root);
    EXPECT(t, "the", false, 258);                     /* " the" */
    EXPECT(t, "he  he", false, 32, 257, 32, 32, 257); /* " he", " ", " he" */
    tokenizer_free(t);
}

static void test_digits(void **state)
{
    for (int individual = 0; individual < 2; individual++) {
        json_t *root = bytelevel_fixture(true);
        set_path(root,
                 json_pack("{s:s, s:[{s:s, s:b}, {s:s, s:b, s:b, s:b}]}", "type", "Sequence",
                           "pretokenizers", "type", "Digits", "individual_digits", individual,
                           "type", "ByteLevel", "add_prefix_space", 0, "trim_offsets", 0,
                           "use_regex", 0),
                 "pre_tokenizer", NULL);
        Tokenizer *t = load(root);
        if (individual)
            EXPECT(t, "a12", false, 97, 49, 50);
        else
            EXPECT(t, "a12", false, 97, 262);
        tokenizer_free(t);
    }
}

static json_t *metaspace_fixture(const char *scheme, bool split)
{
    json_t *root = sentencepiece_fixture();
    set_path(root, json_null(), "normalizer", NULL);
    set_path(root,
             json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", META,
                       "prepend_scheme", scheme, "split", split),
             "pre_tokenizer", NULL);
    set_path(root,
             json_pack("{s:s, s:s, s:s, s:b}", "type", "Metaspace", "replacement", META,
                       "prepend_scheme", scheme, "split", split),
             "decoder", NULL);
    return root;
}

static void test_metaspace(void **state)
{
    Tokenizer *t = load(metaspace_fixture("always", true));
    EXPECT(t, "a b", false, 262, 263);
    EXPECT(t, "<s>a b", false, 1, 262, 263);
    EXPECT(t, "ba", false, 263, 260);
    EXPECT_DECODE(t, false, "a b", 262, 263);
    EXPECT_DECODE(t, false, "a", 259, 260); /* the first token's ▁ is dropped */
    EXPECT_DECODE(t, false, "b a", 261, 259, 260);
    tokenizer_free(t);
    t = load(metaspace_fixture("first", true));
    EXPECT(t, "a b", false, 262, 263);
    EXPECT(t, "<s>a b", false, 1, 260, 263); /* not at the start of the text: no ▁ */
    tokenizer_free(t);
    t = load(metaspace_fixture("never", true));
    EXPECT(t, "a b", false, 260, 263);
    EXPECT_DECODE(t, false, " a b", 262, 263);
    tokenizer_free(t);
    t = load(metaspace_fixture("always", false));
    EXPECT(t, "ab", false, 265);
    EXPECT(t, "a b", false, 262, 263);
    tokenizer_free(t);
}

/* ---- decoders ---- */

static void test_decoders(void **state)
{
    /* no decoder: the tokens joined by spaces */
    json_t *root = sentencepiece_fixture();
    set_path(root, json_null(), "decoder", NULL);
    Tokenizer *t = load(root);
    EXPECT_DECODE(t, false, "a b " META "a", 260, 261, 262);
    EXPECT_DECODE(t, false, "<unk>", 0);
    tokenizer_free(t);

    /* Strip per token (no Fuse before it), and Replace */
    root = sentencepiece_fixture();
    set_path(root,
             json_pack("{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s, s:s, s:i, s:i}]}", "type", "Sequence",
                       "decoders", "type", "Replace", "pattern", "String", META "a", "content", "A",
                       "type", "Strip", "content", "b", "start", 1, "stop", 1),
             "decoder", NULL);
    t = load(root);
    EXPECT_DECODE(t, false, "AaA" META, 262, 264, 262, 259);
    EXPECT_DECODE(t, false, "a" META, 260, 263);
    tokenizer_free(t);
}

/* No ids, or only skipped ones: an empty, NUL-terminated text (found by fuzz_tokenizer: the
 * buffer was returned without its NUL). */
static void test_decode_of_nothing_is_an_empty_string(void **state)
{
    Tokenizer *t = load(bytelevel_fixture(true));
    for (int round = 0; round < 50; round++) {
        char *junk = malloc(16); /* freed chunks of the same size, for decode's buffer to reuse */
        memset(junk, 'x', 16);
        free(junk);
        int32_t special[] = {263, 264};
        char *text = NULL;
        size_t len = 99;
        assert_int_equal(tokenizer_decode(t, special, round % 2 ? 2 : 0, true, &text, &len), 0);
        assert_int_equal(len, 0);
        assert_int_equal(text[0], 0);
        free(text);
    }
    tokenizer_free(t);
}

static void test_lossy_utf8(void **state)
{
    Tokenizer *t = load(bytelevel_fixture(true));
    /* ids are bytes: Rust's from_utf8_lossy, one U+FFFD per maximal subpart */
    EXPECT_DECODE(t, false,
                  "\xEF\xBF\xBD"
                  "A",
                  0xF0, 0x9F, 0x98, 'A');
    EXPECT_DECODE(t, false, "\xEF\xBF\xBD\xEF\xBF\xBD", 0xE0, 0x80);
    EXPECT_DECODE(t, false, "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD", 0xED, 0xA0, 0x80);
    EXPECT_DECODE(t, false, "\xEF\xBF\xBD", 0xF0, 0x9F, 0x98);
    EXPECT_DECODE(t, false,
                  "\xEF\xBF\xBD"
                  "a",
                  0xFF, 'a');
    EXPECT_DECODE(t, false, "\xF0\x9F\x98\x80", 0xF0, 0x9F, 0x98, 0x80);
    tokenizer_free(t);
}

/* ---- the stream ---- */

static void test_stream_never_splits_a_character(void **state)
{
    Tokenizer *t = load(bytelevel_fixture(true));
    /* é as two byte tokens, then an emoji as four: nothing until the character is whole */
    EXPECT_STREAM(t, false, "|\xC3\xA9|a||||\xF0\x9F\x98\x80|", 0xC3, 0xA9, 'a', 0xF0, 0x9F, 0x98,
                  0x80);
    /* a broken sequence comes out as U+FFFD once the next byte shows it is broken */
    EXPECT_STREAM(t, false,
                  "||\xEF\xBF\xBD"
                  "a|",
                  0xE2, 0x82, 'a');
    EXPECT_STREAM(t, false, "||\xEF\xBF\xBD", 0xE2, 0x82);
    EXPECT_STREAM(t, true, "|t|he||", 263, 't', 257, 264);
    tokenizer_free(t);

    t = load(sentencepiece_fixture());
    /* byte fallback: a run is held until a non-byte token ends it (a later byte could make the
     * whole run U+FFFD) */
    EXPECT_STREAM(t, false, "a|||\xC3\xA9 b|", 262, 3 + 0xC3, 3 + 0xA9, 263);
    EXPECT_STREAM(t, false, "a||\xEF\xBF\xBD\xEF\xBF\xBD|\xEF\xBF\xBD| b|", 262, 3 + 'A', 3 + 0xFF,
                  3 + 0xC3, 263);
    /* the leading space is stripped once, at the start of the text */
    EXPECT_STREAM(t, false, "| a|", 259, 262);
    EXPECT_STREAM(t, true, "|a| b|", 1, 262, 263);
    EXPECT_STREAM(t, false, "<s>| a|", 1, 262);
    tokenizer_free(t);
}

/* A run of a million byte-fallback tokens: decoded in linear time (checking the whole held
 * run again at each byte took 48 s here, past the test's timeout), and a stream releases a
 * run that stays valid once it passes its bound instead of holding all of it. */
static void test_long_byte_runs(void **state)
{
    Tokenizer *t = load(sentencepiece_fixture());
    size_t n = 1u << 20;
    int32_t *ids = malloc(n * sizeof(*ids));
    for (size_t i = 0; i < n; i++)
        ids[i] = 3 + '\n';
    char *text = decode(t, ids, n, false);
    assert_int_equal(strlen(text), n);
    assert_int_equal(strspn(text, "\n"), n);
    free(text);

    TokenizerStream *s;
    assert_int_equal(tokenizer_stream_new(t, false, &s), 0);
    char *buf = NULL;
    size_t len = 0, cap = 0, held_most = 0;
    for (size_t i = 0; i < (256u << 10); i++) {
        assert_int_equal(tokenizer_stream_step(s, ids[i], &buf, &len, &cap), 0);
        if (i + 1 - len > held_most)
            held_most = i + 1 - len;
    }
    assert_true(held_most <= (64u << 10) + 1);
    assert_int_equal(tokenizer_stream_finish(s, &buf, &len, &cap), 0);
    assert_int_equal(len, 256u << 10);
    free(buf);
    tokenizer_stream_free(s);
    free(ids);
    tokenizer_free(t);
}

static void test_stream_refuses_unknown_ids(void **state)
{
    Tokenizer *t = load(bytelevel_fixture(true));
    TokenizerStream *s;
    assert_int_equal(tokenizer_stream_new(t, false, &s), 0);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    assert_int_equal(tokenizer_stream_step(s, 0xC3, &buf, &len, &cap), 0);
    assert_int_equal(tokenizer_stream_step(s, 5000, &buf, &len, &cap), PAGODA_EINVAL);
    assert_int_equal(tokenizer_stream_step(s, -1, &buf, &len, &cap), PAGODA_EINVAL);
    assert_int_equal(tokenizer_stream_step(s, 0xA9, &buf, &len, &cap), 0);
    assert_int_equal(tokenizer_stream_finish(s, &buf, &len, &cap), 0);
    assert_string_equal(buf, "\xC3\xA9");
    free(buf);
    tokenizer_stream_free(s);

    char *text = NULL;
    int32_t bad[] = {97, 265};
    assert_int_equal(tokenizer_decode(t, bad, 2, false, &text, NULL), PAGODA_EINVAL);
    assert_null(text);
    tokenizer_free(t);
}

/* ---- refusals and invalid input ---- */

static void test_invalid_text_is_refused(void **state)
{
    Tokenizer *t = load(bytelevel_fixture(true));
    const char *bad[] = {"\xC0\xAF",         "\xED\xA0\x80", "ab\xE2\x82",      "\x80",
                         "\xF5\x80\x80\x80", "a\xFF",        "\xF4\x90\x80\x80"};
    TokenizerIds ids = {0};
    assert_int_equal(tokenizer_encode(t, "the", 3, false, &ids), 0);
    size_t before = ids.len;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        assert_int_equal(tokenizer_encode(t, bad[i], strlen(bad[i]), false, &ids), PAGODA_EINVAL);
        assert_non_null(strstr(pagoda_error_detail(), "UTF-8"));
        assert_int_equal(ids.len, before); /* out keeps what it held */
    }
    /* a NUL is text like any other */
    assert_int_equal(tokenizer_encode(t, "a\0b", 3, false, &ids), 0);
    assert_int_equal(ids.len, before + 3);
    tokenizer_ids_fini(&ids);
    tokenizer_free(t);
}

static void test_unsupported_components_are_refused_by_name(void **state)
{
    json_t *r;
    r = bytelevel_fixture(true);
    set_path(r, json_string("WordPiece"), "model", "type", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "model.type", "WordPiece");
    r = bytelevel_fixture(true);
    set_path(r, json_real(0.1), "model", "dropout", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "model.dropout", NULL);
    r = bytelevel_fixture(true);
    set_path(r, json_string("##"), "model", "continuing_subword_prefix", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "model.continuing_subword_prefix", NULL);
    r = bytelevel_fixture(true);
    set_path(r, json_string("</w>"), "model", "end_of_word_suffix", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "model.end_of_word_suffix", NULL);
    r = bytelevel_fixture(true);
    set_path(r, json_pack("{s:i}", "max_length", 8), "truncation", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "truncation", NULL);
    r = bytelevel_fixture(true);
    set_path(r, json_pack("{s:s}", "strategy", "BatchLongest"), "padding", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "padding", NULL);
    r = bytelevel_fixture(true);
    set_path(r,
             json_pack("{s:s, s:[{s:s}, {s:s}]}", "type", "Sequence", "normalizers", "type", "NFC",
                       "type", "BertNormalizer"),
             "normalizer", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "normalizer.normalizers[1]", "BertNormalizer");
    r = bytelevel_fixture(true);
    set_path(r, json_pack("{s:s, s:s}", "type", "Precompiled", "precompiled_charsmap", "AA=="),
             "normalizer", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "normalizer", "Precompiled");
    r = bytelevel_fixture(true);
    set_path(r,
             json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "Regex", " +",
                       "content", " "),
             "normalizer", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "normalizer.pattern", "Regex");
    r = bytelevel_fixture(true);
    json_array_set_new(json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers"), 1,
                       json_pack("{s:s}", "type", "BertPreTokenizer"));
    refused(r, PAGODA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[1]", "BertPreTokenizer");
    r = bytelevel_fixture(true);
    json_object_set_new(
        json_array_get(json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers"), 0),
        "behavior", json_string("Sideways"));
    refused(r, PAGODA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0].behavior", "Sideways");
    r = bytelevel_fixture(true);
    json_object_set_new(
        json_array_get(json_object_get(json_object_get(r, "pre_tokenizer"), "pretokenizers"), 0),
        "pattern", json_pack("{s:s}", "Regex", "(unclosed"));
    refused(r, PAGODA_EUNSUPPORTED, "pre_tokenizer.pretokenizers[0].pattern", "PCRE2");
    r = bytelevel_fixture(true);
    set_path(r,
             json_pack("{s:s, s:[s, i], s:[s, i]}", "type", "RobertaProcessing", "sep", "x", 1,
                       "cls", "y", 2),
             "post_processor", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "post_processor", "RobertaProcessing");
    r = bytelevel_fixture(true);
    set_path(r, json_pack("{s:s, s:s}", "type", "WordPiece", "prefix", "##"), "decoder", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "decoder", "WordPiece");
    r = bytelevel_fixture(true);
    set_path(r,
             json_pack("{s:s, s:[{s:s}, {s:s}]}", "type", "Sequence", "decoders", "type", "Fuse",
                       "type", "CTC"),
             "decoder", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "decoder.decoders[1]", "CTC");
    r = bytelevel_fixture(true);
    set_path(r,
             json_pack("{s:s, s:s, s:s}", "type", "Metaspace", "replacement", META,
                       "prepend_scheme", "sometimes"),
             "pre_tokenizer", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "prepend_scheme", "sometimes");
    r = bytelevel_fixture(true);
    set_path(r,
             json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "Regex", "x+",
                       "content", "y"),
             "decoder", NULL);
    refused(r, PAGODA_EUNSUPPORTED, "decoder.pattern", "Regex");
    r = bytelevel_fixture(true);
    json_object_set_new(
        json_array_get(json_object_get(json_object_get(r, "post_processor"), "single"), 1),
        "Sequence", json_pack("{s:s, s:i}", "id", "B", "type_id", 0));
    refused(r, PAGODA_EUNSUPPORTED, "post_processor.single[1]", "Sequence A");
}

static void test_malformed_files_are_refused(void **state)
{
    Tokenizer *t = NULL;
    assert_int_equal(tokenizer_new_from_json("{\"model\": ", 10, &t), PAGODA_EFORMAT);
    assert_int_equal(tokenizer_new_from_json("[1]", 3, &t), PAGODA_EFORMAT);
    json_t *r = bytelevel_fixture(true);
    set_path(r, json_string("x"), "model", "vocab", NULL);
    refused(r, PAGODA_EFORMAT, "model.vocab", NULL);
    r = bytelevel_fixture(true);
    json_array_append_new(json_object_get(json_object_get(r, "model"), "merges"),
                          json_string("q z"));
    refused(r, PAGODA_EFORMAT, "model.merges[7]", "not in model.vocab");
    r = bytelevel_fixture(true);
    json_array_append_new(json_object_get(json_object_get(r, "model"), "merges"),
                          json_string("a b c"));
    refused(r, PAGODA_EFORMAT, "model.merges[7]", NULL);
    r = bytelevel_fixture(true);
    json_object_set_new(json_array_get(json_object_get(r, "added_tokens"), 0), "lstrip",
                        json_string("yes"));
    refused(r, PAGODA_EFORMAT, "added_tokens[0].lstrip", NULL);
    /* a file: read whole; a broken one names its path */
    char path[] = "/tmp/pagoda-test-tokenizer-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    char *doc = json_dumps(r = bytelevel_fixture(true), JSON_COMPACT);
    json_decref(r);
    assert_int_equal(write(fd, doc, strlen(doc)), (ssize_t)strlen(doc));
    assert_int_equal(tokenizer_new_from_file(path, &t), 0);
    EXPECT(t, " the", false, 258);
    tokenizer_free(t);
    t = NULL;
    assert_int_equal(ftruncate(fd, (off_t)strlen(doc) / 2), 0);
    assert_int_equal(tokenizer_new_from_file(path, &t), PAGODA_EFORMAT);
    assert_non_null(strstr(pagoda_error_detail(), path));
    free(doc);
    close(fd);
    unlink(path);
    /* a template emitting an id no token has (found by fuzz_tokenizer: its encodes could not
     * be decoded) */
    r = bytelevel_fixture(true);
    json_object_set_new(json_object_get(json_object_get(r, "model"), "vocab"), "zz",
                        json_integer(280)); /* ids 265-279: no token */
    set_path(r, template_bos("<|bos|>", 270), "post_processor", NULL);
    refused(r, PAGODA_EFORMAT, "post_processor.special_tokens[\"<|bos|>\"].ids[0]", NULL);
    assert_int_equal(tokenizer_new_from_file("/nonexistent/tokenizer.json", &t), PAGODA_ENOENT);
    assert_int_equal(tokenizer_new_from_file("/", &t), PAGODA_EINVAL);
    assert_null(t);
}

/* ---- the bound on bytes per token ---- */

/* Texts meant to make few ids of many bytes: long tokens and added tokens repeated, runs of
 * spaces, and characters that normalizers shorten (NFD forms that compose, U+01D5 among them,
 * compatibility characters of 3 and 4 bytes that become one, U+212A that lowercases to "k"). */
static const char *const DENSE_TEXTS[] = {
    " the the the the hello hello aa12aa12",
    "<|bos|><|bos|><|eot|><|bos|>",
    "                                                  x",
    "abababababbbbbaaaa ab ab ab",
    "U\xCC\x88\xCC\x84U\xCC\x88\xCC\x84U\xCC\x88\xCC\x84",                      /* U+01D5 as NFD */
    "\xF0\x9D\x90\x80\xF0\x9D\x90\x80\xF0\x9D\x90\x80\xEF\xBC\xA1\xEF\xBC\xA1", /* 𝐀 Ａ */
    "\xE2\x84\xAA\xE2\x84\xAA\xE2\x84\xAA\xE2\x84\xAA",                         /* Kelvin sign */
    "\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8", /* Hangul L V T */
    "abcabcabcabc xyz",
    "\xF0\x9F\x98\x80\xE2\x82\xAC\xC3\xA9",
};

/* t's bound (want, or 0 for none) and, where there is one, that no text above makes fewer ids
 * than its bytes over the bound. */
static void expect_bound(json_t *root, size_t want, const char *what)
{
    Tokenizer *t = load(root);
    size_t per_token = tokenizer_max_bytes_per_token(t);
    if (per_token != want)
        fail_msg("%s: a bound of %zu bytes a token, expected %zu", what, per_token, want);
    for (size_t i = 0; per_token > 0 && i < sizeof(DENSE_TEXTS) / sizeof(DENSE_TEXTS[0]); i++) {
        TokenizerIds ids = {0};
        size_t len = strlen(DENSE_TEXTS[i]);
        assert_int_equal(tokenizer_encode(t, DENSE_TEXTS[i], len, false, &ids), 0);
        if (ids.len * per_token < len)
            fail_msg("%s: text %zu has %zu bytes in %zu ids, above %zu a token", what, i, len,
                     ids.len, per_token);
        tokenizer_ids_fini(&ids);
    }
    tokenizer_free(t);
}

/* The bound a caller may refuse a text by without encoding it: the longest token (or added
 * token) times what the normalizers may shorten, and none where a stage may make a run of text
 * one id or none. */
static void test_max_bytes_per_token(void **state)
{
    (void)state;
    /* "<|bos|>" (7 bytes, matched in the raw text) is the longest; then "Ġthe" (5 bytes) */
    expect_bound(bytelevel_fixture(true), 7, "byte-level");
    /* <0x00>..<0xFF> (6 bytes) for one byte each; Replace " " -> ▁ only lengthens */
    expect_bound(sentencepiece_fixture(), 6, "SentencePiece");
    const struct {
        const char *type;
        size_t want;
    } forms[] = {{"NFC", 30}, {"NFD", 30}, {"NFKC", 30}, {"NFKD", 30}, {"Lowercase", 20}};
    for (size_t i = 0; i < sizeof(forms) / sizeof(forms[0]); i++) {
        json_t *root = bytelevel_fixture(true);
        set_path(root, json_pack("{s:s}", "type", forms[i].type), "normalizer", NULL);
        expect_bound(root, forms[i].want, forms[i].type);
    }
    json_t *root = bytelevel_fixture(true);
    set_path(root,
             json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", "abc",
                       "content", "x"),
             "normalizer", NULL);
    expect_bound(root, 15, "Replace abc -> x");
    /* a normalized added token is matched in normalized text: its length times the shrink */
    root = with_added(bytelevel_fixture(true), 265, "<|a-long-one|>", NULL, false, true);
    set_path(root, json_pack("{s:s}", "type", "NFC"), "normalizer", NULL);
    expect_bound(root, 14 * 6, "normalized added token");
    /* no bound: Replace to "", lstrip or rstrip, a Split that removes, characters dropped
     * (no ByteLevel, no byte fallback, no unknown token) or fused into one unknown token */
    root = bytelevel_fixture(true);
    set_path(root,
             json_pack("{s:s, s:{s:s}, s:s}", "type", "Replace", "pattern", "String", " ",
                       "content", ""),
             "normalizer", NULL);
    expect_bound(root, 0, "Replace to nothing");
    expect_bound(with_added(bytelevel_fixture(true), 265, "<|x|>", "lstrip", true, false), 0,
                 "lstrip");
    expect_bound(with_added(bytelevel_fixture(true), 265, "<|x|>", "rstrip", true, false), 0,
                 "rstrip");
    root = bytelevel_fixture(true);
    set_path(root,
             json_pack("{s:s, s:{s:s}, s:s, s:b}", "type", "Split", "pattern", "String", " ",
                       "behavior", "Removed", "invert", 0),
             "pre_tokenizer", NULL);
    expect_bound(root, 0, "Split Removed");
    root = bytelevel_fixture(true);
    set_path(root, json_null(), "pre_tokenizer", NULL);
    expect_bound(root, 0, "characters without ids");
    root = sentencepiece_fixture();
    set_path(root, json_false(), "model", "byte_fallback", NULL);
    expect_bound(root, 0, "fused unknown tokens");
    /* an unknown token for each character: up to 4 bytes whatever its string */
    root = sentencepiece_fixture();
    set_path(root, json_false(), "model", "byte_fallback", NULL);
    set_path(root, json_false(), "model", "fuse_unk", NULL);
    expect_bound(root, 4 * 6, "unknown tokens");
}

/* TOK_NORMAL_FORM_MAX_SHRINK (6) against utf8proc's tables: an output character c of a normal
 * form stands for at most |NFD(c)| input characters of at most 4 bytes each. */
static void test_normal_form_shrink_holds_for_every_code_point(void **state)
{
    (void)state;
    for (utf8proc_int32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp < 0xE000)
            continue;
        utf8proc_int32_t out[32];
        int last = 0;
        utf8proc_ssize_t n = utf8proc_decompose_char(cp, out, 32, UTF8PROC_DECOMPOSE, &last);
        assert_true(n >= 1 && n <= 32);
        size_t bytes = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
        if (4 * (size_t)n > TOK_NORMAL_FORM_MAX_SHRINK * bytes)
            fail_msg("U+%04X: %zd characters in NFD, %zu bytes", (unsigned)cp, n, bytes);
    }
}

/* ---- many added tokens ---- */

/* The reference for test_many_added_tokens: the added tokens of one pass, sorted by content,
 * searched by trying every length at every position (nothing shared with the library's
 * matching). */
typedef struct RefTok {
    char s[320];
    size_t len;
    int32_t id;
    uint32_t first; /* where its content first appears in the file */
} RefTok;

typedef struct RefSet {
    RefTok *tok;
    size_t n;
    bool has_len[321];
} RefSet;

static int cmp_bytes(const char *a, size_t alen, const char *b, size_t blen)
{
    int c = memcmp(a, b, alen < blen ? alen : blen);
    return c ? c : (alen > blen) - (alen < blen);
}

static int cmp_ref(const void *a, const void *b)
{
    const RefTok *x = a, *y = b;
    int c = cmp_bytes(x->s, x->len, y->s, y->len);
    return c ? c : (x->first > y->first) - (x->first < y->first);
}

/* Sorts the set and keeps the earliest of equal contents (the one HF finds). */
static void ref_set_finish(RefSet *set)
{
    qsort(set->tok, set->n, sizeof(*set->tok), cmp_ref);
    size_t k = 0;
    for (size_t i = 0; i < set->n; i++)
        if (k == 0 ||
            cmp_bytes(set->tok[k - 1].s, set->tok[k - 1].len, set->tok[i].s, set->tok[i].len) != 0)
            set->tok[k++] = set->tok[i];
    set->n = k;
    for (size_t i = 0; i < set->n; i++)
        set->has_len[set->tok[i].len] = true;
}

static const RefTok *ref_find(const RefSet *set, const char *s, size_t len)
{
    size_t lo = 0, hi = set->n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        int c = cmp_bytes(set->tok[mid].s, set->tok[mid].len, s, len);
        if (c == 0)
            return &set->tok[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void ids_append(TokenizerIds *out, const int32_t *ids, size_t n)
{
    out->ids = realloc(out->ids, (out->len + n + 1) * sizeof(*out->ids));
    assert_non_null(out->ids);
    memcpy(out->ids + out->len, ids, n * sizeof(*ids));
    out->len += n;
}

static void ref_split(const RefSet *set, const char *text, size_t len, const RefSet *next,
                      const Tokenizer *base, TokenizerIds *out);

/* Text between tokens: lowercased and cut by the normalized tokens (next), or, after both
 * passes, encoded by the same tokenizer without the added tokens. */
static void ref_gap(const char *text, size_t len, const RefSet *next, const Tokenizer *base,
                    TokenizerIds *out)
{
    if (len == 0)
        return;
    if (next) {
        char *low = malloc(len);
        for (size_t i = 0; i < len; i++)
            low[i] = text[i] >= 'A' && text[i] <= 'Z' ? (char)(text[i] - 'A' + 'a') : text[i];
        ref_split(next, low, len, NULL, base, out);
        free(low);
        return;
    }
    TokenizerIds ids = {0};
    assert_int_equal(tokenizer_encode(base, text, len, false, &ids), 0);
    ids_append(out, ids.ids, ids.len);
    tokenizer_ids_fini(&ids);
}

/* Leftmost-longest: the first position where some token begins, the longest one there. */
static void ref_split(const RefSet *set, const char *text, size_t len, const RefSet *next,
                      const Tokenizer *base, TokenizerIds *out)
{
    size_t gap = 0;
    for (size_t ms = 0; ms < len;) {
        const RefTok *hit = NULL;
        for (size_t l = len - ms < 320 ? len - ms : 320; l > 0 && !hit; l--)
            if (set->has_len[l])
                hit = ref_find(set, text + ms, l);
        if (!hit) {
            ms++;
            continue;
        }
        ref_gap(text + gap, ms - gap, next, base, out);
        ids_append(out, &hit->id, 1);
        ms += hit->len;
        gap = ms;
    }
    ref_gap(text + gap, len - gap, next, base, out);
}

/* The library's ids of text are the reference's, and mostly added tokens. */
static void expect_as_reference(const Tokenizer *t, const Tokenizer *base, const RefSet *raw,
                                const RefSet *low, const char *text, size_t n)
{
    TokenizerIds want = {0}, got = {0};
    ref_split(raw, text, n, low, base, &want);
    assert_int_equal(tokenizer_encode(t, text, n, false, &got), 0);
    assert_int_equal(got.len, want.len);
    for (size_t i = 0; i < got.len; i++)
        if (got.ids[i] != want.ids[i])
            fail_msg("id %zu of %zu: got %d, want %d", i, got.len, got.ids[i], want.ids[i]);
    assert_true(want.len < n / 2);
    tokenizer_ids_fini(&want);
    tokenizer_ids_fini(&got);
}

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

/* 100k added tokens, normalized (matched lowercased) and not, many given twice with other
 * flags, many sharing long runs of '<' (the run that made every position of a text of '<'
 * try thousands of them), and 64 KB of text of those runs and the tokens' bytes: the ids are
 * those of the reference's leftmost-longest search, and every content is found by its id as
 * HF assigns them (the first time a content appears; its last flags win). The library was
 * quadratic here (20 s to load, 7 s for 20 KB of '<'); the reference is the check, not a
 * clock. */
static void test_many_added_tokens(void **state)
{
    enum { N = 100000, TEXT = 64 << 10 };
    static const char alphabet[] = "<>xyXY";
    RefTok *all = calloc(N, sizeof(*all));
    bool *normalized = calloc(N, sizeof(*normalized));
    assert_non_null(all);
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    json_t *root = bytelevel_fixture(true);
    set_path(root, json_pack("{s:s}", "type", "Lowercase"), "normalizer", NULL);
    json_t *list = json_object_get(root, "added_tokens");
    for (uint32_t i = 0; i < N; i++) {
        RefTok *a = &all[i];
        uint64_t r = rng_next(&rng);
        if (r % 8 == 0) { /* a long run of '<' and a letter */
            a->len = 2 + (r >> 8) % 40;
            if (r % 1000 == 0)
                a->len = 300;
            memset(a->s, '<', a->len - 1);
            a->s[a->len - 1] = alphabet[2 + (r >> 20) % 4];
        } else {
            a->len = 2 + (r >> 8) % 7;
            for (size_t j = 0; j < a->len; j++)
                a->s[j] = alphabet[rng_next(&rng) % 6];
        }
        if (i == N - 1) { /* the token the second text is made of, whatever came before */
            a->len = 300;
            memset(a->s, '<', 299);
            a->s[299] = 'x';
        }
        a->first = i;
        normalized[i] = i < N - 1 && rng_next(&rng) % 3 == 0;
        json_array_append_new(list, added(0, a->s, false, normalized[i]));
    }
    Tokenizer *t = load(root);
    Tokenizer *base = load(bytelevel_fixture(true));

    /* ids by first appearance (the fixture's vocabulary and added tokens take 0-264), flags by
     * the last */
    RefTok *sorted = malloc(N * sizeof(*sorted));
    memcpy(sorted, all, N * sizeof(*sorted));
    qsort(sorted, N, sizeof(*sorted), cmp_ref);
    bool *uniq = calloc(N, sizeof(*uniq)), *norm_of = calloc(N, sizeof(*norm_of));
    for (size_t i = 0; i < N;) {
        size_t j = i;
        while (j < N && cmp_bytes(sorted[i].s, sorted[i].len, sorted[j].s, sorted[j].len) == 0)
            j++;
        uniq[sorted[i].first] = true;
        norm_of[sorted[i].first] = normalized[sorted[j - 1].first];
        i = j;
    }
    RefSet raw = {calloc(N, sizeof(RefTok)), 0, {false}};
    RefSet low = {calloc(N, sizeof(RefTok)), 0, {false}};
    int32_t next_id = 265;
    for (uint32_t i = 0; i < N; i++) {
        if (!uniq[i])
            continue;
        all[i].id = next_id++;
        assert_int_equal(tokenizer_token_to_id(t, all[i].s), all[i].id);
        if (!norm_of[i]) {
            raw.tok[raw.n++] = all[i];
            continue;
        }
        RefTok *l = &low.tok[low.n++];
        *l = all[i];
        for (size_t j = 0; j < l->len; j++)
            if (l->s[j] >= 'A' && l->s[j] <= 'Z')
                l->s[j] = (char)(l->s[j] - 'A' + 'a');
    }
    ref_set_finish(&raw);
    ref_set_finish(&low);

    /* the text: runs of '<' (8 KB first) ended by a letter, so that long tokens begin
     * everywhere, and stretches of the tokens' bytes and others */
    char *text = malloc(TEXT + 1);
    static const char bytes[] = "<>xyXYc ";
    size_t n = 0;
    while (n < TEXT) {
        uint64_t r = rng_next(&rng);
        bool angles = r % 2 == 0;
        size_t run = angles ? (n == 0 ? 8192 : 1 + (r >> 8) % 400) : 1 + (r >> 8) % 30;
        for (size_t j = 0; j < run && n < TEXT; j++)
            text[n++] = angles ? '<' : bytes[rng_next(&rng) % 8];
        if (angles && n < TEXT)
            text[n++] = alphabet[2 + (r >> 20) % 4];
    }
    text[n] = 0;
    expect_as_reference(t, base, &raw, &low, text, n);
    assert_true(n > 60000);
    /* texts that are the 300-byte token over and over after a few bytes no token has: wherever
     * the library cuts a text into windows, a token crosses the cut, at another place of it
     * in each text */
    for (size_t skip = 0; skip < 300; skip += 50) {
        memset(text, 'c', skip);
        for (size_t i = skip; i < TEXT; i++)
            text[i] = (i - skip) % 300 == 299 ? 'x' : '<';
        expect_as_reference(t, base, &raw, &low, text, TEXT);
    }
    free(text);
    free(raw.tok);
    free(low.tok);
    free(uniq);
    free(norm_of);
    free(sorted);
    free(normalized);
    free(all);
    tokenizer_free(base);
    tokenizer_free(t);
}

/* ---- threads ---- */

typedef struct {
    const Tokenizer *t;
    int failures;
} ThreadArg;

static const char *const THREAD_TEXTS[] = {"the hello", " the aaa", "<|bos|>hello\xC3\xA9",
                                           "llo llo llo", "aaaaaaa the"};

static void *encode_many(void *p)
{
    ThreadArg *a = p;
    TokenizerIds ids = {0}, ref = {0};
    for (int round = 0; round < 300; round++) {
        for (size_t i = 0; i < sizeof(THREAD_TEXTS) / sizeof(THREAD_TEXTS[0]); i++) {
            ids.len = 0;
            ref.len = 0;
            const char *s = THREAD_TEXTS[i];
            if (tokenizer_encode(a->t, s, strlen(s), true, &ids) ||
                tokenizer_encode(a->t, s, strlen(s), true, &ref) || ids.len != ref.len ||
                memcmp(ids.ids, ref.ids, ids.len * sizeof(int32_t)) != 0)
                a->failures++;
        }
    }
    tokenizer_ids_fini(&ids);
    tokenizer_ids_fini(&ref);
    return NULL;
}

static void test_threads_share_a_tokenizer(void **state)
{
    Tokenizer *t = load(bytelevel_fixture(true));
    pthread_t th[4];
    ThreadArg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (ThreadArg){t, 0};
        assert_int_equal(pthread_create(&th[i], NULL, encode_many, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].failures, 0);
    }
    EXPECT(t, "the hello", false, 116, 257, 32, 257, 260);
    tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bytelevel_merges_in_both_spellings),
        cmocka_unit_test(test_ignore_merges_takes_whole_words),
        cmocka_unit_test(test_byte_fallback_and_unknown),
        cmocka_unit_test(test_long_word_is_not_quadratic),
        cmocka_unit_test(test_word_without_ids),
        cmocka_unit_test(test_sentencepiece_long_text),
        cmocka_unit_test(test_added_tokens_and_their_flags),
        cmocka_unit_test(test_lookups),
        cmocka_unit_test(test_added_token_ids_are_assigned_as_hf_does),
        cmocka_unit_test(test_many_added_tokens),
        cmocka_unit_test(test_normalizers),
        cmocka_unit_test(test_split_behaviors),
        cmocka_unit_test(test_regex_match_limit_is_named),
        cmocka_unit_test(test_regex_classes_follow_hf_unicode),
        cmocka_unit_test(test_bytelevel_pretokenizer_regex_and_prefix_space),
        cmocka_unit_test(test_digits),
        cmocka_unit_test(test_max_bytes_per_token),
        cmocka_unit_test(test_normal_form_shrink_holds_for_every_code_point),
        cmocka_unit_test(test_metaspace),
        cmocka_unit_test(test_decoders),
        cmocka_unit_test(test_decode_of_nothing_is_an_empty_string),
        cmocka_unit_test(test_lossy_utf8),
        cmocka_unit_test(test_stream_never_splits_a_character),
        cmocka_unit_test(test_long_byte_runs),
        cmocka_unit_test(test_stream_refuses_unknown_ids),
        cmocka_unit_test(test_invalid_text_is_refused),
        cmocka_unit_test(test_unsupported_components_are_refused_by_name),
        cmocka_unit_test(test_malformed_files_are_refused),
        cmocka_unit_test(test_threads_share_a_tokenizer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
