"""The recording's own clock: what a replay (and its decode stage, which reads it) judges time by."""

from __future__ import annotations

import math

import numpy as np

from otel_dra.frame import Frame

#: Nodes not heard for this long no longer move the replay's clock.
CLOCK_QUORUM_S = 600.0
#: A node whose clock, once its offset is taken out, is this far from the newest any node has
#: said has had its clock stepped: its offset is learned again.
CLOCK_JUMP_S = 600.0
#: The replay's clock follows this quantile of the nodes' offset-corrected clocks: near the
#: front (it moves with every few lines, not in lumps), yet a node or two whose clock jumps
#: ahead move it by nothing.
CLOCK_QUANTILE = 0.75
#: Up to this many nodes the quantile is read off a sorted list; past it, off numpy's partition (the same
#: order statistic either way).
SMALL_FLEET = 64


def recent_quantile(latest: list[float], floor: float) -> float:
    """:data:`CLOCK_QUANTILE` of the stamps in ``latest`` from ``floor`` on (at least one is): the one at index
    ``int(q * (n - 1))`` in their order."""
    if len(latest) <= SMALL_FLEET:  # (a few dozen floats: a sorted list is 5x quicker than numpy's calls)
        recent = sorted(s for s in latest if s >= floor)
        return recent[int(CLOCK_QUANTILE * (len(recent) - 1))]
    stamps = np.asarray(latest)
    picked = stamps[stamps >= floor]
    k = int(CLOCK_QUANTILE * (picked.size - 1))  # one partition, not a sort
    return float(np.partition(picked, k)[k])


class TraceClock:
    """The replay's reference clock, read off the recording itself.

    Lines come in arrival order (a Collector writes what it receives), each node's points
    stamped by that node's clock, and clocks differ (±90 s is common). Each node's offset
    from the replay's clock is learned when it is first heard (and again if its clock jumps),
    and the clock is a high quantile of the nodes' newest stamps with their offsets taken out
    (nodes heard within ``CLOCK_QUORUM_S``), never going back. A node is then judged by how much
    of this clock has passed since it was last heard, not by how its stamps compare with
    another node's; the clock's own time base is the first node's, which nothing depends on."""

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        # Per node, as Python floats (a line's few frames are noted one by one: numpy's scalars would cost more).
        self._offset: list[float] = []  # seconds each node's clock is ahead of this one
        self._latest: list[float] = []  # each node's newest stamp, offset taken out (never goes down)
        self._front = -math.inf  # the newest any node has said: _latest's max, kept as it moves
        self.now_ns = 0

    def heard(self, frames: list[Frame]) -> int:
        """Note the frames of one line (none: the clock as it was); returns the clock (unix ns) after them."""
        offset, latest = self._offset, self._latest
        for frame in frames:
            stamp = frame.time_unix_nano / 1e9
            i = self._index.get(frame.devices.node)
            if i is None:
                i = self._index[frame.devices.node] = len(self._index)
                offset.append(stamp - self.now_ns / 1e9 if self.now_ns else 0.0)
                latest.append(-math.inf)
            corrected = stamp - offset[i]
            front = self._front  # the newest any node has said (the clock may lag it)
            if math.isfinite(front) and abs(corrected - front) > CLOCK_JUMP_S:  # this node's clock was stepped
                offset[i] = stamp - front
                latest[i] = corrected = front
            newest = latest[i] = max(latest[i], corrected)
            self._front = max(front, newest)
        if frames:
            self.now_ns = max(self.now_ns, round(recent_quantile(latest, self._front - CLOCK_QUORUM_S) * 1e9))
        return self.now_ns
