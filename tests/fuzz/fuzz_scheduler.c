/* libFuzzer target: the scheduler's handlers of internal messages (scheduler/scheduler.h), from
 * the router link and from a worker link.
 *
 * The input is a script for a fresh scheduler: its first bytes choose a small configuration (a
 * pool of 9 to 64 blocks, up to 8 sequences, the prefix cache on or off), then each command
 * either delivers raw bytes as a message on one of the links (what a broken or hostile peer
 * sends; unpacked as pagoda-scheduler unpacks them), or a well-formed message built from the
 * input's bytes (submits, cancels, policies, admin calls, Hellos), or lets time pass, or lets the
 * worker answer. The worker is the real worker's logic: its mirror (worker/mirror.h) applies
 * each Step and Resync the scheduler sent, exactly as pagoda-worker does, and answers with
 * tokens taken from the input (sometimes an EOS id, sometimes outside the vocabulary), with the
 * sequences a step or resync failed alone (SeqResult.error_code, ResyncDone.failed; sometimes
 * a row that cannot be sampled) and the pool it maps (a new one when kvpool restarts). So the
 * scheduler is driven through long, valid exchanges that hostile bytes can interrupt at any
 * point.
 *
 * Checked after every command: the scheduler's block invariants (scheduler_check_invariants),
 * and every message it sends packs and unpacks again. Any crash, leak or sanitizer report is a
 * finding; so is a step of the scheduler's that the mirror refuses while no raw worker message
 * has been delivered and no message lost (the worker is then the real one on a perfect link, and
 * a refused step is a protocol bug), except the steps sent behind one whose forward pass failed
 * as a whole, until the next resync (with two steps in flight the scheduler has already sent the
 * next one; docs/protocol.md). A step sent behind one that failed a sequence alone (its content,
 * a row that cannot be sampled), which the scheduler forms before it knows (it decodes every
 * sequence ahead from its first sample on), must not be refused: the mirror fails that sequence
 * alone again. */
#include "common/error.h"
#include "common/log.h"
#include "scheduler/scheduler.h"
#include "worker/mirror.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VOCAB 300
#define EOS_ID 2
#define MAX_POSITIONS 512
#define WORKER_MAX_SEQS 8
#define WORKER_MAX_BATCHED 128
#define PENDING_CAP 64 /* messages to the worker not answered yet; older ones are lost */
#define MAX_PROMPT 48
#define ID_CHOICES 16

/* PAGODA_FUZZ_VERBOSE=1: each command, the worker's answers and the scheduler's counters after
 * the input are printed (to check what a seed does). */
static bool verbose;

/* ---- reading the input ------------------------------------------------------------------- */

struct input {
    const uint8_t *p;
    size_t left;
};

static uint8_t u8(struct input *in)
{
    if (in->left == 0)
        return 0;
    in->left--;
    return *in->p++;
}

static uint16_t u16(struct input *in)
{
    return (uint16_t)(u8(in) | u8(in) << 8);
}

/* A token id: mostly in the vocabulary, sometimes EOS, sometimes just outside. */
static int32_t token(struct input *in)
{
    uint8_t b = u8(in);
    if (b == 255)
        return VOCAB;
    if (b == 254)
        return -1;
    if (b >= 240)
        return EOS_ID;
    return (int32_t)(b + (uint32_t)u8(in) * 240u) % VOCAB;
}

/* ---- the harness ------------------------------------------------------------------------- */

struct packed {
    uint8_t *data;
    size_t len;
};

struct fuzz {
    struct scheduler *s;
    struct scheduler_config cfg;
    int64_t now;
    struct mirror *mirror;
    int32_t pid;
    uint64_t pool_id; /* the pool the worker maps (a new one when kvpool restarts too) */
    bool lenient;     /* raw bytes reached the worker link, or a message was lost: refusals may be
                       * legitimate */
    bool broken;      /* a forward pass failed: the steps the scheduler sent behind it (two in
                       * flight) are refused until the next resync, legitimately */
    struct packed pending[PENDING_CAP];
    size_t head, count;
    uint64_t policy_version, cookie;
    uint64_t computed_tokens;
    bool router_down; /* io_to_router reports every message lost (the resend path runs) */
};

