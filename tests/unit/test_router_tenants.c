/* Tests of router/tenants.c and what the router bounds by tenant: the tenants file's errors,
 * keys, groups, pins and admin keys, other tenants' ids, per-tenant dedup and bounds, a restart,
 * and the tokenize calls a tenant may hold; pagoda-router against the stand-in scheduler
 * (router_fake_scheduler.h), through libpagoda and raw REQ sockets (router_test_client.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "client/pagoda.h"
#include "client/pagoda_async.h"
#include "common/error.h"
#include "proto/pagoda.pb-c.h"
#include "router/router.h"
#include "router/tenants.h"
#include "tests/unit/router_fake_scheduler.h"
#include "tests/unit/router_test_client.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <nng/supplemental/util/platform.h>

#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

static const char tenants_json[] =
    "{\"tenants\": ["
    "{\"name\": \"alice\", \"api_keys\": [\"alice-key-1\", \"alice-key-2\"], \"max_running\": 4,"
    " \"max_waiting\": 4},"
    "{\"name\": \"bob\", \"api_keys\": [\"bob-key\"]},"
    "{\"name\": \"carol\", \"api_keys\": [\"carol-key\"], \"max_running\": 2, \"max_waiting\": 1}"
    "]}";

static char tenants_path[64];

static pagoda_client *open_tenant_client(const struct rtr_env *e, const char *key)
{
    pagoda_client *c = rt_open_client(e);
    assert_int_equal(pagoda_client_set_api_key(c, key), 0);
    return c;
}

/* Writes json into a new file /tmp/pagoda-tenants-XXXXXX, its name into path. Returns 0 or -1. */
static int write_tenants_file(char path[64], const char *json)
{
    snprintf(path, 64, "/tmp/pagoda-tenants-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0)
        return -1;
    size_t len = strlen(json);
    ssize_t n = write(fd, json, len);
    close(fd);
    return n == (ssize_t)len ? 0 : -1;
}

static int tenants_setup(void **state)
{
    static struct rtr_env env;
    if (write_tenants_file(tenants_path, tenants_json) != 0)
        return -1;
    /* A global bound of 9: alice (8) and carol (3) together can reach it. */
    const char *const args[] = {"--tenants", tenants_path, "--max-requests", "9", NULL};
    if (rtr_env_start(&env, args) != 0)
        return -1;
    *state = &env;
    return 0;
}

static int tenants_teardown(void **state)
{
    unlink(tenants_path);
    return rt_env_teardown(state);
}

/* Parses doc; expects code and, when field is not NULL, a detail that names it. */
static void expect_tenants_error(const char *doc, int code, const char *field)
{
    struct router_tenants *t = NULL;
    int rc = router_tenants_parse(doc, strlen(doc), "t.json", &t);
    if (rc != code || (field != NULL && strstr(pagoda_error_detail(), field) == NULL))
        fail_msg("for %s: got %d (%s), expected %d naming %s", doc, rc, pagoda_error_detail(), code,
                 field ? field : "-");
    assert_null(t);
}

static void test_tenants_file_errors_name_the_field(void **state)
{
    (void)state;
    struct router_tenants *t = NULL;
    assert_int_equal(router_tenants_parse(tenants_json, strlen(tenants_json), "t.json", &t), 0);
    assert_int_equal(t->count, 3);
    assert_string_equal(t->tenants[1].name, "bob");
    assert_int_equal(t->tenants[1].max_running, ROUTER_TENANT_DEFAULT_MAX_RUNNING);
    assert_int_equal(t->tenants[1].max_waiting, ROUTER_TENANT_DEFAULT_MAX_WAITING);
    assert_int_equal(t->tenants[2].max_running, 2);
    assert_string_equal(router_tenants_find_key(t, "alice-key-2")->name, "alice");
    assert_null(router_tenants_find_key(t, "alice-key-3"));
    assert_null(router_tenants_find_key(t, NULL));
    router_tenants_free(t);

    expect_tenants_error("{\"tenants\": [", PAGODA_EFORMAT, "t.json:");
    expect_tenants_error("[]", PAGODA_EFORMAT, "object");
    expect_tenants_error("{\"tenant\": []}", PAGODA_EFORMAT, "tenant");
    expect_tenants_error("{\"tenants\": {}}", PAGODA_EFORMAT, "\"tenants\"");
    expect_tenants_error("{\"tenants\": []}", PAGODA_ERANGE, "\"tenants\"");
    expect_tenants_error("{\"tenants\": [7]}", PAGODA_EFORMAT, "tenants[0]");
    expect_tenants_error("{\"tenants\": [{\"api_keys\": [\"k\"]}]}", PAGODA_EFORMAT,
                         "tenants[0].name");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a b\", \"api_keys\": [\"k\"]}]}",
                         PAGODA_EFORMAT, "tenants[0].name");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\"}]}", PAGODA_EFORMAT,
                         "tenants[0].api_keys");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": []}]}", PAGODA_ERANGE,
                         "tenants[0].api_keys");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\", 3]}]}",
                         PAGODA_EFORMAT, "tenants[0].api_keys[1]");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"\"]}]}", PAGODA_EFORMAT,
                         "tenants[0].api_keys[0]");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"]},"
                         " {\"name\": \"b\", \"api_keys\": [\"k\"]}]}",
                         PAGODA_EEXIST, "tenants[1].api_keys[0]");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"]},"
                         " {\"name\": \"a\", \"api_keys\": [\"j\"]}]}",
                         PAGODA_EEXIST, "tenants[1].name");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], "
                         "\"max_running\": 0}]}",
                         PAGODA_ERANGE, "tenants[0].max_running");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], "
                         "\"max_waiting\": \"many\"}]}",
                         PAGODA_EFORMAT, "tenants[0].max_waiting");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], "
                         "\"max_wait\": 3}]}",
                         PAGODA_EFORMAT, "max_wait");
    /* A file above the size bound is refused before it is parsed. */
    size_t big = ROUTER_MAX_TENANTS_FILE_BYTES + 1;
    char *huge = malloc(big + 1);
    memset(huge, ' ', big);
    huge[big] = '\0';
    expect_tenants_error(huge, PAGODA_ERANGE, "limit");
    free(huge);
}

