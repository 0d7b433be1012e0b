"""Replay input: OTLP JSON lines (the Collector ``file`` exporter's format) into Frames.

Each line is one ``ExportMetricsServiceRequest`` in the protobuf JSON mapping
(the Collector's file exporter format). A line becomes one :class:`~otel_dra.frame.Frame` per
(``k8s.node.name``, ``timeUnixNano``) it holds: devices as rows, the shared
:class:`~otel_dra.frame.Schema`'s columns as columns.

Why it is built the way it is: a recorded fleet is hundreds of thousands of points,
and nearly all of a line's bytes are attribute lists that repeat verbatim on every
line (identity plus descriptive attributes of each series). So before parsing, each
attribute list's text is swapped for its position in the line (one C-level regex split);
``json.loads`` then parses a line a sixth of the size. A node's next line has the same lists
in the same order (its *shape*, one digest of them all), so the walk reads each point's
(device, column) entry off the shape by position; a line of a new shape reads each list once
and becomes a shape. Nothing is kept per attribute list but numbers: no text, no dict per
series (what a device costs in a replay: a few hundred bytes, not a copy of its lists). Each
frame's matrix is filled with one numpy scatter. Anything unusual about a line (a
``\\u`` escape that could spell a key, a list the regex can't delimit, UTF-16) sends it
down the plain path: parse the whole text and read each attribute list, slower but
the same result.

Bad input never raises: a line that can't be read as a request is skipped with one
:class:`DecodeError`; a bad point is skipped alone, reported (a few per line, the
rest counted).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import time
import weakref
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import xxhash

from otel_dra import conventions as cv
from otel_dra.decode import limits as lim
from otel_dra.decode.core import (
    JSON_DIALECT,
    LIMITED,
    MAX_PROBLEMS_PER_REQUEST,
    NODE,
    NOT_COLUMN_ATTRS,
    READ_ATTRIBUTES,
    UNKNOWN,
    DecodeError,
    DecoderCore,
    DecodeResult,
    DescriptiveMaps,
    Refusal,
    SeriesIndex,
    TableCache,
    Tally,
    intern,
    last_wins,
    metric_problem,
    name,
    one_line,
    scatter,
    self_telemetry,
    series_keys,
    short,
    time_problem,
    uniform_times,
    unknown_problem,
    value_problem,
)
from otel_dra.decode.limits import DEFAULT_LIMITS, DecodeLimits
from otel_dra.frame import DeviceTable, Frame, Schema

#: Point-level problems reported per line; the rest are counted in one summary error.
MAX_POINT_ERRORS_PER_LINE: Final = 5
#: Metric-level notes (unknown metric, wrong kind) reported per line before summarising.
MAX_METRIC_ERRORS_PER_LINE: Final = 10
#: Devices and descriptive attribute sets indexed before everything is dropped and relearned (bounds memory on
#: garbage: the series index, the entries, the shapes and the time floors that refer to them).
MAX_CACHED_ATTRIBUTE_SETS: Final = 200_000
#: Entries (a (metric, attribute list) each, 11 bytes) kept before they and the shapes naming them are dropped
#: and relearned (a cache only: lines of new shapes make new entries).
MAX_ENTRIES: Final = 4_000_000
#: Line shapes kept, in all, per node, and their attribute lists in all (4 bytes each); least recently used go.
MAX_SHAPES: Final = 100_000
MAX_SHAPES_PER_NODE: Final = 4
MAX_SHAPE_POSITIONS: Final = 16_000_000
#: Device tables kept by the entries they hold (one per node and shape, more while devices come and go).
MAX_FRAME_TABLES: Final = 50_000

_ATTRS_KEY: Final = b'"attributes":'
#: ``"attributes":<n> ``: the token of the n-th attribute list of a line (grown as lines need).
_POSITIONS: list[bytes] = []
#: A position whose entry is not known (a line of a new shape, or a device the caps refused).
_UNKNOWN: Final = -(1 << 31)
#: The entries of a metric not read through its line's shape: none.
_NO_ENTRIES: Final[dict[int, int]] = {}
# An attribute list up to its first "]": enough for string-valued lists (the normal case).
# A capture that is not a whole JSON array (a "]" inside a value, nested arrays) fails its
# one-time validation and sends the line down the plain path.
_ATTRS_LIST: Final = re.compile(rb'"attributes":[ \t\n\r]*(\[[^\]]*\])')
# \u0061..\u007a: an escaped lowercase letter, the only way a key could spell "attributes" unseen.
_LETTER_ESCAPE: Final = re.compile(rb"\\u00[67]")
_UTF8: Final = ("utf-8", "utf-8-sig")  # json.loads also reads UTF-16/32, which the regex can't see into
_DELTA: Final = frozenset({1, "AGGREGATION_TEMPORALITY_DELTA"})
_MAX_TIME: Final = 1 << 64
_KINDS: Final = ("gauge", "sum", "histogram", "exponentialHistogram", "summary")
_DEVICE_REASONS: Final = frozenset({lim.DEVICES, lim.DEVICES_PER_NODE})


class InputFileError(OSError):
    """An input file that can't be opened or read (missing, unreadable, corrupt gzip).

    Its message is one line naming the file; the CLI turns it into exit code 2.
    """


class _Malformed(Exception):
    """Internal: a part of the request that doesn't have the JSON mapping's shape."""


class _LineLog:
    """The errors of one line, capped so a garbage line can't flood the output."""

    def __init__(self, lineno: int) -> None:
        self.lineno = lineno
        self.limit_errors: list[DecodeError] = []  # one per cap reason, first: they say what many points share
        self.metric_errors: list[DecodeError] = []
        self.point_errors: list[DecodeError] = []
        self.hidden = 0

    def metric(self, message: str) -> None:
        if len(self.metric_errors) < MAX_METRIC_ERRORS_PER_LINE:
            self.metric_errors.append(DecodeError(self.lineno, one_line(message)))
        else:
            self.hidden += 1

    def point(self, message: str) -> None:
        if len(self.point_errors) < MAX_POINT_ERRORS_PER_LINE:
            self.point_errors.append(DecodeError(self.lineno, one_line(message)))
        else:
            self.hidden += 1

    def errors(self) -> list[DecodeError]:
        out = self.limit_errors + self.metric_errors + self.point_errors
        if self.hidden:
            out.append(DecodeError(self.lineno, f"{self.hidden:,} more problems on this line not shown"))
        return out


