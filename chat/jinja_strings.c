/* String operations that str's methods and the filters share, with Python's semantics: strip
 * with chars or str.isspace(), case mapping by code point (utf8proc), substring search, replace,
 * split and join. */
#include "chat/jinja_internal.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

static int nomem(struct jrender *r, int line)
{
    return jinja_fail(r, line, PAGODA_ERANGE,
                      "the template needed more than %u bytes of memory while rendering",
                      (unsigned)JINJA_MAX_RENDER_MEMORY);
}

/* The characters strip takes away: whitespace (chars NULL), or the code points of chars, looked
 * up in a table (ASCII) or by binary search (the others, sorted), so that stripping is linear in
 * the string and in chars, never their product. */
struct strip_set {
    const jv *chars;
    bool ascii[128];
    uint32_t *other; /* sorted */
    size_t nother;
};

static int cmp_cp(const void *x, const void *y)
{
    uint32_t a = *(const uint32_t *)x, b = *(const uint32_t *)y;
    return (a > b) - (a < b);
}

static int strip_set_init(struct jrender *r, int line, const jv *chars, struct strip_set *set)
{
    memset(set, 0, sizeof(*set));
    set->chars = chars;
    if (chars == NULL)
        return 0;
    size_t cps = 0;
    for (size_t i = 0; i < chars->u.s.len;) {
        uint32_t c;
        i += jinja_u8_next(chars->u.s.p + i, chars->u.s.len - i, &c);
        cps++;
        if (c < 128)
            set->ascii[c] = true;
        else
            set->nother++;
    }
    int rc = jinja_work(r, (uint64_t)cps * JINJA_WORK_ELEMENT);
    if (rc != 0 || set->nother == 0)
        return rc;
    set->other = jinja_arena_alloc(&r->arena, set->nother * sizeof(uint32_t));
    if (set->other == NULL)
        return nomem(r, line);
    size_t n = 0;
    for (size_t i = 0; i < chars->u.s.len;) {
        uint32_t c;
        i += jinja_u8_next(chars->u.s.p + i, chars->u.s.len - i, &c);
        if (c >= 128)
            set->other[n++] = c;
    }
    uint64_t log2n = 1;
    for (size_t m = n; m > 1; m >>= 1)
        log2n++;
    if ((rc = jinja_work(r, (uint64_t)n * log2n * JINJA_WORK_ELEMENT)) != 0)
        return rc;
    qsort(set->other, n, sizeof(uint32_t), cmp_cp);
    return 0;
}

static bool in_set(const struct strip_set *set, uint32_t cp)
{
    if (set->chars == NULL)
        return jinja_is_space(cp);
    if (cp < 128)
        return set->ascii[cp];
    return set->nother && bsearch(&cp, set->other, set->nother, sizeof(uint32_t), cmp_cp);
}

/* str.strip / lstrip / rstrip(chars): chars NULL strips whitespace. Charged per code point
 * looked at (a string of 16 MB of spaces is 16 M of them). */
int jinja_str_strip(struct jrender *r, int line, const jv *s, const jv *chars, bool left,
                    bool right, jv *out)
{
    struct strip_set set;
    int rc = strip_set_init(r, line, chars, &set);
    if (rc != 0)
        return rc;
    size_t b = 0, e = s->u.s.len;
    uint64_t looked = 0;
    if (left)
        while (b < e) {
            uint32_t cp;
            size_t k = jinja_u8_next(s->u.s.p + b, e - b, &cp);
            looked++;
            if (!in_set(&set, cp))
                break;
            b += k;
        }
    if (right)
        while (e > b) {
            size_t start = e - 1;
            while (start > b && ((unsigned char)s->u.s.p[start] & 0xC0) == 0x80)
                start--;
            uint32_t cp;
            jinja_u8_next(s->u.s.p + start, e - start, &cp);
            looked++;
            if (!in_set(&set, cp))
                break;
            e = start;
        }
    *out = jv_str(s->u.s.p + b, e - b);
    return jinja_work(r, looked * JINJA_WORK_ELEMENT);
}

