/* libFuzzer target: a tenants file (router/tenants.h), the bytes as the file's contents.
 *
 * Every document must be either refused with an error code of the contract or parsed into a
 * configuration whose invariants hold: counts within their limits, every key found again by its
 * lookup, every tenant by its name, every group index in range. */
#include "common/error.h"
#include "router/tenants.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(const struct router_tenants *t)
{
    if (t->count < 1 || t->count > ROUTER_MAX_TENANTS || t->num_groups > ROUTER_MAX_GROUPS ||
        t->num_pins > ROUTER_MAX_PINS || t->num_admin_keys > ROUTER_MAX_ADMIN_KEYS)
        abort();
    for (uint32_t i = 0; i < t->count; i++) {
        const struct router_tenant *tn = &t->tenants[i];
        if (!router_name_ok(tn->name) || router_tenants_find(t, tn->name) != tn)
            abort();
        if (tn->group < -1 || tn->group >= (int32_t)t->num_groups)
            abort();
        if (tn->num_api_keys < 1 || tn->num_api_keys > ROUTER_TENANT_MAX_KEYS)
            abort();
        for (uint32_t k = 0; k < tn->num_api_keys; k++)
            if (router_tenants_find_key(t, tn->api_keys[k]) != tn ||
                router_tenants_is_admin_key(t, tn->api_keys[k]))
                abort();
    }
    for (uint32_t g = 0; g < t->num_groups; g++)
        if (router_tenants_find_group(t, t->groups[g].name) != &t->groups[g])
            abort();
    for (uint32_t k = 0; k < t->num_admin_keys; k++)
        if (!router_tenants_is_admin_key(t, t->admin_keys[k]) ||
            router_tenants_find_key(t, t->admin_keys[k]) != NULL)
            abort();
    uint64_t pinned = 0;
    for (uint32_t p = 0; p < t->num_pins; p++) {
        const struct router_pin *pin = &t->pins[p];
        if (pin->num_tokens < 1 || pin->num_tokens > ROUTER_PIN_MAX_TOKENS)
            abort();
        for (uint32_t i = 0; i < pin->num_tokens; i++)
            if (pin->token_ids[i] < 0)
                abort();
        for (uint32_t i = 0; i < pin->num_tenants; i++)
            if (router_tenants_find(t, pin->tenants[i]) == NULL)
                abort();
        pinned += pin->num_tokens;
    }
    if (pinned > ROUTER_MAX_PINNED_TOKENS)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct router_tenants *t = NULL;
    int rc = router_tenants_parse((const char *)data, size, "fuzz.json", &t);
    if (rc == 0) {
        check(t);
        router_tenants_free(t);
    } else if (t != NULL || (rc != PAGODA_EFORMAT && rc != PAGODA_ERANGE && rc != PAGODA_EEXIST &&
                             rc != PAGODA_EINVAL && rc != PAGODA_ENOMEM)) {
        abort();
    }
    return 0;
}
