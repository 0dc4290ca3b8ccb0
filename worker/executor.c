#include "worker/executor.h"
#include "common/error.h"
#include "worker/history_cache.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum slot_state { SLOT_FREE, SLOT_QUEUED, SLOT_RUNNING, SLOT_DONE };

/* The mirror's pending tokens name a step by its step id modulo MIRROR_MAX_STEPS_IN_FLIGHT; the
 * backend's step slots are named the same way. */
_Static_assert(MIRROR_MAX_STEPS_IN_FLIGHT <= BACKEND_STEP_SLOTS,
               "a backend step slot for each step the mirror holds in flight");

/* How often the executor's thread looks whether the step it submitted last has ended, while no
 * other step is queued (an asynchronous backend: the device signals nothing to the thread). */
#define EXECUTOR_POLL_US 20

/* One step held by the executor, with its own copy of everything the forward pass reads. */
struct slot {
    enum slot_state state;
    int in_delay;  /* running, but still waiting its delay: discard may drop it */
    int discarded; /* dropped while in its delay: delivered to nobody */
    uint64_t gen;  /* the discard generation it was submitted in */
    uint64_t epoch, step_id;
    uint32_t delay_ms;

    struct fwd_batch batch;
    int32_t *token_ids, *positions;         /* [max_num_tokens] */
    int64_t *slot_mapping;                  /* [max_num_tokens] */
    int32_t *query_start;                   /* [max_num_seqs + 1] */
    int32_t *context_lens, *logits_indices; /* [max_num_seqs] */
    int32_t *block_tables;                  /* grown on submit */
    size_t block_tables_cap;                /* entries */
    struct sample_row *rows;                /* [max_num_seqs] */
    struct logit_entry *entries;            /* the batch's logit bias, grown on submit */
    size_t entries_cap;                     /* entries */
    uint64_t *seq_ids;                      /* [max_num_seqs] */
    struct history_cache histories;         /* penalised rows' prompt + output */
    struct mirror_seq_error *failed;        /* [2 * max_num_seqs] */
    int32_t num_failed;

    int32_t *tokens;                      /* [max_num_seqs] */
    float *logprobs;                      /* [max_num_seqs] */
    struct backend_row_error *row_errors; /* [max_num_seqs] */
    int32_t *seq_fail;                    /* [max_num_seqs]: a sequence's failed pending input */
    uint64_t *seq_fail_step;              /* [max_num_seqs]: the step of that input */
    int rc;
    int after_failure; /* rc says it was not run: an earlier step failed as a whole */
    int lost;          /* the backend cannot run passes any more (check_backend) */
    char error[EXECUTOR_ERROR_MAX];
    double wall_us, device_us;

    /* An asynchronous backend: the step's inputs read on the device (backend_submit). */
    struct backend_gather *gathers; /* [max_num_tokens] */
    int32_t *gather_seq;            /* [max_num_tokens]: the sequence of each gather */
    int32_t num_gathers;
    int32_t *undo; /* [max_num_tokens][2]: (token row, pending token) of each pending input */
    int32_t num_undo;
    /* The pending tokens of penalised rows' histories read on the device, and the pending token
     * each replaced (the history holds 0 there until ungather). */
    struct backend_history_gather *hgathers; /* [max_num_seqs] */
    int32_t *hpending;                       /* [max_num_seqs] */
    int32_t num_hgathers;
    struct timespec submitted; /* when backend_submit was called */
};

/* What one step sampled, kept for the steps prepared while it was in flight: their pending
 * tokens name this step by its mirror slot. Touched by the executor's thread only. */
struct sampled {
    int valid;
    uint64_t gen, step_id;
    int32_t *tokens; /* [max_num_seqs] */
    int32_t *codes;  /* [max_num_seqs]: 0, or the row's error */
};

struct executor {
    uv_loop_t *loop;
    uv_async_t async;
    struct backend *backend;
    struct executor_limits lim;
    executor_done_fn done;
    void *ctx;

    pthread_t thread;
    int thread_started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* Under mu: the steps held, in submission order: slots[(head + i) % EXECUTOR_MAX_STEPS]. */
    struct slot slots[EXECUTOR_MAX_STEPS];
    int head, count;
    int stop;
    uint64_t gen; /* executor_discard increments it */
    int failed;   /* a step of generation failed_gen failed as a whole */
    uint64_t failed_gen, failed_step;

    struct sampled sampled[MIRROR_MAX_STEPS_IN_FLIGHT];
    int submits;                /* backend_can_submit */
    struct timespec last_ended; /* when the last step ended on the executor's thread */
    const char *lose_device;    /* executor_fault_lose_device's file, or NULL */
    int lost;                   /* the thread's: a step found the backend lost */
};

/* ---- memory -------------------------------------------------------------------------------- */

