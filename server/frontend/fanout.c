/* fanout: see fanout.h. */
#include "fanout.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

typedef struct Fan {
    Req *r;
    FanMerge merge;
    void *ud;
    size_t n;
    atomic_size_t pending; /* replies to come, and one for the sender while it sends */
    FanReply *replies;
} Fan;

typedef struct FanPart {
    Fan *fan;
    size_t i;
} FanPart;

static void fan_finish(Fan *f)
{
    f->merge(f->r, f->replies, f->n, f->ud);
    for (size_t i = 0; i < f->n; i++)
        json_decref(f->replies[i].body);
    free(f->replies);
    free(f);
}

static void fan_release(Fan *f)
{
    if (atomic_fetch_sub(&f->pending, 1) == 1)
        fan_finish(f);
}

void fan_problem(const json_t *body, int status, Err *err)
{
    const char *type = json_string_value(json_object_get(body, "type"));
    const char *detail = json_string_value(json_object_get(body, "detail"));
    const char *slash = type ? strrchr(type, '/') : NULL;
    err_set(err, status, slash ? slash + 1 : "internal", "%s",
            detail ? detail : "a shard's leader refused the request");
}

static void part_done(void *ud, const ProxyReply *reply)
{
    FanPart *part = ud;
    FanReply *out = &part->fan->replies[part->i];
    out->status = reply->status;
    if (reply->err) {
        out->err = *reply->err;
    } else {
        out->body = reply->len ? json_loadb(reply->body, reply->len, 0, NULL) : NULL;
        if (out->status >= 400)
            fan_problem(out->body, out->status, &out->err);
    }
    Fan *f = part->fan;
    free(part);
    fan_release(f);
}

void fanout(Proxy *p, Req *r, const int *shards, char **bodies, size_t n, FanMerge merge, void *ud)
{
    fanout_within(p, r, shards, bodies, n, 0, merge, ud);
}

void fanout_within(Proxy *p, Req *r, const int *shards, char **bodies, size_t n, int64_t within_ms,
                   FanMerge merge, void *ud)
{
    Fan *f = xcalloc(1, sizeof *f);
    f->r = r;
    f->merge = merge;
    f->ud = ud;
    f->n = n;
    f->replies = xcalloc(n + 1, sizeof *f->replies);
    atomic_store(&f->pending, n + 1);
    for (size_t i = 0; i < n; i++) {
        f->replies[i].shard = shards[i];
        FanPart *part = xcalloc(1, sizeof *part);
        part->fan = f;
        part->i = i;
        proxy_call_within(p, shards[i], r, bodies ? bodies[i] : NULL, within_ms, part_done, part);
    }
    fan_release(f);
}

const FanReply *fan_first_error(const FanReply *replies, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (replies[i].status >= 400 || replies[i].status == 0)
            return &replies[i];
    return NULL;
}
