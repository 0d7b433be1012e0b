"""Replay input: OTLP JSON lines (the Collector ``file`` exporter's format) into Frames.

Each line is one ``ExportMetricsServiceRequest`` in the protobuf JSON mapping
(the Collector's file exporter format). A line becomes one :class:`~otel_dra.frame.Frame` per
(``k8s.node.name``, ``timeUnixNano``) it holds: devices as rows, the shared
:class:`~otel_dra.frame.Schema`'s columns as columns.

Why it is built the way it is: a recorded fleet is hundreds of thousands of points,
and nearly all of a line's bytes are attribute lists that repeat verbatim on every
line (identity plus descriptive attributes of each series). So before parsing, each
attribute list's text is swapped for a small integer token (one C-level regex split
and one dict lookup per list); ``json.loads`` then parses a line a sixth of the
size, and the walk maps (metric, token) to a cached (device, column) entry. Each
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
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

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
    Refusal,
    SeriesIndex,
    TableCache,
    Tally,
    last_wins,
    metric_problem,
    name,
    one_line,
    scatter,
    self_telemetry,
    series_keys,
    short,
    time_problem,
    unknown_problem,
    value_problem,
)
from otel_dra.decode.limits import DEFAULT_LIMITS, DecodeLimits
from otel_dra.frame import DeviceTable, Frame, Schema, attrs_of

#: Point-level problems reported per line; the rest are counted in one summary error.
MAX_POINT_ERRORS_PER_LINE: Final = 5
#: Metric-level notes (unknown metric, wrong kind) reported per line before summarising.
MAX_METRIC_ERRORS_PER_LINE: Final = 10
#: Distinct attribute lists cached before the caches are dropped (bounds memory on garbage).
MAX_CACHED_ATTRIBUTE_SETS: Final = 200_000
#: Entries kept in the per-node caches of entries each node may use (a cache only: past it they are dropped
#: and relearned point by point, which costs only speed).
MAX_NODE_ENTRIES: Final = 1_000_000

_ATTRS_KEY: Final = b'"attributes":'
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
    """A JSON ``attributes`` list (``[{"key": ..., "value": {...}}]``) as a dict; last key wins."""
    if type(items) is not list:
        raise _Malformed("attributes are not a list")
    out: dict[str, str] = {}
    for i, kv in enumerate(items, 1):
        key = kv.get("key") if type(kv) is dict else None
        if type(key) is not str:
            raise _Malformed(f"attribute {i} is not a key/value object")
        try:
            out[key] = _any_value_str(kv.get("value", {}))
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


class OtlpJsonDecoder(DecoderCore):
    """Decodes OTLP JSON request lines into Frames over a shared Schema.

    Keeps, per instance, the newest time decoded per series (node, device, column: older points are
    rejected: replay input is in time order per series) and caches keyed by attribute list, so
    one decoder should read one replay stream. ``max_future_ns`` (live input only: the
    receiver's JSON bodies) also rejects points further than that ahead of ``clock``, and
    forgets the series' times of nodes not seen for NODE_IDLE_NS; with ``clock_jump_ns``, a point that far
    behind its series is a clock jump, taken. What input may create is capped by
    ``limits`` (nodes, devices, series kinds, attribute lengths): past a cap points are refused and
    counted by reason (``DecodeResult.limited``).
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
        self._reset_caches()

    def _reset_caches(self) -> None:
        """Drop every cache keyed by attribute list (tokens are per instance, reset together)."""
        self._token_of_text: dict[bytes, bytes] = {}  # attribute list text -> b'"attributes":<token> '
        self._token_of_attrs: dict[tuple[tuple[str, str], ...] | str, int] = {}
        self._attrs_of_token: list[dict[str, str] | str] = []  # str: why the list is malformed
        self._entries: dict[str, dict[int, int]] = {}  # metric -> token -> entry (< 0: error index)
        self._entry_errors: list[str | Refusal] = []
        self._entry_dev: list[int] = []
        self._entry_col: list[int] = []
        self._entry_descr: list[int] = []  # index into the series index's descriptive sets, -1: none
        self._entry_stray: list[bool] = []  # its attributes include some not read (core.READ_ATTRIBUTES)
        # Each entry's device, column and series key (core.series_keys), as arrays.
        self._entry_np: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] = (
            np.empty(0, np.intp),
            np.empty(0, np.intp),
            np.empty(0, np.int64),
            np.empty(0, bool),
        )
        self._series = SeriesIndex(self.schema, self.limits)
        # node -> metric -> token -> entry, for the entries whose device the node has named (the caps let
        # it): what the per-point fast path reads, so it needs no check of its own.
        self._node_entries: dict[str, dict[str, dict[int, int]]] = {}  # (cleared with the entries they name)
        self._node_entry_count = 0
        self._frame_tables: dict[tuple[str, bytes], tuple[DeviceTable, np.ndarray, bool]] = {}
        self._tables = TableCache()
        self._floors.series.clear()  # keyed by the device indices dropped here

    # -- attribute lists ----------------------------------------------------------------
    def _token(self, attrs: dict[str, str] | str) -> int:
        """The token of an attribute set (or of the reason a list is malformed)."""
        key: tuple[tuple[str, str], ...] | str = attrs if isinstance(attrs, str) else attrs_of(attrs)
        token = self._token_of_attrs.get(key)
        if token is None:
            token = len(self._attrs_of_token)
            self._attrs_of_token.append(attrs)
            self._token_of_attrs[key] = token
        return token

    def _token_of_list(self, items: Any) -> int:
        try:
            return self._token(_attributes_of(items))
        except _Malformed as exc:
            return self._token(str(exc))

    def _tokenize(self, line: bytes) -> bytes | None:
        """The line with every attribute list replaced by its integer token, or None when the
        line needs the plain path.

        Sound because: a replaced text parsed on its own as a complete JSON array, so in the
        line it ends exactly there; the token ends in a space, so no digit or exponent after
        the list can run on into it. A match's second quote follows a letter, so it is a real
        delimiter and the match is a key with its value, never text inside a string. With
        the line in UTF-8, no ``\\u`` escape that could spell a key's letters (no other escape
        makes a letter) and every ``"attributes"`` in the result one of ours, every
        ``attributes`` key the parser sees holds a token, and every token sits where a list
        was. A line that is valid JSON stays valid with the same shape; one that isn't stays
        invalid.
        """
        if (b"\\" in line and _LETTER_ESCAPE.search(line)) or json.detect_encoding(line) not in _UTF8:
            return None
        parts = _ATTRS_LIST.split(line)
        texts = parts[1::2]
        known = self._token_of_text
        tokens = list(map(known.get, texts))
        if None in tokens:
            for i, text in enumerate(texts):
                if tokens[i] is None:
                    token = known.get(text)
                    if token is None:
                        try:
                            items = json.loads(text)
                        except (ValueError, RecursionError):
                            return None
                        if type(items) is not list:
                            return None
                        token = _ATTRS_KEY + str(self._token_of_list(items)).encode() + b" "
                        known[text] = token
                    tokens[i] = token
        parts[1::2] = tokens
        reduced = b"".join(parts)
        if reduced.count(b'"attributes"') != len(tokens):
            return None
        return reduced

    def _attrs_at(self, raw: Any, tokenized: bool) -> dict[str, str] | str:
        """The attributes of a resource or point: from its token, or read from its list."""
        if tokenized and type(raw) is int:
            return self._attrs_of_token[raw]
        if raw is None:
            return {}
        return self._attrs_of_token[self._token_of_list(raw)]

    # -- entries: (metric, attribute set) -> device and column -------------------------------
    def _entry(self, metric: str, token: int, devices: set[str]) -> int | Refusal:
        """The entry of a point of ``metric`` with attribute set ``token`` on a node that has named
        ``devices``: >= 0 an index into the entry tables; < 0 an error (``-1 - index`` into
        ``_entry_errors``); a device refused by a cap (not cached: another node may have room)."""
        attrs = self._attrs_of_token[token]
        entry = self._make_entry(metric, attrs, devices)
        if not isinstance(entry, Refusal):
            self._entries[metric][token] = entry
        return entry

    def _make_entry(self, metric: str, attrs: dict[str, str] | str, devices: set[str]) -> int | Refusal:
        """A new entry for the core's target of (metric, attributes), or an error, or a device refused."""
        if isinstance(attrs, str):
            target: tuple[int, int, int] | str | Refusal = f"has malformed attributes: {attrs}"
        else:
            target = self._series.target(metric, attrs, lambda device: self._admit_device(devices, device))
        if isinstance(target, Refusal) and target.reason in _DEVICE_REASONS:
            return target
        if isinstance(target, str | Refusal):
            self._entry_errors.append(target)
            return -len(self._entry_errors)
        dev, col, descr = target
        assert not isinstance(attrs, str)  # (a malformed list has no target)
        self._entry_stray.append(not attrs.keys() <= READ_ATTRIBUTES.get(metric, NOT_COLUMN_ATTRS))
        self._entry_dev.append(dev)
        self._entry_col.append(col)
        self._entry_descr.append(descr)
        return len(self._entry_dev) - 1

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
            for node in [n for n in self._node_entries if n not in self._floors.devices]:
                del self._node_entries[node]
        if max(len(self._attrs_of_token), len(self._token_of_text)) > MAX_CACHED_ATTRIBUTE_SETS:
            self._reset_caches()
        log = _LineLog(lineno)
        doc, tokenized, problem = self._parse(text)
        line = _Line(log, [], [], [], [], [], {}, {}, {}, Tally())
        if problem is None:
            try:
                problem = self._walk(doc, tokenized, line)
            except RecursionError:  # pragma: no cover - the parser refuses deeper nesting first
                problem = "is nested too deeply"
        if problem is not None:
            self.lines_skipped += 1
            error = DecodeError(lineno, one_line(f"{problem}; line skipped"))
            return DecodeResult([], errors=(error,), invalid=error.message)
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

    def _walk(self, doc: Any, tokenized: bool, line: _Line) -> str | None:
        """Read the request into ``line``; a string says why the whole line is skipped."""
        if type(doc) is not dict:
            return f"is a JSON {type(doc).__name__}, not an ExportMetricsServiceRequest object"
        resources = doc.get("resourceMetrics")
        if resources is None:
            return "has no resourceMetrics"
        if type(resources) is not list:
            return "has resourceMetrics that is not a list"
        nodes: list[str] = []
        for i, rm in enumerate(resources, 1):
            resource = rm.get("resource") if type(rm) is dict else None
            attrs = self._attrs_at(resource.get("attributes"), tokenized) if type(resource) is dict else {}
            if isinstance(attrs, str):
                return f"resource {i} has malformed attributes: {attrs}"
            node = attrs.get(NODE)
            if not node:
                return f"resource {i} has no {NODE}"
            nodes.append(node)
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
                    # otel-dra's own telemetry (an agent's verdicts, its push queue's metrics): not input, not a
                    # rejection; counted apart.
                    if type(metric) is dict and self_telemetry(metric.get("name"), from_agent):
                        line.ignored += _point_count(metric)
                        continue
                    if devices is None:
                        assert refused is not None  # what _admit_node says
                        self._refused_metric(metric, node, refused, line)
                    else:
                        self._metric(metric, node, devices, tokenized, line)
        return None

    def _refused_metric(self, metric: Any, node: str, refused: Refusal, line: _Line) -> None:
        """A metric of a node the caps refuse: its points counted as refused (as the protobuf decoder
        counts a section's points: every data point, whatever its metric)."""
        n = _point_count(metric)
        line.points += n
        line.skipped += n
        if n:
            line.tally.add(refused, node, n)

    def _metric(self, metric: Any, node: str, devices: set[str], tokenized: bool, line: _Line) -> None:
        """One metric's points into the line's scratch lists."""
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
        entries = self._entries.get(metric_name)
        if entries is None:
            entries = self._entries[metric_name] = {}
        node_entries = self._node_entries.get(node)
        if node_entries is None:
            node_entries = self._node_entries[node] = {}
        admitted = node_entries.get(metric_name)
        if admitted is None:
            admitted = node_entries[metric_name] = {}
        times = line.times.get(node)
        if times is None:
            times = line.times[node] = {}
        # The fast path reads the common case: cached entry, cached time, a plain number.
        # Anything else (first sight, or a problem) goes through _slow_point.
        fast_entries = admitted if tokenized else {}
        add_entry, add_slot, add_value = line.entries.append, line.slots.append, line.values.append
        for i, point in enumerate(points):
            try:
                entry = fast_entries[point["attributes"]]
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
            problem = self._slow_point(
                point, metric_name, counter, node, entries, admitted, devices, times, tokenized, line
            )
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
        entries: dict[int, int],
        admitted: dict[int, int],
        devices: set[str],
        times: dict[str, int],
        tokenized: bool,
        line: _Line,
    ) -> str | None:
        """A point off the fast path: fill the caches, keep it, or say what is wrong with it (a cap's
        refusal: its reason, counted in the line's tally)."""
        if type(point) is not dict:
            return "is not an object"
        raw = point.get("attributes")
        if tokenized and type(raw) is int:
            token = raw
        elif raw is None or type(raw) is list:
            token = self._token_of_list(raw or [])
        else:
            return "has attributes that are not a list"
        found: int | Refusal | None = entries.get(token)
        if found is None:
            found = self._entry(metric, token, devices)
        if isinstance(found, Refusal):
            line.tally.add(found, node)
            return found.reason
        entry = found
        if entry < 0:
            error = self._entry_errors[-1 - entry]
            if isinstance(error, Refusal):
                # Cached from any node: a series kind refused is so only once its device fits this node.
                reused = self._reuse(devices, error)
                assert isinstance(reused, Refusal)  # a refusal: the device's or the one cached
                line.tally.add(reused, node)
                return reused.reason
            return error
        if token not in admitted:
            dev_name = self._series.dev_names[self._entry_dev[entry]]
            refused = self._admit_device(devices, dev_name)
            if refused is not None:
                line.tally.add(refused, node)
                return refused.reason
            if self._node_entry_count >= MAX_NODE_ENTRIES:
                for cache in self._node_entries.values():
                    cache.clear()  # (the dicts stay: callers hold them)
                self._node_entry_count = 0
            admitted[token] = entry
            self._node_entry_count += 1
        device = self._series.device(self._entry_dev[entry])
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
        if len(self._entry_np[0]) != len(self._entry_dev):
            dev, col = np.asarray(self._entry_dev, np.intp), np.asarray(self._entry_col, np.intp)
            self._entry_np = (dev, col, series_keys(dev, col), np.asarray(self._entry_stray, bool))
        entry_dev, entry_col, entry_key, entry_stray = self._entry_np
        entries = np.asarray(line.entries, np.intp)
        line.stray = int(np.count_nonzero(entry_stray[entries]))
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
            keys = entry_key[e]
            times = np.full(len(e), t, np.uint64)
            ok, floors, places = self._order(node, keys, times, earliest=t)
            if ok is not None:
                self._older(line, node, t, e[~ok], floors[~ok])
                assert places is not None  # (looked up: some point was older)
                e, v, keys, times, places = e[ok], v[ok], keys[ok], times[ok], places[ok]
                if not len(e):
                    continue
            self._take(node, keys, times, places, t)
            unique = np.unique(e)
            table, devs, distinct = self._table(node, unique)
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
            device = self._series.device(self._entry_dev[entry])
            metric = columns[self._entry_col[entry]].metric
            line.log.point(f"a point of {metric} ({device}) {time_problem(node, t, int(floor), None, 0)}")
        line.log.hidden += len(entries) - shown

    def _table(self, node: str, unique_entries: np.ndarray) -> tuple[DeviceTable, np.ndarray, bool]:
        """The device table for a frame holding these entries, its devices' indices (sorted),
        and whether the entries all land on distinct cells. Equal tables are one object,
        so consumers can cache per table."""
        key = (node, unique_entries.tobytes())
        found = self._frame_tables.get(key)
        if found is not None:
            return found
        ents = unique_entries.tolist()
        devs = sorted({self._entry_dev[x] for x in ents})
        attrs: dict[int, dict[str, str]] = {d: {} for d in devs}
        descrs = self._series.descrs
        for x in ents:  # entries in creation order: a newer attribute set overrides an older one
            descr = self._entry_descr[x]
            if descr >= 0:
                attrs[self._entry_dev[x]].update(descrs[descr])
        names = self._series.dev_names
        table = self._tables.table(node, tuple(names[d] for d in devs), tuple(attrs[d] for d in devs))
        cells = {(self._entry_dev[x], self._entry_col[x]) for x in ents}
        found = (table, np.asarray(devs, np.intp), len(cells) == len(ents))
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
                    if line.strip():
                        yield path, lineno, line
            except (OSError, EOFError, zlib.error) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
                raise InputFileError(one_line(f"{path}: cannot read after line {lineno}: {reason}")) from exc
