/* pagoda: the command-line client of a pagoda router (libpagoda).
 *
 *   pagoda [--url URL] [--api-key KEY] generate --tokens 1,2,3 | --prompt TEXT [--max-tokens N]
 *                                [sampling flags] [--logit-bias ID:VALUE]... [--min-tokens N]
 *                                [--stop STR]... [--stream] [--json]
 *   pagoda [--url URL] [--api-key KEY] chat [--system TEXT] [--max-tokens N] [sampling flags]
 *                                (reads a user turn per line of stdin, streams the answers)
 *   pagoda [--url URL] stats [--json]
 *   pagoda [--url URL] health
 *   pagoda [--url URL] --api-key ADMINKEY admin tenants|pin|unpin|flush|reload ...
 *                                (pagoda_admin_cli.c)
 *
 * Sampling defaults to greedy (temperature 0), as pagoda-run does, so that the two can be
 * compared token for token. Exit status: 0 on success, 1 when the router (or the request)
 * failed, 2 for bad flags. */
#include "client/pagoda.h"
#include "common/error.h"
#include "common/json_util.h"
#include "common/parse.h"
#include "common/sampling_flags.h"
#include "client/pagoda_admin_cli.h"

#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_PROMPT_TOKENS (1 << 20)
#define MAX_STOP_TOKEN_IDS 64
#define MAX_STOP_STRINGS 16
/* pagoda chat: the longest line read as one user turn, and the most turns kept. */
#define CHAT_MAX_LINE_BYTES (1u << 20)
#define CHAT_MAX_MESSAGES 1024

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: pagoda [--url URL] generate --tokens 1,2,3 | --prompt TEXT [--max-tokens N]\n"
        "              [--temperature T] [--top-p P] [--top-k K] [--min-p M]\n"
        "              [--repetition-penalty R] [--presence-penalty X]\n"
        "              [--frequency-penalty X] [--seed S] [--stop-token-ids 1,2]\n"
        "              [--logit-bias ID:VALUE]... [--min-tokens N]\n"
        "              [--stop STR]... [--ignore-eos] [--stream] [--json] [--timeout-ms MS]\n"
        "       pagoda [--url URL] chat [--system TEXT] [--max-tokens N] [sampling flags]\n"
        "       pagoda [--url URL] stats [--json]\n"
        "       pagoda [--url URL] health\n"
        "Global flags (before the command): --url URL, --api-key KEY.\n"
        "URL: the router's address, default %s. KEY: the API key the router knows the\n"
        "caller's tenant by.\n"
        "generate: greedy (temperature 0) and 16 tokens unless told otherwise; prints the\n"
        "token ids, or with --json one line {\"id\", \"token_ids\", \"logprobs\",\n"
        "\"finish_reason\", \"usage\"}. --stream prints tokens as they arrive (with --json, one\n"
        "line per piece, then the summary line). --prompt sends text (the model needs a\n"
        "tokenizer.json) and prints the text of the output; --stop ends the output before a\n"
        "stop string (repeatable); with --json the text, \"stop_string\" and \"stop_token_id\"\n"
        "are in the line too. --logit-bias adds VALUE (in [-100, 100]) to token ID's logit\n"
        "before sampling (repeatable, up to %u tokens); with --min-tokens N no EOS, stop token\n"
        "or stop string ends the output before N tokens (N at most max_tokens).\n"
        "Interrupted (SIGINT, SIGTERM, SIGHUP) it cancels its request, prints what it has\n"
        "(finish_reason \"cancelled\") and exits 128 + the signal.\n"
        "chat: one user turn per line of stdin, the model's chat template, the answer streamed\n"
        "as text; the conversation is kept until end of input. 256 tokens unless told.\n"
        "Exit status: 0 done, 1 the router or the request failed, 2 bad flags.\n",
        PAGODA_DEFAULT_URL, PAGODA_MAX_LOGIT_BIAS);
    admin_cli_usage(f);
}

