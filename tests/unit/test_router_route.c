/* Tests of router/route.h: the routing decision (longest cached prefix, the busy threshold, the
 * least loaded, round robin), namespaces kept apart, the LRU bound, and the choice when an engine
 * goes down. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/error.h"
#include "router/route.h"

#include <string.h>

#define BT 4u /* tokens a chunk in these tests */

static struct route *make(uint32_t engines, enum route_mode mode, uint32_t max_entries)
{
    struct route *rt = NULL;
    assert_int_equal(route_new(engines, mode, max_entries, 42, &rt), 0);
    route_set_block_tokens(rt, BT);
    for (uint32_t e = 0; e < engines; e++)
        route_set_up(rt, e, 1);
    return rt;
}

/* A prompt of n tokens: a shared head of `shared` tokens (value base) then distinct ones. */
static void fill(int32_t *p, uint32_t n, int32_t base, uint32_t shared, int32_t tail)
{
    for (uint32_t i = 0; i < n; i++)
        p[i] = i < shared ? base + (int32_t)i : tail * 1000 + (int32_t)i;
}

static void test_config_refused(void **state)
{
    (void)state;
    struct route *rt = NULL;
    assert_int_equal(route_new(0, ROUTE_CACHE_AWARE, 16, 1, &rt), PAGODA_EINVAL);
    assert_int_equal(route_new(ROUTE_MAX_ENGINES + 1, ROUTE_CACHE_AWARE, 16, 1, &rt),
                     PAGODA_EINVAL);
    assert_int_equal(route_new(2, ROUTE_CACHE_AWARE, 0, 1, &rt), PAGODA_EINVAL);
    enum route_mode m;
    assert_int_equal(route_mode_parse("cache-aware", &m), 0);
    assert_int_equal(m, ROUTE_CACHE_AWARE);
    assert_int_equal(route_mode_parse("round-robin", &m), 0);
    assert_int_equal(m, ROUTE_ROUND_ROBIN);
    assert_int_equal(route_mode_parse("random", &m), PAGODA_EINVAL);
    assert_string_equal(route_mode_name(ROUTE_ROUND_ROBIN), "round-robin");
}

/* No engine up: nothing is chosen and nothing is counted. */
static void test_none_up(void **state)
{
    (void)state;
    struct route *rt = NULL;
    assert_int_equal(route_new(2, ROUTE_CACHE_AWARE, 16, 1, &rt), 0);
    int32_t p[8] = {0};
    assert_int_equal(route_pick(rt, "t:a", p, 8, ROUTE_NONE, NULL), ROUTE_NONE);
    assert_int_equal(route_load(rt, 0) + route_load(rt, 1), 0);
    route_free(rt);
}

/* Distinct prompts spread over the engines (each pick loads its engine); a prompt sharing a
 * prefix goes where that prefix went, and the longest match wins over a shorter one. */
static void test_longest_prefix_wins(void **state)
{
    (void)state;
    struct route *rt = make(3, ROUTE_CACHE_AWARE, 1024);
    int32_t p[32];
    uint32_t seen[3] = {0}, m;
    for (int32_t k = 0; k < 3; k++) {
        fill(p, 32, 100000 * (k + 1), 0, k);
        uint32_t e = route_pick(rt, "t:a", p, 32, ROUTE_NONE, &m);
        assert_true(e < 3);
        assert_int_equal(m, 0);
        seen[e]++;
    }
    assert_int_equal(seen[0], 1);
    assert_int_equal(seen[1], 1);
    assert_int_equal(seen[2], 1);

    /* Engine a holds 2 chunks of prefix P (8 tokens); engine b holds 5 (20 tokens). */
    fill(p, 8, 7, 8, 0);
    uint32_t a = route_pick(rt, "t:a", p, 8, ROUTE_NONE, NULL);
    int32_t q[20];
    fill(q, 20, 7, 20, 0);
    uint32_t b = route_pick(rt, "t:a", q, 20, a, NULL); /* forced elsewhere */
    assert_int_not_equal(a, b);
    /* A prompt with 20 tokens of P then others: b has the longest match. */
    int32_t r[40];
    fill(r, 40, 7, 20, 9);
    assert_int_equal(route_matched(rt, a, "t:a", r, 40), 2);
    assert_int_equal(route_matched(rt, b, "t:a", r, 40), 5);
    assert_int_equal(route_pick(rt, "t:a", r, 40, ROUTE_NONE, &m), b);
    assert_int_equal(m, 5);
    /* A prompt sharing only the first 8 tokens of P: a and b both match 2 chunks; the less
     * loaded of them wins. */
    fill(r, 40, 7, 8, 10);
    route_set_engine_load(rt, b, 5);
    assert_int_equal(route_pick(rt, "t:a", r, 40, ROUTE_NONE, &m), a);
    assert_int_equal(m, 2);
    route_free(rt);
}

