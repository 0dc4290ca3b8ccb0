#include "gateway/openai.h"

#include "common/error.h"
#include "text/output_text.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- errors ------------------------------------------------------------------------------ */

static int bad(struct openai_error *err, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int bad(struct openai_error *err, const char *code, const char *fmt, ...)
{
    err->status = 400;
    err->type = "invalid_request_error";
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof(err->message), fmt, ap);
    va_end(ap);
    return -1;
}

void openai_error_from_code(int code, const char *detail, struct openai_error *err)
{
    err->code = NULL;
    switch (code) {
    case PAGODA_EPERM:
        err->status = 401;
        err->type = "authentication_error";
        err->code = "invalid_api_key";
        break;
    case PAGODA_ENOENT:
        err->status = 404;
        err->type = "not_found_error";
        break;
    case PAGODA_EEXHAUSTED:
    case PAGODA_EBUSY:
        err->status = 429;
        err->type = "rate_limit_error";
        break;
    case PAGODA_ECLOSED:
    case PAGODA_ETIMEDOUT:
    case PAGODA_EIO:
        err->status = 503;
        err->type = "service_unavailable_error";
        break;
    case PAGODA_EINVAL:
    case PAGODA_ERANGE:
    case PAGODA_EUNSUPPORTED:
    case PAGODA_EFORMAT:
    case PAGODA_EEXIST:
        err->status = 400;
        err->type = "invalid_request_error";
        break;
    default:
        err->status = 500;
        err->type = "internal_server_error";
    }
    snprintf(err->message, sizeof(err->message), "%s",
             detail && detail[0] ? detail : pagoda_strerror(code));
}

/* An error's message as a JSON string. A message cut to fit err->message (snprintf) may end in
 * part of a character: that tail (1 to 3 bytes) is left out. A message still not UTF-8 is said to
 * be so, and the error keeps its type and code. */
static json_t *message_json(const char *m)
{
    size_t n = strlen(m);
    for (size_t cut = 0; cut <= 3 && cut <= n; cut++) {
        json_t *j = json_stringn(m, n - cut);
        if (j != NULL)
            return j;
    }
    return json_string("(unprintable error)");
}

char *openai_error_json(const struct openai_error *err)
{
    json_t *e =
        json_pack("{s:{s:o,s:s,s:n,s:o}}", "error", "message", message_json(err->message), "type",
                  err->type, "param", "code", err->code ? json_string(err->code) : json_null());
    char *s = e ? json_dumps(e, JSON_COMPACT) : NULL;
    json_decref(e);
    return s;
}

/* ---- request parsing ---------------------------------------------------------------------- */

static char *own(struct openai_request *req, char *s)
{
    if (s == NULL)
        return NULL;
    char **o = realloc(req->owned, (req->num_owned + 1) * sizeof(*o));
    if (o == NULL) {
        free(s);
        return NULL;
    }
    req->owned = o;
    o[req->num_owned++] = s;
    return s;
}

/* A number field within [lo, hi], or the default when absent or null. */
/* Numbers are read as vLLM's pydantic models read them (lax mode): a number may come as a string
 * of one ("0.5"), an integer as a real without a fraction (5.0, which Python's json writes for a
 * computed float) or a string of one ("5"). Whether v holds a number, into *out. */
static bool lax_number(const json_t *v, double *out)
{
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return true;
    }
    if (!json_is_string(v) || json_string_length(v) == 0)
        return false;
    /* a decimal number only, as JSON writes one with an optional sign (not strtod's "0x10",
     * "inf" or "nan") */
    const char *s = json_string_value(v);
    size_t i = s[0] == '-' || s[0] == '+', digits = 0;
    while (isdigit((unsigned char)s[i]) || s[i] == '.' || s[i] == 'e' || s[i] == 'E' ||
           ((s[i] == '-' || s[i] == '+') && (s[i - 1] == 'e' || s[i - 1] == 'E')))
        digits += isdigit((unsigned char)s[i++]) != 0;
    if (digits == 0 || i != json_string_length(v))
        return false;
    char *end;
    *out = strtod(s, &end);
    return end == s + i;
}

/* Whether v holds an integer (lax_number), into *out. */
static bool lax_integer(const json_t *v, long long *out)
{
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return true;
    }
    if (json_is_string(v) && json_string_length(v) > 0) {
        const char *s = json_string_value(v);
        char *end;
        errno = 0;
        *out = strtoll(s, &end, 10);
        return errno == 0 && end == s + json_string_length(v) && !isspace((unsigned char)s[0]);
    }
    double d;
    if (!json_is_real(v) || !lax_number(v, &d) || d != floor(d) || !(fabs(d) < 0x1p63))
        return false;
    *out = (long long)d;
    return true;
}

static int number(const json_t *root, const char *key, double lo, double hi, double *out,
                  struct openai_error *err)
{
    const json_t *v = json_object_get(root, key);
    if (v == NULL || json_is_null(v))
        return 0;
    double d;
    if (!lax_number(v, &d))
        return bad(err, "invalid_type", "'%s' must be a number", key);
    if (!(d >= lo && d <= hi))
        return bad(err, "invalid_value", "'%s' is %g; it must be in [%g, %g]", key, d, lo, hi);
    *out = d;
    return 0;
}

static int integer(const json_t *root, const char *key, long long lo, long long hi, long long *out,
                   struct openai_error *err)
{
    const json_t *v = json_object_get(root, key);
    if (v == NULL || json_is_null(v))
        return 0;
    long long n;
    if (!lax_integer(v, &n))
        return bad(err, "invalid_type", "'%s' must be an integer", key);
    if (n < lo || n > hi)
        return bad(err, "invalid_value", "'%s' is %lld; it must be in [%lld, %lld]", key, n, lo,
                   hi);
    *out = n;
    return 0;
}

static int boolean(const json_t *root, const char *key, bool *out, struct openai_error *err)
{
    const json_t *v = json_object_get(root, key);
    if (v == NULL || json_is_null(v))
        return 0;
    if (!json_is_boolean(v))
        return bad(err, "invalid_type", "'%s' must be true or false", key);
    *out = json_is_true(v);
    return 0;
}

