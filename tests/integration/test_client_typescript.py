"""The TypeScript library (clients/typescript) against a real cluster: its own
tests (node --test, clients/typescript/test/) submit, read, wait, cancel and
retry work, follow the results stream across a server restart with nothing
lost or repeated, run Workers that process, report progress, fail and retry,
are cancelled and stop gracefully, and follow one trace from a producer's
span to the worker's span with the OpenTelemetry SDK; Chromium runs a Client
and a Worker in a page (test/browser.mjs). This file gives the node tests a
two-node cluster and a small control endpoint to kill and restart its nodes;
the package is installed from its lock file (scripts/install-client-typescript),
built, and packed."""

import json
import os
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, run_tests, wait_leader  # noqa: E402

PKG = REPO_ROOT / "clients" / "typescript"
FAST = ["--election-interval", "100ms", "--worker-timeout", "2s", "--lease-grace", "1s",
        "--backoff-base", "50ms", "--backoff-max", "200ms", "--heartbeat-interval", "500ms",
        "--sse-keepalive", "2s"]
NODE_TESTS_TIMEOUT = 240
# The cluster wants tokens, so that the tests see the worker-id rules as a
# deployment has them: an admin token for the clients, a worker token shared
# by workers, and one bound to the worker ids ts-bound-*.
ADMIN, WORKER, BOUND = "ts-admin-0123456789abcdef", "ts-worker-0123456789abcde", "ts-bound-0123456789abcdef"
TOKENS = f"admin:{ADMIN} worker:{WORKER} worker[ts-bound-*]:{BOUND}"


def run(argv, what, timeout=300, **kw):
    """Run a command in the package; fail with its output when it fails."""
    r = subprocess.run(argv, cwd=PKG, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{what} failed (exit {r.returncode}):\n{r.stdout}{r.stderr}"
    return r


def install_and_build():
    run([str(REPO_ROOT / "scripts" / "install-client-typescript")], "scripts/install-client-typescript")
    run(["npm", "run", "--silent", "build"], "npm run build (generate the types, tsc)")


class Control(ThreadingHTTPServer):
    """What the node tests do to the cluster: POST /kill/NAME (SIGKILL),
    /start/NAME (again, until ready), /stop/NAME (SIGSTOP: a node that
    hangs), /cont/NAME, /pg-stop/db and /pg-start/db (PostgreSQL)."""

    daemon_threads = True

    def __init__(self, cluster, nodes):
        self.cluster, self.nodes = cluster, nodes
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), ControlHandler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()


def restart_node(cluster, node):
    cluster.restart_server(node)
    wait_leader(node.url)


def pg_start(cluster, nodes):
    cluster.pg_start()
    for n in nodes.values():
        wait_leader(n.url, timeout=30)


# POST /ACTION/NAME: what each action does to the node NAME (or, for the
# database's, to PostgreSQL: any NAME).
NODE_ACTIONS = {
    "kill": lambda cluster, node: node.kill(),
    "start": restart_node,
    "stop": lambda cluster, node: node.suspend(),
    "cont": lambda cluster, node: node.resume(),
}
DB_ACTIONS = {
    "pg-stop": lambda cluster, nodes: cluster.pg_stop(),
    "pg-start": pg_start,
}