/* The engine with the prefix is skipped only when it is much busier than the least loaded one:
 * both margins (absolute and relative) must be exceeded. */
static void test_busy_threshold(void **state)
{
    (void)state;
    struct route *rt = make(2, ROUTE_CACHE_AWARE, 1024);
    int32_t p[16];
    fill(p, 16, 5, 16, 0);
    uint32_t a = route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL);
    uint32_t other = 1 - a;
    route_release(rt, a);
    /* Busier, but within the absolute margin: the prefix wins. */
    route_set_engine_load(rt, a, ROUTE_BUSY_ABS);
    route_set_engine_load(rt, other, 0);
    assert_int_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL), a);
    route_release(rt, a);
    /* Past the absolute margin but within the relative one: still the prefix. */
    route_set_engine_load(rt, other, 100);
    route_set_engine_load(rt, a, 100 + ROUTE_BUSY_ABS + 1);
    assert_int_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL), a);
    route_release(rt, a);
    /* Past both: the least loaded. */
    route_set_engine_load(rt, other, 10);
    route_set_engine_load(rt, a, 10 + ROUTE_BUSY_ABS + 1);
    uint32_t m = 99;
    assert_int_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, &m), other);
    assert_int_equal(m, 0);
    /* The router's own unfinished requests count as load too. */
    route_set_engine_load(rt, other, 0);
    route_set_engine_load(rt, a, 0);
    route_release(rt, other);
    for (uint32_t i = 0; i < ROUTE_BUSY_ABS + 1; i++)
        route_pick(rt, "t:b", p, 3, a == 0 ? 1 : 0, NULL); /* short: no chunk, onto a */
    assert_int_equal(route_load(rt, a), ROUTE_BUSY_ABS + 1);
    assert_int_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL), other);
    route_free(rt);
}

/* The stats' running + waiting count the router's own requests too: the load is the larger of
 * the two figures, not their sum, so that the busy margins are not halved. An engine holding a
 * group's prefix with its 20 requests in flight (and its stats saying so) keeps the group's next
 * request while the other engine is idle. */
static void test_load_not_counted_twice(void **state)
{
    (void)state;
    struct route *rt = make(2, ROUTE_CACHE_AWARE, 1024);
    int32_t p[16];
    fill(p, 16, 1, 16, 0);
    uint32_t a = route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL);
    uint32_t other = 1 - a;
    for (uint32_t i = 1; i < 20; i++)
        assert_int_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL), a);
    route_set_engine_load(rt, a, 20);
    route_set_engine_load(rt, other, 0);
    assert_int_equal(route_load(rt, a), 20);
    assert_int_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL), a);
    /* The stats' figure beyond the router's requests (requests the router did not send) stays,
     * and the router's next requests add to it. */
    route_set_engine_load(rt, a, 500);
    assert_int_equal(route_load(rt, a), 500);
    assert_int_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL), other);
    route_set_engine_load(rt, other, 50);
    for (uint32_t i = 0; i < 20; i++)
        route_pick(rt, "t:b", p, 3, a, NULL); /* short: no chunk, onto other */
    assert_int_equal(route_load(rt, other), 70);
    route_free(rt);
}

/* A prefix seen in one namespace never attracts a request of another. */
static void test_namespaces_isolated(void **state)
{
    (void)state;
    struct route *rt = make(2, ROUTE_CACHE_AWARE, 1024);
    int32_t p[16];
    fill(p, 16, 5, 16, 0);
    uint32_t a = route_pick(rt, "t:alice", p, 16, ROUTE_NONE, NULL);
    assert_int_equal(route_matched(rt, a, "t:alice", p, 16), 4);
    assert_int_equal(route_matched(rt, a, "t:bob", p, 16), 0);
    /* Bob's identical prompt goes to the least loaded (the other engine), not to a. */
    uint32_t m = 99;
    assert_int_equal(route_pick(rt, "t:bob", p, 16, ROUTE_NONE, &m), 1 - a);
    assert_int_equal(m, 0);
    /* Tenants of one group share its namespace, and its prefixes. */
    uint32_t g = route_pick(rt, "g:team", p, 16, ROUTE_NONE, NULL);
    assert_int_equal(route_pick(rt, "g:team", p, 16, ROUTE_NONE, &m), g);
    assert_int_equal(m, 4);
    route_free(rt);
}

