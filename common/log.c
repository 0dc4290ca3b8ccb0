#include "common/log.h"
#include "common/error.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static atomic_int current_level = LOG_INFO;
static char process_name[32] = "pagoda";

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};

void log_set_name(const char *name)
{
    snprintf(process_name, sizeof(process_name), "%s", name);
}

void log_set_level(enum log_level level)
{
    atomic_store(&current_level, (int)level);
}

enum log_level log_get_level(void)
{
    return (enum log_level)atomic_load(&current_level);
}

int log_level_parse(const char *text, enum log_level *out)
{
    static const char *const names[] = {"debug", "info", "warn", "error", "off"};
    for (int i = 0; i < 5; i++) {
        if (strcmp(text, names[i]) == 0) {
            *out = (enum log_level)i;
            return 0;
        }
    }
    return pagoda_error_set(PAGODA_EINVAL, "unknown log level '%s' (debug, info, warn, error, off)",
                            text);
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    if ((int)level < atomic_load(&current_level) || level >= LOG_OFF)
        return;
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %-5s %s[%d] %s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, level_names[level], process_name, (int)getpid(), text);
}
