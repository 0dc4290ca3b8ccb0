#include "scheduler/scheduler.h"

#include "common/error.h"
#include "common/log.h"
#include "kernels/cpu/logit_bias.h"
#include "kernels/cpu/sampler.h"
#include "scheduler/block_manager.h"
#include "scheduler/scheduler_impl.h"
#include "wire/wire.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

/* ---- helpers -------------------------------------------------------------------------------- */

uint64_t sched_cpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void sched_charge_cpu(struct scheduler *s, uint64_t start_ns)
{
    s->step_cpu_ns += sched_cpu_now_ns() - start_ns;
}

/* Request ids may be a client's own (one default tenant), so buckets come from a keyed hash:
 * nobody can choose ids that pile into one bucket. */
uint64_t sched_request_hash(const struct scheduler *s, const uint8_t *id)
{
    return XXH3_64bits_withSeed(id, SCHEDULER_REQUEST_ID_BYTES, s->hash_seed);
}

static uint32_t req_bucket(const struct scheduler *s, const uint8_t *id)
{
    return (uint32_t)(sched_request_hash(s, id) & s->bucket_mask);
}

static uint32_t id_bucket(const struct scheduler *s, uint64_t seq_id)
{
    return (uint32_t)(XXH3_64bits_withSeed(&seq_id, sizeof(seq_id), s->hash_seed) & s->bucket_mask);
}

struct seq *sched_find_request(const struct scheduler *s, const uint8_t *id)
{
    for (struct seq *q = s->req_buckets[req_bucket(s, id)]; q; q = q->req_next)
        if (memcmp(q->request_id, id, SCHEDULER_REQUEST_ID_BYTES) == 0)
            return q;
    return NULL;
}

static struct seq *find_seq_id(const struct scheduler *s, uint64_t seq_id)
{
    if (seq_id == 0)
        return NULL;
    for (struct seq *q = s->id_buckets[id_bucket(s, seq_id)]; q; q = q->id_next)
        if (q->seq_id == seq_id)
            return q;
    return NULL;
}

void sched_hash_request(struct scheduler *s, struct seq *q)
{
    uint32_t b = req_bucket(s, q->request_id);
    q->req_next = s->req_buckets[b];
    s->req_buckets[b] = q;
}

static void unhash_request(struct scheduler *s, struct seq *q)
{
    struct seq **p = &s->req_buckets[req_bucket(s, q->request_id)];
    while (*p && *p != q)
        p = &(*p)->req_next;
    if (*p)
        *p = q->req_next;
}

void sched_hash_seq_id(struct scheduler *s, struct seq *q)
{
    uint32_t b = id_bucket(s, q->seq_id);
    q->id_next = s->id_buckets[b];
    s->id_buckets[b] = q;
}

static void unhash_seq_id(struct scheduler *s, struct seq *q)
{
    if (q->seq_id == 0)
        return;
    struct seq **p = &s->id_buckets[id_bucket(s, q->seq_id)];
    while (*p && *p != q)
        p = &(*p)->id_next;
    if (*p)
        *p = q->id_next;
    q->seq_id = 0;
}

void sched_seq_free(struct seq *q)
{
    if (q == NULL)
        return;
    block_table_fini(&q->table);
    free(q->tokens);
    free(q->logprobs);
    free(q->tenant);
    free(q->router_text);
    logit_bias_fini(&q->bias);
    free(q->entries);
    free(q->keys);
    free(q->error_text);
    free(q);
}

struct seq *sched_seq_new(const int32_t *tokens, int32_t n, int32_t more)
{
    struct seq *q = calloc(1, sizeof(*q));
    int32_t cap = 16;
    while (cap < n + more + 1)
        cap *= 2;
    if (q == NULL || (q->tokens = malloc((size_t)cap * sizeof(int32_t))) == NULL ||
        (q->logprobs = calloc((size_t)cap, sizeof(float))) == NULL) {
        if (q != NULL)
            free(q->tokens);
        free(q);
        return NULL;
    }
    q->cap_tokens = cap;
    if (n > 0)
        memcpy(q->tokens, tokens, (size_t)n * sizeof(int32_t));
    q->num_tokens = q->num_prompt_tokens = n;
    q->sampling = sampling_params_default();
    q->state = SEQ_WAITING;
    q->plan_index = -1;
    block_table_init(&q->table);
    return q;
}

/* Adds id to l; when l is full, the next step is replaced by a resync (whose snapshot says
 * everything the list would have). */
static void id_list_push(struct scheduler *s, struct id_list *l, uint64_t id)
{
    if (l->count == l->cap) {
        s->need_resync = true;
        return;
    }
    l->ids[l->count++] = id;
}

/* The most tokens a sequence may hold while `pinned` blocks are pinned: the model's positions
 * and the pool less those blocks. */
int64_t sched_context_with_pins(const struct scheduler *s, int32_t pinned)
{
    int64_t pool = (int64_t)(block_manager_usable(s->bm) - pinned) * s->block_size;
    int64_t limit = s->worker.max_positions > 0 ? s->worker.max_positions : pool;
    return limit < pool ? limit : pool;
}

/* The most tokens a sequence may hold now: the model's positions and the pool less its pinned
 * blocks (which no sequence can take). */
int64_t sched_context_limit(const struct scheduler *s)
{
    return sched_context_with_pins(s, (int32_t)prefix_cache_pinned_blocks(s->pc));
}

/* The step in flight i places after the oldest (i < num_steps). */
struct step_rec *sched_step_at(struct worker_link *w, uint32_t i)
{
    return &w->steps[(w->step_head + i) % SCHEDULER_MAX_STEPS_IN_FLIGHT];
}

/* Forgets q's parts of the steps in flight: it continues from what was acknowledged. */
void sched_seq_clear_inflight(struct seq *q)
{
    q->num_inflight = 0;
    q->pending_samples = 0;
    q->num_scheduled = q->num_computed;
}

/* Whether q's oldest part in flight belongs to step_id. */
static bool seq_in_step(const struct seq *q, uint64_t step_id)
{
    return q->num_inflight > 0 && q->inflight[0].step_id == step_id;
}

int sched_check_inflight(const struct scheduler *s, const char **why)
{
    const struct worker_link *w = &s->worker;
    for (const struct seq *q = s->running.head; q; q = q->next) {
        int32_t tokens = 0, samples = 0;
        uint32_t k = 0; /* the next step in flight q's part may belong to */
        for (int32_t i = 0; i < q->num_inflight; i++) {
            const struct seq_inflight *part = &q->inflight[i];
            while (k < w->num_steps &&
                   w->steps[(w->step_head + k) % SCHEDULER_MAX_STEPS_IN_FLIGHT].step_id !=
                       part->step_id)
                k++;
            if (k == w->num_steps || part->num_new < 1) {
                *why = "a sequence's part in flight names no step in flight, or is out of order";
                return -1;
            }
            k++;
            tokens += part->num_new;
            samples += part->samples;
        }
        if (q->num_scheduled != q->num_computed + tokens || q->pending_samples != samples ||
            q->num_scheduled > q->num_tokens + samples ||
            (int64_t)q->table.num_blocks * s->block_size < q->num_scheduled) {
            *why = "a sequence's scheduled tokens, pending samples or table disagree with its "
                   "parts in flight";
            return -1;
        }
    }
    return 0;
}

/* ---- messages out --------------------------------------------------------------------------- */

void sched_send_worker(struct scheduler *s, uint32_t worker_id, Pagoda__Internal__ToWorker *m)
{
    m->has_protocol_version = 1;
    m->protocol_version = WIRE_PROTOCOL_VERSION;
    s->io.to_worker(s->io.ctx, worker_id, m);
}

