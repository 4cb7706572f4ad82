"""An upgrade in place from schema 17 loses nothing. tests/fixtures/schema17.sql
(made by make_schema17.py: work in every state, a batch, a schedule, a webhook
subscription, queue limits) is loaded over migrations 0001-0017 and brought to
the current schema by `workd-server migrate`. Then what the API shows is
compared with schema17.expect.json, first through a front-end-only node
(nothing runs, so every view, history and result must be as it was), then
with a leader, which must take up every piece of open work where it was."""

import datetime
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, http, run_tests, wait_leader, wait_until  # noqa: E402
from upgrade import HookReceiver, listing, results, snapshot, subscriptions  # noqa: E402
from workd import (JSON, complete, expect, get_work, pull, refused_as_history, submit,  # noqa: E402
                   wait_status)

FIXTURES = REPO_ROOT / "tests" / "fixtures"
MIGRATIONS = sorted(p.name for p in (REPO_ROOT / "migrations").glob("*.sql"))
# The event log: the table the database must keep append-only beside workd_done.
LOG_TABLE = "workd_log"
WORKER = "w-up"
# The fixture's history is as old as the fixture: kept whatever its age (its
# parts are not retention's to drop here). Failed attempts are retried at once.
# Workers are gone after a minute only, so that the running attempt (whose
# worker is not heard from again) is retried for its deadline, well before.
SERVER_ARGS = ["--retain", "3650d", "--backoff-base", "0", "--worker-timeout", "60s",
               "--webhook-allow-networks", "127.0.0.1/32", "--webhook-backoff-base", "100ms",
               "--webhook-backoff-max", "300ms"]


def psql_file(cluster, path=None, text=None):
    r = subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", cluster.db_url, "-1",
                        "-f", str(path) if path else "-"], input=text,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, f"psql {path or 'fixture'}: {r.stderr}"


def schema_upto(cluster, version):
    """Migrations 0001..version applied as the server of that version left them."""
    cluster.psql("CREATE TABLE workd_migrations (version integer PRIMARY KEY, name text NOT NULL,"
                 " applied_at timestamptz NOT NULL DEFAULT now())")
    for m in MIGRATIONS:
        if int(m[:4]) <= version:
            psql_file(cluster, REPO_ROOT / "migrations" / m)
            cluster.psql(f"INSERT INTO workd_migrations (version, name) "
                         f"VALUES ({int(m[:4])}, '{m}')")


def refuses_rewrites(cluster, table):
    """The database refuses an UPDATE and a DELETE of `table`'s rows."""
    assert cluster.psql(f"SELECT count(*) FROM {table}") != "0", f"{table} is empty"
    col = cluster.psql(f"SELECT attname FROM pg_attribute WHERE attrelid = '{table}'::regclass "
                       "AND attnum = 1")
    for sql in (f"UPDATE {table} SET {col} = {col}", f"DELETE FROM {table}"):
        refused_as_history(cluster, sql)


def same(what, got, want):
    """got == want, or a message naming the first difference."""
    if got == want:
        return
    if isinstance(got, dict) and isinstance(want, dict):
        keys = sorted(set(got) | set(want))
        for k in keys:
            if got.get(k, "<absent>") != want.get(k, "<absent>"):
                raise AssertionError(f"{what}: [{k!r}] is {got.get(k, '<absent>')!r} after the "
                                     f"upgrade, {want.get(k, '<absent>')!r} before")
    if isinstance(got, list) and isinstance(want, list):
        for i, (g, w) in enumerate(zip(got, want)):
            same(f"{what}[{i}]", g, w)
        raise AssertionError(f"{what}: {len(got)} entries after the upgrade, {len(want)} before "
                             f"(first {min(len(got), len(want))} equal)")
    raise AssertionError(f"{what}: {got!r} after the upgrade, {want!r} before")


