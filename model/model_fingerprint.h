/* A model's fingerprint: what decides the KV a model writes, hashed, so that the scheduler's
 * prefix cache never serves KV computed by another model (its root key covers the fingerprint).
 *
 * It covers config.json's bytes and, for weights read from files, every *.safetensors file of
 * the directory by name, size and header (tensor names, dtypes, shapes and offsets), and the
 * index file when there is one; for random weights, the word "random" and the seed. Hashing
 * every weight byte would take seconds for a large model; a change of weights that keeps every
 * file's size and header is not seen (retrained weights under the same names: restart the
 * group, which starts an empty cache anyway). */
#ifndef PAGODA_MODEL_MODEL_FINGERPRINT_H
#define PAGODA_MODEL_MODEL_FINGERPRINT_H

#include <stdint.h>

#define MODEL_FINGERPRINT_BYTES 16

/* Fills out. load_format: "safetensors" or "random" (seed used only then). Errors: PAGODA_EIO,
 * PAGODA_ENOENT (no config.json), PAGODA_EFORMAT (a header too large), PAGODA_ENOMEM. */
int model_fingerprint(const char *model_dir, const char *load_format, uint64_t seed,
                      uint8_t out[MODEL_FINGERPRINT_BYTES]);

#endif
