"""The web dashboard in a real browser: Debian's Chromium driven by
playwright-core (tests/browser/dashboard.mjs) against a real cluster with a
demo worker. Submits from the form and sees the result in the live feed (also
across a restart of the node the page is on), opens the work page, cancels,
retries, pages through the work list; then, against a server with tokens, the
token prompt and the admin token. Screenshots go to build/test-artifacts/.

Needs /usr/bin/chromium (scripts/install-deps) and tests/browser/node_modules
(scripts/install-browser-test, run from here): when either cannot be had, the
test fails, it does not skip."""

import base64
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
import harness  # noqa: E402
from harness import REPO_ROOT, free_port, http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import JSON, expect, submit, wait_status  # noqa: E402

BROWSER_DIR = REPO_ROOT / "tests" / "browser"
SCRIPT = BROWSER_DIR / "dashboard.mjs"
WORKER_TOKEN = "worker-token-0123456789abcdef"
ADMIN_TOKEN = "admin-token-0123456789abcdef"
TOKENS = f"worker:{WORKER_TOKEN} admin:{ADMIN_TOKEN}"
BROWSER_TIMEOUT = 180  # seconds for one run of dashboard.mjs
CHROMIUM = os.environ.get("WORKD_CHROMIUM", "/usr/bin/chromium")


def artifacts():
    """build/test-artifacts (next to the bin directory under test)."""
    d = harness.BIN_DIR.parent / "test-artifacts"
    d.mkdir(parents=True, exist_ok=True)
    return d


def ensure_browser():
    """Runs scripts/install-browser-test; a missing Chromium or node module fails."""
    r = subprocess.run([str(REPO_ROOT / "scripts" / "install-browser-test")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, (
        "the browser test cannot run: scripts/install-browser-test failed "
        f"(exit {r.returncode}):\n{r.stdout}{r.stderr}")


def run_browser(args, on_line=None, timeout=BROWSER_TIMEOUT):
    """Runs dashboard.mjs with args, echoing its output. on_line(line) may
    answer a "@@tag" line with a string written to the script's stdin.
    Returns the output; fails the test when the script fails."""
    proc = subprocess.Popen(["node", str(SCRIPT), "--chromium", CHROMIUM, *args], cwd=BROWSER_DIR,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, bufsize=1)
    lines = queue.Queue()

    def pump():
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)
    threading.Thread(target=pump, daemon=True).start()
    out, deadline = [], time.monotonic() + timeout
    try:
        while True:
            try:
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"dashboard.mjs still running after {timeout}s:\n"
                                     + "".join(out)) from None
            if line is None:
                break
            out.append(line)
            print(f"  browser| {line}", end="", flush=True)
            if line.startswith("@@") and on_line:
                proc.stdin.write(on_line(line.strip()[2:]) + "\n")
                proc.stdin.flush()
        rc = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert rc == 0, f"the browser run failed (exit {rc}); see the output above"
    return "".join(out)


def wait_worker(url, worker, headers=None):
    def listed():
        r = http("GET", url + "/cluster", headers=headers)
        return r.status == 200 and any(w["id"] == worker for w in r.json()["workers"])
    wait_until(listed, 15, what=f"{worker} in GET /cluster")


def test_dashboard_is_served(cluster):
    """GET / and /dashboard/FILE from the binary: types, caching, 404."""
    s = cluster.start_server("s1", env={"WORKD_TOKENS": TOKENS})
    r = expect(http("GET", s.url + "/"), 200, "GET / (open even with tokens)")
    assert r.headers["Content-Type"] == "text/html; charset=utf-8", r.headers
    assert r.headers["Cache-Control"] == "no-cache", r.headers
    assert b"/dashboard/app.js" in r.body and b"/dashboard/app.css" in r.body, r.text[:300]
    for name, ctype in (("app.js", "text/javascript; charset=utf-8"),
                        ("app.css", "text/css; charset=utf-8"),
                        ("index.html", "text/html; charset=utf-8")):
        a = expect(http("GET", f"{s.url}/dashboard/{name}"), 200, name)
        assert a.headers["Content-Type"] == ctype, (name, a.headers)
        assert a.headers["Cache-Control"] == "no-cache", (name, a.headers)
        assert a.body == (REPO_ROOT / "dashboard" / name).read_bytes(), \
            f"{name} differs from dashboard/{name}: rebuild?"
        again = http("GET", f"{s.url}/dashboard/{name}",
                     headers={"If-None-Match": a.headers["ETag"]})
        assert again.status == 304 and not again.body, again
    nf = expect(http("GET", s.url + "/dashboard/nope.js"), 404, "an unknown file")
    assert nf.headers["Content-Type"] == "application/problem+json", nf.headers
    assert nf.json()["type"].endswith("/not-found"), nf.json()
    expect(http("GET", s.url + "/dashboard/../openapi.yaml"), 404, "no way out of the table")
    expect(http("POST", s.url + "/"), 405, "POST /")


