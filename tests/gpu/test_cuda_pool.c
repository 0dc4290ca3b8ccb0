/* The GPU KV pool (kvpool/cuda_pool.h) across processes, on a real device.
 *
 * 1. Exported here, imported by a child started with fork and exec (twice, as a restarted
 *    worker would): the pool starts zeroed, the child sees what this process wrote and this
 *    process sees what the child wrote, through several chunks; a request for another pool id
 *    is refused.
 * 2. Exported by a child, imported here, the child killed with SIGKILL: the memory stays valid
 *    and intact here (and still occupies the device) after the exporter's death.
 * 3. The device's free memory is back where it started once every process let go, each time.
 * 4. Errors: no server (a timeout), a pool larger than the free memory (refused, saying by how
 *    much).
 * 5. Kept across kvpool's restarts: a child creates a pool, writes a pattern, deposits the pool on
 *    a socket (kv_cuda_pool_deposit) and is killed with SIGKILL; the deposit alone keeps the
 *    memory. Here the offer is taken, refused for another geometry (and still usable), adopted:
 *    the same pool id and the child's pattern (not zeroed), served to a child that imports it.
 *    An empty socket offers nothing; a malformed deposit is refused. The memory is back after.
 * Prints "N passed, M failed"; exits 77 (skipped) without a CUDA device.
 *
 * usage: test_cuda_pool
 *        test_cuda_pool --import SOCKET POOL_ID CHECK_SEED WRITE_SEED   (a child)
 *        test_cuda_pool --export SOCKET POOL_ID WRITE_SEED              (a child)
 *        test_cuda_pool --deposit FD POOL_ID WRITE_SEED                 (a child) */
#include "common/error.h"
#include "kvpool/cuda_pool.h"
#include "tests/gpu/gpu_test.h"

#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* Memory that may differ between two measures of free memory with the same processes. */
#define FREE_TOLERANCE_BYTES (UINT64_C(32) << 20)
#define WAIT_MS 10000

/* 300 MiB in bf16 (256 KiB a block), laid out in 64 MiB chunks: 4 of them and one of 44 MiB. */
static struct kv_geometry test_geometry(uint64_t pool_id)
{
    struct kv_geometry g = {
        .pool_id = pool_id,
        .num_layers = 4,
        .num_blocks = 1200,
        .block_size = 16,
        .num_kv_heads = 8,
        .head_dim = 128,
        .dtype = DTYPE_BF16,
    };
    return g;
}
#define TEST_CHUNK_BYTES (UINT64_C(64) << 20)

static void sleep_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static const char *msg(int rc)
{
    static char buf[700];
    return pagoda_error_message(rc, buf, sizeof(buf));
}

static uint32_t pattern(uint64_t i, uint32_t seed)
{
    uint64_t x = (i + 1) * UINT64_C(0x9e3779b97f4a7c15) ^ ((uint64_t)seed << 32 | seed);
    x ^= x >> 29;
    x *= UINT64_C(0xbf58476d1ce4e5b9);
    return (uint32_t)(x ^ (x >> 32));
}

/* Writes the pattern of seed over the whole KV data at dev (bytes long). */
static int fill(void *dev, size_t bytes, uint32_t seed)
{
    size_t n = bytes / 4;
    uint32_t *host = malloc(n * 4);
    if (host == NULL)
        return -1;
    for (size_t i = 0; i < n; i++)
        host[i] = pattern(i, seed);
    cudaError_t e = cudaMemcpy(dev, host, n * 4, cudaMemcpyHostToDevice);
    free(host);
    return e == cudaSuccess ? 0 : -1;
}

/* The number of words that differ from the pattern of seed (seed 0: from zero), or -1. */
static long long count_wrong(const void *dev, size_t bytes, uint32_t seed)
{
    size_t n = bytes / 4;
    uint32_t *host = malloc(n * 4);
    if (host == NULL)
        return -1;
    if (cudaMemcpy(host, dev, n * 4, cudaMemcpyDeviceToHost) != cudaSuccess) {
        free(host);
        return -1;
    }
    long long wrong = 0;
    for (size_t i = 0; i < n; i++)
        wrong += host[i] != (seed ? pattern(i, seed) : 0);
    free(host);
    return wrong;
}

static uint64_t free_now(void)
{
    uint64_t f = 0, t = 0;
    return kv_cuda_mem_info(0, &f, &t) == 0 ? f : 0;
}

