#include "common/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>

static _Thread_local char detail[512];

const char *pagoda_strerror(int err)
{
    switch (err) {
    case PAGODA_OK:
        return "success";
    case PAGODA_EINVAL:
        return "invalid argument";
    case PAGODA_ENOMEM:
        return "out of memory";
    case PAGODA_EIO:
        return "input/output error";
    case PAGODA_ENOENT:
        return "not found";
    case PAGODA_EUNSUPPORTED:
        return "not supported";
    case PAGODA_EFORMAT:
        return "malformed input";
    case PAGODA_EMISMATCH:
        return "mismatch";
    case PAGODA_ERANGE:
        return "value out of range";
    case PAGODA_ETIMEDOUT:
        return "timed out";
    case PAGODA_ECLOSED:
        return "closed";
    case PAGODA_EEXHAUSTED:
        return "resource exhausted";
    case PAGODA_EPERM:
        return "permission denied";
    case PAGODA_EEXIST:
        return "already exists";
    case PAGODA_EBUSY:
        return "busy";
    case PAGODA_EPROTO:
        return "protocol error";
    case PAGODA_ECUDA:
        return "CUDA error";
    case PAGODA_EINTERNAL:
        return "internal error";
    }
    return "unknown error";
}

int pagoda_from_errno(int errnum)
{
    switch (errnum) {
    case 0:
        return PAGODA_OK;
    case EINVAL:
        return PAGODA_EINVAL;
    case ENOMEM:
        return PAGODA_ENOMEM;
    case ENOENT:
        return PAGODA_ENOENT;
    case EEXIST:
        return PAGODA_EEXIST;
    case EACCES:
    case EPERM:
        return PAGODA_EPERM;
    case ERANGE:
    case EOVERFLOW:
        return PAGODA_ERANGE;
    case ETIMEDOUT:
        return PAGODA_ETIMEDOUT;
    case EBUSY:
        return PAGODA_EBUSY;
    case ENOSPC:
        return PAGODA_EEXHAUSTED;
    default:
        return PAGODA_EIO;
    }
}

int pagoda_error_set(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    return err;
}

const char *pagoda_error_detail(void)
{
    return detail;
}

void pagoda_error_clear(void)
{
    detail[0] = '\0';
}

const char *pagoda_error_message(int err, char *buf, size_t len)
{
    if (detail[0] != '\0')
        snprintf(buf, len, "%s (%s)", detail, pagoda_strerror(err));
    else
        snprintf(buf, len, "%s", pagoda_strerror(err));
    return buf;
}
