/* Decoders, run as a chain of streaming stages. HF's decoders map a list of token strings to
 * another list (decode_chain) and the result is joined; here each stage takes the tokens one at
 * a time and passes on, at once, everything no later token can change, holding back the rest:
 *
 *   ByteLevel     characters back to bytes; the bytes lossily to UTF-8 (an incomplete trailing
 *                 sequence, at most 3 bytes, is held)
 *   ByteFallback  runs of <0xNN> tokens: one string when the run is valid UTF-8, one U+FFFD per
 *                 byte when not; a run still valid is held (a later byte may spoil it)
 *   Fuse          the tokens become one running text
 *   Strip         up to `start` leading and `stop` trailing `content` characters of each token
 *                 (of the whole text after a Fuse: the trailing ones are held)
 *   Replace       a string pattern (after a Fuse, a partial match at the end is held)
 *   Metaspace     U+2581 to a space; in the first token it is dropped (prepend_scheme not never)
 *
 * After a Fuse or a ByteLevel a stage's input is one running text (text_in) rather than a list
 * of tokens. tokenizer_decode feeds every id and finishes; the stream does the same one id at a
 * time, so the stream's pieces join to exactly tokenizer_decode's text. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

typedef struct Stage {
    TokBuf hold;    /* what the stage holds back */
    TokBuf out;     /* its output for the step in progress */
    TokLossy lossy; /* ByteLevel */
    uint64_t ntokens;
    uint32_t start_left; /* Strip on running text: leading characters still to strip */
    bool started;
    bool group_invalid; /* ByteFallback: the current run is already invalid UTF-8 */
    size_t valid_upto;  /* ByteFallback: the held run is valid and whole up to here */
} Stage;

struct TokDecodeState {
    const Tokenizer *t;
    bool skip_special;
    bool bounded;
    Stage st[TOK_MAX_STAGES];
};

static const char FFFD[3] = {(char)0xEF, (char)0xBF, (char)0xBD};

static int push(TokDecodeState *d, size_t i, const char *p, size_t n, TokBuf *sink);
static int finish(TokDecodeState *d, size_t i, TokBuf *sink);

/* Whether the held run b[0..n) is valid UTF-8 up to an incomplete (but so far well-formed)
 * last sequence; *complete says whether there is no such tail. *upto is how far the run is
 * already known valid and whole (it only grows while the run does, so each byte is looked at
 * a bounded number of times). */
static bool utf8_prefix_ok(const char *b, size_t n, size_t *upto, bool *complete)
{
    *upto += tok_utf8_valid_prefix(b + *upto, n - *upto);
    *complete = *upto == n;
    return *complete || tok_utf8_is_partial(b + *upto, n - *upto);
}

