/* Pre-tokenizers: Split (a regex or a literal, through PCRE2 with UTF and UCP, JIT-compiled
 * where PCRE2 has a JIT), ByteLevel (GPT-2's byte-to-character map, its own regex when
 * use_regex), Metaspace (spaces to U+2581, the prepend scheme, the split before each U+2581) and
 * Digits. Each stage cuts the pieces it is given into smaller ones, as HF's
 * NormalizedString::split does with its five delimiter behaviors; pieces holding an added token
 * pass through untouched. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"

/* GPT-2's pattern, which ByteLevel applies when use_regex is true. */
static const char GPT2_PATTERN[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* The GPT-2 byte map: bytes that are printable characters stand for themselves, the others
 * (0-32, 127-160, 173) take the code points from 256 up, in order. */
static uint32_t byte_to_cp(unsigned b)
{
    if (b <= 32)
        return 256 + b;
    if (b >= 127 && b <= 160)
        return 289 + (b - 127);
    if (b == 173)
        return 323;
    return b;
}

int tok_bytelevel_byte(uint32_t cp)
{
    if (cp < 256)
        return (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) ? -1 : (int)cp;
    if (cp <= 288)
        return (int)(cp - 256);
    if (cp <= 322)
        return (int)(cp - 289 + 127);
    return cp == 323 ? 173 : -1;
}

/* ---- the Unicode of Hugging Face's regexes ----
 *
 * HF runs these patterns through Oniguruma with Unicode 16.0 tables; Debian 12's PCRE2 has
 * Unicode 14.0. The characters that are \p{L} or \p{N} in HF's and not in PCRE2's (no character
 * is the other way round) are added to those classes when a pattern is compiled, and \s is
 * spelled out as HF's White_Space (PCRE2 also counts U+180E). The lists were made by asking
 * both libraries about every code point: npm tokenizers 0.23.2 (a Split with "\p{L}", "\p{N}"
 * or "\s" and behavior Removed over all code points, pre_tokenize_string) against pcre2_match
 * of PCRE2 10.42 with UTF and UCP. */
static const char DELTA_L[] =
    "\\x{1c89}-\\x{1c8a}\\x{a7cb}-\\x{a7cd}\\x{a7da}-\\x{a7dc}\\x{105c0}-\\x{105f3}"
    "\\x{10d4a}-\\x{10d65}\\x{10d6f}-\\x{10d85}\\x{10ec2}-\\x{10ec4}"
    "\\x{1123f}-\\x{11240}\\x{11380}-\\x{11389}\\x{1138b}\\x{1138e}"
    "\\x{11390}-\\x{113b5}\\x{113b7}\\x{113d1}\\x{113d3}\\x{11bc0}-\\x{11be0}"
    "\\x{11f02}\\x{11f04}-\\x{11f10}\\x{11f12}-\\x{11f33}\\x{1342f}"
    "\\x{13441}-\\x{13446}\\x{13460}-\\x{143fa}\\x{16100}-\\x{1611d}"
    "\\x{16d40}-\\x{16d6c}\\x{18cff}\\x{1b132}\\x{1b155}\\x{1df25}-\\x{1df2a}"
    "\\x{1e030}-\\x{1e06d}\\x{1e4d0}-\\x{1e4eb}\\x{1e5d0}-\\x{1e5ed}\\x{1e5f0}"
    "\\x{2b739}\\x{2ebf0}-\\x{2ee5d}\\x{31350}-\\x{323af}";
static const char DELTA_N[] = "\\x{10d40}-\\x{10d49}\\x{116d0}-\\x{116e3}\\x{11bf0}-\\x{11bf9}"
                              "\\x{11f50}-\\x{11f59}\\x{16130}-\\x{16139}\\x{16d70}-\\x{16d79}"
                              "\\x{1ccf0}-\\x{1ccf9}\\x{1d2c0}-\\x{1d2d3}\\x{1e4f0}-\\x{1e4f9}"
                              "\\x{1e5f1}-\\x{1e5fa}";
static const char WHITE_SPACE[] = "\\t-\\r \\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}"
                                  "\\x{2029}\\x{202f}\\x{205f}\\x{3000}";

/* Rewrites \p{L}, \p{N}, \P{L}, \P{N}, \s and \S as described above, into out (Oniguruma
 * does not read the short \pL, so neither is it rewritten here).
 * Inside a character class the additions are spliced into the class; a negated one (\P, \S)
 * inside a class is left as it is (no model's pattern has one). */
static int hf_unicode(const char *pat, size_t len, TokBuf *out)
{
    bool in_class = false;
    size_t class_start = 0;
    out->len = 0;
    for (size_t i = 0; i < len;) {
        const char *add = NULL, *cls = NULL;
        size_t skip = 0;
        bool neg = false;
        if (pat[i] == '\\' && i + 1 < len) {
            char c = pat[i + 1];
            if ((c == 'p' || c == 'P') && i + 4 < len && pat[i + 2] == '{' &&
                (pat[i + 3] == 'L' || pat[i + 3] == 'N') && pat[i + 4] == '}') {
                add = pat[i + 3] == 'L' ? DELTA_L : DELTA_N;
                cls = pat[i + 3] == 'L' ? "\\p{L}" : "\\p{N}";
                neg = c == 'P';
                skip = 5;
            } else if (c == 's' || c == 'S') {
                add = WHITE_SPACE;
                cls = "";
                neg = c == 'S';
                skip = 2;
            }
            if (!add || (in_class && neg)) {
                if (tokbuf_append(out, pat + i, 2))
                    return PAGODA_ENOMEM;
                i += 2;
                continue;
            }
            int rc = in_class ? 0 : tokbuf_append(out, neg ? "[^" : "[", neg ? 2 : 1);
            if (!rc)
                rc = tokbuf_append(out, cls, strlen(cls));
            if (!rc)
                rc = tokbuf_append(out, add, strlen(add));
            if (!rc && !in_class)
                rc = tokbuf_append(out, "]", 1);
            if (rc)
                return rc;
            i += skip;
            continue;
        }
        if (!in_class && pat[i] == '[') {
            in_class = true;
            class_start = i + 1 + (i + 1 < len && pat[i + 1] == '^');
        } else if (in_class && pat[i] == '[' && i + 1 < len && pat[i + 1] == ':') {
            const char *end = strstr(pat + i, ":]"); /* a POSIX class: copied whole */
            size_t n = end ? (size_t)(end - (pat + i)) + 2 : len - i;
            if (tokbuf_append(out, pat + i, n))
                return PAGODA_ENOMEM;
            i += n;
            continue;
        } else if (in_class && pat[i] == ']' && i != class_start) {
            in_class = false;
        }
        if (tokbuf_append(out, pat + i, 1))
            return PAGODA_ENOMEM;
        i++;
    }
    return tokbuf_reserve(out, 0);
}

static void compile_error(int code, char *buf, size_t len)
{
    pcre2_get_error_message(code, (PCRE2_UCHAR *)buf, len);
}

static int compile_regex(const char *pat, size_t len, uint32_t extra, const char *path,
                         pcre2_code **re, bool *jit)
{
    int err;
    PCRE2_SIZE off;
    /* PCRE2_LITERAL takes no UCP (nothing in a literal depends on it) */
    uint32_t opts = PCRE2_UTF | extra | ((extra & PCRE2_LITERAL) ? 0 : PCRE2_UCP);
    TokBuf hf = {0};
    if (!(extra & PCRE2_LITERAL)) {
        if (hf_unicode(pat, len, &hf)) {
            tokbuf_fini(&hf);
            return PAGODA_ENOMEM;
        }
        pat = hf.data;
        len = hf.len;
    }
    *re = pcre2_compile((PCRE2_SPTR)pat, len, opts, &err, &off, NULL);
    tokbuf_fini(&hf);
    if (!*re) {
        char msg[128];
        compile_error(err, msg, sizeof(msg));
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s.pattern: PCRE2 refuses it at %zu: %s",
                                path, (size_t)off, msg);
    }
    uint32_t have_jit = 0;
    pcre2_config(PCRE2_CONFIG_JIT, &have_jit);
    *jit = have_jit && pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE) == 0;
    return 0;
}

