/* Typed access to JSON documents through jansson.
 *
 * Every getter distinguishes a missing key (PAGODA_ENOENT, nothing recorded) from a present key
 * of the wrong type or range (PAGODA_EFORMAT / PAGODA_ERANGE, with a detail naming the key), so
 * that callers can apply defaults to the first and refuse the second. */
#ifndef PAGODA_COMMON_JSON_UTIL_H
#define PAGODA_COMMON_JSON_UTIL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

/* Reads the whole regular file at path (symlinks followed) into a new buffer (*buf, NUL-terminated
 * after *len bytes; the caller frees it), in large reads, refusing files larger than max_bytes
 * (also one that grows past it while read) and anything but a regular file without blocking on
 * it (opened O_NONBLOCK, then checked with fstat). Errors: PAGODA_ENOENT, PAGODA_EPERM,
 * PAGODA_EIO, PAGODA_EINVAL (a directory, a FIFO, a device), PAGODA_ERANGE (too large),
 * PAGODA_ENOMEM; the detail names the path. */
int json_util_read_file(const char *path, size_t max_bytes, char **buf, size_t *len);

/* Reads (json_util_read_file) and parses the JSON file at path, refusing files larger than
 * max_bytes and anything but a regular file (symlinks are followed) without blocking on it. On
 * success *out is a new reference the caller releases with json_decref(). Errors: PAGODA_ENOENT,
 * PAGODA_EPERM, PAGODA_EIO, PAGODA_EINVAL (a directory, a FIFO, a device), PAGODA_ERANGE (too
 * large), PAGODA_EFORMAT (with line and column); the detail names the path. */
int json_util_load_file(const char *path, size_t max_bytes, json_t **out);

/* The same with jansson's decoding flags instead of JSON_REJECT_DUPLICATES: a file that Python's
 * json reads (duplicates, the last kept; integers past 64 bits with JSON_DECODE_INT_AS_REAL,
 * such as Llama 3's tokenizer_config.json's model_max_length). */
int json_util_load_file_with(const char *path, size_t max_bytes, size_t flags, json_t **out);

/* An integer value (a JSON integer, or a real with no fractional part). */
int json_util_get_int(const json_t *obj, const char *key, int64_t *out);

/* A number value (integer or real). */
int json_util_get_number(const json_t *obj, const char *key, double *out);

/* A boolean value. */
int json_util_get_bool(const json_t *obj, const char *key, bool *out);

/* A string value; *out points into obj and lives as long as obj. */
int json_util_get_string(const json_t *obj, const char *key, const char **out);

/* True when key is absent or JSON null. */
bool json_util_is_null(const json_t *obj, const char *key);

/* Writes len bytes of UTF-8 to f as a JSON string literal (quotes, backslashes and control
 * characters escaped; U+0000 as \u0000), for the tools that print JSON lines by hand. */
void json_util_print_string(FILE *f, const char *s, size_t len);

#endif
