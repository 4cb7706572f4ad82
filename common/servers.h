/* servers: the server URLs a client knows (workers, the demo clients) and the
 * one it uses now. A client moves to the next one when the one in use cannot be
 * reached, so that it keeps going through another node when one dies; any node
 * forwards to the leader, so which one answers does not matter.
 *
 * Thread-safe: the position in use is behind the list's own lock. */
#ifndef WORKD_SERVERS_H
#define WORKD_SERVERS_H

#include <stdbool.h>
#include <stddef.h>

#include "err.h"

/* Longest base URL accepted, so that base + a worker path fits SERVERS_URL_MAX. */
#define SERVERS_BASE_MAX 255
#define SERVERS_URL_MAX 512

typedef struct Servers Servers;

/* Reads a comma-separated list of http:// or https:// base URLs (a trailing
 * slash is dropped). what names the setting in err ("--server"). Returns NULL
 * (err says which URL is wrong) on an empty list or a bad URL. The caller frees
 * it with servers_free. */
Servers *servers_new(const char *list, const char *what, Err *err) WARN_UNUSED;
void servers_free(Servers *s);

size_t servers_count(const Servers *s);
/* The whole list as given, comma-separated, for log lines; valid as long as s. */
const char *servers_text(const Servers *s);

/* Writes the base URL in use followed by path into out (SERVERS_URL_MAX bytes
 * always suffice for a path of up to 256 bytes) and returns its position, to
 * hand to servers_unreachable if the request gets no answer. */
size_t servers_url(Servers *s, const char *path, char *out, size_t outlen);

/* The server at pos gave no HTTP answer. If it is still the one in use, the
 * next one (in a circle) becomes the one in use and its base URL is written to
 * next: returns true (the caller may say so). Returns false when another thread
 * moved on already or there is only one server. */
bool servers_unreachable(Servers *s, size_t pos, char *next, size_t nextlen);

#endif
