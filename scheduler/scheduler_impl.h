/* The scheduler's private state, shared by scheduler.c (results, resyncs, workers, sequences),
 * scheduler_step.c (forming and sending steps), scheduler_router.c (the router's messages) and
 * scheduler_cache.c (the prefix cache in use: lookups, publication, tenants, pins, the policy
 * and admin calls). Nothing outside scheduler/ includes it. */
#ifndef PAGODA_SCHEDULER_SCHEDULER_IMPL_H
#define PAGODA_SCHEDULER_SCHEDULER_IMPL_H

#include "common/list.h"
#include "kernels/cpu/sampler.h"
#include "scheduler/block_manager.h"
#include "scheduler/prefix_cache.h"
#include "scheduler/scheduler.h"
#include "wire/sampling_wire.h"

#include <stdbool.h>
#include <stdint.h>

/* ---- sequences ------------------------------------------------------------------------------ */

struct sched_tenant;
struct sched_pin;

enum seq_state { SEQ_WAITING, SEQ_RUNNING };

/* q's part of one step in flight. */
struct seq_inflight {
    uint64_t step_id;
    int32_t num_new;
    bool samples;
};

/* One request. tokens holds everything known, prompt then output; num_computed of them are in
 * the pool as acknowledged by the worker. inflight lists q's parts of the steps in flight, oldest
 * first: after them the worker will have computed num_scheduled positions and sampled
 * pending_samples more tokens than the scheduler knows (the next step decodes from them). */
struct seq {
    uint8_t request_id[SCHEDULER_REQUEST_ID_BYTES];
    uint64_t seq_id; /* this admission's id (the worker's key); 0 while waiting */
    enum seq_state state;
    int32_t *tokens;
    float *logprobs; /* beside tokens (cap_tokens): each sampled token's; 0 for the others */
    int32_t num_tokens, cap_tokens;
    int32_t num_prompt_tokens;
    int32_t num_computed;
    int32_t num_scheduled;   /* num_computed + the tokens of the steps in flight */
    int32_t pending_samples; /* steps in flight in which q samples */
    struct seq_inflight inflight[SCHEDULER_MAX_STEPS_IN_FLIGHT];
    int32_t num_inflight;
    bool worker_knows;     /* sent as new or in a snapshot since the worker's mirror was reset */
    int32_t blocks_sent;   /* how much of table the worker knows */
    int64_t vocab_checked; /* the vocabulary the tokens were checked against (0: not yet) */
    struct block_table table;
    int32_t plan_index; /* while a step is formed: its entry, or -1 */
    bool has_result;    /* while a result is checked */
    int32_t result_token;
    float result_logprob;
    int32_t result_error;             /* while a result is checked: the worker failed it (code) */
    const char *result_error_message; /* the result's, valid while it is handled */
    struct sampling_params sampling;
    int32_t max_tokens;     /* 0: up to the context */
    bool strict_max_tokens; /* until its first admission check: prompt + max_tokens must fit */
    bool ignore_eos;
    bool logprobs_asked;  /* the client asked for log-probabilities (echoed in announcements) */
    uint8_t *router_text; /* SubmitSeq.router_text (NULL: none), echoed in announcements */
    size_t router_text_len;
    int32_t num_stop_ids;
    int32_t stop_ids[SCHEDULER_MAX_STOP_IDS];
    struct logit_bias bias; /* the request's logit bias (owned) */
    /* The ids min_tokens suppresses, as last sent to the worker (sched_fill_sampling). */
    int32_t num_suppress;
    int32_t suppress[SCHEDULER_MAX_EOS_IDS + SCHEDULER_MAX_STOP_IDS];
    struct seq *prev, *next; /* in waiting or running */
    struct seq *req_next;    /* request-id hash chain */
    struct seq *id_next;     /* seq-id hash chain, while running */
    /* For announcements (RouterHello): what a restarted router needs to register it again. */
    char *tenant;
    bool has_client_id;
    uint8_t client_id[SCHEDULER_REQUEST_ID_BYTES];
    /* Once it has ended and is kept in the recent or refused list. */
    uint64_t end_order; /* when it was kept there (scheduler.end_count): newer is larger */
    Pagoda__Internal__FinishReason finish_reason;
    int32_t error_code;
    const char *error_message; /* a static string, error_text, or NULL */
    char *error_text;          /* owned: a worker's message for this request's failure */
    /* The prefix cache (scheduler_cache.c). */
    struct sched_tenant *owner;  /* whose request (NULL for a pin's own sequence) */
    struct sched_pin *pin;       /* a pin being computed: this is its sequence */
    struct pc_namespace *ns;     /* where its blocks are published, fixed at admission */
    struct pc_namespace *pin_ns; /* blocks [0, key_switch) were a pinned prefix's */
    int32_t key_switch;
    struct pc_entry **entries; /* per block of table: its cache entry, or NULL (private) */
    int32_t cap_entries;
    struct pc_key *keys; /* keys of the first num_keys full blocks */
    int32_t num_keys, cap_keys;
    int32_t num_published; /* blocks whose publication was decided */
    bool looked_up;        /* the first admission's lookup was counted */
    bool prefix_waited;    /* counted in stats.prefix_waits */
    int64_t queue_key;     /* its place in the waiting queue: keys grow from front to back */
    uint32_t cached_tokens;
};