class ControlHandler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 - http.server's name
        _, action, name = (self.path.split("/") + ["", ""])[:3]
        srv = self.server
        try:
            with srv.lock:
                if action in DB_ACTIONS:
                    DB_ACTIONS[action](srv.cluster, srv.nodes)
                elif action in NODE_ACTIONS and name in srv.nodes:
                    NODE_ACTIONS[action](srv.cluster, srv.nodes[name])
                else:
                    raise ValueError(f"no such action: {self.path}")
            status, body = 200, {"ok": True}
        except Exception as e:  # noqa: BLE001 - reported to the node test
            status, body = 500, {"error": f"{type(e).__name__}: {e}"}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_node_tests_against_a_cluster(cluster):
    install_and_build()
    a = cluster.start_server("a", extra_args=FAST, env={"WORKD_TOKENS": TOKENS})
    wait_leader(a.url)
    b = cluster.start_server("b", extra_args=FAST, env={"WORKD_TOKENS": TOKENS})
    wait_leader(b.url)
    control = Control(cluster, {"a": a, "b": b})
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKD_")}
    env.update(WORKD_TEST_SERVERS=f"{a.url} {b.url}", WORKD_TEST_NODES="a b",
               WORKD_TEST_CONTROL=control.url, WORKD_TEST_ADMIN_TOKEN=ADMIN,
               WORKD_TEST_WORKER_TOKEN=WORKER, WORKD_TEST_BOUND_TOKEN=BOUND)
    try:
        tests = sorted(str(p.relative_to(PKG)) for p in (PKG / "test").glob("*.test.mjs"))
        r = subprocess.run(["node", "--test", "--test-concurrency=1", "--test-reporter=spec",
                            *tests], cwd=PKG, env=env, capture_output=True, text=True,
                           timeout=NODE_TESTS_TIMEOUT)
    finally:
        control.shutdown()
    print(r.stdout[-20000:], r.stderr[-5000:], sep="\n", flush=True)
    assert r.returncode == 0, f"node --test failed (exit {r.returncode}); its output is above"


def test_in_a_browser(cluster):
    """test/browser.mjs: Chromium loads the built modules from the server's
    origin and runs a Worker and a Client in the page (fetch only, results
    over fetch streaming)."""
    install_and_build()
    r = subprocess.run([str(REPO_ROOT / "scripts" / "install-browser-test")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, ("the browser test cannot run: scripts/install-browser-test "
                               f"failed (exit {r.returncode}):\n{r.stdout}{r.stderr}")
    s = cluster.start_server("s1", extra_args=FAST, env={"WORKD_TOKENS": TOKENS})
    wait_leader(s.url)
    r = subprocess.run(["node", "test/browser.mjs", "--url", s.url, "--token", ADMIN,
                        "--playwright", str(REPO_ROOT / "tests/browser/node_modules/playwright-core"),
                        "--chromium", os.environ.get("WORKD_CHROMIUM", "/usr/bin/chromium")],
                       cwd=PKG, capture_output=True, text=True, timeout=120)
    print(r.stdout, r.stderr, sep="\n", flush=True)
    assert r.returncode == 0, f"the library failed in Chromium (exit {r.returncode}); output above"


def test_npm_pack_installs_offline():
    """`npm pack` makes a tarball with the built ESM and its declarations, which
    installs into a new project without the network and imports (its
    prepack script builds it)."""
    run([str(REPO_ROOT / "scripts" / "install-client-typescript")], "scripts/install-client-typescript")
    with tempfile.TemporaryDirectory(prefix="workd-npm-") as tmp:
        r = run(["npm", "pack", "--json", "--pack-destination", tmp], "npm pack")
        info = json.loads(r.stdout)[0]
        files = {f["path"] for f in info["files"]}
        for want in ("package.json", "README.md", "LICENSE", "dist/index.js", "dist/index.d.ts",
                     "dist/worker.js", "dist/generated/openapi.d.ts"):
            assert want in files, f"the tarball lacks {want}: {sorted(files)}"
        assert not any(f.startswith(("src/", "test/", "node_modules/")) for f in files), \
            f"the tarball should hold the build only: {sorted(files)}"
        proj = Path(tmp) / "app"
        proj.mkdir()
        (proj / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
        r = subprocess.run(["npm", "install", "--offline", "--no-audit", "--no-fund",
                            str(Path(tmp) / info["filename"])], cwd=proj, capture_output=True,
                           text=True, timeout=120)
        assert r.returncode == 0, f"npm install of the tarball failed:\n{r.stdout}{r.stderr}"
        script = ('import { Client, Worker, VERSION } from "workd";'
                  'const c = new Client({ servers: "http://127.0.0.1:1" });'
                  'console.log(JSON.stringify({ v: VERSION, s: c.servers, w: typeof Worker }));')
        r = subprocess.run(["node", "--input-type=module", "-e", script], cwd=proj,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, f"importing the installed package failed:\n{r.stderr}"
        got = json.loads(r.stdout)
        assert got == {"v": info["version"], "s": ["http://127.0.0.1:1"], "w": "function"}, got


if __name__ == "__main__":
    run_tests(globals())
