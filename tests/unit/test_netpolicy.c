/* Tests of common/netpolicy.c: which addresses a webhook delivery may connect
 * to (issue 27.5). Internal ones are refused, also inside IPv6; public ones
 * pass; an operator's list lets networks through, and a list it cannot read
 * is refused naming the entry. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <string.h>

#include "netpolicy.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

static void test_internal_addresses_are_refused(void **state)
{
    (void)state;
    static const struct {
        const char *addr, *why; /* why NULL: allowed */
    } cases[] = {
        {"127.0.0.1", "loopback"},
        {"127.255.1.2", "loopback"},
        {"0.0.0.0", "unspecified"},
        {"10.1.2.3", "private"},
        {"172.16.0.1", "private"},
        {"172.31.255.255", "private"},
        {"192.168.1.1", "private"},
        {"169.254.169.254", "link-local"},
        {"100.64.0.1", "shared"},
        {"224.0.0.1", "multicast"},
        {"255.255.255.255", "reserved"},
        {"::1", "loopback"},
        {"::", "unspecified"},
        {"fd00::1", "unique local"},
        {"fe80::1", "link-local"},
        {"ff02::1", "multicast"},
        {"::ffff:127.0.0.1", "inside IPv6, loopback"},
        {"::ffff:169.254.169.254", "inside IPv6, link-local"},
        {"64:ff9b::a00:1", "inside IPv6, private"},
        {"2002:c0a8:101::1", "inside IPv6, private"},
        {"93.184.215.14", NULL},
        {"172.32.0.1", NULL},
        {"2606:4700::1111", NULL},
        {"::ffff:93.184.215.14", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char why[160] = "";
        int rc = netpolicy_allows_text(NULL, cases[i].addr, why, sizeof why);
        if (!cases[i].why)
            CHECK(rc == 1, "%s should be allowed: %s", cases[i].addr, why);
        else
            CHECK(rc == 0 && strstr(why, cases[i].why) && strstr(why, cases[i].addr),
                  "%s should be refused as %s: rc %d, '%s'", cases[i].addr, cases[i].why, rc, why);
    }
    char why[160];
    CHECK(netpolicy_allows_text(NULL, "localhost", why, sizeof why) == -1,
          "a name is not an address");
}

static void test_an_operators_list_lets_networks_through(void **state)
{
    (void)state;
    NetPolicy p;
    Err err = {0};
    CHECK(netpolicy_parse("127.0.0.0/8, 10.1.0.0/16 ::1", &p, &err) == 0, "%s", err.msg);
    CHECK(p.n == 3, "%zu networks read", p.n);
    char why[160];
    CHECK(netpolicy_allows_text(&p, "127.0.0.1", why, sizeof why) == 1, "loopback listed");
    CHECK(netpolicy_allows_text(&p, "::ffff:127.0.0.1", why, sizeof why) == 1,
          "loopback inside IPv6 listed");
    CHECK(netpolicy_allows_text(&p, "10.1.200.3", why, sizeof why) == 1, "10.1/16 listed");
    CHECK(netpolicy_allows_text(&p, "10.2.0.1", why, sizeof why) == 0, "10.2 is not listed");
    CHECK(netpolicy_allows_text(&p, "::1", why, sizeof why) == 1, "::1 listed");
    struct sockaddr_in in = {.sin_family = AF_INET};
    inet_pton(AF_INET, "169.254.169.254", &in.sin_addr);
    CHECK(!netpolicy_allows(&p, (struct sockaddr *)&in, why, sizeof why) &&
              strstr(why, "169.254.169.254"),
          "metadata refused through a sockaddr: %s", why);
    for (const char *bad = "10.0.0.0/33\0nonsense\0"
                           "1.2.3.4/\0";
         *bad; bad += strlen(bad) + 1)
        CHECK(netpolicy_parse(bad, &p, &err) == -1 && strstr(err.msg, "not a network"),
              "'%s' should be refused: %s", bad, err.msg);
    CHECK(netpolicy_parse("", &p, &err) == 0 && p.n == 0, "an empty list is none");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_internal_addresses_are_refused),
        cmocka_unit_test(test_an_operators_list_lets_networks_through),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
