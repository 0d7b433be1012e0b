"""Device identity → rows of every per-device array.

Devices are keyed by (``k8s.node.name``, ``hw.id``) (contract §1). Rows are handed out from a free list; when
none is free, every registered array grows at once, to fit and by an eighth more (a small fleet: at most
``GROW_ROWS`` more; :func:`next_capacity`: a new device costs amortised O(1), not a copy of the world), and rows
of devices gone longer than the TTL go back on the free list. Grown rows stay unwritten zeros until a device is
first given one: then every part writes the row's start state (its ``clear``), so the rows grown ahead of the
devices hold no resident memory but the pages they share with rows written. When the devices left fill under a
quarter of the rows, every array is compacted to twice their number (the live rows renumbered in order), so a
fleet that once held 100,000 devices and now holds 1,000 holds arrays for 2,000.
"""

from __future__ import annotations

import mmap
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Final

import numpy as np

from otel_dra.classifier.numeric import flatnonzero
from otel_dra.frame import FrozenAttrs

#: Called with the new capacity when the registry grows, and with the rows kept (in their new order) when it
#: compacts: every per-device array resizes then (:func:`grown` does both).
ResizeHook = Callable[[int, np.ndarray | None], None]
#: Called with the rows being released (a device expired, or another one took its slot).
ReleaseHook = Callable[[np.ndarray], None]
#: Called with rows whose per-device state must start over: rows released, and rows about to be given to a
#: device for the first time since the arrays grew (:func:`grown_rows` leaves them as zeros).
ClearHook = Callable[[np.ndarray], None]
#: Rows given their start state at once, ahead of the devices: a fleet's first tick brings its devices a node
#: at a time, and each part's ``clear`` per node would cost more than the rows written ahead (about a kB each).
START_AHEAD = 256
#: Rows a registry of fewer than ``EIGHTH_FROM`` rows grows by at most beyond what it needs (:func:`next_capacity`).
GROW_ROWS: Final = 512
#: From this many rows on, a registry grows by an eighth at least: an eighth's tail of a float32 slab is 4 pages.
EIGHTH_FROM: Final = 32_768
#: A grown array of at least this many bytes is mapped pages of its own (:func:`zeroed`), not malloc's.
MAPPED_BYTES: Final = 256 << 10
#: Private anonymous pages (None where ``mmap`` has no such flags: Windows; there :func:`zeroed` is malloc's).
_PRIVATE: Final = (
    mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS if hasattr(mmap, "MAP_PRIVATE") and hasattr(mmap, "MAP_ANONYMOUS") else None
)


