"""Fleet input: OTLP ``ExportMetricsServiceRequest`` protobuf straight into Frames.

Same model and rules as the replay decoder, both from :mod:`otel_dra.decode.core`: one
:class:`~otel_dra.frame.Frame` per (``k8s.node.name``, ``time_unix_nano``), devices as
rows, the shared :class:`~otel_dra.frame.Schema`'s columns as columns, NaN = absent,
sensors folded into their parent, descriptive attributes into the device table. Bad
input is counted, never raised, except bytes that are not a request at all
(:class:`MalformedRequest`, OTLP's INVALID_ARGUMENT / HTTP 400).

Why it is built the way it is: an agent sends the same series in every export, so a
node's ``ResourceMetrics`` is byte-for-byte the previous one except for the 8-byte
payloads of ``start_time_unix_nano``, ``time_unix_nano`` and ``as_double``/``as_int``
(``fixed64``/``double``/``sfixed64``: fixed width, so they never move anything). The
first time a node's section is seen it is decoded the plain way (upb parses it; every
point's attributes become a (device, column) entry) and a *template* is kept: the
128-bit digest of the section with those payloads zeroed, their offsets, and each point's
entry. The next time, the section is copied, its payloads gathered and zeroed with one
numpy fancy index, and hashed (XXH3-128, see :class:`~otel_dra.decode.proto_templates.Template`).
Equal means the bytes are
those already decoded but for the payloads, so the structure is the same and only the gathered
values and times are new: they are checked (finite, counters non-negative, time order) as arrays and written into the
frame with one numpy scatter. No per-point Python object is made.

Anything else (first sight, a changed series set or attribute, a histogram, unusual
encodings such as repeated singular fields) takes the plain path: upb's parse and a
walk over its messages, obviously the reading the OTLP spec gives. Both paths share
the core's series identity, checks, time order and frame code, and the tests check they agree
point for point.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

import numpy as np
import xxhash
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.metrics.v1.metrics_pb2 import ResourceMetrics

from otel_dra.decode import proto_wire as wire
from otel_dra.decode.assembly import PackedArrays, SharedArrays, last_wins
from otel_dra.decode.caps import DEVICE_REASONS, Refusal
from otel_dra.decode.checks import point_problem, time_problem, value_problem
from otel_dra.decode.core import DecoderCore
from otel_dra.decode.floors import series_keys, series_parts, uniform_times
from otel_dra.decode.limits import DEFAULT_LIMITS, DecodeLimits
from otel_dra.decode.proto_request import Request, time_of
from otel_dra.decode.proto_scan import Candidate, Scan, scan_section
from otel_dra.decode.proto_templates import MAX_TEMPLATE_BYTES, Layout, Template, Templates, build_template
from otel_dra.decode.proto_wire import DOUBLE, INT, NONE, Bail
from otel_dra.decode.result import MAX_PROBLEMS_PER_REQUEST, DecodeResult
from otel_dra.decode.series import Target
from otel_dra.decode.text import PROTO_DIALECT, one_line
from otel_dra.frame import Frame, Schema, attrs_of

#: Series (metric, attribute set) whose device and column are cached for the plain path (a cache only: at
#: this size it is emptied and refilled). A node's first request leaves a template that reads its next ones, so
#: the cache serves only sections no template reads: some 270 bytes a series, at 20,000 it held 5 MB, 0.7 kB a
#: device of a fleet of 8,000 (bench_fleet_scale) for hits that steady traffic never makes.
MAX_CACHED_TARGETS: Final = 4_096
#: Templates' metric-name tuples kept (one object for equal ones).
MAX_CACHED_NAMES: Final = 20_000
#: Device names and descriptive attribute sets (one per device) kept before all of them, and the templates
#: that refer to them, are dropped and relearned: a bound for churn over a long run, above a fleet's needs.
MAX_INTERNED: Final = 250_000
#: Distinct device tables kept so that equal tables are one object (one per node, more while devices come
#: and go); past it they are forgotten, which only costs consumers a fresh look at each node's devices.
MAX_TABLES: Final = 50_000


class MalformedRequest(ValueError):
    """Bytes that are not an ``ExportMetricsServiceRequest`` (OTLP: INVALID_ARGUMENT, HTTP 400).
    Its message is one line."""


# -- the decoder -----------------------------------------------------------------------------
class OtlpProtoDecoder(DecoderCore):
    """Decodes OTLP metrics requests (protobuf) into Frames over a shared Schema.

    Keeps, per instance, the newest time decoded per series (node, device, column: older points are
    rejected, as in replay; with ``max_future_ns``, so are points further than that ahead of ``clock``, and
    with ``clock_jump_ns`` a point that far behind its series is a clock jump, taken) and templates of the requests
    seen, so one decoder should read one stream of requests (a receiver's). Not thread-safe: the
    receiver serialises calls.
    ``fast=False`` keeps only the plain path (the reference the tests compare with).

    Memory is bounded: templates by ``max_template_bytes`` (least recently used dropped first) and
    by idleness (TEMPLATE_IDLE_NS; a node's time floor by NODE_IDLE_NS, both by ``clock``),
    the per-series lookup cache by :data:`MAX_CACHED_TARGETS`, device tables by :data:`MAX_TABLES`,
    device names and descriptive attribute sets by :data:`MAX_INTERNED` (past it everything is
    dropped and relearned). What input may create is capped by ``limits`` (nodes, devices, series kinds,
    attribute lengths): past a cap points are refused and counted by reason (``DecodeResult.limited``).
    """

    def __init__(
        self,
        schema: Schema,
        *,
        fast: bool = True,
        max_template_bytes: int = MAX_TEMPLATE_BYTES,
        max_future_ns: int | None = None,
        clock: Callable[[], int] = time.time_ns,
        limits: DecodeLimits = DEFAULT_LIMITS,
        clock_jump_ns: int | None = None,
    ) -> None:
        super().__init__(schema, max_future_ns, clock, limits, clock_jump_ns)
        self.fast = fast
        self.max_template_bytes = max_template_bytes
        self.requests = 0
        self.requests_invalid = 0
        self.points = 0
        self.points_rejected = 0
        self.points_ignored = 0  # otel-dra's own telemetry, set aside
        self.sections_fast = 0  # ResourceMetrics read from a template
        self.sections_plain = 0  # ... read the plain way
        self._reset()

    @property
    def template_bytes(self) -> int:
        """Memory held by templates (about 20 kB per node of 8 GPUs), bounded by ``max_template_bytes``."""
        return self._templates.nbytes

    def _reset(self) -> None:
        """Drop what indexes devices (templates and tables refer to those indices, so they go too)."""
        self._reset_index()
        self._targets: dict[tuple[str, bytes], Target | str | Refusal] = {}  # a cache only
        self._templates = Templates(self.max_template_bytes)
        #: Layout arrays of the templates, one object for equal ones (while some template holds it).
        self._shared = SharedArrays()
        #: Each template's own small arrays, side by side (see PackedArrays).
        self._packed = PackedArrays()
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}  # the templates' metric names, one tuple each
        self._aranges: dict[int, np.ndarray] = {}

    def _sweep(self) -> None:
        """Drop templates unused for TEMPLATE_IDLE_NS and the time floors of nodes unseen for NODE_IDLE_NS:
        what a node leaves behind must not outlive it by more than that, however many nodes come and go."""
        self._templates.sweep(self._now)
        self._floors.forget_idle(self._now)

    # -- series: (metric, attribute set) -> device, column, descriptive attributes ------------------
    def _target(self, metric: str, attrs: dict[str, str], devices: set[str]) -> Target | str | Refusal:
        """Where a point of ``metric`` with ``attrs`` goes on a node that has named ``devices`` (the core's
        identity rules and caps), cached; a device refused is not (another node may have room for it), and a
        cached answer takes its device step again on this node (the core's ``_reuse``)."""
        # Keyed by a digest of the attributes, not their pairs: the cache holds 16 bytes a series, not a copy.
        key = (metric, xxhash.xxh3_128_digest(repr(attrs_of(attrs)).encode("utf-8", "surrogatepass")))
        found = self._targets.get(key)
        if found is None:
            found = self._series.target(metric, attrs, lambda device: self._admit_device(devices, device))
            if not (isinstance(found, Refusal) and found.reason in DEVICE_REASONS):
                if len(self._targets) >= MAX_CACHED_TARGETS:
                    self._targets.clear()
                self._targets[key] = found
            return found
        return self._reuse(devices, found)

    def _point_problem(self, dev: int, t: int, kind: int, value: float, counter: bool, floor: int, node: str) -> str:
        """Why a point with a good target is not taken ("" when it is): the core's checks; the fast
        path calls it for the points its arrays rejected."""
        device = self._series.device(dev)
        checked = None if kind == NONE else value
        return point_problem(
            PROTO_DIALECT, device, t, checked, counter, node, floor, self._ceiling, self.max_future_ns or 0
        )

    # -- the request ------------------------------------------------------------------------------
    def decode(
        self,
        request: bytes | bytearray | memoryview | ExportMetricsServiceRequest,
        *,
        speaker: Callable[[str], bool] | None = None,
    ) -> DecodeResult:
        """One request into its frames (one per node and time, in time order) and its problems.
        ``speaker``: whether its client may report for a node (None: for any); the points of a node it
        may not are refused (``forbidden_node``) before anything of them is kept.

        Raises :class:`MalformedRequest` when the bytes are not a request; nothing else escapes."""
        self._speaker = speaker
        self.requests += 1
        if self._floors.due(self._tick()):
            self._sweep()
        data = request.SerializeToString() if isinstance(request, ExportMetricsServiceRequest) else bytes(request)
        if self._series.size > MAX_INTERNED:
            self._reset()
        elif len(self._tables) > MAX_TABLES:
            self._tables.clear()
        req = Request()
        sections = wire.sections(data) if self.fast else None
        parsed: ExportMetricsServiceRequest | None = None
        if sections is None:
            parsed = self._parse(data)
            sections = [(-1, -1)] * len(parsed.resource_metrics)
        for i, (start, end) in enumerate(sections):
            if start >= 0 and self._fast_section(data, start, end, req):
                self.sections_fast += 1
                continue
            if start >= 0:  # (only this section parsed: a collector's batch is many nodes' sections, most read fast)
                rm = self._parse(data[start:end], ResourceMetrics, len(data))
            else:
                if parsed is None:
                    parsed = self._parse(data)
                rm = parsed.resource_metrics[i]
            scan = self._scan(rm)
            if start >= 0:
                self._remember(data, start, end, scan)
            self._plain_section(scan, req)
            self.sections_plain += 1
        frames = self._frames(req)
        self._advance_series()
        self.points += req.points
        self.points_rejected += req.rejected
        self.points_ignored += req.ignored
        return req.result(frames, self.limits, self._clock_jumps())

    def _parse(self, data: bytes, message_type: type[Any] = ExportMetricsServiceRequest, size: int = 0) -> Any:
        """``data`` as a ``message_type`` (the request, or one of its ResourceMetrics); a request whose bytes are
        not one is refused whole (:class:`MalformedRequest`, of ``size`` bytes: the request's)."""
        try:
            return message_type.FromString(data)
        except (ProtobufDecodeError, RecursionError, ValueError) as exc:
            self.requests_invalid += 1
            reason = str(exc) or type(exc).__name__
            message = f"not an ExportMetricsServiceRequest ({size or len(data):,} bytes): {reason}"
            raise MalformedRequest(one_line(message)) from None

    # -- the plain path ----------------------------------------------------------------------------
    def _scan(self, rm: ResourceMetrics) -> Scan:
        """A section's structure: its node, metrics and each point's target (or why it has none)."""
        return scan_section(rm, self._admit_node, self._target)

    def _plain_section(self, scan: Scan, req: Request) -> None:
        """Times and values of a scanned section, read from upb's messages one point at a time."""
        base = req.points
        req.section(scan.points, scan.rejected, scan.ignored, scan.stray, scan.problems, scan.unknown, base)
        req.tally.merge(scan.tally)
        node = scan.node
        if node is None or not scan.candidates:
            return
        good: list[tuple[Candidate, int, float]] = []
        for c in scan.candidates:
            point = c.point
            which = point.WhichOneof("value")
            kind = NONE if which is None else DOUBLE if which == "as_double" else INT
            value = point.as_double if kind == DOUBLE else float(point.as_int) if kind == INT else np.nan
            t = point.time_unix_nano
            problem = self._point_problem(c.dev, t, kind, value, c.counter, 0, node)  # time order: below
            if problem:
                ceiling = self._ceiling
                refused_for_time = kind != NONE and value_problem(PROTO_DIALECT, "", "", value, c.counter) is None
                if ceiling is not None and t > ceiling and refused_for_time:
                    self._jump(node, True, t - self._now, 1)
                req.rejected += 1
                req.problem(base + c.ordinal, f"point {c.index + 1} of {c.metric} {problem}")
            else:
                good.append((c, t, value))
        if not good:
            return
        dev = np.asarray([c.dev for c, _, _ in good], np.int32)
        col = np.asarray([c.col for c, _, _ in good], np.int32)
        times = np.asarray([t for _, t, _ in good], np.uint64)
        keys = series_keys(dev, col)
        ok, floors, at = self._order(node, keys, times)
        if ok is not None:
            for i in np.flatnonzero(~ok).tolist():
                c, t, _ = good[i]
                req.rejected += 1
                older = time_problem(node, t, int(floors[i]), None, 0)
                req.problem(base + c.ordinal, f"point {c.index + 1} of {c.metric} {older}")
            good = [g for g, keep in zip(good, ok.tolist(), strict=True) if keep]
            assert at is not None  # (looked up: some point was older)
            dev, col, times, keys, at = dev[ok], col[ok], times[ok], keys[ok], at[ok]
        self._take(node, keys, times, at)
        req.add_points(
            node,
            keys,
            np.asarray([c.descr for c, _, _ in good], np.int32),
            times,
            np.asarray([v for _, _, v in good], np.float64),
        )

    # -- the fast path -----------------------------------------------------------------------------
    def _fast_section(self, data: bytes, start: int, end: int, req: Request) -> bool:
        """Read a section from a matching template; False when none matches (the caller goes plain)."""
        found = self._templates.find(data, start, end, self._floors.generation)
        if found is None:
            return False
        key, tmpl, words = found
        if not self._may_speak(tmpl.node):
            return False  # the plain path refuses it, counted, and keeps no template of it
        self._templates.hit(key, self._now)
        if tmpl.generation >= 0:
            self._floors.seen[tmpl.node or ""] = self._now  # as the plain path's admission does
        self._apply(tmpl, words, req)
        return True

    def _apply(self, tmpl: Template, words: np.ndarray, req: Request) -> None:
        """A template's points with this request's times and values."""
        base = req.points
        req.section(tmpl.points, tmpl.rejected, tmpl.ignored, tmpl.stray, tmpl.problems, tmpl.unknown, base)
        if tmpl.tally:
            req.tally.merge(tmpl.tally)
        node = tmpl.node
        if node is None or not len(tmpl.key):
            return
        if tmpl.value_hole is None:  # (simple: each value right after its time)
            times = words[tmpl.time_hole]
            values = words[tmpl.time_hole + 1].view("<f8")
        else:  # index -1 (no such field) reads the zero word appended
            words = np.concatenate([words, np.zeros(1, "<u8")])
            times = words[tmpl.time_hole]
            gathered = words[tmpl.value_hole]
            values = np.where(
                tmpl.kind == DOUBLE,
                gathered.view("<f8"),
                np.where(tmpl.kind == INT, gathered.view("<i8").astype(np.float64), np.nan),
            )
        ok = np.isfinite(values)
        if tmpl.any_counter:
            ok &= ~(tmpl.counter & (values < 0.0))
        ok &= times != 0
        first = int(times[0])
        uniform = bool((times == times[0]).all())  # one time (the usual): its checks are on one number
        ceiling = self._ceiling
        if not uniform or (ceiling is not None and first > ceiling):
            ahead = self._ahead(node, times, ok)
            if ahead is not None:
                ok &= ~ahead
        series = self._floors.of(node)
        known = tmpl.places is not None and tmpl.places_of is series and tmpl.places_version == series.version
        if known:  # (then nothing is looked up while no point is older than every series' newest)
            earliest = first if uniform else int(times.min())
            in_order, floors, at = self._order(node, tmpl.key, times, ok, tmpl.places, earliest)
        else:
            in_order, floors, at = self._order(node, tmpl.key, times, ok)
            if at is not None and (at >= 0).all():  # every series read before: their places hold till a new one
                at = at.astype(np.int32)
                if len(at) == len(series.keys) and series.keys is not tmpl.key and (at == self._arange(len(at))).all():
                    # The node's series are the template's, in its order: one key array for both, places 0..n-1.
                    series.keys, at = tmpl.key, self._arange(len(at))
                tmpl.places, tmpl.places_of, tmpl.places_version = at, series, series.version
        if in_order is not None:
            ok &= in_order
        if ok.all():
            layout = tmpl.layout if uniform else None
            # One time for every point (the usual): its series' times wait as one number, not a copy per point.
            taken = uniform_times(first, len(times)) if uniform else times
            self._take(node, tmpl.key, taken, at, first if uniform else None)
            req.add_points(node, tmpl.key, None, times, values, layout, tmpl)
            return
        bad = np.flatnonzero(~ok)
        bad = bad[np.argsort(tmpl.ordinal[bad], kind="stable")]  # (the first few by their place in the request)
        req.rejected += len(bad)
        for i in bad[:MAX_PROBLEMS_PER_REQUEST].tolist():
            problem = self._point_problem(
                int(series_parts(tmpl.key[i : i + 1])[0][0]),
                int(times[i]),
                int(tmpl.kind[i]),
                float(values[i]),
                bool(tmpl.counter[i]),
                int(floors[i]) if len(floors) else 0,  # (none looked up: none older)
                node,
            )
            req.problem(base + int(tmpl.ordinal[i]), f"{tmpl.where(i)} {problem}")
        req.problem_count += max(0, len(bad) - MAX_PROBLEMS_PER_REQUEST)
        self._take(node, tmpl.key[ok], times[ok], None if at is None else at[ok])
        req.add_points(node, tmpl.key[ok], tmpl.descr[ok], times[ok], values[ok])

    def _remember(self, data: bytes, start: int, end: int, scan: Scan) -> None:
        """Keep a template of a section just scanned, unless its bytes can't be trusted to repeat or
        what it refused depends on other nodes (a slot may free up: it is asked again each time)."""
        if scan.tally.volatile:
            return
        key = wire.template_key(data, start, end)
        if not self._templates.wanted(key):
            return
        try:
            tmpl = self._build(data, start, end, scan)
        except Bail:
            return
        self._templates.keep(key, tmpl, self._now)

    def _build(self, data: bytes, start: int, end: int, scan: Scan) -> Template:
        """The template of a section (see :func:`~otel_dra.decode.proto_templates.build_template`)."""
        generation = -1 if scan.node is None else self._floors.generation.get(scan.node, -1)
        return build_template(
            data, start, end, scan, generation, self._layout, self._shared.share, self._interned, self._packed.pack
        )

    def _arange(self, n: int) -> np.ndarray:
        """0 .. n-1 (int32, read-only): the places of a template's series in a node's floors that are its own."""
        found = self._aranges.get(n)
        if found is None:
            found = self._aranges[n] = np.arange(n, dtype=np.int32)
            found.flags.writeable = False
        return found

    def _interned(self, names: tuple[str, ...]) -> tuple[str, ...]:
        """``names``, or the equal tuple a template already holds."""
        found = self._names.get(names)
        if found is None:
            if len(self._names) >= MAX_CACHED_NAMES:
                self._names.clear()
            found = self._names[names] = names
        return found

    # -- frames -----------------------------------------------------------------------------------
    def _frames(self, req: Request) -> list[Frame]:
        """The request's points as frames, one per (node, time), in time order."""
        ncols = len(self.schema)
        frames: list[Frame] = []
        for node, t in sorted(req.slots, key=time_of):
            parts = req.slots[(node, t)]
            layout = parts[0].layout if len(parts) == 1 else None
            if layout is not None:
                values = parts[0].values
            else:
                dev, col = series_parts(np.concatenate([p.key for p in parts]))
                descr = np.concatenate([p.descriptive() for p in parts])
                values = np.concatenate([p.values for p in parts])
                layout = self._layout(node, dev, col, descr)
            layout.recut(ncols, self._shared.share)  # (a template's, made before the schema grew)
            frames.append(self._frame(node, t, layout.table, layout.fill(values, ncols)))
        return frames

    def _layout(self, node: str, dev: np.ndarray, col: np.ndarray, descr: np.ndarray) -> Layout:
        """Where points land: the device table of the devices they name (ids in first-seen order,
        descriptive attributes merged in point order, the later winning), rows and columns; of
        points naming the same cell, the last one wins (as in replay)."""
        devs = np.unique(dev)
        rows = np.searchsorted(devs, dev).astype(np.int32)
        keep = last_wins(rows.astype(np.int64) * (int(col.max()) + 1) + col)
        if keep is not None:
            rows, col = rows[keep], col[keep]
        sets: list[list[int]] = [[] for _ in range(len(devs))]  # each device's descriptive sets, in order
        with_descr = np.flatnonzero(descr >= 0)
        if len(with_descr):
            # Each distinct (device, set) once, at its last occurrence, in point order: the same
            # result as updating point by point.
            owner = np.searchsorted(devs, dev[with_descr]).astype(np.int64)
            pair = owner * (len(self._series.descrs) + 1) + descr[with_descr]
            _, last_rev = np.unique(pair[::-1], return_index=True)
            for p in np.sort(len(pair) - 1 - last_rev).tolist():
                sets[int(owner[p])].append(int(descr[with_descr[p]]))
        table = self._device_table(node, devs.tolist(), sets)
        ncols = len(self.schema)
        return Layout(table, (rows.astype(np.int64) * ncols + col).astype(np.int32), ncols, keep)
