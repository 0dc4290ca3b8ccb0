#include "common/log.h"
#include "common/error.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The longest message kept (longer ones are truncated). */
#define LOG_LINE_MAX 1024
/* Call sites tracked for the burst limit: a direct-mapped table keyed by the format string. */
#define LOG_SITES 64

static atomic_int current_level = LOG_INFO;
static char process_name[32] = "pagoda";

static const char *const level_names[] = {"DEBUG", "INFO", "WARN", "ERROR", "OFF"};

struct log_site {
    const char *fmt; /* NULL: empty */
    int64_t window_ms;
    uint32_t printed;    /* in the current window */
    uint64_t suppressed; /* since its last printed line */
};

/* Everything below is guarded by lock. */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static char last_text[LOG_LINE_MAX];
static int last_level = -1;
static uint64_t last_repeats;    /* repeats of last_text not reported yet */
static int64_t last_reported_ms; /* when last_text or its repeat count was printed */
static struct log_site sites[LOG_SITES];

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

static int64_t monotonic_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Writes one line; suffix (may be "") follows the text. */
static void emit(int level, const char *text, const char *suffix)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    fprintf(stderr, "%02d:%02d:%02d.%03ld %-5s %s[%d] %s%s\n", tm.tm_hour, tm.tm_min, tm.tm_sec,
            ts.tv_nsec / 1000000, level_names[level], process_name, (int)getpid(), text, suffix);
}

/* Reports the repeats of the last line, if any. */
static void flush_repeats(int64_t now_ms)
{
    if (last_repeats == 0)
        return;
    char suffix[64];
    snprintf(suffix, sizeof(suffix), " [repeated %llu times]", (unsigned long long)last_repeats);
    emit(last_level, last_text, suffix);
    last_repeats = 0;
    last_reported_ms = now_ms;
}

/* The burst limit of fmt's call site: whether this line may be printed; *suppressed is then the
 * count of lines it suppressed since its last printed one (reported with this one). */
static int site_allows(const char *fmt, int64_t now_ms, uint64_t *suppressed)
{
    uintptr_t h = (uintptr_t)fmt;
    h ^= h >> 17;
    h *= 0x9e3779b97f4a7c15ull;
    struct log_site *s = &sites[(h >> 40) % LOG_SITES];
    *suppressed = 0;
    if (s->fmt != fmt) {
        /* A new site takes the slot and the count of the one it evicts is dropped: two sites
         * flooding at once in one slot escape the burst limit (not the repeat count), which
         * LOG_SITES slots make rare. */
        s->fmt = fmt;
        s->window_ms = now_ms;
        s->printed = 0;
        s->suppressed = 0;
    }
    if (now_ms - s->window_ms >= LOG_SITE_WINDOW_MS) {
        s->window_ms = now_ms;
        s->printed = 0;
    }
    if (s->printed >= LOG_SITE_BURST) {
        s->suppressed++;
        return 0;
    }
    s->printed++;
    *suppressed = s->suppressed;
    s->suppressed = 0;
    return 1;
}

void log_msg(enum log_level level, const char *fmt, ...)
{
    if ((int)level < atomic_load(&current_level) || level >= LOG_OFF)
        return;
    char text[LOG_LINE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);

    pthread_mutex_lock(&lock);
    int64_t now = monotonic_ms();
    if ((int)level == last_level && strcmp(text, last_text) == 0) {
        last_repeats++;
        if (now - last_reported_ms >= LOG_REPEAT_REPORT_MS)
            flush_repeats(now);
        pthread_mutex_unlock(&lock);
        return;
    }
    uint64_t suppressed = 0;
    if (level >= LOG_INFO && !site_allows(fmt, now, &suppressed)) {
        pthread_mutex_unlock(&lock);
        return;
    }
    flush_repeats(now);
    char suffix[64] = "";
    if (suppressed > 0)
        snprintf(suffix, sizeof(suffix), " [%llu similar lines suppressed]",
                 (unsigned long long)suppressed);
    emit((int)level, text, suffix);
    snprintf(last_text, sizeof(last_text), "%s", text);
    last_level = (int)level;
    last_repeats = 0;
    last_reported_ms = now;
    pthread_mutex_unlock(&lock);
}
