/* pagoda-gateway: the OpenAI-compatible HTTP front (gateway/gateway.h) of a pagoda group.
 *
 *   pagoda-gateway --run-dir DIR --router URL --listen HOST:PORT [--model-name NAME]
 *                  [--stats-key KEY] [--max-connections N] [--max-requests N]
 *                  [--max-body-bytes N] [--max-body-memory N] [--max-write-memory N]
 *                  [--request-timeout-ms MS] [--idle-timeout-ms MS]
 *                  [--default-max-tokens N] [--allowed-origins LIST]
 *                  [--tool-call-parser hermes|llama3_json] [--log-level L]
 *
 * SIGTERM or SIGINT stops it: the listener closes and every request in progress is cancelled in
 * the router (its client gets the connection closed). Under the supervisor (DIR given) it says
 * when it is ready and sends heartbeats, as every program of the group does. */
#include "common/error.h"
#include "common/log.h"
#include "common/parse.h"
#include "gateway/gateway.h"
#include "wire/wire.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

struct main_state {
    struct gateway *gateway;
    struct wire_heartbeat *heartbeat;
    uv_signal_t sigterm, sigint;
    int signals_open;
};

static void usage(FILE *f)
{
    fprintf(f,
            "usage: pagoda-gateway --router URL --listen HOST:PORT [--run-dir DIR]\n"
            "                      [--model-name NAME] [--stats-key KEY]\n"
            "                      [--max-connections N] [--max-requests N] [--max-body-bytes N]\n"
            "                      [--max-body-memory N] [--max-write-memory N]\n"
            "                      [--request-timeout-ms MS] [--idle-timeout-ms MS]\n"
            "                      [--default-max-tokens N] [--allowed-origins LIST]\n"
            "                      [--tool-call-parser hermes|llama3_json]\n"
            "                      [--log-level debug|info|warn|error]\n"
            "Serves OpenAI's API (POST /v1/completions, /v1/chat/completions; GET /v1/models,\n"
            "/health, /ping, /version, /metrics, and a status page at /) for the router at URL.\n"
            "--model-name: the model's id in /v1/models and responses (default \"pagoda\").\n"
            "--stats-key: the API key /metrics asks the router's Stats with (an admin key when\n"
            "           the router has a tenants file; an admin key also gives the per-tenant\n"
            "           series pagoda_tenant_*{tenant=...}).\n"
            "--max-requests: generations in progress at once; more get 429 (%u).\n"
            "--max-body-memory: bytes of request bodies held at once while they arrive,\n"
            "           and again while they wait to be parsed; a body that would pass it gets\n"
            "           503 (256 MiB, or 4 x --max-body-bytes if that is more; at least\n"
            "           --max-body-bytes if given).\n"
            "--max-write-memory: bytes of responses held for clients that have not read them\n"
            "           yet, every connection together; past it the clients stalled longest\n"
            "           are disconnected (256 MiB).\n"
            "--default-max-tokens: a chat completion without max_tokens (%d).\n"
            "--allowed-origins: CORS, the origins whose web pages may call the API from a\n"
            "           browser: '*' any (vLLM's default), or a comma-separated list\n"
            "           (https://a.example,http://b.example:8080); none unless given.\n"
            "--tool-call-parser: parse tool calls out of chats that give tools with\n"
            "           tool_choice auto (OpenAI's default with tools) into message.tool_calls\n"
            "           and stream deltas, finish_reason tool_calls (vLLM's\n"
            "           --enable-auto-tool-choice --tool-call-parser): hermes (Hermes, Qwen 2.5\n"
            "           and 3: <tool_call>{\"name\", \"arguments\"}</tool_call>) or llama3_json\n"
            "           (Llama 3.1 and later: {\"name\", \"parameters\"}, several separated\n"
            "           by ';'); without it such chats get 400. tool_choice required, or\n"
            "           naming a function, is refused either way.\n",
            GATEWAY_DEFAULT_MAX_REQUESTS, GATEWAY_DEFAULT_MAX_TOKENS);
}

