#include "router/tenants.h"

#include "common/error.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void router_tenants_free(struct router_tenants *t)
{
    if (t == NULL)
        return;
    for (uint32_t i = 0; i < t->count; i++) {
        for (uint32_t k = 0; k < t->tenants[i].num_api_keys; k++)
            free(t->tenants[i].api_keys[k]);
        free(t->tenants[i].api_keys);
    }
    free(t->tenants);
    free(t);
}

static int name_ok(const char *s)
{
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

/* An optional limit: absent keeps *out (the default). */
static int read_limit(const char *origin, uint32_t i, const json_t *obj, const char *key,
                      uint32_t min, uint32_t *out)
{
    json_t *v = json_object_get(obj, key);
    if (v == NULL)
        return 0;
    if (!json_is_integer(v))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: tenants[%u].%s must be an integer", origin, i,
                                key);
    json_int_t n = json_integer_value(v);
    if (n < (json_int_t)min || n > (json_int_t)ROUTER_TENANT_LIMIT_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "%s: tenants[%u].%s is %lld, outside [%u, %u]",
                                origin, i, key, (long long)n, min, ROUTER_TENANT_LIMIT_MAX);
    *out = (uint32_t)n;
    return 0;
}

static int key_taken(const struct router_tenants *t, const char *key)
{
    return router_tenants_find_key(t, key) != NULL;
}

static int parse_tenant(const char *origin, uint32_t i, const json_t *obj, struct router_tenants *t)
{
    struct router_tenant *tn = &t->tenants[i];
    if (!json_is_object(obj))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: tenants[%u] must be an object", origin, i);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v)
    {
        if (strcmp(key, "name") != 0 && strcmp(key, "api_keys") != 0 &&
            strcmp(key, "max_running") != 0 && strcmp(key, "max_waiting") != 0)
            return pagoda_error_set(PAGODA_EFORMAT,
                                    "%s: tenants[%u] has an unknown key \"%.64s\" (name, "
                                    "api_keys, max_running, max_waiting)",
                                    origin, i, key);
    }
    v = json_object_get(obj, "name");
    if (!json_is_string(v) || !name_ok(json_string_value(v)))
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s: tenants[%u].name must be a string of 1 to %u characters "
                                "[A-Za-z0-9_.-]",
                                origin, i, ROUTER_TENANT_NAME_MAX);
    for (uint32_t j = 0; j < i; j++)
        if (strcmp(t->tenants[j].name, json_string_value(v)) == 0)
            return pagoda_error_set(PAGODA_EEXIST, "%s: tenants[%u].name \"%s\" is used twice",
                                    origin, i, json_string_value(v));
    snprintf(tn->name, sizeof(tn->name), "%s", json_string_value(v));

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
    for (size_t k = 0; k < n; k++) {
        json_t *kv = json_array_get(keys, k);
        if (!json_is_string(kv) || json_string_length(kv) == 0 ||
            json_string_length(kv) > ROUTER_TENANT_KEY_MAX ||
            strlen(json_string_value(kv)) != json_string_length(kv))
            return pagoda_error_set(PAGODA_EFORMAT,
                                    "%s: tenants[%u].api_keys[%zu] must be a non-empty string of "
                                    "at most %u bytes",
                                    origin, i, k, ROUTER_TENANT_KEY_MAX);
        /* Not echoed: a key is a secret, even in an error message. */
        if (key_taken(t, json_string_value(kv)))
            return pagoda_error_set(PAGODA_EEXIST,
                                    "%s: tenants[%u].api_keys[%zu] is used twice in the file",
                                    origin, i, k);
        if ((tn->api_keys[k] = strdup(json_string_value(kv))) == NULL)
            return PAGODA_ENOMEM;
        tn->num_api_keys++;
    }
    tn->max_running = ROUTER_TENANT_DEFAULT_MAX_RUNNING;
    tn->max_waiting = ROUTER_TENANT_DEFAULT_MAX_WAITING;
    int rc = read_limit(origin, i, obj, "max_running", 1, &tn->max_running);
    if (rc == 0)
        rc = read_limit(origin, i, obj, "max_waiting", 0, &tn->max_waiting);
    return rc;
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
    struct router_tenants *t = NULL;
    int rc = 0;
    const char *key;
    json_t *v;
    if (!json_is_object(root)) {
        rc = pagoda_error_set(PAGODA_EFORMAT, "%s: must be an object {\"tenants\": [...]}", origin);
        goto fail;
    }
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "tenants") != 0) {
            rc = pagoda_error_set(PAGODA_EFORMAT, "%s: unknown key \"%.64s\" (only \"tenants\")",
                                  origin, key);
            goto fail;
        }
    }
    json_t *arr = json_object_get(root, "tenants");
    if (!json_is_array(arr)) {
        rc = pagoda_error_set(PAGODA_EFORMAT, "%s: \"tenants\" must be an array", origin);
        goto fail;
    }
    size_t n = json_array_size(arr);
    if (n < 1 || n > ROUTER_MAX_TENANTS) {
        rc = pagoda_error_set(PAGODA_ERANGE, "%s: \"tenants\" has %zu entries, outside [1, %u]",
                              origin, n, ROUTER_MAX_TENANTS);
        goto fail;
    }
    t = calloc(1, sizeof(*t));
    if (t == NULL || (t->tenants = calloc(n, sizeof(*t->tenants))) == NULL) {
        rc = PAGODA_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < n; i++) {
        t->count = (uint32_t)i + 1; /* so that a failure frees what this entry holds */
        if ((rc = parse_tenant(origin, (uint32_t)i, json_array_get(arr, i), t)) != 0)
            goto fail;
    }
    json_decref(root);
    *out = t;
    return 0;

fail:
    router_tenants_free(t);
    json_decref(root);
    return rc;
}

int router_tenants_load(const char *path, struct router_tenants **out)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return pagoda_error_set(pagoda_from_errno(errno), "%s: cannot open the tenants file", path);
    char *buf = malloc(ROUTER_MAX_TENANTS_FILE_BYTES + 1);
    if (buf == NULL) {
        fclose(f);
        return PAGODA_ENOMEM;
    }
    size_t len = fread(buf, 1, ROUTER_MAX_TENANTS_FILE_BYTES + 1, f);
    int err = ferror(f);
    fclose(f);
    int rc;
    if (err)
        rc = pagoda_error_set(PAGODA_EIO, "%s: cannot read the tenants file", path);
    else if (len > ROUTER_MAX_TENANTS_FILE_BYTES)
        rc = pagoda_error_set(PAGODA_ERANGE, "%s: more than the limit of %u bytes", path,
                              ROUTER_MAX_TENANTS_FILE_BYTES);
    else
        rc = router_tenants_parse(buf, len, path, out);
    free(buf);
    return rc;
}

const struct router_tenant *router_tenants_find_key(const struct router_tenants *t, const char *key)
{
    if (t == NULL || key == NULL)
        return NULL;
    for (uint32_t i = 0; i < t->count; i++)
        for (uint32_t k = 0; k < t->tenants[i].num_api_keys; k++)
            if (t->tenants[i].api_keys[k] != NULL && strcmp(t->tenants[i].api_keys[k], key) == 0)
                return &t->tenants[i];
    return NULL;
}
