"""The JSON decoder's line cache: what it keeps of the lines read so that a node's next line (the same
attribute lists, new times and values) looks no attribute list up. A line is tokenized (each attribute list's
text swapped for its position: :func:`tokenize`); its lists, in order, are its shape (:class:`Shape`), which
says each position's entry (:class:`Entries`: the (metric, attribute set) it names, as numbers); the shapes
kept are :class:`Shapes`, and each frame's device table, found by the entries it holds, :class:`FrameTables`.
All of it is a cache: dropped together, it is relearned from the next lines."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Container
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import xxhash

from otel_dra.decode.assembly import SharedArrays
from otel_dra.decode.caps import Refusal
from otel_dra.frame import DeviceTable

if TYPE_CHECKING:
    from otel_dra.decode.json_line import Line

#: Line shapes kept, in all, per node, and their attribute lists in all (4 bytes each); least recently used go.
MAX_SHAPES: Final = 100_000
MAX_SHAPES_PER_NODE: Final = 4
#: Attribute lists' texts known to be JSON arrays kept (a digest each: ~100 bytes) before they are checked anew.
MAX_ARRAYS: Final = 500_000
MAX_SHAPE_POSITIONS: Final = 16_000_000
#: Device tables kept by the entries they hold (one per node and shape, more while devices come and go).
MAX_FRAME_TABLES: Final = 50_000

_ATTRS_KEY: Final = b'"attributes":'
#: ``"attributes":<n> ``: the token of the n-th attribute list of a line (grown as lines need).
_POSITIONS: list[bytes] = []
#: A position whose entry is not known (a line of a new shape, or a device the caps refused).
UNKNOWN_ENTRY: Final = -(1 << 31)
#: The entries of a metric not read through its line's shape: none.
NO_ENTRIES: Final[dict[int, int]] = {}
# An attribute list up to its first "]": enough for string-valued lists (the normal case).
# A capture that is not a whole JSON array (a "]" inside a value, nested arrays) fails its
# one-time validation and sends the line down the plain path.
_ATTRS_LIST: Final = re.compile(rb'"attributes":[ \t\n\r]*(\[[^\]]*\])')
# \u0061..\u007a: an escaped lowercase letter, the only way a key could spell "attributes" unseen.
_LETTER_ESCAPE: Final = re.compile(rb"\\u00[67]")
_UTF8: Final = ("utf-8", "utf-8-sig")  # json.loads also reads UTF-16/32, which the regex can't see into


class Entries:
    """Every (metric, attribute set) a point was read with: its device, column and descriptive set (the
    series index's), and whether it carries attributes not read, as arrays (11 bytes an entry: a column is
    int16 while the schema's columns fit, int32 past them; grown by a quarter when full, the growth left
    untouched, so it is not resident until used); and what is wrong with those that have no target (an
    entry < 0 is ``-1 - index`` into ``errors``)."""

    def __init__(self) -> None:
        self.n = 0
        self.dev = np.empty(1024, np.int32)
        self.col = np.empty(1024, np.int16)  # (int32 once a column needs it: COL_MAX)
        self.descr = np.empty(1024, np.int32)  # -1: none
        self.stray = np.empty(1024, bool)
        self.errors: list[str | Refusal] = []

    def __len__(self) -> int:
        return self.n + len(self.errors)

    def add(self, dev: int, col: int, descr: int, stray: bool) -> int:
        n = self.n
        if n == len(self.dev):
            self.dev, self.col, self.descr, self.stray = (
                _grown(a, n, n + n // 4) for a in (self.dev, self.col, self.descr, self.stray)
            )
        if col > COL_MAX and self.col.dtype != np.int32:
            self.col = self.col.astype(np.int32)
        self.dev[n], self.col[n], self.descr[n], self.stray[n] = dev, col, descr, stray
        self.n = n + 1
        return n

    def error(self, error: str | Refusal) -> int:
        self.errors.append(error)
        return -len(self.errors)


#: The largest column an int16 entry holds (a schema of more columns makes the entries' columns int32), and
#: the most series a node may have for its places in its floors to be int16.
COL_MAX: Final = int(np.iinfo(np.int16).max)


def _grown(a: np.ndarray, n: int, size: int) -> np.ndarray:
    """``a``'s first ``n`` values in an array of ``size``: the rest is not written, so while unused it costs
    no memory (pages an allocation never touched are not resident), unlike a concatenation's copy of it."""
    out = np.empty(size, a.dtype)
    out[:n] = a[:n]
    return out


