/* libFuzzer target: the tokenizer (tokenizer/tokenizer.h). The first byte picks what the rest
 * is:
 *
 *   0  a tokenizer.json: tokenizer_new_from_json; a file that loads then encodes and decodes a
 *      few fixed strings
 *   1  text for a small fixed byte-level tokenizer (Llama 3's shape: Split with its regex,
 *      ByteLevel, added tokens with lstrip and rstrip, template BOS)
 *   2  text for a small fixed SentencePiece-style one (Llama 2's shape: Prepend and Replace
 *      normalizers, byte fallback, its decoder chain)
 *
 * Checked beyond the sanitizers: a refusal is an error of the contract; text is encoded iff it
 * is valid UTF-8, every id is in the vocabulary, and (without added tokens in the text) decode
 * gives the text back; the same bytes read as ids decode to valid UTF-8, and streamed they join
 * to exactly that decode, every delta whole UTF-8. */
#include "common/error.h"
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Inputs past this are cut (the pipeline is linear; a longer input only slows the run). */
#define FUZZ_MAX_TEXT 4096

static bool valid_utf8(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        unsigned c = p[i], k;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c < 0x80)
            k = 0;
        else if (c >= 0xC2 && c < 0xE0)
            k = 1;
        else if (c >= 0xE0 && c < 0xF0) {
            k = 2;
            lo = c == 0xE0 ? 0xA0 : 0x80;
            hi = c == 0xED ? 0x9F : 0xBF;
        } else if (c >= 0xF0 && c < 0xF5) {
            k = 3;
            lo = c == 0xF0 ? 0x90 : 0x80;
            hi = c == 0xF4 ? 0x8F : 0xBF;
        } else
            return false;
        if (k && (i + k >= n || p[i + 1] < lo || p[i + 1] > hi))
            return false;
        for (unsigned j = 2; j <= k; j++)
            if ((p[i + j] & 0xC0) != 0x80)
                return false;
        i += k + 1;
    }
    return true;
}

