/* httpc: see httpc.h. */
#include "httpc.h"

#include <curl/curl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

struct HttpClient {
    CURL *curl;
    char *auth_header;
    const atomic_bool *cancel; /* borrowed, may be NULL */
};

/* One name cache for every client of the process. A client made for a single
 * request (a worker's deregistration as it stops) then finds the server's
 * address that the long-lived clients looked up, instead of asking the
 * resolver at the moment it is least likely to answer: a container network's
 * DNS while the containers around it stop. */
static CURLSH *dns_share;
static pthread_mutex_t dns_lock = PTHREAD_MUTEX_INITIALIZER;

static void dns_share_lock(CURL *h, curl_lock_data data, curl_lock_access access, void *ud)
{
    pthread_mutex_lock(&dns_lock);
}

static void dns_share_unlock(CURL *h, curl_lock_data data, void *ud)
{
    pthread_mutex_unlock(&dns_lock);
}

void httpc_global_init(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    dns_share = curl_share_init();
    if (!dns_share)
        abort();
    curl_share_setopt(dns_share, CURLSHOPT_LOCKFUNC, dns_share_lock);
    curl_share_setopt(dns_share, CURLSHOPT_UNLOCKFUNC, dns_share_unlock);
    curl_share_setopt(dns_share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
}

void httpc_global_cleanup(void)
{
    curl_share_cleanup(dns_share);
    dns_share = NULL;
    curl_global_cleanup();
}

HttpClient *httpc_new(const char *token)
{
    HttpClient *c = xcalloc(1, sizeof *c);
    c->curl = curl_easy_init();
    if (!c->curl)
        abort();
    if (token && *token) {
        size_t n = strlen(token) + 32;
        c->auth_header = xmalloc(n);
        snprintf(c->auth_header, n, "Authorization: Bearer %s", token);
    }
    return c;
}

void httpc_free(HttpClient *c)
{
    if (!c)
        return;
    curl_easy_cleanup(c->curl);
    free(c->auth_header);
    free(c);
}

void httpc_set_cancel(HttpClient *c, const atomic_bool *flag)
{
    c->cancel = flag;
}

/* libcurl calls this at least about once a second, even while no data flows. */
static int on_progress(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    const HttpClient *c = ud;
    return atomic_load(c->cancel) ? 1 : 0;
}

static size_t on_body(char *ptr, size_t size, size_t nmemb, void *ud)
{
    sbuf_append(ud, ptr, size * nmemb);
    return size * nmemb;
}

static size_t on_header(char *ptr, size_t size, size_t nmemb, void *ud)
{
    HttpResp *r = ud;
    size_t n = size * nmemb;
    if (n > 12 && strncasecmp(ptr, "Retry-After:", 12) == 0) {
        double secs = atof(ptr + 12);
        /* Clamped before converting: a hostile 1e300 or nan must not be UB. */
        if (!(secs >= 0))
            secs = 0;
        if (secs > 3600)
            secs = 3600;
        r->retry_after_ms = (int64_t)(secs * 1000);
    } else if (n > 9 && strncasecmp(ptr, "Location:", 9) == 0) {
        const char *v = ptr + 9;
        while (*v == ' ')
            v++;
        size_t len = (size_t)(ptr + n - v);
        while (len && (v[len - 1] == '\r' || v[len - 1] == '\n'))
            len--;
        if (len >= sizeof r->location)
            len = sizeof r->location - 1;
        memcpy(r->location, v, len);
        r->location[len] = '\0';
    }
    return n;
}

int httpc_request(HttpClient *c, const char *method, const char *url, const char *json_body,
                  int64_t timeout_ms, HttpResp *out, Err *err)
{
    memset(out, 0, sizeof *out);
    out->retry_after_ms = -1;
    if (c->cancel && atomic_load(c->cancel))
        return err_set(err, 503, "cancelled", "%s %s: cancelled", method, url);
    SBuf body;
    sbuf_init(&body);
    CURL *h = c->curl;
    curl_easy_reset(h);
    struct curl_slist *hdrs = NULL;
    if (json_body)
        hdrs = curl_slist_append(hdrs, "Content-Type: application/json");
    hdrs = curl_slist_append(hdrs, "Expect:");
    if (c->auth_header)
        hdrs = curl_slist_append(hdrs, c->auth_header);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    if (dns_share)
        curl_easy_setopt(h, CURLOPT_SHARE, dns_share);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_ms < 5000 ? timeout_ms : 5000));
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, out);
    if (c->cancel) {
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, on_progress);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, c);
    }
    if (json_body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, json_body);
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)strlen(json_body));
    } else if (!strcmp(method, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    }
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdrs);
    if (rc != CURLE_OK) {
        sbuf_free(&body);
        if (rc == CURLE_ABORTED_BY_CALLBACK)
            return err_set(err, 503, "cancelled", "%s %s: cancelled", method, url);
        return err_set(err, 503, "unreachable", "%s %s: %s", method, url, curl_easy_strerror(rc));
    }
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
    out->len = body.len;
    out->body = sbuf_steal(&body);
    return 0;
}

void httpc_resp_free(HttpResp *r)
{
    free(r->body);
    r->body = NULL;
    r->len = 0;
}
