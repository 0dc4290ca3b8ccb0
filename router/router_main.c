/* pagoda-router: serves clients (proto/pagoda.proto over NNG REQ/REP) and keeps their requests'
 * registry; forwards requests to the scheduler over ipc://RUN_DIR/scheduler.ipc.
 *
 * SIGTERM or SIGINT drains: new Submits are refused, polls are answered until every request has
 * finished (bounded by --drain-timeout-ms), then the router exits 0 (1 when the drain ran out of
 * time). A second signal stops at once. SIGHUP reads the tenants file again (as `pagoda admin
 * reload`), the outcome in the log. A tenants file or model tokenizer files it cannot take at
 * start make it exit with PAGODA_EXIT_CANNOT_RUN (common/exit_status.h). */
#include "common/error.h"
#include "common/exit_status.h"
#include "common/fd_pass.h"
#include "common/log.h"
#include "common/parse.h"
#include "model/model_config.h"
#include "router/route.h"
#include "router/router.h"
#include "router/tenants.h"
#include "wire/wire.h"

#include <getopt.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Allocations at least this big (client messages) are mapped on their own and go back to the
 * system when freed. glibc's default threshold rises with every such block freed, after which
 * they come from the heap and stay in the process after the connections that sent them left. */
#define ROUTER_MMAP_THRESHOLD_BYTES (128 << 10)

struct main_state {
    struct router *router;
    struct wire_heartbeat *heartbeat; /* the supervisor's liveness check (wire.h) */
    uv_signal_t sigterm, sigint, sighup;
    int signals_open;
    int status;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pagoda-router --run-dir DIR --listen URL [--scheduler URL]...\n"
            "                     [--routing cache-aware|round-robin] [--stats-timeout-ms MS]\n"
            "                     [--log-level debug|info|warn|error] [--contexts N]\n"
            "                     [--max-requests N] [--max-finished N] [--finished-ttl-ms MS]\n"
            "                     [--abandon-ms MS]\n"
            "                     [--max-prompt-tokens N] [--max-new-tokens N]\n"
            "                     [--drain-timeout-ms MS] [--tenants FILE]\n"
            "                     [--admin-timeout-ms MS] [--max-connections N]\n"
            "                     [--idle-timeout-ms MS] [--max-parked N] [--model DIR]\n"
            "                     [--generation-config auto|vllm] [--check]\n"
            "--listen: tcp://HOST:PORT or ipc://PATH (clients' address).\n"
            "--scheduler: a scheduler link, ipc:// or tcp:// (default ipc://DIR/scheduler.ipc);\n"
            "           given several times (at most %u), one engine each (docs/routing.md).\n"
            "--routing: with several engines, cache-aware (the longest cached prefix unless\n"
            "           that engine is much busier; the default) or round-robin.\n"
            "--model: the model's folder; its tokenizer.json and tokenizer_config.json give\n"
            "           text prompts, chats and text output (without it: token ids only);\n"
            "           broken ones stop the router at start (exit status %d).\n"
            "--generation-config: auto (the default): the sampling defaults the model's\n"
            "           generation_config.json recommends (temperature, top_p, top_k, min_p,\n"
            "           repetition_penalty; config.json's without that file) apply to a\n"
            "           request that leaves them out, as vLLM applies them; vllm: they do not\n"
            "           (temperature 1, every filter off).\n"
            "           A file with a value out of range stops the router at start.\n"
            "--check: read the tenants file and the model's tokenizer files, then exit (0, or\n"
            "           the status above); the supervisor runs it before anything starts.\n"
            "--tenants: JSON {\"admin_keys\": [...], \"groups\": [{\"name\",\n"
            "           \"cache_quota_blocks\"}], \"tenants\": [{\"name\", \"api_keys\": [...],\n"
            "           \"group\", \"max_running\", \"max_waiting\", \"cache_quota_blocks\"}],\n"
            "           \"pins\": [{\"name\", \"token_ids\": [...], \"tenants\": [...]}]}\n"
            "           (router/tenants.h); without it every key is the \"default\" tenant\n"
            "           and there is no admin API. An admin call reloads it.\n"
            "--admin-timeout-ms: how long an admin call waits for the scheduler (%u).\n"
            "--stats-timeout-ms: how long a Stats call waits for the schedulers; with several\n"
            "           engines, one that leaves a probe unanswered this long is hung (%u).\n"
            "--contexts: contexts kept free to receive calls beside the parked ones (%u).\n"
            "--max-parked: long polls and stats waiting at once; a poll beyond it is\n"
            "           answered at once with what there is (%u).\n"
            "--max-connections: client connections at once, more are closed as they\n"
            "           arrive; kept %u below the descriptor limit (%u).\n"
            "--idle-timeout-ms: a connection with no call in progress and no complete\n"
            "           message for this long is closed (%u).\n"
            "--abandon-ms: a live request that no call (its Submit, a Poll) has named for\n"
            "           this long is cancelled, its client taken for gone; 0: never (%u).\n"
            "--max-prompt-tokens: lowered to the model's context - 1 once the scheduler\n"
            "           reports it; the largest client message is %u bytes per token + %u.\n",
            ROUTE_MAX_ENGINES, PAGODA_EXIT_CANNOT_RUN, ROUTER_DEFAULT_ADMIN_TIMEOUT_MS,
            ROUTER_DEFAULT_STATS_TIMEOUT_MS, ROUTER_DEFAULT_CONTEXTS,
            ROUTER_DEFAULT_MAX_PARKED_CALLS, ROUTER_RESERVED_FDS, ROUTER_DEFAULT_MAX_CONNECTIONS,
            ROUTER_DEFAULT_IDLE_TIMEOUT_MS, ROUTER_DEFAULT_ABANDON_MS,
            ROUTER_BYTES_PER_PROMPT_TOKEN, ROUTER_MESSAGE_OVERHEAD_BYTES);
}