static void byte_char(unsigned b, char out[3])
{
    unsigned cp = b <= 32 ? 256 + b : b >= 127 && b <= 160 ? 289 + (b - 127) : b == 173 ? 323 : b;
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static Tokenizer *load_or_die(json_t *root)
{
    char *s = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    Tokenizer *t = NULL;
    if (!s || tokenizer_new_from_json(s, strlen(s), &t) != 0)
        abort();
    free(s);
    return t;
}

static Tokenizer *bytelevel(void)
{
    json_t *vocab = json_object();
    for (unsigned b = 0; b < 256; b++) {
        char c[3];
        byte_char(b, c);
        json_object_set_new(vocab, c, json_integer(b));
    }
    const char *extra[] = {"\xC4\xA0t", "he", "\xC4\xA0the", "ll", "llo", "in", "\xC4\xA0in"};
    for (int i = 0; i < 7; i++)
        json_object_set_new(vocab, extra[i], json_integer(256 + i));
    json_t *root = json_pack(
        "{s:[{s:i, s:s, s:b, s:b, s:b, s:b, s:b}, {s:i, s:s, s:b, s:b, s:b, s:b, s:b}],"
        " s:n, s:{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, {s:s, s:b, s:b, s:b}]},"
        " s:{s:s, s:[{s:{s:s}}, {s:{s:s}}], s:{s:{s:s, s:[i], s:[s]}}},"
        " s:{s:s}, s:{s:s, s:o, s:[s, s, s, s, s, s, s]}}",
        "added_tokens", "id", 263, "content", "<|bos|>", "special", 1, "lstrip", 0, "rstrip", 0,
        "normalized", 0, "single_word", 0, "id", 264, "content", "<tool>", "special", 0, "lstrip",
        1, "rstrip", 1, "normalized", 0, "single_word", 0, "normalizer", "pre_tokenizer", "type",
        "Sequence", "pretokenizers", "type", "Split", "pattern", "Regex",
        "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
        "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
        "behavior", "Isolated", "invert", 0, "type", "ByteLevel", "add_prefix_space", 0,
        "trim_offsets", 0, "use_regex", 0, "post_processor", "type", "TemplateProcessing", "single",
        "SpecialToken", "id", "<|bos|>", "Sequence", "id", "A", "special_tokens", "<|bos|>", "id",
        "<|bos|>", "ids", 263, "tokens", "<|bos|>", "decoder", "type", "ByteLevel", "model", "type",
        "BPE", "vocab", vocab, "merges", "\xC4\xA0 t", "h e", "\xC4\xA0t he", "l l", "ll o", "i n",
        "\xC4\xA0 in");
    return load_or_die(root);
}

static Tokenizer *sentencepiece(void)
{
    json_t *vocab = json_pack("{s:i, s:i, s:i}", "<unk>", 0, "<s>", 1, "</s>", 2);
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof(s), "<0x%02X>", b);
        json_object_set_new(vocab, s, json_integer(3 + b));
    }
    const char *extra[] = {"\xE2\x96\x81",
                           "a",
                           "b",
                           ("\xE2\x96\x81"
                            "a"),
                           "ab",
                           "\xC3\xA9"};
    for (int i = 0; i < 6; i++)
        json_object_set_new(vocab, extra[i], json_integer(259 + i));
    json_t *root = json_pack(
        "{s:[{s:i, s:s, s:b, s:b}, {s:i, s:s, s:b, s:b}],"
        " s:{s:s, s:[{s:s, s:s}, {s:s, s:{s:s}, s:s}]}, s:n, s:n,"
        " s:{s:s, s:[{s:s, s:{s:s}, s:s}, {s:s}, {s:s}, {s:s, s:s, s:i, s:i}]},"
        " s:{s:s, s:s, s:b, s:b, s:o, s:[s, s]}}",
        "added_tokens", "id", 1, "content", "<s>", "special", 1, "normalized", 0, "id", 2,
        "content", "</s>", "special", 1, "normalized", 0, "normalizer", "type", "Sequence",
        "normalizers", "type", "Prepend", "prepend", "\xE2\x96\x81", "type", "Replace", "pattern",
        "String", " ", "content", "\xE2\x96\x81", "pre_tokenizer", "post_processor", "decoder",
        "type", "Sequence", "decoders", "type", "Replace", "pattern", "String", "\xE2\x96\x81",
        "content", " ", "type", "ByteFallback", "type", "Fuse", "type", "Strip", "content", " ",
        "start", 1, "stop", 0, "model", "type", "BPE", "unk_token", "<unk>", "byte_fallback", 1,
        "fuse_unk", 1, "vocab", vocab, "merges", "\xE2\x96\x81 a", "a b");
    return load_or_die(root);
}

/* Decodes ids and streams them: valid UTF-8, the deltas whole and joined equal to decode. */
static void check_decode(const Tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    char *text = NULL;
    size_t len = 0;
    int rc = tokenizer_decode(t, ids, n, skip, &text, &len);
    bool all_valid = true;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (size_t)ids[i] >= tokenizer_vocab_size(t) ||
            !tokenizer_id_to_token(t, ids[i]))
            all_valid = false;
    if (!all_valid) {
        if (rc != PAGODA_EINVAL)
            abort();
        return;
    }
    if (rc != 0 || text[len] != 0 || !valid_utf8(text, len))
        abort();
    TokenizerStream *s = NULL;
    if (tokenizer_stream_new(t, skip, &s) != 0)
        abort();
    char *buf = NULL;
    size_t blen = 0, cap = 0;
    for (size_t i = 0; i <= n; i++) {
        size_t before = blen;
        rc = i < n ? tokenizer_stream_step(s, ids[i], &buf, &blen, &cap)
                   : tokenizer_stream_finish(s, &buf, &blen, &cap);
        if (rc != 0 || buf[blen] != 0 || !valid_utf8(buf + before, blen - before))
            abort();
    }
    if (blen != len || memcmp(buf, text, len) != 0)
        abort();
    free(buf);
    tokenizer_stream_free(s);
    free(text);
}