static void die(const char *what, const char *why)
{
    fprintf(stderr, "fuzz_scheduler: %s: %s\n", what, why);
    abort();
}

/* Packs m; when keep is set the bytes are returned (caller frees), else they are only checked
 * to unpack again. */
static uint8_t *pack_check(const ProtobufCMessage *m, size_t *len, bool keep)
{
    size_t n = protobuf_c_message_get_packed_size(m);
    uint8_t *buf = malloc(n ? n : 1);
    if (buf == NULL)
        abort();
    protobuf_c_message_pack(m, buf);
    ProtobufCMessage *again = protobuf_c_message_unpack(m->descriptor, NULL, n, buf);
    if (again == NULL)
        die("pack", "a message of the scheduler's does not unpack");
    protobuf_c_message_free_unpacked(again, NULL);
    if (!keep) {
        free(buf);
        return NULL;
    }
    *len = n;
    return buf;
}

static void io_to_worker(void *ctx, uint32_t worker_id, const Pagoda__Internal__ToWorker *msg)
{
    struct fuzz *f = ctx;
    if (worker_id != 0)
        die("to_worker", "a worker id other than 0");
    struct packed p;
    p.data = pack_check(&msg->base, &p.len, true);
    if (f->count == PENDING_CAP) { /* lost on the link */
        f->lenient = true;
        free(f->pending[f->head].data);
        f->head = (f->head + 1) % PENDING_CAP;
        f->count--;
    }
    f->pending[(f->head + f->count) % PENDING_CAP] = p;
    f->count++;
}

static int io_to_router(void *ctx, const Pagoda__Internal__ToRouter *msg)
{
    const struct fuzz *f = ctx;
    pack_check(&msg->base, NULL, false);
    return f->router_down ? -1 : 0;
}

static void io_to_supervisor(void *ctx, const Pagoda__Internal__Control *msg)
{
    pack_check(&msg->base, NULL, false);
}

/* Delivers m as it would arrive: packed by the sender, unpacked by pagoda-scheduler. */
static void deliver(struct fuzz *f, bool from_worker, const Pagoda__Internal__ToScheduler *m)
{
    size_t len;
    uint8_t *buf = pack_check(&m->base, &len, true);
    Pagoda__Internal__ToScheduler *u = pagoda__internal__to_scheduler__unpack(NULL, len, buf);
    free(buf);
    if (from_worker)
        scheduler_on_worker(f->s, 0, u, f->now);
    else
        scheduler_on_router(f->s, u, f->now);
    if (u != NULL)
        pagoda__internal__to_scheduler__free_unpacked(u, NULL);
}

static void deliver_raw(struct fuzz *f, bool from_worker, struct input *in)
{
    size_t n = u16(in) % 512;
    if (n > in->left)
        n = in->left;
    Pagoda__Internal__ToScheduler *u = pagoda__internal__to_scheduler__unpack(NULL, n, in->p);
    in->p += n;
    in->left -= n;
    if (from_worker) {
        f->lenient = true;
        scheduler_on_worker(f->s, 0, u, f->now);
    } else {
        scheduler_on_router(f->s, u, f->now);
    }
    if (u != NULL)
        pagoda__internal__to_scheduler__free_unpacked(u, NULL);
}

/* ---- the worker -------------------------------------------------------------------------- */

