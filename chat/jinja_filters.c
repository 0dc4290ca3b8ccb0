/* The filters (`value | name(args)`), as jinja2 defines them and transformers overrides tojson
 * (json.dumps with ensure_ascii off). The names are listed once, in FILTERS, which the parser
 * checks at compile time. */
#include "chat/jinja_internal.h"

#include "common/error.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <utf8proc.h>

#define NAME_IS(p, len, lit) ((len) == sizeof(lit) - 1 && memcmp((p), (lit), (len)) == 0)

static int nomem(struct jrender *r, int line)
{
    return jinja_fail(r, line, PAGODA_ERANGE,
                      "the template needed more than %u bytes of memory while rendering",
                      (unsigned)JINJA_MAX_RENDER_MEMORY);
}

static const char *const FILTERS[] = {
    "safe",       "e",       "escape",   "forceescape", "default",    "d",          "tojson",
    "string",     "length",  "count",    "list",        "int",        "float",      "abs",
    "round",      "items",   "dictsort", "first",       "last",       "reverse",    "sort",
    "unique",     "join",    "select",   "reject",      "selectattr", "rejectattr", "map",
    "sum",        "max",     "min",      "trim",        "upper",      "lower",      "title",
    "capitalize", "replace", "indent",   "wordcount",   NULL,
};

bool jinja_filter_exists(const char *name, size_t len)
{
    for (size_t k = 0; FILTERS[k] != NULL; k++)
        if (strlen(FILTERS[k]) == len && memcmp(FILTERS[k], name, len) == 0)
            return true;
    return false;
}

/* For select/reject/selectattr/rejectattr/map: the test or filter named by the first string
 * argument (after skip arguments), applied with the remaining ones. */
static struct jargs rest_args(const struct jargs *a, size_t skip)
{
    struct jargs rest = *a;
    rest.pos = a->npos > skip ? a->pos + skip : a->pos + a->npos;
    rest.npos = a->npos > skip ? a->npos - skip : 0;
    return rest;
}

static int select_filter(struct jrender *r, int line, const jv *in, const struct jargs *a,
                         bool by_attr, bool keep_if, jv *out)
{
    const jv *items;
    size_t n;
    int rc = jinja_iterate(r, line, in, &items, &n);
    if (rc != 0)
        return rc;
    const jv *attr = NULL;
    size_t skip = 0;
    if (by_attr) {
        attr = jinja_arg(a, 0, "attribute");
        if ((rc = jinja_need_str(r, line, attr, "selectattr/rejectattr take an attribute name")) !=
            0)
            return rc;
        skip = 1;
    }
    const jv *test = a->npos > skip ? &a->pos[skip] : NULL;
    if (test != NULL && test->kind != JV_STRING)
        return jinja_type_error(r, line, "the test of select/reject must be named by a string",
                                test);
    if (test != NULL && !jinja_test_exists(test->u.s.p, test->u.s.len))
        return jinja_fail(r, line, PAGODA_EINVAL, "unknown test '%.*s'", (int)test->u.s.len,
                          test->u.s.p);
    struct jargs targs = rest_args(a, skip + 1);
    targs.nkw = 0;
    if ((rc = jv_new_list(r, n, out)) != 0)
        return rc;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        jv v = items[i];
        if (attr != NULL) {
            if (v.kind == JV_UNDEFINED)
                continue;
            if ((rc = jinja_getattr(r, line, &items[i], attr->u.s.p, attr->u.s.len, &v)) != 0)
                return rc;
            if (v.kind == JV_UNDEFINED && (items[i].kind == JV_DICT))
                if ((rc = jinja_getitem(r, line, &items[i], attr, &v)) != 0)
                    return rc;
        }
        bool t;
        if (test == NULL)
            t = jv_truthy(&v);
        else if ((rc = jinja_test(r, line, test->u.s.p, test->u.s.len, &v, &targs, &t)) != 0)
            return rc;
        if (t == keep_if)
            out->u.list->v[k++] = items[i];
    }
    out->u.list->n = k;
    return 0;
}

/* Reads an attribute (dotted: "a.b", or an index) for map/sort/join/sum/unique. */
static int attr_path(struct jrender *r, int line, const jv *v, const jv *attr, jv *out)
{
    if (attr->kind == JV_INT)
        return jinja_getitem(r, line, v, attr, out);
    if (attr->kind != JV_STRING) /* read below as a string: a list's pointer is no length */
        return jinja_type_error(r, line, "an attribute must be a string or an integer", attr);
    /* the path is read whole for every item (a long one a template built, on a long list) */
    int rc = jinja_work(r, attr->u.s.len);
    if (rc != 0)
        return rc;
    const char *p = attr->u.s.p, *end = p + attr->u.s.len;
    *out = *v;
    while (p <= end) {
        const char *dot = memchr(p, '.', (size_t)(end - p));
        size_t l = dot ? (size_t)(dot - p) : (size_t)(end - p);
        jv key = jv_str(p, l), next;
        bool digits = l > 0;
        int64_t idx = 0;
        for (size_t i = 0; i < l; i++) {
            digits = digits && p[i] >= '0' && p[i] <= '9';
            idx = digits && idx < INT64_MAX / 10 ? idx * 10 + (p[i] - '0') : idx;
        }
        jv ik = jv_int(idx);
        rc = jinja_getitem(r, line, out, digits && out->kind == JV_LIST ? &ik : &key, &next);
        if (rc != 0)
            return rc;
        *out = next;
        if (dot == NULL)
            break;
        p = dot + 1;
    }
    return 0;
}

