/* The router's text side: a model's tokenizer and chat template (text/text_model.h), prompts
 * given as text or as chat messages turned into token ids on libuv's threadpool (never on the
 * loop: a long prompt or a slow template holds up no poll), and each request's output text
 * (text/output_text.h: incremental detokenization, stop strings) kept beside its tokens so that
 * a poll from any offset gets the text those tokens complete.
 *
 * A text or chat Submit is registered at once like any other (so a resent Submit finds it), but
 * is sent to the scheduler only when its job has produced the token ids; a job that fails (bad
 * UTF-8, a template error, a prompt over the limit) ends the request with FINISH_ERROR and the
 * reason, which the client's next poll receives. Jobs on the threadpool are bounded in all and
 * per tenant (router.h); more wait in the router's list, in arrival order, skipping a tenant at
 * its share. A job whose request ends is dropped if it waits, cancelled if it has not started. */
#include "router/router_internal.h"

#include "common/error.h"
#include "common/log.h"
#include "proto/text_fields.h"
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

/* What a job does: a request's prompt, or a Tokenize call's text or chat (both rendered and
 * encoded from packed Submit fields), or a Tokenize call's ids decoded. */
enum job_kind { JOB_PROMPT, JOB_TOKENIZE, JOB_DETOKENIZE };

/* One prompt to tokenize. The Submit's text fields travel packed (a copy made on the loop at
 * memcpy speed); the thread unpacks them, renders the chat and encodes. */
struct text_job {
    enum job_kind kind;
    struct rctx *c;     /* a Tokenize call waiting for it (parked), or NULL */
    size_t call_bytes;  /* a Tokenize call's: what it counts in router.text_call_bytes */
    int32_t *detok_ids; /* JOB_DETOKENIZE: the ids (owned), their text after */
    size_t detok_n;
    bool skip_special;
    char *text;
    size_t text_len;
    uv_work_t work;
    struct text_job *prev, *next; /* router.text_pending while it waits its turn, then
                                     router.text_queued while on the threadpool */
    int queued;                   /* on libuv's threadpool (counted in text_jobs) */
    struct router *r;             /* NULL once the router is gone */
    struct request *q;            /* NULL once the request is gone or has ended */
    uint32_t tenant;
    struct text_holder *holder;
    uint8_t *packed;
    size_t packed_len;
    uint32_t max_prompt_tokens;
    TokenizerIds ids;
    int rc;
    char detail[512];
};

/* What router_text_load read: the text model, or why the model serves token ids only. */
struct router_text {
    struct text_holder *holder; /* NULL: token ids only */
    char error[512];            /* why, when holder is NULL */
};

int router_text_load(const char *model_dir, struct router_text **out)
{
    struct router_text *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory for the tokenizer");
    struct text_model *m = NULL;
    int rc = text_model_open(model_dir, &m);
    if (rc == PAGODA_ENOENT) {
        snprintf(t->error, sizeof(t->error),
                 "the model has no tokenizer.json: it serves token ids only");
        log_warn("%s has no tokenizer.json: token ids only", model_dir);
    } else if (rc == PAGODA_EUNSUPPORTED || rc == PAGODA_ERANGE) {
        /* Valid for HF, beyond what tokenizer/ implements: token ids are served, text gets the
         * reason (as before the files were checked at start). */
        snprintf(t->error, sizeof(t->error),
                 "the model's tokenizer.json is beyond what pagoda supports: %s",
                 pagoda_error_detail()[0] ? pagoda_error_detail() : pagoda_strerror(rc));
        log_error("%s: token ids only", t->error);
    } else if (rc != 0) {
        free(t); /* broken files, named in the detail: the caller cannot run */
        return rc;
    } else if ((t->holder = calloc(1, sizeof(*t->holder))) == NULL) {
        text_model_close(m);
        free(t);
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory for the tokenizer");
    } else {
        atomic_init(&t->holder->refs, 1);
        t->holder->model = m;
        const char *chat = text_model_chat_error(m);
        log_info("tokenizer of %s loaded: %zu tokens%s%s", model_dir,
                 tokenizer_vocab_size(text_model_tokenizer(m)), chat[0] ? "; chats refused: " : "",
                 chat);
    }
    *out = t;
    return 0;
}

