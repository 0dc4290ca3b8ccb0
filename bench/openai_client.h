/* pagoda-bench's OpenAI client: one streamed completion (POST /v1/completions with "stream":
 * true) through libcurl, its server-sent events read as they arrive, so that pagoda-bench
 * measures an OpenAI-compatible server (pagoda-gateway, or any other) as it measures the
 * router over NNG.
 *
 * The prompt is sent as token ids; each chunk's tokens are counted from its logprobs (the
 * request asks for "logprobs": 0, the sampled token's only): pagoda-gateway names them
 * "token_id:N" (as vLLM with --return-tokens-as-token-ids), so the ids are exact; a server that
 * names tokens otherwise gets id -1 for each, and a chunk without logprobs counts as one token
 * when it carries text (one token per chunk, as vLLM streams). The usage comes from the last
 * chunk ("stream_options": {"include_usage": true}).
 *
 * A handle is one connection kept alive between requests (as an SDK's pool does), used by one
 * thread at a time. curl_global_init must have been called before the first handle is made. */
#ifndef PAGODA_BENCH_OPENAI_CLIENT_H
#define PAGODA_BENCH_OPENAI_CLIENT_H

#include "client/pagoda.h"

#include <stddef.h>
#include <stdint.h>

/* The largest server-sent event (one chunk's "data:" lines) read; a bigger one fails the
 * request with PAGODA_ERANGE. */
#define OPENAI_CLIENT_MAX_EVENT_BYTES (1u << 20)
/* The largest error body kept for the message. */
#define OPENAI_CLIENT_MAX_ERROR_BYTES 4096u

struct openai_client;

/* A handle for the server at base_url ("http://HOST:PORT", with or without a trailing "/v1").
 * timeout_ms bounds the connection and any silence of the server during a request (not a whole
 * request's length). Returns NULL when memory runs out or libcurl cannot make a handle. */
struct openai_client *openai_client_new(const char *base_url, uint32_t timeout_ms);
void openai_client_free(struct openai_client *c);

/* GET /v1/models with api_key (NULL: none): 0 when the server answers 200; *model_out (when not
 * NULL) receives a copy of the first model's id (the caller's to free; NULL when there is none).
 * Errors: PAGODA_EIO (no connection, a bad status), PAGODA_EPERM (401), PAGODA_EPROTO (not the
 * models list), PAGODA_ENOMEM. */
int openai_client_models(struct openai_client *c, const char *api_key, char **model_out);

/* Streams one completion of prompt[0..n) for model (NULL: no "model" field) with params'
 * max_tokens, temperature, top_p, seed and ignore_eos (sent as vLLM's extension, only when
 * set), calling on_tokens with each chunk's tokens as it arrives (offset = tokens before it).
 * *result (overwritten; free with pagoda_result_free) receives every token id, the finish
 * reason, the usage and, for a stream that ended with an error event, its message
 * (PAGODA_FINISH_ERROR). Errors: PAGODA_EIO (connection, a non-200 status with its message as
 * the detail; the stream cut before [DONE]), PAGODA_EPERM (401), PAGODA_EBUSY (429), PAGODA_EINVAL
 * (400), PAGODA_ETIMEDOUT, PAGODA_EPROTO (a malformed chunk), PAGODA_ERANGE, PAGODA_ENOMEM. */
int openai_client_stream(struct openai_client *c, const char *api_key, const char *model,
                         const pagoda_generate_params *params, const int32_t *prompt, size_t n,
                         pagoda_stream_fn on_tokens, void *user, pagoda_result *result);

#endif
