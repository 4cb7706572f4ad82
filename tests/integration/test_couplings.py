"""What is written both in C and in SQL (or Python), checked to agree: every
event type the SQL names (the migrations' triggers, the store's statements)
is one of the types C knows (server/core/event.c's type_names), so a renamed
or new kind cannot leave a trigger or a query matching nothing; and the queue
hash that routes a queue to its shard gives the same shard in every copy. The
published events are one list for both (EVENTS_PUBLISHED; test_event checks
it)."""

import ctypes
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, run_tests  # noqa: E402
from workd import shard_of  # noqa: E402


def c_event_types():
    text = (REPO_ROOT / "server/core/event.c").read_text()
    table = re.search(r"static const char \*type_names\[\] = \{(.*?)\};", text, re.S)
    assert table, "server/core/event.c: the type_names table was not found"
    names = set(re.findall(r'\[EV_[A-Z_]+\] = "([a-z_]+)"', table.group(1)))
    assert len(names) >= 19, names
    return names


# Where SQL names event types: `type = 'x'`, `type IN ('x', ...)`, and the
# branches of a CASE over NEW.type (`WHEN 'x'[, 'y'] THEN`).
PATTERNS = [re.compile(r"\btype\s*(?:=|<>)\s*'([a-z_]+)'"),
            re.compile(r"\btype\s+(?:NOT\s+)?IN\s*\(([^)]*)\)", re.I),
            re.compile(r"\bWHEN\s+('[a-z_]+'(?:\s*,\s*'[a-z_]+')*)\s+THEN")]


def sql_event_types(text):
    found = set()
    for p in PATTERNS:
        for m in p.finditer(text):
            # Quoted names only: an IN list made by C (SQL_PUBLISHED_TYPES) is
            # EVENTS_PUBLISHED's, checked by test_event.
            found.update(re.findall(r"'([a-z_]+)'", m.group(0)))
    return found


def test_every_event_type_in_sql_is_one_c_knows():
    known = c_event_types()
    sources = sorted((REPO_ROOT / "migrations").glob("*.sql"))
    sources += sorted((REPO_ROOT / "server/store").glob("*.c"))
    bad, seen = [], set()
    for src in sources:
        names = sql_event_types(src.read_text())
        seen |= names
        bad += [f"{src.relative_to(REPO_ROOT)}: '{n}'" for n in sorted(names - known)]
    assert not bad, "event types in SQL that C does not know:\n  " + "\n  ".join(bad)
    # The check reads what it should: the triggers' kinds are all found.
    assert {"accepted", "term", "queue_set", "tick", "batch", "subscription_cursor"} <= seen, seen



def queue_names(count=1000):
    """count queue names, the same on every run: ASCII ones of every length
    up to 40, and names with accented Latin, Greek, CJK and emoji (2, 3 and
    4 UTF-8 bytes a character), so the copies must hash UTF-8 bytes alike."""
    rng = random.Random(31)
    ascii_chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.:/ "
    other = "éüñøßÅçΩλπжы中文队列東京🚀🙂€"
    names = ["", "a", "foobar", "emails", "queue-0"]
    while len(names) < count:
        chars = ascii_chars if len(names) % 2 else ascii_chars + other
        names.append("".join(rng.choice(chars) for _ in range(rng.randint(1, 40))))
    return names


# Shard counts to compare at: the real ones (1 to 64), and one so large that
# the modulo keeps nearly all of the 32-bit hash.
SHARD_COUNTS = [1, 2, 3, 4, 5, 7, 8, 16, 31, 64, 2147483647]


def c_shards(names):
    """common/shard.c's shard_of_queue() for every name and shard count,
    compiled into a shared object for the test."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    assert cc, "no C compiler (cc, gcc or clang) to build common/shard.c with"
    with tempfile.TemporaryDirectory() as tmp:
        lib = Path(tmp) / "libshard.so"
        subprocess.run([cc, "-shared", "-fPIC", "-O2", "-I", str(REPO_ROOT / "common"),
                        str(REPO_ROOT / "common/shard.c"), "-o", str(lib)], check=True)
        shard = ctypes.CDLL(str(lib))
        shard.shard_of_queue.argtypes = [ctypes.c_char_p, ctypes.c_int]
        shard.shard_of_queue.restype = ctypes.c_int
        return [[shard.shard_of_queue(q.encode("utf-8"), n) for n in SHARD_COUNTS] for q in names]


def python_shards(names):
    return [[shard_of(q, n) for n in SHARD_COUNTS] for q in names]


def hash_copies(names):
    """Every copy of the queue hash: its name, and its shards for every name
    and shard count. (The SQL copy, workd_shard_of(), joins here.)"""
    return {"C (common/shard.c)": c_shards(names),
            "Python (tests/lib/workd.py)": python_shards(names)}


def test_the_queue_hash_is_the_same_in_every_copy():
    names = queue_names()
    assert any(ord(ch) > 0xffff for q in names for ch in q), "no 4-byte UTF-8 names"
    copies = hash_copies(names)
    (first, want), *others = copies.items()
    assert len(set(s[-1] for s in want)) > 900, f"{first}: the hash hardly varies"
    for name, got in others:
        bad = [f"{names[i]!r} in {n} shards: {first} says {want[i][j]}, {name} {got[i][j]}"
               for i in range(len(names)) for j, n in enumerate(SHARD_COUNTS)
               if got[i][j] != want[i][j]]
        assert not bad, f"{len(bad)} disagreements, the first:\n  " + "\n  ".join(bad[:10])


if __name__ == "__main__":
    run_tests(globals())
