/* The CUDA backend's collectives for a tensor-parallel rank (internal to worker/cuda_backend*.c):
 * the all-reduce of a row-parallel projection's f32 partial sums and the all-gather of the
 * vocabulary-split logits, on device buffers, through comm/comm.h.
 *
 * With an NCCL group (comm_name "nccl") the device buffers go to NCCL as they are. With any other
 * group (the cpu implementation: ranks that are threads or processes of one host, as in tests and
 * on one GPU) the data is staged through pinned host memory: device -> host on the backend's
 * stream, the stream waited for, the collective on the host, host -> device on the stream, in
 * chunks of at most CUDA_TP_STAGING_BYTES (the cpu comm moves 1 MiB slots anyway: a staging
 * buffer as large as the logits would only cost pinned memory).
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

/* Pinned host staging of a rank of a cpu group: an all-reduce goes through it in chunks of
 * elements, an all-gather in chunks of logits rows (a row's send and receive buffers, (size +
 * 1) x vocab_per_rank floats, if that is larger). */
#define CUDA_TP_STAGING_BYTES ((size_t)16 << 20)

struct cuda_tp {
    struct comm *comm; /* borrowed */
    struct model_shard shard;
    int nccl;            /* device buffers go to the comm as they are */
    cudaStream_t stream; /* the backend's */
    int64_t vocab;       /* the whole model's */
    int32_t max_rows;    /* logits rows per step */
    size_t max_reduce;   /* floats per all-reduce */
    float *host;         /* pinned staging (cpu groups) of host_floats */
    size_t host_floats;
    int32_t gather_rows; /* logits rows per all-gather chunk (cpu groups) */
    float *d_gathered;   /* [size][max_rows][vocab_per_rank] (NCCL groups), borrowed */
};

/* Whether comm's collectives take device buffers (NCCL): then cuda_tp_init needs the device
 * buffer of the gathered logits, cuda_tp_gathered_floats(shard, max_rows) floats. */
int cuda_tp_device_buffers(const struct comm *comm);
size_t cuda_tp_gathered_floats(const struct model_shard *shard, int32_t max_rows);

/* Prepares tp for comm (borrowed, outliving tp) and the rank's shard, collectives of up to
 * max_reduce floats and logits of up to max_rows rows, on stream. d_gathered (device, owned by
 * the caller, outliving tp) is the all-gather's receive buffer of an NCCL group
 * (cuda_tp_device_buffers), ignored otherwise. Errors: PAGODA_ECUDA (the pinned staging),
 * PAGODA_EINVAL. Undo with cuda_tp_fini (also after an error). */
int cuda_tp_init(struct cuda_tp *tp, struct comm *comm, const struct model_shard *shard,
                 int64_t vocab, size_t max_reduce, int32_t max_rows, float *d_gathered,
                 cudaStream_t stream);
void cuda_tp_fini(struct cuda_tp *tp);

/* What every rank of a group must agree on before it allocates anything: its place, the model
 * (config and weights, hashed), the step limits and pool size that decide which batches are
 * refused before any collective, and its device. */
struct cuda_tp_identity {
    int32_t rank, size;
    int32_t device;      /* the backend's (opt.device) */
    int32_t comm_device; /* an NCCL communicator's device; -1 for a cpu group */
    int32_t max_num_tokens, max_num_seqs, max_blocks_per_seq;
    int32_t num_blocks, block_size;
    int32_t reserved;      /* 0 */
    uint64_t config_hash;  /* cuda_tp_hash over the config's fields */
    uint64_t weights_hash; /* of the whole tensors every rank holds, or the random seed */
};

/* FNV-1a of n bytes, continuing from h (start with CUDA_TP_HASH_START). */
#define CUDA_TP_HASH_START UINT64_C(0xcbf29ce484222325)
uint64_t cuda_tp_hash(uint64_t h, const void *bytes, size_t n);

/* All-gathers every rank's identity over comm (through a small device buffer with NCCL) and
 * compares them: ranks 0 .. size - 1 in order, the same size, model, limits and pool, and an
 * NCCL comm on the rank's own device. Every rank sees the same table, so every rank refuses alike.
 * Returns 0, PAGODA_EMISMATCH (naming the field and the ranks), the comm's errors (a peer absent:
 * PAGODA_ETIMEDOUT), PAGODA_ECUDA. */
int cuda_tp_agree(struct comm *comm, const struct cuda_tp_identity *mine);

/* buf[count] (device, f32) becomes the sum over the group. Errors: the comm's (PAGODA_ETIMEDOUT,
 * PAGODA_ECLOSED, PAGODA_EPROTO), PAGODA_ECUDA, PAGODA_EINVAL (count above max_reduce). */
int cuda_tp_all_reduce(struct cuda_tp *tp, float *buf, size_t count);

/* local[rows][vocab_per_rank] (device, f32: this rank's vocabulary rows; the padding past the
 * last rank's run is dropped, whatever it holds) is gathered from every rank into
 * logits[rows][vocab] (device), the whole vocabulary in order. Same errors. */
int cuda_tp_gather_logits(struct cuda_tp *tp, const float *local, int32_t rows, float *logits);

#endif
