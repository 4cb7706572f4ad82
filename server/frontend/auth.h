/* auth: bearer tokens with scopes. Tokens come from configuration (a file
 * and/or WORKD_TOKENS), are compared in constant time and are never logged.
 * With no token configured the API is open (and the server says so loudly). */
#ifndef WORKD_AUTH_H
#define WORKD_AUTH_H

#include <stdbool.h>
#include <stddef.h>

#include "err.h"

enum {
    SCOPE_NONE = 0,   /* open route (health) */
    SCOPE_CLIENT = 1, /* submit and read work, follow results */
    SCOPE_WORKER = 2, /* the worker API */
    SCOPE_ADMIN = 4,  /* cancel, retry, cluster view, metrics; implies the others */
};

typedef struct Auth Auth;

/* Parses "scopes:token" entries separated by whitespace or newlines (inline)
 * and the lines of file (may be NULL; '#' starts a comment). Scopes are a
 * comma-separated subset of client, worker, admin. */
Auth *auth_load(const char *inline_tokens, const char *file, Err *err) WARN_UNUSED;
void auth_free(Auth *a);
bool auth_enabled(const Auth *a);
size_t auth_count(const Auth *a);

/* Checks a request needing `scope` with the Authorization header value (or an
 * access_token query value, for EventSource which cannot send headers).
 * Returns 0, or -1 with err 401 (no or unknown token) / 403 (lacks scope). */
int auth_check(const Auth *a, int scope, const char *authorization, const char *access_token,
               Err *err) WARN_UNUSED;

/* ---- the cluster secret (forwarding between nodes) ---- */
#define AUTH_SECRET_MIN 16
#define AUTH_SECRET_MAX 255
/* Whether given is secret, in time that depends only on secret's length. */
bool auth_secret_matches(const char *secret, const char *given);

/* ---- tokens bound to worker ids ----
 * An entry may bind its token to worker ids: "worker[gpu-*,w7]:TOKEN" may act
 * only for worker id w7 and ids starting with gpu- ('*' ends a prefix). */
typedef enum {
    AUTH_WORKER_DENIED, /* the token is bound to other worker ids */
    AUTH_WORKER_SHARED, /* an unbound worker token: it may act only as a registered instance */
    AUTH_WORKER_OWNS,   /* bound to this id, an admin token, or an open server: it may claim it */
} AuthWorkerAccess;

/* What the request's token (as for auth_check, which must have passed) may do
 * with worker_id. */
AuthWorkerAccess auth_worker_access(const Auth *a, const char *authorization,
                                    const char *access_token, const char *worker_id);

#endif
