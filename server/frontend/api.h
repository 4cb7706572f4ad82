/* api: the routes of the public HTTP API and their handlers (the table,
 * api_routes, is declared in http.h). Requests that only the leader can answer
 * go to the local manager when this node leads, and through the proxy
 * otherwise; reads are served by any node from the table. */
#ifndef WORKD_API_H
#define WORKD_API_H

/* The handlers' own state (a cache of finished-work counts), one per server. */
typedef struct Api Api;

Api *api_new(void);
/* After the HTTP daemon has stopped. */
void api_free(Api *a);

#endif