/* max_finished: per tenant, with a default, in [1, ROUTER_TENANT_LIMIT_MAX]. */
static void test_tenants_file_max_finished(void **state)
{
    (void)state;
    const char doc[] = "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], "
                       "\"max_finished\": 7}, {\"name\": \"b\", \"api_keys\": [\"j\"]}]}";
    struct router_tenants *t = NULL;
    assert_int_equal(router_tenants_parse(doc, strlen(doc), "t.json", &t), 0);
    assert_int_equal(t->tenants[0].max_finished, 7);
    assert_int_equal(t->tenants[1].max_finished, ROUTER_TENANT_DEFAULT_MAX_FINISHED);
    router_tenants_free(t);
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], "
                         "\"max_finished\": 0}]}",
                         PAGODA_ERANGE, "tenants[0].max_finished");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], "
                         "\"max_finished\": \"all\"}]}",
                         PAGODA_EFORMAT, "tenants[0].max_finished");
}

struct load_call {
    const char *path;
    struct router_tenants *t;
    int rc;
    char detail[512];
    atomic_int done;
};

static void *load_thread(void *arg)
{
    struct load_call *l = arg;
    l->rc = router_tenants_load(l->path, &l->t);
    snprintf(l->detail, sizeof(l->detail), "%s", pagoda_error_detail());
    atomic_store(&l->done, 1);
    return NULL;
}

/* router_tenants_load on path, on a thread so that a load that blocks (a FIFO opened for reading
 * waits for a writer) fails the test instead of hanging it: after 3 s a writer opens the FIFO
 * to let it go. Expects code and a detail naming the path and what (when not NULL). */
static void expect_load(const char *path, int code, const char *what)
{
    struct load_call l = {.path = path};
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, load_thread, &l), 0);
    int blocked = 1;
    for (uint64_t t0 = rtr_now_ms(); rtr_now_ms() - t0 < 3000 && blocked; usleep(1000))
        blocked = !atomic_load(&l.done);
    for (int i = 0; i < 100 && !atomic_load(&l.done); i++) {
        int fd = open(path, O_WRONLY | O_NONBLOCK);
        if (fd >= 0)
            close(fd);
        usleep(10000);
    }
    pthread_join(th, NULL);
    router_tenants_free(l.t);
    if (blocked)
        fail_msg("loading %s blocked (it returned %d only once a writer came)", path, l.rc);
    if (l.rc != code || strstr(l.detail, path) == NULL ||
        (what != NULL && strstr(l.detail, what) == NULL))
        fail_msg("loading %s: got %d (%s), expected %d naming the path and %s", path, l.rc,
                 l.detail, code, what ? what : "-");
}

/* A tenants file that is a FIFO, a directory, a device or too large is refused by name without
 * reading it, and never blocks the caller; a symlink to a regular file is followed. */
