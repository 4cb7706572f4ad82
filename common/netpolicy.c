/* netpolicy: see netpolicy.h. */
#include "netpolicy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* The ranges no receiver is reached in by default, most specific first
 * (IANA's special-purpose registries, RFC 6890 and successors). */
static const struct Internal {
    const char *net;
    int prefix;
    const char *what;
} INTERNAL[] = {
    {"0.0.0.0", 8, "unspecified (this host)"},
    {"10.0.0.0", 8, "private (RFC 1918)"},
    {"100.64.0.0", 10, "shared address space (RFC 6598)"},
    {"127.0.0.0", 8, "loopback"},
    {"169.254.0.0", 16, "link-local (cloud metadata lives here)"},
    {"172.16.0.0", 12, "private (RFC 1918)"},
    {"192.0.0.0", 24, "reserved (IETF protocol assignments)"},
    {"192.0.2.0", 24, "reserved (documentation)"},
    {"192.88.99.0", 24, "reserved (6to4 relay)"},
    {"192.168.0.0", 16, "private (RFC 1918)"},
    {"198.18.0.0", 15, "reserved (benchmarking)"},
    {"198.51.100.0", 24, "reserved (documentation)"},
    {"203.0.113.0", 24, "reserved (documentation)"},
    {"224.0.0.0", 4, "multicast"},
    {"240.0.0.0", 4, "reserved"},
    {"::", 128, "unspecified (this host)"},
    {"::1", 128, "loopback"},
    {"::", 96, "reserved (IPv4-compatible)"},
    {"64:ff9b:1::", 48, "private (local NAT64)"},
    {"100::", 64, "reserved (discard)"},
    {"2001::", 23, "reserved (IETF protocol assignments, Teredo)"},
    {"2001:db8::", 32, "reserved (documentation)"},
    {"fc00::", 7, "private (unique local)"},
    {"fe80::", 10, "link-local"},
    {"fec0::", 10, "reserved (site-local)"},
    {"ff00::", 8, "multicast"},
};
#define N_INTERNAL (sizeof INTERNAL / sizeof INTERNAL[0])

static bool read_addr(const char *text, NetRange *r)
{
    memset(r, 0, sizeof *r);
    if (inet_pton(AF_INET, text, r->addr) == 1) {
        r->prefix = 32;
        return true;
    }
    if (inet_pton(AF_INET6, text, r->addr) == 1) {
        r->v6 = true;
        r->prefix = 128;
        return true;
    }
    return false;
}

static bool in_range(const NetRange *net, bool v6, const unsigned char *a)
{
    if (net->v6 != v6)
        return false;
    int bits = net->prefix;
    for (int i = 0; bits > 0; i++, bits -= 8) {
        unsigned char mask = bits >= 8 ? 0xff : (unsigned char)(0xff << (8 - bits));
        if ((a[i] & mask) != (net->addr[i] & mask))
            return false;
    }
    return true;
}

int netpolicy_parse(const char *list, NetPolicy *p, Err *err)
{
    memset(p, 0, sizeof *p);
    char *copy = xstrdup(list ? list : "");
    int rc = -1;
    char *save = NULL;
    for (char *t = strtok_r(copy, ", \t", &save); t; t = strtok_r(NULL, ", \t", &save)) {
        if (p->n == NETPOLICY_MAX) {
            err_set(err, 400, "bad-config", "at most %d networks may be listed", NETPOLICY_MAX);
            goto cleanup;
        }
        NetRange *r = &p->allow[p->n];
        char *slash = strchr(t, '/');
        if (slash)
            *slash = '\0';
        char *end = NULL;
        long prefix = slash ? strtol(slash + 1, &end, 10) : -1;
        if (!read_addr(t, r) ||
            (slash && (!slash[1] || *end || prefix < 0 || prefix > (r->v6 ? 128 : 32)))) {
            err_set(err, 400, "bad-config",
                    "'%.60s%s%.8s' is not a network (write 10.0.0.0/8, 127.0.0.1 or fd00::/8)", t,
                    slash ? "/" : "", slash ? slash + 1 : "");
            goto cleanup;
        }
        if (slash)
            r->prefix = (int)prefix;
        p->n++;
    }
    rc = 0;
cleanup:
    free(copy);
    return rc;
}

/* The IPv4 address an IPv6 one carries for IPv4 (mapped ::ffff:0:0/96, NAT64
 * 64:ff9b::/96, 6to4 2002::/16) into v4; false if it carries none. */
static bool embedded_v4(const unsigned char *a, unsigned char *v4)
{
    static const unsigned char mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    static const unsigned char nat64[12] = {0, 0x64, 0xff, 0x9b};
    if (!memcmp(a, mapped, 12) || !memcmp(a, nat64, 12)) {
        memcpy(v4, a + 12, 4);
        return true;
    }
    if (a[0] == 0x20 && a[1] == 0x02) {
        memcpy(v4, a + 2, 4);
        return true;
    }
    return false;
}

static bool allowed(const NetPolicy *p, bool v6, const unsigned char *a, const char *text,
                    char *why, size_t n)
{
    unsigned char v4[16] = {0};
    bool carries = v6 && embedded_v4(a, v4);
    for (size_t i = 0; p && i < p->n; i++)
        if (in_range(&p->allow[i], v6, a) || (carries && in_range(&p->allow[i], false, v4)))
            return true;
    for (size_t i = 0; i < N_INTERNAL; i++) {
        NetRange r;
        if (!read_addr(INTERNAL[i].net, &r))
            continue;
        r.prefix = INTERNAL[i].prefix;
        if (in_range(&r, v6, a) || (carries && in_range(&r, false, v4))) {
            snprintf(why, n, "%s is %s%s", text, carries ? "an IPv4 address inside IPv6, " : "",
                     INTERNAL[i].what);
            return false;
        }
    }
    return true;
}

bool netpolicy_allows(const NetPolicy *p, const struct sockaddr *sa, char *why, size_t n)
{
    char text[INET6_ADDRSTRLEN] = "?";
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *in = (const struct sockaddr_in *)(const void *)sa;
        inet_ntop(AF_INET, &in->sin_addr, text, sizeof text);
        return allowed(p, false, (const unsigned char *)&in->sin_addr, text, why, n);
    }
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)(const void *)sa;
        inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof text);
        return allowed(p, true, (const unsigned char *)&in6->sin6_addr, text, why, n);
    }
    snprintf(why, n, "address family %d is not IP", sa->sa_family);
    return false;
}

int netpolicy_allows_text(const NetPolicy *p, const char *text, char *why, size_t n)
{
    NetRange r;
    if (!read_addr(text, &r))
        return -1;
    return allowed(p, r.v6, r.addr, text, why, n) ? 1 : 0;
}
