/* The BPE model: the vocabulary and the merge ranks in open-addressing hash tables, a word's
 * merges applied lowest rank first through a binary heap over a linked list of symbols (each
 * merge O(log n), so a word of n characters costs O(n log n), however long), and a bounded,
 * striped-lock word cache so that frequent words skip the merges.
 *
 * Semantics are those of Hugging Face's `BPE::merge_word` and `Word::merge_all`: a character
 * missing from the vocabulary becomes its <0xNN> byte tokens (byte_fallback) when all exist,
 * else the unknown token (consecutive ones fused with fuse_unk); with ignore_merges a word that
 * is itself in the vocabulary is that token. */
#include "tokenizer/tok_internal.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/error.h"

typedef struct VocabEntry {
    uint32_t off; /* into TokBpe.arena */
    uint32_t len;
} VocabEntry;

typedef struct MergeSlot {
    uint64_t key; /* (left id << 32 | right id) + 1; 0 = empty */
    uint32_t rank;
    int32_t new_id;
} MergeSlot;

typedef struct CacheSlot {
    uint32_t klen; /* 0 = empty */
    uint32_t nids;
    char key[TOK_CACHE_KEY_BYTES];
    int32_t ids[TOK_CACHE_IDS];
} CacheSlot;

struct TokBpe {
    char *arena; /* every token's bytes, NUL-separated */
    size_t arena_len;
    VocabEntry *by_id; /* len 0 and off UINT32_MAX: no token */
    size_t nids;
    size_t count;   /* entries (HF's get_vocab_size; ids may have gaps) */
    int32_t *table; /* string -> id, -1 empty */
    size_t table_mask;
    MergeSlot *merges;
    size_t merges_mask;
    int32_t unk_id; /* -1: none */
    bool fuse_unk;
    bool byte_fallback;
    bool ignore_merges;
    /* No token has U+2581 after another character than U+2581: a word may be cut before each
     * run of U+2581 without changing its ids (see split_at_meta) */
    bool meta_cuts;
    int32_t byte_ids[256]; /* <0xNN> ids, -1 when absent */
    CacheSlot *cache;
    pthread_mutex_t locks[TOK_CACHE_STRIPES];
};

typedef struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    uint32_t len;
} Symbol;

/* A candidate merge on the heap: (rank << 32 | position), so that one integer comparison orders
 * by rank and then leftmost first, as HF's does. A candidate is stale when the pair at its
 * position is no longer the one of its rank (HF compares the new id; for one position the two
 * tests agree, since the merged string, hence the new id, differs whenever the pair does). */
typedef uint64_t HeapItem;

static uint64_t hash_bytes(const char *s, size_t len)
{
    return XXH3_64bits(s, len);
}

static uint64_t hash_pair(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ull;
    k ^= k >> 33;
    return k;
}

int32_t tok_bpe_token_to_id(const TokBpe *m, const char *s, size_t len)
{
    size_t i = hash_bytes(s, len) & m->table_mask;
    for (;;) {
        int32_t id = m->table[i];
        if (id < 0)
            return -1;
        const VocabEntry *e = &m->by_id[id];
        if (e->len == len && memcmp(m->arena + e->off, s, len) == 0)
            return id;
        i = (i + 1) & m->table_mask;
    }
}

const char *tok_bpe_id_to_token(const TokBpe *m, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= m->nids || m->by_id[id].off == UINT32_MAX)
        return NULL;
    *len = m->by_id[id].len;
    return m->arena + m->by_id[id].off;
}

size_t tok_bpe_vocab_size(const TokBpe *m)
{
    return m->nids;
}

size_t tok_bpe_vocab_count(const TokBpe *m)
{
    return m->count;
}

/* A leaf symbol of a word (a character in the vocabulary, a <0xNN> byte token, or the unknown
 * token for one character) stands for at most as many bytes of the word as its string has, the
 * unknown token excepted (one character, up to 4 bytes, whatever its string); a merged token's
 * string is its parts' strings joined, so the longest string bounds every token, times 4 where
 * the unknown token may be a part. A character that gives no symbol (no byte fallback, no unknown
 * token) or a run of them fused into one unknown token has no bound: 0. */
