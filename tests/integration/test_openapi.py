"""openapi.yaml against the real server: every answer of a leader, a
follower and a node with bearer tokens, good requests and bad, must be
documented for its route (status, headers, content type) and its body must
validate against the documented schema; the results stream's messages and
data too. The other way round: every operation and every documented status
must have been seen (except the few that cannot be provoked here), and the
server's route table (server/frontend/api.c) must be exactly the operations
of openapi.yaml, each with the scope its `security` names.

Needs python3-yaml and python3-jsonschema (Debian); a Python without them
(a pyenv one first in PATH) re-runs this file with /usr/bin/python3."""

import os
import sys

try:
    import jsonschema
    import yaml
except ImportError:
    if os.path.exists("/usr/bin/python3") and \
            os.path.realpath(sys.executable) != os.path.realpath("/usr/bin/python3"):
        os.execv("/usr/bin/python3", ["/usr/bin/python3", *sys.argv])
    raise

import datetime  # noqa: E402
from http.client import HTTPConnection  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import socket  # noqa: E402
import time  # noqa: E402
import urllib.parse  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import (REPO_ROOT, Headers, Response, http, run_tests, wait_leader,  # noqa: E402
                     wait_until)

SPEC_FILE = REPO_ROOT / "openapi.yaml"
API_C = REPO_ROOT / "server" / "frontend" / "api.c"
DASHBOARD_DIR = REPO_ROOT / "dashboard"
# Content types of the dashboard's files, by extension (cmake/embed_dashboard.cmake).
DASHBOARD_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                   ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml",
                   ".png": "image/png", ".ico": "image/x-icon"}
JSON = {"Content-Type": "application/json"}
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options", "trace")
UNROUTED = "x-workd-unrouted-responses"
MAX_BODY = 8192   # --max-body of the leader and the follower
MAX_BATCH = 10    # --max-batch of the leader
MAX_OPEN = 40     # --max-open of the leader
# Documented statuses this test cannot provoke: PostgreSQL refusing a query,
# a server built without dashboard/index.html, and the ones below.
INFEASIBLE = {("GET", "/work", "500"), ("GET", "/work/{id}", "500"),
              ("GET", "/work/{id}/events", "500"), ("GET", "/queues", "500"),
              ("GET", "/queues/{queue}/keys", "500"), ("GET", "/activity", "500"),
              ("GET", "/", "500"),
              # worker-id-taken on a heartbeat or pull needs a leader with tokens
              # (here only a follower has them): test_hostile_core.py sends them.
              ("PUT", "/workers/{worker_id}", "409"), ("POST", "/workers/{worker_id}/pull", "409"),
              # Past --max-workers, and a reply over --max-reply-bytes:
              # test_budgets.py provokes them.
              ("PUT", "/workers/{worker_id}", "429"), ("POST", "/workers/{worker_id}/pull", "429"),
              ("GET", "/cluster", "502"),
              # 64 subscriptions: test_webhooks.py has no need to make that many.
              ("PUT", "/subscriptions/{name}", "409")}
# Tokens of the node started with authentication on (WORKD_TOKENS).
TOKENS = {"client": "client-token-0123456789", "worker": "worker-token-0123456789",
          "admin": "admin-token-0123456789ab"}
# The scope field of api_routes[] (auth.h), as the role openapi.yaml names.
ROUTE_SCOPES = {"SCOPE_NONE": None, "SCOPE_CLIENT": "client", "SCOPE_WORKER": "worker",
                "SCOPE_ADMIN": "admin"}
SECURITY_SCHEMES = {"bearerAuth", "accessToken"}
# Problems answered from a request's head before any operation runs (http.c):
# documented under x-workd-unrouted-responses whatever the path.
HEAD_KINDS = {"bad-request", "token-in-url", "unknown-parameter", "repeated-parameter",
              "forwarding-refused", "not-implemented"}
SECRET = None  # the cluster secret of the running test's nodes


# ------------------------------------------------------------------ the spec

def _deref(node, root, chain=()):
    """node with every local $ref replaced by (a copy of) its target."""
    if isinstance(node, list):
        return [_deref(v, root, chain) for v in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), f"only local $refs are supported: {ref}"
        assert ref not in chain, f"$ref cycle: {' -> '.join(chain + (ref,))}"
        target = root
        for part in ref[2:].split("/"):
            target = target[part.replace("~1", "/").replace("~0", "~")]
        extra = {k: v for k, v in node.items() if k != "$ref"}
        out = _deref(target, root, chain + (ref,))
        if extra:  # sibling keywords of a $ref (3.1 allows them)
            out = {**out, **_deref(extra, root, chain)} if not isinstance(out, bool) else out
        return out
    return {k: _deref(v, root, chain) for k, v in node.items()}


def load_spec():
    raw = yaml.safe_load(SPEC_FILE.read_text())
    assert str(raw.get("openapi", "")).startswith("3.1"), "openapi.yaml must be OpenAPI 3.1"
    return raw, _deref(raw, raw)


def operations(spec):
    """{(METHOD, template): operation} of the spec."""
    ops = {}
    for template, item in spec["paths"].items():
        for method in HTTP_METHODS:
            if method in item:
                ops[(method.upper(), template)] = item[method]
    return ops


def norm_template(path):
    """'/work/{id}' and '/work/:id' both become '/work/{}'."""
    return re.sub(r"\{[^}/]+\}|:[A-Za-z_]+", "{}", path)


def api_routes():
    """(method, pattern, name, json_body, scope, query) of every row of api_routes
    in api.c; scope is None for an open route, else client, worker or admin;
    query is the set of query parameters the route takes, None for any."""
    src = API_C.read_text()
    m = re.search(r"const Route api_routes\[\]\s*=\s*\{(.*?)\n\};", src, re.S)
    assert m, "api_routes[] not found in server/frontend/api.c"
    # {"METHOD", "/pattern", handler, "name", json_body, SCOPE_X, "query words" | NULL}
    row = (r'\{\s*"([A-Z]+)"\s*,\s*"([^"]+)"\s*,\s*\w+\s*,\s*"(\w+)"\s*,'
           r'\s*(true|false)\s*,\s*(SCOPE_[A-Z]+)\s*,\s*("[a-z_ ]*"|NULL)\s*\}')
    rows = re.findall(row, m.group(1))
    assert len(rows) == m.group(1).count("{"), "a row of api_routes[] was not understood"
    for *_, scope, _ in rows:
        assert scope in ROUTE_SCOPES, f"unknown scope {scope} in api_routes[]"
    return [(meth, pat, name, jb == "true", ROUTE_SCOPES[scope],
             None if q == "NULL" else set(q.strip('"').split()))
            for meth, pat, name, jb, scope, q in rows]


def op_scope(op, where="operation"):
    """The scope an operation's `security` asks for (None: open). Each protected
    operation takes the token as a bearer header, and /results also as
    ?access_token= (api.c's query list says which)."""
    assert "security" in op, f"{where}: no `security` (open routes say `security: []`)"
    sec = op["security"]
    if not sec:
        return None
    assert all(len(req) == 1 for req in sec), f"{where}: one scheme per requirement: {sec}"
    schemes = [name for req in sec for name in req]
    assert "bearerAuth" in schemes and set(schemes) <= SECURITY_SCHEMES and \
        len(schemes) == len(set(schemes)), \
        f"{where}: security must offer bearerAuth, and may offer accessToken, once: {sec}"
    roles = {tuple(roles) for req in sec for roles in req.values()}
    assert len(roles) == 1 and len(next(iter(roles))) == 1, \
        f"{where}: every scheme must name the same single scope: {sec}"
    return next(iter(roles))[0]


def _rfc3339(value):
    if not isinstance(value, str):
        return True
    rfc3339 = r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})"
    if not re.fullmatch(rfc3339, value):
        return False
    datetime.datetime.fromisoformat(re.sub(r"[Zz]$", "+00:00", value.replace("t", "T")))
    return True


FORMATS = jsonschema.FormatChecker(formats=())
FORMATS.checks("date-time", raises=ValueError)(_rfc3339)


def validate(instance, schema, what):
    v = jsonschema.Draft202012Validator(schema, format_checker=FORMATS)
    errors = sorted(v.iter_errors(instance), key=lambda e: list(e.absolute_path))
    if errors:
        def why(e):  # for oneOf/anyOf, the reason of the closest branch
            while e.context:
                e = jsonschema.exceptions.best_match(e.context)
            return f"at {'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message[:300]}"
        detail = "; ".join(why(e) for e in errors[:5])
        raise AssertionError(f"{what}: body does not match the documented schema: {detail}\n"
                             f"body: {json.dumps(instance)[:800]}")


# ------------------------------------------------------------- the contract

