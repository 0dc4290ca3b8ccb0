/* NNG's error codes as PAGODA_E* codes: the one translation for the processes (wire/) and for
 * libpagoda, which links NNG but not the rest of wire/. Header-only for that reason. */
#ifndef PAGODA_WIRE_WIRE_ERROR_H
#define PAGODA_WIRE_WIRE_ERROR_H

#include "common/error.h"

#include <nng/nng.h>

/* Translates an NNG error into a PAGODA_E* code, with a detail naming what failed; 0 stays 0. */
static inline int wire_error(int nng_rv, const char *what)
{
    int code;
    switch (nng_rv) {
    case 0:
        return 0;
    case NNG_ENOMEM:
        code = PAGODA_ENOMEM;
        break;
    case NNG_ETIMEDOUT:
        code = PAGODA_ETIMEDOUT;
        break;
    case NNG_EAGAIN:
        code = PAGODA_EBUSY;
        break;
    case NNG_ECLOSED:
    case NNG_ECONNREFUSED:
    case NNG_ECONNRESET:
        code = PAGODA_ECLOSED;
        break;
    case NNG_EINVAL:
    case NNG_EADDRINVAL:
    case NNG_ENOTSUP: /* e.g. an address of a transport NNG does not have */
        code = PAGODA_EINVAL;
        break;
    default:
        code = PAGODA_EIO;
    }
    return pagoda_error_set(code, "%s: %s", what, nng_strerror(nng_rv));
}

#endif
