/* The CUDA sampler's host side (kernels/cuda/sampler.h): the sampler's device and pinned
 * buffers, the history slots kept on the device, the staging and checks of a call's rows, the
 * launches of its kernels (sample_greedy in sampler_greedy.cu for the greedy rows without
 * penalties, sample_rows in sampler_rows.cu for the others, through sampler_kernels.cuh), the
 * rows' results, and cuda_gather_tokens with its kernel. */
#include "kernels/cuda/sampler.h"

extern "C" {
#include "common/error.h"
}
#include "kernels/cuda/sampler_kernels.cuh"

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A history slot (host bookkeeping; the tokens are in d_hist): key 0 is a free slot. */
struct hist_slot {
    uint64_t key;
    uint64_t used;     /* the call that last read it (struct cuda_sampler's calls) */
    uint64_t staged;   /* the call whose row took it (a second row with its key does not) */
    uint64_t twice;    /* a call that had its key in two rows: its appended token is not kept */
    uint32_t have;     /* its first `have` tokens are the key's history */
    uint32_t n_prompt; /* the key's prompt length, a check that the key still means the same */
};

struct cuda_sampler {
    int32_t vocab;
    int32_t max_rows;
    size_t max_history;
    float *d_logits;       /* [max_rows][vocab] penalised logits (rows with penalties) */
    int32_t *d_marks;      /* [max_rows][vocab] history marks, zero between calls */
    int32_t greedy_chunks; /* blocks per row of sample_greedy */
    struct greedy_partial *d_partials; /* [max_rows][greedy_chunks] */
    uint32_t *d_arrivals;              /* [max_rows], zero between calls */
    /* A call's row_desc[rows], its row list (int32[rows]: the greedy fast path's rows, then the
     * others, each in order), its history gathers (int32[2 * rows]: packed history index, source
     * index), then its packed int32 history. */
    unsigned char *d_stage;
    /* Pinned, the same layout, two in turn: a call fills one while the copy of the call before
     * may still wait on the stream; stage_copied[i] marks the end of the last copy from i. */
    unsigned char *h_stage[2];
    cudaEvent_t stage_copied[2];
    int next_stage;
    struct row_result *d_results; /* [max_rows] */
    /* The histories kept on the device (cuda_sampler_enqueue_keyed): max_rows slots of
     * max_history tokens, each holding the first `have` tokens of one key's history, its
     * sampled tokens appended by the kernels themselves; slots are found by key through an
     * open-addressing index (linear probing, index_cap a power of two >= 2 * max_rows). */
    int32_t *d_hist;
    struct hist_slot *slots;
    int32_t *index; /* [index_cap]: a slot, or -1 */
    uint32_t index_cap;
    uint64_t calls; /* enqueue calls so far: a slot's `used` is the last call that read it */
    int32_t hand;   /* where the search for a slot to take over starts */
    /* [CUDA_SAMPLER_SLOTS + 1][max_rows], pinned: one per slot of cuda_sampler_enqueue, then
     * cuda_sampler_sample's. */
    struct row_result *h_results;
};

static int cuda_failed(cudaError_t err, const char *call)
{
    return pagoda_error_set(PAGODA_ECUDA, "cuda sampler: %s: %s", call, cudaGetErrorString(err));
}

static size_t stage_desc_bytes(int32_t max_rows)
{
    return (size_t)max_rows * sizeof(struct row_desc);
}

/* Whether sample_greedy takes the row: greedy without penalties, the token the argmax of the
 * logits as given. */
static bool greedy_fast(const struct row_desc *d)
{
    return d->temperature == 0.0f && !d->penalties;
}

/* Where the row list ends and the history gathers begin in a stage of rows rows. */
static size_t stage_list_end(int32_t rows)
{
    return stage_desc_bytes(rows) + (size_t)rows * sizeof(int32_t);
}

/* Where the history gathers end and the history begins. */
static size_t stage_history_at(int32_t rows)
{
    return stage_list_end(rows) + 2 * (size_t)rows * sizeof(int32_t);
}

