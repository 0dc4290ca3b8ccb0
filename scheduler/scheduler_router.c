/* The scheduler's side of the router link (scheduler_impl.h): submissions and their checks,
 * cancels, stats requests, the router's hello, and the announcement and resend of what the
 * scheduler holds for the router (live requests, ended ones it may not have heard of). The
 * steps are scheduler_step.c's; results, workers and sequences scheduler.c's. */
#include "scheduler/scheduler.h"

#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/sampler.h"
#include "scheduler/scheduler_impl.h"
#include "wire/sampling_wire.h"
#include "wire/wire.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* What a submission says of who it is, for q: its request id, tenant (a copy: false without
 * memory) and client_request_id, ignore_eos, logprobs and the router's text parameters (a copy),
 * as an announcement tells them. */
static bool seq_take_submit_ids(struct seq *q, const Pagoda__Internal__SubmitSeq *m)
{
    memcpy(q->request_id, m->request_id.data, SCHEDULER_REQUEST_ID_BYTES);
    q->ignore_eos = m->has_ignore_eos && m->ignore_eos;
    q->logprobs_asked = m->has_logprobs && m->logprobs;
    if (m->has_router_text && m->router_text.len > 0 &&
        m->router_text.len <= SCHEDULER_MAX_ROUTER_TEXT) { /* (longer: not the router's) */
        if ((q->router_text = malloc(m->router_text.len)) == NULL)
            return false;
        memcpy(q->router_text, m->router_text.data, m->router_text.len);
        q->router_text_len = m->router_text.len;
    }
    if (m->has_client_request_id && m->client_request_id.len == SCHEDULER_REQUEST_ID_BYTES) {
        q->has_client_id = true;
        memcpy(q->client_id, m->client_request_id.data, SCHEDULER_REQUEST_ID_BYTES);
    }
    return m->tenant == NULL || (q->tenant = strdup(m->tenant)) != NULL;
}

/* A submission (of a 16-byte request id) refused before it became a sequence: its error end,
 * and an empty sequence with that end in the refused list, so that a resend after a lost message
 * or an announcement tells the router (under load, when the queue is full, is when the link to
 * the router is most likely to drop a message). */
static void refuse_submit(struct scheduler *s, const Pagoda__Internal__SubmitSeq *m, int err,
                          const char *msg)
{
    sched_send_error(s, m->request_id.data, SCHEDULER_REQUEST_ID_BYTES, err, msg);
    struct seq *q = sched_seq_new(NULL, 0, 0);
    if (q == NULL)
        return; /* the end went out once; without memory it cannot be kept */
    q->max_tokens = m->has_max_tokens && m->max_tokens > 0 ? m->max_tokens : 0;
    if (!seq_take_submit_ids(q, m)) {
        sched_seq_free(q); /* announced without its tenant it would be another tenant's */
        return;
    }
    sched_seq_set_error(q, err, msg);
    sched_ended_push(s, &s->refused, q, SCHEDULER_MAX_RECENT_REFUSED,
                     8 * SCHEDULER_MAX_RECENT_REFUSED);
}

