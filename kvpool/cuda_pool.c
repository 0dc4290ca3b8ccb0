#include "kvpool/cuda_pool.h"
#include "common/error.h"
#include "common/fd_pass.h"
#include "common/log.h"

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define KV_CUDA_MAGIC UINT32_C(0x44464750)         /* "PGFD" in memory order */
#define KV_CUDA_DEPOSIT_MAGIC UINT32_C(0x504b4750) /* "PGKP" in memory order */
#define KV_CUDA_PROTOCOL_VERSION 1u
#define KV_CUDA_MESSAGE_BYTES 192
/* Connections waiting to be accepted: workers ask once each at start. */
#define KV_CUDA_BACKLOG 16
/* How often an importer tries to connect while the socket is not there yet. */
#define KV_CUDA_RETRY_MS 50

/* The wire format of the socket protocol (see cuda_pool.h). */
struct kv_cuda_request {
    uint32_t magic;
    uint32_t version;
    int64_t worker_id; /* -1: not a worker */
    uint64_t pool_id;  /* the pool the importer expects; 0: any */
};

struct kv_cuda_reply {
    uint32_t magic;
    uint32_t version;
    int32_t error_code; /* 0, or a PAGODA_E* code with message; then no descriptors */
    uint32_t num_chunks;
    uint64_t pool_id;
    uint64_t data_bytes;   /* kv_pool_bytes(geometry) */
    uint64_t chunk_bytes;  /* every chunk but the last has this size */
    uint64_t mapped_bytes; /* all chunks; the last has mapped - (num_chunks - 1) * chunk bytes */
    uint8_t uuid[16];      /* the device's UUID */
    int32_t device;        /* the exporter's ordinal (for logs) */
    int32_t reserved;
    char message[KV_CUDA_MESSAGE_BYTES];
};

struct kv_cuda_pool {
    struct kv_geometry geometry;
    int device; /* ordinal in this process */
    CUdevice cu_device;
    uint8_t uuid[16];
    int exported; /* created here (1) or imported (0) */
    int num_chunks;
    uint64_t data_bytes, chunk_bytes, mapped_bytes;
    CUdeviceptr base;
    int reserved;      /* the address range is reserved */
    int mapped_chunks; /* chunks mapped from base on */
    int access_set;
    CUmemGenericAllocationHandle handles[KV_CUDA_MAX_CHUNKS];
    int num_handles;
    int fds[KV_CUDA_MAX_CHUNKS]; /* export side: one exported descriptor per chunk */
    int num_fds;
};

struct kv_cuda_server {
    struct kv_cuda_pool *pool;
    char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
    int listen_fd;
    int wake[2]; /* a byte written to wake[1] stops the thread */
    pthread_t thread;
    int thread_started;
    atomic_uint_fast64_t handouts, refusals;
};

/* ---- the driver API, looked up through the runtime ---------------------------------------- */

/* The prototypes come from cuda.h, after its version macros (cuDeviceGetUuid is
 * cuDeviceGetUuid_v2 there), and the lookup asks for the version this file was compiled
 * against, so each pointer has the ABI its prototype says. */
#define DRV_FUNCS(X)                                                                               \
    X(cuGetErrorString)                                                                            \
    X(cuGetErrorName)                                                                              \
    X(cuDeviceGet)                                                                                 \
    X(cuDeviceGetUuid)                                                                             \
    X(cuDeviceGetAttribute)                                                                        \
    X(cuMemGetAllocationGranularity)                                                               \
    X(cuMemCreate)                                                                                 \
    X(cuMemRelease)                                                                                \
    X(cuMemExportToShareableHandle)                                                                \
    X(cuMemImportFromShareableHandle)                                                              \
    X(cuMemAddressReserve)                                                                         \
    X(cuMemAddressFree)                                                                            \
    X(cuMemMap)                                                                                    \
    X(cuMemUnmap)                                                                                  \
    X(cuMemSetAccess)

#define DRV_FIELD(name) __typeof__(&name) name;
static struct {
    DRV_FUNCS(DRV_FIELD)
} drv;
#undef DRV_FIELD

static pthread_once_t drv_once = PTHREAD_ONCE_INIT;
static int drv_status;       /* 0 or the PAGODA_E* code of the failed lookup */
static char drv_detail[256]; /* the lookup's failure, reported by every caller */

static void drv_load_once(void)
{
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count == 0) {
        snprintf(drv_detail, sizeof(drv_detail), "no CUDA device here (cudaGetDeviceCount: %s)",
                 e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
        drv_status = PAGODA_ECUDA;
        return;
    }
    enum cudaDriverEntryPointQueryResult q;
#define DRV_LOOKUP(name)                                                                           \
    e = cudaGetDriverEntryPointByVersion(#name, (void **)&drv.name, CUDA_VERSION,                  \
                                         cudaEnableDefault, &q);                                   \
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || drv.name == NULL) {                \
        snprintf(drv_detail, sizeof(drv_detail),                                                   \
                 "the CUDA driver has no %s for CUDA %d (%s, query result %d): driver too old?",   \
                 #name, CUDA_VERSION, cudaGetErrorString(e), (int)q);                              \
        drv_status = PAGODA_ECUDA;                                                                 \
        return;                                                                                    \
    }
    DRV_FUNCS(DRV_LOOKUP)
#undef DRV_LOOKUP
}

static int drv_load(void)
{
    pthread_once(&drv_once, drv_load_once);
    return drv_status == 0 ? 0 : pagoda_error_set(drv_status, "%s", drv_detail);
}

/* Reports a failed driver call: "cuMemCreate (2048 MiB on GPU 0): CUDA_ERROR_OUT_OF_MEMORY:
 * out of memory". Out of memory is PAGODA_EEXHAUSTED, anything else PAGODA_ECUDA. */