static void slot_free(struct slot *s)
{
    free(s->token_ids);
    free(s->positions);
    free(s->slot_mapping);
    free(s->query_start);
    free(s->context_lens);
    free(s->logits_indices);
    free(s->block_tables);
    free(s->rows);
    free(s->seq_ids);
    history_cache_free(&s->histories);
    free(s->failed);
    free(s->tokens);
    free(s->logprobs);
    free(s->row_errors);
    free(s->seq_fail);
    free(s->seq_fail_step);
    free(s->gathers);
    free(s->gather_seq);
    free(s->undo);
    free(s->entries);
    free(s->hgathers);
    free(s->hpending);
}

static int slot_alloc(struct slot *s, const struct executor_limits *l)
{
    size_t nt = (size_t)l->max_num_tokens, ns = (size_t)l->max_num_seqs;
    s->token_ids = malloc(nt * sizeof(int32_t));
    s->positions = malloc(nt * sizeof(int32_t));
    s->slot_mapping = malloc(nt * sizeof(int64_t));
    s->query_start = malloc((ns + 1) * sizeof(int32_t));
    s->context_lens = malloc(ns * sizeof(int32_t));
    s->logits_indices = malloc(ns * sizeof(int32_t));
    s->rows = malloc(ns * sizeof(*s->rows));
    s->seq_ids = malloc(ns * sizeof(uint64_t));
    s->failed = malloc(2 * ns * sizeof(*s->failed));
    s->tokens = malloc(ns * sizeof(int32_t));
    s->logprobs = malloc(ns * sizeof(float));
    s->row_errors = malloc(ns * sizeof(*s->row_errors));
    s->seq_fail = malloc(ns * sizeof(int32_t));
    s->seq_fail_step = malloc(ns * sizeof(uint64_t));
    s->gathers = malloc(nt * sizeof(*s->gathers));
    s->gather_seq = malloc(nt * sizeof(int32_t));
    s->undo = malloc(2 * nt * sizeof(int32_t));
    s->hgathers = malloc(ns * sizeof(*s->hgathers));
    s->hpending = malloc(ns * sizeof(int32_t));
    if (!s->gathers || !s->gather_seq || !s->undo || !s->hgathers || !s->hpending)
        return PAGODA_ENOMEM;
    if (!s->token_ids || !s->positions || !s->slot_mapping || !s->query_start || !s->context_lens ||
        !s->logits_indices || !s->rows || !s->seq_ids || !s->failed || !s->tokens || !s->logprobs ||
        !s->row_errors || !s->seq_fail || !s->seq_fail_step)
        return PAGODA_ENOMEM;
    return 0;
}

static void executor_free(struct executor *e)
{
    for (int i = 0; i < EXECUTOR_MAX_STEPS; i++)
        slot_free(&e->slots[i]);
    for (int i = 0; i < MIRROR_MAX_STEPS_IN_FLIGHT; i++) {
        free(e->sampled[i].tokens);
        free(e->sampled[i].codes);
    }
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
}

/* ---- the executor's thread ------------------------------------------------------------------ */

static double ns_between(const struct timespec *a, const struct timespec *b)
{
    return (double)(b->tv_sec - a->tv_sec) * 1e9 + (double)(b->tv_nsec - a->tv_nsec);
}

/* The token a pending token stands for, from the step that sampled it: 0 when that row failed or
 * the step is not known (then *code says why, and the sequence fails in this step). */
static int32_t resolve_token(const struct executor *e, const struct slot *s, int32_t t,
                             int32_t *code, uint64_t *from_step)
{
    const struct sampled *src = &e->sampled[mirror_pending_slot(t)];
    int32_t row = mirror_pending_row(t);
    if (!src->valid || src->gen != s->gen || src->step_id >= s->step_id ||
        row >= e->lim.max_num_seqs) {
        *code = PAGODA_EINTERNAL;
        *from_step = 0;
        return 0;
    }
    *from_step = src->step_id;
    if (src->codes[row] != 0) {
        *code = src->codes[row];
        return 0;
    }
    return src->tokens[row];
}

/* Marks sequence i failed through an input that could not be resolved (the first one counts). */
static void fail_input(struct slot *s, int32_t i, int32_t code, uint64_t from)
{
    if (code != 0 && s->seq_fail[i] == 0) {
        s->seq_fail[i] = code;
        s->seq_fail_step[i] = from;
    }
}

/* Whether pending token tok names a row of the step still on the device (out), where a gather
 * can read it. */
static int on_device(const struct executor *e, const struct slot *s, const struct slot *out,
                     int32_t tok)
{
    return out != NULL && out->gen == s->gen &&
           mirror_pending_slot(tok) == (int32_t)(out->step_id % MIRROR_MAX_STEPS_IN_FLIGHT) &&
           mirror_pending_row(tok) < e->lim.max_num_seqs;
}

/* The outputs at the end of a history that can hold pending tokens (one a step in flight), and
 * that the slot's copy of a history may have had replaced (gathers, host resolves): what
 * history_cache_place copies again however much of the history the slot holds already. Twice
 * the steps in flight, for margin. */
