/* Forming and sending the scheduler's steps (scheduler_impl.h): each step's decodes, then the
 * chunks of sequences still prefilling (shared between tenants), then admissions (fair between
 * tenants, checked against the worker's model and the context, held back while a prefix they need
 * is computed elsewhere), the blocks they need (preempting while none is free), and the Step to the
 * worker, with up to max_steps_in_flight out. Results, resyncs, the isolation of a refused step,
 * workers and sequences are scheduler.c's; the router's messages scheduler_router.c's. */
#include "scheduler/scheduler.h"

#include "common/error.h"
#include "common/log.h"
#include "scheduler/block_manager.h"
#include "scheduler/scheduler_impl.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

/* ---- helpers -------------------------------------------------------------------------------- */

/* The tokens q will know once the steps in flight are answered (each one it samples in adds
 * one), and how many of them no step computes yet. */
static int32_t seq_known(const struct seq *q)
{
    return q->num_tokens + q->pending_samples;
}

static int32_t seq_remaining(const struct seq *q)
{
    return seq_known(q) - q->num_scheduled;
}

/* Whether q waits for a step in flight before its next position is scheduled: when the token it
 * samples there will end it by length (max_tokens, the context). A stop token cannot be
 * foreseen: the next step's token of a sequence it ends is discarded. A failure cannot either:
 * the worker fails a sequence it failed before alone in the step sent behind (a SeqResult error,
 * docs/protocol.md), whose result then names a sequence that has ended (ignored). */
static bool seq_waits(const struct scheduler *s, const struct seq *q)
{
    if (q->pending_samples == 0)
        return false;
    int32_t known = seq_known(q);
    return (q->max_tokens > 0 && known - q->num_prompt_tokens >= q->max_tokens) ||
           (int64_t)known >= sched_context_limit(s);
}

/* ---- forming a step ------------------------------------------------------------------------- */

static void plan_add(struct scheduler *s, struct seq *q, int32_t num_new)
{
    q->plan_index = (int32_t)s->plan_len;
    s->plan[s->plan_len].seq = q;
    s->plan[s->plan_len].num_new = num_new;
    s->plan_len++;
    s->budget -= num_new;
}

/* The blocks preempting q would give back: free again or, held by the prefix cache alone,
 * evictable. Shared ones (a cached prefix other sequences read: reference count 3 or more) stay
 * held. (A block of a pinned prefix that q alone reads counts, though it stays pinned.) */
static int64_t blocks_freed_by(const struct scheduler *s, const struct seq *q)
{
    int64_t n = 0;
    for (int32_t i = 0; i < q->table.num_blocks; i++)
        n += block_manager_refcount(s->bm, q->table.ids[i]) <= 2;
    return n;
}

/* The running sequence memory's preemption takes. With one tenant (or only pins' computations
 * beside it), the most recently admitted, as ever. Where several tenants run: the most recently
 * admitted of the tenant whose running sequences would give back the most blocks, leaving out
 * the sequence first in queue order (a sequence preempted before has its place at the queue's
 * front: it is not taken again while another can go, and the oldest request always progresses,
 * as it did when the newest always went) and pins' computations; the newest of all when no
 * other is left. Taking the newest of all took the request that fair admissions had just let
 * in, so a tenant whose long generations filled the memory had every other tenant's requests
 * preempted, again each time they were admitted, while its own ran on. */
static struct seq *memory_victim(struct scheduler *s)
{
    struct seq *tail = s->running.tail;
    const struct sched_tenant *one = NULL;
    bool several = false;
    const struct seq *first = s->running.head;
    for (const struct seq *q = s->running.head; q; q = q->next) {
        if (q->owner != NULL && one == NULL)
            one = q->owner;
        several |= q->owner != NULL && q->owner != one;
        if (q->queue_key < first->queue_key)
            first = q;
    }
    if (!several)
        return tail;
    const uint64_t pass = ++s->victim_pass;
    struct sched_tenant *most = NULL;
    for (const struct seq *q = s->running.head; q; q = q->next) {
        struct sched_tenant *t = q->owner;
        if (t == NULL || q == first)
            continue;
        if (t->victim_pass != pass) {
            t->victim_pass = pass;
            t->blocks_held = 0;
        }
        t->blocks_held += blocks_freed_by(s, q);
        if (most == NULL || t->blocks_held > most->blocks_held)
            most = t;
    }
    for (struct seq *q = tail; most != NULL && q; q = q->prev)
        if (q->owner == most && q != first)
            return q;
    return tail;
}