/* Python maps a few characters to several (SpecialCasing.txt), where utf8proc maps one to one:
 * the ones of Latin text. Returns the replacement, or NULL to map the code point alone. */
static const char *special_case(uint32_t cp, enum jcase how, bool title)
{
    static const struct {
        uint32_t cp;
        const char *upper, *title;
    } UP[] = {
        {0x00DF, "SS", "Ss"}, {0xFB00, "FF", "Ff"},   {0xFB01, "FI", "Fi"},
        {0xFB02, "FL", "Fl"}, {0xFB03, "FFI", "Ffi"}, {0xFB04, "FFL", "Ffl"},
        {0xFB05, "ST", "St"}, {0xFB06, "ST", "St"},   {0x0149, "\xCA\xBCN", "\xCA\xBCN"},
    };
    if (how == JCASE_LOWER || !title) {
        if (cp == 0x0130 && how != JCASE_UPPER)
            return "i\xCC\x87"; /* İ lowercases to i and a combining dot */
        if (how != JCASE_UPPER)
            return NULL;
    }
    for (size_t k = 0; k < sizeof(UP) / sizeof(UP[0]); k++)
        if (UP[k].cp == cp)
            return title ? UP[k].title : UP[k].upper;
    return NULL;
}

int jinja_str_case(struct jrender *r, int line, const jv *s, enum jcase how, jv *out)
{
    /* at most 4 bytes per code point either way */
    char *p = jinja_arena_alloc(&r->arena, s->u.s.len * 4 + 1);
    if (p == NULL)
        return nomem(r, line);
    size_t o = 0;
    bool prev_cased = false, first = true, word_start = true;
    for (size_t i = 0; i < s->u.s.len;) {
        uint32_t cp;
        i += jinja_u8_next(s->u.s.p + i, s->u.s.len - i, &cp);
        utf8proc_int32_t c = (utf8proc_int32_t)cp, m = c;
        if (how == JCASE_TITLE_WORDS) {
            /* jinja2's title filter: each piece between runs of whitespace and -({[< is its
             * first character upper() and the rest lower() ("it's" stays "It's") */
            bool sep = jinja_is_space(cp) || (cp < 0x80 && strchr("-({[<", (int)cp) != NULL);
            const char *special = special_case(cp, word_start ? JCASE_UPPER : JCASE_LOWER, false);
            if (special != NULL) {
                size_t sl = strlen(special);
                memcpy(p + o, special, sl);
                o += sl;
            } else {
                m = word_start ? utf8proc_toupper(c) : utf8proc_tolower(c);
                o += (size_t)utf8proc_encode_char(m, (utf8proc_uint8_t *)p + o);
            }
            word_start = sep;
            continue;
        }
        /* title case for the first of capitalize, and after an uncased character in title */
        bool as_title = (how == JCASE_CAPITALIZE && first) || (how == JCASE_TITLE && !prev_cased);
        const char *special = special_case(cp, how, as_title);
        if (special != NULL) {
            size_t sl = strlen(special);
            memcpy(p + o, special, sl);
            o += sl;
            if (how == JCASE_TITLE) {
                utf8proc_category_t cat = utf8proc_category(c);
                prev_cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
                             cat == UTF8PROC_CATEGORY_LT;
            }
            first = false;
            continue;
        }
        switch (how) {
        case JCASE_UPPER:
            m = utf8proc_toupper(c);
            break;
        case JCASE_LOWER:
            m = utf8proc_tolower(c);
            break;
        case JCASE_CAPITALIZE:
            m = first ? utf8proc_totitle(c) : utf8proc_tolower(c);
            break;
        case JCASE_TITLE_WORDS: /* above */
            break;
        case JCASE_TITLE: {
            utf8proc_category_t cat = utf8proc_category(c);
            bool cased = cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
                         cat == UTF8PROC_CATEGORY_LT;
            m = prev_cased ? utf8proc_tolower(c) : utf8proc_totitle(c);
            prev_cased = cased;
            break;
        }
        }
        first = false;
        o += (size_t)utf8proc_encode_char(m, (utf8proc_uint8_t *)p + o);
    }
    p[o] = '\0';
    *out = jv_str(p, o);
    return jinja_step(r, s->u.s.len / 16);
}