class Contract:
    """Checks answers against the spec and remembers what was seen."""

    def __init__(self):
        self.raw, self.spec = load_spec()
        self.ops = operations(self.spec)
        self.templates = sorted({t for _, t in self.ops})
        self.unrouted = self.spec[UNROUTED]
        self.seen = {key: set() for key in self.ops}
        self.unrouted_seen = set()

    def template_of(self, path):
        for t in self.templates:
            rx = "^" + re.sub(r"\\\{[^}/]+\\\}", "[^/]+", re.escape(t)) + "$"
            if re.match(rx, path):
                return t
        return None

    def methods_of(self, template):
        """The methods a path answers: its operations', and HEAD beside GET."""
        methods = {m for m, t in self.ops if t == template}
        return methods | {"HEAD"} if "GET" in methods else methods

    def check(self, method, url, resp, stream=False):
        """Asserts resp is documented for method+url and valid; returns resp."""
        path = urllib.parse.urlsplit(url).path or "/"
        template = self.template_of(path)
        status = str(resp.status)
        what = f"{method} {path} -> {status}"
        # HEAD is documented as its GET (the answer without the body).
        op_method = "GET" if method == "HEAD" and ("GET", template) in self.ops else method
        kind = ""
        if resp.headers.get("Content-Type") == "application/problem+json" and resp.body:
            kind = json.loads(resp.body).get("type", "").rsplit("/", 1)[-1]
        if kind in HEAD_KINDS:
            # Refused from the head of the request, whatever its path.
            assert status in self.unrouted, f"{what}: {kind} is not under {UNROUTED}"
            self.unrouted_seen.add(status)
            self._check_response(self.unrouted[status], method, resp, what, stream)
            return resp
        if template is None or (op_method, template) not in self.ops:
            # Answered before reaching an operation.
            want = {"404"} if template is None else {"405"}
            assert status in want | {"413"}, \
                f"{what}: undocumented (no operation; expected one of {sorted(want | {'413'})})"
            if status == "405":
                allow = {m.strip() for m in resp.headers.get("Allow", "").split(",") if m.strip()}
                assert allow == self.methods_of(template), \
                    f"{what}: Allow {allow} != documented methods {self.methods_of(template)}"
            self.unrouted_seen.add(status)
            self._check_response(self.unrouted[status], method, resp, what, stream)
            return resp
        op = self.ops[(op_method, template)]
        assert status in op["responses"], \
            f"{what}: status not documented for {op_method} {template} " \
            f"(documented: {sorted(op['responses'])}); body {resp.body[:300]!r}"
        self.seen[(op_method, template)].add(status)
        self._check_response(op["responses"][status], method, resp, what, stream)
        return resp

    def _check_response(self, doc, method, resp, what, stream):
        for name, h in (doc.get("headers") or {}).items():
            value = resp.headers.get(name)
            if value is None:
                assert not h.get("required"), f"{what}: required header {name} is missing"
                continue
            schema = h.get("schema", {})
            if schema.get("type") == "integer":
                assert re.fullmatch(r"-?\d+", value), \
                    f"{what}: header {name}: {value!r} is not an integer"
                value = int(value)
            validate(value, schema, f"{what} header {name}")
        content = doc.get("content") or {}
        ctype = resp.headers.get("Content-Type")
        if not content:
            assert not resp.body and ctype is None, \
                f"{what}: documented without a body, got {ctype} {resp.body[:200]!r}"
            return
        assert ctype, f"{what}: no Content-Type (documented: {sorted(content)})"
        key = ctype if ctype in content else ctype.split(";")[0].strip()
        assert key in content, f"{what}: Content-Type {ctype!r} not documented ({sorted(content)})"
        if stream or method == "HEAD":
            return
        base = key.split(";")[0].strip()
        if base.endswith("json"):
            try:
                body = json.loads(resp.body)
            except ValueError as e:
                raise AssertionError(
                    f"{what}: body is not JSON ({e}): {resp.body[:300]!r}") from None
            validate(body, content[key]["schema"], what)
        elif base.startswith("text/") or base.endswith("+xml"):
            validate(resp.body.decode("utf-8"), content[key]["schema"], what)
        # else binary (an image): nothing to validate but the content type.

    def coverage_gaps(self):
        """Operations never called, and documented statuses never seen."""
        gaps = []
        for (method, template), statuses in sorted(self.seen.items()):
            if not statuses:
                gaps.append(f"{method} {template}: never exercised")
                continue
            for status in sorted(self.ops[(method, template)]["responses"]):
                if status not in statuses and (method, template, status) not in INFEASIBLE:
                    gaps.append(f"{method} {template}: documented {status} never seen")
        for status in sorted(self.unrouted):
            if status not in self.unrouted_seen:
                gaps.append(f"{UNROUTED} {status}: never seen")
        return gaps


C = None  # the Contract of the running test


def api(method, base, path, body=None, headers=None, expect=None, timeout=30):
    """One request, checked against the contract; asserts the status if given."""
    resp = http(method, base + path, body, headers, timeout=timeout)
    C.check(method, base + path, resp)
    if expect is not None:
        assert resp.status == expect, \
            f"{method} {path}: expected {expect}, got {resp.status}: {resp.text[:400]}"
    return resp


def raw_request(base, lines):
    """Sends a request head as given (no client library tidies it) and returns
    the first answer as a Response."""
    parts = urllib.parse.urlsplit(base)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as s:
        s.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = Headers(tuple(h.split(": ", 1)) for h in header_lines)
    n = int(headers.get("Content-Length", "0"))
    return Response(int(status_line.split()[1]), headers, body[:n])


def problem(resp, kind):
    """Asserts resp is the problem `kind`."""
    got = resp.json().get("type", "")
    assert got == f"https://workd.dev/problems/{kind}", \
        f"expected problem {kind}, got {got}: {resp.text}"
    return resp


# -------------------------------------------------------------------- SSE

class Stream:
    """A raw text/event-stream reader that checks the framing line by line."""

    def __init__(self, base, path, headers=None, timeout=10.0):
        parts = urllib.parse.urlsplit(base)
        self.url = base + path
        self.conn = HTTPConnection(parts.hostname, parts.port, timeout=timeout)
        self.conn.request("GET", path, headers={"Accept": "text/event-stream", **(headers or {})})
        self.resp = self.conn.getresponse()
        self.status = self.resp.status
        self.messages, self.comments, self.retry = [], [], None

    def check_open(self):
        """Checks the answer's status and headers; a refusal is validated whole."""
        headers = Headers(self.resp.getheaders())
        if self.status != 200:
            resp = Response(self.status, headers, self.resp.read())
            C.check("GET", self.url, resp)
            self.close()
            return resp
        C.check("GET", self.url, Response(200, headers, b""), stream=True)
        assert headers.get("Content-Type") == "text/event-stream", headers
        return None

    def read_block(self):
        """Reads one block (up to a blank line); records its comments, retry and message."""
        fields, comments = [], []
        while True:
            raw = self.resp.readline()
            assert raw, f"{self.url}: the stream ended"
            assert raw.endswith(b"\n"), f"{self.url}: unterminated line {raw!r}"
            line = raw.decode("utf-8").rstrip("\n")
            assert not line.endswith("\r"), f"{self.url}: CR in {line!r}"
            if line == "":
                break
            if line.startswith(":"):
                comments.append(line[1:].strip())
                continue
            name, sep, value = line.partition(":")
            assert sep and value.startswith(" "), f"{self.url}: malformed line {line!r}"
            fields.append((name, value[1:]))
        self.comments += comments
        msg = {}
        for name, value in fields:
            assert name in ("id", "event", "data", "retry"), f"{self.url}: unknown field {name!r}"
            assert name not in msg, \
                f"{self.url}: field {name} twice in one message (multi-line data?)"
            msg[name] = value
        if "retry" in msg:
            self.retry = int(msg.pop("retry"))
        if msg:
            self.messages.append(msg)
        return comments, msg or None

    def read_until(self, pred, timeout=10.0, what="condition"):
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, \
                f"{self.url}: no {what} after {timeout}s ({len(self.messages)} messages)"
            self.read_block()

    def drain(self, timeout=10.0):
        """Reads until the stream is idle: two keep-alives with no message between."""
        marker = None
        deadline = time.monotonic() + timeout
        while True:
            assert time.monotonic() < deadline, f"{self.url}: never idle"
            comments, _ = self.read_block()
            if "keep-alive" in comments:
                if marker == len(self.messages):
                    return self.messages
                marker = len(self.messages)

    def refused(self):
        """Asserts the stream was refused; returns the checked answer."""
        resp = self.check_open()
        assert resp is not None, f"{self.url}: expected a refusal, got a stream"
        return resp

    def close(self):
        try:
            if self.conn.sock:
                self.conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.conn.close()


def stream_start(stream):
    """The seq the stream said it starts after (its first message, `ready`)."""
    first = stream.messages[0] if stream.messages else {}
    assert first.get("event") == "ready", \
        f"{stream.url}: the first message must be the start (ready): {stream.messages[:1]}"
    assert json.loads(first["data"]) == {"after": int(first["id"])}, first
    return int(first["id"])


def check_messages(stream):
    """The stream's messages against ResultStream (the start, then ResultMessages),
    each message's data against ResultEvent; returns the data of the results."""
    op = C.ops[("GET", "/results")]
    stream_schema = op["responses"]["200"]["content"]["text/event-stream"]["schema"]
    msg_schema = stream_schema["items"]
    data_schema = msg_schema["properties"]["data"]["contentSchema"]
    assert msg_schema["properties"]["data"].get("contentMediaType") == "application/json"
    validate(stream.messages, stream_schema, f"{stream.url} messages")
    stream_start(stream)
    out = []
    for m in stream.messages[1:]:
        data = json.loads(m["data"])
        validate(data, data_schema, f"{stream.url} data of message {m['id']}")
        assert m["id"] == str(data["seq"]), f"id {m['id']} must be the seq of {data}"
        assert m["event"] == data["status"], f"event {m['event']} must be the status of {data}"
        out.append(data)
    seqs = [d["seq"] for d in out]
    assert seqs == sorted(set(seqs)), f"{stream.url}: seqs not increasing: {seqs}"
    return out


# ------------------------------------------------------------------- tests

