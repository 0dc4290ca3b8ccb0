/* pagoda admin: the tenancy of a router, with an admin key.
 *
 *   pagoda [--url URL] --api-key KEY admin tenants [--json]
 *   pagoda [--url URL] --api-key KEY admin pin NAME --tokens 1,2,3 --tenants a,b [--json]
 *   pagoda [--url URL] --api-key KEY admin unpin NAME [--json]
 *   pagoda [--url URL] --api-key KEY admin flush (--tenant T | --group G) [--json]
 *   pagoda [--url URL] --api-key KEY admin reload [--json]
 *
 * Text output is one line per tenant or pin, `kind NAME key=value ...`; --json prints one JSON
 * object (jansson). Exit status as the rest of the CLI: 0 done, 1 the router refused or failed,
 * 2 bad flags. */
#include "client/pagoda_admin_cli.h"

#include "client/pagoda.h"
#include "client/pagoda_admin.h"
#include "common/error.h"
#include "common/parse.h"

#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* The admin API's own bounds (router/tenants.h): the router refuses more anyway. */
#define MAX_PIN_TOKENS 65536
#define MAX_PIN_TENANTS 1024
/* An admin call's connection timeout; the router's own wait comes on top (pagoda_admin.h). */
#define ADMIN_TIMEOUT_MS 5000u

void admin_cli_usage(FILE *f)
{
    fputs("Admin commands (with one of the router's admin keys):\n"
          "       pagoda [--url URL] --api-key KEY admin tenants [--json]\n"
          "       pagoda [--url URL] --api-key KEY admin pin NAME --tokens 1,2,3 --tenants a,b\n"
          "       pagoda [--url URL] --api-key KEY admin unpin NAME\n"
          "       pagoda [--url URL] --api-key KEY admin flush --tenant T | --group G\n"
          "       pagoda [--url URL] --api-key KEY admin reload\n"
          "tenants: every tenant (configuration, prefix-cache figures) and every pin. pin: pins a\n"
          "public prefix for the tenants named, once the scheduler has computed it. unpin:\n"
          "removes one. flush: drops a tenant's (or a group's) cached prefixes. reload: reads\n"
          "the router's tenants file again (nothing changes when it is invalid). Each takes\n"
          "--json (one JSON object) and --timeout-ms MS.\n",
          f);
}

static int bad_flags(int rc)
{
    char msg[700];
    fprintf(stderr, "pagoda: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
    return 2;
}

static int server_error(int rc)
{
    char msg[700];
    fprintf(stderr, "pagoda: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
    return 1;
}

/* Splits "a,b,c" into names (pointing into the copy *buf); at most cap of them, none empty. */
static int split_names(const char *flag, const char *text, char **buf, char ***names, size_t *n,
                       size_t cap)
{
    free(*buf);
    free(*names);
    *names = NULL;
    *n = 0;
    if ((*buf = strdup(text)) == NULL)
        return PAGODA_ENOMEM;
    size_t count = 1;
    for (const char *p = text; *p; p++)
        count += *p == ',';
    if (count > cap)
        return pagoda_error_set(PAGODA_ERANGE, "%s: %zu names, more than the limit of %zu", flag,
                                count, cap);
    if ((*names = calloc(count, sizeof(char *))) == NULL)
        return PAGODA_ENOMEM;
    char *p = *buf;
    for (size_t i = 0; i < count; i++) {
        char *comma = strchr(p, ',');
        if (comma != NULL)
            *comma = '\0';
        if (*p == '\0')
            return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' has an empty name", flag, text);
        (*names)[i] = p;
        p = comma ? comma + 1 : p + strlen(p);
    }
    *n = count;
    return 0;
}

static json_t *json_strings(char *const *v, size_t n)
{
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(a, json_string(v[i]));
    return a;
}

static json_t *pin_json(const pagoda_pin_info *p)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(p->name));
    json_object_set_new(o, "num_tokens", json_integer(p->num_tokens));
    json_object_set_new(o, "tenants", json_strings(p->tenants, p->num_tenants));
    json_object_set_new(o, "ready", json_boolean(p->ready));
    json_object_set_new(o, "blocks", json_integer(p->blocks));
    json_object_set_new(o, "error", p->error ? json_string(p->error) : json_null());
    json_object_set_new(o, "from_file", json_boolean(p->from_file));
    return o;
}

