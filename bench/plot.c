#include "bench/plot.h"

#include "common/error.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>

/* gnuplot's data: "?" is a missing value (a percentile with no samples). */
static void put_value(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, " %.6g", v);
    else
        fputs(" ?", f);
}

static void put_summary(FILE *f, const struct report_summary *s)
{
    put_value(f, s->p50);
    put_value(f, s->p90);
    put_value(f, s->p99);
}

/* One line of a plot command: the first opens it ("plot"), the others continue it. */
static void plot_line(FILE *f, int first, int column, const char *color, int dash,
                      const char *title)
{
    fprintf(f, "%s$d using 1:%d with linespoints lc rgb '%s' dashtype %d title '%s'",
            first ? "plot " : ", \\\n     ", column, color, dash, title);
}

/* p50, p90 and p99 (columns first..first+2) of one figure, in one colour. */
static void plot_percentiles(FILE *f, int opens, int first, const char *color, const char *name)
{
    static const char *const pct[] = {"p50", "p90", "p99"};
    for (int k = 0; k < 3; k++) {
        char title[64];
        snprintf(title, sizeof(title), "%s %s", name, pct[k]);
        plot_line(f, opens && k == 0, first + k, color, k + 1, title);
    }
}

/* Runs gnuplot's script from write(f, arg) into png_path (what of plot_sweep and plot_timeline
 * is the same). */
static int run_gnuplot(const char *flag, const char *png_path, const char *title, int width,
                       int height, void (*write)(FILE *f, const void *arg), const void *arg)
{
    if (strpbrk(png_path, "'\n") != NULL || strpbrk(title, "'\n") != NULL)
        return pagoda_error_set(PAGODA_EINVAL, "%s: no quote or newline in the path or title",
                                flag);
    FILE *f = popen("gnuplot", "w");
    if (f == NULL)
        return pagoda_error_set(PAGODA_EIO, "%s: cannot run gnuplot", flag);
    fprintf(f, "set terminal pngcairo noenhanced size %d,%d font 'sans,10'\n", width, height);
    fprintf(f, "set output '%s'\n", png_path);
    fprintf(f, "set datafile missing '?'\n");
    write(f, arg);
    int status = pclose(f);
    if (status == -1)
        return pagoda_error_set(PAGODA_EIO, "%s: waiting for gnuplot failed", flag);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return pagoda_error_set(PAGODA_ENOENT,
                                "%s: gnuplot is not installed "
                                "(scripts/install-deps installs gnuplot-nox)",
                                flag);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return pagoda_error_set(PAGODA_EIO, "%s: gnuplot failed (its messages are above)", flag);
    return 0;
}

struct timeline_arg {
    const struct timeline_window *w;
    size_t n;
    const char *title;
};

static void write_timeline(FILE *f, const void *p)
{
    const struct timeline_arg *a = p;
    /* t, TTFT p99, TPOT p99, out tok/s, prefill tok/s, decode tok/s, KV, frag, locality, hit,
     * preemptions, evictions */
    fprintf(f, "$d << EOD\n");
    for (size_t k = 0; k < a->n; k++) {
        const struct timeline_window *x = &a->w[k];
        put_value(f, x->t1_s);
        put_value(f, x->ttft_ms.p99);
        put_value(f, x->tpot_ms.p99);
        put_value(f, x->output_tps);
        put_value(f, x->prefill_tps);
        put_value(f, x->decode_tps);
        put_value(f, x->kv_usage_max);
        put_value(f, x->fragmentation_mean);
        put_value(f, x->locality_mean);
        put_value(f, x->hit_rate);
        put_value(f, x->have_counters ? (double)x->preemptions : NAN);
        put_value(f, x->have_counters ? (double)x->evictions : NAN);
        fputc('\n', f);
    }
    fprintf(f, "EOD\n");
    fprintf(f, "set multiplot layout 2,2 title '%s' font 'sans,12'\n", a->title);
    fprintf(f, "set grid\nset key top left\nset xlabel 'time (s)'\n");
    fprintf(f, "set title 'Latency p99 per window'\nset ylabel 'ms'\nset yrange [0:*]\n");
    plot_line(f, 1, 2, "#1f77b4", 1, "TTFT p99");
    plot_line(f, 0, 3, "#2ca02c", 1, "TPOT p99");
    fprintf(f, "\nset title 'Throughput'\nset ylabel 'tokens/s'\n");
    plot_line(f, 1, 4, "#d62728", 1, "output (clients)");
    plot_line(f, 0, 5, "#9467bd", 2, "prefill (engine)");
    plot_line(f, 0, 6, "#8c564b", 3, "decode (engine)");
    fprintf(f, "\nset title 'The pool and the prefix cache'\nset ylabel 'fraction'\n");
    fprintf(f, "set yrange [0:1.05]\n");
    plot_line(f, 1, 7, "#1f77b4", 1, "KV usage (max)");
    plot_line(f, 0, 8, "#ff7f0e", 1, "fragmentation");
    plot_line(f, 0, 9, "#2ca02c", 1, "page locality");
    plot_line(f, 0, 10, "#d62728", 2, "prefix hit rate");
    fprintf(f, "\nset title 'Preemptions and evictions per window'\nset ylabel 'count'\n");
    fprintf(f, "set yrange [0:*]\n");
    plot_line(f, 1, 11, "#9467bd", 1, "preemptions");
    plot_line(f, 0, 12, "#8c564b", 2, "evictions");
    fprintf(f, "\nunset multiplot\n");
}

