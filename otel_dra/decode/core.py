"""The decoder core: what reading OTLP metrics into Frames means, whatever the encoding.

The OpenTelemetry Collector turns OTLP/JSON and OTLP/protobuf into one request type; so do we.
Both decoders (:mod:`~otel_dra.decode.otlp_json` for replay lines and JSON bodies,
:mod:`~otel_dra.decode.otlp_proto` for the fleet's protobuf requests) keep only how to walk their
input; everything that says what the input means lives here, once:

- series identity: which device and column a point of (metric, attribute set) lands in, and the
  descriptive attributes it carries (:class:`SeriesIndex`; the attributes are in ``semconv/registry.yaml``);
- the metric and point checks, in their order and with their exact wording
  (:func:`metric_problem`, :func:`point_problem` and its halves);
- the per-node time floor (:class:`NodeFloors`) and frame assembly (:class:`TableCache`,
  :func:`last_wins`, :func:`scatter`);
- one result, :class:`DecodeResult`, that the receiver's partial success and replay read as it is.

The two encodings name fields differently (``timeUnixNano`` / ``time_unix_nano``) and, for
history's sake, print counts differently (replay's ``1000 points``, the receiver's ``1,000 points``):
a :class:`Dialect` carries both, so the checks are written once and every message stays as it was.
"""

from __future__ import annotations

import builtins
import json
import logging
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import xxhash

from otel_dra import conventions as cv
from otel_dra.decode import limits as lim
from otel_dra.decode.limits import DEFAULT_LIMITS, DecodeLimits, node_name_problem, shorten
from otel_dra.frame import NO_ATTRS, Column, DeviceTable, Frame, FrozenAttrs, Schema, attrs_of
from otel_dra.vocabulary import SENSOR_TYPES

log = logging.getLogger(__name__)

#: Problems quoted per request (the rest are counted): what goes into partial success's message.
MAX_PROBLEMS_PER_REQUEST: Final = 5
#: A node not decoded for this long (by the decoder's clock) loses its time floor: with node names that churn,
#: the per-node floors would otherwise grow without end on a long-running receiver.
NODE_IDLE_NS: Final = 60 * 60 * 10**9
#: Live input: a point further than this behind what was read for its series is a clock that jumped back
#: (or earlier points that were stamped ahead: one request can no more blind a series than a minute), not a
#: reordered request. It is taken, its series' time restarts from it, and its node is told so (a warning and
#: ``DecodeResult.clock_jumps``). Closer than this, an older point is refused as out of order.
CLOCK_JUMP_NS: Final = 60 * 10**9
#: How often (by the decoder's clock) idle state is looked for.
SWEEP_EVERY_NS: Final = 60 * 10**9
#: The resource attribute that names a point's node (one Frame per node and time).
NODE: Final = cv.K8S_NODE_NAME_ATTR
#: The metric kinds read (numbers); histograms and summaries are rejected by name.
NUMBER_KINDS: Final = ("gauge", "sum")

#: Descriptive attributes of a device, taken from its own points into ``DeviceTable.attrs``.
DESCRIPTIVE: Final[tuple[str, ...]] = (
    cv.HW_TYPE,
    cv.HW_NAME,
    cv.HW_VENDOR,
    cv.HW_MODEL,
    cv.HW_SERIAL_NUMBER,
    cv.HW_FIRMWARE_VERSION,
    cv.HW_DRIVER_VERSION,
    cv.DRA_DRIVER_NAME,
    cv.DRA_POOL_NAME,
    cv.DRA_DEVICE_NAME,
)
#: Attributes that say which series it is, not which kind: never part of a Column's attrs (which are the
#: metric's ``conventions.SERIES_ATTRIBUTES`` only).
NOT_COLUMN_ATTRS: Final = frozenset({cv.HW_ID, cv.HW_PARENT, *DESCRIPTIVE})
_NO_ATTRIBUTES: Final[frozenset[str]] = frozenset()
#: Per sampled metric, every point attribute that is read: identity, descriptive, the metric's series attributes.
#: A point with any other is taken and that attribute ignored (counted: :attr:`DecodeResult.stray`).
READ_ATTRIBUTES: Final[dict[str, frozenset[str]]] = {
    metric: NOT_COLUMN_ATTRS | cv.SERIES_ATTRIBUTES.get(metric, _NO_ATTRIBUTES) for metric in cv.SAMPLED_METRICS
}


# -- text: whatever the input holds, a message stays one short line ----------------------------------
def name(text: str, limit: int = 60) -> str:
    """A name from the input (node, device, key) as it goes into a one-line message."""
    return text if len(text) <= limit and text.isprintable() else short(text, limit)


def one_line(message: str) -> str:
    """Whatever the input held, an error message stays on one line."""
    return message if message.isprintable() else message.encode("unicode_escape").decode("ascii")


def short(value: Any, limit: int = 40) -> str:
    """A JSON value for a one-line message, cut short."""
    if type(value) is list:
        return "a list"
    if type(value) is dict:
        return "an object"
    try:
        text = repr(value[: limit + 2]) if type(value) is str else json.dumps(value)
    except ValueError:  # an int too long to print
        text = type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Dialect:
    """How one encoding's messages name the point's fields and print counts (kept as they always were)."""

    time: str
    double: str
    int: str
    grouped: bool  # counts with thousands separators

    def count(self, n: builtins.int) -> str:  # `int` in this class body is the field
        return f"{n:,}" if self.grouped else str(n)


