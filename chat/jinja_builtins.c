/* Builtins: attribute and item access, filters, tests, the methods of str and dict, and the
 * globals (range, namespace, raise_exception, strftime_now), each as jinja2 and Python define
 * them. An unknown filter or test is an error naming it, never skipped. */
#include "chat/jinja_internal.h"

#include "common/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#define NAME_IS(p, len, lit) ((len) == sizeof(lit) - 1 && memcmp((p), (lit), (len)) == 0)

static int nomem(struct jrender *r, int line)
{
    return jinja_fail(r, line, PAGODA_ERANGE,
                      "the template needed more than %u bytes of memory while rendering",
                      (unsigned)JINJA_MAX_RENDER_MEMORY);
}

const jv *jinja_arg(const struct jargs *a, size_t pos, const char *name)
{
    if (pos < a->npos)
        return &a->pos[pos];
    size_t len = strlen(name);
    for (size_t k = 0; k < a->nkw; k++)
        if (a->kwname[k]->len == len && memcmp(a->kwname[k]->str, name, len) == 0)
            return &a->kw[k];
    return NULL;
}

static int type_error(struct jrender *r, int line, const char *what, const jv *v)
{
    return jinja_fail(r, line, PAGODA_EFORMAT, "%s, not %s", what, jv_type_name(v));
}

static int func_value(struct jrender *r, int line, enum jfunc_id id, const jv *self, jv *out)
{
    struct jfunc *fn = jinja_arena_alloc(&r->arena, sizeof(*fn));
    if (fn == NULL)
        return nomem(r, line);
    fn->id = id;
    fn->self = self ? *self : jv_none();
    out->kind = JV_FUNC;
    out->u.fn = fn;
    return 0;
}

bool jinja_global(const char *name, size_t len, jv *out)
{
    static struct jfunc globals[] = {
        {JF_RAISE_EXCEPTION, {JV_NONE, {0}}},
        {JF_NAMESPACE, {JV_NONE, {0}}},
        {JF_RANGE, {JV_NONE, {0}}},
        {JF_STRFTIME_NOW, {JV_NONE, {0}}},
    };
    struct jfunc *fn = NULL;
    if (NAME_IS(name, len, "raise_exception"))
        fn = &globals[0];
    else if (NAME_IS(name, len, "namespace"))
        fn = &globals[1];
    else if (NAME_IS(name, len, "range"))
        fn = &globals[2];
    else if (NAME_IS(name, len, "strftime_now"))
        fn = &globals[3];
    if (fn == NULL)
        return false;
    out->kind = JV_FUNC;
    out->u.fn = fn; /* never written: shared by every render */
    return true;
}

/* ---- iteration ---- */

int jinja_iterate(struct jrender *r, int line, const jv *v, const jv **items, size_t *n)
{
    int rc;
    switch (v->kind) {
    case JV_UNDEFINED: {
        static const jv none[1]; /* never NULL: callers memcpy from it */
        *items = none;
        *n = 0;
        return 0;
    }
    case JV_LIST:
        *items = v->u.list->v;
        *n = v->u.list->n;
        return 0;
    case JV_DICT: {
        jv l;
        if ((rc = jv_new_list(r, v->u.dict->n, &l)) != 0)
            return rc;
        for (size_t i = 0; i < v->u.dict->n; i++)
            l.u.list->v[i] = jv_str(v->u.dict->e[i].key, v->u.dict->e[i].klen);
        *items = l.u.list->v;
        *n = l.u.list->n;
        return 0;
    }
    case JV_STRING: {
        jv *chars = jinja_arena_alloc(&r->arena, (v->u.s.len ? v->u.s.len : 1) * sizeof(jv));
        if (chars == NULL)
            return nomem(r, line);
        size_t k = 0;
        for (size_t i = 0; i < v->u.s.len;) {
            uint32_t cp;
            size_t cl = jinja_u8_next(v->u.s.p + i, v->u.s.len - i, &cp);
            chars[k++] = jv_str(v->u.s.p + i, cl);
            i += cl;
        }
        *items = chars;
        *n = k;
        return jinja_step(r, k / 16);
    }
    default:
        return type_error(r, line, "the value iterated must be a list, dict or string", v);
    }
}

/* ---- attributes and items ---- */

