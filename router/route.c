/* Routing (route.h): the prefix map and the choice of an engine. Every engine owns a slice of one
 * preallocated pool of entries (max_entries each), kept on its own LRU list and found through one
 * hash table keyed by (prefix key, engine). Nothing here allocates after route_new. */
#include "router/route.h"

#include "common/error.h"

#include <stdlib.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#define NIL UINT32_MAX

struct entry {
    uint64_t key;
    uint32_t engine;
    uint32_t hash_next;  /* bucket chain, or the engine's free list */
    uint32_t prev, next; /* the engine's LRU list, most recent first */
};

struct engine_state {
    int up;
    uint32_t foreign;  /* running + waiting from its stats, less the router's requests then */
    uint32_t inflight; /* the router's unfinished requests on it */
    uint32_t head, tail, count, free_list;
};

struct route {
    enum route_mode mode;
    uint32_t num_engines, max_entries, block_tokens, cursor;
    uint64_t seed;
    struct engine_state *engines;
    struct entry *entries;
    uint32_t *buckets;
    uint64_t bucket_mask;
};

static uint64_t bucket_of(const struct route *rt, uint64_t key, uint32_t e)
{
    uint64_t h = (key ^ ((uint64_t)e * 0x9E3779B97F4A7C15ull)) * 0xBF58476D1CE4E5B9ull;
    return (h >> 29) & rt->bucket_mask;
}

static void engine_reset(struct route *rt, uint32_t e)
{
    struct engine_state *s = &rt->engines[e];
    uint32_t base = e * rt->max_entries;
    s->head = s->tail = NIL;
    s->count = 0;
    s->free_list = base;
    for (uint32_t i = 0; i < rt->max_entries; i++)
        rt->entries[base + i].hash_next = i + 1 < rt->max_entries ? base + i + 1 : NIL;
}

int route_new(uint32_t num_engines, enum route_mode mode, uint32_t max_entries, uint64_t seed,
              struct route **out)
{
    if (num_engines < 1 || num_engines > ROUTE_MAX_ENGINES || max_entries < 1 ||
        max_entries > (1u << 24) || (mode != ROUTE_CACHE_AWARE && mode != ROUTE_ROUND_ROBIN))
        return pagoda_error_set(PAGODA_EINVAL,
                                "route: 1..%u engines, 1..2^24 entries each (got %u, %u)",
                                ROUTE_MAX_ENGINES, num_engines, max_entries);
    size_t total = (size_t)num_engines * max_entries;
    size_t nb = 1024;
    while (nb < 2 * total)
        nb *= 2;
    struct route *rt = calloc(1, sizeof(*rt));
    if (rt == NULL)
        return PAGODA_ENOMEM;
    rt->engines = calloc(num_engines, sizeof(*rt->engines));
    rt->entries = malloc(total * sizeof(*rt->entries));
    rt->buckets = malloc(nb * sizeof(*rt->buckets));
    if (rt->engines == NULL || rt->entries == NULL || rt->buckets == NULL) {
        route_free(rt);
        return PAGODA_ENOMEM;
    }
    memset(rt->buckets, 0xff, nb * sizeof(*rt->buckets));
    rt->bucket_mask = nb - 1;
    rt->mode = mode;
    rt->num_engines = num_engines;
    rt->max_entries = max_entries;
    rt->block_tokens = ROUTE_DEFAULT_BLOCK_TOKENS;
    rt->seed = seed;
    for (uint32_t e = 0; e < num_engines; e++)
        engine_reset(rt, e);
    *out = rt;
    return 0;
}

void route_free(struct route *rt)
{
    if (rt == NULL)
        return;
    free(rt->engines);
    free(rt->entries);
    free(rt->buckets);
    free(rt);
}

int route_mode_parse(const char *text, enum route_mode *out)
{
    if (text != NULL && strcmp(text, "cache-aware") == 0)
        *out = ROUTE_CACHE_AWARE;
    else if (text != NULL && strcmp(text, "round-robin") == 0)
        *out = ROUTE_ROUND_ROBIN;
    else
        return pagoda_error_set(PAGODA_EINVAL,
                                "routing: \"cache-aware\" or \"round-robin\" (got \"%s\")",
                                text ? text : "");
    return 0;
}

const char *route_mode_name(enum route_mode mode)
{
    return mode == ROUTE_ROUND_ROBIN ? "round-robin" : "cache-aware";
}

/* ---- the prefix map ------------------------------------------------------------------------ */

