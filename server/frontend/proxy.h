/* proxy: forwards requests that only the leader can answer, from a node that
 * is not the leader, over libcurl with keep-alive connections. While the leader
 * is unknown or failing over it retries with backoff until a deadline, so a
 * client's request during a failover is delayed, not failed. Forwarded requests
 * carry X-Workd-Forwarded ("secret=CLUSTER-SECRET; node=NODE-ID"), and a node
 * never forwards such a request again. */
#ifndef WORKD_PROXY_H
#define WORKD_PROXY_H

#include "err.h"
#include "http.h"
#include "leaderinfo.h"
#include "metrics.h"

typedef struct Proxy Proxy;

typedef struct ProxyConfig {
    LeaderInfo *leader;         /* where to forward; marked suspect when a forward fails */
    Metrics *metrics;           /* proxied, proxy_retries, proxy_failures */
    int64_t deadline_ms;        /* retry until this long after the request came (then 503) */
    int64_t pull_wait_max_ms;   /* a forwarded pull may wait this long at the leader */
    int64_t max_reply_bytes;    /* a longer reply from the leader is answered 502 */
    const char *cluster_secret; /* proves the forward to the leader ("": none); borrowed */
    const char *node_id;        /* named in X-Workd-Forwarded; borrowed */
} ProxyConfig;

Proxy *proxy_start(const ProxyConfig *cfg, Err *err) WARN_UNUSED;
/* Answers everything in flight with 503, then joins; later forwards are
 * answered 503 at once. proxy_free after the HTTP daemon has stopped. */
void proxy_stop(Proxy *p);
void proxy_free(Proxy *p);
/* Forwards r (already parked) to the leader of shard `shard`, naming the
 * shard (X-Workd-Shard). body (may be NULL: use the request's own) is taken
 * over by the proxy. The answer resumes r. */
void proxy_forward(Proxy *p, int shard, Req *r, char *body);

/* What a call's leader answered (status and body, valid during the callback
 * only), or why none did (err, with its status: no leader in time, the node
 * stopping, the client gone, a reply too large). */
typedef struct ProxyReply {
    int status;
    const char *body;
    size_t len;
    const Err *err; /* NULL: the leader's answer */
} ProxyReply;
typedef void (*ProxyDone)(void *ud, const ProxyReply *reply);
/* As proxy_forward, but the outcome goes to done (on the proxy's thread, or
 * the caller's when the proxy is stopping), and r is not answered: a part of
 * r's work sent to one shard's leader, which may be this node. r is read
 * only during this call (its path, query and credentials are copied): the
 * call may outlive it. */
void proxy_call(Proxy *p, int shard, Req *r, char *body, ProxyDone done, void *ud);
/* As proxy_call, bounded: no answer of the shard's leader within within_ms
 * (a leader stuck on its database, say) ends the call with 504
 * shard-unavailable, and the shard counts as stuck (proxy_shard_stuck) for
 * PROXY_STUCK_MS or until one of its leader's answers comes. within_ms 0:
 * the proxy's deadline, as proxy_call. */
#define PROXY_STUCK_MS 5000
void proxy_call_within(Proxy *p, int shard, Req *r, char *body, int64_t within_ms, ProxyDone done,
                       void *ud);
/* Whether a bounded call to shard's leader went unanswered a moment ago.
 * Any thread. */
bool proxy_shard_stuck(Proxy *p, int shard);

#endif
