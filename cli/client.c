/* client: see client.h. */
#include "client.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "servers.h"
#include "util.h"

/* What an answer can take beyond a long-poll's own wait. */
#define ANSWER_MS 30000
/* A connection that cannot be made within this is a server that is away. */
#define CONNECT_MS 3000
/* A results stream says something (a keep-alive comment) every 15 s by
 * default; this long without a byte is a dead connection. */
#define STREAM_SILENT_S 45L
/* The longest answer read (a stream's events are bounded by its parser,
 * sse.h). No workd answer comes near it: the largest, GET /work/{id}, holds
 * a payload and a result of at most --max-body each (1 MiB by default), and
 * a node refuses to forward a reply over --max-reply-bytes (16 MiB). Past it
 * is a broken or hostile server, not a reason to take all the memory. */
#define ANSWER_MAX ((curl_off_t)64 << 20)
/* The longest pause a Retry-After buys, whatever it says (a date next year):
 * the bound the worker keeps too. A request never waits past --retry-for. */
#define RETRY_AFTER_MAX_MS 60000
/* A redirect's Location kept for the message. */
#define LOCATION_MAX 256

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

/* What a request keeps of an answer besides its status. */
typedef struct Answer {
    SBuf body;
    bool too_long;               /* the body passed ANSWER_MAX; the rest was not read */
    int64_t retry_after_ms;      /* -1: none, or none that could be read */
    char location[LOCATION_MAX]; /* of a redirect, cut; "" when none */
} Answer;

static void answer_reset(Answer *a)
{
    sbuf_reset(&a->body);
    a->too_long = false;
    a->retry_after_ms = -1;
    a->location[0] = '\0';
}

static size_t on_body(char *p, size_t size, size_t n, void *ud)
{
    Answer *a = ud;
    if (a->body.len + size * n > (size_t)ANSWER_MAX) {
        a->too_long = true;
        return 0; /* libcurl ends the transfer */
    }
    sbuf_append(&a->body, p, size * n);
    return size * n;
}

/* A Retry-After value (RFC 9110: delta-seconds or an HTTP-date) as the
 * milliseconds to wait from now, at most RETRY_AFTER_MAX_MS; -1 when it is
 * neither (a negative number, a fraction, words). */
static int64_t retry_after_ms(const char *v)
{
    size_t digits = strspn(v, "0123456789");
    if (digits && !v[digits]) /* no overflow: 9 digits are more than the bound already */
        return digits > 9 || atol(v) > RETRY_AFTER_MAX_MS / 1000 ? RETRY_AFTER_MAX_MS
                                                                 : atol(v) * 1000;
    if (digits || !*v)
        return -1;
    time_t when = curl_getdate(v, NULL);
    if (when == -1)
        return -1;
    time_t now = time(NULL);
    if (when <= now)
        return 0;
    return when - now > RETRY_AFTER_MAX_MS / 1000 ? RETRY_AFTER_MAX_MS
                                                  : (int64_t)(when - now) * 1000;
}

/* The value of header line p (n bytes, "Name: value\r\n") into out, trimmed
 * and cut to outlen, when it is the header name (with its colon). */
static bool header_value(const char *p, size_t n, const char *name, char *out, size_t outlen)
{
    size_t nlen = strlen(name);
    if (n <= nlen || strncasecmp(p, name, nlen) != 0)
        return false;
    const char *v = p + nlen, *end = p + n;
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t'))
        end--;
    snprintf(out, outlen, "%.*s", (int)(end - v), v);
    return true;
}

