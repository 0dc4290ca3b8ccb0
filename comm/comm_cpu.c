/* comm.h's cpu implementation: ranks of one host meeting in a shared region.
 *
 * The region holds one 32-bit barrier word (the ranks arrived, a generation count, a broken
 * flag), the group's broken state, and one staging slot per rank. A collective moves its
 * buffer through the slots a chunk at a time: each rank writes its chunk and the call's
 * signature (op, count, root) into its slot, all meet at the barrier, each reads what it needs
 * (the sum over slots in rank order, or every slot), and all meet again before the slots are
 * written anew. Every barrier wait has a deadline: a peer that does not come within the
 * group's timeout breaks the group (PAGODA_ETIMEDOUT) and wakes everyone.
 *
 * No lock: a rank arrives with one compare-and-swap on the word and waits on it with a futex
 * whose deadline is absolute, so nothing a peer does or fails to do (dies, stops with SIGSTOP,
 * is descheduled at any instruction) can hold another rank past its deadline. Until
 * 2026-12-03 the barrier was a process-shared robust mutex and condition variable: a rank
 * stopped while it held the mutex (test_tp_proc_group's SIGSTOP, on a loaded machine) held
 * every peer for ever, because pthread_cond_timedwait's deadline does not cover taking the
 * mutex back (rank 0 was found in __pthread_mutex_cond_lock_full, minutes past its deadline). */
#include "comm/comm.h"
#include "common/error.h"

#include <errno.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define SHARED_MAGIC 0x32676d63u /* "cmg2": the lock-free barrier's region */

/* The words are shared by processes: their atomics must not be emulated with a lock. */
_Static_assert(ATOMIC_INT_LOCK_FREE == 2 && ATOMIC_LLONG_LOCK_FREE == 2,
               "comm: 32- and 64-bit atomics must be lock-free");

/* The barrier word: bits 0-7 the ranks arrived at the current barrier (COMM_MAX_RANKS < 256),
 * bits 8-30 its generation (a waiter compares for equality: it cannot wrap while one waits),
 * bit 31 the group broken. */
#define WORD_ARRIVED 0xffu
#define WORD_GEN_ONE 0x100u
#define WORD_GEN 0x7fffff00u
#define WORD_BROKEN 0x80000000u

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
    _Atomic uint32_t word; /* the barrier word (above); the futex every wait sleeps on */
    /* 0, or how the group broke, set once (the first rank to break it wins): the error's code
     * in bits 0-31, the rank that broke it in 32-47, 1 in bit 48 when comm_abort did */
    _Atomic uint64_t broken;
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
    sh->size = size;
    sh->timeout_ms = timeout_ms;
    atomic_init(&sh->word, 0);
    atomic_init(&sh->broken, 0);
    atomic_thread_fence(memory_order_release);
    sh->magic = SHARED_MAGIC;
    return 0;
}

void comm_cpu_shared_fini(void *mem)
{
    struct shared *sh = mem;
    if (sh != NULL && sh->magic == SHARED_MAGIC)
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

/* How long one futex sleep lasts at most: a waiter looks at the word again this often even when
 * no wake-up comes (a rank stopped between its barrier's last arrival and its wake call must
 * not keep the others asleep to their deadline, with the barrier passed). */
#define WAIT_SLICE_MS 20

static int ts_before(const struct timespec *a, const struct timespec *b)
{
    return a->tv_sec < b->tv_sec || (a->tv_sec == b->tv_sec && a->tv_nsec < b->tv_nsec);
}

/* Sleeps while the word is seen, until woken, for at most WAIT_SLICE_MS, and not past the
 * (absolute, CLOCK_MONOTONIC) deadline. Returns ETIMEDOUT once the deadline has passed, else 0
 * (the caller looks at the word again). Not FUTEX_PRIVATE: the word may be shared by processes.
 * A futex call that fails for another reason than a wake-up (EAGAIN, EINTR) or its time
 * (ENOSYS under a seccomp filter, say) sleeps a millisecond instead: the deadline still holds and
 * the wait does not spin. */
static int futex_wait_until(_Atomic uint32_t *word, uint32_t seen, const struct timespec *deadline)
{
    struct timespec slice = deadline_after(WAIT_SLICE_MS), now;
    if (ts_before(deadline, &slice))
        slice = *deadline;
    long r = syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT_BITSET, seen, &slice, NULL,
                     FUTEX_BITSET_MATCH_ANY);
    if (r != 0 && errno != ETIMEDOUT && errno != EAGAIN && errno != EINTR) {
        struct timespec ms = {0, 1000000L};
        nanosleep(&ms, NULL);
    }
    clock_gettime(CLOCK_MONOTONIC, &now);
    return ts_before(&now, deadline) ? 0 : ETIMEDOUT;
}

