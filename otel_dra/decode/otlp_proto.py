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
numpy fancy index, and hashed (XXH3-128, see :class:`_Template`). Equal means the bytes are
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

import base64
import json
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import xxhash
from google.protobuf.json_format import MessageToDict
from google.protobuf.message import DecodeError as ProtobufDecodeError
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import AggregationTemporality, ResourceMetrics

from otel_dra import conventions as cv
from otel_dra.decode import limits as lim
from otel_dra.decode.core import (
    MAX_PROBLEMS_PER_REQUEST,
    NODE,
    NOT_COLUMN_ATTRS,
    NUMBER_KINDS,
    PROTO_DIALECT,
    READ_ATTRIBUTES,
    UNKNOWN,
    DecoderCore,
    DecodeResult,
    DescriptiveMaps,
    Refusal,
    SeriesFloors,
    SeriesIndex,
    TableCache,
    Tally,
    Target,
    intern,
    last_wins,
    metric_problem,
    one_line,
    point_problem,
    scatter,
    self_telemetry,
    series_keys,
    series_parts,
    time_problem,
    uniform_times,
    unknown_problem,
    value_problem,
)
from otel_dra.decode.limits import DEFAULT_LIMITS, DecodeLimits
from otel_dra.frame import DeviceTable, Frame, Schema, attrs_of

#: Series (metric, attribute set) whose device and column are cached for the plain path (a cache only: at
#: this size it is emptied and refilled; templates make it unneeded for steady traffic).
MAX_CACHED_SERIES: Final = 20_000
#: Device names and descriptive attribute sets (one per device) kept before all of them, and the templates
#: that refer to them, are dropped and relearned: a bound for churn over a long run, above a fleet's needs.
MAX_INTERNED: Final = 250_000
#: Distinct device tables kept so that equal tables are one object (one per node, more while devices come
#: and go); past it they are forgotten, which only costs consumers a fresh look at each node's devices.
MAX_TABLES: Final = 50_000
#: Bytes of templates kept (about 20 kB per node of 8 GPUs: some 25,000 nodes); the least recently used go first.
MAX_TEMPLATE_BYTES: Final = 512 << 20
#: Templates kept per (resource, section length): a node alternating between a few shapes.
MAX_TEMPLATES_PER_KEY: Final = 2
#: A template unused this long (by the decoder's clock) is dropped: its node is gone, or renamed (node names
#: churn in autoscaled clusters, and each would otherwise hold its ~20 kB until ``max_template_bytes``).
TEMPLATE_IDLE_NS: Final = 15 * 60 * 10**9
# A node not decoded for NODE_IDLE_NS loses its time floor (the newest time read for it): the core's NodeFloors,
# which also says how often idle state is looked for (SWEEP_EVERY_NS).

#: After this many misses in a row for one key, stop building templates for it (a section whose bytes change
#: in more than values, e.g. a histogram) and only retry every ``_RETRY_EVERY`` requests.
_MISS_STREAK: Final = 3
_RETRY_EVERY: Final = 64

_DELTA: Final = AggregationTemporality.AGGREGATION_TEMPORALITY_DELTA
# Wire field numbers (opentelemetry/proto/metrics/v1/metrics.proto).
_METRIC_KIND_FIELDS: Final = {5: "gauge", 7: "sum", 9: "histogram", 10: "exponential_histogram", 11: "summary"}
_P_START, _P_TIME, _P_DOUBLE, _P_INT = 2, 3, 4, 6
_NONE, _DOUBLE, _INT = 0, 1, 2  # a point's value kind
_AR8: Final = np.arange(8, dtype=np.intp)
_DEVICE_REASONS: Final = frozenset({lim.DEVICES, lim.DEVICES_PER_NODE})
_NO_TALLY: Final = Tally()  # (a template that refused nothing: one empty tally for all, never added to)


class MalformedRequest(ValueError):
    """Bytes that are not an ``ExportMetricsServiceRequest`` (OTLP: INVALID_ARGUMENT, HTTP 400).
    Its message is one line."""


class _Bail(Exception):
    """Internal: the wire walker met something it does not handle; the plain path decides."""


def _first(item: tuple[int, str]) -> int:
    return item[0]


# -- attributes ------------------------------------------------------------------------------
def _value_str(value: AnyValue) -> str:
    """An attribute's value as the string the columnar model keeps (as the replay decoder reads
    the JSON mapping of the same value: bytes as base64, arrays and maps as compact JSON)."""
    kind = value.WhichOneof("value")
    if kind is None:
        return ""
    if kind == "string_value":
        return value.string_value
    if kind == "bool_value":
        return "true" if value.bool_value else "false"
    if kind == "int_value":
        return str(value.int_value)
    if kind == "double_value":
        return repr(value.double_value)
    if kind == "bytes_value":
        return base64.b64encode(value.bytes_value).decode("ascii")
    return json.dumps(MessageToDict(getattr(value, kind)), sort_keys=True, separators=(",", ":"))


