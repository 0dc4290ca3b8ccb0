/* The tokenizer's internals, shared by its source files and nothing else: the loaded pipeline
 * (added tokens, normalizers, pre-tokenizers, the BPE model, the post-processor, the decoders),
 * the byte buffers and piece lists the encoder passes between stages, and the UTF-8 helpers.
 *
 * The encode pipeline is Hugging Face's: added tokens are cut out of the raw text first (those
 * with normalized=false), the rest is normalized, the added tokens with normalized=true are cut
 * out of the normalized text, the remaining pieces are pre-tokenized into words, and each word
 * goes through the BPE model. The decode pipeline runs the decoders as a chain of streaming
 * stages (decode.c), so that tokenizer_decode and the stream are one code path. */
#ifndef PAGODA_TOKENIZER_TOK_INTERNAL_H
#define PAGODA_TOKENIZER_TOK_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#define PCRE2_STATIC
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tokenizer/tokenizer.h"

/* How much a Unicode normal form (NFC, NFD, NFKC, NFKD) may shorten text, in input bytes per
 * output byte: an output character c stands for at most |NFD(c)| input characters of at most 4
 * bytes each, and the largest 4 * |NFD(c)| / bytes(c) is 6 (U+01D5, 2 bytes, 3 in NFD;
 * test_tokenizer checks it against utf8proc's tables). Lowercase maps a character to one or more
 * characters: at most 4 input bytes per output byte. */
#define TOK_NORMAL_FORM_MAX_SHRINK 6u
#define TOK_LOWERCASE_MAX_SHRINK 4u

/* Bounds of what a tokenizer.json may hold (each exceeded one is PAGODA_EFORMAT at load). */
#define TOK_MAX_VOCAB (1u << 22)  /* ids */
#define TOK_MAX_TOKEN_BYTES 4096u /* bytes of one vocabulary or added token */
#define TOK_MAX_STAGES 16u        /* normalizers, pre-tokenizers or decoders in a chain */
#define TOK_MAX_TEMPLATE 16u      /* pieces of a TemplateProcessing "single" */
#define TOK_MAX_REGEX_BYTES 4096u /* a Split pattern */
/* Bytes of the added tokens' contents matched in one pass (normalized ones as normalized): the
 * nodes of its automaton, which costs about 30 bytes a byte of contents at its peak (its arrays
 * and its edge table), so 8 MiB of contents about 250 MB. Real files hold far less (200,000 added
 * tokens of 20 bytes are 4 MB); at 64 MiB a hostile file of that size could make the router take
 * gigabytes at its start. */
#define TOK_MAX_ADDED_BYTES (8u << 20)
/* Positions of the text that split_added searches for added tokens in one backwards pass. A
 * window is at least as long as the longest token, so that the bytes a pass reads past its
 * window (the longest token's length) cost at most as much as the window itself. */
#define TOK_ADDED_WINDOW 16384u
/* The word cache: direct-mapped slots, words up to TOK_CACHE_KEY_BYTES bytes whose encoding has
 * at most TOK_CACHE_IDS ids; locked by stripes. */
#define TOK_CACHE_SLOTS 16384u
#define TOK_CACHE_KEY_BYTES 48u
#define TOK_CACHE_IDS 12u
#define TOK_CACHE_STRIPES 64u
/* What a stream holds back at most while a run of byte-fallback tokens is still valid UTF-8
 * (a later invalid byte would turn the whole run into U+FFFD). Past it the run is released as
 * it stands: a stream of more than this many bytes of consecutive byte-fallback text that then
 * turns invalid is the one case where the deltas differ from tokenizer_decode. */
#define TOK_STREAM_MAX_HELD_BYTES (64u << 10)
/* Encoders' scratch kept for the next call (so that buffers and PCRE2's match data are reused
 * rather than allocated per call): at most this many, each at most TOK_SCRATCH_KEEP_BYTES. */
#define TOK_SCRATCH_POOL 8u
#define TOK_SCRATCH_KEEP_BYTES (1u << 20)

/* ---- byte buffers ---- */

typedef struct TokBuf {
    char *data;
    size_t len;
    size_t cap;
} TokBuf;

int tokbuf_reserve(TokBuf *b, size_t extra);
int tokbuf_append(TokBuf *b, const void *p, size_t n);
void tokbuf_fini(TokBuf *b);