static void on_submit(struct scheduler *s, const Pagoda__Internal__SubmitSeq *m)
{
    const uint8_t *id = m->has_request_id ? m->request_id.data : NULL;
    size_t id_len = m->has_request_id ? m->request_id.len : 0;
    char msg[SCHEDULER_ERROR_MESSAGE_MAX];
    if (id_len != SCHEDULER_REQUEST_ID_BYTES) {
        snprintf(msg, sizeof(msg), "request_id must be %d bytes, not %zu",
                 SCHEDULER_REQUEST_ID_BYTES, id_len);
        sched_send_error(s, id, id_len, PAGODA_EINVAL, msg);
        return;
    }
    if (sched_find_request(s, id) != NULL) {
        log_debug("submit of a request already queued: ignored");
        return;
    }
    size_t n_prompt = m->n_prompt_token_ids, n_out = m->n_output_token_ids;
    int64_t limit = sched_context_limit(s);
    int err = 0;
    if (n_prompt == 0) {
        err = PAGODA_EINVAL;
        snprintf(msg, sizeof(msg), "the prompt is empty");
    } else if (n_prompt > SCHEDULER_MAX_PROMPT_TOKENS || n_out > SCHEDULER_MAX_PROMPT_TOKENS ||
               (int64_t)n_prompt + 1 > limit) {
        err = PAGODA_ERANGE;
        snprintf(msg, sizeof(msg), "prompt of %zu tokens + 1 exceeds the context of %lld tokens",
                 n_prompt,
                 (long long)(limit < SCHEDULER_MAX_PROMPT_TOKENS
                                 ? limit
                                 : (int64_t)SCHEDULER_MAX_PROMPT_TOKENS));
    } else if (m->n_stop_token_ids > SCHEDULER_MAX_STOP_IDS) {
        err = PAGODA_ERANGE;
        snprintf(msg, sizeof(msg), "%zu stop token ids, more than %d", m->n_stop_token_ids,
                 SCHEDULER_MAX_STOP_IDS);
    } else if (m->has_max_tokens && m->max_tokens < 0) {
        err = PAGODA_ERANGE;
        snprintf(msg, sizeof(msg), "max_tokens %d is negative", (int)m->max_tokens);
    } else if (m->has_strict_max_tokens && m->strict_max_tokens && n_out == 0 &&
               sched_strict_check(sched_context_with_pins(s, 0), (int32_t)n_prompt, m->max_tokens,
                                  msg) != 0) {
        /* refused now, not after its wait in the queue: what no context without pins would
         * hold (pins may go while it waits; the admission checks what is left then) */
        err = PAGODA_ERANGE;
    } else if (s->waiting.count + s->running.count >= (uint32_t)s->cfg.max_queued) {
        err = PAGODA_EEXHAUSTED;
        snprintf(msg, sizeof(msg), "the scheduler's queue is full (%d requests)",
                 (int)s->cfg.max_queued);
    }
    int64_t vocab = s->worker.hello_seen ? s->worker.vocab_size : INT32_MAX;
    for (size_t i = 0; err == 0 && i < n_prompt + n_out; i++) {
        int32_t t = i < n_prompt ? m->prompt_token_ids[i] : m->output_token_ids[i - n_prompt];
        if (t < 0 || t >= vocab) {
            err = PAGODA_EINVAL;
            snprintf(msg, sizeof(msg), "token id %d is outside the vocabulary", (int)t);
        }
    }
    struct sampling_params sp;
    struct logit_bias bias = {0};
    if (err == 0 && ((err = sampling_from_internal(m->sampling, &sp)) != 0 ||
                     (err = logit_bias_from_internal(m->sampling, s->worker.hello_seen ? vocab : 0,
                                                     &bias)) != 0))
        snprintf(msg, sizeof(msg), "%s", pagoda_error_detail());
    if (err != 0) {
        refuse_submit(s, m, err, msg);
        return;
    }
    struct seq *q = sched_seq_new(m->prompt_token_ids, (int32_t)n_prompt, (int32_t)n_out);
    if (q == NULL) {
        logit_bias_fini(&bias);
        sched_send_error(s, id, id_len, PAGODA_ENOMEM, "out of memory for the request");
        return;
    }
    if (n_out > 0)
        memcpy(q->tokens + n_prompt, m->output_token_ids, n_out * sizeof(int32_t));
    q->num_tokens = (int32_t)(n_prompt + n_out);
    q->sampling = sp;
    q->bias = bias;
    q->max_tokens = m->has_max_tokens ? m->max_tokens : 0;
    q->strict_max_tokens = m->has_strict_max_tokens && m->strict_max_tokens && n_out == 0;
    q->num_stop_ids = (int32_t)m->n_stop_token_ids;
    if (m->n_stop_token_ids > 0)
        memcpy(q->stop_ids, m->stop_token_ids, m->n_stop_token_ids * sizeof(int32_t));
    q->owner = sched_tenant_get(s, m->tenant != NULL ? m->tenant : "default");
    if (!seq_take_submit_ids(q, m) || q->owner == NULL) {
        sched_seq_free(q);
        sched_send_error(s, id, id_len, PAGODA_ENOMEM, "out of memory for the request");
        return;
    }
    sched_hash_request(s, q);
    waiting_push(s, q, false);
    if (q->max_tokens > 0 && (int64_t)n_out >= q->max_tokens) {
        /* A resubmission whose output is already complete. */
        sched_send_end(s, q->request_id, SCHEDULER_REQUEST_ID_BYTES, (uint32_t)n_out,
                       (uint32_t)n_prompt, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH, 0, NULL);
        sched_seq_end(s, q, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH, 0, NULL);
    }
}

