/* pagoda-bench: the serving benchmark. Sends a workload (bench/workload.h) to a pagoda router
 * through libpagoda, open loop (Poisson arrivals at --rate, or a --sweep of rates) or closed loop
 * (--concurrency clients), and reports throughput, TTFT, TPOT, ITL, end-to-end latency, prefix
 * hits, KV usage, preemptions and fragmentation (bench/report.h), as text and as JSON.
 *
 * Each request runs on a client thread in one pagoda_generate_stream call; the stream callback
 * timestamps every poll's tokens (CLOCK_MONOTONIC). Open loop: each thread takes the next
 * request in arrival order and sleeps until its arrival time, so at most --max-concurrency
 * requests are in flight and a request that finds every thread busy starts late (the report
 * counts those). Closed loop: --concurrency threads each send their next request as soon as the
 * previous one ends. A sampler thread reads pagoda_stats() during the run.
 *
 * Exit status: 0 when the benchmark ran (failed requests are in the report), 1 when it could not
 * run (no router, an I/O error), 2 for bad flags or a workload that does not fit the model. */
#include "bench/floor.h"
#include "bench/plot.h"
#include "bench/report.h"
#include "bench/workload.h"
#include "client/pagoda.h"
#include "common/error.h"
#include "common/parse.h"
#include "worker/model_config.h"

#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifndef PAGODA_BENCH_DEFAULT_MODEL
#define PAGODA_BENCH_DEFAULT_MODEL "models/tiny"
#endif

/* Client threads of one run, at most. */
#define BENCH_MAX_THREADS 4096u
/* Rates of one sweep, at most. */
#define BENCH_MAX_SWEEP 64u
#define BENCH_DEFAULT_MAX_CONCURRENCY 256u
#define BENCH_DEFAULT_STATS_INTERVAL_MS 200u
#define BENCH_WARMUP_PROMPT_LEN 16u
#define BENCH_WARMUP_MAX_TOKENS 8u

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: pagoda-bench [--url URL] [--workload random|shared-prefix|multi-tenant]\n"
        "         [--rate R|inf | --concurrency C | --sweep R1,R2,...] [--max-concurrency N]\n"
        "         [--num-prompts N] [--seed S] [--ignore-eos] [--temperature T]\n"
        "         [--model DIR | --vocab N --max-context N]\n"
        "         random:        [--input-len N|LO:HI] [--output-len N|LO:HI]\n"
        "         shared-prefix: [--groups G] [--prompts-per-group P] [--system-prompt-len L]\n"
        "                        [--question-len Q] [--output-len N]\n"
        "         multi-tenant:  --tenants FILE | --api-keys K1,K2,...\n"
        "                        [--system-prompt-len L] [--question-len Q] [--output-len N]\n"
        "         [--api-key KEY] [--stats-api-key KEY] [--warmup N] [--timeout-ms MS]\n"
        "         [--stats-interval-ms MS] [--json FILE] [--output-requests FILE]\n"
        "         [--dump-workload FILE] [--plot FILE.png] [--title TEXT] [--quiet]\n"
        "         [--bandwidth-gbs X [--weight-bytes B] [--weight-dtype-bytes N]\n"
        "          [--kv-dtype-bytes N]] [--baseline-tps X]\n"
        "\n"
        "Workloads (defaults in brackets):\n"
        "  random         --num-prompts [1000] prompts of --input-len [1024] tokens (a range\n"
        "                 LO:HI draws uniformly), --output-len [128] tokens each.\n"
        "  shared-prefix  --groups [64] x --prompts-per-group [16] prompts: the group's system\n"
        "                 prompt (--system-prompt-len [2048]) then a question (--question-len\n"
        "                 [128]), --output-len [256]; sent in a seeded random order.\n"
        "  multi-tenant   --num-prompts [256] prompts round-robin over the tenants of --tenants\n"
        "                 FILE (the router's format, with \"groups\" and \"pins\") or --api-keys:\n"
        "                 the tenant's pinned prompt (when a pin names it), then its namespace's\n"
        "                 system prompt (its group's, else its own; --system-prompt-len [512]),\n"
        "                 then its own question (--question-len [128]); --output-len [128].\n"
        "Token ids are uniform below the vocabulary of --model DIR (config.json; default the\n"
        "bundled %s) or --vocab; prompt + output must fit the model's positions\n"
        "(max_position_embeddings, or --max-context), else pagoda-bench refuses (exit 2).\n"
        "Arrivals: --rate R: Poisson at R requests/s (inf: all at once, the default), at most\n"
        "--max-concurrency [%u] in flight; --concurrency C: closed loop of C clients;\n"
        "--sweep R1,R2,...: one open-loop run per rate, the k-th with fresh prompts from seed\n"
        "S + k (a prefix cache would serve repeated ones), and --plot FILE.png.\n"
        "Sampling: greedy unless --temperature; request i has seed S + i; --ignore-eos.\n"
        "Output: the text report on stdout (unless --quiet); --json FILE the report as JSON\n"
        "(a sweep: {\"sweep\": [...]}); --output-requests FILE one JSON line per request with\n"
        "its token ids, times and usage; --dump-workload FILE writes the workload as JSON\n"
        "and exits without sending anything (bench/hf_baseline.py reads it).\n"
        "Bandwidth floor (closed loop): --bandwidth-gbs X (GB/s) with weight bytes from the\n"
        "model's shape x --weight-dtype-bytes [2] (or --weight-bytes) and K/V bytes per token\n"
        "x --kv-dtype-bytes [2]. --baseline-tps X: also report output tokens/s as a ratio of X.\n"
        "Exit status: 0 ran (failed requests are in the report), 1 could not run, 2 bad flags.\n",
        PAGODA_BENCH_DEFAULT_MODEL, BENCH_DEFAULT_MAX_CONCURRENCY);
}

