/* Byte buffers, piece lists and the UTF-8 rules the tokenizer shares: validation, Rust's
 * character classes, and from_utf8_lossy's replacement of maximal subparts. */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"

int tokbuf_reserve(TokBuf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1)
        cap *= 2;
    char *p = realloc(b->data, cap);
    if (!p)
        return PAGODA_ENOMEM;
    b->data = p;
    b->cap = cap;
    return 0;
}

int tokbuf_append(TokBuf *b, const void *p, size_t n)
{
    if (tokbuf_reserve(b, n))
        return PAGODA_ENOMEM;
    if (n)
        memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return 0;
}

void tokbuf_fini(TokBuf *b)
{
    free(b->data);
    memset(b, 0, sizeof(*b));
}

int tokpieces_push(TokPieces *p, const char *s, size_t len, int32_t id, bool at_start)
{
    if (p->n == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 64;
        TokSpan *n = realloc(p->spans, cap * sizeof(*n));
        if (!n)
            return PAGODA_ENOMEM;
        p->spans = n;
        p->cap = cap;
    }
    size_t off = p->buf.len;
    if (tokbuf_append(&p->buf, s, len))
        return PAGODA_ENOMEM;
    p->spans[p->n++] = (TokSpan){(uint32_t)off, (uint32_t)len, id, at_start};
    return 0;
}

void tokpieces_clear(TokPieces *p)
{
    p->n = 0;
    p->buf.len = 0;
}

void tokpieces_fini(TokPieces *p)
{
    tokbuf_fini(&p->buf);
    free(p->spans);
    memset(p, 0, sizeof(*p));
}

void tokscratch_fini(TokScratch *s)
{
    tokpieces_fini(&s->a);
    tokpieces_fini(&s->b);
    tokbuf_fini(&s->norm);
    tokbuf_fini(&s->tmp);
    free(s->matches);
    pcre2_match_data_free(s->md);
    free(s->added_hits);
    free(s->bpe_syms);
    free(s->bpe_heap);
    memset(s, 0, sizeof(*s));
}

size_t tokscratch_bytes(const TokScratch *s)
{
    return s->a.buf.cap + s->a.cap * sizeof(TokSpan) + s->b.buf.cap + s->b.cap * sizeof(TokSpan) +
           s->norm.cap + s->tmp.cap + s->cap_matches * sizeof(TokMatch) +
           s->added_hits_cap * sizeof(TokAddedHit) + s->bpe_syms_cap * 16 + s->bpe_heap_cap * 8;
}

size_t tok_pow2_at_least(size_t n)
{
    size_t c = 16;
    while (c < n)
        c *= 2;
    return c;
}

/* How many continuation bytes a lead byte takes, and the range its first continuation must be
 * in (Unicode Table 3-7, well-formed UTF-8 byte sequences); 0 continuations and lo > hi for a
 * byte that cannot start a sequence. */
static int utf8_lead(unsigned char c, unsigned char *lo, unsigned char *hi)
{
    *lo = 0x80;
    *hi = 0xBF;
    if (c < 0x80)
        return 0;
    if (c >= 0xC2 && c <= 0xDF)
        return 1;
    if (c == 0xE0) {
        *lo = 0xA0;
        return 2;
    }
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
        return 2;
    if (c == 0xED) {
        *hi = 0x9F;
        return 2;
    }
    if (c == 0xF0) {
        *lo = 0x90;
        return 3;
    }
    if (c >= 0xF1 && c <= 0xF3)
        return 3;
    if (c == 0xF4) {
        *hi = 0x8F;
        return 3;
    }
    return -1;
}

size_t tok_utf8_valid_prefix(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < len) {
        /* ASCII runs, eight bytes at a time */
        while (i + 8 <= len) {
            uint64_t w;
            memcpy(&w, p + i, 8);
            if (w & 0x8080808080808080ull)
                break;
            i += 8;
        }
        if (i >= len)
            break;
        unsigned char lo, hi;
        int k = utf8_lead(p[i], &lo, &hi);
        if (k < 0)
            return i;
        if (k == 0) {
            i++;
            continue;
        }
        if (i + (size_t)k >= len)
            return i;
        if (p[i + 1] < lo || p[i + 1] > hi)
            return i;
        for (int j = 2; j <= k; j++)
            if (p[i + j] < 0x80 || p[i + j] > 0xBF)
                return i;
        i += (size_t)k + 1;
    }
    return len;
}

bool tok_utf8_is_partial(const char *s, size_t len)
{
    const unsigned char *p = (const unsigned char *)s;
    unsigned char lo, hi;
    int k = len ? utf8_lead(p[0], &lo, &hi) : -1;
    if (k <= 0 || len > (size_t)k)
        return false;
    if (len > 1 && (p[1] < lo || p[1] > hi))
        return false;
    for (size_t j = 2; j < len; j++)
        if (p[j] < 0x80 || p[j] > 0xBF)
            return false;
    return true;
}

