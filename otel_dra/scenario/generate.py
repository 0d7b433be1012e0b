"""``otel-dra simulate``: a messy GPU fleet as an OTLP JSON lines recording, and its labels.

A policy tuned on one tidy recording fails on the next fleet. This generator draws a new
fleet per seed: several GPU models with their own limits and background rates (one with no
limits at all), per-node sampling intervals with jitter, per-node clock skew, every fault
kind of the contract (hard, soft, slow, intermittent) at random devices and times, traps
that must not be flagged, a shared network device and a silent node. The labels say what a
classifier must find, by when, in each node's own clock. ``load`` puts the GPUs to work
(:mod:`otel_dra.scenario.load`: training jobs, inference replicas, their crashes) and adds the
faults that show only under load; ``idle``, the default, writes what it always wrote.

How it is fast: the fleet is one state matrix (devices as rows, series as columns) stepped
once per second with numpy; a node's line is one ``%`` format of a per-node template (the
attribute JSON never changes between lines, only values and stamps do), and gzip runs on a
second thread (zlib releases the GIL), so formatting and compression overlap.
"""

from __future__ import annotations

import gzip
import json
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final

import numpy as np

from otel_dra import conventions as cv
from otel_dra.scenario import load as wl
from otel_dra.scenario.load import PROFILES
from otel_dra.scenario.models import DRIVER_CODES, KEY, METRIC_ORDER, SERIES, STATUS_STATES
from otel_dra.scenario.plan import (
    FAULT_KINDS,
    GPUS_PER_COPY,
    KIND,
    LOST_KINDS,
    T0_NS,
    US,
    Event,
    Fault,
    Node,
    Plan,
    devices_needed,
    make_plan,
)

SHAPES: Final = ("mixed", "tidy")
MIN_NODES: Final = 6
MAX_NODES: Final = 1000
MAX_DEVICES_PER_NODE: Final = 16
#: A 15-minute healthy warm-up, then room for a 30-minute deadline.
MIN_DURATION_S: Final = 3000
MAX_DURATION_S: Final = 86400
SERVICE_NAME: Final = "otel-dra-scenario"
SCOPE_NAME: Final = "otel-dra.scenario"
LABELS_VERSION: Final = 1


@dataclass(frozen=True)
class ScenarioConfig:
    """One scenario: fleet size, length, seed and shape ("mixed": the messy fleet; "tidy": one
    model, one 10 s interval, no jitter or skew), what the GPUs run (``load``) and whether faults are
    placed. Validated on construction."""

    nodes: int = 12
    devices_per_node: int = 4
    duration_s: int = 3000
    seed: int = 0
    shape: str = "mixed"
    #: What the GPUs run (load.PROFILES): idle (as before profiles), training, inference or mixed.
    load: str = "idle"
    #: Place the fault kinds (False: a healthy fleet, traps and oddities only: what a base-rate benchmark replays).
    faults: bool = True

    def __post_init__(self) -> None:
        for name in ("nodes", "devices_per_node", "duration_s", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | np.integer):
                raise ValueError(f"{name} must be a whole number, got {value!r}")
            object.__setattr__(self, name, int(value))  # numpy integers too: the labels are JSON
        if not MIN_NODES <= self.nodes <= MAX_NODES:
            raise ValueError(f"nodes must be {MIN_NODES} to {MAX_NODES}, got {self.nodes}")
        if not 1 <= self.devices_per_node <= MAX_DEVICES_PER_NODE:
            raise ValueError(f"devices per node must be 1 to {MAX_DEVICES_PER_NODE}, got {self.devices_per_node}")
        if not MIN_DURATION_S <= self.duration_s <= MAX_DURATION_S:
            raise ValueError(
                f"duration must be {MIN_DURATION_S // 60} minutes to {MAX_DURATION_S // 3600} hours, got "
                f"{self.duration_s} s (a 15-minute warm-up, then room for every fault's deadline)"
            )
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be 0 or more, got {self.seed}")
        if self.shape not in SHAPES:
            raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {self.shape!r}")
        if self.load not in PROFILES:
            raise ValueError(f"load must be one of {', '.join(PROFILES)}, got {self.load!r}")
        if not isinstance(self.faults, bool):
            raise ValueError(f"faults must be true or false, got {self.faults!r}")
        gpus = self.nodes * self.devices_per_node
        usable = (self.nodes - 2) * self.devices_per_node  # the silent and the restarted node hold none
        needed = devices_needed(gpus, self.load, self.faults, self.devices_per_node)
        if usable < needed:
            under = f" under --load {self.load}" if self.load != "idle" else ""
            raise ValueError(
                f"{self.nodes} nodes x {self.devices_per_node} GPUs is too small for every fault and trap{under} "
                f"(needs {needed} GPUs outside the silent and the restarted node, has {usable}): "
                "raise nodes or devices per node"
            )

    @property
    def gpus(self) -> int:
        return self.nodes * self.devices_per_node


