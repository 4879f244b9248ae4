/* log.c - leveled logging: "<N>" prefixes under journald, timestamps otherwise. */
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/err.h"

static char g_name[32] = "rkv";
static enum rkv_log_level g_level = RKV_LOG_INFO;
static int g_journal; /* stderr is connected to journald */

/* journald sets JOURNAL_STREAM=dev:ino for the stream it owns */
static int stderr_is_journal(void)
{
    const char *js = getenv("JOURNAL_STREAM");
    struct stat st;
    unsigned long long dev, ino;
    if (!js || sscanf(js, "%llu:%llu", &dev, &ino) != 2)
        return 0;
    if (fstat(STDERR_FILENO, &st) != 0)
        return 0;
    return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

void rkv_log_init(const char *name, enum rkv_log_level level)
{
    snprintf(g_name, sizeof g_name, "%s", name ? name : "rkv");
    g_level = level;
    g_journal = stderr_is_journal();
}

void rkv_log_set_level(enum rkv_log_level level) { g_level = level; }
enum rkv_log_level rkv_log_get_level(void) { return g_level; }

const char *const rkv_log_level_names[] = {"error", "warn", "info", "debug", NULL};

enum rkv_log_level rkv_log_level_at(int index)
{
    static const enum rkv_log_level lv[] = {RKV_LOG_ERROR, RKV_LOG_WARN, RKV_LOG_INFO,
                                            RKV_LOG_DEBUG};
    return index >= 0 && index < 4 ? lv[index] : RKV_LOG_INFO;
}

int rkv_log_parse_level(const char *s, enum rkv_log_level *out)
{
    static const struct { const char *name; enum rkv_log_level lvl; } t[] = {
        {"error", RKV_LOG_ERROR}, {"warn", RKV_LOG_WARN}, {"warning", RKV_LOG_WARN},
        {"info", RKV_LOG_INFO}, {"debug", RKV_LOG_DEBUG},
    };
    for (size_t i = 0; s && i < sizeof t / sizeof t[0]; i++) {
        if (strcmp(s, t[i].name) == 0) {
            *out = t[i].lvl;
            return 0;
        }
    }
    return RKV_EINVAL;
}

static const char *level_tag(enum rkv_log_level l)
{
    switch (l) {
    case RKV_LOG_ERROR: return "error";
    case RKV_LOG_WARN: return "warn";
    case RKV_LOG_INFO: return "info";
    default: return "debug";
    }
}

void rkv_log(enum rkv_log_level level, const char *fmt, ...)
{
    if (level > g_level)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* one event per line: a newline inside the message would split it */
    for (char *p = msg; *p; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';

    char line[2200];
    int n;
    if (g_journal) {
        n = snprintf(line, sizeof line, "<%d>%s\n", (int)level, msg);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        gmtime_r(&ts.tv_sec, &tm);
        n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s[%d] %s: %s\n",
                     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                     tm.tm_sec, ts.tv_nsec / 1000000, g_name, (int)getpid(), level_tag(level),
                     msg);
    }
    if (n > (int)sizeof line - 1)
        n = (int)sizeof line - 1;
    /* a single write keeps lines from different threads whole */
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}

int rkv_ratelimit_ok(struct rkv_ratelimit *rl)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    if (rl->window_start_ms == 0 || now - rl->window_start_ms >= rl->interval_ms) {
        if (rl->suppressed)
            rkv_log(RKV_LOG_WARN, "(suppressed %u similar messages)", rl->suppressed);
        rl->window_start_ms = now;
        rl->printed = 0;
        rl->suppressed = 0;
    }
    if (rl->printed < rl->burst) {
        rl->printed++;
        return 1;
    }
    rl->suppressed++;
    return 0;
}
