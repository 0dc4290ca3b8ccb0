/* A request's output text: its tokens detokenized incrementally, stop strings matched across
 * token boundaries, and for every token the text that was visible when it arrived, so that the
 * text of any range of tokens can be served again (a resumable poll from any offset).
 *
 * Text that could still turn out to begin a stop string is held back until it cannot, so nothing
 * past a stop string is ever visible: the longest end of the text that is the beginning of a stop
 * string (vLLM holds the last longest-stop - 1 bytes whatever they are; before the forty-first
 * session so did this, which gave every token's text to the token after it, and log-probabilities
 * named by that text the wrong names). When a stop string matches, the text is cut where it
 * begins and the output ends. Pure: no I/O; one output_text belongs to one thread at a time. */
#ifndef PAGODA_TEXT_OUTPUT_TEXT_H
#define PAGODA_TEXT_OUTPUT_TEXT_H

#include "tokenizer/tokenizer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The most stop strings a request may have, and the longest one (bytes). */
#define OUTPUT_TEXT_MAX_STOPS 16u
#define OUTPUT_TEXT_MAX_STOP_BYTES 256u

struct output_text;

/* Starts an output. stops: num_stops strings of stop_lens bytes each (copied; each 1 to
 * OUTPUT_TEXT_MAX_STOP_BYTES long, valid UTF-8); skip_special_tokens as in tokenizer_decode. t
 * must outlive the output. Errors: PAGODA_ERANGE (too many or too long stops), PAGODA_EINVAL (an
 * empty or invalid stop), PAGODA_ENOMEM. */
int output_text_new(const Tokenizer *t, bool skip_special_tokens, const char *const *stops,
                    const size_t *stop_lens, size_t num_stops, struct output_text **out);

/* Keeps the stop string that ends the output in its text (vLLM's include_stop_str_in_output),
 * cutting the text after it rather than before; nothing is held back then, since text that may
 * begin a stop is output either way. Called before the first push. */
void output_text_keep_stops(struct output_text *o);

/* vLLM's min_tokens: the text of the first n tokens ends no output (a stop string counts only
 * where it ends in the text of token n or a later one: one completed earlier is not looked for
 * again, as vLLM looks only in the new text). Called before the first push. */
void output_text_min_tokens(struct output_text *o, uint32_t n);

/* Frees an output; accepts NULL. */
void output_text_free(struct output_text *o);

/* Adds the next output token. An id the tokenizer does not know (a model whose vocabulary is
 * larger than its tokenizer's) adds no text. When its text completes a stop string, *stop is set
 * to that string's index + 1 (else 0), the text is cut before it and the output is over: later
 * calls return PAGODA_ECLOSED. PAGODA_ENOMEM leaves the output as it was. */
int output_text_push(struct output_text *o, int32_t id, int *stop);

/* The output ended otherwise (end-of-sequence, length, cancel): what was held back becomes
 * visible (and the last incomplete bytes become U+FFFD as a full decode makes them). A stop
 * string completed by that last text still cuts it (*stop as in push). Idempotent. */
int output_text_finish(struct output_text *o, int *stop);

/* The visible text so far: *len bytes of valid UTF-8 (a prefix of a NUL-terminated buffer),
 * owned by o and valid until the next push or finish. */
const char *output_text_visible(const struct output_text *o, size_t *len);

/* Where the text of the tokens from output index offset on begins in the visible text: 0 for
 * offset 0, else the visible length when token offset - 1 arrived. An offset past the tokens
 * pushed is taken for their number (0 before the first: before the forty-first session that read
 * before the array, and a poll ahead of a new request's output crashed the router). */
size_t output_text_start(const struct output_text *o, uint32_t offset);

/* Stop string number index (1-based, as push and finish report it): *len bytes, owned by o. */
const char *output_text_stop(const struct output_text *o, int index, size_t *len);

/* The bytes o holds (for a registry's accounting). */
size_t output_text_bytes(const struct output_text *o);

#endif
