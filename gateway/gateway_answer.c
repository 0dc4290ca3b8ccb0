/* What the gateway writes to its clients: a route's plain answer, a request's JSON answer or error
 * (with Retry-After where a retry helps), the SSE stream's chunks and its end, the JSON of a whole
 * answer or of /tokenize's, built on the loop when it is small and on the threadpool when it is
 * large (json_work, at most GATEWAY_JSON_JOBS at once; whole_json and tokenized_json run on
 * either), and /health's answer. A call that ends a response drops the HTTP side's reference
 * (gateway_http_end). Requests in, the calls to the router, a generation's choices and the
 * results they gather, the mailbox and the gateway's lifecycle are gateway.c's. Everything here
 * runs on the loop but json_work. */
#include "gateway/gateway_internal.h"

#include "common/error.h"
#include "gateway/openai.h"

#include <stdlib.h>
#include <string.h>

/* What a choice adds to a whole answer's JSON besides its text and tokens (index, finish, ...),
 * for the size that decides where it is built. */
#define GATEWAY_JSON_CHOICE_BYTES 128u

/* The HTTP side is done (answered, or the client went away). */
static void http_done(struct greq *q)
{
    if (q->http == NULL)
        return;
    q->http = NULL;
    greq_unref(q);
}

/* After a call that ends the response (http_respond, http_stream_end) or a write on the way to it,
 * rc its result: the HTTP side is done when the response ended. When the call failed the request
 * is still the HTTP layer's, and its close callback (on_http_close) is still to come and drops
 * the HTTP side's reference then: dropping it here would free q before the callback reads it (a
 * client that closes its connection as its answer goes out). A failure other than a closed
 * connection (out of memory, say: the request cannot be answered) closes the connection, so that
 * the callback comes now rather than when the client gives up. q may be freed after this. */
void gateway_http_end(struct greq *q, int rc)
{
    if (q->http == NULL)
        return;
    if (rc == 0)
        http_done(q);
    else if (rc != PAGODA_ECLOSED)
        http_request_abort(q->http);
}

/* An answer of no request of ours (a route answered at once, or refused before a request was
 * made): one that cannot be made for want of memory closes the connection, which would wait
 * unanswered otherwise (a closed one is gone already). */
void gateway_respond_plain(struct http_request *http, int status, const char *content_type,
                           const void *body, size_t len, const char *const *headers,
                           size_t num_headers)
{
    int rc = http_respond(http, status, content_type, body, len, headers, num_headers);
    if (rc != 0 && rc != PAGODA_ECLOSED)
        http_request_abort(http);
}

/* An error answer of no request of ours (a refusal before one is made: 404, 405, a preflight's
 * 403, the gateway's 429): counted as the errors of requests are (gateway_respond_error). */
void gateway_respond_plain_error(struct gateway *g, struct http_request *http,
                                 const struct openai_error *err, const char *const *headers,
                                 size_t num_headers)
{
    char *json = openai_error_json(err);
    gateway_respond_plain(http, err->status, "application/json", json ? json : "{}",
                          json ? strlen(json) : 2, headers, num_headers);
    free(json);
    gateway_metrics_error(g, err->status);
}

/* ---- answering ----------------------------------------------------------------------------- */

/* The extra header of a status a client should retry after (429: a limit is full; 503: the router
 * or the gateway cannot take it now): Retry-After: 1, which OpenAI's clients wait for before their
 * retry, as the HTTP server's own 503s carry. *n: 1 with it, 0 without. */
const char *const *gateway_retry_headers(int status, size_t *n)
{
    static const char *const retry[] = {"Retry-After: 1"};
    *n = status == 429 || status == 503;
    return *n ? retry : NULL;
}

static void respond_json(struct greq *q, int status, char *json);
static int stream_write_json(struct greq *q, char *json);

void gateway_respond_text(struct greq *q, int status, const char *content_type, const char *body,
                          size_t len)
{
    if (q->http == NULL)
        return;
    gateway_http_end(q, http_respond(q->http, status, content_type, body, len, NULL, 0));
}

