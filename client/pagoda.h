/* libpagoda: the C client of a pagoda router.
 *
 * One pagoda_client is one NNG REQ socket connected to a router (tcp:// or ipc://). Every call
 * opens its own NNG context on it, so any number of threads may call at once on one client.
 * Calls block the calling thread until the router answers or the client's timeout runs out.
 *
 * Generation is a resumable long poll: pagoda_submit sends the request under a fresh random
 * 128-bit id and returns at once; pagoda_poll(id, offset, wait_ms) returns every output token
 * from offset on as soon as there is at least one (or the request has finished, or the wait ran
 * out). pagoda_generate does both until the request finishes. NNG's REQ resends a call whose
 * reply was lost (a timeout, a reconnection); the router deduplicates Submits by id, and Poll
 * is idempotent, so a resend is harmless.
 *
 * Errors: every function returns 0 or a negative PAGODA_E* code (common/error.h); the calling
 * thread's pagoda_error_detail() then says what went wrong (for an error the router reported,
 * its message). */
#ifndef PAGODA_CLIENT_PAGODA_H
#define PAGODA_CLIENT_PAGODA_H

#include "common/error.h"

#include <stddef.h>
#include <stdint.h>

#define PAGODA_REQUEST_ID_BYTES 16
#define PAGODA_DEFAULT_URL "tcp://127.0.0.1:7450"
/* The router clamps a poll's wait to this. */
#define PAGODA_POLL_WAIT_MS_MAX 30000u
/* The longest the router lets a Tokenize call wait for its job (ROUTER_TEXT_CALL_TIMEOUT_MS):
 * the client waits that long plus its timeout before a resend or giving up, so that a slow
 * tokenization is not sent twice. */
#define PAGODA_TOKENIZE_WAIT_MS 30000u
/* The default time a call may take beyond its poll wait (connecting included). */
#define PAGODA_DEFAULT_TIMEOUT_MS 30000u
/* The longest timeout a client takes (a day): with the waits added it still fits NNG's signed
 * 32-bit milliseconds. */
#define PAGODA_MAX_TIMEOUT_MS 86400000u
/* The default time NNG's REQ waits for a call's reply beyond its poll wait before it sends the
 * call again: long enough that a busy router is not asked twice, short enough that a lost reply
 * costs little. pagoda_client_set_resend_ms clamps to the maximum. */
#define PAGODA_DEFAULT_RESEND_MS 5000u
#define PAGODA_MAX_RESEND_MS 3600000u
/* The longest API key pagoda_client_set_api_key accepts. */
#define PAGODA_MAX_API_KEY_BYTES 256u
/* Room for a tenant's name in pagoda_engine_stats (names are at most 63 bytes). */
#define PAGODA_STATS_TENANT_BYTES 64u
/* Per-engine figures in pagoda_engine_stats: at most PAGODA_STATS_MAX_ENGINES engines (the
 * router's own limit, ROUTE_MAX_ENGINES, is the same 64, so none is dropped today), addresses
 * of at most PAGODA_STATS_ADDRESS_BYTES - 1 bytes (NNG's own NNG_MAXADDRLEN; a longer tcp://
 * host name is cut, on a UTF-8 character boundary) and a routing name of at most
 * PAGODA_STATS_ROUTING_BYTES - 1. pagoda_stats fills the caller's struct (pagoda_async.h's
 * result holds one by pointer, for a stats call only), so the room is kept small (~12 KiB). */
#define PAGODA_STATS_MAX_ENGINES 64u
#define PAGODA_STATS_ADDRESS_BYTES 128u
#define PAGODA_STATS_ROUTING_BYTES 32u
/* Room for pagoda_engine_stats.kv_cache_dtype ("float8_e4m3fn" and the like). */
#define PAGODA_STATS_DTYPE_BYTES 32u
/* The most stop strings a request may have (the router's limit). */
#define PAGODA_MAX_STOP_STRINGS 16u
/* The most (token id, value) pairs of a request's logit bias, and the largest value's magnitude
 * (the router's limits: kernels/cpu/logit_bias.h SAMPLING_LOGIT_BIAS_MAX and _LIMIT). */
