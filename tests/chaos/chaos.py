#!/usr/bin/env python3
"""Chaos suite: under steady load, inject faults and prove that nothing is lost.

One private PostgreSQL and a whole cluster (tests/lib/harness.py): three server
nodes, three workers running the demo job, client threads that submit work and
SSE subscribers that follow ``/results``. While the load runs, faults are
injected one kind at a time, then mixed:

  leader_kill          kill -9 of the leader (restarted afterwards: always a standby)
  worker_kill          kill -9 of a worker in the middle of jobs, and a new one started
  pg_restart           PostgreSQL fast shutdown and start
  backend_terminate    pg_terminate_backend of the leader's session (the advisory
                       lock holder) or of every front-end listener session
  frontend_kill        kill -9 of a non-leader node with SSE subscribers attached
  worker_freeze        SIGSTOP of a worker past --worker-timeout, then SIGCONT: its
                       late results must be refused

The clients follow the documented contract: each keeps its own record of the
ids it got ``202`` for, and on any other answer or a transport error resubmits
the SAME id (to another node) with backoff until accepted. Subscribers start
at ``after=0`` and, when their stream ends, reconnect to ANOTHER node with
``Last-Event-ID``.

After each scenario the load pauses, open work must drain within a bound, and
the clients' records, the subscribers' records and the event log are compared:
every id that got 202 is accepted in the log and completed exactly once, by the
last attempt that started; every subscriber saw every result exactly once in
``seq`` order. Each scenario prints one ``chaos scenario=...`` line of figures
(key=value), and the run ends with a ``chaos summary ...`` line. Exit status 0
only if nothing was lost, duplicated or stuck.

Figures (per scenario; the summary adds them up over the whole log):
  submitted/completed  ids that got 202 / of those, ids with a completed event
  lost                 202 but no accepted event, or never completed (dead counts)
  duplicated           completed events beyond the first, per id
  stale                ids whose completed attempt is not the last attempt started
  sse_missing          completed ids a subscriber never saw (summed over subscribers)
  sse_duplicated       results a subscriber saw more than once (count - unique)
  stuck                work still pending/running drain_bound s after the load stopped
  worst_recovery_ms    over the faults: the longer of submit recovery (fault until
                       every client has a 202 for a request sent after it) and
                       complete recovery (until every subscriber has a result of
                       work first submitted after it); worst_failover_ms: leader
                       kill until a standby says it leads
  late_refused         late results a frozen worker logged as superseded
  lease_renewed        a frozen worker's attempts that stayed valid because a new
                       leader took over meanwhile (it gives known workers a fresh
                       --worker-timeout); not a failure

    python3 tests/chaos/chaos.py --short     # ~60-90 s, run by CTest
    python3 tests/chaos/chaos.py --long      # ~5-8 min, `make chaos`

With ``--shards N`` the cluster is made with N shards of the manager on
``--servers`` nodes (2 by default then): the clients spread their work over
queues of every shard, a leader kill kills shard 0's leader (the others on
that node move with it), a backend termination ends one shard's writer at
random, and every subscriber must see each shard's results in that shard's
``seq`` order (the shards interleave as they commit).

    python3 tests/chaos/chaos.py --short --shards 4     # CTest's chaos/short-shards

With ``--shard-databases K`` as well, shards 1..N-1 keep their rows in K
more private PostgreSQL servers (shard s in the ((s - 1) mod K)-th; shard 0
stays in the home database), every server started with the same
``--shard-databases``: every check reads every database and merges (each
keeps its own shards' log, open work and terms), a PostgreSQL restart
restarts one of the servers at random (the home one or a shard's), and a
backend termination of a shard's leader session runs in that shard's
database.

    python3 tests/chaos/chaos.py --short --shards 4 --shard-databases 2
                                                  # CTest's chaos/short-shard-databases

Options: --bin-dir DIR, --seed N, --only KIND[,KIND...], --timeout S (hard
overall bound), --keep (keep the cluster's temporary directory), --artifacts DIR
(where logs are copied when the run fails), --shards N, --servers N,
--shard-databases K.
"""

import argparse
import bisect
import collections
import http.client as hc
import json
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import harness  # noqa: E402
from harness import Cluster, WaitTimeout, http, wait_leader, wait_until  # noqa: E402
from workd import JSON, leader_of, shard_of  # noqa: E402

WORKER_TIMEOUT_S = 2.0
SERVER_ARGS = ["--election-interval", "100ms", "--worker-timeout", f"{int(WORKER_TIMEOUT_S)}s",
               "--heartbeat-interval", "500ms", "--lease-grace", "1s",
               "--backoff-base", "50ms", "--backoff-max", "500ms"]
# A demo job takes up to 200 ms (sleeping, no CPU), so that a kill or a freeze
# finds workers in the middle of jobs: at ~30 jobs/s that is a few jobs running
# at any time, and 12 slots still carry ~120 jobs/s.
WORKER_ARGS = ["--concurrency", "4", "--demo", "--demo-delay", "200ms", "--poll-wait", "5s"]
JOB_TIMEOUT_S = 20       # per job: bounds the worst legitimate lease (20 s + 1 s grace)
MAX_ATTEMPTS = 25        # faults end attempts; the work must not die of it
CLIENT_TIMEOUT_S = 20    # above the servers' 10 s --proxy-deadline
FREEZE_S = WORKER_TIMEOUT_S + 2.5   # how long a frozen worker stays stopped

KINDS = ["leader_kill", "worker_kill", "pg_restart", "backend_terminate", "frontend_kill",
         "worker_freeze"]

PROFILES = {
    "short": {
        "timeout": 170, "clients": 4, "rate": 7.5, "subscribers": 3, "servers": 3,
        "workers": 3,
        "plan": [("leader_kill", 3), ("worker_kill", 2), ("pg_restart", 1),
                 ("backend_terminate", 2), ("frontend_kill", 2), ("worker_freeze", 1),
                 ("mixed", 12)],
        "gap": (0.8, 2.0), "mixed_gap": (0.3, 1.2), "drain_bound": 30.0,
        "recovery_bound": 30.0, "restart_delay": 0.8,
    },
    "long": {
        "timeout": 600, "clients": 4, "rate": 7.5, "subscribers": 3, "servers": 3,
        "workers": 3,
        "plan": [("leader_kill", 6), ("worker_kill", 4), ("pg_restart", 3),
                 ("backend_terminate", 4), ("frontend_kill", 3), ("worker_freeze", 3),
                 ("mixed", 20),
                 ("leader_kill", 4), ("worker_kill", 3), ("pg_restart", 2),
                 ("backend_terminate", 4), ("frontend_kill", 3), ("worker_freeze", 2),
                 ("mixed", 30)],
        "gap": (1.5, 3.5), "mixed_gap": (0.5, 3.0), "drain_bound": 30.0,
        "recovery_bound": 30.0, "restart_delay": 1.5,
    },
}


