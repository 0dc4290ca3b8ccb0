/* What the parts of the Jinja interpreter share (chat/jinja.h is the module's contract): the
 * arena every compile and every render allocates from, tokens, the syntax tree, run-time values
 * and the render state.
 *
 * The parts, in the order a template goes through them:
 *   jinja_lexer.c    source bytes -> tokens, whitespace control (trim_blocks, lstrip_blocks, -)
 *   jinja_parser.c   tokens -> syntax tree (jinja2's grammar and operator precedence)
 *   jinja_eval.c     syntax tree + variables -> text: statements, expressions, scopes, limits
 *   jinja_builtins.c attributes, items, iteration, methods of str/dict, tests, globals
 *   jinja_filters.c  the filters
 *   jinja_strings.c  the string operations methods and filters share
 *   jinja_value.c    values: conversion from JSON, truth, equality, order, str(), repr(), JSON
 *
 * Memory: a compiled template lives in one arena (nodes, decoded string literals), never written
 * after jinja_template_new returns, so that renders may share it. A render allocates every value
 * from an arena of its own, freed whole at the end; the arena has a byte limit, so that no
 * template can exhaust memory through intermediate values either. */
#ifndef PAGODA_CHAT_JINJA_INTERNAL_H
#define PAGODA_CHAT_JINJA_INTERNAL_H

#include "chat/jinja.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most memory one render may allocate for values (strings built, lists, captured blocks);
 * beyond it the render fails with PAGODA_ERANGE. Four times the output limit, so that a template
 * can build its output in a variable before printing it. */
#define JINJA_MAX_RENDER_MEMORY (4u * JINJA_MAX_OUTPUT_BYTES)
/* The most memory a compiled template may take (its nodes and literals): the source is bounded,
 * and nodes are a small multiple of it. */
#define JINJA_MAX_COMPILE_MEMORY (64u * JINJA_MAX_SOURCE_BYTES)

/* ---- arena ---- */

struct jinja_arena {
    struct jinja_chunk *head;
    size_t used;  /* bytes handed out, all chunks */
    size_t limit; /* most bytes handed out */
};

void jinja_arena_init(struct jinja_arena *a, size_t limit);
void jinja_arena_fini(struct jinja_arena *a);
/* n bytes aligned for any value, or NULL when the limit or malloc refuses. */
void *jinja_arena_alloc(struct jinja_arena *a, size_t n);

/* ---- tokens ---- */

enum jtok_kind {
    JT_EOF,
    JT_TEXT,        /* template data between tags, whitespace control applied */
    JT_BLOCK_BEGIN, /* {% */
    JT_BLOCK_END,   /* %} */
    JT_VAR_BEGIN,   /* {{ */
    JT_VAR_END,     /* }} */
    JT_NAME,
    JT_STRING, /* decoded: escapes resolved */
    JT_INT,
    JT_FLOAT,
    JT_OP,
};

enum jop {
    JOP_NONE,
    JOP_ADD,
    JOP_SUB,
    JOP_MUL,
    JOP_DIV,
    JOP_FLOORDIV,
    JOP_MOD,
    JOP_POW,
    JOP_TILDE,
    JOP_EQ,
    JOP_NE,
    JOP_LT,
    JOP_LE,
    JOP_GT,
    JOP_GE,
    JOP_ASSIGN,
    JOP_LPAREN,
    JOP_RPAREN,
    JOP_LBRACKET,
    JOP_RBRACKET,
    JOP_LBRACE,
    JOP_RBRACE,
    JOP_COMMA,
    JOP_DOT,
    JOP_COLON,
    JOP_PIPE,
    /* Not tokens: the parser's binary operators spelled as words. */
    JOP_AND,
    JOP_OR,
    JOP_IN,
    JOP_NOTIN,
    JOP_NOT, /* unary `not`, and a negated test (is not) */
};

struct jtoken {
    enum jtok_kind kind;
    enum jop op;
    int line;
    const char *p; /* JT_TEXT, JT_NAME, JT_STRING: the bytes (a string's are decoded) */
    size_t len;
    int64_t ival;
    double fval;
};

/* Splits source into tokens (allocated from a; *out ends with JT_EOF). Errors: PAGODA_EINVAL with
 * "line N: ..." (an unterminated tag or string, an unexpected character, invalid UTF-8),
 * PAGODA_ERANGE / PAGODA_ENOMEM when the arena refuses. */
int jinja_lex(struct jinja_arena *a, const char *source, size_t len, struct jtoken **out,
              size_t *count);

/* ---- syntax tree ---- */

