"""Planning under load (``--load training|inference|mixed``): the jobs, their crashes, and faults that must
show on a busy GPU.

Why the plan asks the job model: a fault under load shows as itself only while a job holds its GPU (an
idle GPU's power, memory and temperature tell nothing), a crash leaves evidence on every GPU of its job
(a workload trap, not a device fault), and a GPU's temperature sits where its job's power holds it. So the
jobs are drawn first (from their own generators: the idle profile's files stay what they were), and the
faults' onsets, thermal sizes and limits are read off them. Every function takes the
:class:`~otel_dra.scenario.planner.Planner`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from otel_dra.scenario import load as wl
from otel_dra.scenario.kinds import FaultKind
from otel_dra.scenario.plan import BUSY_GRID_S, T0_NS, US, WARMUP_S, Node, PlannedFault, Trap

if TYPE_CHECKING:
    from otel_dra.scenario.planner import Planner


# -- the jobs -------------------------------------------------------------------------------------------
def workload(pl: Planner, normal: list[Node], hotplug: Node, missed60: Node, copies: int) -> set[int]:
    """Each node's profile and lanes (jobs, gaps, crashes), the workload traps the plan guarantees (per copy
    a job that crashes once or twice and one that crash-loops, on ordinary busy nodes), the busy GPUs'
    thermal layout, and every crash as counter events (an application XID, NVIDIA only, and an OOM on every
    GPU the job held, in one second). Returns the crash-looping nodes: no fault or device trap goes there.

    Draws from its own generators, never the plan's: the idle profile's files stay what they were."""
    c, nodes = pl.c, pl.nodes_
    lrng = np.random.default_rng([c.seed, 0x10AD, *([pl.attempt] if pl.attempt else [])])
    pl.node_load = wl.profile_of_nodes(c.load, len(nodes), lrng)
    lanes, lane_rows, node_lanes = _lanes(pl, lrng)
    looping = _forced_crashes(pl, lanes, node_lanes, normal, (hotplug, missed60), copies, lrng)
    for lane in lanes:
        lane.forced.sort(key=lambda f: f.at)
        lane.extend(pl.D + 7200.0)
    for lane, rows in zip(lanes, lane_rows, strict=True):
        for r in rows:
            pl.lane_of_row[r] = lane
    _thermal_layout(pl, lrng)
    pl.model = wl.LoadModel(
        lanes, lane_rows, pl.params["idle"], pl.params["cap"], np.random.default_rng([c.seed, 0x10AD, 1]), T0_NS / 1e9
    )
    for lane, rows in zip(lanes, lane_rows, strict=True):
        if rows and lane.kind != "vacant":
            _crash_events(pl, lane, rows)
    return looping


def _lanes(pl: Planner, lrng: np.random.Generator) -> tuple[list[wl.Lane], list[list[int]], dict[int, list[int]]]:
    """The lanes of every busy node, their rows, and each node's lanes (by index); a GPU no job holds (the
    hot-plugged one) gets a vacant lane."""
    lanes: list[wl.Lane] = []
    lane_rows: list[list[int]] = []
    node_lanes: dict[int, list[int]] = {}
    for node, prof in zip(pl.nodes_, pl.node_load, strict=True):
        if prof not in wl.BUSY:
            continue
        gpus = [r for r in node.rows]
        covered: set[int] = set()
        for lane in wl.make_lanes(prof, pl.c.devices_per_node, lrng):
            node_lanes.setdefault(node.index, []).append(len(lanes))
            lanes.append(lane)
            lane_rows.append([gpus[i] for i in lane.slots])
            covered.update(lane.slots)
        rest = [r for i, r in enumerate(gpus) if i not in covered]  # the hot-plugged GPU: no job holds it yet
        if rest:
            node_lanes[node.index].append(len(lanes))
            lanes.append(wl.Lane("vacant", range(len(rest)), lrng))
            lane_rows.append(rest)
    return lanes, lane_rows, node_lanes


def _forced_crashes(
    pl: Planner,
    lanes: list[wl.Lane],
    node_lanes: dict[int, list[int]],
    normal: list[Node],
    special: tuple[Node, ...],
    copies: int,
    lrng: np.random.Generator,
) -> set[int]:
    """The guaranteed workload traps, on any busy ordinary node: per copy a crash loop and a job that crashes
    once or twice. Sets the crashing nodes; returns the looping ones."""
    D = pl.D
    busy = [x for x in normal if x.index in node_lanes and x not in special]
    if len(busy) < 3 * copies:
        raise ValueError(
            f"under --load {pl.c.load} the fleet has {len(busy)} busy ordinary nodes, too few for every workload "
            f"trap and node-wide fault (needs {3 * copies}): raise --nodes"
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
    pl.crashing = {x.index for x in crashing}
    return {x.index for x in looping}


def _thermal_layout(pl: Planner, lrng: np.random.Generator) -> None:
    """Thermal layout of the busy GPUs: at its cap the hottest possible one stays MIN_HEADROOM_C under its
    high.degraded limit; inlet (ambient under 28.5 °C, the hottest nodes'), slot and spread cool the rest."""
    p, nodes, devices = pl.params, pl.nodes_, pl.devices_
    managed = np.array(sorted(pl.lane_of_row), np.intp)
    limit = np.array([m.temp_degraded_c for m in (devices[r].model for r in managed) if m is not None])
    slot = np.array(
        [wl.slot_offsets(len(nodes[devices[r].node].rows))[nodes[devices[r].node].rows.index(r)] for r in managed]
    )
    inlet_gap = np.maximum(28.5 - p["ambient"][managed], 0.0)
    t_cap = wl.full_load_temperature(limit, slot, inlet_gap, lrng)
    p["r"][managed] = (t_cap - p["ambient"][managed]) / p["cap"][managed]
    p["r_hot"][managed] = p["r"][managed]


def _crash_events(pl: Planner, lane: wl.Lane, rows: list[int]) -> None:
    """A lane's every crash: counter events, and its job's trap."""
    node = pl.nodes_[pl.devices_[rows[0]].node]
    nvidia = node.model.vendor == "NVIDIA"
    by_job: dict[int, list[wl.Run]] = {}
    for run, job in lane.crashes(1.0, float(pl.D)):
        at = int(run.end)
        for r in rows:
            if nvidia:
                pl.event(at, "add", r, f"err.driver.{job.xid}", 1)
            pl.event(at, "add", r, "err.out_of_memory", 1)
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
        detail["hw.ids"] = [pl.devices_[r].hw_id for r in rows]
        detail["load"] = lane.kind
        if looped:
            detail["from_unix_nano"], detail["to_unix_nano"] = times[0], times[-1]
        pl.traps.append(Trap(kind, node.index, None, times[0], detail))


# -- onsets ----------------------------------------------------------------------------------------------
def running(pl: Planner, row: int, t: float) -> bool:
    """Whether a job holds ``row`` at ``t`` (always, for a device no lane manages)."""
    lane = pl.lane_of_row.get(row)
    return lane is None or lane.run_at(t) is not None


def onset(pl: Planner, row: int, kind: FaultKind, lo: float, hi: float) -> int:
    """A fault's onset: any second in [lo, hi], or under load one of :func:`busy_onsets`."""
    if row not in pl.lane_of_row:
        return pl.second(lo, hi)
    choices = busy_onsets(pl, [row], kind)
    at = choices[int(pl.rng.integers(len(choices)))]
    return min(at + int(pl.rng.integers(0, BUSY_GRID_S)), int(hi))


def busy_onsets(pl: Planner, rows: list[int], kind: FaultKind) -> list[int]:
    """Onsets in the kind's window (every BUSY_GRID_S) around which a job holds every one of ``rows``:
    from 10 minutes before to 2 minutes past its deadline, 90% of the time outside crash loops, so a fault
    under load shows as itself on a busy GPU (and the labels ask nothing of an idle one)."""
    lanes = {id(lane): lane for lane in (pl.lane_of_row.get(r) for r in rows) if lane is not None}
    lo, hi = pl.onset_window(kind)
    key = (tuple(sorted(lanes)), lo, hi, kind.deadline_s)
    found = pl.busy_cache.get(key)
    if found is None:
        found = pl.busy_cache[key] = [
            at
            for at in range(lo, hi + 1, BUSY_GRID_S)
            if all(lane.coverage(at - 600, at + kind.deadline_s + 120) >= 0.9 for lane in lanes.values())
        ]
    return found


# -- temperatures and limits -------------------------------------------------------------------------------
def steady_temperature(pl: Planner, row: int) -> float:
    """Fix the device's workload and return the temperature it settles at with a healthy fan."""
    p = pl.params
    p["steady"][row] = True
    job = p["job"][row] = pl.uniform(0.7, 0.9)
    return float(p["ambient"][row] + p["r"][row] * (p["idle"][row] + job * (0.9 * p["cap"][row] - p["idle"][row])))


def base_temperature(pl: Planner, row: int, at: float) -> float:
    """Where the device's temperature sits around ``at``: under load, its job's mean power (idle in a gap)
    through its thermal resistance; otherwise a steady workload fixed for it."""
    if row not in pl.lane_of_row or pl.model is None:
        return steady_temperature(pl, row)
    p = pl.params
    power = min(float(pl.model.expected_demand_w(np.array([row]), at)[0]), float(p["cap"][row]))
    return float(p["ambient"][row] + p["r"][row] * power)


def hot_room(pl: Planner, row: int) -> tuple[float, float, float] | None:
    """How hot ``row`` may run over its peers and itself (°C) with its limit still 0.5 °C away when held at
    its cap, with the reference (``base`` °C at ``low`` W) the offset is measured from; None off a training
    job or without peers (see :func:`hot_gpu`)."""
    p, lane = pl.params, pl.lane_of_row.get(row)
    m = pl.devices_[row].model
    if lane is None or not lane.training or m is None:
        return None
    peers = [r for r, other in pl.lane_of_row.items() if other is lane and r != row]
    runs = [r for r in lane.runs if not r.loop and r.end > WARMUP_S and r.start < pl.D]
    if len(peers) < 2 or not runs:
        return None
    cap = float(p["cap"][row])
    low = min(cap * (r.compute + (1 - r.compute) * r.comm) for r in runs)
    amb = float(p["ambient"][row])
    base = max(float(np.median(p["ambient"][peers] + p["r"][peers] * low)), amb + float(p["r"][row]) * low)
    return (m.temp_degraded_c - 0.5 - amb) * low / cap - (base - amb), base, low


def room_of(pl: Planner, row: int) -> float:
    found = hot_room(pl, row)
    return found[0] if found is not None else -math.inf


def hot_gpu(pl: Planner, row: int) -> tuple[float, float] | None:
    """A hot GPU's offset over its peers' median and its own temperature at the same load (6-10 °C, smaller
    where its limit needs it) and the thermal resistance that makes it; None off a training job (a hot GPU
    is told by its peers at one steady load; an inference replica's traffic swings to the cap at its peaks,
    where the same resistance would cross the limit), without peers, or without room under its limit.
    The offset holds at the lowest mean power its job runs at in the recording; held at its cap the GPU
    stays 0.5 °C under its high.degraded limit (compute phases run at the cap for seconds at a time)."""
    found = hot_room(pl, row)
    if found is None or found[0] < 6.5:
        return None
    room, base, low = found
    offset = pl.uniform(6.0, min(10.0, room))
    return offset, (base + offset - float(pl.params["ambient"][row])) / low


def lower_limit(pl: Planner, f: PlannedFault) -> None:
    """Under load a power-throttled device has its power limit lowered to 0.55-0.7 of nominal (reported
    in hw.power.limit{max}): pinned at it, it accrues power_cap time nearly all its busy time."""
    p = pl.params
    p["limit_factor"][f.row] = pl.uniform(0.55, 0.7)
    f.detail["limit_w"] = round(float(p["cap"][f.row] * p["limit_factor"][f.row]), 1)


# -- a node-wide fault --------------------------------------------------------------------------------------
def node_fault(pl: Planner, kind: FaultKind, candidates: list[Node], taken: set[int], spare: set[int]) -> None:
    """A fault on every GPU of one node (one label each, scope ``node``, group ``node/<name>``): under load,
    a node's power brake (every GPU accrues power_brake time for most of each minute, power about half)."""
    ok = [
        x for x in candidates
        if x.index not in pl.crashing and not (set(x.rows) & taken) and x.rows
        and all(pl.fits(kind, pl.devices_[r]) for r in x.rows) and busy_onsets(pl, x.rows, kind)
    ]  # fmt: skip
    if not ok:
        raise ValueError(f"the fleet has no free node for a {kind.name} fault: raise --nodes")
    ok = [x for x in ok if x.index not in spare] or ok  # ``spare``: kept for what needs them more
    node = ok[int(pl.rng.integers(len(ok)))]
    choices = busy_onsets(pl, node.rows, kind)
    at = choices[int(pl.rng.integers(len(choices)))]
    p = pl.params
    factor, share = pl.uniform(0.45, 0.55), pl.uniform(0.85, 1.0)
    group = f"node/{node.name}"
    for r in node.rows:
        taken.add(r)
        p["brake_on"][r], p["brake_w"][r], p["brake_share"][r] = at, factor * p["cap"][r], share
        m = pl.devices_[r].model
        detail = {"hw.model": m.model if m else None, "power_w": round(float(factor * p["cap"][r]), 1)}
        detail["asserted_share"] = round(share, 2)
        pl.faults.append(PlannedFault(kind, r, node.index, evidence_us=at * US, detail=detail, group=group))