/* Makes q's table cover upto tokens, preempting running sequences (memory_victim) while no block
 * is free. Returns false when q itself had to go. */
static bool ensure_blocks(struct scheduler *s, struct seq *q, int64_t upto)
{
    int32_t need = block_count_for(upto, s->block_size);
    while (q->table.num_blocks < need) {
        int rc = sched_seq_append_block(s, q);
        if (rc == 0)
            continue;
        struct seq *victim = rc == PAGODA_EEXHAUSTED ? memory_victim(s) : q;
        if (rc != PAGODA_EEXHAUSTED)
            log_error("scheduler: block table of seq %llu: %s", (unsigned long long)q->seq_id,
                      pagoda_strerror(rc));
        sched_seq_preempt(s, victim);
        if (victim == q)
            return false;
    }
    return true;
}

/* A strict_max_tokens request's check: PAGODA_ERANGE with why in msg when its prompt and
 * max_tokens (> 0) pass limit, else 0. */
int sched_strict_check(int64_t limit, int32_t prompt, int32_t max_tokens,
                       char msg[SCHEDULER_ERROR_MESSAGE_MAX])
{
    if (max_tokens <= 0 || (int64_t)prompt + max_tokens <= limit)
        return 0;
    snprintf(msg, SCHEDULER_ERROR_MESSAGE_MAX,
             "the context is %lld tokens (the model's positions, or the KV pool less its pins' "
             "blocks), and this request asks for %lld (%d of prompt, %d of max_tokens): shorten "
             "the prompt or lower max_tokens",
             (long long)limit, (long long)prompt + max_tokens, (int)prompt, (int)max_tokens);
    return PAGODA_ERANGE;
}

/* Checks a sequence against the worker's model before it is admitted. Returns 0, or refuses it
 * (error event) or ends it (its resubmitted output already fills the context) and returns -1. */
static int admission_check(struct scheduler *s, struct seq *q)
{
    char msg[SCHEDULER_ERROR_MESSAGE_MAX];
    const int32_t pinned = (int32_t)prefix_cache_pinned_blocks(s->pc);
    int64_t limit = sched_context_with_pins(s, pinned);
    if ((int64_t)q->num_prompt_tokens + 1 > limit) {
        snprintf(msg, sizeof(msg), "prompt of %d tokens + 1 exceeds the context of %lld tokens",
                 (int)q->num_prompt_tokens, (long long)limit);
        sched_seq_refuse(s, q, PAGODA_ERANGE, msg);
        return -1;
    }
    /* Checked at its Submit against the context without pins; pins may have been taken since,
     * and those being computed will take their blocks before it ends (it must not end by the
     * context below its max_tokens). */
    if (q->strict_max_tokens &&
        sched_strict_check(sched_context_with_pins(s, pinned + sched_pins_computing_blocks(s)),
                           q->num_prompt_tokens, q->max_tokens, msg) != 0) {
        sched_seq_refuse(s, q, PAGODA_ERANGE, msg);
        return -1;
    }
    if (q->vocab_checked != s->worker.vocab_size) {
        for (int32_t i = 0; i < q->num_tokens; i++) {
            if (q->tokens[i] >= s->worker.vocab_size) {
                snprintf(msg, sizeof(msg), "token id %d at %d is outside the vocabulary of %lld",
                         (int)q->tokens[i], (int)i, (long long)s->worker.vocab_size);
                sched_seq_refuse(s, q, PAGODA_EINVAL, msg);
                return -1;
            }
        }
        q->vocab_checked = s->worker.vocab_size;
    }
    if ((int64_t)q->num_tokens >= limit) {
        uint32_t out = (uint32_t)(q->num_tokens - q->num_prompt_tokens);
        sched_send_end(s, q->request_id, SCHEDULER_REQUEST_ID_BYTES, out,
                       (uint32_t)q->num_prompt_tokens,
                       PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH, 0, NULL);
        sched_seq_end(s, q, PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH, 0, NULL);
        return -1;
    }
    return 0;
}