enum jnode_kind {
    /* statements */
    JN_TEXT,   /* str */
    JN_OUTPUT, /* {{ a }} */
    JN_IF,     /* a: test; body; orelse (an elif is an orelse holding one JN_IF) */
    JN_FOR,    /* a: target (JN_NAME or JN_TUPLE of names), b: iterable, c: filter; body, orelse */
    JN_SET, /* a: target (name, tuple of names, or ns.attr); b: value, or NULL: body is captured */
    JN_MACRO,    /* str: name; args: parameters (JN_NAME, or JN_KWARG with a default); body */
    JN_BREAK,    /* {% break %} */
    JN_CONTINUE, /* {% continue %} */
    /* expressions */
    JN_LITERAL, /* lit */
    JN_NAME,    /* str */
    JN_LIST,    /* args */
    JN_TUPLE,   /* args */
    JN_DICT,    /* args: key, value, key, value... */
    JN_ATTR,    /* a.str */
    JN_ITEM,    /* a[b] */
    JN_SLICE,   /* a[args[0]:args[1]:args[2]], each may be NULL */
    JN_CALL,    /* a(args) with JN_KWARG for keyword arguments */
    JN_FILTER,  /* a | str(args) */
    JN_TEST,    /* a is [not: op == JOP_NOT] str(args) */
    JN_UNARY,   /* op: JOP_SUB, JOP_ADD or JOP_NOT */
    JN_BINARY,  /* a op b, op including JOP_AND/OR/IN/NOTIN */
    JN_COND,    /* a if b else c (c may be NULL: undefined) */
    JN_KWARG,   /* str=a */
};

struct jnode;

struct jnode_list {
    struct jnode **v;
    size_t n;
};

/* One value as the syntax tree holds a literal and as a render passes values around. */
enum jv_kind {
    JV_UNDEFINED, /* s: the name that was not found (for errors), may be empty */
    JV_NONE,
    JV_BOOL,
    JV_INT,
    JV_FLOAT,
    JV_STRING,
    JV_LIST,      /* tuples too */
    JV_DICT,      /* ordered, string keys */
    JV_NAMESPACE, /* a dict whose attributes `set` may assign */
    JV_MACRO,
    JV_FUNC, /* a global function or a bound method */
    JV_LOOP, /* the `loop` variable of a for loop */
};

struct jlist;
struct jdict;
struct jfunc;
struct jloop;

typedef struct jv {
    enum jv_kind kind;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p;
            size_t len;
        } s;
        struct jlist *list;
        struct jdict *dict;
        const struct jnode *macro;
        struct jfunc *fn;
        struct jloop *loop;
    } u;
} jv;

struct jnode {
    enum jnode_kind kind;
    enum jop op;
    int line;
    const char *str;
    size_t len;
    jv lit;
    struct jnode *a, *b, *c;
    struct jnode_list args, body, orelse;
};

/* Parses the tokens into the statements of the template's top level. Errors: PAGODA_EINVAL
 * "line N: ...", PAGODA_ERANGE (nesting deeper than JINJA_MAX_DEPTH), arena errors. */
int jinja_parse(struct jinja_arena *a, const struct jtoken *toks, size_t count,
                struct jnode_list *out);

/* ---- values ---- */

struct jlist {
    jv *v;
    size_t n;
    bool tuple; /* printed (a, b) as Python prints a tuple; otherwise a list */
};

struct jdict_entry {
    const char *key;
    size_t klen;
    jv v;
};

struct jdict {
    struct jdict_entry *e;
    size_t n, cap;
};

/* Global functions and the methods of str and dict (a method holds its object in self). */
enum jfunc_id {
    JF_RAISE_EXCEPTION,
    JF_NAMESPACE,
    JF_RANGE,
    JF_STRFTIME_NOW,
    JF_STR_STRIP,
    JF_STR_LSTRIP,
    JF_STR_RSTRIP,
    JF_STR_SPLIT,
    JF_STR_STARTSWITH,
    JF_STR_ENDSWITH,
    JF_STR_UPPER,
    JF_STR_LOWER,
    JF_STR_TITLE,
    JF_STR_CAPITALIZE,
    JF_STR_REPLACE,
    JF_STR_FIND,
    JF_STR_COUNT,
    JF_STR_JOIN,
    JF_DICT_ITEMS,
    JF_DICT_KEYS,
    JF_DICT_VALUES,
    JF_DICT_GET,
};

struct jfunc {
    enum jfunc_id id;
    jv self;
};

struct jloop {
    const jv *items;
    size_t n, index0;
};

/* A growing byte buffer bounded by JINJA_MAX_OUTPUT_BYTES (malloc'd, not arena). */
struct jbuf {
    char *p;
    size_t len, cap;
};

/* ---- render state ---- */

struct jframe;

