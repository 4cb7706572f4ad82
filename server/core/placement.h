/* placement: which shards of the WorkManager a manager node tries to lead,
 * and when it hands one over, so that the shards spread over the live manager
 * nodes (each shard's advisory lock still decides who leads it). Pure: no I/O,
 * no clock (time is a parameter). One PlacementState per node, owned by the
 * thread that runs placement every election tick. */
#ifndef WORKD_PLACEMENT_H
#define WORKD_PLACEMENT_H

#include <stdint.h>

#include "shard.h"

/* A node tries a shard it released again only after PLACEMENT_COOLDOWN_MS
 * (or once the live count changes: the node it was meant for may be gone). */
#define PLACEMENT_COOLDOWN_MS 10000
/* A node releases only after it has been too heavy for PLACEMENT_HOLD_MS
 * without taking a shard, with the live count unchanged for
 * PLACEMENT_STABLE_MS: a live count that flaps moves nothing. The hold is
 * longer than a dead node stays in the live count (last_seen's 10 s expiry
 * and the listener's 3 s refresh): a node's death makes the survivors take
 * its shards and makes it look like the lightest node, and a release before
 * it leaves the count would be handed to a node that cannot take it. */
#define PLACEMENT_HOLD_MS 15000
#define PLACEMENT_STABLE_MS 10000
/* A shard handed over is left to the lightest nodes for PLACEMENT_HANDOFF_MS
 * (when the shard table says it was handed over): then anyone may take it,
 * in case the node it was meant for is gone. */
#define PLACEMENT_HANDOFF_MS 2000
/* Between two releases of one node, at least PLACEMENT_QUIET_MS. Past the
 * most releases one node can need with the live count unchanged (a node
 * counted live that cannot lead takes nothing, and what it does not take goes
 * back and forth), the wait doubles each time up to PLACEMENT_QUIET_MAX_MS. */
#define PLACEMENT_QUIET_MS 5000
#define PLACEMENT_QUIET_MAX_MS 300000

typedef struct PlacementState {
    int n;                           /* shards */
    int64_t tick;                    /* decisions made */
    int started;                     /* a decision was made (the fields below are set) */
    int live;                        /* live managers at the last decision */
    int64_t live_since_ms;           /* when live took its value */
    int64_t heavy_since_ms;          /* too heavy, taking nothing, since; -1: not too heavy */
    int64_t quiet_until_ms;          /* no release before */
    int64_t quiet_ms;                /* the wait after the last release */
    int releases;                    /* since the live count last changed */
    uint64_t prev_led;               /* led at the last decision */
    uint64_t asked;                  /* released, still led: the handover is under way */
    int64_t cooldown_ms[SHARDS_MAX]; /* shard s is not tried before this */
    int64_t handed_ms[SHARDS_MAX];   /* first seen handed over; -1: not handed */
} PlacementState;

/* What the node knows on this tick. */
typedef struct PlacementInput {
    uint64_t led;      /* bit s: this node leads shard s now */
    int live_managers; /* manager nodes seen alive, this one included (>= 1) */
    /* From the shard table (workd_shards.node of each shard, counted per live
     * manager node), -1 when unknown: the fewest shards a live manager node
     * leads, and how many live manager nodes lead more than this one, or as
     * many with a smaller node id (0: this node is the heaviest). Without
     * them a node can see only its own load, and 2, 2, 0 over 4 shards would
     * look balanced to every node that can act on it. */
    int fewest;
    int heavier;
    /* Shards the table shows handed over by their last leader and not yet
     * taken (0 when unknown). Only the lightest nodes try them at first, so a
     * node at T does not win the race for a shard meant for a lighter one
     * (and have to hand it over again later). */
    uint64_t handed;
    /* Shards the table shows led by another node (0 when unknown). A shard
     * this node handed over waits its cooldown so that the node it was meant
     * for takes it; once another has, the cooldown has done its work, and if
     * that node dies before the live count shows it, the shard is free and
     * must not wait for a cooldown that no longer protects anything. */
    uint64_t taken;
    const int64_t *open; /* open work per led shard (n entries, others ignored); NULL: none */
    int64_t now_ms;
} PlacementInput;

typedef struct PlacementDecision {
    uint64_t try_mask; /* shards whose lock to try on this tick (never one led) */
    int release;       /* a led shard to hand over now, or -1 */
} PlacementDecision;

/* ---- deciding ---- */
/* A state for a cluster of n shards (1 to SHARDS_MAX), before any decision. */
void placement_init(PlacementState *st, int n);
/* The decision for this tick (called every election tick, ~250 ms). The
 * target is T = ceil(n / live_managers).
 * - Takeover: a node tries every shard it does not lead; on every tick while
 *   it is below T and no heavier than the lightest node, otherwise on every
 *   2nd tick. So the lightest node wins a shard handed over (alone for
 *   PLACEMENT_HANDOFF_MS, if `handed` says which), and a dead node's shards
 *   are still taken within about 0.5 s when every survivor is at T. A shard
 *   it released waits PLACEMENT_COOLDOWN_MS until another node has taken
 *   it (`taken`), except for a lone node.
 * - Balance: a node above T, or 2 or more above the lightest node, that is
 *   the heaviest, releases one shard (the one with the least open work: the
 *   cheapest recovery) after PLACEMENT_HOLD_MS, then waits at least
 *   PLACEMENT_QUIET_MS. No other release is asked while one is under way
 *   (the shard still in `led`).
 * A shard that leaves `led` without a release (a step-down) needs no call:
 * the next decision sees it gone. */
PlacementDecision placement_decide(PlacementState *st, const PlacementInput *in);

#endif
