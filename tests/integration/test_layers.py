"""The layers of the C tree, as docs/architecture.md draws them, checked on
every #include: common -> core -> store -> manager -> frontend -> main. A file
includes headers of its own layer or below, never above and never across; the
front-end reads the store through its read face (view.h, and db.h for its
connections) and the managers through their interface (manager.h, and
shards.h for a node's set of them, one per shard) only. The
exceptions that are still in the tree are listed here, so that a new one
fails and a removed one must be taken off the list."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, run_tests  # noqa: E402

LAYERS = {"common": 0, "server/core": 1, "server/store": 2, "server/manager": 3,
          "server/frontend": 4, "server": 5}
# What the front-end may use of the layers below it that are not common/core.
FRONTEND_MAY = {"view.h", "db.h", "manager.h", "shards.h"}
# Known exceptions, each with what would remove it: none left.
EXCEPTIONS = set()


def layer_of(path):
    rel = path.relative_to(REPO_ROOT).parent.as_posix()
    return rel if rel in LAYERS else None


def headers():
    """{header name: its folder} for every header of the layered tree."""
    out = {}
    for folder in LAYERS:
        for h in (REPO_ROOT / folder).glob("*.h"):
            assert h.name not in out, f"two headers named {h.name}: {out[h.name]}, {folder}"
            out[h.name] = folder
    return out


def test_includes_follow_the_layers():
    where = headers()
    found, bad = set(), []
    for folder in LAYERS:
        for src in sorted((REPO_ROOT / folder).glob("*.[ch]")):
            me = src.relative_to(REPO_ROOT).as_posix()
            for name in re.findall(r'^#include "([^"]+)"', src.read_text(), re.M):
                if name not in where:
                    continue  # generated or system
                theirs = where[name]
                if theirs == folder or LAYERS[theirs] < LAYERS[folder] and (
                        folder != "server/frontend" or LAYERS[theirs] <= 1
                        or name in FRONTEND_MAY):
                    continue
                if (me, name) in EXCEPTIONS:
                    found.add((me, name))
                    continue
                bad.append(f"{me} includes {name} ({theirs})")
    assert not bad, "includes against the layers:\n  " + "\n  ".join(bad)
    gone = EXCEPTIONS - found
    assert not gone, f"exceptions no longer in the tree, take them off the list: {gone}"


def test_worker_and_cli_use_common_only():
    where = headers()
    for folder in ("worker", "cli"):
        for src in sorted((REPO_ROOT / folder).glob("*.[ch]")):
            for name in re.findall(r'^#include "([^"]+)"', src.read_text(), re.M):
                assert where.get(name, "common") == "common", \
                    f"{src.relative_to(REPO_ROOT)} includes the server's {name}"


if __name__ == "__main__":
    run_tests(globals())
