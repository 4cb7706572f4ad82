/* histogram: see histogram.h. */
#include "histogram.h"

const int64_t histogram_us_bounds[HISTOGRAM_BUCKETS] = {
    250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000, 5000000};
const int64_t histogram_size_bounds[HISTOGRAM_BUCKETS] = {1,   2,   5,   10,   20,   50,
                                                          100, 200, 500, 1000, 2000, 5000};

void histogram_init(Histogram *h, const int64_t *bounds, double scale)
{
    h->bounds = bounds;
    h->scale = scale;
}

void histogram_observe(Histogram *h, int64_t v)
{
    for (int i = 0; i < HISTOGRAM_BUCKETS; i++)
        if (v <= h->bounds[i]) {
            atomic_fetch_add(&h->buckets[i], 1);
            break;
        }
    atomic_fetch_add(&h->count, 1);
    atomic_fetch_add(&h->sum, v);
}

void histogram_render(SBuf *b, const char *name, const char *labels, const Histogram *h)
{
    long long cum = 0;
    const char *sep = *labels ? "," : "";
    for (int i = 0; i < HISTOGRAM_BUCKETS; i++) {
        cum += atomic_load(&h->buckets[i]);
        sbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %lld\n", name, labels, sep,
                    (double)h->bounds[i] / h->scale, cum);
    }
    sbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %lld\n", name, labels, sep,
                (long long)atomic_load(&h->count));
    sbuf_printf(b, "%s_sum{%s} %g\n", name, labels, (double)atomic_load(&h->sum) / h->scale);
    sbuf_printf(b, "%s_count{%s} %lld\n", name, labels, (long long)atomic_load(&h->count));
}
