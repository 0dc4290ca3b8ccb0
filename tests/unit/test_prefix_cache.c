/* Tests of the prefix cache: scheduler/prefix_cache.c on its own (keys, LRU order, quotas, pins,
 * flushes), and in the scheduler with the fake worker of scheduler_harness.c, whose outputs
 * are a hash of what its fake pool holds, so a hit that served wrong KV changes the output:
 * hits and cached_tokens, isolation between tenants, sharing groups, pinned public prefixes,
 * quotas under pressure, chunked prefill beside decodes, preemption, and a randomized run of
 * 100,000 operations that checks the block invariants after each. */
#include "scheduler_harness.h"

#include "scheduler/prefix_cache.h"

/* ---- the cache on its own ------------------------------------------------------------------- */

#define BS 4

struct pc_fixture {
    struct block_manager *bm;
    struct prefix_cache *pc;
};

static void pcf_open(struct pc_fixture *f, int32_t num_blocks)
{
    uint8_t secret[PREFIX_CACHE_SECRET_BYTES];
    for (size_t i = 0; i < sizeof(secret); i++)
        secret[i] = (uint8_t)(i * 31 + 7);
    assert_int_equal(block_manager_open(num_blocks, &f->bm), 0);
    assert_int_equal(prefix_cache_open(f->bm, BS, secret, &f->pc), 0);
    assert_int_equal(prefix_cache_set_root(f->pc, "model", 5, 2), 0);
}

static void pcf_check(struct pc_fixture *f)
{
    int32_t n = block_manager_usable(f->bm) + 1;
    int32_t *refs = calloc((size_t)n, sizeof(int32_t));
    const char *why = NULL;
    assert_non_null(refs);
    if (prefix_cache_check(f->pc, refs, n, &why) != 0)
        fail_msg("prefix cache: %s", why);
    if (block_manager_check(f->bm, &why) != 0)
        fail_msg("block manager: %s", why);
    free(refs);
}

static void pcf_close(struct pc_fixture *f)
{
    prefix_cache_close(f->pc);
    block_manager_close(f->bm);
}

/* Inserts a chain of n blocks of tokens (n * BS) into ns, each block allocated and then
 * released by its "sequence" from the tail, as the scheduler does. Returns the last entry. */
static void insert_chain(struct pc_fixture *f, struct pc_namespace *ns, const int32_t *tokens,
                         int n, struct pc_entry **out)
{
    struct pc_key parent = prefix_cache_root(f->pc);
    struct pc_entry *up = NULL;
    for (int i = 0; i < n; i++) {
        int32_t b;
        assert_int_equal(block_manager_alloc(f->bm, &b), 0);
        struct pc_key k = prefix_cache_key(f->pc, ns, parent, tokens + i * BS);
        out[i] = prefix_cache_insert(f->pc, ns, up, k, parent, tokens + i * BS, b);
        assert_non_null(out[i]);
        up = out[i];
        parent = k;
    }
    for (int i = n - 1; i >= 0; i--) {
        int32_t b = prefix_cache_entry_block(out[i]);
        prefix_cache_release(f->pc, out[i]);
        assert_int_equal(block_manager_unref(f->bm, b), 0);
    }
}

/* Keys depend on the namespace, the parent and the tokens; a lookup also compares the tokens
 * and the parent, and finds nothing in another namespace. */
static void test_keys_and_namespaces(void **state)
{
    (void)state;
    struct pc_fixture f;
    pcf_open(&f, 32);
    struct pc_namespace *a = prefix_cache_namespace(f.pc, "t:a");
    struct pc_namespace *b = prefix_cache_namespace(f.pc, "t:b");
    assert_ptr_equal(prefix_cache_namespace(f.pc, "t:a"), a);
    int32_t tok[BS] = {1, 2, 3, 4}, other[BS] = {1, 2, 3, 5};
    struct pc_key root = prefix_cache_root(f.pc);
    struct pc_key ka = prefix_cache_key(f.pc, a, root, tok);
    struct pc_key kb = prefix_cache_key(f.pc, b, root, tok);
    struct pc_key ko = prefix_cache_key(f.pc, a, root, other);
    struct pc_key kp = prefix_cache_key(f.pc, a, ka, tok);
    assert_false(ka.lo == kb.lo && ka.hi == kb.hi);
    assert_false(ka.lo == ko.lo && ka.hi == ko.hi);
    assert_false(ka.lo == kp.lo && ka.hi == kp.hi);
    struct pc_entry *e[1];
    insert_chain(&f, a, tok, 1, e);
    assert_ptr_equal(prefix_cache_lookup(f.pc, a, ka, root, tok), e[0]);
    assert_null(prefix_cache_lookup(f.pc, b, ka, root, tok));   /* another namespace */
    assert_null(prefix_cache_lookup(f.pc, b, kb, root, tok));   /* its own key: nothing */
    assert_null(prefix_cache_lookup(f.pc, a, ka, root, other)); /* same key, other tokens */
    assert_null(prefix_cache_lookup(f.pc, a, ka, ka, tok));     /* same key, other parent */
    /* A second insert of the same key is refused (the caller keeps its block private). */
    int32_t blk;
    assert_int_equal(block_manager_alloc(f.bm, &blk), 0);
    assert_null(prefix_cache_insert(f.pc, a, NULL, ka, root, tok, blk));
    assert_int_equal(block_manager_unref(f.bm, blk), 0);
    /* A new root (another model) flushes everything. */
    assert_int_equal(prefix_cache_set_root(f.pc, "model2", 6, 2), 1);
    assert_null(prefix_cache_lookup(f.pc, a, ka, root, tok));
    assert_int_equal(prefix_cache_cached_blocks(f.pc), 0);
    assert_int_equal(block_manager_free_count(f.bm), 31);
    pcf_check(&f);
    pcf_close(&f);
}

/* Unused entries are evicted leaves first, oldest first; a used or pinned one never. */
static void test_lru_leaves_first_and_pins(void **state)
{
    (void)state;
    struct pc_fixture f;
    pcf_open(&f, 32);
    struct pc_namespace *ns = prefix_cache_namespace(f.pc, "t:a");
    int32_t t1[3 * BS], t2[2 * BS];
    for (int i = 0; i < 3 * BS; i++)
        t1[i] = 10 + i;
    for (int i = 0; i < 2 * BS; i++)
        t2[i] = 100 + i;
    struct pc_entry *c1[3], *c2[2];
    insert_chain(&f, ns, t1, 3, c1);
    insert_chain(&f, ns, t2, 2, c2);
    assert_int_equal(prefix_cache_evictable_blocks(f.pc), 5);
    prefix_cache_acquire(f.pc, c2[0]); /* a sequence holds t2's first block */
    prefix_cache_acquire(f.pc, c2[1]);
    prefix_cache_pin(f.pc, c1[0]); /* and t1's first block is pinned */
    int32_t b12 = prefix_cache_entry_block(c1[2]), b11 = prefix_cache_entry_block(c1[1]);
    int32_t free0 = block_manager_free_count(f.bm);
    assert_int_equal(prefix_cache_evict_one(f.pc), 1); /* the leaf of t1 */
    assert_int_equal(block_manager_refcount(f.bm, b12), 0);
    assert_int_equal(block_manager_refcount(f.bm, b11), 1);
    assert_int_equal(prefix_cache_evict_one(f.pc), 1); /* then its parent */
    assert_int_equal(block_manager_refcount(f.bm, b11), 0);
    assert_int_equal(block_manager_free_count(f.bm), free0 + 2);
    assert_int_equal(prefix_cache_evict_one(f.pc), 0); /* the rest is used or pinned */
    pcf_check(&f);
    prefix_cache_unpin(f.pc, c1[0]);
    prefix_cache_release(f.pc, c2[1]);
    prefix_cache_release(f.pc, c2[0]);
    assert_int_equal(prefix_cache_evictable_blocks(f.pc), 3);
    while (prefix_cache_evict_one(f.pc))
        ;
    assert_int_equal(prefix_cache_cached_blocks(f.pc), 0);
    assert_int_equal(block_manager_free_count(f.bm), 31);
    assert_int_equal(prefix_cache_evictions(f.pc), 5);
    pcf_check(&f);
    pcf_close(&f);
}

/* A namespace over its quota loses its blocks first, even when the other's are older. */
static void test_quota_first(void **state)
{
    (void)state;
    struct pc_fixture f;
    pcf_open(&f, 64);
    struct pc_namespace *mod = prefix_cache_namespace(f.pc, "t:modest");
    struct pc_namespace *flood = prefix_cache_namespace(f.pc, "t:flood");
    prefix_cache_set_quota(mod, 4);
    prefix_cache_set_quota(flood, 4);
    int32_t t[BS];
    struct pc_entry *e[1];
    for (int i = 0; i < 3; i++) { /* older, within quota */
        for (int j = 0; j < BS; j++)
            t[j] = 1000 + i * BS + j;
        insert_chain(&f, mod, t, 1, e);
    }
    for (int i = 0; i < 10; i++) { /* newer, over quota */
        for (int j = 0; j < BS; j++)
            t[j] = 2000 + i * BS + j;
        insert_chain(&f, flood, t, 1, e);
    }
    for (int i = 0; i < 6; i++)
        assert_int_equal(prefix_cache_evict_one(f.pc), 1);
    struct pc_namespace_stats sm, sf;
    prefix_cache_namespace_stats(mod, &sm);
    prefix_cache_namespace_stats(flood, &sf);
    assert_int_equal(sm.cached_blocks, 3);
    assert_int_equal(sf.cached_blocks, 4);
    assert_int_equal(sf.evictions, 6);
    /* Once nobody is over quota, plain LRU: the modest namespace's oldest goes. */
    assert_int_equal(prefix_cache_evict_one(f.pc), 1);
    prefix_cache_namespace_stats(mod, &sm);
    assert_int_equal(sm.cached_blocks, 2);
    pcf_check(&f);
    pcf_close(&f);
}

