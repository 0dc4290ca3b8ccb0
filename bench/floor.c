#include "bench/floor.h"

double floor_weight_bytes(const struct model_config *cfg, int dtype_bytes)
{
    double h = (double)cfg->hidden_size, q = (double)(cfg->num_heads * cfg->head_dim);
    double kv = (double)(cfg->num_kv_heads * cfg->head_dim);
    double inter = (double)cfg->intermediate_size;
    double layer = h * q + 2 * h * kv + q * h /* q, k, v, o */
                   + 3 * h * inter            /* gate, up, down */
                   + 2 * h;                   /* input and post-attention norms */
    if (cfg->qkv_bias)
        layer += q + 2 * kv;
    if (cfg->o_bias)
        layer += h;
    double params = (double)cfg->num_layers * layer + h /* final norm */
                    + (double)cfg->vocab_size * h;      /* lm_head or tied embeddings */
    return params * dtype_bytes;
}

double floor_flops_per_token(const struct model_config *cfg)
{
    return 2.0 * floor_weight_bytes(cfg, 1) - floor_lm_head_flops(cfg);
}

double floor_lm_head_flops(const struct model_config *cfg)
{
    return 2.0 * (double)cfg->vocab_size * (double)cfg->hidden_size;
}

double floor_attention_flops_per_key(const struct model_config *cfg)
{
    return 4.0 * (double)cfg->num_layers * (double)cfg->num_heads * (double)cfg->head_dim;
}

double floor_kv_bytes_per_token(const struct model_config *cfg, int dtype_bytes)
{
    return (double)cfg->num_layers * 2.0 * (double)cfg->num_kv_heads * (double)cfg->head_dim *
           dtype_bytes;
}
