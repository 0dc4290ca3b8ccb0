#include "bench/report.h"

#include "common/error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int report_request_reserve(struct report_request *r, size_t max_tokens)
{
    free(r->token_ids);
    free(r->token_s);
    r->token_ids = malloc((max_tokens ? max_tokens : 1) * sizeof(*r->token_ids));
    r->token_s = malloc((max_tokens ? max_tokens : 1) * sizeof(*r->token_s));
    r->num_tokens = 0;
    r->cap_tokens = 0;
    if (r->token_ids == NULL || r->token_s == NULL)
        return PAGODA_ENOMEM;
    r->cap_tokens = max_tokens;
    return 0;
}

int report_request_add_tokens(struct report_request *r, double t_s, const int32_t *ids, size_t n)
{
    if (n > r->cap_tokens - r->num_tokens)
        return pagoda_error_set(PAGODA_ERANGE, "%zu tokens arrived after %zu, more than %zu", n,
                                r->num_tokens, r->cap_tokens);
    if (n == 0)
        return 0;
    for (size_t i = 0; i < n; i++) {
        r->token_ids[r->num_tokens + i] = ids[i];
        r->token_s[r->num_tokens + i] = t_s;
    }
    r->num_tokens += n;
    r->polls++;
    if (n > 1)
        r->multi_token_polls++;
    if (n > r->max_poll_tokens)
        r->max_poll_tokens = (uint32_t)n;
    return 0;
}

void report_request_fini(struct report_request *r)
{
    if (r == NULL)
        return;
    free(r->token_ids);
    free(r->token_s);
    r->token_ids = NULL;
    r->token_s = NULL;
    r->num_tokens = r->cap_tokens = 0;
}

int report_request_completed(const struct report_request *r)
{
    return r->rc == 0 &&
           (r->finish_reason == PAGODA_FINISH_STOP || r->finish_reason == PAGODA_FINISH_LENGTH);
}

static double ttft_ms(const struct report_request *r)
{
    return r->num_tokens ? (r->token_s[0] - r->start_s) * 1e3 : NAN;
}

static double e2e_ms(const struct report_request *r)
{
    return (r->end_s - r->start_s) * 1e3;
}

static double tpot_ms(const struct report_request *r)
{
    if (r->num_tokens < 2)
        return NAN;
    return (e2e_ms(r) - ttft_ms(r)) / (double)(r->num_tokens - 1);
}

