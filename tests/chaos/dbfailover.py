#!/usr/bin/env python3
"""Losing the database primary loses nothing: workd on a PostgreSQL that
Patroni replicates and fails over (a primary and a synchronous standby, one
etcd), under steady load, with the primary killed.

The topology, every process on 127.0.0.1 (tests/lib/pgha.py): etcd; Patroni
nodes pg1 and pg2 with ``synchronous_mode``; two workd-servers s1 and s2 on the
libpq multi-host URL of both nodes; two workd-workers (``--noop``); client
threads submitting RATE jobs/s in all (one POST per job, keep-alive, their own
ids; any answer but 202 is retried with the SAME id on the other server); one
SSE subscriber per server on GET /results, which reconnects to the other
server with Last-Event-ID when its stream ends.

Faults, each once the cluster is healthy again (one primary, one streaming
synchronous standby):

  postmaster   kill -9 of the primary's postmaster alone (Patroni restarts it
               after crash recovery, on the same node)
  node         kill -9 of every process of the primary's node at once (Patroni,
               postmaster, backends): the standby is promoted when the leader
               key's ttl runs out; the node is started again and must come back
               as a streaming synchronous standby (pg_rewind)
  switchover   Patroni moves the primary on purpose (its REST API); the old
               primary must come back as a standby
  strict       (--long) synchronous_mode_strict on, then the synchronous
               standby's node killed: commits wait, and every server's /readyz
               must say so within DETECT_BOUND_S; the node comes back and
               commits flow again

Per fault: ``accept_ms``, from the fault to the 202 of a request sent after it
(the worst client); ``flow_ms``, to the result, on every subscriber, of work
first submitted after it; ``db_ms``, to a Patroni primary answering again.
At the end the load stops, every accepted job must reach every subscriber
within DRAIN_BOUND_S, and the clients' records are compared with the event log
and the subscribers' records: every id that got a 202 has one ``accepted`` and
exactly one ``completed`` event; every subscriber got every result once, in
seq order; both database nodes hold the same log. One ``dbfailover fault=...``
line per fault and a ``dbfailover summary ...`` line; exit 0 only if nothing
was lost, duplicated, missed or out of bounds.

    python3 tests/chaos/dbfailover.py --short  # CTest: one fault of each kind, 100 jobs/s
    python3 tests/chaos/dbfailover.py --long   # make chaos-db: 5 postmaster and 5 node
                                               # kills at 500 jobs/s, switchovers, strict

With ``--shard-databases`` the Patroni cluster is a shard's own database:
the workd cluster is made with ``--shards 2``, its home database
(--database-url: the cluster's tables and shard 0) is a plain private
PostgreSQL, and shard 1 keeps its lock, log and rows in the replicated one
(``--shard-databases "1=<multi-host URL>"``), which the faults hit. Half of
the clients submit to a queue of shard 0, half to a queue of shard 1 (their
ids are client-chosen, so shard 0's submissions look at shard 1's database
too and wait out its outages: docs/architecture.md, "Ids across
databases"). Each check reads each id's events in the database of its
shard (and fails if any are in the other), the subscribers check order
within each shard, flowing again is the later of the two shards' results
(``accept_ms_home``/``flow_ms_home``: shard 0's clients and results alone),
and ``terms`` counts both databases' terms (``terms_home``: shard 0's).

    python3 tests/chaos/dbfailover.py --short --shard-databases
                                    # CTest's chaos/db-failover-shard-databases

Options: --bin-dir DIR, --rate N, --only KIND[,KIND...], --timing fast|default
(Patroni's ttl/loop_wait/retry_timeout: 8/1/3, or its defaults 30/10/10),
--timeout S (hard overall bound), --keep, --shard-databases.
"""

