#include "tests/integration/group.h"

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
    for (int i = 0; extra != NULL && extra[i] != NULL && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    char log[700];
    snprintf(log, sizeof(log), "%s/supervisor.log", g->tmp);
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
    const char *scale = getenv("PAGODA_TEST_TIME_SCALE");
    int tries = 600 * (scale && atoi(scale) > 1 ? atoi(scale) : 1);
    for (int i = 0; i < tries; i++) {
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
    char **argv = calloc((size_t)(2 * num_prompts + 14), sizeof(char *));
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
    snprintf(seed_text, sizeof(seed_text), "%llu", (unsigned long long)seed);
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
