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
#include "server.h"

typedef struct Proxy Proxy;

Proxy *proxy_start(Server *s, Err *err);
/* Answers everything in flight with 503, then joins; later forwards are
 * answered 503 at once. proxy_free after the HTTP daemon has stopped. */
void proxy_stop(Proxy *p);
void proxy_free(Proxy *p);
/* Forwards r (already parked) to the leader. body (may be NULL: use the
 * request's own) is taken over by the proxy. The answer resumes r. */
void proxy_forward(Proxy *p, Req *r, char *body);

#endif
