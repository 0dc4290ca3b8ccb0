/* The stand-in scheduler and router harness of router_fake_scheduler.h. Test code: it may
 * block, and it favours plainness over speed. */
#include "tests/unit/router_fake_scheduler.h"

#include "client/pagoda.h"
#include "common/error.h"
#include "proto/internal.pb-c.h"
#include "wire/wire.h"

#include <nng/nng.h>
#include <nng/protocol/pair1/pair.h>

#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef PAGODA_BIN_DIR
#error "PAGODA_BIN_DIR must name the directory of pagoda-router"
#endif

#define TICK_MS 2
/* What a request or pin whose first token is FAKE_SCHED_ERROR_TOKEN fails with. */
static const char kErrorMessage[] = "token 999999 is outside the vocabulary";

struct fseq {
    uint8_t id[16];
    int32_t *prompt;
    size_t num_prompt;
    int32_t max_tokens;
    int32_t stop_ids[64];
    size_t num_stop;
    int ignore_eos;
    int logprobs;                              /* the SubmitSeq's, echoed in announcements */
    Pagoda__Internal__SamplingParams sampling; /* the SubmitSeq's (every field a scalar) */
    int strict_max_tokens;
    char tenant[32];
    uint8_t client_id[16];
    int has_client_id;
    uint32_t emitted;
    /* The prompt tokens its admission found cached, told with every event: half the prompt, or
     * all of it where it came back with output (a resubmission finds its blocks of before). */
    uint32_t cached;
    int done;
    int finish; /* the end sent (Pagoda__Internal__FinishReason), for a resend; 0 while running */
    struct fseq *next;
};

struct fake_sched {
    nng_socket sock;
    pthread_t thread;
    atomic_int stop, hold, dups, hold_policy, hold_admin, hold_stats, pause;
    atomic_uint drops;   /* event messages lost (counts.drops) */
    atomic_int lose;     /* event messages still to lose on purpose (fake_sched_lose_events) */
    atomic_int rehello;  /* an announcement was lost: announce again (tick) */
    atomic_int behind;   /* a message to the router was lost: resend every request (tick) */
    atomic_int kv_dtype; /* SchedulerStats.kv_dtype (fake_sched_set_kv_dtype); -1: none */
    uint8_t *policy;     /* the last Policy, packed; guarded by lock */
    size_t policy_len;
    int policy_pending; /* it is still to be answered (held); guarded by lock */
    pthread_mutex_t lock;
    struct fseq *seqs; /* guarded by lock */
    struct fake_sched_counts counts;
    uint32_t peak_running;
    uint64_t ticks, emitted_total;
    uint64_t epoch; /* sent with every message, as a scheduler's: one per start */
    /* tick()'s message, built in place */
    Pagoda__Internal__TokenEvent events[256];
    Pagoda__Internal__TokenEvent *event_ptrs[256];
    int32_t tokens[256][FAKE_SCHED_PIECE_TOKENS + 1];
    float logprobs[256][FAKE_SCHED_PIECE_TOKENS + 1];
};

uint64_t rtr_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

int32_t fake_sched_token(const int32_t *prompt, size_t n, uint32_t i)
{
    uint32_t sum = 0;
    for (size_t k = 0; k < n; k++)
        sum += (uint32_t)prompt[k];
    return (int32_t)(1000u + (sum * 7u + i * 13u) % 30000u);
}

float fake_sched_logprob(uint32_t i)
{
    return -0.125f * (float)(i % 16 + 1);
}

/* Sends env to the router, stamped with the protocol version; 1 when it went. */
static int send_msg(struct fake_sched *fs, Pagoda__Internal__ToRouter *env)
{
    env->has_protocol_version = 1;
    env->protocol_version = WIRE_PROTOCOL_VERSION;
    env->has_epoch = 1;
    env->epoch = fs->epoch;
    const ProtobufCMessage *msg = &env->base;
    size_t len = protobuf_c_message_get_packed_size(msg);
    nng_msg *m;
    if (nng_msg_alloc(&m, len) != 0)
        return 0;
    protobuf_c_message_pack(msg, nng_msg_body(m));
    int rv = NNG_ETIMEDOUT;
    int lose =
        env->msg_case == PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS ? atomic_load(&fs->lose) : 0;
    while (lose > 0 && !atomic_compare_exchange_weak(&fs->lose, &lose, lose - 1))
        ;
    if (lose <= 0)
        rv = nng_sendmsg(fs->sock, m, 0);
    if (rv == 0)
        return 1;
    nng_msg_free(m);
    /* As the real scheduler: a lost message is made good by sending every request again. */
    if (env->msg_case == PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS) {
        atomic_fetch_add(&fs->drops, 1);
        fprintf(stderr,
                "fake scheduler: an event message to the router was lost (%s); "
                "every request is sent again\n",
                nng_strerror(rv));
        atomic_store(&fs->behind, 1);
        if (env->events != NULL && env->events->announce_done)
            atomic_store(&fs->rehello, 1); /* a lost announcement is sent again as one */
    }
    return 0;
}

