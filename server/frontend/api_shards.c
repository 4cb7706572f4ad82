/* api_shards: where the API's commands go, a shard's leader (the local manager
 * or, through the proxy, another node), every shard, the shard a database says
 * a work or a schedule is in, the shards of a worker's batch; and the merging
 * of several shards' answers into one (api_private.h). */
#include <stdlib.h>
#include <string.h>

#include "api_private.h"
#include "dbpool.h"
#include "log.h"
#include "parse.h"
#include "proxy.h"
#include "shard.h"
#include "shards.h"
#include "util.h"
#include "view.h"

/* ---- a command to a shard's leader, and its answer ---- */

/* Leadership moved while the command waited: it is forwarded like any
 * request that reaches a node that does not lead (delayed, not failed). */
static void forward_again(Req *r, const MgrCmd *c)
{
    char *fwd = NULL;
    if (c->type == MC_SUBMIT) {
        json_t *norm = submit_json(c->items, c->n_items, r->bulk, c->batch_id, c->batch_callback);
        fwd = json_dumps(norm, JSON_COMPACT);
        json_decref(norm);
    }
    req_park(r);
    proxy_forward(api_of(r)->proxy, r->shard, r, fwd);
}

/* Runs on the HTTP thread once the manager has answered. */
static void cmd_reply(Req *r)
{
    const MgrCmd *c = r->state;
    /* Leadership moved, or another shard is creating the same id (its
     * commit will tell this one what the id is): asked again, through the
     * proxy's retries. */
    if (c->status == 503 &&
        (!strcmp(c->err.type, "not-leader") || !strcmp(c->err.type, "id-busy")) && !r->forwarded)
        forward_again(r, c);
    else if (c->status >= 400)
        req_finish_problem(r, &c->err);
    else
        api_replies[c->type](r, c);
}

/* Manager thread: hand the reply back to the HTTP thread. */
static void cmd_done(MgrCmd *c, void *ud)
{
    Req *r = ud;
    r->on_resume = cmd_reply;
    req_resume(r);
}

static bool cmd_alive(void *ud)
{
    return req_alive(ud);
}

static void cmd_free(void *c)
{
    mgrcmd_free(c);
}

/* r keeps c until it ends (the manager's reply is read from it). */
static void keep_cmd(Req *r, MgrCmd *c)
{
    r->state = c;
    r->free_state = cmd_free;
}

/* Sends c to shard `shard`'s leader: the local manager if this node leads
 * it, else through the proxy with forward_body (or the request's own body
 * when NULL). A request another node forwarded goes to the shard it names. */
void to_shard(Req *r, int shard, MgrCmd *c, char *forward_body)
{
    Api *a = api_of(r);
    if (r->shard >= 0)
        shard = r->shard;
    r->shard = shard;
    if (shard >= a->shards) { /* a forward from a node that counts more shards */
        mgrcmd_free(c);
        free(forward_body);
        problem(r, 503, "not-leader", "this node's cluster has fewer shards than the sender's");
        return;
    }
    if (shards_leads(a->mgrs, shard)) {
        free(forward_body);
        c->done = cmd_done;
        c->alive = cmd_alive;
        c->ud = r;
        keep_cmd(r, c);
        req_park(r);
        manager_send(shards_manager(a->mgrs, shard), c);
        return;
    }
    mgrcmd_free(c);
    if (r->forwarded) {
        free(forward_body);
        problem(r, 503, "not-leader",
                "this node is not the leader (forwarded requests are not forwarded again)");
        return;
    }
    req_park(r);
    proxy_forward(a->proxy, shard, r, forward_body);
}

/* The shard of queue q. */
int queue_shard(const Api *a, const char *q)
{
    return shard_of_queue(q, a->shards);
}

/* to_shard for a command that writes a queue's state (its work, limits, a
 * schedule): the queue's shard decides, and a forward that names another
 * (a node that counts shards otherwise, or a hand-made header) is refused
 * rather than let a queue live in two shards. */