static int byte_token(const char *p, size_t n)
{
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>')
        return -1;
    int v = 0;
    for (int k = 3; k < 5; k++) {
        char c = p[k];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                : (k == 3 && c == '+') ? 0 /* Rust's from_str_radix takes a '+' sign */
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* ---- ByteLevel ---- */

static int bytelevel_token(TokDecodeState *d, size_t i, const char *p, size_t n, TokBuf *sink)
{
    Stage *s = &d->st[i];
    TokBuf *bytes = &s->hold;
    bytes->len = 0;
    if (tokbuf_reserve(bytes, n))
        return PAGODA_ENOMEM;
    bool mapped = true;
    for (size_t k = 0; k < n;) {
        size_t adv;
        int b = tok_bytelevel_byte(tok_utf8_decode(p + k, n - k, &adv));
        if (b < 0) {
            mapped = false;
            break;
        }
        bytes->data[bytes->len++] = (char)b;
        k += adv;
    }
    const char *src = mapped ? bytes->data : p; /* HF: an unmapped character, raw bytes */
    size_t len = mapped ? bytes->len : n;
    s->out.len = 0;
    int rc = tok_lossy_feed(&s->lossy, (const unsigned char *)src, len, false, &s->out);
    if (!rc && s->out.len)
        rc = push(d, i + 1, s->out.data, s->out.len, sink);
    return rc;
}

/* ---- ByteFallback ---- */

static int emit_fffd_tokens(TokDecodeState *d, size_t i, size_t count, TokBuf *sink)
{
    for (size_t k = 0; k < count; k++) {
        int rc = push(d, i + 1, FFFD, 3, sink);
        if (rc)
            return rc;
    }
    return 0;
}

static int bytefallback_flush(TokDecodeState *d, size_t i, TokBuf *sink)
{
    Stage *s = &d->st[i];
    int rc = 0;
    if (s->hold.len) {
        bool complete;
        utf8_prefix_ok(s->hold.data, s->hold.len, &s->valid_upto, &complete);
        s->out.len = 0;
        if (complete)
            rc = tokbuf_append(&s->out, s->hold.data, s->hold.len);
        size_t nbytes = s->hold.len;
        s->hold.len = 0;
        s->valid_upto = 0;
        if (!rc)
            rc = complete ? push(d, i + 1, s->out.data, s->out.len, sink)
                          : emit_fffd_tokens(d, i, nbytes, sink);
    }
    s->group_invalid = false;
    return rc;
}

static int bytefallback_token(TokDecodeState *d, size_t i, const char *p, size_t n, TokBuf *sink)
{
    Stage *s = &d->st[i];
    int b = byte_token(p, n);
    if (b < 0) {
        int rc = bytefallback_flush(d, i, sink);
        return rc ? rc : push(d, i + 1, p, n, sink);
    }
    if (s->group_invalid) /* the run is U+FFFD per byte whatever follows */
        return emit_fffd_tokens(d, i, 1, sink);
    char c = (char)b;
    if (tokbuf_append(&s->hold, &c, 1))
        return PAGODA_ENOMEM;
    bool complete;
    if (!utf8_prefix_ok(s->hold.data, s->hold.len, &s->valid_upto, &complete)) {
        size_t nbytes = s->hold.len;
        s->hold.len = 0;
        s->valid_upto = 0;
        s->group_invalid = true;
        return emit_fffd_tokens(d, i, nbytes, sink);
    }
    if (d->bounded && complete && s->hold.len > TOK_STREAM_MAX_HELD_BYTES)
        return bytefallback_flush(d, i, sink); /* see TOK_STREAM_MAX_HELD_BYTES */
    return 0;
}

/* ---- Strip ---- */

static int strip_token(TokDecodeState *d, size_t i, const char *p, size_t n, TokBuf *sink)
{
    const TokDecoder *z = &d->t->dec[i];
    char c[4];
    size_t clen = tok_utf8_encode(z->strip_char, c);
    size_t a = 0, e = n;
    for (uint32_t k = 0; k < z->strip_start && a + clen <= e && memcmp(p + a, c, clen) == 0; k++)
        a += clen;
    for (uint32_t k = 0; k < z->strip_stop && e >= a + clen && memcmp(p + e - clen, c, clen) == 0;
         k++)
        e -= clen;
    return push(d, i + 1, p + a, e - a, sink);
}

static int strip_text(TokDecodeState *d, size_t i, const char *p, size_t n, TokBuf *sink)
{
    const TokDecoder *z = &d->t->dec[i];
    Stage *s = &d->st[i];
    char c[4];
    size_t clen = tok_utf8_encode(z->strip_char, c);
    s->out.len = 0;
    size_t k = 0;
    if (!s->started) {
        while (s->start_left > 0 && k + clen <= n && memcmp(p + k, c, clen) == 0) {
            k += clen;
            s->start_left--;
        }
        if (k < n)
            s->started = true;
    }
    while (k < n) {
        size_t adv;
        tok_utf8_decode(p + k, n - k, &adv);
        if (z->strip_stop && adv == clen && memcmp(p + k, c, clen) == 0) {
            if (tokbuf_append(&s->hold, c, clen))
                return PAGODA_ENOMEM;
            if (s->hold.len / clen > z->strip_stop) { /* the oldest can no longer be trailing */
                if (tokbuf_append(&s->out, c, clen))
                    return PAGODA_ENOMEM;
                s->hold.len -= clen;
            }
        } else {
            if (tokbuf_append(&s->out, s->hold.data, s->hold.len) ||
                tokbuf_append(&s->out, p + k, adv))
                return PAGODA_ENOMEM;
            s->hold.len = 0;
        }
        k += adv;
    }
    return s->out.len ? push(d, i + 1, s->out.data, s->out.len, sink) : 0;
}

/* ---- Replace ---- */

static int replace_into(const TokDecoder *z, const char *p, size_t n, TokBuf *out, size_t *tail)
{
    size_t k = 0;
    while (k < n) {
        const char *hit = z->pat_len <= n - k ? memmem(p + k, n - k, z->pat, z->pat_len) : NULL;
        size_t upto = hit ? (size_t)(hit - p) : n;
        if (!hit && tail) {
            /* keep back the longest end that could begin the pattern */
            size_t keep = z->pat_len - 1 < n - k ? z->pat_len - 1 : n - k;
            while (keep > 0 && memcmp(p + n - keep, z->pat, keep) != 0)
                keep--;
            upto = n - keep;
            *tail = keep;
        }
        if (tokbuf_append(out, p + k, upto - k))
            return PAGODA_ENOMEM;
        if (!hit)
            return 0;
        if (tokbuf_append(out, z->content, z->content_len))
            return PAGODA_ENOMEM;
        k = upto + z->pat_len;
    }
    if (tail)
        *tail = 0;
    return tokbuf_reserve(out, 0);
}

static int replace_stage(TokDecodeState *d, size_t i, const char *p, size_t n, TokBuf *sink)
{
    const TokDecoder *z = &d->t->dec[i];
    Stage *s = &d->st[i];
    s->out.len = 0;
    if (!z->text_in) {
        int rc = replace_into(z, p, n, &s->out, NULL);
        return rc ? rc : push(d, i + 1, s->out.data, s->out.len, sink);
    }
    if (tokbuf_append(&s->hold, p, n))
        return PAGODA_ENOMEM;
    size_t tail = 0;
    int rc = replace_into(z, s->hold.data, s->hold.len, &s->out, &tail);
    if (rc)
        return rc;
    memmove(s->hold.data, s->hold.data + s->hold.len - tail, tail);
    s->hold.len = tail;
    return s->out.len ? push(d, i + 1, s->out.data, s->out.len, sink) : 0;
}

/* ---- Metaspace ---- */

static int metaspace_stage(TokDecodeState *d, size_t i, const char *p, size_t n, TokBuf *sink)
{
    const TokDecoder *z = &d->t->dec[i];
    Stage *s = &d->st[i];
    bool first = z->text_in || s->ntokens == 0;
    bool drop = first && z->prepend_scheme != TOK_PREPEND_NEVER;
    s->ntokens++;
    s->out.len = 0;
    for (size_t k = 0; k < n;) {
        size_t adv;
        uint32_t cp = tok_utf8_decode(p + k, n - k, &adv);
        int rc = 0;
        if (cp != z->replacement)
            rc = tokbuf_append(&s->out, p + k, adv);
        else if (!drop)
            rc = tokbuf_append(&s->out, " ", 1);
        if (rc)
            return rc;
        k += adv;
    }
    if (z->text_in && s->out.len == 0)
        return 0;
    return push(d, i + 1, s->out.data, s->out.len, sink);
}

/* Stage i takes a token (or a chunk of running text); i == ndec is the output. */
static int push(TokDecodeState *d, size_t i, const char *p, size_t n, TokBuf *sink)
{
    if (i == d->t->ndec)
        return tokbuf_append(sink, p, n);
    const TokDecoder *z = &d->t->dec[i];
    Stage *s = &d->st[i];
    if (z->text_in && (z->kind == TOK_DEC_BYTELEVEL || z->kind == TOK_DEC_BYTEFALLBACK))
        return tokbuf_append(&s->hold, p, n); /* whole-token rules: decided at the end */
    switch (z->kind) {
    case TOK_DEC_BYTELEVEL:
        return bytelevel_token(d, i, p, n, sink);
    case TOK_DEC_BYTEFALLBACK:
        return bytefallback_token(d, i, p, n, sink);
    case TOK_DEC_FUSE:
        return n ? push(d, i + 1, p, n, sink) : 0;
    case TOK_DEC_STRIP:
        return z->text_in ? strip_text(d, i, p, n, sink) : strip_token(d, i, p, n, sink);
    case TOK_DEC_REPLACE:
        return replace_stage(d, i, p, n, sink);
    case TOK_DEC_METASPACE:
        return metaspace_stage(d, i, p, n, sink);
    case TOK_DEC_JOIN_SPACE:
        if (s->ntokens++ > 0) {
            int rc = push(d, i + 1, " ", 1, sink);
            if (rc)
                return rc;
        }
        return push(d, i + 1, p, n, sink);
    }
    return PAGODA_EINTERNAL;
}

static int finish(TokDecodeState *d, size_t i, TokBuf *sink)
{
    if (i == d->t->ndec)
        return 0;
    const TokDecoder *z = &d->t->dec[i];
    Stage *s = &d->st[i];
    int rc = 0;
    if (z->text_in && (z->kind == TOK_DEC_BYTELEVEL || z->kind == TOK_DEC_BYTEFALLBACK)) {
        /* the running text was one token: decode it now as such */
        TokBuf whole = s->hold;
        s->hold = (TokBuf){0};
        if (z->kind == TOK_DEC_BYTELEVEL) {
            rc = bytelevel_token(d, i, whole.data ? whole.data : "", whole.len, sink);
        } else if (whole.len) {
            rc = bytefallback_token(d, i, whole.data, whole.len, sink);
        }
        tokbuf_fini(&whole);
        if (rc)
            return rc;
    }
    switch (z->kind) {
    case TOK_DEC_BYTELEVEL:
        s->out.len = 0;
        rc = tok_lossy_feed(&s->lossy, NULL, 0, true, &s->out);
        if (!rc && s->out.len)
            rc = push(d, i + 1, s->out.data, s->out.len, sink);
        break;
    case TOK_DEC_BYTEFALLBACK:
        rc = bytefallback_flush(d, i, sink);
        break;
    case TOK_DEC_REPLACE:
        if (s->hold.len) {
            rc = push(d, i + 1, s->hold.data, s->hold.len, sink);
            s->hold.len = 0;
        }
        break;
    case TOK_DEC_STRIP: /* what is held is the trailing run: stripped */
        s->hold.len = 0;
        break;
    default:
        break;
    }
    return rc ? rc : finish(d, i + 1, sink);
}

int tok_decode_state_new(const Tokenizer *t, bool skip_special, bool bounded, TokDecodeState **out)
{
    TokDecodeState *d = calloc(1, sizeof(*d));
    if (!d)
        return PAGODA_ENOMEM;
    d->t = t;
    d->skip_special = skip_special;
    d->bounded = bounded;
    for (size_t i = 0; i < t->ndec; i++)
        d->st[i].start_left = t->dec[i].strip_start;
    *out = d;
    return 0;
}

void tok_decode_state_free(TokDecodeState *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < TOK_MAX_STAGES; i++) {
        tokbuf_fini(&d->st[i].hold);
        tokbuf_fini(&d->st[i].out);
    }
    free(d);
}

int tok_decode_state_push(TokDecodeState *d, int32_t id, TokBuf *out)
{
    size_t len;
    const char *s = tok_id_string(d->t, id, &len);
    if (!s)
        return pagoda_error_set(PAGODA_EINVAL, "token id %d is not in the vocabulary", id);
    if (d->skip_special && d->t->skip[id])
        return 0;
    return push(d, 0, s, len, out);
}

int tok_decode_state_finish(TokDecodeState *d, TokBuf *out)
{
    return finish(d, 0, out);
}

int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, bool skip_special_tokens,
                     char **text, size_t *text_len)
{
    if (!t || (!ids && n) || !text)
        return pagoda_error_set(PAGODA_EINVAL, "tokenizer_decode: a NULL argument");
    for (size_t i = 0; i < n; i++) {
        size_t len;
        if (!tok_id_string(t, ids[i], &len))
            return pagoda_error_set(PAGODA_EINVAL, "ids[%zu]: %d is not in the vocabulary", i,
                                    ids[i]);
    }
    TokDecodeState *d;
    int rc = tok_decode_state_new(t, skip_special_tokens, false, &d);
    if (rc)
        return rc;
    TokBuf out = {0};
    rc = tokbuf_reserve(&out, 16);
    if (!rc)
        out.data[0] = 0; /* no ids (or only skipped ones): "" */
    for (size_t i = 0; i < n && !rc; i++)
        rc = tok_decode_state_push(d, ids[i], &out);
    if (!rc)
        rc = tok_decode_state_finish(d, &out);
    tok_decode_state_free(d);
    if (rc) {
        tokbuf_fini(&out);
        return rc;
    }
    *text = out.data;
    if (text_len)
        *text_len = out.len;
    return 0;
}

