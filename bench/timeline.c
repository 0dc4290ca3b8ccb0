#include "bench/timeline.h"

#include "common/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The window of time t (clamped to the last one). */
static size_t window_of(double t, double interval, size_t n)
{
    if (!(t > 0))
        return 0;
    size_t k = (size_t)(t / interval);
    return k < n ? k : n - 1;
}

/* Appends v to the k-th of n growable lists (flat storage: lists[k] has cnt[k] of cap[k]). */
static int push(double **lists, size_t *cnt, size_t *cap, size_t k, double v)
{
    if (cnt[k] == cap[k]) {
        size_t c = cap[k] ? cap[k] * 2 : 16;
        double *p = realloc(lists[k], c * sizeof(double));
        if (p == NULL)
            return PAGODA_ENOMEM;
        lists[k] = p;
        cap[k] = c;
    }
    lists[k][cnt[k]++] = v;
    return 0;
}

static void request_figures(struct timeline_window *w, size_t nw, double interval,
                            const struct report_request *reqs, size_t n_reqs, double **ttft,
                            size_t *nt, size_t *ct, double **tpot, size_t *np, size_t *cp, int *rc)
{
    for (size_t i = 0; *rc == 0 && i < n_reqs; i++) {
        const struct report_request *r = &reqs[i];
        w[window_of(r->start_s, interval, nw)].started++;
        size_t ke = window_of(r->end_s, interval, nw);
        int ok = report_request_completed(r);
        if (ok)
            w[ke].completed++;
        else
            w[ke].failed++;
        for (size_t k = 0; k < r->num_tokens; k++)
            w[window_of(r->token_s[k], interval, nw)].output_tokens++;
        if (!ok || r->num_tokens == 0)
            continue;
        *rc = push(ttft, nt, ct, window_of(r->token_s[0], interval, nw),
                   (r->token_s[0] - r->start_s) * 1e3);
        if (*rc == 0 && r->num_tokens > 1)
            *rc = push(tpot, np, cp, ke,
                       (r->end_s - r->token_s[0]) * 1e3 / (double)(r->num_tokens - 1));
    }
}

static void sample_figures(struct timeline_window *w, size_t nw, const struct timeline_sample *s,
                           size_t ns, const struct timeline_stats *base)
{
    size_t i = 0;
    /* The last sample before the window (at first the stats read just before the run, t = 0),
     * and its time. */
    const struct timeline_stats *before = base;
    double before_t = 0;
    for (size_t k = 0; k < nw; k++) {
        struct timeline_window *x = &w[k];
        double frag = 0, loc = 0, run = 0;
        size_t nfrag = 0, nloc = 0;
        const struct timeline_stats *first = NULL, *last = NULL;
        double first_t = 0, last_t = 0;
        for (; i < ns && (k == nw - 1 || s[i].t_s < x->t1_s); i++) {
            const struct timeline_stats *st = &s[i].st;
            if (first == NULL) {
                first = st;
                first_t = s[i].t_s;
            }
            last = st;
            last_t = s[i].t_s;
            x->samples++;
            if (isnan(x->kv_usage_max) || st->kv_usage > x->kv_usage_max)
                x->kv_usage_max = st->kv_usage;
            if (st->num_blocks > 0 && st->free_blocks < st->num_blocks) {
                frag += st->fragmentation;
                nfrag++;
            }
            if (st->running > 0 && !st->tenant_key) { /* a tenant's stats have none */
                loc += st->locality;
                run += st->locality_run_length;
                nloc++;
            }
            if (st->running > x->running_max)
                x->running_max = st->running;
            if (st->waiting > x->waiting_max)
                x->waiting_max = st->waiting;
        }
        x->fragmentation_mean = nfrag ? frag / (double)nfrag : NAN;
        x->locality_mean = nloc ? loc / (double)nloc : NAN;
        x->run_length_mean = nloc ? run / (double)nloc : NAN;
        if (last != NULL) {
            const struct timeline_stats *b = before ? before : first;
            double span = last_t - (before ? before_t : first_t); /* what the deltas cover */
            x->have_counters = 1;
#define DELTA(f) (last->f >= b->f ? last->f - b->f : 0)
            x->prefix_query_tokens = DELTA(prefix_query_tokens);
            x->prefix_hit_tokens = DELTA(prefix_hit_tokens);
            x->evictions = DELTA(evictions);
            x->preemptions = DELTA(preemptions);
            x->prefill_tokens = DELTA(prefill_tokens);
            x->decode_tokens = DELTA(decode_tokens);
#undef DELTA
            x->hit_rate = x->prefix_query_tokens
                              ? (double)x->prefix_hit_tokens / (double)x->prefix_query_tokens
                              : NAN;
            int engine_wide = !last->tenant_key;
            x->prefill_tps = span > 0 && engine_wide ? (double)x->prefill_tokens / span : NAN;
            x->decode_tps = span > 0 && engine_wide ? (double)x->decode_tokens / span : NAN;
            before = last;
            before_t = last_t;
        }
    }
}

