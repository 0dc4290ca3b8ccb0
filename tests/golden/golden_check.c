/* Compares the CPU forward pass with golden logits from Hugging Face transformers.
 *
 * usage: golden_check GOLDEN_DIR MODELS_DIR
 *
 * GOLDEN_DIR holds manifest.json and the logits files written by make_golden.py on the GPU
 * machine; MODELS_DIR the models regenerated here by tests/hf/make_models.sh (the wrapper
 * run_golden.sh checks their SHA-256 against the manifest first). Every prompt runs through
 * the paged forward pass in two chunks (the second continuing the sequence already in the
 * pool, through a shuffled block table), once with each attention implementation, and every
 * position's logits must satisfy ||logits - golden|| / ||golden|| < 1e-4. Prints one line per
 * (model, prompt, attention) and "N passed, M failed" last. */
#include "common/error.h"
#include "common/json_util.h"
#include "model/model_weights.h"
#include "worker/cpu_backend.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOLERANCE 1e-4
#define BLOCK_SIZE 16

static int read_floats(const char *path, float *dst, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return pagoda_error_set(PAGODA_ENOENT, "%s: cannot open", path);
    size_t got = fread(dst, sizeof(float), n, f);
    int extra = fgetc(f);
    fclose(f);
    if (got != n || extra != EOF)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: expected %zu floats", path, n);
    return 0;
}

/* Runs tokens[0..n) through the backend as two steps (split at `split`) of one sequence whose
 * block table is a shuffled set of pool blocks; writes all n rows of logits. */
static int run_prompt(struct backend *be, const int32_t *tokens, int32_t n, int32_t split,
                      int32_t num_pool_blocks, float *logits)
{
    int32_t nblocks = (n + BLOCK_SIZE - 1) / BLOCK_SIZE;
    int32_t table[64];
    /* Blocks from the end of the pool backwards, then swapped pairwise: never block 0. */
    for (int32_t i = 0; i < nblocks; i++)
        table[i] = num_pool_blocks - 1 - i;
    for (int32_t i = 0; i + 1 < nblocks; i += 2) {
        int32_t t = table[i];
        table[i] = table[i + 1];
        table[i + 1] = t;
    }
    int32_t vocab = (int32_t)backend_config(be)->vocab_size;
    int32_t starts[2] = {0, split}, ends[2] = {split, n};
    for (int s = 0; s < 2; s++) {
        int32_t m = ends[s] - starts[s];
        if (m == 0)
            continue;
        int32_t positions[128], rows[128], qs[2] = {0, m}, ctx = ends[s];
        int64_t slots[128];
        for (int32_t j = 0; j < m; j++) {
            int32_t p = starts[s] + j;
            positions[j] = p;
            slots[j] = (int64_t)table[p / BLOCK_SIZE] * BLOCK_SIZE + p % BLOCK_SIZE;
            rows[j] = j;
        }
        struct fwd_batch b = {
            .num_tokens = m,
            .token_ids = tokens + starts[s],
            .positions = positions,
            .slot_mapping = slots,
            .num_seqs = 1,
            .query_start = qs,
            .context_lens = &ctx,
            .block_tables = table,
            .max_blocks_per_seq = nblocks,
            .num_logits = m,
            .logits_indices = rows,
        };
        int rc = backend_forward(be, &b, logits + (size_t)starts[s] * vocab);
        if (rc != 0)
            return rc;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: golden_check GOLDEN_DIR MODELS_DIR\n");
        return 2;
    }
    char path[4096], msg[600];
    snprintf(path, sizeof(path), "%s/manifest.json", argv[1]);
    json_t *manifest;
    int rc = json_util_load_file(path, 1 << 24, &manifest);
    if (rc != 0) {
        fprintf(stderr, "golden_check: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
        return 1;
    }
    int passed = 0, failed = 0;
    size_t mi;
    json_t *m;
    json_array_foreach(json_object_get(manifest, "models"), mi, m)
    {
        const char *name = json_string_value(json_object_get(m, "name"));
        snprintf(path, sizeof(path), "%s/%s", argv[2], name);
        struct model_weights *w = NULL;
        if ((rc = model_weights_open(path, &w)) != 0) {
            fprintf(stderr, "golden_check: %s: %s\n", name,
                    pagoda_error_message(rc, msg, sizeof(msg)));
            failed++;
            continue;
        }
        const struct model_config *c = &w->config;
        int32_t vocab = (int32_t)c->vocab_size;
        struct kv_geometry g = {
            .pool_id = 1,
            .num_layers = (int32_t)c->num_layers,
            .num_blocks = 16,
            .block_size = BLOCK_SIZE,
            .num_kv_heads = (int32_t)c->num_kv_heads,
            .head_dim = (int32_t)c->head_dim,
            .dtype = DTYPE_F32,
        };
        void *pool = calloc(1, kv_pool_bytes(&g));
        for (int impl = ATTN_CPU_GATHER; impl <= ATTN_CPU_PAGED; impl++) {
            struct cpu_backend_options opt = cpu_backend_default_options();
            opt.attention = (enum attention_impl)impl;
            struct backend *be = NULL;
            if (pool == NULL || (rc = cpu_backend_open(w, &g, pool, &opt, &be)) != 0) {
                fprintf(stderr, "golden_check: %s: cannot open the backend\n", name);
                failed++;
                continue;
            }
            size_t pi;
            json_t *p;
            json_array_foreach(json_object_get(m, "prompts"), pi, p)
            {
                json_t *toks = json_object_get(p, "tokens");
                int32_t n = (int32_t)json_array_size(toks);
                int32_t *tokens = malloc(sizeof(int32_t) * (size_t)n);
                float *got = malloc(sizeof(float) * (size_t)n * vocab);
                float *want = malloc(sizeof(float) * (size_t)n * vocab);
                for (int32_t i = 0; i < n; i++)
                    tokens[i] = (int32_t)json_integer_value(json_array_get(toks, (size_t)i));
                snprintf(path, sizeof(path), "%s/%s", argv[1],
                         json_string_value(json_object_get(p, "file")));
                double worst = INFINITY;
                if ((rc = read_floats(path, want, (size_t)n * vocab)) == 0 &&
                    (rc = run_prompt(be, tokens, n, n * 3 / 8, g.num_blocks, got)) == 0) {
                    worst = 0;
                    for (int32_t i = 0; i < n; i++) {
                        double num = 0, den = 0;
                        for (int32_t v = 0; v < vocab; v++) {
                            double d =
                                (double)got[(size_t)i * vocab + v] - want[(size_t)i * vocab + v];
                            num += d * d;
                            den +=
                                (double)want[(size_t)i * vocab + v] * want[(size_t)i * vocab + v];
                        }
                        double rel = sqrt(num / den);
                        if (!(rel <= worst))
                            worst = rel;
                    }
                }
                int ok = rc == 0 && worst < TOLERANCE;
                printf("%-28s len %4d  %-6s  max rel err %.2e  %s\n", name, n,
                       impl == ATTN_CPU_GATHER ? "gather" : "paged", worst, ok ? "ok" : "FAIL");
                if (rc != 0)
                    fprintf(stderr, "  %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
                ok ? passed++ : failed++;
                free(tokens);
                free(got);
                free(want);
            }
            backend_close(be);
        }
        free(pool);
        model_weights_close(w);
    }
    json_decref(manifest);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}