static int cu_fail(CUresult r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int cu_fail(CUresult r, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof(what), fmt, ap);
    va_end(ap);
    const char *name = NULL, *text = NULL;
    if (drv.cuGetErrorName == NULL || drv.cuGetErrorName(r, &name) != CUDA_SUCCESS)
        name = NULL;
    if (drv.cuGetErrorString == NULL || drv.cuGetErrorString(r, &text) != CUDA_SUCCESS)
        text = NULL;
    return pagoda_error_set(r == CUDA_ERROR_OUT_OF_MEMORY ? PAGODA_EEXHAUSTED : PAGODA_ECUDA,
                            "%s: %s: %s (CUresult %d)", what, name ? name : "?",
                            text ? text : "unknown error", (int)r);
}

static int rt_fail(cudaError_t e, const char *what, int device)
{
    return pagoda_error_set(e == cudaErrorMemoryAllocation ? PAGODA_EEXHAUSTED : PAGODA_ECUDA,
                            "%s (GPU %d): %s: %s", what, device, cudaGetErrorName(e),
                            cudaGetErrorString(e));
}

/* Makes device's primary context current on this thread (the one the runtime uses, so that
 * the pool's address is valid for kernels launched through the runtime too). */
static int device_enter(int device)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return rt_fail(e, "cudaSetDevice", device);
    if ((e = cudaFree(NULL)) != cudaSuccess) /* creates the primary context */
        return rt_fail(e, "creating the CUDA context", device);
    return 0;
}

static uint64_t round_up(uint64_t v, uint64_t to)
{
    return (v + to - 1) / to * to;
}

static double mib(uint64_t bytes)
{
    return (double)bytes / (1024.0 * 1024.0);
}

static void uuid_text(const uint8_t *u, char *buf, size_t len)
{
    snprintf(buf, len, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
             u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13],
             u[14], u[15]);
}

int kv_cuda_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess)
        return 0;
    return n;
}

int kv_cuda_mem_info(int device, uint64_t *free_bytes, uint64_t *total_bytes)
{
    int rc = drv_load();
    if (rc != 0 || (rc = device_enter(device)) != 0)
        return rc;
    size_t f = 0, t = 0;
    cudaError_t e = cudaMemGetInfo(&f, &t);
    if (e != cudaSuccess)
        return rt_fail(e, "cudaMemGetInfo", device);
    *free_bytes = f;
    *total_bytes = t;
    return 0;
}

/* ---- the pool: shared by both sides -------------------------------------------------------- */

static CUmemAllocationProp pool_prop(CUdevice dev)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof(prop));
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = (int)dev;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
}

static int pool_granularity(const struct kv_cuda_pool *p, uint64_t *gran)
{
    CUmemAllocationProp prop = pool_prop(p->cu_device);
    size_t g = 0;
    CUresult r = drv.cuMemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
    if (r != CUDA_SUCCESS)
        return cu_fail(r, "cuMemGetAllocationGranularity (GPU %d)", p->device);
    if (g == 0)
        return pagoda_error_set(PAGODA_ECUDA, "GPU %d reports an allocation granularity of 0",
                                p->device);
    *gran = g;
    return 0;
}

/* Chunk i's offset in the pool and its size: chunk_bytes, except for the last chunk, which holds
 * the rest (so that the pool is its data rounded up to one granule, not to one chunk). */
static uint64_t chunk_offset(const struct kv_cuda_pool *p, int i)
{
    return (uint64_t)i * p->chunk_bytes;
}

static uint64_t chunk_size(const struct kv_cuda_pool *p, int i)
{
    return i < p->num_chunks - 1 ? p->chunk_bytes : p->mapped_bytes - chunk_offset(p, i);
}

static struct kv_cuda_pool *pool_alloc(void)
{
    struct kv_cuda_pool *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    for (int i = 0; i < KV_CUDA_MAX_CHUNKS; i++)
        p->fds[i] = -1;
    return p;
}

/* Reserves one address range for every chunk, maps each handle in order and grants the
 * device read and write access to the whole range. */
static int pool_map(struct kv_cuda_pool *p, uint64_t gran)
{
    CUresult r = drv.cuMemAddressReserve(&p->base, p->mapped_bytes, gran, 0, 0);
    if (r != CUDA_SUCCESS)
        return cu_fail(r, "cuMemAddressReserve (%.0f MiB, alignment %llu, GPU %d)",
                       mib(p->mapped_bytes), (unsigned long long)gran, p->device);
    p->reserved = 1;
    for (int i = 0; i < p->num_chunks; i++) {
        r = drv.cuMemMap(p->base + (CUdeviceptr)chunk_offset(p, i), chunk_size(p, i), 0,
                         p->handles[i], 0);
        if (r != CUDA_SUCCESS)
            return cu_fail(r, "cuMemMap (chunk %d of %d, %.0f MiB, GPU %d)", i + 1, p->num_chunks,
                           mib(chunk_size(p, i)), p->device);
        p->mapped_chunks++;
    }
    CUmemAccessDesc access;
    memset(&access, 0, sizeof(access));
    access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access.location.id = (int)p->cu_device;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    r = drv.cuMemSetAccess(p->base, p->mapped_bytes, &access, 1);
    if (r != CUDA_SUCCESS)
        return cu_fail(r, "cuMemSetAccess (%.0f MiB, GPU %d)", mib(p->mapped_bytes), p->device);
    p->access_set = 1;
    return 0;
}

