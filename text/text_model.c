#include "text/text_model.h"

#include "chat/chat_template.h"
#include "common/error.h"
#include "common/json_util.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct text_model {
    Tokenizer *tok;
    ChatTemplate *chat;
    char chat_error[512]; /* why chats are refused; "" when they are not */
};

/* Whether path names nothing at all: not even a symbolic link (one to nothing is a broken
 * file, not an absent one: a model folder of HF's cache whose blob is missing). */
static bool absent(const char *path)
{
    struct stat st;
    return lstat(path, &st) != 0 && errno == ENOENT;
}

/* Reads tokenizer_config.json's chat template and special tokens. What leaves a model without
 * chats, their reason kept in m->chat_error: no such file, no chat_template in it, a template
 * beyond chat/jinja.h's subset (PAGODA_EUNSUPPORTED) or over its limits (PAGODA_ERANGE), as
 * transformers would still load and apply it. Anything else is a broken file, returned with a
 * detail naming it: one that cannot be read, is not JSON or has a field of the wrong type (which
 * transformers would not load), or a template that is not Jinja at all (PAGODA_EINVAL, which
 * jinja2 refuses too). */
static int load_chat(struct text_model *m, const char *dir)
{
    char path[PATH_MAX];
    char *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    if (absent(path)) {
        snprintf(m->chat_error, sizeof(m->chat_error),
                 "the model has no tokenizer_config.json (no chat template)");
        return 0;
    }
    int rc = json_util_read_file(path, CHAT_TEMPLATE_MAX_CONFIG_BYTES, &text, &len);
    if (rc == PAGODA_ENOENT) /* a symbolic link to nothing, or gone since: broken, not absent */
        return pagoda_error_set(PAGODA_EIO, "%s: %s", path,
                                absent(path) ? "removed while read" : "a symbolic link to nothing");
    if (rc == 0) {
        rc = chat_template_new(text, len, &m->chat);
        free(text);
    }
    if (rc == 0 || rc == PAGODA_ENOMEM)
        return rc;
    char why[512];
    snprintf(why, sizeof(why), "%s",
             pagoda_error_detail()[0] ? pagoda_error_detail() : pagoda_strerror(rc));
    if (rc == PAGODA_ENOENT || rc == PAGODA_EUNSUPPORTED || rc == PAGODA_ERANGE) {
        snprintf(m->chat_error, sizeof(m->chat_error), "%s", why);
        return 0;
    }
    /* A detail from json_util_read_file names the path; chat_template.h's name the file's part
     * ("tokenizer_config.json: line 1 ...", "chat template 'default': line 3: ..."). */
    if (strncmp(why, path, strlen(path)) == 0)
        return rc;
    if (strncmp(why, "tokenizer_config.json", strlen("tokenizer_config.json")) == 0)
        return pagoda_error_set(rc, "%s/%s", dir, why);
    return pagoda_error_set(rc, "%s: %s", path, why);
}

int text_model_open(const char *dir, struct text_model **out)
{
    char path[PATH_MAX];
    /* tokenizer_config.json's path is 7 bytes longer */
    if (snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir) >= (int)sizeof(path))
        return pagoda_error_set(PAGODA_EINVAL, "%s: path too long", dir);
    snprintf(path, sizeof(path), "%s/tokenizer.json", dir);
    if (absent(path))
        return pagoda_error_set(PAGODA_ENOENT, "%s has no tokenizer.json", dir);
    struct text_model *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return PAGODA_ENOMEM;
    int rc = tokenizer_new_from_file(path, &m->tok);
    if (rc != 0) {
        free(m);
        if (rc == PAGODA_ENOENT) /* a symbolic link to nothing, or gone since: broken, not absent */
            return pagoda_error_set(PAGODA_EIO, "%s: %s", path,
                                    absent(path) ? "removed while read"
                                                 : "a symbolic link to nothing");
        return rc;
    }
    if ((rc = load_chat(m, dir)) != 0) {
        text_model_close(m);
        return rc;
    }
    *out = m;
    return 0;
}

void text_model_close(struct text_model *m)
{
    if (m == NULL)
        return;
    tokenizer_free(m->tok);
    chat_template_free(m->chat);
    free(m);
}

const Tokenizer *text_model_tokenizer(const struct text_model *m)
{
    return m->tok;
}

const char *text_model_chat_error(const struct text_model *m)
{
    return m->chat_error;
}

int text_model_render_chat(const struct text_model *m, const json_t *messages, const json_t *tools,
                           bool add_generation_prompt, const json_t *kwargs, char **out,
                           size_t *out_len)
{
    if (m->chat == NULL)
        return pagoda_error_set(PAGODA_ENOENT, "%s", m->chat_error);
    return chat_template_apply(m->chat, messages, tools, add_generation_prompt, kwargs, out,
                               out_len);
}