extern "C" int cuda_sampler_new(int32_t vocab, int32_t max_rows, size_t max_history,
                                struct cuda_sampler **out)
{
    if (!out)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: NULL out");
    *out = NULL;
    if (vocab < 1 || vocab > SAMPLER_VOCAB_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "cuda sampler: vocab %d outside [1, %d]", (int)vocab,
                                SAMPLER_VOCAB_MAX);
    if (max_rows < 1 || max_rows > CUDA_SAMPLER_ROWS_MAX)
        return pagoda_error_set(PAGODA_ERANGE, "cuda sampler: max_rows %d outside [1, %d]",
                                (int)max_rows, CUDA_SAMPLER_ROWS_MAX);
    if (max_history > SAMPLER_HISTORY_MAX || max_history * (size_t)max_rows > INT32_MAX)
        return pagoda_error_set(PAGODA_ERANGE,
                                "cuda sampler: max_history %zu (per row, %d rows) exceeds %d per "
                                "row or %d in all",
                                max_history, (int)max_rows, SAMPLER_HISTORY_MAX, INT32_MAX);

    struct cuda_sampler *s = (struct cuda_sampler *)calloc(1, sizeof(*s));
    if (!s)
        return pagoda_error_set(PAGODA_ENOMEM, "cuda sampler: %zu bytes", sizeof(*s));
    s->vocab = vocab;
    s->max_rows = max_rows;
    s->max_history = max_history;
    const size_t per_row = (size_t)max_rows * (size_t)vocab;
    const size_t stage_bytes =
        stage_history_at(max_rows) + max_history * (size_t)max_rows * sizeof(int32_t);
    s->greedy_chunks = (vocab + CUDA_SAMPLER_GREEDY_CHUNK - 1) / CUDA_SAMPLER_GREEDY_CHUNK;
    const size_t result_bytes = (size_t)max_rows * sizeof(struct row_result);
    int rc;
    cudaError_t err;
    if ((err = cudaMalloc((void **)&s->d_logits, per_row * sizeof(float))) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(logits)");
        goto fail;
    }
    if ((err = cudaMalloc((void **)&s->d_marks, per_row * sizeof(int32_t))) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(marks)");
        goto fail;
    }
    if ((err = cudaMemset(s->d_marks, 0, per_row * sizeof(int32_t))) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMemset(marks)");
        goto fail;
    }
    if ((err = cudaMalloc((void **)&s->d_partials, (size_t)max_rows * (size_t)s->greedy_chunks *
                                                       sizeof(struct greedy_partial))) !=
        cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(partials)");
        goto fail;
    }
    if ((err = cudaMalloc((void **)&s->d_arrivals, (size_t)max_rows * sizeof(uint32_t))) !=
        cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(arrivals)");
        goto fail;
    }
    if ((err = cudaMemset(s->d_arrivals, 0, (size_t)max_rows * sizeof(uint32_t))) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMemset(arrivals)");
        goto fail;
    }
    if ((err = cudaMalloc((void **)&s->d_stage, stage_bytes)) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(stage)");
        goto fail;
    }
    for (int i = 0; i < 2; i++) {
        if ((err = cudaMallocHost((void **)&s->h_stage[i], stage_bytes)) != cudaSuccess) {
            rc = cuda_failed(err, "cudaMallocHost(stage)");
            goto fail;
        }
        if ((err = cudaEventCreateWithFlags(&s->stage_copied[i], cudaEventDisableTiming)) !=
            cudaSuccess) {
            rc = cuda_failed(err, "cudaEventCreate(stage)");
            goto fail;
        }
    }
    if ((err = cudaMalloc((void **)&s->d_results, result_bytes)) != cudaSuccess) {
        rc = cuda_failed(err, "cudaMalloc(results)");
        goto fail;
    }
    if (max_history > 0) {
        if ((err = cudaMalloc((void **)&s->d_hist,
                              max_history * (size_t)max_rows * sizeof(int32_t))) != cudaSuccess) {
            rc = cuda_failed(err, "cudaMalloc(history slots)");
            goto fail;
        }
        s->index_cap = 1;
        while (s->index_cap < 2 * (uint32_t)max_rows)
            s->index_cap *= 2;
        s->slots = (struct hist_slot *)calloc((size_t)max_rows, sizeof(*s->slots));
        s->index = (int32_t *)malloc(s->index_cap * sizeof(*s->index));
        if (!s->slots || !s->index) {
            rc = pagoda_error_set(PAGODA_ENOMEM, "cuda sampler: history slots of %d rows",
                                  (int)max_rows);
            goto fail;
        }
        for (uint32_t i = 0; i < s->index_cap; i++)
            s->index[i] = -1;
    }
    if ((err = cudaMallocHost((void **)&s->h_results, (CUDA_SAMPLER_SLOTS + 1) * result_bytes)) !=
        cudaSuccess) {
        rc = cuda_failed(err, "cudaMallocHost(results)");
        goto fail;
    }
    /* The memsets above run on the legacy default stream, which the caller's stream need not
     * wait for (a non-blocking stream: the CUDA backend's): the greedy path's counters must be
     * zero before its first launch, whatever stream that is. */
    if ((err = cudaDeviceSynchronize()) != cudaSuccess) {
        rc = cuda_failed(err, "cudaDeviceSynchronize(zeroed counters)");
        goto fail;
    }
    *out = s;
    return 0;

fail:
    cuda_sampler_free(s);
    return rc;
}

