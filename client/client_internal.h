/* libpagoda's private pieces, shared by its source files (pagoda.c, pagoda_admin.c). Not
 * installed and not part of the API: pagoda.h and pagoda_admin.h are. */
#ifndef PAGODA_CLIENT_CLIENT_INTERNAL_H
#define PAGODA_CLIENT_CLIENT_INTERNAL_H

#include "client/pagoda.h"
#include "client/pagoda_admin.h"
#include "proto/pagoda.pb-c.h"

#include <nng/nng.h>
#include <stdint.h>

/* The largest request any router accepts (router.h ROUTER_MAX_CLIENT_MESSAGE_BYTES). */
#define CLIENT_MAX_REQUEST_BYTES (4u << 20)
/* What NNG's REQ puts before each request (its id), which the router's limit counts too. */
#define CLIENT_REQ_HEADER_BYTES 4u
/* The protocol version of proto/pagoda.proto this client speaks. */
#define CLIENT_PROTOCOL_VERSION 1u

/* The client's socket and settings (pagoda.c), for the asynchronous calls (pagoda_async.c). */
nng_socket client_socket(const pagoda_client *c);
uint32_t client_timeout_ms(const pagoda_client *c);
uint32_t client_resend_ms(const pagoda_client *c);
const char *client_api_key(const pagoda_client *c);

/* The largest request the router accepts, as its last reply said (ClientResponse
 * max_request_bytes), else CLIENT_MAX_REQUEST_BYTES. A bigger request makes NNG drop the
 * connection, every call on it resent, until the call times out: it is refused before it is sent
 * (client_check_size). */
uint32_t client_request_limit(const pagoda_client *c);
/* Remembers what a reply says of the limit (any thread). */
void client_note_reply(pagoda_client *c, const Pagoda__ClientResponse *resp);
/* 0, or PAGODA_ERANGE with a detail when a request of len bytes is over the limit. */
int client_check_size(const pagoda_client *c, size_t len);

/* One call to the router (pagoda.c): packs req (setting its protocol version and the client's
 * API key), sends it on a context of its own and waits up to wait_ms plus the client's timeout
 * for the reply; NNG's REQ resends it after wait_ms plus the resend time. On success *out is the
 * unpacked reply (free with pagoda__client_response__free_unpacked) and carries no error; an
 * error the router reported is returned as its code, with its message as the detail. Errors:
 * PAGODA_ERANGE (req too large), PAGODA_ETIMEDOUT, PAGODA_EPROTO, PAGODA_ENOMEM, PAGODA_EIO, and
 * any code the router answers with. */
int client_call(pagoda_client *c, Pagoda__ClientRequest *req, uint32_t wait_ms,
                Pagoda__ClientResponse **out);

/* A Submit built from the API's parameters: req points into the rest; the messages are borrowed
 * from the caller's prompt. */
struct client_submit {
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    Pagoda__SamplingParams sp;
    Pagoda__SubmitRequest sub;
    Pagoda__ClientRequest req;
    Pagoda__ChatMessage *store, **messages;
    ProtobufCBinaryData stops[PAGODA_MAX_STOP_STRINGS];
};

/* Checks params and prompt and builds the Submit for request id into *cs (release with
 * client_submit_fini). Errors: PAGODA_EINVAL, PAGODA_ERANGE, PAGODA_ENOMEM. */
int client_submit_build(struct client_submit *cs, const pagoda_generate_params *params,
                        const pagoda_prompt *prompt, const uint8_t id[PAGODA_REQUEST_ID_BYTES]);
void client_submit_fini(struct client_submit *cs);

/* A Tokenize call (pagoda_tokenize.c): of prompt's text or chat (its Submit's fields, built by
 * client_submit_build), or, with prompt NULL, of n ids to detokenize (borrowed). req points into
 * the struct. Errors: PAGODA_EINVAL (a prompt of token ids, or none), PAGODA_ENOMEM. */
struct client_tokenize {
    struct client_submit cs;
    int has_cs;
    Pagoda__TokenizeRequest tok;
    Pagoda__ClientRequest req;
};
int client_tokenize_build(struct client_tokenize *t, const pagoda_prompt *prompt,
                          const int32_t *ids, size_t n, int skip_special_tokens);
void client_tokenize_fini(struct client_tokenize *t);
/* The reply's TokenizeResponse copied into *out. Errors: PAGODA_EPROTO, PAGODA_ENOMEM. */
int client_tokenized_from_reply(const Pagoda__ClientResponse *resp, pagoda_tokenized *out);

/* A Poll or a Cancel for request id, as the blocking and the asynchronous calls send it: req
 * points into the struct (keep it in place while req is used; the id is borrowed). */
struct client_id_call {
    Pagoda__ClientRequest req;
    Pagoda__PollRequest poll;
    Pagoda__CancelRequest cancel;
};

/* wait_ms is sent as given: the callers clamp it to PAGODA_POLL_WAIT_MS_MAX. */
void client_poll_build(struct client_id_call *m, const uint8_t id[PAGODA_REQUEST_ID_BYTES],
                       uint32_t offset, uint32_t wait_ms);
void client_cancel_build(struct client_id_call *m, const uint8_t id[PAGODA_REQUEST_ID_BYTES]);

/* Copies a reply's TokenUpdate for request id into *result (overwritten). Errors: PAGODA_EPROTO
 * (no update, another request's, a bad finish reason), PAGODA_ENOMEM. */
int client_result_from_update(const Pagoda__ClientResponse *resp,
                              const uint8_t id[PAGODA_REQUEST_ID_BYTES], pagoda_result *result);

/* An AdminResponse's tenants and pins as the API's list (pagoda_admin.c), for the asynchronous
 * admin call. *out is overwritten. Errors: PAGODA_ENOMEM. */
int client_admin_list_from_proto(const Pagoda__AdminResponse *a, pagoda_admin_list *out);

/* A Stats message as the API's figures (*out overwritten): its engines in order, those past
 * PAGODA_STATS_MAX_ENGINES and malformed ones (no index, an index out of range or repeated)
 * counted in engines_dropped; its strings with invalid UTF-8, C0 controls and DEL replaced with
 * '?' and cut on a character boundary (pagoda_engine_stats). */
void client_stats_from_proto(const Pagoda__Stats *s, pagoda_engine_stats *out);

#endif
