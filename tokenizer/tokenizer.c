/* The tokenizer: tokenizer.json read into its pipeline (every component checked against what
 * is supported, refused by its JSON path otherwise), the added tokens and their matching, the
 * encode pipeline that ties the stages together, and the lookups of tokenizer.h. */
#include "tokenizer/tok_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/error.h"
#include "common/json_util.h"

void tokenizer_ids_fini(TokenizerIds *ids)
{
    if (!ids)
        return;
    free(ids->ids);
    memset(ids, 0, sizeof(*ids));
}

/* ---- added tokens ---- */

static int json_flag(const json_t *o, const char *key, size_t i, bool def, bool *out)
{
    const json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        *out = def;
        return 0;
    }
    if (!json_is_boolean(v))
        return pagoda_error_set(PAGODA_EFORMAT, "added_tokens[%zu].%s: not a boolean", i, key);
    *out = json_is_true(v);
    return 0;
}

/* Reads added_tokens and gives each its id as HF's AddedVocabulary::add_tokens does, in the
 * file's order: the id of the same content added before, else its id in the model's
 * vocabulary, else the next free one (after the vocabulary's entry count, or after the largest
 * added id when that is past it). The file's "id" is only checked for type: HF does not use it
 * either (it warns when it differs). A content added twice takes its later flags. */
static int parse_added(Tokenizer *t, const json_t *list)
{
    if (!list || json_is_null(list))
        return 0;
    if (!json_is_array(list))
        return pagoda_error_set(PAGODA_EFORMAT, "added_tokens: not an array");
    size_t n = json_array_size(list);
    if (n > TOK_MAX_VOCAB)
        return pagoda_error_set(PAGODA_EFORMAT, "added_tokens: too many");
    t->added = calloc(n ? n : 1, sizeof(*t->added));
    if (!t->added)
        return PAGODA_ENOMEM;
    size_t vocab_count = tok_bpe_vocab_count(t->bpe);
    int64_t max_id = -1;
    for (size_t i = 0; i < n; i++) {
        const json_t *o = json_array_get(list, i);
        const json_t *id = json_object_get(o, "id"), *content = json_object_get(o, "content");
        if (!json_is_integer(id) || json_integer_value(id) < 0)
            return pagoda_error_set(PAGODA_EFORMAT, "added_tokens[%zu].id: not an id", i);
        if (!json_is_string(content) || json_string_length(content) > TOK_MAX_TOKEN_BYTES)
            return pagoda_error_set(PAGODA_EFORMAT, "added_tokens[%zu].content: not a token", i);
        TokAdded a = {0};
        a.len = json_string_length(content);
        int rc = json_flag(o, "special", i, false, &a.special);
        if (!rc)
            rc = json_flag(o, "lstrip", i, false, &a.lstrip);
        if (!rc)
            rc = json_flag(o, "rstrip", i, false, &a.rstrip);
        if (!rc)
            rc = json_flag(o, "single_word", i, false, &a.single_word);
        if (!rc)
            rc = json_flag(o, "normalized", i, !a.special, &a.normalized);
        if (rc)
            return rc;
        if (a.len == 0) /* HF ignores an empty token */
            continue;
        const char *c = json_string_value(content);
        TokAdded *same = NULL;
        for (size_t k = 0; k < t->nadded && !same; k++)
            if (t->added[k].len == a.len && memcmp(t->added[k].content, c, a.len) == 0)
                same = &t->added[k];
        if (same) {
            bool special = same->special || a.special;
            a.content = same->content;
            a.id = same->id;
            *same = a;
            same->special = special;
            continue;
        }
        int32_t vid = tok_bpe_token_to_id(t->bpe, c, a.len);
        if (vid >= 0)
            a.id = vid;
        else if (max_id >= 0 && ((size_t)max_id >= vocab_count || vocab_count == 0))
            a.id = (int32_t)(max_id + 1);
        else
            a.id = (int32_t)vocab_count;
        if ((size_t)a.id >= TOK_MAX_VOCAB)
            return pagoda_error_set(PAGODA_EFORMAT, "added_tokens[%zu]: id past %u", i,
                                    TOK_MAX_VOCAB);
        if (a.id > max_id)
            max_id = a.id;
        if (!(a.content = malloc(a.len + 1)))
            return PAGODA_ENOMEM;
        memcpy(a.content, c, a.len + 1);
        t->added[t->nadded++] = a;
    }
    return 0;
}

