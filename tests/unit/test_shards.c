/* Tests of common/shard.c and server/core/cursor.c: the queue hash's fixed
 * vectors (it can never change: every cluster's data depends on it), and
 * cursors: a one-shard cursor is today's event id, missing shards are 0, and
 * malformed or oversized text is refused. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "cursor.h"
#include "shard.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

static void hash_vectors(void **state)
{
    /* FNV-1a 32's published vectors, and queue names. */
    struct {
        const char *s;
        uint32_t h;
    } v[] = {{"", 0x811c9dc5u}, {"a", 0xe40c292cu}, {"foobar", 0xbf9cf968u}};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        CHECK(shard_hash(v[i].s) == v[i].h, "fnv1a32(\"%s\") is %08x, not %08x", v[i].s,
              shard_hash(v[i].s), v[i].h);
    CHECK(shard_of_queue("emails", 1) == 0, "one shard: everything in shard 0");
    CHECK(shard_of_queue("foobar", 4) == (int)(0xbf9cf968u % 4), "foobar in 4 shards");
    int seen[4] = {0};
    char q[32];
    for (int i = 0; i < 400; i++) {
        snprintf(q, sizeof q, "queue-%d", i);
        int s = shard_of_queue(q, 4);
        CHECK(s >= 0 && s < 4, "%s maps to shard %d of 4", q, s);
        seen[s]++;
    }
    for (int s = 0; s < 4; s++)
        CHECK(seen[s] > 60, "400 queues put only %d in shard %d of 4", seen[s], s);
}

static void cursor_text(void **state)
{
    Cursor c;
    Err err = {0};
    char out[CURSOR_TEXT_MAX];
    CHECK(cursor_parse("812", 1, &c, &err) == 0 && c.n == 1 && c.seq[0] == 812, "812 at N=1");
    cursor_format(&c, out, sizeof out);
    CHECK(!strcmp(out, "812"), "one shard's cursor reads 812, not %s", out);
    CHECK(cursor_parse("812.0.77.1204", 4, &c, &err) == 0, "four shards: %s", err.msg);
    CHECK(c.seq[2] == 77 && c.seq[3] == 1204, "components in shard order");
    cursor_format(&c, out, sizeof out);
    CHECK(!strcmp(out, "812.0.77.1204"), "round trip gave %s", out);
    CHECK(cursor_parse("5", 4, &c, &err) == 0 && c.seq[0] == 5 && c.seq[3] == 0,
          "a one-shard cursor in four shards: the missing ones at 0");
    cursor_format(&c, out, sizeof out);
    CHECK(!strcmp(out, "5.0.0.0"), "padded to 5.0.0.0, not %s", out);
    const char *bad[] = {"",
                         ".",
                         "1.",
                         ".1",
                         "1..2",
                         "-1",
                         "1.2.3",
                         "x",
                         "1 ",
                         "99999999999999999999",
                         "9223372036854775808"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err_clear(&err);
        CHECK(cursor_parse(bad[i], 2, &c, &err) != 0 && err.status == 400 &&
                  !strcmp(err.type, "invalid-cursor"),
              "'%s' is refused as invalid-cursor", bad[i]);
    }
    CHECK(cursor_parse("9223372036854775807", 1, &c, &err) == 0 && c.seq[0] == INT64_MAX,
          "the largest seq is read");
    Cursor big;
    cursor_zero(&big, SHARDS_MAX);
    for (int s = 0; s < SHARDS_MAX; s++)
        big.seq[s] = INT64_MAX;
    size_t len = cursor_format(&big, out, sizeof out);
    CHECK(len == SHARDS_MAX * 20 - 1 && len < sizeof out, "the longest text fits (%zu)", len);
    CHECK(cursor_parse(out, SHARDS_MAX, &c, &err) == 0 && c.seq[SHARDS_MAX - 1] == INT64_MAX,
          "and reads back");
}

static void cursor_order(void **state)
{
    Cursor a, b;
    cursor_zero(&a, 3);
    cursor_zero(&b, 3);
    cursor_advance(&a, 1, 10);
    cursor_advance(&a, 1, 4); /* never back */
    CHECK(a.seq[1] == 10, "advance never moves back");
    CHECK(cursor_covers(&a, 1, 10) && !cursor_covers(&a, 1, 11) && cursor_covers(&a, 0, 0),
          "covers is <= per shard");
    CHECK(!cursor_covers(&a, 3, 0), "a shard past n is not covered");
    CHECK(cursor_le(&b, &a) && !cursor_le(&a, &b), "le compares every shard");
    cursor_advance(&b, 0, 1);
    CHECK(!cursor_le(&b, &a) && !cursor_le(&a, &b), "neither is behind the other");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(hash_vectors),
        cmocka_unit_test(cursor_text),
        cmocka_unit_test(cursor_order),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
