/* pagoda-run: offline generation for people and scripts.
 *
 * Every prompt runs in one batch: each step is one forward pass over all unfinished sequences,
 * prefill chunks and decode tokens together (chunked when the prompts exceed the step's token
 * budget), against one KV pool laid out as kvpool/geometry.h defines. Tokens are chosen by the
 * sampler of kernels/cpu/sampler.h, so a seeded run repeats exactly and a prompt's tokens do not
 * depend on the other prompts in the batch. A prompt whose row cannot be sampled (logits that are
 * not finite: a broken model) ends with finish_reason "error" and the sampler's message, as the
 * server ends that request; the others go on, and the exit status is 1.
 *
 * --prompt TEXT takes a text prompt (the model folder's tokenizer.json encodes it with its special
 * tokens, as the router does) and prints the output's text (special tokens left out) instead of
 * its ids; with --json the line has both. */
#include "common/error.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/sampling_flags.h"
#include "kernels/cpu/sampler.h"
#include "model/model_weights.h"
#include "text/text_model.h"
#include "worker/cpu_backend.h"
#include "worker/worker_args.h"
#ifdef PAGODA_HAVE_CUDA
#include "worker/cuda_backend.h"
#endif

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_PROMPTS 256
#define MAX_PROMPT_TOKENS (1 << 20)
#define MAX_NEW_TOKENS (1 << 20)
/* --stop-token-ids: the scheduler's limit for a request's. */
#define MAX_STOP_IDS 64

struct seq {
    int32_t *tokens; /* prompt then output */
    float *logprobs; /* one per output token */
    int32_t num_prompt;
    int32_t num_tokens;   /* prompt + output so far */
    int32_t num_computed; /* tokens whose K/V are in the pool */
    int32_t max_total;    /* stop when num_tokens reaches it */
    int32_t *block_table;
    int32_t num_blocks;
    const char *finish;                /* NULL while running: "stop", "length" or "error" */
    char error[BACKEND_ROW_ERROR_MAX]; /* why, for "error" */
};

struct run_opts {
    const char *model;
    const char *backend;     /* "cpu" or "cuda" */
    const char *load_format; /* "safetensors" or "random" */
    const char *attention;
    int32_t max_tokens;
    int32_t block_size;
    int32_t max_batched_tokens;
    int json;
    int ignore_eos;
    int stats;
    int cuda_graphs;        /* --cuda-graphs: 1 on (the default), 0 off */
    int cuda_pdl;           /* --cuda-pdl: 1 on (the default), 0 off */
    int cuda_residual_gemm; /* --cuda-residual-gemm: 1 on (the default), 0 off */
    int cuda_tma;           /* --cuda-tma: worker/backend.h BACKEND_CUDA_TMA_* (default on) */
    enum dtype kv_dtype;    /* --kv-cache-dtype (CUDA): BF16 (auto) or F8E4M3 */
    struct sampling_params sampling;
    struct sampling_flags flags; /* --temperature .. --seed as given (common/sampling_flags.h) */
    const char **texts;          /* [MAX_PROMPTS]: the text of a --prompt, NULL for --tokens */
    /* --logit-bias ID:VALUE (each prompt's, as a request's; kernels/cpu/logit_bias.h) */
    int32_t bias_ids[SAMPLING_LOGIT_BIAS_MAX];
    float bias_values[SAMPLING_LOGIT_BIAS_MAX];
    struct logit_bias bias;
    int32_t *stop_ids; /* --stop-token-ids, num_stop of them */
    size_t num_stop;
    /* What --min-tokens suppresses until that many tokens: the model's EOS ids (also with
     * --ignore-eos) and the stop ids, distinct, as the scheduler lists them; bias_rest is the bias
     * without them (logit_bias_without). */
    int32_t suppress[SAMPLING_SUPPRESS_MAX];
    int32_t num_suppress;
    struct logit_bias bias_rest;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pagoda-run --model DIR --tokens 1,2,3 [--tokens 4,5 ...] --max-tokens N\n"
            "                  [--temperature T] [--top-p P] [--top-k K] [--min-p M]\n"
            "                  [--repetition-penalty R] [--presence-penalty X]\n"
            "                  [--frequency-penalty X] [--seed S] [--block-size B]\n"
            "                  [--max-batched-tokens N] [--attention paged|gather]\n"
            "                  [--ignore-eos] [--stop-token-ids ID,...] [--min-tokens N]\n"
            "                  [--logit-bias ID:VALUE ...] [--stats] [--json]\n"
            "                  [--prompt TEXT ...]\n"
            "                  [--backend cpu|cuda] [--load-format safetensors|random]\n"
            "                  [--cuda-graphs on|off] [--cuda-pdl on|off]\n"
            "                  [--cuda-residual-gemm on|off] [--cuda-tma on|off|stream-k]\n"
            "                  [--kv-cache-dtype auto|fp8]\n"
            "--load-format random (CUDA only) draws weights of the shape in DIR/config.json on\n"
            "the GPU from --seed, so no weight file is needed. --cuda-graphs off runs decode\n"
            "steps launch by launch instead of replaying CUDA graphs, --cuda-pdl off launches\n"
            "every kernel in plain stream order (both for comparison: the same tokens).\n"
            "--cuda-residual-gemm off rounds the O and down projections of steps of 2 to 256\n"
            "tokens to BF16 before the residual add instead of adding them in FP32 inside\n"
            "their GEMMs (other bits, for comparison). --cuda-tma off runs a layer's linears\n"
            "of steps of 2 to 16 tokens through the GEMVs and cuBLAS instead of\n"
            "kernels/cuda/linear_tma's GEMM (other bits, for comparison); --cuda-tma\n"
            "stream-k runs that GEMM with stream-K where it balances (its QKV and gate/up\n"
            "spread over every SM; other bits; off by default until measured).\n"
            "--kv-cache-dtype fp8 (CUDA only) keeps K and V as 8-bit floats (E4M3), as\n"
            "pagoda-kvpool's flag.\n"
            "As a request to the group: a sequence stops at the model's EOS ids (config.json's,\n"
            "generation_config.json's, the tokenizer's; not with --ignore-eos) and at\n"
            "--stop-token-ids (up to %d, also with --ignore-eos); --logit-bias adds VALUE (in\n"
            "[-100, 100]) to token ID's logit (repeatable, up to %d tokens); --min-tokens N\n"
            "suppresses the EOS ids (even with --ignore-eos) and the stop ids until N tokens.\n",
            MAX_STOP_IDS, SAMPLING_LOGIT_BIAS_MAX);
}