static enum jfunc_id str_method(const char *name, size_t len, bool *found)
{
    static const struct {
        const char *name;
        enum jfunc_id id;
    } M[] = {
        {"strip", JF_STR_STRIP},           {"lstrip", JF_STR_LSTRIP},
        {"rstrip", JF_STR_RSTRIP},         {"split", JF_STR_SPLIT},
        {"startswith", JF_STR_STARTSWITH}, {"endswith", JF_STR_ENDSWITH},
        {"upper", JF_STR_UPPER},           {"lower", JF_STR_LOWER},
        {"title", JF_STR_TITLE},           {"capitalize", JF_STR_CAPITALIZE},
        {"replace", JF_STR_REPLACE},       {"find", JF_STR_FIND},
        {"count", JF_STR_COUNT},           {"join", JF_STR_JOIN},
    };
    for (size_t k = 0; k < sizeof(M) / sizeof(M[0]); k++)
        if (strlen(M[k].name) == len && memcmp(M[k].name, name, len) == 0) {
            *found = true;
            return M[k].id;
        }
    *found = false;
    return JF_STR_STRIP;
}

static bool dict_method(const char *name, size_t len, enum jfunc_id *id)
{
    if (NAME_IS(name, len, "items"))
        *id = JF_DICT_ITEMS;
    else if (NAME_IS(name, len, "keys"))
        *id = JF_DICT_KEYS;
    else if (NAME_IS(name, len, "values"))
        *id = JF_DICT_VALUES;
    else if (NAME_IS(name, len, "get"))
        *id = JF_DICT_GET;
    else
        return false;
    return true;
}

static int loop_attr(struct jrender *r, const struct jloop *l, const char *name, size_t len,
                     jv *out)
{
    (void)r;
    int64_t i = (int64_t)l->index0, n = (int64_t)l->n;
    if (NAME_IS(name, len, "index"))
        *out = jv_int(i + 1);
    else if (NAME_IS(name, len, "index0"))
        *out = jv_int(i);
    else if (NAME_IS(name, len, "revindex"))
        *out = jv_int(n - i);
    else if (NAME_IS(name, len, "revindex0"))
        *out = jv_int(n - i - 1);
    else if (NAME_IS(name, len, "first"))
        *out = jv_bool(i == 0);
    else if (NAME_IS(name, len, "last"))
        *out = jv_bool(i == n - 1);
    else if (NAME_IS(name, len, "length"))
        *out = jv_int(n);
    else if (NAME_IS(name, len, "depth"))
        *out = jv_int(1);
    else if (NAME_IS(name, len, "depth0"))
        *out = jv_int(0);
    else if (NAME_IS(name, len, "previtem"))
        *out = i > 0 ? l->items[i - 1] : jv_undefined("loop.previtem", 13);
    else if (NAME_IS(name, len, "nextitem"))
        *out = i + 1 < n ? l->items[i + 1] : jv_undefined("loop.nextitem", 13);
    else
        *out = jv_undefined(name, len);
    return 0;
}

int jinja_getattr(struct jrender *r, int line, const jv *obj, const char *name, size_t len, jv *out)
{
    enum jfunc_id id;
    bool found;
    switch (obj->kind) {
    case JV_DICT: {
        /* jinja2 tries the Python attribute first: d.items is the method */
        if (dict_method(name, len, &id))
            return func_value(r, line, id, obj, out);
        const jv *v = jv_dict_get(r, obj, name, len);
        *out = v ? *v : jv_undefined(name, len);
        return 0;
    }
    case JV_NAMESPACE: {
        const jv *v = jv_dict_get(r, obj, name, len);
        *out = v ? *v : jv_undefined(name, len);
        return 0;
    }
    case JV_STRING:
        id = str_method(name, len, &found);
        if (found)
            return func_value(r, line, id, obj, out);
        break;
    case JV_LOOP:
        return loop_attr(r, obj->u.loop, name, len, out);
    default:
        break;
    }
    *out = jv_undefined(name, len);
    return 0;
}

int jinja_getitem(struct jrender *r, int line, const jv *obj, const jv *key, jv *out)
{
    if (key->kind == JV_STRING) {
        if (obj->kind == JV_DICT || obj->kind == JV_NAMESPACE) {
            const jv *v = jv_dict_get(r, obj, key->u.s.p, key->u.s.len);
            if (v != NULL) {
                *out = *v;
                return 0;
            }
            if (obj->kind == JV_NAMESPACE) {
                *out = jv_undefined(key->u.s.p, key->u.s.len);
                return 0;
            }
        }
        /* then the attribute, as jinja2's getitem does */
        return jinja_getattr(r, line, obj, key->u.s.p, key->u.s.len, out);
    }
    if (key->kind == JV_INT || key->kind == JV_BOOL) {
        int64_t i = key->kind == JV_INT ? key->u.i : key->u.b;
        if (obj->kind == JV_LIST) {
            int64_t n = (int64_t)obj->u.list->n;
            if (i < 0)
                i += n;
            *out = i >= 0 && i < n ? obj->u.list->v[i] : jv_undefined("", 0);
            return 0;
        }
        if (obj->kind == JV_STRING) {
            const jv *chars;
            size_t n;
            int rc = jinja_iterate(r, line, obj, &chars, &n);
            if (rc != 0)
                return rc;
            if (i < 0)
                i += (int64_t)n;
            *out = i >= 0 && i < (int64_t)n ? chars[i] : jv_undefined("", 0);
            return 0;
        }
    }
    *out = jv_undefined("", 0);
    return 0;
}