void to_queue_shard(Req *r, int shard, MgrCmd *c, char *forward_body)
{
    if (r->shard >= 0 && r->shard != shard) {
        mgrcmd_free(c);
        free(forward_body);
        problem(r, 409, "shard-mismatch",
                "X-Workd-Shard names another shard than the queue's: do the nodes of this "
                "cluster agree on the shard count?");
        return;
    }
    to_shard(r, shard, c, forward_body);
}

/* Sends c to every shard and merges the answers, in a cluster of several
 * shards; else, or when forwarded to one shard, as to_shard. */
void to_all_shards(Req *r, MgrCmd *c, FanMerge merge)
{
    Api *a = api_of(r);
    if (a->shards == 1 || r->shard >= 0) {
        to_shard(r, 0, c, NULL);
        return;
    }
    mgrcmd_free(c);
    int all[SHARDS_MAX];
    for (int s = 0; s < a->shards; s++)
        all[s] = s;
    req_park(r);
    /* A heartbeat must not wait for a shard whose leader is stuck: the
     * others' leaders would find the worker silent meanwhile. */
    fanout_within(a->proxy, r, all, NULL, (size_t)a->shards,
                  merge == merge_heartbeat ? HEARTBEAT_CALL_MS : 0, merge, NULL);
}

/* ---- merging the shards' answers (fanout.h) ---- */

/* Whether attempt {id, attempt} is in list (a JSON array of them). */
static bool attempt_listed(const json_t *list, const json_t *att)
{
    size_t i;
    json_t *x;
    json_array_foreach(list, i, x)
    {
        if (json_equal(json_object_get(x, "id"), json_object_get(att, "id")) &&
            json_equal(json_object_get(x, "attempt"), json_object_get(att, "attempt")))
            return true;
    }
    return false;
}

/* A heartbeat: any shard's refusal; else shard 0's answer, whose "cancel"
 * is what every shard calls stale. An attempt lives in one shard, and the
 * others call it stale only because they do not know it: it is really stale
 * only if its own shard says so too. */
/* Whether a shard's leader gave no answer in time (a bounded call). */
static bool unanswered(const FanReply *x)
{
    return !strcmp(x->err.type, "shard-unavailable");
}

void merge_heartbeat(Req *r, FanReply *rs, size_t n, void *ud)
{
    /* A shard that did not answer in time is left out; then no attempt is
     * called stale (it may be that shard's). */
    size_t answered = 0, k0 = 0;
    for (size_t k = 0; k < n; k++)
        if (!unanswered(&rs[k]) && !answered++)
            k0 = k;
    const FanReply *bad = NULL;
    for (size_t k = 0; k < n && !bad; k++)
        if ((rs[k].status >= 400 || rs[k].status == 0) && !unanswered(&rs[k]))
            bad = &rs[k];
    if (bad || !answered) {
        req_finish_problem(r, bad ? &bad->err : &rs[0].err);
        return;
    }
    json_t *out = json_deep_copy(rs[k0].body);
    json_t *cancel = json_array();
    json_t *first = answered == n ? json_object_get(rs[0].body, "cancel") : NULL;
    size_t i;
    json_t *att;
    json_array_foreach(first, i, att)
    {
        bool everywhere = true;
        for (size_t k = 1; k < n && everywhere; k++)
            everywhere = attempt_listed(json_object_get(rs[k].body, "cancel"), att);
        if (everywhere)
            json_array_append(cancel, att);
    }
    json_object_del(out, "cancel");
    if (json_array_size(cancel))
        json_object_set(out, "cancel", cancel);
    json_decref(cancel);
    req_finish_json(r, 200, out);
}

/* Every shard's 204, or the first refusal. */
void merge_no_content(Req *r, FanReply *rs, size_t n, void *ud)
{
    const FanReply *bad = fan_first_error(rs, n);
    if (bad)
        req_finish_problem(r, &bad->err);
    else
        req_finish_raw(r, 204, NULL, NULL, 0);
}

/* Adds storage b (a shard's: its database's, when its manager runs that
 * database's retention, else nothing measured) into a: sizes and parts
 * summed, the oldest part and the stalest retention pass kept. */