static void send_supervisor(struct scheduler *s, Pagoda__Internal__Control *ctl)
{
    ctl->has_protocol_version = 1;
    ctl->protocol_version = WIRE_PROTOCOL_VERSION;
    ctl->sender = "scheduler";
    s->io.to_supervisor(s->io.ctx, ctl);
}

bool sched_send_router(struct scheduler *s, Pagoda__Internal__ToRouter *m)
{
    m->has_protocol_version = 1;
    m->protocol_version = WIRE_PROTOCOL_VERSION;
    m->has_epoch = 1;
    m->epoch = s->cfg.epoch;
    if (s->io.to_router(s->io.ctx, m) != 0) {
        s->stats.router_drops++;
        s->router_behind = true;
        return false;
    }
    return true;
}

/* Sends n events in one message; announce_done marks the last message of an announcement.
 * Returns false when the message was lost. */
bool sched_send_events_msg(struct scheduler *s, Pagoda__Internal__TokenEvent **events, size_t n,
                           bool announce_done)
{
    Pagoda__Internal__TokenEvents evs = PAGODA__INTERNAL__TOKEN_EVENTS__INIT;
    evs.n_events = n;
    evs.events = events;
    evs.has_announce_done = announce_done;
    evs.announce_done = announce_done;
    Pagoda__Internal__ToRouter m = PAGODA__INTERNAL__TO_ROUTER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS;
    m.events = &evs;
    return sched_send_router(s, &m);
}

/* Tells the router the model's context (it sizes its prompt and message limits from it), once a
 * worker has said it. Returns false when the message was lost. */
bool sched_send_model_info(struct scheduler *s)
{
    if (s->worker.max_positions <= 0)
        return true;
    Pagoda__Internal__ModelInfo info = PAGODA__INTERNAL__MODEL_INFO__INIT;
    info.has_max_position_embeddings = 1;
    info.max_position_embeddings = s->worker.max_positions;
    info.has_block_size = s->block_size > 0;
    info.block_size = (uint32_t)s->block_size;
    Pagoda__Internal__ToRouter m = PAGODA__INTERNAL__TO_ROUTER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_MODEL;
    m.model = &info;
    return sched_send_router(s, &m);
}

static void send_events(struct scheduler *s, Pagoda__Internal__TokenEvent **events, size_t n)
{
    if (n > 0)
        sched_send_events_msg(s, events, n, false);
}

/* Sends one event that ends a request: reason, with error (0 or a PAGODA_E* code and a
 * message) and no tokens. id is echoed as given (any length). */
void sched_send_end(struct scheduler *s, const uint8_t *id, size_t id_len, uint32_t offset,
                    uint32_t prompt_tokens, Pagoda__Internal__FinishReason reason, int error,
                    const char *message)
{
    Pagoda__Internal__TokenEvent ev = PAGODA__INTERNAL__TOKEN_EVENT__INIT;
    if (id != NULL) {
        ev.has_request_id = 1;
        ev.request_id.data = (uint8_t *)id;
        ev.request_id.len = id_len;
    }
    ev.has_offset = 1;
    ev.offset = offset;
    ev.has_finish_reason = 1;
    ev.finish_reason = reason;
    ev.has_prompt_tokens = 1;
    ev.prompt_tokens = prompt_tokens;
    if (error != 0) {
        ev.has_error_code = 1;
        ev.error_code = error;
        ev.error_message = (char *)message;
    }
    Pagoda__Internal__TokenEvent *p = &ev;
    send_events(s, &p, 1);
}

