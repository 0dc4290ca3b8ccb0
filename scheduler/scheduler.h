/* The scheduler's state machine: the truth about every sequence of one KV pool.
 *
 * A pure module: no sockets, no wall clock. The caller (scheduler_main.c, or a test) feeds it
 * events: messages from the router link and from each worker link (already unpacked with
 * wire_unpack; NULL stands for a message that failed to unpack) and timer ticks carrying the
 * current time in milliseconds. It answers through the callbacks of struct scheduler_io:
 * ToWorker messages (steps and resyncs), ToRouter messages (token events and stats) and Control
 * messages for the supervisor (ready, hung worker). docs/protocol.md tells the message flow;
 * this header says what this scheduler does within it.
 *
 * Policy (continuous batching with chunked prefill). Requests join at step boundaries. Each
 * step takes, in admission order, one decode token for every running sequence whose known
 * tokens are all computed but the last, then prefill chunks of running sequences still
 * prefilling, then admits waiting sequences (FIFO, preempted ones at the front; between tenants,
 * the first waiting sequence of the tenant running the fewest comes first, so that one tenant's
 * long queue cannot hold the others' requests behind it) while
 *   - the step has token budget left (max_batched_tokens counts decode and prefill tokens),
 *   - fewer than max_seqs sequences are running, and
 *   - the free blocks, less those still owed to admitted sequences that are prefilling, cover
 *     the whole sequence plus one token (blocks are allocated per step, for the tokens of the
 *     step, but admission is checked against the whole prompt so that prefills rarely stall).
 * A sequence samples when its chunk reaches the end of its known tokens. When a running
 * sequence needs a block and none is free, the most recently admitted running sequence is
 * preempted: its blocks are released, it is told to the worker in preempted_seq_ids and goes
 * back to the front of the waiting queue to recompute prompt + output so far (with a new
 * seq_id; the request id and output offsets are unchanged). A step that preempted admits
 * nobody.
 *
 * Steps in flight (cfg.max_steps_in_flight, 1 or 2; 2 by default). With 2 the scheduler forms and
 * sends step n+1 as soon as step n is sent, from what step n will have written: every sequence
 * that samples in step n decodes its next position in step n+1 (the worker decodes from its own
 * sampled token: ContinuingSequence carries none), a prefill continues after its chunk in flight,
 * and the blocks are allocated for those positions. One exception waits for step n's result: a
 * sequence whose token of step n will end it by length (max_tokens, the context); a sequence's
 * first sample since its admission is decoded ahead like any other. A sequence that a stop token
 * (EOS, a stop id) ends in step n has its token of step n+1 discarded, never sent to the router
 * (at most one wasted token per request: stats.discarded_tokens). A sequence the worker fails in
 * step n (a SeqResult error) ends there, once: nothing past the failure reaches the router, its
 * blocks stay fenced on the last step sent, and the worker fails it alone in step n+1 too
 * (docs/protocol.md), a result that names a sequence that has ended and is ignored (no second
 * report, no resync). A worker that refused step n+1 instead would cost one resync. When step n's
 * result arrives while step n+1 is out, step n+2 is formed. Right after a resync (until a step is
 * accepted), while a refused step is being isolated, and with max_steps_in_flight 1, one step is in
 * flight at a time (lock-step). Steps carry (epoch, step_id) and step ids are never reused (a
 * resync continues the numbering). Results are applied in the order the steps were sent: a result
 * of the oldest outstanding step is applied; one of a later outstanding step (the oldest's result
 * is missing or out of order) triggers a resync; others (older, another epoch) are ignored and
 * counted (stats.ignored_messages). An error StepResult of this epoch for any step already sent
 * (the worker refused a step) triggers a resync, as do a malformed message on a worker link, a
 * result that breaks the protocol (a token for a sequence that did not sample, a missing token, a
 * token outside the vocabulary), and a step or resync unanswered for its timeout.
 *
 * Step timeouts scale with the step's work: the oldest outstanding step must be answered within
 * result_timeout_ms + step_timeout_per_token_us * (its tokens) / 1000, counted from when it could
 * start (when it was sent, or for a step sent behind another, when the previous step's result
 * arrived); a resync within result_timeout_ms. So a slow worker (the sanitizer build's CPU worker
 * on a step of thousands of prompt tokens) is not resynced in a loop that never catches up. The
 * watchdog allows the same per-token time on top of watchdog_ms for the step the worker is on.
 *
 * Errors of one sequence never stall the others. A SeqResult with an error_code (the worker
 * failed that sequence alone: its logits, its sampling, its length or ids) ends that request
 * with FINISH_ERROR, the worker's code and message (stats.failed_seqs); nothing of the step
 * counts for it and its blocks are released; every other sequence of the step is applied. A step
 * refused right after a resync is not sent again as it was: its sequences become suspects, the
 * next steps run only a probe (half of them; nobody else runs and nobody is admitted meanwhile),
 * a refused probe becomes the suspects and an accepted one clears itself, and a lone suspect
 * refused right after a resync fails with the refusal's code and message
 * (stats.isolated_seqs). A first refusal after accepted steps only resyncs (the mirror may have
 * diverged). So a worker that refuses every step still fails requests one by one, answering
 * each client, instead of being resent the same step forever. When
 * the result of a step that timed out arrives after all (a slow step, not a lost one), the
 * timeout doubles for the rest of that worker process's life (at most
 * SCHEDULER_MAX_TIMEOUT_BACKOFF times), so that a step longer than the timeout cannot be
 * resynced and replayed forever.
 *
 * Resync: Resync{epoch, resync_id, next_step_id = last step id sent + 1, seqs} with a snapshot
 * of every running sequence as acknowledged: num_computed_tokens excludes the steps in flight,
 * whose results are discarded and recomputed by later steps. Until the worker's first Hello the
 * scheduler announces itself every SCHEDULER_ANNOUNCE_MS with an empty resync of its epoch
 * (not counted in stats.resyncs): a worker that outlived the previous scheduler learns the new
 * epoch from it. So a worker sends Hello before it answers a Resync whose epoch differs from its
 * own (none at start); a ResyncDone from a worker that has not sent a Hello is ignored, since the
 * Hello carries what the scheduler needs (EOS ids, vocabulary, context length, pid). After a Hello
 * (a new or restarted worker), a resync with the snapshot follows. A repeated Hello from the same
 * pid while that resync is on its way is ignored; a Hello with another pid counts as a worker
 * restart.
 *
 * The pool's identity: the block table describes one pool, kvpool's at start (geometry.pool_id),
 * and every non-announcing resync names it. A Hello must name the pool the worker mapped, of the
 * table's geometry (num_blocks, block_size, num_layers, dtype), or it is refused. A refused Hello
 * from another process than the accepted worker detaches the link: the step in flight is
 * forgotten and nothing is sent to the link (no resync, no step, no announcement) until a Hello
 * is accepted; a refused Hello from the accepted worker itself changes nothing. An accepted Hello
 * naming another pool (kvpool made a new one) means what the table says is in the pool is not:
 * the whole prefix cache is dropped (pins are computed again), every running sequence is
 * preempted to recompute its prompt and output so far, and the new pool becomes the table's
 * (stats.pool_changes). A worker on the same pool (restarted, or kvpool restarted and re-adopted
 * the pool) recomputes nothing. A ResyncDone naming another pool is ignored.
 *
 * Blocks are freed only once no step in flight can write them (block_manager.h): a finished,
 * cancelled or preempted sequence's blocks are fenced on the last step sent (with two steps in
 * flight, the later one) and return to the free list when that step's result, or a later
 * ResyncDone, arrives. Finished and cancelled sequences the worker knows are named in the next
 * step's finished_seq_ids; a sequence that ended while a step holding it is in flight is still
 * computed by that step (its result is ignored).
 *
 * Stop conditions, checked on each sampled token in this order: an EOS id from the worker's
 * Hello (unless ignore_eos) or one of the request's stop ids: FINISH_STOP; max_tokens output
 * tokens (0 or absent: no limit but the context): FINISH_LENGTH; the context is full (prompt +
 * output reaches the context limit, min(max_position_embeddings, usable blocks * block_size)):
 * FINISH_LENGTH. The stopping token is part of the output.
 *
 * Requests are refused with a TokenEvent carrying error_code, error_message and
 * finish_reason FINISH_ERROR (the request id echoed as received): a request id that is not
 * SCHEDULER_REQUEST_ID_BYTES long, an empty or over-long prompt (prompt + 1 above the pool,
 * checked at submission, or above the model's context, checked at submission once a worker has
 * said Hello and again at admission), with strict_max_tokens a first submission whose prompt +
 * max_tokens pass the context (checked at submission against the context without pins, and
 * when it is first admitted against the context then, less the blocks of pins being computed;
 * pins taken once it runs, by a later policy, can still end it by the context), a
 * token id outside the vocabulary, invalid sampling parameters, too many stop ids, negative
 * max_tokens, or a full queue (running + waiting = max_queued: PAGODA_EEXHAUSTED). A submit of
 * a request id already queued or running is ignored (the router deduplicates; a repeat is a
 * resend). A cancel of an unknown id is ignored.
 *
 * Announcement: a RouterHello (sent by a router whenever its link comes up) is answered with
 * one TokenEvent{announce} per request held, running, waiting or among the last
 * SCHEDULER_MAX_RECENT_ENDED that ended (refusals at submission and at admission among them;
 * of an id submitted again after it ended, only the newest): offset 0, every
 * output token with its logprob (0 for the output a request was resubmitted with, whose
 * logprobs the scheduler never had), prompt_tokens, cached_tokens, tenant, max_tokens,
 * ignore_eos, the SubmitSeq's client_request_id, and the finish reason (with the error) of one
 * that ended; the last message carries TokenEvents.announce_done.
 *
 * Lost messages to the router: the router takes an event's tokens only in order (an event from
 * beyond the output it holds is ignored), so one lost event would leave its request without an
 * end for ever. When io.to_router reports a message it could not deliver (the link's buffers
 * full: a router stopped, starved or behind a slow link; or none connected), stats.router_drops
 * counts it and scheduler_tick sends the ModelInfo and the same events as an announcement's
 * (requests with no output and no end left out), without announce (a router adopts no request
 * from them) and without announce_done, or as an announcement when the lost message was one.
 * The first resend comes SCHEDULER_ROUTER_RESEND_MS after the last; each stops at its first lost
 * message and doubles the wait, up to SCHEDULER_ROUTER_RESEND_MAX_MS, until one goes through
 * whole (stats.router_resends counts them). Meanwhile up to SCHEDULER_MAX_RECENT_BEHIND ended
 * requests are kept (refusals at submission apart: up to 8 * SCHEDULER_MAX_RECENT_REFUSED). The
 * router appends what it lacks and ignores the rest. stats.router_drops and router_resends go to
 * the router in SchedulerStats. Not covered: more ends than those bounds during one loss, a
 * refusal of a request id that is not 16 bytes or for want of memory, and the replies (Stats,
 * PolicyApplied, AdminResult), which are not resent.
 *
 * Watchdog: a worker that owes an answer (a step or a resync is outstanding) and has sent no
 * message at all for watchdog_ms is reported once per incident with Control{hung_worker_id,
 * hung_worker_pid} (the pid of its latest Hello); any message from it ends the incident.
 *
 * Prefix cache (prefix_cache.h; cfg.prefix_cache, on by default). At admission a sequence's
 * known tokens are looked up: first the pinned prefixes its tenant may read (the one matching
 * most blocks), then its own namespace (its tenant's "t:NAME", or its group's), never the block
 * holding its last token. Hits join its table as computed tokens (shared, read-only), and the
 * first admission's hit counts as usage.cached_tokens (min(hit tokens, prompt tokens), on every
 * TokenEvent). After a step is acknowledged, the full blocks it completed are published in the
 * sequence's namespace (a block whose key is cached already stays private, and so do the
 * blocks after it: a block is published only under a parent entry the sequence holds). Admission
 * counts evictable cached blocks as available; allocation evicts (prefix_cache_evict_one) before it
 * preempts. A sequence that ends or is preempted drops its references on cached blocks at once (no
 * step writes them) and fences the rest. Before a step is sent, every block it writes is checked to
 * be neither cached nor shared: a violation is a bug, logged, and the scheduler aborts (the
 * supervisor restarts it). The root key covers the worker's model fingerprint (Hello) and the
 * pool's dtype; a new fingerprint flushes the cache and recomputes the pins.
 *
 * Tenancy (the router's Policy, internal.proto): namespaces and their quotas, each tenant's
 * namespace, cap on running sequences (admission passes over a tenant at its cap) and readable
 * pins, and the pins with their tokens. Each Policy replaces the last; tenants it does not name
 * get a namespace of their own, no cap and no pins. A new pin is computed by a sequence of its
 * own (queued first, greedy, one sampled token discarded, no events) whose full blocks are then
 * pinned; a pin that leaves the policy is unpinned (its blocks become ordinary cached blocks).
 * The pins together hold at most half the pool's usable blocks: a pin past that fails
 * (PAGODA_EEXHAUSTED), so that pins never shrink the context of every sequence to nothing; a
 * failed pin named again by the next policy is tried again.
 * PolicyApplied{version, pins} answers once no pin is being computed. AdminCall answers
 * AdminResult: per-tenant figures (lookups, hits, query and hit tokens, running, waiting),
 * per-namespace figures (cached blocks, quota, evictions, inserted), pins; or flushes a
 * namespace ("p:" ones are refused: unpin them).
 *
 * Not thread-safe: one loop owns a scheduler. */
