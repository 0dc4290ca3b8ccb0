/* The Jinja parser: tokens to a syntax tree, with jinja2's grammar and operator precedence
 * (loosest first):
 *
 *   a if b else c  >  or  >  and  >  not  >  comparisons, in, not in  >  + -  >  ~  >
 *   * / // %  >  **  >  unary - +  >  postfix (.attr [item] (call)) and then | filter, is test
 *
 * so `a + b | trim` trims b only, `-x | abs` is abs(-x), and `x is defined and y` tests x.
 * Statements: if/elif/else, for (with an `if` filter and else), set (a name, names, ns.attr, or
 * a captured block), macro, break, continue; the transformers-only generation tags are accepted
 * and ignored. Anything else is refused with the line it is on: PAGODA_EUNSUPPORTED where jinja2
 * would take it (one of its tags, filters or tests that this interpreter lacks, a recursive loop,
 * *args), PAGODA_EINVAL where jinja2 refuses it too (a syntax error, a name no Jinja knows), so
 * that a model's template that is not Jinja at all can be told from one beyond this subset
 * (text/text_model.h fails the model's start on the first only). */
#include "chat/jinja_internal.h"

#include "common/error.h"

#include <stdio.h>
#include <string.h>

struct parser {
    struct jinja_arena *a;
    const struct jtoken *t;
    size_t n, i;
    unsigned depth;
    unsigned loops; /* for loops around the statement being parsed (break, continue) */
    /* jinja2 compiles a filter or test name it does not know inside an if's condition or body
     * or a conditional expression (its "soft frames", left again by a for's or a macro's body
     * and a block set), failing only if it runs; elsewhere it refuses the template. Both are
     * refused here, at the end of the parse: hard (PAGODA_EINVAL) when any such name stood where
     * jinja2 refuses it, else soft (PAGODA_EUNSUPPORTED). */
    unsigned soft;                         /* inside a soft frame when > 0 */
    unsigned hard;                         /* unknown names outside soft frames */
    char first_hard[160], first_soft[160]; /* the first of each, "line N: ..." ("" for none) */
};

static int fail_at(const struct jtoken *t, const char *fmt, const char *arg)
{
    return pagoda_error_set(PAGODA_EINVAL, "line %d: %s%s", t->line, fmt, arg ? arg : "");
}

/* Valid jinja2 that this interpreter does not implement (see the file's comment). */
static int unsupported_at(const struct jtoken *t, const char *what)
{
    return pagoda_error_set(PAGODA_EUNSUPPORTED, "line %d: %s", t->line, what);
}

/* jinja2's own statement tags, filters and tests that this interpreter lacks: the names jinja2
 * 3.1 compiles (jinja2.defaults, its Parser's statement keywords) less the ones implemented
 * here. A name in neither is refused by jinja2 at compile time too. */
static const char *const JINJA2_ONLY_TAGS[] = {"autoescape", "block", "call",   "extends",
                                               "filter",     "from",  "import", "include",
                                               "print",      "with",  NULL};
static const char *const JINJA2_ONLY_FILTERS[] = {
    "attr",  "batch",     "center",   "filesizeformat", "format", "groupby",  "pprint",  "random",
    "slice", "striptags", "truncate", "urlencode",      "urlize", "wordwrap", "xmlattr", NULL};
static const char *const JINJA2_ONLY_TESTS[] = {"escaped",  "filter", "greaterthan",
                                                "lessthan", "test",   NULL};

static bool in_list(const char *const *names, const char *s, size_t len)
{
    for (size_t k = 0; names[k] != NULL; k++)
        if (strlen(names[k]) == len && memcmp(names[k], s, len) == 0)
            return true;
    return false;
}

static int oom(const struct parser *p)
{
    return pagoda_error_set(PAGODA_ERANGE, "line %d: template too large to compile",
                            p->t[p->i].line);
}

static const struct jtoken *peek(const struct parser *p)
{
    return &p->t[p->i];
}

static const struct jtoken *peek2(const struct parser *p)
{
    return p->i + 1 < p->n ? &p->t[p->i + 1] : &p->t[p->n - 1];
}

static bool tok_is_op(const struct jtoken *t, enum jop op)
{
    return t->kind == JT_OP && t->op == op;
}

static bool tok_is_name(const struct jtoken *t, const char *name)
{
    return t->kind == JT_NAME && t->len == strlen(name) && memcmp(t->p, name, t->len) == 0;
}

static bool accept_op(struct parser *p, enum jop op)
{
    if (tok_is_op(peek(p), op)) {
        p->i++;
        return true;
    }
    return false;
}

static bool accept_name(struct parser *p, const char *name)
{
    if (tok_is_name(peek(p), name)) {
        p->i++;
        return true;
    }
    return false;
}