/* Frees what exists; errors are ignored, since nothing could be done about them here. */
extern "C" void cuda_sampler_free(struct cuda_sampler *s)
{
    if (!s)
        return;
    cudaFree(s->d_logits);
    cudaFree(s->d_marks);
    cudaFree(s->d_partials);
    cudaFree(s->d_arrivals);
    cudaFree(s->d_stage);
    for (int i = 0; i < 2; i++) {
        if (s->stage_copied[i]) {
            cudaEventSynchronize(s->stage_copied[i]);
            cudaEventDestroy(s->stage_copied[i]);
        }
        cudaFreeHost(s->h_stage[i]);
    }
    cudaFree(s->d_results);
    cudaFreeHost(s->h_results);
    cudaFree(s->d_hist);
    free(s->slots);
    free(s->index);
    free(s);
}

/* Re-records the current detail with "row r: " in front. */
static int row_error(int rc, int32_t row)
{
    char detail[512];
    snprintf(detail, sizeof(detail), "%s", pagoda_error_detail());
    return pagoda_error_set(rc, "cuda sampler: row %d: %s", (int)row, detail);
}

/* ---- history slots ---- */

static uint32_t key_home(const struct cuda_sampler *s, uint64_t key)
{
    return (uint32_t)((key * UINT64_C(0x9E3779B97F4A7C15)) >> 32) & (s->index_cap - 1);
}

/* The slot of key, or -1. */
static int32_t slot_find(const struct cuda_sampler *s, uint64_t key)
{
    for (uint32_t i = key_home(s, key);; i = (i + 1) & (s->index_cap - 1)) {
        const int32_t k = s->index[i];
        if (k < 0)
            return -1;
        if (s->slots[k].key == key)
            return k;
    }
}

/* Removes key from the index (linear probing's backward shift: the entries after it that would
 * no longer be found move up). */
static void index_remove(struct cuda_sampler *s, uint64_t key)
{
    const uint32_t mask = s->index_cap - 1;
    uint32_t i = key_home(s, key);
    while (s->index[i] >= 0 && s->slots[s->index[i]].key != key)
        i = (i + 1) & mask;
    if (s->index[i] < 0)
        return;
    for (uint32_t j = (i + 1) & mask; s->index[j] >= 0; j = (j + 1) & mask) {
        const uint32_t home = key_home(s, s->slots[s->index[j]].key);
        /* the entry at j may fill the hole at i when its home is not in (i, j] cyclically */
        if (((j - home) & mask) >= ((j - i) & mask)) {
            s->index[i] = s->index[j];
            i = j;
        }
    }
    s->index[i] = -1;
}