static void merge_storage(json_t *a, const json_t *b)
{
    if (json_is_null(json_object_get(b, "retention_last_run_at")))
        return;
    if (json_is_null(json_object_get(a, "retention_last_run_at"))) {
        json_object_update(a, (json_t *)b);
        return;
    }
    static const char *const sums[] = {"parts", "events_bytes", "done_bytes", "open_bytes",
                                       "parts_dropped"};
    for (size_t i = 0; i < sizeof sums / sizeof *sums; i++)
        json_object_set_new(a, sums[i],
                            json_integer(json_integer_value(json_object_get(a, sums[i])) +
                                         json_integer_value(json_object_get(b, sums[i]))));
    /* RFC 3339 UTC times of one format compare as strings. */
    static const char *const oldest[] = {"oldest_part_at", "retention_last_run_at"};
    for (size_t i = 0; i < sizeof oldest / sizeof *oldest; i++) {
        const char *x = json_string_value(json_object_get(a, oldest[i]));
        const char *y = json_string_value(json_object_get(b, oldest[i]));
        if (y && (!x || strcmp(y, x) < 0))
            json_object_set(a, oldest[i], json_object_get(b, oldest[i]));
    }
}

/* /cluster: shard 0's leader and term (and the node's nodes and database),
 * the workers every shard knows, the open work of every shard, the storage
 * of every database, and a line per shard. */
void merge_cluster(Req *r, FanReply *rs, size_t n, void *ud)
{
    const FanReply *bad = fan_first_error(rs, n);
    if (bad) {
        req_finish_problem(r, &bad->err);
        return;
    }
    json_t *out = json_deep_copy(rs[0].body);
    json_t *workers = json_object(), *open = json_object(), *shards = json_array();
    json_int_t total = 0;
    for (size_t k = 0; k < n; k++) {
        const json_t *b = rs[k].body;
        size_t i;
        json_t *w;
        json_array_foreach(json_object_get(b, "workers"), i, w)
        {
            const char *id = json_string_value(json_object_get(w, "id"));
            json_t *have = id ? json_object_get(workers, id) : NULL;
            if (!have) {
                if (id)
                    json_object_set_new(workers, id, json_deep_copy(w));
                continue;
            }
            /* Known to several shards: its attempts are each one's. */
            json_t *running = json_object_get(have, "running");
            if (json_is_array(running) && json_is_array(json_object_get(w, "running")))
                json_array_extend(running, json_object_get(w, "running"));
            if (json_integer_value(json_object_get(w, "silent_ms")) <
                json_integer_value(json_object_get(have, "silent_ms"))) {
                json_object_set(have, "silent_ms", json_object_get(w, "silent_ms"));
                json_object_set(have, "last_heartbeat", json_object_get(w, "last_heartbeat"));
            }
        }
        json_object_update(open, json_object_get(b, "open"));
        if (k > 0)
            merge_storage(json_object_get(out, "storage"), json_object_get(b, "storage"));
        total += json_integer_value(json_object_get(b, "open_total"));
        json_array_extend(shards, json_object_get(b, "shards"));
    }
    json_t *list = json_array();
    const char *id;
    json_t *w;
    json_object_foreach(workers, id, w)
    {
        json_array_append(list, w);
    }
    json_decref(workers);
    json_object_set_new(out, "workers", list);
    json_object_set_new(out, "open", open);
    json_object_set_new(out, "open_total", json_integer(total));
    json_object_set_new(out, "shards", shards);
    req_finish_json(r, 200, out);
}

/* A bulk action: the counts summed, more if any shard has more. */
void merge_bulk(Req *r, FanReply *rs, size_t n, void *ud)
{
    const FanReply *bad = fan_first_error(rs, n);
    if (bad) {
        req_finish_problem(r, &bad->err);
        return;
    }
    const char *key = json_object_get(rs[0].body, "cancelled") ? "cancelled" : "retried";
    json_int_t done = 0;
    bool more = false;
    for (size_t k = 0; k < n; k++) {
        done += json_integer_value(json_object_get(rs[k].body, key));
        more = more || json_is_true(json_object_get(rs[k].body, "more"));
    }
    req_finish_json(r, 200, json_pack("{s:I, s:b}", key, done, "more", more));
}