void timeline_stats_of(const pagoda_engine_stats *s, struct timeline_stats *out)
{
    *out = (struct timeline_stats){
        .running = s->running,
        .waiting = s->waiting,
        .num_blocks = s->num_blocks,
        .free_blocks = s->free_blocks,
        .kv_usage = s->kv_usage,
        .fragmentation = s->fragmentation,
        .locality = s->locality,
        .locality_run_length = s->locality_run_length,
        .prefix_query_tokens = s->prefix_query_tokens,
        .prefix_hit_tokens = s->prefix_hit_tokens,
        .evictions = s->evictions,
        .preemptions = s->preemptions,
        .prefill_tokens = s->prefill_tokens,
        .decode_tokens = s->decode_tokens,
        .tenant_key = s->tenant[0] != '\0',
    };
}

int timeline_compute(const struct timeline_sample *samples, size_t n_samples,
                     const pagoda_engine_stats *base, const struct report_request *reqs,
                     size_t n_reqs, double interval_s, double end_s, struct timeline_window **out,
                     size_t *n_out, double *used_interval_s)
{
    *out = NULL;
    *n_out = 0;
    if (!(interval_s > 0) || !isfinite(end_s))
        return pagoda_error_set(PAGODA_EINVAL, "timeline: interval %g s over %g s", interval_s,
                                end_s);
    double interval = interval_s;
    if (end_s / interval > (double)TIMELINE_MAX_WINDOWS)
        interval = end_s / (double)TIMELINE_MAX_WINDOWS;
    size_t nw = end_s > 0 ? (size_t)ceil(end_s / interval) : 1;
    if (nw == 0)
        nw = 1;
    struct timeline_window *w = calloc(nw, sizeof(*w));
    double **ttft = calloc(nw, sizeof(*ttft)), **tpot = calloc(nw, sizeof(*tpot));
    size_t *cnt = calloc(4 * nw, sizeof(size_t));
    int rc = w && ttft && tpot && cnt ? 0 : PAGODA_ENOMEM;
    for (size_t k = 0; rc == 0 && k < nw; k++) {
        w[k].t0_s = (double)k * interval;
        w[k].t1_s = (double)(k + 1) * interval;
        w[k].kv_usage_max = NAN;
        w[k].hit_rate = w[k].prefill_tps = w[k].decode_tps = NAN;
    }
    if (rc == 0) {
        size_t *nt = cnt, *ct = cnt + nw, *np = cnt + 2 * nw, *cp = cnt + 3 * nw;
        request_figures(w, nw, interval, reqs, n_reqs, ttft, nt, ct, tpot, np, cp, &rc);
        for (size_t k = 0; rc == 0 && k < nw; k++) {
            /* The last window ends with the run, usually before its nominal end. */
            double len = (w[k].t1_s < end_s ? w[k].t1_s : end_s) - w[k].t0_s;
            w[k].output_tps = len > 0 ? (double)w[k].output_tokens / len : NAN;
            report_summarize(ttft[k], nt[k], &w[k].ttft_ms);
            report_summarize(tpot[k], np[k], &w[k].tpot_ms);
        }
        struct timeline_stats base_figures;
        if (base != NULL)
            timeline_stats_of(base, &base_figures);
        if (rc == 0)
            sample_figures(w, nw, samples, n_samples, base ? &base_figures : NULL);
    }
    for (size_t k = 0; k < nw && ttft && tpot; k++) {
        free(ttft[k]);
        free(tpot[k]);
    }
    free(ttft);
    free(tpot);
    free(cnt);
    if (rc != 0) {
        free(w);
        return rc;
    }
    *out = w;
    *n_out = nw;
    if (used_interval_s)
        *used_interval_s = interval;
    return 0;
}