def _kv_dict(items: Any) -> dict[str, str]:
    """A repeated ``KeyValue`` as a dict; the last of a repeated key wins. Values are interned (core.intern)."""
    out: dict[str, str] = {}
    kv: KeyValue
    for kv in items:
        key = kv.key
        out[key] = intern(key, _value_str(kv.value))
    return out


# -- the wire walker (template building only) --------------------------------------------------
def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise _Bail
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, payload start, payload end) of each field in ``data[pos:end]``."""
    while pos < end:
        key, pos = _varint(data, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0 or key >= 1 << 32:
            raise _Bail
        if wire == 0:
            _, stop = _varint(data, pos, end)
        elif wire == 1:
            stop = pos + 8
        elif wire == 2:
            length, pos = _varint(data, pos, end)
            stop = pos + length
        elif wire == 5:
            stop = pos + 4
        else:  # groups and invalid wire types
            raise _Bail
        if stop > end:
            raise _Bail
        yield number, wire, pos, stop
        pos = stop


def _walk_point(data: bytes, pos: int, end: int) -> tuple[int, int, int, int]:
    """Offsets of a NumberDataPoint's start time, time, as_double, as_int payloads (-1: absent)."""
    offs = {_P_START: -1, _P_TIME: -1, _P_DOUBLE: -1, _P_INT: -1}
    for number, wire, a, _ in _fields(data, pos, end):
        if number in offs:
            if wire != 1 or offs[number] >= 0:
                raise _Bail  # repeated or mistyped: protobuf's merge rules, left to upb
            offs[number] = a
    if offs[_P_DOUBLE] >= 0 and offs[_P_INT] >= 0:
        raise _Bail
    return offs[_P_START], offs[_P_TIME], offs[_P_DOUBLE], offs[_P_INT]


def _walk_section(data: bytes, pos: int, end: int) -> list[tuple[str | None, list[tuple[int, int, int, int]]]]:
    """Each metric of a ResourceMetrics in order: its kind and, for gauges and sums, its points' offsets."""
    metrics: list[tuple[str | None, list[tuple[int, int, int, int]]]] = []
    for number, wire, a, b in _fields(data, pos, end):
        if number != 2:
            continue
        if wire != 2:
            raise _Bail
        for number2, wire2, a2, b2 in _fields(data, a, b):
            if number2 != 2:
                continue
            if wire2 != 2:
                raise _Bail
            kind: str | None = None
            body = (0, 0)
            for number3, wire3, a3, b3 in _fields(data, a2, b2):
                if number3 in _METRIC_KIND_FIELDS:
                    if wire3 != 2 or kind is not None:
                        raise _Bail
                    kind, body = _METRIC_KIND_FIELDS[number3], (a3, b3)
            points: list[tuple[int, int, int, int]] = []
            if kind in NUMBER_KINDS:
                for number4, wire4, a4, b4 in _fields(data, *body):
                    if number4 == 1:
                        if wire4 != 2:
                            raise _Bail
                        points.append(_walk_point(data, a4, b4))
            metrics.append((kind, points))
    return metrics


def _sections(data: bytes) -> list[tuple[int, int]] | None:
    """(start, end) of each ResourceMetrics of a request, or None for anything but a plain list of them."""
    out: list[tuple[int, int]] = []
    pos, end = 0, len(data)
    try:
        while pos < end:
            if data[pos] != 0x0A:  # field 1, length-delimited
                return None
            length, pos = _varint(data, pos + 1, end)
            if pos + length > end:
                return None
            out.append((pos, pos + length))
            pos += length
    except _Bail:
        return None
    return out


def _template_key(data: bytes, start: int, end: int) -> tuple[int, int]:
    """Where to look for a section's template: a 64-bit digest of its resource's bytes, and its length (cheap,
    not a proof: the template's own digest is; what is kept per node is two numbers, not its resource)."""
    if end > start and data[start] == 0x0A:
        try:
            length, pos = _varint(data, start + 1, end)
        except _Bail:
            return 0, end - start
        if pos + length <= end:
            return xxhash.xxh3_64_intdigest(memoryview(data)[pos : pos + length]), end - start
    return 0, end - start


# -- scratch -------------------------------------------------------------------------------
@dataclass(slots=True)
class _Candidate:
    """A point whose metric and attributes are usable; its time and value are still to be checked."""

    ordinal: int  # within its section, counting every data point
    metric: str
    index: int  # 0-based within its metric
    dev: int
    col: int
    descr: int  # index into the decoder's descriptive attribute sets, -1: none
    counter: bool
    point: Any  # the upb NumberDataPoint


