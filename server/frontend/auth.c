/* auth: see auth.h. */
#include "auth.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

#define TOKEN_MAX 256

typedef struct Token {
    char value[TOKEN_MAX];
    size_t len;
    int scopes;
} Token;

struct Auth {
    Token *tokens;
    size_t n;
};

static int parse_scopes(const char *s, size_t len, int *out, Err *err)
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

/* Adds every "scopes:token" word of text. */
static int add_entries(Auth *a, const char *text, const char *source, Err *err)
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
        if (!colon || colon == w || colon == w + n - 1)
            return err_set(err, 400, "bad-config",
                           "%s: entries are SCOPES:TOKEN, e.g. client,worker:s3cret", source);
        size_t tlen = n - (size_t)(colon + 1 - w);
        if (tlen < 16 || tlen >= TOKEN_MAX)
            return err_set(err, 400, "bad-config", "%s: a token must be 16 to %d characters long",
                           source, TOKEN_MAX - 1);
        Token t = {.len = tlen};
        memcpy(t.value, colon + 1, tlen);
        if (parse_scopes(w, (size_t)(colon - w), &t.scopes, err) != 0)
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
        goto fail;
    if (file && *file) {
        FILE *f = fopen(file, "r");
        if (!f) {
            err_set(err, 400, "bad-config", "--tokens-file: cannot read '%s'", file);
            goto fail;
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
            goto fail;
    }
    return a;
fail:
    auth_free(a);
    return NULL;
}

void auth_free(Auth *a)
{
    if (!a)
        return;
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
