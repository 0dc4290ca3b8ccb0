/* tokenizer_compare: pagoda's tokenizer (tokenizer/tokenizer.h) against the references that
 * Hugging Face `tokenizers` wrote (tests/tokenizer/make_refs.mjs).
 *
 *   tokenizer_compare [--show N] [--min-strings N] TOKENIZER_JSON REF_JSONL
 *
 * For each string of the references: encode with and without special tokens (id for id),
 * decode both id lists with and without skip_special_tokens (byte for byte), and stream both id
 * lists through tokenizer_stream_* with both skip settings: the deltas must join to HF's decode,
 * each delta must be valid UTF-8 on its own (no delta ends inside a character) and the buffer
 * stays NUL-terminated. For each random id sequence: decode and stream, both skip settings. And
 * the vocabulary: its size, each id's string (tokenizer_id_to_token), the id of each string
 * (tokenizer_token_to_id).
 * Prints one line per check (compared, mismatches) and the first --show (default 5) mismatches
 * of each check: the string escaped, both id lists or texts, the first differing position.
 *
 * Exit status: 0 when everything matched, 1 on any mismatch (or fewer than --min-strings
 * strings), 2 when it could not run (usage, unreadable file, the tokenizer did not load).
 *
 *   tokenizer_compare --eos MODEL_DIR
 *
 * prints the model's EOS ids as the group stops at them (model_config_load's, config.json's and
 * generation_config's, then model_config_add_tokenizer_eos's, the tokenizer's eos_token), one line,
 * for tests/tokenizer/run to hold the last against the reference tokenizer's eos_token_id. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

/* The longest line read from the references (a string of the corpus with its ids and decodes). */
#define COMPARE_MAX_LINE_BYTES (64u << 20)
/* How much of a string or a text a mismatch report shows, in bytes of input. */
#define COMPARE_SHOW_BYTES 400
/* How many ids of each list a mismatch report shows around the first difference. */
#define COMPARE_SHOW_IDS 12

enum check {
    CHECK_ENCODE_SPECIAL, /* encode(text, add_special_tokens=true) */
    CHECK_ENCODE_PLAIN,   /* encode(text, false) */
    CHECK_DECODE,         /* decode(ids, skip=false), both id lists */
    CHECK_DECODE_SKIP,    /* decode(ids, skip=true), both id lists */
    CHECK_STREAM,         /* stream deltas joined, skip=false, both id lists */
    CHECK_STREAM_SKIP,    /* the same, skip=true */
    CHECK_STREAM_UTF8,    /* every delta of every stream is whole UTF-8, the buffer NUL-ended */
    CHECK_RAND_DECODE,    /* random id sequences: decode, skip=false */
    CHECK_RAND_DECODE_SKIP,
    CHECK_RAND_STREAM, /* random id sequences: stream deltas joined, skip=false */
    CHECK_RAND_STREAM_SKIP,
    CHECK_VOCAB_SIZE,  /* tokenizer_vocab_size against getVocabSize(with added tokens) */
    CHECK_ID_TO_TOKEN, /* every id's string */
    CHECK_TOKEN_TO_ID, /* the id given back for each of those strings */
    CHECK_COUNT
};

static const char *const check_names[CHECK_COUNT] = {
    "encode (add_special_tokens)",
    "encode (no special tokens)",
    "decode",
    "decode (skip_special_tokens)",
    "stream",
    "stream (skip_special_tokens)",
    "stream deltas whole UTF-8",
    "random ids: decode",
    "random ids: decode (skip)",
    "random ids: stream",
    "random ids: stream (skip)",
    "vocabulary size",
    "id_to_token",
    "token_to_id",
};

static struct {
    uint64_t compared[CHECK_COUNT];
    uint64_t mismatched[CHECK_COUNT];
    unsigned show;
    uint64_t strings;
    uint64_t sequences;
    uint64_t line;
    double encode_s;
    uint64_t encoded_bytes;
} g = {.show = 5};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Prints bytes with everything but printable ASCII escaped (\n, \t, \r, \\, \u{XXXX} for a
 * character, \xNN for a byte that is not valid UTF-8), so that NFC and NFD forms, invisible
 * characters and broken sequences all show. At most COMPARE_SHOW_BYTES of input. */
