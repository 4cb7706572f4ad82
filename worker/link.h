/* link: the worker's view of its connection to the servers it knows. Requests
 * go to the server in use (servers.h); one that gets no answer moves every
 * thread on to the next server. The state is logged once per change ("server
 * unreachable: ...", "server reachable again"), never per retry; retries wait
 * with capped exponential backoff and jitter. Also the monotonic
 * condition-variable waits the worker's threads sleep in. */
#ifndef WORKD_LINK_H
#define WORKD_LINK_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "httpc.h"
#include "servers.h"

/* ---- link state, shared by every thread that talks to the server ---- */

/* What a request was for: refusals are tracked per channel, so that one
 * endpoint failing while another works does not flap the log. */
typedef enum { LINK_HEARTBEAT, LINK_PULL, LINK_REPORTS, LINK_CHANNELS } LinkChannel;

typedef struct Link {
    Servers *servers;            /* borrowed, outlives the link; thread-safe itself */
    pthread_mutex_t lock;        /* guards the fields below */
    bool unreachable;            /* the last request got no HTTP answer */
    long refused[LINK_CHANNELS]; /* HTTP status a channel was last refused with, 0: none */
} Link;

/* servers is borrowed and must outlive the link. */
void link_init(Link *l, Servers *servers);
void link_destroy(Link *l);
/* Writes the URL of path on the server in use into out (SERVERS_URL_MAX bytes)
 * and returns that server's position, for link_unreachable. */
size_t link_url(Link *l, const char *path, char *out, size_t outlen);
/* A request on ch got the answer it wanted. */
void link_ok(Link *l, LinkChannel ch);
/* A request on ch to the server at pos (from link_url) got no HTTP answer (why:
 * the transport error): the next request goes to the next server, if any. */
void link_unreachable(Link *l, LinkChannel ch, size_t pos, const char *why);
/* A request on ch got an HTTP answer that is an error (or unreadable). */
void link_refused(Link *l, LinkChannel ch, long status, const char *why);

/* Describes a failed exchange in out: the transport error in err when resp is
 * NULL or has status 0, else "HTTP 503: <detail of the problem+json body>". */
void link_describe(const HttpResp *resp, const Err *err, char *out, size_t outlen);

/* ---- backoff ---- */

typedef struct Backoff {
    int64_t base_ms, cap_ms, cur_ms;
} Backoff;

void backoff_init(Backoff *b, int64_t base_ms, int64_t cap_ms);
/* The next delay: uniform in [d/2, d] where d doubles from base to cap. */
int64_t backoff_next(Backoff *b);
void backoff_reset(Backoff *b);

/* ---- waiting ---- */

/* Initialises c to time its waits with the monotonic clock. */
void cond_init_mono(pthread_cond_t *c);
/* Waits on c (m held) until signalled or until the mono_ms() time deadline_ms;
 * deadline_ms < 0 waits without a time limit. Spurious wake-ups happen: callers
 * loop on their own condition. */
void cond_wait_until(pthread_cond_t *c, pthread_mutex_t *m, int64_t deadline_ms);

#endif
