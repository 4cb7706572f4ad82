/* metrics: see metrics.h. */
#include "metrics.h"

void metrics_init(Metrics *m)
{
    for (int i = 0; i < METRICS_ROUTES; i++)
        histogram_init(&m->latency[i], histogram_us_bounds, 1e6);
}

void metrics_observe(Metrics *m, int route, int status, int64_t us)
{
    if (route < 0 || route >= METRICS_ROUTES)
        return;
    int cls = status / 100;
    atomic_fetch_add(&m->status[route][cls >= 1 && cls <= 5 ? cls : 0], 1);
    histogram_observe(&m->latency[route], us);
}
