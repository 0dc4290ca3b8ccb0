/* The router's tenants: who may call (API key to tenant, admin keys), how much each may hold,
 * which prefix-cache namespace each writes to, and the public prefixes pinned for them.
 *
 * A tenants file is JSON; every key but "tenants" is optional:
 *
 *   {"admin_keys": ["adm"],
 *    "groups": [{"name": "team", "cache_quota_blocks": 1000}],
 *    "tenants": [{"name": "alice", "api_keys": ["k1", "k2"], "group": "team",
 *                 "max_running": 64, "max_waiting": 256, "max_finished": 1000,
 *                 "cache_quota_blocks": 500}, ...],
 *    "pins": [{"name": "sys", "token_ids": [1, 2, 3], "tenants": ["alice", "bob"]}]}
 *
 * Names (of tenants, groups and pins): 1 to ROUTER_TENANT_NAME_MAX bytes of [A-Za-z0-9_.-],
 * unique within their kind. api_keys: 1 to ROUTER_TENANT_MAX_KEYS non-empty strings of at most
 * ROUTER_TENANT_KEY_MAX bytes; admin_keys: 0 to ROUTER_MAX_ADMIN_KEYS of them; every key is
 * unique across the whole file (an admin key is never a tenant's). max_running (>= 1) and
 * max_waiting (>= 0) default to the values below, at most ROUTER_TENANT_LIMIT_MAX each; the router
 * admits at most max_running + max_waiting unfinished requests of the tenant, and the scheduler
 * runs at most max_running of them at once. max_finished (>= 1, default below, at most
 * ROUTER_TENANT_LIMIT_MAX) bounds the finished results the router keeps for the tenant until
 * their TTL: past it the tenant's own oldest result goes, never another tenant's (the router's
 * max_finished_requests still caps the total; see router.h).
 *
 * Namespaces: a tenant writes to and looks up in "t:NAME", or "g:GROUP" when it names a group
 * (tenants of one group share their cached prefixes). cache_quota_blocks (0: none, at most
 * ROUTER_QUOTA_MAX) is the quota of that namespace: the tenant's own, or the group's. It is a
 * priority, not a cap: when the pool runs out, the unused cached blocks of namespaces over their
 * quota are evicted before anyone else's (scheduler/prefix_cache.h), while free memory may still
 * cache past it (an idle cached block costs nothing and is the first to go). A tenant in a group
 * may not set one (the group's quota is the group's). A pin is a public prefix
 * (token_ids: 1 to ROUTER_PIN_MAX_TOKENS ids >= 0; the vocabulary is the scheduler's to check)
 * computed once and readable by the tenants it names (1 to ROUTER_MAX_TENANTS of them, each
 * once). At most ROUTER_MAX_PINS pins with ROUTER_MAX_PINNED_TOKENS tokens in all, so that the
 * router's Policy message always fits. Any other key is refused, so that a misspelt limit is not
 * silently ignored. The file holds 1 to ROUTER_MAX_TENANTS tenants, 0 to ROUTER_MAX_GROUPS groups
 * and at most ROUTER_MAX_TENANTS_FILE_BYTES. */
#ifndef PAGODA_ROUTER_TENANTS_H
#define PAGODA_ROUTER_TENANTS_H

#include <stddef.h>
#include <stdint.h>

#define ROUTER_MAX_TENANTS 1024u
#define ROUTER_MAX_GROUPS 1024u
#define ROUTER_MAX_TENANTS_FILE_BYTES (8u << 20)
#define ROUTER_TENANT_NAME_MAX 63u
/* "t:" or "g:" and a name. */
#define ROUTER_NAMESPACE_MAX (ROUTER_TENANT_NAME_MAX + 2u)
#define ROUTER_TENANT_KEY_MAX 256u
#define ROUTER_TENANT_MAX_KEYS 64u
#define ROUTER_MAX_ADMIN_KEYS 64u
#define ROUTER_TENANT_DEFAULT_MAX_RUNNING 256u
#define ROUTER_TENANT_DEFAULT_MAX_WAITING 1024u
/* The router's default total (ROUTER_DEFAULT_MAX_FINISHED_REQUESTS): a tenant alone keeps as
 * many results as the router would without tenants; among several, the total's cap takes from
 * the tenant holding the most. */
#define ROUTER_TENANT_DEFAULT_MAX_FINISHED 4096u
#define ROUTER_TENANT_LIMIT_MAX (1u << 24)
#define ROUTER_QUOTA_MAX (1u << 30)
#define ROUTER_MAX_PINS 256u
#define ROUTER_PIN_MAX_TOKENS 65536u
#define ROUTER_MAX_PINNED_TOKENS (1u << 20)

struct router_group {
    char name[ROUTER_TENANT_NAME_MAX + 1];
    uint32_t cache_quota_blocks;
};

struct router_tenant {
    char name[ROUTER_TENANT_NAME_MAX + 1];
    char **api_keys;
    uint32_t num_api_keys;
    uint32_t max_running, max_waiting;
    uint32_t max_finished;       /* finished results kept for it */
    int32_t group;               /* index into router_tenants.groups, or -1 */
    uint32_t cache_quota_blocks; /* of its namespace: its own, or its group's */
    char namespace_name[ROUTER_NAMESPACE_MAX + 1];
};