/* Blocks that admitted sequences still prefilling will need for their whole prompt + 1. */
static int64_t blocks_owed(const struct scheduler *s)
{
    int64_t owed = 0;
    for (struct seq *q = s->running.head; q; q = q->next) {
        if (seq_remaining(q) <= 1)
            continue;
        int32_t need = block_count_for((int64_t)q->num_tokens + 1, s->block_size);
        if (need > q->table.num_blocks)
            owed += need - q->table.num_blocks;
    }
    return owed;
}

/* Whether tenant t runs as many sequences as it may. */
static bool tenant_at_cap(const struct sched_tenant *t)
{
    return t->max_running > 0 && t->running >= t->max_running;
}

/* Whether q's tenant (if it has one) does. */
static bool owner_at_cap(const struct seq *q)
{
    return q->owner && tenant_at_cap(q->owner);
}

/* Admissions (form_plan). The queue is FIFO (preempted sequences at its front), but between
 * tenants admissions are fair: the candidates are each tenant's first waiting sequence, and the
 * one taken is that of the tenant running the fewest sequences (the earliest of those that tie;
 * sequences of no tenant, a pin's computation, before any). Otherwise one tenant's queue,
 * however long, would hold every other tenant's requests behind it whenever memory is the limit
 * (its head not fitting stops admissions). A tenant at its cap on running sequences is passed
 * over. The candidates are found by one pass over the queue per step (admissions_begin, which
 * stops once it has met every tenant that may be admitted: with one tenant, at its first
 * sequence), and a tenant's next by going on from the one it had admitted
 * (admissions_advance), so that a step's admissions cost about one pass over the queue. */
static void admissions_begin(struct scheduler *s)
{
    uint32_t eligible = 0, met = 0;
    for (const struct sched_tenant *t = s->tenants; t; t = t->next)
        eligible += t->waiting > 0 && !tenant_at_cap(t);
    uint64_t pass = ++s->admission_pass;
    s->pins_running = 0;
    s->pins_passed = false;
    for (const struct seq *q = s->running.head; q; q = q->next)
        s->pins_running += q->owner == NULL;
    for (struct seq *q = s->waiting.head; q && met < eligible; q = q->next) {
        if (q->owner == NULL || q->owner->seen == pass)
            continue;
        q->owner->seen = pass;
        q->owner->head = q;
        met += !owner_at_cap(q);
    }
}

/* The next waiting sequence to admit, or NULL. Pins' computations (sequences of no tenant) take
 * their turn as one more tenant would, running s->pins_running, a tie going to the pins and to the
 * tenants in turn (s->pins_win_tie), so that neither waits for the other's whole queue: an
 * operator's pins (eight of 1,000 tokens) were admitted before every tenant's request, which then
 * waited for all of them (18 s on the CPU); after the tenants on every tie, a pin could wait
 * forever where each place freed went to a tenant running none. */
static struct seq *next_admission(struct scheduler *s)
{
    struct sched_tenant *best = NULL;
    for (struct sched_tenant *t = s->tenants; t; t = t->next) {
        if (t->seen != s->admission_pass || t->head == NULL || tenant_at_cap(t))
            continue;
        if (best == NULL || t->running < best->running ||
            (t->running == best->running && t->head->queue_key < best->head->queue_key))
            best = t;
    }
    if (s->ownerless_waiting > 0 && !s->pins_passed &&
        (best == NULL || s->pins_running < best->running ||
         (s->pins_running == best->running && s->pins_win_tie)))
        for (struct seq *q = s->waiting.head; q; q = q->next)
            if (q->owner == NULL)
                return q; /* in queue order (pins start at its front) */
    return best != NULL ? best->head : NULL;
}

