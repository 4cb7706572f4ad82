/* log: one line per event that matters, as text or JSON, to standard error.
 * The node and role are set once at start; the rest is per call. */
#ifndef WORKD_LOG_H
#define WORKD_LOG_H

#include <stdbool.h>

#include "err.h"

typedef enum { LOG_DEBUG = 0, LOG_INFO, LOG_WARN, LOG_ERROR } LogLevel;

/* ---- setup (call once, before threads start) ---- */
void log_setup(const char *node, const char *role, LogLevel min_level, bool json);
/* Parses "debug", "info", "warn", "error"; returns -1 if unknown. */
int log_level_parse(const char *s, LogLevel *out) WARN_UNUSED;

/* ---- emitting (thread-safe) ---- */
void log_emit(LogLevel level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
bool log_enabled(LogLevel level);

#define log_debug(...) log_emit(LOG_DEBUG, __FILE__, __LINE__, __VA_ARGS__)
#define log_info(...) log_emit(LOG_INFO, __FILE__, __LINE__, __VA_ARGS__)
#define log_warn(...) log_emit(LOG_WARN, __FILE__, __LINE__, __VA_ARGS__)
#define log_error(...) log_emit(LOG_ERROR, __FILE__, __LINE__, __VA_ARGS__)

#endif
