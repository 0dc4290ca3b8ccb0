/* test_cuda_sampler's cases of histories read on the device (tests/gpu/sampler_test.h): the
 * gathered last token of a history (cuda_sampler_enqueue_gathered) and the histories kept on the
 * device under history keys (cuda_sampler_sample_keyed), each against the same calls with the
 * whole history on the host, bit for bit, and their edges and refusals. */
#include "tests/gpu/sampler_test.h"

#include "kernels/cuda/sampler.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

/* cuda_sampler_enqueue_gathered: penalised rows whose histories' last output token (each row's
 * likeliest token, so that its penalty matters) is read on the device (0 on the host in its
 * place, the token in a device array, as the CUDA backend's steps in flight leave it) give the
 * tokens and logprobs of the same call with the token in the history, bit for bit, where the
 * call with 0 left in place differs (the comparison can fail); a gather of a row without
 * penalties is ignored; the refusals, after which the sampler still gives the same results. */
void test_enqueue_history_gathers(int32_t vocab, int32_t rows)
{
    struct bank b;
    bank_init(&b, vocab, rows, 1);
    struct cuda_sampler *s;
    MUST(cuda_sampler_new(vocab, MAX_ROWS, MAX_HISTORY, &s) == 0);
    static struct batch a, g;
    a.rows = rows;
    for (int32_t r = 0; r < rows; r++) {
        /* Odd rows penalised (combos 144 .. 575 carry the three sets of penalties), sampled or
         * greedy. */
        a.params[r] =
            combo_params(r % 2 ? 144 + (r * 37) % 432 : (r * 7) % 144, 3000u + (uint64_t)r);
        a.output_index[r] = 5u * (uint64_t)r;
        make_history(&a, r, &b, r);
        if (a.n_output[r] == 0)
            a.n_output[r] = 1;
        a.output[r][a.n_output[r] - 1] = b.top[r * TOP_IDS]; /* the token gathered */
    }
    g = a;
    struct cuda_history_gather gathers[MAX_ROWS];
    int32_t src[MAX_ROWS];
    for (int32_t r = 0; r < rows; r++) {
        g.prompt_ptr[r] = g.prompt[r];
        g.output_ptr[r] = g.output[r];
        const int32_t last = (int32_t)g.n_output[r] - 1;
        src[r] = g.output[r][last];
        g.output[r][last] = 0;
        gathers[r] = (struct cuda_history_gather){.row = r, .index = last, .src = rows - 1 - r};
    }
    int32_t *d_src;
    GPU_CK(cudaMalloc((void **)&d_src, MAX_ROWS * sizeof(int32_t)));
    int32_t reversed[MAX_ROWS];
    for (int32_t r = 0; r < rows; r++)
        reversed[rows - 1 - r] = src[r];
    GPU_CK(cudaMemcpy(d_src, reversed, (size_t)rows * sizeof(int32_t), cudaMemcpyHostToDevice));
    cudaStream_t st;
    GPU_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    SAMPLE_OR_RETURN(cuda_sampler_enqueue(s, 0, b.dev, rows, a.params, a.output_index, a.prompt_ptr,
                                          a.n_prompt, a.output_ptr, a.n_output, NULL, st));
    SAMPLE_OR_RETURN(cuda_sampler_enqueue_gathered(
        s, 1, b.dev, rows, g.params, g.output_index, g.prompt_ptr, g.n_prompt, g.output_ptr,
        g.n_output, gathers, rows, d_src, NULL, NULL, st));
    /* The control: 0 left in place, no gathers. */
    SAMPLE_OR_RETURN(cuda_sampler_enqueue(s, 2, b.dev, rows, g.params, g.output_index, g.prompt_ptr,
                                          g.n_prompt, g.output_ptr, g.n_output, NULL, st));
    GPU_CK(cudaStreamSynchronize(st));
    int same = 0, penalised = 0, control_differs = 0;
    for (int32_t r = 0; r < rows; r++) {
        int32_t t0 = -1, t1 = -2, t2 = -3;
        float l0 = 0.0f, l1 = 1.0f, l2 = 2.0f;
        int rc0 = cuda_sampler_result(s, 0, r, &t0, &l0);
        int rc1 = cuda_sampler_result(s, 1, r, &t1, &l1);
        int rc2 = cuda_sampler_result(s, 2, r, &t2, &l2);
        same += rc0 == rc1 && (rc0 != 0 || (t0 == t1 && memcmp(&l0, &l1, sizeof(l0)) == 0));
        control_differs += rc0 != rc2 || t0 != t2 || memcmp(&l0, &l2, sizeof(l0)) != 0;
        penalised += a.params[r].repetition_penalty != 1.0f ||
                     a.params[r].presence_penalty != 0.0f || a.params[r].frequency_penalty != 0.0f;
    }
    GPU_CHECK(same == rows && penalised >= rows / 2 - 1 && control_differs >= penalised / 2,
              "vocab %d: histories' last tokens read on the device give the same tokens and "
              "logprobs (%d of %d rows, %d penalised; with 0 left there %d rows differ)",
              (int)vocab, same, (int)rows, penalised, control_differs);
    /* The refusals: more gathers than rows, a NULL source, a gather past its row's output. */
    struct cuda_history_gather past = {.row = 0, .index = (int32_t)g.n_output[0], .src = 0};
    int rc_many = cuda_sampler_enqueue_gathered(s, 1, b.dev, 1, g.params, g.output_index,
                                                g.prompt_ptr, g.n_prompt, g.output_ptr, g.n_output,
                                                gathers, 2, d_src, NULL, NULL, st);
    int rc_null = cuda_sampler_enqueue_gathered(s, 1, b.dev, rows, g.params, g.output_index,
                                                g.prompt_ptr, g.n_prompt, g.output_ptr, g.n_output,
                                                gathers, 1, NULL, NULL, NULL, st);
    int rc_past = cuda_sampler_enqueue_gathered(s, 1, b.dev, rows, g.params, g.output_index,
                                                g.prompt_ptr, g.n_prompt, g.output_ptr, g.n_output,
                                                &past, 1, d_src, NULL, NULL, st);
    GPU_CHECK(rc_many == PAGODA_EINVAL && rc_null == PAGODA_EINVAL && rc_past == PAGODA_EINVAL,
              "history gathers refused: more than the rows %d, a NULL source %d, past the output "
              "%d (PAGODA_EINVAL %d)",
              rc_many, rc_null, rc_past, PAGODA_EINVAL);
    SAMPLE_OR_RETURN(cuda_sampler_enqueue_gathered(
        s, 3, b.dev, rows, g.params, g.output_index, g.prompt_ptr, g.n_prompt, g.output_ptr,
        g.n_output, gathers, rows, d_src, NULL, NULL, st));
    GPU_CK(cudaStreamSynchronize(st));
    int again = 0;
    for (int32_t r = 0; r < rows; r++) {
        int32_t t0 = -1, t3 = -4;
        float l0 = 0.0f, l3 = 3.0f;
        int rc0 = cuda_sampler_result(s, 0, r, &t0, &l0);
        int rc3 = cuda_sampler_result(s, 3, r, &t3, &l3);
        again += rc0 == rc3 && (rc0 != 0 || (t0 == t3 && memcmp(&l0, &l3, sizeof(l0)) == 0));
    }
    GPU_CHECK(again == rows, "vocab %d: after the refusals, the same results again (%d of %d)",
              (int)vocab, again, (int)rows);
    GPU_CK(cudaStreamDestroy(st));
    GPU_CK(cudaFree(d_src));
    cuda_sampler_free(s);
    bank_fini(&b);
}

