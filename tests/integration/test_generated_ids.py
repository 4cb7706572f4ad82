"""Ids workd makes itself (a schedule's tick, a batch's callback) against
hostile and unlucky ids, at three depths:

1. the namespace: workd's ids hold '~', which no client or SQL id may hold, so
   a client that squats the next ticks under their old form runs nothing of
   the schedule's and stops no leader;
2. the screen: a tick whose id is taken anyway (a row restored by hand) is
   recorded as skipped (`duplicate-id`), never written a second time;
3. isolation: a request whose append the database refuses (here a rule the
   leader does not know of) stops the leader at most twice, then is refused
   (`409 append-refused`) while everything else goes on, including requests
   that were in the refused appends with it and SQL submissions.
"""

import http.client as hc
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, events_of, expect, submit  # noqa: E402

FAST = ["--election-interval", "100ms"]


def step_downs(url):
    for line in http("GET", url + "/metrics").text.splitlines():
        if line.startswith("workd_step_downs_total "):
            return int(float(line.split()[1]))
    raise AssertionError("no workd_step_downs_total in /metrics")


def every_second(url, name):
    expect(http("PUT", f"{url}/schedules/{name}",
                {"cron": "* * * * * *", "timezone": "UTC",
                 "work": {"queue": "ticks", "payload": {"tick": True}}, "overlap": "allow"},
                JSON), 200,
           f"PUT /schedules/{name}")
    return expect(http("GET", f"{url}/schedules/{name}"), 200, "GET schedule").json()


def tick_time(t):
    """A tick's time as its work id writes it (to the second)."""
    return t.replace(".000Z", "Z")


def ticks_of(cluster, name):
    return [e["data"] for e in events_of(cluster, ["tick"]) if e["data"]["schedule"] == name]


def test_a_client_cannot_take_a_ticks_id(cluster):
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    sched = every_second(s.url, "nightly")
    old_form = [f"nightly@{tick_time(t)}" for t in sched["next"]]  # a tick's id before '~'
    new_form = [t.replace("@", "~") for t in old_form]
    r = http("POST", s.url + "/work", [{"id": i, "payload": 1} for i in new_form], JSON)
    assert r.status == 400 and "'id'" in r.json()["detail"], (r.status, r.text)
    r = http("POST", s.url + "/work", [{"id": i, "payload": 1} for i in old_form], JSON)
    assert r.status == 202, (r.status, r.text)  # an ordinary id now, free to use
    before = step_downs(s.url)
    wait_until(lambda: len([t for t in ticks_of(cluster, "nightly") if t["work_id"]]) >= 3, 15,
               what="three ticks of the schedule")
    assert step_downs(s.url) == before, s.log_tail(20)
    fired = [t["work_id"] for t in ticks_of(cluster, "nightly") if t["work_id"]]
    assert all("~" in f for f in fired), fired
    assert all(t["skipped"] is None for t in ticks_of(cluster, "nightly")), ticks_of(cluster, "nightly")
    # A tick's work is readable and cancellable under its id.
    w = expect(http("GET", f"{s.url}/work/{fired[0]}"), 200, "GET tick work").json()
    assert w["id"] == fired[0] and w["queue"] == "ticks", w
    # And SQL submissions cannot take it either.
    r = http("POST", s.url + "/work", {"id": "x~y", "payload": 1}, JSON)
    assert r.status == 400, r.text


def test_a_taken_tick_id_is_skipped_not_written_twice(cluster):
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    wid = submit(s.url, {"id": "template", "payload": 1})["id"]
    expect(http("DELETE", f"{s.url}/work/{wid}"), 200, "cancel")  # finished: in workd_done
    sched = every_second(s.url, "restored")
    # An operator restores rows by hand: finished work under the next tick's ids.
    for t in sched["next"][1:4]:
        tick_id = f"restored~{tick_time(t)}"
        cluster.psql("INSERT INTO workd_done SELECT (jsonb_populate_record(r, "
                     f"jsonb_build_object('id', '{tick_id}'))).* FROM workd_done r "
                     "WHERE r.id = 'template'")
    before = step_downs(s.url)
    wait_until(lambda: len([t for t in ticks_of(cluster, "restored")
                            if t["skipped"] == "duplicate-id"]) >= 3, 20,
               what="the three taken ticks to be recorded as skipped")
    assert step_downs(s.url) == before, s.log_tail(20)
    accepted = [e["work_id"] for e in events_of(cluster, ["accepted"])
                if e["work_id"].startswith("restored~")]
    assert len(accepted) == len(set(accepted)), accepted
    for t in sched["next"][1:4]:
        assert f"restored~{tick_time(t)}" not in accepted, (t, accepted)


def test_a_batch_reopened_with_a_callback_needs_its_callback_id_free(cluster):
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    body = {"items": [{"id": "m1", "payload": 1}],
            "batch": {"id": "b1", "callback": {"payload": {"done": True}}}}
    expect(http("POST", s.url + "/work", body, JSON), 202, "open the batch")
    expect(http("DELETE", f"{s.url}/work/m1"), 200, "finish its member")
    wait_until(lambda: http("GET", f"{s.url}/work/b1~callback").status == 200, 10,
               what="the batch's callback")
    body["items"] = [{"id": "m2", "payload": 2}]
    r = http("POST", s.url + "/work", body, JSON)
    assert r.status == 409 and r.json()["type"].endswith("batch-callback-exists"), r.text
    assert http("GET", f"{s.url}/work/m2").status == 404, "nothing of the refused request"
    # Without a callback the id may open a batch again.
    del body["batch"]["callback"]
    expect(http("POST", s.url + "/work", body, JSON), 202, "reopen without a callback")