struct router_pin {
    char name[ROUTER_TENANT_NAME_MAX + 1];
    int32_t *token_ids;
    uint32_t num_tokens;
    char **tenants; /* the tenants that may read it, by name */
    uint32_t num_tenants;
};

struct router_tenants {
    struct router_tenant *tenants;
    uint32_t count;
    struct router_group *groups;
    uint32_t num_groups;
    struct router_pin *pins;
    uint32_t num_pins;
    char **admin_keys;
    uint32_t num_admin_keys;
    uint32_t *by_name; /* tenant indexes sorted by name, for router_tenants_find */
    /* Every key (API and admin), hashed: open addressing, a power of two of slots at most half
     * full; owner is the tenant's index, or -1 for an admin key. */
    struct router_key_slot {
        const char *key; /* NULL: empty */
        int32_t owner;
    } * key_index;
    uint32_t key_cap, num_keys;
};

/* Parses a tenants document of len bytes; origin names it in errors (a path). On success *out
 * is released with router_tenants_free. Errors: PAGODA_EFORMAT (not JSON, a wrong type, an
 * unknown key: the detail names the field, e.g. "tenants[1].api_keys[0]"), PAGODA_ERANGE (a
 * value or a count outside its bounds), PAGODA_EEXIST (a duplicate name or key, an admin key that
 * is also a tenant's), PAGODA_EINVAL (a tenant naming an unknown group, a pin naming an unknown
 * tenant, a quota on a tenant in a group), PAGODA_ENOMEM. */
int router_tenants_parse(const char *json, size_t len, const char *origin,
                         struct router_tenants **out);

/* router_tenants_parse on the file at path. The file is opened without blocking (O_NONBLOCK: a
 * FIFO with no writer does not hold the caller) and must be a regular file (a symlink to one is
 * followed, as Kubernetes mounts ConfigMaps) of at most ROUTER_MAX_TENANTS_FILE_BYTES; nothing of
 * it is read otherwise. It still reads a file, so an event loop calls it from another thread (the
 * router's reload does). Errors: those of router_tenants_parse, PAGODA_ENOENT, PAGODA_EPERM
 * (cannot be opened), PAGODA_EINVAL (not a regular file: a directory, a FIFO, a device),
 * PAGODA_ERANGE (too large), PAGODA_EIO; the detail names the path. */
int router_tenants_load(const char *path, struct router_tenants **out);

/* The tenant whose keys include key, or NULL (a hash lookup). */
const struct router_tenant *router_tenants_find_key(const struct router_tenants *t,
                                                    const char *key);

/* Whether key is one of the file's admin keys (0 for NULL). */
int router_tenants_is_admin_key(const struct router_tenants *t, const char *key);

/* The tenant named name, or NULL (O(log n)). */
const struct router_tenant *router_tenants_find(const struct router_tenants *t, const char *name);

/* The group named name, or NULL. */
const struct router_group *router_tenants_find_group(const struct router_tenants *t,
                                                     const char *name);

/* Whether s is a valid tenant, group or pin name. */
int router_name_ok(const char *s);

/* Checks a pin and copies it into *out (released with router_pin_fini): name, 1 to
 * ROUTER_PIN_MAX_TOKENS token ids >= 0, and 1 to ROUTER_MAX_TENANTS distinct tenants of t. what
 * prefixes the detail of an error ("t.json: pins[2]"). Errors: PAGODA_EFORMAT (a bad name),
 * PAGODA_ERANGE (a count or a negative id), PAGODA_EINVAL (an unknown tenant), PAGODA_EEXIST (a
 * tenant named twice), PAGODA_ENOMEM. */
int router_pin_make(const struct router_tenants *t, const char *what, const char *name,
                    const int32_t *token_ids, size_t num_tokens, const char *const *tenants,
                    size_t num_tenants, struct router_pin *out);

/* Copies a pin into *out without checking it (router_pin_make checks, then copies; a pin
 * already made is copied as it is). Returns 0 or PAGODA_ENOMEM (*out zeroed). */
int router_pin_copy(const char *name, const int32_t *token_ids, size_t num_tokens,
                    const char *const *tenants, size_t num_tenants, struct router_pin *out);

/* Frees what a pin holds and zeroes it. Accepts NULL and a zeroed pin. */
void router_pin_fini(struct router_pin *p);

/* Accepts NULL. */
void router_tenants_free(struct router_tenants *t);

/* Reads the whole regular file at path, at most max bytes, into a new buffer (*out, the caller's
 * to free; *len bytes, then a NUL), without blocking on a FIFO: json_util_read_file, whose errors
 * it returns with what ("the tenants file") before the detail. Errors: PAGODA_EINVAL (not a
 * regular file), PAGODA_ERANGE (too large, also once grown while read), PAGODA_EIO, PAGODA_ENOMEM
 * and those of open. */
int router_read_file(const char *path, size_t max, const char *what, char **out, size_t *len);

#endif