static size_t on_header(char *p, size_t size, size_t n, void *ud)
{
    Answer *a = ud;
    char v[64];
    if (header_value(p, size * n, "Retry-After:", v, sizeof v))
        a->retry_after_ms = retry_after_ms(v);
    else
        header_value(p, size * n, "Location:", a->location, sizeof a->location);
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
 * the body is problem+json, else the start of the body. A redirect is not
 * followed (a workd server never sends one, and following it would send the
 * request and its body wherever an answer says): it says where it pointed. */
static void problem(long status, const char *body, const char *location, Err *err)
{
    if (status >= 300 && status <= 399) {
        err_set(err, (int)status, "redirect",
                "the server answered %ld, a redirect to %s, which workd does not follow (a workd "
                "server never redirects: give --server the URL it names if you trust it)",
                status, location && *location ? location : "(no Location)");
        return;
    }
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
    Answer a;
    sbuf_init(&a.body);
    int rc = -1;
    for (;;) {
        char url[SERVERS_URL_MAX + 1024];
        char base[SERVERS_URL_MAX];
        size_t pos = servers_url(c->servers, "", base, sizeof base);
        snprintf(url, sizeof url, "%s%s", base, path);
        answer_reset(&a);
        common_options(c, url, hdrs);
        curl_easy_setopt(c->curl, CURLOPT_CUSTOMREQUEST, method);
        curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, (long)(ANSWER_MS + wait_ms));
        curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_body);
        curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &a);
        curl_easy_setopt(c->curl, CURLOPT_HEADERFUNCTION, on_header);
        curl_easy_setopt(c->curl, CURLOPT_HEADERDATA, &a);
        curl_easy_setopt(c->curl, CURLOPT_MAXFILESIZE_LARGE, ANSWER_MAX);
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
        if (a.too_long || cc == CURLE_FILESIZE_EXCEEDED) {
            /* Not sent again: the server did answer, with what no workd sends. */
            err_set(err, 0, "bad-answer",
                    "%s %s%s: the answer is longer than %d MiB, which no workd answer is; not "
                    "read further",
                    method, base, path, (int)(ANSWER_MAX >> 20));
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
             * the answer says when to ask again, within bounds (never sooner
             * than the backoff, never past --retry-for). */
            int64_t pause = a.retry_after_ms > backoff ? a.retry_after_ms : backoff;
            int64_t left = deadline - mono_ms();
            nap(c, pause < left ? pause : left);
            backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
            if (status == 503)
                servers_unreachable(c->servers, pos, NULL, 0);
            continue;
        }
        if (status < 200 || status > 299) {
            problem(status, a.body.data, a.location, err);
            goto cleanup;
        }
        if (a.body.len) {
            json_error_t je;
            *out = json_loadb(a.body.data, a.body.len, JSON_DECODE_ANY, &je);
            if (!*out) {
                /* A server that answers so is broken (exit 5), not a request
                 * that was refused. */
                err_set(err, 0, "bad-answer", "%s %s%s: the answer (HTTP %ld) is not JSON: %s",
                        method, base, path, status, je.text);
                goto cleanup;
            }
        }
        rc = 0;
        goto cleanup;
    }
cleanup:
    curl_slist_free_all(hdrs);
    sbuf_free(&a.body);
    free(text);
    return rc;
}

typedef struct StreamCtx {
    ClientChunkFn fn;
    void *ud;
    long status;  /* 0 until the head is read */
    bool stopped; /* fn asked to stop */
    Answer error; /* the head and the start of an answer that is not 200 */
    CURL *curl;
} StreamCtx;

static size_t on_stream(char *p, size_t size, size_t n, void *ud)
{
    StreamCtx *s = ud;
    if (!s->status)
        curl_easy_getinfo(s->curl, CURLINFO_RESPONSE_CODE, &s->status);
    if (s->status != 200) {
        if (s->error.body.len < 4096)
            sbuf_append(&s->error.body, p, size * n);
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
    sbuf_init(&s.error.body);
    answer_reset(&s.error);
    common_options(c, url.data, hdrs);
    curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, on_stream);
    curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(c->curl, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(c->curl, CURLOPT_HEADERDATA, &s.error);
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
        problem(s.status, s.error.body.data, s.error.location, err);
        rc = -1;
    } else {
        servers_unreachable(c->servers, pos, NULL, 0);
        err_set(err, 0, "unreachable", "%s: %s", base, curl_easy_strerror(cc));
        rc = -1;
    }
    sbuf_free(&s.error.body);
    sbuf_free(&url);
    sbuf_free(&h);
    return rc;
}
