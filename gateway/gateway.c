/* The gateway's loop: HTTP requests in, libpagoda's asynchronous calls out, their results back
 * through a mailbox (NNG's threads hand them over with uv_async_send), gathered and handed to
 * gateway_answer.c, which writes the responses and stream chunks. One struct greq per HTTP
 * request, freed when nothing refers to it any more: the HTTP side until it is answered or the
 * client went away, the parse job, and every call to the router still outstanding. */
#include "gateway/gateway.h"
#include "gateway/gateway_internal.h"

#include "client/pagoda_async.h"
#include "common/error.h"
#include "common/log.h"
#include "common/version.h"
#include "gateway/openai.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* The most bytes of text and tokens a non-streamed answer gathers (a larger one ends with an
 * error): max_tokens bounds it first in practice. A request of several choices (n) is refused
 * at once where n x max_tokens tokens, at GATEWAY_JSON_TOKEN_BYTES each (GATEWAY_LOGPROB_BYTES
 * with log-probabilities, what their JSON costs to build), would pass it: it would end with this
 * error after its work. */
#define GATEWAY_MAX_ANSWER_BYTES (64u << 20)
/* The most bytes of Submits one request's choices send together: n copies of its prompts, and
 * each choice's parameters (choices_refused). */
#define GATEWAY_MAX_CHOICES_BYTES (64u << 20)

