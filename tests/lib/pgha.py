"""A replicated PostgreSQL with automatic failover, run as processes on loopback.

One etcd member (the DCS) and N PostgreSQL nodes, each run by Patroni (the
Debian packages ``patroni``, ``etcd-server``; scripts/install-deps installs
them). Patroni keeps one primary and makes the others stream from it; with
``synchronous_mode`` it names one standby in ``synchronous_standby_names`` and
only ever promotes that one, so a failover loses no committed transaction.

    with HaCluster(tmp) as ha:
        ha.start(nodes=2)
        url = ha.url()                 # libpq multi-host URL, read-write target
        victim = ha.primary()
        victim.kill_postmaster()       # kill -9 of the postmaster only
        victim.kill_node()             # kill -9 of Patroni, the postmaster, every backend
        victim.start()                 # comes back; Patroni makes it a standby
        ha.switchover()                # the engine moves the primary on purpose

Everything lives under one directory, listens on 127.0.0.1 only and is killed
when the cluster is closed (also by a watchdog if the owner dies). PostgreSQL
refuses to run as root: as root, Patroni and etcd run as the ``postgres`` OS
user (setpriv), as scripts/pg-private does for initdb.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

from harness import Cluster, free_port, wait_until

SCOPE = "workd"
DB_NAME = "workd"

# Patroni's timing. With its defaults (ttl 30, loop_wait 10, retry_timeout 10)
# a lost primary's leader key lives up to 30 s; these keep Patroni's rule
# loop_wait + 2 * retry_timeout <= ttl and let the standby take over in ~8 s.
FAST_TIMING = {"ttl": 8, "loop_wait": 1, "retry_timeout": 3}
DEFAULT_TIMING = {"ttl": 30, "loop_wait": 10, "retry_timeout": 10}


def _pg_bindir():
    for v in sorted(os.listdir("/usr/lib/postgresql"), key=lambda s: -int(s.split(".")[0])):
        d = f"/usr/lib/postgresql/{v}/bin"
        if os.path.exists(f"{d}/initdb") and int(v.split(".")[0]) >= 15:
            return d
    raise RuntimeError("no PostgreSQL >= 15 server binaries (run scripts/install-deps)")


def missing_tools():
    """Names of the programs this harness needs that are not installed."""
    need = {"patroni": "patroni", "etcd": "etcd-server", "setpriv": "util-linux"}
    return [f"{prog} (package {pkg})" for prog, pkg in need.items() if not shutil.which(prog)]


def _as_postgres():
    """argv prefix that runs a program as the postgres OS user when we are root."""
    if os.getuid() != 0:
        return []
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--"]


def _chown_postgres(path):
    if os.getuid() == 0:
        shutil.chown(path, "postgres", "postgres")


def _get_json(url, timeout=2.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie counts as dead.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


class Node:
    """One PostgreSQL server and the Patroni that runs it."""

    def __init__(self, ha, name):
        self.ha, self.name = ha, name
        self.dir = ha.dir / name
        self.data = self.dir / "data"
        self.pg_port, self.api_port = free_port(), free_port()
        self.api = f"http://127.0.0.1:{self.api_port}"
        self.proc = None
        self.killed_at = None  # monotonic time of the last kill

    def write_config(self):
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o700)
        _chown_postgres(self.dir)
        hba = ["local all all trust", "host all all 127.0.0.1/32 trust",
               "host replication all 127.0.0.1/32 trust"]
        params = {
            "max_connections": 300, "wal_level": "replica", "hot_standby": "on",
            "max_wal_senders": 10, "max_replication_slots": 10, "wal_keep_size": "256MB",
            "logging_collector": "off", "log_line_prefix": "%m [%p] %q%a ",
            "log_min_messages": "warning",
        }
        cfg = {
            "scope": SCOPE, "name": self.name,
            "log": {"level": "INFO", "format": "%(asctime)s %(levelname)s: %(message)s"},
            "restapi": {"listen": f"127.0.0.1:{self.api_port}",
                        "connect_address": f"127.0.0.1:{self.api_port}"},
            "etcd3": {"hosts": [f"127.0.0.1:{self.ha.etcd_port}"]},
            "bootstrap": {
                "dcs": {**self.ha.timing, "maximum_lag_on_failover": 16 * 1024 * 1024,
                        "synchronous_mode": True,
                        "synchronous_mode_strict": self.ha.strict,
                        "postgresql": {"use_pg_rewind": True, "use_slots": True,
                                       "parameters": params}},
                "initdb": [{"encoding": "UTF8"}, "no-locale"],
                "pg_hba": hba,
            },
            "postgresql": {
                "listen": f"127.0.0.1:{self.pg_port}",
                "connect_address": f"127.0.0.1:{self.pg_port}",
                "data_dir": str(self.data), "bin_dir": self.ha.bindir,
                "pgpass": str(self.dir / "pgpass"),
                "authentication": {"superuser": {"username": "postgres"},
                                   "replication": {"username": "postgres"},
                                   "rewind": {"username": "postgres"}},
                "parameters": {"unix_socket_directories": str(self.dir)},
                "pg_hba": hba,
                # A spread checkpoint of a fresh cluster takes ~90 s before the clone.
                "basebackup": [{"checkpoint": "fast"}],
                "remove_data_directory_on_rewind_failure": True,
                "remove_data_directory_on_diverged_timelines": True,
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }
        path = self.dir / "patroni.yml"
        path.write_text(json.dumps(cfg, indent=1))  # YAML is a superset of JSON
        _chown_postgres(path)
        return path

    def start(self):
        """Start (or restart) Patroni for this node; it starts PostgreSQL."""
        if self.proc is not None and self.proc.alive():
            raise RuntimeError(f"{self.name}: Patroni is still running")
        cfg = self.write_config()
        env = {"HOME": str(self.dir), "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
               "LANG": "C.UTF-8", "PYTHONUNBUFFERED": "1"}
        if self.proc is None:
            self.proc = self.ha.cluster.start_process(
                f"patroni-{self.name}", [*_as_postgres(), "patroni", str(cfg)], env=env)
        else:
            self.proc.env = env
            self.proc.start()
        return self

    # ---- what the node is doing
    def status(self):
        """Patroni's view of this node (GET /patroni), or None if it does not answer."""
        try:
            return _get_json(self.api + "/patroni", timeout=1.0)
        except (OSError, ValueError, urllib.error.URLError):
            return None

    def role(self):
        st = self.status()
        return st.get("role") if st and st.get("state") == "running" else None

    def is_primary(self):
        """True if Patroni here says it runs the primary and holds the leader key."""
        try:
            with urllib.request.urlopen(self.api + "/primary", timeout=1.0) as r:
                return r.status == 200
        except (OSError, urllib.error.URLError):
            return False

    def postmaster_pid(self):
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def pids(self):
        """Every process of this node: Patroni, the postmaster and its children."""
        out = []
        if self.proc is not None and self.proc.alive():
            out.append(self.proc.pid)
        pm = self.postmaster_pid()
        if pm and _alive(pm):
            out.append(pm)
            r = subprocess.run(["pgrep", "-P", str(pm)], capture_output=True, text=True)
            out += [int(p) for p in r.stdout.split()]
        return out

    # ---- faults
    def kill_postmaster(self):
        """kill -9 of the postmaster alone (its backends notice and exit; Patroni lives)."""
        pm = self.postmaster_pid()
        if not pm or not _alive(pm):
            raise RuntimeError(f"{self.name}: no running postmaster")
        os.kill(pm, signal.SIGKILL)
        self.killed_at = time.monotonic()
        return pm

    def kill_node(self):
        """The node vanishes: every process stopped at once, then killed."""
        pids = self.pids()
        for p in pids:
            try:
                os.kill(p, signal.SIGSTOP)
            except ProcessLookupError:
                pass
        self.killed_at = time.monotonic()  # nothing of the node runs from here on
        for p in pids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.proc is not None and self.proc.alive():
            self.proc.popen.wait(10)
        wait_until(lambda: not any(_alive(p) for p in pids), 10,
                   what=f"{self.name}'s processes to die")
        return pids

    def stop(self, timeout=15.0):
        """Stop Patroni (which stops PostgreSQL), then kill whatever is left."""
        self.signal_stop()
        self.reap(timeout)

    def signal_stop(self):
        if self.proc is not None and self.proc.alive():
            self.proc.resume()
            self.proc.popen.send_signal(signal.SIGTERM)

    def reap(self, timeout):
        if self.proc is not None and self.proc.alive():
            try:
                self.proc.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        for p in self.pids():
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass


class ReplicatedCluster(Cluster):
    """A harness Cluster whose database is an HaCluster instead of pg-private:
    ``start_server`` points workd at the multi-host URL of every node.

    With ``private_home=True`` the cluster's own database (``db_url``, the
    servers' --database-url, ``psql`` without a URL) is a private PostgreSQL
    as in a plain Cluster, and the replicated one is only ``ha.url()``: a
    shard's own database (--shard-databases). Databases added with
    ``add_database`` are private PostgreSQL servers either way."""

    def __init__(self, bin_dir=None, keep=None, timing=None, strict=False, nodes=2,
                 private_home=False):
        super().__init__(bin_dir=bin_dir, keep=keep)
        self.ha_args = {"timing": timing, "strict": strict}
        self.n_nodes = nodes
        self.private_home = private_home
        self.ha = None

    def _pg(self, command, pg_dir=None):
        if self.private_home or pg_dir is not None:
            return super()._pg(command, pg_dir)
        # No private PostgreSQL: the replicated one is started below instead.
        return self.ha.url() if self.ha is not None and command != "destroy" else ""

    def __enter__(self):
        super().__enter__()
        try:
            self.ha = HaCluster(self, **self.ha_args)
            self.ha.start(self.n_nodes)
            if not self.private_home:
                self.db_url = self.ha.url()
        except BaseException:
            self.close()
            raise
        return self

    def psql(self, sql, url=None):
        if url is None and not self.private_home:
            return self.ha.psql(sql)
        return super().psql(sql, url)

    def close(self):
        if self.ha is not None:
            try:
                self.ha.close()
            except Exception as e:  # noqa: BLE001 - cleanup must go on
                print(f"pgha: {e}", file=sys.stderr)
        super().close()