def _any_value_str(value: Any) -> str:
    """An attribute's ``AnyValue`` as the string the columnar model keeps."""
    if type(value) is not dict:
        raise _Malformed("is not an AnyValue object")
    if not value:
        return ""
    if len(value) != 1:
        raise _Malformed(f"has several values ({', '.join(name(k) for k in sorted(value))})")
    ((kind, v),) = value.items()
    if kind == "stringValue" and type(v) is str:
        return v
    if kind == "boolValue" and type(v) is bool:
        return "true" if v else "false"
    try:
        if kind == "intValue" and (type(v) is int or (type(v) is str and v.isascii())):
            return str(int(v))
        if kind == "doubleValue" and type(v) in (int, float, str):
            return repr(float(v))
        if kind == "bytesValue" and type(v) is str:
            return v
        if kind in ("arrayValue", "kvlistValue") and type(v) is dict:
            return json.dumps(v, sort_keys=True, separators=(",", ":"))
    except (ValueError, OverflowError, RecursionError):
        pass
    raise _Malformed(f"has a malformed {name(kind)}")


def _attributes_of(items: Any) -> dict[str, str]:
    """A JSON ``attributes`` list (``[{"key": ..., "value": {...}}]``) as a dict; last key wins. Values are
    interned (core.intern)."""
    if type(items) is not list:
        raise _Malformed("attributes are not a list")
    out: dict[str, str] = {}
    for i, kv in enumerate(items, 1):
        key = kv.get("key") if type(kv) is dict else None
        if type(key) is not str:
            raise _Malformed(f"attribute {i} is not a key/value object")
        try:
            out[key] = intern(key, _any_value_str(kv.get("value", {})))
        except _Malformed as exc:
            raise _Malformed(f"attribute {name(key)} {exc}") from None
    return out


def _point_count(metric: Any) -> int:
    """The data points of a metric read only to be counted (0 when it has no list of them)."""
    body = None
    if type(metric) is dict:
        for kind in _KINDS:
            body = metric.get(kind)
            if body is not None:
                break
    points = body.get("dataPoints", []) if type(body) is dict else None
    return len(points) if type(points) is list else 0


def _to_time(ts: Any) -> int:
    """``timeUnixNano`` (a decimal string in the JSON mapping, or an int) as nanoseconds."""
    if type(ts) is str and ts.isascii() and ts.isdigit():
        if len(ts) > 20:  # past 2**64, and int() refuses very long digit strings
            raise _Malformed(f"has timeUnixNano {short(ts)}, out of range")
        t = int(ts)
    elif type(ts) is int:
        t = ts
    elif ts is None:
        raise _Malformed("has no timeUnixNano")
    else:
        raise _Malformed(f"has timeUnixNano {short(ts)}, not an integer")
    if not 0 < t < _MAX_TIME:
        raise _Malformed(f"has timeUnixNano {short(t)}, out of range")
    return t


def _to_value(point: dict[str, Any]) -> tuple[str, float | None]:
    """The point's ``asDouble`` or ``asInt`` as a float and the field it came from (None: neither);
    JSON's own ways to be no number at all are refused here, the rest is the core's."""
    raw = point.get("asDouble")
    field = "asDouble"
    if raw is None:
        raw, field = point.get("asInt"), "asInt"
    if raw is None:
        return field, None
    if type(raw) not in (float, int, str):
        raise _Malformed(f"has {field} {short(raw)}, not a number")
    try:
        value = float(raw)
    except (ValueError, OverflowError):
        raise _Malformed(f"has {field} {short(raw)}, not a number") from None
    if math.isinf(value) and type(raw) is str and raw.strip().lstrip("+-").lower() not in ("inf", "infinity"):
        raise _Malformed(f"has {field} {short(raw)}, out of range")
    return field, value


class _Entries:
    """Every (metric, attribute set) a point was read with: its device, column and descriptive set (the
    series index's), and whether it carries attributes not read, as arrays (11 bytes an entry: a column is
    int16 while the schema's columns fit, int32 past them; grown by a quarter when full, the growth left
    untouched, so it is not resident until used); and what is wrong with those that have no target (an
    entry < 0 is ``-1 - index`` into ``errors``)."""

    def __init__(self) -> None:
        self.n = 0
        self.dev = np.empty(1024, np.int32)
        self.col = np.empty(1024, np.int16)  # (int32 once a column needs it: _COL_MAX)
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
        if col > _COL_MAX and self.col.dtype != np.int32:
            self.col = self.col.astype(np.int32)
        self.dev[n], self.col[n], self.descr[n], self.stray[n] = dev, col, descr, stray
        self.n = n + 1
        return n

    def error(self, error: str | Refusal) -> int:
        self.errors.append(error)
        return -len(self.errors)


