/* Tests of router/router_admin.c and router/router_tenancy.c: the Policy the router pushes, and
 * the admin API (through libpagoda's pagoda_admin.h and the pagoda CLI), against pagoda-router and
 * the stand-in scheduler (router_fake_scheduler.h), which answers Policy and AdminCall. Each test
 * starts its own router with its own tenants file. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "client/pagoda.h"
#include "client/pagoda_admin.h"
#include "common/error.h"
#include "proto/internal.pb-c.h"
#include "proto/pagoda.pb-c.h"
#include "router/router.h"
#include "router/tenants.h"
#include "tests/unit/router_fake_scheduler.h"
#include "tests/unit/router_test_client.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef PAGODA_BIN_DIR
#error "PAGODA_BIN_DIR must name the directory of pagoda"
#endif

static const char tenants_json[] =
    "{\"admin_keys\": [\"adm-key\"],"
    " \"groups\": [{\"name\": \"team\", \"cache_quota_blocks\": 1000}],"
    " \"tenants\": ["
    "  {\"name\": \"alice\", \"api_keys\": [\"alice-key\"], \"group\": \"team\","
    "   \"max_running\": 4, \"max_waiting\": 8},"
    "  {\"name\": \"bob\", \"api_keys\": [\"bob-key\"], \"group\": \"team\"},"
    "  {\"name\": \"carol\", \"api_keys\": [\"carol-key\"], \"max_running\": 2,"
    "   \"max_waiting\": 1, \"cache_quota_blocks\": 500},"
    "  {\"name\": \"zoe\", \"api_keys\": [\"zoe-key\"]}],"
    " \"pins\": [{\"name\": \"sys\", \"token_ids\": [1, 2, 3, 4, 5, 6, 7, 8],"
    "  \"tenants\": [\"alice\", \"carol\"]}]}";

/* A router with a fake scheduler and a tenants file of its own. */
struct admin_env {
    struct rtr_env e;
    char path[64];
};

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

/* Starts a router on json (NULL: no tenants file) with extra flags (NULL-terminated, or NULL). */
static void env_start(struct admin_env *a, const char *json, const char *const *extra)
{
    const char *args[16];
    int n = 0;
    memset(a, 0, sizeof(*a));
    if (json != NULL) {
        snprintf(a->path, sizeof(a->path), "/tmp/pagoda-admin-XXXXXX");
        int fd = mkstemp(a->path);
        assert_true(fd >= 0);
        close(fd);
        write_file(a->path, json);
        args[n++] = "--tenants";
        args[n++] = a->path;
    }
    for (int i = 0; extra != NULL && extra[i] != NULL; i++)
        args[n++] = extra[i];
    args[n] = NULL;
    assert_int_equal(rtr_env_start(&a->e, args), 0);
}

static void env_stop(struct admin_env *a)
{
    assert_int_equal(rtr_env_stop(&a->e), 0);
    if (a->path[0])
        unlink(a->path);
}

static pagoda_client *client_with_key(const struct admin_env *a, const char *key)
{
    pagoda_client *c = NULL;
    assert_int_equal(pagoda_client_open(a->e.url, &c), 0);
    pagoda_client_set_timeout_ms(c, 5000);
    assert_int_equal(pagoda_client_set_api_key(c, key), 0);
    return c;
}

static pagoda_generate_params greedy(int32_t max_tokens)
{
    pagoda_generate_params p = pagoda_generate_params_default();
    p.temperature = 0.0f;
    p.max_tokens = max_tokens;
    return p;
}

static void counts(const struct admin_env *a, struct fake_sched_counts *out)
{
    fake_sched_get_counts(a->e.fs, out);
}

/* Waits until the fake has received n policies in all. */
static void wait_policies(const struct admin_env *a, uint32_t n)
{
    struct fake_sched_counts c;
    for (uint64_t t0 = rtr_now_ms(); rtr_now_ms() - t0 < 3000; usleep(2000)) {
        counts(a, &c);
        if (c.policies >= n)
            return;
    }
    fail_msg("the router sent %u policies, not %u", c.policies, n);
}

static const Pagoda__Internal__TenantPolicy *policy_tenant(const Pagoda__Internal__Policy *p,
                                                           const char *name)
{
    for (size_t i = 0; i < p->n_tenants; i++)
        if (strcmp(p->tenants[i]->name, name) == 0)
            return p->tenants[i];
    return NULL;
}

static const Pagoda__Internal__NamespacePolicy *policy_namespace(const Pagoda__Internal__Policy *p,
                                                                 const char *name)
{
    for (size_t i = 0; i < p->n_namespaces; i++)
        if (strcmp(p->namespaces[i]->name, name) == 0)
            return p->namespaces[i];
    return NULL;
}

static const Pagoda__Internal__PinPolicy *policy_pin(const Pagoda__Internal__Policy *p,
                                                     const char *name)
{
    for (size_t i = 0; i < p->n_pins; i++)
        if (strcmp(p->pins[i]->name, name) == 0)
            return p->pins[i];
    return NULL;
}

static const pagoda_pin_info *list_pin(const pagoda_admin_list *l, const char *name)
{
    for (size_t i = 0; i < l->num_pins; i++)
        if (strcmp(l->pins[i].name, name) == 0)
            return &l->pins[i];
    return NULL;
}

/* ---- the Policy ------------------------------------------------------------------------------ */

/* The link comes up: the Policy goes first (before the RouterHello and any Submit), with the
 * whole tenancy; a new scheduler gets it again before the resubmissions. */
static void test_policy_sent_on_link_up_before_anything(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    struct fake_sched_counts c;
    /* The RouterHello follows the Policy on the link: wait for it to arrive too. */
    for (uint64_t t0 = rtr_now_ms(); rtr_now_ms() - t0 < 3000; usleep(2000)) {
        counts(&a, &c);
        if (strlen(c.trace) >= 2)
            break;
    }
    assert_int_equal(c.trace[0], 'P');
    assert_int_equal(c.trace[1], 'H');
    assert_int_equal(c.last_policy_version, 1);
    assert_int_equal(c.policies_applied, 1);

    Pagoda__Internal__Policy *p = fake_sched_last_policy(a.e.fs);
    assert_non_null(p);
    assert_int_equal(p->version, 1);
    assert_int_equal(p->n_tenants, 4);
    assert_int_equal(p->n_namespaces, 3); /* g:team, t:carol, t:zoe */
    assert_int_equal(policy_namespace(p, "g:team")->quota_blocks, 1000);
    assert_int_equal(policy_namespace(p, "t:carol")->quota_blocks, 500);
    assert_int_equal(policy_namespace(p, "t:zoe")->quota_blocks, 0);
    assert_null(policy_namespace(p, "t:alice"));
    const Pagoda__Internal__TenantPolicy *alice = policy_tenant(p, "alice");
    assert_string_equal(alice->namespace_, "g:team");
    assert_int_equal(alice->max_running, 4);
    assert_int_equal(alice->n_pins, 1);
    assert_string_equal(alice->pins[0], "sys");
    const Pagoda__Internal__TenantPolicy *bob = policy_tenant(p, "bob");
    assert_string_equal(bob->namespace_, "g:team");
    assert_int_equal(bob->max_running, 256);
    assert_int_equal(bob->n_pins, 0);
    assert_string_equal(policy_tenant(p, "carol")->namespace_, "t:carol");
    assert_int_equal(policy_tenant(p, "carol")->max_running, 2);
    assert_int_equal(p->n_pins, 1);
    assert_int_equal(policy_pin(p, "sys")->n_token_ids, 8);
    assert_int_equal(policy_pin(p, "sys")->token_ids[7], 8);
    pagoda__internal__policy__free_unpacked(p, NULL);

    /* A request held by the first scheduler; a new scheduler gets the Policy, then the request. */
    pagoda_client *alice_c = client_with_key(&a, "alice-key");
    const int32_t prompt[] = {4, 5};
    pagoda_generate_params gp = greedy(6);
    uint8_t id[16];
    fake_sched_hold(a.e.fs, 1);
    assert_int_equal(pagoda_submit(alice_c, &gp, prompt, 2, id), 0);
    fake_sched_stop(a.e.fs);
    a.e.fs = NULL;
    assert_int_equal(fake_sched_start(a.e.sched_url, &a.e.fs), 0);
    for (uint64_t t0 = rtr_now_ms(); rtr_now_ms() - t0 < 3000; usleep(2000)) {
        counts(&a, &c);
        if (c.submits >= 1)
            break;
    }
    assert_int_equal(c.trace[0], 'P');
    assert_non_null(strchr(c.trace, 'S'));
    assert_int_equal(c.last_policy_version, 1); /* unchanged tenancy, same version */
    uint32_t count = 0;
    pagoda_result r;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(pagoda_poll(alice_c, id, count, 2000, &r), 0);
        count += (uint32_t)r.num_tokens;
        pagoda_finish_reason f = r.finish_reason;
        pagoda_result_free(&r);
        if (f != PAGODA_FINISH_NONE)
            break;
    }
    assert_int_equal(count, 6);
    pagoda_client_close(alice_c);
    env_stop(&a);
}