static void worker_start(struct fuzz *f, int32_t pid)
{
    mirror_free(f->mirror);
    f->mirror = NULL;
    const struct kv_geometry *g = &f->cfg.geometry;
    int64_t max_tokens = MAX_POSITIONS;
    if (max_tokens > (int64_t)(g->num_blocks - 1) * g->block_size)
        max_tokens = (int64_t)(g->num_blocks - 1) * g->block_size;
    struct mirror_limits ml = {.max_seqs = WORKER_MAX_SEQS,
                               .max_tokens_per_seq = (int32_t)max_tokens,
                               .max_batched_tokens = WORKER_MAX_BATCHED,
                               .num_blocks = g->num_blocks,
                               .block_size = g->block_size,
                               .vocab_size = VOCAB};
    if (mirror_new(&ml, &f->mirror) != 0)
        die("mirror_new", pagoda_error_detail());
    f->pid = pid;
    f->computed_tokens = 0;
}

static void worker_hello(struct fuzz *f, uint8_t variant)
{
    Pagoda__Internal__PoolGeometry pg = PAGODA__INTERNAL__POOL_GEOMETRY__INIT;
    const struct kv_geometry *g = &f->cfg.geometry;
    pg.has_pool_id = pg.has_num_layers = pg.has_num_blocks = pg.has_block_size = 1;
    pg.has_num_kv_heads = pg.has_head_dim = pg.has_dtype = 1;
    pg.pool_id = f->pool_id;
    pg.num_layers = g->num_layers;
    pg.num_blocks = g->num_blocks;
    pg.block_size = g->block_size;
    pg.num_kv_heads = g->num_kv_heads;
    pg.head_dim = g->head_dim;
    pg.dtype = PAGODA__INTERNAL__DTYPE__DTYPE_F32;
    int32_t eos[1] = {EOS_ID};
    uint8_t fingerprint[16];
    memset(fingerprint, 'a' + (variant & 1), sizeof(fingerprint));
    Pagoda__Internal__Hello h = PAGODA__INTERNAL__HELLO__INIT;
    h.has_worker_id = h.has_pid = h.has_tp_rank = h.has_tp_size = 1;
    h.pid = f->pid;
    h.tp_size = 1;
    h.geometry = &pg;
    h.has_vocab_size = h.has_max_position_embeddings = 1;
    h.vocab_size = VOCAB;
    h.max_position_embeddings = MAX_POSITIONS;
    h.n_eos_token_ids = 1;
    h.eos_token_ids = eos;
    h.backend = "cpu";
    h.has_model_fingerprint = 1;
    h.model_fingerprint.data = fingerprint;
    h.model_fingerprint.len = sizeof(fingerprint);
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_HELLO;
    m.hello = &h;
    deliver(f, true, &m);
}

static void worker_resync(struct fuzz *f, const Pagoda__Internal__Resync *r, uint8_t variant)
{
    if (!mirror_synced(f->mirror) || mirror_epoch(f->mirror) != r->epoch)
        worker_hello(f, variant);
    int rc;
    Pagoda__Internal__SeqResult failed[WORKER_MAX_SEQS];
    Pagoda__Internal__SeqResult *ptrs[WORKER_MAX_SEQS];
    size_t n_failed = 0;
    if (r->has_pool_id && r->pool_id != f->pool_id) {
        /* As pagoda-worker: a resync of another pool (sent before the scheduler saw the Hello
         * of the new one) is refused, and the worker says again which pool it maps. */
        rc = PAGODA_EMISMATCH;
        worker_hello(f, variant);
    } else {
        rc = mirror_resync(f->mirror, r);
        if (rc != 0 && !f->lenient && r->n_seqs > 0)
            die("a resync of the scheduler's refused by the mirror", pagoda_error_detail());
        if (rc == 0)
            f->broken = false;
    }
    if (rc == 0) {
        /* The sequences the mirror left out for their own content, and (variant % 16 == 12) the
         * first one of the snapshot as if its content were wrong (the mirror still holds it:
         * the scheduler's next steps may be refused). */
        const struct mirror_seq_error *errs;
        int32_t n = mirror_resync_failures(f->mirror, &errs);
        for (int32_t i = 0; i < n && n_failed < WORKER_MAX_SEQS; i++) {
            pagoda__internal__seq_result__init(&failed[n_failed]);
            failed[n_failed].has_seq_id = failed[n_failed].has_error_code = 1;
            failed[n_failed].seq_id = errs[i].seq_id;
            failed[n_failed].error_code = errs[i].code;
            failed[n_failed].error_message = (char *)errs[i].message;
            ptrs[n_failed] = &failed[n_failed];
            n_failed++;
        }
        if (variant % 16 == 12 && r->n_seqs > 0 && n_failed < WORKER_MAX_SEQS) {
            pagoda__internal__seq_result__init(&failed[n_failed]);
            failed[n_failed].has_seq_id = failed[n_failed].has_error_code = 1;
            failed[n_failed].seq_id = r->seqs[0]->seq_id;
            failed[n_failed].error_code = PAGODA_ERANGE;
            failed[n_failed].error_message = "a token id outside the vocabulary";
            ptrs[n_failed] = &failed[n_failed];
            n_failed++;
            f->lenient = true;
        }
    }
    Pagoda__Internal__ResyncDone d = PAGODA__INTERNAL__RESYNC_DONE__INIT;
    d.has_epoch = d.has_resync_id = d.has_pool_id = 1;
    d.epoch = r->epoch;
    d.resync_id = r->resync_id;
    d.pool_id = f->pool_id;
    d.n_failed = n_failed;
    d.failed = ptrs;
    if (rc != 0) {
        d.has_error_code = 1;
        d.error_code = rc;
        d.error_message = "refused";
    }
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESYNC_DONE;
    m.resync_done = &d;
    deliver(f, true, &m);
}

