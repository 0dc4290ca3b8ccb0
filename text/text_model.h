/* A served model's text side, read from its folder: the tokenizer (tokenizer.json) and the chat
 * template with its special tokens (tokenizer_config.json; the template from chat_template.jinja
 * and additional_chat_templates/ instead when there are such files, as transformers reads them:
 * text_model.c). What every front needs to take text or a chat in and give text out; pure (files
 * are read by text_model_open only, which a caller runs off its event loop or before it starts).
 * A text_model may be used by several threads at once.
 *
 * Decisions (as vLLM makes them): a text prompt is encoded with add_special_tokens on (Llama's
 * BOS), a rendered chat with it off (the template writes the BOS itself); a chat is rendered with
 * the template chat/chat_template.h chooses ("tool_use" with tools when there is one, else
 * "default"). */
#ifndef PAGODA_TEXT_TEXT_MODEL_H
#define PAGODA_TEXT_TEXT_MODEL_H

#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

struct text_model;

/* Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json, DIR/chat_template.jinja
 * and the .jinja files of DIR/additional_chat_templates. On success *out is the caller's
 * (text_model_close); chats may still be refused (text_model_chat_error): without a template file
 * and without a tokenizer_config.json or a chat_template in it, or with a template beyond
 * chat/jinja.h's subset (PAGODA_EUNSUPPORTED) or limits (PAGODA_ERANGE), which transformers would
 * still apply. Errors, by what they mean to a server (pagoda-router's start, docs/text.md):
 *   - PAGODA_ENOENT: DIR has no tokenizer.json (nothing by that name, not even a symbolic link):
 *     the model serves token ids only;
 *   - PAGODA_EUNSUPPORTED, PAGODA_ERANGE: a tokenizer.json that asks for what tokenizer/ does not
 *     implement, or is over its limits: valid for HF, not served by pagoda (token ids only);
 *   - PAGODA_ENOMEM;
 *   - any other: the files are broken, the detail naming the file and the cause: a tokenizer.json
 *     or tokenizer_config.json that cannot be read (a symbolic link to nothing, no permission,
 *     not a regular file), is not JSON or has a field of the wrong type (transformers, and so
 *     vLLM, would not load the tokenizer), a template file that cannot be read, is not UTF-8
 *     (PAGODA_EINVAL) or is empty (PAGODA_EFORMAT), or a chat template that is not Jinja at all
 *     (PAGODA_EINVAL, "line N: ...": jinja2 refuses it too, docs/chat-templates.md). */
int text_model_open(const char *dir, struct text_model **out);

/* Frees a text model; accepts NULL. */
void text_model_close(struct text_model *m);

const Tokenizer *text_model_tokenizer(const struct text_model *m);

/* Why chats are refused ("" when the model has a usable chat template). */
const char *text_model_chat_error(const struct text_model *m);

/* Renders a chat (messages: a JSON array of OpenAI chat messages; tools: a JSON array or NULL;
 * kwargs: a JSON object of further template variables or NULL) into a prompt text, *out the
 * caller's to free(); with continue_final_message, cut after the final message's content
 * (chat/chat_template.h chat_template_continue_final: the model continues that message; both it
 * and add_generation_prompt true is PAGODA_EINVAL, as transformers refuses). Errors: PAGODA_ENOENT
 * (no chat template: the detail says why), the template's errors (PAGODA_EINVAL for a bad message
 * or a raise_exception, with the template's line), PAGODA_ERANGE (a limit). */
int text_model_render_chat(const struct text_model *m, const json_t *messages, const json_t *tools,
                           bool add_generation_prompt, bool continue_final_message,
                           const json_t *kwargs, char **out, size_t *out_len);

#endif
