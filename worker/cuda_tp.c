/* cuda_tp.h: the collectives of a CUDA tensor-parallel rank, on device buffers. */
#include "worker/cuda_tp.h"
#include "common/error.h"

#include <string.h>

static int tp_cuda_fail(cudaError_t e, const char *what)
{
    return pagoda_error_set(PAGODA_ECUDA, "tensor parallel: %s: %s", what, cudaGetErrorString(e));
}

int cuda_tp_init(struct cuda_tp *tp, struct comm *comm, const struct model_shard *shard,
                 int64_t vocab, size_t max_reduce, int32_t max_rows, cudaStream_t stream)
{
    memset(tp, 0, sizeof(*tp));
    if (comm == NULL || shard->rank != comm_rank(comm) || shard->size != comm_size(comm) ||
        max_rows < 1)
        return pagoda_error_set(PAGODA_EINVAL, "tensor parallel: a shard of rank %d of %d",
                                shard->rank, shard->size);
    tp->comm = comm;
    tp->shard = *shard;
    tp->nccl = strcmp(comm_name(comm), "nccl") == 0;
    tp->stream = stream;
    tp->vocab = vocab;
    tp->max_rows = max_rows;
    tp->max_reduce = max_reduce;
    const size_t gather = (size_t)max_rows * (size_t)shard->vocab_per_rank;
    cudaError_t e;
    if (tp->nccl) {
        e = cudaMalloc((void **)&tp->d_gathered, gather * (size_t)shard->size * sizeof(float));
        if (e != cudaSuccess)
            return tp_cuda_fail(e, "cudaMalloc (gathered logits)");
        return 0;
    }
    size_t need = gather * (size_t)(shard->size + 1);
    if (need < max_reduce)
        need = max_reduce;
    e = cudaMallocHost((void **)&tp->host, need * sizeof(float));
    if (e != cudaSuccess) {
        tp->host = NULL;
        return tp_cuda_fail(e, "cudaMallocHost (staging)");
    }
    return 0;
}

void cuda_tp_fini(struct cuda_tp *tp)
{
    if (tp == NULL)
        return;
    if (tp->host != NULL)
        cudaFreeHost(tp->host);
    if (tp->d_gathered != NULL)
        cudaFree(tp->d_gathered);
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
    const size_t bytes = count * sizeof(float);
    if ((e = cudaMemcpyAsync(tp->host, buf, bytes, cudaMemcpyDeviceToHost, tp->stream)) !=
            cudaSuccess ||
        (e = cudaStreamSynchronize(tp->stream)) != cudaSuccess)
        return tp_cuda_fail(e, "staging the all-reduce");
    int rc = comm_all_reduce_sum(tp->comm, tp->host, count, DTYPE_F32);
    if (rc != 0)
        return rc;
    e = cudaMemcpyAsync(buf, tp->host, bytes, cudaMemcpyHostToDevice, tp->stream);
    return e == cudaSuccess ? 0 : tp_cuda_fail(e, "the all-reduce's result");
}

int cuda_tp_gather_logits(struct cuda_tp *tp, const float *local, int32_t rows, float *logits)
{
    if (rows < 0 || rows > tp->max_rows)
        return pagoda_error_set(PAGODA_EINVAL, "tensor parallel: %d logits rows (%d)", (int)rows,
                                (int)tp->max_rows);
    if (rows == 0)
        return 0;
    const int64_t per = tp->shard.vocab_per_rank;
    const size_t count = (size_t)rows * (size_t)per;
    const float *gathered;
    enum cudaMemcpyKind kind;
    cudaError_t e;
    int rc;
    if (tp->nccl) {
        if ((e = cudaStreamSynchronize(tp->stream)) != cudaSuccess)
            return tp_cuda_fail(e, "before the all-gather");
        if ((rc = comm_all_gather(tp->comm, local, tp->d_gathered, count, DTYPE_F32)) != 0)
            return rc;
        gathered = tp->d_gathered;
        kind = cudaMemcpyDeviceToDevice;
    } else {
        float *send = tp->host, *recv = tp->host + count;
        if ((e = cudaMemcpyAsync(send, local, count * sizeof(float), cudaMemcpyDeviceToHost,
                                 tp->stream)) != cudaSuccess ||
            (e = cudaStreamSynchronize(tp->stream)) != cudaSuccess)
            return tp_cuda_fail(e, "staging the all-gather");
        if ((rc = comm_all_gather(tp->comm, send, recv, count, DTYPE_F32)) != 0)
            return rc;
        gathered = recv;
        kind = cudaMemcpyHostToDevice;
    }
    /* Rank q's run is [q * per, q * per + len) of the vocabulary, the last one's possibly
     * shorter (its padding dropped). */
    for (int q = 0; q < tp->shard.size; q++) {
        int64_t begin = per * q, len = begin + per <= tp->vocab ? per : tp->vocab - begin;
        e = cudaMemcpy2DAsync(logits + begin, (size_t)tp->vocab * sizeof(float),
                              gathered + (size_t)q * count, (size_t)per * sizeof(float),
                              (size_t)len * sizeof(float), (size_t)rows, kind, tp->stream);
        if (e != cudaSuccess)
            return tp_cuda_fail(e, "laying out the gathered logits");
    }
    return 0;
}
