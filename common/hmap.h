/* hmap: a string-keyed hash map of borrowed pointers (open addressing, linear
 * probing, tombstone-free deletion). Keys are borrowed too: they must stay
 * valid while present, which is natural when the key lives in the value. */
#ifndef WORKD_HMAP_H
#define WORKD_HMAP_H

#include <stddef.h>

typedef struct HMap {
    const char **keys;
    void **vals;
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
 * the map while iterating. */
int hmap_next(const HMap *m, size_t *pos, const char **key, void **val);

#endif
