#include "worker/step_loop.h"
#include "common/error.h"
#include "common/log.h"
#include "worker/executor.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct step_loop {
    struct step_loop_options o;
    struct mirror *mirror;
    struct executor *executor;
    int32_t max_seqs;
    Pagoda__Internal__SeqResult *results; /* [3 * max_seqs]: rows, then failed sequences */
    Pagoda__Internal__SeqResult **result_ptrs;

    /* Messages held behind a Resync that waits for the executor: a ring. */
    Pagoda__Internal__ToWorker *held[STEP_LOOP_MAX_HELD];
    int held_head, num_held;
    int waiting; /* held[held_head] is a Resync waiting for the executor to be idle */

    int lost_told;             /* options.lost was called */
    uint64_t drop_result_step; /* the step id whose result fault drop-result withholds, or 0 */
    uint64_t drop_result_epoch;
    struct step_loop_stats st;
};

/* ---- answers -------------------------------------------------------------------------------- */

static void send_result(struct step_loop *sl, Pagoda__Internal__StepResult *r)
{
    r->has_epoch = r->has_step_id = r->has_computed_tokens = 1;
    r->computed_tokens = sl->st.computed_tokens;
    r->has_steps_run = r->has_wall_us_total = r->has_device_us_total = 1;
    r->steps_run = sl->st.steps_run;
    r->wall_us_total = sl->st.wall_us_total;
    r->device_us_total = sl->st.device_us_total;
    Pagoda__Internal__ToScheduler msg = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    msg.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESULT;
    msg.result = r;
    sl->o.send(sl->o.ctx, &msg, "StepResult");
}

static void send_step_error(struct step_loop *sl, uint64_t epoch, uint64_t step_id,
                            const char *verb, int rc, const char *text)
{
    log_warn("step %" PRIu64 " (epoch %" PRIu64 ") %s: %s", step_id, epoch, verb, text);
    Pagoda__Internal__StepResult r = PAGODA__INTERNAL__STEP_RESULT__INIT;
    r.epoch = epoch;
    r.step_id = step_id;
    r.has_error_code = 1;
    r.error_code = rc;
    r.error_message = (char *)text;
    send_result(sl, &r);
}

static void refuse_step(struct step_loop *sl, const Pagoda__Internal__Step *s, int rc)
{
    char text[700];
    pagoda_error_message(rc, text, sizeof(text));
    sl->st.steps_refused++;
    send_step_error(sl, s->epoch, s->step_id, "refused", rc, text);
}

