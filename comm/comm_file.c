/* comm_file.h: a header page of claims and payloads, then the cpu comm region. Rank 0 claims
 * the region (state FRESH -> MAKING), extends the file, initialises the region and marks it
 * READY; every rank claims its place with its pid (0 -> pid, once). */
#include "comm/comm_file.h"
#include "common/error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define FILE_MAGIC UINT64_C(0x70756f7267707470) /* "ptpgroup" */
/* The header's bytes; the comm region starts here (page aligned, as comm_cpu_shared_init
 * wants 64). */
#define HEADER_BYTES ((size_t)16384)

enum state { STATE_FRESH = 0, STATE_MAKING = 1, STATE_READY = 2 };

struct place {
    _Atomic int32_t pid;
    _Atomic int32_t phase;
    uint8_t payload[COMM_FILE_PAYLOAD_BYTES];
    char pad[56];
};

struct header {
    uint64_t magic;
    uint32_t version;
    int32_t size;
    _Atomic int32_t state;
    int32_t maker_pid; /* rank 0's, once it claimed the region */
    char pad[40];
    struct place places[COMM_MAX_RANKS];
};

_Static_assert(sizeof(struct header) <= HEADER_BYTES, "the header fits its page");

struct comm_file {
    char path[PATH_MAX];
    int rank, size;
    struct header *h; /* the whole file's mapping */
    size_t mapped;
    struct comm *comm;
};

int comm_file_create(const char *path, int size)
{
    if (size < 1 || size > COMM_MAX_RANKS)
        return pagoda_error_set(PAGODA_EINVAL, "group file %s: size %d (1 to %d)", path, size,
                                COMM_MAX_RANKS);
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp))
        return pagoda_error_set(PAGODA_ERANGE, "group file %s: path too long", path);
    if (unlink(tmp) != 0 && errno != ENOENT)
        return pagoda_error_set(pagoda_from_errno(errno), "cannot remove %s: %s", tmp,
                                strerror(errno));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0)
        return pagoda_error_set(pagoda_from_errno(errno), "cannot create %s: %s", tmp,
                                strerror(errno));
    static struct header h; /* large: not on the stack; written whole, never kept */
    memset(&h, 0, sizeof(h));
    h.magic = FILE_MAGIC;
    h.version = COMM_FILE_VERSION;
    h.size = size;
    int err = 0;
    if (ftruncate(fd, (off_t)HEADER_BYTES) != 0 ||
        pwrite(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h))
        err = errno != 0 ? errno : EIO;
    if (close(fd) != 0 && err == 0)
        err = errno;
    if (err == 0 && rename(tmp, path) != 0)
        err = errno;
    if (err != 0) {
        unlink(tmp);
        return pagoda_error_set(pagoda_from_errno(err), "cannot write group file %s: %s", path,
                                strerror(err));
    }
    return 0;
}

static int pid_alive(int pid)
{
    return pid <= 0 || kill(pid, 0) == 0 || errno != ESRCH;
}

static void sleep_poll(void)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)COMM_FILE_POLL_MS * 1000000L};
    nanosleep(&ts, NULL);
}

/* Maps bytes of fd (shared, read and write). */
static int map_file(const char *path, int fd, size_t bytes, struct header **out)
{
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return pagoda_error_set(pagoda_from_errno(errno), "cannot map group file %s: %s", path,
                                strerror(errno));
    *out = p;
    return 0;
}

static int file_length(const char *path, int fd, size_t *out)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return pagoda_error_set(pagoda_from_errno(errno), "%s: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return pagoda_error_set(PAGODA_EFORMAT, "group file %s is not a regular file", path);
    /* The file carries the group's steps and collectives: another user who may write it could
     * feed the ranks anything. */
    if (st.st_uid != geteuid())
        return pagoda_error_set(PAGODA_EPERM,
                                "group file %s is owned by uid %u, not by this process's (%u)",
                                path, (unsigned)st.st_uid, (unsigned)geteuid());
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0)
        return pagoda_error_set(PAGODA_EPERM,
                                "group file %s is writable by other users (mode %04o; the "
                                "supervisor makes it 0600)",
                                path, (unsigned)(st.st_mode & 07777));
    *out = (size_t)st.st_size;
    return 0;
}

