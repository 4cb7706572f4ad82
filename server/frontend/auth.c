/* auth: see auth.h. */
#include "auth.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "config.h"
#include "util.h"

#define TOKEN_MAX 256

typedef struct Token {
    char value[TOKEN_MAX];
    size_t len;
    int scopes;
    char **workers; /* worker-id patterns it is bound to ("gpu-*": a prefix); NULL: any */
} Token;

struct Auth {
    Token *tokens;
    size_t n;
};

WARN_UNUSED static int parse_scopes(const char *s, size_t len, int *out, Err *err)
{
    *out = 0;
    const char *p = s, *end = s + len;
    while (p < end) {
        const char *c = memchr(p, ',', (size_t)(end - p));
        size_t n = c ? (size_t)(c - p) : (size_t)(end - p);
        if (n == 6 && !strncmp(p, "client", 6))
            *out |= SCOPE_CLIENT;
        else if (n == 6 && !strncmp(p, "worker", 6))
            *out |= SCOPE_WORKER;
        else if (n == 5 && !strncmp(p, "admin", 5))
            *out |= SCOPE_ADMIN | SCOPE_CLIENT | SCOPE_WORKER;
        else
            return err_set(err, 400, "bad-config",
                           "tokens: unknown scope '%.*s' (client, worker, admin)", (int)n, p);
        p += n + (c ? 1 : 0);
    }
    if (!*out)
        return err_set(err, 400, "bad-config", "tokens: an entry has no scope");
    return 0;
}

/* Parses the comma-separated worker-id patterns of "worker[...]" into *out. */
WARN_UNUSED static int parse_workers(const char *s, size_t len, char ***out, const char *source,
                                     Err *err)
{
    char *list = xmalloc(len + 1);
    memcpy(list, s, len);
    list[len] = '\0';
    char **v = strv_split(list);
    free(list);
    size_t n = strv_len(v);
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(v[i]);
        char id[ID_MAX + 2];
        snprintf(id, sizeof id, "%.*s", (int)(l && v[i][l - 1] == '*' ? l - 1 : l), v[i]);
        if (l > ID_MAX || !id_valid(id)) {
            err_set(err, 400, "bad-config",
                    "%s: '%s' is not a worker id (or a prefix of one followed by '*')", source,
                    v[i]);
            strv_free(v);
            return -1;
        }
    }
    if (!n) {
        strv_free(v);
        return err_set(err, 400, "bad-config", "%s: '[]' binds a token to no worker id", source);
    }
    *out = v;
    return 0;
}

/* Adds every "scopes:token" word of text. */
WARN_UNUSED static int add_entries(Auth *a, const char *text, const char *source, Err *err)
{
    const char *p = text;
    while (*p) {
        while (*p && isspace((unsigned char)*p))
            p++;
        if (*p == '#') {
            while (*p && *p != '\n')
                p++;
            continue;
        }
        const char *w = p;
        while (*p && !isspace((unsigned char)*p))
            p++;
        size_t n = (size_t)(p - w);
        if (!n)
            break;
        const char *colon = memchr(w, ':', n);
        /* SCOPES[IDS]:TOKEN binds the token to worker ids, which may hold ':'. */
        const char *open = memchr(w, '[', n), *close = NULL;
        if (open && (!colon || open < colon)) {
            close = memchr(open, ']', (size_t)(w + n - open));
            colon = close && close + 1 < w + n && close[1] == ':' ? close + 1 : NULL;
        }
        if (!colon || colon == w || colon == w + n - 1)
            return err_set(err, 400, "bad-config",
                           "%s: entries are SCOPES:TOKEN or SCOPES[WORKER-IDS]:TOKEN, e.g. "
                           "client,worker:s3cret or worker[gpu-*]:s3cret",
                           source);
        size_t tlen = n - (size_t)(colon + 1 - w);
        if (tlen < 16 || tlen >= TOKEN_MAX)
            return err_set(err, 400, "bad-config", "%s: a token must be 16 to %d characters long",
                           source, TOKEN_MAX - 1);
        Token t = {.len = tlen};
        memcpy(t.value, colon + 1, tlen);
        if (parse_scopes(w, (size_t)((close ? open : colon) - w), &t.scopes, err) != 0 ||
            (close &&
             parse_workers(open + 1, (size_t)(close - open - 1), &t.workers, source, err) != 0))
            return -1;
        a->tokens = xrealloc(a->tokens, (a->n + 1) * sizeof *a->tokens);
        a->tokens[a->n++] = t;
    }
    return 0;
}