void gateway_config_default(struct gateway_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    http_config_default(&cfg->http);
    cfg->model_name = "pagoda";
    cfg->max_requests = GATEWAY_DEFAULT_MAX_REQUESTS;
    cfg->default_max_tokens = GATEWAY_DEFAULT_MAX_TOKENS;
    cfg->poll_wait_ms = GATEWAY_DEFAULT_POLL_WAIT_MS;
    cfg->router_timeout_ms = GATEWAY_DEFAULT_ROUTER_TIMEOUT_MS;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- lifetime --------------------------------------------------------------------------- */

/* A parsed body's tree (jansson: one allocation a value, about twenty bytes of tree a byte of
 * body) takes millions of free() calls for a body of megabytes of token ids, about 0.1 s on the
 * loop: a tree from a body of at least this many bytes is freed on libuv's threadpool. */
#define GATEWAY_FREE_OFF_LOOP_BYTES (64u << 10)

struct tree_job {
    uv_work_t work;
    json_t *root;
};

static void tree_free_work(uv_work_t *w)
{
    struct tree_job *j = w->data;
    json_decref(j->root);
}

static void after_tree_free(uv_work_t *w, int status)
{
    (void)status;
    free(w->data);
}

/* Releases q's prompts (openai_request_release_prompt), the parsed tree of a large body on the
 * threadpool. */
static void release_prompt(struct greq *q)
{
    struct tree_job *j;
    if (q->req.root != NULL && q->body_bytes >= GATEWAY_FREE_OFF_LOOP_BYTES && !q->g->closing &&
        (j = malloc(sizeof(*j))) != NULL) {
        j->root = q->req.root;
        j->work.data = j;
        if (uv_queue_work(q->g->loop, &j->work, tree_free_work, after_tree_free) == 0)
            q->req.root = NULL;
        else
            free(j);
    }
    openai_request_release_prompt(&q->req);
}

void greq_unref(struct greq *q)
{
    if (--q->refs > 0)
        return;
    struct gateway *g = q->g;
    if (q->prev)
        q->prev->next = q->next;
    else
        g->live = q->next;
    if (q->next)
        q->next->prev = q->prev;
    g->num_generations -= q->generation;
    release_prompt(q);
    openai_request_fini(&q->req);
    pagoda_async_result_free(q->stats_res);
    free(q->body);
    free(q->api_key);
    for (uint32_t i = 0; i < q->num_choices; i++) {
        pagoda_result_free(&q->choices[i].whole);
        tool_calls_stream_free(q->choices[i].tools);
        pagoda_async_result_free(q->choices[i].held);
    }
    free(q->choices);
    free(q);
    gateway_maybe_free(g);
}

/* ---- calls to the router ------------------------------------------------------------------ */

/* NNG thread: a call reported. Hands it to the loop with what it was (c: a generation's call,
 * its choice). */
static void mail(struct greq *q, struct gchoice *c, pagoda_async_result *res, enum call_kind kind)
{
    struct gateway *g = q->g;
    struct gmail *m = calloc(1, sizeof(*m));
    pthread_mutex_lock(&g->lock);
    if (m != NULL && res != NULL) {
        m->q = q;
        m->c = c;
        m->res = res;
        m->kind = kind;
        if (g->mail_tail)
            g->mail_tail->next = m;
        else
            g->mail_head = m;
        g->mail_tail = m;
    } else {
        /* Out of memory: the result is lost; q keeps the call's reference and is leaked rather
         * than freed under the loop, and the gateway stays open (counted, logged). */
        free(m);
        pagoda_async_result_free(res);
        g->calls_lost++;
    }
    pthread_mutex_unlock(&g->lock);
    uv_async_send(&g->async);
}

static void on_submit_call(void *user, pagoda_async_result *res)
{
    struct gchoice *c = user;
    mail(c->q, c, res, CALL_KIND_SUBMIT);
}

static void on_poll_call(void *user, pagoda_async_result *res)
{
    struct gchoice *c = user;
    mail(c->q, c, res, CALL_KIND_POLL);
}

static void on_cancel_call(void *user, pagoda_async_result *res)
{
    struct gchoice *c = user;
    mail(c->q, c, res, CALL_KIND_CANCEL);
}

static void on_tokenize_call(void *user, pagoda_async_result *res)
{
    mail(user, NULL, res, CALL_KIND_TOKENIZE);
}

static void on_prompt_ids_call(void *user, pagoda_async_result *res)
{
    struct gchoice *c = user;
    mail(c->q, c, res, CALL_KIND_PROMPT_IDS);
}

static void on_health_call(void *user, pagoda_async_result *res)
{
    mail(user, NULL, res, CALL_KIND_HEALTH);
}

void gateway_on_stats_call(void *user, pagoda_async_result *res)
{
    mail(user, NULL, res, CALL_KIND_STATS);
}

void gateway_on_tenants_call(void *user, pagoda_async_result *res)
{
    mail(user, NULL, res, CALL_KIND_TENANTS);
}

int gateway_call_started(struct greq *q, int rc)
{
    if (rc == 0) {
        q->refs++;
        q->g->calls_outstanding++;
    }
    return rc;
}

/* Sends choice c's Cancel (send_cancel, or again: retry_later). */
static void cancel_call(struct gchoice *c)
{
    struct greq *q = c->q;
    if (gateway_call_started(
            q, pagoda_cancel_async(q->g->client, q->api_key, c->id, on_cancel_call, c)) != 0) {
        log_warn("could not cancel a request whose client went away: %s", pagoda_error_detail());
        c->cancel_answered = 1; /* nothing to wait for (settle) */
    }
}

static void send_cancel(struct gchoice *c)
{
    if (!c->submitted || c->finished || c->cancel_sent)
        return;
    c->cancel_sent = 1;
    cancel_call(c);
}

/* The client went away, or its answer ended early (an error): every choice still running is
 * cancelled (those not yet submitted, once they are: on_submitted). */
static void cancel_all(struct greq *q)
{
    for (uint32_t i = 0; i < q->num_choices; i++)
        send_cancel(&q->choices[i]);
}

/* Whether q's choices go on: its client is there and no error ends it (fail). */
static int answering(const struct greq *q)
{
    return q->http != NULL && !q->failing;
}

/* Answers q with its failure (nothing, should the client be gone: a disconnect then). */
static void answer_failure(struct greq *q)
{
    q->failing = FAILING_ANSWERED;
    if (q->http != NULL)
        q->finished = 1; /* answered (an error): not a disconnect should the client go now */
    gateway_respond_error(q, &q->failure);
}

/* An ending q (fail) is answered once the router has let go of its choices: no Submit in flight,
 * and each Cancel answered, so that a client that sends its next request on the error finds its
 * tenant's places free (a 429 for choice 2 of 4 while choice 1 still held the tenant's place
 * refused the client's retry too). A Cancel that fails (the router gone) settles as well. A
 * request of one choice waits too (one Cancel's round trip), as its place is the tenant's as much.
 * A text Submit in flight may wait its turn for the router's tokenizer: the error waits with it, at
 * most the router's timeout. */
static void settle(struct greq *q)
{
    if (q->failing != FAILING_WAITS)
        return;
    for (uint32_t i = 0; i < q->num_choices; i++) {
        const struct gchoice *c = &q->choices[i];
        if (c->submit_in_flight || (c->cancel_sent && !c->cancel_answered))
            return;
    }
    answer_failure(q);
}

/* Ends q with err: every choice still running is cancelled, and the first error is the answer once
 * they are (settle), or at once where the router could not be reached (wait 0: its Cancels would
 * wait as long); the others find it taken. */
static void fail_with(struct greq *q, const struct openai_error *err, int wait)
{
    if (answering(q)) {
        q->failure = *err;
        q->failing = FAILING_WAITS;
    }
    cancel_all(q);
    if (!wait && q->failing == FAILING_WAITS)
        answer_failure(q);
    settle(q);
}

/* Ends q with the error of a libpagoda code (fail_with). */
static void fail(struct greq *q, int code, const char *detail)
{
    struct openai_error err;
    openai_error_from_code(code, detail, &err);
    fail_with(q, &err, code != PAGODA_ETIMEDOUT && code != PAGODA_EIO && code != PAGODA_ECLOSED);
}

static void poll_next(struct gchoice *c)
{
    struct greq *q = c->q;
    int rc = gateway_call_started(q, pagoda_poll_async(q->g->client, q->api_key, c->id, c->offset,
                                                       q->g->cfg.poll_wait_ms, on_poll_call, c));
    if (rc != 0)
        fail(q, rc, pagoda_error_detail());
}

/* ---- calls the router asks to make again ------------------------------------------------- */

static void on_retry_timer(uv_timer_t *t);

/* The first pause before a call is made again, and the longest (it doubles in between). */
#define RETRY_FIRST_MS 20u
#define RETRY_MAX_MS 320u

/* The router answered c's poll (cancel 0) or Cancel (1) with PAGODA_EBUSY: a restarted router
 * whose places for calls naming ids it has not learned yet are taken (router_registry.c
 * park_unknown), or whose parked calls are at their limit. The call is made again after a pause,
 * as libpagoda's generate does; until then c holds a reference on its request. A router answers
 * so for at most ANNOUNCE_WAIT_MS (20 s) after its start (router_registry.c), so an ending request
 * whose Cancel is retried may wait that long for its error answer; a closing gateway does not
 * retry Cancels (the router cancels requests nobody polls). Before, the
 * gateway ended the request: across a router restart, 72 of 200 streams of one tenant ended with
 * a 429 mid-stream (the tenant's 128 places), and a Cancel answered EBUSY was lost (its request
 * ran on until the router abandoned it). */
static void retry_later(struct gchoice *c, int cancel)
{
    struct gateway *g = c->q->g;
    if (c->retry_waiting) {
        /* a poll waits its turn, and the request is ending meanwhile: its Cancel takes the turn */
        c->retry_cancel |= cancel;
        return;
    }
    c->retry_ms = c->retry_ms == 0 ? RETRY_FIRST_MS : 2 * c->retry_ms;
    if (c->retry_ms > RETRY_MAX_MS)
        c->retry_ms = RETRY_MAX_MS;
    c->retry_waiting = 1;
    c->retry_cancel = cancel;
    c->retry_due = uv_now(g->loop) + c->retry_ms;
    c->q->refs++;
    c->retry_next = g->retry_head;
    g->retry_head = c;
    if (!uv_is_active((uv_handle_t *)&g->retry_timer) ||
        uv_timer_get_due_in(&g->retry_timer) > c->retry_ms)
        uv_timer_start(&g->retry_timer, on_retry_timer, c->retry_ms, 0);
}

/* The calls whose pause is over are made again (a poll only while its request is answered and
 * the gateway open: otherwise its Cancel is out); the timer waits for the next one. */
static void on_retry_timer(uv_timer_t *t)
{
    struct gateway *g = t->data;
    uint64_t now = uv_now(g->loop), next = UINT64_MAX;
    struct gchoice *due = NULL, **pp = &g->retry_head;
    while (*pp != NULL) {
        struct gchoice *c = *pp;
        if (c->retry_due <= now) {
            *pp = c->retry_next;
            c->retry_next = due;
            due = c;
        } else {
            next = c->retry_due < next ? c->retry_due : next;
            pp = &c->retry_next;
        }
    }
    if (next != UINT64_MAX)
        uv_timer_start(&g->retry_timer, on_retry_timer, next - now, 0);
    while (due != NULL) {
        struct gchoice *c = due;
        struct greq *q = c->q;
        due = c->retry_next;
        c->retry_next = NULL;
        c->retry_waiting = 0;
        if (c->retry_cancel) {
            cancel_call(c);
            settle(q); /* (a Cancel that could not be sent counts as answered) */
        } else if (answering(q) && !g->closing)
            poll_next(c);
        greq_unref(q); /* the pause's reference */
    }
    gateway_maybe_free(g);
}

/* ---- a generation ------------------------------------------------------------------------ */

static void on_poll_result(struct gchoice *c, pagoda_async_result *res);

/* Keeps what a choice's finish says (its reason, stop and usage) for the answer's end: the
 * stream's usage chunk, a whole answer's choice. */
static int keep_finish(struct gchoice *c, const pagoda_result *r)
{
    pagoda_result *w = &c->whole;
    w->finish_reason = r->finish_reason;
    w->prompt_tokens = r->prompt_tokens;
    w->completion_tokens = r->completion_tokens;
    w->cached_tokens = r->cached_tokens;
    w->has_stop_token_id = r->has_stop_token_id;
    w->stop_token_id = r->stop_token_id;
    if (r->stop_string != NULL && (w->stop_string = strdup(r->stop_string)) == NULL)
        return PAGODA_ENOMEM;
    return 0;
}

/* Gathers a piece of choice c for a whole answer, at most GATEWAY_MAX_ANSWER_BYTES of text and
 * GATEWAY_JSON_TOKEN_BYTES a token over all the choices. */
static int gather(struct gchoice *c, const pagoda_result *r)
{
    struct greq *q = c->q;
    size_t text = q->gathered_text + r->text_len, n = q->gathered_tokens + r->num_tokens;
    if (text + n * GATEWAY_JSON_TOKEN_BYTES > GATEWAY_MAX_ANSWER_BYTES)
        return pagoda_error_set(PAGODA_ERANGE, "the answer is larger than %u bytes",
                                GATEWAY_MAX_ANSWER_BYTES);
    int rc = pagoda_result_append(&c->whole, r, q->req.params.logprobs);
    if (rc == 0) {
        q->gathered_text = text;
        q->gathered_tokens = n;
    }
    return rc;
}

/* A stream of several prompts opens once every choice has had its first answer, the earlier ones
 * held (taken from *res) until then: a prompt the router refuses only once it has tokenized it
 * (too long) then still gets its 4xx as a whole answer, as vLLM checks every prompt before it
 * opens a stream. Returns whether *res was held. */
static int stream_hold(struct gchoice *c, pagoda_async_result **res)
{
    struct greq *q = c->q;
    if (!q->req.stream || q->streaming || q->req.num_prompts < 2)
        return 0;
    const pagoda_result *r = &(*res)->result;
    if (r->finish_reason == PAGODA_FINISH_ERROR && c->offset == 0 && r->num_tokens == 0)
        return 0; /* a refusal answers at once */
    if (!c->answered) {
        c->answered = 1;
        q->num_answered++;
    }
    if (q->num_answered == q->num_choices)
        return 0;
    c->held = *res;
    *res = NULL;
    return 1;
}

static void on_poll(struct gchoice *c, pagoda_async_result **resp)
{
    struct greq *q = c->q;
    if (!answering(q))
        return; /* the client went away, or the answer ended: the cancels are out */
    if ((*resp)->rc == PAGODA_EBUSY) {
        retry_later(c, 0);
        return;
    }
    if ((*resp)->rc != 0) {
        fail(q, (*resp)->rc, (*resp)->detail);
        return;
    }
    c->retry_ms = 0;
    if (stream_hold(c, resp))
        return;
    const int release = q->req.stream && !q->streaming && q->req.num_prompts > 1;
    on_poll_result(c, *resp);
    /* the last first answer opened the stream: the held ones follow */
    for (uint32_t i = 0; release && i < q->num_choices && answering(q); i++) {
        pagoda_async_result *h = q->choices[i].held;
        if (h != NULL) {
            q->choices[i].held = NULL;
            on_poll(&q->choices[i], &h);
            pagoda_async_result_free(h);
        }
    }
}

static void on_poll_result(struct gchoice *c, pagoda_async_result *res)
{
    struct greq *q = c->q;
    pagoda_result *r = &res->result;
    uint64_t t = now_ns();
    if (r->num_tokens > 0) {
        gateway_metrics_tokens(q->g, c, r->num_tokens, t);
        c->offset += (uint32_t)r->num_tokens;
    }
    if (r->finish_reason == PAGODA_FINISH_ERROR && c->offset == 0) {
        /* Refused before any output (a template error, bad text): the client's request. */
        struct openai_error err;
        openai_error_from_code(PAGODA_EINVAL, r->error_message, &err);
        c->finished = 1; /* counted as a 4xx, not as a finished request */
        fail_with(q, &err, 1);
        return;
    }
    if (r->finish_reason != PAGODA_FINISH_NONE) {
        c->finished = 1;
        gateway_metrics_finish(q->g, c, r, t);
        int rc = keep_finish(c, r);
        if (rc != 0) {
            fail(q, rc, "out of memory");
            return;
        }
        q->finished = ++q->num_finished == q->num_choices;
    }
    if (q->req.stream && !q->streaming) {
        /* A stream's status line waits for the first poll's answer, so that a prompt the router
         * refuses (too long, a token outside the vocabulary, a chat its template rejects) gets
         * its 4xx as a whole answer above, as vLLM checks a prompt before it opens the stream. */
        int rc = gateway_stream_open(q);
        if (rc != 0) {
            cancel_all(q);
            gateway_http_end(q, rc);
            return;
        }
    }
    if (q->streaming) {
        gateway_stream_piece(c, r);
    } else {
        int rc = gather(c, r);
        if (rc != 0) {
            fail(q, rc, pagoda_error_detail());
            return;
        }
        if (q->finished)
            gateway_answer_whole(q);
    }
    if (r->finish_reason == PAGODA_FINISH_NONE && answering(q))
        poll_next(c);
}

static void on_submitted(struct gchoice *c, pagoda_async_result *res)
{
    struct greq *q = c->q;
    c->submit_in_flight = 0;
    if (res->rc != 0) {
        /* Without an answer the router may have taken it: cancelled with the others, by its id
         * (a cancel of an id the router does not have changes nothing). */
        if (res->rc == PAGODA_ETIMEDOUT || res->rc == PAGODA_EIO || res->rc == PAGODA_ECLOSED)
            c->submitted = 1;
        if (res->rc == PAGODA_EEXHAUSTED && q->num_choices > 1) {
            /* the request's own choices may be what fills its tenant: say so (whether another
             * of them is admitted yet is the replies' order, not known here) */
            char detail[sizeof(res->detail) + 256];
            snprintf(detail, sizeof(detail),
                     "%s (choice %u of %u: a request's own choices count against its tenant's "
                     "limits, and one of more choices than they hold at once is refused unless "
                     "its first choices end before its last are sent)",
                     res->detail, (unsigned)c->index, (unsigned)q->num_choices);
            fail(q, res->rc, detail);
            return;
        }
        fail(q, res->rc, res->detail); /* the first refusal answers; the others find it gone */
        return;
    }
    c->submitted = 1;
    if (!answering(q)) {
        send_cancel(c); /* the client left, or the answer ended, while it was submitted */
        settle(q);
        return;
    }
    poll_next(c);
}

/* The choices q asks for: n of each prompt. */
static uint32_t choices_asked(const struct greq *q)
{
    return q->req.n * q->req.num_prompts;
}

/* Submits choice c of q: prompt p's choice j (index p * n + j) with seed + j when the request
 * gives a seed, with ids where given (its prompt tokenized once), else its own prompt. */
static void submit_one(struct greq *q, struct gchoice *c, const pagoda_prompt *ids)
{
    pagoda_generate_params params = q->req.params;
    if (params.has_seed)
        params.seed += c->draw;
    const pagoda_prompt *p = ids != NULL ? ids : openai_prompt(&q->req, c->prompt);
    int rc = gateway_call_started(
        q, pagoda_submit_async(q->g->client, q->api_key, &params, p, c->id, on_submit_call, c));
    if (rc != 0)
        fail(q, rc, pagoda_error_detail());
    else
        c->submit_in_flight = 1;
}

/* Makes q's choices (n of each prompt, none submitted yet). Returns 0, or answers q (out of
 * memory) and returns -1. */
static int make_choices(struct greq *q)
{
    const uint32_t total = choices_asked(q);
    q->choices = calloc(total, sizeof(*q->choices));
    if (q->choices == NULL) {
        release_prompt(q);
        gateway_respond_code(q, PAGODA_ENOMEM, "out of memory");
        return -1;
    }
    q->num_choices = total;
    for (uint32_t i = 0; i < q->num_choices; i++) {
        struct gchoice *c = &q->choices[i];
        c->q = q;
        c->index = i;
        c->prompt = i / q->req.n;
        c->draw = i % q->req.n;
    }
    return 0;
}

/* Submits prompt p's n choices, with ids where given (p tokenized once), else the prompt. Once
 * every prompt's are, the prompts are released (serialised by the calls: a long generation keeps
 * none of them). */
static void submit_prompt(struct greq *q, uint32_t p, const pagoda_prompt *ids)
{
    for (uint32_t j = 0; j < q->req.n && answering(q); j++)
        submit_one(q, &q->choices[p * q->req.n + j], ids);
    if (++q->prompts_submitted == q->req.num_prompts)
        release_prompt(q);
}

/* Takes q's text prompts in turn: each gets a Tokenize call while the gateway has fewer than
 * GATEWAY_PROMPT_IDS_CALLS in flight (the call's user is the prompt's first choice); when it has
 * that many, q waits for its own calls to come back, or, with none in flight, sends the prompt's
 * choices with its text, as they were sent before the gateway tokenized prompts once (no wait
 * for other requests' calls). */
static void tokenize_prompts(struct greq *q)
{
    struct gateway *g = q->g;
    while (q->prompts_asked < q->req.num_prompts && answering(q)) {
        const uint32_t p = q->prompts_asked;
        if (g->prompt_ids_calls >= GATEWAY_PROMPT_IDS_CALLS) {
            if (q->ids_in_flight > 0)
                return; /* on_prompt_ids goes on */
            q->prompts_asked++;
            submit_prompt(q, p, NULL);
            continue;
        }
        struct gchoice *c = &q->choices[p * q->req.n];
        int rc = gateway_call_started(q, pagoda_tokenize_async(g->client, q->api_key,
                                                               openai_prompt(&q->req, p),
                                                               on_prompt_ids_call, c));
        if (rc != 0) {
            fail(q, rc, pagoda_error_detail());
            return;
        }
        q->prompts_asked++;
        q->ids_in_flight++;
        g->prompt_ids_calls++;
    }
}

/* The text or chat prompts of a request of several choices each are tokenized once a prompt (the
 * router's Tokenize call: the ids its Submit would have, with the same defaults), then each of
 * the prompt's choices submits the ids as they arrive: the router renders and tokenizes each
 * prompt once, not once a choice (n of one tenant's text jobs). The gateway keeps at most
 * GATEWAY_PROMPT_IDS_CALLS such calls in flight (tokenize_prompts). Where a prompt's Tokenize
 * call fails, its choices submit the prompt as it came, so that they meet exactly the refusals
 * and waits a Submit of its text would (a Tokenize call is refused where too many of the
 * tenant's wait, PAGODA_EBUSY, where a text Submit waits its turn; its errors carry other codes
 * than a Submit's refusal of the same prompt). One choice of each prompt, or prompts given as
 * ids, submit at once. */
static void start_choices(struct greq *q)
{
    if (make_choices(q) != 0)
        return;
    if (q->req.n == 1 || q->req.prompt.num_token_ids > 0) {
        for (uint32_t p = 0; p < q->req.num_prompts; p++)
            submit_prompt(q, p, NULL);
        return;
    }
    tokenize_prompts(q);
}

/* The ids of prompt c->prompt (its first choice c: start_choices) arrived, or its tokenization
 * failed. */
static void on_prompt_ids(struct gchoice *c, pagoda_async_result *res)
{
    struct greq *q = c->q;
    q->ids_in_flight--;
    q->g->prompt_ids_calls--;
    if (!answering(q) || q->g->closing)
        return; /* the prompts go with the request (openai_request_fini) */
    if (res->rc != 0 || res->tokenized.num_token_ids == 0) {
        submit_prompt(q, c->prompt, NULL);
    } else {
        pagoda_prompt ids = pagoda_prompt_default();
        ids.token_ids = res->tokenized.token_ids;
        ids.num_token_ids = res->tokenized.num_token_ids;
        submit_prompt(q, c->prompt, &ids); /* serialised by the calls: res may go */
    }
    tokenize_prompts(q);
}

/* About the bytes of a Submit's parameters: its stop strings, stop token ids and logit bias (a
 * packed id and a float a pair), and the rest. */
static size_t params_bytes(const struct greq *q)
{
    const pagoda_generate_params *p = &q->req.params;
    size_t bytes = 128 + 5 * p->num_stop_token_ids + 9 * p->num_logit_bias;
    for (size_t i = 0; i < p->num_stop; i++)
        bytes += strlen(p->stop[i]) + 2;
    return bytes;
}

/* Whether a request of several choices (n of each prompt) is refused before it is sent
 * (answered here): more choices than --max-requests (400: it could never run), a whole answer
 * that its choices x max_tokens would take past GATEWAY_MAX_ANSWER_BYTES, or n copies of its
 * body (each prompt is sent n times) and each choice's parameters past
 * GATEWAY_MAX_CHOICES_BYTES. */
static int choices_refused(struct greq *q)
{
    const struct gateway *g = q->g;
    const uint64_t total = choices_asked(q), n = q->req.n;
    struct openai_error err = {.status = 400, .type = "invalid_request_error"};
    const uint64_t per_token = gateway_token_json_bytes(q);
    if (total > g->cfg.max_requests)
        snprintf(err.message, sizeof(err.message),
                 "%u choices (%u prompts x n %u) pass the gateway's limit of %u requests in "
                 "progress",
                 (unsigned)total, (unsigned)q->req.num_prompts, (unsigned)n, g->cfg.max_requests);
    else if (!q->req.stream &&
             total * (uint64_t)q->req.params.max_tokens * per_token > GATEWAY_MAX_ANSWER_BYTES)
        snprintf(err.message, sizeof(err.message),
                 "%u choices of up to %d tokens%s pass what a whole answer holds (%u MiB at %u "
                 "bytes a token): ask for fewer, or stream them",
                 (unsigned)total, (int)q->req.params.max_tokens,
                 q->req.params.logprobs ? " with log-probabilities" : "",
                 GATEWAY_MAX_ANSWER_BYTES >> 20, (unsigned)per_token);
    else if (n * q->body_bytes + total * params_bytes(q) > GATEWAY_MAX_CHOICES_BYTES)
        snprintf(err.message, sizeof(err.message),
                 "%u choices send %u copies of a %zu-byte request (and %u of its %zu bytes of "
                 "parameters), past the gateway's %u MiB",
                 (unsigned)total, (unsigned)n, (size_t)q->body_bytes, (unsigned)total,
                 params_bytes(q), GATEWAY_MAX_CHOICES_BYTES >> 20);
    else
        return 0;
    gateway_respond_error(q, &err);
    return 1;
}

/* The loop: the parse job ended. */
static void after_parse(uv_work_t *w, int status)
{
    struct greq *q = w->data;
    struct gateway *g = q->g;
    /* the body is parsed: nothing reads it again */
    g->parse_bytes -= q->body_len;
    free(q->body);
    q->body = NULL;
    q->body_bytes = q->body_len;
    q->body_len = 0;
    if (q->http == NULL || status != 0 || g->closing) {
        greq_unref(q); /* the job's reference */
        return;
    }
    if (q->parse_rc != 0) {
        gateway_respond_error(q, &q->err);
    } else if (q->req.model != NULL && strcmp(q->req.model, g->cfg.model_name) != 0) {
        struct openai_error err = {
            .status = 404, .type = "not_found_error", .code = "model_not_found"};
        snprintf(err.message, sizeof(err.message),
                 "the model '%s' does not exist: this server serves '%s'", q->req.model,
                 g->cfg.model_name);
        gateway_respond_error(q, &err);
    } else if (q->route == ROUTE_TOKENIZE || q->route == ROUTE_DETOKENIZE) {
        const pagoda_prompt *p = &q->req.prompt;
        int rc = gateway_call_started(
            q,
            q->route == ROUTE_TOKENIZE
                ? pagoda_tokenize_async(g->client, q->api_key, p, on_tokenize_call, q)
                : pagoda_detokenize_async(g->client, q->api_key, p->token_ids, p->num_token_ids,
                                          q->req.params.skip_special_tokens, on_tokenize_call, q));
        release_prompt(q); /* serialised by the call */
        if (rc != 0)
            gateway_respond_code(q, rc, pagoda_error_detail());
    } else if (choices_asked(q) > 1 && choices_refused(q)) {
        /* refused */
    } else if (choices_asked(q) > 1 &&
               g->num_generations + (choices_asked(q) - 1) > g->cfg.max_requests) {
        /* the choices count as requests: the one counted on arrival, and the others now */
        struct openai_error err = {.status = 429, .type = "rate_limit_error"};
        snprintf(err.message, sizeof(err.message),
                 "%u choices with the %u requests in progress pass the gateway's limit of %u: "
                 "retry later",
                 (unsigned)choices_asked(q), (unsigned)(g->num_generations - 1),
                 g->cfg.max_requests);
        gateway_respond_error(q, &err);
    } else {
        g->num_generations += choices_asked(q) - 1;
        q->generation = choices_asked(q);
        start_choices(q);
    }
    greq_unref(q);
}

static void parse_work(uv_work_t *w)
{
    struct greq *q = w->data;
    enum openai_kind kind = q->route == ROUTE_CHAT         ? OPENAI_CHAT
                            : q->route == ROUTE_TOKENIZE   ? OPENAI_TOKENIZE
                            : q->route == ROUTE_DETOKENIZE ? OPENAI_DETOKENIZE
                                                           : OPENAI_COMPLETION;
    q->parse_rc = openai_parse(kind, q->body, q->body_len, q->g->cfg.default_max_tokens,
                               q->g->cfg.tool_call_parser, &q->req, &q->err);
    if (q->parse_rc != 0) /* refused: its answer is in q->err, and its tree is freed here */
        openai_request_release_prompt(&q->req);
}

/* ---- the mailbox ---------------------------------------------------------------------------- */

static void on_async(uv_async_t *h)
{
    struct gateway *g = h->data;
    pthread_mutex_lock(&g->lock);
    struct gmail *m = g->mail_head;
    g->mail_head = g->mail_tail = NULL;
    pthread_mutex_unlock(&g->lock);
    while (m != NULL) {
        struct gmail *next = m->next;
        struct greq *q = m->q;
        g->calls_outstanding--;
        switch (m->kind) {
        case CALL_KIND_SUBMIT:
            on_submitted(m->c, m->res);
            break;
        case CALL_KIND_POLL:
            on_poll(m->c, &m->res); /* may take it (stream_hold) */
            break;
        case CALL_KIND_CANCEL:
            if (m->res->rc == PAGODA_EBUSY && !g->closing) {
                retry_later(m->c, 1); /* (closing: not again, so as not to hold the exit) */
                break;
            }
            m->c->cancel_answered = 1;
            settle(q);
            break;
        case CALL_KIND_HEALTH:
            gateway_on_health(q, m->res);
            break;
        case CALL_KIND_STATS:
            gateway_metrics_answer(q, &m->res);
            break;
        case CALL_KIND_TENANTS:
            gateway_metrics_tenants(q, m->res);
            break;
        case CALL_KIND_TOKENIZE:
            gateway_on_tokenized(q, &m->res);
            break;
        case CALL_KIND_PROMPT_IDS:
            on_prompt_ids(m->c, m->res);
            break;
        }
        pagoda_async_result_free(m->res);
        free(m);
        greq_unref(q); /* the call's reference */
        m = next;
    }
    gateway_maybe_free(g);
}

/* ---- requests in ---------------------------------------------------------------------------- */

static void on_http_close(void *arg)
{
    struct greq *q = arg;
    q->http = NULL; /* gone: no respond call may follow */
    gateway_metrics_disconnect(q->g, q);
    cancel_all(q);
    greq_unref(q); /* the HTTP side's reference */
}

static struct greq *greq_new(struct gateway *g, struct http_request *http, enum route route)
{
    struct greq *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return NULL;
    q->g = g;
    q->http = http;
    q->route = route;
    q->refs = 1;
    q->t_start_ns = now_ns();
    q->next = g->live;
    if (g->live)
        g->live->prev = q;
    g->live = q;
    if (http != NULL)
        http_request_on_close(http, on_http_close, q);
    return q;
}

/* A health call of the gateway's own as it opens: the router's reply says how large a request
 * it accepts (ClientResponse max_request_bytes), and libpagoda refuses a bigger one at once
 * (PAGODA_ERANGE: 400) instead of sending it. Sent, a bigger one makes NNG drop the gateway's one
 * connection to the router, which every client's call shares, again at every resend until the
 * call times out. Every reply keeps the limit current. */
static void learn_router_limit(struct gateway *g)
{
    struct greq *q = greq_new(g, NULL, ROUTE_HEALTH);
    if (q == NULL)
        return;
    if (gateway_call_started(q, pagoda_health_async(g->client, on_health_call, q)) != 0)
        log_warn("could not ask the router its request limit: %s", pagoda_error_detail());
    greq_unref(q);
}

/* The key of "Authorization: Bearer KEY", copied; *bad when the header is there but unusable. */
static char *bearer_key(struct http_request *http, int *bad)
{
    *bad = 0;
    const char *h = http_request_header(http, "Authorization");
    if (h == NULL)
        return NULL;
    if (strncasecmp(h, "Bearer ", 7) != 0) {
        *bad = 1;
        return NULL;
    }
    h += 7;
    while (*h == ' ')
        h++;
    size_t n = strlen(h);
    while (n > 0 && h[n - 1] == ' ')
        n--;
    if (n == 0 || n > PAGODA_MAX_API_KEY_BYTES) {
        *bad = 1;
        return NULL;
    }
    return strndup(h, n);
}

/* The key of q's Authorization header into q->api_key (NULL without one), for the router to
 * check, as it checks every /v1 route's (an unknown key: PAGODA_EPERM, 401). A header that is not
 * 'Bearer KEY' is answered here with 401: returns -1 then (q answered), else 0. */
static int take_api_key(struct greq *q)
{
    int bad = 0;
    q->api_key = bearer_key(q->http, &bad);
    if (!bad)
        return 0;
    struct openai_error err = {
        .status = 401, .type = "authentication_error", .code = "invalid_api_key"};
    snprintf(err.message, sizeof(err.message),
             "the Authorization header must be 'Bearer KEY' (at most %u bytes)",
             PAGODA_MAX_API_KEY_BYTES);
    gateway_respond_error(q, &err);
    return -1;
}

static void start_generation(struct gateway *g, struct http_request *http, enum route route)
{
    /* Tokenize calls do not count as generations (the router bounds them per tenant). */
    uint32_t generation = route == ROUTE_COMPLETION || route == ROUTE_CHAT;
    if (generation && g->num_generations >= g->cfg.max_requests) {
        struct openai_error err = {.status = 429, .type = "rate_limit_error"};
        snprintf(err.message, sizeof(err.message),
                 "%u requests are in progress, the gateway's limit: retry later",
                 g->cfg.max_requests);
        size_t n;
        const char *const *headers = gateway_retry_headers(429, &n);
        gateway_respond_plain_error(g, http, &err, headers, n);
        return;
    }
    struct greq *q = greq_new(g, http, route);
    if (q == NULL) {
        gateway_respond_plain(http, 500, "text/plain", "out of memory\n", 14, NULL, 0);
        return;
    }
    q->generation = generation;
    g->num_generations += generation;
    if (take_api_key(q) != 0)
        return;
    /* The body moves to the request (no copy; the HTTP request keeps none for the response). */
    size_t len;
    q->body = http_request_take_body(http, &len);
    if (q->body == NULL) {
        gateway_respond_code(q, PAGODA_ENOMEM, "out of memory");
        return;
    }
    /* Bodies waiting for the threadpool count against the same budget as those arriving. */
    if (g->parse_bytes + len > g->cfg.http.max_body_memory) {
        free(q->body);
        q->body = NULL;
        struct openai_error err = {.status = 503, .type = "server_error", .code = "overloaded"};
        snprintf(err.message, sizeof(err.message),
                 "request bodies waiting to be parsed pass the gateway's %zu bytes: try again",
                 g->cfg.http.max_body_memory);
        gateway_respond_error(q, &err);
        return;
    }
    g->parse_bytes += len;
    q->body_len = len;
    q->created = (long long)time(NULL);
    uint64_t r = now_ns() ^ ((uint64_t)(uintptr_t)q << 16);
    snprintf(q->id_str, sizeof(q->id_str), "%s-%016llx%08x",
             route == ROUTE_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)r, g->serial++);
    q->work.data = q;
    q->refs++; /* the job's */
    int uv = uv_queue_work(g->loop, &q->work, parse_work, after_parse);
    if (uv != 0) {
        q->refs--;
        g->parse_bytes -= q->body_len;
        gateway_respond_code(q, PAGODA_EIO, uv_strerror(uv));
    }
}

