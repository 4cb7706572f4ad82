/* cursor: a place in the logs of every shard, as a results stream, a
 * webhook subscription and a listing resume from it. Its text is each
 * shard's last seq in shard order, joined by '.': "812" in a cluster of one
 * shard (today's event ids), "812.0.77.1204" in one of four. Clients treat it
 * as opaque; order is per shard. Pure: no I/O. */
#ifndef WORKD_CURSOR_H
#define WORKD_CURSOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "shard.h"

/* The longest text a cursor has: SHARDS_MAX numbers of 19 digits, the dots,
 * the NUL. */
#define CURSOR_TEXT_MAX (SHARDS_MAX * 20 + 1)

typedef struct Cursor {
    int n;                   /* shards */
    int64_t seq[SHARDS_MAX]; /* every event of shard s up to seq[s] is behind it */
} Cursor;

/* A cursor of n shards before everything (every seq 0). */
void cursor_zero(Cursor *c, int n);
/* Reads text for a cluster of n shards. Fewer components than n: the
 * missing shards are at 0 (a cursor from before the cluster grew); more: 400
 * invalid-cursor, as is anything but 1 to n numbers of 1 to 19 digits joined
 * by single dots. */
int cursor_parse(const char *text, int n, Cursor *out, Err *err) WARN_UNUSED;
/* Writes c's text into out (at least CURSOR_TEXT_MAX bytes); returns its length. */
size_t cursor_format(const Cursor *c, char *out, size_t len);
/* Whether the event seq of shard s is behind c. */
bool cursor_covers(const Cursor *c, int s, int64_t seq);
/* Moves shard s of c up to seq (never back). */
void cursor_advance(Cursor *c, int s, int64_t seq);
/* Whether every shard of a is at or behind b's (a is nothing new after b). */
bool cursor_le(const Cursor *a, const Cursor *b);

#endif