struct sort_ctx {
    struct jrender *r;
    int line;
    bool case_sensitive, reverse;
    int rc;
};

struct sort_item {
    jv key, v;
    size_t index;
    struct sort_ctx *ctx;
};

static int sort_cmp(const void *x, const void *y)
{
    const struct sort_item *a = x, *b = y;
    struct sort_ctx *c = a->ctx;
    int cmp = 0;
    if (c->rc == 0) {
        if (a->key.kind == JV_NONE && b->key.kind == JV_NONE)
            cmp = 0;
        else
            c->rc = jv_compare(c->r, c->line, &a->key, &b->key, c->case_sensitive, &cmp);
    }
    if (c->reverse)
        cmp = -cmp;
    /* stable: Python's sort is */
    return cmp ? cmp : (a->index > b->index) - (a->index < b->index);
}

static int sort_list(struct jrender *r, int line, const jv *items, size_t n, bool reverse,
                     bool case_sensitive, const jv *attr, bool by_value_of_pair, jv *out)
{
    struct sort_ctx ctx = {r, line, case_sensitive, reverse, 0};
    struct sort_item *s = jinja_arena_alloc(&r->arena, (n ? n : 1) * sizeof(*s));
    if (s == NULL)
        return nomem(r, line);
    int rc;
    for (size_t i = 0; i < n; i++) {
        s[i].v = items[i];
        s[i].key = items[i];
        s[i].index = i;
        s[i].ctx = &ctx;
        if (attr != NULL && (rc = attr_path(r, line, &items[i], attr, &s[i].key)) != 0)
            return rc;
        if (by_value_of_pair)
            s[i].key = items[i].u.list->v[1];
    }
    uint64_t log2n = 1;
    for (size_t m = n; m > 1; m >>= 1)
        log2n++;
    if ((rc = jinja_step(r, (uint64_t)n * log2n)) != 0) /* the comparisons qsort makes */
        return rc;
    jv res;
    if ((rc = jv_new_list(r, n, &res)) != 0)
        return rc;
    qsort(s, n, sizeof(*s), sort_cmp);
    if (ctx.rc != 0)
        return ctx.rc;
    for (size_t i = 0; i < n; i++)
        res.u.list->v[i] = s[i].v;
    *out = res;
    return 0;
}

/* The first line break in [p, end) as Python's str.splitlines() finds them (\\n, \\r, \\r\\n,
 * \\v, \\f, \\x1c-\\x1e, U+0085, U+2028, U+2029), its length in *len; NULL when there is none. */
static const char *line_break(const char *p, const char *end, size_t *len)
{
    for (; p < end; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '\r') {
            *len = p + 1 < end && p[1] == '\n' ? 2 : 1;
            return p;
        }
        if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) {
            *len = 1;
            return p;
        }
        if (c == 0xC2 && p + 1 < end && (unsigned char)p[1] == 0x85) {
            *len = 2;
            return p;
        }
        if (c == 0xE2 && p + 2 < end && (unsigned char)p[1] == 0x80 &&
            ((unsigned char)p[2] == 0xA8 || (unsigned char)p[2] == 0xA9)) {
            *len = 3;
            return p;
        }
    }
    return NULL;
}

