/* pagoda-bench's report: per-request records in, statistics out, as text and as JSON.
 *
 * Definitions (the report repeats them):
 * - A request is completed when the router accepted it and it finished with "stop" or
 *   "length"; every other request (refused at submit, a failed poll, finished "error" or
 *   "cancelled") is failed. Latencies and token rates count completed requests only; failures
 *   are counted by their error text.
 * - Times come from CLOCK_MONOTONIC. TTFT: from the start of the submit call to the arrival of
 *   the first output token. E2E: from the start of the submit call to the return of the last
 *   poll. TPOT: (E2E - TTFT) / (output tokens - 1), for requests of at least 2 tokens.
 *   Prefill throughput of a request: the prompt tokens it computed (prompt less cached, by its
 *   usage) over its TTFT (queueing included: what a client sees). ITL: per
 *   token, the arrival of a token minus the arrival of the one before; a poll that returns
 *   several tokens gives them all its arrival time, so all but the first have an ITL of 0 (the
 *   report counts these "shared" tokens).
 * - Percentiles: linear interpolation between closest ranks, numpy's default: for n sorted
 *   values x[0..n-1] and p in [0, 100], h = (n - 1) p / 100 and the percentile is
 *   x[floor(h)] + (h - floor(h)) (x[floor(h) + 1] - x[floor(h)]).
 * - Engine figures: counters are the difference of pagoda_stats() taken before and after the
 *   run; peak_kv_usage is the engine's own (since it started); kv usage, fragmentation and page
 *   locality are also sampled during the run. The engine's prefill and decode throughput are its
 *   prefill_tokens and decode_tokens deltas over the run's duration. */
#ifndef PAGODA_BENCH_REPORT_H
#define PAGODA_BENCH_REPORT_H

#include "client/pagoda.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Distinct failure texts kept; the rest are counted as "other". */
#define REPORT_MAX_FAILURE_KINDS 8
#define REPORT_ERROR_MAX 200
/* An open-loop request that starts this much after its arrival time is late (every client
 * thread was busy). */
#define REPORT_LATE_START_MS 10.0
/* The median TPOT measures the decode step only when polls see the steps one by one: beyond
 * this share of ITL samples in shared polls, the bandwidth floor is marked unreliable. */
#define REPORT_FLOOR_MAX_SHARED 0.1

#define REPORT_PERCENTILE_METHOD                                                                   \
    "linear interpolation between closest ranks (numpy's default): h = (n-1)p/100, "               \
    "x[floor(h)] + (h-floor(h))(x[floor(h)+1]-x[floor(h)])"

/* count, mean, min, p50, p90, p95, p99, max of a set of values; NAN (JSON null) when count
 * is 0. */
struct report_summary {
    size_t count;
    double mean, min, p50, p90, p95, p99, max;
};

/* One request as the driver saw it. Times are seconds after the run's start. */
struct report_request {
    uint32_t index, tenant;
    uint32_t prompt_len, max_tokens;
    double scheduled_s, start_s, end_s;
    int rc;                       /* the submit's or a poll's error, or 0 */
    char error[REPORT_ERROR_MAX]; /* with rc != 0 or a finish "error": why */
    pagoda_finish_reason finish_reason;
    int32_t *token_ids; /* num_tokens received, in order */
    double *token_s;    /* the arrival time of each */
    size_t num_tokens, cap_tokens;
    uint32_t polls;             /* polls that returned tokens */
    uint32_t multi_token_polls; /* of them, those that returned more than one */
    uint32_t max_poll_tokens;
    uint32_t prompt_tokens, completion_tokens, cached_tokens; /* the router's usage */
    int sent; /* the driver sent it (a --duration run leaves the rest unsent) */
};

/* Prepares r's token arrays for up to max_tokens tokens. Errors: PAGODA_ENOMEM. */
int report_request_reserve(struct report_request *r, size_t max_tokens);

/* Records one poll's n tokens, all arriving at t_s. Errors: PAGODA_ERANGE (more tokens than
 * reserved: the router sent more than max_tokens). */
int report_request_add_tokens(struct report_request *r, double t_s, const int32_t *ids, size_t n);

/* Frees r's arrays. Accepts NULL. */
void report_request_fini(struct report_request *r);

/* Whether r counts as completed (see above). */
int report_request_completed(const struct report_request *r);

/* The request's record as one JSON object (the --output-requests line): index, tenant, lengths,
 * times, ok, error, finish_reason, ttft_ms, tpot_ms, e2e_ms, itl_ms [...], polls,
 * output_tokens, token_ids [...], usage {...}. tenant_name may be NULL. On success *out is a
 * new reference. Errors: PAGODA_ENOMEM. */
int report_request_to_json(const struct report_request *r, const char *tenant_name, json_t **out);

/* The percentile p (0..100) of n sorted values, by the method above; NAN when n is 0. */
double report_percentile(const double *sorted, size_t n, double p);

/* Sorts values in place and summarises them into *out. */
void report_summarize(double *values, size_t n, struct report_summary *out);