/* ---- UTF-8 (text.c) ---- */

/* Length of the valid UTF-8 prefix of s (== len when all of s is valid). */
size_t tok_utf8_valid_prefix(const char *s, size_t len);
/* Whether s[0..len) is a proper, so far well-formed beginning of one UTF-8 sequence. */
bool tok_utf8_is_partial(const char *s, size_t len);
/* Decodes the (valid) character at s; *adv its byte length. */
uint32_t tok_utf8_decode(const char *s, size_t len, size_t *adv);
/* Encodes cp into out (4 bytes room); returns its length. */
size_t tok_utf8_encode(uint32_t cp, char *out);
/* Rust's char::is_whitespace (the White_Space property). */
bool tok_is_whitespace(uint32_t cp);
/* The regex crate's Unicode \w, which HF's single_word test uses: Alphabetic, marks, decimal
 * digits, connector punctuation, Join_Control (from utf8proc's general categories). */
bool tok_is_word_char(uint32_t cp);
/* Rust's char::is_numeric (the N general categories). */
bool tok_is_numeric(uint32_t cp);

/* ---- pieces of text between the encode stages ---- */

typedef struct TokSpan {
    uint32_t off;
    uint32_t len;
    int32_t id;    /* an added token's id, or -1 for text still to be tokenized */
    bool at_start; /* begins at offset 0 of the original text (Metaspace "first") */
} TokSpan;

typedef struct TokPieces {
    TokBuf buf;
    TokSpan *spans;
    size_t n;
    size_t cap;
} TokPieces;

int tokpieces_push(TokPieces *p, const char *s, size_t len, int32_t id, bool at_start);
void tokpieces_clear(TokPieces *p);
void tokpieces_fini(TokPieces *p);

/* A (start, end, is_match) cut of a piece, as HF's Pattern::find_matches gives them. */
typedef struct TokMatch {
    uint32_t start;
    uint32_t end;
    bool is_match;
} TokMatch;

/* An added token found at off in a window of the text: k into its TokAddedSet, the longest
 * one that begins there. */
typedef struct TokAddedHit {
    uint32_t off;
    uint32_t k;
} TokAddedHit;

/* Per-call scratch of the encoder: nothing in it outlives one tokenizer_encode. */
typedef struct TokScratch {
    TokPieces a;
    TokPieces b;
    TokBuf norm;
    TokBuf tmp;
    TokMatch *matches;
    size_t nmatches;
    size_t cap_matches;
    pcre2_match_data *md;
    /* where added tokens begin in a window of the text (split_added in tokenizer.c) */
    TokAddedHit *added_hits;
    size_t added_hits_cap;
    /* BPE work arrays (bpe.c) */
    void *bpe_syms;
    size_t bpe_syms_cap;
    void *bpe_heap;
    size_t bpe_heap_cap;
} TokScratch;

void tokscratch_fini(TokScratch *s);
/* The bytes a scratch holds (what keeping it costs). */
size_t tokscratch_bytes(const TokScratch *s);
/* The smallest power of two at least n (and at least 16): the size of a hash table. */
size_t tok_pow2_at_least(size_t n);

/* ---- normalizers (normalize.c) ---- */

typedef enum TokNormKind {
    TOK_NORM_NFC,
    TOK_NORM_NFD,
    TOK_NORM_NFKC,
    TOK_NORM_NFKD,
    TOK_NORM_LOWERCASE,
    TOK_NORM_PREPEND,
    TOK_NORM_REPLACE,
} TokNormKind;

typedef struct TokNormalizer {
    TokNormKind kind;
    char *a; /* Prepend's text, Replace's pattern */
    size_t a_len;
    char *b; /* Replace's content */
    size_t b_len;
} TokNormalizer;

/* Applies the chain to in[0..len) into out (replacing its contents); tmp is scratch. */
int tok_normalize(const TokNormalizer *chain, size_t n, const char *in, size_t len, TokBuf *out,
                  TokBuf *tmp);
/* A {"String": s} pattern (*out the string); a {"Regex": r} one is refused by name. */
int tok_string_pattern(const void *pat, const char *path, const void **out);
int tok_normalizer_parse(const void *json, const char *path, TokNormalizer *chain, size_t *n);
void tok_normalizers_fini(TokNormalizer *chain, size_t n);

