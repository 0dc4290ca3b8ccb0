/* Routing: which engine (a scheduler with its workers and KV pool) a request goes to, when the
 * router fronts several. A pure state machine (no NNG, no loop, no clock), like the registry:
 * the router tells it which engines are up, their load and block size, and asks it for an
 * engine per request.
 *
 * Cache-aware mode (the default; SGLang's cache-aware router is the model): the router keeps an
 * approximate map of the prefixes each engine has cached, per tenancy namespace. A prompt is cut
 * into block-aligned chunks of block_tokens tokens; chunk i's key is a hash chained over the
 * namespace and chunks 0..i, so a key names a whole prefix and a prefix seen in one namespace
 * never matches in another (tenants stay isolated, unless they share a group's namespace, as the
 * scheduler's prefix cache does). Every engine holds at most max_entries keys, the least recently
 * used going first (its cache evicts too; the map is a guess, never the truth). A request goes to
 * the up engine with the longest cached prefix (ties: the less loaded, then the next in turn),
 * unless that engine is much busier than the least loaded one:
 *     load(best) > load(least) + ROUTE_BUSY_ABS  and  load(best) > load(least) * ROUTE_BUSY_REL
 * in which case (or when no engine has any of the prefix) it goes to the least loaded up engine
 * (ties in turn). An engine's load is the requests the router sent it that have not finished
 * plus what its last stats' running + waiting showed beyond those (the stats count the router's
 * requests too: adding the two counted them twice). The chosen engine is then credited with the
 * prompt's chunks (it will cache them).
 *
 * Round-robin mode (for comparison): the next up engine in turn, whatever the prompts.
 *
 * Errors: PAGODA_EINVAL, PAGODA_ENOMEM (route_init only). */
#ifndef PAGODA_ROUTER_ROUTE_H
#define PAGODA_ROUTER_ROUTE_H

#include <stdint.h>

/* The most engines one router fronts. */
#define ROUTE_MAX_ENGINES 64u
/* Prefix keys remembered per engine (LRU beyond). */
#define ROUTE_DEFAULT_MAX_ENTRIES 16384u
/* The chunks of a prompt looked at: a longer prompt is routed on its first ROUTE_MAX_BLOCKS. */
#define ROUTE_MAX_BLOCKS 512u
/* The chunk size until an engine reports its block size. */
#define ROUTE_DEFAULT_BLOCK_TOKENS 16u
/* "Much busier": both an absolute and a relative margin over the least loaded engine (SGLang's
 * balance_abs_threshold and balance_rel_threshold, with its defaults). */
#define ROUTE_BUSY_ABS 32u
#define ROUTE_BUSY_REL 1.5
/* No engine. */
#define ROUTE_NONE UINT32_MAX

enum route_mode {
    ROUTE_CACHE_AWARE = 0,
    ROUTE_ROUND_ROBIN = 1,
};

struct route;

/* A routing table for num_engines engines (1..ROUTE_MAX_ENGINES), all down, none loaded, each
 * remembering at most max_entries prefix keys (>= 1). seed keys the hashes. Released with
 * route_free. Errors: PAGODA_EINVAL, PAGODA_ENOMEM. */
int route_new(uint32_t num_engines, enum route_mode mode, uint32_t max_entries, uint64_t seed,
              struct route **out);
void route_free(struct route *rt);

/* Parses "cache-aware" or "round-robin". Errors: PAGODA_EINVAL. */
int route_mode_parse(const char *text, enum route_mode *out);
const char *route_mode_name(enum route_mode mode);

/* The chunk size, in tokens (>= 1): the engines' block size. A change forgets every prefix (the
 * keys no longer mean the same chunks). */
void route_set_block_tokens(struct route *rt, uint32_t tokens);
/* Engine e is up (its link is there and answers) or not. An engine that goes down forgets what it
 * had cached as far as the map knows (a restarted scheduler starts empty). */
void route_set_up(struct route *rt, uint32_t e, int up);
int route_is_up(const struct route *rt, uint32_t e);
/* Engine e's running + waiting from its latest stats (what exceeds the router's unfinished
 * requests on it then is kept as load the router did not send). */
void route_set_engine_load(struct route *rt, uint32_t e, uint32_t load);
/* A request already on e is counted in its load (one the router did not pick: adopted from e's
 * announcement after a router restart). */
void route_charge(struct route *rt, uint32_t e);
/* A request the router sent to e finished or moved away (the router's own count). */
void route_release(struct route *rt, uint32_t e);
/* Engine e's load as routing sees it: the router's unfinished requests on it plus what its
 * stats showed beyond them. */
uint64_t route_load(const struct route *rt, uint32_t e);

/* Picks the engine for a prompt of n tokens in namespace ns (a NUL-terminated name), other than
 * avoid (ROUTE_NONE: any), credits it with the request (its load) and with the prompt's chunks,
 * and returns it; *matched (may be NULL) gets the chunks it was thought to hold. ROUTE_NONE when
 * no engine is up (nothing changes). */
uint32_t route_pick(struct route *rt, const char *ns, const int32_t *prompt, uint32_t n,
                    uint32_t avoid, uint32_t *matched);
/* The same, avoiding every engine whose bit is set in avoid (bit e: engine e). */
uint32_t route_pick_avoiding(struct route *rt, const char *ns, const int32_t *prompt, uint32_t n,
                             uint64_t avoid, uint32_t *matched);
/* The chunks of the prompt that engine e is thought to hold (a lookup: nothing changes). */
uint32_t route_matched(const struct route *rt, uint32_t e, const char *ns, const int32_t *prompt,
                       uint32_t n);
/* Prefix keys engine e holds now (<= max_entries). */
uint32_t route_entries(const struct route *rt, uint32_t e);

#endif