def test_route_table_is_the_spec():
    """api_routes[] in api.c and the operations of openapi.yaml are the same set,
    with the same names, bodies and scopes."""
    _, spec = load_spec()
    ops = operations(spec)
    schemes = spec["components"]["securitySchemes"]
    assert set(schemes) == SECURITY_SCHEMES, f"security schemes: {sorted(schemes)}"
    assert schemes["bearerAuth"]["type"] == "http" and schemes["bearerAuth"]["scheme"] == "bearer"
    assert (schemes["accessToken"]["type"], schemes["accessToken"]["in"],
            schemes["accessToken"]["name"]) == ("apiKey", "query", "access_token")
    by_norm = {(m, norm_template(t)): (t, op) for (m, t), op in ops.items()}
    routes = api_routes()
    assert len(routes) == len({(m, norm_template(p)) for m, p, *_ in routes}), "duplicate routes"
    missing = [f"{m} {p}" for m, p, *_ in routes if (m, norm_template(p)) not in by_norm]
    assert not missing, f"routes of api.c missing from openapi.yaml: {missing}"
    routed = {(rm, norm_template(rp)) for rm, rp, *_ in routes}
    extra = sorted(f"{m} {t}" for (m, t) in ops if (m, norm_template(t)) not in routed)
    assert not extra, f"operations of openapi.yaml that the server does not route: {extra}"
    for method, pattern, name, json_body, scope, query in routes:
        template, op = by_norm[(method, norm_template(pattern))]
        where = f"{method} {template}"
        assert op.get("operationId") == name, \
            f"{where}: operationId {op.get('operationId')!r} != route name {name!r} " \
            "(the metrics label)"
        declared = op.get("parameters", []) + spec["paths"][template].get("parameters", [])
        params = [p["name"] for p in declared if p["in"] == "path"]
        assert sorted(params) == sorted(re.findall(r"\{([^}]+)\}", template)), \
            f"{where}: path parameters {params}"
        # The server refuses any other query parameter: the lists must agree.
        in_url = any("accessToken" in req for req in op.get("security") or [])
        documented_q = {p["name"] for p in declared if p["in"] == "query"} | \
            ({"access_token"} if in_url else set())
        if query is not None:
            assert documented_q == query, \
                f"{where}: query parameters: openapi.yaml {sorted(documented_q)}, " \
                f"api.c {sorted(query)}"
        body = op.get("requestBody")
        if json_body:
            assert body and body.get("required") and \
                list(body["content"]) == ["application/json"], \
                f"{where}: the server requires a JSON body: document it, required, as JSON"
            assert "415" in op["responses"], f"{where}: a JSON-body route answers 415"
        else:
            assert body is None, f"{where}: the server reads no body"
            assert "415" not in op["responses"], f"{where}: the server never answers 415 here"
        assert "413" in op["responses"], \
            f"{where}: every route answers 413 to a body over --max-body"
        documented = op_scope(op, where)
        assert documented == scope, \
            f"{where}: security names scope {documented!r}, the route table {scope!r}"
        auth = {"401", "403"} & set(op["responses"])
        assert auth == ({"401", "403"} if scope else set()), \
            f"{where}: 401 and 403 are the answers of a protected route, and only of one"


def test_answers_match_the_spec(cluster):
    global C, SECRET
    C = Contract()
    SECRET = cluster.secret
    leader_args = ["--max-body", str(MAX_BODY), "--max-batch", str(MAX_BATCH),
                   "--max-open", str(MAX_OPEN), "--lease-grace", "0", "--backoff-base", "50ms",
                   "--backoff-max", "100ms", "--sse-keepalive", "300ms", "--get-wait-max", "5s",
                   "--pull-wait-max", "5s", "--progress-rate", "3", "--progress-max-bytes", "2048",
                   "--max-schedules", "1"]
    s1 = cluster.start_server("s1", extra_args=leader_args)
    wait_leader(s1.url)
    s2 = cluster.start_server("s2", extra_args=["--max-body", str(MAX_BODY),
                                                "--sse-max-subscribers", "1",
                                                "--sse-keepalive", "300ms"])
    wait_leader(s2.url)
    L, F = s1.url, s2.url  # leader, follower
    assert api("GET", L, "/readyz", expect=200).json()["is_leader"] is True
    assert api("GET", F, "/readyz", expect=200).json()["is_leader"] is False

    routing_and_transport(L, F)
    dashboard(L, F)
    work_submit_and_read(L, F)
    worker_api(L, F)
    listing_and_queues(L, F)
    results_stream(L, F)
    progress_and_webhooks(L, F)
    schedules_graphs_batches(L, F)
    limits_and_operations(L, F)
    authentication(cluster)

    # Last: without PostgreSQL, reads and readiness answer 503.
    cluster.pg_stop()
    for path in ("/work/c1", "/work/c1/events", "/work?limit=1", "/queues", "/activity",
                 "/queues/q-flow/keys", "/schedules", "/schedules/probe", "/batches/probe"):
        wait_until(lambda: api("GET", L, path).status == 503, 20, what=f"GET {path} 503")
        problem(api("GET", L, path, expect=503), "database-unavailable")
    for base in (L, F):
        wait_until(lambda: api("GET", base, "/readyz").status == 503, 20, what="/readyz 503")
        problem(api("GET", base, "/readyz", expect=503), "not-ready")

    gaps = C.coverage_gaps()
    assert not gaps, "openapi.yaml has parts this test never saw:\n  " + "\n  ".join(gaps)


def sample_path(template):
    return (template.replace("{id}", "probe").replace("{worker_id}", "probe-worker")
            .replace("{attempt}", "1").replace("{file}", "probe").replace("{queue}", "probe")
            .replace("{name}", "probe"))


def routing_and_transport(L, F):
    """404, 405 with Allow, 413 on every route, 415, 503 from a follower."""
    problem(api("GET", L, "/nope", expect=404), "no-route")
    # All defaults; no work exists yet, so this takes nothing.
    assert api("POST", L, "/workers/w-any/pull", {}, JSON, expect=200).json() == {"jobs": []}
    api("POST", L, "/work/a/b/c/d/e/f/g/h/i", expect=404)
    for template in C.templates:
        path = sample_path(template)
        for method in ("GET", "PUT", "POST", "DELETE", "PATCH", "OPTIONS", "HEAD"):
            if method not in C.methods_of(template):
                r = api(method, L, path, expect=405)
                if method != "HEAD":  # an answer to HEAD has no body
                    problem(r, "method-not-allowed")
    # A body over --max-body: refused from Content-Length before routing...
    big = "x" * (MAX_BODY + 1)
    for method, template in sorted(C.ops):
        problem(api(method, L, sample_path(template), big, JSON, expect=413), "body-too-large")
    api("GET", L, "/nope", big, expect=413)
    # ...and while reading a chunked one.
    chunks = (b"[" + b"1," * 100 + b"1]" for _ in range(int(MAX_BODY / 200) + 2))
    problem(api("POST", F, "/work", chunks, JSON, expect=413), "body-too-large")
    for method, template in sorted(C.ops):
        if C.ops[(method, template)].get("requestBody"):
            path = sample_path(template)
            problem(api(method, L, path, "{}", expect=415), "unsupported-media-type")
            problem(api(method, L, path, "{}", {"Content-Type": "text/plain"}, expect=415),
                    "unsupported-media-type")
    # A forwarded request that reaches a follower is not forwarded again.
    fwd = {**JSON, "X-Workd-Forwarded": f"secret={SECRET}; node=test"}
    leader_only = [("POST", "/work", {"payload": 1}), ("DELETE", "/work/probe", None),
                   ("POST", "/work/probe/retry", None),
                   ("POST", "/work/probe/attempts/1/complete", {}),
                   ("POST", "/work/probe/attempts/1/fail", {}),
                   ("PUT", "/workers/probe-worker", {}), ("DELETE", "/workers/probe-worker", None),
                   ("POST", "/workers/probe-worker/pull", {}),
                   ("POST", "/workers/probe-worker/reports", {"reports": []}),
                   ("GET", "/cluster", None), ("PUT", "/queues/probe", {"paused": True}),
                   ("POST", "/queues/probe/pause", None), ("POST", "/queues/probe/resume", None),
                   ("POST", "/bulk/cancel", {"queue": "probe"}),
                   ("POST", "/bulk/retry", {"queue": "probe"}),
                   ("POST", "/work/probe/attempts/1/progress", {"message": "x"}),
                   ("POST", "/workers/probe-worker/progress",
                    {"progress": [{"id": "probe", "attempt": 1, "message": "x"}]}),
                   ("GET", "/subscriptions", None), ("GET", "/subscriptions/probe", None),
                   ("PUT", "/subscriptions/probe", {"url": "http://x/", "secret": "whsec_" + "A" * 32}),
                   ("DELETE", "/subscriptions/probe", None),
                   ("PUT", "/schedules/probe", {"cron": "* * * * *", "work": {"payload": 1}}),
                   ("DELETE", "/schedules/probe", None), ("POST", "/schedules/probe/pause", None),
                   ("POST", "/schedules/probe/resume", None)]
    for method, path, body in leader_only:
        problem(api(method, F, path, body, fwd, expect=503), "not-leader")
    # A forwarded request may be up to four times --max-body (the first node
    # filled in ids and defaults).
    # Each payload stays within --max-body (its own budget, forwarded or not).
    item = {"items": [{"id": f"fwd-big-{i}", "payload": "x" * (MAX_BODY - 100), "queue": "q-fwd"}
                      for i in range(3)]}
    problem(api("POST", L, "/work", item, JSON, expect=413), "body-too-large")
    assert all(i["created"] for i in api("POST", L, "/work", item, fwd, expect=202).json()["items"])
    for i in range(3):
        api("DELETE", L, f"/work/fwd-big-{i}", expect=200)
    problem(api("POST", L, "/work", {"items": item["items"] * 2}, fwd, expect=413),
            "body-too-large")
    # The header without the secret is refused, whatever the request.
    for forged in ("node=test", "secret=not-the-secret-0123; node=test"):
        problem(api("POST", L, "/work", item, {**JSON, "X-Workd-Forwarded": forged}, expect=403),
                "forwarding-refused")
        problem(api("GET", F, "/healthz", headers={"X-Workd-Forwarded": forged}, expect=403),
                "forwarding-refused")
    # Query parameters an operation does not take, a token in the URL where
    # the route takes none: refused by name.
    problem(api("GET", L, "/work?stauts=dead", expect=400), "unknown-parameter")
    problem(api("GET", L, "/work?limit=1&limit=2", expect=400), "repeated-parameter")
    problem(api("GET", L, "/healthz?access_token=x", expect=400), "token-in-url")
    # Framing a smuggler needs: 400 or 501, as problems, and the connection closed.
    for lines, status, kind in (
            (["GET /healthz HTTP/1.1", "Host: a", "Host: b"], 400, "bad-request"),
            (["POST /work HTTP/1.1", "Host: a", "Content-Type: application/json",
              "Transfer-Encoding: gzip, chunked"], 501, "not-implemented")):
        resp = raw_request(L, lines)
        assert resp.status == status, resp
        C.check(lines[0].split()[0], L + lines[0].split()[1], resp)
        problem(resp, kind)