#define PAGODA_MAX_LOGIT_BIAS 300u
#define PAGODA_LOGIT_BIAS_LIMIT 100.0f
/* The largest reply the client accepts (NNG_OPT_RECVMAXSZ). */
#define PAGODA_MAX_REPLY_BYTES (64u << 20)

typedef struct pagoda_client pagoda_client;

/* How a request ended (pagoda.proto FinishReason). */
typedef enum pagoda_finish_reason {
    PAGODA_FINISH_NONE = 0,   /* still running */
    PAGODA_FINISH_STOP = 1,   /* EOS or a stop token id */
    PAGODA_FINISH_LENGTH = 2, /* max_tokens, or the context is full */
    PAGODA_FINISH_CANCELLED = 3,
    PAGODA_FINISH_ERROR = 4, /* the engine failed the request: see pagoda_result.error_message */
} pagoda_finish_reason;

/* What to generate. Start from pagoda_generate_params_default() and change what you need. */
typedef struct pagoda_generate_params {
    float temperature;        /* 0: greedy; otherwise in [1e-6, 100] (docs/sampling.md) */
    float top_p;              /* in (0, 1]; 1: off */
    int32_t top_k;            /* 0: off */
    float min_p;              /* in [0, 1]; 0: off */
    float repetition_penalty; /* in [0.01, 100]; 1: off */
    float presence_penalty;   /* in [-2, 2]; 0: off */
    float frequency_penalty;  /* in [-2, 2]; 0: off */
    int has_seed;             /* 0: the router draws a seed */
    uint64_t seed;
    int32_t max_tokens; /* at least 1 */
    /* 1: a prompt plus max_tokens past the model's context is refused (PAGODA_ERANGE), as
     * OpenAI's API refuses an explicit max_tokens; 0 (the default): the request ends by length
     * (PAGODA_FINISH_LENGTH) when the context is full. */
    int strict_max_tokens;
    const int32_t *stop_token_ids; /* borrowed for the call; NULL when num_stop_token_ids is 0 */
    size_t num_stop_token_ids;
    int ignore_eos;
    int logprobs; /* return the log-probability of every sampled token */
    /* OpenAI's logit_bias: values[i] in [-100, 100] added to token ids[i]'s logit before
     * sampling (at most PAGODA_MAX_LOGIT_BIAS distinct ids of the vocabulary, which the router
     * checks; borrowed for the call; NULL when num_logit_bias is 0). */
    const int32_t *logit_bias_ids;
    const float *logit_bias_values;
    size_t num_logit_bias;
    /* vLLM's min_tokens (>= 0, at most max_tokens, else PAGODA_ERANGE; 0: off): no EOS (unless
     * ignore_eos), stop token id or stop string ends the request before this many output
     * tokens. */
    int32_t min_tokens;
    /* Text (a model with a tokenizer.json): stop strings matched on the output text (borrowed
     * for the call; at most 16 of at most 256 bytes), whether the router returns text (-1: its
     * default, on when the model has a tokenizer; 0 off; 1 on), and whether special tokens are
     * left out of it (1, the default). */
    const char *const *stop;
    size_t num_stop;
    int detokenize;
    int skip_special_tokens;
    /* 1: the stop string that ends the request stays in its text, and so does the text of a stop
     * token id that ends it (vLLM's include_stop_str_in_output); 0 (the default): the text ends
     * before the stop string, and a stop token adds none. */
    int include_stop_str_in_output;
    /* The fields left to the model (PAGODA_PARAM_*, 0 by default): those named are sent absent,
     * and the router samples with what the model's generation_config.json recommends for them
     * (pagoda-router --generation-config auto, as vLLM), or with the defaults above where it
     * names none. Their values here are not sent. */
    unsigned model_defaults;
} pagoda_generate_params;

