/* term: text from a server made safe to show on a terminal. Everything the
 * command line prints for people from an answer (a table, a work item's
 * fields, a stream's events, a problem's detail) passes through here; --json
 * prints the API's JSON and does not. */
#ifndef WORKD_CLI_TERM_H
#define WORKD_CLI_TERM_H

#include <stddef.h>
#include <stdio.h>

#include "util.h"

typedef enum {
    TERM_LINE,  /* one line: a newline or a tab is escaped too */
    TERM_LINES, /* a text of lines (an error's stack trace): newlines and tabs kept */
} TermMode;

/* Appends the n bytes of s to out with everything a terminal would act on
 * replaced by a visible escape, as git and systemctl show such text: the C0
 * controls as \r, \n, \t or \xNN (ESC is \x1b, BEL \x07), DEL as \x7f, the
 * C1 controls U+0080..U+009F as \u0080..\u009f (a terminal may take U+009B
 * for CSI), and a byte that is not part of well-formed UTF-8 as \xNN (one
 * of 0x80..0x9f is a C1 control to a terminal that does not speak UTF-8).
 * The rest, printable ASCII and any other character, is copied as it is. */
void term_escape(SBuf *out, const char *s, size_t n, TermMode mode);

/* Prints the formatted text on f as one line, escaped as TERM_LINE, and a
 * newline. The format's arguments may be anything a server sent. */
void term_line(FILE *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
