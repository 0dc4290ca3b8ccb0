/* pagoda-bench's flags: the options a run is made of, their parsing, checks and defaults
 * (bench/pagoda_bench.c runs them). */
#ifndef PAGODA_BENCH_BENCH_OPTIONS_H
#define PAGODA_BENCH_BENCH_OPTIONS_H

#include "bench/workload.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifndef PAGODA_BENCH_DEFAULT_MODEL
#define PAGODA_BENCH_DEFAULT_MODEL "assets/pagoda-brown"
#endif

/* Client threads of one run, at most. */
#define BENCH_MAX_THREADS 4096u
/* Rates of one sweep, at most. */
#define BENCH_MAX_SWEEP 64u
#define BENCH_DEFAULT_MAX_CONCURRENCY 256u
#define BENCH_DEFAULT_STATS_INTERVAL_MS 200u
#define BENCH_WARMUP_PROMPT_LEN 16u
#define BENCH_WARMUP_MAX_TOKENS 8u
#define BENCH_DEFAULT_TIMELINE_INTERVAL_S 5.0
/* The longest --duration: a day. */
#define BENCH_MAX_DURATION_S 86400.0
/* --duration without --num-prompts, closed loop: the workload's size, PROMPTS_PER_CLIENT per
 * client within [MIN_PROMPTS, PROMPTS] (requests not sent by the deadline are not sent; a
 * workload used up before it ends the run early, and says so). */
#define BENCH_DURATION_CLOSED_PROMPTS 65536u
#define BENCH_DURATION_CLOSED_MIN_PROMPTS 4096u
#define BENCH_DURATION_PROMPTS_PER_CLIENT 256u
/* The realistic workload's defaults: log-normal medians and sigmas; caps of CAP_FACTOR x the
 * median unless --input-len / --output-len give MEDIAN:CAP. Chat traffic as published traces
 * (ShareGPT, LMSYS-Chat) show it has a median prompt of a few hundred tokens and a long tail. */
#define BENCH_REALISTIC_INPUT_MEDIAN 256u
#define BENCH_REALISTIC_OUTPUT_MEDIAN 128u
#define BENCH_REALISTIC_INPUT_SIGMA 1.0
#define BENCH_REALISTIC_OUTPUT_SIGMA 0.8
#define BENCH_REALISTIC_CAP_FACTOR 16u

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
    OPT_MATRIX_TFLOPS,
    OPT_API,
    OPT_MODEL_NAME,
    OPT_STATS_URL,
    OPT_DURATION,
    OPT_TIMELINE_INTERVAL,
    OPT_TIMELINE_PLOT,
    OPT_LENGTH_SIGMA,
    OPT_COUNT_ /* flags are tracked in a 64-bit mask below */
};

_Static_assert(OPT_COUNT_ - OPT_URL <= 64, "every flag needs a bit of options.given");
#define GIVEN(o, opt) (((o)->given >> ((opt)-OPT_URL)) & 1u)

/* The API the benchmark speaks: the router's (libpagoda over NNG) or OpenAI's streaming
 * completions over HTTP (bench/openai_client.h: pagoda-gateway or any compatible server). */
enum bench_api { BENCH_API_PAGODA, BENCH_API_OPENAI };

struct options {
    uint64_t given; /* bit (opt - OPT_URL) for each flag given */
    enum bench_api api;
    const char *model_name; /* --api openai: the "model" field (default: the server's first) */
    const char *stats_url;  /* --api openai: a router to read the engine's figures from */
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
    double bandwidth_gbs, weight_bytes, baseline_tps, matrix_tflops;
    int weight_dtype_bytes, kv_dtype_bytes;
    double duration_s;          /* 0: send the whole workload */
    double timeline_interval_s; /* the timeline's window */
    const char *timeline_plot_path;
    double input_sigma, output_sigma;      /* realistic */
    int input_cap_given, output_cap_given; /* realistic: MEDIAN:CAP given */
};

/* The defaults of every option (before the flags). */
void bench_options_init(struct options *o);

/* Parses argv into o, checks the combination and fills the defaults that depend on the
 * workload. Returns 0, 3 after printing the usage for --help, or 2 after printing why the flags
 * are refused. */
int bench_options_parse(int argc, char **argv, struct options *o);

/* Prints the usage. */
void bench_usage(FILE *f);

#endif
