"""The Python library (clients/python, package `workd`) against a real
cluster: the client's calls and their errors, the results stream across a
server restart (nothing lost, nothing twice), a worker that reports progress,
fails and is retried, is cancelled, reports across a server restart and
stops gracefully on SIGTERM, the producer's trace context handed to the
handler, and `pip install` of the package with no package index. The
worker's exchange (its reports ride in its pulls) against a scripted server
(the verdicts, a lost answer, a server older than the exchange, no pull
coming) and against a real one (200 jobs, almost no report requests)."""

import atexit
import json
from email.utils import formatdate
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "lib"))
from harness import Skip, free_port, http, run_tests, wait_leader, wait_until  # noqa: E402
from scripted_stream import ScriptedStream  # noqa: E402
from hostile_server import (HostileServer, answer, drip, endless, endless_stream,  # noqa: E402
                            event_stream, json_answer, problem)

# The library under test, from the source tree (tests/lib/workd.py is the
# tests' own helper module of the same name: this package comes first).
sys.path.insert(0, str(REPO / "clients" / "python"))
import workd  # noqa: E402
from workd import Client, Fail, Unavailable, WorkdError, Worker  # noqa: E402

assert Path(workd.__file__).parent == REPO / "clients" / "python" / "workd", workd.__file__

FAST = ["--election-interval", "100ms", "--heartbeat-interval", "500ms",
        "--backoff-base", "100ms", "--backoff-max", "500ms", "--worker-timeout", "3s"]
ADMIN = "admin-token-0123456789abcdef"


def dead_url():
    """A URL where nothing listens."""
    return f"http://127.0.0.1:{free_port()}"


def start_server(cluster, name, extra=(), env=None):
    s = cluster.start_server(name, extra_args=FAST + list(extra), env=env)
    wait_leader(s.url)
    return s


def raw_work(url, work_id, token=None):
    """GET /work/{id} without the library, as a second opinion."""
    r = http("GET", f"{url}/work/{work_id}",
             headers={"Authorization": f"Bearer {token}"} if token else None)
    assert r.status == 200, f"GET /work/{work_id}: {r.status} {r.text[:300]}"
    return r.json()


def workers_at(url):
    r = http("GET", url + "/cluster")
    assert r.status == 200, f"GET /cluster: {r.status} {r.text[:300]}"
    return {w["id"]: w for w in r.json()["workers"]}


class Collector:
    """Iterates an EventStream on a thread of its own, keeping every event."""

    def __init__(self, stream):
        self.stream, self.events, self.error = stream, [], None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        try:
            for ev in self.stream:
                with self._lock:
                    self.events.append(ev)
        except Exception as e:  # noqa: BLE001 - shown by the test that waits
            self.error = e

    def ids(self):
        with self._lock:
            return [ev.work_id for ev in self.events]

    def wait_ids(self, ids, timeout=30):
        wanted = set(ids)
        wait_until(lambda: wanted <= set(self.ids()) or self.error, timeout,
                   what=lambda: f"{len(wanted)} results on the stream "
                                f"(have {len(wanted & set(self.ids()))}, error {self.error!r})")
        assert self.error is None, f"the stream failed: {self.error!r}"

    def close(self):
        self.stream.close()
        self._thread.join(10)
        assert not self._thread.is_alive(), "close() did not end the stream's iteration"


# ------------------------------------------------------------ the client