typedef struct SortKey {
    unsigned char c;
    uint32_t k;
} SortKey;

static int cmp_key(const void *a, const void *b)
{
    const SortKey *x = a, *y = b;
    if (x->c != y->c)
        return x->c < y->c ? -1 : 1;
    return x->k < y->k ? -1 : (x->k > y->k);
}

/* Builds the set of added tokens with normalized == want; the normalized ones are matched by
 * their normalized content, as HF does. */
static int build_set(Tokenizer *t, bool want, TokAddedSet *set)
{
    set->idx = calloc(t->nadded + 1, sizeof(*set->idx));
    set->pat = calloc(t->nadded + 1, sizeof(*set->pat));
    set->pat_len = calloc(t->nadded + 1, sizeof(*set->pat_len));
    if (!set->idx || !set->pat || !set->pat_len)
        return PAGODA_ENOMEM;
    TokBuf norm = {0}, tmp = {0};
    int rc = 0;
    for (size_t i = 0; i < t->nadded && !rc; i++) {
        if (t->added[i].normalized != want)
            continue;
        const char *p = t->added[i].content;
        size_t plen = t->added[i].len;
        if (want && t->nnorm) {
            rc = tok_normalize(t->norm, t->nnorm, p, plen, &norm, &tmp);
            if (rc || norm.len == 0)
                continue;
            p = norm.data;
            plen = norm.len;
        }
        size_t k = set->n++;
        set->idx[k] = (uint32_t)i;
        set->pat_len[k] = plen;
        if (!(set->pat[k] = malloc(plen + 1)))
            rc = PAGODA_ENOMEM;
        else
            memcpy(set->pat[k], p, plen + 1);
    }
    tokbuf_fini(&norm);
    tokbuf_fini(&tmp);
    if (rc)
        return rc;
    /* sort (idx, pat) by the pattern's first byte, keeping the pairs together */
    SortKey *keys = malloc((set->n + 1) * sizeof(*keys));
    uint32_t *idx = malloc((set->n + 1) * sizeof(*idx));
    char **pat = malloc((set->n + 1) * sizeof(*pat));
    size_t *plen = malloc((set->n + 1) * sizeof(*plen));
    if (keys && idx && pat && plen) {
        for (size_t k = 0; k < set->n; k++)
            keys[k] = (SortKey){(unsigned char)set->pat[k][0], (uint32_t)k};
        qsort(keys, set->n, sizeof(*keys), cmp_key);
        for (size_t k = 0; k < set->n; k++) {
            idx[k] = set->idx[keys[k].k];
            pat[k] = set->pat[keys[k].k];
            plen[k] = set->pat_len[keys[k].k];
        }
        memcpy(set->idx, idx, set->n * sizeof(*idx));
        memcpy(set->pat, pat, set->n * sizeof(*pat));
        memcpy(set->pat_len, plen, set->n * sizeof(*plen));
    } else {
        rc = PAGODA_ENOMEM;
    }
    free(keys);
    free(idx);
    free(pat);
    free(plen);
    if (rc)
        return rc;
    size_t k = 0;
    for (int c = 0; c < 256; c++) {
        set->first[c] = (uint32_t)k;
        while (k < set->n && (unsigned char)set->pat[k][0] == c)
            k++;
    }
    set->first[256] = (uint32_t)k;
    return 0;
}

