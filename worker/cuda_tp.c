/* cuda_tp.h: the collectives of a CUDA tensor-parallel rank, on device buffers. */
#include "worker/cuda_tp.h"
#include "common/error.h"

#include <string.h>

static int tp_cuda_fail(cudaError_t e, const char *what)
{
    return pagoda_error_set(PAGODA_ECUDA, "tensor parallel: %s: %s", what, cudaGetErrorString(e));
}

uint64_t cuda_tp_hash(uint64_t h, const void *bytes, size_t n)
{
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= UINT64_C(0x100000001b3);
    }
    return h;
}

/* The identities as f32 words for the all-gather (a copy: any bytes travel as they are). */
#define ID_WORDS (sizeof(struct cuda_tp_identity) / sizeof(float))
_Static_assert(sizeof(struct cuda_tp_identity) % sizeof(float) == 0, "identity of whole words");

int cuda_tp_agree(struct comm *comm, const struct cuda_tp_identity *mine)
{
    const int size = comm_size(comm);
    struct cuda_tp_identity all[COMM_MAX_RANKS];
    int rc;
    if (size < 1 || size > COMM_MAX_RANKS)
        return pagoda_error_set(PAGODA_EINVAL, "tensor parallel: a group of %d", size);
    if (!cuda_tp_device_buffers(comm)) {
        rc = comm_all_gather(comm, mine, all, ID_WORDS, DTYPE_F32);
    } else {
        void *d = NULL;
        const size_t bytes = sizeof(*mine);
        cudaError_t e = cudaMalloc(&d, bytes * (size_t)(size + 1));
        if (e != cudaSuccess)
            return tp_cuda_fail(e, "cudaMalloc (identities)");
        if ((e = cudaMemcpy(d, mine, bytes, cudaMemcpyHostToDevice)) != cudaSuccess)
            rc = tp_cuda_fail(e, "cudaMemcpy (identity)");
        else if ((rc = comm_all_gather(comm, d, (char *)d + bytes, ID_WORDS, DTYPE_F32)) == 0 &&
                 (e = cudaMemcpy(all, (char *)d + bytes, bytes * (size_t)size,
                                 cudaMemcpyDeviceToHost)) != cudaSuccess)
            rc = tp_cuda_fail(e, "cudaMemcpy (identities)");
        cudaFree(d);
    }
    if (rc != 0)
        return rc;
    const struct cuda_tp_identity *z = &all[0];
    for (int q = 0; q < size; q++) {
        const struct cuda_tp_identity *a = &all[q];
        const char *field = NULL;
        if (a->rank != q || a->size != size)
            field = "rank or group size";
        else if (a->config_hash != z->config_hash)
            field = "model config";
        else if (a->weights_hash != z->weights_hash)
            field = "weights (another checkpoint or random seed)";
        else if (a->max_num_tokens != z->max_num_tokens || a->max_num_seqs != z->max_num_seqs ||
                 a->max_blocks_per_seq != z->max_blocks_per_seq)
            field = "step limits";
        else if (a->num_blocks != z->num_blocks || a->block_size != z->block_size)
            field = "KV pool blocks";
        else if (a->comm_device >= 0 && a->comm_device != a->device)
            field = "device (the NCCL communicator is on another device than the backend)";
        if (field != NULL)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    "tensor parallel: rank %d (as %d of %d) and rank 0 disagree "
                                    "on the %s",
                                    q, (int)a->rank, (int)a->size, field);
    }
    return 0;
}

int cuda_tp_device_buffers(const struct comm *comm)
{
    return comm != NULL && strcmp(comm_name(comm), "nccl") == 0;
}

size_t cuda_tp_gathered_floats(const struct model_shard *shard, int32_t max_rows)
{
    return (size_t)max_rows * (size_t)shard->vocab_per_rank * (size_t)shard->size;
}

int cuda_tp_init(struct cuda_tp *tp, struct comm *comm, const struct model_shard *shard,
                 int64_t vocab, size_t max_reduce, int32_t max_rows, float *d_gathered,
                 cudaStream_t stream)
{
    memset(tp, 0, sizeof(*tp));
    if (comm == NULL || shard->rank != comm_rank(comm) || shard->size != comm_size(comm) ||
        max_rows < 1)
        return pagoda_error_set(PAGODA_EINVAL, "tensor parallel: a shard of rank %d of %d",
                                shard->rank, shard->size);
    tp->comm = comm;
    tp->shard = *shard;
    tp->nccl = cuda_tp_device_buffers(comm);
    tp->stream = stream;
    tp->vocab = vocab;
    tp->max_rows = max_rows;
    tp->max_reduce = max_reduce;
    if (tp->nccl) {
        if (d_gathered == NULL)
            return pagoda_error_set(PAGODA_EINVAL, "tensor parallel: no gathered logits buffer");
        tp->d_gathered = d_gathered;
        return 0;
    }
    /* A row of the all-gather (this rank's and every rank's) must fit whole. */
    const size_t row = (size_t)shard->vocab_per_rank * (size_t)(shard->size + 1);
    size_t floats = CUDA_TP_STAGING_BYTES / sizeof(float);
    if (floats < row)
        floats = row;
    tp->gather_rows = (int32_t)(floats / row < (size_t)max_rows ? floats / row : (size_t)max_rows);
    cudaError_t e = cudaMallocHost((void **)&tp->host, floats * sizeof(float));
    if (e != cudaSuccess) {
        tp->host = NULL;
        return tp_cuda_fail(e, "cudaMallocHost (staging)");
    }
    tp->host_floats = floats;
    return 0;
}