static int fail(int rc)
{
    char msg[700];
    fprintf(stderr, "pagoda-run: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
    return 1;
}

/* Whether a sequence that has just sampled tok (its out_len-th output token) stops there: the
 * group's rule (kernels/cpu/logit_bias.h). */
static int stops(const struct model_config *c, const struct run_opts *o, int32_t tok,
                 int32_t out_len)
{
    return stop_token_ends(tok, out_len, o->sampling.min_tokens, o->ignore_eos, c->eos_token_ids,
                           c->num_eos, o->stop_ids, (int32_t)o->num_stop);
}

/* The distinct union of the EOS ids and the stop ids into o->suppress, and the bias without them
 * (what --min-tokens needs), once the model is known; and the flags' checks against it. */
static int prepare_stops(const struct model_config *c, struct run_opts *o)
{
    int rc;
    if ((rc = logit_bias_validate(o->bias.ids, (size_t)o->bias.n, o->bias.values, (size_t)o->bias.n,
                                  c->vocab_size)) != 0)
        return rc;
    if (o->sampling.min_tokens > o->max_tokens)
        return pagoda_error_set(PAGODA_ERANGE, "--min-tokens %d is more than --max-tokens %d",
                                (int)o->sampling.min_tokens, (int)o->max_tokens);
    /* a stop id past the vocabulary is never drawn (the group takes it too) */
    _Static_assert(MODEL_MAX_EOS + MAX_STOP_IDS <= SAMPLING_SUPPRESS_MAX, "o->suppress holds all");
    o->num_suppress = stop_ids_suppressed(c->eos_token_ids, c->num_eos, o->stop_ids,
                                          (int32_t)o->num_stop, c->vocab_size, o->suppress);
    return logit_bias_without(&o->bias, o->suppress, o->num_suppress, &o->bias_rest);
}

/* tok: the tokenizer of a text prompt (its output is printed as text), else NULL. */
static void print_result(const struct seq *s, int json, const Tokenizer *tok)
{
    int32_t n = s->num_tokens - s->num_prompt;
    char *text = NULL;
    size_t text_len = 0;
    if (tok != NULL) {
        /* Ids the tokenizer does not know (a model vocabulary padded beyond it) add no text, as
         * in the router's output. */
        int32_t *known = malloc(((size_t)n + 1) * sizeof(*known));
        size_t k = 0;
        for (int32_t i = 0; known != NULL && i < n; i++) {
            int32_t id = s->tokens[s->num_prompt + i];
            if (tokenizer_id_to_token(tok, id) != NULL)
                known[k++] = id;
        }
        if (known == NULL || tokenizer_decode(tok, known, k, true, &text, &text_len) != 0) {
            fprintf(stderr, "pagoda-run: could not decode the output: %s\n", pagoda_error_detail());
            free(text);
            text = NULL;
        }
        free(known);
    }
    if (tok != NULL && !json) {
        if (text != NULL)
            fwrite(text, 1, text_len, stdout);
        printf("\n");
        free(text);
        return;
    }
    if (json) {
        printf("{\"token_ids\": [");
        for (int32_t i = 0; i < n; i++)
            printf("%s%d", i ? ", " : "", s->tokens[s->num_prompt + i]);
        printf("], \"logprobs\": [");
        for (int32_t i = 0; i < n; i++)
            printf("%s%.6g", i ? ", " : "", s->logprobs[i]);
        printf("], \"finish_reason\": \"%s\"", s->finish);
        if (text != NULL) {
            printf(", \"text\": ");
            json_util_print_string(stdout, text, text_len);
        }
        if (s->error[0] != '\0') {
            printf(", \"error\": \"");
            for (const char *c = s->error; *c; c++)
                printf(*c == '"' || *c == '\\' ? "\\%c" : "%c", *c);
            printf("\"");
        }
        printf("}\n");
    } else {
        for (int32_t i = 0; i < n; i++)
            printf("%s%d", i ? "," : "", s->tokens[s->num_prompt + i]);
        printf("\n");
    }
    free(text);
}

/* The step's batch: built into arrays sized for the whole run once. */
struct step_buf {
    int32_t *token_ids, *positions, *query_start, *context_lens, *block_tables, *logits_rows;
    int64_t *slots;
    int32_t *seq_of_row; /* which sequence each logits row belongs to */
    int32_t *sched;      /* which sequence each scheduled chunk belongs to */
    struct sample_row *rows;
    int32_t *tokens;
    float *logprobs;
    struct backend_row_error *errors;
    struct logit_entry *entries; /* the rows' logit bias and suppressed ids */
};

/* c: the model's config with the tokenizer's EOS (the backend's has config.json's and
 * generation_config.json's alone). */
static int generate(struct backend *be, const struct model_config *c, struct seq *seqs,
                    int num_seqs, int32_t block_size, int32_t max_blocks, const struct run_opts *o)
{
    struct step_buf sb = {0};
    size_t budget = (size_t)o->max_batched_tokens;
    int rc = PAGODA_ENOMEM;
    sb.token_ids = malloc(budget * sizeof(int32_t));
    sb.positions = malloc(budget * sizeof(int32_t));
    sb.slots = malloc(budget * sizeof(int64_t));
    sb.query_start = malloc((size_t)(num_seqs + 1) * sizeof(int32_t));
    sb.context_lens = malloc((size_t)num_seqs * sizeof(int32_t));
    sb.block_tables = malloc((size_t)num_seqs * (size_t)max_blocks * sizeof(int32_t));
    sb.logits_rows = malloc((size_t)num_seqs * sizeof(int32_t));
    sb.seq_of_row = malloc((size_t)num_seqs * sizeof(int32_t));
    sb.sched = malloc((size_t)num_seqs * sizeof(int32_t));
    sb.rows = malloc((size_t)num_seqs * sizeof(*sb.rows));
    sb.tokens = malloc((size_t)num_seqs * sizeof(int32_t));
    sb.logprobs = malloc((size_t)num_seqs * sizeof(float));
    sb.errors = malloc((size_t)num_seqs * sizeof(*sb.errors));
    const int entries = o->bias.n > 0 || (o->sampling.min_tokens > 0 && o->num_suppress > 0);
    sb.entries =
        entries ? malloc((size_t)num_seqs * LOGIT_ENTRIES_PER_ROW * sizeof(*sb.entries)) : NULL;
    if ((entries && !sb.entries) || !sb.token_ids || !sb.positions || !sb.slots ||
        !sb.query_start || !sb.context_lens || !sb.block_tables || !sb.logits_rows ||
        !sb.seq_of_row || !sb.sched || !sb.rows || !sb.tokens || !sb.logprobs || !sb.errors)
        goto out;

    for (;;) {
        /* Schedule: decodes first (one token each), then prefill chunks within the budget. */
        int32_t n = 0, ns = 0, nl = 0, ne = 0;
        for (int pass = 0; pass < 2; pass++) {
            for (int i = 0; i < num_seqs; i++) {
                struct seq *s = &seqs[i];
                int32_t pending = s->num_tokens - s->num_computed;
                if (s->finish != NULL || (pass == 0) != (pending == 1) || pending == 0)
                    continue;
                int32_t take = pending;
                if ((size_t)(n + take) > budget)
                    take = (int32_t)budget - n;
                if (take <= 0)
                    continue;
                sb.query_start[ns] = n;
                sb.sched[ns] = i;
                for (int32_t j = 0; j < take; j++) {
                    int32_t p = s->num_computed + j;
                    sb.token_ids[n + j] = s->tokens[p];
                    sb.positions[n + j] = p;
                    sb.slots[n + j] =
                        (int64_t)s->block_table[p / block_size] * block_size + p % block_size;
                }
                n += take;
                sb.context_lens[ns] = s->num_computed + take;
                memcpy(sb.block_tables + (size_t)ns * max_blocks, s->block_table,
                       (size_t)s->num_blocks * sizeof(int32_t));
                /* Logits only when the chunk reaches the end of what the sequence holds. */
                if (s->num_computed + take == s->num_tokens) {
                    int32_t out_len = s->num_tokens - s->num_prompt;
                    sb.rows[nl] = (struct sample_row){
                        .params = o->sampling,
                        .output_index = (uint64_t)out_len,
                        .prompt_tokens = s->tokens,
                        .n_prompt = (size_t)s->num_prompt,
                        .output_tokens = s->tokens + s->num_prompt,
                        .n_output = (size_t)out_len,
                    };
                    sb.logits_rows[nl] = n - 1;
                    if (entries) {
                        const int suppress = out_len < o->sampling.min_tokens;
                        ne += logit_entries_build(nl, suppress ? &o->bias_rest : &o->bias,
                                                  o->suppress, suppress ? o->num_suppress : 0,
                                                  sb.entries + ne);
                    }
                    sb.seq_of_row[nl++] = i;
                }
                ns++;
            }
        }
        if (ns == 0)
            break;
        sb.query_start[ns] = n;
        struct fwd_batch b = {
            .num_tokens = n,
            .token_ids = sb.token_ids,
            .positions = sb.positions,
            .slot_mapping = sb.slots,
            .num_seqs = ns,
            .query_start = sb.query_start,
            .context_lens = sb.context_lens,
            .block_tables = sb.block_tables,
            .max_blocks_per_seq = max_blocks,
            .num_logits = nl,
            .logits_indices = sb.logits_rows,
            .logit_entries = ne > 0 ? sb.entries : NULL,
            .num_logit_entries = ne,
        };
        if ((rc = backend_forward_sample_rows(be, &b, sb.rows, sb.tokens, sb.logprobs,
                                              sb.errors)) != 0)
            goto out;
        /* Every sequence in the step has its chunk computed. */
        for (int32_t k = 0; k < ns; k++)
            seqs[sb.sched[k]].num_computed += sb.query_start[k + 1] - sb.query_start[k];
        for (int32_t r = 0; r < nl; r++) {
            struct seq *s = &seqs[sb.seq_of_row[r]];
            if (sb.errors[r].code != 0) {
                s->finish = "error";
                snprintf(s->error, sizeof(s->error), "%s", sb.errors[r].message);
                continue;
            }
            int32_t out_len = s->num_tokens - s->num_prompt, token = sb.tokens[r];
            s->tokens[s->num_tokens] = token;
            s->logprobs[out_len] = sb.logprobs[r];
            s->num_tokens++;
            if (stops(c, o, token, out_len + 1))
                s->finish = "stop";
            else if (s->num_tokens >= s->max_total)
                s->finish = "length";
        }
    }
    rc = 0;
out:
    free(sb.token_ids);
    free(sb.positions);
    free(sb.slots);
    free(sb.query_start);
    free(sb.context_lens);
    free(sb.block_tables);
    free(sb.logits_rows);
    free(sb.seq_of_row);
    free(sb.sched);
    free(sb.rows);
    free(sb.tokens);
    free(sb.logprobs);
    free(sb.errors);
    free(sb.entries);
    return rc;
}

enum {
    OPT_BLOCK_SIZE = 256,
    OPT_MAX_BATCHED,
    OPT_ATTENTION,
    OPT_IGNORE_EOS,
    OPT_STATS,
    OPT_JSON,
    OPT_BACKEND,
    OPT_LOAD_FORMAT,
    OPT_CUDA_GRAPHS,
    OPT_CUDA_PDL,
    OPT_CUDA_RESIDUAL_GEMM,
    OPT_CUDA_TMA,
    OPT_KV_CACHE_DTYPE,
    OPT_STOP_TOKEN_IDS,
    OPT_MIN_TOKENS,
    OPT_LOGIT_BIAS,
};

/* The sampling flags given so far into o->sampling. */
static void take_sampling_flags(const struct sampling_flags *f, struct sampling_params *s)
{
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_TEMPERATURE))
        s->temperature = f->temperature;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_TOP_P))
        s->top_p = f->top_p;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_TOP_K))
        s->top_k = f->top_k;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_MIN_P))
        s->min_p = f->min_p;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_REPETITION_PENALTY))
        s->repetition_penalty = f->repetition_penalty;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_PRESENCE_PENALTY))
        s->presence_penalty = f->presence_penalty;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_FREQUENCY_PENALTY))
        s->frequency_penalty = f->frequency_penalty;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_SEED))
        s->seed = f->seed;
}

