/* libFuzzer target: a Control message a program of the group (or anyone who can connect to
 * supervisor.ipc) sends the supervisor, the bytes as one message: the decode on_control does
 * (deploy/supervisor.c) and the sender's name read as on_ready and on_heartbeat read it
 * (deploy/control.h: control_parse_sender).
 *
 * A sender is refused, or read as a role and, for a worker, an id in range, and then it is that
 * role's canonical name ("scheduler", "worker-3": the names the programs send), which reads back
 * as the same role and id; and the message packs again into one that decodes with the same
 * fields. */
#include "common/error.h"
#include "deploy/control.h"
#include "proto/internal.pb-c.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* As SUP_MAX_WORKERS in supervisor_opts.h; a smaller limit too, to reach its edge. */
#define FUZZ_MAX_WORKERS 64
#define FUZZ_FEW_WORKERS 3

static void check_sender(const char *sender, int max_workers)
{
    enum role role = ROLE_COUNT;
    int id = -2;
    int rc = control_parse_sender(sender, max_workers, &role, &id);
    if (rc != 0) {
        if (rc != PAGODA_EINVAL || id != -1)
            abort();
        return;
    }
    if ((int)role < 0 || role >= ROLE_COUNT || id < -1 || id >= max_workers ||
        (id >= 0 && role != ROLE_WORKER))
        abort();
    char canon[32];
    if (id >= 0)
        snprintf(canon, sizeof(canon), "worker-%d", id);
    else
        snprintf(canon, sizeof(canon), "%s", role_names[role]);
    if (strcmp(canon, sender) != 0)
        abort(); /* one name per sender: "worker-03", "worker-+3" are not worker-3 */
    enum role role2 = ROLE_COUNT;
    int id2 = -2;
    if (control_parse_sender(canon, max_workers, &role2, &id2) != 0 || role2 != role || id2 != id)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    Pagoda__Internal__Control *ctl = pagoda__internal__control__unpack(NULL, size, data);
    if (ctl == NULL)
        return 0; /* on_control counts it as malformed */
    check_sender(ctl->sender, FUZZ_MAX_WORKERS);
    check_sender(ctl->sender, FUZZ_FEW_WORKERS);

    /* Fields the message does not know are left out of the repacking: protobuf-c takes a tag
     * of field 0 written in two bytes as an unknown field but refuses it written in one. */
    unsigned unknown = ctl->base.n_unknown_fields;
    ctl->base.n_unknown_fields = 0;
    size_t n = pagoda__internal__control__get_packed_size(ctl);
    uint8_t *buf = malloc(n > 0 ? n : 1);
    if (buf == NULL)
        abort();
    pagoda__internal__control__pack(ctl, buf);
    Pagoda__Internal__Control *again = pagoda__internal__control__unpack(NULL, n, buf);
    free(buf);
    ctl->base.n_unknown_fields = unknown;
    if (again == NULL || again->has_ready != ctl->has_ready || again->ready != ctl->ready ||
        again->has_heartbeat != ctl->has_heartbeat || again->heartbeat != ctl->heartbeat ||
        again->has_hung_worker_id != ctl->has_hung_worker_id ||
        again->hung_worker_id != ctl->hung_worker_id ||
        again->has_hung_worker_pid != ctl->has_hung_worker_pid ||
        again->hung_worker_pid != ctl->hung_worker_pid ||
        (again->sender == NULL) != (ctl->sender == NULL) ||
        (ctl->sender != NULL && strcmp(again->sender, ctl->sender) != 0))
        abort();
    protobuf_c_message_free_unpacked(&again->base, NULL);
    protobuf_c_message_free_unpacked(&ctl->base, NULL);
    return 0;
}