struct seq_list {
    struct seq *head, *tail;
    uint32_t count;
};

PAGODA_LIST_DEFINE(list, struct seq_list, struct seq)

/* A bounded list of seq ids for the next step (finished, preempted). */
struct id_list {
    uint64_t *ids;
    uint32_t count, cap;
};

/* ---- the worker link ------------------------------------------------------------------------ */

enum link_state {
    LINK_NEED_HELLO, /* no Hello yet: announce the epoch now and then */
    LINK_RESYNCING,  /* a resync is outstanding */
    LINK_IDLE,       /* in sync, no step in flight */
    LINK_STEP,       /* one or more steps are in flight */
};

/* A step sent and not answered. start_ms: when the worker could start it (sent, or the previous
 * step's result for a step sent behind another): its timeout counts from there. */
struct step_rec {
    uint64_t step_id;
    int64_t start_ms;
    int64_t num_tokens;
    uint64_t *seq_ids; /* [max_seqs] */
    uint32_t num_seqs;
};

struct worker_link {
    enum link_state state;
    bool hello_seen;
    bool hello_ever; /* a Hello was accepted since the scheduler opened */
    int32_t pid;
    /* A Hello was refused (the worker on the link is not one the scheduler can use): nothing
     * goes to the link, not even announcements, until a Hello is accepted. */
    bool refused;
    int32_t refused_pid; /* whose refusal was logged at error level */
    int64_t vocab_size;
    int64_t max_positions;
    int32_t num_eos;
    int32_t eos_ids[SCHEDULER_MAX_EOS_IDS];
    uint64_t resync_id;        /* of the outstanding (or last) resync */
    uint64_t resync_next_step; /* its next_step_id */
    int64_t resync_sent_ms;
    bool announced;
    int64_t announce_ms;
    /* The steps in flight, oldest first: steps[(step_head + i) % SCHEDULER_MAX_STEPS_IN_FLIGHT]
     * for i < num_steps. */
    struct step_rec steps[SCHEDULER_MAX_STEPS_IN_FLIGHT];
    uint32_t step_head, num_steps;
    /* A slow worker is not a lost step: when the result of a step that timed out arrives
     * after all, the timeout doubles (up to SCHEDULER_MAX_TIMEOUT_BACKOFF times) for the rest
     * of this worker process's life, so that a long step cannot be resynced forever. */
    uint64_t timed_out_step;
    int64_t timed_out_at_ms;
    int timeout_backoff;
    /* A step refused right after a resync (fresh) is not the mirror's divergence but the step's
     * own fault: it is never sent again as is. The scheduler isolates the culprit: the next
     * steps run only a probe, the first half of the suspects (the refused step's sequences);
     * a refused probe becomes the suspects, an accepted one leaves the rest; a lone suspect
     * refused again right after a resync is failed (FINISH_ERROR, the worker's message). */
    bool fresh; /* a resync was answered and no step was accepted since */
    bool isolating;
    uint64_t *suspects; /* [max_seqs] */
    uint32_t num_suspects, probe_len;
    int64_t last_rx_ms;
    int64_t owes_since_ms; /* when the outstanding answer became due */
    bool hung_reported;
    /* LINK_NEED_HELLO: since when no Hello came (0: not counted yet); a worker silent for the
     * watchdog's time is reported without a pid (a scheduler started while it was hung has
     * none), every watchdog period until a Hello. */
    int64_t no_hello_since_ms;
};

