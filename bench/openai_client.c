/* pagoda-bench's OpenAI client (openai_client.h): libcurl does the HTTP (connection, chunked
 * transfer, keep-alive); this file builds the request's JSON, splits the response body into
 * server-sent events (lines, an event ending at a blank line) and reads each event's JSON with
 * jansson. */
#include "bench/openai_client.h"

#include "common/error.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct openai_client {
    CURL *curl;
    char *models_url, *completions_url;
    uint32_t timeout_ms;
};

struct openai_client *openai_client_new(const char *base_url, uint32_t timeout_ms)
{
    struct openai_client *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    size_t n = strlen(base_url);
    while (n > 0 && base_url[n - 1] == '/')
        n--;
    /* "http://host:port" or "http://host:port/v1": the API's root either way. */
    const char *v1 = n >= 3 && strncmp(base_url + n - 3, "/v1", 3) == 0 ? "" : "/v1";
    size_t cap = n + 32;
    c->models_url = malloc(cap);
    c->completions_url = malloc(cap);
    c->curl = curl_easy_init();
    if (c->models_url == NULL || c->completions_url == NULL || c->curl == NULL) {
        openai_client_free(c);
        return NULL;
    }
    snprintf(c->models_url, cap, "%.*s%s/models", (int)n, base_url, v1);
    snprintf(c->completions_url, cap, "%.*s%s/completions", (int)n, base_url, v1);
    c->timeout_ms = timeout_ms;
    return c;
}

void openai_client_free(struct openai_client *c)
{
    if (c == NULL)
        return;
    if (c->curl != NULL)
        curl_easy_cleanup(c->curl);
    free(c->models_url);
    free(c->completions_url);
    free(c);
}

/* ---- one request's state ------------------------------------------------------------------ */

struct sse {
    /* The body as it arrives: the bytes of an unfinished line. */
    char *line;
    size_t line_len, line_cap;
    /* The data of the event being read (its "data:" lines joined by '\n'). */
    char *data;
    size_t data_len, data_cap;
    int status; /* the HTTP status, once the headers are in */
    int whole;  /* keep the body whole in error_body (the models list), not as events */
    int done;   /* [DONE] seen */
    int rc;     /* the first error, which stops the transfer */
    char detail[512];
    /* What the chunks said. */
    pagoda_result *res;
    pagoda_stream_fn on_tokens;
    void *user;
    size_t tokens_cap;
    /* A non-200 answer's body, for its message. */
    char error_body[OPENAI_CLIENT_MAX_ERROR_BYTES + 1];
    size_t error_len;
};

static int grow(char **buf, size_t *cap, size_t need)
{
    if (need <= *cap)
        return 0;
    if (need > OPENAI_CLIENT_MAX_EVENT_BYTES + 2)
        return PAGODA_ERANGE;
    size_t c = *cap ? *cap : 1024;
    while (c < need)
        c *= 2;
    char *p = realloc(*buf, c);
    if (p == NULL)
        return PAGODA_ENOMEM;
    *buf = p;
    *cap = c;
    return 0;
}

static void sse_fail(struct sse *s, int rc, const char *fmt, const char *arg)
{
    if (s->rc != 0)
        return;
    s->rc = rc;
    snprintf(s->detail, sizeof(s->detail), fmt, arg);
}

static int add_tokens(struct sse *s, const int32_t *ids, size_t n)
{
    pagoda_result *r = s->res;
    if (r->num_tokens + n > s->tokens_cap) {
        size_t cap = s->tokens_cap ? s->tokens_cap * 2 : 64;
        while (cap < r->num_tokens + n)
            cap *= 2;
        int32_t *p = realloc(r->token_ids, cap * sizeof(*p));
        if (p == NULL)
            return PAGODA_ENOMEM;
        r->token_ids = p;
        s->tokens_cap = cap;
    }
    uint32_t offset = (uint32_t)r->num_tokens;
    memcpy(r->token_ids + r->num_tokens, ids, n * sizeof(*ids));
    r->num_tokens += n;
    if (s->on_tokens != NULL)
        s->on_tokens(s->user, offset, ids, NULL, n);
    return 0;
}

/* "token_id:N" (pagoda-gateway's and vLLM's name for a token), else -1. */
static int32_t token_id_of(const json_t *t)
{
    const char *name = json_string_value(t);
    if (name == NULL || strncmp(name, "token_id:", 9) != 0)
        return -1;
    char *end;
    long v = strtol(name + 9, &end, 10);
    return *end == '\0' && end != name + 9 && v >= 0 && v <= INT32_MAX ? (int32_t)v : -1;
}

