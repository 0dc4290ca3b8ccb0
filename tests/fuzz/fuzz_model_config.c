/* libFuzzer target: config.json (model/model_config.h), the bytes as the file's contents,
 * parsed as json_util_load_file parses a file.
 *
 * A document is refused with an error of the contract, or parsed into a configuration that
 * model_config_validate accepts and that survives model_config_to_json and a second parse
 * unchanged. */
#include "common/error.h"
#include "model/model_config.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > MODEL_CONFIG_MAX_BYTES)
        return 0;
    json_error_t jerr;
    json_t *root = json_loadb((const char *)data, size, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return 0;
    struct model_config c;
    int rc = model_config_parse(root, &c);
    json_decref(root);
    if (rc != 0) {
        if (rc != PAGODA_EUNSUPPORTED && rc != PAGODA_EFORMAT && rc != PAGODA_ERANGE &&
            rc != PAGODA_EMISMATCH && rc != PAGODA_ENOMEM)
            abort();
        return 0;
    }
    if (model_config_validate(&c) != 0)
        abort();
    /* What pagoda-mkmodel writes of it reads back as the same configuration. */
    for (int legacy = 0; legacy < 2; legacy++) {
        json_t *out = NULL;
        if (model_config_to_json(&c, legacy, &out) != 0)
            abort();
        struct model_config again;
        rc = model_config_parse(out, &again);
        json_decref(out);
        if (rc != 0)
            abort();
    }
    return 0;
}
