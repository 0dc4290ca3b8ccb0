#include "text/text_model.h"

#include "chat/chat_template.h"
#include "common/error.h"
#include "common/json_util.h"

#include <dirent.h>
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

/* The chat template's files, read as transformers' from_pretrained reads them (read at commit
 * 598a3dc, src/transformers/tokenization_utils_base.py: CHAT_TEMPLATE_FILE, CHAT_TEMPLATE_DIR and
 * _from_pretrained's "If independent chat template file(s) exist, they take priority over
 * template entries in the tokenizer config"): DIR/chat_template.jinja is the template "default",
 * each DIR/additional_chat_templates/NAME.jinja the template NAME (a default.jinja there replaces
 * chat_template.jinja, read first), and when there is any such file, tokenizer_config.json's
 * chat_template (a string, or a list of {name, template}) is not used at all; its special tokens
 * still are. chat_template.json is not read: transformers' processors read it (and prefer it to
 * chat_template.jinja), its tokenizers do not, and pagoda renders chats as the tokenizer's
 * apply_chat_template does. */
#define CHAT_TEMPLATE_FILE "chat_template.jinja"
#define CHAT_TEMPLATE_DIR "additional_chat_templates"
#define CHAT_TEMPLATE_SUFFIX ".jinja"

struct template_file {
    char *name;
    char *text;
    size_t len;
    char *path;
};

struct template_files {
    struct template_file t[CHAT_TEMPLATE_MAX_TEMPLATES];
    size_t n;
};

static void template_files_fini(struct template_files *tf)
{
    for (size_t i = 0; i < tf->n; i++) {
        free(tf->t[i].name);
        free(tf->t[i].text);
        free(tf->t[i].path);
    }
    tf->n = 0;
}

/* Python's universal newlines, which transformers' open(...).read() of a template applies: "\r\n"
 * and a lone "\r" become "\n" (a byte 0x0D is never inside a UTF-8 sequence). In place, the text
 * kept NUL-terminated; returns the new length. */
static size_t universal_newlines(char *s, size_t len)
{
    size_t j = 0;
    for (size_t i = 0; i < len; i++) {
        char c = s[i];
        s[j++] = c == '\r' ? '\n' : c;
        if (c == '\r' && i + 1 < len && s[i + 1] == '\n')
            i++;
    }
    s[j] = '\0';
    return j;
}

/* Reads the template file at path as the template name, replacing one of that name. An empty
 * file is refused as broken (transformers would render every chat as an empty prompt); its UTF-8
 * is checked when it is compiled (chat_template_new_with). */
static int read_template_file(const char *path, const char *name, struct template_files *tf)
{
    size_t i = 0;
    while (i < tf->n && strcmp(tf->t[i].name, name) != 0)
        i++;
    if (i == CHAT_TEMPLATE_MAX_TEMPLATES)
        return pagoda_error_set(PAGODA_ERANGE, "%s: more than %u chat templates", path,
                                CHAT_TEMPLATE_MAX_TEMPLATES);
    char *text = NULL;
    size_t len = 0;
    int rc = json_util_read_file(path, CHAT_TEMPLATE_MAX_CONFIG_BYTES, &text, &len);
    if (rc == PAGODA_ENOENT) /* a symbolic link to nothing, or gone since: broken, not absent */
        return pagoda_error_set(PAGODA_EIO, "%s: %s", path,
                                absent(path) ? "removed while read" : "a symbolic link to nothing");
    if (rc != 0)
        return rc;
    if (len == 0) {
        free(text);
        return pagoda_error_set(PAGODA_EFORMAT, "%s: empty (no chat template in it)", path);
    }
    char *name_copy = strdup(name), *path_copy = strdup(path);
    if (name_copy == NULL || path_copy == NULL) {
        free(text);
        free(name_copy);
        free(path_copy);
        return PAGODA_ENOMEM;
    }
    if (i == tf->n)
        tf->n++;
    else {
        free(tf->t[i].name);
        free(tf->t[i].text);
        free(tf->t[i].path);
    }
    tf->t[i] = (struct template_file){name_copy, text, universal_newlines(text, len), path_copy};
    return 0;
}

/* DIR/chat_template.jinja, then the *.jinja files of DIR/additional_chat_templates (transformers'
 * glob: hidden ones too). A folder that is absent, or not a folder, holds none, as for
 * transformers' Path.is_dir(); one that cannot be listed is broken. */
static int read_template_files(const char *dir, struct template_files *tf)
{
    char path[PATH_MAX];
    snprintf(path, sizeof(path), "%s/" CHAT_TEMPLATE_FILE, dir);
    int rc = 0;
    if (!absent(path) && (rc = read_template_file(path, "default", tf)) != 0)
        return rc;
    if (snprintf(path, sizeof(path), "%s/" CHAT_TEMPLATE_DIR, dir) >= (int)sizeof(path))
        return pagoda_error_set(PAGODA_EINVAL, "%s: path too long", dir);
    DIR *d = opendir(path);
    if (d == NULL)
        return errno == ENOENT || errno == ENOTDIR
                   ? 0
                   : pagoda_error_set(pagoda_from_errno(errno), "%s: cannot list", path);
    const size_t suffix = strlen(CHAT_TEMPLATE_SUFFIX);
    const struct dirent *e;
    while (rc == 0 && (errno = 0, e = readdir(d)) != NULL) {
        size_t len = strlen(e->d_name);
        if (len < suffix || strcmp(e->d_name + len - suffix, CHAT_TEMPLATE_SUFFIX) != 0)
            continue;
        char file[PATH_MAX], name[256];
        if (snprintf(file, sizeof(file), "%s/%s", path, e->d_name) >= (int)sizeof(file)) {
            rc = pagoda_error_set(PAGODA_EINVAL, "%s/%s: path too long", path, e->d_name);
            break;
        }
        snprintf(name, sizeof(name), "%.*s", (int)(len - suffix), e->d_name);
        rc = read_template_file(file, name, tf);
    }
    if (rc == 0 && errno != 0)
        rc = pagoda_error_set(pagoda_from_errno(errno), "%s: cannot list", path);
    closedir(d);
    return rc;
}

