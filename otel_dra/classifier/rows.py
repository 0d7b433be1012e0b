"""A batch's device rows, and the cheapest way to read and write them in the per-device arrays.

A fleet tick ingests every device once, in row order, except the few that did not report
(a lost device, a silent node): rows that are one ascending run with a few holes. Numpy's
fancy indexing pays per element for what is, between the holes, a slice: such a batch is read
and written as one slice copy per run of consecutive rows (a third of the cost of a scatter, half
of a gather), other batches are gathered with ``np.take``, and a batch that is one run is read as
views and written in place.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

from otel_dra.classifier.numeric import all_of, flatnonzero

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
        step = rows[1:] - rows[:-1]
        breaks = flatnonzero(step != 1)
        if breaks.size == 0:
            self.at = slice(first, first + n)
        elif breaks.size < n // ROWS_PER_RUN and all_of(step[breaks] > 0):
            ends = (breaks + 1).tolist()
            starts = [0, *ends]
            self.runs = [(int(rows[s]), s, e) for s, e in zip(starts, [*ends, n], strict=True)]

    @classmethod
    def of(cls, rows: np.ndarray | RowIndex) -> RowIndex:
        return rows if isinstance(rows, RowIndex) else cls(rows)

    def __len__(self) -> int:
        return int(self.rows.shape[0])

    def _at(self, axis: int, at: slice | np.ndarray) -> tuple[slice | np.ndarray, ...]:
        return (slice(None),) * axis + (at,)

    def take(self, a: np.ndarray, axis: int = 0) -> np.ndarray:
        """The rows of ``a`` (rows on ``axis``): a view for a slice, else a copy."""
        if isinstance(self.at, slice):
            return a[self._at(axis, self.at)]
        if self.runs is None or a.ndim == 1:
            return a.take(self.rows, axis=axis)
        # Run by run: np.take along a last axis copies element by element.
        shape = list(a.shape)
        shape[axis] = len(self)
        out = np.empty(shape, dtype=a.dtype)
        for lo, s, e in self.runs:
            out[self._at(axis, slice(s, e))] = a[self._at(axis, slice(lo, lo + e - s))]
        return out

    def put(self, a: np.ndarray, values: Any, axis: int = 0) -> None:
        """``a[rows] = values`` along ``axis`` (``values``: one per row, or one for all)."""
        if self.runs is None or a.ndim == 1 or np.ndim(values) == 0:
            a[self._at(axis, self.at)] = values
            return
        for lo, s, e in self.runs:
            a[self._at(axis, slice(lo, lo + e - s))] = values[self._at(axis, slice(s, e))]

    def written_back(self, a: np.ndarray, taken: np.ndarray, axis: int = 0) -> None:
        """Store ``taken``, what :meth:`take` gave and was then changed in place: a view of ``a`` for a
        slice (already there), else a copy to put back."""
        if not isinstance(self.at, slice):
            self.put(a, taken, axis)

    def add(self, a: np.ndarray, values: np.ndarray, axis: int = 0) -> None:
        """``a[rows] += values`` along ``axis``, in place."""
        self._update(np.add, a, values, axis)

    def subtract(self, a: np.ndarray, values: np.ndarray, axis: int = 0) -> None:
        """``a[rows] -= values`` along ``axis``, in place."""
        self._update(np.subtract, a, values, axis)

    def _update(self, op: np.ufunc, a: np.ndarray, values: np.ndarray, axis: int) -> None:
        if isinstance(self.at, slice):
            view = a[self._at(axis, self.at)]
            op(view, values, out=view)
        elif self.runs is None:
            a[self._at(axis, self.at)] = op(a.take(self.rows, axis=axis), values)
        else:
            for lo, s, e in self.runs:
                view = a[self._at(axis, slice(lo, lo + e - s))]
                op(view, values[self._at(axis, slice(s, e))], out=view)

    def take_slots(self, a: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """``a[slot, ..., row]`` for each row of a ring ``(slots, ..., rows)``, each row at its own slot:
        ``(..., len(rows))``."""
        if _uniform(slots):
            return self.take(a[int(slots[0])], axis=a.ndim - 2)
        if a.flags.c_contiguous:  # one gather from the flat ring
            return a.reshape(-1).take(self._flat(a, slots))
        return np.moveaxis(a[(slots, Ellipsis, self.rows)], 0, -1)

    def put_slots(self, a: np.ndarray, slots: np.ndarray, values: Any) -> None:
        """``a[slot, ..., row] = values`` for each row, at its own slot."""
        if _uniform(slots):
            self.put(a[int(slots[0])], values, axis=a.ndim - 2)
        elif a.flags.c_contiguous:
            a.reshape(-1)[self._flat(a, slots)] = values
        else:
            a[(slots, Ellipsis, self.rows)] = np.moveaxis(np.asarray(values), -1, 0) if np.ndim(values) else values

    def take_slots_of(self, rings: tuple[np.ndarray, ...], slots: np.ndarray) -> tuple[np.ndarray, ...]:
        """:meth:`take_slots` of each of ``rings`` (where the slots differ and the rings are of one shape, their flat
        positions are worked out once for all of them)."""
        if _uniform(slots) or not _one_flat_shape(rings):
            return tuple(self.take_slots(ring, slots) for ring in rings)
        flat = self._flat(rings[0], slots)
        return tuple(ring.reshape(-1).take(flat) for ring in rings)

    def add_slots(self, rings: tuple[np.ndarray, ...], slots: np.ndarray, values: tuple[np.ndarray, ...]) -> None:
        """``ring[slot, ..., row] += value`` for each ring and its values, each row at its own slot: in place where
        every row's slot is the same (the usual tick: the rows' rings turn in step); else, where the rings are of
        one shape, at flat positions worked out once for all of them."""
        if _uniform(slots):
            for ring, value in zip(rings, values, strict=True):
                self.add(ring[int(slots[0])], value, axis=ring.ndim - 2)
            return
        if not _one_flat_shape(rings):
            for ring, value in zip(rings, values, strict=True):
                self.put_slots(ring, slots, self.take_slots(ring, slots) + value)
            return
        flat = self._flat(rings[0], slots)
        for ring, value in zip(rings, values, strict=True):
            cells = ring.reshape(-1)
            cells[flat] = cells.take(flat) + value

    def _flat(self, a: np.ndarray, slots: np.ndarray) -> np.ndarray:
        """Flat positions in the C-contiguous ring ``a`` of each (slot, ..., row): ``(..., len(rows))``."""
        return ring_offsets(a.shape) + (slots.astype(np.int64) * math.prod(a.shape[1:]) + self.rows)


@functools.lru_cache(maxsize=64)
def ring_offsets(shape: tuple[int, ...]) -> np.ndarray:
    """The flat offset of each inner position (the ``...`` of ``(slot, ..., row)``) of a ring of ``shape``, as a
    column: the same for every batch while the ring keeps its shape (read-only, shared)."""
    cap = shape[-1]
    inner = (np.arange(math.prod(shape[1:-1]), dtype=np.int64) * cap).reshape((*shape[1:-1], 1))
    inner.flags.writeable = False
    return inner


def _one_flat_shape(rings: tuple[np.ndarray, ...]) -> bool:
    """Whether the rings are C-contiguous and of one shape: one set of flat positions reads them all."""
    shape = rings[0].shape
    return all(ring.flags.c_contiguous and ring.shape == shape for ring in rings)


def _uniform(slots: np.ndarray) -> bool:
    """Whether every row's slot is the same (devices that started together: their rings turn in step)."""
    return bool(slots.size) and all_of(slots == slots[0])