/* pagoda_generate_params.model_defaults: the fields a model's generation_config.json may give. */
#define PAGODA_PARAM_TEMPERATURE (1u << 0)
#define PAGODA_PARAM_TOP_P (1u << 1)
#define PAGODA_PARAM_TOP_K (1u << 2)
#define PAGODA_PARAM_MIN_P (1u << 3)
#define PAGODA_PARAM_REPETITION_PENALTY (1u << 4)

/* One message of a chat (pagoda.proto ChatMessage): role is required, the rest may be NULL. */
typedef struct pagoda_chat_message {
    const char *role;
    const char *content;
    const char *name;
    const char *tool_call_id;
    const char *tool_calls_json;   /* an assistant's tool calls: a JSON array */
    const char *reasoning_content; /* an assistant's reasoning */
    /* With content NULL: 0 passes a null content (the template's None, as transformers passes
     * a null), 1 none at all (undefined to the template, printed as "": a JSON message without
     * the key). */
    int content_absent;
} pagoda_chat_message;

/* A prompt: exactly one of token ids, text and a chat (rendered by the model's chat template).
 * Text and chats need a model with a tokenizer.json; the router tokenizes them. Start from
 * pagoda_prompt_default(). Everything is borrowed for the call. */
typedef struct pagoda_prompt {
    const int32_t *token_ids;
    size_t num_token_ids;
    const char *text;
    const pagoda_chat_message *messages;
    size_t num_messages;
    int add_generation_prompt;        /* chat: 1 (the default) ends with the assistant's turn */
    const char *chat_template_kwargs; /* chat: a JSON object of template variables, or NULL */
    const char *tools_json;           /* chat: a JSON array of tools, or NULL */
    int add_special_tokens;           /* -1 (default): on for text (BOS), off for chats */
    /* chat: 1 continues the final message (an assistant's answer begun) instead of ending its
     * turn, as transformers' continue_final_message; needs add_generation_prompt 0. */
    int continue_final_message;
} pagoda_prompt;

/* Output of a request, all of it (pagoda_generate) or one piece (pagoda_poll). The arrays belong
 * to the result: release them with pagoda_result_free. */
typedef struct pagoda_result {
    uint8_t request_id[PAGODA_REQUEST_ID_BYTES];
    uint32_t offset;    /* the output index of token_ids[0] */
    int32_t *token_ids; /* num_tokens of them */
    float *logprobs;    /* num_tokens of them when logprobs were asked for, else NULL */
    size_t num_tokens;
    pagoda_finish_reason finish_reason;
    /* Set once the request has finished. */
    uint32_t prompt_tokens, completion_tokens, cached_tokens;
    char *error_message; /* with PAGODA_FINISH_ERROR: why; else NULL */
    /* The text these tokens complete (text_len bytes of UTF-8 and a NUL after them; the text may
     * itself hold U+0000, so use text_len; NULL when the router returns none): a poll's piece,
     * or with pagoda_generate_prompt the whole output. */
    char *text;
    size_t text_len;
    /* With logprobs and text: where each token's piece of text ends (bytes from text's start;
     * num_tokens of them, never decreasing, the last at text_len), token i's piece being
     * text[token_text_ends[i-1], token_text_ends[i]) (from 0 for the first); empty for a token
     * that completes no character or whose text is held back for a stop string
     * (pagoda.proto TokenUpdate.token_text_ends). NULL otherwise. */
    uint32_t *token_text_ends;
    /* With PAGODA_FINISH_STOP: the stop string that ended it (else NULL), or the stop token id
     * (has_stop_token_id); neither for the model's end-of-sequence token. */
    char *stop_string;
    int has_stop_token_id;
    int32_t stop_token_id;
} pagoda_result;

