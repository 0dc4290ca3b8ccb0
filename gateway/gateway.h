/* pagoda-gateway: the OpenAI-compatible HTTP front of a pagoda group (issue 18).
 *
 * A process of its own beside the router, speaking to it as any client does, through
 * libpagoda's asynchronous calls (client/pagoda_async.h) over NNG: the router stays the one
 * registry of requests and the native, resumable API, and the gateway is an HTTP server
 * (http/http_server.h) on a libuv loop that turns OpenAI requests into Submits and polls and
 * the answers into OpenAI responses and server-sent events. Why a gateway rather than an HTTP
 * front inside the router: the router's loop and registry stay as they are (they are proven
 * against restarts and floods), an HTTP parser bug cannot take the registry down, and a later
 * router in front of several engines (issue 20) needs no change to serve HTTP. The cost is one
 * local IPC round trip per poll (tens of microseconds, against milliseconds per token).
 *
 * Request bodies are parsed on libuv's threadpool; the router tokenizes text and renders chats
 * off its own loop; nothing on the gateway's loop waits. A client that disconnects before its
 * answer is complete has its request cancelled (its KV blocks return at once). The API key of
 * `Authorization: Bearer KEY` is passed with every call, so the router maps it to a tenant as it
 * does for NNG clients. */
#ifndef PAGODA_GATEWAY_GATEWAY_H
#define PAGODA_GATEWAY_GATEWAY_H

#include "gateway/tool_calls.h"
#include "http/http_server.h"

#include <stdint.h>
#include <uv.h>

struct gateway_config {
    const char *router_url;     /* the router's client address */
    const char *model_name;     /* the model's id in /v1/models and responses */
    const char *stats_key;      /* the key /metrics asks the router's Stats with, or NULL */
    struct http_config http;    /* address and the HTTP limits */
    uint32_t max_requests;      /* generation requests in progress at once (more: 429) */
    int32_t default_max_tokens; /* a chat without max_tokens */
    uint32_t poll_wait_ms;      /* each long poll's wait */
    uint32_t router_timeout_ms; /* a call to the router beyond its poll wait */
    /* Parses chats' tool calls out of their output where the request gives tools with
     * tool_choice auto (vLLM's --tool-call-parser); NONE (the default) refuses such chats. */
    enum tool_call_parser tool_call_parser;
};

#define GATEWAY_DEFAULT_MAX_REQUESTS 4096u
#define GATEWAY_DEFAULT_MAX_TOKENS 1024
#define GATEWAY_DEFAULT_POLL_WAIT_MS 10000u
#define GATEWAY_DEFAULT_ROUTER_TIMEOUT_MS 30000u

void gateway_config_default(struct gateway_config *cfg);

struct gateway;

/* Starts serving on loop. Errors: PAGODA_EINVAL (configuration), PAGODA_EIO (cannot listen),
 * PAGODA_ENOMEM. */
int gateway_open(uv_loop_t *loop, const struct gateway_config *cfg, struct gateway **out);

/* The HTTP port served (with port 0 in the configuration). */
uint16_t gateway_port(const struct gateway *g);

/* Stops accepting, cancels the requests in progress, and frees the gateway once every call to
 * the router has reported and libuv has closed its handles (the loop must run). */
void gateway_close(struct gateway *g);

#endif
