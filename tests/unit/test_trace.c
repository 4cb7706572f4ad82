/* Tests of common/trace.c: traceparent and tracestate are read as the W3C
 * Trace Context Recommendation tells a receiver to read them, so that what
 * workd keeps and hands to a worker is always a value a tracer accepts, and
 * what a tracer would ignore is ignored. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "trace.h"
#include "util.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

#define TP "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

static void expect_parent(const char *in, const char *want)
{
    char out[TRACEPARENT_LEN + 1] = "untouched";
    bool ok = trace_parent_parse(in, out);
    if (want) {
        CHECK(ok, "traceparent '%s' should be accepted", in);
        CHECK(!strcmp(out, want), "traceparent '%s' should read as '%s', not '%s'", in, want, out);
    } else {
        CHECK(!ok, "traceparent '%s' should be ignored", in ? in : "(null)");
        CHECK(!strcmp(out, "untouched"), "an ignored traceparent must leave out alone");
    }
}

static void test_traceparent(void **state)
{
    (void)state;
    expect_parent(TP, TP);
    expect_parent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00", /* not sampled */
                  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
    expect_parent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff", /* unknown flags */
                  "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-ff");
    /* A later version: its version-00 fields are used, the rest dropped. */
    expect_parent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TP);
    expect_parent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes-next", TP);
    static const char *const bad[] = {
        NULL,
        "",
        "00",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",     /* no flags */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-", /* version 00 ends there */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
        "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01", /* upper-case hex */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",
        "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01", /* all-zero trace-id */
        "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01", /* all-zero parent-id */
        "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", /* forbidden version */
        "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01", /* dashes misplaced */
        "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01 ", /* trailing blank */
        " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902bz-01",      /* not hex */
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01.more", /* a later version: a
                                                                          dash must follow */
        "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",       /* too short */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        expect_parent(bad[i], NULL);
}

static void expect_state(const char *s, bool valid)
{
    CHECK(trace_state_valid(s) == valid, "tracestate '%s' should be %s", s ? s : "(null)",
          valid ? "kept" : "dropped");
}

static void test_tracestate(void **state)
{
    (void)state;
    expect_state("rojo=00f067aa0ba902b7", true);
    expect_state("congo=t61rcWkgMzE,rojo=00f067aa0ba902b7", true);
    expect_state("  congo=t61rcWkgMzE ,\trojo=00f067aa0ba902b7\t", true); /* blanks around */
    expect_state("rojo=00f067aa0ba902b7,,  ,congo=x", true);              /* empty members */
    expect_state("tenant@vendor=a b", true); /* a multi-tenant key; a blank inside the value */
    expect_state("k= leading", true);        /* leading blanks belong to the value */
    expect_state("0key_-*/@=v!\"#$%&'()*+-./:;<>?[\\]^_`{|}~", true);
    expect_state(NULL, false);
    expect_state("", false); /* nothing to keep */
    expect_state(" , ", false);
    expect_state("rojo", false);                  /* no value */
    expect_state("rojo=", false);                 /* an empty value */
    expect_state("=value", false);                /* no key */
    expect_state("Rojo=1", false);                /* upper case in a key */
    expect_state("_rojo=1", false);               /* a key starts with a letter or digit */
    expect_state("ro jo=1", false);               /* a blank in a key */
    expect_state("rojo=1=2", false);              /* '=' in a value */
    expect_state("rojo=caf\xc3\xa9", false);      /* not ASCII */
    expect_state("rojo=a\x01z", false);           /* a control character */
    expect_state("rojo=1,congo=2,rojo=3", false); /* a key twice */
    char buf[TRACESTATE_MAX_BYTES + 64];

    /* 32 members are kept, 33 are not. */
    buf[0] = '\0';
    for (int i = 0; i < TRACESTATE_MAX_MEMBERS; i++)
        snprintf(buf + strlen(buf), sizeof buf - strlen(buf), "%sk%d=v", i ? "," : "", i);
    expect_state(buf, true);
    snprintf(buf + strlen(buf), sizeof buf - strlen(buf), ",k%d=v", TRACESTATE_MAX_MEMBERS);
    expect_state(buf, false);

    /* 512 bytes are kept, 513 are not. */
    memset(buf, 0, sizeof buf);
    strcpy(buf, "k=");
    memset(buf + 2, 'v', 254);
    strcat(buf, ",l=");
    memset(buf + strlen(buf), 'v', 253);
    CHECK(strlen(buf) == 512, "the test's tracestate should be 512 bytes, not %zu", strlen(buf));
    expect_state(buf, true);
    strcat(buf, "v");
    expect_state(buf, false); /* 513 bytes */

    /* A key of 256 characters and a value of 256 are the most. */
    memset(buf, 0, sizeof buf);
    memset(buf, 'k', 256);
    strcat(buf, "=v");
    expect_state(buf, true);
    buf[256] = 'k';
    buf[257] = '=';
    buf[258] = 'v';
    expect_state(buf, false);
    memset(buf, 0, sizeof buf);
    strcpy(buf, "k=");
    memset(buf + 2, 'v', 256);
    expect_state(buf, true);
    strcat(buf, "v");
    expect_state(buf, false);
}

static void test_keep(void **state)
{
    (void)state;
    char *p = xstrdup(TP), *s = xstrdup("rojo=1");
    trace_keep(&p, &s);
    CHECK(p && !strcmp(p, TP) && s && !strcmp(s, "rojo=1"), "a valid pair is kept as it is");
    free(p);
    free(s);

    p = xstrdup("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x");
    s = xstrdup("bad state");
    trace_keep(&p, &s);
    CHECK(p && !strcmp(p, TP), "a later version should be kept as version 00, not '%s'",
          p ? p : "(null)");
    CHECK(!s, "an invalid tracestate is dropped, its traceparent kept");
    free(p);

    p = xstrdup("00-00000000000000000000000000000000-00f067aa0ba902b7-01");
    s = xstrdup("rojo=1");
    trace_keep(&p, &s);
    CHECK(!p && !s, "an invalid traceparent drops its tracestate with it");

    p = NULL;
    s = xstrdup("rojo=1");
    trace_keep(&p, &s);
    CHECK(!p && !s, "a tracestate without a traceparent is dropped");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_traceparent),
        cmocka_unit_test(test_tracestate),
        cmocka_unit_test(test_keep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