static int bad_flags(int rc)
{
    char msg[700];
    fprintf(stderr, "pagoda: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
    return 2;
}

static int server_error(int rc)
{
    char msg[700];
    fprintf(stderr, "pagoda: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
    return 1;
}

static void print_json_floats(const float *v, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++) {
        if (i)
            fputs(", ", stdout);
        if (v != NULL && isfinite(v[i]))
            printf("%.6g", (double)v[i]);
        else
            fputs("null", stdout); /* JSON has no infinity */
    }
    putchar(']');
}

static void print_json_ints(const int32_t *v, size_t n)
{
    putchar('[');
    for (size_t i = 0; i < n; i++)
        printf("%s%d", i ? ", " : "", v[i]);
    putchar(']');
}

/* A JSON string of len bytes of UTF-8 (the router's messages, the output's text, which may hold
 * U+0000). */
static void print_json_bytes(const char *s, size_t len)
{
    json_util_print_string(stdout, s, len);
}

static void print_json_string(const char *s)
{
    print_json_bytes(s, strlen(s));
}

struct stream_state {
    int json;
    int printed; /* tokens printed so far (plain output) */
    int text;    /* print text pieces (a text prompt or a chat) */
};

/* A piece of a text request: its text (plain), or one JSON line. */
static void on_piece(void *user, const pagoda_result *piece)
{
    struct stream_state *st = user;
    if (st->json) {
        printf("{\"offset\": %u, \"token_ids\": ", piece->offset);
        print_json_ints(piece->token_ids, piece->num_tokens);
        fputs(", \"text\": ", stdout);
        print_json_bytes(piece->text ? piece->text : "", piece->text_len);
        fputs("}\n", stdout);
    } else if (!st->text) {
        for (size_t i = 0; i < piece->num_tokens; i++)
            printf("%s%d", st->printed++ ? "," : "", piece->token_ids[i]);
    } else if (piece->text != NULL) {
        fwrite(piece->text, 1, piece->text_len, stdout);
        st->printed += piece->text_len > 0;
    }
    fflush(stdout);
}

static void on_tokens(void *user, uint32_t offset, const int32_t *ids, const float *logprobs,
                      size_t n)
{
    struct stream_state *st = user;
    if (st->json) {
        printf("{\"offset\": %u, \"token_ids\": ", offset);
        print_json_ints(ids, n);
        fputs(", \"logprobs\": ", stdout);
        print_json_floats(logprobs, n);
        fputs("}\n", stdout);
    } else {
        for (size_t i = 0; i < n; i++)
            printf("%s%d", st->printed++ ? "," : "", ids[i]);
    }
    fflush(stdout);
}

enum {
    OPT_URL = 1000,
    OPT_TOKENS,
    OPT_MAX_TOKENS,
    OPT_STOP,
    OPT_IGNORE_EOS,
    OPT_STREAM,
    OPT_JSON,
    OPT_TIMEOUT,
    OPT_API_KEY,
    OPT_PROMPT,
    OPT_STOP_STRING,
    OPT_SYSTEM,
    OPT_LOGIT_BIAS,
    OPT_MIN_TOKENS,
};

static const struct option longopts[] = {
    {"url", required_argument, NULL, OPT_URL},
    {"tokens", required_argument, NULL, OPT_TOKENS},
    {"max-tokens", required_argument, NULL, OPT_MAX_TOKENS},
    SAMPLING_FLAG_OPTIONS,
    {"stop-token-ids", required_argument, NULL, OPT_STOP},
    {"ignore-eos", no_argument, NULL, OPT_IGNORE_EOS},
    {"stream", no_argument, NULL, OPT_STREAM},
    {"json", no_argument, NULL, OPT_JSON},
    {"timeout-ms", required_argument, NULL, OPT_TIMEOUT},
    {"api-key", required_argument, NULL, OPT_API_KEY},
    {"prompt", required_argument, NULL, OPT_PROMPT},
    {"stop", required_argument, NULL, OPT_STOP_STRING},
    {"system", required_argument, NULL, OPT_SYSTEM},
    {"logit-bias", required_argument, NULL, OPT_LOGIT_BIAS},
    {"min-tokens", required_argument, NULL, OPT_MIN_TOKENS},
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0},
};

struct cli {
    const char *url;
    const char *api_key; /* NULL: none */
    int32_t *prompt;
    size_t num_prompt;
    int32_t *stop_ids;
    const char *text;   /* --prompt */
    const char *system; /* chat --system */
    const char *stops[MAX_STOP_STRINGS];
    size_t num_stops;
    int32_t bias_ids[PAGODA_MAX_LOGIT_BIAS]; /* --logit-bias, in the order given */
    float bias_values[PAGODA_MAX_LOGIT_BIAS];
    int max_tokens_set;
    struct sampling_flags flags; /* --temperature .. --seed as given (common/sampling_flags.h) */
    pagoda_generate_params params;
    int stream, json;
    uint32_t timeout_ms;
    int generate; /* flags only generate takes were given */
};

/* --logit-bias ID:VALUE, once per token: appended to o's params. The router checks the id
 * against the vocabulary; a value outside [-100, 100] and an id given twice are refused here
 * (the gateway clamps values, as OpenAI's API is documented to take them: a flag of this
 * program's own is better refused than changed). */