static pagoda_finish_reason finish_of(const char *name)
{
    if (strcmp(name, "stop") == 0)
        return PAGODA_FINISH_STOP;
    if (strcmp(name, "length") == 0)
        return PAGODA_FINISH_LENGTH;
    if (strcmp(name, "abort") == 0 || strcmp(name, "cancelled") == 0)
        return PAGODA_FINISH_CANCELLED;
    return PAGODA_FINISH_ERROR;
}

/* The size of the chunk stack buffer for token ids; a longer chunk is added in parts. */
#define CHUNK_IDS 256

/* One event's data: a chunk, an error, or [DONE]. */
static void sse_event(struct sse *s)
{
    if (s->data_len == 0)
        return;
    s->data[s->data_len] = '\0';
    if (s->done) {
        sse_fail(s, PAGODA_EPROTO, "data after [DONE]: %.100s", s->data);
        return;
    }
    if (strcmp(s->data, "[DONE]") == 0) {
        s->done = 1;
        return;
    }
    json_error_t jerr;
    json_t *chunk = json_loadb(s->data, s->data_len, 0, &jerr);
    if (!json_is_object(chunk)) {
        json_decref(chunk);
        sse_fail(s, PAGODA_EPROTO, "a chunk that is not a JSON object: %.100s", s->data);
        return;
    }
    pagoda_result *r = s->res;
    const json_t *err = json_object_get(chunk, "error");
    if (err != NULL) {
        /* The stream's last event when the request failed after the status line. */
        const char *msg = json_string_value(json_object_get(err, "message"));
        r->finish_reason = PAGODA_FINISH_ERROR;
        free(r->error_message);
        r->error_message = strdup(msg ? msg : "an error event without a message");
        json_decref(chunk);
        return;
    }
    const json_t *usage = json_object_get(chunk, "usage");
    if (json_is_object(usage)) {
        r->prompt_tokens = (uint32_t)json_integer_value(json_object_get(usage, "prompt_tokens"));
        r->completion_tokens =
            (uint32_t)json_integer_value(json_object_get(usage, "completion_tokens"));
        const json_t *details = json_object_get(usage, "prompt_tokens_details");
        r->cached_tokens = (uint32_t)json_integer_value(json_object_get(details, "cached_tokens"));
    }
    const json_t *choice = json_array_get(json_object_get(chunk, "choices"), 0);
    if (choice != NULL) {
        const json_t *tokens = json_object_get(json_object_get(choice, "logprobs"), "tokens");
        int rc = 0;
        if (json_is_array(tokens)) {
            int32_t ids[CHUNK_IDS];
            size_t n = json_array_size(tokens), k = 0;
            for (size_t i = 0; rc == 0 && i < n; i++) {
                ids[k++] = token_id_of(json_array_get(tokens, i));
                if (k == CHUNK_IDS || i + 1 == n) {
                    rc = add_tokens(s, ids, k);
                    k = 0;
                }
            }
        } else {
            const char *text = json_string_value(json_object_get(choice, "text"));
            int32_t unknown = -1;
            if (text != NULL && text[0] != '\0')
                rc = add_tokens(s, &unknown, 1);
        }
        if (rc != 0)
            sse_fail(s, rc, "%s", "out of memory");
        const char *finish = json_string_value(json_object_get(choice, "finish_reason"));
        if (finish != NULL)
            r->finish_reason = finish_of(finish);
    }
    json_decref(chunk);
}

