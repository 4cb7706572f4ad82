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
Auth *auth_load(const char *inline_tokens, const char *file, Err *err);
void auth_free(Auth *a);
bool auth_enabled(const Auth *a);
size_t auth_count(const Auth *a);

/* Checks a request needing `scope` with the Authorization header value (or an
 * access_token query value, for EventSource which cannot send headers).
 * Returns 0, or -1 with err 401 (no or unknown token) / 403 (lacks scope). */
int auth_check(const Auth *a, int scope, const char *authorization, const char *access_token,
               Err *err) WARN_UNUSED;

#endif