static void on_cancel(struct scheduler *s, const Pagoda__Internal__CancelSeq *m)
{
    if (!m->has_request_id || m->request_id.len != SCHEDULER_REQUEST_ID_BYTES) {
        log_warn("cancel with a request id that is not %d bytes: ignored",
                 SCHEDULER_REQUEST_ID_BYTES);
        return;
    }
    struct seq *q = sched_find_request(s, m->request_id.data);
    if (q == NULL)
        return;
    sched_send_end(s, q->request_id, SCHEDULER_REQUEST_ID_BYTES,
                   (uint32_t)(q->num_tokens - q->num_prompt_tokens), (uint32_t)q->num_prompt_tokens,
                   PAGODA__INTERNAL__FINISH_REASON__FINISH_CANCELLED, 0, NULL);
    sched_seq_end(s, q, PAGODA__INTERNAL__FINISH_REASON__FINISH_CANCELLED, 0, NULL);
}

static void on_stats_request(struct scheduler *s, const Pagoda__Internal__StatsRequest *m)
{
    struct scheduler_stats st;
    scheduler_get_stats(s, &st);
    Pagoda__Internal__SchedulerStats ps = PAGODA__INTERNAL__SCHEDULER_STATS__INIT;
    ps.has_cookie = m->has_cookie;
    ps.cookie = m->cookie;
    ps.has_running = ps.has_waiting = ps.has_peak_running = ps.has_steps = 1;
    ps.has_resyncs = ps.has_worker_restarts = ps.has_num_blocks = ps.has_free_blocks = 1;
    ps.has_kv_usage = ps.has_computed_tokens = ps.has_malformed_messages = 1;
    ps.has_preemptions = ps.has_step_cpu_us = 1;
    ps.running = st.running;
    ps.waiting = st.waiting;
    ps.peak_running = st.peak_running;
    ps.steps = st.steps;
    ps.resyncs = st.resyncs;
    ps.worker_restarts = st.worker_restarts;
    ps.num_blocks = st.num_blocks;
    ps.free_blocks = st.free_blocks;
    ps.kv_usage = st.kv_usage;
    ps.computed_tokens = st.computed_tokens;
    ps.malformed_messages = st.malformed_messages;
    ps.preemptions = st.preemptions;
    ps.step_cpu_us = st.step_cpu_us;
    ps.has_fragmentation = ps.has_cached_blocks = ps.has_peak_kv_usage = 1;
    ps.has_prefix_query_tokens = ps.has_prefix_hit_tokens = ps.has_evictions = 1;
    ps.has_pinned_blocks = 1;
    ps.fragmentation = st.fragmentation;
    ps.cached_blocks = st.cached_blocks;
    ps.peak_kv_usage = st.peak_kv_usage;
    ps.prefix_query_tokens = st.prefix_query_tokens;
    ps.prefix_hit_tokens = st.prefix_hit_tokens;
    ps.evictions = st.evictions;
    ps.pinned_blocks = st.pinned_blocks;
    ps.has_steps_in_flight = ps.has_peak_steps_in_flight = ps.has_discarded_tokens = 1;
    ps.steps_in_flight = st.steps_in_flight;
    ps.peak_steps_in_flight = st.peak_steps_in_flight;
    ps.discarded_tokens = st.discarded_tokens;
    ps.has_prefix_waits = 1;
    ps.prefix_waits = st.prefix_waits;
    ps.has_kv_dtype = 1;
    ps.kv_dtype = (Pagoda__Internal__DType)s->cfg.geometry.dtype;
    ps.has_router_drops = ps.has_router_resends = 1;
    ps.router_drops = st.router_drops;
    ps.router_resends = st.router_resends;
    ps.has_worker_step_wall_us = ps.has_worker_step_device_us = 1;
    ps.worker_step_wall_us = st.worker_step_wall_us;
    ps.worker_step_device_us = st.worker_step_device_us;
    ps.has_worker_steps_timed = ps.has_worker_step_wall_us_total = 1;
    ps.has_worker_step_device_us_total = 1;
    ps.worker_steps_timed = st.worker_steps_timed;
    ps.worker_step_wall_us_total = sched_us_counter(st.worker_step_wall_us_sum);
    ps.worker_step_device_us_total = sched_us_counter(st.worker_step_device_us_sum);
    ps.has_prefill_tokens = ps.has_decode_tokens = ps.has_locality = 1;
    ps.has_locality_run_length = 1;
    ps.prefill_tokens = st.prefill_tokens;
    ps.decode_tokens = st.decode_tokens;
    ps.locality = st.locality;
    ps.locality_run_length = st.locality_run_length;
    Pagoda__Internal__ToRouter r = PAGODA__INTERNAL__TO_ROUTER__INIT;
    r.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_STATS;
    r.stats = &ps;
    sched_send_router(s, &r);
}