static json_t *tenant_json(const pagoda_tenant_info *t)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(t->name));
    json_object_set_new(o, "group", t->group ? json_string(t->group) : json_null());
    json_object_set_new(o, "namespace", json_string(t->namespace_name));
    json_object_set_new(o, "max_running", json_integer(t->max_running));
    json_object_set_new(o, "max_waiting", json_integer(t->max_waiting));
    json_object_set_new(o, "cache_quota_blocks", json_integer(t->cache_quota_blocks));
    json_object_set_new(o, "lookups", json_integer((json_int_t)t->lookups));
    json_object_set_new(o, "hits", json_integer((json_int_t)t->hits));
    json_object_set_new(o, "hit_rate", json_real(t->hit_rate));
    json_object_set_new(o, "query_tokens", json_integer((json_int_t)t->query_tokens));
    json_object_set_new(o, "hit_tokens", json_integer((json_int_t)t->hit_tokens));
    json_object_set_new(o, "cached_blocks", json_integer(t->cached_blocks));
    json_object_set_new(o, "evictions", json_integer((json_int_t)t->evictions));
    json_object_set_new(o, "running", json_integer(t->running));
    json_object_set_new(o, "waiting", json_integer(t->waiting));
    json_object_set_new(o, "pins", json_strings(t->pins, t->num_pins));
    return o;
}

