/* httpc: a small blocking HTTP client over one libcurl easy handle, so that a
 * thread keeps its keep-alive connection. One HttpClient per thread. */
#ifndef WORKD_HTTPC_H
#define WORKD_HTTPC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct HttpClient HttpClient;

typedef struct HttpResp {
    long status; /* 0 if no HTTP answer was received */
    char *body;  /* NUL-terminated, owned by the response */
    size_t len;
    int64_t retry_after_ms; /* from Retry-After, -1 if absent */
    char location[256];
} HttpResp;

/* Call once in main() before threads start, and httpc_global_cleanup() at exit. */
void httpc_global_init(void);
void httpc_global_cleanup(void);

/* token may be NULL (no Authorization header). The client copies it. */
HttpClient *httpc_new(const char *token);
void httpc_free(HttpClient *c);

/* Makes requests on c give up, as a transport failure (err type "cancelled"),
 * within about a second of *flag becoming true; a request is not even started
 * while it is true. For threads that must stop in the middle of a long-poll.
 * flag is borrowed and must outlive c; NULL removes it. */
void httpc_set_cancel(HttpClient *c, const atomic_bool *flag);

/* Performs METHOD url with an optional JSON body (NULL: none). Waits at most
 * timeout_ms for the whole exchange. Returns 0 when an HTTP answer arrived
 * (whatever its status) and -1 on a transport failure (err says why).
 * The caller frees out with httpc_resp_free. */
int httpc_request(HttpClient *c, const char *method, const char *url, const char *json_body,
                  int64_t timeout_ms, HttpResp *out, Err *err) WARN_UNUSED;
void httpc_resp_free(HttpResp *r);

#endif
