#include "router/tenants.h"

#include "common/error.h"
#include "common/json_util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

static void free_strings(char **v, uint32_t n)
{
    for (uint32_t i = 0; v != NULL && i < n; i++)
        free(v[i]);
    free(v);
}

void router_pin_fini(struct router_pin *p)
{
    if (p == NULL)
        return;
    free(p->token_ids);
    free_strings(p->tenants, p->num_tenants);
    memset(p, 0, sizeof(*p));
}

void router_tenants_free(struct router_tenants *t)
{
    if (t == NULL)
        return;
    for (uint32_t i = 0; i < t->count; i++)
        free_strings(t->tenants[i].api_keys, t->tenants[i].num_api_keys);
    free(t->tenants);
    free(t->groups);
    for (uint32_t i = 0; i < t->num_pins; i++)
        router_pin_fini(&t->pins[i]);
    free(t->pins);
    free_strings(t->admin_keys, t->num_admin_keys);
    free(t->by_name);
    free(t->key_index);
    free(t);
}

int router_name_ok(const char *s)
{
    if (s == NULL)
        return 0;
    size_t n = strlen(s);
    if (n == 0 || n > ROUTER_TENANT_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '.' || ch == '-'))
            return 0;
    }
    return 1;
}

/* Refuses every key of obj that is not in allowed (NULL-terminated); what names obj. */
static int check_keys(const char *origin, const char *what, const json_t *obj,
                      const char *const *allowed, const char *list)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        int ok = 0;
        for (size_t i = 0; allowed[i] != NULL && !ok; i++)
            ok = strcmp(key, allowed[i]) == 0;
        if (!ok)
            return pagoda_error_set(PAGODA_EFORMAT, "%s: %s has an unknown key \"%.64s\" (%s)",
                                    origin, what, key, list);
    }
    return 0;
}

/* An optional non-negative integer in [min, max]: absent keeps *out (the default). what names
 * the field, e.g. "tenants[3].max_running". */
static int read_u32(const char *origin, const char *what, const json_t *v, uint32_t min,
                    uint32_t max, uint32_t *out)
{
    if (v == NULL)
        return 0;
    if (!json_is_integer(v))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: %s must be an integer", origin, what);
    json_int_t n = json_integer_value(v);
    if (n < (json_int_t)min || n > (json_int_t)max)
        return pagoda_error_set(PAGODA_ERANGE, "%s: %s is %lld, outside [%u, %u]", origin, what,
                                (long long)n, min, max);
    *out = (uint32_t)n;
    return 0;
}