/* The newest ended sequence of each request id among the recent and refused lists, for one pass
 * over them: open addressing over the request buckets' keyed hash (ids may be a client's own
 * choice), at most half full. */
struct newest_map {
    const struct scheduler *s;
    const struct seq **slots;
    uint32_t mask;
};

static bool newest_map_init(struct newest_map *m, const struct scheduler *s, uint32_t count)
{
    uint32_t size = 16;
    while (size < 2 * count)
        size *= 2;
    m->s = s;
    m->slots = calloc(size, sizeof(*m->slots));
    m->mask = size - 1;
    return m->slots != NULL;
}

/* The slot of q's id: the one holding that id, or the empty one where it goes. */
static uint32_t newest_map_slot(const struct newest_map *m, const struct seq *q)
{
    uint32_t i = (uint32_t)sched_request_hash(m->s, q->request_id) & m->mask;
    while (m->slots[i] != NULL &&
           memcmp(m->slots[i]->request_id, q->request_id, SCHEDULER_REQUEST_ID_BYTES) != 0)
        i = (i + 1) & m->mask;
    return i;
}

static void newest_map_add(struct newest_map *m, const struct seq *q)
{
    const uint32_t i = newest_map_slot(m, q);
    if (m->slots[i] == NULL || m->slots[i]->end_order < q->end_order)
        m->slots[i] = q;
}

static bool newest_map_is_newest(const struct newest_map *m, const struct seq *q)
{
    return m->slots[newest_map_slot(m, q)] == q;
}

/* The older of the two lists' next ended sequences (their cursors *a and *b), advanced past. */
static struct seq *next_ended(struct seq **a, struct seq **b)
{
    struct seq **p = *a == NULL ? b : *b == NULL ? a : (*a)->end_order < (*b)->end_order ? a : b;
    struct seq *q = *p;
    if (q != NULL)
        *p = q->next;
    return q;
}

/* q's event in an announcement: its output from offset 0 and what a restarted router needs to
 * register it again (and, for a request not ended, to submit it again: *sp holds its sampling
 * parameters). */
