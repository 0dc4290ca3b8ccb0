/* The sampling flags of the programs that generate from the command line (pagoda-run offline,
 * `pagoda generate` through a group): one table of their names and one parser of their values,
 * so that both take the same spellings, ranges and refusals. Each program keeps its own
 * defaults and copies what was given into its own parameters (sampling_flags.given).
 *
 * The ranges here are what a command line can mean (a temperature >= 0, top-p in (0, 1], a
 * repetition penalty > 0, ...); the sampler's own ranges (kernels/cpu/sampler.h,
 * sampling_params_validate) are checked where the parameters are used. */
#ifndef PAGODA_COMMON_SAMPLING_FLAGS_H
#define PAGODA_COMMON_SAMPLING_FLAGS_H

#include <getopt.h>
#include <stdint.h>

/* getopt_long codes, above any single character and the programs' own codes. */
enum sampling_flag {
    SAMPLING_FLAG_TEMPERATURE = 0x4000,
    SAMPLING_FLAG_TOP_P,
    SAMPLING_FLAG_TOP_K,
    SAMPLING_FLAG_MIN_P,
    SAMPLING_FLAG_REPETITION_PENALTY,
    SAMPLING_FLAG_PRESENCE_PENALTY,
    SAMPLING_FLAG_FREQUENCY_PENALTY,
    SAMPLING_FLAG_SEED,
    SAMPLING_FLAG_END
};

/* The flags' entries of a struct option table. */
/* clang-format off */
#define SAMPLING_FLAG_OPTIONS                                                                  \
    {"temperature", required_argument, NULL, SAMPLING_FLAG_TEMPERATURE},                       \
    {"top-p", required_argument, NULL, SAMPLING_FLAG_TOP_P},                                   \
    {"top-k", required_argument, NULL, SAMPLING_FLAG_TOP_K},                                   \
    {"min-p", required_argument, NULL, SAMPLING_FLAG_MIN_P},                                   \
    {"repetition-penalty", required_argument, NULL, SAMPLING_FLAG_REPETITION_PENALTY},         \
    {"presence-penalty", required_argument, NULL, SAMPLING_FLAG_PRESENCE_PENALTY},             \
    {"frequency-penalty", required_argument, NULL, SAMPLING_FLAG_FREQUENCY_PENALTY},           \
    {"seed", required_argument, NULL, SAMPLING_FLAG_SEED}
/* clang-format on */

/* What the flags gave; given has bit (1 << (flag - SAMPLING_FLAG_TEMPERATURE)) of each. */
struct sampling_flags {
    float temperature;
    float top_p;
    int32_t top_k; /* 0: off */
    float min_p;
    float repetition_penalty;
    float presence_penalty;
    float frequency_penalty;
    uint64_t seed;
    unsigned given;
};

#define SAMPLING_FLAG_GIVEN(f, flag) (((f)->given >> ((flag)-SAMPLING_FLAG_TEMPERATURE)) & 1u)

/* Whether opt is one of the flags. */
static inline int sampling_flag_is(int opt)
{
    return opt >= SAMPLING_FLAG_TEMPERATURE && opt < SAMPLING_FLAG_END;
}

/* Reads flag opt's value arg into f. Returns 0 or the parse's error (PAGODA_EINVAL,
 * PAGODA_ERANGE, with a detail naming the flag; common/parse.h). */
int sampling_flag_parse(int opt, const char *arg, struct sampling_flags *f);

#endif