#: The largest column an int16 entry holds (a schema of more columns makes the entries' columns int32), and
#: the most series a node may have for its places in its floors to be int16.
_COL_MAX: Final = int(np.iinfo(np.int16).max)


def _grown(a: np.ndarray, n: int, size: int) -> np.ndarray:
    """``a``'s first ``n`` values in an array of ``size``: the rest is not written, so while unused it costs
    no memory (pages an allocation never touched are not resident), unlike a concatenation's copy of it."""
    out = np.empty(size, a.dtype)
    out[:n] = a[:n]
    return out


def _packed(learned: list[int]) -> tuple[np.ndarray, int]:
    """A shape's entries by position, and the base they are offsets from (-1: none, int32 as they are): int16
    offsets when every position is an entry or _UNKNOWN and the entries span less than int16 holds."""
    entries = np.asarray(learned, np.int32)
    known = entries >= 0
    if known.any() and (known | (entries == _UNKNOWN)).all():
        base = int(entries[known].min())
        if int(entries[known].max()) - base <= _COL_MAX:
            return np.where(known, entries - base, -1).astype(np.int16), base
    return entries, -1


@dataclass(slots=True)
class _Shape:
    """A line already read, by the sequence of its attribute lists' text (one XXH3-128 digest of them
    all): each list's entry, by its position in the line, so a line of the same shape (a node's next
    export: the same series, new times and values) looks no attribute list up. Its metrics, in order:
    each one's name and the positions of its points' lists (``lo`` to ``hi``): a point is read through
    the shape only where its metric and position are those the shape was made with. What only says how
    the line is laid out (names, spans) is one object for every shape laid out alike."""

    #: Per position an entry (>= 0), an error (< 0) or _UNKNOWN: int32, or (:func:`_packed`) int16 offsets
    #: from ``base`` with -1 for _UNKNOWN, as a node's entries are made together (two bytes a position).
    entries: np.ndarray
    names: tuple[str | None, ...]  # each metric's name, in the line's order
    lo: np.ndarray  # int32 per metric: its points' first position
    hi: np.ndarray  # ... and one past the last
    resources: dict[int, dict[str, str] | str]  # position -> a resource's attributes
    admitted: tuple[tuple[str, int], ...]  # each node it names and that node's admission (NodeFloors.generation)
    base: int = -1  # what ``entries`` are offsets from (-1: they are the entries themselves)

    def positions(self) -> list[int]:
        """Each position's entry (error, _UNKNOWN), as the walk reads them."""
        if self.base < 0:
            return self.entries.tolist()
        at = self.entries.astype(np.int32)
        return np.where(at >= 0, at + self.base, _UNKNOWN).tolist()


@dataclass
class _Line:
    """Per-line scratch of :meth:`OtlpJsonDecoder.decode_line`."""

    log: _LineLog
    entries: list[int]
    slots: list[int]
    values: list[float]
    slot_node: list[str]
    slot_time: list[int]
    slot_of: dict[tuple[str, int], int]
    unknown: dict[str, int]  # unknown metric name -> points skipped
    times: dict[str, dict[str, int]]  # node -> timeUnixNano text -> slot (-1: older than the node's newest)
    tally: Tally  # points refused by the caps
    points: int = 0
    skipped: int = 0
    ignored: int = 0  # points of otel-dra's own telemetry, set aside (core.self_telemetry)
    stray: int = 0  # points with attributes not read (core.READ_ATTRIBUTES)
    # A tokenized line: its attribute lists' text by position, and what is known of each position.
    texts: list[bytes] | None = None
    items: list[Any] | None = None  # ... parsed (a line of a new shape: each was checked to be a JSON array)
    shape: _Shape | None = None  # the line's shape, when one was read before
    ents: list[int] = field(default_factory=list)  # each position's entry (the shape's; _UNKNOWN without)
    attrs: dict[int, dict[str, str] | str] = field(default_factory=dict)  # positions' attributes, as read
    metric: int = 0  # the metric being read, counted in the line's order
    # What a line read without a shape learns, for the shape made of it (None: none is made).
    learned: list[int] | None = None
    names: list[str | None] = field(default_factory=list)
    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)
    resources: dict[int, dict[str, str] | str] = field(default_factory=dict)


