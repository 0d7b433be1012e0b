"""What the classifier must not forget across a restart, per device, in words a file can hold.

A reason held (an uncorrected ECC error holds ``memory_ecc`` until the GPU is reset; a condition, for its
hold time after its last evidence), the episodes that climb a remediation ladder, the rare events counted over an
``events_window`` (two resets within an hour) and the device's last verdict (so a restart is not a
transition) are state, not telemetry: a new process cannot read them back from the devices.
:class:`DeviceMemory` is that state for one device, keyed by ``(k8s.node.name, hw.id)``, never by
row, and bound to its ``hw.serial_number`` (another device in the slot starts clean), with names (reasons,
states, remediations, features) rather than codes, so a file outlives a
reordering of the vocabularies. Times are in the classifier's reference clock (the agent's or the
fleet's wall clock: UNIX seconds), except event times, which are in the device's own sample clock as
the event log keeps them.

:meth:`DeviceMemory.from_json` accepts exactly what :meth:`DeviceMemory.to_json` writes and raises
``ValueError`` on anything else: a file that is not ours is refused whole, never half-believed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from otel_dra import conventions as cv
from otel_dra.classifier.features import STATE_OF_CODE, F
from otel_dra.classifier.verdict import check_judgement
from otel_dra.frame import Column
from otel_dra.vocabulary import HEALTH, REASONS, REMEDIATIONS, SCOPES

#: Longest text kept for a held reason's last evidence (a message, not a log).
MAX_SAID = 1000
#: Most events kept per device and feature (the event log's depth is far below it).
MAX_EVENTS = 256


@dataclass(frozen=True)
class ReasonMemory:
    """One (device, reason)'s hysteresis and escalation state (``-inf``: never)."""

    on: bool
    evidence_at: float
    state: int  # severity code, an index of STATE_OF_CODE
    state_at: float
    floor: int  # remediation code, an index of REMEDIATIONS
    episodes: int
    first_episode_at: float
    said: str = ""  # the evidence last put in words, for the held reason's message
    scope: int = 0  # what it is about, an index of SCOPES (the device's own)
    group: str = ""  # for a link or firmware scope: the group's name (pcie/..., fabric/..., firmware/...)


def pack_key(health: Any, state: Any, bits: Any, remediation: Any, scope: Any) -> Any:
    """A verdict as one integer (scalars or arrays alike): what the engine compares to tell a change, and
    what :meth:`VerdictMemory.of_key` unpacks. Health 2 bits, state + 1 3 bits, reasons 15, remediation 3,
    scope 3."""
    return health | ((state + 1) << 2) | (bits << 5) | (remediation << 20) | (scope << 23)


@dataclass(frozen=True)
class VerdictMemory:
    """A device's last verdict, as codes, and when it last changed (unix ns)."""

    health: int
    state: int  # -1: none (Unknown)
    bits: int  # reasons bitmask, by index of REASONS
    remediation: int
    since_ns: int
    scope: int = 0  # an index of SCOPES

    @property
    def key(self) -> int:
        """The verdict engine's packed key (:func:`pack_key`)."""
        return int(pack_key(self.health, self.state, self.bits, self.remediation, self.scope))

    @classmethod
    def of_key(cls, key: int, since_ns: int) -> VerdictMemory:
        return cls(key & 3, ((key >> 2) & 7) - 1, (key >> 5) & 0x7FFF, (key >> 20) & 7, since_ns, (key >> 23) & 7)


