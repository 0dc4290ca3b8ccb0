/* Exit statuses that carry a meaning between the group's programs and the supervisor that
 * starts them. A program's exit status is the one word it can still say when it stops before
 * (or instead of) talking over the wire, so it lives here, beside the error codes, where the
 * programs that exit with it and deploy/supervisor.c that reads it both include it. */
#ifndef PAGODA_COMMON_EXIT_STATUS_H
#define PAGODA_COMMON_EXIT_STATUS_H

/* The program cannot run as it is configured (EX_CONFIG of sysexits.h), and a restart would
 * fail the same way. pagoda-worker exits with it when its weights and activations do not fit
 * beside the GPU KV pool, or when kvpool's pool is of the wrong kind, dtype or shape for its
 * backend and model, or when the model folder's files cannot be read as a model (config.json,
 * generation_config.json, the safetensors files: kvpool too, for config.json). pagoda-supervisor,
 * reading it from a program while the group starts, stops the group and says why instead of
 * restarting the program (restart_policy.h); once the group has served, it restarts it with
 * back-off without end, the rest of the group going on. pagoda-router exits with it when its
 * tenants file cannot be taken, or its model's tokenizer.json or tokenizer_config.json is broken
 * (router/router.h, router_text_load). */
#define PAGODA_EXIT_CANNOT_RUN 78

#endif
