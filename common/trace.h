/* trace: W3C Trace Context values (https://www.w3.org/TR/trace-context/) as a
 * receiver must read them. workd carries a producer's traceparent and
 * tracestate with its work, unchanged, to the worker; a value that does not
 * parse is ignored, never a reason to refuse the work. Pure functions. */
#ifndef WORKD_TRACE_H
#define WORKD_TRACE_H

#include <stdbool.h>

#define TRACEPARENT_LEN 55       /* "00-" 32 hex "-" 16 hex "-" 2 hex */
#define TRACESTATE_MAX_BYTES 512 /* what the spec asks a vendor to propagate at least */
#define TRACESTATE_MAX_MEMBERS 32

/* Writes the traceparent s means into out, in version-00 form, and returns
 * true; false (out untouched) when s is to be ignored. Version 00 is exactly
 * "00-<32 hex>-<16 hex>-<2 hex>", lower-case hex, neither id all zeros. A
 * later version (01-fe) is read as the spec says a version-00 receiver reads
 * one: its first fields in version-00 form, then the end or a dash, and it is
 * downgraded to 00. Version ff is invalid. */
bool trace_parent_parse(const char *s, char out[TRACEPARENT_LEN + 1]);

/* Whether s is a tracestate to keep: at most TRACESTATE_MAX_BYTES, at most
 * TRACESTATE_MAX_MEMBERS list members of key=value (key and value as the spec
 * defines them, optional blanks around each member, empty members allowed),
 * no key twice, and at least one member. */
bool trace_state_valid(const char *s);

/* Keeps what a receiver keeps of a pair it was given (both owned, either may
 * be NULL): *parent normalised by trace_parent_parse, or, when it is invalid,
 * both freed and set NULL (a tracestate means nothing without its parent);
 * *state freed and set NULL when it is not valid. */
void trace_keep(char **parent, char **state);

#endif
