/* The NCCL collectives (comm/comm_nccl.c) on the GPU machine: a group of one rank on device 0
 * (always), or with PAGODA_NCCL_RANKS=N one process per GPU, forked before CUDA is touched.
 * Each rank checks the all-reduce (f32 and bf16), the all-gather and the broadcast against the
 * values every rank put in, then that an aborted group refuses further calls. */
#include "comm/comm_nccl.h"
#include "common/error.h"
#include "tests/gpu/gpu_test.h"

#include <cuda_runtime_api.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define COUNT 1000003 /* odd, more than a few NCCL chunks */
#define TIMEOUT_MS 60000

static void run_rank(const uint8_t *id, int rank, int size)
{
    GPU_CHECK(cudaSetDevice(rank) == cudaSuccess, "rank %d: cudaSetDevice", rank);
    struct comm *c = NULL;
    int rc = comm_nccl_open(id, size, rank, NULL, TIMEOUT_MS, &c);
    GPU_CHECK(rc == 0, "rank %d: comm_nccl_open: %s (%s)", rank, pagoda_strerror(rc),
              pagoda_error_detail());
    if (rc != 0)
        return;
    GPU_CHECK(comm_rank(c) == rank && comm_size(c) == size, "rank and size");
    float *host = malloc((size_t)COUNT * size * sizeof(float)), *dev = NULL, *gathered = NULL;
    cudaMalloc((void **)&dev, (size_t)COUNT * sizeof(float));
    cudaMalloc((void **)&gathered, (size_t)COUNT * size * sizeof(float));
    for (int i = 0; i < COUNT; i++)
        host[i] = (float)(i % 113) * (float)(rank + 1);
    cudaMemcpy(dev, host, (size_t)COUNT * sizeof(float), cudaMemcpyHostToDevice);
    rc = comm_all_reduce_sum(c, dev, COUNT, DTYPE_F32);
    GPU_CHECK(rc == 0, "all-reduce f32: %s", pagoda_error_detail());
    cudaMemcpy(host, dev, (size_t)COUNT * sizeof(float), cudaMemcpyDeviceToHost);
    float ranks = (float)(size * (size + 1) / 2);
    int bad = 0;
    for (int i = 0; i < COUNT; i++)
        bad += host[i] != (float)(i % 113) * ranks;
    GPU_CHECK(bad == 0, "all-reduce f32 sums (%d wrong)", bad);

    uint16_t h[4] = {0}, *hd = NULL;
    for (int i = 0; i < 4; i++)
        h[i] = f32_to_bf16((float)(i + rank));
    cudaMalloc((void **)&hd, sizeof(h));
    cudaMemcpy(hd, h, sizeof(h), cudaMemcpyHostToDevice);
    GPU_CHECK(comm_all_reduce_sum(c, hd, 4, DTYPE_BF16) == 0, "all-reduce bf16");
    cudaMemcpy(h, hd, sizeof(h), cudaMemcpyDeviceToHost);
    GPU_CHECK(bf16_to_f32(h[3]) == (float)(3 * size + size * (size - 1) / 2), "bf16 sum");

    for (int i = 0; i < COUNT; i++)
        host[i] = (float)(rank * 10 + i % 7);
    cudaMemcpy(dev, host, (size_t)COUNT * sizeof(float), cudaMemcpyHostToDevice);
    GPU_CHECK(comm_all_gather(c, dev, gathered, COUNT, DTYPE_F32) == 0, "all-gather");
    cudaMemcpy(host, gathered, (size_t)COUNT * size * sizeof(float), cudaMemcpyDeviceToHost);
    bad = 0;
    for (int r = 0; r < size; r++)
        for (int i = 0; i < COUNT; i += 997)
            bad += host[(size_t)r * COUNT + i] != (float)(r * 10 + i % 7);
    GPU_CHECK(bad == 0, "all-gather values (%d wrong)", bad);

    int32_t word = rank == 0 ? 4242 : -1, *wd = NULL;
    cudaMalloc((void **)&wd, sizeof(word));
    cudaMemcpy(wd, &word, sizeof(word), cudaMemcpyHostToDevice);
    GPU_CHECK(comm_broadcast(c, wd, sizeof(word), 0) == 0, "broadcast");
    cudaMemcpy(&word, wd, sizeof(word), cudaMemcpyDeviceToHost);
    GPU_CHECK(word == 4242, "broadcast value %d", word);

    comm_abort(c);
    GPU_CHECK(comm_all_reduce_sum(c, dev, 1, DTYPE_F32) == PAGODA_ECLOSED,
              "an aborted group refuses calls");
    comm_close(c);
    cudaFree(dev);
    cudaFree(gathered);
    cudaFree(hd);
    cudaFree(wd);
    free(host);
}

int main(void)
{
    const char *env = getenv("PAGODA_NCCL_RANKS");
    int size = env ? atoi(env) : 1;
    if (size < 1 || size > COMM_MAX_RANKS) {
        printf("FAIL PAGODA_NCCL_RANKS=%s\n", env);
        return 1;
    }
    uint8_t id[COMM_NCCL_ID_BYTES];
    if (size == 1) {
        gpu_test_require_device("test_comm_nccl");
        int rc = comm_nccl_unique_id(id);
        GPU_CHECK(rc == 0, "unique id: %s", pagoda_error_detail());
        if (rc == 0)
            run_rank(id, 0, 1);
    } else {
        /* The id's bootstrap root lives in this process, which waits for the ranks. */
        if (comm_nccl_unique_id(id) != 0) {
            printf("FAIL unique id: %s\n", pagoda_error_detail());
            return 1;
        }
        pid_t pids[COMM_MAX_RANKS];
        for (int r = 0; r < size; r++) {
            pids[r] = fork();
            if (pids[r] == 0) {
                run_rank(id, r, size);
                printf("rank %d: %d passed, %d failed\n", r, gpu_test_passed, gpu_test_failed);
                _exit(gpu_test_failed ? 1 : 0);
            }
        }
        for (int r = 0; r < size; r++) {
            int st = 0;
            waitpid(pids[r], &st, 0);
            GPU_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank %d exited %d", r, st);
        }
    }
    printf("test_comm_nccl: %d passed, %d failed\n", gpu_test_passed, gpu_test_failed);
    return gpu_test_failed ? 1 : 0;
}