/* The sampling and stop fields both endpoints share. */
static int read_common(struct openai_request *req, struct openai_error *err)
{
    const json_t *root = req->root;
    pagoda_generate_params *p = &req->params;
    const json_t *model = json_object_get(root, "model");
    if (model != NULL && !json_is_null(model)) {
        if (!json_is_string(model))
            return bad(err, "invalid_type", "'model' must be a string");
        req->model = strdup(json_string_value(model));
    }
    double d;
    long long n;
    /* What the request leaves out (or null) is the model's to choose: its generation_config.json's
     * recommendation where it gives one (the router's --generation-config auto, as vLLM), else
     * the defaults below. */
    static const struct {
        const char *key;
        unsigned bit;
    } model_fields[] = {
        {"temperature", PAGODA_PARAM_TEMPERATURE},
        {"top_p", PAGODA_PARAM_TOP_P},
        {"top_k", PAGODA_PARAM_TOP_K},
        {"min_p", PAGODA_PARAM_MIN_P},
        {"repetition_penalty", PAGODA_PARAM_REPETITION_PENALTY},
    };
    p->model_defaults = 0;
    for (size_t i = 0; i < sizeof(model_fields) / sizeof(model_fields[0]); i++) {
        const json_t *v = json_object_get(root, model_fields[i].key);
        if (v == NULL || json_is_null(v))
            p->model_defaults |= model_fields[i].bit;
    }
    d = 1.0;
    if (number(root, "temperature", 0, 100, &d, err))
        return -1;
    if (d != 0 && (float)d == 0) /* a float's 0 would decode greedily: refused as too small */
        return bad(err, "invalid_value",
                   "'temperature' %g is too small: 0 (greedy) or at least 1e-06", d);
    p->temperature = (float)d;
    d = 1.0;
    if (number(root, "top_p", 0, 1, &d, err))
        return -1;
    if (d <= 0)
        return bad(err, "invalid_value", "'top_p' must be in (0, 1]");
    p->top_p = (float)d;
    n = 0;
    if (integer(root, "top_k", -1, INT32_MAX, &n, err))
        return -1;
    p->top_k = n < 0 ? 0 : (int32_t)n; /* vLLM: -1 means off */
    d = 0;
    if (number(root, "min_p", 0, 1, &d, err))
        return -1;
    p->min_p = (float)d;
    d = 0;
    if (number(root, "presence_penalty", -2, 2, &d, err))
        return -1;
    p->presence_penalty = (float)d;
    d = 0;
    if (number(root, "frequency_penalty", -2, 2, &d, err))
        return -1;
    p->frequency_penalty = (float)d;
    d = 1;
    if (number(root, "repetition_penalty", 0.01, 100, &d, err))
        return -1;
    p->repetition_penalty = (float)d;
    const json_t *seed = json_object_get(root, "seed");
    if (seed != NULL && !json_is_null(seed)) {
        if (!lax_integer(seed, &n))
            return bad(err, "invalid_type", "'seed' must be an integer");
        p->has_seed = 1;
        p->seed = (uint64_t)n;
    }
    n = -1;
    if (integer(root, "max_completion_tokens", 1, INT32_MAX, &n, err) ||
        (n < 0 && integer(root, "max_tokens", 1, INT32_MAX, &n, err)))
        return -1;
    if (n > 0) {
        p->max_tokens = (int32_t)n;
        p->strict_max_tokens = 1; /* given: refused past the context (the default fits) */
    }
    /* n choices, each a request of its own to the router (the prompt's cache shared); best_of,
     * which vLLM no longer takes, only equal to n. */
    n = 1;
    if (integer(root, "n", 1, OPENAI_MAX_CHOICES, &n, err))
        return -1;
    req->n = (uint32_t)n;
    const json_t *best = json_object_get(root, "best_of");
    if (best != NULL && !json_is_null(best) && !(lax_integer(best, &n) && n == (long long)req->n))
        return bad(err, "unsupported", "'best_of' must equal n (%u): it is not supported",
                   (unsigned)req->n);
    bool b = false;
    if (boolean(root, "echo", &b, err))
        return -1;
    if (b)
        return bad(err, "unsupported", "'echo' is not supported");
    bool ignore_eos = false;
    if (boolean(root, "ignore_eos", &ignore_eos, err))
        return -1;
    p->ignore_eos = ignore_eos;
    bool skip = true;
    if (boolean(root, "skip_special_tokens", &skip, err))
        return -1;
    p->skip_special_tokens = skip;
    bool keep = false;
    if (boolean(root, "include_stop_str_in_output", &keep, err))
        return -1;
    p->include_stop_str_in_output = keep;
    if (boolean(root, "stream", &req->stream, err) ||
        boolean(root, "return_tokens_as_token_ids", &req->tokens_as_ids, err))
        return -1;
    const json_t *so = json_object_get(root, "stream_options");
    if (so != NULL && !json_is_null(so)) {
        if (!json_is_object(so))
            return bad(err, "invalid_type", "'stream_options' must be an object");
        if (boolean(so, "include_usage", &req->include_usage, err))
            return -1;
    }
    /* stop: a string or a list of strings, each at most OUTPUT_TEXT_MAX_STOP_BYTES (the router's
     * limit, checked here too: each choice of a list of prompts carries every stop string). */
    const json_t *stop = json_object_get(root, "stop");
    if (json_is_string(stop)) {
        if (json_string_length(stop) > OUTPUT_TEXT_MAX_STOP_BYTES)
            return bad(err, "invalid_value", "'stop' is longer than %u bytes",
                       OUTPUT_TEXT_MAX_STOP_BYTES);
        if ((req->stops[0] = strdup(json_string_value(stop))) == NULL)
            return bad(err, NULL, "out of memory");
        p->num_stop = 1;
    } else if (json_is_array(stop)) {
        if (json_array_size(stop) > OPENAI_MAX_STOPS)
            return bad(err, "invalid_value", "'stop' has %zu strings, more than %u",
                       json_array_size(stop), OPENAI_MAX_STOPS);
        size_t i;
        const json_t *s;
        json_array_foreach(stop, i, s)
        {
            if (!json_is_string(s))
                return bad(err, "invalid_type", "'stop' must hold strings");
            if (json_string_length(s) > OUTPUT_TEXT_MAX_STOP_BYTES)
                return bad(err, "invalid_value", "'stop' %zu is longer than %u bytes", i,
                           OUTPUT_TEXT_MAX_STOP_BYTES);
            if ((req->stops[i] = strdup(json_string_value(s))) == NULL)
                return bad(err, NULL, "out of memory");
            p->num_stop = i + 1;
        }
    } else if (stop != NULL && !json_is_null(stop)) {
        return bad(err, "invalid_type", "'stop' must be a string or a list of strings");
    }
    p->stop = (const char *const *)req->stops;
    const json_t *ids = json_object_get(root, "stop_token_ids");
    if (json_is_array(ids)) {
        if (json_array_size(ids) > OPENAI_MAX_STOP_TOKEN_IDS)
            return bad(err, "invalid_value", "'stop_token_ids' has more than %u ids",
                       OPENAI_MAX_STOP_TOKEN_IDS);
        size_t i;
        const json_t *v;
        json_array_foreach(ids, i, v)
        {
            if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                json_integer_value(v) > INT32_MAX)
                return bad(err, "invalid_type", "'stop_token_ids' must hold token ids");
            req->stop_ids[i] = (int32_t)json_integer_value(v);
        }
        p->stop_token_ids = req->stop_ids;
        p->num_stop_token_ids = json_array_size(ids);
    } else if (ids != NULL && !json_is_null(ids)) {
        return bad(err, "invalid_type", "'stop_token_ids' must be a list");
    }
    const json_t *ast = json_object_get(root, "add_special_tokens");
    if (ast != NULL && !json_is_null(ast)) {
        if (!json_is_boolean(ast))
            return bad(err, "invalid_type", "'add_special_tokens' must be true or false");
        req->prompt.add_special_tokens = json_is_true(ast);
    }
    return 0;
}

