/* Integration tests of the prefix cache, chunked prefill and preemption on a real CPU group
 * (the scheduler's own tests drive it with a fake worker; these run the real model, so a hit
 * that served wrong KV, or a chunk boundary computed wrong, changes the tokens).
 *
 *   prefix_test BIN_DIR cache     tenants, a sharing group and a pinned prefix (tenants file):
 *                                 a repeated prompt is served from the cache with the same
 *                                 output, other tenants never hit, the group shares, the pin is
 *                                 hit by its readers from their first request
 *   prefix_test BIN_DIR chunked   a 3000-token prompt prefilled in chunks of a 256-token step
 *                                 budget beside 16 decoding requests: every output equals
 *                                 pagoda-run's (which computes each prompt in one pass)
 *   prefix_test BIN_DIR preempt   a pool too small for all requests at once: preemptions happen
 *                                 and every output equals pagoda-run's
 *   prefix_test BIN_DIR cache cuda  the cache scenario on the GPU (tests/gpu/run): a group of
 *                                 the Llama shape of group_use_cuda; bf16 results depend on the
 *                                 chunking, so outputs are compared up to the first position
 *                                 where the first one's top two logits are within GPU_MARGIN
 */
#include "group.h"

#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define VOCAB 512
#define BLOCK 16 /* the supervisor's default block size */
#define GPU_MARGIN 0.05f

static int expected_cached(size_t n_prompt)
{
    return (int)((n_prompt - 1) / BLOCK * BLOCK);
}

static pagoda_client *client_for(const struct group *g, const char *key)
{
    pagoda_client *c = NULL;
    if (pagoda_client_open(g->url, &c) != 0)
        return NULL;
    pagoda_client_set_timeout_ms(c, 120000);
    if (key != NULL && pagoda_client_set_api_key(c, key) != 0) {
        pagoda_client_close(c);
        return NULL;
    }
    return c;
}

/* Generates greedily; returns the result (caller frees) or a zeroed one with finish ERROR. */
static int generate(pagoda_client *c, const int32_t *prompt, size_t n, int32_t max_tokens,
                    pagoda_result *r)
{
    pagoda_generate_params p = group_greedy(max_tokens);
    memset(r, 0, sizeof(*r));
    int rc = pagoda_generate(c, &p, prompt, n, r);
    if (rc != 0)
        printf("generate: %s\n", pagoda_error_detail());
    return rc;
}

static const struct group *the_group;
static const int32_t *the_prompt;
static size_t the_prompt_len;

/* b's tokens equal a's (the first output for the_prompt); on the GPU, up to a's first near
 * tie. */
static bool same_tokens(const pagoda_result *a, const pagoda_result *b)
{
    if (a->num_tokens != b->num_tokens)
        return false;
    size_t first = 0;
    while (first < a->num_tokens && a->token_ids[first] == b->token_ids[first])
        first++;
    if (first == a->num_tokens)
        return true;
    if (!the_group->cuda)
        return false;
    long tie = group_first_near_tie(the_group, the_prompt, the_prompt_len, a->token_ids,
                                    a->num_tokens, GPU_MARGIN);
    printf("     outputs differ at %zu, the first's first near tie at %ld\n", first, tie);
    return tie >= 0 && first >= (size_t)tie;
}

static void set_prompt(const int32_t *p, size_t n)
{
    the_prompt = p;
    the_prompt_len = n;
}

/* ---- cache ---------------------------------------------------------------------------------- */

