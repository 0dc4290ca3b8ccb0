/* gateway/openai.c: OpenAI's request bodies read into libpagoda's parameters, and responses,
 * chunks and errors written as OpenAI's clients parse them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "common/error.h"
#include "gateway/openai.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int parse(enum openai_kind kind, const char *body, struct openai_request *req,
                 struct openai_error *err)
{
    return openai_parse(kind, body, strlen(body), 1024, TOOL_CALL_PARSER_NONE, req, err);
}

/* Numbers as vLLM's pydantic models read them: an integral real or a string of an integer for an
 * integer, a string of a number for a number; greedy decoding takes logprobs 1. */
static void test_numbers_are_read_as_pydantic_reads_them(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    assert_int_equal(parse(OPENAI_COMPLETION,
                           "{\"prompt\": \"x\", \"max_tokens\": 5.0, \"n\": \"2\", \"seed\": "
                           "-3.0, \"temperature\": \"0\", \"top_p\": \"0.5\", \"logprobs\": 1}",
                           &req, &err),
                     0);
    assert_int_equal(req.params.max_tokens, 5);
    assert_int_equal(req.n, 2);
    assert_true(req.params.temperature == 0.0f);
    assert_true(req.params.top_p == 0.5f);
    assert_true(req.params.logprobs);
    openai_request_fini(&req);
}

/* A chat's tools: refused with tool_choice 'auto' or none given (tool calls are not parsed, as
 * vLLM without --enable-auto-tool-choice), rendered with 'none'; /tokenize takes them. */
static void test_tools_need_tool_choice_none(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";
    char body[512];
    const char *choices[] = {"", ", \"tool_choice\": null", ", \"tool_choice\": \"auto\""};
    for (size_t i = 0; i < sizeof(choices) / sizeof(choices[0]); i++) {
        snprintf(body, sizeof(body),
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s%s}", tools,
                 choices[i]);
        assert_int_equal(parse(OPENAI_CHAT, body, &req, &err), -1);
        assert_int_equal(err.status, 400);
        assert_non_null(strstr(err.message, "'tools' with tool_choice 'auto'"));
        assert_non_null(strstr(err.message, "--tool-call-parser hermes|llama3_json"));
        openai_request_fini(&req);
        assert_int_equal(parse(OPENAI_TOKENIZE, body, &req, &err), 0);
        assert_non_null(req.prompt.tools_json);
        openai_request_fini(&req);
    }
    snprintf(body, sizeof(body),
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s, \"tool_choice\": "
             "\"none\"}",
             tools);
    assert_int_equal(parse(OPENAI_CHAT, body, &req, &err), 0);
    assert_non_null(strstr(req.prompt.tools_json, "\"f\""));
    openai_request_fini(&req);
    /* no tools (an empty list): 'auto' is nothing to refuse */
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                           "\"tools\": [], \"tool_choice\": \"auto\"}",
                           &req, &err),
                     0);
    openai_request_fini(&req);
}

/* With the gateway's tool-call parser a chat's tools with tool_choice auto (or none given) are
 * taken and its output is to be parsed (req.tool_parser); tool_choice none, no tools, a
 * completion are not parsed; required and a named function are refused either way, naming why. */
static void test_tools_with_a_tool_call_parser(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]";
    static const struct {
        const char *choice;
        int rc;
        enum tool_call_parser parsed;
        const char *message;
    } cases[] = {
        {"", 0, TOOL_CALL_PARSER_LLAMA3_JSON, NULL},
        {", \"tool_choice\": \"auto\"", 0, TOOL_CALL_PARSER_LLAMA3_JSON, NULL},
        {", \"tool_choice\": \"none\"", 0, TOOL_CALL_PARSER_NONE, NULL},
        {", \"tool_choice\": \"required\"", -1, TOOL_CALL_PARSER_NONE,
         "'tool_choice' 'required' is not supported: a tool call cannot be forced"},
        {", \"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"f\"}}", -1,
         TOOL_CALL_PARSER_NONE, "'tool_choice' naming a function is not supported"},
        {", \"tool_choice\": \"any\"", -1, TOOL_CALL_PARSER_NONE, "must be 'none', 'auto'"},
    };
    char body[512];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(body, sizeof(body),
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], %s%s}", tools,
                 cases[i].choice);
        int rc = openai_parse(OPENAI_CHAT, body, strlen(body), 1024, TOOL_CALL_PARSER_LLAMA3_JSON,
                              &req, &err);
        assert_int_equal(rc, cases[i].rc);
        if (rc == 0)
            assert_int_equal(req.tool_parser, cases[i].parsed);
        else
            assert_non_null(strstr(err.message, cases[i].message));
        openai_request_fini(&req);
    }
    const char *none[] = {
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}",
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": []}"};
    for (size_t i = 0; i < 2; i++) {
        assert_int_equal(openai_parse(OPENAI_CHAT, none[i], strlen(none[i]), 1024,
                                      TOOL_CALL_PARSER_HERMES, &req, &err),
                         0);
        assert_int_equal(req.tool_parser, TOOL_CALL_PARSER_NONE);
        openai_request_fini(&req);
    }
    snprintf(body, sizeof(body), "{\"prompt\": \"x\", %s}", tools);
    assert_int_equal(openai_parse(OPENAI_COMPLETION, body, strlen(body), 16,
                                  TOOL_CALL_PARSER_HERMES, &req, &err),
                     0);
    assert_int_equal(req.tool_parser, TOOL_CALL_PARSER_NONE);
    openai_request_fini(&req);
}

/* The whole answer of a chat whose text gave the calls of r (finished by a stop). */
static struct openai_out called_out(const struct openai_request *req, const char *text,
                                    const struct tool_calls_result *r)
{
    return (struct openai_out){.req = req,
                               .id = "chatcmpl-1",
                               .model = "m",
                               .text = text,
                               .text_len = strlen(text),
                               .finish = PAGODA_FINISH_STOP,
                               .tools_parsed = true,
                               .tools_called = true,
                               .content = r->content,
                               .content_len = r->content_len,
                               .tool_calls = r->calls,
                               .num_tool_calls = r->num_calls};
}

/* A choice with tool calls: message.tool_calls ({id, type, function: {name, arguments}}), its
 * content null where none came before them, finish_reason "tool_calls" (vLLM's); a stream's delta
 * has each call whole with its index in the choice, and no content where there is none. */