/* A name field: present, a string, of the name charset. */
static int read_name(const char *origin, const char *what, const json_t *v, char *out)
{
    if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
        !router_name_ok(json_string_value(v)))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: %s must be a string of 1 to %u characters [A-Za-z0-9_.-]",
                                origin, what, ROUTER_TENANT_NAME_MAX);
    memcpy(out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

/* The slot of key in the index: its own, or the empty one where it would go. */
static struct router_key_slot *key_slot(const struct router_tenants *t, const char *key)
{
    uint32_t mask = t->key_cap - 1;
    for (uint32_t i = (uint32_t)XXH3_64bits(key, strlen(key)) & mask;; i = (i + 1) & mask)
        if (t->key_index[i].key == NULL || strcmp(t->key_index[i].key, key) == 0)
            return &t->key_index[i];
}

/* Adds key (owned by the file's strings) for owner; the caller checked it is new. */
static int key_index_add(struct router_tenants *t, const char *key, int32_t owner)
{
    if (2 * (t->num_keys + 1) > t->key_cap) {
        uint32_t cap = t->key_cap ? 2 * t->key_cap : 64;
        struct router_key_slot *old = t->key_index;
        uint32_t old_cap = t->key_cap;
        if ((t->key_index = calloc(cap, sizeof(*t->key_index))) == NULL) {
            t->key_index = old;
            return PAGODA_ENOMEM;
        }
        t->key_cap = cap;
        for (uint32_t i = 0; i < old_cap; i++)
            if (old[i].key != NULL)
                *key_slot(t, old[i].key) = old[i];
        free(old);
    }
    *key_slot(t, key) = (struct router_key_slot){key, owner};
    t->num_keys++;
    return 0;
}

static const struct router_key_slot *key_find(const struct router_tenants *t, const char *key)
{
    if (t == NULL || key == NULL || t->key_cap == 0)
        return NULL;
    const struct router_key_slot *s = key_slot(t, key);
    return s->key != NULL ? s : NULL;
}

const struct router_tenant *router_tenants_find_key(const struct router_tenants *t, const char *key)
{
    const struct router_key_slot *s = key_find(t, key);
    return s != NULL && s->owner >= 0 ? &t->tenants[s->owner] : NULL;
}

int router_tenants_is_admin_key(const struct router_tenants *t, const char *key)
{
    const struct router_key_slot *s = key_find(t, key);
    return s != NULL && s->owner < 0;
}

const struct router_tenant *router_tenants_find(const struct router_tenants *t, const char *name)
{
    if (t == NULL || name == NULL || t->by_name == NULL)
        return NULL;
    size_t lo = 0, hi = t->count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(t->tenants[t->by_name[mid]].name, name);
        if (c == 0)
            return &t->tenants[t->by_name[mid]];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

const struct router_group *router_tenants_find_group(const struct router_tenants *t,
                                                     const char *name)
{
    if (t == NULL || name == NULL)
        return NULL;
    for (uint32_t i = 0; i < t->num_groups; i++)
        if (strcmp(t->groups[i].name, name) == 0)
            return &t->groups[i];
    return NULL;
}

int router_pin_make(const struct router_tenants *t, const char *what, const char *name,
                    const int32_t *token_ids, size_t num_tokens, const char *const *tenants,
                    size_t num_tenants, struct router_pin *out)
{
    memset(out, 0, sizeof(*out));
    if (!router_name_ok(name))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s.name must be a string of 1 to %u characters [A-Za-z0-9_.-]",
                                what, ROUTER_TENANT_NAME_MAX);
    if (num_tokens < 1 || num_tokens > ROUTER_PIN_MAX_TOKENS)
        return pagoda_error_set(PAGODA_ERANGE, "%s.token_ids has %zu ids, outside [1, %u]", what,
                                num_tokens, ROUTER_PIN_MAX_TOKENS);
    for (size_t i = 0; i < num_tokens; i++)
        if (token_ids[i] < 0)
            return pagoda_error_set(PAGODA_ERANGE, "%s.token_ids[%zu] is negative (%d)", what, i,
                                    (int)token_ids[i]);
    if (num_tenants < 1 || num_tenants > ROUTER_MAX_TENANTS)
        return pagoda_error_set(PAGODA_ERANGE, "%s.tenants has %zu names, outside [1, %u]", what,
                                num_tenants, ROUTER_MAX_TENANTS);
    for (size_t i = 0; i < num_tenants; i++) {
        if (router_tenants_find(t, tenants[i]) == NULL)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "%s.tenants[%zu] names an unknown tenant \"%.64s\"", what, i,
                                    tenants[i] ? tenants[i] : "");
        for (size_t j = 0; j < i; j++)
            if (strcmp(tenants[i], tenants[j]) == 0)
                return pagoda_error_set(PAGODA_EEXIST, "%s.tenants[%zu] \"%s\" is named twice",
                                        what, i, tenants[i]);
    }
    return router_pin_copy(name, token_ids, num_tokens, tenants, num_tenants, out);
}

int router_pin_copy(const char *name, const int32_t *token_ids, size_t num_tokens,
                    const char *const *tenants, size_t num_tenants, struct router_pin *out)
{
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", name);
    out->token_ids = malloc((num_tokens ? num_tokens : 1) * sizeof(int32_t));
    out->tenants = calloc(num_tenants ? num_tenants : 1, sizeof(char *));
    if (out->token_ids == NULL || out->tenants == NULL)
        goto nomem;
    if (num_tokens)
        memcpy(out->token_ids, token_ids, num_tokens * sizeof(int32_t));
    out->num_tokens = (uint32_t)num_tokens;
    for (size_t i = 0; i < num_tenants; i++) {
        if ((out->tenants[i] = strdup(tenants[i])) == NULL)
            goto nomem;
        out->num_tenants++;
    }
    return 0;
nomem:
    router_pin_fini(out);
    return PAGODA_ENOMEM;
}

