#include "bench/bench_options.h"

#include "client/pagoda.h"
#include "common/error.h"
#include "common/parse.h"

#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void bench_usage(FILE *f)
{
    fprintf(
        f,
        "usage: pagoda-bench [--url URL] [--api pagoda|openai [--model-name NAME]\n"
        "         [--stats-url URL]]\n"
        "         [--workload random|shared-prefix|multi-tenant|realistic]\n"
        "         [--rate R|inf | --concurrency C | --sweep R1,R2,...] [--max-concurrency N]\n"
        "         [--num-prompts N] [--seed S] [--ignore-eos] [--temperature T]\n"
        "         [--model DIR | --vocab N --max-context N]\n"
        "         random:        [--input-len N|LO:HI] [--output-len N|LO:HI]\n"
        "         shared-prefix: [--groups G] [--prompts-per-group P] [--system-prompt-len L]\n"
        "                        [--question-len Q] [--output-len N]\n"
        "         multi-tenant:  --tenants FILE | --api-keys K1,K2,...\n"
        "                        [--system-prompt-len L] [--question-len Q] [--output-len N]\n"
        "         realistic:     [--input-len MEDIAN[:CAP]] [--output-len MEDIAN[:CAP]]\n"
        "                        [--length-sigma IN[:OUT]]\n"
        "         [--duration S] [--timeline-interval S] [--timeline-plot FILE.png]\n"
        "         [--api-key KEY] [--stats-api-key KEY] [--warmup N] [--timeout-ms MS]\n"
        "         [--stats-interval-ms MS] [--json FILE] [--output-requests FILE]\n"
        "         [--dump-workload FILE] [--plot FILE.png] [--title TEXT] [--quiet]\n"
        "         [--bandwidth-gbs X [--weight-bytes B] [--weight-dtype-bytes N]\n"
        "          [--kv-dtype-bytes N] [--matrix-tflops T]] [--baseline-tps X]\n"
        "\n"
        "Workloads (defaults in brackets):\n"
        "  random         --num-prompts [1000] prompts of --input-len [512] tokens (a range\n"
        "                 LO:HI draws uniformly), --output-len [128] tokens each.\n"
        "  shared-prefix  --groups [64] x --prompts-per-group [16] prompts: the group's system\n"
        "                 prompt (--system-prompt-len [2048]) then a question (--question-len\n"
        "                 [128]), --output-len [256]; sent in a seeded random order.\n"
        "  multi-tenant   --num-prompts [256] prompts round-robin over the tenants of --tenants\n"
        "                 FILE (the router's format, with \"groups\" and \"pins\") or --api-keys:\n"
        "                 the tenant's pinned prompt (when a pin names it), then its namespace's\n"
        "                 system prompt (its group's, else its own; --system-prompt-len [512]),\n"
        "                 then its own question (--question-len [128]); --output-len [128].\n"
        "  realistic      --num-prompts [1000] prompts with long-tailed lengths: prompt and\n"
        "                 output lengths log-normal, medians --input-len [256] and --output-len\n"
        "                 [128], sigmas (of the log) --length-sigma [1.0:0.8], capped at CAP\n"
        "                 [16 x the median] and at the model's context.\n"
        "Token ids are uniform below the vocabulary of --model DIR (config.json; default the\n"
        "bundled %s) or --vocab; prompt + output must fit the model's positions\n"
        "(max_position_embeddings, or --max-context), else pagoda-bench refuses (exit 2).\n"
        "Arrivals: --rate R: Poisson at R requests/s (inf: all at once, the default), at most\n"
        "--max-concurrency [%u] in flight; --concurrency C: closed loop of C clients;\n"
        "--sweep R1,R2,...: one open-loop run per rate, the k-th with fresh prompts from seed\n"
        "S + k (a prefix cache would serve repeated ones), and --plot FILE.png.\n"
        "API: --api pagoda (the default) speaks to the router at --url through libpagoda;\n"
        "--api openai streams OpenAI completions (POST /v1/completions, stream, logprobs 0,\n"
        "the prompt as token ids) from --url http://HOST:PORT (pagoda-gateway or any\n"
        "OpenAI-compatible server); TTFT and token times come from the SSE chunks.\n"
        "--model-name: the requests' \"model\" (default: the first of GET /v1/models);\n"
        "--stats-url: a pagoda router to read the engine's figures from (else none).\n"
        "Long runs: --duration S sends requests for S seconds only (open loop: the workload\n"
        "gets rate x S x 1.25 + 64 prompts unless --num-prompts; closed loop: 256 per client,\n"
        "from %u to %u; a workload used up before S ends the run early and says so), and the\n"
        "report adds a timeline: every --timeline-interval [5] seconds, TTFT/TPOT p50/p95/p99,\n"
        "throughput, KV usage, fragmentation, page locality, prefix hit rate, evictions and\n"
        "preemptions (in the text, in --json as \"timeline\", and drawn by --timeline-plot).\n"
        "Sampling: greedy unless --temperature; request i has seed S + i; --ignore-eos.\n"
        "Output: the text report on stdout (unless --quiet); --json FILE the report as JSON\n"
        "(a sweep: {\"sweep\": [...]}); --output-requests FILE one JSON line per request with\n"
        "its token ids, times and usage; --dump-workload FILE writes the workload as JSON\n"
        "and exits without sending anything (bench/hf_baseline.py reads it).\n"
        "Bandwidth floor (closed loop): --bandwidth-gbs X (GB/s) with weight bytes from the\n"
        "model's shape x --weight-dtype-bytes [2] (or --weight-bytes) and K/V bytes per token\n"
        "x --kv-dtype-bytes (by default the size of the element the engines' stats name,\n"
        "kv_cache_dtype, else 2). With --matrix-tflops T (the measured matrix rate, TFLOP/s)\n"
        "too, a closed loop or a --rate inf run also reports its compute-and-bandwidth bound:\n"
        "the prefill FLOPs at T plus the decode bytes at X. --baseline-tps X: also report\n"
        "output tokens/s as a ratio of X.\n"
        "Exit status: 0 ran (failed requests are in the report), 1 could not run, 2 bad flags.\n",
        PAGODA_BENCH_DEFAULT_MODEL, BENCH_DEFAULT_MAX_CONCURRENCY,
        BENCH_DURATION_CLOSED_MIN_PROMPTS, BENCH_DURATION_CLOSED_PROMPTS);
}

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
    {"duration", required_argument, NULL, OPT_DURATION},
    {"timeline-interval", required_argument, NULL, OPT_TIMELINE_INTERVAL},
    {"timeline-plot", required_argument, NULL, OPT_TIMELINE_PLOT},
    {"length-sigma", required_argument, NULL, OPT_LENGTH_SIGMA},
    {"title", required_argument, NULL, OPT_TITLE},
    {"quiet", no_argument, NULL, OPT_QUIET},
    {"bandwidth-gbs", required_argument, NULL, OPT_BANDWIDTH},
    {"matrix-tflops", required_argument, NULL, OPT_MATRIX_TFLOPS},
    {"weight-bytes", required_argument, NULL, OPT_WEIGHT_BYTES},
    {"weight-dtype-bytes", required_argument, NULL, OPT_WEIGHT_DTYPE_BYTES},
    {"kv-dtype-bytes", required_argument, NULL, OPT_KV_DTYPE_BYTES},
    {"baseline-tps", required_argument, NULL, OPT_BASELINE_TPS},
    {"api", required_argument, NULL, OPT_API},
    {"model-name", required_argument, NULL, OPT_MODEL_NAME},
    {"stats-url", required_argument, NULL, OPT_STATS_URL},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
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
    double d = 0;
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
    case OPT_TEMPERATURE: {
        float f; /* what the requests carry */
        if ((rc = parse_f32("--temperature", arg, 0, 1e6, &f)) == 0)
            o->temperature = f;
        return rc;
    }
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
        o->input_cap_given = strchr(arg, ':') != NULL;
        return parse_range("--input-len", arg, WORKLOAD_MAX_PROMPT_TOKENS, &o->input_min,
                           &o->input_max);
    case OPT_OUTPUT_LEN:
        o->output_cap_given = strchr(arg, ':') != NULL;
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
    case OPT_MATRIX_TFLOPS:
        if ((rc = parse_f64("--matrix-tflops", arg, 0, 1e6, &d)) == 0 && d <= 0)
            rc = pagoda_error_set(PAGODA_ERANGE, "--matrix-tflops: %s must be above 0", arg);
        o->matrix_tflops = d;
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
    case OPT_API:
        if (strcmp(arg, "pagoda") == 0)
            o->api = BENCH_API_PAGODA;
        else if (strcmp(arg, "openai") == 0)
            o->api = BENCH_API_OPENAI;
        else
            return pagoda_error_set(PAGODA_EINVAL, "--api %s: expected pagoda or openai", arg);
        return 0;
    case OPT_MODEL_NAME:
        o->model_name = arg;
        return 0;
    case OPT_STATS_URL:
        o->stats_url = arg;
        return 0;
    case OPT_DURATION:
        if ((rc = parse_f64("--duration", arg, 0, BENCH_MAX_DURATION_S, &d)) == 0 && d <= 0)
            rc = pagoda_error_set(PAGODA_ERANGE, "--duration: %s must be above 0", arg);
        o->duration_s = d;
        return rc;
    case OPT_TIMELINE_INTERVAL:
        if ((rc = parse_f64("--timeline-interval", arg, 0, BENCH_MAX_DURATION_S, &d)) == 0 &&
            d < 0.1)
            rc = pagoda_error_set(PAGODA_ERANGE, "--timeline-interval: %s is below 0.1 s", arg);
        o->timeline_interval_s = d;
        return rc;
    case OPT_TIMELINE_PLOT:
        o->timeline_plot_path = arg;
        return 0;
    case OPT_LENGTH_SIGMA: {
        char buf[64];
        if (strlen(arg) >= sizeof(buf))
            return pagoda_error_set(PAGODA_ERANGE, "--length-sigma: \"%.20s...\" is too long", arg);
        snprintf(buf, sizeof(buf), "%s", arg);
        char *colon = strchr(buf, ':');
        if (colon)
            *colon = '\0';
        rc = parse_f64("--length-sigma", buf, 0, 10, &o->input_sigma);
        o->output_sigma = o->input_sigma;
        if (rc == 0 && colon)
            rc = parse_f64("--length-sigma", colon + 1, 0, 10, &o->output_sigma);
        return rc;
    }
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
        {OPT_INPUT_LEN, "--input-len", 1u << WORKLOAD_RANDOM | 1u << WORKLOAD_REALISTIC},
        {OPT_LENGTH_SIGMA, "--length-sigma", 1u << WORKLOAD_REALISTIC},
        {OPT_GROUPS, "--groups", 1u << WORKLOAD_SHARED_PREFIX},
        {OPT_PROMPTS_PER_GROUP, "--prompts-per-group", 1u << WORKLOAD_SHARED_PREFIX},
        {OPT_NUM_PROMPTS, "--num-prompts",
         1u << WORKLOAD_RANDOM | 1u << WORKLOAD_MULTI_TENANT | 1u << WORKLOAD_REALISTIC},
        {OPT_SYSTEM_PROMPT_LEN, "--system-prompt-len",
         1u << WORKLOAD_SHARED_PREFIX | 1u << WORKLOAD_MULTI_TENANT},
        {OPT_QUESTION_LEN, "--question-len",
         1u << WORKLOAD_SHARED_PREFIX | 1u << WORKLOAD_MULTI_TENANT},
    };
    for (size_t k = 0; k < sizeof(only) / sizeof(only[0]); k++)
        if (GIVEN(o, only[k].opt) && !(only[k].workloads & (1u << o->kind)))
            return pagoda_error_set(PAGODA_EINVAL, "%s does not apply to --workload %s",
                                    only[k].name, workload_kind_name(o->kind));
    if (o->kind != WORKLOAD_RANDOM && o->kind != WORKLOAD_REALISTIC &&
        o->output_min != o->output_max)
        return pagoda_error_set(PAGODA_EINVAL, "--output-len: a range applies to --workload "
                                               "random (LO:HI) and realistic (MEDIAN:CAP) only");
    if (GIVEN(o, OPT_DURATION) && GIVEN(o, OPT_SWEEP))
        return pagoda_error_set(PAGODA_EINVAL, "--duration is for one run, not a --sweep");
    if (GIVEN(o, OPT_DURATION) && !GIVEN(o, OPT_CONCURRENCY) && !GIVEN(o, OPT_RATE))
        return pagoda_error_set(PAGODA_EINVAL, "--duration needs --rate R or --concurrency C");
    if (GIVEN(o, OPT_DURATION) && GIVEN(o, OPT_RATE) && isinf(o->rate))
        return pagoda_error_set(PAGODA_EINVAL, "--duration needs a finite --rate");
    /* gnuplot's script quotes them: checked now, not after a long run. */
    const char *quoted[] = {o->plot_path, o->timeline_plot_path, o->title};
    for (size_t k = 0; k < sizeof(quoted) / sizeof(quoted[0]); k++)
        if (quoted[k] && strpbrk(quoted[k], "'\n") != NULL)
            return pagoda_error_set(PAGODA_EINVAL, "--plot, --timeline-plot and --title take no "
                                                   "quote or newline (gnuplot quotes them)");
    if ((GIVEN(o, OPT_TIMELINE_PLOT) || GIVEN(o, OPT_TIMELINE_INTERVAL)) && GIVEN(o, OPT_SWEEP))
        return pagoda_error_set(PAGODA_EINVAL, "the timeline is for one run, not a --sweep");
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
    if (o->matrix_tflops > 0 && !(o->bandwidth_gbs > 0))
        return pagoda_error_set(PAGODA_EINVAL, "--matrix-tflops goes with --bandwidth-gbs (the "
                                               "bound is prefill FLOPs plus decode bytes)");
    if (o->matrix_tflops > 0 && GIVEN(o, OPT_RATE) && !isinf(o->rate))
        return pagoda_error_set(PAGODA_EINVAL,
                                "--matrix-tflops: the bound is for runs whose requests are all "
                                "there from the start (--concurrency C, or --rate inf): at a "
                                "finite rate the duration is the arrivals'");
    if (o->bandwidth_gbs > 0 && !GIVEN(o, OPT_CONCURRENCY) && !(o->matrix_tflops > 0))
        return pagoda_error_set(PAGODA_EINVAL,
                                "--bandwidth-gbs needs a closed loop "
                                "(--concurrency C with every client decoding together), "
                                "or --matrix-tflops for the workload's bound");
    if (GIVEN(o, OPT_VOCAB) != GIVEN(o, OPT_MAX_CONTEXT))
        return pagoda_error_set(PAGODA_EINVAL, "--vocab and --max-context go together (the "
                                               "model's vocab_size and max_position_embeddings)");
    if (o->api != BENCH_API_OPENAI && (o->model_name || o->stats_url))
        return pagoda_error_set(PAGODA_EINVAL, "--model-name and --stats-url go with --api openai");
    if (o->api == BENCH_API_OPENAI && !GIVEN(o, OPT_URL))
        return pagoda_error_set(PAGODA_EINVAL, "--api openai needs --url http://HOST:PORT");
    if (o->api == BENCH_API_OPENAI && strncmp(o->url, "http://", 7) != 0 &&
        strncmp(o->url, "https://", 8) != 0)
        return pagoda_error_set(PAGODA_EINVAL, "--api openai: --url %s is not http(s)://", o->url);
    if (GIVEN(o, OPT_VOCAB) && o->model_dir)
        return pagoda_error_set(PAGODA_EINVAL, "--vocab and --model exclude each other");
    return 0;
}