#ifndef PAGODA_SCHEDULER_SCHEDULER_H
#define PAGODA_SCHEDULER_SCHEDULER_H

#include "kvpool/geometry.h"
#include "proto/internal.pb-c.h"

#include <stdint.h>

/* Worker groups per scheduler. Only one is supported now (data parallelism, one pool per
 * group, comes later); scheduler_open refuses others. */
#define SCHEDULER_MAX_WORKERS 1
#define SCHEDULER_DEFAULT_MAX_BATCHED_TOKENS 2048
#define SCHEDULER_DEFAULT_MAX_SEQS 256
#define SCHEDULER_DEFAULT_MAX_QUEUED 4096
#define SCHEDULER_DEFAULT_RESULT_TIMEOUT_MS 2000
#define SCHEDULER_DEFAULT_WATCHDOG_MS 10000
/* Steps sent before the previous one's result arrives: 1 (lock-step) or 2 (the default: the
 * scheduler's work and the round trip overlap the worker's step). */
#define SCHEDULER_MAX_STEPS_IN_FLIGHT 2
#define SCHEDULER_DEFAULT_STEPS_IN_FLIGHT 2
/* Time a step may take per token it computes, on top of result_timeout_ms (and watchdog_ms).
 * The release build's CPU worker prefills 2000 tokens of the tiny model in one step in about
 * 3.5 s on a loaded 2-core machine (1.75 ms per token; pagoda-run --max-batched-tokens 2048),
 * the sanitizer build's in about 34 s (17 ms per token: give it --step-timeout-per-token-us
 * 20000 or more); a GPU is thousands of times faster. 5 ms per token lets a 2048-token step take
 * 2 s + 10.2 s before it is resynced, while a lost step or result is still found at once by
 * the next step's answer (two steps in flight). 0: the fixed timeout alone. */