/* ---- the scheduler -------------------------------------------------------------------------- */

struct plan_entry {
    struct seq *seq; /* NULL: removed (preempted while the step was formed) */
    int32_t num_new;
};

/* A token event's own copy of what it reports (the sequence may be gone when it is sent). */
struct event_slot {
    uint8_t request_id[SCHEDULER_REQUEST_ID_BYTES];
    int32_t token;
    float logprob;
    char error[SCHEDULER_ERROR_MESSAGE_MAX];
};

struct scheduler {
    struct scheduler_config cfg;
    struct scheduler_io io;
    struct block_manager *bm;
    int32_t block_size;
    struct seq_list waiting, running;
    /* The waiting queue's tenants (those with a sequence waiting) and its sequences of no tenant
     * (pins' computations): the groups next_admission chooses among. */
    uint32_t tenants_waiting, ownerless_waiting;
    /* Queue keys (struct seq queue_key): the last given at the front, and at the back. */
    int64_t queue_front_key, queue_back_key;
    uint64_t admission_pass; /* next_admission's passes, the tenants' seen marks */
    uint32_t pins_running;   /* in a step's admissions: running sequences of no tenant (pins) */
    bool pins_win_tie;       /* whether the next tie between pins and a tenant goes to the pins */
    bool pins_passed;        /* in a step's admissions: the pins' first waits for a prefix */
    /* form_plan's prefill shares (scheduler_step.c): the tenants marked in pass prefill_pass are
     * this step's parties; the prefill tokens planned for pins' computations. */
    uint64_t prefill_pass;
    int32_t pins_prefill_used;
    uint64_t victim_pass;    /* memory_victim's passes */
    struct seq_list recent;  /* ended requests kept for announcements, oldest first */
    struct seq_list refused; /* the same for refusals at submission (empty sequences) */
    uint64_t end_count;      /* the last end_order given */
    struct seq **req_buckets, **id_buckets;
    uint32_t bucket_mask;
    uint64_t hash_seed; /* keys the request and sequence id buckets */
    uint64_t next_seq_id;
    uint64_t last_step_id; /* the last step sent (0: none yet) */
    struct worker_link worker;
    struct id_list pending_finished, pending_preempted;
    bool need_resync;
    bool ready_sent;
    /* A message to the router was lost since the last resend that went through whole. */
    bool router_behind;
    bool resend_announce;          /* and one of them was an announcement's */
    int64_t router_resend_ms;      /* when the last resend was sent */
    int64_t router_resend_wait_ms; /* before the next */
    /* Forming a step. */
    struct plan_entry *plan;
    uint32_t plan_len;
    int32_t budget;
    bool preempted_now;
    struct seq **order;
    /* Message scratch, max_seqs entries each. */
    Pagoda__Internal__NewSequence *new_msgs;
    Pagoda__Internal__NewSequence **new_ptrs;
    Pagoda__Internal__ContinuingSequence *cont_msgs;
    Pagoda__Internal__ContinuingSequence **cont_ptrs;
    Pagoda__Internal__SamplingParams *sp_msgs;
    Pagoda__Internal__SequenceSnapshot *snap_msgs;
    Pagoda__Internal__SequenceSnapshot **snap_ptrs;
    Pagoda__Internal__TokenEvent *ev_msgs;
    Pagoda__Internal__TokenEvent **ev_ptrs;
    Pagoda__Internal__SamplingParams *ev_sampling; /* an announcement's (announce_fill) */
    struct event_slot *ev_slots;
    struct scheduler_stats stats;
    uint64_t step_cpu_ns;
    /* The prefix cache, tenants and pins (scheduler_cache.c). */
    struct prefix_cache *pc;
    struct pc_entry **match; /* lookup scratch, one per usable block */
    struct sched_tenant *tenants;
    struct sched_pin *pins;
    uint64_t policy_version; /* the newest policy applied */
    bool policy_reply_owed;  /* PolicyApplied waits for pins being computed */
    uint64_t next_pin_id;
};