static const char *describe(const struct jtoken *t)
{
    switch (t->kind) {
    case JT_EOF:
        return "the end of the template";
    case JT_TEXT:
        return "text";
    case JT_BLOCK_BEGIN:
        return "'{%'";
    case JT_BLOCK_END:
        return "'%}'";
    case JT_VAR_BEGIN:
        return "'{{'";
    case JT_VAR_END:
        return "'}}'";
    case JT_NAME:
        return "a name";
    case JT_STRING:
        return "a string";
    case JT_INT:
        return "an integer";
    case JT_FLOAT:
        return "a float";
    case JT_OP:
        return "an operator";
    }
    return "a token";
}

static int expect_op(struct parser *p, enum jop op, const char *what)
{
    if (accept_op(p, op))
        return 0;
    char msg[96];
    snprintf(msg, sizeof(msg), "expected %s, found %s", what, describe(peek(p)));
    return fail_at(peek(p), msg, NULL);
}

static int expect_kind(struct parser *p, enum jtok_kind kind, const char *what)
{
    if (peek(p)->kind == kind) {
        p->i++;
        return 0;
    }
    char msg[96];
    snprintf(msg, sizeof(msg), "expected %s, found %s", what, describe(peek(p)));
    return fail_at(peek(p), msg, NULL);
}

static struct jnode *node(struct parser *p, enum jnode_kind kind, int line)
{
    struct jnode *n = jinja_arena_alloc(p->a, sizeof(*n));
    if (n == NULL)
        return NULL;
    memset(n, 0, sizeof(*n));
    n->kind = kind;
    n->line = line;
    return n;
}

/* Appends to a node list whose capacity is tracked by the caller. */
static int list_push(struct parser *p, struct jnode_list *l, size_t *cap, struct jnode *x)
{
    if (l->n == *cap) {
        size_t nc = *cap ? *cap * 2 : 4;
        struct jnode **nv = jinja_arena_alloc(p->a, nc * sizeof(*nv));
        if (nv == NULL)
            return oom(p);
        if (l->n)
            memcpy(nv, l->v, l->n * sizeof(*nv));
        l->v = nv;
        *cap = nc;
    }
    l->v[l->n++] = x;
    return 0;
}

static int enter(struct parser *p)
{
    if (++p->depth > JINJA_MAX_DEPTH)
        return pagoda_error_set(PAGODA_ERANGE, "line %d: nesting deeper than %u", peek(p)->line,
                                JINJA_MAX_DEPTH);
    return 0;
}

static int parse_expr(struct parser *p, bool condexpr, struct jnode **out);
static int parse_unary(struct parser *p, bool with_filter, struct jnode **out);
static int parse_primary(struct parser *p, struct jnode **out);
static int parse_postfix(struct parser *p, struct jnode **io);

/* expr (, expr)* as a tuple when there is a comma (explicit: inside parentheses, where () is
 * the empty tuple). */
static int parse_tuple(struct parser *p, bool explicit_parens, bool condexpr, struct jnode **out)
{
    int line = peek(p)->line;
    struct jnode *t = node(p, JN_TUPLE, line);
    if (t == NULL)
        return oom(p);
    size_t cap = 0;
    bool comma = false;
    for (;;) {
        if (explicit_parens && tok_is_op(peek(p), JOP_RPAREN))
            break;
        if (t->args.n > 0 && !comma)
            break;
        struct jnode *e = NULL; /* gcc 12 at -O3 cannot see parse_expr set it */
        int rc = parse_expr(p, condexpr, &e);
        if (rc != 0)
            return rc;
        if ((rc = list_push(p, &t->args, &cap, e)) != 0)
            return rc;
        comma = accept_op(p, JOP_COMMA);
        if (!comma)
            break;
        if (!explicit_parens && (peek(p)->kind == JT_BLOCK_END || peek(p)->kind == JT_VAR_END))
            break;
    }
    if (t->args.n == 1 && !comma) {
        *out = t->args.v[0];
        return 0;
    }
    if (t->args.n == 0 && !explicit_parens)
        return fail_at(peek(p), "expected an expression, found ", describe(peek(p)));
    *out = t;
    return 0;
}

/* Call arguments after '(': expressions and name=expr, to ')'. */
static int parse_call_args(struct parser *p, struct jnode_list *args)
{
    size_t cap = 0;
    bool kw_seen = false;
    while (!accept_op(p, JOP_RPAREN)) {
        if (args->n > 0) {
            int rc = expect_op(p, JOP_COMMA, "',' or ')'");
            if (rc != 0)
                return rc;
            if (accept_op(p, JOP_RPAREN))
                break;
        }
        const struct jtoken *t = peek(p);
        struct jnode *arg;
        int rc;
        if (t->kind == JT_NAME && tok_is_op(peek2(p), JOP_ASSIGN)) {
            arg = node(p, JN_KWARG, t->line);
            if (arg == NULL)
                return oom(p);
            arg->str = t->p;
            arg->len = t->len;
            p->i += 2;
            if ((rc = parse_expr(p, true, &arg->a)) != 0)
                return rc;
            kw_seen = true;
        } else {
            if (tok_is_op(t, JOP_MUL) || tok_is_op(t, JOP_POW))
                return unsupported_at(t, "*args and **kwargs in calls are not supported");
            if (kw_seen)
                return fail_at(t, "a positional argument follows a keyword argument", NULL);
            if ((rc = parse_expr(p, true, &arg)) != 0)
                return rc;
        }
        if ((rc = list_push(p, args, &cap, arg)) != 0)
            return rc;
    }
    return 0;
}

