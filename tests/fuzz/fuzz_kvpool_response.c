/* libFuzzer target: what a client of pagoda-kvpool (the worker, the scheduler) reads back, the
 * bytes as one KvpoolResponse (kvpool/kvpool_proto.h: kvpool_response_decode, which
 * kvpool_fetch_pool uses; the callers size their mappings from the geometry).
 *
 * An answer is refused with a code of pagoda's error space, or read into a pool that holds:
 * the geometry validates (its byte size below the limit), exactly one of the shared-memory name
 * and the handle socket is set, NUL-terminated in its field, with device -1 exactly for a CPU
 * pool; and the server's own packing of what was read decodes to the same thing. */
#include "common/error.h"
#include "kvpool/kvpool_proto.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static void check(const struct kvpool_info *info)
{
    if (kv_geometry_validate(&info->geometry) != 0)
        abort();
    size_t shm = strnlen(info->shm_name, sizeof(info->shm_name));
    size_t sock = strnlen(info->handle_socket, sizeof(info->handle_socket));
    if (shm == sizeof(info->shm_name) || sock == sizeof(info->handle_socket))
        abort();
    if ((shm == 0) == (sock == 0))
        abort();
    if (shm > 0 ? info->device != -1 : info->device < 0)
        abort();
    /* kvpool's packing of this pool reads back unchanged. */
    uint8_t *buf = NULL;
    size_t len = 0;
    if (kvpool_response_pack(&info->geometry, shm > 0 ? info->shm_name : NULL, info->device,
                             sock > 0 ? info->handle_socket : NULL, 0, NULL, &buf, &len) != 0)
        abort();
    struct kvpool_info again;
    int rc = kvpool_response_decode(buf, len, &again);
    free(buf);
    if (rc != 0 || !kv_geometry_equal(&again.geometry, &info->geometry) ||
        again.device != info->device || strcmp(again.shm_name, info->shm_name) != 0 ||
        strcmp(again.handle_socket, info->handle_socket) != 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct kvpool_info info;
    memset(&info, 0xa5, sizeof(info));
    int rc = kvpool_response_decode(data, size, &info);
    if (rc == 0) {
        check(&info);
    } else if (rc < PAGODA_EINTERNAL || rc > PAGODA_EINVAL) {
        abort(); /* outside pagoda's one error space */
    } else {
        char msg[256];
        pagoda_error_message(rc, msg, sizeof(msg));
    }
    return 0;
}
