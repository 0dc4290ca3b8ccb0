/* The router's private state, shared by its source files:
 *
 *   router.c           open, drain, close; the loop's housekeeping tick
 *   router_front.c     the REP front: client connections, contexts and the mailbox, parking,
 *                      authentication and the dispatch of each call, replies
 *   router_registry.c  the request registry: requests, deduplication, finished lists, trimming,
 *                      accounting; the Submit, Poll and Cancel calls
 *   router_link.c      the engine links (one scheduler each): submits, cancels, resubmission after
 *                      a restart, failover to another engine, token events, stats, ModelInfo
 *   route.c            the routing decision (route.h): which engine a request goes to
 *   router_tenancy.c   the tenancy it owns: tenants (from the tenants file), pins, the Policy it
 *                      pushes to the scheduler
 *   router_pins_file.c the runtime pins kept in the run dir across a restart of the router
 *   router_admin.c     the admin API (ClientRequest.admin) and the scheduler's answers to it
 *   router_text.c      the text side: tokenizer, chat template, output text
 *
 * Nothing here is for other modules: router.h is the router's interface. Everything runs on the
 * router's libuv loop thread unless a comment says otherwise. */
#ifndef PAGODA_ROUTER_ROUTER_INTERNAL_H
#define PAGODA_ROUTER_ROUTER_INTERNAL_H

#include "kernels/cpu/sampler.h"
#include "proto/internal.pb-c.h"
#include "proto/pagoda.pb-c.h"
#include "router/route.h"
#include "router/router.h"
#include "router/tenants.h"

#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <uv.h>

#define ID_BYTES 16

/* What a parked call waits for. */
enum park {
    PARK_NONE = 0,
    PARK_POLL,    /* tokens of a request */
    PARK_STATS,   /* SchedulerStats with cookie >= its own */
    PARK_UNKNOWN, /* the scheduler's announcement (a poll for an unknown id after a restart) */
    PARK_ADMIN,   /* AdminResult with its cookie (router_admin.c) */
    PARK_POLICY,  /* PolicyApplied of its version or a later one (router_admin.c) */
    PARK_TEXT,    /* a Tokenize call's job on the threadpool (router_text.c) */
};

/* The admin call a PARK_ADMIN or PARK_POLICY context answers. */
enum admin_op {
    ADMIN_OP_NONE = 0,
    ADMIN_OP_TENANTS,
    ADMIN_OP_FLUSH,
    ADMIN_OP_PIN,
    ADMIN_OP_UNPIN,
    ADMIN_OP_RELOAD, /* cookie 0 while the file is read, then the policy version */
    ADMIN_OP_STATS   /* a tenant's Stats: its own figures (AdminCall{figures}) */
};

struct request;
struct reload_job;
struct pins_save_job;
struct text_holder;
struct text_job;

/* One REP context: receives a call, is owned by the loop while the call is handled or parked,
 * then sends the reply and receives again. */
struct rctx {
    struct router *r;
    nng_ctx ctx;
    nng_aio *aio;
    int ctx_open;
    int sending;            /* the aio's operation is a send; set before it starts */
    uint32_t pipe;          /* the connection the call came on (0: none) */
    struct rctx *all_next;  /* router.ctxs: every context, loop thread only */
    nng_msg *msg;           /* a received call waiting in the mailbox */
    struct rctx *next_mail; /* mailbox link, guarded by router.lock */
    uv_timer_t timer;       /* a parked call's deadline */
    enum park park;
    struct request *req;     /* PARK_POLL: the request waited on */
    uint32_t offset;         /* PARK_POLL: the first output token the client wants */
    uint64_t cookie;         /* PARK_STATS, PARK_ADMIN: the cookie sent; PARK_POLICY: the version */
    uint64_t engines_waited; /* PARK_STATS, PARK_ADMIN: bit e: engine e's answer is awaited */
    uint64_t engines_asked;  /* PARK_STATS, PARK_ADMIN: bit e: engine e was asked */
    Pagoda__Internal__ToRouter *admin_acc; /* PARK_ADMIN: the engines' AdminResults so far, merged
                                              (owned), or NULL */
    uint8_t id[ID_BYTES]; /* PARK_UNKNOWN: the poll's id, tenant, offset and wait */
    uint32_t tenant;
    int is_cancel; /* PARK_UNKNOWN: a Cancel, not a Poll */
    /* The tenant slot whose share of the parked calls the call takes while parked
     * (router_may_park), or CALLER_NONE (an admin key, or before the caller is known). */
    uint32_t caller;
    int has_offset;
    uint32_t wait_ms;
    enum admin_op admin_op;                      /* PARK_ADMIN, PARK_POLICY */
    char admin_name[ROUTER_TENANT_NAME_MAX + 1]; /* ADMIN_OP_PIN: the pin */
    struct text_job *job;                        /* PARK_TEXT: the job it waits for */
    struct rctx *prev, *next;                    /* the waiter list it is parked on */
};

