/* gateway/tool_calls.c: tool calls parsed out of a chat's output, as vLLM's hermes and
 * llama3_json tool parsers take them, whole and streamed. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "common/error.h"
#include "gateway/tool_calls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The calls of a result or stream as one string: "name(arguments)" each. */
static void describe(const struct tool_call *calls, size_t n, char *out, size_t cap)
{
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < n; i++) {
        /* vLLM's id: chatcmpl-tool- and 32 hex digits */
        assert_int_equal(strlen(calls[i].id), TOOL_CALL_ID_BYTES - 1);
        assert_memory_equal(calls[i].id, "chatcmpl-tool-", 14);
        assert_int_equal(strspn(calls[i].id + 14, "0123456789abcdef"), 32);
        at += (size_t)snprintf(out + at, cap - at, "%s(%s)", calls[i].name, calls[i].arguments);
        assert_true(at < cap);
    }
}

/* A whole answer: its content ("<null>" for none) and calls. */
static void parse(enum tool_call_parser p, const char *text, char *content, size_t content_cap,
                  char *calls, size_t calls_cap)
{
    struct tool_calls_result r;
    assert_int_equal(tool_calls_parse(p, text, strlen(text), &r), 0);
    if (r.num_calls == 0) {
        assert_null(r.content);
        snprintf(content, content_cap, "%s", text); /* the caller's text is the content */
    } else {
        snprintf(content, content_cap, "%s", r.content ? r.content : "<null>");
        if (r.content != NULL)
            assert_int_equal(strlen(r.content), r.content_len);
    }
    describe(r.calls, r.num_calls, calls, calls_cap);
    if (r.num_calls > 1)
        assert_string_not_equal(r.calls[0].id, r.calls[1].id);
    tool_calls_result_fini(&r);
}

/* A stream fed text cut at the given offsets (ascending, within the text), then finished: what it
 * gave out, content and calls, and the calls it counts. */
static void stream(enum tool_call_parser p, const char *text, const size_t *cuts, size_t num_cuts,
                   char *content, size_t content_cap, char *calls, size_t calls_cap)
{
    struct tool_calls_stream *s;
    assert_int_equal(tool_calls_stream_new(p, &s), 0);
    struct tool_calls_output out = {0};
    size_t at = 0, len = strlen(text), content_len = 0, calls_len = 0, num_calls = 0;
    content[0] = calls[0] = '\0';
    for (size_t i = 0; i <= num_cuts; i++) {
        size_t to = i < num_cuts ? cuts[i] : len;
        if (to > at)
            assert_int_equal(tool_calls_stream_feed(s, text + at, to - at, &out), 0);
        else if (i == num_cuts)
            assert_int_equal(tool_calls_stream_feed(s, "", 0, &out), 0);
        if (i == num_cuts)
            assert_int_equal(tool_calls_stream_finish(s, &out), 0);
        at = to;
        assert_true(content_len + out.content_len < content_cap);
        memcpy(content + content_len, out.content ? out.content : "", out.content_len);
        content[content_len += out.content_len] = '\0';
        describe(out.calls, out.num_calls, calls + calls_len, calls_cap - calls_len);
        calls_len += strlen(calls + calls_len);
        num_calls += out.num_calls;
        tool_calls_output_clear(&out);
    }
    assert_int_equal(tool_calls_stream_num_calls(s), num_calls);
    tool_calls_output_fini(&out);
    tool_calls_stream_free(s);
}