/* glibc's memmem is linear in the haystack (two-way), never haystack times needle. */
const char *jinja_str_find(const char *h, size_t hl, const char *n, size_t nl)
{
    if (nl == 0)
        return h;
    return memmem(h, hl, n, nl);
}

int jinja_str_replace(struct jrender *r, int line, const jv *s, const jv *old, const jv *new_,
                      int64_t count, jv *out)
{
    struct jbuf b = {0};
    int rc = 0;
    const char *p = s->u.s.p, *end = p + s->u.s.len;
    int64_t done = 0;
    if (old->u.s.len == 0) {
        /* Python inserts new before every code point and at the end */
        for (const char *q = p; rc == 0;) {
            if (count >= 0 && done >= count) {
                rc = jbuf_append(&b, q, (size_t)(end - q));
                break;
            }
            rc = jbuf_append(&b, new_->u.s.p, new_->u.s.len);
            done++;
            if (q == end || rc != 0)
                break;
            uint32_t cp;
            size_t k = jinja_u8_next(q, (size_t)(end - q), &cp);
            rc = jbuf_append(&b, q, k);
            q += k;
        }
    } else {
        while (rc == 0) {
            const char *hit = (count < 0 || done < count)
                                  ? jinja_str_find(p, (size_t)(end - p), old->u.s.p, old->u.s.len)
                                  : NULL;
            if (hit == NULL) {
                rc = jbuf_append(&b, p, (size_t)(end - p));
                break;
            }
            if ((rc = jbuf_append(&b, p, (size_t)(hit - p))) == 0)
                rc = jbuf_append(&b, new_->u.s.p, new_->u.s.len);
            p = hit + old->u.s.len;
            done++;
        }
    }
    if (rc != 0) {
        free(b.p);
        return jinja_fail(r, line, PAGODA_ERANGE, "the output would exceed %u bytes",
                          (unsigned)JINJA_MAX_OUTPUT_BYTES);
    }
    /* the string read (code point by code point when old is empty), and old read again by each
     * memmem after a hit; what is written is charged as the result is stored */
    uint64_t work = old->u.s.len == 0 ? s->u.s.len * JINJA_WORK_ELEMENT
                                      : s->u.s.len + old->u.s.len * (uint64_t)(done + 1);
    if ((rc = jinja_work(r, work)) != 0) {
        free(b.p);
        return rc;
    }
    return jv_from_jbuf(r, &b, out);
}