static void test_tool_calls_in_responses_and_chunks(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    const char *body = "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
                       "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]}";
    assert_int_equal(
        openai_parse(OPENAI_CHAT, body, strlen(body), 1024, TOOL_CALL_PARSER_HERMES, &req, &err),
        0);
    const char *text = "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>";
    struct tool_calls_result r;
    assert_int_equal(tool_calls_parse(TOOL_CALL_PARSER_HERMES, text, strlen(text), &r), 0);
    struct openai_out o = called_out(&req, text, &r);
    o.with_usage = true;
    char *s = openai_response_json(&o, 1);
    json_t *j = json_loads(s, 0, NULL);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    assert_true(json_is_null(json_object_get(msg, "content")));
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "tool_calls");
    json_t *call = json_array_get(json_object_get(msg, "tool_calls"), 0);
    assert_int_equal(json_array_size(json_object_get(msg, "tool_calls")), 1);
    assert_string_equal(json_string_value(json_object_get(call, "id")), r.calls[0].id);
    assert_string_equal(json_string_value(json_object_get(call, "type")), "function");
    json_t *fn = json_object_get(call, "function");
    assert_string_equal(json_string_value(json_object_get(fn, "name")), "f");
    assert_string_equal(json_string_value(json_object_get(fn, "arguments")), "{\"x\": 1}");
    json_decref(j);
    free(s);
    /* text before the calls is the content; no calls: the text, finish as it was */
    o.content = "Hi";
    o.content_len = 2;
    s = openai_response_json(&o, 1);
    assert_non_null(strstr(s, "\"content\":\"Hi\""));
    free(s);
    o.tools_called = false;
    o.num_tool_calls = 0;
    s = openai_response_json(&o, 1);
    assert_non_null(strstr(s, "\"finish_reason\":\"stop\""));
    assert_null(strstr(s, "tool_calls"));
    free(s);
    /* a stream's chunk: the second call of the choice, then its finish */
    o.tools_called = true;
    o.content_len = 0;
    o.num_tool_calls = 1;
    o.first_tool_call = 1;
    o.finish = PAGODA_FINISH_NONE;
    s = openai_chunk_json(&o, false, false);
    j = json_loads(s, 0, NULL);
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *delta = json_object_get(c0, "delta");
    assert_null(json_object_get(delta, "content"));
    call = json_array_get(json_object_get(delta, "tool_calls"), 0);
    assert_int_equal(json_integer_value(json_object_get(call, "index")), 1);
    assert_string_equal(json_string_value(json_object_get(call, "id")), r.calls[0].id);
    assert_string_equal(
        json_string_value(json_object_get(json_object_get(call, "function"), "arguments")),
        "{\"x\": 1}");
    assert_true(json_is_null(json_object_get(c0, "finish_reason")));
    json_decref(j);
    free(s);
    o.num_tool_calls = 0;
    o.finish = PAGODA_FINISH_LENGTH;
    s = openai_chunk_json(&o, false, false);
    assert_non_null(strstr(s, "\"finish_reason\":\"tool_calls\""));
    assert_null(strstr(s, "\"tool_calls\":["));
    free(s);
    tool_calls_result_fini(&r);
    openai_request_fini(&req);
}

/* parallel_tool_calls false: a choice's first call only, in a whole answer and in a stream (a later
 * call's delta has none), the finish still "tool_calls" (vLLM's maybe_filter_parallel_tool_calls);
 * before, it was ignored and every call went out. */
static void test_parallel_tool_calls_false_keeps_the_first(void **state)
{
    (void)state;
    const char *text = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>"
                       "<tool_call>{\"name\": \"g\", \"arguments\": {}}</tool_call>";
    struct tool_calls_result r;
    assert_int_equal(tool_calls_parse(TOOL_CALL_PARSER_HERMES, text, strlen(text), &r), 0);
    assert_int_equal(r.num_calls, 2);
    for (int parallel = 0; parallel < 2; parallel++) {
        struct openai_request req;
        struct openai_error err;
        char body[256];
        snprintf(body, sizeof(body),
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": "
                 "[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], "
                 "\"parallel_tool_calls\": %s}",
                 parallel ? "true" : "false");
        assert_int_equal(openai_parse(OPENAI_CHAT, body, strlen(body), 1024,
                                      TOOL_CALL_PARSER_HERMES, &req, &err),
                         0);
        struct openai_out o = called_out(&req, text, &r);
        char *s = openai_response_json(&o, 1);
        json_t *j = json_loads(s, 0, NULL);
        json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
        json_t *calls = json_object_get(json_object_get(c0, "message"), "tool_calls");
        assert_int_equal(json_array_size(calls), parallel ? 2 : 1);
        assert_string_equal(json_string_value(json_object_get(
                                json_object_get(json_array_get(calls, 0), "function"), "name")),
                            "f");
        assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "tool_calls");
        json_decref(j);
        free(s);
        /* a stream: the chunk of the first call, then the chunk of the second */
        o.finish = PAGODA_FINISH_NONE;
        o.content_len = 0;
        for (uint32_t k = 0; k < 2; k++) {
            o.tool_calls = &r.calls[k];
            o.num_tool_calls = 1;
            o.first_tool_call = k;
            s = openai_chunk_json(&o, false, false);
            j = json_loads(s, 0, NULL);
            json_t *delta =
                json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
            assert_int_equal(json_object_get(delta, "tool_calls") != NULL, parallel || k == 0);
            json_decref(j);
            free(s);
        }
        openai_request_fini(&req);
    }
    tool_calls_result_fini(&r);
}

/* /v1/models as vLLM lists it: max_model_len where known, left out where not. */
static void test_models_list(void **state)
{
    (void)state;
    char *s = openai_models_json("m", 7, 4096);
    json_t *j = json_loads(s, 0, NULL), *card = json_array_get(json_object_get(j, "data"), 0);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "list");
    assert_string_equal(json_string_value(json_object_get(card, "id")), "m");
    assert_string_equal(json_string_value(json_object_get(card, "root")), "m");
    assert_true(json_is_null(json_object_get(card, "parent")));
    assert_int_equal(json_integer_value(json_object_get(card, "max_model_len")), 4096);
    assert_int_equal(json_integer_value(json_object_get(card, "created")), 7);
    json_decref(j);
    free(s);
    s = openai_models_json("m", 7, 0);
    j = json_loads(s, 0, NULL);
    card = json_array_get(json_object_get(j, "data"), 0);
    assert_null(json_object_get(card, "max_model_len"));
    json_decref(j);
    free(s);
}