size_t tok_bpe_max_bytes_per_token(const TokBpe *m, bool bytelevel_words)
{
    size_t longest = 0;
    for (size_t id = 0; id < m->nids; id++)
        if (m->by_id[id].len > longest)
            longest = m->by_id[id].len;
    bool every_byte = m->byte_fallback;
    for (int b = 0; b < 256 && every_byte; b++)
        every_byte = m->byte_ids[b] >= 0;
    /* the 256 ByteLevel characters are the code points below 324 that stand for a byte */
    bool every_char = bytelevel_words;
    for (uint32_t cp = 0; cp < 324 && every_char; cp++) {
        char enc[4];
        if (tok_bytelevel_byte(cp) >= 0)
            every_char = tok_bpe_token_to_id(m, enc, tok_utf8_encode(cp, enc)) >= 0;
    }
    if (every_byte || every_char)
        return longest;
    if (m->unk_id < 0 || m->fuse_unk)
        return 0;
    return 4 * (longest > 0 ? longest : 1);
}

static const MergeSlot *merge_find(const TokBpe *m, int32_t a, int32_t b)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = hash_pair(key) & m->merges_mask;
    for (;;) {
        const MergeSlot *s = &m->merges[i];
        if (s->key == key)
            return s;
        if (s->key == 0)
            return NULL;
        i = (i + 1) & m->merges_mask;
    }
}

/* Inserts or overwrites (a later duplicate of a merge wins, as in HF's HashMap collect). */
static void merge_put(TokBpe *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id)
{
    uint64_t key = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
    size_t i = hash_pair(key) & m->merges_mask;
    while (m->merges[i].key != 0 && m->merges[i].key != key)
        i = (i + 1) & m->merges_mask;
    m->merges[i] = (MergeSlot){key, rank, new_id};
}

void tok_bpe_free(TokBpe *m)
{
    if (!m)
        return;
    for (size_t i = 0; i < TOK_CACHE_STRIPES; i++)
        pthread_mutex_destroy(&m->locks[i]);
    free(m->arena);
    free(m->by_id);
    free(m->table);
    free(m->merges);
    free(m->cache);
    free(m);
}

static int refuse_nonempty(const json_t *model, const char *key)
{
    const json_t *v = json_object_get(model, key);
    if (!v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0))
        return 0;
    return pagoda_error_set(PAGODA_EUNSUPPORTED, "model.%s: a non-empty value is not supported",
                            key);
}

/* Looks a merge's two halves and their concatenation up; EFORMAT when one is not in the
 * vocabulary (HF refuses such a file too). */
static int add_merge(TokBpe *m, const char *a, size_t alen, const char *b, size_t blen,
                     uint32_t rank, char *tmp)
{
    int32_t ia = tok_bpe_token_to_id(m, a, alen);
    int32_t ib = tok_bpe_token_to_id(m, b, blen);
    if (alen + blen > 2 * TOK_MAX_TOKEN_BYTES)
        return pagoda_error_set(PAGODA_EFORMAT, "model.merges[%u]: too long", rank);
    memcpy(tmp, a, alen);
    memcpy(tmp + alen, b, blen);
    int32_t inew = tok_bpe_token_to_id(m, tmp, alen + blen);
    if (ia < 0 || ib < 0 || inew < 0)
        return pagoda_error_set(
            PAGODA_EFORMAT, "model.merges[%u]: a token of the merge is not in model.vocab", rank);
    merge_put(m, ia, ib, rank, inew);
    return 0;
}