static void test_tenants_load_refuses_what_is_not_a_file(void **state)
{
    (void)state;
    char dir[] = "/tmp/pagoda-load-XXXXXX", path[128], link_path[128];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/t.json", dir);
    snprintf(link_path, sizeof(link_path), "%s/link.json", dir);

    assert_int_equal(mkfifo(path, 0600), 0);
    expect_load(path, PAGODA_EINVAL, "FIFO");
    assert_int_equal(unlink(path), 0);

    assert_int_equal(mkdir(path, 0700), 0);
    expect_load(path, PAGODA_EINVAL, "directory");
    assert_int_equal(rmdir(path), 0);

    expect_load("/dev/null", PAGODA_EINVAL, "device");
    expect_load(path, PAGODA_ENOENT, NULL);

    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(tenants_json, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
    assert_int_equal(truncate(path, (off_t)ROUTER_MAX_TENANTS_FILE_BYTES + 1), 0);
    expect_load(path, PAGODA_ERANGE, "limit");
    assert_int_equal(truncate(path, (off_t)strlen(tenants_json)), 0);
    assert_int_equal(symlink(path, link_path), 0);
    struct router_tenants *t = NULL;
    assert_int_equal(router_tenants_load(link_path, &t), 0);
    assert_int_equal(t->count, 3);
    router_tenants_free(t);
    unlink(link_path);
    unlink(path);
    rmdir(dir);
}

/* The keys an issue-7 file adds: groups, namespaces and quotas, pins, admin keys. */
static void test_tenants_file_groups_pins_admin_keys(void **state)
{
    (void)state;
    static const char doc[] =
        "{\"admin_keys\": [\"adm\", \"adm2\"],"
        " \"groups\": [{\"name\": \"team\", \"cache_quota_blocks\": 1000}, {\"name\": \"empty\"}],"
        " \"tenants\": [{\"name\": \"zed\", \"api_keys\": [\"k3\"], \"cache_quota_blocks\": 500},"
        "  {\"name\": \"alice\", \"api_keys\": [\"k1\"], \"group\": \"team\", \"max_running\": 64,"
        "   \"max_waiting\": 256},"
        "  {\"name\": \"bob\", \"api_keys\": [\"k2\"], \"group\": \"team\"}],"
        " \"pins\": [{\"name\": \"sys\", \"token_ids\": [1, 2, 3], \"tenants\": [\"alice\", "
        "\"zed\"]}]}";
    struct router_tenants *t = NULL;
    assert_int_equal(router_tenants_parse(doc, strlen(doc), "t.json", &t), 0);
    assert_int_equal(t->count, 3);
    assert_int_equal(t->num_groups, 2);
    assert_int_equal(t->num_admin_keys, 2);
    assert_int_equal(t->num_pins, 1);
    const struct router_tenant *alice = router_tenants_find(t, "alice");
    assert_non_null(alice);
    assert_string_equal(alice->namespace_name, "g:team");
    assert_int_equal(alice->cache_quota_blocks, 1000); /* the group's */
    assert_int_equal(alice->max_running, 64);
    assert_string_equal(t->groups[alice->group].name, "team");
    const struct router_tenant *zed = router_tenants_find(t, "zed");
    assert_string_equal(zed->namespace_name, "t:zed");
    assert_int_equal(zed->group, -1);
    assert_int_equal(zed->cache_quota_blocks, 500);
    assert_string_equal(router_tenants_find(t, "bob")->namespace_name, "g:team");
    assert_null(router_tenants_find(t, "carol"));
    assert_int_equal(router_tenants_find_group(t, "empty")->cache_quota_blocks, 0);
    assert_true(router_tenants_is_admin_key(t, "adm2"));
    assert_false(router_tenants_is_admin_key(t, "k1"));
    assert_null(router_tenants_find_key(t, "adm"));
    assert_string_equal(t->pins[0].name, "sys");
    assert_int_equal(t->pins[0].num_tokens, 3);
    assert_int_equal(t->pins[0].token_ids[2], 3);
    assert_int_equal(t->pins[0].num_tenants, 2);
    assert_string_equal(t->pins[0].tenants[1], "zed");
    router_tenants_free(t);

#define T1 "{\"name\": \"a\", \"api_keys\": [\"k\"]}"
    /* Groups. */
    expect_tenants_error("{\"groups\": {}, \"tenants\": [" T1 "]}", PAGODA_EFORMAT, "\"groups\"");
    expect_tenants_error("{\"groups\": [{\"name\": \"g h\"}], \"tenants\": [" T1 "]}",
                         PAGODA_EFORMAT, "groups[0].name");
    expect_tenants_error("{\"groups\": [{\"name\": \"g\"}, {\"name\": \"g\"}], \"tenants\": [" T1
                         "]}",
                         PAGODA_EEXIST, "groups[1].name");
    expect_tenants_error("{\"groups\": [{\"name\": \"g\", \"quota\": 3}], \"tenants\": [" T1 "]}",
                         PAGODA_EFORMAT, "quota");
    expect_tenants_error("{\"groups\": [{\"name\": \"g\", \"cache_quota_blocks\": -1}],"
                         " \"tenants\": [" T1 "]}",
                         PAGODA_ERANGE, "groups[0].cache_quota_blocks");
    /* A tenant's group and quota. */
    expect_tenants_error(
        "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], \"group\": \"g\"}]}",
        PAGODA_EINVAL, "tenants[0].group");
    expect_tenants_error("{\"groups\": [{\"name\": \"g\"}], \"tenants\": [{\"name\": \"a\","
                         " \"api_keys\": [\"k\"], \"group\": \"g\", \"cache_quota_blocks\": 5}]}",
                         PAGODA_EINVAL, "tenants[0].cache_quota_blocks");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"], \"group\": 7}]}",
                         PAGODA_EFORMAT, "tenants[0].group");
    expect_tenants_error("{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"],"
                         " \"cache_quota_blocks\": 2000000000}]}",
                         PAGODA_ERANGE, "tenants[0].cache_quota_blocks");
    /* Admin keys. */
    expect_tenants_error("{\"admin_keys\": [\"k\"], \"tenants\": [" T1 "]}", PAGODA_EEXIST,
                         "admin_keys[0]");
    expect_tenants_error("{\"admin_keys\": [\"x\", \"x\"], \"tenants\": [" T1 "]}", PAGODA_EEXIST,
                         "admin_keys[1]");
    expect_tenants_error("{\"admin_keys\": [\"\"], \"tenants\": [" T1 "]}", PAGODA_EFORMAT,
                         "admin_keys[0]");
    expect_tenants_error("{\"admin_keys\": \"x\", \"tenants\": [" T1 "]}", PAGODA_EFORMAT,
                         "\"admin_keys\"");
    /* Pins. */
    expect_tenants_error("{\"tenants\": [" T1 "], \"pins\": [{\"name\": \"p\", \"token_ids\": [1],"
                         " \"tenants\": [\"a\", \"b\"]}]}",
                         PAGODA_EINVAL, "pins[0].tenants[1]");
    expect_tenants_error(
        "{\"tenants\": [" T1 "], \"pins\": [{\"name\": \"p\", \"token_ids\": [1],"
        " \"tenants\": [\"a\"]}, {\"name\": \"p\", \"token_ids\": [2], \"tenants\": [\"a\"]}]}",
        PAGODA_EEXIST, "pins[1].name");
    expect_tenants_error("{\"tenants\": [" T1
                         "], \"pins\": [{\"name\": \"p q\", \"token_ids\": [1],"
                         " \"tenants\": [\"a\"]}]}",
                         PAGODA_EFORMAT, "pins[0].name");
    expect_tenants_error("{\"tenants\": [" T1 "], \"pins\": [{\"name\": \"p\", \"token_ids\": [],"
                         " \"tenants\": [\"a\"]}]}",
                         PAGODA_ERANGE, "pins[0].token_ids");
    expect_tenants_error("{\"tenants\": [" T1
                         "], \"pins\": [{\"name\": \"p\", \"token_ids\": [1, -2],"
                         " \"tenants\": [\"a\"]}]}",
                         PAGODA_ERANGE, "pins[0].token_ids[1]");
    expect_tenants_error("{\"tenants\": [" T1
                         "], \"pins\": [{\"name\": \"p\", \"token_ids\": [\"1\"],"
                         " \"tenants\": [\"a\"]}]}",
                         PAGODA_EFORMAT, "pins[0].token_ids[0]");
    expect_tenants_error("{\"tenants\": [" T1 "], \"pins\": [{\"name\": \"p\", \"token_ids\": [1],"
                         " \"tenants\": []}]}",
                         PAGODA_ERANGE, "pins[0].tenants");
    expect_tenants_error("{\"tenants\": [" T1 "], \"pins\": [{\"name\": \"p\", \"token_ids\": [1],"
                         " \"tenants\": [\"a\", \"a\"]}]}",
                         PAGODA_EEXIST, "pins[0].tenants[1]");
    expect_tenants_error("{\"tenants\": [" T1 "], \"pins\": [{\"name\": \"p\", \"token_ids\": [1],"
                         " \"tenants\": [\"a\"], \"group\": \"g\"}]}",
                         PAGODA_EFORMAT, "pins[0]");
    expect_tenants_error("{\"tenants\": [" T1 "], \"pins\": [{\"name\": \"p\", \"token_ids\": 1,"
                         " \"tenants\": [\"a\"]}]}",
                         PAGODA_EFORMAT, "pins[0].token_ids");