static void test_a_completion_is_read(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    assert_int_equal(parse(OPENAI_COMPLETION,
                           "{\"model\": \"m\", \"prompt\": \"Hello\", \"max_tokens\": 7, "
                           "\"temperature\": 0, \"top_p\": 0.5, \"seed\": 42, \"stop\": [\"a\", "
                           "\"bc\"], \"stream\": true, \"stream_options\": {\"include_usage\": "
                           "true}, \"logprobs\": 1, \"top_k\": -1, \"ignore_eos\": true, "
                           "\"include_stop_str_in_output\": true}",
                           &req, &err),
                     0);
    assert_string_equal(req.model, "m");
    assert_string_equal(req.prompt.text, "Hello");
    assert_int_equal(req.params.max_tokens, 7);
    assert_int_equal(req.params.strict_max_tokens, 1); /* given: refused past the context */
    assert_true(req.params.temperature == 0.0f);
    assert_true(req.params.top_p == 0.5f);
    assert_int_equal(req.params.top_k, 0);
    assert_true(req.params.has_seed && req.params.seed == 42);
    assert_int_equal(req.params.num_stop, 2);
    assert_string_equal(req.params.stop[1], "bc");
    assert_true(req.stream && req.include_usage);
    assert_true(req.params.logprobs);
    assert_true(req.params.ignore_eos);
    assert_true(req.params.include_stop_str_in_output);
    /* given: the request's own; left out: the model's (generation_config.json, the router's) */
    assert_int_equal(req.params.model_defaults,
                     PAGODA_PARAM_MIN_P | PAGODA_PARAM_REPETITION_PENALTY);
    openai_request_fini(&req);
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
                           "\"temperature\": null, \"min_p\": 0.1, \"repetition_penalty\": 1}",
                           &req, &err),
                     0);
    assert_int_equal(req.params.model_defaults,
                     PAGODA_PARAM_TEMPERATURE | PAGODA_PARAM_TOP_P | PAGODA_PARAM_TOP_K);
    openai_request_fini(&req);
    /* a temperature that is a float's 0 would be greedy: refused, as 1e-7 is by the router */
    assert_int_not_equal(
        parse(OPENAI_COMPLETION, "{\"prompt\": \"x\", \"temperature\": 1e-50}", &req, &err), 0);
    assert_non_null(strstr(err.message, "too small"));
    openai_request_fini(&req);
    /* Token ids, and the defaults: 16 tokens, temperature 1. */
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\": [[1, 2, 3]]}", &req, &err), 0);
    assert_int_equal(req.prompt.num_token_ids, 3);
    assert_int_equal(req.prompt.token_ids[2], 3);
    assert_int_equal(req.params.strict_max_tokens, 0); /* defaulted: ends at the context */
    assert_int_equal(req.params.max_tokens, 16);
    assert_true(req.params.temperature == 1.0f);
    assert_false(req.params.include_stop_str_in_output);
    assert_null(req.model);
    openai_request_fini(&req);
}

/* A completion's list of prompts: strings or token-id lists, each with the request's fields; its
 * usage counts each prompt once and sums the prompts' cached tokens (the most of each prompt's
 * choices). */
static void test_a_list_of_prompts_is_read(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    assert_int_equal(parse(OPENAI_COMPLETION,
                           "{\"prompt\": [\"one\", \"two\", \"three\"], \"n\": 2, "
                           "\"add_special_tokens\": false}",
                           &req, &err),
                     0);
    assert_int_equal(req.num_prompts, 3);
    assert_int_equal(req.n, 2);
    assert_string_equal(openai_prompt(&req, 0)->text, "one");
    assert_string_equal(openai_prompt(&req, 2)->text, "three");
    for (uint32_t i = 0; i < 3; i++)
        assert_int_equal(openai_prompt(&req, i)->add_special_tokens, 0);
    /* usage: prompt p's choices are indices 2p and 2p + 1 */
    struct openai_out o[6];
    memset(o, 0, sizeof(o));
    const uint32_t prompt_tokens[3] = {3, 5, 7}, cached[6] = {0, 3, 0, 0, 4, 2};
    for (uint32_t i = 0; i < 6; i++) {
        o[i].req = &req;
        o[i].index = i;
        o[i].prompt_tokens = prompt_tokens[i / 2];
        o[i].completion_tokens = 10 + i;
        o[i].cached_tokens = cached[i];
    }
    struct openai_out sum = o[0];
    openai_usage_sum(&sum, o, 6);
    assert_int_equal(sum.prompt_tokens, 15);
    assert_int_equal(sum.completion_tokens, 75);
    assert_int_equal(sum.cached_tokens, 7);
    openai_request_fini(&req);
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\": [[1, 2], [3], [4, 5, 6]]}", &req, &err),
                     0);
    assert_int_equal(req.num_prompts, 3);
    assert_int_equal(req.prompt.num_token_ids, 2);
    assert_int_equal(openai_prompt(&req, 1)->num_token_ids, 1);
    assert_int_equal(openai_prompt(&req, 1)->token_ids[0], 3);
    assert_int_equal(openai_prompt(&req, 2)->num_token_ids, 3);
    assert_int_equal(openai_prompt(&req, 2)->token_ids[2], 6);
    assert_null(openai_prompt(&req, 2)->text);
    openai_request_fini(&req);
    /* More than OPENAI_MAX_PROMPTS. */
    size_t cap = 64 + 4 * (OPENAI_MAX_PROMPTS + 1);
    char *body = malloc(cap), *at = body;
    at += sprintf(at, "{\"prompt\": [");
    for (int i = 0; i <= OPENAI_MAX_PROMPTS; i++)
        at += sprintf(at, "%s\"a\"", i ? "," : "");
    sprintf(at, "]}");
    assert_int_equal(parse(OPENAI_COMPLETION, body, &req, &err), -1);
    assert_non_null(strstr(err.message, "more than 2048"));
    openai_request_fini(&req);
    /* A stop string past the router's 256 bytes is refused here (each choice of a list would
     * carry it); 256 bytes are taken. */
    char stop[257];
    memset(stop, 'z', 256);
    stop[256] = 0;
    sprintf(body, "{\"prompt\": \"x\", \"stop\": [\"a\", \"%s\"]}", stop);
    assert_int_equal(parse(OPENAI_COMPLETION, body, &req, &err), 0);
    openai_request_fini(&req);
    sprintf(body, "{\"prompt\": \"x\", \"stop\": [\"a\", \"%sz\"]}", stop);
    assert_int_equal(parse(OPENAI_COMPLETION, body, &req, &err), -1);
    assert_non_null(strstr(err.message, "'stop' 1 is longer than 256 bytes"));
    openai_request_fini(&req);
    sprintf(body, "{\"prompt\": \"x\", \"stop\": \"%sz\"}", stop);
    assert_int_equal(parse(OPENAI_COMPLETION, body, &req, &err), -1);
    assert_non_null(strstr(err.message, "'stop' is longer than 256 bytes"));
    openai_request_fini(&req);
    free(body);
}