# A rule the leader does not know of: the database refuses this one id.
REFUSE_POISON = """
    CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.id = 'poison' THEN RAISE EXCEPTION 'no poison here'; END IF;
      RETURN NEW;
    END $$;
    CREATE TRIGGER refuse_poison BEFORE INSERT ON workd_open
      FOR EACH ROW EXECUTE FUNCTION refuse_poison();"""


def test_an_item_the_database_refuses_stops_the_leader_at_most_twice(cluster):
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    cluster.psql(REFUSE_POISON)
    before = step_downs(s.url)
    answers = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        r = http("POST", s.url + "/work", {"id": "poison", "payload": 1}, JSON, timeout=30)
        answers.append(r.status)
        if r.status == 409:
            assert r.json()["type"].endswith("append-refused"), r.text
            break
        assert r.status == 503, (r.status, r.text)
        wait_leader(s.url)
    assert answers[-1] == 409, answers
    assert step_downs(s.url) - before <= 2, (answers, s.log_tail(30))
    # Everything else goes on, on the same leader.
    after = step_downs(s.url)
    ids = [submit(s.url, {"payload": i})["id"] for i in range(5)]
    assert step_downs(s.url) == after
    assert all(http("GET", f"{s.url}/work/{i}").status == 200 for i in ids)
    assert "refused twice" in s.log_text(), s.log_tail(20)
    assert not [e for e in events_of(cluster, ["accepted"]) if e["work_id"] == "poison"]



def test_requests_refused_with_the_culprit_are_not_isolated(cluster):
    """Two requests in one round, one of them the culprit: each is decided
    alone the next time it comes, and only the culprit is isolated. A request
    holding the culprit and another item is refused as a whole, the other
    item alone is not."""
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    cluster.psql(REFUSE_POISON)
    final = {}

    def send(wid):
        while True:
            r = http("POST", s.url + "/work", {"id": wid, "payload": 1}, JSON, timeout=30)
            if r.status != 503:
                final[wid] = (r.status, r.text)
                return
            wait_leader(s.url)
    threads = [threading.Thread(target=send, args=(w,)) for w in ("poison", "innocent")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert final["innocent"][0] == 202, final
    assert final["poison"][0] == 409 and "append-refused" in final["poison"][1], final
    for _ in range(2):
        r = http("POST", s.url + "/work", [{"id": "mate", "payload": 1},
                                           {"id": "poison", "payload": 1}], JSON, timeout=30)
        assert r.status in (503, 409), r.text
        wait_leader(s.url)
    r = http("POST", s.url + "/work", {"id": "mate", "payload": 1}, JSON)
    assert r.status == 202, r.text
    assert get_status(s.url, "innocent") == 200 and get_status(s.url, "mate") == 200


def test_a_sql_submission_refused_by_the_database_stays_in_the_inbox(cluster):
    """An application committed it: it is never dropped, and the other
    entries read with it are taken."""
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    cluster.psql(REFUSE_POISON)
    cluster.psql("SELECT workd.submit('1'::jsonb, 'poison'); "
                 "SELECT workd.submit('2'::jsonb, 'innocent-sql');")
    wait_until(lambda: get_status(s.url, "innocent-sql") == 200, 30,
               what="the innocent SQL submission", ignore=(OSError,))
    wait_until(lambda: "refused twice" in s.log_text(), 30, what="the culprit isolated")
    assert cluster.psql("SELECT id FROM workd_inbox") == "poison"
    before = step_downs(s.url)
    submit(s.url, {"id": "after", "payload": 1})
    assert step_downs(s.url) == before


def test_jobs_with_ids_workd_made_take_progress_and_filters(cluster):
    s = cluster.start_server("s1", extra_args=FAST)
    wait_leader(s.url)
    every_second(s.url, "t")
    submit(s.url, {"id": "plain", "payload": 1, "queue": "ticks"})
    jobs = []

    def got():
        r = http("POST", s.url + "/workers/w1/pull",
                 {"max": 5, "wait": 1, "queues": ["ticks"], "instance": "i1"}, JSON)
        jobs.extend(r.json()["jobs"])
        return any("~" in j["id"] for j in jobs) and any(j["id"] == "plain" for j in jobs)
    wait_until(got, 15, what="a tick's job and a plain one")
    r = http("POST", s.url + "/workers/w1/progress", {"instance": "i1", "progress": [
        {"id": j["id"], "attempt": j["attempt"], "fraction": 0.5} for j in jobs]}, JSON)
    assert r.status == 200 and all(x["accepted"] for x in r.json()["results"]), r.text
    tick = next(j["id"] for j in jobs if "~" in j["id"])
    u = urlparse(s.url)
    c = hc.HTTPConnection(u.hostname, u.port, timeout=5)
    c.request("GET", f"/results?work_id={tick}")
    assert c.getresponse().status == 200
    c.close()


def get_status(url, wid):
    return http("GET", f"{url}/work/{wid}").status

if __name__ == "__main__":
    run_tests(globals())
