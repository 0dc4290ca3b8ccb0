#include "gateway/tool_calls.h"

#include "common/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define LIT_LEN(s) (sizeof(s) - 1)
#define NOT_FOUND ((size_t)-1)

static const char HERMES_START[] = "<tool_call>";
static const char HERMES_END[] = "</tool_call>";
static const char PYTHON_TAG[] = "<|python_tag|>";

int tool_call_parser_from_name(const char *name, enum tool_call_parser *out)
{
    if (strcmp(name, "hermes") == 0)
        *out = TOOL_CALL_PARSER_HERMES;
    else if (strcmp(name, "llama3_json") == 0)
        *out = TOOL_CALL_PARSER_LLAMA3_JSON;
    else
        return pagoda_error_set(PAGODA_EINVAL,
                                "--tool-call-parser %s: expected hermes or llama3_json", name);
    return 0;
}

/* ---- the parts of a call ------------------------------------------------------------------ */

/* vLLM's make_tool_call_id: "chatcmpl-tool-" and 16 random bytes in hex. Where the kernel has no
 * entropy to give at once, the clock and a counter, mixed (an id only has to be unique). */
static void new_id(char id[TOOL_CALL_ID_BYTES])
{
    uint64_t r[2];
    if (getrandom(r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
        static uint64_t counter;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        uint64_t x = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^
                     (__atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED) << 40);
        for (int i = 0; i < 2; i++) { /* splitmix64 */
            x += 0x9e3779b97f4a7c15ull;
            uint64_t z = x;
            z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
            z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
            r[i] = z ^ (z >> 31);
        }
    }
    snprintf(id, TOOL_CALL_ID_BYTES, "chatcmpl-tool-%016llx%016llx", (unsigned long long)r[0],
             (unsigned long long)r[1]);
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    return i;
}

/* Past the string at s[i] (its opening quote), in JSON that jansson has read. */
static size_t skip_string(const char *s, size_t n, size_t i)
{
    for (i++; i < n && s[i] != '"'; i++)
        if (s[i] == '\\')
            i++;
    return i + 1;
}

