/* comm.h's cpu implementation: ranks of one host meeting in a shared region.
 *
 * The region holds a process-shared, robust mutex and condition variable (a barrier with a
 * generation count), the group's state, and one staging slot per rank. A collective moves its
 * buffer through the slots a chunk at a time: each rank writes its chunk and the call's
 * signature (op, count, root) into its slot, all meet at the barrier, each reads what it needs
 * (the sum over slots in rank order, or every slot), and all meet again before the slots are
 * written anew. Every barrier wait has a deadline: a peer that does not come within the
 * group's timeout breaks the group (PAGODA_ETIMEDOUT) and wakes everyone. A process that dies
 * holding the mutex is seen through the robust mutex (EOWNERDEAD) and breaks the group too. */
#include "comm/comm.h"
#include "common/error.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SHARED_MAGIC 0x70676d63u /* "pgmc" */

enum op { OP_ALL_REDUCE = 1, OP_ALL_GATHER = 2, OP_BROADCAST = 3 };

/* What each rank says it is doing, checked against rank 0's at every chunk. */
struct signature {
    uint32_t op;
    uint32_t dtype;
    uint64_t count;
    int64_t root;
};

struct slot {
    struct signature sig;
    char pad[64 - sizeof(struct signature)];
    /* COMM_CPU_SLOT_BYTES of data follow */
};

struct shared {
    uint32_t magic;
    int size;
    int timeout_ms;
    pthread_mutex_t mutex;
    pthread_cond_t cond;
    int arrived;
    uint64_t generation;
    int broken;    /* 0, or the error every later call returns */
    int broken_by; /* the rank that broke it (-1: a dead process) */
    int aborted;   /* broken by comm_abort */
    char pad[64];
    /* size slots follow, each sizeof(struct slot) + COMM_CPU_SLOT_BYTES, 64-byte aligned */
};

struct cpu_comm {
    struct comm base;
    struct shared *sh;
};

static size_t header_bytes(void)
{
    return (sizeof(struct shared) + 63) & ~(size_t)63;
}

static size_t slot_stride(void)
{
    return sizeof(struct slot) + COMM_CPU_SLOT_BYTES;
}

static struct slot *slot_of(struct shared *sh, int rank)
{
    return (struct slot *)((char *)sh + header_bytes() + (size_t)rank * slot_stride());
}

static char *slot_data(struct shared *sh, int rank)
{
    return (char *)(slot_of(sh, rank) + 1);
}

size_t comm_cpu_shared_bytes(int size)
{
    if (size < 1 || size > COMM_MAX_RANKS)
        return 0;
    return header_bytes() + (size_t)size * slot_stride();
}

int comm_cpu_shared_init(void *mem, int size, int timeout_ms)
{
    if (mem == NULL || size < 1 || size > COMM_MAX_RANKS || timeout_ms <= 0)
        return pagoda_error_set(PAGODA_EINVAL, "comm group of %d ranks, timeout %d ms", size,
                                timeout_ms);
    struct shared *sh = mem;
    memset(sh, 0, header_bytes());
    pthread_mutexattr_t ma;
    pthread_condattr_t ca;
    int ok = pthread_mutexattr_init(&ma) == 0;
    ok = ok && pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED) == 0 &&
         pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST) == 0 &&
         pthread_mutex_init(&sh->mutex, &ma) == 0;
    pthread_mutexattr_destroy(&ma);
    if (!ok)
        return pagoda_error_set(PAGODA_EIO, "comm: process-shared robust mutex refused");
    ok = pthread_condattr_init(&ca) == 0;
    ok = ok && pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED) == 0 &&
         pthread_condattr_setclock(&ca, CLOCK_MONOTONIC) == 0 &&
         pthread_cond_init(&sh->cond, &ca) == 0;
    pthread_condattr_destroy(&ca);
    if (!ok) {
        pthread_mutex_destroy(&sh->mutex);
        return pagoda_error_set(PAGODA_EIO, "comm: process-shared condition variable refused");
    }
    sh->size = size;
    sh->timeout_ms = timeout_ms;
    sh->magic = SHARED_MAGIC;
    return 0;
}