static int parse_subscript(struct parser *p, struct jnode **io)
{
    int line = peek(p)->line;
    struct jnode *parts[3] = {NULL, NULL, NULL};
    int nparts = 0;
    bool slice = false;
    for (;;) {
        if (tok_is_op(peek(p), JOP_RBRACKET))
            break;
        if (tok_is_op(peek(p), JOP_COLON)) {
            p->i++;
            slice = true;
            if (++nparts > 2)
                return fail_at(peek(p), "a slice has at most three parts", NULL);
            continue;
        }
        if (parts[nparts] != NULL && tok_is_op(peek(p), JOP_COMMA))
            return unsupported_at(peek(p), "a tuple as a subscript is not supported");
        if (parts[nparts] != NULL)
            return fail_at(peek(p), "expected ':' or ']' in a subscript", NULL);
        int rc = parse_expr(p, true, &parts[nparts]);
        if (rc != 0)
            return rc;
    }
    int rc = expect_op(p, JOP_RBRACKET, "']'");
    if (rc != 0)
        return rc;
    struct jnode *n;
    if (slice) {
        n = node(p, JN_SLICE, line);
        if (n == NULL)
            return oom(p);
        n->args.v = jinja_arena_alloc(p->a, 3 * sizeof(*n->args.v));
        if (n->args.v == NULL)
            return oom(p);
        memcpy(n->args.v, parts, sizeof(parts));
        n->args.n = 3;
    } else {
        if (parts[0] == NULL) /* jinja2's x[] is x[()] */
            return unsupported_at(peek(p), "an empty subscript is not supported");
        n = node(p, JN_ITEM, line);
        if (n == NULL)
            return oom(p);
        n->b = parts[0];
    }
    n->a = *io;
    *io = n;
    return 0;
}

static int parse_postfix(struct parser *p, struct jnode **io)
{
    for (;;) {
        const struct jtoken *t = peek(p);
        int rc;
        if (tok_is_op(t, JOP_DOT)) {
            p->i++;
            const struct jtoken *a = peek(p);
            struct jnode *n;
            if (a->kind == JT_NAME) {
                n = node(p, JN_ATTR, a->line);
                if (n == NULL)
                    return oom(p);
                n->str = a->p;
                n->len = a->len;
            } else if (a->kind == JT_INT) {
                n = node(p, JN_ITEM, a->line);
                struct jnode *k = node(p, JN_LITERAL, a->line);
                if (n == NULL || k == NULL)
                    return oom(p);
                k->lit = jv_int(a->ival);
                n->b = k;
            } else {
                return fail_at(a, "expected an attribute name after '.'", NULL);
            }
            p->i++;
            n->a = *io;
            *io = n;
        } else if (tok_is_op(t, JOP_LBRACKET)) {
            p->i++;
            if ((rc = parse_subscript(p, io)) != 0)
                return rc;
        } else if (tok_is_op(t, JOP_LPAREN)) {
            p->i++;
            struct jnode *n = node(p, JN_CALL, t->line);
            if (n == NULL)
                return oom(p);
            n->a = *io;
            if ((rc = parse_call_args(p, &n->args)) != 0)
                return rc;
            *io = n;
        } else {
            return 0;
        }
    }
}

/* A filter's or test's name: jinja2 reads name(.name)* (none of its filters or tests has a dot,
 * so such a name is an unknown one). */
static int parse_dotted_name(struct parser *p, struct jnode *n)
{
    const struct jtoken *t = peek(p);
    if (t->kind != JT_NAME)
        return fail_at(t, "expected a filter or test name, found ", describe(t));
    n->str = t->p;
    n->len = t->len;
    p->i++;
    while (tok_is_op(peek(p), JOP_DOT) && peek2(p)->kind == JT_NAME) {
        const struct jtoken *part = peek2(p);
        n->len = (size_t)(part->p + part->len - n->str); /* the source's span, for messages */
        p->i += 2;
    }
    return 0;
}

/* A filter or test this interpreter lacks: jinja2's own (jinja2_only) is refused at once; a
 * name no Jinja knows is noted (struct parser) and the parse goes on. */
static int unknown(struct parser *p, const struct jtoken *t, const char *what,
                   const struct jnode *n, const char *const *jinja2_only)
{
    int len = (int)(n->len < 64 ? n->len : 64);
    if (in_list(jinja2_only, n->str, n->len))
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "line %d: the %s '%.*s' is not supported",
                                t->line, what, len, n->str);
    char *first = p->soft ? p->first_soft : p->hard++ == 0 ? p->first_hard : NULL;
    if (first != NULL && first[0] == '\0')
        snprintf(first, sizeof(p->first_hard), "line %d: unknown %s '%.*s'", t->line, what, len,
                 n->str);
    return 0;
}

