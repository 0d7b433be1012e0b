"""Replay input: OTLP JSON lines (the Collector ``file`` exporter's format) into Frames.

Each line is one ``ExportMetricsServiceRequest`` in the protobuf JSON mapping
(the Collector's file exporter format). A line becomes one :class:`~otel_dra.frame.Frame` per
(``k8s.node.name``, ``timeUnixNano``) it holds: devices as rows, the shared
:class:`~otel_dra.frame.Schema`'s columns as columns.

Why it is built the way it is: a recorded fleet is hundreds of thousands of points,
and nearly all of a line's bytes are attribute lists that repeat verbatim on every
line (identity plus descriptive attributes of each series). So before parsing, each
attribute list's text is swapped for its position in the line (one C-level regex split);
``orjson`` then parses a line a sixth of the size. A node's next line has the same lists
in the same order (its *shape*, one digest of them all), so the walk reads each point's
(device, column) entry off the shape by position; a line of a new shape reads each list once
and becomes a shape. A line whose walk took every point becomes a *template* of its shape
(:mod:`~otel_dra.decode.json_templates`): a next line that differs from it only in its points'
times and values is read off it, its numbers split out by one regex, nothing tokenized or parsed (a Collector's
batch of several nodes: each node's resource off its own template, whatever mix of nodes the batch holds).
Nothing is kept per attribute list but numbers: no text, no dict per series (what a device
costs in a replay: a few hundred bytes, not a copy of its lists). Each frame's matrix is
filled with one numpy scatter. Anything unusual about a line (a
``\\u`` escape that could spell a key, a list the regex can't delimit, UTF-16) sends it
down the plain path: parse the whole text and read each attribute list, slower but
the same result.

Bad input never raises: a line that can't be read as a request is skipped with one
:class:`DecodeError`; a bad point is skipped alone, reported (a few per line, the
rest counted).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import orjson
import xxhash

from otel_dra import conventions as cv
from otel_dra.classifier.numeric import all_of, any_of
from otel_dra.decode.assembly import last_wins, scatter
from otel_dra.decode.attributes import NODE, NOT_COLUMN_ATTRS, READ_ATTRIBUTES
from otel_dra.decode.caps import DEVICE_REASONS, LIMITED, Refusal
from otel_dra.decode.checks import UNKNOWN, metric_problem, self_telemetry, time_problem, value_problem
from otel_dra.decode.core import DecoderCore
from otel_dra.decode.floors import series_keys, uniform_times
from otel_dra.decode.json_line import MAX_POINT_ERRORS_PER_LINE, Line, LineLog
from otel_dra.decode.json_shapes import (
    COL_MAX,
    NO_ENTRIES,
    UNKNOWN_ENTRY,
    Entries,
    FrameTables,
    Shape,
    Shapes,
    tokenize,
)
from otel_dra.decode.json_templates import (
    Layout,
    Points,
    Template,
    Templates,
    make_template,
    points_of,
    resources_of,
)
from otel_dra.decode.json_values import (
    DELTA,
    KINDS,
    MAX_TIME,
    Malformed,
    attrs_of_list,
    point_count,
    to_time,
    to_value,
)
from otel_dra.decode.limits import DEFAULT_LIMITS, DecodeLimits
from otel_dra.decode.result import DecodeError, DecodeResult
from otel_dra.decode.text import JSON_DIALECT, name, one_line
from otel_dra.frame import Frame, Schema

#: Devices and descriptive attribute sets indexed before everything is dropped and relearned (bounds memory on
#: garbage: the series index, the entries, the shapes and the time floors that refer to them).
MAX_CACHED_ATTRIBUTE_SETS: Final = 200_000
#: A number of 19 digits or more outside a string, or what might be one (digits in a string after a space: json
#: reads the line then, the same values).
_LONG_NUMBER: Final = re.compile(rb"(?:^|[\[:,\s-])[0-9]{19}")
#: Entries found by their attribute list's text kept before they are dropped and found again (~120 bytes each).
MAX_ENTRIES_BY_LIST: Final = 500_000
#: Lines in a row read off no template after which only one line in PROBE_EVERY is split to look for one.
MISSES_BEFORE_PROBING: Final = 8
PROBE_EVERY: Final = 16
#: Entries (a (metric, attribute list) each, 11 bytes) kept before they and the shapes naming them are dropped
#: and relearned (a cache only: lines of new shapes make new entries).
MAX_ENTRIES: Final = 4_000_000


class OtlpJsonDecoder(DecoderCore):
    """Decodes OTLP JSON request lines into Frames over a shared Schema.

    Keeps, per instance, the newest time decoded per series (node, device, column: older points are
    rejected: replay input is in time order per series) and the shapes of the lines read (each node's
    last few: :class:`~otel_dra.decode.json_shapes.Shape`), so one decoder should read one replay stream.
    ``max_future_ns`` (live input only: the receiver's JSON bodies) also rejects points further than that
    ahead of ``clock``, and forgets the series' times of nodes not seen for NODE_IDLE_NS; with
    ``clock_jump_ns``, a point that far behind its series is a clock jump, taken. What input may create is capped by
    ``limits`` (nodes, devices, series kinds, attribute lengths): past a cap points are refused and
    counted by reason (``DecodeResult.limited``). ``templates``: read a line like one read before (a node's next
    export) off that line's template (:mod:`~otel_dra.decode.json_templates`; the same result, for tests to
    compare).

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
        templates: bool = True,
    ) -> None:
        super().__init__(schema, max_future_ns, clock, limits, clock_jump_ns)
        self.lines = 0
        self.lines_skipped = 0
        self.points = 0
        self.points_skipped = 0
        self.points_ignored = 0  # otel-dra's own telemetry, set aside
        #: Read lines like one read before off its template (json_templates); ``lines_templated`` of them were.
        self.templates = templates
        self.lines_templated = 0
        self._texts: list[bytes] | None = None  # the line being decoded: its attribute lists (_tokenize) ...
        self._shape: Shape | None = None  # ... and its shape, when one was read before
        self._items: list[Any] | None = None  # ... or, without one, its lists parsed
        self._missed = 0  # lines in a row not read off a template
        self._batched = False  # whether the last line split held several resources (a Collector's batch)
        self._reset_caches()

    def _reset_caches(self) -> None:
        """Drop everything that indexes devices: the core's index, and the entries and shapes over it."""
        self._reset_index()
        self._reset_entries()

    def _reset_entries(self) -> None:
        """Drop the entries and what refers to them (shapes, frame tables): relearned from the next lines."""
        self._entries = Entries()
        self._shapes = Shapes()
        self._templates = Templates()
        # (metric, digest of an attribute list) -> its entry's (device, column, descriptive set, stray)
        self._entry_of_list: dict[tuple[str, bytes], tuple[int, int, int, bool]] = {}
        self._frame_tables = FrameTables()

    def _tokenize(self, line: bytes) -> bytes | None:
        """The line tokenized (:func:`~otel_dra.decode.json_shapes.tokenize`), or None: the plain path. Sets
        its attribute lists' texts and its shape, or its lists parsed (``_texts``, ``_shape``, ``_items``),
        which the walk reads."""
        found = tokenize(line, self._shapes)
        if found is None:
            self._texts, self._shape, self._items = None, None, None
            return None
        reduced, self._texts, self._shape, self._items = found
        return reduced

    # -- entries: (metric, attribute set) -> device and column -------------------------------
    def _make_entry(self, metric: str, attrs: dict[str, str] | str, devices: set[str]) -> int | Refusal:
        """A new entry for the core's target of (metric, attributes), or an error, or a device refused."""
        if isinstance(attrs, str):
            target: tuple[int, int, int] | str | Refusal = f"has malformed attributes: {attrs}"
        else:
            target = self._series.target(metric, attrs, lambda device: self._admit_device(devices, device))
        if isinstance(target, Refusal) and target.reason in DEVICE_REASONS:
            return target
        if isinstance(target, str | Refusal):
            return self._entries.error(target)
        dev, col, descr = target
        assert not isinstance(attrs, str)  # (a malformed list has no target)
        return self._entries.add(dev, col, descr, not attrs.keys() <= READ_ATTRIBUTES.get(metric, NOT_COLUMN_ATTRS))

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
            self._shapes.forget_nodes(self._floors.devices)
            self._templates.forget_nodes(self._floors.devices)
        if self._series.size > MAX_CACHED_ATTRIBUTE_SETS:
            self._reset_caches()
        elif len(self._entries) > MAX_ENTRIES:
            self._reset_entries()
        log = LineLog(lineno)
        line = Line.new(log)
        raw = _utf8(text)
        # A line like one read before is read off its templates (json_templates): each of its resources' (a node's
        # export; a Collector's request holds several), the same bytes but its points' times and values. One split
        # of the line, nothing tokenized, nothing parsed.
        split = self._split(raw) if raw is not None and self.templates and self._probe() else None
        if split is not None and self._read_off_templates(split, line):
            self._missed = 0
            self.lines_templated += 1
            return self._result(line)
        self._missed += 1
        if line.parts or line.slot_of:  # (some resources were read off theirs: the walk starts over)
            line = Line.new(log)
        reduced = None if raw is None else self._tokenize(raw)
        shape = self._shape if reduced is not None else None
        if shape is not None and not Shapes.valid(shape, self._floors.generation):
            shape = None
        doc, tokenized, problem = self._parse(text, raw, reduced)
        if tokenized:
            texts = self._texts
            assert texts is not None  # (what _tokenize read)
            line.texts, line.items = texts, self._items
            if shape is not None:
                line.shape, line.ents = shape, shape.positions()
            else:
                line.ents = [UNKNOWN_ENTRY] * len(texts)
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
        read = line.shape if line.learned is None else self._shapes.learn(line, nodes, self._floors.generation)
        if read is not None and read.splits and raw is not None and self.templates:
            self._learn_templates(raw, read, line, nodes, split)
        return self._result(line)

    def _probe(self) -> bool:
        """Whether to split this line for a template: always while lines find theirs; past MISSES_BEFORE_PROBING
        lines in a row that did not, one line in PROBE_EVERY (a stream whose lines repeat none, such as a
        Collector's batches of changing nodes, does not pay for a split a line)."""
        return self._missed < MISSES_BEFORE_PROBING or self._missed % PROBE_EVERY == 0

    def _result(self, line: Line) -> DecodeResult:
        """The line read: its frames, and the decoder's counts moved on."""
        frames = self._frames(line)  # (first: it judges time order per series, as arrays)
        self._advance_series()
        self.points += line.points
        self.points_skipped += line.skipped
        self.points_ignored += line.ignored
        return line.result(frames, self.limits, self._clock_jumps())

    def _parse(self, text: str | bytes, raw: bytes | None, reduced: bytes | None) -> tuple[Any, bool, str | None]:
        """The parsed request (``raw``: its text as UTF-8, None where a str can't be; ``reduced``: tokenized, None
        where it could not be) and whether its attribute lists are tokens; or why it can't be read."""
        if reduced is not None:
            # orjson reads what json reads, as the same values, ~2.5x faster; what it refuses (JSON's
            # extensions json reads: NaN, Infinity, a lone surrogate) json reads, and a number of 19 digits or more
            # too (an integer past 64 bits orjson reads as a float, json as the int it is).
            if _LONG_NUMBER.search(reduced) is None:
                try:
                    return orjson.loads(reduced), True, None
                except orjson.JSONDecodeError:
                    pass
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

    # -- templates (json_templates): a line like one read before -----------------------------------------------
    def _templated(self, points: Points, template: Template, line: Line) -> bool:
        """Read a line off its template into ``line`` (True); or nothing done that the walk would not do alike
        (False: the walk reads it, and says what is wrong with it). Each node must be known and its client's to
        report for; each point's value finite, and not negative on a counter; the first point of each (node, time)
        checked as the walk's slow path checks it: its time in range and within the receiver's bound, its device
        admitted to its node."""
        floors = self._floors
        known = [floors.devices.get(node) for node in template.nodes]
        if any(devices is None for devices in known) or not all(map(self._may_speak, template.nodes)):
            return False
        values = points.values()
        if values is None:
            return False
        times = points.times
        v = np.asarray(values, np.float64)
        if not all_of(np.isfinite(v)) or any_of(v[template.counter] < 0.0):  # (not ndarray.all's Python wrapper)
            return False
        if template.single and times and times.count(times[0]) == len(times):
            first: dict[tuple[int, bytes], int] = {(0, times[0]): 0}  # (one node, one time: the usual line)
        else:
            first = {}
            for i, key in enumerate(zip(template.node.tolist(), times, strict=True)):
                first.setdefault(key, i)
        slot_of = line.slot_of
        slot_for: dict[tuple[int, bytes], int] = {}
        dev_names, entry_dev = self._series.dev_names, self._entries.dev
        for (resource, ts), i in first.items():
            node, t = template.nodes[resource], int(ts)
            if not 0 < t < MAX_TIME or time_problem(node, t, 0, self._ceiling, self.max_future_ns or 0) is not None:
                return False
            devices = known[resource]
            assert devices is not None  # (checked above)
            if self._admit_device(devices, dev_names[int(entry_dev[template.entries[i]])]) is not None:
                return False
            slot = slot_of.get((node, t))
            if slot is None:
                slot = slot_of[(node, t)] = len(line.slot_time)
                line.slot_node.append(node)
                line.slot_time.append(t)
            slot_for[(resource, ts)] = slot
        for node in template.nodes:
            self._admit_node(node)  # (known: only touched, as the walk does)
        if len(slot_for) == 1:
            line.parts.append((template, next(iter(slot_for.values())), None, v))
        elif slot_for:
            slots = [slot_for[key] for key in zip(template.node.tolist(), times, strict=True)]
            line.parts.append((template, -1, slots, v))
        line.points += len(values)
        return True

    def _split(self, raw: bytes) -> list[Points] | None:
        """The line's points by template: the whole line's (a node's own export) or, for a request of several
        resources laid out as the file exporter writes one (a Collector's batch of nodes,
        :func:`~otel_dra.decode.json_templates.resources_of`), each resource's; None where one can't be split (a NUL
        byte). The whole line's first while lines are a node's own: no look for where resources start."""
        whole = None
        if not self._batched:
            whole = points_of(raw)
            if whole is None or whole.key in self._templates:
                return None if whole is None else [whole]
        pieces = resources_of(raw)
        self._batched = pieces is not None and len(pieces) > 1
        if pieces is None or len(pieces) < 2:
            whole = whole or points_of(raw)
            return None if whole is None else [whole]
        split = [points_of(piece) for piece in pieces]
        return None if None in split else split  # type: ignore[return-value]

    def _read_off_templates(self, split: list[Points], line: Line) -> bool:
        """Read each piece of the line off its template into ``line`` (True), or False where one has none (or its
        values or times need the walk): the walk reads the line."""
        generation = self._floors.generation
        for points in split:
            template = self._templates.get(points.key, generation)
            if template is None or not self._templated(points, template, line):
                return False
        return True

    def _learn_templates(
        self, raw: bytes, shape: Shape, line: Line, nodes: list[str], split: list[Points] | None
    ) -> None:
        """Keep the templates of a line whose walk took every point, saying nothing: one a resource where the line
        is laid out as the file exporter writes one (each resource a JSON object on its own, as many as the walk
        read), else one of the whole line. A shape whose line's points the split does not find as the walk read
        them (their fields in another order, an exemplar's time) is marked: its lines are not split again."""
        if line.skipped or line.ignored or line.unknown or line.log.errors() or len(line.entries) != line.points:
            return
        if not nodes:  # (no resource: nothing to read off a template)
            return
        pieces = resources_of(raw)
        if pieces is None or len(pieces) < 2 or len(pieces) != len(nodes):  # (the whole line's: see _split)
            pieces, by_piece = [raw], [list(range(len(nodes)))]
        else:
            by_piece = [[r] for r in range(len(nodes))]
        if split is None or len(split) != len(pieces):
            split = [points_of(piece) for piece in pieces]  # type: ignore[misc]
        # Each resource's points, in the walk's order: its metrics' spans are contiguous, resource by resource.
        first = [0] * (len(nodes) + 1)
        for resource, _, count in line.spans:
            first[resource + 1] += count
        for r in range(len(nodes)):
            first[r + 1] += first[r]
        slot_time, generation = line.slot_time, self._floors.generation
        for piece, points, resources in zip(pieces, split, by_piece, strict=True):
            if points is None or self._templates.get(points.key, generation) is not None:
                continue
            lo, hi = first[resources[0]], first[resources[-1] + 1]
            values = points.values()
            if values is None:  # (a -0 the walk read as the parser's 0: a next line may have none)
                continue
            spans = [(r - resources[0], c, n) for r, c, n in line.spans if resources[0] <= r <= resources[-1]]
            template = make_template(
                piece, points, line.entries[lo:hi], spans, nodes[resources[0] : resources[-1] + 1], generation
            )
            # Each time and value the split found is the walk's point's, in its order (the split's texts are the
            # points), and a resource's piece is a JSON object on its own (the line is its resources side by side).
            if (
                template is None
                or values != line.values[lo:hi]
                or list(map(int, points.times)) != [slot_time[s] for s in line.slots[lo:hi]]
                or (len(pieces) > 1 and not _an_object(piece))
            ):
                shape.splits = False
                return
            self._templates.keep(points.key, template)

    def _walk(self, doc: Any, line: Line, nodes: list[str]) -> str | None:
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
            attrs = line.resource_attrs(resource.get("attributes")) if type(resource) is dict else {}
            if isinstance(attrs, str):
                return f"resource {i} has malformed attributes: {attrs}"
            node = attrs.get(NODE)
            if not node:
                return f"resource {i} has no {NODE}"
            nodes.append(node)
        learning = line.learned is not None
        for r, (rm, node) in enumerate(zip(resources, nodes, strict=True)):
            line.resource = r
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
                        line.ignored += point_count(metric)
                        continue
                    if devices is None:
                        assert refused is not None  # what _admit_node says
                        self._refused_metric(metric, node, refused, line)
                    else:
                        self._metric(metric, node, devices, line, k)
        return None

    def _refused_metric(self, metric: Any, node: str, refused: Refusal, line: Line) -> None:
        """A metric of a node the caps refuse: its points counted as refused (as the protobuf decoder
        counts a section's points: every data point, whatever its metric)."""
        n = point_count(metric)
        line.points += n
        line.skipped += n
        if n:
            line.tally.add(refused, node, n)

    def _metric(self, metric: Any, node: str, devices: set[str], line: Line, k: int) -> None:
        """One metric's points (the line's ``k``-th metric) into the line's scratch lists."""
        log = line.log
        if type(metric) is not dict:
            log.metric(f"a metric of node {name(node)} is not an object; skipped")
            return
        metric_name = metric.get("name")
        body: Any = None  # any JSON value
        kind: str | None = None
        for kind in KINDS:
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
            delta=type(temporality) in (int, str) and temporality in DELTA,
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
        line.spans.append((line.resource, counter, n))
        times = line.times.get(node)
        if times is None:
            times = line.times[node] = {}
        # Read through the line's shape when this metric is the one the shape has here, its points' lists where
        # the shape had them: its first and last point at the first and last position it had (the points'
        # lists come in the points' order, so every one of them is in between).
        shape = line.shape
        ents: list[int] | dict[int, int] = NO_ENTRIES
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
                entry = ents[at] if at.__class__ is int else UNKNOWN_ENTRY
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
        line: Line,
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
        entry = line.ents[at] if cached and at >= 0 else UNKNOWN_ENTRY
        if entry == UNKNOWN_ENTRY:
            # A list read before with this metric (another line's, of another shape: a Collector's batch of another
            # mix of nodes) names the same series: a new entry as that one's (entries are made in the line's order,
            # as reading it would make them: the newest descriptive set wins), its attributes not read again.
            key = None if at < 0 or line.texts is None else (metric, xxhash.xxh3_128_digest(line.texts[at]))
            known = None if key is None else self._entry_of_list.get(key)
            if known is not None:
                entry = self._entries.add(*known)
            else:
                attrs = line.attrs_at(raw) if at >= 0 else attrs_of_list(raw or [])
                found = self._make_entry(metric, attrs, devices)
                if isinstance(found, Refusal):
                    line.tally.add(found, node)
                    return found.reason
                entry = found
                if key is not None and entry >= 0:
                    if len(self._entry_of_list) >= MAX_ENTRIES_BY_LIST:
                        self._entry_of_list.clear()
                    entries = self._entries
                    self._entry_of_list[key] = (
                        int(entries.dev[entry]),
                        int(entries.col[entry]),
                        int(entries.descr[entry]),
                        bool(entries.stray[entry]),
                    )
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
            t = to_time(point.get("timeUnixNano"))
            field, value = to_value(point)
        except Malformed as exc:
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
    def _frames(self, line: Line) -> list[Frame]:
        """The line's points as frames, one per (node, time), in time order."""
        ncols = len(self.schema)
        parts = line.parts
        slots_of_parts = [slot for _, slot, _, _ in parts]
        if parts and min(slots_of_parts) >= 0 and len(set(slots_of_parts)) == len(parts):
            # Each template read one (node, time): its frame, laid out as the template's lines' are (worked out
            # once: only their values and times move).
            frames: list[Frame] = []
            stray = 0
            for template, s, _, v in sorted(parts, key=lambda part: (line.slot_time[part[1]], part[1])):
                lay = template.layouts.get(ncols)
                if lay is None:
                    lay = self._layout(line.slot_node[s], template.entries, ncols)
                    template.layouts.clear()  # (one schema width at a time: it only grows)
                    template.layouts[ncols] = lay
                stray += lay.stray
                frame = self._slot_frame(line, line.slot_node[s], line.slot_time[s], lay, v, ncols)
                if frame is not None:
                    frames.append(frame)
            line.stray = stray
            return frames
        if parts:  # (a node's points in two resources, or a template of several (node, time)s: as the walk's)
            line.entries = np.concatenate([template.entries for template, _, _, _ in parts])  # type: ignore[assignment]
            line.slots = np.concatenate(
                [np.full(len(v), s, np.intp) if s >= 0 else np.asarray(slots, np.intp) for _, s, slots, v in parts]
            )  # type: ignore[assignment]
            line.values = np.concatenate([v for _, _, _, v in parts])  # type: ignore[assignment]
        if not len(line.values):
            return []
        entries = np.asarray(line.entries, np.intp)
        line.stray = int(np.count_nonzero(self._entries.stray[entries]))
        values = np.asarray(line.values, np.float64)
        slots = np.asarray(line.slots, np.intp) if len(line.slot_time) > 1 else None
        frames = []
        for s in sorted(range(len(line.slot_time)), key=line.slot_time.__getitem__):
            if slots is None:
                e, v = entries, values
            else:
                mask = slots == s
                if not mask.any():
                    continue
                e, v = entries[mask], values[mask]
            node = line.slot_node[s]
            frame = self._slot_frame(line, node, line.slot_time[s], self._layout(node, e, ncols), v, ncols)
            if frame is not None:
                frames.append(frame)
        return frames

    def _slot_frame(self, line: Line, node: str, t: int, lay: Layout, v: np.ndarray, ncols: int) -> Frame | None:
        """The frame of ``node``'s points at ``t`` (laid out by ``lay``, their values ``v``): those not older than
        what was read for their series (None: none is)."""
        e, keys = lay.entries, lay.keys
        times = uniform_times(t, len(e))  # (one number, however many points wait on it)
        # Where these series are in the node's floors, found once for a node sending the same points (the
        # frame's table keeps them): what waits for the node is then their places, not a copy of their keys
        # (int16 while the node has fewer series than that holds: two bytes a series).
        series = self._floors.of(node)
        memo = lay.found[3]
        places = memo[1] if memo[0] == lay.mark and memo[2] is series and memo[3] == series.version else None
        if places is None and t >= series.newest:
            _, found = series.floors(keys)
            if (found >= 0).all():
                places = found.astype(np.int16 if len(series.keys) <= COL_MAX else np.int32)
                memo[:] = [lay.mark, places, series, series.version]
        ok, floors, places = self._order(node, keys, times, places=places, earliest=t)
        if ok is not None:
            self._older(line, node, t, e[~ok], floors[~ok])
            assert places is not None  # (looked up: some point was older)
            e, v, keys, times, places = e[ok], v[ok], keys[ok], times[ok], places[ok]
            if not len(e):
                return None
            lay = self._layout(node, e, ncols)
        self._take(node, keys, times, places, t)
        flat = lay.flat if lay.keep is None else lay.flat[lay.keep]
        if lay.keep is not None:
            v = v[lay.keep]
        return self._frame(node, t, lay.found[0], scatter(len(lay.found[1]), ncols, flat, v))

    def _layout(self, node: str, entries: np.ndarray, ncols: int) -> Layout:
        """What a frame of ``node`` holding these entries (in the line's order; a template's own array, not a copy)
        is laid out by: its series' keys, its device table, each point's cell in its matrix (int32 where the matrix
        fits: a template keeps its layout) and which points a later one for the same cell overrides."""
        known = self._entries
        dev, col = known.dev[entries], known.col[entries]
        unique = np.unique(entries)
        found = self._frame_tables.get(node, unique, known, self._device_table)
        _, devs, distinct, _ = found
        flat = np.searchsorted(devs, dev) * ncols + col
        if len(devs) * ncols <= np.iinfo(np.int32).max:
            flat = flat.astype(np.int32)
        keep = None if distinct and len(unique) == len(entries) else last_wins(flat)
        return Layout(
            entries,
            int(np.count_nonzero(known.stray[entries])),
            series_keys(dev, col),
            found,
            xxhash.xxh3_128_digest(entries.tobytes()),
            flat,
            keep,
        )

    def _older(self, line: Line, node: str, t: int, entries: np.ndarray, floors: np.ndarray) -> None:
        """Points older than what was read for their series: skipped, the first few in the line's log."""
        line.skipped += len(entries)
        shown = min(len(entries), MAX_POINT_ERRORS_PER_LINE)
        columns = self.schema.columns if shown else ()
        for entry, floor in zip(entries[:shown].tolist(), floors[:shown].tolist(), strict=True):
            device = self._series.device(int(self._entries.dev[entry]))
            metric = columns[int(self._entries.col[entry])].metric
            line.log.point(f"a point of {metric} ({device}) {time_problem(node, t, int(floor), None, 0)}")
        line.log.hidden += len(entries) - shown


def _an_object(text: bytes) -> bool:
    """Whether ``text`` is a JSON object on its own (a resource's piece of a request: orjson, or json for what
    orjson refuses, as the line was parsed)."""
    try:
        return type(orjson.loads(text)) is dict
    except orjson.JSONDecodeError:
        pass
    try:
        return type(json.loads(text)) is dict
    except (ValueError, RecursionError):
        return False


def _utf8(text: str | bytes) -> bytes | None:
    """A request's text as UTF-8 bytes (None: a str that can't be, such as one holding a lone surrogate, or no text:
    a document already parsed, which only a subclass's ``_parse`` reads, as bench_receiver's baseline does)."""
    if isinstance(text, str):
        try:
            return text.encode()
        except UnicodeEncodeError:
            return None
    return bytes(text) if isinstance(text, bytes | bytearray | memoryview) else None