static void worker_step(struct fuzz *f, const Pagoda__Internal__Step *s, uint8_t how,
                        struct input *in)
{
    struct mirror_step ms;
    int rc = mirror_step_prepare(f->mirror, s, &ms);
    if (rc == MIRROR_EOTHER_EPOCH)
        return;
    Pagoda__Internal__StepResult r = PAGODA__INTERNAL__STEP_RESULT__INIT;
    r.has_epoch = r.has_step_id = r.has_computed_tokens = 1;
    r.epoch = s->epoch;
    r.step_id = s->step_id;
    /* Sampled rows, then the sequences the step failed (as pagoda-worker answers). */
    Pagoda__Internal__SeqResult results[3 * WORKER_MAX_SEQS];
    Pagoda__Internal__SeqResult *ptrs[3 * WORKER_MAX_SEQS];
    int32_t tokens[WORKER_MAX_SEQS], row_codes[WORKER_MAX_SEQS];
    bool row_failed = false;
    if (rc == 0 && how % 16 == 14) { /* the forward pass fails */
        mirror_step_abort(f->mirror);
        rc = PAGODA_EIO;
        f->broken = true;
    } else if (rc == 0) {
        if (ms.batch.num_logits > WORKER_MAX_SEQS)
            die("mirror", "more logits rows than sequences");
        for (int32_t i = 0; i < ms.batch.num_logit_entries; i++) {
            const struct logit_entry *e = &ms.batch.logit_entries[i];
            if (e->row < 0 || e->row >= ms.batch.num_logits || e->token < 0 || e->token >= VOCAB)
                die("mirror", "entry outside");
            for (int32_t j = 0; j < i; j++)
                if (ms.batch.logit_entries[j].row == e->row &&
                    ms.batch.logit_entries[j].token == e->token)
                    die("mirror", "entry twice");
        }
        for (int32_t i = 0; i < ms.batch.num_logits; i++) {
            tokens[i] = token(in);
            if (tokens[i] < 0 || tokens[i] >= VOCAB)
                f->lenient = true; /* a broken result: the scheduler resyncs */
            /* how % 16 == 13: the first row cannot be sampled (logits not finite): that
             * sequence alone fails. */
            row_codes[i] =
                (how % 16 == 13 && i == 0 && ms.batch.num_tokens > 0) ? PAGODA_ERANGE : 0;
            row_failed |= row_codes[i] != 0;
            pagoda__internal__seq_result__init(&results[i]);
            results[i].has_seq_id = 1;
            results[i].seq_id = ms.seq_ids[i];
            if (row_codes[i] != 0) {
                results[i].has_error_code = 1;
                results[i].error_code = row_codes[i];
                results[i].error_message = "logits that are not finite";
            } else {
                results[i].has_token_id = results[i].has_logprob = 1;
                results[i].token_id = tokens[i];
                results[i].logprob = -0.5f;
            }
            ptrs[i] = &results[i];
        }
        size_t n = (size_t)ms.batch.num_logits;
        for (int32_t i = 0; i < ms.num_failed && n < 3 * WORKER_MAX_SEQS; i++, n++) {
            pagoda__internal__seq_result__init(&results[n]);
            results[n].has_seq_id = results[n].has_error_code = 1;
            results[n].seq_id = ms.failed[i].seq_id;
            results[n].error_code = ms.failed[i].code;
            results[n].error_message = (char *)ms.failed[i].message;
            ptrs[n] = &results[n];
        }
        mirror_step_commit_rows(f->mirror, tokens, row_failed ? row_codes : NULL);
        f->computed_tokens += (uint64_t)ms.batch.num_tokens;
        r.n_results = n;
        r.results = ptrs;
    } else if (!f->lenient && !f->broken) {
        die("a step of the scheduler's refused by the mirror", pagoda_error_detail());
    }
    if (rc != 0) {
        r.has_error_code = 1;
        r.error_code = rc;
        r.error_message = "refused";
    }
    r.computed_tokens = f->computed_tokens;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_RESULT;
    m.result = &r;
    deliver(f, true, &m);
}