/* A key (API or admin): a non-empty string of at most ROUTER_TENANT_KEY_MAX bytes, unique in
 * the file so far. Never echoed, even in an error: a key is a secret. */
static int read_key(const char *origin, const char *what, size_t k, const json_t *kv,
                    struct router_tenants *t, int32_t owner, char **out)
{
    if (!json_is_string(kv) || json_string_length(kv) == 0 ||
        json_string_length(kv) > ROUTER_TENANT_KEY_MAX ||
        strlen(json_string_value(kv)) != json_string_length(kv))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: %s[%zu] must be a non-empty string of at most %u bytes",
                                origin, what, k, ROUTER_TENANT_KEY_MAX);
    const char *key = json_string_value(kv);
    if (key_find(t, key) != NULL)
        return pagoda_error_set(PAGODA_EEXIST, "%s: %s[%zu] is used twice in the file", origin,
                                what, k);
    if ((*out = strdup(key)) == NULL)
        return PAGODA_ENOMEM;
    if (key_index_add(t, *out, owner) != 0) {
        free(*out);
        *out = NULL;
        return PAGODA_ENOMEM;
    }
    return 0;
}

static int parse_group(const char *origin, uint32_t i, const json_t *obj, struct router_tenants *t)
{
    static const char *const keys[] = {"name", "cache_quota_blocks", NULL};
    struct router_group *g = &t->groups[i];
    char what[64];
    if (!json_is_object(obj))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: groups[%u] must be an object", origin, i);
    snprintf(what, sizeof(what), "groups[%u]", i);
    int rc = check_keys(origin, what, obj, keys, "name, cache_quota_blocks");
    snprintf(what, sizeof(what), "groups[%u].name", i);
    if (rc == 0)
        rc = read_name(origin, what, json_object_get(obj, "name"), g->name);
    if (rc != 0)
        return rc;
    for (uint32_t j = 0; j < i; j++)
        if (strcmp(t->groups[j].name, g->name) == 0)
            return pagoda_error_set(PAGODA_EEXIST, "%s: groups[%u].name \"%s\" is used twice",
                                    origin, i, g->name);
    snprintf(what, sizeof(what), "groups[%u].cache_quota_blocks", i);
    return read_u32(origin, what, json_object_get(obj, "cache_quota_blocks"), 0, ROUTER_QUOTA_MAX,
                    &g->cache_quota_blocks);
}

