/* The router: clients' front door and the registry of their requests.
 *
 * Clients speak proto/pagoda.proto over NNG REQ/REP. The router listens with a REP socket and a
 * pool of contexts, so that many calls are in flight at once: each context receives one call on
 * NNG's threads, hands it to the libuv loop through a mailbox, and the loop answers it at once
 * (Submit, Cancel, Health), or parks it (a Poll waiting for tokens, a Stats waiting for the
 * scheduler) until there is something to say or its wait runs out. A parked call holds its
 * context and no thread.
 *
 * The router owns the request registry: for every request the parameters the client sent, the
 * tokens generated so far and how it ended. It forwards new requests to the scheduler over a
 * PAIR link (ipc://RUN_DIR/scheduler.ipc) and appends the TokenEvents the scheduler sends back.
 * Events carry their output offset, so a resent or overlapping event never duplicates a token.
 * When the link comes up (the first time, or after a scheduler restart), every unfinished request
 * is sent again with the output it already has (SubmitSeq.output_token_ids): the scheduler must
 * treat a SubmitSeq for an id it already holds as a no-op. It also sends a RouterHello (after the
 * Policy, before the resubmissions), and the scheduler announces every request it holds: a
 * restarted router (whose registry was lost) registers the requests it does not hold under the
 * tenant and client id the announcement echoes, so that clients polling by id get every token. A
 * poll for an unknown id before the announcement completed, within ANNOUNCE_WAIT_MS
 * (router_registry.c) of the router's start, waits for it instead of failing at once (at most
 * ANNOUNCE_GRACE_MS, then PAGODA_EBUSY: poll again).
 *
 * Several engines (docs/routing.md): the router may hold N scheduler links (engines), each with
 * its own Policy, announcement and resubmission as above. A request is sent to the engine that
 * route.h picks (cache-aware: the longest cached prefix unless much busier; or round robin), and
 * stays there; when that engine's link goes down, or it leaves a liveness probe unanswered for
 * stats_timeout_ms, its unfinished requests are sent to another usable engine with their output
 * so far, and the old engine's later events for them are ignored (and cancelled there). With
 * one engine nothing moves: the request waits for its scheduler to come back, as before. Stats
 * sums the engines' figures (Stats.engines has each one's); admin calls go to every engine.
 *
 * Decisions (minimal first version; a later issue adds the rest):
 *  - Tenants (router/tenants.h): without a tenants file, api_key is ignored and every request
 *    belongs to tenant "default" (bounded only by max_live_requests). With one, Submit, Poll,
 *    Cancel and Stats need a key of a tenant: any other key, or none, is PAGODA_EPERM "unknown
 *    API key" (the answer says nothing about which tenants or keys exist). Health needs no key
 *    (load balancers ask it). SubmitSeq.tenant carries the tenant's name.
 *  - The router owns the tenancy and pushes it to the scheduler as a Policy (namespaces and
 *    quotas, each tenant's namespace, max_running and readable pins, the pins' tokens): when the
 *    link comes up, before the RouterHello and any Submit, and after every change, with a
 *    version that increases from 1 within the router process. Serving never waits for the
 *    scheduler's PolicyApplied; only the admin calls that changed the tenancy do.
 *  - Admin (ClientRequest.admin, router_admin.c): only a key of the file's admin_keys (without
 *    admin keys every admin call is PAGODA_EPERM); an admin key may also ask for Stats, but not
 *    submit, poll or cancel. Stats shows every tenant's traffic, so with a tenants file only an
 *    admin key gets the engine's figures; a tenant's key gets its own (Stats.tenant set). Without
 *    one the default tenant is everyone and any key gets the engine's. A reload reads the file
 *    on libuv's threadpool, never on the loop. Calls that need the scheduler answer
 *    PAGODA_ECLOSED while its link is down (nothing changes) and PAGODA_ETIMEDOUT when it does
 *    not answer within admin_timeout_ms (a pin, unpin or reload then stays configured and goes
 *    out with the Policy). A reload that removes a tenant stops its keys at once; its requests
 *    run to their end, but no key reaches them unless a later reload brings the tenant back by
 *    name.
 *  - Request ids are per tenant: two tenants may use the same id. The scheduler knows a request
 *    by a keyed 128-bit hash of (tenant, id) (with no tenants file: the id itself), so its ids
 *    stay unique. Another tenant's id answers Poll and Cancel exactly like an unknown id
 *    (PAGODA_ENOENT), so ids do not leak between tenants.
 *  - Admission: a Submit is refused with PAGODA_EEXHAUSTED when the router holds
 *    max_live_requests unfinished requests, or the tenant holds max_running + max_waiting of
 *    them (the scheduler enforces the split between running and waiting). A refusal changes
 *    nothing already admitted.
 *  - Finished results are kept until polled for at most finished_ttl_ms, per tenant: a tenant
 *    keeps at most its max_finished (tenants.h) and past it loses its own oldest; the total is
 *    capped by max_finished_requests, and over it the tenant holding the most loses its oldest,
 *    so one tenant's flood never expires another's results (unless that one holds more).
 *  - Deduplication is on (tenant, request id): the same id with the same parameters (after
 *    defaults are applied) answers with the existing request, other parameters are
 *    PAGODA_EEXIST.
 *  - Cancel finishes the request in the router at once (FINISH_CANCELLED) and tells the
 *    scheduler; tokens that arrive later are ignored.
 *  - A request that finishes with an error (FINISH_ERROR) is reported in a successful Poll:
 *    error_code 0, the update's finish_reason FINISH_ERROR, and the scheduler's message in
 *    ClientResponse.error_message.
 *  - Health is healthy when the scheduler link is up and the router is not draining.
 *  - The largest client message is sized from the prompt limit: max_prompt_tokens (lowered to
 *    the model's context less one token once the scheduler reports it, ModelInfo) times
 *    ROUTER_BYTES_PER_PROMPT_TOKEN plus ROUTER_MESSAGE_OVERHEAD_BYTES, at most
 *    ROUTER_MAX_CLIENT_MESSAGE_BYTES. A bigger message is refused by NNG itself (it drops the
 *    connection, the client's REQ resends and eventually times out), so every reply carries
 *    the limit (max_request_bytes) and libpagoda refuses a bigger request; every smaller one is
 *    unpacked with checks and a malformed one is answered with PAGODA_EFORMAT. A prompt over the
 *    limit that still fits the message is answered with PAGODA_ERANGE.
 *  - The front holds nothing for a client beyond what bounds allow (the worst case is in the
 *    README): at most max_connections connections (more are closed as they arrive), a connection
 *    with no call in progress and no complete message for idle_timeout_ms is closed (an idle
 *    client's REQ reconnects when it calls again; a slow peer holding a partial message loses
 *    it). Contexts are opened on demand, so that num_contexts of them are always free to receive
 *    while calls are parked: a parked poll never keeps Health or a Submit from being answered.
 *    At most max_parked_calls calls are parked at once, and with a tenants file a tenant's at most
 *    its share (ROUTER_PARKED_PER_ADMITTED); a poll beyond that is answered at once with what
 *    there is (the client polls again), a Stats or Tokenize with PAGODA_EBUSY. A finished request
 *    keeps only what its client can still fetch (tokens, logprobs, usage, the finish), not its
 *    prompt: a resent Submit of it is recognised by a keyed hash of its prompt. */