static json_t *jnum(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

int timeline_to_json(const struct timeline_window *w, size_t n, json_t **out)
{
    json_t *arr = json_array();
    int bad = arr == NULL;
    for (size_t k = 0; !bad && k < n; k++) {
        const struct timeline_window *x = &w[k];
        json_t *o = json_pack(
            "{s:o, s:o, s:I, s:I, s:I, s:I, s:o, s:{s:I, s:o, s:o, s:o}, s:{s:I, s:o, s:o, s:o}, "
            "s:I, s:o, s:o, s:o, s:o, s:I, s:I}",
            "t0_s", jnum(x->t0_s), "t1_s", jnum(x->t1_s), "started", (json_int_t)x->started,
            "completed", (json_int_t)x->completed, "failed", (json_int_t)x->failed, "output_tokens",
            (json_int_t)x->output_tokens, "output_tps", jnum(x->output_tps), "ttft_ms", "count",
            (json_int_t)x->ttft_ms.count, "p50", jnum(x->ttft_ms.p50), "p95", jnum(x->ttft_ms.p95),
            "p99", jnum(x->ttft_ms.p99), "tpot_ms", "count", (json_int_t)x->tpot_ms.count, "p50",
            jnum(x->tpot_ms.p50), "p95", jnum(x->tpot_ms.p95), "p99", jnum(x->tpot_ms.p99),
            "samples", (json_int_t)x->samples, "kv_usage_max", jnum(x->kv_usage_max),
            "fragmentation_mean", jnum(x->fragmentation_mean), "locality_mean",
            jnum(x->locality_mean), "run_length_mean", jnum(x->run_length_mean), "running_max",
            (json_int_t)x->running_max, "waiting_max", (json_int_t)x->waiting_max);
        json_t *c =
            x->have_counters
                ? json_pack("{s:I, s:I, s:o, s:I, s:I, s:I, s:I, s:o, s:o}", "prefix_query_tokens",
                            (json_int_t)x->prefix_query_tokens, "prefix_hit_tokens",
                            (json_int_t)x->prefix_hit_tokens, "hit_rate", jnum(x->hit_rate),
                            "evictions", (json_int_t)x->evictions, "preemptions",
                            (json_int_t)x->preemptions, "prefill_tokens",
                            (json_int_t)x->prefill_tokens, "decode_tokens",
                            (json_int_t)x->decode_tokens, "prefill_tps", jnum(x->prefill_tps),
                            "decode_tps", jnum(x->decode_tps))
                : json_null();
        if (o == NULL || c == NULL || json_object_set_new(o, "engine", c) != 0 ||
            json_array_append_new(arr, o) != 0) {
            if (o == NULL)
                json_decref(c);
            bad = 1;
        }
    }
    if (bad) {
        json_decref(arr);
        return PAGODA_ENOMEM;
    }
    *out = arr;
    return 0;
}

void timeline_print(FILE *f, const struct timeline_window *w, size_t n)
{
    fprintf(f, "%8s %6s %9s %9s %9s %6s %6s %6s %6s %6s %6s %5s\n", "t (s)", "done", "out tok/s",
            "TTFT p99", "TPOT p99", "KV", "frag", "local", "hit", "evict", "preem", "run");
    for (size_t k = 0; k < n; k++) {
        const struct timeline_window *x = &w[k];
        fprintf(f, "%8.1f %6u %9.1f %9.1f %9.2f %6.3f %6.3f %6.3f %6.3f %6llu %6llu %5u\n", x->t1_s,
                x->completed, x->output_tps, x->ttft_ms.p99, x->tpot_ms.p99, x->kv_usage_max,
                x->fragmentation_mean, x->locality_mean, x->hit_rate,
                (unsigned long long)x->evictions, (unsigned long long)x->preemptions,
                x->running_max);
    }
}
