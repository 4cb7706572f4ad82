/* netpolicy: which IP addresses a server may connect to on a user's behalf
 * (webhook receivers), so that a URL cannot make it reach inside its own
 * network (server-side request forgery). Internal addresses -- loopback,
 * unspecified, private (RFC 1918, unique-local), link-local (cloud metadata
 * at 169.254.169.254), shared, multicast, reserved and documentation ranges,
 * and IPv4 carried inside IPv6 (mapped, NAT64, 6to4) in any of those -- are
 * refused unless a network the operator listed holds the address. Checked on
 * the address actually connected to, after name resolution. */
#ifndef WORKD_NETPOLICY_H
#define WORKD_NETPOLICY_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/socket.h>

#include "err.h"

#define NETPOLICY_MAX 32 /* networks an operator may list */

typedef struct NetRange {
    bool v6;
    unsigned char addr[16]; /* network order; IPv4 in the first 4 bytes */
    int prefix;
} NetRange;

/* The networks allowed beside the public ones (all zero: none). */
typedef struct NetPolicy {
    size_t n;
    NetRange allow[NETPOLICY_MAX];
} NetPolicy;

/* Parses a list of networks (CIDR or single addresses, separated by commas
 * or spaces), e.g. "127.0.0.0/8, ::1, 10.1.0.0/16", into p. Returns 0, or -1
 * with err (400) naming the entry it cannot read. */
int netpolicy_parse(const char *list, NetPolicy *p, Err *err) WARN_UNUSED;

/* Whether p allows connecting to sa (AF_INET or AF_INET6). If not, why
 * ("127.0.0.1 is loopback") goes into why (n bytes). */
bool netpolicy_allows(const NetPolicy *p, const struct sockaddr *sa, char *why, size_t n);

/* The same for an address written as text ("10.0.0.1", "::1", no brackets).
 * Returns 1 allowed, 0 refused (why filled), -1 when text is no address (a
 * name: it is checked once resolved). */
int netpolicy_allows_text(const NetPolicy *p, const char *text, char *why, size_t n);

#endif
