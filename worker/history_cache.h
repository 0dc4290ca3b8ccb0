/* The executor's copies of penalised rows' token histories (prompt + outputs), kept between the
 * uses of one step slot so that each use copies only what changed.
 *
 * The executor copies a prepared step out of the mirror on the event loop (worker/executor.c
 * copy_step), since the mirror's arrays change as soon as the next step is prepared. A history
 * is the whole sequence: copied whole every step, 256 penalised rows of 64k tokens would be 64 MiB
 * a step on the event loop. But a history key (struct sample_row history_key) names one
 * sequence's history for as long as the backend is open: one prompt, outputs only appended;
 * only its last few outputs change in place (the pending tokens of steps in flight, replaced
 * when they resolve; a failed row drops its sequence and a failed step leads to a resync, which
 * gives every sequence a new key; the executor's own copy also has them replaced by gathers).
 * So a slot keeps each history it copied in a region of its buffer (with
 * room to grow), and the next use of the slot that brings the same key, prompt length and an
 * output count no more than `tail` below the one copied copies only the outputs from `tail`
 * before the shorter of the two counts onward: O(new tokens + tail) a row, not O(history).
 * Regions of keys not seen in a use are dropped (a use without penalised rows changes nothing);
 * when the buffer holds more than twice what the live regions need (plus a constant), the use
 * copies everything anew, packed. Host memory: up to about 3x the live histories a slot
 * (regions a quarter larger than their histories, the garbage allowed, the buffer's doubling).
 *
 * A pure library (no threads, no I/O): one cache per slot, used by one thread at a time. */
#ifndef PAGODA_WORKER_HISTORY_CACHE_H
#define PAGODA_WORKER_HISTORY_CACHE_H

#include "worker/backend.h"

#include <stddef.h>
#include <stdint.h>

struct history_entry; /* private */

struct history_cache {
    int32_t *buf; /* the regions */
    size_t cap;   /* entries of buf */
    size_t used;  /* entries up to the end of the last region placed */
    /* Open-addressing tables of key -> region, `slots` entries each (a power of two or 0): the
     * last use's, and the one being built. */
    struct history_entry *last, *next;
    size_t slots;
    uint64_t copied; /* entries copied by all uses: for tests and statistics */
};

/* An empty cache (all zero is one too). */
void history_cache_init(struct history_cache *h);
void history_cache_free(struct history_cache *h);

/* For each of the n rows src[i]: dst[i] = src[i], and for a penalised row (its parameters
 * read a history: sampling_params_penalised) prompt_tokens and output_tokens point at this
 * cache's copy of the history, which equals src's when this returns (and which the caller may
 * change in its last `tail` outputs until the next use); other rows get NULL histories with
 * counts 0 (nothing travels). Rows with history key 0 or a key already placed in this use are
 * copied whole and not kept. dst's pointers stay valid until the next use or
 * history_cache_free. Returns 0 or PAGODA_ENOMEM (then dst is unspecified and the cache holds no
 * history: the next use copies everything). */
int history_cache_place(struct history_cache *h, const struct sample_row *src,
                        struct sample_row *dst, size_t n, size_t tail);

#endif
