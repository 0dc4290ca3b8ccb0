/* The Jinja lexer: source bytes to tokens, as jinja2's lexer splits them with the environment
 * transformers gives chat templates (trim_blocks and lstrip_blocks on, keep_trailing_newline off),
 * which is also what npm @huggingface/jinja applies:
 *
 *   - line endings (\r\n, \r) become \n, and one newline at the very end is dropped;
 *   - lstrip_blocks: spaces and tabs between the start of a line and a {% or {# are dropped
 *     (not before {{, and not when the tag opens with {%+);
 *   - trim_blocks: the newline right after a %} or #} is dropped (not after }}, nor after +%});
 *   - a - inside a tag's delimiter ({%- -%} {{- -}} {#- -#}) drops all whitespace before / after.
 *
 * Inside a tag, }} and %} close it only when no bracket is open, so that {{ {'a': {'b': 1}} }}
 * reads as jinja2 reads it. String literals are decoded here (Python's escapes). */
#include "chat/jinja_internal.h"

#include "common/error.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

struct lexer {
    struct jinja_arena *a;
    const char *src;
    size_t len, pos;
    int line;
    struct jtoken *toks;
    size_t n, cap;
};

/* PAGODA_EINVAL with "line N: <msg><what>" (what: the offending text, or NULL). */
static int lex_fail(int line, const char *msg, const char *what)
{
    return pagoda_error_set(PAGODA_EINVAL, "line %d: %s%s", line, msg, what ? what : "");
}

static int push(struct lexer *lx, struct jtoken t)
{
    if (lx->n == lx->cap) {
        size_t cap = lx->cap ? lx->cap * 2 : 64;
        struct jtoken *nt = jinja_arena_alloc(lx->a, cap * sizeof(*nt));
        if (nt == NULL)
            return pagoda_error_set(PAGODA_ERANGE, "line %d: template too large to compile",
                                    t.line);
        if (lx->n)
            memcpy(nt, lx->toks, lx->n * sizeof(*nt));
        lx->toks = nt;
        lx->cap = cap;
    }
    lx->toks[lx->n++] = t;
    return 0;
}

static int count_lines(const char *p, size_t n)
{
    int lines = 0;
    for (size_t i = 0; i < n; i++)
        lines += p[i] == '\n';
    return lines;
}

/* Skips whitespace (str.isspace()) from pos; returns the new position. */
static size_t skip_space(const char *s, size_t len, size_t pos)
{
    while (pos < len) {
        uint32_t cp;
        size_t k = jinja_u8_next(s + pos, len - pos, &cp);
        if (!jinja_is_space(cp))
            break;
        pos += k;
    }
    return pos;
}

/* The length of text once trailing whitespace (str.isspace()) is dropped. */
static size_t rstrip_len(const char *s, size_t len)
{
    size_t i = 0, keep = 0;
    while (i < len) {
        uint32_t cp;
        size_t k = jinja_u8_next(s + i, len - i, &cp);
        i += k;
        if (!jinja_is_space(cp))
            keep = i;
    }
    return keep;
}