/* Waits (up to WAIT_MS) until the free memory is back to base within the tolerance; returns the
 * last measure. */
static uint64_t wait_free_back(uint64_t base)
{
    uint64_t f = 0;
    for (int i = 0; i < WAIT_MS / 100; i++) {
        f = free_now();
        if (f + FREE_TOLERANCE_BYTES >= base)
            break;
        sleep_ms(100);
    }
    return f;
}

static double mib(uint64_t b)
{
    return (double)b / (1024.0 * 1024.0);
}

/* ---- the children ------------------------------------------------------------------------ */

/* Imports the pool, checks the parent's pattern, writes its own. Exit 0 when all went well. */
static int child_import(const char *sock, uint64_t pool_id, uint32_t check, uint32_t write)
{
    struct kv_geometry g = test_geometry(pool_id);
    struct kv_cuda_pool *p = NULL;
    int rc = kv_cuda_pool_import(sock, 7, &g, WAIT_MS, &p);
    if (rc != 0) {
        printf("child: import: %s\n", msg(rc));
        return 1;
    }
    int status = 0;
    size_t bytes = kv_pool_bytes(&g);
    long long wrong = count_wrong(kv_cuda_pool_data(p), bytes, check);
    if (wrong != 0) {
        printf("child: %lld words differ from the parent's pattern\n", wrong);
        status = 1;
    }
    struct kv_layer_view v;
    if (kv_cuda_pool_layer_view(p, 3, &v) != 0 ||
        (char *)v.k != (char *)kv_cuda_pool_data(p) + 3 * kv_layer_bytes(&g)) {
        printf("child: layer 3's view does not start where the layout says\n");
        status = 1;
    }
    if (fill(kv_cuda_pool_data(p), bytes, write) != 0 || cudaDeviceSynchronize() != cudaSuccess) {
        printf("child: writing failed\n");
        status = 1;
    }
    kv_cuda_pool_close(p);
    /* Another pool id than the one served: refused. */
    struct kv_geometry other = test_geometry(pool_id ^ 1);
    rc = kv_cuda_pool_import(sock, 7, &other, WAIT_MS, &p);
    if (rc != PAGODA_EMISMATCH) {
        printf("child: importing pool id %016" PRIx64 " gave %d (%s), expected PAGODA_EMISMATCH\n",
               pool_id ^ 1, rc, msg(rc));
        status = 1;
        if (rc == 0)
            kv_cuda_pool_close(p);
    }
    return status;
}

/* Creates a pool, writes a pattern, then serves it on sock, or (sock NULL) deposits it on
 * descriptor deposit_fd (a kvpool that deposited its pool with its keeper); says "ready" on
 * stdout and waits to be killed. */
static int child_export(const char *sock, int deposit_fd, uint64_t pool_id, uint32_t write)
{
    struct kv_geometry g = test_geometry(pool_id);
    struct kv_cuda_pool_options o = {.device = 0, .max_chunk_bytes = TEST_CHUNK_BYTES};
    struct kv_cuda_pool *p = NULL;
    struct kv_cuda_server *s = NULL;
    int rc = kv_cuda_pool_create(&g, &o, &p);
    if (rc == 0 && fill(kv_cuda_pool_data(p), kv_pool_bytes(&g), write) != 0)
        rc = PAGODA_ECUDA;
    if (rc == 0 && cudaDeviceSynchronize() != cudaSuccess)
        rc = PAGODA_ECUDA;
    if (rc == 0)
        rc = sock != NULL ? kv_cuda_server_open(p, sock, &s) : kv_cuda_pool_deposit(p, deposit_fd);
    if (rc != 0) {
        printf("exporter: %s\n", msg(rc));
        fflush(stdout);
        return 1;
    }
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}

/* ---- the test ---------------------------------------------------------------------------- */

/* Starts this program with args; its stdout into *out_fd when out_fd is not NULL. */
static pid_t spawn(char *const *args, int *out_fd)
{
    int fds[2] = {-1, -1};
    if (out_fd != NULL && pipe(fds) != 0)
        return -1;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        if (out_fd != NULL) {
            dup2(fds[1], STDOUT_FILENO);
            close(fds[0]);
            close(fds[1]);
        }
        execv("/proc/self/exe", args);
        _exit(127);
    }
    if (out_fd != NULL) {
        close(fds[1]);
        *out_fd = fds[0];
    }
    return pid;
}

