/* libFuzzer target: a request body from any HTTP client through OpenAI's parsing
 * (gateway/openai.h), and the responses built for what it parsed.
 *
 * Input: byte 0 picks the body's kind (completion, chat, /tokenize, /detokenize) in its low two
 * bits and the gateway's tool-call parser (none, hermes, llama3_json, none) in the next two; the
 * rest is the body.
 *
 * Checked beyond the sanitizers: a refusal is a 4xx with a message; an accepted request keeps
 * the limits it promises (n, the prompts and each one's form, the stop strings, the messages, a
 * tool-call parser only for a chat and only the gateway's, a logit bias of at most
 * PAGODA_MAX_LOGIT_BIAS distinct ids >= 0 with values in [-100, 100] and min_tokens in [0,
 * max_tokens], both only for a generation);
 * a whole response and a stream chunk for its choices (OPENAI_FUZZ_MAX_CHOICES of them at most,
 * with tokens and log-probabilities) parse back as JSON with the choices in index order and the
 * usage openai_usage_sum gives; releasing the prompt, then finishing, frees everything. */
#include "gateway/openai.h"
#include "text/output_text.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define OPENAI_FUZZ_MAX_CHOICES 64u

static void check_prompt(const struct openai_request *req, const pagoda_prompt *p)
{
    if (req->kind == OPENAI_CHAT) {
        if (p->num_messages < 1 || p->num_messages > OPENAI_MAX_MESSAGES || p->messages == NULL)
            abort();
        for (size_t i = 0; i < p->num_messages; i++)
            if (p->messages[i].role == NULL)
                abort();
        return;
    }
    if (req->kind == OPENAI_DETOKENIZE) {
        if (p->num_token_ids > 0 && p->token_ids == NULL)
            abort();
        return;
    }
    if (p->messages != NULL) { /* /tokenize of a chat */
        if (req->kind != OPENAI_TOKENIZE || p->num_messages < 1)
            abort();
        return;
    }
    /* a text or ids, not both; text empty only for /tokenize; ids never empty */
    if ((p->text != NULL) == (p->num_token_ids > 0))
        abort();
    if (p->text != NULL && p->text[0] == 0 && req->kind != OPENAI_TOKENIZE)
        abort();
    for (size_t i = 0; i < p->num_token_ids; i++)
        if (p->token_ids[i] < 0)
            abort();
}

/* The logit bias and min_tokens handed to libpagoda: within the router's limits (the vocabulary
 * aside), and none for /tokenize and /detokenize. */
static void check_bias(const struct openai_request *req)
{
    const pagoda_generate_params *p = &req->params;
    const bool generation = req->kind == OPENAI_COMPLETION || req->kind == OPENAI_CHAT;
    if (p->num_logit_bias > PAGODA_MAX_LOGIT_BIAS || (!generation && p->num_logit_bias > 0) ||
        (p->num_logit_bias > 0 && (p->logit_bias_ids == NULL || p->logit_bias_values == NULL)) ||
        p->min_tokens < 0 || p->min_tokens > p->max_tokens || (!generation && p->min_tokens > 0))
        abort();
    for (size_t i = 0; i < p->num_logit_bias; i++) {
        const float v = p->logit_bias_values[i];
        if (p->logit_bias_ids[i] < 0 ||
            !(v >= -PAGODA_LOGIT_BIAS_LIMIT && v <= PAGODA_LOGIT_BIAS_LIMIT))
            abort();
        for (size_t j = 0; j < i; j++)
            if (p->logit_bias_ids[j] == p->logit_bias_ids[i])
                abort();
    }
}