/* One prompt: a string (empty only for /tokenize, whose ids are then the BOS) or a non-empty list
 * of token ids, into *out; the ids are written at ids (json_array_size(pr) of them). which names
 * it in errors ("'prompt'" or "'prompt' 3"). */
static int read_one_prompt(const struct openai_request *req, const json_t *pr, int32_t *ids,
                           pagoda_prompt *out, const char *which, struct openai_error *err)
{
    if (json_is_string(pr)) {
        if (json_string_length(pr) == 0 && req->kind != OPENAI_TOKENIZE) /* tokenized: [BOS] */
            return bad(err, "invalid_value", "%s is empty", which);
        out->text = json_string_value(pr);
        return 0;
    }
    if (!json_is_array(pr) || json_array_size(pr) == 0)
        return bad(err, "invalid_value", "%s must be a non-empty string or list of token ids",
                   which);
    size_t i;
    const json_t *v;
    json_array_foreach(pr, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return bad(err, "invalid_type", "%s token %zu is not a token id", which, i);
        ids[i] = (int32_t)json_integer_value(v);
    }
    out->token_ids = ids;
    out->num_token_ids = json_array_size(pr);
    return 0;
}

/* The prompt of /v1/completions (and /tokenize's text): a string, a list of token ids, or (a
 * completion's) a list of up to OPENAI_MAX_PROMPTS of either, all strings or all id lists; the
 * ids of every prompt in one array (prompt_ids). */
static int read_prompt(struct openai_request *req, struct openai_error *err)
{
    const json_t *pr = json_object_get(req->root, "prompt");
    req->num_prompts = 1;
    const json_t *first = json_array_get(pr, 0);
    if (!json_is_array(pr) || !(json_is_string(first) || json_is_array(first))) {
        size_t n = json_is_array(pr) ? json_array_size(pr) : 0;
        if ((req->prompt_ids = malloc((n ? n : 1) * sizeof(int32_t))) == NULL)
            return bad(err, NULL, "out of memory");
        return read_one_prompt(req, pr, req->prompt_ids, &req->prompt, "'prompt'", err);
    }
    /* a list of prompts */
    const size_t n = json_array_size(pr);
    if (n > 1 && req->kind != OPENAI_COMPLETION)
        return bad(err, "unsupported", "'prompt' as a list of %zu prompts: send one", n);
    if (n > OPENAI_MAX_PROMPTS)
        return bad(err, "invalid_value", "'prompt' is a list of %zu prompts, more than %u", n,
                   OPENAI_MAX_PROMPTS);
    size_t total = 0, i;
    const json_t *v;
    json_array_foreach(pr, i, v)
    {
        if (json_is_string(v) != json_is_string(first) || json_is_array(v) != json_is_array(first))
            return bad(err, "invalid_type",
                       "'prompt' %zu: a list of prompts holds strings or lists of token ids, "
                       "not both",
                       i);
        total += json_is_array(v) ? json_array_size(v) : 0;
    }
    if ((req->prompt_ids = malloc((total ? total : 1) * sizeof(int32_t))) == NULL ||
        (n > 1 && (req->more_prompts = malloc((n - 1) * sizeof(pagoda_prompt))) == NULL))
        return bad(err, NULL, "out of memory");
    size_t at = 0;
    json_array_foreach(pr, i, v)
    {
        pagoda_prompt *out = i == 0 ? &req->prompt : &req->more_prompts[i - 1];
        if (i > 0)
            *out = req->prompt; /* its fields (add_special_tokens) as the first's */
        out->text = NULL;
        out->token_ids = NULL;
        out->num_token_ids = 0;
        char which[48] = "'prompt'";
        if (n > 1)
            snprintf(which, sizeof(which), "'prompt' %zu", i);
        if (read_one_prompt(req, v, req->prompt_ids + at, out, which, err) != 0)
            return -1;
        at += out->num_token_ids;
    }
    req->num_prompts = (uint32_t)n;
    return 0;
}

/* A chat message's content: a string, null, or a list of text parts, joined with "\n" as vLLM
 * joins them (before the forty-first session with nothing between). */
static int read_content(struct openai_request *req, const json_t *c, size_t i, const char **out,
                        struct openai_error *err)
{
    if (c == NULL || json_is_null(c)) {
        *out = NULL;
        return 0;
    }
    if (json_is_string(c)) {
        *out = json_string_value(c);
        return 0;
    }
    if (!json_is_array(c))
        return bad(err, "invalid_type", "messages[%zu].content must be a string or a list", i);
    size_t len = 0, k;
    const json_t *part;
    json_array_foreach(c, k, part)
    {
        const char *type = json_string_value(json_object_get(part, "type"));
        const json_t *text = json_object_get(part, "text");
        if (type == NULL || strcmp(type, "text") != 0 || !json_is_string(text))
            return bad(err, "unsupported",
                       "messages[%zu].content[%zu]: only {\"type\": \"text\", \"text\": ...} "
                       "parts are supported",
                       i, k);
        len += json_string_length(text) + 1;
    }
    char *joined = own(req, malloc(len + 1));
    if (joined == NULL)
        return bad(err, NULL, "out of memory");
    size_t at = 0;
    json_array_foreach(c, k, part)
    {
        const json_t *text = json_object_get(part, "text");
        if (k > 0)
            joined[at++] = '\n';
        memcpy(joined + at, json_string_value(text), json_string_length(text));
        at += json_string_length(text);
    }
    joined[at] = '\0';
    *out = joined;
    return 0;
}

