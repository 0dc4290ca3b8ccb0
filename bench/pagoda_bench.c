/* pagoda-bench: the serving benchmark. Sends a workload (bench/workload.h) to a pagoda router
 * through libpagoda, open loop (Poisson arrivals at --rate, or a --sweep of rates) or closed loop
 * (--concurrency clients), and reports throughput, TTFT, TPOT, ITL, end-to-end latency, prefix
 * hits, KV usage, preemptions and fragmentation (bench/report.h), as text and as JSON.
 *
 * Each request runs on a client thread in one pagoda_generate_stream call; the stream callback
 * timestamps every poll's tokens (CLOCK_MONOTONIC). With --api openai the same workload goes to
 * an OpenAI-compatible server as streamed completions (bench/openai_client.h), one kept-alive
 * connection per client thread, and the tokens are timestamped as each SSE chunk arrives. Open
 * loop: each thread takes the next request in arrival order and sleeps until its arrival time, so
 * at most --max-concurrency requests are in flight and a request that finds every thread busy
 * starts late (the report counts those). Closed loop: --concurrency threads each send their next
 * request as soon as the previous one ends. A sampler thread reads pagoda_stats() during the run.
 *
 * Exit status: 0 when the benchmark ran (failed requests are in the report), 1 when it could not
 * run (no router, an I/O error), 2 for bad flags or a workload that does not fit the model. */
#include "bench/bench_options.h"
#include "bench/floor.h"
#include "bench/openai_client.h"
#include "bench/plot.h"
#include "bench/report.h"
#include "bench/timeline.h"
#include "bench/workload.h"
#include "client/pagoda.h"
#include "common/dtype.h"
#include "common/error.h"
#include "model/model_config.h"

