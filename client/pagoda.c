#include "client/pagoda.h"
#include "client/client_internal.h"

#include "proto/pagoda.pb-c.h"
#include "wire/wire_error.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

/* The smallest limit a router may set on a request (router.h: 16 KiB beside the prompt, 4 bytes
 * a prompt token): a larger request, before any reply has said the router's limit, asks it first
 * (a health call), so that one over it is refused here, not sent (client_check_size). */
#define CLIENT_SMALLEST_ROUTER_LIMIT (16u << 10)
/* pagoda_generate's wait per poll. */
#define GENERATE_POLL_WAIT_MS 10000u
/* A poll answered with nothing new long before its wait ran out means the router holds as many
 * waiting calls as it may (router.h max_parked_calls): pagoda_generate waits before polling
 * again, from the first back-off, doubling up to the last, until tokens come. */
#define GENERATE_BUSY_BACKOFF_FIRST_MS 20u
#define GENERATE_BUSY_BACKOFF_MAX_MS 1000u

struct pagoda_client {
    nng_socket sock;
    atomic_uint timeout_ms;
    atomic_uint resend_ms;         /* beyond a call's poll wait; see pagoda_client_set_resend_ms */
    char *api_key;                 /* sent with every call; NULL: none */
    atomic_uint max_request_bytes; /* as the router's last reply said; 0: no reply yet */
    /* The requests of the generate calls running now (pagoda_client_cancel_generations), and
     * whether that was called (no generate call starts after it). */
    pthread_mutex_t live_lock;
    struct live_generation *live;
    atomic_int generations_cancelled;
    atomic_int pipes; /* connections to the router now (pagoda_client_connected) */
};

/* NNG thread: a connection to the router came or went. */
static void on_pipe(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    (void)p;
    pagoda_client *c = arg;
    if (ev == NNG_PIPE_EV_ADD_POST)
        atomic_fetch_add(&c->pipes, 1);
    else if (atomic_fetch_sub(&c->pipes, 1) <= 0)
        atomic_fetch_add(&c->pipes, 1); /* one never added (removed before ADD_POST) */
}

int pagoda_client_connected(pagoda_client *c)
{
    return c != NULL && atomic_load(&c->pipes) > 0;
}

/* A generate call's request, on its stack from before its Submit until it returns. */
struct live_generation {
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    struct live_generation *prev, *next;
};

nng_socket client_socket(const pagoda_client *c)
{
    return c->sock;
}

uint32_t client_timeout_ms(const pagoda_client *c)
{
    return atomic_load(&c->timeout_ms);
}

uint32_t client_resend_ms(const pagoda_client *c)
{
    return atomic_load(&c->resend_ms);
}

const char *client_api_key(const pagoda_client *c)
{
    return c->api_key;
}

uint32_t client_request_limit(const pagoda_client *c)
{
    uint32_t n = atomic_load(&c->max_request_bytes);
    return n > 0 && n < CLIENT_MAX_REQUEST_BYTES ? n : CLIENT_MAX_REQUEST_BYTES;
}

void client_note_reply(pagoda_client *c, const Pagoda__ClientResponse *resp)
{
    if (resp->has_max_request_bytes && resp->max_request_bytes > 0)
        atomic_store(&c->max_request_bytes, resp->max_request_bytes);
    else /* a router that does not say (older): not asked again, the largest limit holds */
        atomic_store(&c->max_request_bytes, CLIENT_MAX_REQUEST_BYTES);
}

int client_check_size(const pagoda_client *c, size_t len)
{
    uint32_t limit = client_request_limit(c);
    /* the limit is on what the transport carries: REQ's header beside the message */
    if (len + CLIENT_REQ_HEADER_BYTES <= limit)
        return 0;
    len += CLIENT_REQ_HEADER_BYTES;
    return pagoda_error_set(PAGODA_ERANGE,
                            "a %zu-byte request exceeds the router's limit of %u bytes (a prompt "
                            "too long for the model: the router's --max-prompt-tokens)",
                            len, limit);
}

pagoda_generate_params pagoda_generate_params_default(void)
{
    pagoda_generate_params p = {
        .temperature = 1.0f,
        .top_p = 1.0f,
        .top_k = 0,
        .min_p = 0.0f,
        .repetition_penalty = 1.0f,
        .presence_penalty = 0.0f,
        .frequency_penalty = 0.0f,
        .has_seed = 0,
        .seed = 0,
        .max_tokens = 16,
        .stop_token_ids = NULL,
        .num_stop_token_ids = 0,
        .ignore_eos = 0,
        .logprobs = 0,
        .logit_bias_ids = NULL,
        .logit_bias_values = NULL,
        .num_logit_bias = 0,
        .min_tokens = 0,
        .stop = NULL,
        .num_stop = 0,
        .detokenize = -1,
        .skip_special_tokens = 1,
        .model_defaults = 0,
    };
    return p;
}

pagoda_prompt pagoda_prompt_default(void)
{
    pagoda_prompt p = {.add_generation_prompt = 1, .add_special_tokens = -1};
    return p;
}

int pagoda_client_open(const char *url, pagoda_client **out)
{
    if (url == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_client_open: NULL argument");
    pagoda_client *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return PAGODA_ENOMEM;
    atomic_init(&c->timeout_ms, PAGODA_DEFAULT_TIMEOUT_MS);
    atomic_init(&c->resend_ms, PAGODA_DEFAULT_RESEND_MS);
    pthread_mutex_init(&c->live_lock, NULL);
    int rv = nng_req0_open(&c->sock);
    if (rv != 0) {
        pthread_mutex_destroy(&c->live_lock);
        free(c);
        return wire_error(rv, "nng_req0_open");
    }
    if ((rv = nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, PAGODA_MAX_REPLY_BYTES)) != 0 ||
        (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 20)) != 0 ||
        (rv = nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 500)) != 0) {
        nng_close(c->sock);
        pthread_mutex_destroy(&c->live_lock);
        free(c);
        return wire_error(rv, "client socket options");
    }
    atomic_init(&c->pipes, 0);
    /* Non-blocking: the dial goes on in the background until the router is there. */
    if ((rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_ADD_POST, on_pipe, c)) != 0 ||
        (rv = nng_pipe_notify(c->sock, NNG_PIPE_EV_REM_POST, on_pipe, c)) != 0 ||
        (rv = nng_dial(c->sock, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
        nng_close(c->sock);
        pthread_mutex_destroy(&c->live_lock);
        free(c);
        return wire_error(rv, url);
    }
    *out = c;
    return 0;
}