/* One line of the event stream (without its end of line). */
static void sse_line(struct sse *s, const char *line, size_t len)
{
    if (len > 0 && line[len - 1] == '\r')
        len--;
    if (len == 0) {
        sse_event(s);
        s->data_len = 0;
        return;
    }
    if (len < 5 || strncmp(line, "data:", 5) != 0)
        return; /* comments (":"), "event:", "id:", "retry:" */
    line += 5;
    len -= 5;
    if (len > 0 && line[0] == ' ') {
        line++;
        len--;
    }
    int rc = grow(&s->data, &s->data_cap, s->data_len + len + 2);
    if (rc != 0) {
        sse_fail(s, rc, "%s", rc == PAGODA_ERANGE ? "an event over the size limit" : "no memory");
        return;
    }
    if (s->data_len > 0)
        s->data[s->data_len++] = '\n';
    memcpy(s->data + s->data_len, line, len);
    s->data_len += len;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct sse *s = arg;
    size_t len = size * nmemb;
    if (s->status != 200 || s->whole) {
        size_t room = OPENAI_CLIENT_MAX_ERROR_BYTES - s->error_len;
        size_t k = len < room ? len : room;
        memcpy(s->error_body + s->error_len, ptr, k);
        s->error_len += k;
        s->error_body[s->error_len] = '\0';
        return len;
    }
    size_t start = 0;
    for (size_t i = 0; i < len && s->rc == 0; i++) {
        if (ptr[i] != '\n')
            continue;
        if (s->line_len > 0) {
            /* The line began in an earlier piece. */
            int rc = grow(&s->line, &s->line_cap, s->line_len + (i - start) + 1);
            if (rc != 0) {
                sse_fail(s, rc, "%s", "a line over the size limit");
                break;
            }
            memcpy(s->line + s->line_len, ptr + start, i - start);
            sse_line(s, s->line, s->line_len + (i - start));
            s->line_len = 0;
        } else {
            sse_line(s, ptr + start, i - start);
        }
        start = i + 1;
    }
    if (s->rc == 0 && start < len) {
        int rc = grow(&s->line, &s->line_cap, s->line_len + (len - start) + 1);
        if (rc != 0) {
            sse_fail(s, rc, "%s", "a line over the size limit");
        } else {
            memcpy(s->line + s->line_len, ptr + start, len - start);
            s->line_len += len - start;
        }
    }
    return s->rc == 0 ? len : 0; /* 0 makes libcurl stop with CURLE_WRITE_ERROR */
}

/* The status line of the response (a later one, after a 100 Continue, replaces it). */
static size_t on_header(char *ptr, size_t size, size_t nmemb, void *arg)
{
    struct sse *s = arg;
    size_t len = size * nmemb;
    if (len > 9 && strncmp(ptr, "HTTP/", 5) == 0) {
        const char *sp = memchr(ptr, ' ', len);
        s->status = sp != NULL ? atoi(sp + 1) : 0;
    }
    return len;
}

static int status_error(int status)
{
    switch (status) {
    case 400:
    case 404:
    case 413:
        return PAGODA_EINVAL;
    case 401:
    case 403:
        return PAGODA_EPERM;
    case 429:
        return PAGODA_EBUSY;
    default:
        return PAGODA_EIO;
    }
}

/* The message of an OpenAI error body, or the body's start. */
static int fail_status(const struct sse *s, const char *url)
{
    json_t *doc = json_loadb(s->error_body, s->error_len, 0, NULL);
    const char *msg = json_string_value(json_object_get(json_object_get(doc, "error"), "message"));
    int rc = pagoda_error_set(status_error(s->status), "%s: HTTP %d: %.300s", url, s->status,
                              msg ? msg : s->error_body);
    json_decref(doc);
    return rc;
}

static void setup(struct openai_client *c, const char *url, const char *api_key,
                  struct curl_slist **headers, struct sse *s)
{
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)c->timeout_ms);
    /* Silence beyond the timeout fails the request; a long stream that keeps sending does not. */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, (long)((c->timeout_ms + 999) / 1000));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, s);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, s);
    curl_easy_setopt(h, CURLOPT_TCP_NODELAY, 1L);
    if (api_key != NULL) {
        char auth[600];
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", api_key);
        *headers = curl_slist_append(*headers, auth);
    }
}

static int perform(struct openai_client *c, const char *url, struct sse *s)
{
    CURLcode cc = curl_easy_perform(c->curl);
    if (s->rc != 0)
        return pagoda_error_set(s->rc, "%s: %s", url, s->detail);
    if (cc == CURLE_OPERATION_TIMEDOUT)
        return pagoda_error_set(PAGODA_ETIMEDOUT, "%s: %s", url, curl_easy_strerror(cc));
    if (cc != CURLE_OK)
        return pagoda_error_set(PAGODA_EIO, "%s: %s", url, curl_easy_strerror(cc));
    if (s->status != 200)
        return fail_status(s, url);
    return 0;
}