#define SCHEDULER_DEFAULT_STEP_TIMEOUT_PER_TOKEN_US 5000
#define SCHEDULER_MAX_STEP_TIMEOUT_PER_TOKEN_US 1000000
/* Upper limits of the configuration values above. */
#define SCHEDULER_MAX_BATCHED_TOKENS_LIMIT (1 << 20)
#define SCHEDULER_MAX_SEQS_LIMIT 65536
#define SCHEDULER_MAX_QUEUED_LIMIT (1 << 20)
#define SCHEDULER_MAX_TIMEOUT_MS (24 * 3600 * 1000)
/* A worker whose result arrives after its step timed out is slow, not lost: the timeout
 * doubles, at most this many times, until the worker process changes. */
#define SCHEDULER_MAX_TIMEOUT_BACKOFF 5
/* How often the scheduler announces its epoch to a worker it has not heard from. */
#define SCHEDULER_ANNOUNCE_MS 500
/* Ended requests kept (tokens, not blocks) for the announcement a restarted router asks for
 * with RouterHello, and the most tokens one announcement message carries (output, and the
 * prompts of the requests not ended). */
#define SCHEDULER_MAX_RECENT_ENDED 1024
#define SCHEDULER_ANNOUNCE_TOKENS (1 << 20)
/* After a message to the router could not be delivered, the scheduler sends every request it
 * holds (and the recently ended) again from output offset 0 this long after the last resend,
 * twice as long after each resend lost too, up to the maximum (see "Lost messages to the
 * router" above); while one is pending, up to SCHEDULER_MAX_RECENT_BEHIND ended requests are
 * kept. */
