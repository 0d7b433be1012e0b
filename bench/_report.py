"""What every benchmark shares: its section of BENCHMARKS.md and the machine it ran on."""

from __future__ import annotations

import os
import platform
import re
from pathlib import Path

BENCHMARKS_MD = Path(__file__).resolve().parent.parent / "BENCHMARKS.md"


def write_section(start: str, end: str, section: str, path: Path = BENCHMARKS_MD) -> None:
    """Replace (or append) the section between the ``start`` and ``end`` markers, leaving the rest."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end) + r"\n?", re.DOTALL)
    if pattern.search(text):
        text = pattern.sub(lambda _: section, text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + section
    path.write_text(text)


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo), or what platform knows."""
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or f"unknown CPU ({os.cpu_count()} CPUs)"
