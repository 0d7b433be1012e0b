"""Frame assembly: the device tables (one object for equal ones), their descriptive attributes (one
mapping per set), and a frame's matrix from the points that land in it."""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Final

import numpy as np
import xxhash

from otel_dra import conventions as cv
from otel_dra.classifier.numeric import nans
from otel_dra.decode.series import SeriesIndex
from otel_dra.frame import NO_ATTRS, DeviceTable, FrozenAttrs, attrs_of

#: Pairs of a descriptive set that are one device's own: not kept in DescriptiveMaps' table of shared pairs.
_OWN_PAIRS: Final = frozenset({cv.HW_SERIAL_NUMBER, cv.HW_ID, cv.DRA_DEVICE_NAME})
#: Distinct shared pairs kept (past it the table starts again: pairs already shared stay shared).
MAX_SHARED_PAIRS: Final = 100_000
#: Bytes of a block of :class:`PackedArrays`, and the largest array packed into one (an eighth of it: the end a
#: block leaves unused is at most that).
PACK_BLOCK_BYTES: Final = 64 << 10
PACK_MAX_BYTES: Final = PACK_BLOCK_BYTES // 8


class DescriptiveMaps:
    """Each descriptive attribute set of a :class:`SeriesIndex` as one read-only mapping over the index's
    own pairs (:class:`~otel_dra.frame.FrozenAttrs`), made on first use: every device table that names a
    device with that set holds the same object, and so do the classifier's registry and the verdict board
    after it (a fleet's 100,000 devices hold one small mapping each, not a dict per table, registry and
    board). A device whose points carry several sets gets their merge, the later winning (its own).

    A set's (key, value) pairs are the index's, made one tuple each: a pair that devices repeat (their
    vendor, model, versions, driver, pool) is then one tuple for all of them, in the index and the
    mapping alike (:meth:`_shared`); what a set costs is its own pairs (a serial number, a name)."""

    def __init__(self, series: SeriesIndex) -> None:
        self._series = series
        self._maps: list[FrozenAttrs | None] = []
        self._pairs: dict[tuple[str, str], tuple[str, str]] = {}

    def _shared(self, d: int) -> tuple[tuple[str, str], ...]:
        """Set ``d``'s pairs with every repeated pair one tuple, in the index too (an equal tuple for an
        equal key: what the index finds by is what it found by before)."""
        series = self._series
        pairs = series.descrs[d]
        known = self._pairs
        if len(known) > MAX_SHARED_PAIRS:
            known.clear()
        shared = tuple(p if p[0] in _OWN_PAIRS else known.setdefault(p, p) for p in pairs)
        if any(a is not b for a, b in zip(shared, pairs, strict=True)):
            index = series.descr_index
            if index.get(pairs) == d:
                del index[pairs]
                index[shared] = d
            series.descrs[d] = shared
        return shared

    def merged(self, descrs: Sequence[int]) -> FrozenAttrs:
        """The attributes of a device whose points carried the sets ``descrs``, in point order."""
        if not descrs:
            return NO_ATTRS
        first = descrs[0]
        if all(d == first for d in descrs):
            maps = self._maps
            if first >= len(maps):
                maps.extend([None] * (len(self._series.descrs) - len(maps)))
            found = maps[first]
            if found is None:
                found = maps[first] = FrozenAttrs(self._shared(first))
            return found
        out: dict[str, str] = {}
        for d in descrs:
            out.update(self._series.descrs[d])
        return FrozenAttrs(tuple(out.items()))


class TableCache:
    """Equal device tables as one object, so consumers can cache per table. A table is found by its node,
    its devices and a 128-bit digest of their attributes (XXH3-128 of their text), so what the cache keeps
    per device is its table's, not a second copy of its attributes as a key."""

    def __init__(self) -> None:
        self._tables: dict[tuple[str, tuple[str, ...], bytes], DeviceTable] = {}

    def __len__(self) -> int:
        return len(self._tables)

    def clear(self) -> None:
        self._tables.clear()

    def table(self, node: str, ids: tuple[str, ...], attrs: tuple[Mapping[str, str], ...]) -> DeviceTable:
        """The one table of ``node`` with these devices (ids in device-index order) and attributes."""
        text = repr([attrs_of(a) for a in attrs])  # (repr of str is unambiguous: equal text, equal attributes)
        key = (node, ids, xxhash.xxh3_128_digest(text.encode("utf-8", "surrogatepass")))
        table = self._tables.get(key)
        if table is None:
            table = self._tables[key] = DeviceTable(node, ids, attrs)
        return table