static int parse_vocab(TokBpe *m, const json_t *vocab)
{
    size_t n = json_object_size(vocab);
    if (n == 0 || n > TOK_MAX_VOCAB)
        return pagoda_error_set(PAGODA_EFORMAT, "model.vocab: %zu entries (1 to %u)", n,
                                TOK_MAX_VOCAB);
    size_t bytes = 0, max_id = 0;
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)vocab, key, v)
    {
        json_int_t id = json_is_integer(v) ? json_integer_value(v) : -1;
        if (id < 0 || id >= (json_int_t)TOK_MAX_VOCAB)
            return pagoda_error_set(PAGODA_EFORMAT, "model.vocab[\"%.64s\"]: not an id", key);
        size_t len = strlen(key);
        if (len > TOK_MAX_TOKEN_BYTES)
            return pagoda_error_set(PAGODA_EFORMAT, "model.vocab: a token of %zu bytes", len);
        bytes += len + 1;
        if ((size_t)id > max_id)
            max_id = (size_t)id;
    }
    m->nids = max_id + 1;
    m->count = n;
    m->arena = malloc(bytes);
    m->by_id = malloc(m->nids * sizeof(*m->by_id));
    size_t cap = tok_pow2_at_least(n * 2);
    m->table = malloc(cap * sizeof(*m->table));
    if (!m->arena || !m->by_id || !m->table)
        return PAGODA_ENOMEM;
    m->table_mask = cap - 1;
    memset(m->table, 0xff, cap * sizeof(*m->table));
    for (size_t i = 0; i < m->nids; i++)
        m->by_id[i] = (VocabEntry){UINT32_MAX, 0};
    json_object_foreach((json_t *)vocab, key, v)
    {
        int32_t id = (int32_t)json_integer_value(v);
        size_t len = strlen(key);
        if (m->by_id[id].off != UINT32_MAX)
            return pagoda_error_set(PAGODA_EFORMAT, "model.vocab: id %d given twice", id);
        memcpy(m->arena + m->arena_len, key, len + 1);
        m->by_id[id] = (VocabEntry){(uint32_t)m->arena_len, (uint32_t)len};
        m->arena_len += len + 1;
        size_t i = hash_bytes(key, len) & m->table_mask;
        while (m->table[i] >= 0)
            i = (i + 1) & m->table_mask;
        m->table[i] = id;
    }
    return 0;
}

static int parse_merges(TokBpe *m, const json_t *merges)
{
    size_t n = json_array_size(merges);
    size_t cap = tok_pow2_at_least(n * 2 + 2);
    m->merges = calloc(cap, sizeof(*m->merges));
    char *tmp = malloc(2 * TOK_MAX_TOKEN_BYTES + 1);
    if (!m->merges || !tmp) {
        free(tmp);
        return PAGODA_ENOMEM;
    }
    m->merges_mask = cap - 1;
    int rc = 0;
    for (size_t r = 0; r < n && !rc; r++) {
        const json_t *e = json_array_get(merges, r);
        if (json_is_string(e)) {
            const char *s = json_string_value(e);
            size_t len = json_string_length(e);
            const char *sp = memchr(s, ' ', len);
            if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - s)))
                rc = pagoda_error_set(PAGODA_EFORMAT,
                                      "model.merges[%zu]: not two tokens separated by a space", r);
            else
                rc = add_merge(m, s, (size_t)(sp - s), sp + 1, len - (size_t)(sp + 1 - s),
                               (uint32_t)r, tmp);
        } else if (json_is_array(e) && json_array_size(e) == 2 &&
                   json_is_string(json_array_get(e, 0)) && json_is_string(json_array_get(e, 1))) {
            const json_t *a = json_array_get(e, 0), *b = json_array_get(e, 1);
            rc = add_merge(m, json_string_value(a), json_string_length(a), json_string_value(b),
                           json_string_length(b), (uint32_t)r, tmp);
        } else {
            rc = pagoda_error_set(PAGODA_EFORMAT,
                                  "model.merges[%zu]: neither \"a b\" nor [\"a\", \"b\"]", r);
        }
    }
    free(tmp);
    return rc;
}

/* SentencePiece-style models without a pre-tokenizer (Llama 2, Mistral) hand the whole text to
 * the model as one word. When no token of the vocabulary holds U+2581 after another character
 * than U+2581 (and U+2581 itself is a token), no merge can join the symbols on both sides of the
 * start of a run of U+2581: the word's ids are those of its pieces cut there, each through the
 * word cache. Checked on the vocabulary at load. */
