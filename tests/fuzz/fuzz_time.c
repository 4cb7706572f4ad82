/* Fuzzes the readers of times and durations with the same string:
 * time_parse (run_at, a job's deadline) and duration_parse (configuration).
 * A time read must format (time_format, as a follower forwards run_at and the
 * API shows times) into text that reads back as the same instant. */
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

static void time_text(const char *s)
{
    int64_t ms;
    Err err = {0};
    if (time_parse(s, &ms, &err) != 0) {
        FUZZ_CHECK(err.status == 400 && err.type[0], "a refused time gives %d '%s'", err.status,
                   err.type);
        return;
    }
    char text[64];
    time_format(ms, text, sizeof text);
    int64_t again;
    FUZZ_CHECK(time_parse(text, &again, NULL) == 0,
               "'%s' is %lldms, formatted as '%s', which does not read back", s, (long long)ms,
               text);
    FUZZ_CHECK(again == ms, "'%s' is %lldms, formatted as '%s', which reads back as %lldms", s,
               (long long)ms, text, (long long)again);
}

static void duration_text(const char *s)
{
    int64_t ms;
    if (duration_parse(s, &ms) != 0)
        return;
    FUZZ_CHECK(ms >= 0 && ms <= 9000000000000000LL, "the duration '%s' is %lldms", s,
               (long long)ms);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_cstr(data, size);
    time_text(s);
    duration_text(s);
    free(s);
    return 0;
}
