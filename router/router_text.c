/* The router's text side: a model's tokenizer and chat template (text/text_model.h), prompts
 * given as text or as chat messages turned into token ids on libuv's threadpool (never on the
 * loop: a long prompt or a slow template holds up no poll), and each request's output text
 * (text/output_text.h: incremental detokenization, stop strings) kept beside its tokens so that
 * a poll from any offset gets the text those tokens complete.
 *
 * A text or chat Submit is registered at once like any other (so a resent Submit finds it), but
 * is sent to the scheduler only when its job has produced the token ids; a job that fails (bad
 * UTF-8, a template error, a prompt over the limit) ends the request with FINISH_ERROR and the
 * reason, which the client's next poll receives. */
#include "router/router_internal.h"

#include "common/error.h"
#include "common/log.h"
#include "text/output_text.h"
#include "text/text_model.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#define XXH_INLINE_ALL
#include <xxhash.h>

/* The text model shared by the router and its jobs: a job in flight keeps it alive when the
 * router closes first. */
struct text_holder {
    atomic_int refs;
    struct text_model *model;
};

static void holder_unref(struct text_holder *h)
{
    if (h != NULL && atomic_fetch_sub(&h->refs, 1) == 1) {
        text_model_close(h->model);
        free(h);
    }
}

/* One prompt to tokenize. The Submit's text fields travel packed (a copy made on the loop at
 * memcpy speed); the thread unpacks them, renders the chat and encodes. */
struct text_job {
    uv_work_t work;
    struct router *r;  /* NULL once the router is gone */
    struct request *q; /* NULL once the request is gone */
    struct text_holder *holder;
    uint8_t *packed;
    size_t packed_len;
    uint32_t max_prompt_tokens;
    TokenizerIds ids;
    int rc;
    char detail[512];
};

int router_text_open(struct router *r, const char *model_dir)
{
    if (model_dir == NULL || model_dir[0] == '\0') {
        snprintf(r->text_error, sizeof(r->text_error),
                 "the router was started without the model's folder (--model)");
        return 0;
    }
    struct text_model *m = NULL;
    int rc = text_model_open(model_dir, &m);
    if (rc == PAGODA_ENOENT) {
        snprintf(r->text_error, sizeof(r->text_error),
                 "the model has no tokenizer.json: send prompt_token_ids");
        log_info("%s has no tokenizer.json: token ids only", model_dir);
        return 0;
    }
    if (rc != 0) {
        /* A broken tokenizer.json: token ids are still served; text gets the reason. */
        char why[512];
        snprintf(r->text_error, sizeof(r->text_error),
                 "the model's tokenizer.json could not be loaded: %s",
                 pagoda_error_message(rc, why, sizeof(why)));
        log_error("%s", r->text_error);
        return 0;
    }
    struct text_holder *h = calloc(1, sizeof(*h));
    if (h == NULL) {
        text_model_close(m);
        return PAGODA_ENOMEM;
    }
    atomic_init(&h->refs, 1);
    h->model = m;
    r->text = h;
    r->text_error[0] = '\0';
    const char *chat = text_model_chat_error(m);
    log_info("tokenizer of %s loaded: %zu tokens%s%s", model_dir,
             tokenizer_vocab_size(text_model_tokenizer(m)), chat[0] ? "; chats refused: " : "",
             chat);
    return 0;
}

void router_text_close(struct router *r)
{
    holder_unref(r->text);
    r->text = NULL;
}

/* The fields of a Submit that the text side reads, checked; *has_text says whether the prompt
 * is text or a chat. */