#define HISTORY_TAIL (2 * MIRROR_MAX_STEPS_IN_FLIGHT)

/* The pending tokens of the rows' histories (only penalised rows carry one): those of the step
 * still on the device (out, on the asynchronous path) become history gathers, which the sampler
 * reads there (0 stands in the history meanwhile); the others name steps that have ended and
 * are resolved on the host (all of them with out NULL: the synchronous path). A step samples one
 * token a row, so each row has at most one of out's. */
static void gather_histories(struct executor *e, struct slot *s, const struct slot *out)
{
    s->num_hgathers = 0;
    for (int32_t r = 0; r < s->batch.num_logits; r++) {
        int32_t *hist = (int32_t *)s->rows[r].output_tokens; /* the slot's own history copy */
        const size_t n = s->rows[r].n_output;
        for (size_t k = n > HISTORY_TAIL ? n - HISTORY_TAIL : 0; k < n; k++) {
            const int32_t tok = hist[k];
            if (!mirror_token_pending(tok))
                continue;
            if (on_device(e, s, out, tok)) {
                /* One a row, so never full; if it were, the pending token left in place makes the
                 * backend refuse the step, which then runs synchronously, resolved then (a host
                 * resolve now would read an older step's record). */
                if (s->num_hgathers == e->lim.max_num_seqs)
                    continue;
                struct backend_history_gather *g = &s->hgathers[s->num_hgathers];
                g->row = r;
                g->index = (int32_t)k;
                g->slot = mirror_pending_slot(tok);
                g->src_row = mirror_pending_row(tok);
                s->hpending[s->num_hgathers++] = tok;
                hist[k] = 0;
                continue;
            }
            int32_t code = 0;
            uint64_t from = 0;
            hist[k] = resolve_token(e, s, tok, &code, &from);
        }
    }
}

/* The sequence whose logits row is r (each sampling sequence's last token is its row). */
static int32_t seq_of_row(const struct slot *s, int32_t r)
{
    const struct fwd_batch *b = &s->batch;
    for (int32_t i = 0; i < b->num_seqs; i++)
        if (b->query_start[i + 1] - 1 == b->logits_indices[r])
            return i;
    return -1;
}

/* Replaces the pending tokens of the step's inputs and histories; a sequence whose input cannot
 * be resolved is marked in seq_fail. */
static void resolve_pending(struct executor *e, struct slot *s)
{
    const struct fwd_batch *b = &s->batch;
    for (int32_t i = 0; i < b->num_seqs; i++) {
        s->seq_fail[i] = 0;
        for (int32_t t = b->query_start[i]; t < b->query_start[i + 1]; t++) {
            if (!mirror_token_pending(s->token_ids[t]))
                continue;
            int32_t code = 0;
            uint64_t from = 0;
            s->token_ids[t] = resolve_token(e, s, s->token_ids[t], &code, &from);
            fail_input(s, i, code, from);
        }
    }
    gather_histories(e, s, NULL);
}

/* The asynchronous path: each pending input token sampled by the step still on the device (out,
 * submitted and not completed) becomes a gather, read on the device from that step's slot;
 * whether its row was sampled is known when this step is completed (check_gathers). Pending
 * tokens of steps that have ended are resolved here, on the host (such a step may have run
 * synchronously, leaving nothing on the device). The histories likewise (gather_histories). */
static void gather_pending(struct executor *e, struct slot *s, const struct slot *out)
{
    const struct fwd_batch *b = &s->batch;
    s->num_gathers = s->num_undo = 0;
    for (int32_t i = 0; i < b->num_seqs; i++) {
        s->seq_fail[i] = 0;
        for (int32_t t = b->query_start[i]; t < b->query_start[i + 1]; t++) {
            int32_t tok = s->token_ids[t];
            if (!mirror_token_pending(tok))
                continue;
            s->undo[2 * s->num_undo] = t;
            s->undo[2 * s->num_undo++ + 1] = tok;
            if (out == NULL || out->gen != s->gen ||
                mirror_pending_slot(tok) != (int32_t)(out->step_id % MIRROR_MAX_STEPS_IN_FLIGHT)) {
                int32_t code = 0;
                uint64_t from = 0;
                s->token_ids[t] = resolve_token(e, s, tok, &code, &from);
                fail_input(s, i, code, from);
                continue;
            }
            s->token_ids[t] = 0; /* the gather writes the token over it on the device */
            if (!on_device(e, s, out, tok)) { /* a row beyond the limits */
                fail_input(s, i, PAGODA_EINTERNAL, 0);
                continue;
            }
            struct backend_gather *g = &s->gathers[s->num_gathers];
            g->token = t;
            g->slot = mirror_pending_slot(tok);
            g->row = mirror_pending_row(tok);
            s->gather_seq[s->num_gathers++] = i;
        }
    }
    gather_histories(e, s, out);
}

