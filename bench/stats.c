/* stats: see stats.h. */
#include "stats.h"

#include <math.h>
#include <stdlib.h>

#include "util.h"

void samples_init(Samples *s)
{
    s->v = NULL;
    s->n = s->cap = 0;
    s->sorted = 1;
}

void samples_free(Samples *s)
{
    free(s->v);
    samples_init(s);
}

void samples_add(Samples *s, double ms)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 1024;
        s->v = xrealloc(s->v, s->cap * sizeof *s->v);
    }
    s->v[s->n++] = ms;
    s->sorted = 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double samples_pct(Samples *s, double p)
{
    if (s->n == 0)
        return 0;
    if (!s->sorted) {
        qsort(s->v, s->n, sizeof *s->v, cmp_double);
        s->sorted = 1;
    }
    size_t rank = (size_t)ceil(p / 100.0 * (double)s->n);
    if (rank < 1)
        rank = 1;
    if (rank > s->n)
        rank = s->n;
    return s->v[rank - 1];
}

double samples_max(Samples *s)
{
    return samples_pct(s, 100);
}