double report_percentile(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return NAN;
    double h = (double)(n - 1) * p / 100.0;
    size_t lo = (size_t)floor(h);
    if (lo >= n - 1)
        return sorted[n - 1];
    return sorted[lo] + (h - (double)lo) * (sorted[lo + 1] - sorted[lo]);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

void report_summarize(double *values, size_t n, struct report_summary *out)
{
    out->count = n;
    if (n == 0) {
        out->mean = out->min = out->p50 = out->p90 = out->p95 = out->p99 = out->max = NAN;
        return;
    }
    qsort(values, n, sizeof(*values), cmp_double);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += values[i];
    out->mean = sum / (double)n;
    out->min = values[0];
    out->max = values[n - 1];
    out->p50 = report_percentile(values, n, 50);
    out->p90 = report_percentile(values, n, 90);
    out->p95 = report_percentile(values, n, 95);
    out->p99 = report_percentile(values, n, 99);
}

/* The text a failure is counted under. */
static void failure_text(const struct report_request *r, char *out, size_t len)
{
    if (r->rc != 0)
        snprintf(out, len, "%s", r->error[0] ? r->error : pagoda_strerror(r->rc));
    else if (r->finish_reason == PAGODA_FINISH_ERROR)
        snprintf(out, len, "finished with error: %.170s", r->error[0] ? r->error : "(no message)");
    else
        snprintf(out, len, "finished %s", pagoda_finish_reason_name(r->finish_reason));
}

static void count_failure(struct report *rep, const struct report_request *r)
{
    char what[REPORT_ERROR_MAX];
    failure_text(r, what, sizeof(what));
    for (size_t k = 0; k < rep->num_failure_kinds; k++) {
        if (strcmp(rep->failures[k].what, what) == 0) {
            rep->failures[k].count++;
            return;
        }
    }
    if (rep->num_failure_kinds == REPORT_MAX_FAILURE_KINDS) {
        rep->failures_other++;
        return;
    }
    struct report_failure *f = &rep->failures[rep->num_failure_kinds++];
    memcpy(f->what, what, sizeof(f->what));
    f->count = 1;
}

/* Engine figures: counters as differences, gauges as they were after the run. */
static void engine_figures(struct report *rep, const struct report_engine *e)
{
    rep->prefix_hit_rate = NAN;
    rep->engine_prefill_tps = rep->engine_decode_tps = NAN;
    rep->locality_mean = rep->locality_min = rep->run_length_mean = NAN;
    rep->worker_step_device_ms = rep->worker_step_wall_ms = NAN;
    rep->samples = e ? e->samples : 0;
    if (e == NULL || !e->have_before || !e->have_after)
        return;
    const pagoda_engine_stats *b = &e->before, *a = &e->after;
    rep->have_engine = 1;
#define DELTA(field) (a->field >= b->field ? a->field - b->field : 0)
    rep->prefix_query_tokens = DELTA(prefix_query_tokens);
    rep->prefix_hit_tokens = DELTA(prefix_hit_tokens);
    rep->preemptions = DELTA(preemptions);
    rep->steps = DELTA(steps);
    rep->computed_tokens = DELTA(computed_tokens);
    rep->evictions = DELTA(evictions);
    rep->prefill_tokens = DELTA(prefill_tokens);
    rep->decode_tokens = DELTA(decode_tokens);
    rep->worker_steps_timed = DELTA(worker_steps_timed);
#undef DELTA
    /* A tenant's key reads its own figures only: no engine-wide work or locality. */
    rep->engine_wide = a->tenant[0] == '\0';
    double d = rep->duration_s > 0 && rep->engine_wide ? rep->duration_s : NAN;
    rep->engine_prefill_tps = (double)rep->prefill_tokens / d;
    rep->engine_decode_tps = (double)rep->decode_tokens / d;
    /* The worker's step times from counters that never fall while the router runs (one that
     * fell, a router restarted between the readings, gives no figure rather than a wrong one). */
    if (rep->engine_wide && rep->worker_steps_timed > 0 &&
        a->worker_step_device_us_total >= b->worker_step_device_us_total &&
        a->worker_step_wall_us_total >= b->worker_step_wall_us_total) {
        const double n = (double)rep->worker_steps_timed;
        rep->worker_step_device_ms =
            (double)(a->worker_step_device_us_total - b->worker_step_device_us_total) / n / 1e3;
        rep->worker_step_wall_ms =
            (double)(a->worker_step_wall_us_total - b->worker_step_wall_us_total) / n / 1e3;
    }
    if (e->locality_samples) {
        rep->locality_mean = e->locality_sum / (double)e->locality_samples;
        rep->locality_min = e->locality_min;
        rep->run_length_mean = e->run_length_sum / (double)e->locality_samples;
    }
    if (rep->prefix_query_tokens > 0)
        rep->prefix_hit_rate = (double)rep->prefix_hit_tokens / (double)rep->prefix_query_tokens;
    rep->peak_kv_usage = a->peak_kv_usage;
    rep->kv_usage_max_sampled = e->kv_usage_max;
    rep->fragmentation_mean =
        e->fragmentation_samples ? e->fragmentation_sum / (double)e->fragmentation_samples : NAN;
    rep->fragmentation_max = e->fragmentation_samples ? e->fragmentation_max : NAN;
    rep->fragmentation_end = a->fragmentation;
    rep->num_blocks = a->num_blocks;
    rep->cached_blocks_end = a->cached_blocks;
    rep->running_max = e->running_max;
    rep->waiting_max = e->waiting_max;
}

/* The bandwidth floor of a decode step: every step reads the weights once and the K/V of every
 * sequence in the batch. With batch B sequences decoding, each at a context of c tokens on
 * average, the floor is (weight bytes + B c kv_bytes_per_token) / bandwidth. The measured step
 * is the median ITL: in a closed loop of B clients that all decode together, each step gives
 * every sequence one token, so most gaps between a sequence's tokens are one decode step; the
 * gaps that span a step shared with other requests' prefill chunks are few and stay out of the
 * median. The median TPOT is not used: each request's TPOT averages over all its gaps, prefill
 * stalls included (B requests admitted together stall each other's first steps, by several
 * prefill chunks at B = 64), so it measures the workload, not the step; it is kept beside it.
 * c is the mean over requests of prompt + output / 2, the context of the average decode step. */
static void bandwidth_floor(struct report *rep, const struct report_request *reqs, size_t n)
{
    const struct report_config *c = &rep->cfg;
    if (c->bandwidth_gbs <= 0 || c->open_loop || rep->completed == 0 || !(rep->tpot_ms.p50 > 0))
        return;
    double ctx = 0;
    for (size_t i = 0; i < n; i++)
        if (report_request_completed(&reqs[i]))
            ctx += reqs[i].prompt_len + (double)reqs[i].num_tokens / 2.0;
    rep->have_floor = 1;
    rep->batch = c->concurrency < rep->completed ? c->concurrency : (double)rep->completed;
    rep->mean_context = ctx / (double)rep->completed;
    /* Tokens bunched several to a poll (floor_reliable 0) can leave a median gap of 0. */
    rep->decode_step_ms = rep->itl_ms.p50 > 0 ? rep->itl_ms.p50 : rep->tpot_ms.p50;
    rep->decode_step_tpot_ms = rep->tpot_ms.p50;
    rep->step_wall_ms = rep->steps ? rep->duration_s * 1e3 / (double)rep->steps : NAN;
    rep->kv_bytes_per_step = rep->batch * rep->mean_context * c->kv_bytes_per_token;
    rep->floor_step_ms =
        (c->weight_bytes + rep->kv_bytes_per_step) / (c->bandwidth_gbs * 1e9) * 1e3;
    rep->floor_fraction = rep->floor_step_ms / rep->decode_step_ms;
    rep->floor_reliable = !(rep->shared_fraction > REPORT_FLOOR_MAX_SHARED);
}

/* The workload's compute-and-bandwidth bound: what the run would take if its prefill ran at the
 * measured matrix rate and its decode at the bandwidth, one after the other (the issue's
 * definition: prefill FLOPs at the matrix rate plus decode bytes; a step that mixes the two
 * could overlap them, so this is a roofline of the two phases, not a strict lower bound). Only
 * for runs whose requests are all there from the start (a closed loop, or --rate inf): with
 * arrivals spread over time the duration is the arrivals', not the engine's.
 *   prefill: every completed request's computed prompt tokens (its prompt, the router's count
 *     when it gave one, less the router's cached_tokens; the last prompt token is always
 *     computed) through the layers (flops_per_token each) and their causal attention (a token at
 *     position t attends to t + 1 keys: attention_flops_per_key each), and one token's logits
 *     (lm_head_flops: the output layer runs for the last prompt token only);
 *   decode: the tokens after each request's first (which its prefill makes), each reading the
 *     K/V of its context (prompt + the tokens before it), and the weights once per step, with
 *     at least max(ceil(decode tokens / the concurrency cap), the longest request's decode
 *     tokens) steps (all sequences in flight decode together at best). */
static void workload_bound(struct report *rep, const struct report_request *reqs, size_t n)
{
    const struct report_config *c = &rep->cfg;
    if (!(c->matrix_tflops > 0) || !(c->bandwidth_gbs > 0) || rep->completed == 0 ||
        !(rep->duration_s > 0) || (c->open_loop && !isinf(c->rate)))
        return;
    double flops = 0, kv_tokens = 0, decode_tokens = 0, longest = 0;
    for (size_t i = 0; i < n; i++) {
        const struct report_request *r = &reqs[i];
        if (!report_request_completed(r))
            continue;
        const double len = r->prompt_tokens > 0 ? r->prompt_tokens : r->prompt_len;
        if (len < 1)
            continue;
        const double cached = r->cached_tokens < len ? r->cached_tokens : len - 1;
        flops += c->flops_per_token * (len - cached) + c->lm_head_flops +
                 c->attention_flops_per_key * (len * (len + 1) - cached * (cached + 1)) / 2;
        if (r->num_tokens > 1) {
            const double k = (double)r->num_tokens - 1; /* tokens j = 1 .. k read len + j keys */
            decode_tokens += k;
            kv_tokens += k * len + k * (k + 1) / 2;
            longest = k > longest ? k : longest;
        }
    }
    double cap = c->concurrency > 0 && c->concurrency < rep->completed ? c->concurrency
                                                                       : (double)rep->completed;
    rep->have_bound = 1;
    rep->bound_prefill_flops = flops;
    rep->bound_decode_steps = fmax(ceil(decode_tokens / cap), longest);
    rep->bound_decode_bytes =
        rep->bound_decode_steps * c->weight_bytes + kv_tokens * c->kv_bytes_per_token;
    rep->bound_prefill_s = flops / (c->matrix_tflops * 1e12);
    rep->bound_decode_s = rep->bound_decode_bytes / (c->bandwidth_gbs * 1e9);
    rep->bound_s = rep->bound_prefill_s + rep->bound_decode_s;
    rep->bound_output_tps = (double)rep->output_tokens / rep->bound_s;
    rep->bound_fraction = rep->bound_s / rep->duration_s;
}

static int tenant_figures(struct report *rep, const struct report_request *reqs, size_t n)
{
    uint32_t nt = rep->cfg.num_tenants;
    if (nt == 0)
        return 0;
    rep->tenants = calloc(nt, sizeof(*rep->tenants));
    double *ttft = malloc((n + 1) * sizeof(double)), *e2e = malloc((n + 1) * sizeof(double));
    int rc = rep->tenants && ttft && e2e ? 0 : PAGODA_ENOMEM;
    for (uint32_t t = 0; rc == 0 && t < nt; t++) {
        struct report_tenant *rt = &rep->tenants[t];
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            const struct report_request *r = &reqs[i];
            if (r->tenant != t)
                continue;
            rt->requests++;
            if (!report_request_completed(r)) {
                rt->failed++;
                continue;
            }
            rt->completed++;
            rt->input_tokens += r->prompt_len;
            rt->output_tokens += r->num_tokens;
            rt->cached_tokens += r->cached_tokens;
            e2e[k] = e2e_ms(r);
            ttft[k++] = ttft_ms(r);
        }
        /* ttft is NAN only for a completed request without tokens, which max_tokens >= 1
         * rules out; keep the NANs out of the percentiles all the same. */
        size_t m = 0;
        for (size_t i = 0; i < k; i++)
            if (!isnan(ttft[i]))
                ttft[m++] = ttft[i];
        report_summarize(ttft, m, &rt->ttft_ms);
        report_summarize(e2e, k, &rt->e2e_ms);
    }
    free(ttft);
    free(e2e);
    return rc;
}