def test_client_submits_reads_and_manages(cluster):
    s = start_server(cluster, "s1", env={"WORKD_TOKENS": f"admin:{ADMIN}"})
    c = Client([dead_url(), s.url], token=ADMIN)  # the dead server is skipped

    one = c.submit({"n": 7}, id="py-one", queue="py", priority=5, timeout=30, max_attempts=2)
    assert one == {"id": "py-one", "status": "pending", "created": True}, one
    again = c.submit({"n": 7}, id="py-one", queue="py", priority=5, timeout=30, max_attempts=2)
    assert again["created"] is False, f"the same submission again must not create work: {again}"
    work = c.get("py-one")
    assert (work["queue"], work["priority"], work["max_attempts"], work["timeout_ms"]) == \
        ("py", 5, 2, 30000), f"the item's fields did not arrive as given: {work}"

    generated = c.submit("no id given")
    assert uuid.UUID(generated["id"]), generated

    many = c.submit_many([{"payload": i, "queue": "py"} for i in range(3)])
    assert [i["created"] for i in many["items"]] == [True] * 3, many
    batch = c.submit_many([{"payload": "b1"}, {"payload": "b2"}], batch={"id": "py-batch"})
    assert batch["batch"] == "py-batch", batch
    later = c.submit("later", id="py-later", delay=600)
    assert later["status"] in ("pending", "scheduled"), later
    assert c.get("py-later")["run_at"], "delay= did not set run_at"

    # Refusals carry the problem's fields.
    try:
        c.submit({"n": 8}, id="py-one")
        raise AssertionError("a different payload under an existing id was accepted")
    except WorkdError as e:
        assert (e.status, e.kind) == (409, "conflict"), f"{e.status} {e.kind}: {e.problem}"
        assert e.detail and e.title and e.type.endswith("/conflict"), e.problem
    try:
        c.get("py-nothing")
        raise AssertionError("an unknown work id was found")
    except WorkdError as e:
        assert (e.status, e.kind) == (404, "not-found"), e.problem
    try:
        Client(s.url).queues()  # no token
        raise AssertionError("a request without a token was answered")
    except WorkdError as e:
        assert (e.status, e.kind) == (401, "unauthorized"), e.problem
    t0 = time.monotonic()
    try:
        Client([dead_url(), dead_url()], retry_for=0.5).get("py-one")
        raise AssertionError("a client without a live server got an answer")
    except Unavailable as e:
        assert time.monotonic() - t0 < 5, "Unavailable came long after retry_for"
        assert e.status == 503 and e.cause is not None, e.problem

    # wait() returns the work as it is when the time runs out, and once it finished.
    t0 = time.monotonic()
    assert c.wait("py-one", timeout=0.5)["status"] == "pending"
    assert time.monotonic() - t0 < 5, "wait(timeout=0.5) took too long"
    assert c.cancel("py-one") == {"id": "py-one", "status": "cancelled"}
    assert c.wait("py-one", timeout=10)["status"] == "cancelled"
    assert raw_work(s.url, "py-one", ADMIN)["status"] == "cancelled"
    try:
        c.retry("py-one")
        raise AssertionError("cancelled work was retried")
    except WorkdError as e:
        assert (e.status, e.kind) == (409, "not-retryable"), e.problem
    page = c.list_work(queue="py", limit=2)
    assert len(page["items"]) == 2 and page["next_before"], page

    # Queues.
    assert c.pause_queue("py")["paused"] is True
    limits = c.set_queue_limits("py", max_running=3, rate={"limit": 10, "per": 1})
    assert (limits["paused"], limits["max_running"], limits["rate"]["limit"]) == (True, 3, 10), \
        limits
    assert c.resume_queue("py")["paused"] is False
    assert c.set_queue_limits("py", max_running=None)["max_running"] is None
    stats = {q["queue"]: q for q in c.queues()}
    assert stats["py"]["pending"] >= 3, stats.get("py")

    # Schedules.
    sch = c.put_schedule("py-nightly", "0 3 * * *", {"payload": {"report": True}, "queue": "py"},
                         timezone="Europe/Berlin", catch_up="none")
    assert (sch["name"], sch["timezone"], sch["catch_up"]) == \
        ("py-nightly", "Europe/Berlin", "none"), sch
    assert [x["name"] for x in c.schedules()] == ["py-nightly"]
    assert c.pause_schedule("py-nightly")["paused"] is True
    assert c.get_schedule("py-nightly")["next"] == [], "a paused schedule shows fire times"
    assert c.resume_schedule("py-nightly")["paused"] is False
    c.delete_schedule("py-nightly")
    assert c.schedules() == []
    assert c.cluster()["leader"], "GET /cluster without a leader"


def test_results_resume_across_a_server_restart(cluster):
    """The stream follows node a only; a is killed and restarted while work
    completes through node b: every result arrives once, in seq order."""
    a = start_server(cluster, "a")
    b = start_server(cluster, "b")
    c = Client([a.url, b.url])
    worker = Worker([a.url, b.url], worker_id="py-results", capacity=4)

    @worker.handler("r")
    def double(job):
        return job.payload * 2

    worker.start()
    results = Collector(Client(a.url).results(queue="r", after=0))
    try:
        def run(prefix, n=5):
            ids = [f"{prefix}-{i}" for i in range(n)]
            c.submit_many([{"id": i, "payload": k, "queue": "r"} for k, i in enumerate(ids)])
            for i in ids:
                assert c.wait(i, timeout=30)["status"] == "completed", f"{i} did not complete"
            return ids

        first = run("before")
        results.wait_ids(first)
        a.kill(signal.SIGKILL)
        during = run("during")  # through b, while the stream has no node
        cluster.restart_server(a)
        after = run("after")
        results.wait_ids(first + during + after, timeout=40)
        time.sleep(0.5)  # a declared window: a repeat would show up here
        got = results.ids()
        assert sorted(got) == sorted(first + during + after), \
            f"results lost or repeated: {sorted(got)}"
        seqs = [ev.seq for ev in results.events]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), f"seqs out of order: {seqs}"
        assert results.stream.reconnects >= 1, "the stream never reconnected"
        assert {ev.event for ev in results.events} == {"completed"}
        assert all(ev.data["result"] == 2 * int(ev.work_id.rsplit("-", 1)[1])
                   for ev in results.events), "a result is not the handler's"
    finally:
        results.close()
        worker.stop(0)
        worker.join(15)


def test_cursor_le_compares_shard_by_shard():
    from workd import cursor_le
    for a, b, le in [("5", "5", True), ("4", "5", True), ("6", "5", False),
                     ("9.2", "10.2", True), ("10.2", "9.2", False),  # numbers, not text
                     ("3.2", "4.2", True), ("4.1", "4.2", True), ("4.3", "4.2", False),
                     ("5.1", "4.2", False), ("4", "4.2", True), ("4.2", "4", False),
                     ("4.0.0", "4", True), ("4.0.1", "4", False),
                     ("x", "4", False), ("4", "x", False), ("", "4", False)]:
        assert cursor_le(a, b) is le, f"cursor_le({a!r}, {b!r}) is not {le}"