/* 404, or 405 with the methods the route takes (RFC 9110 wants them in Allow), counted in
 * pagoda_http_errors_total. */
static void not_found(struct gateway *g, struct http_request *http, const char *allow)
{
    int status = allow != NULL ? 405 : 404;
    struct openai_error err = {.status = status,
                               .type = status == 405 ? "invalid_request_error" : "not_found_error"};
    if (allow != NULL)
        snprintf(err.message, sizeof(err.message), "this route takes %s", allow);
    else
        snprintf(err.message, sizeof(err.message), "no such route");
    char header[64];
    const char *headers[] = {header};
    snprintf(header, sizeof(header), "Allow: %s", allow != NULL ? allow : "");
    gateway_respond_plain_error(g, http, &err, allow != NULL ? headers : NULL,
                                allow != NULL ? 1 : 0);
}

/* A CORS preflight (OPTIONS with Origin and Access-Control-Request-Method) where the gateway
 * allows origins (--allowed-origins): 204 with the methods, the headers asked for (where they are
 * a list of header names; else Authorization and Content-Type) and a 10-minute cache, the HTTP
 * server adding Access-Control-Allow-Origin; 403 for an origin not allowed (counted in
 * pagoda_http_errors_total as every error answer is). Returns whether it answered. */
static int preflight(struct gateway *g, struct http_request *http)
{
    const char *origins = g->cfg.http.allowed_origins;
    const char *asked = http_request_header(http, "Access-Control-Request-Headers");
    const char *origin = http_request_header(http, "Origin");
    if (origins == NULL || *origins == '\0' || origin == NULL ||
        http_request_header(http, "Access-Control-Request-Method") == NULL)
        return 0;
    if (!http_origin_allowed(origins, origin)) {
        struct openai_error err = {.status = 403, .type = "invalid_request_error"};
        snprintf(err.message, sizeof(err.message),
                 "this origin may not call the API (--allowed-origins)");
        gateway_respond_plain_error(g, http, &err, NULL, 0);
        return 1;
    }
    size_t n = asked != NULL ? strlen(asked) : 0;
    int names = n > 0 && n <= 1024;
    for (size_t i = 0; names && i < n; i++)
        names = isalnum((unsigned char)asked[i]) || strchr("-_, ", asked[i]) != NULL;
    char allow_headers[1100];
    snprintf(allow_headers, sizeof(allow_headers), "Access-Control-Allow-Headers: %s",
             names ? asked : "Authorization, Content-Type");
    const char *headers[] = {"Access-Control-Allow-Methods: GET, HEAD, POST, OPTIONS",
                             allow_headers, "Access-Control-Max-Age: 600"};
    gateway_respond_plain(http, 204, NULL, NULL, 0, headers, 3);
    return 1;
}

