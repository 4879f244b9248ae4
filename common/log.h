/* log.h - leveled logging to stderr: journald priority prefixes or timestamps. */
#ifndef RKV_LOG_H
#define RKV_LOG_H

#include <stdint.h>

/* values are syslog priorities so journald's "<N>" prefix is the level */
enum rkv_log_level {
    RKV_LOG_ERROR = 3,
    RKV_LOG_WARN = 4,
    RKV_LOG_INFO = 6,
    RKV_LOG_DEBUG = 7,
};

/* name: the process name printed on each line ("rkvd", "rkv-kvmgr"). */
void rkv_log_init(const char *name, enum rkv_log_level level);
void rkv_log_set_level(enum rkv_log_level level);
enum rkv_log_level rkv_log_get_level(void);
/* {"error", "warn", "info", "debug", NULL}: a CFG_ENUM key's names; the
 * chosen index becomes a level with rkv_log_level_at */
extern const char *const rkv_log_level_names[];
enum rkv_log_level rkv_log_level_at(int index);
/* "error|warn|info|debug" -> level; 0 or RKV_EINVAL */
int rkv_log_parse_level(const char *s, enum rkv_log_level *out);

void rkv_log(enum rkv_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define log_error(...) rkv_log(RKV_LOG_ERROR, __VA_ARGS__)
#define log_warn(...) rkv_log(RKV_LOG_WARN, __VA_ARGS__)
#define log_info(...) rkv_log(RKV_LOG_INFO, __VA_ARGS__)
#define log_debug(...)                                                         \
    do {                                                                       \
        if (rkv_log_get_level() >= RKV_LOG_DEBUG)                              \
            rkv_log(RKV_LOG_DEBUG, __VA_ARGS__);                               \
    } while (0)

/* rate limit for hot paths: at most `burst` lines per `interval_ms`, then a
 * single "suppressed N" note when the window reopens. one per call site. */
struct rkv_ratelimit {
    uint64_t window_start_ms;
    uint32_t interval_ms;
    uint32_t burst;
    uint32_t printed;
    uint32_t suppressed;
};
/* 1 when the caller may log now */
int rkv_ratelimit_ok(struct rkv_ratelimit *rl);

#define log_ratelimited(level, interval_ms_, burst_, ...)                     \
    do {                                                                       \
        static struct rkv_ratelimit rl_ = {0, (interval_ms_), (burst_), 0, 0}; \
        if (rkv_ratelimit_ok(&rl_))                                            \
            rkv_log((level), __VA_ARGS__);                                     \
    } while (0)

#endif