static const char META[3] = {(char)0xE2, (char)0x96, (char)0x81};

static bool meta_cuts_safe(const TokBpe *m)
{
    if (tok_bpe_token_to_id(m, META, 3) < 0)
        return false;
    for (size_t id = 0; id < m->nids; id++) {
        const VocabEntry *e = &m->by_id[id];
        if (e->off == UINT32_MAX)
            continue;
        const char *t = m->arena + e->off;
        size_t run = 0; /* the leading run of U+2581 */
        while (run + 3 <= e->len && memcmp(t + run, META, 3) == 0)
            run += 3;
        if (e->len > run && memmem(t + run, e->len - run, META, 3))
            return false;
    }
    return true;
}

int tok_bpe_parse(const void *json, TokBpe **out)
{
    const json_t *model = json;
    if (!json_is_object(model))
        return pagoda_error_set(PAGODA_EFORMAT, "model: not an object");
    const json_t *type = json_object_get(model, "type");
    if (type && !json_is_string(type))
        return pagoda_error_set(PAGODA_EFORMAT, "model.type: not a string");
    if (type && strcmp(json_string_value(type), "BPE") != 0)
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "model.type: %s is not supported (BPE is)",
                                json_string_value(type));
    const json_t *vocab = json_object_get(model, "vocab");
    const json_t *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab))
        return pagoda_error_set(PAGODA_EFORMAT, "model.vocab: not an object");
    if (!json_is_array(merges))
        return pagoda_error_set(PAGODA_EFORMAT, "model.merges: not an array");
    const json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout))
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "model.dropout: only null is supported");
    int rc = refuse_nonempty(model, "continuing_subword_prefix");
    if (!rc)
        rc = refuse_nonempty(model, "end_of_word_suffix");
    if (rc)
        return rc;
    const char *bools[] = {"fuse_unk", "byte_fallback", "ignore_merges"};
    bool vals[3] = {false, false, false};
    for (int i = 0; i < 3; i++) {
        const json_t *v = json_object_get(model, bools[i]);
        if (v && !json_is_null(v) && !json_is_boolean(v))
            return pagoda_error_set(PAGODA_EFORMAT, "model.%s: not a boolean", bools[i]);
        vals[i] = v && json_is_true(v);
    }
    const json_t *unk = json_object_get(model, "unk_token");
    if (unk && !json_is_null(unk) && !json_is_string(unk))
        return pagoda_error_set(PAGODA_EFORMAT, "model.unk_token: not a string");

    TokBpe *m = calloc(1, sizeof(*m));
    if (!m)
        return PAGODA_ENOMEM;
    for (size_t i = 0; i < TOK_CACHE_STRIPES; i++)
        pthread_mutex_init(&m->locks[i], NULL);
    m->fuse_unk = vals[0];
    m->byte_fallback = vals[1];
    m->ignore_merges = vals[2];
    m->cache = calloc(TOK_CACHE_SLOTS, sizeof(*m->cache));
    rc = m->cache ? parse_vocab(m, vocab) : PAGODA_ENOMEM;
    if (!rc)
        rc = parse_merges(m, merges);
    if (rc) {
        tok_bpe_free(m);
        return rc;
    }
    m->unk_id = -1;
    if (unk && json_is_string(unk)) {
        m->unk_id = tok_bpe_token_to_id(m, json_string_value(unk), json_string_length(unk));
        if (m->unk_id < 0) {
            tok_bpe_free(m);
            return pagoda_error_set(PAGODA_EFORMAT, "model.unk_token: not in model.vocab");
        }
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof(name), "<0x%02X>", b);
        m->byte_ids[b] = tok_bpe_token_to_id(m, name, 6);
    }
    m->meta_cuts = meta_cuts_safe(m);
    *out = m;
    return 0;
}

/* ---- merging one word ---- */

