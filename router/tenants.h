/* The router's tenants: who may call (API key to tenant) and how much each may hold.
 *
 * A tenants file is JSON:
 *
 *   {"tenants": [{"name": "alice", "api_keys": ["k1", "k2"],
 *                 "max_running": 64, "max_waiting": 256}, ...]}
 *
 * name: 1 to ROUTER_TENANT_NAME_MAX bytes of [A-Za-z0-9_.-], unique. api_keys: 1 to
 * ROUTER_TENANT_MAX_KEYS non-empty strings of at most ROUTER_TENANT_KEY_MAX bytes, each unique
 * across the whole file. max_running (>= 1) and max_waiting (>= 0) are optional (defaults below),
 * at most 2^24 each; the router admits at most max_running + max_waiting unfinished requests of
 * the tenant. Any other key is refused, so that a misspelt limit is not silently ignored. The
 * file holds 1 to ROUTER_MAX_TENANTS tenants and at most ROUTER_MAX_TENANTS_FILE_BYTES. */
#ifndef PAGODA_ROUTER_TENANTS_H
#define PAGODA_ROUTER_TENANTS_H

#include <stddef.h>
#include <stdint.h>

#define ROUTER_MAX_TENANTS 1024u
#define ROUTER_MAX_TENANTS_FILE_BYTES (1u << 20)
#define ROUTER_TENANT_NAME_MAX 63u
#define ROUTER_TENANT_KEY_MAX 256u
#define ROUTER_TENANT_MAX_KEYS 64u
#define ROUTER_TENANT_DEFAULT_MAX_RUNNING 256u
#define ROUTER_TENANT_DEFAULT_MAX_WAITING 1024u
#define ROUTER_TENANT_LIMIT_MAX (1u << 24)

struct router_tenant {
    char name[ROUTER_TENANT_NAME_MAX + 1];
    char **api_keys;
    uint32_t num_api_keys;
    uint32_t max_running, max_waiting;
};

struct router_tenants {
    struct router_tenant *tenants;
    uint32_t count;
};

/* Parses a tenants document of len bytes; origin names it in errors (a path). On success *out
 * is released with router_tenants_free. Errors: PAGODA_EFORMAT (not JSON, a wrong type, an
 * unknown key: the detail names the field, e.g. "tenants[1].api_keys[0]"), PAGODA_ERANGE (a
 * value or a count outside its bounds), PAGODA_EEXIST (a duplicate name or key), PAGODA_ENOMEM. */
int router_tenants_parse(const char *json, size_t len, const char *origin,
                         struct router_tenants **out);

/* router_tenants_parse on the file at path (refused above ROUTER_MAX_TENANTS_FILE_BYTES).
 * Errors: those of router_tenants_parse, PAGODA_ENOENT and PAGODA_EIO. */
int router_tenants_load(const char *path, struct router_tenants **out);

/* The tenant whose keys include key, or NULL. */
const struct router_tenant *router_tenants_find_key(const struct router_tenants *t,
                                                    const char *key);

/* Accepts NULL. */
void router_tenants_free(struct router_tenants *t);

#endif