/* ---- loading ---- */

static int parse_one(const json_t *j, const char *path, TokDecoder *chain, size_t *n, int depth,
                     bool *text)
{
    if (json_is_null(j))
        return 0;
    const json_t *type = json_object_get(j, "type");
    if (!json_is_object(j) || !json_is_string(type))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: not an object with a type", path);
    const char *t = json_string_value(type);
    if (strcmp(t, "Sequence") == 0) {
        const json_t *list = json_object_get(j, "decoders");
        if (!json_is_array(list))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.decoders: not an array", path);
        if (depth > 4)
            return pagoda_error_set(PAGODA_EFORMAT, "%s: Sequences nested too deep", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[256];
            snprintf(sub, sizeof(sub), "%s.decoders[%zu]", path, i);
            int rc = parse_one(json_array_get(list, i), sub, chain, n, depth + 1, text);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (*n >= TOK_MAX_STAGES - 1)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: more than %u decoders", path,
                                TOK_MAX_STAGES - 1);
    TokDecoder *z = &chain[*n];
    memset(z, 0, sizeof(*z));
    z->text_in = *text;
    if (strcmp(t, "ByteLevel") == 0) {
        z->kind = TOK_DEC_BYTELEVEL;
        *text = true;
    } else if (strcmp(t, "ByteFallback") == 0) {
        z->kind = TOK_DEC_BYTEFALLBACK;
    } else if (strcmp(t, "Fuse") == 0) {
        z->kind = TOK_DEC_FUSE;
        *text = true;
    } else if (strcmp(t, "Strip") == 0) {
        const json_t *c = json_object_get(j, "content");
        const json_t *a = json_object_get(j, "start"), *b = json_object_get(j, "stop");
        size_t adv = 0;
        if (!json_is_string(c) || json_string_length(c) == 0 ||
            (tok_utf8_decode(json_string_value(c), json_string_length(c), &adv), adv) !=
                json_string_length(c))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.content: not one character", path);
        if (!json_is_integer(a) || !json_is_integer(b) || json_integer_value(a) < 0 ||
            json_integer_value(b) < 0 || json_integer_value(a) > 1024 ||
            json_integer_value(b) > 1024)
            return pagoda_error_set(PAGODA_EFORMAT, "%s.start/stop: not counts (0 to 1024)", path);
        z->kind = TOK_DEC_STRIP;
        z->strip_char = tok_utf8_decode(json_string_value(c), json_string_length(c), &adv);
        z->strip_start = (uint32_t)json_integer_value(a);
        z->strip_stop = (uint32_t)json_integer_value(b);
    } else if (strcmp(t, "Replace") == 0) {
        const json_t *pat = NULL, *content = json_object_get(j, "content");
        int rc = tok_string_pattern(json_object_get(j, "pattern"), path, (const void **)&pat);
        if (rc)
            return rc;
        if (!json_is_string(content))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.content: not a string", path);
        z->kind = TOK_DEC_REPLACE;
        z->pat_len = json_string_length(pat);
        z->content_len = json_string_length(content);
        z->pat = malloc(z->pat_len + 1);
        z->content = malloc(z->content_len + 1);
        if (!z->pat || !z->content) {
            free(z->pat);
            free(z->content);
            return PAGODA_ENOMEM;
        }
        memcpy(z->pat, json_string_value(pat), z->pat_len + 1);
        memcpy(z->content, json_string_value(content), z->content_len + 1);
    } else if (strcmp(t, "Metaspace") == 0) {
        const json_t *rep = json_object_get(j, "replacement");
        const json_t *scheme = json_object_get(j, "prepend_scheme");
        const json_t *aps = json_object_get(j, "add_prefix_space");
        size_t adv = 0;
        if (!json_is_string(rep) || json_string_length(rep) == 0 ||
            (tok_utf8_decode(json_string_value(rep), json_string_length(rep), &adv), adv) !=
                json_string_length(rep))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.replacement: not one character", path);
        z->kind = TOK_DEC_METASPACE;
        z->replacement = tok_utf8_decode(json_string_value(rep), json_string_length(rep), &adv);
        if (json_is_string(scheme)) {
            const char *s = json_string_value(scheme);
            if (strcmp(s, "always") == 0)
                z->prepend_scheme = TOK_PREPEND_ALWAYS;
            else if (strcmp(s, "first") == 0)
                z->prepend_scheme = TOK_PREPEND_FIRST;
            else if (strcmp(s, "never") == 0)
                z->prepend_scheme = TOK_PREPEND_NEVER;
            else
                return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s.prepend_scheme: %s", path, s);
        } else {
            z->prepend_scheme = aps && json_is_false(aps) ? TOK_PREPEND_NEVER : TOK_PREPEND_ALWAYS;
        }
    } else {
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s: decoder type %s is not supported", path,
                                t);
    }
    (*n)++;
    return 0;
}

int tok_decoder_parse(const void *json, const char *path, TokDecoder *chain, size_t *n)
{
    *n = 0;
    bool text = false;
    int rc = json ? parse_one(json, path, chain, n, 0, &text) : 0;
    if (rc)
        return rc;
    if (!json || json_is_null((
                     const json_t *)json)) { /* HF without a decoder: the tokens joined by spaces */
        memset(&chain[0], 0, sizeof(chain[0]));
        chain[0].kind = TOK_DEC_JOIN_SPACE;
        *n = 1;
    }
    return 0;
}

void tok_decoders_fini(TokDecoder *chain, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(chain[i].pat);
        free(chain[i].content);
    }
}
