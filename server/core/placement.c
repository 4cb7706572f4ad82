/* placement: which shards a manager node tries to lead and which it hands
 * over (placement.h). */
#include "placement.h"

#include <string.h>

static uint64_t all_shards(int n)
{
    return n >= 64 ? ~(uint64_t)0 : ((uint64_t)1 << n) - 1;
}

void placement_init(PlacementState *st, int n)
{
    memset(st, 0, sizeof *st);
    st->n = n < 1 ? 1 : n > SHARDS_MAX ? SHARDS_MAX : n;
    st->heavy_since_ms = -1;
    for (int s = 0; s < SHARDS_MAX; s++)
        st->handed_ms[s] = -1;
}

/* Follows the live count and what left or joined `led` since the last tick. */
static void observe(PlacementState *st, const PlacementInput *in, int live, uint64_t led)
{
    int64_t now = in->now_ms;
    if (!st->started || live != st->live) {
        /* A node came or went: the cooldowns were for a node that may be
         * gone, and the releases so far were for another count. */
        st->started = 1;
        st->live = live;
        st->live_since_ms = now;
        st->releases = 0;
        for (int s = 0; s < st->n; s++)
            st->cooldown_ms[s] = 0;
    }
    if (led & ~st->prev_led)
        st->heavy_since_ms = -1; /* a takeover: maybe a node died; hold again */
    uint64_t gone = st->prev_led & ~led;
    for (int s = 0; s < st->n; s++)
        if ((gone & st->asked) >> s & 1) /* handed over: leave it to another */
            st->cooldown_ms[s] = now + PLACEMENT_COOLDOWN_MS;
    st->asked &= led;
    for (int s = 0; s < st->n; s++)
        if (in->taken >> s & 1) /* the handover is done */
            st->cooldown_ms[s] = 0;
    for (int s = 0; s < st->n; s++)
        if (!(in->handed >> s & 1))
            st->handed_ms[s] = -1;
        else if (st->handed_ms[s] < 0)
            st->handed_ms[s] = now;
    st->prev_led = led;
}

/* The led shard with the least open work (the lowest on a tie). */
static int cheapest(const PlacementState *st, const PlacementInput *in, uint64_t led)
{
    int best = -1;
    for (int s = 0; s < st->n; s++) {
        if (!(led >> s & 1))
            continue;
        if (best < 0 || (in->open && in->open[s] < in->open[best]))
            best = s;
    }
    return best;
}

static int64_t next_quiet(PlacementState *st)
{
    /* The most one node can need: from all n down to n / live. */
    if (st->releases <= st->n - st->n / st->live)
        return PLACEMENT_QUIET_MS;
    int64_t q = st->quiet_ms * 2;
    return q > PLACEMENT_QUIET_MAX_MS ? PLACEMENT_QUIET_MAX_MS : q;
}

PlacementDecision placement_decide(PlacementState *st, const PlacementInput *in)
{
    PlacementDecision d = {.try_mask = 0, .release = -1};
    uint64_t mine = all_shards(st->n);
    uint64_t led = in->led & mine;
    int64_t now = in->now_ms;
    int live = in->live_managers < 1 ? 1 : in->live_managers;
    observe(st, in, live, led);
    st->tick++;

    int c = __builtin_popcountll(led);
    int target = (st->n + live - 1) / live;
    int fewest = in->fewest >= 0 && in->fewest < c ? in->fewest : c;

    /* Takeover. */
    int eager = c < target && c <= fewest;
    if (eager || st->tick % 2 == 0) {
        uint64_t wait = 0;
        for (int s = 0; live > 1 && s < st->n; s++)
            if (st->cooldown_ms[s] > now ||
                (!eager && st->handed_ms[s] >= 0 && now - st->handed_ms[s] < PLACEMENT_HANDOFF_MS))
                wait |= (uint64_t)1 << s;
        d.try_mask = mine & ~led & ~wait;
    }

    /* Balance. */
    int heavy = c > target || c - fewest >= 2;
    if (!heavy)
        st->heavy_since_ms = -1;
    else if (st->heavy_since_ms < 0)
        st->heavy_since_ms = now;
    if (heavy && live > 1 && !st->asked && in->heavier <= 0 &&
        now - st->heavy_since_ms >= PLACEMENT_HOLD_MS &&
        now - st->live_since_ms >= PLACEMENT_STABLE_MS && now >= st->quiet_until_ms) {
        d.release = cheapest(st, in, led);
        st->asked |= (uint64_t)1 << d.release;
        st->releases++;
        st->quiet_ms = next_quiet(st);
        st->quiet_until_ms = now + st->quiet_ms;
    }
    return d;
}
