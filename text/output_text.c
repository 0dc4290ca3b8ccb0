#include "text/output_text.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

struct output_text {
    const Tokenizer *tok;
    TokenizerStream *stream;
    char *text; /* everything decoded so far (cut at a stop), NUL-terminated */
    size_t len, cap;
    size_t visible;    /* of text, what clients may see */
    size_t *token_end; /* [num_tokens] visible when each token arrived */
    uint32_t num_tokens, cap_tokens;
    char **stops;
    size_t *stop_lens;
    size_t num_stops;
    /* Per stop string: its prefix function (pi[j]: the longest proper prefix of stop[0..j] that
     * is also its suffix) and how much of it the text ends with (the longest prefix of the stop
     * that is a suffix of text[0..len), always shorter than the stop: a whole one ends the
     * output). What is held back is the longest of these. */
    uint16_t **pi;
    uint16_t *partial;
    size_t vocab;
    bool over;           /* stopped or finished */
    bool keep_stops;     /* output_text_keep_stops */
    uint32_t min_tokens; /* output_text_min_tokens */
};

/* Whether s[0..len) is well-formed UTF-8 (RFC 3629: no overlongs, surrogates or values above
 * U+10FFFF). */
static bool utf8_valid(const unsigned char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        unsigned char c = s[i];
        size_t n;
        uint32_t cp;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            n = 1;
            cp = c & 0x1F;
        } else if (c >= 0xE0 && c <= 0xEF) {
            n = 2;
            cp = c & 0x0F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            n = 3;
            cp = c & 0x07;
        } else {
            return false;
        }
        if (i + n >= len)
            return false;
        for (size_t k = 1; k <= n; k++) {
            if ((s[i + k] & 0xC0) != 0x80)
                return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
            (cp >= 0xD800 && cp <= 0xDFFF))
            return false;
        i += n + 1;
    }
    return true;
}

/* pi[j] for j in [0, n): the length of the longest proper prefix of s[0..j] that is also its
 * suffix (Knuth-Morris-Pratt's failure function). */
static void prefix_function(const char *s, size_t n, uint16_t *pi)
{
    pi[0] = 0;
    for (size_t j = 1; j < n; j++) {
        size_t k = pi[j - 1];
        while (k > 0 && s[j] != s[k])
            k = pi[k - 1];
        pi[j] = (uint16_t)(s[j] == s[k] ? k + 1 : k);
    }
}

int output_text_new(const Tokenizer *t, bool skip_special_tokens, const char *const *stops,
                    const size_t *stop_lens, size_t num_stops, struct output_text **out)
{
    if (num_stops > OUTPUT_TEXT_MAX_STOPS)
        return pagoda_error_set(PAGODA_ERANGE, "%zu stop strings, more than the limit of %u",
                                num_stops, OUTPUT_TEXT_MAX_STOPS);
    for (size_t i = 0; i < num_stops; i++) {
        if (stop_lens[i] == 0)
            return pagoda_error_set(PAGODA_EINVAL, "stop string %zu is empty", i);
        if (stop_lens[i] > OUTPUT_TEXT_MAX_STOP_BYTES)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "stop string %zu has %zu bytes, more than the limit of %u", i,
                                    stop_lens[i], OUTPUT_TEXT_MAX_STOP_BYTES);
        if (!utf8_valid((const unsigned char *)stops[i], stop_lens[i]))
            return pagoda_error_set(PAGODA_EINVAL, "stop string %zu is not valid UTF-8", i);
    }
    struct output_text *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory for the output's text");
    o->tok = t;
    o->vocab = tokenizer_vocab_size(t);
    int rc = tokenizer_stream_new(t, skip_special_tokens, &o->stream);
    if (rc != 0)
        goto fail;
    rc = PAGODA_ENOMEM;
    if ((o->text = malloc(64)) == NULL)
        goto fail;
    o->cap = 64;
    o->text[0] = '\0';
    if (num_stops > 0) {
        o->stops = calloc(num_stops, sizeof(*o->stops));
        o->stop_lens = calloc(num_stops, sizeof(*o->stop_lens));
        o->pi = calloc(num_stops, sizeof(*o->pi));
        o->partial = calloc(num_stops, sizeof(*o->partial));
        if (o->stops == NULL || o->stop_lens == NULL || o->pi == NULL || o->partial == NULL)
            goto fail;
        o->num_stops = num_stops;
        for (size_t i = 0; i < num_stops; i++) {
            size_t n = stop_lens[i];
            if ((o->stops[i] = malloc(n)) == NULL ||
                (o->pi[i] = malloc(n * sizeof(uint16_t))) == NULL)
                goto fail;
            memcpy(o->stops[i], stops[i], n);
            o->stop_lens[i] = n;
            prefix_function(o->stops[i], n, o->pi[i]);
        }
    }
    *out = o;
    return 0;
fail:
    output_text_free(o);
    return rc == PAGODA_ENOMEM ? pagoda_error_set(rc, "out of memory for the output's text") : rc;
}

void output_text_free(struct output_text *o)
{
    if (o == NULL)
        return;
    tokenizer_stream_free(o->stream);
    for (size_t i = 0; i < o->num_stops; i++) {
        free(o->stops[i]);
        free(o->pi ? o->pi[i] : NULL);
    }
    free(o->pi);
    free(o->partial);
    free(o->stops);
    free(o->stop_lens);
    free(o->token_end);
    free(o->text);
    free(o);
}

void output_text_keep_stops(struct output_text *o)
{
    o->keep_stops = true;
}