def test_dashboard_in_chromium(cluster):
    ensure_browser()
    # The page is on the follower; the test restarts it to cut the feed.
    lead = cluster.start_server("a", extra_args=["--webhook-allow-networks", "127.0.0.0/8"])
    wait_leader(lead.url)
    page_node = cluster.start_server("b", extra_args=["--webhook-allow-networks", "127.0.0.0/8"])
    wait_leader(page_node.url)
    cluster.start_worker("w1", lead.url, ["--demo", "--demo-delay", "50ms"])
    wait_worker(lead.url, "w1")

    def restart_page_node(tag):
        assert tag == "restart-feed", tag
        page_node.kill()
        ids = [submit(lead.url, {"payload": n})["id"] for n in (11, 12, 13)]
        for work_id in ids:
            wait_status(lead.url, work_id, "completed")
        cluster.restart_server(page_node)
        return json.dumps({"ids": ids})

    # A webhook subscription whose receiver is not there: the panel shows it failing.
    expect(http("PUT", lead.url + "/subscriptions/hooks-down",
                {"url": f"http://127.0.0.1:{free_port()}/", "after": 0,
                 "secret": "whsec_" + base64.b64encode(os.urandom(32)).decode()},
                {"Content-Type": "application/json"}), 200, "PUT a subscription")
    shot = artifacts() / "dashboard.png"
    run_browser(["--url", page_node.url, "--worker", "w1", "--screenshot", str(shot),
                 "--rendezvous", "--subscription", "hooks-down"], on_line=restart_page_node)
    assert shot.stat().st_size > 10000, f"{shot} looks empty"
    print(f"screenshots: {shot}, {shot.with_name('dashboard-work.png')}")


def test_dashboard_of_a_sharded_cluster_in_chromium(cluster):
    """Two shards on two nodes: the cluster panel's shards table, and the whole
    walk (the form, the live feed merging both shards' results, the work
    page) as on a cluster of one shard."""
    ensure_browser()
    args = ["--shards", "2"]
    a = cluster.start_server("a", extra_args=args)
    b = cluster.start_server("b", extra_args=args)
    for s in (a, b):
        wait_leader(s.url)
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_shards") == "2", 20,
               what="both shards to elect a leader")
    cluster.start_worker("w1", a.url, ["--demo", "--demo-delay", "50ms"])
    wait_worker(a.url, "w1")
    shot = artifacts() / "dashboard-shards.png"
    run_browser(["--url", b.url, "--worker", "w1", "--screenshot", str(shot), "--shards", "2"])


def test_dashboard_with_tokens(cluster):
    ensure_browser()
    s = cluster.start_server("s1", env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    cluster.start_worker("w1", s.url, ["--demo", "--demo-delay", "50ms"],
                         env={"WORKD_TOKEN": WORKER_TOKEN})
    wait_worker(s.url, "w1", {"Authorization": f"Bearer {ADMIN_TOKEN}"})
    shot = artifacts() / "dashboard-auth.png"
    run_browser(["--url", s.url, "--worker", "w1", "--screenshot", str(shot),
                 "--token", ADMIN_TOKEN])
    log = s.log_text()
    assert ADMIN_TOKEN not in log and WORKER_TOKEN not in log, "a token appeared in the log"


if __name__ == "__main__":
    run_tests(globals())
