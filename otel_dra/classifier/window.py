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

    def _drop_oldest(
        self, rows: np.ndarray | RowIndex, add: np.ndarray | None = None, added: np.ndarray | None = None
    ) -> None:
        """Take each row's oldest sample out of its window sums (rows unique, each with one); with ``add`` (the
        new sample's values, NaN as 0) and ``added`` (which are valid), add the new sample in the same pass."""
        ix = RowIndex.of(rows)
        tail = ix.take(self.tail)
        old = ix.take_slots(self.ring, tail % self.window)
        valid = ~np.isnan(old)
        # In place: the rows' own sums and counts when they are a slice, else their copies, written back.
        counts = ix.take(self.counts, axis=1)
        counts -= valid
        sums = ix.take(self.sums, axis=1)
        np.subtract(sums, old, out=sums, where=valid)
        # A window with no valid value of a feature sums to exactly zero (no float residue).
        np.copyto(sums, 0.0, where=counts == 0)
        if add is not None and added is not None:
            sums += add
            counts += added
        ix.written_back(self.counts, counts, axis=1)
        ix.written_back(self.sums, sums, axis=1)
        ix.put(self.tail, tail + 1)

    def append(self, rows: np.ndarray | RowIndex, time_s: np.ndarray | float, values: np.ndarray) -> None:
        """One sample per row (rows unique): ``values`` is ``(features, len(rows))``, NaN = absent."""
        ix = RowIndex.of(rows)
        t = shaped(np.asarray(time_s, dtype=np.float64), ix.rows.shape)
        written = ix.take(self.written).copy()
        full = written - ix.take(self.tail) >= self.window  # the slot about to be written still holds a sample
        slot = written % self.window
        new = values.astype(np.float32, copy=False)
        new_valid = ~np.isnan(new)
        add = np.where(new_valid, new, np.float32(0.0))  # (float32: the sums add it exactly as its float64)
        if all_of(full):  # every row's ring full (a fleet that has run a while): the oldest leaves as the new comes
            self._drop_oldest(ix, add, new_valid)
        else:
            if any_of(full):
                self._drop_oldest(ix.rows[full])
            ix.add(self.sums, add, axis=1)
            ix.add(self.counts, new_valid, axis=1)
        ix.put_slots(self.ring, slot, new)
        ix.put_slots(self.times, slot, t)
        written += 1
        ix.put(self.written, written)
        ix.put(self.last, new, axis=1)
        if self.window_s != float("inf"):
            cutoff = t - self.window_s
            while True:  # as many rounds as samples leave one row's window: one, usually
                tail = ix.take(self.tail)
                live = tail < written - 1  # the newest sample always stays
                oldest = ix.take_slots(self.times, tail % self.window)
                # A sample stamped after the one just written leaves too, once it is the oldest written: the
                # row's clock jumped back (the decoders take a point far behind its series as such a jump),
                # and the window is judged by the row's present, not by a time it has gone back from.
                old = live & ((oldest <= cutoff) | (oldest > t))
                if not any_of(old):
                    break
                self._drop_oldest(ix.rows[old])

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