static struct fseq *find(struct fake_sched *fs, const uint8_t *id)
{
    for (struct fseq *q = fs->seqs; q; q = q->next)
        if (memcmp(q->id, id, 16) == 0)
            return q;
    return NULL;
}

static uint32_t count_running(const struct fake_sched *fs)
{
    uint32_t n = 0;
    for (const struct fseq *q = fs->seqs; q; q = q->next)
        n += !q->done;
    return n;
}

static void on_submit(struct fake_sched *fs, const Pagoda__Internal__SubmitSeq *s)
{
    if (!s->has_request_id || s->request_id.len != 16)
        return;
    pthread_mutex_lock(&fs->lock);
    struct fseq *q = find(fs, s->request_id.data);
    /* As the real scheduler, which forgets a sequence once it ended: an id that ended (finished or
     * cancelled) is a new sequence when submitted again (it goes in front of the old one). */
    if (q != NULL && !q->done) {
        fs->counts.repeated_submits++;
        pthread_mutex_unlock(&fs->lock);
        return;
    }
    fs->counts.submits++;
    fs->counts.last_has_seed = s->sampling && s->sampling->has_seed;
    fs->counts.last_seed = s->sampling ? s->sampling->seed : 0;
    if (s->sampling != NULL)
        fs->counts.last_sampling = *s->sampling;
    else
        pagoda__internal__sampling_params__init(&fs->counts.last_sampling);
    snprintf(fs->counts.last_tenant, sizeof(fs->counts.last_tenant), "%s",
             s->tenant ? s->tenant : "");
    q = calloc(1, sizeof(*q));
    q->prompt = malloc(s->n_prompt_token_ids * sizeof(int32_t) + 1);
    memcpy(q->id, s->request_id.data, 16);
    memcpy(q->prompt, s->prompt_token_ids, s->n_prompt_token_ids * sizeof(int32_t));
    q->num_prompt = s->n_prompt_token_ids;
    q->max_tokens = s->has_max_tokens ? s->max_tokens : 16;
    q->num_stop = s->n_stop_token_ids < 64 ? s->n_stop_token_ids : 64;
    if (q->num_stop > 0)
        memcpy(q->stop_ids, s->stop_token_ids, q->num_stop * sizeof(int32_t));
    q->ignore_eos = s->ignore_eos;
    q->logprobs = s->has_logprobs && s->logprobs;
    if (s->sampling != NULL)
        q->sampling = *s->sampling;
    else
        pagoda__internal__sampling_params__init(&q->sampling);
    q->strict_max_tokens = s->has_strict_max_tokens && s->strict_max_tokens;
    snprintf(q->tenant, sizeof(q->tenant), "%s", s->tenant ? s->tenant : "");
    if (s->has_client_request_id && s->client_request_id.len == 16) {
        q->has_client_id = 1;
        memcpy(q->client_id, s->client_request_id.data, 16);
    }
    if (s->n_output_token_ids > 0) {
        fs->counts.resumed++;
        for (size_t i = 0; i < s->n_output_token_ids; i++)
            if (s->output_token_ids[i] != fake_sched_token(q->prompt, q->num_prompt, (uint32_t)i))
                fs->counts.output_mismatches++;
        q->emitted = (uint32_t)s->n_output_token_ids;
    }
    q->cached = (uint32_t)(s->n_output_token_ids > 0 ? q->num_prompt : q->num_prompt / 2);
    q->next = fs->seqs;
    fs->seqs = q;
    uint32_t running = count_running(fs);
    if (running > fs->peak_running)
        fs->peak_running = running;
    pthread_mutex_unlock(&fs->lock);
}

static void on_stats(struct fake_sched *fs, const Pagoda__Internal__StatsRequest *sr)
{
    Pagoda__Internal__SchedulerStats st = PAGODA__INTERNAL__SCHEDULER_STATS__INIT;
    pthread_mutex_lock(&fs->lock);
    fs->counts.stats_requests++;
    st.has_cookie = sr->has_cookie;
    st.cookie = sr->cookie;
    st.has_running = st.has_waiting = st.has_peak_running = st.has_steps = 1;
    st.running = count_running(fs);
    st.waiting = 0;
    st.peak_running = FAKE_SCHED_PEAK_RUNNING_BASE + fs->peak_running;
    st.steps = fs->ticks;
    st.has_num_blocks = st.has_free_blocks = st.has_kv_usage = st.has_computed_tokens = 1;
    st.num_blocks = 64;
    st.free_blocks = 48;
    st.kv_usage = 0.25;
    st.computed_tokens = fs->emitted_total;
    st.has_resyncs = st.has_preemptions = 1;
    st.resyncs = 3;
    st.preemptions = 2;
    st.has_prefix_waits = 1;
    st.prefix_waits = FAKE_SCHED_PREFIX_WAITS;
    st.has_router_drops = st.has_router_resends = 1;
    st.router_drops = atomic_load(&fs->drops);
    st.router_resends = fs->counts.resends;
    const int kv_dtype = atomic_load(&fs->kv_dtype);
    st.has_kv_dtype = kv_dtype >= 0;
    st.kv_dtype = (Pagoda__Internal__DType)kv_dtype;
    pthread_mutex_unlock(&fs->lock);
    Pagoda__Internal__ToRouter env = PAGODA__INTERNAL__TO_ROUTER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_STATS;
    env.stats = &st;
    send_msg(fs, &env);
}

