/* The picture of a rate sweep: latency percentiles and throughput against the request rate,
 * drawn by gnuplot (Debian's gnuplot-nox, run as a child process) into a PNG. */
#ifndef PAGODA_BENCH_PLOT_H
#define PAGODA_BENCH_PLOT_H

#include "bench/report.h"
#include "bench/timeline.h"

#include <stddef.h>

/* Writes png_path: three panels against the offered rate (each report's cfg.rate, finite; log
 * scale): TTFT and E2E p50/p90/p99 (log scale), TPOT and ITL p50/p90/p99, and output tokens/s
 * with completed requests/s. title heads the picture. Errors: PAGODA_EINVAL (no report, a rate that
 * is not finite, a quote or newline in the path or title), PAGODA_ENOENT (gnuplot is not
 * installed), PAGODA_EIO (gnuplot failed: its messages are on stderr). */
int plot_sweep(const struct report *reports, size_t n, const char *title, const char *png_path);

/* Writes png_path: a long run's timeline (bench/timeline.h), four panels against time: TTFT and
 * TPOT p99 of each window; output and engine prefill/decode tokens/s; KV usage, fragmentation,
 * page locality and prefix hit rate (0..1); preemptions and evictions per window. Errors as
 * plot_sweep (PAGODA_EINVAL also for no window). */
int plot_timeline(const struct timeline_window *w, size_t n, const char *title,
                  const char *png_path);

#endif
