"""A database per shard (issue 31; docs/operations.md, "A database per
shard"): the home database (--database-url) keeps the cluster's tables and
every shard without a database of its own (shard 0 always); a shard given one
(--shard-databases "2=URL 3=URL", several shards may share one) keeps all of
its rows there: leader lock, workd_shards row, log, open and done work, inbox,
schedules, batches, its queues' rows. A shard's database is chosen before its
first leader and never changes: a server whose setting contradicts what the
databases record refuses to start ("the shard databases: ..."). A client and
a worker still see one cluster. The extra databases are private PostgreSQL
servers of their own (Cluster.add_database)."""

import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import SSEClient, http, promtool, run_tests, wait_until  # noqa: E402
from workd import (JSON, complete, expect, get_work, pull, shard_of, submit,  # noqa: E402
                   wait_status)
from test_shards import FAST, queues_per_shard  # noqa: E402
from test_webhooks import Receiver, new_secret, put_sub  # noqa: E402


class Layout:
    """Where each shard of a cluster lives: {shard: database name}, "home"
    for the home database, other names for databases of Cluster.add_database."""

    def __init__(self, cluster, shards, own):
        self.cluster, self.shards = cluster, shards
        self.db_of = {s: own.get(s, "home") for s in range(shards)}
        self.urls = {"home": cluster.db_url,
                     **{n: cluster.database_url(n) for n in set(own.values())}}

    def spec(self):
        """The --shard-databases value."""
        return " ".join(f"{s}={self.urls[d]}" for s, d in sorted(self.db_of.items())
                        if d != "home")

    def args(self, *extra):
        return ["--shards", str(self.shards), *FAST, "--shard-databases", self.spec(), *extra]

    def url(self, shard):
        return self.urls[self.db_of[shard]]

    def psql(self, db, sql):
        return self.cluster.psql(sql, url=self.urls[db])

    def shards_of(self, db):
        return {s for s, d in self.db_of.items() if d == db}

    def leaders(self):
        """{shard: (leader url, term)} from every database's workd_shards; a
        shard's row anywhere but in its own database fails the test at once."""
        out = {}
        for db in self.urls:
            rows = self.psql(db, "SELECT shard, url, term FROM workd_shards ORDER BY shard")
            for r in rows.splitlines():
                s, url, term = r.split("|")
                assert self.db_of.get(int(s)) == db, \
                    f"shard {s}'s leader row is in the {db} database, not in " \
                    f"{self.db_of.get(int(s))}"
                out[int(s)] = (url, int(term))
        return out

    def all_led(self):
        return len(self.leaders()) == self.shards

    def wait_led(self, timeout=20):
        wait_until(self.all_led, timeout, what=lambda: "every shard to elect a leader, each in "
                   f"its own database (led: {self.leaders()}, layout {self.db_of})")

    def by_db(self, sql):
        """{db: rows} of sql run in every database."""
        return {db: self.psql(db, sql) for db in self.urls}

    def shards_in(self, table, where="true"):
        """{db: sorted shards that have rows of `table`} in every database."""
        out = {}
        for db in self.urls:
            rows = self.psql(db, f"SELECT DISTINCT shard FROM {table} WHERE {where}")
            out[db] = sorted(int(x) for x in rows.split())
        return out

    def count(self, table, where="true"):
        """Rows of `table` matching `where` over every database."""
        return sum(int(self.psql(db, f"SELECT count(*) FROM {table} WHERE {where}"))
                   for db in self.urls)


def start(cluster, name, layout, extra=(), **kw):
    return cluster.start_server(name, extra_args=layout.args(*extra), **kw)