enum {
    OPT_URL = 1000,
    OPT_WORKLOAD,
    OPT_RATE,
    OPT_CONCURRENCY,
    OPT_SWEEP,
    OPT_MAX_CONCURRENCY,
    OPT_NUM_PROMPTS,
    OPT_SEED,
    OPT_IGNORE_EOS,
    OPT_TEMPERATURE,
    OPT_MODEL,
    OPT_VOCAB,
    OPT_MAX_CONTEXT,
    OPT_INPUT_LEN,
    OPT_OUTPUT_LEN,
    OPT_GROUPS,
    OPT_PROMPTS_PER_GROUP,
    OPT_SYSTEM_PROMPT_LEN,
    OPT_QUESTION_LEN,
    OPT_TENANTS,
    OPT_API_KEYS,
    OPT_API_KEY,
    OPT_STATS_API_KEY,
    OPT_WARMUP,
    OPT_TIMEOUT,
    OPT_STATS_INTERVAL,
    OPT_JSON,
    OPT_OUTPUT_REQUESTS,
    OPT_DUMP_WORKLOAD,
    OPT_PLOT,
    OPT_TITLE,
    OPT_QUIET,
    OPT_BANDWIDTH,
    OPT_WEIGHT_BYTES,
    OPT_WEIGHT_DTYPE_BYTES,
    OPT_KV_DTYPE_BYTES,
    OPT_BASELINE_TPS,
    OPT_COUNT_ /* flags are tracked in a 64-bit mask below */
};