int openai_client_models(struct openai_client *c, const char *api_key, char **model_out)
{
    if (model_out != NULL)
        *model_out = NULL;
    struct sse s = {0};
    struct curl_slist *headers = NULL;
    setup(c, c->models_url, api_key, &headers, &s);
    /* The list is read as an error body is: small, whole. */
    s.whole = 1;
    curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, headers);
    CURLcode cc = curl_easy_perform(c->curl);
    curl_slist_free_all(headers);
    if (cc != CURLE_OK)
        return pagoda_error_set(PAGODA_EIO, "%s: %s", c->models_url, curl_easy_strerror(cc));
    if (s.status != 200)
        return fail_status(&s, c->models_url);
    json_t *doc = json_loadb(s.error_body, s.error_len, 0, NULL);
    const json_t *first = json_array_get(json_object_get(doc, "data"), 0);
    int rc = 0;
    if (!json_is_array(json_object_get(doc, "data")))
        rc = pagoda_error_set(PAGODA_EPROTO, "%s: not a list of models", c->models_url);
    else if (model_out != NULL && json_string_value(json_object_get(first, "id")) != NULL &&
             (*model_out = strdup(json_string_value(json_object_get(first, "id")))) == NULL)
        rc = PAGODA_ENOMEM;
    json_decref(doc);
    return rc;
}

static char *request_json(const char *model, const pagoda_generate_params *p, const int32_t *prompt,
                          size_t n)
{
    json_t *ids = json_array();
    for (size_t i = 0; ids != NULL && i < n; i++)
        if (json_array_append_new(ids, json_integer(prompt[i])) != 0) {
            json_decref(ids);
            ids = NULL;
        }
    /* logprobs with return_tokens_as_token_ids (vLLM's; the gateway's too): each chunk names its
     * tokens by id, which the report compares with NNG's. */
    json_t *body = json_pack("{s:o,s:i,s:f,s:b,s:{s:b},s:i,s:b}", "prompt", ids, "max_tokens",
                             (int)p->max_tokens, "temperature", (double)p->temperature, "stream", 1,
                             "stream_options", "include_usage", 1, "logprobs", 0,
                             "return_tokens_as_token_ids", 1);
    if (body == NULL)
        return NULL;
    int bad = 0;
    if (model != NULL)
        bad |= json_object_set_new(body, "model", json_string(model));
    if (p->top_p > 0 && p->top_p < 1)
        bad |= json_object_set_new(body, "top_p", json_real(p->top_p));
    if (p->has_seed)
        bad |= json_object_set_new(body, "seed", json_integer((json_int_t)(p->seed & INT64_MAX)));
    if (p->ignore_eos)
        bad |= json_object_set_new(body, "ignore_eos", json_true());
    char *s = bad ? NULL : json_dumps(body, JSON_COMPACT);
    json_decref(body);
    return s;
}

int openai_client_stream(struct openai_client *c, const char *api_key, const char *model,
                         const pagoda_generate_params *params, const int32_t *prompt, size_t n,
                         pagoda_stream_fn on_tokens, void *user, pagoda_result *result)
{
    memset(result, 0, sizeof(*result));
    char *body = request_json(model, params, prompt, n);
    if (body == NULL)
        return PAGODA_ENOMEM;
    struct sse s = {.res = result, .on_tokens = on_tokens, .user = user};
    struct curl_slist *headers = NULL;
    setup(c, c->completions_url, api_key, &headers, &s);
    headers = curl_slist_append(headers, "Content-Type: application/json");
    headers = curl_slist_append(headers, "Accept: text/event-stream");
    /* libcurl would send a body over 1 KiB after "Expect: 100-continue" and an answer (or a
     * second's wait): a round trip that is no part of what is measured. */
    headers = curl_slist_append(headers, "Expect:");
    curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(body));
    int rc = perform(c, c->completions_url, &s);
    if (rc == 0 && s.line_len > 0)
        sse_line(&s, s.line, s.line_len); /* a last line without its end */
    if (rc == 0 && !s.done && result->finish_reason != PAGODA_FINISH_ERROR)
        rc =
            pagoda_error_set(PAGODA_EIO, "%s: the stream ended without [DONE]", c->completions_url);
    if (rc == 0 && result->finish_reason == PAGODA_FINISH_NONE)
        rc = pagoda_error_set(PAGODA_EPROTO, "%s: the stream ended without a finish_reason",
                              c->completions_url);
    curl_slist_free_all(headers);
    free(body);
    free(s.line);
    free(s.data);
    return rc;
}
