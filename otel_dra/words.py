"""Numbers in the words a person writes them, for every message the project prints or logs."""

from __future__ import annotations


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``n`` and ``noun`` as a person writes them: ``1 tick``, ``2 ticks``, ``0 ticks`` (``nouns``: an
    irregular plural), so no message says "1 bad input problems"."""
    return f"{n:,} {noun if n == 1 else nouns or noun + 's'}"
