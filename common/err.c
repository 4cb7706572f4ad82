/* err: see err.h. */
#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int err_set(Err *e, int status, const char *type, const char *fmt, ...)
{
    if (!e)
        return -1;
    e->status = status;
    snprintf(e->type, sizeof e->type, "%s", type ? type : "internal");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return -1;
}

void err_clear(Err *e)
{
    if (e)
        memset(e, 0, sizeof *e);
}