/* What the client asked for, with defaults applied: two Submits are the same request when
 * these are equal. */
struct submit_params {
    const int32_t *prompt;
    uint32_t num_prompt;
    const int32_t *stop_ids;
    uint32_t num_stop;
    struct sampling_params sampling; /* the seed is the router's draw unless has_seed */
    const int32_t *bias_ids;         /* the logit bias: [num_bias] (distinct ids) */
    const float *bias_values;        /* [num_bias] */
    uint32_t num_bias;
    int has_seed; /* the client chose the seed */
    int32_t max_tokens;
    int strict_max_tokens; /* prompt + max_tokens past the context is refused */
    int ignore_eos;
    int logprobs;
    int has_text;          /* the prompt is text or a chat, tokenized later (router_text.c) */
    uint64_t text_hash[2]; /* of the text fields (prompt, messages, stops, ...) */
};

struct request {
    uint8_t id[ID_BYTES];       /* the client's id, unique within its tenant */
    uint8_t sched_id[ID_BYTES]; /* the id the scheduler knows it by, unique in the router */
    uint32_t tenant;            /* index into router.slots */
    struct request *hash_next;
    struct request *prev, *next; /* the live list or the finished list (oldest first) */
    struct submit_params p;      /* prompt, stop_ids and the bias point into the arrays below */
    int32_t *prompt;
    int32_t *stop_ids;
    int32_t *bias_ids;
    float *bias_values;
    int32_t *tokens;
    float *logprobs;
    uint32_t num_tokens, cap_tokens;
    Pagoda__FinishReason finish;
    uint32_t prompt_tokens, cached_tokens;
    int cached_known; /* cached_tokens is the first admission's (router_link.c apply_event) */
    int32_t error_code;
    char *error_message;
    uint64_t finished_at_ms;
    uint64_t seen_ms;        /* the last call that named it (Submit, Poll), for abandon_ms */
    uint64_t prompt_hash[2]; /* keyed hash of prompt and stop ids (kept after they are freed) */
    size_t bytes;            /* what it holds, as counted in router.registry_bytes */
    int delivered;           /* a reply with the finish reason went out */
    int need_submit;         /* the SubmitSeq is still to be sent */
    int need_cancel;         /* the CancelSeq is still to be sent */
    struct rctx *waiters;    /* parked polls */
    uint32_t engine;         /* the engine it was sent to (ROUTE_NONE: none yet) */
    /* Engines it moved away from whose copy may still run there (bit e: engine e): it is not sent
     * back to one of them until that copy's end event arrived, or the engine's announcement after
     * its link rejoined did not name it (heard: bit e, an event from e since that join), so that
     * the old copy's end is never taken for the new one's (router_link.c). */
    uint64_t left, heard;
    int adopted;   /* registered from the scheduler's announcement */
    int no_prompt; /* adopted without its prompt (an older scheduler's announcement, or one it
                    * could not read): it is never submitted again, nor moved */
    int aliased;   /* also in router.alias_buckets (see registry_adopt) */
    struct request *alias_next;
    /* Once finished: its tenant's finished list (tenant_slot.fin_head), oldest first. */
    struct request *tprev, *tnext;
    /* The text side (router_text.c): the output text (NULL without detokenization), the job
     * turning a text or chat prompt into token ids (NULL when none is in flight), the stop string
     * that ended it (1-based index, 0 none) or the stop token id. */
    struct output_text *text;
    struct text_job *job;
    /* Its text parameters as SubmitSeq.router_text carries them to the scheduler (a packed
     * RouterText; NULL without output text), so that a router restarted meanwhile gets them back
     * in the announcement. */
    uint8_t *router_text;
    size_t router_text_len;
    int stop_index;
    int keep_stops; /* include_stop_str_in_output: the stop string's text, a stop token's too */
    int has_stop_token_id;
    int32_t stop_token_id;
};

struct req_list {
    struct request *head, *tail;
    uint32_t count;
};

/* A tenant as the registry knows it. A request holds its slot's index for its whole life, so a
 * slot outlives a reload that removes its tenant (inactive: no key reaches it) for as long as a
 * request of it is in the registry; a tenant that comes back (by name) gets its slot again. */
