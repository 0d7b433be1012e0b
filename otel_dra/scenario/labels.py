"""The labels a generator writes beside its recording: the truth a scorer reads (:mod:`score`).

Every time is in the node's own clock (true time plus the node's skew), the base of that node's points.
The idle profile's labels stay what they were, key for key: what only busy fleets have is added only
for them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from otel_dra.scenario.kinds import LOST_KINDS
from otel_dra.scenario.plan import T0_NS, US, Plan, PlannedFault

if TYPE_CHECKING:
    from otel_dra.scenario.generate import ScenarioConfig

LABELS_VERSION: Final = 1


def _firmware(plan: Plan, f: PlannedFault) -> dict[str, Any]:
    """A firmware fault's own keys: its remediation, every GPU of the version (those lost on their own apart, in
    ``lost_devices``: named firmware rightly while they still report, not required to be), and the model's fatal
    events (the bad version's and the others', each in its node's clock)."""
    nodes, devices = plan.nodes, plan.devices

    def where(row: int) -> dict[str, str]:
        return {"k8s.node.name": nodes[devices[row].node].name, "hw.id": devices[row].hw_id}

    return {
        "remediation": "update_firmware",
        "devices": [where(r) for r in f.rows],
        "lost_devices": [where(r) for r in f.lost_rows],
        "events": [
            {
                **where(e.row),
                "at_unix_nano": nodes[devices[e.row].node].stamp_ns(e.at_s * US),
                "hw.error.code": e.code,
                "bad_version": e.bad,
            }
            for e in f.events
        ],
    }


def labels_doc(config: ScenarioConfig, plan: Plan) -> dict[str, Any]:
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
            entry["scope"] = f.kind.scope
            if f.group is not None:
                entry["group"] = f.group
        if f.kind.to_end:  # from the onset to the end of the recording (true time)
            entry["deadline_s"] = (T0_NS + plan.duration_s * 10**9 - (f.onset_ns - node.skew_us * 1000)) // 10**9
        if f.kind.shared == "firmware":
            entry.update(_firmware(plan, f))
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
