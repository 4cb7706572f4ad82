/* hmap: see hmap.h. */
#include "hmap.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (; *s; s++) {
        h ^= (unsigned char)*s;
        h *= 1099511628211ULL;
    }
    return h;
}

void hmap_init(HMap *m)
{
    memset(m, 0, sizeof *m);
}

void hmap_free(HMap *m)
{
    free(m->keys);
    free(m->vals);
    hmap_init(m);
}

static size_t slot_of(const HMap *m, const char *key)
{
    size_t i = (size_t)hash(key) & (m->cap - 1);
    while (m->keys[i] && strcmp(m->keys[i], key) != 0)
        i = (i + 1) & (m->cap - 1);
    return i;
}

void *hmap_get(const HMap *m, const char *key)
{
    if (!m->cap)
        return NULL;
    size_t i = slot_of(m, key);
    return m->keys[i] ? m->vals[i] : NULL;
}

static void grow(HMap *m)
{
    HMap old = *m;
    m->cap = old.cap ? old.cap * 2 : 16;
    m->len = 0;
    m->keys = xcalloc(m->cap, sizeof *m->keys);
    m->vals = xcalloc(m->cap, sizeof *m->vals);
    for (size_t i = 0; i < old.cap; i++)
        if (old.keys[i])
            hmap_put(m, old.keys[i], old.vals[i]);
    free(old.keys);
    free(old.vals);
}

void *hmap_put(HMap *m, const char *key, void *val)
{
    if ((m->len + 1) * 4 >= m->cap * 3)
        grow(m);
    size_t i = slot_of(m, key);
    void *prev = m->keys[i] ? m->vals[i] : NULL;
    if (!m->keys[i])
        m->len++;
    m->keys[i] = key;
    m->vals[i] = val;
    return prev;
}

void *hmap_del(HMap *m, const char *key)
{
    if (!m->cap)
        return NULL;
    size_t i = slot_of(m, key);
    if (!m->keys[i])
        return NULL;
    void *val = m->vals[i];
    m->keys[i] = NULL;
    m->vals[i] = NULL;
    m->len--;
    /* Re-seat the rest of the cluster so lookups never stop at the hole. */
    size_t j = (i + 1) & (m->cap - 1);
    while (m->keys[j]) {
        const char *k = m->keys[j];
        void *v = m->vals[j];
        m->keys[j] = NULL;
        m->vals[j] = NULL;
        m->len--;
        hmap_put(m, k, v);
        j = (j + 1) & (m->cap - 1);
    }
    return val;
}

int hmap_next(const HMap *m, size_t *pos, const char **key, void **val)
{
    for (; *pos < m->cap; (*pos)++)
        if (m->keys[*pos]) {
            if (key)
                *key = m->keys[*pos];
            if (val)
                *val = m->vals[*pos];
            (*pos)++;
            return 1;
        }
    return 0;
}
