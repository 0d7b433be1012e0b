"""The planner: draws a scenario's fleet (nodes, schedules, devices) and places its oddities, traps and faults.

Why one object: every draw comes from one generator in one fixed order, so the same config (seed
included) always gives the same plan, byte for byte in the files. The placement of each concept lives
beside its own data: physics (:mod:`physics`), traps and oddities (:mod:`plan_traps`), what a fault
does (:mod:`fault_builders`), the job model under load (:mod:`plan_load`); this module holds the
order they are drawn in.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from otel_dra import conventions as cv
from otel_dra.scenario import fault_groups, plan_load, plan_traps
from otel_dra.scenario import load as wl
from otel_dra.scenario.fault_builders import BUILDERS
from otel_dra.scenario.kinds import DEVICE_TRAPS, FaultKind, copies_for, kinds_for
from otel_dra.scenario.models import H100, MI300X, MIX, MODELS, NIC
from otel_dra.scenario.physics import physics
from otel_dra.scenario.plan import (
    INTERVALS,
    JITTER,
    MAX_SKEW_S,
    T0_NS,
    US,
    WARMUP_S,
    Device,
    Event,
    Node,
    Plan,
    PlannedFault,
    Trap,
)
from otel_dra.scenario.series import KEY
from otel_dra.scenario.topology import node_topology

if TYPE_CHECKING:
    from otel_dra.scenario.generate import ScenarioConfig

#: Under load a small fleet's jobs can leave no cool GPU or free busy node for a fault; the plan then draws the
#: jobs again (deterministically: the attempt is part of their seed), this many times at most.
ATTEMPTS: Final = 8


@dataclass(frozen=True)
class Specials:
    """The nodes with a part to play: the restarted agent, the 60 s node with one missed sample, the silent
    node, the node a GPU is hot-plugged into; ``normal``: every node but the restarted and the silent one."""

    restart: Node
    missed60: Node
    silent: Node
    normal: list[Node]
    hotplug: Node


class Planner:
    """Builds a :class:`Plan`; one instance per generation (holds the RNG)."""

    def __init__(self, config: ScenarioConfig, attempt: int = 0) -> None:
        self.c = config
        self.attempt = attempt  # under load: which draw of the jobs (see make_plan)
        self.rng = np.random.default_rng([config.seed, 0x5CE7A])
        self.topo_rng = np.random.default_rng([config.seed, 0x70B0])  # fabric ids: the plan's draws stay as they were
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
        self.faults: list[PlannedFault] = []
        self.traps: list[Trap] = []
        #: (node, upstream or fabric id) of the parts a link fault is on: a lone GPU's link fault goes where no
        #: other link fault shares its switch or fabric (or its label, scope device, would be a group's).
        self.link_parts: set[tuple[int, str]] = set()
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
        device's silence while its node goes on) are in the recording. A thermal drift's or a fan decay's
        onset is where noise first carries it across the limit (some minutes either way): 5 minutes later."""
        lo = WARMUP_S + (300 if kind.name in ("thermal_drift", "fan_decay") else 0)
        return lo, self.D - max(kind.deadline_s + 120, 600)

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

    def specials(self, nodes: list[Node]) -> Specials:
        """The restarted agent (a short interval: skipping one sample stays under any stale timeout), the 60 s
        node with one missed sample, the silent node, the hot-plug node."""
        rng = self.rng

        def pick(candidates: list[Node]) -> Node:
            return candidates[int(rng.integers(len(candidates)))]

        restart = pick([x for x in nodes if x.interval_s <= 15])
        slow = [x for x in nodes if x is not restart and (x.interval_s == 60 or not self.mixed)]
        missed60 = pick(slow or [x for x in nodes if x is not restart])
        silent = pick([x for x in nodes if x not in (restart, missed60)])
        normal = [x for x in nodes if x not in (restart, silent)]
        return Specials(restart, missed60, silent, normal, pick(normal))

    def devices(self, nodes: list[Node], sp: Specials) -> tuple[list[Device], list[tuple[int, list[int]]]]:
        """Rows: every node's GPUs (the hot-plug node one more), then the shared NICs and their observers."""
        n_shared = max(1, self.c.nodes // 32)
        observers = [list(self.rng.choice(len(sp.normal), 2, replace=False)) for _ in range(n_shared)]
        devices: list[Device] = []
        for node in nodes:
            count = self.c.devices_per_node + (1 if node is sp.hotplug else 0)
            topology = node_topology(node.model.model, count, self.topo_rng)
            for i in range(count):
                row = len(devices)
                node.rows.append(row)
                devices.append(self.gpu(row, node, i, topology[i]))
        shared_views: list[tuple[int, list[int]]] = []
        for j, pair in enumerate(observers):
            row = len(devices)
            views = [sp.normal[int(p)].index for p in pair]
            devices.append(self.nic(row, views[0], j))
            for v in views:
                nodes[v].shared.append(row)
            shared_views.append((row, views))
        return devices, shared_views

    def build(self) -> Plan:
        nodes = self.nodes()
        for node in nodes:
            node.samples_us = self.schedule(node)
        sp = self.specials(nodes)
        devices, shared_views = self.devices(nodes, sp)
        hot_row = sp.hotplug.rows[-1]
        self.params, self.initial = physics(self.rng, nodes, devices)
        silence = plan_traps.silence(self, sp.silent)
        restart = plan_traps.agent_restart(self, sp.restart)
        plan_traps.hot_plug(self, sp.hotplug, hot_row)
        plan_traps.high_background(self, nodes)
        self.nodes_, self.devices_ = nodes, devices
        self.place(sp, hot_row)
        plan_traps.hot_history(self, hot_row)

        self.events.sort()
        return Plan(
            duration_s=self.D,
            nodes=nodes,
            devices=devices,
            faults=self.faults,
            traps=self.traps,
            events=self.events,
            glitches=self.glitches,
            omit=self.omit,
            silence=silence,
            restart=restart,
            params=self.params,
            initial=self.initial,
            shared_views=shared_views,
            load=self.c.load,
            workload=self.model,
            node_load=self.node_load,
        )

    def place(self, sp: Specials, hot_row: int) -> None:
        """Faults and device traps, on GPUs of ordinary nodes: the most constrained first (whole nodes, a hot
        GPU: one of the coolest GPUs of a training job, the one with the most room under its limit), then the
        picky kinds, then the rest and the device traps, copy by copy."""
        nodes, devices, rng = self.nodes_, self.devices_, self.rng
        pool = [r for x in sp.normal for r in x.rows if r != hot_row]
        rng.shuffle(pool)
        copies = copies_for(sum(len(x.rows) for x in nodes))
        taken: set[int] = set()
        if self.busy:  # the nodes whose job crash-loops take no fault and no device trap
            reserved = plan_load.workload(self, sp.normal, sp.hotplug, sp.missed60, copies)
            pool = [r for r in pool if devices[r].node not in reserved]

        def take(ok: Callable[[Device], bool], what: str) -> int:
            for r in pool:
                if r not in taken and ok(devices[r]):
                    taken.add(r)
                    return r
            raise ValueError(f"the fleet has no free GPU for {what}: raise --nodes or --devices-per-node")

        def vendor_fits(nvidia_only: bool, d: Device) -> bool:
            return not nvidia_only or (d.model is not None and d.model.vendor == "NVIDIA")

        r60 = take(lambda d: d.node == sp.missed60.index, "the missed sample on a 60 s node")
        plan_traps.missed_sample(self, r60, "one_missed_sample")
        placed = kinds_for(self.c.load, self.c.gpus) if self.c.faults else ()
        hot = [k for k in placed if k.name == "hot_gpu"]
        spare: set[int] = set()  # the nodes of the coolest GPUs: a node-wide fault goes elsewhere if it can
        if hot:
            best = sorted((r for r in pool if self.fits(hot[0], devices[r])), key=lambda r: -self.room_of(r))
            spare = {devices[r].node for r in best[: 2 * copies]}
        for kind in (k for k in placed if k.whole_node):
            for _ in range(copies):
                candidates = [x for x in sp.normal if x not in (sp.hotplug, sp.missed60)]
                plan_load.node_fault(self, kind, candidates, taken, spare)
        pool_set = set(pool)
        for kind in (k for k in placed if k.shared in ("pcie", "fabric")):  # whole switches and fabrics
            for _ in range(copies):
                place_group = fault_groups.pcie_switch if kind.shared == "pcie" else fault_groups.fabric
                place_group(self, kind, pool_set, taken, spare)
        for kind in hot:
            for _ in range(copies):
                free = [r for r in pool if r not in taken and self.fits(kind, devices[r])]
                if free:
                    pool.insert(0, pool.pop(pool.index(max(free, key=self.room_of))))
                self.fault(kind, take(functools.partial(self.fits, kind), f"a {kind.name} fault (a cool GPU)"))
        kinds = [k for k in placed if not k.whole_node and k.shared is None and k.name != "hot_gpu"]
        kinds.sort(key=lambda k: not (k.nvidia_only or k.needs_limits or k.low_rate_only or k.busy_only or k.link))
        for _ in range(copies):
            for kind in kinds:
                row = take(functools.partial(self.fits, kind), f"a {kind.name} fault")
                self.fault(kind, row)
            for trap in DEVICE_TRAPS:
                nvidia = trap == "single_app_error"
                row = take(functools.partial(vendor_fits, nvidia), trap)
                plan_traps.device_trap(self, trap, row)
        for kind in (k for k in placed if k.shared == "firmware"):  # last: its events go on GPUs left clean
            fault_groups.firmware_version(self, kind, pool_set, taken)

    def gpu(self, row: int, node: Node, i: int, topology: dict[str, str]) -> Device:
        m, rng = node.model, self.rng
        firmware = m.firmware_for(float(rng.random()))
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
            **topology,
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

    # -- placement -----------------------------------------------------------------------------
    def room_of(self, row: int) -> float:
        """How hot ``row`` may run over its peers (see :func:`plan_load.hot_room`); -inf where it may not."""
        return plan_load.room_of(self, row)

    def fits(self, kind: FaultKind, d: Device) -> bool:
        m = d.model
        if m is None:
            return False
        if kind.nvidia_only and m.vendor != "NVIDIA":
            return False
        if kind.needs_limits and not m.reports_limits:
            return False
        if kind.link is not None and kind.link not in m.link_per_min:
            return False
        if "link" in kind.reasons and self.parts_of(d) & self.link_parts:
            return False
        if d.row in self.lane_of_row and not plan_load.busy_onsets(self, [d.row], kind):
            return False  # under load a fault goes where a job holds the GPU around its onset
        if kind.busy_only:
            lane = self.lane_of_row.get(d.row)
            if lane is None or lane.kind == "vacant":
                return False
            if kind.name == "hot_gpu" and self.room_of(d.row) < 6.5:
                return False
        return not (kind.low_rate_only and m.corrected_per_min * 10 >= 6.0)

    def fault(self, kind: FaultKind, row: int) -> None:
        """Place one fault: its onset, then its parameters and events (:data:`fault_builders.BUILDERS`)."""
        m = self.devices_[row].model
        assert m is not None
        lo, hi = self.onset_window(kind)
        at = plan_load.onset(self, row, kind, lo, hi)
        f = PlannedFault(kind, row, self.devices_[row].node, evidence_us=at * US, detail={"hw.model": m.model})
        BUILDERS[kind.name](self, f, at, m)
        self.faults.append(f)
        if "link" in kind.reasons:
            self.link_parts |= self.parts_of(self.devices_[row])

    def parts_of(self, d: Device) -> set[tuple[int, str]]:
        """The shared parts ``d`` sits on: its switch (or root port) and its fabric, with its node."""
        return {(d.node, d.attrs[a]) for a in (cv.HW_PCIE_UPSTREAM, cv.HW_FABRIC_ID) if a in d.attrs}


def make_plan(config: ScenarioConfig) -> Plan:
    """The plan of ``config``: the same config (seed included) always gives the same plan."""
    if config.load == "idle":
        return Planner(config).build()
    error: ValueError | None = None
    for attempt in range(ATTEMPTS):
        try:
            return Planner(config, attempt).build()
        except ValueError as exc:
            error = exc
    assert error is not None
    raise error


__all__ = ["ATTEMPTS", "Planner", "Specials", "make_plan"]