static int read_messages(struct openai_request *req, struct openai_error *err)
{
    const json_t *ms = json_object_get(req->root, "messages");
    if (!json_is_array(ms) || json_array_size(ms) == 0)
        return bad(err, "invalid_value", "'messages' must be a non-empty list");
    size_t n = json_array_size(ms);
    if (n > OPENAI_MAX_MESSAGES)
        return bad(err, "invalid_value", "%zu messages, more than %u", n, OPENAI_MAX_MESSAGES);
    if ((req->messages = calloc(n, sizeof(*req->messages))) == NULL)
        return bad(err, NULL, "out of memory");
    size_t i;
    const json_t *m;
    json_array_foreach(ms, i, m)
    {
        pagoda_chat_message *out = &req->messages[i];
        if (!json_is_object(m))
            return bad(err, "invalid_type", "messages[%zu] must be an object", i);
        out->role = json_string_value(json_object_get(m, "role"));
        if (out->role == NULL)
            return bad(err, "invalid_value", "messages[%zu] needs a string 'role'", i);
        const json_t *content = json_object_get(m, "content");
        if (read_content(req, content, i, &out->content, err))
            return -1;
        /* A null or absent content (an assistant's tool-call turn, as OpenAI's clients send it
         * back) is "" to the template, as vLLM renders it: "None" printed, or a template's
         * `'...' + message.content` failing (Qwen2.5's), is what transformers would do with a
         * null, not what a client moving from vLLM expects (docs/chat-templates.md). */
        if (out->content == NULL)
            out->content = "";
        out->name = json_string_value(json_object_get(m, "name"));
        out->tool_call_id = json_string_value(json_object_get(m, "tool_call_id"));
        out->reasoning_content = json_string_value(json_object_get(m, "reasoning_content"));
        const json_t *calls = json_object_get(m, "tool_calls");
        /* An empty list (vLLM's answers carry "tool_calls": [], and clients send them back) is
         * left out, as vLLM leaves it out: a template would take the turn for a tool call's
         * (Llama 3.1's refused it, "only supports single tool-calls at once"). */
        if (json_is_array(calls) && json_array_size(calls) > 0) {
            /* OpenAI sends arguments as a JSON string; templates iterate them as objects. As
             * vLLM's, arguments that are empty, null or absent are {}, and a string of any JSON
             * value is that value ("null" is null). */
            json_t *copy = json_deep_copy(calls);
            size_t k;
            json_t *call;
            json_array_foreach(copy, k, call)
            {
                json_t *fn = json_object_get(call, "function");
                if (!json_is_object(fn))
                    continue;
                const json_t *a = json_object_get(fn, "arguments");
                const char *args = json_string_value(a);
                json_t *parsed = NULL;
                if (a == NULL || json_is_null(a) || (args && !args[0]))
                    parsed = json_object();
                else if (args != NULL)
                    parsed = json_loads(args, JSON_DECODE_ANY, NULL);
                if (parsed != NULL)
                    json_object_set_new(fn, "arguments", parsed);
            }
            out->tool_calls_json = own(req, copy ? json_dumps(copy, JSON_COMPACT) : NULL);
            json_decref(copy);
            if (out->tool_calls_json == NULL)
                return bad(err, NULL, "out of memory");
        }
    }
    req->prompt.messages = req->messages;
    req->prompt.num_messages = n;
    const json_t *tools = json_object_get(req->root, "tools");
    if (json_is_array(tools) && json_array_size(tools) > 0) {
        if ((req->tools_json = json_dumps(tools, JSON_COMPACT)) == NULL)
            return bad(err, NULL, "out of memory");
        req->prompt.tools_json = req->tools_json;
    } else if (tools != NULL && !json_is_null(tools) && !json_is_array(tools)) {
        return bad(err, "invalid_type", "'tools' must be a list");
    }
    const json_t *kw = json_object_get(req->root, "chat_template_kwargs");
    if (json_is_object(kw)) {
        if ((req->kwargs_json = json_dumps(kw, JSON_COMPACT)) == NULL)
            return bad(err, NULL, "out of memory");
        req->prompt.chat_template_kwargs = req->kwargs_json;
    } else if (kw != NULL && !json_is_null(kw)) {
        return bad(err, "invalid_type", "'chat_template_kwargs' must be an object");
    }
    bool gen = true, cont = false;
    if (boolean(req->root, "add_generation_prompt", &gen, err) ||
        boolean(req->root, "continue_final_message", &cont, err))
        return -1;
    if (gen && cont)
        return bad(err, "invalid_value",
                   "'continue_final_message' and 'add_generation_prompt' cannot both be true "
                   "(add_generation_prompt is true unless given false): continuing the final "
                   "message needs add_generation_prompt false");
    req->prompt.add_generation_prompt = gen;
    req->prompt.continue_final_message = cont;
    return 0;
}

/* Parameters that change the output, which this server does not do, with a value that asks for
 * them: refused (400) rather than ignored, as 'n' and 'echo' are, so that a client never takes an
 * answer made without them for one made with them. Their neutral values pass (response_format
 * text, tool_choice none, or auto without tools). */
static int refuse_unsupported(struct openai_request *req, struct openai_error *err)
{
    const json_t *root = req->root, *v;
    if ((v = json_object_get(root, "response_format")) != NULL && !json_is_null(v)) {
        const char *type = json_string_value(json_object_get(v, "type"));
        if (!json_is_object(v) || type == NULL)
            return bad(err, "invalid_type", "'response_format' must be an object with a 'type'");
        if (strcmp(type, "text") != 0)
            return bad(err, "unsupported",
                       "'response_format' of type '%.64s' is not supported (no structured "
                       "output): only 'text'",
                       type);
    }
    const char *choice = NULL; /* tool_choice: absent, null or a string */
    if ((v = json_object_get(root, "tool_choice")) != NULL && !json_is_null(v)) {
        choice = json_string_value(v);
        if (choice != NULL && strcmp(choice, "auto") != 0 && strcmp(choice, "none") != 0 &&
            strcmp(choice, "required") != 0)
            return bad(err, "invalid_value",
                       "'tool_choice' must be 'none', 'auto', 'required' or a named function");
        if (choice == NULL && !json_is_object(v))
            return bad(err, "invalid_type",
                       "'tool_choice' must be 'none', 'auto', 'required' or a named function");
        if (choice == NULL || strcmp(choice, "required") == 0)
            return bad(err, "unsupported",
                       "'tool_choice' %s is not supported: a tool call cannot be forced (vLLM "
                       "forces one with guided decoding, which pagoda does not do); 'auto' lets "
                       "the model call the tools (with pagoda-gateway --tool-call-parser), 'none' "
                       "answers with text",
                       choice != NULL ? "'required'" : "naming a function");
    }
    /* A chat's tools with tool_choice 'auto' (the default where tools are given): the model's
     * tool calls are parsed out of its output by the gateway's parser, vLLM's
     * --enable-auto-tool-choice --tool-call-parser; without one they would come back as text,
     * and are refused as vLLM refuses them. 'none' renders the tools into the prompt (vLLM's
     * default) and the output is text. */
    const enum tool_call_parser parser = req->tool_parser;
    req->tool_parser = TOOL_CALL_PARSER_NONE;
    v = json_object_get(root, "tools");
    if (req->kind == OPENAI_CHAT && json_is_array(v) && json_array_size(v) > 0 &&
        (choice == NULL || strcmp(choice, "auto") == 0)) {
        if (parser == TOOL_CALL_PARSER_NONE)
            return bad(err, "unsupported",
                       "'tools' with tool_choice 'auto' (the default where tools are given) "
                       "needs the gateway's tool-call parser, which is off: start pagoda-gateway "
                       "with --tool-call-parser hermes|llama3_json (vLLM's "
                       "--enable-auto-tool-choice --tool-call-parser), or send tool_choice 'none' "
                       "to render the tools into the prompt and answer with text");
        req->tool_parser = parser;
    }
    if (boolean(root, "parallel_tool_calls", &req->parallel_tool_calls, err))
        return -1;
    if (req->kind == OPENAI_COMPLETION && (v = json_object_get(root, "suffix")) != NULL &&
        !json_is_null(v)) {
        if (!json_is_string(v))
            return bad(err, "invalid_type", "'suffix' must be a string");
        if (json_string_length(v) > 0)
            return bad(err, "unsupported", "'suffix' is not supported");
    }
    /* vLLM's structured output */
    static const char *const guided[] = {"guided_json", "guided_regex", "guided_choice",
                                         "guided_grammar", "structured_outputs"};
    for (size_t i = 0; i < sizeof(guided) / sizeof(guided[0]); i++)
        if ((v = json_object_get(root, guided[i])) != NULL && !json_is_null(v))
            return bad(err, "unsupported", "'%s' is not supported (no structured output)",
                       guided[i]);
    if ((v = json_object_get(root, "stream_options")) != NULL && !json_is_null(v) && !req->stream)
        return bad(err, "invalid_request", "'stream_options' is only allowed with 'stream': true");
    if (v != NULL && json_is_true(json_object_get(v, "continuous_usage_stats")))
        return bad(err, "unsupported",
                   "'stream_options.continuous_usage_stats' is not supported (usage comes in "
                   "the last chunk)");
    /* vLLM's other parameters that change the output, each refused unless null or its neutral
     * value (vLLM's default): what asks for it is not done here. */
    enum neutral { NEUTRAL_FALSE, NEUTRAL_EMPTY, NEUTRAL_NULL };
    static const struct {
        const char *key;
        enum neutral neutral;
        bool chat_only;
    } extras[] = {
        /* clang-format off */
        {"allowed_token_ids", NEUTRAL_NULL, false},
        {"bad_words", NEUTRAL_EMPTY, false},
        {"logits_processors", NEUTRAL_EMPTY, false},
        {"prompt_logprobs", NEUTRAL_NULL, false},
        {"truncate_prompt_tokens", NEUTRAL_NULL, false},
        {"use_beam_search", NEUTRAL_FALSE, false},
        {"prompt_embeds", NEUTRAL_NULL, false},
        {"chat_template", NEUTRAL_NULL, true},
        /* clang-format on */
    };
    for (size_t i = 0; i < sizeof(extras) / sizeof(extras[0]); i++) {
        if (extras[i].chat_only && req->kind == OPENAI_COMPLETION)
            continue;
        if ((v = json_object_get(root, extras[i].key)) == NULL || json_is_null(v))
            continue;
        bool neutral = false;
        switch (extras[i].neutral) {
        case NEUTRAL_FALSE:
            neutral = json_is_false(v);
            break;
        case NEUTRAL_EMPTY:
            neutral = json_is_array(v) && json_array_size(v) == 0;
            break;
        case NEUTRAL_NULL:
            break;
        }
        if (!neutral)
            return bad(err, "unsupported", "'%s' is not supported", extras[i].key);
    }
    return 0;
}

