"""Where a scenario's faults, traps and fleet oddities go: all decided up front from the seed.

Why a plan before any simulation: the labels must say exactly when each fault's evidence
first appears in the file, and that depends on the sampling schedule of the device's node
(its interval, jitter, gaps). Deciding nodes, schedules, placements and events first makes
the simulation a plain loop over time and every onset a lookup in a known schedule.

Times in a plan are *true* time: integer seconds (events, the simulation grid) or integer
microseconds (sample times) after ``T0_NS``. A node stamps its points with its own clock,
true time plus its skew; every time in the labels is in that node clock.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from otel_dra.scenario import load as wl
from otel_dra.scenario.models import H100, KEY, MI300X, MIX, MODELS, NIC, DeviceModel

if TYPE_CHECKING:
    from otel_dra.scenario.generate import ScenarioConfig

#: True time of the recording's start.
T0_NS: Final = 1_800_000_000 * 10**9
US: Final = 1_000_000
#: Nothing goes wrong before this (seconds): a classifier needs its windows filled and its baselines.
WARMUP_S: Final = 900
SILENCE_S: Final = 600
INTERVALS: Final = (5, 10, 15, 30, 60)
MAX_SKEW_S: Final = 90.0
JITTER: Final = 0.1
#: A time that never comes (seconds): the onset of a fault a device doesn't have.
NEVER: Final = 1e12
#: One instance of every fault kind and trap per this many GPUs (at least one each).
GPUS_PER_COPY: Final = 170
#: Under load, fault onsets are looked for on this grid (seconds), then jittered within it.
BUSY_GRID_S: Final = 15


@dataclass(frozen=True)
class FaultKind:
    """A kind of fault: what a classifier must answer (reasons, by when) and where it can occur."""

    name: str
    reasons: tuple[str, ...]
    severity: str  # hard | soft
    deadline_s: int
    intermittent: bool = False
    nvidia_only: bool = False  # NVIDIA XIDs
    needs_limits: bool = False  # judged against a reported *.limit series
    low_rate_only: bool = False  # a cohort outlier hides below a fixed threshold only on low-rate models
    busy_only: bool = False  # placed only in busy load profiles (it shows only under load)
    whole_node: bool = False  # on every GPU of one node at once, one label per GPU
    scope: str | None = None  # the verdict scope that catches it (absent: any); group names what it is


FAULT_KINDS: Final[tuple[FaultKind, ...]] = (
    FaultKind("ecc_uncorrected", ("memory_ecc",), "hard", 60),
    FaultKind("xid_dbe", ("driver_errors", "memory_ecc"), "hard", 60, nvidia_only=True),
    FaultKind("fell_off_bus", ("driver_errors", "device_lost"), "hard", 60, nvidia_only=True),
    FaultKind("device_lost", ("device_lost",), "hard", 150),
    FaultKind("vendor_failed", ("vendor_status",), "hard", 60),
    FaultKind("ecc_corrected_storm", ("memory_ecc",), "soft", 900),
    FaultKind("ecc_cohort_outlier", ("memory_ecc",), "soft", 1800, low_rate_only=True),
    FaultKind("thermal_drift", ("thermal",), "soft", 900),
    FaultKind("fan_decay", ("cooling", "thermal"), "soft", 900),
    FaultKind("power_throttling", ("power_throttling",), "soft", 900),
    FaultKind("power_delivery", ("power_delivery",), "soft", 900),
    FaultKind("link_degraded", ("link",), "soft", 900, needs_limits=True),
    FaultKind("memory_pressure", ("memory_pressure",), "soft", 900),
    FaultKind("app_errors_repeated", ("driver_errors",), "soft", 900, nvidia_only=True),
    FaultKind("device_resets", ("device_reset",), "soft", 1800),
    FaultKind("fan_stall_intermittent", ("cooling", "thermal"), "soft", 900, intermittent=True),
    FaultKind("thermal_intermittent", ("thermal",), "soft", 900, intermittent=True),
    FaultKind("link_bursts_intermittent", ("link",), "soft", 900, intermittent=True),
    FaultKind("power_throttling_intermittent", ("power_throttling",), "soft", 900, intermittent=True),
    # Only under load (--load training|inference|mixed): a GPU hotter than its peers at the same load, a node's
    # power brake on all its GPUs (the node's power, not the GPUs), a GPU's own hardware slowdown.
    FaultKind("hot_gpu", ("thermal",), "soft", 900, busy_only=True),
    FaultKind(
        "node_power_brake",
        ("power_delivery",),
        "soft",
        900,
        nvidia_only=True,
        busy_only=True,
        whole_node=True,
        scope="node",
    ),
    FaultKind("hw_slowdown", ("thermal",), "soft", 900, nvidia_only=True, busy_only=True),
)
KIND: Final = {k.name: k for k in FAULT_KINDS}


def kinds_for(load: str) -> tuple[FaultKind, ...]:
    """The fault kinds a fleet under ``load`` holds: the busy-only ones only under load, and a hot GPU only
    where training jobs run (it is told from its peers at one steady load; see _Planner.hot_gpu)."""
    return tuple(
        k for k in FAULT_KINDS if (load != "idle" or not k.busy_only) and (k.name != "hot_gpu" or load != "inference")
    )


#: Faults after which the device reports nothing more (Unknown or failed there is no surprise).
LOST_KINDS: Final = frozenset({"device_lost", "fell_off_bus"})
#: Traps on one device each (placed like faults), then the node-wide ones.
DEVICE_TRAPS: Final = (
    "temp_spike",
    "power_spike",
    "mem_spike",
    "single_app_error",
    "counter_reset",
    "missed_sample",
    "counter_history",
)
NODE_TRAPS: Final = ("agent_restart", "high_background_cohort", "one_missed_sample", "hot_plug")
#: Under load: a job that crashed (an application XID and an OOM on every GPU it held, in one second) and a job
#: that crash-looped. The workload's, not the devices': labelled node-wide, with the GPUs in their detail.
WORKLOAD_TRAPS: Final = ("job_crash", "crash_loop")
TRAP_KINDS: Final = (*DEVICE_TRAPS, *NODE_TRAPS, *WORKLOAD_TRAPS)


def copies_for(gpus: int) -> int:
    """How many instances of each fault kind and device trap a fleet of ``gpus`` gets."""
    return max(1, gpus // GPUS_PER_COPY)


def devices_needed(gpus: int, load: str = "idle", faults: bool = True, devices_per_node: int = 1) -> int:
    """GPUs a plan places something on (outside the silent and the restarted node). Under load, each copy
    also takes whole nodes: one for each node-wide fault kind and the crash-looping node."""
    kinds = kinds_for(load) if faults else ()
    per_device = sum(1 for k in kinds if not k.whole_node)
    need = copies_for(gpus) * (per_device + len(DEVICE_TRAPS)) + 1  # + the one missed sample on a 60 s node
    if load != "idle":
        need += copies_for(gpus) * (sum(1 for k in kinds if k.whole_node) + 1) * devices_per_node
    return need


@dataclass
class Node:
    """One node: its model, sampling, clock and devices (rows of the state matrix)."""

    index: int
    name: str
    model: DeviceModel
    interval_s: int
    skew_us: int
    agent_start_ns: int  # in the node's clock
    rows: list[int] = field(default_factory=list)  # its GPUs in hw.id order
    shared: list[int] = field(default_factory=list)  # network devices it reports too
    samples_us: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # true times, gaps removed

    def stamp_ns(self, true_us: int) -> int:
        """A true time (µs after t0) in this node's clock, in ns."""
        return T0_NS + (int(true_us) + self.skew_us) * 1000

    @property
    def skew_s(self) -> float:
        return self.skew_us / US


