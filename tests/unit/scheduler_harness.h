/* The scheduler tests' harness: a fake worker with a fake KV pool, a recording router, and
 * the plumbing that moves packed messages between them and the scheduler (scheduler_harness.c
 * says what the fake worker checks). Shared by test_scheduler.c and test_prefix_cache.c. */
#ifndef PAGODA_TESTS_UNIT_SCHEDULER_HARNESS_H
#define PAGODA_TESTS_UNIT_SCHEDULER_HARNESS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include "common/error.h"
#include "common/log.h"
#include "scheduler/scheduler.h"
#include "wire/wire.h"
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 1000
#define EPOCH 4242
#define MAX_REQS 4096
#define REC_INDEX 8192 /* a power of two above MAX_REQS */
#define MAX_OUT 512
#define MAX_FSEQ 64
#define MAX_FTOK 4096
#define MAX_FBLK 512
#define MAX_PUMP 100000
#define FW_FAILED_CAP 8
/* ---- byte queues ---------------------------------------------------------------------------- */
struct bytes {
    uint8_t *data;
    size_t len;
};

struct queue {
    struct bytes *items;
    size_t head, count, cap;
};

/* ---- the fake worker ------------------------------------------------------------------------ */
struct fseq {
    bool live;
    uint64_t seq_id;
    int32_t tokens[MAX_FTOK];
    int n_tokens, n_prompt, computed;
    int32_t blocks[MAX_FBLK];
    int n_blocks;
};

struct fake_worker {
    int32_t pid;
    bool introduced; /* has sent a Hello since it started */
    bool has_epoch;
    uint64_t epoch;
    uint64_t expected_step;
    struct fseq seqs[MAX_FSEQ];
    int32_t *pool;    /* token id per slot, -1 never written */
    uint64_t pool_id; /* the identity of the pool it maps, in Hello and ResyncDone */
    int32_t num_blocks, block_size;
    int32_t dtype; /* its pool's K/V dtype (enum dtype) in Hello's geometry; -1: none sent */
    uint64_t computed_tokens;
    /* Behaviour knobs. */
    bool silent;        /* consume everything, answer nothing (hung) */
    int drop_steps;     /* lose this many steps */
    bool strip_results; /* answer the next step without its tokens (a broken result) */
    /* Whether to check that every preemption takes the most recently admitted sequence, the
     * scheduler's choice with one tenant (memory's preemption takes from the tenant holding the
     * most blocks where several run, fairness's from the one furthest over its share). */
    bool any_preemption;
    /* A sequence holding poison_token fails alone when it samples (as NaN logits would): an
     * error result for it, the mirror drops it, the step goes on. */
    bool poison;
    int32_t poison_token;
    /* A step holding a sequence with refuse_token is refused whole (a worker that cannot tell
     * which sequence is at fault), every time. */
    bool refuse;
    int32_t refuse_token;
    /* A resync leaves out the sequences holding resync_fail_token and lists them failed in its
     * ResyncDone (their content is wrong for this worker). */
    bool resync_fail;
    int32_t resync_fail_token;
    /* The sequences it failed (poison) in its last FW_FAILED_CAP failures, as pagoda-worker
     * remembers them: a step that continues one fails it alone (SeqResult error). */
    uint64_t failed_ids[FW_FAILED_CAP];
    int n_failed_ids;
    /* What it saw. */
    int refused_unknown; /* steps refused for continuing a sequence it does not hold */
    int failed_behind;   /* continuing sequences failed alone: failed in an earlier step */
    int steps_run, refused, ignored_steps, resyncs_done, resyncs_refused, hellos_sent;
    int max_step_tokens;
    int preempted_seen, finished_seen;
};

struct hello_opts {
    int64_t max_positions;
    int32_t eos[4];
    size_t n_eos;
    const char *fingerprint; /* the model's, in Hello (NULL: none) */
};

/* ---- the harness ---------------------------------------------------------------------------- */
struct req_rec {
    uint8_t id[SCHEDULER_REQUEST_ID_BYTES];
    int32_t out[MAX_OUT];
    float lp[MAX_OUT]; /* out's logprobs */
    int n_out;
    int finish; /* -1 while running */
    int error_code;
    int ends;
    int cached_tokens;
};