@dataclass
class _Scan:
    """What a section's structure says, before looking at times and values."""

    node: str | None
    points: int = 0
    rejected: int = 0
    ignored: int = 0  # points of otel-dra's own telemetry, set aside (core.self_telemetry)
    stray: int = 0  # points with attributes not read (core.READ_ATTRIBUTES)
    problems: list[tuple[int, str]] = field(default_factory=list)  # (ordinal, text), in order
    unknown: list[tuple[int, str, int]] = field(default_factory=list)  # (first ordinal, metric, points)
    candidates: list[_Candidate] = field(default_factory=list)
    shape: list[tuple[str | None, int, bool]] = field(default_factory=list)  # (kind, points, ignored) per metric
    tally: Tally = field(default_factory=Tally)  # points refused by the caps


@dataclass
class _Points:
    """Good points of one node at one time, in request order: series key (device and column,
    core.series_keys), descriptive set, value."""

    key: np.ndarray
    descr: np.ndarray | None  # None: its template's (``source``), read when needed
    values: np.ndarray
    layout: _Layout | None = None  # precomputed (a template's): where these points land
    source: _Template | None = None

    def descriptive(self) -> np.ndarray:
        if self.descr is not None:
            return self.descr
        assert self.source is not None  # (what _apply passes)
        return self.source.descr


@dataclass(slots=True)
class _Layout:
    """Where a list of points lands in a frame: the device table, and the cell (row * ncols + column) of
    each kept point in a frame ``ncols`` wide (re-cut when the schema has grown)."""

    table: DeviceTable
    flat: np.ndarray
    ncols: int
    keep: np.ndarray | None  # indices of the points kept (duplicates: the last wins); None = all, in order

    def recut(self, ncols: int, share: Callable[[np.ndarray], np.ndarray]) -> None:
        """The cells in a frame ``ncols`` wide (the schema grew), through ``share``."""
        if self.ncols != ncols:
            rows, cols = np.divmod(self.flat.astype(np.int64), self.ncols)
            self.flat, self.ncols = share((rows * ncols + cols).astype(np.int32)), ncols

    def fill(self, values: np.ndarray, ncols: int) -> np.ndarray:
        if self.ncols != ncols:
            self.recut(ncols, lambda flat: flat)
        return scatter(len(self.table), ncols, self.flat, values if self.keep is None else values[self.keep])


@dataclass(slots=True)
class _Template:
    """A section already decoded: the digest of its bytes with the value payloads zeroed, and where
    each point goes. A digest rather than the bytes themselves: a fleet's templates would otherwise
    hold a copy of every node's last request (100 kB for 8 GPUs). XXH3-128 makes an accidental false
    match as unlikely as a hardware error (2^-128) and costs about 2 µs for such a request, where SHA-256
    cost 90 µs, half of decoding it. It is not collision-resistant against a crafted request, and needs
    not be: a section read from a template is taken only from a client that may speak for the template's
    node (``_may_speak``), and its values go to that node's devices, which such a client may report for
    with a request of its own anyway."""

    digest: bytes
    steps: np.ndarray  # where each 8-byte payload zeroed (start time, time, value of each point) starts: the
    # first's offset, then each one's distance from the one before (uint16 when they fit: see holes)
    node: str | None
    points: int
    rejected: int
    ignored: int
    stray: int
    problems: tuple[tuple[int, str], ...]
    unknown: tuple[tuple[int, str, int], ...]
    tally: Tally  # points refused by the caps: they stay refused while the node's devices are these
    generation: int  # the node's admission its devices were counted in; -1: a node refused (or none)
    # Candidates, as arrays: where each one goes and what it reads from the gathered payloads. What only
    # says how the section is laid out (holes, kinds, counters, ordinals, cells) is one array for every
    # template laid out alike (``OtlpProtoDecoder._shared``: a fleet's nodes mostly are); the device
    # and column of each candidate are read off its key when needed (core.series_parts).
    key: np.ndarray  # each candidate's series (core.series_keys): its time order is checked per series
    # Each candidate's descriptive set: its device's (``row_descr``, by its row in the layout) where it
    # carries one (``carries``, shared), when every device has one; else all of them (``full_descr``).
    full_descr: np.ndarray | None
    carries: np.ndarray | None
    row_descr: np.ndarray | None
    counter: np.ndarray
    any_counter: bool
    time_hole: np.ndarray  # index into holes, -1: no time field (zero)
    value_hole: np.ndarray | None  # index into holes, -1: no value; None when simple (then time_hole + 1)
    kind: np.ndarray  # _NONE, _DOUBLE, _INT
    simple: bool  # every candidate has a time and a double value, right after its time
    layout: _Layout | None  # where the candidates land when all of them are good and share one time
    # For messages only: each candidate's position in the section; the first position of each metric with
    # candidates, and its name (a candidate's metric is the last to start at or before it).
    ordinal: np.ndarray
    blocks: np.ndarray
    names: tuple[str, ...]
    # Where its candidates' series are in its node's SeriesFloors, while that holds the same series (a cache).
    places: np.ndarray | None = None
    places_of: SeriesFloors | None = None
    places_version: int = -1

    @property
    def descr(self) -> np.ndarray:
        """Each candidate's descriptive set (-1: none)."""
        if self.full_descr is not None:
            return self.full_descr
        assert self.layout is not None and self.carries is not None and self.row_descr is not None
        rows = self.layout.flat // self.layout.ncols
        return np.where(self.carries, self.row_descr[rows], -1).astype(np.int32)

    @property
    def holes(self) -> np.ndarray:
        """The start of every payload zeroed, from the section's start."""
        return np.cumsum(self.steps, dtype=np.intp)

    def where(self, i: int) -> str:
        """Candidate ``i`` as a message names it: ``point <n> of <metric>``."""
        b = int(np.searchsorted(self.blocks, self.ordinal[i], side="right")) - 1
        return f"point {int(self.ordinal[i]) - int(self.blocks[b]) + 1} of {self.names[b]}"

    @property
    def nbytes(self) -> int:
        """What this template holds (counting shared arrays too: a bound, not an exact figure)."""
        arrays = (self.steps, self.key, self.counter, self.time_hole, self.kind, self.ordinal)
        holes = 0 if self.value_hole is None else self.value_hole.nbytes
        holes += self.full_descr.nbytes if self.full_descr is not None else self.key.nbytes // 8
        layout = 0 if self.layout is None else self.layout.flat.nbytes
        places = self.key.nbytes // 2  # (filled in on first use: counted from the start, so the sum stays put)
        return (
            sum(a.nbytes for a in arrays)
            + holes
            + places
            + layout
            + 100 * (len(self.problems) + len(self.names))
            + 1024
        )


