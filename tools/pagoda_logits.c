/* pagoda-logits: teacher-forced logits of one prompt at every position, for comparisons with
 * a reference implementation (tests/gpu/hf_compare.py). Writes num_tokens x vocab float32
 * little-endian values to --out. The prompt runs through the paged forward pass in chunks of
 * --chunk tokens (each chunk continuing the sequence already in the pool).
 *
 * usage: pagoda-logits --model DIR --tokens 1,2,3 --out FILE [--backend cpu|cuda]
 *                      [--chunk N] [--block-size B] [--load-format safetensors|random]
 *                      [--seed N] [--cuda-tma on|off|stream-k] [--kv-cache-dtype auto|fp8]
 *
 * --load-format random (CUDA only) draws the weights of DIR/config.json's shape on the GPU from
 * --seed, as pagoda-run and pagoda-worker do with the same flags: the same seed, the same
 * weights. --cuda-tma off (CUDA) runs a chunk's linears of 2 to 16 rows through the GEMVs and
 * cuBLAS instead of kernels/cuda/linear_tma's GEMM, --cuda-tma stream-k runs that GEMM with
 * stream-K where it balances, as pagoda-run's and pagoda-worker's flag does. --kv-cache-dtype fp8
 * (CUDA) keeps K and V in an F8E4M3 pool, as kvpool's flag (tests/gpu/hf_compare.py measures
 * its distance to transformers).
 * --backend is cpu or cuda (anything else is refused). */
#include "common/error.h"
#include "common/parse.h"
#include "worker/cpu_backend.h"
#include "worker/worker_args.h"
#ifdef PAGODA_HAVE_CUDA
#include "worker/cuda_backend.h"
#endif

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_TOKENS (1 << 16)

