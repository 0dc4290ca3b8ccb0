/* Builtins: attribute and item access (jinja2's getattr and getitem), iteration, the methods of
 * str and dict, the tests, and the globals (range, namespace, raise_exception, strftime_now),
 * each as jinja2 and Python define them. An unknown test is an error naming it, never skipped.
 * The filters are in jinja_filters.c, the string operations both use in jinja_strings.c. */
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

int jinja_type_error(struct jrender *r, int line, const char *what, const jv *v)
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
        return jinja_type_error(r, line, "the value iterated must be a list, dict or string", v);
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

static int loop_attr(const struct jloop *l, const char *name, size_t len, jv *out)
{
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
        return loop_attr(obj->u.loop, name, len, out);
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

/* ---- globals and methods ---- */

int jinja_need_str(struct jrender *r, int line, const jv *v, const char *what)
{
    if (v == NULL)
        return jinja_fail(r, line, PAGODA_EFORMAT, "%s: missing argument", what);
    if (v->kind != JV_STRING)
        return jinja_type_error(r, line, what, v);
    return 0;
}

int jinja_need_int(struct jrender *r, int line, const jv *v, const char *what, int64_t *out)
{
    *out = 0;
    if (v->kind != JV_INT && v->kind != JV_BOOL)
        return jinja_type_error(r, line, what, v);
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
        if ((rc = jinja_need_int(r, line, &a->pos[i], "range() takes integers", &x[i])) != 0)
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
                return jinja_type_error(r, line, "namespace() takes a dict", &a->pos[0]);
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
        if ((rc = jinja_need_str(r, line, x, "strftime_now() takes a format string")) != 0)
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
            return jinja_type_error(r, line, "strip arg must be None or str", x);
        return jinja_str_strip(r, line, self, x && x->kind == JV_STRING ? x : NULL,
                               fn->id != JF_STR_RSTRIP, fn->id != JF_STR_LSTRIP, out);
    case JF_STR_SPLIT: {
        const jv *ms = jinja_arg(a, 1, "maxsplit");
        if (ms != NULL &&
            (rc = jinja_need_int(r, line, ms, "maxsplit must be an integer", &count)) != 0)
            return rc;
        return jinja_str_split(r, line, self, jinja_arg(a, 0, "sep"), count, out);
    }
    case JF_STR_STARTSWITH:
    case JF_STR_ENDSWITH:
        return jinja_str_affix(r, line, self, x, fn->id == JF_STR_STARTSWITH, out);
    case JF_STR_UPPER:
        return jinja_str_case(r, line, self, JCASE_UPPER, out);
    case JF_STR_LOWER:
        return jinja_str_case(r, line, self, JCASE_LOWER, out);
    case JF_STR_TITLE:
        return jinja_str_case(r, line, self, JCASE_TITLE, out);
    case JF_STR_CAPITALIZE:
        return jinja_str_case(r, line, self, JCASE_CAPITALIZE, out);
    case JF_STR_REPLACE: {
        const jv *c = jinja_arg(a, 2, "count");
        if ((rc = jinja_need_str(r, line, x, "replace() arguments must be str")) != 0 ||
            (rc = jinja_need_str(r, line, y, "replace() arguments must be str")) != 0)
            return rc;
        if (c != NULL &&
            (rc = jinja_need_int(r, line, c, "replace() count must be an integer", &count)) != 0)
            return rc;
        return jinja_str_replace(r, line, self, x, y, count, out);
    }
    case JF_STR_FIND:
    case JF_STR_COUNT: {
        if ((rc = jinja_need_str(r, line, x, "find()/count() take a str")) != 0)
            return rc;
        const char *hit = jinja_str_find(self->u.s.p, self->u.s.len, x->u.s.p, x->u.s.len);
        /* memmem reads the needle and the haystack up to the hit; the offset in code points
         * reads the string up to it again */
        if ((rc = jinja_work(r, self->u.s.len + x->u.s.len)) != 0)
            return rc;
        if (fn->id == JF_STR_FIND) {
            if (hit == NULL) {
                *out = jv_int(-1);
                return 0;
            }
            int64_t cps = 0;
            for (const char *q = self->u.s.p; q < hit; q++)
                cps += ((unsigned char)*q & 0xC0) != 0x80;
            *out = jv_int(cps);
            return jinja_work(r, (uint64_t)(hit - self->u.s.p));
        }
        int64_t n = 0;
        if (x->u.s.len == 0) {
            for (size_t i = 0; i < self->u.s.len; i++)
                n += ((unsigned char)self->u.s.p[i] & 0xC0) != 0x80;
            n++;
        } else {
            const char *p = self->u.s.p, *end = p + self->u.s.len;
            while ((hit = jinja_str_find(p, (size_t)(end - p), x->u.s.p, x->u.s.len)) != NULL) {
                n++;
                p = hit + x->u.s.len;
            }
        }
        *out = jv_int(n);
        /* the string once more, and the needle read again by each memmem after a hit */
        return jinja_work(r, self->u.s.len + x->u.s.len * (uint64_t)n);
    }
    case JF_STR_JOIN:
        if (x == NULL)
            return jinja_fail(r, line, PAGODA_EFORMAT, "jinja_join() takes exactly one argument");
        return jinja_join(r, line, x, self, NULL, out);
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
                pair.u.list->tuple = true; /* dict.items() yields tuples */
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
    else if (IS("number")) /* Python's bool is a Number; jinja2's integer test leaves it out */
        *out = k == JV_INT || k == JV_FLOAT || k == JV_BOOL;
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
        if ((rc = jinja_str_case(r, line, v, IS("lower") ? JCASE_LOWER : JCASE_UPPER, &conv)) != 0)
            return rc;
        return jv_equal(r, &conv, v, out);
    } else if (IS("odd") || IS("even") || IS("divisibleby")) {
        int64_t i, d = IS("divisibleby") ? 0 : 2;
        if ((rc = jinja_need_int(r, line, v, "odd/even/divisibleby test an integer", &i)) != 0)
            return rc;
        if (d == 0) {
            if (x == NULL ||
                (rc = jinja_need_int(r, line, x, "divisibleby takes an integer", &d)) != 0)
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
        if ((rc = jv_equal(r, v, x, out)) != 0)
            return rc;
        if (IS("ne") || IS("!="))
            *out = !*out;
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
            *out = jinja_str_find(x->u.s.p, x->u.s.len, v->u.s.p, v->u.s.len) != NULL;
            return jinja_work(r, x->u.s.len + v->u.s.len);
        }
        if (x->kind == JV_DICT) {
            *out = v->kind == JV_STRING && jv_dict_get(r, x, v->u.s.p, v->u.s.len) != NULL;
            return 0;
        }
        if ((rc = jinja_iterate(r, line, x, &items, &n)) != 0)
            return rc;
        *out = false;
        for (size_t i = 0; i < n && !*out; i++)
            if ((rc = jv_equal(r, v, &items[i], out)) != 0)
                return rc;
    } else {
        return jinja_fail(r, line, PAGODA_EINVAL, "unknown test '%.*s'", (int)len, name);
    }
#undef IS
    return 0;
}
