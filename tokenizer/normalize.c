/* Normalizers: Unicode normal forms through utf8proc, Lowercase, Prepend and Replace (a string
 * pattern), in a flat chain (a Sequence is flattened at load). Each applies to one piece of
 * text that no added token claimed, as HF's NormalizedString operations do. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "common/error.h"

static bool all_ascii(const char *s, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] >= 0x80)
            return false;
    return true;
}

static int normal_form(TokNormKind kind, const char *in, size_t len, TokBuf *out)
{
    out->len = 0;
    if (all_ascii(in, len)) /* every normal form leaves ASCII as it is */
        return tokbuf_append(out, in, len);
    int opts = UTF8PROC_STABLE;
    switch (kind) {
    case TOK_NORM_NFC:
        opts |= UTF8PROC_COMPOSE;
        break;
    case TOK_NORM_NFD:
        opts |= UTF8PROC_DECOMPOSE;
        break;
    case TOK_NORM_NFKC:
        opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
        break;
    default:
        opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
        break;
    }
    utf8proc_uint8_t *res = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)in, (utf8proc_ssize_t)len, &res,
                                      (utf8proc_option_t)opts);
    if (n < 0) {
        free(res);
        return n == UTF8PROC_ERROR_NOMEM ? PAGODA_ENOMEM : PAGODA_EINVAL;
    }
    int rc = tokbuf_append(out, res, (size_t)n);
    free(res);
    return rc;
}

/* Rust's char::to_lowercase per character: utf8proc's simple mapping, plus the one full
 * mapping that differs from it (U+0130 -> "i" U+0307). */
static int lowercase(const char *in, size_t len, TokBuf *out)
{
    out->len = 0;
    if (tokbuf_reserve(out, len + 16))
        return PAGODA_ENOMEM;
    for (size_t i = 0; i < len;) {
        size_t adv;
        uint32_t cp = tok_utf8_decode(in + i, len - i, &adv);
        char enc[8];
        size_t k;
        if (cp == 0x130) {
            memcpy(enc, "i\xCC\x87", 3);
            k = 3;
        } else if (cp < 0x80) {
            enc[0] = (char)(cp >= 'A' && cp <= 'Z' ? cp + 32 : cp);
            k = 1;
        } else {
            k = tok_utf8_encode((uint32_t)utf8proc_tolower((utf8proc_int32_t)cp), enc);
        }
        if (tokbuf_append(out, enc, k))
            return PAGODA_ENOMEM;
        i += adv;
    }
    return 0;
}

static int replace_all(const char *in, size_t len, const char *pat, size_t plen, const char *with,
                       size_t wlen, TokBuf *out)
{
    out->len = 0;
    size_t i = 0;
    while (i < len) {
        const char *hit = plen <= len - i ? memmem(in + i, len - i, pat, plen) : NULL;
        size_t upto = hit ? (size_t)(hit - in) : len;
        if (tokbuf_append(out, in + i, upto - i))
            return PAGODA_ENOMEM;
        if (!hit)
            break;
        if (tokbuf_append(out, with, wlen))
            return PAGODA_ENOMEM;
        i = upto + plen;
    }
    return tokbuf_reserve(out, 0);
}

int tok_normalize(const TokNormalizer *chain, size_t n, const char *in, size_t len, TokBuf *out,
                  TokBuf *tmp)
{
    out->len = 0;
    if (tokbuf_append(out, in, len))
        return PAGODA_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        const TokNormalizer *z = &chain[i];
        int rc = 0;
        switch (z->kind) {
        case TOK_NORM_PREPEND:
            if (out->len == 0) /* HF prepends to non-empty text only */
                continue;
            tmp->len = 0;
            rc = tokbuf_append(tmp, z->a, z->a_len);
            if (!rc)
                rc = tokbuf_append(tmp, out->data, out->len);
            break;
        case TOK_NORM_REPLACE:
            rc = replace_all(out->data, out->len, z->a, z->a_len, z->b, z->b_len, tmp);
            break;
        case TOK_NORM_LOWERCASE:
            rc = lowercase(out->data, out->len, tmp);
            break;
        default:
            rc = normal_form(z->kind, out->data, out->len, tmp);
            break;
        }
        if (rc)
            return rc;
        TokBuf swap = *out;
        *out = *tmp;
        *tmp = swap;
    }
    return 0;
}