/* One engine's figures as its router sees them (pagoda.proto EngineStats, docs/routing.md). */
typedef struct pagoda_engine_info {
    uint32_t engine;                          /* its index: the order of the router's --scheduler */
    char address[PAGODA_STATS_ADDRESS_BYTES]; /* its scheduler's address */
    int connected;                            /* linked and answering */
    uint64_t load;                            /* what routing sees (docs/routing.md, Load) */
    uint32_t running, waiting;                /* from its latest stats; 0 when it sent none */
    uint64_t prefix_query_tokens, prefix_hit_tokens;
    uint64_t routed;       /* requests the router sent it (moves included) */
    uint64_t prefix_waits; /* as pagoda_engine_stats.prefix_waits, this engine's */
} pagoda_engine_info;

/* The engine's figures (pagoda.proto Stats); a figure the scheduler did not report is 0. With a
 * tenants file, a tenant's key gets its own figures only (tenant is then its name): running,
 * waiting, the prefix_* figures, cached_blocks and evictions of its namespace, live_requests,
 * finished_requests, duplicate_submits and scheduler_connected; the rest stays 0, and the
 * engine's figures need an admin key. */
typedef struct pagoda_engine_stats {
    uint32_t running, waiting, peak_running;
    double kv_usage, prefix_hit_rate, fragmentation;
    uint64_t preemptions, steps, resyncs, worker_restarts;
    int32_t num_blocks, free_blocks;
    uint64_t computed_tokens, malformed_messages;
    double step_cpu_us;
    /* Steps in flight now and at most so far; sampled tokens discarded (their sequence ended or
     * was preempted while a step computed them). */
    uint32_t steps_in_flight, peak_steps_in_flight;
    uint64_t discarded_tokens;
    /* The current worker's mean wall and device time per step (CUDA events; on the CPU its
     * executor thread's CPU time), microseconds. */
    double worker_step_wall_us, worker_step_device_us;
    /* Counters (every worker's, every engine's): step results that carried those times and the
     * sums of their wall and device times, microseconds; differences of two readings give the
     * interval's mean time per step. */
    uint64_t worker_steps_timed, worker_step_wall_us_total, worker_step_device_us_total;
    /* The prefix cache (prefix_hit_rate = prefix_hit_tokens / prefix_query_tokens) and the
     * pool (fragmentation: allocated slots holding no token over allocated slots). */
    uint32_t cached_blocks, pinned_blocks;
    double peak_kv_usage;
    uint64_t prefix_query_tokens, prefix_hit_tokens, evictions;
    /* Requests whose admission waited (once or more) for another running sequence to compute
     * the next block of their prefix, to hit it in the cache instead of computing it beside
     * (the requests behind a waiting one wait too: admission stays in order). */
    uint64_t prefix_waits;
    /* The router's own. */
    uint32_t live_requests, finished_requests;
    uint64_t malformed_requests;
    uint64_t duplicate_submits; /* Submits of an id already held, answered with that request */
    int scheduler_connected;
    char tenant[PAGODA_STATS_TENANT_BYTES]; /* "" for the engine's figures */
    /* The scheduler's work and page locality: prompt and decode tokens computed by acknowledged
     * steps; the share of consecutive logical blocks of running sequences that are physically
     * consecutive in the pool (1 when none has two blocks) and their mean run length. */
    uint64_t prefill_tokens, decode_tokens;
    double locality, locality_run_length;
    /* Lost events (docs/protocol.md): the scheduler's messages to the router that the link
     * refused and the resends of every request held that made them good; the events the router
     * ignored for coming from beyond the output it held. */
    uint64_t router_drops, router_resends, event_gaps;
    /* Text jobs the router's threads have run: text Submits' and Tokenize calls' prompts
     * rendered and tokenized, Detokenize calls' ids decoded. */
    uint64_t text_jobs;
    /* A router with several engines (its figures above are their sums, docs/routing.md): the
     * routing in force ("cache-aware" or "round-robin") and each engine's figures, in engine
     * order. A router with one engine sends neither: routing is "" and num_engines 0. The first
     * PAGODA_STATS_MAX_ENGINES engines are kept; engines_dropped counts those left out, and
     * entries that cannot be told apart (no index, an index not below the number of entries, an
     * index seen already), which are dropped rather than failing the call. The router's strings
     * (tenant, routing, address) are printable: each byte of invalid UTF-8, C0 control byte and
     * DEL is replaced with '?'. */
    char routing[PAGODA_STATS_ROUTING_BYTES];
    uint32_t num_engines, engines_dropped;
    pagoda_engine_info engines[PAGODA_STATS_MAX_ENGINES];
    /* The engines' K/V element in torch's spelling: "bfloat16" (the GPU's default), "float8_e4m3fn"
     * (--kv-cache-dtype fp8), "float32" (the CPU's); "" when the engines differ, none has said, or
     * for a tenant's key. Printable as the router's other strings. */
    char kv_cache_dtype[PAGODA_STATS_DTYPE_BYTES];
} pagoda_engine_stats;

