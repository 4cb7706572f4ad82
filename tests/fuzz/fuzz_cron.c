/* Fuzzes the schedule's parsers of untrusted text: cron_parse (PUT
 * /schedules), tz_parse_rule (a tzfile's footer) and tz_parse_tzif (a tzfile,
 * as a whole). A parsed expression must yield fire times strictly after their
 * start in UTC and in a zone with daylight saving; a parsed tzfile must
 * convert any instant, and its instants of a label must show that label. */
#include "cron.h"
#include "fuzz.h"
#include "tz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

#define T0 INT64_C(1767225600000) /* 2026-01-01 */

static void cron_text(const char *s)
{
    CronExpr c;
    Err err = {0};
    if (cron_parse(s, &c, &err) != 0) {
        FUZZ_CHECK(err.status == 400 && err.type[0], "a refused cron gives %d '%s'", err.status,
                   err.type);
        return;
    }
    TzZone berlin = {0};
    berlin.has_rule = tz_parse_rule("CET-1CEST,M3.5.0,M10.5.0/3", &berlin.rule, NULL) == 0;
    const TzZone utc = {0};
    const TzZone *zones[] = {&utc, &berlin};
    for (size_t z = 0; z < 2; z++) {
        int64_t t = T0 + 89 * 86400000LL; /* late March: a DST change ahead */
        for (int i = 0; i < 3; i++) {
            int64_t next = cron_next(&c, zones[z], t);
            if (next == INT64_MAX)
                break;
            FUZZ_CHECK(next > t && next % 1000 == 0, "'%s' fires at %lld after %lld", s,
                       (long long)next, (long long)t);
            t = next;
        }
    }
}

static void tz_bytes(const uint8_t *data, size_t size)
{
    TzZone z;
    Err err = {0};
    if (tz_parse_tzif(data, size, &z, &err) != 0)
        return;
    for (int64_t t = -2000000000LL; t < 4000000000LL; t += 123456789) {
        int32_t off = tz_offset(&z, t);
        int64_t inst[2];
        size_t n = tz_instants(&z, t + off, inst);
        for (size_t i = 0; i < n; i++)
            FUZZ_CHECK(inst[i] + tz_offset(&z, inst[i]) == t + off,
                       "an instant of a label shows another label");
    }
    tz_clear(&z);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_cstr(data, size);
    cron_text(s);
    TzRule r;
    (void)tz_parse_rule(s, &r, NULL);
    free(s);
    tz_bytes(data, size);
    return 0;
}