/* *sp = q's sampling for the worker: its parameters and logit bias, and with min_tokens the ids
 * it suppresses (the worker's EOS ids, also with ignore_eos, then the request's stop ids, each
 * once, kept in q->suppress). sp points into q: it lives as long as q. */
void sched_fill_sampling(const struct scheduler *s, struct seq *q,
                         Pagoda__Internal__SamplingParams *sp);

/* Fills the fields a NewSequence and a SequenceSnapshot share (protobuf-c gives the two messages
 * two types of the same six fields) from q: its id, tokens, prompt length, block table, what the
 * pool holds, and its sampling (sched_fill_sampling), into *sp, which must live as long as the
 * message. */
#define SCHED_FILL_SEQ_STATE(s, m, q, sp)                                                          \
    do {                                                                                           \
        (m)->has_seq_id = (m)->has_num_prompt_tokens = (m)->has_num_computed_tokens = 1;           \
        (m)->seq_id = (q)->seq_id;                                                                 \
        (m)->n_token_ids = (size_t)(q)->num_tokens;                                                \
        (m)->token_ids = (q)->tokens;                                                              \
        (m)->num_prompt_tokens = (q)->num_prompt_tokens;                                           \
        (m)->n_block_ids = (size_t)(q)->table.num_blocks;                                          \
        (m)->block_ids = (q)->table.ids;                                                           \
        (m)->num_computed_tokens = (q)->num_computed;                                              \
        sched_fill_sampling((s), (q), (sp));                                                       \
        (m)->sampling = (sp);                                                                      \
    } while (0)

/* A tenant as the scheduler knows it: from the router's policy, or by default (a namespace of
 * its own, no cap, no pins) when the policy does not name it. */
struct sched_tenant {
    char name[PREFIX_CACHE_NAMESPACE_MAX + 1];
    struct pc_namespace *ns;
    uint32_t max_running; /* 0: none */
    uint32_t running;
    uint32_t waiting; /* its sequences in the waiting queue (waiting_push, waiting_remove) */
    /* The places it wants (running and waiting, at most max_running) and its share of
     * max_seqs, as scheduler_step.c's fill_shares last computed them. */
    uint32_t want, share;
    /* form_plan's admissions (scheduler_step.c): in pass `seen`, head is its first waiting
     * sequence (NULL: none left). */
    uint64_t seen;
    struct seq *head;
    /* form_plan's prefill shares: in pass prefill_pass, the prefill tokens planned for it. */
    uint64_t prefill_pass;
    int32_t prefill_used;
    /* memory_victim's count (scheduler_step.c): in pass victim_pass, the blocks its running
     * sequences hold. */
    uint64_t victim_pass;
    int64_t blocks_held;
    struct sched_pin **pins;
    uint32_t num_pins;
    uint64_t lookups, hits, query_tokens, hit_tokens;
    bool in_policy;
    struct sched_tenant *next;
};

enum pin_state { PIN_COMPUTING, PIN_READY, PIN_FAILED };