/* Starts a child that holds a pool (child_export) and checks that it said "ready". */
static pid_t spawn_holder(char *const *args, const char *what)
{
    int out = -1;
    pid_t pid = spawn(args, &out);
    char line[64] = "";
    FILE *f = out >= 0 ? fdopen(out, "r") : NULL;
    if (f == NULL || fgets(line, sizeof(line), f) == NULL)
        line[0] = '\0';
    if (f != NULL)
        fclose(f);
    GPU_CHECK(strcmp(line, "ready\n") == 0, "a child %s (said '%s')", what, line);
    return pid;
}

static int wait_exit(pid_t pid)
{
    int status;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void test_export_here_import_there(const char *dir, uint64_t base_free)
{
    char sock[300], id[32];
    snprintf(sock, sizeof(sock), "%s/fds.ipc", dir);
    uint64_t pool_id = UINT64_C(0x5eed0000) ^ (uint64_t)getpid();
    snprintf(id, sizeof(id), "%" PRIu64, pool_id);
    struct kv_geometry g = test_geometry(pool_id);
    size_t bytes = kv_pool_bytes(&g);
    struct kv_cuda_pool_options o = {.device = 0, .max_chunk_bytes = TEST_CHUNK_BYTES};
    struct kv_cuda_pool *p = NULL;
    struct kv_cuda_server *s = NULL;
    int rc = kv_cuda_pool_create(&g, &o, &p);
    GPU_CHECK(rc == 0, "create a pool of %.0f MiB: %s", mib(bytes), msg(rc));
    if (rc != 0)
        return;
    GPU_CHECK(kv_cuda_pool_num_chunks(p) == 5 && kv_cuda_pool_mapped_bytes(p) == bytes,
              "the pool is 4 chunks of 64 MiB and one of 44 (%d chunks, %.0f MiB mapped)",
              kv_cuda_pool_num_chunks(p), mib(kv_cuda_pool_mapped_bytes(p)));
    uint64_t held = free_now();
    GPU_CHECK(held + kv_cuda_pool_mapped_bytes(p) <= base_free + FREE_TOLERANCE_BYTES,
              "the pool occupies the device (%.0f MiB free, %.0f before)", mib(held),
              mib(base_free));
    GPU_CHECK(count_wrong(kv_cuda_pool_data(p), bytes, 0) == 0, "a new pool is zeroed");
    GPU_CHECK(fill(kv_cuda_pool_data(p), bytes, 11) == 0, "write a pattern here");
    rc = kv_cuda_server_open(p, sock, &s);
    GPU_CHECK(rc == 0, "serve the descriptors on %s: %s", sock, msg(rc));
    if (rc != 0) {
        kv_cuda_pool_close(p);
        return;
    }
    char *import1[] = {"test_cuda_pool", "--import", sock, id, "11", "22", NULL};
    int status = wait_exit(spawn(import1, NULL));
    GPU_CHECK(status == 0,
              "a child imports the pool, sees this process's pattern, writes its own "
              "(exit %d)",
              status);
    GPU_CHECK(count_wrong(kv_cuda_pool_data(p), bytes, 22) == 0,
              "this process sees the child's pattern");
    char *import2[] = {"test_cuda_pool", "--import", sock, id, "22", "33", NULL};
    status = wait_exit(spawn(import2, NULL));
    GPU_CHECK(status == 0, "a second child (a restarted worker) imports again (exit %d)", status);
    GPU_CHECK(count_wrong(kv_cuda_pool_data(p), bytes, 33) == 0,
              "this process sees the second child's pattern");
    GPU_CHECK(kv_cuda_server_handouts(s) == 2 && kv_cuda_server_refusals(s) == 2,
              "2 hand-outs and 2 refusals of another pool id (%" PRIu64 ", %" PRIu64 ")",
              kv_cuda_server_handouts(s), kv_cuda_server_refusals(s));
    kv_cuda_server_close(s);
    GPU_CHECK(access(sock, F_OK) != 0, "closing the server removes its socket");
    kv_cuda_pool_close(p);
    uint64_t after = wait_free_back(base_free);
    GPU_CHECK(after + FREE_TOLERANCE_BYTES >= base_free,
              "the memory is back once both sides let go (%.0f MiB free, %.0f before)", mib(after),
              mib(base_free));
}

static void test_export_there_survives_its_death(const char *dir, uint64_t base_free)
{
    char sock[300], id[32];
    snprintf(sock, sizeof(sock), "%s/fds2.ipc", dir);
    uint64_t pool_id = UINT64_C(0xdead0000) ^ (uint64_t)getpid();
    snprintf(id, sizeof(id), "%" PRIu64, pool_id);
    struct kv_geometry g = test_geometry(pool_id);
    size_t bytes = kv_pool_bytes(&g);
    char *exporter[] = {"test_cuda_pool", "--export", sock, id, "44", NULL};
    pid_t pid = spawn_holder(exporter, "exports a pool and serves it");
    struct kv_cuda_pool *p = NULL;
    int rc = kv_cuda_pool_import(sock, 1, &g, WAIT_MS, &p);
    GPU_CHECK(rc == 0, "import it here: %s", msg(rc));
    if (rc == 0)
        GPU_CHECK(count_wrong(kv_cuda_pool_data(p), bytes, 44) == 0, "the child's pattern is here");
    kill(pid, SIGKILL);
    int status = wait_exit(pid);
    GPU_CHECK(status == 128 + SIGKILL, "the exporter is killed with SIGKILL (%d)", status);
    if (rc != 0)
        return;
    sleep_ms(500);
    GPU_CHECK(count_wrong(kv_cuda_pool_data(p), bytes, 44) == 0,
              "after the exporter's death the memory is valid and intact here");
    uint64_t held = free_now();
    GPU_CHECK(held + bytes <= base_free + FREE_TOLERANCE_BYTES,
              "and still occupies the device (%.0f MiB free, %.0f before)", mib(held),
              mib(base_free));
    GPU_CHECK(fill(kv_cuda_pool_data(p), bytes, 55) == 0 &&
                  count_wrong(kv_cuda_pool_data(p), bytes, 55) == 0,
              "and can be written and read");
    kv_cuda_pool_close(p);
    uint64_t after = wait_free_back(base_free);
    GPU_CHECK(after + FREE_TOLERANCE_BYTES >= base_free,
              "the memory is back once the importer lets go too (%.0f MiB free, %.0f before)",
              mib(after), mib(base_free));
}

static void test_deposit_and_adopt(const char *dir, uint64_t base_free)
{
    char sock[300], id[32], fd_text[16];
    snprintf(sock, sizeof(sock), "%s/fds3.ipc", dir);
    uint64_t pool_id = UINT64_C(0xcafe0000) ^ (uint64_t)getpid();
    snprintf(id, sizeof(id), "%" PRIu64, pool_id);
    struct kv_geometry g = test_geometry(pool_id);
    size_t bytes = kv_pool_bytes(&g);
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) != 0) {
        GPU_CHECK(0, "socketpair");
        return;
    }
    fcntl(sv[0], F_SETFD, FD_CLOEXEC); /* the keeper's end stays here */
    struct kv_cuda_offer *offer = NULL;
    int rc = kv_cuda_offer_take(sv[0], &offer);
    GPU_CHECK(rc == 0 && offer == NULL, "an empty keeper link offers nothing (%s)", msg(rc));
    snprintf(fd_text, sizeof(fd_text), "%d", sv[1]);
    char *depositor[] = {"test_cuda_pool", "--deposit", fd_text, id, "66", NULL};
    pid_t pid = spawn_holder(depositor, "creates a pool and deposits it");
    close(sv[1]);
    kill(pid, SIGKILL);
    int status = wait_exit(pid);
    GPU_CHECK(status == 128 + SIGKILL, "the depositor is killed with SIGKILL (%d)", status);
    sleep_ms(500);
    uint64_t held = free_now();
    GPU_CHECK(held + bytes <= base_free + FREE_TOLERANCE_BYTES,
              "the deposit alone keeps the pool on the device (%.0f MiB free, %.0f before)",
              mib(held), mib(base_free));
    rc = kv_cuda_offer_take(sv[0], &offer);
    GPU_CHECK(rc == 0 && offer != NULL && kv_cuda_offer_geometry(offer)->pool_id == pool_id,
              "the deposit is taken as an offer of pool %016" PRIx64 " (%s)", pool_id, msg(rc));
    close(sv[0]);
    if (offer == NULL)
        return;
    struct kv_cuda_pool_options o = {.device = 0};
    struct kv_cuda_pool *p = NULL;
    struct kv_geometry other = test_geometry(1);
    other.num_blocks++;
    rc = kv_cuda_pool_adopt(offer, &other, &o, &p);
    GPU_CHECK(rc == PAGODA_EMISMATCH, "an offer of another geometry is refused: %s", msg(rc));
    struct kv_geometry want = test_geometry(12345); /* the pool id is the offer's */
    rc = kv_cuda_pool_adopt(offer, &want, &o, &p);
    GPU_CHECK(rc == 0, "the offer is adopted after the refusal: %s", msg(rc));
    kv_cuda_offer_free(offer);
    if (rc != 0)
        return;
    GPU_CHECK(kv_cuda_pool_geometry(p)->pool_id == pool_id, "the adopted pool keeps its identity");
    GPU_CHECK(count_wrong(kv_cuda_pool_data(p), bytes, 66) == 0,
              "the adopted pool holds the dead child's pattern");
    struct kv_cuda_server *s = NULL;
    rc = kv_cuda_server_open(p, sock, &s);
    GPU_CHECK(rc == 0, "the adopted pool is served: %s", msg(rc));
    if (rc == 0) {
        char *import[] = {"test_cuda_pool", "--import", sock, id, "66", "77", NULL};
        status = wait_exit(spawn(import, NULL));
        GPU_CHECK(status == 0, "a child imports the adopted pool and sees the pattern (exit %d)",
                  status);
        GPU_CHECK(count_wrong(kv_cuda_pool_data(p), bytes, 77) == 0,
                  "this process sees the importer's pattern");
        kv_cuda_server_close(s);
    }
    kv_cuda_pool_close(p);
    uint64_t after = wait_free_back(base_free);
    GPU_CHECK(after + FREE_TOLERANCE_BYTES >= base_free,
              "the memory is back once the adopter lets go (%.0f MiB free, %.0f before)",
              mib(after), mib(base_free));
    /* A malformed deposit: 4 bytes, no descriptor. */
    if (socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv) == 0) {
        GPU_CHECK(send(sv[1], "junk", 4, 0) == 4, "send junk");
        rc = kv_cuda_offer_take(sv[0], &offer);
        GPU_CHECK(rc == PAGODA_EPROTO && offer == NULL, "a malformed deposit is refused: %s",
                  msg(rc));
        close(sv[0]);
        close(sv[1]);
    }
}

