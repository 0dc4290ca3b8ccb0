/* /metrics: the gateway's own figures of the requests it served (latencies as its clients saw
 * them, tokens, finishes) and the engine's gauges from the router's Stats, fetched when scraped,
 * in Prometheus' text format (metrics/metrics.h). Names follow vLLM's where one exists, under
 * "pagoda_". */
#include "gateway/gateway_internal.h"

#include "common/error.h"
#include "common/log.h"

#include <stdlib.h>
#include <string.h>

/* The largest /metrics page. */
#define GATEWAY_MAX_METRICS_BYTES (1u << 20)

int gateway_metrics_init(struct gateway *g)
{
    struct gateway_figures *f = &g->fig;
    memset(f, 0, sizeof(*f));
    if (metrics_hist_init(&f->ttft, metrics_buckets_ttft_s, metrics_buckets_ttft_s_count) ||
        metrics_hist_init(&f->tpot, metrics_buckets_tpot_s, metrics_buckets_tpot_s_count) ||
        metrics_hist_init(&f->itl, metrics_buckets_tpot_s, metrics_buckets_tpot_s_count) ||
        metrics_hist_init(&f->e2e, metrics_buckets_e2e_s, metrics_buckets_e2e_s_count))
        return pagoda_error_set(PAGODA_EINTERNAL, "gateway: bad histogram bounds");
    return 0;
}

void gateway_metrics_fini(struct gateway *g)
{
    (void)g;
}

/* Inter-token latency as the client sees it: the tokens of one piece arrive together, so the
 * first of a piece waited the whole gap since the last piece and the others none; spread evenly
 * (gap / n each) so that the mean is the mean time per token between pieces. */
void gateway_metrics_tokens(struct gateway *g, struct greq *q, size_t n, uint64_t t_ns)
{
    struct gateway_figures *f = &g->fig;
    if (q->t_first_ns == 0) {
        q->t_first_ns = t_ns;
        metrics_hist_observe(&f->ttft, (double)(t_ns - q->t_start_ns) * 1e-9);
        for (size_t i = 1; i < n; i++)
            metrics_hist_observe(&f->itl, 0.0);
    } else {
        double each = (double)(t_ns - q->t_last_ns) * 1e-9 / (double)n;
        for (size_t i = 0; i < n; i++)
            metrics_hist_observe(&f->itl, each);
    }
    q->t_last_ns = t_ns;
}

void gateway_metrics_finish(struct gateway *g, struct greq *q, const pagoda_result *r,
                            uint64_t t_ns)
{
    struct gateway_figures *f = &g->fig;
    if (r->finish_reason >= PAGODA_FINISH_NONE && r->finish_reason <= PAGODA_FINISH_ERROR)
        f->finished[r->finish_reason]++;
    f->prompt_tokens += r->prompt_tokens;
    f->generation_tokens += r->completion_tokens;
    f->cached_tokens += r->cached_tokens;
    metrics_hist_observe(&f->e2e, (double)(t_ns - q->t_start_ns) * 1e-9);
    if (q->offset > 1 && q->t_first_ns != 0)
        metrics_hist_observe(&f->tpot,
                             (double)(q->t_last_ns - q->t_first_ns) * 1e-9 / (q->offset - 1));
}

void gateway_metrics_error(struct gateway *g, int status)
{
    if (status >= 500)
        g->fig.errors_5xx++;
    else if (status >= 400)
        g->fig.errors_4xx++;
}

void gateway_metrics_disconnect(struct gateway *g, struct greq *q)
{
    if (q->generation && !q->finished)
        g->fig.disconnects++;
}

static void counter(struct metrics_buf *b, const char *name, const char *help, double v)
{
    metrics_family(b, name, METRICS_COUNTER, help);
    metrics_sample(b, NULL, 0, v);
}

static void gauge(struct metrics_buf *b, const char *name, const char *help, double v)
{
    metrics_family(b, name, METRICS_GAUGE, help);
    metrics_sample(b, NULL, 0, v);
}

static void histogram(struct metrics_buf *b, const char *name, const char *help,
                      const struct metrics_hist *h)
{
    metrics_family(b, name, METRICS_HISTOGRAM, help);
    metrics_histogram(b, NULL, 0, h);
}

