/* Tests of chat/chat_template.h: the shapes of tokenizer_config.json's chat_template and special
 * tokens, the choice of the tool_use template, validation of messages, and refusals. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "chat/chat_template.h"
#include "common/error.h"

#include <stdlib.h>
#include <string.h>

static ChatTemplate *load(const char *cfg, int want_rc)
{
    ChatTemplate *ct = NULL;
    int rc = chat_template_new(cfg, strlen(cfg), &ct);
    if (rc != want_rc)
        fail_msg("rc %d (%s), want %d", rc, pagoda_error_detail(), want_rc);
    return ct;
}

static void apply(ChatTemplate *ct, const char *msgs, const char *tools, bool agp,
                  const char *extra, int want_rc, const char *want)
{
    json_error_t e;
    json_t *m = json_loads(msgs, 0, &e), *t = tools ? json_loads(tools, 0, &e) : NULL;
    json_t *x = extra ? json_loads(extra, 0, &e) : NULL;
    char *out = NULL;
    size_t len;
    int rc = chat_template_apply(ct, m, t, agp, x, &out, &len);
    if (rc != want_rc)
        fail_msg("rc %d (%s), want %d", rc, pagoda_error_detail(), want_rc);
    if (rc == 0 && strcmp(out, want) != 0)
        fail_msg("got [%s] want [%s]", out, want);
    if (rc != 0 && strstr(pagoda_error_detail(), want) == NULL)
        fail_msg("detail [%s] lacks [%s]", pagoda_error_detail(), want);
    free(out);
    json_decref(m);
    json_decref(t);
    json_decref(x);
}

static void test_string_template_and_tokens(void **state)
{
    (void)state;
    ChatTemplate *ct = load(
        "{\"bos_token\": {\"content\": \"<s>\", \"lstrip\": false}, \"eos_token\": \"</s>\","
        " \"model_max_length\": 1000000000000000019884624838656,"
        " \"chat_template\": \"{{ bos_token }}{% for m in messages %}[{{ m.role }}:{{ m.content }}]"
        "{% endfor %}{% if add_generation_prompt %}>{% endif %}{{ eos_token }}{{ x }}\"}",
        0);
    assert_string_equal(chat_template_bos_token(ct), "<s>");
    assert_string_equal(chat_template_eos_token(ct), "</s>");
    apply(ct, "[{\"role\": \"user\", \"content\": \"hi\"}]", NULL, true, "{\"x\": 1}", 0,
          "<s>[user:hi]></s>1");
    apply(ct, "[{\"role\": \"assistant\", \"content\": null}]", NULL, false, NULL, 0,
          "<s>[assistant:None]</s>");
    apply(ct, "{}", NULL, false, NULL, PAGODA_EINVAL, "messages must be an array");
    /* Variables nested 65 levels deep (64 are accepted): refused for their depth, not their
     * size. */
    char deep[512], ok[512];
    size_t n = 0, k = 0;
    n += (size_t)snprintf(deep + n, sizeof(deep) - n, "{\"y\": ");
    k += (size_t)snprintf(ok + k, sizeof(ok) - k, "{\"y\": ");
    for (int i = 0; i < 64; i++)
        n += (size_t)snprintf(deep + n, sizeof(deep) - n, "[");
    for (int i = 0; i < 63; i++)
        k += (size_t)snprintf(ok + k, sizeof(ok) - k, "[");
    n += (size_t)snprintf(deep + n, sizeof(deep) - n, "\"s\"");
    k += (size_t)snprintf(ok + k, sizeof(ok) - k, "\"s\"");
    for (int i = 0; i < 64; i++)
        n += (size_t)snprintf(deep + n, sizeof(deep) - n, "]");
    for (int i = 0; i < 63; i++)
        k += (size_t)snprintf(ok + k, sizeof(ok) - k, "]");
    snprintf(deep + n, sizeof(deep) - n, "}");
    snprintf(ok + k, sizeof(ok) - k, "}");
    apply(ct, "[]", NULL, false, ok, 0, "<s></s>");
    apply(ct, "[]", NULL, false, deep, PAGODA_ERANGE, "nest deeper than 64 levels");
    apply(ct, "[{\"content\": \"x\"}]", NULL, false, NULL, PAGODA_EINVAL,
          "messages[0].role must be a string");
    apply(ct, "[{\"role\": \"user\", \"content\": 3}]", NULL, false, NULL, PAGODA_EINVAL,
          "messages[0].content must be a string or null");
    apply(ct, "[]", NULL, false, "{\"messages\": 1}", PAGODA_EINVAL, "may not set messages");
    chat_template_free(ct);
}

