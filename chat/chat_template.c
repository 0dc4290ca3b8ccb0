/* A model's chat templates (tokenizer_config.json's, or its template files'), and their
 * application to a chat. */
#include "chat/chat_template.h"

#include "chat/jinja.h"
#include "common/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct named_template {
    char *name;
    JinjaTemplate *tpl;
};

struct ChatTemplate {
    struct named_template t[CHAT_TEMPLATE_MAX_TEMPLATES];
    size_t n;
    json_t *tokens; /* {"bos_token": "...", ...}: the special tokens given to the template */
    bool legacy;    /* the config has no added_tokens_decoder: special_tokens_map.json wins */
};

/* transformers passes the tokenizer's special_tokens_map to the template: these, and
 * additional_special_tokens (a list). */
static const char *const SPECIAL_TOKENS[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                             "cls_token", "sep_token", "mask_token"};

/* A special token's text: a string, or an AddedToken object's "content"; NULL for none. file
 * names the source in a refusal. */
static int token_text(const json_t *tok, const char *file, const char *name, const json_t **out)
{
    if (json_is_object(tok))
        tok = json_object_get(tok, "content");
    *out = NULL;
    if (tok == NULL || json_is_null(tok))
        return 0;
    if (!json_is_string(tok))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: %s must be a string or an object with a string \"content\"",
                                file, name);
    *out = tok;
    return 0;
}

/* The special tokens root names (file: the one it was read from, which refusals name) replace
 * ct's: each key present sets its token, or removes it where the value is null. */
static int read_special_tokens(ChatTemplate *ct, const json_t *root, const char *file)
{
    int rc;
    for (size_t i = 0; i < sizeof(SPECIAL_TOKENS) / sizeof(SPECIAL_TOKENS[0]); i++) {
        const json_t *value = json_object_get(root, SPECIAL_TOKENS[i]), *tok;
        if (value == NULL)
            continue;
        if ((rc = token_text(value, file, SPECIAL_TOKENS[i], &tok)) != 0)
            return rc;
        if (tok == NULL)
            json_object_del(ct->tokens, SPECIAL_TOKENS[i]);
        else if (json_object_set(ct->tokens, SPECIAL_TOKENS[i], (json_t *)tok) != 0)
            return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    }
    const json_t *extra = json_object_get(root, "additional_special_tokens");
    if (extra == NULL)
        return 0;
    if (json_is_null(extra)) {
        json_object_del(ct->tokens, "additional_special_tokens");
        return 0;
    }
    if (!json_is_array(extra))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: additional_special_tokens must be a list",
                                file);
    json_t *list = json_array();
    if (list == NULL || json_object_set_new(ct->tokens, "additional_special_tokens", list) != 0)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    size_t i;
    const json_t *item;
    json_array_foreach(extra, i, item)
    {
        const json_t *tok;
        if ((rc = token_text(item, file, "additional_special_tokens[]", &tok)) != 0)
            return rc;
        if (tok != NULL && json_array_append(list, (json_t *)tok) != 0)
            return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    }
    return 0;
}

bool chat_template_reads_special_tokens_map(const ChatTemplate *ct)
{
    return ct->legacy;
}

