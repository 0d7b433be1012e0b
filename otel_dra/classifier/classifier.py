"""The classifier: frames of device telemetry in, the verdicts that changed out.

It owns the per-device stores (windows, long horizon, event logs, verdict engine, ...) and runs a sample
through them (ingest) and the rules over them (evaluate). What is not that is a collaborator of its own:
the batch and its rows (:mod:`~otel_dra.classifier.batch`), freshness and pacing
(:mod:`~otel_dra.classifier.freshness`), memory across restarts (:mod:`~otel_dra.classifier.recall`) and
the verdicts' words (:mod:`~otel_dra.classifier.messages`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Protocol

import numpy as np

from otel_dra.classifier.batch import Batch, DeviceRows
from otel_dra.classifier.engine import REBOOT, RESET, VerdictEngine
from otel_dra.classifier.events import EventLog
from otel_dra.classifier.features import N_FEATURES, STATE_CODE, F, FeatureExtractor
from otel_dra.classifier.firmware_rates import FirmwareRates
from otel_dra.classifier.freshness import Freshness
from otel_dra.classifier.group_memory import GroupMemory
from otel_dra.classifier.horizon import HorizonStore
from otel_dra.classifier.layout import EVENT_FEATURES, HORIZON_FEATURES, R
from otel_dra.classifier.memory import CounterBaselines, DeviceMemory, VerdictMemory
from otel_dra.classifier.messages import Shared, VerdictWriter
from otel_dra.classifier.numeric import any_of, flatnonzero, shaped
from otel_dra.classifier.params import PolicyGroups
from otel_dra.classifier.peers import PeerHistory
from otel_dra.classifier.reader import Window
from otel_dra.classifier.recall import HELD_BY_SILENT, RestartMemory, silent_ttl_s
from otel_dra.classifier.registry import DeviceRegistry
from otel_dra.classifier.rows import RowIndex
from otel_dra.classifier.rules import evaluate
from otel_dra.classifier.topology import Topology
from otel_dra.classifier.verdict import Verdict
from otel_dra.classifier.window import WindowStore, window_samples
from otel_dra.classifier.workload import WorkloadSplit
from otel_dra.frame import Frame, Schema
from otel_dra.policy import EVENT_LOG_DEPTH, Policy
from otel_dra.vocabulary import REASONS


class _RowState(Protocol):
    """Per-row state that follows the registry: grown with its capacity (or compacted to the rows
    ``keep``), cleared with its rows."""

    def resize(self, capacity: int, keep: np.ndarray | None = None) -> None: ...

    def clear(self, rows: np.ndarray) -> None: ...


def _seconds(
    rows: np.ndarray, time_unix_nano: int | np.ndarray, arrival_unix_nano: int | np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Samples' times and arrivals (one, or one per row; default: arrived when taken) in unix seconds, per row."""
    t = shaped(np.asarray(time_unix_nano, dtype=np.int64) / 1e9, rows.shape)
    heard = t if arrival_unix_nano is None else np.asarray(arrival_unix_nano, dtype=np.int64) / 1e9
    return t, shaped(heard, rows.shape)


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
        self.store = WindowStore(N_FEATURES, window_samples(policy.window_s, interval_s), cap, policy.window_s)
        spans = (policy.horizon.duty_buckets, policy.horizon.rate_buckets)
        self.horizon = HorizonStore(len(HORIZON_FEATURES), policy.horizon.bucket_s, spans, cap)
        self._horizon_cols = np.asarray(HORIZON_FEATURES, dtype=np.intp)
        self._event_cols = np.asarray(EVENT_FEATURES, dtype=np.intp)
        # What a sample's checks look for (_quiet): an event, a counter restart or a reset (the repairs).
        self._eventful_cols = np.asarray([*EVENT_FEATURES, F.RESTARTS], dtype=np.intp)
        self.extractor = FeatureExtractor(self.schema, cap)
        self.groups = PolicyGroups(policy, cap)
        self.topology = Topology(cap)
        self.firmware_rates = FirmwareRates(policy.firmware, self.topology.groups, cap, policy.window_s)
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
            policy.link.remediation,
            self.topology.groups,
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
            self.topology,
            self.firmware_rates,
            self.engine,
            self.workload,
            self.peers,
        ]
        for part in parts + list(self.events.values()):
            self.registry.on_resize(part.resize)
            self.registry.on_clear(part.clear)
        self.last_now_ns = 0
        self.ingested_samples = 0
        # Collaborators: freshness and pacing, each sample's device row, verdicts in words, memory across restarts.
        self.freshness = Freshness(policy, self.registry, self.store, interval_s)
        self.device_rows = DeviceRows(self.registry, self.groups, self._regrouped, self.topology)
        self.writer = VerdictWriter(self.registry, self.groups, self.engine, self.window_s, self.firmware_rates)
        self.memory = RestartMemory(
            policy,
            self.schema,
            self.registry,
            self.engine,
            self.extractor,
            self.events,
            self.writer,
            restart_repairs,
            self._repair,
        )
        self.registry.on_release(self._forget)
        self.registry.on_resize(self._renumber)
        #: Called with each evaluation's changed verdicts, on the evaluating thread (the state store).
        self.evaluated: list[Callable[[list[Verdict]], None]] = []

    def _regrouped(self) -> None:
        """A device's policy group may have changed: the ladders are read again at the next evaluation."""
        self._ladders = None

    def _forget(self, rows: np.ndarray) -> None:
        """The registry released ``rows``."""
        self.writer.forget(rows)
        self.memory.forget(rows)

    def _renumber(self, capacity: int, keep: np.ndarray | None) -> None:
        """The registry compacted: new row ``i`` was row ``keep[i]``; nodes with no device left are gone."""
        if keep is None:
            return
        new_of = {old: new for new, old in enumerate(keep.tolist())}
        self.writer.renumber(new_of)
        self.memory.renumber(new_of)
        self.device_rows.keep_nodes()

    # -- ingest --------------------------------------------------------------------------------
    def ingest(self, frame: Frame, arrival_unix_nano: int | None = None) -> None:
        """One node's sample. Devices whose row is all NaN were not read this time: no sample.
        ``arrival_unix_nano``: when it was heard, in the reference clock (default: its own time)."""
        self.ingest_many([frame], None if arrival_unix_nano is None else [arrival_unix_nano])

    def ingest_many(self, frames: list[Frame], arrivals_unix_nano: list[int] | int | None = None) -> None:
        """Samples of many nodes (a tick of a fleet, a batch of OTLP requests), ingested as one
        batch whatever their times: the per-sample work runs once for all their devices. A device
        sampled more than once in the batch gets its samples in order, one round each.
        ``arrivals_unix_nano``: when each frame (or all of them) was heard, in the reference clock;
        default: each frame's own time (an agent reading its own devices)."""
        self.ingest_batch(Batch.of(frames, arrivals_unix_nano, len(self.schema)))

    def ingest_batch(self, batch: Batch | None) -> None:
        """A batch of frames made already (:meth:`Batch.of_parts`: a replay's decode process sends its frames'
        parts), ingested as :meth:`ingest_many` does (None: no frame held a sample)."""
        if batch is None:
            return
        samples = batch.samples(*self.device_rows.of(batch))
        if samples.rows.size == 0:
            return
        rounds = samples.rounds(ordered=len(batch.tables) == 1) if batch.rounds is None else batch.rounds or None
        if rounds is None or self.memory.waiting:  # (a device's memory is recalled as each round hears it: in turn)
            for s in [samples] if rounds is None else [samples.picked(at) for at in rounds]:
                self.ingest_rows(s.rows, s.new, s.times, s.values, s.arrivals)
            return
        # One round a sample of a device, in order; the sample stage's work that carries nothing from one sample to
        # the next is done once for all of them (FeatureExtractor.extract), then each round goes into the stores.
        rows = samples.rows
        t, heard = _seconds(rows, samples.times, samples.arrivals)
        parts = [(RowIndex(rows[at]), at) for at in rounds]  # how each round's rows are read and written
        feats = self.extractor.extract(rows, samples.new, t, samples.values, self.groups.device_params(rows), parts)
        quiet = self._quiet(feats)  # (one look for events, restarts and resets, not one a round)
        for ix, at in parts:
            self._store(ix, t[at], heard[at], feats[:, at], quiet)
        first, at = parts[0]  # (every device's first sample is in the first round)
        self._stamp(rows, t, heard, first, t[at])

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
        t, heard = _seconds(rows, time_unix_nano, arrival_unix_nano)
        if self.memory.waiting and any_of(new):
            self.memory.recall_rows(rows[new], heard[new])
        ix = RowIndex(rows)  # how the stores read and write this batch's rows, worked out once
        feats = self.extractor.extract(ix, new, t, values, self.groups.device_params(rows))
        self._store(ix, t, heard, feats, self._quiet(feats))
        self._stamp(rows, t, heard, ix, t)

    def _quiet(self, feats: np.ndarray) -> bool:
        """Whether no sample of ``feats`` holds an event, a counter restart or a reset (most batches): then the
        stores take them without a look for repairs, a job's crash or the event logs' samples (a few numpy calls
        each, a round: most of a small fleet's store), and the workload's event features are zero, as
        :meth:`WorkloadSplit.split` leaves them where it moved nothing."""
        if any_of(feats[self._eventful_cols] > 0):  # (NaN: none read)
            return False
        self.workload.none_moved(feats)
        return True

    def _store(self, ix: RowIndex, t: np.ndarray, heard: np.ndarray, feats: np.ndarray, quiet: bool) -> None:
        """One sample's features for each of ``ix``'s rows (unique), taken at ``t`` and heard at ``heard`` (unix s,
        one a row): the repairs it shows, the window, the long horizon and the event logs (``quiet``: the batch
        holds no event, restart or reset, :meth:`_quiet`)."""
        rows = ix.rows
        reg = self.registry
        if not quiet:
            self._note_repairs(rows, feats, heard)
            self.workload.split(rows, reg.node_of, reg.active, t, feats, self.events)
        self.store.append(ix, t, feats)
        self.horizon.append(ix, t, feats[self._horizon_cols])
        if not quiet:
            logged = feats[self._event_cols] > 0  # (NaN: none read) the logs that have an event, alone
            for i in flatnonzero(np.any(logged, axis=1)).tolist():
                f = EVENT_FEATURES[i]
                self.events[f].record(rows, t, feats[f])
        self.ingested_samples += int(rows.size)

    def _stamp(self, rows: np.ndarray, t: np.ndarray, heard: np.ndarray, firsts: RowIndex, first_t: np.ndarray) -> None:
        """The registry's times of a batch's samples, once they are stored (``rows`` repeat where a device was sampled
        more than once): each device's newest time and arrival, and its first time where it had none (``firsts``:
        the rows of each device's first sample of the batch, taken at ``first_t``)."""
        reg = self.registry
        np.fmax.at(reg.last_seen, rows, t)  # (a device's samples in any order: the newest)
        np.fmax.at(reg.last_heard, rows, heard)
        first = firsts.take(reg.first_seen)
        firsts.put(reg.first_seen, np.where(np.isnan(first), first_t, first))

    def _note_repairs(self, rows: np.ndarray, feats: np.ndarray, heard_s: np.ndarray) -> None:
        """The repairs this sample shows (the policy's ``clears``): a reset event or the device's counters
        starting over is a reset; counters starting over on more than half of a node's devices at once, a reboot
        of the node (or a restart of its driver or agent). A device that held a failure only a repair clears
        begins a new window at its repair: what the old one held was the device before it."""
        restarted = feats[F.RESTARTS] > 0
        reset = restarted | (feats[F.RESETS] > 0)
        if not any_of(reset):
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

    # -- freshness and pacing (see Freshness) ----------------------------------------------------
    def intervals(self, rows: np.ndarray | slice) -> np.ndarray:
        """Each row's sampling interval as its window shows it (NaN until it has two samples)."""
        return self.freshness.intervals(rows)

    def pace(self, every_s: float, monotonic: float | None = None) -> float:
        """Called once a pass by a loop that evaluates every ``every_s`` seconds, before the pass's
        evaluation; returns how late the pass is when that makes it a stall (seconds; 0.0 when not):
        see :meth:`Freshness.pace`."""
        return self.freshness.pace(every_s, self.last_now_ns, monotonic)

    # -- evaluate ------------------------------------------------------------------------------
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
        in_grace = self.freshness.grace(now_s)
        rows = flatnonzero(self.registry.active)
        if rows.size == 0:
            self._evaluated([])
            return []
        fresh, node_fresh, age, node_age = self.freshness.of(now_s, rows)
        lost = ~fresh & node_fresh
        unknown = ~node_fresh
        w = self._window(rows, age, fresh)
        version = self.topology.firmware[rows]
        recent = self.engine.recent(rows, now_s, self.window_s) if self.topology.any_links else None
        evidence = evaluate(w, self.groups, fresh, lost, self.topology, self.firmware_rates.named(version), recent)
        peers = w.thermal_peers()
        # Learnt from: judged now, neither hotter than its bar nor held hot (a fault is not its normal).
        learn = peers.judged & ~peers.hot & ~w.on[:, R["thermal"]]
        tau = w.params.thermal.peers.baseline_tau
        excess = peers.residuals.residual + peers.residuals.offset  # over its node's devices (PeerHistory)
        self.peers.update(rows, w.now_s, peers.hot, peers.judged, excess, learn, tau)
        if self._ladders is None:
            self._ladders = self.groups.ladders()
        health, state, bits, remediation, scope, changed = self.engine.step(
            rows, now_s, evidence, unknown, self.unhealthy, self._ladders, self.groups.group[rows]
        )
        eng = self.engine
        self.firmware_rates.observe(rows, now_s, version, fresh | lost, eng.on[rows], eng.state[rows], eng.scope[rows])
        out = []
        emit = self.memory.first_verdicts(rows, changed)
        for i in flatnonzero(emit).tolist():
            row = int(rows[i])
            at_ns = self._time_ns(now_ns, w, i)
            if changed[i]:
                self.engine.transition_ns[row] = at_ns
            out.append(
                self.writer.verdict(
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
                    Shared(evidence, i),
                )
            )
        self.memory.expire_baselines(now_s)
        # A device is forgotten for silence the fleet heard, not for its own stall; the arrays of a fleet that
        # shrank shrink with it.
        if not in_grace:
            self._expire(now_s)
        self._evaluated(out)
        return out

    def _time_ns(self, now_ns: int, w: Window, i: int) -> int:
        """A verdict's time: the reference clock's, or (``node_time``) the device's node's."""
        return round(float(w.now_s[i]) * 1e9) if self.node_time else now_ns

    def _expire(self, now_s: float) -> None:
        """Forget the devices silent for the policy's ``device_ttl`` (their rows are reused, their verdicts
        leave the board); one that holds a reason, for the escalation window: silence does not repair, so it
        stays (Unknown, what it holds beside ``stale``) in case it comes back unrepaired."""
        held = self.engine.on[:, HELD_BY_SILENT].any(axis=1)
        ttl = np.where(held, silent_ttl_s(self.policy, True), silent_ttl_s(self.policy, False))
        if self.registry.expire(now_s, ttl).size:
            self.registry.compact()

    def _evaluated(self, changed: list[Verdict]) -> None:
        for hook in self.evaluated:
            hook(changed)

    def current(self) -> list[Verdict]:
        """Every known device's verdict as of the last evaluation (for /v1/devices and the metrics)."""
        if self.last_now_ns == 0:
            return []
        rows = flatnonzero(self.registry.active & (self.engine.key >= 0))
        if rows.size == 0:
            return []
        now_s = self.last_now_ns / 1e9
        fresh, _, age, node_age = self.freshness.of(now_s, rows)
        w = self._window(rows, age, fresh)
        keys = self.engine.key[rows]
        out = []
        for i, row in enumerate(rows.tolist()):
            v = VerdictMemory.of_key(int(keys[i]), 0)
            out.append(
                self.writer.verdict(
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

    # -- memory across restarts (see RestartMemory) ----------------------------------------------
    def remember(self, now_s: float) -> list[DeviceMemory]:
        """What a restart must not forget, per device (:meth:`RestartMemory.remember`); on the evaluating
        thread (between evaluations)."""
        return self.memory.remember(now_s)

    def recall(self, memories: Iterable[DeviceMemory], now_s: float) -> int:
        """Take back what :meth:`remember` gave (a previous process's), before the first ingest
        (:meth:`RestartMemory.recall`); returns how many devices' memory is waiting."""
        return self.memory.recall(memories, now_s)

    def baselines(self) -> CounterBaselines:
        """Every device's counter baselines, for the state file beside :meth:`remember`; on the evaluating
        thread."""
        return self.memory.baselines()

    def group_memory(self, now_s: float) -> GroupMemory:
        """What the state file keeps of what devices share: the firmware versions' events and exposure over the
        horizon (days of it: a restart must not start the count again) and the link groups' escalation."""
        return GroupMemory(self.firmware_rates.history(now_s), self.engine.link_memory(now_s))

    def recall_groups(self, memory: GroupMemory | None, now_s: float) -> None:
        """Take back what :meth:`group_memory` gave (a previous process's), before the first ingest."""
        if memory is not None:
            self.firmware_rates.recall(memory.firmware, now_s)
            self.engine.recall_links(memory.links, now_s)

    def recall_baselines(self, baselines: CounterBaselines | None) -> None:
        """Take back what :meth:`baselines` gave (a previous process's), before the first ingest
        (:meth:`RestartMemory.recall_baselines`)."""
        self.memory.recall_baselines(baselines)
