/* client: the workd API as the command line calls it. One request at a time
 * over one libcurl handle, to the servers given (tried in turn when one cannot
 * be reached), with the token, retried while the cluster is briefly away
 * (a failover, a full queue) for as long as the caller allows. */
#ifndef WORKD_CLI_CLIENT_H
#define WORKD_CLI_CLIENT_H

#include <jansson.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"

typedef struct Client Client;

typedef struct ClientConfig {
    const char *servers; /* comma-separated base URLs */
    const char *token;   /* NULL or "": no Authorization header */
    int64_t retry_ms;    /* how long to keep trying while no server answers, or 503/429 */
    /* Borrowed, may be NULL: a request gives up within about a second of it
     * becoming true (err type "stopped"). */
    const atomic_bool *stop;
} ClientConfig;

/* Returns NULL (err says which URL is wrong) on a bad server list. The config's
 * strings are copied. Free with client_free. */
Client *client_new(const ClientConfig *cfg, Err *err) WARN_UNUSED;
void client_free(Client *c);

/* Sends METHOD path (a path and query, e.g. "/work/x?wait=5") with body as
 * JSON (NULL: none; borrowed). wait_ms is how long the server may take on
 * purpose (a long-poll), beyond the usual answer time. `again`: the request
 * may be sent a second time after an exchange broke off in the middle
 * (reads, PUTs, submissions that carry their ids); a request refused before
 * it reached a server is always tried on the next one.
 *
 * Returns 0 on a 2xx answer, with *out its JSON (NULL for an empty body; the
 * caller owns it). Returns -1 otherwise: err->status is the HTTP status (0
 * when no server answered), err->type the problem's kind ("not-found") and
 * err->msg its detail. */
int client_call(Client *c, const char *method, const char *path, json_t *body, bool again,
                int64_t wait_ms, json_t **out, Err *err) WARN_UNUSED;

/* Called with each chunk of a stream as it arrives; returns true to stop. */
typedef bool (*ClientChunkFn)(const char *data, size_t len, void *ud);

/* Opens GET path as a text/event-stream on the server in use, with
 * Last-Event-ID when last_id is not empty, and hands every chunk to fn until
 * the stream ends. Returns 1 when fn asked to stop (or the stop flag rose),
 * 0 when a stream that was open (HTTP 200) ended, -1 when none was opened
 * (err as for client_call; a server that could not be reached is left for the
 * next one). */
int client_stream(Client *c, const char *path, const char *last_id, ClientChunkFn fn, void *ud,
                  Err *err) WARN_UNUSED;

/* Base URL of the server in use, for messages; valid until the next call. */
const char *client_server(Client *c);

/* Appends s to out with every byte outside [A-Za-z0-9._~:@-] percent-encoded,
 * for a path segment or a query value. */
void client_escape(const char *s, char *out, size_t outlen);

#endif