/* An engine remembers at most max_entries keys; the least recently used go first, and the
 * shorter prefixes of a prompt outlive its longer ones. */
static void test_lru_bound(void **state)
{
    (void)state;
    struct route *rt = make(1, ROUTE_CACHE_AWARE, 8);
    int32_t p[24], q[24];
    fill(p, 24, 1, 24, 0); /* 6 chunks */
    fill(q, 24, 500, 24, 0);
    route_pick(rt, "t:a", p, 24, ROUTE_NONE, NULL);
    assert_int_equal(route_entries(rt, 0), 6);
    route_pick(rt, "t:a", q, 24, ROUTE_NONE, NULL);
    assert_int_equal(route_entries(rt, 0), 8);
    /* q is whole; p kept its first two chunks (its leaves went first). */
    assert_int_equal(route_matched(rt, 0, "t:a", q, 24), 6);
    assert_int_equal(route_matched(rt, 0, "t:a", p, 24), 2);
    for (int32_t k = 0; k < 50; k++) {
        fill(p, 24, 10000 * (k + 2), 24, 0);
        route_pick(rt, "t:a", p, 24, ROUTE_NONE, NULL);
        assert_true(route_entries(rt, 0) <= 8);
    }
    assert_int_equal(route_matched(rt, 0, "t:a", q, 24), 0);
    route_free(rt);
}

/* Round robin: every up engine in turn, whatever the prompt. */
static void test_round_robin(void **state)
{
    (void)state;
    struct route *rt = make(3, ROUTE_ROUND_ROBIN, 64);
    int32_t p[16];
    fill(p, 16, 5, 16, 0);
    uint32_t first = route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL);
    for (uint32_t i = 1; i < 7; i++)
        assert_int_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL), (first + i) % 3);
    route_set_up(rt, 1, 0);
    for (uint32_t i = 0; i < 6; i++)
        assert_int_not_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL), 1);
    route_free(rt);
}

/* Failover: a down engine is never chosen and forgets its prefixes; the request moving away from
 * an engine (avoid) goes to another; when the engine comes back it takes new work again. */
static void test_failover_choice(void **state)
{
    (void)state;
    struct route *rt = make(3, ROUTE_CACHE_AWARE, 64);
    int32_t p[16];
    fill(p, 16, 5, 16, 0);
    uint32_t a = route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL);
    route_set_up(rt, a, 0);
    assert_false(route_is_up(rt, a));
    assert_int_equal(route_entries(rt, a), 0);
    for (int i = 0; i < 6; i++) {
        uint32_t e = route_pick(rt, "t:a", p, 16, a, NULL);
        assert_true(e < 3);
        assert_int_not_equal(e, a);
    }
    /* Only the avoided engine up: nothing. */
    route_set_up(rt, a, 1);
    for (uint32_t e = 0; e < 3; e++)
        if (e != a)
            route_set_up(rt, e, 0);
    assert_int_equal(route_pick(rt, "t:a", p, 16, a, NULL), ROUTE_NONE);
    /* Back: it takes new work (the others are down). */
    assert_int_equal(route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL), a);
    /* And with everyone back, the least loaded takes a fresh prompt. */
    for (uint32_t e = 0; e < 3; e++)
        route_set_up(rt, e, 1);
    int32_t q[16];
    fill(q, 16, 900, 16, 0);
    assert_int_not_equal(route_pick(rt, "t:a", q, 16, ROUTE_NONE, NULL), a);
    route_free(rt);
}

/* A new block size forgets what was remembered under the old one. */
static void test_block_size_change(void **state)
{
    (void)state;
    struct route *rt = make(1, ROUTE_CACHE_AWARE, 64);
    int32_t p[16];
    fill(p, 16, 5, 16, 0);
    route_pick(rt, "t:a", p, 16, ROUTE_NONE, NULL);
    assert_int_equal(route_matched(rt, 0, "t:a", p, 16), 4);
    route_set_block_tokens(rt, 8);
    assert_int_equal(route_entries(rt, 0), 0);
    assert_int_equal(route_matched(rt, 0, "t:a", p, 16), 0);
    route_free(rt);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_config_refused),      cmocka_unit_test(test_none_up),
        cmocka_unit_test(test_longest_prefix_wins), cmocka_unit_test(test_busy_threshold),
        cmocka_unit_test(test_namespaces_isolated), cmocka_unit_test(test_lru_bound),
        cmocka_unit_test(test_round_robin),         cmocka_unit_test(test_failover_choice),
        cmocka_unit_test(test_block_size_change),   cmocka_unit_test(test_load_not_counted_twice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