def packed(learned: list[int]) -> tuple[np.ndarray, int]:
    """A shape's entries by position, and the base they are offsets from (-1: none, int32 as they are): int16
    offsets when every position is an entry or UNKNOWN_ENTRY and the entries span less than int16 holds."""
    entries = np.asarray(learned, np.int32)
    known = entries >= 0
    if known.any() and (known | (entries == UNKNOWN_ENTRY)).all():
        base = int(entries[known].min())
        if int(entries[known].max()) - base <= COL_MAX:
            return np.where(known, entries - base, -1).astype(np.int16), base
    return entries, -1


@dataclass(slots=True)
class Shape:
    """A line already read, by the sequence of its attribute lists' text (one XXH3-128 digest of them
    all): each list's entry, by its position in the line, so a line of the same shape (a node's next
    export: the same series, new times and values) looks no attribute list up. Its metrics, in order:
    each one's name and the positions of its points' lists (``lo`` to ``hi``): a point is read through
    the shape only where its metric and position are those the shape was made with. What only says how
    the line is laid out (names, spans) is one object for every shape laid out alike."""

    #: Per position an entry (>= 0), an error (< 0) or UNKNOWN_ENTRY: int32, or (:func:`packed`) int16 offsets
    #: from ``base`` with -1 for UNKNOWN_ENTRY, as a node's entries are made together (two bytes a position).
    entries: np.ndarray
    names: tuple[str | None, ...]  # each metric's name, in the line's order
    lo: np.ndarray  # int32 per metric: its points' first position
    hi: np.ndarray  # ... and one past the last
    resources: dict[int, dict[str, str] | str]  # position -> a resource's attributes
    admitted: tuple[tuple[str, int], ...]  # each node it names and that node's admission (NodeFloors.generation)
    base: int = -1  # what ``entries`` are offsets from (-1: they are the entries themselves)
    #: Whether its lines' points are found by the split that templates are made by (json_templates): False once one
    #: was not (a point's fields in another order, an exemplar's time), so its lines are not split again for one.
    splits: bool = True

    def positions(self) -> list[int]:
        """Each position's entry (error, UNKNOWN_ENTRY), as the walk reads them."""
        if self.base < 0:
            return self.entries.tolist()
        at = self.entries.astype(np.int32)
        return np.where(at >= 0, at + self.base, UNKNOWN_ENTRY).tolist()


class Shapes:
    """The shapes kept (each node's last few; in all, bounded by count and by positions), least recently used
    first. What only says how a line is laid out (metric names, spans) is one object for shapes alike."""

    def __init__(self) -> None:
        self._shapes: dict[bytes, Shape] = {}  # least recently used first
        self._node_shapes: dict[str, list[bytes]] = {}  # each node's shapes, least recently used first
        self._positions = 0
        self._shared = SharedArrays()
        self._names: dict[tuple[str | None, ...], tuple[str | None, ...]] = {}
        #: Attribute lists' texts (their digests) found to be JSON arrays (a line of a new shape, such as a Collector's
        #: batch of another mix of nodes, holds the same lists as lines before, each checked once).
        self.arrays: set[bytes] = set()

    @staticmethod
    def key(texts: list[bytes]) -> bytes:
        """A line's shape's key: one digest of its attribute lists' text (no list holds a NUL byte: JSON
        text can't, and a list that isn't JSON never makes a shape)."""
        return xxhash.xxh3_128_digest(b"\0".join(texts))

    def find(self, texts: list[bytes]) -> Shape | None:
        return self._shapes.get(self.key(texts))

    def learn(self, line: Line, nodes: list[str], generation: dict[str, int]) -> Shape:
        """Keep the shape of a line read without one (each node keeps its last few; ``generation``: each
        admitted node's admission, which the shape stands by); returns it."""
        assert line.texts is not None and line.learned is not None
        key = self.key(line.texts)
        admitted = tuple((node, generation.get(node, -1)) for node in dict.fromkeys(nodes))
        names = tuple(line.names)
        names = self._names.setdefault(names, names)
        if len(self._names) > MAX_SHAPES:
            self._names.clear()
        entries, base = packed(line.learned)
        share = self._shared.share
        lo, hi = share(np.asarray(line.lo, np.int32)), share(np.asarray(line.hi, np.int32))
        shape = Shape(entries, names, lo, hi, line.resources, admitted, base)
        old = self._shapes.pop(key, None)
        if old is not None:
            self._positions -= len(old.entries)
        self._shapes[key] = shape
        self._positions += len(shape.entries)
        for node, _ in admitted:
            kept = self._node_shapes.setdefault(node, [])
            if key in kept:
                kept.remove(key)
            kept.append(key)
            while len(kept) > MAX_SHAPES_PER_NODE:
                self._drop(kept.pop(0))
        while self._shapes and (self._positions > MAX_SHAPE_POSITIONS or len(self._shapes) > MAX_SHAPES):
            self._drop(next(iter(self._shapes)))
        return shape

    def _drop(self, key: bytes) -> None:
        shape = self._shapes.pop(key, None)
        if shape is not None:
            self._positions -= len(shape.entries)

    @staticmethod
    def valid(shape: Shape, generation: dict[str, int]) -> bool:
        """Whether a shape still stands: each of its nodes admitted as it was (not forgotten since)."""
        return all(generation.get(node, -1) == admitted for node, admitted in shape.admitted)

    def forget_nodes(self, known: Container[str]) -> None:
        """Drop the shapes of nodes no longer ``known`` (live input: forgotten, idle too long)."""
        for node in [n for n in self._node_shapes if n not in known]:
            for key in self._node_shapes.pop(node):
                self._drop(key)