/* Whether a test's one argument without parentheses starts here: jinja2's rule, by which any
 * name but else, or and and starts one (`x is divisibleby if` tests x with a variable named
 * "if", and jinja2 then refuses `x is defined if y else z`); is is left out here (jinja2 refuses a
 * second test, this parser chains it). */
static bool starts_test_arg(const struct jtoken *t)
{
    if (t->kind == JT_NAME)
        return !(tok_is_name(t, "else") || tok_is_name(t, "or") || tok_is_name(t, "and") ||
                 tok_is_name(t, "is"));
    return t->kind == JT_STRING || t->kind == JT_INT || t->kind == JT_FLOAT ||
           tok_is_op(t, JOP_LPAREN) || tok_is_op(t, JOP_LBRACKET) || tok_is_op(t, JOP_LBRACE);
}

static int parse_filter_expr(struct parser *p, struct jnode **io)
{
    for (;;) {
        const struct jtoken *t = peek(p);
        int rc;
        if (tok_is_op(t, JOP_PIPE)) {
            p->i++;
            struct jnode *n = node(p, JN_FILTER, t->line);
            if (n == NULL)
                return oom(p);
            if ((rc = parse_dotted_name(p, n)) != 0)
                return rc;
            if (!jinja_filter_exists(n->str, n->len) &&
                (rc = unknown(p, t, "filter", n, JINJA2_ONLY_FILTERS)) != 0)
                return rc;
            if (accept_op(p, JOP_LPAREN) && (rc = parse_call_args(p, &n->args)) != 0)
                return rc;
            n->a = *io;
            *io = n;
        } else if (tok_is_name(t, "is")) {
            p->i++;
            struct jnode *n = node(p, JN_TEST, t->line);
            if (n == NULL)
                return oom(p);
            if (accept_name(p, "not"))
                n->op = JOP_NOT;
            if ((rc = parse_dotted_name(p, n)) != 0)
                return rc;
            if (!jinja_test_exists(n->str, n->len) &&
                (rc = unknown(p, t, "test", n, JINJA2_ONLY_TESTS)) != 0)
                return rc;
            if (accept_op(p, JOP_LPAREN)) {
                if ((rc = parse_call_args(p, &n->args)) != 0)
                    return rc;
            } else if (starts_test_arg(peek(p))) {
                struct jnode *arg;
                if ((rc = parse_primary(p, &arg)) != 0 || (rc = parse_postfix(p, &arg)) != 0)
                    return rc;
                n->args.v = jinja_arena_alloc(p->a, sizeof(*n->args.v));
                if (n->args.v == NULL)
                    return oom(p);
                n->args.v[0] = arg;
                n->args.n = 1;
            }
            n->a = *io;
            *io = n;
        } else {
            return 0;
        }
    }
}

static int parse_primary(struct parser *p, struct jnode **out)
{
    const struct jtoken *t = peek(p);
    struct jnode *n;
    int rc;
    switch (t->kind) {
    case JT_NAME: {
        n = node(p, JN_LITERAL, t->line);
        if (n == NULL)
            return oom(p);
        if (tok_is_name(t, "true") || tok_is_name(t, "True")) {
            n->lit = jv_bool(true);
        } else if (tok_is_name(t, "false") || tok_is_name(t, "False")) {
            n->lit = jv_bool(false);
        } else if (tok_is_name(t, "none") || tok_is_name(t, "None")) {
            n->lit = jv_none();
        } else {
            n->kind = JN_NAME;
            n->str = t->p;
            n->len = t->len;
        }
        p->i++;
        *out = n;
        return 0;
    }
    case JT_STRING: {
        /* adjacent literals join: 'a' "b" is 'ab' */
        size_t total = 0, k = p->i;
        while (p->t[k].kind == JT_STRING)
            total += p->t[k++].len;
        char *s = jinja_arena_alloc(p->a, total + 1);
        n = node(p, JN_LITERAL, t->line);
        if (s == NULL || n == NULL)
            return oom(p);
        size_t off = 0;
        while (p->i < k) {
            memcpy(s + off, p->t[p->i].p, p->t[p->i].len);
            off += p->t[p->i].len;
            p->i++;
        }
        s[total] = '\0';
        n->lit = jv_str(s, total);
        *out = n;
        return 0;
    }
    case JT_INT:
    case JT_FLOAT:
        n = node(p, JN_LITERAL, t->line);
        if (n == NULL)
            return oom(p);
        n->lit = t->kind == JT_INT ? jv_int(t->ival) : jv_float(t->fval);
        p->i++;
        *out = n;
        return 0;
    case JT_OP:
        if (t->op == JOP_LPAREN) {
            p->i++;
            if ((rc = parse_tuple(p, true, true, out)) != 0)
                return rc;
            return expect_op(p, JOP_RPAREN, "')'");
        }
        if (t->op == JOP_LBRACKET || t->op == JOP_LBRACE) {
            bool dict = t->op == JOP_LBRACE;
            enum jop close = dict ? JOP_RBRACE : JOP_RBRACKET;
            n = node(p, dict ? JN_DICT : JN_LIST, t->line);
            if (n == NULL)
                return oom(p);
            p->i++;
            size_t cap = 0;
            while (!accept_op(p, close)) {
                if (n->args.n > 0) {
                    if ((rc = expect_op(p, JOP_COMMA, dict ? "',' or '}'" : "',' or ']'")) != 0)
                        return rc;
                    if (accept_op(p, close))
                        break;
                }
                struct jnode *e;
                if ((rc = parse_expr(p, true, &e)) != 0 ||
                    (rc = list_push(p, &n->args, &cap, e)) != 0)
                    return rc;
                if (dict) {
                    if ((rc = expect_op(p, JOP_COLON, "':'")) != 0 ||
                        (rc = parse_expr(p, true, &e)) != 0 ||
                        (rc = list_push(p, &n->args, &cap, e)) != 0)
                        return rc;
                }
            }
            *out = n;
            return 0;
        }
        break;
    default:
        break;
    }
    return fail_at(t, "expected an expression, found ", describe(t));
}