void output_text_min_tokens(struct output_text *o, uint32_t n)
{
    o->min_tokens = n;
}

/* Looks for the earliest stop string that ends in text[from..len): a match may begin up to
 * longest-stop - 1 bytes before from. Cuts the text there (after the stop with keep_stops) and
 * returns the stop's index + 1, or 0. */
static int find_stop(struct output_text *o, size_t from)
{
    size_t best = SIZE_MAX;
    int which = 0;
    for (size_t i = 0; i < o->num_stops; i++) {
        size_t n = o->stop_lens[i];
        size_t start = from >= n - 1 ? from - (n - 1) : 0;
        if (o->len < start + n)
            continue;
        const char *hit = memmem(o->text + start, o->len - start, o->stops[i], n);
        if (hit != NULL && (size_t)(hit - o->text) < best) {
            best = (size_t)(hit - o->text);
            which = (int)i + 1;
        }
    }
    if (which != 0) {
        /* Everything before the stop is final now; nothing after it was ever visible (text
         * that could begin a stop is held back, or with keep_stops the match ends in the new
         * text). */
        if (o->keep_stops)
            best += o->stop_lens[which - 1];
        o->len = best;
        o->text[best] = '\0';
        o->visible = best;
    }
    return which;
}

/* Moves the visible end forward to what can no longer begin a stop string, on a character
 * boundary: text[from..len) is new and completes no stop string; all: nothing is held back. Only
 * a tail that is the beginning of a stop string is held (not the last longest-stop - 1 bytes
 * whatever they are, as vLLM holds), so that a token's text shows with it unless it may begin a
 * stop. */
static void advance_visible(struct output_text *o, size_t from, bool all)
{
    size_t hold = 0;
    for (size_t i = 0; i < o->num_stops && !all && !o->keep_stops; i++) {
        const char *stop = o->stops[i];
        const uint16_t *pi = o->pi[i];
        size_t n = o->stop_lens[i], q = o->partial[i];
        for (size_t j = from; j < o->len; j++) {
            while (q > 0 && (q == n || stop[q] != o->text[j]))
                q = pi[q - 1];
            if (stop[q] == o->text[j])
                q++;
        }
        o->partial[i] = (uint16_t)q;
        if (q > hold)
            hold = q;
    }
    size_t v = o->len > hold ? o->len - hold : 0;
    while (v > 0 && v < o->len && ((unsigned char)o->text[v] & 0xC0) == 0x80)
        v--;
    if (v > o->visible)
        o->visible = v;
}

int output_text_push(struct output_text *o, int32_t id, int *stop)
{
    *stop = 0;
    if (o->over)
        return pagoda_error_set(PAGODA_ECLOSED, "the output has ended");
    if (o->num_tokens == o->cap_tokens) {
        uint32_t cap = o->cap_tokens ? 2 * o->cap_tokens : 16;
        size_t *e = realloc(o->token_end, (size_t)cap * sizeof(*e));
        if (e == NULL)
            return pagoda_error_set(PAGODA_ENOMEM, "out of memory for the output's text");
        o->token_end = e;
        o->cap_tokens = cap;
    }
    size_t before = o->len;
    if (id >= 0 && (size_t)id < o->vocab) {
        /* An id the tokenizer has no string for (a gap in its vocabulary) adds no text. */
        int rc = tokenizer_stream_step(o->stream, id, &o->text, &o->len, &o->cap);
        if (rc != 0 && rc != PAGODA_EINVAL)
            return rc;
    }
    /* (a token within the first min_tokens does not end the output) */
    if (o->num_stops > 0 && o->len > before && o->num_tokens >= o->min_tokens &&
        (*stop = find_stop(o, before)) != 0) {
        o->over = true;
        tokenizer_stream_free(o->stream); /* no more text: what a finished output keeps is less */
        o->stream = NULL;
    } else {
        advance_visible(o, before, false);
    }
    o->token_end[o->num_tokens++] = o->visible;
    return 0;
}

int output_text_finish(struct output_text *o, int *stop)
{
    *stop = 0;
    if (o->over)
        return 0;
    size_t before = o->len;
    int rc = tokenizer_stream_finish(o->stream, &o->text, &o->len, &o->cap);
    if (rc != 0)
        return rc;
    o->over = true;
    tokenizer_stream_free(o->stream);
    o->stream = NULL;
    /* (the held-back text is the last token's) */
    if (o->num_stops > 0 && o->len > before && o->num_tokens > o->min_tokens &&
        (*stop = find_stop(o, before)) != 0)
        return 0;
    advance_visible(o, before, true);
    return 0;
}

const char *output_text_visible(const struct output_text *o, size_t *len)
{
    *len = o->visible;
    return o->text;
}

size_t output_text_start(const struct output_text *o, uint32_t offset)
{
    /* clamped first: an offset past an output without tokens yet is 0 (a poll may ask ahead) */
    if (offset > o->num_tokens)
        offset = o->num_tokens;
    if (offset == 0)
        return 0;
    return o->token_end[offset - 1];
}

size_t output_text_bytes(const struct output_text *o)
{
    size_t b = sizeof(*o) + o->cap + (size_t)o->cap_tokens * sizeof(size_t);
    for (size_t i = 0; i < o->num_stops; i++)
        b += 3 * o->stop_lens[i] + 2 * sizeof(char *) + sizeof(size_t) + sizeof(uint16_t);
    return b;
}

const char *output_text_stop(const struct output_text *o, int index, size_t *len)
{
    *len = o->stop_lens[index - 1];
    return o->stops[index - 1];
}