/* One TokenEvent{announce} received. */
struct ann_rec {
    uint8_t id[SCHEDULER_REQUEST_ID_BYTES];
    uint8_t client_id[SCHEDULER_REQUEST_ID_BYTES];
    bool has_client_id;
    int32_t out[MAX_OUT];
    float lp[MAX_OUT];
    int n_out;
    int finish;
    int32_t max_tokens;
    bool ignore_eos;
    bool logprobs_asked;
    char router_text[64]; /* its router_text as a string ("" for none) */
    bool tenant_ok;
    uint32_t prompt_tokens;
};

struct harness {
    struct scheduler *s;
    struct ann_rec ann[MAX_REQS];
    int n_ann, ann_done;
    struct scheduler_config cfg;
    struct hello_opts hello;
    int64_t now;
    struct queue to_worker;   /* scheduler -> fake worker */
    struct queue from_worker; /* fake worker -> scheduler */
    struct fake_worker fw;
    struct req_rec reqs[MAX_REQS];
    int n_reqs;
    int bad_id_errors;
    int ready_reports, hung_reports;
    int32_t hung_pid;
    uint64_t stats_cookie;
    uint32_t stats_running;
    uint64_t stats_steps;
    double stats_cpu_us;
    uint32_t stats_peak_in_flight;
    uint64_t stats_discarded;
    uint64_t stats_prefix_waits;
    uint64_t stats_router_drops, stats_router_resends; /* UINT64_MAX: absent */
    int stats_replies;
    int32_t rec_index[REC_INDEX]; /* 1 + the index in reqs of an id, 0: empty */
    const char *tenant;           /* what submit_full stamps ("t" when NULL) */
    bool strict_max_tokens;       /* what submit_full stamps (SubmitSeq.strict_max_tokens) */
    bool logprobs;                /* what submit_full stamps (SubmitSeq.logprobs) */
    const char *router_text;      /* and SubmitSeq.router_text (NULL: none) */
    int32_t min_tokens;           /* and its sampling's min_tokens (0: absent) */
    const int32_t *bias_ids;      /* and its logit bias (n_bias pairs) */
    const float *bias_values;
    size_t n_bias;
    /* The latest PolicyApplied and AdminResult received (unpacked copies), and counts. */
    Pagoda__Internal__PolicyApplied *applied;
    Pagoda__Internal__AdminResult *admin;
    int applied_count, admin_count;
    /* ModelInfo messages received and the last one's context. */
    int model_infos;
    int64_t model_positions;
    /* Messages to the router: while drop_router, each is lost (io_to_router says so) and
     * counted in router_dropped. router_lenient: events are taken as the router takes them
     * (tokens beyond those held appended, the ones held checked equal, an event from beyond
     * them counted in router_gaps and ignored, a repeated end checked equal); otherwise every
     * event must continue exactly where the request's output is, and nothing follows an end. */
    bool drop_router, router_lenient;
    int router_dropped, router_gaps;
};

struct setup {
    int32_t num_blocks, block_size;
    int32_t max_batched_tokens, max_seqs, max_queued;
    uint64_t fault_dup_step;
    int64_t max_positions;
    int32_t eos;
    bool no_start;
    bool cache; /* the prefix cache on (the tests of fences and timing keep it off) */
    int32_t max_steps_in_flight;       /* 0: the default (2) */
    int32_t step_timeout_per_token_us; /* 0: the default; -1: none */
};

static const struct setup DEFAULT_SETUP = {.eos = -1};

void queue_push(struct queue *q, const ProtobufCMessage *m);

bool queue_pop(struct queue *q, struct bytes *out);

void queue_clear(struct queue *q);

void queue_fini(struct queue *q);

/* ---- the reference model -------------------------------------------------------------------- */
uint32_t fnv_step(uint32_t h, int32_t v);

/* The next token after tokens[0..n). */
int32_t ref_next(const int32_t *tokens, int n);

/* The first count outputs after prompt. */
void ref_generate(const int32_t *prompt, int n_prompt, int count, int32_t *out);

void make_prompt(int seed, int n, int32_t *out);

struct fseq *fw_find(struct fake_worker *fw, uint64_t seq_id);

struct fseq *fw_add(struct fake_worker *fw, uint64_t seq_id);

int32_t *fw_slot(struct fake_worker *fw, const struct fseq *f, int pos);

/* No block 0, no block outside the pool, and no block that a live sequence will still write
 * (at or after its computed tokens) held by another live sequence: only full, computed blocks
 * are shared (prefix-cache hits). */