int report_compute(const struct report_config *cfg, const struct report_request *reqs, size_t n,
                   const struct report_engine *engine, struct report *out)
{
    memset(out, 0, sizeof(*out));
    out->cfg = *cfg;
    out->num_requests = n;
    out->baseline_ratio = NAN;
    size_t itl_n = 0;
    for (size_t i = 0; i < n; i++)
        if (report_request_completed(&reqs[i]) && reqs[i].num_tokens > 1)
            itl_n += reqs[i].num_tokens - 1;
    double *ttft = malloc((n + 1) * sizeof(double));
    double *tpot = malloc((n + 1) * sizeof(double));
    double *e2e = malloc((n + 1) * sizeof(double));
    double *itl = malloc((itl_n + 1) * sizeof(double));
    double *pre = malloc((n + 1) * sizeof(double));
    int rc = ttft && tpot && e2e && itl && pre ? 0 : PAGODA_ENOMEM;
    size_t nt = 0, np = 0, ne = 0, ni = 0, npre = 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        const struct report_request *r = &reqs[i];
        if (r->end_s > out->duration_s)
            out->duration_s = r->end_s;
        double late_ms = (r->start_s - r->scheduled_s) * 1e3;
        if (cfg->open_loop && late_ms > REPORT_LATE_START_MS)
            out->late_starts++;
        if (late_ms > out->max_late_ms)
            out->max_late_ms = late_ms;
        if (!report_request_completed(r)) {
            out->failed++;
            out->failed_output_tokens += r->num_tokens;
            count_failure(out, r);
            continue;
        }
        out->completed++;
        out->input_tokens += r->prompt_len;
        out->output_tokens += r->num_tokens;
        out->cached_tokens += r->cached_tokens;
        if (r->completion_tokens != r->num_tokens || r->prompt_tokens != r->prompt_len)
            out->usage_mismatches++;
        out->polls += r->polls;
        out->multi_token_polls += r->multi_token_polls;
        if (r->max_poll_tokens > out->max_poll_tokens)
            out->max_poll_tokens = r->max_poll_tokens;
        if (r->num_tokens > 0)
            ttft[nt++] = ttft_ms(r);
        if (r->num_tokens > 0 && ttft_ms(r) > 0) {
            uint32_t cached = r->cached_tokens < r->prompt_len ? r->cached_tokens : r->prompt_len;
            pre[npre++] = (double)(r->prompt_len - cached) / (ttft_ms(r) / 1e3);
        }
        if (r->num_tokens > 1)
            tpot[np++] = tpot_ms(r);
        e2e[ne++] = e2e_ms(r);
        for (size_t k = 1; k < r->num_tokens; k++) {
            double d = (r->token_s[k] - r->token_s[k - 1]) * 1e3;
            itl[ni++] = d;
            /* Tokens of one poll share its arrival time exactly. */
            if (r->token_s[k] == r->token_s[k - 1])
                out->shared_tokens++;
        }
    }
    if (rc == 0) {
        report_summarize(ttft, nt, &out->ttft_ms);
        report_summarize(tpot, np, &out->tpot_ms);
        report_summarize(e2e, ne, &out->e2e_ms);
        report_summarize(itl, ni, &out->itl_ms);
        report_summarize(pre, npre, &out->prefill_tps);
        out->shared_fraction = ni ? (double)out->shared_tokens / (double)ni : NAN;
        double d = out->duration_s > 0 ? out->duration_s : NAN;
        out->request_throughput = (double)out->completed / d;
        out->input_tps = (double)out->input_tokens / d;
        out->output_tps = (double)out->output_tokens / d;
        out->total_tps = (double)(out->input_tokens + out->output_tokens) / d;
        out->cached_fraction =
            out->input_tokens ? (double)out->cached_tokens / (double)out->input_tokens : NAN;
        engine_figures(out, engine);
        bandwidth_floor(out, reqs, n);
        workload_bound(out, reqs, n);
        if (cfg->baseline_output_tps > 0)
            out->baseline_ratio = out->output_tps / cfg->baseline_output_tps;
        rc = tenant_figures(out, reqs, n);
    }
    free(ttft);
    free(tpot);
    free(e2e);
    free(itl);
    free(pre);
    return rc;
}

