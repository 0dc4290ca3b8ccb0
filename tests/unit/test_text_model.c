/* text/text_model.c: where a model folder's chat template comes from. A folder with
 * chat_template.jinja (transformers 4.47's save_pretrained writes it, and no chat_template in
 * tokenizer_config.json) serves chats with it; with both, the file wins over the config, and
 * additional_chat_templates/NAME.jinja adds named templates, as transformers' from_pretrained
 * reads them; a broken template file stops the load with an error naming it. The folders are made
 * in /tmp around tests/data/tiny-text's tokenizer.json. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>

#include "common/error.h"
#include "text/text_model.h"

#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* tests/data/tiny-text's tokenizer_config.json, cut to what matters here */
#define CONFIG_WITH_TEMPLATE                                                                       \
    "{\"bos_token\": \"<|begin_of_text|>\", \"chat_template\": \"config: {{ bos_token }}\"}"

/* A new model folder holding a link to the test tokenizer; path gets its name. */
static void make_model(char *path, size_t size)
{
    snprintf(path, size, "/tmp/pagoda_text_model_XXXXXX");
    assert_non_null(mkdtemp(path));
    char from[PATH_MAX], to[PATH_MAX];
    const char *src = getenv("PAGODA_SOURCE_DIR");
    snprintf(from, sizeof(from), "%s/tests/data/tiny-text/tokenizer.json", src ? src : ".");
    char *abs = realpath(from, NULL);
    assert_non_null(abs);
    snprintf(to, sizeof(to), "%s/tokenizer.json", path);
    assert_int_equal(symlink(abs, to), 0);
    free(abs);
}