static void print_escaped(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = len < COMPARE_SHOW_BYTES ? len : COMPARE_SHOW_BYTES;
    putchar('"');
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c == '\\') {
            fputs("\\\\", stdout);
            i++;
        } else if (c == '"') {
            fputs("\\\"", stdout);
            i++;
        } else if (c >= 0x20 && c < 0x7f) {
            putchar(c);
            i++;
        } else if (c == '\n') {
            fputs("\\n", stdout);
            i++;
        } else if (c == '\t') {
            fputs("\\t", stdout);
            i++;
        } else if (c == '\r') {
            fputs("\\r", stdout);
            i++;
        } else {
            uint32_t cp = 0;
            size_t k = 0;
            if (c < 0x80) {
                cp = c;
                k = 1;
            } else if (c >= 0xc2 && c <= 0xdf && i + 1 < len && (p[i + 1] & 0xc0) == 0x80) {
                cp = ((uint32_t)(c & 0x1f) << 6) | (p[i + 1] & 0x3f);
                k = 2;
            } else if (c >= 0xe0 && c <= 0xef && i + 2 < len && (p[i + 1] & 0xc0) == 0x80 &&
                       (p[i + 2] & 0xc0) == 0x80) {
                cp = ((uint32_t)(c & 0x0f) << 12) | ((uint32_t)(p[i + 1] & 0x3f) << 6) |
                     (p[i + 2] & 0x3f);
                k = cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff) ? 3 : 0;
            } else if (c >= 0xf0 && c <= 0xf4 && i + 3 < len && (p[i + 1] & 0xc0) == 0x80 &&
                       (p[i + 2] & 0xc0) == 0x80 && (p[i + 3] & 0xc0) == 0x80) {
                cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(p[i + 1] & 0x3f) << 12) |
                     ((uint32_t)(p[i + 2] & 0x3f) << 6) | (p[i + 3] & 0x3f);
                k = cp >= 0x10000 && cp <= 0x10ffff ? 4 : 0;
            }
            if (k == 0) {
                printf("\\x%02X", c);
                i++;
            } else {
                printf("\\u{%04" PRIX32 "}", cp);
                i += k;
            }
        }
    }
    putchar('"');
    if (n < len)
        printf("... (%zu bytes)", len);
}

/* The length of the longest prefix of s that is whole, valid UTF-8 (the rules of RFC 3629:
 * no overlong forms, no surrogates, nothing above U+10FFFF). */
static size_t utf8_valid_prefix(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        size_t k;
        uint32_t min;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xc2 && c <= 0xdf) {
            k = 2;
            min = 0x80;
        } else if (c >= 0xe0 && c <= 0xef) {
            k = 3;
            min = 0x800;
        } else if (c >= 0xf0 && c <= 0xf4) {
            k = 4;
            min = 0x10000;
        } else {
            return i;
        }
        if (i + k > len)
            return i;
        uint32_t cp = c & (0xff >> (k + 1));
        for (size_t j = 1; j < k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return i;
            cp = (cp << 6) | (s[i + j] & 0x3f);
        }
        if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return i;
        i += k;
    }
    return len;
}

/* The ids of a JSON array; -1 (after a message) when it is not an array of integers. */
static int json_ids(const json_t *a, TokenizerIds *out)
{
    if (!json_is_array(a))
        return -1;
    size_t n = json_array_size(a);
    out->len = 0;
    if (n > out->cap) {
        int32_t *p = realloc(out->ids, n * sizeof *p);
        if (p == NULL)
            return -1;
        out->ids = p;
        out->cap = n;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(a, i);
        if (!json_is_integer(v))
            return -1;
        out->ids[i] = (int32_t)json_integer_value(v);
    }
    out->len = n;
    return 0;
}

static void print_ids_window(const char *label, const int32_t *ids, size_t n, size_t from)
{
    printf("      %s (%zu ids): [", label, n);
    if (from > 0)
        printf("... ");
    for (size_t i = from; i < n && i < from + COMPARE_SHOW_IDS; i++)
        printf("%s%" PRId32, i > from ? ", " : "", ids[i]);
    if (from + COMPARE_SHOW_IDS < n)
        printf(", ...");
    printf("]\n");
}