void comm_cpu_shared_fini(void *mem)
{
    struct shared *sh = mem;
    if (sh == NULL || sh->magic != SHARED_MAGIC)
        return;
    /* A broken group may have lost a process inside pthread_cond_timedwait: glibc's
     * pthread_cond_destroy waits for every waiter to leave, which that one never does. The
     * region is about to be unmapped or freed anyway. */
    if (!sh->broken)
        pthread_cond_destroy(&sh->cond);
    pthread_mutex_destroy(&sh->mutex);
    sh->magic = 0;
}

static struct timespec deadline_after(int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* The error of a broken group, with a detail. */
static int broken_error(const struct shared *sh, int rank)
{
    if (sh->aborted)
        return pagoda_error_set(PAGODA_ECLOSED, "comm rank %d: rank %d aborted the group", rank,
                                sh->broken_by);
    if (sh->broken_by < 0)
        return pagoda_error_set(PAGODA_ECLOSED, "comm rank %d: a peer process died", rank);
    return pagoda_error_set(sh->broken, "comm rank %d: the group broke (%s, seen by rank %d)", rank,
                            pagoda_strerror(sh->broken), sh->broken_by);
}

/* Locks the mutex by the deadline. A peer process that died holding it breaks the group. */
static int lock(struct shared *sh, const struct timespec *deadline)
{
    int e = pthread_mutex_clocklock(&sh->mutex, CLOCK_MONOTONIC, deadline);
    if (e == EOWNERDEAD) {
        pthread_mutex_consistent(&sh->mutex);
        if (!sh->broken) {
            sh->broken = PAGODA_ECLOSED;
            sh->broken_by = -1;
        }
        pthread_cond_broadcast(&sh->cond);
        return 0;
    }
    if (e == ETIMEDOUT)
        return PAGODA_ETIMEDOUT;
    return e == 0 ? 0 : PAGODA_EIO;
}

/* How an idle rank waits at a barrier: no deadline while keep_waiting says so. */
struct idle {
    int (*keep_waiting)(void *ctx);
    void *ctx;
};

/* Waits until every rank has arrived, or the deadline passes (which breaks the group). With
 * idle, the deadline only paces the calls to keep_waiting; when it says stop, this rank leaves
 * the barrier and PAGODA_ECLOSED is returned. */
static int barrier_idle(struct cpu_comm *c, const struct timespec *deadline_in,
                        const struct idle *idle)
{
    struct shared *sh = c->sh;
    /* An idle wait's deadline paces keep_waiting; its locks wait as long as any call's. */
    struct timespec d = idle ? deadline_after(COMM_IDLE_POLL_MS) : *deadline_in;
    struct timespec lock_deadline = idle ? deadline_after(sh->timeout_ms) : *deadline_in;
    const struct timespec *deadline = &d;
    int rc = lock(sh, &lock_deadline);
    if (rc != 0)
        return pagoda_error_set(rc, "comm rank %d: the group's lock was not free in time",
                                c->base.rank);
    if (sh->broken) {
        rc = broken_error(sh, c->base.rank);
        pthread_mutex_unlock(&sh->mutex);
        return rc;
    }
    uint64_t gen = sh->generation;
    if (++sh->arrived == sh->size) {
        sh->arrived = 0;
        sh->generation++;
        pthread_cond_broadcast(&sh->cond);
    }
    while (sh->generation == gen && !sh->broken) {
        int e = pthread_cond_timedwait(&sh->cond, &sh->mutex, deadline);
        if (e == EOWNERDEAD) {
            pthread_mutex_consistent(&sh->mutex);
            sh->broken = PAGODA_ECLOSED;
            sh->broken_by = -1;
        } else if (e == ETIMEDOUT && sh->generation == gen && !sh->broken && idle) {
            pthread_mutex_unlock(&sh->mutex);
            int go_on = idle->keep_waiting(idle->ctx);
            lock_deadline = deadline_after(sh->timeout_ms);
            if ((rc = lock(sh, &lock_deadline)) != 0)
                return pagoda_error_set(rc, "comm rank %d: the group's lock was not free in time",
                                        c->base.rank);
            if (!go_on && sh->generation == gen && !sh->broken) {
                sh->arrived--;
                pthread_mutex_unlock(&sh->mutex);
                return pagoda_error_set(PAGODA_ECLOSED, "comm rank %d: stopped waiting",
                                        c->base.rank);
            }
            d = deadline_after(COMM_IDLE_POLL_MS);
        } else if (e == ETIMEDOUT && sh->generation == gen && !sh->broken) {
            sh->broken = PAGODA_ETIMEDOUT;
            sh->broken_by = c->base.rank;
            pthread_cond_broadcast(&sh->cond);
            pthread_mutex_unlock(&sh->mutex);
            return pagoda_error_set(PAGODA_ETIMEDOUT,
                                    "comm rank %d: a peer did not arrive within %d ms",
                                    c->base.rank, sh->timeout_ms);
        }
    }
    rc = sh->generation == gen ? broken_error(sh, c->base.rank) : 0;
    pthread_mutex_unlock(&sh->mutex);
    return rc;
}

static int barrier(struct cpu_comm *c, const struct timespec *deadline)
{
    return barrier_idle(c, deadline, NULL);
}

/* Marks the group broken with err (a rank found the peers disagree). */
static int break_group(struct cpu_comm *c, int err)
{
    struct shared *sh = c->sh;
    struct timespec d = deadline_after(sh->timeout_ms);
    if (lock(sh, &d) == 0) {
        if (!sh->broken) {
            sh->broken = err;
            sh->broken_by = c->base.rank;
        }
        pthread_cond_broadcast(&sh->cond);
        pthread_mutex_unlock(&sh->mutex);
    }
    return err;
}

/* Writes this rank's signature, meets the peers (waiting idle when idle is not NULL), and
 * checks theirs. */
static int exchange(struct cpu_comm *c, const struct signature *sig,
                    const struct timespec *deadline, const struct idle *idle)
{
    slot_of(c->sh, c->base.rank)->sig = *sig;
    int rc = barrier_idle(c, deadline, idle);
    if (rc != 0)
        return rc;
    for (int r = 0; r < c->base.size; r++) {
        const struct signature *o = &slot_of(c->sh, r)->sig;
        if (memcmp(o, sig, sizeof(*sig)) != 0) {
            pagoda_error_set(PAGODA_EPROTO,
                             "comm rank %d: rank %d called op %u of %llu elements, this rank op "
                             "%u of %llu",
                             c->base.rank, r, o->op, (unsigned long long)o->count, sig->op,
                             (unsigned long long)sig->count);
            return break_group(c, PAGODA_EPROTO);
        }
    }
    return 0;
}

static void sum_into(struct cpu_comm *c, void *dst, size_t offset_bytes, size_t n, enum dtype dtype)
{
    int size = c->base.size;
    if (dtype == DTYPE_F32) {
        float *out = dst;
        for (size_t i = 0; i < n; i++) {
            float s = 0.0f;
            for (int r = 0; r < size; r++)
                s += ((const float *)(slot_data(c->sh, r) + offset_bytes))[i];
            out[i] = s;
        }
    } else {
        uint16_t *out = dst;
        for (size_t i = 0; i < n; i++) {
            float s = 0.0f;
            for (int r = 0; r < size; r++)
                s += bf16_to_f32(((const uint16_t *)(slot_data(c->sh, r) + offset_bytes))[i]);
            out[i] = f32_to_bf16(s);
        }
    }
}

static int cpu_all_reduce_sum(struct comm *base, void *buf, size_t count, enum dtype dtype)
{
    struct cpu_comm *c = (struct cpu_comm *)base;
    size_t esize = dtype_size(dtype), per = COMM_CPU_SLOT_BYTES / esize;
    struct timespec deadline = deadline_after(c->sh->timeout_ms);
    struct signature sig = {.op = OP_ALL_REDUCE, .dtype = (uint32_t)dtype, .count = count};
    size_t done = 0;
    do {
        size_t n = count - done < per ? count - done : per;
        memcpy(slot_data(c->sh, base->rank), (char *)buf + done * esize, n * esize);
        int rc = exchange(c, &sig, &deadline, NULL);
        if (rc != 0)
            return rc;
        sum_into(c, (char *)buf + done * esize, 0, n, dtype);
        if ((rc = barrier(c, &deadline)) != 0)
            return rc;
        done += n;
    } while (done < count);
    return 0;
}

static int cpu_all_gather(struct comm *base, const void *send, void *recv, size_t count,
                          enum dtype dtype)
{
    struct cpu_comm *c = (struct cpu_comm *)base;
    size_t esize = dtype_size(dtype), per = COMM_CPU_SLOT_BYTES / esize;
    struct timespec deadline = deadline_after(c->sh->timeout_ms);
    struct signature sig = {.op = OP_ALL_GATHER, .dtype = (uint32_t)dtype, .count = count};
    size_t done = 0;
    do {
        size_t n = count - done < per ? count - done : per;
        memcpy(slot_data(c->sh, base->rank), (const char *)send + done * esize, n * esize);
        int rc = exchange(c, &sig, &deadline, NULL);
        if (rc != 0)
            return rc;
        for (int r = 0; r < base->size; r++)
            memcpy((char *)recv + ((size_t)r * count + done) * esize, slot_data(c->sh, r),
                   n * esize);
        if ((rc = barrier(c, &deadline)) != 0)
            return rc;
        done += n;
    } while (done < count);
    return 0;
}

/* A broadcast; with idle, the first meeting waits idle and the deadline starts once all have
 * met. */
static int broadcast(struct cpu_comm *c, void *buf, size_t bytes, int root, const struct idle *idle)
{
    struct comm *base = &c->base;
    struct timespec deadline = deadline_after(c->sh->timeout_ms);
    struct signature sig = {.op = OP_BROADCAST, .dtype = UINT32_MAX, .count = bytes, .root = root};
    size_t done = 0;
    do {
        size_t n = bytes - done < COMM_CPU_SLOT_BYTES ? bytes - done : COMM_CPU_SLOT_BYTES;
        if (base->rank == root)
            memcpy(slot_data(c->sh, root), (const char *)buf + done, n);
        int rc = exchange(c, &sig, &deadline, idle);
        if (rc != 0)
            return rc;
        if (idle != NULL) {
            idle = NULL;
            deadline = deadline_after(c->sh->timeout_ms);
        }
        if (base->rank != root)
            memcpy((char *)buf + done, slot_data(c->sh, root), n);
        if ((rc = barrier(c, &deadline)) != 0)
            return rc;
        done += n;
    } while (done < bytes);
    return 0;
}

static int cpu_broadcast(struct comm *base, void *buf, size_t bytes, int root)
{
    return broadcast((struct cpu_comm *)base, buf, bytes, root, NULL);
}

static int cpu_wait_broadcast(struct comm *base, void *buf, size_t bytes, int root,
                              int (*keep_waiting)(void *ctx), void *ctx)
{
    struct idle idle = {.keep_waiting = keep_waiting, .ctx = ctx};
    return broadcast((struct cpu_comm *)base, buf, bytes, root, &idle);
}

static void cpu_abort(struct comm *base)
{
    struct cpu_comm *c = (struct cpu_comm *)base;
    struct timespec d = deadline_after(c->sh->timeout_ms);
    if (lock(c->sh, &d) != 0)
        return;
    if (!c->sh->broken) {
        c->sh->broken = PAGODA_ECLOSED;
        c->sh->broken_by = base->rank;
        c->sh->aborted = 1;
    }
    pthread_cond_broadcast(&c->sh->cond);
    pthread_mutex_unlock(&c->sh->mutex);
}

static void cpu_close(struct comm *base)
{
    free(base);
}

static const struct comm_ops cpu_ops = {
    .name = "cpu",
    .all_reduce_sum = cpu_all_reduce_sum,
    .all_gather = cpu_all_gather,
    .broadcast = cpu_broadcast,
    .wait_broadcast = cpu_wait_broadcast,
    .abort = cpu_abort,
    .close = cpu_close,
};

int comm_cpu_open(void *shared, int rank, struct comm **out)
{
    struct shared *sh = shared;
    if (sh == NULL || sh->magic != SHARED_MAGIC)
        return pagoda_error_set(PAGODA_EINVAL, "comm: the shared region is not initialised");
    if (rank < 0 || rank >= sh->size)
        return pagoda_error_set(PAGODA_EINVAL, "comm: rank %d of a group of %d", rank, sh->size);
    struct cpu_comm *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "comm: out of memory");
    c->base = (struct comm){.ops = &cpu_ops, .rank = rank, .size = sh->size};
    c->sh = sh;
    *out = &c->base;
    return 0;
}