def last_wins(cells: np.ndarray) -> np.ndarray | None:
    """Of points naming the same cell, the last one in the input wins: the indices kept, in order;
    None when every cell is distinct (all kept)."""
    uniq, last_rev = np.unique(cells[::-1], return_index=True)
    if len(uniq) == len(cells):
        return None
    return np.sort(len(cells) - 1 - last_rev)


def scatter(rows: int, ncols: int, flat: np.ndarray, values: np.ndarray) -> np.ndarray:
    """A frame's matrix: NaN (absent) but at the flat cell indices given."""
    matrix = nans(rows * ncols)  # (not np.full: its Python-level checks are most of a node's frame)
    matrix[flat] = values
    return matrix.reshape(rows, ncols)


class SharedArrays:
    """Equal arrays as one read-only object, while something holds it (a weak table by dtype and a 128-bit
    digest of the bytes): what only says how a request or a line is laid out is then one array for every
    template (protobuf) or shape (JSON) laid out alike, as a fleet's nodes mostly are."""

    def __init__(self) -> None:
        self._arrays: weakref.WeakValueDictionary[bytes, np.ndarray] = weakref.WeakValueDictionary()

    def share(self, array: np.ndarray) -> np.ndarray:
        """``array``, or the equal one already shared (read-only either way)."""
        key = array.dtype.str.encode() + xxhash.xxh3_128_digest(array.tobytes())
        found = self._arrays.get(key)
        if found is not None and found.shape == array.shape:
            return found
        array.flags.writeable = False
        self._arrays[key] = array
        return array


class PackedArrays:
    """Small arrays that live as long as a node's template, copied side by side into blocks of
    ``PACK_BLOCK_BYTES``, read-only.

    A template is built while its node's first requests are decoded, among the request's temporaries, on the
    thread that decodes: each of its own small arrays (its series' keys, 2.4 kB for 8 GPUs; its devices'
    descriptive sets) was a chunk of its own in that thread's malloc arena, between temporaries freed after it,
    and kept the pages it sat on resident whatever ``malloc_trim`` gave back around them. At 8,000 devices that
    arena held ~4,000 chunks in use among as many free ones (glibc's ``malloc_info``, and a walk of the arena's
    chunks against ``mincore``, from ``bench/bench_fleet_scale.py``'s probe): its resident set grew 14 MiB, 12 with
    the arrays packed (each view still has its shape in a 32-byte chunk of its own). Packed, a thousand nodes'
    arrays fill a few dozen blocks.

    A block is freed once no array in it is held: as nodes come and go, one template still held keeps its
    block (at most ``PACK_BLOCK_BYTES`` for each template kept, the worst case of a fleet whose nodes all
    changed but one in each block); templates are bounded in number and idle time (``Templates``)."""

    def __init__(self, block_bytes: int = PACK_BLOCK_BYTES, max_bytes: int = PACK_MAX_BYTES) -> None:
        self.block_bytes = block_bytes
        self.max_bytes = max_bytes
        self._block: np.ndarray | None = None
        self._used = 0

    def pack(self, array: np.ndarray) -> np.ndarray:
        """A read-only copy of ``array`` in the present block (``array`` itself, read-only, when it is empty or
        larger than ``max_bytes``)."""
        size = array.nbytes
        if size == 0 or size > self.max_bytes:
            array.flags.writeable = False
            return array
        start = -(-self._used // 16) * 16  # (each array 16-byte aligned, as malloc's would be)
        if self._block is None or start + size > self.block_bytes:
            self._block, start = np.empty(self.block_bytes, np.uint8), 0
        out = self._block[start : start + size].view(array.dtype).reshape(array.shape)
        out[...] = array
        out.flags.writeable = False
        self._used = start + size
        return out
