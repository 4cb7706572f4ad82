/* config: see config.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "util.h"

static void env_name(const char *name, char *out, size_t outlen)
{
    size_t j = (size_t)snprintf(out, outlen, "WORKD_");
    for (size_t i = 0; name[i] && j + 1 < outlen; i++)
        out[j++] = name[i] == '-' ? '_' : (char)toupper((unsigned char)name[i]);
    out[j] = '\0';
}

WARN_UNUSED static int set_value(const OptSpec *o, const char *val, const char *source, Err *err)
{
    switch (o->type) {
    case OPT_STRING:
    case OPT_LIST: {
        char **t = o->target;
        free(*t);
        *t = xstrdup(val);
        return 0;
    }
    case OPT_BOOL: {
        bool *t = o->target;
        if (!strcasecmp(val, "1") || !strcasecmp(val, "true") || !strcasecmp(val, "yes") ||
            !strcasecmp(val, "on"))
            *t = true;
        else if (!strcasecmp(val, "0") || !strcasecmp(val, "false") || !strcasecmp(val, "no") ||
                 !strcasecmp(val, "off") || !*val)
            *t = false;
        else
            return err_set(err, 400, "bad-config", "%s: '%s' is not a boolean (use true or false)",
                           source, val);
        return 0;
    }
    case OPT_INT: {
        char *end;
        errno = 0;
        long long v = strtoll(val, &end, 10);
        if (end == val || *end || errno)
            return err_set(err, 400, "bad-config", "%s: '%s' is not an integer", source, val);
        if ((o->min || o->max) && (v < o->min || v > o->max))
            return err_set(err, 400, "bad-config", "%s: %lld is out of range [%lld, %lld]", source,
                           v, (long long)o->min, (long long)o->max);
        *(int64_t *)o->target = v;
        return 0;
    }
    case OPT_DURATION: {
        int64_t ms;
        if (duration_parse(val, &ms) != 0)
            return err_set(err, 400, "bad-config",
                           "%s: '%s' is not a duration (examples: 2s, 250ms, 1.5)", source, val);
        if ((o->min || o->max) && (ms < o->min || ms > o->max))
            return err_set(err, 400, "bad-config", "%s: '%s' is out of range [%lldms, %lldms]",
                           source, val, (long long)o->min, (long long)o->max);
        *(int64_t *)o->target = ms;
        return 0;
    }
    }
    return err_set(err, 500, "bad-config", "%s: unknown option type", source);
}

static const OptSpec *find(const OptSpec *specs, size_t n, const char *name, size_t len)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(specs[i].name) == len && strncmp(specs[i].name, name, len) == 0)
            return &specs[i];
    return NULL;
}

/* Adds val to the list in o's target: "old,val". */
static void list_append(const OptSpec *o, const char *val)
{
    char **t = o->target;
    SBuf s;
    sbuf_init(&s);
    sbuf_printf(&s, "%s,%s", *t, val);
    free(*t);
    *t = sbuf_steal(&s);
}

int config_parse(const OptSpec *specs, size_t n, int argc, char **argv, int first, int *rest,
                 bool *help_wanted, Err *err)
{
    *help_wanted = false;
    /* The OPT_LIST options already given on the command line: their next
     * occurrence appends instead of replacing. */
    bool *given = xcalloc(n ? n : 1, sizeof *given);
    int rc = -1;
    /* Defaults, then environment. */
    for (size_t i = 0; i < n; i++) {
        const OptSpec *o = &specs[i];
        char src[96];
        snprintf(src, sizeof src, "default of --%s", o->name);
        if (o->def && set_value(o, o->def, src, err) != 0)
            goto cleanup;
        char env[80];
        env_name(o->name, env, sizeof env);
        const char *v = getenv(env);
        if (v && set_value(o, v, env, err) != 0)
            goto cleanup;
    }
    int i = first;
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            *help_wanted = true;
            continue;
        }
        if (strncmp(a, "--", 2) != 0)
            break;
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        const char *name = a + 2;
        const char *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const OptSpec *o = find(specs, n, name, len);
        if (!o) {
            err_set(err, 400, "bad-config", "unknown option '%s' (see --help)", a);
            goto cleanup;
        }
        char src[96];
        snprintf(src, sizeof src, "--%s", o->name);
        const char *val;
        if (eq) {
            val = eq + 1;
        } else if (o->type == OPT_BOOL) {
            val = "true";
        } else {
            if (i + 1 >= argc) {
                err_set(err, 400, "bad-config", "%s needs a value", src);
                goto cleanup;
            }
            val = argv[++i];
        }
        size_t k = (size_t)(o - specs);
        if (o->type == OPT_LIST && given[k])
            list_append(o, val);
        else if (set_value(o, val, src, err) != 0)
            goto cleanup;
        given[k] = true;
    }
    *rest = i;
    rc = 0;
