"""What each fault kind does to its device: a table from kind name to the function that sets it up.

Why a table: a fault is a few parameters of its row (:mod:`otel_dra.scenario.physics`: an onset, a rate, a
level) and a few counter events, different for every kind; one small function per kind, found by name,
keeps each kind readable on its own and makes a kind without a builder an import-time error. Every
builder gets the planner, the fault (its onset found, ``detail`` holding ``hw.model``), the onset second
``at`` and the device's model, and draws from the planner's generator in a fixed order.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

import numpy as np

from otel_dra.scenario.kinds import KIND
from otel_dra.scenario.models import DeviceModel
from otel_dra.scenario.plan import US, PlannedFault
from otel_dra.scenario.plan_load import base_temperature, hot_gpu, lower_limit, running
from otel_dra.scenario.plan_traps import first_sample_at

if TYPE_CHECKING:
    from otel_dra.scenario.planner import Planner

Builder = Callable[["Planner", PlannedFault, int, DeviceModel], None]
#: A link type's column in physics' background rates (0: corrected ECC).
LINK_COLUMN: Final = MappingProxyType({"pcie": 1, "nvlink": 2, "xgmi": 3})


def _every(pl: Planner, start: float, lo: float, hi: float) -> list[float]:
    """Times from ``start`` to the end of the recording, ``lo``-``hi`` seconds apart (drawn as they go)."""
    out, t = [], float(start)
    while t < pl.D:
        out.append(t)
        t += pl.uniform(lo, hi)
    return out


# -- hard faults --------------------------------------------------------------------------------------------
def ecc_uncorrected(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    n = int(pl.rng.integers(1, 3))
    pl.event(at, "add", f.row, "err.uncorrected", n)
    pl.event(at, "add", f.row, "err.retired_page", n)
    pl.event(at + pl.uniform(300, 900), "add", f.row, "err.uncorrected", 1)


def xid_dbe(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """XID 48, a double-bit ECC error: the XID, an uncorrected error and a retired page at once."""
    f.detail["hw.error.code"] = "48"
    pl.event(at, "add", f.row, "err.driver.48", 1)
    pl.event(at, "add", f.row, "err.uncorrected", 1)
    pl.event(at, "add", f.row, "err.retired_page", 1)


def fell_off_bus(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """XID 79: the device shows the XID once or twice, then falls silent."""
    f.detail["hw.error.code"] = "79"
    pl.event(at, "add", f.row, "err.driver.79", 1)
    node = pl.nodes_[f.node]
    seen = first_sample_at(node, at * US) / US
    pl.event(np.ceil(seen + pl.uniform(1.2, 2.2) * node.interval_s), "vanish", f.row)


def device_lost(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    pl.event(at, "vanish", f.row)


def vendor_failed(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    pl.event(at, "status", f.row, "status.failed")


# -- soft faults ----------------------------------------------------------------------------------------------
def ecc_corrected_storm(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    p = pl.params
    p["storm_on"][f.row], p["storm_rate"][f.row] = at, pl.uniform(50, 200) / 60
    f.detail["corrected_per_min"] = round(p["storm_rate"][f.row] * 60, 1)


def ecc_cohort_outlier(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """5-10x its model's median background, under a fixed threshold's reach (5.5 a minute at most)."""
    rate = min(m.corrected_per_min * pl.uniform(5, 10), 5.5)
    pl.params["outlier_on"][f.row], pl.params["outlier_rate"][f.row] = at, rate / 60
    f.detail["corrected_per_min"] = round(rate, 2)
    f.detail["model_median_per_min"] = m.corrected_per_min


def thermal_drift(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """The temperature creeps for 30-60 min towards a plateau above the limit (held under the critical one by
    the device's own throttling); the onset is the first sample above the limit."""
    p, row = pl.params, f.row
    base = base_temperature(pl, row, at)
    limit = m.temp_degraded_c
    plateau = max(limit + pl.uniform(3.5, 5.0), m.throttle_c + 1.5)
    length = pl.uniform(1800, 3600)
    frac = (limit - base) / (plateau - base)
    p["drift_on"][row] = at - frac * length
    p["drift_len"][row], p["drift_extra"][row] = length, plateau - base
    f.evidence_us, f.cross_key, f.cross_limit, f.cross_above = None, "temp.gpu", limit, True
    f.detail.update(limit=limit, ramp_s=round(length))


def fan_decay(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """The fan loses capability over 50-70 min; the onset is the first sample under its floor."""
    p, row = pl.params, f.row
    p["steady"][row] = True
    p["job"][row] = pl.uniform(0.7, 0.9)
    length = pl.uniform(3000, 4200)
    share = 1.0 - m.fan_floor_ratio / 0.85  # the fan controller runs near 0.85 as the device heats up
    p["fan_decay_on"][row], p["fan_decay_len"][row] = at - share * length, length
    key = "fan.speed" if m.fan == "rpm" else "fan.ratio"
    f.evidence_us, f.cross_key, f.cross_limit, f.cross_above = None, key, m.fan_floor, False
    f.detail.update(limit=m.fan_floor, series=key, decay_s=round(length))


def power_throttling(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    pl.params["throttle_on"][f.row] = at
    if f.row in pl.lane_of_row:  # under load: its power limit lowered, so it runs capped while its peers don't
        lower_limit(pl, f)


def power_delivery(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """Voltage under its critical floor, and a power error every 1-4 minutes."""
    p, row = pl.params, f.row
    p["pdeliv_on"][row] = at
    floor = m.volt_limits.get("low.critical", m.volt_nominal - 0.08)
    p["pdeliv_volt"][row] = floor - pl.uniform(0.02, 0.06)
    for t in _every(pl, at, 60, 240):
        pl.event(t, "add", row, "err.power", 1)


def link_degraded(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    pl.params["linkdeg_on"][f.row] = at


def memory_pressure(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """Memory nearly full and an out-of-memory every 3-7 minutes. Under load memory is full on every GPU of
    the job; this one runs out again and again, across jobs, while its neighbours stay clean (only while a
    job holds it)."""
    row = f.row
    if row in pl.lane_of_row:
        for t in _every(pl, at, 180, 420):
            if running(pl, row, t):
                pl.event(t, "add", row, "err.out_of_memory", 1)
        return
    pl.params["mempress_on"][row], pl.params["mempress_level"][row] = at, pl.uniform(0.975, 0.99)
    for t in _every(pl, at, 180, 420):
        pl.event(t, "add", row, "err.out_of_memory", 1)


def app_errors_repeated(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """Repeated application XIDs (13) on this GPU only. Idle: two earlier ones within the hour, the onset is
    the third, more follow. Under load: one every 10-20 min across jobs, two in the hour before the onset."""
    row = f.row
    if row in pl.lane_of_row:
        e2 = at - pl.uniform(600, 1200)
        e1 = max(300.0, e2 - pl.uniform(600, 1200))
        for e in (e1, e2):
            if running(pl, row, e):
                pl.event(e, "add", row, "err.driver.13", 1)
        for t in _every(pl, at, 600, 1200):
            if running(pl, row, t) or t == at:
                pl.event(t, "add", row, "err.driver.13", 1)
    else:
        e2 = at - pl.uniform(240, 600)
        e1 = max(300.0, e2 - pl.uniform(240, 900))
        for e in (e1, e2):
            pl.event(e, "add", row, "err.driver.13", 1)
        for t in _every(pl, at, 480, 900):
            pl.event(t, "add", row, "err.driver.13", 1)
    f.detail["hw.error.code"] = "13"


def device_resets(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """A reset 5-15 min before the onset, then one every 10-20 min."""
    pl.event(max(300.0, at - pl.uniform(300, 900)), "add", f.row, "err.reset", 1)
    for t in _every(pl, at, 600, 1200):
        pl.event(t, "add", f.row, "err.reset", 1)


# -- only under load --------------------------------------------------------------------------------------------
def hot_gpu_fault(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """Hotter than its peers at the same load (its thermal resistance raised from the onset)."""
    found = hot_gpu(pl, f.row)
    assert found is not None  # fits() checked it
    offset, r_hot = found
    pl.params["hot_on"][f.row], pl.params["r_hot"][f.row] = at, r_hot
    f.detail.update(offset_c=round(offset, 1), limit=m.temp_degraded_c)


def hw_slowdown(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """The device's own hardware slowdown, asserted for 50-85% of each minute."""
    p, row = pl.params, f.row
    p["slow_on"][row] = at
    p["slow_share"][row] = pl.uniform(0.5, 0.85)
    p["slow_phase"][row] = pl.uniform(0, 60)
    f.detail["asserted_share"] = round(float(p["slow_share"][row]), 2)


# -- intermittent: on for duty x period, from the onset to the end ----------------------------------------------
def _cycle(pl: Planner, f: PlannedFault, at: int, prefix: str, period: float, on: float) -> None:
    p = pl.params
    p[f"{prefix}_on"][f.row], p[f"{prefix}_period"][f.row], p[f"{prefix}_duty"][f.row] = at, period, on / period
    f.period_s, f.duty = round(period, 1), round(on / period, 3)


def fan_stall_intermittent(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """The fan stops for 2 minutes of every 6."""
    _cycle(pl, f, at, "stall", 360.0, 120.0)


def thermal_intermittent(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """3 minutes of every 7, 6-9 °C over its limit."""
    extra = m.temp_degraded_c + pl.uniform(6.0, 9.0) - base_temperature(pl, f.row, at)
    pl.params["excursion_extra"][f.row] = extra
    _cycle(pl, f, at, "excursion", 420.0, 180.0)


def link_bursts_intermittent(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """Bursts of 100-200 link errors a minute on one of its links, 3 minutes of every 8."""
    p, row = pl.params, f.row
    links = list(m.link_per_min)
    link = links[int(pl.rng.integers(len(links)))]
    p["burst_col"][row] = LINK_COLUMN[link]
    p["burst_rate"][row] = pl.uniform(100, 200) / 60
    f.detail.update({"hw.link.type": link, "errors_per_min": round(p["burst_rate"][row] * 60)})
    _cycle(pl, f, at, "burst", 480.0, 180.0)


# -- link evidence, shared with the group kinds (fault_groups) -----------------------------------------------
def link_storm(pl: Planner, row: int, at: float, link: str, per_min: float) -> None:
    """Link errors on ``link`` at ``per_min`` from ``at`` to the end (an always-on burst: duty 1)."""
    p = pl.params
    p["burst_on"][row], p["burst_period"][row], p["burst_duty"][row] = at, 60.0, 1.0
    p["burst_col"][row], p["burst_rate"][row] = LINK_COLUMN[link], per_min / 60


def nvlink_xid74(pl: Planner, row: int, at: float) -> dict[str, object]:
    """NVLink errors at 20-120 a minute and an XID 74 (NVLink error, NVIDIA XID catalogue) at ``at``, then
    every 5-15 minutes; returns the label's detail."""
    rate = pl.uniform(20, 120)
    link_storm(pl, row, at, "nvlink", rate)
    for t in _every(pl, at, 300, 900):
        pl.event(t, "add", row, "err.driver.74", 1)
    return {"hw.error.code": "74", "hw.link.type": "nvlink", "errors_per_min": round(rate)}


def lone_nvlink_xid74(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """One GPU's NVLink errors and XID 74 while its fabric's other GPUs stay clean: the GPU's own links
    (scope device; the Delta study: 84% of NVLink errors touch one GPU only)."""
    f.detail.update(nvlink_xid74(pl, f.row, at))


def power_throttling_intermittent(pl: Planner, f: PlannedFault, at: int, m: DeviceModel) -> None:
    """Power-capped 35-45% of a 8-12 minute cycle (under load: its power limit lowered)."""
    period = pl.uniform(480, 720)
    on = period * pl.uniform(0.35, 0.45)
    if f.row in pl.lane_of_row:
        lower_limit(pl, f)
    _cycle(pl, f, at, "cycle", period, on)


#: Every fault kind (kinds.FAULT_KINDS, by name) and what sets it up.
BUILDERS: Final[Mapping[str, Builder]] = {
    "ecc_uncorrected": ecc_uncorrected,
    "xid_dbe": xid_dbe,
    "fell_off_bus": fell_off_bus,
    "device_lost": device_lost,
    "vendor_failed": vendor_failed,
    "ecc_corrected_storm": ecc_corrected_storm,
    "ecc_cohort_outlier": ecc_cohort_outlier,
    "thermal_drift": thermal_drift,
    "fan_decay": fan_decay,
    "power_throttling": power_throttling,
    "power_delivery": power_delivery,
    "link_degraded": link_degraded,
    "memory_pressure": memory_pressure,
    "app_errors_repeated": app_errors_repeated,
    "device_resets": device_resets,
    "fan_stall_intermittent": fan_stall_intermittent,
    "thermal_intermittent": thermal_intermittent,
    "link_bursts_intermittent": link_bursts_intermittent,
    "power_throttling_intermittent": power_throttling_intermittent,
    "hot_gpu": hot_gpu_fault,
    "hw_slowdown": hw_slowdown,
    "nvlink_xid74": lone_nvlink_xid74,
}
# A node-wide kind is placed on a whole node at once (plan_load.node_fault), a shared part's on its group
# (fault_groups), not by a builder.
_ASTRAY = sorted({k for k, kind in KIND.items() if not kind.whole_node and kind.shared is None} ^ set(BUILDERS))
if _ASTRAY:
    raise RuntimeError(f"fault builders out of step with kinds.FAULT_KINDS: {', '.join(_ASTRAY)}")
