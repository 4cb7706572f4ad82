/* Tests of common/cron.c and common/tz.c: expressions parse or are refused
 * with the field named; fire times in UTC, with seconds, with both day
 * fields; and daylight saving in Europe/Berlin and America/New_York: the
 * skipped hour does not fire, the repeated hour fires once (or by the clock
 * for an hour-wildcard expression). The zones come from the system tzfiles. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "cron.h"
#include "tz.h"
#include "util.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

static int64_t at(const char *rfc3339)
{
    int64_t ms = 0;
    Err err = {0};
    if (time_parse(rfc3339, &ms, &err) != 0)
        fail_msg("bad test time %s", rfc3339);
    return ms;
}

static const TzZone *zone(const char *name)
{
    Err err = {0};
    const TzZone *z = tz_get(name, &err);
    CHECK(z, "zone %s: %s", name, err.msg);
    return z;
}

/* Checks that the fire times of expr in zone after `from` are want[0..n). */
static void expect_fires(const char *expr, const char *tz, const char *from,
                         const char *const *want, size_t n)
{
    CronExpr c;
    Err err = {0};
    CHECK(cron_parse(expr, &c, &err) == 0, "'%s' should parse: %s", expr, err.msg);
    int64_t t = at(from);
    for (size_t i = 0; i < n; i++) {
        int64_t next = cron_next(&c, zone(tz), t);
        char got[40];
        time_format(next, got, sizeof got);
        CHECK(next == at(want[i]), "'%s' in %s: fire %zu after %s should be %s, not %s", expr, tz,
              i + 1, from, want[i], got);
        t = next;
    }
}

static void test_parse_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *expr, *field;
    } bad[] = {{"60 * * * *", "minute"},      {"* 24 * * *", "hour"},
               {"* * 0 * *", "day of month"}, {"* * * 13 *", "month"},
               {"* * * * 8", "day of week"},  {"*/0 * * * *", "minute"},
               {"5-1 * * * *", "minute"},     {"x * * * *", "minute"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        CronExpr c;
        Err err = {0};
        CHECK(cron_parse(bad[i].expr, &c, &err) != 0, "'%s' should be refused", bad[i].expr);
        CHECK(strstr(err.msg, bad[i].field), "the refusal of '%s' should name the %s field: %s",
              bad[i].expr, bad[i].field, err.msg);
    }
    CronExpr c;
    Err err = {0};
    CHECK(cron_parse("* * *", &c, &err) != 0, "three fields should be refused");
    CHECK(cron_parse("* * * * * * *", &c, &err) != 0, "seven fields should be refused");
    CHECK(cron_parse("@daily", &c, &err) == 0, "@daily should parse");
    CHECK(cron_parse("0 9 * JAN-MAR mon-fri", &c, &err) == 0, "names should parse: %s", err.msg);
}

static void test_utc_and_seconds(void **state)
{
    (void)state;
    const char *const every15s[] = {"2026-05-01T10:00:15Z", "2026-05-01T10:00:30Z",
                                    "2026-05-01T10:00:45Z", "2026-05-01T10:01:00Z"};
    expect_fires("*/15 * * * * *", "UTC", "2026-05-01T10:00:07.500Z", every15s, 4);
    const char *const hourly[] = {"2026-05-01T11:00:00Z", "2026-05-01T12:00:00Z"};
    expect_fires("@hourly", "UTC", "2026-05-01T10:00:00Z", hourly, 2);
    /* Both day fields restricted: the 13th or a Friday (May 2026: Fri 1, 8, 13 is a Wed). */
    const char *const either[] = {"2026-05-08T00:00:00Z", "2026-05-13T00:00:00Z",
                                  "2026-05-15T00:00:00Z"};
    expect_fires("0 0 13 * 5", "UTC", "2026-05-01T00:00:00Z", either, 3);
    /* Weekday 7 is Sunday; ranges with steps. */
    const char *const sundays[] = {"2026-05-03T06:00:00Z", "2026-05-10T06:00:00Z"};
    expect_fires("0 6 * * 7", "UTC", "2026-05-01T00:00:00Z", sundays, 2);
    const char *const leapday[] = {"2028-02-29T00:00:00Z", "2032-02-29T00:00:00Z"};
    expect_fires("0 0 29 2 *", "UTC", "2026-01-01T00:00:00Z", leapday, 2);
    CronExpr never;
    Err err = {0};
    CHECK(cron_parse("0 0 30 2 *", &never, &err) == 0, "Feb 30 parses");
    CHECK(cron_next(&never, zone("UTC"), at("2026-01-01T00:00:00Z")) == INT64_MAX,
          "February 30 never comes");
}