#undef T1
    /* One pin above ROUTER_PIN_MAX_TOKENS, and pins above ROUTER_MAX_PINNED_TOKENS in all. */
    size_t cap = 8u << 20;
    char *big = malloc(cap);
    size_t n = (size_t)snprintf(big, cap,
                                "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"]}],"
                                " \"pins\": [{\"name\": \"p\", \"tenants\": [\"a\"], "
                                "\"token_ids\": [0");
    for (uint32_t i = 0; i < ROUTER_PIN_MAX_TOKENS; i++)
        n += (size_t)snprintf(big + n, cap - n, ",1");
    n += (size_t)snprintf(big + n, cap - n, "]}]}");
    expect_tenants_error(big, PAGODA_ERANGE, "pins[0]");
    n = (size_t)snprintf(big, cap,
                         "{\"tenants\": [{\"name\": \"a\", \"api_keys\": [\"k\"]}],"
                         " \"pins\": [");
    uint32_t num_pins = ROUTER_MAX_PINNED_TOKENS / ROUTER_PIN_MAX_TOKENS + 1;
    for (uint32_t p = 0; p < num_pins; p++) {
        n += (size_t)snprintf(big + n, cap - n,
                              "%s{\"name\": \"p%u\", \"tenants\": [\"a\"], \"token_ids\": [0",
                              p ? ", " : "", p);
        for (uint32_t i = 1; i < ROUTER_PIN_MAX_TOKENS; i++) {
            memcpy(big + n, ",1", 2);
            n += 2;
        }
        n += (size_t)snprintf(big + n, cap - n, "]}");
    }
    snprintf(big + n, cap - n, "]}");
    expect_tenants_error(big, PAGODA_ERANGE, "in all");
    free(big);
}

static void test_tenants_unknown_key_is_refused(void **state)
{
    struct rtr_env *e = *state;
    const int32_t prompt[] = {5, 6};
    pagoda_generate_params p = rt_greedy(3);
    uint8_t id[16];
    const char *keys[] = {NULL, "", "nobody", "alice-key-3"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        pagoda_client *c = open_tenant_client(e, keys[i]);
        assert_int_equal(pagoda_submit(c, &p, prompt, 2, id), PAGODA_EPERM);
        assert_non_null(strstr(pagoda_error_detail(), "unknown API key"));
        assert_null(strstr(pagoda_error_detail(), "alice"));
        assert_null(strstr(pagoda_error_detail(), "bob"));
        pagoda_result r;
        assert_int_equal(pagoda_poll(c, id, 0, 0, &r), PAGODA_EPERM);
        assert_int_equal(pagoda_cancel(c, id, NULL), PAGODA_EPERM);
        pagoda_engine_stats st;
        assert_int_equal(pagoda_stats(c, &st), PAGODA_EPERM);
        /* Health is open to anyone. */
        int healthy = 0;
        assert_int_equal(pagoda_health(c, &healthy), 0);
        assert_true(healthy);
        pagoda_client_close(c);
    }
    /* Either of a tenant's keys works, and the request is stamped with its name. */
    const char *good[] = {"alice-key-1", "alice-key-2"};
    for (int i = 0; i < 2; i++) {
        pagoda_client *c = open_tenant_client(e, good[i]);
        pagoda_result r;
        assert_int_equal(pagoda_generate(c, &p, prompt, 2, &r), 0);
        assert_int_equal(r.num_tokens, 3);
        pagoda_result_free(&r);
        struct fake_sched_counts counts;
        fake_sched_get_counts(e->fs, &counts);
        assert_string_equal(counts.last_tenant, "alice");
        pagoda_client_close(c);
    }
}

static void test_tenants_other_tenants_id_is_enoent(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *alice = open_tenant_client(e, "alice-key-1");
    pagoda_client *bob = open_tenant_client(e, "bob-key");
    const int32_t prompt[] = {7, 8, 9};
    pagoda_generate_params p = rt_greedy(6);
    uint8_t id[16], unknown[16];
    rt_random_id(unknown);
    fake_sched_hold(e->fs, 1);
    assert_int_equal(pagoda_submit(alice, &p, prompt, 3, id), 0);

    pagoda_result r;
    char unknown_msg[256];
    assert_int_equal(pagoda_poll(bob, unknown, 0, 0, &r), PAGODA_ENOENT);
    snprintf(unknown_msg, sizeof(unknown_msg), "%s", pagoda_error_detail());
    assert_int_equal(pagoda_poll(bob, id, 0, 0, &r), PAGODA_ENOENT);
    assert_string_equal(pagoda_error_detail(), unknown_msg);
    assert_int_equal(pagoda_cancel(bob, unknown, NULL), PAGODA_ENOENT);
    snprintf(unknown_msg, sizeof(unknown_msg), "%s", pagoda_error_detail());
    assert_int_equal(pagoda_cancel(bob, id, NULL), PAGODA_ENOENT);
    assert_string_equal(pagoda_error_detail(), unknown_msg);

    /* Bob's cancel touched nothing: alice's request runs to its end. */
    fake_sched_hold(e->fs, 0);
    uint32_t count = 0;
    assert_int_equal(rt_wait_finished(alice, id, &count), PAGODA_FINISH_LENGTH);
    assert_int_equal(count, 6);
    pagoda_client_close(alice);
    pagoda_client_close(bob);
}