void router_text_free(struct router_text *t)
{
    if (t == NULL)
        return;
    holder_unref(t->holder);
    free(t);
}

void router_text_adopt(struct router *r, struct router_text *t)
{
    if (t == NULL) {
        snprintf(r->text_error, sizeof(r->text_error),
                 "the router was started without the model's folder (--model): token ids only");
        return;
    }
    r->text = t->holder;
    snprintf(r->text_error, sizeof(r->text_error), "%s", t->holder ? "" : t->error);
    free(t);
}

void router_text_close(struct router *r)
{
    holder_unref(r->text);
    r->text = NULL;
}

/* The Submit's fields a job needs (and that identify the text side, for deduplication), packed. */
static uint8_t *pack_text_fields(const Pagoda__SubmitRequest *s, int with_stops, size_t *len)
{
    Pagoda__SubmitRequest key = PAGODA__SUBMIT_REQUEST__INIT;
    key.has_prompt_text = s->has_prompt_text;
    key.prompt_text = s->prompt_text;
    key.n_messages = s->n_messages;
    key.messages = s->messages;
    key.has_add_generation_prompt = s->has_add_generation_prompt;
    key.add_generation_prompt = s->add_generation_prompt;
    key.has_continue_final_message = s->has_continue_final_message;
    key.continue_final_message = s->continue_final_message;
    key.chat_template_kwargs = s->chat_template_kwargs;
    key.tools_json = s->tools_json;
    key.has_add_special_tokens = s->has_add_special_tokens;
    key.add_special_tokens = s->add_special_tokens;
    if (with_stops) {
        key.n_stop = s->n_stop;
        key.stop = s->stop;
        key.has_detokenize = s->has_detokenize;
        key.detokenize = s->detokenize;
        key.has_skip_special_tokens = s->has_skip_special_tokens;
        key.skip_special_tokens = s->skip_special_tokens;
        key.has_include_stop_str_in_output = s->has_include_stop_str_in_output;
        key.include_stop_str_in_output = s->include_stop_str_in_output;
    }
    *len = pagoda__submit_request__get_packed_size(&key);
    uint8_t *buf = malloc(*len ? *len : 1);
    if (buf != NULL)
        pagoda__submit_request__pack(&key, buf);
    return buf;
}

/* The text fields' own checks, for a Submit and a Tokenize call alike (s holds the fields; n_ids
 * token ids came beside them, in the field forms names first): one form of prompt, and the chat's
 * fields only with a chat. */
static int text_forms_check(const Pagoda__SubmitRequest *s, size_t n_ids, const char *forms)
{
    int text = s->has_prompt_text, chat = s->n_messages > 0;
    if (text + chat + (n_ids > 0) > 1)
        return pagoda_error_set(PAGODA_EINVAL, "give one of %s", forms);
    if (!chat && (s->chat_template_kwargs != NULL || s->tools_json != NULL ||
                  s->has_add_generation_prompt || s->has_continue_final_message))
        return pagoda_error_set(PAGODA_EINVAL, "chat_template_kwargs, tools_json, "
                                               "add_generation_prompt and continue_final_message "
                                               "go with messages");
    return 0;
}

/* A chat's checks once the model has a tokenizer (r->text): a chat template, and the number of
 * messages. */
static int text_chat_check(const struct router *r, const Pagoda__SubmitRequest *s)
{
    if (s->n_messages > 0 && text_model_chat_error(r->text->model)[0] != '\0')
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "chat: %s",
                                text_model_chat_error(r->text->model));
    if (s->n_messages > ROUTER_MAX_CHAT_MESSAGES)
        return pagoda_error_set(PAGODA_ERANGE, "%zu messages, more than the limit of %u",
                                s->n_messages, ROUTER_MAX_CHAT_MESSAGES);
    return 0;
}

