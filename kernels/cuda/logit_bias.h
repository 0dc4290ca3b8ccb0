/* Logit bias on the device: a step's list of struct logit_entry (kernels/cpu/logit_bias.h: the
 * rows' logit bias and min_tokens' suppressed stop tokens) added to its device logits before the
 * CUDA sampler reads them, as logit_entries_apply does on the host. Each entry is one f32
 * addition (x + -inf is -inf), so the device's logits equal the host's bit for bit and the two
 * samplers choose the same tokens.
 *
 * A plain C header: the implementation is kernels/cuda/logit_bias.cu. */
#ifndef PAGODA_KERNELS_CUDA_LOGIT_BIAS_H
#define PAGODA_KERNELS_CUDA_LOGIT_BIAS_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "kernels/cpu/logit_bias.h"

/* On stream: d_logits[e.row * vocab + e.token] += e.value for the n entries of d_entries, one
 * thread per entry. Both arrays are device memory; the rows and tokens are the caller's to keep
 * in range (the backend checks them on the host: backend_check_batch), and within one row the
 * tokens must be distinct (two additions to one logit would race; the worker builds them
 * distinct). n <= 0 launches nothing. Nothing is allocated and nothing waited for, so the call
 * can be captured in a CUDA graph. Returns 0, or PAGODA_ECUDA when the launch failed (the detail
 * names the kernel); errors of the kernel itself surface at the stream's next synchronisation. */
int cuda_logit_entries_apply(float *d_logits, int64_t vocab, const struct logit_entry *d_entries,
                             int32_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
