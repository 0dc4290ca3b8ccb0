/* libpagoda's admin calls: the tenancy of a pagoda router (pagoda.proto AdminRequest).
 *
 * The client's API key must be one of the router's admin keys (the tenants file's admin_keys;
 * pagoda_client_set_api_key): any other key, or a router without admin keys, is refused with
 * PAGODA_EPERM. Calls that need the scheduler fail with PAGODA_ECLOSED while the router has no
 * scheduler link (nothing changes), and with PAGODA_ETIMEDOUT when the scheduler has not answered
 * within the router's --admin-timeout-ms (a pin, unpin or reload then stays configured: the
 * router sends it to every scheduler that comes up). A router answers within its admin timeout
 * (10 s by default), so these calls wait up to PAGODA_ADMIN_WAIT_MS plus the client's timeout.
 *
 * Errors: every function returns 0 or a negative PAGODA_E* code; the calling thread's
 * pagoda_error_detail() then says what went wrong. */
#ifndef PAGODA_CLIENT_PAGODA_ADMIN_H
#define PAGODA_CLIENT_PAGODA_ADMIN_H

#include "client/pagoda.h"

#include <stddef.h>
#include <stdint.h>

/* How long an admin call may wait for the router beyond the client's timeout, and before NNG's
 * REQ sends it again (on top of the resend time). */
#define PAGODA_ADMIN_WAIT_MS 15000u

/* A tenant: its configuration (the tenants file) and the scheduler's figures. Strings and arrays
 * belong to the enclosing pagoda_admin_list. */
typedef struct pagoda_tenant_info {
    char *name;
    char *group;          /* NULL: in no group */
    char *namespace_name; /* "t:NAME" or "g:GROUP": where its cached prefixes live */
    uint32_t max_running, max_waiting;
    uint32_t cache_quota_blocks; /* of its namespace; 0: none */
    /* Prefix-cache lookups of its requests, and of them those with at least one block served;
     * prompt tokens looked up, and of them those served from the cache. */
    uint64_t lookups, hits, query_tokens, hit_tokens;
    double hit_rate;        /* hit_tokens / query_tokens; 0 when none */
    uint32_t cached_blocks; /* held by its namespace */
    uint64_t evictions;     /* of its namespace */
    uint32_t running, waiting;
    char **pins; /* the pinned prefixes it may read */
    size_t num_pins;
} pagoda_tenant_info;

/* A pinned public prefix and what the scheduler said of it. */
typedef struct pagoda_pin_info {
    char *name;
    uint32_t num_tokens;
    char **tenants; /* who may read it */
    size_t num_tenants;
    int ready;       /* computed and held */
    uint32_t blocks; /* full blocks held */
    char *error;     /* why it could not be computed; NULL when it could (or is not yet) */
    int from_file;   /* declared in the tenants file (an unpin lasts until the next reload) */
} pagoda_pin_info;

typedef struct pagoda_admin_list {
    pagoda_tenant_info *tenants;
    size_t num_tenants;
    pagoda_pin_info *pins;
    size_t num_pins;
} pagoda_admin_list;

/* Every tenant of the router (in the tenants file's order) with its figures, and every pin.
 * *out is overwritten and is the caller's to free with pagoda_admin_list_free. Errors:
 * PAGODA_EPERM, PAGODA_ECLOSED, PAGODA_ETIMEDOUT, PAGODA_EPROTO, PAGODA_ENOMEM, PAGODA_EIO. */
int pagoda_admin_tenants(pagoda_client *c, pagoda_admin_list *out);

/* Pins the prefix tokens[0..n) as name for the tenants named (adding a pin or replacing the one of
 * that name, a file's pin too) and returns once the scheduler has computed it; *status (when not
 * NULL) receives the pin (free with pagoda_pin_info_free). A repeated call with the same pin
 * changes nothing. Errors: PAGODA_EINVAL or PAGODA_EFORMAT (a bad name), PAGODA_ERANGE (no
 * tokens or too many, a negative id, too many pins), PAGODA_ENOENT (an unknown tenant),
 * PAGODA_EEXIST (a tenant named twice), the scheduler's error for the pin (a token outside the
 * vocabulary: PAGODA_ERANGE; the pin stays configured and unusable until it is pinned again or
 * unpinned), PAGODA_EPERM, PAGODA_ECLOSED, PAGODA_ETIMEDOUT, PAGODA_ENOMEM, PAGODA_EIO. */
int pagoda_admin_pin(pagoda_client *c, const char *name, const int32_t *tokens, size_t n,
                     const char *const *tenants, size_t num_tenants, pagoda_pin_info *status);

/* Removes the pin (one from the tenants file until the next reload) and returns once the
 * scheduler has let it go. Errors: PAGODA_ENOENT (no such pin), PAGODA_EPERM, PAGODA_ECLOSED,
 * PAGODA_ETIMEDOUT, PAGODA_EIO. */
int pagoda_admin_unpin(pagoda_client *c, const char *name);

/* Drops the cached prefixes of the tenant's namespace (its group's when it is in one), or of
 * the group's; *flushed_blocks (when not NULL) receives how many blocks went. Errors:
 * PAGODA_ENOENT (no such tenant or group), PAGODA_EPERM, PAGODA_ECLOSED, PAGODA_ETIMEDOUT,
 * PAGODA_EIO. */
int pagoda_admin_flush_tenant(pagoda_client *c, const char *tenant, uint32_t *flushed_blocks);
int pagoda_admin_flush_group(pagoda_client *c, const char *group, uint32_t *flushed_blocks);

/* Makes the router read its tenants file again and returns once the scheduler has applied it;
 * pins (when not NULL) receives every pin and its status (no tenants; free with
 * pagoda_admin_list_free). On any error in the file nothing changes and the error names the
 * field. Running requests keep running; a tenant the file no longer has can no longer call.
 * Errors: those of the tenants file (PAGODA_EFORMAT, PAGODA_ERANGE, PAGODA_EEXIST, PAGODA_EINVAL,
 * PAGODA_ENOENT, PAGODA_EIO), PAGODA_EPERM, PAGODA_ECLOSED, PAGODA_ETIMEDOUT. */
int pagoda_admin_reload(pagoda_client *c, pagoda_admin_list *pins);

/* Free what the list or the pin holds and zero it. Accept NULL and a zeroed value. */
void pagoda_admin_list_free(pagoda_admin_list *l);
void pagoda_pin_info_free(pagoda_pin_info *p);

#endif