/* A flush detaches everything at once: unused blocks are free now, used ones when released. */
static void test_flush_with_users(void **state)
{
    (void)state;
    struct pc_fixture f;
    pcf_open(&f, 32);
    struct pc_namespace *ns = prefix_cache_namespace(f.pc, "t:a");
    int32_t t1[3 * BS];
    for (int i = 0; i < 3 * BS; i++)
        t1[i] = 7 * i + 1;
    struct pc_entry *c[3];
    insert_chain(&f, ns, t1, 3, c);
    prefix_cache_acquire(f.pc, c[0]);
    prefix_cache_acquire(f.pc, c[1]);
    int32_t b0 = prefix_cache_entry_block(c[0]);
    assert_int_equal(prefix_cache_flush(f.pc, ns), 3);
    assert_int_equal(prefix_cache_cached_blocks(f.pc), 0);
    struct pc_key root = prefix_cache_root(f.pc);
    assert_null(prefix_cache_lookup(f.pc, ns, prefix_cache_key(f.pc, ns, root, t1), root, t1));
    assert_int_equal(block_manager_free_count(f.bm), 31 - 2);
    pcf_check(&f);
    prefix_cache_release(f.pc, c[1]);
    prefix_cache_release(f.pc, c[0]);
    assert_int_equal(block_manager_refcount(f.bm, b0), 0);
    assert_int_equal(block_manager_free_count(f.bm), 31);
    pcf_check(&f);
    pcf_close(&f);
}

/* A sequence holding a flushed chain publishes its next block: it stays private. Found by
 * fuzz_scheduler (an admin flush while a tenant's sequence decoded): the block was cached under
 * the flushed parent, so the flushed blocks were never freed, and once another sequence cached
 * the same prefix again a third found the block and used it under a parent nobody used
 * (prefix_cache_check: "an entry in use or pinned under an unused parent"). */
static void test_no_insert_under_flushed_parent(void **state)
{
    (void)state;
    struct pc_fixture f;
    pcf_open(&f, 32);
    struct pc_namespace *ns = prefix_cache_namespace(f.pc, "t:a");
    int32_t t1[3 * BS];
    for (int i = 0; i < 3 * BS; i++)
        t1[i] = 5 * i + 2;
    struct pc_entry *c[2];
    insert_chain(&f, ns, t1, 2, c);
    prefix_cache_acquire(f.pc, c[0]);
    prefix_cache_acquire(f.pc, c[1]);
    assert_int_equal(prefix_cache_flush(f.pc, ns), 2);
    /* The holder's third block, under its flushed second one. */
    int32_t b;
    assert_int_equal(block_manager_alloc(f.bm, &b), 0);
    struct pc_key k1 = prefix_cache_entry_key(c[1]);
    struct pc_key k2 = prefix_cache_key(f.pc, ns, k1, t1 + 2 * BS);
    assert_null(prefix_cache_insert(f.pc, ns, c[1], k2, k1, t1 + 2 * BS, b));
    pcf_check(&f);
    assert_int_equal(block_manager_unref(f.bm, b), 0);
    prefix_cache_release(f.pc, c[1]);
    prefix_cache_release(f.pc, c[0]);
    /* Every flushed block is free once its holder let go. */
    assert_int_equal(prefix_cache_cached_blocks(f.pc), 0);
    assert_int_equal(block_manager_free_count(f.bm), 31);
    /* The same prefix cached again: the third block is not found under it. */
    struct pc_entry *d[2];
    insert_chain(&f, ns, t1, 2, d);
    assert_null(prefix_cache_lookup(f.pc, ns, k2, k1, t1 + 2 * BS));
    pcf_check(&f);
    pcf_close(&f);
}

/* ---- in the scheduler ----------------------------------------------------------------------- */

static const struct setup CACHE_SETUP = {.eos = -1, .cache = true};

struct tenant_spec {
    const char *name, *ns;
    uint32_t max_running;
    const char *pin; /* one pin it may read, or NULL */
};

struct pin_spec {
    const char *name;
    const int32_t *tokens;
    int n;
};

/* Sends the router's policy: namespaces with quotas, tenants, pins. */
static void send_policy(struct harness *h, uint64_t version, const char **ns_names,
                        const uint32_t *quotas, int n_ns, const struct tenant_spec *ts, int n_t,
                        const struct pin_spec *ps, int n_p)
{
    Pagoda__Internal__NamespacePolicy nsp[8], *nspp[8];
    Pagoda__Internal__TenantPolicy tp[8], *tpp[8];
    Pagoda__Internal__PinPolicy pp[4], *ppp[4];
    char *pin_names[8];
    assert_true(n_ns <= 8 && n_t <= 8 && n_p <= 4);
    for (int i = 0; i < n_ns; i++) {
        pagoda__internal__namespace_policy__init(&nsp[i]);
        nsp[i].name = (char *)ns_names[i];
        nsp[i].has_quota_blocks = 1;
        nsp[i].quota_blocks = quotas[i];
        nspp[i] = &nsp[i];
    }
    for (int i = 0; i < n_t; i++) {
        pagoda__internal__tenant_policy__init(&tp[i]);
        tp[i].name = (char *)ts[i].name;
        tp[i].namespace_ = (char *)ts[i].ns;
        tp[i].has_max_running = ts[i].max_running > 0;
        tp[i].max_running = ts[i].max_running;
        if (ts[i].pin) {
            pin_names[i] = (char *)ts[i].pin;
            tp[i].n_pins = 1;
            tp[i].pins = &pin_names[i];
        }
        tpp[i] = &tp[i];
    }
    for (int i = 0; i < n_p; i++) {
        pagoda__internal__pin_policy__init(&pp[i]);
        pp[i].name = (char *)ps[i].name;
        pp[i].n_token_ids = (size_t)ps[i].n;
        pp[i].token_ids = (int32_t *)ps[i].tokens;
        ppp[i] = &pp[i];
    }
    Pagoda__Internal__Policy pol = PAGODA__INTERNAL__POLICY__INIT;
    pol.has_version = 1;
    pol.version = version;
    pol.n_namespaces = (size_t)n_ns;
    pol.namespaces = nspp;
    pol.n_tenants = (size_t)n_t;
    pol.tenants = tpp;
    pol.n_pins = (size_t)n_p;
    pol.pins = ppp;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_POLICY;
    m.policy = &pol;
    deliver_router(h, &m);
}

static void admin_call(struct harness *h, bool figures, const char *flush)
{
    Pagoda__Internal__AdminCall a = PAGODA__INTERNAL__ADMIN_CALL__INIT;
    a.has_cookie = 1;
    a.cookie = 77;
    a.has_figures = figures;
    a.figures = figures;
    a.flush_namespace = (char *)flush;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_ADMIN;
    m.admin = &a;
    int before = h->admin_count;
    deliver_router(h, &m);
    assert_int_equal(h->admin_count, before + 1);
    assert_non_null(h->admin);
    assert_int_equal(h->admin->cookie, 77);
}

static const Pagoda__Internal__TenantFigures *tenant_figures(struct harness *h, const char *name)
{
    admin_call(h, true, NULL);
    for (size_t i = 0; i < h->admin->n_tenants; i++)
        if (strcmp(h->admin->tenants[i]->name, name) == 0)
            return h->admin->tenants[i];
    fail_msg("no figures for tenant %s", name);
    return NULL;
}

static uint32_t ns_blocks(struct harness *h, const char *ns)
{
    admin_call(h, true, NULL);
    for (size_t i = 0; i < h->admin->n_namespaces; i++)
        if (strcmp(h->admin->namespaces[i]->name, ns) == 0)
            return h->admin->namespaces[i]->cached_blocks;
    return 0;
}

static int next_idn = 1;

/* tenant sends prompt and waits for its n outputs; the result is checked against the reference
 * (so a hit that served wrong KV fails here). */
static struct req_rec *ask(struct harness *h, const char *tenant, const int32_t *prompt, int n,
                           int max_tokens)
{
    h->tenant = tenant;
    struct req_rec *r = submit(h, next_idn++, prompt, n, max_tokens);
    pump(h);
    expect_output(r, prompt, n, max_tokens, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    return r;
}

static int expected_cached(int n_prompt)
{
    return (n_prompt - 1) / 8 * 8; /* full blocks before the one holding the last token */
}

/* The same prompt twice: the second is served from the cache up to (not including) the block
 * holding its last token, with the same output. Block-aligned and unaligned lengths. */
static void test_repeat_hits(void **state)
{
    (void)state;
    struct harness *h = harness_open(&CACHE_SETUP);
    static const int lens[] = {5, 8, 9, 16, 17, 40, 41};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        int32_t p[64];
        make_prompt(500 + (int)i, lens[i], p);
        struct req_rec *a = ask(h, "alice", p, lens[i], 6);
        assert_int_equal(a->cached_tokens, 0);
        struct req_rec *b = ask(h, "alice", p, lens[i], 6);
        assert_int_equal(b->cached_tokens, expected_cached(lens[i]));
        assert_memory_equal(a->out, b->out, 6 * sizeof(int32_t));
    }
    struct scheduler_stats st = stats(h);
    assert_true(st.prefix_hit_tokens > 0);
    assert_true(st.cached_blocks > 0);
    assert_int_equal(st.kv_usage, 0.0); /* cached blocks nobody uses count as free */
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("%s", why);
    harness_close(h);
}

/* The prefix_waits of the SchedulerStats the scheduler sends the router (UINT64_MAX: absent). */
static uint64_t router_stats_prefix_waits(struct harness *h)
{
    Pagoda__Internal__StatsRequest sr = PAGODA__INTERNAL__STATS_REQUEST__INIT;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS;
    m.stats = &sr;
    int before = h->stats_replies;
    deliver_router(h, &m);
    assert_int_equal(h->stats_replies, before + 1);
    return h->stats_prefix_waits;
}