static int parse_tenant(const char *origin, uint32_t i, const json_t *obj, struct router_tenants *t)
{
    static const char *const allowed[] = {"name",         "api_keys", "max_running",
                                          "max_waiting",  "group",    "cache_quota_blocks",
                                          "max_finished", NULL};
    struct router_tenant *tn = &t->tenants[i];
    tn->group = -1;
    char what[64];
    if (!json_is_object(obj))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: tenants[%u] must be an object", origin, i);
    snprintf(what, sizeof(what), "tenants[%u]", i);
    int rc = check_keys(origin, what, obj, allowed,
                        "name, api_keys, group, max_running, max_waiting, max_finished, "
                        "cache_quota_blocks");
    snprintf(what, sizeof(what), "tenants[%u].name", i);
    if (rc == 0)
        rc = read_name(origin, what, json_object_get(obj, "name"), tn->name);
    if (rc != 0)
        return rc;
    for (uint32_t j = 0; j < i; j++)
        if (strcmp(t->tenants[j].name, tn->name) == 0)
            return pagoda_error_set(PAGODA_EEXIST, "%s: tenants[%u].name \"%s\" is used twice",
                                    origin, i, tn->name);

    json_t *keys = json_object_get(obj, "api_keys");
    if (!json_is_array(keys))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: tenants[%u].api_keys must be an array", origin,
                                i);
    size_t n = json_array_size(keys);
    if (n < 1 || n > ROUTER_TENANT_MAX_KEYS)
        return pagoda_error_set(PAGODA_ERANGE,
                                "%s: tenants[%u].api_keys has %zu keys, outside "
                                "[1, %u]",
                                origin, i, n, ROUTER_TENANT_MAX_KEYS);
    tn->api_keys = calloc(n, sizeof(*tn->api_keys));
    if (tn->api_keys == NULL)
        return PAGODA_ENOMEM;
    snprintf(what, sizeof(what), "tenants[%u].api_keys", i);
    for (size_t k = 0; k < n; k++) {
        if ((rc = read_key(origin, what, k, json_array_get(keys, k), t, (int32_t)i,
                           &tn->api_keys[k])) != 0)
            return rc;
        tn->num_api_keys++;
    }
    tn->max_running = ROUTER_TENANT_DEFAULT_MAX_RUNNING;
    tn->max_waiting = ROUTER_TENANT_DEFAULT_MAX_WAITING;
    snprintf(what, sizeof(what), "tenants[%u].max_running", i);
    if ((rc = read_u32(origin, what, json_object_get(obj, "max_running"), 1,
                       ROUTER_TENANT_LIMIT_MAX, &tn->max_running)) != 0)
        return rc;
    snprintf(what, sizeof(what), "tenants[%u].max_waiting", i);
    if ((rc = read_u32(origin, what, json_object_get(obj, "max_waiting"), 0,
                       ROUTER_TENANT_LIMIT_MAX, &tn->max_waiting)) != 0)
        return rc;
    tn->max_finished = ROUTER_TENANT_DEFAULT_MAX_FINISHED;
    snprintf(what, sizeof(what), "tenants[%u].max_finished", i);
    if ((rc = read_u32(origin, what, json_object_get(obj, "max_finished"), 1,
                       ROUTER_TENANT_LIMIT_MAX, &tn->max_finished)) != 0)
        return rc;
    json_t *quota = json_object_get(obj, "cache_quota_blocks");
    snprintf(what, sizeof(what), "tenants[%u].cache_quota_blocks", i);
    if ((rc = read_u32(origin, what, quota, 0, ROUTER_QUOTA_MAX, &tn->cache_quota_blocks)) != 0)
        return rc;

    json_t *group = json_object_get(obj, "group");
    if (group == NULL) {
        snprintf(tn->namespace_name, sizeof(tn->namespace_name), "t:%s", tn->name);
        return 0;
    }
    char gname[ROUTER_TENANT_NAME_MAX + 1];
    snprintf(what, sizeof(what), "tenants[%u].group", i);
    if ((rc = read_name(origin, what, group, gname)) != 0)
        return rc;
    const struct router_group *g = router_tenants_find_group(t, gname);
    if (g == NULL)
        return pagoda_error_set(
            PAGODA_EINVAL, "%s: tenants[%u].group names an unknown group \"%s\"", origin, i, gname);
    if (quota != NULL)
        return pagoda_error_set(PAGODA_EINVAL,
                                "%s: tenants[%u].cache_quota_blocks: tenant \"%s\" is in group "
                                "\"%s\", whose quota is the group's (set it on the group)",
                                origin, i, tn->name, g->name);
    tn->group = (int32_t)(g - t->groups);
    tn->cache_quota_blocks = g->cache_quota_blocks;
    snprintf(tn->namespace_name, sizeof(tn->namespace_name), "g:%s", g->name);
    return 0;
}