static int parse_flag(int opt, const char *arg, struct run_opts *o, int32_t ***prompts,
                      size_t **lens, int *num_prompts)
{
    int64_t i;
    double d;
    int rc = 0;
    if (sampling_flag_is(opt)) {
        if ((rc = sampling_flag_parse(opt, arg, &o->flags)) == 0)
            take_sampling_flags(&o->flags, &o->sampling);
        return rc;
    }
    switch (opt) {
    case 'm':
        o->model = arg;
        break;
    case 't': {
        if (*num_prompts >= MAX_PROMPTS)
            return pagoda_error_set(PAGODA_ERANGE, "--tokens: more than %d prompts", MAX_PROMPTS);
        int32_t *toks;
        size_t n;
        if ((rc = parse_i32_list("--tokens", arg, 0, INT32_MAX, MAX_PROMPT_TOKENS, &toks, &n)))
            return rc;
        (*prompts)[*num_prompts] = toks;
        (*lens)[*num_prompts] = n;
        (*num_prompts)++;
        break;
    }
    case 'P':
        if (*num_prompts >= MAX_PROMPTS)
            return pagoda_error_set(PAGODA_ERANGE, "--prompt: more than %d prompts", MAX_PROMPTS);
        o->texts[(*num_prompts)++] = arg; /* encoded once the model is known */
        break;
    case 'n':
        if ((rc = parse_i64("--max-tokens", arg, 1, MAX_NEW_TOKENS, &i)) == 0)
            o->max_tokens = (int32_t)i;
        break;
    case OPT_BLOCK_SIZE:
        if ((rc = parse_i64("--block-size", arg, KV_BLOCK_SIZE_MIN, KV_BLOCK_SIZE_MAX, &i)) == 0)
            o->block_size = (int32_t)i;
        break;
    case OPT_MAX_BATCHED:
        if ((rc = parse_i64("--max-batched-tokens", arg, 1, 1 << 16, &i)) == 0)
            o->max_batched_tokens = (int32_t)i;
        break;
    case OPT_ATTENTION:
        if (strcmp(arg, "paged") != 0 && strcmp(arg, "gather") != 0)
            return pagoda_error_set(PAGODA_EINVAL, "--attention: '%s' is not paged or gather", arg);
        o->attention = arg;
        break;
    case OPT_IGNORE_EOS:
        o->ignore_eos = 1;
        break;
    case OPT_STATS:
        o->stats = 1;
        break;
    case OPT_JSON:
        o->json = 1;
        break;
    case OPT_BACKEND:
        if (strcmp(arg, "cpu") != 0 && strcmp(arg, "cuda") != 0)
            return pagoda_error_set(PAGODA_EINVAL, "--backend: '%s' is not cpu or cuda", arg);
        o->backend = arg;
        break;
    case OPT_CUDA_GRAPHS:
        rc = parse_on_off("--cuda-graphs", arg, &o->cuda_graphs);
        break;
    case OPT_CUDA_PDL:
        rc = parse_on_off("--cuda-pdl", arg, &o->cuda_pdl);
        break;
    case OPT_CUDA_RESIDUAL_GEMM:
        rc = parse_on_off("--cuda-residual-gemm", arg, &o->cuda_residual_gemm);
        break;
    case OPT_CUDA_TMA:
        rc = worker_parse_cuda_tma("--cuda-tma", arg, &o->cuda_tma);
        break;
    case OPT_KV_CACHE_DTYPE:
        rc = dtype_from_kv_cache_name("--kv-cache-dtype", arg, DTYPE_BF16, &o->kv_dtype);
        break;
    case OPT_LOAD_FORMAT:
        if (strcmp(arg, "safetensors") != 0 && strcmp(arg, "random") != 0)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "--load-format: '%s' is not safetensors or random", arg);
        o->load_format = arg;
        break;
    case OPT_STOP_TOKEN_IDS:
        free(o->stop_ids);
        o->stop_ids = NULL;
        rc = parse_i32_list("--stop-token-ids", arg, 0, INT32_MAX, MAX_STOP_IDS, &o->stop_ids,
                            &o->num_stop);
        break;
    case OPT_MIN_TOKENS:
        if ((rc = parse_i64("--min-tokens", arg, 0, MAX_NEW_TOKENS, &i)) == 0)
            o->sampling.min_tokens = (int32_t)i;
        break;
    case OPT_LOGIT_BIAS: {
        int32_t id;
        if ((rc = parse_id_value("--logit-bias", arg, SAMPLING_LOGIT_BIAS_LIMIT, &id, &d)) != 0)
            break;
        if (o->bias.n == SAMPLING_LOGIT_BIAS_MAX)
            return pagoda_error_set(PAGODA_ERANGE, "--logit-bias: at most %d tokens",
                                    SAMPLING_LOGIT_BIAS_MAX);
        o->bias_ids[o->bias.n] = id;
        o->bias_values[o->bias.n++] = (float)d; /* an id twice: refused by logit_bias_validate */
        break;
    }
    default:
        return pagoda_error_set(PAGODA_EINVAL, "unknown option (see --help)");
    }
    return rc;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"model", required_argument, NULL, 'm'},
        {"tokens", required_argument, NULL, 't'},
        {"prompt", required_argument, NULL, 'P'},
        {"max-tokens", required_argument, NULL, 'n'},
        SAMPLING_FLAG_OPTIONS,
        {"block-size", required_argument, NULL, OPT_BLOCK_SIZE},
        {"max-batched-tokens", required_argument, NULL, OPT_MAX_BATCHED},
        {"attention", required_argument, NULL, OPT_ATTENTION},
        {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
        {"stats", no_argument, NULL, OPT_STATS},
        {"json", no_argument, NULL, OPT_JSON},
        {"backend", required_argument, NULL, OPT_BACKEND},
        {"load-format", required_argument, NULL, OPT_LOAD_FORMAT},
        {"cuda-graphs", required_argument, NULL, OPT_CUDA_GRAPHS},
        {"cuda-pdl", required_argument, NULL, OPT_CUDA_PDL},
        {"cuda-residual-gemm", required_argument, NULL, OPT_CUDA_RESIDUAL_GEMM},
        {"cuda-tma", required_argument, NULL, OPT_CUDA_TMA},
        {"kv-cache-dtype", required_argument, NULL, OPT_KV_CACHE_DTYPE},
        {"stop-token-ids", required_argument, NULL, OPT_STOP_TOKEN_IDS},
        {"min-tokens", required_argument, NULL, OPT_MIN_TOKENS},
        {"logit-bias", required_argument, NULL, OPT_LOGIT_BIAS},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct run_opts o = {
        .attention = "paged",
        .backend = "cpu",
        .load_format = "safetensors",
        .cuda_graphs = 1,
        .cuda_pdl = 1,
        .cuda_residual_gemm = 1,
        .cuda_tma = 1,
        .max_tokens = 16,
        .block_size = KV_BLOCK_SIZE_DEFAULT,
        .max_batched_tokens = 2048,
        .sampling = sampling_params_default(),
    };
    o.sampling.temperature = 0.0f; /* greedy unless asked otherwise */
    o.bias = (struct logit_bias){.n = 0, .ids = o.bias_ids, .values = o.bias_values};
    int32_t **prompts = calloc(MAX_PROMPTS, sizeof(*prompts));
    size_t *lens = calloc(MAX_PROMPTS, sizeof(*lens));
    o.texts = calloc(MAX_PROMPTS, sizeof(*o.texts));
    struct text_model *tm = NULL;
    int num_prompts = 0, status = 1, rc = 0, opt;
    struct model_weights *w = NULL;
    struct backend *be = NULL;
    struct seq *seqs = NULL;
    float *pool = NULL;
    void *gpu_pool = NULL; /* the CUDA backend's pool */
    (void)gpu_pool;
    if (prompts == NULL || lens == NULL || o.texts == NULL)
        goto out;
    log_set_name("pagoda-run");
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            status = 0;
            goto out;
        }
        if (opt == '?') {
            usage(stderr);
            status = 2;
            goto out;
        }
        if ((rc = parse_flag(opt, optarg, &o, &prompts, &lens, &num_prompts)) != 0) {
            status = fail(rc) + 1;
            goto out;
        }
    }
    if (optind != argc || o.model == NULL || num_prompts == 0) {
        usage(stderr);
        status = 2;
        goto out;
    }
    if ((rc = sampling_params_validate(&o.sampling)) != 0) {
        status = fail(rc) + 1;
        goto out;
    }
    const int use_cuda = strcmp(o.backend, "cuda") == 0;
    const int random_weights = strcmp(o.load_format, "random") == 0;