void gateway_respond_json(struct greq *q, int status, char *json)
{
    respond_json(q, status, json);
}

static void respond_json(struct greq *q, int status, char *json)
{
    if (q->http == NULL) {
        free(json);
        return;
    }
    int rc;
    if (json == NULL) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":"
                                  "\"internal_server_error\",\"param\":null,\"code\":null}}";
        rc = http_respond(q->http, 500, "application/json", oom, sizeof(oom) - 1, NULL, 0);
    } else {
        size_t n;
        const char *const *headers = gateway_retry_headers(status, &n);
        rc = http_respond(q->http, status, "application/json", json, strlen(json), headers, n);
        free(json);
    }
    gateway_http_end(q, rc);
}

void gateway_respond_error(struct greq *q, const struct openai_error *err)
{
    if (q->http == NULL)
        return; /* answered already (another choice's error), or the client is gone */
    gateway_metrics_error(q->g, err->status);
    if (q->streaming) {
        /* The status line is gone: the error is the stream's last event. */
        int rc = stream_write_json(q, openai_error_json(err));
        if (rc == 0 && (rc = http_stream_write(q->http, "data: [DONE]\n\n", 14)) == 0)
            rc = http_stream_end(q->http);
        gateway_http_end(q, rc);
        return;
    }
    respond_json(q, err->status, openai_error_json(err));
}

void gateway_respond_code(struct greq *q, int code, const char *detail)
{
    struct openai_error err;
    openai_error_from_code(code, detail, &err);
    gateway_respond_error(q, &err);
}

/* ---- streams and whole answers --------------------------------------------------------------- */

/* The fields of an answer or chunk of choice c that come from the request and from a result r
 * (its finish, stop and usage); the caller adds the text and tokens. */
static void fill_out(const struct gchoice *c, const pagoda_result *r, struct openai_out *o)
{
    const struct greq *q = c->q;
    memset(o, 0, sizeof(*o));
    o->req = &q->req;
    o->id = q->id_str;
    o->created = q->created;
    o->model = q->g->cfg.model_name;
    o->index = c->index;
    o->finish = r->finish_reason;
    o->stop_string = r->stop_string;
    o->has_stop_token_id = r->has_stop_token_id;
    o->stop_token_id = r->stop_token_id;
    o->prompt_tokens = r->prompt_tokens;
    o->completion_tokens = r->completion_tokens;
    o->cached_tokens = r->cached_tokens;
}

static int stream_write_json(struct greq *q, char *json)
{
    int rc = json == NULL ? PAGODA_ENOMEM : 0;
    if (rc == 0 && (rc = http_stream_write(q->http, "data: ", 6)) == 0 &&
        (rc = http_stream_write(q->http, json, strlen(json))) == 0)
        rc = http_stream_write(q->http, "\n\n", 2);
    free(json);
    return rc;
}

int gateway_stream_open(struct greq *q)
{
    static const char *const headers[] = {"Cache-Control: no-cache"};
    int rc = http_stream_start(q->http, 200, "text/event-stream", headers, 1);
    if (rc != 0)
        return rc;
    q->streaming = 1;
    if (q->req.kind != OPENAI_CHAT)
        return 0;
    /* OpenAI and vLLM send each choice's role alone, in index order, before any content. */
    const pagoda_result none = {.finish_reason = PAGODA_FINISH_NONE};
    for (uint32_t i = 0; i < q->num_choices && rc == 0; i++) {
        struct openai_out o;
        fill_out(&q->choices[i], &none, &o);
        rc = stream_write_json(q, openai_chunk_json(&o, true, false));
        q->choices[i].first_chunk_sent = 1;
    }
    return rc;
}

/* Choice c's piece r through its tool-call parser (made with its first piece) into *calls: the
 * content to show now and the calls completed, the last piece's with what was held back. */
