"""Abuse limits: the server stays up and keeps answering others while clients
trickle bytes, open more connections than allowed, or follow results by the
thousand; each is refused or cut off, and memory stays bounded."""

import resource
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import http, run_tests, wait_leader, wait_until  # noqa: E402
from workd import expect, submit  # noqa: E402


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def raise_fd_limit():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def test_a_byte_a_second_is_cut_off(cluster):
    s = cluster.start_server("s1", extra_args=["--request-timeout", "2s"])
    wait_leader(s.url)
    slow = socket.create_connection(("127.0.0.1", s.port))
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 100
    t0 = time.monotonic()
    cut = None
    for b in request:
        try:
            slow.sendall(bytes([b]))
        except OSError:
            cut = time.monotonic() - t0
            break
        slow.settimeout(0.5)
        try:
            if slow.recv(1) == b"":
                cut = time.monotonic() - t0
                break
        except socket.timeout:
            pass
        # Meanwhile the server answers everyone else.
        assert http("GET", s.url + "/healthz", timeout=5).status == 200
        if time.monotonic() - t0 > 15:
            break
    slow.close()
    assert cut is not None, "a client sending a byte at a time was never cut off"
    assert 1.5 < cut < 8, f"cut off after {cut:.1f}s, expected about the 2s request timeout"

    # A body trickling in past the timeout is cut off too.
    slow = socket.create_connection(("127.0.0.1", s.port))
    slow.sendall(b"POST /work HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 50\r\n\r\n{")
    got = b""
    slow.settimeout(1)
    t0 = time.monotonic()
    while time.monotonic() - t0 < 10 and b"HTTP/1.1" not in got:
        try:
            slow.sendall(b" ")
            got += slow.recv(4096)
        except socket.timeout:
            continue
        except OSError:
            break
    slow.close()
    assert got == b"", f"a trickling body should be cut off, got {got[:200]!r}"
    assert time.monotonic() - t0 < 8, "a trickling body was cut off too late"


def test_connection_limit(cluster):
    """Past --max-connections the server stops accepting: new connections wait
    in the kernel's backlog (they are not served, and cost the server nothing)
    until others close; idle ones are cut off by --connection-timeout."""
    raise_fd_limit()
    s = cluster.start_server("s1", extra_args=["--max-connections", "32", "--http-threads", "1",
                                               "--connection-timeout", "3s"])
    wait_leader(s.url)
    idle = [socket.create_connection(("127.0.0.1", s.port)) for _ in range(40)]
    late = socket.create_connection(("127.0.0.1", s.port))
    late.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    late.settimeout(1.0)
    try:
        early = late.recv(100)
    except socket.timeout:
        early = b""
    assert not early.startswith(b"HTTP/1.1 200"), "a connection past the limit was served at once"
    # The idle connections are cut off after the connection timeout, and the
    # waiting request is then served.
    late.settimeout(15)
    t0 = time.monotonic()
    answer = late.recv(100)
    assert answer.startswith(b"HTTP/1.1 200"), f"the waiting request: {answer!r}"
    assert time.monotonic() - t0 < 12, "the waiting request was served too late"
    cut = 0
    for c in idle:
        c.settimeout(0.1)
        try:
            cut += c.recv(1) == b""
        except (socket.timeout, OSError):
            pass
        c.close()
    late.close()
    assert cut >= 30, f"only {cut} of 40 idle connections were cut off by the timeout"
    expect(http("GET", s.url + "/healthz"), 200, "healthy after the flood")


def test_thousands_of_subscribers(cluster):
    raise_fd_limit()
    s = cluster.start_server("s1", extra_args=["--sse-max-subscribers", "1500"])
    wait_leader(s.url)
    base = rss_mb(s.pid)
    socks, refused = [], 0
    for i in range(1600):
        c = socket.create_connection(("127.0.0.1", s.port))
        c.sendall(b"GET /results HTTP/1.1\r\nHost: x\r\n\r\n")
        socks.append(c)
    opened = 0
    for c in socks:
        c.settimeout(5)
        head = c.recv(200)
        if head.startswith(b"HTTP/1.1 200"):
            opened += 1
        elif head.startswith(b"HTTP/1.1 503"):
            refused += 1
    assert opened == 1500 and refused == 100, f"{opened} streams opened, {refused} refused"
    grown = rss_mb(s.pid) - base
    assert grown < 100, f"1,500 idle streams took {grown:.0f} MB"
    # Everyone still gets served, and a result reaches the streams.
    work = submit(s.url, {"payload": 1})
    assert work["created"]
    expect(http("GET", s.url + "/healthz"), 200, "health with 1,500 streams open")
    for c in socks:
        c.close()


if __name__ == "__main__":
    run_tests(globals())