void sched_send_error(struct scheduler *s, const uint8_t *id, size_t id_len, int error,
                      const char *message)
{
    char hex[2 * SCHEDULER_REQUEST_ID_BYTES + 1] = "";
    for (size_t i = 0; id && i < id_len && i < SCHEDULER_REQUEST_ID_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", id[i]);
    log_warn("request %s refused: %s", hex, message);
    s->stats.rejected_requests++;
    sched_send_end(s, id, id_len, 0, 0, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR, error,
                   message);
}

/* ---- ending sequences ----------------------------------------------------------------------- */

/* Takes q out of its list and the tables. Its blocks are fenced on the last step sent; a worker
 * that knows it hears of it in the next step's finished_seq_ids. */
static void seq_detach(struct scheduler *s, struct seq *q)
{
    if (q->state == SEQ_RUNNING) {
        list_remove(&s->running, q);
        if (q->owner)
            q->owner->running--;
        if (q->worker_knows)
            id_list_push(s, &s->pending_finished, q->seq_id);
        sched_seq_release_blocks(s, q);
        unhash_seq_id(s, q);
    } else {
        waiting_remove(s, q);
    }
    unhash_request(s, q);
}

/* Removes q from its list and the tables and frees it. */
void sched_seq_remove(struct scheduler *s, struct seq *q)
{
    seq_detach(s, q);
    sched_seq_free(q);
}

/* Keeps q, which ended and is in no list, at the end of list l (the recent list, or the refused
 * list for a refusal at submission), dropping l's oldest beyond keep, or beyond keep_behind while
 * a message to the router is lost and not yet made good (their ends may be among what it held).
 * Its tokens, not its blocks: a router that restarts before it heard the end learns it from the
 * announcement, one whose event was lost from the resend. */
void sched_ended_push(struct scheduler *s, struct seq_list *l, struct seq *q, uint32_t keep,
                      uint32_t keep_behind)
{
    q->state = SEQ_WAITING;
    q->end_order = ++s->end_count;
    list_push_back(l, q);
    const uint32_t limit = s->router_behind ? keep_behind : keep;
    while (l->count > limit) {
        struct seq *old = l->head;
        list_remove(l, old);
        sched_seq_free(old);
    }
}

static void recent_push(struct scheduler *s, struct seq *q)
{
    sched_ended_push(s, &s->recent, q, SCHEDULER_MAX_RECENT_ENDED, SCHEDULER_MAX_RECENT_BEHIND);
}

/* Like sched_seq_remove, but keeps the removed sequence in the recent list (recent_push). */
static void seq_retire(struct scheduler *s, struct seq *q)
{
    seq_detach(s, q);
    recent_push(s, q);
}

/* Sets q's end to FINISH_ERROR with error and (a copy of) message, for the recent list. */
void sched_seq_set_error(struct seq *q, int error, const char *message)
{
    q->finish_reason = PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR;
    q->error_code = error;
    free(q->error_text);
    q->error_text = strndup(message, SCHEDULER_ERROR_MESSAGE_MAX - 1);
    q->error_message = q->error_text != NULL ? q->error_text : "refused";
}

/* A request that ended (finished, cancelled, or out of memory) with reason. */
void sched_seq_end(struct scheduler *s, struct seq *q, Pagoda__Internal__FinishReason reason,
                   int32_t error_code, const char *error_message)
{
    if (q->pin != NULL) {
        sched_pin_seq_ended(s, q, reason != PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR,
                            error_code, error_message);
        sched_seq_remove(s, q);
        return;
    }
    s->stats.finished_requests++;
    q->finish_reason = reason;
    q->error_code = error_code;
    q->error_message = error_message;
    seq_retire(s, q);
}

/* Ends q with an error event (a request found unfit at admission). */
void sched_seq_refuse(struct scheduler *s, struct seq *q, int error, const char *message)
{
    if (q->pin != NULL) {
        sched_pin_seq_ended(s, q, false, error, message);
        sched_seq_remove(s, q);
        return;
    }
    sched_send_error(s, q->request_id, SCHEDULER_REQUEST_ID_BYTES, error, message);
    /* Kept with its error like any ended request, so that an announcement or a resend after a
     * lost message tells a router. */
    sched_seq_set_error(q, error, message);
    seq_retire(s, q);
}

/* Ends q with FINISH_ERROR because of an error of its own that a worker reported (code, message,
 * copied): its client gets the error, the rest of the step goes on. */
static void seq_fail(struct scheduler *s, struct seq *q, int32_t code, const char *message)
{
    char hex[2 * SCHEDULER_REQUEST_ID_BYTES + 1] = "";
    for (size_t i = 0; i < SCHEDULER_REQUEST_ID_BYTES; i++)
        snprintf(hex + 2 * i, 3, "%02x", q->request_id[i]);
    const char *why = message != NULL && message[0] != '\0' ? message : pagoda_strerror(code);
    log_warn("request %s (seq %llu) failed in the worker: %s", hex, (unsigned long long)q->seq_id,
             why);
    s->stats.failed_seqs++;
    free(q->error_text);
    q->error_text = strndup(why, SCHEDULER_ERROR_MESSAGE_MAX - 1);
    const char *kept = q->error_text != NULL ? q->error_text : "the worker failed the request";
    if (q->pin == NULL)
        sched_send_end(s, q->request_id, SCHEDULER_REQUEST_ID_BYTES,
                       (uint32_t)(q->num_tokens - q->num_prompt_tokens),
                       (uint32_t)q->num_prompt_tokens,
                       PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR, code, kept);
    sched_seq_end(s, q, PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR, code, kept);
}

/* Releases a running sequence's blocks and requeues it at the front to recompute everything it
 * knows. */
void sched_seq_preempt(struct scheduler *s, struct seq *v)
{
    if (v->plan_index >= 0) {
        struct plan_entry *e = &s->plan[v->plan_index];
        s->budget += e->num_new;
        e->seq = NULL;
        v->plan_index = -1;
    }
    if (v->worker_knows)
        id_list_push(s, &s->pending_preempted, v->seq_id);
    sched_seq_release_blocks(s, v);
    if (v->owner)
        v->owner->running--;
    log_debug("preempting seq %llu (%d tokens)", (unsigned long long)v->seq_id, (int)v->num_tokens);
    unhash_seq_id(s, v);
    v->num_computed = 0;
    sched_seq_clear_inflight(v);
    v->worker_knows = false;
    v->blocks_sent = 0;
    list_remove(&s->running, v);
    v->state = SEQ_WAITING;
    waiting_push(s, v, true);
    s->stats.preemptions++;
    s->preempted_now = true;
}

/* The result timeout in force for the current worker process. */
static int64_t result_timeout(const struct scheduler *s)
{
    return (int64_t)s->cfg.result_timeout_ms << s->worker.timeout_backoff;
}

/* The time a step of num_tokens tokens may take once the worker could start it: the result
 * timeout plus step_timeout_per_token_us per token, doubled as the result timeout is. */
static int64_t step_timeout(const struct scheduler *s, int64_t num_tokens)
{
    int64_t extra = (int64_t)s->cfg.step_timeout_per_token_us * num_tokens / 1000;
    return ((int64_t)s->cfg.result_timeout_ms + extra) << s->worker.timeout_backoff;
}

/* The silence the watchdog allows while the worker owes the answer to a step of num_tokens. */
static int64_t watchdog_timeout(const struct scheduler *s, int64_t num_tokens)
{
    return (int64_t)s->cfg.watchdog_ms +
           (int64_t)s->cfg.step_timeout_per_token_us * num_tokens / 1000;
}

/* ---- resync --------------------------------------------------------------------------------- */

void sched_owe_from(struct worker_link *w, int64_t now_ms)
{
    if (w->state != LINK_STEP && w->state != LINK_RESYNCING)
        w->owes_since_ms = now_ms;
}

/* Forgets the steps in flight: their results, if any come, are ignored, and their tokens are
 * computed again by later steps. */
static void discard_inflight(struct scheduler *s)
{
    struct worker_link *w = &s->worker;
    for (struct seq *q = s->running.head; q; q = q->next)
        sched_seq_clear_inflight(q);
    w->num_steps = 0;
    w->step_head = 0;
}

/* Sends a resync to the worker: discards the step in flight and snapshots every running
 * sequence as acknowledged. announce: the empty resync sent before any Hello. A resync other
 * than an announcement names the pool its block ids refer to. */
void sched_send_resync(struct scheduler *s, int64_t now_ms, bool announce)
{
    struct worker_link *w = &s->worker;
    discard_inflight(s);
    s->pending_finished.count = 0;
    s->pending_preempted.count = 0;
    s->need_resync = false;

    Pagoda__Internal__Resync r = PAGODA__INTERNAL__RESYNC__INIT;
    r.has_epoch = r.has_resync_id = r.has_next_step_id = 1;
    r.epoch = s->cfg.epoch;
    r.resync_id = ++w->resync_id;
    r.next_step_id = s->last_step_id + 1;
    size_t n = 0;
    if (!announce) {
        r.has_pool_id = 1;
        r.pool_id = s->cfg.geometry.pool_id;
        for (struct seq *q = s->running.head; q; q = q->next, n++) {
            Pagoda__Internal__SequenceSnapshot *m = &s->snap_msgs[n];
            pagoda__internal__sequence_snapshot__init(m);
            SCHED_FILL_SEQ_STATE(s, m, q, &s->sp_msgs[n]);
            s->snap_ptrs[n] = m;
            q->worker_knows = true;
            q->blocks_sent = q->table.num_blocks;
        }
    }
    r.n_seqs = n;
    r.seqs = s->snap_ptrs;
    Pagoda__Internal__ToWorker m = PAGODA__INTERNAL__TO_WORKER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC;
    m.resync = &r;
    w->resync_next_step = r.next_step_id;
    if (announce) {
        w->announced = true;
        w->announce_ms = now_ms;
    } else {
        sched_owe_from(w, now_ms);
        w->state = LINK_RESYNCING;
        w->resync_sent_ms = now_ms;
        s->stats.resyncs++;
        log_info("resync %llu to worker 0: %zu sequences, next step %llu",
                 (unsigned long long)r.resync_id, n, (unsigned long long)r.next_step_id);
    }
    sched_send_worker(s, 0, &m);
}

/* ---- isolating a refused step --------------------------------------------------------------- */

/* Whether q may run in the step being formed: anything when not isolating, else only the probe
 * (the first probe_len suspects). */
bool sched_isolation_may_run(const struct scheduler *s, const struct seq *q)
{
    const struct worker_link *w = &s->worker;
    if (!w->isolating)
        return true;
    for (uint32_t i = 0; i < w->probe_len; i++)
        if (w->suspects[i] == q->seq_id)
            return true;
    return false;
}

void sched_isolation_end(struct scheduler *s, const char *why)
{
    struct worker_link *w = &s->worker;
    if (w->isolating)
        log_info("isolation of a refused step ends: %s", why);
    w->isolating = false;
    w->num_suspects = w->probe_len = 0;
}

/* Before a step is formed while isolating: forgets suspects that no longer run (ended,
 * cancelled, preempted: a preempted sequence comes back with another seq_id) and picks the
 * probe again. */
void sched_isolation_prune(struct scheduler *s)
{
    struct worker_link *w = &s->worker;
    if (!w->isolating)
        return;
    uint32_t kept = 0, probe = 0;
    for (uint32_t i = 0; i < w->num_suspects; i++) {
        if (find_seq_id(s, w->suspects[i]) == NULL)
            continue;
        probe += i < w->probe_len;
        w->suspects[kept++] = w->suspects[i];
    }
    w->num_suspects = kept;
    w->probe_len = probe > 0 ? probe : (kept + 1) / 2;
    if (kept == 0)
        sched_isolation_end(s, "no suspect runs any more");
}

/* A step was accepted: when it was a probe, its sequences are cleared and the rest remain. */
static void isolation_step_accepted(struct scheduler *s)
{
    struct worker_link *w = &s->worker;
    if (!w->isolating)
        return;
    uint32_t rest = w->num_suspects - w->probe_len;
    memmove(w->suspects, w->suspects + w->probe_len, rest * sizeof(*w->suspects));
    w->num_suspects = rest;
    w->probe_len = (rest + 1) / 2;
    if (rest == 0)
        sched_isolation_end(s, "every suspect ran");
}

/* The step in flight was refused. Right after a resync (fresh), or while isolating, its
 * sequences become the suspects; a lone suspect refused right after a resync is the culprit and
 * fails. Otherwise (the first refusal since steps were accepted) the resync alone is the
 * remedy: the mirror may simply have diverged. */
static void isolation_step_refused(struct scheduler *s, const Pagoda__Internal__StepResult *r)
{
    struct worker_link *w = &s->worker;
    if (!w->fresh && !w->isolating)
        return;
    const struct step_rec *rec = sched_step_at(w, 0);
    uint32_t n = 0;
    for (uint32_t i = 0; i < rec->num_seqs; i++)
        if (find_seq_id(s, rec->seq_ids[i]) != NULL)
            w->suspects[n++] = rec->seq_ids[i];
    w->num_suspects = n;
    if (n == 0) {
        sched_isolation_end(s, "the refused step's sequences are gone");
        return;
    }
    if (n == 1 && w->fresh) {
        struct seq *q = find_seq_id(s, w->suspects[0]);
        log_warn("worker 0 refused step %llu right after a resync, and seq %llu alone: failing it",
                 (unsigned long long)r->step_id, (unsigned long long)q->seq_id);
        s->stats.isolated_seqs++;
        sched_seq_clear_inflight(q);
        seq_fail(s, q, r->error_code,
                 r->error_message != NULL ? r->error_message : "the worker refused its steps");
        sched_isolation_end(s, "the culprit failed");
        return;
    }
    if (!w->isolating)
        log_warn("worker 0 refused step %llu right after a resync: isolating the culprit among "
                 "its %u sequences",
                 (unsigned long long)r->step_id, n);
    w->isolating = true;
    /* Not fresh: the probe is tried again as it is after the resync before anything fails. */
    w->probe_len = w->fresh ? (n + 1) / 2 : n;
}

/* ---- results -------------------------------------------------------------------------------- */

void sched_fill_sampling(const struct scheduler *s, struct seq *q,
                         Pagoda__Internal__SamplingParams *sp)
{
    *sp = sampling_to_internal(&q->sampling);
    logit_bias_to_internal(&q->bias, sp);
    q->num_suppress = 0;
    if (q->sampling.min_tokens <= 0)
        return;
    /* an id outside the worker's vocabulary is left out (the mirror would refuse it) */
    _Static_assert(SCHEDULER_MAX_EOS_IDS + SCHEDULER_MAX_STOP_IDS <= SAMPLING_SUPPRESS_MAX,
                   "min_tokens suppresses every EOS and stop id");
    q->num_suppress = stop_ids_suppressed(s->worker.eos_ids, s->worker.num_eos, q->stop_ids,
                                          q->num_stop_ids, s->worker.vocab_size, q->suppress);
    sp->n_min_tokens_stop_ids = (size_t)q->num_suppress;
    sp->min_tokens_stop_ids = q->suppress;
}

/* The finish reason for q after its newest token, or FINISH_NONE. A token within the first
 * min_tokens of the output is not a stop (the worker suppressed the stop ids there). */
static Pagoda__Internal__FinishReason stop_reason(const struct scheduler *s, const struct seq *q)
{
    if (stop_token_ends(q->tokens[q->num_tokens - 1], q->num_tokens - q->num_prompt_tokens,
                        q->sampling.min_tokens, q->ignore_eos, s->worker.eos_ids, s->worker.num_eos,
                        q->stop_ids, q->num_stop_ids))
        return PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP;
    if (q->max_tokens > 0 && q->num_tokens - q->num_prompt_tokens >= q->max_tokens)
        return PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH;
    if ((int64_t)q->num_tokens >= sched_context_limit(s))
        return PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH;
    return PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE;
}

static int append_token(struct seq *q, int32_t token, float logprob)
{
    if (q->num_tokens == q->cap_tokens) {
        int32_t cap = q->cap_tokens * 2;
        int32_t *t = realloc(q->tokens, (size_t)cap * sizeof(*t));
        if (t == NULL)
            return PAGODA_ENOMEM;
        q->tokens = t;
        float *l = realloc(q->logprobs, (size_t)cap * sizeof(*l));
        if (l == NULL)
            return PAGODA_ENOMEM; /* tokens grew: harmless, cap_tokens stays */
        q->logprobs = l;
        q->cap_tokens = cap;
    }
    q->logprobs[q->num_tokens] = logprob;
    q->tokens[q->num_tokens++] = token;
    return 0;
}

static void clear_results(struct scheduler *s, const Pagoda__Internal__StepResult *r)
{
    for (size_t i = 0; i < r->n_results; i++) {
        struct seq *q = find_seq_id(s, r->results[i]->seq_id);
        if (q != NULL) {
            q->has_result = false;
            q->result_error = 0;
        }
    }
}

/* Checks a result of the oldest step in flight against it: one token per sequence that samples
 * in it (those ended or preempted meanwhile aside), none for others, each inside the
 * vocabulary. Marks each sequence's token. Returns 0 or -1 with a reason in why. */
static int check_result(struct scheduler *s, const Pagoda__Internal__StepResult *r,
                        const char **why)
{
    for (size_t i = 0; i < r->n_results; i++) {
        const Pagoda__Internal__SeqResult *res = r->results[i];
        bool failed = res->has_error_code && res->error_code != 0;
        if (!res->has_seq_id || (!failed && !res->has_token_id)) {
            *why = "a result without seq_id or token_id";
            return -1;
        }
        struct seq *q = find_seq_id(s, res->seq_id);
        if (q == NULL)
            continue; /* cancelled while the step ran */
        if (failed) {
            /* Any sequence of the step may fail, sampling or not. */
            if (!seq_in_step(q, r->step_id) || q->has_result) {
                *why = "an error for a sequence not in the step, or two results";
                return -1;
            }
            q->has_result = true;
            q->result_error = res->error_code;
            q->result_error_message = res->error_message;
            continue;
        }
        if (!seq_in_step(q, r->step_id) || !q->inflight[0].samples || q->has_result) {
            *why = "a token for a sequence that did not sample, or two";
            return -1;
        }
        if (res->token_id < 0 || res->token_id >= s->worker.vocab_size) {
            *why = "a token outside the vocabulary";
            return -1;
        }
        q->has_result = true;
        q->result_error = 0;
        q->result_token = res->token_id;
        q->result_logprob = res->has_logprob ? res->logprob : 0.0f;
    }
    const struct step_rec *rec = sched_step_at(&s->worker, 0);
    for (uint32_t i = 0; i < rec->num_seqs; i++) {
        struct seq *q = find_seq_id(s, rec->seq_ids[i]);
        if (q != NULL && seq_in_step(q, rec->step_id) && q->inflight[0].samples && !q->has_result) {
            *why = "no token for a sequence that sampled";
            return -1;
        }
    }
    return 0;
}

/* Counts q's num_new tokens of the acknowledged step as decode (one token after all the known
 * ones but the last, which q sampled) or prefill (scheduler_stats). */
static void count_work(struct scheduler *s, const struct seq *q, int32_t num_new)
{
    if (num_new == 1 && q->num_computed + 1 == q->num_tokens &&
        q->num_tokens > q->num_prompt_tokens)
        s->stats.decode_tokens++;
    else
        s->stats.prefill_tokens += (uint64_t)num_new;
}

/* A sum of step times in microseconds as a counter: rounded, and held at 2^62 (not reached by
 * times of at most SCHEDULER_STEP_US_MAX in any life of a scheduler, but llround's range is
 * not to be left). */
uint64_t sched_us_counter(double sum)
{
    return sum < 0x1p62 ? (uint64_t)llround(sum) : (uint64_t)1 << 62;
}

/* Applies the result of the oldest step in flight (checked by check_result): tokens to the
 * router, stop conditions, the step's blocks acknowledged. Then the next step may go out. */
static void apply_result(struct scheduler *s, const Pagoda__Internal__StepResult *r, int64_t now_ms)
{
    struct worker_link *w = &s->worker;
    struct step_rec *rec = sched_step_at(w, 0);
    block_manager_ack(s->bm, r->step_id);
    if (r->has_computed_tokens)
        s->stats.computed_tokens = r->computed_tokens;
    if (r->has_steps_run && r->steps_run > 0) {
        s->stats.worker_step_wall_us = r->wall_us_total / (double)r->steps_run;
        s->stats.worker_step_device_us = r->device_us_total / (double)r->steps_run;
    }
    /* A step's times count when they are times (a peer may send anything: NaN, negative, or
     * values whose sums would leave uint64 microseconds). */
    if (r->has_step_wall_us && r->has_step_device_us && r->step_wall_us >= 0 &&
        r->step_device_us >= 0 && r->step_wall_us <= SCHEDULER_STEP_US_MAX &&
        r->step_device_us <= SCHEDULER_STEP_US_MAX) {
        s->stats.worker_steps_timed++;
        s->stats.worker_step_wall_us_sum += r->step_wall_us;
        s->stats.worker_step_device_us_sum += r->step_device_us;
    }
    w->fresh = false;
    isolation_step_accepted(s);
    /* Tokens of sequences that ended (a stop found in an earlier step's result, a cancel) or were
     * preempted after the step was sent: computed for nothing, told to nobody. */
    for (size_t i = 0; i < r->n_results; i++) {
        const Pagoda__Internal__SeqResult *res = r->results[i];
        if (res->has_token_id && !(res->has_error_code && res->error_code != 0) &&
            find_seq_id(s, res->seq_id) == NULL)
            s->stats.discarded_tokens++;
    }
    size_t n_ev = 0;
    for (uint32_t i = 0; i < rec->num_seqs; i++) {
        struct seq *q = find_seq_id(s, rec->seq_ids[i]);
        if (q == NULL || !seq_in_step(q, rec->step_id))
            continue;
        struct seq_inflight part = q->inflight[0];
        q->num_inflight--;
        memmove(q->inflight, q->inflight + 1, (size_t)q->num_inflight * sizeof(*q->inflight));
        if (q->has_result && q->result_error != 0) {
            /* The worker failed it: nothing of this step counts for it, and it ends (a later
             * step in flight that holds it is answered for nothing). */
            sched_seq_clear_inflight(q);
            q->has_result = false;
            seq_fail(s, q, q->result_error, q->result_error_message);
            continue;
        }
        count_work(s, q, part.num_new);
        q->num_computed += part.num_new;
        sched_cache_publish(s, q);
        if (!part.samples)
            continue;
        q->pending_samples--;
        q->has_result = false;
        uint32_t offset = (uint32_t)(q->num_tokens - q->num_prompt_tokens);
        struct event_slot *slot = &s->ev_slots[n_ev];
        Pagoda__Internal__TokenEvent *ev = &s->ev_msgs[n_ev];
        pagoda__internal__token_event__init(ev);
        memcpy(slot->request_id, q->request_id, SCHEDULER_REQUEST_ID_BYTES);
        slot->token = q->result_token;
        slot->logprob = q->result_logprob;
        ev->has_request_id = 1;
        ev->request_id.data = slot->request_id;
        ev->request_id.len = SCHEDULER_REQUEST_ID_BYTES;
        ev->has_offset = 1;
        ev->offset = offset;
        ev->n_token_ids = 1;
        ev->token_ids = &slot->token;
        ev->n_logprobs = 1;
        ev->logprobs = &slot->logprob;
        ev->has_prompt_tokens = ev->has_cached_tokens = 1;
        ev->prompt_tokens = (uint32_t)q->num_prompt_tokens;
        ev->cached_tokens = q->cached_tokens;
        if (q->pin == NULL) /* a pin's own sequence tells nobody */
            s->ev_ptrs[n_ev++] = ev;
        Pagoda__Internal__FinishReason reason;
        if (append_token(q, q->result_token, q->result_logprob) != 0) {
            ev->has_error_code = 1;
            ev->error_code = PAGODA_ENOMEM;
            ev->error_message = "out of memory for the sequence's tokens";
            reason = PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR;
        } else {
            reason = stop_reason(s, q);
        }
        if (reason != PAGODA__INTERNAL__FINISH_REASON__FINISH_NONE) {
            ev->has_finish_reason = 1;
            ev->finish_reason = reason;
            sched_seq_end(s, q, reason, ev->has_error_code ? ev->error_code : 0, ev->error_message);
        }
    }
    send_events(s, s->ev_ptrs, n_ev);
    w->step_head = (w->step_head + 1) % SCHEDULER_MAX_STEPS_IN_FLIGHT;
    w->num_steps--;
    if (w->num_steps == 0)
        w->state = LINK_IDLE;
    else
        sched_step_at(w, 0)->start_ms = now_ms; /* the worker starts the next one now */
    sched_try_step(s, now_ms);
}

static void on_step_result(struct scheduler *s, const Pagoda__Internal__StepResult *r,
                           int64_t now_ms)
{
    struct worker_link *w = &s->worker;
    if (r->epoch != s->cfg.epoch || w->state == LINK_NEED_HELLO || r->step_id == 0 ||
        r->step_id > s->last_step_id) {
        s->stats.ignored_messages++;
        return;
    }
    if (r->has_error_code && r->error_code != 0) {
        if (w->state == LINK_RESYNCING) {
            /* The resync on its way repairs it (with two steps in flight: the refused step's
             * follower, which the worker refuses for its step id). */
            s->stats.ignored_messages++;
            log_debug("worker 0 refused step %llu while a resync is on its way: %s (%d)",
                      (unsigned long long)r->step_id, r->error_message ? r->error_message : "",
                      (int)r->error_code);
            return;
        }
        s->stats.refused_steps++;
        log_warn("worker 0 refused step %llu: %s (%d)", (unsigned long long)r->step_id,
                 r->error_message ? r->error_message : "", (int)r->error_code);
        if (w->state == LINK_STEP && r->step_id == sched_step_at(w, 0)->step_id)
            isolation_step_refused(s, r);
        sched_send_resync(s, now_ms, false);
        return;
    }
    if (w->state != LINK_STEP || r->step_id < sched_step_at(w, 0)->step_id) {
        s->stats.ignored_messages++;
        if (r->step_id == w->timed_out_step) {
            w->timed_out_step = 0;
            if (w->timeout_backoff < SCHEDULER_MAX_TIMEOUT_BACKOFF)
                w->timeout_backoff++;
            log_warn("worker 0 answered step %llu %lld ms after its timeout: result timeout now "
                     "%lld ms",
                     (unsigned long long)r->step_id, (long long)(now_ms - w->timed_out_at_ms),
                     (long long)result_timeout(s));
        }
        return;
    }
    if (r->step_id != sched_step_at(w, 0)->step_id) {
        /* A later step's result first: the oldest one's was lost (or the worker skipped it). */
        s->stats.malformed_messages++;
        log_warn("worker 0: result of step %llu while step %llu's is missing; resync",
                 (unsigned long long)r->step_id, (unsigned long long)sched_step_at(w, 0)->step_id);
        sched_send_resync(s, now_ms, false);
        return;
    }
    uint64_t cpu0 = sched_cpu_now_ns();
    const char *why = NULL;
    if (check_result(s, r, &why) != 0) {
        clear_results(s, r);
        s->stats.malformed_messages++;
        log_warn("worker 0: result of step %llu breaks the protocol (%s); resync",
                 (unsigned long long)r->step_id, why);
        sched_send_resync(s, now_ms, false);
        sched_charge_cpu(s, cpu0);
        return;
    }
    apply_result(s, r, now_ms);
    sched_charge_cpu(s, cpu0);
}

/* ---- worker messages ------------------------------------------------------------------------ */

/* Why the Hello cannot be accepted, or NULL. The pool it names must have the block table's
 * geometry; its identity may differ (on_hello adopts the pool). */
static const char *hello_refusal(const struct scheduler *s, const Pagoda__Internal__Hello *h)
{
    const struct kv_geometry *g = &s->cfg.geometry;
    const Pagoda__Internal__PoolGeometry *pg = h->geometry;
    if (!h->has_max_position_embeddings || h->max_position_embeddings < 2 ||
        h->max_position_embeddings > SCHEDULER_MAX_POSITIONS)
        return "max_position_embeddings missing or out of range";
    if (!h->has_vocab_size || h->vocab_size < 1 || h->vocab_size > SCHEDULER_MAX_VOCAB)
        return "vocab_size missing or out of range";
    if (h->n_eos_token_ids > SCHEDULER_MAX_EOS_IDS)
        return "too many eos_token_ids";
    if (h->has_worker_id && h->worker_id != 0)
        return "worker_id differs from the link's";
    if (pg == NULL || !pg->has_pool_id || pg->pool_id == 0)
        return "it names no pool (geometry.pool_id)";
    /* The scheduler took kvpool's geometry at its start: a pool made since with other settings
     * (by hand: the supervisor restarts kvpool with the same arguments) needs it restarted too. */
    if (pg->has_num_blocks && pg->num_blocks != g->num_blocks)
        return "its pool's block count differs from kvpool's when the scheduler started";
    if (pg->has_block_size && pg->block_size != g->block_size)
        return "its pool's block size differs from kvpool's when the scheduler started";
    if (pg->has_num_layers && pg->num_layers != g->num_layers)
        return "its pool's layer count differs from kvpool's when the scheduler started";
    if (pg->has_dtype && (int)pg->dtype != (int)g->dtype)
        return "its pool's K/V dtype (--kv-cache-dtype) differs from kvpool's when the scheduler "
               "started";
    return NULL;
}

/* A refused Hello from another process than the accepted worker means that worker is gone
 * and the one on the link cannot be used: the step in flight is lost and nothing (no resync,
 * no step, no announcement) goes to the link until a Hello is accepted, so a refused worker
 * never answers a resync meant for its predecessor. A refused Hello from the accepted worker
 * itself changes nothing. */
static void refuse_hello(struct scheduler *s, int32_t pid, const char *why)
{
    struct worker_link *w = &s->worker;
    s->stats.malformed_messages++;
    s->stats.refused_hellos++;
    if (w->hello_seen && pid == w->pid) {
        log_error("worker 0 (pid %d): Hello refused and ignored: %s", (int)pid, why);
        return;
    }
    if (!w->refused || w->refused_pid != pid)
        log_error("worker 0 (pid %d): Hello refused: %s; nothing is sent to it until a Hello is "
                  "accepted",
                  (int)pid, why);
    else
        log_debug("worker 0 (pid %d): Hello refused again: %s", (int)pid, why);
    discard_inflight(s);
    w->state = LINK_NEED_HELLO;
    w->hello_seen = false;
    w->refused = true;
    w->refused_pid = pid;
}

/* The pool the worker mapped is not the one the block table describes (kvpool made a new
 * one): whatever the table says is in the pool is not. Every cached block is dropped (the
 * pins are computed again) and every running sequence goes back to the queue to recompute its
 * prompt and output so far, as a preemption does (greedy outputs are unchanged); then the new
 * pool is the table's. */
static void adopt_pool(struct scheduler *s, uint64_t pool_id)
{
    uint32_t running = s->running.count;
    uint32_t dropped = sched_cache_drop_all(s);
    while (s->running.tail != NULL)
        sched_seq_preempt(s, s->running.tail);
    log_warn("worker 0 maps pool %016llx, the block table describes pool %016llx: adopting the "
             "new pool; %u cached blocks dropped, %u running sequences recomputed",
             (unsigned long long)pool_id, (unsigned long long)s->cfg.geometry.pool_id, dropped,
             running);
    s->cfg.geometry.pool_id = pool_id;
    s->stats.pool_changes++;
}

static void on_hello(struct scheduler *s, const Pagoda__Internal__Hello *h, int64_t now_ms)
{
    struct worker_link *w = &s->worker;
    int32_t pid = h->has_pid ? h->pid : 0;
    const char *bad = hello_refusal(s, h);
    if (bad != NULL) {
        refuse_hello(s, pid, bad);
        return;
    }
    uint64_t pool_id = h->geometry->pool_id;
    bool same_pool = pool_id == s->cfg.geometry.pool_id;
    /* w->pid is the last accepted worker's, also while the link is detached by a refusal. */
    bool restart = (w->hello_seen || (w->refused && w->pid != 0)) && pid != w->pid;
    if (w->hello_seen && !restart && same_pool && w->state == LINK_RESYNCING)
        return; /* a repeat sent before our resync reached it */
    if (restart) {
        s->stats.worker_restarts++;
        w->timeout_backoff = 0;
    }
    log_info("worker 0 hello: pid %d, vocab %lld, %lld positions, pool %016llx%s", (int)pid,
             (long long)h->vocab_size, (long long)h->max_position_embeddings,
             (unsigned long long)pool_id, restart ? " (restarted)" : "");
    w->hello_seen = true;
    w->refused = false;
    w->no_hello_since_ms = 0;
    w->pid = pid;
    w->vocab_size = h->vocab_size;
    w->max_positions = h->max_position_embeddings;
    sched_send_model_info(s);
    w->num_eos = (int32_t)h->n_eos_token_ids;
    if (h->n_eos_token_ids > 0)
        memcpy(w->eos_ids, h->eos_token_ids, h->n_eos_token_ids * sizeof(int32_t));
    if (!same_pool && !w->hello_ever && s->running.count == 0) {
        /* The first Hello: no step has run, so the block table describes nothing yet. A
         * tensor-parallel group names its ranks' pools together (worker/tp_proc.h), which
         * is not the pool id kvpool's rank 0 gave the scheduler at start: taken as it is,
         * not counted as a change of pool. */
        log_info("worker 0 names pool %016llx at its first Hello (the table was opened with "
                 "%016llx): taken",
                 (unsigned long long)pool_id, (unsigned long long)s->cfg.geometry.pool_id);
        sched_cache_drop_all(s);
        s->cfg.geometry.pool_id = pool_id;
    } else if (!same_pool)
        adopt_pool(s, pool_id);
    w->hello_ever = true;
    if (sched_cache_on_hello(s, h) != 0) {
        /* Another model: what the running sequences hold in the pool is the old model's. */
        while (s->running.tail != NULL)
            sched_seq_preempt(s, s->running.tail);
    }
    sched_send_resync(s, now_ms, false);
}

static void on_resync_done(struct scheduler *s, const Pagoda__Internal__ResyncDone *d,
                           int64_t now_ms)
{
    struct worker_link *w = &s->worker;
    if (d->epoch != s->cfg.epoch || !w->hello_seen || w->state != LINK_RESYNCING ||
        d->resync_id != w->resync_id) {
        s->stats.ignored_messages++;
        return;
    }
    if (d->has_pool_id && d->pool_id != s->cfg.geometry.pool_id) {
        /* The worker maps another pool; the Hello it sends with its refusal adopts it. */
        s->stats.ignored_messages++;
        log_warn("worker 0 answered resync %llu for pool %016llx; the block table describes "
                 "pool %016llx",
                 (unsigned long long)d->resync_id, (unsigned long long)d->pool_id,
                 (unsigned long long)s->cfg.geometry.pool_id);
        return;
    }
    if (d->has_error_code && d->error_code != 0) {
        /* Left outstanding: the result timeout sends a new one. */
        log_error("worker 0 failed resync %llu: %s (%d)", (unsigned long long)d->resync_id,
                  d->error_message ? d->error_message : "", (int)d->error_code);
        return;
    }
    block_manager_ack(s->bm, w->resync_next_step - 1);
    w->state = LINK_IDLE;
    w->fresh = true;
    /* Sequences the worker left out of its mirror for their own content end here. */
    for (size_t i = 0; i < d->n_failed; i++) {
        const Pagoda__Internal__SeqResult *f = d->failed[i];
        struct seq *q = f->has_seq_id ? find_seq_id(s, f->seq_id) : NULL;
        if (q != NULL)
            seq_fail(s, q, f->has_error_code && f->error_code != 0 ? f->error_code : PAGODA_EINVAL,
                     f->error_message);
    }
    if (!s->ready_sent) {
        s->ready_sent = true;
        Pagoda__Internal__Control ctl = PAGODA__INTERNAL__CONTROL__INIT;
        ctl.has_ready = 1;
        ctl.ready = 1;
        send_supervisor(s, &ctl);
    }
    sched_try_step(s, now_ms);
}

void scheduler_on_worker(struct scheduler *s, uint32_t worker_id,
                         const Pagoda__Internal__ToScheduler *msg, int64_t now_ms)
{
    if (worker_id >= (uint32_t)s->cfg.num_workers)
        return;
    struct worker_link *w = &s->worker;
    w->last_rx_ms = now_ms;
    w->hung_reported = false;
    bool ok = msg != NULL;
    if (ok) {
        switch (msg->msg_case) {
        case PAGODA__INTERNAL__TO_SCHEDULER__MSG_HELLO:
            on_hello(s, msg->hello, now_ms);
            return;
        case PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESULT:
            ok = msg->result->has_epoch && msg->result->has_step_id;
            if (ok)
                on_step_result(s, msg->result, now_ms);
            break;
        case PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESYNC_DONE:
            ok = msg->resync_done->has_epoch && msg->resync_done->has_resync_id;
            if (ok)
                on_resync_done(s, msg->resync_done, now_ms);
            break;
        default:
            ok = false;
        }
    }
    if (!ok) {
        s->stats.malformed_messages++;
        log_warn("worker 0: malformed message%s", w->hello_seen ? "; resync" : "");
        if (w->hello_seen)
            sched_send_resync(s, now_ms, false);
    }
}

/* ---- timer ---------------------------------------------------------------------------------- */

/* Control{hung_worker_id 0, hung_worker_pid pid} to the supervisor (pid 0: a worker that sent
 * this scheduler no Hello), counted in stats.hung_reports. */
static void report_hung(struct scheduler *s, int32_t pid)
{
    s->stats.hung_reports++;
    Pagoda__Internal__Control ctl = PAGODA__INTERNAL__CONTROL__INIT;
    ctl.has_hung_worker_id = ctl.has_hung_worker_pid = 1;
    ctl.hung_worker_id = 0;
    ctl.hung_worker_pid = pid;
    send_supervisor(s, &ctl);
}

void scheduler_tick(struct scheduler *s, int64_t now_ms)
{
    sched_resend_to_router(s, now_ms);
    struct worker_link *w = &s->worker;
    switch (w->state) {
    case LINK_NEED_HELLO:
        if (w->refused) {
            w->no_hello_since_ms = 0;
            return;
        }
        if (!w->announced || now_ms - w->announce_ms >= SCHEDULER_ANNOUNCE_MS)
            sched_send_resync(s, now_ms, true);
        /* A worker that sends no Hello: one that is loading (the supervisor knows it is not
         * ready yet) or one that hangs, which a scheduler started meanwhile could otherwise
         * never report (it knows no pid), and every tenant would wait for good. */
        if (w->no_hello_since_ms == 0)
            w->no_hello_since_ms = now_ms;
        else if (now_ms - w->no_hello_since_ms >= (int64_t)s->cfg.watchdog_ms) {
            w->no_hello_since_ms = now_ms;
            log_warn("worker 0 sent no Hello for %lld ms: reported to the supervisor (which "
                     "kills it if it is ready and silent)",
                     (long long)s->cfg.watchdog_ms);
            report_hung(s, 0);
        }
        return;
    case LINK_STEP:
    case LINK_RESYNCING: {
        /* The oldest step in flight is the one the worker is on: its timeouts count from when
         * it could start, and grow with its tokens. */
        bool step = w->state == LINK_STEP;
        const struct step_rec *rec = step ? sched_step_at(w, 0) : NULL;
        int64_t sent = step ? rec->start_ms : w->resync_sent_ms;
        int64_t timeout = step ? step_timeout(s, rec->num_tokens) : result_timeout(s);
        int64_t watchdog = watchdog_timeout(s, step ? rec->num_tokens : 0);
        int64_t quiet_since = w->last_rx_ms > w->owes_since_ms ? w->last_rx_ms : w->owes_since_ms;
        if (!w->hung_reported && now_ms - quiet_since >= watchdog) {
            w->hung_reported = true;
            log_error("worker 0 (pid %d) silent for %lld ms while owing an answer: hung",
                      (int)w->pid, (long long)(now_ms - quiet_since));
            report_hung(s, w->pid);
        }
        if (now_ms - sent >= timeout) {
            s->stats.result_timeouts++;
            if (step) {
                w->timed_out_step = rec->step_id;
                w->timed_out_at_ms = now_ms;
            }
            log_warn("worker 0: %s %llu unanswered for %lld ms; resync", step ? "step" : "resync",
                     (unsigned long long)(step ? rec->step_id : w->resync_id),
                     (long long)(now_ms - sent));
            sched_send_resync(s, now_ms, false);
            return;
        }
        if (step)
            sched_try_step(s, now_ms); /* a second step, when the first went out alone */
        return;
    }
    case LINK_IDLE:
        sched_try_step(s, now_ms);
        return;
    }
}

/* ---- lifecycle ------------------------------------------------------------------------------ */

void scheduler_config_default(struct scheduler_config *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->num_workers = 1;
    cfg->max_batched_tokens = SCHEDULER_DEFAULT_MAX_BATCHED_TOKENS;
    cfg->max_seqs = SCHEDULER_DEFAULT_MAX_SEQS;
    cfg->max_queued = SCHEDULER_DEFAULT_MAX_QUEUED;
    cfg->result_timeout_ms = SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS;
    cfg->watchdog_ms = SCHEDULER_DEFAULT_WATCHDOG_MS;
    cfg->max_steps_in_flight = SCHEDULER_DEFAULT_STEPS_IN_FLIGHT;
    cfg->step_timeout_per_token_us = SCHEDULER_DEFAULT_STEP_TIMEOUT_PER_TOKEN_US;
    cfg->prefix_cache = 1;
}

static int check_config(const struct scheduler_config *c)
{
    if (c->epoch == 0)
        return pagoda_error_set(PAGODA_EINVAL, "scheduler: epoch must not be 0");
    if (c->num_workers != 1)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "scheduler: %d workers; only 1 is supported for now",
                                (int)c->num_workers);
    if (c->max_seqs < 1 || c->max_seqs > SCHEDULER_MAX_SEQS_LIMIT)
        return pagoda_error_set(PAGODA_ERANGE, "scheduler: max_seqs %d outside [1, %d]",
                                (int)c->max_seqs, SCHEDULER_MAX_SEQS_LIMIT);
    if (c->max_batched_tokens < c->max_seqs ||
        c->max_batched_tokens > SCHEDULER_MAX_BATCHED_TOKENS_LIMIT)
        return pagoda_error_set(
            PAGODA_ERANGE, "scheduler: max_batched_tokens %d outside [max_seqs %d, %d]",
            (int)c->max_batched_tokens, (int)c->max_seqs, SCHEDULER_MAX_BATCHED_TOKENS_LIMIT);
    if (c->max_queued < c->max_seqs || c->max_queued > SCHEDULER_MAX_QUEUED_LIMIT)
        return pagoda_error_set(PAGODA_ERANGE, "scheduler: max_queued %d outside [max_seqs %d, %d]",
                                (int)c->max_queued, (int)c->max_seqs, SCHEDULER_MAX_QUEUED_LIMIT);
    if (c->result_timeout_ms < 1 || c->result_timeout_ms > SCHEDULER_MAX_TIMEOUT_MS ||
        c->watchdog_ms < 1 || c->watchdog_ms > SCHEDULER_MAX_TIMEOUT_MS)
        return pagoda_error_set(PAGODA_ERANGE, "scheduler: timeouts must lie in [1, %d] ms",
                                SCHEDULER_MAX_TIMEOUT_MS);
    if (c->max_steps_in_flight < 1 || c->max_steps_in_flight > SCHEDULER_MAX_STEPS_IN_FLIGHT)
        return pagoda_error_set(PAGODA_ERANGE, "scheduler: max_steps_in_flight %d outside [1, %d]",
                                (int)c->max_steps_in_flight, SCHEDULER_MAX_STEPS_IN_FLIGHT);
    if (c->step_timeout_per_token_us < 0 ||
        c->step_timeout_per_token_us > SCHEDULER_MAX_STEP_TIMEOUT_PER_TOKEN_US)
        return pagoda_error_set(
            PAGODA_ERANGE, "scheduler: step_timeout_per_token_us %d outside [0, %d]",
            (int)c->step_timeout_per_token_us, SCHEDULER_MAX_STEP_TIMEOUT_PER_TOKEN_US);
    int rc = kv_geometry_validate(&c->geometry);
    if (rc != 0)
        return rc;
    return 0;
}