#: Named sizes. "short" (CI) covers every category at least once in a few seconds; "long" is the bench form.
FORMS: Final[dict[str, ScenarioConfig]] = {
    "short": ScenarioConfig(nodes=12, devices_per_node=4, duration_s=3000),
    "long": ScenarioConfig(nodes=64, devices_per_node=8, duration_s=7200),
}


@dataclass(frozen=True)
class GenerateResult:
    """What a generation wrote."""

    recording: Path
    labels: Path
    lines: int
    points: int
    bytes: int
    seconds: float
    nodes: int
    devices: int
    faults: int
    traps: int


def labels_path_for(recording: Path) -> Path:
    """``fleet.jsonl.gz`` -> ``fleet.labels.json`` (beside it)."""
    name = recording.name
    for suffix in (".gz", ".jsonl", ".json"):
        if name.endswith(suffix) and len(name) > len(suffix):
            name = name[: -len(suffix)]
    return recording.with_name(name + ".labels.json")


def _phase(t: float, on: np.ndarray, period: np.ndarray, duty: np.ndarray) -> np.ndarray:
    """Rows whose intermittent fault is in its on part at ``t``."""
    since = t - on
    return (since >= 0) & (np.mod(since, period) < duty * period)


_POISSON = np.array([KEY[k] for k in ("err.corrected", "err.link.pcie", "err.link.nvlink", "err.link.xgmi")])
_POISSON = np.append(_POISSON, KEY["err.link.other"])
_COUNTERS = np.array([i for i, s in enumerate(SERIES) if s.monotonic])
_DRIVERS = np.array([KEY[f"err.driver.{c}"] for c in DRIVER_CODES])
_STATUS = np.array([KEY[f"status.{s}"] for s in STATUS_STATES])


