/* hmap: see hmap.h. The table is a power of two at most three quarters full. */
#include "hmap.h"

#include <stdlib.h>
#include <string.h>

#include "siphash.h"
#include "util.h"

void hmap_init(HMap *m)
{
    memset(m, 0, sizeof *m);
}

void hmap_free(HMap *m)
{
    free(m->keys);
    free(m->vals);
    free(m->hashes);
    hmap_init(m);
}

/* The slot holding key, or the empty slot where it would go; *probes counts
 * the slots inspected. The stored hash spares most string comparisons. */
static size_t find(const HMap *m, const char *key, uint64_t h, size_t *probes)
{
    size_t mask = m->cap - 1, i = (size_t)h & mask, n = 1;
    while (m->keys[i] && (m->hashes[i] != h || strcmp(m->keys[i], key) != 0)) {
        i = (i + 1) & mask;
        n++;
    }
    *probes = n;
    return i;
}

void *hmap_get(const HMap *m, const char *key)
{
    if (!m->len)
        return NULL;
    size_t probes;
    size_t i = find(m, key, siphash_str(key), &probes);
    return m->keys[i] ? m->vals[i] : NULL;
}

size_t hmap_probes(const HMap *m, const char *key)
{
    if (!m->cap)
        return 0;
    size_t probes;
    find(m, key, siphash_str(key), &probes);
    return probes;
}

/* Places an entry known to be absent. */
static void place(HMap *m, const char *key, uint64_t h, void *val)
{
    size_t mask = m->cap - 1, i = (size_t)h & mask;
    while (m->keys[i])
        i = (i + 1) & mask;
    m->keys[i] = key;
    m->vals[i] = val;
    m->hashes[i] = h;
    m->len++;
}

static void grow(HMap *m)
{
    HMap old = *m;
    m->cap = old.cap ? old.cap * 2 : 16;
    m->len = 0;
    m->keys = xcalloc(m->cap, sizeof *m->keys);
    m->vals = xcalloc(m->cap, sizeof *m->vals);
    m->hashes = xcalloc(m->cap, sizeof *m->hashes);
    for (size_t i = 0; i < old.cap; i++)
        if (old.keys[i])
            place(m, old.keys[i], old.hashes[i], old.vals[i]);
    free(old.keys);
    free(old.vals);
    free(old.hashes);
}

void *hmap_put(HMap *m, const char *key, void *val)
{
    if ((m->len + 1) * 4 >= m->cap * 3)
        grow(m);
    uint64_t h = siphash_str(key);
    size_t probes;
    size_t i = find(m, key, h, &probes);
    if (m->keys[i]) {
        void *prev = m->vals[i];
        m->keys[i] = key; /* the new key: the old one may be freed with its value */
        m->vals[i] = val;
        return prev;
    }
    m->keys[i] = key;
    m->vals[i] = val;
    m->hashes[i] = h;
    m->len++;
    return NULL;
}

void *hmap_del(HMap *m, const char *key)
{
    if (!m->len)
        return NULL;
    size_t probes, mask = m->cap - 1;
    size_t i = find(m, key, siphash_str(key), &probes);
    if (!m->keys[i])
        return NULL;
    void *val = m->vals[i];
    m->len--;
    /* Backward shift (Knuth's algorithm R): pull each later entry of the run
     * into the hole when the hole lies between its home slot and where it
     * sits, so that no lookup ever stops early at the hole. One pass over the
     * rest of the run, O(1) expected. */
    for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
        size_t home = (size_t)m->hashes[j] & mask;
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            m->hashes[i] = m->hashes[j];
            i = j;
        }
    }
    m->keys[i] = NULL;
    m->vals[i] = NULL;
    m->hashes[i] = 0;
    return val;
}

bool hmap_next(const HMap *m, size_t *pos, const char **key, void **val)
{
    for (; *pos < m->cap; (*pos)++)
        if (m->keys[*pos]) {
            if (key)
                *key = m->keys[*pos];
            if (val)
                *val = m->vals[*pos];
            (*pos)++;
            return true;
        }
    return false;
}
