#include "text/text_model.h"

#include "chat/chat_template.h"
#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct text_model {
    Tokenizer *tok;
    ChatTemplate *chat;
    char chat_error[512]; /* why chats are refused; "" when they are not */
};

/* Reads a whole regular file of at most max bytes into a malloc'd buffer. */
static int read_file(const char *path, size_t max, char **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT
                   ? PAGODA_ENOENT
                   : pagoda_error_set(pagoda_from_errno(errno), "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > max) {
        close(fd);
        return pagoda_error_set(PAGODA_EFORMAT, "%s: not a regular file of at most %zu bytes", path,
                                max);
    }
    char *buf = malloc((size_t)st.st_size + 1);
    if (buf == NULL) {
        close(fd);
        return PAGODA_ENOMEM;
    }
    size_t got = 0;
    while (got < (size_t)st.st_size) {
        ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);
        if (n <= 0) {
            int e = n < 0 ? errno : EIO;
            free(buf);
            close(fd);
            return pagoda_error_set(pagoda_from_errno(e), "%s: read failed", path);
        }
        got += (size_t)n;
    }
    close(fd);
    buf[got] = '\0';
    *out = buf;
    *len = got;
    return 0;
}

/* Reads tokenizer_config.json's chat template and special tokens; a failure is kept as the reason
 * chats are refused. */
static void load_chat(struct text_model *m, const char *dir)
{
    char path[PATH_MAX];
    char *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    int rc = read_file(path, CHAT_TEMPLATE_MAX_CONFIG_BYTES, &text, &len);
    if (rc != 0) {
        char why[512];
        snprintf(m->chat_error, sizeof(m->chat_error), "%s",
                 rc == PAGODA_ENOENT ? "the model has no tokenizer_config.json (no chat template)"
                                     : pagoda_error_message(rc, why, sizeof(why)));
        return;
    }
    rc = chat_template_new(text, len, &m->chat);
    free(text);
    if (rc != 0) {
        char why[512];
        snprintf(m->chat_error, sizeof(m->chat_error), "%s",
                 rc == PAGODA_ENOENT ? "tokenizer_config.json has no chat_template"
                                     : pagoda_error_message(rc, why, sizeof(why)));
    }
}

int text_model_open(const char *dir, struct text_model **out)
{
    char path[PATH_MAX];
    if (snprintf(path, sizeof(path), "%s/tokenizer.json", dir) >= (int)sizeof(path))
        return pagoda_error_set(PAGODA_ERANGE, "%s: path too long", dir);
    if (access(path, F_OK) != 0 && errno == ENOENT)
        return pagoda_error_set(PAGODA_ENOENT, "%s has no tokenizer.json", dir);
    struct text_model *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return PAGODA_ENOMEM;
    int rc = tokenizer_new_from_file(path, &m->tok);
    if (rc != 0) {
        if (rc == PAGODA_ENOENT) /* the file went away: broken, not absent */
            rc = PAGODA_EIO;
        free(m);
        return rc;
    }
    load_chat(m, dir);
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