/* continue_final_message: with add_generation_prompt false it reaches the prompt; with it true
 * (its default) the request is refused, as transformers refuses the pair. */
static void test_continue_final_message_is_read(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}, {\"role\": "
                           "\"assistant\", \"content\": \"The answer is\"}], "
                           "\"continue_final_message\": true, \"add_generation_prompt\": false}",
                           &req, &err),
                     0);
    assert_int_equal(req.prompt.continue_final_message, 1);
    assert_int_equal(req.prompt.add_generation_prompt, 0);
    openai_request_fini(&req);
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
                           "\"continue_final_message\": false}",
                           &req, &err),
                     0);
    assert_int_equal(req.prompt.continue_final_message, 0);
    assert_int_equal(req.prompt.add_generation_prompt, 1);
    openai_request_fini(&req);
    assert_int_not_equal(parse(OPENAI_CHAT,
                               "{\"messages\": [{\"role\": \"user\", \"content\": \"q\"}], "
                               "\"continue_final_message\": true}",
                               &req, &err),
                         0);
    assert_int_equal(err.status, 400);
    assert_non_null(strstr(err.message, "cannot both be true"));
    openai_request_fini(&req);
}

static void test_a_chat_is_read(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    assert_int_equal(
        parse(OPENAI_CHAT,
              "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": "
              "\"user\", \"content\": [{\"type\": \"text\", \"text\": \"Hi \"}, {\"type\": "
              "\"text\", \"text\": \"there\"}]}, {\"role\": \"assistant\", \"content\": null, "
              "\"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": "
              "\"f\", \"arguments\": \"{\\\"x\\\": 1}\"}}]}], \"max_completion_tokens\": 5, "
              "\"chat_template_kwargs\": {\"enable_thinking\": false}, \"logprobs\": true}",
              &req, &err),
        0);
    assert_int_equal(req.prompt.num_messages, 3);
    assert_string_equal(req.prompt.messages[1].content, "Hi \nthere"); /* vLLM's "\n" join */
    /* null: "" to the template, as vLLM's (a template's `'...' + message.content` works) */
    assert_string_equal(req.prompt.messages[2].content, "");
    assert_false(req.prompt.messages[2].content_absent);
    assert_false(req.prompt.messages[0].content_absent);
    assert_true(req.parallel_tool_calls); /* the default */
    assert_non_null(strstr(req.prompt.messages[2].tool_calls_json, "\"arguments\":{\"x\":1}"));
    assert_int_equal(req.params.max_tokens, 5);
    assert_string_equal(req.prompt.chat_template_kwargs, "{\"enable_thinking\":false}");
    assert_true(req.params.logprobs);
    openai_request_fini(&req);
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": "
                           "\"x\"}]}",
                           &req, &err),
                     0);
    assert_int_equal(req.params.max_tokens, 1024); /* the gateway's default */
    openai_request_fini(&req);
    /* a message without the key: "" as well (vLLM's) */
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, "
                           "{\"role\": \"assistant\"}]}",
                           &req, &err),
                     0);
    assert_string_equal(req.prompt.messages[1].content, "");
    assert_false(req.prompt.messages[1].content_absent);
    openai_request_fini(&req);
    /* vLLM's answers carry "tool_calls": [], which clients send back: left out (a template would
     * take the turn for a tool call's); arguments empty, null or absent are {}; a string of any
     * JSON value is the value ("null": null); arguments that are not JSON stay a string */
    assert_int_equal(
        parse(OPENAI_CHAT,
              "{\"messages\": [{\"role\": \"assistant\", \"content\": \"a\", \"tool_calls\": []}, "
              "{\"role\": \"assistant\", \"tool_calls\": [{\"function\": {\"name\": \"f\", "
              "\"arguments\": \"\"}}, {\"function\": {\"name\": \"g\", \"arguments\": null}}, "
              "{\"function\": {\"name\": \"h\"}}, {\"function\": {\"name\": \"k\", "
              "\"arguments\": \"not json\"}}, {\"function\": {\"name\": \"m\", \"arguments\": "
              "\"null\"}}]}], \"parallel_tool_calls\": false}",
              &req, &err),
        0);
    assert_null(req.prompt.messages[0].tool_calls_json);
    assert_string_equal(req.prompt.messages[1].tool_calls_json,
                        "[{\"function\":{\"name\":\"f\",\"arguments\":{}}},{\"function\":{\"name\":"
                        "\"g\",\"arguments\":{}}},{\"function\":{\"name\":\"h\",\"arguments\":{}}},"
                        "{\"function\":{\"name\":\"k\",\"arguments\":\"not json\"}},"
                        "{\"function\":{\"name\":\"m\",\"arguments\":null}}]");
    assert_false(req.parallel_tool_calls);
    openai_request_fini(&req);
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                           "\"parallel_tool_calls\": \"no\"}",
                           &req, &err),
                     -1);
    assert_non_null(strstr(err.message, "'parallel_tool_calls' must be true or false"));
    openai_request_fini(&req);
}