Auth *auth_load(const char *inline_tokens, const char *file, Err *err)
{
    Auth *a = xcalloc(1, sizeof *a);
    if (inline_tokens && add_entries(a, inline_tokens, "--tokens", err) != 0)
        goto cleanup;
    if (file && *file) {
        FILE *f = fopen(file, "r");
        if (!f) {
            err_set(err, 400, "bad-config", "--tokens-file: cannot read '%s'", file);
            goto cleanup;
        }
        SBuf b;
        sbuf_init(&b);
        char chunk[4096];
        size_t got;
        while ((got = fread(chunk, 1, sizeof chunk, f)) > 0)
            sbuf_append(&b, chunk, got);
        fclose(f);
        int rc = add_entries(a, b.data ? b.data : "", "--tokens-file", err);
        explicit_bzero(b.data, b.len);
        sbuf_free(&b);
        if (rc != 0)
            goto cleanup;
    }
    return a;
cleanup:
    auth_free(a);
    return NULL;
}

void auth_free(Auth *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->n; i++)
        strv_free(a->tokens[i].workers);
    if (a->tokens)
        explicit_bzero(a->tokens, a->n * sizeof *a->tokens);
    free(a->tokens);
    free(a);
}

bool auth_enabled(const Auth *a)
{
    return a && a->n > 0;
}

size_t auth_count(const Auth *a)
{
    return a ? a->n : 0;
}

/* Compares in time that depends only on the configured token's length. */
static bool same(const Token *t, const char *given, size_t len)
{
    unsigned char diff = (unsigned char)(len != t->len);
    for (size_t i = 0; i < t->len; i++)
        diff |= (unsigned char)(t->value[i] ^ (i < len ? given[i] : 0));
    return diff == 0;
}

bool auth_secret_matches(const char *secret, const char *given)
{
    size_t n = strlen(secret);
    if (n == 0 || n > AUTH_SECRET_MAX)
        return false;
    Token t = {.len = n};
    memcpy(t.value, secret, n);
    bool ok = same(&t, given, strnlen(given, TOKEN_MAX));
    explicit_bzero(t.value, sizeof t.value);
    return ok;
}

int auth_check(const Auth *a, int scope, const char *authorization, const char *access_token,
               Err *err)
{
    if (!auth_enabled(a) || scope == SCOPE_NONE)
        return 0;
    const char *given = NULL;
    if (authorization && !strncasecmp(authorization, "Bearer ", 7)) {
        given = authorization + 7;
        while (*given == ' ')
            given++;
    } else if (access_token) {
        given = access_token;
    }
    if (!given || !*given)
        return err_set(err, 401, "unauthorized",
                       "this server wants a bearer token: send 'Authorization: Bearer TOKEN'");
    size_t len = strnlen(given, TOKEN_MAX);
    int scopes = -1;
    for (size_t i = 0; i < a->n; i++) /* no early exit: the time does not tell which matched */
        if (same(&a->tokens[i], given, len))
            scopes = a->tokens[i].scopes;
    if (scopes < 0)
        return err_set(err, 401, "unauthorized", "the bearer token is not valid");
    if (!(scopes & scope))
        return err_set(err, 403, "forbidden", "the token lacks the '%s' scope for this request",
                       scope == SCOPE_WORKER  ? "worker"
                       : scope == SCOPE_ADMIN ? "admin"
                                              : "client");
    return 0;
}

static bool worker_matches(char *const *patterns, const char *worker_id)
{
    for (size_t i = 0; patterns[i]; i++) {
        size_t l = strlen(patterns[i]);
        if (l && patterns[i][l - 1] == '*' ? !strncmp(patterns[i], worker_id, l - 1)
                                           : !strcmp(patterns[i], worker_id))
            return true;
    }
    return false;
}

AuthWorkerAccess auth_worker_access(const Auth *a, const char *authorization,
                                    const char *access_token, const char *worker_id)
{
    if (!auth_enabled(a))
        return AUTH_WORKER_OWNS;
    const char *given = access_token;
    if (authorization && !strncasecmp(authorization, "Bearer ", 7)) {
        given = authorization + 7;
        while (*given == ' ')
            given++;
    }
    if (!given)
        return AUTH_WORKER_DENIED;
    size_t len = strnlen(given, TOKEN_MAX);
    const Token *found = NULL;
    for (size_t i = 0; i < a->n; i++) /* no early exit, as in auth_check */
        if (same(&a->tokens[i], given, len))
            found = &a->tokens[i];
    if (!found)
        return AUTH_WORKER_DENIED;
    if (found->workers)
        return worker_matches(found->workers, worker_id) ? AUTH_WORKER_OWNS : AUTH_WORKER_DENIED;
    return found->scopes & SCOPE_ADMIN ? AUTH_WORKER_OWNS : AUTH_WORKER_SHARED;
}