static int parse_logit_bias(struct cli *o, const char *arg)
{
    int32_t id;
    double value;
    int rc = parse_id_value("--logit-bias", arg, PAGODA_LOGIT_BIAS_LIMIT, &id, &value);
    if (rc != 0)
        return rc;
    size_t n = o->params.num_logit_bias;
    if (n == PAGODA_MAX_LOGIT_BIAS)
        return pagoda_error_set(PAGODA_ERANGE, "--logit-bias: at most %u tokens",
                                PAGODA_MAX_LOGIT_BIAS);
    for (size_t i = 0; i < n; i++)
        if (o->bias_ids[i] == id)
            return pagoda_error_set(PAGODA_EINVAL, "--logit-bias: token %d given twice", (int)id);
    o->bias_ids[n] = id;
    o->bias_values[n] = (float)value;
    o->params.logit_bias_ids = o->bias_ids;
    o->params.logit_bias_values = o->bias_values;
    o->params.num_logit_bias = n + 1;
    return 0;
}

/* The sampling flags given so far into o->params. */
static void take_sampling_flags(struct cli *o)
{
    const struct sampling_flags *f = &o->flags;
    pagoda_generate_params *p = &o->params;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_TEMPERATURE))
        p->temperature = f->temperature;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_TOP_P))
        p->top_p = f->top_p;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_TOP_K))
        p->top_k = f->top_k;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_MIN_P))
        p->min_p = f->min_p;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_REPETITION_PENALTY))
        p->repetition_penalty = f->repetition_penalty;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_PRESENCE_PENALTY))
        p->presence_penalty = f->presence_penalty;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_FREQUENCY_PENALTY))
        p->frequency_penalty = f->frequency_penalty;
    if (SAMPLING_FLAG_GIVEN(f, SAMPLING_FLAG_SEED)) {
        p->has_seed = 1;
        p->seed = f->seed;
    }
}

static int parse_flag(struct cli *o, int opt, const char *arg)
{
    int64_t i;
    int rc;
    size_t n;
    if (opt != OPT_URL && opt != OPT_JSON && opt != OPT_TIMEOUT && opt != OPT_API_KEY)
        o->generate = 1;
    if (sampling_flag_is(opt)) {
        if ((rc = sampling_flag_parse(opt, arg, &o->flags)) == 0)
            take_sampling_flags(o);
        return rc;
    }
    switch (opt) {
    case OPT_URL:
        o->url = arg;
        return 0;
    case OPT_API_KEY:
        o->api_key = arg;
        return 0;
    case OPT_TOKENS:
        free(o->prompt);
        o->prompt = NULL;
        return parse_i32_list("--tokens", arg, 0, INT32_MAX, MAX_PROMPT_TOKENS, &o->prompt,
                              &o->num_prompt);
    case OPT_MAX_TOKENS:
        if ((rc = parse_i64("--max-tokens", arg, 1, INT32_MAX, &i)) == 0) {
            o->params.max_tokens = (int32_t)i;
            o->max_tokens_set = 1;
        }
        return rc;
    case OPT_PROMPT:
        o->text = arg;
        return 0;
    case OPT_SYSTEM:
        o->system = arg;
        return 0;
    case OPT_STOP_STRING:
        if (o->num_stops == MAX_STOP_STRINGS)
            return pagoda_error_set(PAGODA_ERANGE, "--stop: at most %d stop strings",
                                    MAX_STOP_STRINGS);
        o->stops[o->num_stops++] = arg;
        o->params.stop = o->stops;
        o->params.num_stop = o->num_stops;
        return 0;
    case OPT_STOP:
        free(o->stop_ids);
        o->stop_ids = NULL;
        rc = parse_i32_list("--stop-token-ids", arg, 0, INT32_MAX, MAX_STOP_TOKEN_IDS, &o->stop_ids,
                            &n);
        o->params.stop_token_ids = o->stop_ids;
        o->params.num_stop_token_ids = rc == 0 ? n : 0;
        return rc;
    case OPT_IGNORE_EOS:
        o->params.ignore_eos = 1;
        return 0;
    case OPT_LOGIT_BIAS:
        return parse_logit_bias(o, arg);
    case OPT_MIN_TOKENS:
        if ((rc = parse_i64("--min-tokens", arg, 0, INT32_MAX, &i)) == 0)
            o->params.min_tokens = (int32_t)i;
        return rc;
    case OPT_STREAM:
        o->stream = 1;
        return 0;
    case OPT_JSON:
        o->json = 1;
        return 0;
    case OPT_TIMEOUT:
        if ((rc = parse_i64("--timeout-ms", arg, 1, PAGODA_MAX_TIMEOUT_MS, &i)) == 0)
            o->timeout_ms = (uint32_t)i;
        return rc;
    default:
        return pagoda_error_set(PAGODA_EINVAL, "unknown option (see --help)");
    }
}