/* Temperature 1 with every filter and penalty off, no seed (the router draws one), max_tokens
 * 16, no stop ids or strings, EOS honoured, no logprobs, no logit bias, min_tokens 0, the
 * router's text default. */
pagoda_generate_params pagoda_generate_params_default(void);

/* No prompt yet, add_generation_prompt 1, add_special_tokens -1. */
pagoda_prompt pagoda_prompt_default(void);

/* Connects to the router at url (tcp://HOST:PORT or ipc://PATH). The connection is made in the
 * background and remade when it breaks, so this succeeds before the router is up; calls wait
 * for it up to their timeout. On success *out is released with pagoda_client_close. Errors:
 * PAGODA_EINVAL (a bad url), PAGODA_ENOMEM, PAGODA_EIO. */
int pagoda_client_open(const char *url, pagoda_client **out);

/* Closes the socket and frees the client. No call may be running on it. Accepts NULL. */
/* 1 while the client holds a connection to the router, 0 while it dials or dials again (the
 * router not started yet, or restarting): a call made then waits for the router, up to the
 * client's timeout. For a health check that must not wait (pagoda-gateway's /health). */
int pagoda_client_connected(pagoda_client *c);

void pagoda_client_close(pagoda_client *c);

/* Cancels the request of every pagoda_generate* call running on c now, from another thread (a
 * thread that waits for SIGINT, say, as the pagoda CLI does), as the client shuts down: each of
 * those calls returns when its request has ended, with PAGODA_FINISH_CANCELLED unless it ended
 * first (one whose Submit is on its way cancels once it is answered), and a generate call started
 * afterwards returns PAGODA_ECLOSED without submitting. (A generate call that gives up on its
 * request itself, a poll failing, cancels it too.) Returns how many requests it cancelled (0: no
 * generate call was running), or an error: the first cancel's that failed for another reason
 * than the request being gone (PAGODA_ETIMEDOUT when the router cannot be reached, ...),
 * PAGODA_EINVAL, PAGODA_ENOMEM. */
int pagoda_client_cancel_generations(pagoda_client *c);

/* Sets how long a call may take beyond its poll wait (default PAGODA_DEFAULT_TIMEOUT_MS, at
 * least 1, at most PAGODA_MAX_TIMEOUT_MS: larger values are capped). A call that runs out
 * returns PAGODA_ETIMEDOUT. Not to be changed while calls run. */
void pagoda_client_set_timeout_ms(pagoda_client *c, uint32_t timeout_ms);

/* Sets how long a call waits for its reply, beyond its poll wait, before NNG's REQ sends it again
 * on the same or a new connection (default PAGODA_DEFAULT_RESEND_MS; 0 counts as 1, more than
 * PAGODA_MAX_RESEND_MS as that). A resend is harmless (the router answers a resent Submit with
 * the request it already holds, and Poll is idempotent), so a short time only costs traffic:
 * tests use one to make the router receive duplicates. Not to be changed while calls run. */
void pagoda_client_set_resend_ms(pagoda_client *c, uint32_t resend_ms);