/* A public prefix: computed by a sequence of its own, then held (its entries pinned). */
struct sched_pin {
    char name[PREFIX_CACHE_NAMESPACE_MAX + 1];
    struct pc_namespace *ns;
    int32_t *tokens;
    int32_t num_tokens;
    enum pin_state state;
    struct seq *computing;
    struct pc_entry **held;
    int32_t num_held;
    int32_t error_code;
    char error[160];
    bool in_policy;
    struct sched_pin *next;
};

/* ---- scheduler.c, for scheduler_cache.c ---- */

/* Removes q from its list and tables, releases its blocks and frees it. */
void sched_seq_remove(struct scheduler *s, struct seq *q);

/* A waiting sequence for tokens (n of them, all prompt), not yet listed anywhere; NULL when out
 * of memory. */
struct seq *sched_seq_new(const int32_t *tokens, int32_t n, int32_t more);

/* Tests: each running sequence's parts in flight against the steps in flight (in order, one per
 * step at most, adding up to num_scheduled and pending_samples, with the table covering them).
 * Returns 0, or -1 with a reason in *why. */
int sched_check_inflight(const struct scheduler *s, const char **why);

/* Sends m to the router with protocol version and epoch set. */
bool sched_send_router(struct scheduler *s, Pagoda__Internal__ToRouter *m);

/* ---- scheduler.c, for scheduler_router.c ---- */

/* Request ids may be a client's own (one default tenant), so buckets come from a keyed hash:
 * nobody can choose ids that pile into one bucket. */
uint64_t sched_request_hash(const struct scheduler *s, const uint8_t *id);
/* The live sequence of request id (SCHEDULER_REQUEST_ID_BYTES), or NULL. */
struct seq *sched_find_request(const struct scheduler *s, const uint8_t *id);
/* Lists q under its request id (sched_find_request). */
void sched_hash_request(struct scheduler *s, struct seq *q);
/* Frees q and what it owns (its block table's memory, not its blocks); NULL is ignored. */
void sched_seq_free(struct seq *q);
/* The most tokens a sequence may hold while `pinned` blocks are pinned: the model's positions
 * and the pool less those blocks. */
int64_t sched_context_with_pins(const struct scheduler *s, int32_t pinned);
/* The most tokens a sequence may hold now (sched_context_with_pins of the blocks pinned now). */
int64_t sched_context_limit(const struct scheduler *s);
/* Sends n events in one message; announce_done marks the last message of an announcement.
 * Returns false when the message was lost. */
bool sched_send_events_msg(struct scheduler *s, Pagoda__Internal__TokenEvent **events, size_t n,
                           bool announce_done);
/* Tells the router the model's context, once a worker has said it. Returns false when the
 * message was lost. */
bool sched_send_model_info(struct scheduler *s);
/* Sends one event that ends a request: reason, with error (0 or a PAGODA_E* code and a
 * message) and no tokens. id is echoed as given (any length). */
void sched_send_end(struct scheduler *s, const uint8_t *id, size_t id_len, uint32_t offset,
                    uint32_t prompt_tokens, Pagoda__Internal__FinishReason reason, int error,
                    const char *message);
/* A refusal of request id: logged, counted, and sent as its end (FINISH_ERROR). */
void sched_send_error(struct scheduler *s, const uint8_t *id, size_t id_len, int error,
                      const char *message);
/* Keeps q, which ended and is in no list, at the end of list l (the recent or the refused
 * list), dropping l's oldest beyond keep (keep_behind while a message to the router is lost). */
void sched_ended_push(struct scheduler *s, struct seq_list *l, struct seq *q, uint32_t keep,
                      uint32_t keep_behind);
/* Sets q's end to FINISH_ERROR with error and (a copy of) message, for the recent list. */
void sched_seq_set_error(struct seq *q, int error, const char *message);
/* A request that ended (finished, cancelled, or out of memory) with reason. */
void sched_seq_end(struct scheduler *s, struct seq *q, Pagoda__Internal__FinishReason reason,
                   int32_t error_code, const char *error_message);
