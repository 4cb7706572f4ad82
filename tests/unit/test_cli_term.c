/* Tests of cli/term.c: what a server sends is shown on a terminal with every
 * control a terminal acts on (C0, DEL, C1, bytes outside UTF-8) replaced by a
 * visible escape, and everything else, other scripts included, as it is. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "term.h"
#include "util.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

static void expect_escaped(const char *in, size_t n, TermMode mode, const char *want)
{
    SBuf out;
    sbuf_init(&out);
    term_escape(&out, in, n, mode);
    const char *got = out.data ? out.data : "";
    CHECK(!strcmp(got, want), "%s: '%s' should show as '%s'",
          mode == TERM_LINE ? "one line" : "lines", got, want);
    sbuf_free(&out);
}

#define ESCAPED(in, mode, want) expect_escaped(in, sizeof in - 1, mode, want)

static void test_c0_del_and_c1_are_escaped(void **state)
{
    (void)state;
    /* An OSC that sets the title, a CSI that clears the screen, BEL, DEL. */
    ESCAPED("\x1b]0;owned\x07\x1b[2J\x7f", TERM_LINE, "\\x1b]0;owned\\x07\\x1b[2J\\x7f");
    /* CSI and OSC as C1 code points (U+009B, U+009D), and the first and last. */
    ESCAPED("a\xc2\x9b"
            "31m\xc2\x9d"
            "8;;\xc2\x80\xc2\x9f",
            TERM_LINE, "a\\u009b31m\\u009d8;;\\u0080\\u009f");
    /* A carriage return would let what follows overwrite the line. */
    ESCAPED("ok\rspoof", TERM_LINE, "ok\\rspoof");
    ESCAPED("a\0b", TERM_LINE, "a\\x00b");
}

static void test_newlines_and_tabs_by_mode(void **state)
{
    (void)state;
    ESCAPED("line 1\n\tline 2\r\n", TERM_LINE, "line 1\\n\\tline 2\\r\\n");
    ESCAPED("line 1\n\tline 2\r\n", TERM_LINES, "line 1\n\tline 2\\r\n");
    ESCAPED("\x1b[1A\n", TERM_LINES, "\\x1b[1A\n");
}

static void test_text_stays_as_it_is(void **state)
{
    (void)state;
    ESCAPED("plain ASCII ~!@#$%^&*() \\x1b", TERM_LINE, "plain ASCII ~!@#$%^&*() \\x1b");
    /* U+00A0 and on are characters: é, ✓, a 4-byte emoji, U+FFFD. */
    ESCAPED("caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80 \xc2\xa0 \xef\xbf\xbd", TERM_LINE,
            "caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80 \xc2\xa0 \xef\xbf\xbd");
    ESCAPED("", TERM_LINE, "");
}

static void test_bytes_outside_utf8_are_escaped(void **state)
{
    (void)state;
    /* A lone 0x9b is CSI to a terminal that does not speak UTF-8. */
    ESCAPED("a\x9b"
            "31mb",
            TERM_LINE, "a\\x9b31mb");
    /* Overlong forms of U+009B and of ESC, a surrogate, past U+10FFFF. */
    ESCAPED("\xe0\x82\x9b", TERM_LINE, "\\xe0\\x82\\x9b");
    ESCAPED("\xc0\x9b", TERM_LINE, "\\xc0\\x9b");
    ESCAPED("\xed\xa0\x80", TERM_LINE, "\\xed\\xa0\\x80");
    ESCAPED("\xf4\x90\x80\x80", TERM_LINE, "\\xf4\\x90\\x80\\x80");
    /* A sequence cut short, at the end and before another character. */
    ESCAPED("x\xe2\x9c", TERM_LINE, "x\\xe2\\x9c");
    ESCAPED("\xe2\x9cz", TERM_LINE, "\\xe2\\x9cz");
    ESCAPED("\xff\xfe", TERM_LINE, "\\xff\\xfe");
}

/* Every input, escaped, is well-formed UTF-8 without a control but the
 * newlines and tabs TERM_LINES keeps: escaping it again changes nothing. For
 * all 2-byte inputs, each followed by a C1's lead byte. */
static void test_nothing_gets_through(void **state)
{
    (void)state;
    for (int mode = TERM_LINE; mode <= TERM_LINES; mode++)
        for (unsigned a = 0; a < 256; a++)
            for (unsigned b = 0; b < 256; b++) {
                char in[3] = {(char)a, (char)b, '\xc2'};
                SBuf once, twice;
                sbuf_init(&once);
                sbuf_init(&twice);
                term_escape(&once, in, sizeof in, (TermMode)mode);
                term_escape(&twice, once.data, once.len, (TermMode)mode);
                for (size_t i = 0; i < once.len; i++) {
                    unsigned char c = (unsigned char)once.data[i];
                    bool kept = mode == TERM_LINES && (c == '\n' || c == '\t');
                    CHECK(kept || (c >= 0x20 && c != 0x7f),
                          "bytes %02x %02x c2: a control 0x%02x got through", a, b, c);
                }
                CHECK(twice.len == once.len && !memcmp(twice.data, once.data, once.len),
                      "bytes %02x %02x c2: '%s' still has something to escape", a, b, once.data);
                sbuf_free(&once);
                sbuf_free(&twice);
            }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_c0_del_and_c1_are_escaped),
        cmocka_unit_test(test_newlines_and_tabs_by_mode),
        cmocka_unit_test(test_text_stays_as_it_is),
        cmocka_unit_test(test_bytes_outside_utf8_are_escaped),
        cmocka_unit_test(test_nothing_gets_through),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