#define SCHEDULER_ROUTER_RESEND_MS 1000
#define SCHEDULER_ROUTER_RESEND_MAX_MS 8000
#define SCHEDULER_MAX_RECENT_BEHIND (8 * SCHEDULER_MAX_RECENT_ENDED)
/* Refusals at submission are kept the same way in a list of their own, so that a client whose
 * submissions are refused as fast as it sends them cannot push out other clients' ends: this
 * many, or 8 times as many while a resend is pending. */
#define SCHEDULER_MAX_RECENT_REFUSED 256
/* The most bytes of a SubmitSeq's router_text held (the router's stop strings: 16 of 256 bytes);
 * a longer one is not the router's and is not kept. */
#define SCHEDULER_MAX_ROUTER_TEXT 8192u
/* The longest worker's error message kept for a request that failed (longer ones are cut). */
#define SCHEDULER_ERROR_MESSAGE_MAX 256
/* Request ids are 128-bit. */
#define SCHEDULER_REQUEST_ID_BYTES 16
/* Per request: stop token ids; per worker: EOS ids. */
#define SCHEDULER_MAX_STOP_IDS 64
#define SCHEDULER_MAX_EOS_IDS 64
/* The longest prompt (and resubmitted output) accepted before any worker has told the
 * context length; the context limit applies on top. */