def now():
    return time.monotonic()


class ChaosTimeout(Exception):
    """The run's hard overall timeout went off."""


# ------------------------------------------------------------------ clients

class Client(threading.Thread):
    """Submits work at a steady rate; keeps its own record of what got 202.

    On any answer other than 202 (or a transport error) it resubmits the same
    id to the next node with capped exponential backoff (honouring
    Retry-After) until it is accepted. A 4xx other than 408/429 cannot get
    better by retrying: the id is recorded as refused (a failure)."""

    def __init__(self, idx, urls, rate, run):
        super().__init__(daemon=True, name=f"client-{idx}")
        self.idx, self.urls, self.interval, self.run_ = idx, urls, 1.0 / rate, run
        self.node = idx
        self.n = 0
        self.accepted = {}        # id -> monotonic time of the 202
        self.retried = {}         # id -> [status or error name, ...] before the 202
        self.refused = {}         # id -> (status, body)
        self.responses = []       # (t_send, t_recv, status); status 0: transport error
        self.stop_flag = False
        self.want_pause, self.is_idle = True, False
        self.cv = threading.Condition()

    # --- control (main thread)
    def pause(self):
        with self.cv:
            self.want_pause = True
            self.cv.notify_all()

    def resume(self):
        with self.cv:
            self.want_pause = False
            self.cv.notify_all()

    def wait_idle(self, timeout):
        with self.cv:
            return self.cv.wait_for(lambda: self.is_idle or not self.is_alive(), timeout)

    def stop(self):
        with self.cv:
            self.stop_flag = True
            self.cv.notify_all()

    # --- the client
    def run(self):
        next_at = now()
        while True:
            with self.cv:
                if self.want_pause and not self.stop_flag:
                    self.is_idle = True
                    self.cv.notify_all()
                    self.cv.wait_for(lambda: not self.want_pause or self.stop_flag)
                    self.is_idle = False
                    next_at = now()
                if self.stop_flag:
                    self.is_idle = True
                    self.cv.notify_all()
                    return
            delay = next_at - now()
            if delay > 0:
                time.sleep(delay)  # a declared pace: the client's rate
            next_at = max(next_at + self.interval, now() - self.interval)
            self.submit_one()

    def submit_one(self):
        self.n += 1
        wid = f"{self.run_.tag}-c{self.idx}-{self.n}"
        body = {"id": wid, "payload": self.n % 1000, "max_attempts": MAX_ATTEMPTS,
                "timeout": JOB_TIMEOUT_S}
        if self.run_.queues:  # several shards: every one of them gets work
            body["queue"] = self.run_.queues[self.n % len(self.run_.queues)]
        self.run_.born[wid] = now()
        self.node += 1
        backoff, tries = 0.05, []
        while not self.stop_flag:
            url = self.urls[self.node % len(self.urls)]
            t_send, retry_after, text = now(), None, ""
            try:
                r = http("POST", url + "/work", body, JSON, timeout=CLIENT_TIMEOUT_S)
                status, retry_after, text = r.status, r.headers.get("Retry-After"), r.text
            except (OSError, hc.HTTPException) as e:
                status, text = 0, type(e).__name__
            self.responses.append((t_send, now(), status))
            if status == 202:
                self.accepted[wid] = now()
                if tries:
                    self.retried[wid] = tries
                return
            tries.append(status or text)
            if 400 <= status < 500 and status not in (408, 429):
                self.refused[wid] = (status, text[:300])
                return
            self.node += 1  # another node
            wait = backoff
            if retry_after:
                try:
                    wait = max(wait, min(float(retry_after), 2.0))
                except ValueError:
                    pass
            time.sleep(wait)  # a declared delay: the client's backoff
            backoff = min(backoff * 2, 1.0)

    def first_accept_after(self, tf):
        """Monotonic time of the first 202 for a request sent at or after tf."""
        i = bisect.bisect_left(self.responses, tf, key=lambda r: r[0])
        for t_send, t_recv, status in self.responses[i:]:
            if status == 202:
                return t_recv
        return None


# -------------------------------------------------------------- subscribers

class Subscriber(threading.Thread):
    """Follows GET /results from after=0; when the stream ends (node killed,
    connection cut) it reconnects to ANOTHER node with Last-Event-ID."""

    def __init__(self, idx, urls, run, seed, shards=1):
        super().__init__(daemon=True, name=f"sse-{idx}")
        self.idx, self.urls, self.run_, self.shards = idx, urls, run, shards
        self.rng = random.Random(seed)
        self.name_ = f"sub{idx + 1}"
        self.node = idx
        self.seen = []            # (t_recv, seq, work_id, event)
        self.last_id = None       # the last complete event's id: sent as Last-Event-ID
        self.last_seq = {}        # shard -> the last seq seen of it
        self.out_of_order = []    # (shard, seq, previous seq)
        self.connections = []     # (t, url, Last-Event-ID sent, outcome)
        self.url = None           # node currently streaming to us (200 received)
        self.stop_flag = False
        self.move_to = None
        self.lock = threading.Lock()
        self.sock = None

    def stop(self):
        self.stop_flag = True
        self._cut()

    def move(self, url):
        """Drop the current stream and reconnect to ``url`` (with Last-Event-ID)."""
        self.move_to = url
        self._cut()

    def _cut(self):
        with self.lock:
            if self.sock is not None:
                try:
                    self.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def run(self):
        backoff = 0.05
        while not self.stop_flag:
            url = self.urls[self.node % len(self.urls)]
            got = 0
            try:
                got = self._follow(url)
            except (OSError, hc.HTTPException, ValueError) as e:
                self.connections.append((now(), url, self.last_id, type(e).__name__))
            if self.stop_flag:
                return
            if self.move_to is not None:
                self.node, self.move_to = self.urls.index(self.move_to), None
                continue
            # Another node, at random among the others.
            self.node = self.rng.choice([i for i in range(len(self.urls))
                                         if i != self.node % len(self.urls)])
            if got:
                backoff = 0.05
            else:
                time.sleep(backoff)  # a declared delay: the subscriber's backoff
                backoff = min(backoff * 2, 0.5)

    def _follow(self, url):
        parts = urllib.parse.urlsplit(url)
        conn = hc.HTTPConnection(parts.hostname, parts.port, timeout=5)
        hdrs = {"Accept": "text/event-stream"}
        sent = self.last_id
        if sent is not None:
            hdrs["Last-Event-ID"] = sent
        got = 0
        try:
            conn.connect()
            with self.lock:
                self.sock = conn.sock
            if self.stop_flag or self.move_to is not None:
                return 0
            conn.request("GET", "/results?after=0", headers=hdrs)
            resp = conn.getresponse()
            if resp.status != 200:
                self.connections.append((now(), url, sent, f"HTTP {resp.status}"))
                return 0
            self.connections.append((now(), url, sent, "200"))
            with self.lock:
                self.sock.settimeout(None)  # idle streams may be quiet for long
            self.url = url
            ev_id, ev_type, data = None, None, []
            while True:
                raw = resp.readline()
                if not raw:
                    return got
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line == "":
                    if data and ev_type != "ready":  # "ready": where the stream starts
                        self._event(ev_id, ev_type, "\n".join(data))
                        got += 1
                    ev_id, ev_type, data = None, None, []
                elif line.startswith(":"):
                    continue
                else:
                    field, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "data":
                        data.append(value)
                    elif field == "event":
                        ev_type = value
                    elif field == "id":
                        ev_id = value
        finally:
            self.url = None
            with self.lock:
                self.sock = None
            conn.close()

    def _event(self, ev_id, ev_type, text):
        # The id is a cursor (one seq per shard); the event's own seq and its
        # queue's shard say where it is: order holds within a shard.
        data = json.loads(text)
        seq, work_id = data["seq"], data["id"]
        shard = shard_of(data.get("queue", ""), self.shards)
        last = self.last_seq.get(shard, 0)
        if seq <= last:
            self.out_of_order.append((shard, seq, last))
        self.last_seq[shard] = max(last, seq)
        self.seen.append((now(), seq, work_id, ev_type))
        self.last_id = ev_id

    def first_new_result_after(self, tf, born):
        """Monotonic time of the first result for work first submitted at or after tf."""
        i = bisect.bisect_left(self.seen, tf, key=lambda s: s[0])
        for t_recv, _seq, wid, _ev in self.seen[i:]:
            b = born.get(wid)
            if b is not None and b >= tf:
                return t_recv
        return None


