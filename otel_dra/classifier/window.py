"""The window store: per device, a ring of its samples' features over the last window.

Devices are rows, features are columns, kept feature-major: the ring is ``(W, features,
devices)`` float32 and the running sums ``(features, devices)``, so a rule reading one feature
of every device reads contiguous memory, and a sample arrives as a ``(features, devices)``
batch, as the feature extractor writes it. Appending a sample for a device writes its next
slot; running sums and counts of valid (non-NaN) values are kept in step (add the new sample,
subtract each one that leaves the window, by age or because the ring is full), so the sum over
a device's window is read in O(1), and a rule tick over a whole fleet is O(devices x
features), not O(devices x window x features).
"""

from __future__ import annotations

import math

import numpy as np

from otel_dra.classifier.numeric import all_of, any_of, shaped
from otel_dra.classifier.registry import grown_rows
from otel_dra.classifier.rows import RowIndex


def window_samples(window_s: float, interval_s: float) -> int:
    """Ring length for a window of ``window_s`` at one sample every ``interval_s``."""
    return max(2, math.ceil(window_s / max(interval_s, 1e-3) - 1e-9))


class WindowStore:
    """The samples of the last ``window_s`` seconds (at most ``window`` of them) of ``features``
    features per device row.

    The window is time-based: a sample leaves it once it is ``window_s`` older than the row's
    newest, so a node sampled every 60 s and one sampled every 5 s are judged over the same
    5 minutes (5 samples and 60). ``window`` bounds the ring: size it for the shortest
    sampling interval expected (a faster device's window holds its last ``window`` samples)."""

    def __init__(self, features: int, window: int, capacity: int, window_s: float = float("inf")) -> None:
        if window < 1:
            raise ValueError("window must hold at least one sample")
        self.features = features
        self.window = window
        self.window_s = window_s
        # The ring's and times' slots a row has not written are never read (the sums leave only written
        # slots, :meth:`samples` masks the rest): they start as zeros, so rows past the devices' (capacity
        # grown ahead) hold no resident pages of the largest arrays until a device is given them.
        self.ring = np.zeros((window, features, capacity), dtype=np.float32)
        self.times = np.zeros((window, capacity))  # sample time (unix s) of each slot
        self.written = np.zeros(capacity, dtype=np.int64)  # samples ever written per row
        self.tail = np.zeros(capacity, dtype=np.int64)  # the oldest sample still in the window
        self.sums = np.zeros((features, capacity))  # over the window, NaN counted as absent
        # A window's count is at most its ring's length: int16 for any ring that short (they all are).
        self.counts = np.zeros((features, capacity), dtype=np.int16 if window <= np.iinfo(np.int16).max else np.int32)
        self.last = np.full((features, capacity), np.nan)  # each row's newest sample

    @property
    def capacity(self) -> int:
        return int(self.written.shape[0])

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None:
        self.ring = grown_rows(self.ring, capacity, axis=2, keep=keep)
        self.times = grown_rows(self.times, capacity, axis=1, keep=keep)
        self.written = grown_rows(self.written, capacity, keep=keep)
        self.tail = grown_rows(self.tail, capacity, keep=keep)
        self.sums = grown_rows(self.sums, capacity, axis=1, keep=keep)
        self.counts = grown_rows(self.counts, capacity, axis=1, keep=keep)
        self.last = grown_rows(self.last, capacity, axis=1, keep=keep)

    def clear(self, rows: np.ndarray) -> None:
        """A row's start state (its ring's and times' slots are left: a row reads only what it wrote since)."""
        self.written[rows] = 0
        self.tail[rows] = 0
        self.sums[:, rows] = 0.0
        self.counts[:, rows] = 0
        self.last[:, rows] = np.nan

    def _drop_oldest(self, rows: np.ndarray | RowIndex) -> None:
        """Take each row's oldest sample out of its window sums (rows unique, each with one)."""
        ix = RowIndex.of(rows)
        tail = ix.take(self.tail)
        # In place: the rows' own sums and counts when they are a slice, else their copies, written back.
        counts = ix.take(self.counts, axis=1)
        sums = ix.take(self.sums, axis=1)
        _leave(sums, counts, ix.take_slots(self.ring, tail % self.window))
        ix.written_back(self.counts, counts, axis=1)
        ix.written_back(self.sums, sums, axis=1)
        ix.put(self.tail, tail + 1)

    def append(self, rows: np.ndarray | RowIndex, time_s: np.ndarray | float, values: np.ndarray) -> None:
        """One sample per row (rows unique): ``values`` is ``(features, len(rows))``, NaN = absent.

        Each row's window sums change in the order a sample at a time would change them: its oldest out where its
        ring is full (the slot the new one takes), the new one in, then each oldest that the new one's time leaves
        behind out. The first two steps and the first sample left behind go in one pass over the rows (a small
        fleet's batch pays each numpy call's fixed cost, not its work); only a row that leaves more than one behind
        (back from a gap) takes more passes."""
        ix = RowIndex.of(rows)
        t = shaped(np.asarray(time_s, dtype=np.float64), ix.rows.shape)
        written = ix.take(self.written).copy()
        tail = ix.take(self.tail)
        full = written - tail >= self.window  # the slot about to be written still holds a sample
        slot = written % self.window
        new = values.astype(np.float32, copy=False)
        new_valid = ~np.isnan(new)
        add = np.where(new_valid, new, np.float32(0.0))  # (float32: the sums add it exactly as its float64)
        # The oldest once a full ring's has left: it leaves too where the new sample's time leaves it behind
        # (read before the new one is written, whose slot is never that one's while it is not the newest).
        first = tail + full
        aged = None
        if self.window_s != float("inf"):
            cutoff = t - self.window_s
            aged = self._left_behind(ix, first, written + 1, cutoff, t)
        if aged is None and not any_of(full):
            ix.add(self.sums, add, axis=1)
            ix.add(self.counts, new_valid, axis=1)
        else:
            counts = ix.take(self.counts, axis=1)
            sums = ix.take(self.sums, axis=1)
            # (Rows that lose nothing are masked: a window with no valid value of a feature sums to exactly zero
            # already, so the zeroing leaves theirs as it is.)
            if any_of(full):
                _leave(sums, counts, ix.take_slots(self.ring, tail % self.window), None if all_of(full) else full)
            sums += add
            counts += new_valid
            if aged is not None:
                _leave(sums, counts, ix.take_slots(self.ring, first % self.window), aged)
                first = first + aged
            ix.written_back(self.counts, counts, axis=1)
            ix.written_back(self.sums, sums, axis=1)
            ix.put(self.tail, first)
        ix.put_slots(self.ring, slot, new)
        ix.put_slots(self.times, slot, t)
        written += 1
        ix.put(self.written, written)
        ix.put(self.last, new, axis=1)
        while aged is not None:  # as many more passes as samples leave one row's window: none, usually
            aged = self._left_behind(ix, ix.take(self.tail), written, cutoff, t)
            if aged is not None:
                self._drop_oldest(ix.rows[aged])

    def _left_behind(
        self, ix: RowIndex, tail: np.ndarray, written: np.ndarray, cutoff: np.ndarray, t: np.ndarray
    ) -> np.ndarray | None:
        """Which rows' oldest (at ``tail``, of ``written`` samples with the newest) leaves the window: stamped at or
        before ``cutoff``, or after the newest's time ``t`` (None: none). The newest always stays. A sample stamped
        after the one just written leaves once it is the oldest written: the row's clock jumped back (the decoders
        take a point far behind its series as such a jump), and the window is judged by the row's present, not by a
        time it has gone back from."""
        live = tail < written - 1
        oldest = ix.take_slots(self.times, tail % self.window)
        old = live & ((oldest <= cutoff) | (oldest > t))
        return old if any_of(old) else None

    def holds_first(self, rows: np.ndarray | slice) -> np.ndarray:
        """Whether each row's window still holds its first sample (whose time step is 0)."""
        return (self.tail[rows] == 0) & (self.written[rows] > 0)

    def latest(self, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """Each row's newest sample, ``(features, rows)`` (NaN for rows never written); a view for a slice."""
        return self.last if rows is None else self.last[:, rows]

    def samples(self, rows: np.ndarray, feature: int) -> np.ndarray:
        """The window's samples of one feature for a few rows, ``(window, rows)`` in ring order, NaN where a
        slot is outside the row's window: for robust statistics (a median) that running sums can't give."""
        tail, written = self.tail[rows], self.written[rows]
        held = np.minimum(written - tail, self.window)
        age = (np.arange(self.window)[:, None] - tail[None, :]) % self.window  # 0 for the oldest in the window
        values = self.ring[:, feature, rows].astype(np.float64)
        return np.where(age < held[None, :], values, np.nan)

    def mean(self) -> np.ndarray:
        """Window mean of every feature (NaN where the window has no valid value)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counts > 0, self.sums / self.counts, np.nan)


def _leave(sums: np.ndarray, counts: np.ndarray, old: np.ndarray, leaving: np.ndarray | None = None) -> None:
    """Take the samples ``old`` (``(features, rows)``, NaN absent) out of windows' ``sums`` and ``counts``, in place
    (``leaving``: the rows that lose theirs; None: all). A window with no valid value of a feature sums to exactly
    zero (no float residue)."""
    valid = ~np.isnan(old)
    if leaving is not None:
        valid &= leaving
    counts -= valid
    np.subtract(sums, old, out=sums, where=valid)
    np.copyto(sums, 0.0, where=counts == 0)
