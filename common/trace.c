/* trace: see trace.h. The grammar is the W3C Recommendation's (section 3.2
 * for traceparent, 3.3 for tracestate). */
#include "trace.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

static bool lower_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

/* n lower-case hex digits at s; with nonzero, not all of them '0'. */
static bool hex_field(const char *s, size_t n, bool nonzero)
{
    bool zero = true;
    for (size_t i = 0; i < n; i++) {
        if (!lower_hex(s[i]))
            return false;
        zero = zero && s[i] == '0';
    }
    return !(nonzero && zero);
}

bool trace_parent_parse(const char *s, char out[TRACEPARENT_LEN + 1])
{
    if (!s)
        return false;
    size_t len = strnlen(s, TRACEPARENT_LEN + 1);
    if (len < TRACEPARENT_LEN || !hex_field(s, 2, false) || s[2] != '-' ||
        (s[0] == 'f' && s[1] == 'f'))
        return false;
    /* Version 00 has nothing after the flags; a later one may have more
     * fields, each after a dash. */
    if (s[0] == '0' && s[1] == '0' ? len != TRACEPARENT_LEN
                                   : s[TRACEPARENT_LEN] != '\0' && s[TRACEPARENT_LEN] != '-')
        return false;
    if (!hex_field(s + 3, 32, true) || s[35] != '-' || !hex_field(s + 36, 16, true) ||
        s[52] != '-' || !hex_field(s + 53, 2, false))
        return false;
    memcpy(out, s, TRACEPARENT_LEN);
    out[0] = out[1] = '0';
    out[TRACEPARENT_LEN] = '\0';
    return true;
}

static bool blank(char c)
{
    return c == ' ' || c == '\t';
}

static bool key_char(char c)
{
    return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-' || c == '*' ||
           c == '/' || c == '@';
}

/* Printable ASCII but ',' and '=' (a value's chr). */
static bool value_char(char c)
{
    return c >= 0x20 && c <= 0x7e && c != ',' && c != '=';
}

/* One list member between a and b, blanks trimmed, not empty. */
static bool member_valid(const char *a, const char *b, size_t *key_len)
{
    const char *eq = memchr(a, '=', (size_t)(b - a));
    if (!eq)
        return false;
    size_t kn = (size_t)(eq - a), vn = (size_t)(b - eq - 1);
    if (kn < 1 || kn > 256 || vn < 1 || vn > 256 ||
        !((a[0] >= 'a' && a[0] <= 'z') || (a[0] >= '0' && a[0] <= '9')))
        return false;
    for (size_t i = 0; i < kn; i++)
        if (!key_char(a[i]))
            return false;
    /* The value's last character is not a blank: the trim saw to that. */
    for (size_t i = 0; i < vn; i++)
        if (!value_char(eq[1 + i]))
            return false;
    *key_len = kn;
    return true;
}

bool trace_state_valid(const char *s)
{
    if (!s)
        return false;
    size_t len = strnlen(s, TRACESTATE_MAX_BYTES + 1);
    if (len > TRACESTATE_MAX_BYTES)
        return false;
    const char *keys[TRACESTATE_MAX_MEMBERS];
    size_t key_lens[TRACESTATE_MAX_MEMBERS], n = 0;
    const char *p = s, *end = s + len;
    for (;;) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *a = p, *b = comma ? comma : end;
        while (a < b && blank(*a))
            a++;
        while (b > a && blank(b[-1]))
            b--;
        if (a < b) { /* an empty member is allowed, and not counted */
            size_t kn;
            if (n == TRACESTATE_MAX_MEMBERS || !member_valid(a, b, &kn))
                return false;
            for (size_t i = 0; i < n; i++)
                if (key_lens[i] == kn && !memcmp(keys[i], a, kn))
                    return false; /* one entry per key */
            keys[n] = a;
            key_lens[n++] = kn;
        }
        if (!comma)
            break;
        p = comma + 1;
    }
    return n > 0;
}

void trace_keep(char **parent, char **state)
{
    char norm[TRACEPARENT_LEN + 1];
    if (!*parent || !trace_parent_parse(*parent, norm)) {
        free(*parent);
        free(*state);
        *parent = *state = NULL;
        return;
    }
    if (strcmp(*parent, norm) != 0) {
        free(*parent);
        *parent = xstrdup(norm);
    }
    if (*state && !trace_state_valid(*state)) {
        free(*state);
        *state = NULL;
    }
}
