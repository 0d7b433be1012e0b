"""The store between sources and consumers: the latest frame per node and its freshness.

Issue #3 grows this into the windowed ring buffers the classifier reads; the
contract for consumers stays the same: ask for the newest frame and say how old
is too old, so a stopped source is never exported as if it were live.
"""

from __future__ import annotations

from otel_dra.frame import Frame


class FrameStore:
    """Holds the newest frame; readers on other threads (scrapes, exports) see a consistent
    frame and receive time because both are swapped whole, as one tuple (frames are immutable)."""

    def __init__(self) -> None:
        self._newest: tuple[Frame, int] | None = None

    def put(self, frame: Frame, received_ns: int) -> None:
        """Make ``frame`` the newest one; ``received_ns`` is a monotonic clock reading."""
        self._newest = (frame, received_ns)

    def latest(self, now_ns: int, max_age_ns: int) -> Frame | None:
        """The newest frame if it was received within ``max_age_ns`` of ``now_ns`` (monotonic)."""
        newest = self._newest
        if newest is None or now_ns - newest[1] > max_age_ns:
            return None
        return newest[0]