/* ---- strings ---- */

static bool in_chars(uint32_t cp, const jv *chars)
{
    if (chars == NULL)
        return jinja_is_space(cp);
    for (size_t i = 0; i < chars->u.s.len;) {
        uint32_t c;
        i += jinja_u8_next(chars->u.s.p + i, chars->u.s.len - i, &c);
        if (c == cp)
            return true;
    }
    return false;
}

/* str.strip / lstrip / rstrip(chars): chars NULL strips whitespace. */
static jv strip(const jv *s, const jv *chars, bool left, bool right)
{
    size_t b = 0, e = s->u.s.len;
    if (left)
        while (b < e) {
            uint32_t cp;
            size_t k = jinja_u8_next(s->u.s.p + b, e - b, &cp);
            if (!in_chars(cp, chars))
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
            if (!in_chars(cp, chars))
                break;
            e = start;
        }
    return jv_str(s->u.s.p + b, e - b);
}

enum casing { UPPER, LOWER, TITLE, CAPITALIZE };

static int change_case(struct jrender *r, int line, const jv *s, enum casing how, jv *out)
{
    /* at most 4 bytes per code point either way */
    char *p = jinja_arena_alloc(&r->arena, s->u.s.len * 4 + 1);
    if (p == NULL)
        return nomem(r, line);
    size_t o = 0;
    bool prev_cased = false, first = true;
    for (size_t i = 0; i < s->u.s.len;) {
        uint32_t cp;
        i += jinja_u8_next(s->u.s.p + i, s->u.s.len - i, &cp);
        utf8proc_int32_t c = (utf8proc_int32_t)cp, m = c;
        switch (how) {
        case UPPER:
            m = utf8proc_toupper(c);
            break;
        case LOWER:
            m = utf8proc_tolower(c);
            break;
        case CAPITALIZE:
            m = first ? utf8proc_totitle(c) : utf8proc_tolower(c);
            break;
        case TITLE: {
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
static const char *find_sub(const char *h, size_t hl, const char *n, size_t nl)
{
    if (nl == 0)
        return h;
    return memmem(h, hl, n, nl);
}

static int str_replace(struct jrender *r, int line, const jv *s, const jv *old, const jv *new_,
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
                                  ? find_sub(p, (size_t)(end - p), old->u.s.p, old->u.s.len)
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
    if ((rc = jinja_step(r, s->u.s.len / 64)) != 0) {
        free(b.p);
        return rc;
    }
    return jv_from_jbuf(r, &b, out);
}

/* str.split(sep=None, maxsplit=-1) */
static int str_split(struct jrender *r, int line, const jv *s, const jv *sep, int64_t maxsplit,
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
                jv rest = strip(&(jv){.kind = JV_STRING, .u.s = {p, (size_t)(end - p)}}, NULL,
                                false, true);
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
            return type_error(r, line, "split() separator must be str or None", sep);
        if (sep->u.s.len == 0)
            return jinja_fail(r, line, PAGODA_EFORMAT, "empty separator");
        for (;;) {
            const char *hit = (maxsplit < 0 || (int64_t)n < maxsplit)
                                  ? find_sub(p, (size_t)(end - p), sep->u.s.p, sep->u.s.len)
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
    out->kind = JV_LIST;
    out->u.list = l;
    return jinja_step(r, s->u.s.len / 64 + n / 16);
}

static int affix(struct jrender *r, int line, const jv *s, const jv *arg, bool start, jv *out)
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
    for (size_t i = 0; i < nc; i++) {
        const jv *c = &cands[i];
        if (c->kind != JV_STRING)
            return type_error(r, line, "startswith/endswith take a str or a tuple of str", c);
        if (c->u.s.len > s->u.s.len)
            continue;
        const char *at = start ? s->u.s.p : s->u.s.p + s->u.s.len - c->u.s.len;
        if (memcmp(at, c->u.s.p, c->u.s.len) == 0) {
            *out = jv_bool(true);
            return 0;
        }
    }
    *out = jv_bool(false);
    return 0;
}

static int join(struct jrender *r, int line, const jv *seq, const jv *sep, const jv *attr, jv *out)
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

/* ---- globals and methods ---- */

static int need_str(struct jrender *r, int line, const jv *v, const char *what)
{
    if (v == NULL)
        return jinja_fail(r, line, PAGODA_EFORMAT, "%s: missing argument", what);
    if (v->kind != JV_STRING)
        return type_error(r, line, what, v);
    return 0;
}

static int need_int(struct jrender *r, int line, const jv *v, const char *what, int64_t *out)
{
    *out = 0;
    if (v->kind != JV_INT && v->kind != JV_BOOL)
        return type_error(r, line, what, v);
    *out = v->kind == JV_INT ? v->u.i : v->u.b;
    return 0;
}

static int range_fn(struct jrender *r, int line, const struct jargs *a, jv *out)
{
    int64_t x[3] = {0, 0, 1};
    int rc;
    if (a->npos < 1 || a->npos > 3)
        return jinja_fail(r, line, PAGODA_EFORMAT, "range expected 1 to 3 arguments, got %zu",
                          a->npos);
    for (size_t i = 0; i < a->npos; i++)
        if ((rc = need_int(r, line, &a->pos[i], "range() takes integers", &x[i])) != 0)
            return rc;
    int64_t start = a->npos == 1 ? 0 : x[0], stop = a->npos == 1 ? x[0] : x[1],
            step = a->npos == 3 ? x[2] : 1;
    if (step == 0)
        return jinja_fail(r, line, PAGODA_EFORMAT, "range() arg 3 must not be zero");
    double count_d =
        step > 0 ? (stop > start ? ceil(((double)stop - (double)start) / (double)step) : 0)
                 : (start > stop ? ceil(((double)start - (double)stop) / (double)-step) : 0);
    /* the sandbox's MAX_RANGE, jinja2's own bound */
    if (count_d > 100000.0)
        return jinja_fail(r, line, PAGODA_ERANGE, "range too big (%.0f items, at most 100000)",
                          count_d);
    size_t count = (size_t)count_d;
    if ((rc = jinja_step(r, count)) != 0 || (rc = jv_new_list(r, count, out)) != 0)
        return rc;
    for (size_t i = 0; i < count; i++)
        out->u.list->v[i] = jv_int(start + (int64_t)i * step);
    return 0;
}

int jinja_call_func(struct jrender *r, int line, const struct jfunc *fn, const struct jargs *a,
                    jv *out)
{
    const jv *self = &fn->self;
    const jv *x = jinja_arg(a, 0, "");
    const jv *y = jinja_arg(a, 1, "");
    int64_t count = -1;
    int rc;
    switch (fn->id) {
    case JF_RAISE_EXCEPTION: {
        jv msg = jv_str("", 0);
        if (x != NULL && (rc = jv_to_str(r, x, &msg)) != 0)
            return rc;
        return jinja_fail(r, line, PAGODA_EINVAL, "raise_exception: %.*s", (int)msg.u.s.len,
                          msg.u.s.p);
    }
    case JF_NAMESPACE:
        if ((rc = jv_new_dict(r, a->nkw, JV_NAMESPACE, out)) != 0)
            return rc;
        if (a->npos > 1)
            return jinja_fail(r, line, PAGODA_EFORMAT,
                              "namespace() takes at most 1 positional argument");
        if (a->npos == 1) {
            if (a->pos[0].kind != JV_DICT)
                return type_error(r, line, "namespace() takes a dict", &a->pos[0]);
            for (size_t i = 0; i < a->pos[0].u.dict->n; i++) {
                const struct jdict_entry *e = &a->pos[0].u.dict->e[i];
                if ((rc = jv_dict_set(r, out, e->key, e->klen, e->v)) != 0)
                    return rc;
            }
        }
        for (size_t k = 0; k < a->nkw; k++)
            if ((rc = jv_dict_set(r, out, a->kwname[k]->str, a->kwname[k]->len, a->kw[k])) != 0)
                return rc;
        return 0;
    case JF_RANGE:
        return range_fn(r, line, a, out);
    case JF_STRFTIME_NOW: {
        if ((rc = need_str(r, line, x, "strftime_now() takes a format string")) != 0)
            return rc;
        char fmt[256], buf[512];
        if (x->u.s.len >= sizeof(fmt))
            return jinja_fail(r, line, PAGODA_ERANGE, "strftime_now(): format too long");
        memcpy(fmt, x->u.s.p, x->u.s.len);
        fmt[x->u.s.len] = '\0';
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        size_t n = strftime(buf, sizeof(buf), fmt, &tm);
        return jv_new_str(r, buf, n, out);
    }
    case JF_STR_STRIP:
    case JF_STR_LSTRIP:
    case JF_STR_RSTRIP:
        if (x != NULL && x->kind != JV_NONE && x->kind != JV_STRING)
            return type_error(r, line, "strip arg must be None or str", x);
        *out = strip(self, x && x->kind == JV_STRING ? x : NULL, fn->id != JF_STR_RSTRIP,
                     fn->id != JF_STR_LSTRIP);
        return 0;
    case JF_STR_SPLIT: {
        const jv *ms = jinja_arg(a, 1, "maxsplit");
        if (ms != NULL && (rc = need_int(r, line, ms, "maxsplit must be an integer", &count)) != 0)
            return rc;
        return str_split(r, line, self, jinja_arg(a, 0, "sep"), count, out);
    }
    case JF_STR_STARTSWITH:
    case JF_STR_ENDSWITH:
        return affix(r, line, self, x, fn->id == JF_STR_STARTSWITH, out);
    case JF_STR_UPPER:
        return change_case(r, line, self, UPPER, out);
    case JF_STR_LOWER:
        return change_case(r, line, self, LOWER, out);
    case JF_STR_TITLE:
        return change_case(r, line, self, TITLE, out);
    case JF_STR_CAPITALIZE:
        return change_case(r, line, self, CAPITALIZE, out);
    case JF_STR_REPLACE: {
        const jv *c = jinja_arg(a, 2, "count");
        if ((rc = need_str(r, line, x, "replace() arguments must be str")) != 0 ||
            (rc = need_str(r, line, y, "replace() arguments must be str")) != 0)
            return rc;
        if (c != NULL &&
            (rc = need_int(r, line, c, "replace() count must be an integer", &count)) != 0)
            return rc;
        return str_replace(r, line, self, x, y, count, out);
    }
    case JF_STR_FIND:
    case JF_STR_COUNT: {
        if ((rc = need_str(r, line, x, "find()/count() take a str")) != 0)
            return rc;
        const char *hit = find_sub(self->u.s.p, self->u.s.len, x->u.s.p, x->u.s.len);
        if (fn->id == JF_STR_FIND) {
            if (hit == NULL) {
                *out = jv_int(-1);
                return 0;
            }
            int64_t cps = 0;
            for (const char *q = self->u.s.p; q < hit; q++)
                cps += ((unsigned char)*q & 0xC0) != 0x80;
            *out = jv_int(cps);
            return 0;
        }
        int64_t n = 0;
        if (x->u.s.len == 0) {
            for (size_t i = 0; i < self->u.s.len; i++)
                n += ((unsigned char)self->u.s.p[i] & 0xC0) != 0x80;
            n++;
        } else {
            const char *p = self->u.s.p, *end = p + self->u.s.len;
            while ((hit = find_sub(p, (size_t)(end - p), x->u.s.p, x->u.s.len)) != NULL) {
                n++;
                p = hit + x->u.s.len;
            }
        }
        *out = jv_int(n);
        return jinja_step(r, self->u.s.len / 64);
    }
    case JF_STR_JOIN:
        if (x == NULL)
            return jinja_fail(r, line, PAGODA_EFORMAT, "join() takes exactly one argument");
        return join(r, line, x, self, NULL, out);
    case JF_DICT_ITEMS:
    case JF_DICT_KEYS:
    case JF_DICT_VALUES: {
        const struct jdict *d = self->u.dict;
        if ((rc = jv_new_list(r, d->n, out)) != 0)
            return rc;
        for (size_t i = 0; i < d->n; i++) {
            jv k = jv_str(d->e[i].key, d->e[i].klen);
            if (fn->id == JF_DICT_KEYS) {
                out->u.list->v[i] = k;
            } else if (fn->id == JF_DICT_VALUES) {
                out->u.list->v[i] = d->e[i].v;
            } else {
                jv pair;
                if ((rc = jv_new_list(r, 2, &pair)) != 0)
                    return rc;
                pair.u.list->v[0] = k;
                pair.u.list->v[1] = d->e[i].v;
                out->u.list->v[i] = pair;
            }
        }
        return 0;
    }
    case JF_DICT_GET: {
        if (x == NULL)
            return jinja_fail(r, line, PAGODA_EFORMAT, "get() takes at least 1 argument");
        const jv *v = x->kind == JV_STRING ? jv_dict_get(r, self, x->u.s.p, x->u.s.len) : NULL;
        *out = v ? *v : y ? *y : jv_none();
        return 0;
    }
    }
    return jinja_fail(r, line, PAGODA_EINTERNAL, "unknown function");
}

/* ---- tests ---- */

static const char *const TESTS[] = {
    "defined", "undefined", "none",        "string",   "number",   "integer", "float",
    "boolean", "mapping",   "iterable",    "sequence", "callable", "true",    "false",
    "odd",     "even",      "divisibleby", "equalto",  "eq",       "==",      "ne",
    "!=",      "lt",        "<",           "le",       "<=",       "gt",      ">",
    "ge",      ">=",        "in",          "lower",    "upper",    "sameas",  NULL,
};

bool jinja_test_exists(const char *name, size_t len)
{
    for (size_t k = 0; TESTS[k] != NULL; k++)
        if (strlen(TESTS[k]) == len && memcmp(TESTS[k], name, len) == 0)
            return true;
    return false;
}

int jinja_test(struct jrender *r, int line, const char *name, size_t len, const jv *v,
               const struct jargs *args, bool *out)
{
    const jv *x = jinja_arg(args, 0, "value");
    enum jv_kind k = v->kind;
    int rc, cmp;
#define IS(lit) NAME_IS(name, len, lit)
    if (IS("defined"))
        *out = k != JV_UNDEFINED;
    else if (IS("undefined"))
        *out = k == JV_UNDEFINED;
    else if (IS("none"))
        *out = k == JV_NONE;
    else if (IS("string"))
        *out = k == JV_STRING;
    else if (IS("number"))
        *out = k == JV_INT || k == JV_FLOAT;
    else if (IS("integer"))
        *out = k == JV_INT;
    else if (IS("float"))
        *out = k == JV_FLOAT;
    else if (IS("boolean"))
        *out = k == JV_BOOL;
    else if (IS("mapping"))
        *out = k == JV_DICT;
    else if (IS("iterable"))
        *out = k == JV_LIST || k == JV_DICT || k == JV_STRING || k == JV_UNDEFINED;
    else if (IS("sequence"))
        *out = k == JV_LIST || k == JV_DICT || k == JV_STRING;
    else if (IS("callable"))
        *out = k == JV_MACRO || k == JV_FUNC;
    else if (IS("true"))
        *out = k == JV_BOOL && v->u.b;
    else if (IS("false"))
        *out = k == JV_BOOL && !v->u.b;
    else if (IS("lower") || IS("upper")) {
        jv conv;
        if (k != JV_STRING) {
            *out = false;
            return 0;
        }
        if ((rc = change_case(r, line, v, IS("lower") ? LOWER : UPPER, &conv)) != 0)
            return rc;
        *out = jv_equal(&conv, v);
    } else if (IS("odd") || IS("even") || IS("divisibleby")) {
        int64_t i, d = IS("divisibleby") ? 0 : 2;
        if ((rc = need_int(r, line, v, "odd/even/divisibleby test an integer", &i)) != 0)
            return rc;
        if (d == 0) {
            if (x == NULL || (rc = need_int(r, line, x, "divisibleby takes an integer", &d)) != 0)
                return x ? rc : jinja_fail(r, line, PAGODA_EFORMAT, "divisibleby needs a number");
            if (d == 0)
                return jinja_fail(r, line, PAGODA_EFORMAT, "divisibleby 0");
            *out = i % d == 0;
        } else {
            *out = (i % 2 == 0) == IS("even");
        }
    } else if (IS("equalto") || IS("eq") || IS("==") || IS("ne") || IS("!=") || IS("sameas")) {
        if (x == NULL)
            return jinja_fail(r, line, PAGODA_EFORMAT, "the test '%.*s' needs a value", (int)len,
                              name);
        *out = (IS("ne") || IS("!=")) ? !jv_equal(v, x) : jv_equal(v, x);
    } else if (IS("lt") || IS("<") || IS("le") || IS("<=") || IS("gt") || IS(">") || IS("ge") ||
               IS(">=")) {
        if (x == NULL)
            return jinja_fail(r, line, PAGODA_EFORMAT, "the test '%.*s' needs a value", (int)len,
                              name);
        if ((rc = jv_compare(r, line, v, x, true, &cmp)) != 0)
            return rc;
        *out = (IS("lt") || IS("<"))    ? cmp < 0
               : (IS("le") || IS("<=")) ? cmp <= 0
               : (IS("gt") || IS(">"))  ? cmp > 0
                                        : cmp >= 0;
    } else if (IS("in")) {
        if (x == NULL)
            return jinja_fail(r, line, PAGODA_EFORMAT, "the test 'in' needs a value");
        const jv *items;
        size_t n;
        if (x->kind == JV_STRING && v->kind == JV_STRING) {
            *out = find_sub(x->u.s.p, x->u.s.len, v->u.s.p, v->u.s.len) != NULL;
            return 0;
        }
        if (x->kind == JV_DICT) {
            *out = v->kind == JV_STRING && jv_dict_get(r, x, v->u.s.p, v->u.s.len) != NULL;
            return 0;
        }
        if ((rc = jinja_iterate(r, line, x, &items, &n)) != 0)
            return rc;
        *out = false;
        for (size_t i = 0; i < n && !*out; i++)
            *out = jv_equal(v, &items[i]);
    } else {
        return jinja_fail(r, line, PAGODA_EINVAL, "unknown test '%.*s'", (int)len, name);
    }
#undef IS
    return 0;
}

/* ---- filters ---- */

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
        if ((rc = need_str(r, line, attr, "selectattr/rejectattr take an attribute name")) != 0)
            return rc;
        skip = 1;
    }
    const jv *test = a->npos > skip ? &a->pos[skip] : NULL;
    if (test != NULL && test->kind != JV_STRING)
        return type_error(r, line, "the test of select/reject must be named by a string", test);
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
        int rc = jinja_getitem(r, line, out, digits && out->kind == JV_LIST ? &ik : &key, &next);
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
        if ((rc = need_int(r, line, w, "indent width must be an integer or a string", &n)) != 0)
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
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) : (size_t)(end - p);
        bool empty = l == 0;
        if (!is_first && rc == 0)
            rc = jbuf_append(&buf, "\n", 1);
        if (rc == 0 && (is_first ? f : (b || !empty)))
            rc = jbuf_append(&buf, pad.u.s.p, pad.u.s.len);
        if (rc == 0)
            rc = jbuf_append(&buf, p, l);
        is_first = false;
        if (nl == NULL || rc != 0)
            break;
        p = nl + 1;
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
        if ((rc = need_int(r, line, ind, "tojson indent must be an integer", &indent)) != 0)
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
        int64_t c = 0;
        for (size_t i = 0; i < v->u.s.len; i++)
            c += ((unsigned char)v->u.s.p[i] & 0xC0) != 0x80;
        *n = c;
        return 0;
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
        return type_error(r, line, "object has no len()", v);
    }
}