static const struct option longopts[] = {
    {"url", required_argument, NULL, OPT_URL},
    {"workload", required_argument, NULL, OPT_WORKLOAD},
    {"rate", required_argument, NULL, OPT_RATE},
    {"concurrency", required_argument, NULL, OPT_CONCURRENCY},
    {"sweep", required_argument, NULL, OPT_SWEEP},
    {"max-concurrency", required_argument, NULL, OPT_MAX_CONCURRENCY},
    {"num-prompts", required_argument, NULL, OPT_NUM_PROMPTS},
    {"seed", required_argument, NULL, OPT_SEED},
    {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
    {"temperature", required_argument, NULL, OPT_TEMPERATURE},
    {"model", required_argument, NULL, OPT_MODEL},
    {"vocab", required_argument, NULL, OPT_VOCAB},
    {"max-context", required_argument, NULL, OPT_MAX_CONTEXT},
    {"input-len", required_argument, NULL, OPT_INPUT_LEN},
    {"output-len", required_argument, NULL, OPT_OUTPUT_LEN},
    {"groups", required_argument, NULL, OPT_GROUPS},
    {"prompts-per-group", required_argument, NULL, OPT_PROMPTS_PER_GROUP},
    {"system-prompt-len", required_argument, NULL, OPT_SYSTEM_PROMPT_LEN},
    {"question-len", required_argument, NULL, OPT_QUESTION_LEN},
    {"tenants", required_argument, NULL, OPT_TENANTS},
    {"api-keys", required_argument, NULL, OPT_API_KEYS},
    {"api-key", required_argument, NULL, OPT_API_KEY},
    {"stats-api-key", required_argument, NULL, OPT_STATS_API_KEY},
    {"warmup", required_argument, NULL, OPT_WARMUP},
    {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
    {"stats-interval-ms", required_argument, NULL, OPT_STATS_INTERVAL},
    {"json", required_argument, NULL, OPT_JSON},
    {"output-requests", required_argument, NULL, OPT_OUTPUT_REQUESTS},
    {"dump-workload", required_argument, NULL, OPT_DUMP_WORKLOAD},
    {"plot", required_argument, NULL, OPT_PLOT},
    {"title", required_argument, NULL, OPT_TITLE},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"bandwidth-gbs", required_argument, NULL, OPT_BANDWIDTH},
    {"weight-bytes", required_argument, NULL, OPT_WEIGHT_BYTES},
    {"weight-dtype-bytes", required_argument, NULL, OPT_WEIGHT_DTYPE_BYTES},
    {"kv-dtype-bytes", required_argument, NULL, OPT_KV_DTYPE_BYTES},
    {"baseline-tps", required_argument, NULL, OPT_BASELINE_TPS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

_Static_assert(OPT_COUNT_ - OPT_URL <= 64, "every flag needs a bit of options.given");
#define GIVEN(o, opt) (((o)->given >> ((opt)-OPT_URL)) & 1u)

struct options {
    uint64_t given; /* bit (opt - OPT_URL) for each flag given */
    const char *url, *model_dir, *tenants_file, *api_keys, *api_key, *stats_api_key;
    const char *json_path, *requests_path, *dump_path, *plot_path, *title;
    enum workload_kind kind;
    double rate;
    double sweep[BENCH_MAX_SWEEP];
    size_t num_sweep;
    uint32_t concurrency, max_concurrency;
    size_t num_prompts;
    uint64_t seed;
    int ignore_eos, quiet;
    double temperature;
    int32_t vocab;
    int64_t max_context;
    uint32_t input_min, input_max, output_min, output_max;
    uint32_t groups, prompts_per_group, system_len, question_len;
    uint32_t warmup, timeout_ms, stats_interval_ms;
    double bandwidth_gbs, weight_bytes, baseline_tps;
    int weight_dtype_bytes, kv_dtype_bytes;
};

/* "N" or "LO:HI", each in [1, max]. */
static int parse_range(const char *flag, const char *text, uint32_t max, uint32_t *lo, uint32_t *hi)
{
    char buf[64];
    int64_t a, b;
    const char *colon = strchr(text, ':');
    if (colon == NULL) {
        int rc = parse_i64(flag, text, 1, max, &a);
        if (rc == 0)
            *lo = *hi = (uint32_t)a;
        return rc;
    }
    size_t n = (size_t)(colon - text);
    if (n >= sizeof(buf))
        return pagoda_error_set(PAGODA_EINVAL, "%s: '%s' is not N or LO:HI", flag, text);
    memcpy(buf, text, n);
    buf[n] = '\0';
    int rc = parse_i64(flag, buf, 1, max, &a);
    if (rc == 0)
        rc = parse_i64(flag, colon + 1, 1, max, &b);
    if (rc == 0 && b < a)
        rc = pagoda_error_set(PAGODA_ERANGE, "%s: '%s': HI is below LO", flag, text);
    if (rc == 0) {
        *lo = (uint32_t)a;
        *hi = (uint32_t)b;
    }
    return rc;
}

/* A positive rate in requests/s, or "inf" when allow_inf. */
static int parse_rate(const char *flag, const char *text, int allow_inf, double *out)
{
    if (allow_inf && (strcmp(text, "inf") == 0 || strcmp(text, "INF") == 0)) {
        *out = INFINITY;
        return 0;
    }
    int rc = parse_f64(flag, text, 0, 1e9, out);
    if (rc == 0 && *out <= 0)
        rc = pagoda_error_set(PAGODA_ERANGE, "%s: %s must be above 0", flag, text);
    return rc;
}

static int parse_sweep(const char *text, struct options *o)
{
    char buf[1024];
    if (strlen(text) >= sizeof(buf))
        return pagoda_error_set(PAGODA_ERANGE, "--sweep: the list is too long");
    snprintf(buf, sizeof(buf), "%s", text);
    o->num_sweep = 0;
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (o->num_sweep == BENCH_MAX_SWEEP)
            return pagoda_error_set(PAGODA_ERANGE, "--sweep: more than %u rates", BENCH_MAX_SWEEP);
        int rc = parse_rate("--sweep", tok, 0, &o->sweep[o->num_sweep]);
        if (rc != 0)
            return rc;
        o->num_sweep++;
    }
    if (o->num_sweep == 0)
        return pagoda_error_set(PAGODA_EINVAL, "--sweep: no rate given");
    return 0;
}

static int parse_u32(const char *flag, const char *text, uint32_t min, uint32_t max, uint32_t *out)
{
    int64_t v;
    int rc = parse_i64(flag, text, min, max, &v);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

static int parse_flag(struct options *o, int opt, const char *arg)
{
    int64_t i;
    double d;
    int rc = 0;
    o->given |= 1ull << (opt - OPT_URL);
    switch (opt) {
    case OPT_URL:
        o->url = arg;
        return 0;
    case OPT_WORKLOAD:
        return workload_kind_parse(arg, &o->kind);
    case OPT_RATE:
        return parse_rate("--rate", arg, 1, &o->rate);
    case OPT_CONCURRENCY:
        return parse_u32("--concurrency", arg, 1, BENCH_MAX_THREADS, &o->concurrency);
    case OPT_SWEEP:
        return parse_sweep(arg, o);
    case OPT_MAX_CONCURRENCY:
        return parse_u32("--max-concurrency", arg, 1, BENCH_MAX_THREADS, &o->max_concurrency);
    case OPT_NUM_PROMPTS:
        if ((rc = parse_i64("--num-prompts", arg, 1, WORKLOAD_MAX_REQUESTS, &i)) == 0)
            o->num_prompts = (size_t)i;
        return rc;
    case OPT_SEED:
        if ((rc = parse_i64("--seed", arg, 0, INT64_MAX, &i)) == 0)
            o->seed = (uint64_t)i;
        return rc;
    case OPT_IGNORE_EOS:
        o->ignore_eos = 1;
        return 0;
    case OPT_TEMPERATURE:
        return parse_f64("--temperature", arg, 0, 1e6, &o->temperature);
    case OPT_MODEL:
        o->model_dir = arg;
        return 0;
    case OPT_VOCAB:
        if ((rc = parse_i64("--vocab", arg, 1, INT32_MAX, &i)) == 0)
            o->vocab = (int32_t)i;
        return rc;
    case OPT_MAX_CONTEXT:
        return parse_i64("--max-context", arg, 2, INT32_MAX, &o->max_context);
    case OPT_INPUT_LEN:
        return parse_range("--input-len", arg, WORKLOAD_MAX_PROMPT_TOKENS, &o->input_min,
                           &o->input_max);
    case OPT_OUTPUT_LEN:
        return parse_range("--output-len", arg, WORKLOAD_MAX_OUTPUT_TOKENS, &o->output_min,
                           &o->output_max);
    case OPT_GROUPS:
        return parse_u32("--groups", arg, 1, WORKLOAD_MAX_REQUESTS, &o->groups);
    case OPT_PROMPTS_PER_GROUP:
        return parse_u32("--prompts-per-group", arg, 1, WORKLOAD_MAX_REQUESTS,
                         &o->prompts_per_group);
    case OPT_SYSTEM_PROMPT_LEN:
        return parse_u32("--system-prompt-len", arg, 0, WORKLOAD_MAX_PROMPT_TOKENS, &o->system_len);
    case OPT_QUESTION_LEN:
        return parse_u32("--question-len", arg, 1, WORKLOAD_MAX_PROMPT_TOKENS, &o->question_len);
    case OPT_TENANTS:
        o->tenants_file = arg;
        return 0;
    case OPT_API_KEYS:
        o->api_keys = arg;
        return 0;
    case OPT_API_KEY:
        o->api_key = arg;
        return 0;
    case OPT_STATS_API_KEY:
        o->stats_api_key = arg;
        return 0;
    case OPT_WARMUP:
        return parse_u32("--warmup", arg, 0, 1u << 16, &o->warmup);
    case OPT_TIMEOUT:
        return parse_u32("--timeout-ms", arg, 1, UINT32_MAX, &o->timeout_ms);
    case OPT_STATS_INTERVAL:
        return parse_u32("--stats-interval-ms", arg, 10, 60000, &o->stats_interval_ms);
    case OPT_JSON:
        o->json_path = arg;
        return 0;
    case OPT_OUTPUT_REQUESTS:
        o->requests_path = arg;
        return 0;
    case OPT_DUMP_WORKLOAD:
        o->dump_path = arg;
        return 0;
    case OPT_PLOT:
        o->plot_path = arg;
        return 0;
    case OPT_TITLE:
        o->title = arg;
        return 0;
    case OPT_QUIET:
        o->quiet = 1;
        return 0;
    case OPT_BANDWIDTH:
        if ((rc = parse_f64("--bandwidth-gbs", arg, 0, 1e7, &d)) == 0 && d <= 0)
            rc = pagoda_error_set(PAGODA_ERANGE, "--bandwidth-gbs: %s must be above 0", arg);
        o->bandwidth_gbs = d;
        return rc;
    case OPT_WEIGHT_BYTES:
        return parse_f64("--weight-bytes", arg, 0, 1e15, &o->weight_bytes);
    case OPT_WEIGHT_DTYPE_BYTES:
        if ((rc = parse_i64("--weight-dtype-bytes", arg, 1, 8, &i)) == 0)
            o->weight_dtype_bytes = (int)i;
        return rc;
    case OPT_KV_DTYPE_BYTES:
        if ((rc = parse_i64("--kv-dtype-bytes", arg, 1, 8, &i)) == 0)
            o->kv_dtype_bytes = (int)i;
        return rc;
    case OPT_BASELINE_TPS:
        if ((rc = parse_f64("--baseline-tps", arg, 0, 1e12, &d)) == 0 && d <= 0)
            rc = pagoda_error_set(PAGODA_ERANGE, "--baseline-tps: %s must be above 0", arg);
        o->baseline_tps = d;
        return rc;
    default:
        return pagoda_error_set(PAGODA_EINVAL, "unknown option (see --help)");
    }
}

/* Flags that belong to other workloads, or combinations that make no sense. */
static int check_flags(struct options *o)
{
    static const struct {
        int opt;
        const char *name;
        unsigned workloads; /* bit per enum workload_kind */
    } only[] = {
        {OPT_INPUT_LEN, "--input-len", 1u << WORKLOAD_RANDOM},
        {OPT_GROUPS, "--groups", 1u << WORKLOAD_SHARED_PREFIX},
        {OPT_PROMPTS_PER_GROUP, "--prompts-per-group", 1u << WORKLOAD_SHARED_PREFIX},
        {OPT_NUM_PROMPTS, "--num-prompts", 1u << WORKLOAD_RANDOM | 1u << WORKLOAD_MULTI_TENANT},
        {OPT_SYSTEM_PROMPT_LEN, "--system-prompt-len",
         1u << WORKLOAD_SHARED_PREFIX | 1u << WORKLOAD_MULTI_TENANT},
        {OPT_QUESTION_LEN, "--question-len",
         1u << WORKLOAD_SHARED_PREFIX | 1u << WORKLOAD_MULTI_TENANT},
    };
    for (size_t k = 0; k < sizeof(only) / sizeof(only[0]); k++)
        if (GIVEN(o, only[k].opt) && !(only[k].workloads & (1u << o->kind)))
            return pagoda_error_set(PAGODA_EINVAL, "%s does not apply to --workload %s",
                                    only[k].name, workload_kind_name(o->kind));
    if (o->kind != WORKLOAD_RANDOM && o->output_min != o->output_max)
        return pagoda_error_set(PAGODA_EINVAL, "--output-len: a range applies to --workload "
                                               "random only");
    int modes = GIVEN(o, OPT_RATE) + GIVEN(o, OPT_CONCURRENCY) + GIVEN(o, OPT_SWEEP);
    if (modes > 1)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--rate, --concurrency and --sweep exclude each other");
    if (GIVEN(o, OPT_MAX_CONCURRENCY) && GIVEN(o, OPT_CONCURRENCY))
        return pagoda_error_set(PAGODA_EINVAL, "--max-concurrency is for open-loop runs; "
                                               "--concurrency sets the closed loop's clients");
    if (o->plot_path && !GIVEN(o, OPT_SWEEP))
        return pagoda_error_set(PAGODA_EINVAL, "--plot draws a --sweep");
    if (!!o->tenants_file + !!o->api_keys + !!o->api_key > 1)
        return pagoda_error_set(PAGODA_EINVAL, "--tenants, --api-keys and --api-key exclude "
                                               "each other");
    if (o->kind == WORKLOAD_MULTI_TENANT && !o->tenants_file && !o->api_keys)
        return pagoda_error_set(PAGODA_EINVAL,
                                "--workload multi-tenant needs --tenants FILE or --api-keys");
    if (o->bandwidth_gbs > 0 && !GIVEN(o, OPT_CONCURRENCY))
        return pagoda_error_set(PAGODA_EINVAL,
                                "--bandwidth-gbs needs a closed loop "
                                "(--concurrency C with every client decoding together)");
    if (GIVEN(o, OPT_VOCAB) != GIVEN(o, OPT_MAX_CONTEXT))
        return pagoda_error_set(PAGODA_EINVAL, "--vocab and --max-context go together (the "
                                               "model's vocab_size and max_position_embeddings)");
    if (GIVEN(o, OPT_VOCAB) && o->model_dir)
        return pagoda_error_set(PAGODA_EINVAL, "--vocab and --model exclude each other");
    return 0;
}

static void set_defaults(struct options *o)
{
    if (!GIVEN(o, OPT_NUM_PROMPTS))
        o->num_prompts = o->kind == WORKLOAD_MULTI_TENANT ? 256 : 1000;
    if (!GIVEN(o, OPT_OUTPUT_LEN))
        o->output_min = o->output_max = o->kind == WORKLOAD_SHARED_PREFIX ? 256 : 128;
    if (!GIVEN(o, OPT_SYSTEM_PROMPT_LEN))
        o->system_len = o->kind == WORKLOAD_SHARED_PREFIX ? 2048 : 512;
    if (!GIVEN(o, OPT_RATE) && !GIVEN(o, OPT_CONCURRENCY) && !GIVEN(o, OPT_SWEEP))
        o->rate = INFINITY;
}

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
    pagoda_client **clients; /* one per tenant */
    struct report_request *recs;
    pagoda_generate_params params;
    uint64_t seed;
    int open_loop;
    double t0;
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

static void run_one(struct run *run, size_t i)
{
    const struct workload_request *q = &run->w->requests[i];
    struct report_request *rec = &run->recs[i];
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
    if (rc == 0)
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
    for (;;) {
        size_t i = atomic_fetch_add(&run->next, 1);
        if (i >= run->w->num_requests)
            return NULL;
        if (run->open_loop)
            sleep_until(run->t0 + run->w->requests[i].arrival_s);
        run_one(run, i);
    }
}

/* The sampler: pagoda_stats every interval until told to stop. */
struct sampler {
    pagoda_client *client;
    uint32_t interval_ms;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    int stop;
    struct report_engine *eng;
};

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
    pagoda_client **clients;
    pagoda_client *stats_client;
    const char **tenant_names; /* copies, num_tenants of them */
    uint32_t num_tenants;
    FILE *requests_out;
    double weight_bytes, kv_bytes_per_token;
};

/* One run of the whole workload. recs (num_requests of them) are filled; *eng with stats. */
static int run_workload(struct bench *b, int open_loop, uint32_t threads,
                        struct report_request *recs, struct report_engine *eng)
{
    struct run run = {
        .w = &b->w, .clients = b->clients, .recs = recs, .open_loop = open_loop, .seed = b->w.seed};
    run.params = pagoda_generate_params_default();
    run.params.temperature = (float)b->o->temperature;
    run.params.ignore_eos = b->o->ignore_eos;
    atomic_init(&run.next, 0);
    memset(eng, 0, sizeof(*eng));
    eng->have_before = pagoda_stats(b->stats_client, &eng->before) == 0;
    if (!eng->have_before)
        fprintf(stderr, "pagoda-bench: stats before the run: %s\n", pagoda_error_detail());

    struct sampler s = {
        .client = b->stats_client, .interval_ms = b->o->stats_interval_ms, .eng = eng};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_mutex_init(&s.lock, NULL);
    pthread_cond_init(&s.cond, &ca);
    pthread_condattr_destroy(&ca);
    pthread_t sampler;
    int have_sampler = pthread_create(&sampler, NULL, sampler_thread, &s) == 0;

    pthread_t *tids = calloc(threads, sizeof(*tids));
    if (tids == NULL)
        threads = 0;
    run.t0 = now_s();
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
    eng->have_after = pagoda_stats(b->stats_client, &eng->after) == 0;
    if (!eng->have_after)
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
    struct report_config cfg = {
        .workload = workload_kind_name(b->w.kind),
        .seed = b->w.seed,
        .open_loop = open_loop,
        .rate = rate,
        .concurrency = cap,
        .tenant_names = b->tenant_names,
        .num_tenants = b->w.tenants.num_tenants,
        .bandwidth_gbs = o->bandwidth_gbs,
        .weight_bytes = b->weight_bytes,
        .kv_bytes_per_token = b->kv_bytes_per_token,
        .baseline_output_tps = o->baseline_tps,
    };
    if (rc == 0)
        rc = report_compute(&cfg, recs, n, &eng, rep);
    if (rc == 0)
        rc = write_requests(b, recs, n, rate, sweep);
    for (size_t i = 0; i < n; i++)
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
        int rc = pagoda_generate(b->clients[0], &p, prompt, BENCH_WARMUP_PROMPT_LEN, &res);
        if (rc != 0)
            fprintf(stderr, "pagoda-bench: warm-up request %u: %s\n", i, pagoda_error_detail());
        pagoda_result_free(&res);
    }
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
                                    "bundled model %s has no config.json (deploy/pagoda-up "
                                    "makes it)",
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
    b->tenant_names = calloc(t->num_tenants, sizeof(*b->tenant_names));
    if (b->clients == NULL || b->tenant_names == NULL)
        return PAGODA_ENOMEM;
    uint32_t timeout = b->o->timeout_ms ? b->o->timeout_ms : PAGODA_DEFAULT_TIMEOUT_MS;
    int rc = 0;
    for (uint32_t i = 0; rc == 0 && i < t->num_tenants; i++) {
        /* Copies: a sweep rebuilds the workload, and its reports outlive each build. */
        if ((b->tenant_names[i] = strdup(t->tenants[i].name)) == NULL)
            return PAGODA_ENOMEM;
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
    if (rc == 0)
        rc = pagoda_client_open(b->o->url, &b->stats_client);
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
    int healthy = 0;
    rc = pagoda_health(b->clients[0], &healthy);
    if (rc != 0 || !healthy)
        return fail(1, rc ? rc : PAGODA_EBUSY, o->url);
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
    json_t *doc = NULL;
    if (rc == 0 && o->json_path) {
        if (!sweep) {
            rc = report_to_json(&reps[0], &doc);
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
    for (size_t i = 0; i < runs; i++)
        report_fini(&reps[i]);
    free(reps);
    return rc == 0 ? 0 : fail(1, rc, NULL);
}

int main(int argc, char **argv)
{
    struct options o = {
        .url = PAGODA_DEFAULT_URL,
        .kind = WORKLOAD_RANDOM,
        .max_concurrency = BENCH_DEFAULT_MAX_CONCURRENCY,
        .input_min = 1024,
        .input_max = 1024,
        .groups = 64,
        .prompts_per_group = 16,
        .question_len = 128,
        .stats_interval_ms = BENCH_DEFAULT_STATS_INTERVAL_MS,
        .weight_dtype_bytes = 2,
        .kv_dtype_bytes = 2,
    };
    int opt, rc;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            return 0;
        }
        if (opt == '?') {
            usage(stderr);
            return 2;
        }
        if ((rc = parse_flag(&o, opt, optarg)) != 0)
            return fail(2, rc, NULL);
    }
    if (optind < argc) {
        fprintf(stderr, "pagoda-bench: unexpected argument '%s'\n", argv[optind]);
        usage(stderr);
        return 2;
    }
    if ((rc = check_flags(&o)) != 0)
        return fail(2, rc, NULL);
    set_defaults(&o);
    /* A gnuplot child that dies must not take pagoda-bench with it. */
    signal(SIGPIPE, SIG_IGN);

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
        b.kv_bytes_per_token = floor_kv_bytes_per_token(&cfg, o.kv_dtype_bytes);
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
out:
    workload_fini(&b.w);
    return status;
}