/* ---- pre-tokenizers (pretokenize.c) ---- */

typedef enum TokPreKind {
    TOK_PRE_SPLIT,
    TOK_PRE_BYTELEVEL,
    TOK_PRE_METASPACE,
    TOK_PRE_DIGITS,
} TokPreKind;

typedef enum TokSplitBehavior {
    TOK_SPLIT_REMOVED,
    TOK_SPLIT_ISOLATED,
    TOK_SPLIT_MERGED_WITH_PREVIOUS,
    TOK_SPLIT_MERGED_WITH_NEXT,
    TOK_SPLIT_CONTIGUOUS,
} TokSplitBehavior;

typedef enum TokPrependScheme {
    TOK_PREPEND_ALWAYS,
    TOK_PREPEND_FIRST,
    TOK_PREPEND_NEVER,
} TokPrependScheme;

typedef struct TokPreTokenizer {
    TokPreKind kind;
    pcre2_code *re; /* Split's pattern; ByteLevel's GPT-2 pattern when use_regex */
    bool jit;
    TokSplitBehavior behavior;
    bool invert;
    bool add_prefix_space; /* ByteLevel */
    uint32_t replacement;  /* Metaspace */
    TokPrependScheme prepend_scheme;
    bool split;
    bool individual_digits; /* Digits */
} TokPreTokenizer;

int tok_pretokenizer_parse(const void *json, const char *path, TokPreTokenizer *chain, size_t *n);
void tok_pretokenizers_fini(TokPreTokenizer *chain, size_t n);
/* Runs the chain over the pieces of in whose id is -1 (the others pass through); the result is
 * left in *in (the two lists are swapped as stages run). */
int tok_pretokenize(const TokPreTokenizer *chain, size_t n, TokPieces **in, TokPieces **out,
                    TokScratch *s);
/* The GPT-2 byte map: byte -> its printable character's UTF-8 (1 or 2 bytes). */
extern const char tok_bytelevel_chars[256][3];
/* The inverse: a character -> its byte, or -1 when the character is not in the map. */
int tok_bytelevel_byte(uint32_t cp);

/* ---- the BPE model (bpe.c) ---- */

typedef struct TokBpe TokBpe;

/* Builds the model from the JSON "model" object. */
int tok_bpe_parse(const void *json, TokBpe **out);
void tok_bpe_free(TokBpe *m);
/* Appends the ids of one word (a pre-tokenized piece) to out. */
int tok_bpe_encode_word(const TokBpe *m, const char *word, size_t len, TokenizerIds *out,
                        TokScratch *s);
int32_t tok_bpe_token_to_id(const TokBpe *m, const char *s, size_t len);
/* The string of an id (NULL when unknown) and its length. */
const char *tok_bpe_id_to_token(const TokBpe *m, int32_t id, size_t *len);
size_t tok_bpe_vocab_size(const TokBpe *m);
/* The number of entries of the vocabulary (HF's get_vocab_size, which ignores gaps). */
size_t tok_bpe_vocab_count(const TokBpe *m);

/* The most bytes of a word that one token of the model stands for, or 0 when there is no bound
 * (a character may give no token, or a run of unknown ones one token). bytelevel_words: the
 * words hold only the 256 ByteLevel characters (a ByteLevel pre-tokenizer ran). */
size_t tok_bpe_max_bytes_per_token(const TokBpe *m, bool bytelevel_words);

/* ---- decoders (decode.c) ---- */

typedef enum TokDecKind {
    TOK_DEC_BYTELEVEL,
    TOK_DEC_BYTEFALLBACK,
    TOK_DEC_FUSE,
    TOK_DEC_STRIP,
    TOK_DEC_REPLACE,
    TOK_DEC_METASPACE,
    TOK_DEC_JOIN_SPACE, /* no decoder: tokens joined with " " */
} TokDecKind;

typedef struct TokDecoder {
    TokDecKind kind;
    bool text_in; /* a Fuse or ByteLevel before it made its input one running text */
    char *pat;    /* Replace */
    size_t pat_len;
    char *content;
    size_t content_len;
    uint32_t strip_char; /* Strip */
    uint32_t strip_start;
    uint32_t strip_stop;
    uint32_t replacement; /* Metaspace */
    TokPrependScheme prepend_scheme;
} TokDecoder;