struct tenant_slot {
    char name[ROUTER_TENANT_NAME_MAX + 1];
    int active;     /* in the current configuration */
    uint32_t live;  /* admitted, unfinished requests */
    uint32_t limit; /* how many it may have (max_running + max_waiting); 0 when inactive */
    uint32_t refs;  /* requests in the registry, live or finished */
    /* Its finished results, oldest first, at most max_finished of them (tenants.h), and its
     * Submits answered with a request it already had (for its Stats). */
    struct request *fin_head, *fin_tail;
    uint32_t num_finished, max_finished;
    uint64_t duplicate_submits;
    uint32_t text_jobs;      /* its prompts being tokenized (router_text.c) */
    uint32_t text_calls;     /* its Tokenize calls waiting (router_text.c) */
    uint32_t parked;         /* its calls parked, of every kind (router_may_park) */
    uint32_t unknown_parked; /* of them, calls for an id not announced yet (park_unknown) */
    size_t text_call_bytes;  /* what they hold (ROUTER_MAX_TENANT_TEXT_CALL_BYTES) */
};

/* A configured pin (from the tenants file or the admin API) and what the scheduler last said of
 * it. */
struct pin_state {
    struct router_pin pin;
    int from_file;
    uint64_t version; /* the first policy version that carries it as it is now */
    int has_status;   /* a PinStatus of that version or a later one arrived */
    int ready;
    uint32_t blocks;
    int32_t error_code;
    char *error_message;
};

/* The SchedulerStats fields that are counters: each only rises within one scheduler (one worker
 * for computed_tokens). With several engines the merged figure of each is carried across an
 * engine's restarts (router_link.c engine_count), so that the sum never falls. */
#define ROUTER_COUNTERS(X)                                                                         \
    X(steps)                                                                                       \
    X(resyncs)                                                                                     \
    X(worker_restarts)                                                                             \
    X(computed_tokens)                                                                             \
    X(malformed_messages)                                                                          \
    X(preemptions)                                                                                 \
    X(prefix_query_tokens)                                                                         \
    X(prefix_hit_tokens)                                                                           \
    X(evictions)                                                                                   \
    X(discarded_tokens)                                                                            \
    X(prefix_waits)                                                                                \
    X(prefill_tokens)                                                                              \
    X(decode_tokens)                                                                               \
    X(router_drops)                                                                                \
    X(router_resends)                                                                              \
    X(worker_steps_timed)                                                                          \
    X(worker_step_wall_us_total)                                                                   \
    X(worker_step_device_us_total)
#define ROUTER_COUNTER_ENUM(f) ROUTER_COUNTER_##f,
enum { ROUTER_COUNTERS(ROUTER_COUNTER_ENUM) ROUTER_NUM_COUNTERS };
#undef ROUTER_COUNTER_ENUM

/* An engine's counters as totals over its incarnations: last is what its latest SchedulerStats
 * said, carry what earlier ones counted (a scheduler of another epoch, or a counter that fell:
 * a restarted worker's computed_tokens). */
struct engine_counters {
    int seen;       /* a SchedulerStats has arrived */
    uint64_t epoch; /* its scheduler's (ToRouter.epoch) */
    uint32_t has;   /* bit k: counter k was reported */
    uint64_t last[ROUTER_NUM_COUNTERS], carry[ROUTER_NUM_COUNTERS];
};

/* One engine link: the PAIR socket to one scheduler. Its pipe counters are written on NNG's
 * threads, everything else on the loop. */
struct engine {
    struct router *r;
    uint32_t index;
    char url[512];
    nng_socket link;
    int link_open;
    struct wire_inbox *inbox;
    atomic_int pipes;
    atomic_uint gen; /* bumped by every pipe that joins the link */
    unsigned gen_seen;
    int up;          /* usable as the loop last saw it: linked, and answering (router_link.c) */
    int need_policy; /* the current Policy is still to be sent */
    int need_hello;  /* a RouterHello is still to be sent */
    int announced;   /* its announcement has arrived */
    uint64_t applied_version; /* the latest policy version it said it applied */
    /* The liveness probe (with several engines): a StatsRequest with cookie 0 every
     * ENGINE_PROBE_MS. An engine is hung when nothing at all came from it (any message counts)
     * for stats_timeout_ms while ENGINE_HUNG_MISSED_PROBES probes or more went out, and is
     * treated as down until something comes from it again (router_link.c). */
    uint64_t probe_sent_ms;
    uint64_t heard_ms;          /* when its last message arrived (or its link joined) */
    uint32_t probes_unanswered; /* probes sent since then */
    int hung;
    Pagoda__Internal__ToRouter *stats; /* its latest SchedulerStats (owned), or NULL */
    struct engine_counters counters;
    uint64_t routed;        /* requests the router sent it (moves included) */
    uint64_t sends_refused; /* sends its link refused (full, or closed): they are tried again */
};

