/* term: see term.h. */
#include "term.h"

#include <stdarg.h>
#include <stdlib.h>

/* The length of the well-formed UTF-8 sequence (RFC 3629: no overlong form,
 * no surrogate, nothing past U+10FFFF) that starts p, of at most n bytes;
 * 0 when there is none. */
static size_t utf8_len(const unsigned char *p, size_t n)
{
    unsigned char c = p[0];
    size_t len;
    unsigned char lo = 0x80, hi = 0xBF; /* the second byte's range */
    if (c >= 0xC2 && c <= 0xDF) {
        len = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0)
            lo = 0xA0;
        else if (c == 0xED)
            hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0)
            lo = 0x90;
        else if (c == 0xF4)
            hi = 0x8F;
    } else {
        return 0;
    }
    if (n < len || p[1] < lo || p[1] > hi)
        return 0;
    for (size_t i = 2; i < len; i++)
        if ((p[i] & 0xC0) != 0x80)
            return 0;
    return len;
}

void term_escape(SBuf *out, const char *s, size_t n, TermMode mode)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        /* A run of what needs no escape is copied at once. */
        size_t run = i;
        while (run < n && p[run] >= 0x20 && p[run] < 0x7F)
            run++;
        sbuf_append(out, p + i, run - i);
        i = run;
        if (i == n)
            break;
        unsigned char c = p[i];
        if (c < 0x80) { /* C0 or DEL */
            if ((c == '\n' || c == '\t') && mode == TERM_LINES)
                sbuf_append(out, &c, 1);
            else if (c == '\n')
                sbuf_puts(out, "\\n");
            else if (c == '\r')
                sbuf_puts(out, "\\r");
            else if (c == '\t')
                sbuf_puts(out, "\\t");
            else
                sbuf_printf(out, "\\x%02x", c);
            i++;
            continue;
        }
        size_t len = utf8_len(p + i, n - i);
        if (len == 0) {
            sbuf_printf(out, "\\x%02x", c);
            i++;
        } else if (len == 2 && c == 0xC2 && p[i + 1] <= 0x9F) { /* U+0080..U+009F */
            sbuf_printf(out, "\\u%04x", p[i + 1]);
            i += 2;
        } else {
            sbuf_append(out, p + i, len);
            i += len;
        }
    }
}

void term_line(FILE *f, const char *fmt, ...)
{
    SBuf safe;
    sbuf_init(&safe);
    va_list ap;
    va_start(ap, fmt);
    char *text;
    int len = vasprintf(&text, fmt, ap);
    va_end(ap);
    if (len >= 0) {
        term_escape(&safe, text, (size_t)len, TERM_LINE);
        free(text);
    }
    sbuf_puts(&safe, "\n");
    fwrite(safe.data, 1, safe.len, f);
    sbuf_free(&safe);
}