@dataclass
class Device:
    """One device: a row of the state matrix, its identity and descriptive attributes."""

    row: int
    node: int  # the node that owns it (a shared device: its first observer)
    hw_id: str
    hw_type: str
    attrs: dict[str, str]  # descriptive attributes, hw.type first, without hw.id
    series: tuple[str, ...]
    model: DeviceModel | None  # None for a network device


@dataclass
class Fault:
    """A fault on a device: its kind, and how its label onset is found."""

    kind: FaultKind
    row: int
    node: int
    evidence_us: int | None = None  # true time the evidence starts; the onset is the node's first line from then
    cross_key: str | None = None  # or: the first sample whose value crosses cross_limit
    cross_limit: float = 0.0
    cross_above: bool = True
    period_s: float = 0.0
    duty: float = 0.0
    detail: dict[str, Any] = field(default_factory=dict)
    onset_ns: int | None = None
    group: str | None = None  # with kind.scope: what the fault belongs to (node/<name>)


@dataclass
class Trap:
    """Something that must not be flagged: a device's (row) or a node's (row None)."""

    kind: str
    node: int
    row: int | None = None
    at_ns: int | None = None  # node clock
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass(order=True)
class Event:
    """A discrete change at a grid second: a counter step, a status, a device coming or going."""

    at_s: int
    seq: int
    op: str = field(compare=False)  # add | status | vanish | appear | reset_series | restart
    row: int = field(compare=False, default=-1)
    key: str = field(compare=False, default="")
    value: float = field(compare=False, default=0.0)
    node: int = field(compare=False, default=-1)


@dataclass
class Plan:
    """Everything the simulation needs and the labels say, before a single step runs."""

    duration_s: int
    nodes: list[Node]
    devices: list[Device]
    faults: list[Fault]
    traps: list[Trap]
    events: list[Event]
    #: grid second -> (row, series key, value) shown by the sample taken in that second only
    glitches: dict[int, list[tuple[int, str, float]]]
    #: (node, true µs of a sample) -> rows missing from that line
    omit: dict[tuple[int, int], set[int]]
    silence: tuple[int, int, int]  # node, true seconds [from, to)
    restart: tuple[int, int, int]  # node, grid second, new startTimeUnixNano (node clock)
    params: dict[str, np.ndarray]  # per-row physics and fault parameters
    initial: np.ndarray  # rows x series: counter history and constants at t0
    shared_views: list[tuple[int, list[int]]]  # (NIC row, observer nodes)
    load: str = "idle"
    workload: wl.LoadModel | None = None  # the job model of the busy nodes' GPUs (None: idle, as before profiles)
    node_load: list[str] = field(default_factory=list)  # each node's profile (busy loads only)