/* How many bytes of a logit_bias key an error message shows: at most 64, cut on a character
 * boundary (a message that is not UTF-8 is not sent as it is: message_json). */
static int key_shown(const char *key)
{
    size_t n = strlen(key);
    if (n <= 64)
        return (int)n;
    n = 64;
    while (n > 0 && ((unsigned char)key[n] & 0xC0) == 0x80) /* key[n] continues a character */
        n--;
    return (int)n;
}

/* A logit_bias key: digits with an optional sign, as Python's int() reads the keys for vLLM
 * (without the spaces and underscores it also skips). Returns 1 with the id, 0 for an integer
 * that is no token id (negative, or past INT32_MAX), -1 for what is no integer. */
static int token_id_key(const char *key, int32_t *out)
{
    const char *digits = key + (key[0] == '-' || key[0] == '+');
    if (*digits == '\0')
        return -1;
    for (const char *c = digits; *c != '\0'; c++)
        if (!isdigit((unsigned char)*c))
            return -1;
    errno = 0;
    long long id = strtoll(key, NULL, 10);
    if (errno != 0 || id < 0 || id > INT32_MAX)
        return 0;
    *out = (int32_t)id;
    return 1;
}

/* OpenAI's logit_bias: an object mapping token ids, written as base-10 integers ("50256"), to
 * numbers; null or {} is none. Each value is clamped to [-100, 100], as vLLM's protocol does
 * (min(100, max(-100, bias))): OpenAI documents the range without saying what happens outside
 * it, and a client that sends 150 (or 1e9, to ban or force a token) gets vLLM's answer rather
 * than a refusal. Refused (400): a key that is no integer, as vLLM refuses one (int() fails);
 * one that is no token id (negative, past INT32_MAX); two keys naming one token ("1" and "01":
 * vLLM's dict keeps the later, the router takes each id once, and which one the client meant is
 * not ours to guess); a value that is no number; more than PAGODA_MAX_LOGIT_BIAS pairs (the
 * router's bound; vLLM has none). An id past the vocabulary is the engine's scheduler's to refuse
 * (it knows the vocabulary), which reaches the client as a 400 too (openai_error_from_code). */
static int read_logit_bias(struct openai_request *req, struct openai_error *err)
{
    json_t *lb = json_object_get(req->root, "logit_bias");
    if (lb == NULL || json_is_null(lb))
        return 0;
    if (!json_is_object(lb))
        return bad(err, "invalid_type",
                   "'logit_bias' must be an object mapping token ids to numbers");
    const size_t n = json_object_size(lb);
    if (n == 0)
        return 0;
    if (n > PAGODA_MAX_LOGIT_BIAS)
        return bad(err, "invalid_value", "'logit_bias' has %zu tokens, more than %u", n,
                   PAGODA_MAX_LOGIT_BIAS);
    if ((req->logit_bias_ids = malloc(n * sizeof(int32_t))) == NULL ||
        (req->logit_bias_values = malloc(n * sizeof(float))) == NULL)
        return bad(err, NULL, "out of memory");
    const char *keys[PAGODA_MAX_LOGIT_BIAS]; /* for a message naming two keys of one id */
    size_t at = 0;
    const char *key;
    json_t *v;
    json_object_foreach(lb, key, v)
    {
        int32_t id;
        int kind = token_id_key(key, &id);
        if (kind < 0)
            return bad(err, "invalid_value",
                       "'logit_bias' key '%.*s' is not a token id: keys are token ids written "
                       "as base-10 integers (\"50256\")",
                       key_shown(key), key);
        if (kind == 0)
            return bad(err, "invalid_value",
                       "'logit_bias' key '%.*s' is not a token id: ids are 0 or more, within the "
                       "model's vocabulary",
                       key_shown(key), key);
        for (size_t i = 0; i < at; i++)
            if (req->logit_bias_ids[i] == id)
                return bad(err, "invalid_value",
                           "'logit_bias' keys '%.*s' and '%.*s' name the same token (%d)",
                           key_shown(keys[i]), keys[i], key_shown(key), key, (int)id);
        double d;
        if (!lax_number(v, &d))
            return bad(err, "invalid_type", "'logit_bias' value of token '%.*s' must be a number",
                       key_shown(key), key);
        d = d > PAGODA_LOGIT_BIAS_LIMIT ? PAGODA_LOGIT_BIAS_LIMIT : d;
        d = d < -PAGODA_LOGIT_BIAS_LIMIT ? -PAGODA_LOGIT_BIAS_LIMIT : d;
        keys[at] = key;
        req->logit_bias_ids[at] = id;
        req->logit_bias_values[at] = (float)d;
        at++;
    }
    req->params.logit_bias_ids = req->logit_bias_ids;
    req->params.logit_bias_values = req->logit_bias_values;
    req->params.num_logit_bias = at;
    return 0;
}

