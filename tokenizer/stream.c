/* Incremental detokenization: the decoder chain of decode.c fed one id at a time. Each stage
 * passes on only what no later id can change, so the pieces of a stream join to exactly
 * tokenizer_decode's text; what the stages hold is bounded by a few tokens' bytes (a run of
 * byte-fallback tokens by TOK_STREAM_MAX_HELD_BYTES). */
#include "tokenizer/tok_internal.h"

#include <stdlib.h>

#include "common/error.h"

struct TokenizerStream {
    const Tokenizer *t;
    TokDecodeState *d;
    bool finished;
};

int tokenizer_stream_new(const Tokenizer *t, bool skip_special_tokens, TokenizerStream **out)
{
    if (!t || !out)
        return pagoda_error_set(PAGODA_EINVAL, "tokenizer_stream_new: a NULL argument");
    TokenizerStream *s = calloc(1, sizeof(*s));
    if (!s)
        return PAGODA_ENOMEM;
    int rc = tok_decode_state_new(t, skip_special_tokens, true, &s->d);
    if (rc) {
        free(s);
        return rc;
    }
    s->t = t;
    *out = s;
    return 0;
}

void tokenizer_stream_free(TokenizerStream *s)
{
    if (!s)
        return;
    tok_decode_state_free(s->d);
    free(s);
}

/* Runs f on the caller's buffer seen as a TokBuf, keeping it NUL-terminated. */
static int with_buf(char **buf, size_t *len, size_t *cap, TokBuf *b)
{
    *b = (TokBuf){*buf, *len, *cap};
    if (tokbuf_reserve(b, 0))
        return PAGODA_ENOMEM;
    b->data[b->len] = 0;
    return 0;
}

int tokenizer_stream_step(TokenizerStream *s, int32_t id, char **buf, size_t *len, size_t *cap)
{
    if (!s || !buf || !len || !cap)
        return pagoda_error_set(PAGODA_EINVAL, "tokenizer_stream_step: a NULL argument");
    if (s->finished)
        return pagoda_error_set(PAGODA_EINVAL, "tokenizer_stream_step: the stream is finished");
    size_t n;
    if (!tok_id_string(s->t, id, &n))
        return pagoda_error_set(PAGODA_EINVAL, "token id %d is not in the vocabulary", id);
    TokBuf b;
    int rc = with_buf(buf, len, cap, &b);
    if (!rc)
        rc = tok_decode_state_push(s->d, id, &b);
    *buf = b.data;
    *len = b.len;
    *cap = b.cap;
    return rc;
}

int tokenizer_stream_finish(TokenizerStream *s, char **buf, size_t *len, size_t *cap)
{
    if (!s || !buf || !len || !cap)
        return pagoda_error_set(PAGODA_EINVAL, "tokenizer_stream_finish: a NULL argument");
    if (s->finished)
        return 0;
    TokBuf b;
    int rc = with_buf(buf, len, cap, &b);
    if (!rc)
        rc = tok_decode_state_finish(s->d, &b);
    *buf = b.data;
    *len = b.len;
    *cap = b.cap;
    s->finished = rc == 0;
    return rc;
}