static int write_tenants(const struct group *g, const int32_t *sys, size_t n_sys, char *path,
                         size_t cap)
{
    snprintf(path, cap, "%s/tenants.json", g->tmp);
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return -1;
    fprintf(f, "{\"admin_keys\": [\"adm\"], \"groups\": [{\"name\": \"team\"}], \"tenants\": ["
               "{\"name\": \"alice\", \"api_keys\": [\"ka\"]},"
               "{\"name\": \"bob\", \"api_keys\": [\"kb\"]},"
               "{\"name\": \"carol\", \"api_keys\": [\"kc\"], \"group\": \"team\"},"
               "{\"name\": \"dave\", \"api_keys\": [\"kd\"], \"group\": \"team\"},"
               "{\"name\": \"erin\", \"api_keys\": [\"ke\"]}],"
               " \"pins\": [{\"name\": \"sys\", \"tenants\": [\"alice\"], \"token_ids\": [");
    for (size_t i = 0; i < n_sys; i++)
        fprintf(f, "%s%d", i ? ", " : "", (int)sys[i]);
    fprintf(f, "]}]}\n");
    return fclose(f) == 0 ? 0 : -1;
}

static void scenario_cache(struct group *g)
{
    int32_t sys[48];
    group_prompt(sys, 48, 777, VOCAB);
    char tenants[600];
    if (write_tenants(g, sys, 48, tenants, sizeof(tenants)) != 0) {
        CHECK(0, "write the tenants file");
        return;
    }
    const char *extra[] = {"--router-arg", "--tenants", "--router-arg", tenants, NULL};
    CHECK(group_start(g, extra) == 0, "group started with five tenants, a group and a pin");
    pagoda_client *alice = client_for(g, "ka"), *bob = client_for(g, "kb");
    pagoda_client *carol = client_for(g, "kc"), *dave = client_for(g, "kd");
    pagoda_client *erin = client_for(g, "ke");
    if (!alice || !bob || !carol || !dave || !erin) {
        CHECK(0, "clients");
        goto out;
    }
    /* A repeated prompt, at lengths around block boundaries. */
    static const size_t lens[] = {15, 16, 17, 40, 100};
    for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
        int32_t p[100];
        group_prompt(p, lens[i], 100 + (uint32_t)i, VOCAB);
        set_prompt(p, lens[i]);
        pagoda_result a, b;
        if (generate(alice, p, lens[i], 8, &a) != 0 || generate(alice, p, lens[i], 8, &b) != 0) {
            CHECK(0, "generate");
            pagoda_result_free(&a);
            continue;
        }
        CHECK(a.cached_tokens == 0 && (int)b.cached_tokens == expected_cached(lens[i]) &&
                  same_tokens(&a, &b),
              "a %zu-token prompt again: cached_tokens %u then %u (want 0 then %d), same output",
              lens[i], a.cached_tokens, b.cached_tokens, expected_cached(lens[i]));
        pagoda_result_free(&a);
        pagoda_result_free(&b);
    }
    /* Isolation: bob sends alice's prompts and never hits. */
    int bob_hits = 0, n_iso = 20;
    for (int i = 0; i < n_iso; i++) {
        int32_t p[40];
        group_prompt(p, 40, 5000 + (uint32_t)i, VOCAB);
        pagoda_result a, b;
        memset(&b, 0, sizeof(b));
        if (generate(alice, p, 40, 2, &a) == 0 && generate(bob, p, 40, 2, &b) == 0)
            bob_hits += b.cached_tokens != 0;
        else
            bob_hits++;
        pagoda_result_free(&a);
        pagoda_result_free(&b);
    }
    CHECK(bob_hits == 0, "bob sending alice's %d prompts: %d hits (want 0)", n_iso, bob_hits);
    /* The group shares; erin, outside it, does not. */
    int32_t q[50];
    group_prompt(q, 50, 31337, VOCAB);
    set_prompt(q, 50);
    pagoda_result rc_, rd, re;
    memset(&rd, 0, sizeof(rd));
    memset(&re, 0, sizeof(re));
    if (generate(carol, q, 50, 4, &rc_) == 0 && generate(dave, q, 50, 4, &rd) == 0 &&
        generate(erin, q, 50, 4, &re) == 0)
        CHECK(rd.cached_tokens == 48 && re.cached_tokens == 0 && same_tokens(&rc_, &rd) &&
                  same_tokens(&rc_, &re),
              "carol then dave (one group) then erin: dave cached %u (want 48), erin %u (want 0), "
              "same outputs",
              rd.cached_tokens, re.cached_tokens);
    else
        CHECK(0, "group requests");
    pagoda_result_free(&rc_);
    pagoda_result_free(&rd);
    pagoda_result_free(&re);
    /* The pin: alice hits it from her first request with that prefix; bob does not. */
    int32_t withsys[70];
    memcpy(withsys, sys, sizeof(sys));
    group_prompt(withsys + 48, 22, 4242, VOCAB);
    set_prompt(withsys, 70);
    pagoda_result pa, pb;
    memset(&pb, 0, sizeof(pb));
    if (generate(alice, withsys, 70, 4, &pa) == 0 && generate(bob, withsys, 70, 4, &pb) == 0)
        CHECK(pa.cached_tokens == 48 && pb.cached_tokens == 0 && same_tokens(&pa, &pb),
              "the pinned prefix: alice's first request cached %u (want 48), bob's %u (want 0), "
              "same outputs",
              pa.cached_tokens, pb.cached_tokens);
    else
        CHECK(0, "pin requests");
    pagoda_result_free(&pa);
    pagoda_result_free(&pb);
    /* The engine's Stats need the admin key; alice's key gets her own figures only. */
    pagoda_engine_stats st, own;
    pagoda_client *adm = client_for(g, "adm");
    if (adm != NULL && pagoda_stats(adm, &st) == 0 && pagoda_stats(alice, &own) == 0) {
        CHECK(st.tenant[0] == '\0' && st.prefix_hit_tokens > 0 &&
                  st.prefix_query_tokens > st.prefix_hit_tokens && st.prefix_hit_rate > 0 &&
                  st.prefix_hit_rate < 1 && st.pinned_blocks == 3 && st.cached_blocks > 3,
              "Stats: hit rate %.3f (%llu of %llu tokens), %u cached blocks, %u pinned",
              st.prefix_hit_rate, (unsigned long long)st.prefix_hit_tokens,
              (unsigned long long)st.prefix_query_tokens, st.cached_blocks, st.pinned_blocks);
        CHECK(strcmp(own.tenant, "alice") == 0 && own.prefix_hit_tokens > 0 &&
                  own.prefix_hit_tokens < st.prefix_hit_tokens &&
                  own.prefix_query_tokens < st.prefix_query_tokens && own.pinned_blocks == 0 &&
                  own.num_blocks == 0 && own.live_requests == 0 && own.finished_requests > 0,
              "alice's Stats are hers: tenant '%s', %llu of %llu tokens hit (the engine's: %llu "
              "of %llu), %u finished",
              own.tenant, (unsigned long long)own.prefix_hit_tokens,
              (unsigned long long)own.prefix_query_tokens, (unsigned long long)st.prefix_hit_tokens,
              (unsigned long long)st.prefix_query_tokens, own.finished_requests);
    } else {
        CHECK(0, "stats: %s", pagoda_error_detail());
    }
    pagoda_client_close(adm);