struct router {
    uv_loop_t *loop;
    struct router_config cfg;
    char *run_dir, *listen_url;
    struct engine *engines; /* cfg's scheduler links, in order */
    uint32_t num_engines;
    struct route *route; /* the routing decision (route.h) */
    enum route_mode routing;

    nng_socket rep;
    int rep_open;
    struct rctx *ctxs;         /* every context opened, linked by all_next */
    uint32_t num_ctxs;         /* opened */
    uint32_t num_parked;       /* parked calls (every kind) */
    uint32_t max_ctxs;         /* num_contexts + max_parked_calls + num_contexts */
    uint64_t parked_refused;   /* polls and stats answered at once because max_parked_calls were */
    uint64_t text_jobs_run;    /* text jobs that ran on the threadpool (router_text.c job_done) */
    uint32_t model_positions;  /* the model's context from ModelInfo; 0 until it arrives */
    uint32_t prompt_limit_cfg; /* cfg.max_prompt_tokens as configured (cfg's may be lowered) */
    size_t recv_max_bytes;     /* NNG_OPT_RECVMAXSZ in force */
    size_t registry_bytes;     /* held by requests in the registry (registry_account) */
    struct pipe_table *pipes;  /* client connections (router_front.c) */

    uv_async_t async;
    uv_timer_t housekeeping;
    int async_init, timer_init;
    int handles_open; /* uv handles still to close before the router is freed */

    pthread_mutex_t lock;
    int lock_init;
    struct rctx *mail_head, *mail_tail; /* guarded by lock */
    atomic_int closing;

    /* The tenancy (router_tenancy.c). */
    char *tenants_file;             /* NULL: one tenant, ROUTER_DEFAULT_TENANT, any key */
    struct router_tenants *tenants; /* the file as last loaded */
    uint32_t *slot_of;              /* the slot of each tenants->tenants[i] */
    struct tenant_slot *slots;
    uint32_t num_slots, cap_slots;
    struct pin_state *pins; /* ROUTER_MAX_PINS of room */
    uint32_t num_pins;
    uint64_t policy_version;  /* of the current tenancy; 1 at start */
    uint64_t applied_version; /* the latest every usable engine said it applied */
    /* The tenants file being read on libuv's threadpool, or NULL. */
    struct reload_job *reload;
    /* The runtime pins' file (router_pins_file.c; NULL without a run dir), its write in flight
     * (or NULL), the policy version whose pins are to be written and the one last written. */
    char *pins_path;
    struct pins_save_job *pins_save;
    uint64_t pins_wanted_version, pins_saved_version;
    /* The version of the last write, when it failed (0: it did not), and why. */
    uint64_t pins_failed_version;
    char pins_failed_detail[512];
    uint64_t id_seed;

    struct request **buckets;
    struct request **alias_buckets; /* adopted requests by sched_id_of(tenant, id) */
    size_t num_buckets;             /* a power of two */
    uint64_t hash_seed;
    struct req_list live, finished;
    uint32_t num_pending; /* requests with need_submit or need_cancel */

    struct rctx *stats_waiters;
    uint64_t stats_cookie;

    /* The admin API (router_admin.c). */
    struct rctx *admin_waiters;  /* PARK_ADMIN */
    struct rctx *policy_waiters; /* PARK_POLICY */
    struct rctx *text_waiters;   /* PARK_TEXT */
    uint64_t admin_cookie;

    uint64_t started_ms;
    uint64_t abandon_checked_ms; /* the last look for abandoned requests */
    int announced;               /* every engine's announcement has arrived */
    struct rctx *unknown_waiters;
    uint32_t num_unknown_parked;

    uint64_t malformed_requests, malformed_internal, unknown_events, event_gaps, refused_keys;
    uint64_t duplicate_submits; /* Submits of an id held, answered with that request */

    /* The model's tokenizer and chat template (router_text.c), or NULL with the reason text and
     * chats are refused. */
    struct text_holder *text;
    char text_error[512];
    uint32_t text_jobs; /* prompts being tokenized, cancelled ones included */
    struct text_job *text_pending_head, *text_pending_tail; /* waiting for their turn */
    struct text_job *text_queued; /* on libuv's threadpool, detached ones too (router closing) */
    size_t text_call_bytes;       /* what Tokenize calls' jobs hold (ROUTER_MAX_TEXT_CALL_BYTES) */

