/* OpenAI's API as pagoda reads and writes it: request bodies of POST /v1/completions and
 * /v1/chat/completions turned into libpagoda's parameters and prompt, and the JSON of responses,
 * stream chunks, usage and errors. Pure: no sockets, no loop; the gateway runs the parsing on
 * libuv's threadpool (a body may be megabytes).
 *
 * Decisions (vLLM's where OpenAI is silent): max_tokens defaults to 16 for completions (OpenAI's)
 * and to the gateway's default (--default-max-tokens) for chats; max_completion_tokens is read as
 * max_tokens; n (1 to OPENAI_MAX_CHOICES) choices are n requests to the router, choice i with
 * seed + i when a seed is given (vLLM's); best_of other than n and echo are refused; logprobs
 * (completions: an integer, chats: true) return the sampled token's log-probability only, so
 * top_logprobs above 0 and completion logprobs above 1 are refused, and tokens are named by their
 * pieces of the text (the router's TokenUpdate.token_text_ends), or "token_id:N" (vLLM's
 * return_tokens_as_token_ids, or no text); a completion's prompt may be a list of strings or of
 * token-id lists (up to OPENAI_MAX_PROMPTS): each prompt has its n choices, prompt p's choice j
 * at index p * n + j (vLLM's order), with seed + j; chat content may be a string or a list of
 * {"type": "text"} parts (joined), other parts are refused. logit_bias maps token ids written
 * as base-10 integers to numbers, each clamped to [-100, 100] (vLLM's); at most
 * PAGODA_MAX_LOGIT_BIAS of them. vLLM's extensions top_k, min_p, repetition_penalty, ignore_eos,
 * stop_token_ids, skip_special_tokens, add_special_tokens, chat_template_kwargs,
 * add_generation_prompt and min_tokens (at most max_tokens, given or defaulted) are read. A chat's
 * tools with tool_choice 'auto' (or none given) need the gateway's tool-call parser (vLLM's
 * --enable-auto-tool-choice --tool-call-parser), whose calls are parsed out of the output
 * (gateway/tool_calls.h); 'required' and a named function are refused (vLLM forces them with
 * guided decoding). */
#ifndef PAGODA_GATEWAY_OPENAI_H
#define PAGODA_GATEWAY_OPENAI_H

#include "client/pagoda.h"
#include "gateway/tool_calls.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#define OPENAI_MAX_STOPS 16u
#define OPENAI_MAX_STOP_TOKEN_IDS 64u
#define OPENAI_MAX_MESSAGES 4096u
/* The most choices (n) a request may ask for: OpenAI's own limit. */
#define OPENAI_MAX_CHOICES 128
/* The most prompts in a completion's list (OpenAI's documented limit of an embedding's list,
 * taken for completions, where it gives none). */
#define OPENAI_MAX_PROMPTS 2048

/* The bodies read: completions, chats, and vLLM's /tokenize (a "prompt" string, or "messages"
 * as a chat's, with add_special_tokens, add_generation_prompt, chat_template_kwargs and tools)
 * and /detokenize ("tokens": the ids). */
enum openai_kind { OPENAI_COMPLETION, OPENAI_CHAT, OPENAI_TOKENIZE, OPENAI_DETOKENIZE };

/* A parsed request. Owns everything the params and prompt point to. */
struct openai_request {
    enum openai_kind kind;
    char *model;
    bool stream, include_usage;
    bool tokens_as_ids; /* vLLM's return_tokens_as_token_ids: logprobs name tokens token_id:N */
    /* A chat whose output is parsed for tool calls (tools with tool_choice auto, and the
     * gateway's parser); NONE for every other request. */
    enum tool_call_parser tool_parser;
    /* parallel_tool_calls (default true): false keeps a choice's first tool call only, as vLLM's
     * maybe_filter_parallel_tool_calls does (a stream's deltas of later calls are left out). */
    bool parallel_tool_calls;
    uint32_t n; /* choices of each prompt: 1 .. OPENAI_MAX_CHOICES */
    pagoda_generate_params params;
    /* The prompt; a completion's list of several is prompt and then more_prompts
     * (openai_prompt()). */
    pagoda_prompt prompt;
    pagoda_prompt *more_prompts;
    uint32_t num_prompts; /* 1 .. OPENAI_MAX_PROMPTS */
    /* Storage the params and prompt borrow. */
    json_t *root;
    char *stops[OPENAI_MAX_STOPS];
    int32_t stop_ids[OPENAI_MAX_STOP_TOKEN_IDS];
    int32_t *logit_bias_ids; /* num_logit_bias of each, or NULL */
    float *logit_bias_values;
    int32_t *prompt_ids;
    pagoda_chat_message *messages;
    char **owned; /* strings made here (joined content parts, tool_calls JSON) */
    size_t num_owned;
    char *tools_json, *kwargs_json;
};

/* An error to answer with: the HTTP status and OpenAI's type and code. */
struct openai_error {
    int status;
    const char *type; /* "invalid_request_error", ... */
    const char *code; /* a short machine-readable code or NULL */
    char message[512];
};

/* Parses body as the request of kind. default_max_tokens applies to chats without max_tokens;
 * tool_parser is the gateway's (NONE: a chat's tools with tool_choice auto are refused). Returns
 * 0, or -1 with *err filled (status 400). */
