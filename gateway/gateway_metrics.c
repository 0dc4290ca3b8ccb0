/* /metrics: the gateway's own figures of the requests it served (latencies as its clients saw
 * them, tokens, finishes) and the engine's gauges from the router's Stats, fetched when scraped,
 * in Prometheus' text format (metrics/metrics.h). Names follow vLLM's where one exists, under
 * "pagoda_".
 *
 * Labelled by tenant where it applies (issue 18): when --stats-key is an admin key of the
 * router, each scrape also asks the router's admin tenants call and exports, per tenant, its
 * running and waiting requests and its namespace's prefix-cache figures (pagoda_tenant_*, label
 * tenant). The engine-wide series stay unlabelled beside them, so that sums over tenants are
 * never double counted. With any other key (or a router without a tenants file) the router
 * refuses the call and the page goes without the tenant series. The gateway's own figures are
 * not split by tenant: it knows API keys, not tenants (the router maps one to the other).
 *
 * Labelled by engine (issue 20): a router with several engines lists each one in its Stats, and
 * the page then has pagoda_engine_* series with labels engine and address (engine_series); the
 * unlabelled engine-wide series are the router's merge of the engines (counts summed, ratios
 * averaged: docs/routing.md). */
#include "gateway/gateway_internal.h"

#include "common/error.h"
#include "common/log.h"

#include <stdio.h>
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
void gateway_metrics_tokens(struct gateway *g, struct gchoice *c, size_t n, uint64_t t_ns)
{
    struct gateway_figures *f = &g->fig;
    if (c->t_first_ns == 0) {
        c->t_first_ns = t_ns;
        metrics_hist_observe(&f->ttft, (double)(t_ns - c->q->t_start_ns) * 1e-9);
        for (size_t i = 1; i < n; i++)
            metrics_hist_observe(&f->itl, 0.0);
    } else {
        double each = (double)(t_ns - c->t_last_ns) * 1e-9 / (double)n;
        for (size_t i = 0; i < n; i++)
            metrics_hist_observe(&f->itl, each);
    }
    c->t_last_ns = t_ns;
}

