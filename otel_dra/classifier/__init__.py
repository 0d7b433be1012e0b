"""The classifier: windows of device telemetry in, health verdicts out.

Stages, in the order data flows (each its own module):
``features`` (a batch of raw series → per-sample features, counter increases) →
the window store (``otel_dra.classifier.window``) → ``rules`` (evidence per reason, vectorised) →
``verdicts`` (hysteresis, escalation, health, remediation, change detection).

One node's 8 GPUs or a fleet's 100,000 devices go through the same code: devices are rows
of arrays, and nothing loops over devices except to write the text of a verdict that changed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Protocol

import numpy as np

from otel_dra import conventions as cv
from otel_dra.classifier.engine import (
    NODE_CAUSE,
    REBOOT,
    REPAIRS,
    RESET,
    VerdictEngine,
    explain,
    explain_workload,
    group_of,
    health_name,
    reasons_of,
    remediation_name,
    state_name,
)
from otel_dra.classifier.events import EventLog
from otel_dra.classifier.features import N_FEATURES, STATE_CODE, F, FeatureExtractor
from otel_dra.classifier.horizon import HorizonStore
from otel_dra.classifier.memory import CounterBaselines, DeviceMemory, VerdictMemory
from otel_dra.classifier.params import PolicyGroups
from otel_dra.classifier.peers import PeerHistory
from otel_dra.classifier.registry import DeviceRegistry
from otel_dra.classifier.rows import RowIndex
from otel_dra.classifier.rules import EVENT_FEATURES, HORIZON_FEATURES, SCOPE, R, Window, evaluate
from otel_dra.classifier.verdict import Verdict, rfc3339
from otel_dra.classifier.window import WindowStore
from otel_dra.classifier.workload import WorkloadSplit
from otel_dra.frame import DeviceTable, Frame, Schema
from otel_dra.policy import EVENT_LOG_DEPTH, EVENT_REASONS, Policy
from otel_dra.vocabulary import REASONS, SCOPES
from otel_dra.words import human_duration

__all__ = ["Classifier", "Verdict"]

#: Identity attributes that are not descriptive (they key the device or are per-series).
_DESCRIPTIVE_SKIP = frozenset({cv.HW_ID, cv.HW_PARENT})
#: The verdict engine's key of Healthy, ok, no reasons, no remediation.
_HEALTHY_OK = VerdictMemory(0, 0, 0, 0, 0).key
#: What a held failure waits for, by repair (``REPAIRS``).
_AWAITED = ("the device is reset", "its node is rebooted", "the device is replaced")
#: Reasons that keep a silent device past ``device_ttl``: what it held, not its silence itself.
_HELD_BY_SILENT = np.asarray([r not in ("device_lost", "stale") for r in REASONS])
#: A loop pass more than this many of its periods late means its own process was stalled.
STALL_PERIODS = 2.0
#: How early a stall's grace may end: times are compared to the millisecond, not to a float's last bit.
_GRACE_SLACK_S = 1e-3


def _at(unix_s: float) -> str:
    """A moment as a stored message says it: RFC 3339, UTC, to the second."""
    return rfc3339(int(unix_s * 1e9)) if math.isfinite(unix_s) else "an unknown time"


def monotonic_s() -> float:
    """The clock stalls are measured with: monotonic (never stepped by NTP or a user), and on Linux
    counting the time the system was suspended too (``CLOCK_BOOTTIME``), which ``time.monotonic`` skips."""
    boottime = getattr(time, "CLOCK_BOOTTIME", None)
    return time.clock_gettime(boottime) if boottime is not None else time.monotonic()


class _RowState(Protocol):
    """Per-row state that follows the registry: grown with its capacity (or compacted to the rows
    ``keep``), cleared with its rows."""

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None: ...

    def clear(self, rows: np.ndarray) -> None: ...


def window_samples(window_s: float, interval_s: float) -> int:
    """Ring length for a window of ``window_s`` at one sample every ``interval_s``."""
    return max(2, math.ceil(window_s / max(interval_s, 1e-3) - 1e-9))


def _runs(groups: np.ndarray) -> np.ndarray:
    """Where each run of equal neighbours in ``groups`` starts."""
    return np.r_[0, np.flatnonzero(groups[1:] != groups[:-1]) + 1] if groups.size else np.zeros(0, np.intp)


def _max_into(out: np.ndarray, groups: np.ndarray, values: np.ndarray, starts: np.ndarray) -> None:
    """``out[g] = max(out[g], values of group g)``, by runs (``starts``, :func:`_runs`): a node's devices hold
    neighbouring rows, so a fleet's 10,000 devices are some 1,250 runs, and ``np.maximum.at`` (slow per
    element) sees one value a run."""
    if starts.size:
        np.maximum.at(out, groups[starts], np.maximum.reduceat(values, starts))


def _widened(values: np.ndarray, ncols: int) -> np.ndarray:
    """A frame made before the schema grew is narrower: the newer columns are absent (NaN)."""
    width = values.shape[1]
    return values if width == ncols else np.pad(values, ((0, 0), (0, ncols - width)), constant_values=np.nan)


class Classifier:
    """Ingest frames (or batches), evaluate at a time, get the verdicts that changed.

    Two clocks: each sample's own time (its node's clock: windows, rates and event times are
    read in it, so one node's clock never moves another's), and the *reference* clock that
    ``evaluate`` is given (the agent's or the fleet's wall clock, or a replay's watermark).
    Freshness is judged in the reference clock, against when each device was last heard
    (``registry.last_heard``), so a node whose clock runs 90 s ahead or behind is neither silent nor
    early. ``interval_s`` is the shortest sampling interval expected: it sizes the window's
    ring (a device sampled faster is judged over its last ``window / interval_s`` samples).
    ``node_time``: verdicts carry each device's node's time (a replay's verdict lines, in the
    input's own time base) instead of the reference clock's.
    """

    def __init__(
        self,
        policy: Policy,
        schema: Schema | None = None,
        interval_s: float = 10.0,
        capacity: int = 64,
        node_time: bool = False,
        restart_repairs: bool = False,
    ) -> None:
        self.policy = policy
        #: This process runs on the devices' node (the agent): its own restart, the devices present again, is
        #: the ``reboot_node`` repair for what it held (the fleet's restart is no repair of anything).
        self.restart_repairs = restart_repairs
        self.schema = schema if schema is not None else Schema()
        self.interval_s = interval_s
        self.node_time = node_time
        self.registry = DeviceRegistry(capacity)
        cap = self.registry.capacity
        self.window_s = policy.window_s
        #: A device's message with no reason: one string for every such verdict, not one each.
        self._no_evidence = f"no evidence of a fault in the last {human_duration(self.window_s)}"
        self.store = WindowStore(N_FEATURES, window_samples(policy.window_s, interval_s), cap, policy.window_s)
        spans = (policy.horizon.duty_buckets, policy.horizon.rate_buckets)
        self.horizon = HorizonStore(len(HORIZON_FEATURES), policy.horizon.bucket_s, spans, cap)
        self._horizon_cols = np.asarray(HORIZON_FEATURES, dtype=np.intp)
        self.extractor = FeatureExtractor(self.schema, cap)
        self.groups = PolicyGroups(policy, cap)
        self.events = {f: EventLog(cap, EVENT_LOG_DEPTH) for f in EVENT_FEATURES}
        hold = np.asarray([policy.hold_s(reason) for reason in REASONS])
        self.engine = VerdictEngine(
            cap,
            hold,
            policy.escalation.window_s,
            policy.escalation.after,
            policy.node.remediation,
            np.asarray([reason != "stale" and policy.clears_by(reason) == "repair" for reason in REASONS]),
            policy.clean_after_repair_s,
        )
        self.workload = WorkloadSplit(cap, policy.workload.min_devices, policy.workload.together_s)
        self.peers = PeerHistory(cap)
        self.unhealthy = np.zeros(4, dtype=bool)  # by state code: which states are Unhealthy
        self.unhealthy[[STATE_CODE[s] for s in policy.unhealthy_states]] = True
        self._ladders: np.ndarray | None = None
        parts: list[_RowState] = [
            self.store,
            self.horizon,
            self.extractor,
            self.groups,
            self.engine,
            self.workload,
            self.peers,
        ]
        for part in parts + list(self.events.values()):
            self.registry.on_resize(part.resize)
            self.registry.on_release(part.clear)
        self.last_now_ns = 0
        self.ingested_samples = 0
        self._last_pass_s: float | None = None  # monotonic_s() of the last loop pass (see pace)
        self._stall_since_s: float | None = None  # a stall noted by pace, its grace not yet begun
        self._stall: tuple[float, float] | None = None  # (since, resumed) in the reference clock: in grace
        #: Per node, the last device table seen whole and its rows, while the registry's rows stand (its
        #: ``generation``): a node sending the same devices again costs no look-up per device.
        self._tables: dict[str, tuple[DeviceTable, int, np.ndarray]] = {}
        self._said: dict[tuple[int, str], str] = {}  # (row, reason) -> the evidence last put in words
        self.registry.on_release(self._forget)
        self.registry.on_resize(self._renumber)
        #: Called with each evaluation's changed verdicts, on the evaluating thread (the state store).
        self.evaluated: list[Callable[[list[Verdict]], None]] = []
        self._memory: dict[tuple[str, str], DeviceMemory] = {}  # recalled, for devices not heard again yet
        self._recalled: set[int] = set()  # rows given their memory, whose verdict is not out yet
        self._baselines: CounterBaselines | None = None  # recalled counter baselines (see recall_baselines)
        self._baseline_index: dict[tuple[str, str], int] = {}  # ... of the devices not heard again yet

    def _forget(self, rows: np.ndarray) -> None:
        gone = set(rows.tolist())
        self._said = {key: text for key, text in self._said.items() if key[0] not in gone}
        self._recalled -= gone

    def _renumber(self, capacity: int, keep: np.ndarray | None) -> None:
        """The registry compacted: new row ``i`` was row ``keep[i]``; nodes with no device left are gone."""
        if keep is None:
            return
        new_of = {old: new for new, old in enumerate(keep.tolist())}
        self._said = {(new_of[row], reason): text for (row, reason), text in self._said.items() if row in new_of}
        self._recalled = {new_of[row] for row in self._recalled if row in new_of}
        nodes = set(self.registry.nodes)
        self._tables = {node: seen for node, seen in self._tables.items() if node in nodes}

    # -- ingest --------------------------------------------------------------------------------
    def ingest(self, frame: Frame, arrival_unix_nano: int | None = None) -> None:
        """One node's sample. Devices whose row is all NaN were not read this time: no sample.
        ``arrival_unix_nano``: when it was heard, in the reference clock (default: its own time)."""
        self.ingest_many([frame], None if arrival_unix_nano is None else [arrival_unix_nano])

    def _rows_of(self, frame: Frame, read: np.ndarray, everyone: bool) -> tuple[np.ndarray, np.ndarray]:
        """(rows, new mask) of the devices ``frame`` read (``read``: which of its rows; ``everyone``: all)."""
        table = frame.devices
        # Device tables are immutable and sources reuse them while nothing changes: only a new
        # table (a device's attributes changed, or a new device) costs a look at each device. A
        # table is remembered as seen only once every one of its devices was read with it, so
        # an attribute change that arrives while its device is not read is noted when it is.
        seen = self._tables.get(table.node)
        if everyone and seen is not None and seen[0] is table and seen[1] == self.registry.generation:
            return seen[2], np.zeros(len(seen[2]), dtype=bool)
        if everyone:
            rows, new = self.registry.rows_for(table.node, table.ids)
        else:
            ids = [dev for dev, ok in zip(table.ids, read.tolist(), strict=True) if ok]
            rows, new = self.registry.rows_for(table.node, ids)
        if seen is None or seen[0] is not table or new.any():
            attrs = [a for a, ok in zip(table.attrs, read.tolist(), strict=True) if ok]
            new = new | self._note_attrs(rows, attrs, new)
        if everyone:
            self._tables[table.node] = (table, self.registry.generation, rows)
        return rows, new

    def ingest_many(self, frames: list[Frame], arrivals_unix_nano: list[int] | int | None = None) -> None:
        """Samples of many nodes (a tick of a fleet, a batch of OTLP requests), ingested as one
        batch whatever their times: the per-sample work runs once for all their devices. A device
        sampled more than once in the batch gets its samples in order, one round each.
        ``arrivals_unix_nano``: when each frame (or all of them) was heard, in the reference clock;
        default: each frame's own time (an agent reading its own devices).

        Per frame only its device rows are looked up (a dictionary read, for a node sending the same
        devices again) in a few comprehensions; the rest is array work over the whole batch, whatever its
        number of frames (a fleet tick has thousands)."""
        if arrivals_unix_nano is None or isinstance(arrivals_unix_nano, int):
            kept = [f for f in frames if len(f.values)]
            heard: list[int] | int | None = arrivals_unix_nano
        else:
            pairs = [(f, a) for f, a in zip(frames, arrivals_unix_nano, strict=True) if len(f.values)]
            kept, heard = [f for f, _ in pairs], [a for _, a in pairs]
        if not kept:
            return
        ncols = len(self.schema)
        tables = self._tables
        generation = self.registry.generation
        # One comprehension per column of the batch, not one loop doing all of them (thousands of frames a tick).
        matrices = [f.values for f in kept]
        sizes = [len(m) for m in matrices]
        stamps = [f.time_unix_nano for f in kept]
        # Each frame's rows, when every frame is a table seen at this generation (a node sending the same
        # devices again); the tables not seen as they are may bring new devices.
        found = [
            s[2]
            for f in kept
            if (s := tables.get(f.devices.node)) is not None and s[0] is f.devices and s[1] == generation
        ]
        looked: list[np.ndarray] | None = found if len(found) == len(kept) else None
        fresh: dict[int, DeviceTable] = {}
        if looked is None:
            for f in kept:
                s = tables.get(f.devices.node)
                if s is None or s[0] is not f.devices:
                    fresh[id(f.devices)] = f.devices
        try:
            values = matrices[0] if len(matrices) == 1 else np.concatenate(matrices)
        except ValueError:  # frames of different widths: each padded to the schema's below
            matrices = [_widened(m, ncols) for m in matrices]
            values = np.concatenate(matrices)
        values = _widened(values, ncols)
        read = ~np.isnan(values).all(axis=1)  # a device whose row is all NaN was not read this time
        counts = np.asarray(sizes, dtype=np.intp)
        offsets = np.r_[0, np.cumsum(counts)[:-1]]
        everyone = np.logical_and.reduceat(read, offsets).tolist()
        new = np.zeros(values.shape[0], dtype=bool)
        if looked is None or not all(everyone):  # (the usual tick skips this: every frame was seen, all read)
            if fresh:  # room for all the new devices at once
                self.registry.reserve((t.node, t.ids) for t in fresh.values())
            looked = []
            generation = self.registry.generation
            for f, o, n, e in zip(kept, offsets.tolist(), sizes, everyone, strict=True):
                seen = tables.get(f.devices.node)
                if e and seen is not None and seen[0] is f.devices and seen[1] == generation:
                    looked.append(seen[2])
                    continue
                rows_f, new_f = self._rows_of(f, read[o : o + n], e)
                looked.append(rows_f)
                if new_f.any():
                    new[o : o + n][read[o : o + n]] = new_f
                generation = self.registry.generation
        rows = looked[0] if len(looked) == 1 else np.concatenate(looked)
        times = np.repeat(np.asarray(stamps, dtype=np.int64), counts)
        if heard is None:
            arrivals = times
        elif isinstance(heard, int):
            arrivals = np.full(times.shape, heard, dtype=np.int64)
        else:
            arrivals = np.repeat(np.asarray(heard, dtype=np.int64), counts)
        if not all(everyone):
            values, times, arrivals, new = values[read], times[read], arrivals[read], new[read]
        if rows.size == 0:
            return
        if len(kept) == 1 or bool((rows[1:] > rows[:-1]).all()):  # ascending rows: every device once
            self.ingest_rows(rows, new, times, values, arrivals)
            return
        # Occurrence rank of each row within the batch (0 for a device's first sample, 1 for its
        # second, ...), so each round has every device at most once, in arrival order.
        order = np.argsort(rows, kind="stable")
        sorted_rows = rows[order]
        starts = np.r_[0, np.flatnonzero(np.diff(sorted_rows)) + 1]
        if starts.size == rows.size:  # every device once (the usual tick): one round, in batch order
            self.ingest_rows(rows, new, times, values, arrivals)
            return
        rank_sorted = np.arange(rows.size) - np.repeat(starts, np.diff(np.r_[starts, rows.size]))
        rank = np.empty(rows.size, dtype=np.int64)
        rank[order] = rank_sorted
        for r in range(int(rank.max()) + 1):
            pick = rank == r
            self.ingest_rows(rows[pick], new[pick], times[pick], values[pick], arrivals[pick])

    def _note_attrs(self, rows: np.ndarray, attrs: Iterable[Mapping[str, str]], new: np.ndarray) -> np.ndarray:
        """Record the rows' attributes; a device whose attributes changed, or a new one (its id may name its
        slot), is classified again. A device whose serial number changed is another device in the same slot
        (replaced): it starts clean, as a new one; returns which rows were."""
        reg = self.registry
        replaced = np.zeros(len(new), dtype=bool)
        for i, (row, a, first) in enumerate(zip(rows.tolist(), attrs, new.tolist(), strict=True)):
            was = reg.attrs[row].get(cv.HW_SERIAL_NUMBER, "")
            if not first and was and a.get(cv.HW_SERIAL_NUMBER, was) != was:
                replaced[i] = True
                reg.renew(np.asarray([row]))
            if reg.set_attrs(row, a) or first or replaced[i]:
                key = reg.keys[row]
                self.groups.assign(row, a, key[1] if key is not None else "")
                self._ladders = None
        return replaced

    def ingest_rows(
        self,
        rows: np.ndarray,
        new: np.ndarray,
        time_unix_nano: int | np.ndarray,
        values: np.ndarray,
        arrival_unix_nano: int | np.ndarray | None = None,
    ) -> None:
        """One sample for each of ``rows`` (unique), taken at ``time_unix_nano`` (one time, or one per
        row) and heard at ``arrival_unix_nano`` (default: its own time): ``values`` is ``(rows, schema
        columns)``."""
        t = np.broadcast_to(np.asarray(time_unix_nano, dtype=np.int64) / 1e9, rows.shape)
        heard = t if arrival_unix_nano is None else np.asarray(arrival_unix_nano, dtype=np.int64) / 1e9
        if (self._memory or self._baseline_index) and new.any():
            self._recall_rows(rows[new], np.broadcast_to(heard, rows.shape)[new])
        ix = RowIndex(rows)  # how the stores read and write this batch's rows, worked out once
        feats = self.extractor.extract(ix, new, t, values, self.groups.device_params(rows))
        reg = self.registry
        self._note_repairs(rows, feats, np.broadcast_to(heard, rows.shape))
        self.workload.split(rows, reg.node_of, reg.active, t, feats, self.events)
        self.store.append(ix, t, feats)
        self.horizon.append(ix, t, feats[self._horizon_cols])
        for f, log in self.events.items():
            log.record(rows, t, feats[f])
        ix.put(reg.last_seen, np.fmax(ix.take(reg.last_seen), t))
        ix.put(reg.last_heard, np.fmax(ix.take(reg.last_heard), heard))
        first = ix.take(reg.first_seen)
        ix.put(reg.first_seen, np.where(np.isnan(first), t, first))
        self.ingested_samples += int(rows.size)

    def _note_repairs(self, rows: np.ndarray, feats: np.ndarray, heard_s: np.ndarray) -> None:
        """The repairs this sample shows (the policy's ``clears``): a reset event or the device's counters
        starting over is a reset; counters starting over on more than half of a node's devices at once, a reboot
        of the node (or a restart of its driver or agent). A device that held a failure only a repair clears
        begins a new window at its repair: what the old one held was the device before it."""
        restarted = feats[F.RESTARTS] > 0
        reset = restarted | (feats[F.RESETS] > 0)
        if not reset.any():
            return
        node = self.registry.node_of[rows]
        nodes = len(self.registry.nodes)
        heard_here = np.bincount(node, minlength=nodes)
        restarted_here = np.bincount(node, weights=restarted, minlength=nodes)
        reboot = restarted & (2 * restarted_here[node] > heard_here[node])
        kinds = np.where(reboot, RESET | REBOOT, np.where(reset, RESET, 0))
        self._repair(rows, kinds, heard_s)

    def _repair(self, rows: np.ndarray, kinds: np.ndarray, heard_s: np.ndarray) -> None:
        renewed = rows[(kinds > 0) & self.engine.awaiting_repair(rows)]
        self.engine.repaired(rows, kinds, heard_s)
        if renewed.size:
            self.store.clear(renewed)

    # -- evaluate ------------------------------------------------------------------------------
    def intervals(self, rows: np.ndarray | slice) -> np.ndarray:
        """Each row's sampling interval as its window shows it (NaN until it has two samples)."""
        st = self.store
        steps = st.counts[F.DT, rows] - st.holds_first(rows)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(steps > 0, st.sums[F.DT, rows] / steps, np.nan)

    def pace(self, every_s: float, monotonic: float | None = None) -> float:
        """Called once a pass by a loop that evaluates every ``every_s`` seconds, before the pass's
        evaluation; returns how late the pass is when that makes it a stall (seconds; 0.0 when not).

        A pass more than ``STALL_PERIODS`` periods late, by :func:`monotonic_s` (``monotonic``: a
        test's clock), means this process was not running: stopped (SIGSTOP), throttled, swapped out,
        in a long pause. Its receivers could not read their sockets either, so nothing was heard
        while it stood still, and a node is not to be blamed for that: from the next evaluation each
        device gets one sampling interval (its own, never under ``interval_s``) to be heard before it
        is called stale, and until then a device (or node) that was fresh at the last evaluation
        before the stall stays fresh. One that really went silent is stale when that interval ends."""
        now = monotonic_s() if monotonic is None else monotonic
        last, self._last_pass_s = self._last_pass_s, now
        if last is None or self.last_now_ns == 0:
            return 0.0
        late = now - last - every_s
        if late <= STALL_PERIODS * every_s:
            return 0.0
        self._stall_since_s = self.last_now_ns / 1e9
        return late

    def freshness(self, now_s: float, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(device fresh, node fresh, device age s, node age s) for ``rows``, in the reference clock.

        A device's stale timeout is the policy's, never under ``stale_intervals`` of its own
        sampling interval (until that is known, of the stale timeout itself: a new 60 s node is
        not stale before its second sample); a node's is the longest of its devices', judged
        against when it was last heard. After a stall of the judging process (:meth:`pace`), what
        was fresh when it stalled stays fresh for a sampling interval after it resumed."""
        reg = self.registry
        active = np.flatnonzero(reg.active)
        base = self.policy.stale_timeout_s
        measured = self.intervals(active)
        interval = np.where(np.isnan(measured), base, measured)
        timeout = np.full(reg.capacity, base)
        timeout[active] = np.maximum(base, self.policy.stale_intervals * interval)
        nodes = len(reg.nodes)
        node_last = np.full(nodes, -np.inf)
        node_timeout = np.zeros(nodes)
        node_of = reg.node_of[active]
        starts = _runs(node_of)
        _max_into(node_last, node_of, reg.last_heard[active], starts)
        _max_into(node_timeout, node_of, timeout[active], starts)
        age = now_s - reg.last_heard[rows]
        node = reg.node_of[rows]
        node_age = now_s - node_last[node]
        fresh, node_fresh = age <= timeout[rows], node_age <= node_timeout[node]
        if self._stall is not None:
            since, resumed = self._stall
            grace = np.zeros(reg.capacity, dtype=bool)  # in grace and fresh when the stall began
            grace[active] = (now_s < resumed + np.fmax(self.interval_s, measured) - _GRACE_SLACK_S) & (
                reg.last_heard[active] + timeout[active] >= since
            )
            node_grace = np.zeros(nodes, dtype=bool)
            np.logical_or.at(node_grace, reg.node_of[active], grace[active])
            fresh |= grace[rows]
            node_fresh |= node_grace[node]
        return fresh, node_fresh, age, node_age

    def _grace(self, now_s: float) -> bool:
        """Begin the grace of a stall :meth:`pace` noted, or end one whose every device's interval
        is over; True while one lasts."""
        if self._stall_since_s is not None:
            self._stall, self._stall_since_s = (self._stall_since_s, now_s), None
        elif self._stall is not None:
            longest = np.nanmax(self.intervals(np.flatnonzero(self.registry.active)), initial=0.0)
            if now_s >= self._stall[1] + max(self.interval_s, float(longest)) - _GRACE_SLACK_S:
                self._stall = None
        return self._stall is not None

    def _window(self, rows: np.ndarray, age: np.ndarray, fresh: np.ndarray) -> Window:
        """The rows' windows, read at each row's own present: its newest sample time plus the
        reference time since it was heard."""
        local = self.registry.last_seen[rows] + age
        recent = age <= self.horizon.spans[-1] * self.horizon.bucket_s
        on = self.engine.on[rows]
        reg = self.registry
        return Window(
            self.store,
            self.horizon,
            self.events,
            rows,
            local,
            self.policy.min_samples,
            self.groups,
            fresh,
            recent,
            on,
            reg.node_of[rows].astype(np.intp),
            len(reg.nodes),
            self.peers.hot_since[rows],
            self.peers.baseline[rows],
            self.peers.history_s[rows],
        )

    def evaluate(self, now_unix_nano: int | None = None) -> list[Verdict]:
        """Judge every device at ``now`` (the reference clock; default: the wall clock); return the
        verdicts that changed."""
        now_ns = time.time_ns() if now_unix_nano is None else int(now_unix_nano)
        self.last_now_ns = now_ns
        now_s = now_ns / 1e9
        in_grace = self._grace(now_s)
        rows = np.flatnonzero(self.registry.active)
        if rows.size == 0:
            self._evaluated([])
            return []
        fresh, node_fresh, age, node_age = self.freshness(now_s, rows)
        lost = ~fresh & node_fresh
        unknown = ~node_fresh
        w = self._window(rows, age, fresh)
        evidence = evaluate(w, self.groups, fresh, lost)
        peers = w.thermal_peers()
        # Learnt from: judged now, neither hotter than its bar nor held hot (a fault is not its normal).
        learn = peers.judged & ~peers.hot & ~w.on[:, R["thermal"]]
        tau = self.groups.param(rows, "thermal", "peers", "baseline_tau")
        self.peers.update(rows, w.now_s, peers.hot, peers.judged, peers.residuals.residual, learn, tau)
        if self._ladders is None:
            self._ladders = self.groups.ladders()
        health, state, bits, remediation, scope, changed = self.engine.step(
            rows, now_s, evidence, unknown, self.unhealthy, self._ladders, self.groups.group[rows]
        )
        out = []
        emit = changed
        if self._recalled:  # a recalled device's first verdict is out even when it did not change
            emit = changed | np.isin(rows, np.fromiter(self._recalled, dtype=np.int64))
            self._recalled.difference_update(rows.tolist())
        for i in np.flatnonzero(emit).tolist():
            row = int(rows[i])
            at_ns = self._time_ns(now_ns, w, i)
            if changed[i]:
                self.engine.transition_ns[row] = at_ns
            out.append(
                self._verdict(
                    w,
                    i,
                    row,
                    at_ns,
                    int(health[i]),
                    int(state[i]),
                    int(bits[i]),
                    int(remediation[i]),
                    int(scope[i]),
                    float(age[i]),
                    float(node_age[i]),
                    evidence.present[i],
                    at_ns if changed[i] else None,  # (changed now: one int for every such verdict)
                    (evidence.node_hits[i], int(evidence.node_devices[i])),
                )
            )
        if self._baselines is not None and now_s - float(self._baselines.heard_s.max(initial=0.0)) > self.window_s:
            self._baselines, self._baseline_index = None, {}  # the devices not heard again by now start afresh
        # A device is forgotten for silence the fleet heard, not for its own stall; the arrays of a fleet that
        # shrank shrink with it.
        if not in_grace:
            self._expire(now_s)
        self._evaluated(out)
        return out

    def _expire(self, now_s: float) -> None:
        """Forget the devices silent for the policy's ``device_ttl`` (their rows are reused, their verdicts
        leave the board); one that holds a reason, for the escalation window: silence does not repair, so it
        stays (Unknown, what it holds beside ``stale``) in case it comes back unrepaired."""
        held = self.engine.on[:, _HELD_BY_SILENT].any(axis=1)
        if self.registry.expire(now_s, np.where(held, self._silent_ttl_s(True), self._silent_ttl_s(False))).size:
            self.registry.compact()

    def _evaluated(self, changed: list[Verdict]) -> None:
        for hook in self.evaluated:
            hook(changed)

    # -- memory across restarts ------------------------------------------------------------------
    def remember(self, now_s: float) -> list[DeviceMemory]:
        """What a restart must not forget, per device (see :mod:`otel_dra.classifier.memory`): the last
        verdict of every device that is not Healthy and ok, held reasons and escalation episodes,
        logged events; and the recalled memory of devices not heard again yet, while within the policy's
        ``device_ttl`` (a failure it holds: the escalation window). Call it on the evaluating thread (between
        evaluations)."""
        out = self._memories(np.flatnonzero(self.registry.active), now_s)
        out.extend(m for m in self._memory.values() if self._kept(m, now_s))
        return out

    def _kept(self, m: DeviceMemory, now_s: float) -> bool:
        """Whether a silent device's memory is still kept at ``now_s``: for the policy's ``device_ttl``; one that
        holds a reason for the escalation window (if it comes back unrepaired, its failure comes back with it:
        silence does not repair)."""
        held = any(r.on and _HELD_BY_SILENT[i] for i, r in m.reasons.items())
        return now_s - m.heard_s <= self._silent_ttl_s(held)

    def _silent_ttl_s(self, held: bool) -> float:
        """How long a silent device is remembered: the policy's ``device_ttl``; holding a reason, at least the
        escalation window (silence does not repair)."""
        policy = self.policy
        return max(policy.device_ttl_s, policy.escalation.window_s) if held else policy.device_ttl_s

    def _memories(self, rows: np.ndarray, now_s: float) -> list[DeviceMemory]:
        """:meth:`remember`'s entries for ``rows``."""
        reg, eng = self.registry, self.engine
        # Only the devices with something to keep are looked at one by one (a fleet's are mostly healthy).
        some = ((eng.key[rows] >= 0) & (eng.key[rows] != _HEALTHY_OK)) | eng.on[rows].any(axis=1)
        some |= (eng.episodes[rows] > 0).any(axis=1)
        for log in self.events.values():
            some |= log.next[rows] > 0
        rows = rows[some]
        reasons = eng.remembered(rows, now_s)
        logged: dict[int, list[tuple[int, EventLog]]] = {}
        for f, log in self.events.items():
            for row in rows[log.next[rows] > 0].tolist():
                logged.setdefault(row, []).append((int(f), log))
        out = []
        keys, since, heard = eng.key[rows].tolist(), eng.transition_ns[rows].tolist(), reg.last_heard[rows].tolist()
        for i, row in enumerate(rows.tolist()):
            key = reg.keys[row]
            if key is None or not math.isfinite(heard[i]):
                continue
            held = reasons.get(row, {})
            said = {r: replace(m, said=self._said.get((row, REASONS[r]), "")) for r, m in held.items()}
            events: dict[int, tuple[tuple[float, float], ...]] = {}
            for feature, log in logged.get(row, []):
                times, amounts = log.times[row], log.amounts[row]
                order = np.argsort(times, kind="stable")
                events[feature] = tuple((float(times[j]), float(amounts[j])) for j in order if math.isfinite(times[j]))
            # A Healthy, ok device has nothing to keep: after a restart its first verdict is a first verdict.
            verdict = VerdictMemory.of_key(keys[i], since[i]) if keys[i] >= 0 and keys[i] != _HEALTHY_OK else None
            if verdict is not None or said or events:
                serial = reg.attrs[row].get(cv.HW_SERIAL_NUMBER, "")
                out.append(DeviceMemory(key[0], key[1], float(heard[i]), verdict, said, events, serial))
        return out

    def recall(self, memories: Iterable[DeviceMemory], now_s: float) -> int:
        """Take back what :meth:`remember` gave (a previous process's), before the first ingest: each
        device gets its memory when it is first heard again. Devices not heard for the policy's
        ``device_ttl`` (they would have been forgotten by now; one holding a failure: the escalation window)
        and devices already heard are left out. Returns how many devices' memory is waiting."""
        for m in memories:
            if self._kept(m, now_s) and self.registry.row(m.node, m.hw_id) is None:
                self._memory[m.key] = m
        return len(self._memory)

    def baselines(self) -> CounterBaselines:
        """Every device's counter baselines (see :class:`~otel_dra.classifier.memory.CounterBaselines`), for the
        state file beside :meth:`remember`; on the evaluating thread."""
        reg, ex = self.registry, self.extractor
        plan = ex.plan()
        k = int(plan.counter_cols.size)
        rows = np.flatnonzero(reg.active & ~np.isnan(reg.last_heard))
        values = ex.prev[rows, :k]
        rows, values = rows[~np.isnan(values).all(axis=1)], values[~np.isnan(values).all(axis=1)]
        keys = [reg.keys[row] or ("", "") for row in rows.tolist()]
        return CounterBaselines(
            columns=tuple(self.schema.columns[c] for c in plan.counter_cols.tolist()),
            nodes=tuple(node for node, _ in keys),
            ids=tuple(hw_id for _, hw_id in keys),
            serials=tuple(reg.attrs[row].get(cv.HW_SERIAL_NUMBER, "") for row in rows.tolist()),
            heard_s=reg.last_heard[rows].copy(),
            values=values.copy(),
        )

    def recall_baselines(self, baselines: CounterBaselines | None) -> None:
        """Take back what :meth:`baselines` gave (a previous process's), before the first ingest: a device
        heard again within the policy's window of when it was last heard, with the same serial number, has its
        counters' increases counted from those values instead of taking its first values as a baseline."""
        self._baselines = baselines if baselines is not None and len(baselines) else None
        self._baseline_index = (
            {}
            if self._baselines is None
            else {key: i for i, key in enumerate(zip(self._baselines.nodes, self._baselines.ids, strict=True))}
        )

    def _recall_baselines(self, rows: np.ndarray, heard_s: np.ndarray) -> None:
        b = self._baselines
        assert b is not None  # (an index without its baselines is cleared with them)
        plan = self.extractor.plan()
        place = {int(c): j for j, c in enumerate(plan.counter_cols.tolist())}
        cols = [self.schema.find(col) for col in b.columns]
        saved = np.asarray([i for i, c in enumerate(cols) if c is not None and c in place], dtype=np.intp)
        into = np.asarray([place[c] for c in cols if c is not None and c in place], dtype=np.intp)
        for row, now_s in zip(rows.tolist(), heard_s.tolist(), strict=True):
            key = self.registry.keys[row]
            i = self._baseline_index.pop(key, None) if key is not None else None
            if i is None or now_s - b.heard_s[i] > self.window_s:
                continue  # not saved, or silent longer than a window: what it counted meanwhile is history
            serial = self.registry.attrs[row].get(cv.HW_SERIAL_NUMBER, "")
            if serial != b.serials[i]:
                continue  # another device under the same id
            self.extractor.prev[row, into] = b.values[i, saved]

    def _recall_rows(self, rows: np.ndarray, heard_s: np.ndarray) -> None:
        """Give newly registered ``rows`` their recalled memory (heard at ``heard_s``, the reference clock)."""
        if self._baseline_index:
            self._recall_baselines(rows, heard_s)
        for row, now_s in zip(rows.tolist(), heard_s.tolist(), strict=True):
            key = self.registry.keys[row]
            m = self._memory.pop(key, None) if key is not None else None
            if m is None:
                continue
            serial = self.registry.attrs[row].get(cv.HW_SERIAL_NUMBER, "")
            if m.serial and serial and serial != m.serial:
                continue  # another device in that slot: it starts clean
            self.engine.recall(row, dict(m.reasons), m.verdict, float(now_s))
            if self.restart_repairs:  # this agent restarted, and the device is here: no reset of it, though
                self._repair(np.asarray([row]), np.asarray([REBOOT]), np.asarray([float(now_s)]))
            for r, held in m.reasons.items():
                if held.said:
                    self._said[(row, REASONS[r])] = held.said
            for f, events in m.events.items():
                log = self.events.get(F(f))
                if log is None:
                    continue
                kept = events[-log.depth :]
                for j, (t, amount) in enumerate(kept):
                    log.times[row, j], log.amounts[row, j] = t, amount
                log.next[row] = len(kept)
            if m.verdict is not None:
                self._recalled.add(row)

    def _time_ns(self, now_ns: int, w: Window, i: int) -> int:
        """A verdict's time: the reference clock's, or (``node_time``) the device's node's."""
        return round(float(w.now_s[i]) * 1e9) if self.node_time else now_ns

    def _message(
        self,
        w: Window,
        i: int,
        row: int,
        reasons: tuple[str, ...],
        now_s: float,
        age_s: float,
        node_age_s: float,
        evidence_now: np.ndarray,
        hits: tuple[np.ndarray, int] | None = None,
    ) -> str:
        """Each reason's evidence, for what it is about (the device, its node, its job); a reason held by
        hysteresis shows the evidence it was last seen with. ``hits``: per reason, how many of the node's
        reporting devices show it, and how many report (for a node-scoped reason)."""
        node = self.registry.nodes[self.registry.node_of[row]]
        rules = self.groups.rules[self.groups.group[row]]
        ew = {r: float(rules[r]["events_window"]) for r in EVENT_REASONS}
        scopes = self.engine.scope[row]
        parts = []
        for reason in reasons:
            r = R[reason]
            if evidence_now[r] and scopes[r] == SCOPE["node"] and hits is None and (row, reason) in self._said:
                text = self._said[(row, reason)]  # (current(): the last evaluation's words, with its node's count)
            elif reason == "stale" or evidence_now[r]:
                if scopes[r] == SCOPE["workload"]:
                    text = explain_workload(w, i, reason, node, ew)
                else:
                    text = explain(
                        w, i, reason, self.window_s, node, node_age_s, age_s, self.groups.firmware_text[row], ew
                    )
                    if scopes[r] == SCOPE["node"] and hits is not None:
                        shared = f"{int(hits[0][r])} of {hits[1]} devices of node {node}"
                        text = f"{text} (on {shared} at once: {NODE_CAUSE[reason]}, not the devices)"
                self._said[(row, reason)] = text
            else:
                text = self._held_text(row, reason, now_s)
            parts.append(text)
        return "; ".join(parts) if parts else self._no_evidence

    def _held_text(self, row: int, reason: str, now_s: float) -> str:
        """A reason held without evidence now: what it was last seen with, and what clears it. Times are
        absolute (UTC): the message is stored (a taint rule's annotation, a verdict file), where "10s ago"
        would read the same an hour later."""
        eng, r = self.engine, R[reason]
        held = self._said.get((row, reason), reason)
        seen = _at(float(eng.evidence_at[row, r]))
        need = int(eng.need[row, r])
        if not need:
            return f"{held} (last evidence at {seen}; clears after {human_duration(eng.hold_s[r])} without)"
        clean = human_duration(eng.clean_after_repair_s)
        fixed_at = float(eng.repaired_at[row, need - 1])
        if fixed_at > eng.evidence_at[row, r]:
            done = _at(fixed_at)
            return f"{held} (last evidence at {seen}; {REPAIRS[need - 1]} seen at {done}, clears after {clean} clean)"
        return f"{held} (last evidence at {seen}; held until {_AWAITED[need - 1]}, then {clean} clean)"

    def _verdict(
        self,
        w: Window,
        i: int,
        row: int,
        now_ns: int,
        health: int,
        state: int,
        bits: int,
        remediation: int,
        scope: int,
        age_s: float,
        node_age_s: float,
        evidence_now: np.ndarray,
        since_ns: int | None = None,
        hits: tuple[np.ndarray, int] | None = None,
    ) -> Verdict:
        key = self.registry.keys[row]
        assert key is not None, "a verdict is built only for a registered row"
        node, hw_id = key
        attrs = self.registry.attrs[row]
        reasons = reasons_of(bits)
        message = self._message(w, i, row, reasons, now_ns / 1e9, age_s, node_age_s, evidence_now, hits)
        return Verdict(
            time_unix_nano=now_ns,
            node=node,
            hw_id=hw_id,
            health=health_name(health),
            state=state_name(state),
            reasons=reasons,
            remediation=remediation_name(remediation),
            message=message,
            pool=attrs.get(cv.DRA_POOL_NAME),
            device=attrs.get(cv.DRA_DEVICE_NAME),
            driver=attrs.get(cv.DRA_DRIVER_NAME),
            last_transition_time=int(self.engine.transition_ns[row]) if since_ns is None else since_ns,
            last_reported_time=round(self.registry.last_seen[row] * 1e9),
            scope=SCOPES[scope],
            group=group_of(SCOPES[scope], node),
        )

    def current(self) -> list[Verdict]:
        """Every known device's verdict as of the last evaluation (for /v1/devices and the metrics)."""
        if self.last_now_ns == 0:
            return []
        rows = np.flatnonzero(self.registry.active & (self.engine.key >= 0))
        if rows.size == 0:
            return []
        now_s = self.last_now_ns / 1e9
        fresh, _, age, node_age = self.freshness(now_s, rows)
        w = self._window(rows, age, fresh)
        keys = self.engine.key[rows]
        out = []
        for i, row in enumerate(rows.tolist()):
            v = VerdictMemory.of_key(int(keys[i]), 0)
            out.append(
                self._verdict(
                    w,
                    i,
                    row,
                    self._time_ns(self.last_now_ns, w, i),
                    v.health,
                    v.state,
                    v.bits,
                    v.remediation,
                    v.scope,
                    float(age[i]),
                    float(node_age[i]),
                    self.engine.on[row] & (self.engine.evidence_at[row] >= now_s),
                )
            )
        return out