out:
    pagoda_client_close(alice);
    pagoda_client_close(bob);
    pagoda_client_close(carol);
    pagoda_client_close(dave);
    pagoda_client_close(erin);
    CHECK(group_stop(g) == 0, "the group stopped cleanly");
}

/* ---- chunked and preempt: many concurrent requests against pagoda-run ----------------------- */

struct job {
    const struct group *g;
    const int32_t *prompt;
    size_t n;
    int32_t max_tokens;
    pagoda_result res;
    int rc;
};

static void *run_job(void *arg)
{
    struct job *j = arg;
    pagoda_client *c = client_for(j->g, NULL);
    j->rc = c ? generate(c, j->prompt, j->n, j->max_tokens, &j->res) : -1;
    pagoda_client_close(c);
    return NULL;
}

/* Runs the prompts concurrently (the first one started after the others have begun when
 * first_late) and compares every output with pagoda-run's. Returns the failures. */
static int run_and_compare(struct group *g, int32_t **prompts, size_t *lens, int n,
                           const int32_t *max_tokens, bool first_late)
{
    struct job *jobs = calloc((size_t)n, sizeof(*jobs));
    pthread_t *th = calloc((size_t)n, sizeof(*th));
    int bad = 0;
    for (int i = first_late ? 1 : 0; i < n; i++) {
        jobs[i] =
            (struct job){.g = g, .prompt = prompts[i], .n = lens[i], .max_tokens = max_tokens[i]};
        pthread_create(&th[i], NULL, run_job, &jobs[i]);
    }
    if (first_late) {
        usleep(300000); /* the others are decoding */
        jobs[0] =
            (struct job){.g = g, .prompt = prompts[0], .n = lens[0], .max_tokens = max_tokens[0]};
        pthread_create(&th[0], NULL, run_job, &jobs[0]);
    }
    for (int i = 0; i < n; i++)
        pthread_join(th[i], NULL);
    /* pagoda-run once per distinct max_tokens, all those prompts in one batch (the CPU backend
     * gives every prompt the same tokens in any batch). */
    int32_t **want = calloc((size_t)n, sizeof(*want));
    size_t *want_len = calloc((size_t)n, sizeof(*want_len));
    int32_t **batch = calloc((size_t)n, sizeof(*batch));
    size_t *batch_lens = calloc((size_t)n, sizeof(*batch_lens));
    int32_t **batch_out = calloc((size_t)n, sizeof(*batch_out));
    size_t *batch_out_len = calloc((size_t)n, sizeof(*batch_out_len));
    int *idx = calloc((size_t)n, sizeof(*idx));
    for (int i = 0; i < n; i++) {
        if (want[i] != NULL)
            continue;
        int k = 0;
        for (int j = i; j < n; j++) {
            if (want[j] == NULL && max_tokens[j] == max_tokens[i]) {
                batch[k] = prompts[j];
                batch_lens[k] = lens[j];
                idx[k++] = j;
            }
        }
        if (group_expected(g, batch, batch_lens, k, max_tokens[i], batch_out, batch_out_len) != 0) {
            printf("pagoda-run failed\n");
            bad = n;
            break;
        }
        for (int m = 0; m < k; m++) {
            want[idx[m]] = batch_out[m];
            want_len[idx[m]] = batch_out_len[m];
        }
    }
    for (int i = 0; i < n; i++) {
        if (jobs[i].rc != 0 || want[i] == NULL || want_len[i] != jobs[i].res.num_tokens ||
            memcmp(want[i], jobs[i].res.token_ids, want_len[i] * sizeof(int32_t)) != 0) {
            printf("request %d (%zu prompt tokens): differs from pagoda-run\n", i, lens[i]);
            bad++;
        }
        free(want[i]);
        pagoda_result_free(&jobs[i].res);
    }
    free(want);
    free(want_len);
    free(batch);
    free(batch_lens);
    free(batch_out);
    free(batch_out_len);
    free(idx);
    free(jobs);
    free(th);
    return bad;
}

