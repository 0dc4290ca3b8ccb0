/* A step's logit entries added to its device logits (kernels/cuda/logit_bias.h). */
#include "kernels/cuda/logit_bias.h"
#include "kernels/cuda/common.cuh"

#include <cuda_runtime.h>
#include <stdint.h>

/* One thread per entry: the tokens of a row are distinct, so no two threads write one logit, and
 * the one addition rounds as the host's does. */
__global__ static void logit_entries_kernel(float *logits, int64_t vocab,
                                            const struct logit_entry *entries, int32_t n)
{
    const int32_t i = (int32_t)(blockIdx.x * blockDim.x + threadIdx.x);
    if (i < n) {
        const struct logit_entry e = entries[i];
        logits[(int64_t)e.row * vocab + e.token] += e.value;
    }
}

extern "C" int cuda_logit_entries_apply(float *d_logits, int64_t vocab,
                                        const struct logit_entry *d_entries, int32_t n,
                                        cudaStream_t stream)
{
    if (n <= 0)
        return 0;
    const int threads = 256;
    logit_entries_kernel<<<(n + threads - 1) / threads, threads, 0, stream>>>(d_logits, vocab,
                                                                              d_entries, n);
    return cuda_launch_result("logit_entries_kernel");
}
