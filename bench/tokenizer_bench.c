/* tokenizer_bench: single-thread encoding throughput of pagoda's tokenizer.
 *
 *   tokenizer_bench [--passes N] [--warmup N] [--json FILE] TOKENIZER_JSON DOCS_JSONL
 *
 * DOCS_JSONL holds one JSON string per line, a document each. A pass encodes every document
 * once, one call per document (add_special_tokens false), on this thread; --warmup passes
 * (default 1) are not timed, then --passes (default 5) are. Prints the median pass as MB/s (10^6
 * bytes of UTF-8 input per second) and tokens/s, and with --json writes the same with every
 * pass's time. bench/tokenizer_bench.mjs does the same work with npm `tokenizers`;
 * bench/run_tokenizer.sh runs both and prints the table of bench/RESULTS.md. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/error.h"
#include "tokenizer/tokenizer.h"

#define BENCH_MAX_PASSES 1000
#define BENCH_MAX_DOCS 1000000

typedef struct Doc {
    char *text;
    size_t len;
} Doc;

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Reads the documents; -1 after a message. */
static int read_docs(const char *path, Doc **out, size_t *n_out, size_t *bytes_out)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "tokenizer_bench: %s: %s\n", path, strerror(errno));
        return -1;
    }
    Doc *docs = NULL;
    size_t n = 0, cap = 0, bytes = 0;
    char *line = NULL;
    size_t line_cap = 0;
    ssize_t len;
    int rc = 0;
    while ((len = getline(&line, &line_cap, f)) > 0) {
        json_error_t err;
        json_t *s = json_loadb(line, (size_t)len, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        if (!json_is_string(s) || n == BENCH_MAX_DOCS) {
            fprintf(stderr, "tokenizer_bench: %s: document %zu is not a JSON string%s%s\n", path,
                    n + 1, s == NULL ? ": " : "", s == NULL ? err.text : "");
            json_decref(s);
            rc = -1;
            break;
        }
        if (n == cap) {
            cap = cap ? cap * 2 : 256;
            Doc *p = realloc(docs, cap * sizeof *p);
            if (p == NULL) {
                json_decref(s);
                rc = -1;
                break;
            }
            docs = p;
        }
        docs[n].len = json_string_length(s);
        docs[n].text = malloc(docs[n].len + 1);
        if (docs[n].text == NULL) {
            json_decref(s);
            rc = -1;
            break;
        }
        memcpy(docs[n].text, json_string_value(s), docs[n].len + 1);
        bytes += docs[n].len;
        n++;
        json_decref(s);
    }
    free(line);
    fclose(f);
    if (rc != 0) {
        for (size_t i = 0; i < n; i++)
            free(docs[i].text);
        free(docs);
        return -1;
    }
    *out = docs;
    *n_out = n;
    *bytes_out = bytes;
    return 0;
}

/* One pass over the documents; returns the tokens produced, or -1 after a message. */
static long long encode_pass(const Tokenizer *t, const Doc *docs, size_t n, TokenizerIds *ids)
{
    long long tokens = 0;
    for (size_t i = 0; i < n; i++) {
        ids->len = 0;
        int rc = tokenizer_encode(t, docs[i].text, docs[i].len, false, ids);
        if (rc != 0) {
            char buf[600];
            fprintf(stderr, "tokenizer_bench: document %zu: %s\n", i + 1,
                    pagoda_error_message(rc, buf, sizeof buf));
            return -1;
        }
        tokens += (long long)ids->len;
    }
    return tokens;
}

static int usage(void)
{
    fprintf(stderr, "usage: tokenizer_bench [--passes N] [--warmup N] [--json FILE] "
                    "TOKENIZER_JSON DOCS_JSONL\n");
    return 2;
}