/* ---- routing by work id: which shard holds it is in the database ---- */

/* What decides a command's shard by a row of the database: work (its id),
 * or a schedule (its name; a PUT's new queue must be in the same shard). */
typedef struct ShardLookup {
    Req *r;
    char *id;
    bool schedule;
    int want; /* a schedule PUT: its queue's shard; else -1 */
} ShardLookup;

/* HTTP thread: the shard is known (r->shard); the command goes there. */
static void send_looked_up(Req *r)
{
    MgrCmd *c = r->state;
    r->state = NULL;
    r->free_state = NULL;
    int shard = r->shard;
    r->shard = -1;
    to_shard(r, shard < 0 ? 0 : shard, c, NULL);
}

/* Read pool: finds the shard (none found: shard 0 says what there is to say). */
static void shard_lookup_task(ViewDbs *db, void *arg)
{
    ShardLookup *t = arg;
    Err err = {0};
    int shard = -1;
    int rc = t->schedule ? view_schedule_shard(db, t->id, &shard, &err)
                         : view_work_shard(db, t->id, &shard, &err);
    if (rc == 0 && t->want >= 0 && shard >= 0 && shard != t->want)
        rc = err_set(&err, 409, "schedule-moves-shard",
                     "schedule '%s' is in shard %d, and its new queue in shard %d: delete it "
                     "and create it again to move it",
                     t->id, shard, t->want);
    if (rc != 0) {
        req_finish_problem(t->r, &err);
    } else {
        if (shard < 0)
            shard = t->want;
        t->r->shard = shard;
        t->r->on_resume = send_looked_up;
        req_resume(t->r);
    }
    free(t->id);
    free(t);
}

/* Sends c to the shard the database says: that of work `id`, or of
 * schedule `id` (a PUT's queue's shard `want`, which must be the same). At
 * once in a cluster of one shard, or for a request another node forwarded
 * to its shard. */
void to_looked_up_shard(Req *r, const char *id, bool schedule, int want, MgrCmd *c)
{
    Api *a = api_of(r);
    if (a->shards == 1 || r->shard >= 0) {
        to_shard(r, 0, c, NULL);
        return;
    }
    keep_cmd(r, c);
    ShardLookup *t = xcalloc(1, sizeof *t);
    t->r = r;
    t->id = xstrdup(id);
    t->schedule = schedule;
    t->want = want;
    req_park(r);
    dbpool_submit(a->pool, shard_lookup_task, t);
}

void to_work_shard(Req *r, const char *id, MgrCmd *c)
{
    to_looked_up_shard(r, id, false, -1, c);
}

/* ---- a worker's batch (reports, progress) over several shards ---- */

/* The batch's items: their ids, and what the database said of their shards. */
typedef struct BatchRoute {
    Req *r;
    const char *key; /* the body's array: "reports" or "progress" */
    char **ids;      /* borrowed from the command (kept in r->state) */
    size_t n;
    int *shards;
    json_t *items; /* the body's items, once sent (for the unreachable ones' results) */
} BatchRoute;

size_t bodies_by_shard(const Api *a, const json_t *base, const char *key, const json_t *items,
                       const int *of, size_t n, int *shards, char **bodies)
{
    size_t parts = 0;
    for (int s = 0; s < a->shards; s++) {
        json_t *mine = json_array();
        for (size_t i = 0; i < n; i++)
            if (of[i] == s)
                json_array_append(mine, json_array_get(items, i));
        if (json_array_size(mine)) {
            json_t *part = json_deep_copy(base);
            json_object_set(part, key, mine);
            shards[parts] = s;
            bodies[parts++] = json_dumps(part, JSON_COMPACT);
            json_decref(part);
        }
        json_decref(mine);
    }
    return parts;
}