/* Undoes gather_pending's inputs: the step runs synchronously after all, and resolve_pending
 * resolves them again (with their failures). */
static void ungather(struct slot *s)
{
    for (int32_t k = 0; k < s->num_undo; k++)
        s->token_ids[s->undo[2 * k]] = s->undo[2 * k + 1];
    for (int32_t k = 0; k < s->num_hgathers; k++) {
        const struct backend_history_gather *g = &s->hgathers[k];
        ((int32_t *)s->rows[g->row].output_tokens)[g->index] = s->hpending[k];
    }
    s->num_gathers = s->num_undo = s->num_hgathers = 0;
}

/* Once the steps a step's gathers read have ended: a gathered input whose row could not be
 * sampled (or that names no step run) fails its sequence. */
static void check_gathers(struct executor *e, struct slot *s)
{
    for (int32_t k = 0; k < s->num_gathers; k++) {
        const struct backend_gather *g = &s->gathers[k];
        int32_t code = 0;
        uint64_t from = 0;
        resolve_token(e, s, MIRROR_PENDING_TOKEN(g->slot, g->row), &code, &from);
        fail_input(s, s->gather_seq[k], code, from);
    }
    /* A history's token comes from the row its sequence's input comes from, which fails above;
     * the check holds without that. */
    for (int32_t k = 0; k < s->num_hgathers; k++) {
        const struct backend_history_gather *g = &s->hgathers[k];
        int32_t code = 0, i = seq_of_row(s, g->row);
        uint64_t from = 0;
        resolve_token(e, s, MIRROR_PENDING_TOKEN(g->slot, g->src_row), &code, &from);
        if (i >= 0)
            fail_input(s, i, code, from);
    }
}

/* After the forward pass: a sequence whose input failed reports that failure on its row. */
static void fail_rows_of_failed_inputs(struct slot *s)
{
    const struct fwd_batch *b = &s->batch;
    int32_t row = 0;
    for (int32_t i = 0; i < b->num_seqs && row < b->num_logits; i++) {
        if (b->logits_indices[row] != b->query_start[i + 1] - 1)
            continue;
        if (s->seq_fail[i] != 0) {
            struct backend_row_error *re = &s->row_errors[row];
            re->code = s->seq_fail[i];
            if (s->seq_fail_step[i] != 0)
                snprintf(re->message, sizeof(re->message),
                         "sequence %" PRIu64 ": its token of step %" PRIu64 " could not be sampled",
                         s->seq_ids[row], s->seq_fail_step[i]);
            else
                snprintf(re->message, sizeof(re->message),
                         "sequence %" PRIu64 ": its input token names a step the worker did not "
                         "run",
                         s->seq_ids[row]);
            s->tokens[row] = -1;
            s->logprobs[row] = 0.0f;
        }
        row++;
    }
}

static void reset_result(struct slot *s)
{
    s->rc = 0;
    s->lost = 0;
    s->error[0] = '\0';
    s->device_us = -1.0;
    for (int32_t r = 0; r < s->batch.num_logits; r++) {
        s->tokens[r] = -1;
        s->logprobs[r] = 0.0f;
        s->row_errors[r].code = 0;
        s->row_errors[r].message[0] = '\0';
    }
}

static int not_run(const struct slot *s, uint64_t failed_step)
{
    return pagoda_error_set(PAGODA_EPROTO,
                            "step %" PRIu64 " was not run: step %" PRIu64
                            ", which it was prepared from, failed",
                            s->step_id, failed_step);
}

/* What the step sampled, for the steps prepared from it. */
static void record_sampled(struct executor *e, const struct slot *s)
{
    struct sampled *out = &e->sampled[s->step_id % MIRROR_MAX_STEPS_IN_FLIGHT];
    out->valid = s->rc == 0;
    out->gen = s->gen;
    out->step_id = s->step_id;
    for (int32_t r = 0; r < s->batch.num_logits && s->rc == 0; r++) {
        out->tokens[r] = s->tokens[r];
        out->codes[r] = s->row_errors[r].code;
    }
}

/* executor_fault_lose_device: whether its file exists (it is removed: the fault fires once). */
static int lose_device_fires(struct executor *e)
{
    /* Removing it is the test: it fires once even for several processes given the path. */
    if (e->lose_device == NULL || unlink(e->lose_device) != 0)
        return 0;
    return 1;
}

/* A step that failed as a whole (and was run): can the backend still run passes
 * (backend_health)? When it cannot, the step says so, and so does every later one (the worker
 * exits on the first: executor_result.lost). Called without mu, on the thread. */
