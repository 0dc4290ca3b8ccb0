/* Prometheus' text format: checked names, escaped values, exact numbers, cumulative buckets. */
#include "metrics/metrics.h"

#include "common/error.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

const double metrics_buckets_ttft_s[] = {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                         0.15,  0.2,    0.3,   0.5,  0.75, 1,    1.5,  2,    3,
                                         5,     7.5,    10,    20,   40,   80,   160,  320,  640};
const size_t metrics_buckets_ttft_s_count = COUNT(metrics_buckets_ttft_s);
const double metrics_buckets_tpot_s[] = {0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02,
                                         0.025,  0.03,  0.04,   0.05,  0.075,  0.1,  0.15,  0.2,
                                         0.3,    0.5,   0.75,   1,     2.5,    5,    10,    20};
const size_t metrics_buckets_tpot_s_count = COUNT(metrics_buckets_tpot_s);
const double metrics_buckets_e2e_s[] = {0.01, 0.025, 0.05, 0.1, 0.25, 0.5,  1,    1.5, 2,
                                        2.5,  5,     7.5,  10,  15,   20,   30,   45,  60,
                                        90,   120,   180,  300, 600,  1200, 1800, 3600};
const size_t metrics_buckets_e2e_s_count = COUNT(metrics_buckets_e2e_s);

/* ---- the buffer ---- */

void metrics_buf_init(struct metrics_buf *b, size_t max_bytes)
{
    memset(b, 0, sizeof(*b));
    b->max_bytes = max_bytes;
}

void metrics_buf_fini(struct metrics_buf *b)
{
    if (!b)
        return;
    free(b->data);
    memset(b, 0, sizeof(*b));
}

void metrics_buf_reset(struct metrics_buf *b)
{
    b->len = 0;
    if (b->data)
        b->data[0] = '\0';
    b->err = 0;
    b->family[0] = '\0';
}

static int fail(struct metrics_buf *b, int err)
{
    if (!b->err)
        b->err = err;
    return b->err;
}

/* Room for n more bytes and the NUL. */
static int reserve(struct metrics_buf *b, size_t n)
{
    if (b->err)
        return b->err;
    if (n > b->max_bytes || b->len + n > b->max_bytes)
        return fail(b, PAGODA_EEXHAUSTED);
    if (b->len + n + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + n + 1)
        cap *= 2;
    if (cap > b->max_bytes + 1)
        cap = b->max_bytes + 1;
    char *data = realloc(b->data, cap);
    if (!data)
        return fail(b, PAGODA_ENOMEM);
    b->data = data;
    b->cap = cap;
    return 0;
}

static void put(struct metrics_buf *b, const char *s, size_t n)
{
    if (reserve(b, n) < 0)
        return;
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void puts_(struct metrics_buf *b, const char *s)
{
    put(b, s, strlen(s));
}

/* text with '\\' and '\n' escaped, and '"' too in a label value. */
static void put_escaped(struct metrics_buf *b, const char *s, bool quote)
{
    const char *run = s;
    for (; *s; s++) {
        const char *esc = NULL;
        if (*s == '\\')
            esc = "\\\\";
        else if (*s == '\n')
            esc = "\\n";
        else if (*s == '"' && quote)
            esc = "\\\"";
        if (!esc)
            continue;
        put(b, run, (size_t)(s - run));
        puts_(b, esc);
        run = s + 1;
    }
    put(b, run, (size_t)(s - run));
}

/* The shortest text that reads back as v; integers without exponent up to 2^53. */
static void put_number(struct metrics_buf *b, double v)
{
    char num[40];
    if (isnan(v))
        strcpy(num, "NaN");
    else if (isinf(v))
        strcpy(num, v > 0 ? "+Inf" : "-Inf");
    else if (v == floor(v) && fabs(v) <= 9007199254740992.0)
        snprintf(num, sizeof(num), "%.0f", v);
    else
        for (int prec = 1; prec <= 17; prec++) {
            snprintf(num, sizeof(num), "%.*g", prec, v);
            if (strtod(num, NULL) == v)
                break;
        }
    puts_(b, num);
}

/* ---- names ---- */

static bool name_ok(const char *s, bool metric)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > METRICS_MAX_NAME)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' ||
                  (metric && ch == ':') || (i > 0 && ch >= '0' && ch <= '9');
        if (!ok)
            return false;
    }
    return metric || strncmp(s, "__", 2) != 0;
}