int router_text_read(const struct router *r, const Pagoda__SubmitRequest *s, int *has_text,
                     uint64_t hash[2])
{
    int text = s->prompt_text != NULL, chat = s->n_messages > 0;
    *has_text = text || chat;
    if (text + chat + (s->n_prompt_token_ids > 0) > 1)
        return pagoda_error_set(PAGODA_EINVAL, "give one of prompt_token_ids, prompt_text and "
                                               "messages");
    if ((*has_text || s->n_stop > 0 || (s->has_detokenize && s->detokenize)) && r->text == NULL)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s", r->text_error);
    if (chat && text_model_chat_error(r->text->model)[0] != '\0')
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "chat: %s",
                                text_model_chat_error(r->text->model));
    if (text && s->prompt_text[0] == '\0')
        return pagoda_error_set(PAGODA_EINVAL, "the prompt is empty");
    if (s->n_stop > OUTPUT_TEXT_MAX_STOPS)
        return pagoda_error_set(PAGODA_ERANGE, "%zu stop strings, more than the limit of %u",
                                s->n_stop, OUTPUT_TEXT_MAX_STOPS);
    for (size_t i = 0; i < s->n_stop; i++) {
        size_t n = strlen(s->stop[i]);
        if (n == 0 || n > OUTPUT_TEXT_MAX_STOP_BYTES)
            return pagoda_error_set(PAGODA_ERANGE, "stop string %zu has %zu bytes: 1 to %u", i, n,
                                    OUTPUT_TEXT_MAX_STOP_BYTES);
    }
    if (s->n_stop > 0 && s->has_detokenize && !s->detokenize)
        return pagoda_error_set(PAGODA_EINVAL, "stop strings need the text: detokenize is off");
    /* What identifies the text side of the request, for a resent Submit's comparison. */
    XXH3_state_t st;
    memset(&st, 0, sizeof(st));
    XXH3_128bits_reset_withSeed(&st, r->hash_seed ^ 0x74657874u);
    Pagoda__SubmitRequest key = PAGODA__SUBMIT_REQUEST__INIT;
    key.prompt_text = s->prompt_text;
    key.n_messages = s->n_messages;
    key.messages = s->messages;
    key.has_add_generation_prompt = s->has_add_generation_prompt;
    key.add_generation_prompt = s->add_generation_prompt;
    key.chat_template_kwargs = s->chat_template_kwargs;
    key.tools_json = s->tools_json;
    key.has_add_special_tokens = s->has_add_special_tokens;
    key.add_special_tokens = s->add_special_tokens;
    key.n_stop = s->n_stop;
    key.stop = s->stop;
    key.has_detokenize = s->has_detokenize;
    key.detokenize = s->detokenize;
    key.has_skip_special_tokens = s->has_skip_special_tokens;
    key.skip_special_tokens = s->skip_special_tokens;
    size_t n = pagoda__submit_request__get_packed_size(&key);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL)
        return PAGODA_ENOMEM;
    pagoda__submit_request__pack(&key, buf);
    XXH3_128bits_update(&st, buf, n);
    free(buf);
    XXH128_hash_t h = XXH3_128bits_digest(&st);
    hash[0] = h.low64;
    hash[1] = h.high64;
    return 0;
}

/* ---- the job, on libuv's threadpool -------------------------------------------------------- */

/* Sets o[key] to the string v; -1 when v is not valid UTF-8 (jansson refuses it) or memory ran
 * out. */
static int set_string(json_t *o, const char *key, const char *v)
{
    json_t *j = json_string(v);
    return j == NULL ? -1 : json_object_set_new(o, key, j);
}

/* A ChatMessage as the templates see it: OpenAI's message object. */
static json_t *message_json(const Pagoda__ChatMessage *m, char *why, size_t why_len, size_t i)
{
    if (m->role == NULL || m->role[0] == '\0') {
        snprintf(why, why_len, "message %zu has no role", i);
        return NULL;
    }
    json_t *o = json_object();
    if (o == NULL)
        return NULL;
    const struct {
        const char *key, *value;
    } fields[] = {
        {"role", m->role},
        {"content", m->content},
        {"name", m->name},
        {"tool_call_id", m->tool_call_id},
        {"reasoning_content", m->reasoning_content},
    };
    for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++) {
        if (fields[k].value == NULL)
            continue;
        if (set_string(o, fields[k].key, fields[k].value) != 0) {
            snprintf(why, why_len, "message %zu: its %s is not valid UTF-8", i, fields[k].key);
            json_decref(o);
            return NULL;
        }
    }
    if (m->content == NULL)
        json_object_set_new(o, "content", json_null());
    if (m->tool_calls_json != NULL) {
        json_error_t err;
        json_t *calls = json_loads(m->tool_calls_json, JSON_REJECT_DUPLICATES, &err);
        if (calls == NULL || !json_is_array(calls)) {
            snprintf(why, why_len, "message %zu: tool_calls_json is not a JSON array%s%s", i,
                     calls ? "" : ": ", calls ? "" : err.text);
            json_decref(calls);
            json_decref(o);
            return NULL;
        }
        json_object_set_new(o, "tool_calls", calls);
    }
    return o;
}