static void test_errors(const char *dir)
{
    char sock[300];
    snprintf(sock, sizeof(sock), "%s/nobody.ipc", dir);
    struct kv_geometry g = test_geometry(1);
    struct kv_cuda_pool *p = NULL;
    int rc = kv_cuda_pool_import(sock, 1, &g, 300, &p);
    GPU_CHECK(rc == PAGODA_ETIMEDOUT, "importing from a socket nobody serves times out (%s)",
              msg(rc));
    uint64_t f = 0, t = 0;
    kv_cuda_mem_info(0, &f, &t);
    /* More blocks than the whole device holds. */
    g.num_blocks = (int32_t)(t / (kv_pool_bytes(&g) / (uint64_t)g.num_blocks) + 100);
    struct kv_cuda_pool_options o = {.device = 0};
    rc = kv_cuda_pool_create(&g, &o, &p);
    GPU_CHECK(rc == PAGODA_EEXHAUSTED && strstr(pagoda_error_detail(), "short by") != NULL,
              "a pool larger than the free memory is refused: %s", msg(rc));
    if (rc == 0)
        kv_cuda_pool_close(p);
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--import") == 0)
        return child_import(argv[2], strtoull(argv[3], NULL, 10), (uint32_t)atoi(argv[4]),
                            (uint32_t)atoi(argv[5]));
    if (argc == 5 && strcmp(argv[1], "--deposit") == 0)
        return child_export(NULL, atoi(argv[2]), strtoull(argv[3], NULL, 10),
                            (uint32_t)atoi(argv[4]));
    if (argc == 5 && strcmp(argv[1], "--export") == 0)
        return child_export(argv[2], -1, strtoull(argv[3], NULL, 10), (uint32_t)atoi(argv[4]));
    gpu_test_require_device("test_cuda_pool");
    char dir[] = "/tmp/pagoda-cuda-pool-XXXXXX";
    if (mkdtemp(dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    uint64_t base = free_now();
    printf("GPU 0: %.0f MiB free at the start\n", mib(base));
    test_export_here_import_there(dir, base);
    test_export_there_survives_its_death(dir, base);
    test_deposit_and_adopt(dir, base);
    test_errors(dir);
    rmdir(dir);
    return gpu_test_finish();
}
