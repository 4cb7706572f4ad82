/* fuzz: what the libFuzzer targets of tests/fuzz share: the entry points'
 * prototypes, turning untrusted bytes into a C string, and checks of the
 * parsers' promises that abort (libFuzzer keeps the input as a crash). */
#ifndef WORKD_FUZZ_H
#define WORKD_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "err.h"
#include "log.h"
#include "util.h"

/* ---- libFuzzer's entry points ---- */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* ---- helpers ---- */

/* A NUL-terminated copy of data[0, size) (the caller frees it). An embedded NUL
 * cuts the string short, as it would for a header or a path. */
static inline char *fuzz_cstr(const uint8_t *data, size_t size)
{
    char *s = xmalloc(size + 1);
    if (size)
        memcpy(s, data, size);
    s[size] = '\0';
    return s;
}

/* Turns logging off: the worker logs every job it ignores, which would only
 * slow the fuzzer down. */
static inline void fuzz_quiet(void)
{
    log_setup("fuzz", "fuzz", (LogLevel)(LOG_ERROR + 1), false);
}

/* Fails the run with a sentence when a promise of the code under test does not
 * hold for this input. */
#define FUZZ_CHECK(cond, ...)                                                                      \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "fuzz check failed (%s:%d): ", __FILE__, __LINE__);                    \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* An error that becomes a problem+json answer (req_finish_problem) must say
 * which kind it is and have a message that is valid UTF-8: jansson refuses
 * anything else, and the answer could not be built. */
static inline void fuzz_check_problem(const Err *e, int lo, int hi)
{
    FUZZ_CHECK(e->status >= lo && e->status <= hi, "a refusal has the status %d (want %d-%d)",
               e->status, lo, hi);
    FUZZ_CHECK(e->type[0], "a refusal (%d) has no type", e->status);
    json_t *msg = json_string(e->msg);
    FUZZ_CHECK(msg, "the message of a refusal is not valid UTF-8: %s", e->msg);
    json_decref(msg);
}

#endif