/* RouterHello: every unfinished request from offset 0 (its tokens with their log-probabilities,
 * as the scheduler's), then announce_done (one message). */
static void on_router_hello(struct fake_sched *fs)
{
    enum { MAX_ANNOUNCE = 64, MAX_TOKENS = 256 };
    Pagoda__Internal__TokenEvent events[MAX_ANNOUNCE], *ptrs[MAX_ANNOUNCE];
    static int32_t tokens[MAX_ANNOUNCE][MAX_TOKENS];
    static float lps[MAX_ANNOUNCE][MAX_TOKENS];
    size_t n = 0;
    pthread_mutex_lock(&fs->lock);
    fs->counts.router_hellos++;
    for (struct fseq *q = fs->seqs; q != NULL && n < MAX_ANNOUNCE; q = q->next) {
        if (q->done)
            continue;
        Pagoda__Internal__TokenEvent *ev = &events[n];
        pagoda__internal__token_event__init(ev);
        ev->has_request_id = ev->has_offset = ev->has_announce = 1;
        ev->request_id.data = q->id;
        ev->request_id.len = 16;
        ev->announce = 1;
        uint32_t k = q->emitted < MAX_TOKENS ? q->emitted : MAX_TOKENS;
        for (uint32_t i = 0; i < k; i++) {
            tokens[n][i] = fake_sched_token(q->prompt, q->num_prompt, i);
            lps[n][i] = fake_sched_logprob(i);
        }
        ev->n_token_ids = ev->n_logprobs = k;
        ev->token_ids = tokens[n];
        ev->logprobs = lps[n];
        ev->tenant = q->tenant;
        ev->has_max_tokens = ev->has_ignore_eos = ev->has_prompt_tokens = 1;
        ev->max_tokens = q->max_tokens;
        ev->ignore_eos = q->ignore_eos;
        ev->has_logprobs_asked = q->logprobs != 0;
        ev->logprobs_asked = q->logprobs != 0;
        ev->prompt_tokens = (uint32_t)q->num_prompt;
        ev->has_cached_tokens = 1;
        ev->cached_tokens = q->cached;
        /* the rest of its SubmitSeq, as the scheduler's announcement carries it */
        ev->n_prompt_token_ids = q->num_prompt;
        ev->prompt_token_ids = q->prompt;
        ev->sampling = &q->sampling;
        ev->n_stop_token_ids = q->num_stop;
        ev->stop_token_ids = q->stop_ids;
        ev->has_strict_max_tokens = q->strict_max_tokens;
        ev->strict_max_tokens = q->strict_max_tokens;
        if (q->has_client_id) {
            ev->has_client_request_id = 1;
            ev->client_request_id.data = q->client_id;
            ev->client_request_id.len = 16;
        }
        ptrs[n] = ev;
        n++;
    }
    Pagoda__Internal__TokenEvents te = PAGODA__INTERNAL__TOKEN_EVENTS__INIT;
    te.n_events = n;
    te.events = ptrs;
    te.has_announce_done = te.announce_done = 1;
    Pagoda__Internal__ToRouter env = PAGODA__INTERNAL__TO_ROUTER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS;
    env.events = &te;
    send_msg(fs, &env);
    pthread_mutex_unlock(&fs->lock);
}

/* Caller holds the lock. */
static void trace(struct fake_sched *fs, char kind)
{
    size_t n = strlen(fs->counts.trace);
    if (n + 1 < sizeof(fs->counts.trace))
        fs->counts.trace[n] = kind;
}

void fake_sched_tenant_figures(const char *tenant, struct fake_figures *out)
{
    uint64_t n = strlen(tenant);
    memset(out, 0, sizeof(*out));
    out->lookups = 10 + n;
    out->hits = 2 + n;
    out->query_tokens = tenant[0] == 'z' ? 0 : 100 * n;
    out->hit_tokens = tenant[0] == 'z' ? 0 : 10 * n * n;
    out->waiting = 3;
}

void fake_sched_namespace_figures(const char *ns, uint32_t *cached_blocks, uint64_t *evictions)
{
    *cached_blocks = 3u * (uint32_t)strlen(ns);
    *evictions = strlen(ns);
}

/* The status of every pin of the last Policy; caller holds the lock and frees the array (the
 * names point into policy). */
static Pagoda__Internal__PinStatus *pin_statuses(const Pagoda__Internal__Policy *policy)
{
    Pagoda__Internal__PinStatus *st = calloc(policy->n_pins + 1, sizeof(*st));
    for (size_t i = 0; i < policy->n_pins; i++) {
        const Pagoda__Internal__PinPolicy *p = policy->pins[i];
        pagoda__internal__pin_status__init(&st[i]);
        st[i].name = p->name;
        st[i].has_ready = st[i].has_blocks = 1;
        if (p->n_token_ids > 0 && p->token_ids[0] == FAKE_SCHED_ERROR_TOKEN) {
            st[i].has_error_code = 1;
            st[i].error_code = PAGODA_ERANGE;
            st[i].error_message = (char *)kErrorMessage;
        } else {
            st[i].ready = 1;
            st[i].blocks = (uint32_t)(p->n_token_ids / FAKE_SCHED_BLOCK_SIZE);
        }
    }
    return st;
}