static uint32_t find(const struct route *rt, uint64_t key, uint32_t e)
{
    for (uint32_t i = rt->buckets[bucket_of(rt, key, e)]; i != NIL; i = rt->entries[i].hash_next)
        if (rt->entries[i].key == key && rt->entries[i].engine == e)
            return i;
    return NIL;
}

static void lru_unlink(struct route *rt, uint32_t i)
{
    struct entry *x = &rt->entries[i];
    struct engine_state *s = &rt->engines[x->engine];
    if (x->prev != NIL)
        rt->entries[x->prev].next = x->next;
    else
        s->head = x->next;
    if (x->next != NIL)
        rt->entries[x->next].prev = x->prev;
    else
        s->tail = x->prev;
}

static void lru_push_front(struct route *rt, uint32_t i)
{
    struct entry *x = &rt->entries[i];
    struct engine_state *s = &rt->engines[x->engine];
    x->prev = NIL;
    x->next = s->head;
    if (s->head != NIL)
        rt->entries[s->head].prev = i;
    s->head = i;
    if (s->tail == NIL)
        s->tail = i;
}

static void bucket_remove(struct route *rt, uint32_t i)
{
    uint32_t *pp = &rt->buckets[bucket_of(rt, rt->entries[i].key, rt->entries[i].engine)];
    while (*pp != i)
        pp = &rt->entries[*pp].hash_next;
    *pp = rt->entries[i].hash_next;
}

/* Engine e holds key now: found and made the most recent, or added (the least recent going when
 * e holds max_entries). */
static void remember(struct route *rt, uint32_t e, uint64_t key)
{
    uint32_t i = find(rt, key, e);
    struct engine_state *s = &rt->engines[e];
    if (i != NIL) {
        lru_unlink(rt, i);
        lru_push_front(rt, i);
        return;
    }
    if (s->free_list != NIL) {
        i = s->free_list;
        s->free_list = rt->entries[i].hash_next;
        s->count++;
    } else {
        i = s->tail;
        lru_unlink(rt, i);
        bucket_remove(rt, i);
    }
    struct entry *x = &rt->entries[i];
    x->key = key;
    x->engine = e;
    uint64_t b = bucket_of(rt, key, e);
    x->hash_next = rt->buckets[b];
    rt->buckets[b] = i;
    lru_push_front(rt, i);
}

static void forget_engine(struct route *rt, uint32_t e)
{
    struct engine_state *s = &rt->engines[e];
    for (uint32_t i = s->head; i != NIL; i = rt->entries[i].next)
        bucket_remove(rt, i);
    engine_reset(rt, e);
}

/* The chained keys of the prompt's full chunks (at most ROUTE_MAX_BLOCKS); returns how many. */
static uint32_t prompt_keys(const struct route *rt, const char *ns, const int32_t *prompt,
                            uint32_t n, uint64_t *keys)
{
    uint64_t h = XXH3_64bits_withSeed(ns ? ns : "", ns ? strlen(ns) : 0, rt->seed);
    uint32_t nb = n / rt->block_tokens;
    if (nb > ROUTE_MAX_BLOCKS)
        nb = ROUTE_MAX_BLOCKS;
    for (uint32_t b = 0; b < nb; b++) {
        h = XXH3_64bits_withSeed(prompt + (size_t)b * rt->block_tokens,
                                 (size_t)rt->block_tokens * sizeof(*prompt), h);
        keys[b] = h;
    }
    return nb;
}

static uint32_t matched_of(const struct route *rt, uint32_t e, const uint64_t *keys, uint32_t nb)
{
    uint32_t m = 0;
    while (m < nb && find(rt, keys[m], e) != NIL)
        m++;
    return m;
}

/* ---- engines and their load ---------------------------------------------------------------- */

void route_set_block_tokens(struct route *rt, uint32_t tokens)
{
    if (tokens < 1 || tokens == rt->block_tokens)
        return;
    rt->block_tokens = tokens;
    for (uint32_t e = 0; e < rt->num_engines; e++)
        forget_engine(rt, e);
}

void route_set_up(struct route *rt, uint32_t e, int up)
{
    if (e >= rt->num_engines)
        return;
    struct engine_state *s = &rt->engines[e];
    if (s->up && !up) {
        forget_engine(rt, e);
        s->foreign = 0;
    }
    s->up = up != 0;
}

int route_is_up(const struct route *rt, uint32_t e)
{
    return e < rt->num_engines && rt->engines[e].up;
}

void route_set_engine_load(struct route *rt, uint32_t e, uint32_t load)
{
    if (e < rt->num_engines)
        rt->engines[e].foreign =
            load > rt->engines[e].inflight ? load - rt->engines[e].inflight : 0;
}

