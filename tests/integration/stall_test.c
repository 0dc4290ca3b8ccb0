/* Integration test: one request never stalls others (tiny model on the CPU).
 *
 *   stall_test BIN_DIR poison     the model's embedding row of one token is NaN, so a request
 *                                 holding that token has NaN logits: it ends with an error
 *                                 while another tenant's requests, in the same steps, complete
 *                                 with pagoda-run's tokens; a repetition_penalty of 1e-45 is
 *                                 refused at the front; no step is refused.
 *   stall_test BIN_DIR nan-model  every weight of the final norm is NaN: each request is answered
 *                                 with an error, health and stats still answer, and the
 *                                 scheduler's log holds no refusal loop.
 *
 * The model is patched in place: the safetensors header (8-byte length, JSON) gives the
 * tensor's offsets, and NaN (bf16 0x7fc0) is written over the chosen elements. */
#include "tests/integration/group.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define VOCAB 512
#define HIDDEN 256
#define MAX_TOKENS 8
#define PROMPT_LEN 10
#define GOOD 3
/* Polls of 500 ms before a request counts as stalled (times the sanitizers' scale). */
#define POLLS 120

/* Writes NaN over count bf16 elements of tensor name, from element first, in model/
 * model.safetensors. Returns 0 or -1. */
static int poison_tensor(const char *model, const char *name, size_t first, size_t count)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/model.safetensors", model);
    FILE *f = fopen(path, "r+b");
    if (f == NULL)
        return -1;
    uint8_t len_bytes[8];
    int rc = -1;
    json_t *header = NULL;
    char *text = NULL;
    if (fread(len_bytes, 1, 8, f) != 8)
        goto out;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | len_bytes[i];
    if (n > (1u << 24) || (text = calloc(1, (size_t)n + 1)) == NULL ||
        fread(text, 1, (size_t)n, f) != n)
        goto out;
    json_error_t err;
    header = json_loads(text, 0, &err);
    json_t *t = json_object_get(header, name);
    json_t *offsets = json_object_get(t, "data_offsets");
    const char *dtype = json_string_value(json_object_get(t, "dtype"));
    if (offsets == NULL || dtype == NULL || strcmp(dtype, "BF16") != 0)
        goto out;
    uint64_t begin = (uint64_t)json_integer_value(json_array_get(offsets, 0));
    uint64_t end = (uint64_t)json_integer_value(json_array_get(offsets, 1));
    if (begin + 2 * (first + count) > end ||
        fseek(f, (long)(8 + n + begin + 2 * first), SEEK_SET) != 0)
        goto out;
    static const uint8_t nan_bf16[2] = {0xc0, 0x7f};
    for (size_t i = 0; i < count; i++)
        if (fwrite(nan_bf16, 1, 2, f) != 2)
            goto out;
    rc = 0;
out:
    json_decref(header);
    free(text);
    if (fclose(f) != 0)
        rc = -1;
    return rc;
}

static pagoda_client *open_client(const struct group *g, const char *key)
{
    pagoda_client *c = NULL;
    if (pagoda_client_open(g->url, &c) != 0)
        return NULL;
    pagoda_client_set_timeout_ms(c, (uint32_t)(30000 * group_time_scale()));
    if (key != NULL && pagoda_client_set_api_key(c, key) != 0) {
        pagoda_client_close(c);
        return NULL;
    }
    return c;
}

/* Polls request id until it ends (at most POLLS * scale polls of 500 ms), gathering every token
 * into *out (the caller frees out->token_ids and out->error_message with pagoda_result_free).
 * Returns 0 when it ended, -1 when it did not (stalled) or a poll failed. */