static int parse_pin(const char *origin, uint32_t i, const json_t *obj, struct router_tenants *t,
                     uint64_t *total_tokens)
{
    static const char *const allowed[] = {"name", "token_ids", "tenants", NULL};
    char what[600];
    if (!json_is_object(obj))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: pins[%u] must be an object", origin, i);
    snprintf(what, sizeof(what), "pins[%u]", i);
    int rc = check_keys(origin, what, obj, allowed, "name, token_ids, tenants");
    if (rc != 0)
        return rc;
    json_t *name = json_object_get(obj, "name");
    json_t *ids = json_object_get(obj, "token_ids");
    json_t *names = json_object_get(obj, "tenants");
    if (!json_is_string(name))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: pins[%u].name must be a string", origin, i);
    if (!json_is_array(ids))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: pins[%u].token_ids must be an array", origin,
                                i);
    if (!json_is_array(names))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: pins[%u].tenants must be an array", origin, i);
    size_t n = json_array_size(ids), nt = json_array_size(names);
    if (n > ROUTER_PIN_MAX_TOKENS || nt > ROUTER_MAX_TENANTS) /* before allocating for them */
        return pagoda_error_set(PAGODA_ERANGE,
                                "%s: pins[%u] has %zu token_ids and %zu tenants, more than the "
                                "limits of %u and %u",
                                origin, i, n, nt, ROUTER_PIN_MAX_TOKENS, ROUTER_MAX_TENANTS);
    for (size_t k = 0; k < n; k++) {
        json_t *v = json_array_get(ids, k);
        if (!json_is_integer(v))
            return pagoda_error_set(PAGODA_EFORMAT,
                                    "%s: pins[%u].token_ids[%zu] must be an integer", origin, i, k);
        if (json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "%s: pins[%u].token_ids[%zu] is %lld, outside [0, %d]", origin,
                                    i, k, (long long)json_integer_value(v), INT32_MAX);
    }
    for (size_t k = 0; k < nt; k++)
        if (!json_is_string(json_array_get(names, k)))
            return pagoda_error_set(PAGODA_EFORMAT, "%s: pins[%u].tenants[%zu] must be a string",
                                    origin, i, k);
    int32_t *tokens = malloc((n ? n : 1) * sizeof(int32_t));
    const char **tn = calloc(nt ? nt : 1, sizeof(char *));
    if (tokens == NULL || tn == NULL) {
        free(tokens);
        free(tn);
        return PAGODA_ENOMEM;
    }
    for (size_t k = 0; k < n; k++)
        tokens[k] = (int32_t)json_integer_value(json_array_get(ids, k));
    for (size_t k = 0; k < nt; k++)
        tn[k] = json_string_value(json_array_get(names, k));
    snprintf(what, sizeof(what), "%s: pins[%u]", origin, i);
    rc = router_pin_make(t, what, json_string_value(name), tokens, n, tn, nt, &t->pins[i]);
    free(tokens);
    free(tn);
    if (rc != 0)
        return rc;
    for (uint32_t j = 0; j < i; j++)
        if (strcmp(t->pins[j].name, t->pins[i].name) == 0)
            return pagoda_error_set(PAGODA_EEXIST, "%s: pins[%u].name \"%s\" is used twice", origin,
                                    i, t->pins[i].name);
    *total_tokens += n;
    if (*total_tokens > ROUTER_MAX_PINNED_TOKENS)
        return pagoda_error_set(PAGODA_ERANGE,
                                "%s: pins[%u]: the pins hold more than %u tokens in all", origin, i,
                                ROUTER_MAX_PINNED_TOKENS);
    return 0;
}

/* An optional array of 0 to max entries; *n is 0 when absent. */
static int read_array(const char *origin, const json_t *root, const char *key, size_t min,
                      size_t max, json_t **arr, size_t *n)
{
    *arr = json_object_get(root, key);
    *n = 0;
    if (*arr == NULL && min == 0)
        return 0;
    if (!json_is_array(*arr))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: \"%s\" must be an array", origin, key);
    *n = json_array_size(*arr);
    if (*n < min || *n > max)
        return pagoda_error_set(PAGODA_ERANGE, "%s: \"%s\" has %zu entries, outside [%zu, %zu]",
                                origin, key, *n, min, max);
    return 0;
}

/* Sorts t->by_name by the tenants' names: an insertion sort, at most ROUTER_MAX_TENANTS^2 / 2
 * comparisons once per load (qsort has no context argument in C11). */
static void sort_by_name(struct router_tenants *t)
{
    uint32_t *v = t->by_name;
    for (uint32_t i = 0; i < t->count; i++) {
        uint32_t k = i;
        while (k > 0 && strcmp(t->tenants[v[k - 1]].name, t->tenants[i].name) > 0) {
            v[k] = v[k - 1];
            k--;
        }
        v[k] = i;
    }
}

