/* The gateway's private state, shared by its source files:
 *
 *   gateway.c          the loop: HTTP requests, calls to the router, a generation's choices
 *   gateway_answer.c   what is written to clients: responses, errors, streams, whole answers
 *   gateway_metrics.c  /metrics (Prometheus) and the latency figures it reports
 *   gateway_status.c   the status page (/ and /status)
 *   openai.c           OpenAI's JSON in and out (pure)
 *
 * Everything runs on the gateway's loop thread unless a comment says otherwise. */
#ifndef PAGODA_GATEWAY_GATEWAY_INTERNAL_H
#define PAGODA_GATEWAY_GATEWAY_INTERNAL_H

#include "client/pagoda_async.h"
#include "gateway/gateway.h"
#include "gateway/openai.h"
#include "metrics/metrics.h"

#include <pthread.h>
#include <stdint.h>
#include <uv.h>

enum route {
    ROUTE_COMPLETION,
    ROUTE_CHAT,
    ROUTE_TOKENIZE,
    ROUTE_DETOKENIZE,
    ROUTE_HEALTH,
    ROUTE_METRICS,
    ROUTE_MODELS
};

enum call_kind {
    CALL_KIND_SUBMIT,
    CALL_KIND_POLL,
    CALL_KIND_CANCEL,
    CALL_KIND_HEALTH,
    CALL_KIND_STATS,
    CALL_KIND_TENANTS,
    CALL_KIND_TOKENIZE,
    CALL_KIND_PROMPT_IDS /* the ids of a text prompt of several choices, tokenized once */
};

/* Answers (whole ones, /tokenize's) whose text and tokens, at GATEWAY_JSON_TOKEN_BYTES a token,
 * pass GATEWAY_JSON_INLINE_BYTES have their JSON built on the threadpool (gateway_answer.c
 * answer_json), smaller ones on the loop: the loop never spends long on one client. */
#define GATEWAY_JSON_INLINE_BYTES (64u << 10)
#define GATEWAY_JSON_TOKEN_BYTES 12u
/* With log-probabilities: about what a token's JSON costs to build (a chat's, in jansson's
 * objects), for the same threshold and for the answer's cap (gateway.c). */
#define GATEWAY_LOGPROB_BYTES 256u
/* The gateway's Tokenize calls in flight at once for text prompts of several choices each, all
 * requests together (gateway.c start_choices): a quarter of the 32 the router lets one tenant
 * have waiting, so that clients' own /tokenize calls keep the rest. */
#define GATEWAY_PROMPT_IDS_CALLS 8u
/* JSON jobs on the threadpool at once (more wait their turn). */
#define GATEWAY_JSON_JOBS 2u

/* One choice of a generation (OpenAI's n, for each of a completion's prompts): a request of its
 * own to the router. Its calls hold
 * references on the HTTP request it belongs to (greq). */
struct gchoice {
    struct greq *q;
    uint32_t index;        /* OpenAI's: prompt * n + draw */
    uint32_t prompt, draw; /* its prompt (openai_prompt), and which of that prompt's n it is */
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    int submitted, finished, cancel_sent;
    int first_chunk_sent; /* a stream's: a completion's first piece, a chat's role chunk */
    int submit_in_flight, cancel_answered; /* what an ending request waits for (gateway.c settle) */
    /* A stream of several prompts: the choice's first answer came (answered), and is held until
     * every choice's has (gateway.c stream_hold). */
    int answered;
    pagoda_async_result *held;
    uint32_t offset; /* output tokens received */
    /* A whole answer being gathered (pagoda_result_append): its tokens, log-probabilities,
     * text and the tokens' text ends; at its finish, the finish, stop and usage fields too. */
    pagoda_result whole;
    /* A stream: the characters (code points) of text sent so far, for completions' text_offset. */
    uint64_t chars_sent;
    /* A stream of a chat parsed for tool calls (openai_request.tool_parser): its parser, made
     * with its first piece. */
    struct tool_calls_stream *tools;
    /* Times for the latency figures (CLOCK_MONOTONIC, ns). */
    uint64_t t_first_ns, t_last_ns;
    /* A poll or Cancel the router answered EBUSY, to be made again at retry_due (uv_now) on
     * gateway.retry_head (gateway.c retry_later); retry_ms is the pause, doubling. */
    struct gchoice *retry_next;
    int retry_waiting, retry_cancel;
    uint32_t retry_ms;
    uint64_t retry_due;
};

/* One HTTP request in progress. Alive while refs > 0: the HTTP side (until answered or the
 * client went away), the parse job, and each call to the router outstanding. */
