/* The one conversion between the sampling parameters the protocols carry (pagoda.proto's client
 * SamplingParams, internal.proto's) and the sampler's struct sampling_params
 * (kernels/cpu/sampler.h, which holds the ranges and sampling_params_default()).
 *
 * An absent message or field means the default of sampling_params_default(): temperature 1
 * (plain sampling from the softmax, as OpenAI's API and vLLM default to), every filter and
 * penalty off, seed 0; for a client's, the router's defaults instead (sampling_from_client_over:
 * the model's generation_config.json's where it names some, as vLLM applies them). The router, the
 * scheduler, the worker's mirror and pagoda-run all read parameters through here, so no two of them
 * can disagree on what an absent field means. */
#ifndef PAGODA_WIRE_SAMPLING_WIRE_H
#define PAGODA_WIRE_SAMPLING_WIRE_H

#include "kernels/cpu/logit_bias.h"
#include "kernels/cpu/sampler.h"
#include "proto/internal.pb-c.h"
#include "proto/pagoda.pb-c.h"

/* Reads a client's SamplingParams (m may be NULL) into *out and validates it
 * (sampling_params_validate). Returns 0, or PAGODA_EINVAL/PAGODA_ERANGE with the detail naming
 * the field; *out holds the values read either way. */
int sampling_from_client(const Pagoda__SamplingParams *m, struct sampling_params *out);

/* The same with base's values for the absent fields in place of sampling_params_default()'s: the
 * router's, where the model's generation_config.json recommends some (router_config). */
int sampling_from_client_over(const Pagoda__SamplingParams *m, const struct sampling_params *base,
                              struct sampling_params *out);

/* The same for internal.proto's SamplingParams (the scheduler's and the worker's input). */
int sampling_from_internal(const Pagoda__Internal__SamplingParams *m, struct sampling_params *out);

/* internal.proto's SamplingParams with every field present. */
Pagoda__Internal__SamplingParams sampling_to_internal(const struct sampling_params *p);

/* A message's logit bias (its logit_bias_token_ids and logit_bias_values, m may be NULL),
 * checked by logit_bias_validate against vocab (<= 0: not known here) and copied into *out, to be
 * released with logit_bias_fini. Returns 0, the errors of logit_bias_validate, or PAGODA_ENOMEM;
 * *out is empty on failure. */
int logit_bias_from_client(const Pagoda__SamplingParams *m, int64_t vocab, struct logit_bias *out);
int logit_bias_from_internal(const Pagoda__Internal__SamplingParams *m, int64_t vocab,
                             struct logit_bias *out);

/* Points m's logit bias lists at b's arrays (b must outlive m's use). */
void logit_bias_to_internal(const struct logit_bias *b, Pagoda__Internal__SamplingParams *m);

#endif