static Pagoda__Internal__Policy *unpack_policy(const struct fake_sched *fs)
{
    if (fs->policy == NULL)
        return NULL;
    return pagoda__internal__policy__unpack(NULL, fs->policy_len, fs->policy);
}

/* Answers the last Policy. Caller holds the lock. */
static void send_policy_applied(struct fake_sched *fs)
{
    Pagoda__Internal__Policy *policy = unpack_policy(fs);
    fs->policy_pending = 0;
    if (policy == NULL)
        return;
    Pagoda__Internal__PinStatus *st = pin_statuses(policy);
    Pagoda__Internal__PinStatus **ptrs = calloc(policy->n_pins + 1, sizeof(*ptrs));
    for (size_t i = 0; i < policy->n_pins; i++)
        ptrs[i] = &st[i];
    Pagoda__Internal__PolicyApplied pa = PAGODA__INTERNAL__POLICY_APPLIED__INIT;
    pa.has_version = 1;
    pa.version = policy->version;
    pa.n_pins = policy->n_pins;
    pa.pins = ptrs;
    Pagoda__Internal__ToRouter env = PAGODA__INTERNAL__TO_ROUTER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_POLICY_APPLIED;
    env.policy_applied = &pa;
    send_msg(fs, &env);
    fs->counts.policies_applied++;
    free(ptrs);
    free(st);
    pagoda__internal__policy__free_unpacked(policy, NULL);
}

static void on_policy(struct fake_sched *fs, const Pagoda__Internal__Policy *policy)
{
    pthread_mutex_lock(&fs->lock);
    fs->counts.policies++;
    fs->counts.last_policy_version = policy->version;
    free(fs->policy);
    fs->policy_len = pagoda__internal__policy__get_packed_size(policy);
    fs->policy = malloc(fs->policy_len + 1);
    pagoda__internal__policy__pack(policy, fs->policy);
    fs->policy_pending = 1;
    if (!atomic_load(&fs->hold_policy))
        send_policy_applied(fs);
    pthread_mutex_unlock(&fs->lock);
}

static uint32_t running_of(const struct fake_sched *fs, const char *tenant)
{
    uint32_t n = 0;
    for (const struct fseq *q = fs->seqs; q; q = q->next)
        n += !q->done && strcmp(q->tenant, tenant) == 0;
    return n;
}

static void on_admin(struct fake_sched *fs, const Pagoda__Internal__AdminCall *call)
{
    pthread_mutex_lock(&fs->lock);
    fs->counts.admin_calls++;
    snprintf(fs->counts.last_flush, sizeof(fs->counts.last_flush), "%s",
             call->flush_namespace ? call->flush_namespace : "");
    if (atomic_load(&fs->hold_admin)) {
        pthread_mutex_unlock(&fs->lock);
        return;
    }
    Pagoda__Internal__AdminResult res = PAGODA__INTERNAL__ADMIN_RESULT__INIT;
    res.has_cookie = call->has_cookie;
    res.cookie = call->cookie;
    Pagoda__Internal__Policy *policy = unpack_policy(fs);
    size_t nt = policy ? policy->n_tenants : 0, nn = policy ? policy->n_namespaces : 0;
    size_t np = policy ? policy->n_pins : 0;
    Pagoda__Internal__TenantFigures *tf = calloc(nt + 1, sizeof(*tf)), **tf_ptrs;
    Pagoda__Internal__NamespaceFigures *nf = calloc(nn + 1, sizeof(*nf)), **nf_ptrs;
    Pagoda__Internal__PinStatus *st = policy ? pin_statuses(policy) : NULL, **st_ptrs;
    tf_ptrs = calloc(nt + 1, sizeof(*tf_ptrs));
    nf_ptrs = calloc(nn + 1, sizeof(*nf_ptrs));
    st_ptrs = calloc(np + 1, sizeof(*st_ptrs));
    if (call->has_figures && call->figures) {
        /* Reverse order and a stranger: the router joins by name. */
        for (size_t i = 0; i < nt; i++) {
            const Pagoda__Internal__TenantPolicy *tp = policy->tenants[nt - 1 - i];
            struct fake_figures f;
            fake_sched_tenant_figures(tp->name, &f);
            pagoda__internal__tenant_figures__init(&tf[i]);
            tf[i].name = tp->name;
            tf[i].namespace_ = tp->namespace_;
            tf[i].has_lookups = tf[i].has_hits = tf[i].has_query_tokens = 1;
            tf[i].has_hit_tokens = tf[i].has_running = tf[i].has_waiting = 1;
            tf[i].lookups = f.lookups;
            tf[i].hits = f.hits;
            tf[i].query_tokens = f.query_tokens;
            tf[i].hit_tokens = f.hit_tokens;
            tf[i].running = running_of(fs, tp->name);
            tf[i].waiting = f.waiting;
            tf_ptrs[i] = &tf[i];
        }
        pagoda__internal__tenant_figures__init(&tf[nt]);
        tf[nt].name = (char *)"stranger";
        tf[nt].has_lookups = 1;
        tf[nt].lookups = 999;
        tf_ptrs[nt] = &tf[nt];
        res.n_tenants = nt + 1;
        res.tenants = tf_ptrs;
        for (size_t i = 0; i < nn; i++) {
            pagoda__internal__namespace_figures__init(&nf[i]);
            nf[i].name = policy->namespaces[i]->name;
            nf[i].has_cached_blocks = nf[i].has_evictions = nf[i].has_quota_blocks = 1;
            nf[i].has_inserted = 1;
            fake_sched_namespace_figures(nf[i].name, &nf[i].cached_blocks, &nf[i].evictions);
            nf[i].quota_blocks = policy->namespaces[i]->quota_blocks;
            nf[i].inserted = 100;
            nf_ptrs[i] = &nf[i];
        }
        res.n_namespaces = nn;
        res.namespaces = nf_ptrs;
        for (size_t i = 0; i < np; i++)
            st_ptrs[i] = &st[i];
        res.n_pins = np;
        res.pins = st_ptrs;
    }
    if (call->flush_namespace != NULL) {
        res.has_flushed_blocks = 1;
        res.flushed_blocks = 7u + (uint32_t)strlen(call->flush_namespace);
    }
    Pagoda__Internal__ToRouter env = PAGODA__INTERNAL__TO_ROUTER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_ADMIN;
    env.admin = &res;
    send_msg(fs, &env);
    free(tf);
    free(tf_ptrs);
    free(nf);
    free(nf_ptrs);
    free(st);
    free(st_ptrs);
    if (policy != NULL)
        pagoda__internal__policy__free_unpacked(policy, NULL);
    pthread_mutex_unlock(&fs->lock);
}

