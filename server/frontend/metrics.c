/* metrics: see metrics.h. */
#include "metrics.h"

const int64_t metrics_bucket_us[METRICS_BUCKETS] = {
    250, 500, 1000, 2500, 5000, 10000, 25000, 50000, 100000, 250000, 1000000, 5000000};

void histogram_observe(Histogram *h, int64_t us)
{
    for (int i = 0; i < METRICS_BUCKETS; i++)
        if (us <= metrics_bucket_us[i]) {
            atomic_fetch_add(&h->buckets[i], 1);
            break;
        }
    atomic_fetch_add(&h->count, 1);
    atomic_fetch_add(&h->sum_us, us);
}

void metrics_observe(Metrics *m, int route, int status, int64_t us)
{
    if (route < 0 || route >= METRICS_ROUTES)
        return;
    int cls = status / 100;
    atomic_fetch_add(&m->status[route][cls >= 1 && cls <= 5 ? cls : 0], 1);
    histogram_observe(&m->latency[route], us);
}

void histogram_render(SBuf *b, const char *name, const char *labels, const Histogram *h)
{
    long long cum = 0;
    const char *sep = *labels ? "," : "";
    for (int i = 0; i < METRICS_BUCKETS; i++) {
        cum += atomic_load(&h->buckets[i]);
        sbuf_printf(b, "%s_bucket{%s%sle=\"%g\"} %lld\n", name, labels, sep,
                    (double)metrics_bucket_us[i] / 1e6, cum);
    }
    sbuf_printf(b, "%s_bucket{%s%sle=\"+Inf\"} %lld\n", name, labels, sep,
                (long long)atomic_load(&h->count));
    sbuf_printf(b, "%s_sum{%s} %g\n", name, labels, (double)atomic_load(&h->sum_us) / 1e6);
    sbuf_printf(b, "%s_count{%s} %lld\n", name, labels, (long long)atomic_load(&h->count));
}
