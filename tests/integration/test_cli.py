"""workd, the command line (cli/, docs/cli.md), run as a user runs it against
real clusters: submit, get, wait, cancel and retry with their exit codes, bulk
submissions, tokens, a list of servers whose first is down, tail resuming
across killed and restarted servers with nothing lost or shown twice, the
per-work stream with progress, the operator's commands, --json that parses,
and --help on every sub-command."""

import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import harness  # noqa: E402
from harness import REPO_ROOT, free_port, run_tests, wait_leader, wait_until  # noqa: E402
from scripted_stream import ScriptedStream  # noqa: E402
from workd import leader_of  # noqa: E402

COMMANDS = ["submit", "get", "list", "wait", "cancel", "retry", "tail", "queues", "schedules",
            "subscriptions", "cluster", "workers"]
# The exit codes of docs/cli.md.
OK, FAILED, USAGE, NOT_FOUND, CONFLICT, UNAVAILABLE, DENIED, TIMEOUT = range(8)


def workd(*args, server=None, token=None, stdin=None, timeout=60, text=True):
    """Runs build/bin/workd ARGS with WORKD_SERVER (and WORKD_TOKEN) set;
    returns the CompletedProcess (text, or bytes when not text)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKD_")}
    if server:
        env["WORKD_SERVER"] = server
    if token:
        env["WORKD_TOKEN"] = token
    return subprocess.run([str(harness.BIN_DIR / "workd"), *map(str, args)], env=env,
                          input=stdin, capture_output=True, text=text, timeout=timeout)


def terminal_safe(data, what):
    """Fails unless bytes a command printed are UTF-8 without anything a
    terminal acts on: no C0 control but the newline, no DEL, no C1 control
    (U+0080..U+009F, or a byte 0x80..0x9f outside UTF-8)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise AssertionError(f"{what}: printed bytes that are not UTF-8 ({e}): {data!r}") from None
    bad = sorted({c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F})
    assert not bad, f"{what}: printed control characters {bad} to the terminal: {data!r}"
    return text


def expect(r, code, what):
    assert r.returncode == code, (f"{what}: exit {r.returncode}, expected {code}\n"
                                  f"stdout: {r.stdout[-1500:]}\nstderr: {r.stderr[-1500:]}")
    return r


def as_json(r, what):
    expect(r, OK, what)
    try:
        return json.loads(r.stdout)
    except ValueError:
        raise AssertionError(f"{what}: --json printed no JSON: {r.stdout[:500]!r}") from None


def test_help_version_and_usage_errors():
    top = expect(workd("--help"), OK, "workd --help")
    for cmd in COMMANDS:
        assert re.search(rf"^  {cmd} ", top.stdout, re.M), f"workd --help does not list {cmd}"
        r = expect(workd(cmd, "--help"), OK, f"workd {cmd} --help")
        assert r.stdout.startswith(f"usage: workd {cmd}"), f"{cmd} --help: {r.stdout[:200]}"
        assert "--server" in r.stdout and "Exit codes" in r.stdout, f"{cmd} --help: {r.stdout}"
        # --help wins over anything else on the line, even a bad flag.
        expect(workd(cmd, "--nope", "--help"), OK, f"workd {cmd} --nope --help")
    version = re.search(r"project\(workd VERSION (\S+)",
                        (REPO_ROOT / "CMakeLists.txt").read_text()).group(1)
    r = expect(workd("--version"), OK, "workd --version")
    assert r.stdout.strip() == f"workd {version}", r.stdout

    expect(workd(), USAGE, "workd without a command")
    expect(workd("frobnicate"), USAGE, "an unknown command")
    r = expect(workd("submit", "--priority", "high", "1"), USAGE, "a flag with a bad value")
    assert "--priority" in r.stderr, r.stderr
    expect(workd("submit", "--frob", "1"), USAGE, "an unknown flag")
    r = expect(workd("submit", "{not json"), USAGE, "a payload that is not JSON")
    assert "--string" in r.stderr, r.stderr
    expect(workd("get"), USAGE, "get without an id")
    expect(workd("queues", "pause"), USAGE, "queues pause without a name")
    expect(workd("cancel", "x", "--all"), USAGE, "ids and a filter at once")
    expect(workd("get", "x", server="ftp://nowhere"), USAGE, "a server that is not http")
    # Nobody listens: 5 at once with --retry-for 0, and after the time given.
    dead = f"http://127.0.0.1:{free_port()}"
    expect(workd("get", "x", "--retry-for", "0", server=dead), UNAVAILABLE, "no server")
    t0 = time.monotonic()
    expect(workd("get", "x", "--retry-for", "1s", server=dead), UNAVAILABLE, "no server (1s)")
    assert 0.9 < time.monotonic() - t0 < 10, "--retry-for 1s was not about a second"