struct jrender {
    struct jinja_arena arena;
    struct jbuf *out;       /* where text goes now (the output, or a capture) */
    uint64_t steps;         /* evaluation steps so far, bounded by JINJA_MAX_STEPS */
    uint64_t work;          /* units of work not yet charged as a step (jinja_work) */
    unsigned depth;         /* nesting of evaluation now, bounded by JINJA_MAX_DEPTH */
    struct jframe *globals; /* the template's top-level scope */
    int line;               /* the line being evaluated, for errors raised deep inside */
};

/* Records err with the detail "line N: <fmt>" and returns err. */
int jinja_fail(const struct jrender *r, int line, int err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Charges n steps; PAGODA_ERANGE past JINJA_MAX_STEPS. */
int jinja_step(struct jrender *r, uint64_t n);
/* Work a step is made of: an operation whose cost depends on its data (bytes compared or
 * scanned, elements visited) charges it in units as it goes, so that small operations add up
 * exactly and a large one stops at the limit before it has done more than that. A byte
 * memcmp/memchr/memmem reads is a unit, a code point decoded (and case-folded) or a container
 * element visited is JINJA_WORK_ELEMENT. */
#define JINJA_WORK_PER_STEP 64u
#define JINJA_WORK_ELEMENT 4u
/* Charges n units; PAGODA_ERANGE past JINJA_MAX_STEPS. */
int jinja_work(struct jrender *r, uint64_t n);

static inline jv jv_undefined(const char *name, size_t len)
{
    jv v = {.kind = JV_UNDEFINED};
    v.u.s.p = name;
    v.u.s.len = len;
    return v;
}
static inline jv jv_none(void)
{
    jv v = {.kind = JV_NONE};
    return v;
}
static inline jv jv_bool(bool b)
{
    jv v = {.kind = JV_BOOL};
    v.u.b = b;
    return v;
}
static inline jv jv_int(int64_t i)
{
    jv v = {.kind = JV_INT};
    v.u.i = i;
    return v;
}
static inline jv jv_float(double f)
{
    jv v = {.kind = JV_FLOAT};
    v.u.f = f;
    return v;
}
static inline jv jv_str(const char *p, size_t len)
{
    jv v = {.kind = JV_STRING};
    v.u.s.p = p;
    v.u.s.len = len;
    return v;
}

/* The name of a value's type as Python says it ("str", "list", ...), for errors. */
const char *jv_type_name(const jv *v);
/* Python's truth value. */
bool jv_truthy(const jv *v);
/* Python's ==, in *eq; PAGODA_ERANGE past the step limit (its work is charged). */
int jv_equal(struct jrender *r, const jv *a, const jv *b, bool *eq);
/* Python's ordering of two numbers, two strings or two lists: *cmp < 0, 0, > 0; PAGODA_EFORMAT
 * (detail set) when the two cannot be ordered. */
int jv_compare(struct jrender *r, int line, const jv *a, const jv *b, bool case_sensitive,
               int *cmp);

/* Copies n bytes into the render's arena. */
int jv_new_str(struct jrender *r, const char *p, size_t n, jv *out);
int jv_new_list(struct jrender *r, size_t n, jv *out);
int jv_new_dict(struct jrender *r, size_t cap, enum jv_kind kind, jv *out);
/* Sets key in a dict or namespace (replacing an existing key, keeping its place). */
int jv_dict_set(struct jrender *r, jv *dict, const char *key, size_t klen, jv value);
/* The value of key, or NULL. Charges a step per entry looked at. */
const jv *jv_dict_get(struct jrender *r, const jv *dict, const char *key, size_t klen);
/* Converts a JSON value (deep copy into the arena). */
int jv_from_json(struct jrender *r, const json_t *j, unsigned depth, jv *out);

int jbuf_append(struct jbuf *b, const char *p, size_t n);
/* Python's str(v) appended to b (a string as is, None as "None", lists as their repr). */
int jv_append_str(struct jrender *r, struct jbuf *b, const jv *v);
/* Python's repr(v) appended to b. */
int jv_append_repr(struct jrender *r, struct jbuf *b, const jv *v);
/* str(v) as a value (v itself when it is a string). */
int jv_to_str(struct jrender *r, const jv *v, jv *out);
/* json.dumps(v, ensure_ascii, indent (<0: none), separators, sort_keys) appended to b, as
 * transformers' tojson filter writes it. item_sep/key_sep NULL: json.dumps's defaults. */
int jv_append_json(struct jrender *r, int line, struct jbuf *b, const jv *v, bool ensure_ascii,
                   int indent, const jv *item_sep, const jv *key_sep, bool sort_keys,
                   unsigned depth);
/* A jbuf's bytes moved into the arena as a string value; the jbuf is freed. */
int jv_from_jbuf(struct jrender *r, struct jbuf *b, jv *out);

/* UTF-8: the length of the sequence at p (1 for a byte that starts none), its code point. */
size_t jinja_u8_next(const char *p, size_t len, uint32_t *cp);
/* Python's str.isspace() for one code point. */
bool jinja_is_space(uint32_t cp);

/* ---- evaluation (jinja_eval.c) and builtins (jinja_builtins.c) ---- */

/* Evaluates an expression in the current scope. */
int jinja_eval(struct jrender *r, struct jframe *f, const struct jnode *n, jv *out);
/* Calls a macro with evaluated arguments (kw: names of the last nkw arguments). */
int jinja_call_macro(struct jrender *r, const struct jnode *macro, int line, const jv *args,
                     size_t npos, const struct jnode *const *kwnames, const jv *kwvals, size_t nkw,
                     jv *out);

/* Arguments evaluated for a filter, test or function: positional, then keyword. */
struct jargs {
    const jv *pos;
    size_t npos;
    const struct jnode *const *kwname; /* JN_KWARG nodes (str, len) */
    const jv *kw;
    size_t nkw;
};

/* Applies the filter named (name, len). Unknown filters: PAGODA_EINVAL. */
int jinja_filter(struct jrender *r, struct jframe *f, int line, const char *name, size_t len,
                 const jv *in, const struct jargs *args, jv *out);
/* Applies the test named (name, len). Unknown tests: PAGODA_EINVAL. */
int jinja_test(struct jrender *r, int line, const char *name, size_t len, const jv *in,
               const struct jargs *args, bool *out);
/* True when a test / filter of that name exists (the parser refuses unknown ones, as jinja2's
 * compiler does; select/reject and map take names at run time). */
bool jinja_test_exists(const char *name, size_t len);
bool jinja_filter_exists(const char *name, size_t len);
/* Calls a global function or bound method. */
int jinja_call_func(struct jrender *r, int line, const struct jfunc *fn, const struct jargs *args,
                    jv *out);
/* The attribute of a value as jinja2's getattr reads it (methods of str and dict, dict items,
 * loop fields, namespace attributes); undefined when there is none. */
int jinja_getattr(struct jrender *r, int line, const jv *obj, const char *name, size_t len,
                  jv *out);
/* obj[key] as jinja2's getitem reads it; undefined when there is none. */
int jinja_getitem(struct jrender *r, int line, const jv *obj, const jv *key, jv *out);
/* The global (name, len) if it is one of the builtin functions or constants. */
bool jinja_global(const char *name, size_t len, jv *out);
/* The items a for loop or a filter iterates: a list's, a dict's keys, a string's characters;
 * undefined iterates nothing. PAGODA_EFORMAT for anything else. */
int jinja_iterate(struct jrender *r, int line, const jv *v, const jv **items, size_t *n);

/* A keyword or positional argument: the positional one at index pos, else the keyword name. */
const jv *jinja_arg(const struct jargs *a, size_t pos, const char *name);
/* Argument checks: PAGODA_EFORMAT "<what>, not <type>" (or a missing argument). */
int jinja_type_error(struct jrender *r, int line, const char *what, const jv *v);
int jinja_need_str(struct jrender *r, int line, const jv *v, const char *what);
int jinja_need_int(struct jrender *r, int line, const jv *v, const char *what, int64_t *out);

/* ---- strings (jinja_strings.c), shared by str's methods and the filters ---- */

/* JCASE_TITLE is str.title(); JCASE_TITLE_WORDS the title filter (jinja2's do_title). */
enum jcase { JCASE_UPPER, JCASE_LOWER, JCASE_TITLE, JCASE_CAPITALIZE, JCASE_TITLE_WORDS };

/* str.strip/lstrip/rstrip(chars): chars NULL strips str.isspace() characters. No copy. */
int jinja_str_strip(struct jrender *r, int line, const jv *s, const jv *chars, bool left,
                    bool right, jv *out);
/* str.upper/lower/title/capitalize, code point by code point. */
int jinja_str_case(struct jrender *r, int line, const jv *s, enum jcase how, jv *out);
/* The first occurrence of n in h, or NULL (linear: glibc's memmem). */
const char *jinja_str_find(const char *h, size_t hl, const char *n, size_t nl);
/* str.replace(old, new, count) (count < 0: all). */
int jinja_str_replace(struct jrender *r, int line, const jv *s, const jv *old, const jv *new_,
                      int64_t count, jv *out);
/* str.split(sep, maxsplit) (sep NULL or none: runs of whitespace; maxsplit < 0: no limit). */
int jinja_str_split(struct jrender *r, int line, const jv *s, const jv *sep, int64_t maxsplit,
                    jv *out);
/* str.startswith / endswith (start false) with a string or a tuple of strings. */
int jinja_str_affix(struct jrender *r, int line, const jv *s, const jv *arg, bool start, jv *out);
/* sep.join(str(item) for item in seq), item's attribute attr when given. */
int jinja_join(struct jrender *r, int line, const jv *seq, const jv *sep, const jv *attr, jv *out);

#endif