/* q, its tenant's head, leaves the queue (admitted, refused or ended): the tenant's next waiting
 * sequence from `after` (q's successor, read before q left) on becomes its head. */
static void admissions_advance(struct scheduler *s, struct sched_tenant *t, struct seq *after)
{
    if (t == NULL || t->seen != s->admission_pass)
        return;
    while (after != NULL && after->owner != t)
        after = after->next;
    t->head = after;
}

/* Each tenant's share of the places (t->share): max_seqs water-filled over what each wants (its
 * running and waiting sequences, at most its max_running), so that a tenant wanting less than an
 * equal part keeps what it wants and the rest is split among the others (a tenant capped at 1
 * leaves 31 of 32 places to two others, 15 each, not 10). Rounds fix the tenants that want no more
 * than the level; after a few (staggered wants of many tenants) the rest get the level. Returns
 * how many tenants want a place. */
static uint32_t fill_shares(struct scheduler *s)
{
    uint32_t open = 0;
    for (struct sched_tenant *t = s->tenants; t; t = t->next) {
        uint32_t want = t->running + t->waiting;
        if (t->max_running > 0 && want > t->max_running)
            want = t->max_running;
        t->want = want;
        t->share = 0;
        open += want > 0;
    }
    const uint32_t wanting = open;
    uint32_t left = (uint32_t)s->cfg.max_seqs;
    for (int round = 0; open > 0; round++) {
        const uint32_t level = left / open > 0 ? left / open : 1;
        uint32_t fixed = 0;
        for (struct sched_tenant *t = s->tenants; t; t = t->next) {
            if (t->want == 0 || t->share != 0)
                continue;
            if (round == 8 || t->want <= level) {
                t->share = t->want <= level ? t->want : level;
                left -= t->share < left ? t->share : left;
                open--;
                fixed++;
            }
        }
        if (fixed == 0) { /* every one left wants more than the level: that is their share */
            for (struct sched_tenant *t = s->tenants; t; t = t->next)
                if (t->want > 0 && t->share == 0)
                    t->share = level;
            break;
        }
    }
    return wanting;
}

/* Fairness of the places (max_seqs): admissions alone are fair only about who comes next, so a
 * tenant that took every place while the others were idle (one request of n 32 where max_seqs is
 * 32, or two of n 128 at the defaults) kept them all for its generations' whole length, every
 * other tenant's request waiting behind (an outside probe's: 96 s for a 16-token completion).
 * When every place is taken and a tenant that may be admitted waits with fewer than its share
 * (fill_shares), and its request fits the free blocks, the most recently admitted sequence of the
 * tenant furthest over its share is preempted, one a step, as memory pressure preempts (its
 * prefix mostly stays cached): that step admits nobody, and the next admits the tenant running
 * the fewest (next_admission). Sequences of no tenant (pins' computations) are left out. */