static void test_tenants_dedup_is_per_tenant(void **state)
{
    struct rtr_env *e = *state;
    struct fake_sched_counts before, after;
    fake_sched_get_counts(e->fs, &before);
    uint8_t id[16];
    rt_random_id(id);
    struct rt_raw_submit a, b;
    rt_raw_submit_init(&a, id, 4);
    a.req.api_key = (char *)"alice-key-1";
    rt_raw_submit_init(&b, id, 5); /* other parameters: would be EEXIST within one tenant */
    b.req.api_key = (char *)"bob-key";
    b.prompt[0] = 99;
    for (int i = 0; i < 2; i++) { /* each twice: the resend is the same request */
        Pagoda__ClientResponse *resp = rt_raw_request(e, &a.req);
        assert_int_equal(rt_response_code(resp), 0);
        pagoda__client_response__free_unpacked(resp, NULL);
        resp = rt_raw_request(e, &b.req);
        assert_int_equal(rt_response_code(resp), 0);
        assert_memory_equal(resp->update->request_id.data, id, 16);
        pagoda__client_response__free_unpacked(resp, NULL);
    }
    /* Within a tenant the same id with other parameters is still refused. */
    a.sub.max_tokens = 7;
    Pagoda__ClientResponse *resp = rt_raw_request(e, &a.req);
    assert_int_equal(rt_response_code(resp), PAGODA_EEXIST);
    pagoda__client_response__free_unpacked(resp, NULL);

    pagoda_client *alice = open_tenant_client(e, "alice-key-2");
    pagoda_client *bob = open_tenant_client(e, "bob-key");
    pagoda_result r;
    uint32_t count = 0;
    assert_int_equal(rt_wait_finished(alice, id, &count), PAGODA_FINISH_LENGTH);
    assert_int_equal(count, 4);
    assert_int_equal(pagoda_poll(alice, id, 0, 0, &r), 0);
    rt_assert_tokens(a.prompt, 3, r.token_ids, r.num_tokens, 0);
    pagoda_result_free(&r);
    assert_int_equal(rt_wait_finished(bob, id, &count), PAGODA_FINISH_LENGTH);
    assert_int_equal(count, 5);
    assert_int_equal(pagoda_poll(bob, id, 0, 0, &r), 0);
    rt_assert_tokens(b.prompt, 3, r.token_ids, r.num_tokens, 0);
    pagoda_result_free(&r);
    fake_sched_get_counts(e->fs, &after);
    assert_int_equal(after.submits, before.submits + 2);
    pagoda_client_close(alice);
    pagoda_client_close(bob);
}

static void test_tenants_exhausted_keeps_admitted(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *alice = open_tenant_client(e, "alice-key-1");
    pagoda_client *carol = open_tenant_client(e, "carol-key");
    pagoda_client *bob = open_tenant_client(e, "bob-key");
    pagoda_generate_params p = rt_greedy(5);
    int32_t prompts[9][2];
    uint8_t ids[9][16], extra[16];
    fake_sched_hold(e->fs, 1);
    /* carol may hold 2 + 1. */
    for (int i = 0; i < 3; i++) {
        prompts[i][0] = 200 + i;
        prompts[i][1] = 1;
        assert_int_equal(pagoda_submit(carol, &p, prompts[i], 2, ids[i]), 0);
    }
    assert_int_equal(pagoda_submit(carol, &p, prompts[0], 2, extra), PAGODA_EEXHAUSTED);
    assert_non_null(strstr(pagoda_error_detail(), "this tenant"));
    /* Others are not held back by carol's bound: alice fills the global one (9). */
    for (int i = 3; i < 9; i++) {
        prompts[i][0] = 200 + i;
        prompts[i][1] = 2;
        assert_int_equal(pagoda_submit(alice, &p, prompts[i], 2, ids[i]), 0);
    }
    assert_int_equal(pagoda_submit(bob, &p, prompts[0], 2, extra), PAGODA_EEXHAUSTED);
    assert_non_null(strstr(pagoda_error_detail(), "router holds"));
    assert_int_equal(pagoda_submit(alice, &p, prompts[0], 2, extra), PAGODA_EEXHAUSTED);

    /* Every admitted request completes, with its own tokens. */
    fake_sched_hold(e->fs, 0);
    for (int i = 0; i < 9; i++) {
        pagoda_client *c = i < 3 ? carol : alice;
        uint32_t count = 0;
        assert_int_equal(rt_wait_finished(c, ids[i], &count), PAGODA_FINISH_LENGTH);
        assert_int_equal(count, 5);
        pagoda_result r;
        assert_int_equal(pagoda_poll(c, ids[i], 0, 0, &r), 0);
        rt_assert_tokens(prompts[i], 2, r.token_ids, r.num_tokens, 0);
        pagoda_result_free(&r);
    }
    /* And there is room again. */
    pagoda_result r;
    assert_int_equal(pagoda_generate(carol, &p, prompts[0], 2, &r), 0);
    assert_int_equal(r.num_tokens, 5);
    pagoda_result_free(&r);
    pagoda_client_close(alice);
    pagoda_client_close(carol);
    pagoda_client_close(bob);
}

/* kill -9 of the router: the restarted one learns the request from the scheduler's
 * announcement (with a tenants file, under the client's id that the scheduler echoes), so its
 * owner polling by id gets every token with the log-probabilities it asked for (also echoed: an
 * outside probe's whole answers had 0.0 after the kill, and their streams none), and another
 * tenant still gets PAGODA_ENOENT. */
static void test_tenants_router_restart_keeps_requests(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *alice = open_tenant_client(e, "alice-key-2");
    const int32_t prompt[] = {21, 22, 23};
    pagoda_generate_params p = rt_greedy(30);
    uint8_t id[16];
    assert_int_equal(pagoda_submit(alice, &p, prompt, 3, id), 0);
    pagoda_result r;
    assert_int_equal(pagoda_poll(alice, id, 0, 2000, &r), 0);
    assert_true(r.num_tokens > 0);
    pagoda_result_free(&r);
    fake_sched_hold(e->fs, 1);
    struct fake_sched_counts before, after;
    fake_sched_get_counts(e->fs, &before);
    assert_int_equal(rtr_env_restart_router(e), 0);
    pagoda_client *bob = open_tenant_client(e, "bob-key");
    assert_int_equal(pagoda_poll(bob, id, 0, 0, &r), PAGODA_ENOENT);
    fake_sched_get_counts(e->fs, &after);
    assert_int_equal(after.router_hellos, before.router_hellos + 1);
    fake_sched_hold(e->fs, 0);
    int32_t out[30];
    uint32_t have = 0;
    pagoda_finish_reason f = PAGODA_FINISH_NONE;
    for (int i = 0; i < 1000 && f == PAGODA_FINISH_NONE; i++) {
        assert_int_equal(pagoda_poll(alice, id, have, 2000, &r), 0);
        assert_true(have + r.num_tokens <= 30);
        assert_true(r.num_tokens == 0 || r.logprobs != NULL);
        for (size_t k = 0; k < r.num_tokens; k++)
            assert_true(r.logprobs[k] == fake_sched_logprob(have + (uint32_t)k));
        memcpy(out + have, r.token_ids, r.num_tokens * sizeof(int32_t));
        have += (uint32_t)r.num_tokens;
        f = r.finish_reason;
        pagoda_result_free(&r);
    }
    assert_int_equal(f, PAGODA_FINISH_LENGTH);
    assert_int_equal(have, 30);
    for (uint32_t i = 0; i < 30; i++)
        assert_int_equal(out[i], fake_sched_token(prompt, 3, i));
    pagoda_client_close(alice);
    pagoda_client_close(bob);
}

