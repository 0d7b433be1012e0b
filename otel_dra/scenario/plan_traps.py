"""Traps and fleet oddities of a plan: what a classifier must not flag, and what the fleet does besides.

Why they are planned with the faults: a trap is evidence that looks like a fault for a moment (a spike,
one application error, a counter reset, a missed sample, history a device brings), so it must sit on a
device no fault is on, at a time the labels can name. The oddities (a silent node, an agent restart, a
hot-plugged GPU, a model whose background would be a fault on any other) are the fleet's, one each.
Every function takes the :class:`~otel_dra.scenario.planner.Planner` and draws from its generator.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import numpy as np

from otel_dra.scenario.models import MI300X, DeviceModel
from otel_dra.scenario.plan import SILENCE_S, US, WARMUP_S, Node, Trap
from otel_dra.scenario.series import KEY

if TYPE_CHECKING:
    from otel_dra.scenario.planner import Planner


# -- the fleet's oddities --------------------------------------------------------------------------
def silence(pl: Planner, silent: Node) -> tuple[int, int, int]:
    """The silent node: nothing for ten minutes, then it resumes. Returns (node, true seconds [from, to))."""
    s_from = pl.second(WARMUP_S, pl.D - SILENCE_S - 420)
    t = silent.samples_us
    silent.samples_us = t[(t < s_from * US) | (t >= (s_from + SILENCE_S) * US)]
    return silent.index, s_from, s_from + SILENCE_S


def agent_restart(pl: Planner, restart: Node) -> tuple[int, int, int]:
    """The agent restart: one sample skipped, every counter from zero, a new start time. Returns (node, grid
    second, new startTimeUnixNano in the node's clock)."""
    at = pl.second(WARMUP_S, pl.D - 300)
    t = restart.samples_us
    skipped = int(np.searchsorted(t, at * US))
    if skipped + 1 >= len(t):
        skipped = len(t) - 2
        at = int(t[skipped] // US)
    nxt = int(t[skipped + 1])
    restart.samples_us = np.delete(t, skipped)
    new_start = restart.stamp_ns(at * US + (nxt - at * US) // 2)
    pl.event(at, "restart", node=restart.index)  # its new start time is Plan.restart's
    pl.traps.append(Trap("agent_restart", restart.index, None, restart.stamp_ns(at * US)))
    return restart.index, at, new_start


def hot_plug(pl: Planner, node: Node, row: int) -> None:
    """The hot-plugged device: absent until it appears (its history: :func:`hot_history`)."""
    appear = pl.second(600, pl.D - 1200)
    pl.event(appear, "appear", row)
    pl.traps.append(Trap("hot_plug", node.index, row, node.stamp_ns(appear * US)))


def high_background(pl: Planner, nodes: list[Node]) -> None:
    """A whole model whose background of corrected errors would be a fault on any other: a trap per node."""
    for node in nodes:
        if node.model is MI300X:
            detail = {"hw.model": MI300X.model, "corrected_per_min": MI300X.corrected_per_min}
            pl.traps.append(Trap("high_background_cohort", node.index, None, None, detail))


def hot_history(pl: Planner, row: int) -> None:
    """The hot-plugged device was used elsewhere: its counters arrive with history."""
    m = pl.devices_[row].model
    assert m is not None
    init = pl.initial
    init[row, KEY["err.corrected"]] += 2500
    init[row, KEY["err.uncorrected"]] = 1
    init[row, KEY["err.retired_page"]] = 1
    init[row, KEY["err.reset"]] = 2
    if m.vendor == "NVIDIA":
        init[row, KEY["err.driver.13"]] = 3
    pl.params["present"][row] = False


# -- samples ---------------------------------------------------------------------------------------
def first_sample_at(node: Node, at_us: int) -> int:
    """The true time (µs) of the node's first sample at or after ``at_us``."""
    i = int(np.searchsorted(node.samples_us, at_us))
    return int(node.samples_us[min(i, len(node.samples_us) - 1)])


def sample_between(pl: Planner, node: Node, lo_s: float, hi_s: float, quiet: bool = False) -> int:
    """A random sample of the node in [lo, hi] s; ``quiet``: one whose neighbours are at most two
    intervals apart (so skipping it leaves a gap no stale timeout may count)."""
    t = node.samples_us
    idx = np.nonzero((t >= lo_s * US) & (t <= hi_s * US))[0]
    if quiet:
        idx = idx[(idx > 0) & (idx < len(t) - 1)]
        idx = idx[t[np.minimum(idx + 1, len(t) - 1)] - t[idx - 1] <= 2 * node.interval_s * US]
    return int(t[int(pl.rng.choice(idx))])


def missed_sample(pl: Planner, row: int, kind: str) -> None:
    """One line of the device's node goes without it."""
    node = pl.nodes_[pl.devices_[row].node]
    at = sample_between(pl, node, 300, pl.D - 300, quiet=True)
    pl.omit.setdefault((node.index, at), set()).add(row)
    pl.traps.append(Trap(kind, node.index, row, node.stamp_ns(at), {"interval_s": node.interval_s}))


# -- device traps ------------------------------------------------------------------------------------
def _counter_history(pl: Planner, kind: str, row: int, node: Node, m: DeviceModel) -> None:
    """History the device brings: an uncorrected ECC error and old XIDs, from before the recording."""
    pl.initial[row, KEY["err.uncorrected"]] = pl.rng.integers(1, 3)
    pl.initial[row, KEY["err.retired_page"]] = pl.initial[row, KEY["err.uncorrected"]]
    codes = {"48": 1, "31": 2} if m.vendor == "NVIDIA" else {}
    for code, n in codes.items():
        pl.initial[row, KEY[f"err.driver.{code}"]] = n
    pl.traps.append(Trap(kind, node.index, row, None, {"hw.error.code": sorted(codes)}))


def _single_app_error(pl: Planner, kind: str, row: int, node: Node, m: DeviceModel) -> None:
    """One application XID, never repeated."""
    at = pl.second(300, pl.D - 900)
    pl.event(at, "add", row, "err.driver.13", 1.0)
    pl.traps.append(Trap(kind, node.index, row, node.stamp_ns(at * US), {"hw.error.code": "13"}))


def _counter_reset(pl: Planner, kind: str, row: int, node: Node, m: DeviceModel) -> None:
    """From a long history to zero, then growing again (a low-rate model may be slow to)."""
    at = pl.second(300, pl.D - 900)
    pl.initial[row, KEY["err.corrected"]] += 5000
    pl.event(at, "reset_series", row, "err.corrected", node=node.index)
    pl.event(at + pl.uniform(60, 300), "add", row, "err.corrected", 1.0)
    detail: dict[str, Any] = {"series": "hw.errors{error.type=corrected}"}
    pl.traps.append(Trap(kind, node.index, row, node.stamp_ns(at * US), detail))


def _glitch(pl: Planner, kind: str, row: int, node: Node, m: DeviceModel) -> None:
    """A value shown by one sample only: a temperature over its limit, power at the cap, memory nearly full."""
    at_us = sample_between(pl, node, 300, pl.D - 300)
    g = at_us // US
    if kind == "temp_spike":
        value = min(m.temp_degraded_c + pl.uniform(3, 6), m.temp_critical_c - 0.5)
        pl.glitches.setdefault(g, []).append((row, "temp.gpu", round(value, 2)))
    elif kind == "power_spike":
        pl.glitches.setdefault(g, []).append((row, "power", round(pl.params["cap"][row] * pl.uniform(0.99, 1.0), 1)))
    else:
        frac = pl.uniform(0.985, 0.995)
        pl.glitches.setdefault(g, []).append((row, "mem.util", frac))
        pl.glitches.setdefault(g, []).append((row, "mem.usage", float(np.floor(frac * m.memory_bytes))))
    pl.traps.append(Trap(kind, node.index, row, node.stamp_ns(at_us)))


def _missed(pl: Planner, kind: str, row: int, node: Node, m: DeviceModel) -> None:
    missed_sample(pl, row, kind)


#: Each device trap (kinds.DEVICE_TRAPS) and what places it.
DEVICE_TRAP_BUILDERS: Final[Mapping[str, Callable[[Planner, str, int, Node, DeviceModel], None]]] = {
    "temp_spike": _glitch,
    "power_spike": _glitch,
    "mem_spike": _glitch,
    "single_app_error": _single_app_error,
    "counter_reset": _counter_reset,
    "missed_sample": _missed,
    "counter_history": _counter_history,
}


def device_trap(pl: Planner, kind: str, row: int) -> None:
    """Place one device trap of ``kind`` on ``row``."""
    d = pl.devices_[row]
    assert d.model is not None
    DEVICE_TRAP_BUILDERS[kind](pl, kind, row, pl.nodes_[d.node], d.model)
