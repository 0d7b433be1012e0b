"""The fleet process's memory: the heap's free memory given back after a tick, numpy's arrays on small pages.

A fleet's receivers and ticks allocate and free temporaries of every size on several threads (request bodies,
decoded frames, a tick's arrays). glibc keeps what is freed inside its heaps (the main one, and an arena for
each thread that allocates) for reuse, and those pages stay resident: at 8,000 devices that was about 10 kB a
device, more than the device's window arrays (BENCHMARKS.md, ``bench/bench_fleet_scale.py``). Only an explicit
``malloc_trim(0)`` hands free pages from the middle of the heaps back (``madvise``); glibc trims only the top of
the main heap by itself. Capping glibc's mmap threshold instead was tried and cost the collector shape a third
of its throughput (every large request buffer mapped and faulted in afresh: BENCHMARKS.md's notes on #32).

:class:`HeapTrimmer` asks glibc how much it holds free (``mallinfo2``, a walk of its free lists) after each
tick and trims when that is worth it, and never spends more than a small share of the time on it. Only
glibc has these calls: elsewhere (musl, macOS) it does nothing, and says so once.

numpy asks the kernel for transparent huge pages (``madvise(MADV_HUGEPAGE)``) on every array of 4 MB or more;
where the kernel grants them on request (THP ``madvise``, a common default) one byte written makes 2 MB
resident. A classifier's arrays hold devices as their last axis, so the rows grown ahead of the devices are a
tail in every slab of the ring: on huge pages they were resident from the first write of any row
(``tests/unit/classifier/test_window_store.py``). :func:`numpy_small_pages` turns numpy's request off; the 100,000
device evaluation ran as fast either way (BENCHMARKS.md's notes on #32).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from otel_dra.component import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeapTrimConfig:
    """When free heap is handed back: only once glibc holds at least ``min_free_bytes`` free and at least
    ``min_free_share`` of what it has handed out (below that the pages are reused soon and a trim only
    faults them in again), and with trims taking at most ``max_time_share`` of the time between them."""

    enabled: bool = True
    min_free_bytes: int = 16 << 20
    min_free_share: float = 0.05
    max_time_share: float = 0.01

    def __post_init__(self) -> None:
        # (no flag sets these: the error names the config's own field)
        if self.min_free_bytes < 0:
            raise ConfigError(f"HeapTrimConfig.min_free_bytes must not be negative, got {self.min_free_bytes}")
        if not self.min_free_share >= 0:
            raise ConfigError(f"HeapTrimConfig.min_free_share must not be negative, got {self.min_free_share}")
        if not 0 < self.max_time_share <= 1:
            raise ConfigError(f"HeapTrimConfig.max_time_share must be in (0, 1], got {self.max_time_share}")


class _MallInfo2(ctypes.Structure):
    """glibc's ``struct mallinfo2`` (2.33 and later): every field a ``size_t``."""

    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


@dataclass(frozen=True)
class HeapUse:
    """What glibc's heaps hold, in bytes: handed out (in use) and free (kept for reuse)."""

    in_use: int
    free: int


def _glibc() -> tuple[Callable[[], HeapUse], Callable[[], object]] | None:
    """glibc's ``mallinfo2`` (as a :class:`HeapUse`) and ``malloc_trim(0)``; None where the C library lacks
    them. (ctypes releases the GIL for the call: the receivers go on while the heaps are walked.)"""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallinfo2, malloc_trim = libc.mallinfo2, libc.malloc_trim
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    mallinfo2.argtypes = []
    malloc_trim.restype = ctypes.c_int
    malloc_trim.argtypes = [ctypes.c_size_t]

    def use() -> HeapUse:
        info = mallinfo2()
        return HeapUse(int(info.uordblks), int(info.fordblks))

    return use, lambda: malloc_trim(0)


class HeapTrimmer:
    """Trims glibc's heaps after a tick (:meth:`after_tick`) when they hold enough free memory."""

    def __init__(self, config: HeapTrimConfig) -> None:
        self.config = config
        self._calls = _glibc() if config.enabled else None
        self._not_before = 0.0  # (monotonic) no trim before: what the last one cost, spread at max_time_share
        self.trims = 0
        self.seconds = 0.0  # spent looking and trimming

    def start(self) -> None:
        if self.config.enabled and self._calls is None:
            log.info("heap trimming off: the C library has no mallinfo2/malloc_trim (glibc 2.33 or later has)")

    def shutdown(self, timeout_s: float) -> None:
        self._calls = None

    def due(self, use: HeapUse) -> bool:
        """Whether free memory is worth a trim. glibc counts the pages a trim handed back as free still (they
        are, in its lists) and cannot tell which of them a tick faulted in again since: a heap that keeps as
        much free is trimmed after every tick, which :attr:`HeapTrimConfig.max_time_share` bounds."""
        cfg = self.config
        return use.free >= max(cfg.min_free_bytes, cfg.min_free_share * use.in_use)

    def after_tick(self, monotonic: float | None = None) -> bool:
        """Trim if it is due and the time share allows (the look counts too: a walk of glibc's free lists);
        True when it trimmed."""
        if self._calls is None:
            return False
        now = time.monotonic() if monotonic is None else monotonic
        if now < self._not_before:
            return False
        use, trim = self._calls
        t0 = time.perf_counter()
        held = use()
        trimming = self.due(held)
        if trimming:
            trim()
        spent = time.perf_counter() - t0
        self._not_before = now + spent / self.config.max_time_share
        self.seconds += spent
        if trimming:
            self.trims += 1
            log.debug("heap trimmed in %.3fs (%d MiB free in glibc's heaps)", spent, held.free >> 20)
        return trimming


def numpy_small_pages(environ: Mapping[str, str] = os.environ) -> bool:
    """Stop numpy asking for huge pages for the arrays it allocates from now on, unless the user chose with
    numpy's own ``NUMPY_MADVISE_HUGEPAGE``; True when it was turned off here."""
    if "NUMPY_MADVISE_HUGEPAGE" in environ:
        return False
    from numpy._core import multiarray  # (numpy 2: the setter numpy's own environment variable drives)

    setter = getattr(multiarray, "_set_madvise_hugepage", None)
    if setter is None:
        return False
    setter(False)
    return True