def zeroed(shape: Sequence[int], dtype: np.dtype) -> np.ndarray:
    """Zeros of ``shape``: a large array on anonymous pages of its own (``mmap``), handed back whole when freed.

    malloc maps a large block only while it is over its threshold, which rises to the size of every mapped
    block freed (glibc's dynamic threshold, up to 32 MB): after the first growth freed the old arrays, the next
    ones came from the heap, where calloc writes its zeros (every row grown ahead resident) and where each
    growth's freed arrays left holes that a request's temporaries filled and held resident."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape))
    if count * dtype.itemsize < MAPPED_BYTES or _PRIVATE is None:
        return np.zeros(shape, dtype=dtype)
    pages = mmap.mmap(-1, count * dtype.itemsize, flags=_PRIVATE)  # (never shared with a forked process)
    return np.frombuffer(pages, dtype=dtype, count=count).reshape(shape)


def grown(array: np.ndarray, capacity: int, fill: object, axis: int = 0, keep: np.ndarray | None = None) -> np.ndarray:
    """``array`` extended along ``axis`` to ``capacity``, new entries set to ``fill``; with ``keep``, only
    those entries (in that order, renumbered from 0) are kept before it is extended.

    The new entries of a zero ``fill`` are not written: a large array comes zeroed from the system (pages of its
    own: :func:`zeroed`), so rows past the devices' cost no resident memory until a device is given them, but for
    the pages they share with rows written (:func:`next_capacity`)."""
    if keep is not None:
        array = np.take(array, keep, axis=axis)
    old = array.shape[axis]
    if capacity <= old:
        return array
    shape = list(array.shape)
    shape[axis] = capacity
    out = zeroed(shape, array.dtype)
    at: list[slice] = [slice(None)] * array.ndim
    at[axis] = slice(0, old)
    out[tuple(at)] = array
    if fill != 0:  # (NaN too)
        at[axis] = slice(old, None)
        out[tuple(at)] = fill
    return out


def grown_rows(array: np.ndarray, capacity: int, axis: int = 0, keep: np.ndarray | None = None) -> np.ndarray:
    """A per-device array extended along its rows' ``axis`` to ``capacity``: :func:`grown`, its new rows left
    as unwritten zeros whatever the row's start state is. The registry has each part write a row's start
    state (its ``clear``) before the row is first given to a device, so the rows grown ahead of the devices
    (an eighth of the fleet) cost no resident memory, where a -inf or NaN written into them cost about a kB
    a row."""
    return grown(array, capacity, 0, axis, keep)


def next_capacity(capacity: int, needed: int) -> int:
    """Rows to grow ``capacity`` to when ``needed`` rows in all must fit: what fits them, and an eighth more at
    least, but no more than ``GROW_ROWS`` more below ``EIGHTH_FROM`` rows (rows that come a few at a time cost a
    copy of every array per step, not per row; growing by half again left a fleet that came in two ticks a
    quarter too large).

    The per-device arrays hold devices as their last axis, so the rows past the devices are a tail in every slab
    (a feature of a ring slot): resident unless the tail spans whole pages. A small fleet's tails are under a page
    (an eighth of 8,000 float32 rows is 4 kB), so each row grown ahead costs what a device's arrays do; there a
    copy of every array is cheap (8,000 devices: ~65 MB), so it grows by a fixed step. A large fleet's eighth is
    whole pages that stay untouched, and its copies are not cheap: it grows by an eighth."""
    eighth = capacity // 8
    return max(needed, capacity + (eighth if capacity >= EIGHTH_FROM else min(eighth, GROW_ROWS)))


class DeviceRegistry:
    """Rows for devices; per-row node index, attributes, first/last sample time."""

    def __init__(self, capacity: int = 64) -> None:
        self.capacity = max(1, capacity)
        self.min_capacity = self.capacity  # compaction never goes below what it was made with
        self.generation = 0  # bumps whenever a device loses its row (expired, or rows renumbered)
        self._rows: dict[tuple[str, str], int] = {}
        self._free: list[int] = list(range(self.capacity - 1, -1, -1))
        self.keys: list[tuple[str, str] | None] = [None] * self.capacity
        self.attrs: list[Mapping[str, str]] = [{}] * self.capacity
        self.nodes: list[str] = []
        self._node_index: dict[str, int] = {}
        self.node_of = np.full(self.capacity, -1, dtype=np.int32)
        self.active = np.zeros(self.capacity, dtype=bool)
        self.last_seen = np.full(self.capacity, np.nan)  # unix seconds of the newest sample (its node's clock)
        self.last_heard = np.full(self.capacity, np.nan)  # when it was last heard (the reference clock)
        self.first_seen = np.full(self.capacity, np.nan)
        self.attrs_version = np.zeros(self.capacity, dtype=np.int32)  # bumps when attrs change
        self._resize_hooks: list[ResizeHook] = []
        self._release_hooks: list[ReleaseHook] = []
        self._clear_hooks: list[ClearHook] = []
        #: Rows at and past this one are as :func:`grown_rows` left them (zeros): never given their start state.
        self._started = 0

    def on_resize(self, hook: ResizeHook) -> None:
        self._resize_hooks.append(hook)

    def on_release(self, hook: ReleaseHook) -> None:
        self._release_hooks.append(hook)

    def on_clear(self, hook: ClearHook) -> None:
        """``hook(rows)`` sets those rows' start state: when released, and before they are first given out."""
        self._clear_hooks.append(hook)

    def _start(self, upto: int) -> None:
        """Rows below ``upto`` are about to be given out: have every part write the start state of those not
        started yet (and :data:`START_AHEAD` more, so a fleet arriving a node at a time clears in blocks)."""
        if upto <= self._started:
            return
        end = min(self.capacity, max(upto, self._started + START_AHEAD))
        rows = np.arange(self._started, end, dtype=np.intp)
        for hook in self._clear_hooks:
            hook(rows)
        self._started = end

    def _cleared(self, rows: np.ndarray) -> None:
        """Rows that lose their device: every part's state for them starts over, then the release hooks."""
        for hook in self._clear_hooks:
            hook(rows)
        for hook in self._release_hooks:
            hook(rows)

    def __len__(self) -> int:
        return len(self._rows)

    def node_index(self, node: str) -> int:
        index = self._node_index.get(node)
        if index is None:
            index = self._node_index[node] = len(self.nodes)
            self.nodes.append(node)
        return index

    def _grow(self, needed: int) -> None:
        """Make room for ``needed`` more devices (:func:`next_capacity`): rows past the devices are memory each
        device's arrays' worth."""
        capacity = next_capacity(self.capacity, len(self._rows) + needed)
        old = self.capacity
        self._free = list(range(capacity - 1, old - 1, -1)) + self._free
        self.keys += [None] * (capacity - old)
        self.attrs += [{}] * (capacity - old)
        self.node_of = grown(self.node_of, capacity, -1)
        self.active = grown(self.active, capacity, False)
        self.last_seen = grown(self.last_seen, capacity, np.nan)
        self.last_heard = grown(self.last_heard, capacity, np.nan)
        self.first_seen = grown(self.first_seen, capacity, np.nan)
        self.attrs_version = grown(self.attrs_version, capacity, 0)
        self.capacity = capacity
        for hook in self._resize_hooks:
            hook(capacity, None)

    def reserve(self, tables: Iterable[tuple[str, Sequence[str]]]) -> None:
        """Make room at once for the devices of these (node, ids) not registered yet: a batch that brings a
        fleet's devices (its first tick) grows every array once, to fit them, not by half again and again
        (ending up to a third larger than the fleet)."""
        rows = self._rows
        needed = len({(node, dev) for node, ids in tables for dev in ids if (node, dev) not in rows})
        if needed > len(self._free):
            self._grow(needed)

    def rows_for(self, node: str, ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Rows of ``node``'s devices ``ids`` (registering new ones) and a mask of the new."""
        rows = np.empty(len(ids), dtype=np.intp)
        new = np.zeros(len(ids), dtype=bool)
        missing = [i for i, dev in enumerate(ids) if (node, dev) not in self._rows]
        if len(missing) > len(self._free):
            self._grow(len(missing))
        node_ix = self.node_index(node) if missing else -1
        if missing:
            self._start(max(self._free[-len(missing) :]) + 1)
        for i in missing:
            row = self._free.pop()
            key = (node, ids[i])
            self._rows[key] = row
            self.keys[row] = key
            self.node_of[row] = node_ix
            self.active[row] = True
            new[i] = True
        for i, dev in enumerate(ids):
            rows[i] = self._rows[(node, dev)]
        return rows, new

    def row(self, node: str, hw_id: str) -> int | None:
        return self._rows.get((node, hw_id))

    def set_attrs(self, row: int, attrs: Mapping[str, str]) -> bool:
        """Record a device's descriptive attributes; True when they changed. A :class:`FrozenAttrs` (the
        decoders' device tables give one per distinct set) is kept as it is, shared with the tables and the
        verdict board; any other mapping is copied into one."""
        held = self.attrs[row]
        if held is attrs or held == attrs:
            return False
        self.attrs[row] = FrozenAttrs.of(attrs)
        self.attrs_version[row] += 1
        return True

    def renew(self, rows: np.ndarray) -> None:
        """Another device now sits in ``rows``' slots (a new serial number under the same id): every part
        forgets what it kept for them, as for a device released, while the rows stay registered."""
        self._cleared(rows)
        self.last_seen[rows] = np.nan
        self.first_seen[rows] = np.nan

    def expire(self, now_s: float, ttl_s: float | np.ndarray) -> np.ndarray:
        """Release devices not heard for ``ttl_s`` (one for all, or one per row; ``now_s`` in the reference
        clock); returns their (now free) rows."""
        gone = flatnonzero(self.active & (now_s - self.last_heard > ttl_s))
        if gone.size:
            self.generation += 1
            self._cleared(gone)
            for row in gone.tolist():
                key = self.keys[row]
                if key is not None:
                    del self._rows[key]
                self.keys[row] = None
                self.attrs[row] = {}
                self._free.append(row)
            self.node_of[gone] = -1
            self.active[gone] = False
            self.last_seen[gone] = np.nan
            self.last_heard[gone] = np.nan
            self.first_seen[gone] = np.nan
        return gone

    def compact(self) -> np.ndarray | None:
        """When the devices fill under a quarter of the rows, renumber them 0..n-1 in row order and cut
        every array to twice their number (never under ``min_capacity``); returns the rows kept (new row
        ``i`` was row ``kept[i]``), None when nothing moved. Nodes with no device left are forgotten too."""
        live = flatnonzero(self.active)
        capacity = max(self.min_capacity, 2 * live.size)
        if 4 * live.size >= self.capacity or capacity >= self.capacity:
            return None
        nodes_live = np.unique(self.node_of[live])
        node_map = np.full(len(self.nodes), -1, dtype=np.int32)
        node_map[nodes_live] = np.arange(nodes_live.size, dtype=np.int32)
        self.nodes = [self.nodes[i] for i in nodes_live.tolist()]
        self._node_index = {node: i for i, node in enumerate(self.nodes)}
        keys = [self.keys[row] for row in live.tolist()]
        self.keys = keys + [None] * (capacity - live.size)
        self.attrs = [self.attrs[row] for row in live.tolist()] + [{}] * (capacity - live.size)
        self._rows = {key: i for i, key in enumerate(keys) if key is not None}
        self._free = list(range(capacity - 1, live.size - 1, -1))
        self.node_of = grown(node_map[self.node_of[live]], capacity, -1)
        self.active = grown(self.active, capacity, False, keep=live)
        self.last_seen = grown(self.last_seen, capacity, np.nan, keep=live)
        self.last_heard = grown(self.last_heard, capacity, np.nan, keep=live)
        self.first_seen = grown(self.first_seen, capacity, np.nan, keep=live)
        self.attrs_version = grown(self.attrs_version, capacity, 0, keep=live)
        self.capacity = capacity
        self._started = live.size  # the rows past the devices kept are new, as grown
        self.generation += 1
        for hook in self._resize_hooks:
            hook(capacity, live)
        return live