int plot_timeline(const struct timeline_window *w, size_t n, const char *title,
                  const char *png_path)
{
    if (n == 0)
        return pagoda_error_set(PAGODA_EINVAL, "--timeline-plot: no window");
    struct timeline_arg a = {w, n, title};
    return run_gnuplot("--timeline-plot", png_path, title, 1500, 900, write_timeline, &a);
}

struct sweep_arg {
    const struct report *reports;
    size_t n;
    const char *title;
};

static void write_sweep(FILE *f, const void *p)
{
    const struct sweep_arg *a = p;
    const struct report *reports = a->reports;
    size_t n = a->n;
    const char *title = a->title;
    /* rate, TTFT p50/p90/p99, E2E, TPOT, ITL, output tok/s, completed req/s */
    fprintf(f, "$d << EOD\n");
    for (size_t i = 0; i < n; i++) {
        const struct report *r = &reports[i];
        put_value(f, r->cfg.rate);
        put_summary(f, &r->ttft_ms);
        put_summary(f, &r->e2e_ms);
        put_summary(f, &r->tpot_ms);
        put_summary(f, &r->itl_ms);
        put_value(f, r->output_tps);
        put_value(f, r->request_throughput);
        fputc('\n', f);
    }
    fprintf(f, "EOD\n");
    fprintf(f, "set multiplot layout 1,3 title '%s' font 'sans,12'\n", title);
    /* Sweeps usually double the rate: a log scale spaces them evenly. */
    fprintf(f, "set grid\nset key top left\nset logscale x 2\n");
    fprintf(f, "set xlabel 'offered request rate (requests/s, log scale)'\n");
    fprintf(f, "set title 'Time to first token and end-to-end latency'\n");
    fprintf(f, "set ylabel 'latency (ms, log scale)'\nset logscale y\n");
    plot_percentiles(f, 1, 2, "#1f77b4", "TTFT");
    plot_percentiles(f, 0, 5, "#d62728", "E2E");
    fprintf(f, "\n");
    fprintf(f, "unset logscale y\nset title 'Time per output token and inter-token latency'\n");
    fprintf(f, "set ylabel 'latency (ms)'\n");
    plot_percentiles(f, 1, 8, "#2ca02c", "TPOT");
    plot_percentiles(f, 0, 11, "#9467bd", "ITL");
    fprintf(f, "\n");
    fprintf(f, "set title 'Throughput'\nset ylabel 'output tokens/s'\n");
    fprintf(f, "set y2label 'completed requests/s'\nset ytics nomirror\nset y2tics\n");
    fprintf(f, "set yrange [0:*]\nset y2range [0:*]\n");
    fprintf(f, "plot $d using 1:14 axes x1y1 with linespoints lw 2 title 'output tokens/s', \\\n"
               "     $d using 1:15 axes x1y2 with linespoints dashtype 2 title 'requests/s'\n");
    fprintf(f, "unset multiplot\n");
}

int plot_sweep(const struct report *reports, size_t n, const char *title, const char *png_path)
{
    if (n == 0)
        return pagoda_error_set(PAGODA_EINVAL, "--plot: no rate was run");
    for (size_t i = 0; i < n; i++)
        if (!isfinite(reports[i].cfg.rate))
            return pagoda_error_set(PAGODA_EINVAL, "--plot: every rate must be finite");
    struct sweep_arg a = {reports, n, title};
    return run_gnuplot("--plot", png_path, title, 1500, 520, write_sweep, &a);
}