int chat_template_apply_special_tokens_map(ChatTemplate *ct, const char *map_json, size_t len)
{
    if (!ct->legacy)
        return 0;
    if (len > CHAT_TEMPLATE_MAX_CONFIG_BYTES)
        return pagoda_error_set(PAGODA_ERANGE,
                                "special_tokens_map.json of %zu bytes, more than the %u allowed",
                                len, CHAT_TEMPLATE_MAX_CONFIG_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(map_json, len, JSON_DECODE_INT_AS_REAL, &jerr);
    if (root == NULL)
        return pagoda_error_set(PAGODA_EFORMAT, "special_tokens_map.json: line %d column %d: %s",
                                jerr.line, jerr.column, jerr.text);
    int rc = json_is_object(root)
                 ? read_special_tokens(ct, root, "special_tokens_map.json")
                 : pagoda_error_set(PAGODA_EFORMAT, "special_tokens_map.json: not a JSON object");
    json_decref(root);
    return rc;
}

void chat_template_free(ChatTemplate *ct)
{
    if (ct == NULL)
        return;
    for (size_t i = 0; i < ct->n; i++) {
        free(ct->t[i].name);
        jinja_template_free(ct->t[i].tpl);
    }
    json_decref(ct->tokens);
    free(ct);
}

/* origin: the file the template came from, which errors name; NULL for tokenizer_config.json,
 * whose errors name the template. */
static int add_template(ChatTemplate *ct, const char *name, const json_t *text, const char *origin)
{
    if (!json_is_string(text))
        return pagoda_error_set(PAGODA_EFORMAT, "chat_template '%s': the template must be a string",
                                name);
    if (ct->n == CHAT_TEMPLATE_MAX_TEMPLATES)
        return pagoda_error_set(PAGODA_ERANGE, "chat_template: more than %u templates",
                                CHAT_TEMPLATE_MAX_TEMPLATES);
    for (size_t i = 0; i < ct->n; i++)
        if (strcmp(ct->t[i].name, name) == 0)
            return pagoda_error_set(PAGODA_EFORMAT, "chat_template: two templates named '%s'",
                                    name);
    struct named_template *t = &ct->t[ct->n];
    t->name = strdup(name);
    if (t->name == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    int rc = jinja_template_new(json_string_value(text), json_string_length(text), &t->tpl);
    if (rc != 0) {
        char detail[512];
        snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
        free(t->name);
        if (origin != NULL)
            return pagoda_error_set(rc, "%s: %s", origin, detail);
        return pagoda_error_set(rc, "chat template '%s': %s", name, detail);
    }
    ct->n++;
    return 0;
}

int chat_template_new(const char *config_json, size_t len, ChatTemplate **out)
{
    return chat_template_new_with(config_json, len, NULL, 0, out);
}

int chat_template_new_with(const char *config_json, size_t len, const ChatTemplateFile *files,
                           size_t n_files, ChatTemplate **out)
{
    *out = NULL;
    if (len > CHAT_TEMPLATE_MAX_CONFIG_BYTES)
        return pagoda_error_set(PAGODA_ERANGE,
                                "tokenizer_config.json of %zu bytes, more than the %u allowed", len,
                                CHAT_TEMPLATE_MAX_CONFIG_BYTES);
    json_error_t jerr;
    /* Integers as reals: configs hold numbers beyond 64 bits (Llama 3's model_max_length is
     * 1e30 written as an integer), and only strings are read from them here. */
    json_t *root = json_loadb(config_json, len, JSON_DECODE_INT_AS_REAL, &jerr);
    if (root == NULL)
        return pagoda_error_set(PAGODA_EFORMAT, "tokenizer_config.json: line %d column %d: %s",
                                jerr.line, jerr.column, jerr.text);
    int rc = 0;
    ChatTemplate *ct = calloc(1, sizeof(*ct));
    if (ct == NULL || (ct->tokens = json_object()) == NULL) {
        rc = pagoda_error_set(PAGODA_ENOMEM, "out of memory");
        goto fail;
    }
    if (!json_is_object(root)) {
        rc = pagoda_error_set(PAGODA_EFORMAT, "tokenizer_config.json: not a JSON object");
        goto fail;
    }
    ct->legacy = json_object_get(root, "added_tokens_decoder") == NULL;
    if ((rc = read_special_tokens(ct, root, "tokenizer_config.json")) != 0)
        goto fail;
    const json_t *tpl = json_object_get(root, "chat_template");
    if (n_files > 0) {
        /* template files: they replace the config's, as in transformers */
        for (size_t i = 0; i < n_files; i++) {
            /* json_stringn checks the UTF-8, as Python's read of the file decodes it */
            json_t *text = json_stringn(files[i].text, files[i].len);
            if (text == NULL) {
                rc = pagoda_error_set(PAGODA_EINVAL, "%s: not valid UTF-8", files[i].origin);
                goto fail;
            }
            rc = add_template(ct, files[i].name, text, files[i].origin);
            json_decref(text);
            if (rc != 0)
                goto fail;
        }
        json_decref(root);
        *out = ct;
        return 0;
    }
    if (tpl == NULL || json_is_null(tpl)) {
        rc = pagoda_error_set(PAGODA_ENOENT, "tokenizer_config.json has no chat_template: this "
                                             "model takes prompts, not chats");
        goto fail;
    }
    if (json_is_string(tpl)) {
        rc = add_template(ct, "default", tpl, NULL);
    } else if (json_is_array(tpl)) {
        size_t i;
        const json_t *item;
        json_array_foreach(tpl, i, item)
        {
            const json_t *name = json_object_get(item, "name");
            if (!json_is_object(item) || !json_is_string(name)) {
                rc = pagoda_error_set(PAGODA_EFORMAT,
                                      "chat_template[%zu]: expected an object "
                                      "with a string \"name\"",
                                      i);
                break;
            }
            if ((rc = add_template(ct, json_string_value(name), json_object_get(item, "template"),
                                   NULL)) != 0)
                break;
        }
        if (rc == 0 && ct->n == 0)
            rc = pagoda_error_set(PAGODA_ENOENT, "tokenizer_config.json: chat_template is an "
                                                 "empty list");
    } else {
        rc = pagoda_error_set(PAGODA_EFORMAT,
                              "tokenizer_config.json: chat_template must be a string or a list "
                              "of {name, template}");
    }
    if (rc != 0)
        goto fail;
    json_decref(root);
    *out = ct;
    return 0;
fail:
    json_decref(root);
    chat_template_free(ct);
    return rc;
}

bool chat_template_has(const ChatTemplate *ct, const char *name)
{
    for (size_t i = 0; ct != NULL && i < ct->n; i++)
        if (strcmp(ct->t[i].name, name) == 0)
            return true;
    return false;
}

const char *chat_template_bos_token(const ChatTemplate *ct)
{
    return json_string_value(json_object_get(ct->tokens, "bos_token"));
}

const char *chat_template_eos_token(const ChatTemplate *ct)
{
    return json_string_value(json_object_get(ct->tokens, "eos_token"));
}

/* The bytes of the strings in j (bounded walk: stops counting past the limit, and past
 * CHAT_TEMPLATE_MAX_NESTING levels, where it sets *too_deep). */
static size_t string_bytes(const json_t *j, unsigned depth, bool *too_deep)
{
    size_t n = 0;
    if (depth > CHAT_TEMPLATE_MAX_NESTING) {
        *too_deep = true;
        return CHAT_TEMPLATE_MAX_INPUT_BYTES + 1;
    }
    if (json_is_string(j))
        return json_string_length(j);
    if (json_is_array(j)) {
        size_t i;
        const json_t *v;
        json_array_foreach(j, i, v)
        {
            n += string_bytes(v, depth + 1, too_deep);
            if (n > CHAT_TEMPLATE_MAX_INPUT_BYTES)
                break;
        }
    } else if (json_is_object(j)) {
        const char *k;
        const json_t *v;
        json_object_foreach((json_t *)j, k, v)
        {
            n += strlen(k) + string_bytes(v, depth + 1, too_deep);
            if (n > CHAT_TEMPLATE_MAX_INPUT_BYTES)
                break;
        }
    }
    return n;
}

static int check_messages(const json_t *messages)
{
    if (!json_is_array(messages))
        return pagoda_error_set(PAGODA_EINVAL, "messages must be an array");
    if (json_array_size(messages) > CHAT_TEMPLATE_MAX_MESSAGES)
        return pagoda_error_set(PAGODA_ERANGE, "%zu messages, more than the %u allowed",
                                json_array_size(messages), CHAT_TEMPLATE_MAX_MESSAGES);
    size_t i;
    const json_t *m;
    json_array_foreach(messages, i, m)
    {
        if (!json_is_object(m))
            return pagoda_error_set(PAGODA_EINVAL, "messages[%zu] must be an object", i);
        if (!json_is_string(json_object_get(m, "role")))
            return pagoda_error_set(PAGODA_EINVAL, "messages[%zu].role must be a string", i);
        const json_t *c = json_object_get(m, "content");
        if (c != NULL && !json_is_string(c) && !json_is_null(c))
            return pagoda_error_set(PAGODA_EINVAL, "messages[%zu].content must be a string or null",
                                    i);
        const json_t *tc = json_object_get(m, "tool_calls");
        if (tc != NULL && !json_is_array(tc) && !json_is_null(tc))
            return pagoda_error_set(PAGODA_EINVAL, "messages[%zu].tool_calls must be an array", i);
    }
    return 0;
}

int chat_template_apply_named(const ChatTemplate *ct, const char *name, const json_t *messages,
                              const json_t *tools, bool add_generation_prompt, const json_t *extra,
                              char **out, size_t *len)
{
    *out = NULL;
    *len = 0;
    int rc = check_messages(messages);
    if (rc != 0)
        return rc;
    if (tools != NULL && !json_is_array(tools) && !json_is_null(tools))
        return pagoda_error_set(PAGODA_EINVAL, "tools must be an array");
    if (json_is_array(tools) && json_array_size(tools) > CHAT_TEMPLATE_MAX_TOOLS)
        return pagoda_error_set(PAGODA_ERANGE, "%zu tools, more than the %u allowed",
                                json_array_size(tools), CHAT_TEMPLATE_MAX_TOOLS);
    if (extra != NULL && !json_is_object(extra))
        return pagoda_error_set(PAGODA_EINVAL, "the extra template variables must be an object");
    if (extra != NULL && (json_object_get(extra, "messages") || json_object_get(extra, "tools") ||
                          json_object_get(extra, "add_generation_prompt")))
        return pagoda_error_set(PAGODA_EINVAL, "the extra template variables may not set "
                                               "messages, tools or add_generation_prompt");
    bool too_deep = false;
    size_t bytes = string_bytes(messages, 0, &too_deep);
    if (bytes <= CHAT_TEMPLATE_MAX_INPUT_BYTES && tools != NULL)
        bytes += string_bytes(tools, 0, &too_deep);
    if (bytes <= CHAT_TEMPLATE_MAX_INPUT_BYTES && extra != NULL)
        bytes += string_bytes(extra, 0, &too_deep);
    if (too_deep)
        return pagoda_error_set(PAGODA_ERANGE,
                                "the chat's messages, tools or template variables nest deeper "
                                "than %u levels",
                                CHAT_TEMPLATE_MAX_NESTING);
    if (bytes > CHAT_TEMPLATE_MAX_INPUT_BYTES)
        return pagoda_error_set(PAGODA_ERANGE, "the chat holds more than %u bytes of text",
                                CHAT_TEMPLATE_MAX_INPUT_BYTES);

    const struct named_template *t = NULL;
    const char *want = name;
    if (want == NULL)
        want = json_is_array(tools) && chat_template_has(ct, "tool_use") ? "tool_use" : "default";
    for (size_t i = 0; i < ct->n; i++)
        if (strcmp(ct->t[i].name, want) == 0)
            t = &ct->t[i];
    if (t == NULL && name == NULL && ct->n == 1)
        t = &ct->t[0];
    if (t == NULL)
        return pagoda_error_set(PAGODA_ENOENT, "the model has no chat template named '%s'", want);

    /* transformers: special tokens, then the caller's kwargs over them, then the fixed names;
     * documents (RAG templates) is none unless the caller gives it */
    json_t *vars = json_deep_copy(ct->tokens);
    if (vars == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    if ((extra != NULL && json_object_update(vars, (json_t *)extra) != 0) ||
        json_object_set(vars, "messages", (json_t *)messages) != 0 ||
        json_object_set_new(vars, "tools", tools ? json_incref((json_t *)tools) : json_null()) !=
            0 ||
        json_object_set_new(vars, "add_generation_prompt", json_boolean(add_generation_prompt)) !=
            0 ||
        (json_object_get(vars, "documents") == NULL &&
         json_object_set_new(vars, "documents", json_null()) != 0)) {
        json_decref(vars);
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    }
    rc = jinja_render(t->tpl, vars, out, len);
    json_decref(vars);
    if (rc != 0) {
        char detail[512];
        snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
        return pagoda_error_set(rc, "chat template '%s': %s", t->name, detail);
    }
    return 0;
}

int chat_template_apply(const ChatTemplate *ct, const json_t *messages, const json_t *tools,
                        bool add_generation_prompt, const json_t *extra, char **out, size_t *len)
{
    return chat_template_apply_named(ct, NULL, messages, tools, add_generation_prompt, extra, out,
                                     len);
}

/* The length of the white space (Python's str.isspace: ASCII's, U+001C..U+001F, U+0085, U+00A0,
 * U+1680, U+2000..U+200A, U+2028, U+2029, U+202F, U+205F, U+3000) at s, 0 when none. */
static size_t space_at(const unsigned char *s, size_t n)
{
    if (n >= 1 && ((s[0] >= 0x09 && s[0] <= 0x0d) || (s[0] >= 0x1c && s[0] <= 0x20)))
        return 1;
    if (n >= 2 && s[0] == 0xc2 && (s[1] == 0x85 || s[1] == 0xa0))
        return 2;
    if (n >= 3 && s[0] == 0xe1 && s[1] == 0x9a && s[2] == 0x80)
        return 3;
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x80 &&
        ((s[2] >= 0x80 && s[2] <= 0x8a) || s[2] == 0xa8 || s[2] == 0xa9 || s[2] == 0xaf))
        return 3;
    if (n >= 3 && s[0] == 0xe2 && s[1] == 0x81 && s[2] == 0x9f)
        return 3;
    if (n >= 3 && s[0] == 0xe3 && s[1] == 0x80 && s[2] == 0x80)
        return 3;
    return 0;
}

/* The length of the white space that ends s[0..n) (a UTF-8 string). */
static size_t space_before(const unsigned char *s, size_t n)
{
    size_t total = 0;
    while (total < n) {
        size_t k = 1;
        while (k < 3 && k < n - total && (s[n - total - k] & 0xc0) == 0x80)
            k++; /* the start of the last character */
        if (space_at(s + n - total - k, k) != k)
            break;
        total += k;
    }
    return total;
}

int chat_template_continue_final(const json_t *messages, char *text, size_t *len)
{
    size_t n = json_is_array(messages) ? json_array_size(messages) : 0;
    if (n == 0)
        return pagoda_error_set(PAGODA_EINVAL, "continue_final_message: there is no message");
    const json_t *content = json_object_get(json_array_get(messages, n - 1), "content");
    if (!json_is_string(content))
        return pagoda_error_set(PAGODA_EINVAL, "continue_final_message: the final message has no "
                                               "text to continue");
    const unsigned char *msg = (const unsigned char *)json_string_value(content);
    size_t msg_len = json_string_length(content), lead = 0, k;
    while (lead < msg_len && (k = space_at(msg + lead, msg_len - lead)) > 0)
        lead += k;
    size_t trail = lead < msg_len ? space_before(msg + lead, msg_len - lead) : 0;
    const unsigned char *core = msg + lead; /* final_message.strip() */
    size_t core_len = msg_len - lead - trail;
    /* rindex: the last occurrence (an empty one is at the end) */
    size_t at = *len;
    bool found = core_len == 0;
    for (size_t i = *len >= core_len ? *len - core_len + 1 : 0; !found && i-- > 0;)
        if (memcmp(text + i, core, core_len) == 0) {
            at = i;
            found = true;
        }
    if (!found)
        return pagoda_error_set(PAGODA_EINVAL,
                                "continue_final_message: the final message does not appear in "
                                "the chat the template renders (the template changes it)");
    size_t lstripped = msg_len - lead; /* len(final_message.lstrip()) */
    size_t end = at + core_len;
    if (lead == 0 && at + lstripped <= *len && memcmp(text + at, msg, msg_len) == 0)
        end = at + lstripped;
    *len = end;
    text[end] = '\0';
    return 0;
}