static void free_set(TokAddedSet *set)
{
    for (size_t k = 0; k < set->n; k++)
        free(set->pat[k]);
    free(set->pat);
    free(set->pat_len);
    free(set->idx);
}

/* HF's single_word test: the regexes \w$ and ^\w on the text around the token. */
static bool ends_with_word(const char *s, size_t len)
{
    if (len == 0)
        return false;
    size_t i = len - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80)
        i--;
    size_t adv;
    return tok_is_word_char(tok_utf8_decode(s + i, len - i, &adv));
}

static bool starts_with_word(const char *s, size_t len)
{
    size_t adv;
    return len > 0 && tok_is_word_char(tok_utf8_decode(s, len, &adv));
}

/* Cuts text at the added tokens of set (HF's AddedVocabulary::find_matches: leftmost-longest
 * matches, single_word, lstrip and rstrip), pushing the pieces to out. */
static int split_added(const Tokenizer *t, const TokAddedSet *set, const char *text, size_t len,
                       bool at_start, TokPieces *out)
{
    size_t start_offset = 0, at = 0;
    while (set->n && at < len) {
        /* the leftmost position where a token begins, and the longest token there */
        size_t ms = at, best = SIZE_MAX;
        for (; ms < len; ms++) {
            unsigned char c = (unsigned char)text[ms];
            for (uint32_t k = set->first[c]; k < set->first[c + 1]; k++)
                if (set->pat_len[k] <= len - ms &&
                    (best == SIZE_MAX || set->pat_len[k] > set->pat_len[best]) &&
                    memcmp(text + ms, set->pat[k], set->pat_len[k]) == 0)
                    best = k;
            if (best != SIZE_MAX)
                break;
        }
        if (best == SIZE_MAX)
            break;
        size_t me = ms + set->pat_len[best];
        at = me;
        const TokAdded *a = &t->added[set->idx[best]];
        size_t start = ms, stop = me;
        if (a->single_word && ((start > 0 && ends_with_word(text, start)) ||
                               (stop < len && starts_with_word(text + stop, len - stop))))
            continue;
        if (a->lstrip) {
            /* Back over whitespace, no further than the previous cut (start never goes below
             * it), so that runs of a whitespace token with lstrip stay linear. */
            size_t ns = start;
            while (ns > start_offset) {
                size_t b = ns - 1;
                while (b > start_offset && ((unsigned char)text[b] & 0xC0) == 0x80)
                    b--;
                size_t adv;
                if (!tok_is_whitespace(tok_utf8_decode(text + b, ns - b, &adv)))
                    break;
                ns = b;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (a->rstrip) {
            while (stop < len) {
                size_t adv;
                if (!tok_is_whitespace(tok_utf8_decode(text + stop, len - stop, &adv)))
                    break;
                stop += adv;
            }
        }
        if (start_offset < start && tokpieces_push(out, text + start_offset, start - start_offset,
                                                   -1, at_start && start_offset == 0))
            return PAGODA_ENOMEM;
        /* A token inside the whitespace an earlier one's rstrip took ("\n" lstrip rstrip in
         * "a\n\nb") has an empty span, which HF drops with every empty split. (With lstrip
         * and no rstrip its span runs backwards and HF panics; it is dropped here too.) */
        if (stop > start && tokpieces_push(out, "", 0, a->id, false))
            return PAGODA_ENOMEM;
        if (stop > start_offset)
            start_offset = stop;
    }
    if (start_offset < len && tokpieces_push(out, text + start_offset, len - start_offset, -1,
                                             at_start && start_offset == 0))
        return PAGODA_ENOMEM;
    return 0;
}

/* The decode strings of the added tokens and the ids skip_special_tokens drops (see Tokenizer),
 * as HF has them. */
static int decode_strings(Tokenizer *t)
{
    TokBuf norm = {0}, tmp = {0};
    int rc = 0;
    for (size_t i = 0; i < t->nadded && !rc; i++) {
        TokAdded *a = &t->added[i];
        if (!a->normalized || !t->nnorm)
            continue;
        rc = tok_normalize(t->norm, t->nnorm, a->content, a->len, &norm, &tmp);
        if (rc || (norm.len == a->len && memcmp(norm.data, a->content, a->len) == 0))
            continue;
        if (!(a->dec = malloc(norm.len + 1))) {
            rc = PAGODA_ENOMEM;
            break;
        }
        memcpy(a->dec, norm.data, norm.len + 1);
        a->dec_len = norm.len;
    }
    tokbuf_fini(&norm);
    tokbuf_fini(&tmp);
    if (rc)
        return rc;
    if (!(t->skip = calloc(t->vocab_size, 1)))
        return PAGODA_ENOMEM;
    for (size_t i = 0; i < t->nadded; i++) {
        const TokAdded *a = &t->added[i];
        if (!a->dec) {
            t->skip[a->id] = a->special;
        } else { /* a changed string: special only if it is some special token's content */
            for (size_t k = 0; k < t->nadded; k++)
                if (t->added[k].special && t->added[k].len == a->dec_len &&
                    memcmp(t->added[k].content, a->dec, a->dec_len) == 0)
                    t->skip[a->id] = 1;
        }
        int32_t vid = a->special ? tok_bpe_token_to_id(t->bpe, a->content, a->len) : -1;
        if (vid >= 0 && !t->added_by_id[vid])
            t->skip[vid] = 1;
    }
    return 0;
}

/* ---- the post-processor ---- */

static int parse_template(Tokenizer *t, const json_t *j, const char *path)
{
    if (t->has_template)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s: a second TemplateProcessing", path);
    const json_t *single = json_object_get(j, "single");
    const json_t *specials = json_object_get(j, "special_tokens");
    if (!json_is_array(single) || json_array_size(single) > TOK_MAX_TEMPLATE)
        return pagoda_error_set(PAGODA_EFORMAT, "%s.single: not an array of at most %u", path,
                                TOK_MAX_TEMPLATE);
    t->has_template = true;
    bool seen_a = false;
    for (size_t i = 0; i < json_array_size(single); i++) {
        const json_t *e = json_array_get(single, i);
        const json_t *sp = json_object_get(e, "SpecialToken"),
                     *seq = json_object_get(e, "Sequence");
        TokTemplatePiece *p = &t->tmpl[t->ntmpl];
        if (json_is_object(seq)) {
            const json_t *id = json_object_get(seq, "id");
            if (!json_is_string(id) || strcmp(json_string_value(id), "A") != 0 || seen_a)
                return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                        "%s.single[%zu]: only one Sequence A is supported", path,
                                        i);
            p->is_sequence = true;
            seen_a = true;
        } else if (json_is_object(sp) && json_is_string(json_object_get(sp, "id"))) {
            const char *name = json_string_value(json_object_get(sp, "id"));
            const json_t *def = json_object_get(specials, name);
            const json_t *ids = json_object_get(def, "ids");
            if (!json_is_array(ids) || json_array_size(ids) > TOK_MAX_TEMPLATE)
                return pagoda_error_set(
                    PAGODA_EFORMAT, "%s.special_tokens[\"%.64s\"].ids: not an array", path, name);
            p->n = json_array_size(ids);
            p->ids = calloc(p->n + 1, sizeof(*p->ids));
            if (!p->ids)
                return PAGODA_ENOMEM;
            for (size_t k = 0; k < p->n; k++) {
                const json_t *v = json_array_get(ids, k);
                size_t len;
                /* an id no token has: HF would emit it and then drop it when decoding */
                if (!json_is_integer(v) || json_integer_value(v) < 0 ||
                    json_integer_value(v) >= (json_int_t)t->vocab_size ||
                    !tok_id_string(t, (int32_t)json_integer_value(v), &len)) {
                    t->ntmpl++;
                    return pagoda_error_set(
                        PAGODA_EFORMAT,
                        "%s.special_tokens[\"%.64s\"].ids[%zu]: not the id of a token", path, name,
                        k);
                }
                p->ids[k] = (int32_t)json_integer_value(v);
            }
        } else {
            return pagoda_error_set(PAGODA_EFORMAT,
                                    "%s.single[%zu]: neither SpecialToken nor Sequence", path, i);
        }
        t->ntmpl++;
    }
    if (!seen_a)
        return pagoda_error_set(PAGODA_EFORMAT, "%s.single: no Sequence A", path);
    return 0;
}

static int parse_post(Tokenizer *t, const json_t *j, const char *path, int depth)
{
    if (!j || json_is_null(j))
        return 0;
    const json_t *type = json_object_get(j, "type");
    if (!json_is_object(j) || !json_is_string(type))
        return pagoda_error_set(PAGODA_EFORMAT, "%s: not an object with a type", path);
    const char *ty = json_string_value(type);
    if (strcmp(ty, "ByteLevel") == 0) /* offsets only: the ids are unchanged */
        return 0;
    if (strcmp(ty, "TemplateProcessing") == 0)
        return parse_template(t, j, path);
    if (strcmp(ty, "Sequence") == 0) {
        const json_t *list = json_object_get(j, "processors");
        if (!json_is_array(list))
            return pagoda_error_set(PAGODA_EFORMAT, "%s.processors: not an array", path);
        if (depth > 4)
            return pagoda_error_set(PAGODA_EFORMAT, "%s: Sequences nested too deep", path);
        for (size_t i = 0; i < json_array_size(list); i++) {
            char sub[256];
            snprintf(sub, sizeof(sub), "%s.processors[%zu]", path, i);
            int rc = parse_post(t, json_array_get(list, i), sub, depth + 1);
            if (rc)
                return rc;
        }
        return 0;
    }
    return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s: post-processor type %s is not supported",
                            path, ty);
}

