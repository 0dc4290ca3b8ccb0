/* The evaluator: walks the syntax tree with a render's variables, writing text.
 *
 * Scopes follow jinja2: the template's top level is one scope, each for loop has one for all its
 * iterations (a `set` inside a loop does not leak out: namespaces exist for that), a macro call
 * has one whose parent is the top level, and if blocks share their parent's. Names resolve from
 * the innermost scope out, then to the builtin globals; an unknown name is undefined, which
 * prints as nothing and is false, but is an error as an operand, an object or a callee, as
 * jinja2's default Undefined is.
 *
 * Every statement and expression costs a step and every nested evaluation a level of depth, so
 * that JINJA_MAX_STEPS and JINJA_MAX_DEPTH bound the time and the stack of any render. */
#include "chat/jinja_internal.h"

#include "common/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What exec_body returns besides 0 and errors (< 0). */
#define FLOW_BREAK 1
#define FLOW_CONTINUE 2

struct jvar {
    const char *name;
    size_t len;
    jv v;
};

struct jframe {
    struct jframe *parent;
    struct jvar *vars;
    size_t n, cap;
};

static int nomem(struct jrender *r, int line)
{
    return jinja_fail(r, line, PAGODA_ERANGE,
                      "the template needed more than %u bytes of memory while rendering",
                      (unsigned)JINJA_MAX_RENDER_MEMORY);
}

static struct jframe *frame_new(struct jrender *r, struct jframe *parent)
{
    struct jframe *f = jinja_arena_alloc(&r->arena, sizeof(*f));
    if (f != NULL) {
        f->parent = parent;
        f->vars = NULL;
        f->n = f->cap = 0;
    }
    return f;
}

static int frame_set(struct jrender *r, struct jframe *f, const char *name, size_t len, jv v)
{
    for (size_t i = 0; i < f->n; i++)
        if (f->vars[i].len == len && memcmp(f->vars[i].name, name, len) == 0) {
            f->vars[i].v = v;
            return 0;
        }
    if (f->n == f->cap) {
        size_t cap = f->cap ? f->cap * 2 : 8;
        struct jvar *nv = jinja_arena_alloc(&r->arena, cap * sizeof(*nv));
        if (nv == NULL)
            return nomem(r, r->line);
        if (f->n)
            memcpy(nv, f->vars, f->n * sizeof(*nv));
        f->vars = nv;
        f->cap = cap;
    }
    f->vars[f->n].name = name;
    f->vars[f->n].len = len;
    f->vars[f->n].v = v;
    f->n++;
    return 0;
}

static jv lookup(struct jrender *r, struct jframe *f, const char *name, size_t len)
{
    for (; f != NULL; f = f->parent) {
        (void)jinja_step(r, f->n / 16);
        for (size_t i = 0; i < f->n; i++)
            if (f->vars[i].len == len && memcmp(f->vars[i].name, name, len) == 0)
                return f->vars[i].v;
    }
    jv g;
    if (jinja_global(name, len, &g))
        return g;
    return jv_undefined(name, len);
}

static int undefined_error(struct jrender *r, int line, const jv *v)
{
    if (v->u.s.len > 0)
        return jinja_fail(r, line, PAGODA_EFORMAT, "'%.*s' is undefined", (int)v->u.s.len,
                          v->u.s.p);
    return jinja_fail(r, line, PAGODA_EFORMAT, "a value is undefined");
}

static int enter(struct jrender *r, int line)
{
    if (++r->depth > JINJA_MAX_DEPTH)
        return jinja_fail(r, line, PAGODA_ERANGE, "evaluation nested deeper than %u",
                          JINJA_MAX_DEPTH);
    r->line = line;
    return jinja_step(r, 1);
}

static int out_text(struct jrender *r, int line, const char *p, size_t n)
{
    int rc = jbuf_append(r->out, p, n);
    if (rc == PAGODA_ERANGE)
        return jinja_fail(r, line, rc, "the output would exceed %u bytes",
                          (unsigned)JINJA_MAX_OUTPUT_BYTES);
    if (rc != 0)
        return jinja_fail(r, line, rc, "out of memory");
    return 0;
}

/* ---- arithmetic ---- */

static bool numeric(const jv *v)
{
    return v->kind == JV_INT || v->kind == JV_FLOAT || v->kind == JV_BOOL;
}

static double as_double(const jv *v)
{
    return v->kind == JV_FLOAT ? v->u.f : v->kind == JV_INT ? (double)v->u.i : (double)v->u.b;
}

static int64_t as_int(const jv *v)
{
    return v->kind == JV_INT ? v->u.i : (int64_t)v->u.b;
}