@dataclass
class _Request:
    """Per-request scratch."""

    points: int = 0
    rejected: int = 0
    ignored: int = 0
    stray: int = 0
    problems: list[tuple[int, str]] = field(default_factory=list)  # the first few, by ordinal
    problem_count: int = 0
    unknown: dict[str, list[int]] = field(default_factory=dict)  # metric -> [first ordinal, points]
    tally: Tally = field(default_factory=Tally)  # points refused by the caps, by reason
    slots: dict[tuple[str, int], list[_Points]] = field(default_factory=dict)  # (node, time) -> parts

    def problem(self, ordinal: int, text: str) -> None:
        """Note a problem; only the first few by position in the request are kept (whatever the
        order they are found in: a section's structural problems come before its points')."""
        self.problem_count += 1
        self.problems.append((ordinal, text))
        if len(self.problems) > 4 * MAX_PROBLEMS_PER_REQUEST:
            self.problems.sort(key=_first)
            del self.problems[MAX_PROBLEMS_PER_REQUEST:]


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
    the per-series lookup cache by :data:`MAX_CACHED_SERIES`, device tables by :data:`MAX_TABLES`,
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
        return self._template_bytes

    def _reset(self) -> None:
        """Drop what indexes devices (templates and tables refer to those indices, so they go too)."""
        self._targets: dict[tuple[str, bytes], Target | str | Refusal] = {}  # a cache only
        self._series = SeriesIndex(self.schema, self.limits)
        self._maps = DescriptiveMaps(self._series)
        self._tables = TableCache()
        self._templates: dict[tuple[int, int], list[_Template]] = {}  # least recently used first
        #: Layout arrays of the templates, one object for equal ones (while some template holds it).
        self._shared: weakref.WeakValueDictionary[bytes, np.ndarray] = weakref.WeakValueDictionary()
        self._names: dict[tuple[str, ...], tuple[str, ...]] = {}  # the templates' metric names, one tuple each
        self._aranges: dict[int, np.ndarray] = {}
        self._used: dict[tuple[int, int], int] = {}  # key -> when (clock) a template of it was last used
        self._template_bytes = 0
        self._streak: dict[tuple[int, int], int] = {}
        self._floors.series.clear()  # keyed by the device indices dropped here

    def _sweep(self) -> None:
        """Drop templates unused for TEMPLATE_IDLE_NS and the time floors of nodes unseen for NODE_IDLE_NS:
        what a node leaves behind must not outlive it by more than that, however many nodes come and go."""
        now = self._now
        while self._templates:
            oldest = next(iter(self._templates))
            if now - self._used.get(oldest, now) <= TEMPLATE_IDLE_NS:
                break
            self._template_bytes -= sum(t.nbytes for t in self._templates.pop(oldest))
            self._used.pop(oldest, None)
        self._streak = {k: n for k, n in self._streak.items() if k in self._templates}
        self._floors.forget_idle(now)

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
            if not (isinstance(found, Refusal) and found.reason in _DEVICE_REASONS):
                if len(self._targets) >= MAX_CACHED_SERIES:
                    self._targets.clear()
                self._targets[key] = found
            return found
        return self._reuse(devices, found)

    def _point_problem(self, dev: int, t: int, kind: int, value: float, counter: bool, floor: int, node: str) -> str:
        """Why a point with a good target is not taken ("" when it is): the core's checks; the fast
        path calls it for the points its arrays rejected."""
        device = self._series.device(dev)
        checked = None if kind == _NONE else value
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
        req = _Request()
        sections = _sections(data) if self.fast else None
        parsed: ExportMetricsServiceRequest | None = None
        if sections is None:
            parsed = self._parse(data)
            sections = [(-1, -1)] * len(parsed.resource_metrics)
        for i, (start, end) in enumerate(sections):
            if start >= 0 and self._fast_section(data, start, end, req):
                self.sections_fast += 1
                continue
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
        for name, (ordinal, n) in req.unknown.items():
            req.problem_count += 1
            req.problems.append((ordinal, unknown_problem(PROTO_DIALECT, name, n)))
        for line in reversed(req.tally.lines(self.limits)):  # first: one line says what many points share
            req.problem_count += 1
            req.problems.append((-1, line))
        req.problems.sort(key=_first)
        self.points += req.points
        self.points_rejected += req.rejected
        self.points_ignored += req.ignored
        problems = tuple(one_line(text) for _, text in req.problems[:MAX_PROBLEMS_PER_REQUEST])
        limited = req.tally.limited()
        return DecodeResult(
            frames,
            req.points,
            req.rejected,
            problems,
            req.problem_count,
            limited=limited,
            ignored=req.ignored,
            clock_jumps=self._clock_jumps(),
            stray=req.stray,
        )

    def _parse(self, data: bytes) -> ExportMetricsServiceRequest:
        try:
            return ExportMetricsServiceRequest.FromString(data)
        except (ProtobufDecodeError, RecursionError, ValueError) as exc:
            self.requests_invalid += 1
            reason = str(exc) or type(exc).__name__
            message = f"not an ExportMetricsServiceRequest ({len(data):,} bytes): {reason}"
            raise MalformedRequest(one_line(message)) from None

    # -- the plain path ----------------------------------------------------------------------------
    def _scan(self, rm: ResourceMetrics) -> _Scan:
        """A section's structure: its node, metrics and each point's target (or why it has none)."""
        node = _kv_dict(rm.resource.attributes).get(NODE) or None
        scan = _Scan(node)
        devices: set[str] = set()
        refused: Refusal | None = None
        if node is not None:
            admitted, refused = self._admit_node(node)
            devices = admitted if admitted is not None else devices
        ordinal = 0
        for sm in rm.scope_metrics:
            from_agent = sm.scope.name == cv.AGENT_SCOPE
            for metric in sm.metrics:
                kind = metric.WhichOneof("data")
                body = getattr(metric, kind) if kind is not None else None
                points = body.data_points if body is not None else ()
                n = len(points)
                # otel-dra's own telemetry (an agent's verdicts, its push queue's metrics): not input, not a
                # rejection; counted apart (as in replay).
                ignored = self_telemetry(metric.name, from_agent)
                scan.shape.append((kind, n, ignored))
                if ignored:
                    scan.ignored += n
                    continue
                first, ordinal = ordinal, ordinal + n
                if node is None or n == 0 or refused is not None:
                    continue
                assert body is not None  # it has points
                name = metric.name
                delta = kind == "sum" and body.aggregation_temporality == _DELTA
                problem = metric_problem(PROTO_DIALECT, name or None, kind, n, node, delta=delta)
                if problem is not None:
                    scan.rejected += n
                    if problem is UNKNOWN:
                        scan.unknown.append((first, name, n))
                    else:
                        scan.problems.append((first, problem))
                    continue
                counter = kind == "sum" and bool(body.is_monotonic)
                read = READ_ATTRIBUTES.get(name, NOT_COLUMN_ATTRS)
                for k, point in enumerate(points):
                    attrs = _kv_dict(point.attributes)
                    target = self._target(name, attrs, devices)
                    if isinstance(target, Refusal):
                        scan.rejected += 1
                        scan.tally.add(target, node)
                    elif isinstance(target, str):
                        scan.rejected += 1
                        scan.problems.append((first + k, f"point {k + 1} of {name} {target}"))
                    else:
                        scan.candidates.append(_Candidate(first + k, name, k, *target, counter, point))
                        if not attrs.keys() <= read:
                            scan.stray += 1
        scan.points = ordinal
        if node is None:
            scan.rejected = ordinal
            if ordinal:
                scan.problems.append((0, f"a resource without {NODE}: its {ordinal:,} points rejected"))
        elif refused is not None:
            scan.rejected = ordinal
            if ordinal:
                scan.tally.add(refused, node, ordinal)
        return scan

    def _plain_section(self, scan: _Scan, req: _Request) -> None:
        """Times and values of a scanned section, read from upb's messages one point at a time."""
        base = req.points
        self._static(scan.points, scan.rejected, scan.ignored, scan.stray, scan.problems, scan.unknown, base, req)
        req.tally.merge(scan.tally)
        node = scan.node
        if node is None or not scan.candidates:
            return
        good: list[tuple[_Candidate, int, float]] = []
        for c in scan.candidates:
            point = c.point
            which = point.WhichOneof("value")
            kind = _NONE if which is None else _DOUBLE if which == "as_double" else _INT
            value = point.as_double if kind == _DOUBLE else float(point.as_int) if kind == _INT else np.nan
            t = point.time_unix_nano
            problem = self._point_problem(c.dev, t, kind, value, c.counter, 0, node)  # time order: below
            if problem:
                ceiling = self._ceiling
                refused_for_time = kind != _NONE and value_problem(PROTO_DIALECT, "", "", value, c.counter) is None
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
        self._add_points(
            node,
            keys,
            np.asarray([c.descr for c, _, _ in good], np.int32),
            times,
            np.asarray([v for _, _, v in good], np.float64),
            req,
        )

    @staticmethod
    def _static(
        points: int,
        rejected: int,
        ignored: int,
        stray: int,
        problems: Sequence[tuple[int, str]],
        unknown: Sequence[tuple[int, str, int]],
        base: int,
        req: _Request,
    ) -> None:
        """A section's counts and structural problems into the request."""
        req.points += points
        req.rejected += rejected
        req.ignored += ignored
        req.stray += stray
        for ordinal, text in problems:
            req.problem(base + ordinal, text)
        for ordinal, name, n in unknown:
            seen = req.unknown.get(name)
            if seen is None:
                req.unknown[name] = [base + ordinal, n]
            else:
                seen[1] += n

    @staticmethod
    def _add_points(
        node: str,
        key: np.ndarray,
        descr: np.ndarray | None,
        times: np.ndarray,
        values: np.ndarray,
        req: _Request,
        layout: _Layout | None = None,
        source: _Template | None = None,
    ) -> None:
        """Good points of one section (their series keys), split by time (in order of first appearance);
        ``descr`` None: ``source``'s (a template's whole list of points)."""
        if not len(key):
            return
        if (times == times[0]).all():
            req.slots.setdefault((node, int(times[0])), []).append(_Points(key, descr, values, layout, source))
            return
        if descr is None:
            assert source is not None
            descr = source.descr
        uniq, index = np.unique(times, return_index=True)
        for t in uniq[np.argsort(index, kind="stable")].tolist():
            mask = times == t
            req.slots.setdefault((node, int(t)), []).append(_Points(key[mask], descr[mask], values[mask]))

    # -- the fast path -----------------------------------------------------------------------------
    def _fast_section(self, data: bytes, start: int, end: int, req: _Request) -> bool:
        """Read a section from a matching template; False when none matches (the caller goes plain)."""
        key = _template_key(data, start, end)
        candidates = self._templates.get(key)
        if candidates is None:
            return False
        section = memoryview(data)[start:end]
        generation = self._floors.generation
        for tmpl in candidates:
            if tmpl.generation >= 0 and generation.get(tmpl.node or "") != tmpl.generation:
                continue  # its node was forgotten since: its devices are counted again, the plain way
            copy = bytearray(section)
            buf = np.frombuffer(copy, np.uint8)
            index = (tmpl.holes[:, None] + _AR8).ravel()
            raw = buf[index]
            buf[index] = 0
            if xxhash.xxh3_128_digest(copy) == tmpl.digest:
                if not self._may_speak(tmpl.node):
                    return False  # the plain path refuses it, counted, and keeps no template of it
                self._templates[key] = self._templates.pop(key)  # most recently used last
                self._used[key] = self._now
                self._streak.pop(key, None)
                if tmpl.generation >= 0:
                    self._floors.seen[tmpl.node or ""] = self._now  # as the plain path's admission does
                self._apply(tmpl, raw.view("<u8"), req)
                return True
        return False

    def _apply(self, tmpl: _Template, words: np.ndarray, req: _Request) -> None:
        """A template's points with this request's times and values."""
        base = req.points
        self._static(tmpl.points, tmpl.rejected, tmpl.ignored, tmpl.stray, tmpl.problems, tmpl.unknown, base, req)
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
                tmpl.kind == _DOUBLE,
                gathered.view("<f8"),
                np.where(tmpl.kind == _INT, gathered.view("<i8").astype(np.float64), np.nan),
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
            self._add_points(node, tmpl.key, None, times, values, req, layout, tmpl)
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
        self._add_points(node, tmpl.key[ok], tmpl.descr[ok], times[ok], values[ok], req)

    def _remember(self, data: bytes, start: int, end: int, scan: _Scan) -> None:
        """Keep a template of a section just scanned, unless its bytes can't be trusted to repeat or
        what it refused depends on other nodes (a slot may free up: it is asked again each time)."""
        if scan.tally.volatile:
            return
        key = _template_key(data, start, end)
        streak = self._streak.get(key, 0)
        if key in self._templates or streak:
            self._streak[key] = streak + 1
            if streak + 1 >= _MISS_STREAK and (streak + 1) % _RETRY_EVERY:
                return
        try:
            tmpl = self._build(data, start, end, scan)
        except _Bail:
            return
        kept = self._templates.pop(key, [])
        kept.insert(0, tmpl)
        self._template_bytes += tmpl.nbytes
        for old in kept[MAX_TEMPLATES_PER_KEY:]:
            self._template_bytes -= old.nbytes
        self._templates[key] = kept[:MAX_TEMPLATES_PER_KEY]
        self._used[key] = self._now
        while self._template_bytes > self.max_template_bytes and self._templates:
            oldest = next(iter(self._templates))
            self._template_bytes -= sum(t.nbytes for t in self._templates.pop(oldest))
            self._streak.pop(oldest, None)
            self._used.pop(oldest, None)

    def _build(self, data: bytes, start: int, end: int, scan: _Scan) -> _Template:
        """The template of a section: the walker's offsets matched with upb's reading of the same bytes."""
        walked = _walk_section(data, start, end)
        if [(kind, len(points)) if kind in NUMBER_KINDS else kind for kind, points in walked] != [
            (kind, n) if kind in NUMBER_KINDS else kind for kind, n, _ in scan.shape
        ]:
            raise _Bail
        holes: list[int] = []
        at: dict[int, tuple[int, int, int]] = {}  # ordinal -> (time hole, value hole, kind)
        ordinal = 0
        for (kind, points), (_, n, ignored) in zip(walked, scan.shape, strict=True):
            if kind not in NUMBER_KINDS:
                ordinal += 0 if ignored else n
                continue
            for start_off, time_off, double_off, int_off in points:
                if start_off >= 0:
                    holes.append(start_off - start)
                time_hole = value_hole = -1
                if time_off >= 0:
                    time_hole = len(holes)
                    holes.append(time_off - start)
                value_kind = _DOUBLE if double_off >= 0 else _INT if int_off >= 0 else _NONE
                if value_kind != _NONE:
                    value_hole = len(holes)
                    holes.append((double_off if value_kind == _DOUBLE else int_off) - start)
                if not ignored:  # an ignored metric's payloads vary too: zeroed, never read
                    at[ordinal] = (time_hole, value_hole, value_kind)
                    ordinal += 1
        cands = scan.candidates
        wheres = [at[c.ordinal] for c in cands]
        for c, (_, _, value_kind) in zip(cands, wheres, strict=True):
            which = c.point.WhichOneof("value")
            if value_kind != (_NONE if which is None else _DOUBLE if which == "as_double" else _INT):
                raise _Bail
        hole_arr = np.asarray(holes, np.int32)
        masked = bytearray(memoryview(data)[start:end])
        np.frombuffer(masked, np.uint8)[(hole_arr[:, None] + _AR8).ravel()] = 0
        dev = np.asarray([c.dev for c in cands], np.int32)
        col = np.asarray([c.col for c in cands], np.int32)
        descr = np.asarray([c.descr for c in cands], np.int32)
        time_holes = np.asarray([w[0] for w in wheres], np.int32)
        value_holes = np.asarray([w[1] for w in wheres], np.int32)
        kinds = np.asarray([w[2] for w in wheres], np.int8)
        counter = np.asarray([c.counter for c in cands], bool)
        ordinals = np.asarray([c.ordinal for c in cands], np.int32)
        simple = bool(len(cands)) and bool((time_holes >= 0).all() and (kinds == _DOUBLE).all())
        simple = simple and bool((value_holes == time_holes + 1).all())
        layout = self._layout(scan.node, dev, col, descr) if scan.node is not None and len(cands) else None
        blocks = dict.fromkeys((c.ordinal - c.index, c.metric) for c in cands)  # each metric's first position
        key = series_keys(dev, col)
        order = self._key_order(key, dev, descr, layout)
        if order is not None:  # candidates in their series' order: the node's time floors can be this key array
            key, descr, counter, time_holes, value_holes, kinds, ordinals = (
                a[order] for a in (key, descr, counter, time_holes, value_holes, kinds, ordinals)
            )
            assert layout is not None  # (what _key_order checked)
            layout.flat = layout.flat[order]
        full_descr: np.ndarray | None = descr
        carries = row_descr = None
        if layout is not None and layout.keep is None:  # each device's set once, by its row, where it is the same
            rows = layout.flat // layout.ncols
            carries = descr >= 0
            row_descr = np.full(len(layout.table), -1, np.int32)
            row_descr[rows[carries]] = descr[carries]
            if (np.where(carries, row_descr[rows], -1) == descr).all():
                full_descr, carries = None, self._share(carries)
            else:
                carries = row_descr = None
        if layout is not None:
            layout.flat = self._share(layout.flat)
        key.flags.writeable = False
        steps = np.diff(hole_arr, prepend=0)
        small = len(steps) == 0 or (int(steps.min()) >= 0 and int(steps.max()) < 1 << 16)
        return _Template(
            digest=xxhash.xxh3_128_digest(masked),
            steps=self._share(steps.astype(np.uint16 if small else np.int32)),
            node=scan.node,
            points=scan.points,
            rejected=scan.rejected,
            ignored=scan.ignored,
            stray=scan.stray,
            problems=tuple(scan.problems),
            unknown=tuple(scan.unknown),
            tally=scan.tally.frozen() if scan.tally else _NO_TALLY,
            generation=-1 if scan.node is None else self._floors.generation.get(scan.node, -1),
            full_descr=full_descr,
            carries=carries,
            row_descr=row_descr,
            counter=self._share(counter),
            key=key,
            any_counter=bool(counter.any()),
            time_hole=self._share(time_holes),
            value_hole=None if simple else self._share(value_holes),
            kind=self._share(kinds),
            simple=simple,
            layout=layout,
            ordinal=self._share(ordinals),
            blocks=self._share(np.asarray([start for start, _ in blocks], np.int32)),
            names=self._interned(tuple(name for _, name in blocks)),
        )

    @staticmethod
    def _key_order(key: np.ndarray, dev: np.ndarray, descr: np.ndarray, layout: _Layout | None) -> np.ndarray | None:
        """The order that sorts a template's candidates by series, when they may be read in any order: each
        series once (no cell written twice, no time order between them), each device with one descriptive set
        (a device's attributes merge in point order otherwise); None when they must stay in request order."""
        if layout is None or layout.keep is not None or len(key) < 2:
            return None
        order = np.argsort(key, kind="stable")
        if not (np.diff(key[order]) > 0).all():
            return None
        carried = descr >= 0
        if len(np.unique(dev[carried])) != len(np.unique(np.stack([dev[carried], descr[carried]]), axis=1).T):
            return None
        return order

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
            if len(self._names) >= MAX_CACHED_SERIES:
                self._names.clear()
            found = self._names[names] = names
        return found

    def _share(self, array: np.ndarray) -> np.ndarray:
        """``array``, or the equal one a template already holds (read-only either way)."""
        key = array.dtype.str.encode() + xxhash.xxh3_128_digest(array.tobytes())
        found = self._shared.get(key)
        if found is not None and found.shape == array.shape:
            return found
        array.flags.writeable = False
        self._shared[key] = array
        return array

    # -- frames -----------------------------------------------------------------------------------
    def _frames(self, req: _Request) -> list[Frame]:
        """The request's points as frames, one per (node, time), in time order."""
        ncols = len(self.schema)
        frames: list[Frame] = []
        for node, t in sorted(req.slots, key=_time_of):
            parts = req.slots[(node, t)]
            layout = parts[0].layout if len(parts) == 1 else None
            if layout is not None:
                values = parts[0].values
            else:
                dev, col = series_parts(np.concatenate([p.key for p in parts]))
                descr = np.concatenate([p.descriptive() for p in parts])
                values = np.concatenate([p.values for p in parts])
                layout = self._layout(node, dev, col, descr)
            layout.recut(ncols, self._share)  # (a template's, made before the schema grew)
            frames.append(self._frame(node, t, layout.table, layout.fill(values, ncols)))
        return frames

    def _layout(self, node: str, dev: np.ndarray, col: np.ndarray, descr: np.ndarray) -> _Layout:
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
        names = self._series.dev_names
        attrs = tuple(self._maps.merged(s) for s in sets)
        table = self._tables.table(node, tuple(names[d] for d in devs.tolist()), attrs)
        ncols = len(self.schema)
        return _Layout(table, (rows.astype(np.int64) * ncols + col).astype(np.int32), ncols, keep)


def _time_of(key: tuple[str, int]) -> int:
    return key[1]