static int parse_piece(struct gchoice *c, const pagoda_result *r, struct tool_calls_output *calls)
{
    int rc = 0;
    if (c->tools == NULL && (rc = tool_calls_stream_new(c->q->req.tool_parser, &c->tools)) != 0)
        return rc;
    if (r->text_len > 0)
        rc = tool_calls_stream_feed(c->tools, r->text, r->text_len, calls);
    if (rc == 0 && r->finish_reason != PAGODA_FINISH_NONE)
        rc = tool_calls_stream_finish(c->tools, calls);
    return rc;
}

/* A piece of choice c's output for a streaming client: one chunk with its text (and its finish);
 * after the last choice's finish, the usage (when asked for) and the end. A chat parsed for tool
 * calls has its content and calls in the chunk instead of the text. */
void gateway_stream_piece(struct gchoice *c, const pagoda_result *r)
{
    struct greq *q = c->q;
    struct openai_out o;
    fill_out(c, r, &o);
    o.text = r->text;
    o.text_len = r->text_len;
    o.token_ids = r->token_ids;
    o.logprobs = q->req.params.logprobs ? r->logprobs : NULL;
    o.token_text_ends = r->token_text_ends;
    o.text_offset = c->chars_sent;
    o.n = r->num_tokens;
    struct tool_calls_output calls = {0};
    if (q->req.tool_parser != TOOL_CALL_PARSER_NONE) {
        int rc = parse_piece(c, r, &calls);
        if (rc != 0) {
            tool_calls_output_fini(&calls);
            gateway_http_end(q, rc); /* its close callback cancels */
            return;
        }
        const uint32_t called = tool_calls_stream_num_calls(c->tools);
        o.tools_parsed = true;
        o.tools_called = called > 0;
        o.content = calls.content;
        o.content_len = calls.content_len;
        o.tool_calls = calls.calls;
        o.num_tool_calls = calls.num_calls;
        o.first_tool_call = called - (uint32_t)calls.num_calls;
    }
    const bool shown =
        o.tools_parsed ? o.content_len > 0 || openai_tool_calls_shown(&o) > 0 : r->text_len > 0;
    /* A piece whose tokens completed no text yet (a character split over tokens, or text held
     * back as a tool call's) sends nothing, unless the client asked for the tokens'
     * log-probabilities, or it is a completion's first (a chat's first chunk is its role:
     * gateway_stream_open). */
    if (shown || (r->num_tokens > 0 && o.logprobs != NULL) || !c->first_chunk_sent ||
        r->finish_reason != PAGODA_FINISH_NONE) {
        int rc = stream_write_json(q, openai_chunk_json(&o, false, false));
        if (rc != 0) {
            tool_calls_output_fini(&calls);
            gateway_http_end(q, rc); /* its close callback cancels */
            return;
        }
        c->first_chunk_sent = 1;
        c->chars_sent += openai_utf8_chars(r->text, r->text_len);
    }
    tool_calls_output_fini(&calls);
    if (!q->finished)
        return;
    int rc = 0;
    if (q->req.include_usage) {
        struct openai_out *outs = malloc(q->num_choices * sizeof(*outs));
        char *json = NULL;
        if (outs != NULL) {
            for (uint32_t i = 0; i < q->num_choices; i++)
                fill_out(&q->choices[i], &q->choices[i].whole, &outs[i]);
            openai_usage_sum(&o, outs, q->num_choices);
            free(outs);
            json = openai_chunk_json(&o, false, true);
        }
        rc = stream_write_json(q, json);
    }
    if (rc == 0 && (rc = http_stream_write(q->http, "data: [DONE]\n\n", 14)) == 0)
        rc = http_stream_end(q->http);
    gateway_http_end(q, rc);
}

/* What a token of q's answer counts in its JSON's size: GATEWAY_JSON_TOKEN_BYTES, or
 * GATEWAY_LOGPROB_BYTES with log-probabilities. */
size_t gateway_token_json_bytes(const struct greq *q)
{
    return q->req.params.logprobs ? GATEWAY_LOGPROB_BYTES : GATEWAY_JSON_TOKEN_BYTES;
}

