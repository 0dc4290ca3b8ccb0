/* libFuzzer target: chat/jinja.h. The bytes are a template, compiled and, when it compiles,
 * rendered with a small fixed chat; a rendered text is then cut for continue_final_message
 * (chat/chat_template.h) with a final message of the input's first bytes. Either step may refuse
 * with an error of the contract (not Jinja, EINVAL; Jinja beyond this interpreter, EUNSUPPORTED;
 * its limits, ERANGE); neither may crash, hang or run past its limits (JINJA_MAX_STEPS,
 * JINJA_MAX_DEPTH, the output bound). */
#include "chat/chat_template.h"
#include "chat/jinja.h"
#include "common/error.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char VARS[] =
    "{\"messages\": [{\"role\": \"system\", \"content\": \" sys \"},"
    " {\"role\": \"user\", \"content\": \"hi <think>x</think>\"},"
    " {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"function\":"
    " {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]},"
    " {\"role\": \"tool\", \"content\": \"r\"}],"
    " \"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}],"
    " \"add_generation_prompt\": true, \"bos_token\": \"<s>\", \"eos_token\": \"</s>\"}";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static json_t *vars;
    if (vars == NULL) {
        json_error_t e;
        vars = json_loads(VARS, 0, &e);
        if (vars == NULL)
            abort();
    }
    JinjaTemplate *t = NULL;
    int rc = jinja_template_new((const char *)data, size, &t);
    if (rc != 0) {
        if (rc != PAGODA_EINVAL && rc != PAGODA_EUNSUPPORTED && rc != PAGODA_ERANGE &&
            rc != PAGODA_ENOMEM)
            abort();
        return 0;
    }
    char *out = NULL;
    size_t len = 0;
    rc = jinja_render(t, vars, &out, &len);
    if (rc == 0 && (out == NULL || strlen(out) > len || len > JINJA_MAX_OUTPUT_BYTES))
        abort();
    if (rc != 0 && rc != PAGODA_EINVAL && rc != PAGODA_EUNSUPPORTED && rc != PAGODA_EFORMAT &&
        rc != PAGODA_ERANGE && rc != PAGODA_ENOMEM)
        abort();
    /* continue_final_message: a final message of the template's first bytes (often in the
     * output), where they are UTF-8; the cut keeps a prefix of the text, NUL-terminated */
    json_t *content = rc == 0 ? json_stringn((const char *)data, size < 24 ? size : 24) : NULL;
    if (content != NULL) {
        json_t *messages = json_pack("[{s:s, s:o}]", "role", "assistant", "content", content);
        size_t cut = len;
        char *copy = messages != NULL ? malloc(len + 1) : NULL; /* the text may hold NULs */
        if (copy != NULL) {
            memcpy(copy, out, len + 1);
            int crc = chat_template_continue_final(messages, out, &cut);
            if (crc == 0 && (cut > len || out[cut] != '\0' || memcmp(out, copy, cut) != 0))
                abort();
            if (crc != 0 && crc != PAGODA_EINVAL)
                abort();
        }
        free(copy);
        json_decref(messages);
    }
    free(out);
    jinja_template_free(t);
    return 0;
}