static int parse_unary(struct parser *p, bool with_filter, struct jnode **out)
{
    int rc = enter(p);
    if (rc != 0)
        return rc;
    const struct jtoken *t = peek(p);
    struct jnode *n;
    if (tok_is_op(t, JOP_SUB) || tok_is_op(t, JOP_ADD)) {
        p->i++;
        n = node(p, JN_UNARY, t->line);
        if (n == NULL)
            return oom(p);
        n->op = t->op;
        if ((rc = parse_unary(p, false, &n->a)) != 0)
            return rc;
    } else {
        if ((rc = parse_primary(p, &n)) != 0)
            return rc;
    }
    if ((rc = parse_postfix(p, &n)) != 0)
        return rc;
    if (with_filter && (rc = parse_filter_expr(p, &n)) != 0)
        return rc;
    p->depth--;
    *out = n;
    return 0;
}

static int binary(struct parser *p, int line, enum jop op, struct jnode *l, struct jnode *r,
                  struct jnode **out)
{
    struct jnode *n = node(p, JN_BINARY, line);
    if (n == NULL)
        return oom(p);
    n->op = op;
    n->a = l;
    n->b = r;
    *out = n;
    return 0;
}

/* The levels of binary operators, tightest last. */
enum level { L_OR, L_AND, L_NOT, L_COMPARE, L_MATH1, L_CONCAT, L_MATH2, L_POW };

static int parse_level(struct parser *p, enum level lv, struct jnode **out);

static bool level_op(const struct parser *p, enum level lv, enum jop *op, size_t *width)
{
    const struct jtoken *t = peek(p);
    *width = 1;
    switch (lv) {
    case L_OR:
        *op = JOP_OR;
        return tok_is_name(t, "or");
    case L_AND:
        *op = JOP_AND;
        return tok_is_name(t, "and");
    case L_COMPARE:
        if (t->kind == JT_OP && (t->op == JOP_EQ || t->op == JOP_NE || t->op == JOP_LT ||
                                 t->op == JOP_LE || t->op == JOP_GT || t->op == JOP_GE)) {
            *op = t->op;
            return true;
        }
        if (tok_is_name(t, "in")) {
            *op = JOP_IN;
            return true;
        }
        if (tok_is_name(t, "not") && tok_is_name(peek2(p), "in")) {
            *op = JOP_NOTIN;
            *width = 2;
            return true;
        }
        return false;
    case L_MATH1:
        *op = t->kind == JT_OP ? t->op : JOP_NONE;
        return *op == JOP_ADD || *op == JOP_SUB;
    case L_CONCAT:
        *op = JOP_TILDE;
        return tok_is_op(t, JOP_TILDE);
    case L_MATH2:
        *op = t->kind == JT_OP ? t->op : JOP_NONE;
        return *op == JOP_MUL || *op == JOP_DIV || *op == JOP_FLOORDIV || *op == JOP_MOD;
    case L_POW:
        *op = JOP_POW;
        return tok_is_op(t, JOP_POW);
    default:
        return false;
    }
}

static int parse_level(struct parser *p, enum level lv, struct jnode **out)
{
    int rc;
    if (lv == L_NOT) {
        const struct jtoken *t = peek(p);
        if (tok_is_name(t, "not") && !tok_is_name(peek2(p), "in")) {
            p->i++;
            if ((rc = enter(p)) != 0)
                return rc;
            struct jnode *n = node(p, JN_UNARY, t->line);
            if (n == NULL)
                return oom(p);
            n->op = JOP_NOT;
            if ((rc = parse_level(p, L_NOT, &n->a)) != 0)
                return rc;
            p->depth--;
            *out = n;
            return 0;
        }
        return parse_level(p, L_COMPARE, out);
    }
    struct jnode *left;
    rc = lv == L_POW ? parse_unary(p, true, &left) : parse_level(p, (enum level)(lv + 1), &left);
    if (rc != 0)
        return rc;
    enum jop op;
    size_t width;
    struct jnode *prev_right = NULL; /* comparison chains: a < b < c is a < b and b < c */
    while (level_op(p, lv, &op, &width)) {
        int line = peek(p)->line;
        p->i += width;
        struct jnode *right;
        rc = lv == L_POW ? parse_unary(p, true, &right)
                         : parse_level(p, (enum level)(lv + 1), &right);
        if (rc != 0)
            return rc;
        if (lv == L_COMPARE && prev_right != NULL) {
            struct jnode *cmp = NULL;
            if ((rc = binary(p, line, op, prev_right, right, &cmp)) != 0 ||
                (rc = binary(p, line, JOP_AND, left, cmp, &left)) != 0)
                return rc;
        } else if ((rc = binary(p, line, op, left, right, &left)) != 0) {
            return rc;
        }
        if (lv == L_COMPARE)
            prev_right = right;
    }
    *out = left;
    return 0;
}