#define SCHEDULER_MAX_PROMPT_TOKENS (1 << 20)
/* The largest vocabulary and context a worker may announce (model_config.c refuses a model past
 * them where it reads config.json). */
#define SCHEDULER_MAX_VOCAB (1 << 24)
#define SCHEDULER_MAX_POSITIONS (1 << 24)

struct scheduler_config {
    uint64_t epoch;                    /* this scheduler's epoch; must not be 0 */
    int32_t num_workers;               /* 1 */
    int32_t max_batched_tokens;        /* tokens per step, decode and prefill; >= max_seqs */
    int32_t max_seqs;                  /* running (admitted) sequences, hence sequences per step */
    int32_t max_queued;                /* running + waiting sequences; >= max_seqs */
    int32_t result_timeout_ms;         /* a step or resync unanswered this long is resynced */
    int32_t watchdog_ms;               /* a silent worker owing an answer this long is reported */
    int32_t max_steps_in_flight;       /* 1 or 2 (SCHEDULER_MAX_STEPS_IN_FLIGHT) */
    int32_t step_timeout_per_token_us; /* added to both timeouts per token of the step */
    int prefix_cache;            /* 1: look prompts up in the prefix cache and publish blocks */
    uint64_t fault_dup_step;     /* tests: send this step id twice (0: off) */
    struct kv_geometry geometry; /* the pool, as kvpool reports it */
};