void cuda_tp_fini(struct cuda_tp *tp)
{
    if (tp == NULL)
        return;
    if (tp->host != NULL)
        cudaFreeHost(tp->host);
    memset(tp, 0, sizeof(*tp));
}

int cuda_tp_all_reduce(struct cuda_tp *tp, float *buf, size_t count)
{
    if (count > tp->max_reduce)
        return pagoda_error_set(PAGODA_EINVAL, "tensor parallel: all-reduce of %zu floats (%zu)",
                                count, tp->max_reduce);
    if (count == 0)
        return 0;
    cudaError_t e;
    if (tp->nccl) {
        if ((e = cudaStreamSynchronize(tp->stream)) != cudaSuccess)
            return tp_cuda_fail(e, "before the all-reduce");
        return comm_all_reduce_sum(tp->comm, buf, count, DTYPE_F32);
    }
    /* Chunk by chunk through the staging; every rank cuts the same chunks. The copy back of a
     * chunk is ordered on the stream before the next chunk's copy into the staging, and the
     * host touches the staging only after waiting for the stream. */
    for (size_t done = 0; done < count;) {
        const size_t n = count - done < tp->host_floats ? count - done : tp->host_floats;
        const size_t bytes = n * sizeof(float);
        if ((e = cudaMemcpyAsync(tp->host, buf + done, bytes, cudaMemcpyDeviceToHost,
                                 tp->stream)) != cudaSuccess ||
            (e = cudaStreamSynchronize(tp->stream)) != cudaSuccess)
            return tp_cuda_fail(e, "staging the all-reduce");
        int rc = comm_all_reduce_sum(tp->comm, tp->host, n, DTYPE_F32);
        if (rc != 0)
            return rc;
        if ((e = cudaMemcpyAsync(buf + done, tp->host, bytes, cudaMemcpyHostToDevice,
                                 tp->stream)) != cudaSuccess)
            return tp_cuda_fail(e, "the all-reduce's result");
        done += n;
    }
    return 0;
}

/* Lays out rows of gathered logits ([size][rows][vocab_per_rank], at gathered) into
 * logits[rows][vocab]: rank q's run is [q * per, q * per + len) of the vocabulary, the last
 * one's possibly shorter (its padding dropped). */
static int lay_out(struct cuda_tp *tp, const float *gathered, int32_t rows, float *logits,
                   enum cudaMemcpyKind kind)
{
    const int64_t per = tp->shard.vocab_per_rank;
    const size_t count = (size_t)rows * (size_t)per;
    for (int q = 0; q < tp->shard.size; q++) {
        int64_t begin = per * q, len = begin + per <= tp->vocab ? per : tp->vocab - begin;
        cudaError_t e =
            cudaMemcpy2DAsync(logits + begin, (size_t)tp->vocab * sizeof(float),
                              gathered + (size_t)q * count, (size_t)per * sizeof(float),
                              (size_t)len * sizeof(float), (size_t)rows, kind, tp->stream);
        if (e != cudaSuccess)
            return tp_cuda_fail(e, "laying out the gathered logits");
    }
    return 0;
}

int cuda_tp_gather_logits(struct cuda_tp *tp, const float *local, int32_t rows, float *logits)
{
    if (rows < 0 || rows > tp->max_rows)
        return pagoda_error_set(PAGODA_EINVAL, "tensor parallel: %d logits rows (%d)", (int)rows,
                                (int)tp->max_rows);
    if (rows == 0)
        return 0;
    const int64_t per = tp->shard.vocab_per_rank;
    cudaError_t e;
    int rc;
    if (tp->nccl) {
        if ((e = cudaStreamSynchronize(tp->stream)) != cudaSuccess)
            return tp_cuda_fail(e, "before the all-gather");
        if ((rc = comm_all_gather(tp->comm, local, tp->d_gathered, (size_t)rows * (size_t)per,
                                  DTYPE_F32)) != 0)
            return rc;
        return lay_out(tp, tp->d_gathered, rows, logits, cudaMemcpyDeviceToDevice);
    }
    /* Chunks of gather_rows rows; every rank cuts the same chunks. */
    for (int32_t r0 = 0; r0 < rows; r0 += tp->gather_rows) {
        const int32_t nr = rows - r0 < tp->gather_rows ? rows - r0 : tp->gather_rows;
        const size_t count = (size_t)nr * (size_t)per;
        float *send = tp->host, *recv = tp->host + count;
        if ((e = cudaMemcpyAsync(send, local + (size_t)r0 * (size_t)per, count * sizeof(float),
                                 cudaMemcpyDeviceToHost, tp->stream)) != cudaSuccess ||
            (e = cudaStreamSynchronize(tp->stream)) != cudaSuccess)
            return tp_cuda_fail(e, "staging the all-gather");
        if ((rc = comm_all_gather(tp->comm, send, recv, count, DTYPE_F32)) != 0)
            return rc;
        if ((rc = lay_out(tp, recv, nr, logits + (size_t)r0 * (size_t)tp->vocab,
                          cudaMemcpyHostToDevice)) != 0)
            return rc;
    }
    return 0;
}
