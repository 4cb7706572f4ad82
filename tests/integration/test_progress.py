"""Progress and partial output: an --exec job's progress lines reach result
streams in order, a stream that reconnects with Last-Event-ID resumes without
a gap or a repeat, GET /work/{id} shows the last progress, a work's stream
(`curl -N .../work/ID/stream`, as README runs it) ends after the work's end,
and a job that floods progress is limited (429, 413) without holding up anyone
else."""

import json
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, events_of, expect, get_work, heartbeat, pull, submit,  # noqa: E402
                   wait_status)

FAST = ["--election-interval", "100ms", "--worker-timeout", "3s", "--heartbeat-interval", "500ms"]


def start_server(cluster, extra=()):
    s = cluster.start_server("s1", extra_args=FAST + list(extra))
    wait_leader(s.url)
    return s


def script(cluster, name, body):
    path = cluster.tmp / name
    path.write_text("#!/bin/sh\n" + textwrap.dedent(body).lstrip("\n"))
    path.chmod(0o755)
    return str(path)


def progress(url, job, worker="wk", status=200, **fields):
    r = http("POST", f"{url}/work/{job['id']}/attempts/{job['attempt']}/progress",
             {"worker_id": worker, "instance": "i1", **fields}, JSON)
    return expect(r, status, f"progress of {job['id']} {fields}")


def of_work(events, work_id, kind=None):
    return [e for e in events if e["data"]["id"] == work_id and (kind is None or e["event"] == kind)]