    int draining;
    uint64_t drain_deadline_ms;
    router_drained_fn drained_fn;
    void *drained_arg;
};

/* ---- router.c ---------------------------------------------------------------------------- */

/* id as 32 lowercase hex digits, for the logs. */
void router_id_hex(const uint8_t *id, char out[2 * ID_BYTES + 1]);
/* 64 random bits (getrandom; the clock should it fail): seeds and hash keys. */
uint64_t router_random_u64(void);

/* ---- router_front.c ---------------------------------------------------------------------- */

/* The table of client connections, for cap connections (front_open registers its callbacks).
 * Returns NULL when out of memory. */
struct pipe_table *front_pipes_new(uint32_t cap);
void front_pipes_free(struct pipe_table *t);
/* The client connections open now (Stats.client_connections). */
uint32_t front_pipes_count(struct pipe_table *t);
/* Closes the connections with no call in progress and no complete message for idle_ms or longer
 * (at most IDLE_CLOSE_BATCH a call; the housekeeping tick calls it). */
void front_close_idle(struct router *r, uint32_t idle_ms);
/* Opens the REP socket (message limit, connection callbacks, the first contexts) and listens on
 * r->listen_url. Errors: those of NNG (wire_error), PAGODA_ENOMEM; the caller's router_close
 * undoes what was done. */
int front_open(struct router *r);
/* Opens contexts until cfg.num_contexts are free to receive beside the parked calls, up to
 * r->max_ctxs. Errors: PAGODA_ENOMEM, those of NNG (logged; the housekeeping tick retries). */
int front_ensure_contexts(struct router *r);
/* Loop thread: handles the calls waiting in the mailbox, then keeps contexts free to receive. */
void front_on_mail(struct router *r);

/* No tenant's call (struct rctx.caller). */
#define CALLER_NONE UINT32_MAX

/* Whether c may be parked: fewer than max_parked_calls are, and, with a tenants file, its
 * tenant's parked calls are fewer than its share, ROUTER_PARKED_PER_ADMITTED for each request it
 * may have (max_running + max_waiting) and its Tokenize calls, so that one tenant's flood of polls
 * or stats calls does not take the parked calls every tenant needs. */
int router_may_park(const struct router *r, const struct rctx *c);