static void check_backend(struct executor *e, struct slot *s)
{
    if (!e->lost && s->rc != 0 && !s->after_failure) {
        int rc = backend_health(e->backend);
        if (rc != 0) {
            char why[EXECUTOR_ERROR_MAX];
            pagoda_error_message(rc, why, sizeof(why));
            const size_t used = strnlen(s->error, sizeof(s->error) - 1);
            if (snprintf(s->error + used, sizeof(s->error) - used, "; %s", why) < 0)
                s->error[used] = '\0';
            e->lost = 1;
        }
    }
    s->lost = e->lost;
}

/* The fault that stands for a lost device: the step fails as the device's loss would fail it. */
static int lose_device(struct executor *e, struct slot *s)
{
    if (!lose_device_fires(e))
        return 0;
    s->rc = pagoda_error_set(PAGODA_ECUDA, "--fault lose-device (%s): the device is lost",
                             e->lose_device);
    pagoda_error_message(s->rc, s->error, sizeof(s->error));
    e->lost = s->lost = 1;
    return 1;
}

static void run_step(struct executor *e, struct slot *s, int after_failure, uint64_t failed_step)
{
    struct timespec w0, w1, c0, c1;
    clock_gettime(CLOCK_MONOTONIC, &w0);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c0);
    reset_result(s);
    if (after_failure) {
        s->rc = not_run(s, failed_step);
    } else if (!lose_device(e, s) && s->batch.num_tokens > 0) {
        resolve_pending(e, s);
        s->rc = backend_forward_sample_rows(e->backend, &s->batch, s->rows, s->tokens, s->logprobs,
                                            s->row_errors);
        if (s->rc == 0) {
            fail_rows_of_failed_inputs(s);
            double us;
            if (backend_device_time_us(e->backend, &us) == 0)
                s->device_us = us;
        }
    }
    if (s->rc != 0 && !s->lost)
        pagoda_error_message(s->rc, s->error, sizeof(s->error));
    check_backend(e, s);
    record_sampled(e, s);
    clock_gettime(CLOCK_MONOTONIC, &w1);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &c1);
    s->wall_us = ns_between(&w0, &w1) / 1e3;
    if (s->device_us < 0)
        s->device_us = ns_between(&c0, &c1) / 1e3;
    e->last_ended = w1;
}

/* The asynchronous path: queues the step on the backend (its inputs gathered on the device).
 * Returns backend_submit's result; on failure the step's inputs are as submitted. */
static int submit_step(struct executor *e, struct slot *s, const struct slot *out)
{
    clock_gettime(CLOCK_MONOTONIC, &s->submitted);
    reset_result(s);
    gather_pending(e, s, out);
    int rc = backend_submit(e->backend, (int)(s->step_id % MIRROR_MAX_STEPS_IN_FLIGHT), &s->batch,
                            s->rows, s->gathers, s->num_gathers, s->hgathers, s->num_hgathers);
    if (rc != 0)
        ungather(s);
    return rc;
}

/* Completes a submitted step: returns 0 when wait is 0 and it has not ended, else 1 with its
 * result in s. Its wall time runs from its submission, or from the end of the step before it when
 * that came later (the step could not end before), to its end: with the device fed back to back
 * it approaches the device time. Called without mu. */
static int complete_step(struct executor *e, struct slot *s, int wait)
{
    double device_us = -1.0;
    int rc = backend_complete(e->backend, (int)(s->step_id % MIRROR_MAX_STEPS_IN_FLIGHT), wait,
                              s->tokens, s->logprobs, s->row_errors, &device_us);
    if (rc == PAGODA_EBUSY && !wait)
        return 0;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    s->rc = rc;
    /* A step that failed as a whole after this one was submitted: this one was prepared from
     * what it did not write, and its result is dropped; whatever this one returned (after a
     * device fault every later call fails too: the step before is the one to name). */
    pthread_mutex_lock(&e->mu);
    int prior = e->failed && e->failed_gen == s->gen && e->failed_step < s->step_id;
    uint64_t failed_step = e->failed_step;
    pthread_mutex_unlock(&e->mu);
    if (prior) {
        s->after_failure = 1;
        reset_result(s);
        s->rc = not_run(s, failed_step);
    } else if (!lose_device(e, s) && rc == 0) {
        check_gathers(e, s);
        fail_rows_of_failed_inputs(s);
    }
    if (s->rc != 0 && !s->lost)
        pagoda_error_message(s->rc, s->error, sizeof(s->error));
    check_backend(e, s);
    record_sampled(e, s);
    const struct timespec *from = &s->submitted;
    if (ns_between(from, &e->last_ended) > 0)
        from = &e->last_ended;
    s->wall_us = ns_between(from, &now) / 1e3;
    s->device_us = device_us >= 0 ? device_us : s->wall_us;
    e->last_ended = now;
    return 1;
}

static struct slot *first_queued(struct executor *e)
{
    for (int i = 0; i < e->count; i++) {
        struct slot *s = &e->slots[(e->head + i) % EXECUTOR_MAX_STEPS];
        if (s->state == SLOT_QUEUED)
            return s;
    }
    return NULL;
}