/* What was run. Strings and arrays are borrowed: they must outlive the report. */
struct report_config {
    const char *workload;
    const char *workload_params; /* how its lengths are drawn, or NULL */
    double duration_limit_s;     /* --duration, or 0 */
    int workload_exhausted;      /* every request was sent before the duration ran out */
    size_t workload_requests;    /* the workload's size (requests sent may be fewer) */
    uint64_t seed;
    int open_loop;        /* 1: Poisson arrivals at rate; 0: closed loop */
    double rate;          /* requests/s; INFINITY: all at once */
    uint32_t concurrency; /* closed loop: clients; open loop: the cap on requests in flight */
    const char *const *tenant_names;
    uint32_t num_tenants;
    /* The bandwidth floor, when bandwidth_gbs > 0 (closed loop only). */
    double bandwidth_gbs;      /* GB/s (1e9 bytes) */
    double weight_bytes;       /* read once per decode step */
    double kv_bytes_per_token; /* K and V of one token, all layers */
    /* The workload's compute-and-bandwidth bound, when matrix_tflops > 0 and bandwidth_gbs > 0
     * (any loop): see report.c. */
    double matrix_tflops;   /* the measured matrix rate, 1e12 FLOP/s */
    double flops_per_token; /* through the layers (floor_flops_per_token) */
    double lm_head_flops;   /* one token's logits (floor_lm_head_flops) */
    double attention_flops_per_key;
    double baseline_output_tps; /* > 0: report output tokens/s as a ratio of it */
};

/* Engine figures around the run (pagoda_stats), and what a sampler saw during it. */
struct report_engine {
    int have_before, have_after;
    pagoda_engine_stats before, after;
    size_t samples;
    double kv_usage_max, fragmentation_sum, fragmentation_max;
    size_t fragmentation_samples; /* samples with blocks in use */
    double locality_sum, locality_min, run_length_sum;
    size_t locality_samples; /* samples with a running sequence */
    uint32_t running_max, waiting_max;
};

struct report_failure {
    char what[REPORT_ERROR_MAX];
    size_t count;
};

struct report_tenant {
    uint32_t requests, completed, failed;
    uint64_t input_tokens, output_tokens, cached_tokens;
    struct report_summary ttft_ms, e2e_ms;
};

struct report {
    struct report_config cfg;
    size_t num_requests, completed, failed;
    struct report_failure failures[REPORT_MAX_FAILURE_KINDS];
    size_t num_failure_kinds, failures_other;
    size_t usage_mismatches; /* completed requests whose usage disagrees with what arrived */
    double duration_s;       /* from the run's start to the end of its last request */
    uint64_t input_tokens, output_tokens; /* of completed requests */
    uint64_t failed_output_tokens;        /* received by failed requests */
    uint64_t cached_tokens;               /* usage.cached_tokens of completed requests */
    double request_throughput, input_tps, output_tps, total_tps, cached_fraction;
    struct report_summary ttft_ms, tpot_ms, itl_ms, e2e_ms;
    struct report_summary prefill_tps; /* per request: computed prompt tokens / TTFT */
    uint64_t polls, multi_token_polls, shared_tokens;
    uint32_t max_poll_tokens;
    double shared_fraction; /* shared tokens over ITL samples */
    size_t late_starts;
    double max_late_ms;
    /* Engine: deltas over the run (have_engine: stats were read before and after). */
    int have_engine;
    uint64_t prefix_query_tokens, prefix_hit_tokens, preemptions, steps, computed_tokens, evictions;
    double prefix_hit_rate; /* NAN when the engine reported no prefix lookups */
    double peak_kv_usage, kv_usage_max_sampled, fragmentation_mean, fragmentation_max,
        fragmentation_end;
    uint64_t prefill_tokens, decode_tokens; /* the engine's, deltas */
    double engine_prefill_tps, engine_decode_tps;
    double locality_mean, locality_min, run_length_mean; /* NAN: no sample */
    int engine_wide; /* the stats were the engine's (0: a tenant key's own figures) */
    int32_t num_blocks;
    uint32_t cached_blocks_end, running_max, waiting_max;
    size_t samples;
    /* The worker's GPU time (CUDA events; the CPU backend's executor CPU time) and wall time
     * per step over the run: the differences of the engine's counters (pagoda.h's
     * worker_step_*_us_total over worker_steps_timed: every worker's and every engine's step
     * results, so a restart in between changes nothing); NAN when not engine-wide or no step
     * result came. */
    uint64_t worker_steps_timed;
    double worker_step_device_ms, worker_step_wall_ms;
    /* The bandwidth floor (have_floor): decode_step_ms is the median ITL, decode_step_tpot_ms
     * the median TPOT beside it; see report.c. floor_reliable is 0 when too many tokens arrived
     * several to a poll for ITL to be the step time (REPORT_FLOOR_MAX_SHARED). */
    int have_floor, floor_reliable;
    double batch, mean_context, decode_step_ms, decode_step_tpot_ms, step_wall_ms,
        kv_bytes_per_step, floor_step_ms, floor_fraction;
    /* The workload bound (have_bound): prefill FLOPs at the matrix rate plus decode bytes at the
     * bandwidth; bound_fraction is bound_s over the measured duration. */
    int have_bound;
    double bound_prefill_flops, bound_decode_bytes, bound_decode_steps, bound_prefill_s,
        bound_decode_s, bound_s, bound_output_tps, bound_fraction;
    double baseline_ratio;         /* NAN without a baseline */
    struct report_tenant *tenants; /* cfg.num_tenants of them */
};

/* Computes the report of n requests. Errors: PAGODA_ENOMEM. *out is released with
 * report_fini in every case. */
int report_compute(const struct report_config *cfg, const struct report_request *reqs, size_t n,
                   const struct report_engine *engine, struct report *out);

/* Frees what report_compute allocated. Accepts NULL. */
void report_fini(struct report *r);

/* The human-readable report. */
void report_print(FILE *f, const struct report *r);

/* The report as JSON. On success *out is a new reference. Errors: PAGODA_ENOMEM. */
int report_to_json(const struct report *r, json_t **out);

#endif
