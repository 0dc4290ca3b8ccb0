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
#include <xxhash.h>

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

/* The index into t->added of the token whose content is s[0..len), or -1. Contents are unique
 * (parse_added merges a content given twice), so this is the only one. */
static int32_t added_find(const Tokenizer *t, const char *s, size_t len)
{
    if (!t->added_table)
        return -1;
    for (size_t i = XXH3_64bits(s, len) & t->added_mask;; i = (i + 1) & t->added_mask) {
        int32_t k = t->added_table[i];
        if (k < 0)
            return -1;
        if (t->added[k].len == len && memcmp(t->added[k].content, s, len) == 0)
            return k;
    }
}

/* Reads added_tokens and gives each its id as HF's AddedVocabulary::add_tokens does, in the
 * file's order: the id of the same content added before, else its id in the model's
 * vocabulary, else the next free one (after the vocabulary's entry count, or after the largest
 * added id when that is past it). The file's "id" is only checked for type: HF does not use it
 * either (it warns when it differs). A content added twice takes its later flags. The contents
 * go into a hash table as they are read, so that finding the earlier one costs the same however
 * many there are (a scan of all earlier ones made a file of 100k added tokens load in 20 s). */
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
    size_t cap = tok_pow2_at_least(n * 2);
    t->added_table = malloc(cap * sizeof(*t->added_table));
    if (!t->added || !t->added_table)
        return PAGODA_ENOMEM;
    memset(t->added_table, 0xff, cap * sizeof(*t->added_table));
    t->added_mask = cap - 1;
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
        int32_t k = added_find(t, c, a.len);
        if (k >= 0) {
            TokAdded *same = &t->added[k];
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
        size_t slot = XXH3_64bits(c, a.len) & t->added_mask;
        while (t->added_table[slot] >= 0)
            slot = (slot + 1) & t->added_mask;
        t->added_table[slot] = (int32_t)t->nadded;
        t->added[t->nadded++] = a;
    }
    return 0;
}

/* ---- the added tokens' automaton ----
 *
 * HF finds added tokens leftmost-longest: the first position where one begins, and there the
 * longest. Trying every token at every position (or every token with the right first byte, as
 * this did before) costs the number of tokens per byte of text: 2.8 s for 20 KB of '<' with 25k
 * added tokens that begin with it. An Aho-Corasick automaton over the contents read backwards
 * gives the longest token that begins at each position in one backwards pass over the text, a
 * constant number of steps per byte on average (Aho-Corasick's amortization: each failure link
 * taken shortens the node) whatever the tokens are. After reading text[i..] backwards it stands
 * at the longest prefix of text[i..] that some content ends with; every content that begins at
 * i is a prefix of that one, and longest[] of the node is the longest of them. Read forwards,
 * the automaton would find where tokens end, and leftmost-longest needs where they begin. */

/* The slot of the edge (parent, b) in the edge table: a multiplicative hash of the pair. */
static size_t edge_slot(const TokAddedSet *set, uint32_t parent, unsigned char b)
{
    uint64_t k = (((uint64_t)parent << 8) | b) * 0x9E3779B97F4A7C15ull;
    return (size_t)(k >> 29) & set->edges_mask;
}

/* The child of node v by byte b, or 0 (the root is nobody's child). */
static uint32_t edge_find(const TokAddedSet *set, uint32_t v, unsigned char b)
{
    for (size_t i = edge_slot(set, v, b);; i = (i + 1) & set->edges_mask) {
        uint32_t c = set->edges[i];
        if (c == 0 || (set->parent[c] == v && set->byte[c] == b))
            return c;
    }
}

/* The automaton's step from node v on byte b: the child, else the child of the longest suffix
 * that has one (Aho-Corasick's failure links), else the root. */
static uint32_t step(const TokAddedSet *set, uint32_t v, unsigned char b)
{
    while (v) {
        uint32_t c = edge_find(set, v, b);
        if (c)
            return c;
        v = set->fail[v];
    }
    return set->root_next[b];
}

/* Builds the automaton of the added tokens with normalized == want; the normalized ones are
 * matched by their normalized content, as HF does. Of two tokens with the same (normalized)
 * content the earlier one in the file is the one found. */