static void print_json_stop(const pagoda_result *res)
{
    if (res->text != NULL) {
        fputs(", \"text\": ", stdout);
        print_json_bytes(res->text, res->text_len);
    }
    if (res->stop_string != NULL) {
        fputs(", \"stop_string\": ", stdout);
        print_json_string(res->stop_string);
    }
    if (res->has_stop_token_id)
        printf(", \"stop_token_id\": %d", res->stop_token_id);
}

/* SIGINT, SIGTERM and SIGHUP while generating or chatting. They are blocked in every thread
 * (NNG's among them) from before the client opens, and a thread of their own waits for them: the
 * first cancels the request being generated (pagoda_client_cancel_generations, on a thread of
 * its own, since it waits for the router), whose call then returns with the output so far, and
 * the program exits 128 + the signal; before a request, or with chat waiting for a line, it
 * exits at once, and so it does at a second signal, whatever the cancel is doing. Without this
 * the request ran on to its max_tokens after the CLI had gone, holding its tenant's slots. The
 * client is main's until it has been handed back (c NULL, under the lock), so that no cancel is
 * running when main closes it. */
enum phase { PHASE_START, PHASE_INPUT, PHASE_RUN, PHASE_DONE };

static struct {
    pthread_mutex_t lock;
    pagoda_client *c;
    sigset_t set;
    atomic_int sig;
    atomic_int phase; /* enum phase: what main is doing */
} interrupt = {.lock = PTHREAD_MUTEX_INITIALIZER};

static void *interrupt_cancel(void *arg)
{
    (void)arg;
    /* Under the lock, so that main, which changes its phase under it and then looks at sig,
     * either sees the signal or is seen in its new phase. A generate call that starts after the
     * cancel returns at once (the client's generations are cancelled for good). */
    pthread_mutex_lock(&interrupt.lock);
    int n = interrupt.c != NULL ? pagoda_client_cancel_generations(interrupt.c) : -1;
    int phase = atomic_load(&interrupt.phase);
    pthread_mutex_unlock(&interrupt.lock);
    if (n == 0 && (phase == PHASE_START || phase == PHASE_INPUT))
        _exit(128 + atomic_load(&interrupt.sig)); /* nothing to cancel, nothing to print */
    return NULL;
}

/* Main enters a phase; false when a signal came already (then it stops). */
static bool enter_phase(enum phase p)
{
    pthread_mutex_lock(&interrupt.lock);
    atomic_store(&interrupt.phase, p);
    bool go = atomic_load(&interrupt.sig) == 0;
    pthread_mutex_unlock(&interrupt.lock);
    return go;
}

static void *interrupt_watch(void *arg)
{
    (void)arg;
    int sig;
    if (sigwait(&interrupt.set, &sig) != 0)
        return NULL;
    atomic_store(&interrupt.sig, sig);
    pthread_t t;
    if (pthread_create(&t, NULL, interrupt_cancel, NULL) == 0)
        pthread_detach(t);
    else
        _exit(128 + sig);
    if (sigwait(&interrupt.set, &sig) == 0)
        _exit(128 + sig);
    return NULL;
}

/* --min-tokens against the max_tokens in force (--max-tokens or the command's default): 0, or
 * 2 (bad flags) said on stderr, before anything is sent. */
static int check_min_tokens(const struct cli *o)
{
    if (o->params.min_tokens <= o->params.max_tokens)
        return 0;
    fprintf(stderr, "pagoda: --min-tokens %d is more than max_tokens (%d%s)\n",
            (int)o->params.min_tokens, (int)o->params.max_tokens,
            o->max_tokens_set ? "" : ", the default: give --max-tokens");
    return 2;
}