/* Prints and releases a JSON value on one line. */
static void print_json(json_t *v)
{
    char *s = json_dumps(v, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    if (s != NULL)
        puts(s);
    free(s);
    json_decref(v);
}

static void print_names(char *const *v, size_t n)
{
    if (n == 0)
        fputs("-", stdout);
    for (size_t i = 0; i < n; i++)
        printf("%s%s", i ? "," : "", v[i]);
}

static void print_pin(const pagoda_pin_info *p)
{
    printf("pin %s tokens=%u tenants=", p->name, p->num_tokens);
    print_names(p->tenants, p->num_tenants);
    printf(" ready=%s blocks=%u from_file=%s", p->ready ? "true" : "false", p->blocks,
           p->from_file ? "true" : "false");
    if (p->error != NULL)
        printf(" error=\"%s\"", p->error);
    putchar('\n');
}

static void print_tenant(const pagoda_tenant_info *t)
{
    printf("tenant %s group=%s namespace=%s max_running=%u max_waiting=%u cache_quota_blocks=%u "
           "lookups=%llu hits=%llu hit_rate=%.6g query_tokens=%llu hit_tokens=%llu "
           "cached_blocks=%u evictions=%llu running=%u waiting=%u pins=",
           t->name, t->group ? t->group : "-", t->namespace_name, t->max_running, t->max_waiting,
           t->cache_quota_blocks, (unsigned long long)t->lookups, (unsigned long long)t->hits,
           t->hit_rate, (unsigned long long)t->query_tokens, (unsigned long long)t->hit_tokens,
           t->cached_blocks, (unsigned long long)t->evictions, t->running, t->waiting);
    print_names(t->pins, t->num_pins);
    putchar('\n');
}

/* Prints a listing: tenants (if any) and pins. */
static void print_list(const pagoda_admin_list *l, int json)
{
    if (json) {
        json_t *o = json_object(), *tenants = json_array(), *pins = json_array();
        for (size_t i = 0; i < l->num_tenants; i++)
            json_array_append_new(tenants, tenant_json(&l->tenants[i]));
        for (size_t i = 0; i < l->num_pins; i++)
            json_array_append_new(pins, pin_json(&l->pins[i]));
        json_object_set_new(o, "tenants", tenants);
        json_object_set_new(o, "pins", pins);
        print_json(o);
        return;
    }
    for (size_t i = 0; i < l->num_tenants; i++)
        print_tenant(&l->tenants[i]);
    for (size_t i = 0; i < l->num_pins; i++)
        print_pin(&l->pins[i]);
}

struct admin_opts {
    int json;
    int32_t *tokens;
    size_t num_tokens;
    char *tenants_buf;
    char **tenants;
    size_t num_tenants;
    const char *tenant, *group;
    uint32_t timeout_ms;
    const char *name; /* pin, unpin: the positional NAME */
};

enum { OPT_JSON = 2000, OPT_TOKENS, OPT_TENANTS, OPT_TENANT, OPT_GROUP, OPT_TIMEOUT };

static const struct option admin_longopts[] = {
    {"json", no_argument, NULL, OPT_JSON},
    {"tokens", required_argument, NULL, OPT_TOKENS},
    {"tenants", required_argument, NULL, OPT_TENANTS},
    {"tenant", required_argument, NULL, OPT_TENANT},
    {"group", required_argument, NULL, OPT_GROUP},
    {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

static int parse_admin_flag(struct admin_opts *o, int opt, const char *arg)
{
    int64_t v;
    int rc;
    switch (opt) {
    case OPT_JSON:
        o->json = 1;
        return 0;
    case OPT_TOKENS:
        free(o->tokens);
        o->tokens = NULL;
        return parse_i32_list("--tokens", arg, 0, INT32_MAX, MAX_PIN_TOKENS, &o->tokens,
                              &o->num_tokens);
    case OPT_TENANTS:
        return split_names("--tenants", arg, &o->tenants_buf, &o->tenants, &o->num_tenants,
                           MAX_PIN_TENANTS);
    case OPT_TENANT:
        o->tenant = arg;
        return 0;
    case OPT_GROUP:
        o->group = arg;
        return 0;
    case OPT_TIMEOUT:
        if ((rc = parse_i64("--timeout-ms", arg, 1, PAGODA_MAX_TIMEOUT_MS, &v)) == 0)
            o->timeout_ms = (uint32_t)v;
        return rc;
    default:
        return pagoda_error_set(PAGODA_EINVAL, "unknown option (see --help)");
    }
}

/* Which flags each operation takes (besides --json and --timeout-ms), and its positional NAME. */
static int check_flags(const char *op, const struct admin_opts *o, int num_positional)
{
    int pin = strcmp(op, "pin") == 0, flush = strcmp(op, "flush") == 0;
    int named = pin || strcmp(op, "unpin") == 0;
    if (num_positional != named) {
        fprintf(stderr, "pagoda: admin %s %s\n", op,
                named ? "takes one NAME" : "takes no positional argument");
        return 2;
    }
    if (!pin && (o->tokens != NULL || o->tenants != NULL)) {
        fprintf(stderr, "pagoda: --tokens and --tenants belong to admin pin\n");
        return 2;
    }
    if (!flush && (o->tenant != NULL || o->group != NULL)) {
        fprintf(stderr, "pagoda: --tenant and --group belong to admin flush\n");
        return 2;
    }
    if (pin && (o->tokens == NULL || o->tenants == NULL)) {
        fprintf(stderr, "pagoda: admin pin needs --tokens and --tenants\n");
        return 2;
    }
    if (flush && (o->tenant == NULL) == (o->group == NULL)) {
        fprintf(stderr, "pagoda: admin flush needs --tenant T or --group G (one of them)\n");
        return 2;
    }
    return 0;
}

static int run_op(pagoda_client *c, const char *op, const struct admin_opts *o)
{
    int rc;
    if (strcmp(op, "tenants") == 0 || strcmp(op, "reload") == 0) {
        pagoda_admin_list l;
        rc = op[0] == 't' ? pagoda_admin_tenants(c, &l) : pagoda_admin_reload(c, &l);
        if (rc != 0)
            return server_error(rc);
        if (op[0] == 'r' && !o->json)
            printf("reloaded: %zu pins\n", l.num_pins);
        print_list(&l, o->json);
        pagoda_admin_list_free(&l);
        return 0;
    }
    if (strcmp(op, "pin") == 0) {
        pagoda_pin_info p;
        rc = pagoda_admin_pin(c, o->name, o->tokens, o->num_tokens, (const char *const *)o->tenants,
                              o->num_tenants, &p);
        if (rc != 0)
            return server_error(rc);
        if (o->json)
            print_json(pin_json(&p));
        else
            print_pin(&p);
        pagoda_pin_info_free(&p);
        return 0;
    }
    if (strcmp(op, "unpin") == 0) {
        if ((rc = pagoda_admin_unpin(c, o->name)) != 0)
            return server_error(rc);
        if (o->json) {
            json_t *j = json_object();
            json_object_set_new(j, "unpinned", json_string(o->name));
            print_json(j);
        } else {
            printf("unpinned %s\n", o->name);
        }
        return 0;
    }
    uint32_t flushed = 0;
    rc = o->tenant ? pagoda_admin_flush_tenant(c, o->tenant, &flushed)
                   : pagoda_admin_flush_group(c, o->group, &flushed);
    if (rc != 0)
        return server_error(rc);
    if (o->json) {
        json_t *j = json_object();
        json_object_set_new(j, "flushed_blocks", json_integer(flushed));
        print_json(j);
    } else {
        printf("flushed %u blocks\n", flushed);
    }
    return 0;
}

int admin_cli_main(const char *url, const char *api_key, int argc, char **argv)
{
    static const char *const ops[] = {"tenants", "pin", "unpin", "flush", "reload"};
    if (argc < 2 || strcmp(argv[1], "--help") == 0) {
        admin_cli_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const char *op = argv[1];
    int known = 0;
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
        known |= strcmp(op, ops[i]) == 0;
    if (!known) {
        fprintf(stderr,
                "pagoda: unknown admin command '%s' (tenants, pin, unpin, flush, "
                "reload)\n",
                op);
        return 2;
    }
    struct admin_opts o = {0};
    int status = 2, opt, rc;
    pagoda_client *c = NULL;
    int sub_argc = argc - 1;
    char **sub_argv = argv + 1;
    optind = 1;
    while ((opt = getopt_long(sub_argc, sub_argv, "", admin_longopts, NULL)) != -1) {
        if (opt == 'h') {
            admin_cli_usage(stdout);
            status = 0;
            goto out;
        }
        if (opt == '?') {
            admin_cli_usage(stderr);
            goto out;
        }
        if ((rc = parse_admin_flag(&o, opt, optarg)) != 0) {
            status = bad_flags(rc);
            goto out;
        }
    }
    /* GNU getopt has moved the positional arguments to the end. */
    int num_positional = sub_argc - optind;
    if ((status = check_flags(op, &o, num_positional)) != 0)
        goto out;
    status = 2;
    if (num_positional == 1)
        o.name = sub_argv[optind];
    if ((rc = pagoda_client_open(url, &c)) != 0) {
        status = bad_flags(rc); /* a malformed address */
        goto out;
    }
    if (api_key != NULL && (rc = pagoda_client_set_api_key(c, api_key)) != 0) {
        status = bad_flags(rc);
        goto out;
    }
    pagoda_client_set_timeout_ms(c, o.timeout_ms ? o.timeout_ms : ADMIN_TIMEOUT_MS);
    status = run_op(c, op, &o);
out:
    pagoda_client_close(c);
    free(o.tokens);
    free(o.tenants_buf);
    free(o.tenants);
    return status;
}