JSON_DIALECT: Final = Dialect("timeUnixNano", "asDouble", "asInt", grouped=False)
PROTO_DIALECT: Final = Dialect("time_unix_nano", "as_double", "as_int", grouped=True)


# -- the result ----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DecodeError:
    """One problem in the input, on one line: what is wrong and where."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass(frozen=True, slots=True)
class ClockJump:
    """A node's points whose times were out of line with the receiver's clock or with the node's own series,
    one per node and direction per request: ``ahead`` (past the receiver's bound: refused) or behind (further
    than CLOCK_JUMP_NS behind what was read for their series: taken, the series restarted)."""

    node: str
    ahead: bool
    offset_ns: int  # the largest: how far ahead of the receiver's clock, or behind the series' newest
    points: int

    @property
    def direction(self) -> str:
        return "ahead" if self.ahead else "behind"


@dataclass(frozen=True)
class DecodeResult:
    """One request (a replay line, a JSON body, a protobuf message) decoded, whichever encoding it came in:
    its frames and what was wrong with it, as OTLP partial success and replay's report need them."""

    frames: list[Frame]
    points: int = 0  # data points in the request, of any metric but otel-dra's own telemetry (``ignored``)
    rejected: int = 0  # of those, points not taken (bad, unknown metric, wrong kind, no node, out of order)
    problems: tuple[str, ...] = ()  # the first few problems quoted, one line each, in request order
    problem_count: int = 0  # problems the message speaks of (more than quoted: "; and N more")
    errors: tuple[
        DecodeError, ...
    ] = ()  # the JSON decoder's numbered line log (capped; its last entry counts the rest)
    invalid: str | None = None  # why the request as a whole can't be used (JSON: the line is skipped), else None
    #: Points refused by a cap, by reason (limits.LIMIT_REASONS): also counted in ``rejected``.
    limited: dict[str, int] = field(default_factory=dict)
    #: Points of otel-dra's own telemetry (:func:`self_telemetry`): taken and set aside, neither in ``points``
    #: nor rejected, so an agent's push of its queue's metrics is a success, not a partial one.
    ignored: int = 0
    #: Nodes whose clock jumped (points ahead of the bound, or far behind their series), each also logged.
    clock_jumps: tuple[ClockJump, ...] = ()
    #: Points taken that carried attributes otel-dra does not read (:data:`READ_ATTRIBUTES`): those attributes
    #: were ignored, never made a column (``otel_dra.receiver.attributes.ignored``).
    stray: int = 0

    @property
    def accepted(self) -> int:
        return self.points - self.rejected

    @property
    def message(self) -> str:
        """One line for ``partial_success.error_message``; empty when nothing was rejected."""
        if not self.rejected:
            return ""
        more = self.problem_count - len(self.problems)
        tail = f"; and {more:,} more" if more > 0 else ""
        shown = ": " + "; ".join(self.problems) if self.problems else ""
        return one_line(f"{self.rejected:,} of {self.points:,} data points rejected{shown}{tail}")


# -- caps (limits.py): what one client may make the decoder hold --------------------------------------
#: The reasons a point is refused by a cap (a target or a check answering one of these is a refusal).
LIMITED: Final = frozenset(lim.LIMIT_REASONS)
#: Refusals that depend on what other nodes hold (a slot may free up), or on who sent the request: never
#: baked into a cache.
VOLATILE: Final = frozenset({lim.NODES, lim.DEVICES, lim.FORBIDDEN_NODE})


@dataclass(frozen=True, slots=True)
class Refusal:
    """A point refused by a cap: the reason, what it would have added (counted once per request) and
    that thing as a message names it. A series kind refused names its ``device`` too: the device step
    comes first, so whoever reuses the refusal for another point takes that step again
    (:meth:`DecoderCore._reuse`)."""

    reason: str
    key: Any
    example: str
    device: str | None = None


@dataclass(slots=True)
class _Count:
    points: int
    things: int
    nodes: int
    node: str  # the first node named
    example: str  # the first thing named


class Tally:
    """Points refused by the caps in one request (or one template), by reason: one line each, so a
    request naming 200,000 devices past a cap says so in one line, not 200,000."""

    def __init__(self) -> None:
        self.counts: dict[str, _Count] = {}
        self._seen: set[tuple[str, Any]] = set()
        self._nodes: set[tuple[str, str]] = set()

    def __bool__(self) -> bool:
        return bool(self.counts)

    def add(self, refusal: Refusal, node: str, n: int = 1) -> None:
        """``n`` points refused for ``refusal``, on ``node``."""
        reason = refusal.reason
        count = self.counts.get(reason)
        if count is None:
            count = self.counts[reason] = _Count(0, 0, 0, node, refusal.example)
        count.points += n
        if (reason, refusal.key) not in self._seen:
            self._seen.add((reason, refusal.key))
            count.things += 1
        if (reason, node) not in self._nodes:
            self._nodes.add((reason, node))
            count.nodes += 1

    def merge(self, other: Tally) -> None:
        """Add another section's counts (sections are counted apart: a device named in two is two)."""
        for reason, theirs in other.counts.items():
            mine = self.counts.get(reason)
            if mine is None:
                self.counts[reason] = _Count(theirs.points, theirs.things, theirs.nodes, theirs.node, theirs.example)
            else:
                mine.points += theirs.points
                mine.things += theirs.things
                mine.nodes += theirs.nodes

    def frozen(self) -> Tally:
        """The counts alone (a template keeps these, not the sets that made them)."""
        copy = Tally()
        copy.merge(self)
        return copy

    @property
    def volatile(self) -> bool:
        return not VOLATILE.isdisjoint(self.counts)

    def limited(self) -> dict[str, int]:
        """Points refused, by reason, in the order of LIMIT_REASONS."""
        return {r: self.counts[r].points for r in lim.LIMIT_REASONS if r in self.counts}

    def lines(self, limits: DecodeLimits) -> list[str]:
        """One short line per reason."""
        counts = self.counts
        return [_limit_line(reason, counts[reason], limits) for reason in lim.LIMIT_REASONS if reason in counts]