void fw_check_ownership(struct fake_worker *fw);

void fw_set_blocks(struct fseq *f, const int32_t *ids, size_t n);

void fw_set_tokens(struct fseq *f, const int32_t *ids, size_t n, int n_prompt);

/* The token after f's tokens, computed from what the pool holds. */
int32_t fw_sample(struct fake_worker *fw, const struct fseq *f);

/* A step result; one without err carries the step's wall and device time, fw_step_wall_us and
 * fw_step_device_us (microseconds; by default these, 1.25 and 0.75 ms: exact in binary, so that
 * sums compare exactly; a test may set others, as a broken worker would send). */
#define FW_STEP_WALL_US 1250.0
#define FW_STEP_DEVICE_US 750.0
extern double fw_step_wall_us, fw_step_device_us;
void reply_result(struct queue *out, uint64_t epoch, uint64_t step_id, int err,
                  Pagoda__Internal__SeqResult **results, size_t n, uint64_t computed);

void fw_hello(struct fake_worker *fw, const struct hello_opts *ho, struct queue *out);

void fw_resync(struct fake_worker *fw, const Pagoda__Internal__Resync *r,
               const struct hello_opts *ho, struct queue *out);

/* Whether f's tokens hold token. */
bool fw_holds(const struct fseq *f, int32_t token);

/* Whether a sequence of step st (new, or continuing and held) holds token. */
bool fw_step_holds(struct fake_worker *fw, const Pagoda__Internal__Step *st, int32_t token);

/* Runs one sequence's part of a step; returns true when it sampled (token in *token). */
bool fw_compute(struct fake_worker *fw, struct fseq *f, int num_new, int32_t *token);

void fw_step(struct fake_worker *fw, const Pagoda__Internal__Step *st, struct queue *out);

/* The process dies and a new one starts: the mirror is gone, the pool is not. */
void fw_restart(struct fake_worker *fw, int32_t pid);

/* The worker now maps a new, empty pool of the same geometry (kvpool made a new one). */
void fw_new_pool(struct fake_worker *fw, uint64_t pool_id);

struct req_rec *rec_find(struct harness *h, const uint8_t *id);

/* Indexes h->reqs[n] by its id (for a record a test fills by hand). */
void rec_index_add(struct harness *h, int n);

void io_to_worker(void *ctx, uint32_t worker_id, const Pagoda__Internal__ToWorker *m);

int io_to_router(void *ctx, const Pagoda__Internal__ToRouter *msg);

void io_to_supervisor(void *ctx, const Pagoda__Internal__Control *m);

Pagoda__Internal__ToScheduler *unpack_nng(const uint8_t *data, size_t len);

void deliver_worker_bytes(struct harness *h, const uint8_t *data, size_t len);

void deliver_router_bytes(struct harness *h, const uint8_t *data, size_t len);

void deliver_router(struct harness *h, const Pagoda__Internal__ToScheduler *m);

/* The fake worker handles one message from the scheduler; its answers wait in from_worker. */
bool worker_handle_one(struct harness *h);

/* Delivers the fake worker's answers to the scheduler. */
void deliver_answers(struct harness *h);

/* Runs the exchange until nobody has anything to say. */
void pump(struct harness *h);

/* One exchange: the worker handles what is queued, the scheduler gets its answers. */
void exchange(struct harness *h);

/* The next message to the worker, unpacked (caller frees), or NULL. */
Pagoda__Internal__ToWorker *peek_worker(struct harness *h);

void tick(struct harness *h, int64_t now);

struct harness *harness_open(const struct setup *su);

void harness_close(struct harness *h);

struct scheduler_stats stats(struct harness *h);

/* Submits request number idn with a prompt (and optionally resubmitted output). */
struct req_rec *submit_full(struct harness *h, int idn, const int32_t *prompt, int n,
                            int max_tokens, const int32_t *stop, int n_stop, bool ignore_eos);

struct req_rec *submit(struct harness *h, int idn, const int32_t *prompt, int n, int max_tokens);

void cancel(struct harness *h, const struct req_rec *r);

/* r finished with reason after exactly the reference's first n tokens for prompt. */
void expect_output(const struct req_rec *r, const int32_t *prompt, int n_prompt, int n, int reason);

/* Every request's blocks are back once everything finished and the last step was answered. */
void expect_idle_pool(struct harness *h);

#endif