/* A result the executor posted: resolve the mirror, answer the scheduler. */
static void deliver(struct step_loop *sl, const struct executor_result *x)
{
    if (x->lost && sl->o.lost != NULL) {
        /* Answered by nobody: an error result would start the scheduler's search for a culprit
         * among the step's sequences, which are not at fault. From now on nothing is handled
         * (lost_told): the process is ending. */
        if (!sl->lost_told)
            sl->o.lost(sl->o.ctx, x->rc, x->error);
        sl->lost_told = 1;
        return;
    }
    if (x->rc != 0) {
        mirror_step_break(sl->mirror, x->step_id);
        sl->st.steps_refused++;
        send_step_error(sl, x->epoch, x->step_id, "failed", x->rc, x->error);
        return;
    }
    mirror_step_resolve(sl->mirror, x->step_id, x->tokens, x->row_errors);
    sl->st.computed_tokens += (uint64_t)x->num_tokens;
    sl->st.steps_run++;
    sl->st.wall_us_total += x->wall_us;
    sl->st.device_us_total += x->device_us;

    Pagoda__Internal__StepResult r = PAGODA__INTERNAL__STEP_RESULT__INIT;
    r.epoch = x->epoch;
    r.step_id = x->step_id;
    r.has_step_wall_us = r.has_step_device_us = 1;
    r.step_wall_us = x->wall_us;
    r.step_device_us = x->device_us;
    r.results = sl->result_ptrs;
    size_t n = 0;
    for (int32_t i = 0; i < x->num_rows; i++) {
        Pagoda__Internal__SeqResult *sr = &sl->results[n];
        pagoda__internal__seq_result__init(sr);
        sr->has_seq_id = 1;
        sr->seq_id = x->seq_ids[i];
        if (x->row_errors[i].code != 0) {
            sr->has_error_code = 1;
            sr->error_code = x->row_errors[i].code;
            sr->error_message = (char *)x->row_errors[i].message;
            log_warn("step %" PRIu64 ": sequence %" PRIu64 " failed: %s", x->step_id, sr->seq_id,
                     sr->error_message);
        } else {
            sr->has_token_id = sr->has_logprob = 1;
            sr->token_id = x->tokens[i];
            sr->logprob = x->logprobs[i];
        }
        sl->result_ptrs[n++] = sr;
    }
    for (int32_t i = 0; i < x->num_failed; i++) {
        Pagoda__Internal__SeqResult *sr = &sl->results[n];
        pagoda__internal__seq_result__init(sr);
        sr->has_seq_id = sr->has_error_code = 1;
        sr->seq_id = x->failed[i].seq_id;
        sr->error_code = x->failed[i].code;
        sr->error_message = (char *)x->failed[i].message;
        log_warn("step %" PRIu64 ": sequence %" PRIu64 " failed: %s", x->step_id, sr->seq_id,
                 sr->error_message);
        sl->result_ptrs[n++] = sr;
    }
    r.n_results = n;
    log_debug("step %" PRIu64 ": %d tokens, %d sampled, %.0f us (device %.0f us)", x->step_id,
              x->num_tokens, x->num_rows, x->wall_us, x->device_us);
    if (sl->drop_result_step == x->step_id && sl->drop_result_epoch == x->epoch) {
        log_warn("fault drop-result=%" PRIu64 ": not sending the result of step %" PRIu64,
                 sl->o.drop_result, x->step_id);
        sl->drop_result_step = 0;
        return;
    }
    send_result(sl, &r);
}

/* ---- messages in ------------------------------------------------------------------------------
 */

static void on_step(struct step_loop *sl, const Pagoda__Internal__Step *s)
{
    uint64_t nth = ++sl->st.steps_received;
    if (sl->o.drop_step == nth) {
        log_warn("fault drop-step=%" PRIu64 ": ignoring step %" PRIu64 " (epoch %" PRIu64 ")", nth,
                 s->step_id, s->epoch);
        return;
    }
    uint32_t delay = sl->o.step_delay_ms;
    if (s->has_delay_ms && s->delay_ms > delay)
        delay = s->delay_ms < STEP_LOOP_MAX_DELAY_MS ? s->delay_ms : STEP_LOOP_MAX_DELAY_MS;
    if (s->has_tp_size && s->tp_size > 1) {
        refuse_step(sl, s,
                    pagoda_error_set(PAGODA_EUNSUPPORTED,
                                     "tensor parallel steps (tp_size %d) are not supported",
                                     s->tp_size));
        return;
    }
    struct mirror_step ms;
    int rc = mirror_step_prepare(sl->mirror, s, &ms);
    if (rc == MIRROR_EOTHER_EPOCH) {
        sl->st.stale_steps++;
        char text[700];
        log_debug("step %" PRIu64 " ignored: %s", s->step_id,
                  pagoda_error_message(rc, text, sizeof(text)));
        return;
    }
    if (rc == 0 && (rc = executor_submit(sl->executor, s->epoch, s->step_id, &ms, delay)) != 0)
        mirror_step_abort(sl->mirror);
    if (rc != 0) {
        refuse_step(sl, s, rc);
        return;
    }
    mirror_step_commit_pending(sl->mirror);
    if (sl->o.drop_result == nth) {
        sl->drop_result_step = s->step_id;
        sl->drop_result_epoch = s->epoch;
    }
}