static int indent_filter(struct jrender *r, int line, const jv *s, const struct jargs *a, jv *out)
{
    const jv *w = jinja_arg(a, 0, "width");
    const jv *first = jinja_arg(a, 1, "first");
    const jv *blank = jinja_arg(a, 2, "blank");
    jv pad = jv_str("    ", 4);
    int rc;
    if (w != NULL && w->kind == JV_STRING) {
        pad = *w;
    } else if (w != NULL) {
        int64_t n;
        if ((rc = jinja_need_int(r, line, w, "indent width must be an integer or a string", &n)) !=
            0)
            return rc;
        if (n < 0 || n > 1024)
            return jinja_fail(r, line, PAGODA_ERANGE, "indent width out of range");
        char *p = jinja_arena_alloc(&r->arena, (size_t)n + 1);
        if (p == NULL)
            return nomem(r, line);
        memset(p, ' ', (size_t)n);
        pad = jv_str(p, (size_t)n);
    }
    bool f = first && jv_truthy(first), b = blank && jv_truthy(blank);
    struct jbuf buf = {0};
    const char *p = s->u.s.p, *end = p + s->u.s.len;
    bool is_first = true;
    rc = 0;
    for (;;) {
        size_t brk = 0;
        const char *nl = line_break(p, end, &brk);
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        bool empty = l == 0;
        if (!is_first && rc == 0)
            rc = jbuf_append(&buf, "\n", 1);
        if (rc == 0 && (is_first ? f : (b || !empty)))
            rc = jbuf_append(&buf, pad.u.s.p, pad.u.s.len);
        if (rc == 0)
            rc = jbuf_append(&buf, p, l);
        is_first = false;
        /* jinja2 splits s + "\n": a \r at the very end becomes \r\n, one break, no line after */
        if (nl == NULL || rc != 0 || (*nl == '\r' && nl + 1 == end))
            break;
        p = nl + brk;
    }
    if (rc != 0) {
        free(buf.p);
        return jinja_fail(r, line, PAGODA_ERANGE, "the output would exceed %u bytes",
                          (unsigned)JINJA_MAX_OUTPUT_BYTES);
    }
    return jv_from_jbuf(r, &buf, out);
}

static int tojson_filter(struct jrender *r, int line, const jv *in, const struct jargs *a, jv *out)
{
    const jv *ind = jinja_arg(a, 0, "indent");
    const jv *ea = jinja_arg(a, 99, "ensure_ascii");
    const jv *seps = jinja_arg(a, 99, "separators");
    const jv *sk = jinja_arg(a, 99, "sort_keys");
    int64_t indent = -1;
    int rc;
    if (ind != NULL && ind->kind != JV_NONE) {
        if ((rc = jinja_need_int(r, line, ind, "tojson indent must be an integer", &indent)) != 0)
            return rc;
        if (indent < 0 || indent > 64)
            return jinja_fail(r, line, PAGODA_ERANGE, "tojson indent out of range");
    }
    const jv *isep = NULL, *ksep = NULL;
    if (seps != NULL && seps->kind != JV_NONE) {
        if (seps->kind != JV_LIST || seps->u.list->n != 2 || seps->u.list->v[0].kind != JV_STRING ||
            seps->u.list->v[1].kind != JV_STRING)
            return jinja_fail(r, line, PAGODA_EFORMAT, "separators must be a pair of strings");
        isep = &seps->u.list->v[0];
        ksep = &seps->u.list->v[1];
    }
    struct jbuf b = {0};
    rc = jv_append_json(r, line, &b, in, ea != NULL && jv_truthy(ea), (int)indent, isep, ksep,
                        sk != NULL && jv_truthy(sk), 0);
    if (rc != 0) {
        free(b.p);
        return rc;
    }
    return jv_from_jbuf(r, &b, out);
}

static int length_of(struct jrender *r, int line, const jv *v, int64_t *n)
{
    switch (v->kind) {
    case JV_STRING: {
        /* code points: every byte is read */
        int64_t c = 0;
        for (size_t i = 0; i < v->u.s.len; i++)
            c += ((unsigned char)v->u.s.p[i] & 0xC0) != 0x80;
        *n = c;
        return jinja_work(r, v->u.s.len);
    }
    case JV_LIST:
        *n = (int64_t)v->u.list->n;
        return 0;
    case JV_DICT:
    case JV_NAMESPACE:
        *n = (int64_t)v->u.dict->n;
        return 0;
    case JV_UNDEFINED:
        *n = 0;
        return 0;
    default:
        return jinja_type_error(r, line, "object has no len()", v);
    }
}

/* s[*b..*e) without the str.isspace() characters around it, as int() and float() strip. */
static void py_strip(const char *s, size_t *b, size_t *e)
{
    uint32_t cp;
    size_t k;
    while (*b < *e && (k = jinja_u8_next(s + *b, *e - *b, &cp)) > 0 && jinja_is_space(cp))
        *b += k;
    while (*e > *b) {
        size_t start = *e - 1;
        while (start > *b && ((unsigned char)s[start] & 0xC0) == 0x80)
            start--;
        jinja_u8_next(s + start, *e - start, &cp);
        if (!jinja_is_space(cp))
            break;
        *e = start;
    }
}

/* Python's int() and float() of a string, for the int and float filters (jinja2's do_int and
 * do_float call them): whitespace around, a sign, decimal digits with single underscores
 * between them; float() also a fraction, an exponent, "inf", "infinity" and "nan" in any case.
 * Copies the number without its whitespace and underscores into buf (size n) and returns 1 when
 * s[0..len) is one (*is_int: an int() literal), else 0. Not hexadecimal, which strtod would
 * take ('0x1A'|int is 0 in jinja2, int(base=16) reads it: py_int_base); not Unicode digits. */
