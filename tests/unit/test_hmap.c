/* Tests of common/hmap.c and common/siphash.c: SipHash gives the reference
 * vectors; the map stays correct under random inserts and deletions; and ids
 * crafted to collide under the unkeyed FNV-1a the map used before (hash
 * flooding, issue 13.2) cost it no more probes than any other ids. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hmap.h"
#include "siphash.h"
#include "util.h"

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond))                                                                               \
            fail_msg(__VA_ARGS__);                                                                 \
    } while (0)

/* ---- SipHash ---- */

static void test_siphash_reference_vectors(void **state)
{
    (void)state;
    /* Key 00..0f and message 00..len-1, from the reference implementation's
     * vectors.h and the paper's appendix A (15 bytes). */
    static const struct {
        size_t len;
        uint64_t want;
    } v[] = {
        {0, 0x726fdb47dd0e0e31ULL},  {1, 0x74f839c593dc67fdULL}, {2, 0x0d6c8009d9a94f5aULL},
        {3, 0x85676696d7fb7e2dULL},  {4, 0xcf2794e0277187b7ULL}, {8, 0x93f5f5799a932462ULL},
        {15, 0xa129ca6149be45e5ULL},
    };
    uint8_t key[16], msg[64];
    for (int i = 0; i < 16; i++)
        key[i] = (uint8_t)i;
    for (int i = 0; i < 64; i++)
        msg[i] = (uint8_t)i;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint64_t got = siphash(key, msg, v[i].len, 2, 4);
        CHECK(got == v[i].want, "SipHash-2-4 of %zu bytes should be %016llx, not %016llx", v[i].len,
              (unsigned long long)v[i].want, (unsigned long long)got);
    }
    CHECK(siphash(key, msg, 15, 1, 3) != siphash(key, msg, 15, 2, 4),
          "SipHash-1-3 should differ from SipHash-2-4");
    CHECK(siphash_str("job-1") == siphash_str("job-1"), "the process key should not change");
}

/* ---- correctness under random operations ---- */

static void test_random_inserts_and_deletions(void **state)
{
    (void)state;
    enum { KEYS = 3000, OPS = 60000 };
    char(*names)[16] = xcalloc(KEYS, sizeof *names);
    int *present = xcalloc(KEYS, sizeof *present);
    for (int i = 0; i < KEYS; i++)
        snprintf(names[i], sizeof names[i], "k%d", i);
    HMap m;
    hmap_init(&m);
    srand(13);
    size_t live = 0;
    for (int op = 0; op < OPS; op++) {
        int k = rand() % KEYS;
        if (rand() % 3) {
            void *prev = hmap_put(&m, names[k], &present[k]);
            CHECK((prev != NULL) == (present[k] != 0), "put of %s: previous value wrong", names[k]);
            live += !present[k];
            present[k] = 1;
        } else {
            void *was = hmap_del(&m, names[k]);
            CHECK((was != NULL) == (present[k] != 0), "del of %s: returned value wrong", names[k]);
            live -= present[k] != 0;
            present[k] = 0;
        }
        CHECK(m.len == live, "after op %d the map holds %zu entries, not %zu", op, m.len, live);
        if (op % 1000 == 0)
            for (int i = 0; i < KEYS; i++)
                CHECK((hmap_get(&m, names[i]) != NULL) == (present[i] != 0),
                      "after op %d, %s is %s", op, names[i],
                      present[i] ? "lost" : "found though deleted");
    }
    size_t seen = 0;
    const char *key;
    void *val;
    for (size_t pos = 0; hmap_next(&m, &pos, &key, &val);) {
        CHECK(val == &present[atoi(key + 1)] && present[atoi(key + 1)], "iteration saw %s", key);
        seen++;
    }
    CHECK(seen == live, "iteration saw %zu entries, not %zu", seen, live);
    hmap_free(&m);
    free(names);
    free(present);
}

/* ---- hash flooding ---- */

/* The map's old hash: FNV-1a, unkeyed. Its low 32 bits after a byte depend
 * only on the low 32 bits before, so blocks that collide there chain into 2^n
 * ids with one common low half from n colliding pairs: they all land on one
 * slot of any table smaller than 2^32. */