static void test_bad_requests_are_400_with_a_reason(void **state)
{
    (void)state;
    static const struct {
        enum openai_kind kind;
        const char *body, *want;
    } cases[] = {
        {OPENAI_COMPLETION, "{\"prompt\": \"x\"", "not JSON"},
        {OPENAI_COMPLETION, "[1]", "JSON object"},
        {OPENAI_COMPLETION, "{\"prompt\": \"a\\u0000b\"}", "NUL character"},
        {OPENAI_COMPLETION, "{}", "'prompt'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"\"}", "empty"},
        {OPENAI_COMPLETION, "{\"prompt\": [\"a\", [1]]}", "not both"},
        {OPENAI_COMPLETION, "{\"prompt\": [[1], [2, -1]]}", "'prompt' 1 token 1"},
        {OPENAI_COMPLETION, "{\"prompt\": [\"a\", \"\"]}", "'prompt' 1 is empty"},
        {OPENAI_COMPLETION, "{\"prompt\": [[1], []]}", "'prompt' 1 must be"},
        {OPENAI_TOKENIZE, "{\"prompt\": [\"a\", \"b\"]}", "send one"},
        {OPENAI_COMPLETION, "{\"prompt\": [1, -2]}", "token 1"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"n\": 0}", "'n' is 0"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"n\": 129}", "[1, 128]"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"n\": 2, \"best_of\": 3}",
         "'best_of' must equal n"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"n\": 2, \"best_of\": 1}",
         "'best_of' must equal n"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"echo\": true}", "'echo'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"temperature\": -1}", "'temperature'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"top_p\": 0}", "'top_p'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"stop\": 5}", "'stop'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 0}", "'max_tokens'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 5}", "'logprobs'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"seed\": \"seven\"}", "'seed'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"seed\": 7.5}", "'seed'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"seed\": \" 7\"}", "'seed'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 1e30}", "'max_tokens'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"temperature\": \"warm\"}", "'temperature'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"temperature\": \"0x1\"}", "'temperature'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"top_p\": \"inf\"}", "'top_p'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"top_p\": \"1.0.0\"}", "'top_p'"},
        /* one alternative is only the sampled token where decoding is greedy */
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 1}", "'logprobs' is 1"},
        {OPENAI_CHAT, "{\"messages\": []}", "'messages'"},
        {OPENAI_CHAT, "{\"messages\": [{\"content\": \"x\"}]}", "'role'"},
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": "
         "\"image_url\"}]}]}",
         "only {\"type\": \"text\""},
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"logprobs\": true, \"top_logprobs\": 3}",
         "'top_logprobs'"},
        /* what changes the output and is not done here: refused, not ignored */
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"suffix\": \"end\"}", "'suffix'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"guided_json\": {}}", "'guided_json'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"stream_options\": {}}", "'stream': true"},
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"response_format\": {\"type\": \"json_object\"}}",
         "'json_object' is not supported"},
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"tool_choice\": \"required\"}",
         "'tool_choice'"},
        /* vLLM's parameters that change the output: refused past their neutral values */
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}",
         "'top_logprobs'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"include_stop_str_in_output\": 1}",
         "'include_stop_str_in_output'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"allowed_token_ids\": [5]}",
         "'allowed_token_ids'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"bad_words\": [\"a\"]}", "'bad_words'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"prompt_logprobs\": 0}", "'prompt_logprobs'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"truncate_prompt_tokens\": 4}",
         "'truncate_prompt_tokens'"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"use_beam_search\": true}", "'use_beam_search'"},
        {OPENAI_COMPLETION,
         "{\"prompt\": \"x\", \"stream\": true, \"stream_options\": "
         "{\"continuous_usage_stats\": true}}",
         "'stream_options.continuous_usage_stats'"},
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template\": "
         "\"{{ 1/0 }}\"}",
         "'chat_template'"},
        {OPENAI_TOKENIZE,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"chat_template\": \"\"}",
         "'chat_template'"},
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"continue_final_message\": true}",
         "'continue_final_message'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct openai_request req;
        struct openai_error err;
        assert_int_equal(parse(cases[i].kind, cases[i].body, &req, &err), -1);
        assert_int_equal(err.status, 400);
        assert_string_equal(err.type, "invalid_request_error");
        if (strstr(err.message, cases[i].want) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", i, err.message, cases[i].want);
        openai_request_fini(&req);
    }
    /* their neutral values pass; logprobs 0 asks for the sampled token's (no alternatives) */
    struct openai_request req;
    struct openai_error err;
    assert_int_equal(parse(OPENAI_COMPLETION,
                           "{\"prompt\": \"x\", \"logit_bias\": {}, \"suffix\": \"\", "
                           "\"response_format\": {\"type\": \"text\"}, \"logprobs\": 0, "
                           "\"min_tokens\": \"0\", \"include_stop_str_in_output\": false, "
                           "\"allowed_token_ids\": null, \"bad_words\": [], "
                           "\"prompt_logprobs\": null, \"use_beam_search\": false, "
                           "\"chat_template\": \"ignored: not a chat\", "
                           "\"stream_options\": null}",
                           &req, &err),
                     0);
    assert_true(req.params.logprobs);
    assert_int_equal(req.n, 1);
    openai_request_fini(&req);
    /* n choices, best_of equal to it */
    assert_int_equal(
        parse(OPENAI_COMPLETION, "{\"prompt\": \"x\", \"n\": 3, \"best_of\": 3}", &req, &err), 0);
    assert_int_equal(req.n, 3);
    openai_request_fini(&req);
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                           "\"tool_choice\": \"auto\", \"continue_final_message\": false, "
                           "\"top_logprobs\": 0}",
                           &req, &err),
                     0);
    openai_request_fini(&req);
}

/* OpenAI's logit_bias (token ids written as integers, values clamped to [-100, 100] as vLLM's)
 * and vLLM's min_tokens, into the params handed to libpagoda, on completions and chats. */
