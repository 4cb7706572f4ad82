"""Readers of a cluster of two shards: every node follows each shard's log.

Two nodes of a cluster made with --shards 2; work finishes in both shards.
/results ids are cursors "<shard 0's seq>.<shard 1's seq>" on the node that
leads (its managers hand their commits to its hub) and on the other (its
listener reads each shard's log on NOTIFY "<seq>" and "1:<seq>"); a resume
from any id has no gap and no repeat, also after a restart, when every event
is read back from the table; a work's own stream and GET /work/{id}?wait
follow the work's shard; GET /work pages across both shards; a cursor of
more shards than the cluster's is refused. When one shard's leader is
killed while results flow, a stream on the node that takes the shard over
goes on, and a stream of the killed node resumed there with its
Last-Event-ID, each without a gap or a repeat."""

import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_until  # noqa: E402
from workd import JSON, complete, expect, pull, submit  # noqa: E402

FAST = ["--election-interval", "100ms", "--shards", "2"]


def shard_of(queue, n=2):
    h = 2166136261
    for b in queue.encode("utf-8"):
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h % n


def queue_in(shard):
    return next(q for q in (f"q{i}" for i in range(100)) if shard_of(q) == shard)


Q = {0: queue_in(0), 1: queue_in(1)}


def run_one(url, work_id, shard):
    """Submits work_id to a queue of `shard` and completes it."""
    q = Q[shard]
    submit(url, {"id": work_id, "payload": 1, "queue": q})
    job = pull(url, f"wk{shard}", queues=[q], wait=5)[0]
    assert job["id"] == work_id, job
    complete(url, f"wk{shard}", job, {"ok": work_id})


def shard_of_work(work_id):
    return int(work_id[-1]) % 2  # the tests name works a0, b1, c0...


def ids_by_work(events):
    return [(e["data"]["id"], e["id"]) for e in events]


def check_cursors(events, start=(0, 0)):
    """Each id is a cursor of two seqs; its own shard's seq is the event's,
    after the one before (from start), and no component goes back."""
    prev = tuple(start)
    for e in events:
        parts = tuple(int(x) for x in e["id"].split("."))
        assert len(parts) == 2, f"an id of a two-shard cluster has two seqs: {e['id']}"
        s = shard_of_work(e["data"]["id"])
        assert parts[s] == e["data"]["seq"] > prev[s], \
            f"{e['data']['id']}'s id {e['id']} should hold its seq {e['data']['seq']} at {s}, " \
            f"past {prev}"
        assert parts[0] >= prev[0] and parts[1] >= prev[1], f"ids went back: {prev} then {e['id']}"
        prev = parts


def per_shard(events):
    """The works of the events, per shard, in order: what a stream promises
    (the shards' events may interleave differently from one read to another)."""
    return {s: [e["data"]["id"] for e in events if shard_of_work(e["data"]["id"]) == s]
            for s in (0, 1)}


def from_start_and_resumed(url, want):
    """The events of /results?after=0 (the works `want`, each once), checked
    as cursors; and a resume from each of their ids gives exactly the rest,
    each shard's in order."""
    with SSEClient(url + "/results?after=0") as all_:
        all_.wait_count(len(want))
        time.sleep(0.3)  # a declared window: nothing more may come
        got = list(all_.events)
    assert sorted(e["data"]["id"] for e in got) == sorted(want), \
        f"{url}: after=0 should give {want} once each: {ids_by_work(got)}"
    check_cursors(got)
    for k, e in enumerate(got):
        with SSEClient(url + "/results", last_event_id=e["id"]) as again:
            rest = got[k + 1:]
            if rest:
                again.wait_count(len(rest))
            time.sleep(0.2)  # a declared window: no repeat may follow
            assert per_shard(again.events) == per_shard(rest), \
                f"resumed after {e['id']}: {ids_by_work(again.events)}, expected {ids_by_work(rest)}"
            check_cursors(again.events, [int(x) for x in e["id"].split(".")])
    return got