/* ---- finding the cuts ---- */

static int match_push(TokScratch *s, uint32_t start, uint32_t end, bool is_match)
{
    if (s->nmatches == s->cap_matches) {
        size_t cap = s->cap_matches ? s->cap_matches * 2 : 256;
        TokMatch *m = realloc(s->matches, cap * sizeof(*m));
        if (!m)
            return PAGODA_ENOMEM;
        s->matches = m;
        s->cap_matches = cap;
    }
    s->matches[s->nmatches++] = (TokMatch){start, end, is_match};
    return 0;
}

/* HF's Pattern::find_matches for a regex: the matches and the text between them. */
static int regex_matches(const TokPreTokenizer *p, const char *text, size_t len, TokScratch *s)
{
    s->nmatches = 0;
    if (!s->md && !(s->md = pcre2_match_data_create(1, NULL)))
        return PAGODA_ENOMEM;
    size_t prev = 0, at = 0;
    while (at <= len) {
        int rc;
        if (p->jit)
            rc = pcre2_jit_match(p->re, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK, s->md, NULL);
        else
            rc = pcre2_match(p->re, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK, s->md, NULL);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT) /* the interpreter keeps its frames on the heap */
            rc = pcre2_match(p->re, (PCRE2_SPTR)text, len, at, PCRE2_NO_UTF_CHECK | 0, s->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH)
            break;
        if (rc < 0)
            return pagoda_error_set(PAGODA_EINVAL, "pre-tokenizer regex: PCRE2 error %d", rc);
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (prev != ms && match_push(s, (uint32_t)prev, (uint32_t)ms, false))
            return PAGODA_ENOMEM;
        if (match_push(s, (uint32_t)ms, (uint32_t)me, true))
            return PAGODA_ENOMEM;
        prev = me;
        if (me > at) {
            at = me;
        } else { /* an empty match: step over one character */
            if (me >= len)
                break;
            size_t adv;
            tok_utf8_decode(text + me, len - me, &adv);
            at = me + adv;
        }
    }
    if (prev != len && match_push(s, (uint32_t)prev, (uint32_t)len, false))
        return PAGODA_ENOMEM;
    return 0;
}