static void check_response(const struct openai_request *req)
{
    uint32_t total = req->n * req->num_prompts;
    if (total > OPENAI_FUZZ_MAX_CHOICES)
        total = OPENAI_FUZZ_MAX_CHOICES;
    struct openai_out *o = calloc(total, sizeof(*o));
    if (o == NULL)
        return;
    static const int32_t ids[3] = {1, 2, 3};
    static const float lps[3] = {-0.5f, -1.0f, -0.25f};
    static const uint32_t ends[3] = {1, 1, 4};
    uint32_t prompt_sum = 0, completion_sum = 0;
    for (uint32_t i = 0; i < total; i++) {
        o[i].req = req;
        o[i].id = "cmpl-fuzz";
        o[i].created = 1;
        o[i].model = "m";
        o[i].text = "a\"\\\n";
        o[i].text_len = 4;
        o[i].token_ids = ids;
        o[i].logprobs = req->params.logprobs ? lps : NULL;
        o[i].token_text_ends = req->tokens_as_ids ? NULL : ends;
        o[i].n = 3;
        o[i].index = i;
        o[i].finish = (i & 1) ? PAGODA_FINISH_LENGTH : PAGODA_FINISH_STOP;
        if (req->tool_parser != TOOL_CALL_PARSER_NONE) { /* every other choice calls a tool */
            static const struct tool_call call = {"chatcmpl-tool-0", "f", "{\"x\": 1}"};
            o[i].tools_parsed = true;
            o[i].tools_called = (i & 1) != 0;
            o[i].content = "a";
            o[i].content_len = i & 2 ? 1 : 0;
            o[i].tool_calls = o[i].tools_called ? &call : NULL;
            o[i].num_tool_calls = o[i].tools_called;
            o[i].first_tool_call = i;
        }
        o[i].stop_string = (i & 2) ? "s" : NULL;
        o[i].with_usage = true;
        o[i].prompt_tokens = 5 + i / req->n; /* one figure a prompt */
        o[i].completion_tokens = 3;
        o[i].cached_tokens = i % 4;
        if (i % req->n == 0)
            prompt_sum += o[i].prompt_tokens;
        completion_sum += 3;
    }
    struct openai_out sum = o[0];
    openai_usage_sum(&sum, o, total);
    if (sum.prompt_tokens != prompt_sum || sum.completion_tokens != completion_sum)
        abort();
    char *s = openai_response_json(o, total);
    if (s != NULL) {
        json_t *j = json_loads(s, 0, NULL);
        json_t *choices = json_object_get(j, "choices");
        if (j == NULL || json_array_size(choices) != total)
            abort();
        for (uint32_t i = 0; i < total; i++)
            if (json_integer_value(json_object_get(json_array_get(choices, i), "index")) !=
                (json_int_t)i)
                abort();
        json_decref(j);
        free(s);
    }
    for (int role = 0; role < 2; role++) { /* a chunk of text, and a chat's role chunk */
        s = openai_chunk_json(&o[total - 1], role, false);
        if (s != NULL) {
            json_t *j = json_loads(s, 0, NULL);
            if (j == NULL)
                abort();
            json_decref(j);
            free(s);
        }
    }
    free(o);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const enum openai_kind kinds[4] = {OPENAI_COMPLETION, OPENAI_CHAT, OPENAI_TOKENIZE,
                                              OPENAI_DETOKENIZE};
    static const enum tool_call_parser parsers[4] = {TOOL_CALL_PARSER_NONE, TOOL_CALL_PARSER_HERMES,
                                                     TOOL_CALL_PARSER_LLAMA3_JSON,
                                                     TOOL_CALL_PARSER_NONE};
    const enum openai_kind kind = kinds[data[0] & 3];
    const enum tool_call_parser parser = parsers[(data[0] >> 2) & 3];
    struct openai_request req;
    struct openai_error err;
    int rc = openai_parse(kind, (const char *)data + 1, size - 1, 64, parser, &req, &err);
    if (rc != 0) {
        if (rc != -1 || err.status < 400 || err.status > 499 || err.message[0] == 0)
            abort();
        openai_request_fini(&req);
        return 0;
    }
    if (req.kind != kind || req.n < 1 || req.n > OPENAI_MAX_CHOICES || req.num_prompts < 1 ||
        req.num_prompts > OPENAI_MAX_PROMPTS ||
        (req.num_prompts > 1 && kind != OPENAI_COMPLETION) || req.params.max_tokens < 1 ||
        req.params.num_stop > OPENAI_MAX_STOPS ||
        req.params.num_stop_token_ids > OPENAI_MAX_STOP_TOKEN_IDS ||
        (req.tool_parser != TOOL_CALL_PARSER_NONE &&
         (kind != OPENAI_CHAT || req.tool_parser != parser)))
        abort();
    for (size_t i = 0; i < req.params.num_stop; i++)
        if (req.params.stop[i] == NULL || strlen(req.params.stop[i]) > OUTPUT_TEXT_MAX_STOP_BYTES)
            abort();
    for (uint32_t i = 0; i < req.num_prompts; i++)
        check_prompt(&req, openai_prompt(&req, i));
    check_bias(&req);
    check_response(&req);
    openai_request_release_prompt(&req);
    if (req.params.logit_bias_ids != NULL || req.params.num_logit_bias != 0)
        abort();
    openai_request_fini(&req);
    return 0;
}