/* History keys (cuda_sampler_enqueue_gathered): KEY_STEPS calls of `rows` penalised rows drawn
 * from 1.5 x rows sequences, each call's rows shuffled, its logits rows rotating, each sequence's
 * sampled token appended to its history, a sequence sometimes cut back by one token (a discarded
 * token). The reference samples each call synchronously without keys; the keyed sampler has `slots`
 * slots (rows: a sequence not in the call before has lost its slot; more: a cut sequence's slot
 * holds more than its history); the keyed run keeps two calls in flight (call t queued before call
 * t - 1's results are read; a token still on the device is 0 on the host and gathered, as the CUDA
 * backend does). A row whose sequence was in the call before gets a host history whose every token
 * is wrong: its slot has the true one, so the tokens and logprobs must still equal the reference's
 * bit for bit (a sampler that read the host's history would differ, which the control shows). Then
 * a key in two rows of one call: the next call continues with the second row's token (which differs
 * from the first's). */
#define KEY_STEPS 12
#define KEY_SEQS (MAX_ROWS + MAX_ROWS / 2)

/* Row r of a: a sequence of history h[0 .. len), its first np tokens the prompt. */
static void key_row(struct batch *a, int32_t r, const struct sampling_params *p, size_t np,
                    size_t len, const int32_t *h, const int32_t **pp, const int32_t **op)
{
    a->params[r] = *p;
    a->output_index[r] = len - np;
    a->n_prompt[r] = np;
    a->n_output[r] = len - np;
    pp[r] = h;
    op[r] = h + np;
}
void test_history_keys(int32_t vocab, int32_t rows, int32_t slots)
{
    struct bank b;
    bank_init(&b, vocab, rows, 2);
    struct cuda_sampler *ref, *s;
    MUST(cuda_sampler_new(vocab, rows, MAX_HISTORY, &ref) == 0);
    MUST(cuda_sampler_new(vocab, slots, MAX_HISTORY, &s) == 0);
    const int32_t nseq = rows + rows / 2;
    static int32_t hist[KEY_SEQS][MAX_HISTORY], hist2[KEY_SEQS][MAX_HISTORY];
    static size_t np[KEY_SEQS], len[KEY_SEQS], len2[KEY_SEQS];
    static struct sampling_params sp[KEY_SEQS];
    static int32_t sel[KEY_STEPS][MAX_ROWS], ref_tok[KEY_STEPS][MAX_ROWS], cut[KEY_STEPS];
    static float ref_lp[KEY_STEPS][MAX_ROWS];
    for (int32_t q = 0; q < nseq; q++) {
        np[q] = 1 + rng_next() % MAX_PROMPT;
        len[q] = len2[q] = np[q];
        for (size_t i = 0; i < np[q]; i++)
            hist[q][i] = hist2[q][i] = (rng_next() & 1)
                                           ? b.top[(q % rows) * TOP_IDS + rng_next() % TOP_IDS]
                                           : (int32_t)(rng_next() % (uint64_t)vocab);
        sp[q] = combo_params(144 + (q * 37) % 432, 7000u + (uint64_t)q);
    }
    /* The plan: each call's sequences (a shuffled window) and the sequence cut back first. */
    int32_t in_prev[KEY_SEQS];
    for (int32_t q = 0; q < nseq; q++)
        in_prev[q] = -1;
    for (int t = 0; t < KEY_STEPS; t++) {
        int32_t order[KEY_SEQS];
        for (int32_t q = 0; q < nseq; q++)
            order[q] = q;
        for (int32_t q = nseq - 1; q > 0; q--) {
            int32_t j = (int32_t)(rng_next() % (uint64_t)(q + 1)), x = order[q];
            order[q] = order[j];
            order[j] = x;
        }
        memcpy(sel[t], order, (size_t)rows * sizeof(int32_t));
        cut[t] = -1;
        for (int32_t r = 0; r < rows && t >= 2 && cut[t] < 0; r++)
            if (in_prev[sel[t][r]] != t - 1)
                cut[t] = sel[t][r];
        for (int32_t r = 0; r < rows; r++)
            in_prev[sel[t][r]] = t;
    }
    float *dl[KEY_STEPS];
    for (int t = 0; t < KEY_STEPS; t++) {
        GPU_CK(cudaMalloc((void **)&dl[t], (size_t)rows * (size_t)vocab * sizeof(float)));
        for (int32_t r = 0; r < rows; r++)
            GPU_CK(cudaMemcpy(dl[t] + (size_t)r * (size_t)vocab,
                              b.dev + (size_t)((sel[t][r] + t) % rows) * (size_t)vocab,
                              (size_t)vocab * sizeof(float), cudaMemcpyDeviceToDevice));
    }
    static struct batch a;
    a.rows = rows;
    /* The reference. */
    for (int t = 0; t < KEY_STEPS; t++) {
        if (cut[t] >= 0 && len[cut[t]] > np[cut[t]])
            len[cut[t]]--;
        const int32_t *pp[MAX_ROWS], *op[MAX_ROWS];
        for (int32_t r = 0; r < rows; r++) {
            const int32_t q = sel[t][r];
            key_row(&a, r, &sp[q], np[q], len[q], hist[q], pp, op);
        }
        SAMPLE_OR_RETURN(cuda_sampler_sample(ref, dl[t], rows, a.params, a.output_index, pp,
                                             a.n_prompt, op, a.n_output, ref_tok[t], ref_lp[t], 0));
        for (int32_t r = 0; r < rows; r++)
            hist[sel[t][r]][len[sel[t][r]]++] = ref_tok[t][r];
    }
    /* The keyed run, two calls in flight. */
    int32_t *d_out;
    GPU_CK(cudaMalloc((void **)&d_out, 2 * (size_t)rows * sizeof(int32_t)));
    cudaStream_t st;
    GPU_CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaEvent_t ev[2];
    GPU_CK(cudaEventCreateWithFlags(&ev[0], cudaEventDisableTiming));
    GPU_CK(cudaEventCreateWithFlags(&ev[1], cudaEventDisableTiming));
    static int32_t wrong[MAX_ROWS][MAX_HISTORY];
    static size_t pos[KEY_STEPS][MAX_ROWS]; /* where call t's token of row r goes */
    int32_t pend_row[KEY_SEQS];
    for (int32_t q = 0; q < nseq; q++)
        pend_row[q] = -1;
    int same = 0, total = 0, from_slot = 0, control_differs = 0;
    for (int t = 0; t <= KEY_STEPS; t++) {
        if (t < KEY_STEPS) {
            if (cut[t] >= 0 && len2[cut[t]] > np[cut[t]])
                len2[cut[t]]--;
            const int32_t *pp[MAX_ROWS], *op[MAX_ROWS];
            uint64_t keys[MAX_ROWS];
            struct cuda_history_gather g[MAX_ROWS];
            int32_t ng = 0;
            for (int32_t r = 0; r < rows; r++) {
                const int32_t q = sel[t][r];
                key_row(&a, r, &sp[q], np[q], len2[q], hist2[q], pp, op);
                keys[r] = 1000u + (uint64_t)q;
                if (pend_row[q] >= 0) { /* its last token is call t - 1's, still on the device */
                    g[ng++] =
                        (struct cuda_history_gather){.row = r,
                                                     .index = (int32_t)(len2[q] - 1 - np[q]),
                                                     .src = ((t - 1) % 2) * rows + pend_row[q]};
                    for (size_t i = 0; i < len2[q]; i++)
                        wrong[r][i] = (hist2[q][i] + 1 + (int32_t)i % 3) % vocab;
                    pp[r] = wrong[r];
                    op[r] = wrong[r] + np[q];
                    from_slot++;
                }
            }
            SAMPLE_OR_RETURN(cuda_sampler_enqueue_gathered(
                s, t % 2, dl[t], rows, a.params, a.output_index, pp, a.n_prompt, op, a.n_output, g,
                ng, d_out, keys, d_out + (size_t)(t % 2) * (size_t)rows, st));
            GPU_CK(cudaEventRecord(ev[t % 2], st));
            if (t == KEY_STEPS - 1) { /* the control: the wrong histories copied (no keys) */
                SAMPLE_OR_RETURN(cuda_sampler_sample(ref, dl[t], rows, a.params, a.output_index, pp,
                                                     a.n_prompt, op, a.n_output, a.tokens,
                                                     a.logprobs, 0));
                for (int32_t r = 0; r < rows; r++)
                    control_differs += pp[r] == wrong[r] &&
                                       (a.tokens[r] != ref_tok[t][r] ||
                                        memcmp(&a.logprobs[r], &ref_lp[t][r], sizeof(float)) != 0);
            }
        }
        if (t >= 1) { /* call t - 1's results, while call t may still run */
            GPU_CK(cudaEventSynchronize(ev[(t - 1) % 2]));
            for (int32_t r = 0; r < rows; r++) {
                const int32_t q = sel[t - 1][r];
                int32_t tok = -1;
                float lp = NAN;
                int rc = cuda_sampler_result(s, (t - 1) % 2, r, &tok, &lp);
                same += rc == 0 && tok == ref_tok[t - 1][r] &&
                        memcmp(&lp, &ref_lp[t - 1][r], sizeof(lp)) == 0;
                total++;
                hist2[q][pos[t - 1][r]] = tok; /* never cut: a cut sequence was not in call t - 1 */
            }
        }
        for (int32_t q = 0; q < nseq; q++)
            if (t >= 1 && pend_row[q] >= 0)
                pend_row[q] = -1;
        if (t < KEY_STEPS)
            for (int32_t r = 0; r < rows; r++) {
                const int32_t q = sel[t][r];
                pos[t][r] = len2[q];
                hist2[q][len2[q]++] = 0; /* call t's token, not read yet */
                pend_row[q] = r;
            }
    }
    GPU_CHECK(same == total && total == KEY_STEPS * rows && from_slot > rows && control_differs > 0,
              "vocab %d: history keys, %d calls of %d rows, %d slots, two in flight: the "
              "reference's tokens and logprobs (%d of %d; %d rows read their slot, the host's "
              "history wrong; with that history copied %d rows of the last call differ)",
              (int)vocab, KEY_STEPS, (int)rows, (int)slots, same, total, from_slot,
              control_differs);
    GPU_CK(cudaStreamSynchronize(st));

    /* A key in two rows of one call, then the second row's token next. */
    const int32_t q = sel[KEY_STEPS - 1][0];
    int two = 0, next = 0;
    for (int32_t r0 = 0; r0 + 1 < rows && !two; r0++) {
        uint64_t keys[2] = {1000u + (uint64_t)q, 1000u + (uint64_t)q};
        const int32_t *pp[2] = {hist[q], hist[q]}, *op[2] = {hist[q] + np[q], hist[q] + np[q]};
        for (int i = 0; i < 2; i++) {
            a.params[i] = sp[q];
            a.output_index[i] = len[q] - np[q];
            a.n_prompt[i] = np[q];
            a.n_output[i] = len[q] - np[q];
        }
        int32_t kt[2], rt[2];
        float klp[2], rlp[2];
        const float *rows2 = b.dev + (size_t)r0 * (size_t)vocab; /* bank rows r0, r0 + 1 */
        SAMPLE_OR_RETURN(cuda_sampler_sample_keyed(s, rows2, 2, a.params, a.output_index, pp,
                                                   a.n_prompt, op, a.n_output, keys, kt, klp, 0));
        SAMPLE_OR_RETURN(cuda_sampler_sample(ref, rows2, 2, a.params, a.output_index, pp,
                                             a.n_prompt, op, a.n_output, rt, rlp, 0));
        if (kt[0] == kt[1])
            continue; /* the check needs two different tokens */
        two = kt[0] == rt[0] && kt[1] == rt[1] && memcmp(klp, rlp, sizeof(klp)) == 0 ? 1 : -1;
        hist[q][len[q]++] = kt[1];
        a.output_index[0] = len[q] - np[q];
        a.n_output[0] = len[q] - np[q];
        SAMPLE_OR_RETURN(cuda_sampler_sample_keyed(s, rows2, 1, a.params, a.output_index, pp,
                                                   a.n_prompt, op, a.n_output, keys, kt, klp, 0));
        SAMPLE_OR_RETURN(cuda_sampler_sample(ref, rows2, 1, a.params, a.output_index, pp,
                                             a.n_prompt, op, a.n_output, rt, rlp, 0));
        next = kt[0] == rt[0] && memcmp(&klp[0], &rlp[0], sizeof(float)) == 0;
    }
    GPU_CHECK(two == 1 && next == 1,
              "vocab %d: a key in two rows of one call samples as without keys (%d), and the "
              "next call, with the second row's token, too (%d)",
              (int)vocab, two, next);
    for (int t = 0; t < KEY_STEPS; t++)
        GPU_CK(cudaFree(dl[t]));
    GPU_CK(cudaFree(d_out));
    GPU_CK(cudaEventDestroy(ev[0]));
    GPU_CK(cudaEventDestroy(ev[1]));
    GPU_CK(cudaStreamDestroy(st));
    cuda_sampler_free(ref);
    cuda_sampler_free(s);
    bank_fini(&b);
}

