/* hmap: a string-keyed hash map of borrowed pointers (open addressing, linear
 * probing, backward-shift deletion: no tombstones). Keys are borrowed too: they
 * must stay valid while present, which is natural when the key lives in the
 * value.
 *
 * Keys are hashed with SipHash-1-3 under a random key drawn once per process
 * (siphash.h), so ids that a client or worker chooses cannot be made to
 * collide: lookups, inserts and deletions cost O(1) expected whatever the keys. */
#ifndef WORKD_HMAP_H
#define WORKD_HMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct HMap {
    const char **keys;
    void **vals;
    uint64_t *hashes; /* of keys[i], kept so that growing and deleting never rehash */
    size_t cap, len;
} HMap;

void hmap_init(HMap *m);
void hmap_free(HMap *m); /* frees the table, not keys or values */
void *hmap_get(const HMap *m, const char *key);
/* Inserts or replaces; returns the previous value or NULL. */
void *hmap_put(HMap *m, const char *key, void *val);
/* Removes and returns the value, or NULL if absent. */
void *hmap_del(HMap *m, const char *key);

/* Iteration: for (size_t i = 0; hmap_next(m, &i, &k, &v);) ... Do not modify
 * the map while iterating (collect the keys to delete, then delete). */
bool hmap_next(const HMap *m, size_t *pos, const char **key, void **val);

/* How many slots a lookup of key inspects (at least 1 once the table has
 * slots): what flooding with colliding keys would make grow. For tests and
 * diagnostics. */
size_t hmap_probes(const HMap *m, const char *key);

#endif