def test_results_resume_and_dedupe_a_cursor_of_several_shards():
    """A stream whose ids are cursors of several shards ("3.2", "4.2"): it
    resumes with the last id as Last-Event-ID, text for text, and yields an
    event only when its id is above the last in some shard (a repeat, an id
    with a shard missing, numbers compared as numbers, not as text)."""
    srv = ScriptedStream([
        [("3.2", 2), ("4.2", 4)],
        [("3.2", 2), ("4.2", 4), ("4.1", 1), ("4", 4), ("10.2", 10), ("10.3.1", 1)],
        [("10.3.1", 1), ("10.3.2", 2)],
    ])
    results = Collector(Client(srv.url).results(after="3.1"))
    try:
        wait_until(lambda: len(results.events) >= 5 or results.error, 15,
                   what=lambda: f"5 events through 3 connections (have "
                                f"{[ev.event_id for ev in results.events]}, error "
                                f"{results.error!r}, {len(srv.requests)} connections "
                                f"resumed from {srv.requests[:5]}...)")
        assert results.error is None, f"the stream failed: {results.error!r}"
        got = [(ev.event_id, ev.seq) for ev in results.events]
        assert got == [("3.2", 2), ("4.2", 4), ("10.2", 10), ("10.3.1", 1), ("10.3.2", 2)], \
            f"events lost or repeated: {got}"
        assert [last for last, _ in srv.requests] == ["3.1", "4.2", "10.3.1"], \
            f"the stream did not resume from its last event id: {srv.requests}"
        assert results.stream.last_event_id == "10.3.2", results.stream.last_event_id
        assert results.stream.reconnects == 2, results.stream.reconnects
    finally:
        srv.close()
        results.close()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert results.stream.last_seq == "10.3.2", "last_seq is not last_event_id"
    assert caught and caught[0].category is DeprecationWarning, "last_seq is not deprecated"


# ------------------------------------------------------------ a broken or hostile server

def within(fn, seconds, what):
    """Runs fn() on a thread; returns the exception it raised (None if none),
    failing when it runs longer than seconds."""
    box = {"error": None}

    def run():
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"{what}: still running after {seconds}s"
    return box["error"]


def expect_bad_answer(fn, seconds, what, says):
    e = within(fn, seconds, what)
    assert isinstance(e, workd.BadAnswer), f"{what}: raised {e!r}, not BadAnswer"
    assert e.kind == "bad-answer" and says in e.detail, f"{what}: {e.detail!r}"
    return e


def test_an_answer_without_end_is_cut_and_a_redirect_refused():
    with HostileServer({"GET /work/x": json_answer({"id": "x"})}) as other, \
            HostileServer({"GET /work/x": endless(), "GET /work/y": endless(length=10 << 30),
                           "GET /work/z": endless(status=500),
                           "GET /work/t": answer(200, b"<html>not JSON</html>"),
                           "GET /work/s": drip(0.2),
                           "GET /work/r": answer(307, b"", [("Location", other.url + "/work/x")]),
                           "POST /work": answer(308, b"", [("Location", other.url + "/work")]),
                           "GET /work/r/stream": answer(302, b"", [("Location", other.url)])},
                          ) as srv:
        c = Client(srv.url, retry_for=0)
        for w in ("x", "y", "z"):
            expect_bad_answer(lambda: c.get(w), 30, f"get({w!r}) of an answer without end",
                              f"the {workd._http.MAX_ANSWER_BYTES} bytes a workd answer")
        assert srv.count("GET", "/work/x") == 1, "an answer too long was asked for again"
        expect_bad_answer(lambda: c.get("t"), 10, "an answer that is not JSON", "not JSON")
        # A byte now and then: the answer's time runs out all the same.
        e = within(lambda: Client(srv.url, retry_for=0, timeout=1).get("s"), 10,
                   "an answer that drips a byte at a time")
        assert isinstance(e, Unavailable), repr(e)
        e = expect_bad_answer(lambda: c.get("r"), 10, "a redirect", "does not follow")
        assert e.status == 307 and e.location == other.url + "/work/x", (e.status, e.location)
        expect_bad_answer(lambda: c.submit(1), 10, "a redirect of a submission", "redirect")
        expect_bad_answer(lambda: next(iter(c.stream("r"))), 10, "a redirect of a stream",
                          "redirect")
    assert other.requests == [], f"a redirect was followed: {other.requests}"