/* vLLM's min_tokens: an integer >= 0 (null: 0) and at most max_tokens, as vLLM's SamplingParams
 * refuses more (400). Without a max_tokens in the request its default here bounds it (16 for a
 * completion, as vLLM's; --default-max-tokens for a chat, where vLLM's default is the rest of the
 * context, which only the router knows): the message says to give max_tokens. */
static int read_min_tokens(struct openai_request *req, struct openai_error *err)
{
    pagoda_generate_params *p = &req->params;
    long long n = 0;
    if (integer(req->root, "min_tokens", 0, INT32_MAX, &n, err))
        return -1;
    if (n > p->max_tokens && p->strict_max_tokens)
        return bad(err, "invalid_value", "'min_tokens' is %lld; it must be at most max_tokens (%d)",
                   n, (int)p->max_tokens);
    if (n > p->max_tokens)
        return bad(err, "invalid_value",
                   "'min_tokens' is %lld; it must be at most max_tokens, which is %d when not "
                   "given: give max_tokens",
                   n, (int)p->max_tokens);
    p->min_tokens = (int32_t)n;
    return 0;
}

static int read_logprobs(struct openai_request *req, struct openai_error *err)
{
    const json_t *lp = json_object_get(req->root, "logprobs");
    long long top = 0;
    if (req->kind != OPENAI_COMPLETION && integer(req->root, "top_logprobs", 0, 0, &top, err))
        return bad(err, "unsupported", "'top_logprobs' must be 0 (the sampled token's only)");
    if (lp == NULL || json_is_null(lp))
        return 0;
    if (req->kind == OPENAI_COMPLETION) {
        /* the number of alternatives beside the sampled token's: 0 still asks for its own. Only
         * the sampled token's is computed, which is the one alternative of 1 where decoding is
         * greedy (the most likely token is the one sampled) */
        long long alternatives = 0;
        if (integer(req->root, "logprobs", 0, 20, &alternatives, err))
            return -1;
        const bool greedy = req->params.temperature == 0 || req->params.top_k == 1;
        if (alternatives > (greedy ? 1 : 0))
            return bad(err, "unsupported",
                       "'logprobs' is %lld: only the sampled token's log-probability is computed, "
                       "so 'logprobs' must be 0 (or 1 when decoding is greedy: temperature 0 or "
                       "top_k 1)",
                       alternatives);
        req->params.logprobs = 1;
        return 0;
    }
    if (!json_is_boolean(lp))
        return bad(err, "invalid_type", "'logprobs' must be true or false");
    req->params.logprobs = json_is_true(lp);
    return 0;
}

/* /detokenize's "tokens": token ids (none is an empty text), into prompt.token_ids. */
static int read_tokens(struct openai_request *req, struct openai_error *err)
{
    const json_t *t = json_object_get(req->root, "tokens");
    if (!json_is_array(t))
        return bad(err, "invalid_type", "'tokens' must be a list of token ids");
    size_t n = json_array_size(t);
    if ((req->prompt_ids = malloc((n ? n : 1) * sizeof(int32_t))) == NULL)
        return bad(err, NULL, "out of memory");
    size_t i;
    const json_t *v;
    json_array_foreach(t, i, v)
    {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
            return bad(err, "invalid_type", "'tokens' item %zu is not a token id", i);
        req->prompt_ids[i] = (int32_t)json_integer_value(v);
    }
    req->prompt.token_ids = req->prompt_ids;
    req->prompt.num_token_ids = n;
    /* vLLM's /detokenize keeps special tokens (tokenizer.decode); skip_special_tokens asks */
    bool skip = false;
    if (boolean(req->root, "skip_special_tokens", &skip, err))
        return -1;
    req->params.skip_special_tokens = skip;
    return 0;
}

int openai_parse(enum openai_kind kind, const char *body, size_t len, int32_t default_max_tokens,
                 enum tool_call_parser tool_parser, struct openai_request *req,
                 struct openai_error *err)
{
    memset(req, 0, sizeof(*req));
    memset(err, 0, sizeof(*err));
    req->kind = kind;
    req->tool_parser = tool_parser; /* kept by refuse_unsupported for a chat that calls tools */
    req->parallel_tool_calls = true;
    req->n = 1;
    req->num_prompts = 1;
    req->params = pagoda_generate_params_default();
    req->params.max_tokens = kind == OPENAI_CHAT ? default_max_tokens : 16;
    req->prompt = pagoda_prompt_default();
    json_error_t jerr;
    req->root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (req->root == NULL && strstr(jerr.text, "\\u0000") != NULL)
        /* valid JSON, but C strings end at a NUL: refused as what it is, not as a syntax error */
        return bad(err, "invalid_value",
                   "a string in the body holds a NUL character (\\u0000), which is not "
                   "supported");
    if (req->root == NULL)
        return bad(err, "invalid_json", "the body is not JSON: line %d: %s", jerr.line, jerr.text);
    if (!json_is_object(req->root))
        return bad(err, "invalid_json", "the body must be a JSON object");
    if (read_common(req, err) || read_logprobs(req, err) || refuse_unsupported(req, err))
        return -1;
    /* what only a generation reads (vLLM's /tokenize takes neither) */
    if ((kind == OPENAI_COMPLETION || kind == OPENAI_CHAT) &&
        (read_logit_bias(req, err) || read_min_tokens(req, err)))
        return -1;
    if (kind == OPENAI_DETOKENIZE)
        return read_tokens(req, err);
    if (kind == OPENAI_TOKENIZE) { /* a chat's messages, or a text prompt */
        bool strs = false;
        if (boolean(req->root, "return_token_strs", &strs, err))
            return -1;
        if (strs)
            return bad(err, "unsupported", "'return_token_strs' is not supported");
        return json_object_get(req->root, "messages") != NULL ? read_messages(req, err)
                                                              : read_prompt(req, err);
    }
    return kind == OPENAI_COMPLETION ? read_prompt(req, err) : read_messages(req, err);
}

