/* Leveled logging to standard error.
 *
 * One line per message: "<time> <level> <process>[<pid>] <message>". The level is process-wide
 * (log_set_level); messages below it cost one comparison. Thread-safe: each line is written with
 * one fprintf call. */
#ifndef PAGODA_COMMON_LOG_H
#define PAGODA_COMMON_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3, LOG_OFF = 4 };

/* Names the process in every line (the string is copied, truncated at 31 bytes). */
void log_set_name(const char *name);

/* Sets the lowest level that is printed (LOG_INFO by default). */
void log_set_level(enum log_level level);

enum log_level log_get_level(void);

/* Parses "debug", "info", "warn" or "error" (or "off"). Returns 0, or PAGODA_EINVAL. */
int log_level_parse(const char *text, enum log_level *out);

/* Prints one line at the given level when the level is enabled. */
void log_msg(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define log_debug(...) log_msg(LOG_DEBUG, __VA_ARGS__)
#define log_info(...) log_msg(LOG_INFO, __VA_ARGS__)
#define log_warn(...) log_msg(LOG_WARN, __VA_ARGS__)
#define log_error(...) log_msg(LOG_ERROR, __VA_ARGS__)

#endif