static void apply_resync(struct step_loop *sl, const Pagoda__Internal__Resync *r)
{
    /* A resync of an epoch this worker has not seen comes from a scheduler that may never have
     * received a Hello (it announces its epoch with empty resyncs until one arrives): introduce
     * ourselves first, or each side would wait for the other. */
    if (!mirror_synced(sl->mirror) || mirror_epoch(sl->mirror) != r->epoch)
        sl->o.send_hello(sl->o.ctx);
    sl->st.resyncs++;
    /* Block ids of another pool than ours would read and write KV that is not what the
     * scheduler believes: refuse, and say which pool this is (the scheduler adopts it). */
    uint64_t pool_id = sl->o.pool_id;
    int rc;
    if (r->has_pool_id && r->pool_id != pool_id) {
        rc = pagoda_error_set(PAGODA_EMISMATCH,
                              "the resync is for pool %016" PRIx64 "; this worker maps pool "
                              "%016" PRIx64,
                              r->pool_id, pool_id);
        sl->o.send_hello(sl->o.ctx);
    } else {
        rc = mirror_resync(sl->mirror, r);
    }
    Pagoda__Internal__ResyncDone d = PAGODA__INTERNAL__RESYNC_DONE__INIT;
    d.has_epoch = d.has_resync_id = d.has_pool_id = 1;
    d.epoch = r->epoch;
    d.resync_id = r->resync_id;
    d.pool_id = pool_id;
    char text[700];
    if (rc != 0) {
        pagoda_error_message(rc, text, sizeof(text));
        log_warn("resync %" PRIu64 " (epoch %" PRIu64 ") refused: %s", r->resync_id, r->epoch,
                 text);
        d.has_error_code = 1;
        d.error_code = rc;
        d.error_message = text;
    } else {
        log_info("resync %" PRIu64 ": epoch %" PRIu64 ", %zu sequences, next step %" PRIu64,
                 r->resync_id, r->epoch, r->n_seqs, r->next_step_id);
        /* Sequences left out for their own content: the scheduler fails them. */
        const struct mirror_seq_error *failed;
        int32_t n_failed = mirror_resync_failures(sl->mirror, &failed);
        if (n_failed > sl->max_seqs)
            n_failed = sl->max_seqs;
        for (int32_t i = 0; i < n_failed; i++) {
            Pagoda__Internal__SeqResult *sr = &sl->results[i];
            pagoda__internal__seq_result__init(sr);
            sr->has_seq_id = sr->has_error_code = 1;
            sr->seq_id = failed[i].seq_id;
            sr->error_code = failed[i].code;
            sr->error_message = (char *)failed[i].message;
            sl->result_ptrs[i] = sr;
            log_warn("resync %" PRIu64 ": sequence %" PRIu64 " left out: %s", r->resync_id,
                     sr->seq_id, sr->error_message);
        }
        d.n_failed = (size_t)n_failed;
        d.failed = sl->result_ptrs;
    }
    Pagoda__Internal__ToScheduler msg = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    msg.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESYNC_DONE;
    msg.resync_done = &d;
    sl->o.send(sl->o.ctx, &msg, "ResyncDone");
}

/* Handles msg now, or holds it (a Resync that must wait for the executor, or anything behind
 * one). Returns 1 when msg was kept (held), 0 when it is handled and may be freed. */
static int handle_now(struct step_loop *sl, Pagoda__Internal__ToWorker *msg)
{
    if (msg->msg_case == PAGODA__INTERNAL__TO_WORKER__MSG_STEP) {
        on_step(sl, msg->step);
        return 0;
    }
    if (msg->msg_case != PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC)
        return 0;
    int dropped = executor_discard(sl->executor);
    if (dropped > 0)
        log_info("resync %" PRIu64 ": %d queued steps discarded", msg->resync->resync_id, dropped);
    if (!executor_idle(sl->executor))
        return 1;
    apply_resync(sl, msg->resync);
    return 0;
}