static void on_message(struct fake_sched *fs, nng_msg *m)
{
    Pagoda__Internal__ToScheduler *msg = (Pagoda__Internal__ToScheduler *)wire_unpack(
        &pagoda__internal__to_scheduler__descriptor, m);
    nng_msg_free(m);
    if (msg == NULL)
        return;
    static const char kinds[][2] = {
        [PAGODA__INTERNAL__TO_SCHEDULER__MSG_SUBMIT - 20] = "S",
        [PAGODA__INTERNAL__TO_SCHEDULER__MSG_CANCEL - 20] = "C",
        [PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS - 20] = "T",
        [PAGODA__INTERNAL__TO_SCHEDULER__MSG_ROUTER_HELLO - 20] = "H",
        [PAGODA__INTERNAL__TO_SCHEDULER__MSG_POLICY - 20] = "P",
        [PAGODA__INTERNAL__TO_SCHEDULER__MSG_ADMIN - 20] = "A",
    };
    if (msg->msg_case >= 20 && msg->msg_case <= 25) {
        pthread_mutex_lock(&fs->lock);
        trace(fs, kinds[msg->msg_case - 20][0]);
        pthread_mutex_unlock(&fs->lock);
    }
    if (msg->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_SUBMIT) {
        on_submit(fs, msg->submit);
    } else if (msg->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_CANCEL) {
        pthread_mutex_lock(&fs->lock);
        fs->counts.cancels++;
        if (msg->cancel->has_request_id && msg->cancel->request_id.len == 16) {
            struct fseq *q = find(fs, msg->cancel->request_id.data);
            if (q != NULL && !q->done) {
                /* As the real scheduler's on_cancel: an end event, FINISH_CANCELLED. */
                Pagoda__Internal__TokenEvent ev = PAGODA__INTERNAL__TOKEN_EVENT__INIT;
                ev.has_request_id = 1;
                ev.request_id.data = q->id;
                ev.request_id.len = 16;
                ev.has_offset = 1;
                ev.offset = q->emitted;
                ev.has_finish_reason = 1;
                ev.finish_reason = PAGODA__INTERNAL__FINISH_REASON__FINISH_CANCELLED;
                Pagoda__Internal__TokenEvent *pev = &ev;
                Pagoda__Internal__TokenEvents te = PAGODA__INTERNAL__TOKEN_EVENTS__INIT;
                te.n_events = 1;
                te.events = &pev;
                Pagoda__Internal__ToRouter env = PAGODA__INTERNAL__TO_ROUTER__INIT;
                env.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS;
                env.events = &te;
                send_msg(fs, &env);
            }
            if (q != NULL && !q->done) {
                q->done = 1;
                q->finish = PAGODA__INTERNAL__FINISH_REASON__FINISH_CANCELLED;
            }
        }
        pthread_mutex_unlock(&fs->lock);
    } else if (msg->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_STATS) {
        if (!atomic_load(&fs->hold_stats))
            on_stats(fs, msg->stats);
    } else if (msg->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_ROUTER_HELLO) {
        on_router_hello(fs);
    } else if (msg->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_POLICY) {
        on_policy(fs, msg->policy);
    } else if (msg->msg_case == PAGODA__INTERNAL__TO_SCHEDULER__MSG_ADMIN) {
        on_admin(fs, msg->admin);
    }
    protobuf_c_message_free_unpacked(&msg->base, NULL);
}