/* ---- loading ---- */

void tokenizer_free(Tokenizer *t)
{
    if (!t)
        return;
    tok_bpe_free(t->bpe);
    for (size_t i = 0; i < t->nadded; i++) {
        free(t->added[i].content);
        free(t->added[i].dec);
    }
    free(t->added);
    free_set(&t->added_raw);
    free_set(&t->added_norm);
    free(t->added_by_id);
    free(t->skip);
    tok_normalizers_fini(t->norm, t->nnorm);
    tok_pretokenizers_fini(t->pre, t->npre);
    for (size_t i = 0; i < t->ntmpl; i++)
        free(t->tmpl[i].ids);
    tok_decoders_fini(t->dec, t->ndec);
    for (size_t i = 0; i < t->npool; i++) {
        tokscratch_fini(t->pool[i]);
        free(t->pool[i]);
    }
    pthread_mutex_destroy(&t->pool_lock);
    free(t);
}

static int refuse_set(const json_t *root, const char *key)
{
    const json_t *v = json_object_get(root, key);
    if (v && !json_is_null(v))
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "%s: only null is supported", key);
    return 0;
}

/* tokenizer_max_bytes_per_token: the bytes of raw text one id may stand for, through each
 * stage. An added token matched in the raw text stands for its content; one matched in normalized
 * text, and the model's tokens (in words the pre-tokenizers cut without dropping a byte), for
 * their bytes of normalized text, which stand for at most the normalizers' shrink factors'
 * product of raw bytes. 0 where a stage may make any run of text one id or none. */