/* A slot for key, which has none: a free one, else one that no call read in the last two (most
 * likely done with), else any whose key this call does not have (slots_mark has marked those it
 * has: a call has at most max_rows keys, so one is left). Its tokens are none yet. Taking over
 * the slot of a call still on the device is safe: calls run in order on one stream, so this
 * call's copy into the slot comes after that call's reads and its append. */
static int32_t slot_take(struct cuda_sampler *s, uint64_t key)
{
    int32_t pick = -1;
    for (int32_t n = 0; n < s->max_rows && pick < 0; n++) {
        const int32_t k = (s->hand + n) % s->max_rows;
        if (s->slots[k].key == 0 || s->slots[k].used + 2 < s->calls)
            pick = k;
    }
    for (int32_t n = 0; n < s->max_rows && pick < 0; n++) {
        const int32_t k = (s->hand + n) % s->max_rows;
        if (s->slots[k].used != s->calls)
            pick = k;
    }
    s->hand = (pick + 1) % s->max_rows;
    if (s->slots[pick].key != 0)
        index_remove(s, s->slots[pick].key);
    s->slots[pick] = (struct hist_slot){.key = key};
    uint32_t i = key_home(s, key);
    while (s->index[i] >= 0)
        i = (i + 1) & (s->index_cap - 1);
    s->index[i] = pick;
    return pick;
}

/* Marks the slots of the call's keys (those of penalised rows) as read by it before any row
 * takes a slot, so that none of them is taken over for another key of the call. */
static void slots_mark(struct cuda_sampler *s, int32_t rows, const struct sampling_params *params,
                       const uint64_t *keys)
{
    if (!keys || !s->d_hist)
        return;
    for (int32_t r = 0; r < rows; r++) {
        if (keys[r] == 0 || !sampling_params_penalised(&params[r]))
            continue;
        const int32_t k = slot_find(s, keys[r]);
        if (k < 0)
            continue;
        s->slots[k].used = s->calls;
    }
}

/* The history slot of a penalised row with key (not 0) and its tokens of the device's that
 * stand (*have), or -1 when the row's history is packed whole: no key, no slots, or a key that
 * an earlier row of this call has taken. */
static int32_t row_slot(struct cuda_sampler *s, uint64_t key, size_t n_prompt, size_t n_history,
                        size_t *have)
{
    *have = 0;
    if (key == 0 || !s->d_hist)
        return -1;
    int32_t k = slot_find(s, key);
    if (k >= 0 && s->slots[k].staged == s->calls) {
        s->slots[k].twice = s->calls;
        return -1;
    }
    if (k < 0)
        k = slot_take(s, key);
    struct hist_slot *h = &s->slots[k];
    h->used = h->staged = s->calls;
    if (h->n_prompt != (uint32_t)n_prompt) { /* a key that means another history now */
        h->n_prompt = (uint32_t)n_prompt;
        h->have = 0;
    }
    if (h->have > n_history) /* tokens past the history (a wasted one's) do not stand */
        h->have = (uint32_t)n_history;
    *have = h->have;
    return k;
}

/* The host's share of sampler_sample()'s checks for row r, in the same order (parameters,
 * NULLs, history length, token ids: of the tokens packed, the others are on the device), and
 * the row's packing into the stage: its whole history, or with a key (not 0) the tokens its
 * history slot lacks. */