static void test_named_templates(void **state)
{
    (void)state;
    ChatTemplate *ct = load("{\"chat_template\": [{\"name\": \"default\", \"template\": \"D\"},"
                            " {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}",
                            0);
    assert_true(chat_template_has(ct, "tool_use"));
    assert_null(chat_template_bos_token(ct));
    apply(ct, "[]", NULL, false, NULL, 0, "D");
    apply(ct, "[]", "[{\"type\": \"function\"}]", false, NULL, 0, "T1");
    chat_template_free(ct);
}

static void test_special_tokens_map(void **state)
{
    (void)state;
    ChatTemplate *ct = load(
        "{\"pad_token\": null, \"mask_token\": {\"content\": \"<mask>\"},"
        " \"additional_special_tokens\": [\"<a>\", {\"content\": \"<b>\"}],"
        " \"chat_template\": \"{{ mask_token }}{{ additional_special_tokens|join(',') }}"
        "{{ pad_token is defined }}{{ documents is none }}{{ documents|length if documents }}\"}",
        0);
    apply(ct, "[]", NULL, false, NULL, 0, "<mask><a>,<b>FalseTrue");
    apply(ct, "[]", NULL, false, "{\"documents\": [1, 2]}", 0, "<mask><a>,<b>FalseFalse2");
    chat_template_free(ct);
    load("{\"additional_special_tokens\": [3], \"chat_template\": \"x\"}", PAGODA_EFORMAT);
    load("{\"bos_token\": 1, \"chat_template\": \"x\"}", PAGODA_EFORMAT);
}

static void test_template_file(void **state)
{
    (void)state;
    /* the files replace the config's templates, its tool_use too; its tokens stay */
    const char *cfg = "{\"bos_token\": \"<s>\", \"chat_template\": [{\"name\": \"default\","
                      " \"template\": \"config\"}, {\"name\": \"tool_use\", \"template\": \"x\"}]}";
    const char *file = "{{ bos_token }}from the file\n";
    ChatTemplateFile files[] = {{"default", file, strlen(file), "/m/chat_template.jinja"},
                                {"rag", "rag", 3, "/m/additional_chat_templates/rag.jinja"}};
    ChatTemplate *ct = NULL;
    assert_int_equal(chat_template_new_with(cfg, strlen(cfg), files, 2, &ct), 0);
    apply(ct, "[]", "[]", false, NULL, 0, "<s>from the file");
    assert_false(chat_template_has(ct, "tool_use"));
    assert_true(chat_template_has(ct, "rag"));
    chat_template_free(ct);
    /* a config without a template, and a file */
    const char *bare = "{\"eos_token\": \"</s>\"}";
    files[0] = (ChatTemplateFile){"default", "{{ eos_token }}", 15, "/m/chat_template.jinja"};
    assert_int_equal(chat_template_new_with(bare, strlen(bare), files, 1, &ct), 0);
    apply(ct, "[]", NULL, false, NULL, 0, "</s>");
    chat_template_free(ct);
    /* errors name the file */
    files[0] = (ChatTemplateFile){"default", "{% if %}", 8, "/m/chat_template.jinja"};
    assert_int_equal(chat_template_new_with(bare, strlen(bare), files, 1, &ct), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "/m/chat_template.jinja: line 1"));
    files[0] = (ChatTemplateFile){"default", "\xff", 1, "/m/chat_template.jinja"};
    assert_int_equal(chat_template_new_with(bare, strlen(bare), files, 1, &ct), PAGODA_EINVAL);
    assert_string_equal(pagoda_error_detail(), "/m/chat_template.jinja: not valid UTF-8");
}