/* Requests sharing a prefix nobody has cached yet, sent together: the first computes it, the
 * others wait for its blocks to be cached and hit them (stats.prefix_waits) instead of computing
 * the same prefix beside it; their outputs are unchanged. */
static void test_shared_prefix_computed_once(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_batched_tokens = 128;
    su.num_blocks = 1 + 512;
    struct harness *h = harness_open(&su);
    enum { N = 4, PREFIX = 64, LEN = PREFIX + 8, OTHER = 300 };
    int32_t p[N][LEN];
    struct req_rec *r[N];
    /* Another tenant's long prompt first: its first two prefill chunks (128 tokens a step) fill
     * the two steps in flight, so the N requests all wait for the next step, which admits the
     * first of them and finds the others' prefix being computed by it. */
    int32_t other[OTHER];
    make_prompt(899, OTHER, other);
    h->tenant = "bob";
    struct req_rec *o = submit(h, next_idn++, other, OTHER, 2);
    h->tenant = "alice";
    for (int i = 0; i < N; i++) {
        make_prompt(900, PREFIX, p[i]);
        make_prompt(910 + i, LEN - PREFIX, p[i] + PREFIX);
        r[i] = submit(h, next_idn++, p[i], LEN, 6);
    }
    pump(h);
    expect_output(o, other, OTHER, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    int hits = 0;
    for (int i = 0; i < N; i++) {
        expect_output(r[i], p[i], LEN, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
        hits += r[i]->cached_tokens == PREFIX;
        assert_true(r[i]->cached_tokens == 0 || r[i]->cached_tokens == PREFIX);
    }
    assert_int_equal(hits, N - 1);
    struct scheduler_stats st = stats(h);
    assert_true(st.prefix_waits > 0);
    assert_int_equal(st.prefix_hit_tokens, (uint64_t)(N - 1) * PREFIX);
    /* The router's stats carry the count. */
    assert_int_equal(router_stats_prefix_waits(h), st.prefix_waits);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("%s", why);
    harness_close(h);
}

/* The request computing a shared prefix is cancelled while the others wait for it: they are
 * admitted all the same, and end with their outputs. */
static void test_prefix_wait_survives_cancel(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_batched_tokens = 128;
    su.num_blocks = 1 + 512;
    struct harness *h = harness_open(&su);
    enum { N = 3, PREFIX = 64, LEN = PREFIX + 8, OTHER = 300 };
    int32_t other[OTHER], p[N][LEN];
    make_prompt(899, OTHER, other);
    h->tenant = "bob";
    struct req_rec *o = submit(h, next_idn++, other, OTHER, 2);
    h->tenant = "alice";
    struct req_rec *r[N];
    for (int i = 0; i < N; i++) {
        make_prompt(900, PREFIX, p[i]);
        make_prompt(920 + i, LEN - PREFIX, p[i] + PREFIX);
        r[i] = submit(h, next_idn++, p[i], LEN, 6);
    }
    /* One answer: the step that admits r[0] goes out, and the others wait for its prefix. */
    while (worker_handle_one(h))
        ;
    deliver_answers(h);
    struct scheduler_stats st = stats(h);
    assert_true(st.prefix_waits > 0);
    cancel(h, r[0]);
    pump(h);
    expect_output(o, other, OTHER, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(r[0]->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_CANCELLED);
    for (int i = 1; i < N; i++)
        expect_output(r[i], p[i], LEN, 6, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("%s", why);
    harness_close(h);
}

/* The prefix wait after a pinned prefix (the key switch: the pin's blocks are looked up in its
 * namespace, the blocks after it in the tenant's own). Alice's a0 computes the blocks after the
 * pin; alice's a1, sent beside it with the same tokens there, waits for them and hits the pin and
 * them. Carol reads the same pin and sends the same tokens, but a0 publishes its blocks in
 * alice's namespace, which carol cannot read: carol does not wait (she is served in the step
 * that admits a0) and hits the pin only. One step in flight, so that each exchange is one step. */
static void test_prefix_wait_after_pin(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 256;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
    enum { PIN = 32, SHARED = 64, LEN = PIN + SHARED + 8, OTHER = 40 };
    int32_t sys[PIN];
    make_prompt(4343, PIN, sys);
    const char *names[] = {"t:alice", "t:carol"};
    const uint32_t quotas[] = {0, 0};
    const struct tenant_spec ts[] = {{"alice", "t:alice", 0, "sys"},
                                     {"carol", "t:carol", 0, "sys"}};
    const struct pin_spec ps[] = {{"sys", sys, PIN}};
    send_policy(h, 1, names, quotas, 2, ts, 2, ps, 1);
    pump(h);
    assert_true(h->applied_count == 1 && h->applied->pins[0]->ready);
    int32_t a0p[LEN], a1p[LEN], c0p[LEN], other[OTHER];
    for (int i = 0; i < 3; i++) {
        int32_t *p = i == 0 ? a0p : i == 1 ? a1p : c0p;
        memcpy(p, sys, sizeof(sys));
        make_prompt(4400, SHARED, p + PIN);
        make_prompt(4410 + i, LEN - PIN - SHARED, p + PIN + SHARED);
    }
    make_prompt(4499, OTHER, other);
    /* bob's prompt holds the one step in flight: the others queue behind it, in this order. */
    h->tenant = "bob";
    struct req_rec *o = submit(h, next_idn++, other, OTHER, 2);
    h->tenant = "alice";
    struct req_rec *a0 = submit(h, next_idn++, a0p, LEN, 4);
    h->tenant = "carol";
    struct req_rec *c0 = submit(h, next_idn++, c0p, LEN, 4);
    h->tenant = "alice";
    struct req_rec *a1 = submit(h, next_idn++, a1p, LEN, 4);
    exchange(h); /* bob's prompt; the next step admits a0 and c0, a1 waits */
    assert_int_equal(stats(h).prefix_waits, 1);
    exchange(h);                 /* a0's and c0's prompts */
    assert_true(c0->n_out >= 1); /* carol was not held back */
    assert_int_equal(a1->n_out, 0);
    pump(h);
    expect_output(o, other, OTHER, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(a0, a0p, LEN, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(c0, c0p, LEN, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(a1, a1p, LEN, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(a0->cached_tokens, PIN);
    assert_int_equal(c0->cached_tokens, PIN);
    assert_int_equal(a1->cached_tokens, PIN + SHARED);
    assert_int_equal(stats(h).prefix_waits, 1);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("%s", why);
    harness_close(h);
}

/* One run of test_prefix_wait_not_on_flushed_parent's timeline; returns stats.prefix_waits. */
static uint64_t flushed_parent_run(bool flush)
{
    enum { B = 8, HEAD = 12, OUT = 10, TAIL = 4 };
    struct setup su = CACHE_SETUP;
    su.max_steps_in_flight = 1;
    struct harness *h = harness_open(&su);
    h->tenant = "alice";
    /* z caches block 0 (E0). */
    int32_t head[HEAD], z[HEAD], c[HEAD];
    make_prompt(4600, HEAD, head);
    memcpy(z, head, B * sizeof(int32_t));
    make_prompt(4601, HEAD - B, z + B);
    ask(h, "alice", z, HEAD, 2);
    /* a: block 0 from the cache (it holds E0), its block 1 half prompt, half its own output. */
    struct req_rec *a = submit(h, next_idn++, head, HEAD, OUT);
    if (flush)
        admin_call(h, false, "t:alice"); /* E0 leaves the cache; a still holds it */
    /* c computes block 0 again: E0' (with the flush; without it, c hits E0). */
    memcpy(c, head, B * sizeof(int32_t));
    make_prompt(4602, HEAD - B, c + B);
    struct req_rec *cr = submit(h, next_idn++, c, HEAD, 2);
    exchange(h); /* a's prompt; then a decodes, c's prompt */
    exchange(h); /* c's block 0 is cached */
    exchange(h); /* a has 15 tokens, c ends */
    /* While a's step of its 16th token runs, d sends a's first 16 tokens and more: d matches
     * block 0, and a is computing block 1 with the same tokens under the same key. */
    int32_t d[2 * B + TAIL];
    memcpy(d, head, HEAD * sizeof(int32_t));
    ref_generate(head, HEAD, 2 * B - HEAD, d + HEAD);
    make_prompt(4603, TAIL, d + 2 * B);
    struct req_rec *dr = submit(h, next_idn++, d, 2 * B + TAIL, 2);
    exchange(h); /* a's 16th token: its block 1 is full, not computed yet; d is looked at */
    uint64_t waits = stats(h).prefix_waits;
    pump(h);
    expect_output(a, head, HEAD, OUT, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(cr, c, HEAD, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(dr, d, 2 * B + TAIL, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(a->cached_tokens, B);
    assert_int_equal(cr->cached_tokens, flush ? 0 : B);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("%s", why);
    harness_close(h);
    return waits;
}

/* A request waits for a block another sequence computes only if that sequence holds, for the
 * block before, the very entry the request matched. Here a holds block 0's entry E0 and computes
 * block 1; an admin flush takes E0 out of the cache (a keeps it), and c caches the same block 0
 * again as E0'. d, with a's tokens, matches E0' and finds a computing block 1 under the same key;
 * but a publishes nothing under a flushed parent (its block 1 stays private), so d must not wait
 * for it: it is admitted at once and computes block 1 itself. Without the flush the same
 * timeline makes d wait (a will publish under E0, which d matched). */
static void test_prefix_wait_not_on_flushed_parent(void **state)
{
    (void)state;
    assert_int_equal(flushed_parent_run(false), 1);
    assert_int_equal(flushed_parent_run(true), 0);
}

/* Isolation: B sends A's exact prompts and never hits; A's figures do not move. */
static void test_isolation(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 1024; /* no pool pressure: only isolation can keep B from hitting */
    struct harness *h = harness_open(&su);
    int32_t prompts[100][24];
    for (int i = 0; i < 100; i++) {
        make_prompt(1000 + i, 24, prompts[i]);
        ask(h, "alice", prompts[i], 24, 2);
    }
    const Pagoda__Internal__TenantFigures *fa = tenant_figures(h, "alice");
    uint64_t lookups = fa->lookups, hits = fa->hits, hit_tokens = fa->hit_tokens;
    uint32_t a_blocks = ns_blocks(h, "t:alice");
    assert_true(a_blocks >= 200);
    for (int i = 0; i < 100; i++) {
        struct req_rec *r = ask(h, "bob", prompts[i], 24, 2);
        assert_int_equal(r->cached_tokens, 0);
    }
    fa = tenant_figures(h, "alice");
    assert_int_equal(fa->lookups, lookups);
    assert_int_equal(fa->hits, hits);
    assert_int_equal(fa->hit_tokens, hit_tokens);
    assert_int_equal(ns_blocks(h, "t:alice"), a_blocks);
    const Pagoda__Internal__TenantFigures *fb = tenant_figures(h, "bob");
    assert_int_equal(fb->lookups, 100);
    assert_int_equal(fb->hits, 0);
    /* And A still hits its own. */
    struct req_rec *again = ask(h, "alice", prompts[7], 24, 2);
    assert_int_equal(again->cached_tokens, 16);
    harness_close(h);
}

/* A sharing group: C and D share a namespace; E, outside it, does not hit. */
static void test_sharing_group(void **state)
{
    (void)state;
    struct harness *h = harness_open(&CACHE_SETUP);
    const char *names[] = {"g:team", "t:erin"};
    const uint32_t quotas[] = {0, 0};
    const struct tenant_spec ts[] = {
        {"carol", "g:team", 0, NULL}, {"dave", "g:team", 0, NULL}, {"erin", "t:erin", 0, NULL}};
    send_policy(h, 1, names, quotas, 2, ts, 3, NULL, 0);
    assert_int_equal(h->applied_count, 1);
    assert_int_equal(h->applied->version, 1);
    int32_t p[33];
    make_prompt(77, 33, p);
    ask(h, "carol", p, 33, 3);
    struct req_rec *d = ask(h, "dave", p, 33, 3);
    assert_int_equal(d->cached_tokens, 32);
    struct req_rec *e = ask(h, "erin", p, 33, 3);
    assert_int_equal(e->cached_tokens, 0);
    struct req_rec *f = ask(h, "frank", p, 33, 3); /* not in the policy: its own namespace */
    assert_int_equal(f->cached_tokens, 0);
    assert_true(ns_blocks(h, "g:team") >= 4);
    harness_close(h);
}

/* A pinned prefix: computed when the policy names it, readable by the tenants it names from
 * their first request, never evicted while pinned, evictable after it is unpinned. */
static void test_pinned_prefix(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 40;
    struct harness *h = harness_open(&su);
    int32_t sys[32];
    make_prompt(4242, 32, sys);
    const char *names[] = {"t:alice", "t:bob"};
    const uint32_t quotas[] = {0, 0};
    const struct tenant_spec ts[] = {{"alice", "t:alice", 0, "sys"}, {"bob", "t:bob", 0, NULL}};
    const struct pin_spec ps[] = {{"sys", sys, 32}};
    send_policy(h, 1, names, quotas, 2, ts, 2, ps, 1);
    assert_int_equal(h->applied_count, 0); /* the pin is being computed */
    pump(h);
    assert_int_equal(h->applied_count, 1);
    assert_int_equal(h->applied->n_pins, 1);
    assert_true(h->applied->pins[0]->ready);
    assert_int_equal(h->applied->pins[0]->blocks, 4);
    assert_int_equal(stats(h).pinned_blocks, 4);
    int32_t p[45];
    memcpy(p, sys, sizeof(sys));
    make_prompt(9, 13, p + 32);
    struct req_rec *a = ask(h, "alice", p, 45, 4);
    assert_int_equal(a->cached_tokens, 32);
    struct req_rec *b = ask(h, "bob", p, 45, 4);
    assert_int_equal(b->cached_tokens, 0);
    /* Alice's own continuation is cached in her namespace after the public chain. */
    struct req_rec *a2 = ask(h, "alice", p, 45, 4);
    assert_int_equal(a2->cached_tokens, 40);
    /* Pressure: unique prompts of 80 tokens (11 blocks each) fill the pool again and again. */
    for (int i = 0; i < 12; i++) {
        int32_t u[80];
        make_prompt(7000 + i, 80, u);
        ask(h, "bob", u, 80, 3);
    }
    assert_true(stats(h).evictions > 0);
    struct req_rec *a3 = ask(h, "alice", p, 45, 4);
    assert_true(a3->cached_tokens >= 32); /* the pin survived */
    /* Unpin (a policy without it): its blocks become ordinary cached blocks, evictable. */
    send_policy(h, 2, names, quotas, 2, ts, 2, NULL, 0);
    assert_int_equal(h->applied->version, 2);
    assert_int_equal(stats(h).pinned_blocks, 0);
    for (int i = 0; i < 12; i++) {
        int32_t u[80];
        make_prompt(8000 + i, 80, u);
        ask(h, "bob", u, 80, 3);
    }
    assert_int_equal(ns_blocks(h, "p:sys"), 0);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("%s", why);
    harness_close(h);
}

/* A pin that cannot be computed is reported, not fatal. */
static void test_pin_refused(void **state)
{
    (void)state;
    struct harness *h = harness_open(&CACHE_SETUP);
    int32_t short_pin[5] = {1, 2, 3, 4, 5}, bad_pin[16];
    make_prompt(3, 16, bad_pin);
    bad_pin[3] = VOCAB + 5;
    const struct pin_spec ps[] = {{"short", short_pin, 5}, {"bad", bad_pin, 16}};
    send_policy(h, 1, NULL, NULL, 0, NULL, 0, ps, 2);
    pump(h);
    assert_int_equal(h->applied_count, 1);
    for (size_t i = 0; i < h->applied->n_pins; i++) {
        assert_false(h->applied->pins[i]->ready);
        assert_int_not_equal(h->applied->pins[i]->error_code, 0);
        assert_non_null(h->applied->pins[i]->error_message);
    }
    int32_t p[12];
    make_prompt(5, 12, p);
    ask(h, "alice", p, 12, 3); /* still serving */
    harness_close(h);
}

/* A pin without tokens, named again by the next policy, is refused each time and the scheduler
 * goes on serving. (Found by tests/fuzz/fuzz_scheduler: comparing the two pins' tokens passed
 * the unpacked empty token list, NULL, to memcmp.) */
static void test_empty_pin_named_twice(void **state)
{
    (void)state;
    struct harness *h = harness_open(&CACHE_SETUP);
    const struct pin_spec ps[] = {{"empty", NULL, 0}};
    for (uint64_t version = 1; version <= 2; version++) {
        send_policy(h, version, NULL, NULL, 0, NULL, 0, ps, 1);
        pump(h);
        assert_int_equal(h->applied_count, (int)version);
        assert_int_equal(h->applied->n_pins, 1);
        assert_false(h->applied->pins[0]->ready);
    }
    int32_t p[12];
    make_prompt(5, 12, p);
    ask(h, "alice", p, 12, 3); /* still serving */
    harness_close(h);
}

/* Quotas: a tenant flooding the cache with unique prompts evicts its own blocks before those
 * of a tenant within its quota. */
static void test_quota_flood(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 48;
    struct harness *h = harness_open(&su);
    const char *names[] = {"t:modest", "t:flood"};
    const uint32_t quotas[] = {12, 12};
    const struct tenant_spec ts[] = {{"modest", "t:modest", 0, NULL},
                                     {"flood", "t:flood", 0, NULL}};
    send_policy(h, 1, names, quotas, 2, ts, 2, NULL, 0);
    int32_t m[4][17];
    for (int i = 0; i < 4; i++) {
        make_prompt(300 + i, 17, m[i]);
        ask(h, "modest", m[i], 17, 2);
    }
    uint32_t modest = ns_blocks(h, "t:modest");
    assert_true(modest > 0 && modest <= 12);
    for (int i = 0; i < 30; i++) {
        int32_t u[40];
        make_prompt(600 + i, 40, u);
        ask(h, "flood", u, 40, 2);
    }
    assert_true(stats(h).evictions > 0);
    assert_int_equal(ns_blocks(h, "t:modest"), modest);
    for (int i = 0; i < 4; i++) {
        struct req_rec *r = ask(h, "modest", m[i], 17, 2);
        assert_int_equal(r->cached_tokens, 16);
    }
    harness_close(h);
}

/* Admissions are fair between tenants when memory is the limit: a tenant with a long queue of
 * large requests does not hold another tenant's small request behind all of them (a hostile
 * probe's flood of 300 requests held one of another tenant's for 8 minutes). 30 blocks of 8
 * tokens, three of flood's 79-token prompts fill them: small's 3-token request, submitted after
 * flood's six, is admitted as soon as a block is free, and ends before any of flood's (FIFO let
 * flood's requests take every block as they freed, small waiting behind the last of them). */
static void test_admissions_fair_between_tenants(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 30;
    struct harness *h = harness_open(&su);
    int32_t prompts[6][79], tiny[3];
    struct req_rec *flood[6];
    h->tenant = "flood";
    for (int i = 0; i < 6; i++) {
        make_prompt(900 + i, 79, prompts[i]);
        flood[i] = submit(h, next_idn++, prompts[i], 79, 40);
    }
    h->tenant = "small";
    make_prompt(990, 3, tiny);
    struct req_rec *small = submit(h, next_idn++, tiny, 3, 2);
    int flood_done = 0;
    for (int i = 0; i < 10000 && small->finish < 0; i++)
        exchange(h);
    for (int i = 0; i < 6; i++)
        flood_done += flood[i]->finish >= 0;
    assert_true(small->finish >= 0);
    assert_int_equal(flood_done, 0);
    pump(h);
    expect_output(small, tiny, 3, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    for (int i = 0; i < 6; i++)
        expect_output(flood[i], prompts[i], 79, 40, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).running + stats(h).waiting, 0);
    harness_close(h);
}

/* Fairness of the places: a tenant that took every place (max_seqs 4) while the other was idle
 * gives one back when the other's request comes (preempted, recomputed later), so the other's
 * 2-token request ends before any of its 200-token ones; they still end with the reference's
 * tokens. Without it the request waited for the first of them to end. */
static void test_places_fair_between_tenants(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_seqs = 4;
    su.num_blocks = 1 + 400;
    su.max_positions = 1024;
    struct harness *h = harness_open(&su);
    int32_t prompts[4][20], tiny[3];
    struct req_rec *hog[4];
    h->tenant = "hog";
    for (int i = 0; i < 4; i++) {
        make_prompt(700 + i, 20, prompts[i]);
        hog[i] = submit(h, next_idn++, prompts[i], 20, 200);
    }
    for (int i = 0; i < 4; i++)
        exchange(h);
    assert_int_equal(stats(h).running, 4);
    h->tenant = "late";
    make_prompt(790, 3, tiny);
    struct req_rec *late = submit(h, next_idn++, tiny, 3, 2);
    for (int i = 0; i < 10000 && late->finish < 0; i++)
        exchange(h);
    int hog_done = 0;
    for (int i = 0; i < 4; i++)
        hog_done += hog[i]->finish >= 0;
    assert_true(late->finish >= 0);
    assert_int_equal(hog_done, 0);
    assert_true(stats(h).preemptions >= 1);
    pump(h);
    expect_output(late, tiny, 3, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    for (int i = 0; i < 4; i++)
        expect_output(hog[i], prompts[i], 20, 200, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).running + stats(h).waiting, 0);
    harness_close(h);
}

/* Pins' computations take their turn among the tenants (after them on a tie): a tenant's request
 * sent with three long pins to compute ends before the last pin is ready (the policy is applied
 * once every pin is). Pins used to be admitted before any tenant's request, which waited for all
 * of them. */
static void test_pins_take_their_turn(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_batched_tokens = 32;
    su.num_blocks = 1 + 200;
    struct harness *h = harness_open(&su);
    int32_t pins[3][96], tiny[3];
    const char *names[] = {"t:bob"};
    const uint32_t quotas[] = {0};
    const struct tenant_spec ts[] = {{"bob", "t:bob", 0, NULL}};
    struct pin_spec ps[3];
    for (int i = 0; i < 3; i++) {
        make_prompt(5100 + i, 96, pins[i]);
        ps[i] = (struct pin_spec){i == 0 ? "p0" : i == 1 ? "p1" : "p2", pins[i], 96};
    }
    send_policy(h, 1, names, quotas, 1, ts, 1, ps, 3);
    assert_int_equal(h->applied_count, 0); /* the pins are being computed */
    h->tenant = "bob";
    make_prompt(5199, 3, tiny);
    struct req_rec *bob = submit(h, next_idn++, tiny, 3, 2);
    for (int i = 0; i < 10000 && bob->finish < 0; i++)
        exchange(h);
    assert_true(bob->finish >= 0);
    assert_int_equal(h->applied_count, 0); /* a pin still computing */
    pump(h);
    assert_int_equal(h->applied_count, 1);
    assert_int_equal(h->applied->n_pins, 3);
    for (int i = 0; i < 3; i++)
        assert_true(h->applied->pins[i]->ready);
    expect_output(bob, tiny, 3, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    harness_close(h);
}

/* And a pin is not held behind a tenant's whole queue: with one place, a tenant running one
 * request at a time and a pin sent while its first runs, the tie for the freed place goes to the
 * tenant, then to the pin, so the pin is ready before the tenant's last request ends (with ties
 * always the tenants', it waited for all of them). */
static void test_pins_win_every_other_tie(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_seqs = 1;
    su.num_blocks = 1 + 200;
    struct harness *h = harness_open(&su);
    const char *names[] = {"t:bob"};
    const uint32_t quotas[] = {0};
    const struct tenant_spec ts[] = {{"bob", "t:bob", 0, NULL}};
    send_policy(h, 1, names, quotas, 1, ts, 1, NULL, 0);
    h->tenant = "bob";
    int32_t prompts[4][3], pin[96];
    struct req_rec *bob[4];
    for (int i = 0; i < 4; i++) {
        make_prompt(5300 + i, 3, prompts[i]);
        bob[i] = submit(h, next_idn++, prompts[i], 3, 8);
    }
    exchange(h); /* bob's first runs */
    const uint32_t applied = h->applied_count;
    make_prompt(5399, 96, pin);
    const struct pin_spec ps[] = {{"p", pin, 96}};
    send_policy(h, 2, names, quotas, 1, ts, 1, ps, 1);
    for (int i = 0; i < 10000 && bob[3]->finish < 0; i++)
        exchange(h);
    assert_true(bob[3]->finish >= 0);
    assert_int_equal(h->applied_count, applied + 1); /* the pin was ready before */
    assert_true(h->applied->pins[0]->ready);
    pump(h);
    for (int i = 0; i < 4; i++)
        expect_output(bob[i], prompts[i], 3, 8, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    harness_close(h);
}

/* ... and a step stays as full as before: the budget an admission cannot use (another tenant's
 * request waiting for memory) goes to the running prompt's chunk, which is computed at the whole
 * budget a step, not at its half. */
static void test_prefill_share_left_unused_is_used(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_batched_tokens = 32;
    su.num_blocks = 1 + 60;
    su.max_positions = 1024;
    struct harness *h = harness_open(&su);
    int32_t big[320], other[200];
    h->tenant = "ay";
    make_prompt(6600, 320, big);
    struct req_rec *a = submit(h, next_idn++, big, 320, 2); /* 41 blocks */
    exchange(h);
    h->tenant = "bee";
    make_prompt(6601, 200, other);
    struct req_rec *b = submit(h, next_idn++, other, 200, 2); /* 26: not beside it */
    int steps = 0;
    while (a->n_out == 0 && steps < 100) {
        exchange(h);
        steps++;
    }
    assert_true(steps <= 6); /* 5 exchanges (of up to two steps each); 8 at half the budget */
    assert_int_equal(b->n_out, 0);
    pump(h);
    expect_output(a, big, 320, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(b, other, 200, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    harness_close(h);
}

/* A tenant's request waiting for a prefix its own running request computes holds that tenant's
 * requests behind it, not every tenant's: another tenant's short request is admitted and answered
 * while the prefix is still being computed (a reviewer's: the wait stopped all admissions, so a
 * tenant sending requests that share a long prompt held everyone behind its computation). */
static void test_prefix_wait_holds_only_its_tenant(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_batched_tokens = 32;
    su.num_blocks = 1 + 400;
    su.max_positions = 1024;
    struct harness *h = harness_open(&su);
    int32_t longp[300], again[300], dec[3][4], tiny[3];
    struct req_rec *bee[3];
    h->tenant = "bee";
    for (int i = 0; i < 3; i++) {
        make_prompt(6400 + i, 4, dec[i]);
        bee[i] = submit(h, next_idn++, dec[i], 4, 100);
    }
    exchange(h);
    h->tenant = "ay";
    make_prompt(6410, 300, longp);
    memcpy(again, longp, sizeof(again));
    again[299] ^= 1; /* the same prompt but its last token */
    struct req_rec *first = submit(h, next_idn++, longp, 300, 2);
    exchange(h);
    exchange(h);
    struct req_rec *second = submit(h, next_idn++, again, 300, 2);
    exchange(h);
    h->tenant = "bee";
    make_prompt(6420, 3, tiny);
    struct req_rec *late = submit(h, next_idn++, tiny, 3, 2);
    for (int i = 0; i < 6 && late->finish < 0; i++)
        exchange(h);
    assert_true(late->finish >= 0);
    assert_int_equal(first->n_out, 0); /* the prefix still being computed */
    assert_true(stats(h).prefix_waits >= 1);
    pump(h);
    expect_output(late, tiny, 3, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(first, longp, 300, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_output(second, again, 300, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    for (int i = 0; i < 3; i++)
        expect_output(bee[i], dec[i], 4, 100, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_true(second->cached_tokens >= 288);
    harness_close(h);
}

/* Memory's preemption takes from the tenant holding the most blocks: a tenant's short request
 * admitted beside another's two long generations that fill the memory is not the one preempted
 * (it was, being the most recently admitted), and ends before the first of them. */
static void test_memory_preempts_the_biggest_tenant(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 16;
    struct harness *h = harness_open(&su);
    h->fw.any_preemption = true; /* not the most recently admitted: that is the point */
    int32_t prompts[2][20], tiny[3];
    struct req_rec *hog[2];
    h->tenant = "hog";
    for (int i = 0; i < 2; i++) {
        make_prompt(6300 + i, 20, prompts[i]);
        hog[i] = submit(h, next_idn++, prompts[i], 20, 60);
    }
    for (int i = 0; i < 3; i++)
        exchange(h);
    h->tenant = "late";
    make_prompt(6399, 3, tiny);
    struct req_rec *late = submit(h, next_idn++, tiny, 3, 40);
    for (int i = 0; i < 10000 && late->finish < 0; i++)
        exchange(h);
    assert_true(late->finish >= 0);
    assert_true(stats(h).preemptions >= 1);
    assert_true(hog[0]->finish < 0 && hog[1]->finish < 0);
    pump(h);
    expect_output(late, tiny, 3, 40, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    for (int i = 0; i < 2; i++)
        expect_output(hog[i], prompts[i], 20, 60, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("%s", why);
    harness_close(h);
}

/* ... and the oldest request always progresses: a long generation beside another tenant's stream
 * of short requests (two at a time) that it outgrows in memory is not the one preempted, again
 * and again (each time it was admitted back it held the most blocks): it ends early in the
 * stream, and the stream's short requests recompute instead. */
static void test_memory_preemption_spares_the_oldest(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 24;
    struct harness *h = harness_open(&su);
    h->fw.any_preemption = true;
    int32_t lp[4], sp[40][4];
    h->tenant = "long";
    make_prompt(6500, 4, lp);
    struct req_rec *x = submit(h, next_idn++, lp, 4, 180); /* 23 of the 24 blocks at its end */
    struct req_rec *y[40];
    int sent = 0;
    h->tenant = "short";
    for (int i = 0; i < 100000 && (x->finish < 0 || sent < 40); i++) {
        int open = 0;
        for (int k = 0; k < sent; k++)
            open += y[k]->finish < 0;
        while (open < 2 && sent < 40) {
            make_prompt(6501 + sent, 4, sp[sent]);
            y[sent] = submit(h, next_idn++, sp[sent], 4, 20);
            sent++;
            open++;
        }
        if (x->finish >= 0)
            break;
        exchange(h);
    }
    assert_true(x->finish >= 0);
    /* It ends by the stream's 18th request, recomputing little (617 tokens computed in all);
     * taken again and again, it ended by the 25th (842 tokens computed). */
    assert_true(sent <= 20);
    assert_true(h->fw.computed_tokens < 700);
    assert_true(stats(h).preemptions >= 1);
    pump(h);
    expect_output(x, lp, 4, 180, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    for (int k = 0; k < sent; k++)
        expect_output(y[k], sp[k], 4, 20, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("%s", why);
    harness_close(h);
}

/* Prefill is shared between tenants: with one tenant's long prompts (four of 400 tokens, a budget
 * of 32 a step) being computed, another tenant's short request is admitted and answered before
 * the first of them is. The running chunks used to take every step's budget before any
 * admission, so that it waited for the whole prompt being computed (10 more steps). */
static void test_prefill_shared_between_tenants(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_batched_tokens = 32;
    su.max_seqs = 8;
    su.num_blocks = 1 + 400;
    su.max_positions = 1024;
    struct harness *h = harness_open(&su);
    int32_t prompts[4][400], tiny[3];
    struct req_rec *hog[4];
    h->tenant = "hog";
    for (int i = 0; i < 4; i++) {
        make_prompt(6100 + i, 400, prompts[i]);
        hog[i] = submit(h, next_idn++, prompts[i], 400, 4);
    }
    for (int i = 0; i < 2; i++)
        exchange(h);
    assert_true(stats(h).running >= 1);
    h->tenant = "late";
    make_prompt(6199, 3, tiny);
    struct req_rec *late = submit(h, next_idn++, tiny, 3, 2);
    for (int i = 0; i < 8 && late->finish < 0; i++)
        exchange(h);
    assert_true(late->finish >= 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(hog[i]->n_out, 0); /* every long prompt still being computed */
    pump(h);
    expect_output(late, tiny, 3, 2, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    for (int i = 0; i < 4; i++)
        expect_output(hog[i], prompts[i], 400, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(stats(h).running + stats(h).waiting, 0);
    harness_close(h);
}

/* Flushing a tenant's namespace: the next request misses; pinned namespaces refuse a flush. */
static void test_flush(void **state)
{
    (void)state;
    struct harness *h = harness_open(&CACHE_SETUP);
    int32_t p[20];
    make_prompt(55, 20, p);
    ask(h, "alice", p, 20, 2);
    admin_call(h, false, "t:alice");
    assert_int_equal(h->admin->flushed_blocks, 2);
    struct req_rec *r = ask(h, "alice", p, 20, 2);
    assert_int_equal(r->cached_tokens, 0);
    admin_call(h, false, "p:anything");
    assert_int_equal(h->admin->error_code, PAGODA_EPERM);
    harness_close(h);
}

/* Chunked prefill: while a 3000-token prompt is prefilled, every step gives each of 16
 * decoding sequences one token and no step exceeds max_batched_tokens; the long prompt's output
 * equals the reference (its unchunked output). */
static void test_chunked_prefill_beside_decodes(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_batched_tokens = 256;
    su.max_seqs = 32;
    su.num_blocks = 1 + 600;
    su.max_positions = 4096;
    struct harness *h = harness_open(&su);
    int32_t prompts[16][8];
    struct req_rec *dec[16];
    for (int i = 0; i < 16; i++) {
        make_prompt(40 + i, 8, prompts[i]);
        dec[i] = submit(h, 100 + i, prompts[i], 8, 200);
    }
    exchange(h);
    exchange(h); /* all 16 are decoding now */
    for (int i = 0; i < 16; i++)
        assert_true(dec[i]->n_out >= 1);
    static int32_t longp[3000];
    make_prompt(9999, 3000, longp);
    struct req_rec *lr = submit(h, 200, longp, 3000, 4);
    int steps_with_long = 0, long_done = 0;
    while (lr->n_out == 0) {
        assert_true(h->to_worker.count > 0);
        /* Every step queued (two are in flight). */
        for (size_t k = 0; k < h->to_worker.count; k++) {
            struct bytes *qb = &h->to_worker.items[h->to_worker.head + k];
            Pagoda__Internal__ToWorker *m =
                pagoda__internal__to_worker__unpack(NULL, qb->len, qb->data);
            assert_non_null(m);
            assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_STEP);
            int total = 0, decodes = 0, prefill = 0;
            for (size_t i = 0; i < m->step->n_new_seqs; i++) {
                total += m->step->new_seqs[i]->num_new_tokens;
                prefill += m->step->new_seqs[i]->num_new_tokens;
            }
            for (size_t i = 0; i < m->step->n_cont_seqs; i++) {
                int n = m->step->cont_seqs[i]->num_new_tokens;
                total += n;
                if (n == 1)
                    decodes++;
                else
                    prefill += n;
            }
            assert_true(total <= 256);
            if (prefill > 1) {
                steps_with_long++;
                assert_int_equal(decodes, 16); /* every decoding sequence got its token */
                /* and the prompt took the rest of the budget, but for its last chunk */
                assert_int_equal(prefill, long_done + 240 <= 3000 ? 240 : 3000 - long_done);
                long_done += prefill;
            }
            protobuf_c_message_free_unpacked(&m->base, NULL);
        }
        exchange(h);
    }
    assert_int_equal(long_done, 3000);
    assert_int_equal(steps_with_long, (3000 + 239) / 240);
    pump(h);
    expect_output(lr, longp, 3000, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    for (int i = 0; i < 16; i++)
        expect_output(dec[i], prompts[i], 8, 200, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    harness_close(h);
}

/* Preemption with the cache on: a pool too small for all at once; every output equals the
 * reference, and resumed sequences hit their own published blocks. */
static void test_preemption_with_cache(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 10;
    struct harness *h = harness_open(&su);
    int32_t prompts[6][20];
    struct req_rec *r[6];
    for (int i = 0; i < 6; i++) {
        make_prompt(70 + i, 20, prompts[i]);
        r[i] = submit(h, 300 + i, prompts[i], 20, 30);
    }
    pump(h);
    for (int i = 0; i < 6; i++)
        expect_output(r[i], prompts[i], 20, 30, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_true(stats(h).preemptions > 0);
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("%s", why);
    harness_close(h);
}

/* A worker that comes back with another model: the cache is flushed and every running
 * sequence is preempted and recomputed from nothing (its KV is the old model's), so nothing the
 * old model computed is published under the new root. */
static void test_model_change_recomputes(void **state)
{
    (void)state;
    struct harness *h = harness_open(&CACHE_SETUP);
    int32_t p[40];
    make_prompt(123, 40, p);
    ask(h, "alice", p, 40, 2); /* cached under the first model */
    struct req_rec *r = submit(h, next_idn++, p, 40, 30);
    exchange(h);
    exchange(h);
    assert_true(r->n_out >= 1 && r->ends == 0);
    uint64_t preempted = stats(h).preemptions;
    fw_restart(&h->fw, 555);
    queue_clear(&h->to_worker); /* what the dead worker had not read is lost */
    h->hello.fingerprint = "another model";
    fw_hello(&h->fw, &h->hello, &h->from_worker);
    deliver_answers(h); /* the Hello: a resync follows */
    assert_int_equal(stats(h).preemptions, preempted + 1);
    assert_int_equal(stats(h).cached_blocks, 0);
    /* Past the resyncs (no sequence in their snapshots) to the first step. */
    Pagoda__Internal__ToWorker *m = NULL;
    for (int guard = 0; guard < 10; guard++) {
        m = peek_worker(h);
        assert_non_null(m);
        if (m->msg_case == PAGODA__INTERNAL__TO_WORKER__MSG_STEP)
            break;
        assert_int_equal(m->msg_case, PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC);
        assert_int_equal(m->resync->n_seqs, 0);
        protobuf_c_message_free_unpacked(&m->base, NULL);
        m = NULL;
        exchange(h);
    }
    assert_non_null(m);
    assert_int_equal(m->step->n_new_seqs, 1);
    assert_int_equal(m->step->new_seqs[0]->num_computed_tokens, 0); /* recomputed, no hit */
    protobuf_c_message_free_unpacked(&m->base, NULL);
    pump(h);
    expect_output(r, p, 40, 30, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    harness_close(h);
}

/* Pinned blocks are no sequence's: a prompt that fits the pool but not beside the pins is
 * refused at once, and does not hold up the requests behind it. */
static void test_pins_shrink_the_context(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 40;
    struct harness *h = harness_open(&su);
    int32_t sys[160];
    make_prompt(31, 160, sys); /* 20 blocks of 8: half the pool, as much as pins may hold */
    const struct pin_spec ps[] = {{"big", sys, 160}};
    send_policy(h, 1, NULL, NULL, 0, NULL, 0, ps, 1);
    pump(h);
    assert_true(h->applied->pins[0]->ready);
    assert_int_equal(stats(h).pinned_blocks, 20);
    int32_t big[170], small[5];
    make_prompt(32, 170, big);
    make_prompt(33, 5, small);
    h->tenant = "bob";
    struct req_rec *b = submit(h, next_idn++, big, 170, 4);
    struct req_rec *s2 = submit(h, next_idn++, small, 5, 4);
    pump(h);
    assert_int_equal(b->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(b->error_code, PAGODA_ERANGE);
    expect_output(s2, small, 5, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    harness_close(h);
}

/* q, a strict_max_tokens request of 10 + 200 tokens, was refused (ERANGE, no output) by the
 * context the policy's pin of 20 blocks leaves, that pin now ready. */
static void expect_strict_refused(const struct harness *h, const struct req_rec *q)
{
    assert_true(h->applied->pins[0]->ready);
    assert_int_equal(q->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR);
    assert_int_equal(q->error_code, PAGODA_ERANGE);
    assert_int_equal(q->n_out, 0);
}

/* A strict_max_tokens request that fits the context when it is submitted, and not once a pin
 * taken while it waits for the running place is ready, is refused at its admission; one that
 * fits beside the pin is served. */
static void test_strict_checked_again_at_admission(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 40; /* 320 tokens of 8-token blocks */
    su.max_seqs = 1;
    struct harness *h = harness_open(&su);
    int32_t run[6], sys[160], p[10];
    make_prompt(41, 6, run);
    make_prompt(42, 160, sys); /* a pin of 20 blocks: 160 tokens left */
    make_prompt(43, 10, p);
    h->tenant = "bob";
    struct req_rec *a = submit(h, next_idn++, run, 6, 40); /* takes the one running place */
    h->strict_max_tokens = true;
    struct req_rec *over = submit(h, next_idn++, p, 10, 200); /* 210: fits 320, not 160 */
    struct req_rec *fits = submit(h, next_idn++, p, 10, 100);
    assert_int_equal(over->ends, 0);
    const struct pin_spec ps[] = {{"sys", sys, 160}};
    send_policy(h, 1, NULL, NULL, 0, NULL, 0, ps, 1);
    pump(h);
    expect_output(a, run, 6, 40, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_strict_refused(h, over);
    expect_output(fits, p, 10, 100, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    harness_close(h);
}

/* Fairness's preemption checks the waiting request as its admission will: a strict request that
 * the context left by a pin cannot hold is refused at once, and no place is taken back for it
 * (a sequence of the tenant over its share was preempted, recomputed for nothing). */
static void test_fairness_checks_before_preempting(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 40; /* 320 tokens of 8-token blocks */
    su.max_seqs = 2;
    struct harness *h = harness_open(&su);
    int32_t sys[160], run[2][6], p[10];
    make_prompt(44, 160, sys); /* a pin of 20 blocks: 160 tokens left */
    const struct pin_spec ps[] = {{"sys", sys, 160}};
    send_policy(h, 1, NULL, NULL, 0, NULL, 0, ps, 1);
    pump(h);
    assert_true(h->applied->pins[0]->ready);
    h->tenant = "hog";
    struct req_rec *hog[2];
    for (int i = 0; i < 2; i++) {
        make_prompt(45 + i, 6, run[i]);
        hog[i] = submit(h, next_idn++, run[i], 6, 40);
    }
    exchange(h);
    exchange(h);
    assert_int_equal(stats(h).running, 2);
    h->tenant = "late";
    h->strict_max_tokens = true;
    make_prompt(47, 10, p);
    struct req_rec *over = submit(h, next_idn++, p, 10, 200); /* 210: fits 320, not 160 */
    pump(h);
    expect_strict_refused(h, over);
    assert_int_equal(stats(h).fairness_preemptions, 0);
    assert_int_equal(stats(h).preemptions, 0);
    for (int i = 0; i < 2; i++)
        expect_output(hog[i], run[i], 6, 40, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    harness_close(h);
}

/* A strict request admitted beside a pin being computed (its last chunk and the request's prompt
 * in one step) is checked against the context the pin leaves once ready: without that it was
 * admitted, then ended by the context at 150 of its 200 tokens when the pin took its blocks. */
static void test_strict_checked_against_pins_being_computed(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 40;     /* 320 tokens of 8-token blocks */
    su.max_batched_tokens = 64; /* the pin in three steps, the last with room for the request */
    struct harness *h = harness_open(&su);
    int32_t sys[160], p[10];
    make_prompt(42, 160, sys); /* a pin of 20 blocks: 160 tokens left */
    make_prompt(43, 10, p);
    const struct pin_spec ps[] = {{"sys", sys, 160}};
    send_policy(h, 1, NULL, NULL, 0, NULL, 0, ps, 1); /* its sequence queued first */
    h->tenant = "bob";
    h->strict_max_tokens = true;
    struct req_rec *over = submit(h, next_idn++, p, 10, 200); /* 210: fits 320, not 160 */
    struct req_rec *fits = submit(h, next_idn++, p, 10, 100);
    pump(h);
    expect_strict_refused(h, over);
    expect_output(fits, p, 10, 100, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    harness_close(h);
}

/* A strict request checked but left waiting (too few free blocks) is checked again when it is
 * admitted: a pin taken while it waited would otherwise end it by the context below its
 * max_tokens (the check had been marked done at its first look). */
static void test_strict_checked_when_admitted(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 40; /* 320 tokens of 8-token blocks */
    struct harness *h = harness_open(&su);
    int32_t big[310], sys[160], p[10];
    make_prompt(41, 310, big); /* 39 blocks: nothing left for another */
    make_prompt(42, 160, sys); /* a pin of 20 blocks: 160 tokens left */
    make_prompt(43, 10, p);
    h->tenant = "bob";
    struct req_rec *a = submit(h, next_idn++, big, 310, 10);
    h->strict_max_tokens = true;
    struct req_rec *over = submit(h, next_idn++, p, 10, 200); /* 210: fits 320, not 160 */
    exchange(h); /* a step: over is checked against 320 and waits for blocks */
    assert_int_equal(over->ends, 0);
    const struct pin_spec ps[] = {{"sys", sys, 160}};
    send_policy(h, 1, NULL, NULL, 0, NULL, 0, ps, 1);
    pump(h);
    assert_int_equal(a->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    expect_strict_refused(h, over);
    harness_close(h);
}

/* Pins together hold at most half the pool: a pin past that fails (PAGODA_EEXHAUSTED, said in
 * PolicyApplied), the others stay, and a later policy without the first lets a new one in. */
static void test_pins_capped_at_half_the_pool(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + 40;
    struct harness *h = harness_open(&su);
    int32_t a[120], b[120], c[40];
    make_prompt(41, 120, a); /* 15 blocks of 8 */
    make_prompt(42, 120, b); /* 15 more: 30 > 20 */
    make_prompt(43, 40, c);  /* 5 */
    const struct pin_spec two[] = {{"a", a, 120}, {"b", b, 120}, {"c", c, 40}};
    send_policy(h, 1, NULL, NULL, 0, NULL, 0, two, 3);
    pump(h);
    int ready = 0, capped = 0;
    for (size_t i = 0; i < h->applied->n_pins; i++) {
        const Pagoda__Internal__PinStatus *st = h->applied->pins[i];
        ready += st->ready;
        if (!st->ready) {
            assert_int_equal(st->error_code, PAGODA_EEXHAUSTED);
            assert_non_null(strstr(st->error_message, "more than half the pool"));
            capped++;
        }
    }
    assert_int_equal(ready, 2); /* a or b, and c */
    assert_int_equal(capped, 1);
    assert_true(stats(h).pinned_blocks <= 20);
    /* without a, b fits */
    const struct pin_spec one[] = {{"b", b, 120}, {"c", c, 40}};
    send_policy(h, 2, NULL, NULL, 0, NULL, 0, one, 2);
    pump(h);
    for (size_t i = 0; i < h->applied->n_pins; i++)
        assert_true(h->applied->pins[i]->ready);
    assert_int_equal(stats(h).pinned_blocks, 20);
    int32_t p[12];
    make_prompt(44, 12, p);
    ask(h, "alice", p, 12, 3); /* still serving */
    harness_close(h);
}

/* A tenant moved out of its sharing group mid-request: what its running request computes after
 * the move is not published in the group's namespace. */
static void test_moved_tenant_stops_publishing(void **state)
{
    (void)state;
    struct setup su = CACHE_SETUP;
    su.max_batched_tokens = 16;
    su.max_seqs = 16;
    su.max_steps_in_flight = 1; /* lock-step: two exchanges are two chunks */
    struct harness *h = harness_open(&su);
    const char *names[] = {"g:team", "t:alice"};
    const uint32_t quotas[] = {0, 0};
    const struct tenant_spec in_group[] = {{"alice", "g:team", 0, NULL},
                                           {"bob", "g:team", 0, NULL}};
    const struct tenant_spec moved[] = {{"alice", "t:alice", 0, NULL}, {"bob", "g:team", 0, NULL}};
    send_policy(h, 1, names, quotas, 2, in_group, 2, NULL, 0);
    int32_t p[80];
    make_prompt(71, 80, p);
    h->tenant = "alice";
    struct req_rec *a = submit(h, next_idn++, p, 80, 4);
    exchange(h);
    exchange(h); /* 32 of 80 prompt tokens: 4 blocks published in g:team */
    uint32_t before = ns_blocks(h, "g:team");
    assert_int_equal(before, 4);
    send_policy(h, 2, names, quotas, 2, moved, 2, NULL, 0);
    pump(h);
    expect_output(a, p, 80, 4, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH);
    assert_int_equal(ns_blocks(h, "g:team"), before);
    struct req_rec *b = ask(h, "bob", p, 80, 4);
    assert_int_equal(b->cached_tokens, 32);
    harness_close(h);
}

/* ---- the randomized run --------------------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15u;

static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

static void check_invariants(struct harness *h, long op)
{
    const char *why = NULL;
    if (scheduler_check_invariants(h->s, &why) != 0)
        fail_msg("after operation %ld: %s", op, why);
}

/* 100,000 operations (admit, step, finish by length or stop token, cancel, preempt under a
 * small pool, evict, flush, pin, unpin) over prompts that share prefixes, three tenants (two in
 * a group) and two pins; the invariants hold after every one, every output equals the
 * reference, and when all requests have ended and the cache is flushed and unpinned, every
 * block is free. */
/* The randomized run of test_randomized_invariants in a pool of num_blocks (and its null
 * block): max_ops operations, at least min_preemptions preemptions. */
static void randomized_run(int32_t num_blocks, long max_ops, uint64_t min_preemptions)
{
    struct setup su = CACHE_SETUP;
    su.num_blocks = 1 + num_blocks;
    su.max_seqs = 8;
    su.max_queued = 64;
    su.max_batched_tokens = 64;
    struct harness *h = harness_open(&su);
    h->fw.any_preemption = true; /* three tenants: memory's preemption takes from the biggest */
    const char *tenants[] = {"ann", "ben", "cat"};
    const char *names[] = {"g:ab", "t:cat"};
    const uint32_t quotas[] = {16, 8};
    int32_t base[4][64];
    for (int i = 0; i < 4; i++)
        make_prompt(11 + i, 64, base[i]);
    const struct tenant_spec ts[] = {
        {"ann", "g:ab", 3, "p0"}, {"ben", "g:ab", 0, "p1"}, {"cat", "t:cat", 2, "p0"}};
    const struct pin_spec pins_on[] = {{"p0", base[0], 24}, {"p1", base[1], 16}};
    uint64_t version = 1;
    send_policy(h, version, names, quotas, 2, ts, 3, pins_on, 2);
    struct req_rec *live[64];
    int32_t live_prompt[64][80];
    int live_n[64], live_max[64];
    int n_live = 0, submitted = 0;
    long ops = 0;
    bool pinned = true;
    while (ops < max_ops) {
        uint32_t op = rnd(100);
        if (h->n_reqs >= MAX_REQS - 72 && n_live == 0) {
            /* The harness's records are full and none is live: start over (ids stay unique). */
            h->n_reqs = 0;
            memset(h->rec_index, 0, sizeof(h->rec_index));
        }
        if (h->n_reqs >= MAX_REQS - 72 && op < 5)
            op = 50; /* no admissions until the live ones have ended */
        if (op < 5 && n_live < 64) {
            /* Admit: a prompt that shares a prefix with one of the bases, or not. */
            int k = n_live++;
            int n = 1 + (int)rnd(72);
            int share = (int)rnd(5);
            for (int i = 0; i < n; i++)
                live_prompt[k][i] = share < 4 && i < 48 ? base[share][i] : (int32_t)rnd(VOCAB);
            live_n[k] = n;
            live_max[k] = 1 + (int)rnd(24);
            h->tenant = tenants[rnd(3)];
            live[k] = submit(h, 10 + submitted++, live_prompt[k], n, live_max[k]);
        } else if (op < 80 || n_live > 40) {
            /* A step: the worker handles what is queued, its answers come back. */
            exchange(h);
            if (rnd(4) == 0)
                tick(h, h->now + 10);
        } else if (op < 85 && n_live > 0) {
            cancel(h, live[rnd((uint32_t)n_live)]);
        } else if (op < 90) {
            admin_call(h, false, rnd(2) ? "g:ab" : "t:cat");
        } else if (op < 93) {
            pinned = !pinned;
            send_policy(h, ++version, names, quotas, 2, ts, 3, pinned ? pins_on : NULL,
                        pinned ? 2 : 0);
        } else if (op < 97 && n_live < 64) {
            /* Pressure: a long unique prompt makes room by evicting or preempting. */
            int k = n_live++;
            live_n[k] = 60 + (int)rnd(20);
            for (int i = 0; i < live_n[k]; i++)
                live_prompt[k][i] = (int32_t)rnd(VOCAB);
            live_max[k] = 1 + (int)rnd(4);
            h->tenant = tenants[rnd(3)];
            live[k] = submit(h, 10 + submitted++, live_prompt[k], live_n[k], live_max[k]);
        } else {
            admin_call(h, true, NULL);
        }
        ops++;
        /* Forget the requests that ended, checking their outputs. */
        for (int i = 0; i < n_live;) {
            struct req_rec *r = live[i];
            if (r->ends == 0) {
                i++;
                continue;
            }
            if (r->finish == PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH)
                expect_output(r, live_prompt[i], live_n[i], live_max[i], r->finish);
            else
                assert_int_equal(r->finish, PAGODA__INTERNAL__FINISH_REASON__FINISH_CANCELLED);
            n_live--;
            live[i] = live[n_live];
            memcpy(live_prompt[i], live_prompt[n_live], sizeof(live_prompt[i]));
            live_n[i] = live_n[n_live];
            live_max[i] = live_max[n_live];
        }
        check_invariants(h, ops);
    }
    /* Drain, then let go of everything: nothing may be left. */
    pump(h);
    for (int guard = 0; n_live > 0 && guard < 100000; guard++) {
        exchange(h);
        tick(h, h->now + 10);
        for (int i = 0; i < n_live;)
            if (live[i]->ends) {
                live[i] = live[--n_live];
            } else {
                i++;
            }
    }
    assert_int_equal(n_live, 0);
    pump(h);
    send_policy(h, ++version, names, quotas, 2, ts, 3, NULL, 0);
    admin_call(h, false, "g:ab");
    admin_call(h, false, "t:cat");
    admin_call(h, true, NULL);
    for (size_t i = 0; i < h->admin->n_namespaces; i++)
        if (h->admin->namespaces[i]->cached_blocks > 0)
            admin_call(h, false, h->admin->namespaces[i]->name);
    check_invariants(h, ops);
    struct scheduler_stats st = stats(h);
    print_message("randomized: %ld operations, %d requests, %llu steps, %llu preemptions, %llu "
                  "evictions, %llu of %llu prompt tokens from the cache\n",
                  ops, submitted, (unsigned long long)st.steps, (unsigned long long)st.preemptions,
                  (unsigned long long)st.evictions, (unsigned long long)st.prefix_hit_tokens,
                  (unsigned long long)st.prefix_query_tokens);
    assert_true(st.preemptions >= min_preemptions);
    assert_true(st.prefix_hit_tokens > 0);
    assert_true(st.evictions > 0);
    assert_int_equal(st.running + st.waiting, 0);
    /* Nothing leaked: with every request ended, the tenants' namespaces flushed and no pin,
     * every block is free but those of the unpinned prefixes, which wait in the LRU (pinned
     * namespaces are not flushed, only unpinned), unused and evictable. */
    assert_int_equal(st.pinned_blocks, 0);
    assert_int_equal(st.deferred_blocks, 0);
    assert_int_equal(st.evictable_blocks, st.cached_blocks);
    assert_int_equal(st.free_blocks + (int32_t)st.cached_blocks, st.num_blocks);
    assert_true(st.kv_usage == 0.0);
    harness_close(h);
}

static void test_randomized_invariants(void **state)
{
    (void)state;
    randomized_run(40, 100000, 1);
}

/* The same under memory pressure (20 blocks for three tenants and their pins): dozens of
 * preemptions (53), memory's choice between tenants among them. */
static void test_randomized_invariants_under_pressure(void **state)
{
    (void)state;
    randomized_run(20, 40000, 30);
}

int main(void)
{
    log_set_level(LOG_OFF);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keys_and_namespaces),
        cmocka_unit_test(test_lru_leaves_first_and_pins),
        cmocka_unit_test(test_quota_first),
        cmocka_unit_test(test_flush_with_users),
        cmocka_unit_test(test_no_insert_under_flushed_parent),
        cmocka_unit_test(test_repeat_hits),
        cmocka_unit_test(test_shared_prefix_computed_once),
        cmocka_unit_test(test_prefix_wait_survives_cancel),
        cmocka_unit_test(test_prefix_wait_after_pin),
        cmocka_unit_test(test_prefix_wait_not_on_flushed_parent),
        cmocka_unit_test(test_isolation),
        cmocka_unit_test(test_sharing_group),
        cmocka_unit_test(test_pinned_prefix),
        cmocka_unit_test(test_pin_refused),
        cmocka_unit_test(test_empty_pin_named_twice),
        cmocka_unit_test(test_quota_flood),
        cmocka_unit_test(test_admissions_fair_between_tenants),
        cmocka_unit_test(test_places_fair_between_tenants),
        cmocka_unit_test(test_pins_take_their_turn),
        cmocka_unit_test(test_pins_win_every_other_tie),
        cmocka_unit_test(test_prefill_shared_between_tenants),
        cmocka_unit_test(test_prefix_wait_holds_only_its_tenant),
        cmocka_unit_test(test_prefill_share_left_unused_is_used),
        cmocka_unit_test(test_memory_preempts_the_biggest_tenant),
        cmocka_unit_test(test_memory_preemption_spares_the_oldest),
        cmocka_unit_test(test_flush),
        cmocka_unit_test(test_chunked_prefill_beside_decodes),
        cmocka_unit_test(test_preemption_with_cache),
        cmocka_unit_test(test_model_change_recomputes),
        cmocka_unit_test(test_pins_shrink_the_context),
        cmocka_unit_test(test_strict_checked_again_at_admission),
        cmocka_unit_test(test_fairness_checks_before_preempting),
        cmocka_unit_test(test_strict_checked_against_pins_being_computed),
        cmocka_unit_test(test_strict_checked_when_admitted),
        cmocka_unit_test(test_pins_capped_at_half_the_pool),
        cmocka_unit_test(test_moved_tenant_stops_publishing),
        cmocka_unit_test(test_randomized_invariants),
        cmocka_unit_test(test_randomized_invariants_under_pressure),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
