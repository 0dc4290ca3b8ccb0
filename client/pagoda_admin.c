#include "client/pagoda_admin.h"
#include "client/client_internal.h"

#include "proto/pagoda.pb-c.h"

#include <stdlib.h>
#include <string.h>

static void free_strings(char **v, size_t n)
{
    for (size_t i = 0; v != NULL && i < n; i++)
        free(v[i]);
    free(v);
}

/* A copy of s (NULL stays NULL); *ok is cleared when memory runs out. */
static char *dup_or_null(const char *s, int *ok)
{
    if (s == NULL)
        return NULL;
    char *d = strdup(s);
    if (d == NULL)
        *ok = 0;
    return d;
}

static char **dup_strings(char *const *v, size_t n, int *ok)
{
    char **d = calloc(n ? n : 1, sizeof(*d));
    if (d == NULL) {
        *ok = 0;
        return NULL;
    }
    for (size_t i = 0; i < n; i++)
        d[i] = dup_or_null(v[i] ? v[i] : "", ok);
    return d;
}

void pagoda_pin_info_free(pagoda_pin_info *p)
{
    if (p == NULL)
        return;
    free(p->name);
    free_strings(p->tenants, p->num_tenants);
    free(p->error);
    memset(p, 0, sizeof(*p));
}

static void tenant_info_free(pagoda_tenant_info *t)
{
    free(t->name);
    free(t->group);
    free(t->namespace_name);
    free_strings(t->pins, t->num_pins);
}

void pagoda_admin_list_free(pagoda_admin_list *l)
{
    if (l == NULL)
        return;
    for (size_t i = 0; l->tenants != NULL && i < l->num_tenants; i++)
        tenant_info_free(&l->tenants[i]);
    free(l->tenants);
    for (size_t i = 0; l->pins != NULL && i < l->num_pins; i++)
        pagoda_pin_info_free(&l->pins[i]);
    free(l->pins);
    memset(l, 0, sizeof(*l));
}

static int pin_from_proto(const Pagoda__PinInfo *in, pagoda_pin_info *out)
{
    int ok = 1;
    memset(out, 0, sizeof(*out));
    out->name = dup_or_null(in->name ? in->name : "", &ok);
    out->num_tokens = in->num_tokens;
    out->tenants = dup_strings(in->tenants, in->n_tenants, &ok);
    out->num_tenants = out->tenants != NULL ? in->n_tenants : 0;
    out->ready = in->ready != 0;
    out->blocks = in->blocks;
    out->error = dup_or_null(in->error, &ok);
    out->from_file = in->from_file != 0;
    if (!ok) {
        pagoda_pin_info_free(out);
        return PAGODA_ENOMEM;
    }
    return 0;
}

static int tenant_from_proto(const Pagoda__TenantInfo *in, pagoda_tenant_info *out)
{
    int ok = 1;
    memset(out, 0, sizeof(*out));
    out->name = dup_or_null(in->name ? in->name : "", &ok);
    out->group = dup_or_null(in->group, &ok);
    out->namespace_name = dup_or_null(in->namespace_ ? in->namespace_ : "", &ok);
    out->max_running = in->max_running;
    out->max_waiting = in->max_waiting;
    out->cache_quota_blocks = in->cache_quota_blocks;
    out->lookups = in->lookups;
    out->hits = in->hits;
    out->query_tokens = in->query_tokens;
    out->hit_tokens = in->hit_tokens;
    out->hit_rate = in->hit_rate;
    out->cached_blocks = in->cached_blocks;
    out->evictions = in->evictions;
    out->running = in->running;
    out->waiting = in->waiting;
    out->pins = dup_strings(in->pins, in->n_pins, &ok);
    out->num_pins = out->pins != NULL ? in->n_pins : 0;
    if (!ok) {
        tenant_info_free(out);
        memset(out, 0, sizeof(*out));
        return PAGODA_ENOMEM;
    }
    return 0;
}

static int list_from_proto(const Pagoda__AdminResponse *a, pagoda_admin_list *out)
{
    memset(out, 0, sizeof(*out));
    out->tenants = calloc(a->n_tenants ? a->n_tenants : 1, sizeof(*out->tenants));
    out->pins = calloc(a->n_pins ? a->n_pins : 1, sizeof(*out->pins));
    if (out->tenants == NULL || out->pins == NULL) {
        pagoda_admin_list_free(out);
        return PAGODA_ENOMEM;
    }
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < a->n_tenants; i++)
        if ((rc = tenant_from_proto(a->tenants[i], &out->tenants[i])) == 0)
            out->num_tenants++;
    for (size_t i = 0; rc == 0 && i < a->n_pins; i++)
        if ((rc = pin_from_proto(a->pins[i], &out->pins[i])) == 0)
            out->num_pins++;
    if (rc != 0)
        pagoda_admin_list_free(out);
    return rc;
}

int client_admin_list_from_proto(const Pagoda__AdminResponse *a, pagoda_admin_list *out)
{
    return list_from_proto(a, out);
}

/* One admin call; on success *out is the reply's AdminResponse holder (free the reply with
 * pagoda__client_response__free_unpacked). */
static int admin_call(pagoda_client *c, Pagoda__AdminRequest *admin, Pagoda__ClientResponse **out)
{
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_ADMIN;
    req.admin = admin;
    int rc = client_call(c, &req, PAGODA_ADMIN_WAIT_MS, out);
    if (rc != 0)
        return rc;
    if ((*out)->result_case != PAGODA__CLIENT_RESPONSE__RESULT_ADMIN || (*out)->admin == NULL) {
        pagoda__client_response__free_unpacked(*out, NULL);
        *out = NULL;
        return pagoda_error_set(PAGODA_EPROTO, "the router's reply carries no admin answer");
    }
    return 0;
}

