/* chat_compare: renders the conversations that tests/chat/reference.mjs wrote (one JSON object a
 * line: template, messages, tools, add_generation_prompt, extra, and @huggingface/jinja's output
 * or error) through chat_template_apply, and compares byte for byte.
 *
 *   chat_compare [--also LABEL] CASES.jsonl NAME=tokenizer_config.json...
 *   chat_compare --jinja EXPRESSIONS.jsonl
 *   chat_compare --compile TEMPLATES.jsonl
 *
 * A case matches when both render the same bytes, or both refuse. Prints the counts per template
 * (and how many also equal expected_raw: the unmodified npm reference, see reference.mjs, or
 * what --also names); cases marked python_only are left out (reference_jinja2.py compares them).
 * Exits 1 on any mismatch, printing the first few. */
#include "chat/chat_template.h"
#include "chat/jinja.h"
#include "common/error.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_CONFIGS 16
#define MAX_SHOWN 5

struct config {
    const char *name;
    ChatTemplate *ct;
    unsigned cases, with_prompt, equal, both_error, raw_equal, mismatches, python_only;
};

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (p != NULL && fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        p = NULL;
    }
    fclose(f);
    if (p != NULL) {
        p[n] = '\0';
        *len = (size_t)n;
    }
    return p;
}

static void show(const char *what, const char *s, size_t n)
{
    fprintf(stderr, "  %s (%zu bytes): ", what, n);
    for (size_t i = 0; i < n && i < 2000; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\n')
            fputs("\\n", stderr);
        else if (c < 0x20)
            fprintf(stderr, "\\x%02x", c);
        else
            fputc(c, stderr);
    }
    fputc('\n', stderr);
}

/* The next case of a JSON-lines file of templates of their own (an object with a string
 * "source"), or NULL at its end; a line that is not one is said and counted in *bad. */
static json_t *next_case(FILE *f, const char *path, char **line, size_t *cap, unsigned *bad)
{
    while (getline(line, cap, f) > 0) {
        json_error_t jerr;
        json_t *c = json_loads(*line, 0, &jerr);
        if (json_is_string(json_object_get(c, "source")))
            return c;
        fprintf(stderr, "chat_compare: %s: unreadable case\n", path);
        (*bad)++;
        json_decref(c);
    }
    return NULL;
}

/* chat_compare --jinja CASES.jsonl: templates of their own ({id, source, vars, expected | error},
 * from expressions_jinja2.py) through jinja.h directly. */
static int compare_expressions(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "chat_compare: cannot open %s\n", path);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    unsigned cases = 0, equal = 0, both_error = 0, mismatches = 0;
    json_t *c;
    while ((c = next_case(f, path, &line, &cap, &mismatches)) != NULL) {
        const json_t *src = json_object_get(c, "source");
        cases++;
        JinjaTemplate *t = NULL;
        char *out = NULL;
        size_t len = 0;
        int rc = jinja_template_new(json_string_value(src), json_string_length(src), &t);
        if (rc == 0)
            rc = jinja_render(t, json_object_get(c, "vars"), &out, &len);
        const json_t *expected = json_object_get(c, "expected");
        bool ok;
        if (json_is_string(expected)) {
            ok = rc == 0 && len == json_string_length(expected) &&
                 memcmp(out, json_string_value(expected), len) == 0;
            equal += ok;
        } else {
            ok = rc != 0;
            both_error += ok;
        }
        if (!ok && mismatches++ < MAX_SHOWN) {
            fprintf(stderr, "MISMATCH expression %u: %s\n",
                    (unsigned)json_integer_value(json_object_get(c, "id")), json_string_value(src));
            if (json_is_string(expected))
                show("jinja2", json_string_value(expected), json_string_length(expected));
            else
                fprintf(stderr, "  jinja2 error: %s\n",
                        json_string_value(json_object_get(c, "error")));
            if (rc == 0)
                show("pagoda", out, len);
            else
                fprintf(stderr, "  pagoda error: %s\n", pagoda_error_detail());
        }
        free(out);
        jinja_template_free(t);
        json_decref(c);
    }
    free(line);
    fclose(f);
    printf("expressions: %u templates: %u rendered equal, %u refused by both, %u mismatches\n",
           cases, equal, both_error, mismatches);
    return mismatches ? 1 : 0;
}