/* Sets the API key sent with every later call (the router maps it to a tenant); NULL sends
 * none. The key is copied. Not to be changed while calls run. Errors: PAGODA_EINVAL (c is
 * NULL), PAGODA_ERANGE (longer than PAGODA_MAX_API_KEY_BYTES), PAGODA_ENOMEM. */
int pagoda_client_set_api_key(pagoda_client *c, const char *api_key);

/* Submits a request for prompt (n token ids) under a new random id, written to request_id_out.
 * Returns once the router has registered it. Errors: PAGODA_EINVAL or PAGODA_ERANGE (params or
 * prompt refused, by the client or the router), PAGODA_EEXHAUSTED (the router is full),
 * PAGODA_ECLOSED (the router is draining), PAGODA_ETIMEDOUT, PAGODA_ENOMEM, PAGODA_EIO. */
int pagoda_submit(pagoda_client *c, const pagoda_generate_params *params, const int32_t *prompt,
                  size_t n, uint8_t request_id_out[PAGODA_REQUEST_ID_BYTES]);

/* pagoda_submit for any prompt (token ids, text or a chat). Errors as pagoda_submit, and
 * PAGODA_EUNSUPPORTED (text or a chat to a model without a tokenizer or chat template). A text
 * that the router cannot tokenize or a template error does not fail the submit: the request ends
 * with PAGODA_FINISH_ERROR and the reason in its result's error_message. */
int pagoda_submit_prompt(pagoda_client *c, const pagoda_generate_params *params,
                         const pagoda_prompt *prompt,
                         uint8_t request_id_out[PAGODA_REQUEST_ID_BYTES]);

/* Fetches the request's output from offset on, waiting up to wait_ms (clamped to
 * PAGODA_POLL_WAIT_MS_MAX) for at least one token or the end. *result is overwritten (free an
 * earlier result in it first) and is the caller's to free with pagoda_result_free. An empty result
 * with PAGODA_FINISH_NONE means the wait ran out. Errors: PAGODA_ENOENT (unknown id, or the result
 * expired), PAGODA_ERANGE (offset beyond the output), PAGODA_ETIMEDOUT, PAGODA_EPROTO,
 * PAGODA_ENOMEM, PAGODA_EIO. */
int pagoda_poll(pagoda_client *c, const uint8_t request_id[PAGODA_REQUEST_ID_BYTES],
                uint32_t offset, uint32_t wait_ms, pagoda_result *result);

/* A text or a chat tokenized, or token ids detokenized, by the router (the model's tokenizer
 * and chat template): release with pagoda_tokenized_free. */
typedef struct pagoda_tokenized {
    int32_t *token_ids; /* pagoda_tokenize: num_token_ids of them */
    size_t num_token_ids;
    char *text; /* pagoda_detokenize: text_len bytes of UTF-8 and a NUL after them */
    size_t text_len;
    uint32_t max_model_len; /* the model's context; 0 while the router does not know it */
} pagoda_tokenized;

/* The token ids a Submit of prompt (its text or its chat, with the same defaults) would have as
 * its prompt, with no limit on their number (OpenAI-compatible servers' /tokenize). Errors:
 * PAGODA_EINVAL (token ids or no prompt given, text that is not UTF-8, a template error: the
 * detail says), PAGODA_EUNSUPPORTED (a model without a tokenizer, or chat template), PAGODA_EBUSY,
 * PAGODA_ETIMEDOUT and the errors of every call. */
int pagoda_tokenize(pagoda_client *c, const pagoda_prompt *prompt, pagoda_tokenized *out);

/* The text of n token ids (skip_special_tokens as in pagoda_generate_params). PAGODA_EINVAL for
 * an id outside the tokenizer's vocabulary. */
int pagoda_detokenize(pagoda_client *c, const int32_t *ids, size_t n, int skip_special_tokens,
                      pagoda_tokenized *out);

void pagoda_tokenized_free(pagoda_tokenized *t);