static int emit_text(struct lexer *lx, size_t begin, size_t end, int line)
{
    if (end <= begin)
        return 0;
    struct jtoken t = {.kind = JT_TEXT, .line = line, .p = lx->src + begin, .len = end - begin};
    return push(lx, t);
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static size_t put_utf8(char *o, uint32_t cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* A string literal from the quote at lx->pos: decoded into the arena (never longer than its
 * source, since every escape is at least as long as the bytes it stands for). */
static int lex_string(struct lexer *lx)
{
    char quote = lx->src[lx->pos];
    int line = lx->line;
    size_t i = lx->pos + 1;
    size_t end = i;
    while (end < lx->len && lx->src[end] != quote) {
        if (lx->src[end] == '\\')
            end++;
        end++;
    }
    if (end >= lx->len)
        return lex_fail(line, "unterminated string literal", NULL);
    char *o = jinja_arena_alloc(lx->a, end - i + 1);
    if (o == NULL)
        return pagoda_error_set(PAGODA_ERANGE, "line %d: template too large to compile", line);
    size_t n = 0;
    while (i < end) {
        char c = lx->src[i];
        if (c != '\\') {
            o[n++] = c;
            i++;
            continue;
        }
        char e = lx->src[i + 1];
        i += 2;
        uint32_t cp;
        int digits = 0;
        switch (e) {
        case 'n':
            o[n++] = '\n';
            continue;
        case 't':
            o[n++] = '\t';
            continue;
        case 'r':
            o[n++] = '\r';
            continue;
        case 'b':
            o[n++] = '\b';
            continue;
        case 'f':
            o[n++] = '\f';
            continue;
        case 'v':
            o[n++] = '\v';
            continue;
        case 'a':
            o[n++] = '\a';
            continue;
        case '\\':
            o[n++] = '\\';
            continue;
        case '\'':
            o[n++] = '\'';
            continue;
        case '"':
            o[n++] = '"';
            continue;
        case '\n':
            continue; /* a backslash-newline continues the line */
        case 'x':
            digits = 2;
            break;
        case 'u':
            digits = 4;
            break;
        case 'U':
            digits = 8;
            break;
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (int k = 0; k < 2 && i < end && lx->src[i] >= '0' && lx->src[i] <= '7'; k++)
                    cp = cp * 8 + (uint32_t)(lx->src[i++] - '0');
                n += put_utf8(o + n, cp);
                continue;
            }
            /* Python keeps an unknown escape as it is written. */
            o[n++] = '\\';
            i--;
            continue;
        }
        cp = 0;
        for (int k = 0; k < digits; k++) {
            int h = i + (size_t)k < end ? hexval(lx->src[i + (size_t)k]) : -1;
            if (h < 0)
                return lex_fail(line, "truncated \\x, \\u or \\U escape in a string", NULL);
            cp = cp * 16 + (uint32_t)h;
        }
        i += (size_t)digits;
        if (cp > 0x10FFFF)
            return lex_fail(line, "escape outside Unicode scalar values in a string", NULL);
        if (cp >= 0xD800 && cp <= 0xDFFF) /* Python's str holds a lone surrogate; UTF-8 cannot */
            return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                    "line %d: a surrogate escape in a string is not supported",
                                    line);
        n += put_utf8(o + n, cp);
    }
    o[n] = '\0';
    lx->line += count_lines(lx->src + lx->pos, end + 1 - lx->pos);
    lx->pos = end + 1;
    struct jtoken t = {.kind = JT_STRING, .line = line, .p = o, .len = n};
    return push(lx, t);
}

static bool is_digit(char c)
{
    return c >= '0' && c <= '9';
}

static bool is_name_start(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}

/* Digits with jinja2's optional single underscores between them (1_000). */
static size_t scan_digits(const char *s, size_t len, size_t pos)
{
    while (pos < len &&
           (is_digit(s[pos]) || (s[pos] == '_' && pos + 1 < len && is_digit(s[pos + 1]) &&
                                 pos > 0 && is_digit(s[pos - 1]))))
        pos++;
    return pos;
}

