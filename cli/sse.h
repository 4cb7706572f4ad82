/* sse: a parser of text/event-stream (the WHATWG rules that workd's streams
 * use: `id:`, `event:`, `data:` lines, comments, blank-line dispatch). Pure:
 * bytes in, events out, no I/O. */
#ifndef WORKD_CLI_SSE_H
#define WORKD_CLI_SSE_H

#include <stdbool.h>
#include <stddef.h>

#include "shard.h"
#include "util.h"

/* The longest line kept, and the longest data of one event (its data lines
 * joined): a result's data line can be as large as a result the server
 * accepts (a few MiB); a longer one is an error, not a memory grab. */
#define SSE_LINE_MAX (16u << 20)

/* The longest event id kept, with its NUL. An id is an opaque cursor: each
 * shard's last seq joined by '.' ("812" with one shard, "812.0.77.1204" with
 * four), so at most SHARDS_MAX numbers of 19 digits and their dots. A longer
 * id is ignored, as one with a NUL is. */
#define SSE_ID_MAX (SHARDS_MAX * 20 + 1)

typedef struct SseEvent {
    const char *id;    /* the stream's last event id after this event ("" if none yet) */
    const char *event; /* the event type ("message" when the block named none) */
    const char *data;  /* the data lines joined with '\n' */
} SseEvent;

/* Called for each dispatched event; returns true to stop parsing. The event's
 * strings are valid during the call only. */
typedef bool (*SseFn)(const SseEvent *ev, void *ud);

typedef struct SseParser {
    SBuf line, data;
    char event[64];
    char last_id[SSE_ID_MAX]; /* kept across events and reconnects, for Last-Event-ID */
    bool has_data, skip_lf, too_long;
} SseParser;

void sse_init(SseParser *p);
void sse_free(SseParser *p);
/* Forgets a half-read block (a connection ended in the middle of it); keeps the
 * last event id. */
void sse_reset(SseParser *p);

/* Parses n bytes. Returns true if fn asked to stop (the rest of buf is not
 * parsed) or a line or an event's data passed SSE_LINE_MAX (p->too_long is
 * then set). */
bool sse_feed(SseParser *p, const char *buf, size_t n, SseFn fn, void *ud);

/* Whether s is an event id as workd writes one (for a user's --after): 1 to
 * SHARDS_MAX numbers of 1 to 19 digits joined by single dots. */
bool sse_id_valid(const char *s);

#endif