static bool should_show(enum check c)
{
    return g.mismatched[c] <= g.show;
}

static void report_header(enum check c, const char *kind, const char *text, size_t text_len)
{
    printf("  MISMATCH %s, line %" PRIu64 " (%s): ", check_names[c], g.line, kind);
    if (text != NULL)
        print_escaped(text, text_len);
    else
        printf("(random ids)");
    printf("\n");
}

static void check_ids(enum check c, const char *kind, const char *text, size_t text_len,
                      const TokenizerIds *want, const TokenizerIds *got, int rc)
{
    g.compared[c]++;
    size_t pos = 0;
    while (pos < want->len && pos < got->len && want->ids[pos] == got->ids[pos])
        pos++;
    if (rc == 0 && pos == want->len && pos == got->len)
        return;
    g.mismatched[c]++;
    if (!should_show(c))
        return;
    report_header(c, kind, text, text_len);
    if (rc != 0) {
        char buf[600];
        printf("      error: %s\n", pagoda_error_message(rc, buf, sizeof buf));
    }
    size_t from = pos > 4 ? pos - 4 : 0;
    printf("      first difference at id %zu\n", pos);
    print_ids_window("HF    ", want->ids, want->len, from);
    print_ids_window("pagoda", got->ids, got->len, from);
}

static void check_text(enum check c, const char *kind, const char *text, size_t text_len,
                       const TokenizerIds *ids, const char *want, size_t want_len, const char *got,
                       size_t got_len, int rc)
{
    g.compared[c]++;
    if (rc == 0 && want_len == got_len && (want_len == 0 || memcmp(want, got, want_len) == 0))
        return;
    g.mismatched[c]++;
    if (!should_show(c))
        return;
    report_header(c, kind, text, text_len);
    if (rc != 0) {
        char buf[600];
        printf("      error: %s\n", pagoda_error_message(rc, buf, sizeof buf));
    }
    print_ids_window("ids", ids->ids, ids->len, 0);
    size_t pos = 0;
    while (got != NULL && pos < want_len && pos < got_len && want[pos] == got[pos])
        pos++;
    printf("      first difference at byte %zu\n      HF:     ", pos);
    print_escaped(want, want_len);
    printf("\n      pagoda: ");
    if (got != NULL)
        print_escaped(got, got_len);
    printf("\n");
}

/* Streams ids through a TokenizerStream: the joined deltas must equal want (HF's decode), each
 * delta must be whole UTF-8 and the buffer NUL-terminated after each step. */
static void check_stream(const Tokenizer *t, enum check c, bool skip, const char *kind,
                         const char *text, size_t text_len, const TokenizerIds *ids,
                         const char *want, size_t want_len)
{
    TokenizerStream *s = NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    bool whole = true;
    size_t bad_delta = 0, bad_from = 0, bad_to = 0;
    int rc = tokenizer_stream_new(t, skip, &s);
    for (size_t i = 0; rc == 0 && i <= ids->len; i++) {
        size_t before = len;
        if (i < ids->len)
            rc = tokenizer_stream_step(s, ids->ids[i], &buf, &len, &cap);
        else
            rc = tokenizer_stream_finish(s, &buf, &len, &cap);
        if (rc != 0)
            break;
        bool nul = len == 0 ? (buf == NULL || buf[0] == '\0') : buf[len] == '\0';
        if (whole && (len < before || !nul ||
                      utf8_valid_prefix((const unsigned char *)buf + before, len - before) !=
                          len - before)) {
            whole = false;
            bad_delta = i;
            bad_from = before;
            bad_to = len;
        }
    }
    check_text(c, kind, text, text_len, ids, want, want_len, buf, len, rc);
    if (rc == 0) {
        g.compared[CHECK_STREAM_UTF8]++;
        if (!whole) {
            g.mismatched[CHECK_STREAM_UTF8]++;
            if (should_show(CHECK_STREAM_UTF8)) {
                report_header(CHECK_STREAM_UTF8, kind, text, text_len);
                print_ids_window("ids", ids->ids, ids->len, 0);
                printf("      skip_special_tokens %s: after id %zu the delta bytes %zu..%zu are "
                       "not whole UTF-8 (or the buffer shrank or lost its NUL): ",
                       skip ? "true" : "false", bad_delta, bad_from, bad_to);
                if (bad_to >= bad_from && buf != NULL)
                    print_escaped(buf + bad_from, bad_to - bad_from);
                printf("\n");
            }
        }
    }
    free(buf);
    tokenizer_stream_free(s);
}