/* The routes of GET (and HEAD). /ping is vLLM's (SageMaker's) name for /health. None of them
 * takes an API key but /v1/models, whose key the router checks. */
enum get_route { GET_NONE, GET_HEALTH, GET_METRICS, GET_MODELS, GET_VERSION, GET_STATUS };

static enum get_route get_route(const char *path)
{
    static const struct {
        const char *path;
        enum get_route route;
    } routes[] = {{"/health", GET_HEALTH},    {"/ping", GET_HEALTH},     {"/metrics", GET_METRICS},
                  {"/v1/models", GET_MODELS}, {"/version", GET_VERSION}, {"/", GET_STATUS},
                  {"/status", GET_STATUS}};
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++)
        if (strcmp(path, routes[i].path) == 0)
            return routes[i].route;
    return GET_NONE;
}

/* /health (and /ping), /v1/models and /metrics: answered once a call to the router has (its
 * Health; for /v1/models with the client's key checked as a Submit's, the answer carrying the
 * model's context too; its Stats). */
static void start_router_route(struct gateway *g, struct http_request *http, enum route route)
{
    struct greq *q = greq_new(g, http, route);
    if (q == NULL) {
        gateway_respond_plain(http, 500, "text/plain", "out of memory\n", 14, NULL, 0);
        return;
    }
    if (route == ROUTE_MODELS && take_api_key(q) != 0)
        return;
    if (route == ROUTE_HEALTH && !pagoda_client_connected(g->client)) {
        /* no connection to the router (restarting, or gone): 503 at once, not after the
         * client's timeout (30 s by default) that a call would wait for it */
        pagoda_async_result none = {.rc = PAGODA_ECLOSED};
        snprintf(none.detail, sizeof(none.detail), "the router is not connected");
        gateway_on_health(q, &none);
        return;
    }
    int rc = gateway_call_started(
        q, route == ROUTE_METRICS
               ? pagoda_stats_async(g->client, g->cfg.stats_key, gateway_on_stats_call, q)
           : route == ROUTE_MODELS
               ? pagoda_health_key_async(g->client, q->api_key, on_health_call, q)
               : pagoda_health_async(g->client, on_health_call, q));
    if (rc != 0) {
        pagoda_async_result none = {.rc = rc};
        snprintf(none.detail, sizeof(none.detail), "%s", pagoda_error_detail());
        if (route == ROUTE_METRICS)
            gateway_respond_code(q, rc, none.detail);
        else
            gateway_on_health(q, &none);
    }
}