int scheduler_open(const struct scheduler_config *cfg, const struct scheduler_io *io,
                   struct scheduler **out)
{
    if (cfg == NULL || io == NULL || out == NULL || !io->to_worker || !io->to_router ||
        !io->to_supervisor)
        return PAGODA_EINVAL;
    int rc = check_config(cfg);
    if (rc != 0)
        return rc;
    struct scheduler *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return PAGODA_ENOMEM;
    s->cfg = *cfg;
    s->io = *io;
    s->block_size = cfg->geometry.block_size;
    s->router_resend_wait_ms = SCHEDULER_ROUTER_RESEND_MS;
    if (getrandom(&s->hash_seed, sizeof(s->hash_seed), 0) != (ssize_t)sizeof(s->hash_seed))
        s->hash_seed = cfg->epoch; /* only before the entropy pool is ready: still a key */
    if ((rc = block_manager_open(cfg->geometry.num_blocks, &s->bm)) != 0)
        goto fail;
    uint32_t buckets = 1;
    while (buckets < 2u * (uint32_t)cfg->max_queued)
        buckets *= 2;
    s->bucket_mask = buckets - 1;
    size_t m = (size_t)cfg->max_seqs;
    s->req_buckets = calloc(buckets, sizeof(*s->req_buckets));
    s->id_buckets = calloc(buckets, sizeof(*s->id_buckets));
    bool steps_ok = true;
    for (int i = 0; i < SCHEDULER_MAX_STEPS_IN_FLIGHT; i++)
        steps_ok &= (s->worker.steps[i].seq_ids = calloc(m, sizeof(uint64_t))) != NULL;
    s->worker.suspects = calloc(m, sizeof(uint64_t));
    s->pending_finished.ids = calloc(2 * m, sizeof(uint64_t));
    s->pending_preempted.ids = calloc(2 * m, sizeof(uint64_t));
    s->plan = calloc(m, sizeof(*s->plan));
    s->order = calloc(m, sizeof(*s->order));
    s->new_msgs = calloc(m, sizeof(*s->new_msgs));
    s->new_ptrs = calloc(m, sizeof(*s->new_ptrs));
    s->cont_msgs = calloc(m, sizeof(*s->cont_msgs));
    s->cont_ptrs = calloc(m, sizeof(*s->cont_ptrs));
    s->sp_msgs = calloc(m, sizeof(*s->sp_msgs));
    s->snap_msgs = calloc(m, sizeof(*s->snap_msgs));
    s->snap_ptrs = calloc(m, sizeof(*s->snap_ptrs));
    s->ev_msgs = calloc(m, sizeof(*s->ev_msgs));
    s->ev_ptrs = calloc(m, sizeof(*s->ev_ptrs));
    s->ev_sampling = calloc(m, sizeof(*s->ev_sampling));
    s->ev_slots = calloc(m, sizeof(*s->ev_slots));
    if (!s->req_buckets || !s->id_buckets || !steps_ok || !s->worker.suspects ||
        !s->pending_finished.ids || !s->pending_preempted.ids || !s->plan || !s->order ||
        !s->new_msgs || !s->new_ptrs || !s->cont_msgs || !s->cont_ptrs || !s->sp_msgs ||
        !s->snap_msgs || !s->snap_ptrs || !s->ev_msgs || !s->ev_ptrs || !s->ev_sampling ||
        !s->ev_slots) {
        rc = PAGODA_ENOMEM;
        goto fail;
    }
    s->pending_finished.cap = s->pending_preempted.cap = 2 * (uint32_t)m;
    if ((rc = sched_cache_open(s)) != 0)
        goto fail;
    s->worker.state = LINK_NEED_HELLO;
    *out = s;
    return 0;
fail:
    scheduler_close(s);
    return rc;
}