def start(cluster, name="s1", **kw):
    s = cluster.start_server(name, **kw)
    wait_leader(s.url)
    return s


def test_work_commands_and_exit_codes(cluster):
    s = start(cluster)
    cluster.start_worker("demo", s.url, ["--queues", "default", "--demo", "--demo-delay", "50ms"])
    cluster.start_worker("failing", s.url, ["--queues", "failing", "--exec", "exit 3"])
    cluster.start_worker("echo", s.url, ["--queues", "echo", "--exec", "cat"])
    cluster.start_worker("progress", s.url, [
        "--queues", "progress", "--exec",
        'echo 50% >&$WORKD_PROGRESS_FD; sleep 0.5; echo "{\\"done\\": true}"'])
    # The first server of the list is down: the CLI goes on with the next.
    srv = f"http://127.0.0.1:{free_port()},{s.url}"

    w = as_json(workd("submit", "--json", "--id", "w-1", "--priority", "5", "--max-attempts",
                      "2", "--timeout", "30s", "--key", "cust-1", "7", server=srv), "submit")
    assert w == {"id": "w-1", "status": "pending", "created": True} or \
        (w["id"] == "w-1" and w["created"] is True), w
    got = as_json(workd("get", "--json", "w-1", server=srv), "get --json")
    assert (got["priority"], got["max_attempts"], got["timeout_ms"], got["key"],
            got["payload"]) == (5, 2, 30000, "cust-1", 7), got
    r = expect(workd("wait", "w-1", server=srv), OK, "wait for completed work")
    assert "7 * 7 = 49" in r.stdout and "completed" in r.stdout, r.stdout
    r = expect(workd("get", "w-1", server=srv), OK, "get as a table")
    assert re.search(r"^status\s+completed$", r.stdout, re.M), r.stdout
    assert re.search(r'^result\s+"7 \* 7 = 49"$', r.stdout, re.M), r.stdout
    hist = as_json(workd("get", "--events", "--json", "w-1", server=srv), "get --events")
    assert [e["type"] for e in hist["events"]] == ["accepted", "started", "completed"], hist

    # Idempotent by id; another payload under it is a conflict.
    again = as_json(workd("submit", "--json", "--id", "w-1", "7", server=srv), "same again")
    assert again["created"] is False, again
    r = expect(workd("submit", "--id", "w-1", "8", server=srv), CONFLICT, "another payload")
    assert "HTTP 409" in r.stderr, r.stderr
    expect(workd("get", "nope", server=srv), NOT_FOUND, "get of an unknown id")
    expect(workd("retry", "w-1", server=srv), CONFLICT, "retry of completed work")
    # --string, stdin, --wait
    r = expect(workd("submit", "--queue", "echo", "--wait", "--string", "-", stdin="hi\n",
                     server=srv), OK, "submit --wait of text from stdin")
    assert re.search(r'completed\s+1/3\s+"hi"$', r.stdout, re.M), r.stdout

    # Scheduled work: still open when wait runs out; cancelled; cancelled again.
    expect(workd("submit", "--id", "later", "--delay", "1h", "1", server=srv), OK, "delayed")
    assert as_json(workd("get", "--json", "later", server=srv), "get")["status"] == "scheduled"
    t0 = time.monotonic()
    expect(workd("wait", "--timeout", "500ms", "later", server=srv), TIMEOUT, "wait timing out")
    assert time.monotonic() - t0 < 10
    c = as_json(workd("cancel", "--json", "later", server=srv), "cancel")
    assert c == {"id": "later", "status": "cancelled"}, c
    expect(workd("cancel", "later", server=srv), CONFLICT, "cancel of cancelled work")
    expect(workd("wait", "later", server=srv), FAILED, "wait for cancelled work")

    # Dead work: wait says so, retry reopens it.
    expect(workd("submit", "--queue", "failing", "--id", "bad", "--max-attempts", "1", "1",
                 server=srv), OK, "submit failing work")
    r = expect(workd("wait", "--json", "bad", server=srv), FAILED, "wait for dead work")
    assert json.loads(r.stdout)["status"] == "dead", r.stdout
    assert as_json(workd("retry", "--json", "bad", server=srv), "retry") == \
        {"id": "bad", "status": "pending"}
    expect(workd("wait", "bad", server=srv), FAILED, "wait for the retried work (dead again)")
    retried = as_json(workd("retry", "--all", "--queue", "failing", "--json", server=srv),
                      "retry --all")
    assert retried == {"retried": 1}, retried

    # Bulk: JSON lines of payloads, then of whole items; ids printed by --quiet.
    r = expect(workd("submit", "--bulk", "--quiet", "--per-request", "3", "--priority", "2",
                     stdin="".join(f"{i}\n" for i in range(7)) + "\n", server=srv), OK, "bulk")
    ids = r.stdout.split()
    assert len(ids) == 7 and len(set(ids)) == 7, r.stdout
    r = expect(workd("wait", *ids, server=srv), OK, "wait for the bulk")
    assert "6 * 6 = 36" in r.stdout, r.stdout
    items = "".join(json.dumps({"id": f"item-{i}", "payload": i, "queue": "bulkq"}) + "\n"
                    for i in range(3))
    lines = expect(workd("submit", "--bulk", "--items", "--json", stdin=items, server=srv),
                   OK, "bulk --items").stdout.splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["item-0", "item-1", "item-2"], lines
    listed = as_json(workd("list", "--json", "--queue", "bulkq", server=srv), "list")
    assert sorted(x["id"] for x in listed["items"]) == ["item-0", "item-1", "item-2"], listed
    r = expect(workd("submit", "--bulk", stdin="1\n{oops\n", server=srv), USAGE, "bad line")
    assert "line 2" in r.stderr, r.stderr

    # The per-work stream: its progress, then its end (wait's exit code).
    expect(workd("submit", "--queue", "progress", "--id", "p-1", "1", server=srv), OK, "p-1")
    r = expect(workd("tail", "--id", "p-1", "--progress", "--json", server=srv, timeout=30),
               OK, "tail --id --progress")
    events = [json.loads(x) for x in r.stdout.splitlines()]
    assert [e["status"] for e in events][-1] == "completed", events
    assert any(e["status"] == "progress" and e["fraction"] == 0.5 for e in events), events
    r = expect(workd("tail", "--id", "p-1", server=srv, timeout=30), OK, "tail --id")
    assert r.stdout.count("\n") == 1 and "completed" in r.stdout, r.stdout
    expect(workd("tail", "--id", "later", server=srv, timeout=30), FAILED, "tail --id cancelled")