def test_exec_job_progress_reaches_streams_in_order(cluster):
    srv = start_server(cluster)
    job = script(cluster, "hundred.sh", """
        i=1
        while [ $i -le 100 ]; do
            printf '{"fraction": %s, "message": "line %d", "output": "line %d\\\\n"}\\n' \\
                "$(awk "BEGIN{print $i/100}")" $i $i >&$WORKD_PROGRESS_FD
            i=$((i + 1))
            sleep 0.01
        done
        echo done
    """)
    results = SSEClient(srv.url + "/results?progress=true")
    plain = SSEClient(srv.url + "/results")
    try:
        w = cluster.start_worker("wk1", srv.url, ["--exec", job, "--progress-interval", "50ms"])
        submit(srv.url, {"id": "hundred", "payload": 1})
        done = results.wait_for(lambda e: e["event"] == "completed"
                                and e["data"]["id"] == "hundred", 60)
        events = of_work(results.events, "hundred")
        prog = [e for e in events if e["event"] == "progress"]
        assert prog, f"no progress event reached /results?progress=true: {events}"
        text = "".join(e["data"].get("output", "") for e in prog)
        expected = "".join(f"line {i}\n" for i in range(1, 101))
        assert text == expected, f"the output chunks, joined, must be the 100 lines in order: {text!r}"
        seqs = [int(e["id"]) for e in events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"ids must increase: {seqs}"
        assert events[-1] is done, "the completion must come after every progress event"
        fractions = [e["data"]["fraction"] for e in prog]
        assert fractions == sorted(fractions) and fractions[-1] == 1, \
            f"fractions must grow to 1: {fractions}"
        assert prog[-1]["data"]["message"] == "line 100", prog[-1]
        # Without ?progress=true a stream carries results only.
        plain.wait_for(lambda e: e["data"]["id"] == "hundred", 10)
        assert not [e for e in plain.events if e["event"] == "progress"], \
            f"/results without progress=true must not carry progress: {plain.events}"
        # GET /work/{id} shows the last progress.
        got = get_work(srv.url, "hundred")
        assert got["progress"]["fraction"] == 1 and got["progress"]["message"] == "line 100", got
        assert got["progress"]["seq"] == int(prog[-1]["id"]), got
        # The work's own stream replays its history from the start, progress included.
        with SSEClient(srv.url + "/work/hundred/stream") as s:
            s.wait_for(lambda e: e["event"] == "completed", 20)
            assert [e["id"] for e in s.events] == [e["id"] for e in events], \
                "/work/{id}/stream must replay the same events as /results?progress=true"
        assert w.alive(), w.log_tail()
    finally:
        results.close()
        plain.close()


def test_reconnect_resumes_after_last_event_id(cluster):
    """Progress is events in the log: a client that reconnects with the last id
    it saw gets every later event once, in order, from any point."""
    srv = start_server(cluster, ["--progress-rate", "1000"])
    submit(srv.url, {"id": "r1", "payload": 1})
    heartbeat(srv.url, "wk", capacity=1)
    job = pull(srv.url, "wk")[0]
    first = SSEClient(srv.url + "/work/r1/stream")
    for i in range(10):
        progress(srv.url, job, output=f"chunk {i};", fraction=i / 20)
    first.wait_count(10, 10)
    first.close()
    seen = list(first.events)
    last = seen[-1]["id"]
    for i in range(10, 20):  # while no client is connected
        progress(srv.url, job, output=f"chunk {i};", fraction=i / 20)
    second = SSEClient(srv.url + "/work/r1/stream", last_event_id=last)
    for i in range(20, 25):
        progress(srv.url, job, output=f"chunk {i};")
    expect(http("POST", f"{srv.url}/work/r1/attempts/{job['attempt']}/complete",
                {"worker_id": "wk", "instance": "i1", "result": "ok"}, JSON), 200, "complete")
    second.wait_for(lambda e: e["event"] == "completed", 20)
    second.close()
    both = seen + second.events
    text = "".join(e["data"].get("output", "") for e in both if e["event"] == "progress")
    assert text == "".join(f"chunk {i};" for i in range(25)), \
        f"a reconnect must resume after Last-Event-ID, no gap and no repeat: {text!r}"
    ids = [int(e["id"]) for e in both]
    assert ids == sorted(set(ids)), f"ids must increase across the reconnect: {ids}"
    # The last progress kept the fraction the attempt sent last, with a later message-less update.
    assert both[-2]["data"]["fraction"] == 19 / 20, both[-2]


def test_a_long_history_reads_whole_in_pages_and_from_its_start(cluster):
    """A work item's events are found through its row's history and its
    progress reports through workd_progress (the log is records of many
    events): 200 reports, read back a page at a time from GET
    /work/{id}/events and from the start of its stream, every one once, in
    order, after its work finished and while another job's events share its
    records."""
    srv = start_server(cluster, ["--progress-rate", "1000", "--progress-rate-worker", "1000",
                                 "--progress-rate-total", "2000"])
    submit(srv.url, {"id": "long", "payload": 1})
    submit(srv.url, {"id": "beside", "payload": 2})
    heartbeat(srv.url, "wk", capacity=2)
    jobs = {j["id"]: j for j in pull(srv.url, "wk", max_jobs=2)}
    for i in range(200):
        progress(srv.url, jobs["long"], output=f"{i};")
        if i % 10 == 0:
            progress(srv.url, jobs["beside"], output="x")
    for j in jobs.values():
        expect(http("POST", f"{srv.url}/work/{j['id']}/attempts/{j['attempt']}/complete",
                    {"worker_id": "wk", "instance": "i1", "result": "ok"}, JSON), 200, "complete")
    wait_status(srv.url, "long", "completed")
    got, after = [], 0
    while True:
        page = expect(http("GET", f"{srv.url}/work/long/events?limit=37&after={after}"), 200,
                      "a page of events").json()
        got += page["events"]
        if not page["next_after"]:
            break
        after = page["next_after"]
    types = [e["type"] for e in got]
    assert types == ["accepted", "started"] + ["progress"] * 200 + ["completed"], types
    assert "".join(e["data"]["output"] for e in got if e["type"] == "progress") == \
        "".join(f"{i};" for i in range(200))
    seqs = [e["seq"] for e in got]
    assert seqs == sorted(set(seqs)), "the events of one work must come once each, in order"
    with SSEClient(srv.url + "/work/long/stream") as stream:
        stream.wait_for(lambda e: e["event"] == "completed", 20)
        outs = [e["data"]["output"] for e in stream.events if e["event"] == "progress"]
    assert outs == [f"{i};" for i in range(200)], outs[:5]
    assert get_work(srv.url, "long")["progress"]["seq"] == seqs[-2]
    # Its row did not grow with its reports (each would rewrite a growing
    # row): they are found through workd_progress, a small row each.
    assert cluster.psql("SELECT cardinality(history) FROM workd_done WHERE id = 'long'") == "3"
    assert cluster.psql("SELECT count(*) FROM workd_progress WHERE work_id = 'long'") == "200"


def test_work_stream_ends_after_the_work_ends(cluster):
    """README's `curl -N .../work/ID/stream`: the work's history, then its end,
    then the stream ends; live, from the table, and for cancelled work."""
    srv = start_server(cluster)

    def curl(work_id):
        return subprocess.Popen(["curl", "-sS", "-N", f"{srv.url}/work/{work_id}/stream"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def ended(proc, work_id, last):
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
            raise AssertionError(f"the stream of {work_id} stayed open after its end:\n{out}")
        assert proc.returncode == 0, f"curl ended {proc.returncode}:\n{out}"
        events = re.findall(r"^event: (\w+)$", out, re.M)
        assert events[-1] == last, f"the stream of {work_id} must end on {last}: {events}"
        return events

    # Live: the stream is open before the work ends.
    submit(srv.url, {"id": "live", "payload": 1})
    heartbeat(srv.url, "wk", capacity=1)
    job = pull(srv.url, "wk")[0]
    live = curl("live")
    progress(srv.url, job, fraction=0.5)
    time.sleep(0.2)  # a declared window: the stream is open, following live
    assert live.poll() is None, "the stream ended before the work's end"
    expect(http("POST", f"{srv.url}/work/live/attempts/{job['attempt']}/complete",
                {"worker_id": "wk", "instance": "i1", "result": "ok"}, JSON), 200, "complete")
    assert ended(live, "live", "completed") == ["ready", "progress", "completed"]
    # After the end: its history, then the stream ends at once.
    assert ended(curl("live"), "live", "completed") == ["ready", "progress", "completed"]
    # /results filtered to that work is the results stream: it goes on.
    results = subprocess.Popen(["curl", "-sS", "-N", f"{srv.url}/results?work_id=live&after=0"],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    time.sleep(0.3)  # a declared window: the work's end is long sent; the stream stays
    assert results.poll() is None, f"/results?work_id= ended: {results.communicate()}"
    results.kill()
    results.communicate()
    # Cancelled work ends its stream too.
    submit(srv.url, {"id": "never", "payload": 1, "delay": 3600})
    waiting = curl("never")
    expect(http("DELETE", f"{srv.url}/work/never"), 200, "cancel")
    ended(waiting, "never", "cancelled")
    # Another work's end does not end a stream.
    other = curl("other")
    submit(srv.url, {"id": "other2", "payload": 1})
    job = pull(srv.url, "wk")[0]
    expect(http("POST", f"{srv.url}/work/other2/attempts/{job['attempt']}/complete",
                {"worker_id": "wk", "instance": "i1", "result": "ok"}, JSON), 200, "complete")
    wait_status(srv.url, "other2", "completed")
    time.sleep(0.3)  # a declared window: nothing may end the stream of "other"
    assert other.poll() is None, f"another work's end ended a stream: {other.communicate()}"
    other.kill()
    other.communicate()


def test_progress_is_checked_and_bounded(cluster):
    srv = start_server(cluster, ["--progress-rate", "5", "--progress-max-bytes", "4096"])
    submit(srv.url, {"id": "flood", "payload": 1})
    submit(srv.url, {"id": "calm", "payload": 2})
    heartbeat(srv.url, "wk", capacity=2)
    jobs = {j["id"]: j for j in pull(srv.url, "wk", max_jobs=2)}
    flood, calm = jobs["flood"], jobs["calm"]
    # Only the holder of the running attempt may report progress.
    r = progress(srv.url, flood, worker="other", status=409, message="x")
    assert r.json()["type"].endswith("/attempt-not-held"), r.text
    r = progress(srv.url, {**flood, "attempt": flood["attempt"] + 1}, status=409, message="x")
    assert r.json()["type"].endswith("/attempt-superseded"), r.text
    r = progress(srv.url, {"id": "nope", "attempt": 1}, status=404, message="x")
    r = progress(srv.url, flood, status=400, fraction=1.5)
    assert "fraction" in r.json()["detail"], r.text
    progress(srv.url, flood, status=400)  # nothing to say
    # Rate: a burst past --progress-rate gets 429, a problem saying why.
    codes = []
    for i in range(20):
        r = http("POST", f"{srv.url}/work/flood/attempts/{flood['attempt']}/progress",
                 {"worker_id": "wk", "instance": "i1", "message": f"m{i}"}, JSON)
        codes.append(r.status)
        if r.status == 429:
            assert r.headers.get("Content-Type") == "application/problem+json", r.headers
            assert r.json()["type"].endswith("/progress-rate-limited"), r.text
            assert r.headers.get("Retry-After"), "a 429 must say when to retry"
    assert 429 in codes and codes.count(200) <= 6, f"--progress-rate 5 must limit a burst: {codes}"
    # ... without touching another attempt's budget.
    progress(srv.url, calm, message="still here")
    # Size: past --progress-max-bytes of messages and output, 413.
    time.sleep(1.1)  # a declared delay: the rate bucket fills again, so 413 is about size
    progress(srv.url, calm, output="y" * 3000)
    r = progress(srv.url, calm, status=413, output="z" * 2000)
    assert r.json()["type"].endswith("/progress-too-large"), r.text
    # The results of both still go through.
    for j in (flood, calm):
        expect(http("POST", f"{srv.url}/work/{j['id']}/attempts/{j['attempt']}/complete",
                    {"worker_id": "wk", "instance": "i1", "result": j["id"]}, JSON), 200,
               f"complete {j['id']}")
        wait_status(srv.url, j["id"], "completed")


def test_a_worker_sends_the_progress_of_all_its_attempts_in_one_request(cluster):
    """POST /workers/{id}/progress: each update is taken or refused on its
    own, as the one-attempt route would, and the taken ones are events."""
    srv = start_server(cluster)
    for wid in ("a", "b"):
        submit(srv.url, {"id": wid, "payload": 1})
    heartbeat(srv.url, "wk", capacity=2)
    jobs = {j["id"]: j for j in pull(srv.url, "wk", max_jobs=2)}
    a, b = jobs["a"], jobs["b"]
    url = f"{srv.url}/workers/wk/progress"
    r = expect(http("POST", url, {"instance": "i1", "progress": [
        {"id": "a", "attempt": a["attempt"], "fraction": 0.5, "message": "half"},
        {"id": "b", "attempt": b["attempt"], "output": "chunk"},
        {"id": "b", "attempt": b["attempt"] + 1, "message": "stale"},
        {"id": "nope", "attempt": 1, "message": "x"}]}, JSON), 200, "a batch of progress")
    res = r.json()["results"]
    assert [x["accepted"] for x in res] == [True, True, False, False], r.text
    assert res[0]["seq"] < res[1]["seq"], r.text
    assert (res[2]["status"], res[2]["reason"]) == (409, "attempt-superseded"), r.text
    assert (res[3]["status"], res[3]["reason"]) == (404, "not-found"), r.text
    assert get_work(srv.url, "a")["progress"]["message"] == "half"
    # Another worker's name in the path holds neither attempt.
    r = expect(http("POST", f"{srv.url}/workers/other/progress",
                    {"progress": [{"id": "a", "attempt": a["attempt"], "message": "x"}]}, JSON),
               200, "progress for another's attempt")
    assert r.json()["results"][0]["reason"] == "attempt-not-held", r.text
    # A malformed update refuses the whole request, naming it.
    for body, what in (({"progress": []}, "at least one"),
                       ({"progress": [{"id": "a", "attempt": 1}]}, "progress[0]"),
                       ({"progress": [{"id": "a", "attempt": 1, "message": "x"},
                                      {"id": "a", "attempt": 0, "message": "x"}]}, "progress[1]"),
                       ({"progress": [{"id": "a", "attempt": 1, "fraction": 2}]}, "fraction"),
                       ({"progress": [{"id": "a", "attempt": 1, "colour": 2}]}, "colour")):
        r = expect(http("POST", url, body, JSON), 400, f"malformed progress {body}")
        assert what in r.json()["detail"], r.text
    r = expect(http("POST", url, {"progress": [{"id": "a", "attempt": 1, "message": "x"}] * 1001},
                    JSON), 413, "too many updates")
    assert "1001" in r.json()["detail"], r.text


def test_a_worker_holding_many_attempts_has_one_budget(cluster):
    """Each attempt's own rate is small, but a worker holding many attempts
    could multiply it (1,000 attempts made 4,150 durable events a second):
    a worker id has a rate over all its attempts, and the cluster one over
    all workers. Past either, updates are refused 429 and no event is
    written."""
    srv = start_server(cluster, ["--progress-rate-worker", "40", "--progress-rate-total", "60"])
    ids = [submit(srv.url, {"payload": i})["id"] for i in range(60)]
    heartbeat(srv.url, "greedy", capacity=60)
    jobs = pull(srv.url, "greedy", max_jobs=60)
    assert len(jobs) == 60, jobs
    before = len([e for e in events_of(cluster, ["progress"])])
    r = expect(http("POST", f"{srv.url}/workers/greedy/progress", {"instance": "i1", "progress": [
        {"id": j["id"], "attempt": j["attempt"], "message": "tick"} for j in jobs]}, JSON),
        200, "one update for each of 60 attempts")
    res = r.json()["results"]
    taken = [x for x in res if x["accepted"]]
    refused = [x for x in res if not x["accepted"]]
    assert 40 <= len(taken) <= 42, f"{len(taken)} taken of 60 with --progress-rate-worker 40"
    assert all((x["status"], x["reason"]) == (429, "progress-rate-limited") for x in refused), res
    assert len(events_of(cluster, ["progress"])) - before == len(taken)
    # Another worker still has room of its own, up to the cluster's rate.
    for i in range(30):
        submit(srv.url, {"id": f"other-{i}", "payload": i})
    heartbeat(srv.url, "modest", capacity=30, instance="i2")
    others = pull(srv.url, "modest", max_jobs=30, instance="i2")
    r = expect(http("POST", f"{srv.url}/workers/modest/progress", {"instance": "i2", "progress": [
        {"id": j["id"], "attempt": j["attempt"], "message": "tick"} for j in others]}, JSON),
        200, "another worker's updates")
    got = [x["accepted"] for x in r.json()["results"]]
    assert sum(got) >= 20, f"another worker's budget is its own: {got}"
    assert len(ids) == 60


def test_exec_job_flooding_progress_does_not_harm_others(cluster):
    srv = start_server(cluster, ["--progress-rate", "5"])
    flood = script(cluster, "job.sh", """
        read n
        if [ "$n" = 1 ]; then
            # As fast as it can: the worker merges, the server limits.
            yes '{"message": "flooding", "output": "x"}' | head -n 200000 >&$WORKD_PROGRESS_FD
            echo flooded
        else
            for i in 1 2 3 4 5; do
                printf '{"output": "calm %d;"}\\n' $i >&$WORKD_PROGRESS_FD
                sleep 0.3
            done
            echo calm
        fi
    """)
    with SSEClient(srv.url + "/results?progress=true") as results:
        cluster.start_worker("wk1", srv.url, ["--exec", flood, "--concurrency", "2",
                                              "--progress-interval", "20ms"])
        t0 = time.monotonic()
        submit(srv.url, {"id": "flood", "payload": 1})
        submit(srv.url, {"id": "calm", "payload": 2})
        for wid in ("flood", "calm"):
            results.wait_for(lambda e, w=wid: e["event"] == "completed" and e["data"]["id"] == w, 60)
        elapsed = time.monotonic() - t0
        calm = "".join(e["data"].get("output", "") for e in of_work(results.events, "calm", "progress"))
        assert calm == "calm 1;calm 2;calm 3;calm 4;calm 5;", \
            f"the calm job's progress must all arrive, in order, beside a flood: {calm!r}"
        n_flood = len(of_work(results.events, "flood", "progress"))
        # 5 a second, a burst of 5, and a final flush: the flood cannot pass that.
        assert 1 <= n_flood <= 5 * elapsed + 8, \
            f"{n_flood} progress events of the flooding job in {elapsed:.1f}s: not limited"
        assert get_work(srv.url, "flood")["result"] == "flooded"


if __name__ == "__main__":
    run_tests(globals())