static int lex_number(struct lexer *lx)
{
    const char *s = lx->src;
    size_t start = lx->pos, pos = scan_digits(s, lx->len, lx->pos);
    if (pos == start + 1 && s[start] == '0' && pos < lx->len && memchr("xXoObB", s[pos], 6) != NULL)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "line %d: integer literals in base 16, 8 or 2 are not supported",
                                lx->line);
    bool is_float = false;
    bool after_dot =
        lx->n > 0 && lx->toks[lx->n - 1].kind == JT_OP && lx->toks[lx->n - 1].op == JOP_DOT;
    if (!after_dot && pos + 1 < lx->len && s[pos] == '.' && is_digit(s[pos + 1])) {
        pos = scan_digits(s, lx->len, pos + 1);
        is_float = true;
    }
    if (!after_dot && pos < lx->len && (s[pos] == 'e' || s[pos] == 'E')) {
        size_t q = pos + 1;
        if (q < lx->len && (s[q] == '+' || s[q] == '-'))
            q++;
        if (q < lx->len && is_digit(s[q])) {
            pos = scan_digits(s, lx->len, q);
            is_float = true;
        }
    }
    char buf[128];
    size_t n = 0;
    for (size_t i = start; i < pos && n + 1 < sizeof(buf); i++)
        if (s[i] != '_')
            buf[n++] = s[i];
    buf[n] = '\0';
    if (pos - start >= sizeof(buf)) /* a limit of ours: jinja2 takes any length */
        return pagoda_error_set(PAGODA_ERANGE, "line %d: number literal too long", lx->line);
    struct jtoken t = {.line = lx->line};
    if (is_float) {
        t.kind = JT_FLOAT;
        t.fval = strtod(buf, NULL);
    } else {
        errno = 0;
        unsigned long long v = strtoull(buf, NULL, 10);
        if (errno == ERANGE || v > INT64_MAX) /* Python's ints have no bound */
            return pagoda_error_set(PAGODA_ERANGE, "line %d: integer literal out of 64-bit range",
                                    lx->line);
        t.kind = JT_INT;
        t.ival = (int64_t)v;
    }
    lx->pos = pos;
    return push(lx, t);
}

static const struct {
    const char *s;
    enum jop op;
} OPS[] = {
    {"//", JOP_FLOORDIV}, {"**", JOP_POW},     {"==", JOP_EQ},      {"!=", JOP_NE},
    {"<=", JOP_LE},       {">=", JOP_GE},      {"+", JOP_ADD},      {"-", JOP_SUB},
    {"*", JOP_MUL},       {"/", JOP_DIV},      {"%", JOP_MOD},      {"~", JOP_TILDE},
    {"<", JOP_LT},        {">", JOP_GT},       {"=", JOP_ASSIGN},   {"(", JOP_LPAREN},
    {")", JOP_RPAREN},    {"[", JOP_LBRACKET}, {"]", JOP_RBRACKET}, {"{", JOP_LBRACE},
    {"}", JOP_RBRACE},    {",", JOP_COMMA},    {".", JOP_DOT},      {":", JOP_COLON},
    {"|", JOP_PIPE},
};

/* The inside of a {% %} or {{ }} tag, from lx->pos (after the opening delimiter and its
 * modifier) to the closing delimiter, which it consumes with its whitespace rules. */