/* A sum of step times in microseconds as a counter: rounded, held at 2^62. */
uint64_t sched_us_counter(double sum);

/* ---- scheduler.c, for scheduler_step.c ---- */

/* The calling thread's CPU time in nanoseconds. */
uint64_t sched_cpu_now_ns(void);
/* Adds the thread's CPU time since start_ns (sched_cpu_now_ns) to what steps cost (step_cpu_us). */
void sched_charge_cpu(struct scheduler *s, uint64_t start_ns);
/* Lists q, just admitted, under its seq id (the worker's key for it). */
void sched_hash_seq_id(struct scheduler *s, struct seq *q);
/* The step in flight i places after the oldest (i < num_steps). */
struct step_rec *sched_step_at(struct worker_link *w, uint32_t i);
/* Forgets q's parts of the steps in flight: it continues from what was acknowledged. */
void sched_seq_clear_inflight(struct seq *q);
/* Sends m to worker worker_id with the protocol version set. */
void sched_send_worker(struct scheduler *s, uint32_t worker_id, Pagoda__Internal__ToWorker *m);
/* Ends q with an error event (a request found unfit at admission). */
void sched_seq_refuse(struct scheduler *s, struct seq *q, int error, const char *message);
/* Releases a running sequence's blocks and requeues it at the front to recompute everything it
 * knows (a step being formed gives back its tokens). */
void sched_seq_preempt(struct scheduler *s, struct seq *v);
/* From now_ms on the worker owes an answer (the watchdog counts from it), unless it owed one
 * already. */
void sched_owe_from(struct worker_link *w, int64_t now_ms);
/* Sends a resync to the worker: discards the steps in flight and snapshots every running
 * sequence as acknowledged. announce: the empty resync sent before any Hello. */
void sched_send_resync(struct scheduler *s, int64_t now_ms, bool announce);
/* Whether q may run in the step being formed: anything when not isolating a refused step, else
 * only the probe (the first probe_len suspects). */
bool sched_isolation_may_run(const struct scheduler *s, const struct seq *q);
/* Ends the isolation of a refused step (if one is under way), logging why. */
void sched_isolation_end(struct scheduler *s, const char *why);
/* Before a step is formed while isolating: forgets suspects that no longer run and picks the
 * probe again. */
void sched_isolation_prune(struct scheduler *s);

/* ---- scheduler_step.c: forming and sending steps, for scheduler.c and scheduler_router.c ---- */

/* A strict_max_tokens request's check: PAGODA_ERANGE with why in msg when its prompt and
 * max_tokens (> 0) pass limit, else 0. */
int sched_strict_check(int64_t limit, int32_t prompt, int32_t max_tokens,
                       char msg[SCHEDULER_ERROR_MESSAGE_MAX]);
/* Sends steps while one may go out: with two in flight, step n+1 right behind step n. */
void sched_try_step(struct scheduler *s, int64_t now_ms);

/* ---- scheduler_router.c: the router's messages (submit, cancel, stats, the router's hello and
 * the announcement of what the scheduler holds), for scheduler.c ---- */

/* After a message to the router was lost: the model's context and everything held again, until
 * a resend goes through whole (backing off from SCHEDULER_ROUTER_RESEND_MS). */
void sched_resend_to_router(struct scheduler *s, int64_t now_ms);

/* ---- scheduler_cache.c ---- */

int sched_cache_open(struct scheduler *s);
void sched_cache_close(struct scheduler *s);

/* The tenant called name (created with the defaults when new); NULL when out of memory or the
 * name is too long. */
struct sched_tenant *sched_tenant_get(struct scheduler *s, const char *name);

/* The waiting queue, with its count of tenants waiting (admissions are fair between them:
 * scheduler_step.c next_admission). Every change of s->waiting goes through these. */
