#include "worker/backend.h"
#include "common/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

const struct model_config *backend_config(const struct backend *b)
{
    return &b->config;
}

int backend_forward(struct backend *b, const struct fwd_batch *batch, float *logits)
{
    int rc = b->ops->forward(b, batch, logits);
    if (rc == 0)
        b->forward_count++;
    return rc;
}

struct attention_batch backend_attention_batch(const struct fwd_batch *batch)
{
    return (struct attention_batch){
        .num_seqs = batch->num_seqs,
        .num_tokens = batch->num_tokens,
        .query_start = batch->query_start,
        .context_len = batch->context_lens,
        .block_tables = batch->block_tables,
        .max_blocks_per_seq = batch->max_blocks_per_seq,
    };
}

int backend_check_pool(const struct model_config *c, const struct kv_geometry *g, enum dtype dtype,
                       const char *backend_name)
{
    if (g->dtype != dtype)
        return pagoda_error_set(PAGODA_EMISMATCH, "the %s backend needs a %s pool, not %s",
                                backend_name, dtype_name(dtype), dtype_name(g->dtype));
    if (g->num_layers != c->num_layers)
        return pagoda_error_set(PAGODA_EMISMATCH, "pool has %d layers, model %lld", g->num_layers,
                                (long long)c->num_layers);
    if (g->num_kv_heads != c->num_kv_heads)
        return pagoda_error_set(PAGODA_EMISMATCH, "pool has %d KV heads, model %lld",
                                g->num_kv_heads, (long long)c->num_kv_heads);
    if (g->head_dim != c->head_dim)
        return pagoda_error_set(PAGODA_EMISMATCH, "pool has head_dim %d, model %lld", g->head_dim,
                                (long long)c->head_dim);
    return 0;
}

int backend_check_batch(const struct model_config *c, const struct backend_limits *limits,
                        const struct fwd_batch *batch)
{
    if (batch->num_tokens < 1 || batch->num_tokens > limits->max_num_tokens)
        return pagoda_error_set(PAGODA_ERANGE, "step of %d tokens (the limit is %d)",
                                batch->num_tokens, limits->max_num_tokens);
    if (batch->num_logits < 0 || batch->num_logits > limits->max_num_seqs)
        return pagoda_error_set(PAGODA_ERANGE, "step asks for %d logits rows (the limit is %d)",
                                batch->num_logits, limits->max_num_seqs);
    for (int32_t t = 0; t < batch->num_tokens; t++) {
        if (batch->token_ids[t] < 0 || batch->token_ids[t] >= c->vocab_size)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "token id %d is outside the vocabulary (size %lld)",
                                    batch->token_ids[t], (long long)c->vocab_size);
        if (batch->positions[t] < 0 || batch->positions[t] >= c->max_position_embeddings)
            return pagoda_error_set(PAGODA_ERANGE,
                                    "position %d is beyond the model's %lld positions",
                                    batch->positions[t], (long long)c->max_position_embeddings);
    }
    for (int32_t i = 0; i < batch->num_logits; i++)
        if (batch->logits_indices[i] < 0 || batch->logits_indices[i] >= batch->num_tokens)
            return pagoda_error_set(PAGODA_ERANGE, "logits row %d is outside the step",
                                    batch->logits_indices[i]);
    if (batch->num_logit_entries < 0 ||
        (int64_t)batch->num_logit_entries >
            (int64_t)batch->num_logits * (int64_t)LOGIT_ENTRIES_PER_ROW ||
        (batch->num_logit_entries > 0 && batch->logit_entries == NULL))
        return pagoda_error_set(PAGODA_ERANGE, "step has %d logit bias entries for %d rows",
                                batch->num_logit_entries, batch->num_logits);
    for (int32_t i = 0; i < batch->num_logit_entries; i++) {
        const struct logit_entry *e = &batch->logit_entries[i];
        if (e->row < 0 || e->row >= batch->num_logits || e->token < 0 ||
            e->token >= c->vocab_size || isnan(e->value))
            return pagoda_error_set(PAGODA_ERANGE,
                                    "logit bias entry %d (row %d, token %d) is outside the step "
                                    "or the vocabulary",
                                    i, e->row, e->token);
    }
    return 0;
}

/* The host path: logits come back to the host and the CPU sampler draws. With row_errors, a
 * row that fails is recorded there and the others are sampled; without, the first failing row
 * fails the call. */
static int forward_sample_host(struct backend *b, const struct fwd_batch *batch,
                               const struct sample_row *rows, int32_t *tokens, float *logprobs,
                               struct backend_row_error *row_errors)
{
    int32_t vocab = (int32_t)b->config.vocab_size;
    if (batch->num_logits > b->host_logits_rows) {
        float *grown =
            realloc(b->host_logits, (size_t)batch->num_logits * (size_t)vocab * sizeof(float));
        if (grown == NULL)
            return PAGODA_ENOMEM;
        b->host_logits = grown;
        b->host_logits_rows = batch->num_logits;
    }
    if (b->workspace.vocab == 0) {
        int rc = sampler_workspace_init(&b->workspace, vocab);
        if (rc != 0)
            return rc;
    }
    int rc = backend_forward(b, batch, b->host_logits);
    if (rc == 0)
        logit_entries_apply(b->host_logits, vocab, batch->logit_entries, batch->num_logit_entries);
    for (int32_t r = 0; rc == 0 && r < batch->num_logits; r++) {
        const struct sample_row *row = &rows[r];
        int row_rc =
            sampler_sample(&row->params, b->host_logits + (size_t)r * (size_t)vocab, vocab,
                           row->prompt_tokens, row->n_prompt, row->output_tokens, row->n_output,
                           row->output_index, &b->workspace, &tokens[r], &logprobs[r]);
        if (row_errors == NULL) {
            rc = row_rc;
            continue;
        }
        row_errors[r].code = row_rc;
        row_errors[r].message[0] = '\0';
        if (row_rc != 0) {
            snprintf(row_errors[r].message, sizeof(row_errors[r].message), "%s",
                     pagoda_error_detail());
            tokens[r] = -1;
            logprobs[r] = 0.0f;
        }
    }
    return rc;
}