static void test_refusals(void **state)
{
    (void)state;
    load("{\"bos_token\": \"<s>\"}", PAGODA_ENOENT);
    assert_non_null(strstr(pagoda_error_detail(), "no chat_template"));
    load("{\"chat_template\": 3}", PAGODA_EFORMAT);
    load("not json", PAGODA_EFORMAT);
    load("{\"chat_template\": \"a\\n{% if %}\"}", PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "chat template 'default': line 2:"));
    ChatTemplate *ct = load("{\"chat_template\": \"{{ raise_exception('no system') }}\"}", 0);
    apply(ct, "[]", NULL, false, NULL, PAGODA_EINVAL, "line 1: raise_exception: no system");
    chat_template_free(ct);
}

/* continue_final_message's cut, transformers' rule: each case's expected text is what
 * apply_chat_template's Python gives for that rendered text and final message (computed with it):
 * the last occurrence of the stripped content; the whole content kept where the text holds it,
 * else the stripped content (a template that trims); Unicode white space as str.strip's. */
static void test_continue_final_message(void **state)
{
    (void)state;
    static const struct {
        const char *rendered, *content, *want; /* want NULL: refused */
    } cases[] = {
        {"<u>hi</u><a>The answer is</a>", "The answer is", "<u>hi</u><a>The answer is"},
        {"<u>hi</u><a>The answer is</a>", "The answer is ", "<u>hi</u><a>The answer is"},
        {"<u>hi</u><a>The answer is </a>", "The answer is ", "<u>hi</u><a>The answer is "},
        {"<u>x</u><a>  x</a>", "  x", "<u>x</u><a>  x"},
        {"<u>hi</u><a>hi</a>", "hi", "<u>hi</u><a>hi"},
        {"<u>hi</u><a>yo</a>", "nope", NULL},
        {"<u>hi</u><a></a>", "", "<u>hi</u><a></a>"},
        {"<u>hi</u><a></a>", "   ", "<u>hi</u><a></a>"},
        {"<a>x\u00a0y\u3000</a>", "x\u00a0y\u3000", "<a>x\u00a0y\u3000"},
        {"<a>x\u00a0y</a>", "\u2003x\u00a0y\u3000", "<a>x\u00a0y"},
        {"<a>\u00e9  </a>", "\u00e9  \n", "<a>\u00e9"},
        {"<a>ab</a>", "abc", NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        json_t *messages = json_pack("[{s:s, s:s}, {s:s, s:s}]", "role", "user", "content", "q",
                                     "role", "assistant", "content", cases[i].content);
        assert_non_null(messages);
        char text[128];
        size_t len = strlen(cases[i].rendered);
        memcpy(text, cases[i].rendered, len + 1);
        int rc = chat_template_continue_final(messages, text, &len);
        if (cases[i].want == NULL) {
            assert_int_equal(rc, PAGODA_EINVAL);
            assert_non_null(strstr(pagoda_error_detail(), "does not appear"));
        } else {
            if (rc != 0)
                fail_msg("case %zu: %s", i, pagoda_error_detail());
            assert_string_equal(text, cases[i].want);
            assert_int_equal(len, strlen(cases[i].want));
        }
        json_decref(messages);
    }
    /* no text to continue: no message, a null content */
    char text[] = "<a></a>";
    size_t len = strlen(text);
    json_t *none = json_array(),
           *null_content = json_pack("[{s:s, s:n}]", "role", "assistant", "content");
    assert_int_equal(chat_template_continue_final(none, text, &len), PAGODA_EINVAL);
    assert_int_equal(chat_template_continue_final(null_content, text, &len), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "no text to continue"));
    json_decref(none);
    json_decref(null_content);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_string_template_and_tokens),
        cmocka_unit_test(test_named_templates),
        cmocka_unit_test(test_special_tokens_map),
        cmocka_unit_test(test_template_file),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_continue_final_message),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
