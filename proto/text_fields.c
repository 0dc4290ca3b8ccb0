/* The text fields SubmitRequest and TokenizeRequest share (text_fields.h). */
#include "proto/text_fields.h"

/* The one list of the shared fields: both messages name them alike. */
#define COPY_TEXT_FIELDS(d, s)                                                                     \
    do {                                                                                           \
        (d)->has_prompt_text = (s)->has_prompt_text;                                               \
        (d)->prompt_text = (s)->prompt_text;                                                       \
        (d)->n_messages = (s)->n_messages;                                                         \
        (d)->messages = (s)->messages;                                                             \
        (d)->has_add_generation_prompt = (s)->has_add_generation_prompt;                           \
        (d)->add_generation_prompt = (s)->add_generation_prompt;                                   \
        (d)->has_continue_final_message = (s)->has_continue_final_message;                         \
        (d)->continue_final_message = (s)->continue_final_message;                                 \
        (d)->chat_template_kwargs = (s)->chat_template_kwargs;                                     \
        (d)->tools_json = (s)->tools_json;                                                         \
        (d)->has_add_special_tokens = (s)->has_add_special_tokens;                                 \
        (d)->add_special_tokens = (s)->add_special_tokens;                                         \
    } while (0)

void text_fields_to_tokenize(Pagoda__TokenizeRequest *t, const Pagoda__SubmitRequest *s)
{
    COPY_TEXT_FIELDS(t, s);
}

void text_fields_to_submit(Pagoda__SubmitRequest *s, const Pagoda__TokenizeRequest *t)
{
    COPY_TEXT_FIELDS(s, t);
}