/* History keys at their edges (a sampler of 4 rows and 16 positions): a history of exactly 16
 * tokens (nothing appended: the slot holds 16) read from its slot the next time (the host's
 * tokens wrong); the same key with another prompt length (the slot dropped, the new history
 * copied); a synchronous call that fails on a NaN row (its other row's appended token does not
 * stand: the next call's history has another token there, which must be read). Each against the
 * same rows sampled without keys. */
void test_history_key_edges(void)
{
    enum { V = 32000, H = 16 };
    struct bank b;
    bank_init(&b, V, 2, 0);
    struct cuda_sampler *s, *ref;
    MUST(cuda_sampler_new(V, 4, H, &s) == 0);
    MUST(cuda_sampler_new(V, 4, H, &ref) == 0);
    struct sampling_params p[2];
    p[0] = p[1] = combo_params(144 + 37, 99);
    uint64_t oi[2] = {3, 3}, keys[2] = {7, 8};
    int32_t hist[H], wrong[H];
    for (int i = 0; i < H; i++) {
        hist[i] = b.top[i % TOP_IDS];
        wrong[i] = (hist[i] + 1) % V;
    }
    const int32_t *pp[2] = {hist, hist}, *op[2] = {hist + 10, hist + 10};
    size_t np[2] = {10, 10}, no[2] = {6, 6};
    int32_t kt[2], rt[2];
    float kl[2], rl[2];
    /* A full history, twice: the second time from the slot. */
    SAMPLE_OR_RETURN(
        cuda_sampler_sample_keyed(s, b.dev, 1, p, oi, pp, np, op, no, keys, kt, kl, 0));
    const int32_t *wp[1] = {wrong}, *wo[1] = {wrong + 10};
    SAMPLE_OR_RETURN(
        cuda_sampler_sample_keyed(s, b.dev, 1, p, oi, wp, np, wo, no, keys, kt, kl, 0));
    SAMPLE_OR_RETURN(cuda_sampler_sample(ref, b.dev, 1, p, oi, pp, np, op, no, rt, rl, 0));
    int full = kt[0] == rt[0] && memcmp(kl, rl, sizeof(float)) == 0;
    /* The same key, a prompt of 4 tokens: the whole history is copied. */
    size_t np4[1] = {4}, no4[1] = {5};
    const int32_t *op4[1] = {hist + 4};
    SAMPLE_OR_RETURN(
        cuda_sampler_sample_keyed(s, b.dev, 1, p, oi, pp, np4, op4, no4, keys, kt, kl, 0));
    SAMPLE_OR_RETURN(cuda_sampler_sample(ref, b.dev, 1, p, oi, pp, np4, op4, no4, rt, rl, 0));
    int prompt_len = kt[0] == rt[0] && memcmp(kl, rl, sizeof(float)) == 0;
    /* A failing call: row 1's logits hold a NaN; row 0 (key 8, 9 tokens) was sampled and
     * appended on the device, then the call failed. The next call continues row 0 with a token
     * other than the one the device sampled. */
    float *nan_dev;
    GPU_CK(cudaMalloc((void **)&nan_dev, 2 * (size_t)V * sizeof(float)));
    GPU_CK(cudaMemcpy(nan_dev, b.dev, 2 * (size_t)V * sizeof(float), cudaMemcpyDeviceToDevice));
    const float nan = NAN;
    GPU_CK(cudaMemcpy(nan_dev + V + 5, &nan, sizeof(nan), cudaMemcpyHostToDevice));
    uint64_t k2[2] = {8, 9};
    size_t np2[2] = {4, 4}, no2[2] = {5, 5};
    const int32_t *op2[2] = {hist + 4, hist + 4};
    int failed = cuda_sampler_sample_keyed(s, nan_dev, 2, p, oi, pp, np2, op2, no2, k2, kt, kl, 0);
    SAMPLE_OR_RETURN(cuda_sampler_sample(ref, b.dev, 1, p, oi, pp, np2, op2, no2, rt, rl, 0));
    int32_t next[H];
    memcpy(next, hist, sizeof(next));
    next[9] = (rt[0] + 1) % V; /* not the device's token */
    const int32_t *pn[1] = {next}, *on[1] = {next + 4};
    size_t no6[1] = {6};
    SAMPLE_OR_RETURN(
        cuda_sampler_sample_keyed(s, b.dev + V, 1, p, oi, pn, np2, on, no6, k2, kt, kl, 0));
    SAMPLE_OR_RETURN(cuda_sampler_sample(ref, b.dev + V, 1, p, oi, pn, np2, on, no6, rt, rl, 0));
    int after_fail = kt[0] == rt[0] && memcmp(kl, rl, sizeof(float)) == 0;
    GPU_CHECK(full && prompt_len && failed == PAGODA_EINVAL && after_fail,
              "history keys at the edges: a full history read from its slot %d, another prompt "
              "length %d, a failed call (%d) whose appended token does not stand %d",
              full, prompt_len, failed, after_fail);
    GPU_CK(cudaFree(nan_dev));
    cuda_sampler_free(s);
    cuda_sampler_free(ref);
    bank_fini(&b);
}