import argparse
import collections
import http.client as hc
import json
import os
import signal
import sys
import threading
import time
import traceback
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402
from chaos import Subscriber, snapshot_binaries  # noqa: E402
from harness import WaitTimeout, http, wait_leader, wait_until  # noqa: E402
from pgha import DEFAULT_TIMING, FAST_TIMING, ReplicatedCluster, missing_tools  # noqa: E402
from workd import JSON, shard_of  # noqa: E402

CLIENTS = 16
CLIENT_TIMEOUT_S = 30     # above the servers' 10 s --proxy-deadline
DRAIN_BOUND_S = 60
GAP_S = 0.5              # a silence this long (clients send every 32-160 ms) is an outage
DETECT_BOUND_S = 12       # stuck commits in /readyz: dbwatch's 5 s + 1 s checks + slack
WORKER_ARGS = ["--noop", "--concurrency", "32", "--poll-wait", "5s"]
SHARDS = 2                # with --shard-databases: shard 0 at home, shard 1 replicated

PROFILES = {
    "short": {"timeout": 240, "rate": 100, "settle": 3.0, "recovery_bound": 40.0,
              "plan": ["postmaster", "node", "switchover"]},
    "long": {"timeout": 1500, "rate": 500, "settle": 4.0, "recovery_bound": 60.0,
             "plan": ["postmaster", "node"] * 5 + ["switchover", "switchover", "strict"]},
}


def now():
    return time.monotonic()


class HardTimeout(Exception):
    pass


# ------------------------------------------------------------------ clients

class Client(threading.Thread):
    """Submits its own ids at a steady rate over keep-alive connections and keeps
    its own record: id -> time of the 202. Anything else is retried with the
    same id on the other server, with a short capped backoff."""

    def __init__(self, idx, urls, rate, run, queue=None, shard=0):
        super().__init__(daemon=True, name=f"client-{idx}")
        self.idx, self.urls, self.interval, self.run_ = idx, urls, 1.0 / rate, run
        self.queue, self.shard = queue, shard  # None: the default queue
        self.node = idx
        self.n = 0
        self.accepted = {}      # id -> monotonic time of the 202
        self.refused = {}       # id -> (status, body): a 4xx retrying cannot fix
        self.responses = []     # (t_send, t_recv, status); 0: transport error
        self.accepted_at = []   # monotonic times of the 202s, in order
        self.conns = {}
        self.stop_flag = self.pause_flag = False
        self.idle = threading.Event()

    def post(self, url, body):
        conn = self.conns.get(url)
        if conn is None:
            parts = urllib.parse.urlsplit(url)
            conn = self.conns[url] = hc.HTTPConnection(parts.hostname, parts.port,
                                                       timeout=CLIENT_TIMEOUT_S)
        try:
            conn.request("POST", "/work", body=body, headers=JSON)
            r = conn.getresponse()
            text = r.read()
            if (r.getheader("Connection") or "").lower() == "close":
                conn.close()
                self.conns.pop(url, None)
            return r.status, text
        except (OSError, hc.HTTPException):
            conn.close()
            self.conns.pop(url, None)
            raise

    def run(self):
        next_at = now()
        while not self.stop_flag:
            if self.pause_flag:
                self.idle.set()
                time.sleep(0.05)  # paused: looks again for the end of the pause
                next_at = now()
                continue
            self.idle.clear()
            delay = next_at - now()
            if delay > 0:
                time.sleep(delay)  # a declared pace: the client's rate
            next_at = max(next_at + self.interval, now() - self.interval)
            self.submit_one()
        self.idle.set()

    def submit_one(self):
        self.n += 1
        wid = f"f-c{self.idx}-{self.n}"
        item = {"id": wid, "payload": self.n, "max_attempts": 50}
        if self.queue is not None:
            item["queue"] = self.queue
        body = json.dumps(item).encode()
        self.run_.shard_of_id[wid] = self.shard
        self.run_.born[wid] = now()
        backoff = 0.02
        while not self.stop_flag:
            self.node += 1
            url = self.urls[self.node % len(self.urls)]
            t_send = now()
            try:
                status, text = self.post(url, body)
            except (OSError, hc.HTTPException):
                status, text = 0, b""
            self.responses.append((t_send, now(), status))
            if status == 202:
                self.accepted[wid] = now()
                self.accepted_at.append(self.accepted[wid])
                return
            if 400 <= status < 500 and status not in (408, 429):
                self.refused[wid] = (status, text[:300])
                return
            time.sleep(backoff)  # a declared delay: the client's backoff
            backoff = min(backoff * 2, 0.25)

    def first_accept_after(self, t):
        for t_send, t_recv, status in self.responses:
            if t_send >= t and status == 202:
                return t_recv
        return None