json_t *results_in_order(const FanReply *rs, size_t n, const int *of, const json_t *items,
                         size_t count)
{
    json_t *results = json_array();
    size_t next[SHARDS_MAX] = {0};
    for (size_t i = 0; i < count; i++) {
        if (of[i] == SHARD_UNREACHABLE) {
            /* Sent to no shard: the worker sends it again later. */
            const json_t *it = json_array_get(items, i);
            json_array_append_new(results,
                                  json_pack("{s:O, s:O, s:b, s:s}", "id", json_object_get(it, "id"),
                                            "attempt", json_object_get(it, "attempt"), "accepted",
                                            0, "reason", "unavailable"));
            continue;
        }
        size_t k = 0;
        while (k + 1 < n && rs[k].shard != of[i])
            k++;
        json_t *x = json_array_get(json_object_get(rs[k].body, "results"), next[k]++);
        json_array_append(results, x ? x : json_null());
    }
    return results;
}

/* The batch's answers, put back in the order of the request's items. */
static void merge_batch(Req *r, FanReply *rs, size_t n, void *ud)
{
    BatchRoute *b = ud;
    const FanReply *bad = fan_first_error(rs, n);
    if (bad)
        req_finish_problem(r, &bad->err);
    else
        req_finish_json(
            r, 200,
            json_pack("{s:o}", "results", results_in_order(rs, n, b->shards, b->items, b->n)));
    json_decref(b->items);
    free(b->shards);
    free(b);
}

/* HTTP thread: the shards are known; one: the command goes there; several:
 * each gets its items, and the answers are merged. */
static void send_batch(Req *r)
{
    Api *a = api_of(r);
    MgrCmd *c = r->state;
    BatchRoute *b = c->ud;
    c->ud = NULL;
    r->state = NULL;
    r->free_state = NULL;
    int first = -1;
    bool several = false;
    for (size_t i = 0; i < b->n; i++) {
        if (b->shards[i] == SHARD_UNREACHABLE) { /* answered here: sent again later */
            several = true;
            continue;
        }
        if (b->shards[i] < 0) /* unknown: any shard says so */
            b->shards[i] = first >= 0 ? first : 0;
        if (first < 0)
            first = b->shards[i];
        several = several || b->shards[i] != first;
    }
    if (!several) {
        to_shard(r, first, c, NULL);
        free(b->shards);
        free(b);
        return;
    }
    json_t *body = json_loadb(r->body.data, r->body.len, 0, NULL);
    int shards[SHARDS_MAX];
    char *bodies[SHARDS_MAX];
    b->items = json_incref(json_object_get(body, b->key));
    size_t parts = bodies_by_shard(a, body, b->key, b->items, b->shards, b->n, shards, bodies);
    json_decref(body);
    mgrcmd_free(c);
    req_park(r);
    fanout(a->proxy, r, shards, bodies, parts, merge_batch, b);
}

static void batch_lookup_task(ViewDbs *db, void *arg)
{
    BatchRoute *b = arg;
    Err err = {0};
    int rc = view_work_shards(db, b->ids, b->n, b->shards, &err);
    if (rc == -2)
        log_warn("a worker's batch: %s; its items there are answered 'unavailable'", err.msg);
    if (rc == -1) {
        ((MgrCmd *)b->r->state)->ud = NULL;
        free(b->ids);
        free(b->shards);
        Req *r = b->r;
        free(b);
        req_finish_problem(r, &err);
        return;
    }
    free(b->ids);
    b->ids = NULL;
    b->r->on_resume = send_batch;
    req_resume(b->r);
}

/* Sends a worker's batch (key: its body's array) to the shards of its
 * items' work. ids[0..n) are the items' work ids, borrowed from c. */
void to_batch_shards(Req *r, MgrCmd *c, const char *key, char **ids, size_t n)
{
    Api *a = api_of(r);
    if (a->shards == 1 || r->shard >= 0 || n == 1 || r->single) {
        const char *first = ids[0]; /* from c: valid after ids goes */
        free(ids);
        to_work_shard(r, first, c);
        return;
    }
    BatchRoute *b = xcalloc(1, sizeof *b);
    b->r = r;
    b->key = key;
    b->ids = ids;
    b->n = n;
    b->shards = xcalloc(n, sizeof *b->shards);
    keep_cmd(r, c);
    c->ud = b;
    req_park(r);
    dbpool_submit(a->pool, batch_lookup_task, b);
}
