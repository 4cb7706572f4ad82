#!/usr/bin/env python3
"""A shard's database frozen under load (issue 38): shard 1's PostgreSQL,
a server of its own, gets SIGSTOP (postmaster and every backend) for
--freeze seconds while clients submit to both shards, a worker runs
everything and readers poll shard 0's work. A frozen server's kernel still
acknowledges TCP, so keepalives never fire: only deadlines notice.

What must hold, and is checked:
  - shard 0's requests that need nothing of shard 1 (submits with
    generated ids, reads of its work, its jobs run by the worker) go on: the
    p99 of each during the freeze is under --p99-bound (1 s: they stalled
    for the whole freeze before), and their median within 3x (+20 ms) of
    the quiet one;
  - /readyz answers 503 naming shard 1 while it is frozen, and 200 again
    after;
  - requests that need shard 1 wait or fail clearly (503
    database-unavailable for a client-chosen id of shard 0, which must be
    looked up there), and are accepted after the thaw;
  - nothing accepted is lost or run twice.

Prints the figures (docs/reliability.md quotes them). Exits 1 on failure.
"""

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
from harness import Cluster, http, wait_until  # noqa: E402
from workd import JSON  # noqa: E402
from test_shards import queues_per_shard  # noqa: E402
from test_shard_databases import Layout  # noqa: E402