/* Sends n events in one TokenEvents message, times times. */
static void send_events(struct fake_sched *fs, Pagoda__Internal__TokenEvent **ptrs, size_t n,
                        int times)
{
    Pagoda__Internal__TokenEvents te = PAGODA__INTERNAL__TOKEN_EVENTS__INIT;
    te.n_events = n;
    te.events = ptrs;
    Pagoda__Internal__ToRouter env = PAGODA__INTERNAL__TO_ROUTER__INIT;
    env.msg_case = PAGODA__INTERNAL__TO_ROUTER__MSG_EVENTS;
    env.events = &te;
    for (int i = 0; i < times; i++)
        send_msg(fs, &env);
}

/* One step: a piece of every running request, in one TokenEvents message. */
static void tick(struct fake_sched *fs)
{
    enum { MAX_EVENTS = 256 };
    Pagoda__Internal__TokenEvent *events = fs->events, **ptrs = fs->event_ptrs;
    int32_t(*tokens)[FAKE_SCHED_PIECE_TOKENS + 1] = fs->tokens;
    float(*logprobs)[FAKE_SCHED_PIECE_TOKENS + 1] = fs->logprobs;
    size_t n = 0;
    int dups = atomic_load(&fs->dups);
    pthread_mutex_lock(&fs->lock);
    fs->ticks++;
    for (struct fseq *q = fs->seqs; q != NULL && n < MAX_EVENTS; q = q->next) {
        if (q->done)
            continue;
        Pagoda__Internal__TokenEvent *ev = &events[n];
        pagoda__internal__token_event__init(ev);
        ev->has_request_id = 1;
        ev->request_id.data = q->id;
        ev->request_id.len = 16;
        if (q->prompt[0] == FAKE_SCHED_ERROR_TOKEN) {
            ev->has_finish_reason = ev->has_error_code = 1;
            ev->finish_reason = PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR;
            ev->error_code = PAGODA_ERANGE;
            ev->error_message = (char *)kErrorMessage;
            q->done = 1;
            q->finish = PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR;
            ptrs[n] = ev;
            n++;
            continue;
        }
        uint32_t start = q->emitted;
        if (dups && start > 0)
            start--; /* overlap the previous event by one token */
        size_t k = 0;
        int finish = 0;
        for (uint32_t i = start; i < q->emitted + FAKE_SCHED_PIECE_TOKENS; i++) {
            if (i >= (uint32_t)q->max_tokens) {
                finish = PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH;
                break;
            }
            int32_t t = fake_sched_token(q->prompt, q->num_prompt, i);
            tokens[n][k] = t;
            logprobs[n][k] = fake_sched_logprob(i);
            k++;
            int stop = 0;
            for (size_t s = 0; s < q->num_stop; s++)
                stop |= q->stop_ids[s] == t;
            if (stop) {
                finish = PAGODA__INTERNAL__FINISH_REASON__FINISH_STOP;
                break;
            }
            if (i + 1 == (uint32_t)q->max_tokens) {
                finish = PAGODA__INTERNAL__FINISH_REASON__FINISH_LENGTH;
                break;
            }
        }
        ev->has_offset = ev->has_cached_tokens = 1;
        ev->offset = start;
        ev->cached_tokens = q->cached;
        ev->n_token_ids = ev->n_logprobs = k;
        ev->token_ids = tokens[n];
        ev->logprobs = logprobs[n];
        uint32_t end = start + (uint32_t)k;
        if (end > q->emitted) {
            fs->emitted_total += end - q->emitted;
            q->emitted = end;
        }
        if (finish) {
            ev->has_finish_reason = ev->has_prompt_tokens = ev->has_cached_tokens = 1;
            ev->finish_reason = (Pagoda__Internal__FinishReason)finish;
            ev->prompt_tokens = (uint32_t)q->num_prompt;
            ev->cached_tokens = q->cached;
            q->done = 1;
            q->finish = finish;
        }
        ptrs[n] = ev;
        n++;
    }
    pthread_mutex_unlock(&fs->lock);
    if (n == 0)
        return;
    send_events(fs, ptrs, n, dups ? 2 : 1);
}

/* After a lost message, as the real scheduler's resend: the newest requests, ended ones too, each
 * from offset 0 with its end, in one message. The router takes what it lacks and ignores the rest.
 */
