/* libpagoda's Tokenize calls (pagoda.h: pagoda_tokenize, pagoda_detokenize; their asynchronous
 * forms are in pagoda_async.c): the request built from a prompt as a Submit's, and the reply
 * read. */
#include "client/client_internal.h"

#include "common/error.h"
#include "proto/text_fields.h"

#include <stdlib.h>
#include <string.h>

int client_tokenize_build(struct client_tokenize *t, const pagoda_prompt *prompt,
                          const int32_t *ids, size_t n, int skip_special_tokens)
{
    memset(t, 0, sizeof(*t));
    Pagoda__TokenizeRequest tok = PAGODA__TOKENIZE_REQUEST__INIT;
    if (prompt != NULL) {
        if (prompt->num_token_ids > 0)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "pagoda_tokenize: the prompt is token ids already");
        /* The Submit's own checks and fields (the id and the parameters are not sent). */
        static const uint8_t no_id[PAGODA_REQUEST_ID_BYTES];
        pagoda_generate_params params = pagoda_generate_params_default();
        int rc = client_submit_build(&t->cs, &params, prompt, no_id);
        if (rc != 0)
            return rc;
        t->has_cs = 1;
        text_fields_to_tokenize(&tok, &t->cs.sub);
    } else {
        if (n > 0 && ids == NULL)
            return pagoda_error_set(PAGODA_EINVAL, "pagoda_detokenize: NULL argument");
        tok.n_token_ids = n;
        tok.token_ids = (int32_t *)ids;
        tok.has_skip_special_tokens = 1;
        tok.skip_special_tokens = skip_special_tokens != 0;
    }
    t->tok = tok;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    t->req = req;
    t->req.call_case = PAGODA__CLIENT_REQUEST__CALL_TOKENIZE;
    t->req.tokenize = &t->tok;
    return 0;
}

void client_tokenize_fini(struct client_tokenize *t)
{
    if (t->has_cs)
        client_submit_fini(&t->cs);
    t->has_cs = 0;
}

int client_tokenized_from_reply(const Pagoda__ClientResponse *resp, pagoda_tokenized *out)
{
    memset(out, 0, sizeof(*out));
    if (resp->result_case != PAGODA__CLIENT_RESPONSE__RESULT_TOKENIZE || resp->tokenize == NULL)
        return pagoda_error_set(PAGODA_EPROTO, "the router's reply carries no tokenization");
    const Pagoda__TokenizeResponse *tr = resp->tokenize;
    out->max_model_len = tr->has_max_model_len ? tr->max_model_len : 0;
    if (tr->n_token_ids > 0) {
        out->token_ids = malloc(tr->n_token_ids * sizeof(int32_t));
        if (out->token_ids == NULL)
            return PAGODA_ENOMEM;
        memcpy(out->token_ids, tr->token_ids, tr->n_token_ids * sizeof(int32_t));
        out->num_token_ids = tr->n_token_ids;
    }
    if (tr->has_text) {
        if ((out->text = malloc(tr->text.len + 1)) == NULL) {
            pagoda_tokenized_free(out);
            return PAGODA_ENOMEM;
        }
        if (tr->text.len > 0)
            memcpy(out->text, tr->text.data, tr->text.len);
        out->text[tr->text.len] = '\0';
        out->text_len = tr->text.len;
    }
    return 0;
}

void pagoda_tokenized_free(pagoda_tokenized *t)
{
    if (t == NULL)
        return;
    free(t->token_ids);
    free(t->text);
    memset(t, 0, sizeof(*t));
}

static int tokenize_call(pagoda_client *c, struct client_tokenize *t, pagoda_tokenized *out)
{
    Pagoda__ClientResponse *resp = NULL;
    int rc = client_call(c, &t->req, PAGODA_TOKENIZE_WAIT_MS, &resp);
    client_tokenize_fini(t);
    if (rc != 0)
        return rc;
    rc = client_tokenized_from_reply(resp, out);
    pagoda__client_response__free_unpacked(resp, NULL);
    return rc;
}

int pagoda_tokenize(pagoda_client *c, const pagoda_prompt *prompt, pagoda_tokenized *out)
{
    if (c == NULL || prompt == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_tokenize: NULL argument");
    memset(out, 0, sizeof(*out));
    struct client_tokenize t;
    int rc = client_tokenize_build(&t, prompt, NULL, 0, 1);
    return rc != 0 ? rc : tokenize_call(c, &t, out);
}

int pagoda_detokenize(pagoda_client *c, const int32_t *ids, size_t n, int skip_special_tokens,
                      pagoda_tokenized *out)
{
    if (c == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "pagoda_detokenize: NULL argument");
    memset(out, 0, sizeof(*out));
    struct client_tokenize t;
    int rc = client_tokenize_build(&t, NULL, ids, n, skip_special_tokens);
    return rc != 0 ? rc : tokenize_call(c, &t, out);
}