class _Sim:
    """The fleet's state, devices as rows: one :meth:`step` per second of true time."""

    def __init__(self, plan: Plan, rng: np.random.Generator) -> None:
        self.plan, self.p, self.rng = plan, plan.params, rng
        self.V = np.ascontiguousarray(plan.initial.copy())
        self.flat = self.V.reshape(-1)
        n = len(plan.devices)
        self.on = np.zeros(self.V.shape, bool)
        for d in plan.devices:
            self.on[d.row, [KEY[k] for k in d.series]] = True
        self.on[:, _DRIVERS] = self.V[:, _DRIVERS] > 0  # XID series from before the recording
        self.present = self.p["present"].copy()
        self.job = self.p["job"].copy()
        self.util = self.job.copy()
        self.mem = self.p["mem"].copy()
        p = self.p
        self.temp = p["ambient"] + p["r"] * (p["idle"] + self.job * (0.9 * p["cap"] - p["idle"]))
        self.rows = np.arange(n)
        self.node_start = [node.agent_start_ns for node in plan.nodes]
        self.start_override: dict[tuple[int, int], int] = {}
        self.version = [0] * len(plan.nodes)
        self.alpha = 1.0 - np.exp(-1.0 / p["tau"])  # the temperature's first-order lag over one second
        # Under load the job model drives the busy nodes' GPUs (plan.workload; None: idle, the code as before).
        self.load = plan.workload
        self.managed = self.load.managed if self.load is not None else np.zeros(n, bool)
        self.gen_max = plan.initial[:, KEY["pcie.gen"]].copy()
        self.tells_causes = self.on[:, KEY["throttle.power_cap"]].copy()  # reports power_cap, not power
        self.step(0, 0.0)

    def step(self, t: int, dt: float) -> None:
        """Advance to grid second ``t`` (``dt`` seconds after the last step: 1, or 0 for the first)."""
        p, rng, V, n = self.p, self.rng, self.V, len(self.job)
        lo, hi = np.maximum, np.minimum  # np.clip costs more than both on arrays this small
        z = rng.standard_normal((7, n))
        u = rng.random((3, n))
        if dt > 0:
            change = (u[0] < dt / 900.0) & ~p["steady"]
            self.job = np.where(change, 0.35 + 0.6 * u[1], self.job)
        decay = np.exp(-dt / 20.0)
        self.util = hi(lo(self.job + (self.util - self.job) * decay + 0.01 * z[0], 0.02), 1.0)
        s = self.load.step(float(t)) if self.load is not None else None
        m = self.managed
        util = self.util if s is None else np.where(m, s.util, self.util)

        # Power: demand from utilization, held down by the device's own thermal throttling, pinned at the
        # cap while power-throttled.
        cap, idle = p["cap"], p["idle"]
        throttled = (t >= p["throttle_on"]) | _phase(t, p["cycle_on"], p["cycle_period"], p["cycle_duty"])
        demand = idle + self.util * (0.9 * cap - idle) + 0.004 * z[1] * cap
        hot = self.temp - p["throttle_c"]
        power = hi(demand * lo(1.0 - 0.06 * lo(hot, 0.0), 0.6), cap)
        power = np.where(throttled, cap * (1.0 - 0.004 * u[1]), power)
        if s is not None:  # under load: the job's demand under the device's limit (lowered by a throttling fault)
            limit = np.where(throttled, cap * p["limit_factor"], cap)
            brake_w = np.where(m & (t >= p["brake_on"]), p["brake_w"], np.nan)
            slowing = t >= p["slow_on"]
            slowdown = slowing & (np.mod(t + p["slow_phase"], 60.0) < p["slow_share"] * 60.0)
            derate = lo(1.0 - 0.06 * lo(hot, 0.0), 0.6)
            th = wl.power_and_throttle(
                s, limit, dt, derate, brake_w, p["brake_share"], slowdown, np.where(slowing, p["slow_share"], 0.0)
            )
            power = np.where(m, th.power_w, power)

        # Cooling: the fan follows temperature, limited by what a decaying or stalled fan can still do;
        # less airflow, more heat. Drift and excursions add heat the fan can't remove.
        capability = hi(lo(1.0 - (t - p["fan_decay_on"]) / p["fan_decay_len"], 0.0), 1.0)
        capability = np.where(_phase(t, p["stall_on"], p["stall_period"], p["stall_duty"]), 0.0, capability)
        controller = hi(lo(0.35 + (self.temp - 45.0) / 80.0, 0.35), 1.0)
        ratio = hi(lo(controller * capability + 0.002 * z[2], 0.0), 1.0)
        cool = 1.0 + 1.3 * lo(1.0 - ratio / 0.35, 0.0)
        extra = p["drift_extra"] * hi(lo((t - p["drift_on"]) / p["drift_len"], 0.0), 1.0)
        excursion = _phase(t, p["excursion_on"], p["excursion_period"], p["excursion_duty"])
        extra = extra + np.where(excursion, p["excursion_extra"], 0.0)
        r = p["r"] if s is None else np.where(t >= p["hot_on"], p["r_hot"], p["r"])  # a hot GPU: its paste dried
        target = p["ambient"] + r * power * cool + extra
        alpha = self.alpha if dt == 1.0 else 1.0 - np.exp(-dt / p["tau"])
        if s is not None and dt == 0:  # the first step: a busy GPU starts where its load holds it
            alpha = np.where(m, 1.0, alpha)
        self.temp = self.temp + (target - self.temp) * alpha + 0.1 * z[3]

        self.mem = hi(lo(self.mem + 0.002 * z[4], 0.1), 0.88)
        pressure = hi(lo(p["mempress_level"] + 0.003 * z[5], 0.97), 0.998)
        mem = np.where(t >= p["mempress_on"], pressure, self.mem)
        if s is not None:
            mem = np.where(m, s.mem, mem)
        volt = np.where(t >= p["pdeliv_on"], p["pdeliv_volt"], p["volt"]) + 0.003 * z[6]

        if dt > 0:
            lam = p["rates"].copy()
            lam[:, 0] = np.where(
                t >= p["storm_on"], p["storm_rate"], np.where(t >= p["outlier_on"], p["outlier_rate"], lam[:, 0])
            )
            burst = _phase(t, p["burst_on"], p["burst_period"], p["burst_duty"])
            lam[self.rows, p["burst_col"]] += np.where(burst, p["burst_rate"], 0.0)
            V[:, _POISSON] += rng.poisson(lam * dt)
            V[:, KEY["energy"]] += power * dt
            V[:, KEY["io.receive"]] += np.floor(util * p["bw"] * dt)
            V[:, KEY["io.transmit"]] += np.floor(util * p["bw"] * 0.8 * dt)
            capped = np.where(throttled, 0.75 + 0.2 * u[2], 0.0) * dt
            if s is None:
                V[:, KEY["throttle.power"]] += capped
            else:  # a busy fleet's sources tell the causes apart: power_cap, not power
                capped = np.where(m, th.power_cap_s, capped)
                causes = self.tells_causes
                V[:, KEY["throttle.power"]] += np.where(causes, 0.0, capped)
                V[:, KEY["throttle.power_cap"]] += np.where(causes, capped, 0.0)
                V[:, KEY["throttle.power_brake"]] += np.where(m, th.power_brake_s, 0.0)
                V[:, KEY["throttle.hw_slowdown"]] += np.where(m, th.hw_slowdown_s, 0.0)
            V[:, KEY["throttle.thermal"]] += (hot > 0) * dt

        V[:, KEY["temp.gpu"]] = self.temp
        V[:, KEY["temp.board"]] = self.temp
        V[:, KEY["fan.speed"]] = ratio * p["fan_max"]
        V[:, KEY["fan.ratio"]] = ratio
        V[:, KEY["volt"]] = volt
        V[:, KEY["power"]] = power
        V[:, KEY["util"]] = util
        V[:, KEY["mem.util"]] = mem
        V[:, KEY["mem.usage"]] = np.floor(mem * p["mem_bytes"])
        V[:, KEY["pcie.width"]] = np.where(t >= p["linkdeg_on"], p["width"] / 2, p["width"])
        if s is not None:  # an idle NVIDIA GPU trains its link down to Gen1 and back up under load
            V[:, KEY["pcie.gen"]] = np.where(m & p["nvidia"] & ~s.running, 1.0, self.gen_max)
            V[:, KEY["power.limit.max"]] = np.where(m, limit, V[:, KEY["power.limit.max"]])

    def apply(self, e: Event) -> None:
        """One discrete event of the plan."""
        V, nodes = self.V, self.plan.nodes
        if e.op == "add":
            V[e.row, KEY[e.key]] += e.value
            self.on[e.row, KEY[e.key]] = True  # a new error code's series is born with its first error
        elif e.op == "status":
            V[e.row, _STATUS] = 0.0
            V[e.row, KEY[e.key]] = 1.0
        elif e.op == "vanish":
            self.present[e.row] = False
        elif e.op == "appear":
            self.present[e.row] = True
        elif e.op == "reset_series":
            V[e.row, KEY[e.key]] = 0.0
            self.start_override[(e.row, KEY[e.key])] = nodes[e.node].stamp_ns(e.at_s * US)
            self.version[e.node] += 1
        elif e.op == "restart":  # every counter from zero, XID series gone until their next error
            rows = nodes[e.node].rows
            row_idx = np.asarray(rows, dtype=np.intp)
            V[np.ix_(row_idx, _COUNTERS)] = 0.0
            self.on[np.ix_(row_idx, _DRIVERS)] = False
            self.node_start[e.node] = self.plan.restart[2]
            self.start_override = {k: v for k, v in self.start_override.items() if k[0] not in rows}
            self.version[e.node] += 1