# Text made to drive a terminal: set its title (OSC ... BEL), clear the
# screen (ESC [2J), CSI and OSC as C1 controls (U+009B, U+009D), DEL, and a
# carriage return that would let "spoof" overwrite the line.
EVIL = "\x1b]0;owned\x07\x1b[2J\u009b31m\u009d8;;x\x07\x7f\rspoof"
# A job that fails with it on stderr (so in its error), in the shell's octal.
EVIL_EXEC = (r"printf '\033]0;owned\007\033[2J\302\23331m\302\2358;;x\007\177\rspoof\n' >&2;"
             " exit 3")


def test_server_text_is_escaped_for_a_terminal(cluster):
    """A work item's error, payload and result can hold any text (a worker's
    stderr, a producer's JSON): every command that shows them to people
    escapes what a terminal would act on (ESC is shown as \\x1b, CSI as
    \\u009b), while --json prints the API's values unchanged."""
    s = start(cluster)
    cluster.start_worker("evil", s.url, ["--queues", "evil", "--exec", EVIL_EXEC])
    cluster.start_worker("echo", s.url, ["--queues", "echo", "--exec", "cat"])
    payload = json.dumps(EVIL)
    expect(workd("submit", "--queue", "evil", "--id", "bad-1", "--max-attempts", "1", payload,
                 server=s.url), OK, "submit work that fails with control characters")
    expect(workd("submit", "--queue", "echo", "--id", "ok-1", payload, server=s.url), OK,
           "submit work whose result is its payload")
    expect(workd("wait", "bad-1", "ok-1", server=s.url), FAILED, "wait for both")
    api = {w: harness.http("GET", f"{s.url}/work/{w}").json() for w in ("bad-1", "ok-1")}
    assert api["bad-1"]["last_error"] == "exit 3: " + EVIL, api["bad-1"]
    assert api["ok-1"]["result"] == EVIL, api["ok-1"]

    shown = {}
    for args, code in [("wait bad-1", FAILED), ("wait ok-1", OK), ("get bad-1 ok-1", OK),
                       ("get --events bad-1", OK), ("list --queue evil", OK),
                       ("tail --id bad-1", FAILED), ("tail --id ok-1", OK)]:
        r = expect(workd(*args.split(), server=s.url, text=False, timeout=30), code, args)
        shown[args] = terminal_safe(r.stdout, f"workd {args}")
        terminal_safe(r.stderr, f"workd {args} (stderr)")
    # What was there is shown, escaped: ESC, BEL, C1, DEL, CR; in a result's
    # JSON, ESC, BEL and CR are JSON's escapes already (jansson's).
    error = r"\x1b]0;owned\x07\x1b[2J\u009b31m\u009d8;;x\x07\x7f\rspoof"
    result = r"\u001B]0;owned\u0007\u001B[2J\u009b31m\u009d8;;x\u0007\x7f\rspoof"
    for args, want in [("wait bad-1", error), ("get bad-1 ok-1", error),
                       ("list --queue evil", error), ("tail --id bad-1", error),
                       ("wait ok-1", result), ("get bad-1 ok-1", result),
                       ("tail --id ok-1", result), ("get --events bad-1", result)]:
        assert want in shown[args], f"workd {args} does not show {want}: {shown[args]!r}"

    # --json is the API's JSON, the control characters in it as they are.
    for w in ("bad-1", "ok-1"):
        got = as_json(workd("get", "--json", w, server=s.url), f"get --json {w}")
        assert got == api[w], f"get --json {w} is not the API's answer:\n{got}\n{api[w]}"
    r = expect(workd("tail", "--id", "bad-1", "--json", server=s.url, timeout=30), FAILED,
               "tail --id --json")
    assert json.loads(r.stdout.splitlines()[-1])["error"] == "exit 3: " + EVIL, r.stdout


