/* The engine's own cost: a group whose worker runs the null backend (tokens at once, no model),
 * 256 requests running together, each generating --tokens tokens. Reports the step round trip
 * (wall time per step: scheduler -> worker -> scheduler through NNG and protobuf, plus the
 * router's events) and the scheduler's CPU time per step (its own figure). Not a test.
 *
 * usage: engine_bench BIN_DIR [NUM_REQUESTS] [TOKENS] */
#include "tests/integration/group.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct req {
    pagoda_client *client;
    int32_t prompt[16];
    int32_t max_tokens;
    int rc;
    size_t got;
};

static void *run(void *arg)
{
    struct req *r = arg;
    pagoda_generate_params p = group_greedy(r->max_tokens);
    pagoda_result res = {0};
    r->rc = pagoda_generate(r->client, &p, r->prompt, 16, &res);
    r->got = res.num_tokens;
    pagoda_result_free(&res);
    return NULL;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: engine_bench BIN_DIR [NUM_REQUESTS] [TOKENS]\n");
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 256;
    int tokens = argc > 3 ? atoi(argv[3]) : 200;
    if (n < 1 || n > 1024 || tokens < 2) {
        fprintf(stderr, "engine_bench: 1..1024 requests of at least 2 tokens\n");
        return 2;
    }
    struct group g;
    if (group_prepare(&g, argv[1]) != 0)
        return 1;
    g.kv_blocks = n * ((16 + tokens) / 16 + 2) + 16;
    const char *extra[] = {"--worker-arg",
                           "--backend",
                           "--worker-arg",
                           "null",
                           "--scheduler-arg",
                           "--max-seqs",
                           "--scheduler-arg",
                           "1024",
                           "--scheduler-arg",
                           "--max-batched-tokens",
                           "--scheduler-arg",
                           "16384",
                           "--worker-arg",
                           "--max-seqs",
                           "--worker-arg",
                           "1024",
                           "--worker-arg",
                           "--max-batched-tokens",
                           "--worker-arg",
                           "16384",
                           NULL};
    if (group_start(&g, extra) != 0) {
        fprintf(stderr, "engine_bench: the group did not start (see %s)\n", g.tmp);
        group_cleanup(&g);
        return 1;
    }
    pagoda_client *c;
    pagoda_client_open(g.url, &c);
    pagoda_client_set_timeout_ms(c, 300000);
    pagoda_engine_stats before, after;
    pagoda_stats(c, &before);
    struct req *reqs = calloc((size_t)n, sizeof(*reqs));
    pthread_t *th = calloc((size_t)n, sizeof(*th));
    double t0 = now_s();
    for (int i = 0; i < n; i++) {
        reqs[i].client = c;
        reqs[i].max_tokens = tokens;
        group_prompt(reqs[i].prompt, 16, (uint32_t)i + 1, 512);
        pthread_create(&th[i], NULL, run, &reqs[i]);
    }
    int ok = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        ok += reqs[i].rc == 0 && reqs[i].got == (size_t)tokens;
    }
    double wall = now_s() - t0;
    pagoda_stats(c, &after);
    uint64_t steps = after.steps - before.steps;
    printf("| requests | tokens each | completed | steps | peak running | wall s | "
           "step round trip us | scheduler CPU us/step |\n|---|---|---|---|---|---|---|---|\n");
    printf("| %d | %d | %d | %llu | %u | %.2f | %.1f | %.1f |\n", n, tokens, ok,
           (unsigned long long)steps, after.peak_running, wall,
           steps ? wall * 1e6 / (double)steps : 0.0, after.step_cpu_us);
    pagoda_client_close(c);
    group_cleanup(&g);
    free(reqs);
    free(th);
    return ok == n ? 0 : 1;
}