static int wait_end(pagoda_client *c, const uint8_t *id, pagoda_result *out)
{
    memset(out, 0, sizeof(*out));
    int32_t tokens[MAX_TOKENS * 2];
    size_t have = 0;
    for (long i = 0; i < POLLS * group_time_scale(); i++) {
        pagoda_result r = {0};
        if (pagoda_poll(c, id, (uint32_t)have, 500, &r) != 0)
            return -1;
        for (size_t k = 0; k < r.num_tokens && have < MAX_TOKENS * 2; k++)
            tokens[have++] = r.token_ids[k];
        if (r.finish_reason != PAGODA_FINISH_NONE) {
            *out = r;
            free(out->token_ids);
            out->token_ids = malloc((have + 1) * sizeof(int32_t));
            if (out->token_ids == NULL)
                return -1;
            memcpy(out->token_ids, tokens, have * sizeof(int32_t));
            out->num_tokens = have;
            free(out->logprobs);
            out->logprobs = NULL;
            return 0;
        }
        pagoda_result_free(&r);
    }
    return -1;
}

/* Lines of the group's program log (run/<name>.log) holding what, or -1. */
static long count_log_lines(const struct group *g, const char *name, const char *what)
{
    char path[700], line[2048];
    snprintf(path, sizeof(path), "%s/%s.log", g->run_dir, name);
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    long n = 0;
    while (fgets(line, sizeof(line), f) != NULL)
        n += strstr(line, what) != NULL;
    fclose(f);
    return n;
}

static long log_bytes(const struct group *g, const char *name)
{
    char path[700];
    snprintf(path, sizeof(path), "%s/%s.log", g->run_dir, name);
    struct stat st;
    return stat(path, &st) == 0 ? (long)st.st_size : -1;
}

static int holds(const int32_t *t, size_t n, int32_t token)
{
    for (size_t i = 0; i < n; i++)
        if (t[i] == token)
            return 1;
    return 0;
}

static const char tenants_json[] = "{\"tenants\": ["
                                   "{\"name\": \"alice\", \"api_keys\": [\"alice-key\"]},"
                                   "{\"name\": \"bob\", \"api_keys\": [\"bob-key\"]}"
                                   "]}";