static void test_berlin_spring_forward(void **state)
{
    (void)state;
    /* 2026-03-29: 02:00 CET becomes 03:00 CEST (01:00Z); 02:30 does not exist. */
    const char *const daily[] = {"2026-03-28T01:30:00Z", "2026-03-30T00:30:00Z"};
    expect_fires("30 2 * * *", "Europe/Berlin", "2026-03-27T12:00:00Z", daily, 2);
    /* An hour-wildcard expression just goes on by the clock. */
    const char *const halfhourly[] = {"2026-03-29T00:30:00Z", "2026-03-29T01:00:00Z",
                                      "2026-03-29T01:30:00Z"};
    expect_fires("*/30 * * * *", "Europe/Berlin", "2026-03-29T00:00:00Z", halfhourly, 3);
    /* 03:00 local exists (it is the first minute of CEST). */
    const char *const three[] = {"2026-03-29T01:00:00Z"};
    expect_fires("0 3 * * *", "Europe/Berlin", "2026-03-28T12:00:00Z", three, 1);
}

static void test_berlin_fall_back(void **state)
{
    (void)state;
    /* 2026-10-25: 03:00 CEST becomes 02:00 CET (01:00Z); 02:30 occurs at
     * 00:30Z and 01:30Z and fires once, at the first. */
    const char *const daily[] = {"2026-10-24T00:30:00Z", "2026-10-25T00:30:00Z",
                                 "2026-10-26T01:30:00Z"};
    expect_fires("30 2 * * *", "Europe/Berlin", "2026-10-23T12:00:00Z", daily, 3);
    /* From inside the second pass, the repeated time is not fired again. */
    const char *const after2nd[] = {"2026-10-26T01:30:00Z"};
    expect_fires("30 2 * * *", "Europe/Berlin", "2026-10-25T01:10:00Z", after2nd, 1);
    /* Every half hour: both passes of the repeated hour, in real time. */
    const char *const halfhourly[] = {"2026-10-25T00:30:00Z", "2026-10-25T01:00:00Z",
                                      "2026-10-25T01:30:00Z", "2026-10-25T02:00:00Z"};
    expect_fires("*/30 * * * *", "Europe/Berlin", "2026-10-25T00:00:00Z", halfhourly, 4);
}

static void test_new_york(void **state)
{
    (void)state;
    /* 2026-03-08: 02:00 EST becomes 03:00 EDT (07:00Z): 02:00 does not exist. */
    const char *const spring[] = {"2026-03-07T07:00:00Z", "2026-03-09T06:00:00Z"};
    expect_fires("0 2 * * *", "America/New_York", "2026-03-06T12:00:00Z", spring, 2);
    /* 2026-11-01: 02:00 EDT becomes 01:00 EST (06:00Z): 01:30 occurs twice. */
    const char *const fall[] = {"2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"};
    expect_fires("30 1 * * *", "America/New_York", "2026-10-31T12:00:00Z", fall, 2);
    /* Far past the tzfile's transitions, the footer's rule still applies. */
    const char *const future[] = {"2040-07-04T13:00:00Z", "2041-01-04T14:00:00Z"};
    expect_fires("0 9 4 1,7 *", "America/New_York", "2040-07-01T00:00:00Z", future, 2);
}

static void test_tz_rules_and_names(void **state)
{
    (void)state;
    TzRule r;
    Err err = {0};
    CHECK(tz_parse_rule("EST5EDT,M3.2.0,M11.1.0", &r, &err) == 0, "EST5EDT: %s", err.msg);
    CHECK(r.std_off == -5 * 3600 && r.dst_off == -4 * 3600, "EST5EDT offsets");
    CHECK(tz_parse_rule("<+0330>-3:30", &r, &err) == 0 && r.std_off == 12600 && !r.has_dst,
          "a quoted name and minutes");
    CHECK(tz_parse_rule("CET-1CEST,M3.5.0", &r, &err) != 0, "a rule without its end is refused");
    CHECK(!tz_name_valid("../etc/passwd") && !tz_name_valid("/etc/passwd") && !tz_name_valid(""),
          "paths are not zone names");
    CHECK(tz_get("Nowhere/Atlantis", &err) == NULL && err.status == 400, "unknown zone: 400");
    CHECK(tz_offset(zone("Europe/Berlin"), at("2026-07-01T00:00:00Z") / 1000) == 7200,
          "Berlin in July is UTC+2");
    CHECK(tz_offset(zone("Europe/Berlin"), at("2026-01-01T00:00:00Z") / 1000) == 3600,
          "Berlin in January is UTC+1");
    unsigned char junk[60] = "TZif2";
    TzZone z;
    CHECK(tz_parse_tzif(junk, sizeof junk, &z, &err) != 0, "a truncated tzfile is refused");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_refusals),
        cmocka_unit_test(test_utc_and_seconds),
        cmocka_unit_test(test_berlin_spring_forward),
        cmocka_unit_test(test_berlin_fall_back),
        cmocka_unit_test(test_new_york),
        cmocka_unit_test(test_tz_rules_and_names),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    tz_cache_free();
    return rc;
}