/* Checks the header of a file of at least HEADER_BYTES. */
static int check_header(const char *path, const struct header *h, int size)
{
    if (h->magic != FILE_MAGIC)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "%s is not a tensor-parallel group file (bad magic): the "
                                "supervisor makes one for each start of the group",
                                path);
    if (h->version != COMM_FILE_VERSION)
        return pagoda_error_set(PAGODA_EFORMAT,
                                "group file %s has version %u; this build reads version %d", path,
                                h->version, COMM_FILE_VERSION);
    if (h->size != size)
        return pagoda_error_set(PAGODA_EMISMATCH,
                                "group file %s was made for %d ranks; this rank was told %d", path,
                                h->size, size);
    return 0;
}

/* Maps the whole file of total bytes in place of the header's mapping. */
static int remap_whole(struct comm_file *f, int fd, size_t total)
{
    struct header *whole = NULL;
    int rc = map_file(f->path, fd, total, &whole);
    if (rc != 0)
        return rc;
    munmap(f->h, f->mapped);
    f->h = whole;
    f->mapped = total;
    return 0;
}

/* Rank 0: claims and makes the region, remapping the whole file. */
static int make_region(struct comm_file *f, int fd, int timeout_ms)
{
    int32_t fresh = STATE_FRESH;
    if (!atomic_compare_exchange_strong(&f->h->state, &fresh, STATE_MAKING))
        return pagoda_error_set(PAGODA_EEXIST,
                                "group file %s is stale: its comm region was made already (by "
                                "pid %d) for an earlier start of the group; a group needs a "
                                "fresh file for every start (the supervisor makes one)",
                                f->path, f->h->maker_pid);
    f->h->maker_pid = (int32_t)getpid();
    size_t total = HEADER_BYTES + comm_cpu_shared_bytes(f->size);
    if (ftruncate(fd, (off_t)total) != 0)
        return pagoda_error_set(pagoda_from_errno(errno), "cannot extend group file %s: %s",
                                f->path, strerror(errno));
    int rc = remap_whole(f, fd, total);
    if (rc != 0)
        return rc;
    if ((rc = comm_cpu_shared_init((char *)f->h + HEADER_BYTES, f->size, timeout_ms)) != 0)
        return rc;
    atomic_store(&f->h->state, STATE_READY);
    return 0;
}

/* Another rank: waits for rank 0's region, then remaps the whole file. */
static int await_region(struct comm_file *f, int fd, int (*keep_waiting)(void *ctx), void *ctx)
{
    while (atomic_load(&f->h->state) != STATE_READY) {
        if (keep_waiting != NULL && !keep_waiting(ctx))
            return pagoda_error_set(PAGODA_ECLOSED, "stopped waiting for rank 0 to make %s",
                                    f->path);
        int maker = atomic_load(&f->h->places[0].pid);
        if (!pid_alive(maker))
            return pagoda_error_set(PAGODA_ECLOSED,
                                    "rank 0 (pid %d) exited before it made the group in %s", maker,
                                    f->path);
        sleep_poll();
    }
    size_t total = HEADER_BYTES + comm_cpu_shared_bytes(f->size), have = 0;
    int rc = file_length(f->path, fd, &have);
    if (rc != 0)
        return rc;
    if (have < total)
        return pagoda_error_set(PAGODA_EFORMAT, "group file %s holds %zu bytes, %zu expected",
                                f->path, have, total);
    return remap_whole(f, fd, total);
}