static void check_decode(const Tokenizer *t, enum check c, bool skip, const char *kind,
                         const char *text, size_t text_len, const TokenizerIds *ids,
                         const json_t *want)
{
    char *got = NULL;
    size_t got_len = 0;
    int rc = tokenizer_decode(t, ids->ids, ids->len, skip, &got, &got_len);
    check_text(c, kind, text, text_len, ids, json_string_value(want), json_string_length(want), got,
               got_len, rc);
    free(got);
}

static int compare_string(const Tokenizer *t, json_t *rec, const char *kind, TokenizerIds *want,
                          TokenizerIds *want_plain)
{
    const json_t *jtext = json_object_get(rec, "text");
    const json_t *dec = json_object_get(rec, "dec");
    if (!json_is_string(jtext) || json_ids(json_object_get(rec, "ids"), want) != 0 ||
        json_ids(json_object_get(rec, "ids_plain"), want_plain) != 0 || !json_is_array(dec) ||
        json_array_size(dec) != 4)
        return -1;
    for (size_t i = 0; i < 4; i++)
        if (!json_is_string(json_array_get(dec, i)))
            return -1;
    const char *text = json_string_value(jtext);
    size_t text_len = json_string_length(jtext);
    g.strings++;

    TokenizerIds got = {0};
    double t0 = now_s();
    int rc = tokenizer_encode(t, text, text_len, true, &got);
    g.encode_s += now_s() - t0;
    g.encoded_bytes += text_len;
    check_ids(CHECK_ENCODE_SPECIAL, kind, text, text_len, want, &got, rc);
    got.len = 0;
    rc = tokenizer_encode(t, text, text_len, false, &got);
    check_ids(CHECK_ENCODE_PLAIN, kind, text, text_len, want_plain, &got, rc);
    tokenizer_ids_fini(&got);

    const TokenizerIds *lists[2] = {want, want_plain};
    for (size_t l = 0; l < 2; l++) {
        for (size_t skip = 0; skip < 2; skip++) {
            const json_t *w = json_array_get(dec, l * 2 + skip);
            check_decode(t, skip ? CHECK_DECODE_SKIP : CHECK_DECODE, skip, kind, text, text_len,
                         lists[l], w);
            check_stream(t, skip ? CHECK_STREAM_SKIP : CHECK_STREAM, skip, kind, text, text_len,
                         lists[l], json_string_value(w), json_string_length(w));
        }
    }
    return 0;
}

static int compare_sequence(const Tokenizer *t, json_t *rec, const char *kind, TokenizerIds *ids)
{
    const json_t *dec = json_object_get(rec, "dec");
    if (json_ids(json_object_get(rec, "ids"), ids) != 0 || !json_is_array(dec) ||
        json_array_size(dec) != 2 || !json_is_string(json_array_get(dec, 0)) ||
        !json_is_string(json_array_get(dec, 1)))
        return -1;
    g.sequences++;
    for (size_t skip = 0; skip < 2; skip++) {
        const json_t *w = json_array_get(dec, skip);
        check_decode(t, skip ? CHECK_RAND_DECODE_SKIP : CHECK_RAND_DECODE, skip, kind, NULL, 0, ids,
                     w);
        check_stream(t, skip ? CHECK_RAND_STREAM_SKIP : CHECK_RAND_STREAM, skip, kind, NULL, 0, ids,
                     json_string_value(w), json_string_length(w));
    }
    return 0;
}

static void vocab_mismatch(enum check c, long long id, const char *want, const char *got)
{
    g.mismatched[c]++;
    if (!should_show(c))
        return;
    printf("  MISMATCH %s, line %" PRIu64 ", id %lld\n      HF:     %s\n      pagoda: %s\n",
           check_names[c], g.line, id, want, got);
}

