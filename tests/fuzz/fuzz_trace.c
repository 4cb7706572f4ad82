/* Fuzzes the readers of W3C trace context (common/trace.c), which take
 * headers, body fields and SQL arguments: what trace_parent_parse accepts is
 * a version-00 traceparent that reads back as itself, what trace_state_valid
 * accepts is within its budget, and trace_keep keeps what it keeps. */
#include "fuzz.h"
#include "trace.h"

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *s = fuzz_cstr(data, size);
    char out[TRACEPARENT_LEN + 1], again[TRACEPARENT_LEN + 1];
    if (trace_parent_parse(s, out)) {
        FUZZ_CHECK(strlen(out) == TRACEPARENT_LEN && !strncmp(out, "00-", 3),
                   "'%s' was kept as '%s', not a version-00 traceparent", s, out);
        FUZZ_CHECK(trace_parent_parse(out, again) && !strcmp(out, again),
                   "'%s' was kept as '%s', which does not read back as itself", s, out);
    }
    if (trace_state_valid(s))
        FUZZ_CHECK(strlen(s) <= TRACESTATE_MAX_BYTES, "a tracestate of %zu bytes was kept",
                   strlen(s));
    /* The same bytes as a pair: what is kept once is kept again unchanged. */
    char *parent = xstrdup(s), *state = xstrdup(s);
    trace_keep(&parent, &state);
    char *p2 = xstrdup(parent), *s2 = xstrdup(state);
    trace_keep(&p2, &s2);
    FUZZ_CHECK(!parent == !p2 && (!parent || !strcmp(parent, p2)) && !state == !s2 &&
                   (!state || !strcmp(state, s2)),
               "trace_keep of '%s' is not stable", s);
    FUZZ_CHECK(parent || !state, "a tracestate was kept without its traceparent");
    free(parent);
    free(state);
    free(p2);
    free(s2);
    free(s);
    return 0;
}
