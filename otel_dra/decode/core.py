"""The decoders' base: the state both keep alike and what a request does to it, whatever the encoding.

The OpenTelemetry Collector turns OTLP/JSON and OTLP/protobuf into one request type; so do we.
Both decoders (:mod:`~otel_dra.decode.otlp_json` for replay lines and JSON bodies,
:mod:`~otel_dra.decode.otlp_proto` for the fleet's protobuf requests) keep only how to walk their
input; what the input means lives once, in the package's other modules: series identity
(:mod:`~otel_dra.decode.series`), the checks (:mod:`~otel_dra.decode.checks`), the caps
(:mod:`~otel_dra.decode.caps`), each node's series' times (:mod:`~otel_dra.decode.floors`), frame
assembly (:mod:`~otel_dra.decode.assembly`) and the result (:mod:`~otel_dra.decode.result`). Here:
node and device admission, time order per request, clock jumps and the frame made.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Final

import numpy as np

from otel_dra.decode import limits as lim
from otel_dra.decode.assembly import DescriptiveMaps, TableCache
from otel_dra.decode.caps import Refusal
from otel_dra.decode.checks import time_problem
from otel_dra.decode.floors import NO_FLOORS, NodeFloors
from otel_dra.decode.limits import DEFAULT_LIMITS, DecodeLimits, node_name_problem
from otel_dra.decode.result import ClockJump
from otel_dra.decode.series import SeriesIndex, Target
from otel_dra.decode.text import name
from otel_dra.frame import DeviceTable, Frame, Schema

log = logging.getLogger(__name__)

#: Live input: a point further than this behind what was read for its series is a clock that jumped back
#: (or earlier points that were stamped ahead: one request can no more blind a series than a minute), not a
#: reordered request. It is taken, its series' time restarts from it, and its node is told so (a warning and
#: ``DecodeResult.clock_jumps``). Closer than this, an older point is refused as out of order.
CLOCK_JUMP_NS: Final = 60 * 10**9


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
        self._reset_index()
        #: This request's client: whether it may report for a node (None: for any); set by each ``decode``.
        self._speaker: Callable[[str], bool] | None = None

    def _reset_index(self) -> None:
        """Drop what indexes devices: the series index, its descriptive maps (made again with every new
        index), the device tables and the nodes' series' times (keyed by the device indices dropped here).
        Each decoder drops its own caches that refer to them along with it."""
        self._series = SeriesIndex(self.schema, self.limits)
        self._maps = DescriptiveMaps(self._series)
        self._tables = TableCache()
        self._floors.series.clear()

    def _device_table(self, node: str, devs: Sequence[int], sets: Iterable[Sequence[int]]) -> DeviceTable:
        """The one table of ``node`` naming these devices (series indices, in row order), each with its
        descriptive sets (in point order) merged, the later winning."""
        names = self._series.dev_names
        return self._tables.table(node, tuple(names[d] for d in devs), tuple(self._maps.merged(s) for s in sets))

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
            return None, NO_FLOORS, places
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