class HaCluster:
    """etcd plus Patroni-run PostgreSQL nodes, inside a harness Cluster's directory."""

    def __init__(self, cluster, timing=None, strict=False):
        self.cluster = cluster
        self.dir = cluster.tmp / "ha"
        self.timing = dict(timing or FAST_TIMING)
        self.strict = strict
        self.bindir = _pg_bindir()
        self.nodes = []
        self.etcd = None
        self.etcd_port = self.etcd_peer_port = None
        self._watchdog = None

    def start(self, nodes=2, timeout=120.0):
        """Start etcd and the nodes; return once a primary and a synchronous standby
        stream and the database exists."""
        missing = missing_tools()
        if missing:
            raise RuntimeError("missing: " + ", ".join(missing) + " (run scripts/install-deps)")
        self.dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir, 0o755)
        self._start_watchdog()
        self._start_etcd()
        self.nodes = [Node(self, f"pg{i + 1}") for i in range(nodes)]
        # The first bootstraps (initdb); the others clone it once it leads.
        self.nodes[0].start()
        wait_until(lambda: self.nodes[0].role() in ("master", "primary"), timeout,
                   interval=0.2, what="pg1 to bootstrap and lead")
        self.psql(f"CREATE DATABASE {DB_NAME}", db="postgres")
        for n in self.nodes[1:]:
            n.start()
        self.wait_healthy(timeout)
        return self

    def _start_watchdog(self):
        # When the owner is SIGKILLed (a CTest timeout), kill every process of
        # the cluster: whatever still runs from a binary under our directory
        # tree's configuration (Patroni, PostgreSQL, etcd all name it).
        script = ('cat >/dev/null; for i in 1 2; do for p in $(pgrep -f -- "$1"); do '
                  '[ "$p" = $$ ] || kill -9 "$p"; done; sleep 0.5; done')
        self._watchdog = subprocess.Popen(
            ["sh", "-c", script, "pgha-watchdog", str(self.dir)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def _start_etcd(self):
        self.etcd_port, self.etcd_peer_port = free_port(), free_port()
        d = self.dir / "etcd"
        d.mkdir(exist_ok=True)
        os.chmod(d, 0o700)
        _chown_postgres(d)
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        self.etcd = self.cluster.start_process("etcd", [
            *_as_postgres(), "etcd", "--name", "etcd1", "--data-dir", str(d / "data"),
            "--listen-client-urls", client, "--advertise-client-urls", client,
            "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
            "--initial-cluster", f"etcd1={peer}", "--initial-cluster-state", "new",
            "--log-level", "warn"])
        wait_until(lambda: _get_json(client + "/health").get("health") == "true", 30,
                   interval=0.1, what="etcd to answer /health",
                   ignore=(OSError, ValueError, urllib.error.URLError))

    # ---- the cluster's state
    def members(self):
        """Patroni's member list (GET /cluster on any node that answers)."""
        for n in self.nodes:
            try:
                return _get_json(n.api + "/cluster", timeout=1.0)["members"]
            except (OSError, ValueError, KeyError, urllib.error.URLError):
                continue
        return []

    def primary(self, timeout=60.0):
        """The node that runs the primary and holds the leader key, waiting for one."""
        def find():
            return next((n for n in self.nodes if n.is_primary()), None)
        return wait_until(find, timeout, interval=0.1, what="a running Patroni primary")

    def sync_standby(self):
        for m in self.members():
            if m.get("role") == "sync_standby" and m.get("state") in ("running", "streaming"):
                return next(n for n in self.nodes if n.name == m["name"])
        return None

    def wait_healthy(self, timeout=120.0):
        """Wait until one leader runs and every other node is a streaming sync standby
        (and the leader reports it in pg_stat_replication)."""
        def healthy():
            ms = self.members()
            if len(ms) != len(self.nodes):
                return False
            leaders = [m for m in ms if m.get("role") == "leader" and m.get("state") == "running"]
            sync = [m for m in ms if m.get("role") == "sync_standby"
                    and m.get("state") in ("running", "streaming")]
            if len(leaders) != 1 or not sync:
                return False
            rep = self.psql("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync' "
                            "AND state = 'streaming'", db="postgres")
            return rep == "1" and self.primary(timeout=0.5)
        wait_until(healthy, timeout, interval=0.25, what="a leader and a streaming sync standby",
                   ignore=(RuntimeError, AssertionError))

    def url(self, extra="target_session_attrs=read-write"):
        """The libpq multi-host URL of the cluster: every node, the primary chosen by libpq."""
        hosts = ",".join(f"127.0.0.1:{n.pg_port}" for n in self.nodes)
        return f"postgresql://postgres@{hosts}/{DB_NAME}" + (f"?{extra}" if extra else "")

    def psql(self, sql, db=DB_NAME, node=None, timeout=30):
        """Run SQL on the primary (or on ``node``); unaligned, tuples only, stripped."""
        if node is None:
            dsn = self.url().replace(f"/{DB_NAME}?", f"/{db}?")
        else:
            dsn = f"postgresql://postgres@127.0.0.1:{node.pg_port}/{db}"
        r = subprocess.run(["psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "-d", dsn,
                            "-c", sql], capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, "PGCONNECT_TIMEOUT": "3"})
        if r.returncode != 0:
            raise RuntimeError(f"psql failed ({r.returncode}): {sql}\n{r.stderr.strip()}")
        return r.stdout.strip()

    def writable_postmaster(self):
        """(node, postmaster pid) of the server the read-write URL reaches now, or None."""
        try:
            out = self.psql("SELECT pg_is_in_recovery(), inet_server_port()", db="postgres",
                            timeout=5)
        except (RuntimeError, subprocess.TimeoutExpired):
            return None
        ro, port = out.split("|")
        node = next((n for n in self.nodes if str(n.pg_port) == port), None)
        return (node, node.postmaster_pid()) if ro == "f" and node else None

    # ---- actions by the engine
    def switchover(self, candidate=None, timeout=60.0):
        """Ask Patroni to move the primary to ``candidate`` (default: the sync standby)
        and wait until the new primary runs. Returns (old, new)."""
        old = self.primary()
        cand = candidate or self.sync_standby()
        if cand is None:
            raise RuntimeError("no synchronous standby to switch over to")
        body = json.dumps({"leader": old.name, "candidate": cand.name}).encode()
        req = urllib.request.Request(old.api + "/switchover", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as r:
            r.read()
        wait_until(lambda: self.primary(timeout=1) is cand, timeout, interval=0.1,
                   what=f"{cand.name} to lead after the switchover", ignore=(AssertionError,))
        return old, cand

    def patch_config(self, changes, timeout=10.0):
        """Change Patroni's dynamic configuration (PATCH /config on any node)."""
        body = json.dumps(changes).encode()
        for n in self.nodes:
            req = urllib.request.Request(n.api + "/config", data=body, method="PATCH",
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=timeout) as r:
                    return json.loads(r.read())
            except (OSError, urllib.error.URLError):
                continue
        raise RuntimeError(f"no Patroni node took the configuration change {changes}")

    def close(self):
        for n in self.nodes:
            n.signal_stop()
        deadline = time.monotonic() + 15
        for n in self.nodes:
            n.reap(max(0.1, deadline - time.monotonic()))
        if self.etcd is not None:
            self.etcd.stop()
        if self._watchdog is not None:
            self._watchdog.stdin.close()
            self._watchdog.wait(15)
            self._watchdog = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


if __name__ == "__main__":
    # Bring a cluster up by hand: python3 tests/lib/pgha.py (Ctrl-C stops it).
    with ReplicatedCluster() as c:
        print(c.ha.url(), flush=True)
        try:
            while True:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