/* Waits out a step's delay; returns early when it is discarded or the executor stops. */
static void wait_delay(struct executor *e, struct slot *s)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += s->delay_ms / 1000;
    until.tv_nsec += (long)(s->delay_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    s->in_delay = 1;
    while (!e->stop && !s->discarded &&
           pthread_cond_timedwait(&e->cv, &e->mu, &until) != ETIMEDOUT) {
    }
    s->in_delay = 0;
}

/* Waits on cv for at most us microseconds. Under mu. */
static void wait_us(struct executor *e, long us)
{
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_nsec += us * 1000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&e->cv, &e->mu, &until);
}

/* A step has its result: it is delivered in order by the loop. Under mu. */
static void step_ended(struct executor *e, struct slot *s)
{
    if (s->rc != 0 && !s->after_failure && s->gen == e->gen) {
        e->failed = 1;
        e->failed_gen = s->gen;
        e->failed_step = s->step_id;
    }
    s->state = SLOT_DONE;
    uv_async_send(&e->async);
}

/* Completes the step submitted and not completed yet (*out), waiting for it. Under mu. */
static void drain(struct executor *e, struct slot **out)
{
    if (*out == NULL)
        return;
    pthread_mutex_unlock(&e->mu);
    complete_step(e, *out, 1);
    pthread_mutex_lock(&e->mu);
    step_ended(e, *out);
    *out = NULL;
}

/* Runs s synchronously, after the submitted step (*out) has ended. Under mu. */
static void run_sync(struct executor *e, struct slot *s, struct slot **out)
{
    drain(e, out);
    s->after_failure = e->failed && e->failed_gen == s->gen;
    uint64_t failed_step = e->failed_step;
    pthread_mutex_unlock(&e->mu);
    run_step(e, s, s->after_failure, failed_step);
    pthread_mutex_lock(&e->mu);
    step_ended(e, s);
}

/* The thread. With a backend that computes synchronously, each step runs and ends in turn. With
 * an asynchronous one (backend_submit), step n + 1 is submitted while step n may still run on the
 * device, then step n is completed and delivered: the device runs the steps back to back and
 * the results still come in order (a penalised row's history that ends with the token of the
 * step still running reads it on the device too). A step runs synchronously instead (after the
 * one before it has ended) when it was prepared from a failed step, has no tokens, or was
 * refused by backend_submit (the synchronous path then tells which row failed, or the step's
 * error). */
