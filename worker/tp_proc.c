/* tp_proc.h: the group file's phases are 1 (the member published) and 2 (loaded). */
#include "worker/tp_proc.h"
#include "comm/comm_file.h"
#include "common/error.h"
#include "common/log.h"
#ifdef PAGODA_HAVE_NCCL
#include "comm/comm_nccl.h"

#include <cuda_runtime_api.h>
#endif

#include <stdio.h>
#include <stdlib.h>
#define XXH_INLINE_ALL
#include <xxhash.h>
#include <string.h>
#include <unistd.h>

enum { PHASE_MEMBER = 1, PHASE_LOADED = 2 };

_Static_assert(sizeof(struct tp_proc_member) <= COMM_FILE_PAYLOAD_BYTES,
               "a member fits its place in the group file");

struct tp_proc {
    struct comm_file *file;
    int rank, size, timeout_ms;
    struct tp_proc_member members[COMM_MAX_RANKS];
    uint64_t pool_id;
};

uint64_t tp_proc_group_pool_id(const uint64_t *ids, int n)
{
    if (n <= 1)
        return n == 1 ? ids[0] : 1;
    uint64_t h = XXH3_64bits(ids, (size_t)n * sizeof(ids[0]));
    return h != 0 ? h : 1;
}

#define SAME(field, what)                                                                          \
    do {                                                                                           \
        if (m->field != m0->field)                                                                 \
            return pagoda_error_set(PAGODA_EMISMATCH,                                              \
                                    "tensor-parallel ranks disagree on %s: rank 0 has %lld, "      \
                                    "rank %d %lld",                                                \
                                    what, (long long)m0->field, r, (long long)m->field);           \
    } while (0)

int tp_proc_compare(const struct tp_proc_member *members, int n)
{
    const struct tp_proc_member *m0 = &members[0];
    for (int r = 0; r < n; r++) {
        const struct tp_proc_member *m = &members[r];
        if (m->rank != r)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    "tensor-parallel place %d holds rank %d's member", r, m->rank);
        if (m->layout != m0->layout)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    "tensor-parallel ranks 0 and %d run different pagoda builds "
                                    "(member layouts %#x and %#x): build every rank alike",
                                    r, (unsigned)m0->layout, (unsigned)m->layout);
        SAME(size, "the group's size");
        if (memcmp(m->fingerprint, m0->fingerprint, sizeof(m->fingerprint)) != 0)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    "tensor-parallel ranks 0 and %d serve different models "
                                    "(their fingerprints differ: --model, --load-format, --seed)",
                                    r);
        if (strncmp(m->backend, m0->backend, sizeof(m->backend)) != 0)
            return pagoda_error_set(PAGODA_EMISMATCH,
                                    "tensor-parallel ranks disagree on the backend: rank 0 has "
                                    "%.16s, rank %d %.16s",
                                    m0->backend, r, m->backend);
        SAME(num_layers, "the pool's layers");
        SAME(num_blocks, "the pool's block count (give every rank's kvpool the same --kv-blocks)");
        SAME(block_size, "the pool's block size");
        SAME(num_kv_heads, "the pool's KV heads");
        SAME(head_dim, "the pool's head dim");
        SAME(dtype, "the pool's dtype");
        SAME(max_num_tokens, "--max-batched-tokens");
        SAME(max_num_seqs, "--max-seqs");
        SAME(max_blocks_per_seq, "the blocks a sequence may have");
    }
    return 0;
}

#undef SAME