/* str.split(sep=None, maxsplit=-1) */
int jinja_str_split(struct jrender *r, int line, const jv *s, const jv *sep, int64_t maxsplit,
                    jv *out)
{
    size_t cap = 8, n = 0;
    jv *v = jinja_arena_alloc(&r->arena, cap * sizeof(jv));
    if (v == NULL)
        return nomem(r, line);
    const char *p = s->u.s.p, *end = p + s->u.s.len;
#define PUSH(ptr, l)                                                                               \
    do {                                                                                           \
        if (n == cap) {                                                                            \
            jv *nv = jinja_arena_alloc(&r->arena, cap * 2 * sizeof(jv));                           \
            if (nv == NULL)                                                                        \
                return nomem(r, line);                                                             \
            memcpy(nv, v, n * sizeof(jv));                                                         \
            v = nv;                                                                                \
            cap *= 2;                                                                              \
        }                                                                                          \
        v[n++] = jv_str((ptr), (l));                                                               \
    } while (0)
    if (sep == NULL || sep->kind == JV_NONE) {
        for (;;) {
            /* skip whitespace */
            while (p < end) {
                uint32_t cp;
                size_t k = jinja_u8_next(p, (size_t)(end - p), &cp);
                if (!jinja_is_space(cp))
                    break;
                p += k;
            }
            if (p == end)
                break;
            if (maxsplit >= 0 && (int64_t)n >= maxsplit) {
                jv rest;
                int rc = jinja_str_strip(r, line,
                                         &(jv){.kind = JV_STRING, .u.s = {p, (size_t)(end - p)}},
                                         NULL, false, true, &rest);
                if (rc != 0)
                    return rc;
                PUSH(rest.u.s.p, rest.u.s.len);
                break;
            }
            const char *w = p;
            while (p < end) {
                uint32_t cp;
                size_t k = jinja_u8_next(p, (size_t)(end - p), &cp);
                if (jinja_is_space(cp))
                    break;
                p += k;
            }
            PUSH(w, (size_t)(p - w));
        }
    } else {
        if (sep->kind != JV_STRING)
            return jinja_type_error(r, line, "split() separator must be str or None", sep);
        if (sep->u.s.len == 0)
            return jinja_fail(r, line, PAGODA_EFORMAT, "empty separator");
        for (;;) {
            const char *hit = (maxsplit < 0 || (int64_t)n < maxsplit)
                                  ? jinja_str_find(p, (size_t)(end - p), sep->u.s.p, sep->u.s.len)
                                  : NULL;
            if (hit == NULL) {
                PUSH(p, (size_t)(end - p));
                break;
            }
            PUSH(p, (size_t)(hit - p));
            p = hit + sep->u.s.len;
        }
    }
#undef PUSH
    struct jlist *l = jinja_arena_alloc(&r->arena, sizeof(*l));
    if (l == NULL)
        return nomem(r, line);
    l->v = v;
    l->n = n;
    l->tuple = false;
    out->kind = JV_LIST;
    out->u.list = l;
    /* whitespace is found code point by code point, a separator by memmem */
    bool by_space = sep == NULL || sep->kind == JV_NONE;
    return jinja_work(
        r, (by_space ? s->u.s.len * JINJA_WORK_ELEMENT : s->u.s.len + sep->u.s.len * (n + 1)) +
               n * JINJA_WORK_ELEMENT);
}

int jinja_str_affix(struct jrender *r, int line, const jv *s, const jv *arg, bool start, jv *out)
{
    if (arg == NULL)
        return jinja_fail(r, line, PAGODA_EFORMAT, "%s() takes at least 1 argument",
                          start ? "startswith" : "endswith");
    const jv *cands = arg;
    size_t nc = 1;
    if (arg->kind == JV_LIST) {
        cands = arg->u.list->v;
        nc = arg->u.list->n;
    }
    /* a list as well as a tuple, as @huggingface/jinja takes (Python takes only a tuple) */
    *out = jv_bool(false);
    for (size_t i = 0; i < nc; i++) {
        const jv *c = &cands[i];
        if (c->kind != JV_STRING)
            return jinja_type_error(r, line, "startswith/endswith take a str or a tuple of str", c);
        int rc = jinja_work(r, JINJA_WORK_ELEMENT);
        if (rc != 0)
            return rc;
        if (c->u.s.len > s->u.s.len)
            continue;
        const char *at = start ? s->u.s.p : s->u.s.p + s->u.s.len - c->u.s.len;
        if ((rc = jinja_work(r, c->u.s.len)) != 0)
            return rc;
        if (memcmp(at, c->u.s.p, c->u.s.len) == 0) {
            *out = jv_bool(true);
            return 0;
        }
    }
    return 0;
}

int jinja_join(struct jrender *r, int line, const jv *seq, const jv *sep, const jv *attr, jv *out)
{
    const jv *items;
    size_t n;
    int rc = jinja_iterate(r, line, seq, &items, &n);
    if (rc != 0)
        return rc;
    struct jbuf b = {0};
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (i && sep != NULL && (rc = jbuf_append(&b, sep->u.s.p, sep->u.s.len)) != 0)
            break;
        jv item = items[i];
        if (attr != NULL && (rc = jinja_getitem(r, line, &items[i], attr, &item)) != 0)
            break;
        rc = jv_append_str(r, &b, &item);
    }
    if (rc != 0) {
        free(b.p);
        return rc == PAGODA_ERANGE && pagoda_error_detail()[0] == '\0'
                   ? jinja_fail(r, line, rc, "the output would exceed %u bytes",
                                (unsigned)JINJA_MAX_OUTPUT_BYTES)
                   : rc;
    }
    return jv_from_jbuf(r, &b, out);
}