static int parse_expr(struct parser *p, bool condexpr, struct jnode **out)
{
    int rc = enter(p);
    if (rc != 0)
        return rc;
    struct jnode *e;
    unsigned hard = p->hard;
    if ((rc = parse_level(p, L_OR, &e)) != 0)
        return rc;
    while (condexpr && tok_is_name(peek(p), "if")) {
        struct jnode *n = node(p, JN_COND, peek(p)->line);
        if (n == NULL)
            return oom(p);
        p->i++;
        n->a = e;
        if (p->hard > hard) { /* the names before the if were in its soft frame after all */
            if (hard == 0 && p->first_soft[0] == '\0')
                memcpy(p->first_soft, p->first_hard, sizeof(p->first_soft));
            if (hard == 0)
                p->first_hard[0] = '\0';
            p->hard = hard;
        }
        p->soft++;
        if ((rc = parse_level(p, L_OR, &n->b)) != 0)
            return rc;
        if (accept_name(p, "else") && (rc = parse_expr(p, true, &n->c)) != 0)
            return rc;
        p->soft--;
        e = n;
    }
    p->depth--;
    *out = e;
    return 0;
}

/* ---- statements ---- */

static int parse_body(struct parser *p, struct jnode_list *body, const char *const *ends,
                      const char *opener, int open_line);

/* A `for` or `set` target: a name, names separated by commas (optionally in parentheses), or
 * (namespace) name.attr. */
static int parse_target(struct parser *p, bool allow_attr, struct jnode **out)
{
    const struct jtoken *t = peek(p);
    bool parens = accept_op(p, JOP_LPAREN);
    struct jnode *tuple = node(p, JN_TUPLE, t->line);
    if (tuple == NULL)
        return oom(p);
    size_t cap = 0;
    for (;;) {
        const struct jtoken *nt = peek(p);
        if (tok_is_op(nt, JOP_LPAREN))
            return unsupported_at(nt, "nested tuples in a for or set target are not supported");
        if (nt->kind != JT_NAME)
            return fail_at(nt, "expected a variable name, found ", describe(nt));
        struct jnode *n = node(p, JN_NAME, nt->line);
        if (n == NULL)
            return oom(p);
        n->str = nt->p;
        n->len = nt->len;
        p->i++;
        if (allow_attr && !parens && tuple->args.n == 0 && tok_is_op(peek(p), JOP_DOT)) {
            p->i++;
            const struct jtoken *at = peek(p);
            if (at->kind != JT_NAME)
                return fail_at(at, "expected an attribute name after '.'", NULL);
            struct jnode *attr = node(p, JN_ATTR, at->line);
            if (attr == NULL)
                return oom(p);
            attr->a = n;
            attr->str = at->p;
            attr->len = at->len;
            p->i++;
            *out = attr;
            return 0;
        }
        int rc = list_push(p, &tuple->args, &cap, n);
        if (rc != 0)
            return rc;
        if (!accept_op(p, JOP_COMMA))
            break;
    }
    if (parens) {
        int rc = expect_op(p, JOP_RPAREN, "')'");
        if (rc != 0)
            return rc;
    }
    *out = tuple->args.n == 1 && !parens ? tuple->args.v[0] : tuple;
    return 0;
}

static int end_tag(struct parser *p)
{
    return expect_kind(p, JT_BLOCK_END, "'%}'");
}

static int parse_if(struct parser *p, struct jnode *n)
{
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    int rc;
    if ((rc = parse_expr(p, true, &n->a)) != 0)
        return rc;
    if (tok_is_op(peek(p), JOP_COMMA)) /* jinja2 reads a tuple there */
        return unsupported_at(peek(p), "a tuple as an if's condition is not supported");
    if ((rc = end_tag(p)) != 0 || (rc = parse_body(p, &n->body, ends, "if", n->line)) != 0)
        return rc;
    /* at {% elif / else / endif */
    p->i++;
    const struct jtoken *t = peek(p);
    p->i++;
    if (tok_is_name(t, "elif")) {
        struct jnode *e = node(p, JN_IF, t->line);
        if (e == NULL)
            return oom(p);
        n->orelse.v = jinja_arena_alloc(p->a, sizeof(*n->orelse.v));
        if (n->orelse.v == NULL)
            return oom(p);
        n->orelse.v[0] = e;
        n->orelse.n = 1;
        return parse_if(p, e);
    }
    if (tok_is_name(t, "else")) {
        static const char *const endif[] = {"endif", NULL};
        if ((rc = end_tag(p)) != 0 || (rc = parse_body(p, &n->orelse, endif, "if", n->line)) != 0)
            return rc;
        p->i += 2;
    }
    return end_tag(p);
}