static size_t derive_max_bytes_per_token(const Tokenizer *t)
{
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].lstrip || t->added[i].rstrip) /* any run of whitespace besides */
            return 0;
    uint64_t shrink = 1;
    for (size_t i = 0; i < t->nnorm; i++) {
        const TokNormalizer *z = &t->norm[i];
        if (z->kind == TOK_NORM_LOWERCASE)
            shrink *= TOK_LOWERCASE_MAX_SHRINK;
        else if (z->kind == TOK_NORM_REPLACE && z->a_len > z->b_len)
            shrink *= z->b_len == 0 ? 0 : (z->a_len + z->b_len - 1) / z->b_len;
        else if (z->kind != TOK_NORM_PREPEND && z->kind != TOK_NORM_REPLACE)
            shrink *= TOK_NORMAL_FORM_MAX_SHRINK;
        if (shrink == 0 || shrink > TOKENIZER_MAX_TEXT_BYTES)
            return 0;
    }
    bool bytelevel = false;
    for (size_t i = 0; i < t->npre; i++) {
        if (t->pre[i].kind == TOK_PRE_SPLIT && t->pre[i].behavior == TOK_SPLIT_REMOVED)
            return 0;
        bytelevel |= t->pre[i].kind == TOK_PRE_BYTELEVEL;
    }
    uint64_t normalized = tok_bpe_max_bytes_per_token(t->bpe, bytelevel);
    if (normalized == 0)
        return 0;
    for (size_t k = 0; k < t->added_norm.n; k++)
        if (t->added_norm.pat_len[k] > normalized)
            normalized = t->added_norm.pat_len[k];
    uint64_t most = normalized * shrink;
    for (size_t k = 0; k < t->added_raw.n; k++)
        if (t->added_raw.pat_len[k] > most)
            most = t->added_raw.pat_len[k];
    /* A token standing for more than the longest text is no bound at all. */
    return most > TOKENIZER_MAX_TEXT_BYTES ? 0 : (size_t)most;
}