static void test_logit_bias_and_min_tokens_are_read(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    assert_int_equal(parse(OPENAI_COMPLETION,
                           "{\"prompt\": \"x\", \"max_tokens\": 8, \"min_tokens\": 8, "
                           "\"logit_bias\": {\"50256\": -100, \"7\": 2.5, \"0\": \"-1.5\", "
                           "\"+12\": 3, \"0013\": 0, \"20\": 150, \"21\": -1e9, \"22\": "
                           "\"1e999\"}}",
                           &req, &err),
                     0);
    /* in the body's order (jansson keeps it), each clamped */
    const int32_t ids[] = {50256, 7, 0, 12, 13, 20, 21, 22};
    const float values[] = {-100.0f, 2.5f, -1.5f, 3.0f, 0.0f, 100.0f, -100.0f, 100.0f};
    assert_int_equal(req.params.num_logit_bias, 8);
    assert_non_null(req.params.logit_bias_ids);
    assert_non_null(req.params.logit_bias_values);
    for (size_t i = 0; i < 8; i++) {
        assert_int_equal(req.params.logit_bias_ids[i], ids[i]);
        assert_true(req.params.logit_bias_values[i] == values[i]);
    }
    assert_int_equal(req.params.min_tokens, 8);
    /* sent, the params borrow nothing more */
    openai_request_release_prompt(&req);
    assert_null(req.params.logit_bias_ids);
    assert_null(req.params.logit_bias_values);
    assert_int_equal(req.params.num_logit_bias, 0);
    openai_request_fini(&req);

    /* a chat: min_tokens up to its default max_tokens (1024 here) */
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
                           "\"logit_bias\": {\"3\": 1}, \"min_tokens\": \"1024\"}",
                           &req, &err),
                     0);
    assert_int_equal(req.params.num_logit_bias, 1);
    assert_int_equal(req.params.logit_bias_ids[0], 3);
    assert_true(req.params.logit_bias_values[0] == 1.0f);
    assert_int_equal(req.params.min_tokens, 1024);
    openai_request_fini(&req);

    /* null, {} and 0 are none */
    const char *none[] = {"{\"prompt\": \"x\", \"logit_bias\": null, \"min_tokens\": null}",
                          "{\"prompt\": \"x\", \"logit_bias\": {}, \"min_tokens\": 0}",
                          "{\"prompt\": \"x\"}"};
    for (size_t i = 0; i < sizeof(none) / sizeof(none[0]); i++) {
        assert_int_equal(parse(OPENAI_COMPLETION, none[i], &req, &err), 0);
        assert_int_equal(req.params.num_logit_bias, 0);
        assert_null(req.params.logit_bias_ids);
        assert_null(req.params.logit_bias_values);
        assert_int_equal(req.params.min_tokens, 0);
        openai_request_fini(&req);
    }

    /* /tokenize reads neither (vLLM's takes neither) */
    assert_int_equal(parse(OPENAI_TOKENIZE,
                           "{\"prompt\": \"x\", \"logit_bias\": {\"a\": 1}, \"min_tokens\": 99}",
                           &req, &err),
                     0);
    assert_int_equal(req.params.num_logit_bias, 0);
    assert_int_equal(req.params.min_tokens, 0);
    openai_request_fini(&req);

    /* PAGODA_MAX_LOGIT_BIAS pairs, and one more */
    for (unsigned count = PAGODA_MAX_LOGIT_BIAS; count <= PAGODA_MAX_LOGIT_BIAS + 1; count++) {
        char body[8192] = "{\"prompt\": \"x\", \"logit_bias\": {";
        size_t at = strlen(body);
        for (unsigned i = 0; i < count; i++)
            at += (size_t)snprintf(body + at, sizeof(body) - at, "%s\"%u\": -1", i ? ", " : "",
                                   i * 7);
        snprintf(body + at, sizeof(body) - at, "}}");
        if (count == PAGODA_MAX_LOGIT_BIAS) {
            assert_int_equal(parse(OPENAI_COMPLETION, body, &req, &err), 0);
            assert_int_equal(req.params.num_logit_bias, PAGODA_MAX_LOGIT_BIAS);
            assert_int_equal(req.params.logit_bias_ids[PAGODA_MAX_LOGIT_BIAS - 1],
                             (PAGODA_MAX_LOGIT_BIAS - 1) * 7);
        } else {
            assert_int_equal(parse(OPENAI_COMPLETION, body, &req, &err), -1);
            assert_int_equal(err.status, 400);
            assert_string_equal(err.message, "'logit_bias' has 301 tokens, more than 300");
        }
        openai_request_fini(&req);
    }

    /* refusals (400), each message naming what is wrong */
    static const struct {
        enum openai_kind kind;
        const char *body;
        const char *want;
    } cases[] = {
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": \"x\"}",
         "'logit_bias' must be an object mapping token ids to numbers"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": [[1, 2]]}",
         "'logit_bias' must be an object"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"abc\": 1}}",
         "'logit_bias' key 'abc' is not a token id: keys are token ids written as base-10 "
         "integers (\"50256\")"},
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"logit_bias\": {\"1.5\": 1}}",
         "'logit_bias' key '1.5' is not a token id: keys are"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"\": 1}}",
         "'logit_bias' key '' is not a token id: keys are"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\" 5\": 1}}",
         "'logit_bias' key ' 5' is not a token id: keys are"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"0x10\": 1}}",
         "'logit_bias' key '0x10' is not a token id: keys are"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"-\": 1}}",
         "'logit_bias' key '-' is not a token id: keys are"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"-1\": 1}}",
         "'logit_bias' key '-1' is not a token id: ids are 0 or more"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"2147483648\": 1}}",
         "'logit_bias' key '2147483648' is not a token id: ids are 0 or more"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"99999999999999999999999\": 1}}",
         "'logit_bias' key '99999999999999999999999' is not a token id: ids are 0 or more"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": 1, \"05\": 2}}",
         "'logit_bias' keys '5' and '05' name the same token (5)"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": \"high\"}}",
         "'logit_bias' value of token '5' must be a number"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": true}}",
         "'logit_bias' value of token '5' must be a number"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logit_bias\": {\"5\": null}}",
         "'logit_bias' value of token '5' must be a number"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"min_tokens\": -1}",
         "'min_tokens' is -1; it must be in [0, 2147483647]"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"min_tokens\": \"none\"}",
         "'min_tokens' must be an integer"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"min_tokens\": 0.5}",
         "'min_tokens' must be an integer"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"max_tokens\": 4, \"min_tokens\": 5}",
         "'min_tokens' is 5; it must be at most max_tokens (4)"},
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
         "\"max_completion_tokens\": 4, \"min_tokens\": 5}",
         "'min_tokens' is 5; it must be at most max_tokens (4)"},
        {OPENAI_COMPLETION, "{\"prompt\": \"x\", \"min_tokens\": 17}",
         "'min_tokens' is 17; it must be at most max_tokens, which is 16 when not given: give "
         "max_tokens"},
        {OPENAI_CHAT,
         "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"min_tokens\": 1025}",
         "'min_tokens' is 1025; it must be at most max_tokens, which is 1024 when not given"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        assert_int_equal(parse(cases[i].kind, cases[i].body, &req, &err), -1);
        assert_int_equal(err.status, 400);
        assert_string_equal(err.type, "invalid_request_error");
        if (strstr(err.message, cases[i].want) == NULL)
            fail_msg("case %zu: '%s' does not say '%s'", i, err.message, cases[i].want);
        openai_request_fini(&req);
    }

    /* a long key is shown cut, on a character boundary: the error stays UTF-8 */
    char body[512], key[200];
    memset(key, 'a', 63);
    strcpy(key + 63, "\xc3\xa9tail"); /* 63 bytes, then a 2-byte character across byte 64 */
    snprintf(body, sizeof(body), "{\"prompt\": \"x\", \"logit_bias\": {\"%s\": 1}}", key);
    assert_int_equal(parse(OPENAI_COMPLETION, body, &req, &err), -1);
    char *json = openai_error_json(&err);
    assert_non_null(json);
    assert_null(strstr(json, "unprintable"));
    assert_null(strstr(json, "\xc3"));
    assert_non_null(strstr(json, "aaa' is not a token id"));
    free(json);
    openai_request_fini(&req);
}

