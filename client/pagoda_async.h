/* libpagoda's asynchronous calls, for programs that run an event loop (the HTTP gateway): each
 * call returns at once and its callback runs exactly once, on one of NNG's threads, with the
 * outcome. A callback must not block; it hands the result to its loop (uv_async_send) and
 * returns. The calls use the client's timeout and resend time as the blocking calls do, and take
 * the API key per call (a gateway serves many tenants on one client).
 *
 * pagoda_client_close must not be called while an asynchronous call is outstanding: the caller
 * counts them and waits for their callbacks. */
#ifndef PAGODA_CLIENT_PAGODA_ASYNC_H
#define PAGODA_CLIENT_PAGODA_ASYNC_H

#include "client/pagoda.h"
#include "client/pagoda_admin.h"

/* The outcome of one call: rc 0 and the call's result, or an error code with its detail (the
 * router's message for an error it reported). The callback owns it: release it with
 * pagoda_async_result_free (which frees result's arrays and stats). stats is allocated for a
 * stats call only (NULL for the others), so that the many submit, poll and cancel calls do not
 * carry its ~12 KiB; after a stats call it is never NULL. */
typedef struct pagoda_async_result {
    int rc;
    char detail[512];
    uint8_t request_id[PAGODA_REQUEST_ID_BYTES];
    pagoda_result result;       /* submit (no tokens), poll, cancel */
    pagoda_engine_stats *stats; /* stats (zeroed until its reply is read) */
    int healthy;                /* health */
    uint32_t max_model_len;     /* health: the model's context; 0 while the router does not know */
    pagoda_admin_list tenants;  /* admin tenants */
    pagoda_tokenized tokenized; /* tokenize, detokenize */
} pagoda_async_result;

typedef void (*pagoda_async_fn)(void *user, pagoda_async_result *res);

void pagoda_async_result_free(pagoda_async_result *res);

/* pagoda_submit_prompt without waiting: the new request's id is written to request_id_out at once
 * (and is in the result). Returns 0 when the call started (done will run), or an error (done will
 * not run): PAGODA_EINVAL, PAGODA_ERANGE (params, prompt, a request over the size limit),
 * PAGODA_ENOMEM, PAGODA_EIO. api_key may be NULL (none). */
int pagoda_submit_async(pagoda_client *c, const char *api_key, const pagoda_generate_params *params,
                        const pagoda_prompt *prompt,
                        uint8_t request_id_out[PAGODA_REQUEST_ID_BYTES], pagoda_async_fn done,
                        void *user);

/* pagoda_poll without waiting (wait_ms clamped to PAGODA_POLL_WAIT_MS_MAX). */
int pagoda_poll_async(pagoda_client *c, const char *api_key,
                      const uint8_t request_id[PAGODA_REQUEST_ID_BYTES], uint32_t offset,
                      uint32_t wait_ms, pagoda_async_fn done, void *user);

/* pagoda_cancel without waiting. */
int pagoda_cancel_async(pagoda_client *c, const char *api_key,
                        const uint8_t request_id[PAGODA_REQUEST_ID_BYTES], pagoda_async_fn done,
                        void *user);

/* pagoda_stats and pagoda_health without waiting. */
int pagoda_stats_async(pagoda_client *c, const char *api_key, pagoda_async_fn done, void *user);
int pagoda_health_async(pagoda_client *c, pagoda_async_fn done, void *user);
/* pagoda_health_async where the router also checks api_key (NULL: none) as it checks a Submit's:
 * the result's rc is PAGODA_EPERM for a key a Submit could not use (unknown, missing where the
 * router has a tenants file, or an admin key), else as pagoda_health_async's. */
int pagoda_health_key_async(pagoda_client *c, const char *api_key, pagoda_async_fn done,
                            void *user);

/* pagoda_tokenize and pagoda_detokenize without waiting, with api_key (a tenant's): the result's
 * tokenized. */
int pagoda_tokenize_async(pagoda_client *c, const char *api_key, const pagoda_prompt *prompt,
                          pagoda_async_fn done, void *user);
int pagoda_detokenize_async(pagoda_client *c, const char *api_key, const int32_t *ids, size_t n,
                            int skip_special_tokens, pagoda_async_fn done, void *user);

/* pagoda_admin_tenants without waiting, with api_key (an admin key of the router): the result's
 * tenants (and pins) list. Waits up to PAGODA_ADMIN_WAIT_MS plus the client's timeout, as the
 * blocking call does. Errors in the result as pagoda_admin_tenants'. */
int pagoda_admin_tenants_async(pagoda_client *c, const char *api_key, pagoda_async_fn done,
                               void *user);

#endif
