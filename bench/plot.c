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

int plot_sweep(const struct report *reports, size_t n, const char *title, const char *png_path)
{
    if (n == 0)
        return pagoda_error_set(PAGODA_EINVAL, "--plot: no rate was run");
    if (strpbrk(png_path, "'\n") != NULL || strpbrk(title, "'\n") != NULL)
        return pagoda_error_set(PAGODA_EINVAL, "--plot: no quote or newline in the path or title");
    for (size_t i = 0; i < n; i++)
        if (!isfinite(reports[i].cfg.rate))
            return pagoda_error_set(PAGODA_EINVAL, "--plot: every rate must be finite");
    FILE *f = popen("gnuplot", "w");
    if (f == NULL)
        return pagoda_error_set(PAGODA_EIO, "--plot: cannot run gnuplot");
    fprintf(f, "set terminal pngcairo noenhanced size 1500,520 font 'sans,10'\n");
    fprintf(f, "set output '%s'\n", png_path);
    fprintf(f, "set datafile missing '?'\n");
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
    int status = pclose(f);
    if (status == -1)
        return pagoda_error_set(PAGODA_EIO, "--plot: waiting for gnuplot failed");
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return pagoda_error_set(PAGODA_ENOENT, "--plot: gnuplot is not installed "
                                               "(scripts/install-deps installs gnuplot-nox)");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        return pagoda_error_set(PAGODA_EIO, "--plot: gnuplot failed (its messages are above)");
    return 0;
}