/* Handles the held messages in order until one must wait again. */
static void run_held(struct step_loop *sl)
{
    if (sl->lost_told) /* the backend is lost: a held Resync is not applied nor answered */
        return;
    while (sl->num_held > 0) {
        Pagoda__Internal__ToWorker *msg = sl->held[sl->held_head];
        if (handle_now(sl, msg)) {
            sl->waiting = 1;
            return;
        }
        protobuf_c_message_free_unpacked(&msg->base, NULL);
        sl->held_head = (sl->held_head + 1) % STEP_LOOP_MAX_HELD;
        sl->num_held--;
    }
    sl->waiting = 0;
}

static void on_done(void *ctx, const struct executor_result *x)
{
    struct step_loop *sl = ctx;
    if (x != NULL)
        deliver(sl, x);
    else if (sl->waiting)
        run_held(sl);
}

void step_loop_handle(struct step_loop *sl, Pagoda__Internal__ToWorker *msg)
{
    if (sl->lost_told) {
        protobuf_c_message_free_unpacked(&msg->base, NULL);
        return;
    }
    if (sl->num_held > 0) {
        if (sl->num_held == STEP_LOOP_MAX_HELD) {
            sl->st.held_dropped++;
            log_warn("%d messages wait behind a resync: dropping one more", STEP_LOOP_MAX_HELD);
            protobuf_c_message_free_unpacked(&msg->base, NULL);
            return;
        }
        sl->held[(sl->held_head + sl->num_held++) % STEP_LOOP_MAX_HELD] = msg;
        return;
    }
    if (handle_now(sl, msg)) {
        sl->held[sl->held_head] = msg;
        sl->num_held = 1;
        sl->waiting = 1;
        return;
    }
    protobuf_c_message_free_unpacked(&msg->base, NULL);
}

void step_loop_stats(const struct step_loop *sl, struct step_loop_stats *out)
{
    *out = sl->st;
}

int step_loop_open(uv_loop_t *loop, struct backend *b, const struct step_loop_options *o,
                   struct step_loop **out)
{
    if (loop == NULL || b == NULL || o == NULL || out == NULL || o->send == NULL ||
        o->send_hello == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "step_loop_open: NULL argument");
    struct step_loop *sl = calloc(1, sizeof(*sl));
    if (sl == NULL)
        return PAGODA_ENOMEM;
    sl->o = *o;
    sl->max_seqs = o->mirror.max_seqs;
    int rc = mirror_new(&o->mirror, &sl->mirror);
    if (rc != 0) {
        free(sl);
        return rc;
    }
    size_t n = 3 * (size_t)sl->max_seqs;
    sl->results = malloc(n * sizeof(*sl->results));
    sl->result_ptrs = malloc(n * sizeof(*sl->result_ptrs));
    struct executor_limits el = {
        .max_num_tokens = o->mirror.max_batched_tokens,
        .max_num_seqs = o->mirror.max_seqs,
    };
    if (sl->results == NULL || sl->result_ptrs == NULL)
        rc = PAGODA_ENOMEM;
    else
        rc = executor_open(loop, b, &el, on_done, sl, &sl->executor);
    if (rc == 0 && o->lose_device != NULL)
        executor_fault_lose_device(sl->executor, o->lose_device);
    if (rc != 0) {
        mirror_free(sl->mirror);
        free(sl->results);
        free(sl->result_ptrs);
        free(sl);
        return rc;
    }
    *out = sl;
    return 0;
}

void step_loop_close(struct step_loop *sl)
{
    if (sl == NULL)
        return;
    executor_close(sl->executor);
    while (sl->num_held > 0) {
        protobuf_c_message_free_unpacked(&sl->held[sl->held_head]->base, NULL);
        sl->held_head = (sl->held_head + 1) % STEP_LOOP_MAX_HELD;
        sl->num_held--;
    }
    mirror_free(sl->mirror);
    free(sl->results);
    free(sl->result_ptrs);
    free(sl);
}
