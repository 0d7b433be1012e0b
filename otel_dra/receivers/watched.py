"""Files read again when they change: the one reload loop the TLS files and the auth files share.

Rotated in place (cert-manager renews a certificate, a Kubernetes Secret volume swaps its files, an
operator rewrites the nodes file), they are looked at, at most every ``check_every_s``, when a
connection or request asks for them: a ``stat`` of each (inode, size, mtime, following symlinks, so a
Secret volume's swap shows). A changed set that can't be used (a key not yet written beside its new
certificate, a truncated file) is logged once and the previous contents kept; the next change is tried
again. Thread-safe: connections arrive on many threads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


def file_stamp(path: str) -> tuple[int, int, int] | None:
    """(inode, size, mtime) of a file, following symlinks; None when it can't be read."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


class WatchedFiles(Generic[T]):
    """What ``load`` makes of ``paths``, made again when one of them changes.

    ``load`` raises ``ValueError`` (the caller's config error) for contents that can't be used: at start
    that is fatal (raised from here), later it is ``unusable`` logged at WARNING with the error, and the
    previous value kept; a value made again is ``reloaded`` at INFO. ``log``: the owner's logger (its name is
    what users filter on); ``first``: the start-up value, when the caller has made it already. ``version``
    counts the loads since start (0: the start-up set)."""

    def __init__(
        self,
        paths: Sequence[str | None],
        load: Callable[[], T],
        unusable: str,
        reloaded: str,
        check_every_s: float,
        log: logging.Logger,
        first: T | None = None,
    ) -> None:
        self._paths = tuple(paths)
        self._load = load
        self._unusable, self._reloaded = unusable, reloaded
        self._check_every_s = check_every_s
        self._log = log
        self._lock = threading.Lock()
        self._stamp = self._stamp_now()
        self._value = load() if first is None else first
        self._checked = time.monotonic()
        self.version = 0

    def current(self) -> T:
        """The newest usable value, looking at the files first when ``check_every_s`` has passed."""
        with self._lock:
            now = time.monotonic()
            if now - self._checked >= self._check_every_s:
                self._checked = now
                stamp = self._stamp_now()
                if stamp != self._stamp:
                    self._stamp = stamp
                    try:
                        self._value = self._load()
                    except ValueError as exc:  # the config error, and anything a parser let through
                        self._log.warning(self._unusable, exc)
                    else:
                        self.version += 1
                        self._log.info(self._reloaded)
            return self._value

    def _stamp_now(self) -> tuple[tuple[int, int, int] | None, ...]:
        return tuple(file_stamp(path) if path else None for path in self._paths)