def test_retry_after_is_read_and_bounded():
    from workd._http import RETRY_AFTER_MAX, retry_after_seconds
    now = time.time()
    for value, want in [("3", 3.0), ("0", 0.0), ("120", RETRY_AFTER_MAX),
                        ("9" * 30, RETRY_AFTER_MAX), (formatdate(now + 20, usegmt=True), 20.0),
                        (formatdate(now + 86400 * 365, usegmt=True), RETRY_AFTER_MAX),
                        (formatdate(now - 3600, usegmt=True), 0.0), ("-5", None), ("1.5", None),
                        ("nan", None), ("inf", None), ("1e9", None), ("soon", None), ("", None)]:
        got = retry_after_seconds({"retry-after": value})
        ok = got is None if want is None else got is not None and abs(got - want) < 2
        assert ok, f"Retry-After: {value!r} reads as {got!r}, not {want!r}"
    # A call waits as it says, but never past retry_for.
    detail = json.dumps({"type": "https://workd.dev/problems/unavailable", "status": 503,
                         "detail": "no leader"}).encode()
    with HostileServer({"GET /work/x": answer(503, detail, [("Retry-After", "3600")])}) as srv:
        t0 = time.monotonic()
        e = within(lambda: Client(srv.url, retry_for=1).get("x"), 20, "503 Retry-After: 3600")
        assert isinstance(e, WorkdError) and e.status == 503, repr(e)
        assert time.monotonic() - t0 < 5, f"retry_for=1 waited {time.monotonic() - t0:.1f}s"


def test_wait_pauses_when_a_long_poll_is_not_held():
    """wait() long-polls; a server that answers at once, again and again,
    with the work open is asked again after a growing pause."""
    with HostileServer({"GET /work/x": json_answer({"id": "x", "status": "running"})}) as srv:
        e = within(lambda: Client(srv.url).wait("x", timeout=3), 10, "wait(timeout=3)")
        assert e is None, repr(e)
        asked = srv.count("GET", "/work/x")
        assert 2 <= asked <= 10, f"wait asked {asked} times in 3 s (the pauses allow about 6)"


def test_bad_event_streams_end_with_an_error_or_a_pause():
    routes = {
        # A line that never ends; data lines of an event that never ends.
        "GET /work/a/stream": endless_stream("data: ", "x" * 65536),
        "GET /work/b/stream": endless_stream("id: 1\n", "data: " + "x" * 1000 + "\n"),
        # A stream that ends at once, again and again, asking to come back at once.
        "GET /work/c/stream": event_stream("retry: 0\n: bye\n\n"),
        # Fields the spec ignores, an id with a NUL (ignored), then an event.
        "GET /work/d/stream": event_stream(
            "nonsense\nretry: soon\nid\n: a comment\nevent\n\nfield: value\nid: 9\0x\n"
            'data: {"id": "d"}\n\nid: 10\nevent: completed\n'
            'data: {"id": "d", "status": "completed", "seq": 10}\n\n', then_hold=True),
    }
    with HostileServer(routes) as srv:
        c = Client(srv.url)
        for w in ("a", "b"):
            expect_bad_answer(lambda: next(iter(c.stream(w))), 60, f"stream {w}",
                              "an event longer than")
        collected = Collector(c.stream("c"))
        time.sleep(2)  # a measurement window: how often it comes back in 2 s
        collected.close()
        asked = srv.count("GET", "/work/c/stream")
        assert 2 <= asked <= 12, f"a stream that ends at once was opened {asked} times in 2 s"
        events = [ev.data for ev in Client(srv.url).stream("d")]
        assert events == [{"id": "d", "status": "completed", "seq": 10}], events


# ------------------------------------------------------------ the worker

