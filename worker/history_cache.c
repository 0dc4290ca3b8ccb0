#include "worker/history_cache.h"

#include "common/error.h"
#include "kernels/cpu/sampler.h"

#include <stdlib.h>
#include <string.h>

/* A region: the history of `key` at buf + off, its prompt then its outputs, room for cap
 * entries. key 0: an empty table entry. */
struct history_entry {
    uint64_t key;
    size_t off, cap, n_prompt, n_output;
};

/* A region's room: the history, a quarter more and a constant (a history that outgrows it moves
 * to a new region, copied whole: amortised, a few copies of each token). */
#define REGION_SLACK_MIN 256
/* Garbage tolerated before a use copies everything anew: more than the live regions plus this. */
#define COMPACT_MIN 65536

void history_cache_init(struct history_cache *h)
{
    memset(h, 0, sizeof(*h));
}

void history_cache_free(struct history_cache *h)
{
    free(h->buf);
    free(h->last);
    free(h->next);
    memset(h, 0, sizeof(*h));
}

static size_t hash_slot(uint64_t key, size_t slots)
{
    /* splitmix64's finaliser: keys are consecutive integers */
    key ^= key >> 30;
    key *= 0xbf58476d1ce4e5b9ull;
    key ^= key >> 27;
    key *= 0x94d049bb133111ebull;
    key ^= key >> 31;
    return (size_t)key & (slots - 1);
}

static struct history_entry *find(struct history_entry *t, size_t slots, uint64_t key)
{
    if (slots == 0)
        return NULL;
    for (size_t i = hash_slot(key, slots);; i = (i + 1) & (slots - 1)) {
        if (t[i].key == key)
            return &t[i];
        if (t[i].key == 0)
            return NULL;
    }
}

static struct history_entry *insert(struct history_entry *t, size_t slots, uint64_t key)
{
    size_t i = hash_slot(key, slots);
    while (t[i].key != 0)
        i = (i + 1) & (slots - 1);
    t[i].key = key;
    return &t[i];
}

/* Forgets every region: the next use copies everything. */
static void reset(struct history_cache *h)
{
    h->used = 0;
    if (h->last != NULL)
        memset(h->last, 0, h->slots * sizeof(*h->last));
}

/* Tables of at least 2 n slots (a power of two), the last use's entries carried over. */
static int reserve_tables(struct history_cache *h, size_t n)
{
    size_t want = 16;
    while (want < 2 * n)
        want *= 2;
    if (want <= h->slots)
        return 0;
    struct history_entry *last = calloc(want, sizeof(*last));
    struct history_entry *next = calloc(want, sizeof(*next));
    if (last == NULL || next == NULL) {
        free(last);
        free(next);
        return PAGODA_ENOMEM;
    }
    for (size_t i = 0; i < h->slots; i++)
        if (h->last[i].key != 0)
            *insert(last, want, h->last[i].key) = h->last[i];
    free(h->last);
    free(h->next);
    h->last = last;
    h->next = next;
    h->slots = want;
    return 0;
}

/* The region of the last use that row r can be brought up to date in, or NULL. */
static const struct history_entry *reusable(const struct history_cache *h,
                                            const struct sample_row *r, size_t tail)
{
    if (r->history_key == 0)
        return NULL;
    const struct history_entry *e = find(h->last, h->slots, r->history_key);
    if (e == NULL || e->n_prompt != r->n_prompt || r->n_output + tail < e->n_output ||
        r->n_prompt + r->n_output > e->cap)
        return NULL;
    return e;
}

static size_t region_cap(const struct sample_row *r)
{
    const size_t n = r->n_prompt + r->n_output;
    return n + n / 4 + REGION_SLACK_MIN;
}

/* Entries [from, n_prompt + n_output) of row r's history into buf + off. */
static void copy_from(struct history_cache *h, const struct sample_row *r, size_t off, size_t from)
{
    int32_t *p = h->buf + off;
    h->copied += r->n_prompt + r->n_output - from;
    if (from < r->n_prompt) {
        memcpy(p + from, r->prompt_tokens + from, (r->n_prompt - from) * sizeof(int32_t));
        from = r->n_prompt;
    }
    const size_t o = from - r->n_prompt;
    if (o < r->n_output)
        memcpy(p + from, r->output_tokens + o, (r->n_output - o) * sizeof(int32_t));
}

