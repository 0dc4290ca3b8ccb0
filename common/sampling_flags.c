#include "common/sampling_flags.h"

#include "common/error.h"
#include "common/parse.h"

int sampling_flag_parse(int opt, const char *arg, struct sampling_flags *f)
{
    int64_t i = 0;
    float v = 0;
    int rc;
    switch (opt) {
    case SAMPLING_FLAG_TEMPERATURE:
        rc = parse_f32("--temperature", arg, 0, 1e6, &f->temperature);
        break;
    case SAMPLING_FLAG_TOP_P:
        if ((rc = parse_f32("--top-p", arg, 0, 1, &v)) == 0 && v <= 0)
            rc = pagoda_error_set(PAGODA_ERANGE, "--top-p: %s must be in (0, 1]", arg);
        if (rc == 0)
            f->top_p = v;
        break;
    case SAMPLING_FLAG_TOP_K:
        if ((rc = parse_i64("--top-k", arg, 0, INT32_MAX, &i)) == 0)
            f->top_k = (int32_t)i;
        break;
    case SAMPLING_FLAG_MIN_P:
        rc = parse_f32("--min-p", arg, 0, 1, &f->min_p);
        break;
    case SAMPLING_FLAG_REPETITION_PENALTY:
        if ((rc = parse_f32("--repetition-penalty", arg, 0, 1e6, &v)) == 0 && v <= 0)
            rc = pagoda_error_set(PAGODA_ERANGE, "--repetition-penalty: %s must be > 0", arg);
        if (rc == 0)
            f->repetition_penalty = v;
        break;
    case SAMPLING_FLAG_PRESENCE_PENALTY:
        rc = parse_f32("--presence-penalty", arg, -2, 2, &f->presence_penalty);
        break;
    case SAMPLING_FLAG_FREQUENCY_PENALTY:
        rc = parse_f32("--frequency-penalty", arg, -2, 2, &f->frequency_penalty);
        break;
    case SAMPLING_FLAG_SEED:
        if ((rc = parse_i64("--seed", arg, 0, INT64_MAX, &i)) == 0)
            f->seed = (uint64_t)i;
        break;
    default:
        return pagoda_error_set(PAGODA_EINVAL, "option %d is no sampling flag", opt);
    }
    if (rc == 0)
        f->given |= 1u << (opt - SAMPLING_FLAG_TEMPERATURE);
    return rc;
}
