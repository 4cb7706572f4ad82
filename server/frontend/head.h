/* head: the framing of a request's head (RFC 9112), judged line by line
 * before anything else reads it, so that no two parties can read one request
 * differently (request smuggling). Pure: no I/O, no state (fuzzed). */
#ifndef WORKD_HEAD_H
#define WORKD_HEAD_H

#include <stdbool.h>
#include <stddef.h>

#include "err.h"

/* What head_line has seen of a head's lines; zero it before the first. The
 * string pointers borrow the lines given (valid while the head is). */
typedef struct HeadCheck {
    int hosts, lengths, encodings;
    const char *length, *encoding; /* the last Content-Length, Transfer-Encoding */
    bool bad_name, bad_host, length_differs;
    bool bad_value;    /* a value holding a control byte (NUL, CR, LF, ...) other than HTAB */
    char name[48];     /* the first header name that is not a token, printable */
    char value_of[48]; /* ...the name of the first bad value's header */
} HeadCheck;
/* Takes one header line (every line, duplicates included, in order). */
void head_line(HeadCheck *h, const char *key, size_t key_len, const char *value, size_t value_len);
/* Refuses a head whose framing two parties could read differently (request
 * smuggling): 400 for two Hosts or none in HTTP/1.1, a header name that is not
 * a token, a value with a control byte (NUL, CR, LF), two Content-Lengths,
 * Content-Length with Transfer-Encoding, Transfer-Encoding in HTTP/1.0 or not
 * ending in chunked, or "chunked" with whitespace around it (a parser that
 * trims reads it as chunked, one that does not as no framing at all); 501 for
 * any coding but "chunked" alone. Returns 0 or -1 with err. */
int head_check(const HeadCheck *h, bool http11, Err *err) WARN_UNUSED;

#endif