static int stage_row(struct cuda_sampler *s, int32_t r, const struct sampling_params *p,
                     uint64_t output_index, const int32_t *prompt, size_t n_prompt,
                     const int32_t *output, size_t n_output, uint64_t key, struct row_desc *desc,
                     int32_t *history, size_t *history_used)
{
    int rc = sampling_params_validate(p);
    if (rc < 0)
        return row_error(rc, r);
    if ((n_prompt > 0 && !prompt) || (n_output > 0 && !output))
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: row %d: NULL history", (int)r);
    if (n_prompt > s->max_history || n_output > s->max_history - n_prompt)
        return pagoda_error_set(PAGODA_ERANGE,
                                "cuda sampler: row %d: history of %zu prompt + %zu output "
                                "tokens exceeds %zu",
                                (int)r, n_prompt, n_output, s->max_history);
    size_t from = 0;
    const int32_t hslot =
        sampling_params_penalised(p) ? row_slot(s, key, n_prompt, n_prompt + n_output, &from) : -1;
    for (int pass = 0; pass < 2; pass++) {
        const int32_t *t = pass == 0 ? prompt : output;
        size_t n = pass == 0 ? n_prompt : n_output, base = pass == 0 ? 0 : n_prompt;
        for (size_t i = from > base ? from - base : 0; i < n; i++)
            if (t[i] < 0 || t[i] >= s->vocab)
                return pagoda_error_set(PAGODA_EINVAL,
                                        "cuda sampler: row %d: %s token %zu is %d, outside "
                                        "[0, %d)",
                                        (int)r, pass == 0 ? "prompt" : "output", i, (int)t[i],
                                        (int)s->vocab);
    }

    memset(desc, 0, sizeof(*desc));
    desc->seed = p->seed;
    desc->output_index = output_index;
    desc->temperature = p->temperature;
    desc->top_p = p->top_p;
    desc->min_p = p->min_p;
    desc->repetition_penalty = p->repetition_penalty;
    desc->presence_penalty = p->presence_penalty;
    desc->frequency_penalty = p->frequency_penalty;
    desc->top_k = p->top_k;
    /* With every penalty off the history stays on the host. */
    desc->penalties = sampling_params_penalised(p);
    desc->hslot = hslot;
    if (desc->penalties) {
        desc->hist_offset = (uint32_t)*history_used;
        desc->n_prompt = (uint32_t)n_prompt;
        desc->n_output = (uint32_t)n_output;
        desc->up_from = (uint32_t)from;
        desc->up_count = (uint32_t)(n_prompt + n_output - from);
        int32_t *dst = history + *history_used;
        if (from < n_prompt)
            memcpy(dst, prompt + from, (n_prompt - from) * sizeof(int32_t));
        const size_t out_from = from > n_prompt ? from - n_prompt : 0;
        if (n_output > out_from)
            memcpy(dst + (n_prompt > from ? n_prompt - from : 0), output + out_from,
                   (n_output - out_from) * sizeof(int32_t));
        *history_used += desc->up_count;
    }
    return 0;
}

/* Queues the call: stages the rows (the host checks), copies them, launches the kernel and the
 * copy of its results into h_results' slot. */