void report_fini(struct report *r)
{
    if (r == NULL)
        return;
    free(r->tenants);
    r->tenants = NULL;
}

/* ---- text ---- */

static void print_num(FILE *f, const char *label, double v, const char *unit)
{
    if (isnan(v))
        fprintf(f, "%-44s %12s\n", label, "n/a");
    else
        fprintf(f, "%-44s %12.3f%s%s\n", label, v, unit[0] ? " " : "", unit);
}

static void print_count(FILE *f, const char *label, unsigned long long v)
{
    fprintf(f, "%-44s %12llu\n", label, v);
}

static void print_summary_row(FILE *f, const char *name, const struct report_summary *s)
{
    if (s->count == 0) {
        fprintf(f, "%-10s %8s  (no samples)\n", name, "0");
        return;
    }
    fprintf(f, "%-10s %8zu %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f %10.3f\n", name, s->count,
            s->mean, s->min, s->p50, s->p90, s->p95, s->p99, s->max);
}

static void print_rule(FILE *f, const char *title)
{
    size_t len = strlen(title);
    size_t left = len < 60 ? (60 - len) / 2 : 0;
    for (size_t i = 0; i < left; i++)
        fputc('-', f);
    fputs(title, f);
    for (size_t i = left + len; i < 60; i++)
        fputc('-', f);
    fputc('\n', f);
}