static int cmd_generate(pagoda_client *c, struct cli *o)
{
    if ((o->num_prompt == 0) == (o->text == NULL)) {
        fprintf(stderr, "pagoda: generate needs one of --tokens and --prompt\n");
        return 2;
    }
    if (check_min_tokens(o) != 0)
        return 2;
    o->params.logprobs = 1;
    struct stream_state st = {.json = o->json, .text = o->text != NULL};
    pagoda_prompt prompt = pagoda_prompt_default();
    prompt.token_ids = o->prompt;
    prompt.num_token_ids = o->num_prompt;
    prompt.text = o->text;
    pagoda_result res;
    int rc;
    if (!enter_phase(PHASE_RUN))
        return 128 + atomic_load(&interrupt.sig);
    if (st.text)
        rc = pagoda_generate_prompt(c, &o->params, &prompt, o->stream ? on_piece : NULL, &st, &res);
    else if (o->num_stops > 0)
        rc = pagoda_generate_prompt(c, &o->params, &prompt, o->stream ? on_piece : NULL, &st, &res);
    else
        rc = pagoda_generate_stream(c, &o->params, o->prompt, o->num_prompt,
                                    o->stream ? on_tokens : NULL, &st, &res);
    enter_phase(PHASE_DONE);
    if (rc != 0) {
        if (o->stream && !o->json && st.printed)
            putchar('\n');
        pagoda_result_free(&res);
        return server_error(rc);
    }
    char hex[33];
    pagoda_request_id_hex(res.request_id, hex);
    if (o->json) {
        printf("{\"id\": \"%s\", \"token_ids\": ", hex);
        print_json_ints(res.token_ids, res.num_tokens);
        fputs(", \"logprobs\": ", stdout);
        print_json_floats(res.logprobs, res.num_tokens);
        printf(", \"finish_reason\": \"%s\", \"usage\": {\"prompt_tokens\": %u, "
               "\"completion_tokens\": %u, \"cached_tokens\": %u}",
               pagoda_finish_reason_name(res.finish_reason), res.prompt_tokens,
               res.completion_tokens, res.cached_tokens);
        print_json_stop(&res);
        if (res.error_message != NULL) {
            fputs(", \"error\": ", stdout);
            print_json_string(res.error_message);
        }
        fputs("}\n", stdout);
    } else if (o->stream) {
        putchar('\n');
    } else if (st.text) {
        if (res.text != NULL)
            fwrite(res.text, 1, res.text_len, stdout);
        putchar('\n');
    } else {
        for (size_t i = 0; i < res.num_tokens; i++)
            printf("%s%d", i ? "," : "", res.token_ids[i]);
        putchar('\n');
    }
    int status = 0;
    if (res.finish_reason == PAGODA_FINISH_ERROR) {
        fprintf(stderr, "pagoda: request %s failed: %s\n", hex,
                res.error_message ? res.error_message : "error");
        status = 1;
    }
    pagoda_result_free(&res);
    return status;
}

/* Reads one line of stdin (without its newline) into a malloc'd string; NULL at the end of
 * input. A line longer than CHAT_MAX_LINE_BYTES is cut there. */
static char *read_line(void)
{
    size_t cap = 256, len = 0;
    char *buf = malloc(cap);
    int ch = EOF;
    while (buf != NULL && (ch = getchar()) != EOF && ch != '\n') {
        if (len + 1 == cap) {
            if (cap >= CHAT_MAX_LINE_BYTES)
                continue; /* the rest of an overlong line is dropped */
            char *b = realloc(buf, cap * 2);
            if (b == NULL) {
                free(buf);
                return NULL;
            }
            buf = b;
            cap *= 2;
        }
        buf[len++] = (char)ch;
    }
    if (buf == NULL || (ch == EOF && len == 0)) {
        free(buf);
        return NULL;
    }
    if (len > 0 && buf[len - 1] == '\r') /* CRLF input */
        len--;
    if (len + 1 == cap && cap >= CHAT_MAX_LINE_BYTES)
        fprintf(stderr, "pagoda: a line longer than %u bytes was cut\n", CHAT_MAX_LINE_BYTES);
    buf[len] = '\0';
    return buf;
}

/* pagoda chat: each line of stdin is a user turn; the answer streams to stdout and joins the
 * conversation, which is sent whole each turn (the prefix cache makes that cheap). */
