"""What is written both in C and in SQL, checked to agree: every event type
the SQL names (the migrations' triggers, the store's statements) is one of
the types C knows (server/core/event.c's type_names), so a renamed or new
kind cannot leave a trigger or a query matching nothing. The published
events are one list for both (EVENTS_PUBLISHED; test_event checks it)."""

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lib"))
from harness import REPO_ROOT, run_tests  # noqa: E402


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


if __name__ == "__main__":
    run_tests(globals())
