#!/usr/bin/env python3
"""Session kills under a pipelined load: every 202 is in the log.

The leader pipelines its appends (up to two out at once). When its database
session dies with appends out, every reply that waited for them must become a
503 and none may be sent as success. This test makes that happen many times:
one server, one worker (--noop, 32 slots), client threads that POST arrays of
10 items at about 600 jobs/s, and pg_terminate_backend of every workd session
twice a second (what a DBA's script, a connection-killing proxy or a failover
does). Half the clients let the server make the ids (the leader then reads
nothing before it decides and keeps two appends out), half choose them and
resubmit the same ids after any other answer, as the README says to (a
killed session must not count as the database refusing those ids). Every
client keeps its own record of the ids it got 202 for.

Checked when the load has stopped and the work drained:
  missing     ids answered 202 that have no accepted event in the log (must be 0)
  lost        accepted ids that never completed (must be 0)
  duplicated  completed events beyond the first per id (must be 0)

    python3 tests/chaos/session_kills.py --bin-dir build/bin [--seconds 20]
"""

import argparse
import json
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import harness  # noqa: E402
from harness import Cluster, http, wait_leader, wait_until  # noqa: E402
from workd import JSON  # noqa: E402

BATCH = 10
CLIENTS = 16
RATE = 1200.0                # jobs per second over all clients
KILL_EVERY_S = 0.2
DRAIN_BOUND_S = 90.0
# Every append takes at least this long (a statement trigger that sleeps): the
# leader then always has two appends out and lands the older one while a round
# waits to send its own, which is where a reply can run ahead of its commit.
SLOW_APPEND_SQL = """
CREATE FUNCTION pg_temp_slow() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN PERFORM pg_sleep(0.005); RETURN NULL; END $$;
CREATE TRIGGER zz_session_kills_slow AFTER INSERT ON workd_log
  FOR EACH STATEMENT EXECUTE FUNCTION pg_temp_slow();
"""
KILL_SQL = ("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'workd%' "
            "AND pid <> pg_backend_pid()")


class Submitter(threading.Thread):
    def __init__(self, idx, url, stop, client_ids):
        super().__init__(daemon=True, name=f"submit-{idx}")
        self.idx, self.url, self.stop, self.client_ids = idx, url, stop, client_ids
        self.acked, self.statuses, self.n, self.refused = [], {}, 0, []

    def run(self):
        interval = BATCH * CLIENTS / RATE
        next_at = time.monotonic()
        while not self.stop.is_set():
            next_at += interval
            items = [{"payload": self.n + i, "max_attempts": 50} for i in range(BATCH)]
            if self.client_ids:
                for i, item in enumerate(items):
                    item["id"] = f"c{self.idx}-{self.n + i}"
            self.n += BATCH
            self.submit(items)
            delay = next_at - time.monotonic()
            if delay > 0:
                time.sleep(delay)  # a declared pace: the submitter's rate

    def submit(self, items):
        backoff = 0.05
        while True:
            try:
                r = http("POST", self.url + "/work", items, JSON, timeout=20)
                status = r.status
            except OSError as e:
                status = type(e).__name__
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status == 202:
                self.acked.extend(i["id"] for i in r.json()["items"])
                return
            if isinstance(status, int) and 400 <= status < 500 and status not in (408, 429):
                self.refused.append((status, r.text[:200]))
                return
            time.sleep(backoff)  # a declared delay: the submitter's backoff
            backoff = min(backoff * 2, 1.0)


def ids_of(cluster, event_type):
    out = cluster.psql(f"SELECT work_id, count(*) FROM workd_events WHERE type = '{event_type}' "
                       "GROUP BY work_id")
    return {line.split("|")[0]: int(line.split("|")[1]) for line in out.splitlines() if line}


def run(bin_dir, seconds):
    with Cluster(bin_dir) as c:
        server = c.start_server("s1")
        wait_leader(server.url)
        c.psql(SLOW_APPEND_SQL)
        c.start_worker("w1", server.url, ["--noop", "--concurrency", "32"])
        stop = threading.Event()
        clients = [Submitter(i, server.url, stop, client_ids=i % 2 == 1) for i in range(CLIENTS)]
        for t in clients:
            t.start()
        kills = sessions = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            time.sleep(KILL_EVERY_S)  # a declared pace: a kill every KILL_EVERY_S
            try:
                sessions += int(c.psql(KILL_SQL) or 0)
                kills += 1
            except RuntimeError as e:  # the database is busy restarting a session
                print(f"session_kills: kill skipped: {e}", flush=True)
        stop.set()
        for t in clients:
            t.join(60)
        acked = [i for t in clients for i in t.acked]
        statuses = {}
        for t in clients:
            for k, v in t.statuses.items():
                statuses[k] = statuses.get(k, 0) + v
        steps = server.log_text().count("stepping down")
        metrics = http("GET", server.url + "/metrics").text
        behind = sum(float(line.split()[-1]) for line in metrics.splitlines()
                     if line.startswith("workd_appends_behind_total"))
        accepted = ids_of(c, "accepted")
        missing = [i for i in acked if i not in accepted]

        def drained():
            done = ids_of(c, "completed")
            return done if all(i in done for i in acked if i in accepted) else None

        done = wait_until(drained, timeout=DRAIN_BOUND_S, interval=0.5, what="the work drained",
                          ignore=(RuntimeError,)) if not missing else ids_of(c, "completed")
        lost = [i for i in acked if i in accepted and i not in done]
        dup = sum(n - 1 for n in done.values() if n > 1)
        print(f"session_kills: kills={kills} sessions_terminated={sessions} step_downs={steps} "
              f"appends_behind={behind:.0f} acked={len(acked)} missing={len(missing)} lost={len(lost)} duplicated={dup} "
              f"answers={json.dumps({str(k): v for k, v in statuses.items()})}", flush=True)
        if missing or lost or dup:
            c.dump_logs(20)
        assert steps > 0, "no step-down happened: the test did not test anything"
        refused = [x for t in clients for x in t.refused]
        assert not refused, f"{len(refused)} batches refused: {refused[:3]}"
        assert not missing, f"{len(missing)} ids answered 202 are not in the log: {missing[:10]}"
        assert not lost, f"{len(lost)} accepted ids never completed: {lost[:10]}"
        assert not dup, f"{dup} duplicated completions"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", default=None)
    ap.add_argument("--seconds", type=float, default=20.0)
    args = ap.parse_args()
    run(args.bin_dir or harness.BIN_DIR, args.seconds)
    print("session_kills: ok", flush=True)


if __name__ == "__main__":
    main()