static int py_number(const char *s, size_t len, char *buf, size_t n, bool *is_int)
{
    size_t i = 0, o = 0;
    py_strip(s, &i, &len);
    if (len - i + 1 > n)
        return 0;
    if (i < len && (s[i] == '+' || s[i] == '-'))
        buf[o++] = s[i++];
    static const char *const words[] = {"inf", "infinity", "nan"};
    for (size_t w = 0; w < 3; w++)
        if (len - i == strlen(words[w]) && strncasecmp(s + i, words[w], len - i) == 0) {
            memcpy(buf + o, words[w], len - i + 1);
            *is_int = false;
            return 1;
        }
    /* digits ('_' only between two), then '.' digits, then 'e' sign digits */
    size_t int_digits = 0, frac_digits = 0;
    bool dot = false, exp = false;
    for (int part = 0; part < 3; part++) {
        if (part == 1) {
            if (i >= len || s[i] != '.')
                continue;
            dot = true;
            buf[o++] = s[i++];
        } else if (part == 2) {
            if (i >= len || (s[i] != 'e' && s[i] != 'E'))
                break;
            exp = true;
            buf[o++] = s[i++];
            if (i < len && (s[i] == '+' || s[i] == '-'))
                buf[o++] = s[i++];
        }
        size_t digits = 0;
        while (i < len) {
            if (s[i] >= '0' && s[i] <= '9') {
                buf[o++] = s[i++];
                digits++;
            } else if (s[i] == '_' && digits > 0 && i + 1 < len && s[i + 1] >= '0' &&
                       s[i + 1] <= '9') {
                i++;
            } else {
                break;
            }
        }
        if (part == 0)
            int_digits = digits;
        else if (part == 1)
            frac_digits = digits;
        else if (digits == 0)
            return 0; /* an exponent without digits */
    }
    buf[o] = '\0';
    if (i != len || int_digits + frac_digits == 0)
        return 0;
    *is_int = !dot && !exp;
    return 1;
}

/* Python's int(s, base) for a base other than 10 (0: from the prefix, or 2 to 36): whitespace
 * around, a sign, the base's prefix (0x, 0o, 0b), digits of the base with single underscores
 * between them (and after the prefix). Returns 1 with *v, 0 when it is not one, -1 past 64 bits. */
