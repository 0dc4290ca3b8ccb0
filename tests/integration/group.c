#include "tests/integration/group.h"

#include "common/dtype.h"
#include "common/error.h"

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int group_passed, group_failed;

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Runs argv to completion; stdout to out_path when not NULL. Returns the exit status or -1. */
static int run_cmd(char *const argv[], const char *out_path)
{
    fflush(NULL); /* a child must not inherit and repeat buffered output */
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        if (out_path != NULL && freopen(out_path, "w", stdout) == NULL)
            _exit(127);
        execv(argv[0], argv);
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int group_prepare(struct group *g, const char *bin_dir)
{
    memset(g, 0, sizeof(*g));
    snprintf(g->bin_dir, sizeof(g->bin_dir), "%s", bin_dir);
    snprintf(g->tmp, sizeof(g->tmp), "/tmp/pagoda-itest-XXXXXX");
    if (mkdtemp(g->tmp) == NULL)
        return -1;
    snprintf(g->run_dir, sizeof(g->run_dir), "%s/run", g->tmp);
    snprintf(g->model, sizeof(g->model), "%s/tiny", g->tmp);
    snprintf(g->url, sizeof(g->url), "ipc://%s/client.ipc", g->tmp);
    g->kv_blocks = 2048;
    char prog[1100];
    snprintf(prog, sizeof(prog), "%s/pagoda-mkmodel", bin_dir);
    char *argv[] = {prog, "--preset", "tiny", "--seed", "3", "--out", g->model, NULL};
    return run_cmd(argv, "/dev/null") == 0 ? 0 : -1;
}

int group_start(struct group *g, const char *const *extra)
{
    char prog[1100], blocks[16];
    snprintf(prog, sizeof(prog), "%s/pagoda-supervisor", g->bin_dir);
    snprintf(blocks, sizeof(blocks), "%d", g->kv_blocks);
    const char *argv[64] = {prog,      "--run-dir",   g->run_dir, "--bin-dir", g->bin_dir,
                            "--model", g->model,      "--listen", g->url,      "--kv-blocks",
                            blocks,    "--log-level", "warn"};
    int n = 13;
    char seed[24];
    if (g->cuda) {
        snprintf(seed, sizeof(seed), "%llu", (unsigned long long)g->weight_seed);
        const char *gpu[] = {"--backend",    "cuda",
                             "--worker-arg", "--load-format",
                             "--worker-arg", "random",
                             "--worker-arg", "--seed",
                             "--worker-arg", seed,
                             "--kvpool-arg", "--kv-cache-dtype",
                             "--kvpool-arg", g->kv_cache_dtype};
        for (size_t i = 0; i < sizeof(gpu) / sizeof(gpu[0]); i++)
            argv[n++] = gpu[i];
    }
    /* The supervisor's liveness check scales like every other wait (a sanitizer build's loops
     * turn slower); a test's own --heartbeat-ms, later among the flags, wins. */
    char heartbeat[24];
    snprintf(heartbeat, sizeof(heartbeat), "%ld", 1000 * group_time_scale());
    argv[n++] = "--heartbeat-ms";
    argv[n++] = heartbeat;
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    char log[700];
    snprintf(log, sizeof(log), "%s/supervisor.log", g->tmp);
    fflush(NULL);
    g->supervisor = fork();
    if (g->supervisor < 0)
        return -1;
    if (g->supervisor == 0) {
        /* If the test dies (a CTest timeout), the supervisor drains the group. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (freopen(log, "w", stderr) == NULL || freopen(log, "a", stdout) == NULL)
            _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    char ready[700];
    snprintf(ready, sizeof(ready), "%s/ready", g->run_dir);
    long tries = 600 * group_time_scale();
    for (long i = 0; i < tries; i++) {
        if (access(ready, F_OK) == 0)
            return 0;
        int status;
        if (waitpid(g->supervisor, &status, WNOHANG) == g->supervisor) {
            g->supervisor = 0;
            return -1;
        }
        sleep_ms(100);
    }
    return -1;
}

int group_stop(struct group *g)
{
    if (g->supervisor <= 0)
        return -1;
    kill(g->supervisor, SIGTERM);
    int status = 0;
    for (int i = 0; i < 600; i++) {
        if (waitpid(g->supervisor, &status, WNOHANG) == g->supervisor) {
            g->supervisor = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        sleep_ms(100);
    }
    kill(g->supervisor, SIGKILL);
    waitpid(g->supervisor, &status, 0);
    g->supervisor = 0;
    return -1;
}

void group_cleanup(struct group *g)
{
    if (g->supervisor > 0)
        group_stop(g);
    if (getenv("PAGODA_KEEP_TEST_DIR") != NULL) {
        printf("kept %s\n", g->tmp);
        return;
    }
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g->tmp);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", g->tmp);
}

pid_t group_worker_pid(const struct group *g)
{
    return group_program_pid(g, "pagoda-worker");
}

pid_t group_program_pid(const struct group *g, const char *program)
{
    DIR *d = opendir("/proc");
    if (d == NULL)
        return -1;
    struct dirent *e;
    pid_t found = -1;
    while ((e = readdir(d)) != NULL && found < 0) {
        char path[300], buf[4096];
        if (e->d_name[0] < '0' || e->d_name[0] > '9')
            continue;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", e->d_name);
        FILE *f = fopen(path, "r");
        if (f == NULL)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[n] = '\0';
        /* argv[0] ends in the program's name and some argument is our run dir. */
        const char *base = strrchr(buf, '/');
        if (strcmp(base ? base + 1 : buf, program) != 0)
            continue;
        for (size_t i = 0; i < n; i += strlen(buf + i) + 1)
            if (strcmp(buf + i, g->run_dir) == 0)
                found = (pid_t)atoi(e->d_name);
    }
    closedir(d);
    return found;
}

void group_prompt(int32_t *out, size_t n, uint32_t seed, int32_t vocab)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        out[i] = (int32_t)(x % (uint32_t)vocab);
    }
}