/* The worker handles the oldest message sent to it (or loses it). The command always takes
 * ANSWER_BYTES of the input (how, then the sampled tokens), whatever the step needs, so that a
 * script keeps its meaning when the scheduler's steps change. */
#define ANSWER_BYTES (1 + 2 * WORKER_MAX_SEQS)

static void worker_answer(struct fuzz *f, struct input *in)
{
    struct input args = {in->p, in->left < ANSWER_BYTES ? in->left : ANSWER_BYTES};
    in->p += args.left;
    in->left -= args.left;
    if (f->count == 0)
        return;
    struct packed p = f->pending[f->head];
    f->head = (f->head + 1) % PENDING_CAP;
    f->count--;
    uint8_t how = u8(&args);
    Pagoda__Internal__ToWorker *m = pagoda__internal__to_worker__unpack(NULL, p.len, p.data);
    free(p.data);
    if (m == NULL)
        die("to_worker", "does not unpack");
    if (verbose)
        fprintf(stderr, "  worker: how %u, message %d\n", how, (int)m->msg_case);
    if (how % 16 == 15) {
        f->lenient = true; /* lost */
    } else if (m->msg_case == PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC) {
        worker_resync(f, m->resync, how);
    } else if (m->msg_case == PAGODA__INTERNAL__TO_WORKER__MSG_STEP) {
        worker_step(f, m->step, how, &args);
    }
    pagoda__internal__to_worker__free_unpacked(m, NULL);
}

/* ---- the router -------------------------------------------------------------------------- */

static const char *const TENANTS[] = {"a", "b", "c", NULL};