#ifndef PAGODA_HAVE_CUDA
    if (use_cuda) {
        rc = pagoda_error_set(PAGODA_EUNSUPPORTED, "--backend cuda: this build has no CUDA "
                                                   "backend (configure with -DPAGODA_CUDA=ON)");
        goto fail;
    }
#endif
    if (random_weights && !use_cuda) {
        rc = pagoda_error_set(PAGODA_EUNSUPPORTED,
                              "--load-format random needs --backend cuda (the CPU backend "
                              "runs on checkpoints: make one with pagoda-mkmodel)");
        goto fail;
    }
    if (o.kv_dtype != DTYPE_BF16 && !use_cuda) {
        rc = pagoda_error_set(PAGODA_EUNSUPPORTED, "--kv-cache-dtype fp8 needs --backend cuda (the "
                                                   "CPU backend's pool is f32)");
        goto fail;
    }
    struct model_config cfg;
    if (random_weights) {
        if ((rc = model_config_load(o.model, &cfg)) != 0)
            goto fail;
    } else {
        if ((rc = model_weights_open(o.model, &w)) != 0)
            goto fail;
        cfg = w->config;
    }
    /* Its stop ids: the tokenizer's EOS too, as the group stops at it. */
    char note[640];
    if ((rc = model_config_add_tokenizer_eos(o.model, &cfg, note, sizeof(note))) != 0)
        goto fail;
    if (note[0] != '\0')
        fprintf(stderr, "pagoda-run: warning: %s: the tokenizer's EOS is not a stop id\n", note);
    const struct model_config *c = &cfg;
    if ((rc = prepare_stops(c, &o)) != 0)
        goto fail;

    /* Text prompts: the model folder's tokenizer, as the router encodes them. */
    for (int p = 0; p < num_prompts; p++) {
        if (o.texts[p] == NULL)
            continue;
        if (tm == NULL && (rc = text_model_open(o.model, &tm)) != 0)
            goto fail;
        TokenizerIds ids = {0};
        if ((rc = tokenizer_encode(text_model_tokenizer(tm), o.texts[p], strlen(o.texts[p]), true,
                                   &ids)) != 0) {
            tokenizer_ids_fini(&ids);
            goto fail;
        }
        if (ids.len == 0) {
            tokenizer_ids_fini(&ids);
            rc = pagoda_error_set(PAGODA_EINVAL, "prompt %d is empty once tokenized", p + 1);
            goto fail;
        }
        prompts[p] = ids.ids;
        lens[p] = ids.len;
    }

    /* Check the prompts and size the pool: each sequence's blocks, plus block 0. */
    seqs = calloc((size_t)num_prompts, sizeof(*seqs));
    if (seqs == NULL)
        goto fail_nomem;
    int64_t total_blocks = 1;
    int32_t max_blocks = 1;
    for (int p = 0; p < num_prompts; p++) {
        struct seq *s = &seqs[p];
        if ((int64_t)lens[p] >= c->max_position_embeddings) {
            rc = pagoda_error_set(PAGODA_ERANGE,
                                  "prompt %d has %zu tokens; the model has %lld positions and "
                                  "needs one for the first new token",
                                  p + 1, lens[p], (long long)c->max_position_embeddings);
            goto fail;
        }
        for (size_t j = 0; j < lens[p]; j++)
            if (prompts[p][j] >= c->vocab_size) {
                rc = pagoda_error_set(PAGODA_ERANGE,
                                      "prompt %d: token id %d is outside the vocabulary (size "
                                      "%lld)",
                                      p + 1, prompts[p][j], (long long)c->vocab_size);
                goto fail;
            }
        int64_t total = (int64_t)lens[p] + o.max_tokens;
        if (total > c->max_position_embeddings)
            total = c->max_position_embeddings;
        s->num_prompt = s->num_tokens = (int32_t)lens[p];
        s->max_total = (int32_t)total;
        s->num_blocks = (int32_t)((total + o.block_size - 1) / o.block_size);
        s->tokens = malloc((size_t)total * sizeof(int32_t));
        s->logprobs = malloc((size_t)o.max_tokens * sizeof(float));
        s->block_table = malloc((size_t)s->num_blocks * sizeof(int32_t));
        if (!s->tokens || !s->logprobs || !s->block_table)
            goto fail_nomem;
        memcpy(s->tokens, prompts[p], lens[p] * sizeof(int32_t));
        for (int32_t b = 0; b < s->num_blocks; b++)
            s->block_table[b] = (int32_t)total_blocks++;
        if (s->num_blocks > max_blocks)
            max_blocks = s->num_blocks;
    }
    if (total_blocks > INT32_MAX) {
        rc = pagoda_error_set(PAGODA_ERANGE, "the run needs more than 2^31 KV blocks");
        goto fail;
    }
    struct kv_geometry g = {
        .pool_id = 1,
        .num_layers = (int32_t)c->num_layers,
        .num_blocks = (int32_t)total_blocks,
        .block_size = o.block_size,
        .num_kv_heads = (int32_t)c->num_kv_heads,
        .head_dim = (int32_t)c->head_dim,
        .dtype = use_cuda ? o.kv_dtype : DTYPE_F32,
    };
    if ((rc = kv_geometry_validate(&g)) != 0)
        goto fail;
    struct backend_limits limits = {
        .max_num_tokens = o.max_batched_tokens,
        .max_num_seqs = num_prompts,
        .max_blocks_per_seq = max_blocks,
    };
    if (use_cuda) {
#ifdef PAGODA_HAVE_CUDA
        struct cuda_backend_options co = cuda_backend_default_options();
        co.limits = limits;
        co.cuda_graphs = o.cuda_graphs;
        co.pdl = o.cuda_pdl;
        if (!o.cuda_residual_gemm)
            co.residual_gemm_max_rows = 0;
        cuda_backend_set_tma(&co, o.cuda_tma);
        if ((rc = cuda_pool_alloc(&g, co.device, &gpu_pool)) != 0 ||
            (rc = cuda_backend_open(c, w, o.sampling.seed, &g, gpu_pool, &co, &be)) != 0)
            goto fail;
#endif
    } else {
        pool = calloc(1, kv_pool_bytes(&g));
        if (pool == NULL)
            goto fail_nomem;
        struct cpu_backend_options bo = cpu_backend_default_options();
        bo.attention = strcmp(o.attention, "gather") == 0 ? ATTN_CPU_GATHER : ATTN_CPU_PAGED;
        bo.limits = limits;
        if ((rc = cpu_backend_open(w, &g, pool, &bo, &be)) != 0)
            goto fail;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if ((rc = generate(be, c, seqs, num_prompts, o.block_size, max_blocks, &o)) != 0)
        goto fail;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    int failed = 0;
    for (int p = 0; p < num_prompts; p++) {
        print_result(&seqs[p], o.json, o.texts[p] ? text_model_tokenizer(tm) : NULL);
        if (seqs[p].error[0] != '\0') {
            fprintf(stderr, "pagoda-run: prompt %d failed: %s\n", p + 1, seqs[p].error);
            failed++;
        }
    }
    if (o.stats) {
        long long generated = 0;
        for (int p = 0; p < num_prompts; p++)
            generated += seqs[p].num_tokens - seqs[p].num_prompt;
        double secs = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-9;
        fprintf(stderr,
                "pagoda-run: %d prompts, %llu forward passes (%llu replayed a CUDA graph), %lld "
                "tokens generated in %.3f s (%.1f tokens/s)\n",
                num_prompts, (unsigned long long)backend_forward_count(be),
                (unsigned long long)backend_graph_steps(be), generated, secs,
                secs > 0 ? (double)generated / secs : 0.0);
    }
    status = failed > 0;
    goto out;
fail_nomem:
    rc = PAGODA_ENOMEM;
fail:
    status = fail(rc);
out:
    backend_close(be);
    free(pool);
#ifdef PAGODA_HAVE_CUDA
    cuda_pool_free(gpu_pool);
#endif
    if (seqs != NULL)
        for (int p = 0; p < num_prompts; p++) {
            free(seqs[p].tokens);
            free(seqs[p].logprobs);
            free(seqs[p].block_table);
        }
    free(seqs);
    for (int p = 0; p < num_prompts && prompts != NULL; p++)
        free(prompts[p]);
    free(prompts);
    free(lens);
    free(o.texts);
    free(o.stop_ids);
    logit_bias_fini(&o.bias_rest);
    text_model_close(tm);
    model_weights_close(w);
    return status;
}