def _on(c: _Count, what: str) -> str:
    return f"{what} {name(c.node)}" if c.nodes == 1 else f"{c.nodes:,} {what}s (first {name(c.node)})"


def _limit_line(reason: str, c: _Count, limits: DecodeLimits) -> str:
    p = f"{c.points:,} point{'s' if c.points != 1 else ''}"
    if reason == lim.FORBIDDEN_NODE:
        return f"{p} of {_on(c, 'node')} refused: this client may not report for it (its certificate names another)"
    if reason == lim.NODE_NAME:
        return f"{p} of {_on(c, 'node')} refused: {NODE} {node_name_problem(c.node)}"
    if reason == lim.NODES:
        new = f"new node {name(c.node)}" if c.things == 1 else f"{c.things:,} new nodes (first {name(c.node)})"
        return f"{p} of {new} refused: more than {limits.max_nodes:,} nodes (--max-nodes)"
    if reason in (lim.DEVICES_PER_NODE, lim.DEVICES):
        new = f"new device {name(c.example)}" if c.things == 1 else f"{c.things:,} new devices"
        cap = (
            f"more than {limits.max_devices_per_node:,} devices on one node (--max-devices-per-node)"
            if reason == lim.DEVICES_PER_NODE
            else f"more than {limits.max_devices:,} devices in all (--max-devices)"
        )
        return f"{p} of {new} on {_on(c, 'node')} refused: {cap}"
    if reason == lim.SERIES:
        new = "a new series kind" if c.things == 1 else f"{c.things:,} new series kinds"
        return (
            f"{p} of {new} (first of {name(c.example)}) refused: more than {limits.max_series:,} "
            "series kinds (--max-series)"
        )
    return (
        f"{p} (first of {name(c.example)}) refused: an identity attribute longer than "
        f"{limits.max_attribute_length:,} characters (--max-attribute-length)"
    )


# -- series identity -----------------------------------------------------------------------------------
#: Where a point goes: (device index, column index, descriptive set index or -1 for none).
Target = tuple[int, int, int]
#: Says whether a device may be added to the node being read: None (it may, and now it is), or the refusal.
Admit = Callable[[str], "Refusal | None"]


class SeriesIndex:
    """Devices and descriptive attribute sets, interned, and the identity rules that map a point's
    (metric, attributes) to them (``semconv/registry.yaml``): one place, so both encodings agree."""

    def __init__(self, schema: Schema, limits: DecodeLimits = DEFAULT_LIMITS) -> None:
        self.schema = schema
        self.limits = limits
        self.dev_index: dict[str, int] = {}
        self.dev_names: list[str] = []
        self.descr_index: dict[tuple[tuple[str, str], ...], int] = {}
        self.descrs: list[tuple[tuple[str, str], ...]] = []

    @property
    def size(self) -> int:
        """What the index holds (its caller bounds it by dropping the whole index)."""
        return max(len(self.dev_names), len(self.descrs))

    def device(self, dev: int) -> str:
        """A device's name as it goes into a message."""
        return name(self.dev_names[dev])

    def target(self, metric: str, attrs: dict[str, str], admit: Admit | None = None) -> Target | str | Refusal:
        """Where a point of ``metric`` with ``attrs`` goes; or why it can't go anywhere (a string), or
        the cap that refuses it (a :class:`Refusal`: an identity attribute too long, a series kind or,
        through ``admit``, a device too many). A sensor (``hw.parent`` set) folds into its parent's row
        as its own column; a device keeps its descriptive attributes, shortened to the length cap.
        A device is interned only once admitted, so refused devices cost no state. The column is the metric
        and its series attributes (``conventions.SERIES_ATTRIBUTES``, a closed set per metric); any other
        attribute is ignored, never a column of its own (the point is taken)."""
        hw_id = attrs.get(cv.HW_ID)
        if not hw_id:
            return f"has no {cv.HW_ID}"
        cap = self.limits.max_attribute_length
        parent = attrs.get(cv.HW_PARENT)
        hw_type = attrs.get(cv.HW_TYPE)
        series = cv.SERIES_ATTRIBUTES.get(metric, _NO_ATTRIBUTES)
        rest = attrs_of({k: v for k, v in attrs.items() if k in series}) if series else ()
        if (
            len(hw_id) > cap
            or (parent is not None and len(parent) > cap)
            or (parent and hw_type is not None and len(hw_type) > cap)
            or any(len(k) > cap or len(v) > cap for k, v in rest)
        ):
            return Refusal(lim.ATTRIBUTE_LENGTH, metric, metric)
        if parent:
            if not hw_type:
                return f"({name(hw_id)}) has {cv.HW_PARENT} but no {cv.HW_TYPE}"
            device = parent
        else:
            if hw_type in SENSOR_TYPES:
                return f"({name(hw_id)}) is a {hw_type} sensor without {cv.HW_PARENT}"
            device = hw_id
        if admit is not None:  # before the series cap: each refusal stays what it was when the point repeats
            refused = admit(device)
            if refused is not None:
                return refused
        descr = -1
        pairs: tuple[tuple[str, str], ...] = ()
        if parent:
            assert hw_type  # checked above
            prefix = parent + "/"
            sensor = hw_id[len(prefix) :] if hw_id.startswith(prefix) and len(hw_id) > len(prefix) else hw_id
            column = Column(metric, rest, sensor, hw_type)
        else:
            column = Column(metric, rest)
            pairs = tuple((k, shorten(attrs[k], cap)) for k in DESCRIPTIVE if k in attrs)
        col = self.schema.find(column)
        if col is None and len(self.schema) >= self.limits.max_series:
            return Refusal(lim.SERIES, column, metric, device)
        if pairs:
            descr = self.descr_index.get(pairs, -1)
            if descr < 0:
                descr = self.descr_index[pairs] = len(self.descrs)
                self.descrs.append(pairs)
        dev = self.dev_index.get(device)
        if dev is None:
            dev = self.dev_index[device] = len(self.dev_names)
            self.dev_names.append(device)
        return dev, self.schema.index(column) if col is None else col, descr