void route_charge(struct route *rt, uint32_t e)
{
    if (e < rt->num_engines)
        rt->engines[e].inflight++;
}

void route_release(struct route *rt, uint32_t e)
{
    if (e < rt->num_engines && rt->engines[e].inflight > 0)
        rt->engines[e].inflight--;
}

uint64_t route_load(const struct route *rt, uint32_t e)
{
    if (e >= rt->num_engines)
        return 0;
    /* The router's own unfinished requests, which it knows now, plus what its stats showed
     * beyond them (requests the router did not send: adopted after a restart until announced,
     * another client's): not the sum of the stats and the router's count, which counts the
     * router's requests twice and halves the busy margins. */
    return (uint64_t)rt->engines[e].inflight + rt->engines[e].foreign;
}

uint32_t route_entries(const struct route *rt, uint32_t e)
{
    return e < rt->num_engines ? rt->engines[e].count : 0;
}

uint32_t route_matched(const struct route *rt, uint32_t e, const char *ns, const int32_t *prompt,
                       uint32_t n)
{
    uint64_t keys[ROUTE_MAX_BLOCKS];
    if (e >= rt->num_engines)
        return 0;
    return matched_of(rt, e, keys, prompt_keys(rt, ns, prompt, n, keys));
}

/* ---- the choice ------------------------------------------------------------------------------ */

/* Whether engine e may be picked: up, and not in avoid (bit e). */
static int pickable(const struct route *rt, uint32_t e, uint64_t avoid)
{
    return rt->engines[e].up && !(avoid & (1ull << e));
}

/* The pickable engine that comes first from the cursor on among those with the lowest load
 * (every one when least_only is 0: the next in turn). */
static uint32_t next_in_turn(const struct route *rt, uint64_t avoid, int least_only)
{
    uint32_t best = NIL;
    for (uint32_t k = 0; k < rt->num_engines; k++) {
        uint32_t e = (rt->cursor + k) % rt->num_engines;
        if (!pickable(rt, e, avoid))
            continue;
        if (!least_only)
            return e;
        if (best == NIL || route_load(rt, e) < route_load(rt, best))
            best = e;
    }
    return best;
}

static int much_busier(uint64_t load, uint64_t least)
{
    return load > least + ROUTE_BUSY_ABS && (double)load > (double)least * ROUTE_BUSY_REL;
}

uint32_t route_pick(struct route *rt, const char *ns, const int32_t *prompt, uint32_t n,
                    uint32_t avoid, uint32_t *matched)
{
    uint64_t mask = avoid < rt->num_engines ? 1ull << avoid : 0;
    return route_pick_avoiding(rt, ns, prompt, n, mask, matched);
}

uint32_t route_pick_avoiding(struct route *rt, const char *ns, const int32_t *prompt, uint32_t n,
                             uint64_t avoid, uint32_t *matched)
{
    uint64_t keys[ROUTE_MAX_BLOCKS];
    uint32_t nb = prompt_keys(rt, ns, prompt, n, keys);
    uint32_t least = next_in_turn(rt, avoid, 1);
    if (matched != NULL)
        *matched = 0;
    if (least == NIL)
        return ROUTE_NONE;
    uint32_t pick = least, pick_matched = 0;
    if (rt->mode == ROUTE_ROUND_ROBIN) {
        pick = next_in_turn(rt, avoid, 0);
        pick_matched = matched_of(rt, pick, keys, nb);
    } else {
        uint32_t best = NIL, best_m = 0;
        for (uint32_t k = 0; k < rt->num_engines; k++) {
            uint32_t e = (rt->cursor + k) % rt->num_engines;
            if (!pickable(rt, e, avoid))
                continue;
            uint32_t m = matched_of(rt, e, keys, nb);
            if (m > best_m || (m == best_m && m > 0 && route_load(rt, e) < route_load(rt, best))) {
                best = e;
                best_m = m;
            }
        }
        if (best != NIL && !much_busier(route_load(rt, best), route_load(rt, least))) {
            pick = best;
            pick_matched = best_m;
        } else {
            pick_matched = matched_of(rt, least, keys, nb);
        }
    }
    rt->cursor = (pick + 1) % rt->num_engines;
    rt->engines[pick].inflight++;
    /* Leaves first, so that the shorter prefixes (shared by more prompts) are the most recent and
     * the last to go. */
    for (uint32_t b = nb; b-- > 0;)
        remember(rt, pick, keys[b]);
    if (matched != NULL)
        *matched = pick_matched;
    return pick;
}