/* Past the value at s[i], in JSON that jansson has read. */
static size_t skip_value(const char *s, size_t n, size_t i)
{
    if (s[i] == '"')
        return skip_string(s, n, i);
    if (s[i] == '{' || s[i] == '[') {
        size_t depth = 0;
        while (i < n) {
            if (s[i] == '"') {
                i = skip_string(s, n, i);
                continue;
            }
            if (s[i] == '{' || s[i] == '[')
                depth++;
            else if ((s[i] == '}' || s[i] == ']') && --depth == 0)
                return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && s[i] != ',' && s[i] != '}' && s[i] != ']' && s[i] != ' ' && s[i] != '\t' &&
           s[i] != '\n' && s[i] != '\r')
        i++;
    return i;
}

/* Whether the key at s[start, end) (with its quotes) is key, escapes read as JSON reads them. */
static bool key_is(const char *s, size_t start, size_t end, const char *key)
{
    size_t n = strlen(key);
    if (memchr(s + start, '\\', end - start) == NULL)
        return end - start == n + 2 && memcmp(s + start + 1, key, n) == 0;
    json_t *k = json_loadb(s + start, end - start, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
    bool same = json_string_length(k) == n && memcmp(json_string_value(k), key, n) == 0;
    json_decref(k);
    return same;
}

/* The text of the top-level member key of the object in s (which jansson has read), the last one
 * where the key repeats (jansson keeps the last, as Python's json does), into [*start, *end). */
static void member_text(const char *s, size_t n, const char *key, size_t *start, size_t *end)
{
    size_t i = skip_ws(s, n, 0) + 1; /* past '{' */
    while (i < n) {
        i = skip_ws(s, n, i);
        if (i >= n || s[i] == '}')
            return;
        size_t key_start = i;
        i = skip_string(s, n, i);
        bool match = key_is(s, key_start, i, key);
        i = skip_ws(s, n, skip_ws(s, n, i) + 1); /* past ':' */
        size_t value_start = i;
        i = skip_value(s, n, i);
        if (match) {
            *start = value_start;
            *end = i;
        }
        i = skip_ws(s, n, i);
        if (i < n && s[i] == ',')
            i++;
    }
}

/* One call's JSON, body[0, n), into *call: 0, 1 where it is not a call (malformed: not a JSON
 * object with a string "name" and "arguments", or for llama3_json "parameters"), or
 * PAGODA_ENOMEM. */
static int make_call(enum tool_call_parser parser, const char *body, size_t n,
                     struct tool_call *call)
{
    /* as Python's json reads it: integers past 64 bits, and "\u0000" in a string (the arguments
     * are given out as the model wrote them; only a name with a NUL is not one) */
    json_t *root = json_loadb(body, n, JSON_DECODE_INT_AS_REAL | JSON_ALLOW_NUL, NULL);
    const json_t *name_value = json_object_get(root, "name");
    const char *name = json_string_value(name_value);
    if (name != NULL && strlen(name) != json_string_length(name_value))
        name = NULL;
    const char *key = "arguments";
    if (parser == TOOL_CALL_PARSER_LLAMA3_JSON && json_object_get(root, key) == NULL)
        key = "parameters"; /* Llama 3's prompt asks for "parameters" */
    if (!json_is_object(root) || name == NULL || json_object_get(root, key) == NULL) {
        json_decref(root);
        return 1;
    }
    size_t start = 0, end = 0;
    member_text(body, n, key, &start, &end);
    call->name = strdup(name);
    call->arguments = strndup(body + start, end - start);
    json_decref(root);
    if (call->name == NULL || call->arguments == NULL) {
        free(call->name);
        free(call->arguments);
        return PAGODA_ENOMEM;
    }
    new_id(call->id);
    return 0;
}

/* ---- output ---------------------------------------------------------------------------------- */

static int append(char **buf, size_t *len, size_t *cap, const char *s, size_t n)
{
    if (*len + n + 1 > *cap) {
        size_t want = *cap ? *cap : 64;
        while (want < *len + n + 1)
            want *= 2;
        char *b = realloc(*buf, want);
        if (b == NULL)
            return PAGODA_ENOMEM;
        *buf = b;
        *cap = want;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
    return 0;
}

void tool_calls_output_clear(struct tool_calls_output *out)
{
    for (size_t i = 0; i < out->num_calls; i++) {
        free(out->calls[i].name);
        free(out->calls[i].arguments);
    }
    out->num_calls = 0;
    out->content_len = 0;
    if (out->content != NULL)
        out->content[0] = '\0';
}

void tool_calls_output_fini(struct tool_calls_output *out)
{
    tool_calls_output_clear(out);
    free(out->content);
    free(out->calls);
    memset(out, 0, sizeof(*out));
}

/* ---- streams --------------------------------------------------------------------------------- */

enum mode {
    MODE_TEXT,      /* hermes: text, where a call may begin */
    MODE_CALL,      /* hermes: after <tool_call>, its </tool_call> awaited */
    MODE_START,     /* llama3_json: the output's start (whitespace, <|python_tag|>) */
    MODE_OBJECT,    /* llama3_json: a call's object, its end awaited */
    MODE_SEPARATOR, /* llama3_json: after a call, whitespace and ';' before the next */
    MODE_PLAIN,     /* llama3_json: text to the end */
};

struct tool_calls_stream {
    enum tool_call_parser parser;
    enum mode mode;
    /* The output not given out yet: a suffix that may begin a marker, a call's text, and in
     * llama3_json's object what came before it (given out as text should the call be
     * malformed). */
    char *held;
    size_t held_len, held_cap;
    /* MODE_CALL: where in held the end marker may begin; MODE_OBJECT: held scanned so far, and
     * where the object begins, with the scan's state; MODE_TEXT after a call, MODE_START and
     * MODE_SEPARATOR: the whitespace held scanned so far (each piece is scanned once, never the
     * whole held text again: a model that writes whitespace for ever cost the loop quadratic
     * time). */
    size_t scanned, object_start;
    bool tag_seen;  /* MODE_START: <|python_tag|> was read */
    bool semicolon; /* MODE_SEPARATOR: the ';' was read */
    size_t depth;
    bool in_string, escaped;
    bool after_call; /* hermes: only whitespace since the last call (held, dropped before the
                      * next call and at the end) */
    bool malformed;
    uint32_t num_calls;
    size_t content_out;         /* content given out so far */
    size_t content_before_call; /* of it, before the first call */
};

int tool_calls_stream_new(enum tool_call_parser parser, struct tool_calls_stream **out)
{
    *out = NULL;
    if (parser != TOOL_CALL_PARSER_HERMES && parser != TOOL_CALL_PARSER_LLAMA3_JSON)
        return pagoda_error_set(PAGODA_EINVAL, "no tool-call parser");
    struct tool_calls_stream *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return PAGODA_ENOMEM;
    s->parser = parser;
    s->mode = parser == TOOL_CALL_PARSER_HERMES ? MODE_TEXT : MODE_START;
    *out = s;
    return 0;
}

void tool_calls_stream_free(struct tool_calls_stream *s)
{
    if (s == NULL)
        return;
    free(s->held);
    free(s);
}

uint32_t tool_calls_stream_num_calls(const struct tool_calls_stream *s)
{
    return s->num_calls;
}

static void consume(struct tool_calls_stream *s, size_t n)
{
    memmove(s->held, s->held + n, s->held_len - n);
    s->held_len -= n;
}

static int emit_text(struct tool_calls_stream *s, struct tool_calls_output *out, const char *text,
                     size_t n)
{
    int rc = append(&out->content, &out->content_len, &out->content_cap, text, n);
    if (rc == 0)
        s->content_out += n;
    return rc;
}

/* A call's text, body[0, n): 0 with the call given out, 1 where it is malformed (nothing given
 * out: the caller gives its text out as content), or PAGODA_ENOMEM. */
static int take_call(struct tool_calls_stream *s, struct tool_calls_output *out, const char *body,
                     size_t n)
{
    if (out->num_calls == out->calls_cap) {
        size_t cap = out->calls_cap ? 2 * out->calls_cap : 4;
        struct tool_call *c = realloc(out->calls, cap * sizeof(*c));
        if (c == NULL)
            return PAGODA_ENOMEM;
        out->calls = c;
        out->calls_cap = cap;
    }
    int rc = make_call(s->parser, body, n, &out->calls[out->num_calls]);
    if (rc == 0) {
        out->num_calls++;
        if (s->num_calls++ == 0)
            s->content_before_call = s->content_out;
        s->after_call = true;
    } else if (rc == 1) {
        s->malformed = true;
        s->after_call = false;
    }
    return rc;
}

/* hermes: a call's text that is not one, body[0, n), as content with its markers (the end
 * marker where it had one). */
static int emit_hermes_text(struct tool_calls_stream *s, struct tool_calls_output *out,
                            const char *body, size_t n, bool end_marker)
{
    int rc;
    if ((rc = emit_text(s, out, HERMES_START, LIT_LEN(HERMES_START))) == 0 &&
        (rc = emit_text(s, out, body, n)) == 0 && end_marker)
        rc = emit_text(s, out, HERMES_END, LIT_LEN(HERMES_END));
    return rc;
}

static size_t find(const char *s, size_t n, size_t from, const char *lit, size_t lit_len)
{
    for (size_t i = from; i + lit_len <= n; i++)
        if (memcmp(s + i, lit, lit_len) == 0)
            return i;
    return NOT_FOUND;
}

/* The longest suffix of s[0, n) that begins lit without being all of it: held back. */
static size_t partial_suffix(const char *s, size_t n, const char *lit, size_t lit_len)
{
    for (size_t k = lit_len - 1 < n ? lit_len - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, lit, k) == 0)
            return k;
    return 0;
}

/* hermes: <tool_call>JSON</tool_call>, text anywhere around (vLLM's regex
 * "<tool_call>(.*?)</tool_call>|<tool_call>(.*)": the first end marker ends a call, and one left
 * open at the end is a call when its JSON is whole). at_end: the output has ended. */
static int run_hermes(struct tool_calls_stream *s, struct tool_calls_output *out, bool at_end)
{
    int rc;
    for (;;) {
        if (s->mode == MODE_TEXT) {
            /* (held[0, scanned) is whitespace after a call: no marker begins there) */
            size_t start =
                find(s->held, s->held_len, s->scanned, HERMES_START, LIT_LEN(HERMES_START));
            size_t text = start != NOT_FOUND ? start
                          : at_end
                              ? s->held_len
                              : s->held_len - partial_suffix(s->held, s->held_len, HERMES_START,
                                                             LIT_LEN(HERMES_START));
            if (s->after_call && skip_ws(s->held, text, s->scanned) == text) {
                if (start == NOT_FOUND && !at_end) {
                    /* the space between two calls, perhaps: held (at most
                     * TOOL_CALLS_MAX_CALL_BYTES of it; more is dropped, as it would be) */
                    if (text > TOOL_CALLS_MAX_CALL_BYTES) {
                        consume(s, text);
                        text = 0;
                    }
                    s->scanned = text;
                    return 0;
                }
            } else if (text > 0) {
                if ((rc = emit_text(s, out, s->held, text)) != 0)
                    return rc;
                s->after_call = false;
            }
            s->scanned = 0;
            if (start == NOT_FOUND) {
                consume(s, text);
                return 0;
            }
            consume(s, start + LIT_LEN(HERMES_START));
            s->mode = MODE_CALL;
            continue;
        }
        size_t end = find(s->held, s->held_len, s->scanned, HERMES_END, LIT_LEN(HERMES_END));
        if (end == NOT_FOUND && !at_end && s->held_len <= TOOL_CALLS_MAX_CALL_BYTES) {
            s->scanned =
                s->held_len >= LIT_LEN(HERMES_END) ? s->held_len - LIT_LEN(HERMES_END) + 1 : 0;
            return 0;
        }
        /* a call; one left open at the end (a call when its JSON is whole); or, past
         * TOOL_CALLS_MAX_CALL_BYTES, text too long to be one */
        size_t body = end != NOT_FOUND ? end : s->held_len;
        rc = end != NOT_FOUND || at_end ? take_call(s, out, s->held, body) : 1;
        if (rc == 1) {
            s->malformed = true;
            s->after_call = false;
            rc = emit_hermes_text(s, out, s->held, body, end != NOT_FOUND);
        }
        if (rc != 0)
            return rc;
        consume(s, end != NOT_FOUND ? end + LIT_LEN(HERMES_END) : s->held_len);
        s->mode = MODE_TEXT;
        s->scanned = 0;
    }
}

/* llama3_json: the output is calls, {"name": ..., "parameters": ...} objects separated by ';'
 * (after whitespace and <|python_tag|>), or text. vLLM's streaming parser decides so from the
 * output's start; its whole-answer parser takes the first such objects anywhere in the text (one
 * level of nesting at most, by its regex): here both decide from the start, at any depth. */
static int run_llama3(struct tool_calls_stream *s, struct tool_calls_output *out, bool at_end)
{
    int rc;
    for (;;) {
        switch (s->mode) {
        case MODE_START: {
            size_t i = skip_ws(s->held, s->held_len, s->scanned), left = s->held_len - i;
            if (!s->tag_seen && left >= LIT_LEN(PYTHON_TAG) &&
                memcmp(s->held + i, PYTHON_TAG, LIT_LEN(PYTHON_TAG)) == 0) {
                s->tag_seen = true;
                i = skip_ws(s->held, s->held_len, i + LIT_LEN(PYTHON_TAG));
            } else if (!s->tag_seen && left > 0 && left < LIT_LEN(PYTHON_TAG) &&
                       memcmp(s->held + i, PYTHON_TAG, left) == 0 && !at_end) {
                s->scanned = i;
                return 0; /* the tag, perhaps */
            }
            if (i == s->held_len && !at_end && i <= TOOL_CALLS_MAX_CALL_BYTES) {
                s->scanned = i;
                return 0;
            }
            if (i < s->held_len && s->held[i] == '{') {
                s->mode = MODE_OBJECT;
                s->object_start = s->scanned = i;
                s->depth = 0;
                s->in_string = s->escaped = false;
            } else {
                s->mode = MODE_PLAIN;
            }
            continue;
        }
        case MODE_OBJECT: {
            size_t end = NOT_FOUND;
            for (; s->scanned < s->held_len && end == NOT_FOUND; s->scanned++) {
                char c = s->held[s->scanned];
                if (s->escaped)
                    s->escaped = false;
                else if (s->in_string && c == '\\')
                    s->escaped = true;
                else if (c == '"')
                    s->in_string = !s->in_string;
                else if (s->in_string)
                    continue;
                else if (c == '{' || c == '[')
                    s->depth++;
                else if ((c == '}' || c == ']') && --s->depth == 0)
                    end = s->scanned + 1;
            }
            if (end == NOT_FOUND) {
                if (!at_end && s->held_len - s->object_start <= TOOL_CALLS_MAX_CALL_BYTES)
                    return 0;
                s->malformed = true; /* unterminated, or too long to be a call */
                s->mode = MODE_PLAIN;
                continue;
            }
            rc = take_call(s, out, s->held + s->object_start, end - s->object_start);
            if (rc < 0)
                return rc;
            if (rc == 1) { /* malformed: text, with what came before it */
                s->mode = MODE_PLAIN;
                continue;
            }
            consume(s, end);
            s->mode = MODE_SEPARATOR;
            s->scanned = 0;
            s->semicolon = false;
            continue;
        }
        case MODE_SEPARATOR: {
            size_t i = skip_ws(s->held, s->held_len, s->scanned);
            if (!s->semicolon && i < s->held_len && s->held[i] == ';') {
                s->semicolon = true;
                i = skip_ws(s->held, s->held_len, i + 1);
            }
            if (i == s->held_len) {
                /* the calls' trailing separators at the end; held meanwhile (at most
                 * TOOL_CALLS_MAX_CALL_BYTES: more is dropped, as it would be) */
                if (at_end || i > TOOL_CALLS_MAX_CALL_BYTES) {
                    consume(s, s->held_len);
                    i = 0;
                }
                s->scanned = i;
                return 0;
            }
            bool next = s->semicolon && s->held[i] == '{';
            s->semicolon = false;
            s->scanned = 0;
            if (next) {
                consume(s, i);
                s->mode = MODE_OBJECT;
                s->object_start = 0;
                s->depth = 0;
                s->in_string = s->escaped = false;
            } else {
                s->mode = MODE_PLAIN; /* text after the calls */
            }
            continue;
        }
        default: /* MODE_PLAIN */
            rc = emit_text(s, out, s->held, s->held_len);
            if (rc == 0)
                consume(s, s->held_len);
            return rc;
        }
    }
}

static int run(struct tool_calls_stream *s, struct tool_calls_output *out, bool at_end)
{
    return s->parser == TOOL_CALL_PARSER_HERMES ? run_hermes(s, out, at_end)
                                                : run_llama3(s, out, at_end);
}

int tool_calls_stream_feed(struct tool_calls_stream *s, const char *text, size_t len,
                           struct tool_calls_output *out)
{
    int rc = append(&s->held, &s->held_len, &s->held_cap, text, len);
    return rc != 0 ? rc : run(s, out, false);
}

int tool_calls_stream_finish(struct tool_calls_stream *s, struct tool_calls_output *out)
{
    return run(s, out, true);
}

/* ---- whole answers --------------------------------------------------------------------------- */

int tool_calls_parse(enum tool_call_parser parser, const char *text, size_t len,
                     struct tool_calls_result *out)
{
    memset(out, 0, sizeof(*out));
    struct tool_calls_stream *s;
    int rc = tool_calls_stream_new(parser, &s);
    if (rc != 0)
        return rc;
    struct tool_calls_output o = {0};
    if ((rc = tool_calls_stream_feed(s, text, len, &o)) == 0 &&
        (rc = tool_calls_stream_finish(s, &o)) == 0 && !s->malformed && o.num_calls > 0) {
        /* vLLM's: the text before the first call, or null; the text after the calls is left
         * out */
        /* (a copy of its length: the text may hold a NUL) */
        if (s->content_before_call > 0) {
            if ((out->content = malloc(s->content_before_call + 1)) == NULL) {
                rc = PAGODA_ENOMEM;
            } else {
                memcpy(out->content, o.content, s->content_before_call);
                out->content[s->content_before_call] = '\0';
            }
        }
        out->content_len = s->content_before_call;
        out->calls = o.calls;
        out->num_calls = o.num_calls;
        o.calls = NULL;
        o.num_calls = o.calls_cap = 0;
    }
    tool_calls_output_fini(&o);
    tool_calls_stream_free(s);
    if (rc != 0)
        tool_calls_result_fini(out);
    return rc;
}

void tool_calls_result_fini(struct tool_calls_result *r)
{
    for (size_t i = 0; i < r->num_calls; i++) {
        free(r->calls[i].name);
        free(r->calls[i].arguments);
    }
    free(r->calls);
    free(r->content);
    memset(r, 0, sizeof(*r));
}