static int lex_tag(struct lexer *lx, bool block, int open_line)
{
    const char *s = lx->src;
    char close = block ? '%' : '}';
    int nesting = 0;
    for (;;) {
        /* whitespace inside a tag */
        while (lx->pos < lx->len &&
               (s[lx->pos] == ' ' || s[lx->pos] == '\t' || s[lx->pos] == '\n' ||
                s[lx->pos] == '\r' || s[lx->pos] == '\f' || s[lx->pos] == '\v')) {
            lx->line += s[lx->pos] == '\n';
            lx->pos++;
        }
        if (lx->pos >= lx->len)
            return lex_fail(open_line, block ? "unclosed {% tag" : "unclosed {{ tag", NULL);
        size_t rem = lx->len - lx->pos;
        const char *p = s + lx->pos;
        if (nesting == 0) {
            bool minus = rem >= 3 && p[0] == '-' && p[1] == close && p[2] == '}';
            bool plus = block && rem >= 3 && p[0] == '+' && p[1] == close && p[2] == '}';
            if (minus || plus || (rem >= 2 && p[0] == close && p[1] == '}')) {
                struct jtoken t = {.kind = block ? JT_BLOCK_END : JT_VAR_END, .line = lx->line};
                int rc = push(lx, t);
                if (rc != 0)
                    return rc;
                lx->pos += (minus || plus) ? 3 : 2;
                if (minus) {
                    size_t q = skip_space(s, lx->len, lx->pos);
                    lx->line += count_lines(s + lx->pos, q - lx->pos);
                    lx->pos = q;
                } else if (block && !plus && lx->pos < lx->len && s[lx->pos] == '\n') {
                    lx->pos++; /* trim_blocks */
                    lx->line++;
                }
                return 0;
            }
        }
        char c = p[0];
        int rc;
        if (c == '\'' || c == '"') {
            rc = lex_string(lx);
        } else if (is_digit(c)) {
            rc = lex_number(lx);
        } else if (is_name_start(c)) {
            size_t q = lx->pos;
            while (q < lx->len && (is_name_start(s[q]) || is_digit(s[q])))
                q++;
            struct jtoken t = {.kind = JT_NAME, .line = lx->line, .p = p, .len = q - lx->pos};
            lx->pos = q;
            rc = push(lx, t);
        } else {
            size_t k;
            for (k = 0; k < sizeof(OPS) / sizeof(OPS[0]); k++) {
                size_t ol = strlen(OPS[k].s);
                if (rem >= ol && memcmp(p, OPS[k].s, ol) == 0)
                    break;
            }
            if (k == sizeof(OPS) / sizeof(OPS[0])) {
                char what[8];
                uint32_t cp;
                size_t cl = jinja_u8_next(p, rem, &cp);
                memcpy(what, p, cl);
                what[cl] = '\0';
                return lex_fail(lx->line, "unexpected character in a tag: ", what);
            }
            enum jop op = OPS[k].op;
            if (op == JOP_LPAREN || op == JOP_LBRACKET || op == JOP_LBRACE) {
                if (++nesting > (int)JINJA_MAX_DEPTH)
                    return pagoda_error_set(PAGODA_ERANGE,
                                            "line %d: brackets nested deeper than %u", lx->line,
                                            JINJA_MAX_DEPTH);
            } else if (op == JOP_RPAREN || op == JOP_RBRACKET || op == JOP_RBRACE) {
                if (nesting > 0)
                    nesting--;
            }
            struct jtoken t = {.kind = JT_OP, .op = op, .line = lx->line};
            lx->pos += strlen(OPS[k].s);
            rc = push(lx, t);
        }
        if (rc != 0)
            return rc;
    }
}

/* Line endings to \n, as jinja2 reads a source; the result is in the arena when it differs. */
static int normalize(struct lexer *lx)
{
    if (memchr(lx->src, '\r', lx->len) == NULL)
        return 0;
    char *o = jinja_arena_alloc(lx->a, lx->len);
    if (o == NULL)
        return pagoda_error_set(PAGODA_ERANGE, "template too large to compile");
    size_t n = 0;
    for (size_t i = 0; i < lx->len; i++) {
        if (lx->src[i] == '\r') {
            o[n++] = '\n';
            if (i + 1 < lx->len && lx->src[i + 1] == '\n')
                i++;
        } else {
            o[n++] = lx->src[i];
        }
    }
    lx->src = o;
    lx->len = n;
    return 0;
}

static int check_utf8(const char *s, size_t len)
{
    int line = 1;
    for (size_t i = 0; i < len;) {
        uint32_t cp;
        size_t k = jinja_u8_next(s + i, len - i, &cp);
        if (cp == 0xFFFFFFFFu)
            return pagoda_error_set(PAGODA_EINVAL, "line %d: invalid UTF-8 in the template", line);
        line += s[i] == '\n';
        i += k;
    }
    return 0;
}