def test_worker_progress_failure_retry_cancel_and_a_lost_report(cluster):
    s = start_server(cluster, "s1")
    c = Client(s.url)
    worker = Worker(s.url, worker_id="py-worker", capacity=4)
    seen = {}
    started, release = threading.Event(), threading.Event()

    @worker.handler("report")
    def report(job):
        job.progress(0.25, "a quarter", "line 1\n")
        time.sleep(0.3)  # a declared delay: two updates a progress interval apart
        job.progress(1.0, "all of it", "line 2\n")
        return {"ok": job.payload}

    @worker.handler("flaky")
    def flaky(job):
        if job.attempt == 1:
            raise ValueError(f"boom on attempt {job.attempt}")
        return f"fine on attempt {job.attempt}"

    @worker.handler("hopeless")
    def hopeless(job):
        if job.attempt == 1:
            raise Fail("bad input", retry=False)
        return "fixed"

    @worker.handler("slow")
    def slow(job):
        started.set()
        seen["cancelled"] = job.cancelled.wait(30)
        seen["reason"] = job.cancel_reason
        return "this result must be dropped"

    @worker.handler("held")
    def held(job):
        release.wait(30)
        return f"done on attempt {job.attempt}"

    worker.start()
    try:
        assert "py-worker" in workers_at(s.url), "the worker is not registered"

        # Progress: on the work's own stream, then its result.
        c.submit(3, id="p1", queue="report")
        events = list(c.stream("p1"))
        kinds = [ev.event for ev in events]
        assert kinds[-1] == "completed" and set(kinds[:-1]) == {"progress"}, kinds
        progress = [ev.data for ev in events if ev.event == "progress"]
        assert "".join(p.get("output", "") for p in progress) == "line 1\nline 2\n", progress
        assert (progress[-1]["fraction"], progress[-1]["message"]) == (1.0, "all of it"), progress
        assert events[-1].data["result"] == {"ok": 3}, events[-1].data

        # A raising handler is a failed attempt with its error, and is retried.
        c.submit(None, id="f1", queue="flaky", max_attempts=3)
        done = c.wait("f1", timeout=20)
        assert (done["status"], done["attempts"], done["result"]) == \
            ("completed", 2, "fine on attempt 2"), done
        failed = [e for e in c.events("f1")["events"] if e["type"] == "failed"]
        assert [e["data"].get("error") for e in failed] == ["ValueError: boom on attempt 1"], \
            c.events("f1")

        # Fail(retry=False) makes it dead at once; an operator's retry runs it again.
        c.submit(None, id="h1", queue="hopeless", max_attempts=5)
        dead = c.wait("h1", timeout=20)
        assert (dead["status"], dead["attempts"], dead["last_error"]) == \
            ("dead", 1, "bad input"), dead
        assert c.retry("h1")["status"] == "pending"
        assert c.wait("h1", timeout=20)["result"] == "fixed"

        # Cancelling running work reaches the handler (through the heartbeat).
        c.submit(None, id="c1", queue="slow")
        assert started.wait(10), "the slow job did not start"
        t0 = time.monotonic()
        c.cancel("c1")
        wait_until(lambda: "cancelled" in seen, 10, what="the handler to see the cancellation")
        took = time.monotonic() - t0
        assert seen == {"cancelled": True, "reason": "cancelled by the server"}, seen
        assert took < 3, f"the cancellation took {took:.1f}s to reach the handler"
        time.sleep(1)  # a declared window: a report of the dropped result would land here
        assert raw_work(s.url, "c1")["status"] == "cancelled"
        assert raw_work(s.url, "c1")["result"] is None
        print(f"a cancel reached the handler in {took:.2f}s")

        # A job that ends while the server is down is reported once it is
        # back: the same attempt completes, nothing runs again.
        c.submit(None, id="r1", queue="held")
        wait_until(lambda: raw_work(s.url, "r1")["status"] == "running", 10,
                   what="r1 to be running")
        s.kill(signal.SIGKILL)
        release.set()  # its report now meets a dead server
        wait_until(lambda: worker._reports, 10, what="the report to wait for the server")
        cluster.restart_server(s)
        done = c.wait("r1", timeout=20)
        assert (done["status"], done["attempts"], done["result"]) == \
            ("completed", 1, "done on attempt 1"), done
    finally:
        worker.stop(0)
        assert worker.join(15), "the worker did not stop"
    assert "py-worker" not in workers_at(s.url), "the worker did not deregister"


WORKER_SCRIPT = """\
import logging, sys, workd
logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
worker = workd.Worker(worker_id=sys.argv[1], capacity=2, grace=float(sys.argv[2]))

@worker.handler("sleepy")
def sleepy(job):
    print(f"handling {job.id}", flush=True)
    if job.cancelled.wait(job.payload):
        print(f"{job.id}: {job.cancel_reason}", flush=True)
        return "interrupted"
    return f"slept {job.payload}s"

worker.run()
print("exited cleanly", flush=True)
"""


_venv = {}


