/* Helpers for integration tests that start a real process group: a model, the supervisor with
 * its programs, libpagoda clients, and the expected outputs from pagoda-run. Plain C with a
 * counting check macro; each scenario prints "N passed, M failed" last. */
#ifndef PAGODA_TESTS_INTEGRATION_GROUP_H
#define PAGODA_TESTS_INTEGRATION_GROUP_H

#include "client/pagoda.h"
#include "proto/pagoda.pb-c.h"

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

extern int group_passed, group_failed;

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (cond) {                                                                                \
            group_passed++;                                                                        \
            printf("ok   ");                                                                       \
        } else {                                                                                   \
            group_failed++;                                                                        \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                            \
        }                                                                                          \
        printf(__VA_ARGS__);                                                                       \
        printf("\n");                                                                              \
        fflush(stdout);                                                                            \
    } while (0)

struct group {
    char bin_dir[1024];
    char tmp[256]; /* everything of this test lives here */
    char run_dir[512];
    char model[512];
    char url[600];
    pid_t supervisor;
    int kv_blocks; /* the pool's size (group_prepare sets 2048) */
    /* Set by group_use_cuda: the worker, pagoda-run and pagoda-logits run the CUDA backend on
     * weights of the model's shape drawn on the GPU from weight_seed. */
    int cuda;
    uint64_t weight_seed;
    /* With cuda: PAGODA_TEST_KV_CACHE_DTYPE=fp8 in the environment keeps the group's K/V and
     * pagoda-run's and pagoda-logits' in 8-bit pools (--kv-cache-dtype fp8); "auto" else. */
    const char *kv_cache_dtype;
};

/* Makes a temporary folder and the tiny model in it. Returns 0 or -1. */
int group_prepare(struct group *g, const char *bin_dir);

/* A test program's start: ignores SIGPIPE, group_prepare, and group_use_cuda when cuda is set.
 * Returns 0, 77 (no GPU here: the caller exits 77 to skip) or 1 (the reason printed; the
 * caller exits 1). Nothing is left to clean up unless it returns 0. */
int group_setup(struct group *g, const char *bin_dir, int cuda);

/* A test program's end: after a failure, the tails of the group's logs; group_cleanup; the
 * "N passed, M failed" line. Returns the exit status: 0 when something passed and nothing
 * failed, else 1. */
int group_finish(struct group *g);

/* Starts pagoda-supervisor with extra flags (NULL-terminated) and waits until RUN/ready exists
 * (up to 60 s). Returns 0 or -1. */
int group_start(struct group *g, const char *const *extra);

/* SIGTERM to the supervisor and wait for it (up to 60 s, then SIGKILL). Returns its exit status
 * (0 for a clean drain) or -1. */
int group_stop(struct group *g);

/* Removes the temporary folder. */
void group_cleanup(struct group *g);

/* The pid of this group's running program (e.g. "pagoda-worker", found in /proc), or -1. */
pid_t group_program_pid(const struct group *g, const char *program);

/* The pid of the running pagoda-worker of this group, or -1. */
pid_t group_worker_pid(const struct group *g);

/* A prompt of n token ids below vocab, from seed. */
void group_prompt(int32_t *out, size_t n, uint32_t seed, int32_t vocab);

/* Runs pagoda-run (greedy, --ignore-eos) on the prompts in one batch and stores each prompt's
 * tokens: out[i] (malloc'd, out_len[i] tokens). Returns 0 or -1. */
int group_expected(const struct group *g, int32_t *const *prompts, const size_t *lens,
                   int num_prompts, int32_t max_tokens, int32_t **out, size_t *out_len);

/* The same with sampling at temperature (0: greedy) and one seed for every prompt. */
int group_expected_sampled(const struct group *g, int32_t *const *prompts, const size_t *lens,
                           int num_prompts, int32_t max_tokens, float temperature, uint64_t seed,
                           int32_t **out, size_t *out_len);

/* Sends bytes as one call on a fresh REQ socket of its own (no resends within the timeout) and
 * waits up to timeout_ms for the reply. Returns the unpacked reply (the caller frees it with
 * pagoda__client_response__free_unpacked) or NULL when none came or it was malformed. */
Pagoda__ClientResponse *group_raw_call(const struct group *g, const void *bytes, size_t len,
                                       uint32_t timeout_ms);

/* Puts the group on the GPU: the model becomes a config-only directory of the Llama shape
 * tests/gpu uses (4 layers, hidden 4096, 32 heads, 8 KV heads, head dim 128, vocab 32000), with
 * weights drawn on the GPU (--load-format random, seed g->weight_seed); the group's pool is on
 * the GPU (supervisor --backend cuda) and group_expected runs pagoda-run --backend cuda on the
 * same weights (greedy only: pagoda-run's --seed is also its weight seed). Returns 0, 77 when
 * this build has no CUDA backend or this machine no NVIDIA GPU (the caller skips), or -1. */
int group_use_cuda(struct group *g);

/* GPU groups: bf16 results depend slightly on the batch, so outputs are compared with the
 * reference up to the first position where the reference's top two logits are within margin
 * (tests/gpu/cuda_vs_cpu.py's rule). Returns that position (0-based in want; want_len when there
 * is none), computed with pagoda-logits --backend cuda teacher-forced on the prompt followed by
 * want, or -1 when pagoda-logits fails. */
long group_first_near_tie(const struct group *g, const int32_t *prompt, size_t n,
                          const int32_t *want, size_t want_len, float margin);

/* Greedy generation parameters with max_tokens and EOS ignored. */
pagoda_generate_params group_greedy(int32_t max_tokens);

/* The factor every wait of the integration tests is multiplied by: PAGODA_TEST_TIME_SCALE (at
 * least 1; CTest sets it higher for the sanitizer build, which runs several times slower). */
long group_time_scale(void);

/* The factor of the detection times a scenario provokes on purpose and waits out whole (a
 * watchdog, a result timeout, a listener's settle): PAGODA_TEST_DETECT_SCALE (at least 1; CTest
 * sets it for the sanitizer build, smaller than the time scale: a limit only bounds a wait, these
 * are the wait). */
long group_detect_scale(void);

/* A millisecond figure times the time scale (group_ms) or the detection scale
 * (group_detect_ms), as a string for a program's argument; the last 16 stay valid. */
const char *group_ms(long value);
const char *group_detect_ms(long value);

#endif