static int fail(int rc)
{
    char msg[700];
    fprintf(stderr, "pagoda-logits: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
    return 1;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"tokens", required_argument, NULL, 't'},
        {"out", required_argument, NULL, 'o'},
        {"backend", required_argument, NULL, 'b'},
        {"chunk", required_argument, NULL, 'c'},
        {"block-size", required_argument, NULL, 's'},
        {"load-format", required_argument, NULL, 'l'},
        {"seed", required_argument, NULL, 'S'},
        {"cuda-tma", required_argument, NULL, 'T'},       /* CUDA only */
        {"kv-cache-dtype", required_argument, NULL, 'K'}, /* CUDA only */
        {NULL, 0, NULL, 0},
    };
    const char *model = NULL, *out_path = NULL, *backend_name = "cpu";
    int32_t *tokens = NULL;
    size_t n = 0;
    int64_t chunk = 512, block_size = 16, seed = 0;
    int random_weights = 0, cuda_tma = 1, cuda_tma_set = 0;
    enum dtype kv_dtype = DTYPE_BF16; /* --kv-cache-dtype; auto: the backend's own */
    int opt, rc = 0;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'm':
            model = optarg;
            break;
        case 't':
            free(tokens);
            rc = parse_i32_list("--tokens", optarg, 0, INT32_MAX, MAX_TOKENS, &tokens, &n);
            break;
        case 'o':
            out_path = optarg;
            break;
        case 'b':
            backend_name = optarg;
            break;
        case 'c':
            rc = parse_i64("--chunk", optarg, 1, MAX_TOKENS, &chunk);
            break;
        case 's':
            rc = parse_i64("--block-size", optarg, 8, 64, &block_size);
            break;
        case 'l':
            if (strcmp(optarg, "random") == 0)
                random_weights = 1;
            else if (strcmp(optarg, "safetensors") != 0)
                rc = pagoda_error_set(PAGODA_EINVAL,
                                      "--load-format: '%s' is not safetensors or random", optarg);
            break;
        case 'S':
            rc = parse_i64("--seed", optarg, 0, INT64_MAX, &seed);
            break;
        case 'T':
            rc = worker_parse_cuda_tma("--cuda-tma", optarg, &cuda_tma);
            cuda_tma_set = 1;
            break;
        case 'K':
            rc = dtype_from_kv_cache_name("--kv-cache-dtype", optarg, DTYPE_BF16, &kv_dtype);
            break;
        default:
            fprintf(stderr, "usage: pagoda-logits --model DIR --tokens 1,2,3 --out FILE "
                            "[--backend cpu|cuda] [--chunk N] [--block-size B] "
                            "[--load-format safetensors|random] [--seed N] "
                            "[--cuda-tma on|off|stream-k] [--kv-cache-dtype auto|fp8]\n");
            free(tokens);
            return 2;
        }
        if (rc != 0) {
            free(tokens);
            return fail(rc) + 1;
        }
    }
    /* the flags that do not go together, each refused (exit 2) with its reason */
    const int use_cuda = strcmp(backend_name, "cuda") == 0;
    char refused[160] = "";
    if (model == NULL || tokens == NULL || out_path == NULL)
        snprintf(refused, sizeof(refused), "--model, --tokens and --out are required");
    else if (!use_cuda && strcmp(backend_name, "cpu") != 0)
        snprintf(refused, sizeof(refused), "--backend %.64s: expected cpu or cuda", backend_name);
    else if (random_weights && !use_cuda)
        snprintf(refused, sizeof(refused), "--load-format random needs --backend cuda");
    else if (cuda_tma_set && !use_cuda)
        snprintf(refused, sizeof(refused), "--cuda-tma needs --backend cuda");
    else if (kv_dtype != DTYPE_BF16 && !use_cuda)
        snprintf(refused, sizeof(refused), "--kv-cache-dtype fp8 needs --backend cuda");
    if (refused[0] != '\0') {
        fprintf(stderr, "pagoda-logits: %s\n", refused);
        free(tokens);
        return 2;
    }
    struct model_weights *w = NULL;
    struct model_config cfg;
    struct backend *be = NULL;
    void *pool = NULL;
    float *logits = NULL;
    int32_t *table = NULL, *positions = NULL, *rows = NULL;
    int64_t *slots = NULL;
    FILE *f = NULL;
    if (random_weights)
        rc = model_config_load(model, &cfg);
    else if ((rc = model_weights_open(model, &w)) == 0)
        cfg = w->config;
    if (rc != 0)
        goto done;
    const struct model_config *c = &cfg;
    int32_t nblocks = (int32_t)((n + (size_t)block_size - 1) / (size_t)block_size);
    struct kv_geometry g = {
        .pool_id = 1,
        .num_layers = (int32_t)c->num_layers,
        .num_blocks = nblocks + 1,
        .block_size = (int32_t)block_size,
        .num_kv_heads = (int32_t)c->num_kv_heads,
        .head_dim = (int32_t)c->head_dim,
        .dtype = use_cuda ? kv_dtype : DTYPE_F32,
    };
    struct backend_limits limits = {.max_num_tokens = (int32_t)chunk,
                                    .max_num_seqs = (int32_t)chunk, /* every row's logits */
                                    .max_blocks_per_seq = nblocks};
    if (use_cuda) {
#ifdef PAGODA_HAVE_CUDA
        struct cuda_backend_options co = cuda_backend_default_options();
        co.limits = limits;
        co.cuda_graphs = 0; /* prefill chunks only: a decode graph would never be replayed */
        cuda_backend_set_tma(&co, cuda_tma);
        if ((rc = cuda_pool_alloc(&g, 0, &pool)) != 0 ||
            (rc = cuda_backend_open(c, w, (uint64_t)seed, &g, pool, &co, &be)) != 0)
            goto done;
#else
        rc = pagoda_error_set(PAGODA_EUNSUPPORTED, "this build has no CUDA backend");
        goto done;
#endif
    } else {
        pool = calloc(1, kv_pool_bytes(&g));
        struct cpu_backend_options co = cpu_backend_default_options();
        co.limits = limits;
        if (pool == NULL) {
            rc = PAGODA_ENOMEM;
            goto done;
        }
        if ((rc = cpu_backend_open(w, &g, pool, &co, &be)) != 0)
            goto done;
    }
    logits = malloc(n * (size_t)c->vocab_size * sizeof(float));
    table = malloc((size_t)nblocks * sizeof(int32_t));
    positions = malloc((size_t)chunk * sizeof(int32_t));
    rows = malloc((size_t)chunk * sizeof(int32_t));
    slots = malloc((size_t)chunk * sizeof(int64_t));
    if (!logits || !table || !positions || !rows || !slots) {
        rc = PAGODA_ENOMEM;
        goto done;
    }
    /* Blocks in reverse order: the block table is not the identity. */
    for (int32_t b = 0; b < nblocks; b++)
        table[b] = nblocks - b;
    for (size_t start = 0; start < n; start += (size_t)chunk) {
        int32_t m = (int32_t)((n - start) < (size_t)chunk ? (n - start) : (size_t)chunk);
        int32_t qs[2] = {0, m}, ctx = (int32_t)start + m;
        for (int32_t j = 0; j < m; j++) {
            int32_t p = (int32_t)start + j;
            positions[j] = p;
            slots[j] = (int64_t)table[p / block_size] * block_size + p % block_size;
            rows[j] = j;
        }
        struct fwd_batch b = {
            .num_tokens = m,
            .token_ids = tokens + start,
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
        if ((rc = backend_forward(be, &b, logits + start * (size_t)c->vocab_size)) != 0)
            goto done;
    }
    f = fopen(out_path, "wb");
    if (f == NULL || fwrite(logits, sizeof(float) * (size_t)c->vocab_size, n, f) != n) {
        rc = pagoda_error_set(PAGODA_EIO, "%s: cannot write", out_path);
        goto done;
    }
done:
    if (f != NULL && fclose(f) != 0 && rc == 0)
        rc = pagoda_error_set(PAGODA_EIO, "%s: cannot write", out_path);
    backend_close(be);
#ifdef PAGODA_HAVE_CUDA
    if (use_cuda)
        cuda_pool_free(pool);
    else
#endif
        free(pool);
    model_weights_close(w);
    free(tokens);
    free(logits);
    free(table);
    free(positions);
    free(rows);
    free(slots);
    return rc == 0 ? 0 : fail(rc);
}