@dataclass(frozen=True)
class DeviceMemory:
    node: str
    hw_id: str
    heard_s: float  # when it was last heard, in the reference clock
    verdict: VerdictMemory | None = None
    reasons: Mapping[int, ReasonMemory] = field(default_factory=dict)  # by index of REASONS
    events: Mapping[int, tuple[tuple[float, float], ...]] = field(default_factory=dict)  # feature -> (time, amount)
    #: hw.serial_number when the device reports one: what is held belongs to that device, not to its slot (a
    #: device with another serial under the same id starts clean).
    serial: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return self.node, self.hw_id

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"node": self.node, "id": self.hw_id, "heard": self.heard_s}
        if self.serial:
            out["serial"] = self.serial
        v = self.verdict
        if v is not None:
            out["verdict"] = {
                "health": HEALTH[v.health],
                "state": None if v.state < 0 else STATE_OF_CODE[v.state],
                "reasons": [REASONS[i] for i in range(len(REASONS)) if v.bits >> i & 1],
                "remediation": REMEDIATIONS[v.remediation],
                "since": v.since_ns,
                "scope": SCOPES[v.scope],
            }
        if self.reasons:
            out["reasons"] = {
                REASONS[r]: {
                    "on": m.on,
                    "evidence_at": _time_out(m.evidence_at),
                    "state": STATE_OF_CODE[m.state],
                    "state_at": _time_out(m.state_at),
                    "floor": REMEDIATIONS[m.floor],
                    "episodes": m.episodes,
                    "first_episode_at": _time_out(m.first_episode_at),
                    "said": m.said,
                    "scope": SCOPES[m.scope],
                    **({"group": m.group} if m.group else {}),
                }
                for r, m in sorted(self.reasons.items())
            }
        if self.events:
            out["events"] = {F(f).name.lower(): [list(e) for e in ev] for f, ev in sorted(self.events.items())}
        return out

    @classmethod
    def from_json(cls, obj: object) -> DeviceMemory:
        """Parse one device's entry; ``ValueError`` naming what is wrong."""
        d = _mapping(obj, "device", {"node", "id", "heard", "verdict", "reasons", "events", "serial"})
        node, hw_id = _text(d.get("node"), "node"), _text(d.get("id"), "id")
        if not node or not hw_id:
            raise ValueError("a device needs a node and an id")
        verdict = None
        if d.get("verdict") is not None:
            v = _mapping(d["verdict"], "verdict", {"health", "state", "reasons", "remediation", "since", "scope"})
            # The verdict line's judgement under the state file's own keys, checked as a verdict line's is.
            health, state, names, remediation, scope = check_judgement(
                "verdict",
                v.get("health"),
                v.get("state"),
                _list(v.get("reasons"), "verdict reasons"),
                v.get("remediation"),
                v.get("scope", "device"),  # (files before scopes: the device's)
            )
            since = v.get("since")
            if not isinstance(since, int) or isinstance(since, bool) or since < 0:
                raise ValueError("verdict since must be unix nanoseconds")
            verdict = VerdictMemory(
                HEALTH.index(health),
                -1 if state is None else _index(STATE_OF_CODE, state, "state"),
                sum(1 << REASONS.index(name) for name in set(names)),
                REMEDIATIONS.index(remediation),
                since,
                SCOPES.index(scope),
            )
        reasons: dict[int, ReasonMemory] = {}
        keys = {
            "on",
            "evidence_at",
            "state",
            "state_at",
            "floor",
            "episodes",
            "first_episode_at",
            "said",
            "scope",
            "group",
        }
        for name, raw in _mapping(d.get("reasons", {}), "reasons", None).items():
            m = _mapping(raw, f"reason {name}", keys)
            on, episodes, said = m.get("on"), m.get("episodes"), m.get("said", "")
            if not isinstance(on, bool):
                raise ValueError(f"reason {name}: on must be true or false")
            if not isinstance(episodes, int) or isinstance(episodes, bool) or not 0 <= episodes < 2**31:
                raise ValueError(f"reason {name}: episodes must be a count")
            reasons[_index(REASONS, name, "reason")] = ReasonMemory(
                on,
                _time_in(m.get("evidence_at"), "evidence_at"),
                _index(STATE_OF_CODE, m.get("state"), "state"),
                _time_in(m.get("state_at"), "state_at"),
                _index(REMEDIATIONS, m.get("floor"), "remediation"),
                episodes,
                _time_in(m.get("first_episode_at"), "first_episode_at"),
                _text(said, "said")[:MAX_SAID],
                _index(SCOPES, m.get("scope", "device"), "scope"),
                _text(m.get("group", ""), "group")[:MAX_SAID],
            )
        events: dict[int, tuple[tuple[float, float], ...]] = {}
        for name, raw in _mapping(d.get("events", {}), "events", None).items():
            feature = F.__members__.get(str(name).upper())
            if feature is None:
                raise ValueError(f"unknown event feature {name!r}")
            items = _list(raw, f"events {name}")
            if len(items) > MAX_EVENTS:
                raise ValueError(f"events {name}: more than {MAX_EVENTS}")
            pairs = []
            for item in items:
                pair = _list(item, f"events {name}")
                if len(pair) != 2:
                    raise ValueError(f"events {name}: each event is [time, amount]")
                t, amount = _finite(pair[0], "event time"), _finite(pair[1], "event amount")
                if amount <= 0:
                    raise ValueError(f"events {name}: amounts are positive")
                pairs.append((t, amount))
            events[int(feature)] = tuple(pairs)
        serial = _text(d.get("serial", ""), "serial")[:MAX_SAID]
        return cls(node, hw_id, _finite(d.get("heard"), "heard"), verdict, reasons, events, serial)


