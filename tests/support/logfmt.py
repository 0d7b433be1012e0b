"""A strict logfmt parser for tests: what a log shipper (Loki's ``| logfmt``, Vector) makes of a line."""

from __future__ import annotations

import json
import re

#: The logfmt grammar, strictly (go-logfmt's, which Loki's and Grafana's parsers follow): pairs
#: separated by one space; a key has no space, "=", quote or control character; a value is bare (the
#: same characters) or double-quoted, with only \" \\ \n \r \t \uXXXX escapes and no raw control.
_KEY = r'[^\s="\\\x00-\x1f\x7f]+'
_QUOTED = r'"(?:[^"\\\x00-\x1f\x7f]|\\["\\nrt]|\\u[0-9a-fA-F]{4})*"'
_PAIR = re.compile(rf"({_KEY})=({_QUOTED}|{_KEY})(?: |$)")


def logfmt(line: str) -> dict[str, str]:
    """``line``'s fields, or an AssertionError saying where it breaks the grammar."""
    assert line and len(line.splitlines()) == 1, f"not one line: {line!r}"
    fields: dict[str, str] = {}
    pos = 0
    while pos < len(line):
        match = _PAIR.match(line, pos)
        assert match, f"not logfmt at {pos}: {line[pos : pos + 40]!r} in {line[:200]!r}"
        key, raw = match[1], match[2]
        assert key not in fields, f"{key} twice in {line!r}"
        assert all(c.isprintable() for c in raw), f"raw non-printable in {raw!r}"
        fields[key] = json.loads(raw) if raw.startswith('"') else raw
        pos = match.end()
    assert not line.endswith(" "), line
    return fields