static void on_http(void *user, struct http_request *http)
{
    struct gateway *g = user;
    const char *method = http_request_method(http), *path = http_request_path(http);
    if (strcmp(method, "OPTIONS") == 0 && preflight(g, http))
        return;
    /* HEAD is GET without the body (the HTTP server leaves it out). */
    int post = strcmp(method, "POST") == 0,
        get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (strcmp(path, "/v1/completions") == 0 || strcmp(path, "/v1/chat/completions") == 0) {
        if (!post) {
            not_found(g, http, "POST");
            return;
        }
        start_generation(g, http, path[4] == 'c' && path[5] == 'h' ? ROUTE_CHAT : ROUTE_COMPLETION);
        return;
    }
    if (strcmp(path, "/tokenize") == 0 || strcmp(path, "/detokenize") == 0) {
        if (!post) {
            not_found(g, http, "POST");
            return;
        }
        start_generation(g, http, path[1] == 't' ? ROUTE_TOKENIZE : ROUTE_DETOKENIZE);
        return;
    }
    enum get_route route = get_route(path);
    if (!get || route == GET_NONE) {
        not_found(g, http, route != GET_NONE ? "GET, HEAD" : NULL);
        return;
    }
    if (route == GET_STATUS) {
        gateway_status_page(http);
    } else if (route == GET_VERSION) {
        char *json = openai_version_json(pagoda_version());
        if (json != NULL)
            gateway_respond_plain(http, 200, "application/json", json, strlen(json), NULL, 0);
        else
            gateway_respond_plain(http, 500, "text/plain", "out of memory\n", 14, NULL, 0);
        free(json);
    } else {
        start_router_route(g, http,
                           route == GET_METRICS  ? ROUTE_METRICS
                           : route == GET_MODELS ? ROUTE_MODELS
                                                 : ROUTE_HEALTH);
    }
}