static int build_set(Tokenizer *t, bool want, TokAddedSet *set)
{
    TokBuf all = {0}, norm = {0}, tmp = {0};
    uint32_t *depth = NULL, *order = NULL;
    size_t *count = NULL;
    int rc = 0;
    set->idx = calloc(t->nadded + 1, sizeof(*set->idx));
    set->pat_len = calloc(t->nadded + 1, sizeof(*set->pat_len));
    if (!set->idx || !set->pat_len) {
        rc = PAGODA_ENOMEM;
        goto done;
    }
    /* 1. the contents, one after another in all */
    for (size_t i = 0; i < t->nadded; i++) {
        if (t->added[i].normalized != want)
            continue;
        const char *p = t->added[i].content;
        size_t plen = t->added[i].len;
        if (want && t->nnorm) {
            if ((rc = tok_normalize(t->norm, t->nnorm, p, plen, &norm, &tmp)))
                goto done;
            if (norm.len == 0)
                continue;
            p = norm.data;
            plen = norm.len;
        }
        if (plen > TOK_MAX_ADDED_BYTES - all.len) {
            rc = pagoda_error_set(PAGODA_EFORMAT, "added_tokens: more than %u bytes of %s contents",
                                  TOK_MAX_ADDED_BYTES, want ? "normalized" : "raw");
            goto done;
        }
        if ((rc = tokbuf_append(&all, p, plen)))
            goto done;
        set->idx[set->n] = (uint32_t)i;
        set->pat_len[set->n++] = plen;
        if (plen > set->max_len)
            set->max_len = plen;
    }
    /* 2. the trie of the contents read backwards: at most one node per byte, and the root */
    size_t cap = all.len + 1, ecap = tok_pow2_at_least(cap * 2);
    set->parent = malloc(cap * sizeof(*set->parent));
    set->byte = malloc(cap);
    set->fail = calloc(cap, sizeof(*set->fail));
    set->longest = calloc(cap, sizeof(*set->longest));
    set->edges = calloc(ecap, sizeof(*set->edges));
    depth = calloc(cap, sizeof(*depth));
    order = malloc(cap * sizeof(*order));
    count = calloc(set->max_len + 2, sizeof(*count));
    if (!set->parent || !set->byte || !set->fail || !set->longest || !set->edges || !depth ||
        !order || !count) {
        rc = PAGODA_ENOMEM;
        goto done;
    }
    set->edges_mask = ecap - 1;
    set->parent[0] = 0;
    set->byte[0] = 0;
    set->nnodes = 1;
    const unsigned char *p = (const unsigned char *)all.data;
    for (size_t k = 0; k < set->n; p += set->pat_len[k++]) {
        uint32_t v = 0;
        for (size_t j = set->pat_len[k]; j-- > 0;) {
            uint32_t c = edge_find(set, v, p[j]);
            if (!c) {
                c = (uint32_t)set->nnodes++;
                set->parent[c] = v;
                set->byte[c] = p[j];
                depth[c] = depth[v] + 1;
                size_t i = edge_slot(set, v, p[j]);
                while (set->edges[i])
                    i = (i + 1) & set->edges_mask;
                set->edges[i] = c;
                if (v == 0)
                    set->root_next[p[j]] = c;
            }
            v = c;
        }
        if (!set->longest[v]) /* the earlier of two equal contents */
            set->longest[v] = (uint32_t)k + 1;
    }
    /* 3. the failure links, shorter nodes first (a node's link is shorter than it), and with
     * them the longest content each node begins with: its own, else its link's */
    for (size_t v = 1; v < set->nnodes; v++)
        count[depth[v]]++;
    for (size_t d = 1, at = 1; d <= set->max_len + 1; d++) {
        size_t c = count[d];
        count[d] = at;
        at += c;
    }
    for (size_t v = 1; v < set->nnodes; v++)
        order[count[depth[v]]++] = (uint32_t)v;
    for (size_t o = 1; o < set->nnodes; o++) {
        uint32_t v = order[o];
        set->fail[v] = depth[v] == 1 ? 0 : step(set, set->fail[set->parent[v]], set->byte[v]);
        if (!set->longest[v])
            set->longest[v] = set->longest[set->fail[v]];
    }
done:
    tokbuf_fini(&all);
    tokbuf_fini(&norm);
    tokbuf_fini(&tmp);
    free(depth);
    free(order);
    free(count);
    return rc;
}

