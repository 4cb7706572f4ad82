/* heap: see heap.h. */
#include "heap.h"

#include <stdlib.h>

#include "util.h"

void heap_init(Heap *h, bool (*less)(const void *, const void *), size_t *(*index_of)(void *))
{
    h->items = NULL;
    h->len = h->cap = 0;
    h->less = less;
    h->index_of = index_of;
}

void heap_free(Heap *h)
{
    free(h->items);
    h->items = NULL;
    h->len = h->cap = 0;
}

static void place(Heap *h, size_t i, void *x)
{
    h->items[i] = x;
    *h->index_of(x) = i;
}

static void sift_up(Heap *h, size_t i)
{
    void *x = h->items[i];
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!h->less(x, h->items[p]))
            break;
        place(h, i, h->items[p]);
        i = p;
    }
    place(h, i, x);
}

static void sift_down(Heap *h, size_t i)
{
    void *x = h->items[i];
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= h->len)
            break;
        if (c + 1 < h->len && h->less(h->items[c + 1], h->items[c]))
            c++;
        if (!h->less(h->items[c], x))
            break;
        place(h, i, h->items[c]);
        i = c;
    }
    place(h, i, x);
}

void heap_push(Heap *h, void *x)
{
    if (h->len == h->cap) {
        h->cap = h->cap ? h->cap * 2 : 16;
        h->items = xrealloc(h->items, h->cap * sizeof *h->items);
    }
    h->items[h->len] = x;
    *h->index_of(x) = h->len;
    h->len++;
    sift_up(h, h->len - 1);
}

void *heap_peek(const Heap *h)
{
    return h->len ? h->items[0] : NULL;
}

void heap_remove(Heap *h, void *x)
{
    size_t i = *h->index_of(x);
    *h->index_of(x) = HEAP_NONE;
    h->len--;
    if (i == h->len)
        return;
    place(h, i, h->items[h->len]);
    sift_down(h, i);
    sift_up(h, i);
}

void *heap_pop(Heap *h)
{
    void *x = heap_peek(h);
    if (x)
        heap_remove(h, x);
    return x;
}
