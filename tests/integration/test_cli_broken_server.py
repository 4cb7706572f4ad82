"""workd, the command line, against a server that is broken or hostile
(tests/lib/hostile_server.py, a real HTTP server on loopback that answers as
scripted): text made to drive a terminal in every command's answer is shown
escaped; an answer without end is cut with a clear error; a redirect is not
followed; Retry-After cannot make it wait past --retry-for or ask again and
again without pause; an event stream that breaks the rules ends with an
error instead of taking the memory (docs/cli.md, "A server that misbehaves")."""

import json
import subprocess
import sys
import time
from email.utils import formatdate
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import run_tests  # noqa: E402
from hostile_server import (HostileServer, answer, endless, endless_stream,  # noqa: E402
                            event_stream, json_answer, problem)
from test_cli import (CONFLICT, EVIL, FAILED, NOT_FOUND, OK, TIMEOUT,  # noqa: E402
                      UNAVAILABLE, USAGE, expect, terminal_safe, workd)

# How EVIL shows once escaped (its start is enough to find it).
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\u009b31m"
N = {"pending": 1, "scheduled": 0, "running": 0, "waiting": 0, "dead": 0, "completed": 0,
     "cancelled": 0}


def evil_routes():
    """An answer to every command in which each string a table or a field
    shows is EVIL (and a key of an object too)."""
    work = {"id": "x", "status": "dead", "queue": EVIL, "attempts": 1, "max_attempts": 1,
            "payload": EVIL, "result": None, "last_error": "line 1\n" + EVIL,
            "created_at": EVIL, "worker_id": EVIL}
    cluster = {"leader": EVIL, "term": 1, "database": {"durability": EVIL, "reachable": True},
               "open_total": 1, "open": {EVIL: N},
               "nodes": [{"id": EVIL, "url": EVIL, "roles": EVIL, "last_seen": EVIL}],
               "workers": [{"id": EVIL, "capacity": 1, "running": [], "queues": [EVIL],
                            "last_heartbeat": EVIL, "silent_ms": 5}]}
    events = [{"status": "dead", "id": EVIL, "queue": EVIL, "at": EVIL, "attempts": 1,
               "error": EVIL},
              {"status": "completed", "id": "c", "queue": "q", "at": EVIL, "result": EVIL},
              {"status": "cancelled", "id": "c", "queue": "q", "at": "t", "reason": EVIL},
              {"status": "progress", "id": "p", "queue": "q", "at": "t", "fraction": 0.5,
               "message": EVIL, "output": EVIL}]
    stream = "".join(f"id: 7{EVIL[:4]}\nevent: {e['status']}\ndata: {json.dumps(e)}\n\n"
                     for e in events)
    return {
        "GET /queues": json_answer({"queues": [dict(N, queue=EVIL, limits={"paused": False},
                                                    oldest_pending_age_s=1.0,
                                                    oldest_pending_at=EVIL)]}),
        "GET /queues/q/keys": json_answer({"keys": [dict(N, key=EVIL)], "other": {"keys": 0}}),
        "GET /schedules": json_answer({"schedules": [
            {"name": EVIL, "cron": EVIL, "timezone": EVIL, "paused": False, "next": [EVIL],
             "last_run": {"id": EVIL, "status": EVIL}}]}),
        "GET /schedules/s": json_answer({"name": "s", "cron": EVIL, "error": EVIL,
                                         "work": {"payload": EVIL}}),
        "GET /subscriptions": json_answer({"subscriptions": [
            {"name": EVIL, "url": EVIL, "queues": [EVIL], "paused": False, "lag": 0,
             "failures": 1, "last_error": EVIL}]}),
        "GET /subscriptions/s": json_answer({"name": "s", "url": EVIL, "last_error": EVIL}),
        "GET /cluster": json_answer(cluster),
        "GET /work/x": json_answer(work),
        "GET /work/x/events": json_answer({"events": [{"seq": 1, "at": EVIL, "type": EVIL,
                                                       "data": {"error": EVIL}}]}),
        "GET /work": json_answer({"items": [work], "next_before": EVIL}),
        "POST /work": json_answer({"id": EVIL, "status": EVIL, "created": True}),
        "DELETE /work/x": json_answer({"id": EVIL, "status": EVIL}),
        "POST /work/y/retry": problem(409, EVIL, "not-retryable"),
        "GET /results": event_stream(stream),
    }


def test_every_command_escapes_what_the_server_says():
    commands = [("queues", OK), ("queues keys q", OK), ("schedules", OK),
                ("schedules get s", OK), ("subscriptions", OK), ("subscriptions get s", OK),
                ("cluster", OK), ("workers", OK), ("get x", OK), ("get --events x", OK),
                ("list", OK), ("wait x", FAILED), ("submit 1", OK), ("submit --quiet 1", OK),
                ("cancel x", OK), ("retry y", CONFLICT), ("tail --progress --count 8", OK)]
    with HostileServer(evil_routes()) as srv:
        for args, code in commands:
            r = expect(workd(*args.split(), server=srv.url, text=False, timeout=30), code, args)
            out = terminal_safe(r.stdout, f"workd {args}")
            err = terminal_safe(r.stderr, f"workd {args} (stderr)")
            assert SHOWN in out + err, f"workd {args} does not show the text escaped: {out}{err}"
        # The stream's event id, EVIL's start, is said escaped when it resumes.
        assert srv.count("GET", "/results") == 2, srv.requests
        # --json prints the API's values as they are.
        r = expect(workd("get", "--json", "x", server=srv.url), OK, "get --json")
        assert json.loads(r.stdout)["last_error"] == "line 1\n" + EVIL, r.stdout
        # A text of several lines keeps them in `get`, each indented under the
        # value (the longest field name is max_attempts).
        r = expect(workd("get", "x", server=srv.url), OK, "get")
        assert "\nlast_error    line 1\n" + " " * 14 + "\\x1b]0;owned" in r.stdout, r.stdout


