/* db: see db.h. */
#include "db.h"

#include <stdlib.h>
#include <string.h>

#include "util.h"

PGconn *db_connect(const char *url, const char *app, Err *err)
{
    char appname[64];
    snprintf(appname, sizeof appname, "workd-%s", app);
    /* Every statement of workd looks rows up by key among few: the planner,
     * misled by young tables and unnest()'s row estimate, picked hash joins
     * that read all of workd_work per commit (5x the CPU). */
    const char *keys[] = {"dbname",
                          "application_name",
                          "keepalives",
                          "keepalives_idle",
                          "keepalives_interval",
                          "keepalives_count",
                          "tcp_user_timeout",
                          "connect_timeout",
                          "options",
                          NULL};
    const char *vals[] = {url,     appname, "1",
                          "5",     "2",     "3",
                          "10000", "5",     "-c enable_hashjoin=off -c enable_mergejoin=off",
                          NULL};
    PGconn *c = PQconnectdbParams(keys, vals, 1);
    if (!c || PQstatus(c) != CONNECTION_OK) {
        const char *msg = c ? PQerrorMessage(c) : "out of memory";
        char clean[400];
        snprintf(clean, sizeof clean, "%s", msg);
        size_t n = strlen(clean);
        while (n && (clean[n - 1] == '\n' || clean[n - 1] == ' '))
            clean[--n] = '\0';
        err_set(err, 503, "database-unavailable", "cannot connect to PostgreSQL: %s", clean);
        PQfinish(c);
        return NULL;
    }
    return c;
}

int db_check(PGconn *c, PGresult *res, const char *what, Err *err)
{
    ExecStatusType st = res ? PQresultStatus(res) : PGRES_FATAL_ERROR;
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK)
        return 0;
    char msg[400];
    snprintf(msg, sizeof msg, "%s", res ? PQresultErrorMessage(res) : PQerrorMessage(c));
    size_t n = strlen(msg);
    while (n && (msg[n - 1] == '\n' || msg[n - 1] == ' '))
        msg[--n] = '\0';
    bool gone = PQstatus(c) != CONNECTION_OK;
    err_set(err, gone ? 503 : 500, gone ? "database-unavailable" : "database-error", "%s: %s", what,
            msg);
    return -1;
}

PGresult *db_exec(PGconn *c, const char *sql, int nparams, const char *const *params,
                  const char *what, Err *err)
{
    PGresult *r = PQexecParams(c, sql, nparams, NULL, params, NULL, NULL, 0);
    if (db_check(c, r, what, err) != 0) {
        PQclear(r);
        return NULL;
    }
    return r;
}

int64_t db_int(const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col))
        return 0;
    return strtoll(PQgetvalue(r, row, col), NULL, 10);
}

const char *db_str(const PGresult *r, int row, int col)
{
    return PQgetisnull(r, row, col) ? NULL : PQgetvalue(r, row, col);
}

void db_array_text(SBuf *b, const char *s)
{
    if (!s) {
        sbuf_puts(b, "NULL");
        return;
    }
    sbuf_append(b, "\"", 1);
    for (const char *p = s; *p; p++) {
        if (*p == '"' || *p == '\\')
            sbuf_append(b, "\\", 1);
        sbuf_append(b, p, 1);
    }
    sbuf_append(b, "\"", 1);
}