#: Where a line's stamp goes in a template: json.dumps escapes every control character, so no
#: attribute text can hold a NUL.
_STAMP: Final = "\0"


def _attr(key: str, value: str) -> str:
    return '{"key":' + json.dumps(key) + ',"value":{"stringValue":' + json.dumps(value) + "}}"


@dataclass
class _Template:
    """A line cut at its stamps (``stamp.join(parts)``), then ``%`` slots for ``idx``'s values."""

    parts: list[str]
    idx: np.ndarray


@dataclass
class _Lines:
    """Per-node line templates: the JSON of a line with ``%`` slots for its stamps and values."""

    plan: Plan
    sim: _Sim
    cache: dict[tuple[Any, ...], _Template] = field(default_factory=dict)
    attrs: dict[tuple[int, int], str] = field(default_factory=dict)

    def point_attrs(self, row: int, k: int) -> str:
        found = self.attrs.get((row, k))
        if found is None:
            d, s = self.plan.devices[row], SERIES[k]
            if s.sensor is None:
                parts = [_attr(cv.HW_ID, d.hw_id)] + [_attr(a, v) for a, v in d.attrs.items()]
            else:
                parts = [
                    _attr(cv.HW_ID, f"{d.hw_id}/{s.sensor}"),
                    _attr(cv.HW_TYPE, s.sensor_type or ""),
                    _attr(cv.HW_PARENT, d.hw_id),
                ]
            parts += [_attr(a, v) for a, v in s.attrs]
            found = self.attrs[(row, k)] = ("[" + ",".join(parts) + "]").replace("%", "%%")
        return found

    def template(self, node: Node, rows: list[int]) -> _Template:
        sim = self.sim
        key = (node.index, tuple(rows), sim.on[rows].tobytes(), sim.version[node.index])
        found = self.cache.get(key)
        if found is not None:
            return found
        ncols = len(SERIES)
        metrics: list[str] = []
        idx: list[int] = []
        for metric in METRIC_ORDER:
            keys = _KEYS_OF_METRIC[metric]
            points: list[str] = []
            for row in rows:
                for k in keys:
                    if not sim.on[row, k]:
                        continue
                    s = SERIES[k]
                    value = '"asInt":"%d"}' if s.as_int else f'"asDouble":%.{s.decimals}f}}'
                    start = ""
                    if s.is_sum:
                        at = sim.start_override.get((row, k), sim.node_start[node.index])
                        start = f'"startTimeUnixNano":"{at}",'
                    head = '{"attributes":' + self.point_attrs(row, k) + "," + start
                    points.append(head + '"timeUnixNano":"' + _STAMP + '",' + value)
                    idx.append(row * ncols + k)
            if points:
                metrics.append(_METRIC_HEAD[metric] + ",".join(points) + "]}}")
        head = (
            '{"resourceMetrics":[{"resource":{"attributes":['
            + _attr(cv.K8S_NODE_NAME_ATTR, node.name).replace("%", "%%")
            + ","
            + _attr(cv.SERVICE_NAME_ATTR, SERVICE_NAME)
            + ']},"scopeMetrics":[{"scope":{"name":"'
            + SCOPE_NAME
            + '","version":"1"},"metrics":['
        )
        text = head + ",".join(metrics) + "]}]}]}"
        found = self.cache[key] = _Template(text.split(_STAMP), np.asarray(idx, np.intp))
        return found