static void preempt_for_fairness(struct scheduler *s)
{
    if (s->running.count < (uint32_t)s->cfg.max_seqs || s->worker.isolating)
        return;
    if (fill_shares(s) < 2)
        return;
    struct sched_tenant *over = NULL;
    bool starved = false;
    for (struct sched_tenant *t = s->tenants; t; t = t->next) {
        starved |= t->waiting > 0 && t->running < t->share && !tenant_at_cap(t);
        if (t->running > t->share &&
            (over == NULL || t->running - t->share > over->running - over->share))
            over = t;
    }
    if (over == NULL || !starved) /* (the steady state of a busy engine: no queue scan) */
        return;
    /* The first waiting sequence of a tenant under its share, which must fit the blocks free
     * now with one more for each running sequence (each may cross into a new block soon): where
     * memory is the limit too, admissions' own fairness hands out the blocks as they free, and a
     * place given back would only be taken again by memory's preemption, both tenants
     * recomputing. */
    /* Checked as its admission will check it (admission_check: refused or ended now, as it
     * would be then), so that no place is given back for a request that cannot take it. */
    const struct seq *head = NULL;
    for (struct seq *q = s->waiting.head, *next; q && head == NULL; q = next) {
        next = q->next;
        if (q->owner != NULL && q->owner->running < q->owner->share && !tenant_at_cap(q->owner) &&
            admission_check(s, q) == 0)
            head = q;
    }
    if (head == NULL)
        return;
    const int64_t available = (int64_t)block_manager_free_count(s->bm) +
                              prefix_cache_evictable_blocks(s->pc) - blocks_owed(s);
    if (available <
        block_count_for((int64_t)head->num_tokens + 1, s->block_size) + (int64_t)s->running.count)
        return;
    for (struct seq *q = s->running.tail; q; q = q->prev)
        if (q->owner == over) {
            s->stats.fairness_preemptions++;
            sched_seq_preempt(s, q);
            return;
        }
}

/* Prefill shares (form_plan): running sequences' prefill chunks used to be planned in admission
 * order before any admission, so that one tenant's long prompts (eight of 1,023 tokens, a chunk
 * budget of 2,048) filled every step's budget and held another tenant's request, admitted or
 * not, until all of them were computed (an outside probe's: 37 s on the CPU for 16 tokens; on the
 * GPU, a backlog of 256 long prompts is seconds). When more than one party has prefill work (a
 * tenant with a running sequence prefilling or a request that may be admitted; pins' computations
 * as one more), each party's running chunks are first held to an equal part of the budget left
 * after the decodes; admissions take what is left, and what they leave goes to the running
 * chunks again, in admission order, so that a step is as full as before. Returns the share
 * (INT32_MAX: one party or none, no limit) and resets the parties' counts. */
static int32_t prefill_share(struct scheduler *s, uint32_t n)
{
    const uint64_t pass = ++s->prefill_pass;
    uint32_t parties = 0;
    bool pins = false;
    s->pins_prefill_used = 0;
    for (uint32_t i = 0; i < n; i++) {
        struct seq *q = s->order[i];
        if (q->state != SEQ_RUNNING || seq_remaining(q) <= 1 || !sched_isolation_may_run(s, q))
            continue;
        if (q->owner == NULL) {
            parties += !pins;
            pins = true;
        } else if (q->owner->prefill_pass != pass) {
            q->owner->prefill_pass = pass;
            q->owner->prefill_used = 0;
            parties++;
        }
    }
    if (s->running.count < (uint32_t)s->cfg.max_seqs && !s->worker.isolating && !s->preempted_now) {
        for (struct sched_tenant *t = s->tenants; t; t = t->next)
            if (t->waiting > 0 && !tenant_at_cap(t) && t->prefill_pass != pass) {
                t->prefill_pass = pass;
                t->prefill_used = 0;
                parties++;
            }
        parties += s->ownerless_waiting > 0 && !pins;
    }
    if (parties < 2)
        return INT32_MAX;
    return s->budget / (int32_t)parties > 0 ? s->budget / (int32_t)parties : 1;
}

/* The prefill tokens planned this step for q's party (prefill_share). */
static int32_t *prefill_used(struct scheduler *s, const struct seq *q)
{
    return q->owner != NULL ? &q->owner->prefill_used : &s->pins_prefill_used;
}

/* After admissions, the budget left goes to the running sequences still prefilling, in admission
 * order: a chunk planned within its party's share grows, one left out is planned. */
static void prefill_rest(struct scheduler *s, uint32_t n)
{
    for (uint32_t i = 0; i < n && s->budget > 0; i++) {
        struct seq *q = s->order[i];
        int32_t remaining = seq_remaining(q);
        if (q->state != SEQ_RUNNING || remaining <= 1 || !sched_isolation_may_run(s, q))
            continue;
        int32_t planned = q->plan_index >= 0 ? s->plan[q->plan_index].num_new : 0;
        int32_t more = remaining - planned < s->budget ? remaining - planned : s->budget;
        if (more <= 0 || !ensure_blocks(s, q, (int64_t)q->num_scheduled + planned + more))
            continue;
        if (q->plan_index >= 0) {
            s->plan[q->plan_index].num_new += more;
            s->budget -= more;
        } else {
            plan_add(s, q, more);
        }
    }
}

