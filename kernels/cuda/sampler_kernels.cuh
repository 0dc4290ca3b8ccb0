/* What the CUDA sampler's host side (kernels/cuda/sampler.cu) and its two kernels
 * (sampler_rows.cu: sample_rows, the general path; sampler_greedy.cu: sample_greedy, the greedy
 * fast path) share: a row's descriptor and result, the greedy path's per-chunk summary, the
 * argmax order both kernels use, and the functions that launch the kernels. Private to
 * kernels/cuda (not a public header). */
#ifndef PAGODA_KERNELS_CUDA_SAMPLER_KERNELS_CUH
#define PAGODA_KERNELS_CUDA_SAMPLER_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

/* What the kernel reports for a row (struct row_result.status). */
enum row_status {
    ROW_OK = 0,
    ROW_BAD_LOGIT = 1, /* a NaN or +inf logit; detail = its index, value = it */
    ROW_OVERFLOW = 2,  /* a penalty made a finite logit infinite; detail = the token */
    ROW_ALL_MASKED = 3 /* every logit is -inf */
};

/* One row's parameters as the kernel reads them. hist_offset, n_prompt and n_output index the
 * call's packed history; they are 0 when the row's penalties are off. A row whose history is kept
 * on the device (hslot >= 0, struct cuda_sampler's history slots) reads it from its slot: the
 * packed history holds only the slot's missing tokens, up_count of them from index up_from on. */
struct row_desc {
    uint64_t seed;
    uint64_t output_index;
    float temperature;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    int32_t top_k;
    int32_t penalties; /* 1 when step 1 is not the identity */
    uint32_t hist_offset;
    uint32_t n_prompt;
    uint32_t n_output;
    int32_t hslot; /* the row's history slot, or -1: the history is the packed one */
    uint32_t up_from;
    uint32_t up_count;
    uint64_t pad;
};
static_assert(sizeof(struct row_desc) % 16 == 0, "descriptors stay 16-byte aligned");

struct row_result {
    int32_t token;
    float logprob;
    int32_t status; /* enum row_status */
    int32_t detail;
    float value;
    int32_t pad;
};

/* One chunk's summary, written by its block and read by the row's last block. */
struct greedy_partial {
    double exp_sum;  /* sum of exp(l[i] - max_logit) over the chunk; 0 when max_logit is -inf */
    float max_logit; /* -inf when every logit of the chunk is -inf */
    int32_t best;    /* the lowest id of max_logit in the chunk */
    int32_t bad;     /* the lowest id of a NaN or +inf logit in the chunk, INT32_MAX if none */
    int32_t pad;
};

/* Whether (v, i) beats (bv, bi) for the argmax: larger logit, then lower id. */
__device__ __forceinline__ bool argmax_better(float v, int32_t i, float bv, int32_t bi)
{
    return v > bv || (v == bv && i < bi);
}

/* Reduces the argmax pair (bv, bi) over the warp; lane 0 holds the result. The pair is a total
 * order, so the result does not depend on the order of the shuffles. */
__device__ __forceinline__ void warp_argmax(float &bv, int32_t &bi)
{
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_down_sync(0xffffffffu, bv, o);
        int32_t oi = __shfl_down_sync(0xffffffffu, bi, o);
        if (argmax_better(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
}

/* Queues sample_rows on stream: one block of SAMPLER_THREADS (sampler_rows.cu) for each of rows
 * rows, block b sampling row row_list[b]; the arguments are the kernel's. Returns the launch's
 * error (cudaGetLastError()). */
cudaError_t launch_sample_rows(int32_t rows, const float *logits, int32_t vocab,
                               const struct row_desc *descs, const int32_t *row_list,
                               const int32_t *history, int32_t *hist_slots, uint32_t max_history,
                               float *work_logits, int32_t *marks, struct row_result *results,
                               int32_t *out_tokens, cudaStream_t stream);

/* Queues sample_greedy on stream for the rows row_list[0..rows), chunks blocks each (one per
 * chunk of CUDA_SAMPLER_GREEDY_CHUNK logits), with 16-byte loads where vocab and logits allow
 * them. partials holds rows * chunks entries, arrivals rows counters that are zero (and are
 * zero again once the launch has run). Returns the launch's error (cudaGetLastError()). */
cudaError_t launch_sample_greedy(int32_t rows, const float *logits, int32_t vocab, int32_t chunks,
                                 const int32_t *row_list, struct greedy_partial *partials,
                                 uint32_t *arrivals, struct row_result *results,
                                 int32_t *out_tokens, cudaStream_t stream);

#endif