void kv_cuda_pool_close(struct kv_cuda_pool *p)
{
    if (p == NULL)
        return;
    if (p->num_handles > 0 || p->reserved) {
        /* Nothing may still run on the pool; the primary context stays (the runtime's). */
        if (cudaSetDevice(p->device) == cudaSuccess)
            cudaDeviceSynchronize();
    }
    CUresult r;
    for (int i = p->mapped_chunks - 1; i >= 0; i--) {
        r = drv.cuMemUnmap(p->base + (CUdeviceptr)chunk_offset(p, i), chunk_size(p, i));
        if (r != CUDA_SUCCESS) {
            cu_fail(r, "cuMemUnmap (chunk %d, GPU %d)", i + 1, p->device);
            log_warn("%s", pagoda_error_detail());
        }
    }
    if (p->reserved && (r = drv.cuMemAddressFree(p->base, p->mapped_bytes)) != CUDA_SUCCESS) {
        cu_fail(r, "cuMemAddressFree (GPU %d)", p->device);
        log_warn("%s", pagoda_error_detail());
    }
    for (int i = 0; i < p->num_handles; i++) {
        if ((r = drv.cuMemRelease(p->handles[i])) != CUDA_SUCCESS) {
            cu_fail(r, "cuMemRelease (chunk %d, GPU %d)", i + 1, p->device);
            log_warn("%s", pagoda_error_detail());
        }
    }
    for (int i = 0; i < KV_CUDA_MAX_CHUNKS; i++)
        if (p->fds[i] >= 0)
            close(p->fds[i]);
    free(p);
}

const struct kv_geometry *kv_cuda_pool_geometry(const struct kv_cuda_pool *p)
{
    return &p->geometry;
}

void *kv_cuda_pool_data(const struct kv_cuda_pool *p)
{
    return (void *)(uintptr_t)p->base;
}

int kv_cuda_pool_device(const struct kv_cuda_pool *p)
{
    return p->device;
}

const uint8_t *kv_cuda_pool_uuid(const struct kv_cuda_pool *p)
{
    return p->uuid;
}

uint64_t kv_cuda_pool_mapped_bytes(const struct kv_cuda_pool *p)
{
    return p->mapped_bytes;
}

int kv_cuda_pool_num_chunks(const struct kv_cuda_pool *p)
{
    return p->num_chunks;
}

int kv_cuda_pool_layer_view(const struct kv_cuda_pool *p, int32_t layer, struct kv_layer_view *out)
{
    if (layer < 0 || layer >= p->geometry.num_layers)
        return pagoda_error_set(PAGODA_ERANGE, "layer %d outside 0..%d", layer,
                                p->geometry.num_layers - 1);
    *out = kv_layer_view_make(&p->geometry, kv_cuda_pool_data(p), layer);
    return 0;
}

/* ---- export side -------------------------------------------------------------------------- */

int kv_cuda_pool_create(const struct kv_geometry *g, const struct kv_cuda_pool_options *opt,
                        struct kv_cuda_pool **out)
{
    if (g == NULL || opt == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "kv_cuda_pool_create: NULL argument");
    int rc = kv_geometry_validate(g);
    if (rc != 0 || (rc = drv_load()) != 0 || (rc = device_enter(opt->device)) != 0)
        return rc;
    struct kv_cuda_pool *p = pool_alloc();
    if (p == NULL)
        return PAGODA_ENOMEM;
    p->geometry = *g;
    p->device = opt->device;
    p->exported = 1;
    p->data_bytes = kv_pool_bytes(g);

    CUresult r = drv.cuDeviceGet(&p->cu_device, opt->device);
    if (r != CUDA_SUCCESS) {
        rc = cu_fail(r, "cuDeviceGet (%d)", opt->device);
        goto fail;
    }
    CUuuid uuid;
    if ((r = drv.cuDeviceGetUuid(&uuid, p->cu_device)) != CUDA_SUCCESS) {
        rc = cu_fail(r, "cuDeviceGetUuid (GPU %d)", opt->device);
        goto fail;
    }
    memcpy(p->uuid, uuid.bytes, sizeof(p->uuid));
    int vmm = 0, posix_fd = 0;
    if ((r = drv.cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                      p->cu_device)) != CUDA_SUCCESS ||
        (r = drv.cuDeviceGetAttribute(
             &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
             p->cu_device)) != CUDA_SUCCESS) {
        rc = cu_fail(r, "cuDeviceGetAttribute (GPU %d)", opt->device);
        goto fail;
    }
    if (!vmm || !posix_fd) {
        rc = pagoda_error_set(PAGODA_EUNSUPPORTED,
                              "GPU %d does not support %s: the KV pool cannot be shared",
                              opt->device,
                              !vmm ? "virtual memory management (cuMemCreate)"
                                   : "POSIX file descriptor handles for cuMemCreate");
        goto fail;
    }

    /* Chunks of at most max_chunk_bytes, whole granules, no more than KV_CUDA_MAX_CHUNKS; the
     * last one holds the rest, so the pool is its data rounded up to one granule. */
    uint64_t gran;
    if ((rc = pool_granularity(p, &gran)) != 0)
        goto fail;
    uint64_t max_chunk = opt->max_chunk_bytes ? opt->max_chunk_bytes : KV_CUDA_CHUNK_BYTES_DEFAULT;
    max_chunk = round_up(max_chunk, gran);
    uint64_t mapped = round_up(p->data_bytes, gran);
    uint64_t chunk = mapped < max_chunk ? mapped : max_chunk;
    uint64_t n = (mapped + chunk - 1) / chunk;
    if (n > KV_CUDA_MAX_CHUNKS) {
        chunk = round_up((mapped + KV_CUDA_MAX_CHUNKS - 1) / KV_CUDA_MAX_CHUNKS, gran);
        n = (mapped + chunk - 1) / chunk;
    }
    p->chunk_bytes = chunk;
    p->num_chunks = (int)n;
    p->mapped_bytes = mapped;

    size_t free_bytes = 0, total_bytes = 0;
    cudaError_t e = cudaMemGetInfo(&free_bytes, &total_bytes);
    if (e != cudaSuccess) {
        rc = rt_fail(e, "cudaMemGetInfo", opt->device);
        goto fail;
    }
    if (p->mapped_bytes > free_bytes) {
        rc = pagoda_error_set(PAGODA_EEXHAUSTED,
                              "the KV pool needs %.0f MiB on GPU %d, %.0f MiB of %.0f MiB are "
                              "free: short by %.0f MiB",
                              mib(p->mapped_bytes), opt->device, mib(free_bytes), mib(total_bytes),
                              mib(p->mapped_bytes - free_bytes));
        goto fail;
    }

    CUmemAllocationProp prop = pool_prop(p->cu_device);
    for (int i = 0; i < p->num_chunks; i++) {
        if ((r = drv.cuMemCreate(&p->handles[i], chunk_size(p, i), &prop, 0)) != CUDA_SUCCESS) {
            rc = cu_fail(r, "cuMemCreate (chunk %d of %d, %.0f MiB, GPU %d)", i + 1, p->num_chunks,
                         mib(chunk_size(p, i)), opt->device);
            goto fail;
        }
        p->num_handles++;
        int fd = -1;
        r = drv.cuMemExportToShareableHandle(&fd, p->handles[i],
                                             CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        if (r != CUDA_SUCCESS) {
            rc = cu_fail(r, "cuMemExportToShareableHandle (chunk %d, GPU %d)", i + 1, opt->device);
            goto fail;
        }
        /* The descriptor stays in this process only: children must not inherit it. */
        fcntl(fd, F_SETFD, FD_CLOEXEC);
        p->fds[i] = fd;
        p->num_fds++;
    }
    if ((rc = pool_map(p, gran)) != 0)
        goto fail;
    /* Zeroed once, so that no worker ever reads what an earlier user of the memory left. */
    if ((e = cudaMemset(kv_cuda_pool_data(p), 0, p->mapped_bytes)) != cudaSuccess ||
        (e = cudaDeviceSynchronize()) != cudaSuccess) {
        rc = rt_fail(e, "zeroing the KV pool", opt->device);
        goto fail;
    }
    *out = p;
    return 0;
fail:
    kv_cuda_pool_close(p);
    return rc;
}