/* An answer's JSON built on the threadpool, where it is large: a whole answer (res NULL: its
 * choices, which no call changes once all have finished, and q's reference keeps) or a tokenize
 * call's (res, its result, owned). */
struct json_job {
    uv_work_t work;
    struct greq *q;
    pagoda_async_result *res;
    char *json;
    struct json_job *next; /* gateway.json_waiting */
};

static char *whole_json(const struct greq *q);
static char *tokenized_json(const struct greq *q, const pagoda_async_result *res);

static void json_work(uv_work_t *w)
{
    struct json_job *j = w->data;
    j->json = j->res != NULL ? tokenized_json(j->q, j->res) : whole_json(j->q);
}

static void after_json(uv_work_t *w, int status);

/* Starts the waiting JSON jobs while fewer than GATEWAY_JSON_JOBS run: the threadpool's other
 * threads stay free for the bodies' parsing, and at most that many large answers are held twice
 * (gathered and as JSON) at once. A job that cannot be queued builds on the loop. */
static void json_start(struct gateway *g)
{
    while (g->json_running < GATEWAY_JSON_JOBS && g->json_waiting != NULL) {
        struct json_job *j = g->json_waiting;
        g->json_waiting = j->next;
        if (g->json_waiting == NULL)
            g->json_waiting_tail = NULL;
        g->json_running++;
        if (g->closing) { /* nobody to answer: dropped unbuilt */
            after_json(&j->work, UV_ECANCELED);
            continue;
        }
        if (uv_queue_work(g->loop, &j->work, json_work, after_json) != 0) {
            json_work(&j->work);
            after_json(&j->work, 0);
        }
    }
}

static void after_json(uv_work_t *w, int status)
{
    struct json_job *j = w->data;
    struct greq *q = j->q;
    struct gateway *g = q->g;
    g->json_running--;
    if (status == 0 && !g->closing)    /* else cancelled, or the gateway is closing */
        respond_json(q, 200, j->json); /* NULL: out of memory, a 500 */
    else
        free(j->json);
    pagoda_async_result_free(j->res);
    free(j);
    json_start(g); /* before the reference goes: q keeps the gateway */
    greq_unref(q); /* the job's reference */
}

/* Answers q with 200 and the JSON of its whole answer (res NULL) or of its tokenize call's
 * result res (taken: *res set to NULL): built here when it is small, of bytes bytes (its text,
 * and GATEWAY_JSON_TOKEN_BYTES or GATEWAY_LOGPROB_BYTES a token), else on the threadpool, at
 * most GATEWAY_JSON_JOBS at once (json_start), so that one client's large answer (a 64 MiB one
 * with log-probabilities, n choices of long outputs, a long text's ids) does not stall the loop
 * and every other client with it. Nothing while the gateway closes. */
static void answer_json(struct greq *q, pagoda_async_result **res, size_t bytes)
{
    struct gateway *g = q->g;
    if (g->closing)
        return; /* every connection is being closed: nobody to answer */
    struct json_job *j = NULL;
    if (bytes > GATEWAY_JSON_INLINE_BYTES && (j = calloc(1, sizeof(*j))) != NULL) {
        j->q = q;
        j->work.data = j;
        j->res = res != NULL ? *res : NULL;
        if (res != NULL)
            *res = NULL;
        q->refs++; /* the job's */
        if (g->json_waiting_tail != NULL)
            g->json_waiting_tail->next = j;
        else
            g->json_waiting = j;
        g->json_waiting_tail = j;
        json_start(g);
        return;
    }
    respond_json(q, 200, res != NULL ? tokenized_json(q, *res) : whole_json(q));
}

/* The JSON of q's whole answer, every choice finished (any thread); a chat's tool calls parsed
 * out of each choice's text where the request asks. */
