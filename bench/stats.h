/* stats: latency samples and their percentiles, and the key=value figures
 * a sub-command prints. */
#ifndef WORKD_BENCH_STATS_H
#define WORKD_BENCH_STATS_H

#include <stddef.h>

typedef struct Samples {
    double *v; /* milliseconds */
    size_t n, cap;
    int sorted;
} Samples;

void samples_init(Samples *s);
void samples_free(Samples *s);
void samples_add(Samples *s, double ms);
/* The p-th percentile (0..100, nearest rank) of the samples; 0 if none. */
double samples_pct(Samples *s, double p);
double samples_max(Samples *s);

#endif