static int cmd_chat(pagoda_client *c, struct cli *o)
{
    if (o->num_prompt > 0 || o->text != NULL) {
        fprintf(stderr, "pagoda: chat reads its turns from stdin (no --tokens or --prompt)\n");
        return 2;
    }
    if (!o->max_tokens_set)
        o->params.max_tokens = 256;
    if (check_min_tokens(o) != 0)
        return 2;
    pagoda_chat_message *msgs = calloc(CHAT_MAX_MESSAGES, sizeof(*msgs));
    char **owned = calloc(CHAT_MAX_MESSAGES, sizeof(*owned));
    size_t n = 0;
    int status = 0;
    if (msgs == NULL || owned == NULL) {
        status = server_error(PAGODA_ENOMEM);
        goto out;
    }
    if (o->system != NULL)
        msgs[n++] = (pagoda_chat_message){.role = "system", .content = o->system};
    char *line;
    while (enter_phase(PHASE_INPUT) && (line = read_line()) != NULL) {
        if (n + 2 > CHAT_MAX_MESSAGES) {
            free(line);
            fprintf(stderr, "pagoda: the conversation reached %d messages\n", CHAT_MAX_MESSAGES);
            status = 1;
            break;
        }
        owned[n] = line;
        msgs[n++] = (pagoda_chat_message){.role = "user", .content = line};
        pagoda_prompt prompt = pagoda_prompt_default();
        prompt.messages = msgs;
        prompt.num_messages = n;
        struct stream_state st = {.json = 0, .text = 1};
        pagoda_result res;
        if (!enter_phase(PHASE_RUN))
            break;
        int rc = pagoda_generate_prompt(c, &o->params, &prompt, on_piece, &st, &res);
        enter_phase(PHASE_DONE);
        putchar('\n');
        fflush(stdout);
        if (atomic_load(&interrupt.sig) != 0) {
            pagoda_result_free(&res);
            break;
        }
        if (rc != 0) {
            pagoda_result_free(&res);
            status = server_error(rc);
            break;
        }
        if (res.finish_reason == PAGODA_FINISH_ERROR) {
            fprintf(stderr, "pagoda: the answer failed: %s\n",
                    res.error_message ? res.error_message : "error");
            pagoda_result_free(&res);
            status = 1;
            break;
        }
        char *answer = res.text ? res.text : strdup("");
        res.text = NULL;
        pagoda_result_free(&res);
        if (answer == NULL) {
            status = server_error(PAGODA_ENOMEM);
            break;
        }
        owned[n] = answer;
        msgs[n++] = (pagoda_chat_message){.role = "assistant", .content = answer};
    }
out:
    for (size_t i = 0; owned != NULL && i < n; i++)
        free(owned[i]);
    free(owned);
    free(msgs);
    return status;
}

/* The router's engines (several behind it: docs/routing.md), after the summed figures: a table,
 * or "routing" and an "engines" array in JSON. A router with one engine lists none, and then
 * neither is printed (not an array of one: the figures above are that engine's). */
static void print_engines(const pagoda_engine_stats *s, int json)
{
    if (json) {
        printf(", \"routing\": ");
        print_json_string(s->routing);
        printf(", \"engines_dropped\": %u, \"engines\": [", s->engines_dropped);
    } else {
        printf("\nrouting %s\n", s->routing);
        printf("%-6s %-9s %8s %8s %8s %12s %12s %12s %10s  %s", "engine", "connected", "load",
               "running", "waiting", "prefix_query", "prefix_hit", "prefix_waits", "routed",
               "address");
    }
    for (uint32_t i = 0; i < s->num_engines; i++) {
        const pagoda_engine_info *e = &s->engines[i];
        if (json) {
            printf("%s{\"engine\": %u, \"address\": ", i ? ", " : "", e->engine);
            print_json_string(e->address);
            printf(", \"connected\": %s, \"load\": %llu, \"running\": %u, \"waiting\": %u, "
                   "\"prefix_query_tokens\": %llu, \"prefix_hit_tokens\": %llu, "
                   "\"prefix_waits\": %llu, \"routed\": %llu}",
                   e->connected ? "true" : "false", (unsigned long long)e->load, e->running,
                   e->waiting, (unsigned long long)e->prefix_query_tokens,
                   (unsigned long long)e->prefix_hit_tokens, (unsigned long long)e->prefix_waits,
                   (unsigned long long)e->routed);
        } else {
            printf("\n%-6u %-9s %8llu %8u %8u %12llu %12llu %12llu %10llu  %s", e->engine,
                   e->connected ? "yes" : "no", (unsigned long long)e->load, e->running, e->waiting,
                   (unsigned long long)e->prefix_query_tokens,
                   (unsigned long long)e->prefix_hit_tokens, (unsigned long long)e->prefix_waits,
                   (unsigned long long)e->routed, e->address);
        }
    }
    if (json)
        putchar(']');
    else if (s->engines_dropped > 0)
        printf("\n(%u more engines not shown: the client keeps %u)", s->engines_dropped,
               PAGODA_STATS_MAX_ENGINES);
}

