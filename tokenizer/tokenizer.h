/* pagoda's tokenizer: Hugging Face `tokenizer.json` files read and applied in C, id for id as
 * the `tokenizers` library does, for the models pagoda serves (Llama 3, Qwen2/Qwen3, Llama 2,
 * Mistral). A pure library: no sockets, no model code, no global state; every function may be
 * called from any thread, and one Tokenizer may be used by several threads at once (its word
 * cache is internally locked).
 *
 * Supported (anything else a file asks for is refused by name at load time, PAGODA_EUNSUPPORTED
 * with a detail naming the component, never approximated):
 *   model: BPE (merges as "a b" strings or ["a", "b"] pairs; byte_fallback; ignore_merges;
 *          continuing_subword_prefix/end_of_word_suffix absent or empty; dropout null)
 *   normalizer: null, NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace (string pattern),
 *          Sequence of these
 *   pre_tokenizer: null, ByteLevel, Split (string or regex pattern, every behavior, invert),
 *          Metaspace, Digits, Sequence of these
 *   post_processor: null, ByteLevel, TemplateProcessing (single: special tokens and $A), Sequence
 *   decoder: null, ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, Sequence
 *   added_tokens: matched before normalization/pre-tokenization with their special, lstrip,
 *          rstrip, normalized and single_word flags.
 *
 * Errors: PAGODA_EFORMAT (not JSON, a field of the wrong type), PAGODA_EUNSUPPORTED (a component
 * not listed above), PAGODA_EINVAL (a text that is not valid UTF-8, an id out of range), with a
 * detail through pagoda_error_set(). */
#ifndef PAGODA_TOKENIZER_TOKENIZER_H
#define PAGODA_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The largest tokenizer.json read (bytes), and the longest text encoded in one call. */
#define TOKENIZER_MAX_FILE_BYTES (64u << 20)
#define TOKENIZER_MAX_TEXT_BYTES (16u << 20)

typedef struct Tokenizer Tokenizer;

/* A growable array of token ids, owned by the caller: zero it, pass it to encode (which appends),
 * release it with tokenizer_ids_fini. */
typedef struct TokenizerIds {
    int32_t *ids;
    size_t len;
    size_t cap;
} TokenizerIds;

void tokenizer_ids_fini(TokenizerIds *ids);

/* Builds a tokenizer from the text of a tokenizer.json (json need not be NUL-terminated). On
 * success *out is the caller's, freed with tokenizer_free. */
int tokenizer_new_from_json(const char *json, size_t len, Tokenizer **out);

/* Reads a tokenizer.json file (at most TOKENIZER_MAX_FILE_BYTES) and builds a tokenizer from it.
 * Blocking file I/O: call it off any event loop. */
int tokenizer_new_from_file(const char *path, Tokenizer **out);

/* Frees a tokenizer; accepts NULL. */
void tokenizer_free(Tokenizer *t);

/* Encodes UTF-8 text and appends its ids to out. add_special_tokens applies the post-processor
 * (the BOS of Llama's TemplateProcessing), as `encode(text, add_special_tokens)` does in HF.
 * PAGODA_EINVAL when text is not valid UTF-8 or is longer than TOKENIZER_MAX_TEXT_BYTES; out keeps
 * what it held before on error. */
int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, bool add_special_tokens,
                     TokenizerIds *out);

/* A bound on the bytes of text one id of an encoding stands for, derived once at load from the
 * vocabulary, the added tokens and the pipeline (a normalizer that may shorten text counts by how
 * much: NFC/NFKC up to 6 bytes in for one out, Lowercase 4, Replace its pattern's length over its
 * content's): tokenizer_encode of a text longer than n * tokenizer_max_bytes_per_token(t) bytes
 * gives more than n ids (with or without add_special_tokens), so that a caller with a limit of n
 * ids may refuse such a text without encoding it. 0 where no bound holds: an added token with
 * lstrip or rstrip (it takes any run of whitespace), a Replace to "", a Split that removes what
 * it matches, a model that drops characters it does not know (no byte fallback, no unknown
 * token) or fuses runs of them into one unknown token. */
size_t tokenizer_max_bytes_per_token(const Tokenizer *t);

/* Decodes ids into a NUL-terminated UTF-8 string (*text, *text_len), the caller's to free(), as
 * HF's `decode(ids, skip_special_tokens)` does (invalid byte sequences become U+FFFD as Rust's
 * from_utf8_lossy makes them). PAGODA_EINVAL for an id outside the vocabulary. */
int tokenizer_decode(const Tokenizer *t, const int32_t *ids, size_t n, bool skip_special_tokens,
                     char **text, size_t *text_len);

/* The vocabulary size (the largest id + 1, added tokens included). */
size_t tokenizer_vocab_size(const Tokenizer *t);

/* The id of a token's string (vocabulary or added token), or -1. */
int32_t tokenizer_token_to_id(const Tokenizer *t, const char *token);

/* The string of an id (as stored in the file, e.g. "Ġthe"), or NULL; owned by the tokenizer. */
const char *tokenizer_id_to_token(const Tokenizer *t, int32_t id);

/* Whether an id is an added token marked special. */
bool tokenizer_is_special(const Tokenizer *t, int32_t id);

/* Incremental detokenization for streams. Feed ids one at a time; each call appends to the
 * caller's output the text those ids complete and nothing that a later id could change (no
 * broken UTF-8 sequence, no leading-space decision not yet made). After the last id,
 * tokenizer_stream_finish appends what is left. The pieces appended over a whole stream join to
 * exactly tokenizer_decode() of all its ids with the same skip_special_tokens. The state holds a
 * pointer to t, which must outlive it; memory is bounded by a few tokens' bytes. */
typedef struct TokenizerStream TokenizerStream;

int tokenizer_stream_new(const Tokenizer *t, bool skip_special_tokens, TokenizerStream **out);
void tokenizer_stream_free(TokenizerStream *s);

/* Appends the text completed by id to *buf (realloc'd; *len and *cap updated; NUL kept after the
 * text). PAGODA_EINVAL for an id outside the vocabulary (the stream is unchanged). */
int tokenizer_stream_step(TokenizerStream *s, int32_t id, char **buf, size_t *len, size_t *cap);
int tokenizer_stream_finish(TokenizerStream *s, char **buf, size_t *len, size_t *cap);

#ifdef __cplusplus
}
#endif

#endif