static const char *op_name(enum jop op)
{
    switch (op) {
    case JOP_ADD:
        return "+";
    case JOP_SUB:
        return "-";
    case JOP_MUL:
        return "*";
    case JOP_DIV:
        return "/";
    case JOP_FLOORDIV:
        return "//";
    case JOP_MOD:
        return "%";
    case JOP_POW:
        return "**";
    default:
        return "?";
    }
}

static int overflow(struct jrender *r, int line)
{
    return jinja_fail(r, line, PAGODA_ERANGE, "integer result out of 64-bit range");
}

static int repeat(struct jrender *r, int line, const jv *seq, int64_t times, jv *out)
{
    if (times < 0)
        times = 0;
    if (seq->kind == JV_STRING) {
        if (seq->u.s.len && (uint64_t)times > JINJA_MAX_OUTPUT_BYTES / seq->u.s.len)
            return jinja_fail(r, line, PAGODA_ERANGE, "a repeated string longer than %u bytes",
                              (unsigned)JINJA_MAX_OUTPUT_BYTES);
        size_t n = seq->u.s.len * (size_t)times;
        char *p = jinja_arena_alloc(&r->arena, n + 1);
        if (p == NULL)
            return nomem(r, line);
        for (int64_t k = 0; k < times; k++)
            memcpy(p + (size_t)k * seq->u.s.len, seq->u.s.p, seq->u.s.len);
        p[n] = '\0';
        *out = jv_str(p, n);
        return jinja_step(r, n / 64);
    }
    size_t len = seq->u.list->n;
    if (len && (uint64_t)times > JINJA_MAX_STEPS / len)
        return jinja_fail(r, line, PAGODA_ERANGE, "a repeated list too long");
    int rc = jv_new_list(r, len * (size_t)times, out);
    for (size_t k = 0; rc == 0 && k < (size_t)times; k++)
        memcpy(out->u.list->v + k * len, seq->u.list->v, len * sizeof(jv));
    return rc;
}