#include <curl/curl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- the run ---- */

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_until(double t)
{
    struct timespec ts;
    ts.tv_sec = (time_t)t;
    ts.tv_nsec = (long)((t - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

struct run {
    const struct workload *w;
    pagoda_client **clients; /* one per tenant (--api pagoda) */
    /* --api openai: the server, each tenant's key, the model's name. */
    enum bench_api api;
    const char *url, *model_name;
    char **api_keys;
    uint32_t timeout_ms;
    struct report_request *recs;
    pagoda_generate_params params;
    uint64_t seed;
    int open_loop;
    double t0;
    double deadline_s; /* > 0: no request starts this long after t0 (--duration) */
    atomic_size_t next;
};

struct stream_ctx {
    struct report_request *rec;
    double t0;
    int overflow;
};

static void on_tokens(void *user, uint32_t offset, const int32_t *ids, const float *logprobs,
                      size_t n)
{
    struct stream_ctx *s = user;
    double t = now_s() - s->t0;
    if (offset != s->rec->num_tokens || report_request_add_tokens(s->rec, t, ids, n) != 0)
        s->overflow = 1;
}

static void record_error(struct report_request *rec, int rc)
{
    char msg[REPORT_ERROR_MAX];
    rec->rc = rc;
    snprintf(rec->error, sizeof(rec->error), "%s", pagoda_error_message(rc, msg, sizeof(msg)));
}

static void run_one(struct run *run, struct openai_client *http, size_t i)
{
    const struct workload_request *q = &run->w->requests[i];
    struct report_request *rec = &run->recs[i];
    rec->sent = 1;
    rec->index = (uint32_t)i;
    rec->tenant = q->tenant;
    rec->prompt_len = q->prompt_len;
    rec->max_tokens = q->max_tokens;
    rec->scheduled_s = run->open_loop ? q->arrival_s : 0;
    pagoda_generate_params p = run->params;
    p.max_tokens = (int32_t)q->max_tokens;
    p.has_seed = 1;
    p.seed = run->seed + i;
    struct stream_ctx ctx = {.rec = rec, .t0 = run->t0};
    pagoda_result res;
    memset(&res, 0, sizeof(res));
    int rc = report_request_reserve(rec, q->max_tokens);
    rec->start_s = now_s() - run->t0;
    if (rc == 0 && run->api == BENCH_API_OPENAI)
        rc = http == NULL
                 ? pagoda_error_set(PAGODA_ENOMEM, "no HTTP client for this thread")
                 : openai_client_stream(http, run->api_keys[q->tenant], run->model_name, &p,
                                        q->prompt, q->prompt_len, on_tokens, &ctx, &res);
    else if (rc == 0)
        rc = pagoda_generate_stream(run->clients[q->tenant], &p, q->prompt, q->prompt_len,
                                    on_tokens, &ctx, &res);
    rec->end_s = now_s() - run->t0;
    if (rc != 0) {
        record_error(rec, rc);
    } else if (ctx.overflow || res.num_tokens != rec->num_tokens) {
        rec->rc = PAGODA_EPROTO;
        snprintf(rec->error, sizeof(rec->error),
                 "the stream delivered %zu tokens out of order or beyond max_tokens %u "
                 "(the result has %zu)",
                 rec->num_tokens, q->max_tokens, res.num_tokens);
    }
    rec->finish_reason = res.finish_reason;
    rec->prompt_tokens = res.prompt_tokens;
    rec->completion_tokens = res.completion_tokens;
    rec->cached_tokens = res.cached_tokens;
    if (rc == 0 && res.error_message != NULL)
        snprintf(rec->error, sizeof(rec->error), "%s", res.error_message);
    pagoda_result_free(&res);
}

static void *client_thread(void *arg)
{
    struct run *run = arg;
    /* One connection per thread, kept alive between its requests (made before the first). */
    struct openai_client *http =
        run->api == BENCH_API_OPENAI ? openai_client_new(run->url, run->timeout_ms) : NULL;
    for (;;) {
        size_t i = atomic_fetch_add(&run->next, 1);
        if (i >= run->w->num_requests)
            break;
        /* --duration: no request starts at or after the deadline, whether by its arrival time
         * (open loop) or because the clients fell behind (every thread busy past it). */
        if (run->deadline_s > 0 &&
            (now_s() - run->t0 >= run->deadline_s ||
             (run->open_loop && run->w->requests[i].arrival_s >= run->deadline_s)))
            break; /* this and every later index: the run is over */
        if (run->open_loop)
            sleep_until(run->t0 + run->w->requests[i].arrival_s);
        run_one(run, http, i);
    }
    openai_client_free(http);
    return NULL;
}

/* The sampler: pagoda_stats every interval until told to stop. */
struct sampler {
    pagoda_client *client;
    uint32_t interval_ms;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    struct report_engine *eng;
    double t0;
    struct timeline_sample *samples; /* for the timeline, up to TIMELINE_MAX_SAMPLES */
    size_t num_samples, cap_samples;
    int samples_full; /* said once */
};

static void keep_sample(struct sampler *s, const pagoda_engine_stats *st)
{
    if (s->num_samples == s->cap_samples) {
        size_t cap = s->cap_samples ? s->cap_samples * 2 : 256;
        if (cap > TIMELINE_MAX_SAMPLES)
            cap = TIMELINE_MAX_SAMPLES;
        if (cap == s->num_samples) {
            if (!s->samples_full) {
                s->samples_full = 1;
                fprintf(stderr,
                        "pagoda-bench: %u engine samples kept; the timeline has no engine "
                        "figures from %.0f s on (raise --stats-interval-ms)\n",
                        TIMELINE_MAX_SAMPLES, now_s() - s->t0);
            }
            return;
        }
        struct timeline_sample *p = realloc(s->samples, cap * sizeof(*p));
        if (p == NULL)
            return; /* the timeline misses this sample; the run goes on */
        s->samples = p;
        s->cap_samples = cap;
    }
    s->samples[s->num_samples].t_s = now_s() - s->t0;
    timeline_stats_of(st, &s->samples[s->num_samples++].st);
}

static void *sampler_thread(void *arg)
{
    struct sampler *s = arg;
    pthread_mutex_lock(&s->lock);
    while (!s->stop) {
        pthread_mutex_unlock(&s->lock);
        pagoda_engine_stats st;
        if (pagoda_stats(s->client, &st) == 0) {
            struct report_engine *e = s->eng;
            e->samples++;
            if (st.kv_usage > e->kv_usage_max)
                e->kv_usage_max = st.kv_usage;
            if (st.num_blocks > 0 && st.free_blocks < st.num_blocks) {
                e->fragmentation_samples++;
                e->fragmentation_sum += st.fragmentation;
                if (st.fragmentation > e->fragmentation_max)
                    e->fragmentation_max = st.fragmentation;
            }
            /* A tenant's key gets no engine-wide figures (locality and the work counters read
             * 0): only the engine's own stats count. */
            if (st.running > 0 && st.tenant[0] == '\0') {
                if (e->locality_samples == 0 || st.locality < e->locality_min)
                    e->locality_min = st.locality;
                e->locality_samples++;
                e->locality_sum += st.locality;
                e->run_length_sum += st.locality_run_length;
            }
            keep_sample(s, &st);
            if (st.running > e->running_max)
                e->running_max = st.running;
            if (st.waiting > e->waiting_max)
                e->waiting_max = st.waiting;
        }
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_sec += s->interval_ms / 1000;
        ts.tv_nsec += (long)(s->interval_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) {
            ts.tv_sec++;
            ts.tv_nsec -= 1000000000L;
        }
        pthread_mutex_lock(&s->lock);
        while (!s->stop && pthread_cond_timedwait(&s->cond, &s->lock, &ts) == 0) {
        }
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

struct bench {
    struct options *o;
    struct workload w;
    pagoda_client **clients;     /* --api pagoda */
    char **api_keys;             /* --api openai: each tenant's key (copies; NULL: none) */
    char *model_name;            /* --api openai: the requests' "model" */
    pagoda_client *stats_client; /* NULL: no engine figures (--api openai without --stats-url) */
    const char **tenant_names;   /* copies, num_tenants of them */
    uint32_t num_tenants;
    FILE *requests_out;
    double weight_bytes, kv_bytes_per_token, flops_per_token, lm_head_flops,
        attention_flops_per_key;
    double kv_elems_per_token; /* K/V elements a token keeps: kv_bytes_per_token / their size */
    int kv_dtype_warned;       /* floor_kv_from_engine said so once (a sweep runs many times) */
    char workload_params[256];
    /* The last single run's timeline (not for sweeps). */
    struct timeline_sample *samples;
    size_t num_samples;
    struct timeline_window *timeline;
    size_t num_windows;
    double timeline_interval_s;
};

/* The bytes of the K/V element the engines name in their stats (dtype_torch_name's spelling),
 * 0 unknown. */
static int kv_dtype_bytes(const char *name)
{
    for (int t = DTYPE_BF16; t <= DTYPE_F8E4M3; t++)
        if (strcmp(name, dtype_torch_name((enum dtype)t)) == 0)
            return (int)dtype_size((enum dtype)t);
    return 0;
}

/* The floor's K/V bytes a token from the element the engines keep (kv_cache_dtype of their
 * stats, "" when unknown) when --kv-dtype-bytes was not given; a given one that differs is kept,
 * and an unknown element leaves the default: each with a warning, once. */
static void floor_kv_from_engine(struct bench *b, const char *kv_cache_dtype)
{
    const int bytes = kv_dtype_bytes(kv_cache_dtype);
    if (bytes == 0) {
        if (!GIVEN(b->o, OPT_KV_DTYPE_BYTES) && !b->kv_dtype_warned++)
            fprintf(stderr,
                    "pagoda-bench: the engines' K/V element is unknown (no stats, a tenant's "
                    "key, or an element not known here): the floor counts %d bytes an element "
                    "(--kv-dtype-bytes)\n",
                    b->o->kv_dtype_bytes);
        return;
    }
    if (!GIVEN(b->o, OPT_KV_DTYPE_BYTES))
        b->kv_bytes_per_token = b->kv_elems_per_token * bytes;
    else if (bytes != b->o->kv_dtype_bytes && !b->kv_dtype_warned++)
        fprintf(stderr,
                "pagoda-bench: --kv-dtype-bytes %d, but the engines keep K/V as %s (%d bytes an "
                "element): the floor counts %d\n",
                b->o->kv_dtype_bytes, kv_cache_dtype, bytes, b->o->kv_dtype_bytes);
}

/* One run of the workload (all of it, or what --duration lets start). recs (num_requests of
 * them) are filled, those sent marked; *eng with stats; b->samples with the stats sampled. */
static int run_workload(struct bench *b, int open_loop, uint32_t threads,
                        struct report_request *recs, struct report_engine *eng)
{
    struct run run = {.w = &b->w,
                      .clients = b->clients,
                      .api = b->o->api,
                      .url = b->o->url,
                      .model_name = b->model_name,
                      .api_keys = b->api_keys,
                      .timeout_ms = b->o->timeout_ms ? b->o->timeout_ms : PAGODA_DEFAULT_TIMEOUT_MS,
                      .recs = recs,
                      .open_loop = open_loop,
                      .deadline_s = b->o->duration_s,
                      .seed = b->w.seed};
    run.params = pagoda_generate_params_default();
    run.params.temperature = (float)b->o->temperature;
    run.params.ignore_eos = b->o->ignore_eos;
    atomic_init(&run.next, 0);
    memset(eng, 0, sizeof(*eng));
    eng->have_before = b->stats_client != NULL && pagoda_stats(b->stats_client, &eng->before) == 0;
    if (!eng->have_before && b->stats_client != NULL)
        fprintf(stderr, "pagoda-bench: stats before the run: %s\n", pagoda_error_detail());
    if (b->o->bandwidth_gbs > 0)
        floor_kv_from_engine(b, eng->have_before ? eng->before.kv_cache_dtype : "");

    run.t0 = now_s();
    struct sampler s = {.client = b->stats_client,
                        .interval_ms = b->o->stats_interval_ms,
                        .eng = eng,
                        .t0 = run.t0};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_t sampler;
    int have_sampler =
        b->stats_client != NULL && pthread_create(&sampler, NULL, sampler_thread, &s) == 0;

    pthread_t *tids = calloc(threads, sizeof(*tids));
    if (tids == NULL)
        threads = 0;
    uint32_t started = 0;
    for (; started < threads; started++)
        if (pthread_create(&tids[started], NULL, client_thread, &run) != 0)
            break;
    if (started == 0 && b->w.num_requests > 0) {
        /* Not even one thread: run the requests here, so that none is silently skipped. */
        client_thread(&run);
    }
    for (uint32_t t = 0; t < started; t++)
        pthread_join(tids[t], NULL);
    free(tids);
    if (started < threads)
        fprintf(stderr, "pagoda-bench: only %u of %u client threads started\n", started, threads);

    if (have_sampler) {
        pthread_mutex_lock(&s.lock);
        s.stop = 1;
        pthread_cond_signal(&s.cond);
        pthread_mutex_unlock(&s.lock);
        pthread_join(sampler, NULL);
    }
    pthread_mutex_destroy(&s.lock);
    pthread_cond_destroy(&s.cond);
    free(b->samples);
    b->samples = s.samples;
    b->num_samples = s.num_samples;
    eng->have_after = b->stats_client != NULL && pagoda_stats(b->stats_client, &eng->after) == 0;
    if (!eng->have_after && b->stats_client != NULL)
        fprintf(stderr, "pagoda-bench: stats after the run: %s\n", pagoda_error_detail());
    return 0;
}

static int write_requests(struct bench *b, const struct report_request *recs, size_t n, double rate,
                          int sweep)
{
    if (b->requests_out == NULL)
        return 0;
    for (size_t i = 0; i < n; i++) {
        json_t *o = NULL;
        int rc = report_request_to_json(&recs[i], b->tenant_names[recs[i].tenant], &o);
        if (rc == 0 && sweep &&
            json_object_set_new(o, "rate", isfinite(rate) ? json_real(rate) : json_null()) != 0)
            rc = PAGODA_ENOMEM;
        if (rc == 0 && (json_dumpf(o, b->requests_out, JSON_COMPACT) != 0 ||
                        fputc('\n', b->requests_out) == EOF))
            rc = pagoda_error_set(PAGODA_EIO, "--output-requests: write failed");
        json_decref(o);
        if (rc != 0)
            return rc;
    }
    return 0;
}

/* Runs the workload once (open loop at rate, or closed loop) and computes its report. */
static int bench_once(struct bench *b, int open_loop, double rate, int sweep, struct report *rep)
{
    const struct options *o = b->o;
    size_t n = b->w.num_requests;
    uint32_t cap = open_loop ? o->max_concurrency : o->concurrency;
    uint32_t threads = n < cap ? (uint32_t)n : cap;
    if (open_loop)
        workload_poisson_arrivals(&b->w, rate);
    struct report_request *recs = calloc(n, sizeof(*recs));
    if (recs == NULL)
        return PAGODA_ENOMEM;
    struct report_engine eng;
    int rc = run_workload(b, open_loop, threads, recs, &eng);
    size_t sent = 0; /* the records sent, in index order, moved to the front */
    for (size_t i = 0; i < n; i++)
        if (recs[i].sent)
            recs[sent++] = recs[i];
    struct report_config cfg = {
        .workload = workload_kind_name(b->w.kind),
        .workload_params = b->workload_params[0] ? b->workload_params : NULL,
        .duration_limit_s = o->duration_s,
        .workload_exhausted = o->duration_s > 0 && sent == n,
        .workload_requests = n,
        .seed = b->w.seed,
        .open_loop = open_loop,
        .rate = rate,
        .concurrency = cap,
        .tenant_names = b->tenant_names,
        .num_tenants = b->w.tenants.num_tenants,
        .bandwidth_gbs = o->bandwidth_gbs,
        .weight_bytes = b->weight_bytes,
        .kv_bytes_per_token = b->kv_bytes_per_token,
        .matrix_tflops = o->matrix_tflops,
        .flops_per_token = b->flops_per_token,
        .lm_head_flops = b->lm_head_flops,
        .attention_flops_per_key = b->attention_flops_per_key,
        .baseline_output_tps = o->baseline_tps,
    };
    if (cfg.workload_exhausted)
        fprintf(stderr,
                "pagoda-bench: the workload's %zu requests were all sent before "
                "--duration %.1f s ran out: the run ended early\n",
                n, o->duration_s);
    if (rc == 0)
        rc = report_compute(&cfg, recs, sent, &eng, rep);
    if (rc == 0)
        rc = write_requests(b, recs, sent, rate, sweep);
    if (rc == 0 && !sweep) {
        free(b->timeline);
        b->timeline = NULL;
        double end = rep->duration_s;
        if (b->num_samples > 0 && b->samples[b->num_samples - 1].t_s > end)
            end = b->samples[b->num_samples - 1].t_s;
        rc = timeline_compute(b->samples, b->num_samples, eng.have_before ? &eng.before : NULL,
                              recs, sent, o->timeline_interval_s, end, &b->timeline,
                              &b->num_windows, &b->timeline_interval_s);
    }
    for (size_t i = 0; i < sent; i++)
        report_request_fini(&recs[i]);
    free(recs);
    return rc;
}

/* A few requests before measuring, so that the first measured ones do not pay for cold caches.
 * Their prompts come from another seed than the workload's and share nothing with it. */
static void warm_up(struct bench *b)
{
    int32_t prompt[BENCH_WARMUP_PROMPT_LEN];
    uint64_t x = b->o->seed ^ 0x7761726d7570ull;
    struct openai_client *http = NULL;
    if (b->o->api == BENCH_API_OPENAI && b->o->warmup > 0 &&
        (http = openai_client_new(b->o->url, PAGODA_DEFAULT_TIMEOUT_MS)) == NULL) {
        fprintf(stderr, "pagoda-bench: no HTTP client for the warm-up\n");
        return;
    }
    for (uint32_t i = 0; i < b->o->warmup; i++) {
        for (size_t k = 0; k < BENCH_WARMUP_PROMPT_LEN; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            prompt[k] = (int32_t)((x >> 33) % (uint64_t)b->w.vocab);
        }
        pagoda_generate_params p = pagoda_generate_params_default();
        p.temperature = 0;
        p.max_tokens = BENCH_WARMUP_MAX_TOKENS;
        p.ignore_eos = 1;
        pagoda_result res;
        int rc = http != NULL
                     ? openai_client_stream(http, b->api_keys[0], b->model_name, &p, prompt,
                                            BENCH_WARMUP_PROMPT_LEN, NULL, NULL, &res)
                     : pagoda_generate(b->clients[0], &p, prompt, BENCH_WARMUP_PROMPT_LEN, &res);
        if (rc != 0)
            fprintf(stderr, "pagoda-bench: warm-up request %u: %s\n", i, pagoda_error_detail());
        pagoda_result_free(&res);
    }
    openai_client_free(http);
}

static int write_json_file(const char *path, json_t *doc)
{
    if (json_dump_file(doc, path, JSON_INDENT(2) | JSON_REAL_PRECISION(10)) != 0)
        return pagoda_error_set(PAGODA_EIO, "%s: cannot write the JSON", path);
    return 0;
}

static void print_sweep_table(FILE *f, const struct report *reps, size_t n)
{
    fprintf(f, "\nSweep summary (ms; tok/s):\n");
    fprintf(f, "| rate | done | failed | req/s | out tok/s | TTFT p50 | TTFT p99 | TPOT p50 | "
               "TPOT p99 | ITL p99 | E2E p50 | E2E p99 |\n");
    fprintf(f, "|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < n; i++) {
        const struct report *r = &reps[i];
        fprintf(f,
                "| %.3g | %zu | %zu | %.3f | %.1f | %.1f | %.1f | %.2f | %.2f | %.2f | %.1f | "
                "%.1f |\n",
                r->cfg.rate, r->completed, r->failed, r->request_throughput, r->output_tps,
                r->ttft_ms.p50, r->ttft_ms.p99, r->tpot_ms.p50, r->tpot_ms.p99, r->itl_ms.p99,
                r->e2e_ms.p50, r->e2e_ms.p99);
    }
}

/* Reads the model's vocabulary, positions and shape (for the floor). */
static int load_model(struct bench *b, struct model_config *cfg, int *have_cfg)
{
    struct options *o = b->o;
    *have_cfg = 0;
    if (GIVEN(o, OPT_VOCAB))
        return 0;
    const char *dir = o->model_dir;
    if (dir == NULL) {
        char probe[1024];
        snprintf(probe, sizeof(probe), "%s/config.json", PAGODA_BENCH_DEFAULT_MODEL);
        if (access(probe, R_OK) != 0)
            return pagoda_error_set(PAGODA_ENOENT,
                                    "no --model DIR (nor --vocab N --max-context N), and the "
                                    "bundled model %s has no config.json (it is committed "
                                    "in assets/)",
                                    PAGODA_BENCH_DEFAULT_MODEL);
        dir = PAGODA_BENCH_DEFAULT_MODEL;
    }
    int rc = model_config_load(dir, cfg);
    if (rc != 0)
        return rc;
    if (cfg->vocab_size > INT32_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "%s: vocab_size %lld is too large", dir,
                                (long long)cfg->vocab_size);
    o->vocab = (int32_t)cfg->vocab_size;
    o->max_context = cfg->max_position_embeddings;
    *have_cfg = 1;
    return 0;
}

/* Builds the workload from seed (the tenants from their file or flags each time). */
static int build_workload(struct bench *b, uint64_t seed)
{
    struct options *o = b->o;
    struct workload_tenants t;
    int rc;
    if (o->tenants_file)
        rc = workload_tenants_load(o->tenants_file, o->vocab, &t);
    else if (o->api_keys)
        rc = workload_tenants_from_keys(o->api_keys, &t);
    else
        rc = workload_tenants_single(o->api_key, &t);
    if (rc != 0)
        return rc;
    switch (o->kind) {
    case WORKLOAD_RANDOM: {
        struct workload_random_params p = {o->num_prompts, o->input_min, o->input_max,
                                           o->output_min, o->output_max};
        rc = workload_random(&p, o->vocab, seed, &t, &b->w);
        break;
    }
    case WORKLOAD_SHARED_PREFIX: {
        struct workload_shared_prefix_params p = {o->groups, o->prompts_per_group, o->system_len,
                                                  o->question_len, o->output_min};
        rc = workload_shared_prefix(&p, o->vocab, seed, &t, &b->w);
        break;
    }
    case WORKLOAD_MULTI_TENANT: {
        struct workload_multi_tenant_params p = {o->num_prompts, o->system_len, o->question_len,
                                                 o->output_min};
        rc = workload_multi_tenant(&p, o->vocab, seed, &t, &b->w);
        break;
    }
    case WORKLOAD_REALISTIC: {
        struct workload_realistic_params p = {.num_requests = o->num_prompts,
                                              .input_median = o->input_min,
                                              .input_cap = o->input_max,
                                              .output_median = o->output_min,
                                              .output_cap = o->output_max,
                                              .input_sigma = o->input_sigma,
                                              .output_sigma = o->output_sigma,
                                              .max_context = o->max_context};
        snprintf(b->workload_params, sizeof(b->workload_params),
                 "prompt log-normal, median %u, sigma %.2f, cap %u; output log-normal, median %u, "
                 "sigma %.2f, cap %u; both truncated to the context of %lld",
                 p.input_median, p.input_sigma, p.input_cap, p.output_median, p.output_sigma,
                 p.output_cap, (long long)p.max_context);
        rc = workload_realistic(&p, o->vocab, seed, &t, &b->w);
        size_t used = strlen(b->workload_params);
        if (rc == 0 && b->w.clamped > 0)
            snprintf(b->workload_params + used, sizeof(b->workload_params) - used,
                     "; %zu lengths clamped after %d draws", b->w.clamped, WORKLOAD_REDRAWS);
        break;
    }
    }
    if (rc == 0)
        rc = workload_check_context(&b->w, o->max_context);
    return rc;
}

static int open_clients(struct bench *b)
{
    const struct workload_tenants *t = &b->w.tenants;
    b->num_tenants = t->num_tenants;
    b->clients = calloc(t->num_tenants, sizeof(*b->clients));
    b->api_keys = calloc(t->num_tenants, sizeof(*b->api_keys));
    b->tenant_names = calloc(t->num_tenants, sizeof(*b->tenant_names));
    if (b->clients == NULL || b->api_keys == NULL || b->tenant_names == NULL)
        return PAGODA_ENOMEM;
    int openai = b->o->api == BENCH_API_OPENAI;
    uint32_t timeout = b->o->timeout_ms ? b->o->timeout_ms : PAGODA_DEFAULT_TIMEOUT_MS;
    int rc = 0;
    for (uint32_t i = 0; rc == 0 && i < t->num_tenants; i++) {
        /* Copies: a sweep rebuilds the workload, and its reports outlive each build. */
        if ((b->tenant_names[i] = strdup(t->tenants[i].name)) == NULL)
            return PAGODA_ENOMEM;
        if (openai) {
            if (t->tenants[i].api_key != NULL &&
                (b->api_keys[i] = strdup(t->tenants[i].api_key)) == NULL)
                return PAGODA_ENOMEM;
            continue;
        }
        rc = pagoda_client_open(b->o->url, &b->clients[i]);
        if (rc == 0)
            rc = pagoda_client_set_api_key(b->clients[i], t->tenants[i].api_key);
        if (rc == 0)
            pagoda_client_set_timeout_ms(b->clients[i], timeout);
    }
    /* Engine figures: with a tenants file the router wants a known key for stats too. */
    const char *key = b->o->stats_api_key ? b->o->stats_api_key
                      : t->admin_key      ? t->admin_key
                                          : t->tenants[0].api_key;
    if (openai && b->o->stats_url == NULL)
        return rc; /* no engine figures */
    if (rc == 0)
        rc = pagoda_client_open(openai ? b->o->stats_url : b->o->url, &b->stats_client);
    if (rc == 0)
        rc = pagoda_client_set_api_key(b->stats_client, key);
    if (rc == 0)
        pagoda_client_set_timeout_ms(b->stats_client, timeout);
    return rc;
}

static void close_clients(struct bench *b)
{
    for (uint32_t i = 0; b->clients && i < b->num_tenants; i++)
        pagoda_client_close(b->clients[i]);
    free(b->clients);
    for (uint32_t i = 0; b->api_keys && i < b->num_tenants; i++)
        free(b->api_keys[i]);
    free(b->api_keys);
    free(b->model_name);
    for (uint32_t i = 0; b->tenant_names && i < b->num_tenants; i++)
        free((char *)b->tenant_names[i]);
    free(b->tenant_names);
    pagoda_client_close(b->stats_client);
}

static int fail(int status, int rc, const char *what)
{
    char msg[700];
    fprintf(stderr, "pagoda-bench: %s%s%s\n", what ? what : "", what ? ": " : "",
            pagoda_error_message(rc, msg, sizeof(msg)));
    return status;
}

/* Sends the workload as asked and writes the outputs. Returns the exit status. */
static int bench_main(struct bench *b)
{
    struct options *o = b->o;
    int rc = open_clients(b);
    if (rc != 0)
        return fail(1, rc, "connecting");
    if (o->api == BENCH_API_OPENAI) {
        /* The server answers its models list; the first names the model unless given. */
        struct openai_client *http = openai_client_new(o->url, PAGODA_DEFAULT_TIMEOUT_MS);
        char *first = NULL;
        rc = http == NULL ? PAGODA_ENOMEM : openai_client_models(http, b->api_keys[0], &first);
        openai_client_free(http);
        if (rc != 0)
            return fail(1, rc, o->url);
        b->model_name = o->model_name ? strdup(o->model_name) : first;
        if (o->model_name)
            free(first);
        if (o->model_name && b->model_name == NULL)
            return fail(1, PAGODA_ENOMEM, NULL);
    } else {
        int healthy = 0;
        rc = pagoda_health(b->clients[0], &healthy);
        if (rc != 0 || !healthy)
            return fail(1, rc ? rc : PAGODA_EBUSY, o->url);
    }
    warm_up(b);

    int sweep = GIVEN(o, OPT_SWEEP);
    size_t runs = sweep ? o->num_sweep : 1;
    struct report *reps = calloc(runs, sizeof(*reps));
    if (reps == NULL)
        return fail(1, PAGODA_ENOMEM, NULL);
    size_t done = 0;
    for (; rc == 0 && done < runs; done++) {
        int open_loop = !GIVEN(o, OPT_CONCURRENCY);
        double rate = sweep ? o->sweep[done] : o->rate;
        /* Each rate of a sweep gets fresh prompts of the same distribution (seed + k), so that
         * the prefix cache does not serve one rate the prompts another rate sent. */
        if (sweep && done > 0) {
            workload_fini(&b->w);
            if ((rc = build_workload(b, o->seed + done)) != 0)
                break;
        }
        if (sweep && !o->quiet)
            fprintf(stderr, "pagoda-bench: rate %g req/s (%zu of %zu)\n", rate, done + 1, runs);
        rc = bench_once(b, open_loop, open_loop ? rate : NAN, sweep, &reps[done]);
        if (rc == 0 && !o->quiet)
            report_print(stdout, &reps[done]);
    }
    if (rc == 0 && sweep && !o->quiet)
        print_sweep_table(stdout, reps, runs);
    int show_timeline =
        !sweep && b->num_windows > 0 &&
        (o->duration_s > 0 || GIVEN(o, OPT_TIMELINE_INTERVAL) || o->timeline_plot_path != NULL);
    if (rc == 0 && show_timeline && !o->quiet) {
        printf("\nTimeline (windows of %.1f s; latencies in ms of the requests whose first token "
               "(TTFT) or end (TPOT) fell in the window; KV max, the rest means of the engine's "
               "samples):\n",
               b->timeline_interval_s);
        timeline_print(stdout, b->timeline, b->num_windows);
    }
    json_t *doc = NULL;
    if (rc == 0 && o->json_path) {
        if (!sweep) {
            rc = report_to_json(&reps[0], &doc);
            json_t *tl = NULL;
            if (rc == 0)
                rc = timeline_to_json(b->timeline, b->num_windows, &tl);
            if (rc == 0 && (json_object_set_new(doc, "timeline", tl) != 0 ||
                            json_object_set_new(doc, "timeline_interval_s",
                                                json_real(b->timeline_interval_s)) != 0))
                rc = PAGODA_ENOMEM;
        } else {
            json_t *arr = json_array();
            doc = json_object();
            if (doc == NULL)
                json_decref(arr);
            if (doc == NULL || json_object_set_new(doc, "sweep", arr) != 0) /* takes arr */
                rc = PAGODA_ENOMEM;
            for (size_t i = 0; rc == 0 && i < runs; i++) {
                json_t *one = NULL;
                rc = report_to_json(&reps[i], &one);
                if (rc == 0 && json_array_append_new(arr, one) != 0)
                    rc = PAGODA_ENOMEM;
            }
        }
        if (rc == 0)
            rc = write_json_file(o->json_path, doc);
        json_decref(doc);
    }
    if (rc == 0 && o->plot_path) {
        char title[512];
        if (o->title)
            snprintf(title, sizeof(title), "%s", o->title);
        else
            snprintf(title, sizeof(title), "pagoda-bench %s workload, %zu requests per rate",
                     workload_kind_name(b->w.kind), b->w.num_requests);
        rc = plot_sweep(reps, runs, title, o->plot_path);
    }
    if (rc == 0 && o->timeline_plot_path) {
        char title[512];
        if (o->title)
            snprintf(title, sizeof(title), "%s", o->title);
        else
            snprintf(title, sizeof(title), "pagoda-bench %s workload: timeline",
                     workload_kind_name(b->w.kind));
        rc = plot_timeline(b->timeline, b->num_windows, title, o->timeline_plot_path);
    }
    for (size_t i = 0; i < runs; i++)
        report_fini(&reps[i]);
    free(reps);
    return rc == 0 ? 0 : fail(1, rc, NULL);
}

int main(int argc, char **argv)
{
    struct options o;
    bench_options_init(&o);
    int rc, parsed = bench_options_parse(argc, argv, &o);
    if (parsed != 0)
        return parsed == 3 ? 0 : parsed;
    /* A gnuplot child that dies must not take pagoda-bench with it. */
    signal(SIGPIPE, SIG_IGN);
    if (o.api == BENCH_API_OPENAI && curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
        return fail(1, pagoda_error_set(PAGODA_EIO, "curl_global_init failed"), NULL);

    struct bench b = {.o = &o};
    struct model_config cfg;
    int have_cfg = 0, status = 0;
    if ((rc = load_model(&b, &cfg, &have_cfg)) != 0) {
        status = fail(2, rc, "the model");
        goto out;
    }
    if ((rc = build_workload(&b, o.seed)) != 0) {
        status = fail(2, rc, "the workload");
        goto out;
    }
    if (o.bandwidth_gbs > 0) {
        if (!have_cfg) {
            status = fail(2,
                          pagoda_error_set(PAGODA_EINVAL, "--bandwidth-gbs needs the model's "
                                                          "shape (--model DIR) for the K/V bytes"),
                          NULL);
            goto out;
        }
        b.weight_bytes = GIVEN(&o, OPT_WEIGHT_BYTES)
                             ? o.weight_bytes
                             : floor_weight_bytes(&cfg, o.weight_dtype_bytes);
        b.kv_elems_per_token = floor_kv_bytes_per_token(&cfg, 1);
        b.kv_bytes_per_token = b.kv_elems_per_token * o.kv_dtype_bytes;
        b.flops_per_token = floor_flops_per_token(&cfg);
        b.lm_head_flops = floor_lm_head_flops(&cfg);
        b.attention_flops_per_key = floor_attention_flops_per_key(&cfg);
    }
    if (o.dump_path) {
        json_t *doc = NULL;
        rc = workload_to_json(&b.w, &doc);
        if (rc == 0)
            rc = write_json_file(o.dump_path, doc);
        json_decref(doc);
        status = rc == 0 ? 0 : fail(1, rc, "--dump-workload");
        goto out;
    }
    if (o.requests_path && (b.requests_out = fopen(o.requests_path, "w")) == NULL) {
        status = fail(1, pagoda_error_set(PAGODA_EIO, "%s: cannot open", o.requests_path),
                      "--output-requests");
        goto out;
    }
    status = bench_main(&b);
    if (b.requests_out && fclose(b.requests_out) != 0 && status == 0)
        status = fail(1, pagoda_error_set(PAGODA_EIO, "%s: write failed", o.requests_path),
                      "--output-requests");
    b.requests_out = NULL;
    close_clients(&b);
    free(b.samples);
    free(b.timeline);
out:
    workload_fini(&b.w);
    if (o.api == BENCH_API_OPENAI)
        curl_global_cleanup();
    return status;
}
