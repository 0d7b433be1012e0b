"""A scenario's plan: where its faults, traps and fleet oddities go, all decided up front from the seed.

Why a plan before any simulation: the labels must say exactly when each fault's evidence
first appears in the file, and that depends on the sampling schedule of the device's node
(its interval, jitter, gaps). Deciding nodes, schedules, placements and events first makes
the simulation a plain loop over time and every onset a lookup in a known schedule.

Times in a plan are *true* time: integer seconds (events, the simulation grid) or integer
microseconds (sample times) after ``T0_NS``. A node stamps its points with its own clock,
true time plus its skew; every time in the labels is in that node clock.

This module holds the plan's types; :func:`otel_dra.scenario.planner.make_plan` makes one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from otel_dra.scenario import load as wl
from otel_dra.scenario.kinds import FaultKind
from otel_dra.scenario.models import DeviceModel

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
#: Under load, fault onsets are looked for on this grid (seconds), then jittered within it.
BUSY_GRID_S: Final = 15


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
class PlannedFault:
    """A fault the plan puts on a device (not the agent's ``--fault`` injection, otel_dra.faults.Fault): its
    kind, its parameters for the labels, and how its label onset is found."""

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
    group: str | None = None  # with kind.scope: what the fault belongs to (node/<name>, pcie/<addr>, ...)
    #: A firmware fault's: every row of its version (the label lists them), and its fatal events
    #: (row, true second, XID, on the bad version or another).
    rows: list[int] = field(default_factory=list)
    #: ... and the version's rows lost on their own (device_lost, fell_off_bus): on the version until then, so
    #: named firmware rightly while they still report, but not required to be.
    lost_rows: list[int] = field(default_factory=list)
    events: list[FirmwareEvent] = field(default_factory=list)


@dataclass(frozen=True)
class FirmwareEvent:
    """A fatal event of a firmware fault's model: an XID (79 or 119) at ``at_s``, a device reset after it."""

    row: int
    at_s: int
    code: str
    bad: bool  # on the bad version (else on one of the model's other versions: the background)


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
    faults: list[PlannedFault]
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