static void test_responses_and_chunks_are_openai_json(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    assert_int_equal(parse(OPENAI_CHAT,
                           "{\"messages\": [{\"role\": \"user\", \"content\": "
                           "\"x\"}], \"stream\": true, \"n\": 2, \"stream_options\": "
                           "{\"include_usage\": true}}",
                           &req, &err),
                     0);
    int32_t ids[2] = {5, 9};
    float lps[2] = {-0.5f, -1.25f};
    struct openai_out o = {.req = &req,
                           .id = "chatcmpl-1",
                           .created = 7,
                           .model = "m",
                           .text = "a\0b",
                           .text_len = 3,
                           .token_ids = ids,
                           .logprobs = lps,
                           .n = 2,
                           .finish = PAGODA_FINISH_STOP,
                           .stop_string = "zz",
                           .with_usage = true,
                           .prompt_tokens = 4,
                           .completion_tokens = 2,
                           .cached_tokens = 3};
    char *s = openai_response_json(&o, 1);
    json_t *j = json_loads(s, JSON_ALLOW_NUL, NULL); /* the text holds U+0000 */
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion");
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *msg = json_object_get(c0, "message");
    assert_int_equal(json_string_length(json_object_get(msg, "content")), 3);
    assert_string_equal(json_string_value(json_object_get(c0, "finish_reason")), "stop");
    assert_string_equal(json_string_value(json_object_get(c0, "stop_reason")), "zz");
    json_t *content = json_object_get(json_object_get(c0, "logprobs"), "content");
    assert_int_equal(json_array_size(content), 2);
    assert_string_equal(json_string_value(json_object_get(json_array_get(content, 1), "token")),
                        "token_id:9");
    /* named by id: its bytes are the name's (vLLM's) */
    assert_int_equal(json_array_size(json_object_get(json_array_get(content, 1), "bytes")), 10);
    json_t *usage = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), 6);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(usage, "prompt_tokens_details"), "cached_tokens")),
                     3);
    json_decref(j);
    free(s);
    /* With each token's piece of the text: named by it, with its bytes. */
    uint32_t ends[2] = {1, 3};
    o.token_text_ends = ends;
    s = openai_response_json(&o, 1);
    j = json_loads(s, JSON_ALLOW_NUL, NULL);
    content = json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs"), "content");
    json_t *t1 = json_array_get(content, 1);
    assert_int_equal(json_string_length(json_object_get(t1, "token")), 2);
    assert_memory_equal(json_string_value(json_object_get(t1, "token")), "\0b", 2);
    assert_int_equal(json_array_size(json_object_get(t1, "bytes")), 2);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(t1, "bytes"), 1)), 'b');
    json_decref(j);
    free(s);
    o.token_text_ends = NULL;
    /* A choice's first chunk is its role alone, as OpenAI's and vLLM's ({"role": "assistant",
     * "content": ""}: none of o's text, tokens or finish); the content follows without the role.
     * A usage chunk has no choices. */
    s = openai_chunk_json(&o, true, false);
    j = json_loads(s, JSON_ALLOW_NUL, NULL);
    assert_string_equal(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
    c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *delta = json_object_get(c0, "delta");
    assert_int_equal(json_object_size(delta), 2);
    assert_string_equal(json_string_value(json_object_get(delta, "role")), "assistant");
    assert_string_equal(json_string_value(json_object_get(delta, "content")), "");
    assert_true(json_is_null(json_object_get(c0, "logprobs")));
    assert_true(json_is_null(json_object_get(c0, "finish_reason")));
    assert_true(json_is_null(json_object_get(j, "usage")));
    json_decref(j);
    free(s);
    o.finish = PAGODA_FINISH_NONE;
    s = openai_chunk_json(&o, false, false);
    j = json_loads(s, JSON_ALLOW_NUL, NULL);
    delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    assert_null(json_object_get(delta, "role"));
    assert_int_equal(json_string_length(json_object_get(delta, "content")), 3);
    json_decref(j);
    free(s);
    s = openai_chunk_json(&o, false, true);
    j = json_loads(s, JSON_ALLOW_NUL, NULL);
    assert_int_equal(json_array_size(json_object_get(j, "choices")), 0);
    assert_int_equal(
        json_integer_value(json_object_get(json_object_get(j, "usage"), "completion_tokens")), 2);
    json_decref(j);
    free(s);
    /* A chunk names its choice; a response of two choices lists both in order, with the prompt's
     * tokens once and the completions' summed. */
    o.index = 1;
    s = openai_chunk_json(&o, false, false);
    j = json_loads(s, JSON_ALLOW_NUL, NULL);
    assert_int_equal(json_integer_value(json_object_get(
                         json_array_get(json_object_get(j, "choices"), 0), "index")),
                     1);
    json_decref(j);
    free(s);
    struct openai_out two[2] = {o, o};
    two[0].index = 0;
    two[0].finish = PAGODA_FINISH_LENGTH;
    two[1].completion_tokens = 5;
    two[1].cached_tokens = 4; /* the most any choice found cached */
    two[1].finish = PAGODA_FINISH_STOP;
    s = openai_response_json(two, 2);
    j = json_loads(s, JSON_ALLOW_NUL, NULL);
    json_t *choices = json_object_get(j, "choices");
    assert_int_equal(json_array_size(choices), 2);
    for (size_t i = 0; i < 2; i++)
        assert_int_equal(json_integer_value(json_object_get(json_array_get(choices, i), "index")),
                         (json_int_t)i);
    assert_string_equal(
        json_string_value(json_object_get(json_array_get(choices, 1), "finish_reason")), "stop");
    usage = json_object_get(j, "usage");
    assert_int_equal(json_integer_value(json_object_get(usage, "prompt_tokens")), 4);
    assert_int_equal(json_integer_value(json_object_get(usage, "completion_tokens")), 7);
    assert_int_equal(json_integer_value(json_object_get(usage, "total_tokens")), 11);
    assert_int_equal(json_integer_value(json_object_get(
                         json_object_get(usage, "prompt_tokens_details"), "cached_tokens")),
                     4);
    json_decref(j);
    free(s);
    openai_request_fini(&req);
    /* Errors in OpenAI's shape, with the status of the failure. */
    struct openai_error e;
    openai_error_from_code(PAGODA_EPERM, "unknown API key", &e);
    assert_int_equal(e.status, 401);
    openai_error_from_code(PAGODA_EEXHAUSTED, "full", &e);
    assert_int_equal(e.status, 429);
    /* the router's refusal of a request's parameters (a logit bias id outside the vocabulary) */
    openai_error_from_code(PAGODA_ERANGE, "logit_bias: token 999999 is outside the vocabulary", &e);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.type, "invalid_request_error");
    assert_string_equal(e.message, "logit_bias: token 999999 is outside the vocabulary");
    openai_error_from_code(PAGODA_EINVAL, "logit_bias: token 5 twice", &e);
    assert_int_equal(e.status, 400);
    openai_error_from_code(PAGODA_ECLOSED, "draining", &e);
    assert_int_equal(e.status, 503);
    s = openai_error_json(&e);
    j = json_loads(s, JSON_ALLOW_NUL, NULL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                        "draining");
    json_decref(j);
    free(s);
    /* A message cut to fit in the middle of a character (a model name of 600 "é"s, snprintf'd):
     * the cut character is left out; the message and the code stay. */
    struct openai_error nf = {.status = 404, .type = "not_found_error", .code = "model_not_found"};
    char name[1201];
    for (int i = 0; i < 600; i++)
        memcpy(name + 2 * i, "\xc3\xa9", 2);
    name[1200] = '\0';
    /* as snprintf cuts it (the gateway's call, which the compiler would warn about here) */
    const char head[] = "the model 'a";
    memcpy(nf.message, head, sizeof(head) - 1);
    memcpy(nf.message + sizeof(head) - 1, name, sizeof(nf.message) - sizeof(head));
    nf.message[sizeof(nf.message) - 1] = '\0';
    s = openai_error_json(&nf);
    j = json_loads(s, JSON_ALLOW_NUL, NULL);
    const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    assert_non_null(m);
    assert_int_equal(strncmp(m, "the model 'a\xc3\xa9", 14), 0);
    assert_int_equal(strlen(m), sizeof(nf.message) - 2); /* the half character left out */
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "model_not_found");
    json_decref(j);
    free(s);
    /* Invalid UTF-8 inside: said so, the code kept. */
    snprintf(nf.message, sizeof(nf.message), "bad \xff byte");
    s = openai_error_json(&nf);
    j = json_loads(s, JSON_ALLOW_NUL, NULL);
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                        "(unprintable error)");
    assert_string_equal(json_string_value(json_object_get(json_object_get(j, "error"), "code")),
                        "model_not_found");
    json_decref(j);
    free(s);
}