/* A Tokenize call's answer, filled on NNG's thread. */
struct tok_call {
    atomic_int done;
    int rc;
    size_t ids;
    char detail[512];
};

static void on_tok_call(void *user, pagoda_async_result *res)
{
    struct tok_call *t = user;
    t->rc = res->rc;
    t->ids = res->tokenized.num_token_ids;
    snprintf(t->detail, sizeof(t->detail), "%s", res->detail);
    pagoda_async_result_free(res);
    atomic_store(&t->done, 1);
}

/* n Tokenize calls of prompt with key's tenant at once, each answering into calls[i]. */
static void send_tok_calls(pagoda_client *c, const char *key, const pagoda_prompt *prompt,
                           struct tok_call *calls, int n)
{
    for (int i = 0; i < n; i++) {
        atomic_store(&calls[i].done, 0);
        assert_int_equal(pagoda_tokenize_async(c, key, prompt, on_tok_call, &calls[i]), 0);
    }
}

/* Waits (at most a minute) for t's answer. */
static void wait_tok_call(const struct tok_call *t)
{
    for (int waited = 0; !atomic_load(&t->done); waited++) {
        assert_true(waited < 60000);
        nng_msleep(1);
    }
}

/* Health is open to anyone, but one that asks for its key to be checked (check_key: the gateway's
 * GET /v1/models) is refused as a Submit is for a key a Submit could not use, and answered for a
 * tenant's. */
static void test_tenants_health_checks_key_when_asked(void **state)
{
    struct rtr_env *e = *state;
    pagoda_client *c = rt_open_client(e);
    const char *keys[] = {NULL, "", "nobody", "alice-key-3", "alice-key-1", "bob-key"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
        const int good = i >= 4;
        struct tok_call t = {0};
        assert_int_equal(pagoda_health_key_async(c, keys[i], on_tok_call, &t), 0);
        wait_tok_call(&t);
        assert_int_equal(t.rc, good ? 0 : PAGODA_EPERM);
        if (!good)
            assert_non_null(strstr(t.detail, "unknown API key"));
        atomic_store(&t.done, 0);
        assert_int_equal(pagoda_health_async(c, on_tok_call, &t), 0); /* no check: anyone */
        wait_tok_call(&t);
        assert_int_equal(t.rc, 0);
    }
    pagoda_client_close(c);
}

/* Tokenize calls are bounded by tenant, in bytes and in calls: one tenant holds at most
 * ROUTER_MAX_TENANT_TEXT_CALL_BYTES (a quarter of ROUTER_MAX_TEXT_CALL_BYTES, all tenants'), so
 * that its burst of big calls is refused (PAGODA_EBUSY) where it would have taken every tenant's
 * bytes and refused another tenant's call. Prompts of up to a million tokens make 4 MB calls
 * possible; twenty of alice's are sent at once (each tokenized for hundreds of milliseconds,
 * one at a time), then, once one of them has been refused, one of bob's, which is answered. Each
 * refusal of alice's says she held her share while all tenants' bytes had room. Without the
 * tenant's bound alice's calls are refused only when all 64 MB are held, and bob's call too if none
 * ended meanwhile. Then bob's burst of 64 small calls meets the count of calls a tenant may
 * have waiting (ROUTER_MAX_TENANT_TEXT_CALLS). */