/* Defaults for everything but epoch (0) and geometry (zeroed): the caller sets those. */
void scheduler_config_default(struct scheduler_config *cfg);

/* Where the scheduler's messages go. Each callback receives a message built in the
 * scheduler's memory, valid only during the call (pack it, do not keep it), with
 * protocol_version set. Callbacks must not call into the scheduler. A message the callback
 * cannot deliver may be dropped: a lost step or resync times out; a token event that to_router
 * reports lost (nonzero) is made good by a resend ("Lost messages to the router" above). */
struct scheduler_io {
    void *ctx;
    void (*to_worker)(void *ctx, uint32_t worker_id, const Pagoda__Internal__ToWorker *msg);
    /* 0: delivered (queued to the router); nonzero: dropped. */
    int (*to_router)(void *ctx, const Pagoda__Internal__ToRouter *msg);
    void (*to_supervisor)(void *ctx, const Pagoda__Internal__Control *msg);
};

/* The longest step time a worker's result may report and have counted (microseconds: a day). */
#define SCHEDULER_STEP_US_MAX 86400e6

/* Counters and gauges. The first group mirrors proto SchedulerStats; num_blocks counts the
 * blocks that can be handed out (the pool's less block 0), free_blocks those on the free list
 * now, kv_usage = 1 - free_blocks / num_blocks. */
struct scheduler_stats {
    uint32_t running, waiting, peak_running;
    uint64_t steps, resyncs, worker_restarts;
    int32_t num_blocks, free_blocks;
    double kv_usage; /* 1 - (free + evictable cached blocks) / num_blocks */
    double peak_kv_usage;
    double fragmentation; /* running sequences' allocated slots holding no token / all of them */
    /* Tokens computed by acknowledged steps, for the sequences still held when the result
     * arrives (a sequence cancelled, failed or preempted while its step ran is not counted, so
     * these can add up to less than computed_tokens): decode = one token of a sequence whose
     * known tokens were all computed but the last, which it had sampled; prefill = every other
     * (prompt chunks, recomputation after a preemption). */
    uint64_t prefill_tokens, decode_tokens;
    /* Page locality of the running sequences' tables: the share of consecutive logical blocks
     * (i, i+1) whose physical ids are consecutive (1 when no table has two blocks), and the mean
     * length of the physically consecutive runs (0 with no block). */
    double locality, locality_run_length;
    uint32_t cached_blocks, pinned_blocks, evictable_blocks;
    uint64_t prefix_query_tokens, prefix_hit_tokens, evictions;
    /* Requests whose admission waited (once or more) for another sequence to compute the next
     * block of their prefix (the requests behind them waited too: the first request that cannot
     * start stops admissions). */
    uint64_t prefix_waits;
    uint64_t computed_tokens; /* the worker's counter from its latest StepResult */
    uint64_t malformed_messages;
    uint64_t preemptions;
    double step_cpu_us; /* mean thread CPU time per step: forming it and handling its result */
    /* Beyond the proto. */
    uint64_t ignored_messages;     /* results and ResyncDones of another epoch, step or resync */
    uint64_t refused_steps;        /* StepResults with an error code (but while a resync is on its
                                      way: those are ignored_messages) */
    uint64_t failed_seqs;          /* sequences ended by an error of their own in a step */
    uint64_t isolated_seqs;        /* of them, found by isolating a refused step */
    uint64_t result_timeouts;      /* steps or resyncs unanswered for result_timeout_ms */
    uint64_t hung_reports;         /* Control{hung_worker_id} sent */
    uint64_t rejected_requests;    /* submits answered with an error event */
    uint64_t finished_requests;    /* requests that ended (any finish reason but error) */
    uint64_t refused_hellos;       /* Hellos refused (bad fields, another pool geometry) */
    uint64_t pool_changes;         /* Hellos naming another pool than the block table's */
    uint64_t fairness_preemptions; /* of preemptions, those that gave a tenant under its share
                                      of max_seqs a place (scheduler_step.c) */
    uint64_t pool_id;              /* the pool the block table describes now */
    int32_t deferred_blocks;       /* blocks waiting for a step to be acknowledged */
    int64_t result_timeout_ms;     /* in force now (see SCHEDULER_MAX_TIMEOUT_BACKOFF) */
    uint32_t steps_in_flight;      /* steps sent and not answered now */
    uint32_t peak_steps_in_flight;
    uint64_t discarded_tokens; /* sampled tokens dropped: their sequence ended or was preempted
                                  while the step ran (a stop found one step late, a cancel) */
    uint64_t router_drops;     /* messages to the router that io.to_router could not deliver */
    uint64_t router_resends;   /* resends of the requests held after such a loss */
    /* The current worker's mean wall and device time per step (its StepResult totals over its
     * steps run), microseconds; 0 until it reports them. */
    double worker_step_wall_us, worker_step_device_us;
    /* Over the scheduler's life, every worker's: step results carrying their times (both in 0 ..
     * SCHEDULER_STEP_US_MAX), and the sums of those times, microseconds (proto SchedulerStats'
     * worker_step_*_total). */
    uint64_t worker_steps_timed;
    double worker_step_wall_us_sum, worker_step_device_us_sum;
    int ready; /* the worker answered a resync (Control{ready} was sent) */
};