@dataclass(frozen=True)
class CounterBaselines:
    """Every device's last cumulative counter values, devices as rows: what a restart needs to count an error
    that happened while it was down (contract §2: a device seen for the first time brings its history, so a
    process that forgot the baseline takes the new value as one, and the error is never counted).

    Kept for every device (most are healthy, so as arrays, not per-device objects). Recalled only for a device
    heard again within the policy's window of when it was last heard, with the same serial number (a swapped
    GPU brings its own counts): after a longer silence the increase is history, not one sample's news."""

    columns: tuple[Column, ...]  # the counter columns, in the values' order
    nodes: tuple[str, ...]
    ids: tuple[str, ...]
    serials: tuple[str, ...]  # hw.serial_number, "" when the device reports none
    heard_s: np.ndarray  # when each was last heard, in the reference clock
    values: np.ndarray  # (devices, columns), NaN: no such series

    def __len__(self) -> int:
        return len(self.ids)

    def to_json(self) -> dict[str, Any]:
        """The file's ``counters`` block, its numbers as arrays: the state file is written by orjson, which writes
        them at C speed (a fleet's million values) and NaN, an absent series, as null (JSON has no NaN)."""
        return {
            "columns": [[c.metric, [list(kv) for kv in c.attrs], c.sensor, c.sensor_type] for c in self.columns],
            "nodes": list(self.nodes),
            "ids": list(self.ids),
            "serials": list(self.serials),
            "heard": np.ascontiguousarray(self.heard_s, dtype=np.float64),
            "values": np.ascontiguousarray(self.values, dtype=np.float64),
        }

    @classmethod
    def from_json(cls, obj: object) -> CounterBaselines:
        """Parse the file's ``counters`` block; ``ValueError`` naming what is wrong."""
        d = _mapping(obj, "counters", {"columns", "nodes", "ids", "serials", "heard", "values"})
        columns = []
        for raw in _list(d.get("columns"), "counters columns"):
            col = _list(raw, "a counter column")
            if len(col) != 4:
                raise ValueError("a counter column is [metric, attributes, sensor, sensor type]")
            metric, attrs, sensor, sensor_type = col
            pairs: list[tuple[str, str]] = []
            for kv in _list(attrs, "column attributes"):
                pair = _list(kv, "a column attribute")
                if len(pair) != 2:
                    raise ValueError("a column attribute is [key, value]")
                pairs.append((_text(pair[0], "a column attribute"), _text(pair[1], "a column attribute")))
            if metric not in cv.SAMPLED_METRICS:
                raise ValueError(f"counter column {metric!r} is not one of ours")
            try:
                columns.append(
                    Column(
                        metric,
                        tuple(sorted(pairs)),
                        None if sensor is None else _text(sensor, "sensor"),
                        None if sensor_type is None else _text(sensor_type, "sensor type"),
                    )
                )
            except ValueError as exc:
                raise ValueError(f"counter column: {exc}") from None
        nodes = tuple(_text(x, "a node") for x in _list(d.get("nodes"), "counters nodes"))
        ids = tuple(_text(x, "an id") for x in _list(d.get("ids"), "counters ids"))
        serials = tuple(_text(x, "a serial") for x in _list(d.get("serials"), "counters serials"))
        heard = np.asarray([_finite(x, "heard") for x in _list(d.get("heard"), "counters heard")], dtype=np.float64)
        rows = _list(d.get("values"), "counters values")
        n, k = len(ids), len(columns)
        if not len(nodes) == len(serials) == len(heard) == len(rows) == n:
            raise ValueError("counters: nodes, ids, serials, heard and values differ in length")
        values = np.full((n, k), np.nan)
        for i, row in enumerate(rows):
            items = _list(row, "a device's counters")
            if len(items) != k:
                raise ValueError(f"counters of device {i}: {len(items)} values for {k} columns")
            for j, v in enumerate(items):
                if v is not None:
                    values[i, j] = _finite(v, "a counter value")
                    if values[i, j] < 0:
                        raise ValueError("a counter value is negative")
        return cls(tuple(columns), nodes, ids, serials, heard, values)


def _mapping(obj: object, what: str, allowed: set[str] | None) -> Mapping[str, Any]:
    if not isinstance(obj, dict):
        raise ValueError(f"{what} must be an object")
    if allowed is not None and not set(obj) <= allowed:
        raise ValueError(f"{what}: unknown keys {sorted(set(obj) - allowed)}")
    return obj


def _list(obj: object, what: str) -> list[Any]:
    if not isinstance(obj, list):
        raise ValueError(f"{what} must be a list")
    return obj


def _text(obj: object, what: str) -> str:
    if not isinstance(obj, str):
        raise ValueError(f"{what} must be a string")
    return obj


def _index(names: tuple[str, ...], name: object, what: str) -> int:
    if not isinstance(name, str) or name not in names:
        raise ValueError(f"unknown {what} {name!r}")
    return names.index(name)


def _finite(obj: object, what: str) -> float:
    if isinstance(obj, bool) or not isinstance(obj, int | float) or not math.isfinite(obj):
        raise ValueError(f"{what} must be a finite number")
    return float(obj)


def _time_in(obj: object, what: str) -> float:
    """A time (UNIX seconds), or null for never."""
    return -math.inf if obj is None else _finite(obj, what)


def _time_out(t: float) -> float | None:
    return t if math.isfinite(t) else None