/* Without a tenants file: the one default tenant in its own namespace, no cap, no pins. */
static void test_policy_without_tenants_file(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, NULL, NULL);
    wait_policies(&a, 1);
    Pagoda__Internal__Policy *p = fake_sched_last_policy(a.e.fs);
    assert_int_equal(p->n_tenants, 1);
    assert_string_equal(p->tenants[0]->name, "default");
    assert_string_equal(p->tenants[0]->namespace_, "t:default");
    assert_int_equal(p->tenants[0]->max_running, 0);
    assert_int_equal(p->n_namespaces, 1);
    assert_int_equal(p->n_pins, 0);
    pagoda__internal__policy__free_unpacked(p, NULL);
    /* And no admin API. */
    pagoda_client *c = client_with_key(&a, "anything");
    pagoda_admin_list l;
    assert_int_equal(pagoda_admin_tenants(c, &l), PAGODA_EPERM);
    assert_non_null(strstr(pagoda_error_detail(), "no admin keys configured"));
    pagoda_client_close(c);
    env_stop(&a);
}

/* Every change pushes a Policy with a higher version, and each call returns once it is applied. */
static void test_policy_versions_increase_with_pin_unpin_reload(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    struct fake_sched_counts c;
    const int32_t tokens[] = {9, 8, 7, 6, 5};
    const char *const readers[] = {"bob", "zoe"};
    pagoda_pin_info pin;
    assert_int_equal(pagoda_admin_pin(adm, "p2", tokens, 5, readers, 2, &pin), 0);
    assert_string_equal(pin.name, "p2");
    assert_true(pin.ready);
    assert_int_equal(pin.blocks, 5 / FAKE_SCHED_BLOCK_SIZE);
    assert_int_equal(pin.num_tokens, 5);
    assert_int_equal(pin.num_tenants, 2);
    assert_false(pin.from_file);
    assert_null(pin.error);
    pagoda_pin_info_free(&pin);
    counts(&a, &c);
    assert_int_equal(c.policies, 2);
    assert_int_equal(c.last_policy_version, 2);
    assert_int_equal(c.trace[strlen(c.trace) - 1], 'P');
    Pagoda__Internal__Policy *p = fake_sched_last_policy(a.e.fs);
    assert_int_equal(policy_pin(p, "p2")->n_token_ids, 5);
    assert_int_equal(policy_tenant(p, "bob")->n_pins, 1);
    assert_string_equal(policy_tenant(p, "bob")->pins[0], "p2");
    assert_int_equal(policy_tenant(p, "alice")->n_pins, 1);
    pagoda__internal__policy__free_unpacked(p, NULL);

    /* The same pin again (a resent call) changes nothing. */
    assert_int_equal(pagoda_admin_pin(adm, "p2", tokens, 5, readers, 2, NULL), 0);
    counts(&a, &c);
    assert_int_equal(c.last_policy_version, 2);

    assert_int_equal(pagoda_admin_unpin(adm, "p2"), 0);
    counts(&a, &c);
    assert_int_equal(c.last_policy_version, 3);
    p = fake_sched_last_policy(a.e.fs);
    assert_null(policy_pin(p, "p2"));
    assert_int_equal(policy_tenant(p, "bob")->n_pins, 0);
    pagoda__internal__policy__free_unpacked(p, NULL);

    /* A file pin can be unpinned too, until the next reload. */
    assert_int_equal(pagoda_admin_unpin(adm, "sys"), 0);
    counts(&a, &c);
    assert_int_equal(c.last_policy_version, 4);
    pagoda_admin_list l;
    assert_int_equal(pagoda_admin_reload(adm, &l), 0);
    counts(&a, &c);
    assert_int_equal(c.last_policy_version, 5);
    assert_int_equal(l.num_tenants, 0);
    assert_int_equal(l.num_pins, 1);
    assert_string_equal(l.pins[0].name, "sys");
    assert_true(l.pins[0].from_file);
    assert_true(l.pins[0].ready);
    pagoda_admin_list_free(&l);
    assert_int_equal(c.policies, 5);
    assert_int_equal(c.policies_applied, 5);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* ---- who may call --------------------------------------------------------------------------- */

static void test_admin_refused_without_admin_key(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    const char *keys[] = {NULL, "", "nobody", "alice-key", "zoe-key"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        pagoda_client *c = client_with_key(&a, keys[i]);
        pagoda_admin_list l;
        assert_int_equal(pagoda_admin_tenants(c, &l), PAGODA_EPERM);
        assert_non_null(strstr(pagoda_error_detail(), "not an admin key"));
        const int32_t t[] = {1};
        const char *const who[] = {"alice"};
        assert_int_equal(pagoda_admin_pin(c, "x", t, 1, who, 1, NULL), PAGODA_EPERM);
        assert_int_equal(pagoda_admin_unpin(c, "sys"), PAGODA_EPERM);
        assert_int_equal(pagoda_admin_flush_tenant(c, "alice", NULL), PAGODA_EPERM);
        assert_int_equal(pagoda_admin_flush_group(c, "team", NULL), PAGODA_EPERM);
        assert_int_equal(pagoda_admin_reload(c, NULL), PAGODA_EPERM);
        pagoda_client_close(c);
    }
    struct fake_sched_counts c;
    counts(&a, &c);
    assert_int_equal(c.admin_calls, 0);
    assert_int_equal(c.policies, 1); /* nothing changed */

    /* An admin key cannot submit, poll or cancel; it may ask for stats. */
    pagoda_client *adm = client_with_key(&a, "adm-key");
    const int32_t prompt[] = {1, 2};
    pagoda_generate_params gp = greedy(3);
    uint8_t id[16] = {1};
    assert_int_equal(pagoda_submit(adm, &gp, prompt, 2, id), PAGODA_EPERM);
    assert_non_null(strstr(pagoda_error_detail(), "admin key"));
    pagoda_result r;
    assert_int_equal(pagoda_poll(adm, id, 0, 0, &r), PAGODA_EPERM);
    assert_int_equal(pagoda_cancel(adm, id, NULL), PAGODA_EPERM);
    pagoda_engine_stats st;
    assert_int_equal(pagoda_stats(adm, &st), 0);
    counts(&a, &c);
    assert_int_equal(c.submits, 0);
    pagoda_client_close(adm);
    env_stop(&a);

    /* A tenants file without admin keys: no admin API at all. */
    static const char no_admin[] = "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"]}]}";
    env_start(&a, no_admin, NULL);
    pagoda_client *k = client_with_key(&a, "k");
    pagoda_admin_list l;
    assert_int_equal(pagoda_admin_tenants(k, &l), PAGODA_EPERM);
    assert_non_null(strstr(pagoda_error_detail(), "no admin keys configured"));
    pagoda_client_close(k);
    env_stop(&a);
}