static void *executor_thread(void *arg)
{
    struct executor *e = arg;
    struct slot *out = NULL; /* submitted to the backend, not completed */
    pthread_mutex_lock(&e->mu);
    for (;;) {
        struct slot *s = NULL;
        while (!e->stop && (s = first_queued(e)) == NULL) {
            if (out == NULL) {
                pthread_cond_wait(&e->cv, &e->mu);
                continue;
            }
            pthread_mutex_unlock(&e->mu);
            int ended = complete_step(e, out, 0);
            pthread_mutex_lock(&e->mu);
            if (ended) {
                step_ended(e, out);
                out = NULL;
            } else {
                wait_us(e, EXECUTOR_POLL_US);
            }
        }
        if (e->stop)
            break;
        s->state = SLOT_RUNNING;
        s->after_failure = 0;
        if (s->delay_ms > 0) {
            drain(e, &out);
            wait_delay(e, s);
        }
        if (e->stop)
            break;
        if (s->discarded) {
            s->state = SLOT_DONE;
            uv_async_send(&e->async);
            continue;
        }
        if (!e->submits || s->batch.num_tokens == 0 || (e->failed && e->failed_gen == s->gen)) {
            run_sync(e, s, &out);
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        int rc = submit_step(e, s, out);
        pthread_mutex_lock(&e->mu);
        if (rc != 0) {
            run_sync(e, s, &out);
            continue;
        }
        drain(e, &out); /* step n ends while step n + 1 waits on the device behind it */
        out = s;
    }
    if (out != NULL) { /* closing: nothing is delivered, but the device must be done with it */
        pthread_mutex_unlock(&e->mu);
        complete_step(e, out, 1);
        pthread_mutex_lock(&e->mu);
        out->state = SLOT_DONE;
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

/* ---- the loop's side ------------------------------------------------------------------------ */

static void on_async(uv_async_t *a)
{
    struct executor *e = a->data;
    int delivered = 0;
    pthread_mutex_lock(&e->mu);
    while (e->count > 0 && e->slots[e->head].state == SLOT_DONE) {
        struct slot *s = &e->slots[e->head];
        pthread_mutex_unlock(&e->mu);
        if (!s->discarded && e->done != NULL) {
            struct executor_result r = {
                .epoch = s->epoch,
                .step_id = s->step_id,
                .rc = s->rc,
                .lost = s->lost,
                .num_tokens = s->rc == 0 ? s->batch.num_tokens : 0,
                .num_rows = s->batch.num_logits,
                .seq_ids = s->seq_ids,
                .tokens = s->tokens,
                .logprobs = s->logprobs,
                .row_errors = s->row_errors,
                .failed = s->failed,
                .num_failed = s->num_failed,
                .wall_us = s->wall_us,
                .device_us = s->device_us,
            };
            memcpy(r.error, s->error, sizeof(r.error));
            e->done(e->ctx, &r);
        }
        delivered = 1;
        pthread_mutex_lock(&e->mu);
        s->state = SLOT_FREE;
        e->head = (e->head + 1) % EXECUTOR_MAX_STEPS;
        e->count--;
    }
    int idle = e->count == 0;
    pthread_mutex_unlock(&e->mu);
    if (delivered && idle && e->done != NULL)
        e->done(e->ctx, NULL);
}

int executor_open(uv_loop_t *loop, struct backend *b, const struct executor_limits *limits,
                  executor_done_fn done, void *ctx, struct executor **out)
{
    if (loop == NULL || b == NULL || limits == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "executor_open: NULL argument");
    if (limits->max_num_tokens < 1 || limits->max_num_seqs < 1 ||
        limits->max_num_seqs > MIRROR_PENDING_ROWS)
        return pagoda_error_set(PAGODA_EINVAL, "executor limits: %d tokens, %d sequences",
                                limits->max_num_tokens, limits->max_num_seqs);
    struct executor *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return PAGODA_ENOMEM;
    e->loop = loop;
    e->backend = b;
    e->lim = *limits;
    e->done = done;
    e->ctx = ctx;
    e->submits = backend_can_submit(b);
    pthread_mutex_init(&e->mu, NULL);
    /* The timed waits (a step's delay, the poll of a step on the device) run on the monotonic
     * clock: a wall clock set back must not stall the step at the tail of a burst. */
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&e->cv, &ca);
    pthread_condattr_destroy(&ca);
    int rc = 0;
    for (int i = 0; rc == 0 && i < EXECUTOR_MAX_STEPS; i++)
        rc = slot_alloc(&e->slots[i], limits);
    for (int i = 0; rc == 0 && i < MIRROR_MAX_STEPS_IN_FLIGHT; i++) {
        e->sampled[i].tokens = malloc((size_t)limits->max_num_seqs * sizeof(int32_t));
        e->sampled[i].codes = malloc((size_t)limits->max_num_seqs * sizeof(int32_t));
        if (!e->sampled[i].tokens || !e->sampled[i].codes)
            rc = PAGODA_ENOMEM;
    }
    if (rc != 0) {
        executor_free(e);
        return rc;
    }
    if (uv_async_init(loop, &e->async, on_async) != 0) {
        executor_free(e);
        return pagoda_error_set(PAGODA_EIO, "executor: uv_async_init failed");
    }
    e->async.data = e;
    if (pthread_create(&e->thread, NULL, executor_thread, e) != 0) {
        e->done = NULL;
        executor_close(e); /* frees it on the handle's close */
        return pagoda_error_set(PAGODA_EIO, "executor: pthread_create failed");
    }
    e->thread_started = 1;
    *out = e;
    return 0;
}

void executor_fault_lose_device(struct executor *e, const char *path)
{
    e->lose_device = path;
}

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 64;
    while (n < need)
        n *= 2;
    void *q = realloc(*p, n * elem);
    if (q == NULL)
        return PAGODA_ENOMEM;
    *p = q;
    *cap = n;
    return 0;
}

/* Copies the prepared step into s. */
static int copy_step(struct slot *s, const struct mirror_step *ms)
{
    const struct fwd_batch *b = &ms->batch;
    size_t nt = (size_t)b->num_tokens, ns = (size_t)b->num_seqs, nl = (size_t)b->num_logits;
    size_t bt = ns * (size_t)(b->max_blocks_per_seq > 0 ? b->max_blocks_per_seq : 1);
    int rc;
    size_t ne = (size_t)b->num_logit_entries;
    if ((rc = grow((void **)&s->block_tables, &s->block_tables_cap, bt, sizeof(int32_t))) != 0 ||
        (rc = grow((void **)&s->entries, &s->entries_cap, ne, sizeof(*s->entries))) != 0 ||
        (rc = history_cache_place(&s->histories, ms->rows, s->rows, nl, HISTORY_TAIL)) != 0)
        return rc;
    if (nt > 0) {
        memcpy(s->token_ids, b->token_ids, nt * sizeof(int32_t));
        memcpy(s->positions, b->positions, nt * sizeof(int32_t));
        memcpy(s->slot_mapping, b->slot_mapping, nt * sizeof(int64_t));
    }
    if (ns > 0) {
        memcpy(s->context_lens, b->context_lens, ns * sizeof(int32_t));
        memcpy(s->block_tables, b->block_tables, bt * sizeof(int32_t));
    }
    memcpy(s->query_start, b->query_start, (ns + 1) * sizeof(int32_t));
    if (nl > 0) {
        memcpy(s->logits_indices, b->logits_indices, nl * sizeof(int32_t));
        memcpy(s->seq_ids, ms->seq_ids, nl * sizeof(uint64_t));
    }
    if (ne > 0)
        memcpy(s->entries, b->logit_entries, ne * sizeof(*s->entries));
    memcpy(s->failed, ms->failed, (size_t)ms->num_failed * sizeof(*ms->failed));
    s->num_failed = ms->num_failed;
    s->batch = (struct fwd_batch){
        .num_tokens = b->num_tokens,
        .token_ids = s->token_ids,
        .positions = s->positions,
        .slot_mapping = s->slot_mapping,
        .num_seqs = b->num_seqs,
        .query_start = s->query_start,
        .context_lens = s->context_lens,
        .block_tables = s->block_tables,
        .max_blocks_per_seq = b->max_blocks_per_seq,
        .num_logits = b->num_logits,
        .logits_indices = s->logits_indices,
        .logit_entries = ne > 0 ? s->entries : NULL,
        .num_logit_entries = b->num_logit_entries,
    };
    return 0;
}

int executor_submit(struct executor *e, uint64_t epoch, uint64_t step_id,
                    const struct mirror_step *ms, uint32_t delay_ms)
{
    if (e == NULL || ms == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "executor_submit: NULL argument");
    const struct fwd_batch *b = &ms->batch;
    if (b->num_tokens < 0 || b->num_tokens > e->lim.max_num_tokens || b->num_seqs < 0 ||
        b->num_seqs > e->lim.max_num_seqs || b->num_logits < 0 ||
        b->num_logits > e->lim.max_num_seqs || ms->num_failed < 0 ||
        ms->num_failed > 2 * e->lim.max_num_seqs)
        return pagoda_error_set(PAGODA_ERANGE,
                                "executor: step %" PRIu64 " of %d tokens, %d sequences, %d rows "
                                "(the limits are %d tokens, %d sequences)",
                                step_id, b->num_tokens, b->num_seqs, b->num_logits,
                                e->lim.max_num_tokens, e->lim.max_num_seqs);
    pthread_mutex_lock(&e->mu);
    int count = e->count, head = e->head;
    pthread_mutex_unlock(&e->mu);
    if (count == EXECUTOR_MAX_STEPS)
        return pagoda_error_set(PAGODA_EBUSY,
                                "executor: step %" PRIu64 ": %d steps are held already (the limit)",
                                step_id, EXECUTOR_MAX_STEPS);
    /* The slot past the last held one is free and only this thread fills slots. */
    struct slot *s = &e->slots[(head + count) % EXECUTOR_MAX_STEPS];
    int rc = copy_step(s, ms);
    if (rc != 0)
        return rc;
    s->epoch = epoch;
    s->step_id = step_id;
    s->delay_ms = delay_ms;
    s->discarded = 0;
    s->in_delay = 0;
    pthread_mutex_lock(&e->mu);
    s->gen = e->gen;
    s->state = SLOT_QUEUED;
    e->count++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return 0;
}

/* Under mu. */
static int discard_locked(struct executor *e)
{
    int dropped = 0;
    while (e->count > 0) {
        struct slot *s = &e->slots[(e->head + e->count - 1) % EXECUTOR_MAX_STEPS];
        if (s->state != SLOT_QUEUED)
            break;
        s->state = SLOT_FREE;
        e->count--;
        dropped++;
    }
    for (int i = 0; i < e->count; i++) {
        struct slot *s = &e->slots[(e->head + i) % EXECUTOR_MAX_STEPS];
        if (s->state == SLOT_RUNNING && s->in_delay) {
            s->discarded = 1;
            dropped++;
        }
    }
    e->gen++;
    e->failed = 0;
    pthread_cond_broadcast(&e->cv);
    return dropped;
}

int executor_discard(struct executor *e)
{
    pthread_mutex_lock(&e->mu);
    int dropped = discard_locked(e);
    pthread_mutex_unlock(&e->mu);
    return dropped;
}

int executor_idle(const struct executor *e)
{
    return executor_held(e) == 0;
}

int executor_held(const struct executor *e)
{
    struct executor *m = (struct executor *)e; /* the lock only */
    pthread_mutex_lock(&m->mu);
    int n = m->count;
    pthread_mutex_unlock(&m->mu);
    return n;
}

static void on_close(uv_handle_t *h)
{
    executor_free(h->data);
}

void executor_close(struct executor *e)
{
    if (e == NULL)
        return;
    pthread_mutex_lock(&e->mu);
    discard_locked(e);
    e->stop = 1;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    if (e->thread_started)
        pthread_join(e->thread, NULL);
    e->done = NULL;
    uv_close((uv_handle_t *)&e->async, on_close);
}