int backend_forward_sample(struct backend *b, const struct fwd_batch *batch,
                           const struct sample_row *rows, int32_t *tokens, float *logprobs)
{
    if (b->ops->forward_sample == NULL)
        return forward_sample_host(b, batch, rows, tokens, logprobs, NULL);
    int rc = b->ops->forward_sample(b, batch, rows, tokens, logprobs);
    if (rc == 0)
        b->forward_count++;
    return rc;
}

int backend_forward_sample_rows(struct backend *b, const struct fwd_batch *batch,
                                const struct sample_row *rows, int32_t *tokens, float *logprobs,
                                struct backend_row_error *row_errors)
{
    if (b->ops->forward_sample != NULL) {
        int rc = b->ops->forward_sample(b, batch, rows, tokens, logprobs);
        if (rc == 0) {
            b->forward_count++;
            for (int32_t r = 0; r < batch->num_logits; r++) {
                row_errors[r].code = 0;
                row_errors[r].message[0] = '\0';
            }
            return 0;
        }
        /* Which row? Compute the logits again on the host path and sample row by row. */
    }
    return forward_sample_host(b, batch, rows, tokens, logprobs, row_errors);
}

int backend_can_submit(const struct backend *b)
{
    return b->ops->submit != NULL && b->ops->complete != NULL;
}

int backend_submit(struct backend *b, int slot, const struct fwd_batch *batch,
                   const struct sample_row *rows, const struct backend_gather *gathers,
                   int32_t num_gathers, const struct backend_history_gather *hgathers,
                   int32_t num_hgathers)
{
    if (!backend_can_submit(b))
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "the %s backend has no asynchronous steps",
                                b->ops->name);
    if (batch == NULL || (rows == NULL && batch->num_logits > 0) ||
        (gathers == NULL && num_gathers > 0) || num_gathers < 0 ||
        (hgathers == NULL && num_hgathers > 0) || num_hgathers < 0 || slot < 0 ||
        slot >= BACKEND_STEP_SLOTS)
        return pagoda_error_set(PAGODA_EINVAL, "backend_submit: slot %d, %d + %d gathers", slot,
                                num_gathers, num_hgathers);
    for (int32_t i = 0; i < num_gathers; i++) {
        const struct backend_gather *g = &gathers[i];
        if (g->token < 0 || g->token >= batch->num_tokens || g->slot < 0 ||
            g->slot >= BACKEND_STEP_SLOTS || g->row < 0)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "backend_submit: gather %d (token %d from slot %d row %d) is "
                                    "outside the step or the slots",
                                    i, g->token, g->slot, g->row);
    }
    for (int32_t i = 0; i < num_hgathers; i++) {
        const struct backend_history_gather *g = &hgathers[i];
        if (g->row < 0 || g->row >= batch->num_logits || g->index < 0 ||
            (size_t)g->index >= rows[g->row].n_output || g->slot < 0 ||
            g->slot >= BACKEND_STEP_SLOTS || g->src_row < 0)
            return pagoda_error_set(PAGODA_EINVAL,
                                    "backend_submit: history gather %d (row %d's output token %d "
                                    "from slot %d row %d) is outside the step or the slots",
                                    i, g->row, g->index, g->slot, g->src_row);
    }
    int rc = b->ops->submit(b, slot, batch, rows, gathers, num_gathers, hgathers, num_hgathers);
    if (rc == 0)
        b->forward_count++;
    return rc;
}

int backend_complete(struct backend *b, int slot, int wait, int32_t *tokens, float *logprobs,
                     struct backend_row_error *row_errors, double *device_us)
{
    if (!backend_can_submit(b))
        return pagoda_error_set(PAGODA_EUNSUPPORTED, "the %s backend has no asynchronous steps",
                                b->ops->name);
    if (slot < 0 || slot >= BACKEND_STEP_SLOTS)
        return pagoda_error_set(PAGODA_EINVAL, "backend_complete: slot %d", slot);
    return b->ops->complete(b, slot, wait, tokens, logprobs, row_errors, device_us);
}

int backend_health(struct backend *b)
{
    return b->ops->health == NULL ? 0 : b->ops->health(b);
}

int backend_device_time_us(struct backend *b, double *us)
{
    if (b->ops->device_time_us == NULL)
        return PAGODA_EUNSUPPORTED;
    return b->ops->device_time_us(b, us);
}

uint64_t backend_forward_count(const struct backend *b)
{
    return b->forward_count;
}

uint64_t backend_graph_steps(const struct backend *b)
{
    return b->graph_steps;
}

uint64_t backend_graph_capture_failures(const struct backend *b)
{
    return b->graph_capture_failures;
}

void backend_close(struct backend *b)
{
    if (b == NULL)
        return;
    free(b->host_logits);
    sampler_workspace_fini(&b->workspace);
    b->ops->close(b);
}
