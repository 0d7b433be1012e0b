"""The fleet process's memory: the heap's free memory given back after a tick, a tick's large arrays apart from the
heap, numpy's arrays on small pages.

A fleet's receivers and ticks allocate and free temporaries of every size on several threads (request bodies,
decoded frames, a tick's arrays). glibc keeps what is freed inside its heaps (the main one, and an arena for
each thread that allocates) for reuse, and those pages stay resident: at 8,000 devices that was about 10 kB a
device, more than the device's window arrays (BENCHMARKS.md, ``bench/bench_fleet_scale.py``). Only an explicit
``malloc_trim(0)`` hands free pages from the middle of the heaps back (``madvise``); glibc trims only the top of
the main heap by itself. Capping glibc's mmap threshold for good was tried and cost the collector shape a third
of its throughput (every large request buffer mapped and faulted in afresh: BENCHMARKS.md's notes on #32).

A tick's own arrays are another matter: at 100,000 devices one tick's temporaries come to some 110 MB (the
window's reads, each reason's evidence), and freed inside the main heap they stayed resident until the next trim,
which its share of the time did not allow after every tick (224 MiB of main heap at one reading, 2.2 kB a
device). :meth:`HeapTrimmer.tick` lowers glibc's mmap threshold for the tick alone (``tick_mmap_threshold``): its
large arrays fill the heap's free room first (glibc maps only what the heap has no room for), and where the heap
would grow for them they get pages of their own instead, handed back as each is freed, so the heap stops growing
with the fleet's ticks. Between ticks the threshold is glibc's largest (32 MiB, where its own rising threshold
ends up): the receivers' buffers reuse the heap as before. A user's own ``MALLOC_MMAP_THRESHOLD_``,
``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES`` thresholds are left as they are.

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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, NamedTuple

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
    #: During a tick, arrays of this many bytes or more that the heap has no room for get pages of their own
    #: (glibc's ``M_MMAP_THRESHOLD``), not more heap; 0: glibc's own threshold throughout.
    tick_mmap_threshold: int = 256 << 10

    def __post_init__(self) -> None:
        # (no flag sets these: the error names the config's own field)
        if self.min_free_bytes < 0:
            raise ConfigError(f"HeapTrimConfig.min_free_bytes must not be negative, got {self.min_free_bytes}")
        if not self.min_free_share >= 0:
            raise ConfigError(f"HeapTrimConfig.min_free_share must not be negative, got {self.min_free_share}")
        if not 0 < self.max_time_share <= 1:
            raise ConfigError(f"HeapTrimConfig.max_time_share must be in (0, 1], got {self.max_time_share}")
        if not 0 <= self.tick_mmap_threshold <= MMAP_THRESHOLD_MAX:
            raise ConfigError(
                f"HeapTrimConfig.tick_mmap_threshold must be in [0, {MMAP_THRESHOLD_MAX}] bytes (0: off), "
                f"got {self.tick_mmap_threshold}"
            )


#: glibc's ``mallopt`` parameters (``malloc.h``).
_M_TRIM_THRESHOLD: Final = -1
_M_MMAP_THRESHOLD: Final = -3
#: glibc's largest mmap threshold on a 64-bit system (``DEFAULT_MMAP_THRESHOLD_MAX``, 4 MiB a byte of ``long``):
#: where its rising threshold ends up, and the most ``mallopt`` takes. Its trim threshold rises with it, to twice.
MMAP_THRESHOLD_MAX: Final = 32 << 20
#: glibc's own variables that set the thresholds: where one is set, the user chose them.
_USER_THRESHOLDS: Final = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")
_USER_TUNABLES: Final = ("glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold")


def thresholds_chosen(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the user set glibc's mmap or trim threshold in the environment (then they are left alone)."""
    tunables = environ.get("GLIBC_TUNABLES", "")
    return any(name in environ for name in _USER_THRESHOLDS) or any(name in tunables for name in _USER_TUNABLES)


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
    mapped: int = 0  # in blocks of their own (over the mmap threshold), apart from the heaps


class _Glibc(NamedTuple):
    use: Callable[[], HeapUse]  # mallinfo2
    trim: Callable[[], object]  # malloc_trim(0)
    mallopt: Callable[[int, int], int]  # 1 when the setting was taken


def _glibc() -> _Glibc | None:
    """glibc's ``mallinfo2`` (as a :class:`HeapUse`), ``malloc_trim(0)`` and ``mallopt``; None where the C library
    lacks them. (ctypes releases the GIL for the call: the receivers go on while the heaps are walked.)"""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallinfo2, malloc_trim, mallopt = libc.mallinfo2, libc.malloc_trim, libc.mallopt
    except (OSError, AttributeError):
        return None
    mallinfo2.restype = _MallInfo2
    mallinfo2.argtypes = []
    malloc_trim.restype = ctypes.c_int
    malloc_trim.argtypes = [ctypes.c_size_t]
    mallopt.restype = ctypes.c_int
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]

    def use() -> HeapUse:
        info = mallinfo2()
        return HeapUse(int(info.uordblks), int(info.fordblks), int(info.hblkhd))

    return _Glibc(use, lambda: malloc_trim(0), mallopt)


class HeapTrimmer:
    """Gives a tick's large arrays pages of their own (:meth:`tick`) and trims glibc's heaps after a tick
    (:meth:`after_tick`) when they hold enough free memory."""

    def __init__(self, config: HeapTrimConfig) -> None:
        self.config = config
        self._calls = _glibc() if config.enabled else None
        self._not_before = 0.0  # (monotonic) no trim before: what the last one cost, spread at max_time_share
        self._tick_threshold = 0  # set at start: 0 while the mmap threshold is glibc's or the user's
        self.trims = 0
        self.seconds = 0.0  # spent looking and trimming

    def start(self) -> None:
        if self.config.enabled and self._calls is None:
            log.info("heap trimming off: the C library has no mallinfo2/malloc_trim (glibc 2.33 or later has)")
            return
        if self._calls is None or not self.config.tick_mmap_threshold:
            return
        if thresholds_chosen():
            log.info("glibc's mmap and trim thresholds left as the environment sets them")
            return
        # Fixed where glibc's own would rise to: between ticks, the heap as before (and glibc's trim of its top).
        between = MMAP_THRESHOLD_MAX
        if self._mallopt(_M_TRIM_THRESHOLD, 2 * between) and self._mallopt(_M_MMAP_THRESHOLD, between):
            self._tick_threshold = self.config.tick_mmap_threshold

    def shutdown(self, timeout_s: float) -> None:
        self._calls = None

    def _mallopt(self, param: int, value: int) -> bool:
        """glibc's ``mallopt``; True when it took the setting."""
        return self._calls is not None and self._calls.mallopt(param, value) == 1

    @contextmanager
    def tick(self) -> Iterator[None]:
        """A tick: its arrays of ``tick_mmap_threshold`` bytes or more that the heap has no free room for are mapped
        pages of their own, handed back as each is freed, not heap grown (what other threads allocate meanwhile
        too: a tick is a small share of the time)."""
        lowered = self._tick_threshold > 0 and self._mallopt(_M_MMAP_THRESHOLD, self._tick_threshold)
        try:
            yield
        finally:
            if lowered:
                self._mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX)

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
        t0 = time.perf_counter()
        held = self._calls.use()
        trimming = self.due(held)
        if trimming:
            self._calls.trim()
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