int comm_file_open(const char *path, int rank, int size, int timeout_ms,
                   int (*keep_waiting)(void *ctx), void *ctx, struct comm_file **out)
{
    if (size < 1 || size > COMM_MAX_RANKS || rank < 0 || rank >= size || timeout_ms <= 0)
        return pagoda_error_set(PAGODA_EINVAL, "group file %s: rank %d of %d", path, rank, size);
    struct comm_file *f = calloc(1, sizeof(*f));
    if (f == NULL)
        return pagoda_error_set(PAGODA_ENOMEM, "out of memory");
    if (snprintf(f->path, sizeof(f->path), "%s", path) >= (int)sizeof(f->path)) {
        free(f);
        return pagoda_error_set(PAGODA_ERANGE, "group file %s: path too long", path);
    }
    f->rank = rank;
    f->size = size;
    int rc = 0;
    size_t have = 0;
    int fd = open(path, O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        rc = pagoda_error_set(pagoda_from_errno(errno), "cannot open group file %s: %s", path,
                              strerror(errno));
        goto fail;
    }
    if ((rc = file_length(path, fd, &have)) != 0)
        goto fail;
    if (have < HEADER_BYTES) {
        rc = pagoda_error_set(PAGODA_EFORMAT,
                              "%s holds %zu bytes: not a tensor-parallel group file (%zu bytes "
                              "at least)",
                              path, have, HEADER_BYTES);
        goto fail;
    }
    if ((rc = map_file(path, fd, HEADER_BYTES, &f->h)) != 0)
        goto fail;
    f->mapped = HEADER_BYTES;
    if ((rc = check_header(path, f->h, size)) != 0)
        goto fail;
    int32_t none = 0;
    if (!atomic_compare_exchange_strong(&f->h->places[rank].pid, &none, (int32_t)getpid())) {
        rc = pagoda_error_set(PAGODA_EEXIST,
                              "group file %s is stale: rank %d's place was claimed already (by "
                              "pid %d) for an earlier start of the group; a group needs a fresh "
                              "file for every start (the supervisor makes one)",
                              path, rank, none);
        goto fail;
    }
    rc = rank == 0 ? make_region(f, fd, timeout_ms) : await_region(f, fd, keep_waiting, ctx);
    if (rc != 0)
        goto fail;
    if ((rc = comm_cpu_open((char *)f->h + HEADER_BYTES, rank, &f->comm)) != 0)
        goto fail;
    close(fd);
    *out = f;
    return 0;
fail:
    if (fd >= 0)
        close(fd);
    if (f->h != NULL)
        munmap(f->h, f->mapped);
    free(f);
    return rc;
}

struct comm *comm_file_comm(struct comm_file *f)
{
    return f->comm;
}

int comm_file_pid(const struct comm_file *f, int rank)
{
    if (rank < 0 || rank >= f->size)
        return 0;
    return atomic_load(&f->h->places[rank].pid);
}

int comm_file_alive(const struct comm_file *f, int rank)
{
    return pid_alive(comm_file_pid(f, rank));
}

int comm_file_publish(struct comm_file *f, int phase, const void *payload, size_t len)
{
    struct place *p = &f->h->places[f->rank];
    if (len > COMM_FILE_PAYLOAD_BYTES || phase <= atomic_load(&p->phase))
        return pagoda_error_set(PAGODA_EINVAL, "group file %s: phase %d, %zu bytes", f->path, phase,
                                len);
    if (payload != NULL)
        memcpy(p->payload, payload, len);
    atomic_store(&p->phase, phase); /* after the payload (sequentially consistent) */
    return 0;
}

int comm_file_wait(struct comm_file *f, int rank, int phase, void *out, size_t len,
                   int (*keep_waiting)(void *ctx), void *ctx)
{
    if (rank < 0 || rank >= f->size || len > COMM_FILE_PAYLOAD_BYTES)
        return pagoda_error_set(PAGODA_EINVAL, "group file %s: rank %d, %zu bytes", f->path, rank,
                                len);
    struct place *p = &f->h->places[rank];
    while (atomic_load(&p->phase) < phase) {
        if (keep_waiting != NULL && !keep_waiting(ctx))
            return pagoda_error_set(PAGODA_ECLOSED, "stopped waiting for rank %d in %s", rank,
                                    f->path);
        int pid = atomic_load(&p->pid);
        if (!pid_alive(pid))
            return pagoda_error_set(PAGODA_ECLOSED, "rank %d (pid %d) of the group in %s exited",
                                    rank, pid, f->path);
        sleep_poll();
    }
    if (out != NULL)
        memcpy(out, p->payload, len);
    return 0;
}

void comm_file_close(struct comm_file *f)
{
    if (f == NULL)
        return;
    comm_close(f->comm);
    munmap(f->h, f->mapped);
    free(f);
}