# -------------------------------------------------------------------- faults

class Fault:
    """One injected fault. ``t``: when it was injected; ``t_end``: when its action
    was over (the same instant for a kill; PostgreSQL up again for a restart).
    Recovery is measured from ``t`` to the first 202 for a request sent after
    ``t_end`` (every client), and to the first result of work first submitted
    after ``t_end`` (every subscriber)."""

    def __init__(self, kind, t, detail, t_end=None, **extra):
        self.kind, self.t, self.detail, self.extra = kind, t, detail, extra
        self.t_end = t if t_end is None else t_end
        self.submit_ms = self.complete_ms = None


class FreezeCheck:
    def __init__(self, worker, t, wall, held):
        self.worker, self.t, self.wall, self.held = worker, t, wall, held  # held: [(id, attempt)]
        self.t_resume = self.wall_resume = None
        self.log_offset = None


JOB_LINE = re.compile(r"job (\S+) attempt (\d+) (started|completed|failed|given back)")


def worker_running_jobs(proc):
    """Jobs the worker's own log says it is running now (started, not finished)."""
    try:
        with open(proc.log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 32768))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return set()
    text = text[text.rfind("==== harness: starting"):] if "==== harness: starting" in text else text
    running = set()
    for m in JOB_LINE.finditer(text):
        key = (m.group(1), int(m.group(2)))
        if m.group(3) == "started":
            running.add(key)
        else:
            running.discard(key)
    return running


def snapshot_binaries(src, dst, names=("workd-server", "workd-worker"), timeout=120):
    """Copy the binaries the run uses into dst, so that every restart runs the
    same build even if build/bin is rebuilt meanwhile. Waits for a file being
    written (changed less than 2 s ago) to settle."""
    dst.mkdir(parents=True, exist_ok=True)

    def copied(name):
        st = (src / name).stat()
        if time.time() - st.st_mtime < 2:
            return False
        shutil.copy2(src / name, dst / name)
        after = (src / name).stat()
        return ((after.st_mtime, after.st_size) == (st.st_mtime, st.st_size)
                and (dst / name).stat().st_size == st.st_size)
    for name in names:
        wait_until(lambda: copied(name), timeout, interval=0.5,
                   what=f"{src / name} to stop changing")
    return dst


# -------------------------------------------------------------------- runner