static void scenario_poison(struct group *g)
{
    /* Alice's prompts and their tokens on the clean model; the poisoned token is one that none
     * of them holds, so poisoning it changes nothing for her. */
    int32_t prompts[GOOD][PROMPT_LEN];
    int32_t *pp[GOOD];
    size_t lens[GOOD];
    int32_t *want[GOOD] = {0}, *again[GOOD] = {0};
    size_t want_len[GOOD], again_len[GOOD];
    for (int i = 0; i < GOOD; i++) {
        group_prompt(prompts[i], PROMPT_LEN, 100 + (uint32_t)i, VOCAB);
        pp[i] = prompts[i];
        lens[i] = PROMPT_LEN;
    }
    int ok = group_expected(g, pp, lens, GOOD, MAX_TOKENS, want, want_len) == 0;
    CHECK(ok, "pagoda-run gives alice's expected tokens on the clean model");
    if (!ok)
        return;
    int32_t poison = -1;
    for (int32_t t = 3; t < VOCAB && poison < 0; t++) {
        int used = 0;
        for (int i = 0; i < GOOD; i++)
            used |= holds(prompts[i], PROMPT_LEN, t) || holds(want[i], want_len[i], t);
        if (!used)
            poison = t;
    }
    ok = poison >= 0 &&
         poison_tensor(g->model, "model.embed_tokens.weight", (size_t)poison * HIDDEN, HIDDEN) == 0;
    CHECK(ok, "token %d's embedding is NaN", (int)poison);
    if (!ok)
        return;
    ok = group_expected(g, pp, lens, GOOD, MAX_TOKENS, again, again_len) == 0;
    for (int i = 0; ok && i < GOOD; i++)
        ok = again_len[i] == want_len[i] &&
             memcmp(again[i], want[i], want_len[i] * sizeof(int32_t)) == 0;
    CHECK(ok, "pagoda-run gives alice the same tokens on the poisoned model");

    char tenants[600];
    snprintf(tenants, sizeof(tenants), "%s/tenants.json", g->tmp);
    FILE *f = fopen(tenants, "w");
    ok = f != NULL && fputs(tenants_json, f) >= 0;
    if (f != NULL && fclose(f) != 0)
        ok = 0;
    const char *extra[] = {"--router-arg", "--tenants",    "--router-arg",
                           tenants,        "--worker-arg", "--step-delay-ms",
                           "--worker-arg", "20",           NULL};
    ok = ok && group_start(g, extra) == 0;
    CHECK(ok, "group started with alice and bob on the poisoned model");
    pagoda_client *alice = ok ? open_client(g, "alice-key") : NULL;
    pagoda_client *bob = ok ? open_client(g, "bob-key") : NULL;
    if (alice == NULL || bob == NULL)
        goto out;

    /* The probe: finite and above 0, refused at the front now. */
    pagoda_generate_params p = group_greedy(MAX_TOKENS);
    p.repetition_penalty = 1e-45f;
    uint8_t id[PAGODA_REQUEST_ID_BYTES];
    int32_t bob_prompt[PROMPT_LEN];
    group_prompt(bob_prompt, PROMPT_LEN, 7, VOCAB);
    int rc = pagoda_submit(bob, &p, bob_prompt, PROMPT_LEN, id);
    CHECK(rc == PAGODA_ERANGE && strstr(pagoda_error_detail(), "repetition_penalty") != NULL,
          "repetition_penalty 1e-45 is refused at submit (rc %d: %s)", rc, pagoda_error_detail());

    /* Bob's poisoned request joins the steps of alice's three (each step takes 20 ms). */
    bob_prompt[PROMPT_LEN / 2] = poison;
    p = group_greedy(MAX_TOKENS);
    uint8_t bob_id[PAGODA_REQUEST_ID_BYTES], alice_ids[GOOD][PAGODA_REQUEST_ID_BYTES];
    rc = 0;
    for (int i = 0; rc == 0 && i < GOOD; i++)
        rc = pagoda_submit(alice, &p, prompts[i], PROMPT_LEN, alice_ids[i]);
    if (rc == 0)
        rc = pagoda_submit(bob, &p, bob_prompt, PROMPT_LEN, bob_id);
    CHECK(rc == 0, "bob's poisoned request and alice's %d requests submitted (rc %d)", GOOD, rc);
    if (rc != 0)
        goto out;
    pagoda_result r;
    ok = wait_end(bob, bob_id, &r) == 0;
    CHECK(ok && r.finish_reason == PAGODA_FINISH_ERROR && r.num_tokens == 0 &&
              r.error_message != NULL && strstr(r.error_message, "nan") != NULL,
          "bob's request ends with an error (%s: %s)",
          ok ? pagoda_finish_reason_name(r.finish_reason) : "stalled",
          ok && r.error_message ? r.error_message : "");
    pagoda_result_free(&r);
    for (int i = 0; i < GOOD; i++) {
        ok = wait_end(alice, alice_ids[i], &r) == 0;
        CHECK(ok && r.finish_reason == PAGODA_FINISH_LENGTH && r.num_tokens == want_len[i] &&
                  memcmp(r.token_ids, want[i], want_len[i] * sizeof(int32_t)) == 0,
              "alice's request %d completes with pagoda-run's %zu tokens (%s, %zu tokens)", i,
              want_len[i], ok ? pagoda_finish_reason_name(r.finish_reason) : "stalled",
              ok ? r.num_tokens : 0);
        pagoda_result_free(&r);
    }

    /* The group goes on serving both. */
    rc = pagoda_submit(bob, &p, bob_prompt, PROMPT_LEN, bob_id);
    ok = rc == 0 && wait_end(bob, bob_id, &r) == 0 && r.finish_reason == PAGODA_FINISH_ERROR;
    CHECK(ok, "bob's poisoned request again ends with an error");
    if (rc == 0)
        pagoda_result_free(&r);
    rc = pagoda_generate(alice, &p, prompts[0], PROMPT_LEN, &r);
    CHECK(rc == 0 && r.num_tokens == want_len[0] &&
              memcmp(r.token_ids, want[0], want_len[0] * sizeof(int32_t)) == 0,
          "then alice generates her tokens again (rc %d)", rc);
    pagoda_result_free(&r);
    long refused = count_log_lines(g, "scheduler", "refused step");
    CHECK(refused == 0, "the scheduler saw no step refused (%ld lines)", refused);
out:
    pagoda_client_close(alice);
    pagoda_client_close(bob);
    for (int i = 0; i < GOOD; i++) {
        free(want[i]);
        free(again[i]);
    }
    CHECK(group_stop(g) == 0, "group stopped cleanly");
}

