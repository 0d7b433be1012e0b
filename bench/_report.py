"""What every benchmark shares: its section of BENCHMARKS.md and the machine it ran on."""

from __future__ import annotations

import contextlib
import gc
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


def kb(nbytes: float, places: int = 1) -> str:
    """Bytes as kB; ``places=2`` for a figure judged against its target (5.02 is over 5.0, 5.0 would not say so)."""
    return f"{nbytes / 1000:,.{places}f} kB"


def cpu_model() -> str:
    """The CPU's model name (from /proc/cpuinfo), or what platform knows."""
    try:
        for row in Path("/proc/cpuinfo").read_text().splitlines():
            if row.startswith("model name"):
                return row.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or f"unknown CPU ({os.cpu_count()} CPUs)"


def proc_status_mb(field: str) -> float:
    """A ``/proc/self/status`` figure (``VmRSS``, ``VmHWM``) in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


def trim() -> None:
    """Collect garbage and hand free heap back to the OS, so VmRSS is what is alive."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
