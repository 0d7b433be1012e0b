"""``otel-dra simulate``: a messy GPU fleet as an OTLP JSON lines recording, and its labels.

A policy tuned on one tidy recording fails on the next fleet. This generator draws a new
fleet per seed: several GPU models with their own limits and background rates (one with no
limits at all), per-node sampling intervals with jitter, per-node clock skew, every fault
kind of the contract (hard, soft, slow, intermittent) at random devices and times, traps
that must not be flagged, a shared network device and a silent node. The labels say what a
classifier must find, by when, in each node's own clock. ``load`` puts the GPUs to work
(:mod:`otel_dra.scenario.load`: training jobs, inference replicas, their crashes) and adds the
faults that show only under load; ``idle``, the default, writes what it always wrote. Every GPU
carries its topology (PCI address, the switch above it, its NVLink fabric: :mod:`~otel_dra.scenario.topology`)
and one of its model's firmware versions; fleets of 256 GPUs or more (the long form) also get faults of
those shared parts (:mod:`~otel_dra.scenario.fault_groups`: a PCIe switch, a fabric, a bad firmware version)
beside the same evidence on one GPU alone.

How it is fast: the fleet is one state matrix (devices as rows, series as columns) stepped
once per second with numpy; a node's line is one ``%`` format of a per-node template (the
attribute JSON never changes between lines, only values and stamps do), and gzip runs on a
second thread (zlib releases the GIL), so formatting and compression overlap.

The pieces, each in its module: the plan (:mod:`~otel_dra.scenario.planner`), the simulation
(:mod:`~otel_dra.scenario.simulation`), the lines (:mod:`~otel_dra.scenario.otlp_lines`,
:mod:`~otel_dra.scenario.writer`) and the labels (:mod:`~otel_dra.scenario.labels`); this module holds
the config and runs them in order.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Final

import numpy as np

from otel_dra.scenario.kinds import FAULT_KINDS, GPUS_PER_COPY, KIND, devices_needed
from otel_dra.scenario.labels import labels_doc
from otel_dra.scenario.load import PROFILES
from otel_dra.scenario.otlp_lines import LineTemplates
from otel_dra.scenario.plan import US, PlannedFault
from otel_dra.scenario.planner import make_plan
from otel_dra.scenario.series import KEY, SERIES
from otel_dra.scenario.simulation import FleetSim
from otel_dra.scenario.writer import LineWriter

SHAPES: Final = ("mixed", "tidy")
MIN_NODES: Final = 6
MAX_NODES: Final = 1000
MAX_DEVICES_PER_NODE: Final = 16
#: A 15-minute healthy warm-up, then room for a 30-minute deadline.
MIN_DURATION_S: Final = 3000
MAX_DURATION_S: Final = 86400


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
    sim = FleetSim(plan, np.random.default_rng([config.seed, 0xD1CE]))
    lines = LineTemplates(plan, sim)
    nodes, D = plan.nodes, plan.duration_s

    for f in plan.faults:  # onsets at the node's first line that shows the evidence
        if f.evidence_us is not None:
            node = nodes[f.node]
            i = int(np.searchsorted(node.samples_us, f.evidence_us))
            if i < len(node.samples_us):
                f.onset_ns = node.stamp_ns(int(node.samples_us[i]))
    crossing: dict[int, list[PlannedFault]] = {}
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
    with LineWriter(recording) as out:
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

    doc = labels_doc(config, plan)
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


def _crossed(f: PlannedFault, value: float) -> bool:
    """Whether a crossing fault's value, as the file shows it, is past its limit."""
    decimals = SERIES[KEY[f.cross_key or ""]].decimals
    shown = round(float(value), decimals)
    return shown > f.cross_limit if f.cross_above else shown < f.cross_limit


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