uint32_t tok_utf8_decode(const char *s, size_t len, size_t *adv)
{
    const unsigned char *p = (const unsigned char *)s;
    if (p[0] < 0x80 || len < 2) {
        *adv = 1;
        return p[0];
    }
    if (p[0] < 0xE0) {
        *adv = 2;
        return ((uint32_t)(p[0] & 0x1F) << 6) | (p[1] & 0x3F);
    }
    if (p[0] < 0xF0 || len < 4) {
        *adv = 3;
        return ((uint32_t)(p[0] & 0x0F) << 12) | ((uint32_t)(p[1] & 0x3F) << 6) | (p[2] & 0x3F);
    }
    *adv = 4;
    return ((uint32_t)(p[0] & 0x07) << 18) | ((uint32_t)(p[1] & 0x3F) << 12) |
           ((uint32_t)(p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

size_t tok_utf8_encode(uint32_t cp, char *out)
{
    unsigned char *o = (unsigned char *)out;
    if (cp < 0x80) {
        o[0] = (unsigned char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (unsigned char)(0xC0 | (cp >> 6));
        o[1] = (unsigned char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (unsigned char)(0xE0 | (cp >> 12));
        o[1] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (unsigned char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (unsigned char)(0xF0 | (cp >> 18));
    o[1] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (unsigned char)(0x80 | (cp & 0x3F));
    return 4;
}

bool tok_is_whitespace(uint32_t cp)
{
    switch (cp) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
        return true;
    default:
        return cp >= 0x2000 && cp <= 0x200A;
    }
}

bool tok_is_numeric(uint32_t cp)
{
    if (cp < 0x80)
        return cp >= '0' && cp <= '9';
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return c == UTF8PROC_CATEGORY_ND || c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_NO;
}

bool tok_is_word_char(uint32_t cp)
{
    if (cp < 0x80)
        return (cp >= '0' && cp <= '9') || ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') || cp == '_';
    if (cp == 0x200C || cp == 0x200D) /* Join_Control */
        return true;
    /* letters outside L that are Alphabetic (Other_Alphabetic symbols: circled and squared
     * Latin letters) */
    if ((cp >= 0x24B6 && cp <= 0x24E9) || (cp >= 0x1F130 && cp <= 0x1F149) ||
        (cp >= 0x1F150 && cp <= 0x1F169) || (cp >= 0x1F170 && cp <= 0x1F189))
        return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO) || c == UTF8PROC_CATEGORY_MN ||
           c == UTF8PROC_CATEGORY_MC || c == UTF8PROC_CATEGORY_ME || c == UTF8PROC_CATEGORY_ND ||
           c == UTF8PROC_CATEGORY_NL || c == UTF8PROC_CATEGORY_PC;
}

/* Lossy conversion, streaming. A sequence is kept in pend while it may still complete; a byte
 * that breaks it ends the maximal subpart (one U+FFFD) and is then read again as a lead. */
int tok_lossy_feed(TokLossy *l, const unsigned char *p, size_t n, bool final, TokBuf *out)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    if (tokbuf_reserve(out, n + 16))
        return PAGODA_ENOMEM;
    size_t i = 0;
    while (i < n || (final && l->npend)) {
        if (l->npend) {
            unsigned char lo, hi;
            int k = utf8_lead(l->pend[0], &lo, &hi);
            if (i >= n) { /* final: an incomplete sequence is one maximal subpart */
                if (tokbuf_append(out, fffd, 3))
                    return PAGODA_ENOMEM;
                l->npend = 0;
                break;
            }
            unsigned char c = p[i];
            bool ok = l->npend == 1 ? (c >= lo && c <= hi) : (c >= 0x80 && c <= 0xBF);
            if (!ok) {
                if (tokbuf_append(out, fffd, 3))
                    return PAGODA_ENOMEM;
                l->npend = 0;
                continue; /* c read again as a lead */
            }
            l->pend[l->npend++] = c;
            i++;
            if (l->npend == k + 1) {
                if (tokbuf_append(out, l->pend, l->npend))
                    return PAGODA_ENOMEM;
                l->npend = 0;
            }
            continue;
        }
        /* fast path: ASCII and complete valid sequences straight through */
        size_t v = tok_utf8_valid_prefix((const char *)p + i, n - i);
        if (v) {
            if (tokbuf_append(out, p + i, v))
                return PAGODA_ENOMEM;
            i += v;
            continue;
        }
        unsigned char lo, hi;
        int k = utf8_lead(p[i], &lo, &hi);
        if (k <= 0) {
            if (tokbuf_append(out, fffd, 3))
                return PAGODA_ENOMEM;
            i++;
            continue;
        }
        l->pend[0] = p[i++];
        l->npend = 1;
    }
    return 0;
}