static void resend(struct fake_sched *fs)
{
    enum { MAX_RESEND = 64 };
    Pagoda__Internal__TokenEvent events[MAX_RESEND], *ptrs[MAX_RESEND];
    int32_t *tokens[MAX_RESEND] = {0};
    float *logprobs[MAX_RESEND] = {0};
    size_t n = 0;
    pthread_mutex_lock(&fs->lock);
    atomic_store(&fs->behind, 0);
    fs->counts.resends++;
    for (struct fseq *q = fs->seqs; q != NULL && n < MAX_RESEND; q = q->next) {
        if (find(fs, q->id) != q)
            continue; /* an id submitted again after it ended: only the newest is told */
        Pagoda__Internal__TokenEvent *ev = &events[n];
        pagoda__internal__token_event__init(ev);
        ev->has_request_id = ev->has_offset = 1;
        ev->request_id.data = q->id;
        ev->request_id.len = 16;
        ev->offset = 0;
        tokens[n] = malloc((q->emitted + 1) * sizeof(int32_t));
        logprobs[n] = malloc((q->emitted + 1) * sizeof(float));
        for (uint32_t i = 0; i < q->emitted; i++) {
            tokens[n][i] = fake_sched_token(q->prompt, q->num_prompt, i);
            logprobs[n][i] = fake_sched_logprob(i);
        }
        ev->n_token_ids = ev->n_logprobs = q->emitted;
        ev->token_ids = tokens[n];
        ev->logprobs = logprobs[n];
        if (q->finish != 0) {
            ev->has_finish_reason = ev->has_prompt_tokens = ev->has_cached_tokens = 1;
            ev->finish_reason = (Pagoda__Internal__FinishReason)q->finish;
            ev->prompt_tokens = (uint32_t)q->num_prompt;
            ev->cached_tokens = q->cached;
            if (q->finish == PAGODA__INTERNAL__FINISH_REASON__FINISH_ERROR) {
                ev->has_error_code = 1;
                ev->error_code = PAGODA_ERANGE;
                ev->error_message = (char *)kErrorMessage;
            }
        }
        ptrs[n] = ev;
        n++;
    }
    if (n > 0)
        send_events(fs, ptrs, n, 1);
    pthread_mutex_unlock(&fs->lock);
    for (size_t i = 0; i < n; i++) {
        free(tokens[i]);
        free(logprobs[i]);
    }
}

static void *run(void *arg)
{
    struct fake_sched *fs = arg;
    uint64_t last_tick = rtr_now_ms();
    while (!atomic_load(&fs->stop)) {
        nng_msg *m;
        int rv = NNG_ETIMEDOUT;
        if (atomic_load(&fs->pause)) {
            struct timespec ts = {0, 1000000L};
            nanosleep(&ts, NULL);
        } else {
            rv = nng_recvmsg(fs->sock, &m, 0);
        }
        if (rv == 0)
            on_message(fs, m);
        else if (rv != NNG_ETIMEDOUT)
            break;
        if (!atomic_load(&fs->hold_policy)) {
            pthread_mutex_lock(&fs->lock);
            if (fs->policy_pending)
                send_policy_applied(fs);
            pthread_mutex_unlock(&fs->lock);
        }
        uint64_t now = rtr_now_ms();
        if (now - last_tick >= TICK_MS) {
            last_tick = now;
            if (atomic_exchange(&fs->rehello, 0))
                on_router_hello(fs);
            if (atomic_load(&fs->behind))
                resend(fs);
            if (!atomic_load(&fs->hold))
                tick(fs);
        }
    }
    return NULL;
}

int fake_sched_start(const char *url, struct fake_sched **out)
{
    struct fake_sched *fs = calloc(1, sizeof(*fs));
    if (fs == NULL)
        return PAGODA_ENOMEM;
    int rc = wire_pair_open(&fs->sock, url, 1, WIRE_MAX_MESSAGE_BYTES);
    if (rc != 0) {
        free(fs);
        return rc;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    fs->epoch = (uint64_t)now.tv_sec * 1000000000u + (uint64_t)now.tv_nsec;
    atomic_init(&fs->kv_dtype, PAGODA__INTERNAL__DTYPE__DTYPE_F32); /* a CPU engine's pool */
    nng_socket_set_int(fs->sock, NNG_OPT_SENDBUF, 1024);
    nng_socket_set_ms(fs->sock, NNG_OPT_RECVTIMEO, 1);
    nng_socket_set_ms(fs->sock, NNG_OPT_SENDTIMEO, 1000);
    pthread_mutex_init(&fs->lock, NULL);
    pthread_create(&fs->thread, NULL, run, fs);
    *out = fs;
    return 0;
}

void fake_sched_stop(struct fake_sched *fs)
{
    if (fs == NULL)
        return;
    atomic_store(&fs->stop, 1);
    pthread_join(fs->thread, NULL);
    nng_close(fs->sock);
    struct fseq *q = fs->seqs;
    while (q) {
        struct fseq *next = q->next;
        free(q->prompt);
        free(q);
        q = next;
    }
    pthread_mutex_destroy(&fs->lock);
    free(fs->policy);
    free(fs);
}

void fake_sched_hold(struct fake_sched *fs, int hold)
{
    atomic_store(&fs->hold, hold);
}

void fake_sched_lose_events(struct fake_sched *fs, int n)
{
    atomic_store(&fs->lose, n);
}

void fake_sched_set_duplicates(struct fake_sched *fs, int on)
{
    atomic_store(&fs->dups, on);
}

void fake_sched_set_kv_dtype(struct fake_sched *fs, int dtype)
{
    atomic_store(&fs->kv_dtype, dtype);
}

void fake_sched_pause(struct fake_sched *fs, int on)
{
    atomic_store(&fs->pause, on);
}

void fake_sched_hold_policy(struct fake_sched *fs, int hold)
{
    atomic_store(&fs->hold_policy, hold);
}

void fake_sched_hold_stats(struct fake_sched *fs, int hold)
{
    atomic_store(&fs->hold_stats, hold);
}

void fake_sched_hold_admin(struct fake_sched *fs, int hold)
{
    atomic_store(&fs->hold_admin, hold);
}

Pagoda__Internal__Policy *fake_sched_last_policy(struct fake_sched *fs)
{
    pthread_mutex_lock(&fs->lock);
    Pagoda__Internal__Policy *p = unpack_policy(fs);
    pthread_mutex_unlock(&fs->lock);
    return p;
}

void fake_sched_get_counts(struct fake_sched *fs, struct fake_sched_counts *out)
{
    pthread_mutex_lock(&fs->lock);
    *out = fs->counts;
    out->running = count_running(fs);
    out->drops = atomic_load(&fs->drops);
    pthread_mutex_unlock(&fs->lock);
}

/* ---- the harness --------------------------------------------------------------------------- */

static void remove_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d != NULL) {
        struct dirent *de;
        char path[512];
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
            unlink(path);
        }
        closedir(d);
    }
    rmdir(dir);
}