static void set_defaults(struct options *o)
{
    if (o->kind == WORKLOAD_REALISTIC) {
        if (!GIVEN(o, OPT_INPUT_LEN))
            o->input_min = BENCH_REALISTIC_INPUT_MEDIAN;
        if (!GIVEN(o, OPT_OUTPUT_LEN))
            o->output_min = BENCH_REALISTIC_OUTPUT_MEDIAN;
        if (!o->input_cap_given)
            o->input_max = (uint32_t)fmin((double)o->input_min * BENCH_REALISTIC_CAP_FACTOR,
                                          WORKLOAD_MAX_PROMPT_TOKENS);
        if (!o->output_cap_given)
            o->output_max = (uint32_t)fmin((double)o->output_min * BENCH_REALISTIC_CAP_FACTOR,
                                           WORKLOAD_MAX_OUTPUT_TOKENS);
        if (!GIVEN(o, OPT_LENGTH_SIGMA)) {
            o->input_sigma = BENCH_REALISTIC_INPUT_SIGMA;
            o->output_sigma = BENCH_REALISTIC_OUTPUT_SIGMA;
        }
    }
    if (!GIVEN(o, OPT_NUM_PROMPTS))
        o->num_prompts = o->kind == WORKLOAD_MULTI_TENANT ? 256 : 1000;
    if (!GIVEN(o, OPT_OUTPUT_LEN) && o->kind != WORKLOAD_REALISTIC)
        o->output_min = o->output_max = o->kind == WORKLOAD_SHARED_PREFIX ? 256 : 128;
    if (!GIVEN(o, OPT_SYSTEM_PROMPT_LEN))
        o->system_len = o->kind == WORKLOAD_SHARED_PREFIX ? 2048 : 512;
    if (!GIVEN(o, OPT_RATE) && !GIVEN(o, OPT_CONCURRENCY) && !GIVEN(o, OPT_SWEEP))
        o->rate = INFINITY;
    if (GIVEN(o, OPT_DURATION) && !GIVEN(o, OPT_NUM_PROMPTS)) {
        double n = GIVEN(o, OPT_CONCURRENCY)
                       ? fmin(fmax(BENCH_DURATION_CLOSED_MIN_PROMPTS,
                                   (double)o->concurrency * BENCH_DURATION_PROMPTS_PER_CLIENT),
                              BENCH_DURATION_CLOSED_PROMPTS)
                       : ceil(o->rate * o->duration_s * 1.25) + 64;
        o->num_prompts = (size_t)fmin(n, WORKLOAD_MAX_REQUESTS);
    }
}