/* ---- import side -------------------------------------------------------------------------- */

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int set_io_timeouts(int fd, int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0)
        return pagoda_error_set(PAGODA_EIO, "setsockopt (timeouts): %s", strerror(errno));
    return 0;
}

static int make_addr(const char *path, struct sockaddr_un *addr)
{
    memset(addr, 0, sizeof(*addr));
    addr->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof(addr->sun_path))
        return pagoda_error_set(PAGODA_EINVAL, "socket path %s is longer than %zu bytes", path,
                                sizeof(addr->sun_path) - 1);
    memcpy(addr->sun_path, path, strlen(path) + 1);
    return 0;
}

/* Connects to the server, retrying while its socket is missing or refuses, up to wait_ms. */
static int connect_server(const char *path, int wait_ms, int *out)
{
    struct sockaddr_un addr;
    int rc = make_addr(path, &addr);
    if (rc != 0)
        return rc;
    int64_t deadline = now_ms() + wait_ms;
    for (;;) {
        int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return pagoda_error_set(PAGODA_EIO, "socket (AF_UNIX): %s", strerror(errno));
        if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0) {
            *out = fd;
            return 0;
        }
        int err = errno;
        close(fd);
        if (err != ENOENT && err != ECONNREFUSED && err != EAGAIN)
            return pagoda_error_set(PAGODA_EIO, "connecting to kvpool at %s: %s", path,
                                    strerror(err));
        if (now_ms() >= deadline)
            return pagoda_error_set(PAGODA_ETIMEDOUT, "no kvpool answered at %s within %d ms (%s)",
                                    path, wait_ms, strerror(err));
        sleep_ms(KV_CUDA_RETRY_MS);
    }
}

/* Sends the request and receives the reply with its descriptors (at most KV_CUDA_MAX_CHUNKS;
 * *num_fds of them, owned by the caller, also on error). */
static int exchange(int fd, const struct kv_cuda_request *req, struct kv_cuda_reply *reply,
                    int *fds, int *num_fds)
{
    *num_fds = 0;
    memset(reply, 0, sizeof(*reply));
    size_t n = 0;
    int rc = fd_pass_send(fd, req, sizeof(*req), NULL, 0, 0, "the request to kvpool");
    if (rc != 0 || (rc = fd_pass_recv(fd, reply, sizeof(*reply), &n, fds, KV_CUDA_MAX_CHUNKS,
                                      num_fds, 0, "kvpool's answer")) != 0)
        return rc == PAGODA_ECLOSED
                   ? pagoda_error_set(rc, "kvpool closed the connection without answering")
                   : rc;
    if (n != sizeof(*reply))
        return pagoda_error_set(PAGODA_EPROTO, "kvpool's answer has %zu bytes (expected %zu)", n,
                                sizeof(*reply));
    if (reply->magic != KV_CUDA_MAGIC || reply->version != KV_CUDA_PROTOCOL_VERSION)
        return pagoda_error_set(PAGODA_EPROTO,
                                "kvpool's answer has magic %08x version %u (expected %08x "
                                "version %u)",
                                reply->magic, reply->version, KV_CUDA_MAGIC,
                                KV_CUDA_PROTOCOL_VERSION);
    reply->message[KV_CUDA_MESSAGE_BYTES - 1] = '\0';
    return 0;
}