#ifndef PAGODA_ROUTER_ROUTER_H
#define PAGODA_ROUTER_ROUTER_H

#include "kernels/cpu/sampler.h"

#include <stdint.h>
#include <uv.h>

/* The largest client message the REP socket ever accepts (NNG_OPT_RECVMAXSZ); the limit in
 * force is sized from the prompt limit (router_max_message_bytes). */
#define ROUTER_MAX_CLIENT_MESSAGE_BYTES (4u << 20)
/* A packed prompt token id below 2^28 (every vocabulary's) takes at most 4 bytes. A text prompt
 * or a chat counts against the same limit: about 4 bytes a token for byte-level BPEs on prose, so
 * a text near the token limit with longer tokens (runs of spaces) does not fit the message. Kept
 * at 4 so that the worst case of the front (README) does not grow with text. */
#define ROUTER_BYTES_PER_PROMPT_TOKEN 4u
/* Room in a Submit for everything but the prompt: id, key, sampling, stop ids, framing. */
#define ROUTER_MESSAGE_OVERHEAD_BYTES (16u << 10)

/* The protocol version of proto/pagoda.proto that this router speaks. */
#define ROUTER_CLIENT_PROTOCOL_VERSION 1u

/* The tenant of every request when there is no tenants file. */
#define ROUTER_DEFAULT_TENANT "default"