def dashboard(L, F):
    """GET / and /dashboard/{file}: the embedded files, their types, ETags and 304s."""
    r = api("GET", L, "/", expect=200)
    assert r.headers["Content-Type"] == "text/html; charset=utf-8", r.headers
    assert r.body == (DASHBOARD_DIR / "index.html").read_bytes(), "GET / is not index.html"
    etag = r.headers["ETag"]
    assert api("GET", F, "/", expect=200).headers["ETag"] == etag, "nodes disagree on the ETag"
    for inm in (etag, "*", f'"{"0" * 20}", W/{etag}'):
        nm = api("GET", L, "/", headers={"If-None-Match": inm}, expect=304)
        assert nm.body == b"" and nm.headers["ETag"] == etag, (inm, nm.headers)
    api("GET", L, "/", headers={"If-None-Match": f'"{"0" * 20}"'}, expect=200)
    files = sorted(p for p in DASHBOARD_DIR.iterdir() if p.suffix in DASHBOARD_TYPES)
    assert files, "dashboard/ has no files"
    for path in files:
        r = api("GET", F, "/dashboard/" + path.name, expect=200)
        assert r.headers["Content-Type"] == DASHBOARD_TYPES[path.suffix], (path.name, r.headers)
        assert r.body == path.read_bytes(), f"/dashboard/{path.name} is not dashboard/{path.name}"
        api("GET", L, "/dashboard/" + path.name, headers={"If-None-Match": r.headers["ETag"]},
            expect=304)
    problem(api("GET", L, "/dashboard/nope.js", expect=404), "not-found")
    problem(api("GET", L, "/dashboard/", expect=404), "no-route")


def rfc3339_in(seconds):
    t = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def work_submit_and_read(L, F):
    api("GET", L, "/healthz", expect=200)
    c1 = {"id": "c1", "payload": {"n": 1}, "queue": "q-main", "priority": 5, "timeout": 30,
          "max_attempts": 2}
    # With a trace context: the job, the work and the result show it (Job, Work, ResultEvent).
    trace = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
             "tracestate": "congo=t61rcWkgMzE"}
    r = api("POST", L, "/work", c1, {**JSON, **trace}, expect=202)
    assert r.headers["Location"] == "/work/c1", r.headers
    assert r.json() == {"id": "c1", "status": "pending", "created": True}, r.json()
    again = api("POST", L, "/work", c1, JSON, expect=202).json()
    assert again["created"] is False, again
    k = api("POST", L, "/work", {"payload": None, "queue": "q-idem"},
            {**JSON, "Idempotency-Key": "k1"}, expect=202)
    assert k.json()["id"] == "k1" and k.headers["Location"] == "/work/k1", k.json()
    gen = api("POST", L, "/work", {"payload": [1, "two"], "queue": "q-idem"}, JSON,
              expect=202).json()
    bulk = api("POST", L, "/work", [{"id": "b1", "payload": 1, "queue": "q-bulk"},
                                     {"id": "b2", "payload": 2, "queue": "q-bulk", "delay": 3600}],
               JSON, expect=202)
    assert "Location" not in bulk.headers, bulk.headers
    assert [i["status"] for i in bulk.json()["items"]] == ["pending", "scheduled"], bulk.json()
    p = api("POST", F, "/work", {"id": "p1", "payload": "x", "queue": "q-proxy",
                                 "run_at": rfc3339_in(3600)}, JSON, expect=202)
    assert p.headers["Location"] == "/work/p1" and p.json()["status"] == "scheduled", p.json()
    problem(api("POST", L, "/work", {"id": "c1", "payload": {"n": 2}}, JSON, expect=409),
            "conflict")

    bad = [
        ("", "invalid-body"), ("{", "invalid-json"),
        ('{"payload": 1, "payload": 2}', "invalid-json"),
        ("[" * 40 + "]" * 40, "invalid-body"), ("5", "invalid-body"), ("[]", "invalid-body"),
        ({"payload": 1, "colour": "red"}, "unknown-field"), ({"id": "x"}, "missing-field"),
        ({"payload": 1, "id": "bad id"}, "invalid-field"),
        ({"payload": 1, "queue": ""}, "invalid-field"),
        ({"payload": 1, "priority": 1.5}, "invalid-field"),
        ({"payload": 1, "priority": 1000001}, "invalid-field"),
        ({"payload": 1, "run_at": rfc3339_in(60), "delay": 1}, "invalid-field"),
        ({"payload": 1, "run_at": 12}, "invalid-field"),
        ({"payload": 1, "run_at": "tomorrow"}, "invalid-field"),
        ({"payload": 1, "run_at": rfc3339_in(400 * 86400)}, "invalid-field"),
        ({"payload": 1, "delay": -1}, "invalid-field"),
        ({"payload": 1, "timeout": 0}, "invalid-field"),
        ({"payload": 1, "timeout": 604801}, "invalid-field"),
        ({"payload": 1, "max_attempts": 0}, "invalid-field"),
        ([{"payload": 1}, {"payload": 2, "queue": 7}], "invalid-field"),
    ]
    for body, kind in bad:
        problem(api("POST", L, "/work", body, JSON, expect=400), kind)
    problem(api("POST", L, "/work", {"payload": 1}, {**JSON, "Idempotency-Key": "bad key"},
                expect=400), "invalid-header")
    problem(api("POST", L, "/work", [{"payload": 1}], {**JSON, "Idempotency-Key": "k2"},
                expect=400), "invalid-header")
    problem(api("POST", L, "/work", {"payload": 1, "id": "x1"}, {**JSON, "Idempotency-Key": "x2"},
                expect=400), "invalid-field")
    problem(api("POST", L, "/work", [{"payload": i} for i in range(MAX_BATCH + 1)], JSON,
                expect=413), "batch-too-large")

    for wid, status in (("c1", "pending"), ("b2", "scheduled"), ("p1", "scheduled"),
                        ("k1", "pending"), (gen["id"], "pending")):
        assert api("GET", L, f"/work/{wid}", expect=200).json()["status"] == status
    t0 = time.monotonic()
    assert api("GET", F, "/work/k1?wait=0.3", expect=200).json()["status"] == "pending"
    assert time.monotonic() - t0 >= 0.25, "?wait= should wait"
    for q in ("?wait=soon", "?wait=-1"):
        problem(api("GET", L, "/work/k1" + q, expect=400), "invalid-parameter")
    # The history takes no ?wait= (a parameter an operation lacks is refused).
    problem(api("GET", L, "/work/k1/events?wait=soon", expect=400), "unknown-parameter")
    # It comes in pages: one event at a time gives the whole history.
    whole, paged, after = api("GET", L, "/work/k1/events", expect=200).json(), [], 0
    while after is not None:
        page = api("GET", L, f"/work/k1/events?limit=1&after={after}", expect=200).json()
        paged += page["events"]
        after = page["next_after"]
    assert paged == whole["events"] and whole["next_after"] is None, (paged, whole)
    problem(api("GET", L, "/work/k1/events?limit=0", expect=400), "invalid-parameter")
    problem(api("GET", L, "/work/" + "x" * 129, expect=400), "invalid-path")
    problem(api("GET", L, "/work/a%20b/events", expect=400), "invalid-path")
    problem(api("GET", L, "/work/nope", expect=404), "not-found")
    problem(api("GET", L, "/work/nope/events", expect=404), "not-found")

    c = api("DELETE", L, "/work/b2", expect=200).json()
    assert c == {"id": "b2", "status": "cancelled"}, c
    api("DELETE", F, "/work/p1", expect=200)
    problem(api("DELETE", L, "/work/b2", expect=409), "not-cancellable")
    problem(api("DELETE", L, "/work/nope", expect=404), "not-found")
    problem(api("DELETE", L, "/work/bad%20id", expect=400), "invalid-path")
    assert api("GET", L, "/work/b2", expect=200).json()["status"] == "cancelled"


def pull(base, worker, queue, max_jobs=1, wait=0, n=None):
    jobs = api("POST", base, f"/workers/{worker}/pull",
               {"instance": "i1", "max": max_jobs, "wait": wait, "queues": [queue]}, JSON,
               expect=200, timeout=wait + 30).json()["jobs"]
    if n is not None:
        assert len(jobs) == n, f"pull by {worker} on {queue}: expected {n} jobs, got {jobs}"
    return jobs


def history(base, wid):
    return [e["type"] for e in api("GET", base, f"/work/{wid}/events", expect=200).json()["events"]]