class OtlpJsonDecoder(DecoderCore):
    """Decodes OTLP JSON request lines into Frames over a shared Schema.

    Keeps, per instance, the newest time decoded per series (node, device, column: older points are
    rejected: replay input is in time order per series) and the shapes of the lines read (each node's
    last few: :class:`_Shape`), so one decoder should read one replay stream. ``max_future_ns`` (live input
    only: the receiver's JSON bodies) also rejects points further than that ahead of ``clock``, and
    forgets the series' times of nodes not seen for NODE_IDLE_NS; with ``clock_jump_ns``, a point that far
    behind its series is a clock jump, taken. What input may create is capped by
    ``limits`` (nodes, devices, series kinds, attribute lengths): past a cap points are refused and
    counted by reason (``DecodeResult.limited``).

    What a line's shape costs is a few bytes per attribute list (its entry), and what an entry costs is
    11 bytes: a replay of 10,000 devices holds no text of their attribute lists, no dict of them per
    series, nothing per series but numbers.
    """

    def __init__(
        self,
        schema: Schema,
        *,
        max_future_ns: int | None = None,
        clock: Callable[[], int] = time.time_ns,
        limits: DecodeLimits = DEFAULT_LIMITS,
        clock_jump_ns: int | None = None,
    ) -> None:
        super().__init__(schema, max_future_ns, clock, limits, clock_jump_ns)
        self.lines = 0
        self.lines_skipped = 0
        self.points = 0
        self.points_skipped = 0
        self.points_ignored = 0  # otel-dra's own telemetry, set aside
        self._texts: list[bytes] | None = None  # the line being decoded: its attribute lists (_tokenize) ...
        self._shape: _Shape | None = None  # ... and its shape, when one was read before
        self._items: list[Any] | None = None  # ... or, without one, its lists parsed
        self._reset_caches()

    def _reset_caches(self) -> None:
        """Drop everything that indexes devices: the series index, the entries, the shapes, the tables."""
        self._series = SeriesIndex(self.schema, self.limits)
        self._maps = DescriptiveMaps(self._series)
        self._tables = TableCache()
        self._floors.series.clear()  # keyed by the device indices dropped here
        self._reset_entries()

    def _reset_entries(self) -> None:
        """Drop the entries and what refers to them (shapes, frame tables): relearned from the next lines."""
        self._entries = _Entries()
        self._shapes: dict[bytes, _Shape] = {}  # least recently used first
        self._node_shapes: dict[str, list[bytes]] = {}  # each node's shapes, least recently used first
        self._shape_positions = 0
        self._shared: weakref.WeakValueDictionary[bytes, np.ndarray] = weakref.WeakValueDictionary()
        self._names: dict[tuple[str | None, ...], tuple[str | None, ...]] = {}
        self._frame_tables: dict[tuple[str, bytes], tuple[DeviceTable, np.ndarray, bool, list[Any]]] = {}

    # -- attribute lists ----------------------------------------------------------------
    def _tokenize(self, line: bytes) -> bytes | None:
        """The line with every attribute list replaced by its position in the line, or None when the line
        needs the plain path. Sets the line's texts and, when a line of the same shape was read before, its
        shape (``_texts``, ``_shape``), which the walk reads.

        Sound because: a replaced text parsed on its own as a complete JSON array (checked when its shape
        was first read: a shape is the exact bytes of every list), so in the line it ends exactly there; the
        token ends in a space, so no digit or exponent after the list can run on into it. A match's second
        quote follows a letter, so it is a real delimiter and the match is a key with its value, never text
        inside a string. With the line in UTF-8, no ``\\u`` escape that could spell a key's letters (no other
        escape makes a letter) and every ``"attributes"`` in the result one of ours, every ``attributes`` key
        the parser sees holds a token, and every token sits where a list was. A line that is valid JSON
        stays valid with the same shape; one that isn't stays invalid.
        """
        self._texts, self._shape, self._items = None, None, None
        if (b"\\" in line and _LETTER_ESCAPE.search(line)) or json.detect_encoding(line) not in _UTF8:
            return None
        parts = _ATTRS_LIST.split(line)
        texts = parts[1::2]
        # (no list holds a NUL byte: JSON text can't, and a list that isn't JSON never makes a shape)
        shape = self._shapes.get(xxhash.xxh3_128_digest(b"\0".join(texts)))
        items: list[Any] | None = None
        if shape is None:
            items = []
            for text in texts:  # each list a JSON array, or the plain path says what is wrong
                try:
                    parsed = json.loads(text)
                except (ValueError, RecursionError):
                    return None
                if type(parsed) is not list:
                    return None
                items.append(parsed)
        if len(_POSITIONS) < len(texts):
            _POSITIONS.extend(_ATTRS_KEY + str(i).encode() + b" " for i in range(len(_POSITIONS), 2 * len(texts)))
        parts[1::2] = _POSITIONS[: len(texts)]
        reduced = b"".join(parts)
        if reduced.count(b'"attributes"') != len(texts):
            return None
        self._texts, self._shape, self._items = texts, shape, items
        return reduced

    def _attrs_at(self, raw: Any, line: _Line) -> dict[str, str] | str:
        """The attributes of a resource or point: from its list's position in a tokenized line (read once
        per line), or read from its list."""
        if line.texts is not None and type(raw) is int:
            found = line.attrs.get(raw)
            if found is None:
                items = line.items[raw] if line.items is not None else json.loads(line.texts[raw])
                found = line.attrs[raw] = self._attrs_of_list(items)
            return found
        if raw is None:
            return {}
        return self._attrs_of_list(raw)

    @staticmethod
    def _attrs_of_list(items: Any) -> dict[str, str] | str:
        """A JSON attribute list as a dict, or why it is malformed (a string)."""
        try:
            return _attributes_of(items)
        except _Malformed as exc:
            return str(exc)

    # -- entries: (metric, attribute set) -> device and column -------------------------------
    def _make_entry(self, metric: str, attrs: dict[str, str] | str, devices: set[str]) -> int | Refusal:
        """A new entry for the core's target of (metric, attributes), or an error, or a device refused."""
        if isinstance(attrs, str):
            target: tuple[int, int, int] | str | Refusal = f"has malformed attributes: {attrs}"
        else:
            target = self._series.target(metric, attrs, lambda device: self._admit_device(devices, device))
        if isinstance(target, Refusal) and target.reason in _DEVICE_REASONS:
            return target
        if isinstance(target, str | Refusal):
            return self._entries.error(target)
        dev, col, descr = target
        assert not isinstance(attrs, str)  # (a malformed list has no target)
        return self._entries.add(dev, col, descr, not attrs.keys() <= READ_ATTRIBUTES.get(metric, NOT_COLUMN_ATTRS))

    # -- shapes ------------------------------------------------------------------------------
    def _share(self, values: list[int]) -> np.ndarray:
        """``values`` as an int32 array, or the equal one a shape already holds (read-only either way)."""
        array = np.asarray(values, np.int32)
        key = xxhash.xxh3_128_digest(array.tobytes())
        found = self._shared.get(key)
        if found is not None and len(found) == len(array):
            return found
        array.flags.writeable = False
        self._shared[key] = array
        return array

    def _learn(self, line: _Line, nodes: list[str]) -> None:
        """Keep the shape of a line read without one (each node keeps its last few)."""
        assert line.texts is not None and line.learned is not None
        key = xxhash.xxh3_128_digest(b"\0".join(line.texts))
        generation = self._floors.generation
        admitted = tuple((node, generation.get(node, -1)) for node in dict.fromkeys(nodes))
        names = tuple(line.names)
        names = self._names.setdefault(names, names)
        if len(self._names) > MAX_SHAPES:
            self._names.clear()
        entries, base = _packed(line.learned)
        shape = _Shape(entries, names, self._share(line.lo), self._share(line.hi), line.resources, admitted, base)
        old = self._shapes.pop(key, None)
        if old is not None:
            self._shape_positions -= len(old.entries)
        self._shapes[key] = shape
        self._shape_positions += len(shape.entries)
        for node, _ in admitted:
            kept = self._node_shapes.setdefault(node, [])
            if key in kept:
                kept.remove(key)
            kept.append(key)
            while len(kept) > MAX_SHAPES_PER_NODE:
                self._drop_shape(kept.pop(0))
        while self._shapes and (self._shape_positions > MAX_SHAPE_POSITIONS or len(self._shapes) > MAX_SHAPES):
            self._drop_shape(next(iter(self._shapes)))

    def _drop_shape(self, key: bytes) -> None:
        shape = self._shapes.pop(key, None)
        if shape is not None:
            self._shape_positions -= len(shape.entries)

    def _valid(self, shape: _Shape) -> bool:
        """Whether a shape still stands: each of its nodes admitted as it was (not forgotten since)."""
        generation = self._floors.generation
        return all(generation.get(node, -1) == admitted for node, admitted in shape.admitted)

    def _forget_nodes(self) -> None:
        """Drop the shapes of nodes forgotten (live input: idle too long)."""
        for node in [n for n in self._node_shapes if n not in self._floors.devices]:
            for key in self._node_shapes.pop(node):
                self._drop_shape(key)

    # -- the line --------------------------------------------------------------------------
    def decode_line(self, text: str | bytes, lineno: int) -> tuple[list[Frame], list[DecodeError]]:
        """One request line into its frames (one per node and time) and its problems."""
        result = self.decode(text, lineno)
        return result.frames, list(result.errors)

    def decode(
        self, text: str | bytes, lineno: int = 0, *, speaker: Callable[[str], bool] | None = None
    ) -> DecodeResult:
        """One request (a replay line, a JSON body) into the core's result: frames, counts, problems;
        ``invalid`` says why a request that can't be used as a whole was skipped. ``speaker``: whether
        its client may report for a node (None: for any; the core's node admission asks it)."""
        self._speaker = speaker
        self.lines += 1
        now = self._tick()
        # Replay stays deterministic: it forgets nothing by the clock.
        if self.max_future_ns is not None and self._floors.due(now):
            self._floors.forget_idle(now)
            self._forget_nodes()
        if self._series.size > MAX_CACHED_ATTRIBUTE_SETS:
            self._reset_caches()
        elif len(self._entries) > MAX_ENTRIES:
            self._reset_entries()
        log = _LineLog(lineno)
        doc, tokenized, problem = self._parse(text)
        line = _Line(log, [], [], [], [], [], {}, {}, {}, Tally())
        if tokenized:
            texts, shape = self._texts, self._shape
            assert texts is not None  # (what _tokenize read)
            line.texts, line.items = texts, self._items
            if shape is not None and self._valid(shape):
                line.shape, line.ents = shape, shape.positions()
            else:
                line.ents = [_UNKNOWN] * len(texts)
                line.learned = list(line.ents)
        self._texts, self._shape, self._items = None, None, None
        nodes: list[str] = []
        if problem is None:
            try:
                problem = self._walk(doc, line, nodes)
            except RecursionError:  # pragma: no cover - the parser refuses deeper nesting first
                problem = "is nested too deeply"
        if problem is not None:
            self.lines_skipped += 1
            error = DecodeError(lineno, one_line(f"{problem}; line skipped"))
            return DecodeResult([], errors=(error,), invalid=error.message)
        if line.learned is not None:
            self._learn(line, nodes)
        for metric, n in line.unknown.items():
            log.metric(unknown_problem(JSON_DIALECT, metric, n))
        log.limit_errors = [DecodeError(lineno, one_line(text)) for text in line.tally.lines(self.limits)]
        frames = self._frames(line)  # (first: it judges time order per series, as arrays)
        self._advance_series()
        self.points += line.points
        self.points_skipped += line.skipped
        self.points_ignored += line.ignored
        errors = tuple(log.errors())
        # The log already counts what it cuts (its last entry), so the message quotes and counts no more.
        quoted = tuple(e.message for e in errors[:MAX_PROBLEMS_PER_REQUEST])
        limited = line.tally.limited()
        return DecodeResult(
            frames,
            line.points,
            line.skipped,
            quoted,
            len(quoted),
            errors,
            limited=limited,
            ignored=line.ignored,
            clock_jumps=self._clock_jumps(),
            stray=line.stray,
        )

    def _parse(self, text: str | bytes) -> tuple[Any, bool, str | None]:
        """The parsed request and whether its attribute lists are tokens; or why it can't be read."""
        raw: bytes | None
        if isinstance(text, str):
            try:
                raw = text.encode()
            except UnicodeEncodeError:
                raw = None
        else:
            raw = bytes(text)
        reduced = None if raw is None else self._tokenize(raw)
        if reduced is not None:
            try:
                return json.loads(reduced), True, None
            except (ValueError, RecursionError):
                pass  # the original is as broken: parse it below for the exact message
        try:
            return json.loads(text if raw is None else raw), False, None
        except UnicodeDecodeError as exc:
            return None, False, f"is not UTF-8 text ({exc.reason} at byte {exc.start})"
        except json.JSONDecodeError as exc:
            return None, False, f"is not JSON ({exc.msg} at column {exc.colno})"
        except (ValueError, RecursionError) as exc:
            return None, False, f"is not JSON ({exc})"

    def _resource_attrs(self, raw: Any, line: _Line) -> dict[str, str] | str:
        """A resource's attributes: its shape's, or read (and kept for the shape being learned)."""
        if line.texts is not None and type(raw) is int:
            if line.shape is not None:
                found = line.shape.resources.get(raw)
                if found is not None:
                    return found
            attrs = self._attrs_at(raw, line)
            if line.learned is not None:
                line.resources[raw] = attrs
            return attrs
        return self._attrs_at(raw, line)

    def _walk(self, doc: Any, line: _Line, nodes: list[str]) -> str | None:
        """Read the request into ``line`` (its nodes into ``nodes``); a string says why the whole line is
        skipped."""
        if type(doc) is not dict:
            return f"is a JSON {type(doc).__name__}, not an ExportMetricsServiceRequest object"
        resources = doc.get("resourceMetrics")
        if resources is None:
            return "has no resourceMetrics"
        if type(resources) is not list:
            return "has resourceMetrics that is not a list"
        for i, rm in enumerate(resources, 1):
            resource = rm.get("resource") if type(rm) is dict else None
            attrs = self._resource_attrs(resource.get("attributes"), line) if type(resource) is dict else {}
            if isinstance(attrs, str):
                return f"resource {i} has malformed attributes: {attrs}"
            node = attrs.get(NODE)
            if not node:
                return f"resource {i} has no {NODE}"
            nodes.append(node)
        learning = line.learned is not None
        for rm, node in zip(resources, nodes, strict=True):
            devices, refused = self._admit_node(node)
            scopes = rm.get("scopeMetrics", [])
            if type(scopes) is not list:
                line.log.metric(f"scopeMetrics of node {name(node)} is not a list; skipped")
                continue
            for scope in scopes:
                metrics = scope.get("metrics", []) if type(scope) is dict else None
                if type(metrics) is not list:
                    line.log.metric(f"a scope of node {name(node)} has metrics that are not a list; skipped")
                    continue
                info = scope.get("scope")
                from_agent = type(info) is dict and info.get("name") == cv.AGENT_SCOPE
                for metric in metrics:
                    k = line.metric  # (each metric counted, in the line's order, whatever becomes of it)
                    line.metric += 1
                    if learning:
                        metric_name = metric.get("name") if type(metric) is dict else None
                        line.names.append(metric_name if type(metric_name) is str else None)
                        line.lo.append(0)
                        line.hi.append(0)
                    # otel-dra's own telemetry (an agent's verdicts, its push queue's metrics): not input, not a
                    # rejection; counted apart.
                    if type(metric) is dict and self_telemetry(metric.get("name"), from_agent):
                        line.ignored += _point_count(metric)
                        continue
                    if devices is None:
                        assert refused is not None  # what _admit_node says
                        self._refused_metric(metric, node, refused, line)
                    else:
                        self._metric(metric, node, devices, line, k)
        return None

    def _refused_metric(self, metric: Any, node: str, refused: Refusal, line: _Line) -> None:
        """A metric of a node the caps refuse: its points counted as refused (as the protobuf decoder
        counts a section's points: every data point, whatever its metric)."""
        n = _point_count(metric)
        line.points += n
        line.skipped += n
        if n:
            line.tally.add(refused, node, n)

    def _metric(self, metric: Any, node: str, devices: set[str], line: _Line, k: int) -> None:
        """One metric's points (the line's ``k``-th metric) into the line's scratch lists."""
        log = line.log
        if type(metric) is not dict:
            log.metric(f"a metric of node {name(node)} is not an object; skipped")
            return
        metric_name = metric.get("name")
        body: Any = None  # any JSON value
        kind: str | None = None
        for kind in _KINDS:
            body = metric.get(kind)
            if body is not None:
                break
        points = body.get("dataPoints", []) if type(body) is dict else None
        n = len(points) if type(points) is list else 0
        line.points += n
        sum_body = kind == "sum" and type(body) is dict
        temporality = body.get("aggregationTemporality") if sum_body else None
        problem = metric_problem(
            JSON_DIALECT,
            metric_name if type(metric_name) is str else None,
            None if body is None else kind,
            n,
            node,
            delta=type(temporality) in (int, str) and temporality in _DELTA,
            points_listed=type(points) is list,
        )
        if problem is not None:
            line.skipped += n
            if problem is UNKNOWN:
                assert type(metric_name) is str  # UNKNOWN is a named metric's problem
                line.unknown[metric_name] = line.unknown.get(metric_name, 0) + n
            else:
                log.metric(problem)
            return
        assert type(points) is list and type(metric_name) is str  # what metric_problem checked
        counter = sum_body and body.get("isMonotonic") is True
        times = line.times.get(node)
        if times is None:
            times = line.times[node] = {}
        # Read through the line's shape when this metric is the one the shape has here, its points' lists where
        # the shape had them: its first and last point at the first and last position it had (the points'
        # lists come in the points' order, so every one of them is in between).
        shape = line.shape
        ents: list[int] | dict[int, int] = _NO_ENTRIES
        if shape is not None:
            if k < len(shape.names) and shape.names[k] == metric_name and points:
                lo, hi = int(shape.lo[k]), int(shape.hi[k])
                first, last = points[0], points[-1]
                first = first.get("attributes") if type(first) is dict else None
                last = last.get("attributes") if type(last) is dict else None
                if type(first) is int and type(last) is int and first == lo and last == hi - 1:
                    ents = line.ents
        elif line.learned is not None:
            at = [p["attributes"] for p in points if type(p) is dict and type(p.get("attributes")) is int]
            if at:
                line.lo[k], line.hi[k] = at[0], at[-1] + 1
        # The fast path reads the common case: a known entry, cached time, a plain number.
        # Anything else (a line of a new shape, or a problem) goes through _slow_point.
        cached = ents is line.ents
        add_entry, add_slot, add_value = line.entries.append, line.slots.append, line.values.append
        for i, point in enumerate(points):
            try:
                at = point["attributes"]
                entry = ents[at] if at.__class__ is int else _UNKNOWN
                slot = times[point["timeUnixNano"]]
                value = point.get("asDouble")
                if value is None:
                    value = point["asInt"]
                if value.__class__ is not float:
                    if value.__class__ is str or value.__class__ is int:
                        value = float(value)
                    else:
                        raise TypeError
                if entry >= 0 and slot >= 0 and value - value == 0.0 and not (counter and value < 0.0):
                    add_entry(entry)
                    add_slot(slot)
                    add_value(value)
                    continue
            except (KeyError, TypeError, ValueError, OverflowError, AttributeError):
                pass
            problem = self._slow_point(point, metric_name, counter, node, devices, times, line, cached)
            if problem is not None:
                line.skipped += 1
                if problem not in LIMITED:  # the caps' refusals are counted in one line each
                    log.point(f"point {i + 1} of {metric_name} {problem}")

    def _slow_point(
        self,
        point: Any,
        metric: str,
        counter: bool,
        node: str,
        devices: set[str],
        times: dict[str, int],
        line: _Line,
        cached: bool,
    ) -> str | None:
        """A point off the fast path: find its entry (its list's position's in the line's shape, when
        ``cached``: its metric is read through the shape; or a new one), keep it, or say what is wrong with it
        (a cap's refusal: its reason, counted in the line's tally). A line without a shape learns each
        position's entry."""
        if type(point) is not dict:
            return "is not an object"
        raw = point.get("attributes")
        at = -1
        if line.texts is not None and type(raw) is int:
            at = raw
        elif not (raw is None or type(raw) is list):
            return "has attributes that are not a list"
        entry = line.ents[at] if cached and at >= 0 else _UNKNOWN
        if entry == _UNKNOWN:
            attrs = self._attrs_at(raw, line) if at >= 0 else self._attrs_of_list(raw or [])
            found = self._make_entry(metric, attrs, devices)
            if isinstance(found, Refusal):
                line.tally.add(found, node)
                return found.reason
            entry = found
        learned = line.learned if at >= 0 else None
        if entry < 0:
            if learned is not None:
                learned[at] = entry
            error = self._entries.errors[-1 - entry]
            if isinstance(error, Refusal):
                # Kept from any node: a series kind refused is so only once its device fits this node.
                reused = self._reuse(devices, error)
                assert isinstance(reused, Refusal)  # a refusal: the device's or the one kept
                line.tally.add(reused, node)
                return reused.reason
            return error
        dev = int(self._entries.dev[entry])
        refused = self._admit_device(devices, self._series.dev_names[dev])
        if refused is not None:
            line.tally.add(refused, node)
            return refused.reason
        if learned is not None:
            learned[at] = entry
        device = self._series.device(dev)
        try:
            t = _to_time(point.get("timeUnixNano"))
            field, value = _to_value(point)
        except _Malformed as exc:
            return f"({device}) {exc}"
        problem = value_problem(JSON_DIALECT, device, field, value, counter)
        if problem is not None:
            return problem
        assert value is not None  # what value_problem checked
        ts = point.get("timeUnixNano")
        problem = self._time_problem(node, t)  # the receiver's bound; time order per series: in _frames
        if problem is not None:
            if type(ts) is str:
                times[ts] = -1  # later points at this time go straight to the rejection
            return problem
        slot = line.slot_of.get((node, t))
        if slot is None:
            slot = line.slot_of[(node, t)] = len(line.slot_time)
            line.slot_node.append(node)
            line.slot_time.append(t)
        if type(ts) is str:
            times[ts] = slot
        line.entries.append(entry)
        line.slots.append(slot)
        line.values.append(value)
        return None

    # -- frames -------------------------------------------------------------------------------
    def _frames(self, line: _Line) -> list[Frame]:
        """The line's points as frames, one per (node, time), in time order."""
        if not line.values:
            return []
        known = self._entries
        entry_dev, entry_col = known.dev, known.col
        entries = np.asarray(line.entries, np.intp)
        line.stray = int(np.count_nonzero(known.stray[entries]))
        values = np.asarray(line.values, np.float64)
        slots = np.asarray(line.slots, np.intp) if len(line.slot_time) > 1 else None
        ncols = len(self.schema)
        frames: list[Frame] = []
        for s in sorted(range(len(line.slot_time)), key=line.slot_time.__getitem__):
            if slots is None:
                e, v = entries, values
            else:
                mask = slots == s
                if not mask.any():
                    continue
                e, v = entries[mask], values[mask]
            node, t = line.slot_node[s], line.slot_time[s]
            keys = series_keys(entry_dev[e], entry_col[e])
            times = uniform_times(t, len(e))  # (one number, however many points wait on it)
            # Where these series are in the node's floors, found once for a node sending the same points (the
            # frame's table keeps them): what waits for the node is then their places, not a copy of their keys
            # (int16 while the node has fewer series than that holds: two bytes a series).
            series = self._floors.of(node)
            unique = np.unique(e)
            table, devs, distinct, memo = self._table(node, unique)
            mark = xxhash.xxh3_128_digest(e.tobytes())
            places = memo[1] if memo[0] == mark and memo[2] is series and memo[3] == series.version else None
            if places is None and t >= series.newest:
                _, found = series.floors(keys)
                if (found >= 0).all():
                    places = found.astype(np.int16 if len(series.keys) <= _COL_MAX else np.int32)
                    memo[:] = [mark, places, series, series.version]
            ok, floors, places = self._order(node, keys, times, places=places, earliest=t)
            if ok is not None:
                self._older(line, node, t, e[~ok], floors[~ok])
                assert places is not None  # (looked up: some point was older)
                e, v, keys, times, places = e[ok], v[ok], keys[ok], times[ok], places[ok]
                if not len(e):
                    continue
                unique = np.unique(e)
                table, devs, distinct, _ = self._table(node, unique)
            self._take(node, keys, times, places, t)
            rows = np.searchsorted(devs, entry_dev[e])
            flat = rows * ncols + entry_col[e]
            keep = None if distinct and len(unique) == len(e) else last_wins(flat)
            if keep is not None:
                flat, v = flat[keep], v[keep]
            frames.append(self._frame(node, t, table, scatter(len(devs), ncols, flat, v)))
        return frames

    def _older(self, line: _Line, node: str, t: int, entries: np.ndarray, floors: np.ndarray) -> None:
        """Points older than what was read for their series: skipped, the first few in the line's log."""
        line.skipped += len(entries)
        shown = min(len(entries), MAX_POINT_ERRORS_PER_LINE)
        columns = self.schema.columns if shown else ()
        for entry, floor in zip(entries[:shown].tolist(), floors[:shown].tolist(), strict=True):
            device = self._series.device(int(self._entries.dev[entry]))
            metric = columns[int(self._entries.col[entry])].metric
            line.log.point(f"a point of {metric} ({device}) {time_problem(node, t, int(floor), None, 0)}")
        line.log.hidden += len(entries) - shown

    def _table(self, node: str, unique_entries: np.ndarray) -> tuple[DeviceTable, np.ndarray, bool, list[Any]]:
        """The device table for a frame holding these entries, its devices' indices (sorted),
        whether the entries all land on distinct cells, and a place for :meth:`_frames` to keep where their
        series are. Equal tables are one object, so consumers can cache per table."""
        key = (node, xxhash.xxh3_128_digest(unique_entries.astype(np.int64, copy=False).tobytes()))
        found = self._frame_tables.get(key)
        if found is not None:
            return found
        known = self._entries
        ents = unique_entries.tolist()
        dev_of = known.dev[unique_entries].tolist()
        descr_of = known.descr[unique_entries].tolist()
        col_of = known.col[unique_entries].tolist()
        devs = sorted(set(dev_of))
        sets: dict[int, list[int]] = {d: [] for d in devs}
        for dev, descr in zip(dev_of, descr_of, strict=True):  # entries in creation order: the newer set wins
            if descr >= 0:
                sets[dev].append(descr)
        names = self._series.dev_names
        attrs = tuple(self._maps.merged(sets[d]) for d in devs)
        table = self._tables.table(node, tuple(names[d] for d in devs), attrs)
        cells = set(zip(dev_of, col_of, strict=True))
        found = (table, np.asarray(devs, np.intp), len(cells) == len(ents), [None, None, None, -1])
        if len(self._frame_tables) >= MAX_FRAME_TABLES:
            self._frame_tables.clear()
        self._frame_tables[key] = found
        return found


def read_lines(paths: Iterable[Path]) -> Iterator[tuple[Path, int, bytes]]:
    """Each non-empty line of each file as (path, 1-based line number, raw bytes without the
    newline). Gzip is detected by its magic bytes, whatever the file is called.

    Raises :class:`InputFileError` (an ``OSError``) naming the file when it can't be opened
    or its gzip stream is corrupt or cut short; lines before the damage are yielded first.
    """
    for path in paths:
        path = Path(path)
        try:
            handle = path.open("rb")
        except OSError as exc:
            raise InputFileError(one_line(f"{path}: cannot open: {exc.strerror or exc}")) from exc
        lineno = 0
        with handle:
            try:
                stream = gzip.GzipFile(fileobj=handle) if handle.peek(2)[:2] == b"\x1f\x8b" else handle
                for lineno, raw in enumerate(stream, 1):
                    line = raw.rstrip(b"\r\n")
                    del raw  # (not held while the line is decoded: a line of a fleet's node is 300 kB)
                    if line.strip():
                        yield path, lineno, line
                    del line  # (nor while the next is read)
            except (OSError, EOFError, zlib.error) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
                raise InputFileError(one_line(f"{path}: cannot read after line {lineno}: {reason}")) from exc