static uint32_t fnv_low(uint32_t h, const char *s, size_t n)
{
    uint64_t x = h;
    for (size_t i = 0; i < n; i++)
        x = (x ^ (unsigned char)s[i]) * 1099511628211ULL;
    return (uint32_t)x;
}

typedef struct Sample {
    uint32_t low;
    char block[9];
} Sample;

static int by_low(const void *a, const void *b)
{
    const Sample *x = a, *y = b;
    return (x->low > y->low) - (x->low < y->low);
}

/* Two different 8-character blocks that take FNV-1a's low half from h to the
 * same value: a birthday search over random blocks (2^19 of them give about
 * 32 pairs; blocks of 4 never collide, FNV-1a is a bijection on them). */
static void colliding_pair(uint32_t h, char a[9], char b[9], uint32_t *next)
{
    enum { N = 1 << 19 };
    static const char abc[] = "abcdefghijklmnopqrstuvwxyz0123456789";
    Sample *s = xcalloc(N, sizeof *s);
    for (uint32_t i = 0; i < N; i++) {
        for (int j = 0; j < 8; j++)
            s[i].block[j] = abc[rand() % 36];
        s[i].low = fnv_low(h, s[i].block, 8);
    }
    qsort(s, N, sizeof *s, by_low);
    for (uint32_t i = 1; i < N; i++)
        if (s[i].low == s[i - 1].low && strcmp(s[i].block, s[i - 1].block) != 0) {
            strcpy(a, s[i - 1].block);
            strcpy(b, s[i].block);
            *next = s[i].low;
            free(s);
            return;
        }
    free(s);
    fail_msg("no FNV-1a collision among 2^19 random blocks (expected about 32)");
}

static void test_ids_colliding_under_fnv_do_not_flood(void **state)
{
    (void)state;
    enum { STAGES = 12, N = 1 << STAGES };
    const char *prefix = "flood-";
    srand(1302);
    char pairs[STAGES][2][9];
    uint32_t h = fnv_low((uint32_t)1469598103934665603ULL, prefix, strlen(prefix));
    for (int i = 0; i < STAGES; i++)
        colliding_pair(h, pairs[i][0], pairs[i][1], &h);
    char(*ids)[128] = xcalloc(N, sizeof *ids);
    uint32_t low0 = 0;
    for (int n = 0; n < N; n++) {
        strcpy(ids[n], prefix);
        for (int i = 0; i < STAGES; i++)
            strcat(ids[n], pairs[i][(n >> i) & 1]);
        uint32_t low = fnv_low((uint32_t)1469598103934665603ULL, ids[n], strlen(ids[n]));
        if (n == 0)
            low0 = low;
        CHECK(low == low0, "the crafted id %s should collide under FNV-1a", ids[n]);
    }
    /* Under the old hash every lookup walked the one run of all N ids: N^2/2
     * probes in all. Keyed, the total stays linear. */
    HMap m;
    hmap_init(&m);
    for (int n = 0; n < N; n++)
        hmap_put(&m, ids[n], ids[n]);
    size_t total = 0, worst = 0;
    for (int n = 0; n < N; n++) {
        size_t p = hmap_probes(&m, ids[n]);
        total += p;
        worst = p > worst ? p : worst;
    }
    CHECK(total < (size_t)N * 4, "%d colliding ids took %zu probes to look up (old hash: ~%d)", N,
          total, N * N / 2);
    CHECK(worst < 64, "the longest lookup of a colliding id took %zu probes", worst);
    /* Deleting them one by one leaves a map that still finds the rest. */
    for (int n = 0; n < N; n += 2)
        CHECK(hmap_del(&m, ids[n]) == ids[n], "deleting %s", ids[n]);
    for (int n = 0; n < N; n++)
        CHECK((hmap_get(&m, ids[n]) != NULL) == (n % 2 == 1), "after deletions, %s is wrong",
              ids[n]);
    hmap_free(&m);
    free(ids);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_reference_vectors),
        cmocka_unit_test(test_random_inserts_and_deletions),
        cmocka_unit_test(test_ids_colliding_under_fnv_do_not_flood),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