static int parse_for(struct parser *p, struct jnode *n)
{
    static const char *const ends[] = {"else", "endfor", NULL};
    int rc;
    if ((rc = parse_target(p, false, &n->a)) != 0)
        return rc;
    if (!accept_name(p, "in"))
        return fail_at(peek(p), "expected 'in' in a for loop", NULL);
    if ((rc = parse_tuple(p, false, false, &n->b)) != 0)
        return rc;
    unsigned soft = p->soft;
    p->soft = 0; /* the loop's filter, body and else are frames of their own */
    if (accept_name(p, "if") && (rc = parse_expr(p, true, &n->c)) != 0)
        return rc;
    if (tok_is_name(peek(p), "recursive"))
        return unsupported_at(peek(p), "recursive for loops are not supported");
    if ((rc = end_tag(p)) != 0)
        return rc;
    p->loops++;
    rc = parse_body(p, &n->body, ends, "for", n->line);
    p->loops--;
    if (rc != 0)
        return rc;
    p->i++;
    const struct jtoken *t = peek(p);
    p->i++;
    if (tok_is_name(t, "else")) {
        static const char *const endfor[] = {"endfor", NULL};
        if ((rc = end_tag(p)) != 0 || (rc = parse_body(p, &n->orelse, endfor, "for", n->line)) != 0)
            return rc;
        p->i += 2;
    }
    p->soft = soft;
    return end_tag(p);
}

static int parse_set(struct parser *p, struct jnode *n)
{
    int rc;
    if ((rc = parse_target(p, true, &n->a)) != 0)
        return rc;
    if (accept_op(p, JOP_ASSIGN)) {
        if ((rc = parse_tuple(p, false, true, &n->b)) != 0)
            return rc;
        return end_tag(p);
    }
    if (tok_is_op(peek(p), JOP_PIPE))
        return unsupported_at(peek(p), "a filter on a block set is not supported");
    if (n->a->kind != JN_NAME)
        return fail_at(peek(p), "a block set assigns one name", NULL);
    static const char *const ends[] = {"endset", NULL};
    unsigned soft = p->soft;
    p->soft = 0; /* a frame of its own */
    if ((rc = end_tag(p)) != 0 || (rc = parse_body(p, &n->body, ends, "set", n->line)) != 0)
        return rc;
    p->soft = soft;
    p->i += 2;
    return end_tag(p);
}

static int parse_macro(struct parser *p, struct jnode *n)
{
    const struct jtoken *t = peek(p);
    if (t->kind != JT_NAME)
        return fail_at(t, "expected a macro name", NULL);
    n->str = t->p;
    n->len = t->len;
    p->i++;
    int rc = expect_op(p, JOP_LPAREN, "'('");
    if (rc != 0)
        return rc;
    size_t cap = 0;
    bool defaults = false;
    unsigned soft = p->soft;
    p->soft = 0; /* its defaults and body are a frame of its own */
    while (!accept_op(p, JOP_RPAREN)) {
        if (n->args.n > 0 && (rc = expect_op(p, JOP_COMMA, "',' or ')'")) != 0)
            return rc;
        const struct jtoken *a = peek(p);
        if (a->kind != JT_NAME)
            return fail_at(a, "expected a parameter name", NULL);
        p->i++;
        struct jnode *param = node(p, JN_NAME, a->line);
        if (param == NULL)
            return oom(p);
        param->str = a->p;
        param->len = a->len;
        for (size_t k = 0; k < n->args.n; k++)
            if (n->args.v[k]->len == a->len && memcmp(n->args.v[k]->str, a->p, a->len) == 0)
                return fail_at(a, "duplicate macro parameter", NULL);
        if (accept_op(p, JOP_ASSIGN)) {
            param->kind = JN_KWARG;
            if ((rc = parse_expr(p, true, &param->a)) != 0)
                return rc;
            defaults = true;
        } else if (defaults) {
            return fail_at(a, "a parameter without a default follows one with a default", NULL);
        }
        if ((rc = list_push(p, &n->args, &cap, param)) != 0)
            return rc;
    }
    static const char *const ends[] = {"endmacro", NULL};
    unsigned loops = p->loops;
    p->loops = 0;
    if ((rc = end_tag(p)) == 0)
        rc = parse_body(p, &n->body, ends, "macro", n->line);
    p->loops = loops;
    if (rc != 0)
        return rc;
    p->soft = soft;
    p->i += 2;
    if (peek(p)->kind == JT_NAME)
        p->i++; /* {% endmacro name %} */
    return end_tag(p);
}