/* HF's Pattern::find_matches for a character predicate: each matching character alone. */
static int char_matches(const char *text, size_t len, bool (*pred)(uint32_t, uint32_t),
                        uint32_t arg, TokScratch *s)
{
    s->nmatches = 0;
    size_t last = 0;
    for (size_t i = 0; i < len;) {
        size_t adv;
        uint32_t cp = tok_utf8_decode(text + i, len - i, &adv);
        if (pred(cp, arg)) {
            if (last < i && match_push(s, (uint32_t)last, (uint32_t)i, false))
                return PAGODA_ENOMEM;
            if (match_push(s, (uint32_t)i, (uint32_t)(i + adv), true))
                return PAGODA_ENOMEM;
            last = i + adv;
        }
        i += adv;
    }
    if (len > last && match_push(s, (uint32_t)last, (uint32_t)len, false))
        return PAGODA_ENOMEM;
    return 0;
}

static bool pred_char(uint32_t cp, uint32_t want)
{
    return cp == want;
}

static bool pred_numeric(uint32_t cp, uint32_t unused)
{
    (void)unused;
    return tok_is_numeric(cp);
}

/* Applies a delimiter behavior to s->matches (in place: is_match becomes "remove"). */
static void apply_behavior(TokScratch *s, TokSplitBehavior b)
{
    TokMatch *m = s->matches;
    size_t n = s->nmatches, k = 0;
    bool prev = false;
    switch (b) {
    case TOK_SPLIT_REMOVED:
        return;
    case TOK_SPLIT_ISOLATED:
        for (size_t i = 0; i < n; i++)
            m[i].is_match = false;
        return;
    case TOK_SPLIT_CONTIGUOUS:
        for (size_t i = 0; i < n; i++) {
            bool is = m[i].is_match;
            if (is == prev && k > 0)
                m[k - 1].end = m[i].end;
            else
                m[k++] = (TokMatch){m[i].start, m[i].end, false};
            prev = is;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_PREVIOUS:
        for (size_t i = 0; i < n; i++) {
            bool is = m[i].is_match;
            if (is && !prev && k > 0)
                m[k - 1].end = m[i].end;
            else
                m[k++] = (TokMatch){m[i].start, m[i].end, false};
            prev = is;
        }
        break;
    case TOK_SPLIT_MERGED_WITH_NEXT: {
        /* folded from the end, as HF does, then the list is the right way round again */
        size_t w = n;
        for (size_t i = n; i-- > 0;) {
            bool is = m[i].is_match;
            if (is && !prev && w < n)
                m[w].start = m[i].start;
            else
                m[--w] = (TokMatch){m[i].start, m[i].end, false};
            prev = is;
        }
        memmove(m, m + w, (n - w) * sizeof(*m));
        k = n - w;
        break;
    }
    }
    s->nmatches = k;
}

/* Pushes the kept, non-empty cuts of text as pieces. */
static int push_cuts(TokPieces *out, const char *text, bool at_start, TokScratch *s)
{
    for (size_t i = 0; i < s->nmatches; i++) {
        const TokMatch *m = &s->matches[i];
        if (m->is_match || m->end == m->start)
            continue;
        if (tokpieces_push(out, text + m->start, m->end - m->start, -1, at_start && m->start == 0))
            return PAGODA_ENOMEM;
    }
    return 0;
}

/* ---- the stages ---- */

static int split_stage(const TokPreTokenizer *p, const char *text, size_t len, bool at_start,
                       TokPieces *out, TokScratch *s)
{
    int rc = regex_matches(p, text, len, s);
    if (rc)
        return rc;
    if (p->invert)
        for (size_t i = 0; i < s->nmatches; i++)
            s->matches[i].is_match = !s->matches[i].is_match;
    apply_behavior(s, p->behavior);
    return push_cuts(out, text, at_start, s);
}

/* Maps the bytes of text[0..len) to their GPT-2 characters, appended to out as one piece. */
static int push_bytelevel(TokPieces *out, const char *text, size_t len, bool at_start)
{
    /* an empty piece first, then its text written in place */
    if (tokpieces_push(out, "", 0, -1, at_start) || tokbuf_reserve(&out->buf, 2 * len))
        return PAGODA_ENOMEM;
    size_t off = out->buf.len;
    char *w = out->buf.data + off;
    for (size_t i = 0; i < len; i++) {
        unsigned char b = (unsigned char)text[i];
        if (b >= 33 && b <= 126)
            *w++ = (char)b;
        else
            w += tok_utf8_encode(byte_to_cp(b), w);
    }
    size_t n = (size_t)(w - (out->buf.data + off));
    out->spans[out->n - 1].len = (uint32_t)n;
    out->buf.len = off + n;
    out->buf.data[out->buf.len] = 0;
    return 0;
}

static int bytelevel_stage(const TokPreTokenizer *p, const char *text, size_t len, bool at_start,
                           TokPieces *out, TokScratch *s)
{
    const char *src = text;
    if (p->add_prefix_space && (len == 0 || text[0] != ' ')) {
        s->tmp.len = 0;
        if (tokbuf_append(&s->tmp, " ", 1) || tokbuf_append(&s->tmp, text, len))
            return PAGODA_ENOMEM;
        src = s->tmp.data;
        len += 1;
    }
    if (!p->re)
        return push_bytelevel(out, src, len, at_start);
    int rc = regex_matches(p, src, len, s);
    if (rc)
        return rc;
    for (size_t i = 0; i < s->nmatches; i++) {
        const TokMatch *m = &s->matches[i];
        if (m->end > m->start &&
            push_bytelevel(out, src + m->start, m->end - m->start, at_start && m->start == 0))
            return PAGODA_ENOMEM;
    }
    return 0;
}

static int metaspace_stage(const TokPreTokenizer *p, const char *text, size_t len, bool at_start,
                           TokPieces *out, TokScratch *s)
{
    char rep[4];
    size_t rlen = tok_utf8_encode(p->replacement, rep);
    TokBuf *b = &s->tmp;
    b->len = 0;
    bool starts = len >= rlen && memcmp(text, rep, rlen) == 0;
    bool space0 = len > 0 && text[0] == ' '; /* becomes the replacement below */
    bool prepend = !starts && !space0 &&
                   (p->prepend_scheme == TOK_PREPEND_ALWAYS ||
                    (p->prepend_scheme == TOK_PREPEND_FIRST && at_start));
    if (prepend && tokbuf_append(b, rep, rlen))
        return PAGODA_ENOMEM;
    for (size_t i = 0; i < len;) {
        size_t j = i;
        while (j < len && text[j] != ' ')
            j++;
        if (tokbuf_append(b, text + i, j - i))
            return PAGODA_ENOMEM;
        if (j < len && tokbuf_append(b, rep, rlen))
            return PAGODA_ENOMEM;
        i = j + 1;
    }
    if (!p->split)
        return b->len ? tokpieces_push(out, b->data, b->len, -1, at_start) : 0;
    int rc = char_matches(b->data, b->len, pred_char, p->replacement, s);
    if (rc)
        return rc;
    apply_behavior(s, TOK_SPLIT_MERGED_WITH_NEXT);
    return push_cuts(out, b->data, at_start, s);
}

static int digits_stage(const TokPreTokenizer *p, const char *text, size_t len, bool at_start,
                        TokPieces *out, TokScratch *s)
{
    int rc = char_matches(text, len, pred_numeric, 0, s);
    if (rc)
        return rc;
    apply_behavior(s, p->individual_digits ? TOK_SPLIT_ISOLATED : TOK_SPLIT_CONTIGUOUS);
    return push_cuts(out, text, at_start, s);
}

int tok_pretokenize(const TokPreTokenizer *chain, size_t n, TokPieces **in, TokPieces **out,
                    TokScratch *s)
{
    for (size_t k = 0; k < n; k++) {
        const TokPreTokenizer *p = &chain[k];
        TokPieces *src = *in, *dst = *out;
        tokpieces_clear(dst);
        for (size_t i = 0; i < src->n; i++) {
            const TokSpan *sp = &src->spans[i];
            const char *text = src->buf.data + sp->off;
            int rc;
            if (sp->id >= 0) {
                rc = tokpieces_push(dst, text, sp->len, sp->id, sp->at_start);
            } else {
                switch (p->kind) {
                case TOK_PRE_SPLIT:
                    rc = split_stage(p, text, sp->len, sp->at_start, dst, s);
                    break;
                case TOK_PRE_BYTELEVEL:
                    rc = bytelevel_stage(p, text, sp->len, sp->at_start, dst, s);
                    break;
                case TOK_PRE_METASPACE:
                    rc = metaspace_stage(p, text, sp->len, sp->at_start, dst, s);
                    break;
                default:
                    rc = digits_stage(p, text, sp->len, sp->at_start, dst, s);
                    break;
                }
            }
            if (rc)
                return rc;
        }
        *in = dst;
        *out = src;
    }
    return 0;
}

/* ---- loading ---- */

static int get_bool(const json_t *j, const char *key, const char *path, bool def, bool *out)
{
    const json_t *v = json_object_get(j, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return pagoda_error_set(PAGODA_EFORMAT, "%s.%s: not a boolean", path, key);
    *out = json_is_true(v);
    return 0;
}

static int parse_split(const json_t *j, const char *path, TokPreTokenizer *p)
{
    const json_t *pat = json_object_get(j, "pattern");
    const json_t *beh = json_object_get(j, "behavior");
    if (!json_is_object(pat))
        return pagoda_error_set(PAGODA_EFORMAT, "%s.pattern: not an object", path);
    const json_t *re = json_object_get(pat, "Regex"), *str = json_object_get(pat, "String");
    const json_t *src = json_is_string(re) ? re : str;
    if (!json_is_string(src) || json_string_length(src) > TOK_MAX_REGEX_BYTES)
        return pagoda_error_set(PAGODA_EFORMAT, "%s.pattern: neither String nor Regex", path);
    if (json_string_length(src) == 0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s.pattern: an empty pattern", path);
    static const char *const names[] = {"Removed", "Isolated", "MergedWithPrevious",
                                        "MergedWithNext", "Contiguous"};
    int b = -1;
    for (int i = 0; json_is_string(beh) && i < 5; i++)
        if (strcmp(json_string_value(beh), names[i]) == 0)
            b = i;
    if (b < 0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s.behavior: %s is not supported", path,
                                json_is_string(beh) ? json_string_value(beh) : "(not a string)");
    p->kind = TOK_PRE_SPLIT;
    p->behavior = (TokSplitBehavior)b;
    int rc = get_bool(j, "invert", path, false, &p->invert);
    if (rc)
        return rc;
    return compile_regex(json_string_value(src), json_string_length(src),
                         src == str ? PCRE2_LITERAL : 0, path, &p->re, &p->jit);
}

static int parse_metaspace(const json_t *j, const char *path, TokPreTokenizer *p)
{
    p->kind = TOK_PRE_METASPACE;
    const json_t *rep = json_object_get(j, "replacement");
    if (!json_is_string(rep))
        return pagoda_error_set(PAGODA_EFORMAT, "%s.replacement: not a string", path);
    size_t adv;
    const char *r = json_string_value(rep);
    size_t rlen = json_string_length(rep);
    p->replacement = rlen ? tok_utf8_decode(r, rlen, &adv) : 0;
    if (!rlen || adv != rlen)
        return pagoda_error_set(PAGODA_EFORMAT, "%s.replacement: not one character", path);
    int rc = get_bool(j, "split", path, true, &p->split);
    if (rc)
        return rc;
    const json_t *scheme = json_object_get(j, "prepend_scheme");
    if (json_is_string(scheme)) {
        const char *s = json_string_value(scheme);
        if (strcmp(s, "always") == 0)
            p->prepend_scheme = TOK_PREPEND_ALWAYS;
        else if (strcmp(s, "first") == 0)
            p->prepend_scheme = TOK_PREPEND_FIRST;
        else if (strcmp(s, "never") == 0)
            p->prepend_scheme = TOK_PREPEND_NEVER;
        else
            return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s.prepend_scheme: %s", path, s);
        return 0;
    }
    /* older files: add_prefix_space true is "always" */
    bool aps = true;
    rc = get_bool(j, "add_prefix_space", path, true, &aps);
    p->prepend_scheme = aps ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    return rc;
}

static int parse_one(const json_t *j, const char *path, TokPreTokenizer *chain, size_t *n,
                     int depth)
{
    if (json_is_null(j))
        return 0;
    const json_t *type = json_object_get(j, "type");
    if (!json_is_object(j) || !json_is_string(type))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: not an object with a type", path);
    const char *t = json_string_value(type);
    if (strcmp(t, "Sequence") == 0) {
        const json_t *list = json_object_get(j, "pretokenizers");
        if (!json_is_array(list))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.pretokenizers: not an array", path);
        if (depth > 4)
            return pagoda_error_set(PAGODA_EFORMAT, "%s: Sequences nested too deep", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[256];
            snprintf(sub, sizeof(sub), "%s.pretokenizers[%zu]", path, i);
            int rc = parse_one(json_array_get(list, i), sub, chain, n, depth + 1);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (*n >= TOK_MAX_STAGES)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: more than %u pre-tokenizers", path,
                                TOK_MAX_STAGES);
    TokPreTokenizer *p = &chain[*n];
    memset(p, 0, sizeof(*p));
    int rc;
    if (strcmp(t, "Split") == 0) {
        rc = parse_split(j, path, p);
    } else if (strcmp(t, "ByteLevel") == 0) {
        p->kind = TOK_PRE_BYTELEVEL;
        bool use_regex = true;
        rc = get_bool(j, "add_prefix_space", path, true, &p->add_prefix_space);
        if (!rc)
            rc = get_bool(j, "use_regex", path, true, &use_regex);
        if (!rc && use_regex)
            rc = compile_regex(GPT2_PATTERN, sizeof(GPT2_PATTERN) - 1, 0, path, &p->re, &p->jit);
    } else if (strcmp(t, "Metaspace") == 0) {
        rc = parse_metaspace(j, path, p);
    } else if (strcmp(t, "Digits") == 0) {
        p->kind = TOK_PRE_DIGITS;
        rc = get_bool(j, "individual_digits", path, false, &p->individual_digits);
    } else {
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s: pre-tokenizer type %s is not supported",
                                path, t);
    }
    (*n)++; /* counted even on error, so that fini frees what it compiled */
    return rc;
}

int tok_pretokenizer_parse(const void *json, const char *path, TokPreTokenizer *chain, size_t *n)
{
    *n = 0;
    if (!json)
        return 0;
    return parse_one(json, path, chain, n, 0);
}

void tok_pretokenizers_fini(TokPreTokenizer *chain, size_t n)
{
    for (size_t i = 0; i < n; i++)
        pcre2_code_free(chain[i].re);
}
