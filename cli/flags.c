/* flags: see flags.h. */
#include "flags.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void strs_add(Strs *s, const char *value)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 4;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = value;
}

void strs_free(Strs *s)
{
    free(s->v);
    *s = (Strs){0};
}

static const Flag *find(const FlagTable *tables, size_t ntables, const char *name, size_t len)
{
    for (size_t t = 0; t < ntables; t++)
        for (size_t i = 0; i < tables[t].n; i++) {
            const Flag *f = &tables[t].flags[i];
            if (strlen(f->name) == len && !strncmp(f->name, name, len))
                return f;
        }
    return NULL;
}

/* Adds each non-empty element of a comma-separated value. The elements point
 * into val, which is cut at the commas (argv is ours to change). */
static void add_list(Strs *s, char *val)
{
    char *save = NULL;
    for (char *tok = strtok_r(val, ",", &save); tok; tok = strtok_r(NULL, ",", &save))
        if (*tok)
            strs_add(s, tok);
}

WARN_UNUSED static int set_value(const Flag *f, char *val, Err *err)
{
    OptNum *num = f->target;
    char *end;
    switch (f->type) {
    case FLAG_STR:
        *(const char **)f->target = val;
        return 0;
    case FLAG_LIST:
        add_list(f->target, val);
        return 0;
    case FLAG_BOOL:
        *(bool *)f->target = true;
        return 0;
    case FLAG_INT: {
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (end == val || *end || errno)
            return err_set(err, 400, "usage", "--%s: '%s' is not an integer", f->name, val);
        *num = (OptNum){.set = true, .i = v, .d = (double)v};
        return 0;
    }
    case FLAG_NUM: {
        errno = 0;
        double v = strtod(val, &end);
        if (end == val || *end || errno || !isfinite(v))
            return err_set(err, 400, "usage", "--%s: '%s' is not a number", f->name, val);
        *num = (OptNum){.set = true, .i = (int64_t)v, .d = v};
        return 0;
    }
    case FLAG_DUR: {
        int64_t ms;
        if (duration_parse(val, &ms) != 0 || ms < 0)
            return err_set(err, 400, "usage",
                           "--%s: '%s' is not a duration (examples: 30, 1.5s, 250ms, 5m, 2h)",
                           f->name, val);
        *num = (OptNum){.set = true, .i = ms, .d = (double)ms / 1000.0};
        return 0;
    }
    }
    return err_set(err, 400, "usage", "--%s: unknown flag type", f->name);
}

int flags_parse(const FlagTable *tables, size_t ntables, int argc, char **argv, int first,
                Strs *pos, bool *help, Err *err)
{
    /* --help wins over anything else on the line, a bad flag included. */
    *help = false;
    for (int i = first; i < argc && strcmp(argv[i], "--") != 0; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            *help = true;
    if (*help)
        return 0;
    bool only_pos = false;
    for (int i = first; i < argc; i++) {
        char *a = argv[i];
        if (only_pos || a[0] != '-' || !strcmp(a, "-")) {
            strs_add(pos, a);
            continue;
        }
        if (!strcmp(a, "--")) {
            only_pos = true;
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            return err_set(err, 400, "usage", "unknown flag '%s' (flags are --long)", a);
        char *name = a + 2;
        char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const Flag *f = find(tables, ntables, name, len);
        if (!f)
            return err_set(err, 400, "usage", "unknown flag '--%.*s'", (int)len, name);
        char *val;
        if (f->type == FLAG_BOOL) {
            if (eq)
                return err_set(err, 400, "usage", "--%s takes no value", f->name);
            val = NULL;
        } else if (eq) {
            val = eq + 1;
        } else {
            if (i + 1 >= argc)
                return err_set(err, 400, "usage", "--%s needs a value (%s)", f->name, f->metavar);
            val = argv[++i];
        }
        if (set_value(f, val, err) != 0)
            return -1;
    }
    return 0;
}

/* Prints text wrapped at about 78 columns, each line after the first indented
 * by indent spaces (the first is where the caller left the cursor). */
static void wrap(FILE *out, const char *text, int indent)
{
    int col = indent;
    const char *p = text;
    while (*p) {
        const char *sp = strchr(p, ' ');
        int word = sp ? (int)(sp - p) : (int)strlen(p);
        if (col > indent && col + 1 + word > 78) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (col > indent) {
            fputc(' ', out);
            col++;
        }
        fprintf(out, "%.*s", word, p);
        col += word;
        p += word;
        while (*p == ' ')
            p++;
    }
    fputc('\n', out);
}

void flags_usage(FILE *out, const char *title, const FlagTable *t)
{
    if (!t->n)
        return;
    fprintf(out, "\n%s:\n", title);
    for (size_t i = 0; i < t->n; i++) {
        const Flag *f = &t->flags[i];
        char head[64];
        snprintf(head, sizeof head, "--%s%s%s", f->name, f->metavar ? " " : "",
                 f->metavar ? f->metavar : "");
        if (strlen(head) <= 22)
            fprintf(out, "  %-22s  ", head);
        else
            fprintf(out, "  %s\n  %-22s  ", head, "");
        wrap(out, f->help, 26);
    }
}