def test_two_shards_stream_page_and_wait(cluster):
    a = cluster.start_server("a", extra_args=FAST)
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_shards") == "2", 15,
               what="both shards to elect a leader")
    b = cluster.start_server("b", extra_args=FAST)
    # Live streams on both nodes: the leader's hub is fed by its managers,
    # the other's by its listener.
    live = {n.name: SSEClient(n.url + "/results") for n in (a, b)}
    for n in (a, b):
        wait_until(lambda: live[n.name].last_event_id, 5, what=f"{n.name}'s ready id")
        assert len(live[n.name].last_event_id.split(".")) == 2, live[n.name].last_event_id

    works = ["a0", "b1", "c1", "d0", "e1", "f0"]
    for w in works:
        run_one(a.url, w, shard_of_work(w))
    for n in (a, b):
        got = live[n.name].wait_count(len(works))
        assert sorted(e["data"]["id"] for e in got) == sorted(works), \
            f"{n.name}'s live stream: {ids_by_work(got)}"
        check_cursors(got)
        live[n.name].close()

    # From the rings, then after a restart from the table.
    got = from_start_and_resumed(b.url, works)
    b.stop()
    cluster.restart_server(b)
    again = from_start_and_resumed(b.url, works)
    assert again[-1]["id"] == got[-1]["id"], \
        f"the stream ends at the same place from the table: {again[-1]['id']}, {got[-1]['id']}"

    # A work's own stream follows its shard: after the restart, its history
    # from shard 1's log, the other component as it started.
    with SSEClient(b.url + "/work/c1/stream") as own:
        own.done.wait(10)
        c1 = next(e for e in got if e["data"]["id"] == "c1")
        assert ids_by_work(own.events) == [("c1", f"0.{c1['data']['seq']}")], \
            f"c1's stream should be its completion and end: {ids_by_work(own.events)}"

    # ?wait on a shard-1 work ends at its finish, on the node that does not
    # lead (its listener reads shard 1's log).
    submit(a.url, {"id": "g1", "payload": 1, "queue": Q[1]})
    waiter = []
    t0 = time.monotonic()
    th = threading.Thread(target=lambda: waiter.append(
        http("GET", f"{b.url}/work/g1?wait=30", timeout=60)))
    th.start()
    wait_until(lambda: "workd_get_waits_total 1\n" in http("GET", b.url + "/metrics").text, 10,
               what="GET /work/g1?wait to be parked")
    job = pull(a.url, "wk1", queues=[Q[1]], wait=5)[0]
    complete(a.url, "wk1", job, {"ok": "g1"})
    th.join(40)
    took = time.monotonic() - t0
    assert waiter and waiter[0].status == 200 and waiter[0].json()["status"] == "completed" \
        and took < 15, f"GET /work/g1?wait=30 should end at g1's finish in shard 1 ({took:.1f}s)"

    # Listing pages across the shards, each work once; the cursor is a string.
    seen, before, pages = [], None, 0
    while True:
        q = "?limit=2" + (f"&before={before}" if before else "")
        page = expect(http("GET", b.url + "/work" + q), 200, "GET /work" + q).json()
        seen += [w["id"] for w in page["items"]]
        before = page["next_before"]
        pages += 1
        if before is None:
            break
        assert isinstance(before, str) and len(before.split(".")) == 2, \
            f"next_before of two shards is a cursor: {before!r}"
        assert pages < 10, f"paging does not end: {seen}"
    assert sorted(seen) == sorted(works + ["g1"]), f"every work once across pages: {seen}"

    # A cursor of more shards than the cluster's is refused.
    r = http("GET", b.url + "/results", headers={"Last-Event-ID": "1.2.3"})
    assert r.status == 400 and "invalid-cursor" in r.text, f"1.2.3 of two shards: {r.status} {r.text}"

    # The listener of the other node knows shard 1's leader.
    assert "leader of shard 1 is " + a.url in b.log_text(), b.log_tail()


def shard_leaders(cluster):
    """{shard: url} as workd_shards says."""
    rows = cluster.psql("SELECT shard, url FROM workd_shards ORDER BY shard")
    return {int(r.split("|")[0]): r.split("|")[1] for r in rows.splitlines() if r}