static void put(const char *dir, const char *name, const char *text, size_t len)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(text, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void remove_model(const char *dir)
{
    assert_int_equal(nftw(dir, remove_one, 8, FTW_DEPTH | FTW_PHYS), 0);
}

/* Renders one user message "hi", with tools or not, through the folder's model. */
static void render(const char *dir, bool tools, const char *want)
{
    struct text_model *m = NULL;
    int rc = text_model_open(dir, &m);
    if (rc != 0)
        fail_msg("open: %s", pagoda_error_detail());
    if (text_model_chat_error(m)[0] != '\0')
        fail_msg("chats refused: %s", text_model_chat_error(m));
    json_t *messages = json_loads("[{\"role\": \"user\", \"content\": \"hi\"}]", 0, NULL);
    json_t *tool_list = tools ? json_loads("[{\"type\": \"function\"}]", 0, NULL) : NULL;
    char *out = NULL;
    size_t len = 0;
    rc = text_model_render_chat(m, messages, tool_list, false, false, NULL, &out, &len);
    if (rc != 0)
        fail_msg("render: %s", pagoda_error_detail());
    if (strcmp(out, want) != 0)
        fail_msg("got [%s] want [%s]", out, want);
    free(out);
    json_decref(messages);
    json_decref(tool_list);
    text_model_close(m);
}

/* The open fails with rc and a detail that names DIR/name. */
static void refused(const char *dir, const char *name, int want_rc)
{
    struct text_model *m = NULL;
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    int rc = text_model_open(dir, &m);
    if (rc != want_rc)
        fail_msg("rc %d (%s), want %d", rc, pagoda_error_detail(), want_rc);
    if (strstr(pagoda_error_detail(), path) == NULL)
        fail_msg("[%s] does not name %s", pagoda_error_detail(), path);
    assert_null(m);
}

/* Only chat_template.jinja (read as Python reads text: "\r\n" and "\r" are "\n"): chats are served
 * with it, without special tokens since there is no tokenizer_config.json. Without it, chats are
 * refused, a processor's chat_template.json not standing in for it (transformers' tokenizer
 * does not read that file). */
static void test_template_file_alone(void **state)
{
    (void)state;
    char dir[64];
    make_model(dir, sizeof(dir));
    const char *processor = "{\"chat_template\": \"processor\"}";
    put(dir, "chat_template.json", processor, strlen(processor));
    struct text_model *m = NULL;
    assert_int_equal(text_model_open(dir, &m), 0);
    assert_non_null(strstr(text_model_chat_error(m), "chat_template.jinja"));
    assert_non_null(strstr(text_model_chat_error(m), "chat_template.json is a processor's"));
    text_model_close(m);
    const char *tpl = "file: {{ messages[0]['content'] }}\r\n{{ bos_token is defined }}\r.";
    put(dir, "chat_template.jinja", tpl, strlen(tpl));
    render(dir, false, "file: hi\nFalse\n.");
    remove_model(dir);
}

/* Both: chat_template.jinja wins over tokenizer_config.json's chat_template, whose special
 * tokens it still sees. */
static void test_template_file_over_config(void **state)
{
    (void)state;
    char dir[64];
    make_model(dir, sizeof(dir));
    put(dir, "tokenizer_config.json", CONFIG_WITH_TEMPLATE, strlen(CONFIG_WITH_TEMPLATE));
    render(dir, false, "config: <|begin_of_text|>");
    const char *tpl = "file: {{ bos_token }}";
    put(dir, "chat_template.jinja", tpl, strlen(tpl));
    render(dir, false, "file: <|begin_of_text|>");
    remove_model(dir);
}

/* additional_chat_templates/tool_use.jinja is the template for chats with tools; a config's list
 * of templates is replaced by the files, its tool_use with it. */
static void test_additional_templates(void **state)
{
    (void)state;
    char dir[64], sub[PATH_MAX];
    make_model(dir, sizeof(dir));
    const char *cfg = "{\"chat_template\": [{\"name\": \"default\", \"template\": \"config\"},"
                      " {\"name\": \"tool_use\", \"template\": \"config tools\"}]}";
    put(dir, "tokenizer_config.json", cfg, strlen(cfg));
    put(dir, "chat_template.jinja", "file", 4);
    render(dir, true, "file");
    snprintf(sub, sizeof(sub), "%s/additional_chat_templates", dir);
    assert_int_equal(mkdir(sub, 0755), 0);
    put(sub, "tool_use.jinja", "file tools", 10);
    put(sub, "notes.txt", "not a template", 14);
    render(dir, true, "file tools");
    render(dir, false, "file");
    remove_model(dir);
}

/* A broken chat_template.jinja stops the load, named: not Jinja, not UTF-8, empty, a directory;
 * the config's good template does not stand in for it. */
static void test_broken_template_file(void **state)
{
    (void)state;
    char dir[64], sub[PATH_MAX];
    make_model(dir, sizeof(dir));
    put(dir, "tokenizer_config.json", CONFIG_WITH_TEMPLATE, strlen(CONFIG_WITH_TEMPLATE));
    put(dir, "chat_template.jinja", "{% if %}", 8);
    refused(dir, "chat_template.jinja: line 1", PAGODA_EINVAL);
    put(dir, "chat_template.jinja", "caf\xe9", 4);
    refused(dir, "chat_template.jinja: not valid UTF-8", PAGODA_EINVAL);
    put(dir, "chat_template.jinja", "", 0);
    refused(dir, "chat_template.jinja: empty", PAGODA_EFORMAT);
    snprintf(sub, sizeof(sub), "%s/chat_template.jinja", dir);
    assert_int_equal(unlink(sub), 0);
    assert_int_equal(mkdir(sub, 0755), 0);
    refused(dir, "chat_template.jinja: not a regular file", PAGODA_EINVAL);
    assert_int_equal(rmdir(sub), 0);
    snprintf(sub, sizeof(sub), "%s/additional_chat_templates", dir);
    assert_int_equal(mkdir(sub, 0755), 0);
    put(sub, "tool_use.jinja", "{{ x", 4);
    refused(dir, "additional_chat_templates/tool_use.jinja: line 1", PAGODA_EINVAL);
    remove_model(dir);
}

/* special_tokens_map.json's special tokens replace those of a tokenizer_config.json without
 * added_tokens_decoder (saved before transformers 4.34), as transformers' legacy loading lets
 * them, and as the engine's EOS (model_config_add_tokenizer_eos) takes them: a null one removes
 * the config's; a config with added_tokens_decoder keeps its own, the map not even read; a broken
 * map stops the load where it counts, named. */
static void test_special_tokens_map(void **state)
{
    (void)state;
    char dir[64];
    make_model(dir, sizeof(dir));
    const char *legacy = "{\"bos_token\": \"<s>\", \"eos_token\": \"<|endoftext|>\", "
                         "\"chat_template\": \"{{ bos_token }}|{{ eos_token }}|{{ pad_token is "
                         "defined }}\"}";
    put(dir, "tokenizer_config.json", legacy, strlen(legacy));
    render(dir, false, "<s>|<|endoftext|>|False");
    const char *map = "{\"eos_token\": {\"content\": \"<|im_end|>\", \"lstrip\": false}, "
                      "\"bos_token\": null, \"pad_token\": \"<pad>\"}";
    put(dir, "special_tokens_map.json", map, strlen(map));
    render(dir, false, "|<|im_end|>|True");
    const char *current = "{\"bos_token\": \"<s>\", \"eos_token\": \"<|endoftext|>\", "
                          "\"added_tokens_decoder\": {}, \"chat_template\": \"{{ eos_token }}\"}";
    put(dir, "tokenizer_config.json", current, strlen(current));
    put(dir, "special_tokens_map.json", "{", 1);
    render(dir, false, "<|endoftext|>");
    put(dir, "tokenizer_config.json", legacy, strlen(legacy));
    refused(dir, "special_tokens_map.json: line 1", PAGODA_EFORMAT);
    put(dir, "special_tokens_map.json", "{\"eos_token\": 2}", 16);
    refused(dir, "special_tokens_map.json: eos_token must be a string", PAGODA_EFORMAT);
    remove_model(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_special_tokens_map),
        cmocka_unit_test(test_template_file_alone),
        cmocka_unit_test(test_template_file_over_config),
        cmocka_unit_test(test_additional_templates),
        cmocka_unit_test(test_broken_template_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
