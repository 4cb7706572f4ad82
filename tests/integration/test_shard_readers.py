"""Readers of a cluster of two shards: every node follows each shard's log.

A server does not run a second shard's manager yet, so this test makes the
cluster two shards by SQL before the server starts (workd_cluster) and writes
shard 1's log as that shard's leader would: records of workd_log_line lines
in workd_log with shard 1, its work's rows, and the NOTIFY payloads
"1:<seq>" and "1:<term>". Shard 0 is the server's own manager. Then:
/results ids are cursors "<shard 0's seq>.<shard 1's seq>", a resume from any
of them has no gap and no repeat, a live stream gets both shards' events, a
work's own stream and GET /work/{id}?wait follow its shard, GET /work pages
across both shards, and the listener reads shard 1's leader."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, complete, expect, heartbeat, pull, submit  # noqa: E402

FAST = ["--election-interval", "100ms"]


def two_shards(cluster):
    """A fresh database of schema 19 or later whose cluster has two shards."""
    r = subprocess.run([str(cluster.bin_dir / "workd-server"), "migrate", "--database-url",
                        cluster.db_url], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"workd-server migrate failed:\n{r.stdout}{r.stderr}"
    cluster.psql("UPDATE workd_cluster SET shards = 2")


def run_one(url, work_id, queue="q0"):
    """Submits work_id to shard 0 (the server's manager) and completes it."""
    submit(url, {"id": work_id, "payload": 1, "queue": queue})
    heartbeat(url, "wk", queues=[queue])
    job = pull(url, "wk", queues=[queue], wait=5)[0]
    assert job["id"] == work_id, job
    complete(url, "wk", job, {"ok": work_id})


def version(cluster):
    """The version the server writes a completed event's line with."""
    v = cluster.psql("SELECT substring(events from '\"type\":\"completed\",\"v\":([0-9]+)')"
                     " FROM workd_log WHERE events LIKE '%\"type\":\"completed\"%' LIMIT 1")
    assert v, "no completed event in shard 0's log to read the version of"
    return int(v)


def shard1_completed(cluster, work_id, seq, notify=True):
    """Appends the completion of work_id at seq to shard 1's log, as shard 1's
    leader would (one record), and tells the nodes."""
    line = (f"workd_log_line({seq}, (extract(epoch from now()) * 1000)::bigint, 'completed', "
            f"{version(cluster)}, '{work_id}', "
            f"'{{\"attempt\":1,\"result\":{{\"ok\":\"{work_id}\"}},\"queue\":\"q1\"}}'::jsonb)")
    cluster.psql(
        "INSERT INTO workd_log (first_seq, last_seq, term, last_at, events, part, shard)"
        f" SELECT {seq}, {seq}, 1, now(), {line}, max(part), 1 FROM workd_parts")
    if notify:
        cluster.psql(f"SELECT pg_notify('workd_events', '1:{seq}')")


def shard1_row(cluster, table, like, work_id, history, created):
    """A row of shard 1's work in table (workd_open or workd_done), copied from
    work `like`'s with its own id, shard, seqs and creation time."""
    last = history[-1]
    seqs = {"history": history, "accepted_seq": history[0], "updated_seq": last}
    if table == "workd_done":
        seqs = {**seqs, "finished_seq": last}
    patch = json.dumps({"id": work_id, "shard": 1, "queue": "q1", **seqs})
    cluster.psql(
        f"INSERT INTO {table} SELECT (jsonb_populate_record(NULL::{table}, to_jsonb(d)"
        f" || '{patch}'::jsonb || jsonb_build_object('created_at', now() + '{created} ms'))).*"
        f" FROM {table} d WHERE id = '{like}'")


def ids_by_work(events):
    return [(e["data"]["id"], e["id"]) for e in events]


def check_cursors(events, shard_of):
    """Each id is a cursor of two seqs; its own shard's seq is the event's,
    and no component goes back."""
    prev = (0, 0)
    for e in events:
        parts = tuple(int(x) for x in e["id"].split("."))
        assert len(parts) == 2, f"an id of a two-shard cluster has two seqs: {e['id']}"
        s = shard_of(e["data"]["id"])
        assert parts[s] == e["data"]["seq"], \
            f"{e['data']['id']}'s id {e['id']} should hold its seq {e['data']['seq']} at {s}"
        assert parts[0] >= prev[0] and parts[1] >= prev[1], \
            f"ids went back: {prev} then {e['id']}"
        prev = parts


def from_start_and_resumed(url, shard_of, want):
    """The events of /results?after=0 (the works `want`, each once), checked
    as cursors; and a resume from each of their ids gives the rest."""
    with SSEClient(url + "/results?after=0") as all_:
        all_.wait_count(len(want))
        time.sleep(0.3)  # a declared window: nothing more may come
        got = list(all_.events)
    assert sorted(e["data"]["id"] for e in got) == sorted(want), \
        f"after=0 should give {want} once each: {ids_by_work(got)}"
    check_cursors(got, shard_of)
    for k, e in enumerate(got):
        with SSEClient(url + "/results", last_event_id=e["id"]) as again:
            rest = got[k + 1:]
            if rest:
                again.wait_count(len(rest))
            time.sleep(0.2)  # a declared window: no repeat may follow
            assert ids_by_work(again.events) == ids_by_work(rest), \
                f"resumed after {e['id']}: {ids_by_work(again.events)}, expected {ids_by_work(rest)}"
    return got


def test_two_shards_stream_page_and_wait(cluster):
    two_shards(cluster)
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    shard_of = lambda wid: 1 if wid.startswith("b") else 0  # noqa: E731

    run_one(s.url, "a1")
    submit(s.url, {"id": "a-open", "payload": 1, "queue": "q-open"})
    # Shard 1: three finished works (seqs 3, 6, 9 of its log).
    for i, seq in ((1, 3), (2, 6), (3, 9)):
        shard1_row(cluster, "workd_done", "a1", f"b{i}", [seq - 2, seq], created=i * 10)
        shard1_completed(cluster, f"b{i}", seq)
    run_one(s.url, "a2")

    # From the start (the rings of this node), then again after a restart
    # (every event read back from the table): both shards' events, each id a
    # cursor, and a resume from each id gives exactly the events after it.
    got = from_start_and_resumed(s.url, shard_of, ["a1", "a2", "b1", "b2", "b3"])
    s.stop()
    cluster.restart_server(s)
    wait_leader(s.url)
    again = from_start_and_resumed(s.url, shard_of, ["a1", "a2", "b1", "b2", "b3"])
    last = again[-1]["id"]
    assert last == got[-1]["id"], f"the last id is the same from the table: {last}, {got[-1]}"

    # Live: the stream starts at the last ids and gets shard 1's notified
    # record and shard 0's commit.
    # (Shard 0's log has gone on since a2: the new term.)
    live = SSEClient(s.url + "/results")
    wait_until(lambda: live.last_event_id, 5, what="a live stream's ready id")
    ready = [int(x) for x in live.last_event_id.split(".")]
    assert ready[1] == 9 and ready[0] >= int(last.split(".")[0]), \
        f"a live stream starts after {last} or later in shard 0, at 9 in shard 1: {ready}"
    shard1_completed(cluster, "b4", 12)
    ev = live.wait_for(lambda e: e["data"]["id"] == "b4")
    assert ev["id"] == f"{ready[0]}.12", f"b4's id should be {ready[0]}.12: {ev}"
    run_one(s.url, "a3")
    ev = live.wait_for(lambda e: e["data"]["id"] == "a3")
    assert ev["id"].endswith(".12") and int(ev["id"].split(".")[0]) == ev["data"]["seq"], ev
    live.close()

    # A work's own stream follows its shard: its history from shard 1's log
    # (the other component as it started).
    with SSEClient(s.url + "/work/b2/stream") as own:
        own.done.wait(10)
        assert [(e["data"]["id"], e["id"]) for e in own.events] == [("b2", "0.6")], \
            f"b2's stream should be its completion at 0.6 and end: {ids_by_work(own.events)}"

    # ?wait on a shard-1 work ends with its finish in shard 1's log.
    shard1_row(cluster, "workd_open", "a-open", "b5", [13], created=50)
    t0 = time.monotonic()
    waiter = []
    th = threading.Thread(target=lambda: waiter.append(
        http("GET", f"{s.url}/work/b5?wait=30", timeout=60)))
    th.start()
    wait_until(lambda: "workd_get_waits_total 1\n" in http("GET", s.url + "/metrics").text, 10,
               what="GET /work/b5?wait to be parked")
    shard1_completed(cluster, "b5", 15)
    th.join(40)
    took = time.monotonic() - t0
    assert waiter and waiter[0].status == 200 and took < 15, \
        f"GET /work/b5?wait=30 should end at b5's finish in shard 1, took {took:.1f}s"

    # Listing pages across the shards, each work once; the cursor is a string.
    seen, before, pages = [], None, 0
    while True:
        q = "?limit=2" + (f"&before={before}" if before else "")
        page = expect(http("GET", s.url + "/work" + q), 200, "GET /work" + q).json()
        seen += [w["id"] for w in page["items"]]
        before = page["next_before"]
        pages += 1
        if before is None:
            break
        assert isinstance(before, str) and len(before.split(".")) == 2, \
            f"next_before of two shards is a cursor: {before!r}"
        assert pages < 10, f"paging does not end: {seen}"
    assert sorted(seen) == ["a-open", "a1", "a2", "a3", "b1", "b2", "b3", "b5"], \
        f"every work once across pages: {seen}"

    # A cursor of more shards than the cluster's is refused.
    r = http("GET", s.url + "/results", headers={"Last-Event-ID": "1.2.3"})
    assert r.status == 400 and "invalid-cursor" in r.text, f"1.2.3 of two shards: {r.status} {r.text}"

    # The listener reads shard 1's leader when its term is announced.
    cluster.psql("INSERT INTO workd_shards (shard, term, url, since)"
                 " VALUES (1, 7, 'http://shard-one:1', now())")
    cluster.psql("SELECT pg_notify('workd_leader', '1:7')")
    wait_until(lambda: "leader of shard 1 is http://shard-one:1 (term 7)" in s.log_text(), 5,
               what="the listener to log shard 1's leader")


if __name__ == "__main__":
    run_tests(globals())
