/* Parsing of command-line values: whole strings only, range-checked, with a detail message
 * naming the flag on failure. */
#ifndef PAGODA_COMMON_PARSE_H
#define PAGODA_COMMON_PARSE_H

#include <stddef.h>
#include <stdint.h>

/* Parses a decimal integer in [min, max] ([+-]?[0-9]+, no white space). Errors: PAGODA_EINVAL
 * (not a number), PAGODA_ERANGE. */
int parse_i64(const char *flag, const char *text, int64_t min, int64_t max, int64_t *out);

/* Parses a finite floating-point number in [min, max], in decimal notation (no white space,
 * hexadecimal, inf or nan; a number past or below a double's range, 1e400 or 1e-400, is out of
 * range). Same errors as parse_i64. */
int parse_f64(const char *flag, const char *text, double min, double max, double *out);

/* parse_f64 into a float: also PAGODA_ERANGE for a number other than 0 that a float holds as 0
 * (1e-50; max must be within a float's range). */
int parse_f32(const char *flag, const char *text, double min, double max, float *out);

/* Parses "on" (1) or "off" (0) into *out. Errors: PAGODA_EINVAL (anything else). */
int parse_on_off(const char *flag, const char *text, int *out);

/* Parses a comma-separated list of integers in [min, max] ("1,2,3"), at most cap of them.
 * On success *out is a new array (the caller frees it) and *count its length (at least 1).
 * Errors: PAGODA_EINVAL, PAGODA_ERANGE (a value or the count), PAGODA_ENOMEM. */
int parse_i32_list(const char *flag, const char *text, int32_t min, int32_t max, size_t cap,
                   int32_t **out, size_t *count);

/* Parses "ID:VALUE" (a --logit-bias pair): ID a decimal integer in [0, INT32_MAX], VALUE a finite
 * number in [-limit, limit]. Same errors as parse_i64 (PAGODA_EINVAL for text that is not
 * ID:VALUE). */
int parse_id_value(const char *flag, const char *text, double limit, int32_t *id, double *value);

#endif
