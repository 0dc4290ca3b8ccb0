/* Tests of router/router_link.c's flush on its own, in process: a link whose buffer is full is
 * tried once per pass, not once per pending request (each try packs a whole SubmitSeq). The
 * router is the bare minimum router_flush_pending reads: one engine, linked, on a PAIR socket
 * with no peer, so that its send buffer fills and stays full. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "router/router_internal.h"

#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>

#include <stdlib.h>
#include <string.h>

/* Messages the link's buffer holds, and requests waiting: more than it holds. */
#define BUFFER 4
#define PENDING 64
#define PROMPT_TOKENS 512

struct harness {
    struct router r;
    struct engine e;
    struct tenant_slot slot;
    struct request q[PENDING];
    int32_t prompt[PROMPT_TOKENS];
};

static void harness_init(struct harness *h)
{
    memset(h, 0, sizeof(*h));
    struct router *r = &h->r;
    struct engine *e = &h->e;
    assert_int_equal(nng_pair1_open(&e->link), 0);
    assert_int_equal(nng_socket_set_int(e->link, NNG_OPT_SENDBUF, BUFFER), 0);
    e->link_open = 1;
    e->r = r;
    atomic_store(&e->pipes, 1); /* as if a scheduler were there: the loop sees it linked */
    atomic_store(&e->gen, 1);
    e->gen_seen = 1;
    e->up = 1;
    r->engines = e;
    r->num_engines = 1;
    assert_int_equal(route_new(1, ROUTE_CACHE_AWARE, 64, 1, &r->route), 0);
    route_set_up(r->route, 0, 1);
    snprintf(h->slot.name, sizeof(h->slot.name), "default");
    r->slots = &h->slot;
    r->num_slots = 1;
    for (int i = 0; i < PROMPT_TOKENS; i++)
        h->prompt[i] = 1 + i;
    for (int i = 0; i < PENDING; i++) {
        struct request *q = &h->q[i];
        q->id[0] = q->sched_id[0] = (uint8_t)i;
        q->engine = ROUTE_NONE;
        q->prompt = h->prompt;
        q->p.prompt = h->prompt;
        q->p.num_prompt = PROMPT_TOKENS;
        q->p.max_tokens = 4;
        q->next = i + 1 < PENDING ? &h->q[i + 1] : NULL;
        registry_set_pending(r, q, &q->need_submit, 1);
    }
    r->live.head = &h->q[0];
    r->live.tail = &h->q[PENDING - 1];
    r->live.count = PENDING;
}

static void harness_fini(struct harness *h)
{
    nng_close(h->e.link);
    route_free(h->r.route);
}

/* The buffer takes BUFFER submits; the next one is refused, and that ends the pass for this
 * engine: one refusal per pass (it used to be one per pending request, PENDING - BUFFER). */
static void test_full_link_tried_once_per_pass(void **state)
{
    (void)state;
    struct harness *h = malloc(sizeof(*h));
    assert_non_null(h);
    harness_init(h);
    router_flush_pending(&h->r);
    uint32_t sent = PENDING - h->r.num_pending;
    assert_true(sent >= 1 && sent < PENDING); /* the buffer filled */
    assert_int_equal(h->e.sends_refused, 1);
    router_flush_pending(&h->r);
    assert_int_equal(PENDING - h->r.num_pending, sent); /* still full: nothing more went */
    assert_int_equal(h->e.sends_refused, 2);
    harness_fini(h);
    free(h);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_link_tried_once_per_pass),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