/* The vocabulary record: its size, each id's string, the id of each string. */
static int compare_vocab(const Tokenizer *t, json_t *rec)
{
    const json_t *size = json_object_get(rec, "vocab_size");
    const json_t *tokens = json_object_get(rec, "tokens");
    const json_t *to_id = json_object_get(rec, "to_id");
    if (!json_is_integer(size) || !json_is_array(tokens) || !json_is_array(to_id) ||
        json_array_size(tokens) != json_array_size(to_id))
        return -1;
    char want[32], got[32];
    g.compared[CHECK_VOCAB_SIZE]++;
    if ((json_int_t)tokenizer_vocab_size(t) != json_integer_value(size)) {
        snprintf(want, sizeof want, "%lld", (long long)json_integer_value(size));
        snprintf(got, sizeof got, "%zu", tokenizer_vocab_size(t));
        vocab_mismatch(CHECK_VOCAB_SIZE, -1, want, got);
    }
    for (size_t id = 0; id < json_array_size(tokens); id++) {
        const json_t *w = json_array_get(tokens, id);
        const json_t *wid = json_array_get(to_id, id);
        const char *mine = tokenizer_id_to_token(t, (int32_t)id);
        g.compared[CHECK_ID_TO_TOKEN]++;
        if (json_is_null(w) ? mine != NULL
                            : mine == NULL || strcmp(mine, json_string_value(w)) != 0)
            vocab_mismatch(CHECK_ID_TO_TOKEN, (long long)id,
                           json_is_null(w) ? "(none)" : json_string_value(w),
                           mine == NULL ? "(none)" : mine);
        if (!json_is_string(w))
            continue;
        int32_t back = tokenizer_token_to_id(t, json_string_value(w));
        g.compared[CHECK_TOKEN_TO_ID]++;
        if (!json_is_integer(wid) || back != json_integer_value(wid)) {
            snprintf(want, sizeof want, "%lld",
                     json_is_integer(wid) ? (long long)json_integer_value(wid) : -1LL);
            snprintf(got, sizeof got, "%" PRId32, back);
            vocab_mismatch(CHECK_TOKEN_TO_ID, (long long)id, want, got);
        }
    }
    return 0;
}

static int usage(void)
{
    fprintf(stderr, "usage: tokenizer_compare [--show N] [--min-strings N] TOKENIZER_JSON "
                    "REF_JSONL\n       tokenizer_compare --eos MODEL_DIR\n");
    return 2;
}