/* Packs resp and sends it on c's context (the context then receives its next call). */
void router_reply(struct rctx *c, Pagoda__ClientResponse *resp);
void router_reply_error(struct rctx *c, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Answers with q's tokens (and text) from offset on, its state, and its usage once finished; a
 * reply that carries the finish reason marks q delivered. */
void router_reply_update(struct rctx *c, struct request *q, uint32_t offset);
/* A Submit's answer: q's id and state, offset 0 and no tokens. */
void router_reply_submitted(struct rctx *c, struct request *q);
/* Parks c on list until timeout_ms; c->park and what it waits for are the caller's to set. */
void router_park(struct rctx **list, struct rctx *c, uint32_t timeout_ms);
void router_park_remove(struct rctx **list, struct rctx *c);
/* Takes c off whatever it is parked on and stops its timer: the call is the caller's to answer. */
void router_unpark(struct rctx *c);
/* Answers every poll parked on q that now has something to say (new tokens, or the end). */
void router_wake_waiters(struct request *q);

/* ---- router_registry.c ------------------------------------------------------------------- */

/* The request the scheduler knows by sched_id, or NULL. */
struct request *registry_find(const struct router *r, const uint8_t *sched_id);
/* Registers a request the scheduler announced (ev->announce) that this router does not hold: a
 * restarted router's. Returns NULL (logged) when it cannot: an unknown tenant, no client id with
 * a tenants file, a collision, no memory. */
struct request *registry_adopt(struct router *r, const Pagoda__Internal__TokenEvent *ev,
                               uint32_t engine);
/* Frees q and what it holds (its text side too); NULL is fine. The registry's lists and counts are
 * the caller's: registry_drop for a request in the registry. */
void registry_request_free(struct router *r, struct request *q);
/* Counts what q holds now in r->registry_bytes, after q changed. */
void registry_account(struct router *r, struct request *q);
/* Sets *flag (q->need_submit or q->need_cancel) to value, keeping r->num_pending. */
void registry_set_pending(struct router *r, struct request *q, int *flag, int value);
/* q ends with reason (error_code and error_message for FINISH_ERROR; the message is copied): it
 * moves to the finished lists, forgets its prompt and answers its parked polls. Nothing when q
 * has already finished. The caller trims (registry_trim) and, when the scheduler must stop the
 * sequence, sets need_cancel. */
void registry_finish(struct router *r, struct request *q, Pagoda__FinishReason reason,
                     int32_t error_code, const char *error_message);
/* Forgets a finished request: its id becomes unknown (PAGODA_ENOENT). */
void registry_drop(struct router *r, struct request *q);
/* Cancels, as its client's Cancel would, every live request that no call has named for
 * cfg.abandon_ms and no poll waits on (router.h ROUTER_DEFAULT_ABANDON_MS). */
void registry_cancel_abandoned(struct router *r, uint64_t now_ms);
/* A result of tenant slot finished: drops the oldest results while the tenant holds more than its
 * max_finished, then while the router holds more than max_finished_requests. */
void registry_trim(struct router *r, uint32_t slot);
/* The client calls on requests, from a tenant's key (slot tenant): each answers c or parks it. */
void registry_handle_submit(struct router *r, struct rctx *c, uint32_t tenant,
                            const Pagoda__SubmitRequest *s);
void registry_handle_poll(struct router *r, struct rctx *c, uint32_t tenant,
                          const Pagoda__PollRequest *poll);
void registry_handle_cancel(struct router *r, struct rctx *c, uint32_t tenant,
                            const Pagoda__CancelRequest *cancel);
/* A poll or cancel parked for an unknown id (PARK_UNKNOWN) is taken off and answered as if it
 * arrived now (the announcement arrived, or the router's start is ANNOUNCE_WAIT_MS past, so it is
 * not parked that way again); where its wait ran out (timed_out) before the announcement, within
 * ANNOUNCE_WAIT_MS of the start, PAGODA_EBUSY (retry). */
void registry_unpark_unknown(struct rctx *c, int timed_out);
/* A text or chat prompt's job ended: on success (rc 0) q takes ids (n of them, malloc'd) and goes
 * to the scheduler; otherwise q ends with FINISH_ERROR and detail. Either way q is q as it was
 * when the job started, unless it has finished since (then ids are freed). */
void router_prompt_ready(struct router *r, struct request *q, int rc, const char *detail,
                         int32_t *ids, size_t n);

/* ---- router_link.c ----------------------------------------------------------------------- */

/* Opens every engine's PAIR socket and dials its address without waiting (a scheduler that is
 * not there yet is dialled again and again), and the routing table. Errors: those of NNG
 * (wire_error), PAGODA_ENOMEM; the caller's router_close undoes what was done. */
int link_open_engines(struct router *r);
/* Closes the engines' sockets and inboxes (router_close); link_free_engines frees the rest. */
void link_close_engines(struct router *r);
void link_free_engines(struct router *r);
/* Loop thread: one message from an engine's scheduler (wire_inbox_open's handler, arg the
 * struct engine; takes m). */
void link_on_msg(void *arg, nng_msg *m);
/* Loop thread, on the router's async: an engine whose link joined since the loop last looked
 * gets what a new scheduler needs (the Policy, its unfinished requests, a RouterHello); one whose
 * link went down has its unfinished requests moved to another usable engine, if any. */
void link_on_async(struct router *r);
/* Housekeeping tick: the engines' liveness probes and their load for routing. */
void link_tick(struct router *r);
/* Whether a scheduler is on some engine's link (and the loop has sent it what a new one needs). */
int router_link_up(struct router *r);
/* Whether engine e is linked (as router_link_up, for one engine). */
int engine_linked(const struct engine *e);
/* The first usable engine (for the calls one engine answers), or NULL. */
struct engine *router_any_engine(struct router *r);
/* Sends what is still to be sent to the engines (the Policy first), while the links take it. */
void router_flush_pending(struct router *r);
/* Sends a ToScheduler envelope to engine e with the protocol version set. Errors: those of
 * wire_send. */
int router_send(struct engine *e, Pagoda__Internal__ToScheduler *env);
/* q finished or left the registry unfinished: its engine's load no longer counts it. */
void link_request_done(struct router *r, struct request *q);
/* The Stats call: parked until the scheduler's figures arrive (a tenant's key gets its own,
 * admin_tenant_stats), or answered at once with PAGODA_EBUSY (too many calls parked) or
 * PAGODA_ECLOSED (no scheduler on the link). */
void link_handle_stats(struct router *r, struct rctx *c, uint32_t tenant, int admin);

/* ---- router_text.c ------------------------------------------------------------------------- */

/* Takes router_text_load's result t (router.h; NULL: no --model): r->text is its tokenizer and
 * chat template, or NULL with r->text_error saying why the model serves token ids only. */
void router_text_adopt(struct router *r, struct router_text *t);
void router_text_close(struct router *r);
/* Checks a Submit's text fields (one prompt form, stop strings, the model having a tokenizer)
 * and computes the hash of what identifies them, for deduplication; *has_text is set for a text
 * or chat prompt. Errors: PAGODA_EINVAL, PAGODA_ERANGE, PAGODA_EUNSUPPORTED, with a detail. */
int router_text_read(const struct router *r, const Pagoda__SubmitRequest *s, int *has_text,
                     uint64_t hash[2]);
/* Gives q its output text (when the model has a tokenizer and the client did not turn it off;
 * s NULL: the defaults) and q->router_text, and, for a text or chat prompt, starts the job that
 * tokenizes it (q->job). Errors: those of output_text_new (a bad stop string), PAGODA_ENOMEM,
 * PAGODA_EIO. */
int router_text_attach(struct router *r, struct request *q, const Pagoda__SubmitRequest *s);
/* An adopted request's output text, from the router_text its announcement echoes (ev's; absent:
 * the defaults): the stop strings and options its first router had, so that the announced output,
 * appended from offset 0, holds back and stops as it did there. Errors: those of
 * router_text_attach, PAGODA_EFORMAT (router_text that does not unpack). */
int router_text_attach_announced(struct router *r, struct request *q,
                                 const Pagoda__Internal__TokenEvent *ev);
/* Releases q's text side; a job in flight is cancelled or left to free itself. */
void router_text_request_free(struct router *r, struct request *q);
/* The router is being freed: jobs in flight no longer report to it. */
void router_text_router_closing(struct router *r);
/* A new output token: its text. *stop is set (> 0) when it completed a stop string. */
int router_text_on_token(struct request *q, int32_t token, int *stop);
/* q ended: its job (if any) is dropped and what was held back becomes visible. Returns 1 when that
 * last text completed a stop string (the request then ends with FINISH_STOP). */
int router_text_on_finish(struct router *r, struct request *q);
/* The text of q's tokens from offset on, and the stop string that ended it, pointing into q
 * (valid until q changes; empty when q has no text). */
int router_text_fill(const struct request *q, uint32_t offset, ProtobufCBinaryData *text,
                     ProtobufCBinaryData *stop_string);
/* Where the text of each of q's tokens from offset on ends in the text router_text_fill gives
 * from offset (pagoda.proto TokenUpdate.token_text_ends): q->num_tokens - offset of them, the
 * caller's to free; NULL when q has no text, no token from offset, or no memory. */
uint32_t *router_text_token_ends(const struct request *q, uint32_t offset);
/* The bytes q's text side holds. */
size_t router_text_bytes(const struct request *q);
/* A Tokenize call (text or a chat into ids, or ids into text): checked, then parked until its
 * job on the threadpool answers it (or ROUTER_TEXT_CALL_TIMEOUT_MS pass). */
void router_text_handle_tokenize(struct router *r, struct rctx *c, uint32_t tenant,
                                 const Pagoda__TokenizeRequest *t);
/* c, parked on a Tokenize job, no longer waits for it (router_unpark): the job is dropped or,
 * on the threadpool, left to end alone. */
void router_text_call_detach(struct rctx *c);

/* ---- router_tenancy.c ---------------------------------------------------------------------- */

/* Loads r->cfg's tenants file (or sets up the one default tenant) and its pins, at policy
 * version 1, to be sent when the link comes up. Errors: those of router_tenants_load,
 * PAGODA_ENOMEM. */
int tenancy_open(struct router *r, const char *tenants_file);
/* Frees what tenancy_open and later changes allocated. */
void tenancy_close(struct router *r);

/* Who calls with api_key: *admin is set for an admin key; otherwise *slot is the tenant's slot.
 * Without a tenants file every key (or none) is the default tenant. Errors: PAGODA_EPERM (an
 * unknown key, or none). */
int tenancy_authenticate(const struct router *r, const char *api_key, uint32_t *slot, int *admin);
/* The active slot of the tenant named name, or UINT32_MAX. */
uint32_t tenancy_find_slot(const struct router *r, const char *name);
/* A request of the slot enters or leaves the registry. */
void tenancy_ref(struct router *r, uint32_t slot);
void tenancy_unref(struct router *r, uint32_t slot);

/* The configured pin named name, or NULL. */
struct pin_state *tenancy_find_pin(struct router *r, const char *name);
/* Adds the pin or replaces the one of its name (taking *pin's memory; it is zeroed). A pin
 * identical to the configured one changes nothing and returns 0 with *changed 0. Errors:
 * PAGODA_ERANGE (too many pins or pinned tokens; nothing changes). */
int tenancy_set_pin(struct router *r, struct router_pin *pin, int *changed);
/* Removes the pin. Errors: PAGODA_ENOENT. */
int tenancy_remove_pin(struct router *r, const char *name);
/* Starts reading and parsing the tenants file again on libuv's threadpool (the loop never opens
 * or reads it); admin_on_reload_read gets the outcome on the loop. Errors: PAGODA_EUNSUPPORTED
 * (no tenants file), PAGODA_EBUSY (a read is still in flight: one at a time), PAGODA_EIO (the
 * threadpool refused the work). by_signal: SIGHUP's (router_reload), whose outcome is logged. */
int tenancy_reload_start(struct router *r, int by_signal);
/* Replaces tenants, groups and file pins with t's (taking t in every case); runtime pins stay, less
 * the tenants that are gone (one left with no reader goes), unless t has one of the same name.
 * Errors: PAGODA_ERANGE (too many
 * pins with the runtime ones), PAGODA_ENOMEM: nothing changed. */
int tenancy_apply(struct router *r, struct router_tenants *t);
/* The pins each tenant of the file may read: names[offsets[i] .. offsets[i + 1]) for
 * r->tenants->tenants[i] (offsets has count + 1 entries; both are the caller's to free, the names
 * point into r->pins). Errors: PAGODA_ENOMEM. */
int tenancy_pins_by_tenant(const struct router *r, uint32_t **offsets, char ***names);
/* A scheduler joined the link: it gets the current Policy first; what another scheduler said
 * of the pins no longer holds. */
void tenancy_on_link_up(struct router *r, struct engine *e);
/* The tenancy changed: a new policy version, sent as soon as the link takes it. */
void tenancy_changed(struct router *r);
/* Sends the current Policy. Errors: those of wire_send, PAGODA_ENOMEM. */
int tenancy_send_policy(struct router *r, struct engine *e);
/* Keeps the pins' statuses of a PolicyApplied. */
void tenancy_on_policy_applied(struct router *r, const Pagoda__Internal__PolicyApplied *pa);

/* ---- router_pins_file.c -------------------------------------------------------------------- */

/* Names the runtime pins' file in the run dir and restores the pins it holds (tenancy_open, after
 * the tenants file's); what cannot be restored is logged and left out. Errors: PAGODA_ENOMEM. */
int pins_file_open(struct router *r);
/* The tenancy changed (policy_version): queues the write of the runtime pins as they are now. */
void pins_file_changed(struct router *r);
/* Lets a write in flight finish without the router; frees the rest. */
void pins_file_close(struct router *r);

/* ---- router_admin.c ------------------------------------------------------------------------ */

/* A write of the runtime pins is over (pins_saved_version): the calls that waited for it and for
 * their policy version to be applied are answered. */
void admin_on_pins_saved(struct router *r);

/* One admin call from a caller with an admin key: answered or parked. */
void admin_handle(struct router *r, struct rctx *c, const Pagoda__AdminRequest *a);
/* Engine e's AdminResult (msg, taken): once every engine asked has answered, the call is. */
void admin_on_result(struct router *r, struct engine *e, Pagoda__Internal__ToRouter *msg);
void admin_on_policy_applied(struct router *r, struct engine *e,
                             const Pagoda__Internal__PolicyApplied *pa);
/* Engine e stopped being usable: the admin calls waiting for it are answered with what the others
 * said, and the applied policy version is recomputed over the engines left. */
void admin_on_engine_down(struct router *r, struct engine *e);
/* The policy version every usable engine has applied (0 with none). */
uint64_t admin_applied_version(const struct router *r);
/* A PARK_ADMIN or PARK_POLICY call ran out of time (already unparked): answers it. */
void admin_on_timeout(struct rctx *c);
/* The tenants file a reload read: t (taken; NULL when rc is an error whose detail is detail),
 * read since started_ms. Applies it and answers the reload call, or drops it when that call is
 * no longer waiting (it timed out: the admin was told nothing changed); by_signal (SIGHUP's, no
 * call), applies it and logs the outcome. */
void admin_on_reload_read(struct router *r, struct router_tenants *t, int rc, const char *detail,
                          uint64_t started_ms, int by_signal);
/* A tenant's Stats call (with a tenants file): asks the scheduler for the figures and answers
 * with the tenant's own (and the router's figures of it), never another tenant's or the
 * engine's. */
void admin_tenant_stats(struct router *r, struct rctx *c, uint32_t slot);

#endif