static void form_plan(struct scheduler *s)
{
    s->plan_len = 0;
    s->budget = s->cfg.max_batched_tokens;
    s->preempted_now = false;
    preempt_for_fairness(s);

    /* The running sequences in admission order (preemption edits the list as we go). */
    uint32_t n = 0;
    for (struct seq *q = s->running.head; q; q = q->next) {
        q->plan_index = -1;
        s->order[n++] = q;
    }
    /* Decodes first: one token each (with a step in flight that samples q, the position of the
     * token it samples: the worker reads that token from its own mirror). */
    for (uint32_t i = 0; i < n && s->budget > 0; i++) {
        struct seq *q = s->order[i];
        if (q->state != SEQ_RUNNING || seq_remaining(q) != 1 || seq_waits(s, q) ||
            !sched_isolation_may_run(s, q))
            continue;
        if (ensure_blocks(s, q, (int64_t)q->num_scheduled + 1))
            plan_add(s, q, 1);
    }
    /* Then the chunks of sequences still prefilling (after their chunk in flight, if any), each
     * party's within its share (prefill_share). */
    const int32_t share = prefill_share(s, n);
    for (uint32_t i = 0; i < n && s->budget > 0; i++) {
        struct seq *q = s->order[i];
        int32_t remaining = seq_remaining(q);
        if (q->state != SEQ_RUNNING || remaining <= 1 || !sched_isolation_may_run(s, q))
            continue;
        int32_t *used = prefill_used(s, q);
        int32_t chunk = remaining < s->budget ? remaining : s->budget;
        if (chunk > share - *used)
            chunk = share - *used;
        if (chunk > 0 && ensure_blocks(s, q, (int64_t)q->num_scheduled + chunk)) {
            plan_add(s, q, chunk);
            *used += chunk;
        }
    }
    /* Then admissions, unless this step had to preempt or runs a probe, in next_admission's
     * order: FIFO within a tenant, fair between tenants, a tenant at its cap passed over (its
     * requests keep their places). The first that cannot start now (its prefix being computed,
     * too few free blocks) stops them: nobody takes its place. */
    int64_t owed = blocks_owed(s);
    if (!s->worker.isolating && !s->preempted_now)
        admissions_begin(s);
    while (!s->worker.isolating && !s->preempted_now && s->budget > 0 &&
           s->running.count < (uint32_t)s->cfg.max_seqs) {
        struct seq *q = next_admission(s);
        if (q == NULL)
            break;
        struct sched_tenant *owner = q->owner;
        struct seq *after = q->next;
        if (admission_check(s, q) != 0) {
            admissions_advance(s, owner, after); /* refused or ended, gone */
            continue;
        }
        int32_t evictable_hits = 0;
        int32_t hits = sched_cache_match(s, q, &evictable_hits);
        /* The next block of its prefix is being computed by another sequence: it waits for
         * that block to be cached rather than computing it too, and so do its tenant's requests
         * behind it (FIFO within a tenant: none of them takes its place); the other tenants'
         * are admitted meanwhile (when the wait stopped every admission, a tenant sending
         * requests that share a long prompt held every other tenant's behind its computation).
         * The wait is short: with budget left for admissions, every prefilling sequence has its
         * whole prompt in this step or the one in flight (the chunks above), or, where parties
         * share the budget (prefill_share), its party has its share of every step. */
        if (sched_cache_computed_elsewhere(s, q, hits)) {
            if (!q->prefix_waited) {
                q->prefix_waited = true;
                s->stats.prefix_waits++;
            }
            if (owner != NULL)
                owner->head = NULL; /* passed over until the next step */
            else
                s->pins_passed = true;
            continue;
        }
        int32_t need = block_count_for((int64_t)q->num_tokens + 1, s->block_size) - hits;
        int64_t available = (int64_t)block_manager_free_count(s->bm) +
                            prefix_cache_evictable_blocks(s->pc) - evictable_hits - owed;
        if (available < need)
            break;
        waiting_remove(s, q);
        admissions_advance(s, owner, after);
        /* admission_check holds it to its max_tokens up to its first admission, not after: a
         * preempted sequence resumes whatever the pins took meanwhile */
        q->strict_max_tokens = false;
        q->state = SEQ_RUNNING;
        q->seq_id = ++s->next_seq_id;
        sched_hash_seq_id(s, q);
        list_push_back(&s->running, q);
        if (q->owner)
            q->owner->running++;
        else
            s->pins_running++;
        if (s->ownerless_waiting > 0 || q->owner == NULL)
            s->pins_win_tie = q->owner != NULL; /* the next tie goes to the other side */
        q->num_computed = 0;
        sched_seq_clear_inflight(q);
        q->plan_index = -1;
        if (sched_cache_take_match(s, q, hits) != 0) {
            sched_seq_preempt(s, q); /* out of memory for its table: try again later */
            break;
        }
        int32_t remaining = q->num_tokens - q->num_computed;
        int32_t chunk = remaining < s->budget ? remaining : s->budget;
        if (!ensure_blocks(s, q, (int64_t)q->num_computed + chunk))
            break; /* cannot happen: the free blocks were counted */
        plan_add(s, q, chunk);
        owed += need - (q->table.num_blocks - hits);
    }
    if (share != INT32_MAX)
        prefill_rest(s, n);
    if (s->running.count > s->stats.peak_running)
        s->stats.peak_running = s->running.count;
    int32_t usable = block_manager_usable(s->bm);
    double usage = 1.0 - (double)(block_manager_free_count(s->bm) +
                                  (int32_t)prefix_cache_evictable_blocks(s->pc)) /
                             (double)usable;
    if (usage > s->stats.peak_kv_usage)
        s->stats.peak_kv_usage = usage;
}