static void free_list(struct seq_list *l)
{
    struct seq *q = l->head;
    while (q) {
        struct seq *next = q->next;
        sched_seq_free(q);
        q = next;
    }
    l->head = l->tail = NULL;
    l->count = 0;
}

void scheduler_close(struct scheduler *s)
{
    if (s == NULL)
        return;
    free_list(&s->waiting);
    free_list(&s->running);
    free_list(&s->recent);
    free_list(&s->refused);
    sched_cache_close(s);
    block_manager_close(s->bm);
    free(s->req_buckets);
    free(s->id_buckets);
    for (int i = 0; i < SCHEDULER_MAX_STEPS_IN_FLIGHT; i++)
        free(s->worker.steps[i].seq_ids);
    free(s->worker.suspects);
    free(s->pending_finished.ids);
    free(s->pending_preempted.ids);
    free(s->plan);
    free(s->order);
    free(s->new_msgs);
    free(s->new_ptrs);
    free(s->cont_msgs);
    free(s->cont_ptrs);
    free(s->sp_msgs);
    free(s->snap_msgs);
    free(s->snap_ptrs);
    free(s->ev_msgs);
    free(s->ev_ptrs);
    free(s->ev_sampling);
    free(s->ev_slots);
    free(s);
}

void scheduler_get_stats(const struct scheduler *s, struct scheduler_stats *out)
{
    *out = s->stats;
    out->running = s->running.count;
    out->waiting = s->waiting.count;
    out->num_blocks = block_manager_usable(s->bm);
    out->free_blocks = block_manager_free_count(s->bm);
    sched_cache_stats(s, out);
    out->deferred_blocks = block_manager_deferred_count(s->bm);
    out->step_cpu_us = s->stats.steps ? (double)s->step_cpu_ns / 1e3 / (double)s->stats.steps : 0;
    out->ready = s->ready_sent;
    out->result_timeout_ms = result_timeout(s);
    out->pool_id = s->cfg.geometry.pool_id;
    out->steps_in_flight = s->worker.num_steps;
}