/* Defaults of struct router_config. */
#define ROUTER_DEFAULT_CONTEXTS 64u
#define ROUTER_DEFAULT_MAX_PARKED_CALLS 16384u
#define ROUTER_DEFAULT_MAX_CONNECTIONS 4096u
#define ROUTER_DEFAULT_IDLE_TIMEOUT_MS 30000u
/* File descriptors kept beyond the connection cap (sockets to the scheduler and supervisor,
 * connections still negotiating, logs). */
#define ROUTER_RESERVED_FDS 256u
/* The most contexts ever open (num_contexts free + max_parked_calls + those sending). */
#define ROUTER_MAX_CONTEXTS (1u << 20)
/* How long a reply may wait for a client that does not read it before it is dropped. */
#define ROUTER_SEND_TIMEOUT_MS 10000
#define ROUTER_DEFAULT_MAX_LIVE_REQUESTS 4096u
#define ROUTER_DEFAULT_MAX_FINISHED_REQUESTS 4096u
#define ROUTER_DEFAULT_FINISHED_TTL_MS (10u * 60u * 1000u)
#define ROUTER_DEFAULT_MAX_PROMPT_TOKENS (128u * 1024u)
#define ROUTER_DEFAULT_MAX_NEW_TOKENS (128u * 1024u)
#define ROUTER_DEFAULT_MAX_WAIT_MS 30000u
#define ROUTER_DEFAULT_STATS_TIMEOUT_MS 2000u
#define ROUTER_DEFAULT_ADMIN_TIMEOUT_MS 10000u
/* The router must answer an admin call before libpagoda resends it (PAGODA_ADMIN_WAIT_MS, 15 s,
 * plus the client's resend time): a resent unpin or flush would report the second call's
 * outcome (ENOENT, 0 blocks) for a first that succeeded. */
#define ROUTER_MAX_ADMIN_TIMEOUT_MS 15000u
#define ROUTER_DEFAULT_DRAIN_TIMEOUT_MS 60000u
/* A live request that no call has named for this long (its Submit, a Poll, a Poll waiting) is
 * cancelled as its client's Cancel would: the client is gone (killed, a CLI interrupted, a
 * gateway lost) and nothing would end it short of its max_tokens, its tenant's slots and its KV
 * held meanwhile. NNG's REQ/REP has no connection per request to see a client leave by, so the
 * router goes by its calls: pagoda_generate and the gateway poll without pause (a poll waits up
 * to max_wait_ms, 30 s, and counts while it waits). A client that submits now and polls later
 * than this must raise it (--abandon-ms, 0: never). */
#define ROUTER_DEFAULT_ABANDON_MS 60000u
/* The longest --stats-timeout-ms: a parked Stats call holds its context this long at most. */
#define ROUTER_MAX_STATS_TIMEOUT_MS 60000u

/* A Submit without max_tokens generates this many tokens (vLLM's default). */
#define ROUTER_DEFAULT_MAX_TOKENS 16
/* The most stop token ids one request may carry. */
#define ROUTER_MAX_STOP_TOKEN_IDS 64u
/* Text prompts and chats being tokenized on libuv's threadpool at once (jobs whose request was
 * cancelled still count until they end), in all and per tenant. More wait their turn in the
 * router, in arrival order, skipping a tenant at its share: one tenant's flood of long prompts
 * never holds up everyone's, and none is refused for it (admission bounds them, as any request). */