/* Forms and sends the next step when the worker is in sync, fewer than max_steps_in_flight steps
 * are out (one while a refused step is being isolated), and there is work. Returns true when a
 * step was sent. */
static bool step_once(struct scheduler *s, int64_t now_ms)
{
    struct worker_link *w = &s->worker;
    if (w->state == LINK_STEP) {
        /* A resync waits for the steps out (the worker may still be computing them). Right
         * after a resync, and while isolating, one step goes alone: a refused step is then the
         * step's own fault, and its follower is not refused for nothing. */
        if (w->num_steps >= (uint32_t)s->cfg.max_steps_in_flight || w->fresh || w->isolating ||
            s->need_resync)
            return false;
    } else if (w->state != LINK_IDLE) {
        return false;
    }
    if (s->need_resync) {
        sched_send_resync(s, now_ms, false);
        return false;
    }
    if (s->running.count == 0 && s->waiting.count == 0)
        return false;
    uint64_t cpu0 = sched_cpu_now_ns();
    sched_isolation_prune(s);
    form_plan(s);
    if (s->need_resync) { /* a pending list overflowed while forming */
        for (uint32_t i = 0; i < s->plan_len; i++)
            if (s->plan[i].seq)
                s->plan[i].seq->plan_index = -1;
        sched_send_resync(s, now_ms, false);
        return false;
    }
    size_t n_new = 0, n_cont = 0;
    struct step_rec *rec = sched_step_at(w, w->num_steps);
    rec->num_seqs = 0;
    rec->num_tokens = 0;
    uint64_t step_id = s->last_step_id + 1;
    for (uint32_t i = 0; i < s->plan_len; i++) {
        struct seq *q = s->plan[i].seq;
        if (q == NULL)
            continue;
        int32_t num_new = s->plan[i].num_new;
        sched_cache_assert_writable(s, q, num_new);
        q->plan_index = -1;
        rec->seq_ids[rec->num_seqs++] = q->seq_id;
        rec->num_tokens += num_new;
        if (!q->worker_knows) {
            Pagoda__Internal__NewSequence *m = &s->new_msgs[n_new];
            pagoda__internal__new_sequence__init(m);
            SCHED_FILL_SEQ_STATE(s, m, q, &s->sp_msgs[n_new]);
            m->has_num_new_tokens = 1;
            m->num_new_tokens = num_new;
            s->new_ptrs[n_new++] = m;
            q->worker_knows = true;
        } else {
            Pagoda__Internal__ContinuingSequence *m = &s->cont_msgs[n_cont];
            pagoda__internal__continuing_sequence__init(m);
            m->has_seq_id = m->has_num_computed_tokens = m->has_num_new_tokens = 1;
            m->seq_id = q->seq_id;
            m->num_computed_tokens = q->num_scheduled;
            m->num_new_tokens = num_new;
            m->n_appended_block_ids = (size_t)(q->table.num_blocks - q->blocks_sent);
            m->appended_block_ids = q->table.ids + q->blocks_sent;
            s->cont_ptrs[n_cont++] = m;
        }
        q->blocks_sent = q->table.num_blocks;
        /* It samples when the chunk reaches the end of what it will know. */
        bool samples = q->num_scheduled + num_new == seq_known(q);
        q->inflight[q->num_inflight++] =
            (struct seq_inflight){.step_id = step_id, .num_new = num_new, .samples = samples};
        q->num_scheduled += num_new;
        q->pending_samples += samples;
    }
    if (rec->num_seqs == 0) {
        /* Nothing could run (every candidate was preempted, or what runs is all in flight):
         * the preempted ids wait for the next step, the next tick tries again (without a probe
         * that cannot run). */
        if (w->num_steps == 0)
            sched_isolation_end(s, "the probe cannot run");
        sched_charge_cpu(s, cpu0);
        return false;
    }
    Pagoda__Internal__Step st = PAGODA__INTERNAL__STEP__INIT;
    st.has_epoch = st.has_step_id = 1;
    st.epoch = s->cfg.epoch;
    st.step_id = step_id;
    s->last_step_id = step_id;
    st.n_new_seqs = n_new;
    st.new_seqs = s->new_ptrs;
    st.n_cont_seqs = n_cont;
    st.cont_seqs = s->cont_ptrs;
    st.n_finished_seq_ids = s->pending_finished.count;
    st.finished_seq_ids = s->pending_finished.ids;
    st.n_preempted_seq_ids = s->pending_preempted.count;
    st.preempted_seq_ids = s->pending_preempted.ids;
    Pagoda__Internal__ToWorker m = PAGODA__INTERNAL__TO_WORKER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_WORKER__MSG_STEP;
    m.step = &st;
    sched_owe_from(w, now_ms);
    w->state = LINK_STEP;
    rec->step_id = step_id;
    rec->start_ms = now_ms; /* for a step behind another: reset when that one is answered */
    w->num_steps++;
    if (w->num_steps > s->stats.peak_steps_in_flight)
        s->stats.peak_steps_in_flight = w->num_steps;
    s->stats.steps++;
    sched_send_worker(s, 0, &m);
    if (s->cfg.fault_dup_step != 0 && st.step_id == s->cfg.fault_dup_step) {
        log_warn("fault injection: sending step %llu twice", (unsigned long long)st.step_id);
        sched_send_worker(s, 0, &m);
    }
    s->pending_finished.count = 0;
    s->pending_preempted.count = 0;
    sched_charge_cpu(s, cpu0);
    return true;
}

/* Sends steps while one may go out: with two in flight, step n+1 right behind step n. */
void sched_try_step(struct scheduler *s, int64_t now_ms)
{
    for (int i = 0; i < SCHEDULER_MAX_STEPS_IN_FLIGHT && step_once(s, now_ms); i++)
        ;
}