def test_tokens_and_scopes(cluster):
    client, admin = "c" * 24, "a" * 24
    s = start(cluster, extra_args=["--tokens", f"client:{client} admin:{admin}"])
    r = expect(workd("submit", "1", server=s.url), DENIED, "no token")
    assert "HTTP 401" in r.stderr, r.stderr
    w = as_json(workd("submit", "--json", "--id", "t-1", "1", server=s.url, token=client),
                "submit with the client token")
    assert w["id"] == "t-1"
    expect(workd("cancel", "t-1", server=s.url, token=client), DENIED, "cancel without admin")
    expect(workd("cancel", "t-1", "--token", admin, server=s.url), OK, "cancel as admin")


def test_tail_resumes_across_server_restarts(cluster):
    """tail follows node b, which is killed; it resumes on a, which is killed
    in turn once b is back: every result once, in order, none missing."""
    a = start(cluster, "a")
    b = start(cluster, "b")
    both = f"{a.url},{b.url}"
    cluster.start_worker("w1", both, ["--demo", "--demo-delay", "10ms", "--concurrency", "4"])
    lines, box = [], {}
    tail = subprocess.Popen([str(harness.BIN_DIR / "workd"), "tail", "--json", "--after", "0",
                             "--queue", "tailq", "--count", "30", "--server", f"{b.url},{a.url}"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def read():
        for line in tail.stdout:
            lines.append(json.loads(line))
        box["err"] = tail.stderr.read()
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    submitted = []

    def submit(n, server):
        batch = [f"tail-{len(submitted) + i}" for i in range(n)]
        items = "".join(json.dumps({"id": i, "payload": 2, "queue": "tailq"}) + "\n"
                        for i in batch)
        expect(workd("submit", "--bulk", "--items", "--quiet", stdin=items, server=server),
               OK, "submit to tailq")
        expect(workd("submit", "--queue", "other", "3", server=server), OK, "other queue")
        submitted.extend(batch)

    try:
        submit(10, both)
        wait_until(lambda: len(lines) >= 10, 30, what="tail to show the first 10 results")
        b.kill()  # the node tail reads from
        submit(10, a.url)
        wait_until(lambda: len(lines) >= 20, 30,
                   what=f"tail to resume on node a after b died ({len(lines)} lines)")
        cluster.restart_server(b)
        wait_leader(b.url)
        a.kill()  # now the one it reads from, and the leader
        new_leader = wait_until(lambda: leader_of([b.url]), 30, what="b to lead")
        submit(10, new_leader)
        assert tail.wait(60) == 0, f"tail exited {tail.returncode}: {box.get('err')}"
    finally:
        if tail.poll() is None:
            tail.kill()
            tail.wait()
    reader.join(10)
    ids = [e["id"] for e in lines]
    seqs = [e["seq"] for e in lines]
    assert len(ids) == 30, f"tail showed {len(ids)} events, not 30: {ids}"
    assert len(set(ids)) == 30, f"tail showed an event twice: {ids}"
    assert set(ids) == set(submitted), f"missing {set(submitted) - set(ids)}"
    assert seqs == sorted(seqs), f"tail's events are out of order: {seqs}"
    assert all(e["status"] == "completed" and e["queue"] == "tailq" for e in lines), lines
    assert "resuming after event" in box.get("err", ""), box.get("err")


def test_tail_resumes_from_an_event_id_of_every_shard():
    """tail takes --after as an event id of several shards and resumes with
    the last id it received, text for text, up to a cursor of all 64 shards
    (1279 bytes)."""
    every_shard = ".".join(str(10**18 + i) for i in range(64))
    next_one = ".".join(str(10**18 + i + (i == 5)) for i in range(64))
    with ScriptedStream([[("3.2", 2), ("4.2", 2)], [(every_shard, 3)], [(next_one, 4)]]) as srv:
        r = workd("tail", "--json", "--after", "3.1", "--count", "4", server=srv.url, timeout=30)
        expect(r, OK, "tail of a stream whose ids are cursors of several shards")
        for bad in ["3..1", "3.", ".3", "x", "-1", "1" * 20, ".".join(["1"] * 65)]:
            expect(workd("tail", "--after", bad, server=srv.url), USAGE, f"tail --after {bad}")
    shown = [json.loads(line)["result"] for line in r.stdout.splitlines()]
    assert shown == ["3.2", "4.2", every_shard, next_one], f"tail showed {shown}"
    assert srv.requests == [(None, "3.1"), ("4.2", "3.1"), (every_shard, "3.1")], \
        f"tail did not resume from the last event id: {srv.requests}"
    assert f"resuming after event {every_shard}" in r.stderr, r.stderr


def test_queues_schedules_subscriptions_cluster(cluster):
    s = start(cluster)
    cluster.start_worker("demo-w", s.url, ["--demo", "--demo-delay", "10ms"])
    srv = s.url
    paused = as_json(workd("queues", "pause", "default", "--json", server=srv), "pause")
    assert paused["paused"] is True and paused["queue"] == "default", paused
    expect(workd("submit", "--id", "q-1", "4", server=srv), OK, "submit to a paused queue")
    queues = as_json(workd("queues", "--json", server=srv), "queues --json")
    default = next(q for q in queues["queues"] if q["queue"] == "default")
    assert default["limits"]["paused"] is True, default
    r = expect(workd("queues", server=srv), OK, "queues as a table")
    assert re.search(r"^QUEUE\s+PENDING", r.stdout) and re.search(r"^default\s+", r.stdout, re.M)
    expect(workd("wait", "--timeout", "300ms", "q-1", server=srv), TIMEOUT, "paused: not run")
    expect(workd("queues", "resume", "default", server=srv), OK, "resume")
    expect(workd("wait", "q-1", server=srv), OK, "wait after resume")

    limits = as_json(workd("queues", "limits", "default", "--max-running", "2", "--rate",
                           "50/1", "--key-weight", "cust-1=3", "--json", server=srv), "limits")
    assert (limits["max_running"], limits["rate"], limits["key_weights"]) == \
        (2, {"limit": 50, "per": 1}, {"cust-1": 3}), limits
    cleared = as_json(workd("queues", "limits", "default", "--max-running", "none", "--json",
                            server=srv), "clear a limit")
    assert cleared["max_running"] is None and cleared["rate"] is not None, cleared
    r = expect(workd("queues", "limits", "default", server=srv), OK, "show the limits")
    assert re.search(r"^key_weights\s+\{\"cust-1\": ?3\}", r.stdout, re.M), r.stdout
    expect(workd("queues", "limits", "default", "--rate", "fast", server=srv), USAGE, "bad rate")
    expect(workd("queues", "keys", "default", server=srv), OK, "keys")

    expect(workd("schedules", "set", "nightly", "--cron", "30 3 * * *", "--timezone",
                 "Europe/Berlin", "--payload", "9", "--queue", "reports", server=srv), OK, "set")
    listed = as_json(workd("schedules", "--json", server=srv), "schedules --json")
    assert [x["name"] for x in listed["schedules"]] == ["nightly"], listed
    one = as_json(workd("schedules", "get", "nightly", "--json", server=srv), "get")
    assert one["work"]["payload"] == 9 and len(one["next"]) == 5, one
    assert as_json(workd("schedules", "pause", "nightly", "--json", server=srv),
                   "pause")["paused"] is True
    expect(workd("schedules", "resume", "nightly", server=srv), OK, "resume")
    expect(workd("schedules", "delete", "nightly", server=srv), OK, "delete")
    expect(workd("schedules", "get", "nightly", server=srv), NOT_FOUND, "deleted")
    expect(workd("schedules", "set", "x", "--cron", "bad cron", server=srv), USAGE, "bad cron")

    secret = "whsec_" + "A" * 32
    expect(workd("subscriptions", "set", "billing", "--url", "https://billing.example/hooks",
                 "--secret", secret, "--queues", "invoices", server=srv), OK, "subscribe")
    subs = as_json(workd("subscriptions", "--json", server=srv), "subscriptions --json")
    assert [(x["name"], x["queues"]) for x in subs["subscriptions"]] == \
        [("billing", ["invoices"])], subs
    r = expect(workd("subscriptions", server=srv), OK, "subscriptions as a table")
    assert re.search(r"^billing\s+https://billing.example/hooks", r.stdout, re.M), r.stdout
    expect(workd("subscriptions", "set", "billing", "--url", "https://billing.example/hooks",
                 "--secret", secret, "--after", "0", server=srv), OK, "an event id as --after")
    expect(workd("subscriptions", "set", "billing", "--url", "https://billing.example/hooks",
                 "--secret", secret, "--after", "1..2", server=srv), USAGE, "a bad --after")
    expect(workd("subscriptions", "delete", "billing", server=srv), OK, "delete")
    expect(workd("subscriptions", "get", "billing", server=srv), NOT_FOUND, "deleted")

    cl = as_json(workd("cluster", "--json", server=srv), "cluster --json")
    assert cl["leader"] == s.url, cl
    r = expect(workd("cluster", server=srv), OK, "cluster as text")
    assert re.search(rf"^leader\s+{re.escape(s.url)}$", r.stdout, re.M), r.stdout
    workers = as_json(workd("workers", "--json", server=srv), "workers --json")
    assert [w["id"] for w in workers] == ["demo-w"], workers
    r = expect(workd("workers", server=srv), OK, "workers as a table")
    assert re.search(r"^demo-w\s+2\s+0\s+\(all\)", r.stdout, re.M), r.stdout


if __name__ == "__main__":
    run_tests(globals())