int tp_proc_join(const struct tp_proc_options *o, const struct tp_proc_member *mine,
                 struct tp_proc **out)
{
    struct tp_proc *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    t->rank = o->rank;
    t->size = o->size;
    t->timeout_ms = o->timeout_ms;
    struct tp_proc_member me = *mine;
    me.rank = o->rank;
    me.size = o->size;
    me.pid = (int32_t)getpid();
    me.nccl = 0;
    me.nccl_capable = 0;
    me.layout = TP_PROC_MEMBER_LAYOUT;
    memset(me.nccl_id, 0, sizeof(me.nccl_id));
    int rc = 0;
#ifdef PAGODA_HAVE_NCCL
    me.nccl_capable = 1;
    if (o->rank == 0 && o->want_nccl) {
        if ((rc = comm_nccl_unique_id(me.nccl_id)) != 0)
            goto fail;
        me.nccl = 1;
    }
#else
    if (o->rank == 0 && o->want_nccl)
        log_warn("tensor-parallel rank 0: this build has no NCCL: the group's collectives go "
                 "through the cpu group (staged through pinned memory; for GPUs, slow)");
#endif
    if ((rc = comm_file_open(o->path, o->rank, o->size, o->timeout_ms, o->keep_waiting, o->ctx,
                             &t->file)) != 0 ||
        (rc = comm_file_publish(t->file, PHASE_MEMBER, &me, sizeof(me))) != 0)
        goto fail;
    for (int r = 0; r < o->size; r++) {
        if (r == o->rank) {
            t->members[r] = me;
            continue;
        }
        if ((rc = comm_file_wait(t->file, r, PHASE_MEMBER, &t->members[r], sizeof(t->members[r]),
                                 o->keep_waiting, o->ctx)) != 0)
            goto fail;
    }
    if ((rc = tp_proc_compare(t->members, o->size)) != 0)
        goto fail;
    uint64_t ids[COMM_MAX_RANKS];
    for (int r = 0; r < o->size; r++)
        ids[r] = t->members[r].pool_id;
    t->pool_id = tp_proc_group_pool_id(ids, o->size);
    *out = t;
    return 0;
fail:
    tp_proc_close(t);
    return rc;
}

struct comm *tp_proc_comm(struct tp_proc *t)
{
    return comm_file_comm(t->file);
}

int tp_proc_use_nccl(const struct tp_proc_member *members, int n, char *why, size_t why_len)
{
    why[0] = '\0';
    if (!members[0].nccl)
        return 0;
    for (int r = 0; r < n; r++)
        if (!members[r].nccl_capable) {
            snprintf(why, why_len,
                     "rank %d's build has no NCCL (build every rank alike): the collectives go "
                     "through the cpu group instead",
                     r);
            return 0;
        }
    for (int r = 0; r < n; r++)
        for (int q = r + 1; q < n && members[r].has_device; q++)
            if (members[q].has_device && memcmp(members[q].device_uuid, members[r].device_uuid,
                                                sizeof(members[r].device_uuid)) == 0) {
                snprintf(why, why_len,
                         "ranks %d and %d share a GPU, which NCCL refuses: the collectives go "
                         "through the cpu group instead (for trials, not speed)",
                         r, q);
                return 0;
            }
    return 1;
}

int tp_proc_device_comm(struct tp_proc *t, int device, struct comm **out, int *owned)
{
    *owned = 0;
    char why[160];
    /* Every rank sees the same members, so every rank decides alike. */
    if (!tp_proc_use_nccl(t->members, t->size, why, sizeof(why))) {
        if (why[0] != '\0')
            log_warn("tensor-parallel rank %d: %s", t->rank, why);
        else
            log_info("tensor-parallel rank %d: collectives through the cpu group (staged through "
                     "pinned memory)",
                     t->rank);
        *out = tp_proc_comm(t);
        return 0;
    }
#ifdef PAGODA_HAVE_NCCL
    cudaError_t ce = cudaSetDevice(device);
    if (ce != cudaSuccess)
        return pagoda_error_set(PAGODA_ECUDA, "cudaSetDevice(%d): %s", device,
                                cudaGetErrorString(ce));
    int rc = comm_nccl_open(t->members[0].nccl_id, t->size, t->rank, NULL, t->timeout_ms, out);
    if (rc != 0)
        return rc;
    *owned = 1;
    log_info("tensor-parallel rank %d: collectives through NCCL on device %d", t->rank, device);
    return 0;
#else
    (void)device; /* unreachable: this rank published nccl_capable 0 */
    return pagoda_error_set(PAGODA_EUNSUPPORTED, "this rank's build has no NCCL");
#endif
}

uint64_t tp_proc_pool_id(const struct tp_proc *t)
{
    return t->pool_id;
}

int tp_proc_loaded(struct tp_proc *t, int (*keep_waiting)(void *ctx), void *ctx)
{
    int rc = comm_file_publish(t->file, PHASE_LOADED, NULL, 0);
    if (rc != 0 || t->rank != 0)
        return rc;
    for (int r = 1; r < t->size; r++)
        if ((rc = comm_file_wait(t->file, r, PHASE_LOADED, NULL, 0, keep_waiting, ctx)) != 0)
            return rc;
    return 0;
}

int tp_proc_leader_alive(const struct tp_proc *t)
{
    return comm_file_alive(t->file, 0);
}

void tp_proc_close(struct tp_proc *t)
{
    if (t == NULL)
        return;
    comm_file_close(t->file);
    free(t);
}
