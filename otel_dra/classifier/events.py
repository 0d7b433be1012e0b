"""Recent events per device: the last K occurrences of a rare counter's increases.

Rules such as "two device resets within an hour" look further back than the gauge window
without keeping an hour of samples: each device keeps the times and sizes of its last K
events (K above any policy's threshold), so counting events since a cutoff is one
vectorised comparison.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from otel_dra.classifier.numeric import any_of, flatnonzero, shaped
from otel_dra.classifier.registry import grown, grown_rows, next_capacity
from otel_dra.policy import EVENT_LOG_DEPTH


class EventLog:
    """Times and amounts of the last ``depth`` events of one counter, per device row (the
    policy refuses thresholds above EVENT_LOG_DEPTH, the depth kept by default).

    Most devices never have such an event, so a row's times and amounts live in a pool that
    grows only as rows log their first event: until then a row costs two int32s (``next``,
    ``slot``), zeros never written, where every row's own ``depth`` times (written -inf, so
    resident) and amounts took 96 bytes in each of the five logs."""

    def __init__(self, capacity: int, depth: int = EVENT_LOG_DEPTH) -> None:
        self.depth = depth
        self.next = np.zeros(capacity, dtype=np.int32)  # events ever logged per row (the slot: next % depth)
        self.slot = np.zeros(capacity, dtype=np.int32)  # each row's place in the pool; 0: none yet
        # The pool. Place 0 is no row's: no event (-inf, 0), what a row without a place reads.
        self._times = np.full((1, depth), -np.inf)
        # Counts of rare events (resets, OOM kills, driver errors) a sample: exact in float32 up to 2**24 each.
        self._amounts = np.zeros((1, depth), dtype=np.float32)
        self._used = 1  # places given out, place 0 included

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.next = grown_rows(self.next, capacity, keep=keep)
        self.slot = grown_rows(self.slot, capacity, keep=keep)
        if keep is not None:  # rows renumbered, some dropped: the pool keeps only the places still held
            held = flatnonzero(self.slot)
            self._times = np.concatenate([self._times[:1], self._times[self.slot[held]]])
            self._amounts = np.concatenate([self._amounts[:1], self._amounts[self.slot[held]]])
            self.slot[held] = np.arange(1, held.size + 1, dtype=np.int32)
            self._used = held.size + 1

    def clear(self, rows: np.ndarray) -> None:
        places = self.slot[rows]
        places = places[places > 0]
        self._times[places] = -np.inf
        self._amounts[places] = 0.0
        self.next[rows] = 0

    def times(self, rows: np.ndarray) -> np.ndarray:
        """``(rows, depth)``: the times of each row's logged events (-inf: an empty slot)."""
        return self._times[self.slot[rows]]

    def amounts(self, rows: np.ndarray) -> np.ndarray:
        """``(rows, depth)``: the amounts of each row's logged events (0: an empty slot)."""
        return self._amounts[self.slot[rows]]

    def _places(self, rows: np.ndarray) -> np.ndarray:
        """The pool places of ``rows`` (unique), given out to those without one: the pool grows as the registry's
        rows do (:func:`~otel_dra.classifier.registry.next_capacity`)."""
        places = self.slot[rows]
        new = places == 0
        if new.any():
            n = int(new.sum())
            need = self._used + n
            if need > len(self._times):
                size = next_capacity(len(self._times), need)
                self._times = grown(self._times, size, -np.inf)
                self._amounts = grown(self._amounts, size, 0.0)
            places[new] = np.arange(self._used, need, dtype=np.int32)
            self.slot[rows[new]] = places[new]
            self._used = need
        return places

    def record(self, rows: np.ndarray, time_s: np.ndarray, amounts: np.ndarray) -> None:
        """Log the rows whose ``amounts`` (counter increases) are positive."""
        hit = amounts > 0  # (NaN: no increase read)
        if not any_of(hit):
            return
        r = rows[hit]
        p = self._places(r)
        slot = self.next[r] % self.depth
        self._times[p, slot] = shaped(np.asarray(time_s), rows.shape)[hit]
        self._amounts[p, slot] = amounts[hit]
        self.next[r] += 1

    def move(self, rows: np.ndarray, cutoff_s: np.ndarray, into: EventLog) -> None:
        """Move each of ``rows``' events at or after its ``cutoff_s`` to ``into`` (the same times and amounts):
        events found, after the fact, to belong to another log (a job's crash, see workload.py)."""
        if rows.size == 0:
            return
        hit = (self.times(rows) >= cutoff_s[:, None]) & (self.amounts(rows) > 0)
        if not hit.any():
            return
        some = np.flatnonzero(hit.any(axis=1))
        r, h = rows[some], hit[some]
        times, amounts = self.times(r), self.amounts(r)
        order = np.argsort(np.where(h, times, np.inf), axis=1, kind="stable")  # oldest first, as they came
        for k in range(self.depth):  # a slot a round: at most ``depth``, never a loop over devices
            j = order[:, k]
            take = h[np.arange(r.size), j]
            if not take.any():
                break
            into.record(r[take], times[take, j[take]], amounts[take, j[take]].astype(np.float64))
        self._amounts[self.slot[r]] = np.where(h, 0.0, amounts)  # (rows with events: each has a place)

    def since(self, cutoff_s: np.ndarray | float, rows: np.ndarray) -> np.ndarray:
        """Events of each of ``rows`` at or after ``cutoff_s`` (scalar, or one per row)."""
        rows = np.asarray(rows)
        out = np.zeros(rows.shape[0])
        if self._used == 1:  # no row was ever given a place: none has logged one (the usual log of a healthy fleet)
            return out
        some = flatnonzero(self.next[rows] > 0)  # most devices never had such an event
        if some.size:
            cutoff = np.asarray(cutoff_s, dtype=np.float64)
            cutoff = cutoff[some, None] if cutoff.ndim else cutoff
            p = self.slot[rows[some]]
            out[some] = np.add.reduce(self._amounts[p] * (self._times[p] >= cutoff), axis=1)
        return out

    def history(self, row: int) -> tuple[tuple[float, float], ...]:
        """One row's logged events, oldest first: (time, amount) each (what a restart keeps: recall.py)."""
        place = int(self.slot[row])
        times, amounts = self._times[place], self._amounts[place]
        order = np.argsort(times, kind="stable")
        return tuple((float(times[j]), float(amounts[j])) for j in order if math.isfinite(times[j]))

    def restore(self, row: int, events: Sequence[tuple[float, float]]) -> None:
        """Log one row's ``events`` (oldest first; the last ``depth`` kept) in place of what it had."""
        kept = events[-self.depth :]
        self.clear(np.asarray([row]))
        if kept:
            place = int(self._places(np.asarray([row]))[0])
            for j, (t, amount) in enumerate(kept):  # (at most ``depth``, one device recalled)
                self._times[place, j], self._amounts[place, j] = t, amount
        self.next[row] = len(kept)