# -------------------------------------------------------------------- faults

class Fault:
    def __init__(self, kind, t, detail=""):
        self.kind, self.t, self.detail = kind, t, detail
        self.accept_ms = self.flow_ms = self.db_ms = None
        self.extra = {}


class Run:
    def __init__(self, cluster, prof, args):
        self.cluster, self.ha, self.prof, self.args = cluster, cluster.ha, prof, args
        self.t0 = now()
        self.born = {}
        self.shard_of_id = {}   # id -> its shard (0 without --shard-databases)
        self.shards = SHARDS if args.shard_databases else 1
        # Where each shard's rows are: shard 0 in the cluster's own database
        # (the replicated one, or a private one with --shard-databases),
        # shard 1 in the replicated one.
        self.db_of_shard = ({0: ("home", cluster.psql), 1: ("replicated", self.ha.psql)}
                            if args.shard_databases else {0: ("replicated", self.ha.psql)})
        # A queue of each shard (none without --shard-databases: the default queue).
        self.queues = {}
        for i in range(1000):
            if len(self.queues) == self.shards:
                break
            self.queues.setdefault(shard_of(f"failover-{i}", self.shards), f"failover-{i}")
        self.faults = []
        self.failures = []
        self.servers, self.workers = [], []

    def log(self, msg):
        print(f"dbfailover: [{now() - self.t0:6.1f}s] {msg}", flush=True)

    def fail(self, msg):
        self.failures.append(msg)
        print(f"dbfailover: FAIL {msg}", flush=True)

    def poll(self, pred, timeout, interval=0.05):
        """wait_until that returns None when the time runs out (the caller reports it)."""
        try:
            return wait_until(pred, timeout, interval)
        except WaitTimeout:
            return None

    # ---------------------------------------------------------------- setup
    def setup(self):
        extra = []
        if self.args.shard_databases:
            extra = ["--shards", str(SHARDS), "--shard-databases", f"1={self.ha.url()}"]
        for name in ("s1", "s2"):
            s = self.cluster.start_server(name, extra_args=extra, timeout=30)
            self.servers.append(s)
        for s in self.servers:
            wait_leader(s.url, timeout=30)
        self.urls = [s.url for s in self.servers]
        for i, url in enumerate(self.urls):
            self.workers.append(self.cluster.start_worker(f"w{i + 1}", url, WORKER_ARGS))
        self.subs = [Subscriber(i, self.urls, self, seed=i, shards=self.shards)
                     for i in range(len(self.urls))]
        for sub in self.subs:
            sub.start()
        if not self.poll(lambda: all(sub.url for sub in self.subs), 15):
            raise AssertionError("the SSE subscribers could not attach")
        rate = self.prof["rate"]
        self.clients = [Client(i, self.urls, rate / CLIENTS, self,
                               queue=self.queues[i % self.shards] if self.shards > 1 else None,
                               shard=i % self.shards) for i in range(CLIENTS)]
        for c in self.clients:
            c.start()
        cl = http("GET", self.urls[0] + "/cluster").json()
        db = cl.get("database", {})
        where = ""
        if self.shards > 1:
            where = (" (home database); shards: "
                     + " ".join(f"{x['shard']}={x['database']}" for x in cl.get("shards", []))
                     + "; queues: " + " ".join(f"{k}={v}" for k, v in sorted(self.queues.items())))
        self.log(f"up: {self.ha.url()}; primary {self.ha.primary().name}; workd sees "
                 f"{db.get('server')} durability={db.get('durability')} "
                 f"sync_standbys={db.get('sync_standbys')}{where}; {CLIENTS} clients at {rate}/s")
        # Steady state before any fault: results (of every shard) flow to every subscriber.
        t = now()
        if not self.poll(lambda: self.flowing_after(t), 30):
            raise AssertionError("no results flowed to every subscriber within 30 s")

    def stop_load(self):
        for c in getattr(self, "clients", []):
            c.stop_flag = True
        for s in getattr(self, "subs", []):
            s.stop()

    # ------------------------------------------------------------- measures
    def first_result_after(self, sub, t, shard=None):
        """When sub got the first result of work first submitted at or after t
        (of that shard, when shard is given)."""
        for t_recv, _seq, wid, _ev in list(sub.seen):
            b = self.born.get(wid)
            if (t_recv >= t and b is not None and b >= t
                    and (shard is None or self.shard_of_id.get(wid) == shard)):
                return t_recv
        return None

    def flowing_after(self, t):
        """Work first submitted at or after t reached every subscriber, of every shard."""
        return all(self.first_result_after(s, t, shard if self.shards > 1 else None)
                   for s in self.subs for shard in range(self.shards))

    @staticmethod
    def back_after(times, t, horizon):
        """When a stream of arrival times came back after the fault at t: the end
        of the longest silence that covers some moment after t (a busy backend
        can still commit a few ms after its postmaster died), or the first
        arrival after t when there was no silence longer than GAP_S. None while
        nothing arrived after the silence yet."""
        before = [x for x in times if x < t]
        after = [x for x in times if t <= x <= t + horizon]
        if not after:
            return None
        seq = ([before[-1]] if before else [t]) + after
        gaps = [(b - a, b) for a, b in zip(seq, seq[1:]) if b > t]
        longest = max(gaps, default=(0.0, after[0]))
        return longest[1] if longest[0] > GAP_S else after[0]

    def measure(self, f, final=False):
        """Accepting again: the worst client's return after the fault (its 202s);
        flowing again: the worst subscriber's (its results). Only final once the
        load has run well past the fault, so that a silence still going on is
        not taken for the end."""
        if not final:
            return False
        f.accept_ms = self.accept_back(f, self.clients)
        f.flow_ms = self.flow_back(f, range(self.shards))
        if self.shards > 1:
            # The home shard alone: its database was not hit, but its ids are
            # looked up in the other one.
            f.extra["accept_ms_home"] = self.accept_back(
                f, [c for c in self.clients if c.shard == 0])
            f.extra["flow_ms_home"] = self.flow_back(f, [0])
        return f.accept_ms is not None and f.flow_ms is not None

    def accept_back(self, f, clients):
        """ms from f.t to accepting again, for the worst of clients (None: not yet)."""
        horizon = self.prof["recovery_bound"]
        ends = [self.back_after(sorted(c.accepted_at), f.t, horizon) for c in clients]
        return (max(ends) - f.t) * 1000 if all(e is not None for e in ends) else None

    def flow_back(self, f, shards):
        """ms from f.t to flowing again: the worst subscriber, each shard's
        results taken apart (all of them together with one shard)."""
        horizon = self.prof["recovery_bound"]
        ends = []
        for s in self.subs:
            seen = list(s.seen)
            for shard in shards:
                ends.append(self.back_after(
                    [x[0] for x in seen
                     if self.shards == 1 or self.shard_of_id.get(x[2]) == shard],
                    f.t, horizon))
        return (max(ends) - f.t) * 1000 if all(e is not None for e in ends) else None

    def await_recovery(self, f, t_ready):
        """Waits until work submitted after t_ready (the database takes writes
        again: the outage, if any, is over there) is accepted by every client and
        flows to every subscriber, then a little longer, and measures from f.t."""
        bound = self.prof["recovery_bound"]

        def recovered():
            return (all(c.first_accept_after(t_ready) for c in self.clients)
                    and self.flowing_after(t_ready))
        if not self.poll(recovered, bound):
            self.fail(f"{f.kind}: no recovery within {bound:.0f}s: new work accepted by every "
                      f"client {all(c.first_accept_after(t_ready) for c in self.clients)}, and "
                      f"flowing to every subscriber {self.flowing_after(t_ready)}")
        time.sleep(2 * GAP_S)  # a declared window: a silence still going on would show
        self.measure(f, final=True)

    def wait_healthy(self, what):
        try:
            self.ha.wait_healthy(timeout=90)
        except AssertionError as e:
            raise AssertionError(f"after {what}: {e}; Patroni members: {self.ha.members()}")

    def rate_before(self, t, span=3.0):
        """202s per second, all clients, over the span seconds before t."""
        n = sum(1 for c in self.clients for x in c.accepted_at if t - span <= x < t)
        return n / span

    def report(self, f):
        self.faults.append(f)
        f.extra["rate_before"] = self.rate_before(f.t if f.kind != "strict" else f.t0)
        figs = {"fault": f.kind, "accept_ms": f.accept_ms, "flow_ms": f.flow_ms,
                "db_ms": f.db_ms, **f.extra}
        print("dbfailover " + " ".join(f"{k}={round(v) if isinstance(v, float) else v}"
                                       for k, v in figs.items() if v is not None), flush=True)
        self.log(f"  {f.detail}")

    # --------------------------------------------------------------- faults
    def fault_postmaster(self):
        victim = self.ha.primary()
        pid = victim.kill_postmaster()
        t = victim.killed_at
        f = Fault("postmaster", t)
        back = self.poll(lambda: (w := self.ha.writable_postmaster()) and w[1] != pid and w,
                         self.prof["recovery_bound"], interval=0.05)
        if not back:
            raise AssertionError(f"no server took writes within "
                                 f"{self.prof['recovery_bound']:.0f}s of the postmaster kill")
        f.db_ms = (now() - t) * 1000
        f.detail = (f"kill -9 of {victim.name}'s postmaster (pid {pid}); writes taken again "
                    f"by {back[0].name} (postmaster {back[1]}) after {f.db_ms:.0f} ms")
        self.await_recovery(f, now())
        self.wait_healthy("the postmaster kill")
        return f

    def fault_node(self):
        victim = self.ha.primary()
        pids = victim.kill_node()
        t = victim.killed_at
        f = Fault("node", t)
        w = self.poll(lambda: (w := self.ha.writable_postmaster()) and w[0] is not victim and w,
                      self.prof["recovery_bound"], interval=0.05)
        new = w[0] if w else None
        if new is None:
            raise AssertionError(f"no standby was promoted within "
                                 f"{self.prof['recovery_bound']:.0f}s after {victim.name} died")
        f.db_ms = (now() - t) * 1000
        self.await_recovery(f, now())
        # The dead node comes back: Patroni must make it a standby of the new primary.
        t_back = now()
        victim.start()
        self.wait_healthy(f"{victim.name} was started again")
        role = victim.role()
        if role not in ("replica", "standby"):
            self.fail(f"{victim.name} came back as {role}, not as a standby")
        f.extra["rejoin_ms"] = (now() - t_back) * 1000
        f.detail = (f"kill -9 of {victim.name}'s {len(pids)} processes; {new.name} promoted "
                    f"after {f.db_ms:.0f} ms; {victim.name} back as a synchronous standby "
                    f"{f.extra['rejoin_ms']:.0f} ms after its restart")
        return f

    def fault_switchover(self):
        old = self.ha.primary()
        t = now()
        _, new = self.ha.switchover()
        f = Fault("switchover", t)
        self.poll(lambda: (w := self.ha.writable_postmaster()) and w[0] is new, 30)
        f.db_ms = (now() - t) * 1000
        self.await_recovery(f, now())
        self.wait_healthy("the switchover")
        role = old.role()
        if role not in ("replica", "standby"):
            self.fail(f"after the switchover {old.name} is {role}, not a standby")
        f.detail = f"Patroni switchover {old.name} -> {new.name} in {f.db_ms:.0f} ms"
        return f

    def fault_strict(self):
        """A primary whose synchronous standby is gone, in strict mode: commits
        wait, and workd says so in every node's /readyz."""
        self.ha.patch_config({"synchronous_mode_strict": True})
        self.poll(lambda: self.ha.psql("SHOW synchronous_standby_names") != "", 10)
        victim = self.ha.sync_standby()
        victim.kill_node()
        t = victim.killed_at
        f = Fault("strict", t)
        f.t0 = t

        def all_not_ready():
            out = []
            for s in self.servers:
                r = http("GET", s.url + "/readyz", timeout=5)
                if r.status != 503 or "synchronous standby" not in r.text:
                    return None
                out.append(r.json()["detail"])
            return out
        details = self.poll(all_not_ready, DETECT_BOUND_S + 5, interval=0.2)
        if not details:
            self.fail(f"strict: /readyz did not report the stuck commits within "
                      f"{DETECT_BOUND_S + 5}s of losing {victim.name}")
        else:
            f.extra["detected_ms"] = (now() - t) * 1000
            if f.extra["detected_ms"] > DETECT_BOUND_S * 1000:
                self.fail(f"strict: stuck commits reported after {f.extra['detected_ms']:.0f} "
                          f"ms (bound {DETECT_BOUND_S} s)")
        logged = any("commits have waited" in s.log_text() for s in self.servers)
        if not logged:
            self.fail("strict: no server logged the commits waiting for a synchronous standby")
        t_back = now()
        victim.start()
        f.t = t_back  # recovery is measured from the standby's return
        self.poll(lambda: self.ha.sync_standby() is victim, 60, interval=0.2)
        self.await_recovery(f, now())
        self.wait_healthy("the standby's return")
        if not self.poll(lambda: all(http("GET", s.url + "/readyz").status == 200
                                     for s in self.servers), 15, interval=0.2):
            self.fail("strict: /readyz still 503 after the standby came back")
        self.ha.patch_config({"synchronous_mode_strict": False})
        f.detail = (f"strict mode, kill -9 of the sync standby {victim.name}: /readyz said "
                    f"so after {f.extra.get('detected_ms', -1):.0f} ms ({(details or ['-'])[0]}); "
                    f"standby back, commits flow again")
        return f

    # ----------------------------------------------------------------- checks
    def finish(self):
        for c in self.clients:
            c.pause_flag = True
        for c in self.clients:
            if not c.idle.wait(CLIENT_TIMEOUT_S * 3):
                self.fail(f"client {c.idx} could not get its last submission accepted")
        accepted = {}
        for c in self.clients:
            accepted.update(c.accepted)
        want = set(accepted)

        def delivered():
            return all(want <= {w for _t, _s, w, _e in s.seen} for s in self.subs)
        t = now()
        if not self.poll(delivered, DRAIN_BOUND_S, interval=0.2):
            self.fail(f"not every accepted job reached every subscriber within "
                      f"{DRAIN_BOUND_S}s of the load stopping")
        drain_ms = (now() - t) * 1000
        # Each id's events are read in the database of its shard; any in
        # another database are misplaced.
        rows, misplaced = {}, []
        for shard, (dbname, psql) in self.db_of_shard.items():
            out = psql(
                "SELECT work_id, count(*) FILTER (WHERE type = 'accepted'), "
                "count(*) FILTER (WHERE type = 'completed') FROM workd_events "
                "WHERE work_id LIKE 'f-%' GROUP BY work_id")
            for line in out.splitlines():
                wid, acc, comp = line.split("|")
                if self.shard_of_id.get(wid, 0) != shard:
                    misplaced.append((wid, dbname))
                    continue
                rows[wid] = (int(acc), int(comp))
        if misplaced:
            self.fail(f"{len(misplaced)} id(s) have events in the database of another "
                      f"shard: {misplaced[:10]}")
        lost = sorted(i for i in want if i not in rows or rows[i][1] == 0)
        unlogged = sorted(i for i in want if i not in rows or rows[i][0] != 1)
        dup = {i: r[1] for i, r in rows.items() if r[1] > 1}
        refused = {k: v for c in self.clients for k, v in c.refused.items()}
        if lost:
            self.fail(f"{len(lost)} job(s) got 202 but never completed: {lost[:10]}")
        if unlogged:
            self.fail(f"{len(unlogged)} job(s) got 202 without exactly one accepted event: "
                      f"{unlogged[:10]}")
        if dup:
            self.fail(f"{len(dup)} job(s) completed more than once: {dict(list(dup.items())[:10])}")
        if refused:
            self.fail(f"{len(refused)} submission(s) refused: {dict(list(refused.items())[:5])}")
        completed = {i for i, r in rows.items() if r[1]}
        sse_missing = sse_dup = sse_unordered = 0
        for s in self.subs:
            mine = [w for _t, _s, w, _e in s.seen if w.startswith("f-")]
            counts = collections.Counter(mine)
            miss = completed - set(counts)
            sse_missing += len(miss)
            sse_dup += len(mine) - len(counts)
            sse_unordered += len(s.out_of_order)
            if miss:
                self.fail(f"subscriber {s.name_} missed {len(miss)} result(s): "
                          f"{sorted(miss)[:10]}; connections {s.connections[-6:]}")
            if len(mine) != len(counts):
                self.fail(f"subscriber {s.name_} got {len(mine) - len(counts)} duplicate(s)")
            if s.out_of_order:
                self.fail(f"subscriber {s.name_} got events out of seq order: "
                          f"{s.out_of_order[:5]}")
        # The standby holds the same log once it has replayed it.
        primary = self.ha.primary()
        q = "SELECT count(*), coalesce(max(seq), 0) FROM workd_events"
        want_log = self.ha.psql(q, node=primary)
        for n in self.ha.nodes:
            if n is not primary and not self.poll(
                    lambda n=n: self.ha.psql(q, node=n) == want_log, 15, interval=0.2):
                self.fail(f"standby {n.name} holds {self.ha.psql(q, node=n)} (count|max seq) "
                          f"of the log, the primary {want_log}")
        terms = {shard: int(psql("SELECT count(*) FROM workd_events WHERE type = 'term'"))
                 for shard, (_name, psql) in self.db_of_shard.items()}
        out = {"submitted": len(want), "completed": len(completed & want),
               "lost": len(lost), "duplicated": sum(n - 1 for n in dup.values()),
               "sse_missing": sse_missing, "sse_duplicated": sse_dup,
               "sse_unordered": sse_unordered, "terms": sum(terms.values())}
        if self.shards > 1:
            out["terms_home"] = terms[0]
            out["misplaced"] = len(misplaced)
        out["drain_ms"] = round(drain_ms)
        return out

    def run(self, plan):
        self.setup()
        for kind in plan:
            time.sleep(self.prof["settle"])  # a declared window: steady load between faults
            self.log(f"fault {kind}")
            f = getattr(self, "fault_" + kind)()
            self.report(f)
        time.sleep(self.prof["settle"])  # a declared window: steady load after the last fault
        return self.finish()