static int spawn_router(struct rtr_env *e);

int rtr_env_start(struct rtr_env *e, const char *const *extra_args)
{
    memset(e, 0, sizeof(*e));
    snprintf(e->dir, sizeof(e->dir), "/tmp/pagoda-rtr-XXXXXX");
    if (mkdtemp(e->dir) == NULL)
        return -1;
    snprintf(e->sched_url, sizeof(e->sched_url), "ipc://%s/scheduler.ipc", e->dir);
    snprintf(e->url, sizeof(e->url), "ipc://%s/router.ipc", e->dir);
    if (fake_sched_start(e->sched_url, &e->fs) != 0)
        return -1;
    const char *base[] = {PAGODA_BIN_DIR "/pagoda-router",
                          "--run-dir",
                          e->dir,
                          "--listen",
                          e->url,
                          "--log-level",
                          "warn"};
    int argc = 0;
    for (size_t i = 0; i < sizeof(base) / sizeof(base[0]); i++)
        e->argv[argc++] = base[i];
    for (int i = 0; extra_args != NULL && extra_args[i] != NULL && argc < 31; i++)
        e->argv[argc++] = extra_args[i];
    e->argv[argc] = NULL;
    return spawn_router(e);
}

int rtr_env_restart_router(struct rtr_env *e)
{
    if (e->router > 0) {
        kill(e->router, SIGKILL);
        waitpid(e->router, NULL, 0);
        e->router = 0;
    }
    return spawn_router(e);
}

static int spawn_router(struct rtr_env *e)
{
    const char *const *argv = e->argv;
    /* fork and exec rather than posix_spawn, so that the router dies with a test that dies
     * (PR_SET_PDEATHSIG) instead of draining on without its parent. */
    pid_t parent = getpid();
    e->router = fork();
    if (e->router < 0)
        return -1;
    if (e->router == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    pagoda_client *c;
    if (pagoda_client_open(e->url, &c) != 0)
        return -1;
    pagoda_client_set_timeout_ms(c, 200);
    int healthy = 0;
    for (uint64_t t0 = rtr_now_ms(); !healthy && rtr_now_ms() - t0 < 10000;) {
        if (pagoda_health(c, &healthy) != 0 || !healthy)
            usleep(10000);
    }
    pagoda_client_close(c);
    return healthy ? 0 : -1;
}

int rtr_router_check(const char *const *extra_args, char *err, size_t err_size)
{
    const char *argv[32] = {PAGODA_BIN_DIR "/pagoda-router",   "--run-dir", "/tmp", "--listen",
                            "ipc:///tmp/pagoda-rtr-check.ipc", "--check"};
    int argc = 6;
    for (int i = 0; extra_args != NULL && extra_args[i] != NULL && argc < 31; i++)
        argv[argc++] = extra_args[i];
    argv[argc] = NULL;
    int fds[2];
    if (pipe(fds) != 0)
        return -1;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(fds[1]);
    size_t len = 0;
    ssize_t n;
    while (err_size > 0 && (n = read(fds[0], err + len, err_size - 1 - len)) > 0)
        len += (size_t)n;
    if (err_size > 0)
        err[len] = '\0';
    close(fds[0]);
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int rtr_env_wait(struct rtr_env *e, int timeout_ms)
{
    uint64_t t0 = rtr_now_ms();
    for (;;) {
        int status;
        pid_t p = waitpid(e->router, &status, WNOHANG);
        if (p == e->router) {
            e->router = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        if (rtr_now_ms() - t0 > (uint64_t)timeout_ms)
            return -2;
        usleep(5000);
    }
}

int rtr_env_stop(struct rtr_env *e)
{
    int status = 0;
    if (e->router > 0) {
        kill(e->router, SIGTERM);
        status = rtr_env_wait(e, 20000);
        if (status == -2) {
            kill(e->router, SIGKILL);
            waitpid(e->router, NULL, 0);
            e->router = 0;
        }
    }
    fake_sched_stop(e->fs);
    e->fs = NULL;
    remove_dir(e->dir);
    return status;
}
