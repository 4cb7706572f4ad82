/* head: see head.h. */
#include "head.h"

#include <string.h>
#include <strings.h>

/* RFC 9110 5.6.2: a header name is a token. */
static bool is_token(const char *s, size_t n)
{
    if (!n)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c <= 0x20 || c >= 0x7f || strchr("\"(),/:;<=>?@[\\]{}", c))
            return false;
    }
    return true;
}

static bool same_name(const char *key, size_t n, const char *name)
{
    return strlen(name) == n && !strncasecmp(key, name, n);
}

void head_line(HeadCheck *h, const char *key, size_t key_len, const char *value, size_t value_len)
{
    for (size_t i = 0; i < value_len && !h->bad_value; i++) {
        unsigned char c = (unsigned char)value[i];
        if ((c < 0x20 && c != '\t') || c == 0x7f) {
            h->bad_value = true;
            size_t o = 0;
            for (size_t j = 0; j < key_len && o + 1 < sizeof h->value_of; j++)
                h->value_of[o++] = key[j] > 0x20 && key[j] < 0x7f ? key[j] : '?';
            h->value_of[o] = '\0';
        }
    }
    if (!is_token(key, key_len)) {
        if (!h->bad_name) {
            size_t o = 0;
            for (size_t i = 0; i < key_len && o + 1 < sizeof h->name; i++)
                h->name[o++] = key[i] > 0x20 && key[i] < 0x7f ? key[i] : '?';
            h->name[o] = '\0';
        }
        h->bad_name = true;
    } else if (same_name(key, key_len, "Host")) {
        h->hosts++;
        for (size_t i = 0; i < value_len; i++) {
            unsigned char c = (unsigned char)value[i];
            if (c <= 0x20 || c == 0x7f || c == '/' || c == '@')
                h->bad_host = true;
        }
    } else if (same_name(key, key_len, "Content-Length")) {
        if (h->lengths++ && strcmp(h->length, value) != 0)
            h->length_differs = true;
        h->length = value;
    } else if (same_name(key, key_len, "Transfer-Encoding")) {
        h->encodings++;
        h->encoding = value;
    }
}

/* Whether a Transfer-Encoding value (up to end) is exactly "chunked" (any
 * case), the only coding workd reads: libmicrohttpd frames a body as chunked
 * only then, so "chunked " (trailing whitespace) is no framing to it. */
static bool only_chunked(const char *v, const char *end)
{
    return end - v == 7 && strncasecmp(v, "chunked", 7) == 0;
}

/* Whether v (up to end) is "chunked" with whitespace around it. */
static bool padded_chunked(const char *v, const char *end)
{
    while (v < end && (*v == ' ' || *v == '\t'))
        v++;
    while (end > v && (end[-1] == ' ' || end[-1] == '\t'))
        end--;
    return only_chunked(v, end);
}

int head_check(const HeadCheck *h, bool http11, Err *err)
{
    if (h->bad_name)
        return err_set(err, 400, "bad-request",
                       "the header name '%s' is not a token (no whitespace before the colon)",
                       h->name);
    if (h->bad_value)
        return err_set(err, 400, "bad-request",
                       "the value of the header '%s' holds a control character (NUL, CR or LF)",
                       h->value_of);
    if (h->hosts > 1)
        return err_set(err, 400, "bad-request", "the request has %d Host headers; send one",
                       h->hosts);
    if (http11 && h->hosts == 0)
        return err_set(err, 400, "bad-request", "an HTTP/1.1 request must have a Host header");
    if (h->bad_host)
        return err_set(err, 400, "bad-request", "the Host header is not a valid host[:port]");
    if (h->lengths > 1)
        return err_set(err, 400, "bad-request", "the request has %d Content-Length headers%s",
                       h->lengths, h->length_differs ? " that differ" : "; send one");
    if (h->encodings && !http11)
        return err_set(err, 400, "bad-request",
                       "Transfer-Encoding is not allowed in an HTTP/1.0 request");
    if (h->encodings && h->lengths)
        return err_set(err, 400, "bad-request",
                       "the request has both Content-Length and Transfer-Encoding; send one");
    if (!h->encodings)
        return 0;
    const char *v = h->encoding, *end = v + strlen(v);
    if (h->encodings == 1 && only_chunked(v, end))
        return 0;
    if (h->encodings == 1 && padded_chunked(v, end))
        return err_set(err, 400, "bad-request",
                       "Transfer-Encoding must be 'chunked' without whitespace around it");
    /* "chunked" must come last, and once: anything else is a coding workd
     * does not read (501), a list not ending in chunked a framing error. */
    const char *last = strrchr(v, ',');
    if (h->encodings == 1 && !padded_chunked(last ? last + 1 : v, end))
        return err_set(err, 400, "bad-request",
                       "Transfer-Encoding must end with chunked (RFC 9112 section 6.1)");
    return err_set(err, 501, "not-implemented",
                   "the only Transfer-Encoding this server reads is 'chunked' alone");
}