def main():
    ap = argparse.ArgumentParser(description="workd on a failed-over PostgreSQL")
    form = ap.add_mutually_exclusive_group()
    form.add_argument("--short", action="store_true", help="the CTest form")
    form.add_argument("--long", action="store_true", help="the measured form (make chaos-db)")
    ap.add_argument("--bin-dir", default=str(harness.BIN_DIR))
    ap.add_argument("--rate", type=float, default=None, help="jobs/s submitted in all")
    ap.add_argument("--only", default="", help="comma-separated fault kinds, in this order")
    ap.add_argument("--timing", choices=["fast", "default"], default="fast",
                    help="Patroni ttl/loop_wait/retry_timeout: 8/1/3 or its defaults 30/10/10")
    ap.add_argument("--timeout", type=float, default=None, help="hard overall bound (s)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--shard-databases", action="store_true",
                    help=f"--shards {SHARDS}: the home database (shard 0) a private PostgreSQL, "
                         "shard 1's database the replicated one")
    args = ap.parse_args()
    mode = "long" if args.long else "short"
    prof = dict(PROFILES[mode])
    if args.rate:
        prof["rate"] = args.rate
    plan = args.only.split(",") if args.only else prof["plan"]
    timing = FAST_TIMING if args.timing == "fast" else DEFAULT_TIMING
    if args.timing == "default":
        prof["recovery_bound"] = max(prof["recovery_bound"], 90.0)
    hard = args.timeout or prof["timeout"]
    missing = missing_tools()
    if missing:
        print(f"dbfailover: FAIL: missing {', '.join(missing)} (run scripts/install-deps)")
        return 1
    bin_dir = Path(args.bin_dir).resolve()
    dbs = f" shards={SHARDS} shard_databases=1" if args.shard_databases else ""
    print(f"dbfailover: mode={mode} rate={prof['rate']}{dbs} timing={timing} "
          f"plan={','.join(plan)} hard_timeout_s={hard:.0f}", flush=True)

    def on_alarm(_sig, _frame):
        raise HardTimeout(f"the run took more than {hard:.0f}s")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(hard))
    backstop = threading.Timer(hard + 60, lambda: os._exit(3))
    backstop.daemon = True
    backstop.start()
    t0 = now()
    run, summary = None, {}
    try:
        with ReplicatedCluster(bin_dir=bin_dir, keep=args.keep, timing=timing,
                               private_home=args.shard_databases) as cluster:
            cluster.bin_dir = snapshot_binaries(bin_dir, cluster.tmp / "bin")
            run = Run(cluster, prof, args)
            try:
                summary = run.run(plan)
            except Exception as e:  # noqa: BLE001 - a failed run, with its cause
                run.fail(f"{type(e).__name__}: {e}")
                if not isinstance(e, HardTimeout):
                    traceback.print_exc(file=sys.stdout)
            finally:
                signal.alarm(0)
                run.stop_load()
            if run.failures:
                cluster.dump_logs(lines=40)
    except HardTimeout as e:
        print(f"dbfailover: FAIL [setup] {e}", flush=True)
        return 1
    finally:
        signal.alarm(0)
        backstop.cancel()
    if run is None:
        return 1

    def worst(attr, kinds):
        vals = [getattr(f, attr) for f in run.faults if f.kind in kinds
                and getattr(f, attr) is not None]
        return round(max(vals)) if vals else "-"
    kills = ("postmaster", "node")
    rc = 1 if run.failures else 0
    print(f"dbfailover summary mode={mode} rate={prof['rate']}{dbs} faults={len(run.faults)} "
          + " ".join(f"{k}={v}" for k, v in summary.items())
          + f" worst_accept_ms_postmaster={worst('accept_ms', ('postmaster',))}"
          f" worst_flow_ms_postmaster={worst('flow_ms', ('postmaster',))}"
          f" worst_accept_ms_node={worst('accept_ms', ('node',))}"
          f" worst_flow_ms_node={worst('flow_ms', ('node',))}"
          f" worst_accept_ms_switchover={worst('accept_ms', ('switchover',))}"
          f" worst_flow_ms_switchover={worst('flow_ms', ('switchover',))}"
          f" worst_db_ms_kills={worst('db_ms', kills)}"
          f" elapsed_s={now() - t0:.0f} result={'FAIL' if rc else 'PASS'}", flush=True)
    if rc:
        for msg in run.failures:
            print(f"  {msg.splitlines()[0][:400]}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
