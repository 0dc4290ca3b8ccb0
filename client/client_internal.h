/* libpagoda's private pieces, shared by its source files (pagoda.c, pagoda_admin.c). Not
 * installed and not part of the API: pagoda.h and pagoda_admin.h are. */
#ifndef PAGODA_CLIENT_CLIENT_INTERNAL_H
#define PAGODA_CLIENT_CLIENT_INTERNAL_H

#include "client/pagoda.h"
#include "proto/pagoda.pb-c.h"

#include <stdint.h>

/* One call to the router (pagoda.c): packs req (setting its protocol version and the client's
 * API key), sends it on a context of its own and waits up to wait_ms plus the client's timeout
 * for the reply; NNG's REQ resends it after wait_ms plus the resend time. On success *out is the
 * unpacked reply (free with pagoda__client_response__free_unpacked) and carries no error; an
 * error the router reported is returned as its code, with its message as the detail. Errors:
 * PAGODA_ERANGE (req too large), PAGODA_ETIMEDOUT, PAGODA_EPROTO, PAGODA_ENOMEM, PAGODA_EIO, and
 * any code the router answers with. */
int client_call(pagoda_client *c, Pagoda__ClientRequest *req, uint32_t wait_ms,
                Pagoda__ClientResponse **out);

#endif
