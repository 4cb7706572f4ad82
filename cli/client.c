/* client: see client.h. */
#include "client.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "servers.h"
#include "util.h"

/* What an answer can take beyond a long-poll's own wait. */
#define ANSWER_MS 30000
/* A connection that cannot be made within this is a server that is away. */
#define CONNECT_MS 3000
/* A results stream says something (a keep-alive comment) every 15 s by
 * default; this long without a byte is a dead connection. */
#define STREAM_SILENT_S 45L

struct Client {
    CURL *curl;
    Servers *servers;
    char *auth;
    int64_t retry_ms;
    const atomic_bool *stop;
    char server[SERVERS_URL_MAX]; /* the one in use, for client_server */
};

Client *client_new(const ClientConfig *cfg, Err *err)
{
    Servers *s = servers_new(cfg->servers, "--server", err);
    if (!s)
        return NULL;
    Client *c = xcalloc(1, sizeof *c);
    c->servers = s;
    c->curl = curl_easy_init();
    if (!c->curl)
        abort();
    if (cfg->token && *cfg->token) {
        size_t n = strlen(cfg->token) + 32;
        c->auth = xmalloc(n);
        snprintf(c->auth, n, "Authorization: Bearer %s", cfg->token);
    }
    c->retry_ms = cfg->retry_ms;
    c->stop = cfg->stop;
    return c;
}

void client_free(Client *c)
{
    if (!c)
        return;
    curl_easy_cleanup(c->curl);
    servers_free(c->servers);
    if (c->auth)
        explicit_bzero(c->auth, strlen(c->auth));
    free(c->auth);
    free(c);
}

const char *client_server(Client *c)
{
    servers_url(c->servers, "", c->server, sizeof c->server);
    return c->server;
}

void client_escape(const char *s, char *out, size_t outlen)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t j = strlen(out);
    for (const unsigned char *p = (const unsigned char *)s; *p && j + 4 < outlen; p++) {
        if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
            strchr("._~:@-", *p)) {
            out[j++] = (char)*p;
        } else {
            out[j++] = '%';
            out[j++] = hex[*p >> 4];
            out[j++] = hex[*p & 15];
        }
    }
    out[j] = '\0';
}

static bool stopping(const Client *c)
{
    return c->stop && atomic_load(c->stop);
}

/* Sleeps up to ms, waking early when asked to stop. */
static void nap(const Client *c, int64_t ms)
{
    while (ms > 0 && !stopping(c)) {
        int64_t step = ms < 100 ? ms : 100;
        sleep_ms(step);
        ms -= step;
    }
}

static int on_progress(void *ud, curl_off_t a, curl_off_t b, curl_off_t d, curl_off_t e)
{
    return stopping(ud) ? 1 : 0;
}

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    sbuf_append(ud, p, size * n);
    return size * n;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
    int64_t *retry_after_ms = ud;
    if (size * n > 12 && !strncasecmp(p, "Retry-After:", 12)) {
        double secs = atof(p + 12);
        *retry_after_ms = secs >= 0 && secs <= 60 ? (int64_t)(secs * 1000) : 1000;
    }
    return size * n;
}

/* The headers every request sends; the caller frees them. */
static struct curl_slist *base_headers(const Client *c, bool json_body)
{
    struct curl_slist *h = curl_slist_append(NULL, "Expect:");
    if (json_body)
        h = curl_slist_append(h, "Content-Type: application/json");
    if (c->auth)
        h = curl_slist_append(h, c->auth);
    return h;
}

static void common_options(Client *c, const char *url, struct curl_slist *hdrs)
{
    CURL *h = c->curl;
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)CONNECT_MS);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);
}

/* Whether a transport failure happened before the request could have reached
 * a server (so that sending it elsewhere cannot do it twice). */
static bool never_sent(CURLcode rc)
{
    return rc == CURLE_COULDNT_CONNECT || rc == CURLE_COULDNT_RESOLVE_HOST ||
           rc == CURLE_COULDNT_RESOLVE_PROXY || rc == CURLE_SSL_CONNECT_ERROR;
}

/* Fills err from an answer that is not 2xx: the problem's kind and detail when
 * the body is problem+json, else the start of the body. */
static void problem(long status, const char *body, Err *err)
{
    json_t *j = json_loads(body ? body : "", 0, NULL);
    const char *type = json_string_value(json_object_get(j, "type"));
    const char *detail = json_string_value(json_object_get(j, "detail"));
    const char *kind = type && strrchr(type, '/') ? strrchr(type, '/') + 1 : "http-error";
    if (detail)
        err_set(err, (int)status, kind, "%s", detail);
    else
        err_set(err, (int)status, kind, "HTTP %ld: %.200s", status, body ? body : "");
    json_decref(j);
}