int router_text_read(const struct router *r, const Pagoda__SubmitRequest *s, int *has_text,
                     uint64_t hash[2])
{
    int text = s->has_prompt_text, chat = s->n_messages > 0;
    *has_text = text || chat;
    hash[0] = hash[1] = 0;
    int rc =
        text_forms_check(s, s->n_prompt_token_ids, "prompt_token_ids, prompt_text and messages");
    if (rc != 0)
        return rc;
    if (r->text == NULL) {
        if (*has_text)
            return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s: send prompt_token_ids",
                                    r->text_error);
        if (s->n_stop > 0 || (s->has_detokenize && s->detokenize))
            return pagoda_error_set(PAGODA_EUNSUPPORTED, "stop strings and text output: %s",
                                    r->text_error);
    }
    if (text && s->prompt_text.len == 0)
        return pagoda_error_set(PAGODA_EINVAL, "the prompt is empty");
    if (r->text != NULL && (rc = text_chat_check(r, s)) != 0)
        return rc;
    if (s->n_stop > OUTPUT_TEXT_MAX_STOPS)
        return pagoda_error_set(PAGODA_ERANGE, "%zu stop strings, more than the limit of %u",
                                s->n_stop, OUTPUT_TEXT_MAX_STOPS);
    for (size_t i = 0; i < s->n_stop; i++)
        if (s->stop[i].len == 0 || s->stop[i].len > OUTPUT_TEXT_MAX_STOP_BYTES)
            return pagoda_error_set(PAGODA_ERANGE, "stop string %zu has %zu bytes: 1 to %u", i,
                                    s->stop[i].len, OUTPUT_TEXT_MAX_STOP_BYTES);
    if (s->n_stop > 0 && s->has_detokenize && !s->detokenize)
        return pagoda_error_set(PAGODA_EINVAL, "stop strings need the text: detokenize is off");
    if (!*has_text && s->n_stop == 0 && !s->has_detokenize && !s->has_skip_special_tokens &&
        !s->has_include_stop_str_in_output)
        return 0; /* nothing of the text side: the hash stays 0 as before */
    /* What identifies the text side of the request, for a resent Submit's comparison. */
    size_t n;
    uint8_t *buf = pack_text_fields(s, 1, &n);
    if (buf == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory reading the text fields");
    XXH128_hash_t h = XXH3_128bits_withSeed(buf, n, r->hash_seed ^ 0x74657874u);
    free(buf);
    hash[0] = h.low64;
    hash[1] = h.high64;
    return 0;
}

/* ---- the job, on libuv's threadpool -------------------------------------------------------- */

/* A ChatMessage as the templates see it: OpenAI's message object. Content is refused when it
 * holds a NUL (the template would see it cut) or is not UTF-8. */