static char *whole_json(const struct greq *q)
{
    const bool tools = q->req.tool_parser != TOOL_CALL_PARSER_NONE;
    struct openai_out *outs = malloc(q->num_choices * sizeof(*outs));
    struct tool_calls_result *parsed = tools ? calloc(q->num_choices, sizeof(*parsed)) : NULL;
    char *json = NULL;
    if (outs == NULL || (tools && parsed == NULL))
        goto done;
    for (uint32_t i = 0; i < q->num_choices; i++) {
        const struct gchoice *c = &q->choices[i];
        struct openai_out *o = &outs[i];
        fill_out(c, &c->whole, o);
        o->text = c->whole.text;
        o->text_len = c->whole.text_len;
        o->token_ids = c->whole.token_ids;
        o->logprobs = q->req.params.logprobs ? c->whole.logprobs : NULL;
        o->token_text_ends = c->whole.token_text_ends;
        o->n = c->whole.num_tokens;
        o->with_usage = true;
        if (!tools)
            continue;
        struct tool_calls_result *t = &parsed[i];
        if (tool_calls_parse(q->req.tool_parser, o->text ? o->text : "", o->text_len, t) != 0)
            goto done;
        o->tools_parsed = true;
        o->tools_called = t->num_calls > 0;
        o->content = t->num_calls > 0 ? t->content : o->text; /* no calls: the text */
        o->content_len = t->num_calls > 0 ? t->content_len : o->text_len;
        o->tool_calls = t->calls;
        o->num_tool_calls = t->num_calls;
    }
    json = openai_response_json(outs, q->num_choices);
done:
    for (uint32_t i = 0; parsed != NULL && i < q->num_choices; i++)
        tool_calls_result_fini(&parsed[i]);
    free(parsed);
    free(outs);
    return json;
}

/* Every choice has finished: the whole answer. */
void gateway_answer_whole(struct greq *q)
{
    const size_t per_token = gateway_token_json_bytes(q);
    size_t bytes = 0;
    for (uint32_t i = 0; i < q->num_choices; i++)
        bytes += q->choices[i].whole.text_len + q->choices[i].whole.num_tokens * per_token +
                 GATEWAY_JSON_CHOICE_BYTES;
    answer_json(q, NULL, bytes);
}

/* The JSON of a /tokenize or /detokenize call's result (any thread). */
static char *tokenized_json(const struct greq *q, const pagoda_async_result *res)
{
    const pagoda_tokenized *t = &res->tokenized;
    return q->route == ROUTE_TOKENIZE
               ? openai_tokenize_json(t->token_ids, t->num_token_ids, t->max_model_len)
               : openai_detokenize_json(t->text, t->text_len);
}

/* /tokenize's or /detokenize's answer from the router (*res taken when its JSON is built on the
 * threadpool). */
void gateway_on_tokenized(struct greq *q, pagoda_async_result **res)
{
    if (q->http == NULL)
        return;
    if ((*res)->rc != 0) {
        gateway_respond_code(q, (*res)->rc, (*res)->detail);
        return;
    }
    const pagoda_tokenized *t = &(*res)->tokenized;
    q->finished = 1; /* answered: not a disconnect if the client goes now */
    answer_json(q, res, t->text_len + t->num_token_ids * GATEWAY_JSON_TOKEN_BYTES);
}

/* ---- the other routes ----------------------------------------------------------------------- */

void gateway_on_health(struct greq *q, pagoda_async_result *res)
{
    if (q->http == NULL)
        return; /* the client went away, or the gateway's own call (learn_router_limit) */
    if (q->route == ROUTE_MODELS) {
        /* The list whatever the router's health, its context if known, once the router has taken
         * the client's key: refused (401), or not checked for want of an answer (503), it is
         * answered as a generation's would be. */
        if (res->rc != 0)
            gateway_respond_code(q, res->rc, res->detail);
        else
            respond_json(
                q, 200,
                openai_models_json(q->g->cfg.model_name, q->g->started, res->max_model_len));
        return;
    }
    if (res->rc == 0 && res->healthy) {
        respond_json(q, 200, strdup("{\"status\":\"ok\"}"));
        return;
    }
    struct openai_error err;
    openai_error_from_code(PAGODA_ECLOSED, res->detail, &err);
    gateway_respond_error(q, &err);
}