/* Cancels the request: it ends with PAGODA_FINISH_CANCELLED unless it had already finished.
 * When result is not NULL it receives the request's state (no tokens). Errors as pagoda_poll. */
int pagoda_cancel(pagoda_client *c, const uint8_t request_id[PAGODA_REQUEST_ID_BYTES],
                  pagoda_result *result);

/* Called by pagoda_generate_stream with each new piece of output: n tokens starting at output
 * index offset (logprobs NULL unless asked for). The arrays are borrowed for the call. */
typedef void (*pagoda_stream_fn)(void *user, uint32_t offset, const int32_t *token_ids,
                                 const float *logprobs, size_t n);

/* Submits and polls until the request finishes; *result receives every output token once, in
 * order, the finish reason and the usage. The request id is in result->request_id from the
 * moment the submit succeeded, so after a failed poll (PAGODA_ETIMEDOUT, say) a caller can go on
 * with pagoda_poll from result->num_tokens; free the result in every case. Errors as
 * pagoda_submit and pagoda_poll. */
int pagoda_generate(pagoda_client *c, const pagoda_generate_params *params, const int32_t *prompt,
                    size_t n, pagoda_result *result);

/* pagoda_generate that also calls on_tokens (when not NULL) with every new piece of output as it
 * arrives. */
int pagoda_generate_stream(pagoda_client *c, const pagoda_generate_params *params,
                           const int32_t *prompt, size_t n, pagoda_stream_fn on_tokens, void *user,
                           pagoda_result *result);

/* Called by pagoda_generate_prompt with each new piece of output as pagoda_poll returns it
 * (tokens from piece->offset, the text they complete); borrowed for the call. */
typedef void (*pagoda_piece_fn)(void *user, const pagoda_result *piece);

/* pagoda_generate_stream for any prompt: *result receives every token, the whole text (when the
 * router returns text), the finish reason, the stop and the usage. Errors as
 * pagoda_submit_prompt and pagoda_poll. */
int pagoda_generate_prompt(pagoda_client *c, const pagoda_generate_params *params,
                           const pagoda_prompt *prompt, pagoda_piece_fn on_piece, void *user,
                           pagoda_result *result);

/* Asks for the engine's figures. Errors: PAGODA_ECLOSED (the router has no scheduler link),
 * PAGODA_ETIMEDOUT (no answer in time), PAGODA_EPROTO, PAGODA_EIO. */
int pagoda_stats(pagoda_client *c, pagoda_engine_stats *out);

/* Asks whether the router is healthy (its scheduler link is up and it is not draining): *healthy
 * is 1 or 0; when 0, pagoda_error_detail() says why. Returns 0 when the router answered, or an
 * error as pagoda_stats. */
int pagoda_health(pagoda_client *c, int *healthy);

/* Appends a polled piece (pagoda_poll) to a whole result, as pagoda_generate gathers its pieces:
 * the piece's tokens, their log-probabilities when with_logprobs (0 for a piece that has none),
 * and its text; each token's text end moves by the text gathered before the piece (a piece
 * without ends, after ones with, leaves the whole without); text that comes without a token (a
 * finish of its own, as a cancel's) joins the last token's piece. Only these arrays and their
 * counts change: the caller sets the other fields. Start from a zeroed result and free it with
 * pagoda_result_free. Returns 0, PAGODA_EINVAL (NULL) or PAGODA_ENOMEM, after which the whole
 * is only fit to be freed. */
int pagoda_result_append(pagoda_result *all, const pagoda_result *piece, int with_logprobs);

/* Frees a result's arrays and zeroes it. Accepts NULL and a zeroed result. */
void pagoda_result_free(pagoda_result *r);

/* "none", "stop", "length", "cancelled" or "error". */
const char *pagoda_finish_reason_name(pagoda_finish_reason reason);

/* Writes the id as 32 lower-case hex digits and a NUL into out. */
void pagoda_request_id_hex(const uint8_t id[PAGODA_REQUEST_ID_BYTES], char out[33]);

#endif