# -- the checks, in their order ------------------------------------------------------------------------
#: otel-dra's own telemetry that is not a device's: what an agent derives (verdicts, views, its kubelet
#: stream's gauges), its OTLP push queue's metrics, a fleet's receiver's. An agent pushes the first two
#: beside its hw.* samples; none is input (a verdict re-read as a column would make a series kind per
#: transition), and none is a mistake of the sender's.
SELF_TELEMETRY: Final = frozenset((set(cv.METRICS) - cv.SAMPLED_METRICS) | set(cv.PUSH_METRICS) | set(cv.FLEET_METRICS))


def self_telemetry(metric: object, from_agent: bool) -> bool:
    """Whether a metric's points are otel-dra's own telemetry, set aside before any check (counted in
    :attr:`DecodeResult.ignored`, never rejected): :data:`SELF_TELEMETRY` by name, whoever sent it, and
    ``hw.status`` from an agent's scope (``from_agent``), which is its verdict, not the device's own report
    (the same name from anyone else is a device's)."""
    if type(metric) is not str:
        return False
    return metric in SELF_TELEMETRY or (from_agent and metric == cv.HW_STATUS.name)


#: :func:`metric_problem`'s answer for a metric this project doesn't know: counted per name, reported once.
UNKNOWN: Final = ""


def metric_problem(
    dialect: Dialect,
    metric: str | None,
    kind: str | None,
    n: int,
    node: str,
    *,
    delta: bool = False,
    points_listed: bool = True,
) -> str | None:
    """Why a metric's ``n`` points are all skipped (None: they are read point by point; :data:`UNKNOWN`:
    an unknown metric). ``metric`` None: it has no name; ``kind`` None: no data field at all;
    ``points_listed`` False: its data points are not a list (JSON only); ``delta``: a delta sum.
    Asked only of metrics that are not :func:`self_telemetry` (those are set aside first)."""
    if metric is None:
        return f"a metric of node {name(node)} has no name ({dialect.count(n)} points skipped)"
    if metric not in cv.METRICS:
        return UNKNOWN
    if kind is None:
        return f"{metric} has no gauge or sum; skipped"
    if kind not in NUMBER_KINDS:
        return f"{metric} is a {kind}, not a gauge or sum ({dialect.count(n)} points skipped)"
    if not points_listed:
        return f"{metric} has dataPoints that are not a list; skipped"
    if delta:
        return f"{metric} is a delta sum; only cumulative sums are read ({dialect.count(n)} points skipped)"
    return None


def unknown_problem(dialect: Dialect, metric: str, n: int) -> str:
    """The one report of an unknown metric's points (all its points in the request together)."""
    return f"unknown metric {short(metric)} ({dialect.count(n)} points) skipped"


def value_problem(dialect: Dialect, device: str, field: str, value: float | None, counter: bool) -> str | None:
    """Why a point's value is not taken (None: it is): absent, not finite, negative on a counter."""
    if value is None:
        return f"({device}) has no value ({dialect.double} or {dialect.int})"
    if math.isnan(value):
        return f"({device}) has {field} NaN"
    if math.isinf(value):
        return f"({device}) has {field} {'Infinity' if value > 0 else '-Infinity'}"
    if counter and value < 0.0:
        return f"({device}) is {value:g} on a counter (cumulative, monotonic)"
    return None


def time_problem(node: str, t: int, floor: int, ceiling: int | None, max_future_ns: int) -> str | None:
    """Why a point's (valid) time is not taken (None: it is): too far ahead of the receiver's clock
    (``ceiling``: the latest time taken, None: no bound), or older than its series' newest (``floor``;
    0 or less: none read yet)."""
    if ceiling is not None and t > ceiling:
        ahead_s = (t - ceiling + max_future_ns) / 1e9
        return (
            f"on node {name(node)} is at {t}, {ahead_s:,.0f} s ahead of this receiver's clock (more than "
            f"{max_future_ns / 1e9:g} s): check that node's clock"
        )
    if floor > 0 and t < floor:
        return f"on node {name(node)} is at {t}, older than {floor} already read for that series"
    return None