int group_expected(const struct group *g, int32_t *const *prompts, const size_t *lens,
                   int num_prompts, int32_t max_tokens, int32_t **out, size_t *out_len)
{
    return group_expected_sampled(g, prompts, lens, num_prompts, max_tokens, 0.0f, 0, out, out_len);
}

int group_expected_sampled(const struct group *g, int32_t *const *prompts, const size_t *lens,
                           int num_prompts, int32_t max_tokens, float temperature, uint64_t seed,
                           int32_t **out, size_t *out_len)
{
    char prog[1100], max[16], json_path[700], temp[32], seed_text[32];
    snprintf(prog, sizeof(prog), "%s/pagoda-run", g->bin_dir);
    snprintf(max, sizeof(max), "%d", max_tokens);
    snprintf(json_path, sizeof(json_path), "%s/expected.json", g->tmp);
    if (g->cuda && temperature > 0)
        return -1; /* pagoda-run's --seed is the weight seed there */
    char **argv = calloc((size_t)(2 * num_prompts + 20), sizeof(char *));
    char **lists = calloc((size_t)num_prompts, sizeof(char *));
    int n = 0, rc = -1;
    argv[n++] = prog;
    argv[n++] = "--model";
    argv[n++] = (char *)g->model;
    argv[n++] = "--max-tokens";
    argv[n++] = max;
    argv[n++] = "--ignore-eos";
    argv[n++] = "--json";
    snprintf(temp, sizeof(temp), "%.9g", (double)temperature);
    snprintf(seed_text, sizeof(seed_text), "%llu",
             (unsigned long long)(g->cuda ? g->weight_seed : seed));
    if (g->cuda) {
        argv[n++] = "--backend";
        argv[n++] = "cuda";
        argv[n++] = "--load-format";
        argv[n++] = "random";
        argv[n++] = "--kv-cache-dtype";
        argv[n++] = (char *)g->kv_cache_dtype;
    }
    argv[n++] = "--temperature";
    argv[n++] = temp;
    argv[n++] = "--seed";
    argv[n++] = seed_text;
    for (int p = 0; p < num_prompts; p++) {
        lists[p] = malloc(lens[p] * 12 + 1);
        size_t pos = 0;
        for (size_t i = 0; i < lens[p]; i++)
            pos += (size_t)sprintf(lists[p] + pos, "%s%d", i ? "," : "", prompts[p][i]);
        argv[n++] = "--tokens";
        argv[n++] = lists[p];
    }
    argv[n] = NULL;
    if (run_cmd(argv, json_path) == 0) {
        FILE *f = fopen(json_path, "r");
        char line[1 << 16];
        int p = 0;
        while (f != NULL && p < num_prompts && fgets(line, sizeof(line), f) != NULL) {
            json_error_t err;
            json_t *o = json_loads(line, 0, &err);
            json_t *toks = json_object_get(o, "token_ids");
            out_len[p] = json_array_size(toks);
            out[p] = malloc((out_len[p] + 1) * sizeof(int32_t));
            for (size_t i = 0; i < out_len[p]; i++)
                out[p][i] = (int32_t)json_integer_value(json_array_get(toks, i));
            json_decref(o);
            p++;
        }
        if (f != NULL)
            fclose(f);
        rc = p == num_prompts ? 0 : -1;
    }
    for (int p = 0; p < num_prompts; p++)
        free(lists[p]);
    free(lists);
    free(argv);
    return rc;
}