/* Reads the chat template (tokenizer_config.json's or its files', above) and the special tokens
 * of tokenizer_config.json. What leaves a model without chats, their reason kept in
 * m->chat_error: no template anywhere, a template beyond chat/jinja.h's subset
 * (PAGODA_EUNSUPPORTED) or over its limits (PAGODA_ERANGE), as transformers would still load and
 * apply it. Anything else is a broken file, returned with a detail naming it: one that cannot be
 * read, is not JSON or has a field of the wrong type (which transformers would not load), a
 * template file that is empty or not UTF-8, or a template that is not Jinja at all
 * (PAGODA_EINVAL, which jinja2 refuses too). */
static int load_chat(struct text_model *m, const char *dir)
{
    struct template_files tf = {.n = 0};
    char path[PATH_MAX];
    char *text = NULL;
    size_t len = 0;
    int rc = read_template_files(dir, &tf);
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    if (rc == 0 && absent(path) && tf.n == 0)
        rc = pagoda_error_set(PAGODA_ENOENT, "the model has no tokenizer_config.json or "
                                             "chat_template.jinja (no chat template)");
    else if (rc == 0 && !absent(path)) {
        rc = json_util_read_file(path, CHAT_TEMPLATE_MAX_CONFIG_BYTES, &text, &len);
        if (rc == PAGODA_ENOENT) /* a symbolic link to nothing, or gone since: broken */
            rc = pagoda_error_set(PAGODA_EIO, "%s: %s", path,
                                  absent(path) ? "removed while read"
                                               : "a symbolic link to nothing");
    }
    if (rc == 0) {
        ChatTemplateFile files[CHAT_TEMPLATE_MAX_TEMPLATES];
        for (size_t i = 0; i < tf.n; i++)
            files[i] = (ChatTemplateFile){tf.t[i].name, tf.t[i].text, tf.t[i].len, tf.t[i].path};
        /* without tokenizer_config.json, transformers loads the files with no special tokens */
        rc = text != NULL ? chat_template_new_with(text, len, files, tf.n, &m->chat)
                          : chat_template_new_with("{}", 2, files, tf.n, &m->chat);
    }
    free(text);
    text = NULL;
    /* special_tokens_map.json's tokens where transformers' legacy loading lets them win */
    snprintf(path, sizeof(path), "%s/special_tokens_map.json", dir);
    if (rc == 0 && chat_template_reads_special_tokens_map(m->chat) && !absent(path)) {
        rc = json_util_read_file(path, CHAT_TEMPLATE_MAX_CONFIG_BYTES, &text, &len);
        if (rc == PAGODA_ENOENT) /* a symbolic link to nothing, or gone since: broken */
            rc = pagoda_error_set(PAGODA_EIO, "%s: %s", path,
                                  absent(path) ? "removed while read"
                                               : "a symbolic link to nothing");
        if (rc == 0)
            rc = chat_template_apply_special_tokens_map(m->chat, text, len);
        free(text);
        if (rc != 0) {
            chat_template_free(m->chat);
            m->chat = NULL;
        }
    }
    snprintf(path, sizeof(path), "%s/tokenizer_config.json", dir);
    template_files_fini(&tf);
    if (rc == 0 || rc == PAGODA_ENOMEM)
        return rc;
    char why[512];
    snprintf(why, sizeof(why), "%s",
             pagoda_error_detail()[0] ? pagoda_error_detail() : pagoda_strerror(rc));
    if (rc == PAGODA_ENOENT || rc == PAGODA_EUNSUPPORTED || rc == PAGODA_ERANGE) {
        snprintf(path, sizeof(path), "%s/chat_template.json", dir);
        snprintf(m->chat_error, sizeof(m->chat_error), "%.400s%s", why,
                 rc == PAGODA_ENOENT && !absent(path)
                     ? " (its chat_template.json is a processor's, which transformers' tokenizer "
                       "does not read)"
                     : "");
        return 0;
    }
    /* A detail from a file read (json_util_read_file, the template files) names the path;
     * chat_template.h's name the config's part ("tokenizer_config.json: line 1 ...", "chat
     * template 'default': line 3: ..."). */
    size_t dir_len = strlen(dir);
    if (strncmp(why, dir, dir_len) == 0 && why[dir_len] == '/')
        return rc;
    if (strncmp(why, "tokenizer_config.json", strlen("tokenizer_config.json")) == 0 ||
        strncmp(why, "special_tokens_map.json", strlen("special_tokens_map.json")) == 0)
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
                           bool add_generation_prompt, bool continue_final_message,
                           const json_t *kwargs, char **out, size_t *out_len)
{
    if (m->chat == NULL)
        return pagoda_error_set(PAGODA_ENOENT, "%s", m->chat_error);
    if (continue_final_message && add_generation_prompt)
        return pagoda_error_set(PAGODA_EINVAL,
                                "continue_final_message and add_generation_prompt cannot both be "
                                "true (add_generation_prompt is true unless set false)");
    int rc =
        chat_template_apply(m->chat, messages, tools, add_generation_prompt, kwargs, out, out_len);
    if (rc == 0 && continue_final_message &&
        (rc = chat_template_continue_final(messages, *out, out_len)) != 0) {
        free(*out);
        *out = NULL;
    }
    return rc;
}
