/* pagoda-bench's timeline: a long run cut into windows of a few seconds, each with the figures
 * that show drift (issue: "the seeds' one report"): from the requests, the output tokens that
 * arrived in the window, the TTFT of requests whose first token arrived in it and the TPOT of
 * requests that ended in it (p50, p95, p99); from the engine's stats sampled during the run, KV
 * usage (max), fragmentation and page locality (means over the window's samples), and the
 * window's prefix hit rate, evictions, preemptions, prefill and decode tokens (counter deltas
 * from the last sample before the window, or the stats read just before the run, to the
 * window's last sample; their rates per second of the time between those two samples). Client
 * rates are per second of the window's part of the run (the last window ends with the run).
 *
 * A pure module: samples and requests in, windows out. */
#ifndef PAGODA_BENCH_TIMELINE_H
#define PAGODA_BENCH_TIMELINE_H

#include "bench/report.h"
#include "client/pagoda.h"

#include <jansson.h>
#include <stddef.h>
#include <stdio.h>

/* Samples one run keeps, at most (at the default 200 ms interval: 58 hours). */
#define TIMELINE_MAX_SAMPLES (1u << 20)
/* Windows one run has, at most (longer runs get longer windows: see timeline_compute). */
#define TIMELINE_MAX_WINDOWS 4096u

/* The figures of one pagoda_stats sample that the windows use: pagoda_engine_stats' scalars,
 * not its per-engine array (about 12 KiB, which a sample every 200 ms would keep for the whole
 * run). tenant_key: the figures were a tenant key's own (pagoda_engine_stats.tenant not ""). */
struct timeline_stats {
    uint32_t running, waiting;
    int32_t num_blocks, free_blocks;
    double kv_usage, fragmentation, locality, locality_run_length;
    uint64_t prefix_query_tokens, prefix_hit_tokens, evictions, preemptions, prefill_tokens,
        decode_tokens;
    int tenant_key;
};

/* The timeline's figures of a stats reply. */
void timeline_stats_of(const pagoda_engine_stats *s, struct timeline_stats *out);

/* One pagoda_stats sample, t_s seconds after the run's start. */
struct timeline_sample {
    double t_s;
    struct timeline_stats st;
};

struct timeline_window {
    double t0_s, t1_s;
    uint32_t started, completed, failed; /* requests started / ended in the window */
    uint64_t output_tokens;              /* that arrived in the window (any request) */
    double output_tps;
    struct report_summary ttft_ms, tpot_ms;
    size_t samples;
    double kv_usage_max, fragmentation_mean, locality_mean, run_length_mean; /* NAN: no sample */
    uint32_t running_max, waiting_max;
    int have_counters; /* at least one sample in the window */
    uint64_t prefix_query_tokens, prefix_hit_tokens, evictions, preemptions, prefill_tokens,
        decode_tokens;
    double hit_rate, prefill_tps, decode_tps; /* NAN without counters (or no lookups) */
};

/* Cuts [0, end_s) into windows of interval_s seconds (longer when that would exceed
 * TIMELINE_MAX_WINDOWS: the interval is then stretched, and *used_interval_s says to what) and
 * fills them from n_samples samples (in time order), base (the stats read at t = 0, or NULL:
 * the first window's counters then start at its first sample) and n_reqs requests. On success
 * *out (free()) holds *n_out windows. Errors: PAGODA_EINVAL (interval_s <= 0 or end_s not
 * finite), PAGODA_ENOMEM. */
int timeline_compute(const struct timeline_sample *samples, size_t n_samples,
                     const pagoda_engine_stats *base, const struct report_request *reqs,
                     size_t n_reqs, double interval_s, double end_s, struct timeline_window **out,
                     size_t *n_out, double *used_interval_s);

/* The windows as a JSON array of objects (the fields above; NAN as null). On success *out is a
 * new reference. Errors: PAGODA_ENOMEM. */
int timeline_to_json(const struct timeline_window *w, size_t n, json_t **out);

/* The windows as a text table. */
void timeline_print(FILE *f, const struct timeline_window *w, size_t n);

#endif