cleanup:
    free(given);
    return rc;
}

int config_cli(const OptSpec *specs, size_t n, int argc, char **argv, int first, const char *prog,
               const char *synopsis)
{
    for (int i = first; i < argc; i++) {
        if (!strcmp(argv[i], "--"))
            break;
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            config_usage(stdout, synopsis, specs, n);
            return 1;
        }
        if (!strcmp(argv[i], "--version")) {
            printf("%s %s\n", prog, WORKD_VERSION);
            return 1;
        }
    }
    Err err = {0};
    int rest;
    bool help;
    if (config_parse(specs, n, argc, argv, first, &rest, &help, &err) != 0) {
        fprintf(stderr, "%s: %s\n", prog, err.msg);
        return -1;
    }
    if (rest < argc) {
        fprintf(stderr, "%s: unexpected argument '%s' (see --help)\n", prog, argv[rest]);
        return -1;
    }
    return 0;
}

void config_usage(FILE *out, const char *synopsis, const OptSpec *specs, size_t n)
{
    fprintf(out, "%s\n\nOptions (each also read from the environment variable shown):\n", synopsis);
    for (size_t i = 0; i < n; i++) {
        const OptSpec *o = &specs[i];
        char env[80];
        env_name(o->name, env, sizeof env);
        const char *arg = o->type == OPT_BOOL       ? ""
                          : o->type == OPT_INT      ? " N"
                          : o->type == OPT_DURATION ? " DURATION"
                          : o->type == OPT_LIST     ? " VALUE[,VALUE...]"
                                                    : " VALUE";
        fprintf(out, "  --%s%s\n      %s\n      env %s", o->name, arg, o->help, env);
        if (o->def && *o->def)
            fprintf(out, ", default %s", o->def);
        fprintf(out, "\n");
    }
    fprintf(out, "  --help\n      show this text\n  --version\n      print the version and exit\n");
}

void config_free(const OptSpec *specs, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (specs[i].type == OPT_STRING || specs[i].type == OPT_LIST) {
            char **t = specs[i].target;
            free(*t);
            *t = NULL;
        }
}

char **strv_split(const char *s)
{
    size_t cap = 4, len = 0;
    char **v = xcalloc(cap, sizeof *v);
    const char *p = s ? s : "";
    while (*p) {
        const char *c = strchr(p, ',');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        const char *a = p, *b = p + n;
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
        if (b > a) {
            if (len + 2 > cap) {
                cap *= 2;
                v = xrealloc(v, cap * sizeof *v);
            }
            v[len] = xmalloc((size_t)(b - a) + 1);
            memcpy(v[len], a, (size_t)(b - a));
            v[len][b - a] = '\0';
            len++;
        }
        p += n;
        if (*p == ',')
            p++;
    }
    v[len] = NULL;
    return v;
}

void strv_free(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

size_t strv_len(char *const *v)
{
    size_t n = 0;
    while (v && v[n])
        n++;
    return n;
}

char **strv_copy(char *const *v)
{
    if (!v)
        return NULL;
    size_t n = strv_len(v);
    char **out = xcalloc(n + 1, sizeof *out);
    for (size_t i = 0; i < n; i++)
        out[i] = xstrdup(v[i]);
    return out;
}

bool strv_contains(char *const *v, const char *s)
{
    for (size_t i = 0; v && v[i]; i++)
        if (strcmp(v[i], s) == 0)
            return true;
    return false;
}