static void router_submit(struct fuzz *f, struct input *in)
{
    uint8_t flags = u8(in);
    uint8_t id[SCHEDULER_REQUEST_ID_BYTES + 1];
    memset(id, 0, sizeof(id));
    id[0] = u8(in) % ID_CHOICES;
    int32_t prompt[MAX_PROMPT], stop[3], output[8];
    size_t n_prompt = 1 + u8(in) % MAX_PROMPT;
    for (size_t i = 0; i < n_prompt; i++)
        prompt[i] = token(in);
    Pagoda__Internal__SamplingParams sp = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    if (flags & 1) {
        sp.has_temperature = sp.has_top_k = sp.has_seed = 1;
        sp.temperature = (float)(u8(in) % 8) / 4.0f;
        sp.top_k = (int32_t)(u8(in) % 8) - 1;
        sp.seed = u8(in);
    }
    Pagoda__Internal__SubmitSeq sub = PAGODA__INTERNAL__SUBMIT_SEQ__INIT;
    sub.has_request_id = 1;
    sub.request_id.data = id;
    sub.request_id.len = (flags & 2) && (flags & 4) ? 17 : SCHEDULER_REQUEST_ID_BYTES;
    sub.tenant = (char *)TENANTS[(flags >> 3) & 3];
    sub.n_prompt_token_ids = n_prompt;
    sub.prompt_token_ids = prompt;
    sub.sampling = &sp;
    sub.has_max_tokens = 1;
    sub.max_tokens = (int32_t)(u8(in) % 40) - 1;
    if (flags & 32) {
        sub.n_stop_token_ids = 1 + u8(in) % 3;
        for (size_t i = 0; i < sub.n_stop_token_ids; i++)
            stop[i] = token(in);
        sub.stop_token_ids = stop;
    }
    sub.has_ignore_eos = 1;
    sub.ignore_eos = (flags & 64) != 0;
    if (flags & 128) {
        sub.n_output_token_ids = 1 + u8(in) % 8;
        for (size_t i = 0; i < sub.n_output_token_ids; i++)
            output[i] = token(in);
        sub.output_token_ids = output;
    }
    /* min_tokens (sometimes negative) and a logit bias (sometimes of mismatched lists) */
    uint8_t more = u8(in);
    int32_t bias_ids[4];
    float bias_values[4];
    if (more & 1) {
        sp.has_min_tokens = 1;
        sp.min_tokens = (int32_t)(u8(in) % 12) - ((more & 8) ? 1 : 0);
    }
    if (more & 2) {
        size_t nb = 1 + u8(in) % 4;
        for (size_t i = 0; i < nb; i++) {
            bias_ids[i] = token(in);
            bias_values[i] = (float)((int)u8(in) - 128);
        }
        sp.n_logit_bias_token_ids = nb - ((more & 4) ? 1 : 0); /* sometimes mismatched */
        sp.n_logit_bias_values = nb;
        sp.logit_bias_token_ids = bias_ids;
        sp.logit_bias_values = bias_values;
    }
    sub.has_client_request_id = 1;
    sub.client_request_id.data = id;
    sub.client_request_id.len = SCHEDULER_REQUEST_ID_BYTES;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_SUBMIT;
    m.submit = &sub;
    deliver(f, false, &m);
}

static void router_cancel(struct fuzz *f, struct input *in)
{
    uint8_t id[SCHEDULER_REQUEST_ID_BYTES] = {0};
    id[0] = u8(in) % ID_CHOICES;
    Pagoda__Internal__CancelSeq c = PAGODA__INTERNAL__CANCEL_SEQ__INIT;
    c.has_request_id = 1;
    c.request_id.data = id;
    c.request_id.len = sizeof(id);
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_CANCEL;
    m.cancel = &c;
    deliver(f, false, &m);
}

/* A Policy: tenants a and b in group namespace g:team (quota from the input), c on its own,
 * and up to two pins of tokens from the input. */