int pagoda_admin_tenants(pagoda_client *c, pagoda_admin_list *out)
{
    if (c == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_admin_tenants: NULL argument");
    memset(out, 0, sizeof(*out));
    Pagoda__AdminTenantsRequest tenants = PAGODA__ADMIN_TENANTS_REQUEST__INIT;
    Pagoda__AdminRequest admin = PAGODA__ADMIN_REQUEST__INIT;
    admin.op_case = PAGODA__ADMIN_REQUEST__OP_TENANTS;
    admin.tenants = &tenants;
    Pagoda__ClientResponse *resp = NULL;
    int rc = admin_call(c, &admin, &resp);
    if (rc != 0)
        return rc;
    rc = list_from_proto(resp->admin, out);
    pagoda__client_response__free_unpacked(resp, NULL);
    return rc;
}

int pagoda_admin_pin(pagoda_client *c, const char *name, const int32_t *tokens, size_t n,
                     const char *const *tenants, size_t num_tenants, pagoda_pin_info *status)
{
    if (status != NULL)
        memset(status, 0, sizeof(*status));
    if (c == NULL || name == NULL || (n > 0 && tokens == NULL) ||
        (num_tenants > 0 && tenants == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_admin_pin: NULL argument");
    for (size_t i = 0; i < num_tenants; i++)
        if (tenants[i] == NULL)
            return pagoda_error_set(PAGODA_EINVAL, "pagoda_admin_pin: tenant %zu is NULL", i);
    Pagoda__AdminPinRequest pin = PAGODA__ADMIN_PIN_REQUEST__INIT;
    pin.name = (char *)name;
    pin.n_token_ids = n;
    pin.token_ids = (int32_t *)tokens;
    pin.n_tenants = num_tenants;
    pin.tenants = (char **)tenants;
    Pagoda__AdminRequest admin = PAGODA__ADMIN_REQUEST__INIT;
    admin.op_case = PAGODA__ADMIN_REQUEST__OP_PIN;
    admin.pin = &pin;
    Pagoda__ClientResponse *resp = NULL;
    int rc = admin_call(c, &admin, &resp);
    if (rc != 0)
        return rc;
    if (resp->admin->n_pins != 1 || resp->admin->pins[0]->name == NULL ||
        strcmp(resp->admin->pins[0]->name, name) != 0)
        rc = pagoda_error_set(PAGODA_EPROTO, "the router's answer to a pin is not the pin");
    else if (status != NULL)
        rc = pin_from_proto(resp->admin->pins[0], status);
    pagoda__client_response__free_unpacked(resp, NULL);
    return rc;
}

int pagoda_admin_unpin(pagoda_client *c, const char *name)
{
    if (c == NULL || name == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_admin_unpin: NULL argument");
    Pagoda__AdminUnpinRequest unpin = PAGODA__ADMIN_UNPIN_REQUEST__INIT;
    unpin.name = (char *)name;
    Pagoda__AdminRequest admin = PAGODA__ADMIN_REQUEST__INIT;
    admin.op_case = PAGODA__ADMIN_REQUEST__OP_UNPIN;
    admin.unpin = &unpin;
    Pagoda__ClientResponse *resp = NULL;
    int rc = admin_call(c, &admin, &resp);
    if (rc == 0)
        pagoda__client_response__free_unpacked(resp, NULL);
    return rc;
}

static int flush(pagoda_client *c, const char *tenant, const char *group, uint32_t *flushed)
{
    if (flushed != NULL)
        *flushed = 0;
    if (c == NULL || (tenant == NULL && group == NULL))
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_admin_flush: NULL argument");
    Pagoda__AdminFlushRequest fl = PAGODA__ADMIN_FLUSH_REQUEST__INIT;
    fl.tenant = (char *)tenant;
    fl.group = (char *)group;
    Pagoda__AdminRequest admin = PAGODA__ADMIN_REQUEST__INIT;
    admin.op_case = PAGODA__ADMIN_REQUEST__OP_FLUSH;
    admin.flush = &fl;
    Pagoda__ClientResponse *resp = NULL;
    int rc = admin_call(c, &admin, &resp);
    if (rc != 0)
        return rc;
    if (flushed != NULL)
        *flushed = resp->admin->flushed_blocks;
    pagoda__client_response__free_unpacked(resp, NULL);
    return 0;
}

int pagoda_admin_flush_tenant(pagoda_client *c, const char *tenant, uint32_t *flushed_blocks)
{
    return flush(c, tenant, NULL, flushed_blocks);
}

int pagoda_admin_flush_group(pagoda_client *c, const char *group, uint32_t *flushed_blocks)
{
    return flush(c, NULL, group, flushed_blocks);
}

int pagoda_admin_reload(pagoda_client *c, pagoda_admin_list *pins)
{
    if (pins != NULL)
        memset(pins, 0, sizeof(*pins));
    if (c == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_admin_reload: NULL client");
    Pagoda__AdminReloadRequest reload = PAGODA__ADMIN_RELOAD_REQUEST__INIT;
    Pagoda__AdminRequest admin = PAGODA__ADMIN_REQUEST__INIT;
    admin.op_case = PAGODA__ADMIN_REQUEST__OP_RELOAD;
    admin.reload = &reload;
    Pagoda__ClientResponse *resp = NULL;
    int rc = admin_call(c, &admin, &resp);
    if (rc != 0)
        return rc;
    if (pins != NULL)
        rc = list_from_proto(resp->admin, pins);
    pagoda__client_response__free_unpacked(resp, NULL);
    return rc;
}