void report_print(FILE *f, const struct report *r)
{
    const struct report_config *c = &r->cfg;
    fprintf(f, "==================== pagoda-bench report ====================\n");
    fprintf(f, "%-44s %s (seed %llu)\n", "Workload:", c->workload, (unsigned long long)c->seed);
    if (c->workload_params)
        fprintf(f, "%-44s %s\n", "Workload parameters:", c->workload_params);
    if (c->duration_limit_s > 0)
        fprintf(f, "%-44s %.1f s (%zu of the workload's %zu requests sent)\n",
                "Run limited to (--duration):", c->duration_limit_s, r->num_requests,
                c->workload_requests);
    if (c->workload_exhausted)
        fprintf(f, "WORKLOAD USED UP: every request was sent before --duration ran out; the run "
                   "ended early (--num-prompts, or --groups for shared-prefix)\n");
    if (c->open_loop && isinf(c->rate))
        fprintf(f, "%-44s all at once, at most %u in flight\n", "Arrivals:", c->concurrency);
    else if (c->open_loop)
        fprintf(f, "%-44s Poisson, %.3f req/s, at most %u in flight\n", "Arrivals:", c->rate,
                c->concurrency);
    else
        fprintf(f, "%-44s closed loop, %u clients\n", "Arrivals:", c->concurrency);
    print_count(f, "Requests sent:", r->num_requests);
    print_count(f, "Completed requests:", r->completed);
    print_count(f, "Failed requests:", r->failed);
    for (size_t k = 0; k < r->num_failure_kinds; k++)
        fprintf(f, "  %6zu x %s\n", r->failures[k].count, r->failures[k].what);
    if (r->failures_other)
        fprintf(f, "  %6zu x (other errors)\n", r->failures_other);
    if (r->usage_mismatches)
        print_count(f, "Usage disagreeing with tokens received:", r->usage_mismatches);
    if (c->open_loop)
        fprintf(f, "%-44s %12zu (max %.1f ms)\n",
                "Late starts (> 10 ms, all clients busy):", r->late_starts, r->max_late_ms);
    print_num(f, "Duration:", r->duration_s, "s");
    print_count(f, "Input tokens (completed):", r->input_tokens);
    print_count(f, "Output tokens (completed):", r->output_tokens);
    if (r->failed_output_tokens)
        print_count(f, "Output tokens of failed requests:", r->failed_output_tokens);
    print_num(f, "Request throughput:", r->request_throughput, "req/s");
    print_num(f, "Input token throughput:", r->input_tps, "tok/s");
    print_num(f, "Output token throughput:", r->output_tps, "tok/s");
    print_num(f, "Total token throughput:", r->total_tps, "tok/s");
    if (!isnan(r->baseline_ratio)) {
        print_num(f, "Baseline output throughput:", c->baseline_output_tps, "tok/s");
        print_num(f, "Output throughput / baseline:", r->baseline_ratio, "");
    }
    print_rule(f, " latency (ms) ");
    fprintf(f, "%-10s %8s %10s %10s %10s %10s %10s %10s %10s\n", "", "count", "mean", "min", "p50",
            "p90", "p95", "p99", "max");
    print_summary_row(f, "TTFT", &r->ttft_ms);
    print_summary_row(f, "TPOT", &r->tpot_ms);
    print_summary_row(f, "ITL", &r->itl_ms);
    print_summary_row(f, "E2E", &r->e2e_ms);
    print_rule(f, " prefill throughput per request (tok/s) ");
    fprintf(f, "%-10s %8s %10s %10s %10s %10s %10s %10s %10s\n", "", "count", "mean", "min", "p50",
            "p90", "p95", "p99", "max");
    print_summary_row(f, "prefill", &r->prefill_tps);
    fprintf(f, "(prompt tokens computed, i.e. less cached ones, over TTFT, queueing included)\n");
    fprintf(f, "ITL is per token; tokens that arrived in the same poll as the token before\n"
               "share its arrival time (ITL 0):\n");
    fprintf(f,
            "  %llu of %zu ITL samples (%.1f %%); %llu of %llu polls carried more than one\n"
            "  token (at most %u)\n",
            (unsigned long long)r->shared_tokens, r->itl_ms.count,
            isnan(r->shared_fraction) ? 0.0 : 100.0 * r->shared_fraction,
            (unsigned long long)r->multi_token_polls, (unsigned long long)r->polls,
            r->max_poll_tokens);
    fprintf(f, "Percentiles: linear interpolation between closest ranks (numpy's default).\n");
    print_rule(f, " prefix cache and KV ");
    print_count(f, "Cached prompt tokens (usage, completed):", r->cached_tokens);
    print_num(f, "Cached fraction of input tokens:", r->cached_fraction, "");
    if (!r->have_engine) {
        fprintf(f, "Engine figures: unavailable (pagoda_stats failed before or after the run)\n");
    } else {
        print_count(f, "Prefix lookup tokens (engine, delta):", r->prefix_query_tokens);
        print_count(f, "Prefix hit tokens (engine, delta):", r->prefix_hit_tokens);
        print_num(f, "Prefix hit rate:", r->prefix_hit_rate, "");
        print_num(f, "Peak KV usage (engine, since start):", r->peak_kv_usage, "");
        print_num(f, "Max KV usage (sampled during the run):", r->kv_usage_max_sampled, "");
        print_num(f, "Fragmentation, mean (sampled):", r->fragmentation_mean, "");
        print_num(f, "Fragmentation, max (sampled):", r->fragmentation_max, "");
        print_count(f, "Preemptions (delta):", r->preemptions);
        print_count(f, "Evictions (delta):", r->evictions);
        print_count(f, "Steps (delta):", r->steps);
        if (r->engine_wide) {
            print_num(f, "Worker GPU time per step (delta):", r->worker_step_device_ms, "ms");
            print_num(f, "Worker wall time per step (delta):", r->worker_step_wall_ms, "ms");
        }
        print_count(f, "Computed tokens (delta):", r->computed_tokens);
        if (r->engine_wide) {
            print_count(f, "Prefill tokens computed (engine, delta):", r->prefill_tokens);
            print_count(f, "Decode tokens computed (engine, delta):", r->decode_tokens);
            print_num(f, "Engine prefill throughput:", r->engine_prefill_tps, "tok/s");
            print_num(f, "Engine decode throughput:", r->engine_decode_tps, "tok/s");
            print_num(f, "Page locality, mean (sampled):", r->locality_mean, "");
            print_num(f, "Page locality, min (sampled):", r->locality_min, "");
            print_num(f, "Consecutive-block run length, mean:", r->run_length_mean, "blocks");
        } else {
            fprintf(f, "Engine work and page locality: n/a (the stats key is a tenant's: give an "
                       "admin key with --stats-api-key)\n");
        }
        print_count(f, "Cached blocks after the run:", r->cached_blocks_end);
        fprintf(f, "%-44s %12u / %u (%zu samples)\n",
                "Max running / waiting (sampled):", r->running_max, r->waiting_max, r->samples);
    }
    if (r->have_floor) {
        print_rule(f, " bandwidth floor ");
        print_num(f, "Batch (sequences decoding together):", r->batch, "");
        print_num(f, "Mean context per decode step:", r->mean_context, "tokens");
        print_num(f, "Weight bytes per step:", c->weight_bytes / 1e9, "GB");
        print_num(f, "K/V bytes per step:", r->kv_bytes_per_step / 1e9, "GB");
        print_num(f, "Bandwidth:", c->bandwidth_gbs, "GB/s");
        print_num(f, "Floor step time:", r->floor_step_ms, "ms");
        print_num(f, "Measured decode step (median ITL):", r->decode_step_ms, "ms");
        print_num(f, "Median TPOT (prefill stalls included):", r->decode_step_tpot_ms, "ms");
        print_num(f, "Wall time per engine step (cross-check):", r->step_wall_ms, "ms");
        print_num(f, "Fraction of the bandwidth floor:", r->floor_fraction, "");
        if (!r->floor_reliable)
            fprintf(f,
                    "UNRELIABLE: %.0f %% of the tokens arrived several to a poll, so ITL is\n"
                    "not the decode step time (steps faster than the client's polls)\n",
                    100.0 * r->shared_fraction);
    }
    if (r->have_bound) {
        print_rule(f, " compute-and-bandwidth bound ");
        print_num(f, "Prefill FLOPs (computed prompt tokens):", r->bound_prefill_flops / 1e12,
                  "TFLOP");
        print_num(f, "Matrix rate (measured):", c->matrix_tflops, "TFLOP/s");
        print_num(f, "Decode steps (at least):", r->bound_decode_steps, "");
        print_num(f, "Decode bytes (weights per step + K/V):", r->bound_decode_bytes / 1e9, "GB");
        print_num(f, "Bandwidth:", c->bandwidth_gbs, "GB/s");
        print_num(f, "Bound: prefill + decode:", r->bound_prefill_s + r->bound_decode_s, "s");
        print_num(f, "  of which prefill:", r->bound_prefill_s, "s");
        print_num(f, "Output tokens/s at the bound:", r->bound_output_tps, "tok/s");
        print_num(f, "Fraction of the bound (bound / duration):", r->bound_fraction, "");
    }
    if (c->num_tenants > 1 && r->tenants) {
        print_rule(f, " tenants ");
        fprintf(f, "%-16s %6s %6s %6s %9s %9s %10s %10s %10s\n", "tenant", "sent", "done", "failed",
                "out tok", "cached", "TTFT p50", "TTFT p99", "E2E p50");
        for (uint32_t t = 0; t < c->num_tenants; t++) {
            const struct report_tenant *rt = &r->tenants[t];
            fprintf(f, "%-16.16s %6u %6u %6u %9llu %9llu %10.3f %10.3f %10.3f\n",
                    c->tenant_names[t], rt->requests, rt->completed, rt->failed,
                    (unsigned long long)rt->output_tokens, (unsigned long long)rt->cached_tokens,
                    rt->ttft_ms.p50, rt->ttft_ms.p99, rt->e2e_ms.p50);
        }
    }
    fprintf(f, "=============================================================\n");
}