class Chaos:
    def __init__(self, cluster, prof, rng, args):
        self.cluster, self.prof, self.rng, self.args = cluster, prof, rng, args
        self.t0 = now()
        self.tag = "warm"
        self.born = {}                 # id -> monotonic time of its first submission
        self.servers, self.workers = [], []
        self.frozen = None
        self.pending = []              # follow-ups: [due, description, fn]
        self.failures = []             # (scenario, message)
        self.figures = []              # one dict per scenario
        self.freeze_checks = []
        self.worker_no = 0
        self.kill_no = 0
        self.terminate_no = 0
        self.phase = "setup"
        self.scenario_no = 0
        self.shards = args.shards
        self.queues = []  # with several shards: a few queues of each
        for i in range(1000):
            q = f"chaos-{i}"
            if sum(1 for x in self.queues if shard_of(x, self.shards) == shard_of(q, self.shards)) < 2:
                self.queues.append(q)
            if len(self.queues) == 2 * self.shards:
                break
        if self.shards == 1:
            self.queues = []
        # --shard-databases K: the names of the K added PostgreSQL servers
        # (harness add_database); shard s > 0 lives in extra[(s - 1) % K].
        self.extra = [f"shards{k + 1}" for k in range(args.shard_databases or 0)]

    # ------------------------------------------------------------ utilities
    def log(self, msg):
        print(f"chaos: [{now() - self.t0:6.1f}s] {msg}", flush=True)

    def fail(self, msg):
        self.failures.append((self.phase, msg))
        print(f"chaos: FAIL [{self.phase}] {msg}", flush=True)

    def psql(self, sql, db=None):
        """sql in one database: the home one, or the added database named db."""
        return self.cluster.psql(sql, url=self.cluster.database_url(db) if db else None)

    def databases(self):
        """Every database of the cluster: None (home) and the shards' own."""
        return [None] + self.extra

    def db_of(self, shard):
        """The database that keeps shard's rows (None: home)."""
        return self.extra[(shard - 1) % len(self.extra)] if self.extra and shard else None

    def db_name(self, db):
        if db is None:
            return "the home database" + (" (shard 0)" if self.extra else "")
        kept = [s for s in range(self.shards) if self.db_of(s) == db]
        return f"database {db} (shard{'s' if len(kept) > 1 else ''} " \
               f"{','.join(map(str, kept))})"

    def psql_lines(self, sql):
        """The rows of sql in every database, one list (each database's rows in
        its own order: seqs are per shard)."""
        out = []
        for db in self.databases():
            out += [line for line in self.psql(sql, db).splitlines() if line]
        return out

    def later(self, delay, what, fn):
        self.pending.append([now() + delay, what, fn])

    def tick(self):
        due = [p for p in self.pending if p[0] <= now()]
        for p in due:
            self.pending.remove(p)
            p[2]()

    def idle(self, seconds):
        end = now() + seconds
        while True:
            self.tick()
            left = end - now()
            if left <= 0:
                return
            time.sleep(min(0.05, left))  # a declared window, follow-ups run in it

    def flush_pending(self):
        while self.pending:
            self.idle(max(0.0, min(p[0] for p in self.pending) - now()) + 0.01)

    def poll(self, pred, timeout, what, interval=0.05):
        """wait_until that also runs due follow-ups; returns the value or None."""
        try:
            return wait_until(pred, timeout, interval, what, each=self.tick)
        except WaitTimeout:
            return None

    def alive_servers(self):
        return [s for s in self.servers if s.alive()]

    def leader(self, timeout=15.0):
        """The server Proc that leads now (waiting for an election if needed)."""
        by_url = {s.url: s for s in self.alive_servers()}
        url = self.poll(lambda: leader_of(list(by_url)), timeout, "a leader")
        if url is None:
            raise AssertionError(f"no leader among {sorted(by_url)} within {timeout}s")
        return by_url[url]

    def start_worker(self, url=None):
        self.worker_no += 1
        name = f"w{self.worker_no}"
        url = url or self.rng.choice([s.url for s in self.alive_servers()])
        w = self.cluster.start_worker(name, url, WORKER_ARGS)
        self.workers.append(w)
        return w

    def pick_busy_worker(self, timeout=3.0):
        """A live, unfrozen worker that is in the middle of jobs (by its log)."""
        cands = [w for w in self.workers if w.alive() and w is not self.frozen]
        busy = self.poll(lambda: [w for w in cands if worker_running_jobs(w)], timeout,
                         "a busy worker")
        return self.rng.choice(busy or cands)

    def open_attempts_of(self, worker_id):
        """Attempts the log has started for worker_id that have not ended."""
        rows = self.psql_lines(
            "SELECT s.work_id, (s.data->>'attempt')::int FROM workd_events s "
            f"WHERE s.type = 'started' AND s.data->>'worker_id' = '{worker_id}' "
            "AND NOT EXISTS (SELECT 1 FROM workd_events e WHERE e.work_id = s.work_id "
            "AND e.seq > s.seq AND e.type IN ('completed','failed','timed_out','dead',"
            "'cancelled'))")
        return [(line.split("|")[0], int(line.split("|")[1])) for line in rows]

    # ---------------------------------------------------------------- setup
    def setup(self):
        p = self.prof
        shard_args = ["--shards", str(self.shards)] if self.shards > 1 else []
        for name in self.extra:
            self.cluster.add_database(name)
        if self.extra:
            spec = " ".join(f"{s}={self.cluster.database_url(self.db_of(s))}"
                            for s in range(1, self.shards))
            shard_args += ["--shard-databases", spec]
            self.log(f"shard databases: {spec}")
        for i in range(self.args.servers or p["servers"]):
            s = self.cluster.start_server(f"s{i + 1}", extra_args=SERVER_ARGS + shard_args)
            wait_leader(s.url)
            self.servers.append(s)
        if self.shards > 1:
            self.poll(lambda: sum(map(int, self.psql_lines("SELECT count(*) FROM workd_shards")))
                      == self.shards, 30, "every shard to elect a leader")
        self.urls = [s.url for s in self.servers]
        for i in range(p["workers"]):
            self.start_worker(self.urls[i % len(self.urls)])
        self.subs = [Subscriber(i, self.urls, self, self.rng.random(), self.shards)
                     for i in range(p["subscribers"])]
        self.clients = [Client(i, self.urls, p["rate"], self) for i in range(p["clients"])]
        for t in self.subs + self.clients:
            t.start()
        ok = self.poll(lambda: all(s.url for s in self.subs), 15, "subscribers attached")
        if not ok:
            raise AssertionError("SSE subscribers could not attach: "
                                 f"{[self.conns(s, 3) for s in self.subs]}")
        self.log(f"cluster up: servers {', '.join(s.name + '=' + s.url for s in self.servers)}; "
                 f"workers {', '.join(w.name for w in self.workers)}; "
                 f"{len(self.clients)} clients at {p['rate']}/s each; "
                 f"{len(self.subs)} subscribers")

    def shutdown(self):
        for c in getattr(self, "clients", []):
            c.stop()
        for s in getattr(self, "subs", []):
            s.stop()
        for t in getattr(self, "clients", []) + getattr(self, "subs", []):
            t.join(5)

    # --------------------------------------------------------------- faults
    def inject(self, kind):
        fn = getattr(self, "fault_" + kind)
        f = fn()
        self.log(f"fault {kind}: {f.detail}")
        return f

    def fault_leader_kill(self):
        for p in [p for p in self.pending if p[1].startswith("restart ")]:
            self.pending.remove(p)
            p[2]()
        victim = self.leader()
        others = [s for s in self.alive_servers() if s is not victim]
        pid = victim.pid
        t = now()
        victim.kill()
        by_url = {s.url: s for s in others}
        new = self.poll(lambda: leader_of(list(by_url)), 15, "a new leader")
        if new is None:
            self.fail(f"no new leader within 15s after killing the leader {victim.name}")
            failover = None
        else:
            failover = (now() - t) * 1000
        self.cluster.restart_server(victim)
        return Fault("leader_kill", t,
                     f"killed leader {victim.name} (pid {pid}, restarted since); "
                     f"{by_url[new].name if new else 'nobody'} took over in "
                     f"{failover if failover is None else round(failover)} ms",
                     failover_ms=failover)

    def fault_worker_kill(self):
        w = self.pick_busy_worker()
        running = worker_running_jobs(w)
        t = now()
        w.kill()
        held = self.open_attempts_of(w.name)
        self.kill_no += 1
        if self.kill_no % 2:
            w.start()  # the same worker id, a new instance: its old attempts end at once
            how = f"restarted {w.name} (same id, new instance)"
        else:
            self.workers.remove(w)
            how = f"started {self.start_worker().name} in its place"
        return Fault("worker_kill", t, f"killed {w.name} running {len(running)} job(s) by its "
                     f"log, holding {len(held)} open attempt(s) in the event log; {how}",
                     held=held)

    def fault_pg_restart(self):
        db = self.rng.choice(self.databases()) if self.extra else None
        t = now()
        if db is None:
            self.cluster.pg_restart()
        else:
            self.cluster.db_restart(db)
        t_end = now()
        which = f" of {self.db_name(db)}" if self.extra else ""
        return Fault("pg_restart", t, f"PostgreSQL fast restart{which} (stop and start) took "
                     f"{(t_end - t) * 1000:.0f} ms", t_end=t_end)

    def fault_backend_terminate(self):
        self.terminate_no += 1
        if self.terminate_no % 2:
            shard = self.rng.randrange(self.shards)
            sql = ("SELECT a.pid, pg_terminate_backend(a.pid) FROM pg_locks l JOIN "
                   "pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND "
                   f"l.objid = {1 if shard == 0 else 1000 + shard} AND l.objsubid = 2 AND "
                   "l.granted AND a.application_name LIKE 'workd-manager%'")
            what = (f"shard {shard}'s leader's session (advisory lock holder)" if self.shards > 1
                    else "the leader's session (advisory lock holder)")
            dbs = [self.db_of(shard)]
            if self.extra:
                what += f" in {self.db_name(dbs[0])}"
        else:
            sql = ("SELECT pid, pg_terminate_backend(pid) FROM pg_stat_activity "
                   "WHERE application_name = 'workd-listener'")
            what = "every front-end listener session"
            dbs = self.databases()
            if self.extra:
                what += f" in each of the {len(dbs)} databases"

        def terminate():
            return [line for db in dbs for line in self.psql(sql, db).splitlines() if line]
        t = now()
        out = terminate()
        for _ in range(20):
            if out:
                break
            self.idle(0.1)  # e.g. no leader at this instant (an election is running)
            t = now()
            out = terminate()
        t_end = now()
        pids = [line.split("|")[0] for line in out if line.endswith("|t")]
        if not pids:
            self.fail(f"pg_terminate_backend of {what}: no such session found")
        return Fault("backend_terminate", t, f"terminated {what}: backend pid(s) "
                     f"{','.join(pids) or 'none'}", t_end=t_end)

    def fault_frontend_kill(self):
        for p in [p for p in self.pending if p[1].startswith("restart ")]:
            self.pending.remove(p)
            p[2]()
        lead = self.leader()
        cands = [s for s in self.alive_servers() if s is not lead]
        count = {s.url: sum(1 for sub in self.subs if sub.url == s.url) for s in cands}
        target = max(cands, key=lambda s: (count[s.url], self.rng.random()))
        if count[target.url] == 0:
            mover = self.rng.choice(self.subs)
            mover.move(target.url)
            if not self.poll(lambda: mover.url == target.url, 10, "subscriber moved"):
                self.fail(f"subscriber {mover.name_} could not attach to {target.name}")
        attached = [sub for sub in self.subs if sub.url == target.url]
        t = now()
        target.kill()
        box = {"restarted": float("inf")}

        def restart():
            self.cluster.restart_server(target)
            box["restarted"] = now()
            self.log(f"restarted {target.name}")
        self.later(self.prof["restart_delay"], f"restart {target.name}", restart)
        return Fault("frontend_kill", t, f"killed front-end {target.name} with subscriber(s) "
                     f"{','.join(s.name_ for s in attached) or 'none'} attached",
                     attached=attached, url=target.url, box=box)

    def fault_worker_freeze(self):
        if self.frozen is not None:
            return self.fault_worker_kill()
        w = self.pick_busy_worker()
        running = worker_running_jobs(w)
        t, wall = now(), time.time()
        w.suspend()
        self.frozen = w
        # Reports the worker sent just before the stop may still be committed:
        # let them land before taking the list of attempts it holds.
        self.idle(0.3)
        held = self.open_attempts_of(w.name)
        chk = FreezeCheck(w, t, wall, held)
        self.freeze_checks.append(chk)

        def resume():
            chk.log_offset = w.log_path.stat().st_size
            chk.t_resume, chk.wall_resume = now(), time.time()
            w.resume()
            self.frozen = None
            self.log(f"SIGCONT {w.name} after {(chk.t_resume - t):.1f}s frozen")
        self.later(FREEZE_S, f"resume {w.name}", resume)
        return Fault("worker_freeze", t, f"SIGSTOP {w.name} running {len(running)} job(s) by "
                     f"its log, holding {len(held)} open attempt(s): "
                     f"{' '.join(f'{i}#{a}' for i, a in held[:8])}", held=held)

    # ------------------------------------------------------------- measures
    def measure(self, f):
        """Fill f.submit_ms / f.complete_ms once every client and subscriber saw it."""
        if f.submit_ms is None:
            ts = [c.first_accept_after(f.t_end) for c in self.clients]
            if all(x is not None for x in ts):
                f.submit_ms = (max(ts) - f.t) * 1000
        if f.complete_ms is None:
            ts = [s.first_new_result_after(f.t_end, self.born) for s in self.subs]
            if all(x is not None for x in ts):
                f.complete_ms = (max(ts) - f.t) * 1000
        return f.submit_ms is not None and f.complete_ms is not None

    def await_recovery(self, faults):
        bound = self.prof["recovery_bound"]
        ok = self.poll(lambda: all(self.measure(f) for f in faults), bound, "recovery")
        if not ok:
            for f in faults:
                if not self.measure(f):
                    self.fail(f"no recovery within {bound:.0f}s after the {f.kind} fault at "
                              f"t={f.t - self.t0:.1f}s ({f.detail}): submissions accepted "
                              f"again: {f.submit_ms is not None}, new results flowing to every "
                              f"subscriber: {f.complete_ms is not None}")
        for f in faults:
            if f.kind == "frontend_kill":
                for sub in f.extra["attached"]:
                    moved = [c for c in sub.connections if c[0] > f.t and c[3] == "200"]
                    if not moved:
                        self.fail(f"subscriber {sub.name_} did not reconnect after its node "
                                  f"was killed: {self.conns(sub, 5)}")
                    elif moved[0][2] is None or (moved[0][1] == f.extra["url"] and
                                                 moved[0][0] < f.extra["box"]["restarted"]):
                        self.fail(f"subscriber {sub.name_} reconnected as {moved[0]}; "
                                  "expected another node, with Last-Event-ID")

    # ------------------------------------------------------------ scenarios
    def scenario(self, kind, nfaults):
        self.scenario_no += 1
        name = kind
        self.phase = f"{name}#{self.scenario_no}"
        self.tag = f"s{self.scenario_no:02d}"
        t_start = self.t_scenario = now()
        for c in self.clients:
            c.resume()
        # Steady state first: new work flows to every subscriber.
        if not self.poll(lambda: all(s.first_new_result_after(t_start, self.born)
                                     for s in self.subs), 30, "flow"):
            self.fail("no results flowed to every subscriber within 30s before any fault")
        faults = []
        gap = self.prof["gap"] if kind != "mixed" else self.prof["mixed_gap"]
        for i in range(nfaults):
            self.idle(self.rng.uniform(*gap))
            if kind == "mixed":
                f = self.inject(self.next_mixed_kind())
            else:
                f = self.inject(kind)
                self.await_recovery([f])
                self.report_fault(f)
            faults.append(f)
        self.flush_pending()
        if kind == "mixed":
            self.await_recovery(faults)
            for f in faults:
                self.report_fault(f)
        self.finish(name, faults, t_start)

    def next_mixed_kind(self):
        """Every kind once in a random order, then again (a frozen worker is not
        frozen twice: that kind waits for the next round)."""
        if not getattr(self, "bag", None):
            self.bag = list(KINDS)
            self.rng.shuffle(self.bag)
        for k in self.bag:
            if not (k == "worker_freeze" and self.frozen):
                self.bag.remove(k)
                return k
        return "worker_kill"

    def report_fault(self, f):
        fo = f.extra.get("failover_ms")
        self.log(f"  {f.kind} at t={f.t - self.t0:.1f}s: submit_recovery_ms="
                 f"{'-' if f.submit_ms is None else round(f.submit_ms)} complete_recovery_ms="
                 f"{'-' if f.complete_ms is None else round(f.complete_ms)}"
                 + (f" failover_ms={round(fo)}" if fo is not None else ""))

    def finish(self, name, faults, t_start):
        tag = self.tag
        # 1. The load stops; every client gets its last id accepted.
        t_pause = now()
        for c in self.clients:
            c.pause()
        for c in self.clients:
            if not c.wait_idle(60):
                self.fail(f"client {c.idx} could not get its last submission accepted in 60s "
                          f"(last answers: {c.responses[-5:]})")
        # 2. No work stays stuck: all open work drains within the bound.
        bound = self.prof["drain_bound"]
        drained = self.poll(lambda: sum(map(int, self.psql_lines(
                                "SELECT count(*) FROM workd_open WHERE status "
                                "IN ('pending','running')"))) == 0, bound, "drain",
                            interval=0.2)
        drain_ms = (now() - t_pause) * 1000
        stuck = []
        if not drained:
            stuck = sorted(self.psql_lines("SELECT id FROM workd_open WHERE status IN "
                                           "('pending','running') ORDER BY id"))
            self.fail(f"{len(stuck)} work item(s) still open {bound:.0f}s after the load "
                      f"stopped: {stuck[:10]}" + self.evidence(stuck))
        # 3. The event log against the clients' records.
        figs = self.check_log(tag, name)
        figs["stuck"] = len(stuck)
        # 4. Every subscriber gets every result, once.
        self.check_sse(tag, figs)
        self.check_freezes(figs)
        sub = [f.submit_ms for f in faults if f.submit_ms is not None]
        com = [f.complete_ms for f in faults if f.complete_ms is not None]
        fo = [f.extra["failover_ms"] for f in faults if f.extra.get("failover_ms") is not None]
        figs.update({
            "faults": len(faults),
            "kinds": ",".join(sorted({f.kind for f in faults})) if name == "mixed" else None,
            "worst_submit_recovery_ms": round(max(sub)) if sub else None,
            "worst_complete_recovery_ms": round(max(com)) if com else None,
            "worst_recovery_ms": round(max(sub + com)) if sub + com else None,
            "worst_failover_ms": round(max(fo)) if fo else None,
            "drain_ms": round(drain_ms),
            "duration_s": round(now() - t_start, 1),
        })
        figs["scenario"] = name
        self.figures.append(figs)
        order = ["scenario", "faults", "kinds", "submitted", "completed", "lost", "duplicated",
                 "stale", "dead", "refused", "sse_missing", "sse_duplicated", "sse_unordered",
                 "stuck", "late_refused", "lease_renewed", "worst_recovery_ms", "worst_submit_recovery_ms",
                 "worst_complete_recovery_ms", "worst_failover_ms", "drain_ms",
                 "client_retries", "sse_reconnects", "duration_s"]
        print("chaos " + " ".join(f"{k}={figs[k]}" for k in order
                                  if k in figs and figs[k] is not None), flush=True)

    def log_rows(self, like):
        """{work_id: (accepted, completed, [completed attempts], last started, dead)}."""
        out = self.psql_lines(
            "SELECT work_id, count(*) FILTER (WHERE type = 'accepted'), "
            "count(*) FILTER (WHERE type = 'completed'), "
            "coalesce(string_agg(data->>'attempt', ',' ORDER BY seq) "
            "FILTER (WHERE type = 'completed'), ''), "
            "coalesce(max((data->>'attempt')::int) FILTER (WHERE type = 'started'), 0), "
            "count(*) FILTER (WHERE type = 'dead') "
            f"FROM workd_events WHERE work_id LIKE '{like}' GROUP BY work_id")
        rows = {}
        for line in out:  # an id in two databases adds up (and shows as accepted twice)
            wid, acc, comp, atts, started, dead = line.split("|")
            got = rows.get(wid, (0, 0, [], 0, 0))
            rows[wid] = (got[0] + int(acc), got[1] + int(comp),
                         got[2] + [int(a) for a in atts.split(",") if a],
                         max(got[3], int(started)), got[4] + int(dead))
        return rows

    def check_log(self, tag, name):
        rows = self.log_rows(f"{tag}-%")
        accepted = {}
        refused = {}
        retries = 0
        for c in self.clients:
            accepted.update({k: v for k, v in c.accepted.items() if k.startswith(tag + "-")})
            refused.update({k: v for k, v in c.refused.items() if k.startswith(tag + "-")})
            retries += sum(len(v) for k, v in c.retried.items() if k.startswith(tag + "-"))
        unlogged = [i for i in accepted if i not in rows or rows[i][0] != 1]
        lost = [i for i in accepted if i not in rows or rows[i][1] == 0]
        dup = {i: rows[i][1] for i in rows if rows[i][1] > 1}
        stale = {i: (rows[i][2], rows[i][3]) for i in rows
                 if rows[i][1] and rows[i][2][-1] != rows[i][3]}
        dead = [i for i in rows if rows[i][4]]
        if unlogged:
            self.fail(f"{len(unlogged)} id(s) got 202 but have no (or several) accepted "
                      f"event(s): {unlogged[:10]}" + self.evidence(unlogged))
        if lost:
            self.fail(f"{len(lost)} id(s) got 202 but never completed: {sorted(lost)[:10]}"
                      + self.evidence(lost))
        if dup:
            self.fail(f"{len(dup)} id(s) completed more than once: "
                      f"{dict(list(dup.items())[:10])}" + self.evidence(list(dup)))
        if stale:
            self.fail(f"{len(stale)} id(s) completed by an attempt other than the last one "
                      f"started (completed attempts, last started): "
                      f"{dict(list(stale.items())[:10])}" + self.evidence(list(stale)))
        if refused:
            self.fail(f"{len(refused)} submission(s) refused with a 4xx that retrying cannot "
                      f"fix: {dict(list(refused.items())[:5])}")
        return {"submitted": len(accepted),
                "completed": sum(1 for i in accepted if i in rows and rows[i][1] >= 1),
                "lost": len(lost) + len([i for i in unlogged if i not in lost]),
                "duplicated": sum(n - 1 for n in dup.values()),
                "stale": len(stale), "dead": len(dead), "refused": len(refused),
                "client_retries": retries, "_completed_ids": {i for i in rows if rows[i][1]}}

    def check_sse(self, tag, figs):
        want = figs.pop("_completed_ids")

        def seen_all():
            return all(want <= {w for _t, _s, w, _e in s.seen if w.startswith(tag + "-")}
                       for s in self.subs)
        self.poll(seen_all, 15, "results to every subscriber")
        missing = dups = unordered = reconnects = 0
        for s in self.subs:
            mine = [w for _t, _s, w, _e in s.seen if w.startswith(tag + "-")]
            counts = collections.Counter(mine)
            miss = sorted(want - set(counts))
            extra = sorted(set(counts) - want)
            d = {w: n for w, n in counts.items() if n > 1}
            missing += len(miss)
            dups += len(mine) - len(counts)
            if miss:
                seqs = " ".join(self.psql_lines(
                    "SELECT seq, work_id FROM workd_events WHERE type = 'completed' AND "
                    "work_id = ANY('{" + ",".join(miss[:20]) + "}') ORDER BY seq"))
                self.fail(f"subscriber {s.name_} missed {len(miss)} result(s): {miss[:10]} "
                          f"(seq|id: {seqs}); its connections: {self.conns(s)}")
            if d:
                self.fail(f"subscriber {s.name_} got {len(mine) - len(counts)} duplicate "
                          f"result(s): {dict(list(d.items())[:10])}; its connections: "
                          f"{self.conns(s)}")
            if extra:
                self.fail(f"subscriber {s.name_} got results for ids with no completed event "
                          f"in the log: {extra[:10]}")
            unordered += len(s.out_of_order)
            if s.out_of_order:
                self.fail(f"subscriber {s.name_} got events out of their shard's seq order "
                          f"(shard, seq, previous): {s.out_of_order[:10]}")
                s.out_of_order.clear()
            reconnects += sum(1 for c in s.connections if c[3] == "200" and c[0] >= self.t_scenario)
        figs["sse_missing"] = missing
        figs["sse_duplicated"] = dups
        figs["sse_unordered"] = unordered
        figs["sse_reconnects"] = reconnects

    def check_freezes(self, figs):
        """A worker frozen past --worker-timeout has its attempts ended by the leader,
        and none of its late results is recorded (their attempt is superseded).

        A new leader cannot know when a worker last heartbeated (workers are not
        persisted): it gives the workers of running attempts a fresh worker
        timeout (docs/architecture.md). So the attempts must have been ended only
        if one term led throughout the freeze; otherwise they may legitimately
        still be valid when the worker wakes up (counted as lease_renewed).
        Either way a recorded completion must name the last attempt started,
        which check_log verifies for every id."""
        checks, self.freeze_checks = self.freeze_checks, []
        if not checks:
            return
        late = renewed = 0
        terms = [float(x) / 1000 for x in self.psql_lines(
            "SELECT extract(epoch FROM at) * 1000 FROM workd_events WHERE type = 'term'")]
        for chk in checks:
            if chk.log_offset is not None:
                with open(chk.worker.log_path, "rb") as f:
                    f.seek(chk.log_offset)
                    late += f.read().decode("utf-8", "replace").count(
                        "result dropped: the attempt was superseded")
            if not chk.held:
                continue
            new_terms = [t for t in terms if chk.wall <= t <= chk.wall_resume]
            ids = ",".join(i for i, _ in chk.held)
            out = self.psql_lines("SELECT work_id, type, (data->>'attempt')::int FROM "
                                  "workd_events WHERE work_id = ANY('{" + ids + "}') AND type IN "
                                  "('completed','failed','timed_out') ORDER BY seq")
            ends = collections.defaultdict(list)
            for line in out:
                wid, typ, att = line.split("|")
                ends[(wid, int(att))].append(typ)
            for key in chk.held:
                ended = [t for t in ends[key] if t != "completed"]
                if ended and "completed" in ends[key]:
                    self.fail(f"{chk.worker.name} was frozen past its lease and its attempt "
                              f"{key[0]}#{key[1]} was ended, yet its late result was "
                              "recorded" + self.evidence([key[0]]))
                elif not ended and not new_terms:
                    self.fail(f"{chk.worker.name} was frozen {FREEZE_S:.1f}s (worker timeout "
                              f"{WORKER_TIMEOUT_S:.0f}s) under one leader, but its attempt "
                              f"{key[0]}#{key[1]} was not ended (late result "
                              f"{'recorded' if ends[key] else 'not recorded'})"
                              + self.evidence([key[0]]))
                elif not ended:
                    renewed += 1
        figs["late_refused"] = late
        figs["lease_renewed"] = renewed

    def conns(self, sub, n=8):
        """A subscriber's last connections: (t, node, Last-Event-ID sent, outcome)."""
        names = {s.url: s.name for s in self.servers}
        return [(round(t - self.t0, 2), names.get(u, u), sent, what)
                for t, u, sent, what in sub.connections[-n:]]

    def evidence(self, ids, limit=4):
        """Event-log history, client records and log lines for a few affected ids."""
        out = []
        for wid in sorted(ids)[:limit]:
            born = self.born.get(wid)
            out.append(f"\n  --- {wid}: first submitted at "
                       + ("an unknown time" if born is None else f"t={born - self.t0:.2f}s"))
            for c in self.clients:
                if wid in c.accepted:
                    out.append(f"  client {c.idx}: 202 at t={c.accepted[wid] - self.t0:.2f}s "
                               f"after {c.retried.get(wid, [])}")
            for db in self.databases():
                where = f" in {self.db_name(db)}" if self.extra else ""
                try:
                    rows = self.psql("SELECT seq, term, type, data FROM workd_events WHERE "
                                     f"work_id = '{wid}' ORDER BY seq", db)
                    if rows or not self.extra:
                        out.append(f"  events{where} (seq|term|type|data):\n    "
                                   + rows.replace("\n", "\n    "))
                except RuntimeError as e:
                    out.append(f"  events{where}: {e}")
            for p in self.cluster.procs:
                lines = [ln for ln in p.log_text().splitlines()
                         if re.search(re.escape(wid) + r"\b", ln)]
                for ln in lines[:6]:
                    out.append(f"  {p.name}: {ln}")
        return "\n".join(out)

    # ----------------------------------------------------------------- run
    def run(self, plan):
        self.setup()
        for kind, n in plan:
            self.scenario(kind, n)
        self.phase = "final"
        self.final_check()

    def final_check(self):
        rows = self.log_rows("s%")
        dup = {i: r[1] for i, r in rows.items() if r[1] > 1}
        stale = [i for i, r in rows.items() if r[1] and r[2][-1] != r[3]]
        accepted = {}
        for c in self.clients:
            accepted.update(c.accepted)
        lost = [i for i in accepted if i not in rows or rows[i][1] == 0]
        if dup or stale or lost:
            self.fail(f"whole run: {len(lost)} lost, {len(dup)} completed twice, "
                      f"{len(stale)} completed by a stale attempt")
        completed = {i for i, r in rows.items() if r[1]}
        sse_missing = sse_dup = 0
        for s in self.subs:
            mine = [w for _t, _s, w, _e in s.seen if w.startswith("s")]
            sse_missing += len(completed - set(mine))
            sse_dup += len(mine) - len(set(mine))
        term = max((int(t) for t in self.psql_lines("SELECT max(term) FROM workd_events")),
                   default="")
        self.summary = {
            "submitted": len(accepted), "completed": len(completed & set(accepted)),
            "lost": len(lost), "duplicated": sum(n - 1 for n in dup.values()),
            "stale": len(stale), "sse_missing": sse_missing, "sse_duplicated": sse_dup,
            "terms": term,
        }