static int build(const json_t *root, Tokenizer **out)
{
    if (!json_is_object(root))
        return pagoda_error_set(PAGODA_EFORMAT, "tokenizer.json: not a JSON object");
    int rc = refuse_set(root, "truncation");
    if (!rc)
        rc = refuse_set(root, "padding");
    if (rc)
        return rc;
    const json_t *model = json_object_get(root, "model");
    if (!model)
        return pagoda_error_set(PAGODA_EFORMAT, "model: missing");
    Tokenizer *t = calloc(1, sizeof(*t));
    if (!t)
        return PAGODA_ENOMEM;
    pthread_mutex_init(&t->pool_lock, NULL);
    rc = tok_bpe_parse(model, &t->bpe);
    if (!rc)
        rc = parse_added(t, json_object_get(root, "added_tokens"));
    if (!rc)
        rc = tok_normalizer_parse(json_object_get(root, "normalizer"), "normalizer", t->norm,
                                  &t->nnorm);
    if (!rc)
        rc = tok_pretokenizer_parse(json_object_get(root, "pre_tokenizer"), "pre_tokenizer", t->pre,
                                    &t->npre);
    if (!rc)
        rc = tok_decoder_parse(json_object_get(root, "decoder"), "decoder", t->dec, &t->ndec);
    if (rc)
        goto fail;
    t->vocab_size = tok_bpe_vocab_size(t->bpe);
    for (size_t i = 0; i < t->nadded; i++)
        if ((size_t)t->added[i].id + 1 > t->vocab_size)
            t->vocab_size = (size_t)t->added[i].id + 1;
    t->added_by_id = calloc(t->vocab_size, sizeof(*t->added_by_id));
    if (!t->added_by_id) {
        rc = PAGODA_ENOMEM;
        goto fail;
    }
    for (size_t i = 0; i < t->nadded; i++)
        t->added_by_id[t->added[i].id] = (uint32_t)i + 1;
    rc = decode_strings(t);
    if (!rc)
        rc = parse_post(t, json_object_get(root, "post_processor"), "post_processor", 0);
    if (!rc)
        rc = build_set(t, false, &t->added_raw);
    if (!rc)
        rc = build_set(t, true, &t->added_norm);
    if (rc)
        goto fail;
    t->max_bytes_per_token = derive_max_bytes_per_token(t);
    *out = t;
    return 0;
fail:
    tokenizer_free(t);
    return rc;
}

