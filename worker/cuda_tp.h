/* The CUDA backend's collectives for a tensor-parallel rank (internal to worker/cuda_backend.c):
 * the all-reduce of a row-parallel projection's f32 partial sums and the all-gather of the
 * vocabulary-split logits, on device buffers, through comm/comm.h.
 *
 * With an NCCL group (comm_name "nccl") the device buffers go to NCCL as they are. With any other
 * group (the cpu implementation: ranks that are threads or processes of one host, as in tests and
 * on one GPU) the data is staged through pinned host memory: device -> host on the backend's
 * stream, the stream waited for, the collective on the host, host -> device on the stream.
 * Either way each call returns once the collective is done; the work enqueued on the stream
 * before it has finished (the stream is waited for first, so an NCCL communicator on another
 * stream sees finished inputs), and what the caller enqueues after it sees the result. */
#ifndef PAGODA_WORKER_CUDA_TP_H
#define PAGODA_WORKER_CUDA_TP_H

#include "comm/comm.h"
#include "model/model_shard.h"

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

struct cuda_tp {
    struct comm *comm; /* borrowed */
    struct model_shard shard;
    int nccl;            /* device buffers go to the comm as they are */
    cudaStream_t stream; /* the backend's */
    int64_t vocab;       /* the whole model's */
    int32_t max_rows;    /* logits rows per step */
    size_t max_reduce;   /* floats per all-reduce */
    float *host;         /* pinned staging (cpu groups): max(reduce, (size + 1) gather) floats */
    float *d_gathered;   /* [size][max_rows][vocab_per_rank] (NCCL groups) */
};

/* Prepares tp for comm (borrowed, outliving tp) and the rank's shard, collectives of up to
 * max_reduce floats and logits of up to max_rows rows, on stream. Errors: PAGODA_ECUDA (an
 * allocation), PAGODA_EINVAL. Undo with cuda_tp_fini (also after an error). */
int cuda_tp_init(struct cuda_tp *tp, struct comm *comm, const struct model_shard *shard,
                 int64_t vocab, size_t max_reduce, int32_t max_rows, cudaStream_t stream);
void cuda_tp_fini(struct cuda_tp *tp);

/* buf[count] (device, f32) becomes the sum over the group. Errors: the comm's (PAGODA_ETIMEDOUT,
 * PAGODA_ECLOSED, PAGODA_EPROTO), PAGODA_ECUDA, PAGODA_EINVAL (count above max_reduce). */
int cuda_tp_all_reduce(struct cuda_tp *tp, float *buf, size_t count);

/* local[rows][vocab_per_rank] (device, f32: this rank's vocabulary rows, the padding past its
 * run zero) is gathered from every rank into logits[rows][vocab] (device), the whole
 * vocabulary in order. Same errors. */
int cuda_tp_gather_logits(struct cuda_tp *tp, const float *local, int32_t rows, float *logits);

#endif