/* ---- JSON ---- */

/* A number, or null when it is not finite (JSON has no NaN or infinity). */
static json_t *jnum(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

/* jansson's *_new setters take the value over even when they fail, and a container that failed
 * to be attached is gone: so after the first failure (*bad set) nothing is attached any more,
 * each value is released instead, and no container is touched again. */
static void put(json_t *obj, const char *key, json_t *v, int *bad)
{
    if (*bad || obj == NULL) {
        json_decref(v);
        *bad = 1;
    } else if (json_object_set_new(obj, key, v) != 0) {
        *bad = 1;
    }
}

static void append(json_t *arr, json_t *v, int *bad)
{
    if (*bad || arr == NULL) {
        json_decref(v);
        *bad = 1;
    } else if (json_array_append_new(arr, v) != 0) {
        *bad = 1;
    }
}

static json_t *summary_json(const struct report_summary *s, int *bad)
{
    json_t *o = json_object();
    put(o, "count", json_integer((json_int_t)s->count), bad);
    put(o, "mean", jnum(s->mean), bad);
    put(o, "min", jnum(s->min), bad);
    put(o, "p50", jnum(s->p50), bad);
    put(o, "p90", jnum(s->p90), bad);
    put(o, "p95", jnum(s->p95), bad);
    put(o, "p99", jnum(s->p99), bad);
    put(o, "max", jnum(s->max), bad);
    return o;
}

static json_t *engine_json(const struct report *r, int *bad)
{
    json_t *e = json_object();
    put(e, "available", json_boolean(r->have_engine), bad);
    put(e, "prefix_query_tokens", json_integer((json_int_t)r->prefix_query_tokens), bad);
    put(e, "prefix_hit_tokens", json_integer((json_int_t)r->prefix_hit_tokens), bad);
    put(e, "prefix_hit_rate", jnum(r->prefix_hit_rate), bad);
    put(e, "peak_kv_usage", jnum(r->have_engine ? r->peak_kv_usage : NAN), bad);
    put(e, "kv_usage_max_sampled", jnum(r->have_engine ? r->kv_usage_max_sampled : NAN), bad);
    put(e, "fragmentation_mean", jnum(r->fragmentation_mean), bad);
    put(e, "fragmentation_max", jnum(r->fragmentation_max), bad);
    put(e, "fragmentation_end", jnum(r->have_engine ? r->fragmentation_end : NAN), bad);
    put(e, "preemptions", json_integer((json_int_t)r->preemptions), bad);
    put(e, "evictions", json_integer((json_int_t)r->evictions), bad);
    put(e, "steps", json_integer((json_int_t)r->steps), bad);
    put(e, "worker_steps_timed", json_integer((json_int_t)r->worker_steps_timed), bad);
    put(e, "worker_step_device_ms", jnum(r->worker_step_device_ms), bad);
    put(e, "worker_step_wall_ms", jnum(r->worker_step_wall_ms), bad);
    put(e, "computed_tokens", json_integer((json_int_t)r->computed_tokens), bad);
    put(e, "prefill_tokens", json_integer((json_int_t)r->prefill_tokens), bad);
    put(e, "decode_tokens", json_integer((json_int_t)r->decode_tokens), bad);
    put(e, "prefill_tps", jnum(r->engine_prefill_tps), bad);
    put(e, "decode_tps", jnum(r->engine_decode_tps), bad);
    put(e, "locality_mean", jnum(r->locality_mean), bad);
    put(e, "locality_min", jnum(r->locality_min), bad);
    put(e, "engine_wide", json_boolean(r->engine_wide), bad);
    put(e, "run_length_mean", jnum(r->run_length_mean), bad);
    put(e, "num_blocks", json_integer(r->num_blocks), bad);
    put(e, "cached_blocks_end", json_integer(r->cached_blocks_end), bad);
    put(e, "running_max", json_integer(r->running_max), bad);
    put(e, "waiting_max", json_integer(r->waiting_max), bad);
    put(e, "samples", json_integer((json_int_t)r->samples), bad);
    return e;
}

static json_t *bound_json(const struct report *r, int *bad)
{
    if (!r->have_bound)
        return json_null();
    json_t *o = json_object();
    put(o, "prefill_flops", jnum(r->bound_prefill_flops), bad);
    put(o, "matrix_tflops", jnum(r->cfg.matrix_tflops), bad);
    put(o, "decode_steps", jnum(r->bound_decode_steps), bad);
    put(o, "decode_bytes", jnum(r->bound_decode_bytes), bad);
    put(o, "bandwidth_gbs", jnum(r->cfg.bandwidth_gbs), bad);
    put(o, "prefill_s", jnum(r->bound_prefill_s), bad);
    put(o, "decode_s", jnum(r->bound_decode_s), bad);
    put(o, "bound_s", jnum(r->bound_s), bad);
    put(o, "output_tps", jnum(r->bound_output_tps), bad);
    put(o, "fraction", jnum(r->bound_fraction), bad);
    put(o, "method",
        json_string("bound = prefill FLOPs (computed prompt tokens through the layers and "
                    "causal attention, one token's logits per request) / matrix rate + (decode "
                    "steps x weight bytes + K/V bytes of every decoded token's context) / "
                    "bandwidth; decode steps = max(ceil(decode tokens / concurrency cap), the "
                    "longest request's decode tokens); fraction = bound / measured duration"),
        bad);
    return o;
}

static json_t *floor_json(const struct report *r, int *bad)
{
    if (!r->have_floor)
        return json_null();
    json_t *o = json_object();
    put(o, "batch", jnum(r->batch), bad);
    put(o, "mean_context", jnum(r->mean_context), bad);
    put(o, "weight_bytes", jnum(r->cfg.weight_bytes), bad);
    put(o, "kv_bytes_per_token", jnum(r->cfg.kv_bytes_per_token), bad);
    put(o, "kv_bytes_per_step", jnum(r->kv_bytes_per_step), bad);
    put(o, "bandwidth_gbs", jnum(r->cfg.bandwidth_gbs), bad);
    put(o, "floor_step_ms", jnum(r->floor_step_ms), bad);
    put(o, "decode_step_ms", jnum(r->decode_step_ms), bad);
    put(o, "tpot_p50_ms", jnum(r->decode_step_tpot_ms), bad);
    put(o, "step_wall_ms", jnum(r->step_wall_ms), bad);
    put(o, "fraction", jnum(r->floor_fraction), bad);
    put(o, "reliable", json_boolean(r->floor_reliable), bad);
    put(o, "method",
        json_string("floor = (weight bytes + batch x mean context x K/V bytes per token) / "
                    "bandwidth; measured = median ITL of a closed loop whose clients decode "
                    "together (tpot_p50_ms: the median TPOT, prefill stalls included)"),
        bad);
    return o;
}

int report_to_json(const struct report *r, json_t **out)
{
    const struct report_config *c = &r->cfg;
    int bad = 0;
    json_t *o = json_object();
    put(o, "workload", json_string(c->workload), &bad);
    put(o, "seed", json_integer((json_int_t)c->seed), &bad);
    put(o, "workload_params", c->workload_params ? json_string(c->workload_params) : json_null(),
        &bad);
    put(o, "duration_limit_s", c->duration_limit_s > 0 ? jnum(c->duration_limit_s) : json_null(),
        &bad);
    put(o, "workload_requests", json_integer((json_int_t)c->workload_requests), &bad);
    put(o, "workload_exhausted", json_boolean(c->workload_exhausted), &bad);
    put(o, "mode", json_string(c->open_loop ? "rate" : "concurrency"), &bad);
    put(o, "request_rate", c->open_loop ? jnum(c->rate) : json_null(), &bad);
    put(o, "concurrency", json_integer(c->concurrency), &bad);
    put(o, "num_requests", json_integer((json_int_t)r->num_requests), &bad);
    put(o, "completed", json_integer((json_int_t)r->completed), &bad);
    put(o, "failed", json_integer((json_int_t)r->failed), &bad);
    json_t *fails = json_array();
    put(o, "failures", fails, &bad);
    for (size_t k = 0; !bad && k < r->num_failure_kinds; k++) {
        json_t *fk = json_object();
        append(fails, fk, &bad);
        put(fk, "error", json_string(r->failures[k].what), &bad);
        put(fk, "count", json_integer((json_int_t)r->failures[k].count), &bad);
    }
    put(o, "failures_other", json_integer((json_int_t)r->failures_other), &bad);
    put(o, "usage_mismatches", json_integer((json_int_t)r->usage_mismatches), &bad);
    put(o, "late_starts", json_integer((json_int_t)r->late_starts), &bad);
    put(o, "max_late_ms", jnum(r->max_late_ms), &bad);
    put(o, "duration_s", jnum(r->duration_s), &bad);
    put(o, "input_tokens", json_integer((json_int_t)r->input_tokens), &bad);
    put(o, "output_tokens", json_integer((json_int_t)r->output_tokens), &bad);
    put(o, "failed_output_tokens", json_integer((json_int_t)r->failed_output_tokens), &bad);
    put(o, "request_throughput", jnum(r->request_throughput), &bad);
    put(o, "input_tps", jnum(r->input_tps), &bad);
    put(o, "output_tps", jnum(r->output_tps), &bad);
    put(o, "total_tps", jnum(r->total_tps), &bad);
    put(o, "ttft_ms", summary_json(&r->ttft_ms, &bad), &bad);
    put(o, "tpot_ms", summary_json(&r->tpot_ms, &bad), &bad);
    put(o, "itl_ms", summary_json(&r->itl_ms, &bad), &bad);
    put(o, "e2e_ms", summary_json(&r->e2e_ms, &bad), &bad);
    put(o, "prefill_tps", summary_json(&r->prefill_tps, &bad), &bad);
    json_t *polls = json_object();
    put(o, "polls", polls, &bad);
    put(polls, "polls", json_integer((json_int_t)r->polls), &bad);
    put(polls, "multi_token_polls", json_integer((json_int_t)r->multi_token_polls), &bad);
    put(polls, "max_tokens_per_poll", json_integer(r->max_poll_tokens), &bad);
    put(polls, "shared_tokens", json_integer((json_int_t)r->shared_tokens), &bad);
    put(polls, "shared_fraction", jnum(r->shared_fraction), &bad);
    put(o, "cached_tokens", json_integer((json_int_t)r->cached_tokens), &bad);
    put(o, "cached_fraction", jnum(r->cached_fraction), &bad);
    put(o, "engine", engine_json(r, &bad), &bad);
    put(o, "bandwidth_floor", floor_json(r, &bad), &bad);
    put(o, "bound", bound_json(r, &bad), &bad);
    json_t *base = isnan(r->baseline_ratio) ? json_null() : json_object();
    put(o, "baseline", base, &bad);
    if (!isnan(r->baseline_ratio)) {
        put(base, "output_tps", jnum(c->baseline_output_tps), &bad);
        put(base, "ratio", jnum(r->baseline_ratio), &bad);
    }
    json_t *tenants = json_array();
    put(o, "tenants", tenants, &bad);
    for (uint32_t t = 0; !bad && r->tenants && t < c->num_tenants; t++) {
        const struct report_tenant *rt = &r->tenants[t];
        json_t *tj = json_object();
        append(tenants, tj, &bad);
        put(tj, "name", json_string(c->tenant_names[t]), &bad);
        put(tj, "requests", json_integer(rt->requests), &bad);
        put(tj, "completed", json_integer(rt->completed), &bad);
        put(tj, "failed", json_integer(rt->failed), &bad);
        put(tj, "input_tokens", json_integer((json_int_t)rt->input_tokens), &bad);
        put(tj, "output_tokens", json_integer((json_int_t)rt->output_tokens), &bad);
        put(tj, "cached_tokens", json_integer((json_int_t)rt->cached_tokens), &bad);
        put(tj, "ttft_ms", summary_json(&rt->ttft_ms, &bad), &bad);
        put(tj, "e2e_ms", summary_json(&rt->e2e_ms, &bad), &bad);
    }
    put(o, "percentile_method", json_string(REPORT_PERCENTILE_METHOD), &bad);
    if (bad) {
        json_decref(o);
        return PAGODA_ENOMEM;
    }
    *out = o;
    return 0;
}

int report_request_to_json(const struct report_request *r, const char *tenant_name, json_t **out)
{
    int bad = 0;
    int ok = report_request_completed(r);
    json_t *o = json_object();
    put(o, "index", json_integer(r->index), &bad);
    put(o, "tenant", tenant_name ? json_string(tenant_name) : json_integer(r->tenant), &bad);
    put(o, "prompt_len", json_integer(r->prompt_len), &bad);
    put(o, "max_tokens", json_integer(r->max_tokens), &bad);
    put(o, "scheduled_s", jnum(r->scheduled_s), &bad);
    put(o, "start_s", jnum(r->start_s), &bad);
    put(o, "end_s", jnum(r->end_s), &bad);
    put(o, "ok", json_boolean(ok), &bad);
    if (ok) {
        put(o, "error", json_null(), &bad);
    } else {
        char what[REPORT_ERROR_MAX];
        failure_text(r, what, sizeof(what));
        put(o, "error", json_string(what), &bad);
    }
    put(o, "finish_reason", json_string(pagoda_finish_reason_name(r->finish_reason)), &bad);
    put(o, "ttft_ms", jnum(ttft_ms(r)), &bad);
    put(o, "tpot_ms", jnum(tpot_ms(r)), &bad);
    put(o, "e2e_ms", jnum(e2e_ms(r)), &bad);
    json_t *itl = json_array(), *ids = json_array();
    put(o, "itl_ms", itl, &bad);
    put(o, "token_ids", ids, &bad);
    for (size_t k = 0; !bad && k < r->num_tokens; k++) {
        if (k > 0)
            append(itl, jnum((r->token_s[k] - r->token_s[k - 1]) * 1e3), &bad);
        append(ids, json_integer(r->token_ids[k]), &bad);
    }
    put(o, "polls", json_integer(r->polls), &bad);
    put(o, "output_tokens", json_integer((json_int_t)r->num_tokens), &bad);
    json_t *usage = json_object();
    put(o, "usage", usage, &bad);
    put(usage, "prompt_tokens", json_integer(r->prompt_tokens), &bad);
    put(usage, "completion_tokens", json_integer(r->completion_tokens), &bad);
    put(usage, "cached_tokens", json_integer(r->cached_tokens), &bad);
    if (bad) {
        json_decref(o);
        return PAGODA_ENOMEM;
    }
    *out = o;
    return 0;
}