/* ---- pins ----------------------------------------------------------------------------------- */

struct pin_call {
    pagoda_client *c;
    int rc;
    int done;
    pagoda_pin_info info;
};

static void *pin_thread(void *arg)
{
    struct pin_call *pc = arg;
    const int32_t tokens[] = {11, 12, 13, 14, 15, 16, 17, 18, 19};
    const char *const who[] = {"zoe"};
    pc->rc = pagoda_admin_pin(pc->c, "late", tokens, 9, who, 1, &pc->info);
    __atomic_store_n(&pc->done, 1, __ATOMIC_SEQ_CST);
    return NULL;
}

static void test_pin_waits_for_policy_applied(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    fake_sched_hold_policy(a.e.fs, 1);
    struct pin_call pc = {.c = adm};
    pthread_t t;
    pthread_create(&t, NULL, pin_thread, &pc);
    wait_policies(&a, 2); /* the Policy went out at once */
    usleep(300000);
    assert_int_equal(__atomic_load_n(&pc.done, __ATOMIC_SEQ_CST), 0);
    uint64_t t0 = rtr_now_ms();
    fake_sched_hold_policy(a.e.fs, 0);
    pthread_join(t, NULL);
    assert_true(rtr_now_ms() - t0 < 2000);
    assert_int_equal(pc.rc, 0);
    assert_true(pc.info.ready);
    assert_int_equal(pc.info.blocks, 9 / FAKE_SCHED_BLOCK_SIZE);
    pagoda_pin_info_free(&pc.info);

    /* The scheduler refuses a pin (a token outside its vocabulary): the call fails with its error,
     * and the pin is listed with it. */
    const int32_t bad[] = {FAKE_SCHED_ERROR_TOKEN, 1};
    const char *const who[] = {"alice"};
    pagoda_pin_info info;
    assert_int_equal(pagoda_admin_pin(adm, "bad", bad, 2, who, 1, &info), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), "vocabulary"));
    assert_non_null(strstr(pagoda_error_detail(), "bad"));
    pagoda_admin_list l;
    assert_int_equal(pagoda_admin_tenants(adm, &l), 0);
    const pagoda_pin_info *p = list_pin(&l, "bad");
    assert_non_null(p);
    assert_false(p->ready);
    assert_non_null(p->error);
    assert_non_null(strstr(p->error, "vocabulary"));
    assert_true(list_pin(&l, "late")->ready);
    pagoda_admin_list_free(&l);

    /* Bad pins are refused by the router before anything changes. */
    struct fake_sched_counts before, after;
    counts(&a, &before);
    const int32_t ok[] = {1, 2};
    const int32_t negative[] = {1, -2};
    const char *const nobody[] = {"nobody"};
    const char *const twice[] = {"alice", "alice"};
    assert_int_equal(pagoda_admin_pin(adm, "x", ok, 2, nobody, 1, NULL), PAGODA_ENOENT);
    assert_non_null(strstr(pagoda_error_detail(), "nobody"));
    assert_int_equal(pagoda_admin_pin(adm, "x", negative, 2, who, 1, NULL), PAGODA_ERANGE);
    assert_int_equal(pagoda_admin_pin(adm, "x", ok, 0, who, 1, NULL), PAGODA_ERANGE);
    assert_int_equal(pagoda_admin_pin(adm, "x", ok, 2, who, 0, NULL), PAGODA_ERANGE);
    assert_int_equal(pagoda_admin_pin(adm, "x", ok, 2, twice, 2, NULL), PAGODA_EEXIST);
    assert_int_equal(pagoda_admin_pin(adm, "x y", ok, 2, who, 1, NULL), PAGODA_EFORMAT);
    assert_int_equal(pagoda_admin_unpin(adm, "nope"), PAGODA_ENOENT);
    counts(&a, &after);
    assert_int_equal(after.policies, before.policies);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* Runtime pins survive a kill -9 of the router (router_pins_file.c): a pin made by the admin API
 * is listed again by the router that replaces it, with its tokens and readers; a pin of the
 * tenants file that the admin API replaced is the file's again; an unpinned one stays gone; a
 * call whose write fails says so (PAGODA_EIO); a runtime pins file that does not parse is logged
 * and left out (the router starts with the file's pins). */
static void test_runtime_pins_survive_a_restart(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    const int32_t tokens[] = {11, 12, 13, 14, 15, 16, 17, 18, 19};
    const char *const zoe[] = {"zoe"};
    const char *const two[] = {"alice", "bob"};
    assert_int_equal(pagoda_admin_pin(adm, "late", tokens, 9, zoe, 1, NULL), 0);
    assert_int_equal(pagoda_admin_pin(adm, "gone", tokens, 3, two, 2, NULL), 0);
    assert_int_equal(pagoda_admin_pin(adm, "sys", tokens, 5, two, 2, NULL), 0);
    assert_int_equal(pagoda_admin_unpin(adm, "gone"), 0);
    /* A write that fails: the call says the change is applied but not saved. */
    char tmp[128];
    snprintf(tmp, sizeof(tmp), "%s/router-pins.json.tmp", a.e.dir);
    assert_int_equal(mkdir(tmp, 0700), 0);
    assert_int_equal(pagoda_admin_pin(adm, "unsaved", tokens, 4, zoe, 1, NULL), PAGODA_EIO);
    assert_non_null(strstr(pagoda_error_detail(), "could not be saved"));
    assert_int_equal(rmdir(tmp), 0);
    assert_int_equal(pagoda_admin_unpin(adm, "unsaved"), 0);
    pagoda_client_close(adm);

    assert_int_equal(rtr_env_restart_router(&a.e), 0);
    adm = client_with_key(&a, "adm-key");
    pagoda_admin_list l;
    assert_int_equal(pagoda_admin_tenants(adm, &l), 0);
    assert_int_equal(l.num_pins, 2);
    const pagoda_pin_info *p = list_pin(&l, "late");
    assert_non_null(p);
    assert_int_equal(p->num_tokens, 9);
    assert_false(p->from_file);
    assert_int_equal(p->num_tenants, 1);
    assert_string_equal(p->tenants[0], "zoe");
    p = list_pin(&l, "sys");
    assert_non_null(p);
    assert_int_equal(p->num_tokens, 8); /* the file's */
    assert_true(p->from_file);
    assert_null(list_pin(&l, "gone"));
    pagoda_admin_list_free(&l);
    pagoda_client_close(adm);

    char path[128];
    snprintf(path, sizeof(path), "%s/router-pins.json", a.e.dir);
    write_file(path, "{\"pins\": [");
    assert_int_equal(rtr_env_restart_router(&a.e), 0);
    adm = client_with_key(&a, "adm-key");
    assert_int_equal(pagoda_admin_tenants(adm, &l), 0);
    assert_int_equal(l.num_pins, 1);
    assert_non_null(list_pin(&l, "sys"));
    pagoda_admin_list_free(&l);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* A scheduler that does not apply the Policy in time: the call says so, and the pin stays
 * configured (it is listed, and goes out with every later Policy). */
static void test_pin_timeout_keeps_it_configured(void **state)
{
    (void)state;
    static const char *const args[] = {"--admin-timeout-ms", "300", NULL};
    struct admin_env a;
    env_start(&a, tenants_json, args);
    wait_policies(&a, 1);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    fake_sched_hold_policy(a.e.fs, 1);
    const int32_t tokens[] = {3, 3, 3, 3};
    const char *const who[] = {"bob"};
    uint64_t t0 = rtr_now_ms();
    assert_int_equal(pagoda_admin_pin(adm, "slow", tokens, 4, who, 1, NULL), PAGODA_ETIMEDOUT);
    assert_true(rtr_now_ms() - t0 >= 250);
    assert_non_null(strstr(pagoda_error_detail(), "stays configured"));
    fake_sched_hold_policy(a.e.fs, 0);
    struct fake_sched_counts c;
    for (uint64_t t1 = rtr_now_ms(); rtr_now_ms() - t1 < 2000; usleep(2000)) {
        counts(&a, &c);
        if (c.policies_applied == 2)
            break;
    }
    assert_int_equal(c.policies_applied, 2);
    pagoda_admin_list l;
    assert_int_equal(pagoda_admin_tenants(adm, &l), 0);
    const pagoda_pin_info *p = list_pin(&l, "slow");
    assert_non_null(p);
    assert_int_equal(p->num_tenants, 1);
    assert_string_equal(p->tenants[0], "bob");
    assert_true(p->ready); /* the fake answered the Policy once released */
    pagoda_admin_list_free(&l);

    /* The figures' call times out the same way. */
    fake_sched_hold_admin(a.e.fs, 1);
    assert_int_equal(pagoda_admin_tenants(adm, &l), PAGODA_ETIMEDOUT);
    assert_int_equal(pagoda_admin_flush_tenant(adm, "bob", NULL), PAGODA_ETIMEDOUT);
    fake_sched_hold_admin(a.e.fs, 0);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* ---- the listing ---------------------------------------------------------------------------- */

static void test_tenants_listing_joins_figures(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    /* Two requests of alice's, held: the scheduler counts them running. */
    pagoda_client *alice = client_with_key(&a, "alice-key");
    const int32_t prompt[] = {7, 7};
    pagoda_generate_params gp = greedy(4);
    uint8_t id[16];
    fake_sched_hold(a.e.fs, 1);
    assert_int_equal(pagoda_submit(alice, &gp, prompt, 2, id), 0);
    assert_int_equal(pagoda_submit(alice, &gp, prompt, 2, id), 0);
    struct fake_sched_counts c;
    for (uint64_t t0 = rtr_now_ms(); rtr_now_ms() - t0 < 2000; usleep(2000)) {
        counts(&a, &c);
        if (c.submits == 2)
            break;
    }
    pagoda_client *adm = client_with_key(&a, "adm-key");
    pagoda_admin_list l;
    assert_int_equal(pagoda_admin_tenants(adm, &l), 0);
    assert_int_equal(l.num_tenants, 4); /* the scheduler's stranger is not listed */
    const char *names[] = {"alice", "bob", "carol", "zoe"};
    for (size_t i = 0; i < 4; i++) {
        const pagoda_tenant_info *t = &l.tenants[i];
        assert_string_equal(t->name, names[i]); /* the file's order */
        struct fake_figures f;
        fake_sched_tenant_figures(t->name, &f);
        assert_int_equal(t->lookups, f.lookups);
        assert_int_equal(t->hits, f.hits);
        assert_int_equal(t->query_tokens, f.query_tokens);
        assert_int_equal(t->hit_tokens, f.hit_tokens);
        assert_int_equal(t->waiting, f.waiting);
        double rate = f.query_tokens ? (double)f.hit_tokens / (double)f.query_tokens : 0.0;
        assert_true(t->hit_rate == rate);
        uint32_t cached;
        uint64_t evictions;
        fake_sched_namespace_figures(t->namespace_name, &cached, &evictions);
        assert_int_equal(t->cached_blocks, cached);
        assert_int_equal(t->evictions, evictions);
    }
    const pagoda_tenant_info *ta = &l.tenants[0], *tb = &l.tenants[1], *tc = &l.tenants[2];
    const pagoda_tenant_info *tz = &l.tenants[3];
    assert_string_equal(ta->group, "team");
    assert_string_equal(ta->namespace_name, "g:team");
    assert_int_equal(ta->max_running, 4);
    assert_int_equal(ta->max_waiting, 8);
    assert_int_equal(ta->cache_quota_blocks, 1000);
    assert_true(ta->hit_rate == 0.5);
    assert_int_equal(ta->running, 2);
    assert_int_equal(ta->num_pins, 1);
    assert_string_equal(ta->pins[0], "sys");
    assert_int_equal(tb->running, 0);
    assert_int_equal(tb->num_pins, 0);
    assert_int_equal(tb->cache_quota_blocks, 1000);
    assert_null(tc->group);
    assert_string_equal(tc->namespace_name, "t:carol");
    assert_int_equal(tc->cache_quota_blocks, 500);
    assert_int_equal(tc->num_pins, 1);
    assert_true(tz->hit_rate == 0.0); /* no query tokens */
    assert_int_equal(tz->cache_quota_blocks, 0);
    assert_int_equal(l.num_pins, 1);
    assert_string_equal(l.pins[0].name, "sys");
    assert_int_equal(l.pins[0].num_tokens, 8);
    assert_int_equal(l.pins[0].num_tenants, 2);
    assert_string_equal(l.pins[0].tenants[1], "carol");
    assert_true(l.pins[0].ready);
    assert_int_equal(l.pins[0].blocks, 8 / FAKE_SCHED_BLOCK_SIZE);
    assert_true(l.pins[0].from_file);
    pagoda_admin_list_free(&l);
    fake_sched_hold(a.e.fs, 0);
    pagoda_client_close(alice);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* ---- flush ---------------------------------------------------------------------------------- */

static void test_flush_maps_tenant_to_namespace(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    struct fake_sched_counts c;
    uint32_t flushed = 0;
    /* A tenant in a group flushes its group's namespace; one alone its own. */
    assert_int_equal(pagoda_admin_flush_tenant(adm, "bob", &flushed), 0);
    counts(&a, &c);
    assert_string_equal(c.last_flush, "g:team");
    assert_int_equal(flushed, 7 + strlen("g:team"));
    assert_int_equal(pagoda_admin_flush_tenant(adm, "zoe", &flushed), 0);
    counts(&a, &c);
    assert_string_equal(c.last_flush, "t:zoe");
    assert_int_equal(flushed, 7 + strlen("t:zoe"));
    assert_int_equal(pagoda_admin_flush_group(adm, "team", &flushed), 0);
    counts(&a, &c);
    assert_string_equal(c.last_flush, "g:team");
    assert_int_equal(c.admin_calls, 3);
    /* Unknown names never reach the scheduler. */
    assert_int_equal(pagoda_admin_flush_tenant(adm, "nobody", &flushed), PAGODA_ENOENT);
    assert_non_null(strstr(pagoda_error_detail(), "no tenant"));
    assert_int_equal(pagoda_admin_flush_group(adm, "alice", &flushed), PAGODA_ENOENT);
    assert_non_null(strstr(pagoda_error_detail(), "no group"));
    counts(&a, &c);
    assert_int_equal(c.admin_calls, 3);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* ---- reload --------------------------------------------------------------------------------- */

static void test_reload_failure_keeps_old_config(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    pagoda_client *bob = client_with_key(&a, "bob-key");
    /* A runtime pin for bob and zoe, and a request of bob's held by the scheduler. */
    const int32_t tokens[] = {5, 5, 5, 5};
    const char *const who[] = {"bob", "zoe"};
    assert_int_equal(pagoda_admin_pin(adm, "rt", tokens, 4, who, 2, NULL), 0);
    const int32_t prompt[] = {9};
    pagoda_generate_params gp = greedy(5);
    uint8_t bob_id[16];
    fake_sched_hold(a.e.fs, 1);
    assert_int_equal(pagoda_submit(bob, &gp, prompt, 1, bob_id), 0);
    struct fake_sched_counts before, after;
    counts(&a, &before);

    /* Invalid files: refused with the field named, nothing changes. */
    write_file(a.path, "{\"tenants\": [{\"name\": \"bob\", \"api_keys\": [\"bob-key\"], "
                       "\"group\": \"nope\"}]}");
    assert_int_equal(pagoda_admin_reload(adm, NULL), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "tenants[0].group"));
    write_file(a.path, "{\"tenants\": [");
    assert_int_equal(pagoda_admin_reload(adm, NULL), PAGODA_EFORMAT);
    unlink(a.path);
    assert_int_equal(pagoda_admin_reload(adm, NULL), PAGODA_ENOENT);
    /* A valid file without admin keys: refused, or no admin call (the next reload included)
     * would be taken after it. */
    write_file(a.path, "{\"tenants\": [{\"name\": \"bob\", \"api_keys\": [\"bob-key\"]}]}");
    assert_int_equal(pagoda_admin_reload(adm, NULL), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "no admin_keys"));
    counts(&a, &after);
    assert_int_equal(after.policies, before.policies);
    pagoda_admin_list l;
    assert_int_equal(pagoda_admin_tenants(adm, &l), 0);
    assert_int_equal(l.num_tenants, 4);
    assert_int_equal(l.num_pins, 2);
    pagoda_admin_list_free(&l);
    pagoda_result r;
    assert_int_equal(pagoda_poll(bob, bob_id, 0, 0, &r), 0); /* bob's key still works */
    pagoda_result_free(&r);

    /* A valid one: bob is gone, dave arrives, carol joins the team, the file pin changes. */
    write_file(a.path,
               "{\"admin_keys\": [\"adm-key\"],"
               " \"groups\": [{\"name\": \"team\", \"cache_quota_blocks\": 10}],"
               " \"tenants\": ["
               "  {\"name\": \"alice\", \"api_keys\": [\"alice-key\"], \"group\": \"team\"},"
               "  {\"name\": \"carol\", \"api_keys\": [\"carol-key\"], \"group\": \"team\"},"
               "  {\"name\": \"dave\", \"api_keys\": [\"dave-key\"], \"max_running\": 3},"
               "  {\"name\": \"zoe\", \"api_keys\": [\"zoe-key\"]}],"
               " \"pins\": [{\"name\": \"sys\", \"token_ids\": [1, 2, 3, 4],"
               "  \"tenants\": [\"dave\"]}]}");
    assert_int_equal(pagoda_admin_reload(adm, &l), 0);
    assert_int_equal(l.num_pins, 2);
    const pagoda_pin_info *sys = list_pin(&l, "sys"), *rt = list_pin(&l, "rt");
    assert_true(sys->from_file);
    assert_int_equal(sys->num_tokens, 4);
    assert_true(sys->ready);
    assert_false(rt->from_file);
    assert_int_equal(rt->num_tenants, 1); /* bob is gone from it */
    assert_string_equal(rt->tenants[0], "zoe");
    assert_true(rt->ready);
    pagoda_admin_list_free(&l);
    Pagoda__Internal__Policy *p = fake_sched_last_policy(a.e.fs);
    assert_int_equal(p->version, before.last_policy_version + 1);
    assert_null(policy_tenant(p, "bob"));
    assert_string_equal(policy_tenant(p, "carol")->namespace_, "g:team");
    assert_int_equal(policy_tenant(p, "dave")->max_running, 3);
    assert_string_equal(policy_tenant(p, "dave")->pins[0], "sys");
    assert_int_equal(policy_tenant(p, "alice")->n_pins, 0);
    assert_int_equal(policy_namespace(p, "g:team")->quota_blocks, 10);
    assert_null(policy_namespace(p, "t:carol"));
    pagoda__internal__policy__free_unpacked(p, NULL);

    /* bob can no longer call; dave can. bob's request runs to its end in the scheduler. */
    const int32_t other[] = {10};
    uint8_t id[16];
    assert_int_equal(pagoda_submit(bob, &gp, other, 1, id), PAGODA_EPERM);
    assert_int_equal(pagoda_poll(bob, bob_id, 0, 0, &r), PAGODA_EPERM);
    fake_sched_hold(a.e.fs, 0);
    pagoda_client *dave = client_with_key(&a, "dave-key");
    assert_int_equal(pagoda_generate(dave, &gp, other, 1, &r), 0);
    assert_int_equal(r.num_tokens, 5);
    pagoda_result_free(&r);
    for (uint64_t t0 = rtr_now_ms(); rtr_now_ms() - t0 < 2000; usleep(2000)) {
        counts(&a, &after);
        if (after.running == 0)
            break;
    }
    assert_int_equal(after.running, 0);
    assert_int_equal(after.cancels, before.cancels);
    assert_string_equal(after.last_tenant, "dave");

    /* A tenant the file brings back finds its requests again. */
    write_file(a.path, tenants_json);
    assert_int_equal(pagoda_admin_reload(adm, NULL), 0);
    assert_int_equal(pagoda_poll(bob, bob_id, 0, 0, &r), 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_LENGTH);
    assert_int_equal(r.num_tokens, 5);
    pagoda_result_free(&r);

    /* A runtime pin whose last reader goes is unpinned (it would hold its blocks for nobody). */
    write_file(a.path, "{\"admin_keys\": [\"adm-key\"],"
                       " \"tenants\": [{\"name\": \"alice\", \"api_keys\": [\"alice-key\"]}]}");
    assert_int_equal(pagoda_admin_reload(adm, &l), 0);
    assert_int_equal(l.num_pins, 0);
    pagoda_admin_list_free(&l);
    p = fake_sched_last_policy(a.e.fs);
    assert_int_equal(p->n_pins, 0);
    pagoda__internal__policy__free_unpacked(p, NULL);
    pagoda_client_close(dave);
    pagoda_client_close(bob);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* ---- finished results and Stats, per tenant -------------------------------------------------- */

static int run(const char *cmd, char *out, size_t len);

/* Waits until the router holds no unfinished request (the engine's Stats, admin key). */
static void wait_router_idle(pagoda_client *adm)
{
    pagoda_engine_stats st = {0};
    for (uint64_t t0 = rtr_now_ms(); rtr_now_ms() - t0 < 10000; usleep(5000)) {
        assert_int_equal(pagoda_stats(adm, &st), 0);
        if (st.live_requests == 0)
            return;
    }
    fail_msg("the router still holds %u unfinished requests", st.live_requests);
}

/* Submits n requests of one token, their ids into ids. */
static void submit_many(pagoda_client *c, size_t n, uint8_t (*ids)[16])
{
    pagoda_generate_params gp = greedy(1);
    for (size_t i = 0; i < n; i++) {
        const int32_t prompt[] = {(int32_t)(100 + i % 50)};
        assert_int_equal(pagoda_submit(c, &gp, prompt, 1, ids[i]), 0);
    }
}

/* How many of ids the router still holds (a poll that is not PAGODA_ENOENT). */
static size_t count_held(pagoda_client *c, size_t n, uint8_t (*ids)[16])
{
    size_t held = 0;
    for (size_t i = 0; i < n; i++) {
        pagoda_result r;
        int rc = pagoda_poll(c, ids[i], 0, 0, &r);
        assert_true(rc == 0 || rc == PAGODA_ENOENT);
        held += rc == 0;
        if (rc == 0)
            pagoda_result_free(&r);
    }
    return held;
}

/* One tenant's flood of short requests does not expire another's unpolled result. The outside
 * probe sent 4,100 requests against the default bound of 4,096; this router keeps 40 results in
 * all, and carol sends 100. The bound on the total takes from the tenant holding the most. */
static void test_finished_results_do_not_evict_other_tenants(void **state)
{
    (void)state;
    static const char json[] = "{\"admin_keys\": [\"adm-key\"],"
                               " \"tenants\": [{\"name\": \"bob\", \"api_keys\": [\"bob-key\"]},"
                               "  {\"name\": \"carol\", \"api_keys\": [\"carol-key\"]}]}";
    const char *const extra[] = {"--max-finished", "40", NULL};
    struct admin_env a;
    env_start(&a, json, extra);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    pagoda_client *bob = client_with_key(&a, "bob-key");
    pagoda_client *carol = client_with_key(&a, "carol-key");
    const int32_t prompt[] = {9};
    pagoda_generate_params gp = greedy(2);
    uint8_t bob_id[16];
    assert_int_equal(pagoda_submit(bob, &gp, prompt, 1, bob_id), 0);
    wait_router_idle(adm); /* bob's result is ready, and nobody polled it */
    enum { FLOOD = 100 };
    static uint8_t ids[FLOOD][16];
    submit_many(carol, FLOOD, ids);
    wait_router_idle(adm);

    pagoda_result r;
    assert_int_equal(pagoda_poll(bob, bob_id, 0, 0, &r), 0);
    assert_int_equal(r.finish_reason, PAGODA_FINISH_LENGTH);
    assert_int_equal(r.num_tokens, 2);
    pagoda_result_free(&r);
    assert_int_equal(count_held(carol, FLOOD, ids), 39); /* the total's bound, less bob's one */
    pagoda_engine_stats st;
    assert_int_equal(pagoda_stats(adm, &st), 0);
    assert_int_equal(st.finished_requests, 40);
    pagoda_client_close(carol);
    pagoda_client_close(bob);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* A tenant's max_finished bounds its own results: past it its own oldest go. */
static void test_finished_results_tenant_bound(void **state)
{
    (void)state;
    static const char json[] =
        "{\"admin_keys\": [\"adm-key\"],"
        " \"tenants\": [{\"name\": \"alice\", \"api_keys\": [\"alice-key\"], \"max_finished\": 5},"
        "  {\"name\": \"bob\", \"api_keys\": [\"bob-key\"]}]}";
    struct admin_env a;
    env_start(&a, json, NULL);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    pagoda_client *alice = client_with_key(&a, "alice-key");
    pagoda_client *bob = client_with_key(&a, "bob-key");
    enum { N = 12 };
    static uint8_t alice_ids[N][16], bob_ids[N][16];
    submit_many(bob, N, bob_ids);
    submit_many(alice, N, alice_ids);
    wait_router_idle(adm);
    assert_int_equal(count_held(alice, N, alice_ids), 5);
    assert_int_equal(count_held(bob, N, bob_ids), N);
    pagoda_client_close(bob);
    pagoda_client_close(alice);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* A tenant's key gets its own figures only; an admin key the engine's. */
struct stats_call {
    pagoda_client *c;
    int rc;
};

static void *stats_thread(void *arg)
{
    struct stats_call *sc = arg;
    pagoda_engine_stats st;
    sc->rc = pagoda_stats(sc->c, &st);
    return NULL;
}

/* A tenant's Stats parks until the scheduler answers, like an admin's: they count against
 * --max-parked, so a tenant calling Stats in a loop cannot hold an unbounded number of the
 * router's calls (and contexts) while the scheduler is slow. */
static void test_tenant_stats_count_against_max_parked(void **state)
{
    (void)state;
    static const char *const extra[] = {"--max-parked", "2", NULL};
    struct admin_env a;
    env_start(&a, tenants_json, extra);
    wait_policies(&a, 1);
    fake_sched_hold_admin(a.e.fs, 1);
    struct stats_call calls[2];
    pthread_t t[2];
    for (int i = 0; i < 2; i++) {
        calls[i].c = client_with_key(&a, "alice-key");
        pthread_create(&t[i], NULL, stats_thread, &calls[i]);
    }
    usleep(500 * 1000); /* both parked in the router */
    pagoda_client *bob = client_with_key(&a, "bob-key");
    pagoda_engine_stats st;
    assert_int_equal(pagoda_stats(bob, &st), PAGODA_EBUSY);
    fake_sched_hold_admin(a.e.fs, 0);
    for (int i = 0; i < 2; i++) {
        pthread_join(t[i], NULL);
        pagoda_client_close(calls[i].c);
    }
    pagoda_client_close(bob);
    env_stop(&a);
}

/* With a tenants file a tenant's parked calls are at most its share (ROUTER_PARKED_PER_ADMITTED
 * a request it may have, plus its Tokenize calls and 16): under --max-parked one above carol's
 * share (max_running 2, max_waiting 1: 60), she parks 60 Stats calls while the scheduler holds
 * its answers, her 61st is refused at once, and bob's Stats still parks and is answered. Before,
 * carol's 61st took the last parked call and bob's was refused (an outside probe's 17,000 polls
 * made every tenant's Stats PAGODA_EBUSY). */
static void test_a_tenant_parks_its_share(void **state)
{
    (void)state;
    enum { SHARE = ROUTER_PARKED_PER_ADMITTED * 3 + ROUTER_MAX_TENANT_TEXT_CALLS + 16 };
    char max_parked[16];
    snprintf(max_parked, sizeof(max_parked), "%d", SHARE + 1);
    const char *const extra[] = {"--max-parked", max_parked, NULL};
    struct admin_env a;
    env_start(&a, tenants_json, extra);
    wait_policies(&a, 1);
    fake_sched_hold_admin(a.e.fs, 1);
    Pagoda__StatsRequest sr = PAGODA__STATS_REQUEST__INIT;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.api_key = "carol-key";
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_STATS;
    req.stats = &sr;
    struct rt_calls stats;
    rt_calls_send(&stats, a.e.url, &req, SHARE);
    usleep(500 * 1000); /* all parked in the router (their answers are held) */
    pagoda_client *carol = client_with_key(&a, "carol-key");
    pagoda_engine_stats st;
    assert_int_equal(pagoda_stats(carol, &st), PAGODA_EBUSY);
    assert_non_null(strstr(pagoda_error_detail(), "this tenant's"));
    fake_sched_hold_admin(a.e.fs, 0);
    pagoda_client *bob = client_with_key(&a, "bob-key");
    int rc = pagoda_stats(bob, &st);
    if (rc != 0)
        fail_msg("bob's Stats beside carol's share: %s: %s", pagoda_strerror(rc),
                 pagoda_error_detail());
    rt_calls_end(&stats, 0); /* carol's held calls are never answered */
    pagoda_client_close(bob);
    pagoda_client_close(carol);
    env_stop(&a);
}

static void test_stats_are_per_tenant(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    pagoda_client *alice = client_with_key(&a, "alice-key");
    pagoda_client *bob = client_with_key(&a, "bob-key");
    const int32_t prompt[] = {7, 7};
    pagoda_generate_params gp = greedy(2);
    pagoda_result r;
    for (int i = 0; i < 3; i++) {
        assert_int_equal(pagoda_generate(alice, &gp, prompt, 2, &r), 0);
        pagoda_result_free(&r);
    }
    fake_sched_hold(a.e.fs, 1); /* bob's request stays running */
    uint8_t id[16];
    assert_int_equal(pagoda_submit(bob, &gp, prompt, 2, id), 0);
    struct fake_sched_counts c;
    for (uint64_t t0 = rtr_now_ms(); rtr_now_ms() - t0 < 2000; usleep(2000)) {
        counts(&a, &c);
        if (c.submits == 4 && c.running == 1)
            break;
    }

    pagoda_engine_stats st;
    struct fake_figures f;
    assert_int_equal(pagoda_stats(alice, &st), 0);
    assert_string_equal(st.tenant, "alice");
    fake_sched_tenant_figures("alice", &f);
    assert_int_equal(st.prefix_query_tokens, f.query_tokens);
    assert_int_equal(st.prefix_hit_tokens, f.hit_tokens);
    assert_true(st.prefix_hit_rate == 0.5);
    assert_int_equal(st.running, 0);
    assert_int_equal(st.waiting, f.waiting);
    uint32_t cached;
    uint64_t evictions;
    fake_sched_namespace_figures("g:team", &cached, &evictions); /* alice's group's */
    assert_int_equal(st.cached_blocks, cached);
    assert_int_equal(st.evictions, evictions);
    assert_int_equal(st.live_requests, 0);
    assert_int_equal(st.finished_requests, 3);
    assert_int_equal(st.duplicate_submits, 0);
    assert_true(st.scheduler_connected);
    /* Nothing of the engine's: those figures show everyone's traffic. */
    assert_int_equal(st.num_blocks, 0);
    assert_true(st.kv_usage == 0.0);
    assert_int_equal(st.steps, 0);
    assert_int_equal(st.peak_running, 0);

    assert_int_equal(pagoda_stats(bob, &st), 0);
    assert_string_equal(st.tenant, "bob");
    fake_sched_tenant_figures("bob", &f);
    assert_int_equal(st.prefix_query_tokens, f.query_tokens);
    assert_int_equal(st.running, 1);
    assert_int_equal(st.live_requests, 1);
    assert_int_equal(st.finished_requests, 0);

    assert_int_equal(pagoda_stats(adm, &st), 0);
    assert_string_equal(st.tenant, "");
    assert_int_equal(st.num_blocks, 64);
    assert_true(st.kv_usage == 0.25);
    assert_int_equal(st.live_requests, 1);
    assert_int_equal(st.finished_requests, 3);

    /* The CLI prints a tenant's figures under its name, and only those. */
    char cmd[1024], out[8192];
    snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda --url %s --api-key bob-key stats", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "tenant bob\nrunning 1\n"));
    assert_null(strstr(out, "kv_usage"));
    snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda --url %s --api-key bob-key stats --json",
             a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "{\"tenant\": \"bob\", \"running\": 1, "));
    snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda --url %s --api-key adm-key stats", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "kv_usage 0.25\n"));
    assert_null(strstr(out, "tenant"));
    fake_sched_hold(a.e.fs, 0);
    pagoda_client_close(bob);
    pagoda_client_close(alice);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* ---- reload --------------------------------------------------------------------------------- */

struct reload_call {
    pagoda_client *adm;
    int rc;
    char detail[512];
};

static void *reload_thread(void *arg)
{
    struct reload_call *rc = arg;
    rc->rc = pagoda_admin_reload(rc->adm, NULL);
    snprintf(rc->detail, sizeof(rc->detail), "%s", pagoda_error_detail());
    return NULL;
}

/* The tenants file replaced by a FIFO: the reload gets a clear error, and another client's
 * requests are answered while it runs (the router never opens the file on its loop). */
static void test_reload_fifo_does_not_block_others(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    pagoda_client *bob = client_with_key(&a, "bob-key");
    struct reload_call call = {.adm = client_with_key(&a, "adm-key")};
    assert_int_equal(unlink(a.path), 0);
    assert_int_equal(mkfifo(a.path, 0600), 0);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, reload_thread, &call), 0);
    usleep(200 * 1000); /* the reload reaches the router first */
    const int32_t prompt[] = {4, 2};
    pagoda_generate_params gp = greedy(3);
    pagoda_result r;
    int generated = pagoda_generate(bob, &gp, prompt, 2, &r);
    pagoda_result_free(&r);
    /* A router stuck opening the FIFO for reading is let go by a writer (bounded, so that a
     * failure does not hang the test). */
    int joined = 0;
    for (int i = 0; i < 50 && !joined; i++) {
        int fd = open(a.path, O_WRONLY | O_NONBLOCK);
        if (fd >= 0)
            close(fd);
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += 100 * 1000 * 1000;
        if (ts.tv_nsec >= 1000000000) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000;
        }
        joined = pthread_timedjoin_np(th, NULL, &ts) == 0;
    }
    assert_true(joined);
    assert_int_equal(generated, 0);
    assert_int_equal(call.rc, PAGODA_EINVAL);
    assert_non_null(strstr(call.detail, a.path));
    assert_non_null(strstr(call.detail, "FIFO"));
    /* Nothing changed, and a regular file reloads again. */
    assert_int_equal(unlink(a.path), 0);
    write_file(a.path, tenants_json);
    assert_int_equal(pagoda_admin_reload(call.adm, NULL), 0);
    assert_int_equal(pagoda_generate(bob, &gp, prompt, 2, &r), 0);
    pagoda_result_free(&r);
    pagoda_client_close(call.adm);
    pagoda_client_close(bob);
    env_stop(&a);
}

/* A directory or a file above the size limit in place of the tenants file: refused by name. */
static void test_reload_refuses_directory_and_large_file(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    assert_int_equal(unlink(a.path), 0);
    assert_int_equal(mkdir(a.path, 0700), 0);
    assert_int_equal(pagoda_admin_reload(adm, NULL), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), a.path));
    assert_non_null(strstr(pagoda_error_detail(), "directory"));
    assert_int_equal(rmdir(a.path), 0);
    write_file(a.path, tenants_json);
    assert_int_equal(truncate(a.path, (off_t)ROUTER_MAX_TENANTS_FILE_BYTES + 1), 0);
    assert_int_equal(pagoda_admin_reload(adm, NULL), PAGODA_ERANGE);
    assert_non_null(strstr(pagoda_error_detail(), a.path));
    assert_non_null(strstr(pagoda_error_detail(), "limit"));
    write_file(a.path, tenants_json);
    assert_int_equal(pagoda_admin_reload(adm, NULL), 0);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* ---- the link ------------------------------------------------------------------------------- */

static void test_admin_link_down_is_eclosed(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    pagoda_client *adm = client_with_key(&a, "adm-key");
    fake_sched_stop(a.e.fs);
    a.e.fs = NULL;
    int healthy = 1;
    for (uint64_t t0 = rtr_now_ms(); healthy && rtr_now_ms() - t0 < 3000; usleep(5000))
        assert_int_equal(pagoda_health(adm, &healthy), 0);
    assert_false(healthy);
    pagoda_admin_list l;
    assert_int_equal(pagoda_admin_tenants(adm, &l), PAGODA_ECLOSED);
    assert_non_null(strstr(pagoda_error_detail(), "link is down"));
    const int32_t tokens[] = {1, 2};
    const char *const who[] = {"alice"};
    assert_int_equal(pagoda_admin_pin(adm, "down", tokens, 2, who, 1, NULL), PAGODA_ECLOSED);
    assert_int_equal(pagoda_admin_unpin(adm, "sys"), PAGODA_ECLOSED);
    assert_int_equal(pagoda_admin_flush_tenant(adm, "alice", NULL), PAGODA_ECLOSED);
    assert_int_equal(pagoda_admin_reload(adm, NULL), PAGODA_ECLOSED);
    /* Nothing changed: a new scheduler gets the same tenancy, at the same version. */
    assert_int_equal(fake_sched_start(a.e.sched_url, &a.e.fs), 0);
    wait_policies(&a, 1);
    Pagoda__Internal__Policy *p = fake_sched_last_policy(a.e.fs);
    assert_int_equal(p->version, 1);
    assert_int_equal(p->n_pins, 1);
    assert_string_equal(p->pins[0]->name, "sys");
    pagoda__internal__policy__free_unpacked(p, NULL);
    for (uint64_t t0 = rtr_now_ms(); !healthy && rtr_now_ms() - t0 < 3000; usleep(5000))
        assert_int_equal(pagoda_health(adm, &healthy), 0);
    assert_int_equal(pagoda_admin_tenants(adm, &l), 0);
    assert_int_equal(l.num_pins, 1);
    assert_true(l.pins[0].ready);
    pagoda_admin_list_free(&l);
    pagoda_client_close(adm);
    env_stop(&a);
}

/* ---- the CLI -------------------------------------------------------------------------------- */

static int run(const char *cmd, char *out, size_t len)
{
    FILE *f = popen(cmd, "r");
    assert_non_null(f);
    size_t n = fread(out, 1, len - 1, f);
    out[n] = '\0';
    int status = pclose(f);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void test_admin_cli(void **state)
{
    (void)state;
    struct admin_env a;
    env_start(&a, tenants_json, NULL);
    wait_policies(&a, 1);
    char cmd[1024], out[8192];
#define PAGODA PAGODA_BIN_DIR "/pagoda --url %s --api-key adm-key admin "
    snprintf(cmd, sizeof(cmd), PAGODA "tenants", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "tenant alice group=team namespace=g:team max_running=4 "
                                "max_waiting=8 cache_quota_blocks=1000 lookups=15 hits=7 "
                                "hit_rate=0.5 query_tokens=500 hit_tokens=250"));
    assert_non_null(strstr(out, "tenant zoe group=- namespace=t:zoe"));
    assert_non_null(strstr(out, "pins=sys\n"));
    assert_non_null(strstr(out, "pin sys tokens=8 tenants=alice,carol ready=true blocks=2 "
                                "from_file=true\n"));

    snprintf(cmd, sizeof(cmd), PAGODA "tenants --json", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_int_equal(out[0], '{');
    assert_non_null(
        strstr(out, "\"name\": \"carol\", \"group\": null, \"namespace\": \"t:carol\""));
    assert_non_null(strstr(out, "\"hit_rate\": 0.5"));
    assert_non_null(strstr(out, "\"pins\": [{\"name\": \"sys\", \"num_tokens\": 8"));
    assert_int_equal(strchr(out, '\n') - out, (long)strlen(out) - 1); /* one line */

    snprintf(cmd, sizeof(cmd), PAGODA "pin cli --tokens 4,5,6,7,8 --tenants bob,zoe --json",
             a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "{\"name\": \"cli\", \"num_tokens\": 5, \"tenants\": [\"bob\", "
                                "\"zoe\"], \"ready\": true, \"blocks\": 1, \"error\": null, "
                                "\"from_file\": false}"));
    snprintf(cmd, sizeof(cmd), PAGODA "unpin cli", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, "unpinned cli\n");
    snprintf(cmd, sizeof(cmd), PAGODA "unpin cli 2>&1", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "no pin"));
    snprintf(cmd, sizeof(cmd), PAGODA "flush --tenant alice", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, "flushed 13 blocks\n");
    snprintf(cmd, sizeof(cmd), PAGODA "flush --group team --json", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_string_equal(out, "{\"flushed_blocks\": 13}\n");
    snprintf(cmd, sizeof(cmd), PAGODA "reload", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "reloaded: 1 pins\npin sys "));

    /* Bad flags: 2, before any call. */
    const char *bad[] = {"frobnicate",
                         "pin",
                         "pin x --tokens 1",
                         "pin x --tenants a",
                         "pin --tokens 1 --tenants a",
                         "unpin",
                         "unpin a b",
                         "flush",
                         "flush --tenant a --group b",
                         "tenants --tokens 1",
                         "pin x --tokens 1,y --tenants a",
                         "pin x --tokens 1 --tenants a,,b",
                         "reload extra",
                         "tenants --bogus"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        snprintf(cmd, sizeof(cmd), PAGODA "%s 2>/dev/null", a.e.url, bad[i]);
        if (run(cmd, out, sizeof(out)) != 2)
            fail_msg("'admin %s' did not exit 2", bad[i]);
    }
    /* A tenant's key: refused by the router, 1. */
    snprintf(cmd, sizeof(cmd),
             PAGODA_BIN_DIR "/pagoda --url %s --api-key alice-key admin tenants 2>&1", a.e.url);
    assert_int_equal(run(cmd, out, sizeof(out)), 1);
    assert_non_null(strstr(out, "not an admin key"));
    snprintf(cmd, sizeof(cmd), PAGODA_BIN_DIR "/pagoda --help");
    assert_int_equal(run(cmd, out, sizeof(out)), 0);
    assert_non_null(strstr(out, "admin pin NAME --tokens 1,2,3 --tenants a,b"));
#undef PAGODA
    env_stop(&a);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_policy_sent_on_link_up_before_anything),
        cmocka_unit_test(test_policy_without_tenants_file),
        cmocka_unit_test(test_policy_versions_increase_with_pin_unpin_reload),
        cmocka_unit_test(test_admin_refused_without_admin_key),
        cmocka_unit_test(test_pin_waits_for_policy_applied),
        cmocka_unit_test(test_pin_timeout_keeps_it_configured),
        cmocka_unit_test(test_runtime_pins_survive_a_restart),
        cmocka_unit_test(test_tenants_listing_joins_figures),
        cmocka_unit_test(test_flush_maps_tenant_to_namespace),
        cmocka_unit_test(test_reload_failure_keeps_old_config),
        cmocka_unit_test(test_admin_link_down_is_eclosed),
        cmocka_unit_test(test_admin_cli),
        cmocka_unit_test(test_finished_results_do_not_evict_other_tenants),
        cmocka_unit_test(test_finished_results_tenant_bound),
        cmocka_unit_test(test_stats_are_per_tenant),
        cmocka_unit_test(test_tenant_stats_count_against_max_parked),
        cmocka_unit_test(test_a_tenant_parks_its_share),
        cmocka_unit_test(test_reload_fifo_does_not_block_others),
        cmocka_unit_test(test_reload_refuses_directory_and_large_file),
    };
    signal(SIGPIPE, SIG_IGN);
    int failed = cmocka_run_group_tests_name("router admin", tests, NULL, NULL);
    nng_fini();
    return failed;
}