static int py_int_base(const char *s, size_t len, int64_t base, int64_t *v)
{
    size_t i = 0;
    py_strip(s, &i, &len);
    if (base != 0 && (base < 2 || base > 36))
        return 0;
    bool neg = false;
    if (i < len && (s[i] == '+' || s[i] == '-'))
        neg = s[i++] == '-';
    if (len - i >= 2 && s[i] == '0') {
        char x = (char)(s[i + 1] | 0x20);
        int64_t pb = x == 'x' ? 16 : x == 'o' ? 8 : x == 'b' ? 2 : 0;
        if (pb != 0 && (base == 0 || base == pb)) {
            base = pb;
            i += 2;
            if (i < len && s[i] == '_')
                i++;
        }
    }
    bool zero_lead = base == 0; /* base 0 without a prefix: decimal, no leading 0 but 0 itself */
    if (base == 0)
        base = 10;
    uint64_t acc = 0;
    size_t digits = 0;
    bool over = false, nonzero = false, first_zero = false;
    for (; i < len; i++) {
        char c = s[i];
        int dv = c >= '0' && c <= '9'                     ? c - '0'
                 : (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? (c | 0x20) - 'a' + 10
                                                          : -1;
        if (c == '_' && digits > 0 && i + 1 < len && s[i + 1] != '_')
            continue;
        if (dv < 0 || dv >= base)
            return 0;
        if (digits == 0)
            first_zero = dv == 0;
        nonzero |= dv != 0;
        digits++;
        if (acc > (UINT64_MAX - (uint64_t)dv) / (uint64_t)base)
            over = true;
        else
            acc = acc * (uint64_t)base + (uint64_t)dv;
    }
    if (digits == 0 || (zero_lead && first_zero && nonzero))
        return 0;
    if (over || acc > (uint64_t)INT64_MAX + neg)
        return -1;
    *v = neg ? (int64_t)(0 - acc) : (int64_t)acc;
    return 1;
}

/* The int and float filters as jinja2's: int() of a string, else int(float()) ("42.23"|int is
 * 42), else dflt; float(), else dflt. An int past 64 bits (Python's is unbounded) or of an infinity
 * (Python's OverflowError) is an error; of a NaN, dflt. */
static int to_number(struct jrender *r, int line, const jv *in, bool want_int, int64_t base,
                     const jv *dflt, jv *out)
{
    double d;
    switch (in->kind) {
    case JV_INT:
        *out = want_int ? *in : jv_float((double)in->u.i);
        return 0;
    case JV_BOOL:
        *out = want_int ? jv_int(in->u.b) : jv_float(in->u.b);
        return 0;
    case JV_FLOAT:
        if (!want_int) {
            *out = *in;
            return 0;
        }
        d = in->u.f;
        break;
    case JV_STRING: {
        char buf[512];
        bool is_int = false;
        int64_t based;
        int got = want_int && base != 10 ? py_int_base(in->u.s.p, in->u.s.len, base, &based) : 0;
        if (got < 0)
            return jinja_fail(r, line, PAGODA_ERANGE, "integer result out of 64-bit range");
        if (got > 0) {
            *out = jv_int(based);
            return 0;
        }
        if (!py_number(in->u.s.p, in->u.s.len, buf, sizeof(buf), &is_int)) {
            *out = *dflt;
            return 0;
        }
        if (want_int && is_int) {
            errno = 0;
            long long v = strtoll(buf, NULL, 10);
            if (errno == ERANGE)
                return jinja_fail(r, line, PAGODA_ERANGE, "integer result out of 64-bit range");
            *out = jv_int(v);
            return 0;
        }
        d = strtod(buf, NULL);
        if (!want_int) {
            *out = jv_float(d);
            return 0;
        }
        break;
    }
    default:
        *out = *dflt;
        return 0;
    }
    if (isnan(d)) {
        *out = *dflt;
        return 0;
    }
    if (!(d > -9223372036854775808.0 && d < 9223372036854775808.0))
        return jinja_fail(r, line, PAGODA_ERANGE, "integer result out of 64-bit range");
    *out = jv_int((int64_t)d);
    return 0;
}

static int map_filter(struct jrender *r, struct jframe *f, int line, const jv *in,
                      const struct jargs *a, jv *out)
{
    const jv *items;
    size_t n;
    int rc = jinja_iterate(r, line, in, &items, &n);
    if (rc != 0)
        return rc;
    const jv *attr = jinja_arg(a, 99, "attribute");
    const jv *dflt = jinja_arg(a, 99, "default");
    const jv *fname = a->npos > 0 ? &a->pos[0] : NULL;
    if (attr == NULL && (fname == NULL || fname->kind != JV_STRING))
        return jinja_fail(r, line, PAGODA_EFORMAT, "map needs attribute= or a filter name");
    if (attr != NULL && attr->kind != JV_STRING && attr->kind != JV_INT)
        return jinja_type_error(r, line, "map attribute must be a string", attr);
    struct jargs fargs = rest_args(a, 1);
    fargs.nkw = 0;
    if ((rc = jv_new_list(r, n, out)) != 0)
        return rc;
    for (size_t i = 0; i < n; i++) {
        jv v;
        if (attr != NULL) {
            if ((rc = attr_path(r, line, &items[i], attr, &v)) != 0)
                return rc;
            if (v.kind == JV_UNDEFINED && dflt != NULL)
                v = *dflt;
        } else if ((rc = jinja_filter(r, f, line, fname->u.s.p, fname->u.s.len, &items[i], &fargs,
                                      &v)) != 0) {
            return rc;
        }
        out->u.list->v[i] = v;
    }
    return 0;
}

int jinja_filter(struct jrender *r, struct jframe *f, int line, const char *name, size_t len,
                 const jv *in, const struct jargs *a, jv *out)
{
    const jv *x = jinja_arg(a, 0, "");
    int rc;
    int64_t n = 0;
#define IS(lit) NAME_IS(name, len, lit)
    if (IS("safe")) {
        /* autoescape is off in chat templates: safe changes nothing (e/escape, below, escape) */
        *out = *in;
        return 0;
    }
    if (IS("default") || IS("d")) {
        const jv *dv = jinja_arg(a, 0, "default_value");
        const jv *boolean = jinja_arg(a, 1, "boolean");
        bool use = in->kind == JV_UNDEFINED || (boolean && jv_truthy(boolean) && !jv_truthy(in));
        *out = use ? (dv ? *dv : jv_str("", 0)) : *in;
        return 0;
    }
    if (IS("tojson"))
        return tojson_filter(r, line, in, a, out);
    if (IS("string"))
        return jv_to_str(r, in, out);
    if (IS("length") || IS("count")) {
        if ((rc = length_of(r, line, in, &n)) != 0)
            return rc;
        *out = jv_int(n);
        return 0;
    }
    if (IS("list")) {
        const jv *items;
        size_t cnt;
        if ((rc = jinja_iterate(r, line, in, &items, &cnt)) != 0 ||
            (rc = jv_new_list(r, cnt, out)) != 0)
            return rc;
        memcpy(out->u.list->v, items, cnt * sizeof(jv));
        return 0;
    }
    if (IS("int") || IS("float")) {
        jv d = IS("int") ? jv_int(0) : jv_float(0.0);
        const jv *dv = jinja_arg(a, 0, "default");
        const jv *bv = IS("int") ? jinja_arg(a, 1, "base") : NULL;
        int64_t base = 10;
        if (bv != NULL && (rc = jinja_need_int(r, line, bv, "int base must be an integer", &base)))
            return rc;
        return to_number(r, line, in, IS("int"), base, dv ? dv : &d, out);
    }
    if (IS("abs")) {
        if (in->kind == JV_INT) {
            if (in->u.i == INT64_MIN)
                return jinja_fail(r, line, PAGODA_ERANGE, "integer result out of 64-bit range");
            *out = jv_int(in->u.i < 0 ? -in->u.i : in->u.i);
        } else if (in->kind == JV_FLOAT) {
            *out = jv_float(fabs(in->u.f));
        } else if (in->kind == JV_BOOL) {
            *out = jv_int(in->u.b);
        } else {
            return jinja_type_error(r, line, "bad operand type for abs()", in);
        }
        return 0;
    }
    if (IS("round")) {
        const jv *prec = jinja_arg(a, 0, "precision");
        const jv *method = jinja_arg(a, 1, "method");
        int64_t p = 0;
        if (prec != NULL &&
            (rc = jinja_need_int(r, line, prec, "round precision must be an integer", &p)) != 0)
            return rc;
        if (in->kind != JV_INT && in->kind != JV_FLOAT && in->kind != JV_BOOL)
            return jinja_type_error(r, line, "round takes a number", in);
        bool common = method == NULL || (method->kind == JV_STRING &&
                                         NAME_IS(method->u.s.p, method->u.s.len, "common"));
        if (!common &&
            !(method->kind == JV_STRING && (NAME_IS(method->u.s.p, method->u.s.len, "floor") ||
                                            NAME_IS(method->u.s.p, method->u.s.len, "ceil"))))
            return jinja_fail(r, line, PAGODA_EINVAL, "method must be common, ceil or floor");
        if (common && in->kind != JV_FLOAT) {
            /* Python's round() of an int is an int (5|round is 5, not 5.0), half to even */
            int64_t v = in->kind == JV_INT ? in->u.i : in->u.b;
            if (p >= 0) {
                *out = jv_int(v);
                return 0;
            }
            if (p < -19) { /* 10^20 is past every int64, half of it too */
                *out = jv_int(0);
                return 0;
            }
            uint64_t m = 1, mag = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
            for (int64_t k = 0; k < -p; k++)
                m *= 10;
            uint64_t q = mag / m, rem = mag % m;
            if (rem > m - rem || (rem == m - rem && (q & 1)))
                q++;
            if (q > (uint64_t)INT64_MAX / m)
                return jinja_fail(r, line, PAGODA_ERANGE, "integer result out of 64-bit range");
            *out = jv_int(v < 0 ? -(int64_t)(q * m) : (int64_t)(q * m));
            return 0;
        }
        double v = in->kind == JV_FLOAT ? in->u.f : in->kind == JV_INT ? (double)in->u.i : in->u.b;
        double m = pow(10.0, (double)(p > 300 ? 300 : p < -300 ? -300 : p));
        double s = v * m;
        if (method != NULL && method->kind == JV_STRING &&
            NAME_IS(method->u.s.p, method->u.s.len, "floor"))
            s = floor(s);
        else if (method != NULL && method->kind == JV_STRING &&
                 NAME_IS(method->u.s.p, method->u.s.len, "ceil"))
            s = ceil(s);
        else if (p >= 0 && p <= 300 && isfinite(v)) {
            /* Python's round(): the exact binary value rounded half to even in decimal, which
             * printf's %.*f also does (2.675 is 2.67499..., so 2.67) */
            char buf[400];
            snprintf(buf, sizeof(buf), "%.*f", (int)p, v);
            *out = jv_float(strtod(buf, NULL));
            return 0;
        } else
            s = nearbyint(s);
        *out = jv_float(s / m);
        return 0;
    }
    if (IS("items")) {
        if (in->kind == JV_UNDEFINED)
            return jv_new_list(r, 0, out);
        if (in->kind != JV_DICT)
            return jinja_type_error(r, line, "items filter takes a mapping", in);
        struct jfunc fn = {JF_DICT_ITEMS, *in};
        return jinja_call_func(r, line, &fn, a, out);
    }
    if (IS("dictsort")) {
        if (in->kind != JV_DICT)
            return jinja_type_error(r, line, "dictsort takes a mapping", in);
        struct jfunc fn = {JF_DICT_ITEMS, *in};
        jv items;
        struct jargs none = {0};
        const jv *cs = jinja_arg(a, 0, "case_sensitive");
        const jv *by = jinja_arg(a, 1, "by");
        const jv *rev = jinja_arg(a, 2, "reverse");
        bool by_value = by && by->kind == JV_STRING && NAME_IS(by->u.s.p, by->u.s.len, "value");
        if ((rc = jinja_call_func(r, line, &fn, &none, &items)) != 0)
            return rc;
        jv zero = jv_int(0);
        return sort_list(r, line, items.u.list->v, items.u.list->n, rev && jv_truthy(rev),
                         cs && jv_truthy(cs), by_value ? NULL : &zero, by_value, out);
    }
    if (IS("first") || IS("last")) {
        const jv *items;
        size_t cnt;
        if ((rc = jinja_iterate(r, line, in, &items, &cnt)) != 0)
            return rc;
        *out = cnt == 0 ? jv_undefined("", 0) : items[IS("first") ? 0 : cnt - 1];
        return 0;
    }
    if (IS("reverse")) {
        if (in->kind == JV_STRING) {
            const jv *items;
            size_t cnt;
            if ((rc = jinja_iterate(r, line, in, &items, &cnt)) != 0)
                return rc;
            char *p = jinja_arena_alloc(&r->arena, in->u.s.len + 1);
            if (p == NULL)
                return nomem(r, line);
            size_t o = 0;
            for (size_t i = cnt; i-- > 0;) {
                memcpy(p + o, items[i].u.s.p, items[i].u.s.len);
                o += items[i].u.s.len;
            }
            p[o] = '\0';
            *out = jv_str(p, o);
            return 0;
        }
        const jv *items;
        size_t cnt;
        if ((rc = jinja_iterate(r, line, in, &items, &cnt)) != 0 ||
            (rc = jv_new_list(r, cnt, out)) != 0)
            return rc;
        for (size_t i = 0; i < cnt; i++)
            out->u.list->v[i] = items[cnt - 1 - i];
        return 0;
    }
    if (IS("sort")) {
        const jv *items;
        size_t cnt;
        const jv *rev = jinja_arg(a, 0, "reverse");
        const jv *cs = jinja_arg(a, 1, "case_sensitive");
        const jv *attr = jinja_arg(a, 2, "attribute");
        if ((rc = jinja_iterate(r, line, in, &items, &cnt)) != 0)
            return rc;
        return sort_list(r, line, items, cnt, rev && jv_truthy(rev), cs && jv_truthy(cs),
                         attr && attr->kind != JV_NONE ? attr : NULL, false, out);
    }
    if (IS("unique")) {
        const jv *items;
        size_t cnt;
        if ((rc = jinja_iterate(r, line, in, &items, &cnt)) != 0 ||
            (rc = jv_new_list(r, cnt, out)) != 0)
            return rc;
        if ((rc = jinja_step(r, cnt * cnt / 16)) != 0)
            return rc;
        size_t k = 0;
        for (size_t i = 0; i < cnt; i++) {
            size_t j;
            for (j = 0; j < k; j++) {
                /* each comparison is charged by jv_compare / jv_equal */
                const jv *u = &out->u.list->v[j], *v = &items[i];
                int cmp = -1;
                bool eq = false;
                if (u->kind == JV_STRING && v->kind == JV_STRING) {
                    if ((rc = jv_compare(r, line, u, v, false, &cmp)) != 0)
                        return rc;
                } else if ((rc = jv_equal(r, u, v, &eq)) != 0) {
                    return rc;
                }
                if (cmp == 0 || eq)
                    break;
            }
            if (j == k)
                out->u.list->v[k++] = items[i];
        }
        out->u.list->n = k;
        return 0;
    }
    if (IS("join")) {
        const jv *sep = jinja_arg(a, 0, "d");
        const jv *attr = jinja_arg(a, 1, "attribute");
        if (sep != NULL &&
            (rc = jinja_need_str(r, line, sep, "join separator must be a string")) != 0)
            return rc;
        return jinja_join(r, line, in, sep, attr, out);
    }
    if (IS("select") || IS("reject"))
        return select_filter(r, line, in, a, false, IS("select"), out);
    if (IS("selectattr") || IS("rejectattr"))
        return select_filter(r, line, in, a, true, IS("selectattr"), out);
    if (IS("map"))
        return map_filter(r, f, line, in, a, out);
    if (IS("sum") || IS("max") || IS("min")) {
        const jv *items;
        size_t cnt;
        const jv *attr = jinja_arg(a, IS("sum") ? 0 : 1, "attribute");
        if (attr != NULL && attr->kind == JV_NONE) /* jinja2's default: no attribute */
            attr = NULL;
        if ((rc = jinja_iterate(r, line, in, &items, &cnt)) != 0)
            return rc;
        if (IS("sum")) {
            const jv *start = jinja_arg(a, 1, "start");
            jv acc = start ? *start : jv_int(0);
            if ((rc = jinja_work(r, (uint64_t)cnt * JINJA_WORK_ELEMENT)) != 0)
                return rc;
            for (size_t i = 0; i < cnt; i++) {
                jv v = items[i];
                if (attr != NULL && (rc = attr_path(r, line, &items[i], attr, &v)) != 0)
                    return rc;
                if (!((v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL) &&
                      (acc.kind == JV_INT || acc.kind == JV_FLOAT)))
                    return jinja_type_error(r, line, "sum takes numbers", &v);
                if (acc.kind == JV_INT && v.kind != JV_FLOAT) {
                    int64_t s;
                    if (__builtin_add_overflow(acc.u.i, v.kind == JV_INT ? v.u.i : v.u.b, &s))
                        return jinja_fail(r, line, PAGODA_ERANGE,
                                          "integer result out of 64-bit range");
                    acc = jv_int(s);
                } else {
                    double x2 = acc.kind == JV_FLOAT ? acc.u.f : (double)acc.u.i;
                    double y2 = v.kind == JV_FLOAT ? v.u.f
                                : v.kind == JV_INT ? (double)v.u.i
                                                   : v.u.b;
                    acc = jv_float(x2 + y2);
                }
            }
            *out = acc;
            return 0;
        }
        if (cnt == 0) {
            *out = jv_undefined("", 0);
            return 0;
        }
        const jv *cs = jinja_arg(a, 0, "case_sensitive");
        jv sorted;
        if ((rc = sort_list(r, line, items, cnt, false, cs && jv_truthy(cs), attr, false,
                            &sorted)) != 0)
            return rc;
        *out = sorted.u.list->v[IS("min") ? 0 : cnt - 1];
        return 0;
    }
    /* string filters: the operand as a string */
    jv s;
    if (IS("trim") || IS("upper") || IS("lower") || IS("title") || IS("capitalize") ||
        IS("replace") || IS("indent") || IS("wordcount") || IS("e") || IS("escape") ||
        IS("forceescape")) {
        if ((rc = jv_to_str(r, in, &s)) != 0)
            return rc;
    } else {
        return jinja_fail(r, line, PAGODA_EINVAL, "unknown filter '%.*s'", (int)len, name);
    }
    if (IS("trim")) {
        const jv *chars = jinja_arg(a, 0, "chars");
        if (chars != NULL && chars->kind != JV_STRING && chars->kind != JV_NONE)
            return jinja_type_error(r, line, "trim chars must be a string", chars);
        return jinja_str_strip(r, line, &s, chars && chars->kind == JV_STRING ? chars : NULL, true,
                               true, out);
    }
    if (IS("upper"))
        return jinja_str_case(r, line, &s, JCASE_UPPER, out);
    if (IS("lower"))
        return jinja_str_case(r, line, &s, JCASE_LOWER, out);
    if (IS("title"))
        return jinja_str_case(r, line, &s, JCASE_TITLE_WORDS, out);
    if (IS("capitalize"))
        return jinja_str_case(r, line, &s, JCASE_CAPITALIZE, out);
    if (IS("replace")) {
        const jv *y = jinja_arg(a, 1, "new");
        const jv *c = jinja_arg(a, 2, "count");
        n = -1;
        if ((rc = jinja_need_str(r, line, x, "replace() arguments must be str")) != 0 ||
            (rc = jinja_need_str(r, line, y, "replace() arguments must be str")) != 0)
            return rc;
        if (c != NULL && c->kind != JV_NONE &&
            (rc = jinja_need_int(r, line, c, "replace() count must be an integer", &n)) != 0)
            return rc;
        return jinja_str_replace(r, line, &s, x, y, n, out);
    }
    if (IS("indent"))
        return indent_filter(r, line, &s, a, out);
    if (IS("wordcount")) {
        /* jinja2 counts the matches of \\w+: runs of letters, numbers and '_' (Python's \\w:
         * str.isalnum() or '_'), not split() */
        int64_t words = 0;
        bool in_word = false;
        for (size_t i = 0; i < s.u.s.len;) {
            uint32_t cp;
            i += jinja_u8_next(s.u.s.p + i, s.u.s.len - i, &cp);
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
            bool w = cp == '_' || (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
                     (cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO);
            words += w && !in_word;
            in_word = w;
        }
        *out = jv_int(words);
        return jinja_step(r, s.u.s.len / 16);
    }
    /* e / escape: HTML escaping, as jinja2's markupsafe does */
    struct jbuf b = {0};
    rc = 0;
    for (size_t i = 0; i < s.u.s.len && rc == 0; i++) {
        const char *rep = NULL;
        switch (s.u.s.p[i]) {
        case '&':
            rep = "&amp;";
            break;
        case '<':
            rep = "&lt;";
            break;
        case '>':
            rep = "&gt;";
            break;
        case '"':
            rep = "&#34;";
            break;
        case '\'':
            rep = "&#39;";
            break;
        }
        rc = rep ? jbuf_append(&b, rep, strlen(rep)) : jbuf_append(&b, s.u.s.p + i, 1);
    }
    if (rc != 0) {
        free(b.p);
        return jinja_fail(r, line, PAGODA_ERANGE, "the output would exceed %u bytes",
                          (unsigned)JINJA_MAX_OUTPUT_BYTES);
    }
    return jv_from_jbuf(r, &b, out);
#undef IS
}