int openai_parse(enum openai_kind kind, const char *body, size_t len, int32_t default_max_tokens,
                 enum tool_call_parser tool_parser, struct openai_request *req,
                 struct openai_error *err);

void openai_request_fini(struct openai_request *req);

/* Prompt i (0 .. num_prompts - 1) of a parsed request. */
static inline const pagoda_prompt *openai_prompt(const struct openai_request *req, uint32_t i)
{
    return i == 0 ? &req->prompt : &req->more_prompts[i - 1];
}

/* Frees what the params and prompt borrow (the JSON tree, the token ids, the logit bias, the
 * messages, the strings made here) once the request has been sent: a long generation keeps only the
 * few fields its answers read (kind, model, stream, include_usage, params.logprobs, tool_parser).
 * The params' and prompt's pointers are cleared. */
void openai_request_release_prompt(struct openai_request *req);

/* The error for a libpagoda failure code and its detail. */
void openai_error_from_code(int code, const char *detail, struct openai_error *err);

/* {"error": {"message", "type", "param": null, "code"}} as a malloc'd string. */
char *openai_error_json(const struct openai_error *err);

/* The finish_reason name OpenAI uses: "stop", "length", or NULL while running; cancelled and
 * error become "abort" and "error" (vLLM's). A choice that called tools finishes with
 * "tool_calls" instead (openai_out.tools_called). */
const char *openai_finish_reason(pagoda_finish_reason reason);

/* One response, or one stream chunk, as a malloc'd JSON string. id is "cmpl-..." or
 * "chatcmpl-..."; index the choice's; text the text (whole or the delta); logprobs the sampled
 * tokens' (n of them, NULL for none); usage is included when with_usage. */
struct openai_out {
    const struct openai_request *req;
    const char *id;
    long long created;
    const char *model;
    const char *text;
    size_t text_len;
    const int32_t *token_ids;
    const float *logprobs;
    /* With logprobs: where each token's piece of text ends (pagoda_result.token_text_ends), which
     * names the tokens by their text; NULL names them token_id:N. */
    const uint32_t *token_text_ends;
    uint64_t text_offset; /* characters of the output before text (a stream's earlier chunks) */
    uint32_t index;       /* the choice's */
    size_t n;
    pagoda_finish_reason finish;
    const char *stop_string; /* vLLM's stop_reason */
    bool has_stop_token_id;
    int32_t stop_token_id;
    bool with_usage;
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    /* A chat parsed for tool calls (req->tool_parser): the message's (or delta's) content is
     * content, not text (which logprobs still name tokens by); a whole message with calls has
     * null for an empty content; tool_calls are the calls (a stream chunk's, the first of them
     * the choice's call first_tool_call); tools_called (any call of the choice so far) makes the
     * finish "tool_calls", vLLM's. */
    bool tools_parsed, tools_called;
    const char *content;
    size_t content_len;
    const struct tool_call *tool_calls;
    size_t num_tool_calls;
    uint32_t first_tool_call;
};
/* How many of o's tool calls go out (the first of them): all, or with the request's
 * parallel_tool_calls false the choice's first call only (o->first_tool_call 0), as vLLM's
 * maybe_filter_parallel_tool_calls; the finish is "tool_calls" either way. */
size_t openai_tool_calls_shown(const struct openai_out *o);
/* A whole response of n choices, o[i] the choice of index o[i].index; the response's fields
 * from o[0], its usage openai_usage_sum's. */
char *openai_response_json(const struct openai_out *o, size_t n);
/* The usage of n choices (o in index order, o[0].req's n choices a prompt) into sum: each
 * prompt's tokens once, the completions' tokens summed (vLLM's), and for each prompt the cached
 * tokens the most of its choices had (which choice computed the prompt and which found it
 * cached is the scheduler's order), summed over the prompts. */
void openai_usage_sum(struct openai_out *sum, const struct openai_out *o, size_t n);
/* The characters (code points) of len bytes of UTF-8. */
uint64_t openai_utf8_chars(const char *s, size_t len);
/* A stream chunk of o's choice: its text (a chat's delta content, left out when empty; with
 * tools_parsed, its content and tool_calls, each call whole: {index, id, type, function: {name,
 * arguments}}), tokens and finish; with role_chunk, a chat's first chunk of the choice, the role
 * alone (delta {"role": "assistant", "content": ""}, OpenAI's and vLLM's, sent before the content:
 * o's text, tokens and finish not read; ignored for a completion); with usage_only, the usage chunk
 * (no choices). */
char *openai_chunk_json(const struct openai_out *o, bool role_chunk, bool usage_only);

/* /tokenize's answer ({"count", "max_model_len", "tokens", "token_strs": null}, vLLM's) and
 * /detokenize's ({"prompt": text}). */
char *openai_tokenize_json(const int32_t *ids, size_t n, uint32_t max_model_len);
char *openai_detokenize_json(const char *text, size_t len);

/* GET /v1/models: the served model as vLLM lists it (id, object, created, owned_by, root, parent
 * null, max_model_len where known: 0 leaves it out, permission []). */
char *openai_models_json(const char *model, long long created, uint32_t max_model_len);

/* GET /version: {"version": version} (vLLM's route; pagoda's version). */
char *openai_version_json(const char *version);

#endif
