"""The window store: per device, a ring of the last ``W`` samples' features.

Devices are rows, features are columns, the ring is ``(W, devices, features)`` float32.
Appending a sample for a device overwrites its oldest slot; running sums and counts of
valid (non-NaN) values are kept in step (add the new sample, subtract the one it
replaces), so the sum over a device's window is read in O(1), and a rule tick over a
whole fleet is O(devices x features), not O(devices x window x features).
"""

from __future__ import annotations

import numpy as np

from otel_dra.store.registry import grown


class WindowStore:
    """Last ``window`` samples of ``features`` features per device row."""

    def __init__(self, features: int, window: int, capacity: int) -> None:
        if window < 1:
            raise ValueError("window must hold at least one sample")
        self.features = features
        self.window = window
        self.ring = np.full((window, capacity, features), np.nan, dtype=np.float32)
        self.times = np.full((window, capacity), np.nan)  # sample time (unix s) of each slot
        self.written = np.zeros(capacity, dtype=np.int64)  # samples ever written per row
        self.sums = np.zeros((capacity, features))  # over the window, NaN counted as absent
        self.counts = np.zeros((capacity, features), dtype=np.int32)
        self.last = np.full((capacity, features), np.nan)  # each row's newest sample

    @property
    def capacity(self) -> int:
        return int(self.written.shape[0])

    def resize(self, capacity: int) -> None:
        self.ring = grown(self.ring, capacity, np.nan, axis=1)
        self.times = grown(self.times, capacity, np.nan, axis=1)
        self.written = grown(self.written, capacity, 0)
        self.sums = grown(self.sums, capacity, 0.0)
        self.counts = grown(self.counts, capacity, 0)
        self.last = grown(self.last, capacity, np.nan)

    def clear(self, rows: np.ndarray) -> None:
        self.ring[:, rows] = np.nan
        self.times[:, rows] = np.nan
        self.written[rows] = 0
        self.sums[rows] = 0.0
        self.counts[rows] = 0
        self.last[rows] = np.nan

    def append(self, rows: np.ndarray, time_s: np.ndarray | float, values: np.ndarray) -> None:
        """One sample per row (rows unique): ``values`` is ``(len(rows), features)``, NaN = absent."""
        slot = self.written[rows] % self.window
        old = self.ring[slot, rows]
        old_valid = ~np.isnan(old)
        new = values.astype(np.float32, copy=False)
        new_valid = ~np.isnan(new)
        self.sums[rows] += np.where(new_valid, new, 0.0) - np.where(old_valid, old, 0.0)
        counts = self.counts[rows] + new_valid.astype(np.int32) - old_valid.astype(np.int32)
        self.counts[rows] = counts
        # A window with no valid value of a feature sums to exactly zero (no float residue).
        self.sums[rows] = np.where(counts == 0, 0.0, self.sums[rows])
        self.ring[slot, rows] = new
        self.times[slot, rows] = time_s
        self.written[rows] += 1
        self.last[rows] = new

    def latest(self, rows: np.ndarray | slice | None = None) -> np.ndarray:
        """Each row's newest sample (NaN for rows never written); a view for a slice."""
        return self.last if rows is None else self.last[rows]

    def mean(self) -> np.ndarray:
        """Window mean of every feature (NaN where the window has no valid value)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.counts > 0, self.sums / self.counts, np.nan)