void pagoda_client_close(pagoda_client *c)
{
    if (c == NULL)
        return;
    nng_close(c->sock);
    pthread_mutex_destroy(&c->live_lock);
    free(c->api_key);
    free(c);
}

int pagoda_client_set_api_key(pagoda_client *c, const char *api_key)
{
    if (c == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_client_set_api_key: NULL client");
    char *copy = NULL;
    if (api_key != NULL) {
        if (strlen(api_key) > PAGODA_MAX_API_KEY_BYTES)
            return pagoda_error_set(PAGODA_ERANGE, "the API key is longer than %u bytes",
                                    PAGODA_MAX_API_KEY_BYTES);
        if ((copy = strdup(api_key)) == NULL)
            return PAGODA_ENOMEM;
    }
    free(c->api_key);
    c->api_key = copy;
    return 0;
}

void pagoda_client_set_timeout_ms(pagoda_client *c, uint32_t timeout_ms)
{
    if (timeout_ms > PAGODA_MAX_TIMEOUT_MS)
        timeout_ms = PAGODA_MAX_TIMEOUT_MS;
    atomic_store(&c->timeout_ms, timeout_ms ? timeout_ms : 1);
}

void pagoda_client_set_resend_ms(pagoda_client *c, uint32_t resend_ms)
{
    if (resend_ms > PAGODA_MAX_RESEND_MS)
        resend_ms = PAGODA_MAX_RESEND_MS;
    atomic_store(&c->resend_ms, resend_ms ? resend_ms : 1);
}

static int call_sized(pagoda_client *c, Pagoda__ClientRequest *req, size_t len, uint32_t wait_ms,
                      Pagoda__ClientResponse **out);

/* One call: packs req, sends it on a context of its own and waits for the reply. On success
 * *out is the unpacked reply (free with pagoda__client_response__free_unpacked) and has no
 * error; an error the router reported is returned as its code, with its message as the
 * detail. */
static int call(pagoda_client *c, Pagoda__ClientRequest *req, uint32_t wait_ms,
                Pagoda__ClientResponse **out)
{
    req->has_protocol_version = 1;
    req->protocol_version = CLIENT_PROTOCOL_VERSION;
    req->api_key = c->api_key;
    size_t len = protobuf_c_message_get_packed_size(&req->base);
    if (len > CLIENT_SMALLEST_ROUTER_LIMIT && atomic_load(&c->max_request_bytes) == 0) {
        int healthy; /* its answer does not matter here: the reply carries the limit */
        (void)pagoda_health(c, &healthy);
        pagoda_error_clear();
    }
    int rc = client_check_size(c, len);
    if (rc != 0)
        return rc;
    rc = call_sized(c, req, len, wait_ms, out);
    /* A large request unanswered: the router may have lowered its limit since it said it (it
     * does once the model's context is known), NNG dropping the request: the next asks again. */
    if (rc == PAGODA_ETIMEDOUT && len > CLIENT_SMALLEST_ROUTER_LIMIT)
        atomic_store(&c->max_request_bytes, 0);
    return rc;
}

/* call's sending and receiving of req, packed in len bytes. */
static int call_sized(pagoda_client *c, Pagoda__ClientRequest *req, size_t len, uint32_t wait_ms,
                      Pagoda__ClientResponse **out)
{
    int rc = 0;
    uint32_t timeout_ms = atomic_load(&c->timeout_ms);
    /* wait_ms <= PAGODA_POLL_WAIT_MS_MAX, so the sum fits NNG's int32 milliseconds. */
    uint32_t resend_ms = wait_ms + atomic_load(&c->resend_ms);
    nng_ctx ctx;
    nng_aio *aio = NULL;
    nng_msg *m = NULL;
    int rv = nng_ctx_open(&ctx, c->sock);
    if (rv != 0)
        return wire_error(rv, "nng_ctx_open");
    if ((rv = nng_ctx_set_ms(ctx, NNG_OPT_REQ_RESENDTIME, (nng_duration)resend_ms)) != 0 ||
        (rv = nng_aio_alloc(&aio, NULL, NULL)) != 0 || (rv = nng_msg_alloc(&m, len)) != 0) {
        rc = wire_error(rv, "client call setup");
        goto out;
    }
    protobuf_c_message_pack(&req->base, nng_msg_body(m));
    /* The send waits for a connection to the router, up to the timeout. */
    nng_aio_set_timeout(aio, (nng_duration)timeout_ms);
    nng_aio_set_msg(aio, m);
    nng_ctx_send(ctx, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)) != 0) {
        rc = rv == NNG_ETIMEDOUT
                 ? pagoda_error_set(PAGODA_ETIMEDOUT, "no connection to the router within %u ms",
                                    timeout_ms)
                 : wire_error(rv, "sending to the router");
        goto out; /* m is still ours */
    }
    m = NULL;
    nng_aio_set_timeout(aio, (nng_duration)(wait_ms + timeout_ms));
    nng_ctx_recv(ctx, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)) != 0) {
        rc = rv == NNG_ETIMEDOUT
                 ? pagoda_error_set(PAGODA_ETIMEDOUT, "the router did not answer within %u ms",
                                    wait_ms + timeout_ms)
                 : wire_error(rv, "receiving from the router");
        goto out;
    }
    m = nng_aio_get_msg(aio);
    Pagoda__ClientResponse *resp =
        pagoda__client_response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
    if (resp == NULL) {
        rc = pagoda_error_set(PAGODA_EPROTO, "a malformed %zu-byte reply from the router",
                              nng_msg_len(m));
        goto out;
    }
    client_note_reply(c, resp);
    if (resp->has_error_code && resp->error_code != 0) {
        int code = resp->error_code;
        if (code < PAGODA_EINTERNAL || code > 0)
            code = PAGODA_EPROTO;
        rc = pagoda_error_set(code, "router: %s",
                              resp->error_message ? resp->error_message : pagoda_strerror(code));
        pagoda__client_response__free_unpacked(resp, NULL);
        goto out;
    }
    *out = resp;
out:
    nng_msg_free(m);
    nng_aio_free(aio);
    nng_ctx_close(ctx);
    return rc;
}

void pagoda_result_free(pagoda_result *r)
{
    if (r == NULL)
        return;
    free(r->token_ids);
    free(r->logprobs);
    free(r->error_message);
    free(r->text);
    free(r->token_text_ends);
    free(r->stop_string);
    memset(r, 0, sizeof(*r));
}