static void scenario_chunked(struct group *g)
{
    /* A model with room for 3000 tokens and more. */
    char prog[2400];
    snprintf(prog, sizeof(prog),
             "%s/pagoda-mkmodel --preset tiny --seed 3 --max-positions 4096 --out %s --force "
             ">/dev/null",
             g->bin_dir, g->model);
    if (system(prog) != 0) {
        CHECK(0, "make a model of 4096 positions");
        return;
    }
    const char *extra[] = {"--scheduler-arg",
                           "--max-batched-tokens",
                           "--scheduler-arg",
                           "256",
                           "--scheduler-arg",
                           "--max-seqs",
                           "--scheduler-arg",
                           "32",
                           NULL};
    CHECK(group_start(g, extra) == 0, "group started with 256 tokens a step");
    enum { N = 17 };
    int32_t *prompts[N];
    size_t lens[N];
    int32_t max_tokens[N];
    lens[0] = 3000;
    max_tokens[0] = 8;
    for (int i = 1; i < N; i++) {
        lens[i] = 10 + (size_t)i;
        max_tokens[i] = 120;
    }
    for (int i = 0; i < N; i++) {
        prompts[i] = malloc(lens[i] * sizeof(int32_t));
        group_prompt(prompts[i], lens[i], 900 + (uint32_t)i, VOCAB);
    }
    pagoda_client *c = client_for(g, NULL);
    pagoda_engine_stats before, after;
    int ok = c && pagoda_stats(c, &before) == 0;
    int bad = run_and_compare(g, prompts, lens, N, max_tokens, true);
    ok = ok && pagoda_stats(c, &after) == 0;
    CHECK(bad == 0,
          "a 3000-token prompt beside 16 decoding requests: %d of %d differ from "
          "pagoda-run",
          bad, N);
    CHECK(ok && after.steps - before.steps >= 3000 / 256,
          "the long prompt took %llu steps or more (at most 256 tokens each)",
          ok ? (unsigned long long)(after.steps - before.steps) : 0ull);
    pagoda_client_close(c);
    for (int i = 0; i < N; i++)
        free(prompts[i]);
    CHECK(group_stop(g) == 0, "the group stopped cleanly");
}

