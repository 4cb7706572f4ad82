/* Fuzzes how `workd tail` reads a results stream (cli/sse.c): whatever a
 * server or a proxy sends, the parser ends every event as a C string and
 * keeps a Last-Event-ID that fits a cursor of every shard, and cutting the bytes into chunks
 * anywhere (as the network does) changes nothing it reports. The first byte
 * picks where the input is cut. */
#include "fuzz.h"

#include "sse.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    return 0;
}

typedef struct Seen {
    SBuf all; /* every event as "id|event|data\n" */
    size_t events;
} Seen;

static bool on_event(const SseEvent *ev, void *ud)
{
    Seen *s = ud;
    FUZZ_CHECK(strlen(ev->id) < SSE_ID_MAX, "a Last-Event-ID of %zu bytes", strlen(ev->id));
    FUZZ_CHECK(ev->event[0], "an event without a type");
    sbuf_printf(&s->all, "%s|%s|%s\n", ev->id, ev->event, ev->data);
    s->events++;
    return false;
}

/* Feeds data[0, size) in pieces of at most step bytes (0: all at once). */
static void parse(const uint8_t *data, size_t size, size_t step, Seen *seen, char *last_id,
                  size_t last_len)
{
    SseParser p;
    sse_init(&p);
    sbuf_init(&seen->all);
    seen->events = 0;
    for (size_t at = 0; at < size;) {
        size_t n = step && size - at > step ? step : size - at;
        if (sse_feed(&p, (const char *)data + at, n, on_event, seen))
            break;
        at += n;
    }
    snprintf(last_id, last_len, "%s", p.last_id);
    sse_free(&p);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    size_t step = 1 + data[0] % 17;
    Seen whole, cut;
    char id_whole[SSE_ID_MAX], id_cut[SSE_ID_MAX];
    parse(data + 1, size - 1, 0, &whole, id_whole, sizeof id_whole);
    parse(data + 1, size - 1, step, &cut, id_cut, sizeof id_cut);
    FUZZ_CHECK(whole.events == cut.events, "%zu events whole, %zu in chunks of %zu", whole.events,
               cut.events, step);
    FUZZ_CHECK(whole.all.len == cut.all.len &&
                   (!whole.all.len || !memcmp(whole.all.data, cut.all.data, whole.all.len)),
               "the events differ when the input comes in chunks of %zu", step);
    FUZZ_CHECK(!strcmp(id_whole, id_cut), "Last-Event-ID '%s' whole, '%s' in chunks", id_whole,
               id_cut);
    sbuf_free(&whole.all);
    sbuf_free(&cut.all);
    return 0;
}