static void test_tokenize_calls_are_bounded_by_tenant(void **state)
{
    (void)state;
    static const char tenants[] =
        "{\"tenants\": [{\"name\": \"alice\", \"api_keys\": [\"alice-key\"]},"
        " {\"name\": \"bob\", \"api_keys\": [\"bob-key\"]}]}";
    char path[64];
    assert_int_equal(write_tenants_file(path, tenants), 0);
    const char *const args[] = {
        "--tenants",           path,      "--model", PAGODA_SOURCE_DIR "/tests/data/tiny-text",
        "--max-prompt-tokens", "1000000", NULL};
    /* One thread tokenizes (libuv's pool): alice's calls end one after another, so that they
     * pile up whatever the machine's cores and speed. */
    struct rtr_env env, *e = &env;
    assert_int_equal(setenv("UV_THREADPOOL_SIZE", "1", 1), 0);
    assert_int_equal(rtr_env_start(e, args), 0);
    unsetenv("UV_THREADPOOL_SIZE");
    enum { CALLS = 20, TEXT_BYTES = 4000000 };
    char *text = malloc(TEXT_BYTES + 1);
    assert_non_null(text);
    static const char words[] = "the router tokenizes this text ";
    for (size_t i = 0; i < TEXT_BYTES; i++)
        text[i] = words[i % (sizeof(words) - 1)];
    text[TEXT_BYTES] = '\0';
    pagoda_client *a = open_tenant_client(e, "alice-key"), *b = open_tenant_client(e, "bob-key");
    pagoda_client_set_timeout_ms(a, 60000);
    pagoda_client_set_timeout_ms(b, 60000);
    int healthy;
    assert_int_equal(pagoda_health(a, &healthy), 0); /* a reply: the message limit is known */
    assert_int_equal(pagoda_health(b, &healthy), 0);
    pagoda_prompt pr = pagoda_prompt_default();
    pr.text = text;
    static struct tok_call calls[CALLS];
    send_tok_calls(a, "alice-key", &pr, calls, CALLS);
    /* Bob's call once one of alice's has been refused (or all of hers have ended). */
    for (int waited = 0;; waited++) {
        int ended = 0, refused = 0;
        for (int i = 0; i < CALLS; i++)
            if (atomic_load(&calls[i].done)) {
                ended++;
                refused += calls[i].rc == PAGODA_EBUSY;
            }
        if (refused > 0 || ended == CALLS)
            break;
        assert_true(waited < 60000);
        nng_msleep(1);
    }
    pagoda_tokenized tk;
    int rc = pagoda_tokenize(b, &pr, &tk);
    if (rc != 0)
        fail_msg("bob's call beside alice's burst: %d %s", rc, pagoda_error_detail());
    assert_true(tk.num_token_ids > TEXT_BYTES / 8);
    size_t bob_ids = tk.num_token_ids;
    pagoda_tokenized_free(&tk);
    int accepted = 0, refused = 0;
    for (int i = 0; i < CALLS; i++) {
        wait_tok_call(&calls[i]);
        if (calls[i].rc == 0) {
            assert_int_equal(calls[i].ids, bob_ids);
            accepted++;
            continue;
        }
        /* Refused by the tenant's bound, with room left in all tenants' bytes. */
        size_t held = 0, tenant_max = 0, all = 0, all_max = 0, call = 0;
        const char *d = strstr(calls[i].detail, "calls hold ");
        if (calls[i].rc != PAGODA_EBUSY || d == NULL ||
            sscanf(d, "calls hold %zu of %zu; all tenants' %zu of %zu; this call's: %zu", &held,
                   &tenant_max, &all, &all_max, &call) != 5 ||
            tenant_max != ROUTER_MAX_TENANT_TEXT_CALL_BYTES || held + call <= tenant_max ||
            all + call > all_max)
            fail_msg("alice's call %d: %d %s", i, calls[i].rc, calls[i].detail);
        refused++;
    }
    print_message("alice's burst of %d: %d accepted, %d refused; bob's call answered\n", CALLS,
                  accepted, refused);
    assert_true(accepted >= 4 && refused >= 1);
    /* The tenant's count of calls waiting binds before its bytes: 64 calls of 200 kB of bob's at
     * once (12.8 MB, under his 16 MiB), one tokenized at a time (a call takes about ten times as
     * long to tokenize as to arrive): past ROUTER_MAX_TENANT_TEXT_CALLS waiting, a call is
     * refused, saying so. */
    enum { SMALL_CALLS = 64, SMALL_BYTES = 200000 };
    static struct tok_call small[SMALL_CALLS];
    text[SMALL_BYTES] = '\0';
    send_tok_calls(b, "bob-key", &pr, small, SMALL_CALLS);
    int small_ok = 0, small_refused = 0;
    char want[96];
    snprintf(want, sizeof(want), "this tenant's Tokenize calls: %u of %u",
             ROUTER_MAX_TENANT_TEXT_CALLS, ROUTER_MAX_TENANT_TEXT_CALLS);
    for (int i = 0; i < SMALL_CALLS; i++) {
        wait_tok_call(&small[i]);
        if (small[i].rc == 0) {
            small_ok++;
        } else {
            if (small[i].rc != PAGODA_EBUSY || strstr(small[i].detail, want) == NULL)
                fail_msg("bob's call %d: %d %s", i, small[i].rc, small[i].detail);
            small_refused++;
        }
    }
    print_message("bob's burst of %d: %d accepted, %d refused\n", SMALL_CALLS, small_ok,
                  small_refused);
    assert_true(small_ok >= (int)ROUTER_MAX_TENANT_TEXT_CALLS && small_refused >= 1);
    free(text);
    pagoda_client_close(a);
    pagoda_client_close(b);
    unlink(path);
    assert_int_equal(rtr_env_stop(e), 0);
}

/* Generates prompt (greedy, 2 tokens) and returns the finish; *why the error message or "". */
static pagoda_finish_reason generate_text(pagoda_client *c, const pagoda_prompt *prompt, char *why,
                                          size_t why_len)
{
    pagoda_generate_params p = rt_greedy(2);
    pagoda_result res;
    int rc = pagoda_generate_prompt(c, &p, prompt, NULL, NULL, &res);
    if (rc != 0)
        fail_msg("generate: %d %s", rc, pagoda_error_detail());
    snprintf(why, why_len, "%s", res.error_message ? res.error_message : "");
    pagoda_finish_reason f = res.finish_reason;
    pagoda_result_free(&res);
    return f;
}

/* A text or a chat longer than the prompt limit's worth of the tokenizer's longest tokens
 * (tokenizer_max_bytes_per_token) ends with the over-limit error before it is encoded: the error
 * gives no count of tokens but the bound, where an encoded prompt's gives its count. Prompts at
 * exactly the limit are served, one token more is refused as before, and a Tokenize call of the
 * long text is not held to the prompt limit. */