def worker_api(L, F):
    hb = api("PUT", L, "/workers/w-main", {"instance": "i1", "capacity": 4, "queues": ["q-main"],
                                           "running": []}, JSON, expect=200).json()
    assert hb["worker_timeout_ms"] == 10000, hb
    api("PUT", F, "/workers/w-proxy", {"capacity": 1, "queues": None,
                                       "running": [{"id": "x", "attempt": 1}]}, JSON, expect=200)
    for body in ({"capacity": 0}, {"capacity": "2"}, {"queues": "q-main"},
                 {"queues": ["bad queue"]}, {"instance": ""}, {"running": {}},
                 {"running": [{"id": "x"}]}, {"running": [{"id": "x", "attempt": 0}]},
                 {"running": [{"id": "x", "attempt": "1"}]},
                 {"running": [{"id": "x y", "attempt": 1}]},
                 {"running": [{"id": "x", "attempt": 1, "worker": "w"}]}, {"running": ["x"]}):
        problem(api("PUT", L, "/workers/w-main", body, JSON, expect=400), "invalid-field")
    problem(api("PUT", L, "/workers/w-main", {"capacity": 1, "colour": "red"}, JSON, expect=400),
            "unknown-field")
    problem(api("PUT", L, "/workers/w-main", [], JSON, expect=400), "invalid-body")
    problem(api("PUT", L, "/workers/w-main", "{x}", JSON, expect=400), "invalid-json")
    problem(api("PUT", L, "/workers/bad%20worker", {}, JSON, expect=400), "invalid-path")

    # Complete through the single-report form; repeats are acknowledged.
    job = pull(L, "w-main", "q-main", max_jobs=1, n=1)[0]
    assert job["id"] == "c1" and job["attempt"] == 1, job
    assert job["traceparent"].startswith("00-0af76519") and job["tracestate"], job
    assert api("GET", L, "/work/c1", expect=200).json()["status"] == "running"
    body = {"worker_id": "w-main", "result": {"ok": True}}
    r = api("POST", L, "/work/c1/attempts/1/complete", body, JSON, expect=200).json()
    assert r == {"id": "c1", "attempt": 1, "accepted": True, "status": "completed"}, r
    api("POST", F, "/work/c1/attempts/1/complete", body, JSON, expect=200)
    problem(api("POST", L, "/work/c1/attempts/2/complete", body, JSON, expect=409),
            "attempt-superseded")
    problem(api("POST", L, "/work/c1/attempts/1/fail", {}, JSON, expect=409),
            "attempt-superseded")
    problem(api("POST", L, "/work/nope/attempts/1/complete", body, JSON, expect=404), "not-found")
    problem(api("POST", F, "/work/nope/attempts/1/fail", {}, JSON, expect=404), "not-found")
    for path, b, kind in (("/work/c1/attempts/0/complete", {}, "invalid-path"),
                          ("/work/c1/attempts/x/fail", {}, "invalid-path"),
                          ("/work/c1/attempts/1000001/fail", {}, "invalid-path"),
                          ("/work/c%201/attempts/1/fail", {}, "invalid-path"),
                          ("/work/c1/attempts/1/complete", [], "invalid-body"),
                          ("/work/c1/attempts/1/complete", "nope", "invalid-json"),
                          ("/work/c1/attempts/1/complete", {"worker_id": 5}, "invalid-field"),
                          ("/work/c1/attempts/1/complete", {"error": "x"}, "unknown-field"),
                          ("/work/c1/attempts/1/fail", {"result": 1}, "unknown-field"),
                          ("/work/c1/attempts/1/fail", {"error": 5}, "invalid-field"),
                          ("/work/c1/attempts/1/fail", {"retry": "no"}, "invalid-field")):
        problem(api("POST", L, path, b, JSON, expect=400), kind)
    resub = api("POST", L, "/work", {"id": "c1", "payload": {"n": 1}, "queue": "q-main",
                                     "priority": 5}, JSON, expect=202).json()
    assert resub == {"id": "c1", "status": "completed", "created": False}, resub

    # Fail, retry, fail again: dead; then a failure without retry, and a timeout.
    api("POST", L, "/work", [{"id": "f1", "payload": 1, "queue": "q-main", "max_attempts": 2},
                             {"id": "d1", "payload": 2, "queue": "q-main"},
                             {"id": "t1", "payload": 3, "queue": "q-main", "timeout": 0.2,
                              "max_attempts": 1},
                             {"id": "r1", "payload": 4, "queue": "q-main"}], JSON, expect=202)
    jobs = {j["id"]: j for j in pull(L, "w-main", "q-main", max_jobs=4, n=4)}
    # Only the worker that holds the attempt may end it.
    problem(api("POST", L, "/work/f1/attempts/1/fail", {"error": "boom"}, JSON, expect=409),
            "attempt-not-held")
    mine = {"worker_id": "w-main", "error": "boom"}
    r = api("POST", L, "/work/f1/attempts/1/fail", mine, JSON, expect=200).json()
    assert r["status"] == "scheduled", r
    # The same failure again is acknowledged: the attempt has ended already.
    r = api("POST", L, "/work/f1/attempts/1/fail", mine, JSON, expect=200).json()
    assert r["accepted"] is True and r["status"] in ("scheduled", "pending"), r
    r = api("POST", F, "/work/d1/attempts/1/fail", {"worker_id": "w-main", "retry": False}, JSON,
            expect=200).json()
    assert r["status"] == "dead", r
    retry = pull(L, "w-main", "q-main", wait=3, n=1)[0]
    assert retry["id"] == "f1" and retry["attempt"] == 2, retry
    problem(api("POST", L, "/work/f1/attempts/1/fail", {}, JSON, expect=409),
            "attempt-superseded")
    reports = {"reports": [
        {"id": "f1", "attempt": 2, "outcome": "failed", "error": "boom again", "retry": True},
        {"id": "r1", "attempt": 1, "outcome": "completed", "result": [1, 2]},
        {"id": "nope", "attempt": 1, "outcome": "completed"},
        {"id": "c1", "attempt": 1, "outcome": "completed", "result": {"ok": True}},
        {"id": "c1", "attempt": 1, "outcome": "failed"}]}
    res = api("POST", L, "/workers/w-main/reports", reports, JSON, expect=200).json()["results"]
    assert [(x["accepted"], x.get("status") or x.get("reason")) for x in res] == \
        [(True, "dead"), (True, "completed"), (False, "not-found"), (True, "completed"),
         (False, "superseded")], res
    res = api("POST", F, "/workers/w-main/reports", {"reports": reports["reports"][:1]}, JSON,
              expect=200).json()["results"]
    assert res[0]["accepted"] is True and res[0]["status"] == "dead", res
    assert jobs["t1"]["timeout_ms"] == 200, jobs["t1"]
    wait_until(lambda: api("GET", L, "/work/t1", expect=200).json()["status"] == "dead", 10,
               what="t1 to time out")
    # The failure of the attempt that timed out is acknowledged; its completion is not.
    r = api("POST", L, "/work/t1/attempts/1/fail", {"error": "late"}, JSON, expect=200).json()
    assert r == {"id": "t1", "attempt": 1, "accepted": True, "status": "dead"}, r
    problem(api("POST", L, "/work/t1/attempts/1/complete", {}, JSON, expect=409),
            "attempt-superseded")
    for body in ({}, {"reports": {}}, [], {"reports": [5]}):
        problem(api("POST", L, "/workers/w-main/reports", body, JSON, expect=400), "invalid-body")
    problem(api("POST", L, "/workers/w-main/reports", {"reports": [], "worker": "w"}, JSON,
                expect=400), "unknown-field")
    for one in ({"id": "f1", "attempt": 0, "outcome": "failed"},
                {"id": "f1", "attempt": 1, "outcome": "done"},
                {"id": "f1", "attempt": 1, "outcome": "failed", "error": 1},
                {"id": "f1", "attempt": 1, "outcome": "failed", "retry": 1},
                {"attempt": 1, "outcome": "failed"}):
        problem(api("POST", L, "/workers/w-main/reports", {"reports": [one]}, JSON, expect=400),
                "invalid-field")
    problem(api("POST", L, "/workers/w-main/reports",
                {"reports": [{"id": "f1", "attempt": 1, "outcome": "failed", "why": "x"}]}, JSON,
                expect=400), "unknown-field")
    problem(api("POST", L, "/workers/bad%20w/reports", {"reports": []}, JSON, expect=400),
            "invalid-path")
    many = {"reports": [{"id": "f1", "attempt": 1, "outcome": "failed"}] * (MAX_BATCH + 1)}
    problem(api("POST", L, "/workers/w-main/reports", many, JSON, expect=413), "batch-too-large")

    # The history of each kind of event.
    types = {wid: history(L, wid) for wid in ("c1", "f1", "d1", "t1", "b2")}
    assert types == {"c1": ["accepted", "started", "completed"],
                     "f1": ["accepted", "started", "failed", "started", "failed", "dead"],
                     "d1": ["accepted", "started", "failed", "dead"],
                     "t1": ["accepted", "started", "timed_out", "dead"],
                     "b2": ["accepted", "cancelled"]}, types
    api("GET", F, "/work/f1/events", expect=200)
    for wid in ("c1", "f1", "d1", "t1", "r1"):
        api("GET", F, f"/work/{wid}", expect=200)

    # An operator retries dead work: one more attempt, which completes.
    assert api("POST", L, "/work/d1/retry", expect=200).json() == {"id": "d1", "status": "pending"}
    w = api("GET", F, "/work/d1", expect=200).json()
    assert (w["status"], w["attempts"], w["max_attempts"], w["last_error"]) == \
        ("pending", 1, 2, "failed"), w
    retried = api("GET", L, "/work/d1/events", expect=200).json()["events"][-1]
    assert retried["type"] == "retried" and retried["data"]["error"] == "failed" and \
        (retried["data"]["attempt"], retried["data"]["max_attempts"]) == (1, 2), retried
    problem(api("POST", F, "/work/d1/retry", expect=409), "not-retryable")  # pending now
    for wid in ("c1", "b2"):  # completed, cancelled
        problem(api("POST", L, f"/work/{wid}/retry", expect=409), "not-retryable")
    problem(api("POST", L, "/work/nope/retry", expect=404), "not-found")
    problem(api("POST", L, "/work/bad%20id/retry", expect=400), "invalid-path")
    job = pull(F, "w-main", "q-main", wait=3, n=1)[0]
    assert (job["id"], job["attempt"]) == ("d1", 2), job
    r = api("POST", L, "/work/d1/attempts/2/complete",
            {"worker_id": "w-main", "result": "second time"}, JSON, expect=200).json()
    assert r["status"] == "completed", r
    assert history(F, "d1") == ["accepted", "started", "failed", "dead", "retried", "started",
                                "completed"]

    # Pulls: empty after a wait, through the follower, bad bodies.
    t0 = time.monotonic()
    pull(L, "w-idle", "q-empty", wait=0.3, n=0)
    assert time.monotonic() - t0 >= 0.25, "an empty pull should wait"
    pull(F, "w-idle", "q-empty", n=0)
    for body, kind in (({"max": 0}, "invalid-field"), ({"max": 10001}, "invalid-field"),
                       ({"wait": -1}, "invalid-field"), ({"wait": "1"}, "invalid-field"),
                       ({"queues": [1]}, "invalid-field"), ({"instance": "a b"}, "invalid-field"),
                       ({"max": 1, "capacity": 1}, "unknown-field"),
                       ("[]", "invalid-body"), ("", "invalid-body")):
        problem(api("POST", L, "/workers/w-idle/pull", body, JSON, expect=400), kind)
    problem(api("POST", L, "/workers/" + "w" * 129 + "/pull", {}, JSON, expect=400), "invalid-path")

    # A heartbeat without `running` says nothing of it: the last list stays.
    api("PUT", L, "/workers/w-proxy", {"capacity": 2}, JSON, expect=200)
    cl = api("GET", F, "/cluster", expect=200).json()
    workers = {w["id"]: w for w in cl["workers"]}
    assert workers["w-idle"]["running"] is None, cl
    assert workers["w-proxy"]["running"] == [{"id": "x", "attempt": 1}], cl
    assert workers["w-proxy"]["capacity"] == 2, cl
    api("GET", L, "/cluster", expect=200)
    # A deregistration naming another instance than the registered one ends nothing.
    problem(api("DELETE", L, "/workers/w-main?instance=another", expect=409), "worker-id-taken")
    api("DELETE", L, "/workers/w-proxy", expect=204)
    api("DELETE", F, "/workers/w-unknown", expect=204)
    problem(api("DELETE", L, "/workers/bad%20w", expect=400), "invalid-path")


