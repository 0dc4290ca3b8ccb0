/* Prometheus' text exposition format, version 0.0.4 (what `/metrics` serves with Content-Type
 * METRICS_CONTENT_TYPE): families of counters, gauges and histograms with their HELP and TYPE
 * lines, samples with label sets, rendered into a growable, bounded buffer; and a histogram that
 * records observations into fixed buckets (no allocation, no lock: one owner, the loop thread).
 *
 * Rendering is a sequence of calls, each family's samples right after its header:
 *
 *   metrics_family(&b, "pagoda_generation_tokens_total", METRICS_COUNTER, "Tokens generated.");
 *   metrics_sample(&b, labels, 1, 1234);
 *   metrics_family(&b, "pagoda_time_to_first_token_seconds", METRICS_HISTOGRAM, "...");
 *   metrics_histogram(&b, labels, 1, &ttft);
 *
 * Errors are sticky: the first failure is kept in the buffer and every later call returns it,
 * so that a renderer may check once at the end. Names are checked (metric names
 * [a-zA-Z_:][a-zA-Z0-9_:]*, label names [a-zA-Z_][a-zA-Z0-9_]*, not starting with "__", "le"
 * reserved for buckets); label values and HELP texts are escaped as the format says. Counters'
 * names should end in "_total" and every family should appear once: the caller's duty
 * (`promtool check metrics` says so when not). */
#ifndef PAGODA_METRICS_METRICS_H
#define PAGODA_METRICS_METRICS_H

#include <stddef.h>
#include <stdint.h>

#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"
/* The longest metric or label name. */
#define METRICS_MAX_NAME 128
/* The most bucket bounds of a histogram (+Inf comes on top). */
#define METRICS_MAX_BUCKETS 40

enum metrics_type { METRICS_COUNTER, METRICS_GAUGE, METRICS_HISTOGRAM };

struct metrics_label {
    const char *name;
    const char *value; /* any bytes but NUL; escaped when rendered */
};

/* The text being rendered. Read data[0..len) (NUL-terminated) once rendering is done. */
struct metrics_buf {
    char *data;
    size_t len, cap, max_bytes;
    int err;
    char family[METRICS_MAX_NAME + 1];
    enum metrics_type type;
};

/* An empty buffer that grows up to max_bytes (PAGODA_EEXHAUSTED beyond). */
void metrics_buf_init(struct metrics_buf *b, size_t max_bytes);
/* Frees the text. Accepts NULL. */
void metrics_buf_fini(struct metrics_buf *b);
/* Empties the buffer (and clears its error) for the next rendering; keeps its memory. */
void metrics_buf_reset(struct metrics_buf *b);

/* Starts a family: "# HELP name help" and "# TYPE name type". Errors: PAGODA_EINVAL (name),
 * PAGODA_ENOMEM, PAGODA_EEXHAUSTED. */
int metrics_family(struct metrics_buf *b, const char *name, enum metrics_type type,
                   const char *help);

/* A sample of the current counter or gauge family: "name{labels} value" (labels may be NULL
 * when num_labels is 0). Values print exactly (integers without exponent, NaN, +Inf, -Inf).
 * Errors: PAGODA_EINVAL (no such family started, a histogram family, a label name),
 * PAGODA_ENOMEM, PAGODA_EEXHAUSTED. */
int metrics_sample(struct metrics_buf *b, const struct metrics_label *labels, size_t num_labels,
                   double value);

struct metrics_hist;

/* The samples of one histogram of the current histogram family: name_bucket with the labels
 * and le for every bound and +Inf (cumulative counts), name_sum and name_count. Errors as
 * metrics_sample's. */
int metrics_histogram(struct metrics_buf *b, const struct metrics_label *labels, size_t num_labels,
                      const struct metrics_hist *h);

/* A histogram: counts per bucket (not cumulative: bucket i holds observations v with
 * bounds[i-1] < v <= bounds[i], the last one those above every bound), their sum and count. */
struct metrics_hist {
    const double *bounds; /* the caller's, alive as long as h (static arrays below) */
    size_t num_bounds;
    uint64_t counts[METRICS_MAX_BUCKETS + 1];
    double sum;
    uint64_t count;
};

/* Empties h over bounds: strictly increasing, finite, 1 to METRICS_MAX_BUCKETS of them.
 * Errors: PAGODA_EINVAL. */
int metrics_hist_init(struct metrics_hist *h, const double *bounds, size_t num_bounds);

/* Records one observation (a binary search over the bounds). NaN is ignored. */
void metrics_hist_observe(struct metrics_hist *h, double value);

/* The observations at or below bounds[i] (i == num_bounds: all of them). */
uint64_t metrics_hist_cumulative(const struct metrics_hist *h, size_t i);

/* Default bucket bounds, in seconds, for the router's latency histograms. They cover a CPU group
 * (tens of milliseconds to seconds per token) as well as a GPU group (milliseconds per token),
 * finer where the mass of each distribution sits:
 *
 *   time to first token   1 ms .. 10 min: queueing and prefill, from a cached prefix to a long
 *                         prompt on a busy CPU group
 *     0.001 0.0025 0.005 0.01 0.02 0.04 0.06 0.08 0.1 0.15 0.2 0.3 0.5 0.75 1 1.5 2 3 5 7.5
 *     10 20 40 80 160 320 640
 *   time per output token and inter-token latency   0.5 ms .. 20 s: one decode step, stretched
 *                         by batching, preemption or a prefill sharing the step
 *     0.0005 0.001 0.0025 0.005 0.0075 0.01 0.015 0.02 0.025 0.03 0.04 0.05 0.075 0.1 0.15
 *     0.2 0.3 0.5 0.75 1 2.5 5 10 20
 *   end-to-end latency    10 ms .. 1 h: a whole request
 *     0.01 0.025 0.05 0.1 0.25 0.5 1 1.5 2 2.5 5 7.5 10 15 20 30 45 60 90 120 180 300 600
 *     1200 1800 3600 */
extern const double metrics_buckets_ttft_s[];
extern const size_t metrics_buckets_ttft_s_count;
extern const double metrics_buckets_tpot_s[]; /* also inter-token latency */
extern const size_t metrics_buckets_tpot_s_count;
extern const double metrics_buckets_e2e_s[];
extern const size_t metrics_buckets_e2e_s_count;

#endif