/* Whether row r's history is kept in this use (a key, not placed before in it: marked in
 * h->next), and the last use's region it can be brought up to date in (NULL: a new one). */
static int keep_row(struct history_cache *h, const struct sample_row *r, size_t tail,
                    const struct history_entry **e)
{
    *e = NULL;
    if (r->history_key == 0 || find(h->next, h->slots, r->history_key) != NULL)
        return 0;
    *e = reusable(h, r, tail);
    return 1;
}

/* dst = r with no history: its parameters read none (the Philox draw needs only the index). */
static void place_plain(struct sample_row *dst, const struct sample_row *r)
{
    *dst = *r;
    dst->prompt_tokens = dst->output_tokens = NULL;
    dst->n_prompt = dst->n_output = 0;
}

/* The room the live regions of this use take (*live) and what its new regions add (*fresh). */
static void measure(struct history_cache *h, const struct sample_row *src, size_t n, size_t tail,
                    size_t *live, size_t *fresh)
{
    *live = *fresh = 0;
    memset(h->next, 0, h->slots * sizeof(*h->next));
    for (size_t i = 0; i < n; i++) {
        if (!sampling_params_penalised(&src[i].params))
            continue;
        const struct history_entry *e;
        if (keep_row(h, &src[i], tail, &e))
            insert(h->next, h->slots, src[i].history_key)->cap = 0; /* a mark */
        *live += e != NULL ? e->cap : region_cap(&src[i]);
        *fresh += e != NULL ? 0 : region_cap(&src[i]);
    }
    memset(h->next, 0, h->slots * sizeof(*h->next));
}

int history_cache_place(struct history_cache *h, const struct sample_row *src,
                        struct sample_row *dst, size_t n, size_t tail)
{
    size_t penalised = 0;
    for (size_t i = 0; i < n; i++)
        penalised += sampling_params_penalised(&src[i].params) != 0;
    if (penalised == 0) { /* nothing travels, nothing is forgotten (a step that drops only) */
        for (size_t i = 0; i < n; i++)
            place_plain(&dst[i], &src[i]);
        return 0;
    }
    int rc = reserve_tables(h, n);
    if (rc != 0) {
        reset(h);
        return rc;
    }
    /* What the live regions need, and what new ones add after h->used; too much garbage: all
     * anew, packed. */
    size_t live, fresh;
    measure(h, src, n, tail, &live, &fresh);
    if (h->used + fresh > 2 * live + COMPACT_MIN) {
        reset(h);
        measure(h, src, n, tail, &live, &fresh);
    }
    if (h->used + fresh > h->cap) {
        size_t cap = h->cap ? h->cap : 1024;
        while (cap < h->used + fresh)
            cap *= 2;
        int32_t *buf = realloc(h->buf, cap * sizeof(int32_t));
        if (buf == NULL) {
            reset(h);
            return PAGODA_ENOMEM;
        }
        h->buf = buf;
        h->cap = cap;
    }
    memset(h->next, 0, h->slots * sizeof(*h->next));
    for (size_t i = 0; i < n; i++) {
        const struct sample_row *r = &src[i];
        struct sample_row *d = &dst[i];
        if (!sampling_params_penalised(&r->params)) {
            place_plain(d, r);
            continue;
        }
        *d = *r;
        const struct history_entry *e;
        const int kept = keep_row(h, r, tail, &e);
        struct history_entry region;
        if (e != NULL) {
            region = *e;
            size_t o = e->n_output < r->n_output ? e->n_output : r->n_output;
            o = o > tail ? o - tail : 0;
            copy_from(h, r, region.off, r->n_prompt + o);
        } else {
            region.off = h->used;
            region.cap = region_cap(r);
            h->used += region.cap;
            copy_from(h, r, region.off, 0);
        }
        region.key = r->history_key;
        region.n_prompt = r->n_prompt;
        region.n_output = r->n_output;
        if (kept)
            *insert(h->next, h->slots, r->history_key) = region;
        d->prompt_tokens = h->buf + region.off;
        d->output_tokens = h->buf + region.off + r->n_prompt;
    }
    struct history_entry *t = h->last;
    h->last = h->next;
    h->next = t;
    return 0;
}
