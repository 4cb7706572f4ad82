/* log: see log.h. Settings are written once by log_setup() before any thread
 * starts and only read afterwards. */
#include "log.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

static struct {
    char node[64];
    char role[64];
    LogLevel min;
    bool json;
} cfg = {"-", "-", LOG_INFO, false};

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static const char *level_names[] = {"debug", "info", "warn", "error"};
_Static_assert(sizeof level_names / sizeof level_names[0] == LOG_ERROR + 1, "a name per LogLevel");

void log_setup(const char *node, const char *role, LogLevel min_level, bool json)
{
    snprintf(cfg.node, sizeof cfg.node, "%s", node ? node : "-");
    snprintf(cfg.role, sizeof cfg.role, "%s", role ? role : "-");
    cfg.min = min_level;
    cfg.json = json;
}

int log_level_parse(const char *s, LogLevel *out)
{
    for (int i = 0; i < 4; i++)
        if (strcasecmp(s, level_names[i]) == 0) {
            *out = (LogLevel)i;
            return 0;
        }
    return -1;
}

bool log_enabled(LogLevel level)
{
    return level >= cfg.min;
}

void log_emit(LogLevel level, const char *file, int line, const char *fmt, ...)
{
    if (level < cfg.min)
        return;
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);

    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    size_t n = strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(when + n, sizeof when - n, ".%03ldZ", ts.tv_nsec / 1000000);
    const char *base = strrchr(file, '/');
    base = base ? base + 1 : file;

    pthread_mutex_lock(&out_lock);
    if (cfg.json) {
        char at[160];
        snprintf(at, sizeof at, "%s:%d", base, line);
        json_t *o =
            json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "ts", when, "level", level_names[level],
                      "node", cfg.node, "role", cfg.role, "msg", msg, "at", at);
        if (o) {
            char *s = json_dumps(o, JSON_COMPACT);
            if (s) {
                fprintf(stderr, "%s\n", s);
                free(s);
            }
            json_decref(o);
        }
    } else {
        fprintf(stderr, "%s %-5s [%s %s] %s (%s:%d)\n", when, level_names[level], cfg.node,
                cfg.role, msg, base, line);
    }
    fflush(stderr);
    pthread_mutex_unlock(&out_lock);
}