static void heap_push(HeapItem *h, size_t *n, HeapItem it)
{
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (it >= h[p])
            break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static HeapItem heap_pop(HeapItem *h, size_t *n)
{
    HeapItem top = h[0];
    HeapItem last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1] < h[c])
            c++;
        if (h[c] >= last)
            break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *n = realloc(*p, c * elem);
    if (!n)
        return PAGODA_ENOMEM;
    *p = n;
    *cap = c;
    return 0;
}

static void sym_add(Symbol *syms, size_t *n, int32_t id, uint32_t len)
{
    size_t i = (*n)++;
    syms[i] = (Symbol){id, (int32_t)i - 1, (int32_t)i + 1, len};
}

static void try_push(const TokBpe *m, const Symbol *syms, HeapItem *heap, size_t *nheap,
                     int32_t pos)
{
    int32_t next = syms[pos].next;
    const MergeSlot *ms = merge_find(m, syms[pos].id, syms[next].id);
    if (ms)
        heap_push(heap, nheap, (uint64_t)ms->rank << 32 | (uint32_t)pos);
}

static int merge_word(const TokBpe *m, const char *w, size_t len, TokenizerIds *out, TokScratch *s)
{
    /* at most one symbol per byte; on the heap, at most n-1 pairs at first and each merge pops
     * one and pushes at most two, over at most n-1 merges */
    if (grow(&s->bpe_syms, &s->bpe_syms_cap, len + 1, sizeof(Symbol)) ||
        grow(&s->bpe_heap, &s->bpe_heap_cap, 2 * len + 1, sizeof(HeapItem)))
        return PAGODA_ENOMEM;
    Symbol *syms = s->bpe_syms;
    HeapItem *heap = s->bpe_heap;
    size_t n = 0, nheap = 0;
    int32_t unk = -1;
    uint32_t unk_len = 0;
    for (size_t i = 0; i < len;) {
        size_t adv;
        tok_utf8_decode(w + i, len - i, &adv);
        int32_t id = tok_bpe_token_to_id(m, w + i, adv);
        if (id >= 0) {
            if (unk >= 0) {
                sym_add(syms, &n, unk, unk_len);
                unk = -1;
            }
            sym_add(syms, &n, id, (uint32_t)adv);
        } else {
            bool done = false;
            if (m->byte_fallback) {
                done = true;
                for (size_t k = 0; k < adv; k++)
                    if (m->byte_ids[(unsigned char)w[i + k]] < 0)
                        done = false;
                /* as in HF, the byte tokens go in before a pending unknown token */
                for (size_t k = 0; done && k < adv; k++)
                    sym_add(syms, &n, m->byte_ids[(unsigned char)w[i + k]], 1);
            }
            if (!done && m->unk_id >= 0) {
                if (unk >= 0 && m->fuse_unk) {
                    unk_len += (uint32_t)adv;
                } else {
                    if (unk >= 0)
                        sym_add(syms, &n, unk, unk_len);
                    unk = m->unk_id;
                    unk_len = (uint32_t)adv;
                }
            }
        }
        i += adv;
    }
    if (unk >= 0)
        sym_add(syms, &n, unk, unk_len);
    if (n == 0)
        return 0;
    syms[n - 1].next = -1;

    for (size_t i = 0; i + 1 < n; i++)
        try_push(m, syms, heap, &nheap, (int32_t)i);
    while (nheap) {
        HeapItem top = heap_pop(heap, &nheap);
        uint32_t rank = (uint32_t)(top >> 32), pos = (uint32_t)top;
        Symbol *cur = &syms[pos];
        if (cur->len == 0 || cur->next < 0)
            continue;
        Symbol *right = &syms[cur->next];
        const MergeSlot *ms = merge_find(m, cur->id, right->id);
        if (!ms || ms->rank != rank)
            continue;
        cur->id = ms->new_id;
        cur->len += right->len;
        cur->next = right->next;
        right->len = 0;
        if (cur->next >= 0)
            syms[cur->next].prev = (int32_t)pos;
        if (cur->prev >= 0)
            try_push(m, syms, heap, &nheap, cur->prev);
        if (cur->next >= 0)
            try_push(m, syms, heap, &nheap, (int32_t)pos);
    }
    size_t count = 0;
    for (int32_t i = 0; i >= 0; i = syms[i].next)
        count++;
    if (out->len + count > out->cap) {
        size_t cap = out->cap ? out->cap : 64;
        while (cap < out->len + count)
            cap *= 2;
        int32_t *ids = realloc(out->ids, cap * sizeof(*ids));
        if (!ids)
            return PAGODA_ENOMEM;
        out->ids = ids;
        out->cap = cap;
    }
    for (int32_t i = 0; i >= 0; i = syms[i].next)
        out->ids[out->len++] = syms[i].id;
    return 0;
}