int tokenizer_new_from_json(const char *json, size_t len, Tokenizer **out)
{
    if (!json || !out)
        return pagoda_error_set(PAGODA_EINVAL, "tokenizer_new_from_json: a NULL argument");
    if (len > TOKENIZER_MAX_FILE_BYTES)
        return pagoda_error_set(PAGODA_ERANGE, "tokenizer.json: %zu bytes (at most %u)", len,
                                TOKENIZER_MAX_FILE_BYTES);
    json_error_t err;
    json_t *root = json_loadb(json, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!root)
        return pagoda_error_set(PAGODA_EFORMAT, "tokenizer.json: line %d column %d: %s", err.line,
                                err.column, err.text);
    int rc = build(root, out);
    json_decref(root);
    return rc;
}

/* The file through json_util_read_file (large reads; regular files only, opened without blocking
 * on a FIFO), then tokenizer_new_from_json. */
int tokenizer_new_from_file(const char *path, Tokenizer **out)
{
    if (!path || !out)
        return pagoda_error_set(PAGODA_EINVAL, "tokenizer_new_from_file: a NULL argument");
    char *buf = NULL;
    size_t size = 0;
    int rc = json_util_read_file(path, TOKENIZER_MAX_FILE_BYTES, &buf, &size);
    if (rc != 0)
        return rc;
    rc = tokenizer_new_from_json(buf, size, out);
    if (rc && pagoda_error_detail()[0]) {
        char detail[512];
        snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
        pagoda_error_set(rc, "%s: %s", path, detail);
    }
    free(buf);
    return rc;
}

/* ---- lookups ---- */

const char *tok_id_string(const Tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->vocab_size)
        return NULL;
    uint32_t a = t->added_by_id[id];
    if (a) {
        const TokAdded *x = &t->added[a - 1];
        *len = x->dec ? x->dec_len : x->len;
        return x->dec ? x->dec : x->content;
    }
    return tok_bpe_id_to_token(t->bpe, id, len);
}

size_t tokenizer_vocab_size(const Tokenizer *t)
{
    return t ? t->vocab_size : 0;
}

int32_t tokenizer_token_to_id(const Tokenizer *t, const char *token)
{
    if (!t || !token)
        return -1;
    size_t len = strlen(token);
    for (size_t i = 0; i < t->nadded; i++)
        if (t->added[i].len == len && memcmp(t->added[i].content, token, len) == 0)
            return t->added[i].id;
    return tok_bpe_token_to_id(t->bpe, token, len);
}

const char *tokenizer_id_to_token(const Tokenizer *t, int32_t id)
{
    size_t len;
    return t ? tok_id_string(t, id, &len) : NULL;
}

size_t tokenizer_max_bytes_per_token(const Tokenizer *t)
{
    return t ? t->max_bytes_per_token : 0;
}

bool tokenizer_is_special(const Tokenizer *t, int32_t id)
{
    if (!t || id < 0 || (size_t)id >= t->vocab_size)
        return false;
    uint32_t a = t->added_by_id[id];
    return a && t->added[a - 1].special;
}

/* ---- encoding ---- */

/* A scratch from the pool, or a new one (NULL when out of memory). */
static TokScratch *scratch_get(const Tokenizer *t)
{
    Tokenizer *m = (Tokenizer *)t; /* the pool is the encoders' own, behind its lock */
    TokScratch *s = NULL;
    pthread_mutex_lock(&m->pool_lock);
    if (m->npool)
        s = m->pool[--m->npool];
    pthread_mutex_unlock(&m->pool_lock);
    return s ? s : calloc(1, sizeof(*s));
}