def _metric_head(metric: str) -> str:
    spec = cv.METRICS[metric]
    unit = json.dumps(spec.unit).replace("%", "%%")
    if spec.instrument == cv.GAUGE:
        return '{"name":"' + metric + '","unit":' + unit + ',"gauge":{"dataPoints":['
    monotonic = "true" if spec.instrument == cv.COUNTER else "false"
    return (
        '{"name":"'
        + metric
        + '","unit":'
        + unit
        + ',"sum":{"aggregationTemporality":2,"isMonotonic":'
        + monotonic
        + ',"dataPoints":['
    )


_KEYS_OF_METRIC: Final[dict[str, tuple[int, ...]]] = {
    m: tuple(i for i, s in enumerate(SERIES) if s.metric == m) for m in METRIC_ORDER
}
_METRIC_HEAD: Final = {m: _metric_head(m) for m in METRIC_ORDER}


class _Writer:
    """Lines to a file; gzip (level 1) on a second thread when the name ends in .gz."""

    CHUNK = 4 << 20

    def __init__(self, path: Path) -> None:
        self._raw: IO[bytes] = path.open("wb")
        self._out: IO[bytes] | gzip.GzipFile = self._raw
        if path.name.endswith(".gz"):
            self._out = gzip.GzipFile(filename="", mode="wb", compresslevel=1, fileobj=self._raw, mtime=0)
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self._error: BaseException | None = None
        self._buf: list[str] = []
        self._size = 0
        self._thread = threading.Thread(target=self._drain, name="scenario-writer", daemon=True)
        self._thread.start()

    def _drain(self) -> None:
        while True:
            data = self._queue.get()
            if data is None:
                return
            if self._error is None:
                try:
                    self._out.write(data)
                except BaseException as exc:  # reported by the writing thread at its next flush
                    self._error = exc

    def write(self, line: str) -> None:
        self._buf.append(line)
        self._size += len(line)
        if self._size >= self.CHUNK:
            self._flush()

    def _flush(self) -> None:
        if self._error is not None:
            raise self._error
        if self._buf:
            self._queue.put(("\n".join(self._buf) + "\n").encode())
            self._buf, self._size = [], 0

    def __enter__(self) -> _Writer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            if kind is None:
                self._flush()
        finally:
            self._queue.put(None)
            self._thread.join()
            if self._out is not self._raw:
                self._out.close()
            self._raw.close()
        if kind is None and self._error is not None:
            raise self._error


