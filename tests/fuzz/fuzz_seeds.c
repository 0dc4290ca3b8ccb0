/* pagoda-fuzz-seeds OUT_DIR: writes the seed corpora of the protobuf fuzz targets (fuzz_router,
 * fuzz_mirror) into OUT_DIR/router and OUT_DIR/mirror: short, valid exchanges and near-valid
 * messages, built with the generated protobuf-c code so that they stay valid when the .proto
 * files change. Deterministic. (make_corpus.py writes the JSON, safetensors and scheduler
 * seeds.) */
#include "proto/internal.pb-c.h"
#include "proto/pagoda.pb-c.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define MAX_SCRIPT 16384

struct script {
    uint8_t data[MAX_SCRIPT];
    size_t len;
};

static void put_byte(struct script *s, uint8_t b)
{
    if (s->len >= MAX_SCRIPT)
        abort();
    s->data[s->len++] = b;
}

static void put_bytes(struct script *s, const void *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        put_byte(s, ((const uint8_t *)p)[i]);
}

/* A record: [2-byte little-endian length][the packed message]. */
static void put_msg(struct script *s, const ProtobufCMessage *m)
{
    uint8_t buf[4096];
    size_t n = protobuf_c_message_get_packed_size(m);
    if (n > sizeof(buf))
        abort();
    protobuf_c_message_pack(m, buf);
    put_byte(s, (uint8_t)(n & 0xff));
    put_byte(s, (uint8_t)(n >> 8));
    put_bytes(s, buf, n);
}

static const char *out_dir;