/* Keeps a scratch for the next call, unless the pool is full or the scratch grew large. */
static void scratch_put(const Tokenizer *t, TokScratch *s)
{
    Tokenizer *m = (Tokenizer *)t;
    if (tokscratch_bytes(s) <= TOK_SCRATCH_KEEP_BYTES) {
        pthread_mutex_lock(&m->pool_lock);
        if (m->npool < TOK_SCRATCH_POOL) {
            m->pool[m->npool++] = s;
            s = NULL;
        }
        pthread_mutex_unlock(&m->pool_lock);
    }
    if (s) {
        tokscratch_fini(s);
        free(s);
    }
}

static int ids_push(TokenizerIds *out, int32_t id)
{
    if (out->len == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 64;
        int32_t *p = realloc(out->ids, cap * sizeof(*p));
        if (!p)
            return PAGODA_ENOMEM;
        out->ids = p;
        out->cap = cap;
    }
    out->ids[out->len++] = id;
    return 0;
}

static int encode_text(const Tokenizer *t, const char *text, size_t len, TokenizerIds *out,
                       TokScratch *s)
{
    TokPieces *in = &s->a, *next = &s->b;
    tokpieces_clear(in); /* the scratch may come from an earlier call */
    /* 1. the added tokens matched in the raw text */
    int rc = split_added(t, &t->added_raw, text, len, true, in);
    if (rc)
        return rc;
    /* 2. the rest normalized, and the normalized added tokens matched in it */
    if (t->nnorm || t->added_norm.n) {
        tokpieces_clear(next);
        for (size_t i = 0; i < in->n && !rc; i++) {
            const TokSpan *sp = &in->spans[i];
            if (sp->id >= 0) {
                rc = tokpieces_push(next, "", 0, sp->id, false);
                continue;
            }
            rc = tok_normalize(t->norm, t->nnorm, in->buf.data + sp->off, sp->len, &s->norm,
                               &s->tmp);
            if (!rc)
                rc = split_added(t, &t->added_norm, s->norm.data, s->norm.len, sp->at_start, next);
        }
        if (rc)
            return rc;
        TokPieces *swap = in;
        in = next;
        next = swap;
    }
    /* 3. pre-tokenized into words */
    rc = tok_pretokenize(t->pre, t->npre, &in, &next, s);
    /* 4. each word through the model */
    for (size_t i = 0; i < in->n && !rc; i++) {
        const TokSpan *sp = &in->spans[i];
        if (sp->id >= 0)
            rc = ids_push(out, sp->id);
        else
            rc = tok_bpe_encode_word(t->bpe, in->buf.data + sp->off, sp->len, out, s);
    }
    return rc;
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool add_special_tokens,
                     TokenizerIds *out)
{
    if (!t || (!text && len) || !out)
        return pagoda_error_set(PAGODA_EINVAL, "tokenizer_encode: a NULL argument");
    if (len > TOKENIZER_MAX_TEXT_BYTES)
        return pagoda_error_set(PAGODA_EINVAL, "text of %zu bytes (at most %u)", len,
                                TOKENIZER_MAX_TEXT_BYTES);
    size_t valid = tok_utf8_valid_prefix(text, len);
    if (valid != len)
        return pagoda_error_set(PAGODA_EINVAL, "text is not valid UTF-8 at byte %zu", valid);
    size_t before = out->len;
    TokScratch *s = scratch_get(t);
    if (!s)
        return PAGODA_ENOMEM;
    int rc = 0;
    bool tmpl = add_special_tokens && t->has_template;
    size_t k = 0;
    for (; tmpl && k < t->ntmpl && !t->tmpl[k].is_sequence && !rc; k++)
        for (size_t j = 0; j < t->tmpl[k].n && !rc; j++)
            rc = ids_push(out, t->tmpl[k].ids[j]);
    if (!rc)
        rc = encode_text(t, text ? text : "", len, out, s);
    for (k = k + 1; tmpl && k < t->ntmpl && !rc; k++)
        for (size_t j = 0; j < t->tmpl[k].n && !rc; j++)
            rc = ids_push(out, t->tmpl[k].ids[j]);
    scratch_put(t, s);
    if (rc)
        out->len = before;
    return rc;
}