static void announce_fill(Pagoda__Internal__TokenEvent *ev, Pagoda__Internal__SamplingParams *sp,
                          struct seq *q)
{
    pagoda__internal__token_event__init(ev);
    ev->has_request_id = 1;
    ev->request_id.data = q->request_id;
    ev->request_id.len = SCHEDULER_REQUEST_ID_BYTES;
    ev->has_offset = 1;
    ev->offset = 0;
    ev->n_token_ids = (size_t)(q->num_tokens - q->num_prompt_tokens);
    ev->token_ids = q->tokens + q->num_prompt_tokens;
    ev->n_logprobs = ev->n_token_ids;
    ev->logprobs = q->logprobs + q->num_prompt_tokens;
    ev->has_prompt_tokens = 1;
    ev->prompt_tokens = (uint32_t)q->num_prompt_tokens;
    ev->has_cached_tokens = q->looked_up; /* (not yet admitted: not known yet) */
    ev->cached_tokens = q->cached_tokens;
    ev->has_announce = 1;
    ev->announce = 1;
    ev->tenant = q->tenant;
    ev->has_max_tokens = 1;
    ev->max_tokens = q->max_tokens;
    ev->has_ignore_eos = 1;
    ev->ignore_eos = q->ignore_eos;
    ev->has_logprobs_asked = q->logprobs_asked;
    ev->logprobs_asked = q->logprobs_asked;
    ev->has_router_text = q->router_text != NULL;
    ev->router_text.data = q->router_text;
    ev->router_text.len = q->router_text_len;
    if (q->has_client_id) {
        ev->has_client_request_id = 1;
        ev->client_request_id.data = q->client_id;
        ev->client_request_id.len = SCHEDULER_REQUEST_ID_BYTES;
    }
    if (q->finish_reason == PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE) {
        /* the rest of its SubmitSeq: without it a router restarted before this scheduler could
         * not submit the request again, and it ended with an error ("the prompt is empty") */
        *sp = sampling_to_internal(&q->sampling);
        logit_bias_to_internal(&q->bias, sp);
        ev->sampling = sp;
        ev->n_prompt_token_ids = (size_t)q->num_prompt_tokens;
        ev->prompt_token_ids = q->tokens;
        ev->n_stop_token_ids = (size_t)q->num_stop_ids;
        ev->stop_token_ids = q->stop_ids;
        ev->has_strict_max_tokens = q->strict_max_tokens;
        ev->strict_max_tokens = q->strict_max_tokens;
    } else {
        ev->has_finish_reason = 1;
        ev->finish_reason = q->finish_reason;
        if (q->error_code != 0) {
            ev->has_error_code = 1;
            ev->error_code = q->error_code;
            ev->error_message = (char *)q->error_message;
        }
    }
}

/* Sends every request held (running, waiting, and the recently ended and refused, of an id the
 * newest only) from output offset 0, in
 * messages of at most max_seqs events and about SCHEDULER_ANNOUNCE_TOKENS tokens: as an
 * announcement (announce set, announce_done on the last message), or as a resend after a lost
 * message (neither: a router takes the tokens it lacks and adopts no request; requests with no
 * output and no end are left out). Stops at the first message lost and returns false; true when
 * every message went. *total: the requests sent. */
static bool send_held(struct scheduler *s, bool announce, size_t *total)
{
    size_t n = 0, tokens = 0;
    *total = 0;
    /* Of the ends of one request id (submitted again after it ended) only the newest is told:
     * the router holds at most one request of an id. */
    struct newest_map newest;
    if (!newest_map_init(&newest, s, s->recent.count + s->refused.count)) {
        s->router_behind =
            true; /* without memory: as if lost, tried again (sched_resend_to_router) */
        return false;
    }
    for (struct seq *q = s->recent.head; q != NULL; q = q->next)
        newest_map_add(&newest, q);
    for (struct seq *q = s->refused.head; q != NULL; q = q->next)
        newest_map_add(&newest, q);
    /* Running, waiting, then the ended oldest first (a router over its cap of finished requests
     * drops its oldest). */
    struct seq *run = s->running.head, *wait = s->waiting.head;
    struct seq *rec = s->recent.head, *ref = s->refused.head;
    bool whole = true;
    for (;;) {
        struct seq *q;
        bool ended = false;
        if (run != NULL) {
            q = run;
            run = run->next;
        } else if (wait != NULL) {
            q = wait;
            wait = wait->next;
        } else if ((q = next_ended(&rec, &ref)) != NULL) {
            ended = true;
        } else {
            break;
        }
        if (q->pin != NULL || (ended && (sched_find_request(s, q->request_id) != NULL ||
                                         !newest_map_is_newest(&newest, q))))
            continue; /* a pin's own, or ended then submitted again: the newest speaks */
        size_t out = (size_t)(q->num_tokens - q->num_prompt_tokens);
        if (!announce && out == 0 &&
            q->finish_reason == PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE)
            continue;      /* no event of it can have been lost */
        size_t sent = out; /* the tokens its event carries (an announcement's: its prompt too) */
        if (announce && q->finish_reason == PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE)
            sent += (size_t)q->num_prompt_tokens;
        if (n > 0 && (n == (size_t)s->cfg.max_seqs || tokens + sent > SCHEDULER_ANNOUNCE_TOKENS)) {
            if (!(whole = sched_send_events_msg(s, s->ev_ptrs, n, false)))
                break;
            n = tokens = 0;
        }
        Pagoda__Internal__TokenEvent *ev = &s->ev_msgs[n];
        announce_fill(ev, &s->ev_sampling[n], q);
        if (!announce) {
            ev->has_announce = ev->announce = 0;
            ev->tenant = NULL;
            ev->has_max_tokens = ev->has_ignore_eos = ev->has_client_request_id = 0;
            ev->has_logprobs_asked = ev->has_router_text = 0;
            ev->sampling = NULL;
            ev->n_prompt_token_ids = ev->n_stop_token_ids = 0;
            ev->has_strict_max_tokens = 0;
        }
        s->ev_ptrs[n] = ev;
        n++;
        tokens += sent;
        (*total)++;
    }
    free(newest.slots);
    return whole && ((!announce && n == 0) || sched_send_events_msg(s, s->ev_ptrs, n, announce));
}