def listing_and_queues(L, F):
    """GET /work with its filters and cursor; GET /queues."""
    api("POST", L, "/work", [{"id": "l-sched", "payload": 1, "queue": "q-list", "delay": 3600},
                             {"id": "l-run", "payload": 2, "queue": "q-list"},
                             {"id": "l-pend", "payload": 3, "queue": "q-list"}], JSON, expect=202)
    assert [j["id"] for j in pull(L, "w-list", "q-list", n=1)] == ["l-run"]

    # Pages of three, newest first, through both nodes: every item once.
    seen, before, pages = [], None, 0
    while True:
        q = "/work?limit=3" + (f"&before={before}" if before else "")
        page = api("GET", L if pages % 2 else F, q, expect=200).json()
        assert len(page["items"]) <= 3, page
        seen += [i["id"] for i in page["items"]]
        before, pages = page["next_before"], pages + 1
        assert (before is None) == (len(page["items"]) < 3), page
        if before is None:
            break
    assert len(seen) == len(set(seen)) and pages > 2, seen
    assert seen[:3] == ["l-pend", "l-run", "l-sched"], seen
    assert {"c1", "f1", "d1", "t1", "r1", "b1", "b2", "p1", "k1"} <= set(seen), seen
    for status, want in (("scheduled", ["l-sched"]), ("running", ["l-run"]),
                         ("pending", ["l-pend"]), ("completed", []), (None, None)):
        q = "/work?queue=q-list" + (f"&status={status}" if status else "")
        items = api("GET", L, q, expect=200).json()["items"]
        assert [i["id"] for i in items] == (want if want is not None else
                                           ["l-pend", "l-run", "l-sched"]), (q, items)
        assert all(i["status"] == status for i in items if status), items
    dead = {i["id"] for i in api("GET", F, "/work?status=dead", expect=200).json()["items"]}
    assert dead == {"f1", "t1"}, dead
    done = api("GET", F, "/work?status=completed&queue=q-main&limit=500", expect=200).json()
    assert {i["id"] for i in done["items"]} == {"c1", "r1", "d1"} and \
        done["next_before"] is None, done
    for q in ("status=lost", "status=", "queue=bad%20q", "queue=" + "q" * 65, "limit=0",
              "limit=501", "limit=x", "limit=-1", "before=-1", "before=x",
              "before=99999999999999999999"):
        problem(api("GET", L, "/work?" + q, expect=400), "invalid-parameter")

    # Per-queue statistics, from both nodes.
    def stats(base):
        return {q["queue"]: q for q in api("GET", base, "/queues", expect=200).json()["queues"]}
    by = stats(F)
    assert {k: by["q-list"][k] for k in ("pending", "scheduled", "running", "completed")} == \
        {"pending": 1, "scheduled": 1, "running": 1, "completed": 0}, by["q-list"]
    assert by["q-list"]["oldest_pending_at"] is not None, by["q-list"]
    assert by["q-list"]["throughput"] is None, by["q-list"]  # nothing of it finished
    assert (by["q-proxy"]["cancelled"], by["q-proxy"]["pending"]) == (1, 0), by["q-proxy"]
    assert by["q-proxy"]["oldest_pending_at"] is None, by["q-proxy"]
    q_main = wait_until(lambda: (lambda q: q["throughput"] and
                                 sum(q["throughput"]["completed"]) >= 3 and q)(stats(L)["q-main"]),
                        10, what="the throughput of q-main")
    assert (q_main["completed"], q_main["dead"]) == (3, 2), q_main
    api("POST", F, "/work/l-run/attempts/1/complete", {"worker_id": "w-list"}, JSON, expect=200)


def results_stream(L, F):
    finished = {"c1": "completed", "r1": "completed", "f1": "dead", "d1": "completed",
                "t1": "dead", "b2": "cancelled", "p1": "cancelled"}
    s = Stream(L, "/results?after=0")
    assert s.check_open() is None
    s.read_block()
    assert s.comments[:1] == ["workd results stream"] and s.retry == 1000, (s.comments, s.retry)
    assert s.messages == [{"id": "0", "event": "ready", "data": '{"after":0}'}], \
        f"the stream must say it starts after 0: {s.messages}"
    s.drain()
    data = check_messages(s)
    got = {d["id"]: d["status"] for d in data}
    assert {k: got.get(k) for k in finished} == finished, got
    assert [d["status"] for d in data if d["id"] == "d1"] == ["dead", "completed"], data
    first = str(data[0]["seq"])
    # Live: a cancellation shows up on the open stream.
    api("POST", L, "/work", {"id": "live", "payload": 1, "delay": 60, "queue": "q-live"}, JSON,
        expect=202)
    api("DELETE", L, "/work/live", expect=200)
    s.read_until(lambda: "data" in s.messages[-1] and
                 json.loads(s.messages[-1]["data"])["id"] == "live", what="the live event")
    check_messages(s)
    s.close()

    # Last-Event-ID resumes after it, and wins over ?after=.
    r = Stream(F, "/results?after=0", {"Last-Event-ID": first})
    assert r.check_open() is None
    r.drain()
    resumed = check_messages(r)
    assert stream_start(r) == int(first), r.messages[:1]
    assert resumed and resumed[0]["seq"] > int(first) and \
        [d["id"] for d in resumed] == [d["id"] for d in data[1:]] + ["live"], resumed
    # A follower serves one stream here (--sse-max-subscribers 1).
    busy = Stream(F, "/results")
    problem(busy.refused(), "too-many-subscribers")
    r.close()

    # Without a start, a stream starts after the last event the node knows of,
    # and says so: resuming from there misses nothing.
    live = Stream(L, "/results?queue=q-live2")
    assert live.check_open() is None
    live.read_block()
    start = stream_start(live)
    assert start >= int(resumed[-1]["seq"]), (start, resumed[-1])
    api("POST", L, "/work", {"id": "live2", "payload": 1, "delay": 60, "queue": "q-live2"}, JSON,
        expect=202)
    api("DELETE", F, "/work/live2", expect=200)
    live.read_until(lambda: len(live.messages) > 1, what="the live2 event")
    live.close()
    again = Stream(L, "/results", {"Last-Event-ID": str(start)})
    assert again.check_open() is None
    again.drain()
    assert [d["id"] for d in check_messages(again)][-1] == "live2", again.messages
    again.close()

    for path, kind in (("/results?work_id=c1&after=0", "c1"),
                       ("/results?queue=q-main&after=0", "q")):
        f = Stream(L, path)
        assert f.check_open() is None
        f.drain()
        d = check_messages(f)
        assert d and all(x["id"] == "c1" if kind == "c1" else x["queue"] == "q-main" for x in d), d
        f.close()
    for path, headers in (("/results?after=x", None), ("/results?after=-1", None),
                          ("/results", {"Last-Event-ID": "1e3"}),
                          ("/results?after=99999999999999999999", None),
                          ("/results?work_id=a%20b", None), ("/results?queue=" + "q" * 65, None)):
        problem(Stream(L, path, headers).refused(), "invalid-parameter")