static int enqueue(struct cuda_sampler *s, int slot, const float *logits, int32_t rows,
                   const struct sampling_params *params, const uint64_t *output_index,
                   const int32_t *const *prompt_tokens, const size_t *n_prompt,
                   const int32_t *const *output_tokens, const size_t *n_output,
                   const struct cuda_history_gather *gathers, int32_t num_gathers,
                   const int32_t *d_src, const uint64_t *keys, int32_t *d_tokens,
                   cudaStream_t stream)
{
    /* The stage holds this call's descriptors, its row list, its history gathers, then the
     * histories of its rows with penalties, so that one copy of exactly the bytes used moves
     * them all. The copy from
     * this stage two calls ago has long ended when the caller completes each call before the
     * next but one. */
    const int k = s->next_stage;
    cudaError_t err = cudaEventSynchronize(s->stage_copied[k]);
    if (err != cudaSuccess)
        return cuda_failed(err, "cudaEventSynchronize(stage)");
    struct row_desc *descs = (struct row_desc *)s->h_stage[k];
    int32_t *row_list = (int32_t *)(s->h_stage[k] + stage_desc_bytes(rows));
    int32_t *pairs = (int32_t *)(s->h_stage[k] + stage_list_end(rows));
    int32_t *history = (int32_t *)(s->h_stage[k] + stage_history_at(rows));
    size_t history_used = 0;
    int32_t n_greedy = 0;
    s->calls++;
    slots_mark(s, rows, params, keys);
    for (int32_t r = 0; r < rows; r++) {
        size_t np = n_prompt ? n_prompt[r] : 0, no = n_output ? n_output[r] : 0;
        const int32_t *pt = np > 0 && prompt_tokens ? prompt_tokens[r] : NULL;
        const int32_t *ot = no > 0 && output_tokens ? output_tokens[r] : NULL;
        int rc = stage_row(s, r, &params[r], output_index[r], pt, np, ot, no, keys ? keys[r] : 0,
                           &descs[r], history, &history_used);
        if (rc < 0)
            return rc;
        if (greedy_fast(&descs[r]))
            row_list[n_greedy++] = r;
    }
    int32_t n_listed = n_greedy;
    for (int32_t r = 0; r < rows; r++)
        if (!greedy_fast(&descs[r]))
            row_list[n_listed++] = r;
    /* A history gather names its token in the packed history; a row without penalties has no
     * history there, and a history slot that has the token (appended on the device by the call
     * that sampled it) needs none. */
    int32_t n_pairs = 0;
    for (int32_t i = 0; i < num_gathers; i++) {
        const struct cuda_history_gather *g = &gathers[i];
        if (g->row < 0 || g->row >= rows || g->index < 0 || !n_output ||
            (size_t)g->index >= n_output[g->row])
            return pagoda_error_set(PAGODA_EINVAL,
                                    "cuda sampler: history gather %d (row %d, output token %d) "
                                    "outside the rows' output",
                                    (int)i, (int)g->row, (int)g->index);
        const struct row_desc *d = &descs[g->row];
        const uint32_t at = d->n_prompt + (uint32_t)g->index;
        if (!d->penalties || at < d->up_from)
            continue;
        pairs[2 * n_pairs] = (int32_t)(d->hist_offset + at - d->up_from);
        pairs[2 * n_pairs + 1] = g->src;
        n_pairs++;
    }

    const size_t copy_bytes = stage_history_at(rows) + history_used * sizeof(int32_t);
    const size_t result_bytes = (size_t)rows * sizeof(struct row_result);
    err = cudaMemcpyAsync(s->d_stage, s->h_stage[k], copy_bytes, cudaMemcpyHostToDevice, stream);
    if (err != cudaSuccess)
        return cuda_failed(err, "cudaMemcpyAsync(stage)");
    if ((err = cudaEventRecord(s->stage_copied[k], stream)) != cudaSuccess)
        return cuda_failed(err, "cudaEventRecord(stage)");
    s->next_stage = 1 - k;
    const int32_t *d_list = (const int32_t *)(s->d_stage + stage_desc_bytes(rows));
    int32_t *d_history = (int32_t *)(s->d_stage + stage_history_at(rows));
    if (n_pairs > 0) {
        int rc = cuda_gather_tokens(d_history, (const int32_t *)(s->d_stage + stage_list_end(rows)),
                                    n_pairs, d_src, stream);
        if (rc != 0)
            return rc;
    }
    if (n_greedy > 0) {
        if ((err = launch_sample_greedy(n_greedy, logits, s->vocab, s->greedy_chunks, d_list,
                                        s->d_partials, s->d_arrivals, s->d_results, d_tokens,
                                        stream)) != cudaSuccess)
            return cuda_failed(err, "sample_greedy<<<>>>");
    }
    if (rows > n_greedy) {
        if ((err = launch_sample_rows(rows - n_greedy, logits, s->vocab,
                                      (const struct row_desc *)s->d_stage, d_list + n_greedy,
                                      d_history, s->d_hist, (uint32_t)s->max_history, s->d_logits,
                                      s->d_marks, s->d_results, d_tokens, stream)) != cudaSuccess)
            return cuda_failed(err, "sample_rows<<<>>>");
    }
    /* Queued: each history slot read now holds its whole history and, once the call has run,
     * the token sampled after it (0 for a row that could not be sampled), unless its key was in
     * two rows. */
    for (int32_t r = 0; r < rows; r++)
        if (descs[r].penalties && descs[r].hslot >= 0) {
            struct hist_slot *h = &s->slots[descs[r].hslot];
            const uint32_t n = descs[r].n_prompt + descs[r].n_output;
            h->have = n < s->max_history && h->twice != s->calls ? n + 1 : n;
        }
    err = cudaMemcpyAsync(s->h_results + (size_t)slot * (size_t)s->max_rows, s->d_results,
                          result_bytes, cudaMemcpyDeviceToHost, stream);
    if (err != cudaSuccess)
        return cuda_failed(err, "cudaMemcpyAsync(results)");
    return 0;
}