/* ---- open and close ----------------------------------------------------------------------- */

static void on_async_closed(uv_handle_t *h)
{
    struct gateway *g = h->data;
    pagoda_client_close(g->client);
    gateway_metrics_fini(g);
    pthread_mutex_destroy(&g->lock);
    free(g->model_name);
    free(g->router_url);
    free(g->stats_key);
    free(g);
}

static void on_retry_timer_closed(uv_handle_t *h)
{
    struct gateway *g = h->data;
    uv_close((uv_handle_t *)&g->async, on_async_closed);
}

/* Closes the retry timer, then the mailbox, then frees g (with nothing left to retry: each
 * waiting call holds its request, and g->live is empty). */
void gateway_maybe_free(struct gateway *g)
{
    if (!g->closing || g->live != NULL || g->calls_outstanding > g->calls_lost || g->freeing)
        return;
    g->freeing = 1;
    uv_close((uv_handle_t *)&g->retry_timer, on_retry_timer_closed);
}

int gateway_open(uv_loop_t *loop, const struct gateway_config *cfg, struct gateway **out)
{
    if (cfg->router_url == NULL || cfg->model_name == NULL || cfg->max_requests == 0 ||
        cfg->default_max_tokens < 1 || cfg->poll_wait_ms == 0 ||
        cfg->poll_wait_ms > PAGODA_POLL_WAIT_MS_MAX)
        return pagoda_error_set(PAGODA_EINVAL, "gateway: incomplete configuration");
    struct gateway *g = calloc(1, sizeof(*g));
    if (g == NULL)
        return PAGODA_ENOMEM;
    g->loop = loop;
    g->cfg = *cfg;
    g->model_name = strdup(cfg->model_name);
    g->router_url = strdup(cfg->router_url);
    g->stats_key = cfg->stats_key ? strdup(cfg->stats_key) : NULL;
    if (g->model_name == NULL || g->router_url == NULL || (cfg->stats_key && !g->stats_key)) {
        free(g->model_name);
        free(g->router_url);
        free(g->stats_key);
        free(g);
        return PAGODA_ENOMEM;
    }
    g->cfg.model_name = g->model_name;
    g->cfg.router_url = g->router_url;
    g->cfg.stats_key = g->stats_key;
    g->started = (long long)time(NULL);
    pthread_mutex_init(&g->lock, NULL);
    int rc = pagoda_client_open(g->router_url, &g->client);
    if (rc == 0) {
        pagoda_client_set_timeout_ms(g->client, cfg->router_timeout_ms);
        rc = gateway_metrics_init(g);
    }
    if (rc == 0 && uv_async_init(loop, &g->async, on_async) != 0)
        rc = pagoda_error_set(PAGODA_EIO, "gateway: uv_async_init failed");
    if (rc != 0) {
        gateway_metrics_fini(g);
        pagoda_client_close(g->client);
        pthread_mutex_destroy(&g->lock);
        free(g->model_name);
        free(g->router_url);
        free(g->stats_key);
        free(g);
        return rc;
    }
    g->async.data = g;
    uv_timer_init(loop, &g->retry_timer); /* cannot fail */
    g->retry_timer.data = g;
    if ((rc = http_server_open(loop, &g->cfg.http, on_http, g, &g->http)) != 0) {
        g->closing = 1;
        gateway_maybe_free(g);
        return rc;
    }
    learn_router_limit(g);
    *out = g;
    return 0;
}

uint16_t gateway_port(const struct gateway *g)
{
    return http_server_port(g->http);
}

void gateway_close(struct gateway *g)
{
    if (g == NULL)
        return;
    g->closing = 1;
    /* Every request in progress gets its close callback: each cancels its router request. */
    http_server_close(g->http);
    g->http = NULL;
    gateway_maybe_free(g);
}