class Submitter:
    """Submits works to `url` one after another, alternately to a queue of
    each shard (ids ending in the shard's digit), each until it is accepted
    (the same id again after any other answer, as the API asks)."""

    def __init__(self, url, prefix):
        self.url, self.prefix, self.accepted = url, prefix, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        i = 0
        while not self.stop.is_set():
            work_id = f"{self.prefix}{i}-{i % 2}"
            while not self.stop.is_set():
                try:
                    r = http("POST", self.url + "/work",
                             {"id": work_id, "payload": i, "queue": Q[i % 2]}, JSON, timeout=15)
                    if r.status == 202:
                        self.accepted.append(work_id)
                        break
                except OSError:
                    pass
                time.sleep(0.05)
            i += 1
            time.sleep(0.02)

    def finish(self):
        self.stop.set()
        self.thread.join(30)
        return list(self.accepted)


def seen_once(events, want, what):
    """Every work of `want` is in events exactly once, and nothing else."""
    got = [e["data"]["id"] for e in events]
    twice = sorted({w for w in got if got.count(w) > 1})
    assert not twice, f"{what}: results seen more than once: {twice[:10]}"
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    assert not missing and not extra, \
        f"{what}: missing {missing[:10]} ({len(missing)}), unexpected {extra[:10]}"


def test_results_resumed_after_a_shard_leaders_kill(cluster):
    """Two nodes, a shard each; results flow in both shards while the
    leader of shard 1 is killed -9. The other node's stream goes on across
    its takeover of shard 1 (its shard-1 results came from its listener,
    now from its own manager), and the killed node's stream, resumed on
    the survivor with its Last-Event-ID, goes on from where it was: every
    result once, each shard's in seq order."""
    args = FAST + ["--worker-timeout", "3s", "--lease-grace", "2s"]
    a = cluster.start_server("a", extra_args=args)
    b = cluster.start_server("b", extra_args=args)
    nodes = {a.url: a, b.url: b}
    wait_until(lambda: shard_leaders(cluster), 40,
               until=lambda got: len(got) == 2 and len(set(got.values())) == 2,
               what=lambda: f"the two shards to spread over the two nodes: "
                            f"{shard_leaders(cluster)}")
    victim = nodes[shard_leaders(cluster)[1]]
    survivor = b if victim is a else a
    on = {n.name: SSEClient(n.url + "/results") for n in (victim, survivor)}
    for n in (victim, survivor):
        wait_until(lambda: on[n.name].last_event_id, 5, what=f"{n.name}'s ready id")
    start = {n: [int(x) for x in c.last_event_id.split(".")] for n, c in on.items()}
    cluster.start_worker("w", survivor.url, ["--demo", "--concurrency", "4"])

    load = Submitter(survivor.url, "k")
    wait_until(lambda: len(on[victim.name].events), 15, until=lambda n: n >= 20,
               what="results of 20 works on the stream of shard 1's leader")
    victim.kill()
    assert on[victim.name].done.wait(5), "the killed node's stream should end"
    before = list(on[victim.name].events)
    resumed = SSEClient(survivor.url + "/results", last_event_id=on[victim.name].last_event_id)
    wait_until(lambda: shard_leaders(cluster).get(1), 15, until=lambda u: u == survivor.url,
               what=f"{survivor.name} to take shard 1 over")
    taken = len(load.accepted)
    wait_until(lambda: len(load.accepted), 30, until=lambda n: n >= taken + 20,
               what="20 more works accepted after the takeover")
    works = load.finish()

    for what, stream, earlier in (("the survivor's stream", on[survivor.name], []),
                                  ("the killed node's stream, resumed", resumed, before)):
        wait_until(lambda: {e["data"]["id"] for e in earlier + stream.events}, 60,
                   until=lambda got: got >= set(works),
                   what=lambda: f"every result on {what} (missing "
                   f"{sorted(set(works) - {e['data']['id'] for e in earlier + stream.events})[:10]})")
    time.sleep(0.3)  # a declared window: no repeat may follow
    seen_once(on[survivor.name].events, works, "the survivor's stream")
    check_cursors(on[survivor.name].events, start[survivor.name])
    seen_once(before + resumed.events, works, "the killed node's stream and its resumption")
    check_cursors(before, start[victim.name])
    check_cursors(resumed.events, [int(x) for x in on[victim.name].last_event_id.split(".")])
    for c in (*on.values(), resumed):
        c.close()


if __name__ == "__main__":
    run_tests(globals())
