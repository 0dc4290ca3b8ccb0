/* A Jinja2 interpreter for the subset that real Hugging Face `chat_template`s use, rendering the
 * same text as Python's jinja2 (as transformers' apply_chat_template configures it: trim_blocks
 * and lstrip_blocks on, autoescape off) and as npm @huggingface/jinja. Pure: no I/O, no global
 * state; a compiled template may be rendered by several threads at once.
 *
 * Supported: text, {{ expr }}, {% if/elif/else %}, {% for x in y %} and {% for a, b in y %} (with
 * loop.index, index0, first, last, length, revindex, revindex0, previtem/nextitem, depth, an `if`
 * filter, else, break and continue), {% set %} (names, several names, namespace attributes, and
 * block set), {% macro %} with defaults and keyword arguments, whitespace control (-, +), comments,
 * and transformers' {% generation %} tags (ignored); literals (strings with Python's escapes,
 * ints, floats, true/false/none, lists, tuples, dicts), `in`, `not in`, `is` tests (defined,
 * undefined, none, string, number, integer, float, boolean, mapping, iterable, sequence,
 * callable, true, false, odd, even, divisibleby, equalto/eq, ne, lt/le/gt/ge, in, lower, upper,
 * sameas), and/or/not, comparisons (chained), + - * / // % ** ~, conditional expressions,
 * subscripts and slices, attribute access; filters trim, length/count, tojson (indent,
 * ensure_ascii, separators, sort_keys), upper, lower, title, capitalize, replace, join,
 * default/d, first, last, list, string, int, float, abs, round, items, dictsort, map (attribute=
 * or a filter name), select/reject/selectattr/rejectattr, unique, reverse, sort, sum, max, min,
 * safe, e/escape, indent, wordcount; string methods strip/lstrip/rstrip (with chars), split,
 * startswith/endswith (a string or a tuple), upper, lower, title, capitalize, replace, find,
 * count, join; dict methods items, keys, values, get; globals raise_exception(msg),
 * namespace(...), range(...) (at most 100000 items, as jinja2's sandbox) and strftime_now(fmt).
 * Not supported: call and filter blocks, recursive loops, raw, include/extends/import, *args and
 * **kwargs, and methods that mutate (list.append).
 *
 * Semantics are Python's where the two references differ (docs/chat-templates.md lists where
 * @huggingface/jinja departs from them): str() of None is "None" and of True "True", == is typed,
 * strings are indexed and sliced by code point, strip() strips str.isspace() characters, an
 * undefined value is an error as an operand, an object or a callee; tojson is transformers'
 * (json.dumps with ensure_ascii off, keys in their order, ", " and ": ").
 *
 * Anything else is an error at compile time, or at render time (a type error, calling something
 * that is not callable: PAGODA_EFORMAT), never silently skipped. Compile errors tell what jinja2
 * would refuse as well from what it would take: PAGODA_EINVAL for a template that is not Jinja
 * (a syntax error, a tag, filter or test that jinja2 does not have either, invalid UTF-8);
 * PAGODA_EUNSUPPORTED for valid jinja2 beyond this subset (the tags, filters and tests above
 * that are not supported, jinja2's other filters and tests, integer literals in base 16, 8 or 2,
 * nested tuples in targets, a block set's filter, a surrogate escape; a filter or test no Jinja
 * knows where jinja2 only fails if it runs: under an if or in a conditional expression; the
 * whole list in docs/chat-templates.md); PAGODA_ERANGE for a limit
 * of this interpreter (a source over JINJA_MAX_SOURCE_BYTES, nesting deeper than
 * JINJA_MAX_DEPTH, a number literal over 64 bits). Every detail set through pagoda_error_set()
 * starts with "line N: ". A template's raise_exception(msg) gives PAGODA_EINVAL with the detail
 * "line N: raise_exception: msg".
 *
 * Rendering is bounded: at most JINJA_MAX_OUTPUT_BYTES of output, JINJA_MAX_STEPS evaluation
 * steps (each statement, expression and loop iteration, and work proportional to the data an
 * operation walks: bytes copied, compared or scanned, elements visited, in comparisons and ==
 * as in filters and methods) and JINJA_MAX_DEPTH of nesting (macros, expressions), and a memory
 * bound of its own for intermediate values, each PAGODA_ERANGE when exceeded, so that no template
 * or input can hang or exhaust the process. */
#ifndef PAGODA_CHAT_JINJA_H
#define PAGODA_CHAT_JINJA_H

#include <stddef.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

#define JINJA_MAX_SOURCE_BYTES (1u << 20)
#define JINJA_MAX_OUTPUT_BYTES (16u << 20)
#define JINJA_MAX_STEPS 10000000u
#define JINJA_MAX_DEPTH 256u

typedef struct JinjaTemplate JinjaTemplate;

/* Compiles a template's source (need not be NUL-terminated). On success *out is the caller's,
 * freed with jinja_template_free. */
int jinja_template_new(const char *source, size_t len, JinjaTemplate **out);

/* Frees a template; accepts NULL. */
void jinja_template_free(JinjaTemplate *tpl);

/* Renders tpl with the variables of the JSON object vars (e.g. messages, add_generation_prompt,
 * bos_token, eos_token, tools); vars stays the caller's. On success *out is a NUL-terminated
 * string of *out_len bytes, the caller's to free(). */
int jinja_render(const JinjaTemplate *tpl, const json_t *vars, char **out, size_t *out_len);

#ifdef __cplusplus
}
#endif

#endif
