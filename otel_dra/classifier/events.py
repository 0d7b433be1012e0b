"""Recent events per device: the last K occurrences of a rare counter's increases.

Rules such as "two device resets within an hour" look further back than the gauge window
without keeping an hour of samples: each device keeps the times and sizes of its last K
events (K above any policy's threshold), so counting events since a cutoff is one
vectorised comparison.
"""

from __future__ import annotations

import numpy as np

from otel_dra.classifier.registry import grown
from otel_dra.policy import EVENT_LOG_DEPTH


class EventLog:
    """Times and amounts of the last ``depth`` events of one counter, per device row (the
    policy refuses thresholds above EVENT_LOG_DEPTH, the depth kept by default)."""

    def __init__(self, capacity: int, depth: int = EVENT_LOG_DEPTH) -> None:
        self.depth = depth
        self.times = np.full((capacity, depth), -np.inf)
        # Counts of rare events (resets, OOM kills, driver errors) a sample: exact in float32 up to 2**24 each.
        self.amounts = np.zeros((capacity, depth), dtype=np.float32)
        self.next = np.zeros(capacity, dtype=np.int32)  # events ever logged per row (the slot: next % depth)

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.times = grown(self.times, capacity, -np.inf, keep=keep)
        self.amounts = grown(self.amounts, capacity, 0.0, keep=keep)
        self.next = grown(self.next, capacity, 0, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        self.times[rows] = -np.inf
        self.amounts[rows] = 0.0
        self.next[rows] = 0

    def record(self, rows: np.ndarray, time_s: np.ndarray, amounts: np.ndarray) -> None:
        """Log the rows whose ``amounts`` (counter increases) are positive."""
        hit = np.nan_to_num(amounts) > 0
        if not hit.any():
            return
        r = rows[hit]
        slot = self.next[r] % self.depth
        self.times[r, slot] = np.broadcast_to(time_s, rows.shape)[hit]
        self.amounts[r, slot] = amounts[hit]
        self.next[r] += 1

    def move(self, rows: np.ndarray, cutoff_s: np.ndarray, into: EventLog) -> None:
        """Move each of ``rows``' events at or after its ``cutoff_s`` to ``into`` (the same times and amounts):
        events found, after the fact, to belong to another log (a job's crash, see workload.py)."""
        if rows.size == 0:
            return
        hit = (self.times[rows] >= cutoff_s[:, None]) & (self.amounts[rows] > 0)
        if not hit.any():
            return
        some = np.flatnonzero(hit.any(axis=1))
        r, h = rows[some], hit[some]
        times, amounts = self.times[r], self.amounts[r]
        order = np.argsort(np.where(h, times, np.inf), axis=1, kind="stable")  # oldest first, as they came
        for k in range(self.depth):  # a slot a round: at most ``depth``, never a loop over devices
            j = order[:, k]
            take = h[np.arange(r.size), j]
            if not take.any():
                break
            into.record(r[take], times[take, j[take]], amounts[take, j[take]].astype(np.float64))
        self.amounts[r] = np.where(h, 0.0, amounts)

    def since(self, cutoff_s: np.ndarray | float, rows: np.ndarray) -> np.ndarray:
        """Events of each of ``rows`` at or after ``cutoff_s`` (scalar, or one per row)."""
        rows = np.asarray(rows)
        out = np.zeros(rows.shape[0])
        some = np.flatnonzero(self.next[rows] > 0)  # most devices never had such an event
        if some.size:
            cutoff = np.asarray(cutoff_s, dtype=np.float64)
            cutoff = cutoff[some, None] if cutoff.ndim else cutoff
            hit = rows[some]
            out[some] = (self.amounts[hit] * (self.times[hit] >= cutoff)).sum(axis=1)
        return out
