/* shards: a manager per shard, and where the shards go (shards.h). */
#include "shards.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "db.h"
#include "log.h"
#include "placement.h"
#include "util.h"
#include "wake.h"

/* A manager node is live while its row in workd_nodes is this fresh (the
 * listener refreshes it every 3 s). */
#define LIVE_MS 10000
/* A database that does not answer holds placement this long at most (every
 * shard's placement reads every database). */
#define PLACEMENT_DEADLINE_MS 2000

struct ShardSet {
    int n;
    Manager **mgr;
    /* placement (n > 1): its thread, session and state */
    char *advertise_url;
    const Stores *stores; /* borrowed */
    int64_t interval_ms;
    pthread_t thread;
    bool running;
    atomic_bool stopping;
    int efd;
    PGconn *conn[SHARDS_MAX]; /* by database: the nodes at home, who leads what in each */
    PlacementState place;
};

/* Runs sql (params: the live window in ms, and the shards database db
 * keeps) on the placement's session to database db. NULL: it cannot say. */
WARN_UNUSED static PGresult *ask(ShardSet *set, int db, const char *sql, const char *what)
{
    Err err = {0};
    if (!db_alive(set->conn[db])) {
        PQfinish(set->conn[db]);
        if (!(set->conn[db] = db_connect(set->stores->url[db], "placement", &err)))
            return NULL;
        db_set_deadline(set->conn[db], PLACEMENT_DEADLINE_MS);
    }
    char ms[24], keeps[STORES_KEEPS_LEN];
    snprintf(ms, sizeof ms, "%d", LIVE_MS);
    stores_keeps_array(set->stores, db, keeps);
    const char *params[] = {ms, keeps};
    PGresult *r = db_exec(set->conn[db], sql, 2, params, what, &err);
    if (!r) {
        PQfinish(set->conn[db]);
        set->conn[db] = NULL;
    }
    return r;
}

/* What the tables say of the live manager nodes (workd_nodes, at home):
 * how many, the fewest shards one leads (workd_shards, in every database),
 * and how many are heavier than this one (or as heavy with a smaller URL),
 * and which shards another node leads (*taken). -1: unknown (a database
 * could not say). */
WARN_UNUSED static int read_nodes(ShardSet *set, int *live, int *fewest, int *heavier,
                                  uint64_t *taken)
{
    PGresult *nodes = ask(set, 0,
                          "SELECT n.url FROM workd_nodes n, (SELECT $2::int[]) k"
                          " WHERE n.roles LIKE '%manager%'"
                          "   AND n.last_seen > now() - $1::int * interval '1 ms'",
                          "reading the live managers");
    if (!nodes)
        return -1;
    int rows = PQntuples(nodes);
    int *count = xcalloc((size_t)rows + 1, sizeof *count);
    int rc = 0;
    for (int db = 0; rc == 0 && db < set->stores->n; db++) {
        PGresult *led = ask(set, db,
                            "SELECT shard, url FROM workd_shards, (SELECT $1::int) l"
                            " WHERE shard = ANY ($2::int[])",
                            "reading who leads which shard");
        for (int j = 0; led && j < PQntuples(led); j++) {
            int s = (int)db_int(led, j, 0);
            const char *url = db_str(led, j, 1);
            if (url && strcmp(url, set->advertise_url) && s >= 0 && s < SHARDS_MAX)
                *taken |= (uint64_t)1 << s;
            for (int i = 0; url && i < rows; i++)
                if (!strcmp(db_str(nodes, i, 0), url))
                    count[i]++;
        }
        rc = led ? 0 : -1;
        PQclear(led);
    }
    int mine = 0;
    bool me_seen = false;
    for (int i = 0; i < rows; i++)
        if (!strcmp(db_str(nodes, i, 0), set->advertise_url)) {
            mine = count[i];
            me_seen = true;
        }
    *live = rows + (me_seen ? 0 : 1);
    *fewest = me_seen ? mine : 0;
    *heavier = 0;
    for (int i = 0; i < rows; i++) {
        int cmp = strcmp(db_str(nodes, i, 0), set->advertise_url);
        if (count[i] < *fewest)
            *fewest = count[i];
        if (cmp && (count[i] > mine || (count[i] == mine && cmp < 0)))
            (*heavier)++;
    }
    PQclear(nodes);
    free(count);
    return rc;
}