int metrics_family(struct metrics_buf *b, const char *name, enum metrics_type type,
                   const char *help)
{
    if (b->err)
        return b->err;
    if (!name_ok(name, true) || type < METRICS_COUNTER || type > METRICS_HISTOGRAM)
        return fail(b, pagoda_error_set(PAGODA_EINVAL, "metrics: bad family name"));
    static const char *const types[] = {"counter", "gauge", "histogram"};
    strcpy(b->family, name);
    b->type = type;
    puts_(b, "# HELP ");
    puts_(b, name);
    puts_(b, " ");
    put_escaped(b, help ? help : "", false);
    puts_(b, "\n# TYPE ");
    puts_(b, name);
    puts_(b, " ");
    puts_(b, types[type]);
    puts_(b, "\n");
    return b->err;
}

/* "family suffix{labels[,le="bound"]} " */
static void put_series(struct metrics_buf *b, const char *suffix,
                       const struct metrics_label *labels, size_t num_labels, const double *le)
{
    puts_(b, b->family);
    puts_(b, suffix);
    if (num_labels == 0 && !le)
        return;
    puts_(b, "{");
    for (size_t i = 0; i < num_labels; i++) {
        if (i > 0)
            puts_(b, ",");
        puts_(b, labels[i].name);
        puts_(b, "=\"");
        put_escaped(b, labels[i].value, true);
        puts_(b, "\"");
    }
    if (le) {
        puts_(b, num_labels ? ",le=\"" : "le=\"");
        put_number(b, *le);
        puts_(b, "\"");
    }
    puts_(b, "}");
}

static int labels_check(struct metrics_buf *b, const struct metrics_label *labels,
                        size_t num_labels)
{
    if (num_labels > 0 && !labels)
        return fail(b, PAGODA_EINVAL);
    for (size_t i = 0; i < num_labels; i++)
        if (!name_ok(labels[i].name, false) || !labels[i].value ||
            (b->type == METRICS_HISTOGRAM && strcmp(labels[i].name, "le") == 0))
            return fail(
                b, pagoda_error_set(PAGODA_EINVAL, "metrics: %s: bad label %zu", b->family, i));
    return 0;
}

int metrics_sample(struct metrics_buf *b, const struct metrics_label *labels, size_t num_labels,
                   double value)
{
    if (b->err)
        return b->err;
    if (!b->family[0] || b->type == METRICS_HISTOGRAM)
        return fail(b, pagoda_error_set(PAGODA_EINVAL, "metrics: a sample outside a counter "
                                                       "or gauge family"));
    if (labels_check(b, labels, num_labels) < 0)
        return b->err;
    put_series(b, "", labels, num_labels, NULL);
    puts_(b, " ");
    put_number(b, value);
    puts_(b, "\n");
    return b->err;
}

int metrics_histogram(struct metrics_buf *b, const struct metrics_label *labels, size_t num_labels,
                      const struct metrics_hist *h)
{
    if (b->err)
        return b->err;
    if (!b->family[0] || b->type != METRICS_HISTOGRAM || !h)
        return fail(b, pagoda_error_set(PAGODA_EINVAL, "metrics: a histogram outside a "
                                                       "histogram family"));
    if (labels_check(b, labels, num_labels) < 0)
        return b->err;
    static const double inf = INFINITY;
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= h->num_bounds; i++) {
        cumulative += h->counts[i];
        put_series(b, "_bucket", labels, num_labels, i < h->num_bounds ? &h->bounds[i] : &inf);
        puts_(b, " ");
        put_number(b, (double)cumulative);
        puts_(b, "\n");
    }
    put_series(b, "_sum", labels, num_labels, NULL);
    puts_(b, " ");
    put_number(b, h->sum);
    puts_(b, "\n");
    put_series(b, "_count", labels, num_labels, NULL);
    puts_(b, " ");
    put_number(b, (double)h->count);
    puts_(b, "\n");
    return b->err;
}

/* ---- the histogram ---- */

int metrics_hist_init(struct metrics_hist *h, const double *bounds, size_t num_bounds)
{
    if (!bounds || num_bounds == 0 || num_bounds > METRICS_MAX_BUCKETS)
        return PAGODA_EINVAL;
    for (size_t i = 0; i < num_bounds; i++)
        if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
            return PAGODA_EINVAL;
    memset(h, 0, sizeof(*h));
    h->bounds = bounds;
    h->num_bounds = num_bounds;
    return 0;
}

void metrics_hist_observe(struct metrics_hist *h, double value)
{
    if (isnan(value))
        return;
    /* The first bound >= value (le: "less than or equal"), or num_bounds. */
    size_t lo = 0, hi = h->num_bounds;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (h->bounds[mid] < value)
            lo = mid + 1;
        else
            hi = mid;
    }
    h->counts[lo]++;
    h->sum += value;
    h->count++;
}

uint64_t metrics_hist_cumulative(const struct metrics_hist *h, size_t i)
{
    uint64_t n = 0;
    for (size_t k = 0; k <= i && k <= h->num_bounds; k++)
        n += h->counts[k];
    return n;
}