static int fail(int rc)
{
    char msg[700];
    fprintf(stderr, "pagoda-router: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
    return 1;
}

static void on_signal_closed(uv_handle_t *h)
{
    (void)h;
}

static void stop(struct main_state *st, int status)
{
    st->status = status;
    if (st->signals_open) {
        st->signals_open = 0;
        uv_close((uv_handle_t *)&st->sigterm, on_signal_closed);
        uv_close((uv_handle_t *)&st->sigint, on_signal_closed);
        uv_close((uv_handle_t *)&st->sighup, on_signal_closed);
    }
    router_close(st->router);
    st->router = NULL;
    wire_heartbeat_close(st->heartbeat);
    st->heartbeat = NULL;
}

static void on_drained(void *arg, int drained)
{
    struct main_state *st = arg;
    log_info(drained ? "drained: every request finished, exiting"
                     : "drain timed out: exiting with requests unfinished");
    stop(st, drained ? 0 : 1);
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct main_state *st = h->data;
    static int seen;
    if (seen++ == 0) {
        log_info("signal %d: draining (a second signal stops at once)", signum);
        router_drain(st->router, on_drained, st);
    } else {
        log_warn("signal %d again: stopping now", signum);
        stop(st, 1);
    }
}

static void on_sighup(uv_signal_t *h, int signum)
{
    struct main_state *st = h->data;
    (void)signum;
    if (router_reload(st->router) != 0)
        log_warn("SIGHUP: no reload: %s", pagoda_error_detail());
}

static int parse_u32(const char *flag, const char *text, int64_t min, int64_t max, uint32_t *out)
{
    int64_t v;
    int rc = parse_i64(flag, text, min, max, &v);
    if (rc == 0)
        *out = (uint32_t)v;
    return rc;
}

enum {
    OPT_RUN_DIR = 1000,
    OPT_LISTEN,
    OPT_SCHEDULER,
    OPT_LOG_LEVEL,
    OPT_CONTEXTS,
    OPT_MAX_REQUESTS,
    OPT_MAX_FINISHED,
    OPT_FINISHED_TTL,
    OPT_ABANDON,
    OPT_MAX_PROMPT,
    OPT_MAX_NEW,
    OPT_DRAIN_TIMEOUT,
    OPT_TENANTS,
    OPT_ADMIN_TIMEOUT,
    OPT_MAX_CONNECTIONS,
    OPT_IDLE_TIMEOUT,
    OPT_MAX_PARKED,
    OPT_MODEL,
    OPT_ROUTING,
    OPT_STATS_TIMEOUT,
    OPT_CHECK,
    OPT_GENERATION_CONFIG,
};

/* The --scheduler flags, in order (engine i = the i-th). */
static const char *scheduler_urls[ROUTE_MAX_ENGINES];
/* --model: the folder whose tokenizer files main reads into cfg.text. */
static const char *model_dir;
/* --check: the start's checks only (the tenants file, the tokenizer files), then exit. */
static int check_only;
/* --generation-config vllm: the model's generation_config.json's sampling defaults are not used. */
static int generation_config_vllm;

/* A model folder's file the router cannot take at start (the error, then what to do): the
 * operator's to fix, PAGODA_EXIT_CANNOT_RUN; out of memory is not. */
static int cannot_run(int rc, const char *advice)
{
    if (rc == PAGODA_ENOMEM)
        return fail(rc);
    char why[700];
    fprintf(stderr, "pagoda-router: %s; %s\n", pagoda_error_message(rc, why, sizeof(why)), advice);
    return PAGODA_EXIT_CANNOT_RUN;
}

/* The model's generation_config.json's sampling defaults (config.json's without that file) over
 * sampling_params_default(), checked by the sampler's one definition of the ranges (a file's
 * out-of-range value is the operator's to fix: it would fail every request that leaves the field
 * out). Logs what applies. */
static int load_sampling_defaults(const char *dir, struct sampling_params *out)
{
    struct model_generation_defaults g;
    int rc = model_generation_defaults_load(dir, &g);
    if (rc != 0)
        return rc;
    struct sampling_params s = sampling_params_default();
    char said[256] = "";
    size_t len = 0;
    /* config.json's values are the model's by the fallback alone: one out of the sampler's range
     * is passed over, with a warning (vLLM starts with it), where generation_config.json's stops
     * the start. */
    const int lenient = strcmp(g.file, "config.json") == 0;
#define TAKE(bit, field, fmt, value)                                                               \
    if (g.set & (bit)) {                                                                           \
        struct sampling_params before = s;                                                         \
        s.field = value;                                                                           \
        if (lenient && sampling_params_validate(&s) != 0) {                                        \
            log_warn("%s/config.json: %s: not used as a sampling default", dir,                    \
                     pagoda_error_detail());                                                       \
            s = before;                                                                            \
        } else {                                                                                   \
            len += (size_t)snprintf(said + len, len < sizeof(said) ? sizeof(said) - len : 0,       \
                                    "%s" #field " " fmt, len ? ", " : "", s.field);                \
        }                                                                                          \
    }
    TAKE(MODEL_GEN_TEMPERATURE, temperature, "%g", (float)g.temperature)
    TAKE(MODEL_GEN_TOP_P, top_p, "%g", (float)g.top_p)
    TAKE(MODEL_GEN_TOP_K, top_k, "%d", g.top_k)
    TAKE(MODEL_GEN_MIN_P, min_p, "%g", (float)g.min_p)
    TAKE(MODEL_GEN_REPETITION_PENALTY, repetition_penalty, "%g", (float)g.repetition_penalty)
#undef TAKE
    if ((rc = sampling_params_validate(&s)) != 0) {
        char why[512];
        snprintf(why, sizeof(why), "%s", pagoda_error_detail());
        return pagoda_error_set(rc, "%s/%s: %s", dir, g.file, why);
    }
    if (len > 0)
        log_warn("%s/%s's sampling defaults apply to requests that leave them out "
                 "(--generation-config vllm: not): %s",
                 dir, g.file, said);
    *out = s;
    return 0;
}

static int parse_flag(int opt, const char *arg, struct router_config *cfg)
{
    enum log_level level;
    int rc;
    switch (opt) {
    case OPT_RUN_DIR:
        cfg->run_dir = arg;
        return 0;
    case OPT_LISTEN:
        cfg->listen_url = arg;
        return 0;
    case OPT_SCHEDULER:
        if (cfg->num_scheduler_urls >= ROUTE_MAX_ENGINES)
            return pagoda_error_set(PAGODA_ERANGE, "--scheduler: at most %u engines",
                                    ROUTE_MAX_ENGINES);
        scheduler_urls[cfg->num_scheduler_urls++] = arg;
        cfg->scheduler_urls = scheduler_urls;
        return 0;
    case OPT_STATS_TIMEOUT:
        return parse_u32("--stats-timeout-ms", arg, 1, ROUTER_MAX_STATS_TIMEOUT_MS,
                         &cfg->stats_timeout_ms);
    case OPT_ROUTING: {
        enum route_mode mode;
        if ((rc = route_mode_parse(arg, &mode)) != 0)
            return rc;
        cfg->routing = arg;
        return 0;
    }
    case OPT_LOG_LEVEL:
        if ((rc = log_level_parse(arg, &level)) == 0)
            log_set_level(level);
        return rc;
    case OPT_CONTEXTS:
        return parse_u32("--contexts", arg, 1, 65536, &cfg->num_contexts);
    case OPT_MAX_REQUESTS:
        return parse_u32("--max-requests", arg, 1, 1 << 24, &cfg->max_live_requests);
    case OPT_MAX_FINISHED:
        return parse_u32("--max-finished", arg, 1, 1 << 24, &cfg->max_finished_requests);
    case OPT_FINISHED_TTL:
        return parse_u32("--finished-ttl-ms", arg, 0, UINT32_MAX, &cfg->finished_ttl_ms);
    case OPT_ABANDON:
        return parse_u32("--abandon-ms", arg, 0, UINT32_MAX, &cfg->abandon_ms);
    case OPT_MAX_PROMPT:
        return parse_u32("--max-prompt-tokens", arg, 1, 1 << 24, &cfg->max_prompt_tokens);
    case OPT_MAX_NEW:
        return parse_u32("--max-new-tokens", arg, 1, 1 << 24, &cfg->max_new_tokens);
    case OPT_TENANTS:
        cfg->tenants_file = arg;
        return 0;
    case OPT_MODEL:
        model_dir = arg;
        return 0;
    case OPT_CHECK:
        check_only = 1;
        return 0;
    case OPT_GENERATION_CONFIG:
        if (strcmp(arg, "auto") != 0 && strcmp(arg, "vllm") != 0)
            return pagoda_error_set(PAGODA_EINVAL, "--generation-config: auto or vllm, not '%s'",
                                    arg);
        generation_config_vllm = strcmp(arg, "vllm") == 0;
        return 0;
    case OPT_DRAIN_TIMEOUT:
        return parse_u32("--drain-timeout-ms", arg, 0, UINT32_MAX, &cfg->drain_timeout_ms);
    case OPT_MAX_CONNECTIONS:
        return parse_u32("--max-connections", arg, 1, 1 << 20, &cfg->max_connections);
    case OPT_IDLE_TIMEOUT:
        return parse_u32("--idle-timeout-ms", arg, 1, UINT32_MAX, &cfg->idle_timeout_ms);
    case OPT_MAX_PARKED:
        return parse_u32("--max-parked", arg, 1, ROUTER_MAX_CONTEXTS / 2, &cfg->max_parked_calls);
    case OPT_ADMIN_TIMEOUT:
        return parse_u32("--admin-timeout-ms", arg, 1, ROUTER_MAX_ADMIN_TIMEOUT_MS,
                         &cfg->admin_timeout_ms);
    default:
        return pagoda_error_set(PAGODA_EINVAL, "unknown option (see --help)");
    }
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"run-dir", required_argument, NULL, OPT_RUN_DIR},
        {"listen", required_argument, NULL, OPT_LISTEN},
        {"scheduler", required_argument, NULL, OPT_SCHEDULER},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"contexts", required_argument, NULL, OPT_CONTEXTS},
        {"max-requests", required_argument, NULL, OPT_MAX_REQUESTS},
        {"max-finished", required_argument, NULL, OPT_MAX_FINISHED},
        {"finished-ttl-ms", required_argument, NULL, OPT_FINISHED_TTL},
        {"abandon-ms", required_argument, NULL, OPT_ABANDON},
        {"max-prompt-tokens", required_argument, NULL, OPT_MAX_PROMPT},
        {"max-new-tokens", required_argument, NULL, OPT_MAX_NEW},
        {"drain-timeout-ms", required_argument, NULL, OPT_DRAIN_TIMEOUT},
        {"tenants", required_argument, NULL, OPT_TENANTS},
        {"admin-timeout-ms", required_argument, NULL, OPT_ADMIN_TIMEOUT},
        {"max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS},
        {"idle-timeout-ms", required_argument, NULL, OPT_IDLE_TIMEOUT},
        {"max-parked", required_argument, NULL, OPT_MAX_PARKED},
        {"model", required_argument, NULL, OPT_MODEL},
        {"routing", required_argument, NULL, OPT_ROUTING},
        {"stats-timeout-ms", required_argument, NULL, OPT_STATS_TIMEOUT},
        {"check", no_argument, NULL, OPT_CHECK},
        {"generation-config", required_argument, NULL, OPT_GENERATION_CONFIG},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct router_config cfg;
    router_config_default(&cfg);
    log_set_name("pagoda-router");
    int opt, rc;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        if (opt == 'h') {
            usage(stdout);
            return 0;
        }
        if (opt == '?') {
            usage(stderr);
            return 2;
        }
        if ((rc = parse_flag(opt, optarg, &cfg)) != 0)
            return fail(rc) + 1;
    }
    if (optind != argc || cfg.run_dir == NULL || cfg.listen_url == NULL) {
        usage(stderr);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    /* Every client connection is a descriptor: take all the system allows (the router keeps
     * its connection cap below it). */
    fd_limit_raise();
    mallopt(M_MMAP_THRESHOLD, ROUTER_MMAP_THRESHOLD_BYTES);

    /* libuv sizes its threadpool from the environment at its first use: before the loop. */
    char pool[16];
    snprintf(pool, sizeof(pool), "%u", ROUTER_THREADPOOL_SIZE);
    setenv("UV_THREADPOOL_SIZE", pool, 0); /* one set by the caller is kept */

    /* A tenants file the router cannot take is the operator's to fix, and the router says so
     * with PAGODA_EXIT_CANNOT_RUN: the supervisor then stops a group that is starting, and keeps
     * one that has served (its engines and their requests) while it tries this router again,
     * instead of stopping everything after a few quick exits (a typo left in the file, then the
     * router killed: the whole group went down). router_open reads it again (this is a check). */
    if (cfg.tenants_file != NULL) {
        struct router_tenants *t = NULL;
        if ((rc = router_tenants_load(cfg.tenants_file, &t)) != 0) {
            fail(rc);
            return PAGODA_EXIT_CANNOT_RUN;
        }
        router_tenants_free(t);
    }
    /* The model's tokenizer files likewise (docs/text.md): a folder whose tokenizer.json or
     * tokenizer_config.json is broken fails the start, naming the file and the cause, rather than
     * a router that starts healthy and refuses every text and chat request. Read here, before the
     * loop runs, and handed to the router. A folder without them serves token ids only. */
    if (model_dir != NULL && model_dir[0] != '\0' &&
        (rc = router_text_load(model_dir, &cfg.text)) != 0) {
        return cannot_run(rc, "the model's tokenizer files cannot be served: fix the file (a "
                              "model folder without tokenizer.json serves token ids only)");
    }
    if (model_dir != NULL && model_dir[0] != '\0' && !generation_config_vllm &&
        (rc = load_sampling_defaults(model_dir, &cfg.sampling_defaults)) != 0) {
        router_text_free(cfg.text);
        return cannot_run(rc, "fix the file (--generation-config vllm leaves its sampling "
                              "values unused; the engines read its eos_token_id either way)");
    }
    if (check_only) {
        router_text_free(cfg.text);
        return 0;
    }

    uv_loop_t loop;
    if (uv_loop_init(&loop) != 0) {
        router_text_free(cfg.text);
        return fail(pagoda_error_set(PAGODA_EIO, "uv_loop_init failed"));
    }
    struct main_state st = {.status = 0};
    if ((rc = router_open(&loop, &cfg, &st.router)) != 0) {
        router_text_free(cfg.text);
        int status = fail(rc);
        uv_run(&loop, UV_RUN_DEFAULT); /* lets the partly built router close its handles */
        uv_loop_close(&loop);
        return status;
    }
    uv_signal_init(&loop, &st.sigterm);
    uv_signal_init(&loop, &st.sigint);
    st.sigterm.data = st.sigint.data = &st;
    uv_signal_start(&st.sigterm, on_signal, SIGTERM);
    uv_signal_start(&st.sigint, on_signal, SIGINT);
    uv_signal_init(&loop, &st.sighup);
    st.sighup.data = &st;
    uv_signal_start(&st.sighup, on_sighup, SIGHUP);
    st.signals_open = 1;
    log_info("listening on %s", cfg.listen_url);
    if ((rc = wire_control_ready(cfg.run_dir, "router")) != 0)
        log_debug("no supervisor told of readiness: %s", pagoda_error_detail());
    if ((rc = wire_heartbeat_open(cfg.run_dir, "router", &st.heartbeat)) != 0 ||
        (rc = wire_heartbeat_start(st.heartbeat, &loop)) != 0)
        log_warn("no heartbeat to the supervisor: %s", pagoda_error_detail());

    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0)
        log_warn("the loop still had handles at exit");
    return st.status;
}