/* One tick: which shards to stand for, and whether to hand one over. */
static void place(ShardSet *set)
{
    PlacementInput in = {.fewest = -1, .heavier = -1, .now_ms = mono_ms()};
    int64_t open[SHARDS_MAX] = {0};
    for (int s = 0; s < set->n; s++)
        if (manager_is_leader(set->mgr[s])) {
            in.led |= 1ull << s;
            open[s] = atomic_load(&manager_stats(set->mgr[s])->open_work);
        }
    in.open = open;
    if (read_nodes(set, &in.live_managers, &in.fewest, &in.heavier, &in.taken) != 0) {
        in.live_managers = 1; /* alone, as far as it knows: the locks still decide */
        in.fewest = in.heavier = -1;
        in.taken = 0;
    }
    PlacementDecision d = placement_decide(&set->place, &in);
    for (int s = 0; s < set->n; s++)
        manager_allow_campaign(set->mgr[s], (d.try_mask >> s) & 1);
    if (d.release >= 0) {
        log_info("handing shard %d over: this node leads more than its share of %d shards over "
                 "%d manager node(s)",
                 d.release, set->n, in.live_managers);
        manager_release(set->mgr[d.release]);
    }
}

static void *placement_main(void *arg)
{
    ShardSet *set = arg;
    while (!atomic_load(&set->stopping)) {
        place(set);
        wake_wait(set->efd, (int)set->interval_ms);
    }
    for (int db = 0; db < SHARDS_MAX; db++) {
        PQfinish(set->conn[db]);
        set->conn[db] = NULL;
    }
    return NULL;
}

ShardSet *shards_start(const ManagerConfig *cfg, int n, Err *err)
{
    ShardSet *set = xcalloc(1, sizeof *set);
    set->mgr = xcalloc((size_t)n, sizeof *set->mgr);
    set->stores = cfg->stores;
    set->advertise_url = xstrdup(cfg->advertise_url);
    set->interval_ms = cfg->election_interval_ms;
    set->efd = -1;
    for (int s = 0; s < n; s++) {
        ManagerConfig mc = *cfg;
        mc.shard = s;
        mc.shards = n;
        if (cfg->stores)
            mc.database_url = stores_url(cfg->stores, s);
        if (!(set->mgr[s] = manager_start(&mc, err))) {
            set->n = s;
            goto fail;
        }
        set->n = s + 1;
        /* Placement decides before any of them stands, so that a node
         * joining a running cluster does not take shards first and hand
         * them back later. */
        manager_allow_campaign(set->mgr[s], n == 1);
    }
    if (n > 1) {
        placement_init(&set->place, n);
        if ((set->efd = wake_open(err)) < 0)
            goto fail;
        if (pthread_create(&set->thread, NULL, placement_main, set) != 0) {
            err_set(err, 500, "internal", "cannot start the placement thread");
            goto fail;
        }
        set->running = true;
    }
    return set;
fail:
    shards_stop(set);
    shards_free(set);
    return NULL;
}

void shards_stop(ShardSet *set)
{
    if (!set)
        return;
    if (set->running) {
        atomic_store(&set->stopping, true);
        wake_poke(set->efd);
        pthread_join(set->thread, NULL);
        set->running = false;
    }
    for (int s = 0; s < set->n; s++)
        manager_stop(set->mgr[s]);
}

void shards_free(ShardSet *set)
{
    if (!set)
        return;
    for (int s = 0; s < set->n; s++)
        manager_free(set->mgr[s]);
    wake_close(set->efd);
    free(set->advertise_url);
    free(set->mgr);
    free(set);
}

int shards_count(const ShardSet *set)
{
    return set ? set->n : 0;
}

Manager *shards_manager(const ShardSet *set, int s)
{
    return set && s >= 0 && s < set->n ? set->mgr[s] : NULL;
}

bool shards_leads(const ShardSet *set, int s)
{
    Manager *m = shards_manager(set, s);
    return m && manager_is_leader(m);
}