/* The ordinal of the device with this UUID in this process. */
static int find_device(const uint8_t *uuid, int *device)
{
    int count = kv_cuda_device_count();
    char want[48];
    uuid_text(uuid, want, sizeof(want));
    for (int i = 0; i < count; i++) {
        CUdevice dev;
        CUuuid u;
        CUresult r = drv.cuDeviceGet(&dev, i);
        if (r != CUDA_SUCCESS)
            return cu_fail(r, "cuDeviceGet (%d)", i);
        if ((r = drv.cuDeviceGetUuid(&u, dev)) != CUDA_SUCCESS)
            return cu_fail(r, "cuDeviceGetUuid (GPU %d)", i);
        if (memcmp(u.bytes, uuid, 16) == 0) {
            *device = i;
            return 0;
        }
    }
    return pagoda_error_set(PAGODA_ENOENT,
                            "the KV pool is on %s, which is not among the %d CUDA device(s) this "
                            "process sees (check CUDA_VISIBLE_DEVICES)",
                            want, count);
}

/* The answer a worker gets: the pool's identity, layout and device (the server's, and inside a
 * deposit). */
static void fill_reply(const struct kv_cuda_pool *p, struct kv_cuda_reply *r)
{
    memset(r, 0, sizeof(*r));
    r->magic = KV_CUDA_MAGIC;
    r->version = KV_CUDA_PROTOCOL_VERSION;
    r->num_chunks = (uint32_t)p->num_chunks;
    r->pool_id = p->geometry.pool_id;
    r->data_bytes = p->data_bytes;
    r->chunk_bytes = p->chunk_bytes;
    r->mapped_bytes = p->mapped_bytes;
    memcpy(r->uuid, p->uuid, sizeof(r->uuid));
    r->device = p->device;
}

/* A pool's layout as a peer describes it (r: kvpool's answer, or a deposit's): num_chunks chunks,
 * all but the last of chunk_bytes, the last of 1 to chunk_bytes, holding data_bytes of KV, one
 * descriptor each. */
static int check_layout(const char *who, const struct kv_cuda_reply *r, uint64_t data_bytes,
                        int num_fds)
{
    if (r->num_chunks < 1 || r->num_chunks > KV_CUDA_MAX_CHUNKS || r->chunk_bytes == 0 ||
        r->chunk_bytes > UINT64_MAX / r->num_chunks || r->mapped_bytes < data_bytes ||
        r->mapped_bytes <= r->chunk_bytes * (r->num_chunks - 1) ||
        r->mapped_bytes > r->chunk_bytes * r->num_chunks || (int)r->num_chunks != num_fds)
        return pagoda_error_set(PAGODA_EPROTO,
                                "%s: %u chunks of %llu bytes, %llu bytes in all, with %d "
                                "descriptors for %llu bytes of KV data",
                                who, r->num_chunks, (unsigned long long)r->chunk_bytes,
                                (unsigned long long)r->mapped_bytes, num_fds,
                                (unsigned long long)data_bytes);
    return 0;
}

/* A new pool of geometry g laid out as r says (checked with check_layout), on the device with
 * r's UUID; NULL when out of memory (PAGODA_ENOMEM in *rc) or the device is not here. */
static struct kv_cuda_pool *pool_described(const struct kv_geometry *g,
                                           const struct kv_cuda_reply *r, int *rc)
{
    struct kv_cuda_pool *p = pool_alloc();
    if (p == NULL) {
        *rc = PAGODA_ENOMEM;
        return NULL;
    }
    p->geometry = *g;
    p->data_bytes = r->data_bytes;
    p->chunk_bytes = r->chunk_bytes;
    p->num_chunks = (int)r->num_chunks;
    p->mapped_bytes = r->mapped_bytes;
    memcpy(p->uuid, r->uuid, sizeof(p->uuid));
    if ((*rc = find_device(r->uuid, &p->device)) != 0) {
        kv_cuda_pool_close(p);
        return NULL;
    }
    return p;
}

/* Imports the chunks' descriptors (p's layout, uuid and device set; the descriptors stay the
 * caller's) and maps them: the import side's, and an adopting kvpool's, way to the memory. */