pagoda_generate_params group_greedy(int32_t max_tokens)
{
    pagoda_generate_params p = pagoda_generate_params_default();
    p.temperature = 0.0f;
    p.max_tokens = max_tokens;
    p.ignore_eos = 1;
    return p;
}

Pagoda__ClientResponse *group_raw_call(const struct group *g, const void *bytes, size_t len,
                                       uint32_t timeout_ms)
{
    nng_socket s;
    if (nng_req0_open(&s) != 0)
        return NULL;
    nng_duration t = (nng_duration)timeout_ms;
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, t);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, t);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, 2 * t);
    Pagoda__ClientResponse *resp = NULL;
    nng_msg *m = NULL;
    if (nng_dial(s, g->url, NULL, 0) == 0 && nng_send(s, (void *)bytes, len, 0) == 0 &&
        nng_recvmsg(s, &m, 0) == 0) {
        resp = pagoda__client_response__unpack(NULL, nng_msg_len(m), nng_msg_body(m));
        nng_msg_free(m);
    }
    nng_close(s);
    return resp;
}

/* The Llama shape of tests/gpu/run's llama-4l, about 2.3 GB of bf16 weights. */
static const char gpu_model_config[] =
    "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\",\n"
    " \"vocab_size\": 32000, \"hidden_size\": 4096, \"intermediate_size\": 14336,\n"
    " \"num_hidden_layers\": 4, \"num_attention_heads\": 32, \"num_key_value_heads\": 8,\n"
    " \"head_dim\": 128, \"max_position_embeddings\": 4096, \"rms_norm_eps\": 1e-05,\n"
    " \"rope_theta\": 500000.0, \"tie_word_embeddings\": false, \"attention_bias\": false,\n"
    " \"bos_token_id\": 1, \"eos_token_id\": 2, \"torch_dtype\": \"bfloat16\"}\n";

int group_use_cuda(struct group *g)
{
    /* A build with CUDA names the backend in the worker's usage; a machine with an NVIDIA GPU
     * has its device files. */
    char cmd[1200], line[512];
    snprintf(cmd, sizeof(cmd), "'%s/pagoda-worker' --help 2>&1", g->bin_dir);
    FILE *p = popen(cmd, "r");
    int has_cuda = 0;
    while (p != NULL && fgets(line, sizeof(line), p) != NULL)
        has_cuda |= strstr(line, "cpu|cuda") != NULL;
    if (p != NULL)
        pclose(p);
    if (!has_cuda) {
        printf("SKIP: %s/pagoda-worker has no CUDA backend (a build without CUDA)\n", g->bin_dir);
        return 77;
    }
    if (access("/dev/nvidiactl", F_OK) != 0 && access("/dev/nvidia0", F_OK) != 0) {
        printf("SKIP: no CUDA device here (GPU tests run on the GPU machine: tests/gpu/run)\n");
        return 77;
    }
    snprintf(g->model, sizeof(g->model), "%s/llama-4l", g->tmp);
    if (mkdir(g->model, 0700) != 0)
        return -1;
    char path[700];
    snprintf(path, sizeof(path), "%s/config.json", g->model);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    int ok = fputs(gpu_model_config, f) >= 0;
    if (fclose(f) != 0 || !ok)
        return -1;
    g->cuda = 1;
    g->weight_seed = 7;
    /* Spelled as --kv-cache-dtype (its one parser); anything else ends the test. */
    const char *kv = getenv("PAGODA_TEST_KV_CACHE_DTYPE");
    enum dtype kv_dtype = DTYPE_BF16;
    if (kv != NULL && kv[0] != '\0' &&
        dtype_from_kv_cache_name("PAGODA_TEST_KV_CACHE_DTYPE", kv, DTYPE_BF16, &kv_dtype) != 0) {
        fprintf(stderr, "%s\n", pagoda_error_detail());
        return -1;
    }
    g->kv_cache_dtype = kv_dtype == DTYPE_F8E4M3 ? "fp8" : "auto";
    if (strcmp(g->kv_cache_dtype, "auto") != 0)
        printf("     the K/V in 8-bit pools (PAGODA_TEST_KV_CACHE_DTYPE=fp8)\n");
    return 0;
}

