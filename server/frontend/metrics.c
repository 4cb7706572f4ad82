/* metrics: see metrics.h. */
#include "metrics.h"

void metrics_init(Metrics *m)
{
    for (int i = 0; i < METRICS_ROUTES; i++)
        histogram_init(&m->latency[i], histogram_us_bounds, 1e6);
}

void metrics_observe(Metrics *m, int route, int status, int64_t us)
{
    if (route < 0 || route >= METRICS_ROUTES)
        return;
    int cls = status / 100;
    atomic_fetch_add(&m->status[route][cls >= 1 && cls <= 5 ? cls : 0], 1);
    histogram_observe(&m->latency[route], us);
}

/* One gauge family: HELP, TYPE, then a sample per queue of limits that has
 * the field (a JSON number or boolean; null: not set, no sample). */
static void limit_family(SBuf *b, json_t *limits, const char *name, const char *help,
                         const char *field, const char *sub)
{
    sbuf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name);
    const char *q;
    json_t *l;
    json_object_foreach(limits, q, l)
    {
        json_t *v = json_object_get(l, field);
        if (sub)
            v = json_object_get(v, sub);
        if (json_is_boolean(v))
            sbuf_printf(b, "%s{queue=\"%s\"} %d\n", name, q, json_is_true(v));
        else if (json_is_number(v))
            sbuf_printf(b, "%s{queue=\"%s\"} %g\n", name, q, json_number_value(v));
    }
}

void metrics_render_flow(SBuf *b, json_t *limits, json_t *backlog, json_t *tokens)
{
    if (limits) {
        limit_family(b, limits, "workd_queue_paused",
                     "1 while the queue is paused (it hands out no work).", "paused", NULL);
        limit_family(b, limits, "workd_queue_max_running",
                     "The queue's limit of attempts running at once (absent: none).", "max_running",
                     NULL);
        limit_family(b, limits, "workd_queue_max_running_per_key",
                     "The queue's limit of attempts of one key running at once (absent: none).",
                     "max_running_per_key", NULL);
        sbuf_puts(b, "# HELP workd_queue_rate_limit_per_second The queue's rate limit, in starts "
                     "per second (absent: none).\n"
                     "# TYPE workd_queue_rate_limit_per_second gauge\n");
        const char *q;
        json_t *l;
        json_object_foreach(limits, q, l)
        {
            json_t *rate = json_object_get(l, "rate");
            double per = json_number_value(json_object_get(rate, "per"));
            if (json_is_object(rate) && per > 0)
                sbuf_printf(b, "workd_queue_rate_limit_per_second{queue=\"%s\"} %g\n", q,
                            (double)json_integer_value(json_object_get(rate, "limit")) / per);
        }
    }
    if (tokens) {
        sbuf_puts(b, "# HELP workd_queue_rate_tokens Starts the queue's rate limit allows now "
                     "(the leader's token bucket).\n"
                     "# TYPE workd_queue_rate_tokens gauge\n");
        const char *q;
        json_t *t;
        json_object_foreach(tokens, q, t)
        {
            sbuf_printf(b, "workd_queue_rate_tokens{queue=\"%s\"} %g\n", q,
                        json_number_value(json_object_get(t, "tokens")));
        }
    }
    if (backlog) {
        static const char *const fams[][3] = {
            {"workd_queue_key_backlog", "pending",
             "Ready work by queue and key: the keys with the most, the rest as key=\"(other)\", "
             "work without a key as key=\"(none)\"."},
            {"workd_queue_key_running", "running",
             "Running attempts by queue and key, for the keys of workd_queue_key_backlog."},
        };
        for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
            sbuf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n", fams[f][0], fams[f][2], fams[f][0]);
            const char *q;
            json_t *v;
            json_object_foreach(backlog, q, v)
            {
                size_t i;
                json_t *k;
                json_array_foreach(json_object_get(v, "keys"), i, k)
                {
                    const char *key = json_string_value(json_object_get(k, "key"));
                    sbuf_printf(b, "%s{queue=\"%s\",key=\"%s\"} %lld\n", fams[f][0], q,
                                key ? key : "(none)",
                                (long long)json_integer_value(json_object_get(k, fams[f][1])));
                }
                json_t *other = json_object_get(v, "other");
                if (json_integer_value(json_object_get(other, "keys")))
                    sbuf_printf(b, "%s{queue=\"%s\",key=\"(other)\"} %lld\n", fams[f][0], q,
                                (long long)json_integer_value(json_object_get(other, fams[f][1])));
            }
        }
    }
}