static int cmd_stats(pagoda_client *c, const struct cli *o)
{
    pagoda_engine_stats s;
    int rc = pagoda_stats(c, &s);
    if (rc != 0)
        return server_error(rc);
    const char *fmt = o->json ? "%s\"%s\": " : "%s%s ";
    const char *sep0 = "", *sep = o->json ? ", " : "\n";
#define FIELD(name, spec, value)                                                                   \
    do {                                                                                           \
        printf(fmt, sep0, name);                                                                   \
        printf(spec, value);                                                                       \
        sep0 = sep;                                                                                \
    } while (0)
    /* A figure the router sent as NaN or an infinity (0/0 rates): JSON has neither, so null. */
#define DFIELD(name, value)                                                                        \
    do {                                                                                           \
        printf(fmt, sep0, name);                                                                   \
        if (o->json && !isfinite(value))                                                           \
            fputs("null", stdout);                                                                 \
        else                                                                                       \
            printf("%.6g", value);                                                                 \
        sep0 = sep;                                                                                \
    } while (0)
    if (o->json)
        putchar('{');
    /* A tenant's key gets its own figures only (pagoda_engine_stats): print just those. */
    int engine = s.tenant[0] == '\0';
    if (!engine && o->json) {
        fputs("\"tenant\": ", stdout); /* the router's string: escaped, whatever it holds */
        print_json_string(s.tenant);
    } else if (!engine) {
        printf("tenant %s", s.tenant);
    }
    sep0 = engine ? "" : sep;
    FIELD("running", "%u", s.running);
    FIELD("waiting", "%u", s.waiting);
    if (engine) {
        FIELD("peak_running", "%u", s.peak_running);
        DFIELD("kv_usage", s.kv_usage);
    }
    DFIELD("prefix_hit_rate", s.prefix_hit_rate);
    if (engine) {
        DFIELD("fragmentation", s.fragmentation);
        FIELD("preemptions", "%llu", (unsigned long long)s.preemptions);
        FIELD("steps", "%llu", (unsigned long long)s.steps);
        FIELD("resyncs", "%llu", (unsigned long long)s.resyncs);
        FIELD("worker_restarts", "%llu", (unsigned long long)s.worker_restarts);
        FIELD("num_blocks", "%d", s.num_blocks);
        FIELD("free_blocks", "%d", s.free_blocks);
        FIELD("computed_tokens", "%llu", (unsigned long long)s.computed_tokens);
        FIELD("malformed_messages", "%llu", (unsigned long long)s.malformed_messages);
        DFIELD("step_cpu_us", s.step_cpu_us);
        FIELD("steps_in_flight", "%u", s.steps_in_flight);
        FIELD("peak_steps_in_flight", "%u", s.peak_steps_in_flight);
        FIELD("discarded_tokens", "%llu", (unsigned long long)s.discarded_tokens);
        DFIELD("worker_step_wall_us", s.worker_step_wall_us);
        DFIELD("worker_step_device_us", s.worker_step_device_us);
        FIELD("worker_steps_timed", "%llu", (unsigned long long)s.worker_steps_timed);
        FIELD("worker_step_wall_us_total", "%llu", (unsigned long long)s.worker_step_wall_us_total);
        FIELD("worker_step_device_us_total", "%llu",
              (unsigned long long)s.worker_step_device_us_total);
        FIELD("prefill_tokens", "%llu", (unsigned long long)s.prefill_tokens);
        FIELD("decode_tokens", "%llu", (unsigned long long)s.decode_tokens);
        DFIELD("locality", s.locality);
        DFIELD("locality_run_length", s.locality_run_length);
        FIELD("router_drops", "%llu", (unsigned long long)s.router_drops);
        FIELD("router_resends", "%llu", (unsigned long long)s.router_resends);
        FIELD("event_gaps", "%llu", (unsigned long long)s.event_gaps);
        FIELD("text_jobs", "%llu", (unsigned long long)s.text_jobs);
    }
    FIELD("cached_blocks", "%u", s.cached_blocks);
    if (engine) {
        FIELD("pinned_blocks", "%u", s.pinned_blocks);
        DFIELD("peak_kv_usage", s.peak_kv_usage);
    }
    FIELD("prefix_query_tokens", "%llu", (unsigned long long)s.prefix_query_tokens);
    FIELD("prefix_hit_tokens", "%llu", (unsigned long long)s.prefix_hit_tokens);
    FIELD("evictions", "%llu", (unsigned long long)s.evictions);
    if (engine)
        FIELD("prefix_waits", "%llu", (unsigned long long)s.prefix_waits);
    FIELD("duplicate_submits", "%llu", (unsigned long long)s.duplicate_submits);
    FIELD("live_requests", "%u", s.live_requests);
    FIELD("finished_requests", "%u", s.finished_requests);
    if (engine)
        FIELD("malformed_requests", "%llu", (unsigned long long)s.malformed_requests);
    FIELD("scheduler_connected", "%s", s.scheduler_connected ? "true" : "false");
    if (engine && s.kv_cache_dtype[0] != '\0') { /* the router's string: escaped in JSON */
        printf(fmt, sep0, "kv_cache_dtype");
        if (o->json)
            print_json_string(s.kv_cache_dtype);
        else
            fputs(s.kv_cache_dtype, stdout);
    }
#undef FIELD
#undef DFIELD
    if (engine && s.num_engines > 0)
        print_engines(&s, o->json);
    puts(o->json ? "}" : "");
    return 0;
}