static int pool_import_chunks(struct kv_cuda_pool *p, const int *fds, const char *whose)
{
    int rc = device_enter(p->device);
    if (rc != 0)
        return rc;
    CUresult r;
    uint64_t gran;
    if ((r = drv.cuDeviceGet(&p->cu_device, p->device)) != CUDA_SUCCESS)
        return cu_fail(r, "cuDeviceGet (%d)", p->device);
    if ((rc = pool_granularity(p, &gran)) != 0)
        return rc;
    if (p->chunk_bytes % gran != 0 || p->mapped_bytes % gran != 0)
        return pagoda_error_set(PAGODA_EPROTO,
                                "%s chunks of %llu bytes (%llu in all) are not whole granules "
                                "of %llu",
                                whose, (unsigned long long)p->chunk_bytes,
                                (unsigned long long)p->mapped_bytes, (unsigned long long)gran);
    for (int i = 0; i < p->num_chunks; i++) {
        r = drv.cuMemImportFromShareableHandle(&p->handles[i], (void *)(uintptr_t)fds[i],
                                               CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
        if (r != CUDA_SUCCESS)
            return cu_fail(r, "cuMemImportFromShareableHandle (chunk %d of %d, GPU %d)", i + 1,
                           p->num_chunks, p->device);
        p->num_handles++;
    }
    return pool_map(p, gran);
}

int kv_cuda_pool_import(const char *socket_path, int64_t worker_id,
                        const struct kv_geometry *expected, int wait_ms, struct kv_cuda_pool **out)
{
    if (socket_path == NULL || expected == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "kv_cuda_pool_import: NULL argument");
    int rc = kv_geometry_validate(expected);
    if (rc != 0 || (rc = drv_load()) != 0)
        return rc;
    int sock = -1, fds[KV_CUDA_MAX_CHUNKS], num_fds = 0;
    struct kv_cuda_pool *p = NULL;
    struct kv_cuda_reply reply;
    struct kv_cuda_request req = {
        .magic = KV_CUDA_MAGIC,
        .version = KV_CUDA_PROTOCOL_VERSION,
        .worker_id = worker_id,
        .pool_id = expected->pool_id,
    };
    if ((rc = connect_server(socket_path, wait_ms, &sock)) != 0 ||
        (rc = set_io_timeouts(sock, KV_CUDA_IO_TIMEOUT_MS)) != 0 ||
        (rc = exchange(sock, &req, &reply, fds, &num_fds)) != 0)
        goto out;
    if (reply.error_code != 0) {
        rc = pagoda_error_set(reply.error_code < 0 ? reply.error_code : PAGODA_EPROTO,
                              "kvpool refused the pool's descriptors: %s", reply.message);
        goto out;
    }
    uint64_t data_bytes = kv_pool_bytes(expected);
    if (reply.pool_id != expected->pool_id || reply.data_bytes != data_bytes) {
        rc = pagoda_error_set(
            PAGODA_EMISMATCH,
            "kvpool at %s hands out pool %016llx of %llu bytes; expected pool "
            "%016llx of %llu bytes",
            socket_path, (unsigned long long)reply.pool_id, (unsigned long long)reply.data_bytes,
            (unsigned long long)expected->pool_id, (unsigned long long)data_bytes);
        goto out;
    }
    if ((rc = check_layout("kvpool's answer", &reply, data_bytes, num_fds)) != 0 ||
        (p = pool_described(expected, &reply, &rc)) == NULL ||
        (rc = pool_import_chunks(p, fds, "kvpool's")) != 0)
        goto out;
    char text[48];
    uuid_text(p->uuid, text, sizeof(text));
    log_info("mapped the KV pool %016llx from %s: %.1f MiB in %d chunk(s) on GPU %d (%s; GPU %d "
             "in kvpool)",
             (unsigned long long)expected->pool_id, socket_path, mib(p->mapped_bytes),
             p->num_chunks, p->device, text, reply.device);
    *out = p;
    p = NULL;
out:
    /* The imported handles hold the memory; the descriptors are not needed any more. */
    for (int i = 0; i < num_fds; i++)
        close(fds[i]);
    if (sock >= 0)
        close(sock);
    kv_cuda_pool_close(p);
    return rc;
}

/* ---- kept across kvpool's restarts --------------------------------------------------------- */

/* What kvpool deposits with its keeper beside the chunks' descriptors: the answer a worker gets
 * (the pool's identity, layout and device) and the geometry. Opaque to the keeper
 * (deploy/keeper.h), read back only here. */
struct kv_cuda_deposit {
    uint32_t magic;
    uint32_t version;
    struct kv_cuda_reply pool;
    int32_t num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype;
};

struct kv_cuda_offer {
    struct kv_cuda_deposit d;
    struct kv_geometry geometry; /* d's, as a geometry */
    int fds[KV_CUDA_MAX_CHUNKS];
    int num_fds;
};

int kv_cuda_pool_deposit(const struct kv_cuda_pool *p, int sock)
{
    if (p == NULL || !p->exported)
        return pagoda_error_set(PAGODA_EINVAL, "kv_cuda_pool_deposit: needs kvpool's own pool");
    struct kv_cuda_deposit d;
    memset(&d, 0, sizeof(d));
    d.magic = KV_CUDA_DEPOSIT_MAGIC;
    d.version = KV_CUDA_PROTOCOL_VERSION;
    fill_reply(p, &d.pool);
    d.num_layers = p->geometry.num_layers;
    d.num_blocks = p->geometry.num_blocks;
    d.block_size = p->geometry.block_size;
    d.num_kv_heads = p->geometry.num_kv_heads;
    d.head_dim = p->geometry.head_dim;
    d.dtype = (int32_t)p->geometry.dtype;
    return fd_pass_send(sock, &d, sizeof(d), p->fds, p->num_chunks, MSG_DONTWAIT,
                        "the KV pool's descriptors to the keeper");
}

void kv_cuda_offer_free(struct kv_cuda_offer *o)
{
    if (o == NULL)
        return;
    fd_pass_close(o->fds, o->num_fds);
    free(o);
}

int kv_cuda_offer_take(int sock, struct kv_cuda_offer **out)
{
    *out = NULL;
    struct kv_cuda_offer *o = calloc(1, sizeof(*o));
    if (o == NULL)
        return PAGODA_ENOMEM;
    /* Room for a larger deposit (another version's), told apart by its size and version. */
    union {
        struct kv_cuda_deposit d;
        unsigned char bytes[2 * sizeof(struct kv_cuda_deposit)];
    } in;
    memset(&in, 0, sizeof(in));
    size_t n = 0;
    int rc = fd_pass_recv(sock, &in, sizeof(in), &n, o->fds, KV_CUDA_MAX_CHUNKS, &o->num_fds,
                          MSG_DONTWAIT, "the keeper's offer");
    if (rc == PAGODA_ETIMEDOUT || rc == PAGODA_ECLOSED) { /* nothing offered */
        free(o);
        return 0;
    }
    o->d = in.d;
    if (rc == 0 && (n != sizeof(o->d) || o->d.magic != KV_CUDA_DEPOSIT_MAGIC ||
                    o->d.version != KV_CUDA_PROTOCOL_VERSION))
        rc = pagoda_error_set(PAGODA_EPROTO,
                              "the keeper's offer has %zu bytes, magic %08x, version %u "
                              "(expected %zu, %08x, %u)",
                              n, o->d.magic, o->d.version, sizeof(o->d), KV_CUDA_DEPOSIT_MAGIC,
                              KV_CUDA_PROTOCOL_VERSION);
    const struct kv_cuda_reply *r = &o->d.pool;
    if (rc == 0 && r->pool_id == 0)
        rc = pagoda_error_set(PAGODA_EPROTO, "the keeper's offer has pool id 0 (no identity)");
    if (rc == 0) {
        struct kv_geometry *g = &o->geometry;
        g->pool_id = r->pool_id;
        g->num_layers = o->d.num_layers;
        g->num_blocks = o->d.num_blocks;
        g->block_size = o->d.block_size;
        g->num_kv_heads = o->d.num_kv_heads;
        g->head_dim = o->d.head_dim;
        g->dtype = (enum dtype)o->d.dtype;
        if ((rc = kv_geometry_validate(g)) == 0 && kv_pool_bytes(g) != r->data_bytes)
            rc = pagoda_error_set(PAGODA_EPROTO,
                                  "the keeper's offer: %llu bytes of KV data for a geometry of "
                                  "%zu",
                                  (unsigned long long)r->data_bytes, kv_pool_bytes(g));
        if (rc == 0)
            rc = check_layout("the keeper's offer", r, r->data_bytes, o->num_fds);
    }
    if (rc != 0) {
        kv_cuda_offer_free(o);
        return rc;
    }
    *out = o;
    return 0;
}

const struct kv_geometry *kv_cuda_offer_geometry(const struct kv_cuda_offer *o)
{
    return &o->geometry;
}

int kv_cuda_pool_adopt(struct kv_cuda_offer *o, const struct kv_geometry *want,
                       const struct kv_cuda_pool_options *opt, struct kv_cuda_pool **out)
{
    if (o == NULL || want == NULL || opt == NULL || out == NULL)
        return pagoda_error_set(PAGODA_EINVAL, "kv_cuda_pool_adopt: NULL argument");
    int rc = drv_load();
    if (rc != 0)
        return rc;
    struct kv_geometry same = *want;
    same.pool_id = o->geometry.pool_id;
    if (!kv_geometry_equal(&same, &o->geometry))
        return pagoda_error_set(
            PAGODA_EMISMATCH,
            "the pool left is %d layers x %d blocks of %d tokens x %d KV heads x %d, %s; this "
            "kvpool's is %d x %d of %d x %d x %d, %s",
            o->geometry.num_layers, o->geometry.num_blocks, o->geometry.block_size,
            o->geometry.num_kv_heads, o->geometry.head_dim, dtype_name(o->geometry.dtype),
            want->num_layers, want->num_blocks, want->block_size, want->num_kv_heads,
            want->head_dim, dtype_name(want->dtype));
    struct kv_cuda_pool *p = pool_described(&same, &o->d.pool, &rc);
    if (p == NULL)
        return rc;
    if (p->device != opt->device) {
        char text[48];
        uuid_text(p->uuid, text, sizeof(text));
        rc = pagoda_error_set(PAGODA_EMISMATCH,
                              "the pool left is on %s, GPU %d here; this kvpool's is GPU %d", text,
                              p->device, opt->device);
    }
    if (rc != 0 || (rc = pool_import_chunks(p, o->fds, "the keeper's")) != 0) {
        kv_cuda_pool_close(p);
        return rc;
    }
    /* Its descriptors are now this pool's, handed to workers as a created pool's are. */
    p->exported = 1;
    for (int i = 0; i < o->num_fds; i++) {
        p->fds[i] = o->fds[i];
        o->fds[i] = -1;
    }
    p->num_fds = o->num_fds;
    o->num_fds = 0;
    *out = p;
    return 0;
}

/* ---- the server --------------------------------------------------------------------------- */

static void refuse(struct kv_cuda_server *s, int conn, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static void refuse(struct kv_cuda_server *s, int conn, int code, const char *fmt, ...)
{
    struct kv_cuda_reply r;
    fill_reply(s->pool, &r);
    r.num_chunks = 0;
    r.error_code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r.message, sizeof(r.message), fmt, ap);
    va_end(ap);
    atomic_fetch_add(&s->refusals, 1);
    log_warn("pool descriptors refused: %s", r.message);
    if (send(conn, &r, sizeof(r), MSG_NOSIGNAL) < 0)
        log_debug("sending a refusal: %s", strerror(errno));
}

/* One connection: checks the peer and its request, then sends the reply with a fresh dup of
 * every chunk's descriptor (closed here once sent: the peer's copies are its own). */
static void serve_one(struct kv_cuda_server *s, int conn)
{
    struct ucred cred;
    socklen_t len = sizeof(cred);
    if (getsockopt(conn, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        refuse(s, conn, PAGODA_EPERM, "cannot tell who the peer is: %s", strerror(errno));
        return;
    }
    if (cred.uid != geteuid()) {
        refuse(s, conn, PAGODA_EPERM, "peer pid %d runs as uid %u, not as kvpool's uid %u",
               (int)cred.pid, (unsigned)cred.uid, (unsigned)geteuid());
        return;
    }
    if (set_io_timeouts(conn, KV_CUDA_SERVER_IO_TIMEOUT_MS) != 0) {
        log_warn("%s", pagoda_error_detail());
        return;
    }
    struct kv_cuda_request req;
    memset(&req, 0, sizeof(req));
    ssize_t n = recv(conn, &req, sizeof(req), 0);
    if (n != (ssize_t)sizeof(req) || req.magic != KV_CUDA_MAGIC ||
        req.version != KV_CUDA_PROTOCOL_VERSION) {
        refuse(s, conn, PAGODA_EPROTO,
               "malformed request from pid %d (%zd bytes, magic %08x, version %u)", (int)cred.pid,
               n, req.magic, req.version);
        return;
    }
    const struct kv_cuda_pool *p = s->pool;
    if (req.pool_id != 0 && req.pool_id != p->geometry.pool_id) {
        refuse(s, conn, PAGODA_EMISMATCH,
               "worker %lld (pid %d) expects pool %016llx; this kvpool serves pool %016llx",
               (long long)req.worker_id, (int)cred.pid, (unsigned long long)req.pool_id,
               (unsigned long long)p->geometry.pool_id);
        return;
    }
    int dups[KV_CUDA_MAX_CHUNKS], num_dups = 0;
    for (int i = 0; i < p->num_chunks; i++) {
        int d = fcntl(p->fds[i], F_DUPFD_CLOEXEC, 0);
        if (d < 0)
            break;
        dups[num_dups++] = d;
    }
    if (num_dups == p->num_chunks) {
        struct kv_cuda_reply r;
        fill_reply(p, &r);
        if (fd_pass_send(conn, &r, sizeof(r), dups, num_dups, 0, "the KV pool's descriptors") ==
            0) {
            atomic_fetch_add(&s->handouts, 1);
            log_info("handed the KV pool (%d descriptor(s), %.1f MiB) to worker %lld (pid %d)",
                     num_dups, mib(p->mapped_bytes), (long long)req.worker_id, (int)cred.pid);
        } else {
            atomic_fetch_add(&s->refusals, 1);
            log_warn("to pid %d: %s", (int)cred.pid, pagoda_error_detail());
        }
    } else {
        refuse(s, conn, PAGODA_EIO, "cannot duplicate the pool's descriptors: %s", strerror(errno));
    }
    for (int i = 0; i < num_dups; i++)
        close(dups[i]);
}

static void *server_main(void *arg)
{
    struct kv_cuda_server *s = arg;
    for (;;) {
        struct pollfd pfd[2] = {{s->listen_fd, POLLIN, 0}, {s->wake[0], POLLIN, 0}};
        if (poll(pfd, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            log_error("the KV pool's descriptor server stops: poll: %s", strerror(errno));
            return NULL;
        }
        if (pfd[1].revents != 0)
            return NULL;
        if ((pfd[0].revents & POLLIN) == 0)
            continue;
        int conn = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (conn < 0) {
            if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR &&
                errno != ECONNABORTED) {
                log_warn("accept on %s: %s", s->path, strerror(errno));
                sleep_ms(100); /* out of descriptors, say: do not spin */
            }
            continue;
        }
        serve_one(s, conn);
        close(conn);
    }
}

int kv_cuda_server_open(struct kv_cuda_pool *pool, const char *socket_path,
                        struct kv_cuda_server **out)
{
    if (pool == NULL || socket_path == NULL || out == NULL || !pool->exported)
        return pagoda_error_set(PAGODA_EINVAL, "kv_cuda_server_open: needs an exported pool");
    struct sockaddr_un addr;
    int rc = make_addr(socket_path, &addr);
    if (rc != 0)
        return rc;
    struct kv_cuda_server *s = calloc(1, sizeof(*s));
    if (s == NULL)
        return PAGODA_ENOMEM;
    s->pool = pool;
    s->listen_fd = s->wake[0] = s->wake[1] = -1;
    snprintf(s->path, sizeof(s->path), "%s", socket_path);
    if (unlink(socket_path) == 0)
        log_warn("removed %s, left by a kvpool that did not exit cleanly", socket_path);
    s->listen_fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s->listen_fd < 0) {
        rc = pagoda_error_set(PAGODA_EIO, "socket (AF_UNIX): %s", strerror(errno));
        goto fail;
    }
    if (bind(s->listen_fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        rc = pagoda_error_set(PAGODA_EIO, "bind %s: %s", socket_path, strerror(errno));
        goto fail;
    }
    if (chmod(socket_path, 0600) != 0 || listen(s->listen_fd, KV_CUDA_BACKLOG) != 0) {
        rc = pagoda_error_set(PAGODA_EIO, "listen on %s: %s", socket_path, strerror(errno));
        unlink(socket_path);
        goto fail;
    }
    if (pipe2(s->wake, O_CLOEXEC) != 0) {
        rc = pagoda_error_set(PAGODA_EIO, "pipe: %s", strerror(errno));
        unlink(socket_path);
        goto fail;
    }
    /* The thread takes no signals: the caller's main thread waits for them. */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int err = pthread_create(&s->thread, NULL, server_main, s);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0) {
        rc = pagoda_error_set(PAGODA_EIO, "pthread_create: %s", strerror(err));
        unlink(socket_path);
        goto fail;
    }
    s->thread_started = 1;
    *out = s;
    return 0;
fail:
    if (s->listen_fd >= 0)
        close(s->listen_fd);
    if (s->wake[0] >= 0)
        close(s->wake[0]);
    if (s->wake[1] >= 0)
        close(s->wake[1]);
    free(s);
    return rc;
}

void kv_cuda_server_close(struct kv_cuda_server *s)
{
    if (s == NULL)
        return;
    if (s->thread_started) {
        char byte = 1;
        if (write(s->wake[1], &byte, 1) != 1)
            log_warn("waking the descriptor server: %s", strerror(errno));
        pthread_join(s->thread, NULL);
    }
    close(s->listen_fd);
    if (unlink(s->path) != 0 && errno != ENOENT)
        log_warn("cannot remove %s: %s", s->path, strerror(errno));
    close(s->wake[0]);
    close(s->wake[1]);
    free(s);
}

uint64_t kv_cuda_server_handouts(const struct kv_cuda_server *s)
{
    return atomic_load(&((struct kv_cuda_server *)s)->handouts);
}

uint64_t kv_cuda_server_refusals(const struct kv_cuda_server *s)
{
    return atomic_load(&((struct kv_cuda_server *)s)->refusals);
}