static int parse_root(const char *origin, const json_t *root, struct router_tenants *t)
{
    static const char *const allowed[] = {"admin_keys", "groups", "tenants", "pins", NULL};
    if (!json_is_object(root))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: must be an object {\"tenants\": [...]}",
                                origin);
    int rc = check_keys(origin, "the file", root, allowed, "admin_keys, groups, tenants, pins");
    json_t *groups, *tenants, *pins, *admin;
    size_t ng, nt, np, na;
    if (rc == 0)
        rc = read_array(origin, root, "groups", 0, ROUTER_MAX_GROUPS, &groups, &ng);
    if (rc == 0)
        rc = read_array(origin, root, "tenants", 1, ROUTER_MAX_TENANTS, &tenants, &nt);
    if (rc == 0)
        rc = read_array(origin, root, "pins", 0, ROUTER_MAX_PINS, &pins, &np);
    if (rc == 0)
        rc = read_array(origin, root, "admin_keys", 0, ROUTER_MAX_ADMIN_KEYS, &admin, &na);
    if (rc != 0)
        return rc;
    t->groups = calloc(ng ? ng : 1, sizeof(*t->groups));
    t->tenants = calloc(nt, sizeof(*t->tenants));
    t->pins = calloc(np ? np : 1, sizeof(*t->pins));
    t->admin_keys = calloc(na ? na : 1, sizeof(*t->admin_keys));
    t->by_name = calloc(nt, sizeof(*t->by_name));
    if (t->groups == NULL || t->tenants == NULL || t->pins == NULL || t->admin_keys == NULL ||
        t->by_name == NULL)
        return PAGODA_ENOMEM;
    for (size_t i = 0; i < ng; i++) {
        if ((rc = parse_group(origin, (uint32_t)i, json_array_get(groups, i), t)) != 0)
            return rc;
        t->num_groups++;
    }
    for (size_t i = 0; i < nt; i++) {
        t->count = (uint32_t)i + 1; /* so that a failure frees what this entry holds */
        if ((rc = parse_tenant(origin, (uint32_t)i, json_array_get(tenants, i), t)) != 0)
            return rc;
    }
    sort_by_name(t);
    uint64_t total_tokens = 0;
    for (size_t i = 0; i < np; i++) {
        t->num_pins = (uint32_t)i + 1;
        if ((rc = parse_pin(origin, (uint32_t)i, json_array_get(pins, i), t, &total_tokens)) != 0)
            return rc;
    }
    for (size_t i = 0; i < na; i++) {
        if ((rc = read_key(origin, "admin_keys", i, json_array_get(admin, i), t, -1,
                           &t->admin_keys[i])) != 0)
            return rc;
        t->num_admin_keys++;
    }
    return 0;
}

int router_tenants_parse(const char *json, size_t len, const char *origin,
                         struct router_tenants **out)
{
    if (origin == NULL)
        origin = "tenants";
    if (len > ROUTER_MAX_TENANTS_FILE_BYTES)
        return pagoda_error_set(PAGODA_ERANGE, "%s: %zu bytes, more than the limit of %u", origin,
                                len, ROUTER_MAX_TENANTS_FILE_BYTES);
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return pagoda_error_set(PAGODA_EFORMAT, "%s:%d:%d: %s", origin, jerr.line, jerr.column,
                                jerr.text);
    struct router_tenants *t = calloc(1, sizeof(*t));
    int rc = t == NULL ? PAGODA_ENOMEM : parse_root(origin, root, t);
    json_decref(root);
    if (rc != 0) {
        router_tenants_free(t);
        return rc;
    }
    *out = t;
    return 0;
}

/* json_util_read_file (a regular file only, opened without blocking on a FIFO; at most max bytes,
 * also while it grows), its refusals prefixed by what the file is. */
int router_read_file(const char *path, size_t max, const char *what, char **out, size_t *len)
{
    int rc = json_util_read_file(path, max, out, len);
    if (rc != 0 && pagoda_error_detail()[0] != '\0') {
        char detail[600];
        snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
        pagoda_error_set(rc, "%s: %s", what, detail);
    }
    return rc;
}

int router_tenants_load(const char *path, struct router_tenants **out)
{
    char *buf = NULL;
    size_t len = 0;
    int rc = router_read_file(path, ROUTER_MAX_TENANTS_FILE_BYTES, "the tenants file", &buf, &len);
    if (rc != 0)
        return rc;
    rc = router_tenants_parse(buf, len, path, out);
    free(buf);
    return rc;
}