#define ROUTER_MAX_TEXT_JOBS 64u
#define ROUTER_MAX_TENANT_TEXT_JOBS 8u
/* libuv's threadpool in pagoda-router (UV_THREADPOOL_SIZE, set in main before the first
 * uv_queue_work unless the environment sets it): the text jobs and the tenants file's reload run
 * on it. libuv's default of 4 threads let one tenant's 8 jobs take all 4, and another tenant's
 * 2-token prompt waited behind them (28 ms alone, a median of 1.9 s beside a tenant whose template
 * rendered 12 MB). 8 + 4 = 12 leaves 4 threads free while a tenant is at its cap, so that a
 * second tenant's prompt and a reload start at once; several tenants at their caps share the 12
 * as the router's queue and libuv's take them in turn. The per-tenant cap is kept at 8, not
 * lowered under 4, so that a tenant alone still tokenizes on 8 cores. */
#define ROUTER_THREADPOOL_SIZE (ROUTER_MAX_TENANT_TEXT_JOBS + 4u)
/* The most messages in a chat. */
#define ROUTER_MAX_CHAT_MESSAGES 4096u
/* The longest a Tokenize call waits for its job (queued behind others, then run): libpagoda's
 * PAGODA_TOKENIZE_WAIT_MS, so that its client neither resends nor gives up before. */
#define ROUTER_TEXT_CALL_TIMEOUT_MS 30000u
/* Tokenize calls waiting at once, a tenant's, and the bytes their jobs hold (the packed text
 * fields, or the ids), a tenant's and every tenant's together: past any, a call gets
 * PAGODA_EBUSY. Where a tenants file names several tenants, one holds at most a quarter of the
 * bytes (four calls of ROUTER_MAX_CLIENT_MESSAGE_BYTES), so that one tenant's burst never takes
 * them all (four tenants' can). */
#define ROUTER_MAX_TENANT_TEXT_CALLS 32u
/* With a tenants file, a tenant's calls parked at once (polls, stats, tokenize) are at most this
 * many for each request it may have (max_running + max_waiting), plus its Tokenize calls and 16
 * (router_may_park). A client parks one poll a request; past its share a poll is answered at once
 * with what there is, a Stats with PAGODA_EBUSY. */
#define ROUTER_PARKED_PER_ADMITTED 4u
#define ROUTER_MAX_TEXT_CALL_BYTES (64u << 20)
#define ROUTER_MAX_TENANT_TEXT_CALL_BYTES (ROUTER_MAX_TEXT_CALL_BYTES / 4)
/* Unpacking one client message may make at most this many allocations (one per string or
 * sub-message): a 4 MiB message of two million empty strings is refused as malformed instead of
 * costing the loop two million mallocs. */
#define ROUTER_MAX_UNPACK_ALLOCATIONS 65536u

struct router_config {
    const char *run_dir;       /* control.ipc lives here; the scheduler link unless below */
    const char *listen_url;    /* tcp://HOST:PORT or ipc://PATH */
    const char *scheduler_url; /* NULL: ipc://RUN_DIR/scheduler.ipc (one engine) */
    /* Several engines (a scheduler each): their links, engine i = scheduler_urls[i]; 0 of them:
     * the one engine of scheduler_url. At most ROUTE_MAX_ENGINES (route.h). */
    const char *const *scheduler_urls;
    uint32_t num_scheduler_urls;
    const char *routing;      /* "cache-aware" (NULL: the default) or "round-robin" (route.h) */
    const char *tenants_file; /* router/tenants.h; NULL: one tenant, any key */
    /* The model's tokenizer and chat template (router_text_load), taken by router_open when it
     * succeeds; NULL: token ids only (no model folder given). */
    struct router_text *text;
    uint32_t num_contexts;          /* contexts always free to receive a call */
    uint32_t max_parked_calls;      /* polls and stats waiting at once */
    uint32_t max_connections;       /* client connections at once (lowered to fit the fd limit) */
    uint32_t idle_timeout_ms;       /* a connection with no call and no complete message */
    uint32_t max_live_requests;     /* admitted, unfinished; more is PAGODA_EEXHAUSTED */
    uint32_t max_finished_requests; /* finished results kept in all, >= 1 (see above) */
    uint32_t finished_ttl_ms;       /* and for how long at most */
    uint32_t max_prompt_tokens;
    uint32_t max_new_tokens; /* the largest max_tokens a Submit may ask for */
    uint32_t max_wait_ms;    /* a Poll's wait_ms is clamped to this */
    uint32_t stats_timeout_ms;
    uint32_t admin_timeout_ms; /* an admin call's wait for the scheduler (pins are computed) */
    uint32_t drain_timeout_ms;
    uint32_t abandon_ms; /* a live request no call names for this long is cancelled; 0: never */
    /* What a Submit's absent sampling fields mean (wire/sampling_wire.h): sampling_params_default()
     * (router_config_default), or the model's generation_config.json's recommendations over it,
     * as vLLM applies them (pagoda-router --generation-config auto, the default with --model). */
    struct sampling_params sampling_defaults;
};

