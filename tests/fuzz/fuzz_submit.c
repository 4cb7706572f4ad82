/* Fuzzes POST /work as h_submit reads it: the body through parse_json_body and
 * parse_submit. Then what a follower does with accepted items: it forwards
 * their normalised form (submit_items_json) to the leader, which must parse it
 * back to the same items. Input: an optional first line
 * "Idempotency-Key: KEY", then the body. */
#include "fuzz.h"

#include <jansson.h>

#include "parse.h"

#define NOW_MS 1767225600000LL /* 2026-01-01T00:00:00Z: the same clock on both nodes */

static const char key_header[] = "Idempotency-Key: ";

static const ParseLimits limits = {
    .max_batch = 1000, .max_depth = 32, .default_timeout_ms = 60000, .default_max_attempts = 3};

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    return 0;
}

static void check_same(const SubmitItem *a, const SubmitItem *b, size_t i)
{
    FUZZ_CHECK(!strcmp(a->id, b->id), "item %zu: id '%s' came back as '%s'", i, a->id, b->id);
    FUZZ_CHECK(!strcmp(a->queue, b->queue), "item %zu: queue '%s' came back as '%s'", i, a->queue,
               b->queue);
    FUZZ_CHECK(a->priority == b->priority, "item %zu: priority %d came back as %d", i, a->priority,
               b->priority);
    FUZZ_CHECK(a->run_at == b->run_at, "item %zu: run_at %lld came back as %lld", i,
               (long long)a->run_at, (long long)b->run_at);
    FUZZ_CHECK(a->timeout_ms == b->timeout_ms, "item %zu: timeout %lldms came back as %lldms", i,
               (long long)a->timeout_ms, (long long)b->timeout_ms);
    FUZZ_CHECK(a->max_attempts == b->max_attempts, "item %zu: max_attempts %d came back as %d", i,
               a->max_attempts, b->max_attempts);
    FUZZ_CHECK(json_equal(a->payload, b->payload), "item %zu: the payload changed on the way", i);
}

/* The leader's side of a forward: the normalised items must parse as they were. */
static void check_forward(const SubmitItem *items, size_t n, bool bulk)
{
    json_t *norm = submit_items_json(items, n, bulk);
    char *fwd = json_dumps(norm, JSON_COMPACT);
    json_decref(norm);
    FUZZ_CHECK(fwd, "the normalised items cannot be serialised");
    Err err = {0};
    json_t *body = parse_json_body(fwd, strlen(fwd), limits.max_depth, &err);
    FUZZ_CHECK(body, "the leader refuses the forwarded body %s: %s", fwd, err.msg);
    SubmitItem *again;
    size_t n2;
    bool bulk2;
    int rc = parse_submit(body, NULL, NOW_MS, &limits, &again, &n2, &bulk2, &err);
    FUZZ_CHECK(rc == 0, "the leader refuses the forwarded items %s: %s", fwd, err.msg);
    FUZZ_CHECK(n2 == n && bulk2 == bulk, "%zu items (bulk %d) came back as %zu (bulk %d)", n, bulk,
               n2, bulk2);
    for (size_t i = 0; i < n; i++)
        check_same(&items[i], &again[i], i);
    submit_items_free(again, n2);
    json_decref(body);
    free(fwd);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *key = NULL;
    const size_t hlen = sizeof key_header - 1;
    if (size >= hlen && !memcmp(data, key_header, hlen)) {
        const uint8_t *nl = memchr(data + hlen, '\n', size - hlen);
        size_t klen = nl ? (size_t)(nl - (data + hlen)) : size - hlen;
        key = fuzz_cstr(data + hlen, klen);
        size_t skip = hlen + klen + (nl ? 1 : 0);
        data += skip;
        size -= skip;
    }
    Err err = {0};
    json_t *body = parse_json_body((const char *)data, size, limits.max_depth, &err);
    if (!body) {
        fuzz_check_problem(&err, 400, 400);
        free(key);
        return 0;
    }
    SubmitItem *items;
    size_t n;
    bool bulk;
    if (parse_submit(body, key, NOW_MS, &limits, &items, &n, &bulk, &err) == 0) {
        FUZZ_CHECK(n >= 1 && n <= limits.max_batch, "%zu items accepted", n);
        for (size_t i = 0; i < n; i++) {
            const SubmitItem *it = &items[i];
            FUZZ_CHECK(id_valid(it->id), "item %zu has the invalid id '%s'", i, it->id);
            FUZZ_CHECK(queue_name_valid(it->queue), "item %zu has the invalid queue '%s'", i,
                       it->queue);
            FUZZ_CHECK(it->timeout_ms >= 1, "item %zu has the timeout %lldms", i,
                       (long long)it->timeout_ms);
            FUZZ_CHECK(it->max_attempts >= 1 && it->max_attempts <= 1000,
                       "item %zu has max_attempts %d", i, it->max_attempts);
            FUZZ_CHECK(it->payload, "item %zu has no payload", i);
        }
        check_forward(items, n, bulk);
        submit_items_free(items, n);
    } else {
        fuzz_check_problem(&err, 400, 413);
        FUZZ_CHECK(items == NULL && n == 0, "a refused submission leaves items behind");
    }
    json_decref(body);
    free(key);
    return 0;
}