def point_problem(
    dialect: Dialect,
    device: str,
    t: int,
    value: float | None,
    counter: bool,
    node: str,
    floor: int,
    ceiling: int | None,
    max_future_ns: int,
) -> str:
    """Why a point with a good target is not taken ("" when it is), for an encoding whose time is a
    plain integer (0: absent): its time, then its value, then time order."""
    if t == 0:
        return f"({device}) has no {dialect.time}"
    return (
        value_problem(dialect, device, dialect.double, value, counter)
        or time_problem(node, t, floor, ceiling, max_future_ns)
        or ""
    )


# -- time order and what each node holds ----------------------------------------------------------------
#: A series' key in :class:`SeriesFloors`: ``device index << _COL_BITS | column``.
_COL_BITS: Final = 24


_NO_FLOORS: Final = np.zeros(0, np.uint64)


def series_keys(dev: np.ndarray, col: np.ndarray) -> np.ndarray:
    """The :class:`SeriesFloors` keys of points with these device (series index) and column indices."""
    return (dev.astype(np.int64) << _COL_BITS) | col.astype(np.int64)


#: Attributes whose value is one device's own: not interned (a string of its own, and no entry in the
#: interpreter's table of interned strings, for each of 100,000 devices).
_OWN_VALUES: Final = frozenset({cv.HW_SERIAL_NUMBER})


#: Pairs of a descriptive set that are one device's own: not kept in DescriptiveMaps' table of shared pairs.
_OWN_PAIRS: Final = frozenset({cv.HW_SERIAL_NUMBER, cv.HW_ID, cv.DRA_DEVICE_NAME})
#: Distinct shared pairs kept (past it the table starts again: pairs already shared stay shared).
MAX_SHARED_PAIRS: Final = 100_000


def intern(key: str, value: str) -> str:
    """An attribute's value, interned unless it is one device's own (its serial number): a fleet's devices
    repeat their models, vendors, versions, pool and node names, and what a device keeps of its attributes
    (the series index's descriptive sets) then shares one string per value; a device's ``hw.id`` and its DRA
    device name, often equal, are one string."""
    return value if key in _OWN_VALUES else sys.intern(value)


_U64: Final = np.dtype(np.uint64)
_ZERO_STRIDE: Final = (0,)


def uniform_times(t: int | np.integer, n: int) -> np.ndarray:
    """``n`` points' times, all ``t``: a read-only uint64 array that holds one number (zero strides), so what
    waits on a node's points at one time (:meth:`SeriesFloors.defer`) is eight bytes, not eight a point."""
    return np.ndarray((n,), _U64, np.uint64(t), 0, _ZERO_STRIDE)