/* Every way of cutting text in two and in three (and byte by byte) streams what one piece does. */
static void check_splits(enum tool_call_parser p, const char *text, const char *want_content,
                         const char *want_calls)
{
    char content[1024], calls[1024], c2[1024], k2[1024];
    stream(p, text, NULL, 0, content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(content, want_content);
    assert_string_equal(calls, want_calls);
    size_t len = strlen(text);
    for (size_t i = 0; i <= len; i++)
        for (size_t j = i; j <= len; j++) {
            size_t cuts[2] = {i, j};
            stream(p, text, cuts, 2, c2, sizeof(c2), k2, sizeof(k2));
            assert_string_equal(c2, content);
            assert_string_equal(k2, calls);
        }
    size_t *bytes = malloc(len * sizeof(*bytes));
    for (size_t i = 0; i < len; i++)
        bytes[i] = i + 1;
    stream(p, text, bytes, len, c2, sizeof(c2), k2, sizeof(k2));
    assert_string_equal(c2, content);
    assert_string_equal(k2, calls);
    free(bytes);
}

static const char WEATHER[] = "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}";

/* hermes, one call: its name, its arguments' JSON text, no content (null), a fresh id. */
static void test_hermes_one_call(void **state)
{
    (void)state;
    char text[256], content[256], calls[256];
    snprintf(text, sizeof(text), "<tool_call>\n%s\n</tool_call>", WEATHER);
    parse(TOOL_CALL_PARSER_HERMES, text, content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(content, "<null>");
    assert_string_equal(calls, "get_weather({\"city\": \"Paris\"})");
    /* the arguments as written, numbers keeping their digits, any depth */
    parse(TOOL_CALL_PARSER_HERMES,
          "<tool_call>{\"arguments\":{\"x\":0.1,\"y\":[{\"z\":\"}\\\"\"}]},\"name\":\"f\"}"
          "</tool_call>",
          content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(calls, "f({\"x\":0.1,\"y\":[{\"z\":\"}\\\"\"}]})");
    /* a repeated key is the last one, as Python's json reads it; an escaped key is read */
    parse(TOOL_CALL_PARSER_HERMES,
          "<tool_call>{\"name\": \"f\", \"arguments\": 1, \"argu\\u006dents\": {\"a\": true}}"
          "</tool_call>",
          content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(calls, "f({\"a\": true})");
}

/* hermes, text before two calls: the text is the content (whitespace kept, as vLLM's), the calls
 * in order; text after the calls is left out of a whole answer, as vLLM's. */
static void test_hermes_text_and_two_calls(void **state)
{
    (void)state;
    char text[512], content[256], calls[256];
    snprintf(text, sizeof(text),
             "Let me look.\n<tool_call>\n%s\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
             "\"arguments\": {}}\n</tool_call>\nDone.",
             WEATHER);
    parse(TOOL_CALL_PARSER_HERMES, text, content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(content, "Let me look.\n");
    assert_string_equal(calls, "get_weather({\"city\": \"Paris\"})now({})");
    /* streamed: the text between the calls, whitespace, is not content; the text after is */
    check_splits(TOOL_CALL_PARSER_HERMES, text, "Let me look.\n\nDone.",
                 "get_weather({\"city\": \"Paris\"})now({})");
    parse(TOOL_CALL_PARSER_HERMES,
          "\n<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>", content,
          sizeof(content), calls, sizeof(calls));
    assert_string_equal(content, "\n");
    /* no call: the text */
    parse(TOOL_CALL_PARSER_HERMES, "Paris is sunny. <tool_cal", content, sizeof(content), calls,
          sizeof(calls));
    assert_string_equal(content, "Paris is sunny. <tool_cal");
    assert_string_equal(calls, "");
}

/* A call that is not JSON, or not a call's JSON, leaves the whole text as the content and no
 * calls (vLLM's); streamed, its text goes out as content, markers and all. */
static void test_hermes_malformed_calls_are_text(void **state)
{
    (void)state;
    static const char *const bad[] = {
        "<tool_call>{\"name\": \"f\", \"arguments\": {</tool_call>",
        "<tool_call>{\"name\": \"f\"}</tool_call>",                      /* no arguments */
        "<tool_call>{\"name\": 3, \"arguments\": {}}</tool_call>",       /* a name not a string */
        "<tool_call>[\"f\", {}]</tool_call>",                            /* not an object */
        "<tool_call>{\"name\": \"f\", \"arguments\": {}} x</tool_call>", /* more after */
        "<tool_call>{\"name\": \"f\", \"parameters\": {}}</tool_call>",  /* llama3's key */
    };
    char content[256], calls[256];
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        parse(TOOL_CALL_PARSER_HERMES, bad[i], content, sizeof(content), calls, sizeof(calls));
        assert_string_equal(content, bad[i]);
        assert_string_equal(calls, "");
        check_splits(TOOL_CALL_PARSER_HERMES, bad[i], bad[i], "");
    }
    /* one bad call of two: the whole text, no calls */
    char text[512];
    snprintf(text, sizeof(text), "<tool_call>%s</tool_call><tool_call>{</tool_call>", WEATHER);
    parse(TOOL_CALL_PARSER_HERMES, text, content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(content, text);
    assert_string_equal(calls, "");
    /* streamed, the good call has gone out before the bad one shows */
    check_splits(TOOL_CALL_PARSER_HERMES, text, "<tool_call>{</tool_call>",
                 "get_weather({\"city\": \"Paris\"})");
}

/* A call left open at the end (a stop string "</tool_call>", max_tokens) is a call when its JSON
 * is whole (vLLM's "<tool_call>(.*)"), else text. */
static void test_hermes_unterminated_call(void **state)
{
    (void)state;
    char text[256], content[256], calls[256];
    snprintf(text, sizeof(text), "Sure.<tool_call>\n%s\n", WEATHER);
    parse(TOOL_CALL_PARSER_HERMES, text, content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(content, "Sure.");
    assert_string_equal(calls, "get_weather({\"city\": \"Paris\"})");
    check_splits(TOOL_CALL_PARSER_HERMES, text, "Sure.", "get_weather({\"city\": \"Paris\"})");
    const char *cut = "Sure.<tool_call>\n{\"name\": \"get_weather\", \"argu";
    parse(TOOL_CALL_PARSER_HERMES, cut, content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(content, cut);
    assert_string_equal(calls, "");
    check_splits(TOOL_CALL_PARSER_HERMES, cut, cut, "");
}

/* A stream holds back only text that may begin a marker: text that cannot goes out at once. */
static void test_hermes_stream_holds_back_only_a_marker_prefix(void **state)
{
    (void)state;
    struct tool_calls_stream *s;
    assert_int_equal(tool_calls_stream_new(TOOL_CALL_PARSER_HERMES, &s), 0);
    struct tool_calls_output out = {0};
    assert_int_equal(tool_calls_stream_feed(s, "a < b <tool", 11, &out), 0);
    assert_string_equal(out.content, "a < b ");
    tool_calls_output_clear(&out);
    assert_int_equal(tool_calls_stream_feed(s, "box", 3, &out), 0);
    assert_string_equal(out.content, "<toolbox");
    tool_calls_output_clear(&out);
    assert_int_equal(tool_calls_stream_feed(s, "<tool_call>{\"name\": \"f\", ", 25, &out), 0);
    assert_int_equal(out.content_len, 0);
    assert_int_equal(out.num_calls, 0);
    assert_int_equal(tool_calls_stream_feed(s, "\"arguments\": {}}</tool_call>", 28, &out), 0);
    assert_int_equal(out.num_calls, 1);
    assert_string_equal(out.calls[0].name, "f");
    assert_int_equal(tool_calls_stream_num_calls(s), 1);
    tool_calls_output_clear(&out);
    assert_int_equal(tool_calls_stream_feed(s, "\n", 1, &out), 0);
    assert_int_equal(tool_calls_stream_finish(s, &out), 0);
    assert_int_equal(out.content_len, 0); /* the newline after the call is not content */
    tool_calls_output_fini(&out);
    tool_calls_stream_free(s);
    /* every cut of a text with a call and text around it */
    char text[256];
    snprintf(text, sizeof(text), "I'll check <tool_call>%s</tool_call> ok <tool_ca", WEATHER);
    check_splits(TOOL_CALL_PARSER_HERMES, text, "I'll check  ok <tool_ca",
                 "get_weather({\"city\": \"Paris\"})");
}

/* llama3_json: one call with "parameters" (any depth, vLLM's regex stops at one level), several
 * separated by ';', after <|python_tag|>, "arguments" too; the content is null. */
static void test_llama3_json_calls(void **state)
{
    (void)state;
    char content[256], calls[512];
    static const struct {
        const char *text, *calls;
    } cases[] = {
        {"{\"name\": \"f\", \"parameters\": {\"a\": {\"b\": [1, {\"c\": \"};{\"}]}}}",
         "f({\"a\": {\"b\": [1, {\"c\": \"};{\"}]}})"},
        {"{\"name\": \"f\", \"parameters\": {\"x\": 1}}; {\"name\": \"g\", \"arguments\": {}}",
         "f({\"x\": 1})g({})"},
        {"<|python_tag|>{\"name\": \"f\", \"parameters\": {}};{\"name\": \"g\", \"parameters\": "
         "{\"s\": \"\\\"}\"}}\n",
         "f({})g({\"s\": \"\\\"}\"})"},
        {"\n {\"name\": \"f\", \"parameters\": {}}", "f({})"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        parse(TOOL_CALL_PARSER_LLAMA3_JSON, cases[i].text, content, sizeof(content), calls,
              sizeof(calls));
        assert_string_equal(content, "<null>");
        assert_string_equal(calls, cases[i].calls);
        check_splits(TOOL_CALL_PARSER_LLAMA3_JSON, cases[i].text, "", cases[i].calls);
    }
}

/* llama3_json: text is content, and so is the whole output where a call is malformed or left
 * open; text after the calls is content in a stream (a whole answer leaves it out). */
static void test_llama3_json_text(void **state)
{
    (void)state;
    static const char *const texts[] = {
        "Paris is sunny.",
        "<|python_tag|>print(1)",
        "<|python",
        "{\"name\": \"f\", \"parameters\": {}",  /* left open */
        "{\"name\": \"f\", \"parameters\": {]}", /* not JSON */
        "{\"name\": \"f\"}",                     /* no parameters */
        "The answer: {\"name\": \"f\", \"parameters\": {}}",
        " ",
        "",
    };
    char content[256], calls[256];
    for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); i++) {
        parse(TOOL_CALL_PARSER_LLAMA3_JSON, texts[i], content, sizeof(content), calls,
              sizeof(calls));
        assert_string_equal(content, texts[i]);
        assert_string_equal(calls, "");
        check_splits(TOOL_CALL_PARSER_LLAMA3_JSON, texts[i], texts[i], "");
    }
    const char *after = "{\"name\": \"f\", \"parameters\": {}}; \nthat is all";
    parse(TOOL_CALL_PARSER_LLAMA3_JSON, after, content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(content, "<null>");
    assert_string_equal(calls, "f({})");
    check_splits(TOOL_CALL_PARSER_LLAMA3_JSON, after, "; \nthat is all", "f({})");
    /* a bad second call: the whole text in a whole answer */
    const char *bad = "{\"name\": \"f\", \"parameters\": {}}; {\"name\": 1, \"parameters\": {}}";
    parse(TOOL_CALL_PARSER_LLAMA3_JSON, bad, content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(content, bad);
    assert_string_equal(calls, "");
}

/* Text before a call may hold a NUL (a model's byte 0x00): the content is all of it, its
 * length's bytes (a strndup cut it at the NUL while its length stayed, and the JSON writer read
 * past the copy). */
static void test_content_with_a_nul(void **state)
{
    (void)state;
    static const char text[] = "ab\0cd<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    struct tool_calls_result r;
    assert_int_equal(tool_calls_parse(TOOL_CALL_PARSER_HERMES, text, sizeof(text) - 1, &r), 0);
    assert_int_equal(r.num_calls, 1);
    assert_int_equal(r.content_len, 5);
    assert_memory_equal(r.content, "ab\0cd", 6); /* with its terminating NUL */
    tool_calls_result_fini(&r);
}

/* What Python's json reads, jansson's defaults refuse: an integer past 64 bits and "\u0000"
 * in the arguments are a call (their text as written); a name with a NUL is not one. (A real
 * past a double's range, 1e400, which Python reads as inf, jansson still refuses.) */
static void test_json_as_python_reads_it(void **state)
{
    (void)state;
    char content[256], calls[512];
    parse(TOOL_CALL_PARSER_HERMES,
          "<tool_call>{\"name\": \"f\", \"arguments\": {\"id\": 99999999999999999999, "
          "\"s\": \"a\\u0000b\"}}</tool_call>",
          content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(calls, "f({\"id\": 99999999999999999999, \"s\": \"a\\u0000b\"})");
    parse(TOOL_CALL_PARSER_LLAMA3_JSON,
          "{\"name\": \"g\", \"parameters\": {\"x\": -18446744073709551617}}", content,
          sizeof(content), calls, sizeof(calls));
    assert_string_equal(calls, "g({\"x\": -18446744073709551617})");
    const char *nul_name = "<tool_call>{\"name\": \"f\\u0000\", \"arguments\": {}}</tool_call>";
    parse(TOOL_CALL_PARSER_HERMES, nul_name, content, sizeof(content), calls, sizeof(calls));
    assert_string_equal(calls, "");
    assert_string_equal(content, nul_name);
}

/* Feeds n bytes of whitespace one at a time (a model writing newlines for ever), then tail. */
static void feed_whitespace(struct tool_calls_stream *s, struct tool_calls_output *out, size_t n,
                            const char *tail)
{
    for (size_t i = 0; i < n; i++)
        assert_int_equal(tool_calls_stream_feed(s, i % 2 ? "\n" : " ", 1, out), 0);
    assert_int_equal(tool_calls_stream_feed(s, tail, strlen(tail), out), 0);
    assert_int_equal(tool_calls_stream_finish(s, out), 0);
}

/* Whitespace streamed after a call (hermes, llama3_json) or before one (llama3_json) is scanned
 * once per piece: megabytes of it, byte by byte, take linear time (each piece rescanned all that
 * was held: 20,000 pieces of 16 bytes cost the loop 5.5 s, a million would not end), and a call
 * after it is still one. */
static void test_streamed_whitespace_is_scanned_once(void **state)
{
    (void)state;
    const size_t n = (size_t)3 << 20; /* past TOOL_CALLS_MAX_CALL_BYTES: dropped, as it would be */
    const char *call = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    struct tool_calls_stream *s;
    struct tool_calls_output out = {0};
    assert_int_equal(tool_calls_stream_new(TOOL_CALL_PARSER_HERMES, &s), 0);
    assert_int_equal(tool_calls_stream_feed(s, call, strlen(call), &out), 0);
    feed_whitespace(s, &out, n, call);
    assert_int_equal(out.num_calls, 2);
    assert_int_equal(out.content_len, 0);
    tool_calls_stream_free(s);
    tool_calls_output_fini(&out);

    const char *obj = "{\"name\": \"g\", \"parameters\": {}}";
    assert_int_equal(tool_calls_stream_new(TOOL_CALL_PARSER_LLAMA3_JSON, &s), 0);
    feed_whitespace(s, &out, n / 4, obj); /* at the start: a call after it */
    assert_int_equal(out.num_calls, 1);
    tool_calls_stream_free(s);
    tool_calls_output_fini(&out);

    assert_int_equal(tool_calls_stream_new(TOOL_CALL_PARSER_LLAMA3_JSON, &s), 0);
    assert_int_equal(tool_calls_stream_feed(s, obj, strlen(obj), &out), 0);
    assert_int_equal(tool_calls_stream_feed(s, ";", 1, &out), 0);
    feed_whitespace(s, &out, n, obj); /* between two calls */
    assert_int_equal(out.num_calls, 2);
    assert_int_equal(out.content_len, 0);
    tool_calls_stream_free(s);
    tool_calls_output_fini(&out);
}

static void test_parser_names(void **state)
{
    (void)state;
    enum tool_call_parser p = TOOL_CALL_PARSER_NONE;
    assert_int_equal(tool_call_parser_from_name("hermes", &p), 0);
    assert_int_equal(p, TOOL_CALL_PARSER_HERMES);
    assert_int_equal(tool_call_parser_from_name("llama3_json", &p), 0);
    assert_int_equal(p, TOOL_CALL_PARSER_LLAMA3_JSON);
    assert_int_equal(tool_call_parser_from_name("mistral", &p), PAGODA_EINVAL);
    struct tool_calls_stream *s;
    assert_int_equal(tool_calls_stream_new(TOOL_CALL_PARSER_NONE, &s), PAGODA_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hermes_one_call),
        cmocka_unit_test(test_hermes_text_and_two_calls),
        cmocka_unit_test(test_hermes_malformed_calls_are_text),
        cmocka_unit_test(test_hermes_unterminated_call),
        cmocka_unit_test(test_hermes_stream_holds_back_only_a_marker_prefix),
        cmocka_unit_test(test_llama3_json_calls),
        cmocka_unit_test(test_llama3_json_text),
        cmocka_unit_test(test_content_with_a_nul),
        cmocka_unit_test(test_json_as_python_reads_it),
        cmocka_unit_test(test_streamed_whitespace_is_scanned_once),
        cmocka_unit_test(test_parser_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
