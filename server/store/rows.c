/* rows: see rows.h. */
#include "rows.h"

#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "util.h"

void rows_time_field(json_t *o, const char *key, const PGresult *r, int row, int col)
{
    if (PQgetisnull(r, row, col)) {
        json_object_set_new(o, key, json_null());
        return;
    }
    char buf[40];
    time_format(db_int(r, row, col), buf, sizeof buf);
    json_object_set_new(o, key, json_string(buf));
}

json_t *rows_json(const PGresult *r, int row, int col)
{
    const char *s = db_str(r, row, col);
    json_t *v = s ? json_loads(s, JSON_DECODE_ANY, NULL) : NULL;
    return v ? v : json_null();
}

/* The caller owns the result's weights (queue_limits_clear). */
QueueLimits rows_queue_limits(const PGresult *r, int i)
{
    QueueLimits l = {.paused = !strcmp(PQgetvalue(r, i, 1), "t"),
                     .max_running = (int)db_int(r, i, 2),
                     .max_running_per_key = (int)db_int(r, i, 3),
                     .rate_limit = (int)db_int(r, i, 4),
                     .rate_period_ms = db_int(r, i, 5)};
    json_t *w = PQgetisnull(r, i, 6) ? NULL : json_loads(db_str(r, i, 6), 0, NULL);
    if (json_is_object(w) && json_object_size(w)) {
        const char *k;
        json_t *x;
        l.weights = xcalloc(json_object_size(w), sizeof *l.weights);
        json_object_foreach(w, k, x)
        {
            if (!json_is_integer(x) || json_integer_value(x) < 1 ||
                json_integer_value(x) > QL_MAX_WEIGHT)
                continue; /* only the leader writes it, from a checked event */
            l.weights[l.n_weights].key = xstrdup(k);
            l.weights[l.n_weights++].weight = (int)json_integer_value(x);
        }
        queue_limits_sort(&l);
    }
    json_decref(w);
    return l;
}

char *text_array(char *const *v, size_t n)
{
    SBuf b;
    sbuf_init(&b);
    sbuf_puts(&b, "{");
    for (size_t i = 0; i < n; i++) {
        sbuf_puts(&b, i ? "," : "");
        db_array_text(&b, v[i]);
    }
    sbuf_puts(&b, "}");
    return sbuf_steal(&b);
}

char *seqs_array(const int64_t *v, size_t n)
{
    SBuf b;
    sbuf_init(&b);
    sbuf_puts(&b, "{");
    for (size_t i = 0; i < n; i++)
        sbuf_printf(&b, "%s%lld", i ? "," : "", (long long)v[i]);
    sbuf_puts(&b, "}");
    return sbuf_steal(&b);
}