/* RouterHello: announces every request held; an announcement not delivered whole is sent
 * again as one (sched_resend_to_router). */
static void on_router_hello(struct scheduler *s)
{
    sched_send_model_info(s);
    size_t total = 0;
    if (!send_held(s, true, &total))
        s->resend_announce = true;
    log_info("router hello: announced %zu requests", total);
}

/* After a message to the router was lost: the model's context (in case that was the message)
 * and everything held again, as an announcement when one was lost, until a resend goes through
 * whole. The first SCHEDULER_ROUTER_RESEND_MS after the last resend, then twice as long after
 * each resend that was lost too, up to SCHEDULER_ROUTER_RESEND_MAX_MS. */
void sched_resend_to_router(struct scheduler *s, int64_t now_ms)
{
    if (!s->router_behind || now_ms - s->router_resend_ms < s->router_resend_wait_ms)
        return;
    s->router_behind = false;
    s->router_resend_ms = now_ms;
    s->stats.router_resends++;
    size_t total = 0;
    bool whole = sched_send_model_info(s) && send_held(s, s->resend_announce, &total);
    if (whole) {
        s->resend_announce = false;
        s->router_resend_wait_ms = SCHEDULER_ROUTER_RESEND_MS;
        log_warn("messages to the router were lost: %zu requests sent again from offset 0", total);
        return;
    }
    s->router_behind = true;
    if (s->router_resend_wait_ms < SCHEDULER_ROUTER_RESEND_MAX_MS)
        s->router_resend_wait_ms *= 2;
    log_warn("messages to the router were lost, and so was their resend: again in %lld ms",
             (long long)s->router_resend_wait_ms);
}

void scheduler_on_router(struct scheduler *s, const Pagoda__Internal__ToScheduler *msg,
                         int64_t now_ms)
{
    if (msg == NULL) {
        s->stats.malformed_messages++;
        log_warn("router: malformed message");
        return;
    }
    switch (msg->msg_case) {
    case PAGODA__INTERNAL__TO_SCHEDULER__MSG_SUBMIT:
        on_submit(s, msg->submit);
        break;
    case PAGODA__INTERNAL__TO_SCHEDULER__MSG_CANCEL:
        on_cancel(s, msg->cancel);
        break;
    case PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS:
        on_stats_request(s, msg->stats);
        return;
    case PAGODA__INTERNAL__TO_SCHEDULER__MSG_ROUTER_HELLO:
        on_router_hello(s);
        return;
    case PAGODA__INTERNAL__TO_SCHEDULER__MSG_POLICY:
        sched_on_policy(s, msg->policy);
        break;
    case PAGODA__INTERNAL__TO_SCHEDULER__MSG_ADMIN:
        sched_on_admin(s, msg->admin);
        return;
    default:
        s->stats.malformed_messages++;
        log_warn("router: unexpected message (case %d)", (int)msg->msg_case);
        return;
    }
    sched_try_step(s, now_ms);
}