/* Values of the Jinja interpreter: the arena they live in, conversion from JSON, and what Python
 * does with them that templates rely on: truth, ==, ordering, str(), repr() and json.dumps()
 * (transformers' tojson: ensure_ascii off, key order kept, ", " and ": " separators). */
#include "chat/jinja_internal.h"

#include "common/error.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

/* ---- arena ---- */

#define ARENA_CHUNK (64u * 1024u)

struct jinja_chunk {
    struct jinja_chunk *next;
    size_t size, used;
    max_align_t data[];
};

void jinja_arena_init(struct jinja_arena *a, size_t limit)
{
    a->head = NULL;
    a->used = 0;
    a->limit = limit;
}

void jinja_arena_fini(struct jinja_arena *a)
{
    struct jinja_chunk *c = a->head;
    while (c != NULL) {
        struct jinja_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

void *jinja_arena_alloc(struct jinja_arena *a, size_t n)
{
    const size_t align = sizeof(max_align_t);
    if (n == 0)
        n = 1;
    if (n > a->limit)
        return NULL;
    n = (n + align - 1) / align * align;
    if (a->used + n > a->limit)
        return NULL;
    struct jinja_chunk *c = a->head;
    if (c == NULL || c->size - c->used < n) {
        size_t size = n > ARENA_CHUNK ? n : ARENA_CHUNK;
        c = malloc(sizeof(*c) + size);
        if (c == NULL)
            return NULL;
        c->size = size;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = (char *)c->data + c->used;
    c->used += n;
    a->used += n;
    return p;
}

/* ---- UTF-8 and whitespace ---- */

size_t jinja_u8_next(const char *p, size_t len, uint32_t *cp)
{
    const unsigned char *s = (const unsigned char *)p;
    *cp = 0xFFFFFFFFu;
    if (len == 0)
        return 0;
    unsigned char c = s[0];
    size_t need;
    uint32_t v, min;
    if (c < 0x80) {
        *cp = c;
        return 1;
    } else if ((c & 0xE0) == 0xC0) {
        need = 2, v = c & 0x1F, min = 0x80;
    } else if ((c & 0xF0) == 0xE0) {
        need = 3, v = c & 0x0F, min = 0x800;
    } else if ((c & 0xF8) == 0xF0) {
        need = 4, v = c & 0x07, min = 0x10000;
    } else {
        return 1;
    }
    if (len < need)
        return 1;
    for (size_t k = 1; k < need; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 1;
        v = (v << 6) | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 1;
    *cp = v;
    return need;
}

bool jinja_is_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
           c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
           c == 0x202F || c == 0x205F || c == 0x3000;
}

/* ---- errors and steps ---- */

int jinja_fail(const struct jrender *r, int line, int err, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return pagoda_error_set(err, "line %d: %s", line, msg);
}

int jinja_step(struct jrender *r, uint64_t n)
{
    r->steps += n;
    if (r->steps > JINJA_MAX_STEPS)
        return jinja_fail(r, r->line, PAGODA_ERANGE,
                          "the template took more than %u evaluation steps", JINJA_MAX_STEPS);
    return 0;
}

int jinja_work(struct jrender *r, uint64_t n)
{
    r->work += n;
    if (r->work < JINJA_WORK_PER_STEP)
        return 0;
    uint64_t steps = r->work / JINJA_WORK_PER_STEP;
    r->work %= JINJA_WORK_PER_STEP;
    return jinja_step(r, steps);
}

/* ---- construction ---- */

static int nomem(struct jrender *r)
{
    return jinja_fail(r, r->line, PAGODA_ERANGE,
                      "the template needed more than %u bytes of memory while rendering",
                      (unsigned)JINJA_MAX_RENDER_MEMORY);
}

int jv_new_str(struct jrender *r, const char *p, size_t n, jv *out)
{
    char *s = jinja_arena_alloc(&r->arena, n + 1);
    if (s == NULL)
        return nomem(r);
    if (n)
        memcpy(s, p, n);
    s[n] = '\0';
    *out = jv_str(s, n);
    return jinja_step(r, n / 64);
}

int jv_new_list(struct jrender *r, size_t n, jv *out)
{
    struct jlist *l = jinja_arena_alloc(&r->arena, sizeof(*l));
    jv *items = jinja_arena_alloc(&r->arena, (n ? n : 1) * sizeof(jv));
    if (l == NULL || items == NULL)
        return nomem(r);
    for (size_t i = 0; i < n; i++)
        items[i] = jv_none();
    l->v = items;
    l->n = n;
    l->tuple = false;
    out->kind = JV_LIST;
    out->u.list = l;
    return jinja_step(r, n / 16);
}

int jv_new_dict(struct jrender *r, size_t cap, enum jv_kind kind, jv *out)
{
    struct jdict *d = jinja_arena_alloc(&r->arena, sizeof(*d));
    if (d == NULL)
        return nomem(r);
    d->n = 0;
    d->cap = cap;
    d->e = NULL;
    if (cap) {
        d->e = jinja_arena_alloc(&r->arena, cap * sizeof(*d->e));
        if (d->e == NULL)
            return nomem(r);
    }
    out->kind = kind;
    out->u.dict = d;
    return 0;
}

const jv *jv_dict_get(struct jrender *r, const jv *dict, const char *key, size_t klen)
{
    const struct jdict *d = dict->u.dict;
    /* a step overrun is seen at the next statement; one lookup's work is bounded by the
     * memory the dict's keys take */
    (void)jinja_step(r, d->n / 16);
    for (size_t i = 0; i < d->n; i++)
        if (d->e[i].klen == klen) {
            (void)jinja_work(r, klen); /* keys may be long strings a template built */
            if (memcmp(d->e[i].key, key, klen) == 0)
                return &d->e[i].v;
        }
    return NULL;
}

int jv_dict_set(struct jrender *r, jv *dict, const char *key, size_t klen, jv value)
{
    struct jdict *d = dict->u.dict;
    jv *slot = (jv *)jv_dict_get(r, dict, key, klen);
    if (slot != NULL) {
        *slot = value;
        return 0;
    }
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 4;
        struct jdict_entry *e = jinja_arena_alloc(&r->arena, cap * sizeof(*e));
        if (e == NULL)
            return nomem(r);
        if (d->n)
            memcpy(e, d->e, d->n * sizeof(*e));
        d->e = e;
        d->cap = cap;
    }
    d->e[d->n].key = key;
    d->e[d->n].klen = klen;
    d->e[d->n].v = value;
    d->n++;
    return 0;
}

int jv_from_json(struct jrender *r, const json_t *j, unsigned depth, jv *out)
{
    if (depth > JINJA_MAX_DEPTH)
        return jinja_fail(r, 0, PAGODA_ERANGE, "variables nested deeper than %u", JINJA_MAX_DEPTH);
    int rc = jinja_step(r, 1);
    if (rc != 0)
        return rc;
    switch (json_typeof(j)) {
    case JSON_NULL:
        *out = jv_none();
        return 0;
    case JSON_TRUE:
        *out = jv_bool(true);
        return 0;
    case JSON_FALSE:
        *out = jv_bool(false);
        return 0;
    case JSON_INTEGER:
        *out = jv_int(json_integer_value(j));
        return 0;
    case JSON_REAL:
        *out = jv_float(json_real_value(j));
        return 0;
    case JSON_STRING:
        /* the caller's vars outlive the render: no copy */
        *out = jv_str(json_string_value(j), json_string_length(j));
        return 0;
    case JSON_ARRAY: {
        size_t n = json_array_size(j);
        if ((rc = jv_new_list(r, n, out)) != 0)
            return rc;
        for (size_t i = 0; i < n; i++)
            if ((rc = jv_from_json(r, json_array_get(j, i), depth + 1, &out->u.list->v[i])) != 0)
                return rc;
        return 0;
    }
    case JSON_OBJECT: {
        if ((rc = jv_new_dict(r, json_object_size(j), JV_DICT, out)) != 0)
            return rc;
        const char *key;
        json_t *val;
        struct jdict *d = out->u.dict;
        json_object_foreach((json_t *)j, key, val)
        {
            jv v;
            if ((rc = jv_from_json(r, val, depth + 1, &v)) != 0)
                return rc;
            /* keys of a JSON object are unique: append without a lookup */
            d->e[d->n].key = key;
            d->e[d->n].klen = strlen(key);
            d->e[d->n].v = v;
            d->n++;
        }
        return 0;
    }
    }
    return jinja_fail(r, 0, PAGODA_EINVAL, "a variable of an unknown JSON type");
}

/* ---- Python's view of values ---- */

const char *jv_type_name(const jv *v)
{
    switch (v->kind) {
    case JV_UNDEFINED:
        return "Undefined";
    case JV_NONE:
        return "NoneType";
    case JV_BOOL:
        return "bool";
    case JV_INT:
        return "int";
    case JV_FLOAT:
        return "float";
    case JV_STRING:
        return "str";
    case JV_LIST:
        return "list";
    case JV_DICT:
        return "dict";
    case JV_NAMESPACE:
        return "Namespace";
    case JV_MACRO:
        return "Macro";
    case JV_FUNC:
        return "builtin_function_or_method";
    case JV_LOOP:
        return "LoopContext";
    }
    return "object";
}

bool jv_truthy(const jv *v)
{
    switch (v->kind) {
    case JV_UNDEFINED:
    case JV_NONE:
        return false;
    case JV_BOOL:
        return v->u.b;
    case JV_INT:
        return v->u.i != 0;
    case JV_FLOAT:
        return v->u.f != 0.0;
    case JV_STRING:
        return v->u.s.len != 0;
    case JV_LIST:
        return v->u.list->n != 0;
    case JV_DICT:
        return v->u.dict->n != 0;
    default:
        return true;
    }
}

static bool is_number(const jv *v)
{
    return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL;
}

static double num(const jv *v)
{
    return v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : (double)v->u.b;
}

static int64_t inum(const jv *v)
{
    return v->kind == JV_INT ? v->u.i : (int64_t)v->u.b;
}

/* Nested containers compare to JINJA_MAX_DEPTH levels (values a template builds can nest
 * deeper than the C stack should recurse): below that, they are taken as unequal. Each value
 * visited and each byte compared is charged (jinja_work): lists that share their items nest
 * exponentially many elements in little memory ([a]*100 five levels deep is 10^10). A value is
 * equal to itself without a look inside, as Python's PyObject_RichCompareBool has it (for
 * a NaN too) and as @huggingface/jinja compares lists and objects (by reference). */
static int equal_at(struct jrender *r, const jv *a, const jv *b, unsigned depth, bool *eq)
{
    int rc;
    *eq = false;
    if (depth > JINJA_MAX_DEPTH)
        return 0;
    if ((rc = jinja_work(r, JINJA_WORK_ELEMENT)) != 0)
        return rc;
    if (is_number(a) && is_number(b)) {
        if (a->kind != JV_FLOAT && b->kind != JV_FLOAT)
            *eq = inum(a) == inum(b);
        else
            *eq = num(a) == num(b);
        return 0;
    }
    if (a->kind != b->kind)
        return 0;
    switch (a->kind) {
    case JV_UNDEFINED:
    case JV_NONE:
        *eq = true;
        return 0;
    case JV_STRING:
        if (a->u.s.len != b->u.s.len)
            return 0;
        if (a->u.s.p == b->u.s.p) {
            *eq = true;
            return 0;
        }
        if ((rc = jinja_work(r, a->u.s.len)) != 0)
            return rc;
        *eq = memcmp(a->u.s.p, b->u.s.p, a->u.s.len) == 0;
        return 0;
    case JV_LIST:
        if (a->u.list == b->u.list) {
            *eq = true;
            return 0;
        }
        if (a->u.list->n != b->u.list->n)
            return 0;
        for (size_t i = 0; i < a->u.list->n; i++) {
            if ((rc = equal_at(r, &a->u.list->v[i], &b->u.list->v[i], depth + 1, eq)) != 0 || !*eq)
                return rc;
        }
        *eq = true;
        return 0;
    case JV_DICT: {
        const struct jdict *x = a->u.dict, *y = b->u.dict;
        if (x == y) {
            *eq = true;
            return 0;
        }
        if (x->n != y->n)
            return 0;
        for (size_t i = 0; i < x->n; i++) {
            const jv *v = jv_dict_get(r, b, x->e[i].key, x->e[i].klen);
            if (v == NULL)
                return 0;
            if ((rc = equal_at(r, &x->e[i].v, v, depth + 1, eq)) != 0 || !*eq)
                return rc;
        }
        *eq = true;
        return 0;
    }
    case JV_NAMESPACE:
        *eq = a->u.dict == b->u.dict;
        return 0;
    case JV_MACRO:
        *eq = a->u.macro == b->u.macro;
        return 0;
    case JV_FUNC:
        *eq = a->u.fn == b->u.fn;
        return 0;
    case JV_LOOP:
        *eq = a->u.loop == b->u.loop;
        return 0;
    default:
        return 0;
    }
}

int jv_equal(struct jrender *r, const jv *a, const jv *b, bool *eq)
{
    return equal_at(r, a, b, 0, eq);
}

static uint32_t fold(uint32_t cp, bool case_sensitive)
{
    return case_sensitive ? cp : (uint32_t)utf8proc_tolower((utf8proc_int32_t)cp);
}

static int compare_at(struct jrender *r, int line, const jv *a, const jv *b, bool case_sensitive,
                      int *cmp, unsigned depth)
{
    if (depth > JINJA_MAX_DEPTH)
        return jinja_fail(r, line, PAGODA_ERANGE, "values nested deeper than %u compared",
                          JINJA_MAX_DEPTH);
    if (is_number(a) && is_number(b)) {
        if (a->kind != JV_FLOAT && b->kind != JV_FLOAT)
            *cmp = inum(a) < inum(b) ? -1 : inum(a) > inum(b);
        else
            *cmp = num(a) < num(b) ? -1 : num(a) > num(b);
        return 0;
    }
    if (a->kind == JV_STRING && b->kind == JV_STRING) {
        /* code point order, which is UTF-8 byte order. Charged as it goes, a block of code
         * points at a time, so that a long common prefix stops at the step limit (sort and max
         * compare the same long strings over and over). */
        size_t i = 0, k = 0, cps = 0;
        int rc;
        *cmp = 0;
        if (a->u.s.p == b->u.s.p && a->u.s.len == b->u.s.len) /* the same string: [s] * n */
            return jinja_work(r, JINJA_WORK_ELEMENT);
        while (i < a->u.s.len && k < b->u.s.len) {
            uint32_t x, y;
            if (++cps % 4096 == 0 && (rc = jinja_work(r, 4096 * JINJA_WORK_ELEMENT)) != 0)
                return rc;
            x = (unsigned char)a->u.s.p[i];
            y = (unsigned char)b->u.s.p[k];
            if ((x | y) < 0x80) { /* ASCII, most text: no decoding, no table */
                i++, k++;
                if (!case_sensitive) {
                    x = x >= 'A' && x <= 'Z' ? x + 32 : x;
                    y = y >= 'A' && y <= 'Z' ? y + 32 : y;
                }
            } else {
                i += jinja_u8_next(a->u.s.p + i, a->u.s.len - i, &x);
                k += jinja_u8_next(b->u.s.p + k, b->u.s.len - k, &y);
                x = fold(x, case_sensitive);
                y = fold(y, case_sensitive);
            }
            if (x != y) {
                *cmp = x < y ? -1 : 1;
                break;
            }
        }
        if (*cmp == 0)
            *cmp = i < a->u.s.len ? 1 : k < b->u.s.len ? -1 : 0;
        return jinja_work(r, (cps % 4096 + 1) * JINJA_WORK_ELEMENT);
    }
    if (a->kind == JV_LIST && b->kind == JV_LIST) {
        size_t n = a->u.list->n < b->u.list->n ? a->u.list->n : b->u.list->n;
        for (size_t i = 0; i < n; i++) {
            const jv *x = &a->u.list->v[i], *y = &b->u.list->v[i];
            bool eq;
            int rc = jv_equal(r, x, y, &eq);
            if (rc != 0)
                return rc;
            if (eq)
                continue;
            return compare_at(r, line, x, y, case_sensitive, cmp, depth + 1);
        }
        *cmp = a->u.list->n < b->u.list->n ? -1 : a->u.list->n > b->u.list->n;
        return 0;
    }
    return jinja_fail(r, line, PAGODA_EFORMAT, "'<' not supported between '%s' and '%s'",
                      jv_type_name(a), jv_type_name(b));
}

int jv_compare(struct jrender *r, int line, const jv *a, const jv *b, bool case_sensitive, int *cmp)
{
    return compare_at(r, line, a, b, case_sensitive, cmp, 0);
}

/* ---- buffers and text ---- */

int jbuf_append(struct jbuf *b, const char *p, size_t n)
{
    if (n == 0)
        return 0;
    if (b->len + n > JINJA_MAX_OUTPUT_BYTES)
        return PAGODA_ERANGE;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *np = realloc(b->p, cap);
        if (np == NULL)
            return PAGODA_ENOMEM;
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

/* jbuf_append with the error recorded (the output limit). */
static int put(struct jrender *r, struct jbuf *b, const char *p, size_t n)
{
    int rc = jbuf_append(b, p, n);
    if (rc == PAGODA_ERANGE)
        return jinja_fail(r, r->line, rc, "the output would exceed %u bytes",
                          (unsigned)JINJA_MAX_OUTPUT_BYTES);
    if (rc != 0)
        return jinja_fail(r, r->line, rc, "out of memory");
    return 0;
}

static int puts_(struct jrender *r, struct jbuf *b, const char *s)
{
    return put(r, b, s, strlen(s));
}

/* Python's repr() of a float, which str() and json.dumps() also write: the shortest digits that
 * read back the same, in fixed notation for exponents -4..15 and scientific otherwise. */
static void format_float(double d, char *out, size_t size)
{
    if (isnan(d)) {
        snprintf(out, size, "nan");
        return;
    }
    if (isinf(d)) {
        snprintf(out, size, d < 0 ? "-inf" : "inf");
        return;
    }
    char e[40];
    int prec;
    for (prec = 1; prec <= 17; prec++) {
        snprintf(e, sizeof(e), "%.*e", prec - 1, d);
        if (strtod(e, NULL) == d)
            break;
    }
    /* e is [-]d[.ddd]e[+-]XX */
    const char *s = e;
    bool neg = *s == '-';
    if (neg)
        s++;
    char digits[24];
    size_t nd = 0;
    for (; *s && *s != 'e'; s++)
        if (*s != '.')
            digits[nd++] = *s;
    while (nd > 1 && digits[nd - 1] == '0')
        nd--;
    int exp = atoi(s + 1);
    size_t o = 0;
    if (neg)
        out[o++] = '-';
    if (exp >= -4 && exp < 16) {
        if (exp < 0) {
            out[o++] = '0';
            out[o++] = '.';
            for (int k = 0; k < -exp - 1; k++)
                out[o++] = '0';
            for (size_t k = 0; k < nd; k++)
                out[o++] = digits[k];
        } else {
            for (int k = 0; k <= exp; k++)
                out[o++] = (size_t)k < nd ? digits[k] : '0';
            out[o++] = '.';
            if ((size_t)exp + 1 < nd)
                for (size_t k = (size_t)exp + 1; k < nd; k++)
                    out[o++] = digits[k];
            else
                out[o++] = '0';
        }
        out[o] = '\0';
    } else {
        out[o++] = digits[0];
        if (nd > 1) {
            out[o++] = '.';
            for (size_t k = 1; k < nd; k++)
                out[o++] = digits[k];
        }
        snprintf(out + o, size - o, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    }
}

static bool printable(uint32_t cp)
{
    if (cp == ' ')
        return true;
    utf8proc_category_t c = utf8proc_category((utf8proc_int32_t)cp);
    return !(c == UTF8PROC_CATEGORY_CC || c == UTF8PROC_CATEGORY_CF || c == UTF8PROC_CATEGORY_CS ||
             c == UTF8PROC_CATEGORY_CO || c == UTF8PROC_CATEGORY_CN || c == UTF8PROC_CATEGORY_ZL ||
             c == UTF8PROC_CATEGORY_ZP || c == UTF8PROC_CATEGORY_ZS);
}

static int repr_string(struct jrender *r, struct jbuf *b, const char *p, size_t len)
{
    /* code point by code point, each looked up in utf8proc's tables */
    int rc = jinja_work(r, (uint64_t)len * JINJA_WORK_ELEMENT);
    if (rc != 0)
        return rc;
    char quote = memchr(p, '\'', len) && !memchr(p, '"', len) ? '"' : '\'';
    rc = put(r, b, &quote, 1);
    for (size_t i = 0; i < len && rc == 0;) {
        uint32_t cp;
        size_t k = jinja_u8_next(p + i, len - i, &cp);
        char esc[16];
        if (cp == '\\' || cp == (uint32_t)quote) {
            esc[0] = '\\';
            esc[1] = (char)cp;
            rc = put(r, b, esc, 2);
        } else if (cp == '\n') {
            rc = put(r, b, "\\n", 2);
        } else if (cp == '\r') {
            rc = put(r, b, "\\r", 2);
        } else if (cp == '\t') {
            rc = put(r, b, "\\t", 2);
        } else if (cp != 0xFFFFFFFFu && !printable(cp)) {
            snprintf(esc, sizeof(esc),
                     cp < 0x100     ? "\\x%02x"
                     : cp < 0x10000 ? "\\u%04x"
                                    : "\\U%08x",
                     cp);
            rc = puts_(r, b, esc);
        } else {
            rc = put(r, b, p + i, k);
        }
        i += k;
    }
    return rc ? rc : put(r, b, &quote, 1);
}

static int append_value(struct jrender *r, struct jbuf *b, const jv *v, bool repr, unsigned depth)
{
    char tmp[64];
    int rc;
    if (depth > JINJA_MAX_DEPTH)
        return jinja_fail(r, r->line, PAGODA_ERANGE, "a value nested deeper than %u",
                          JINJA_MAX_DEPTH);
    if ((rc = jinja_step(r, 1)) != 0)
        return rc;
    switch (v->kind) {
    case JV_UNDEFINED:
        return repr ? puts_(r, b, "Undefined") : 0;
    case JV_NONE:
        return puts_(r, b, "None");
    case JV_BOOL:
        return puts_(r, b, v->u.b ? "True" : "False");
    case JV_INT:
        snprintf(tmp, sizeof(tmp), "%" PRId64, v->u.i);
        return puts_(r, b, tmp);
    case JV_FLOAT:
        format_float(v->u.f, tmp, sizeof(tmp));
        return puts_(r, b, tmp);
    case JV_STRING:
        return repr ? repr_string(r, b, v->u.s.p, v->u.s.len) : put(r, b, v->u.s.p, v->u.s.len);
    case JV_LIST: {
        bool tuple = v->u.list->tuple;
        if ((rc = puts_(r, b, tuple ? "(" : "[")) != 0)
            return rc;
        for (size_t i = 0; i < v->u.list->n; i++) {
            if ((i && (rc = puts_(r, b, ", ")) != 0) ||
                (rc = append_value(r, b, &v->u.list->v[i], true, depth + 1)) != 0)
                return rc;
        }
        if (tuple && v->u.list->n == 1 && (rc = puts_(r, b, ",")) != 0)
            return rc;
        return puts_(r, b, tuple ? ")" : "]");
    }
    case JV_DICT:
    case JV_NAMESPACE:
        if ((rc = puts_(r, b, v->kind == JV_DICT ? "{" : "<Namespace {")) != 0)
            return rc;
        for (size_t i = 0; i < v->u.dict->n; i++) {
            const struct jdict_entry *e = &v->u.dict->e[i];
            if ((i && (rc = puts_(r, b, ", ")) != 0) ||
                (rc = repr_string(r, b, e->key, e->klen)) != 0 || (rc = puts_(r, b, ": ")) != 0 ||
                (rc = append_value(r, b, &e->v, true, depth + 1)) != 0)
                return rc;
        }
        return puts_(r, b, v->kind == JV_DICT ? "}" : "}>");
    case JV_MACRO:
        if ((rc = puts_(r, b, "<Macro '")) != 0 ||
            (rc = put(r, b, v->u.macro->str, v->u.macro->len)) != 0)
            return rc;
        return puts_(r, b, "'>");
    case JV_FUNC:
        return puts_(r, b, "<built-in function>");
    case JV_LOOP:
        snprintf(tmp, sizeof(tmp), "<LoopContext %zu/%zu>", v->u.loop->index0 + 1, v->u.loop->n);
        return puts_(r, b, tmp);
    }
    return 0;
}

int jv_append_str(struct jrender *r, struct jbuf *b, const jv *v)
{
    return append_value(r, b, v, false, 0);
}

int jv_append_repr(struct jrender *r, struct jbuf *b, const jv *v)
{
    return append_value(r, b, v, true, 0);
}

int jv_from_jbuf(struct jrender *r, struct jbuf *b, jv *out)
{
    int rc = jv_new_str(r, b->p ? b->p : "", b->len, out);
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
    return rc;
}

int jv_to_str(struct jrender *r, const jv *v, jv *out)
{
    if (v->kind == JV_STRING) {
        *out = *v;
        return 0;
    }
    struct jbuf b = {0};
    int rc = jv_append_str(r, &b, v);
    if (rc != 0) {
        free(b.p);
        return rc;
    }
    return jv_from_jbuf(r, &b, out);
}

static int json_quote(struct jrender *r, struct jbuf *b, const char *p, size_t len,
                      bool ensure_ascii)
{
    /* code point by code point */
    int rc = jinja_work(r, (uint64_t)len * JINJA_WORK_ELEMENT);
    if (rc != 0)
        return rc;
    rc = puts_(r, b, "\"");
    size_t run = 0; /* bytes copied as they are, pending */
    for (size_t i = 0; i < len && rc == 0;) {
        uint32_t cp;
        size_t k = jinja_u8_next(p + i, len - i, &cp);
        const char *esc = NULL;
        char tmp[16];
        switch (cp) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (cp < 0x20) {
                snprintf(tmp, sizeof(tmp), "\\u%04x", cp);
                esc = tmp;
            } else if (ensure_ascii && cp >= 0x7F && cp != 0xFFFFFFFFu) {
                if (cp == 0x7F)
                    break; /* DEL is ASCII: json.dumps writes it as it is */
                if (cp < 0x10000) {
                    snprintf(tmp, sizeof(tmp), "\\u%04x", cp);
                } else {
                    uint32_t v = cp - 0x10000;
                    snprintf(tmp, sizeof(tmp), "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                             0xDC00 + (v & 0x3FF));
                }
                esc = tmp;
            }
        }
        if (esc != NULL) {
            if (run && (rc = put(r, b, p + i - run, run)) != 0)
                return rc;
            run = 0;
            rc = puts_(r, b, esc);
        } else {
            run += k;
        }
        i += k;
    }
    if (rc == 0 && run)
        rc = put(r, b, p + len - run, run);
    return rc ? rc : puts_(r, b, "\"");
}

static int newline_indent(struct jrender *r, struct jbuf *b, int indent, unsigned level)
{
    int rc = puts_(r, b, "\n");
    for (unsigned k = 0; k < level && rc == 0; k++)
        for (int s = 0; s < indent && rc == 0; s++)
            rc = puts_(r, b, " ");
    return rc;
}

struct sorted_key {
    const struct jdict_entry *e;
};

static int cmp_keys(const void *x, const void *y)
{
    const struct jdict_entry *a = ((const struct sorted_key *)x)->e;
    const struct jdict_entry *b = ((const struct sorted_key *)y)->e;
    size_t n = a->klen < b->klen ? a->klen : b->klen;
    int c = memcmp(a->key, b->key, n);
    return c ? c : (a->klen > b->klen) - (a->klen < b->klen);
}

int jv_append_json(struct jrender *r, int line, struct jbuf *b, const jv *v, bool ensure_ascii,
                   int indent, const jv *item_sep, const jv *key_sep, bool sort_keys,
                   unsigned depth)
{
    int rc;
    char tmp[64];
    if (depth > JINJA_MAX_DEPTH)
        return jinja_fail(r, line, PAGODA_ERANGE, "a value nested deeper than %u", JINJA_MAX_DEPTH);
    if ((rc = jinja_step(r, 1)) != 0)
        return rc;
    const char *isep = indent >= 0 ? "," : ", ";
    size_t isep_len = strlen(isep);
    const char *ksep = ": ";
    size_t ksep_len = 2;
    if (item_sep != NULL) {
        isep = item_sep->u.s.p;
        isep_len = item_sep->u.s.len;
    }
    if (key_sep != NULL) {
        ksep = key_sep->u.s.p;
        ksep_len = key_sep->u.s.len;
    }
    switch (v->kind) {
    case JV_NONE:
        return puts_(r, b, "null");
    case JV_BOOL:
        return puts_(r, b, v->u.b ? "true" : "false");
    case JV_INT:
        snprintf(tmp, sizeof(tmp), "%" PRId64, v->u.i);
        return puts_(r, b, tmp);
    case JV_FLOAT:
        if (isnan(v->u.f))
            return puts_(r, b, "NaN");
        if (isinf(v->u.f))
            return puts_(r, b, v->u.f < 0 ? "-Infinity" : "Infinity");
        format_float(v->u.f, tmp, sizeof(tmp));
        return puts_(r, b, tmp);
    case JV_STRING:
        return json_quote(r, b, v->u.s.p, v->u.s.len, ensure_ascii);
    case JV_LIST: {
        const struct jlist *l = v->u.list;
        if (l->n == 0)
            return puts_(r, b, "[]");
        if ((rc = puts_(r, b, "[")) != 0)
            return rc;
        for (size_t i = 0; i < l->n; i++) {
            if (i && (rc = put(r, b, isep, isep_len)) != 0)
                return rc;
            if (indent >= 0 && (rc = newline_indent(r, b, indent, depth + 1)) != 0)
                return rc;
            if ((rc = jv_append_json(r, line, b, &l->v[i], ensure_ascii, indent, item_sep, key_sep,
                                     sort_keys, depth + 1)) != 0)
                return rc;
        }
        if (indent >= 0 && (rc = newline_indent(r, b, indent, depth)) != 0)
            return rc;
        return puts_(r, b, "]");
    }
    case JV_DICT:
    case JV_NAMESPACE: {
        const struct jdict *d = v->u.dict;
        if (d->n == 0)
            return puts_(r, b, "{}");
        struct sorted_key *order = jinja_arena_alloc(&r->arena, d->n * sizeof(*order));
        if (order == NULL)
            return nomem(r);
        for (size_t i = 0; i < d->n; i++)
            order[i].e = &d->e[i];
        if (sort_keys) {
            /* the comparisons qsort makes, each reading up to a key's length */
            uint64_t log2n = 1, bytes = 0;
            for (size_t m = d->n; m > 1; m >>= 1)
                log2n++;
            for (size_t i = 0; i < d->n; i++)
                bytes += d->e[i].klen;
            if ((rc = jinja_step(r, d->n)) != 0 || (rc = jinja_work(r, bytes * log2n)) != 0)
                return rc;
            qsort(order, d->n, sizeof(*order), cmp_keys);
        }
        if ((rc = puts_(r, b, "{")) != 0)
            return rc;
        for (size_t i = 0; i < d->n; i++) {
            const struct jdict_entry *e = order[i].e;
            if (i && (rc = put(r, b, isep, isep_len)) != 0)
                return rc;
            if (indent >= 0 && (rc = newline_indent(r, b, indent, depth + 1)) != 0)
                return rc;
            if ((rc = json_quote(r, b, e->key, e->klen, ensure_ascii)) != 0 ||
                (rc = put(r, b, ksep, ksep_len)) != 0 ||
                (rc = jv_append_json(r, line, b, &e->v, ensure_ascii, indent, item_sep, key_sep,
                                     sort_keys, depth + 1)) != 0)
                return rc;
        }
        if (indent >= 0 && (rc = newline_indent(r, b, indent, depth)) != 0)
            return rc;
        return puts_(r, b, "}");
    }
    default:
        return jinja_fail(r, line, PAGODA_EFORMAT, "Object of type %s is not JSON serializable",
                          jv_type_name(v));
    }
}