long group_first_near_tie(const struct group *g, const int32_t *prompt, size_t n,
                          const int32_t *want, size_t want_len, float margin)
{
    if (n == 0 || want_len == 0)
        return (long)want_len;
    /* The prompt and every output token but the last: the logits of row n - 1 + j chose
     * want[j]. */
    size_t rows = n + want_len - 1;
    char *list = malloc(rows * 12 + 1);
    if (list == NULL)
        return -1;
    size_t pos = 0;
    for (size_t i = 0; i < rows; i++)
        pos += (size_t)sprintf(list + pos, "%s%d", i ? "," : "", i < n ? prompt[i] : want[i - n]);
    char prog[1100], out[700], seed[24];
    snprintf(prog, sizeof(prog), "%s/pagoda-logits", g->bin_dir);
    snprintf(out, sizeof(out), "%s/logits.f32", g->tmp);
    snprintf(seed, sizeof(seed), "%llu", (unsigned long long)g->weight_seed);
    char *argv[] = {prog,
                    "--model",
                    (char *)g->model,
                    "--backend",
                    "cuda",
                    "--tokens",
                    list,
                    "--out",
                    out,
                    "--load-format",
                    "random",
                    "--seed",
                    seed,
                    "--kv-cache-dtype",
                    (char *)g->kv_cache_dtype,
                    NULL};
    int rc = run_cmd(argv, "/dev/null");
    free(list);
    if (rc != 0)
        return -1;
    FILE *f = fopen(out, "rb");
    if (f == NULL)
        return -1;
    fseek(f, 0, SEEK_END);
    long bytes = ftell(f);
    fseek(f, 0, SEEK_SET);
    size_t vocab = bytes > 0 ? (size_t)bytes / sizeof(float) / rows : 0;
    float *row = vocab > 1 ? malloc(vocab * sizeof(float)) : NULL;
    long tie = -1;
    if (row != NULL && fseek(f, (long)((n - 1) * vocab * sizeof(float)), SEEK_SET) == 0) {
        tie = (long)want_len;
        for (size_t j = 0; j < want_len; j++) {
            if (fread(row, sizeof(float), vocab, f) != vocab) {
                tie = -1;
                break;
            }
            float top1 = row[0] > row[1] ? row[0] : row[1],
                  top2 = row[0] > row[1] ? row[1] : row[0];
            for (size_t v = 2; v < vocab; v++) {
                if (row[v] > top1) {
                    top2 = top1;
                    top1 = row[v];
                } else if (row[v] > top2) {
                    top2 = row[v];
                }
            }
            if (top1 - top2 < margin) {
                tie = (long)j;
                break;
            }
        }
    }
    free(row);
    fclose(f);
    return tie;
}

int group_setup(struct group *g, const char *bin_dir, int cuda)
{
    signal(SIGPIPE, SIG_IGN);
    if (group_prepare(g, bin_dir) != 0) {
        printf("cannot make the model\n");
        return 1;
    }
    int gpu = cuda ? group_use_cuda(g) : 0;
    if (gpu != 0) {
        group_cleanup(g);
        if (gpu != 77)
            printf("cannot set up the GPU model\n");
        return gpu == 77 ? 77 : 1;
    }
    return 0;
}

int group_finish(struct group *g)
{
    if (group_failed > 0) {
        char cmd[700];
        snprintf(cmd, sizeof(cmd), "tail -n 20 %s/supervisor.log %s/run/*.log 2>/dev/null", g->tmp,
                 g->tmp);
        if (system(cmd) != 0)
            printf("(no logs)\n");
    }
    group_cleanup(g);
    printf("%d passed, %d failed\n", group_passed, group_failed);
    return group_failed == 0 && group_passed > 0 ? 0 : 1;
}

static long scale_from_env(const char *name)
{
    const char *s = getenv(name);
    long v = s ? atol(s) : 1;
    return v >= 1 ? v : 1;
}

long group_time_scale(void)
{
    return scale_from_env("PAGODA_TEST_TIME_SCALE");
}

long group_detect_scale(void)
{
    return scale_from_env("PAGODA_TEST_DETECT_SCALE");
}

static const char *scaled_ms(long value)
{
    static char bufs[16][24];
    static int next;
    char *b = bufs[next++ % 16];
    snprintf(b, sizeof(bufs[0]), "%ld", value);
    return b;
}

const char *group_ms(long value)
{
    return scaled_ms(value * group_time_scale());
}

const char *group_detect_ms(long value)
{
    return scaled_ms(value * group_detect_scale());
}
