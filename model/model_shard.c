#include "model/model_shard.h"
#include "common/error.h"

struct model_shard model_shard_whole(const struct model_config *c)
{
    struct model_shard s = {
        .rank = 0,
        .size = 1,
        .num_heads = c->num_heads,
        .num_kv_heads = c->num_kv_heads,
        .intermediate_size = c->intermediate_size,
        .vocab_begin = 0,
        .vocab_end = c->vocab_size,
        .vocab_per_rank = c->vocab_size,
    };
    return s;
}

int model_shard_make(const struct model_config *c, int rank, int size, struct model_shard *out)
{
    if (size < 1 || size > MODEL_SHARD_MAX_SIZE)
        return pagoda_error_set(PAGODA_EINVAL, "tensor-parallel size %d (1 to %d)", size,
                                MODEL_SHARD_MAX_SIZE);
    if (rank < 0 || rank >= size)
        return pagoda_error_set(PAGODA_EINVAL, "tensor-parallel rank %d of a group of %d", rank,
                                size);
    struct {
        const char *field;
        int64_t value;
    } split[] = {
        {"num_attention_heads", c->num_heads},
        {"num_key_value_heads", c->num_kv_heads},
        {"intermediate_size", c->intermediate_size},
    };
    for (size_t i = 0; i < sizeof(split) / sizeof(split[0]); i++)
        if (split[i].value % size != 0)
            return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                    "tensor-parallel size %d does not divide the model's %s (%lld)",
                                    size, split[i].field, (long long)split[i].value);
    int64_t per = (c->vocab_size + size - 1) / size;
    if (per * (size - 1) >= c->vocab_size)
        return pagoda_error_set(PAGODA_EUNSUPPORTED,
                                "tensor-parallel size %d leaves a rank without vocabulary (%lld)",
                                size, (long long)c->vocab_size);
    *out = (struct model_shard){
        .rank = rank,
        .size = size,
        .num_heads = c->num_heads / size,
        .num_kv_heads = c->num_kv_heads / size,
        .intermediate_size = c->intermediate_size / size,
        .vocab_begin = per * rank,
        .vocab_end = per * (rank + 1) < c->vocab_size ? per * (rank + 1) : c->vocab_size,
        .vocab_per_rank = per,
    };
    return 0;
}