int jinja_lex(struct jinja_arena *a, const char *source, size_t len, struct jtoken **out,
              size_t *count)
{
    int rc = check_utf8(source, len);
    if (rc != 0)
        return rc;
    struct lexer lx = {.a = a, .src = source, .len = len, .line = 1};
    if ((rc = normalize(&lx)) != 0)
        return rc;
    if (lx.len > 0 && lx.src[lx.len - 1] == '\n')
        lx.len--; /* keep_trailing_newline=False */
    const char *s = lx.src;
    while (lx.pos < lx.len) {
        /* the text up to the next tag */
        size_t tag = lx.pos;
        while (tag + 1 < lx.len &&
               !(s[tag] == '{' && (s[tag + 1] == '{' || s[tag + 1] == '%' || s[tag + 1] == '#')))
            tag++;
        if (tag + 1 >= lx.len)
            tag = lx.len;
        size_t text_begin = lx.pos, text_end = tag;
        int text_line = lx.line;
        if (tag == lx.len) {
            if ((rc = emit_text(&lx, text_begin, text_end, text_line)) != 0)
                return rc;
            break;
        }
        char kind = s[tag + 1];
        char mod = tag + 2 < lx.len ? s[tag + 2] : '\0';
        if (mod == '-') {
            text_end = text_begin + rstrip_len(s + text_begin, text_end - text_begin);
        } else if (kind != '{' && mod != '+') {
            /* lstrip_blocks: only spaces and tabs back to the start of the line */
            size_t q = text_end;
            while (q > text_begin && (s[q - 1] == ' ' || s[q - 1] == '\t'))
                q--;
            if ((q > text_begin && s[q - 1] == '\n') ||
                (q == text_begin && (q == 0 || s[q - 1] == '\n')))
                text_end = q;
        }
        if ((rc = emit_text(&lx, text_begin, text_end, text_line)) != 0)
            return rc;
        lx.line += count_lines(s + lx.pos, tag - lx.pos);
        lx.pos = tag + 2 + ((mod == '-' || (mod == '+' && kind != '{')) ? 1 : 0);
        int open_line = lx.line;
        if (kind == '#') {
            /* a comment: to the next #}, with its own - and trim_blocks */
            size_t q = lx.pos;
            while (q + 1 < lx.len && !(s[q] == '#' && s[q + 1] == '}'))
                q++;
            if (q + 1 >= lx.len && lx.pos >= lx.len) /* jinja2 drops a {# that ends the source */
                return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                        "line %d: a '{#' at the end of the template is not "
                                        "supported",
                                        open_line);
            if (q + 1 >= lx.len)
                return lex_fail(open_line, "unclosed comment {#", NULL);
            bool minus = q > lx.pos && s[q - 1] == '-';
            bool plus = q > lx.pos && s[q - 1] == '+';
            lx.line += count_lines(s + lx.pos, q + 2 - lx.pos);
            lx.pos = q + 2;
            if (minus) {
                size_t r = skip_space(s, lx.len, lx.pos);
                lx.line += count_lines(s + lx.pos, r - lx.pos);
                lx.pos = r;
            } else if (!plus && lx.pos < lx.len && s[lx.pos] == '\n') {
                lx.pos++;
                lx.line++;
            }
            continue;
        }
        if (kind == '%') {
            /* {% raw %}: its body is text to jinja2, which this lexer would read as tags */
            size_t q = skip_space(s, lx.len, lx.pos);
            if (lx.len - q >= 3 && memcmp(s + q, "raw", 3) == 0 &&
                (lx.len - q == 3 || !(is_name_start(s[q + 3]) || is_digit(s[q + 3]))))
                return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                        "line %d: the 'raw' tag is not supported", open_line);
        }
        struct jtoken t = {.kind = kind == '%' ? JT_BLOCK_BEGIN : JT_VAR_BEGIN, .line = open_line};
        if ((rc = push(&lx, t)) != 0)
            return rc;
        if ((rc = lex_tag(&lx, kind == '%', open_line)) != 0)
            return rc;
    }
    struct jtoken eof = {.kind = JT_EOF, .line = lx.line};
    if ((rc = push(&lx, eof)) != 0)
        return rc;
    *out = lx.toks;
    *count = lx.n;
    return 0;
}