static void router_policy(struct fuzz *f, struct input *in)
{
    uint8_t flags = u8(in);
    Pagoda__Internal__NamespacePolicy ns[2] = {PAGODA__INTERNAL__NAMESPACE_POLICY__INIT,
                                               PAGODA__INTERNAL__NAMESPACE_POLICY__INIT};
    Pagoda__Internal__NamespacePolicy *ns_ptrs[2] = {&ns[0], &ns[1]};
    ns[0].name = "g:team";
    ns[0].has_quota_blocks = 1;
    ns[0].quota_blocks = u8(in) % 16;
    ns[1].name = "t:c";
    ns[1].has_quota_blocks = 1;
    ns[1].quota_blocks = u8(in) % 16;
    char *pins_a[2] = {"sys", "other"};
    Pagoda__Internal__TenantPolicy tp[3] = {PAGODA__INTERNAL__TENANT_POLICY__INIT,
                                            PAGODA__INTERNAL__TENANT_POLICY__INIT,
                                            PAGODA__INTERNAL__TENANT_POLICY__INIT};
    Pagoda__Internal__TenantPolicy *tp_ptrs[3] = {&tp[0], &tp[1], &tp[2]};
    for (int i = 0; i < 3; i++) {
        tp[i].name = (char *)TENANTS[i];
        tp[i].namespace_ = i < 2 ? "g:team" : "t:c";
        tp[i].has_max_running = 1;
        tp[i].max_running = u8(in) % 4;
    }
    tp[0].n_pins = (flags & 1) ? 2 : 1;
    tp[0].pins = pins_a;
    tp[2].n_pins = (flags & 2) ? 1 : 0;
    tp[2].pins = &pins_a[1];
    int32_t tokens[2][40];
    Pagoda__Internal__PinPolicy pins[2] = {PAGODA__INTERNAL__PIN_POLICY__INIT,
                                           PAGODA__INTERNAL__PIN_POLICY__INIT};
    Pagoda__Internal__PinPolicy *pin_ptrs[2] = {&pins[0], &pins[1]};
    for (int i = 0; i < 2; i++) {
        pins[i].name = pins_a[i];
        pins[i].n_token_ids = u8(in) % 40;
        for (size_t t = 0; t < pins[i].n_token_ids; t++)
            tokens[i][t] = token(in);
        pins[i].token_ids = tokens[i];
    }
    Pagoda__Internal__Policy p = PAGODA__INTERNAL__POLICY__INIT;
    p.has_version = 1;
    p.version = (flags & 4) ? f->policy_version : ++f->policy_version;
    p.n_namespaces = (flags & 8) ? 1 : 2;
    p.namespaces = ns_ptrs;
    p.n_tenants = (flags & 16) ? 2 : 3;
    p.tenants = tp_ptrs;
    p.n_pins = (flags >> 5) % 3;
    p.pins = pin_ptrs;
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_POLICY;
    m.policy = &p;
    deliver(f, false, &m);
}

static void router_misc(struct fuzz *f, struct input *in)
{
    static char *const FLUSH[] = {"g:team", "t:c", "p:sys", "t:zz", ""};
    Pagoda__Internal__ToScheduler m = PAGODA__INTERNAL__TO_SCHEDULER__INIT;
    Pagoda__Internal__RouterHello hello = PAGODA__INTERNAL__ROUTER_HELLO__INIT;
    Pagoda__Internal__StatsRequest stats = PAGODA__INTERNAL__STATS_REQUEST__INIT;
    Pagoda__Internal__AdminCall admin = PAGODA__INTERNAL__ADMIN_CALL__INIT;
    uint8_t what = u8(in);
    switch (what % 4) {
    case 0:
        m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_ROUTER_HELLO;
        m.router_hello = &hello;
        break;
    case 1:
        stats.has_cookie = 1;
        stats.cookie = ++f->cookie;
        m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS;
        m.stats = &stats;
        break;
    case 2:
        admin.has_cookie = admin.has_figures = 1;
        admin.cookie = ++f->cookie;
        admin.figures = 1;
        m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_ADMIN;
        m.admin = &admin;
        break;
    default:
        admin.has_cookie = 1;
        admin.cookie = ++f->cookie;
        admin.flush_namespace = FLUSH[(what >> 2) % 5];
        m.msg_case = PAGODA__INTERNAL__TO_SCHEDULER__MSG_ADMIN;
        m.admin = &admin;
        break;
    }
    deliver(f, false, &m);
}

