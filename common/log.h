/* Leveled logging to standard error.
 *
 * One line per message: "<time> <level> <process>[<pid>] <message>". The level is process-wide
 * (log_set_level); messages below it cost one comparison. Thread-safe: each line is written with
 * one fprintf call, under a lock.
 *
 * Rate limits, so that a loop that logs cannot fill a disk (and hide what came before it):
 *  - the same line (same level and text) repeated back to back is printed once; the repeats are
 *    counted and reported as "<line> [repeated N times]" when another line comes, or at most
 *    every LOG_REPEAT_REPORT_MS while the repetition lasts;
 *  - at info and above, one call site (format string) prints at most LOG_SITE_BURST lines per
 *    LOG_SITE_WINDOW_MS; the lines it makes beyond that are counted and reported with its next
 *    printed line as "[N similar lines suppressed]". Debug lines are never limited (they are
 *    off unless asked for, one per step by design). */
#ifndef PAGODA_COMMON_LOG_H
#define PAGODA_COMMON_LOG_H

enum log_level { LOG_DEBUG = 0, LOG_INFO = 1, LOG_WARN = 2, LOG_ERROR = 3, LOG_OFF = 4 };

#define LOG_REPEAT_REPORT_MS 10000
#define LOG_SITE_BURST 20
#define LOG_SITE_WINDOW_MS 1000

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