static int ids_push(TokenizerIds *out, const int32_t *ids, size_t n)
{
    if (n == 0) /* (out->ids may still be NULL) */
        return 0;
    if (out->len + n > out->cap) {
        size_t cap = out->cap ? out->cap : 64;
        while (cap < out->len + n)
            cap *= 2;
        int32_t *p = realloc(out->ids, cap * sizeof(*p));
        if (!p)
            return PAGODA_ENOMEM;
        out->ids = p;
        out->cap = cap;
    }
    memcpy(out->ids + out->len, ids, n * sizeof(*ids));
    out->len += n;
    return 0;
}

/* One word through the cache, or merged (and remembered when it fits a slot). */
static int encode_cached(const TokBpe *m, const char *word, size_t len, TokenizerIds *out,
                         TokScratch *s)
{
    if (len > TOK_CACHE_KEY_BYTES)
        return merge_word(m, word, len, out, s);

    uint64_t h = hash_bytes(word, len);
    size_t slot = h & (TOK_CACHE_SLOTS - 1);
    pthread_mutex_t *lock = (pthread_mutex_t *)&m->locks[slot % TOK_CACHE_STRIPES];
    CacheSlot *c = &m->cache[slot];
    int32_t ids[TOK_CACHE_IDS];
    uint32_t nids = 0;
    bool hit = false;
    pthread_mutex_lock(lock);
    if (c->klen == len && memcmp(c->key, word, len) == 0) {
        nids = c->nids;
        memcpy(ids, c->ids, nids * sizeof(*ids));
        hit = true;
    }
    pthread_mutex_unlock(lock);
    if (hit)
        return ids_push(out, ids, nids);

    size_t before = out->len;
    int rc = merge_word(m, word, len, out, s);
    if (rc || out->len - before > TOK_CACHE_IDS)
        return rc;
    pthread_mutex_lock(lock);
    c->klen = (uint32_t)len;
    memcpy(c->key, word, len);
    c->nids = (uint32_t)(out->len - before);
    if (c->nids) /* (out->ids may still be NULL) */
        memcpy(c->ids, out->ids + before, c->nids * sizeof(*ids));
    pthread_mutex_unlock(lock);
    return 0;
}

int tok_bpe_encode_word(const TokBpe *m, const char *word, size_t len, TokenizerIds *out,
                        TokScratch *s)
{
    if (len == 0)
        return 0;
    if (m->ignore_merges) { /* HF looks the whole word up, before anything else */
        int32_t id = tok_bpe_token_to_id(m, word, len);
        if (id >= 0)
            return ids_push(out, &id, 1);
    }
    if (!m->meta_cuts || len <= TOK_CACHE_KEY_BYTES)
        return encode_cached(m, word, len, out, s);
    /* cut before each run of U+2581 (see meta_cuts_safe) */
    size_t start = 0;
    for (size_t i = 3; i + 3 <= len; i++) {
        if (memcmp(word + i, META, 3) != 0 || memcmp(word + i - 3, META, 3) == 0)
            continue;
        int rc = encode_cached(m, word + start, i - start, out, s);
        if (rc)
            return rc;
        start = i;
        i += 2;
    }
    return encode_cached(m, word + start, len - start, out, s);
}