/* ---- the script -------------------------------------------------------------------------- */

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    log_set_level(LOG_OFF);
    verbose = getenv("PAGODA_FUZZ_VERBOSE") != NULL;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct input in = {data, size};
    struct fuzz *f = calloc(1, sizeof(*f));
    if (f == NULL)
        abort();
    scheduler_config_default(&f->cfg);
    f->cfg.epoch = 7;
    uint8_t c0 = u8(&in), c1 = u8(&in), c2 = u8(&in);
    f->cfg.max_seqs = 1 + c1 % WORKER_MAX_SEQS;
    f->cfg.max_batched_tokens = f->cfg.max_seqs + c2 % 64;
    f->cfg.max_queued = f->cfg.max_seqs + (c1 >> 4);
    f->cfg.prefix_cache = c0 & 1;
    f->cfg.geometry = (struct kv_geometry){.pool_id = 9,
                                           .num_layers = 2,
                                           .num_blocks = 9 + (c0 >> 2) % 56,
                                           .block_size = (c0 & 2) ? 16 : 8,
                                           .num_kv_heads = 2,
                                           .head_dim = 16,
                                           .dtype = DTYPE_F32};
    struct scheduler_io io = {.ctx = f,
                              .to_worker = io_to_worker,
                              .to_router = io_to_router,
                              .to_supervisor = io_to_supervisor};
    if (scheduler_open(&f->cfg, &io, &f->s) != 0)
        die("scheduler_open", pagoda_error_detail());
    f->pool_id = f->cfg.geometry.pool_id;
    worker_start(f, 100);
    scheduler_tick(f->s, f->now);

    while (in.left > 0) {
        uint8_t op = u8(&in);
        if (verbose)
            fprintf(stderr, "op %u (%u) at %zu left, %zu pending\n", op % 10, op, in.left,
                    f->count);
        switch (op % 10) {
        case 0:
            deliver_raw(f, false, &in);
            break;
        case 1:
            deliver_raw(f, true, &in);
            break;
        case 2:
            if (op & 128) /* the router's link starts or stops losing messages */
                f->router_down = !f->router_down;
            f->now += (int64_t)u8(&in) * 8;
            scheduler_tick(f->s, f->now);
            break;
        case 3:
        case 4:
            router_submit(f, &in);
            break;
        case 5:
            router_cancel(f, &in);
            break;
        case 6:
        case 7:
            worker_answer(f, &in);
            break;
        case 8:
            if (op & 16) /* the worker process restarts: a new pid, an empty mirror */
                worker_start(f, f->pid + 1);
            if ((op & 16) && (op & 128)) /* and kvpool with it: a new pool */
                f->pool_id++;
            worker_hello(f, op >> 5);
            break;
        default:
            if (op & 16)
                router_policy(f, &in);
            else
                router_misc(f, &in);
            break;
        }
        const char *why = NULL;
        if (scheduler_check_invariants(f->s, &why) != 0)
            die("scheduler_check_invariants", why);
    }

    if (verbose) {
        struct scheduler_stats st;
        scheduler_get_stats(f->s, &st);
        fprintf(stderr,
                "steps %llu, resyncs %llu, restarts %llu, finished %llu, rejected %llu, "
                "preemptions %llu, refused steps %llu, timeouts %llu, malformed %llu, cached "
                "blocks %u, pinned %u, hit tokens %llu, running %u, waiting %u, lenient %d\n",
                (unsigned long long)st.steps, (unsigned long long)st.resyncs,
                (unsigned long long)st.worker_restarts, (unsigned long long)st.finished_requests,
                (unsigned long long)st.rejected_requests, (unsigned long long)st.preemptions,
                (unsigned long long)st.refused_steps, (unsigned long long)st.result_timeouts,
                (unsigned long long)st.malformed_messages, st.cached_blocks, st.pinned_blocks,
                (unsigned long long)st.prefix_hit_tokens, st.running, st.waiting, f->lenient);
    }
    scheduler_close(f->s);
    mirror_free(f->mirror);
    for (size_t i = 0; i < f->count; i++)
        free(f->pending[(f->head + i) % PENDING_CAP].data);
    free(f);
    return 0;
}