void gateway_metrics_finish(struct gateway *g, struct gchoice *c, const pagoda_result *r,
                            uint64_t t_ns)
{
    struct gateway_figures *f = &g->fig;
    if (r->finish_reason >= PAGODA_FINISH_NONE && r->finish_reason <= PAGODA_FINISH_ERROR)
        f->finished[r->finish_reason]++;
    f->prompt_tokens += r->prompt_tokens;
    f->generation_tokens += r->completion_tokens;
    f->cached_tokens += r->cached_tokens;
    metrics_hist_observe(&f->e2e, (double)(t_ns - c->q->t_start_ns) * 1e-9);
    if (c->offset > 1 && c->t_first_ns != 0)
        metrics_hist_observe(&f->tpot,
                             (double)(c->t_last_ns - c->t_first_ns) * 1e-9 / (c->offset - 1));
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

static void render(struct greq *q, const pagoda_async_result *res,
                   const pagoda_admin_list *tenants);

/* Room for an engine's index as a label value. */
#define GATEWAY_ENGINE_LABEL_BYTES 12u

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

/* The per-tenant series of the router's tenants list. */
static void tenant_series(struct metrics_buf *b, const pagoda_admin_list *l)
{
    if (l->num_tenants == 0)
        return;
    static const struct {
        const char *name, *help;
        enum metrics_type type;
    } fam[] = {
        {"pagoda_tenant_num_requests_running", "The tenant's sequences the scheduler runs now.",
         METRICS_GAUGE},
        {"pagoda_tenant_num_requests_waiting", "The tenant's sequences waiting for the scheduler.",
         METRICS_GAUGE},
        {"pagoda_tenant_prefix_cache_hit_rate",
         "Prompt tokens of the tenant's requests served from the prefix cache over those looked "
         "up.",
         METRICS_GAUGE},
        {"pagoda_tenant_prefix_cache_blocks",
         "KV blocks cached in the tenant's namespace (its group's when it is in one).",
         METRICS_GAUGE},
        {"pagoda_tenant_prefix_cache_queries_total",
         "Prompt tokens of the tenant's requests looked up in the prefix cache.", METRICS_COUNTER},
        {"pagoda_tenant_prefix_cache_hits_total",
         "Prompt tokens of the tenant's requests served from the prefix cache.", METRICS_COUNTER},
        {"pagoda_tenant_prefix_cache_evictions_total",
         "Cached KV blocks evicted from the tenant's namespace.", METRICS_COUNTER},
    };
    for (size_t k = 0; k < sizeof(fam) / sizeof(fam[0]); k++) {
        metrics_family(b, fam[k].name, fam[k].type, fam[k].help);
        for (size_t i = 0; i < l->num_tenants; i++) {
            const pagoda_tenant_info *t = &l->tenants[i];
            const double v[] = {t->running,
                                t->waiting,
                                t->hit_rate,
                                t->cached_blocks,
                                (double)t->query_tokens,
                                (double)t->hit_tokens,
                                (double)t->evictions};
            struct metrics_label label = {"tenant", t->name ? t->name : ""};
            metrics_sample(b, &label, 1, v[k]);
        }
    }
}

/* The per-engine series of a router with several engines (pagoda_engine_stats.engines), each
 * sample labelled engine (its index) and address (its scheduler's; one per engine, so it adds no
 * series, and it spares dashboards a join). pagoda_engine_up is one of them: with several
 * engines it has one labelled sample per engine instead of the single unlabelled one (render). */
static void engine_series(struct metrics_buf *b, const pagoda_engine_stats *s)
{
    static const struct {
        const char *name, *help;
        enum metrics_type type;
    } fam[] = {
        {"pagoda_engine_up", "1 when the router's link to the engine is up and it answers.",
         METRICS_GAUGE},
        {"pagoda_engine_load",
         "The engine's load as routing sees it: the larger of its running plus waiting requests "
         "and the router's unfinished requests on it.",
         METRICS_GAUGE},
        {"pagoda_engine_running", "Sequences the engine's scheduler runs now.", METRICS_GAUGE},
        {"pagoda_engine_waiting", "Sequences waiting for the engine's scheduler.", METRICS_GAUGE},
        {"pagoda_engine_prefix_query_tokens_total",
         "Prompt tokens the engine looked up in its prefix cache.", METRICS_COUNTER},
        {"pagoda_engine_prefix_hit_tokens_total",
         "Prompt tokens the engine served from its prefix cache.", METRICS_COUNTER},
        {"pagoda_engine_routed_total", "Requests the router sent the engine (moves included).",
         METRICS_COUNTER},
        {"pagoda_engine_prefix_waits_total",
         "Requests whose admission on the engine waited for another sequence to compute their "
         "next prefix block.",
         METRICS_COUNTER},
    };
    for (size_t k = 0; k < sizeof(fam) / sizeof(fam[0]); k++) {
        metrics_family(b, fam[k].name, fam[k].type, fam[k].help);
        for (uint32_t i = 0; i < s->num_engines; i++) {
            const pagoda_engine_info *e = &s->engines[i];
            const double v[] = {e->connected ? 1.0 : 0.0,
                                (double)e->load,
                                e->running,
                                e->waiting,
                                (double)e->prefix_query_tokens,
                                (double)e->prefix_hit_tokens,
                                (double)e->routed,
                                (double)e->prefix_waits};
            char index[GATEWAY_ENGINE_LABEL_BYTES];
            snprintf(index, sizeof(index), "%u", e->engine);
            struct metrics_label labels[] = {{"engine", index}, {"address", e->address}};
            metrics_sample(b, labels, 2, v[k]);
        }
    }
}

void gateway_metrics_answer(struct greq *q, pagoda_async_result **resp)
{
    struct gateway *g = q->g;
    if (q->http != NULL && g->stats_key != NULL && (*resp)->rc == 0 &&
        gateway_call_started(q, pagoda_admin_tenants_async(g->client, g->stats_key,
                                                           gateway_on_tenants_call, q)) == 0) {
        q->stats_res = *resp;
        *resp = NULL;
        return;
    }
    render(q, *resp, NULL);
}

void gateway_metrics_tenants(struct greq *q, pagoda_async_result *res)
{
    if (res->rc != 0)
        log_debug("/metrics without the tenants' figures: %s", res->detail);
    render(q, q->stats_res, res->rc == 0 ? &res->tenants : NULL);
}

/* Renders the page from the router's Stats (res) and its tenants (NULL: none) and answers q. */
static void render(struct greq *q, const pagoda_async_result *res, const pagoda_admin_list *tenants)
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
          "Generation requests the gateway is serving now (a request of n choices counts n).",
          (double)g->num_generations);
    gauge(&b, "pagoda_http_connections", "HTTP connections open now.",
          g->http ? (double)http_server_connections(g->http) : 0.0);
    gauge(&b, "pagoda_http_write_bytes",
          "Bytes of responses held until the kernel takes them (--max-write-memory).",
          g->http ? (double)http_server_write_bytes(g->http) : 0.0);
    counter(&b, "pagoda_http_connection_evictions_total",
            "Connections closed at --max-connections to take a new one in their place (idle, "
            "or whose request had not all arrived).",
            g->http ? (double)http_server_evictions(g->http) : 0.0);
    counter(&b, "pagoda_http_write_cuts_total",
            "Connections cut because the responses held for slow readers reached "
            "--max-write-memory.",
            g->http ? (double)http_server_write_cuts(g->http) : 0.0);
    /* One engine (its router lists none) or no answer: one unlabelled pagoda_engine_up, as
     * always; several: one sample per engine (engine_series). */
    int up = res->rc == 0 && res->stats->scheduler_connected;
    if (res->rc == 0 && res->stats->num_engines > 0)
        engine_series(&b, res->stats);
    else
        gauge(&b, "pagoda_engine_up", "1 when the router answered and its scheduler is connected.",
              up);
    if (res->rc == 0) {
        const pagoda_engine_stats *s = res->stats;
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
        counter(&b, "pagoda_prefix_waits_total",
                "Requests whose admission waited for another sequence to compute their next "
                "prefix block (to hit it in the prefix cache instead of computing it beside).",
                (double)s->prefix_waits);
        counter(&b, "pagoda_router_messages_lost_total",
                "Scheduler messages to the router that the link refused (made good by a resend).",
                (double)s->router_drops);
        counter(&b, "pagoda_router_resends_total",
                "Resends of every request the scheduler holds, after lost messages.",
                (double)s->router_resends);
        counter(&b, "pagoda_router_event_gaps_total",
                "Token events the router ignored for coming from beyond the output it held.",
                (double)s->event_gaps);
        counter(&b, "pagoda_router_text_jobs_total",
                "Text jobs the router ran: prompts rendered and tokenized (text Submits, "
                "Tokenize calls), ids decoded (Detokenize calls).",
                (double)s->text_jobs);
        if (s->kv_cache_dtype[0] != '\0') { /* as vLLM's cache_config_info: the value a label */
            metrics_family(&b, "pagoda_kv_cache_dtype_info", METRICS_GAUGE,
                           "The engines' K/V cache element (torch's spelling) as the dtype label; "
                           "absent when they differ.");
            const struct metrics_label label = {"dtype", s->kv_cache_dtype};
            metrics_sample(&b, &label, 1, 1.0);
        }
    } else {
        log_debug("/metrics without the engine's figures: %s", res->detail);
    }
    if (tenants != NULL)
        tenant_series(&b, tenants);
    if (b.err != 0) {
        metrics_buf_fini(&b);
        gateway_respond_text(q, 500, "text/plain", "metrics could not be rendered\n", 30);
        return;
    }
    gateway_respond_text(q, 200, METRICS_CONTENT_TYPE, b.data, b.len);
    metrics_buf_fini(&b);
}