/* Copies an update into *result (which is overwritten). */
int client_result_from_update(const Pagoda__ClientResponse *resp,
                              const uint8_t id[PAGODA_REQUEST_ID_BYTES], pagoda_result *result)
{
    memset(result, 0, sizeof(*result));
    memcpy(result->request_id, id, PAGODA_REQUEST_ID_BYTES);
    if (resp->result_case != PAGODA__CLIENT_RESPONSE__RESULT_UPDATE || resp->update == NULL)
        return pagoda_error_set(PAGODA_EPROTO, "the router's reply carries no token update");
    const Pagoda__TokenUpdate *up = resp->update;
    if (up->has_request_id && (up->request_id.len != PAGODA_REQUEST_ID_BYTES ||
                               memcmp(up->request_id.data, id, PAGODA_REQUEST_ID_BYTES) != 0))
        return pagoda_error_set(PAGODA_EPROTO, "the router answered for another request");
    if (up->has_finish_reason && (up->finish_reason < PAGODA__FINISH_REASON__FINISH_NONE ||
                                  up->finish_reason > PAGODA__FINISH_REASON__FINISH_ERROR))
        return pagoda_error_set(PAGODA_EPROTO, "unknown finish reason %d", (int)up->finish_reason);
    if (up->n_logprobs != 0 && up->n_logprobs != up->n_token_ids)
        return pagoda_error_set(PAGODA_EPROTO, "%zu logprobs for %zu tokens", up->n_logprobs,
                                up->n_token_ids);
    if (up->n_token_text_ends != 0) {
        if (up->n_token_text_ends != up->n_token_ids || !up->has_text)
            return pagoda_error_set(PAGODA_EPROTO, "%zu token text ends for %zu tokens%s",
                                    up->n_token_text_ends, up->n_token_ids,
                                    up->has_text ? "" : " and no text");
        size_t n = up->n_token_text_ends;
        for (size_t i = 0; i < n; i++) {
            uint32_t e = up->token_text_ends[i];
            if (e > up->text.len || (i > 0 && e < up->token_text_ends[i - 1]) ||
                (i == n - 1 && e != up->text.len) ||
                (e < up->text.len && (up->text.data[e] & 0xC0) == 0x80))
                return pagoda_error_set(PAGODA_EPROTO,
                                        "token text end %zu (%u) is out of order, inside a "
                                        "character or not at the text's end (%zu bytes)",
                                        i, e, up->text.len);
        }
    }
    result->offset = up->has_offset ? up->offset : 0;
    result->finish_reason =
        up->has_finish_reason ? (pagoda_finish_reason)up->finish_reason : PAGODA_FINISH_NONE;
    if (up->n_token_ids > 0) {
        result->token_ids = malloc(up->n_token_ids * sizeof(int32_t));
        if (result->token_ids == NULL)
            return PAGODA_ENOMEM;
        memcpy(result->token_ids, up->token_ids, up->n_token_ids * sizeof(int32_t));
        result->num_tokens = up->n_token_ids;
        if (up->n_logprobs > 0) {
            result->logprobs = malloc(up->n_logprobs * sizeof(float));
            if (result->logprobs == NULL) {
                pagoda_result_free(result);
                return PAGODA_ENOMEM;
            }
            memcpy(result->logprobs, up->logprobs, up->n_logprobs * sizeof(float));
        }
        if (up->n_token_text_ends > 0) {
            result->token_text_ends = malloc(up->n_token_text_ends * sizeof(uint32_t));
            if (result->token_text_ends == NULL) {
                pagoda_result_free(result);
                return PAGODA_ENOMEM;
            }
            memcpy(result->token_text_ends, up->token_text_ends,
                   up->n_token_text_ends * sizeof(uint32_t));
        }
    }
    if (up->usage != NULL) {
        result->prompt_tokens = up->usage->prompt_tokens;
        result->completion_tokens = up->usage->completion_tokens;
        result->cached_tokens = up->usage->cached_tokens;
    }
    if (result->finish_reason == PAGODA_FINISH_ERROR) {
        result->error_message = strdup(resp->error_message ? resp->error_message : "error");
        if (result->error_message == NULL) {
            pagoda_result_free(result);
            return PAGODA_ENOMEM;
        }
    }
    /* Text may hold U+0000 (a model may write it): text_len is its length; a NUL follows it. */
    if (up->has_text) {
        result->text_len = up->text.len;
        if ((result->text = malloc(up->text.len + 1)) == NULL) {
            pagoda_result_free(result);
            return PAGODA_ENOMEM;
        }
        if (up->text.len > 0)
            memcpy(result->text, up->text.data, up->text.len);
        result->text[up->text.len] = '\0';
    }
    if (up->has_stop_string) {
        if ((result->stop_string = malloc(up->stop_string.len + 1)) == NULL) {
            pagoda_result_free(result);
            return PAGODA_ENOMEM;
        }
        if (up->stop_string.len > 0)
            memcpy(result->stop_string, up->stop_string.data, up->stop_string.len);
        result->stop_string[up->stop_string.len] = '\0';
    }
    result->has_stop_token_id = up->has_stop_token_id;
    result->stop_token_id = up->stop_token_id;
    return 0;
}