struct greq {
    struct gateway *g;
    struct http_request *http; /* NULL once answered or gone */
    enum route route;
    int refs;
    uint32_t generation; /* its count in gateway.num_generations: 0, or its choices */
    char *api_key;
    char *body;
    size_t body_len;
    size_t body_bytes; /* body_len, kept once the body is parsed and freed */
    uv_work_t work;
    int parse_rc;
    struct openai_request req;
    struct openai_error err;
    char id_str[64];
    long long created;
    /* finished: every choice has (or the request was answered: a refusal, /tokenize) */
    int finished, streaming;
    /* An error ends it: answered with failure once its choices are let go (gateway.c settle). */
    enum { FAILING_NO, FAILING_WAITS, FAILING_ANSWERED } failing;
    struct openai_error failure;
    /* A generation's choices (openai_request.n of each prompt) and how many have finished. */
    struct gchoice *choices;
    uint32_t num_choices, num_finished;
    /* A whole answer: the text bytes and tokens its choices have gathered. */
    size_t gathered_text, gathered_tokens;
    uint32_t num_answered; /* choices whose first answer came (stream_hold) */
    /* Text prompts of several choices each, tokenized once (gateway.c start_choices): prompts
     * taken in turn (a Tokenize call started, or its choices sent with its text), the calls in
     * flight, and prompts whose choices were sent. */
    uint32_t prompts_asked, ids_in_flight, prompts_submitted;
    /* Times for the latency figures (CLOCK_MONOTONIC, ns). */
    uint64_t t_start_ns;
    /* /metrics: the router's Stats, kept while its tenants are asked for. */
    pagoda_async_result *stats_res;
    struct greq *prev, *next; /* gateway.live */
};

/* A call's result on its way from NNG's thread to the loop. */
struct gmail {
    struct greq *q;
    struct gchoice *c; /* a generation's call (submit, poll, cancel): its choice; else NULL */
    pagoda_async_result *res;
    enum call_kind kind;
    struct gmail *next;
};

/* What /metrics reports of the gateway's own traffic (gateway_metrics.c). */
struct gateway_figures {
    struct metrics_hist ttft, tpot, itl, e2e;
    uint64_t prompt_tokens, generation_tokens, cached_tokens;
    uint64_t finished[5]; /* by pagoda_finish_reason */
    uint64_t disconnects; /* clients gone before their answer was complete */
    uint64_t errors_4xx, errors_5xx;
};

struct gateway {
    uv_loop_t *loop;
    struct gateway_config cfg;
    char *model_name, *router_url, *stats_key;
    struct http_server *http;
    pagoda_client *client;
    uv_async_t async;
    uv_timer_t retry_timer;     /* the calls to make again (gateway.c retry_later) */
    struct gchoice *retry_head; /* each holds a reference on its request */
    pthread_mutex_t lock;
    struct gmail *mail_head, *mail_tail; /* guarded by lock */
    uint64_t calls_lost;                 /* guarded by lock: results lost for want of memory */
    uint64_t calls_outstanding;
    uint32_t prompt_ids_calls; /* Tokenize calls for prompts of several choices (at most
                                * GATEWAY_PROMPT_IDS_CALLS) */
    struct greq *live;
    uint32_t num_generations;
    /* Large answers' JSON jobs (gateway_answer.c answer_json): running, and waiting their turn. */
    uint32_t json_running;
    struct json_job *json_waiting, *json_waiting_tail;
    size_t parse_bytes; /* bodies taken and not yet parsed (cfg.http.max_body_memory) */
    uint32_t serial;
    long long started;
    int closing, freeing;
    struct gateway_figures fig;
};

/* ---- gateway.c --------------------------------------------------------------------------- */

/* Drops a reference on q (the HTTP side's, a job's, a call's): q is freed with its last, and the
 * gateway then too where it is closing and nothing else is left (gateway_maybe_free). */
void greq_unref(struct greq *q);
/* Counts a call that started (rc 0) against q and the gateway; returns rc. */
int gateway_call_started(struct greq *q, int rc);
/* The NNG-thread callbacks of the Stats and admin tenants calls made for /metrics. */
void gateway_on_stats_call(void *user, pagoda_async_result *res);
void gateway_on_tenants_call(void *user, pagoda_async_result *res);
/* Frees the gateway once it is closing and nothing is left in progress. */
void gateway_maybe_free(struct gateway *g);

/* ---- gateway_metrics.c ------------------------------------------------------------------- */

