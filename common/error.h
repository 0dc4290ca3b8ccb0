/* pagoda's one error space.
 *
 * Every function that can fail returns int: 0 on success or a negative PAGODA_E* code. Codes
 * from NNG, libuv, CUDA and errno are translated where they appear (pagoda_from_errno) and never
 * travel further. Because a code alone cannot name the tensor or the field that was wrong, a
 * failing function may also record a detail message for the calling thread with
 * pagoda_error_set(); the caller reads it with pagoda_error_detail() and prints both. */
#ifndef PAGODA_COMMON_ERROR_H
#define PAGODA_COMMON_ERROR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum pagoda_error {
    PAGODA_OK = 0,
    PAGODA_EINVAL = -1,       /* an argument or a value read from input is invalid */
    PAGODA_ENOMEM = -2,       /* an allocation failed */
    PAGODA_EIO = -3,          /* a read, write or system call failed */
    PAGODA_ENOENT = -4,       /* a file, tensor, id or key does not exist */
    PAGODA_EUNSUPPORTED = -5, /* valid input that pagoda does not support */
    PAGODA_EFORMAT = -6,      /* malformed file or message */
    PAGODA_EMISMATCH = -7,    /* two descriptions of the same thing disagree */
    PAGODA_ERANGE = -8,       /* a value is outside its allowed range */
    PAGODA_ETIMEDOUT = -9,    /* a wait ran out */
    PAGODA_ECLOSED = -10,     /* the peer or object is closed */
    PAGODA_EEXHAUSTED = -11,  /* a bounded resource (queue, blocks, memory budget) is full */
    PAGODA_EPERM = -12,       /* the caller may not do this */
    PAGODA_EEXIST = -13,      /* the object already exists */
    PAGODA_EBUSY = -14,       /* the object is in use */
    PAGODA_EPROTO = -15,      /* a peer broke the protocol */
    PAGODA_ECUDA = -16,       /* a CUDA call failed */
    PAGODA_EINTERNAL = -17,   /* a broken invariant inside pagoda */
};

/* The short description of an error code ("invalid argument"); never NULL. */
const char *pagoda_strerror(int err);

/* Translates an errno value into a PAGODA_E* code. */
int pagoda_from_errno(int errnum);

/* Records a detail message for the calling thread (printf-style, truncated at 512 bytes) and
 * returns err, so that a failing function can write `return pagoda_error_set(PAGODA_EINVAL,
 * "tensor %s: ...", name);`. */
int pagoda_error_set(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The calling thread's last detail message, or "" when none was set since the last clear. The
 * string is owned by the thread and overwritten by the next pagoda_error_set(). */
const char *pagoda_error_detail(void);

/* Forgets the calling thread's detail message. */
void pagoda_error_clear(void);

/* Formats "<detail>" when a detail is set, else "<strerror(err)>", into buf. Returns buf. */
const char *pagoda_error_message(int err, char *buf, size_t len);

#ifdef __cplusplus
}
#endif

#endif