static void scenario_nan_model(struct group *g)
{
    int ok = poison_tensor(g->model, "model.norm.weight", 0, HIDDEN) == 0;
    CHECK(ok, "every weight of the final norm is NaN");
    ok = ok && group_start(g, NULL) == 0;
    CHECK(ok, "group started on the NaN model");
    pagoda_client *c = ok ? open_client(g, NULL) : NULL;
    if (c == NULL)
        goto out;
    enum { N = 4 };
    uint8_t ids[N][PAGODA_REQUEST_ID_BYTES];
    pagoda_generate_params p = group_greedy(MAX_TOKENS);
    int rc = 0;
    for (int i = 0; rc == 0 && i < N; i++) {
        int32_t prompt[PROMPT_LEN];
        group_prompt(prompt, PROMPT_LEN, 200 + (uint32_t)i, VOCAB);
        rc = pagoda_submit(c, &p, prompt, PROMPT_LEN, ids[i]);
    }
    CHECK(rc == 0, "%d requests submitted (rc %d)", N, rc);
    for (int i = 0; rc == 0 && i < N; i++) {
        pagoda_result r;
        ok = wait_end(c, ids[i], &r) == 0;
        CHECK(ok && r.finish_reason == PAGODA_FINISH_ERROR && r.error_message != NULL &&
                  strstr(r.error_message, "nan") != NULL,
              "request %d is answered with an error (%s: %s)", i,
              ok ? pagoda_finish_reason_name(r.finish_reason) : "stalled",
              ok && r.error_message ? r.error_message : "");
        if (ok)
            pagoda_result_free(&r);
    }
    int healthy = 0;
    rc = pagoda_health(c, &healthy);
    CHECK(rc == 0 && healthy, "health answers: healthy (rc %d)", rc);
    pagoda_engine_stats st;
    rc = pagoda_stats(c, &st);
    CHECK(rc == 0 && st.resyncs <= 2 && st.running == 0 && st.waiting == 0,
          "stats answer: %llu resyncs, nothing running or waiting (rc %d)",
          (unsigned long long)st.resyncs, rc);
    long refused = count_log_lines(g, "scheduler", "refused step");
    long bytes = log_bytes(g, "scheduler");
    CHECK(refused == 0 && bytes >= 0 && bytes < 64 * 1024,
          "no refusal loop: %ld refused steps in the scheduler's log of %ld bytes", refused, bytes);
out:
    pagoda_client_close(c);
    CHECK(group_stop(g) == 0, "group stopped cleanly");
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "poison") != 0 && strcmp(argv[2], "nan-model") != 0)) {
        fprintf(stderr, "usage: stall_test BIN_DIR poison|nan-model\n");
        return 2;
    }
    struct group g;
    int rc = group_setup(&g, argv[1], 0);
    if (rc != 0)
        return rc;
    if (strcmp(argv[2], "poison") == 0)
        scenario_poison(&g);
    else
        scenario_nan_model(&g);
    return group_finish(&g);
}
