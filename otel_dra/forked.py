"""A second core for pure work: how many CPUs this process may use, and a function run in a forked copy of it.

Replay's decode stage (``otel_dra.decode.stage``) and the fleet's rendering of its verdict series
(``otel_dra.sinks.verdict_text``) each hand half their work to a copy of the process where a second core is
there: a fork shares every object already made (~5 ms for a fleet of 1.4 GB, its pages copied only as written),
where a new interpreter would need the work's inputs sent to it.

A fork copies the calling thread alone. What the copy runs here is pure computation on objects the caller made
(strings formatted and compressed, bytes written to a pipe): no lock another thread may hold (no logging, no
printing, no import), and it leaves by ``os._exit``, running none of the caller's ``finally``, ``atexit`` or
buffered-output flushes. A copy that fails, dies or takes too long gives None, and the caller does the work
itself (:meth:`ForkedCall.result`).
"""

from __future__ import annotations

import contextlib
import gc
import os
import select
import signal
import struct
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

#: A result's parts, as the child writes them: their count, then each one's length, then the parts.
_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<Q")


def usable_cpus() -> int:
    """CPUs this process may use: its affinity (a cpuset), and a container's CPU quota (cgroup v2 ``cpu.max``,
    v1 ``cpu.cfs_quota_us``) where one is set: a pod limited to one CPU gains nothing from a second process."""
    affinity = getattr(os, "sched_getaffinity", None)
    cpus = len(affinity(0)) if affinity is not None else os.cpu_count() or 1
    quota = cgroup_quota()
    return min(cpus, max(1, int(quota))) if quota is not None else cpus


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPU quota of this process's cgroup in CPUs (quota / period), None where none is set or readable."""
    with contextlib.suppress(OSError, ValueError):
        quota, period = (root / "cpu.max").read_text().split()[:2]  # v2: "max 100000" or "150000 100000"
        return None if quota == "max" else int(quota) / int(period)
    with contextlib.suppress(OSError, ValueError):
        quota_us = int((root / "cpu" / "cpu.cfs_quota_us").read_text())  # v1: -1 for none
        period_us = int((root / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota_us <= 0 else quota_us / period_us
    return None


def _max_fd() -> int:
    """One past the highest descriptor this process may hold."""
    try:
        return os.sysconf("SC_OPEN_MAX")
    except (OSError, ValueError):
        return 1 << 16


def can_fork() -> bool:
    """Linux with ``os.fork`` (not macOS: its system libraries are not safe to use after a fork)."""
    return hasattr(os, "fork") and sys.platform.startswith("linux")


def in_child() -> None:
    """What a forked copy does first: the caller's signal handlers are not its own (Ctrl-C and SIGTERM stop it),
    and the objects it was born with are never collected in it (their pages stay shared, not copied)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    gc.freeze()


def fork() -> int:
    """``os.fork()``, without Python 3.12's warning that this process runs other threads (the copy runs only
    what this module's docstring allows)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return os.fork()


class ForkedCall:
    """``work()`` started in a forked copy of this process; its parts read back by :meth:`result`."""

    def __init__(self, work: Callable[[], Sequence[bytes]]) -> None:
        """Forks now; the caller goes on with its own share while the copy runs ``work``. Raises OSError when
        the fork fails (out of memory or processes)."""
        reader, writer = os.pipe()
        try:
            pid = fork()
        except OSError:
            os.close(reader)
            os.close(writer)
            raise
        if pid == 0:  # the copy
            code = 1
            try:
                # Every descriptor but its pipe let go: a connection the caller closes meanwhile is closed (its
                # FIN sent), not held open by the copy until it leaves.
                os.closerange(3, writer)
                os.closerange(writer + 1, _max_fd())
                in_child()
                parts = work()
                head = _COUNT.pack(len(parts)) + b"".join(_LENGTH.pack(len(p)) for p in parts)
                with open(writer, "wb") as out:
                    out.write(head)
                    for part in parts:
                        out.write(part)
                code = 0
            except BaseException:  # (nothing printed: another thread may have held stderr's lock at the fork)
                code = 1
            finally:
                os._exit(code)
        os.close(writer)
        self.pid = pid
        self._reader = reader

    def result(self, timeout_s: float) -> list[bytes] | None:
        """The copy's parts, or None when it failed, died or had not finished within ``timeout_s`` (then it is
        killed). The copy is reaped either way."""
        chunks: list[bytes] = []
        deadline = time.monotonic() + timeout_s
        ok = False
        ready = select.poll()  # (not select(): a server's descriptors run past its 1,024)
        ready.register(self._reader, select.POLLIN)
        try:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not ready.poll(max(1, round(left * 1000))):
                    break
                chunk = os.read(self._reader, 1 << 20)
                if not chunk:
                    ok = True
                    break
                chunks.append(chunk)
        finally:
            os.close(self._reader)
            if not ok:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
            _, status = os.waitpid(self.pid, 0)
        if not ok or os.waitstatus_to_exitcode(status) != 0:
            return None
        return _parts(b"".join(chunks))


def _parts(data: bytes) -> list[bytes] | None:
    """The parts :class:`ForkedCall`'s copy wrote, or None when ``data`` is not all of them."""
    if len(data) < _COUNT.size:
        return None
    (count,) = _COUNT.unpack_from(data)
    at = _COUNT.size + count * _LENGTH.size
    if len(data) < at:
        return None
    lengths = [_LENGTH.unpack_from(data, _COUNT.size + i * _LENGTH.size)[0] for i in range(count)]
    if at + sum(lengths) != len(data):
        return None
    parts = []
    for n in lengths:
        parts.append(data[at : at + n])
        at += n
    return parts