int client_call(Client *c, const char *method, const char *path, json_t *body, bool again,
                int64_t wait_ms, json_t **out, Err *err)
{
    *out = NULL;
    char *text = body ? json_dumps(body, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    struct curl_slist *hdrs = base_headers(c, text != NULL);
    int64_t deadline = mono_ms() + c->retry_ms, backoff = 100;
    size_t failures = 0; /* servers that could not be reached in a row */
    SBuf resp;
    sbuf_init(&resp);
    int rc = -1;
    for (;;) {
        char url[SERVERS_URL_MAX + 1024];
        char base[SERVERS_URL_MAX];
        size_t pos = servers_url(c->servers, "", base, sizeof base);
        snprintf(url, sizeof url, "%s%s", base, path);
        int64_t retry_after = -1;
        sbuf_reset(&resp);
        common_options(c, url, hdrs);
        curl_easy_setopt(c->curl, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, (long)(ANSWER_MS + wait_ms));
        curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &resp);
        curl_easy_setopt(c->curl, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c->curl, CURLOPT_HEADERDATA, &retry_after);
        if (text) {
            curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, text);
            curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(text));
        } else if (!strcmp(method, "HEAD")) {
            curl_easy_setopt(c->curl, CURLOPT_NOBODY, 1L);
        }
        CURLcode cc = curl_easy_perform(c->curl);
        long status = 0;
        if (cc == CURLE_OK)
            curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
        if (stopping(c)) {
            err_set(err, 0, "stopped", "%s %s: stopped", method, path);
            goto cleanup;
        }
        if (cc != CURLE_OK) {
            if (!never_sent(cc) && !again) {
                err_set(err, 0, "unreachable",
                        "%s %s%s: %s; the server may or may not have done it (check, then "
                        "repeat if it did not)",
                        method, base, path, curl_easy_strerror(cc));
                goto cleanup;
            }
            servers_unreachable(c->servers, pos, NULL, 0);
            failures++;
            if (mono_ms() >= deadline && failures >= servers_count(c->servers)) {
                err_set(err, 0, "unreachable", "no server answered (%s): %s",
                        servers_text(c->servers), curl_easy_strerror(cc));
                goto cleanup;
            }
            /* Each server once at once, then a pause before the next round. */
            if (failures % servers_count(c->servers) == 0) {
                nap(c, backoff);
                backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
            }
            continue;
        }
        failures = 0;
        if ((status == 503 || status == 429) && mono_ms() < deadline) {
            /* A leader being elected, a node without a leader, a full queue:
             * the answer says when to ask again. */
            nap(c, retry_after >= 0 ? retry_after : backoff);
            backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
            if (status == 503)
                servers_unreachable(c->servers, pos, NULL, 0);
            continue;
        }
        if (status < 200 || status > 299) {
            problem(status, resp.data, err);
            goto cleanup;
        }
        if (resp.len) {
            json_error_t je;
            *out = json_loadb(resp.data, resp.len, JSON_DECODE_ANY, &je);
            if (!*out) {
                err_set(err, (int)status, "bad-answer", "%s %s: the answer is not JSON: %s", method,
                        path, je.text);
                goto cleanup;
            }
        }
        rc = 0;
        goto cleanup;
    }
cleanup:
    curl_slist_free_all(hdrs);
    sbuf_free(&resp);
    free(text);
    return rc;
}

typedef struct StreamCtx {
    ClientChunkFn fn;
    void *ud;
    long status;  /* 0 until the head is read */
    bool stopped; /* fn asked to stop */
    SBuf error;   /* the body of an answer that is not 200 */
    CURL *curl;
} StreamCtx;

static size_t on_stream(char *p, size_t size, size_t n, void *ud)
{
    StreamCtx *s = ud;
    if (!s->status)
        curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status != 200) {
        if (s->error.len < 4096)
            sbuf_append(&s->error, p, size * n);
        return size * n;
    }
    if (s->fn(p, size * n, s->ud)) {
        s->stopped = true;
        return 0; /* libcurl ends the transfer */
    }
    return size * n;
}

int client_stream(Client *c, const char *path, const char *last_id, ClientChunkFn fn, void *ud,
                  Err *err)
{
    char base[SERVERS_URL_MAX];
    size_t pos = servers_url(c->servers, "", base, sizeof base);
    /* Both as long as they come: a path and an event id may each hold a
     * cursor of every shard (cli/sse.h). */
    SBuf url, h;
    sbuf_init(&url);
    sbuf_init(&h);
    sbuf_printf(&url, "%s%s", base, path);
    struct curl_slist *hdrs = base_headers(c, false);
    hdrs = curl_slist_append(hdrs, "Accept: text/event-stream");
    if (last_id && *last_id) {
        sbuf_printf(&h, "Last-Event-ID: %s", last_id);
        hdrs = curl_slist_append(hdrs, h.data);
    }
    StreamCtx s = {.fn = fn, .ud = ud, .curl = c->curl};
    sbuf_init(&s.error);
    common_options(c, url.data, hdrs);
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c->curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c->curl, CURLOPT_LOW_SPEED_TIME, STREAM_SILENT_S);
    CURLcode cc = curl_easy_perform(c->curl);
    curl_slist_free_all(hdrs);
    if (!s.status && cc == CURLE_OK)
        curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &s.status);
    int rc;
    if (s.stopped || stopping(c)) {
        rc = 1;
    } else if (s.status == 200) {
        rc = 0;
    } else if (s.status) {
        problem(s.status, s.error.data, err);
        rc = -1;
    } else {
        servers_unreachable(c->servers, pos, NULL, 0);
        err_set(err, 0, "unreachable", "%s: %s", base, curl_easy_strerror(cc));
        rc = -1;
    }
    sbuf_free(&s.error);
    sbuf_free(&url);
    sbuf_free(&h);
    return rc;
}
