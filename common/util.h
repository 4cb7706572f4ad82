/* util: memory that never returns NULL, clocks, ids, a growable buffer and
 * RFC 3339 time stamps. Nothing here knows about servers or workers. */
#ifndef WORKD_UTIL_H
#define WORKD_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

/* ---- memory: abort on exhaustion (there is nothing sensible left to do) ---- */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s); /* NULL in, NULL out */

/* ---- clocks, in milliseconds ---- */
int64_t wall_ms(void); /* since the Unix epoch */
int64_t mono_ms(void); /* monotonic, for intervals */
void sleep_ms(int64_t ms);

/* ---- ids ---- */
#define ID_MAX 128
/* Writes a random UUIDv4 (36 chars + NUL) to out. */
void id_generate(char out[37]);
/* True if s is an id a client may choose (work, worker, key, instance):
 * 1..128 chars of [A-Za-z0-9._:@-], not "." or ".." (which a URL's path
 * resolves away). */
bool id_valid(const char *s);
/* The mark of ids workd makes itself (a schedule's tick, a batch's callback):
 * '~' is URL-safe and never in an id a client or SQL may choose, so no
 * client can take such an id before workd does. */
#define SYSTEM_ID_MARK '~'
/* True if s may name work: an id a client may choose, or one workd made
 * (the same characters and '~'). */
bool work_id_valid(const char *s);

/* Uniform random double in [0, 1), thread-safe, for jitter. */
double rand_unit(void);

/* ---- growable byte buffer; data is always NUL-terminated ---- */
typedef struct SBuf {
    char *data;
    size_t len, cap;
} SBuf;
void sbuf_init(SBuf *b);
void sbuf_free(SBuf *b);
void sbuf_reset(SBuf *b);
void sbuf_append(SBuf *b, const void *data, size_t n);
void sbuf_puts(SBuf *b, const char *s);
void sbuf_printf(SBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the buffer to the caller (free() it) and leaves b empty. */
char *sbuf_steal(SBuf *b);

/* ---- time stamps ---- */
/* Formats ms since the epoch as "2026-01-02T03:04:05.678Z" into out (>= 32 bytes). */
void time_format(int64_t ms, char *out, size_t outlen);
/* Parses RFC 3339 ("2026-01-02T03:04:05Z", fractional seconds and offsets allowed). */
int time_parse(const char *s, int64_t *ms_out, Err *err) WARN_UNUSED;

/* Parses a duration: a plain number is seconds ("1.5"), or a number with a unit
 * "ms", "s", "m", "h", "d" ("250ms", "2s", "7d"). */
int duration_parse(const char *s, int64_t *ms_out) WARN_UNUSED;

/* jemalloc's options for workd-server and workd-worker (built with
 * WORKD_JEMALLOC; each main() defines malloc_conf from this): freed pages go
 * back to the system after 100 ms instead of 10 s, so that a burst of large
 * requests does not stay in the RSS (docs/architecture.md). */
#define WORKD_MALLOC_CONF "dirty_decay_ms:100,muzzy_decay_ms:0"

#endif