def as_of_now(exp):
    """The expectations as the API answers now: work scheduled at the
    fixture's making whose run_at has come since (it is a year ahead at most)
    is pending now, in its view, the listing and its queue's counts."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    due = {i for i, w in exp["work"].items() if w["status"] == "scheduled" and w["run_at"] <= now}
    for i in due:
        exp["work"][i]["status"] = "pending"
        q = next(q for q in exp["queues"] if q["queue"] == exp["work"][i]["queue"])
        q["scheduled"] -= 1
        q["pending"] += 1
        q["oldest_pending_at"] = min(filter(None, (q["oldest_pending_at"],
                                                   exp["work"][i]["run_at"])))
    for w in exp["listing"]:
        if w["id"] in due:
            w["status"] = "pending"
    return exp


def load(cluster, rcv):
    """The fixture over schema 17, its webhook pointed at this run's receiver;
    the expectations as of now."""
    exp = json.loads((FIXTURES / "schema17.expect.json").read_text())
    sql = (FIXTURES / "schema17.sql").read_text()
    assert exp["webhook"]["url"] in sql, "the fixture does not hold the expectations' webhook URL"
    psql_file(cluster, text=sql.replace(exp["webhook"]["url"], rcv.url))
    for s in exp["subscriptions"]:
        s["url"] = s["url"].replace(exp["webhook"]["url"], rcv.url)
    return as_of_now(exp)


def migrate(cluster):
    r = subprocess.run([str(cluster.bin_dir / "workd-server"), "migrate", "--database-url",
                        cluster.db_url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"workd-server migrate failed ({r.returncode}):\n{r.stdout}{r.stderr}"
    versions = cluster.psql("SELECT string_agg(version::text, ',' ORDER BY version) "
                            "FROM workd_migrations")
    assert versions == ",".join(str(int(m[:4])) for m in MIGRATIONS), versions


def check_as_it_was(cluster, exp):
    """Through a node that never leads: nothing runs, so everything a client
    reads is what it read before the upgrade (read in small pages)."""
    reader = cluster.start_server("reader", extra_args=["--roles", "frontend"])
    got = snapshot(reader.url, len(exp["results"]), len(exp["results_with_progress"]), page=2)
    same("work ids", sorted(got["work"]), sorted(exp["work"]))
    for i, want in exp["work"].items():
        same(f"GET /work/{i}", got["work"][i], want)
        same(f"GET /work/{i}/events", got["events"][i], exp["events"][i])
    for part in ("listing", "results", "results_with_progress", "schedules", "batches", "queues"):
        same(part, got[part], exp[part])
    # Resumed from the middle by Last-Event-ID: the rest, nothing missed or repeated.
    mid = len(exp["results"]) // 2
    rest = results(reader.url, len(exp["results"]) - mid - 1,
                   last_event_id=exp["results"][mid]["id"])
    same(f"/results after Last-Event-ID {exp['results'][mid]['id']}", rest,
         exp["results"][mid + 1:])
    assert reader.stop() == 0, reader.log_tail()


class Worker:
    """Pulls and completes jobs through the worker API; `done` lists the ids
    it completed, in order."""

    def __init__(self, url):
        self.url, self.done = url, []

    def take(self, queue, n=1, wait=5):
        """Pulls up to n jobs of one queue and completes them; their ids."""
        jobs = pull(self.url, WORKER, max_jobs=n, wait=wait, queues=[queue])
        for j in jobs:
            self.finish(j)
        return [j["id"] for j in jobs]

    def finish(self, job):
        complete(self.url, WORKER, job, f"{job['id']} after the upgrade")
        self.done.append(job["id"])


def check_limits_in_force(w):
    """The paused queue hands out nothing, the limited one one at a time, and
    the weighted keys take their turns (three gold for one tin)."""
    url = w.url
    assert pull(url, WORKER, max_jobs=5, wait=1, queues=["paused-q"]) == [], \
        "the paused queue handed out work after the upgrade"
    held = pull(url, WORKER, max_jobs=5, wait=2, queues=["limited"])
    assert len(held) == 1, f"max_running 1, yet {len(held)} handed out: {held}"
    assert pull(url, WORKER, max_jobs=5, wait=1, queues=["limited"]) == [], \
        "max_running 1 exceeded after the upgrade"
    w.finish(held[0])
    assert len(w.take("limited")) == 1
    order = []
    while len(order) < 9:
        got = w.take("fair")
        assert got, f"the fair queue stopped handing out work after {order}"
        order += [i.split("-")[0] for i in got]
    first = order.index("tin")
    assert order[first + 1:first + 5] == ["gold"] * 3 + ["tin"], \
        f"weight 3 should give gold three turns per tin's one: {order}"
    expect(http("POST", url + "/queues/paused-q/resume"), 200, "resume paused-q")
    assert w.take("paused-q") == ["paused-1"]


def check_schedule_fires_once(w, exp):
    """The schedule's open tick work holds it (overlap: skip), missed ticks
    and all; once that work is done, the next tick fires once, after the last
    tick recorded before."""
    url, held = w.url, exp["schedules"][0]["last_run"]["id"]
    before = {x["id"] for x in exp["listing"] if x["queue"] == "sched"}

    def new_ticks():
        return sorted({x["id"] for x in listing(url, 100) if x["queue"] == "sched"} - before)

    def last_tick():
        return http("GET", url + "/schedules/every-second").json()["last_tick"]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    wait_until(lambda: last_tick() >= now, 10, what="the leader to decide the ticks due")
    assert new_ticks() == [], f"ticks fired while the last tick's work was open: {new_ticks()}"
    assert w.take("sched") == [held], f"the open tick work {held} was not handed out"
    fired = wait_until(new_ticks, 10, what="the next tick after the upgrade")
    assert len(fired) == 1, f"ticks fired at once after the upgrade: {fired}"
    assert fired[0] > held, f"a tick fired again: {fired[0]} (the last before: {held})"
    tick = datetime.datetime.strptime(fired[0].split("~")[1], "%Y-%m-%dT%H:%M:%SZ")
    later = (tick + datetime.timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%S")
    wait_until(lambda: last_tick() >= later, 10,
               what="two more ticks (skipped while the new one is open)")
    assert new_ticks() == fired, f"more than one tick's work after the upgrade: {new_ticks()}"


def check_deliveries(exp, rcv, done):
    """The subscription delivers, signed with its secret from before, every
    result after its recorded cursor (the fixture's, then those of the work
    done since), in order, and nothing at or before the cursor."""
    cursor = exp["subscriptions"][0]["cursor"]
    owed = {r["id"] for r in exp["results"] if r["id"] > cursor and r["event"] != "batch"}
    assert owed, "the fixture owes its webhook no delivery: nothing to resume"
    rcv.accept()

    def missing():
        msgs = [d["msg"]["data"] for d in rcv.delivered]
        return sorted(owed - {m["seq"] for m in msgs}) + \
            sorted(set(done) - {m["id"] for m in msgs if m["status"] == "completed"})
    wait_until(lambda: not missing(), 20, what=lambda: f"deliveries of {missing()}")
    assert not rcv.bad_signatures, \
        f"not signed with the secret from before: {rcv.bad_signatures[0]}"
    seqs = rcv.seqs()
    assert min(seqs) > cursor, f"delivered again, at or before the cursor {cursor}: {seqs}"
    firsts = list(dict.fromkeys(seqs))
    assert firsts == sorted(firsts), f"deliveries out of seq order: {firsts}"


def test_upgrade_from_schema_17(cluster):
    exp_file = json.loads((FIXTURES / "schema17.expect.json").read_text())
    rcv = HookReceiver(exp_file["webhook"]["secret"], accepting=False)
    try:
        schema_upto(cluster, 17)
        exp = load(cluster, rcv)
        migrate(cluster)
        check_as_it_was(cluster, exp)

        s = cluster.start_server("s1", extra_args=SERVER_ARGS)
        wait_leader(s.url)
        # Deliveries are refused until check_deliveries, so the cursor stays.
        same("GET /subscriptions", subscriptions(s.url), exp["subscriptions"])
        # The running attempt's lease ended long ago: retried, its history kept.
        running = wait_until(lambda: get_work(s.url, "running-1"), 15,
                             until=lambda w: w["status"] == "pending",
                             what="running-1 to be retried")
        assert running["attempts"] == 1 and running["last_error"], running
        events = http("GET", s.url + "/work/running-1/events").json()["events"]
        same("running-1's history before its retry", events[:len(exp["events"]["running-1"])],
             exp["events"]["running-1"])
        w = Worker(s.url)
        check_limits_in_force(w)
        # Dead work retried, the parent's completion releases its child, the
        # batch's last member submits its callback, the SQL submission in the
        # inbox is taken: all of it runs.
        expect(http("POST", s.url + "/work/dead-1/retry"), 200, "retry dead-1")
        assert w.take("graph") == ["parent-1"]
        wait_status(s.url, "child-1", "pending")
        assert w.take("graph") == ["child-1"]
        assert w.take("batchq") == ["b1-c"]
        wait_until(lambda: http("GET", s.url + "/batches/batch-1").json()["finished"], 10,
                   what="batch-1 to finish")
        assert w.take("slow") == ["running-1"]
        ran = set()
        wait_until(lambda: ran.update(w.take("default", n=10, wait=1)) or
                   {"pending-1", "dead-1", "inbox-1", "batch-1~callback"} <= ran, 15,
                   what=lambda: f"the default queue's open work to run (ran {sorted(ran)})")
        assert "scheduled-1" not in ran or exp["work"]["scheduled-1"]["status"] == "pending"
        check_schedule_fires_once(w, exp)
        for i, want in exp["work"].items():
            got = get_work(s.url, i)
            end = want["status"] if want["status"] in ("completed", "cancelled", "scheduled") \
                else "completed"
            assert got["status"] == end, f"{i} is {got['status']}, not {end}: {got}"
            assert (got["payload"], got["created_at"]) == \
                (want["payload"], want["created_at"]), got

        # Finished ids are still known: the same payload is acknowledged, another is refused.
        again = submit(s.url, {"id": "done-1", "payload": exp["work"]["done-1"]["payload"]})
        assert again["created"] is False and again["status"] == "completed", again
        conflict = http("POST", s.url + "/work", {"id": "done-1", "payload": "other"}, JSON)
        assert conflict.status == 409, conflict

        # The results stream from the beginning: the fixture's results first,
        # unchanged, then what ran since.
        now = results(s.url, len(exp["results"]) + len(w.done))
        same("/results from 0 after the upgrade", now[:len(exp["results"])], exp["results"])
        seqs = [r["id"] for r in now]
        assert seqs == sorted(set(seqs)), f"/results repeats or reorders: {seqs}"
        check_deliveries(exp, rcv, w.done)
        for table in (LOG_TABLE, "workd_done"):
            refuses_rewrites(cluster, table)
    finally:
        rcv.close()


if __name__ == "__main__":
    run_tests(globals())