static json_t *message_json(const Pagoda__ChatMessage *m, char *why, size_t why_len, size_t i)
{
    if (m->role == NULL || m->role[0] == '\0') {
        snprintf(why, why_len, "message %zu has no role", i);
        return NULL;
    }
    /* An empty content arrives with no bytes at all (data NULL): the text "". */
    const char *text = m->content.len > 0 ? (const char *)m->content.data : "";
    if (m->has_content && memchr(text, 0, m->content.len) != NULL) {
        snprintf(why, why_len, "message %zu: its content holds a NUL character", i);
        return NULL;
    }
    json_t *o = json_object();
    if (o == NULL) {
        snprintf(why, why_len, "out of memory");
        return NULL;
    }
    /* Content left out is left out (the template's undefined, ""), a null is None as in
     * transformers; before the forty-first session a left-out content was None too. */
    json_t *content = m->has_content ? json_stringn(text, m->content.len) : json_null();
    if (!m->has_content && m->has_content_absent && m->content_absent)
        json_decref(content);
    else if (content == NULL || json_object_set_new(o, "content", content) != 0) {
        snprintf(why, why_len, "message %zu: its content is not valid UTF-8", i);
        json_decref(o);
        return NULL;
    }
    const struct {
        const char *key, *value;
    } fields[] = {
        {"role", m->role},
        {"name", m->name},
        {"tool_call_id", m->tool_call_id},
        {"reasoning_content", m->reasoning_content},
    };
    for (size_t k = 0; k < sizeof(fields) / sizeof(fields[0]); k++) {
        if (fields[k].value == NULL)
            continue;
        json_t *v = json_string(fields[k].value);
        if (v == NULL || json_object_set_new(o, fields[k].key, v) != 0) {
            snprintf(why, why_len, "message %zu: its %s is not valid UTF-8", i, fields[k].key);
            json_decref(o);
            return NULL;
        }
    }
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
            rc = PAGODA_EINVAL;
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
    bool cont = s->has_continue_final_message && s->continue_final_message;
    rc = text_model_render_chat(m, messages, tools, gen, cont, kwargs, text, text_len);
out:
    if (rc == PAGODA_ENOMEM && job->detail[0] == '\0')
        snprintf(job->detail, sizeof(job->detail), "out of memory rendering the chat");
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
    if (job->kind == JOB_DETOKENIZE) {
        job->rc = tokenizer_decode(text_model_tokenizer(m), job->detok_ids, job->detok_n,
                                   job->skip_special, &job->text, &job->text_len);
        if (job->rc != 0)
            pagoda_error_message(job->rc, job->detail, sizeof(job->detail));
        return;
    }
    Pagoda__SubmitRequest *s = pagoda__submit_request__unpack(NULL, job->packed_len, job->packed);
    if (s == NULL) {
        job->rc = PAGODA_ENOMEM;
        snprintf(job->detail, sizeof(job->detail), "out of memory reading the prompt");
        return;
    }
    char *rendered = NULL;
    size_t rendered_len = 0;
    const char *text = (const char *)s->prompt_text.data;
    size_t len = s->prompt_text.len;
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
    /* A text longer than the limit's worth of the longest tokens cannot fit: refused before it is
     * encoded, so that a template's megabytes (or a client's) cost the threadpool no more than
     * rendering them. A Tokenize call is not held to the prompt limit. */
    const Tokenizer *tok = text_model_tokenizer(m);
    const size_t per_token = tokenizer_max_bytes_per_token(tok);
    if (rc == 0 && job->kind == JOB_PROMPT && per_token > 0 && len > 0 &&
        (len - 1) / per_token >= job->max_prompt_tokens) { /* len > limit * bound */
        rc = PAGODA_ERANGE;
        snprintf(job->detail, sizeof(job->detail),
                 "the prompt has more tokens than the limit of %u: its %zu bytes of text make at "
                 "least %zu (a token stands for at most %zu bytes)",
                 job->max_prompt_tokens, len, (len + per_token - 1) / per_token, per_token);
    }
    if (rc == 0)
        rc = tokenizer_encode(tok, text ? text : "", len, special, &job->ids);
    if (rc == 0 && job->ids.len == 0 && job->kind == JOB_PROMPT) {
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
    free(job->detok_ids);
    free(job->text);
    free(job);
}

static void call_done(struct router *r, struct text_job *job, int status);

/* Takes job off the list at *head (and *tail, for a list that keeps one). */
static void job_unlink(struct text_job **head, struct text_job **tail, struct text_job *job)
{
    if (job->prev)
        job->prev->next = job->next;
    else
        *head = job->next;
    if (job->next)
        job->next->prev = job->prev;
    else if (tail != NULL)
        *tail = job->prev;
    job->prev = job->next = NULL;
}

static void pending_remove(struct router *r, struct text_job *job)
{
    job_unlink(&r->text_pending_head, &r->text_pending_tail, job);
}

static void job_done(uv_work_t *w, int status);

/* Starts waiting jobs, in arrival order, while the threadpool has room in all and for their
 * tenant. A job libuv refuses (never expected) waits for the next turn. */
static void dispatch(struct router *r)
{
    struct text_job *job = r->text_pending_head;
    while (job != NULL && r->text_jobs < ROUTER_MAX_TEXT_JOBS) {
        struct text_job *next = job->next;
        if (r->slots[job->tenant].text_jobs < ROUTER_MAX_TENANT_TEXT_JOBS) {
            int uv = uv_queue_work(r->loop, &job->work, job_work, job_done);
            if (uv != 0) {
                log_warn("could not queue a tokenization: %s", uv_strerror(uv));
                return;
            }
            pending_remove(r, job);
            /* Listed while queued, so that a router closing first reaches every job, those
             * whose request has gone too (router_text_router_closing). */
            job->next = r->text_queued;
            if (r->text_queued)
                r->text_queued->prev = job;
            r->text_queued = job;
            job->queued = 1;
            r->text_jobs++;
            r->slots[job->tenant].text_jobs++;
            tenancy_ref(r, job->tenant);
        }
        job = next;
    }
}

static void job_done(uv_work_t *w, int status)
{
    struct text_job *job = w->data;
    struct router *r = job->r;
    struct request *q = job->q;
    if (r != NULL) {
        job_unlink(&r->text_queued, NULL, job);
        r->text_jobs--;
        r->slots[job->tenant].text_jobs--;
        if (status == 0)
            r->text_jobs_run++;
        tenancy_unref(r, job->tenant); /* the slot is the job's until now */
        dispatch(r);
    }
    if (r != NULL && job->kind != JOB_PROMPT) {
        call_done(r, job, status);
        return;
    }
    if (r == NULL || q == NULL) {
        job_free(job);
        return;
    }
    q->job = NULL;
    if (status != 0 && job->rc == 0) {
        job->rc = PAGODA_EINTERNAL;
        snprintf(job->detail, sizeof(job->detail), "the tokenization job was cancelled");
    }
    router_prompt_ready(r, q, job->rc, job->detail, job->ids.ids, job->ids.len);
    job->ids.ids = NULL; /* taken by router_prompt_ready */
    job->ids.len = job->ids.cap = 0;
    job_free(job);
}

/* Puts job at the end of the waiting list and starts what may start. */
static void job_enqueue(struct router *r, struct text_job *job)
{
    job->work.data = job;
    job->prev = r->text_pending_tail;
    if (r->text_pending_tail)
        r->text_pending_tail->next = job;
    else
        r->text_pending_head = job;
    r->text_pending_tail = job;
    dispatch(r);
}

int router_text_attach(struct router *r, struct request *q, const Pagoda__SubmitRequest *s)
{
    int text = s != NULL && (s->has_prompt_text || s->n_messages > 0);
    int detokenize = r->text != NULL && (s == NULL || !s->has_detokenize || s->detokenize);
    if (detokenize) {
        const char *stops[OUTPUT_TEXT_MAX_STOPS];
        size_t lens[OUTPUT_TEXT_MAX_STOPS];
        size_t n = s ? s->n_stop : 0;
        for (size_t i = 0; i < n; i++) {
            stops[i] = (const char *)s->stop[i].data;
            lens[i] = s->stop[i].len;
        }
        bool skip = s == NULL || !s->has_skip_special_tokens || s->skip_special_tokens;
        bool keep = s != NULL && s->has_include_stop_str_in_output && s->include_stop_str_in_output;
        int rc =
            output_text_new(text_model_tokenizer(r->text->model), skip, stops, lens, n, &q->text);
        if (rc != 0)
            return rc;
        if (keep)
            output_text_keep_stops(q->text);
        if (q->p.sampling.min_tokens > 0)
            output_text_min_tokens(q->text, (uint32_t)q->p.sampling.min_tokens);
        q->keep_stops = keep;
        /* the same parameters for the scheduler to hold (router_text_attach_announced) */
        Pagoda__Internal__RouterText rt = PAGODA__INTERNAL__ROUTER_TEXT__INIT;
        ProtobufCBinaryData bins[OUTPUT_TEXT_MAX_STOPS];
        for (size_t i = 0; i < n; i++)
            bins[i] = (ProtobufCBinaryData){lens[i], (uint8_t *)stops[i]};
        rt.n_stop = n;
        rt.stop = bins;
        rt.has_skip_special_tokens = rt.has_detokenize = 1;
        rt.skip_special_tokens = skip;
        rt.detokenize = 1;
        rt.has_include_stop_str_in_output = keep;
        rt.include_stop_str_in_output = keep;
        size_t len = pagoda__internal__router_text__get_packed_size(&rt);
        free(q->router_text);
        if ((q->router_text = malloc(len ? len : 1)) == NULL)
            return pagoda_error_set(PAGODA_ENOMEM, "out of memory for the request's text");
        q->router_text_len = pagoda__internal__router_text__pack(&rt, q->router_text);
    }
    if (!text)
        return 0;
    struct text_job *job = calloc(1, sizeof(*job));
    if (job == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory for the prompt");
    if ((job->packed = pack_text_fields(s, 0, &job->packed_len)) == NULL) {
        free(job);
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory for the prompt");
    }
    job->r = r;
    job->q = q;
    job->tenant = q->tenant;
    job->holder = r->text;
    atomic_fetch_add(&r->text->refs, 1);
    job->max_prompt_tokens = r->cfg.max_prompt_tokens;
    q->job = job;
    job_enqueue(r, job);
    return 0;
}

/* The request no longer waits for its job: a job still waiting its turn is freed; one on the
 * threadpool is cancelled if it has not started (job_done then runs with UV_ECANCELED), else its
 * result is dropped, and it counts until it ends. */
static void detach_job(struct router *r, struct request *q)
{
    struct text_job *job = q->job;
    if (job == NULL)
        return;
    q->job = NULL;
    if (!job->queued) {
        pending_remove(r, job);
        job_free(job);
        return;
    }
    job->q = NULL;
    uv_cancel((uv_req_t *)&job->work);
}

void router_text_request_free(struct router *r, struct request *q)
{
    detach_job(r, q);
    output_text_free(q->text);
    q->text = NULL;
    free(q->router_text);
    q->router_text = NULL;
    q->router_text_len = 0;
}

int router_text_attach_announced(struct router *r, struct request *q,
                                 const Pagoda__Internal__TokenEvent *ev)
{
    if (!ev->has_router_text || ev->router_text.len == 0)
        return router_text_attach(r, q, NULL);
    Pagoda__Internal__RouterText *rt =
        pagoda__internal__router_text__unpack(NULL, ev->router_text.len, ev->router_text.data);
    if (rt == NULL || rt->n_stop > OUTPUT_TEXT_MAX_STOPS) {
        pagoda__internal__router_text__free_unpacked(rt, NULL);
        return pagoda_error_set(PAGODA_EFORMAT, "its router_text does not unpack");
    }
    /* as the client's SubmitRequest said it (no prompt text: no tokenizing job) */
    Pagoda__SubmitRequest s = PAGODA__SUBMIT_REQUEST__INIT;
    s.n_stop = rt->n_stop;
    s.stop = rt->stop;
    s.has_skip_special_tokens = rt->has_skip_special_tokens;
    s.skip_special_tokens = rt->skip_special_tokens;
    s.has_detokenize = 1;
    s.detokenize = !rt->has_detokenize || rt->detokenize;
    s.has_include_stop_str_in_output = rt->has_include_stop_str_in_output;
    s.include_stop_str_in_output = rt->include_stop_str_in_output;
    int rc = router_text_attach(r, q, &s);
    pagoda__internal__router_text__free_unpacked(rt, NULL);
    return rc;
}

void router_text_router_closing(struct router *r)
{
    /* Every job on the threadpool, its request gone or not, only frees itself when it ends. */
    for (struct text_job *job = r->text_queued; job != NULL; job = job->next)
        job->r = NULL;
    r->text_queued = NULL;
    struct req_list *lists[2] = {&r->live, &r->finished};
    for (int l = 0; l < 2; l++)
        for (struct request *q = lists[l]->head; q != NULL; q = q->next)
            if (q->job != NULL)
                detach_job(r, q); /* a queued one's r is cleared above */
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

int router_text_on_finish(struct router *r, struct request *q)
{
    detach_job(r, q);
    int stop = 0;
    if (q->text != NULL && output_text_finish(q->text, &stop) == 0 && stop > 0 &&
        q->stop_index == 0) {
        q->stop_index = stop;
        return 1;
    }
    return 0;
}

int router_text_fill(const struct request *q, uint32_t offset, ProtobufCBinaryData *text,
                     ProtobufCBinaryData *stop_string)
{
    text->data = stop_string->data = NULL;
    text->len = stop_string->len = 0;
    if (q->text == NULL)
        return 0;
    size_t len, start = output_text_start(q->text, offset);
    const char *all = output_text_visible(q->text, &len);
    if (start > len)
        start = len;
    text->data = (uint8_t *)all + start;
    text->len = len - start;
    if (q->stop_index > 0) {
        size_t n;
        const char *stop = output_text_stop(q->text, q->stop_index, &n);
        stop_string->data = (uint8_t *)stop;
        stop_string->len = n;
    }
    return 0;
}

uint32_t *router_text_token_ends(const struct request *q, uint32_t offset)
{
    if (q->text == NULL || offset >= q->num_tokens)
        return NULL;
    uint32_t n = q->num_tokens - offset;
    uint32_t *ends = malloc((size_t)n * sizeof(*ends));
    if (ends == NULL)
        return NULL;
    size_t len, base = output_text_start(q->text, offset);
    output_text_visible(q->text, &len);
    if (base > len)
        base = len;
    for (uint32_t i = 0; i < n; i++) {
        size_t end = i + 1 < n ? output_text_start(q->text, offset + i + 1) : len;
        if (end > len)
            end = len;
        if (end < base)
            end = base;
        ends[i] = (uint32_t)(end - base);
    }
    return ends;
}

size_t router_text_bytes(const struct request *q)
{
    return (q->text ? output_text_bytes(q->text) : 0) + (q->job ? q->job->packed_len : 0);
}

/* ---- Tokenize calls ---------------------------------------------------------------------- */

/* The bytes one tenant's Tokenize calls may hold: a quarter of all tenants' where a tenants file
 * names several (one tenant's burst never takes them all), all of them otherwise. */
static size_t tenant_call_bytes_max(const struct router *r)
{
    return r->tenants != NULL && r->tenants->count > 1 ? ROUTER_MAX_TENANT_TEXT_CALL_BYTES
                                                       : ROUTER_MAX_TEXT_CALL_BYTES;
}

void router_text_handle_tokenize(struct router *r, struct rctx *c, uint32_t tenant,
                                 const Pagoda__TokenizeRequest *t)
{
    int text = t->has_prompt_text, chat = t->n_messages > 0;
    if (r->text == NULL) {
        router_reply_error(c, PAGODA_EUNSUPPORTED, "tokenize: %s", r->text_error);
        return;
    }
    if (r->draining) {
        router_reply_error(c, PAGODA_ECLOSED, "tokenize: the router is draining (shutting down)");
        return;
    }
    /* The text fields as a Submit holds them: checked as a Submit's are, packed for the job. */
    Pagoda__SubmitRequest s = PAGODA__SUBMIT_REQUEST__INIT;
    text_fields_to_submit(&s, t);
    pagoda_error_clear();
    int rc = text_forms_check(&s, t->n_token_ids, "prompt_text, messages and token_ids");
    if (rc == 0)
        rc = text_chat_check(r, &s);
    if (rc != 0) {
        router_reply_error(c, rc, "tokenize: %s", pagoda_error_detail());
        return;
    }
    /* Parked until its job answers: bounded as every parked call is, by tenant in calls (so that
     * one tenant's flood neither fills the parked calls nor queues far ahead of the others'
     * prompts), and in the bytes the jobs hold (their packed text fields, or ids), a tenant's and
     * all tenants'. */
    struct tenant_slot *slot = &r->slots[tenant];
    if (!router_may_park(r, c) || slot->text_calls >= ROUTER_MAX_TENANT_TEXT_CALLS) {
        r->parked_refused++;
        router_reply_error(c, PAGODA_EBUSY,
                           "tokenize: too many calls wait (this tenant's Tokenize calls: %u of %u; "
                           "parked calls: %u of %u): retry later",
                           slot->text_calls, ROUTER_MAX_TENANT_TEXT_CALLS, r->num_parked,
                           r->cfg.max_parked_calls);
        return;
    }
    struct text_job *job = calloc(1, sizeof(*job));
    if (job == NULL) {
        router_reply_error(c, PAGODA_ENOMEM, "tokenize: out of memory");
        return;
    }
    if (text || chat) {
        job->kind = JOB_TOKENIZE;
        job->packed = pack_text_fields(&s, 0, &job->packed_len);
        job->max_prompt_tokens = UINT32_MAX; /* as vLLM's /tokenize: no limit but the text's */
    } else {
        job->kind = JOB_DETOKENIZE;
        /* as vLLM's /detokenize (tokenizer.decode): special tokens kept unless asked */
        job->skip_special = t->has_skip_special_tokens && t->skip_special_tokens;
        job->detok_n = t->n_token_ids;
        job->detok_ids = malloc((t->n_token_ids ? t->n_token_ids : 1) * sizeof(int32_t));
        if (job->detok_ids != NULL && t->n_token_ids > 0)
            memcpy(job->detok_ids, t->token_ids, t->n_token_ids * sizeof(int32_t));
    }
    if ((job->kind == JOB_TOKENIZE && job->packed == NULL) ||
        (job->kind == JOB_DETOKENIZE && job->detok_ids == NULL)) {
        job_free(job);
        router_reply_error(c, PAGODA_ENOMEM, "tokenize: out of memory");
        return;
    }
    const size_t bytes =
        job->kind == JOB_TOKENIZE ? job->packed_len : job->detok_n * sizeof(int32_t);
    const size_t tenant_max = tenant_call_bytes_max(r);
    if (slot->text_call_bytes + bytes > tenant_max ||
        r->text_call_bytes + bytes > ROUTER_MAX_TEXT_CALL_BYTES) {
        job_free(job);
        r->parked_refused++;
        router_reply_error(c, PAGODA_EBUSY,
                           "tokenize: too many bytes wait (this tenant's calls hold %zu of %zu; "
                           "all tenants' %zu of %u; this call's: %zu): retry later",
                           slot->text_call_bytes, tenant_max, r->text_call_bytes,
                           ROUTER_MAX_TEXT_CALL_BYTES, bytes);
        return;
    }
    job->r = r;
    job->c = c;
    job->tenant = tenant;
    job->holder = r->text;
    atomic_fetch_add(&r->text->refs, 1);
    tenancy_ref(r, tenant); /* the job's, until it ends or is dropped */
    slot->text_calls++;
    slot->text_call_bytes += bytes;
    job->call_bytes = bytes;
    r->text_call_bytes += bytes;
    c->job = job;
    c->park = PARK_TEXT;
    router_park(&r->text_waiters, c, ROUTER_TEXT_CALL_TIMEOUT_MS);
    job_enqueue(r, job);
}

/* A Tokenize call's job no longer counts (r is alive). */
static void call_release(struct router *r, struct text_job *job)
{
    r->slots[job->tenant].text_calls--;
    r->slots[job->tenant].text_call_bytes -= job->call_bytes;
    r->text_call_bytes -= job->call_bytes;
    tenancy_unref(r, job->tenant);
}

/* Loop thread: a Tokenize call's job ended (r is alive). Answers its call if it still waits. */
static void call_done(struct router *r, struct text_job *job, int status)
{
    struct rctx *c = job->c;
    call_release(r, job);
    if (c != NULL) {
        job->c = NULL;
        c->job = NULL;
        router_unpark(c);
        if (status != 0 && job->rc == 0) {
            job->rc = PAGODA_EINTERNAL;
            snprintf(job->detail, sizeof(job->detail), "the tokenization job was cancelled");
        }
        if (job->rc != 0) {
            router_reply_error(c, job->rc, "tokenize: %s", job->detail);
        } else {
            Pagoda__ClientResponse resp = PAGODA__CLIENT_RESPONSE__INIT;
            Pagoda__TokenizeResponse tr = PAGODA__TOKENIZE_RESPONSE__INIT;
            if (job->kind == JOB_TOKENIZE) {
                tr.n_token_ids = job->ids.len;
                tr.token_ids = job->ids.ids;
            } else {
                tr.has_text = 1;
                tr.text.data = (uint8_t *)job->text;
                tr.text.len = job->text_len;
            }
            tr.has_max_model_len = 1;
            tr.max_model_len = r->model_positions;
            resp.result_case = PAGODA__CLIENT_RESPONSE__RESULT_TOKENIZE;
            resp.tokenize = &tr;
            router_reply(c, &resp);
        }
    }
    job_free(job);
}

void router_text_call_detach(struct rctx *c)
{
    struct text_job *job = c->job;
    if (job == NULL)
        return;
    c->job = NULL;
    job->c = NULL;
    if (!job->queued) {
        pending_remove(c->r, job);
        call_release(c->r, job);
        job_free(job);
        return;
    }
    uv_cancel((uv_req_t *)&job->work); /* call_done drops its result */
}