static void check_text(const Tokenizer *t, const char *text, size_t len, bool roundtrip)
{
    TokenizerIds ids = {0};
    int rc = tokenizer_encode(t, text, len, true, &ids);
    if (!valid_utf8(text, len)) {
        if (rc != PAGODA_EINVAL || ids.len != 0)
            abort();
        return;
    }
    if (rc != 0)
        abort();
    for (size_t i = 0; i < ids.len; i++)
        if (ids.ids[i] < 0 || (size_t)ids.ids[i] >= tokenizer_vocab_size(t))
            abort();
    char *back = NULL;
    size_t blen = 0;
    if (tokenizer_decode(t, ids.ids, ids.len, true, &back, &blen) != 0)
        abort();
    /* lossless unless the text holds an added token (lstrip/rstrip eat spaces, skip drops it)
     * or, for the SentencePiece shape, U+2581 itself (it decodes to a space) */
    if (roundtrip && !memchr(text, '<', len) && !memmem(text, len, "\xE2\x96\x81", 3) &&
        (blen != len || memcmp(back, text, len) != 0))
        abort();
    free(back);
    check_decode(t, ids.ids, ids.len, false);
    tokenizer_ids_fini(&ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static Tokenizer *fixed[2];
    if (!fixed[0]) {
        fixed[0] = bytelevel();
        fixed[1] = sentencepiece();
    }
    if (size < 1)
        return 0;
    const char *rest = (const char *)data + 1;
    size_t n = size - 1;
    int mode = data[0] % 3;
    if (mode == 0) {
        Tokenizer *t = NULL;
        int rc = tokenizer_new_from_json(rest, n, &t);
        if (rc != 0) {
            if (rc != PAGODA_EFORMAT && rc != PAGODA_EUNSUPPORTED && rc != PAGODA_ERANGE &&
                rc != PAGODA_ENOMEM && rc != PAGODA_EINVAL)
                abort();
            return 0;
        }
        static const char *const texts[] = {"Hello world", " <s>x\xC3\xA9\n\n  12345 ",
                                            "\xF0\x9F\x98\x80 a\xCC\x81"};
        for (size_t i = 0; i < 3; i++)
            check_text(t, texts[i], strlen(texts[i]), false);
        int32_t ids[8];
        for (int i = 0; i < 8; i++)
            ids[i] = (int32_t)(i * 7919 % (tokenizer_vocab_size(t) + 1));
        check_decode(t, ids, 8, true);
        tokenizer_free(t);
        return 0;
    }
    if (n > FUZZ_MAX_TEXT)
        n = FUZZ_MAX_TEXT;
    const Tokenizer *t = fixed[mode - 1];
    check_text(t, rest, n, true);
    /* the same bytes as ids, two bytes each: some past the vocabulary */
    int32_t ids[FUZZ_MAX_TEXT / 2];
    size_t nids = n / 2;
    for (size_t i = 0; i < nids; i++)
        ids[i] = (int32_t)(((uint8_t)rest[2 * i] | (uint8_t)rest[2 * i + 1] << 8) %
                           (tokenizer_vocab_size(t) + 4));
    for (size_t i = 0; i < nids; i++)
        if ((size_t)ids[i] >= tokenizer_vocab_size(t))
            ids[i] = (int32_t)(i % tokenizer_vocab_size(t)); /* mostly valid sequences */
    check_decode(t, ids, nids, false);
    check_decode(t, ids, nids, true);
    if (nids)
        ids[nids - 1] = -3; /* and one invalid id */
    check_decode(t, ids, nids, false);
    return 0;
}