static void scenario_preempt(struct group *g)
{
    g->kv_blocks = 1 + 40; /* 640 token slots; the eight need 8 x 10 blocks */
    const char *extra[] = {"--scheduler-arg", "--prefix-cache", "--scheduler-arg", "on", NULL};
    CHECK(group_start(g, extra) == 0, "group started with 40 blocks");
    enum { N = 8 };
    int32_t *prompts[N];
    size_t lens[N];
    int32_t max_tokens[N];
    for (int i = 0; i < N; i++) {
        lens[i] = 60;
        max_tokens[i] = 90;
        prompts[i] = malloc(lens[i] * sizeof(int32_t));
        group_prompt(prompts[i], lens[i], 300 + (uint32_t)i, VOCAB);
    }
    int bad = run_and_compare(g, prompts, lens, N, max_tokens, false);
    pagoda_client *c = client_for(g, NULL);
    pagoda_engine_stats st;
    int ok = c && pagoda_stats(c, &st) == 0;
    CHECK(bad == 0, "8 requests in a pool too small for them at once: %d differ from pagoda-run",
          bad);
    CHECK(ok && st.preemptions > 0, "preemptions: %llu (want > 0)",
          ok ? (unsigned long long)st.preemptions : 0ull);
    pagoda_client_close(c);
    for (int i = 0; i < N; i++)
        free(prompts[i]);
    CHECK(group_stop(g) == 0, "the group stopped cleanly");
}

int main(int argc, char **argv)
{
    if (argc != 3 &&
        !(argc == 4 && strcmp(argv[2], "cache") == 0 && strcmp(argv[3], "cuda") == 0)) {
        fprintf(stderr,
                "usage: prefix_test BIN_DIR cache|chunked|preempt, or BIN_DIR cache cuda\n");
        return 2;
    }
    struct group g;
    int rc = group_setup(&g, argv[1], argc == 4);
    if (rc != 0)
        return rc;
    the_group = &g;
    if (strcmp(argv[2], "cache") == 0)
        scenario_cache(&g);
    else if (strcmp(argv[2], "chunked") == 0)
        scenario_chunked(&g);
    else if (strcmp(argv[2], "preempt") == 0)
        scenario_preempt(&g);
    else
        printf("unknown scenario %s\n", argv[2]);
    return group_finish(&g);
}