static char *dup_str(const json_t *s, size_t *len)
{
    *len = json_string_length(s);
    char *p = malloc(*len + 1);
    if (p)
        memcpy(p, json_string_value(s), *len + 1);
    return p;
}

/* A {"String": s} pattern; a {"Regex": r} one is refused by name. */
int tok_string_pattern(const void *patv, const char *path, const void **outv)
{
    const json_t *pat = patv;
    const json_t **out = (const json_t **)outv;
    if (!json_is_object(pat))
        return pagoda_error_set(PAGODA_EFORMAT, "%s.pattern: not an object", path);
    const json_t *s = json_object_get(pat, "String");
    if (json_is_string(s) && json_string_length(s) > 0) {
        *out = s;
        return 0;
    }
    if (json_object_get(pat, "Regex"))
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "%s.pattern: a Regex pattern is not supported here", path);
    return pagoda_error_set(PAGODA_EFORMAT, "%s.pattern: neither String nor Regex", path);
}

static int parse_one(const json_t *j, const char *path, TokNormalizer *chain, size_t *n, int depth)
{
    if (json_is_null(j))
        return 0;
    const json_t *type = json_object_get(j, "type");
    if (!json_is_object(j) || !json_is_string(type))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: not an object with a type", path);
    const char *t = json_string_value(type);
    if (strcmp(t, "Sequence") == 0) {
        const json_t *list = json_object_get(j, "normalizers");
        if (!json_is_array(list))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.normalizers: not an array", path);
        if (depth > 4)
            return pagoda_error_set(PAGODA_EFORMAT, "%s: Sequences nested too deep", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[256];
            snprintf(sub, sizeof(sub), "%s.normalizers[%zu]", path, i);
            int rc = parse_one(json_array_get(list, i), sub, chain, n, depth + 1);
            if (rc)
                return rc;
        }
        return 0;
    }
    if (*n >= TOK_MAX_STAGES)
        return pagoda_error_set(PAGODA_EFORMAT, "%s: more than %u normalizers", path,
                                TOK_MAX_STAGES);
    TokNormalizer z = {0};
    if (strcmp(t, "NFC") == 0)
        z.kind = TOK_NORM_NFC;
    else if (strcmp(t, "NFD") == 0)
        z.kind = TOK_NORM_NFD;
    else if (strcmp(t, "NFKC") == 0)
        z.kind = TOK_NORM_NFKC;
    else if (strcmp(t, "NFKD") == 0)
        z.kind = TOK_NORM_NFKD;
    else if (strcmp(t, "Lowercase") == 0)
        z.kind = TOK_NORM_LOWERCASE;
    else if (strcmp(t, "Prepend") == 0) {
        const json_t *p = json_object_get(j, "prepend");
        if (!json_is_string(p))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.prepend: not a string", path);
        z.kind = TOK_NORM_PREPEND;
        if (!(z.a = dup_str(p, &z.a_len)))
            return PAGODA_ENOMEM;
    } else if (strcmp(t, "Replace") == 0) {
        const json_t *pat = NULL, *content = json_object_get(j, "content");
        char sub[256];
        snprintf(sub, sizeof(sub), "%s", path);
        int rc = tok_string_pattern(json_object_get(j, "pattern"), sub, (const void **)&pat);
        if (rc)
            return rc;
        if (!json_is_string(content))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.content: not a string", path);
        z.kind = TOK_NORM_REPLACE;
        z.a = dup_str(pat, &z.a_len);
        z.b = dup_str(content, &z.b_len);
        if (!z.a || !z.b) {
            free(z.a);
            free(z.b);
            return PAGODA_ENOMEM;
        }
    } else {
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s: normalizer type %s is not supported",
                                path, t);
    }
    chain[(*n)++] = z;
    return 0;
}

int tok_normalizer_parse(const void *json, const char *path, TokNormalizer *chain, size_t *n)
{
    *n = 0;
    if (!json)
        return 0;
    return parse_one(json, path, chain, n, 0);
}

void tok_normalizers_fini(TokNormalizer *chain, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(chain[i].a);
        free(chain[i].b);
    }
}