#: A frame's device table (see :meth:`FrameTables.get`) and what goes with it.
FrameTable = tuple[DeviceTable, np.ndarray, bool, list[Any]]


class FrameTables:
    """Each frame's device table by the entries it holds (node and a digest of them): equal tables are one
    object, so consumers can cache per table, and a node sending the same points finds its own at once."""

    def __init__(self) -> None:
        self._found: dict[tuple[str, bytes], FrameTable] = {}

    def get(
        self,
        node: str,
        unique_entries: np.ndarray,
        entries: Entries,
        device_table: Callable[[str, list[int], list[list[int]]], DeviceTable],
    ) -> FrameTable:
        """The device table for a frame holding these entries (made with ``device_table``: the decoder's),
        its devices' indices (sorted), whether the entries all land on distinct cells, and a place for the
        frame's maker to keep where their series are."""
        key = (node, xxhash.xxh3_128_digest(unique_entries.astype(np.int64, copy=False).tobytes()))
        found = self._found.get(key)
        if found is not None:
            return found
        ents = unique_entries.tolist()
        dev_of = entries.dev[unique_entries].tolist()
        descr_of = entries.descr[unique_entries].tolist()
        col_of = entries.col[unique_entries].tolist()
        devs = sorted(set(dev_of))
        sets: dict[int, list[int]] = {d: [] for d in devs}
        for dev, descr in zip(dev_of, descr_of, strict=True):  # entries in creation order: the newer set wins
            if descr >= 0:
                sets[dev].append(descr)
        table = device_table(node, devs, [sets[d] for d in devs])
        cells = set(zip(dev_of, col_of, strict=True))
        found = (table, np.asarray(devs, np.intp), len(cells) == len(ents), [None, None, None, -1])
        if len(self._found) >= MAX_FRAME_TABLES:
            self._found.clear()
        self._found[key] = found
        return found


def tokenize(line: bytes, shapes: Shapes) -> tuple[bytes, list[bytes], Shape | None, list[Any] | None] | None:
    """The line with every attribute list replaced by its position in the line, its lists' texts, its shape
    when a line of the same shape was read before (else its lists parsed); None when the line needs the
    plain path.

    Sound because: a replaced text parsed on its own as a complete JSON array (checked when its shape
    was first read: a shape is the exact bytes of every list), so in the line it ends exactly there; the
    token ends in a space, so no digit or exponent after the list can run on into it. A match's second
    quote follows a letter, so it is a real delimiter and the match is a key with its value, never text
    inside a string. With the line in UTF-8, no ``\\u`` escape that could spell a key's letters (no other
    escape makes a letter) and every ``"attributes"`` in the result one of ours, every ``attributes`` key
    the parser sees holds a token, and every token sits where a list was. A line that is valid JSON
    stays valid with the same shape; one that isn't stays invalid.
    """
    if (b"\\" in line and _LETTER_ESCAPE.search(line)) or json.detect_encoding(line) not in _UTF8:
        return None
    parts = _ATTRS_LIST.split(line)
    texts = parts[1::2]
    shape = shapes.find(texts)
    items: list[Any] | None = None
    if shape is None:
        items = []
        arrays = shapes.arrays
        for text in texts:  # each list a JSON array, or the plain path says what is wrong
            digest = xxhash.xxh3_128_digest(text)
            if digest in arrays:  # (a list checked before, in a line of another shape: read when it is asked for)
                items.append(None)
                continue
            try:
                parsed = json.loads(text)
            except (ValueError, RecursionError):
                return None
            if type(parsed) is not list:
                return None
            items.append(parsed)
            if len(arrays) >= MAX_ARRAYS:
                arrays.clear()
            arrays.add(digest)
    if len(_POSITIONS) < len(texts):
        _POSITIONS.extend(_ATTRS_KEY + str(i).encode() + b" " for i in range(len(_POSITIONS), 2 * len(texts)))
    parts[1::2] = _POSITIONS[: len(texts)]
    reduced = b"".join(parts)
    if reduced.count(b'"attributes"') != len(texts):
        return None
    return reduced, texts, shape, items
