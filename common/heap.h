/* heap: a binary min-heap of borrowed pointers that know their own position,
 * so an element can be removed or re-keyed in O(log n). */
#ifndef WORKD_HEAP_H
#define WORKD_HEAP_H

#include <stdbool.h>
#include <stddef.h>

/* less(a, b): a comes out before b. index_of(x): where x keeps its slot
 * (a size_t field; HEAP_NONE when it is in no heap). */
typedef struct Heap {
    void **items;
    size_t len, cap;
    bool (*less)(const void *a, const void *b);
    size_t *(*index_of)(void *x);
} Heap;

#define HEAP_NONE ((size_t)-1)

void heap_init(Heap *h, bool (*less)(const void *, const void *), size_t *(*index_of)(void *));
void heap_free(Heap *h);
void heap_push(Heap *h, void *x);
void *heap_peek(const Heap *h);
void *heap_pop(Heap *h);
void heap_remove(Heap *h, void *x); /* x must be in h */

#endif
