/* A Jinja2 interpreter for the subset that real Hugging Face `chat_template`s use, rendering the
 * same text as Python's jinja2 (as transformers' apply_chat_template configures it: trim_blocks
 * and lstrip_blocks on, autoescape off) and as npm @huggingface/jinja. Pure: no I/O, no global
 * state; a compiled template may be rendered by several threads at once.
 *
 * Supported: text, {{ expr }}, {% if/elif/else %}, {% for x in y %} (with loop.index, index0,
 * first, last, length, revindex, previtem/nextitem, `if` filters, else), {% set %} (also
 * namespace attributes and block set), {% macro %}/call of macros, whitespace control (-, +),
 * comments; literals (strings, ints, floats, true/false/none, lists, dicts), `in`, `not in`,
 * `is` tests (defined, undefined, none, string, number, mapping, iterable, sequence, boolean,
 * integer, float, true, false, odd, even, divisibleby, equalto/eq...), and/or/not, comparisons,
 * + - * / // % ~, conditional expressions, subscripts and slices, attribute access, filters
 * (trim, length/count, tojson (with indent), upper, lower, title, capitalize, replace, join,
 * default/d, first, last, list, string, int, float, abs, items, keys/values via methods, map
 * (attribute), select/reject/selectattr/rejectattr, unique, reverse, sort, safe, e/escape,
 * indent, wordcount, round, sum, max/min, dictsort, batch is not required), string methods
 * (strip/lstrip/rstrip, split, startswith, endswith, upper, lower, replace, title, format not
 * required), dict methods (items, keys, values, get), list methods (append via set not
 * required), globals raise_exception(msg), namespace(...), range(...), and strftime_now(fmt)
 * where the template calls it.
 *
 * Anything else is an error at compile time (an unknown tag) or at render time (an unknown filter
 * or test, calling something that is not callable), never silently skipped. Errors return
 * PAGODA_EINVAL (template syntax) or PAGODA_EFORMAT/PAGODA_ERANGE (rendering: a type error, a
 * limit), with a detail through pagoda_error_set() that starts with "line N: ". A template's
 * raise_exception(msg) gives PAGODA_EINVAL with the detail "line N: raise_exception: msg".
 *
 * Rendering is bounded: at most JINJA_MAX_OUTPUT_BYTES of output, JINJA_MAX_STEPS evaluation
 * steps and JINJA_MAX_DEPTH of nesting (macros, expressions), each PAGODA_ERANGE when exceeded,
 * so that no template or input can hang or exhaust the process. */
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
