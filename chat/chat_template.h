/* A model's chat template: read from the text of its tokenizer_config.json (or of its template
 * files, which text/text_model.c reads), compiled once, and applied to a chat (OpenAI-style
 * messages) to give the prompt text, as transformers' apply_chat_template(messages, tools=...,
 * add_generation_prompt=..., **kwargs) renders it.
 *
 * The template may be one string or a list of {"name", "template"}; as transformers does, the
 * "tool_use" template is used when tools are given and it exists, "default" otherwise.
 * The config's special tokens are passed to the template as transformers passes its
 * special_tokens_map: bos_token, eos_token, unk_token, pad_token, cls_token, sep_token,
 * mask_token (strings or AddedToken objects {"content": ...}) and additional_special_tokens (a
 * list), as are documents (none unless the caller's extra variables give it). Pure: no I/O; a
 * ChatTemplate may be applied by several threads at once. */
#ifndef PAGODA_CHAT_CHAT_TEMPLATE_H
#define PAGODA_CHAT_CHAT_TEMPLATE_H

#include <stdbool.h>
#include <stddef.h>

#include <jansson.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bounds on what a config and a chat may hold. */
#define CHAT_TEMPLATE_MAX_CONFIG_BYTES (16u << 20)
#define CHAT_TEMPLATE_MAX_TEMPLATES 16u
#define CHAT_TEMPLATE_MAX_MESSAGES 65536u
#define CHAT_TEMPLATE_MAX_TOOLS 4096u
/* The bytes of all strings of messages, tools and extra variables together. */
#define CHAT_TEMPLATE_MAX_INPUT_BYTES (16u << 20)
/* The deepest arrays and objects nest in messages, tools and extra variables. */
#define CHAT_TEMPLATE_MAX_NESTING 64u

typedef struct ChatTemplate ChatTemplate;

/* Reads the tokenizer_config.json text (len bytes) and compiles its chat template(s). On success
 * *out is the caller's, freed with chat_template_free. Errors: PAGODA_ENOENT (no chat_template),
 * PAGODA_EFORMAT (not JSON, or fields of the wrong type), PAGODA_ERANGE (too large), and the
 * template's own compile errors (PAGODA_EINVAL "chat template 'name': line N: ..."). */
int chat_template_new(const char *config_json, size_t len, ChatTemplate **out);

/* A template read from a file of the model's folder rather than from tokenizer_config.json:
 * chat_template.jinja ("default") or additional_chat_templates/NAME.jinja (NAME). */
typedef struct ChatTemplateFile {
    const char *name; /* the template's name */
    const char *text; /* its text, len bytes (it must be UTF-8) */
    size_t len;
    const char *origin; /* what errors name (the file's path) */
} ChatTemplateFile;

/* As chat_template_new, with the templates of files (n_files of them) when there are any: they
 * are then the only ones, whatever the config's chat_template holds (not even read), as
 * transformers' from_pretrained lets template files replace the config's. The special tokens
 * still come from the config (or special_tokens_map.json: chat_template_apply_special_tokens_map).
 * The caller keeps files. Errors also: PAGODA_EINVAL ("ORIGIN: not valid UTF-8", "ORIGIN: line N:
 * ..." for a template that is not Jinja), PAGODA_ERANGE (more than CHAT_TEMPLATE_MAX_TEMPLATES),
 * PAGODA_EFORMAT (two of one name). */
int chat_template_new_with(const char *config_json, size_t len, const ChatTemplateFile *files,
                           size_t n_files, ChatTemplate **out);

/* transformers' legacy loading: where the config has no added_tokens_decoder (a
 * tokenizer_config.json saved before transformers 4.34, or none: "{}"), the special tokens of
 * special_tokens_map.json replace the config's, each key the map names (a null one: none), as
 * from_pretrained lets the map win there; a config with added_tokens_decoder keeps its own
 * (chat_template_reads_special_tokens_map says which, so that a caller reads the map only where
 * it counts). model/model_config.c takes the tokenizer's EOS by the same rule. map_json: the
 * map's text, len bytes. Errors: PAGODA_EFORMAT ("special_tokens_map.json: ..."), PAGODA_ERANGE
 * (too large), PAGODA_ENOMEM. */
bool chat_template_reads_special_tokens_map(const ChatTemplate *ct);
int chat_template_apply_special_tokens_map(ChatTemplate *ct, const char *map_json, size_t len);

/* Frees; accepts NULL. */
void chat_template_free(ChatTemplate *ct);

/* True when the config has a template of that name ("default", "tool_use", ...). */
bool chat_template_has(const ChatTemplate *ct, const char *name);

/* The config's bos_token / eos_token, or NULL when it has none. Owned by ct. */
const char *chat_template_bos_token(const ChatTemplate *ct);
const char *chat_template_eos_token(const ChatTemplate *ct);

/* Renders messages (a JSON array of objects with a string "role" and a "content" that is a
 * string, null or absent; other fields such as tool_calls pass through) with tools (a JSON array,
 * or NULL: the template sees none), add_generation_prompt, and the variables of extra (a JSON
 * object or NULL, e.g. {"enable_thinking": false}; it may not set messages, tools or
 * add_generation_prompt). The caller keeps its JSON. On success *out is a NUL-terminated string
 * of *len bytes, the caller's to free(). Errors: PAGODA_EINVAL (invalid messages, tools or
 * extra, with the field named; or the template's raise_exception), PAGODA_ERANGE (limits), and
 * the template's render errors ("chat template: line N: ..."). */
int chat_template_apply(const ChatTemplate *ct, const json_t *messages, const json_t *tools,
                        bool add_generation_prompt, const json_t *extra, char **out, size_t *len);

/* As chat_template_apply with the template of the given name (NULL: chosen as above). Errors
 * also: PAGODA_ENOENT (no template of that name). */
int chat_template_apply_named(const ChatTemplate *ct, const char *name, const json_t *messages,
                              const json_t *tools, bool add_generation_prompt, const json_t *extra,
                              char **out, size_t *len);

/* continue_final_message (transformers' apply_chat_template, which vLLM passes it to): cuts a
 * rendered chat (*len bytes of text, cut in place) after the last occurrence of the final
 * message's content, so that the model continues that message instead of ending its turn (an
 * assistant's answer begun by the caller). transformers' rule, byte for byte: the content stripped
 * of white space (Python's str.strip) must occur in the text; the text ends at its last
 * occurrence plus the content's length without its leading white space where the text holds the
 * whole content there, else plus the stripped content's length. Errors: PAGODA_EINVAL (no
 * messages, a final message without a string content, or its text not in the rendered chat). */
int chat_template_continue_final(const json_t *messages, char *text, size_t *len);

#ifdef __cplusplus
}
#endif

#endif