def main():
    ap = argparse.ArgumentParser(description="workd chaos suite")
    form = ap.add_mutually_exclusive_group()
    form.add_argument("--short", action="store_true", help="the CTest form (~60-90 s)")
    form.add_argument("--long", action="store_true", help="every kind several times (~5-8 min)")
    ap.add_argument("--bin-dir", default=str(harness.BIN_DIR), help="directory of workd binaries")
    ap.add_argument("--seed", type=int, default=None, help="random seed (default: from time)")
    ap.add_argument("--only", default="", help="comma-separated fault kinds to run (and mixed)")
    ap.add_argument("--timeout", type=float, default=None, help="hard overall bound in seconds")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--shards", type=int, default=1, help="shards of the manager (default 1)")
    ap.add_argument("--servers", type=int, default=None,
                    help="server nodes (default: the profile's, 2 with --shards)")
    ap.add_argument("--shard-databases", type=int, default=0, metavar="K",
                    help="shards 1..N-1 in K more PostgreSQL servers (needs --shards N > 1)")
    ap.add_argument("--artifacts", default=None,
                    help="where to copy logs when the run fails (default: a new /tmp dir)")
    args = ap.parse_args()
    if args.shards > 1 and not args.servers:
        args.servers = 2
    if args.shard_databases and not 1 <= args.shard_databases < args.shards:
        ap.error("--shard-databases K needs --shards N > 1 and K from 1 to N - 1")
    mode = "long" if args.long else "short"
    prof = PROFILES[mode]
    plan = prof["plan"]
    if args.only:
        only = args.only.split(",")
        bad = [k for k in only if k not in KINDS + ["mixed"]]
        if bad:
            ap.error(f"unknown kind(s) {bad}; choose from {KINDS + ['mixed']}")
        plan = [(k, n) for k, n in plan if k in only]
    seed = args.seed if args.seed is not None else int(time.time() * 1000) % 1_000_000
    hard = args.timeout or prof["timeout"]
    bin_dir = Path(args.bin_dir).resolve()
    for exe in ("workd-server", "workd-worker"):
        if not (bin_dir / exe).exists():
            print(f"chaos: FAIL: {bin_dir / exe} does not exist (build first, or --bin-dir)")
            return 2
    dbs = f" shard_databases={args.shard_databases}" if args.shard_databases else ""
    print(f"chaos: mode={mode} shards={args.shards}{dbs} seed={seed} hard_timeout_s={hard:.0f} "
          f"bin_dir={bin_dir} "
          f"plan={','.join(f'{k}x{n}' for k, n in plan)}", flush=True)

    def on_alarm(_sig, _frame):
        raise ChaosTimeout(f"hard timeout: the run took more than {hard:.0f}s")
    signal.signal(signal.SIGALRM, on_alarm)
    signal.alarm(int(hard))
    # Last resort if cleanup itself hangs: the harness's watchdog destroys
    # PostgreSQL and the workd processes die with us (PR_SET_PDEATHSIG).
    backstop = threading.Timer(hard + 60, lambda: (print("chaos: FAIL: cleanup hung; exiting",
                                                         flush=True), os._exit(3)))
    backstop.daemon = True
    backstop.start()

    t0 = now()
    rc = 0
    chaos = None
    try:
        with Cluster(bin_dir=bin_dir, keep=args.keep) as cluster:
            chaos = Chaos(cluster, prof, random.Random(seed), args)
            try:
                cluster.bin_dir = snapshot_binaries(bin_dir, cluster.tmp / "bin")
                chaos.run(plan)
            except Exception as e:  # noqa: BLE001 - any error is a failed run, with its cause
                chaos.failures.append((chaos.phase, f"{type(e).__name__}: {e}"))
                print(f"chaos: FAIL [{chaos.phase}] {type(e).__name__}: {e}", flush=True)
                if not isinstance(e, ChaosTimeout):
                    traceback.print_exc(file=sys.stdout)
            finally:
                signal.alarm(0)
                chaos.shutdown()
            if chaos.failures:
                rc = 1
                for w in chaos.workers:
                    w.resume()
                cluster.dump_logs(lines=30)
                dest = Path(args.artifacts or tempfile.mkdtemp(prefix=f"workd-chaos-{seed}-"))
                dest.mkdir(parents=True, exist_ok=True)
                for f in list(cluster.tmp.glob("*.log")) + list(cluster.pg_dir.glob("*.log")):
                    shutil.copy(f, dest / f.name)
                for name, db in cluster.databases.items():
                    for f in db["dir"].glob("*.log"):
                        shutil.copy(f, dest / f"{f.stem}-{name}{f.suffix}")
                print(f"chaos: logs copied to {dest}", flush=True)
    except ChaosTimeout as e:  # while the cluster itself was starting
        rc = 1
        print(f"chaos: FAIL [setup] {e}", flush=True)
    signal.alarm(0)
    if chaos is None:
        print(f"chaos summary mode={mode} seed={seed} result=FAIL", flush=True)
        return 1
    backstop.cancel()
    figs = chaos.figures
    sm = getattr(chaos, "summary", None) or {}

    def total(key):
        return sum(f.get(key) or 0 for f in figs)
    worst = [f["worst_recovery_ms"] for f in figs if f.get("worst_recovery_ms") is not None]
    print(f"chaos summary mode={mode} shards={args.shards}{dbs} seed={seed} "
          f"scenarios={len(figs)} "
          f"faults={total('faults')} submitted={sm.get('submitted', total('submitted'))} "
          f"completed={sm.get('completed', total('completed'))} "
          f"lost={sm.get('lost', total('lost'))} "
          f"duplicated={sm.get('duplicated', total('duplicated'))} "
          f"stale={sm.get('stale', total('stale'))} stuck={total('stuck')} "
          f"sse_missing={sm.get('sse_missing', total('sse_missing'))} "
          f"sse_duplicated={sm.get('sse_duplicated', total('sse_duplicated'))} "
          f"terms={sm.get('terms', '?')} worst_recovery_ms={max(worst) if worst else '-'} "
          f"elapsed_s={now() - t0:.0f} result={'FAIL' if rc else 'PASS'}", flush=True)
    if rc:
        print(f"chaos: {len(chaos.failures)} failure(s):", flush=True)
        for phase, msg in chaos.failures:
            print(f"  [{phase}] {msg.splitlines()[0][:400]}", flush=True)
        print(f"chaos: reproduce with: {sys.argv[0]} --{mode} --seed {seed}"
              + (f" --shards {args.shards}" if args.shards > 1 else "")
              + (f" --shard-databases {args.shard_databases}" if args.shard_databases else ""),
              flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