int main(int argc, char **argv)
{
    long passes = 5, warmup = 1;
    const char *json_path = NULL;
    int i = 1;
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        char *end;
        if (strcmp(argv[i], "--json") == 0) {
            json_path = argv[i + 1];
            continue;
        }
        long v = strtol(argv[i + 1], &end, 10);
        if (*end != '\0' || v < 0 || v > BENCH_MAX_PASSES)
            return usage();
        if (strcmp(argv[i], "--passes") == 0 && v > 0)
            passes = v;
        else if (strcmp(argv[i], "--warmup") == 0)
            warmup = v;
        else
            return usage();
    }
    if (argc - i != 2)
        return usage();

    Doc *docs = NULL;
    size_t n_docs = 0, bytes = 0;
    if (read_docs(argv[i + 1], &docs, &n_docs, &bytes) != 0)
        return 2;
    Tokenizer *t = NULL;
    int rc = tokenizer_new_from_file(argv[i], &t);
    if (rc != 0) {
        char buf[600];
        fprintf(stderr, "tokenizer_bench: %s: %s\n", argv[i],
                pagoda_error_message(rc, buf, sizeof buf));
        return 2;
    }

    TokenizerIds ids = {0};
    double times[BENCH_MAX_PASSES];
    long long tokens = 0;
    int status = 0;
    for (long p = 0; p < warmup && status == 0; p++)
        if (encode_pass(t, docs, n_docs, &ids) < 0)
            status = 1;
    double cpu0 = clock_s(CLOCK_PROCESS_CPUTIME_ID), wall = 0;
    for (long p = 0; p < passes && status == 0; p++) {
        double t0 = clock_s(CLOCK_MONOTONIC);
        tokens = encode_pass(t, docs, n_docs, &ids);
        times[p] = clock_s(CLOCK_MONOTONIC) - t0;
        wall += times[p];
        if (tokens < 0)
            status = 1;
    }
    double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - cpu0;
    if (status == 0) {
        double sorted[BENCH_MAX_PASSES];
        memcpy(sorted, times, (size_t)passes * sizeof *times);
        qsort(sorted, (size_t)passes, sizeof *sorted, cmp_double);
        double median =
            passes % 2 ? sorted[passes / 2] : (sorted[passes / 2 - 1] + sorted[passes / 2]) / 2;
        double mbs = (double)bytes / median / 1e6, tps = (double)tokens / median;
        /* On a shared machine the CPU time is steadier than the wall clock. */
        double mb_cpu = cpu > 0 ? (double)bytes * (double)passes / cpu / 1e6 : 0;
        printf("pagoda: %zu documents, %zu bytes, %lld tokens; median of %ld passes %.4f s: "
               "%.2f MB/s, %.0f tokens/s (cpu/wall %.2f, %.2f MB per CPU second)\n",
               n_docs, bytes, tokens, passes, median, mbs, tps, wall > 0 ? cpu / wall : 0, mb_cpu);
        if (json_path != NULL) {
            json_t *times_j = json_array();
            for (long p = 0; p < passes; p++)
                json_array_append_new(times_j, json_real(times[p]));
            json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:I, s:I, s:o, s:f, s:f, s:f, s:f, s:f}",
                                  "impl", "pagoda", "tokenizer", argv[i], "docs", argv[i + 1],
                                  "documents", (json_int_t)n_docs, "bytes", (json_int_t)bytes,
                                  "tokens", (json_int_t)tokens, "pass_s", times_j, "median_s",
                                  median, "mb_per_s", mbs, "tokens_per_s", tps, "cpu_per_wall",
                                  wall > 0 ? cpu / wall : 0.0, "mb_per_cpu_s", mb_cpu);
            if (o == NULL || json_dump_file(o, json_path, JSON_INDENT(1)) != 0) {
                fprintf(stderr, "tokenizer_bench: cannot write %s\n", json_path);
                status = 2;
            }
            json_decref(o);
        }
    }
    tokenizer_ids_fini(&ids);
    tokenizer_free(t);
    for (size_t d = 0; d < n_docs; d++)
        free(docs[d].text);
    free(docs);
    return status;
}
