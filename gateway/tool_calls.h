/* Tool calls parsed out of a chat's generated text, as vLLM's --tool-call-parser does (its
 * vllm/entrypoints/openai/tool_parsers/hermes_tool_parser.py and llama_tool_parser.py): the
 * formats "hermes" (<tool_call>{"name": ..., "arguments": {...}}</tool_call>, any number of
 * them, text allowed before) and "llama3_json" (the output is {"name": ..., "parameters": {...}},
 * several separated by ';', after an optional <|python_tag|>). Pure: no sockets, no gateway
 * state; whole texts (tool_calls_parse) and streams fed piece by piece (tool_calls_stream_*), the
 * two giving the same calls for the same text however it is split.
 *
 * A call is taken when its JSON is an object with a string "name" and an "arguments" (llama3_json:
 * or "parameters"); its arguments are that member's JSON text as the model wrote it (vLLM writes
 * the same value again with Python's json.dumps: its spacing normalized, a real's digits as
 * Python prints them). A call that is not such JSON (malformed) stays text: in a whole answer all
 * of the text is then the content and there are no calls, as vLLM's; in a stream the calls before
 * it have gone out already, and its text goes as content. */
#ifndef PAGODA_GATEWAY_TOOL_CALLS_H
#define PAGODA_GATEWAY_TOOL_CALLS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum tool_call_parser {
    TOOL_CALL_PARSER_NONE,
    TOOL_CALL_PARSER_HERMES,
    TOOL_CALL_PARSER_LLAMA3_JSON,
};

/* The most bytes of one call's text held while its end is awaited: a call that passes it is given
 * up as malformed (its text goes as content). The output's length (max_tokens) bounds it too. */
#define TOOL_CALLS_MAX_CALL_BYTES (1u << 20)

/* "chatcmpl-tool-" and 32 hex digits (vLLM's make_tool_call_id), and the NUL. */
#define TOOL_CALL_ID_BYTES 47

/* "hermes" or "llama3_json" (vLLM's names) into *out. Errors: PAGODA_EINVAL (another name, the
 * detail naming the choices). */
int tool_call_parser_from_name(const char *name, enum tool_call_parser *out);

/* One call. name and arguments are malloc'd, owned by the output or result that holds the call. */
struct tool_call {
    char id[TOOL_CALL_ID_BYTES]; /* a fresh random id */
    char *name;
    char *arguments; /* JSON text */
};

/* What a stream's feed or finish gave: content to show now, and calls completed, appended to what
 * it held. The caller owns it: tool_calls_output_clear empties it for the next piece. */
struct tool_calls_output {
    char *content;
    size_t content_len, content_cap;
    struct tool_call *calls;
    size_t num_calls, calls_cap;
};

void tool_calls_output_clear(struct tool_calls_output *out);
void tool_calls_output_fini(struct tool_calls_output *out);

struct tool_calls_stream;

/* A stream of one choice's output. Errors: PAGODA_EINVAL (parser NONE), PAGODA_ENOMEM. */
int tool_calls_stream_new(enum tool_call_parser parser, struct tool_calls_stream **out);
void tool_calls_stream_free(struct tool_calls_stream *s);

/* The next len bytes of output (UTF-8): appends to out the content that can be shown now (text
 * that may begin a call is held back until it is known not to) and the calls completed. Errors:
 * PAGODA_ENOMEM (the stream then holds what it held). */
int tool_calls_stream_feed(struct tool_calls_stream *s, const char *text, size_t len,
                           struct tool_calls_output *out);

/* The output has ended: appends what was held back, a call left unterminated taken as vLLM takes
 * it (hermes: when its JSON is whole), else as content. Errors: PAGODA_ENOMEM. */
int tool_calls_stream_finish(struct tool_calls_stream *s, struct tool_calls_output *out);

/* The calls the stream has given out so far. */
uint32_t tool_calls_stream_num_calls(const struct tool_calls_stream *s);

/* A whole answer's text parsed (vLLM's extract_tool_calls): with calls, content is the text
 * before the first (NULL where there is none: JSON null); without (none, or one malformed), the
 * whole text and no calls. */
struct tool_calls_result {
    char *content; /* malloc'd, or NULL */
    size_t content_len;
    struct tool_call *calls;
    size_t num_calls;
};

/* Parses text (len bytes of UTF-8) into *out, which tool_calls_result_fini frees. Errors:
 * PAGODA_EINVAL (parser NONE), PAGODA_ENOMEM. */
int tool_calls_parse(enum tool_call_parser parser, const char *text, size_t len,
                     struct tool_calls_result *out);
void tool_calls_result_fini(struct tool_calls_result *r);

#endif