int pagoda_submit(pagoda_client *c, const pagoda_generate_params *params, const int32_t *prompt,
                  size_t n, uint8_t request_id_out[PAGODA_REQUEST_ID_BYTES])
{
    if (n > 0 && prompt == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit: NULL argument");
    if (n == 0)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit: the prompt is empty");
    pagoda_prompt p = pagoda_prompt_default();
    p.token_ids = prompt;
    p.num_token_ids = n;
    return pagoda_submit_prompt(c, params, &p, request_id_out);
}

int client_submit_build(struct client_submit *cs, const pagoda_generate_params *params,
                        const pagoda_prompt *prompt, const uint8_t id[PAGODA_REQUEST_ID_BYTES])
{
    memset(cs, 0, sizeof(*cs));
    if (params == NULL || prompt == NULL ||
        (prompt->num_token_ids > 0 && prompt->token_ids == NULL) ||
        (prompt->num_messages > 0 && prompt->messages == NULL) ||
        (params->num_stop_token_ids > 0 && params->stop_token_ids == NULL) ||
        (params->num_logit_bias > 0 &&
         (params->logit_bias_ids == NULL || params->logit_bias_values == NULL)) ||
        (params->num_stop > 0 && params->stop == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit: NULL argument");
    int forms = (prompt->num_token_ids > 0) + (prompt->text != NULL) + (prompt->num_messages > 0);
    if (forms == 0)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit: the prompt is empty");
    if (forms > 1)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit: give one of token ids, text and "
                                               "messages");
    if (params->max_tokens < 1)
        return pagoda_error_set(PAGODA_ERANGE, "pagoda_submit: max_tokens %d must be >= 1",
                                (int)params->max_tokens);
    if (params->min_tokens < 0 || params->min_tokens > params->max_tokens)
        return pagoda_error_set(PAGODA_ERANGE,
                                "pagoda_submit: min_tokens %d must be in [0, max_tokens %d]",
                                (int)params->min_tokens, (int)params->max_tokens);
    /* the ids' vocabulary and the values' range are the router's to check (it knows the model) */
    if (params->num_logit_bias > PAGODA_MAX_LOGIT_BIAS)
        return pagoda_error_set(PAGODA_ERANGE, "pagoda_submit: %zu logit bias pairs, more than %u",
                                params->num_logit_bias, PAGODA_MAX_LOGIT_BIAS);
    memcpy(cs->id, id, PAGODA_REQUEST_ID_BYTES);
    Pagoda__SamplingParams sp = PAGODA__SAMPLING_PARAMS__INIT;
    const unsigned model = params->model_defaults;
    sp.has_temperature = !(model & PAGODA_PARAM_TEMPERATURE);
    sp.has_top_p = !(model & PAGODA_PARAM_TOP_P);
    sp.has_top_k = !(model & PAGODA_PARAM_TOP_K);
    sp.has_min_p = !(model & PAGODA_PARAM_MIN_P);
    sp.has_repetition_penalty = !(model & PAGODA_PARAM_REPETITION_PENALTY);
    sp.has_presence_penalty = sp.has_frequency_penalty = 1;
    sp.temperature = params->temperature;
    sp.top_p = params->top_p;
    sp.top_k = params->top_k;
    sp.min_p = params->min_p;
    sp.repetition_penalty = params->repetition_penalty;
    sp.presence_penalty = params->presence_penalty;
    sp.frequency_penalty = params->frequency_penalty;
    sp.has_seed = params->has_seed != 0;
    sp.seed = params->seed;
    sp.has_logprobs = 1;
    sp.logprobs = params->logprobs != 0;
    /* sent only when asked for, so that a router without them sees the Submit it knew */
    sp.n_logit_bias_token_ids = sp.n_logit_bias_values = params->num_logit_bias;
    sp.logit_bias_token_ids = (int32_t *)params->logit_bias_ids;
    sp.logit_bias_values = (float *)params->logit_bias_values;
    sp.has_min_tokens = params->min_tokens > 0;
    sp.min_tokens = params->min_tokens;
    cs->sp = sp;
    Pagoda__SubmitRequest sub = PAGODA__SUBMIT_REQUEST__INIT;
    sub.has_request_id = 1;
    sub.request_id.data = cs->id;
    sub.request_id.len = PAGODA_REQUEST_ID_BYTES;
    sub.n_prompt_token_ids = prompt->num_token_ids;
    sub.prompt_token_ids = (int32_t *)prompt->token_ids;
    if (prompt->text != NULL) {
        sub.has_prompt_text = 1;
        sub.prompt_text.data = (uint8_t *)prompt->text;
        sub.prompt_text.len = strlen(prompt->text);
    }
    sub.has_max_tokens = 1;
    sub.max_tokens = params->max_tokens;
    sub.has_strict_max_tokens = params->strict_max_tokens != 0;
    sub.strict_max_tokens = params->strict_max_tokens != 0;
    sub.n_stop_token_ids = params->num_stop_token_ids;
    sub.stop_token_ids = (int32_t *)params->stop_token_ids;
    sub.has_ignore_eos = 1;
    sub.ignore_eos = params->ignore_eos != 0;
    if (params->num_stop > PAGODA_MAX_STOP_STRINGS)
        return pagoda_error_set(PAGODA_ERANGE, "pagoda_submit: %zu stop strings, more than %u",
                                params->num_stop, PAGODA_MAX_STOP_STRINGS);
    for (size_t i = 0; i < params->num_stop; i++) {
        if (params->stop[i] == NULL)
            return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit: stop string %zu is NULL", i);
        cs->stops[i].data = (uint8_t *)params->stop[i];
        cs->stops[i].len = strlen(params->stop[i]);
    }
    sub.n_stop = params->num_stop;
    sub.stop = cs->stops;
    if (params->detokenize >= 0) {
        sub.has_detokenize = 1;
        sub.detokenize = params->detokenize != 0;
    }
    sub.has_skip_special_tokens = 1;
    sub.skip_special_tokens = params->skip_special_tokens != 0;
    sub.has_include_stop_str_in_output = params->include_stop_str_in_output != 0;
    sub.include_stop_str_in_output = params->include_stop_str_in_output != 0;
    if (prompt->add_special_tokens >= 0) {
        sub.has_add_special_tokens = 1;
        sub.add_special_tokens = prompt->add_special_tokens != 0;
    }
    if (prompt->num_messages > 0) {
        cs->store = calloc(prompt->num_messages, sizeof(*cs->store));
        cs->messages = calloc(prompt->num_messages, sizeof(*cs->messages));
        if (cs->store == NULL || cs->messages == NULL) {
            client_submit_fini(cs);
            return PAGODA_ENOMEM;
        }
        for (size_t i = 0; i < prompt->num_messages; i++) {
            const pagoda_chat_message *m = &prompt->messages[i];
            if (m->role == NULL) {
                client_submit_fini(cs);
                return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit: message %zu has no role", i);
            }
            Pagoda__ChatMessage init = PAGODA__CHAT_MESSAGE__INIT;
            cs->store[i] = init;
            cs->store[i].role = (char *)m->role;
            if (m->content != NULL) {
                cs->store[i].has_content = 1;
                cs->store[i].content.data = (uint8_t *)m->content;
                cs->store[i].content.len = strlen(m->content);
            } else if (m->content_absent) {
                cs->store[i].has_content_absent = cs->store[i].content_absent = 1;
            }
            cs->store[i].name = (char *)m->name;
            cs->store[i].tool_call_id = (char *)m->tool_call_id;
            cs->store[i].tool_calls_json = (char *)m->tool_calls_json;
            cs->store[i].reasoning_content = (char *)m->reasoning_content;
            cs->messages[i] = &cs->store[i];
        }
        sub.n_messages = prompt->num_messages;
        sub.messages = cs->messages;
        sub.has_add_generation_prompt = 1;
        sub.add_generation_prompt = prompt->add_generation_prompt != 0;
        sub.chat_template_kwargs = (char *)prompt->chat_template_kwargs;
        sub.tools_json = (char *)prompt->tools_json;
    }
    /* sent with any prompt: the router refuses it without a chat */
    sub.has_continue_final_message = prompt->continue_final_message != 0;
    sub.continue_final_message = prompt->continue_final_message != 0;
    cs->sub = sub;
    cs->sub.sampling = &cs->sp;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    cs->req = req;
    cs->req.call_case = PAGODA__CLIENT_REQUEST__CALL_SUBMIT;
    cs->req.submit = &cs->sub;
    return 0;
}

void client_poll_build(struct client_id_call *m, const uint8_t id[PAGODA_REQUEST_ID_BYTES],
                       uint32_t offset, uint32_t wait_ms)
{
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    Pagoda__PollRequest poll = PAGODA__POLL_REQUEST__INIT;
    m->req = req;
    m->poll = poll;
    m->poll.has_request_id = 1;
    m->poll.request_id.data = (uint8_t *)id;
    m->poll.request_id.len = PAGODA_REQUEST_ID_BYTES;
    m->poll.has_offset = 1;
    m->poll.offset = offset;
    m->poll.has_wait_ms = 1;
    m->poll.wait_ms = wait_ms;
    m->req.call_case = PAGODA__CLIENT_REQUEST__CALL_POLL;
    m->req.poll = &m->poll;
}

void client_cancel_build(struct client_id_call *m, const uint8_t id[PAGODA_REQUEST_ID_BYTES])
{
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    Pagoda__CancelRequest cancel = PAGODA__CANCEL_REQUEST__INIT;
    m->req = req;
    m->cancel = cancel;
    m->cancel.has_request_id = 1;
    m->cancel.request_id.data = (uint8_t *)id;
    m->cancel.request_id.len = PAGODA_REQUEST_ID_BYTES;
    m->req.call_case = PAGODA__CLIENT_REQUEST__CALL_CANCEL;
    m->req.cancel = &m->cancel;
}

void client_submit_fini(struct client_submit *cs)
{
    free(cs->store);
    free(cs->messages);
    cs->store = NULL;
    cs->messages = NULL;
}

static int new_request_id(uint8_t id[PAGODA_REQUEST_ID_BYTES])
{
    if (getrandom(id, PAGODA_REQUEST_ID_BYTES, 0) != (ssize_t)PAGODA_REQUEST_ID_BYTES)
        return pagoda_error_set(PAGODA_EIO, "getrandom failed: no request id");
    return 0;
}

/* Submits the request of id (drawn by the caller). */
static int submit_id(pagoda_client *c, const pagoda_generate_params *params,
                     const pagoda_prompt *prompt, const uint8_t id[PAGODA_REQUEST_ID_BYTES])
{
    struct client_submit cs;
    int rc = client_submit_build(&cs, params, prompt, id);
    if (rc != 0)
        return rc;
    Pagoda__ClientResponse *resp = NULL;
    if ((rc = call(c, &cs.req, 0, &resp)) == 0) {
        pagoda_result ack;
        rc = client_result_from_update(resp, id, &ack);
        pagoda__client_response__free_unpacked(resp, NULL);
        pagoda_result_free(&ack);
    }
    client_submit_fini(&cs);
    return rc;
}

int pagoda_submit_prompt(pagoda_client *c, const pagoda_generate_params *params,
                         const pagoda_prompt *prompt,
                         uint8_t request_id_out[PAGODA_REQUEST_ID_BYTES])
{
    if (c == NULL || request_id_out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit: NULL argument");
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    int rc = new_request_id(id);
    if (rc == 0 && (rc = submit_id(c, params, prompt, id)) == 0)
        memcpy(request_id_out, id, sizeof(id));
    return rc;
}

int pagoda_poll(pagoda_client *c, const uint8_t request_id[PAGODA_REQUEST_ID_BYTES],
                uint32_t offset, uint32_t wait_ms, pagoda_result *result)
{
    if (c == NULL || request_id == NULL || result == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_poll: NULL argument");
    memset(result, 0, sizeof(*result));
    if (wait_ms > PAGODA_POLL_WAIT_MS_MAX)
        wait_ms = PAGODA_POLL_WAIT_MS_MAX;
    struct client_id_call m;
    client_poll_build(&m, request_id, offset, wait_ms);
    Pagoda__ClientResponse *resp = NULL;
    int rc = call(c, &m.req, wait_ms, &resp);
    if (rc != 0)
        return rc;
    rc = client_result_from_update(resp, request_id, result);
    pagoda__client_response__free_unpacked(resp, NULL);
    if (rc == 0 && result->num_tokens > 0 && result->offset != offset) {
        pagoda_result_free(result);
        rc = pagoda_error_set(PAGODA_EPROTO, "asked for tokens from %u, the router sent from %u",
                              offset, result->offset);
    }
    return rc;
}

int pagoda_cancel(pagoda_client *c, const uint8_t request_id[PAGODA_REQUEST_ID_BYTES],
                  pagoda_result *result)
{
    if (c == NULL || request_id == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_cancel: NULL argument");
    struct client_id_call m;
    client_cancel_build(&m, request_id);
    Pagoda__ClientResponse *resp = NULL;
    int rc = call(c, &m.req, 0, &resp);
    if (rc != 0)
        return rc;
    pagoda_result state;
    rc = client_result_from_update(resp, request_id, &state);
    pagoda__client_response__free_unpacked(resp, NULL);
    if (rc == 0 && result != NULL)
        *result = state;
    else
        pagoda_result_free(&state);
    return rc;
}

int pagoda_result_append(pagoda_result *all, const pagoda_result *piece, int with_logprobs)
{
    if (all == NULL || piece == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_result_append: NULL argument");
    /* The tokens first: their text ends move by the text the whole has before this piece's. */
    if (piece->num_tokens > 0) {
        size_t n = all->num_tokens + piece->num_tokens;
        if (piece->token_text_ends != NULL &&
            (all->num_tokens == 0 || all->token_text_ends != NULL) &&
            all->text_len + piece->text_len <= UINT32_MAX) {
            uint32_t *e = realloc(all->token_text_ends, n * sizeof(*e));
            if (e == NULL)
                return pagoda_error_set(PAGODA_ENOMEM, "pagoda_result_append: text ends");
            all->token_text_ends = e;
            for (size_t i = 0; i < piece->num_tokens; i++)
                e[all->num_tokens + i] = (uint32_t)all->text_len + piece->token_text_ends[i];
        } else {
            free(all->token_text_ends);
            all->token_text_ends = NULL;
        }
        int32_t *t = realloc(all->token_ids, n * sizeof(*t));
        if (t == NULL)
            return pagoda_error_set(PAGODA_ENOMEM, "pagoda_result_append: token ids");
        all->token_ids = t;
        memcpy(t + all->num_tokens, piece->token_ids, piece->num_tokens * sizeof(*t));
        if (with_logprobs) {
            float *l = realloc(all->logprobs, n * sizeof(*l));
            if (l == NULL)
                return pagoda_error_set(PAGODA_ENOMEM, "pagoda_result_append: logprobs");
            all->logprobs = l;
            for (size_t i = 0; i < piece->num_tokens; i++)
                l[all->num_tokens + i] = piece->logprobs ? piece->logprobs[i] : 0.0f;
        }
        all->num_tokens = n;
    }
    if (piece->text == NULL)
        return 0;
    /* Text that comes without a token (released by a finish of its own: a cancel, an error)
     * joins the last token's piece. */
    if (piece->num_tokens == 0 && all->token_text_ends != NULL && all->num_tokens > 0 &&
        all->text_len + piece->text_len <= UINT32_MAX)
        all->token_text_ends[all->num_tokens - 1] = (uint32_t)(all->text_len + piece->text_len);
    char *t = realloc(all->text, all->text_len + piece->text_len + 1);
    if (t == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "pagoda_result_append: text");
    memcpy(t + all->text_len, piece->text, piece->text_len);
    all->text = t;
    all->text_len += piece->text_len;
    t[all->text_len] = '\0';
    return 0;
}

/* Returns PAGODA_ECLOSED, adding nothing, once the client's generations were cancelled. */
static int live_add(pagoda_client *c, struct live_generation *g)
{
    pthread_mutex_lock(&c->live_lock);
    if (atomic_load(&c->generations_cancelled)) {
        pthread_mutex_unlock(&c->live_lock);
        return pagoda_error_set(PAGODA_ECLOSED, "the client's generations were cancelled");
    }
    g->prev = NULL;
    g->next = c->live;
    if (c->live != NULL)
        c->live->prev = g;
    c->live = g;
    pthread_mutex_unlock(&c->live_lock);
    return 0;
}

static void live_remove(pagoda_client *c, struct live_generation *g)
{
    pthread_mutex_lock(&c->live_lock);
    if (g->prev != NULL)
        g->prev->next = g->next;
    else
        c->live = g->next;
    if (g->next != NULL)
        g->next->prev = g->prev;
    pthread_mutex_unlock(&c->live_lock);
}

int pagoda_client_cancel_generations(pagoda_client *c)
{
    if (c == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_client_cancel_generations: NULL client");
    pthread_mutex_lock(&c->live_lock);
    atomic_store(&c->generations_cancelled, 1);
    size_t n = 0;
    for (struct live_generation *g = c->live; g != NULL; g = g->next)
        n++;
    uint8_t(*ids)[PAGODA_REQUEST_ID_BYTES] = n > 0 ? malloc(n * sizeof(*ids)) : NULL;
    if (n > 0 && ids == NULL) {
        pthread_mutex_unlock(&c->live_lock);
        return PAGODA_ENOMEM;
    }
    size_t i = 0;
    for (struct live_generation *g = c->live; g != NULL; g = g->next)
        memcpy(ids[i++], g->id, PAGODA_REQUEST_ID_BYTES);
    pthread_mutex_unlock(&c->live_lock);
    /* Outside the lock: a cancel waits for the router. A request that ended meanwhile answers
     * with its end (or is gone): nothing to report. */
    int rc = 0;
    for (i = 0; i < n; i++) {
        int r = pagoda_cancel(c, ids[i], NULL);
        /* A starting router: again (each try may wait up to 2 s for its announcement, and it
         * answers so for at most 20 s after its start: docs/protocol.md). */
        for (int k = 0; r == PAGODA_EBUSY && k < 50; k++) {
            nng_msleep(50);
            r = pagoda_cancel(c, ids[i], NULL);
        }
        if (r != 0 && r != PAGODA_ENOENT && rc == 0)
            rc = r;
    }
    free(ids);
    return rc != 0 ? rc : (int)n;
}

/* A generate call that gives up on its request (a poll failed, an answer it cannot take)
 * cancels it, as a client that goes away does with vLLM's server: else it would run on, holding
 * its tenant's slots. Not after a timeout: the router is unreachable or too slow to answer, the
 * cancel would only wait as long again, and the router cancels a request nobody polls anyway
 * (router.h ROUTER_DEFAULT_ABANDON_MS). rc and its detail are kept. */
static int give_up(pagoda_client *c, const uint8_t id[PAGODA_REQUEST_ID_BYTES], int rc)
{
    if (rc == PAGODA_ETIMEDOUT)
        return rc;
    char detail[256];
    snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
    (void)pagoda_cancel(c, id, NULL);
    return pagoda_error_set(rc, "%s", detail);
}

static int generate_polls(pagoda_client *c, const pagoda_generate_params *params,
                          pagoda_stream_fn on_tokens, pagoda_piece_fn on_piece, void *user,
                          pagoda_result *result);

/* Submits and polls until the request ends, handing each piece to on_tokens or on_piece. */
static int generate(pagoda_client *c, const pagoda_generate_params *params,
                    const pagoda_prompt *prompt, pagoda_stream_fn on_tokens,
                    pagoda_piece_fn on_piece, void *user, pagoda_result *result)
{
    if (c == NULL || result == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_generate: NULL argument");
    memset(result, 0, sizeof(*result));
    /* Registered before its Submit, so that pagoda_client_cancel_generations finds it however
     * early it comes (a Ctrl-C while the Submit is on its way). */
    struct live_generation g;
    int rc = new_request_id(g.id);
    if (rc != 0 || (rc = live_add(c, &g)) != 0)
        return rc;
    if ((rc = submit_id(c, params, prompt, g.id)) == 0) {
        memcpy(result->request_id, g.id, PAGODA_REQUEST_ID_BYTES);
        /* A cancel of the client's generations while the Submit was on its way found no request
         * at the router yet: this one is cancelled now (live_add refuses the calls after it). */
        if (atomic_load(&c->generations_cancelled))
            (void)pagoda_cancel(c, g.id, NULL);
        if ((rc = generate_polls(c, params, on_tokens, on_piece, user, result)) != 0)
            rc = give_up(c, g.id, rc);
    }
    live_remove(c, &g);
    return rc;
}

/* generate's polls of the submitted request result->request_id, until it ends. */
static int generate_polls(pagoda_client *c, const pagoda_generate_params *params,
                          pagoda_stream_fn on_tokens, pagoda_piece_fn on_piece, void *user,
                          pagoda_result *result)
{
    int rc;
    uint32_t backoff_ms = 0;
    for (;;) {
        pagoda_result piece;
        uint32_t have = (uint32_t)result->num_tokens;
        nng_time asked = nng_clock();
        rc = pagoda_poll(c, result->request_id, have, GENERATE_POLL_WAIT_MS, &piece);
        /* The router is busy (a restarted one whose places for calls naming ids it has not
         * learned yet are taken, or its parked calls at their limit): it asks to poll again,
         * which is what an empty answer leads to as well. */
        int busy = rc == PAGODA_EBUSY;
        if (busy)
            memset(&piece, 0, sizeof(piece));
        else if (rc != 0)
            return rc;
        if (piece.num_tokens == 0 && piece.finish_reason == PAGODA_FINISH_NONE &&
            (busy || nng_clock() - asked < GENERATE_POLL_WAIT_MS / 2)) {
            backoff_ms = backoff_ms == 0 ? GENERATE_BUSY_BACKOFF_FIRST_MS : 2 * backoff_ms;
            if (backoff_ms > GENERATE_BUSY_BACKOFF_MAX_MS)
                backoff_ms = GENERATE_BUSY_BACKOFF_MAX_MS;
            nng_msleep(backoff_ms);
        } else {
            backoff_ms = 0;
        }
        if (piece.num_tokens > 0 && (piece.num_tokens > (size_t)params->max_tokens - have)) {
            pagoda_result_free(&piece);
            return pagoda_error_set(PAGODA_EPROTO, "the router sent more than max_tokens (%d)",
                                    (int)params->max_tokens);
        }
        if ((rc = pagoda_result_append(result, &piece, params->logprobs)) != 0) {
            pagoda_result_free(&piece);
            return rc;
        }
        if (piece.num_tokens > 0 && on_tokens != NULL)
            on_tokens(user, have, piece.token_ids, piece.logprobs, piece.num_tokens);
        if ((piece.num_tokens > 0 || piece.text_len > 0 ||
             piece.finish_reason != PAGODA_FINISH_NONE) &&
            on_piece != NULL)
            on_piece(user, &piece);
        if (piece.finish_reason != PAGODA_FINISH_NONE) {
            result->finish_reason = piece.finish_reason;
            result->prompt_tokens = piece.prompt_tokens;
            result->completion_tokens = piece.completion_tokens;
            result->cached_tokens = piece.cached_tokens;
            result->error_message = piece.error_message;
            result->stop_string = piece.stop_string;
            result->has_stop_token_id = piece.has_stop_token_id;
            result->stop_token_id = piece.stop_token_id;
            piece.error_message = piece.stop_string = NULL;
            pagoda_result_free(&piece);
            return 0;
        }
        pagoda_result_free(&piece);
    }
}

int pagoda_generate_stream(pagoda_client *c, const pagoda_generate_params *params,
                           const int32_t *prompt, size_t n, pagoda_stream_fn on_tokens, void *user,
                           pagoda_result *result)
{
    if (result != NULL)
        memset(result, 0, sizeof(*result));
    if (n > 0 && prompt == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_generate: NULL prompt");
    if (n == 0)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_submit: the prompt is empty");
    pagoda_prompt p = pagoda_prompt_default();
    p.token_ids = prompt;
    p.num_token_ids = n;
    return generate(c, params, &p, on_tokens, NULL, user, result);
}

int pagoda_generate_prompt(pagoda_client *c, const pagoda_generate_params *params,
                           const pagoda_prompt *prompt, pagoda_piece_fn on_piece, void *user,
                           pagoda_result *result)
{
    return generate(c, params, prompt, NULL, on_piece, user, result);
}

int pagoda_generate(pagoda_client *c, const pagoda_generate_params *params, const int32_t *prompt,
                    size_t n, pagoda_result *result)
{
    return pagoda_generate_stream(c, params, prompt, n, NULL, NULL, result);
}

/* The length of the well-formed UTF-8 character at p (at most end - p bytes), or 0 when the
 * bytes there are not one: a stray continuation byte, a truncated sequence, an overlong form, a
 * surrogate or a code point past U+10FFFF. */
static size_t utf8_char_len(const unsigned char *p, const unsigned char *end)
{
    size_t avail = (size_t)(end - p);
    unsigned char b = p[0];
    size_t len;
    uint32_t cp;
    if (b < 0x80)
        return 1;
    if (b >= 0xc2 && b <= 0xdf) {
        len = 2;
        cp = b & 0x1fu;
    } else if (b >= 0xe0 && b <= 0xef) {
        len = 3;
        cp = b & 0x0fu;
    } else if (b >= 0xf0 && b <= 0xf4) {
        len = 4;
        cp = b & 0x07u;
    } else {
        return 0;
    }
    if (avail < len)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3fu);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

/* Copies a router's string into room bytes of dst, NUL-terminated, as text a user can print:
 * protobuf's proto2 strings are not checked, so each byte of invalid UTF-8, each C0 control byte
 * and DEL become '?' (the string is kept, not refused: the figures around it are still worth
 * showing). A string longer than the room is cut before the first character that does not fit
 * whole, never inside one. Reads at most room - 1 characters of src. */
static void copy_router_text(char *dst, size_t room, const char *src)
{
    size_t used = 0;
    if (src != NULL) {
        const unsigned char *p = (const unsigned char *)src;
        const unsigned char *end = p + strnlen(src, room * 4);
        while (p < end) {
            size_t len = utf8_char_len(p, end);
            int replace = len == 0 || (len == 1 && (*p < 0x20 || *p == 0x7f));
            size_t out_len = replace ? 1 : len;
            if (used + out_len > room - 1)
                break;
            if (replace)
                dst[used] = '?';
            else
                memcpy(dst + used, p, len);
            used += out_len;
            p += replace ? 1 : len;
        }
    }
    dst[used] = '\0';
}

/* Whether index is already among the first n engines kept in out. */
static int engine_kept(const pagoda_engine_stats *out, uint32_t index)
{
    for (uint32_t i = 0; i < out->num_engines; i++)
        if (out->engines[i].engine == index)
            return 1;
    return 0;
}

void client_stats_from_proto(const Pagoda__Stats *s, pagoda_engine_stats *out)
{
    memset(out, 0, sizeof(*out));
    out->running = s->running;
    out->waiting = s->waiting;
    out->peak_running = s->peak_running;
    out->kv_usage = s->kv_usage;
    out->prefix_hit_rate = s->prefix_hit_rate;
    out->fragmentation = s->fragmentation;
    out->preemptions = s->preemptions;
    out->steps = s->steps;
    out->resyncs = s->resyncs;
    out->worker_restarts = s->worker_restarts;
    out->num_blocks = s->num_blocks;
    out->free_blocks = s->free_blocks;
    out->computed_tokens = s->computed_tokens;
    out->malformed_messages = s->malformed_messages;
    out->step_cpu_us = s->step_cpu_us;
    out->steps_in_flight = s->steps_in_flight;
    out->peak_steps_in_flight = s->peak_steps_in_flight;
    out->discarded_tokens = s->discarded_tokens;
    out->worker_step_wall_us = s->worker_step_wall_us;
    out->worker_step_device_us = s->worker_step_device_us;
    out->worker_steps_timed = s->worker_steps_timed;
    out->worker_step_wall_us_total = s->worker_step_wall_us_total;
    out->worker_step_device_us_total = s->worker_step_device_us_total;
    out->cached_blocks = s->cached_blocks;
    out->pinned_blocks = s->pinned_blocks;
    out->peak_kv_usage = s->peak_kv_usage;
    out->prefix_query_tokens = s->prefix_query_tokens;
    out->prefix_hit_tokens = s->prefix_hit_tokens;
    out->evictions = s->evictions;
    out->prefix_waits = s->prefix_waits;
    out->live_requests = s->live_requests;
    out->finished_requests = s->finished_requests;
    out->malformed_requests = s->malformed_requests;
    out->duplicate_submits = s->duplicate_submits;
    out->scheduler_connected = s->scheduler_connected;
    out->prefill_tokens = s->prefill_tokens;
    out->decode_tokens = s->decode_tokens;
    out->locality = s->locality;
    out->locality_run_length = s->locality_run_length;
    out->router_drops = s->router_drops;
    out->router_resends = s->router_resends;
    out->event_gaps = s->event_gaps;
    out->text_jobs = s->text_jobs;
    copy_router_text(out->tenant, sizeof(out->tenant), s->tenant);
    copy_router_text(out->routing, sizeof(out->routing), s->routing);
    copy_router_text(out->kv_cache_dtype, sizeof(out->kv_cache_dtype), s->kv_cache_dtype);
    /* An entry that cannot be told apart (no index, an index past the list, one seen already) is
     * dropped and counted with those past the room: the router's other figures still stand. */
    for (size_t i = 0; i < s->n_engines; i++) {
        const Pagoda__EngineStats *e = s->engines[i];
        if (e == NULL || !e->has_engine || e->engine >= s->n_engines ||
            out->num_engines == PAGODA_STATS_MAX_ENGINES || engine_kept(out, e->engine)) {
            if (out->engines_dropped < UINT32_MAX)
                out->engines_dropped++;
            continue;
        }
        pagoda_engine_info *d = &out->engines[out->num_engines++];
        d->engine = e->engine;
        copy_router_text(d->address, sizeof(d->address), e->address);
        d->connected = e->connected;
        d->load = e->load;
        d->running = e->running;
        d->waiting = e->waiting;
        d->prefix_query_tokens = e->prefix_query_tokens;
        d->prefix_hit_tokens = e->prefix_hit_tokens;
        d->routed = e->routed;
        d->prefix_waits = e->prefix_waits;
    }
}

int pagoda_stats(pagoda_client *c, pagoda_engine_stats *out)
{
    if (c == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_stats: NULL argument");
    Pagoda__StatsRequest sreq = PAGODA__STATS_REQUEST__INIT;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_STATS;
    req.stats = &sreq;
    Pagoda__ClientResponse *resp = NULL;
    int rc = call(c, &req, 0, &resp);
    if (rc != 0)
        return rc;
    if (resp->result_case != PAGODA__CLIENT_RESPONSE__RESULT_STATS || resp->stats == NULL) {
        pagoda__client_response__free_unpacked(resp, NULL);
        return pagoda_error_set(PAGODA_EPROTO, "the router's reply carries no stats");
    }
    client_stats_from_proto(resp->stats, out);
    pagoda__client_response__free_unpacked(resp, NULL);
    return 0;
}

int pagoda_health(pagoda_client *c, int *healthy)
{
    if (c == NULL || healthy == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_health: NULL argument");
    Pagoda__HealthRequest hreq = PAGODA__HEALTH_REQUEST__INIT;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_HEALTH;
    req.health = &hreq;
    Pagoda__ClientResponse *resp = NULL;
    int rc = call(c, &req, 0, &resp);
    if (rc != 0)
        return rc;
    if (resp->result_case != PAGODA__CLIENT_RESPONSE__RESULT_HEALTHY) {
        pagoda__client_response__free_unpacked(resp, NULL);
        return pagoda_error_set(PAGODA_EPROTO, "the router's reply carries no health");
    }
    *healthy = resp->healthy != 0;
    if (!*healthy)
        pagoda_error_set(PAGODA_EBUSY, "%s",
                         resp->error_message ? resp->error_message : "the router is not healthy");
    pagoda__client_response__free_unpacked(resp, NULL);
    return 0;
}

const char *pagoda_finish_reason_name(pagoda_finish_reason reason)
{
    switch (reason) {
    case PAGODA_FINISH_NONE:
        return "none";
    case PAGODA_FINISH_STOP:
        return "stop";
    case PAGODA_FINISH_LENGTH:
        return "length";
    case PAGODA_FINISH_CANCELLED:
        return "cancelled";
    case PAGODA_FINISH_ERROR:
        return "error";
    }
    return "unknown";
}

void pagoda_request_id_hex(const uint8_t id[PAGODA_REQUEST_ID_BYTES], char out[33])
{
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < PAGODA_REQUEST_ID_BYTES; i++) {
        out[2 * i] = digits[id[i] >> 4];
        out[2 * i + 1] = digits[id[i] & 15];
    }
    out[32] = '\0';
}

int client_call(pagoda_client *c, Pagoda__ClientRequest *req, uint32_t wait_ms,
                Pagoda__ClientResponse **out)
{
    return call(c, req, wait_ms, out);
}