static int print_eos(const char *model_dir)
{
    struct model_config c;
    int rc = model_config_load(model_dir, &c);
    if (rc == 0)
        rc = model_config_add_tokenizer_eos(model_dir, &c, NULL, 0);
    if (rc != 0) {
        char buf[600];
        fprintf(stderr, "tokenizer_compare: %s\n", pagoda_error_message(rc, buf, sizeof buf));
        return 2;
    }
    for (int i = 0; i < c.num_eos; i++)
        printf("%s%" PRId32, i ? " " : "", c.eos_token_ids[i]);
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--eos") == 0)
        return print_eos(argv[2]);
    unsigned long min_strings = 0;
    int i = 1;
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        char *end;
        errno = 0;
        unsigned long v = strtoul(argv[i + 1], &end, 10);
        if (errno != 0 || *end != '\0')
            return usage();
        if (strcmp(argv[i], "--show") == 0)
            g.show = (unsigned)v;
        else if (strcmp(argv[i], "--min-strings") == 0)
            min_strings = v;
        else
            return usage();
    }
    if (argc - i != 2)
        return usage();
    const char *tok_path = argv[i], *ref_path = argv[i + 1];

    Tokenizer *t = NULL;
    double t0 = now_s();
    int rc = tokenizer_new_from_file(tok_path, &t);
    if (rc != 0) {
        char buf[600];
        fprintf(stderr, "tokenizer_compare: %s: %s\n", tok_path,
                pagoda_error_message(rc, buf, sizeof buf));
        return 2;
    }
    double load_s = now_s() - t0;
    FILE *f = fopen(ref_path, "r");
    if (f == NULL) {
        fprintf(stderr, "tokenizer_compare: %s: %s\n", ref_path, strerror(errno));
        tokenizer_free(t);
        return 2;
    }
    printf("tokenizer_compare: %s (loaded in %.2f s, vocabulary %zu) against %s\n", tok_path,
           load_s, tokenizer_vocab_size(t), ref_path);

    char *line = NULL;
    size_t line_cap = 0;
    ssize_t n;
    TokenizerIds want = {0}, want_plain = {0};
    int status = 0;
    while ((n = getline(&line, &line_cap, f)) > 0) {
        g.line++;
        if ((size_t)n > COMPARE_MAX_LINE_BYTES) {
            fprintf(stderr, "tokenizer_compare: %s:%" PRIu64 ": longer than %u bytes\n", ref_path,
                    g.line, COMPARE_MAX_LINE_BYTES);
            status = 2;
            break;
        }
        json_error_t err;
        json_t *rec = json_loadb(line, (size_t)n, JSON_ALLOW_NUL, &err);
        const json_t *jkind = rec != NULL ? json_object_get(rec, "kind") : NULL;
        const char *kind = json_is_string(jkind) ? json_string_value(jkind) : NULL;
        int r = -1;
        if (rec != NULL && json_object_get(rec, "header") != NULL) {
            char *h = json_dumps(json_object_get(rec, "header"), JSON_COMPACT);
            printf("references: %s\n", h != NULL ? h : "?");
            free(h);
            r = 0;
        } else if (kind != NULL && strcmp(kind, "vocab") == 0) {
            r = compare_vocab(t, rec);
        } else if (kind != NULL && strncmp(kind, "ids:", 4) == 0) {
            r = compare_sequence(t, rec, kind, &want);
        } else if (kind != NULL) {
            r = compare_string(t, rec, kind, &want, &want_plain);
        }
        json_decref(rec);
        if (r != 0) {
            fprintf(stderr, "tokenizer_compare: %s:%" PRIu64 ": not a reference record%s%s\n",
                    ref_path, g.line, rec == NULL ? ": " : "", rec == NULL ? err.text : "");
            status = 2;
            break;
        }
    }
    free(line);
    fclose(f);
    free(want.ids); /* filled by json_ids, not by the library */
    free(want_plain.ids);
    tokenizer_free(t);
    if (status != 0)
        return status;

    uint64_t total = 0;
    printf("%-32s %10s %10s\n", "check", "compared", "mismatches");
    for (int c = 0; c < CHECK_COUNT; c++) {
        printf("%-32s %10" PRIu64 " %10" PRIu64 "\n", check_names[c], g.compared[c],
               g.mismatched[c]);
        total += g.mismatched[c];
    }
    printf("strings %" PRIu64 ", random id sequences %" PRIu64 ", mismatches %" PRIu64
           ", encoding %.2f MB/s (with add_special_tokens, sanitizers make it slower)\n",
           g.strings, g.sequences, total,
           g.encode_s > 0 ? (double)g.encoded_bytes / g.encode_s / 1e6 : 0.0);
    /* One line for tests/tokenizer/run's table. */
    uint64_t enc = g.mismatched[CHECK_ENCODE_SPECIAL] + g.mismatched[CHECK_ENCODE_PLAIN];
    uint64_t dec = g.mismatched[CHECK_DECODE] + g.mismatched[CHECK_DECODE_SKIP] +
                   g.mismatched[CHECK_RAND_DECODE] + g.mismatched[CHECK_RAND_DECODE_SKIP];
    uint64_t voc = g.mismatched[CHECK_VOCAB_SIZE] + g.mismatched[CHECK_ID_TO_TOKEN] +
                   g.mismatched[CHECK_TOKEN_TO_ID];
    printf("summary strings=%" PRIu64 " sequences=%" PRIu64 " encode=%" PRIu64 " decode=%" PRIu64
           " stream=%" PRIu64 " vocab=%" PRIu64 "\n",
           g.strings, g.sequences, enc, dec, total - enc - dec - voc, voc);
    if (g.compared[CHECK_VOCAB_SIZE] == 0) {
        printf("FAIL: the references hold no vocabulary record\n");
        return 1;
    }
    if (g.strings < min_strings) {
        printf("FAIL: %" PRIu64 " strings, fewer than the %lu asked for\n", g.strings, min_strings);
        return 1;
    }
    return total == 0 ? 0 : 1;
}
