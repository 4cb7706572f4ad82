"""Schedules across failover: a schedule that fires every second for 30 s,
while the leader is killed three times, runs every tick of that window exactly
once (no gap, no double), as the event log shows; and what the API shows of a
schedule (next fire times, last run, pause, resume, delete)."""

import signal
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import (JSON, completions_by_id, events_of, expect, leader_of,  # noqa: E402
                   wait_new_leader)

FAST = ["--election-interval", "100ms", "--worker-timeout", "2s", "--lease-grace", "1s"]
WINDOW_S = 30
KILLS = 3


def put_schedule(url, name, body, status=200):
    r = http("PUT", f"{url}/schedules/{name}", body, JSON)
    return expect(r, status, f"PUT /schedules/{name}").json()


def test_every_tick_once_across_three_leader_kills(cluster):
    servers = {}
    for name in ("a", "b"):
        p = cluster.start_server(name, extra_args=FAST)
        wait_leader(p.url)
        servers[p.url] = p
    urls = list(servers)
    cluster.start_worker("w", ",".join(urls), ["--noop", "--concurrency", "4"])
    s = put_schedule(urls[0], "every-second", {
        "cron": "* * * * * *", "timezone": "Europe/Berlin",
        "work": {"queue": "ticks", "payload": {"from": "schedule"}, "timeout": 30},
        "overlap": "allow", "catch_up": "all", "catch_up_max": 100})
    assert len(s["next"]) == 5 and s["paused"] is False, f"the schedule as set: {s}"
    t0 = time.monotonic()
    for k in range(1, KILLS + 1):
        # A declared window: WINDOW_S of ticks, the kills spread evenly over it.
        time.sleep(max(0.0, t0 + k * WINDOW_S / (KILLS + 1) - time.monotonic()))
        leader = leader_of(urls)
        assert leader, "a leader must be known before each kill"
        servers[leader].kill(signal.SIGKILL)
        wait_new_leader(urls, not_url=leader, timeout=10)
        cluster.restart_server(servers[leader])
    time.sleep(max(0.0, t0 + WINDOW_S - time.monotonic()))  # the rest of the window
    paused = expect(http("POST", f"{urls[1]}/schedules/every-second/pause"), 200, "pause").json()
    assert paused["paused"] is True and paused["next"] == [], f"a paused schedule: {paused}"

    ticks = [e["data"] for e in events_of(cluster, ["tick"])
             if e["data"]["schedule"] == "every-second"]
    times = [t["tick"] for t in ticks]
    doubles = [t for t, n in Counter(times).items() if n > 1]
    assert not doubles, f"ticks recorded twice: {doubles}"
    assert times == sorted(times), "ticks must be recorded in order"
    gaps = [(a, b) for a, b in zip(times, times[1:]) if b - a != 1000]
    assert not gaps, f"ticks missing between these (ms): {gaps}"
    skipped = [t for t in ticks if t["work_id"] is None]
    assert not skipped, f"ticks that did not run (catch-up 'all', overlap 'allow'): {skipped}"
    assert len(times) >= WINDOW_S - 3, f"only {len(times)} ticks in a {WINDOW_S} s window"
    fired = [t["work_id"] for t in ticks]
    accepted = Counter(e["work_id"] for e in events_of(cluster, ["accepted"])
                       if e["work_id"].startswith("every-second~"))
    assert set(accepted) == set(fired) and set(accepted.values()) == {1}, \
        f"each tick's work accepted once: {[(k, v) for k, v in accepted.items() if v != 1]}"
    terms = {e["term"] for e in events_of(cluster, ["tick"])}
    assert len(terms) >= KILLS + 1, f"ticks should come from {KILLS + 1} terms, not {terms}"

    def all_ran():
        done = completions_by_id(cluster)
        return all(done.get(i) == 1 for i in fired)
    wait_until(all_ran, 30, what="every tick's work to complete")
    counts = completions_by_id(cluster)
    assert all(counts[i] == 1 for i in fired), "every tick's work completes exactly once"

    one = expect(http("GET", f"{urls[0]}/schedules/every-second"), 200, "GET schedule").json()
    assert one["last_run"]["id"] == fired[-1], f"last run: {one['last_run']} vs {fired[-1]}"
    listed = expect(http("GET", f"{urls[1]}/schedules"), 200, "GET /schedules").json()
    assert [x["name"] for x in listed["schedules"]] == ["every-second"], listed


def test_schedule_api(cluster):
    a = cluster.start_server("a", extra_args=FAST)
    wait_leader(a.url)
    body = {"cron": "30 2 * * *", "timezone": "America/New_York",
            "work": {"queue": "nightly", "payload": 1, "priority": 5, "max_attempts": 2}}
    s = put_schedule(a.url, "nightly", body)
    assert s["timezone"] == "America/New_York" and s["catch_up"] == "last", s
    assert s["overlap"] == "skip" and s["work"]["priority"] == 5, s
    assert all(t.endswith(("06:30:00.000Z", "07:30:00.000Z")) for t in s["next"]), \
        f"02:30 in New York is 06:30 or 07:30 UTC: {s['next']}"
    assert expect(http("GET", f"{a.url}/schedules/nightly"), 200, "GET").json()["last_run"] is None
    for bad, what in (({**body, "cron": "61 * * * *"}, "invalid-cron"),
                      ({**body, "timezone": "Mars/Olympus"}, "invalid-timezone"),
                      ({**body, "catch_up": "some"}, "invalid-field"),
                      ({**body, "work": {"payload": 1, "id": "x"}}, "invalid-field")):
        r = expect(http("PUT", f"{a.url}/schedules/nightly", bad, JSON), 400, f"PUT {bad}")
        assert r.json()["type"].endswith(what), r.json()
    assert expect(http("POST", f"{a.url}/schedules/nightly/pause"), 200, "pause").json()["paused"]
    resumed = expect(http("POST", f"{a.url}/schedules/nightly/resume"), 200, "resume").json()
    assert resumed["paused"] is False and len(resumed["next"]) == 5, resumed
    expect(http("POST", f"{a.url}/schedules/nope/pause"), 404, "pause of an unknown schedule")
    expect(http("DELETE", f"{a.url}/schedules/nightly"), 204, "DELETE")
    expect(http("GET", f"{a.url}/schedules/nightly"), 404, "GET after DELETE")
    expect(http("DELETE", f"{a.url}/schedules/nightly"), 404, "DELETE again")
    types = [e["type"] for e in events_of(cluster) if e["type"].startswith("schedule")]
    assert types == ["schedule_set"] * 3 + ["schedule_deleted"], types


if __name__ == "__main__":
    run_tests(globals())
