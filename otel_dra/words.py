"""Numbers in the words a person writes them, for every message the project prints or logs."""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun`` as a person writes them: ``1 tick``, ``2 ticks``, ``0 ticks`` (``nouns``: an
    irregular plural), so no message says "1 bad input problems"."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"


def human_duration(seconds: float) -> str:
    """300 → 5m, 3600 → 1h, 90 → 1m30s."""
    s = round(seconds)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            whole, rest = divmod(s, size)
            return f"{whole}{unit}" + (human_duration(rest) if rest else "")
    return f"{s}s"
