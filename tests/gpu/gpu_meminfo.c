/* gpu_meminfo: prints the free and the total memory of a CUDA device in bytes ("FREE TOTAL"),
 * for tests/gpu/group_gpu.sh, which compares the free memory before a GPU group starts and
 * after it stops. The measure includes this process's own CUDA context, the same each time.
 *
 * usage: gpu_meminfo [DEVICE]      exit 77 when there is no CUDA device */
#include "common/error.h"
#include "kvpool/cuda_pool.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int device = argc > 1 ? atoi(argv[1]) : 0;
    if (kv_cuda_device_count() == 0) {
        fprintf(stderr, "gpu_meminfo: no CUDA device here\n");
        return 77;
    }
    uint64_t free_bytes, total_bytes;
    int rc = kv_cuda_mem_info(device, &free_bytes, &total_bytes);
    if (rc != 0) {
        char msg[700];
        fprintf(stderr, "gpu_meminfo: %s\n", pagoda_error_message(rc, msg, sizeof(msg)));
        return 1;
    }
    printf("%" PRIu64 " %" PRIu64 "\n", free_bytes, total_bytes);
    return 0;
}