void openai_request_release_prompt(struct openai_request *req)
{
    for (size_t i = 0; i < OPENAI_MAX_STOPS; i++) {
        free(req->stops[i]);
        req->stops[i] = NULL;
    }
    req->params.stop = NULL;
    req->params.num_stop = 0;
    req->params.stop_token_ids = NULL;
    req->params.num_stop_token_ids = 0;
    free(req->logit_bias_ids);
    free(req->logit_bias_values);
    req->logit_bias_ids = NULL;
    req->logit_bias_values = NULL;
    req->params.logit_bias_ids = NULL;
    req->params.logit_bias_values = NULL;
    req->params.num_logit_bias = 0;
    free(req->prompt_ids);
    free(req->more_prompts);
    free(req->messages);
    for (size_t i = 0; i < req->num_owned; i++)
        free(req->owned[i]);
    free(req->owned);
    free(req->tools_json);
    free(req->kwargs_json);
    json_decref(req->root);
    req->prompt_ids = NULL;
    req->more_prompts = NULL;
    req->messages = NULL;
    req->owned = NULL;
    req->num_owned = 0;
    req->tools_json = req->kwargs_json = NULL;
    req->root = NULL;
    req->prompt = pagoda_prompt_default();
}

void openai_request_fini(struct openai_request *req)
{
    openai_request_release_prompt(req);
    free(req->model);
    memset(req, 0, sizeof(*req));
}

/* ---- responses ------------------------------------------------------------------------------ */

const char *openai_finish_reason(pagoda_finish_reason reason)
{
    switch (reason) {
    case PAGODA_FINISH_STOP:
        return "stop";
    case PAGODA_FINISH_LENGTH:
        return "length";
    case PAGODA_FINISH_CANCELLED:
        return "abort";
    case PAGODA_FINISH_ERROR:
        return "error";
    default:
        return NULL;
    }
}

static json_t *usage_json(const struct openai_out *o)
{
    return json_pack("{s:I,s:I,s:I,s:{s:I}}", "prompt_tokens", (json_int_t)o->prompt_tokens,
                     "completion_tokens", (json_int_t)o->completion_tokens, "total_tokens",
                     (json_int_t)o->prompt_tokens + o->completion_tokens, "prompt_tokens_details",
                     "cached_tokens", (json_int_t)o->cached_tokens);
}

/* A JSON string of text, which is valid UTF-8 from the router; NULL for none. */
static json_t *text_json(const char *text, size_t len)
{
    json_t *t = json_stringn(text ? text : "", text ? len : 0);
    return t ? t : json_string("\xef\xbf\xbd"); /* never expected: the router sends UTF-8 */
}

uint64_t openai_utf8_chars(const char *s, size_t len)
{
    uint64_t n = 0;
    for (size_t i = 0; i < len; i++)
        n += ((unsigned char)s[i] & 0xC0) != 0x80;
    return n;
}

/* The sampled tokens' log-probabilities: completions' {tokens, token_logprobs, top_logprobs,
 * text_offset} or chats' {content: [{token, logprob, bytes, top_logprobs}]}. A token is named by
 * its piece of the text (o->token_text_ends: what became visible when it arrived, so an empty
 * piece for a token that completes no character), with its UTF-8 bytes and its offset in
 * characters; by "token_id:N" (its bytes those of the name, as vLLM's) when the client asked
 * (vLLM's return_tokens_as_token_ids) or there are no pieces (a model without a tokenizer, or
 * detokenize off: every text_offset then the output's start, for there is no text). */
static json_t *logprobs_json(const struct openai_out *o)
{
    if (o->logprobs == NULL)
        return json_null();
    const bool pieces = o->token_text_ends != NULL, chat = o->req->kind == OPENAI_CHAT;
    const char *text = o->text ? o->text : ""; /* a whole answer without text has none */
    const size_t text_len = o->text ? o->text_len : 0;
    /* a chat's content, or a completion's four arrays: only what the answer has is built */
    json_t *content = NULL, *tokens = NULL, *lps = NULL, *tops = NULL, *offsets = NULL;
    if (chat) {
        content = json_array();
    } else {
        tokens = json_array();
        lps = json_array();
        tops = json_array();
        offsets = json_array();
    }
    uint64_t chars = o->text_offset;
    size_t start = 0;
    for (size_t i = 0; i < o->n; i++) {
        double lp = isfinite(o->logprobs[i]) ? o->logprobs[i] : -9999.0;
        json_t *name = NULL;
        size_t end = start;
        if (pieces) {
            end = o->token_text_ends[i];
            if (end > text_len)
                end = text_len;
            if (end < start)
                end = start;
            if (!o->req->tokens_as_ids)
                name = json_stringn(text + start, end - start);
        }
        const char *bytes_of = text + start; /* the name's bytes, for a chat */
        size_t num_bytes = end - start;
        char id[32];
        if (name == NULL) { /* by id, its bytes those of the name (as vLLM's) */
            int len = snprintf(id, sizeof(id), "token_id:%d", o->token_ids[i]);
            name = json_string(id);
            bytes_of = id;
            num_bytes = (size_t)len;
        }
        if (chat) {
            json_t *bytes = json_array();
            for (size_t k = 0; k < num_bytes; k++)
                json_array_append_new(bytes, json_integer((unsigned char)bytes_of[k]));
            json_array_append_new(content, json_pack("{s:o,s:f,s:o,s:[]}", "token", name, "logprob",
                                                     lp, "bytes", bytes, "top_logprobs"));
        } else {
            /* top_logprobs: the token's own, its one alternative (read_logprobs) */
            json_t *top = json_object();
            json_object_setn_new(top, json_string_value(name), json_string_length(name),
                                 json_real(lp));
            json_array_append_new(tops, top);
            json_array_append_new(tokens, name);
            json_array_append_new(lps, json_real(lp));
            /* without text, every offset is the output's start */
            json_array_append_new(offsets, json_integer((json_int_t)chars));
        }
        if (pieces)
            chars += openai_utf8_chars(text + start, end - start);
        start = end;
    }
    if (chat)
        return json_pack("{s:o}", "content", content);
    return json_pack("{s:o,s:o,s:o,s:o}", "tokens", tokens, "token_logprobs", lps, "top_logprobs",
                     tops, "text_offset", offsets);
}

static json_t *stop_reason_json(const struct openai_out *o)
{
    if (o->stop_string != NULL)
        return json_string(o->stop_string);
    if (o->has_stop_token_id)
        return json_integer(o->stop_token_id);
    return json_null();
}

static char *dump(json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return s;
}

/* The finish_reason of o's choice: "tool_calls" where it called tools (vLLM's) and ended by
 * stop or length. */
static const char *finish_name(const struct openai_out *o)
{
    const char *finish = openai_finish_reason(o->finish);
    if (o->tools_called && (o->finish == PAGODA_FINISH_STOP || o->finish == PAGODA_FINISH_LENGTH))
        return "tool_calls";
    return finish;
}

size_t openai_tool_calls_shown(const struct openai_out *o)
{
    if (o->req == NULL || o->req->parallel_tool_calls)
        return o->num_tool_calls;
    return o->first_tool_call == 0 && o->num_tool_calls > 0 ? 1 : 0;
}

/* A chat message's or delta's content: the text, or with tools parsed the content, null in a
 * message with tool calls and no content (vLLM's). */