/* Completions' logprobs: tokens named by their pieces of the text (an empty one for a token that
 * completes no character), text_offset in characters from the output's start (a stream's chunk
 * starts at the characters sent before it); without pieces, ids and an empty text_offset. */
static void test_completion_logprobs_name_pieces(void **state)
{
    (void)state;
    struct openai_request req;
    struct openai_error err;
    assert_int_equal(parse(OPENAI_COMPLETION, "{\"prompt\": \"x\", \"logprobs\": 0}", &req, &err),
                     0);
    int32_t ids[3] = {1, 2, 3};
    float lps[3] = {-1.0f, -2.0f, -3.0f};
    uint32_t ends[3] = {0, 3, 6}; /* "" (half a character), "h\xc3\xa9", "llo" */
    struct openai_out o = {.req = &req,
                           .id = "cmpl-1",
                           .model = "m",
                           .text = "h\xc3\xa9llo",
                           .text_len = 6,
                           .token_ids = ids,
                           .logprobs = lps,
                           .token_text_ends = ends,
                           .text_offset = 5,
                           .n = 3};
    char *s = openai_chunk_json(&o, false, false);
    json_t *j = json_loads(s, 0, NULL);
    json_t *l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    json_t *tokens = json_object_get(l, "tokens"), *off = json_object_get(l, "text_offset");
    assert_string_equal(json_string_value(json_array_get(tokens, 0)), "");
    assert_string_equal(json_string_value(json_array_get(tokens, 1)), "h\xc3\xa9");
    assert_string_equal(json_string_value(json_array_get(tokens, 2)), "llo");
    assert_int_equal(json_array_size(off), 3);
    assert_false(req.tokens_as_ids);
    assert_int_equal(json_integer_value(json_array_get(off, 0)), 5);
    assert_int_equal(json_integer_value(json_array_get(off, 1)), 5);
    assert_int_equal(json_integer_value(json_array_get(off, 2)), 7); /* "h\xc3\xa9": 2 chars */
    /* top_logprobs: each token's name to its log-probability (vLLM's with logprobs 0) */
    json_t *tops = json_object_get(l, "top_logprobs");
    assert_int_equal(json_array_size(tops), 3);
    assert_int_equal(json_object_size(json_array_get(tops, 1)), 1);
    assert_true(json_real_value(json_object_get(json_array_get(tops, 1), "h\xc3\xa9")) == -2.0);
    assert_true(json_real_value(json_object_get(json_array_get(tops, 0), "")) == -1.0);
    json_decref(j);
    free(s);
    /* vLLM's return_tokens_as_token_ids: named by id, the offsets kept. */
    req.tokens_as_ids = true;
    s = openai_chunk_json(&o, false, false);
    j = json_loads(s, 0, NULL);
    l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    assert_string_equal(json_string_value(json_array_get(json_object_get(l, "tokens"), 1)),
                        "token_id:2");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(l, "text_offset"), 2)), 7);
    json_decref(j);
    free(s);
    req.tokens_as_ids = false;
    o.token_text_ends = NULL;
    s = openai_chunk_json(&o, false, false);
    j = json_loads(s, 0, NULL);
    l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    assert_string_equal(json_string_value(json_array_get(json_object_get(l, "tokens"), 2)),
                        "token_id:3");
    /* no text: every token at the output's start */
    assert_int_equal(json_array_size(json_object_get(l, "text_offset")), 3);
    assert_int_equal(json_integer_value(json_array_get(json_object_get(l, "text_offset"), 2)), 5);
    json_decref(j);
    free(s);
    /* A whole answer whose text is empty: pieces still, all empty. */
    uint32_t none[3] = {0, 0, 0};
    o.token_text_ends = none;
    o.text = NULL;
    o.text_len = 0;
    o.text_offset = 0;
    s = openai_response_json(&o, 1);
    j = json_loads(s, 0, NULL);
    l = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "logprobs");
    assert_string_equal(json_string_value(json_array_get(json_object_get(l, "tokens"), 1)), "");
    assert_int_equal(json_integer_value(json_array_get(json_object_get(l, "text_offset"), 2)), 0);
    json_decref(j);
    free(s);
    assert_int_equal(openai_utf8_chars("h\xc3\xa9\xe4\xb8\xad", 6), 3);
    openai_request_fini(&req);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_a_completion_is_read),
        cmocka_unit_test(test_models_list),
        cmocka_unit_test(test_numbers_are_read_as_pydantic_reads_them),
        cmocka_unit_test(test_tools_need_tool_choice_none),
        cmocka_unit_test(test_tools_with_a_tool_call_parser),
        cmocka_unit_test(test_tool_calls_in_responses_and_chunks),
        cmocka_unit_test(test_parallel_tool_calls_false_keeps_the_first),
        cmocka_unit_test(test_a_list_of_prompts_is_read),
        cmocka_unit_test(test_a_chat_is_read),
        cmocka_unit_test(test_continue_final_message_is_read),
        cmocka_unit_test(test_bad_requests_are_400_with_a_reason),
        cmocka_unit_test(test_logit_bias_and_min_tokens_are_read),
        cmocka_unit_test(test_responses_and_chunks_are_openai_json),
        cmocka_unit_test(test_completion_logprobs_name_pieces),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