def generate(
    config: ScenarioConfig,
    recording: Path | str,
    labels: Path | str | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> GenerateResult:
    """Simulate ``config`` and write its recording (gzip when the name ends in .gz) and labels.

    ``progress(done, total)`` is called now and then with seconds of the recording simulated.
    Raises ``ValueError`` for a fleet the plan can't fill, ``OSError`` when a file can't be written.
    """
    began = time.perf_counter()
    recording = Path(recording)
    labels_path = Path(labels) if labels is not None else labels_path_for(recording)
    plan = make_plan(config)
    sim = _Sim(plan, np.random.default_rng([config.seed, 0xD1CE]))
    lines = _Lines(plan, sim)
    nodes, D = plan.nodes, plan.duration_s

    for f in plan.faults:  # onsets at the node's first line that shows the evidence
        if f.evidence_us is not None:
            node = nodes[f.node]
            i = int(np.searchsorted(node.samples_us, f.evidence_us))
            if i < len(node.samples_us):
                f.onset_ns = node.stamp_ns(int(node.samples_us[i]))
    crossing: dict[int, list[Fault]] = {}
    for f in plan.faults:
        if f.cross_key is not None:
            crossing.setdefault(f.node, []).append(f)

    times = np.concatenate([n.samples_us for n in nodes])
    owner = np.concatenate([np.full(len(n.samples_us), n.index) for n in nodes])
    order = np.lexsort((owner, times))  # true time order: the order a collector receives them in
    times, owner = times[order], owner[order]
    seconds = times // US
    n_lines = n_points = 0
    pos = ev = 0
    events = plan.events
    with _Writer(recording) as out:
        for t in range(D):
            if t:
                sim.step(t, 1.0)
            while ev < len(events) and events[ev].at_s <= t:
                sim.apply(events[ev])
                ev += 1
            saved = []
            for row, key, value in plan.glitches.get(t, ()):
                saved.append((row, KEY[key], sim.V[row, KEY[key]]))
                sim.V[row, KEY[key]] = value
            while pos < len(times) and seconds[pos] == t:
                node = nodes[int(owner[pos])]
                at = int(times[pos])
                gone = plan.omit.get((node.index, at), ())
                rows = [r for r in (*node.rows, *node.shared) if sim.present[r] and r not in gone]
                tpl = lines.template(node, rows)
                stamp = node.stamp_ns(at)
                values = sim.flat[tpl.idx].tolist()
                out.write(str(stamp).join(tpl.parts) % tuple(values))
                n_lines += 1
                n_points += len(values)
                for f in crossing.get(node.index, ()):
                    if f.onset_ns is None and _crossed(f, sim.V[f.row, KEY[f.cross_key or ""]]):
                        f.onset_ns = stamp
                pos += 1
            for row, k, value in saved:
                sim.V[row, k] = value
            if progress is not None and (t % 60 == 59 or t == D - 1):
                progress(t + 1, D)

    doc = _labels(config, plan)
    labels_path.write_text(json.dumps(doc, indent=1) + "\n")
    return GenerateResult(
        recording=recording,
        labels=labels_path,
        lines=n_lines,
        points=n_points,
        bytes=recording.stat().st_size,
        seconds=time.perf_counter() - began,
        nodes=len(nodes),
        devices=len(doc["devices"]),
        faults=len(doc["faults"]),
        traps=len(doc["traps"]),
    )


def _crossed(f: Fault, value: float) -> bool:
    """Whether a crossing fault's value, as the file shows it, is past its limit."""
    decimals = SERIES[KEY[f.cross_key or ""]].decimals
    shown = round(float(value), decimals)
    return shown > f.cross_limit if f.cross_above else shown < f.cross_limit


def _labels(config: ScenarioConfig, plan: Plan) -> dict[str, Any]:
    """The truth about the recording, in each node's own clock (see the module docstring of score)."""
    nodes, devices = plan.nodes, plan.devices
    step = float(min(n.interval_s for n in nodes))
    faults = []
    for f in plan.faults:
        node, d = nodes[f.node], devices[f.row]
        if f.onset_ns is None:
            raise RuntimeError(f"internal: {f.kind.name} on {node.name}/{d.hw_id} never showed its evidence")
        entry: dict[str, Any] = {
            "k8s.node.name": node.name,
            "hw.id": d.hw_id,
            "kind": f.kind.name,
            "reasons": list(f.kind.reasons),
            "severity": f.kind.severity,
            "deadline_s": f.kind.deadline_s,
            "onset_unix_nano": f.onset_ns,
            "hw.model": f.detail.get("hw.model"),
        }
        if f.kind.intermittent:
            entry.update(intermittent=True, duty=f.duty, period_s=f.period_s)
        if f.kind.name in LOST_KINDS:
            entry["lost"] = True
        if f.kind.scope is not None:
            entry["scope"], entry["group"] = f.kind.scope, f.group
        detail = {k: v for k, v in f.detail.items() if k != "hw.model"}
        if detail:
            entry["detail"] = detail
        faults.append(entry)
    faults.sort(key=lambda e: (e["onset_unix_nano"], e["k8s.node.name"], e["hw.id"]))
    traps = []
    for trap in plan.traps:
        node = nodes[trap.node]
        item: dict[str, Any] = {
            "k8s.node.name": node.name,
            "hw.id": devices[trap.row].hw_id if trap.row is not None else None,
            "kind": trap.kind,
            "at_unix_nano": trap.at_ns,
        }
        if trap.detail:
            item["detail"] = trap.detail
        traps.append(item)
    silent, s_from, s_to = plan.silence
    listed = []
    for node in nodes:
        listed += [{"k8s.node.name": node.name, "hw.id": devices[r].hw_id} for r in node.rows]
        listed += [{"k8s.node.name": node.name, "hw.id": devices[r].hw_id} for r in node.shared]
    restart_node, restart_s, restart_start = plan.restart
    busy = config.load != "idle"  # the idle profile's labels stay what they were, key for key
    return {
        "version": LABELS_VERSION,
        "generator": "otel-dra simulate",
        "seed": config.seed,
        "shape": config.shape,
        **({"load": config.load} if busy else {}),
        "interval_s": step,
        "t0_unix_nano": T0_NS,
        "ticks": int(plan.duration_s // step),
        "duration_s": plan.duration_s,
        "time_base": "node clock: true time + the node's skew_s, the base of that node's own points",
        "faults": faults,
        "traps": traps,
        "node_silence": {
            "node": nodes[silent].name,
            "from_unix_nano": nodes[silent].stamp_ns(s_from * US),
            "to_unix_nano": nodes[silent].stamp_ns(s_to * US),
        },
        "agent_restart": {
            "node": nodes[restart_node].name,
            "at_unix_nano": nodes[restart_node].stamp_ns(restart_s * US),
            "start_time_unix_nano": restart_start,
        },
        "devices": listed,
        "nodes": [
            {
                "k8s.node.name": n.name,
                "interval_s": float(n.interval_s),
                "skew_s": n.skew_s,
                "hw.model": n.model.model,
                "hw.vendor": n.model.vendor,
                "limits": n.model.reports_limits,
                "devices": len(n.rows),
                **({"load": plan.node_load[n.index]} if busy else {}),
            }
            for n in nodes
        ],
        "shared_devices": [
            {
                "hw.id": devices[row].hw_id,
                "hw.type": devices[row].hw_type,
                "dra.pool.name": devices[row].attrs["dra.pool.name"],
                "dra.device.name": devices[row].attrs["dra.device.name"],
                "nodes": [nodes[v].name for v in views],
            }
            for row, views in plan.shared_views
        ],
    }


def run(config: ScenarioConfig, workdir: Path | str) -> tuple[Path, Path]:
    """Generate ``config`` into ``workdir`` (created if needed): the recording's and the labels' paths."""
    folder = Path(workdir)
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"fleet-{config.shape}-{config.nodes}x{config.devices_per_node}-{config.duration_s}s-seed{config.seed}"
    stem += "" if config.load == "idle" else f"-{config.load}"
    stem += "" if config.faults else "-nofaults"
    result = generate(config, folder / f"{stem}.jsonl.gz", folder / f"{stem}.labels.json")
    return result.recording, result.labels


def form(name: str, **changes: Any) -> ScenarioConfig:
    """A named form with some fields changed (``form("short", seed=3)``); ``ValueError`` for an unknown name."""
    if name not in FORMS:
        raise ValueError(f"unknown form {name!r}: one of {', '.join(FORMS)}")
    return replace(FORMS[name], **changes)


__all__ = [
    "FAULT_KINDS",
    "FORMS",
    "GPUS_PER_COPY",
    "KIND",
    "SHAPES",
    "GenerateResult",
    "ScenarioConfig",
    "form",
    "generate",
    "labels_path_for",
    "run",
]