static void write_seed(const char *target, const char *name, const struct script *s)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", out_dir, target);
    if (mkdir(path, 0755) != 0 && errno != EEXIST) {
        perror(path);
        exit(1);
    }
    snprintf(path, sizeof(path), "%s/%s/%s", out_dir, target, name);
    FILE *f = fopen(path, "wb");
    if (f == NULL || fwrite(s->data, 1, s->len, f) != s->len || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

/* ---- the router's script (fuzz_router.c) ---------------------------------------------------- */

enum { OP_CALL = 0, OP_RAW_LINK = 4, OP_ANSWER = 5, OP_LINK = 6, OP_TIME = 7 };

static uint8_t ID_A[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static uint8_t ID_B[16] = {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9};

static void call(struct script *s, Pagoda__ClientRequest *req)
{
    put_byte(s, OP_CALL);
    put_msg(s, &req->base);
}

/* submit_body and poll_body write a call's record only (its op byte, which names the client
 * connection, written before); submit and poll_call write OP_CALL first (no connection). */

static void submit_body(struct script *s, const char *key, uint8_t *id, size_t id_len,
                        size_t n_prompt, int32_t max_tokens, float temperature)
{
    int32_t prompt[80];
    for (size_t i = 0; i < n_prompt && i < 80; i++)
        prompt[i] = (int32_t)(i * 7 + 1);
    Pagoda__SamplingParams sp = PAGODA__SAMPLING_PARAMS__INIT;
    sp.has_temperature = sp.has_logprobs = 1;
    sp.temperature = temperature;
    sp.logprobs = 1;
    int32_t bias_ids[2] = {3, 4};
    float bias_values[2] = {2.0f, -100.0f};
    sp.n_logit_bias_token_ids = sp.n_logit_bias_values = 2;
    sp.logit_bias_token_ids = bias_ids;
    sp.logit_bias_values = bias_values;
    sp.has_min_tokens = 1;
    sp.min_tokens = 1;
    int32_t stop[2] = {5, 6};
    Pagoda__SubmitRequest sub = PAGODA__SUBMIT_REQUEST__INIT;
    sub.has_request_id = 1;
    sub.request_id.data = id;
    sub.request_id.len = id_len;
    sub.n_prompt_token_ids = n_prompt;
    sub.prompt_token_ids = prompt;
    sub.sampling = &sp;
    sub.has_max_tokens = 1;
    sub.max_tokens = max_tokens;
    sub.n_stop_token_ids = 2;
    sub.stop_token_ids = stop;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.has_protocol_version = 1;
    req.protocol_version = 1;
    req.api_key = (char *)key;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_SUBMIT;
    req.submit = &sub;
    put_msg(s, &req.base);
}

static void submit(struct script *s, const char *key, uint8_t *id, size_t id_len, size_t n_prompt,
                   int32_t max_tokens, float temperature)
{
    put_byte(s, OP_CALL);
    submit_body(s, key, id, id_len, n_prompt, max_tokens, temperature);
}

static void poll_body(struct script *s, const char *key, uint8_t *id, uint32_t offset,
                      uint32_t wait_ms)
{
    Pagoda__PollRequest p = PAGODA__POLL_REQUEST__INIT;
    p.has_request_id = p.has_offset = p.has_wait_ms = 1;
    p.request_id.data = id;
    p.request_id.len = 16;
    p.offset = offset;
    p.wait_ms = wait_ms;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.api_key = (char *)key;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_POLL;
    req.poll = &p;
    put_msg(s, &req.base);
}

static void poll_call(struct script *s, const char *key, uint8_t *id, uint32_t offset,
                      uint32_t wait_ms)
{
    put_byte(s, OP_CALL);
    poll_body(s, key, id, offset, wait_ms);
}

static void cancel_call(struct script *s, const char *key, uint8_t *id)
{
    Pagoda__CancelRequest c = PAGODA__CANCEL_REQUEST__INIT;
    c.has_request_id = 1;
    c.request_id.data = id;
    c.request_id.len = 16;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.api_key = (char *)key;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_CANCEL;
    req.cancel = &c;
    call(s, &req);
}

static void simple_call(struct script *s, const char *key, int which)
{
    Pagoda__HealthRequest h = PAGODA__HEALTH_REQUEST__INIT;
    Pagoda__StatsRequest st = PAGODA__STATS_REQUEST__INIT;
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.api_key = (char *)key;
    if (which == 0) {
        req.call_case = PAGODA__CLIENT_REQUEST__CALL_HEALTH;
        req.health = &h;
    } else {
        req.call_case = PAGODA__CLIENT_REQUEST__CALL_STATS;
        req.stats = &st;
    }
    call(s, &req);
}

static void admin_call(struct script *s, const char *key, Pagoda__AdminRequest *a)
{
    Pagoda__ClientRequest req = PAGODA__CLIENT_REQUEST__INIT;
    req.api_key = (char *)key;
    req.call_case = PAGODA__CLIENT_REQUEST__CALL_ADMIN;
    req.admin = a;
    call(s, &req);
}

/* The scheduler's answers (fuzz_router.c's scheduler_answer): a what byte and its arguments. */
static void answer_events(struct script *s, uint8_t index, uint8_t offset, uint8_t n, bool finish)
{
    put_byte(s, OP_ANSWER);
    put_byte(s, (uint8_t)(0 | 8 | (finish ? 16 : 0)));
    put_byte(s, index);
    put_byte(s, offset);
    put_byte(s, n);
    for (uint8_t i = 0; i < n; i++)
        put_byte(s, (uint8_t)(10 + i));
    for (uint8_t i = 0; i < n; i++)
        put_byte(s, 8);
    put_byte(s, finish ? 2 : 0); /* FINISH_LENGTH */
    put_byte(s, 4);              /* prompt_tokens */
    put_byte(s, 0);              /* cached_tokens */
}

static void router_seeds(void)
{
    struct script s = {0};
    /* A request's life without tenants: submit, poll, tokens, poll, finish, poll, stats. */
    put_byte(&s, 2); /* no tenants file, the scheduler there */
    submit(&s, NULL, ID_A, 16, 4, 8, 0.0f);
    poll_call(&s, NULL, ID_A, 0, 0);
    answer_events(&s, 0, 0, 3, false);
    poll_call(&s, NULL, ID_A, 0, 1);
    answer_events(&s, 0, 3, 5, true);
    poll_call(&s, NULL, ID_A, 3, 1);
    simple_call(&s, NULL, 1);
    put_byte(&s, OP_ANSWER);
    put_byte(&s, 2 | 4); /* stats */
    put_byte(&s, 1);
    put_byte(&s, 50);
    simple_call(&s, NULL, 0);
    cancel_call(&s, NULL, ID_A);
    write_seed("router", "life.bin", &s);

    /* Parked polls time out; the link goes down and up; a cancel. */
    s.len = 0;
    put_byte(&s, 0);
    submit(&s, "any", ID_B, 16, 3, 0, 1.0f);
    poll_call(&s, NULL, ID_B, 0, 1000);
    put_byte(&s, OP_LINK);
    put_byte(&s, 0);
    put_byte(&s, OP_TIME);
    poll_call(&s, NULL, ID_A, 0, 1000);
    cancel_call(&s, NULL, ID_B);
    put_byte(&s, OP_LINK);
    put_byte(&s, 1);
    put_byte(&s, OP_LINK);
    put_byte(&s, 2);
    submit(&s, NULL, ID_A, 16, 2, 4, 0.0f);
    put_byte(&s, OP_LINK);
    put_byte(&s, 0);
    put_byte(&s, OP_TIME);
    write_seed("router", "link.bin", &s);

    /* With tenants: a tenant's requests, the admin API and its answers. */
    s.len = 0;
    put_byte(&s, 3);
    submit(&s, "k1", ID_A, 16, 4, 8, 0.0f);
    submit(&s, "k3", ID_A, 16, 4, 8, 0.0f);
    submit(&s, "adm", ID_B, 16, 4, 8, 0.0f);
    submit(&s, "nobody", ID_B, 16, 4, 8, 0.0f);
    poll_call(&s, "k2", ID_A, 0, 0);
    poll_call(&s, "k3", ID_A, 0, 0);
    simple_call(&s, "adm", 1);
    Pagoda__AdminRequest a = PAGODA__ADMIN_REQUEST__INIT;
    Pagoda__AdminTenantsRequest at = PAGODA__ADMIN_TENANTS_REQUEST__INIT;
    a.op_case = PAGODA__ADMIN_REQUEST__OP_TENANTS;
    a.tenants = &at;
    admin_call(&s, "adm", &a);
    put_byte(&s, OP_ANSWER);
    put_byte(&s, 3 | 8 | 16 | 32 | 64);
    for (int i = 0; i < 6; i++)
        put_byte(&s, (uint8_t)(i + 1));
    Pagoda__AdminPinRequest pin = PAGODA__ADMIN_PIN_REQUEST__INIT;
    int32_t pin_tokens[3] = {4, 5, 6};
    char *pin_tenants[2] = {"alice", "bob"};
    pin.name = "p2";
    pin.n_token_ids = 3;
    pin.token_ids = pin_tokens;
    pin.n_tenants = 2;
    pin.tenants = pin_tenants;
    a.op_case = PAGODA__ADMIN_REQUEST__OP_PIN;
    a.pin = &pin;
    admin_call(&s, "adm", &a);
    put_byte(&s, OP_ANSWER);
    put_byte(&s, 2 | 16 | 32);
    put_byte(&s, 3);
    Pagoda__AdminUnpinRequest unpin = PAGODA__ADMIN_UNPIN_REQUEST__INIT;
    unpin.name = "sys";
    a.op_case = PAGODA__ADMIN_REQUEST__OP_UNPIN;
    a.unpin = &unpin;
    admin_call(&s, "adm", &a);
    Pagoda__AdminFlushRequest flush = PAGODA__ADMIN_FLUSH_REQUEST__INIT;
    flush.tenant = "bob";
    a.op_case = PAGODA__ADMIN_REQUEST__OP_FLUSH;
    a.flush = &flush;
    admin_call(&s, "adm", &a);
    put_byte(&s, OP_ANSWER);
    put_byte(&s, 3);
    for (int i = 0; i < 6; i++)
        put_byte(&s, 2);
    flush.tenant = NULL;
    flush.group = "team";
    admin_call(&s, "adm", &a);
    Pagoda__AdminReloadRequest reload = PAGODA__ADMIN_RELOAD_REQUEST__INIT;
    a.op_case = PAGODA__ADMIN_REQUEST__OP_RELOAD;
    a.reload = &reload;
    admin_call(&s, "adm", &a);
    admin_call(&s, "k1", &a);
    put_byte(&s, OP_TIME);
    write_seed("router", "tenants.bin", &s);

    /* Near-valid calls, one each. */
    s.len = 0;
    put_byte(&s, 2);
    submit(&s, NULL, ID_A, 15, 4, 8, 0.0f);  /* a short id */
    submit(&s, NULL, ID_A, 16, 0, 8, 0.0f);  /* an empty prompt */
    submit(&s, NULL, ID_A, 16, 80, 8, 0.0f); /* a prompt above max_prompt_tokens */
    submit(&s, NULL, ID_A, 16, 4, -1, 0.0f); /* negative max_tokens */
    submit(&s, NULL, ID_A, 16, 4, 8, -1.0f); /* a negative temperature */
    submit(&s, NULL, ID_A, 16, 4, 8, 0.0f);  /* then a valid one */
    submit(&s, NULL, ID_A, 16, 4, 9, 0.0f);  /* the same id, other parameters */
    Pagoda__ClientRequest empty = PAGODA__CLIENT_REQUEST__INIT;
    call(&s, &empty);      /* no call */
    put_byte(&s, OP_CALL); /* not a ClientRequest */
    put_byte(&s, 3);
    put_byte(&s, 0);
    put_bytes(&s, "\xff\xff\xff", 3);
    put_byte(&s, OP_RAW_LINK); /* not a ToRouter */
    put_byte(&s, 2);
    put_byte(&s, 0);
    put_bytes(&s, "\x0a\xff", 2);
    write_seed("router", "refusals.bin", &s);

    /* The front: client connections (the fifth over the cap of 4), calls on them, parked polls
     * up to the bound (max_parked_calls 3) and one beyond it, a Stats refused while they wait,
     * Health still answered; the model's context lowering the prompt limit; a finished request
     * resent (recognised without its prompt); time passing (idle connections closed). */
    s.len = 0;
    put_byte(&s, 2);
    for (int i = 0; i < 5; i++) {
        put_byte(&s, OP_LINK);
        put_byte(&s, 3);
    }
    put_byte(&s, OP_CALL | 8); /* on the first connection */
    submit_body(&s, NULL, ID_A, 16, 4, 8, 0.0f);
    for (uint8_t conn = 1; conn <= 4; conn++) {
        put_byte(&s, (uint8_t)(OP_CALL | conn << 3));
        poll_body(&s, NULL, ID_A, 0, 1000);
    }
    simple_call(&s, NULL, 1); /* Stats: the parked calls are at the bound */
    simple_call(&s, NULL, 0); /* Health */
    answer_events(&s, 0, 0, 8, true);
    submit(&s, NULL, ID_A, 16, 4, 8, 0.0f); /* resent once finished */
    submit(&s, NULL, ID_A, 16, 5, 8, 0.0f); /* the same id, another prompt */
    put_byte(&s, OP_ANSWER);                /* ModelInfo: a context of 40 positions */
    put_byte(&s, 2 | 4 | 128);
    put_byte(&s, 40);
    put_byte(&s, 0);
    submit(&s, NULL, ID_B, 16, 50, 8, 0.0f); /* over the lowered limit */
    put_byte(&s, OP_ANSWER);                 /* ModelInfo without its field */
    put_byte(&s, 2 | 4 | 8 | 128);
    put_byte(&s, 0);
    put_byte(&s, 0);
    put_byte(&s, OP_ANSWER); /* ModelInfo: 2^32 positions, beyond the field's range */
    put_byte(&s, 2 | 4 | 16 | 128);
    put_byte(&s, 0);
    put_byte(&s, 16);
    put_byte(&s, OP_ANSWER); /* ModelInfo: 2^20 positions, the configured limit again */
    put_byte(&s, 2 | 4 | 16 | 128);
    put_byte(&s, 1);
    put_byte(&s, 0);
    submit(&s, NULL, ID_B, 16, 50, 8, 0.0f);
    put_byte(&s, OP_LINK); /* the second connection goes (what % 5 == 4, index what >> 3) */
    put_byte(&s, 4 + 5);
    put_byte(&s, OP_TIME);
    put_byte(&s, OP_CALL | 8);
    poll_body(&s, NULL, ID_B, 0, 0);
    simple_call(&s, NULL, 1);
    put_byte(&s, OP_ANSWER);
    put_byte(&s, 2 | 4); /* stats */
    put_byte(&s, 2);
    put_byte(&s, 40);
    write_seed("router", "front.bin", &s);

    /* With tenants: a tenant's own Stats, answered (alice) and answered with another tenant's
     * figures (bob); a reload read on the threadpool, and a second one while it reads. */
    s.len = 0;
    put_byte(&s, 3);
    submit(&s, "k1", ID_A, 16, 4, 8, 0.0f);
    simple_call(&s, "k1", 1);
    put_byte(&s, OP_ANSWER);
    put_byte(&s, 3 | 8 | 16 | 32);
    for (int i = 0; i < 6; i++)
        put_byte(&s, (uint8_t)(i + 3));
    simple_call(&s, "k3", 1);
    put_byte(&s, OP_ANSWER);
    put_byte(&s, 3 | 16);
    for (int i = 0; i < 6; i++)
        put_byte(&s, 1);
    simple_call(&s, "k3", 1);
    put_byte(&s, OP_ANSWER);
    put_byte(&s, 3 | 4);
    for (int i = 0; i < 6; i++)
        put_byte(&s, 1);
    a.op_case = PAGODA__ADMIN_REQUEST__OP_RELOAD;
    a.reload = &reload;
    admin_call(&s, "adm", &a);
    admin_call(&s, "adm", &a);
    put_byte(&s, OP_TIME | 16); /* the read completes: the Policy goes out */
    put_byte(&s, OP_ANSWER);    /* and is applied */
    put_byte(&s, 2 | 16 | 32);
    put_byte(&s, 3);
    admin_call(&s, "adm", &a); /* a reload that the router's close cancels */
    simple_call(&s, "adm", 1);
    put_byte(&s, OP_ANSWER);
    put_byte(&s, 2 | 4);
    put_byte(&s, 1);
    put_byte(&s, 50);
    write_seed("router", "tenant_stats.bin", &s);
}

/* ---- the mirror's messages (fuzz_mirror.c) -------------------------------------------------- */

static void to_worker_resync(struct script *s, uint64_t epoch, uint64_t next_step,
                             Pagoda__Internal__SequenceSnapshot **seqs, size_t n)
{
    Pagoda__Internal__Resync r = PAGODA__INTERNAL__RESYNC__INIT;
    r.has_epoch = r.has_resync_id = r.has_next_step_id = 1;
    r.epoch = epoch;
    r.resync_id = 1;
    r.next_step_id = next_step;
    r.n_seqs = n;
    r.seqs = seqs;
    Pagoda__Internal__ToWorker m = PAGODA__INTERNAL__TO_WORKER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC;
    m.resync = &r;
    put_msg(s, &m.base);
}

static void to_worker_step(struct script *s, Pagoda__Internal__Step *st)
{
    Pagoda__Internal__ToWorker m = PAGODA__INTERNAL__TO_WORKER__INIT;
    m.msg_case = PAGODA__INTERNAL__TO_WORKER__MSG_STEP;
    m.step = st;
    put_msg(s, &m.base);
}

static void mirror_seeds(void)
{
    struct script s = {0};
    int32_t tokens[20];
    for (int i = 0; i < 20; i++)
        tokens[i] = i + 3;
    int32_t blocks_a[2] = {1, 2}, blocks_b[3] = {3, 4, 5}, more[1] = {6};
    Pagoda__Internal__SamplingParams sp = PAGODA__INTERNAL__SAMPLING_PARAMS__INIT;
    sp.has_temperature = sp.has_top_p = 1;
    sp.temperature = 0.7f;
    sp.top_p = 0.9f;
    /* a logit bias and min_tokens' stop ids (one id in both) */
    int32_t bias_ids[3] = {7, 9, 2}, stop_ids[2] = {2, 3};
    float bias_values[3] = {100.0f, -5.5f, 1.0f};
    sp.n_logit_bias_token_ids = sp.n_logit_bias_values = 3;
    sp.logit_bias_token_ids = bias_ids;
    sp.logit_bias_values = bias_values;
    sp.has_min_tokens = 1;
    sp.min_tokens = 2;
    sp.n_min_tokens_stop_ids = 2;
    sp.min_tokens_stop_ids = stop_ids;

    /* Resync, then two sequences prefilled in chunks, decoded, one finished, one preempted. */
    to_worker_resync(&s, 5, 1, NULL, 0);
    Pagoda__Internal__NewSequence na = PAGODA__INTERNAL__NEW_SEQUENCE__INIT;
    na.has_seq_id = na.has_num_prompt_tokens = na.has_num_computed_tokens = 1;
    na.has_num_new_tokens = 1;
    na.seq_id = 1;
    na.n_token_ids = 12;
    na.token_ids = tokens;
    na.num_prompt_tokens = 12;
    na.n_block_ids = 2;
    na.block_ids = blocks_a;
    na.num_new_tokens = 12;
    Pagoda__Internal__NewSequence nb = na;
    nb.seq_id = 2;
    nb.n_token_ids = 20;
    nb.num_prompt_tokens = 20;
    nb.n_block_ids = 2;
    nb.block_ids = blocks_b;
    nb.num_new_tokens = 10;
    nb.sampling = &sp;
    Pagoda__Internal__NewSequence *news[2] = {&na, &nb};
    Pagoda__Internal__Step st = PAGODA__INTERNAL__STEP__INIT;
    st.has_epoch = st.has_step_id = 1;
    st.epoch = 5;
    st.step_id = 1;
    st.n_new_seqs = 2;
    st.new_seqs = news;
    to_worker_step(&s, &st);

    Pagoda__Internal__ContinuingSequence ca = PAGODA__INTERNAL__CONTINUING_SEQUENCE__INIT;
    ca.has_seq_id = ca.has_num_computed_tokens = ca.has_num_new_tokens = 1;
    ca.seq_id = 1;
    ca.num_computed_tokens = 12;
    ca.num_new_tokens = 1;
    Pagoda__Internal__ContinuingSequence cb = ca;
    cb.seq_id = 2;
    cb.num_computed_tokens = 10;
    cb.num_new_tokens = 10;
    cb.n_appended_block_ids = 1;
    cb.appended_block_ids = more;
    Pagoda__Internal__ContinuingSequence *conts[2] = {&ca, &cb};
    st.step_id = 2;
    st.n_new_seqs = 0;
    st.n_cont_seqs = 2;
    st.cont_seqs = conts;
    to_worker_step(&s, &st);

    ca.num_computed_tokens = 13;
    cb.num_computed_tokens = 20;
    cb.num_new_tokens = 1;
    cb.n_appended_block_ids = 0;
    st.step_id = 3;
    to_worker_step(&s, &st);

    uint64_t finished[1] = {1}, preempted[1] = {2};
    st.step_id = 4;
    st.n_cont_seqs = 0;
    st.n_finished_seq_ids = 1;
    st.finished_seq_ids = finished;
    st.n_preempted_seq_ids = 1;
    st.preempted_seq_ids = preempted;
    to_worker_step(&s, &st);
    write_seed("mirror", "steps.bin", &s);

    /* A resync with a snapshot, then a step continuing it. */
    s.len = 0;
    Pagoda__Internal__SequenceSnapshot snap = PAGODA__INTERNAL__SEQUENCE_SNAPSHOT__INIT;
    snap.has_seq_id = snap.has_num_prompt_tokens = snap.has_num_computed_tokens = 1;
    snap.seq_id = 7;
    snap.n_token_ids = 14;
    snap.token_ids = tokens;
    snap.num_prompt_tokens = 10;
    snap.n_block_ids = 2;
    snap.block_ids = blocks_a;
    snap.num_computed_tokens = 13;
    snap.sampling = &sp;
    Pagoda__Internal__SequenceSnapshot *snaps[1] = {&snap};
    to_worker_resync(&s, 9, 40, snaps, 1);
    ca.seq_id = 7;
    ca.num_computed_tokens = 13;
    ca.num_new_tokens = 1;
    st = (Pagoda__Internal__Step)PAGODA__INTERNAL__STEP__INIT;
    st.has_epoch = st.has_step_id = 1;
    st.epoch = 9;
    st.step_id = 40;
    st.n_cont_seqs = 1;
    st.cont_seqs = conts;
    to_worker_step(&s, &st);
    /* Near-valid: the same step again (a repeated step), another epoch, a lost step. */
    to_worker_step(&s, &st);
    st.epoch = 8;
    st.step_id = 41;
    to_worker_step(&s, &st);
    st.epoch = 9;
    st.step_id = 43;
    to_worker_step(&s, &st);
    write_seed("mirror", "resync.bin", &s);

    /* Near-valid resyncs: a block outside the pool, a token outside the vocabulary. */
    s.len = 0;
    int32_t bad_blocks[2] = {1, 17};
    snap.block_ids = bad_blocks;
    to_worker_resync(&s, 3, 1, snaps, 1);
    snap.block_ids = blocks_a;
    tokens[4] = 100;
    to_worker_resync(&s, 3, 1, snaps, 1);
    write_seed("mirror", "bad_resync.bin", &s);

    /* Per-sequence failures: a resync of the scheduler's pool (pool_id) with a sequence whose
     * token is outside the vocabulary (left out, the others kept), then a step with a valid new
     * sequence, one with a token outside the vocabulary (failed alone) and seq 5 (whose row
     * fuzz_mirror fails at commit), then a step continuing the survivor. */
    s.len = 0;
    tokens[4] = 100;
    Pagoda__Internal__SequenceSnapshot good = snap;
    good.seq_id = 8;
    good.token_ids = tokens + 5;
    good.n_token_ids = 14;
    good.block_ids = blocks_b;
    Pagoda__Internal__SequenceSnapshot *two[2] = {&snap, &good};
    Pagoda__Internal__Resync rs = PAGODA__INTERNAL__RESYNC__INIT;
    rs.has_epoch = rs.has_resync_id = rs.has_next_step_id = rs.has_pool_id = 1;
    rs.epoch = 6;
    rs.resync_id = 2;
    rs.next_step_id = 1;
    rs.pool_id = 9;
    rs.n_seqs = 2;
    rs.seqs = two;
    Pagoda__Internal__ToWorker tw = PAGODA__INTERNAL__TO_WORKER__INIT;
    tw.msg_case = PAGODA__INTERNAL__TO_WORKER__MSG_RESYNC;
    tw.resync = &rs;
    put_msg(&s, &tw.base);
    rs.n_seqs = 0; /* an empty one: the mirror is empty again */
    put_msg(&s, &tw.base);
    tokens[4] = 7;
    int32_t bad_tokens[4] = {3, 4, 1000, 5};
    Pagoda__Internal__NewSequence nbad = na;
    nbad.seq_id = 3;
    nbad.n_token_ids = 4;
    nbad.token_ids = bad_tokens;
    nbad.num_prompt_tokens = 4;
    nbad.n_block_ids = 1;
    nbad.block_ids = more;
    nbad.num_new_tokens = 4;
    Pagoda__Internal__NewSequence nfive = nbad;
    nfive.seq_id = 5;
    nfive.token_ids = tokens;
    nfive.block_ids = blocks_b;
    Pagoda__Internal__NewSequence *three[3] = {&na, &nbad, &nfive};
    st = (Pagoda__Internal__Step)PAGODA__INTERNAL__STEP__INIT;
    st.has_epoch = st.has_step_id = 1;
    st.epoch = 6;
    st.step_id = 1;
    st.n_new_seqs = 3;
    st.new_seqs = three;
    to_worker_step(&s, &st);
    ca.seq_id = 1;
    ca.num_computed_tokens = 12;
    ca.num_new_tokens = 1;
    st.step_id = 2;
    st.n_new_seqs = 0;
    st.n_cont_seqs = 1;
    st.cont_seqs = conts;
    to_worker_step(&s, &st);
    write_seed("mirror", "failures.bin", &s);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: pagoda-fuzz-seeds OUT_DIR\n");
        return 2;
    }
    out_dir = argv[1];
    router_seeds();
    mirror_seeds();
    return 0;
}