static int fail(int rc)
{
    char msg[700];
    fprintf(stderr, "pagoda-gateway: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
    return 1;
}

static void on_signal_closed(uv_handle_t *h)
{
    (void)h;
}

static void on_signal(uv_signal_t *h, int signum)
{
    struct main_state *st = h->data;
    log_info("signal %d: stopping", signum);
    if (st->signals_open) {
        st->signals_open = 0;
        uv_close((uv_handle_t *)&st->sigterm, on_signal_closed);
        uv_close((uv_handle_t *)&st->sigint, on_signal_closed);
    }
    gateway_close(st->gateway);
    st->gateway = NULL;
    wire_heartbeat_close(st->heartbeat);
    st->heartbeat = NULL;
}

/* HOST:PORT, the host an IPv4 address or a name libuv resolves: split into cfg. */
static int parse_listen(const char *arg, struct gateway_config *cfg, char *host, size_t host_len)
{
    const char *colon = strrchr(arg, ':');
    if (colon == NULL || colon == arg || (size_t)(colon - arg) >= host_len)
        return pagoda_error_set(PAGODA_EINVAL, "--listen %s: expected HOST:PORT", arg);
    memcpy(host, arg, (size_t)(colon - arg));
    host[colon - arg] = '\0';
    int64_t port;
    int rc = parse_i64("--listen port", colon + 1, 0, 65535, &port);
    if (rc != 0)
        return rc;
    cfg->http.host = host;
    cfg->http.port = (uint16_t)port;
    return 0;
}

enum {
    OPT_RUN_DIR = 1000,
    OPT_ROUTER,
    OPT_LISTEN,
    OPT_MODEL_NAME,
    OPT_STATS_KEY,
    OPT_MAX_CONNECTIONS,
    OPT_MAX_REQUESTS,
    OPT_MAX_BODY,
    OPT_MAX_BODY_MEMORY,
    OPT_MAX_WRITE_MEMORY,
    OPT_REQUEST_TIMEOUT,
    OPT_IDLE_TIMEOUT,
    OPT_DEFAULT_MAX_TOKENS,
    OPT_ALLOWED_ORIGINS,
    OPT_TOOL_CALL_PARSER,
    OPT_LOG_LEVEL,
};

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"run-dir", required_argument, NULL, OPT_RUN_DIR},
        {"router", required_argument, NULL, OPT_ROUTER},
        {"listen", required_argument, NULL, OPT_LISTEN},
        {"model-name", required_argument, NULL, OPT_MODEL_NAME},
        {"stats-key", required_argument, NULL, OPT_STATS_KEY},
        {"max-connections", required_argument, NULL, OPT_MAX_CONNECTIONS},
        {"max-requests", required_argument, NULL, OPT_MAX_REQUESTS},
        {"max-body-bytes", required_argument, NULL, OPT_MAX_BODY},
        {"max-body-memory", required_argument, NULL, OPT_MAX_BODY_MEMORY},
        {"max-write-memory", required_argument, NULL, OPT_MAX_WRITE_MEMORY},
        {"request-timeout-ms", required_argument, NULL, OPT_REQUEST_TIMEOUT},
        {"idle-timeout-ms", required_argument, NULL, OPT_IDLE_TIMEOUT},
        {"default-max-tokens", required_argument, NULL, OPT_DEFAULT_MAX_TOKENS},
        {"allowed-origins", required_argument, NULL, OPT_ALLOWED_ORIGINS},
        {"tool-call-parser", required_argument, NULL, OPT_TOOL_CALL_PARSER},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    struct gateway_config cfg;
    gateway_config_default(&cfg);
    /* A hang-up (SIGHUP: a closed terminal, or an operator's "reload") would kill it by default;
     * the group's programs stop on SIGTERM and SIGINT only (the router's SIGHUP reloads). */
    signal(SIGHUP, SIG_IGN);
    log_set_name("pagoda-gateway");
    const char *run_dir = NULL, *listen = NULL;
    char host[256];
    int opt, rc = 0, body_memory_given = 0;
    int64_t v;
    while ((opt = getopt_long(argc, argv, "", longopts, NULL)) != -1) {
        switch (opt) {
        case 'h':
            usage(stdout);
            return 0;
        case OPT_RUN_DIR:
            run_dir = optarg;
            break;
        case OPT_ROUTER:
            cfg.router_url = optarg;
            break;
        case OPT_LISTEN:
            listen = optarg;
            rc = parse_listen(optarg, &cfg, host, sizeof(host));
            break;
        case OPT_MODEL_NAME:
            cfg.model_name = optarg;
            break;
        case OPT_STATS_KEY:
            cfg.stats_key = optarg;
            break;
        case OPT_MAX_CONNECTIONS:
            if ((rc = parse_i64("--max-connections", optarg, 1, 1 << 20, &v)) == 0)
                cfg.http.max_connections = (uint32_t)v;
            break;
        case OPT_MAX_REQUESTS:
            if ((rc = parse_i64("--max-requests", optarg, 1, 1 << 20, &v)) == 0)
                cfg.max_requests = (uint32_t)v;
            break;
        case OPT_MAX_BODY:
            if ((rc = parse_i64("--max-body-bytes", optarg, 1, 1 << 30, &v)) == 0)
                cfg.http.max_body_bytes = (size_t)v;
            break;
        case OPT_MAX_BODY_MEMORY:
            if ((rc = parse_i64("--max-body-memory", optarg, 1, INT64_MAX / 4, &v)) == 0) {
                cfg.http.max_body_memory = (size_t)v;
                body_memory_given = 1;
            }
            break;
        case OPT_MAX_WRITE_MEMORY:
            if ((rc = parse_i64("--max-write-memory", optarg, 1, INT64_MAX / 4, &v)) == 0)
                cfg.http.max_write_memory = (size_t)v;
            break;
        case OPT_REQUEST_TIMEOUT:
            if ((rc = parse_i64("--request-timeout-ms", optarg, 1, UINT32_MAX, &v)) == 0)
                cfg.http.request_timeout_ms = (uint32_t)v;
            break;
        case OPT_IDLE_TIMEOUT:
            if ((rc = parse_i64("--idle-timeout-ms", optarg, 1, UINT32_MAX, &v)) == 0)
                cfg.http.idle_timeout_ms = (uint32_t)v;
            break;
        case OPT_DEFAULT_MAX_TOKENS:
            if ((rc = parse_i64("--default-max-tokens", optarg, 1, INT32_MAX, &v)) == 0)
                cfg.default_max_tokens = (int32_t)v;
            break;
        case OPT_ALLOWED_ORIGINS:
            cfg.http.allowed_origins = optarg;
            break;
        case OPT_TOOL_CALL_PARSER:
            rc = tool_call_parser_from_name(optarg, &cfg.tool_call_parser);
            break;
        case OPT_LOG_LEVEL: {
            enum log_level level;
            if ((rc = log_level_parse(optarg, &level)) == 0)
                log_set_level(level);
            break;
        }
        default:
            usage(stderr);
            return 2;
        }
        if (rc != 0)
            return fail(rc) + 1;
    }
    if (optind != argc || cfg.router_url == NULL || listen == NULL) {
        usage(stderr);
        return 2;
    }
    /* (a larger --max-body-bytes alone keeps room for four such bodies at once) */
    if (!body_memory_given && cfg.http.max_body_memory < 4 * cfg.http.max_body_bytes)
        cfg.http.max_body_memory = 4 * cfg.http.max_body_bytes;
    signal(SIGPIPE, SIG_IGN);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    uv_loop_t loop;
    if (uv_loop_init(&loop) != 0)
        return fail(pagoda_error_set(PAGODA_EIO, "uv_loop_init failed"));
    struct main_state st = {0};
    if ((rc = gateway_open(&loop, &cfg, &st.gateway)) != 0) {
        int status = fail(rc);
        uv_run(&loop, UV_RUN_DEFAULT);
        uv_loop_close(&loop);
        return status;
    }
    uv_signal_init(&loop, &st.sigterm);
    uv_signal_init(&loop, &st.sigint);
    st.sigterm.data = st.sigint.data = &st;
    uv_signal_start(&st.sigterm, on_signal, SIGTERM);
    uv_signal_start(&st.sigint, on_signal, SIGINT);
    st.signals_open = 1;
    log_info("serving OpenAI's API on http://%s:%u for %s", cfg.http.host,
             (unsigned)gateway_port(st.gateway), cfg.router_url);
    if (run_dir != NULL) {
        if (wire_control_ready(run_dir, "gateway") != 0)
            log_debug("no supervisor told of readiness: %s", pagoda_error_detail());
        if (wire_heartbeat_open(run_dir, "gateway", &st.heartbeat) != 0 ||
            wire_heartbeat_start(st.heartbeat, &loop) != 0)
            log_warn("no heartbeat to the supervisor: %s", pagoda_error_detail());
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&loop) != 0)
        log_warn("the loop still had handles at exit");
    return 0;
}