static int job_render(struct text_job *job, const struct text_model *m,
                      const Pagoda__SubmitRequest *s, char **text, size_t *text_len)
{
    int rc = PAGODA_ENOMEM;
    json_t *messages = json_array(), *tools = NULL, *kwargs = NULL;
    if (messages == NULL)
        goto out;
    for (size_t i = 0; i < s->n_messages; i++) {
        json_t *o = message_json(s->messages[i], job->detail, sizeof(job->detail), i);
        if (o == NULL) {
            rc = job->detail[0] ? PAGODA_EINVAL : PAGODA_ENOMEM;
            goto out;
        }
        json_array_append_new(messages, o);
    }
    json_error_t err;
    if (s->tools_json != NULL) {
        tools = json_loads(s->tools_json, JSON_REJECT_DUPLICATES, &err);
        if (tools == NULL || !json_is_array(tools)) {
            rc = PAGODA_EINVAL;
            snprintf(job->detail, sizeof(job->detail), "tools_json is not a JSON array%s%s",
                     tools ? "" : ": ", tools ? "" : err.text);
            goto out;
        }
    }
    if (s->chat_template_kwargs != NULL) {
        kwargs = json_loads(s->chat_template_kwargs, JSON_REJECT_DUPLICATES, &err);
        if (kwargs == NULL || !json_is_object(kwargs)) {
            rc = PAGODA_EINVAL;
            snprintf(job->detail, sizeof(job->detail),
                     "chat_template_kwargs is not a JSON object%s%s", kwargs ? "" : ": ",
                     kwargs ? "" : err.text);
            goto out;
        }
    }
    bool gen = !s->has_add_generation_prompt || s->add_generation_prompt;
    rc = text_model_render_chat(m, messages, tools, gen, kwargs, text, text_len);
out:
    json_decref(messages);
    json_decref(tools);
    json_decref(kwargs);
    return rc;
}

static void job_work(uv_work_t *w)
{
    struct text_job *job = w->data;
    const struct text_model *m = job->holder->model;
    pagoda_error_clear();
    Pagoda__SubmitRequest *s = pagoda__submit_request__unpack(NULL, job->packed_len, job->packed);
    if (s == NULL) {
        job->rc = PAGODA_ENOMEM;
        return;
    }
    char *rendered = NULL;
    size_t rendered_len = 0;
    const char *text = s->prompt_text;
    size_t len = text ? strlen(text) : 0;
    /* As vLLM: a text prompt gets the tokenizer's special tokens (BOS), a chat does not (its
     * template writes them); add_special_tokens overrides either. */
    bool special = s->n_messages == 0;
    if (s->has_add_special_tokens)
        special = s->add_special_tokens;
    int rc = 0;
    if (s->n_messages > 0) {
        rc = job_render(job, m, s, &rendered, &rendered_len);
        text = rendered;
        len = rendered_len;
    }
    if (rc == 0)
        rc = tokenizer_encode(text_model_tokenizer(m), text, len, special, &job->ids);
    if (rc == 0 && job->ids.len == 0) {
        rc = PAGODA_EINVAL;
        snprintf(job->detail, sizeof(job->detail), "the prompt is empty once tokenized");
    }
    if (rc == 0 && job->ids.len > job->max_prompt_tokens) {
        rc = PAGODA_ERANGE;
        snprintf(job->detail, sizeof(job->detail),
                 "the prompt has %zu tokens, more than the limit of %u", job->ids.len,
                 job->max_prompt_tokens);
    }
    if (rc != 0 && job->detail[0] == '\0')
        pagoda_error_message(rc, job->detail, sizeof(job->detail));
    job->rc = rc;
    free(rendered);
    pagoda__submit_request__free_unpacked(s, NULL);
}

static void job_free(struct text_job *job)
{
    holder_unref(job->holder);
    tokenizer_ids_fini(&job->ids);
    free(job->packed);
    free(job);
}

static void job_done(uv_work_t *w, int status)
{
    struct text_job *job = w->data;
    struct request *q = job->q;
    if (job->r == NULL || q == NULL) {
        job_free(job);
        return;
    }
    q->job = NULL;
    if (status != 0 && job->rc == 0) {
        job->rc = PAGODA_EINTERNAL;
        snprintf(job->detail, sizeof(job->detail), "the tokenization job was cancelled");
    }
    router_prompt_ready(job->r, q, job->rc, job->detail, job->ids.ids, job->ids.len);
    job->ids.ids = NULL; /* taken by router_prompt_ready on success */
    job->ids.len = job->ids.cap = 0;
    job_free(job);
}