static int to_number(struct jrender *r, int line, const jv *in, bool want_int, const jv *dflt,
                     jv *out)
{
    (void)r;
    (void)line;
    switch (in->kind) {
    case JV_INT:
        *out = want_int ? *in : jv_float((double)in->u.i);
        return 0;
    case JV_BOOL:
        *out = want_int ? jv_int(in->u.b) : jv_float(in->u.b);
        return 0;
    case JV_FLOAT:
        if (want_int) {
            if (!(in->u.f > -9.2e18 && in->u.f < 9.2e18)) {
                *out = *dflt;
                return 0;
            }
            *out = jv_int((int64_t)in->u.f);
        } else {
            *out = *in;
        }
        return 0;
    case JV_STRING: {
        char buf[64];
        if (in->u.s.len == 0 || in->u.s.len >= sizeof(buf)) {
            *out = *dflt;
            return 0;
        }
        memcpy(buf, in->u.s.p, in->u.s.len);
        buf[in->u.s.len] = '\0';
        char *end;
        if (want_int) {
            long long v = strtoll(buf, &end, 10);
            if (*end != '\0' && *end != ' ') {
                double d = strtod(buf, &end);
                if (*end == '\0' && d > -9.2e18 && d < 9.2e18) {
                    *out = jv_int((int64_t)d);
                    return 0;
                }
                *out = *dflt;
                return 0;
            }
            *out = jv_int(v);
        } else {
            double d = strtod(buf, &end);
            *out = *end == '\0' ? jv_float(d) : *dflt;
        }
        return 0;
    }
    default:
        *out = *dflt;
        return 0;
    }
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
        return type_error(r, line, "map attribute must be a string", attr);
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
    if (IS("safe") || IS("e") || IS("escape") || IS("forceescape")) {
        /* autoescape is off in chat templates: escape is not applied either (transformers) */
        if (IS("safe")) {
            *out = *in;
            return 0;
        }
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
        return to_number(r, line, in, IS("int"), dv ? dv : &d, out);
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
            return type_error(r, line, "bad operand type for abs()", in);
        }
        return 0;
    }
    if (IS("round")) {
        const jv *prec = jinja_arg(a, 0, "precision");
        const jv *method = jinja_arg(a, 1, "method");
        int64_t p = 0;
        if (prec != NULL &&
            (rc = need_int(r, line, prec, "round precision must be an integer", &p)) != 0)
            return rc;
        if (in->kind != JV_INT && in->kind != JV_FLOAT && in->kind != JV_BOOL)
            return type_error(r, line, "round takes a number", in);
        double v = in->kind == JV_FLOAT ? in->u.f : in->kind == JV_INT ? (double)in->u.i : in->u.b;
        double m = pow(10.0, (double)(p > 300 ? 300 : p < -300 ? -300 : p));
        double s = v * m;
        if (method != NULL && method->kind == JV_STRING &&
            NAME_IS(method->u.s.p, method->u.s.len, "floor"))
            s = floor(s);
        else if (method != NULL && method->kind == JV_STRING &&
                 NAME_IS(method->u.s.p, method->u.s.len, "ceil"))
            s = ceil(s);
        else
            s = nearbyint(s); /* Python rounds half to even */
        *out = jv_float(s / m);
        return 0;
    }
    if (IS("items")) {
        if (in->kind == JV_UNDEFINED)
            return jv_new_list(r, 0, out);
        if (in->kind != JV_DICT)
            return type_error(r, line, "items filter takes a mapping", in);
        struct jfunc fn = {JF_DICT_ITEMS, *in};
        return jinja_call_func(r, line, &fn, a, out);
    }
    if (IS("dictsort")) {
        if (in->kind != JV_DICT)
            return type_error(r, line, "dictsort takes a mapping", in);
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
                const jv *u = &out->u.list->v[j], *v = &items[i];
                int cmp = -1;
                if (u->kind == JV_STRING && v->kind == JV_STRING)
                    (void)jv_compare(r, line, u, v, false, &cmp);
                if (cmp == 0 || jv_equal(u, v))
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
        if (sep != NULL && (rc = need_str(r, line, sep, "join separator must be a string")) != 0)
            return rc;
        return join(r, line, in, sep, attr, out);
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
        if ((rc = jinja_iterate(r, line, in, &items, &cnt)) != 0)
            return rc;
        if (IS("sum")) {
            const jv *start = jinja_arg(a, 1, "start");
            jv acc = start ? *start : jv_int(0);
            for (size_t i = 0; i < cnt; i++) {
                jv v = items[i];
                if (attr != NULL && (rc = attr_path(r, line, &items[i], attr, &v)) != 0)
                    return rc;
                if (!((v.kind == JV_INT || v.kind == JV_FLOAT || v.kind == JV_BOOL) &&
                      (acc.kind == JV_INT || acc.kind == JV_FLOAT)))
                    return type_error(r, line, "sum takes numbers", &v);
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
            return type_error(r, line, "trim chars must be a string", chars);
        *out = strip(&s, chars && chars->kind == JV_STRING ? chars : NULL, true, true);
        return 0;
    }
    if (IS("upper"))
        return change_case(r, line, &s, UPPER, out);
    if (IS("lower"))
        return change_case(r, line, &s, LOWER, out);
    if (IS("title"))
        return change_case(r, line, &s, TITLE, out);
    if (IS("capitalize"))
        return change_case(r, line, &s, CAPITALIZE, out);
    if (IS("replace")) {
        const jv *y = jinja_arg(a, 1, "new");
        const jv *c = jinja_arg(a, 2, "count");
        n = -1;
        if ((rc = need_str(r, line, x, "replace() arguments must be str")) != 0 ||
            (rc = need_str(r, line, y, "replace() arguments must be str")) != 0)
            return rc;
        if (c != NULL && c->kind != JV_NONE &&
            (rc = need_int(r, line, c, "replace() count must be an integer", &n)) != 0)
            return rc;
        return str_replace(r, line, &s, x, y, n, out);
    }
    if (IS("indent"))
        return indent_filter(r, line, &s, a, out);
    if (IS("wordcount")) {
        jv words;
        if ((rc = str_split(r, line, &s, NULL, -1, &words)) != 0)
            return rc;
        *out = jv_int((int64_t)words.u.list->n);
        return 0;
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