static inline void waiting_count(struct scheduler *s, const struct seq *q, int delta)
{
    if (q->owner == NULL) {
        s->ownerless_waiting += (uint32_t)delta;
        return;
    }
    uint32_t before = q->owner->waiting;
    q->owner->waiting += (uint32_t)delta;
    if (before == 0)
        s->tenants_waiting++;
    else if (q->owner->waiting == 0)
        s->tenants_waiting--;
}

static inline void waiting_push(struct scheduler *s, struct seq *q, bool front)
{
    if (front) {
        list_push_front(&s->waiting, q);
        q->queue_key = --s->queue_front_key;
    } else {
        list_push_back(&s->waiting, q);
        q->queue_key = ++s->queue_back_key;
    }
    waiting_count(s, q, 1);
}

static inline void waiting_remove(struct scheduler *s, struct seq *q)
{
    list_remove(&s->waiting, q);
    waiting_count(s, q, -1);
}

/* Looks q up (at admission): fills s->match with the entries its known tokens hit, never the
 * block holding its last token, and returns how many; *evictable_hits counts those now waiting
 * in an LRU (taking them makes them unevictable). Sets q's namespaces and key switch. */
int32_t sched_cache_match(struct scheduler *s, struct seq *q, int32_t *evictable_hits);

/* Whether another running sequence is computing block hits of q's prompt now and will publish
 * it (the same key: the same namespace, the same tokens before it and in it), under the entry
 * q matched for the block before: right after a sched_cache_match of q that returned hits (it reads
 * s->match). Then q is better admitted once that block is cached: it
 * hits it instead of computing it beside (SGLang holds back such requests too). */
bool sched_cache_computed_elsewhere(struct scheduler *s, struct seq *q, int32_t hits);

/* Takes the n entries of the last sched_cache_match into q's empty table as computed tokens, and
 * counts the lookup (the first admission's) in q's tenant's figures and the stats. */
int sched_cache_take_match(struct scheduler *s, struct seq *q, int32_t n);

/* Appends a new block to q's table, evicting cached blocks while none is free. Errors:
 * PAGODA_EEXHAUSTED (nothing to evict), PAGODA_ENOMEM. */
int sched_seq_append_block(struct scheduler *s, struct seq *q);

/* Releases q's blocks: cached ones at once (no step writes them), private ones fenced on the
 * last step sent. Empties q's table. */
void sched_seq_release_blocks(struct scheduler *s, struct seq *q);

/* Publishes q's newly computed full blocks (after the step that filled them was acknowledged). */
void sched_cache_publish(struct scheduler *s, struct seq *q);

/* Aborts when the num_new tokens q computes next would land in a cached or shared block. */
void sched_cache_assert_writable(const struct scheduler *s, const struct seq *q, int32_t num_new);

/* A worker's Hello: the root key from its model fingerprint and the pool's dtype. Returns 1
 * when the model changed (the cache was flushed and the pins are computed again: the caller
 * must preempt every running sequence, whose KV is the old model's), else 0. */
int sched_cache_on_hello(struct scheduler *s, const Pagoda__Internal__Hello *h);

/* The worker maps another pool than the one the block table describes: drops every cached
 * block (no later lookup finds them) and computes the pins again. The caller preempts every
 * running sequence. Returns the number of cached blocks dropped. */
uint32_t sched_cache_drop_all(struct scheduler *s);

/* The blocks the pins being computed will hold once ready (not yet in the cache's pinned
 * count). */
int32_t sched_pins_computing_blocks(const struct scheduler *s);

/* A pin's sequence ended: ok (its blocks are computed: hold them), or failed with error. */
void sched_pin_seq_ended(struct scheduler *s, struct seq *q, bool ok, int error,
                         const char *message);

void sched_on_policy(struct scheduler *s, const Pagoda__Internal__Policy *m);
void sched_on_admin(struct scheduler *s, const Pagoda__Internal__AdminCall *m);

/* Fills the cache's and the pool's figures into out. */
void sched_cache_stats(const struct scheduler *s, struct scheduler_stats *out);

#endif