static void free_set(TokAddedSet *set)
{
    free(set->idx);
    free(set->pat_len);
    free(set->parent);
    free(set->byte);
    free(set->fail);
    free(set->longest);
    free(set->edges);
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

/* Finds the positions of text[from..from+n) where a token of set begins, and the longest one
 * at each, pushing them to hits from the last to the first (so that the leftmost is on top);
 * returns how many. It reads backwards from max_len bytes past the window (or the end of the
 * text): no token is longer, so by the window the automaton stands where it would have after
 * reading the whole rest of the text. */
static size_t scan_window(const TokAddedSet *set, const char *text, size_t len, size_t from,
                          size_t n, TokAddedHit *hits)
{
    size_t end = len - (from + n) > set->max_len ? from + n + set->max_len : len, nhits = 0;
    uint32_t v = 0;
    for (size_t i = end; i-- > from;) {
        unsigned char b = (unsigned char)text[i];
        v = v ? step(set, v, b) : set->root_next[b];
        if (v && set->longest[v] && i < from + n)
            hits[nhits++] = (TokAddedHit){(uint32_t)(i - from), set->longest[v] - 1};
    }
    return nhits;
}

/* Cuts text at the added tokens of set (HF's AddedVocabulary::find_matches: leftmost-longest
 * matches, single_word, lstrip and rstrip), pushing the pieces to out. Where tokens begin comes
 * from scan_window, a window of the text at a time, so that the scratch it needs (s->added_hits)
 * does not grow with the text. */
static int split_added(const Tokenizer *t, const TokAddedSet *set, const char *text, size_t len,
                       bool at_start, TokPieces *out, TokScratch *s)
{
    size_t window = set->max_len > TOK_ADDED_WINDOW ? set->max_len : TOK_ADDED_WINDOW;
    size_t need = len < window ? len : window;
    if (set->n && s->added_hits_cap < need) {
        TokAddedHit *p = realloc(s->added_hits, need * sizeof(*p));
        if (!p)
            return PAGODA_ENOMEM;
        s->added_hits = p;
        s->added_hits_cap = need;
    }
    size_t start_offset = 0, at = 0;
    size_t win_from = 0, win_end = 0, nhits = 0; /* hits of text[win_from..win_end) */
    while (set->n && at < len) {
        /* the leftmost position from at where a token begins, and the longest token there */
        while (nhits && win_from + s->added_hits[nhits - 1].off < at)
            nhits--;
        while (!nhits && win_end < len) {
            win_from = at > win_end ? at : win_end;
            size_t n = len - win_from < window ? len - win_from : window;
            nhits = scan_window(set, text, len, win_from, n, s->added_hits);
            win_end = win_from + n;
        }
        if (!nhits)
            break;
        const TokAddedHit *hit = &s->added_hits[--nhits];
        size_t ms = win_from + hit->off, best = hit->k;
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
            int32_t k = added_find(t, a->dec, a->dec_len);
            if (k >= 0 && t->added[k].special)
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
    free(t->added_table);
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
        /* the path instead of the details' own "tokenizer.json: " where they start with it */
        static const char own[] = "tokenizer.json: ";
        const char *d = pagoda_error_detail();
        if (strncmp(d, own, sizeof(own) - 1) == 0)
            d += sizeof(own) - 1;
        char detail[512];
        snprintf(detail, sizeof(detail), "%s", d);
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
    int32_t k = added_find(t, token, len);
    return k >= 0 ? t->added[k].id : tok_bpe_token_to_id(t->bpe, token, len);
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
    int rc = split_added(t, &t->added_raw, text, len, true, in, s);
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
                rc = split_added(t, &t->added_norm, s->norm.data, s->norm.len, sp->at_start, next,
                                 s);
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
