"""A batch's device rows, and the cheapest way to read and write them in the per-device arrays.

A fleet tick ingests every device once, in row order, except the few that did not report
(a lost device, a silent node): rows that are one ascending run with a few holes. Numpy's
fancy indexing pays per element for what is, between the holes, a slice: gathering rows with
``np.take`` costs half as much, and scattering them as one slice copy per run of consecutive
rows a third, while a batch that is one run is read as views and written in place.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: A batch is written run by run while it has at most one run per this many rows (a slice
#: copy per run costs about what ~64 rows cost scattered by index).
ROWS_PER_RUN = 64


class RowIndex:
    """Unique device rows of one batch: ``at`` is a slice when they are one ascending run, else
    the rows; ``runs`` are ``(first row, start, end)`` of each run of consecutive rows when the
    rows ascend with few holes (``None`` otherwise)."""

    __slots__ = ("at", "rows", "runs")

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = rows
        self.at: np.ndarray | slice = rows
        self.runs: list[tuple[int, int, int]] | None = None
        n = rows.shape[0]
        if n == 0:
            return
        first = int(rows[0])
        if n < 3:
            if int(rows[-1]) - first == n - 1:
                self.at = slice(first, first + n)
            return
        step = np.diff(rows)
        breaks = np.flatnonzero(step != 1)
        if breaks.size == 0:
            self.at = slice(first, first + n)
        elif breaks.size < n // ROWS_PER_RUN and bool((step[breaks] > 0).all()):
            ends = (breaks + 1).tolist()
            starts = [0, *ends]
            self.runs = [(int(rows[s]), s, e) for s, e in zip(starts, [*ends, n], strict=True)]

    @classmethod
    def of(cls, rows: np.ndarray | RowIndex) -> RowIndex:
        return rows if isinstance(rows, RowIndex) else cls(rows)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def take(self, a: np.ndarray) -> np.ndarray:
        """The rows of ``a`` (rows on axis 0): a view for a slice, else a copy."""
        return a[self.at] if isinstance(self.at, slice) else np.take(a, self.rows, axis=0)

    def put(self, a: np.ndarray, values: Any) -> None:
        """``a[rows] = values`` (``values``: one per row, or one for all)."""
        if self.runs is None or np.ndim(values) == 0:
            a[self.at] = values
            return
        for lo, s, e in self.runs:
            a[lo : lo + e - s] = values[s:e]

    def written_back(self, a: np.ndarray, taken: np.ndarray) -> None:
        """Store ``taken``, what :meth:`take` gave and was then changed in place: a view of ``a`` for a
        slice (already there), else a copy to put back."""
        if not isinstance(self.at, slice):
            self.put(a, taken)

    def add(self, a: np.ndarray, values: np.ndarray) -> None:
        """``a[rows] += values``, in place."""
        if self.runs is None:
            if isinstance(self.at, slice):
                a[self.at] += values
            else:
                a[self.at] = np.take(a, self.rows, axis=0) + values
            return
        for lo, s, e in self.runs:
            a[lo : lo + e - s] += values[s:e]

    def subtract(self, a: np.ndarray, values: np.ndarray) -> None:
        """``a[rows] -= values``, in place."""
        if self.runs is None:
            if isinstance(self.at, slice):
                a[self.at] -= values
            else:
                a[self.at] = np.take(a, self.rows, axis=0) - values
            return
        for lo, s, e in self.runs:
            a[lo : lo + e - s] -= values[s:e]

    def take_slots(self, a: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """``a[slots, rows]`` of a ring ``(slots, rows, ...)``: each row's own slot."""
        if _uniform(slots):
            return self.take(a[int(slots[0])])
        if a.flags.c_contiguous:  # one gather of the flattened ring's (slot, row) rows
            return np.take(a.reshape(-1, *a.shape[2:]), slots * a.shape[1] + self.rows, axis=0)
        return a[slots, self.rows]

    def put_slots(self, a: np.ndarray, slots: np.ndarray, values: Any) -> None:
        """``a[slots, rows] = values``."""
        if _uniform(slots):
            self.put(a[int(slots[0])], values)
        elif a.flags.c_contiguous:
            a.reshape(-1, *a.shape[2:])[slots * a.shape[1] + self.rows] = values
        else:
            a[slots, self.rows] = values


def _uniform(slots: np.ndarray) -> bool:
    """Whether every row's slot is the same (devices that started together: their rings turn in step)."""
    return bool(slots.size) and bool((slots == slots[0]).all())