struct router;

/* A model's text side as a router serves it: its tokenizer and chat template, or why it serves
 * token ids only. */
struct router_text;

/* Reads model_dir's tokenizer.json and tokenizer_config.json (text/text_model.h), for
 * router_config.text. Blocking file reads and parsing (a large tokenizer takes a few hundred ms):
 * call it before the loop runs, as pagoda-router does, or off it. On success *out is the
 * caller's: text and chats; text only (no chat template, or one beyond chat/jinja.h's subset:
 * chats are refused with the reason); or token ids only (no tokenizer.json, or one asking for
 * what pagoda does not support: text is refused with the reason, logged). Errors: PAGODA_ENOMEM;
 * any other means the folder's tokenizer files are broken (unreadable, not JSON, a field of the
 * wrong type, a chat template that is not Jinja at all), the detail naming the file and the
 * cause: a router cannot serve that model as configured (docs/text.md). */
int router_text_load(const char *model_dir, struct router_text **out);

/* Frees router_text_load's result; accepts NULL. */
void router_text_free(struct router_text *t);

/* The largest client message the router accepts for prompts of up to max_prompt_tokens. */
size_t router_max_message_bytes(uint32_t max_prompt_tokens);

/* Fills *cfg with the defaults above and no addresses. */
void router_config_default(struct router_config *cfg);

/* Starts a router on loop: dials the scheduler, listens at cfg->listen_url and starts receiving.
 * The strings in cfg are copied; cfg->text is taken on success, and stays the caller's on error.
 * On success *out is released with router_close. On error the
 * partly built router has already been closed, and the caller must run the loop until it has no
 * handles left (uv_run(loop, UV_RUN_DEFAULT)) before closing it. Errors: PAGODA_EINVAL (a bad
 * configuration or address), PAGODA_ENOMEM, PAGODA_EIO (a socket could not listen or dial), and
 * those of router_tenants_load (a bad tenants file, with the field named in the detail). */
int router_open(uv_loop_t *loop, const struct router_config *cfg, struct router **out);

/* Called once when a drain ends: drained is 1 when every request finished (and its result went
 * to a client or had time to), 0 when the drain timeout ran out first. */
typedef void (*router_drained_fn)(void *arg, int drained);

/* Starts draining: new Submits are refused with PAGODA_ECLOSED, everything else is served, and
 * done(arg, drained) runs on the loop when every live request has finished or
 * cfg->drain_timeout_ms has passed. A second call is ignored. */
void router_drain(struct router *r, router_drained_fn done, void *arg);

/* SIGHUP: reads the tenants file again, as an admin reload does, and logs the outcome (a file it
 * refuses leaves the configuration as it was). Errors: as an admin reload's start
 * (PAGODA_EUNSUPPORTED without a tenants file, PAGODA_EBUSY while a read is in flight). */
int router_reload(struct router *r);

/* Stops every aio, closes the sockets and frees the router once libuv has closed its handles
 * (so the loop must run a little after this). Parked calls get no answer. Call on the loop
 * thread. Accepts NULL. */
void router_close(struct router *r);

#endif