void gateway_metrics_answer(struct greq *q, pagoda_async_result *res)
{
    struct gateway *g = q->g;
    const struct gateway_figures *f = &g->fig;
    struct metrics_buf b;
    metrics_buf_init(&b, GATEWAY_MAX_METRICS_BYTES);
    histogram(&b, "pagoda_time_to_first_token_seconds",
              "Time from a request's arrival at the gateway to its first token.", &f->ttft);
    histogram(&b, "pagoda_time_per_output_token_seconds",
              "Mean time per output token after the first, per request.", &f->tpot);
    histogram(&b, "pagoda_inter_token_latency_seconds",
              "Time between tokens as the client receives them.", &f->itl);
    histogram(&b, "pagoda_e2e_request_latency_seconds",
              "Time from a request's arrival to its last token.", &f->e2e);
    counter(&b, "pagoda_prompt_tokens_total", "Prompt tokens of finished requests.",
            (double)f->prompt_tokens);
    counter(&b, "pagoda_generation_tokens_total", "Tokens generated for finished requests.",
            (double)f->generation_tokens);
    counter(&b, "pagoda_prefix_cache_hit_tokens_total",
            "Prompt tokens of finished requests served from the prefix cache.",
            (double)f->cached_tokens);
    metrics_family(&b, "pagoda_request_success_total", METRICS_COUNTER,
                   "Finished requests by finish reason.");
    static const char *const reasons[] = {"none", "stop", "length", "abort", "error"};
    for (int i = PAGODA_FINISH_STOP; i <= PAGODA_FINISH_ERROR; i++) {
        struct metrics_label l = {"finished_reason", reasons[i]};
        metrics_sample(&b, &l, 1, (double)f->finished[i]);
    }
    counter(&b, "pagoda_client_disconnects_total",
            "Requests whose client went away before the answer was complete (cancelled).",
            (double)f->disconnects);
    metrics_family(&b, "pagoda_http_errors_total", METRICS_COUNTER,
                   "Error responses of the gateway, by class.");
    struct metrics_label l4 = {"class", "4xx"}, l5 = {"class", "5xx"};
    metrics_sample(&b, &l4, 1, (double)f->errors_4xx);
    metrics_sample(&b, &l5, 1, (double)f->errors_5xx);
    gauge(&b, "pagoda_gateway_requests_in_progress",
          "Generation requests the gateway is serving now.", (double)g->num_generations);
    gauge(&b, "pagoda_http_connections", "HTTP connections open now.",
          g->http ? (double)http_server_connections(g->http) : 0.0);
    int up = res->rc == 0 && res->stats.scheduler_connected;
    gauge(&b, "pagoda_engine_up", "1 when the router answered and its scheduler is connected.", up);
    if (res->rc == 0) {
        const pagoda_engine_stats *s = &res->stats;
        gauge(&b, "pagoda_num_requests_running", "Sequences the scheduler runs now.", s->running);
        gauge(&b, "pagoda_num_requests_waiting", "Sequences waiting for the scheduler.",
              s->waiting);
        gauge(&b, "pagoda_kv_cache_usage_perc", "Share of the KV pool in use (0 to 1).",
              s->kv_usage);
        gauge(&b, "pagoda_prefix_cache_hit_rate",
              "Prompt tokens served from the prefix cache over those looked up.",
              s->prefix_hit_rate);
        gauge(&b, "pagoda_kv_cache_fragmentation",
              "Allocated KV slots holding no token over allocated slots.", s->fragmentation);
        counter(&b, "pagoda_num_preemptions_total", "Sequences preempted.", (double)s->preemptions);
        counter(&b, "pagoda_prefix_cache_evictions_total", "Cached KV blocks evicted.",
                (double)s->evictions);
        counter(&b, "pagoda_engine_steps_total", "Engine steps.", (double)s->steps);
    } else {
        log_debug("/metrics without the engine's figures: %s", res->detail);
    }
    if (b.err != 0) {
        metrics_buf_fini(&b);
        gateway_respond_text(q, 500, "text/plain", "metrics could not be rendered\n", 30);
        return;
    }
    gateway_respond_text(q, 200, METRICS_CONTENT_TYPE, b.data, b.len);
    metrics_buf_fini(&b);
}