class _Planner:
    """Builds a :class:`Plan`; one instance per generation (holds the RNG)."""

    def __init__(self, config: ScenarioConfig, attempt: int = 0) -> None:
        self.c = config
        self.attempt = attempt  # under load: which draw of the jobs (see make_plan)
        self.rng = np.random.default_rng([config.seed, 0x5CE7A])
        self.D = int(config.duration_s)
        self.mixed = config.shape == "mixed"
        self.busy = config.load != "idle"
        self.model: wl.LoadModel | None = None  # the job model under load
        self.lane_of_row: dict[int, wl.Lane] = {}
        self.node_load: list[str] = []
        self.crashing: set[int] = set()
        self.busy_cache: dict[tuple[Any, ...], list[int]] = {}
        self.seq = 0
        self.events: list[Event] = []
        self.glitches: dict[int, list[tuple[int, str, float]]] = {}
        self.omit: dict[tuple[int, int], set[int]] = {}
        self.faults: list[Fault] = []
        self.traps: list[Trap] = []
        self.nodes_: list[Node] = []  # set by build(), read by the placement helpers
        self.devices_: list[Device] = []
        self.params: dict[str, np.ndarray] = {}
        self.initial = np.zeros((0, len(KEY)))

    # -- helpers -------------------------------------------------------------------------------
    def uniform(self, lo: float, hi: float) -> float:
        return float(self.rng.uniform(lo, hi))

    def second(self, lo: float, hi: float) -> int:
        """A random whole second in [lo, hi] (clamped to the recording)."""
        lo_i, hi_i = max(1, int(np.ceil(lo))), min(self.D - 1, int(hi))
        return int(self.rng.integers(lo_i, max(lo_i, hi_i) + 1))

    def event(self, at_s: float, op: str, row: int = -1, key: str = "", value: float = 0.0, node: int = -1) -> None:
        at = round(at_s)
        if 0 < at < self.D:
            self.events.append(Event(at, self.seq, op, row, key, value, node))
            self.seq += 1

    def onset_window(self, kind: FaultKind) -> tuple[int, int]:
        """Onsets after the warm-up, and early enough that the deadline and what follows (a lost
        device's silence while its node goes on) are in the recording."""
        return WARMUP_S, self.D - max(kind.deadline_s + 120, 600)

    # -- the fleet -----------------------------------------------------------------------------
    def nodes(self) -> list[Node]:
        n, rng = self.c.nodes, self.rng
        order: list[str] = []
        while len(order) < n:
            name = f"node-{int(rng.integers(0x100, 0x1000)):03x}"
            if name not in order:
                order.append(name)
        if self.mixed:
            raw = {m: MIX[m] * n for m in MIX}
            counts = {m: max(2 if m == MI300X.model else 1, int(v)) for m, v in raw.items()}
            while sum(counts.values()) < n:
                best = max(raw, key=lambda m: raw[m] - counts[m])
                counts[best] += 1
            while sum(counts.values()) > n:
                best = max(counts, key=lambda m: counts[m])
                counts[best] -= 1
            by_name = {m.model: m for m in MODELS}
            models = [by_name[m] for m, k in counts.items() for _ in range(k)]
            rng.shuffle(models)
            intervals = list(INTERVALS)[: min(n, len(INTERVALS))]
            intervals += [int(rng.choice(INTERVALS)) for _ in range(n - len(intervals))]
            rng.shuffle(intervals)
            skews = [round(rng.uniform(-MAX_SKEW_S, MAX_SKEW_S) * 1000) * 1000 for _ in range(n)]
        else:
            models, intervals, skews = [H100] * n, [10] * n, [0] * n
        out = []
        for i, name in enumerate(order):
            start = T0_NS - int(rng.uniform(3600, 30 * 86400) * 1e9) + skews[i] * 1000
            out.append(Node(i, name, models[i], int(intervals[i]), skews[i], start))
        return out

    def schedule(self, node: Node) -> np.ndarray:
        """A node's sample times (true µs): a random phase, then every interval, jittered."""
        iv = node.interval_s
        k = np.arange(int(self.D / iv) + 2)
        jitter = self.rng.uniform(-JITTER, JITTER, len(k)) * iv if self.mixed else np.zeros(len(k))
        times = np.round((self.rng.uniform(0, iv) + k * iv + jitter) * US).astype(np.int64)
        return times[(times >= 0) & (times < self.D * US)]

    def build(self) -> Plan:
        rng, D = self.rng, self.D
        nodes = self.nodes()
        for node in nodes:
            node.samples_us = self.schedule(node)

        # Special nodes: the restarted agent (a short interval: skipping one sample stays under any stale
        # timeout), the 60 s node with one missed sample, the silent node, the hot-plug node, NIC observers.
        def pick(candidates: list[Node]) -> Node:
            return candidates[int(rng.integers(len(candidates)))]

        restart = pick([x for x in nodes if x.interval_s <= 15])
        slow = [x for x in nodes if x is not restart and (x.interval_s == 60 or not self.mixed)]
        missed60 = pick(slow or [x for x in nodes if x is not restart])
        silent = pick([x for x in nodes if x not in (restart, missed60)])
        normal = [x for x in nodes if x not in (restart, silent)]
        hotplug = pick(normal)
        n_shared = max(1, self.c.nodes // 32)
        observers = [list(rng.choice(len(normal), 2, replace=False)) for _ in range(n_shared)]

        # Rows: every node's GPUs (the hot-plug node one more), then the shared NICs.
        devices: list[Device] = []
        for node in nodes:
            count = self.c.devices_per_node + (1 if node is hotplug else 0)
            for i in range(count):
                row = len(devices)
                node.rows.append(row)
                devices.append(self.gpu(row, node, i))
        shared_views: list[tuple[int, list[int]]] = []
        for j, pair in enumerate(observers):
            row = len(devices)
            views = [normal[int(p)].index for p in pair]
            devices.append(self.nic(row, views[0], j))
            for v in views:
                nodes[v].shared.append(row)
            shared_views.append((row, views))
        hot_row = hotplug.rows[-1]
        params, initial = self.physics(nodes, devices)
        self.params, self.initial = params, initial

        # The silent node: nothing for ten minutes, then it resumes.
        s_from = self.second(WARMUP_S, D - SILENCE_S - 420)
        t = silent.samples_us
        silent.samples_us = t[(t < s_from * US) | (t >= (s_from + SILENCE_S) * US)]

        # The agent restart: one sample skipped, every counter from zero, a new start time.
        at = self.second(WARMUP_S, D - 300)
        t = restart.samples_us
        skipped = int(np.searchsorted(t, at * US))
        if skipped + 1 >= len(t):
            skipped = len(t) - 2
            at = int(t[skipped] // US)
        nxt = int(t[skipped + 1])
        restart.samples_us = np.delete(t, skipped)
        new_start = restart.stamp_ns(at * US + (nxt - at * US) // 2)
        self.event(at, "restart", node=restart.index)  # its new start time is Plan.restart's
        self.traps.append(Trap("agent_restart", restart.index, None, restart.stamp_ns(at * US)))

        # The hot-plugged device: absent until it appears, with a history of counts.
        appear = self.second(600, D - 1200)
        self.event(appear, "appear", hot_row)
        self.traps.append(Trap("hot_plug", hotplug.index, hot_row, hotplug.stamp_ns(appear * US)))
        for node in nodes:  # a whole model whose background would be a fault on any other
            if node.model is MI300X:
                detail = {"hw.model": MI300X.model, "corrected_per_min": MI300X.corrected_per_min}
                self.traps.append(Trap("high_background_cohort", node.index, None, None, detail))

        # Faults and device traps, on GPUs of ordinary nodes.
        pool = [r for x in normal for r in x.rows if r != hot_row]
        rng.shuffle(pool)
        self.nodes_, self.devices_ = nodes, devices
        copies = copies_for(sum(len(x.rows) for x in nodes))
        taken: set[int] = set()
        reserved: set[int] = set()  # under load: the nodes whose job crash-loops take no fault and no device trap
        if self.busy:
            reserved = self.workload(nodes, normal, hotplug, missed60, copies)
            pool = [r for r in pool if devices[r].node not in reserved]

        def take(ok: Callable[[Device], bool], what: str) -> int:
            for r in pool:
                if r not in taken and ok(devices[r]):
                    taken.add(r)
                    return r
            raise ValueError(f"the fleet has no free GPU for {what}: raise --nodes or --devices-per-node")

        def vendor_fits(nvidia_only: bool, d: Device) -> bool:
            return not nvidia_only or (d.model is not None and d.model.vendor == "NVIDIA")

        r60 = take(lambda d: d.node == missed60.index, "the missed sample on a 60 s node")
        self.missed_sample(r60, "one_missed_sample")
        placed = kinds_for(self.c.load) if self.c.faults else ()
        # The most constrained first: whole nodes, a hot GPU (one of the coolest GPUs of a training job: the
        # one with the most room under its limit), then the picky kinds.
        hot = [k for k in placed if k.name == "hot_gpu"]
        spare: set[int] = set()  # the nodes of the coolest GPUs: a node-wide fault goes elsewhere if it can
        if hot:
            best = sorted((r for r in pool if self.fits(hot[0], devices[r])), key=lambda r: -self.room_of(r))
            spare = {devices[r].node for r in best[: 2 * copies]}
        for kind in (k for k in placed if k.whole_node):
            for _ in range(copies):
                self.node_fault(kind, [x for x in normal if x not in (hotplug, missed60)], taken, spare)
        for kind in hot:
            for _ in range(copies):
                free = [r for r in pool if r not in taken and self.fits(kind, devices[r])]
                if free:
                    pool.insert(0, pool.pop(pool.index(max(free, key=self.room_of))))
                self.fault(kind, take(functools.partial(self.fits, kind), f"a {kind.name} fault (a cool GPU)"))
        kinds = [k for k in placed if not k.whole_node and k.name != "hot_gpu"]
        kinds.sort(key=lambda k: not (k.nvidia_only or k.needs_limits or k.low_rate_only or k.busy_only))
        for _ in range(copies):
            for kind in kinds:
                row = take(functools.partial(self.fits, kind), f"a {kind.name} fault")
                self.fault(kind, row)
            for trap in DEVICE_TRAPS:
                nvidia = trap == "single_app_error"
                row = take(functools.partial(vendor_fits, nvidia), trap)
                self.device_trap(trap, row)
        self.hot_history(hot_row)

        self.events.sort()
        return Plan(
            duration_s=D,
            nodes=nodes,
            devices=devices,
            faults=self.faults,
            traps=self.traps,
            events=self.events,
            glitches=self.glitches,
            omit=self.omit,
            silence=(silent.index, s_from, s_from + SILENCE_S),
            restart=(restart.index, at, new_start),
            params=params,
            initial=initial,
            shared_views=shared_views,
            load=self.c.load,
            workload=self.model,
            node_load=self.node_load,
        )

    def gpu(self, row: int, node: Node, i: int) -> Device:
        m, rng = node.model, self.rng
        firmware = m.firmwares[0] if rng.random() < 0.8 else m.firmwares[1]
        attrs = {
            "hw.type": "gpu",
            "hw.name": f"GPU {i}",
            "hw.vendor": m.vendor,
            "hw.model": m.model,
            "hw.serial_number": f"{m.serial_prefix}{int(rng.integers(10**8, 10**9))}",
            "hw.firmware_version": firmware,
            "hw.driver_version": m.driver_version,
            "dra.driver.name": m.dra_driver,
            "dra.pool.name": node.name,
            "dra.device.name": f"gpu-{i}",
        }
        return Device(row, node.index, f"gpu-{i}", "gpu", attrs, m.series_under_load() if self.busy else m.series, m)

    def nic(self, row: int, node: int, j: int) -> Device:
        attrs = {
            "hw.type": "network",
            "hw.name": f"NIC fabric-{j}",
            "hw.vendor": NIC.vendor,
            "hw.model": NIC.model,
            "hw.serial_number": f"MT{int(self.rng.integers(10**9, 10**10))}",
            "hw.firmware_version": NIC.firmware,
            "hw.driver_version": NIC.driver_version,
            "dra.driver.name": NIC.dra_driver,
            "dra.pool.name": f"fabric-{j}",
            "dra.device.name": f"nic-{j}",
        }
        return Device(row, node, f"nic-fabric-{j}", "network", attrs, NIC.series, None)

    def physics(self, nodes: list[Node], devices: list[Device]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Per-row physical parameters (model values, varied per device) and counter history at t0."""
        rng, n = self.rng, len(devices)
        p: dict[str, np.ndarray] = {}

        def col(fn: Any, nic: float) -> np.ndarray:
            return np.array([fn(d.model) if d.model is not None else nic for d in devices], float)

        ambient_node = rng.uniform(22.0, 28.0, len(nodes))
        p["ambient"] = np.array([ambient_node[d.node] for d in devices]) + rng.uniform(-1.5, 1.5, n)
        p["r"] = col(lambda m: m.thermal_c_per_w, 1.2) * rng.uniform(0.93, 1.07, n)
        p["tau"] = col(lambda m: m.thermal_tau_s, 60.0)
        p["idle"] = col(lambda m: m.power_idle_w, 15.0)
        p["cap"] = col(lambda m: m.power_cap_w, 25.0)
        p["throttle_c"] = col(lambda m: m.throttle_c, 200.0)
        p["fan_max"] = col(lambda m: m.fan_max_rpm, 1.0)
        p["bw"] = col(lambda m: m.io_bytes_per_s, 0.0)
        p["mem_bytes"] = col(lambda m: m.memory_bytes, 0.0)
        p["width"] = col(lambda m: m.pcie_width, 0.0)
        p["volt"] = col(lambda m: m.volt_nominal, 0.0)
        p["job"] = rng.uniform(0.35, 0.95, n)
        p["mem"] = rng.uniform(0.2, 0.8, n)
        p["steady"] = np.zeros(n, bool)
        # Background rates per second: lognormal around the model's median (a fleet is not uniform).
        spread = rng.lognormal(0.0, 0.3, (n, 5))
        rates = np.zeros((n, 5))
        for d in devices:
            if d.model is None:
                rates[d.row, 4] = NIC.link_per_min / 60.0
                continue
            rates[d.row, 0] = d.model.corrected_per_min / 60.0
            for j, link in enumerate(("pcie", "nvlink", "xgmi")):
                rates[d.row, 1 + j] = d.model.link_per_min.get(link, 0.0) / 60.0
        p["rates"] = rates * spread
        for name in ("storm", "outlier", "drift", "fan_decay", "throttle", "pdeliv", "linkdeg", "mempress"):
            p[f"{name}_on"] = np.full(n, NEVER)
        for name in ("stall", "excursion", "burst", "cycle"):
            p[f"{name}_on"] = np.full(n, NEVER)
            p[f"{name}_period"] = np.ones(n)
            p[f"{name}_duty"] = np.zeros(n)
        for name in ("storm_rate", "outlier_rate", "drift_len", "drift_extra", "fan_decay_len", "pdeliv_volt"):
            p[name] = np.ones(n) if name.endswith("_len") else np.zeros(n)
        p["mempress_level"] = np.zeros(n)
        p["excursion_extra"] = np.zeros(n)
        p["burst_rate"] = np.zeros(n)
        p["burst_col"] = np.ones(n, np.intp)
        p["present"] = np.ones(n, bool)
        # Under load only (constants otherwise): a hot GPU's thermal resistance from its onset, a hardware
        # slowdown's share of each minute, a node's power brake, a power limit lowered by a fault.
        p["nvidia"] = np.array([d.model is not None and d.model.vendor == "NVIDIA" for d in devices], bool)
        for name in ("hot", "slow", "brake"):
            p[f"{name}_on"] = np.full(n, NEVER)
        p["r_hot"] = p["r"].copy()
        p["slow_share"] = np.zeros(n)
        p["slow_phase"] = np.zeros(n)
        p["brake_w"] = np.zeros(n)
        p["brake_share"] = np.zeros(n)
        p["limit_factor"] = np.ones(n)

        # Constants and counter history at t0: what a device brings when first seen.
        init = np.zeros((n, len(KEY)))
        for d in devices:
            r, m = d.row, d.model
            init[r, KEY["status.ok"]] = 1.0
            if m is None:
                init[r, KEY["err.link.other"]] = rng.integers(0, 50)
                continue
            minutes = rng.uniform(2_000, 40_000)
            init[r, KEY["err.corrected"]] = rng.poisson(p["rates"][r, 0] * 60 * minutes)
            for j, link in enumerate(("pcie", "nvlink", "xgmi")):
                init[r, KEY[f"err.link.{link}"]] = rng.poisson(p["rates"][r, 1 + j] * 60 * minutes)
            init[r, KEY["err.reset"]] = rng.integers(0, 3)
            init[r, KEY["err.out_of_memory"]] = rng.integers(0, 20)
            init[r, KEY["energy"]] = round(minutes * 60 * m.power_cap_w * 0.5, 1)
            init[r, KEY["io.receive"]] = round(minutes * 60 * m.io_bytes_per_s * 0.3)
            init[r, KEY["io.transmit"]] = round(minutes * 60 * m.io_bytes_per_s * 0.25)
            init[r, KEY["throttle.thermal"]] = round(rng.uniform(0, 300), 3)
            throttled = "throttle.power" if "throttle.power" in d.series else "throttle.power_cap"
            init[r, KEY[throttled]] = round(rng.uniform(0, 3000), 3)
            for kind, value in m.temp_limits.items():
                init[r, KEY[f"temp.limit.{kind}"]] = value
            for kind, value in m.fan_limits.items():
                init[r, KEY[f"fan.limit.{kind}"]] = value
            for kind, value in m.volt_limits.items():
                init[r, KEY[f"volt.limit.{kind}"]] = value
            init[r, KEY["power.limit.max"]] = m.power_cap_w
            init[r, KEY["mem.limit"]] = m.memory_bytes
            init[r, KEY["pcie.width.limit"]] = m.pcie_width
            init[r, KEY["pcie.gen.limit"]] = m.pcie_gen
            init[r, KEY["pcie.gen"]] = m.pcie_gen
        return p, init

    # -- placement -----------------------------------------------------------------------------
    def fits(self, kind: FaultKind, d: Device) -> bool:
        m = d.model
        if m is None:
            return False
        if kind.nvidia_only and m.vendor != "NVIDIA":
            return False
        if kind.needs_limits and not m.reports_limits:
            return False
        if d.row in self.lane_of_row and not self.busy_onsets([d.row], kind):
            return False  # under load a fault goes where a job holds the GPU around its onset
        if kind.busy_only:
            lane = self.lane_of_row.get(d.row)
            if lane is None or lane.kind == "vacant":
                return False
            if kind.name == "hot_gpu" and self.room_of(d.row) < 6.5:
                return False
        return not (kind.low_rate_only and m.corrected_per_min * 10 >= 6.0)

    def first_sample_at(self, node: Node, at_us: int) -> int:
        """The true time (µs) of the node's first sample at or after ``at_us``."""
        i = int(np.searchsorted(node.samples_us, at_us))
        return int(node.samples_us[min(i, len(node.samples_us) - 1)])

    def sample_between(self, node: Node, lo_s: float, hi_s: float, quiet: bool = False) -> int:
        """A random sample of the node in [lo, hi] s; ``quiet``: one whose neighbours are at most two
        intervals apart (so skipping it leaves a gap no stale timeout may count)."""
        t = node.samples_us
        idx = np.nonzero((t >= lo_s * US) & (t <= hi_s * US))[0]
        if quiet:
            idx = idx[(idx > 0) & (idx < len(t) - 1)]
            idx = idx[t[np.minimum(idx + 1, len(t) - 1)] - t[idx - 1] <= 2 * node.interval_s * US]
        return int(t[int(self.rng.choice(idx))])

    def missed_sample(self, row: int, kind: str) -> None:
        node = self.nodes_[self.devices_[row].node]
        at = self.sample_between(node, 300, self.D - 300, quiet=True)
        self.omit.setdefault((node.index, at), set()).add(row)
        self.traps.append(Trap(kind, node.index, row, node.stamp_ns(at), {"interval_s": node.interval_s}))

    def device_trap(self, kind: str, row: int) -> None:
        d = self.devices_[row]
        node, m, p = self.nodes_[d.node], d.model, self.params
        assert m is not None
        if kind == "missed_sample":
            self.missed_sample(row, kind)
            return
        if kind == "counter_history":
            # History the device brings: an uncorrected ECC error and old XIDs, from before the recording.
            self.initial[row, KEY["err.uncorrected"]] = self.rng.integers(1, 3)
            self.initial[row, KEY["err.retired_page"]] = self.initial[row, KEY["err.uncorrected"]]
            codes = {"48": 1, "31": 2} if m.vendor == "NVIDIA" else {}
            for code, n in codes.items():
                self.initial[row, KEY[f"err.driver.{code}"]] = n
            self.traps.append(Trap(kind, node.index, row, None, {"hw.error.code": sorted(codes)}))
            return
        if kind in ("single_app_error", "counter_reset"):
            at = self.second(300, self.D - 900)
            if kind == "single_app_error":
                self.event(at, "add", row, "err.driver.13", 1.0)
                detail: dict[str, Any] = {"hw.error.code": "13"}
            else:  # from a long history to zero, then growing again (a low-rate model may be slow to)
                self.initial[row, KEY["err.corrected"]] += 5000
                self.event(at, "reset_series", row, "err.corrected", node=node.index)
                self.event(at + self.uniform(60, 300), "add", row, "err.corrected", 1.0)
                detail = {"series": "hw.errors{error.type=corrected}"}
            self.traps.append(Trap(kind, node.index, row, node.stamp_ns(at * US), detail))
            return
        at_us = self.sample_between(node, 300, self.D - 300)
        g = at_us // US
        if kind == "temp_spike":
            value = min(m.temp_degraded_c + self.uniform(3, 6), m.temp_critical_c - 0.5)
            self.glitches.setdefault(g, []).append((row, "temp.gpu", round(value, 2)))
        elif kind == "power_spike":
            self.glitches.setdefault(g, []).append((row, "power", round(p["cap"][row] * self.uniform(0.99, 1.0), 1)))
        else:
            frac = self.uniform(0.985, 0.995)
            self.glitches.setdefault(g, []).append((row, "mem.util", frac))
            self.glitches.setdefault(g, []).append((row, "mem.usage", float(np.floor(frac * m.memory_bytes))))
        self.traps.append(Trap(kind, node.index, row, node.stamp_ns(at_us)))

    def hot_history(self, row: int) -> None:
        """The hot-plugged device was used elsewhere: its counters arrive with history."""
        m = self.devices_[row].model
        assert m is not None
        init = self.initial
        init[row, KEY["err.corrected"]] += 2500
        init[row, KEY["err.uncorrected"]] = 1
        init[row, KEY["err.retired_page"]] = 1
        init[row, KEY["err.reset"]] = 2
        if m.vendor == "NVIDIA":
            init[row, KEY["err.driver.13"]] = 3
        self.params["present"][row] = False

    def fault(self, kind: FaultKind, row: int) -> None:
        """Place one fault: its parameters, its events, and how its onset is found."""
        d = self.devices_[row]
        node, m, p, rng = self.nodes_[d.node], d.model, self.params, self.rng
        assert m is not None
        lo, hi = self.onset_window(kind)
        if kind.name in ("thermal_drift", "fan_decay"):
            lo += 300  # their onset is where noise first carries them across the limit: some minutes either way
        at = self.onset(row, kind, lo, hi)
        f = Fault(kind, row, node.index, evidence_us=at * US, detail={"hw.model": m.model})
        name = kind.name
        busy = row in self.lane_of_row
        if name == "ecc_uncorrected":
            n = int(rng.integers(1, 3))
            self.event(at, "add", row, "err.uncorrected", n)
            self.event(at, "add", row, "err.retired_page", n)
            self.event(at + self.uniform(300, 900), "add", row, "err.uncorrected", 1)
        elif name in ("xid_dbe", "fell_off_bus"):
            code = "48" if name == "xid_dbe" else "79"
            f.detail["hw.error.code"] = code
            self.event(at, "add", row, f"err.driver.{code}", 1)
            if code == "48":
                self.event(at, "add", row, "err.uncorrected", 1)
                self.event(at, "add", row, "err.retired_page", 1)
            else:  # the device shows the XID once or twice, then falls silent
                seen = self.first_sample_at(node, at * US) / US
                self.event(np.ceil(seen + self.uniform(1.2, 2.2) * node.interval_s), "vanish", row)
        elif name == "device_lost":
            self.event(at, "vanish", row)
        elif name == "vendor_failed":
            self.event(at, "status", row, "status.failed")
        elif name == "ecc_corrected_storm":
            p["storm_on"][row], p["storm_rate"][row] = at, self.uniform(50, 200) / 60
            f.detail["corrected_per_min"] = round(p["storm_rate"][row] * 60, 1)
        elif name == "ecc_cohort_outlier":
            rate = min(m.corrected_per_min * self.uniform(5, 10), 5.5)
            p["outlier_on"][row], p["outlier_rate"][row] = at, rate / 60
            f.detail["corrected_per_min"] = round(rate, 2)
            f.detail["model_median_per_min"] = m.corrected_per_min
        elif name == "thermal_drift":
            # The temperature creeps for 30-60 min towards a plateau above the limit (held under the
            # critical one by the device's own throttling); the onset is the first sample above the limit.
            base = self.base_temperature(row, at)
            limit = m.temp_degraded_c
            plateau = max(limit + self.uniform(3.5, 5.0), m.throttle_c + 1.5)
            length = self.uniform(1800, 3600)
            frac = (limit - base) / (plateau - base)
            p["drift_on"][row] = at - frac * length
            p["drift_len"][row], p["drift_extra"][row] = length, plateau - base
            f.evidence_us, f.cross_key, f.cross_limit, f.cross_above = None, "temp.gpu", limit, True
            f.detail.update(limit=limit, ramp_s=round(length))
        elif name == "fan_decay":
            p["steady"][row] = True
            p["job"][row] = self.uniform(0.7, 0.9)
            length = self.uniform(3000, 4200)
            share = 1.0 - m.fan_floor_ratio / 0.85  # the fan controller runs near 0.85 as the device heats up
            p["fan_decay_on"][row], p["fan_decay_len"][row] = at - share * length, length
            key = "fan.speed" if m.fan == "rpm" else "fan.ratio"
            f.evidence_us, f.cross_key, f.cross_limit, f.cross_above = None, key, m.fan_floor, False
            f.detail.update(limit=m.fan_floor, series=key, decay_s=round(length))
        elif name == "power_throttling":
            p["throttle_on"][row] = at
            if busy:  # under load: its power limit lowered, so it runs capped while its peers run at theirs
                self.lower_limit(f)
        elif name == "power_delivery":
            p["pdeliv_on"][row] = at
            floor = m.volt_limits.get("low.critical", m.volt_nominal - 0.08)
            p["pdeliv_volt"][row] = floor - self.uniform(0.02, 0.06)
            t = float(at)
            while t < self.D:
                self.event(t, "add", row, "err.power", 1)
                t += self.uniform(60, 240)
        elif name == "link_degraded":
            p["linkdeg_on"][row] = at
        elif name == "memory_pressure" and busy:
            # Under load memory is full on every GPU of the job; this one runs out again and again, across jobs,
            # while its neighbours stay clean (only while a job holds it).
            t = float(at)
            while t < self.D:
                if self.running(row, t):
                    self.event(t, "add", row, "err.out_of_memory", 1)
                t += self.uniform(180, 420)
        elif name == "memory_pressure":
            p["mempress_on"][row], p["mempress_level"][row] = at, self.uniform(0.975, 0.99)
            t = float(at)
            while t < self.D:
                self.event(t, "add", row, "err.out_of_memory", 1)
                t += self.uniform(180, 420)
        elif name == "app_errors_repeated" and busy:
            # An application XID every 10-20 min on this GPU only, across jobs: two in the hour before the onset.
            e2 = at - self.uniform(600, 1200)
            e1 = max(300.0, e2 - self.uniform(600, 1200))
            for e in (e1, e2):
                if self.running(row, e):
                    self.event(e, "add", row, "err.driver.13", 1)
            t = float(at)
            while t < self.D:
                if self.running(row, t) or t == at:
                    self.event(t, "add", row, "err.driver.13", 1)
                t += self.uniform(600, 1200)
            f.detail["hw.error.code"] = "13"
        elif name == "app_errors_repeated":
            # Two earlier XID 13s within the hour; the onset is the third. More follow.
            e2 = at - self.uniform(240, 600)
            e1 = max(300.0, e2 - self.uniform(240, 900))
            t = float(at)
            for e in (e1, e2):
                self.event(e, "add", row, "err.driver.13", 1)
            while t < self.D:
                self.event(t, "add", row, "err.driver.13", 1)
                t += self.uniform(480, 900)
            f.detail["hw.error.code"] = "13"
        elif name == "hot_gpu":
            found = self.hot_gpu(row)
            assert found is not None  # fits() checked it
            offset, r_hot = found
            p["hot_on"][row], p["r_hot"][row] = at, r_hot
            f.detail.update(offset_c=round(offset, 1), limit=m.temp_degraded_c)
        elif name == "hw_slowdown":
            p["slow_on"][row] = at
            p["slow_share"][row] = self.uniform(0.5, 0.85)
            p["slow_phase"][row] = self.uniform(0, 60)
            f.detail["asserted_share"] = round(float(p["slow_share"][row]), 2)
        elif name == "device_resets":
            self.event(max(300.0, at - self.uniform(300, 900)), "add", row, "err.reset", 1)
            t = float(at)
            while t < self.D:
                self.event(t, "add", row, "err.reset", 1)
                t += self.uniform(600, 1200)
        else:
            self.intermittent(f, at)
        self.faults.append(f)

    # -- under load --------------------------------------------------------------------------------------
    def workload(self, nodes: list[Node], normal: list[Node], hotplug: Node, missed60: Node, copies: int) -> set[int]:
        """Each node's profile and lanes (jobs, gaps, crashes), the workload traps the plan guarantees (per copy
        a job that crashes once or twice and one that crash-loops, on ordinary busy nodes), the busy GPUs'
        thermal layout, and every crash as counter events (an application XID, NVIDIA only, and an OOM on every
        GPU the job held, in one second). Returns the crash-looping nodes: no fault or device trap goes there.

        Draws from its own generators, never the plan's: the idle profile's files stay what they were."""
        c, p, D = self.c, self.params, self.D
        lrng = np.random.default_rng([c.seed, 0x10AD, *([self.attempt] if self.attempt else [])])
        self.node_load = wl.profile_of_nodes(c.load, len(nodes), lrng)
        lanes: list[wl.Lane] = []
        lane_rows: list[list[int]] = []
        node_lanes: dict[int, list[int]] = {}
        for node, prof in zip(nodes, self.node_load, strict=True):
            if prof not in wl.BUSY:
                continue
            gpus = [r for r in node.rows]
            covered: set[int] = set()
            for lane in wl.make_lanes(prof, c.devices_per_node, lrng):
                node_lanes.setdefault(node.index, []).append(len(lanes))
                lanes.append(lane)
                lane_rows.append([gpus[i] for i in lane.slots])
                covered.update(lane.slots)
            rest = [r for i, r in enumerate(gpus) if i not in covered]  # the hot-plugged GPU: no job holds it yet
            if rest:
                node_lanes[node.index].append(len(lanes))
                lanes.append(wl.Lane("vacant", range(len(rest)), lrng))
                lane_rows.append(rest)

        # The guaranteed workload traps, on any busy ordinary node.
        busy = [x for x in normal if x.index in node_lanes and x not in (hotplug, missed60)]
        if len(busy) < 3 * copies:
            raise ValueError(
                f"under --load {c.load} the fleet has {len(busy)} busy ordinary nodes, too few for every workload trap "
                f"and node-wide fault (needs {3 * copies}): raise --nodes"
            )
        order = [busy[int(i)] for i in lrng.permutation(len(busy))]
        looping, crashing = order[:copies], order[copies : 2 * copies]
        latest = max(WARMUP_S, D - 1800)
        for node in looping:
            at = float(lrng.integers(WARMUP_S, latest + 1))
            lanes[node_lanes[node.index][0]].forced.append(wl.Forced(at, float(lrng.uniform(*wl.LOOP_LEN_S))))
        for node in crashing:
            at = float(lrng.integers(WARMUP_S, D - 600))
            lane = lanes[node_lanes[node.index][0]]
            lane.forced.append(wl.Forced(at))
            if lrng.random() < 0.5 and at + 1800 < D - 300:
                lane.forced.append(wl.Forced(at + float(lrng.integers(600, 1800))))
        self.crashing = {x.index for x in crashing}
        for lane in lanes:
            lane.forced.sort(key=lambda f: f.at)
            lane.extend(D + 7200.0)
        for lane, rows in zip(lanes, lane_rows, strict=True):
            for r in rows:
                self.lane_of_row[r] = lane

        # Thermal layout of the busy GPUs: at its cap the hottest possible one stays MIN_HEADROOM_C under its
        # high.degraded limit; inlet (ambient under 28.5 °C, the hottest nodes'), slot and spread cool the rest.
        managed = np.array(sorted(self.lane_of_row), np.intp)
        limit = np.array([m.temp_degraded_c for m in (self.devices_[r].model for r in managed) if m is not None])
        slot = np.array(
            [wl.slot_offsets(len(nodes[self.devices_[r].node].rows))[nodes[self.devices_[r].node].rows.index(r)]
             for r in managed]
        )  # fmt: skip
        inlet_gap = np.maximum(28.5 - p["ambient"][managed], 0.0)
        t_cap = wl.full_load_temperature(limit, slot, inlet_gap, lrng)
        p["r"][managed] = (t_cap - p["ambient"][managed]) / p["cap"][managed]
        p["r_hot"][managed] = p["r"][managed]
        self.model = wl.LoadModel(
            lanes, lane_rows, p["idle"], p["cap"], np.random.default_rng([c.seed, 0x10AD, 1]), T0_NS / 1e9
        )

        # Every crash: counter events, and its job's trap.
        for lane, rows in zip(lanes, lane_rows, strict=True):
            if not rows or lane.kind == "vacant":
                continue
            node = nodes[self.devices_[rows[0]].node]
            nvidia = node.model.vendor == "NVIDIA"
            by_job: dict[int, list[wl.Run]] = {}
            for run, job in lane.crashes(1.0, float(D)):
                at = int(run.end)
                for r in rows:
                    if nvidia:
                        self.event(at, "add", r, f"err.driver.{job.xid}", 1)
                    self.event(at, "add", r, "err.out_of_memory", 1)
                by_job.setdefault(job.index, []).append(run)
            for index, runs in by_job.items():
                job = lane.jobs[index]
                looped = [run for run in runs if run.loop or any(r.loop for r in lane.runs if r.job == index)]
                kind = "crash_loop" if looped else "job_crash"
                times = [node.stamp_ns(int(run.end) * US) for run in runs]
                detail: dict[str, Any] = {}
                if nvidia:
                    detail["hw.error.code"] = job.xid
                detail["out_of_memory"] = True
                detail["crashes_unix_nano"] = times
                detail["group"] = f"workload/node/{node.name}"
                detail["hw.ids"] = [self.devices_[r].hw_id for r in rows]
                detail["load"] = lane.kind
                if looped:
                    detail["from_unix_nano"], detail["to_unix_nano"] = times[0], times[-1]
                self.traps.append(Trap(kind, node.index, None, times[0], detail))
        return {x.index for x in looping}

    def running(self, row: int, t: float) -> bool:
        """Whether a job holds ``row`` at ``t`` (always, for a device no lane manages)."""
        lane = self.lane_of_row.get(row)
        return lane is None or lane.run_at(t) is not None

    def onset(self, row: int, kind: FaultKind, lo: float, hi: float) -> int:
        """A fault's onset: any second in [lo, hi], or under load one of :meth:`busy_onsets`."""
        if row not in self.lane_of_row:
            return self.second(lo, hi)
        choices = self.busy_onsets([row], kind)
        at = choices[int(self.rng.integers(len(choices)))]
        return min(at + int(self.rng.integers(0, BUSY_GRID_S)), int(hi))

    def busy_onsets(self, rows: list[int], kind: FaultKind) -> list[int]:
        """Onsets in the kind's window (every BUSY_GRID_S) around which a job holds every one of ``rows``:
        from 10 minutes before to 2 minutes past its deadline, 90% of the time outside crash loops, so a fault
        under load shows as itself on a busy GPU (and the labels ask nothing of an idle one)."""
        lanes = {id(lane): lane for lane in (self.lane_of_row.get(r) for r in rows) if lane is not None}
        lo, hi = self.onset_window(kind)
        if kind.name in ("thermal_drift", "fan_decay"):
            lo += 300
        key = (tuple(sorted(lanes)), lo, hi, kind.deadline_s)
        found = self.busy_cache.get(key)
        if found is None:
            found = self.busy_cache[key] = [
                at
                for at in range(lo, hi + 1, BUSY_GRID_S)
                if all(lane.coverage(at - 600, at + kind.deadline_s + 120) >= 0.9 for lane in lanes.values())
            ]
        return found

    def base_temperature(self, row: int, at: float) -> float:
        """Where the device's temperature sits around ``at``: under load, its job's mean power (idle in a gap)
        through its thermal resistance; otherwise a steady workload fixed for it."""
        if row not in self.lane_of_row or self.model is None:
            return self.steady_temperature(row)
        p = self.params
        power = min(float(self.model.expected_demand_w(np.array([row]), at)[0]), float(p["cap"][row]))
        return float(p["ambient"][row] + p["r"][row] * power)

    def hot_room(self, row: int) -> tuple[float, float, float] | None:
        """How hot ``row`` may run over its peers and itself (°C) with its limit still 0.5 °C away when held at
        its cap, with the reference (``base`` °C at ``low`` W) the offset is measured from; None off a training
        job or without peers (see :meth:`hot_gpu`)."""
        p, lane = self.params, self.lane_of_row.get(row)
        m = self.devices_[row].model
        if lane is None or not lane.training or m is None:
            return None
        peers = [r for r, other in self.lane_of_row.items() if other is lane and r != row]
        runs = [r for r in lane.runs if not r.loop and r.end > WARMUP_S and r.start < self.D]
        if len(peers) < 2 or not runs:
            return None
        cap = float(p["cap"][row])
        low = min(cap * (r.compute + (1 - r.compute) * r.comm) for r in runs)
        amb = float(p["ambient"][row])
        base = max(float(np.median(p["ambient"][peers] + p["r"][peers] * low)), amb + float(p["r"][row]) * low)
        return (m.temp_degraded_c - 0.5 - amb) * low / cap - (base - amb), base, low

    def room_of(self, row: int) -> float:
        found = self.hot_room(row)
        return found[0] if found is not None else -math.inf

    def hot_gpu(self, row: int) -> tuple[float, float] | None:
        """A hot GPU's offset over its peers' median and its own temperature at the same load (6-10 °C, smaller
        where its limit needs it) and the thermal resistance that makes it; None off a training job (a hot GPU
        is told by its peers at one steady load; an inference replica's traffic swings to the cap at its peaks,
        where the same resistance would cross the limit), without peers, or without room under its limit.
        The offset holds at the lowest mean power its job runs at in the recording; held at its cap the GPU
        stays 0.5 °C under its high.degraded limit (compute phases run at the cap for seconds at a time)."""
        found = self.hot_room(row)
        if found is None or found[0] < 6.5:
            return None
        room, base, low = found
        offset = self.uniform(6.0, min(10.0, room))
        return offset, (base + offset - float(self.params["ambient"][row])) / low

    def lower_limit(self, f: Fault) -> None:
        """Under load a power-throttled device has its power limit lowered to 0.55-0.7 of nominal (reported
        in hw.power.limit{max}): pinned at it, it accrues power_cap time nearly all its busy time."""
        p = self.params
        p["limit_factor"][f.row] = self.uniform(0.55, 0.7)
        f.detail["limit_w"] = round(float(p["cap"][f.row] * p["limit_factor"][f.row]), 1)

    def node_fault(self, kind: FaultKind, candidates: list[Node], taken: set[int], spare: set[int]) -> None:
        """A fault on every GPU of one node (one label each, scope ``node``, group ``node/<name>``): under load,
        a node's power brake (every GPU accrues power_brake time for most of each minute, power about half)."""
        ok = [
            x for x in candidates
            if x.index not in self.crashing and not (set(x.rows) & taken) and x.rows
            and all(self.fits(kind, self.devices_[r]) for r in x.rows) and self.busy_onsets(x.rows, kind)
        ]  # fmt: skip
        if not ok:
            raise ValueError(f"the fleet has no free node for a {kind.name} fault: raise --nodes")
        ok = [x for x in ok if x.index not in spare] or ok  # ``spare``: kept for what needs them more
        node = ok[int(self.rng.integers(len(ok)))]
        choices = self.busy_onsets(node.rows, kind)
        at = choices[int(self.rng.integers(len(choices)))]
        p = self.params
        factor, share = self.uniform(0.45, 0.55), self.uniform(0.85, 1.0)
        group = f"node/{node.name}"
        for r in node.rows:
            taken.add(r)
            p["brake_on"][r], p["brake_w"][r], p["brake_share"][r] = at, factor * p["cap"][r], share
            m = self.devices_[r].model
            detail = {"hw.model": m.model if m else None, "power_w": round(float(factor * p["cap"][r]), 1)}
            detail["asserted_share"] = round(share, 2)
            self.faults.append(Fault(kind, r, node.index, evidence_us=at * US, detail=detail, group=group))

    def steady_temperature(self, row: int) -> float:
        """Fix the device's workload and return the temperature it settles at with a healthy fan."""
        p = self.params
        p["steady"][row] = True
        job = p["job"][row] = self.uniform(0.7, 0.9)
        return float(p["ambient"][row] + p["r"][row] * (p["idle"][row] + job * (0.9 * p["cap"][row] - p["idle"][row])))

    def intermittent(self, f: Fault, at: int) -> None:
        """A fault that comes and goes: on for duty x period, from the onset to the end."""
        p, row, m = self.params, f.row, self.devices_[f.row].model
        assert m is not None
        name = f.kind.name
        if name == "fan_stall_intermittent":
            prefix, period, on = "stall", 360.0, 120.0
        elif name == "thermal_intermittent":
            prefix, period, on = "excursion", 420.0, 180.0
            p["excursion_extra"][row] = m.temp_degraded_c + self.uniform(6.0, 9.0) - self.base_temperature(row, at)
        elif name == "link_bursts_intermittent":
            prefix, period, on = "burst", 480.0, 180.0
            links = list(m.link_per_min)
            link = links[int(self.rng.integers(len(links)))]
            p["burst_col"][row] = 1 + ("pcie", "nvlink", "xgmi").index(link)
            p["burst_rate"][row] = self.uniform(100, 200) / 60
            f.detail.update({"hw.link.type": link, "errors_per_min": round(p["burst_rate"][row] * 60)})
        else:
            prefix, period = "cycle", self.uniform(480, 720)
            on = period * self.uniform(0.35, 0.45)
            if row in self.lane_of_row:
                self.lower_limit(f)
        p[f"{prefix}_on"][row], p[f"{prefix}_period"][row], p[f"{prefix}_duty"][row] = at, period, on / period
        f.period_s, f.duty = round(period, 1), round(on / period, 3)


#: Under load a small fleet's jobs can leave no cool GPU or free busy node for a fault; the plan then draws the
#: jobs again (deterministically: the attempt is part of their seed), this many times at most.
ATTEMPTS: Final = 8


def make_plan(config: ScenarioConfig) -> Plan:
    """The plan of ``config``: the same config (seed included) always gives the same plan."""
    if config.load == "idle":
        return _Planner(config).build()
    error: ValueError | None = None
    for attempt in range(ATTEMPTS):
        try:
            return _Planner(config, attempt).build()
        except ValueError as exc:
            error = exc
    assert error is not None
    raise error