struct scheduler;

/* Creates a scheduler; nothing is sent until the first scheduler_tick (which announces the
 * epoch to the workers). cfg and io are copied. On success *out is the caller's, released with
 * scheduler_close. Errors: PAGODA_EINVAL (NULL argument, epoch 0, a callback missing),
 * PAGODA_EUNSUPPORTED (num_workers other than 1), PAGODA_ERANGE (a configuration value or the
 * geometry out of range; the detail names it), PAGODA_ENOMEM. */
int scheduler_open(const struct scheduler_config *cfg, const struct scheduler_io *io,
                   struct scheduler **out);

/* Frees the scheduler and every sequence it holds (nothing is sent). Accepts NULL. */
void scheduler_close(struct scheduler *s);

/* A message from the router link (NULL: it did not unpack, and is counted as malformed):
 * submit, cancel or stats request. Anything else is counted as malformed. */
void scheduler_on_router(struct scheduler *s, const Pagoda__Internal__ToScheduler *msg,
                         int64_t now_ms);

/* A message from worker link worker_id (NULL: it did not unpack): Hello, StepResult or
 * ResyncDone. A malformed message is counted and leads to a resync of that worker (once it
 * has said Hello). Messages for a worker_id >= num_workers are ignored. */
void scheduler_on_worker(struct scheduler *s, uint32_t worker_id,
                         const Pagoda__Internal__ToScheduler *msg, int64_t now_ms);

/* Timer: announces the epoch to workers not heard from yet, resyncs a worker whose step or
 * resync timed out, runs the watchdog, and starts a step when the worker is idle and there is
 * work. Call it every few tens of milliseconds with a monotonic now_ms. */
void scheduler_tick(struct scheduler *s, int64_t now_ms);

/* Fills *out with the current counters. */
void scheduler_get_stats(const struct scheduler *s, struct scheduler_stats *out);

/* Tests: checks the block invariants (no block both free and referenced; each block's reference
 * count equals the tables holding it, plus the cache's reference, plus the drops deferred to a
 * fence; the cache's own bookkeeping; per-tenant running counts). Returns 0, or -1 with a
 * reason in *why. */
int scheduler_check_invariants(const struct scheduler *s, const char **why);

#endif