/* The checks every entry point makes; *done is set when there is nothing to do (0 rows). */
static int check_call(const struct cuda_sampler *s, const float *logits, int32_t rows,
                      const struct sampling_params *params, const uint64_t *output_index,
                      const void *tokens, int *done)
{
    *done = 0;
    if (!s)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: NULL sampler");
    if (rows < 0 || rows > s->max_rows)
        return pagoda_error_set(PAGODA_ERANGE, "cuda sampler: %d rows outside [0, %d]", (int)rows,
                                (int)s->max_rows);
    if (rows == 0) {
        *done = 1;
        return 0;
    }
    if (!logits || !params || !output_index || !tokens)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: NULL argument");
    return 0;
}

extern "C" int
cuda_sampler_enqueue_gathered(struct cuda_sampler *s, int slot, const float *logits, int32_t rows,
                              const struct sampling_params *params, const uint64_t *output_index,
                              const int32_t *const *prompt_tokens, const size_t *n_prompt,
                              const int32_t *const *output_tokens, const size_t *n_output,
                              const struct cuda_history_gather *gathers, int32_t num_gathers,
                              const int32_t *d_src, const uint64_t *history_keys, int32_t *d_tokens,
                              cudaStream_t stream)
{
    int done;
    int rc = check_call(s, logits, rows, params, output_index, logits, &done);
    if (rc != 0 || done)
        return rc;
    if (slot < 0 || slot >= CUDA_SAMPLER_SLOTS)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: slot %d outside [0, %d)", slot,
                                CUDA_SAMPLER_SLOTS);
    if (num_gathers < 0 || num_gathers > rows || (num_gathers > 0 && (!gathers || !d_src)))
        return pagoda_error_set(PAGODA_EINVAL,
                                "cuda sampler: %d history gathers for %d rows (gathers %s, "
                                "source %s)",
                                (int)num_gathers, (int)rows, gathers ? "given" : "NULL",
                                d_src ? "given" : "NULL");
    return enqueue(s, slot, logits, rows, params, output_index, prompt_tokens, n_prompt,
                   output_tokens, n_output, gathers, num_gathers, d_src, history_keys, d_tokens,
                   stream);
}

extern "C" int cuda_sampler_enqueue(struct cuda_sampler *s, int slot, const float *logits,
                                    int32_t rows, const struct sampling_params *params,
                                    const uint64_t *output_index,
                                    const int32_t *const *prompt_tokens, const size_t *n_prompt,
                                    const int32_t *const *output_tokens, const size_t *n_output,
                                    int32_t *d_tokens, cudaStream_t stream)
{
    return cuda_sampler_enqueue_gathered(s, slot, logits, rows, params, output_index, prompt_tokens,
                                         n_prompt, output_tokens, n_output, NULL, 0, NULL, NULL,
                                         d_tokens, stream);
}

extern "C" int cuda_sampler_result(const struct cuda_sampler *s, int slot, int32_t r,
                                   int32_t *token, float *logprob)
{
    if (!s || slot < 0 || slot > CUDA_SAMPLER_SLOTS || r < 0 || r >= s->max_rows)
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: result of slot %d row %d", slot,
                                (int)r);
    const struct row_result *res = &s->h_results[(size_t)slot * (size_t)s->max_rows + (size_t)r];
    switch (res->status) {
    case ROW_OK:
        *token = res->token;
        if (logprob)
            *logprob = res->logprob;
        return 0;
    case ROW_BAD_LOGIT:
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: row %d: logit %d is %g", (int)r,
                                (int)res->detail, (double)res->value);
    case ROW_OVERFLOW:
        return pagoda_error_set(PAGODA_ERANGE,
                                "cuda sampler: row %d: penalties make token %d's logit overflow",
                                (int)r, (int)res->detail);
    case ROW_ALL_MASKED:
        return pagoda_error_set(PAGODA_EINVAL, "cuda sampler: row %d: every logit is -inf", (int)r);
    default:
        return pagoda_error_set(PAGODA_EINTERNAL, "cuda sampler: row %d: status %d", (int)r,
                                (int)res->status);
    }
}