def installed_python():
    """The python of a new venv where `pip install --no-index clients/python` put workd."""
    if "python" not in _venv:
        where = Path(tempfile.mkdtemp(prefix="workd-py-venv-"))
        atexit.register(shutil.rmtree, where, True)
        r = subprocess.run([sys.executable, "-m", "venv", str(where / "venv")],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise AssertionError(f"python3 -m venv failed (Debian: python3-venv):\n{r.stderr}")
        py = where / "venv" / "bin" / "python"
        r = subprocess.run([str(py), "-m", "pip", "install", "--no-index", "--no-cache-dir",
                            "--disable-pip-version-check", str(REPO / "clients" / "python")],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"pip install without an index failed:\n{r.stdout}\n{r.stderr}"
        _venv["python"] = py
    return _venv["python"]


def test_pip_install_needs_no_index():
    py = installed_python()
    probe = ("import json, importlib.metadata as m, workd; md = m.metadata('workd'); "
             "print(json.dumps([workd.__file__, md['Version'], md['License'], "
             "md['Requires-Python'], workd.__version__]))")
    r = subprocess.run([str(py), "-c", probe], capture_output=True, text=True, timeout=60,
                       cwd=tempfile.gettempdir())
    assert r.returncode == 0, r.stderr
    where, version, licence, requires, own = json.loads(r.stdout)
    assert "site-packages" in where, f"workd imported from {where}, not the venv"
    assert (version, licence, requires) == (workd.__version__, "Apache-2.0", ">=3.9"), r.stdout
    assert own == version


def test_worker_stops_gracefully_on_sigterm(cluster):
    py = installed_python()
    s = start_server(cluster, "s1")
    c = Client(s.url)
    script = cluster.tmp / "py_worker.py"
    script.write_text(WORKER_SCRIPT)

    def start(name, grace):
        p = cluster.start_process(name, [str(py), str(script), name, str(grace)],
                                  env={"WORKD_SERVER": s.url, "PYTHONUNBUFFERED": "1"})
        wait_until(lambda: name in workers_at(s.url) or not p.alive(), 20,
                   what=f"{name} to register")
        assert p.alive(), f"{name} exited:\n{p.log_tail()}"
        return p

    # Within the grace period: the running job finishes and is reported, no
    # new job is taken, then the worker deregisters and exits 0.
    p = start("py-graceful", 10)
    c.submit(2, id="g1", queue="sleepy")
    wait_until(lambda: "handling g1" in p.log_text(), 10, what="g1 to start")
    p.kill(signal.SIGTERM)
    wait_until(lambda: "no new work taken" in p.log_text(), 10, what="the worker to stop pulling")
    c.submit(0, id="g2", queue="sleepy")
    assert p.stopped_with(15) == 0, p.log_tail()
    g1 = raw_work(s.url, "g1")
    assert (g1["status"], g1["result"], g1["worker_id"]) == \
        ("completed", "slept 2s", "py-graceful"), g1
    assert raw_work(s.url, "g2")["status"] == "pending", "a stopping worker took new work"
    assert "deregistered" in p.log_text() and "exited cleanly" in p.log_text(), p.log_tail()
    assert "py-graceful" not in workers_at(s.url)
    c.cancel("g2")

    # Past the grace period: the job is told to stop and given back for a retry.
    p = start("py-impatient", 1)
    c.submit(30, id="g3", queue="sleepy", max_attempts=3)
    wait_until(lambda: "handling g3" in p.log_text(), 10, what="g3 to start")
    t0 = time.monotonic()
    p.kill(signal.SIGTERM)
    assert p.stopped_with(15) == 0, p.log_tail()
    took = time.monotonic() - t0
    assert took < 5, f"a worker with a grace of 1s took {took:.1f}s to stop"
    assert "g3: the worker is stopping" in p.log_text(), p.log_tail()
    g3 = raw_work(s.url, "g3")
    assert g3["status"] in ("pending", "scheduled") and g3["attempts"] == 1, g3
    assert g3["last_error"] == "worker stopping: grace period over", g3
    print(f"a worker past its grace stopped {took:.2f}s after SIGTERM")


# ------------------------------------------------------------ the worker's exchange

class ScriptedWorkd:
    """The worker protocol of one worker id ("w"), scripted over real HTTP
    (tests/lib/hostile_server.py): it hands out the jobs it is given (a pull
    with none holds up to `hold` seconds for one), and answers reports on the
    reports route and, unless `old`, in a pull (the exchange). An old one
    refuses a pull naming 'reports' with 400, as a server older than the
    exchange does. `verdicts` maps a work id to what its reports get, in
    turn (a refusal's reason, or "other-entry": the answer's entry is of
    another attempt), then acceptance. The answers of the first `lose`
    pulls that carry reports are lost (the connection ends; the reports were
    decided). Each report that comes is kept in `reported` as (route, id,
    attempt, verdict, monotonic time)."""

    def __init__(self, jobs=(), old=False, verdicts=None, lose=0, hold=1.0):
        self.old, self.verdicts, self.lose, self.hold = old, dict(verdicts or {}), lose, hold
        self.cond = threading.Condition()
        self.queue, self.reported, self.pulls = [], [], []
        self.add(jobs)
        self.srv = HostileServer({
            "PUT /workers/w": json_answer({"heartbeat_interval_ms": 500, "cancel": []}),
            "DELETE /workers/w": answer(204),
            "POST /workers/w/progress": self._progress,
            "POST /workers/w/reports": self._reports,
            "POST /workers/w/pull": self._pull})
        self.url = self.srv.url

    def add(self, jobs):
        with self.cond:
            self.queue += [{"id": j, "attempt": 1, "queue": "q", "priority": 0, "payload": j,
                            "timeout_ms": 60000} for j in jobs]
            self.cond.notify_all()

    def _decide(self, route, r):
        with self.cond:
            script = self.verdicts.get(r["id"]) or []
            verdict = script.pop(0) if script else "accepted"
            self.reported.append((route, r["id"], r["attempt"], verdict, time.monotonic()))
            self.cond.notify_all()
        if verdict == "accepted":
            return {"id": r["id"], "attempt": r["attempt"], "accepted": True,
                    "status": "completed"}
        if verdict == "other-entry":
            return {"id": r["id"], "attempt": r["attempt"] + 1, "accepted": True}
        return {"id": r["id"], "attempt": r["attempt"], "accepted": False, "reason": verdict}

    def _progress(self, h):
        body = json.loads(h.body)
        json_answer({"results": [{"accepted": True} for _ in body["progress"]]})(h)

    def _reports(self, h):
        body = json.loads(h.body)
        json_answer({"results": [self._decide("reports", r) for r in body["reports"]]})(h)

    def _pull(self, h):
        body = json.loads(h.body)
        reports = body.get("reports")
        with self.cond:
            self.pulls.append((body["max"], body["wait"], len(reports or [])))
        if reports is not None and self.old:
            return problem(400, "the pull has an unknown field 'reports' (known: instance, "
                           "max, wait, queues, peek)", "unknown-field")(h)
        results = None if reports is None else [self._decide("pull", r) for r in reports]
        with self.cond:
            if results is not None and self.lose > 0:
                self.lose -= 1
                return  # no answer: the connection ends
            self.cond.wait_for(lambda: self.queue, min(body["wait"], self.hold))
            jobs, self.queue = self.queue[:body["max"]], self.queue[body["max"]:]
        answer_ = {"jobs": jobs}
        if results is not None:
            answer_["results"] = results
        json_answer(answer_)(h)

    def routes_of(self, work_id):
        with self.cond:
            return [(route, verdict) for route, i, _, verdict, _ in self.reported if i == work_id]

    def wait_reported(self, ids, timeout=20):
        """Waits until each of ids had a report accepted or refused for good."""
        def settled():
            with self.cond:
                done = {i for _, i, _, v, _ in self.reported
                        if v in ("accepted", "superseded", "cancelled", "not-found",
                                 "not-holder")}
            return set(ids) <= done
        wait_until(settled, timeout, what=f"reports of {len(ids)} jobs")

    def close(self):
        with self.cond:
            self.hold = 0
            self.cond.notify_all()
        self.srv.close()


def scripted_worker(srv, capacity, handler=lambda job: job.payload):
    worker = Worker(srv.url, worker_id="w", capacity=capacity, pull_wait=30)
    worker.handler("q")(handler)
    worker.start()
    return worker


def test_worker_carries_its_reports_in_its_pulls():
    """Every slot busy: the slot that frees pulls at once, carrying the
    report; the reports route is (almost) never asked, and each report
    comes once. One slot: each report is made while the puller waits for
    it (a drain with several slots, against a real server, is below)."""
    ids = [f"j{i}" for i in range(60)]
    srv = ScriptedWorkd(ids)
    worker = scripted_worker(srv, 1, lambda job: time.sleep(0.005) or job.payload)
    try:
        srv.wait_reported(ids)
        time.sleep(0.3)  # a declared window: a report sent twice would come here
        routes = [route for route, *_ in srv.reported]
        assert sorted(i for _, i, *_ in srv.reported) == sorted(ids), \
            f"each report once: {srv.reported}"
        # At most a thread switch slower than CARRY (a loaded machine).
        assert routes.count("reports") <= 2, \
            f"{routes.count('reports')} of {len(ids)} reports went on their own"
        carrying = [p for p in srv.pulls if p[2]]
        assert all(wait == 0 for _, wait, _ in carrying), \
            f"a pull that carries reports waits for no job: {srv.pulls}"
        print(f"60 jobs, capacity 1: {len(srv.pulls)} pulls ({len(carrying)} carrying "
              f"reports), {routes.count('reports')} reports on their own")
    finally:
        worker.stop(0)
        assert worker.join(15), "the worker did not stop"
        srv.close()
    assert worker.error is None, worker.error


def test_worker_reads_the_verdicts_of_its_exchange():
    """The results of a pull are read as the reports route's: accepted,
    superseded, cancelled, not-found and not-holder are final; another
    refusal, an entry of another attempt, or an answer lost sends the
    report again until it is taken."""
    ids = [f"v{i}" for i in range(8)]
    srv = ScriptedWorkd(ids, lose=1, verdicts={
        "v1": ["superseded"], "v2": ["shard-unavailable"], "v3": ["not-holder"],
        "v4": ["other-entry"], "v5": ["cancelled"], "v6": ["not-found"]})
    worker = scripted_worker(srv, 1, lambda job: time.sleep(0.02) or job.payload)
    try:
        srv.wait_reported(ids)
        wait_until(lambda: not worker._reports, 10, what="every report to be settled")
        time.sleep(0.3)  # a declared window: a report sent once too often would come here
        for i, final in (("v1", "superseded"), ("v3", "not-holder"), ("v5", "cancelled"),
                         ("v6", "not-found")):
            assert [v for _, v in srv.routes_of(i)] == [final], \
                f"{i}: {final} is final, sent once: {srv.routes_of(i)}"
        for i, first in (("v2", "shard-unavailable"), ("v4", "other-entry")):
            got = srv.routes_of(i)
            assert [v for _, v in got] == [first, "accepted"] and got[0][0] == "pull", \
                f"{i}: {first} is sent again until accepted: {got}"
        lost = [i for i in ids if len(srv.routes_of(i)) == 2 and i not in ("v2", "v4")]
        assert lost, f"the report of the lost answer was not sent again: {srv.reported}"
        assert all(v == "accepted" for _, v in srv.routes_of(lost[0])), srv.routes_of(lost[0])
    finally:
        worker.stop(0)
        assert worker.join(15), "the worker did not stop"
        srv.close()
    assert worker.error is None, worker.error


def test_worker_goes_back_to_separate_reports_on_an_older_server():
    """A server older than the exchange refuses a pull naming 'reports'
    (400): the worker takes it in its stride, sends its reports on their
    own from then on, and every one is taken once."""
    ids = [f"o{i}" for i in range(20)]
    srv = ScriptedWorkd(ids, old=True)
    worker = scripted_worker(srv, 2)
    try:
        srv.wait_reported(ids)
        time.sleep(0.3)  # a declared window: a report sent twice would come here
        assert sorted(i for _, i, *_ in srv.reported) == sorted(ids), srv.reported
        assert {route for route, *_ in srv.reported} == {"reports"}, srv.reported
        carrying = [p for p in srv.pulls if p[2]]
        assert len(carrying) == 1, f"the worker carried reports after the 400: {srv.pulls}"
    finally:
        worker.stop(0)
        assert worker.join(15), "the worker did not stop"
        srv.close()
    assert worker.error is None, f"the 400 of an older server stopped the worker: {worker.error}"


def test_worker_sends_a_report_at_once_when_no_pull_is_coming():
    """A free slot's pull waits for work: a job that ends meanwhile is
    reported on its own at once, not held for a pull."""
    srv = ScriptedWorkd(["n1"], hold=10)
    ended = {}

    def handler(job):
        time.sleep(0.3)  # the next pull (a free slot's) is waiting at the server by now
        ended[job.id] = time.monotonic()
        return "done"
    worker = scripted_worker(srv, 2, handler)
    try:
        srv.wait_reported(["n1"])
        ((route, _, _, _, at),) = srv.reported
        took = at - ended["n1"]
        assert route == "reports", srv.reported
        assert took < 0.5, f"the report reached the server {took:.3f}s after the job ended"
        print(f"a report with no pull coming reached the server {took * 1000:.0f} ms after "
              "its job ended")
    finally:
        worker.stop(0)
        assert worker.join(15), "the worker did not stop"
        srv.close()


def metric_sum(url, name, labels):
    """The sum of the samples of /metrics's `name` that have `labels`."""
    r = http("GET", url + "/metrics")
    assert r.status == 200, f"GET /metrics: {r.status}"
    total = 0.0
    for line in r.text.splitlines():
        if line.startswith(name + "{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_worker_drains_with_its_reports_in_its_pulls(cluster):
    """200 jobs through a Worker of capacity 4: each completes once, and
    their reports ride in the pulls: (almost) no request of the reports
    route."""
    s = start_server(cluster, "s1")
    c = Client(s.url)
    n = 200
    ids = [c.submit(i, queue="drain")["id"] for i in range(n)]
    calls = {}

    def double(job):
        calls[job.id] = calls.get(job.id, 0) + 1
        return job.payload * 2

    reports0 = metric_sum(s.url, "workd_http_requests_total", {"route": "worker_reports"})
    worker = Worker(s.url, worker_id="py-drain", capacity=4)
    worker.handler("drain")(double)
    t0 = time.monotonic()
    worker.start()
    try:
        for i in ids:
            work = c.wait(i, timeout=60)
            assert (work["status"], work["attempts"]) == ("completed", 1), work
        took = time.monotonic() - t0
        wait_until(lambda: not worker._reports, 10, what="every report to be acknowledged")
    finally:
        worker.stop(0)
        assert worker.join(15), "the worker did not stop"
    reports = metric_sum(s.url, "workd_http_requests_total", {"route": "worker_reports"}) - reports0
    pulls = metric_sum(s.url, "workd_http_requests_total", {"route": "worker_pull"})
    assert sorted(calls) == sorted(ids) and set(calls.values()) == {1}, \
        f"a job ran twice: {[i for i, k in calls.items() if k > 1]}"
    twice = cluster.psql("SELECT count(*) FROM workd_done GROUP BY id HAVING count(*) > 1")
    assert not twice, f"a job completed twice: {twice}"
    assert reports <= n // 10, \
        f"the worker sent {reports:.0f} report requests for {n} jobs ({pulls:.0f} pulls): " \
        "its reports should ride in its pulls"
    print(f"{n} jobs in {took:.2f}s: {pulls:.0f} pulls, {reports:.0f} report requests")


def openapi_job_has_trace_context():
    import yaml
    spec = yaml.safe_load((REPO / "openapi.yaml").read_text())
    return "traceparent" in spec["components"]["schemas"]["Job"].get("properties", {})


def test_trace_context_reaches_the_handler(cluster):
    if not openapi_job_has_trace_context():
        raise Skip("the server hands out no trace context (openapi.yaml's Job has no traceparent)")
    s = start_server(cluster, "s1")
    worker = Worker(s.url, worker_id="py-trace")
    got = {}

    @worker.handler("traced")
    def traced(job):
        got[job.attempt] = (job.traceparent, job.tracestate)
        if job.attempt == 1:
            raise ValueError("once more, in the same trace")
        return "ok"

    worker.start()
    try:
        parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        Client(s.url).submit(1, id="t1", queue="traced", traceparent=parent,
                             tracestate="vendor=abc")
        assert Client(s.url).wait("t1", timeout=20)["status"] == "completed"
        assert got == {1: (parent, "vendor=abc"), 2: (parent, "vendor=abc")}, got
    finally:
        worker.stop(0)
        worker.join(15)


if __name__ == "__main__":
    run_tests(globals())