class Series:
    """Timed calls of one kind: (start, seconds, status, detail)."""

    def __init__(self, name):
        self.name, self.rows, self.lock = name, [], threading.Lock()

    def add(self, t, took, status, detail=""):
        with self.lock:
            self.rows.append((t, took, status, detail))

    def window(self, a, b):
        with self.lock:
            return [r for r in self.rows if a <= r[0] < b]


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def run(args):
    with Cluster(bin_dir=args.bin_dir) as cluster:
        cluster.add_database("pg1")
        lay = Layout(cluster, 2, {1: "pg1"})
        s = cluster.start_server("s1", extra_args=lay.args())
        lay.wait_led()
        q0, q1 = (queues_per_shard(2)[k][0] for k in (0, 1))
        cluster.start_worker("w1", s.url, ["--noop", "--concurrency", "4"])
        series = {k: Series(k) for k in ("submit0", "submit0_id", "submit1", "get0", "readyz")}
        accepted, lock = {}, threading.Lock()
        stop = threading.Event()

        def timed(kind, method, path, body=None, timeout=60):
            t = time.monotonic()
            try:
                r = http(method, s.url + path, body, JSON if body is not None else None,
                         timeout=timeout)
            except OSError as e:
                series[kind].add(t, time.monotonic() - t, 0, str(e))
                return None
            detail = r.json().get("detail", "") if r.status >= 400 and r.text else ""
            series[kind].add(t, time.monotonic() - t, r.status, detail)
            return r

        def submitter(kind, queue, with_id, every):
            n = 0
            while not stop.is_set():
                n += 1
                body = {"queue": queue, "payload": n}
                if with_id:
                    body["id"] = f"{kind}-{n}"
                while not stop.is_set():  # a client retries what was refused
                    r = timed(kind, "POST", "/work", body)
                    if r is not None and r.status == 202:
                        with lock:
                            accepted[r.json()["id"]] = queue
                        break
                    time.sleep(0.2)
                time.sleep(every)

        def getter():
            known = None
            while not stop.is_set():
                with lock:
                    known = known or next((i for i, q in accepted.items() if q == q0), None)
                if known:
                    timed("get0", "GET", f"/work/{known}")
                time.sleep(0.1)

        def ready():
            while not stop.is_set():
                timed("readyz", "GET", "/readyz", timeout=10)
                time.sleep(0.2)

        threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in (
            (submitter, ("submit0", q0, False, 0.05)),
            (submitter, ("submit0_id", q0, True, 0.2)),
            (submitter, ("submit1", q1, False, 0.1)),
            (getter, ()), (ready, ()))]
        for t in threads:
            t.start()
        t0 = time.monotonic()
        time.sleep(args.quiet)
        t_freeze = time.monotonic()
        pids = cluster.db_freeze("pg1")
        print(f"froze shard 1's PostgreSQL ({len(pids)} processes) for {args.freeze} s",
              flush=True)
        done_before = completed(lay, q0)
        time.sleep(args.freeze)
        done_during = completed(lay, q0) - done_before
        cluster.db_thaw("pg1")
        t_thaw = time.monotonic()
        print("thawed", flush=True)
        time.sleep(args.after)
        stop.set()
        for t in threads:
            t.join(timeout=90)

        failures = []
        quiet, frozen = (t0, t_freeze), (t_freeze, t_thaw)
        for kind in ("submit0", "get0"):
            q = [r[1] for r in series[kind].window(*quiet) if r[2] in (200, 202)]
            f = [r[1] for r in series[kind].window(*frozen)]
            bad = [r for r in series[kind].window(*frozen) if r[2] not in (200, 202)]
            print(f"{kind}: quiet n={len(q)} median {statistics.median(q) * 1000:.1f} ms "
                  f"p99 {pct(q, 0.99) * 1000:.1f} ms; frozen n={len(f)} median "
                  f"{statistics.median(f) * 1000:.1f} ms p99 {pct(f, 0.99) * 1000:.1f} ms "
                  f"max {max(f) * 1000:.1f} ms, {len(bad)} refused")
            if pct(f, 0.99) > args.p99_bound:
                failures.append(f"{kind}: p99 {pct(f, 0.99):.2f} s while shard 1 was frozen "
                                f"(bound {args.p99_bound} s)")
            if statistics.median(f) > 3 * statistics.median(q) + 0.02:
                failures.append(f"{kind}: median {statistics.median(f) * 1000:.1f} ms frozen "
                                f"against {statistics.median(q) * 1000:.1f} ms quiet")
            if bad:
                failures.append(f"{kind}: refused while shard 1 was frozen: {bad[:3]}")
        ids = series["submit0_id"].window(*frozen)
        refusals = {r[2] for r in ids if r[2] != 202}
        print(f"submit0_id (needs a look in shard 1's database): {len(ids)} tries while frozen, "
              f"answers {sorted({r[2] for r in ids})}")
        if refusals - {503}:
            failures.append(f"a client-chosen id while frozen: answers {sorted(refusals)}")
        print(f"shard 0's jobs completed while shard 1 was frozen: {done_during}")
        if done_during == 0:
            failures.append("no job of shard 0 completed while shard 1 was frozen")

        rz = series["readyz"].window(t_freeze + 3, t_thaw)
        not_named = [r for r in rz if r[2] != 503 or "shard 1" not in r[3]]
        print(f"/readyz while frozen (from 3 s in): {len(rz)} answers, "
              f"{len(rz) - len(not_named)} 503 naming shard 1")
        if not rz or not_named:
            failures.append(f"/readyz while frozen: {not_named[:3]}")
        try:
            wait_until(lambda: http("GET", s.url + "/readyz").status == 200, 15,
                       what="/readyz to be ready again after the thaw")
        except AssertionError as e:
            failures.append(str(e))

        with lock:
            want = dict(accepted)
        try:
            wait_until(lambda: done_count(lay, want) == len(want), 60,
                       what=lambda: f"every accepted job to complete "
                       f"({done_count(lay, want)} of {len(want)})")
        except AssertionError as e:
            failures.append(str(e))
        twice = sum(int(n) for n in lay.by_db(
            "SELECT count(*) FROM (SELECT id FROM workd_done GROUP BY id"
            " HAVING count(*) > 1) d").values())
        print(f"accepted {len(want)}, completed {done_count(lay, want)}, run twice {twice}")
        if twice:
            failures.append(f"{twice} jobs completed twice")
        if failures:
            cluster.dump_logs()
            print("FAIL\n  " + "\n  ".join(failures))
            return 1
        print("PASS")
        return 0


def completed(lay, queue):
    """Jobs of queue (shard 0's: in the home database) completed so far."""
    return int(lay.psql("home", f"SELECT count(*) FROM workd_done WHERE queue = '{queue}'"))


def done_count(lay, want):
    ids = ",".join(f"'{i}'" for i in want)
    if not ids:
        return 0
    return sum(int(n) for n in lay.by_db(
        f"SELECT count(DISTINCT id) FROM workd_done WHERE status = 'completed'"
        f" AND id IN ({ids})").values())


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin-dir", default="build/bin")
    ap.add_argument("--quiet", type=float, default=8)
    ap.add_argument("--freeze", type=float, default=15)
    ap.add_argument("--after", type=float, default=8)
    ap.add_argument("--p99-bound", type=float, default=1.0)
    args = ap.parse_args()
    args.bin_dir = Path(args.bin_dir)
    sys.exit(run(args))


if __name__ == "__main__":
    main()