static void futex_wake_all(_Atomic uint32_t *word)
{
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static uint64_t broken_word(int err, int rank, int aborted)
{
    return (uint64_t)(uint32_t)err | (uint64_t)(uint16_t)rank << 32 |
           (uint64_t)(aborted != 0) << 48;
}

/* Records how the group broke, unless a break is recorded already: the first is the one every
 * rank reports. */
static void set_broken(struct shared *sh, int err, int rank, int aborted)
{
    uint64_t none = 0;
    atomic_compare_exchange_strong_explicit(&sh->broken, &none, broken_word(err, rank, aborted),
                                            memory_order_acq_rel, memory_order_acquire);
}

/* Breaks the group with err (set_broken) and wakes every waiter. */
static void mark_broken(struct shared *sh, int err, int rank, int aborted)
{
    set_broken(sh, err, rank, aborted);
    atomic_fetch_or_explicit(&sh->word, WORD_BROKEN, memory_order_acq_rel);
    futex_wake_all(&sh->word);
}

/* Changes the word (*s, its value last seen, refreshed on every try) to what change makes of it,
 * but only while the barrier of generation gen is still pending: not passed, group not broken.
 * Returns 1 when the change was made, 0 when the barrier passed or the group broke first. */
static int change_if_pending(struct shared *sh, uint32_t gen, uint32_t *s,
                             uint32_t (*change)(uint32_t))
{
    while ((*s & WORD_GEN) == gen && !(*s & WORD_BROKEN))
        if (atomic_compare_exchange_weak_explicit(&sh->word, s, change(*s), memory_order_acq_rel,
                                                  memory_order_acquire))
            return 1;
    return 0;
}

static uint32_t with_broken(uint32_t w)
{
    return w | WORD_BROKEN;
}

static uint32_t one_left(uint32_t w)
{
    return w - 1;
}

/* The error of a broken group, with a detail. */
static int broken_error(const struct shared *sh, int rank)
{
    uint64_t b = atomic_load_explicit(&sh->broken, memory_order_acquire);
    int err = (int)(uint32_t)b, by = (int)(uint16_t)(b >> 32);
    if (err == 0) /* a timeout's break, between its flag and its detail (barrier_idle) */
        return pagoda_error_set(PAGODA_ETIMEDOUT,
                                "comm rank %d: the group broke (a peer did not arrive in time)",
                                rank);
    if (b >> 48 & 1)
        return pagoda_error_set(PAGODA_ECLOSED, "comm rank %d: rank %d aborted the group", rank,
                                by);
    return pagoda_error_set(err, "comm rank %d: the group broke (%s, seen by rank %d)", rank,
                            pagoda_strerror(err), by);
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
    int rank = c->base.rank;
    struct timespec d = idle ? deadline_after(COMM_IDLE_POLL_MS) : *deadline_in;
    uint32_t s = atomic_load_explicit(&sh->word, memory_order_acquire), gen;
    /* Arrive: the last rank to come starts the next generation with none arrived. */
    for (;;) {
        if (s & WORD_BROKEN)
            return broken_error(sh, rank);
        gen = s & WORD_GEN;
        uint32_t next =
            (int)(s & WORD_ARRIVED) + 1 == sh->size ? (gen + WORD_GEN_ONE) & WORD_GEN : s + 1;
        if (atomic_compare_exchange_weak_explicit(&sh->word, &s, next, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            if ((next & WORD_GEN) != gen) {
                if (sh->size > 1)
                    futex_wake_all(&sh->word);
                return 0;
            }
            s = next;
            break;
        }
    }
    /* Wait for the generation to change. A generation that moved on is a barrier passed, even
     * if the group broke afterwards (the next call sees that). */
    for (;;) {
        if ((s & WORD_GEN) != gen)
            return 0;
        if (s & WORD_BROKEN)
            return broken_error(sh, rank);
        int e = futex_wait_until(&sh->word, s, &d);
        s = atomic_load_explicit(&sh->word, memory_order_acquire);
        if (e != ETIMEDOUT || (s & WORD_GEN) != gen || (s & WORD_BROKEN))
            continue;
        if (idle == NULL) {
            /* Break the group only from this very generation, not yet passed: the barrier
             * passes for every rank or for none (a last arrival just now wins). The detail
             * follows the flag (broken_error covers the gap). */
            if (!change_if_pending(sh, gen, &s, with_broken))
                continue;
            set_broken(sh, PAGODA_ETIMEDOUT, rank, 0);
            futex_wake_all(&sh->word);
            return pagoda_error_set(PAGODA_ETIMEDOUT,
                                    "comm rank %d: a peer did not arrive within %d ms", rank,
                                    sh->timeout_ms);
        }
        if (!idle->keep_waiting(idle->ctx)) {
            /* Leave, unless the barrier passed (or the group broke) meanwhile. */
            if (change_if_pending(sh, gen, &s, one_left))
                return pagoda_error_set(PAGODA_ECLOSED, "comm rank %d: stopped waiting", rank);
            continue;
        }
        d = deadline_after(COMM_IDLE_POLL_MS);
    }
}

static int barrier(struct cpu_comm *c, const struct timespec *deadline)
{
    return barrier_idle(c, deadline, NULL);
}

/* Marks the group broken with err (a rank found the peers disagree). */
static int break_group(struct cpu_comm *c, int err)
{
    mark_broken(c->sh, err, c->base.rank, 0);
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
    mark_broken(c->sh, PAGODA_ECLOSED, base->rank, 1);
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
