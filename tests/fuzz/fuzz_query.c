/* Fuzzes the front-end's readers of headers, query parameters and path
 * segments, all with the same string: parse_seq (Last-Event-ID, ?after=),
 * parse_wait (?wait=), queue_name_valid, id_valid and work_id_valid. */
#include "fuzz.h"

#include <ctype.h>

#include "parse.h"

#define WAIT_MAX_MS 60000

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

static void seq(const char *s)
{
    int64_t v = -1;
    Err err = {0};
    if (parse_seq(s, &v, &err) != 0) {
        fuzz_check_problem(&err, 400, 400);
        return;
    }
    FUZZ_CHECK(v >= 0, "'%s' is the sequence number %lld", s, (long long)v);
    /* Decimal digits only: printed back, it is s without its leading zeros. */
    const char *digits = s;
    while (digits[0] == '0' && digits[1])
        digits++;
    char back[32];
    snprintf(back, sizeof back, "%lld", (long long)v);
    FUZZ_CHECK(!strcmp(back, digits), "'%s' was read as %s", s, back);
}

static void wait_param(const char *s)
{
    int64_t ms = -1;
    Err err = {0};
    if (parse_wait(s, WAIT_MAX_MS, &ms, &err) != 0) {
        fuzz_check_problem(&err, 400, 400);
        return;
    }
    FUZZ_CHECK(ms >= 0 && ms <= WAIT_MAX_MS, "?wait=%s is %lldms", s, (long long)ms);
}

/* n characters of [A-Za-z0-9] and the extra ones, with lo <= n <= hi. */
static bool made_of(const char *s, const char *extra, size_t lo, size_t hi)
{
    size_t n = strlen(s);
    for (size_t i = 0; i < n; i++)
        if (!isalnum((unsigned char)s[i]) && !strchr(extra, s[i]))
            return false;
    return n >= lo && n <= hi;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_cstr(data, size);
    seq(s);
    wait_param(s);
    bool dots = !strcmp(s, ".") || !strcmp(s, ".."); /* path segments a URL resolves away */
    FUZZ_CHECK(queue_name_valid(s) == (made_of(s, "_.-", 1, 64) && !dots),
               "queue_name_valid('%s') is %d", s, queue_name_valid(s));
    FUZZ_CHECK(id_valid(s) == (made_of(s, "._:@-", 1, ID_MAX) && !dots), "id_valid('%s') is %d", s,
               id_valid(s));
    FUZZ_CHECK(work_id_valid(s) == (made_of(s, "._:@~-", 1, ID_MAX) && !dots),
               "work_id_valid('%s') is %d", s, work_id_valid(s));
    free(s);
    return 0;
}