int tok_decoder_parse(const void *json, const char *path, TokDecoder *chain, size_t *n);
void tok_decoders_fini(TokDecoder *chain, size_t n);

/* ---- the tokenizer ---- */

typedef struct TokAdded {
    int32_t id;
    char *content;
    size_t len;
    bool special;
    bool lstrip;
    bool rstrip;
    bool normalized;
    bool single_word;
    /* what the token decodes to (and tokenizer_id_to_token gives): HF keeps the normalized
     * content of a normalized token; NULL when that is content itself */
    char *dec;
    size_t dec_len;
} TokAdded;

/* Added tokens of one kind (normalized or not), found leftmost-longest by an Aho-Corasick
 * automaton over their contents read backwards (tokenizer.c says why backwards). Node 0 is the
 * root; each other node is a string that some content ends with, read backwards from its end
 * along the path from the root. The arrays "per node" have nnodes entries. */
typedef struct TokAddedSet {
    uint32_t *idx; /* into Tokenizer.added, in the file's order */
    /* the length of each one's matched content (normalized in the normalized set) */
    size_t *pat_len;
    size_t n;
    size_t max_len; /* the longest pat_len */
    size_t nnodes;
    uint32_t *parent;    /* per node: the node one byte shorter */
    unsigned char *byte; /* per node: the byte from its parent */
    uint32_t *fail;      /* per node: the node of its longest proper suffix (the root if none) */
    /* per node: k + 1 of the longest content that its string, in the text's order, begins
     * with; 0 when none */
    uint32_t *longest;
    uint32_t *edges; /* (parent, byte) -> node, open addressing, 0 empty */
    size_t edges_mask;
    uint32_t root_next[256]; /* the root's edges, the step every byte of plain text takes */
} TokAddedSet;

typedef struct TokTemplatePiece {
    bool is_sequence;
    int32_t *ids; /* a special token's ids */
    size_t n;
} TokTemplatePiece;

struct Tokenizer {
    TokBpe *bpe;
    TokAdded *added;
    size_t nadded;
    TokAddedSet added_raw;
    TokAddedSet added_norm;
    /* content -> index into added, -1 empty (open addressing, xxhash of the content) */
    int32_t *added_table;
    size_t added_mask;
    /* id -> index into added + 1, or 0 (ids up to vocab_size) */
    uint32_t *added_by_id;
    /* id -> 1 when skip_special_tokens drops it: HF drops every id whose string is the content
     * of a special added token */
    uint8_t *skip;
    size_t vocab_size;
    TokNormalizer norm[TOK_MAX_STAGES];
    size_t nnorm;
    TokPreTokenizer pre[TOK_MAX_STAGES];
    size_t npre;
    TokTemplatePiece tmpl[TOK_MAX_TEMPLATE];
    size_t ntmpl;
    bool has_template;
    TokDecoder dec[TOK_MAX_STAGES];
    size_t ndec;
    /* tokenizer_max_bytes_per_token, derived at load */
    size_t max_bytes_per_token;
    /* scratch of past encodes, for the next (see TOK_SCRATCH_POOL) */
    pthread_mutex_t pool_lock;
    TokScratch *pool[TOK_SCRATCH_POOL];
    size_t npool;
};

/* The string an id decodes from (added token first, then the model), or NULL. */
const char *tok_id_string(const Tokenizer *t, int32_t id, size_t *len);

/* The streaming decoder both tokenizer_decode and TokenizerStream run (decode.c). */
typedef struct TokDecodeState TokDecodeState;
int tok_decode_state_new(const Tokenizer *t, bool skip_special, bool bounded, TokDecodeState **out);
void tok_decode_state_free(TokDecodeState *st);
/* Feeds one (valid) id; appends the text it completes to out. */
int tok_decode_state_push(TokDecodeState *st, int32_t id, TokBuf *out);
int tok_decode_state_finish(TokDecodeState *st, TokBuf *out);

/* Lossy UTF-8 as Rust's String::from_utf8_lossy, streaming: feeds bytes, appends what is
 * final to out, keeps an incomplete trailing sequence (at most 3 bytes) in *pend. At the end,
 * call with final=true. */
typedef struct TokLossy {
    unsigned char pend[4];
    uint8_t npend;
} TokLossy;
int tok_lossy_feed(TokLossy *l, const unsigned char *p, size_t n, bool final, TokBuf *out);

#endif
