/* api_schedules: the schedules' routes (reads by any node, changes by their
 * shard's leader), and the read of a batch, which shares theirs
 * (api_private.h). */
#include <stdlib.h>

#include "api_private.h"
#include "dbpool.h"
#include "parse.h"
#include "render.h"
#include "util.h"
#include "view.h"

/* ---- schedules (changes: admin) and batches ---- */

static bool check_schedule(Req *r, const char *name)
{
    return check_name(r, name, "schedule name");
}

void h_schedule_put(Req *r, char *const *p)
{
    if (!check_schedule(r, p[0]))
        return;
    Api *a = api_of(r);
    Err err = {0};
    json_t *body = body_json(r, &err);
    ParseLimits lim = {.max_batch = (size_t)a->cfg.max_batch,
                       .max_depth = (size_t)a->cfg.max_json_depth,
                       .max_payload_bytes = a->cfg.max_body,
                       .default_timeout_ms = a->cfg.default_timeout_ms,
                       .default_max_attempts = (int)a->cfg.default_max_attempts};
    ScheduleSpec *spec = body ? parse_schedule(body, &lim, &err) : NULL;
    json_decref(body);
    if (!spec) {
        req_finish_problem(r, &err);
        return;
    }
    MgrCmd *c = mgrcmd_new(MC_SCHEDULE_SET);
    c->name = xstrdup(p[0]);
    c->schedule = spec;
    to_looked_up_shard(r, p[0], true, queue_shard(a, spec->work.queue), c);
}

void reply_schedule_set(Req *r, const MgrCmd *c)
{
    req_finish_json(r, c->status,
                    render_schedule_spec(c->name, c->schedule, c->last_tick, c->decided_at));
}

static void schedule_cmd(Req *r, const char *name, MgrCmdType type, int pause)
{
    if (!check_schedule(r, name))
        return;
    MgrCmd *c = mgrcmd_new(type);
    c->name = xstrdup(name);
    c->pause = pause;
    to_looked_up_shard(r, name, true, -1, c);
}

void h_schedule_delete(Req *r, char *const *p)
{
    schedule_cmd(r, p[0], MC_SCHEDULE_DELETE, -1);
}

void h_schedule_pause(Req *r, char *const *p)
{
    schedule_cmd(r, p[0], MC_SCHEDULE_SET, 1);
}

void h_schedule_resume(Req *r, char *const *p)
{
    schedule_cmd(r, p[0], MC_SCHEDULE_SET, 0);
}

/* A read of the schedules or a batch, on a read-pool thread. */
typedef struct FlowRead {
    Req *r;
    char *key; /* the schedule or batch; NULL: every schedule */
    bool batch;
} FlowRead;

/* The answer of a flow read (a new reference), or NULL with err. */
static json_t *flow_read_json(ViewDbs *db, const FlowRead *t, Err *err)
{
    int64_t now = wall_ms();
    if (t->batch) {
        BatchView *b = view_batch_get(db, t->key, now, err);
        json_t *o = b ? render_batch(b) : NULL;
        view_batch_free(b);
        return o;
    }
    ScheduleList *l = view_schedules(db, t->key, err);
    json_t *o = !l ? NULL : t->key ? render_schedule(&l->items[0], now) : render_schedules(l, now);
    view_schedules_free(l);
    return o;
}

static void flow_read_task(ViewDbs *db, void *arg)
{
    FlowRead *t = arg;
    Err err = {0};
    json_t *o = flow_read_json(db, t, &err);
    if (!o) {
        req_finish_problem(t->r, &err);
    } else {
        req_finish_json(t->r, 200, o);
    }
    free(t->key);
    free(t);
}

static void flow_read(Req *r, const char *key, bool batch)
{
    FlowRead *t = xcalloc(1, sizeof *t);
    t->r = r;
    t->key = xstrdup(key);
    t->batch = batch;
    req_park(r);
    dbpool_submit(api_of(r)->pool, flow_read_task, t);
}

void h_schedules(Req *r, char *const *p)
{
    (void)p;
    flow_read(r, NULL, false);
}

void h_schedule_get(Req *r, char *const *p)
{
    if (check_schedule(r, p[0]))
        flow_read(r, p[0], false);
}

void h_batch_get(Req *r, char *const *p)
{
    if (!batch_id_valid(p[0])) {
        problem(r, 400, "invalid-path",
                "the batch id in the path must be 1-100 characters of A-Z a-z 0-9 . _ : @ -");
        return;
    }
    flow_read(r, p[0], true);
}