def series_parts(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The device (series index) and column indices of these :func:`series_keys` keys (int32 each)."""
    return (keys >> _COL_BITS).astype(np.int32), (keys & ((1 << _COL_BITS) - 1)).astype(np.int32)


class SeriesFloors:
    """One node's series (device, column) and the newest time read for each: sorted int64 keys
    (:func:`series_keys`) and their times, so a request's points are checked and advanced as arrays (one
    ``searchsorted``), whichever decoder or path read them. 16 bytes a series: a node holds only the series
    it has sent (its devices and the caps bound them). Points taken in order are only noted (:meth:`defer`)
    and applied at the next look-up, or once a few requests' worth wait: a node whose points come in order
    costs no look-up per request."""

    __slots__ = ("_pending", "_waiting", "keys", "newest", "times", "version")

    def __init__(self) -> None:
        self.keys = np.empty(0, np.int64)
        self.times = np.empty(0, np.uint64)
        #: Bumped whenever the keys change (a new series): places taken before stay valid while it is the same.
        self.version = 0
        #: At least the newest time of any series (0: none): points none older than it need no look-up.
        self.newest = 0
        #: (keys, times, places, version) of points taken, waiting; keys None: they wait by their places alone.
        self._pending: list[tuple[np.ndarray | None, np.ndarray, np.ndarray | None, int]] = []
        self._waiting = 0  # points in _pending

    def defer(self, keys: np.ndarray, times: np.ndarray, at: np.ndarray | None, version: int, newest: int) -> None:
        """Points taken, their series' times to move up (``at``: their places, None: not looked up, as they
        were at ``version``; ``newest``: their newest time). Points of the same series as the last that
        waits, each batch at one time (``times`` a broadcast number: a node's usual request), wait as one
        batch at the later time: what waits for a node sending the same series is one batch, not one each."""
        self.newest = max(self.newest, newest)
        # Places found at the present version stand until what waits is applied (keys only change in advance,
        # which applies it first): such points wait by their places, not with a copy of their keys.
        placed = at is not None and version == self.version and len(at) > 0 and bool((at >= 0).all())
        pending = self._pending
        if pending and times.strides == (0,):
            last_keys, last_times, last_at, last_version = pending[-1]
            if last_version == version and last_times.strides == (0,) and len(last_times) == len(times):
                if placed and last_keys is None:
                    assert at is not None  # (placed)
                    same = last_at is not None and (last_at is at or np.array_equal(last_at, at))
                elif not placed and last_keys is not None:
                    same = last_keys is keys or np.array_equal(last_keys, keys)
                else:
                    same = False
                if same:
                    later = uniform_times(max(last_times[0], times[0]), len(times))
                    pending[-1] = (last_keys, later, last_at if last_at is not None else at, version)
                    return
        pending.append((None if placed else keys, times, at, version))
        self._waiting += len(keys)
        if self._waiting > 4 * len(self.keys) + 1024:
            self._flush()

    def settle(self) -> None:
        """Apply what waits (see :meth:`defer`): the times and places read next are the present's."""
        if self._pending:
            self._flush()

    def _flush(self) -> None:
        pending, self._pending, self._waiting = self._pending, [], 0
        # (a batch waiting by its places alone has them at this version: its keys are the floors' own there)
        parts = [(self.keys[at] if k is None else k, t, at, v) for k, t, at, v in pending]
        places = [at if at is not None and v == self.version else self.floors(k)[1] for k, _, at, v in parts]
        if len(parts) == 1:
            keys, times = parts[0][0], parts[0][1]
            at = places[0]
        else:
            keys, times, at = (np.concatenate(x) for x in ([p[0] for p in parts], [p[1] for p in parts], places))
        self.advance(keys, times, at, None)

    def floors(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each key's newest time (uint64, 0 for a series not read yet) and its place (-1: none yet), which
        :meth:`advance` takes back: the keys only change there."""
        if self._pending:
            self._flush()
        n = len(self.keys)
        if not n:
            return np.zeros(len(keys), np.uint64), np.full(len(keys), -1, np.intp)
        at = np.searchsorted(self.keys, keys)
        np.minimum(at, n - 1, out=at)
        found = self.keys[at] == keys
        if found.all():
            return self.times[at], at
        return np.where(found, self.times[at], np.uint64(0)), np.where(found, at, -1)

    def advance(self, keys: np.ndarray, times: np.ndarray, at: np.ndarray, restart: np.ndarray | None) -> None:
        """Points taken (``at``: their places, as :meth:`floors` gave them): each series' newest time moves
        up to its points'; the series in ``restart`` (their clock jumped back) start again from this
        request's points."""
        if self._pending:
            self._flush()
        if self.times.strides == (0,):  # (one time for every series, kept as one number: written, it is an array)
            self.times = self.times.copy()
        restarted = restart is not None and len(restart) > 0 and len(self.keys) > 0
        if restart is not None and restarted:
            self.times[np.isin(self.keys, restart)] = 0
        found = at >= 0
        if found.all():
            np.maximum.at(self.times, at, times)
        else:
            np.maximum.at(self.times, at[found], times[found])
            new, inverse = np.unique(keys[~found], return_inverse=True)
            newest = np.zeros(len(new), np.uint64)
            np.maximum.at(newest, inverse, times[~found])
            merged = np.concatenate([self.keys, new])
            order = np.argsort(merged, kind="stable")
            self.keys, self.times = merged[order], np.concatenate([self.times, newest])[order]
            self.version += 1
        self.newest = int(self.times.max()) if restarted else max(self.newest, int(times.max()))
        if len(self.times) > 1 and self.times[0] == self.newest and (self.times == self.newest).all():
            # Every series read up to the same time (a node whose requests carry all its series at one time):
            # one number, not eight bytes a series.
            self.times = uniform_times(self.newest, len(self.times))


class NodeFloors:
    """Per node, the newest time decoded for each of its series (an older point is rejected: input is in
    time order per series; :class:`SeriesFloors`), when (the decoder's clock) the node was last decoded, so
    an idle node can be forgotten, and the devices it has named (the caps count them): forgetting a node
    frees its slot, its devices and its series' times."""

    def __init__(self, now: int) -> None:
        self.series: dict[str, SeriesFloors] = {}
        self.seen: dict[str, int] = {}
        self.devices: dict[str, set[str]] = {}  # the nodes admitted, and each one's devices
        self.device_count = 0
        #: Each admitted node's admission number: a cache built on a node's devices checks it is still current.
        self.generation: dict[str, int] = {}
        self._generations = 0
        self.swept = now

    def of(self, node: str) -> SeriesFloors:
        """The node's series and their newest times (made empty on first use)."""
        floors = self.series.get(node)
        if floors is None:
            floors = self.series[node] = SeriesFloors()
        return floors

    def due(self, now: int) -> bool:
        """Whether it is time to look for idle nodes (or the clock went back)."""
        return now - self.swept > SWEEP_EVERY_NS or now < self.swept

    def forget_idle(self, now: int) -> None:
        """Drop every node not decoded for NODE_IDLE_NS: its floor, its slot and its devices."""
        self.swept = now
        for node in [n for n, at in self.seen.items() if now - at > NODE_IDLE_NS]:
            del self.seen[node]
            self.series.pop(node, None)
            self.generation.pop(node, None)
            self.device_count -= len(self.devices.pop(node, ()))

    def admit(self, node: str, now: int) -> set[str]:
        """A node taken in (the caller checked the caps): its device set, empty."""
        self.seen[node] = now
        self._generations += 1
        self.generation[node] = self._generations
        devices = self.devices[node] = set()
        return devices

    def advance(self, node: str, t: int, now: int) -> None:
        """A frame of ``node`` at ``t`` was made (its series' times move with :meth:`SeriesFloors.advance`)."""
        self.seen[node] = now


# -- frames --------------------------------------------------------------------------------------------
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
    matrix = np.full(rows * ncols, np.nan)
    matrix[flat] = values
    return matrix.reshape(rows, ncols)


class DecoderCore:
    """State both decoders keep alike: the shared schema, the series index, the device tables, each
    node's series' times and devices, the caps on them (``limits``), and the clock with the bound ahead of
    it that live input is held to. ``clock_jump_ns`` (live input: the receiver's decoders): a point further
    than this behind its series' newest is a clock jump, taken (None, as in replay: refused as older)."""

    def __init__(
        self,
        schema: Schema,
        max_future_ns: int | None,
        clock: Callable[[], int],
        limits: DecodeLimits = DEFAULT_LIMITS,
        clock_jump_ns: int | None = None,
    ) -> None:
        self.schema = schema
        self.max_future_ns = max_future_ns
        self.clock_jump_ns = clock_jump_ns
        self.limits = limits
        #: This request's clock jumps, (node, ahead) -> [largest offset, points]; reported by _clock_jumps.
        self._jumps: dict[tuple[str, bool], list[int]] = {}
        #: This request's points taken, per node: (series keys, times, places) parts, and the series restarted.
        self._taken: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray | None, int, int]]] = {}
        self._restarted: dict[str, list[np.ndarray]] = {}
        self._clock = clock
        self._ceiling: int | None = None  # this request's latest acceptable time (None: no bound, as in replay)
        self._now = clock()
        self._floors = NodeFloors(self._now)
        self._series = SeriesIndex(schema, limits)
        self._maps = DescriptiveMaps(self._series)  # (made again with every new series index)
        self._tables = TableCache()
        #: This request's client: whether it may report for a node (None: for any); set by each ``decode``.
        self._speaker: Callable[[str], bool] | None = None

    def _may_speak(self, node: str | None) -> bool:
        """Whether this request's client may report for ``node``: asked before anything of it is kept."""
        return node is None or self._speaker is None or self._speaker(node)

    def _tick(self) -> int:
        """A request begins: read the clock (the decoder's now) and set the ceiling from it."""
        self._now = now = self._clock()
        self._ceiling = None if self.max_future_ns is None else now + self.max_future_ns
        self._jumps.clear()  # (left over only by a request that was not a request at all)
        self._taken.clear()
        self._restarted.clear()
        return now

    def _admit_node(self, node: str) -> tuple[set[str] | None, Refusal | None]:
        """A resource's node: its device set (None: refused, and why). The request's client must be allowed
        to report for it (the speaker); a node known is touched (not idle); a new one must have a Kubernetes
        node's name and a free slot (``max_nodes``)."""
        if not self._may_speak(node):
            return None, Refusal(lim.FORBIDDEN_NODE, node, node)
        floors = self._floors
        devices = floors.devices.get(node)
        if devices is not None:
            floors.seen[node] = self._now
            return devices, None
        if node_name_problem(node) is not None:
            return None, Refusal(lim.NODE_NAME, node, node)
        if len(floors.devices) >= self.limits.max_nodes:
            return None, Refusal(lim.NODES, node, node)
        return floors.admit(node, self._now), None

    def _admit_device(self, devices: set[str], device: str) -> Refusal | None:
        """Whether a node (its ``devices``) may name ``device``: yes if it has; a new one while the node
        and the fleet have room (``max_devices_per_node``, ``max_devices``), and then it is added."""
        if device in devices:
            return None
        if len(devices) >= self.limits.max_devices_per_node:
            return Refusal(lim.DEVICES_PER_NODE, device, device)
        if self._floors.device_count >= self.limits.max_devices:
            return Refusal(lim.DEVICES, device, device)
        devices.add(device)
        self._floors.device_count += 1
        return None

    def _reuse(self, devices: set[str], found: Target | str | Refusal) -> Target | str | Refusal:
        """What :meth:`SeriesIndex.target` answers now for a point of the node that has named ``devices``,
        from its answer cached for the same (metric, attributes), maybe on another node. The cache is not
        per node, so the device step is taken again: a new device must fit this node (and the fleet),
        and is then admitted, before the cached column, or the cached refusal of its series kind, holds.
        Answers decided before the device step (a string, an identity attribute too long) stay as cached."""
        if type(found) is tuple:
            device = self._series.dev_names[found[0]]
        elif isinstance(found, Refusal) and found.device is not None:
            device = found.device
        else:
            return found
        if device in devices:
            return found
        return self._admit_device(devices, device) or found

    def _time_problem(self, node: str, t: int) -> str | None:
        """Why a point's time is not taken for the receiver's bound (the series' order is :meth:`_order`'s);
        a point past it is a clock jump ahead, noted."""
        problem = time_problem(node, t, 0, self._ceiling, self.max_future_ns or 0)
        if problem is not None:
            self._jump(node, True, t - self._now, 1)
        return problem

    # -- time order per series and clock jumps -------------------------------------------------------
    def _jump(self, node: str, ahead: bool, offset_ns: int, points: int) -> None:
        seen = self._jumps.get((node, ahead))
        if seen is None:
            self._jumps[(node, ahead)] = [offset_ns, points]
        else:
            seen[0] = max(seen[0], offset_ns)
            seen[1] += points

    def _ahead(self, node: str, times: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray | None:
        """Which of these times (of ``mask``'s points) are past the receiver's bound (None: none are); those
        are noted as a jump."""
        if self._ceiling is None:
            return None
        ahead = times > np.uint64(self._ceiling)
        if not ahead.any():
            return None
        if mask is not None:
            ahead &= mask
            if not ahead.any():
                return None
        self._jump(node, True, int(times[ahead].max()) - self._now, int(np.count_nonzero(ahead)))
        return ahead

    def _order(
        self,
        node: str,
        keys: np.ndarray,
        times: np.ndarray,
        mask: np.ndarray | None = None,
        places: np.ndarray | None = None,
        earliest: int | None = None,
    ) -> tuple[np.ndarray | None, np.ndarray, np.ndarray | None]:
        """Time order per series: (which points may be taken, None: all; each one's series floor, 0 for none;
        each one's place, for :meth:`_take`). A point older than what was read for its series (before this
        request) is refused, unless it is further behind than ``clock_jump_ns`` (live input): then its node's
        clock jumped back, or earlier points were stamped ahead, and the series starts again from it (noted).
        Only ``mask``'s points are judged (the others are refused already: a time of 0 among them).
        ``places``: the keys' places, known (a template's, while its node's series are the same); ``earliest``:
        no point is older than this: when no series is newer, nothing is looked up (the places are found
        when the request's end needs them)."""
        series = self._floors.of(node)
        if earliest is not None and earliest >= series.newest:
            return None, _NO_FLOORS, places
        if places is not None:
            version = series.version
            series.settle()
            if series.version != version:  # new series came in meanwhile: the places moved
                places = None
        if places is None:
            floors, at = series.floors(keys)
        else:
            floors, at = series.times[places], places
        older = floors > times
        if mask is not None:
            older &= mask
        if not older.any():
            return None, floors, at
        if self.clock_jump_ns is not None:
            behind = np.where(older, floors - times, np.uint64(0))
            far = behind > np.uint64(self.clock_jump_ns)
            if far.any():
                self._jump(node, False, int(behind.max()), int(np.count_nonzero(far)))
                self._restarted.setdefault(node, []).append(keys[far])
                older &= ~far
        return ~older, floors, at

    def _take(
        self, node: str, keys: np.ndarray, times: np.ndarray, at: np.ndarray | None, newest: int | None = None
    ) -> None:
        """Points of ``node`` taken into this request's frames (``at``: their places, as :meth:`_order` gave
        them, None: not looked up; ``newest``: their newest time, if known): their series' times move at its
        end."""
        if len(keys):
            newest = int(times.max()) if newest is None else newest
            self._taken.setdefault(node, []).append((keys, times, at, self._floors.of(node).version, newest))

    def _advance_series(self) -> None:
        """The request is read: each series' newest time moves up to its points (all points were judged
        against the times from before the request, as frames are made in time order)."""
        floors = self._floors
        for node, parts in self._taken.items():
            if node not in floors.devices:
                continue  # forgotten meanwhile (a reset): nothing to keep
            restart = self._restarted.get(node)
            series = floors.of(node)
            if restart is None:  # in order: noted, applied at the next look-up (SeriesFloors.defer)
                for keys, times, at, version, newest in parts:
                    series.defer(keys, times.astype(np.uint64, copy=False), at, version, newest)
                continue
            series.settle()  # (what waits goes first: the places below are the present's)
            places = [series.floors(k)[1] if at is None or v != series.version else at for k, _, at, v, _ in parts]
            if len(parts) == 1:
                keys, times, at = parts[0][0], parts[0][1], places[0]
            else:
                keys, times, at = (np.concatenate(x) for x in ([p[0] for p in parts], [p[1] for p in parts], places))
            series.advance(keys, times.astype(np.uint64, copy=False), at, np.concatenate(restart))
        self._taken.clear()
        self._restarted.clear()

    def _clock_jumps(self) -> tuple[ClockJump, ...]:
        """This request's clock jumps, one per node and direction, each told in one warning (the process'
        log limiter bounds a flood of them)."""
        if not self._jumps:
            return ()
        jumps = tuple(ClockJump(node, ahead, offset, n) for (node, ahead), (offset, n) in self._jumps.items())
        self._jumps.clear()
        for j in jumps:
            if j.ahead:
                log.warning(
                    "node %s: clock %s s ahead of this receiver's (more than --max-future %s s): %d points "
                    "refused; check that node's clock",
                    name(j.node),
                    f"{j.offset_ns / 1e9:,.0f}",
                    f"{(self.max_future_ns or 0) / 1e9:g}",
                    j.points,
                )
            else:
                log.warning(
                    "node %s: clock jumped back: %d points %s s behind what was read for their series (its "
                    "clock was reset, or earlier points were stamped ahead); taken, those series restart",
                    name(j.node),
                    j.points,
                    f"{j.offset_ns / 1e9:,.0f}",
                )
        return jumps

    def _frame(self, node: str, t: int, table: DeviceTable, matrix: np.ndarray) -> Frame:
        """A frame made: the node was heard (its series' times move at the request's end)."""
        self._floors.advance(node, t, self._now)
        return Frame(t, table, matrix)