/* chat_compare --compile CASES.jsonl: templates that jinja2 compiles or refuses ({id, source,
 * compiles, error}, from compile_errors_jinja2.py). A mismatch is a template pagoda refuses as
 * not Jinja (PAGODA_EINVAL) that jinja2 compiles: a model shipping it would not start. The
 * other ways they differ are counted: pagoda lacking what jinja2 compiles (PAGODA_EUNSUPPORTED,
 * PAGODA_ERANGE), and compiling what jinja2 refuses. */
static int compare_compiles(const char *path)
{
    FILE *f = fopen(path, "r");
    if (f == NULL) {
        fprintf(stderr, "chat_compare: cannot open %s\n", path);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    unsigned cases = 0, both = 0, refused_both = 0, beyond = 0, lenient = 0, mismatches = 0;
    json_t *c;
    while ((c = next_case(f, path, &line, &cap, &mismatches)) != NULL) {
        const json_t *src = json_object_get(c, "source");
        cases++;
        bool compiles = json_is_true(json_object_get(c, "compiles"));
        JinjaTemplate *t = NULL;
        int rc = jinja_template_new(json_string_value(src), json_string_length(src), &t);
        jinja_template_free(t);
        if (compiles && rc == 0)
            both++;
        else if (!compiles && rc != 0)
            refused_both++;
        else if (!compiles)
            lenient++;
        else if (rc != PAGODA_EINVAL)
            beyond++;
        else if (mismatches++ < MAX_SHOWN) {
            fprintf(stderr, "MISMATCH template %u: jinja2 compiles it, pagoda: %s\n",
                    (unsigned)json_integer_value(json_object_get(c, "id")), pagoda_error_detail());
            show("source", json_string_value(src), json_string_length(src));
        }
        json_decref(c);
    }
    free(line);
    fclose(f);
    printf("compile: %u templates: %u compiled by both, %u refused by both, %u compiled by jinja2 "
           "only (beyond pagoda's subset), %u by pagoda only, %u refused as not Jinja that "
           "jinja2 compiles\n",
           cases, both, refused_both, beyond, lenient, mismatches);
    return mismatches ? 1 : 0;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--jinja") == 0)
        return compare_expressions(argv[2]);
    if (argc == 3 && strcmp(argv[1], "--compile") == 0)
        return compare_compiles(argv[2]);
    /* --also LABEL: what expected_raw is (the unmodified npm package, unless said) */
    const char *also = "the unmodified reference";
    if (argc > 2 && strcmp(argv[1], "--also") == 0) {
        also = argv[2];
        argv += 2;
        argc -= 2;
    }
    if (argc < 3) {
        fprintf(stderr,
                "usage: chat_compare [--also LABEL] CASES.jsonl NAME=tokenizer_config.json...\n");
        return 2;
    }
    struct config cfg[MAX_CONFIGS];
    int ncfg = 0;
    for (int i = 2; i < argc && ncfg < MAX_CONFIGS; i++) {
        char *eq = strchr(argv[i], '=');
        if (eq == NULL) {
            fprintf(stderr, "chat_compare: %s: expected NAME=PATH\n", argv[i]);
            return 2;
        }
        *eq = '\0';
        size_t len;
        char *text = read_file(eq + 1, &len);
        if (text == NULL) {
            fprintf(stderr, "chat_compare: cannot read %s\n", eq + 1);
            return 2;
        }
        memset(&cfg[ncfg], 0, sizeof(cfg[ncfg]));
        cfg[ncfg].name = argv[i];
        int rc = chat_template_new(text, len, &cfg[ncfg].ct);
        free(text);
        if (rc != 0) {
            fprintf(stderr, "chat_compare: %s: %s\n", eq + 1, pagoda_error_detail());
            return 1;
        }
        ncfg++;
    }
    FILE *f = fopen(argv[1], "r");
    if (f == NULL) {
        fprintf(stderr, "chat_compare: cannot open %s\n", argv[1]);
        return 2;
    }
    char *line = NULL;
    size_t cap = 0;
    unsigned shown = 0, lineno = 0, bad_lines = 0;
    while (getline(&line, &cap, f) > 0) {
        lineno++;
        json_error_t jerr;
        json_t *c = json_loads(line, 0, &jerr);
        const char *tname = json_string_value(json_object_get(c, "template"));
        struct config *k = NULL;
        for (int i = 0; tname != NULL && i < ncfg; i++)
            if (strcmp(cfg[i].name, tname) == 0)
                k = &cfg[i];
        if (c == NULL || k == NULL) {
            fprintf(stderr, "chat_compare: %s:%u: unreadable case or unknown template\n", argv[1],
                    lineno);
            bad_lines++;
            json_decref(c);
            continue;
        }
        if (json_is_true(json_object_get(c, "python_only"))) {
            k->python_only++; /* the reference departs from Python there: reference_jinja2.py */
            json_decref(c);
            continue;
        }
        const json_t *tools = json_object_get(c, "tools");
        const json_t *extra = json_object_get(c, "extra");
        bool agp = json_is_true(json_object_get(c, "add_generation_prompt"));
        const json_t *expected = json_object_get(c, "expected");
        const json_t *raw = json_object_get(c, "expected_raw");
        char *out = NULL;
        size_t len = 0;
        int rc = chat_template_apply(k->ct, json_object_get(c, "messages"),
                                     json_is_null(tools) ? NULL : tools, agp,
                                     json_is_object(extra) ? extra : NULL, &out, &len);
        k->cases++;
        k->with_prompt += agp;
        bool ok;
        if (json_is_string(expected)) {
            ok = rc == 0 && len == json_string_length(expected) &&
                 memcmp(out, json_string_value(expected), len) == 0;
            k->equal += ok;
        } else {
            ok = rc != 0;
            k->both_error += ok;
        }
        if (json_is_string(raw) ? (rc == 0 && len == json_string_length(raw) &&
                                   memcmp(out, json_string_value(raw), len) == 0)
                                : rc != 0)
            k->raw_equal++;
        if (!ok) {
            k->mismatches++;
            if (shown++ < MAX_SHOWN) {
                fprintf(stderr, "MISMATCH %s case %u (line %u):\n", k->name,
                        (unsigned)json_integer_value(json_object_get(c, "id")), lineno);
                if (json_is_string(expected))
                    show("reference", json_string_value(expected), json_string_length(expected));
                else
                    fprintf(stderr, "  reference error: %s\n",
                            json_string_value(json_object_get(c, "error")));
                if (rc == 0)
                    show("pagoda   ", out, len);
                else
                    fprintf(stderr, "  pagoda error: %s\n", pagoda_error_detail());
            }
        }
        free(out);
        json_decref(c);
    }
    free(line);
    fclose(f);
    unsigned total_bad = bad_lines;
    for (int i = 0; i < ncfg; i++) {
        struct config *k = &cfg[i];
        printf("%s: %u conversations (%u with a generation prompt): %u rendered equal, %u refused "
               "by both, %u mismatches; %u also equal to %s",
               k->name, k->cases, k->with_prompt, k->equal, k->both_error, k->mismatches,
               k->raw_equal, also);
        if (k->python_only)
            printf("; %u left out (python_only)", k->python_only);
        printf("\n");
        total_bad += k->mismatches;
        chat_template_free(k->ct);
    }
    return total_bad ? 1 : 0;
}