int gateway_metrics_init(struct gateway *g);
void gateway_metrics_fini(struct gateway *g);
/* n tokens of choice c arrived at t_ns. */
void gateway_metrics_tokens(struct gateway *g, struct gchoice *c, size_t n, uint64_t t_ns);
/* Choice c's request ended with r (its finish and usage) at t_ns. */
void gateway_metrics_finish(struct gateway *g, struct gchoice *c, const pagoda_result *r,
                            uint64_t t_ns);
void gateway_metrics_error(struct gateway *g, int status);
void gateway_metrics_disconnect(struct gateway *g, struct greq *q);
/* The router's Stats for a /metrics call arrived (or failed): renders and answers q, or, with a
 * --stats-key, first asks the router's tenants (taking *res into q, *res set to NULL). */
void gateway_metrics_answer(struct greq *q, pagoda_async_result **res);
/* The tenants for q's /metrics arrived (or failed: the page goes without them): answers q. */
void gateway_metrics_tenants(struct greq *q, pagoda_async_result *res);

/* ---- gateway_answer.c -------------------------------------------------------------------- */

/* Answers a request with a JSON body (taken and freed; NULL: out of memory, a 500) and ends its
 * HTTP side. Nothing once q is answered or its client gone. */
void gateway_respond_json(struct greq *q, int status, char *json);
/* The same with a body of any type (the caller's). */
void gateway_respond_text(struct greq *q, int status, const char *content_type, const char *body,
                          size_t len);
/* An answer of no request of ours: on a failure other than a closed connection, the connection
 * is closed (it would wait unanswered). */
void gateway_respond_plain(struct http_request *http, int status, const char *content_type,
                           const void *body, size_t len, const char *const *headers,
                           size_t num_headers);
/* The same with err's JSON (OpenAI's error shape), counted in pagoda_http_errors_total
 * (gateway_metrics_error) as every error answer of the gateway is. */
void gateway_respond_plain_error(struct gateway *g, struct http_request *http,
                                 const struct openai_error *err, const char *const *headers,
                                 size_t num_headers);
/* After a call that ends q's response, or a write on the way to it, with its result rc: the
 * HTTP side is done (its reference dropped) when rc is 0; a failure other than a closed
 * connection closes the connection, whose close callback drops it. q may be freed after this. */
void gateway_http_end(struct greq *q, int rc);
/* The extra headers of a response of this status (Retry-After: 1 for 429 and 503), in static
 * storage, and their number in *n (0: NULL). */
const char *const *gateway_retry_headers(int status, size_t *n);
/* Answers q with err (counted in the gateway's errors): a JSON error, or a streaming answer's
 * last event and its end. Nothing once q is answered or its client gone. */
void gateway_respond_error(struct greq *q, const struct openai_error *err);
/* The same with the error of a libpagoda code and its detail. */
void gateway_respond_code(struct greq *q, int code, const char *detail);
/* Opens q's stream: its status line (200, text/event-stream) and, for a chat, each choice's first
 * chunk, its role alone (delta {"role": "assistant", "content": ""}), in index order, before any
 * content, as OpenAI and vLLM send them. q->streaming is set once the status line is out. Returns
 * 0 or the failing call's code (for gateway_http_end). */
int gateway_stream_open(struct greq *q);
/* Writes result r of choice c to q's open stream: a chunk (none where r completed no text and is
 * neither the choice's first nor its finish nor asked-for log-probabilities; a chat parsed for
 * tool calls shows the content and the calls its parser gives, c->tools), and after the last
 * choice's finish the usage (when asked for) and the end. A failed write ends the HTTP side
 * (gateway_http_end). */
void gateway_stream_piece(struct gchoice *c, const pagoda_result *r);
/* What a token of q's answer counts in its JSON's size: GATEWAY_JSON_TOKEN_BYTES, or
 * GATEWAY_LOGPROB_BYTES with log-probabilities. */
size_t gateway_token_json_bytes(const struct greq *q);
/* Every choice of q has finished: answers its whole answer (a chat's tool calls parsed out of
 * each choice's text where the request asks), its JSON built on the loop when it is small, else
 * on the threadpool. */
void gateway_answer_whole(struct greq *q);
/* A /tokenize or /detokenize call's result: answers q (*res taken, set to NULL, where its JSON
 * is built on the threadpool). */
void gateway_on_tokenized(struct greq *q, pagoda_async_result **res);
/* A health call's result: answers q's /health or /v1/models (nothing for the gateway's own). */
void gateway_on_health(struct greq *q, pagoda_async_result *res);

/* ---- gateway_status.c -------------------------------------------------------------------- */

/* Serves the status page: one HTML page whose script polls /metrics. */
void gateway_status_page(struct http_request *http);

#endif