def timed(args, server, code, within, what):
    """Runs workd ARGS; fails unless it exits code within that many seconds."""
    t0 = time.monotonic()
    try:
        r = workd(*args, server=server, timeout=within + 30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{what}: workd {' '.join(args)} still ran after {within + 30}s")
    took = time.monotonic() - t0
    expect(r, code, what)
    assert took < within, f"{what}: took {took:.1f}s, more than {within}s: {r.stderr}"
    return r


def test_an_answer_without_end_is_cut():
    with HostileServer({"GET /work/x": endless(),
                        "GET /work/y": endless(length=10 << 30),
                        "GET /work/z": endless(status=500)}) as srv:
        for path in ("x", "y", "z"):
            r = timed(["get", path, "--retry-for", "0"], srv.url, UNAVAILABLE, 20,
                      f"an answer without end to GET /work/{path}")
            assert "longer than 64 MiB" in r.stderr, r.stderr
        assert srv.count("GET", "/work/x") == 1, "an answer too long was asked for again"


def test_a_redirect_is_not_followed():
    with HostileServer({"GET /work/x": json_answer({"id": "x", "status": "completed"})}) as other:
        to = other.url + "/work/x"
        routes = {"GET /work/x": answer(307, b"", [("Location", to)]),
                  "POST /work": answer(308, b"", [("Location", other.url + "/work")]),
                  "GET /results": answer(302, b"", [("Location", other.url + "/results")])}
        with HostileServer(routes) as srv:
            for args in (["get", "x"], ["submit", "1"], ["tail"]):
                r = timed(args, srv.url, USAGE, 20, f"workd {args[0]} redirected")
                assert "a redirect to http://127.0.0.1" in r.stderr and \
                    "does not follow" in r.stderr, r.stderr
        assert other.requests == [], f"the redirect was followed: {other.requests}"


def test_retry_after_is_bounded():
    """Retry-After in the future (a date next year, an hour) waits no longer
    than --retry-for; one that says nothing sensible (0, a date past, a
    negative number, words) is the backoff, not a loop without pause."""
    tomorrow = formatdate(time.time() + 86400, usegmt=True)
    past = formatdate(time.time() - 86400, usegmt=True)
    values = [tomorrow, "3600", "99999999999999999999", "0", past, "-5", "nan", "1e9", "soon"]
    detail = json.dumps({"type": "https://workd.dev/problems/unavailable", "status": 503,
                         "detail": "no leader"})
    routes = {f"GET /work/r{i}": answer(503, detail, [("Retry-After", v)],
                                        "application/problem+json")
              for i, v in enumerate(values)}
    with HostileServer(routes) as srv:
        for i, v in enumerate(values):
            timed(["get", f"r{i}", "--retry-for", "2s"], srv.url, UNAVAILABLE, 6,
                  f"503 with Retry-After: {v}")
            asked = srv.count("GET", f"/work/r{i}")
            assert 2 <= asked <= 15, \
                f"Retry-After: {v}: asked {asked} times in 2 s (the backoff asks about 5)"


def test_bad_event_streams_end_with_an_error():
    routes = {
        # A line that never ends, data lines of an event that never ends.
        "GET /work/a/stream": endless_stream("data: ", "x" * 65536),
        "GET /work/b/stream": endless_stream("", "data: " + "x" * 1000 + "\n"),
        # Fields the spec ignores, then an event.
        "GET /work/c/stream": event_stream(
            "nonsense\nretry: soon\nid\n: a comment\nevent\ndata\n\nfield: value\n"
            "id: 9\nevent: completed\n"
            'data: {"id": "c", "status": "completed", "result": 1, "at": "t"}\n\n',
            then_hold=True),
    }
    with HostileServer(routes) as srv:
        for w in ("a", "b"):
            r = timed(["tail", "--id", w], srv.url, UNAVAILABLE, 30, f"stream {w}")
            assert "an event longer than" in r.stderr, r.stderr
        r = timed(["tail", "--id", "c", "--json"], srv.url, OK, 20, "stream with odd fields")
        assert json.loads(r.stdout) == {"id": "c", "status": "completed", "result": 1,
                                        "at": "t"}, r.stdout


def test_answers_without_their_fields_or_a_long_poll():
    """An answer without the fields a command reads shows '-', never a
    crash; a long poll answered at once, again and again, is asked again
    after a growing pause, not as fast as the server answers."""
    routes = {"GET /queues": json_answer({"queues": [{"limits": {}}, 7]}),
              "GET /schedules": json_answer({"schedules": [{"last_run": {}}, None]}),
              "GET /cluster": json_answer({"database": {}, "nodes": [{}], "workers": [{}],
                                           "open": {"q": {}}}),
              "GET /work/x": json_answer({"status": "running"}),
              "GET /results": event_stream('data: {}\n\ndata: {"status": "dead"}\n\n')}
    with HostileServer(routes) as srv:
        expect(workd("queues", "limits", "q", server=srv.url), NOT_FOUND, "limits of no queue")
        for args in ("queues", "schedules", "cluster", "workers", "tail --count 2"):
            expect(workd(*args.split(), server=srv.url, timeout=30), OK, args)
        timed(["wait", "x", "--timeout", "3s"], srv.url, TIMEOUT, 8, "a long poll not held")
        asked = srv.count("GET", "/work/x")
        assert 2 <= asked <= 10, f"wait asked {asked} times in 3 s (the pauses allow about 6)"


if __name__ == "__main__":
    run_tests(globals())