/* The call in stage k (rows rows) did not give its results (a row failed, so the call failed):
 * its slots' appended tokens are not the caller's, who samples again (the worker: on the host)
 * and may keep other tokens. They no longer stand. */
static void slots_unappend(struct cuda_sampler *s, int k, int32_t rows)
{
    const struct row_desc *descs = (const struct row_desc *)s->h_stage[k];
    for (int32_t r = 0; r < rows; r++)
        if (descs[r].penalties && descs[r].hslot >= 0) {
            struct hist_slot *h = &s->slots[descs[r].hslot];
            const uint32_t n = descs[r].n_prompt + descs[r].n_output;
            if (h->have > n)
                h->have = n;
        }
}

extern "C" int cuda_sampler_sample_keyed(
    struct cuda_sampler *s, const float *logits, int32_t rows, const struct sampling_params *params,
    const uint64_t *output_index, const int32_t *const *prompt_tokens, const size_t *n_prompt,
    const int32_t *const *output_tokens, const size_t *n_output, const uint64_t *history_keys,
    int32_t *tokens, float *logprobs, cudaStream_t stream)
{
    int done;
    int rc = check_call(s, logits, rows, params, output_index, tokens, &done);
    if (rc != 0 || done)
        return rc;
    rc = enqueue(s, CUDA_SAMPLER_SLOTS, logits, rows, params, output_index, prompt_tokens, n_prompt,
                 output_tokens, n_output, NULL, 0, NULL, history_keys, NULL, stream);
    if (rc != 0)
        return rc;
    const int k = 1 - s->next_stage; /* the stage this call used */
    cudaError_t err = cudaStreamSynchronize(stream);
    if (err != cudaSuccess)
        return cuda_failed(err, "cudaStreamSynchronize");
    /* The first failing row fails the call, before anything is written. */
    int32_t token;
    for (int32_t r = 0; r < rows; r++)
        if ((rc = cuda_sampler_result(s, CUDA_SAMPLER_SLOTS, r, &token, NULL)) != 0) {
            if (history_keys)
                slots_unappend(s, k, rows);
            return rc;
        }
    for (int32_t r = 0; r < rows; r++)
        cuda_sampler_result(s, CUDA_SAMPLER_SLOTS, r, &tokens[r], logprobs ? &logprobs[r] : NULL);
    return 0;
}

extern "C" int cuda_sampler_sample(struct cuda_sampler *s, const float *logits, int32_t rows,
                                   const struct sampling_params *params,
                                   const uint64_t *output_index,
                                   const int32_t *const *prompt_tokens, const size_t *n_prompt,
                                   const int32_t *const *output_tokens, const size_t *n_output,
                                   int32_t *tokens, float *logprobs, cudaStream_t stream)
{
    return cuda_sampler_sample_keyed(s, logits, rows, params, output_index, prompt_tokens, n_prompt,
                                     output_tokens, n_output, NULL, tokens, logprobs, stream);
}

/* dst[pairs[2i]] = src[pairs[2i + 1]]. */
__global__ void gather_tokens(int32_t *dst, const int32_t *pairs, int32_t n, const int32_t *src)
{
    int32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[pairs[2 * i]] = src[pairs[2 * i + 1]];
}

extern "C" int cuda_gather_tokens(int32_t *d_dst, const int32_t *d_pairs, int32_t n,
                                  const int32_t *d_src, cudaStream_t stream)
{
    if (n <= 0)
        return 0;
    const int threads = 256;
    gather_tokens<<<(n + threads - 1) / threads, threads, 0, stream>>>(d_dst, d_pairs, n, d_src);
    cudaError_t err = cudaGetLastError();
    return err == cudaSuccess ? 0 : cuda_failed(err, "gather_tokens<<<>>>");
}
