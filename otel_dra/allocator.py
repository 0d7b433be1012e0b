"""The C allocator of a long-running process that handles many devices: glibc's large-allocation threshold fixed.

glibc serves an allocation from its heaps below ``M_MMAP_THRESHOLD`` and from a mapping of its own above it.
The threshold starts at 128 kB and, left dynamic, rises to the size of every mapped chunk freed (up to 32 MB): after
the first large array is freed, a fleet's per-tick temporaries (arrays of every point ingested, every device judged)
come from the heaps, where freed ones leave holes between long-lived objects that stay resident. Measured on a
real fleet of 8,000 devices with full windows (bench/bench_fleet_scale.py, BENCHMARKS.md): RSS beyond the window
arrays 18 kB a device with the dynamic threshold, 11.5 kB fixed at 1 MB, for a few percent more CPU (a mapping is
faulted in on each use; 256 kB saved more and cost a fifth more CPU). A user's own setting (``GLIBC_TUNABLES``
``glibc.malloc.mmap_threshold``, or ``MALLOC_MMAP_THRESHOLD_``) is kept; another libc is left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
from typing import Final

log = logging.getLogger(__name__)

#: glibc's ``mallopt`` parameter number for the threshold (malloc.h).
M_MMAP_THRESHOLD: Final = -3
#: Allocations from this size up are mapped on their own and given back when freed.
FLEET_MMAP_THRESHOLD: Final = 1 << 20


def user_set() -> bool:
    """Whether the environment already sets glibc's threshold (then it is the user's to keep)."""
    return "MALLOC_MMAP_THRESHOLD_" in os.environ or "glibc.malloc.mmap_threshold" in os.environ.get(
        "GLIBC_TUNABLES", ""
    )


def fix_mmap_threshold(nbytes: int = FLEET_MMAP_THRESHOLD) -> bool:
    """Fix glibc's threshold at ``nbytes`` for this process; whether it was set (False: another libc, or the
    user's own setting)."""
    if user_set():
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): nothing to tune
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    done = bool(mallopt(M_MMAP_THRESHOLD, nbytes))
    log.debug("glibc malloc mmap threshold %s at %d bytes", "fixed" if done else "not fixed", nbytes)
    return done