static void test_text_past_the_limit_is_refused_unencoded(void **state)
{
    (void)state;
    enum { LIMIT = 64 };
    const char *const args[] = {"--model", PAGODA_SOURCE_DIR "/tests/data/tiny-text",
                                "--max-prompt-tokens", "64", NULL};
    struct rtr_env env, *e = &env;
    assert_int_equal(rtr_env_start(e, args), 0);
    pagoda_client *c = rt_open_client(e);
    int healthy;
    assert_int_equal(pagoda_health(c, &healthy), 0); /* a reply: the message limit is known */
    char why[512], text[8192] = "";
    pagoda_prompt pr = pagoda_prompt_default();
    pr.text = text;
    /* A text of LIMIT tokens, then of LIMIT + 1, a byte at a time (the count is the router's,
     * BOS included). */
    static const char words[] = " hello world, the router tokenizes";
    size_t len = 0;
    for (size_t want = LIMIT; want <= LIMIT + 1; want++) {
        size_t ids = 0;
        while (ids < want) {
            text[len] = words[len % (sizeof(words) - 1)];
            text[++len] = '\0';
            pagoda_tokenized tk;
            assert_int_equal(pagoda_tokenize(c, &pr, &tk), 0);
            ids = tk.num_token_ids;
            pagoda_tokenized_free(&tk);
        }
        assert_int_equal(ids, want);
        pagoda_finish_reason f = generate_text(c, &pr, why, sizeof(why));
        assert_int_equal(f, want == LIMIT ? PAGODA_FINISH_LENGTH : PAGODA_FINISH_ERROR);
    }
    assert_non_null(strstr(why, "the prompt has 65 tokens, more than the limit of 64"));
    /* 6,000 bytes: past 64 times the bytes of tiny-text's longest token (19). */
    text[0] = '\0';
    for (int i = 0; i < 500; i++)
        strcat(text, "hello world ");
    assert_int_equal(generate_text(c, &pr, why, sizeof(why)), PAGODA_FINISH_ERROR);
    if (strstr(why, "the prompt has more tokens than the limit of 64: its 6000 bytes") == NULL)
        fail_msg("the long text: %s", why);
    /* A chat whose rendering is as long. */
    pagoda_chat_message msg = {.role = "user", .content = text};
    pagoda_prompt chat = pagoda_prompt_default();
    chat.messages = &msg;
    chat.num_messages = 1;
    assert_int_equal(generate_text(c, &chat, why, sizeof(why)), PAGODA_FINISH_ERROR);
    if (strstr(why, "the prompt has more tokens than the limit of 64: its ") == NULL)
        fail_msg("the long chat: %s", why);
    /* /tokenize counts it all. */
    pagoda_tokenized tk;
    assert_int_equal(pagoda_tokenize(c, &pr, &tk), 0);
    assert_true(tk.num_token_ids > 2 * LIMIT);
    pagoda_tokenized_free(&tk);
    pagoda_client_close(c);
    assert_int_equal(rtr_env_stop(e), 0);
}

/* The ids of pr through the router, into *out (the caller frees). */
static void tokenize_ok(pagoda_client *c, const pagoda_prompt *pr, pagoda_tokenized *out)
{
    if (pagoda_tokenize(c, pr, out) != 0)
        fail_msg("tokenize: %s", pagoda_error_detail());
}

/* continue_final_message through libpagoda and the router: the chat is rendered (tiny-text's
 * template, which trims contents) and cut after the final message's content, transformers'
 * apply_chat_template(continue_final_message=True): the ids of that text, where the same chat
 * without it ends the assistant's turn. With add_generation_prompt (its default) or without a
 * chat it is refused. */
static void test_chat_continue_final_message(void **state)
{
    (void)state;
    const char *const args[] = {"--model", PAGODA_SOURCE_DIR "/tests/data/tiny-text", NULL};
    struct rtr_env env, *e = &env;
    assert_int_equal(rtr_env_start(e, args), 0);
    pagoda_client *c = rt_open_client(e);
    const pagoda_chat_message msgs[] = {{.role = "user", .content = "q"},
                                        {.role = "assistant", .content = "The answer is "}};
    pagoda_prompt chat = pagoda_prompt_default();
    chat.messages = msgs;
    chat.num_messages = 2;
    chat.add_generation_prompt = 0;
    chat.continue_final_message = 1;
    pagoda_prompt text = pagoda_prompt_default();
    text.text = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nq<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nThe answer is";
    text.add_special_tokens = 0;
    pagoda_tokenized got, want, ended;
    tokenize_ok(c, &chat, &got);
    tokenize_ok(c, &text, &want);
    assert_int_equal(got.num_token_ids, want.num_token_ids);
    assert_memory_equal(got.token_ids, want.token_ids, want.num_token_ids * sizeof(int32_t));
    chat.continue_final_message = 0;
    tokenize_ok(c, &chat, &ended); /* ... The answer is<|eot_id|> */
    assert_int_equal(ended.num_token_ids, want.num_token_ids + 1);
    pagoda_tokenized_free(&got);
    pagoda_tokenized_free(&want);
    pagoda_tokenized_free(&ended);

    chat.continue_final_message = 1;
    chat.add_generation_prompt = 1;
    assert_int_equal(pagoda_tokenize(c, &chat, &got), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "cannot both be true"));
    char why[512];
    assert_int_equal(generate_text(c, &chat, why, sizeof(why)), PAGODA_FINISH_ERROR);
    assert_non_null(strstr(why, "cannot both be true"));
    pagoda_prompt cont_text = pagoda_prompt_default();
    cont_text.text = "hi";
    cont_text.continue_final_message = 1;
    assert_int_equal(pagoda_tokenize(c, &cont_text, &got), PAGODA_EINVAL);
    assert_non_null(strstr(pagoda_error_detail(), "go with messages"));
    pagoda_client_close(c);
    assert_int_equal(rtr_env_stop(e), 0);
}

int main(void)
{
    const struct CMUnitTest tenants[] = {
        cmocka_unit_test(test_tenants_file_errors_name_the_field),
        cmocka_unit_test(test_tenants_file_max_finished),
        cmocka_unit_test(test_tenants_load_refuses_what_is_not_a_file),
        cmocka_unit_test(test_tenants_file_groups_pins_admin_keys),
        cmocka_unit_test(test_tenants_unknown_key_is_refused),
        cmocka_unit_test(test_tenants_health_checks_key_when_asked),
        cmocka_unit_test(test_tenants_other_tenants_id_is_enoent),
        cmocka_unit_test(test_tenants_dedup_is_per_tenant),
        cmocka_unit_test(test_tenants_exhausted_keeps_admitted),
        cmocka_unit_test(test_tenants_router_restart_keeps_requests),
    };
    const struct CMUnitTest own[] = {
        cmocka_unit_test(test_tokenize_calls_are_bounded_by_tenant),
        cmocka_unit_test(test_text_past_the_limit_is_refused_unencoded),
        cmocka_unit_test(test_chat_continue_final_message),
    };
    signal(SIGPIPE, SIG_IGN);
    int failed =
        cmocka_run_group_tests_name("router tenants", tenants, tenants_setup, tenants_teardown);
    failed += cmocka_run_group_tests_name("router tenants, processes", own, NULL, NULL);
    nng_fini();
    return failed;
}