int router_text_attach(struct router *r, struct request *q, const Pagoda__SubmitRequest *s)
{
    int text = s != NULL && (s->prompt_text != NULL || s->n_messages > 0);
    int detokenize = r->text != NULL && (s == NULL || !s->has_detokenize || s->detokenize);
    if (detokenize) {
        const char *stops[OUTPUT_TEXT_MAX_STOPS];
        size_t lens[OUTPUT_TEXT_MAX_STOPS];
        size_t n = s ? s->n_stop : 0;
        for (size_t i = 0; i < n; i++) {
            stops[i] = s->stop[i];
            lens[i] = strlen(s->stop[i]);
        }
        bool skip = s == NULL || !s->has_skip_special_tokens || s->skip_special_tokens;
        int rc =
            output_text_new(text_model_tokenizer(r->text->model), skip, stops, lens, n, &q->text);
        if (rc != 0)
            return rc;
    }
    if (!text)
        return 0;
    struct text_job *job = calloc(1, sizeof(*job));
    if (job == NULL)
        return PAGODA_ENOMEM;
    Pagoda__SubmitRequest key = PAGODA__SUBMIT_REQUEST__INIT;
    key.prompt_text = s->prompt_text;
    key.n_messages = s->n_messages;
    key.messages = s->messages;
    key.has_add_generation_prompt = s->has_add_generation_prompt;
    key.add_generation_prompt = s->add_generation_prompt;
    key.chat_template_kwargs = s->chat_template_kwargs;
    key.tools_json = s->tools_json;
    key.has_add_special_tokens = s->has_add_special_tokens;
    key.add_special_tokens = s->add_special_tokens;
    job->packed_len = pagoda__submit_request__get_packed_size(&key);
    if ((job->packed = malloc(job->packed_len ? job->packed_len : 1)) == NULL) {
        free(job);
        return PAGODA_ENOMEM;
    }
    pagoda__submit_request__pack(&key, job->packed);
    job->r = r;
    job->q = q;
    job->holder = r->text;
    atomic_fetch_add(&r->text->refs, 1);
    job->max_prompt_tokens = r->cfg.max_prompt_tokens;
    job->work.data = job;
    int uv = uv_queue_work(r->loop, &job->work, job_work, job_done);
    if (uv != 0) {
        job_free(job);
        return pagoda_error_set(PAGODA_EIO, "could not queue the tokenization: %s",
                                uv_strerror(uv));
    }
    q->job = job;
    return 0;
}

void router_text_request_free(struct request *q)
{
    if (q->job != NULL) {
        q->job->q = NULL; /* job_done frees it */
        q->job = NULL;
    }
    output_text_free(q->text);
    q->text = NULL;
}

int router_text_on_token(struct request *q, int32_t token, int *stop)
{
    *stop = 0;
    if (q->text == NULL)
        return 0;
    int rc = output_text_push(q->text, token, stop);
    if (rc == 0 && *stop > 0)
        q->stop_index = *stop;
    return rc;
}

void router_text_on_finish(struct request *q)
{
    int stop = 0;
    if (q->text != NULL && output_text_finish(q->text, &stop) == 0 && stop > 0)
        q->stop_index = stop;
}

int router_text_fill(const struct request *q, uint32_t offset, char **text, char **stop_string)
{
    *text = *stop_string = NULL;
    if (q->text == NULL)
        return 0;
    size_t len, start = output_text_start(q->text, offset);
    const char *all = output_text_visible(q->text, &len);
    if (start > len)
        start = len;
    char *t = malloc(len - start + 1);
    if (t == NULL)
        return PAGODA_ENOMEM;
    memcpy(t, all + start, len - start);
    t[len - start] = '\0';
    *text = t;
    if (q->stop_index > 0) {
        size_t n;
        const char *stop = output_text_stop(q->text, q->stop_index, &n);
        if ((*stop_string = strndup(stop, n)) == NULL) {
            free(t);
            *text = NULL;
            return PAGODA_ENOMEM;
        }
    }
    return 0;
}

size_t router_text_bytes(const struct request *q)
{
    return q->text ? output_text_bytes(q->text) : 0;
}