def psql_error(url, sql):
    """Runs sql, which must fail; returns psql's verbose error (with SQLSTATE and hint)."""
    r = subprocess.run(["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-v",
                        "VERBOSITY=verbose", "-d", url, "-c", sql],
                       capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PGCONNECT_TIMEOUT": "10"})
    assert r.returncode != 0, f"the database accepted: {sql} ({r.stdout.strip()})"
    return r.stderr


def run_job(url, q, work_id, result):
    """Submits work_id to q and completes it through a worker of q."""
    submit(url, {"id": work_id, "queue": q, "payload": {"q": q}})
    jobs = pull(url, f"w-{q}", queues=[q], wait=5)
    assert [j["id"] for j in jobs] == [work_id], f"the worker of {q} got {jobs}, not {work_id}"
    complete(url, f"w-{q}", jobs[0], result)


def event_ids(events):
    return [(e["data"]["id"], e["id"]) for e in events]


def check_once(events, want, what):
    got = Counter(e["data"]["id"] for e in events)
    twice = [w for w, n in got.items() if n > 1]
    assert not twice, f"{what}: results seen more than once: {twice} ({event_ids(events)})"
    assert set(got) == set(want), \
        f"{what}: missing {sorted(set(want) - set(got))}, extra {sorted(set(got) - set(want))}"


# ----------------------------------------------------------------- the tests

def test_four_shards_in_three_databases(cluster):
    """Shards 2 and 3 in a second PostgreSQL, shard 1 in a third: every
    shard's job runs to completion, its rows are in its own database and
    nowhere else, and the cluster reads as one (GET /work, /results with a
    resume, /cluster, /metrics) on the node that leads and on a front-end
    node (which follows every shard's log through its listener)."""
    cluster.add_database("pg2")
    cluster.add_database("pg3")
    lay = Layout(cluster, 4, {1: "pg3", 2: "pg2", 3: "pg2"})
    s = start(cluster, "s1", lay)
    lay.wait_led()
    f = start(cluster, "front", lay, extra=["--roles", "frontend"])
    recorded = lay.psql("home", "SELECT string_agg(shard::text, ',' ORDER BY shard)"
                        " FROM workd_shard_databases")
    assert recorded == "1,2,3", f"the home database records shards 1,2,3 elsewhere: {recorded}"
    home_id = lay.psql("home", "SELECT database FROM workd_cluster")
    for db, keeps in (("pg2", "{2,3}"), ("pg3", "{1}")):
        got = lay.psql(db, "SELECT home, keeps FROM workd_cluster")
        assert got == f"{home_id}|{keeps}", f"{db} says it keeps {keeps} of {home_id}: {got}"

    qs = {shard: q for shard, (q,) in queues_per_shard(4).items()}
    for shard, q in qs.items():
        expect(http("PUT", f"{s.url}/queues/{q}", {"rate": {"limit": 50, "per": 1}}, JSON), 200,
               f"a rate limit on {q} (shard {shard})")
    live = {n.name: SSEClient(n.url + "/results") for n in (s, f)}
    try:
        for n in (s, f):
            wait_until(lambda: live[n.name].last_event_id, 5, what=f"{n.name}'s ready id")
        start_id = live[f.name].last_event_id
        assert len(start_id.split(".")) == 4, f"an event id of 4 shards has 4 seqs: {start_id}"
        first = {f"a{shard}": q for shard, q in qs.items()}
        for work_id, q in first.items():
            run_job(s.url, q, work_id, {"done": work_id})
        for work_id in first:
            for n in (s, f):
                w = wait_status(n.url, work_id, "completed")
                assert w["result"] == {"done": work_id} and w["queue"] == first[work_id], \
                    f"GET /work/{work_id} on {n.name}: {w}"
        for n in (s, f):
            live[n.name].wait_count(len(first), timeout=15)
        time.sleep(0.5)  # a declared window: no result may come twice
        seen = list(live[f.name].events)
        check_once(live[s.name].events, first, "the live /results stream of the leading node")
        check_once(seen, first, "the live /results stream of the front-end node")
    finally:
        for c in live.values():
            c.close()
    for e in seen:
        assert len(e["id"].split(".")) == 4, f"event id {e['id']} should have 4 seqs"

    # Physically in the right database, and nowhere else.
    for table in ("workd_done", "workd_log"):
        got = lay.shards_in(table)
        want = {db: sorted(lay.shards_of(db)) for db in lay.urls}
        assert got == want, f"{table}: the shards each database holds rows of: {got}, want {want}"
    for shard, q in qs.items():
        where = lay.by_db(f"SELECT count(*) FROM workd_done WHERE id = 'a{shard}'")
        assert {db for db, n in where.items() if n == "1"} == {lay.db_of[shard]} and \
            sum(int(n) for n in where.values()) == 1, \
            f"a{shard} (shard {shard}) should be done once, in {lay.db_of[shard]}: {where}"
        where = lay.by_db(f"SELECT count(*) FROM workd_queues WHERE queue = '{q}'")
        assert {db for db, n in where.items() if n == "1"} == {lay.db_of[shard]} and \
            sum(int(n) for n in where.values()) == 1, \
            f"queue {q}'s row (shard {shard}) should be in {lay.db_of[shard]}: {where}"
    assert lay.count("workd_open") == 0, lay.by_db("SELECT id, shard FROM workd_open")

    # Reads over every database.
    for n in (s, f):
        listed = expect(http("GET", n.url + "/work?limit=100"), 200, "GET /work").json()
        assert sorted(w["id"] for w in listed["items"]) == sorted(first), \
            f"GET /work on {n.name} lists every shard's work: " \
            f"{[w['id'] for w in listed['items']]}"

    # Reconnecting misses nothing and repeats nothing.
    second = {f"b{shard}": q for shard, q in qs.items()}
    for work_id, q in second.items():
        run_job(s.url, q, work_id, {"done": work_id})
    for work_id in second:
        wait_status(s.url, work_id, "completed")
    for k, e in enumerate(seen):
        want = [x["data"]["id"] for x in seen[k + 1:]] + list(second)
        n = (s, f)[k % 2]  # a client reconnects anywhere
        with SSEClient(n.url + "/results", last_event_id=e["id"]) as again:
            again.wait_count(len(want), timeout=10)
            time.sleep(0.3)  # a declared window: no repeat may follow
            check_once(again.events, want, f"/results on {n.name} resumed after {e['id']}")
    for n in (s, f):
        with SSEClient(n.url + "/results", last_event_id=start_id) as again:
            again.wait_count(8, timeout=10)
            time.sleep(0.3)  # a declared window: no repeat may follow
            check_once(again.events, list(first) + list(second),
                       f"/results on {n.name} resumed at {start_id}")

    for n in (s, f):
        c = expect(http("GET", n.url + "/cluster"), 200, f"GET /cluster on {n.name}").json()
        assert [x["shard"] for x in c["shards"]] == [0, 1, 2, 3], c.get("shards")
        for x in c["shards"]:
            assert x["leader"] == s.url and x["term"] >= 1, \
                f"/cluster on {n.name}: shard {x['shard']}: {x}"
        where = [x.get("database") for x in c["shards"]]
        assert where == ["home", "shard-1", "shard-2", "shard-2"], \
            f"/cluster on {n.name}: where each shard's rows are: {where}"
    text = expect(http("GET", s.url + "/metrics"), 200, "GET /metrics").text
    for shard in range(4):
        assert f'workd_commit_events_count{{shard="{shard}"}}' in text, \
            f"/metrics should show shard {shard}'s commits"
    exe = promtool()
    if exe:
        r = subprocess.run([exe, "check", "metrics"], input=text.encode(), capture_output=True,
                           timeout=30)
        assert r.returncode == 0, f"promtool: {r.stdout.decode()}{r.stderr.decode()}"


def refused(cluster, name, args, env=None, shard=None, why=()):
    """A server started with `args` exits non-zero, its log saying "the shard
    databases:", naming the shard and each of `why`."""
    p = cluster.start_server(name, extra_args=args, env=env, wait_ready=False)
    rc = p.stopped_with(30)
    assert rc != 0, f"{name} should have been refused, exited {rc}: {p.log_tail()}"
    line = next((x for x in p.log_text().splitlines() if "the shard databases:" in x), None)
    assert line, f"{name}: no line \"the shard databases: ...\" in its log:\n{p.log_tail()}"
    for word in ([f"shard {shard}"] if shard is not None else []) + list(why):
        assert word in line, f"{name}: the refusal should say {word!r}: {line}"
    return line


def test_a_setting_that_contradicts_the_databases_is_refused(cluster):
    pg2 = cluster.add_database("pg2")
    lay = Layout(cluster, 4, {2: "pg2", 3: "pg2"})
    a = start(cluster, "a", lay)
    lay.wait_led()
    before = lay.leaders()
    recorded = lay.psql("home", "SELECT shard, database FROM workd_shard_databases ORDER BY 1")
    base = pg2.rsplit("/", 1)[0]
    # Other databases on pg2's server: a fresh one, and the shard database of
    # another cluster (whose home is another database there too).
    for db in ("fresh", "otherhome", "othershard"):
        cluster.psql(f"CREATE DATABASE {db}", url=pg2)
    other = cluster.start_process("other-cluster", [
        str(cluster.bin_dir / "workd-server"), "migrate", "--database-url", f"{base}/otherhome",
        "--shards", "4", "--shard-databases", f"2={base}/othershard"])
    assert other.stopped_with(30) == 0, f"another cluster's migrate: {other.log_tail()}"
    own = lay.spec()

    refused(cluster, "none", ["--shards", "4", *FAST], shard=2, why=["--shard-databases"])
    refused(cluster, "none-frontend", ["--shards", "4", "--roles", "frontend"], shard=2,
            why=["--shard-databases"])
    refused(cluster, "other-db", ["--shards", "4", *FAST, "--shard-databases",
                                  f"2={base}/fresh 3={lay.url(3)}"],
            shard=2, why=["--shard-databases"])
    refused(cluster, "nine", ["--shards", "4", *FAST, "--shard-databases",
                              f"{own} 9={base}/fresh"], shard=9, why=["4 shards"])
    refused(cluster, "move-1", ["--shards", "4", *FAST, "--shard-databases", f"{own} 1={pg2}"],
            shard=1, why=["never"])
    home_again = cluster.db_url.replace("127.0.0.1", "localhost")
    refused(cluster, "home-again", ["--shards", "4", *FAST, "--shard-databases",
                                    f"2={home_again} 3={lay.url(3)}"],
            shard=2, why=["home database"])
    refused(cluster, "foreign", ["--shards", "4", *FAST, "--shard-databases",
                                 f"2={base}/othershard 3={lay.url(3)}"],
            shard=2, why=["another cluster"])

    # The running cluster is unharmed, and nothing was recorded.
    assert lay.leaders() == before, f"the leaders moved: {before} -> {lay.leaders()}"
    assert lay.psql("home", "SELECT shard, database FROM workd_shard_databases ORDER BY 1") \
        == recorded, "the refusals changed where the shards live"
    fresh = cluster.psql("SELECT home IS NULL, keeps IS NULL FROM workd_cluster",
                         url=f"{base}/fresh")
    assert fresh == "t|t", f"a refused database must not be recorded as a shard's: {fresh}"
    assert lay.psql("pg2", "SELECT keeps FROM workd_cluster") == "{2,3}"
    qs = {shard: q for shard, (q,) in queues_per_shard(4).items()}
    for shard, q in qs.items():
        run_job(a.url, q, f"after-{shard}", "ok")
        wait_status(a.url, f"after-{shard}", "completed")
    # The same setting, given by the environment and with the databases'
    # URLs spelled another way (a database is known by its id), is a second
    # node of the cluster.
    b = cluster.start_server("b", extra_args=["--shards", "4", *FAST],
                             env={"WORKD_SHARD_DATABASES": own.replace("127.0.0.1", "localhost")})
    for shard in qs:
        assert get_work(b.url, f"after-{shard}")["status"] == "completed"


def test_ids_across_databases(cluster):
    """An id is one work item in the whole cluster, whichever database keeps
    the shard it is first submitted to."""
    cluster.add_database("pg2")
    lay = Layout(cluster, 4, {2: "pg2", 3: "pg2"})
    s = start(cluster, "s1", lay)
    lay.wait_led()
    qs = {shard: q for shard, (q,) in queues_per_shard(4).items()}
    for first, then in ((0, 2), (2, 0), (3, 1)):
        work_id = f"job-{first}-{then}"
        made = submit(s.url, {"id": work_id, "queue": qs[first], "payload": {"n": 1}})
        assert made["created"] is True, made
        again = submit(s.url, {"id": work_id, "queue": qs[then], "payload": {"n": 1}})
        assert again["created"] is False and again["status"] == "pending", \
            f"{work_id} (shard {first}) resubmitted on shard {then}: {again}"
        assert get_work(s.url, work_id)["queue"] == qs[first], get_work(s.url, work_id)
        r = http("POST", s.url + "/work",
                 {"id": work_id, "queue": qs[then], "payload": {"n": 2}}, JSON)
        expect(r, 409, f"{work_id} again with another payload on shard {then}")
        assert r.json()["type"].endswith("/conflict"), r.text
        n = lay.count("workd_open", f"id = '{work_id}'")
        assert n == 1, f"{work_id}: {n} rows over the databases: " \
            f"{lay.by_db('SELECT id, shard FROM workd_open')}"

    terms = lay.leaders()
    answers = {}

    def send(i, q):
        r = http("POST", s.url + "/work", {"id": f"twin-{i}", "queue": q, "payload": i}, JSON,
                 timeout=60)
        answers[(i, q)] = (r.status, r.json().get("created") if r.status == 202 else r.text)

    for i in range(30):
        ts = [threading.Thread(target=send, args=(i, qs[shard])) for shard in (0, 2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    bad = {k: v for k, v in answers.items() if v[0] != 202}
    assert not bad, f"every submission is accepted (one of each pair as existing): {bad}"
    twice = [i for i in range(30)
             if sorted(answers[(i, qs[shard])][1] for shard in (0, 2)) != [False, True]]
    rows = lay.by_db("SELECT count(*) FROM workd_open WHERE id LIKE 'twin-%'")
    assert not twice and sum(int(n) for n in rows.values()) == 30, \
        f"each id is one job: created twice for {twice}; rows per database {rows}"
    assert lay.leaders() == terms, f"a leader stepped down: {terms} -> {lay.leaders()}"


def test_dependencies_across_databases(cluster):
    """As docs/architecture.md says for shards: a child may name a parent of
    another shard once it has finished; while that parent is open, 409
    cross-shard. Here the parent's shard keeps its rows in another database."""
    cluster.add_database("pg2")
    lay = Layout(cluster, 4, {2: "pg2", 3: "pg2"})
    s = start(cluster, "s1", lay)
    lay.wait_led()
    qs = {shard: q for shard, (q,) in queues_per_shard(4).items()}
    for parent_shard, child_shard in ((2, 0), (0, 3)):
        parent, child = f"parent-{parent_shard}", f"child-{child_shard}"
        submit(s.url, {"id": parent, "queue": qs[parent_shard], "payload": 1})
        r = http("POST", s.url + "/work", {"id": child, "queue": qs[child_shard], "payload": 2,
                                          "after": [parent]}, JSON)
        expect(r, 409, f"a child in shard {child_shard} of a parent open in shard {parent_shard}")
        assert r.json()["type"].endswith("/cross-shard"), r.text
        jobs = pull(s.url, "w", queues=[qs[parent_shard]], wait=5)
        assert [j["id"] for j in jobs] == [parent], jobs
        complete(s.url, "w", jobs[0], "parent done")
        wait_status(s.url, parent, "completed")
        made = submit(s.url, {"id": child, "queue": qs[child_shard], "payload": 2,
                              "after": [parent]})
        assert made["created"] is True and made["status"] == "pending", \
            f"the child of finished {parent} (shard {parent_shard}, {lay.db_of[parent_shard]}" \
            f" database) should be pending: {made}"
        jobs = pull(s.url, "w", queues=[qs[child_shard]], wait=5)
        assert [j["id"] for j in jobs] == [child], f"the child should run: {jobs}"
        complete(s.url, "w", jobs[0], "child done")
        wait_status(s.url, child, "completed")
        where = lay.by_db(f"SELECT count(*) FROM workd_done WHERE id = '{child}'")
        assert where[lay.db_of[child_shard]] == "1" and \
            sum(int(n) for n in where.values()) == 1, f"{child} done in its shard's db: {where}"


def test_sql_submit_in_the_database_of_the_queues_shard(cluster):
    cluster.add_database("pg2")
    lay = Layout(cluster, 4, {2: "pg2", 3: "pg2"})
    s = start(cluster, "s1", lay)
    lay.wait_led()
    qs = {shard: q for shard, (q,) in queues_per_shard(4).items()}

    def call(work_id, q):
        return f"SELECT workd.submit('{{\"n\": 1}}', id => '{work_id}', queue => '{q}')"
    err = psql_error(lay.urls["home"], call("sql-home-2", qs[2]))
    assert "22023" in err and "shard 2" in err and "HINT" in err, \
        f"workd.submit at home for shard 2's queue: {err}"
    err = psql_error(lay.urls["pg2"], call("sql-pg2-0", qs[0]))
    assert "22023" in err and "shard 0" in err, f"workd.submit in pg2 for shard 0's queue: {err}"
    err = psql_error(lay.urls["pg2"], call("sql-pg2-1", qs[1]))
    assert "22023" in err and "shard 1" in err, f"workd.submit in pg2 for shard 1's queue: {err}"
    assert lay.count("workd_inbox") == 0, "a refused SQL submission left an inbox row"
    for shard, q in qs.items():
        lay.psql(lay.db_of[shard], call(f"sql-{shard}", q))
    for shard, q in qs.items():
        w = wait_status(s.url, f"sql-{shard}", "pending", timeout=15)
        assert w["queue"] == q, w
        jobs = pull(s.url, "w", queues=[q], wait=5)
        assert [j["id"] for j in jobs] == [f"sql-{shard}"], jobs
        complete(s.url, "w", jobs[0], "ok")
        wait_status(s.url, f"sql-{shard}", "completed")
        where = lay.by_db(f"SELECT count(*) FROM workd_done WHERE id = 'sql-{shard}'")
        assert where[lay.db_of[shard]] == "1" and sum(int(n) for n in where.values()) == 1, \
            f"sql-{shard} done in {lay.db_of[shard]}: {where}"
    assert lay.count("workd_inbox") == 0, lay.by_db("SELECT id, shard FROM workd_inbox")


def completed_counts(lay, prefix):
    """{work_id: completed events} over every database, and the ids whose
    completed events are in a database other than their shard's."""
    counts, misplaced = Counter(), []
    for db in lay.urls:
        rows = lay.psql(db, "SELECT work_id, shard, count(*) FROM workd_events WHERE type ="
                        f" 'completed' AND work_id LIKE '{prefix}%' GROUP BY 1, 2")
        for r in rows.splitlines():
            work_id, shard, n = r.split("|")
            counts[work_id] += int(n)
            if lay.db_of[int(shard)] != db:
                misplaced.append((work_id, shard, db))
    return counts, misplaced


class Results:
    """A client of /results that reconnects with Last-Event-ID whenever its
    stream ends: its events are everything it was given."""

    def __init__(self, url):
        self.url, self.streams = url, [SSEClient(url + "/results")]
        wait_until(lambda: self.streams[0].last_event_id, 5, what="the stream's ready id")

    def events(self):
        last = self.streams[-1]
        if last.done.is_set():
            try:
                self.streams.append(SSEClient(self.url + "/results",
                                              last_event_id=last.last_event_id))
            except (AssertionError, OSError):
                pass  # the node is not answering yet: try again on the next call
        return [e for c in self.streams for e in list(c.events)]

    def wait_all(self, ids, timeout):
        want = set(ids)
        try:
            wait_until(lambda: {e["data"]["id"] for e in self.events()} >= want, timeout,
                       what=lambda: f"every result on /results (missing "
                       f"{sorted(want - {e['data']['id'] for e in self.events()})[:10]}, "
                       f"{len(self.streams)} connections)")
            time.sleep(0.3)  # a declared window: no repeat may follow
            got = Counter(e["data"]["id"] for e in self.events() if e["data"]["id"] in want)
            twice = sorted(w for w, n in got.items() if n > 1)
            assert not twice, f"results seen more than once on /results: {twice[:10]}"
        finally:
            for c in self.streams:
                c.close()


def test_the_second_postgresql_restarted_under_load(cluster):
    """pg2 (shards 2 and 3) fast-restarted while their work is submitted and
    worked: every accepted job completes exactly once, and its result is on
    /results once; the leaders come back."""
    cluster.add_database("pg2")
    lay = Layout(cluster, 4, {2: "pg2", 3: "pg2"})
    s = start(cluster, "s1", lay)
    lay.wait_led()
    qs = queues_per_shard(4, per=2)
    queues = qs[2] + qs[3]
    cluster.start_worker("w1", s.url, ["--demo", "--demo-delay", "5ms", "--concurrency", "8"])
    results = Results(s.url)
    total, accepted, refusals = 300, [], Counter()

    def submitter():
        for i in range(total):
            body = {"id": f"f-{i}", "queue": queues[i % len(queues)], "payload": i}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # a client retries the same id until 202
                try:
                    r = http("POST", s.url + "/work", body, JSON, timeout=30)
                except OSError as e:
                    refusals[type(e).__name__] += 1
                    continue
                if r.status == 202:
                    accepted.append(body["id"])
                    break
                refusals[r.status] += 1
                time.sleep(0.05)  # a client's pause before it retries
    t = threading.Thread(target=submitter)
    t.start()
    wait_until(lambda: len(accepted) >= 80 or not t.is_alive(), 30, what="80 accepted jobs")
    restarted_at = len(accepted)
    cluster.db_restart("pg2")
    t.join(120)
    assert not t.is_alive(), f"the submitter is stuck ({len(accepted)} accepted)"
    assert restarted_at < total, "the restart came after every submission: move it earlier"
    assert len(accepted) == total, \
        f"{total - len(accepted)} ids never accepted in 30 s of retries ({dict(refusals)})"

    def done():
        counts, _ = completed_counts(lay, "f-")
        return sum(1 for w in accepted if counts[w] >= 1)
    wait_until(done, 60, until=lambda n: n == total,
               what=lambda: f"every accepted job to complete ({done()} of {total}; "
               f"refusals while submitting {dict(refusals)})")
    counts, misplaced = completed_counts(lay, "f-")
    twice = {w: n for w, n in counts.items() if n > 1}
    assert not twice, f"jobs completed more than once: {twice}"
    assert not misplaced, \
        f"completed events in another database than their shard's: {misplaced[:5]}"
    lay.wait_led(15)
    c = expect(http("GET", s.url + "/cluster"), 200, "GET /cluster").json()
    assert all(x["leader"] == s.url for x in c["shards"]), c["shards"]
    results.wait_all(accepted, 30)


def test_a_shard_database_down_the_others_go_on(cluster):
    """pg2 (shards 2 and 3) stopped for a few seconds: shards 0 and 1 go on
    with generated ids; a client-chosen id cannot be checked against pg2
    meanwhile and is refused (503 database-unavailable, docs/architecture.md),
    and is accepted again soon after pg2 is back. A schedule of shard 0 (its
    tick ids are looked up in pg2 too, so its ticks wait) fires every tick
    once in the end, none skipped (catch_up all)."""
    cluster.add_database("pg2")
    lay = Layout(cluster, 4, {2: "pg2", 3: "pg2"})
    s = start(cluster, "s1", lay)
    lay.wait_led()
    qs = {shard: q for shard, (q,) in queues_per_shard(4).items()}
    spec = {"cron": "* * * * * *", "overlap": "allow", "catch_up": "all", "catch_up_max": 100,
            "work": {"queue": qs[0], "payload": 1}}
    expect(http("PUT", s.url + "/schedules/tick0", spec, JSON), 200, "PUT a schedule")
    cluster.start_worker("w1", s.url, ["--demo", "--concurrency", "4",
                                       "--queues", f"{qs[0]},{qs[1]}"])

    def ticks():
        return json.loads(lay.psql("home", (
            "SELECT coalesce(json_agg(json_build_object('tick', (data->>'tick')::bigint,"
            " 'work', data->>'work_id', 'data', data) ORDER BY seq), '[]') FROM workd_events"
            " WHERE type = 'tick' AND data->>'schedule' = 'tick0'")))
    wait_until(lambda: len(ticks()) >= 2, 10, what="two ticks before pg2 stops")

    def db_ms():
        return int(lay.psql("home", "SELECT (extract(epoch FROM now()) * 1000)::bigint"))
    cluster.db_stop("pg2")
    down = time.monotonic()
    made, refused_ids = [], Counter()
    k = 0
    while time.monotonic() < down + 4 or k < 3:
        for shard in (0, 1):
            made.append(submit(s.url, {"queue": qs[shard], "payload": k})["id"])
        r = http("POST", s.url + "/work", {"id": f"while-down-{k}", "queue": qs[0],
                                          "payload": k}, JSON)
        refused_ids[(r.status, r.json().get("type", "").rsplit("/", 1)[-1])] += 1
        k += 1
        time.sleep(0.2)  # a client's pace
    assert set(refused_ids) == {(503, "database-unavailable")}, \
        f"ids for shard 0 while pg2 is down: {dict(refused_ids)} (an id cannot be checked)"
    for work_id in made:
        wait_status(s.url, work_id, "completed", timeout=15)
    assert time.monotonic() - down < 15, "the work of shards 0 and 1 waited for pg2"

    cluster.db_start("pg2")
    up, up_ms = time.monotonic(), db_ms()
    n = iter(range(10 ** 6))

    def id_accepted():
        r = http("POST", s.url + "/work", {"id": f"after-up-{next(n)}", "queue": qs[0],
                                          "payload": 1}, JSON)
        return r.status == 202
    wait_until(id_accepted, 35, interval=0.2,
               what="a client-chosen id for shard 0 to be accepted after pg2 is back")
    took = time.monotonic() - up
    print(f"ids accepted again {took:.1f} s after pg2 came back", flush=True)
    lay.wait_led(15)
    wait_until(lambda: ticks()[-1]["tick"] >= up_ms + 2000, 20,
               what=lambda: f"ticks 2 s past pg2's return (the last: {ticks()[-1]})")
    expect(http("POST", s.url + "/schedules/tick0/pause"), 200, "pause the schedule")
    got = ticks()
    times = [t["tick"] for t in got if t["work"]]
    doubles = [t for t, c in Counter(times).items() if c > 1]
    assert not doubles, f"ticks fired twice: {doubles}"
    assert not [t for t in got if not t["work"]], \
        f"ticks skipped while pg2 was down: {[t['data'] for t in got if not t['work']]}"
    gaps = [(a, b) for a, b in zip(times, times[1:]) if b - a != 1000]
    assert not gaps, f"ticks missing between these (ms): {gaps}"


def test_a_node_kill_moves_a_shard_of_the_second_database(cluster):
    """Two nodes started at once on a new cluster (each records where the
    shards live, once between them); spread, then the node leading shard 2
    killed: the other takes it over and no accepted job is lost."""
    cluster.add_database("pg2")
    lay = Layout(cluster, 4, {2: "pg2", 3: "pg2"})
    a = start(cluster, "a", lay, wait_ready=False)
    b = start(cluster, "b", lay, wait_ready=False)
    for n in (a, b):
        cluster.wait_healthy(n, 20)
    lay.wait_led()
    recorded = lay.psql("home", "SELECT string_agg(shard::text, ',' ORDER BY shard)"
                        " FROM workd_shard_databases")
    assert recorded == "2,3", f"shards 2 and 3 recorded once in pg2: {recorded}"
    assert lay.psql("pg2", "SELECT keeps FROM workd_cluster") == "{2,3}"
    nodes = {a.url: a, b.url: b}

    def spread():
        per = Counter(u for u, _ in lay.leaders().values())
        return len(lay.leaders()) == 4 and per[a.url] == 2 and per[b.url] == 2
    wait_until(spread, 40, what=lambda: f"the 4 shards to spread over two nodes: {lay.leaders()}")
    before = lay.leaders()
    victim = nodes[before[2][0]]
    survivor = b if victim is a else a
    qs = queues_per_shard(4, per=1)
    queues = [q for (q,) in qs.values()]
    ids = [submit(survivor.url, {"id": f"k-{i}", "queue": queues[i % 4], "payload": i})["id"]
           for i in range(40)]
    victim.kill()
    wait_until(lambda: all(u == survivor.url for u, _ in lay.leaders().values()), 15,
               what=lambda: f"the survivor to lead every shard: {lay.leaders()}")
    after = lay.leaders()
    for s, (u, term) in before.items():
        if u == survivor.url:
            assert after[s] == (u, term), \
                f"shard {s} of the survivor moved: {before[s]} -> {after[s]}"
        else:
            assert after[s][1] > term, f"shard {s} taken over should have a new term: {after[s]}"
    ids += [submit(survivor.url, {"id": f"k-{i}", "queue": queues[i % 4], "payload": i})["id"]
            for i in range(40, 80)]
    cluster.start_worker("w", survivor.url, ["--demo", "--concurrency", "4"])
    wait_until(lambda: completed_counts(lay, "k-")[0], 40,
               until=lambda c: all(c[w] >= 1 for w in ids),
               what=lambda: "every accepted job to complete after the kill (missing "
               f"{[w for w in ids if not completed_counts(lay, 'k-')[0][w]][:10]})")
    counts, misplaced = completed_counts(lay, "k-")
    assert not [w for w, n in counts.items() if n > 1], counts
    assert not misplaced, misplaced[:5]


def test_growth_puts_new_shards_in_a_database_of_their_own(cluster):
    """Two shards at home, with schedules; stopped and drained, restarted
    with --shards 4 and shards 2 and 3 in a new database: a schedule whose
    queue now belongs to shard 2 or 3 is moved there and fires once a tick."""
    s = cluster.start_server("s1", extra_args=["--shards", "2", *FAST])
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_shards") == "2", 15,
               what="both shards to elect a leader")
    names = [f"q{i}" for i in range(200)]
    moving = next(q for q in names if shard_of(q, 4) in (2, 3))
    staying = next(q for q in names if shard_of(q, 4) in (0, 1))
    for name, q in (("moving", moving), ("staying", staying)):
        spec = {"cron": "* * * * * *", "overlap": "allow", "work": {"queue": q, "payload": 1}}
        expect(http("PUT", f"{s.url}/schedules/{name}", spec, JSON), 200, f"PUT schedule {name}")
    w = cluster.start_worker("w1", s.url, ["--demo", "--concurrency", "4"])

    def ticks(url, name, since=0):
        rows = cluster.psql("SELECT (data->>'tick')::bigint FROM workd_events WHERE type = 'tick'"
                            f" AND data->>'schedule' = '{name}' AND (data->>'tick')::bigint >"
                            f" {since} ORDER BY 1", url=url)
        return [int(x) for x in rows.split()]
    wait_until(lambda: len(ticks(cluster.db_url, "moving")) >= 2, 10, what="two ticks before")
    for name in ("moving", "staying"):
        expect(http("POST", f"{s.url}/schedules/{name}/pause"), 200, f"pause {name}")
    wait_until(lambda: cluster.psql("SELECT count(*) FROM workd_open") == "0", 15,
               what="the open work to drain")
    last = max(ticks(cluster.db_url, "moving") + ticks(cluster.db_url, "staying"))
    w.stop()
    s.stop()

    cluster.add_database("pg2")
    lay = Layout(cluster, 4, {2: "pg2", 3: "pg2"})
    s = start(cluster, "s2", lay)
    lay.wait_led()
    assert lay.psql("home", "SELECT shards FROM workd_cluster") == "4"
    where = lay.by_db("SELECT string_agg(name || ':' || shard, ',' ORDER BY name)"
                      " FROM workd_schedules")
    assert where == {"home": f"staying:{shard_of(staying, 4)}",
                     "pg2": f"moving:{shard_of(moving, 4)}"}, \
        f"the schedule of {moving} (now shard {shard_of(moving, 4)}) moves to pg2: {where}"
    for name in ("moving", "staying"):
        expect(http("POST", f"{s.url}/schedules/{name}/resume"), 200, f"resume {name}")
    cluster.start_worker("w2", s.url, ["--demo", "--concurrency", "4"])
    wait_until(lambda: len(ticks(lay.urls["pg2"], "moving")) >= 3, 15,
               what=lambda: f"three ticks of 'moving' in pg2 (home has "
               f"{ticks(cluster.db_url, 'moving', last)}, pg2 {ticks(lay.urls['pg2'], 'moving')})")
    for name in ("moving", "staying"):
        expect(http("POST", f"{s.url}/schedules/{name}/pause"), 200, f"pause {name} again")
    after = {db: ticks(url, "moving", last) for db, url in lay.urls.items()}
    assert after["home"] == [], f"'moving' fired in the home database after growth: {after}"
    doubles = [t for t, n in Counter(after["pg2"]).items() if n > 1]
    assert not doubles, f"ticks of 'moving' fired twice: {doubles}"
    staying_after = ticks(cluster.db_url, "staying", last)
    assert staying_after and len(set(staying_after)) == len(staying_after), \
        f"'staying' fires at home once a tick: {staying_after}"
    assert ticks(lay.urls["pg2"], "staying") == [], "'staying' fired in pg2"
    fired = lay.psql("pg2", "SELECT count(*), count(DISTINCT work_id) FROM workd_events WHERE"
                     " type = 'accepted' AND work_id LIKE 'moving~%'")
    n = fired.split("|")[0]
    assert int(n) >= 3 and fired == f"{n}|{n}", f"each tick's work accepted once in pg2: {fired}"


def test_webhooks_deliver_the_second_databases_results(cluster):
    cluster.add_database("pg2")
    lay = Layout(cluster, 4, {2: "pg2", 3: "pg2"})
    s = start(cluster, "s1", lay, extra=[
        "--heartbeat-interval", "500ms", "--webhook-backoff-base", "100ms",
        "--webhook-backoff-max", "1s", "--webhook-timeout", "3s",
        "--webhook-allow-networks", "127.0.0.0/8"])
    lay.wait_led()
    secret = new_secret()
    rcv = Receiver({"/all": secret})
    put_sub(s.url, "all", {"url": f"http://127.0.0.1:{rcv.port}/all", "secret": secret,
                           "kinds": ["completed"]})
    qs = queues_per_shard(4, per=2)
    queues = [q for v in qs.values() for q in v]
    ids = [f"h{i}" for i in range(24)]
    for i, work_id in enumerate(ids):
        submit(s.url, {"id": work_id, "queue": queues[i % len(queues)], "payload": i})
    cluster.start_worker("w1", s.url, ["--demo", "--concurrency", "4"])

    def want():
        out = {}
        for db in lay.urls:
            rows = json.loads(lay.psql(db, (
                "SELECT coalesce(json_agg(json_build_object('shard', shard, 'seq', seq,"
                " 'work', work_id)), '[]') FROM workd_events WHERE type = 'completed'")))
            for r in rows:
                key = f"msg_{r['seq']}" if r["shard"] == 0 else f"msg_{r['shard']}_{r['seq']}"
                out[key] = (r["shard"], r["work"])
        return out
    wait_until(lambda: len(want()) == len(ids), 30, what="every job to complete")
    wanted = want()
    assert {sh for sh, _ in wanted.values()} == {0, 1, 2, 3}, wanted
    in_pg2 = lay.psql("pg2", "SELECT string_agg(DISTINCT shard::text, ',') FROM workd_events"
                      " WHERE type = 'completed'")
    assert in_pg2 == "2,3", f"shards 2 and 3 finish their work in pg2: {in_pg2}"
    wait_until(lambda: rcv.ids("/all") == set(wanted), 30,
               what=lambda: f"every shard's results at the receiver (missing "
               f"{sorted((k, wanted[k]) for k in set(wanted) - rcv.ids('/all'))[:8]})")
    assert not rcv.bad_signatures, rcv.bad_signatures[:2]
    got = Counter(d["id"] for d in rcv.accepted["/all"])
    assert not [k for k, n in got.items() if n > 1], f"repeated deliveries: {got}"
    for d in rcv.accepted["/all"]:
        shard, work_id = wanted[d["id"]]
        assert d["msg"]["data"]["id"] == work_id, f"{d['id']} should be {work_id}'s: {d['msg']}"


if __name__ == "__main__":
    run_tests(globals())