static int arith(struct jrender *r, int line, enum jop op, const jv *a, const jv *b, jv *out)
{
    if (a->kind == JV_UNDEFINED)
        return undefined_error(r, line, a);
    if (b->kind == JV_UNDEFINED)
        return undefined_error(r, line, b);
    if (numeric(a) && numeric(b)) {
        bool fl = a->kind == JV_FLOAT || b->kind == JV_FLOAT;
        if (!fl && op != JOP_DIV && op != JOP_POW) {
            int64_t x = as_int(a), y = as_int(b), z;
            switch (op) {
            case JOP_ADD:
                if (__builtin_add_overflow(x, y, &z))
                    return overflow(r, line);
                break;
            case JOP_SUB:
                if (__builtin_sub_overflow(x, y, &z))
                    return overflow(r, line);
                break;
            case JOP_MUL:
                if (__builtin_mul_overflow(x, y, &z))
                    return overflow(r, line);
                break;
            case JOP_FLOORDIV:
            case JOP_MOD:
                if (y == 0)
                    return jinja_fail(r, line, PAGODA_EFORMAT,
                                      "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1)
                    return overflow(r, line);
                z = op == JOP_FLOORDIV ? x / y : x % y;
                if ((x % y != 0) && ((x < 0) != (y < 0)))
                    z = op == JOP_FLOORDIV ? z - 1 : z + y;
                break;
            default:
                return jinja_fail(r, line, PAGODA_EINTERNAL, "bad operator");
            }
            *out = jv_int(z);
            return 0;
        }
        double x = as_double(a), y = as_double(b);
        if (op == JOP_POW && !fl) {
            int64_t base = as_int(a), e = as_int(b);
            if (e >= 0) {
                int64_t z = 1;
                for (int64_t k = 0; k < e; k++) {
                    if (__builtin_mul_overflow(z, base, &z))
                        return overflow(r, line);
                    if (z == 0 || z == 1 || (z == -1 && (e - k - 1) % 2 == 0))
                        break;
                }
                if (z == -1 && e % 2 == 1 && base == -1)
                    z = -1;
                *out = jv_int(z);
                return 0;
            }
            if (base == 0)
                return jinja_fail(r, line, PAGODA_EFORMAT,
                                  "0.0 cannot be raised to a negative power");
            *out = jv_float(pow(x, y));
            return 0;
        }
        double z;
        switch (op) {
        case JOP_ADD:
            z = x + y;
            break;
        case JOP_SUB:
            z = x - y;
            break;
        case JOP_MUL:
            z = x * y;
            break;
        case JOP_DIV:
        case JOP_FLOORDIV:
        case JOP_MOD:
            if (y == 0)
                return jinja_fail(r, line, PAGODA_EFORMAT, "division by zero");
            if (op == JOP_DIV) {
                z = x / y;
            } else if (op == JOP_FLOORDIV) {
                z = floor(x / y);
            } else {
                z = fmod(x, y);
                if (z != 0 && ((z < 0) != (y < 0)))
                    z += y;
            }
            break;
        case JOP_POW:
            z = pow(x, y);
            break;
        default:
            return jinja_fail(r, line, PAGODA_EINTERNAL, "bad operator");
        }
        *out = jv_float(z);
        return 0;
    }
    if (op == JOP_ADD && a->kind == JV_STRING && b->kind == JV_STRING) {
        size_t n = a->u.s.len + b->u.s.len;
        char *p = jinja_arena_alloc(&r->arena, n + 1);
        if (p == NULL)
            return nomem(r, line);
        memcpy(p, a->u.s.p, a->u.s.len);
        memcpy(p + a->u.s.len, b->u.s.p, b->u.s.len);
        p[n] = '\0';
        *out = jv_str(p, n);
        return jinja_step(r, n / 64);
    }
    if (op == JOP_ADD && a->kind == JV_LIST && b->kind == JV_LIST) {
        size_t n = a->u.list->n, m = b->u.list->n;
        int rc = jv_new_list(r, n + m, out);
        if (rc != 0)
            return rc;
        memcpy(out->u.list->v, a->u.list->v, n * sizeof(jv));
        memcpy(out->u.list->v + n, b->u.list->v, m * sizeof(jv));
        return 0;
    }
    if (op == JOP_MUL && (a->kind == JV_STRING || a->kind == JV_LIST) &&
        (b->kind == JV_INT || b->kind == JV_BOOL))
        return repeat(r, line, a, as_int(b), out);
    if (op == JOP_MUL && (b->kind == JV_STRING || b->kind == JV_LIST) &&
        (a->kind == JV_INT || a->kind == JV_BOOL))
        return repeat(r, line, b, as_int(a), out);
    return jinja_fail(r, line, PAGODA_EFORMAT, "unsupported operand type(s) for %s: '%s' and '%s'",
                      op_name(op), jv_type_name(a), jv_type_name(b));
}

static int contains(struct jrender *r, int line, const jv *needle, const jv *hay, bool *out)
{
    switch (hay->kind) {
    case JV_UNDEFINED:
        *out = false;
        return 0;
    case JV_STRING:
        if (needle->kind != JV_STRING)
            return jinja_fail(r, line, PAGODA_EFORMAT,
                              "'in <string>' requires string as left operand, not %s",
                              jv_type_name(needle));
        if (needle->u.s.len == 0) {
            *out = true;
            return 0;
        }
        /* glibc's memmem is linear (two-way) in both, whatever the needle */
        *out = memmem(hay->u.s.p, hay->u.s.len, needle->u.s.p, needle->u.s.len) != NULL;
        return jinja_work(r, hay->u.s.len + needle->u.s.len);
    case JV_LIST:
        /* each item compared is charged by jv_equal */
        *out = false;
        for (size_t i = 0; i < hay->u.list->n && !*out; i++) {
            int rc = jv_equal(r, needle, &hay->u.list->v[i], out);
            if (rc != 0)
                return rc;
        }
        return 0;
    case JV_DICT:
    case JV_NAMESPACE:
        *out = needle->kind == JV_STRING &&
               jv_dict_get(r, hay, needle->u.s.p, needle->u.s.len) != NULL;
        return 0;
    default:
        return jinja_fail(r, line, PAGODA_EFORMAT, "argument of type '%s' is not iterable",
                          jv_type_name(hay));
    }
}

static int binary(struct jrender *r, struct jframe *f, const struct jnode *n, jv *out)
{
    jv a, b;
    int rc = jinja_eval(r, f, n->a, &a);
    if (rc != 0)
        return rc;
    if (n->op == JOP_AND || n->op == JOP_OR) {
        bool t = jv_truthy(&a);
        if ((n->op == JOP_AND) != t) {
            *out = a;
            return 0;
        }
        return jinja_eval(r, f, n->b, out);
    }
    if ((rc = jinja_eval(r, f, n->b, &b)) != 0)
        return rc;
    int cmp = 0;
    bool in = false;
    switch (n->op) {
    case JOP_EQ:
    case JOP_NE: {
        bool eq;
        if ((rc = jv_equal(r, &a, &b, &eq)) != 0)
            return rc;
        *out = jv_bool(n->op == JOP_EQ ? eq : !eq);
        return 0;
    }
    case JOP_LT:
    case JOP_LE:
    case JOP_GT:
    case JOP_GE:
        if (a.kind == JV_UNDEFINED)
            return undefined_error(r, n->line, &a);
        if (b.kind == JV_UNDEFINED)
            return undefined_error(r, n->line, &b);
        if ((rc = jv_compare(r, n->line, &a, &b, true, &cmp)) != 0)
            return rc;
        *out = jv_bool(n->op == JOP_LT   ? cmp < 0
                       : n->op == JOP_LE ? cmp <= 0
                       : n->op == JOP_GT ? cmp > 0
                                         : cmp >= 0);
        return 0;
    case JOP_IN:
    case JOP_NOTIN:
        if ((rc = contains(r, n->line, &a, &b, &in)) != 0)
            return rc;
        *out = jv_bool(n->op == JOP_IN ? in : !in);
        return 0;
    case JOP_TILDE: {
        struct jbuf buf = {0};
        if ((rc = jv_append_str(r, &buf, &a)) != 0 || (rc = jv_append_str(r, &buf, &b)) != 0) {
            free(buf.p);
            return rc;
        }
        return jv_from_jbuf(r, &buf, out);
    }
    default:
        return arith(r, n->line, n->op, &a, &b, out);
    }
}

/* ---- calls ---- */

struct evaluated_args {
    jv *pos;
    size_t npos;
    const struct jnode **kwname;
    jv *kw;
    size_t nkw;
};

static int eval_args(struct jrender *r, struct jframe *f, const struct jnode_list *args,
                     struct jargs *out)
{
    jv *vals = jinja_arena_alloc(&r->arena, (args->n ? args->n : 1) * sizeof(jv));
    const struct jnode **names =
        jinja_arena_alloc(&r->arena, (args->n ? args->n : 1) * sizeof(*names));
    if (vals == NULL || names == NULL)
        return nomem(r, r->line);
    size_t npos = 0, nkw = 0;
    for (size_t i = 0; i < args->n; i++)
        if (args->v[i]->kind != JN_KWARG)
            npos++;
    for (size_t i = 0, p = 0, k = npos; i < args->n; i++) {
        const struct jnode *a = args->v[i];
        int rc;
        if (a->kind == JN_KWARG) {
            names[nkw++] = a;
            rc = jinja_eval(r, f, a->a, &vals[k++]);
        } else {
            rc = jinja_eval(r, f, a, &vals[p++]);
        }
        if (rc != 0)
            return rc;
    }
    out->pos = vals;
    out->npos = npos;
    out->kwname = names;
    out->kw = vals + npos;
    out->nkw = nkw;
    return 0;
}

static int exec_body(struct jrender *r, struct jframe *f, const struct jnode_list *body);

int jinja_call_macro(struct jrender *r, const struct jnode *m, int line, const jv *args,
                     size_t npos, const struct jnode *const *kwnames, const jv *kwvals, size_t nkw,
                     jv *out)
{
    if (npos > m->args.n)
        return jinja_fail(r, line, PAGODA_EFORMAT,
                          "macro '%.*s' takes not more than %zu argument(s)", (int)m->len, m->str,
                          m->args.n);
    struct jframe *f = frame_new(r, r->globals);
    if (f == NULL)
        return nomem(r, line);
    int rc;
    bool *given = jinja_arena_alloc(&r->arena, m->args.n + 1);
    if (given == NULL)
        return nomem(r, line);
    memset(given, 0, m->args.n + 1);
    for (size_t i = 0; i < npos; i++) {
        given[i] = true;
        if ((rc = frame_set(r, f, m->args.v[i]->str, m->args.v[i]->len, args[i])) != 0)
            return rc;
    }
    for (size_t k = 0; k < nkw; k++) {
        size_t i;
        for (i = 0; i < m->args.n; i++)
            if (m->args.v[i]->len == kwnames[k]->len &&
                memcmp(m->args.v[i]->str, kwnames[k]->str, kwnames[k]->len) == 0)
                break;
        if (i == m->args.n)
            return jinja_fail(r, line, PAGODA_EFORMAT,
                              "macro '%.*s' takes no keyword argument '%.*s'", (int)m->len, m->str,
                              (int)kwnames[k]->len, kwnames[k]->str);
        if (given[i])
            return jinja_fail(r, line, PAGODA_EFORMAT,
                              "macro '%.*s' got multiple values for argument '%.*s'", (int)m->len,
                              m->str, (int)kwnames[k]->len, kwnames[k]->str);
        given[i] = true;
        if ((rc = frame_set(r, f, m->args.v[i]->str, m->args.v[i]->len, kwvals[k])) != 0)
            return rc;
    }
    for (size_t i = 0; i < m->args.n; i++) {
        if (given[i])
            continue;
        const struct jnode *p = m->args.v[i];
        jv v = jv_undefined(p->str, p->len);
        if (p->kind == JN_KWARG && (rc = jinja_eval(r, f, p->a, &v)) != 0)
            return rc;
        if ((rc = frame_set(r, f, p->str, p->len, v)) != 0)
            return rc;
    }
    struct jbuf buf = {0};
    struct jbuf *saved = r->out;
    r->out = &buf;
    rc = exec_body(r, f, &m->body);
    r->out = saved;
    if (rc < 0) {
        free(buf.p);
        return rc;
    }
    return jv_from_jbuf(r, &buf, out);
}

static int call(struct jrender *r, struct jframe *f, const struct jnode *n, jv *out)
{
    jv callee;
    int rc = jinja_eval(r, f, n->a, &callee);
    if (rc != 0)
        return rc;
    struct jargs args;
    if ((rc = eval_args(r, f, &n->args, &args)) != 0)
        return rc;
    switch (callee.kind) {
    case JV_MACRO:
        return jinja_call_macro(r, callee.u.macro, n->line, args.pos, args.npos, args.kwname,
                                args.kw, args.nkw, out);
    case JV_FUNC:
        return jinja_call_func(r, n->line, callee.u.fn, &args, out);
    case JV_UNDEFINED:
        return undefined_error(r, n->line, &callee);
    default:
        return jinja_fail(r, n->line, PAGODA_EFORMAT, "'%s' object is not callable",
                          jv_type_name(&callee));
    }
}

/* Python's slice of a list or a string (by code points). */
static int slice(struct jrender *r, struct jframe *f, const struct jnode *n, jv *out)
{
    jv obj;
    int rc = jinja_eval(r, f, n->a, &obj);
    if (rc != 0)
        return rc;
    int64_t part[3];
    bool given[3];
    for (int k = 0; k < 3; k++) {
        given[k] = false;
        if (n->args.v[k] == NULL)
            continue;
        jv v;
        if ((rc = jinja_eval(r, f, n->args.v[k], &v)) != 0)
            return rc;
        if (v.kind == JV_NONE)
            continue;
        if (v.kind != JV_INT && v.kind != JV_BOOL)
            return jinja_fail(r, n->line, PAGODA_EFORMAT,
                              "slice indices must be integers or None, not %s", jv_type_name(&v));
        part[k] = as_int(&v);
        given[k] = true;
    }
    int64_t step = given[2] ? part[2] : 1;
    if (step == 0)
        return jinja_fail(r, n->line, PAGODA_EFORMAT, "slice step cannot be zero");
    if (obj.kind == JV_UNDEFINED)
        return undefined_error(r, n->line, &obj);
    /* the items: a list's, or a string's code points (offsets) */
    size_t len;
    size_t *offs = NULL;
    if (obj.kind == JV_LIST) {
        len = obj.u.list->n;
    } else if (obj.kind == JV_STRING) {
        offs = jinja_arena_alloc(&r->arena, (obj.u.s.len + 1) * sizeof(size_t));
        if (offs == NULL)
            return nomem(r, n->line);
        len = 0;
        for (size_t i = 0; i < obj.u.s.len;) {
            uint32_t cp;
            offs[len++] = i;
            i += jinja_u8_next(obj.u.s.p + i, obj.u.s.len - i, &cp);
        }
        offs[len] = obj.u.s.len;
    } else {
        return jinja_fail(r, n->line, PAGODA_EFORMAT, "'%s' object is not subscriptable",
                          jv_type_name(&obj));
    }
    if ((rc = jinja_step(r, len / 16)) != 0)
        return rc;
    int64_t L = (int64_t)len, start, stop;
    if (step > 0) {
        start = given[0] ? part[0] : 0;
        stop = given[1] ? part[1] : L;
        if (start < 0)
            start = start + L < 0 ? 0 : start + L;
        if (start > L)
            start = L;
        if (stop < 0)
            stop = stop + L < 0 ? 0 : stop + L;
        if (stop > L)
            stop = L;
    } else {
        start = given[0] ? part[0] : L - 1;
        stop = given[1] ? part[1] : -1 - L;
        if (start < 0)
            start = start + L < 0 ? -1 : start + L;
        if (start >= L)
            start = L - 1;
        if (stop < 0)
            stop = stop + L < -1 ? -1 : stop + L;
        if (stop >= L)
            stop = L - 1;
    }
    size_t count = 0;
    if (step > 0 && stop > start)
        count = (size_t)((stop - start + step - 1) / step);
    else if (step < 0 && start > stop)
        count = (size_t)((start - stop + (-step) - 1) / (-step));
    if (obj.kind == JV_LIST) {
        if ((rc = jv_new_list(r, count, out)) != 0)
            return rc;
        for (size_t k = 0; k < count; k++)
            out->u.list->v[k] = obj.u.list->v[start + (int64_t)k * step];
        return 0;
    }
    char *p = jinja_arena_alloc(&r->arena, obj.u.s.len + 1);
    if (p == NULL)
        return nomem(r, n->line);
    size_t o = 0;
    for (size_t k = 0; k < count; k++) {
        int64_t i = start + (int64_t)k * step;
        size_t cl = offs[i + 1] - offs[i];
        memcpy(p + o, obj.u.s.p + offs[i], cl);
        o += cl;
    }
    p[o] = '\0';
    *out = jv_str(p, o);
    return 0;
}

int jinja_eval(struct jrender *r, struct jframe *f, const struct jnode *n, jv *out)
{
    int rc = enter(r, n->line);
    if (rc != 0)
        return rc;
    jv a, b;
    switch (n->kind) {
    case JN_LITERAL:
        *out = n->lit;
        break;
    case JN_NAME:
        *out = lookup(r, f, n->str, n->len);
        break;
    case JN_LIST:
    case JN_TUPLE:
        if ((rc = jv_new_list(r, n->args.n, out)) != 0)
            break;
        out->u.list->tuple = n->kind == JN_TUPLE;
        for (size_t i = 0; i < n->args.n && rc == 0; i++)
            rc = jinja_eval(r, f, n->args.v[i], &out->u.list->v[i]);
        break;
    case JN_DICT:
        if ((rc = jv_new_dict(r, n->args.n / 2, JV_DICT, out)) != 0)
            break;
        for (size_t i = 0; i + 1 < n->args.n && rc == 0; i += 2) {
            if ((rc = jinja_eval(r, f, n->args.v[i], &a)) != 0 ||
                (rc = jinja_eval(r, f, n->args.v[i + 1], &b)) != 0)
                break;
            if (a.kind != JV_STRING) {
                rc = jinja_fail(r, n->line, PAGODA_EFORMAT, "dict keys must be strings, not %s",
                                jv_type_name(&a));
                break;
            }
            rc = jv_dict_set(r, out, a.u.s.p, a.u.s.len, b);
        }
        break;
    case JN_ATTR:
        if ((rc = jinja_eval(r, f, n->a, &a)) != 0)
            break;
        if (a.kind == JV_UNDEFINED) {
            rc = undefined_error(r, n->line, &a);
            break;
        }
        rc = jinja_getattr(r, n->line, &a, n->str, n->len, out);
        break;
    case JN_ITEM:
        if ((rc = jinja_eval(r, f, n->a, &a)) != 0 || (rc = jinja_eval(r, f, n->b, &b)) != 0)
            break;
        if (a.kind == JV_UNDEFINED) {
            rc = undefined_error(r, n->line, &a);
            break;
        }
        rc = jinja_getitem(r, n->line, &a, &b, out);
        break;
    case JN_SLICE:
        rc = slice(r, f, n, out);
        break;
    case JN_CALL:
        rc = call(r, f, n, out);
        break;
    case JN_FILTER: {
        struct jargs args;
        if ((rc = jinja_eval(r, f, n->a, &a)) != 0 || (rc = eval_args(r, f, &n->args, &args)) != 0)
            break;
        rc = jinja_filter(r, f, n->line, n->str, n->len, &a, &args, out);
        break;
    }
    case JN_TEST: {
        struct jargs args;
        bool t;
        if ((rc = jinja_eval(r, f, n->a, &a)) != 0 ||
            (rc = eval_args(r, f, &n->args, &args)) != 0 ||
            (rc = jinja_test(r, n->line, n->str, n->len, &a, &args, &t)) != 0)
            break;
        *out = jv_bool(n->op == JOP_NOT ? !t : t);
        break;
    }
    case JN_UNARY:
        if ((rc = jinja_eval(r, f, n->a, &a)) != 0)
            break;
        if (n->op == JOP_NOT) {
            *out = jv_bool(!jv_truthy(&a));
        } else if (a.kind == JV_FLOAT) {
            *out = jv_float(n->op == JOP_SUB ? -a.u.f : a.u.f);
        } else if (a.kind == JV_INT || a.kind == JV_BOOL) {
            int64_t i = as_int(&a);
            if (n->op == JOP_SUB && i == INT64_MIN)
                rc = overflow(r, n->line);
            else
                *out = jv_int(n->op == JOP_SUB ? -i : i);
        } else if (a.kind == JV_UNDEFINED) {
            rc = undefined_error(r, n->line, &a);
        } else {
            rc = jinja_fail(r, n->line, PAGODA_EFORMAT, "bad operand type for unary %s: '%s'",
                            n->op == JOP_SUB ? "-" : "+", jv_type_name(&a));
        }
        break;
    case JN_BINARY:
        rc = binary(r, f, n, out);
        break;
    case JN_COND:
        if ((rc = jinja_eval(r, f, n->b, &a)) != 0)
            break;
        if (jv_truthy(&a))
            rc = jinja_eval(r, f, n->a, out);
        else if (n->c != NULL)
            rc = jinja_eval(r, f, n->c, out);
        else
            *out = jv_undefined("", 0);
        break;
    default:
        rc = jinja_fail(r, n->line, PAGODA_EINTERNAL, "not an expression");
        break;
    }
    r->depth--;
    return rc;
}

/* ---- statements ---- */

static int assign(struct jrender *r, struct jframe *f, const struct jnode *target, jv v, int line)
{
    if (target->kind == JN_NAME)
        return frame_set(r, f, target->str, target->len, v);
    if (target->kind == JN_ATTR) {
        jv ns = lookup(r, f, target->a->str, target->a->len);
        if (ns.kind != JV_NAMESPACE)
            return jinja_fail(r, line, PAGODA_EFORMAT,
                              "cannot assign attribute on non-namespace object '%.*s'",
                              (int)target->a->len, target->a->str);
        return jv_dict_set(r, &ns, target->str, target->len, v);
    }
    /* a tuple of names */
    const jv *items;
    size_t n;
    int rc;
    if (v.kind == JV_UNDEFINED)
        return undefined_error(r, line, &v);
    if ((rc = jinja_iterate(r, line, &v, &items, &n)) != 0)
        return rc;
    if (n != target->args.n)
        return jinja_fail(r, line, PAGODA_EFORMAT, "cannot unpack %zu values into %zu names", n,
                          target->args.n);
    for (size_t i = 0; i < n; i++)
        if ((rc = frame_set(r, f, target->args.v[i]->str, target->args.v[i]->len, items[i])) != 0)
            return rc;
    return 0;
}

static int exec_for(struct jrender *r, struct jframe *f, const struct jnode *n)
{
    jv seq;
    int rc = jinja_eval(r, f, n->b, &seq);
    if (rc != 0)
        return rc;
    const jv *items;
    size_t count;
    if ((rc = jinja_iterate(r, n->line, &seq, &items, &count)) != 0)
        return rc;
    struct jframe *lf = frame_new(r, f);
    struct jloop *loop = jinja_arena_alloc(&r->arena, sizeof(*loop));
    if (lf == NULL || loop == NULL)
        return nomem(r, n->line);
    if (n->c != NULL) {
        /* the loop filter runs first: loop.length and friends count what it keeps */
        jv *kept = jinja_arena_alloc(&r->arena, (count ? count : 1) * sizeof(jv));
        if (kept == NULL)
            return nomem(r, n->line);
        size_t k = 0;
        for (size_t i = 0; i < count; i++) {
            jv t;
            if ((rc = assign(r, lf, n->a, items[i], n->line)) != 0 ||
                (rc = jinja_eval(r, lf, n->c, &t)) != 0)
                return rc;
            if (jv_truthy(&t))
                kept[k++] = items[i];
        }
        items = kept;
        count = k;
    }
    loop->items = items;
    loop->n = count;
    jv lv = {.kind = JV_LOOP};
    lv.u.loop = loop;
    if ((rc = frame_set(r, lf, "loop", 4, lv)) != 0)
        return rc;
    for (size_t i = 0; i < count; i++) {
        loop->index0 = i;
        /* an iteration costs a step even with an empty body */
        if ((rc = jinja_step(r, 1)) != 0 || (rc = assign(r, lf, n->a, items[i], n->line)) != 0)
            return rc;
        rc = exec_body(r, lf, &n->body);
        if (rc == FLOW_BREAK)
            break;
        if (rc < 0)
            return rc;
    }
    if (count == 0)
        return exec_body(r, lf, &n->orelse);
    return 0;
}

static int exec_stmt(struct jrender *r, struct jframe *f, const struct jnode *n)
{
    jv v;
    int rc;
    switch (n->kind) {
    case JN_TEXT:
        return out_text(r, n->line, n->str, n->len);
    case JN_OUTPUT:
        if ((rc = jinja_eval(r, f, n->a, &v)) != 0)
            return rc;
        r->line = n->line;
        return jv_append_str(r, r->out, &v);
    case JN_IF:
        if ((rc = jinja_eval(r, f, n->a, &v)) != 0)
            return rc;
        return exec_body(r, f, jv_truthy(&v) ? &n->body : &n->orelse);
    case JN_FOR:
        return exec_for(r, f, n);
    case JN_SET:
        if (n->b != NULL) {
            if ((rc = jinja_eval(r, f, n->b, &v)) != 0)
                return rc;
        } else {
            struct jbuf buf = {0};
            struct jbuf *saved = r->out;
            r->out = &buf;
            rc = exec_body(r, f, &n->body);
            r->out = saved;
            if (rc != 0) {
                free(buf.p);
                return rc < 0 ? rc
                              : jinja_fail(r, n->line, PAGODA_EINVAL,
                                           "break or continue inside a block set");
            }
            if ((rc = jv_from_jbuf(r, &buf, &v)) != 0)
                return rc;
        }
        return assign(r, f, n->a, v, n->line);
    case JN_MACRO:
        v.kind = JV_MACRO;
        v.u.macro = n;
        return frame_set(r, f, n->str, n->len, v);
    case JN_BREAK:
        return FLOW_BREAK;
    case JN_CONTINUE:
        return FLOW_CONTINUE;
    default:
        return jinja_fail(r, n->line, PAGODA_EINTERNAL, "not a statement");
    }
}

static int exec_body(struct jrender *r, struct jframe *f, const struct jnode_list *body)
{
    for (size_t i = 0; i < body->n; i++) {
        const struct jnode *n = body->v[i];
        int rc = enter(r, n->line);
        if (rc == 0)
            rc = exec_stmt(r, f, n);
        r->depth--;
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* ---- the public face ---- */

struct JinjaTemplate {
    struct jinja_arena arena;
    struct jnode_list body;
};

int jinja_template_new(const char *source, size_t len, JinjaTemplate **out)
{
    *out = NULL;
    if (source == NULL && len > 0)
        return pagoda_error_set(PAGODA_EINVAL, "jinja_template_new: no source");
    if (len > JINJA_MAX_SOURCE_BYTES)
        return pagoda_error_set(PAGODA_ERANGE, "template of %zu bytes, more than the %u allowed",
                                len, JINJA_MAX_SOURCE_BYTES);
    JinjaTemplate *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory compiling a template");
    jinja_arena_init(&t->arena, JINJA_MAX_COMPILE_MEMORY);
    /* the tree points into the source (text, names): a copy lives as long as the template */
    char *copy = jinja_arena_alloc(&t->arena, len + 1);
    if (copy == NULL) {
        jinja_template_free(t);
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory compiling a template");
    }
    if (len)
        memcpy(copy, source, len);
    copy[len] = '\0';
    struct jtoken *toks;
    size_t count;
    int rc = jinja_lex(&t->arena, copy, len, &toks, &count);
    if (rc == 0)
        rc = jinja_parse(&t->arena, toks, count, &t->body);
    if (rc != 0) {
        jinja_template_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

void jinja_template_free(JinjaTemplate *tpl)
{
    if (tpl == NULL)
        return;
    jinja_arena_fini(&tpl->arena);
    free(tpl);
}

int jinja_render(const JinjaTemplate *tpl, const json_t *vars, char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (tpl == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "jinja_render: no template");
    if (vars != NULL && !json_is_object(vars))
        return pagoda_error_set(PAGODA_EINVAL, "jinja_render: the variables must be a JSON object");
    struct jrender r = {.line = 0};
    jinja_arena_init(&r.arena, JINJA_MAX_RENDER_MEMORY);
    struct jbuf buf = {0};
    r.out = &buf;
    int rc = 0;
    r.globals = frame_new(&r, NULL);
    if (r.globals == NULL)
        rc = nomem(&r, 0);
    if (rc == 0 && vars != NULL) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)vars, key, val)
        {
            jv v;
            if ((rc = jv_from_json(&r, val, 0, &v)) != 0 ||
                (rc = frame_set(&r, r.globals, key, strlen(key), v)) != 0)
                break;
        }
    }
    if (rc == 0)
        rc = exec_body(&r, r.globals, &tpl->body);
    jinja_arena_fini(&r.arena);
    if (rc > 0) /* break/continue cannot reach the top: the parser refuses them there */
        rc = pagoda_error_set(PAGODA_EINTERNAL, "loop control outside a loop");
    if (rc != 0) {
        free(buf.p);
        return rc;
    }
    if (buf.p == NULL && (rc = jbuf_append(&buf, "", 0)) == 0) {
        buf.p = malloc(1);
        if (buf.p == NULL)
            return pagoda_error_set(PAGODA_ENOMEM, "out of memory rendering a template");
        buf.p[0] = '\0';
    }
    *out = buf.p;
    *out_len = buf.len;
    return 0;
}
