"""Faults of a part several GPUs share: a PCIe switch, an NVLink fabric, a firmware version.

Why apart from the per-device builders: such a fault is placed on a group (the GPUs behind one
``hw.pcie.upstream``, of one ``hw.fabric.id``, or running one ``hw.firmware_version`` of a model), its
evidence shows on each member at about the same time, and a classifier is right only when it names the
group (scope ``link`` or ``firmware`` with the group of otel_dra.vocabulary), not each GPU on its own. Every
function takes the :class:`~otel_dra.scenario.planner.Planner` and draws from its generator in a fixed order.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

import numpy as np

from otel_dra import conventions as cv
from otel_dra.scenario.fault_builders import link_storm, nvlink_xid74
from otel_dra.scenario.kinds import LOST_KINDS, FaultKind
from otel_dra.scenario.plan import US, WARMUP_S, FirmwareEvent, PlannedFault
from otel_dra.scenario.topology import LAYOUTS
from otel_dra.vocabulary import fabric_group, firmware_group, pcie_group

if TYPE_CHECKING:
    from otel_dra.scenario.planner import Planner

#: The members of a group fault show their evidence within this many seconds of each other ("together").
SPREAD_S: Final = 50
#: Firmware: the bad version's fatal events in a run, and how many times its per-device rate the model's
#: other versions get. Field rates of such events are ~3 per 1,000 device-days: a long form's bad version
#: (15-75 GPUs for 2 h, 1-6 device-days) would see 0.004-0.02 of one, so the rate is scaled up (about
#: 1,000-4,000x, set by the event count itself) to give the bad version 10-20 events in the run and the other
#: versions 0-3 (RATE_RATIO times less per GPU, never under MIN_RATIO).
FIRMWARE_EVENTS: Final = (10, 20)
FIRMWARE_OTHER_MAX: Final = 3
RATE_RATIO: Final = 8.0
#: Whatever the draw, the bad version's per-GPU rate is at least this many times the others'.
MIN_RATIO: Final = 4.0
#: A firmware version must have this many free GPUs for its events (and the others a few for theirs).
FIRMWARE_MIN_FREE: Final = 8


def _free(pl: Planner, rows: Iterable[int], pool: set[int], taken: set[int]) -> bool:
    return all(r in pool and r not in taken for r in rows)


def _pick_onset(pl: Planner, kind: FaultKind) -> int:
    lo, hi = pl.onset_window(kind)
    return pl.second(lo, hi - SPREAD_S)


def pcie_switch(pl: Planner, kind: FaultKind, pool: set[int], taken: set[int], spare: set[int]) -> None:
    """The GPUs behind one PCIe switch (all, or all but one of 3 or more) show PCIe link errors at storm rate
    within a minute of each other, and on a model that reports its link limits maybe a width downgrade too.
    Every GPU behind the switch is taken (the spared one stays clean: the group's contrast)."""
    groups: dict[tuple[int, str], list[int]] = defaultdict(list)
    for node in pl.nodes_:
        for r in node.rows:
            groups[(node.index, pl.devices_[r].attrs[cv.HW_PCIE_UPSTREAM])].append(r)
    ok = [(k, rows) for k, rows in groups.items() if len(rows) >= 2 and _free(pl, rows, pool, taken)]
    if not ok:
        raise ValueError(f"the fleet has no free PCIe switch for a {kind.name} fault: raise --nodes")
    ok = [g for g in ok if g[0][0] not in spare] or ok
    (node_index, upstream), rows = ok[int(pl.rng.integers(len(ok)))]
    taken.update(rows)
    pl.link_parts |= pl.parts_of(pl.devices_[rows[0]])  # its switch and its node's fabric
    affected = list(rows)
    if len(rows) >= 3 and pl.rng.random() < 0.5:
        affected.pop(int(pl.rng.integers(len(rows))))
    m = pl.devices_[rows[0]].model
    assert m is not None
    width = m.reports_limits and bool(pl.rng.random() < 0.5)
    at = _pick_onset(pl, kind)
    for r in affected:
        t = at + int(pl.rng.integers(0, SPREAD_S + 1))
        rate = pl.uniform(60, 200)
        link_storm(pl, r, t, "pcie", rate)
        if width:
            pl.params["linkdeg_on"][r] = t
        detail = {
            "hw.model": m.model,
            "hw.link.type": "pcie",
            "errors_per_min": round(rate),
            "width_downgrade": width,
            "hw.pcie.upstream": upstream,
            "group_devices": len(rows),
            "affected_devices": len(affected),
        }
        pl.faults.append(
            PlannedFault(kind, r, node_index, evidence_us=t * US, detail=detail, group=pcie_group(upstream))
        )


def fabric(pl: Planner, kind: FaultKind, pool: set[int], taken: set[int], spare: set[int]) -> None:
    """Every GPU of one node's NVSwitch fabric shows NVLink errors and XID 74 within a minute of each other
    (the Delta study's multi-GPU NVLink errors: 16% touch several GPUs, 5% four or more)."""
    ok = [
        x for x in pl.nodes_
        if len(x.rows) >= 2 and x.model.vendor == "NVIDIA" and LAYOUTS[x.model.model].fabric == "nvswitch"
        and _free(pl, x.rows, pool, taken)
    ]  # fmt: skip
    if not ok:
        raise ValueError(f"the fleet has no free NVSwitch node for a {kind.name} fault: raise --nodes")
    ok = [x for x in ok if x.index not in spare] or ok
    node = ok[int(pl.rng.integers(len(ok)))]
    taken.update(node.rows)
    fabric_id = pl.devices_[node.rows[0]].attrs[cv.HW_FABRIC_ID]
    pl.link_parts.add((node.index, fabric_id))
    at = _pick_onset(pl, kind)
    for r in node.rows:
        t = at + int(pl.rng.integers(0, SPREAD_S + 1))
        detail: dict[str, object] = {"hw.model": node.model.model, **nvlink_xid74(pl, r, t)}
        detail.update({"hw.fabric.id": fabric_id, "group_devices": len(node.rows)})
        pl.faults.append(
            PlannedFault(kind, r, node.index, evidence_us=t * US, detail=detail, group=fabric_group(fabric_id))
        )


def firmware_version(pl: Planner, kind: FaultKind, pool: set[int], taken: set[int]) -> None:
    """One firmware version of one NVIDIA model is bad: its GPUs fall off the bus (XID 79) or time out their
    GSP (XID 119, NVIDIA XID catalogue), each followed within a minute by a device reset, then run on; the
    model's other versions do so RATE_RATIO times less often per GPU. One label, on the GPU of the first
    event, listing every GPU of the version (a GPU lost on its own reports nothing to name once lost: listed
    apart, as one that may be named firmware but need not be)."""
    lost = {f.row for f in pl.faults if f.kind.name in LOST_KINDS}
    by_version: dict[tuple[str, str], list[int]] = defaultdict(list)
    lost_by_version: dict[tuple[str, str], list[int]] = defaultdict(list)
    for d in pl.devices_:
        if d.model is not None and d.model.vendor == "NVIDIA":
            key = (d.model.model, d.attrs[cv.HW_FIRMWARE_VERSION])
            (lost_by_version if d.row in lost else by_version)[key].append(d.row)
    free = {k: [r for r in rows if r in pool and r not in taken] for k, rows in by_version.items()}
    counts = {k: len(rows) for k, rows in by_version.items()}

    def others(model: str, version: str) -> list[int]:
        return [r for (m, v), rows in free.items() if m == model and v != version for r in rows]

    # Not a model's most common version: the others are the baseline its rate is told from (an early rollout
    # or a straggling old version).
    top = {m: max(n for (mm, _), n in counts.items() if mm == m) for m, _ in by_version}
    ok = sorted(
        k for k in by_version
        if counts[k] < top[k[0]] and len(free[k]) >= FIRMWARE_MIN_FREE and len(others(*k)) >= FIRMWARE_OTHER_MAX
    )  # fmt: skip
    if not ok:
        raise ValueError(f"the fleet has no firmware version with enough free GPUs for a {kind.name} fault")
    model, version = ok[int(pl.rng.integers(len(ok)))]
    n_bad = int(pl.rng.integers(FIRMWARE_EVENTS[0], FIRMWARE_EVENTS[1] + 1))
    n_other_devices = sum(len(rows) for (m, v), rows in by_version.items() if m == model and v != version)
    n_bad_devices = len(by_version[(model, version)])
    expected = n_bad * n_other_devices / (n_bad_devices * RATE_RATIO)
    cap = int(n_bad * n_other_devices / (n_bad_devices * MIN_RATIO))
    n_other = min(FIRMWARE_OTHER_MAX, cap, int(pl.rng.poisson(expected)))
    events: list[FirmwareEvent] = []
    for rows, n, bad in ((free[(model, version)], n_bad, True), (others(model, version), n_other, False)):
        for r in np.asarray(rows)[pl.rng.integers(0, len(rows), n)].tolist():
            at = pl.second(WARMUP_S, pl.D - 180)
            code = "79" if pl.rng.random() < 0.5 else "119"
            pl.event(at, "add", r, f"err.driver.{code}", 1)
            pl.event(at + pl.uniform(10, 50), "add", r, "err.reset", 1)
            events.append(FirmwareEvent(int(r), at, code, bad))
            taken.add(int(r))
    events.sort(key=lambda e: (e.at_s, e.row))
    first = next(e for e in events if e.bad)
    detail = {
        "hw.model": model,
        "hw.firmware_version": version,
        "events": n_bad,
        "other_versions_events": n_other,
        "rate_ratio": RATE_RATIO,
    }
    pl.faults.append(
        PlannedFault(
            kind,
            first.row,
            pl.devices_[first.row].node,
            evidence_us=first.at_s * US,
            detail=detail,
            group=firmware_group(model, version),
            rows=sorted(by_version[(model, version)]),
            lost_rows=sorted(lost_by_version[(model, version)]),
            events=events,
        )
    )


__all__ = ["FIRMWARE_EVENTS", "MIN_RATIO", "RATE_RATIO", "fabric", "firmware_version", "pcie_switch"]