def progress_and_webhooks(L, F):
    """Progress reports and their streams; webhook subscriptions."""
    api("POST", L, "/work", {"id": "pg1", "payload": 1, "queue": "q-prog"}, JSON, expect=202)
    api("PUT", L, "/workers/w-prog", {"instance": "i1", "capacity": 1, "queues": ["q-prog"],
                                      "running": []}, JSON, expect=200)
    job = pull(L, "w-prog", "q-prog", n=1)[0]
    path = f"/work/pg1/attempts/{job['attempt']}/progress"
    who = {"worker_id": "w-prog", "instance": "i1"}
    r = api("POST", F, path, {**who, "fraction": 0.25, "message": "a quarter"}, JSON,
            expect=200).json()
    assert r["id"] == "pg1" and r["seq"] >= 1, r
    api("POST", L, path, {**who, "output": "partial"}, JSON, expect=200)
    got = api("GET", F, "/work/pg1", expect=200).json()["progress"]
    assert got["fraction"] == 0.25 and got["message"] == "a quarter", got
    for body, kind in (({**who, "fraction": 2}, "invalid-field"), ({**who}, "invalid-body"),
                       ({**who, "message": 5}, "invalid-field"), ({**who, "colour": 1}, "unknown-field")):
        problem(api("POST", L, path, body, JSON, expect=400), kind)
    problem(api("POST", L, "/work/pg1/attempts/0/progress", {**who, "message": "x"}, JSON,
                expect=400), "invalid-path")
    problem(api("POST", L, "/work/nope/attempts/1/progress", {**who, "message": "x"}, JSON,
                expect=404), "not-found")
    problem(api("POST", L, "/work/pg1/attempts/9/progress", {**who, "message": "x"}, JSON,
                expect=409), "attempt-superseded")
    problem(api("POST", L, path, {"worker_id": "w-other", "message": "x"}, JSON, expect=409),
            "attempt-not-held")
    time.sleep(1.1)  # a declared delay: the --progress-rate 3 bucket fills again
    api("POST", L, path, {**who, "output": "x" * 1500}, JSON, expect=200)
    problem(api("POST", L, path, {**who, "output": "y" * 1000}, JSON, expect=413),
            "progress-too-large")
    codes = [api("POST", L, path, {**who, "message": f"m{i}"}, JSON).status for i in range(6)]
    assert 429 in codes, f"--progress-rate 3 must refuse a burst: {codes}"
    # A worker's progress for many attempts: each taken or refused on its own.
    upd = {"id": "pg1", "attempt": job["attempt"], "fraction": 0.5}
    res = api("POST", F, "/workers/w-prog/progress",
              {"instance": "i1", "progress": [upd, {**upd, "id": "nope"}]}, JSON,
              expect=200).json()["results"]
    assert res[1]["accepted"] is False and res[1]["reason"] == "not-found", res
    for body, kind in (({"progress": []}, "invalid-body"), ({"progress": [{"id": "pg1"}]}, "invalid-field"),
                       ({"progress": [upd], "colour": 1}, "unknown-field")):
        problem(api("POST", L, "/workers/w-prog/progress", body, JSON, expect=400), kind)
    api("POST", L, f"/work/pg1/attempts/{job['attempt']}/complete", {**who, "result": 1}, JSON,
        expect=200)
    # The work's stream: its history from the start, progress and all.
    s = Stream(F, "/work/pg1/stream")
    assert s.check_open() is None
    s.read_until(lambda: any(m.get("event") == "completed" for m in s.messages),
                 what="the completion on the work's stream")
    data = check_messages(s)
    assert [d["status"] for d in data][-1] == "completed" and \
        [d["status"] for d in data][:2] == ["progress", "progress"], data
    # ...and then it ends (the spec: nothing else can follow).
    assert s.resp.readline() == b"", f"{s.url}: the stream must end after the work's end"
    s.close()
    hold = Stream(F, "/results")  # F's one subscriber
    assert hold.check_open() is None
    problem(Stream(F, "/work/pg1/stream").refused(), "too-many-subscribers")
    hold.close()
    problem(Stream(L, "/work/pg1/stream?after=x").refused(), "invalid-parameter")
    p = Stream(L, f"/results?progress=true&work_id=pg1&after={data[0]['seq'] - 1}")
    assert p.check_open() is None
    p.drain()
    assert [d["seq"] for d in check_messages(p)] == [d["seq"] for d in data]
    p.close()
    problem(Stream(L, "/results?progress=yes").refused(), "invalid-parameter")

    # Webhook subscriptions (the URL's name never resolves: it only fails).
    secret = "whsec_" + "QUJD" * 8
    sub = api("PUT", F, "/subscriptions/hook-1", {"url": "http://receiver.invalid:9/hook",
                                                  "secret": secret, "queues": ["q-prog"],
                                                  "kinds": ["completed"], "paused": True},
              JSON, expect=200).json()
    assert sub["name"] == "hook-1" and sub["paused"] is True and "secret" not in sub, sub
    assert api("GET", F, "/subscriptions", expect=200).json()["subscriptions"][0]["name"] == "hook-1"
    assert api("GET", L, "/subscriptions/hook-1", expect=200).json()["kinds"] == ["completed"]
    for body in ({"url": "x", "secret": secret}, {"url": "http://x/", "secret": "nope"},
                 {"url": "http://x/", "secret": secret, "kinds": []},
                 {"url": "http://x/", "secret": secret, "queues": ["bad queue"]}):
        problem(api("PUT", L, "/subscriptions/hook-2", body, JSON, expect=400), "invalid-field")
    problem(api("PUT", L, "/subscriptions/hook-2", {"url": "http://169.254.169.254/", "secret": secret},
                JSON, expect=400), "internal-target")
    problem(api("PUT", L, "/subscriptions/bad%20name", {"url": "http://x/", "secret": secret},
                JSON, expect=400), "invalid-path")
    problem(api("GET", L, "/subscriptions/bad%20name", expect=400), "invalid-path")
    problem(api("DELETE", L, "/subscriptions/bad%20name", expect=400), "invalid-path")
    problem(api("GET", L, "/subscriptions/hook-2", expect=404), "not-found")
    problem(api("DELETE", F, "/subscriptions/hook-2", expect=404), "not-found")
    gone = api("DELETE", F, "/subscriptions/hook-1", expect=200).json()
    assert gone["deleted"] is True and gone["name"] == "hook-1", gone
    assert api("GET", L, "/subscriptions", expect=200).json()["subscriptions"] == []


def queue_flow(L, F):
    """A queue's flow control: set through either node, shown by GET /queues."""
    set_ = api("PUT", F, "/queues/q-flow", {"max_running": 3, "rate": {"limit": 5, "per": 2}},
               JSON, expect=200).json()
    # A queue the leader did not hold: set all the same, with a warning.
    assert "q-flow" in set_.pop("warning", ""), set_
    assert set_ == {"queue": "q-flow", "paused": False, "max_running": 3,
                    "max_running_per_key": None, "rate": {"limit": 5, "per": 2.0},
                    "key_weights": {}}, set_
    paused = api("POST", F, "/queues/q-flow/pause", expect=200).json()
    assert paused["paused"] is True and "warning" not in paused, paused
    q = next(q for q in api("GET", F, "/queues", expect=200).json()["queues"]
             if q["queue"] == "q-flow")
    assert q["limits"] == {"paused": True, "max_running": 3, "max_running_per_key": None,
                           "rate": {"limit": 5, "per": 2.0}, "key_weights": {}}, q
    weights = api("PUT", F, "/queues/q-flow", {"key_weights": {"gold": 3, "tin": 1}}, JSON,
                  expect=200).json()
    assert weights["key_weights"] == {"gold": 3, "tin": 1}, weights
    problem(api("PUT", L, "/queues/q-flow", {"key_weights": {"gold": 0}}, JSON, expect=400),
            "invalid-field")
    # The backlog per key and the activity chart, from either node.
    for i in range(3):
        item = {"payload": i, "queue": "q-flow", **({"key": "gold"} if i else {})}
        api("POST", L, "/work", item, JSON, expect=202)
    keys = api("GET", F, "/queues/q-flow/keys?limit=1", expect=200).json()
    assert keys["keys"] == [{"key": "gold", "pending": 2, "scheduled": 0, "running": 0}], keys
    assert keys["other"] == {"keys": 1, "pending": 1, "scheduled": 0, "running": 0}, keys
    problem(api("GET", L, "/queues/q-flow/keys?limit=1000", expect=400), "invalid-parameter")
    problem(api("GET", L, "/queues/bad%20q/keys", expect=400), "invalid-path")
    for base in (L, F):
        act = api("GET", base, "/activity?minutes=2", expect=200).json()
        assert sum(act["queues"]["q-flow"]["accepted"]) == 3, act
    problem(api("GET", L, "/activity?minutes=0", expect=400), "invalid-parameter")
    api("PUT", L, "/queues/q-flow", {"key_weights": None}, JSON, expect=200)
    api("POST", L, "/bulk/cancel", {"queue": "q-flow"}, JSON, expect=200)  # room under --max-open
    cleared = api("PUT", L, "/queues/q-flow", {"max_running": None, "rate": None}, JSON,
                  expect=200).json()
    assert cleared["max_running"] is None and cleared["rate"] is None, cleared
    assert api("POST", L, "/queues/q-flow/resume", expect=200).json()["paused"] is False
    problem(api("PUT", L, "/queues/q-flow", {"max_running": 0}, JSON, expect=400),
            "invalid-field")
    for path in ("/queues/bad%20q/pause", "/queues/bad%20q/resume"):
        problem(api("POST", L, path, expect=400), "invalid-path")
    problem(api("PUT", L, "/queues/bad%20q", {"paused": True}, JSON, expect=400), "invalid-path")
    # Bulk actions by filter, through the follower.
    for i in range(3):
        api("POST", L, "/work", {"id": f"bulk-{i}", "payload": i, "queue": "q-filter"}, JSON,
            expect=202)
    got = [api("POST", F, "/bulk/cancel", {"queue": "q-filter", "limit": 2}, JSON,
               expect=200).json(),
           api("POST", F, "/bulk/cancel", {"queue": "q-filter"}, JSON, expect=200).json(),
           api("POST", F, "/bulk/retry", {"queue": "q-filter"}, JSON, expect=200).json()]
    assert got == [{"cancelled": 2, "more": True}, {"cancelled": 1, "more": False},
                   {"retried": 0, "more": False}], got
    problem(api("POST", L, "/bulk/cancel", {"status": "dead"}, JSON, expect=400), "invalid-field")
    problem(api("POST", L, "/bulk/retry", {"limit": 0}, JSON, expect=400), "invalid-field")


