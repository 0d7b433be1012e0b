"""The store between sources and consumers: the latest frame per node and its freshness.

Issue #3 grows this into the windowed ring buffers the classifier reads; the
contract for consumers stays the same: ask for the newest frame and say how old
is too old, so a stopped source is never exported as if it were live.
"""

from __future__ import annotations

import threading

from otel_dra.frame import Frame


class FrameStore:
    """Holds the newest frame; readers on other threads (scrapes, exports) see a
    consistent frame because frames are immutable and swapped whole."""

    def __init__(self) -> None:
        self._latest: Frame | None = None
        self._received_ns: int = 0
        self._cond = threading.Condition()

    def put(self, frame: Frame, received_ns: int) -> None:
        """Make ``frame`` the newest one; ``received_ns`` is a monotonic clock reading."""
        with self._cond:
            self._latest = frame
            self._received_ns = received_ns
            self._cond.notify_all()

    def latest(self, now_ns: int, max_age_ns: int) -> Frame | None:
        """The newest frame if it was received within ``max_age_ns`` of ``now_ns`` (monotonic)."""
        frame = self._latest
        if frame is None or now_ns - self._received_ns > max_age_ns:
            return None
        return frame

    def wait_first(self, timeout_s: float) -> bool:
        """Block until a first frame arrives (start-up), or the timeout passes."""
        with self._cond:
            return self._cond.wait_for(lambda: self._latest is not None, timeout_s)