static json_t *chat_content_json(const struct openai_out *o)
{
    if (!o->tools_parsed)
        return text_json(o->text, o->text_len);
    if (o->content_len == 0 && openai_tool_calls_shown(o) > 0)
        return json_null();
    return text_json(o->content, o->content_len);
}

/* o's tool calls, OpenAI's {id, type: "function", function: {name, arguments}}; a stream's with
 * their index in the choice's calls. */
static json_t *tool_calls_json(const struct openai_out *o, bool indexed)
{
    json_t *calls = json_array();
    for (size_t i = 0; calls != NULL && i < openai_tool_calls_shown(o); i++) {
        const struct tool_call *c = &o->tool_calls[i];
        json_t *call = json_pack("{s:s,s:s,s:{s:s,s:s}}", "id", c->id, "type", "function",
                                 "function", "name", c->name, "arguments", c->arguments);
        if (call != NULL && indexed)
            json_object_set_new(call, "index", json_integer(o->first_tool_call + (json_int_t)i));
        json_array_append_new(calls, call);
    }
    return calls;
}

static json_t *response_choice(const struct openai_out *o)
{
    const char *finish = finish_name(o);
    if (o->req->kind == OPENAI_CHAT) {
        json_t *message =
            json_pack("{s:s,s:o}", "role", "assistant", "content", chat_content_json(o));
        if (message != NULL && openai_tool_calls_shown(o) > 0)
            json_object_set_new(message, "tool_calls", tool_calls_json(o, false));
        return json_pack("{s:I,s:o,s:o,s:o,s:o}", "index", (json_int_t)o->index, "message", message,
                         "logprobs", logprobs_json(o), "finish_reason",
                         finish ? json_string(finish) : json_null(), "stop_reason",
                         stop_reason_json(o));
    }
    return json_pack("{s:I,s:o,s:o,s:o,s:o}", "index", (json_int_t)o->index, "text",
                     text_json(o->text, o->text_len), "logprobs", logprobs_json(o), "finish_reason",
                     finish ? json_string(finish) : json_null(), "stop_reason",
                     stop_reason_json(o));
}

void openai_usage_sum(struct openai_out *sum, const struct openai_out *o, size_t n)
{
    sum->prompt_tokens = 0;
    sum->cached_tokens = 0;
    sum->completion_tokens = 0;
    /* o in index order: prompt p's choices are indices p * per .. p * per + per - 1 */
    const uint32_t per = n > 0 && o[0].req != NULL && o[0].req->n > 0 ? o[0].req->n : 1;
    uint32_t cached = 0;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || o[i].index / per != o[i - 1].index / per) { /* a prompt's first choice */
            sum->prompt_tokens += o[i].prompt_tokens;
            sum->cached_tokens += cached;
            cached = 0;
        }
        sum->completion_tokens += o[i].completion_tokens;
        if (o[i].cached_tokens > cached)
            cached = o[i].cached_tokens;
    }
    sum->cached_tokens += cached;
}

char *openai_response_json(const struct openai_out *o, size_t n)
{
    json_t *choices = json_array();
    for (size_t i = 0; choices != NULL && i < n; i++)
        if (json_array_append_new(choices, response_choice(&o[i])) != 0) {
            json_decref(choices);
            choices = NULL;
        }
    struct openai_out usage = o[0];
    openai_usage_sum(&usage, o, n);
    return dump(json_pack("{s:s,s:s,s:I,s:s,s:o,s:o}", "id", o->id, "object",
                          o->req->kind == OPENAI_CHAT ? "chat.completion" : "text_completion",
                          "created", (json_int_t)o->created, "model", o->model, "choices", choices,
                          "usage", usage_json(&usage)));
}

char *openai_chunk_json(const struct openai_out *o, bool role_chunk, bool usage_only)
{
    const bool chat = o->req->kind == OPENAI_CHAT;
    json_t *choices = json_array();
    if (!usage_only && chat && role_chunk) {
        json_array_append_new(choices, json_pack("{s:I,s:{s:s,s:s},s:n,s:n}", "index",
                                                 (json_int_t)o->index, "delta", "role", "assistant",
                                                 "content", "", "logprobs", "finish_reason"));
    } else if (!usage_only) {
        const char *finish = finish_name(o);
        json_t *choice;
        if (chat) {
            json_t *delta = json_object();
            if (o->tools_parsed ? o->content_len > 0 : o->text_len > 0)
                json_object_set_new(delta, "content", chat_content_json(o));
            if (openai_tool_calls_shown(o) > 0)
                json_object_set_new(delta, "tool_calls", tool_calls_json(o, true));
            choice = json_pack("{s:I,s:o,s:o,s:o}", "index", (json_int_t)o->index, "delta", delta,
                               "logprobs", logprobs_json(o), "finish_reason",
                               finish ? json_string(finish) : json_null());
        } else {
            choice = json_pack("{s:I,s:o,s:o,s:o}", "index", (json_int_t)o->index, "text",
                               text_json(o->text, o->text_len), "logprobs", logprobs_json(o),
                               "finish_reason", finish ? json_string(finish) : json_null());
        }
        if (finish != NULL)
            json_object_set_new(choice, "stop_reason", stop_reason_json(o));
        json_array_append_new(choices, choice);
    }
    json_t *chunk = json_pack("{s:s,s:s,s:I,s:s,s:o}", "id", o->id, "object",
                              chat ? "chat.completion.chunk" : "text_completion", "created",
                              (json_int_t)o->created, "model", o->model, "choices", choices);
    if (chunk != NULL && o->req->include_usage)
        json_object_set_new(chunk, "usage", usage_only ? usage_json(o) : json_null());
    return dump(chunk);
}

char *openai_tokenize_json(const int32_t *ids, size_t n, uint32_t max_model_len)
{
    json_t *tokens = json_array();
    for (size_t i = 0; tokens != NULL && i < n; i++)
        if (json_array_append_new(tokens, json_integer(ids[i])) != 0) {
            json_decref(tokens);
            tokens = NULL;
        }
    return dump(json_pack("{s:I,s:I,s:o,s:n}", "count", (json_int_t)n, "max_model_len",
                          (json_int_t)max_model_len, "tokens", tokens, "token_strs"));
}

char *openai_detokenize_json(const char *text, size_t len)
{
    return dump(json_pack("{s:o}", "prompt", text_json(text, len)));
}

char *openai_models_json(const char *model, long long created, uint32_t max_model_len)
{
    json_t *card =
        json_pack("{s:s,s:s,s:I,s:s,s:s,s:n,s:[]}", "id", model, "object", "model", "created",
                  (json_int_t)created, "owned_by", "pagoda", "root", model, "parent", "permission");
    if (card != NULL && max_model_len > 0)
        json_object_set_new(card, "max_model_len", json_integer(max_model_len));
    return dump(card != NULL ? json_pack("{s:s,s:[o]}", "object", "list", "data", card) : NULL);
}

char *openai_version_json(const char *version)
{
    return dump(json_pack("{s:s}", "version", version));
}