def schedules_graphs_batches(L, F):
    """Schedules, dependencies and batches, through both nodes."""
    body = {"cron": "0 3 * * *", "timezone": "Europe/Berlin",
            "work": {"queue": "q-sched", "payload": {"r": 1}}}
    s = api("PUT", F, "/schedules/nightly", body, JSON, expect=200).json()
    assert s["name"] == "nightly" and len(s["next"]) == 5 and s["catch_up"] == "last", s
    for bad, kind in (({**body, "cron": "* *"}, "invalid-cron"),
                      ({**body, "timezone": "Nowhere/Land"}, "invalid-timezone"),
                      ({**body, "overlap": "sometimes"}, "invalid-field"),
                      ({"cron": "0 3 * * *"}, "missing-field"),
                      ({**body, "colour": 1}, "unknown-field")):
        problem(api("PUT", L, "/schedules/nightly", bad, JSON, expect=400), kind)
    problem(api("PUT", L, "/schedules/bad%20name", body, JSON, expect=400), "invalid-path")
    listed = api("GET", L, "/schedules", expect=200).json()["schedules"]
    assert [x["name"] for x in listed] == ["nightly"] and listed[0]["last_run"] is None, listed
    assert api("GET", F, "/schedules/nightly", expect=200).json()["cron"] == "0 3 * * *"
    problem(api("GET", L, "/schedules/none", expect=404), "not-found")
    # Past --max-schedules (1 here) a new one is refused; replacing is not.
    problem(api("PUT", F, "/schedules/second", body, JSON, expect=409), "too-many-schedules")
    problem(api("GET", L, "/schedules/bad%20name", expect=400), "invalid-path")
    assert api("POST", F, "/schedules/nightly/pause", expect=200).json()["next"] == []
    assert api("POST", L, "/schedules/nightly/resume", expect=200).json()["paused"] is False
    for action in ("pause", "resume"):
        problem(api("POST", L, f"/schedules/none/{action}", expect=404), "not-found")
        problem(api("POST", L, f"/schedules/bad%20name/{action}", expect=400), "invalid-path")
    api("DELETE", F, "/schedules/nightly", expect=204)
    problem(api("DELETE", L, "/schedules/nightly", expect=404), "not-found")
    problem(api("DELETE", L, "/schedules/bad%20name", expect=400), "invalid-path")

    # A child waits for its parent, and is cancelled with it.
    g = api("POST", F, "/work", [{"id": "dep-a", "payload": 1, "queue": "q-dep", "delay": 3600},
                                 {"id": "dep-b", "payload": 2, "queue": "q-dep",
                                  "after": ["dep-a"]}], JSON, expect=202).json()
    assert [i["status"] for i in g["items"]] == ["scheduled", "waiting"], g
    problem(api("POST", L, "/work", {"payload": 1, "after": ["dep-none"]}, JSON, expect=404),
            "parent-not-found")
    problem(api("POST", L, "/work", {"payload": 1, "after": "dep-a"}, JSON, expect=400),
            "invalid-field")
    b = api("GET", L, "/work/dep-b", expect=200).json()
    assert b["status"] == "waiting" and b["after"] == ["dep-a"], b
    assert api("GET", F, "/work/dep-a", expect=200).json()["children"] == ["dep-b"]
    assert [w["id"] for w in api("GET", L, "/work?status=waiting", expect=200).json()["items"]] \
        == ["dep-b"]
    api("DELETE", L, "/work/dep-a", expect=200)
    assert api("GET", F, "/work/dep-b", expect=200).json()["status"] == "cancelled"
    history = api("GET", L, "/work/dep-b/events", expect=200).json()["events"]
    assert history[-1]["data"]["reason"] == "parent dep-a is cancelled", history

    # A batch with a callback: counted by status, and published when it ends.
    bt = api("POST", F, "/work", {"items": [{"id": "bat-1", "payload": 1, "queue": "q-bat",
                                             "delay": 3600}],
                                  "batch": {"id": "bat", "callback": {"queue": "q-bat-cb",
                                                                      "payload": {"all": 1}}}},
             JSON, expect=202).json()
    assert bt["batch"] == "bat" and bt["items"][0]["status"] == "scheduled", bt
    got = api("GET", L, "/batches/bat", expect=200).json()
    assert got["counts"]["scheduled"] == 1 and got["finished"] is False, got
    problem(api("POST", L, "/work", {"payload": 1, "batch": "bat-none"}, JSON, expect=404),
            "batch-not-found")
    problem(api("GET", L, "/batches/none", expect=404), "not-found")
    problem(api("GET", L, "/batches/bad%20id", expect=400), "invalid-path")
    api("DELETE", L, "/work/bat-1", expect=200)
    got = api("GET", F, "/batches/bat", expect=200).json()
    assert got["finished"] is True and got["counts"]["cancelled"] == 1, got
    assert got["callback_id"] == "bat~callback", got
    st = Stream(L, "/results?work_id=bat&after=0")
    assert st.check_open() is None
    st.drain()
    ends = check_messages(st)
    assert [(d["status"], d["counts"]["cancelled"]) for d in ends] == [("batch", 1)], ends
    st.close()
    api("DELETE", L, "/work/bat~callback", expect=200)


def limits_and_operations(L, F):
    # Fill the leader up to --max-open: 429, and nothing of that request is created.
    def fill(base, ids):
        items = [{"id": i, "payload": 0, "queue": "q-fill"} for i in ids]
        return api("POST", base, "/work", items if len(items) > 1 else items[0], JSON).status
    created, n = [], 0
    while True:
        ids = [f"fill-{n}-{j}" for j in range(MAX_BATCH)]
        if fill(L, ids) == 429:
            break
        created += ids
        n += 1
        assert n <= MAX_OPEN // MAX_BATCH, \
            f"no 429 with {len(created)} open (--max-open {MAX_OPEN})"
    problem(api("GET", L, f"/work/{ids[0]}", expect=404), "not-found")
    for k in range(MAX_BATCH + 1):
        if fill(L, [f"fill-s{k}"]) == 429:
            break
        created.append(f"fill-s{k}")
    problem(api("POST", F, "/work", {"id": "fill-f", "payload": 0}, JSON, expect=429), "queue-full")
    # Reopening dead work counts too.
    problem(api("POST", F, "/work/t1/retry", expect=429), "queue-full")
    problem(api("POST", F, "/bulk/retry", {}, JSON, expect=429), "queue-full")
    assert api("GET", L, "/work/t1", expect=200).json()["status"] == "dead"
    for wid in created:
        api("DELETE", L, f"/work/{wid}", expect=200)

    queue_flow(L, F)
    m = api("GET", L, "/metrics", expect=200).text
    routes = set(re.findall(r'route="([^"]+)"', m))
    op_ids = {op["operationId"] for op in C.ops.values()}
    assert routes and routes <= op_ids | {"unmatched"}, \
        f"metrics route labels that are no operationId: {routes - op_ids}"
    assert "unmatched" in routes, "404s and 405s count as route=\"unmatched\""
    codes = set(re.findall(r'workd_http_requests_total\{route="[^"]+",code="([^"]+)"\}', m))
    assert codes and codes <= {"1xx", "2xx", "3xx", "4xx", "5xx"}, codes
    assert re.search(r'^workd_events_total\{type="retried"\} 1$', m, re.M), \
        "the leader counts the operator's retry"
    assert re.search(r'^workd_queue_depth\{queue="q-list",state="scheduled"\} 1$', m, re.M), m
    api("GET", F, "/metrics", expect=200)
    api("GET", F, "/healthz", expect=200)


def bearer(token):
    return {"Authorization": f"Bearer {token}"}


def authentication(cluster):
    """A node with tokens: open routes stay open; every other operation answers
    401 without a valid token and 403 without its scope; admin has every scope;
    ?access_token= stands in for the header."""
    tokens = " ".join(f"{scope}:{token}" for scope, token in TOKENS.items())
    s3 = cluster.start_server("s3", extra_args=["--max-body", str(MAX_BODY),
                                                "--sse-keepalive", "300ms"],
                              env={"WORKD_TOKENS": tokens})
    wait_leader(s3.url)
    A, client, worker, admin = s3.url, TOKENS["client"], TOKENS["worker"], TOKENS["admin"]
    assert api("GET", A, "/readyz", expect=200).json()["is_leader"] is False
    api("GET", A, "/healthz", expect=200)
    api("GET", A, "/", expect=200)
    api("GET", A, "/dashboard/index.html", expect=200)
    # Routing comes first: no token is asked of a path or method that has no route.
    problem(api("GET", A, "/nope", expect=404), "no-route")
    problem(api("PATCH", A, "/work", expect=405), "method-not-allowed")

    for (method, template), op in sorted(C.ops.items()):
        scope = op_scope(op)
        if scope is None:
            continue
        path = sample_path(template)
        body, headers = ("{}", JSON) if op.get("requestBody") else (None, {})
        for auth in ({}, bearer("x" * 20), {"Authorization": f"Basic {client}"},
                     {"Authorization": "Bearer"}):
            r = api(method, A, path, body, {**headers, **auth}, expect=401)
            problem(r, "unauthorized")
            assert r.headers["WWW-Authenticate"] == 'Bearer realm="workd"', r.headers
        for other in ("client", "worker"):
            if other != scope:
                problem(api(method, A, path, body, {**headers, **bearer(TOKENS[other])},
                            expect=403), "forbidden")

    # Each token does what its scope allows; admin does everything.
    r = api("POST", A, "/work", {"id": "auth-1", "payload": 1, "queue": "q-auth"},
            {**JSON, **bearer(client)}, expect=202)  # forwarded to the leader
    assert r.json()["created"] is True, r.json()
    for token in (client, admin):
        api("GET", A, "/work/auth-1", headers=bearer(token), expect=200)
        api("GET", A, "/queues", headers=bearer(token), expect=200)
    for token in (worker, admin):
        api("POST", A, "/workers/w-auth/pull", {"queues": ["q-auth-none"]},
            {**JSON, **bearer(token)}, expect=200)
    api("GET", A, "/cluster", headers=bearer(admin), expect=200)
    assert "workd_http_requests_total" in api("GET", A, "/metrics", headers=bearer(admin),
                                              expect=200).text
    api("DELETE", A, "/work/auth-1", headers=bearer(admin), expect=200)

    # ?access_token= is refused where a header can be sent, with or without one.
    problem(api("GET", A, f"/work/auth-1?access_token={client}", expect=400), "token-in-url")
    problem(api("GET", A, f"/work?access_token={admin}&queue=q-auth", headers=bearer(admin),
                expect=400), "token-in-url")
    # EventSource, which cannot send headers, follows the results this way.
    s = Stream(A, f"/results?work_id=auth-1&after=0&access_token={client}")
    assert s.check_open() is None
    s.drain()
    assert [(d["id"], d["status"]) for d in check_messages(s)] == [("auth-1", "cancelled")]
    s.close()
    problem(Stream(A, "/results").refused(), "unauthorized")
    problem(Stream(A, f"/results?access_token={worker}").refused(), "forbidden")
    s3.stop()


if __name__ == "__main__":
    run_tests(globals())