/* One {% ... %} statement, after its '{%'; *out is NULL for tags that render nothing. */
static int parse_statement(struct parser *p, struct jnode **out)
{
    const struct jtoken *t = peek(p);
    *out = NULL;
    if (t->kind != JT_NAME)
        return fail_at(t, "expected a tag name after '{%', found ", describe(t));
    p->i++;
    int rc;
    if (tok_is_name(t, "generation") || tok_is_name(t, "endgeneration"))
        return end_tag(p);
    enum jnode_kind kind;
    if (tok_is_name(t, "if"))
        kind = JN_IF;
    else if (tok_is_name(t, "for"))
        kind = JN_FOR;
    else if (tok_is_name(t, "set"))
        kind = JN_SET;
    else if (tok_is_name(t, "macro"))
        kind = JN_MACRO;
    else if (tok_is_name(t, "break"))
        kind = JN_BREAK;
    else if (tok_is_name(t, "continue"))
        kind = JN_CONTINUE;
    else {
        char name[64], what[96];
        snprintf(name, sizeof(name), "%.*s", (int)(t->len < 48 ? t->len : 48), t->p);
        if (!in_list(JINJA2_ONLY_TAGS, t->p, t->len))
            return fail_at(t, "unknown tag: ", name);
        snprintf(what, sizeof(what), "the '%s' tag is not supported", name);
        return unsupported_at(t, what);
    }
    struct jnode *n = node(p, kind, t->line);
    if (n == NULL)
        return oom(p);
    if ((rc = enter(p)) != 0)
        return rc;
    switch (kind) {
    case JN_IF:
        p->soft++; /* its condition, elifs and bodies */
        rc = parse_if(p, n);
        p->soft--;
        break;
    case JN_FOR:
        rc = parse_for(p, n);
        break;
    case JN_SET:
        rc = parse_set(p, n);
        break;
    case JN_MACRO:
        rc = parse_macro(p, n);
        break;
    default:
        if (p->loops == 0)
            return fail_at(t,
                           kind == JN_BREAK ? "'break' outside a for loop"
                                            : "'continue' outside a for loop",
                           NULL);
        rc = end_tag(p);
        break;
    }
    if (rc != 0)
        return rc;
    p->depth--;
    *out = n;
    return 0;
}

static bool at_end_tag(const struct parser *p, const char *const *ends)
{
    if (peek(p)->kind != JT_BLOCK_BEGIN || ends == NULL)
        return false;
    for (size_t k = 0; ends[k] != NULL; k++)
        if (tok_is_name(peek2(p), ends[k]))
            return true;
    return false;
}

/* Statements up to one of the end tags (left at its '{%'), or to the end of the template when
 * ends is NULL. */
static int parse_body(struct parser *p, struct jnode_list *body, const char *const *ends,
                      const char *opener, int open_line)
{
    size_t cap = 0;
    for (;;) {
        const struct jtoken *t = peek(p);
        if (t->kind == JT_EOF) {
            if (ends == NULL)
                return 0;
            size_t last = 0;
            while (ends[last + 1] != NULL)
                last++;
            return pagoda_error_set(PAGODA_EINVAL,
                                    "line %d: the '%s' tag opened here is never closed "
                                    "(expected '{%% %s %%}')",
                                    open_line, opener, ends[last]);
        }
        if (at_end_tag(p, ends))
            return 0;
        struct jnode *n = NULL;
        int rc;
        p->i++;
        switch (t->kind) {
        case JT_TEXT:
            n = node(p, JN_TEXT, t->line);
            if (n == NULL)
                return oom(p);
            n->str = t->p;
            n->len = t->len;
            break;
        case JT_VAR_BEGIN:
            n = node(p, JN_OUTPUT, t->line);
            if (n == NULL)
                return oom(p);
            if ((rc = parse_tuple(p, false, true, &n->a)) != 0 ||
                (rc = expect_kind(p, JT_VAR_END, "'}}'")) != 0)
                return rc;
            break;
        case JT_BLOCK_BEGIN:
            if (peek(p)->kind == JT_NAME) {
                static const char *const closers[] = {"endif", "endfor", "endset", "endmacro",
                                                      "elif",  "else",   NULL};
                for (size_t k = 0; closers[k] != NULL; k++)
                    if (tok_is_name(peek(p), closers[k]))
                        return fail_at(peek(p), "unexpected tag: ", closers[k]);
            }
            if ((rc = parse_statement(p, &n)) != 0)
                return rc;
            break;
        default:
            return fail_at(t, "unexpected ", describe(t));
        }
        if (n != NULL && (rc = list_push(p, body, &cap, n)) != 0)
            return rc;
    }
}

int jinja_parse(struct jinja_arena *a, const struct jtoken *toks, size_t count,
                struct jnode_list *out)
{
    struct parser p = {.a = a, .t = toks, .n = count};
    memset(out, 0, sizeof(*out));
    int rc = parse_body(&p, out, NULL, NULL, 0);
    if (rc == 0 && p.hard > 0)
        rc = pagoda_error_set(PAGODA_EINVAL, "%s", p.first_hard);
    else if (rc == 0 && p.first_soft[0] != '\0')
        rc = pagoda_error_set(PAGODA_EUNSUPPORTED,
                              "%s (under an if: jinja2 fails on it only where it runs)",
                              p.first_soft);
    return rc;
}