static int cmd_health(pagoda_client *c)
{
    int healthy = 0;
    int rc = pagoda_health(c, &healthy);
    if (rc != 0)
        return server_error(rc);
    if (!healthy) {
        printf("unhealthy: %s\n", pagoda_error_detail());
        return 1;
    }
    puts("healthy");
    return 0;
}

int main(int argc, char **argv)
{
    struct cli o = {.url = PAGODA_DEFAULT_URL, .params = pagoda_generate_params_default()};
    o.params.temperature = 0.0f; /* greedy unless asked otherwise, as pagoda-run */
    int status = 2, opt, rc;
    pagoda_client *c = NULL;

    /* Global flags come before the command; the command's own follow it. */
    int i = 1;
    while (i < argc && strncmp(argv[i], "--", 2) == 0) {
        if (strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            return 0;
        }
        if (strcmp(argv[i], "--url") == 0 && i + 1 < argc) {
            o.url = argv[i + 1];
            i += 2;
        } else if (strncmp(argv[i], "--url=", 6) == 0) {
            o.url = argv[i] + 6;
            i++;
        } else if (strcmp(argv[i], "--api-key") == 0 && i + 1 < argc) {
            o.api_key = argv[i + 1];
            i += 2;
        } else if (strncmp(argv[i], "--api-key=", 10) == 0) {
            o.api_key = argv[i] + 10;
            i++;
        } else {
            fprintf(stderr, "pagoda: unknown option '%s' before the command\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (i >= argc) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[i];
    if (strcmp(cmd, "admin") == 0)
        return admin_cli_main(o.url, o.api_key, argc - i, argv + i);
    int sub_argc = argc - i;
    char **sub_argv = argv + i;
    int is_chat = strcmp(cmd, "chat") == 0;
    int is_generate = strcmp(cmd, "generate") == 0 || is_chat;
    if (!is_generate && strcmp(cmd, "stats") != 0 && strcmp(cmd, "health") != 0) {
        fprintf(stderr, "pagoda: unknown command '%s' (generate, chat, stats, health, admin)\n",
                cmd);
        return 2;
    }
    optind = 1;
    while ((opt = getopt_long(sub_argc, sub_argv, "", longopts, NULL)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            status = 0;
            goto out;
        }
        if (opt == '?') {
            usage(stderr);
            goto out;
        }
        if ((rc = parse_flag(&o, opt, optarg)) != 0) {
            status = bad_flags(rc);
            goto out;
        }
    }
    if (optind != sub_argc) {
        fprintf(stderr, "pagoda: unexpected argument '%s'\n", sub_argv[optind]);
        goto out;
    }
    if (!is_generate && o.generate) {
        fprintf(stderr, "pagoda: %s takes only --url, --api-key and --json\n", cmd);
        goto out;
    }
    if (is_generate) {
        sigemptyset(&interrupt.set);
        sigaddset(&interrupt.set, SIGINT);
        sigaddset(&interrupt.set, SIGTERM);
        sigaddset(&interrupt.set, SIGHUP);
        pthread_sigmask(SIG_BLOCK, &interrupt.set, NULL);
    }
    if ((rc = pagoda_client_open(o.url, &c)) != 0) {
        status = bad_flags(rc); /* a malformed address */
        goto out;
    }
    if (o.api_key != NULL && (rc = pagoda_client_set_api_key(c, o.api_key)) != 0) {
        status = bad_flags(rc);
        goto out;
    }
    if (o.timeout_ms)
        pagoda_client_set_timeout_ms(c, o.timeout_ms);
    else if (!is_generate)
        pagoda_client_set_timeout_ms(c, 5000); /* a quick answer or none */
    if (is_generate) {
        pthread_t watcher;
        interrupt.c = c;
        if (pthread_create(&watcher, NULL, interrupt_watch, NULL) == 0)
            pthread_detach(watcher);
        else
            pthread_sigmask(SIG_UNBLOCK, &interrupt.set, NULL); /* plain signals, then */
    }
    if (is_chat)
        status = cmd_chat(c, &o);
    else if (is_generate)
        status = cmd_generate(c, &o);
    else if (strcmp(cmd, "stats") == 0)
        status = cmd_stats(c, &o);
    else
        status = cmd_health(c);
    pthread_mutex_lock(&interrupt.lock);
    interrupt.c = NULL; /* back to main, no cancel running */
    pthread_mutex_unlock(&interrupt.lock);
    if (atomic_load(&interrupt.sig) != 0)
        status = 128 + atomic_load(&interrupt.sig);
out:
    pagoda_client_close(c);
    free(o.prompt);
    free(o.stop_ids);
    return status;
}