void bench_options_init(struct options *o)
{
    *o = (struct options){
        .url = PAGODA_DEFAULT_URL,
        .kind = WORKLOAD_RANDOM,
        .max_concurrency = BENCH_DEFAULT_MAX_CONCURRENCY,
        .input_min = 512,
        .input_max = 512,
        .groups = 64,
        .prompts_per_group = 16,
        .question_len = 128,
        .stats_interval_ms = BENCH_DEFAULT_STATS_INTERVAL_MS,
        .timeline_interval_s = BENCH_DEFAULT_TIMELINE_INTERVAL_S,
        .weight_dtype_bytes = 2,
        .kv_dtype_bytes = 2,
    };
}

int bench_options_parse(int argc, char **argv, struct options *o)
{
    int opt, rc;
    while ((opt = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
        if (opt == 'h') {
            bench_usage(stdout);
            return 3;
        }
        if (opt == '?') {
            bench_usage(stderr);
            return 2;
        }
        if ((rc = parse_flag(o, opt, optarg)) != 0)
            goto refused;
    }
    if (optind < argc) {
        fprintf(stderr, "pagoda-bench: unexpected argument '%s'\n", argv[optind]);
        bench_usage(stderr);
        return 2;
    }
    if ((rc = check_flags(o)) != 0)
        goto refused;
    set_defaults(o);
    return 0;
refused:;
    char msg[512];
    fprintf(stderr, "pagoda-bench: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
    return 2;
}
