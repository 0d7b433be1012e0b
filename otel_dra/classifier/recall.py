"""Remember and recall: what the classifier hands a state file, and takes back from one after a restart.

What is kept is :mod:`otel_dra.classifier.memory`'s: per device, its last verdict, held reasons and escalation
episodes with the words they were last said with, and its logged events; and every device's counter baselines.
Memory is recalled before the first ingest and given to each device when it is first heard again, so a
restart is neither a transition nor a repair (except, on the agent, a reboot of the node it runs on).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import replace

import numpy as np

from otel_dra import conventions as cv
from otel_dra.classifier.engine import REBOOT, VerdictEngine
from otel_dra.classifier.events import EventLog
from otel_dra.classifier.features import F, FeatureExtractor
from otel_dra.classifier.memory import CounterBaselines, DeviceMemory, VerdictMemory
from otel_dra.classifier.messages import VerdictWriter
from otel_dra.classifier.numeric import flatnonzero
from otel_dra.classifier.registry import DeviceRegistry
from otel_dra.frame import Schema
from otel_dra.policy import Policy
from otel_dra.vocabulary import REASONS

#: The verdict engine's key of Healthy, ok, no reasons, no remediation.
_HEALTHY_OK = VerdictMemory(0, 0, 0, 0, 0).key
#: Reasons that keep a silent device past ``device_ttl``: what it held, not its silence itself.
HELD_BY_SILENT = np.asarray([r not in ("device_lost", "stale") for r in REASONS])

#: ``(rows, repair kinds, heard s)``: repairs seen, as the ingest notes them.
Repair = Callable[[np.ndarray, np.ndarray, np.ndarray], None]


def silent_ttl_s(policy: Policy, held: bool) -> float:
    """How long a silent device is remembered: the policy's ``device_ttl``; holding a reason, at least the
    escalation window (silence does not repair)."""
    return max(policy.device_ttl_s, policy.escalation.window_s) if held else policy.device_ttl_s


class RestartMemory:
    """The classifier's memory across restarts, out (:meth:`remember`, :meth:`baselines`) and back in
    (:meth:`recall`, :meth:`recall_baselines`, then :meth:`recall_rows` as devices are heard again).

    ``repair``: with ``restart_repairs`` (this process runs on the devices' node: its restart, the devices
    present again, is the ``reboot_node`` repair of what they held), how a recalled device is repaired."""

    def __init__(
        self,
        policy: Policy,
        schema: Schema,
        registry: DeviceRegistry,
        engine: VerdictEngine,
        extractor: FeatureExtractor,
        events: dict[F, EventLog],
        writer: VerdictWriter,
        restart_repairs: bool,
        repair: Repair,
    ) -> None:
        self.policy = policy
        self.schema = schema
        self.registry = registry
        self.engine = engine
        self.extractor = extractor
        self.events = events
        self.writer = writer
        self.restart_repairs = restart_repairs
        self.repair = repair
        self.window_s = policy.window_s
        self._memory: dict[tuple[str, str], DeviceMemory] = {}  # recalled, for devices not heard again yet
        self._recalled: set[int] = set()  # rows given their memory, whose verdict is not out yet
        self._baselines: CounterBaselines | None = None  # recalled counter baselines (see recall_baselines)
        self._baseline_index: dict[tuple[str, str], int] = {}  # ... of the devices not heard again yet

    @property
    def waiting(self) -> bool:
        """Whether some device's memory waits for it to be heard again."""
        return bool(self._memory or self._baseline_index)

    def forget(self, rows: np.ndarray) -> None:
        """The registry released ``rows``."""
        self._recalled -= set(rows.tolist())

    def renumber(self, new_of: dict[int, int]) -> None:
        """The registry compacted: row ``old`` is now ``new_of[old]`` (absent: gone)."""
        self._recalled = {new_of[row] for row in self._recalled if row in new_of}

    # -- out ----------------------------------------------------------------------------------------
    def remember(self, now_s: float) -> list[DeviceMemory]:
        """What a restart must not forget, per device (see :mod:`otel_dra.classifier.memory`): the last
        verdict of every device that is not Healthy and ok, held reasons and escalation episodes,
        logged events; and the recalled memory of devices not heard again yet, while within the policy's
        ``device_ttl`` (a failure it holds: the escalation window)."""
        out = self._memories(flatnonzero(self.registry.active), now_s)
        out.extend(m for m in self._memory.values() if self._kept(m, now_s))
        return out

    def _kept(self, m: DeviceMemory, now_s: float) -> bool:
        """Whether a silent device's memory is still kept at ``now_s``: for the policy's ``device_ttl``; one that
        holds a reason for the escalation window (if it comes back unrepaired, its failure comes back with it:
        silence does not repair)."""
        held = any(r.on and HELD_BY_SILENT[i] for i, r in m.reasons.items())
        return now_s - m.heard_s <= silent_ttl_s(self.policy, held)

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
            said = {r: replace(m, said=self.writer.said.get((row, REASONS[r]), "")) for r, m in held.items()}
            events: dict[int, tuple[tuple[float, float], ...]] = {}
            for feature, log in logged.get(row, []):
                events[feature] = log.history(row)
            # A Healthy, ok device has nothing to keep: after a restart its first verdict is a first verdict.
            verdict = VerdictMemory.of_key(keys[i], since[i]) if keys[i] >= 0 and keys[i] != _HEALTHY_OK else None
            if verdict is not None or said or events:
                serial = reg.attrs[row].get(cv.HW_SERIAL_NUMBER, "")
                out.append(DeviceMemory(key[0], key[1], float(heard[i]), verdict, said, events, serial))
        return out

    def baselines(self) -> CounterBaselines:
        """Every device's counter baselines (see :class:`~otel_dra.classifier.memory.CounterBaselines`), for the
        state file beside :meth:`remember`."""
        reg, ex = self.registry, self.extractor
        plan = ex.plan()
        k = int(plan.counter_cols.size)
        rows = flatnonzero(reg.active & ~np.isnan(reg.last_heard))
        values = ex.prev[rows, :k]
        held = ~np.isnan(values).all(axis=1)  # (a device with some baseline)
        rows, values = rows[held], values[held]
        keys = [reg.keys[row] or ("", "") for row in rows.tolist()]
        return CounterBaselines(
            columns=tuple(self.schema.columns[c] for c in plan.counter_cols.tolist()),
            nodes=tuple(node for node, _ in keys),
            ids=tuple(hw_id for _, hw_id in keys),
            serials=tuple(reg.attrs[row].get(cv.HW_SERIAL_NUMBER, "") for row in rows.tolist()),
            heard_s=reg.last_heard[rows].copy(),
            values=values.copy(),
        )

    # -- back in ------------------------------------------------------------------------------------
    def recall(self, memories: Iterable[DeviceMemory], now_s: float) -> int:
        """Take back what :meth:`remember` gave (a previous process's), before the first ingest: each
        device gets its memory when it is first heard again. Devices not heard for the policy's
        ``device_ttl`` (they would have been forgotten by now; one holding a failure: the escalation window)
        and devices already heard are left out. Returns how many devices' memory is waiting."""
        for m in memories:
            if self._kept(m, now_s) and self.registry.row(m.node, m.hw_id) is None:
                self._memory[m.key] = m
        return len(self._memory)

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

    def recall_rows(self, rows: np.ndarray, heard_s: np.ndarray) -> None:
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
            self.engine.recall(row, dict(m.reasons), m.verdict, float(now_s), m.node)
            if self.restart_repairs:  # this agent restarted, and the device is here: no reset of it, though
                self.repair(np.asarray([row]), np.asarray([REBOOT]), np.asarray([float(now_s)]))
            for r, held in m.reasons.items():
                if held.said:
                    self.writer.said[(row, REASONS[r])] = held.said
            for f, events in m.events.items():
                log = self.events.get(F(f))
                if log is None:
                    continue
                log.restore(row, events)
            if m.verdict is not None:
                self._recalled.add(row)

    def first_verdicts(self, rows: np.ndarray, changed: np.ndarray) -> np.ndarray:
        """Which of the evaluated ``rows`` have a verdict out: those that ``changed``, and a recalled device's
        first verdict even when it did not change."""
        if not self._recalled:
            return changed
        emit = changed | np.isin(rows, np.fromiter(self._recalled, dtype=np.int64))
        self._recalled.difference_update(rows.tolist())
        return emit

    def expire_baselines(self, now_s: float) -> None:
        """The devices not heard again within a window of their recalled baselines start afresh."""
        if self._baselines is not None and now_s - float(self._baselines.heard_s.max(initial=0.0)) > self.window_s:
            self._baselines, self._baseline_index = None, {}
